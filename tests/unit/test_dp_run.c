/* test_dp_run.c - `mpirun -np 2 gradc run ... --dp 2` against the same
 * window run by one process: examples/mlp.gdl (a batch mean and a weight
 * penalty) and examples/tinygpt.gdl at small sizes, with K = 1 and K = 4;
 * every loss and every gradient agree to a relative error of 1e-5, and
 * rank 0 alone prints.  Skipped with a message when the build has no MPI
 * or mpirun is absent. */
#include "test_dp.h"

static char tmpdir[] = "/tmp/gradc-dp-run-XXXXXX";

#define MLP_DEFS "-D B=16 -D D=24 -D H=12"
#define GPT_DEFS "-D B=8 -D T=8 -D C=16 -D NH=2 -D L=1 -D V=32"

static int setup(void **state) {
  (void)state;
  assert_non_null(mkdtemp(tmpdir));
  const char *models[][3] = {{"examples/mlp.gdl", MLP_DEFS, "mlp"}, {"examples/tinygpt.gdl", GPT_DEFS, "gpt"}};
  for (int i = 0; i < 2; i++) {
    tu_gradc("init %s %s -o %s/%s.p.st --seed 11", tu_path(models[i][0]), models[i][1], tmpdir, models[i][2]);
    tu_gradc("data random %s %s -o %s/%s.i.st --seed 12", tu_path(models[i][0]), models[i][1], tmpdir, models[i][2]);
  }
  return 0;
}

static int teardown(void **state) {
  (void)state;
  tu_rm_rf(tmpdir);
  print_message("largest relative errors, 2 ranks vs 1: losses %.3g, gradients %.3g\n", dp_worst_loss, dp_worst_grad);
  return 0;
}

/* One window of model (name: its files' prefix) with K micro-batches:
 * alone, then on 2 ranks; compare. */
static void compare(const char *model, const char *defs, const char *name, int K, const char *target) {
  char one[4096], two[4096], err[16384], what[128];
  snprintf(what, sizeof what, "%s K=%d %s", name, K, target);
  const char *common = "--threads 1 --params %s/%s.p.st --inputs %s/%s.i.st";
  char args[1024];
  snprintf(args, sizeof args, common, tmpdir, name, tmpdir, name);
  if (tu_sh_err(one, sizeof one, err, sizeof err, "%s run %s %s --gas %d --target %s %s --grads-out %s/%s.g1.st",
                GRADC_BINARY, tu_path(model), defs, K, target, args, tmpdir, name) != 0)
    fail_msg("%s: one process: %s", what, err);
  if (tu_sh_err(two, sizeof two, err, sizeof err,
                MPIRUN " -np 2 %s run %s %s --gas %d --target %s %s --dp 2 --grads-out %s/%s.g2.st", GRADC_BINARY,
                tu_path(model), defs, K, target, args, tmpdir, name) != 0)
    fail_msg("%s: two ranks: %s%s", what, two, err);
  /* Rank 0 alone prints: one set of loss lines on stdout. */
  assert_int_equal(dp_count(two, "loss total "), 1);
  assert_int_equal(dp_count(two, "\n"), dp_count(one, "\n"));
  char g1[512], g2[512];
  snprintf(g1, sizeof g1, "%s/%s.g1.st", tmpdir, name);
  snprintf(g2, sizeof g2, "%s/%s.g2.st", tmpdir, name);
  double el = dp_compare_losses(two, one, what), eg = dp_compare_files(g2, g1, what);
  print_message("%s: relative error of losses %.3g, of gradients %.3g\n", what, el, eg);
}

static void test_dp_run_mlp_matches_one_process(void **state) {
  (void)state;
  if (!dp_have_mpirun()) return;
  compare("examples/mlp.gdl", MLP_DEFS, "mlp", 1, "cpu");
  compare("examples/mlp.gdl", MLP_DEFS, "mlp", 4, "cpu");
  compare("examples/mlp.gdl", MLP_DEFS, "mlp", 4, "ref");
}

static void test_dp_run_tinygpt_matches_one_process(void **state) {
  (void)state;
  if (!dp_have_mpirun()) return;
  compare("examples/tinygpt.gdl", GPT_DEFS, "gpt", 1, "cpu");
  compare("examples/tinygpt.gdl", GPT_DEFS, "gpt", 4, "cpu");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_dp_run_mlp_matches_one_process),
      cmocka_unit_test(test_dp_run_tinygpt_matches_one_process),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
