/* common.c - what the commands share: reading flag values, recognising a
 * --target and an artifact, reporting the C API's errors, and handing a
 * simulated link to the comm layer. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gradc.h"
#include "runtime/io/artifact.h"
#include "tools.h"
#ifdef GRADC_HAVE_CUDA
#include "codegen/cuda/cuda.h"
#endif

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

bool tools_cuda_target(const char *t) {
#ifdef GRADC_HAVE_CUDA
  char arch[32];
  return t && cg_cuda_parse_target(t, arch, sizeof arch);
#else
  (void)t;
  return false;
#endif
}

bool tools_is_artifact(const char *path) {
  char magic[8] = {0};
  FILE *f = fopen(path, "rb");
  if (!f) return false;
  size_t n = fread(magic, 1, sizeof magic, f);
  fclose(f);
  return n == sizeof magic && memcmp(magic, ART_MAGIC, 8) == 0;
}

int tools_api_error(gradc_status st) {
  const char *msg = gradc_last_error();
  if (!msg || !*msg) msg = "unknown failure";
  if (strstr(msg, "error: ")) /* model diagnostics and "gradc: error: ..." carry their prefix */
    fprintf(stderr, "%s%s", msg, msg[strlen(msg) - 1] == '\n' ? "" : "\n");
  else
    fprintf(stderr, "gradc: error: %s\n", msg);
  return st == GRADC_ERR_INTERNAL ? 2 : 1;
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
