/* file.c - whole files in and out: read_file, and write_file_atomic (a
 * temporary file next to the target, fsync, rename, fsync the directory),
 * which artifacts, safetensors files and plots write through, through
 * symlinks to their targets and never over a device or fifo;
 * file_check_output, which asks the same of an output before a command
 * starts its work, and file_same, which tells an output that would replace
 * an input; remove_stale_temps for the temporaries of writers that died;
 * mkdir_p for the directories they go to. */
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
  /* O_NONBLOCK: opening a fifo must not wait for a writer. */
  int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  FILE *f = fd >= 0 ? fdopen(fd, "rb") : NULL;
  if (!f) {
    *err = strerror(errno);
    if (fd >= 0) close(fd);
    return NULL;
  }
  /* A device, fifo or directory has no end to read to (/dev/zero) or none
   * worth reading; a regular file is read to its end, but never past what
   * memory can hold. */
  struct stat sb;
  if (fstat(fileno(f), &sb) != 0) {
    *err = strerror(errno);
    fclose(f);
    return NULL;
  }
  if (!S_ISREG(sb.st_mode)) {
    *err = S_ISDIR(sb.st_mode) ? "is a directory, not a file" : "not a regular file (a device, fifo or socket)";
    fclose(f);
    return NULL;
  }
  uint64_t limit = mem_limit();
  if ((uint64_t)sb.st_size >= limit) {
    *err = "the file is larger than this machine's memory";
    fclose(f);
    return NULL;
  }
  StrBuf sb2;
  sb_init(&sb2);
  char tmp[65536];
  size_t n;
  while ((n = fread(tmp, 1, sizeof tmp, f)) > 0) {
    if ((uint64_t)sb2.len + n >= limit) { /* it grew while being read */
      *err = "the file is larger than this machine's memory";
      fclose(f);
      sb_free(&sb2);
      return NULL;
    }
    sb_putn(&sb2, tmp, n);
  }
  if (ferror(f)) {
    *err = strerror(errno ? errno : EIO);
    fclose(f);
    sb_free(&sb2);
    return NULL;
  }
  fclose(f);
  if (!sb2.data) sb_putn(&sb2, "", 0);
  if (len) *len = sb2.len;
  return sb2.data;
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

/* The file a write to path replaces: path, or where the chain of symlinks
 * that path is ends (a link's relative target is relative to the link's
 * directory), whether or not that file exists yet.  Renaming onto the
 * target keeps the links.  False with errno ELOOP or ENAMETOOLONG. */
static bool link_target(const char *path, char *out, size_t n) {
  if (snprintf(out, n, "%s", path) >= (int)n) {
    errno = ENAMETOOLONG;
    return false;
  }
  for (int hops = 0; hops < 40; hops++) {
    struct stat sb;
    if (lstat(out, &sb) != 0 || !S_ISLNK(sb.st_mode)) return true;
    char to[4096];
    ssize_t k = readlink(out, to, sizeof to - 1);
    if (k < 0) return true; /* the write reports what is wrong */
    to[k] = 0;
    char *slash = strrchr(out, '/');
    if (to[0] == '/' || !slash) {
      if ((size_t)k >= n) break;
      memcpy(out, to, (size_t)k + 1);
    } else {
      size_t dir = (size_t)(slash - out) + 1;
      if (dir + (size_t)k >= n) break;
      memcpy(out + dir, to, (size_t)k + 1);
    }
  }
  errno = ELOOP;
  return false;
}

/* path's target (link_target) into real, refusing one that exists and is
 * not a regular file: a rename would replace a device node or a fifo
 * itself, not write into it. */
static bool output_target(const char *path, char *real, size_t n, char *err, size_t errlen) {
  if (!link_target(path, real, n)) return errf(err, errlen, "%s: %s", path, strerror(errno));
  struct stat sb;
  if (stat(real, &sb) == 0 && !S_ISREG(sb.st_mode))
    return errf(err, errlen, "%s: %s; not written", path,
                S_ISDIR(sb.st_mode) ? "is a directory, not a file" : "not a regular file (a device, fifo or socket)");
  return true;
}

/* Why a temporary could not be created beside real (path as given). */
static bool temp_error(const char *path, const char *real, int e, char *err, size_t errlen) {
  const char *slash = strrchr(real, '/');
  char dir[4096] = ".";
  if (slash) snprintf(dir, sizeof dir, "%.*s", slash == real ? 1 : (int)(slash - real), real);
  struct stat sb;
  int se = stat(dir, &sb) == 0 ? 0 : errno;
  if (se == ENOENT) return errf(err, errlen, "%s: cannot be written: the directory '%s' does not exist", path, dir);
  if (se == ENOTDIR || (se == 0 && !S_ISDIR(sb.st_mode)))
    return errf(err, errlen, "%s: cannot be written: '%s' is not a directory", path, dir);
  return errf(err, errlen, "%s: cannot be written: no new file can be made in '%s': %s", path, dir, strerror(e));
}

bool file_check_output(const char *path, char *err, size_t errlen) {
  char real[4096];
  if (!output_target(path, real, sizeof real, err, errlen)) return false;
  /* The one test that answers for root, read-only mounts and /proc alike:
   * create the temporary a write would create, and remove it. */
  char tmp[4096 + 48];
  snprintf(tmp, sizeof tmp, "%s" TMP_MARK "%ld.XXXXXX", real, (long)getpid());
  int fd = mkstemp(tmp);
  if (fd < 0) return temp_error(path, real, errno, err, errlen);
  close(fd);
  unlink(tmp);
  return true;
}

bool file_same(const char *a, const char *b) {
  struct stat sa, sb;
  return stat(a, &sa) == 0 && stat(b, &sb) == 0 && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

bool write_file_atomic(const char *path, const FilePart *parts, int nparts, char *err, size_t errlen) {
  char real[4096];
  if (!output_target(path, real, sizeof real, err, errlen)) return false;
  /* REAL.tmp.PID.XXXXXX in the target's directory, so that rename is
   * atomic and remove_stale_temps can tell a dead writer's file from a
   * live one's. */
  size_t plen = strlen(real);
  char *tmp = mem_alloc(plen + 48);
  snprintf(tmp, plen + 48, "%s" TMP_MARK "%ld.XXXXXX", real, (long)getpid());
  int fd = mkstemp(tmp);
  if (fd < 0) {
    int e = errno;
    free(tmp);
    return temp_error(path, real, e, err, errlen);
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
  if (ok && rename(tmp, real) != 0) {
    ok = false;
    e = errno;
  }
  if (ok) {
    test_pause();
    sync_dir(real);
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

int remove_stale_temps(const char *given, void (*removed)(const char *file, long pid, void *ctx), void *ctx) {
  char path[4096]; /* the temporaries lie beside the symlinks' target */
  if (!link_target(given, path, sizeof path)) return 0;
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
