/* test_tp_run.c - tensor parallelism end to end: `mpirun -np 2 gradc run
 * ... --tp 2` and `mpirun -np 4 gradc run ... --tp 2 --dp 2` against the
 * same window run by one process without --tp, for tests/models/tp_mlp.gdl,
 * tp_gpt.gdl and tp_lm.gdl (ignore_index targets spread unevenly, with
 * micro-batches that have no valid target), K = 1 and K = 4, targets cpu
 * and ref.  Losses agree to a relative error of 1e-5; every gradient to
 * 1e-5 of its tensor's largest magnitude, with a floor of GRAD_FLOOR of
 * the largest gradient magnitude of all params for tensors that are
 * analytically zero (attention's key bias: its gradient is rounding noise,
 * ~1e-9).  The same with --sequence-parallel (tp_gpt, tp_mlp).  Also the
 * CLI's errors: --tp with the wrong number of ranks.  Skipped with a message when the build has no MPI or
 * mpirun is absent. */
#include "test_dp.h"

static char tmpdir[] = "/tmp/gradc-tp-run-XXXXXX";

#define MLP_DEFS "-D B=8 -D D=12 -D H=16"
#define GPT_DEFS "-D B=8 -D T=8 -D C=16 -D NH=4 -D L=2 -D V=32"
#define LM_DEFS ""

enum { LM_B = 8, LM_T = 6 };

typedef struct {
  const char *model, *defs, *name;
} Model;

static const Model mlp = {"tests/models/tp_mlp.gdl", MLP_DEFS, "mlp"};
static const Model gpt = {"tests/models/tp_gpt.gdl", GPT_DEFS, "gpt"};
static const Model lm = {"tests/models/tp_lm.gdl", LM_DEFS, "lm"};

/* A layout of ranks: -np and the flags that go with it. */
typedef struct {
  int np;
  const char *flags, *what;
} Layout;

static const Layout tp2 = {2, "--tp 2", "tp 2"};
static const Layout tp2dp2 = {4, "--tp 2 --dp 2", "tp 2 x dp 2"};
static const Layout tp2sp = {2, "--tp 2 --sequence-parallel", "tp 2, sequence parallel"};
static const Layout tp2dp2sp = {4, "--tp 2 --dp 2 --sequence-parallel", "tp 2 x dp 2, sequence parallel"};

/* The floor of a gradient's scale, as a fraction of the largest gradient
 * magnitude of the window.  tp_gpt's k_b gradient is analytically zero (a
 * key bias shifts each query's scores by a constant, which softmax ignores);
 * what it holds is rounding noise of sums of terms ~1e-2.  One process
 * alone (GPT_DEFS, seed 31) gives max|k_b| 1.7e-9 on cpu and 1.9e-9 on ref,
 * differing by 2.3e-9, i.e. 1.2e-8 of the largest gradient (0.185).  A floor
 * of 1e-3 would allow only 1e-8 of it and fail two correct single-process
 * targets against each other; 1e-2 allows 1e-7.  Every gradient that is not
 * zero here is above the floor (the smallest, q_b, is 0.018 = 0.095 of the
 * largest), so for them the comparison stays relative to their own size;
 * each case prints the tensors below the floor. */
#define GRAD_FLOOR 1e-2

static double worst_floor_grad; /* largest error over the floored scale */
static char floored[256];       /* the tensors of the last comparison below the floor */

static int setup(void **state) {
  (void)state;
  assert_non_null(mkdtemp(tmpdir));
  const Model *ms[] = {&mlp, &gpt, &lm};
  for (int i = 0; i < 3; i++) {
    tu_gradc("init %s %s -o %s/%s.p.st --seed 31", tu_path(ms[i]->model), ms[i]->defs, tmpdir, ms[i]->name);
    for (int K = 1; K <= 4; K *= 4)
      tu_gradc("data random %s %s --gas %d -o %s/%s.k%d.st --seed 32", tu_path(ms[i]->model), ms[i]->defs, K, tmpdir,
               ms[i]->name, K);
  }
  return 0;
}

static int teardown(void **state) {
  (void)state;
  tu_rm_rf(tmpdir);
  print_message(
      "largest errors, tp ranks vs 1 process: losses %.3g (relative), gradients %.3g (of the floored scale)\n",
      dp_worst_loss, worst_floor_grad);
  return 0;
}

/* Every tensor of want_path in got_path, same shape, with
 * max|a-b| <= DP_TOL * max(max|b|, GRAD_FLOOR * the largest |b| of all tensors);
 * returns the largest ratio of max|a-b| to that scale. */
static double compare_grads(const char *got_path, const char *want_path, const char *what) {
  StFile got, want;
  dp_read_pair(got_path, want_path, &got, &want);
  double global = 0;
  for (int i = 0; i < want.n; i++) {
    double *b = dp_load(&want.t[i]);
    for (int64_t k = 0; k < st_numel(&want.t[i]); k++) global = fmax(global, fabs(b[k]));
    free(b);
  }
  assert_true(global > 0);
  double worst = 0;
  floored[0] = 0;
  for (int i = 0; i < want.n; i++) {
    const StTensor *w = &want.t[i], *g = st_find(&got, w->name);
    if (!g) fail_msg("%s: no gradient '%s' in %s", what, w->name, got_path);
    int64_t n = st_numel(w);
    if (st_numel(g) != n)
      fail_msg("%s: gradient '%s' has %lld elements, want %lld", what, w->name, (long long)st_numel(g), (long long)n);
    double *a = dp_load(g), *b = dp_load(w);
    double diff = 0, big = 0;
    int64_t at = 0;
    for (int64_t k = 0; k < n; k++) {
      if (!isfinite(a[k])) fail_msg("%s: '%s'[%lld] is %g", what, w->name, (long long)k, a[k]);
      if (fabs(a[k] - b[k]) > diff) diff = fabs(a[k] - b[k]), at = k;
      big = fmax(big, fabs(b[k]));
    }
    double scale = fmax(big, GRAD_FLOOR * global), e = diff / scale;
    if (big < scale) snprintf(floored + strlen(floored), sizeof floored - strlen(floored), " %s", w->name);
    if (e > DP_TOL)
      fail_msg(
          "%s: gradient '%s': largest difference %.3g at [%lld] (%.9g vs %.9g), %.3g of its scale %.3g "
          "(largest |g| %.3g)",
          what, w->name, diff, (long long)at, a[at], b[at], e, scale, big);
    worst = fmax(worst, e);
    free(a);
    free(b);
  }
  st_free(&got);
  st_free(&want);
  worst_floor_grad = fmax(worst_floor_grad, worst);
  return worst;
}

/* One window of m with K micro-batches on target, inputs `in` (a file of
 * tmpdir without .st): one process, then each layout; compare. */
static void compare(const Model *m, const char *in, int K, const char *target, const Layout *const *layouts, int nl) {
  char one[4096], many[4096], err[16384], what[160], args[1024];
  snprintf(args, sizeof args, "%s %s --threads 1 --gas %d --target %s --params %s/%s.p.st --inputs %s/%s.st",
           tu_path(m->model), m->defs, K, target, tmpdir, m->name, tmpdir, in);
  snprintf(what, sizeof what, "%s (%s) K=%d %s, one process", m->name, in, K, target);
  if (tu_sh_err(one, sizeof one, err, sizeof err, "%s run %s --grads-out %s/g1.st", GRADC_BINARY, args, tmpdir) != 0)
    fail_msg("%s: %s", what, err);
  for (int i = 0; i < nl; i++) {
    const Layout *l = layouts[i];
    snprintf(what, sizeof what, "%s (%s) K=%d %s, %s", m->name, in, K, target, l->what);
    if (tu_sh_err(many, sizeof many, err, sizeof err, MPIRUN " -np %d %s run %s %s --grads-out %s/g%d.st", l->np,
                  GRADC_BINARY, args, l->flags, tmpdir, l->np) != 0)
      fail_msg("%s: %s%s", what, many, err);
    /* Rank 0 alone prints: the same loss lines as one process. */
    assert_int_equal(dp_count(many, "loss total "), 1);
    assert_int_equal(dp_count(many, "\n"), dp_count(one, "\n"));
    char g1[512], gn[512];
    snprintf(g1, sizeof g1, "%s/g1.st", tmpdir);
    snprintf(gn, sizeof gn, "%s/g%d.st", tmpdir, l->np);
    double el = dp_compare_losses(many, one, what), eg = compare_grads(gn, g1, what);
    print_message("%s: losses %.3g, gradients %.3g%s%s\n", what, el, eg, floored[0] ? "; below the floor:" : "",
                  floored);
  }
}

static const Layout *const both[] = {&tp2, &tp2dp2};
static const Layout *const both_sp[] = {&tp2sp, &tp2dp2sp};

static void test_tp_run_mlp_matches_one_process(void **state) {
  (void)state;
  if (!dp_have_mpirun()) return;
  compare(&mlp, "mlp.k1", 1, "cpu", both, 2);
  compare(&mlp, "mlp.k4", 4, "cpu", both, 2);
  compare(&mlp, "mlp.k1", 1, "ref", both, 2);
  compare(&mlp, "mlp.k4", 4, "ref", both, 2);
}

static void test_tp_run_tinygpt_matches_one_process(void **state) {
  (void)state;
  if (!dp_have_mpirun()) return;
  compare(&gpt, "gpt.k1", 1, "cpu", both, 2);
  compare(&gpt, "gpt.k4", 4, "cpu", both, 2);
  compare(&gpt, "gpt.k1", 1, "ref", both, 2);
  compare(&gpt, "gpt.k4", 4, "ref", both, 2);
}

/* --sequence-parallel: reduce-scatters and split-shard matmuls (tp.scatter,
 * rank.slice, rank.concat at run time) give the same window. */
static void test_tp_run_sequence_parallel(void **state) {
  (void)state;
  if (!dp_have_mpirun()) return;
  compare(&gpt, "gpt.k1", 1, "cpu", both_sp, 2);
  compare(&gpt, "gpt.k4", 4, "cpu", both_sp, 2);
  compare(&gpt, "gpt.k1", 1, "ref", both_sp, 2);
  compare(&gpt, "gpt.k4", 4, "ref", both_sp, 2);
  compare(&mlp, "mlp.k4", 4, "cpu", both_sp, 2);
}

/* Rank layout of tp 2 x dp 2: dp rank 0 runs samples 0-3, dp rank 1
 * samples 4-7.  Samples 0-2 ignored, sample 3 with 2 valid targets; sample
 * 5 ignored, one target of sample 6.  With K = 4 under tp 2 alone the first
 * micro-batch (samples 0-1) has no valid target; under tp 2 x dp 2, dp rank
 * 0's first three micro-batches and dp rank 1's second have none. */
static bool uneven(int s, int t) { return s <= 2 || (s == 3 && t < 4) || s == 5 || (s == 6 && t == 0); }

/* Write lm.k<K>.st's targets with -100 where uneven(); returns the number
 * of valid targets of samples [lo, hi). */
static int write_uneven(int K, int lo, int hi) {
  char in[512], out[512];
  snprintf(in, sizeof in, "%s/lm.k%d.st", tmpdir, K);
  snprintf(out, sizeof out, "%s/lm.uneven%d.st", tmpdir, K);
  return dp_ignore_targets(in, out, LM_B, LM_T, uneven, lo, hi);
}

static void test_tp_run_uneven_ignore_index(void **state) {
  (void)state;
  if (!dp_have_mpirun()) return;
  for (int K = 1; K <= 4; K *= 4) {
    assert_int_equal(write_uneven(K, 0, 2), 0); /* tp 2, K = 4: micro-batch 0 */
    assert_int_equal(write_uneven(K, 0, LM_B / 2), 2);
    assert_int_equal(write_uneven(K, LM_B / 2, LM_B), 17);
  }
  compare(&lm, "lm.uneven1", 1, "cpu", both, 2);
  compare(&lm, "lm.uneven4", 4, "cpu", both, 2);
  compare(&lm, "lm.uneven1", 1, "ref", both, 2);
  compare(&lm, "lm.uneven4", 4, "ref", both, 2);
}

/* A failing run: its exit status is not 0 and its stderr says `want`. */
static void expect_error(const char *want, const char *fmt_np, const char *flags) {
  char out[4096], err[16384];
  int rc = tu_sh_err(out, sizeof out, err, sizeof err,
                     "%s %s run %s " MLP_DEFS " --threads 1 --params %s/mlp.p.st --inputs %s/mlp.k1.st %s", fmt_np,
                     GRADC_BINARY, tu_path(mlp.model), tmpdir, tmpdir, flags);
  if (rc == 0) fail_msg("'%s' succeeded:\n%s", flags, out);
  if (!strstr(err, want)) fail_msg("'%s': want '%s' in:\n%s%s", flags, want, out, err);
  assert_null(strstr(out, "loss total"));
}

static void test_tp_run_cli_errors(void **state) {
  (void)state;
  if (!dp_have_mpirun()) return;
  /* H = 16 is divisible by 2 but not 3: the split cannot be lowered (an
   * error at the annotation). */
  expect_error(
      "tp_mlp.gdl:12:52: error: split(1) of 'W1' cannot be lowered: axis 1 of f32[12,16] is not divisible by --tp 3",
      MPIRUN " -np 2", "--tp 3");
  /* -D H=12 is divisible by 3: the ranks do not add up. */
  expect_error("this run has 2 ranks (mpirun -np 2) but --tp 3 x --dp 1 = 3; pass --tp and --dp whose product is 2",
               MPIRUN " -np 2", "-D H=12 --tp 3");
  expect_error("--tp 2 x --dp 1 needs 2 ranks (launch it with mpirun -np 2); this run has 1", "", "--tp 2");
  expect_error("this run has 4 ranks (mpirun -np 4) but --tp 2 x --dp 1 = 2; pass --tp and --dp whose product is 4",
               MPIRUN " -np 4", "--tp 2");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_tp_run_mlp_matches_one_process),
      cmocka_unit_test(test_tp_run_tinygpt_matches_one_process),
      cmocka_unit_test(test_tp_run_sequence_parallel),
      cmocka_unit_test(test_tp_run_uneven_ignore_index),
      cmocka_unit_test(test_tp_run_cli_errors),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
