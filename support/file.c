/* file.c - whole files in and out: read_file, and write_file_atomic (a
 * temporary file next to the target, fsync, rename, fsync the directory),
 * which artifacts, safetensors files and plots write through; mkdir_p for
 * the directories they go to. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "support.h"

char *read_file(const char *path, size_t *len, const char **err) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    *err = strerror(errno);
    return NULL;
  }
  StrBuf sb;
  sb_init(&sb);
  char tmp[65536];
  size_t n;
  while ((n = fread(tmp, 1, sizeof tmp, f)) > 0) sb_putn(&sb, tmp, n);
  if (ferror(f)) {
    *err = strerror(errno ? errno : EIO);
    fclose(f);
    sb_free(&sb);
    return NULL;
  }
  fclose(f);
  if (!sb.data) sb_putn(&sb, "", 0);
  if (len) *len = sb.len;
  return sb.data;
}

static bool write_all(int fd, const void *p, size_t n) {
  const char *c = p;
  while (n > 0) {
    ssize_t w = write(fd, c, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    c += w;
    n -= (size_t)w;
  }
  return true;
}

/* The rename is only durable once the directory is synced too. */
static void sync_dir(const char *path) {
  const char *slash = strrchr(path, '/');
  char dir[4096] = ".";
  if (slash) {
    size_t n = slash == path ? 1 : (size_t)(slash - path);
    if (n >= sizeof dir) return;
    memcpy(dir, path, n);
    dir[n] = 0;
  }
  int fd = open(dir, O_RDONLY | O_DIRECTORY);
  if (fd >= 0) {
    (void)fsync(fd);
    close(fd);
  }
}

bool write_file_atomic(const char *path, const FilePart *parts, int nparts, char *err, size_t errlen) {
  /* PATH.tmp.XXXXXX in the same directory, so that rename is atomic. */
  size_t plen = strlen(path);
  char *tmp = mem_alloc(plen + 16);
  memcpy(tmp, path, plen);
  memcpy(tmp + plen, ".tmp.XXXXXX", 12);
  int fd = mkstemp(tmp);
  if (fd < 0) {
    int e = errno;
    free(tmp);
    return errf(err, errlen, "%s: cannot create a temporary file: %s", path, strerror(e));
  }
  bool ok = true;
  for (int i = 0; i < nparts && ok; i++) ok = write_all(fd, parts[i].data, parts[i].len);
  int e = errno;
  if (ok) {
    (void)fchmod(fd, 0644); /* mkstemp creates the file 0600 */
    if (fsync(fd) != 0) {
      ok = false;
      e = errno;
    }
  }
  if (close(fd) != 0 && ok) {
    ok = false;
    e = errno;
  }
  if (ok && rename(tmp, path) != 0) {
    ok = false;
    e = errno;
  }
  if (ok) sync_dir(path);
  if (!ok) {
    unlink(tmp);
    errf(err, errlen, "%s: cannot write: %s", path, strerror(e));
  }
  free(tmp);
  return ok;
}

bool mkdir_p(const char *path) {
  char tmp[4096];
  if (snprintf(tmp, sizeof tmp, "%s", path) >= (int)sizeof tmp) return false;
  for (char *p = tmp + 1; *p; p++) {
    if (*p != '/') continue;
    *p = 0;
    if (mkdir(tmp, 0755) != 0 && errno != EEXIST) return false;
    *p = '/';
  }
  return mkdir(tmp, 0755) == 0 || errno == EEXIST;
}
