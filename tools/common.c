/* common.c - what the commands share: reading numbers from flag values,
 * handing a simulated link to the comm layer, the wall clock, checking
 * their files before they start. */
#include <errno.h>
#include <stdarg.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "api/cli.h"
#include "gradc.h"
#include "tools.h"

bool tools_parse_i64(const char *s, int64_t *out) {
  char *end;
  errno = 0;
  long long v = strtoll(s, &end, 10);
  if (errno || end == s || *end) return false;
  *out = v;
  return true;
}

bool tools_parse_f64(const char *s, double *out) {
  char *end;
  errno = 0;
  double v = strtod(s, &end);
  if (errno || end == s || *end || !isfinite(v)) return false;
  *out = v;
  return true;
}

void tools_set_link(double latency_us, double gbps) {
  char buf[64];
  if (latency_us > 0) {
    snprintf(buf, sizeof buf, "%.17g", latency_us);
    setenv("GRADC_COMM_LATENCY_US", buf, 1);
  }
  if (gbps > 0) {
    snprintf(buf, sizeof buf, "%.17g", gbps);
    setenv("GRADC_COMM_GBPS", buf, 1);
  }
}

int tools_error(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fputs("gradc: error: ", stderr);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
  return 1;
}

double tools_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

int tools_check_paths(const ToolsPath *in, int nin, const ToolsPath *out, int nout) {
  for (int i = 0; i < nout; i++) {
    const ToolsPath *o = &out[i];
    if (!o->path) continue;
    for (int k = 0; k < nin; k++) {
      const ToolsPath *x = &in[k];
      if (!x->path || (o->update && strcmp(o->update, x->flag) == 0) || !file_same(o->path, x->path)) continue;
      fprintf(stderr, "gradc: error: %s: %s would overwrite %s, which this command reads%s%s%s; name another file\n",
              o->path, o->flag, x->flag, strcmp(x->path, o->path) ? " (as " : "", strcmp(x->path, o->path) ? x->path : "",
              strcmp(x->path, o->path) ? ")" : "");
      return 1;
    }
    for (int k = 0; k < i; k++)
      if (out[k].path && (strcmp(out[k].path, o->path) == 0 || file_same(out[k].path, o->path))) {
        fprintf(stderr, "gradc: error: %s: both %s and %s would write it; name two files\n", o->path, out[k].flag,
                o->flag);
        return 1;
      }
    char err[4200];
    if (!file_check_output(o->path, err, sizeof err)) {
      fprintf(stderr, "gradc: error: %s (%s)\n", err, o->flag);
      return 1;
    }
  }
  return 0;
}
