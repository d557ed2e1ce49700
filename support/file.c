/* file.c - whole files in and out: read_file, and write_file_atomic (a
 * temporary file next to the target, fsync, rename, fsync the directory),
 * which artifacts, safetensors files and plots write through;
 * remove_stale_temps for the temporaries of writers that died; mkdir_p for
 * the directories they go to. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
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

/* The test hook GRADC_TEST_WRITE_PAUSE_US=N: sleep N microseconds at each
 * stage of a write (after creating the temporary, half-way through the
 * data, before the fsync, before the rename, before syncing the
 * directory), so that a test killing the writer lands inside a write
 * whatever the file system's fsync costs. */
static void test_pause(void) {
  const char *v = getenv("GRADC_TEST_WRITE_PAUSE_US");
  long us = v ? strtol(v, NULL, 10) : 0;
  if (us <= 0) return;
  struct timespec ts = {us / 1000000, us % 1000000 * 1000};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

#define TMP_MARK ".tmp."

bool write_file_atomic(const char *path, const FilePart *parts, int nparts, char *err, size_t errlen) {
  /* PATH.tmp.PID.XXXXXX in the same directory, so that rename is atomic
   * and remove_stale_temps can tell a dead writer's file from a live one's. */
  size_t plen = strlen(path);
  char *tmp = mem_alloc(plen + 48);
  snprintf(tmp, plen + 48, "%s" TMP_MARK "%ld.XXXXXX", path, (long)getpid());
  int fd = mkstemp(tmp);
  if (fd < 0) {
    int e = errno;
    free(tmp);
    return errf(err, errlen, "%s: cannot create a temporary file: %s", path, strerror(e));
  }
  test_pause();
  bool ok = true;
  for (int i = 0; i < nparts && ok; i++) {
    if (i == nparts / 2) test_pause();
    ok = write_all(fd, parts[i].data, parts[i].len);
  }
  int e = errno;
  if (ok) {
    test_pause();
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
  if (ok) test_pause();
  if (ok && rename(tmp, path) != 0) {
    ok = false;
    e = errno;
  }
  if (ok) {
    test_pause();
    sync_dir(path);
  }
  if (!ok) {
    unlink(tmp);
    errf(err, errlen, "%s: cannot write: %s", path, strerror(e));
  }
  free(tmp);
  return ok;
}

/* Is name (a directory entry) base.tmp.PID.XXXXXX?  Its PID, else 0. */
static long temp_pid(const char *name, const char *base) {
  size_t n = strlen(base), m = strlen(TMP_MARK);
  if (strncmp(name, base, n) != 0 || strncmp(name + n, TMP_MARK, m) != 0) return 0;
  const char *p = name + n + m, *q = p;
  long pid = 0;
  while (*q >= '0' && *q <= '9' && q - p < 10) pid = pid * 10 + (*q++ - '0');
  if (q == p || *q != '.' || strlen(q + 1) != 6) return 0;
  return pid;
}

int remove_stale_temps(const char *path, void (*removed)(const char *file, long pid, void *ctx), void *ctx) {
  const char *slash = strrchr(path, '/');
  char dir[4096] = ".";
  const char *base = slash ? slash + 1 : path;
  if (slash) {
    size_t n = slash == path ? 1 : (size_t)(slash - path);
    if (n >= sizeof dir) return 0;
    memcpy(dir, path, n);
    dir[n] = 0;
  }
  if (!*base) return 0;
  DIR *d = opendir(dir);
  if (!d) return 0;
  int count = 0;
  for (struct dirent *e; (e = readdir(d)) != NULL;) {
    long pid = temp_pid(e->d_name, base);
    /* kill(pid, 0) fails with ESRCH only when no such process exists. */
    if (pid <= 0 || pid == (long)getpid() || kill((pid_t)pid, 0) == 0 || errno != ESRCH) continue;
    char file[4096 + 256];
    snprintf(file, sizeof file, "%s/%s", dir, e->d_name);
    if (unlink(file) != 0) continue;
    count++;
    if (removed) removed(slash ? file : e->d_name, pid, ctx);
  }
  closedir(d);
  return count;
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
