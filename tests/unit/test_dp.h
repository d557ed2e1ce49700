/* test_dp.h - helpers of the data-parallel tests (test_dp_*.c): running
 * gradc alone and under mpirun, reading loss lines, and comparing tensor
 * files by relative error.  Static, so each test executable has its own. */
#ifndef GRADC_TEST_DP_H
#define GRADC_TEST_DP_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runtime/runtime.h"
#include "testutil.h"

/* Ranks under `make check-asan` unwind malloc stacks the slow way: Open
 * MPI's libraries have no frame pointers, and the leaks LSan reports from
 * them are matched to tests/lsan.supp by the frames above. */
#define MPIRUN "LSAN_OPTIONS=\"$LSAN_OPTIONS:fast_unwind_on_malloc=0\" mpirun --oversubscribe --allow-run-as-root"

/* f32 results of 2 ranks against 1 agree to this relative error (per
 * tensor: the largest difference over the largest magnitude). */
#define DP_TOL 1e-5

/* Largest relative errors seen by this executable (printed at the end). */
static double dp_worst_loss, dp_worst_grad;

/* Whether the MPI tests can run here; else say why (they are skipped). */
static inline bool dp_have_mpirun(void) {
#ifndef GRADC_HAVE_MPI
  print_message("skipped: this build has no MPI (GRADC_MPI=OFF)\n");
  return false;
#else
  if (system("command -v mpirun >/dev/null 2>&1") != 0) {
    print_message("skipped: mpirun is not installed (Debian: openmpi-bin)\n");
    return false;
  }
  return true;
#endif
}

static inline int dp_count(const char *text, const char *needle) {
  int n = 0;
  for (const char *p = strstr(text, needle); p; p = strstr(p + 1, needle)) n++;
  return n;
}

static inline double dp_loss(const char *text, const char *name) {
  char key[96];
  snprintf(key, sizeof key, "loss %s ", name);
  const char *p = strstr(text, key);
  if (!p) fail_msg("no '%s' line in:\n%s", key, text);
  return strtod(p + strlen(key), NULL);
}

static inline double dp_rel(double a, double b) { return a == b ? 0 : fabs(a - b) / fmax(fabs(b), 1e-30); }

/* Compare the loss lines of two runs (every line of want). */
static inline double dp_compare_losses(const char *got, const char *want, const char *what) {
  double worst = 0;
  for (const char *p = strstr(want, "loss "); p; p = strstr(p + 1, "\nloss ")) {
    if (*p == '\n') p++;
    char name[64];
    if (sscanf(p, "loss %63s", name) != 1) break;
    double e = dp_rel(dp_loss(got, name), dp_loss(want, name));
    if (e > DP_TOL) fail_msg("%s: loss %s: %.9g vs %.9g (relative error %.3g)", what, name, dp_loss(got, name),
                             dp_loss(want, name), e);
    worst = fmax(worst, e);
  }
  dp_worst_loss = fmax(dp_worst_loss, worst);
  return worst;
}

/* Compare every tensor of two files (same names, shapes); the largest
 * per-tensor relative error. */
static inline double dp_compare_files(const char *got_path, const char *want_path, const char *what) {
  StFile got, want;
  char err[1024];
  st_init(&got);
  st_init(&want);
  if (!st_read(got_path, &got, err, sizeof err) || !st_read(want_path, &want, err, sizeof err)) fail_msg("%s", err);
  assert_int_equal(got.n, want.n);
  double worst = 0;
  for (int i = 0; i < want.n; i++) {
    const StTensor *w = &want.t[i], *g = st_find(&got, w->name);
    if (!g) fail_msg("%s: no tensor '%s' in %s", what, w->name, got_path);
    int64_t n = st_numel(w);
    assert_int_equal(st_numel(g), n);
    double *a = calloc((size_t)n + 1, sizeof(double)), *b = calloc((size_t)n + 1, sizeof(double));
    step_load(g, 0, n, a);
    step_load(w, 0, n, b);
    double diff = 0, scale = 0;
    for (int64_t k = 0; k < n; k++) {
      if (!isfinite(a[k])) fail_msg("%s: '%s'[%lld] is %g", what, w->name, (long long)k, a[k]);
      diff = fmax(diff, fabs(a[k] - b[k]));
      scale = fmax(scale, fabs(b[k]));
    }
    double e = diff == 0 ? 0 : diff / fmax(scale, 1e-30);
    if (e > DP_TOL) fail_msg("%s: tensor '%s': relative error %.3g (largest difference %.3g)", what, w->name, e, diff);
    worst = fmax(worst, e);
    free(a);
    free(b);
  }
  st_free(&got);
  st_free(&want);
  dp_worst_grad = fmax(dp_worst_grad, worst);
  return worst;
}

#endif
