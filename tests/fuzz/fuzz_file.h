/* fuzz_file.h - for the fuzz targets whose loaders read a path: the input
 * written to one scratch file per process (under $TMPDIR or /tmp). */
#ifndef GRADC_FUZZ_FILE_H
#define GRADC_FUZZ_FILE_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static const char *fuzz_file(const char *ext, const uint8_t *data, size_t size) {
  static char path[512];
  if (!path[0]) {
    const char *dir = getenv("TMPDIR");
    snprintf(path, sizeof path, "%s/gradc-fuzz-%ld%s", dir && *dir ? dir : "/tmp", (long)getpid(), ext);
  }
  FILE *f = fopen(path, "wb");
  if (!f || (size && fwrite(data, 1, size, f) != size) || fclose(f) != 0) abort();
  return path;
}

#endif
