/* testutil.c - helpers shared by the unit tests. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "testutil.h"

const char *tu_path(const char *rel) {
  static char buf[4096];
  snprintf(buf, sizeof buf, "%s/%s", GRADC_SOURCE_DIR, rel);
  return buf;
}

char *tu_read(const char *rel) {
  const char *err = NULL;
  char *s = read_file(tu_path(rel), NULL, &err);
  if (!s) fail_msg("cannot read %s: %s", rel, err);
  return s;
}

char *tu_read_in(const char *dir, const char *name) {
  char path[4096];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  const char *err = NULL;
  char *s = read_file(path, NULL, &err);
  if (!s) fail_msg("%s: %s", path, err);
  return s;
}

FeModel *tu_compile(const char *name, const char *text, int gas, Diag *d) {
  static SrcFile src; /* the model keeps a copy of this struct */
  src.name = name;
  src.text = text;
  src.len = strlen(text);
  diag_init(d, NULL);
  d->quiet = true;
  FeOptions opt = {.gas = gas, .dp = 1};
  return fe_model_compile(&src, &opt, d);
}

/* tu_sh and tu_sh_err: stderr goes through a temporary file when err is
 * given, else into the pipe with stdout. */
static int vsh(char *out, size_t n, char *err, size_t m, const char *fmt, va_list ap) {
  char cmd[8192], full[8400], errpath[] = "/tmp/gradc-sh-err-XXXXXX";
  vsnprintf(cmd, sizeof cmd, fmt, ap);
  int fd = -1;
  if (err) {
    fd = mkstemp(errpath);
    assert_true(fd >= 0);
    snprintf(full, sizeof full, "%s 2>%s", cmd, errpath);
  } else {
    snprintf(full, sizeof full, "%s 2>&1", cmd);
  }
  FILE *p = popen(full, "r");
  assert_non_null(p);
  size_t k = fread(out, 1, n - 1, p);
  out[k] = 0;
  int st = pclose(p);
  if (err) {
    FILE *e = fopen(errpath, "r");
    size_t j = e ? fread(err, 1, m - 1, e) : 0;
    err[j] = 0;
    if (e) fclose(e);
    close(fd);
    unlink(errpath);
  }
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

int tu_sh(char *out, size_t n, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int rc = vsh(out, n, NULL, 0, fmt, ap);
  va_end(ap);
  return rc;
}

int tu_sh_err(char *out, size_t n, char *err, size_t m, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int rc = vsh(out, n, err, m, fmt, ap);
  va_end(ap);
  return rc;
}

void tu_gradc(const char *fmt, ...) {
  char args[4096], out[4096];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(args, sizeof args, fmt, ap);
  va_end(ap);
  if (tu_sh(out, sizeof out, "%s %s", GRADC_BINARY, args) != 0) fail_msg("%s", out);
}

void tu_rm_rf(const char *dir) {
  char out[64];
  tu_sh(out, sizeof out, "rm -rf %s", dir);
}

static bool put_text(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  if (!f) return false;
  bool ok = fputs(text, f) >= 0;
  return fclose(f) == 0 && ok;
}

int tu_in_cgroup(const char *hierarchy, const char *const *files, const char *const *texts, int nfiles,
                 int (*child)(void)) {
  char top[160], inner[192], path[256];
  snprintf(top, sizeof top, "/sys/fs/cgroup/%s/gradc-test-%d", hierarchy, (int)getpid());
  snprintf(inner, sizeof inner, "%s/inner", top);
  if (mkdir(top, 0755) != 0) {
    print_message("note: skipped: cannot make a v1 %s cgroup here\n", hierarchy);
    return -1;
  }
  bool ok = true;
  for (int i = 0; ok && i < nfiles; i++) {
    snprintf(path, sizeof path, "%s/%s", top, files[i]);
    ok = put_text(path, texts[i]);
  }
  ok = ok && mkdir(inner, 0755) == 0;
  int got = -2;
  if (ok) {
    pid_t pid = fork();
    if (pid == 0) {
      char me[32];
      snprintf(path, sizeof path, "%s/cgroup.procs", inner);
      snprintf(me, sizeof me, "%d", (int)getpid());
      _exit(put_text(path, me) ? child() : 255);
    }
    int status = 0;
    if (pid > 0 && waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) != 255)
      got = WEXITSTATUS(status);
  }
  rmdir(inner);
  rmdir(top);
  return got;
}
