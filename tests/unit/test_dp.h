/* test_dp.h - helpers of the distributed tests (test_dp_*.c, test_tp_run.c
 * and test_trace.c's MPI cases): running gradc alone and under mpirun,
 * running the test executable itself again as one worker per rank,
 * reading loss lines, and comparing tensor files by relative error.
 * Static, so each test executable has its own. */
#ifndef GRADC_TEST_DP_H
#define GRADC_TEST_DP_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gradc.h"
#include "passes/passes.h"
#include "runtime/comm/comm.h"
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

/* ------------------------------------------------------------------ */
/* Workers: this executable run again under mpirun, one per rank      */
/* ------------------------------------------------------------------ */

/* The worker's rank, for CHECK's messages (set by dp_worker_open). */
static int dp_worker_rank;

/* In a worker: unless cond, say where on stderr (rank, file, line and the
 * printf-style message) and return 1 from the calling function. */
#define CHECK(cond, ...)                                                       \
  do {                                                                         \
    if (!(cond)) {                                                             \
      fprintf(stderr, "rank %d: %s:%d: ", dp_worker_rank, __FILE__, __LINE__); \
      fprintf(stderr, __VA_ARGS__);                                            \
      fputc('\n', stderr);                                                     \
      return 1;                                                                \
    }                                                                          \
  } while (0)

/* CHECK a call that returns false with its reason in err (a char array). */
#define OK(call) CHECK((call), "%s: %s", #call, err)

/* A worker's start: registers the MPI back end and opens the layout of tp
 * x dp ranks; NULL (the reason on stderr) when it cannot. */
static inline Comm *dp_worker_open(int tp, int dp) {
#ifdef GRADC_HAVE_MPI
  gradc_mpi_enable();
#endif
  char err[1024];
  Comm *c = comm_open(tp, dp, err, sizeof err);
  if (!c) {
    fprintf(stderr, "comm_open: %s\n", err);
    return NULL;
  }
  dp_worker_rank = c->rank;
  return c;
}

/* A worker's end with its result rc (0: it passed): prints "worker NAME:
 * rank R of N ok" (what dp_workers looks for) if it passed, else ends
 * every rank with comm_abort rather than leave the others waiting; closes
 * c and returns rc. */
static inline int dp_worker_close(Comm *c, const char *name, int rc) {
  if (rc == 0) printf("worker %s: rank %d of %d ok\n", name, c->rank, c->size);
  fflush(stdout);
  if (rc != 0) comm_abort(rc);
  comm_close(c);
  comm_finalize();
  return rc;
}

/* The IR function in text (named name in messages); NULL, with the
 * messages and the text on stderr (a worker's report), when it does not
 * read. */
static inline IrFunc *dp_parse(const char *name, const char *text) {
  SrcFile src = {name, text, strlen(text)};
  Diag d;
  diag_init(&d, NULL);
  d.quiet = true;
  IrFunc *f = ir_read(&src, &d);
  if (!f) fprintf(stderr, "%s\n%s\n", sb_str(&d.log), text);
  diag_free(&d);
  return f;
}

/* In a worker: run the passes names[0..n) on f with options o (the IR
 * verified after each); 0, else the messages on stderr. */
static inline int dp_run_passes(IrFunc *f, const char *const *names, int n, const PassOptions *o) {
  Diag d;
  diag_init(&d, NULL);
  d.quiet = true;
  PassOptions po = *o;
  po.diag = &d;
  PassManager pm;
  pm_init(&pm);
  pm.verify = true;
  int rc = pm_run(&pm, f, names, n, &po);
  if (rc != 0) fprintf(stderr, "passes: %s\n", sb_str(&d.log));
  diag_free(&d);
  return rc;
}

/* In a worker on the C API: say on stderr what failed on this rank (-1:
 * not known yet) and gradc_last_error(); returns 1. */
static inline int dp_api_fail(int rank, const char *what) {
  fprintf(stderr, "rank %d: %s: %s\n", rank, what, gradc_last_error());
  return 1;
}

/* The C API workers (test_dp_train, test_dp_zero) train sessions of small
 * language models on one window, with AdamW clipping at this norm (well
 * below their gradients' norm: clipping is on). */
#define DP_API_CLIP 0.5

/* Compile src (named name) as the API workers do: the interpreter, K = 2,
 * one thread, dp ranks, ZeRO-1 when zero1. */
static inline gradc_status dp_api_compile(const char *name, const char *src, int dp, int zero1, gradc_program **p) {
  gradc_compile_options o;
  gradc_compile_options_init(&o);
  o.gas = 2;
  o.threads = 1;
  o.target = "ref";
  o.dp = dp;
  o.zero1 = zero1;
  return gradc_program_compile_source(name, src, &o, p);
}

/* Give session s the API workers' window: B = 8 samples of T = 4 token
 * ids below V = 11, and targets of which rank 0's half is mostly ignored
 * (-100); false on an error. */
static inline bool dp_api_set_window(gradc_session *s) {
  int32_t idx[32], tgt[32];
  for (int i = 0; i < 32; i++) {
    idx[i] = (i * 7 + 3) % 11;
    tgt[i] = i % 5 == 0 || i < 12 ? -100 : (i * 5 + 1) % 11;
  }
  return gradc_session_set_input(s, "idx", GRADC_I32, idx, 32) == GRADC_OK &&
         gradc_session_set_input(s, "targets", GRADC_I32, tgt, 32) == GRADC_OK;
}

/* Set session s up as the API workers do: params from seed 5, AdamW (lr
 * 0.05, clipping at DP_API_CLIP), and the window; false on an error. */
static inline bool dp_api_setup(gradc_session *s) {
  gradc_optimizer_options oo;
  gradc_optimizer_options_init(&oo, GRADC_ADAMW);
  oo.lr = 0.05;
  oo.clip_norm = DP_API_CLIP;
  return gradc_session_init_params(s, 5) == GRADC_OK && gradc_session_set_optimizer(s, &oo) == GRADC_OK &&
         dp_api_set_window(s);
}

/* ------------------------------------------------------------------ */
/* The tests' side: launching the workers                             */
/* ------------------------------------------------------------------ */

/* The path of this executable, which the tests run again as workers;
 * main sets it with dp_find_self (false: /proc/self/exe unreadable). */
static char dp_self[4096];

static inline bool dp_find_self(void) {
  ssize_t n = readlink("/proc/self/exe", dp_self, sizeof dp_self - 1);
  if (n <= 0) return false;
  dp_self[n] = 0;
  return true;
}

/* Run np workers: `ENV mpirun -np NP <this executable> --worker NAME
 * ARGS`, their stdout and stderr in out (n bytes).  Fails the test unless
 * they exit 0 and each rank r printed "worker NAME: rank r of NP ok". */
static inline void dp_workers(char *out, size_t n, const char *env, int np, const char *name, const char *args) {
  int rc = tu_sh(out, n, "%s " MPIRUN " -np %d %s --worker %s %s", env, np, dp_self, name, args);
  if (rc != 0) fail_msg("workers failed (%d):\n%s", rc, out);
  for (int r = 0; r < np; r++) {
    char want[128];
    snprintf(want, sizeof want, "worker %s: rank %d of %d ok", name, r, np);
    if (!strstr(out, want)) fail_msg("no '%s' in:\n%s", want, out);
  }
}

/* The workers NAME on tp x dp ranks (`--worker NAME TP DP`), skipped
 * without mpirun; shows what they print besides their "worker" lines. */
static inline void dp_run_workers(const char *name, int tp, int dp) {
  if (!dp_have_mpirun()) return;
  char out[32768], args[64];
  snprintf(args, sizeof args, "%d %d", tp, dp);
  dp_workers(out, sizeof out, "", tp * dp, name, args);
  for (char *l = strtok(out, "\n"); l; l = strtok(NULL, "\n"))
    if (!strstr(l, "worker ")) print_message("  %s\n", l);
}

/* ------------------------------------------------------------------ */
/* Outputs: loss lines and tensor files                               */
/* ------------------------------------------------------------------ */

/* How often needle occurs in text. */
static inline int dp_count(const char *text, const char *needle) {
  int n = 0;
  for (const char *p = strstr(text, needle); p; p = strstr(p + 1, needle)) n++;
  return n;
}

/* The value of the line "loss NAME V" in a run's output (fails the test
 * when there is none). */
static inline double dp_loss(const char *text, const char *name) {
  char key[96];
  snprintf(key, sizeof key, "loss %s ", name);
  const char *p = strstr(text, key);
  if (!p) fail_msg("no '%s' line in:\n%s", key, text);
  return strtod(p + strlen(key), NULL);
}

/* The relative error of a against b. */
static inline double dp_rel(double a, double b) { return a == b ? 0 : fabs(a - b) / fmax(fabs(b), 1e-30); }

/* Copy the tensor file in_path to out_path with its i32 targets [B, T]
 * set to ignore_index (-100) where ignore(sample, position); returns the
 * number of valid targets of samples [lo, hi). */
static inline int dp_ignore_targets(const char *in_path, const char *out_path, int B, int T,
                                    bool (*ignore)(int s, int t), int lo, int hi) {
  char err[1024];
  StFile f;
  st_init(&f);
  if (!st_read(in_path, &f, err, sizeof err)) fail_msg("%s", err);
  StTensor *t = (StTensor *)st_find(&f, "targets");
  assert_non_null(t);
  assert_int_equal(t->dtype, ST_I32);
  assert_int_equal(st_numel(t), B * T);
  int32_t *y = t->data;
  int valid = 0;
  for (int s = 0; s < B; s++)
    for (int k = 0; k < T; k++) {
      if (ignore(s, k)) y[s * T + k] = -100;
      valid += s >= lo && s < hi && y[s * T + k] != -100;
    }
  if (!st_write(out_path, &f, err, sizeof err)) fail_msg("%s", err);
  st_free(&f);
  return valid;
}

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

/* Read the tensor files got_path and want_path into got and want (failing
 * the test if either is unreadable); they must hold as many tensors. */
static inline void dp_read_pair(const char *got_path, const char *want_path, StFile *got, StFile *want) {
  char err[1024];
  st_init(got);
  st_init(want);
  if (!st_read(got_path, got, err, sizeof err) || !st_read(want_path, want, err, sizeof err)) fail_msg("%s", err);
  assert_int_equal(got->n, want->n);
}

/* Tensor t's elements as doubles (calloc'd: free them). */
static inline double *dp_load(const StTensor *t) {
  int64_t n = st_numel(t);
  double *v = calloc((size_t)n + 1, sizeof(double));
  assert_non_null(v);
  step_load(t, 0, n, v);
  return v;
}

/* The largest per-tensor relative error of the file got_path against
 * want_path (per tensor: the largest difference over the largest
 * magnitude); every tensor of want must be in got with as many elements,
 * all finite.  Fails the test at a tensor whose error is over tol.  With
 * identical, the tensors must have as many bytes too, and *identical says
 * whether they are all the same bits. */
static inline double dp_file_rel(const char *got_path, const char *want_path, const char *what, double tol,
                                 bool *identical) {
  StFile got, want;
  dp_read_pair(got_path, want_path, &got, &want);
  double worst = 0;
  if (identical) *identical = true;
  for (int i = 0; i < want.n; i++) {
    const StTensor *w = &want.t[i], *g = st_find(&got, w->name);
    if (!g) fail_msg("%s: no tensor '%s' in %s", what, w->name, got_path);
    int64_t n = st_numel(w);
    assert_int_equal(st_numel(g), n);
    if (identical) {
      assert_int_equal(g->nbytes, w->nbytes);
      *identical &= memcmp(g->data, w->data, w->nbytes) == 0;
    }
    double *a = dp_load(g), *b = dp_load(w);
    double diff = 0, scale = 0;
    for (int64_t k = 0; k < n; k++) {
      if (!isfinite(a[k])) fail_msg("%s: '%s'[%lld] is %g", what, w->name, (long long)k, a[k]);
      diff = fmax(diff, fabs(a[k] - b[k]));
      scale = fmax(scale, fabs(b[k]));
    }
    double e = diff == 0 ? 0 : diff / fmax(scale, 1e-30);
    if (e > tol) fail_msg("%s: tensor '%s': relative error %.3g (largest difference %.3g)", what, w->name, e, diff);
    worst = fmax(worst, e);
    free(a);
    free(b);
  }
  st_free(&got);
  st_free(&want);
  return worst;
}

/* Compare every tensor of two files (same names, shapes) to DP_TOL; the
 * largest per-tensor relative error. */
static inline double dp_compare_files(const char *got_path, const char *want_path, const char *what) {
  double worst = dp_file_rel(got_path, want_path, what, DP_TOL, NULL);
  dp_worst_grad = fmax(dp_worst_grad, worst);
  return worst;
}

#endif
