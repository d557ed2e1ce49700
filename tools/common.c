/* common.c - what the commands share: reading flag values, handing a
 * simulated link to the comm layer, the wall clock. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gradc.h"
#include "tools.h"

const char *tools_flag_value(int argc, char **argv, int *i, const char *flag, bool *missing) {
  size_t n = strlen(flag);
  if (strncmp(argv[*i], flag, n) != 0) return NULL;
  if (argv[*i][n] == '=') return argv[*i] + n + 1;
  if (argv[*i][n] != 0) return NULL;
  if (*i + 1 >= argc) {
    if (missing) *missing = true;
    return NULL;
  }
  return argv[++*i];
}

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

double tools_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}
