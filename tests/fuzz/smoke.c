/* smoke.c - a main() for the fuzz targets when libFuzzer is not used: runs
 * every seed file given (files or directories: their files whose name ends
 * in EXT, or all of them for EXT "-"), then mutates the seeds at
 * random (bit flips, byte edits, truncation, duplication, splicing) for a
 * fixed number of seconds with a fixed seed.  `make check` runs this as a
 * short smoke test; `make fuzz` builds the real libFuzzer targets. */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "support/support.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

typedef struct Seed {
  char *data;
  size_t len;
} Seed;

static Seed seeds[4096];
static int nseeds;

static void add_file(const char *path) {
  const char *err;
  size_t len;
  char *s = read_file(path, &len, &err);
  if (!s || nseeds == 4096) {
    free(s);
    return;
  }
  seeds[nseeds++] = (Seed){s, len};
}

static void add_path(const char *path, const char *ext) {
  struct stat st;
  if (stat(path, &st) != 0) return;
  if (!S_ISDIR(st.st_mode)) {
    add_file(path);
    return;
  }
  DIR *d = opendir(path);
  if (!d) return;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    size_t n = strlen(e->d_name), m = strlen(ext);
    bool any = strcmp(ext, "-") == 0 && e->d_name[0] != '.';
    if (any || (n > m && strcmp(e->d_name + n - m, ext) == 0)) {
      char buf[4096];
      snprintf(buf, sizeof buf, "%s/%s", path, e->d_name);
      add_file(buf);
    }
  }
  closedir(d);
}

int main(int argc, char **argv) {
  /* smoke SECONDS EXT PATH... */
  if (argc < 4) {
    fprintf(stderr, "usage: %s SECONDS EXT PATH...\n", argv[0]);
    return 2;
  }
  double seconds = atof(argv[1]);
  for (int i = 3; i < argc; i++) add_path(argv[i], argv[2]);
  if (nseeds == 0) {
    fprintf(stderr, "no seed files found\n");
    return 2;
  }
  for (int i = 0; i < nseeds; i++) LLVMFuzzerTestOneInput((const uint8_t *)seeds[i].data, seeds[i].len);
  Rng rng;
  rng_seed(&rng, 12345);
  time_t start = time(NULL);
  long runs = 0;
  char *buf = malloc(1 << 20);
  while (difftime(time(NULL), start) < seconds) {
    Seed *s = &seeds[rng_next(&rng) % (uint64_t)nseeds];
    size_t len = s->len < (1 << 19) ? s->len : (1 << 19);
    memcpy(buf, s->data, len);
    int edits = 1 + (int)(rng_next(&rng) % 8);
    for (int e = 0; e < edits && len > 0; e++) {
      size_t at = rng_next(&rng) % len;
      switch (rng_next(&rng) % 6) {
      case 0: buf[at] ^= (char)(1 << (rng_next(&rng) % 8)); break;
      case 1: buf[at] = "()[]{},:=;.#@*+-/\n 0123456789e\"%"[rng_next(&rng) % 33]; break;
      case 2: len = at; break;
      case 3: /* duplicate a chunk */
        if (len * 2 < (1 << 19)) {
          size_t n = rng_next(&rng) % (len - at + 1);
          memmove(buf + at + n, buf + at, len - at);
          len += n;
        }
        break;
      case 4: /* delete a chunk */
      {
        size_t n = rng_next(&rng) % (len - at + 1);
        memmove(buf + at, buf + at + n, len - at - n);
        len -= n;
        break;
      }
      default: /* splice from another seed */
      {
        Seed *o = &seeds[rng_next(&rng) % (uint64_t)nseeds];
        size_t from = o->len ? rng_next(&rng) % o->len : 0, n = o->len - from;
        if (at + n > (1 << 19)) n = (1 << 19) - at;
        memcpy(buf + at, o->data + from, n);
        if (at + n > len) len = at + n;
        break;
      }
      }
    }
    LLVMFuzzerTestOneInput((const uint8_t *)buf, len);
    runs++;
  }
  printf("%d seeds, %ld mutated inputs, no crash\n", nseeds, runs);
  free(buf);
  for (int i = 0; i < nseeds; i++) free(seeds[i].data);
  return 0;
}
