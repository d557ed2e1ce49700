/* common.c - what the commands share: reading numbers from flag values,
 * handing a simulated link to the comm layer, the wall clock. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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

double tools_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}
