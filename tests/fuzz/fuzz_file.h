/* fuzz_file.h - for the fuzz targets whose loaders read a path: the input
 * written to one scratch file per process (under $TMPDIR or /tmp),
 * removed when the process exits. */
#ifndef GRADC_FUZZ_FILE_H
#define GRADC_FUZZ_FILE_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static char fuzz_path[512];

static void fuzz_file_remove(void) { unlink(fuzz_path); }

static const char *fuzz_file(const char *ext, const uint8_t *data, size_t size) {
  char *path = fuzz_path;
  if (!path[0]) {
    const char *dir = getenv("TMPDIR");
    snprintf(path, sizeof fuzz_path, "%s/gradc-fuzz-%ld%s", dir && *dir ? dir : "/tmp", (long)getpid(), ext);
    atexit(fuzz_file_remove);
  }
  FILE *f = fopen(path, "wb");
  if (!f || (size && fwrite(data, 1, size, f) != size) || fclose(f) != 0) abort();
  return path;
}

#endif
