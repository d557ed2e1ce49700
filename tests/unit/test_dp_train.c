/* test_dp_train.c - training on 2 data-parallel ranks:
 *   - `mpirun -np 2 gradc train ... --dp 2` ends with the params a
 *     one-process run ends with (relative error 1e-5; AdamW with clipping
 *     and SGD with momentum), and rank 0 alone prints and logs;
 *   - through the C API (this executable run again under mpirun as
 *     `test_dp_train --worker api`): a dp = 2 session's losses, gradients
 *     and optimiser steps equal a dp = 1 session's on the same window in
 *     the same process, the replicas agree, and a rank whose params were
 *     changed is named by gradc_session_check_replicas.
 * Skipped with a message when the build has no MPI or mpirun is absent. */
#include "gradc.h"
#include "test_dp.h"

static char tmpdir[] = "/tmp/gradc-dp-train-XXXXXX";

#define MLP_DEFS "-D D=24 -D H=12"

/* ------------------------------------------------------------------ */
/* The API worker (one per rank)                                        */
/* ------------------------------------------------------------------ */

static const char lm_src[] =
    "model lm {\n"
    "  batch B = 8\n"
    "  dim T = 4\n"
    "  dim V = 11\n"
    "  dim C = 6\n"
    "  input idx : i32[B, T]\n"
    "  input targets : i32[B, T]\n"
    "  param wte : f32[V, C] init normal(0, 0.5)\n"
    "  param W : f32[C, V] init normal(0, 0.5)\n"
    "  loss ce = cross_entropy(tanh(embedding(idx, wte)) @ W, targets)\n"
    "  loss l2 = 0.01 * sum(W * W)\n"
    "}\n";

static int api_worker(void) {
  if (gradc_mpi_enable() != GRADC_OK) return dp_api_fail(-1, "mpi_enable");
  gradc_program *p1 = NULL, *p2 = NULL;
  gradc_session *s1 = NULL, *s2 = NULL;
  if (dp_api_compile("lm.gdl", lm_src, 1, 0, &p1) != GRADC_OK) return dp_api_fail(-1, "compile dp 1");
  if (dp_api_compile("lm.gdl", lm_src, 2, 0, &p2) != GRADC_OK) return dp_api_fail(-1, "compile dp 2");
  if (gradc_program_dp(p2) != 2) return dp_api_fail(-1, "program_dp");
  if (gradc_session_new(p1, &s1) != GRADC_OK || gradc_session_new(p2, &s2) != GRADC_OK)
    return dp_api_fail(-1, "session_new");
  int rank = gradc_session_rank(s2);
  if (gradc_session_rank(s1) != 0) return dp_api_fail(rank, "a dp 1 session has rank 0");
  /* Both programs take the whole window (B = 8 samples). */
  gradc_tensor_info in;
  if (gradc_program_input_info(p2, 0, &in) != GRADC_OK || in.shape[0] != 8) return dp_api_fail(rank, "window shape");
  gradc_session *ss[2] = {s1, s2};
  for (int k = 0; k < 2; k++)
    if (!dp_api_setup(ss[k])) return dp_api_fail(rank, "set up");
  for (int step = 0; step < 3; step++) {
    for (int k = 0; k < 2; k++)
      if (gradc_session_run(ss[k]) != GRADC_OK || gradc_session_step(ss[k]) != GRADC_OK)
        return dp_api_fail(rank, "run/step");
    for (int l = 0; l < 2; l++) {
      double a = gradc_session_loss(s2, l), b = gradc_session_loss(s1, l);
      if (dp_rel(a, b) > DP_TOL) {
        fprintf(stderr, "rank %d: step %d: loss %d: %.9g vs %.9g\n", rank, step, l, a, b);
        return 1;
      }
    }
    float g1[66], g2[66];
    if (gradc_session_get_grad(s1, "W", g1, 66) != GRADC_OK || gradc_session_get_grad(s2, "W", g2, 66) != GRADC_OK)
      return dp_api_fail(rank, "get_grad");
    double diff = 0, scale = 0;
    for (int i = 0; i < 66; i++) diff = fmax(diff, fabs(g2[i] - g1[i])), scale = fmax(scale, fabs(g1[i]));
    if (diff > DP_TOL * scale) {
      fprintf(stderr, "rank %d: step %d: gradient of W differs by %g (scale %g)\n", rank, step, diff, scale);
      return 1;
    }
  }
  if (gradc_session_check_replicas(s2) != GRADC_OK) return dp_api_fail(rank, "check_replicas");
  /* A rank whose params changed is named. */
  if (rank == 1) {
    float w[66];
    gradc_session_get_param(s2, "W", w, 66);
    w[3] += 1;
    gradc_session_set_param(s2, "W", w, 66);
  }
  if (gradc_session_check_replicas(s2) == GRADC_OK) return dp_api_fail(rank, "check_replicas passed");
  if (!strstr(gradc_last_error(), "data-parallel ranks hold different params at step 3: rank 1's hash"))
    return dp_api_fail(rank, "check_replicas message");
  if (rank == 0) printf("%s\n", gradc_last_error());
  printf("worker api: rank %d of 2 ok\n", rank); /* what dp_workers looks for */
  gradc_session_free(s1);
  gradc_session_free(s2);
  gradc_program_free(p1);
  gradc_program_free(p2);
  return 0;
}

/* ------------------------------------------------------------------ */
/* Tests                                                                */
/* ------------------------------------------------------------------ */

static int setup(void **state) {
  (void)state;
  assert_non_null(mkdtemp(tmpdir));
  /* A dataset of 48 samples: one random "window" of B = 48. */
  tu_gradc("data random %s " MLP_DEFS " -D B=48 -o %s/data.st --seed 31", tu_path("examples/mlp.gdl"), tmpdir);
  return 0;
}

static int teardown(void **state) {
  (void)state;
  tu_rm_rf(tmpdir);
  print_message("largest relative error of the final params, 2 ranks vs 1: %.3g\n", dp_worst_grad);
  return 0;
}

/* Train 7 steps (windows of 16, 3 per epoch: the order reshuffles) alone
 * and on 2 ranks; compare the params. */
static void train_both(const char *opt, const char *what) {
  char one[4096], two[4096], err1[16384], err2[16384];
  char args[2048];
  snprintf(args, sizeof args,
           "train %s " MLP_DEFS " -D B=16 --gas 2 --data %s/data.st --steps 7 --seed 3 --threads 1 %s "
           "--print-every 1",
           tu_path("examples/mlp.gdl"), tmpdir, opt);
  if (tu_sh_err(one, sizeof one, err1, sizeof err1, "%s %s --params-out %s/p1.st --log %s/log1.csv", GRADC_BINARY, args,
                tmpdir, tmpdir) != 0)
    fail_msg("%s: one process: %s", what, err1);
  if (tu_sh_err(two, sizeof two, err2, sizeof err2,
                MPIRUN " -np 2 %s %s --dp 2 --params-out %s/p2.st --log %s/log2.csv", GRADC_BINARY, args, tmpdir,
                tmpdir) != 0)
    fail_msg("%s: two ranks: %s%s", what, two, err2);
  /* stdout stays empty; rank 0 alone reports on stderr. */
  assert_string_equal(two, "");
  assert_int_equal(dp_count(err2, "training mlp.gdl"), 1);
  assert_non_null(strstr(err2, "2 data-parallel ranks"));
  assert_int_equal(dp_count(err2, "step 7/7"), 1);
  assert_int_equal(dp_count(err2, "trained 7 steps"), 1);
  char p1[512], p2[512], l1[512];
  snprintf(p1, sizeof p1, "%s/p1.st", tmpdir);
  snprintf(p2, sizeof p2, "%s/p2.st", tmpdir);
  double e = dp_compare_files(p2, p1, what);
  /* The logs agree row by row on the losses (step, lr, ce, l2, total). */
  snprintf(l1, sizeof l1, "%s/log1.csv", tmpdir);
  char *a = NULL, *b = NULL;
  {
    char la[512];
    snprintf(la, sizeof la, "%s/log2.csv", tmpdir);
    const char *why;
    a = read_file(l1, NULL, &why);
    b = read_file(la, NULL, &why);
  }
  assert_non_null(a);
  assert_non_null(b);
  assert_int_equal(dp_count(b, "\n"), 8);
  double worst = 0;
  const char *pa = strchr(a, '\n'), *pb = strchr(b, '\n');
  while (pa && pb && pa[1] && pb[1]) {
    double va[5], vb[5];
    assert_int_equal(sscanf(pa + 1, "%lf,%lf,%lf,%lf,%lf", &va[0], &va[1], &va[2], &va[3], &va[4]), 5);
    assert_int_equal(sscanf(pb + 1, "%lf,%lf,%lf,%lf,%lf", &vb[0], &vb[1], &vb[2], &vb[3], &vb[4]), 5);
    for (int k = 0; k < 5; k++) worst = fmax(worst, dp_rel(vb[k], va[k]));
    pa = strchr(pa + 1, '\n');
    pb = strchr(pb + 1, '\n');
  }
  free(a);
  free(b);
  assert_true(worst <= DP_TOL);
  dp_worst_loss = fmax(dp_worst_loss, worst);
  print_message("%s: relative error of the final params %.3g, of the logged losses %.3g\n", what, e, worst);
}

static void test_dp_train_adamw_matches_one_process(void **state) {
  (void)state;
  if (!dp_have_mpirun()) return;
  train_both("--optimizer adamw --lr 0.01 --clip 1 --warmup 2", "adamw");
}

static void test_dp_train_sgd_matches_one_process(void **state) {
  (void)state;
  if (!dp_have_mpirun()) return;
  train_both("--optimizer sgd --lr 0.1 --momentum 0.9", "sgd");
}

static void test_dp_train_api_sessions(void **state) {
  (void)state;
  if (!dp_have_mpirun()) return;
  char out[16384];
  dp_workers(out, sizeof out, "", 2, "api", "");
}

int main(int argc, char **argv) {
  if (argc == 3 && strcmp(argv[1], "--worker") == 0 && strcmp(argv[2], "api") == 0) return api_worker();
  if (!dp_find_self()) return 1;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_dp_train_adamw_matches_one_process),
      cmocka_unit_test(test_dp_train_sgd_matches_one_process),
      cmocka_unit_test(test_dp_train_api_sessions),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
