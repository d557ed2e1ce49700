/* test_dp_zero.c - ZeRO-1 (--zero1) on 2 data-parallel ranks:
 *   - `mpirun -np 2 gradc train ... --dp 2 --zero1` with AdamW and SGD
 *     (momentum), with and without --clip, ends with the params of the
 *     plain --dp 2 run (relative error 1e-6) and of one process (1e-5);
 *   - a checkpoint written with --zero1 holds the whole optimiser state: a
 *     run resumed from it with --zero1 ends bit-identical to the run that
 *     never stopped, and it resumes without --zero1 (2 ranks and one);
 *   - `gradc run --zero1 --grads-out` writes whole gradients;
 *   - through the C API (this executable run again under mpirun as
 *     `test_dp_zero --worker api`), on a model whose f32 params have an odd
 *     element count (121) and with an f64 param (7 elements, the second
 *     dtype group): gradients, grad norms and params against a plain dp 2
 *     session and a one-process one, the optimiser state each rank holds
 *     (about half, exactly this rank's slices), and API checkpoints saved
 *     sharded and loaded into sharded and one-process sessions.
 * Skipped with a message when the build has no MPI or mpirun is absent. */
#include "gradc.h"
#include "api/api_impl.h"
#include "test_dp.h"

static char tmpdir[256] = "/tmp/gradc-dp-zero-XXXXXX";

#define MLP_DEFS "-D D=24 -D H=12"
/* ZeRO-1 against the plain data-parallel run. */
#define ZERO_TOL 1e-6

/* ------------------------------------------------------------------ */
/* The API worker (one per rank)                                        */
/* ------------------------------------------------------------------ */

/* f32 params: 55 + 55 + 11 = 121 elements (rank 0 owns 61, rank 1 60, the
 * cut inside W); f64: 7 (4 and 3). */
static const char odd_src[] =
    "model odd {\n"
    "  batch B = 8\n"
    "  dim T = 4\n"
    "  dim V = 11\n"
    "  dim C = 5\n"
    "  input idx : i32[B, T]\n"
    "  input targets : i32[B, T]\n"
    "  param wte : f32[V, C] init normal(0, 0.5)\n"
    "  param W : f32[C, V] init normal(0, 0.5)\n"
    "  param b : f32[V] init normal(0, 0.1)\n"
    "  param s : f64[7] init normal(0, 1)\n"
    "  loss ce = cross_entropy(tanh(embedding(idx, wte)) @ W + b, targets)\n"
    "  loss l2 = 0.01 * sum(W * W)\n"
    "  loss q = 0.5 * sum(s * s * s * s)\n"
    "}\n";

static const char *const odd_names[4] = {"wte", "W", "b", "s"};
static const int odd_numel[4] = {55, 55, 11, 7};

/* A param's or gradient's values as doubles (f32 ones widened). */
static void get_values(gradc_session *s, int i, bool grad, double *out) {
  float f[64];
  double d[64];
  bool f64 = i == 3;
  gradc_status st = grad ? gradc_session_get_grad(s, odd_names[i], f64 ? (void *)d : (void *)f, (size_t)odd_numel[i])
                         : gradc_session_get_param(s, odd_names[i], f64 ? (void *)d : (void *)f, (size_t)odd_numel[i]);
  if (st != GRADC_OK) {
    fprintf(stderr, "get %s: %s\n", odd_names[i], gradc_last_error());
    abort();
  }
  for (int k = 0; k < odd_numel[i]; k++) out[k] = f64 ? d[k] : (double)f[k];
}

/* The largest relative error over every param (grad: their gradients). */
static double compare(gradc_session *a, gradc_session *b, bool grad, bool *identical) {
  double worst = 0;
  *identical = true;
  for (int i = 0; i < 4; i++) {
    double x[64], y[64], diff = 0, scale = 0;
    get_values(a, i, grad, x);
    get_values(b, i, grad, y);
    for (int k = 0; k < odd_numel[i]; k++) {
      diff = fmax(diff, fabs(x[k] - y[k]));
      scale = fmax(scale, fabs(y[k]));
      *identical &= x[k] == y[k];
    }
    worst = fmax(worst, diff == 0 ? 0 : diff / fmax(scale, 1e-30));
  }
  return worst;
}

static int api_worker(void) {
  if (gradc_mpi_enable() != GRADC_OK) return dp_api_fail(-1, "mpi_enable");
  gradc_program *p1 = NULL, *p2 = NULL, *pz = NULL;
  gradc_session *s1 = NULL, *s2 = NULL, *sz = NULL;
  if (dp_api_compile("odd.gdl", odd_src, 1, 0, &p1) != GRADC_OK) return dp_api_fail(-1, "compile dp 1");
  if (dp_api_compile("odd.gdl", odd_src, 2, 0, &p2) != GRADC_OK) return dp_api_fail(-1, "compile dp 2");
  if (dp_api_compile("odd.gdl", odd_src, 2, 1, &pz) != GRADC_OK) return dp_api_fail(-1, "compile zero1");
  if (gradc_session_new(p1, &s1) != GRADC_OK || gradc_session_new(p2, &s2) != GRADC_OK ||
      gradc_session_new(pz, &sz) != GRADC_OK)
    return dp_api_fail(-1, "session_new");
  int rank = gradc_session_rank(sz);
  /* dp-reduce's all-reduces are left out under ZeRO-1. */
  if (!strstr(p2->ir_text, "all_reduce.start") || strstr(pz->ir_text, "all_reduce.start"))
    return dp_api_fail(rank, "zero1's program has dp all-reduces (or dp 2's has none)");
  gradc_session *ss[3] = {s1, s2, sz};
  for (int k = 0; k < 3; k++)
    if (!dp_api_setup(ss[k])) return dp_api_fail(rank, "set up");
  /* The state this rank holds: AdamW's two slots for its slices only. */
  int64_t f32_part = rank == 0 ? 61 : 60, f64_part = rank == 0 ? 4 : 3;
  int64_t want_bytes = 2 * (f32_part * 4 + f64_part * 8), plain_bytes = api_optim_state_bytes(s2);
  if (api_optim_state_bytes(sz) != want_bytes || plain_bytes != 2 * (121 * 4 + 7 * 8)) {
    fprintf(stderr, "rank %d: optimiser state %lld bytes (want %lld), plain %lld\n", rank,
            (long long)api_optim_state_bytes(sz), (long long)want_bytes, (long long)plain_bytes);
    return 1;
  }
  printf("rank %d: optimiser state %lld bytes with zero1, %lld without (%.3f)\n", rank,
         (long long)api_optim_state_bytes(sz), (long long)plain_bytes,
         (double)api_optim_state_bytes(sz) / (double)plain_bytes);
  double worst_g = 0, worst_n = 0;
  bool same;
  for (int step = 0; step < 3; step++) {
    for (int k = 0; k < 3; k++)
      if (gradc_session_run(ss[k]) != GRADC_OK) return dp_api_fail(rank, "run");
    /* The global norm: the sharded sums of squares added over the ranks. */
    double n1 = gradc_session_grad_norm(s1), n2 = gradc_session_grad_norm(s2), nz = gradc_session_grad_norm(sz);
    if (dp_rel(nz, n2) > 1e-12 || dp_rel(nz, n1) > DP_TOL || !(nz > DP_API_CLIP)) {
      fprintf(stderr, "rank %d: step %d: grad norm %.17g vs %.17g (dp 2) and %.17g (one)\n", rank, step, nz, n2, n1);
      return 1;
    }
    worst_n = fmax(worst_n, dp_rel(nz, n2));
    /* Whole gradients on demand (collective): before the step at step 0,
     * after it later (the update then ran on the sharded gradients). */
    if (step == 0) {
      worst_g = fmax(worst_g, compare(sz, s2, true, &same));
      if (compare(sz, s1, true, &same) > DP_TOL) return dp_api_fail(rank, "gradients vs one process");
    }
    for (int k = 0; k < 3; k++)
      if (gradc_session_step(ss[k]) != GRADC_OK) return dp_api_fail(rank, "step");
    if (step > 0) worst_g = fmax(worst_g, compare(sz, s2, true, &same));
  }
  double ep2 = compare(sz, s2, false, &same), ep1 = compare(sz, s1, false, &same);
  if (worst_g > ZERO_TOL || ep2 > ZERO_TOL || ep1 > DP_TOL) {
    fprintf(stderr, "rank %d: gradients %.3g, params %.3g vs dp 2, params %.3g vs one process\n", rank, worst_g, ep2,
            ep1);
    return 1;
  }
  if (gradc_session_check_replicas(sz) != GRADC_OK) return dp_api_fail(rank, "check_replicas");
  printf("rank %d: relative errors: gradients %.3g, grad norm %.3g, params %.3g vs dp 2, %.3g vs one process\n", rank,
         worst_g, worst_n, ep2, ep1);

  /* Checkpoints: saved whole (collective, rank 0 writes), loaded sharded
   * and into one process; one more step from each equals sz's. */
  char ck[512];
  snprintf(ck, sizeof ck, "%s/api-ck.st", tmpdir);
  if (gradc_session_save_checkpoint(sz, ck) != GRADC_OK) return dp_api_fail(rank, "save_checkpoint");
  if (gradc_session_check_replicas(sz) != GRADC_OK) return dp_api_fail(rank, "check_replicas"); /* rank 0 has written */
  StFile f;
  char err[1024];
  st_init(&f);
  if (!st_read(ck, &f, err, sizeof err)) {
    fprintf(stderr, "rank %d: %s\n", rank, err);
    return 1;
  }
  for (int i = 0; i < 4; i++) {
    char name[64];
    snprintf(name, sizeof name, "optim.exp_avg_sq.%s", odd_names[i]);
    const StTensor *t = st_find(&f, name);
    if (!t || st_numel(t) != odd_numel[i]) return dp_api_fail(rank, "checkpoint holds whole slots");
    for (int64_t k = 0; k < st_numel(t); k++) {
      double v;
      step_load(t, k, 1, &v);
      if (!(v > 0)) return dp_api_fail(rank, "a slice of the checkpoint's exp_avg_sq was left out");
    }
  }
  st_free(&f);
  gradc_session *szb = NULL, *s1b = NULL;
  if (gradc_session_new(pz, &szb) != GRADC_OK || gradc_session_new(p1, &s1b) != GRADC_OK)
    return dp_api_fail(rank, "session_new (resume)");
  if (gradc_session_load_checkpoint(szb, ck) != GRADC_OK || gradc_session_load_checkpoint(s1b, ck) != GRADC_OK)
    return dp_api_fail(rank, "load_checkpoint");
  gradc_session *sr[3] = {sz, szb, s1b};
  for (int k = 0; k < 3; k++)
    if (!dp_api_set_window(sr[k]) || gradc_session_run(sr[k]) != GRADC_OK || gradc_session_step(sr[k]) != GRADC_OK)
      return dp_api_fail(rank, "resumed step");
  if (compare(szb, sz, false, &same) != 0 || !same) return dp_api_fail(rank, "resumed zero1 session is not identical");
  double er = compare(s1b, sz, false, &same);
  if (er > DP_TOL) {
    fprintf(stderr, "rank %d: one process resumed from the zero1 checkpoint: relative error %.3g\n", rank, er);
    return 1;
  }
  printf("worker api: rank %d of 2 ok\n", rank); /* what dp_workers looks for */
  gradc_session_free(s1b);
  gradc_session_free(szb);
  gradc_session_free(s1);
  gradc_session_free(s2);
  gradc_session_free(sz);
  gradc_program_free(p1);
  gradc_program_free(p2);
  gradc_program_free(pz);
  return 0;
}

/* ------------------------------------------------------------------ */
/* Tests                                                                */
/* ------------------------------------------------------------------ */

static int setup(void **state) {
  (void)state;
  assert_non_null(mkdtemp(tmpdir));
  /* A dataset of 48 samples, and one window of 16 with params for run. */
  tu_gradc("data random %s " MLP_DEFS " -D B=48 -o %s/data.st --seed 31", tu_path("examples/mlp.gdl"), tmpdir);
  tu_gradc("data random %s " MLP_DEFS " -D B=16 -o %s/batch.st --seed 4", tu_path("examples/mlp.gdl"), tmpdir);
  tu_gradc("init %s " MLP_DEFS " -o %s/init.st --seed 1", tu_path("examples/mlp.gdl"), tmpdir);
  return 0;
}

static int teardown(void **state) {
  (void)state;
  tu_rm_rf(tmpdir);
  return 0;
}

/* The largest per-tensor relative error between two files, and whether
 * they are the same bits (the callers check the tolerances). */
static double file_rel(const char *a_path, const char *b_path, const char *what, bool *identical) {
  return dp_file_rel(a_path, b_path, what, INFINITY, identical);
}

#define TRAIN_ARGS "train %s " MLP_DEFS " -D B=16 --gas 2 --data %s/data.st --steps 7 --seed 3 --threads 1 %s"

static void train(const char *opt, const char *ranks, const char *extra, const char *what) {
  char out[8192], err[16384];
  bool mpi = ranks[0] != 0;
  if (tu_sh_err(out, sizeof out, err, sizeof err, "%s%s %s " TRAIN_ARGS " %s", mpi ? MPIRUN " -np " : "", ranks,
                GRADC_BINARY, tu_path("examples/mlp.gdl"), tmpdir, opt, extra) != 0)
    fail_msg("%s: %s%s", what, out, err);
}

/* Train 7 steps (windows of 16, 3 per epoch) alone, on 2 ranks and on 2
 * ranks with --zero1; compare the final params. */
static void train_three(const char *opt, const char *what) {
  char extra[2048], p1[512], p2[512], pz[512];
  snprintf(p1, sizeof p1, "%s/p1.st", tmpdir);
  snprintf(p2, sizeof p2, "%s/p2.st", tmpdir);
  snprintf(pz, sizeof pz, "%s/pz.st", tmpdir);
  snprintf(extra, sizeof extra, "--params-out %s", p1);
  train(opt, "", extra, what);
  snprintf(extra, sizeof extra, "--dp 2 --params-out %s", p2);
  train(opt, "2", extra, what);
  snprintf(extra, sizeof extra, "--dp 2 --zero1 --params-out %s", pz);
  train(opt, "2", extra, what);
  bool same;
  double e2 = file_rel(pz, p2, what, &same), e1 = file_rel(pz, p1, what, &same);
  print_message("%s: final params, zero1 vs dp 2: relative error %.3g; vs one process %.3g\n", what, e2, e1);
  if (e2 > ZERO_TOL) fail_msg("%s: zero1 vs dp 2: relative error %.3g", what, e2);
  if (e1 > DP_TOL) fail_msg("%s: zero1 vs one process: relative error %.3g", what, e1);
}

static void test_dp_zero_train_adamw_clip(void **state) {
  (void)state;
  if (!dp_have_mpirun()) return;
  train_three("--optimizer adamw --lr 0.01 --clip 0.5 --warmup 2", "adamw --clip");
}

static void test_dp_zero_train_adamw(void **state) {
  (void)state;
  if (!dp_have_mpirun()) return;
  train_three("--optimizer adamw --lr 0.01", "adamw");
}

static void test_dp_zero_train_sgd_momentum(void **state) {
  (void)state;
  if (!dp_have_mpirun()) return;
  train_three("--optimizer sgd --lr 0.1 --momentum 0.9", "sgd");
}

static void test_dp_zero_train_sgd_momentum_clip(void **state) {
  (void)state;
  if (!dp_have_mpirun()) return;
  train_three("--optimizer sgd --lr 0.1 --momentum 0.9 --nesterov --clip 0.1", "sgd --nesterov --clip");
}

/* A --zero1 checkpoint at step 3 (and every 2 steps: collective saves
 * inside the loop) resumes bit-identically with --zero1, and without it on
 * 2 ranks and on one. */
static void test_dp_zero_checkpoint_resumes(void **state) {
  (void)state;
  if (!dp_have_mpirun()) return;
  const char *opt = "--optimizer adamw --lr 0.01 --clip 0.5";
  char extra[2048], a[512], c[512], d[512], e[512];
  snprintf(a, sizeof a, "%s/ck-a.st", tmpdir);
  snprintf(c, sizeof c, "%s/ck-c.st", tmpdir);
  snprintf(d, sizeof d, "%s/ck-d.st", tmpdir);
  snprintf(e, sizeof e, "%s/ck-e.st", tmpdir);
  snprintf(extra, sizeof extra, "--dp 2 --zero1 --params-out %s", a);
  train(opt, "2", extra, "zero1, no stop");
  snprintf(extra, sizeof extra, "--dp 2 --zero1 --stop-after 3 --checkpoint %s/ck.st --checkpoint-every 2", tmpdir);
  train(opt, "2", extra, "zero1, stopped at 3");
  /* The file holds the whole optimiser state. */
  StFile f;
  char err[1024], path[512];
  snprintf(path, sizeof path, "%s/ck.st", tmpdir);
  st_init(&f);
  if (!st_read(path, &f, err, sizeof err)) fail_msg("%s", err);
  const StTensor *m = st_find(&f, "optim.exp_avg_sq.W1");
  assert_non_null(m);
  assert_int_equal(st_numel(m), 24 * 12);
  for (int64_t k = 0; k < st_numel(m); k++) {
    double v;
    step_load(m, k, 1, &v);
    if (!(v > 0)) fail_msg("optim.exp_avg_sq.W1[%lld] is %g: a rank's slice is missing", (long long)k, v);
  }
  assert_string_equal(st_get_meta(&f, "step"), "3");
  st_free(&f);
  snprintf(extra, sizeof extra, "--dp 2 --zero1 --resume %s --params-out %s", path, c);
  train(opt, "2", extra, "zero1, resumed");
  snprintf(extra, sizeof extra, "--dp 2 --resume %s --params-out %s", path, d);
  train(opt, "2", extra, "dp 2, resumed");
  snprintf(extra, sizeof extra, "--resume %s --params-out %s", path, e);
  train(opt, "", extra, "one process, resumed");
  bool same;
  double ec = file_rel(c, a, "zero1, resumed", &same);
  if (!same) fail_msg("zero1 resumed from its checkpoint differs from the run that never stopped (relative %.3g)", ec);
  double ed = file_rel(d, a, "dp 2, resumed", &same), ee = file_rel(e, a, "one process, resumed", &same);
  print_message("resumed from a zero1 checkpoint: zero1 bit-identical; dp 2 %.3g; one process %.3g\n", ed, ee);
  if (ed > ZERO_TOL) fail_msg("dp 2 resumed from the zero1 checkpoint: relative error %.3g", ed);
  if (ee > DP_TOL) fail_msg("one process resumed from the zero1 checkpoint: relative error %.3g", ee);
}

/* `gradc run --zero1 --grads-out` writes the whole gradients. */
static void test_dp_zero_run_whole_grads(void **state) {
  (void)state;
  if (!dp_have_mpirun()) return;
  char out[8192], err[16384], g1[512], gz[512];
  const char *fmt = "%s%s %s run %s " MLP_DEFS " -D B=16 --gas 2 --params %s/init.st --inputs %s/batch.st --threads 1 "
                    "--target %s %s --grads-out %s";
  const char *targets[1] = {"cpu"}; /* the API worker runs the interpreter */
  for (int t = 0; t < 1; t++) {
    snprintf(g1, sizeof g1, "%s/g1-%s.st", tmpdir, targets[t]);
    snprintf(gz, sizeof gz, "%s/gz-%s.st", tmpdir, targets[t]);
    if (tu_sh_err(out, sizeof out, err, sizeof err, fmt, "", "", GRADC_BINARY, tu_path("examples/mlp.gdl"), tmpdir,
                  tmpdir, targets[t], "", g1) != 0)
      fail_msg("one process: %s", err);
    char one[8192];
    snprintf(one, sizeof one, "%s", out);
    if (tu_sh_err(out, sizeof out, err, sizeof err, fmt, MPIRUN " -np 2 ", "", GRADC_BINARY,
                  tu_path("examples/mlp.gdl"), tmpdir, tmpdir, targets[t], "--dp 2 --zero1", gz) != 0)
      fail_msg("zero1: %s%s", out, err);
    dp_compare_losses(out, one, "run --zero1");
    bool same;
    double e = file_rel(gz, g1, "run --zero1", &same);
    print_message("run --zero1 (%s): gradients vs one process: relative error %.3g\n", targets[t], e);
    if (e > DP_TOL) fail_msg("run --zero1 (%s): gradients: relative error %.3g", targets[t], e);
  }
}

static void test_dp_zero_api_odd_sizes(void **state) {
  (void)state;
  if (!dp_have_mpirun()) return;
  char out[16384], env[512];
  snprintf(env, sizeof env, "GRADC_TEST_TMP=%s", tmpdir);
  dp_workers(out, sizeof out, env, 2, "api", "");
  print_message("%s", out);
}

int main(int argc, char **argv) {
  if (argc == 3 && strcmp(argv[1], "--worker") == 0 && strcmp(argv[2], "api") == 0) {
    const char *dir = getenv("GRADC_TEST_TMP");
    if (!dir) return 1;
    snprintf(tmpdir, sizeof tmpdir, "%s", dir);
    return api_worker();
  }
  if (!dp_find_self()) return 1;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_dp_zero_train_adamw_clip),
      cmocka_unit_test(test_dp_zero_train_adamw),
      cmocka_unit_test(test_dp_zero_train_sgd_momentum),
      cmocka_unit_test(test_dp_zero_train_sgd_momentum_clip),
      cmocka_unit_test(test_dp_zero_checkpoint_resumes),
      cmocka_unit_test(test_dp_zero_run_whole_grads),
      cmocka_unit_test(test_dp_zero_api_odd_sizes),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
