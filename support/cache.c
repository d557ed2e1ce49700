/* cache.c - the on-disk cache (DESIGN.md §5 "Caches"): one directory,
 * $GRADC_CACHE_DIR, else $XDG_CACHE_HOME/gradc, else ~/.cache/gradc.
 * Entries are files named by a 64-bit key; writes go to a temporary file
 * that is renamed into place, so readers never see half an entry.  Every
 * entry carries a header with its length and checksum: a torn or corrupted
 * entry is ignored with a warning.  A cache that cannot be read or written
 * is a warning, never a failure. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "support.h"

static const char magic[8] = {'G', 'R', 'D', 'C', 'A', 'C', 'H', '1'};

bool cache_dir(char *buf, size_t n) {
  const char *d = getenv("GRADC_CACHE_DIR");
  if (d && *d) return (size_t)snprintf(buf, n, "%s", d) < n;
  d = getenv("XDG_CACHE_HOME");
  if (d && *d) return (size_t)snprintf(buf, n, "%s/gradc", d) < n;
  d = getenv("HOME");
  if (d && *d) return (size_t)snprintf(buf, n, "%s/.cache/gradc", d) < n;
  return false;
}

static void entry_path(char *buf, size_t n, const char *dir, const char *kind, uint64_t key) {
  snprintf(buf, n, "%s/%s-%016llx", dir, kind, (unsigned long long)key);
}

void *cache_get(const char *dir, const char *kind, uint64_t key, size_t *len) {
  if (!dir) return NULL;
  char path[4096];
  entry_path(path, sizeof path, dir, kind, key);
  const char *err;
  size_t n;
  char *data = read_file(path, &n, &err);
  if (!data) return NULL; /* a miss */
  uint64_t want_len, want_sum;
  if (n < 24 || memcmp(data, magic, 8) != 0) goto corrupt;
  memcpy(&want_len, data + 8, 8);
  memcpy(&want_sum, data + 16, 8);
  if (want_len != n - 24 || hash_bytes(data + 24, n - 24, HASH_SEED) != want_sum) goto corrupt;
  char *out = mem_alloc(n - 24 + 1);
  memcpy(out, data + 24, n - 24);
  out[n - 24] = 0; /* text entries can be read as strings */
  free(data);
  *len = n - 24;
  return out;
corrupt:
  fprintf(stderr, "gradc: warning: ignoring corrupted cache entry %s\n", path);
  free(data);
  return NULL;
}

void cache_put(const char *dir, const char *kind, uint64_t key, const void *data, size_t len) {
  if (!dir) return;
  if (!mkdir_p(dir)) {
    fprintf(stderr, "gradc: warning: cannot create cache directory %s: %s\n", dir, strerror(errno));
    return;
  }
  char path[4096], tmp[4200];
  entry_path(path, sizeof path, dir, kind, key);
  snprintf(tmp, sizeof tmp, "%s.tmp.XXXXXX", path);
  int fd = mkstemp(tmp);
  if (fd < 0) {
    fprintf(stderr, "gradc: warning: cannot write to cache %s: %s\n", dir, strerror(errno));
    return;
  }
  uint64_t l = len, sum = hash_bytes(data, len, HASH_SEED);
  char head[24];
  memcpy(head, magic, 8);
  memcpy(head + 8, &l, 8);
  memcpy(head + 16, &sum, 8);
  bool ok = write(fd, head, 24) == 24 && (len == 0 || write(fd, data, len) == (ssize_t)len);
  ok = close(fd) == 0 && ok;
  if (!ok || rename(tmp, path) != 0) {
    fprintf(stderr, "gradc: warning: cannot write cache entry %s: %s\n", path, strerror(errno));
    unlink(tmp);
  }
}
