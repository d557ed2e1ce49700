/* test_dp_ignore.c - data parallelism and the window divisors of DESIGN.md
 * §3 rule 2: tests/models/dp_lm.gdl (a cross_entropy mean over the valid
 * targets, a batch mean and a weight penalty) on 2 ranks against one
 * process, with targets set to ignore_index (-100) unevenly: rank 0 with 2
 * valid targets and rank 1 with 17, micro-batches with none; rank 0 with
 * none at all; and a window with none (its cross_entropy is 0, not NaN).
 * A rank that divided by its own count would be off by a factor of about
 * 10 here.  Losses and gradients agree to 1e-5.  Skipped with a message
 * when the build has no MPI or mpirun is absent. */
#include "test_dp.h"

static char tmpdir[] = "/tmp/gradc-dp-ignore-XXXXXX";

enum { B = 8, T = 6 };

static int setup(void **state) {
  (void)state;
  assert_non_null(mkdtemp(tmpdir));
  tu_gradc("init %s -o %s/p.st --seed 21", tu_path("tests/models/dp_lm.gdl"), tmpdir);
  tu_gradc("data random %s -o %s/i.st --seed 22", tu_path("tests/models/dp_lm.gdl"), tmpdir);
  return 0;
}

static int teardown(void **state) {
  (void)state;
  tu_rm_rf(tmpdir);
  print_message("largest relative errors, 2 ranks vs 1: losses %.3g, gradients %.3g\n", dp_worst_loss, dp_worst_grad);
  return 0;
}

/* Write the inputs with targets[s][t] = -100 where ignore(s, t); returns
 * the number of valid targets of samples [lo, hi). */
static int write_targets(const char *name, bool (*ignore)(int s, int t), int lo, int hi) {
  char in[512], out[512];
  snprintf(in, sizeof in, "%s/i.st", tmpdir);
  snprintf(out, sizeof out, "%s/%s.st", tmpdir, name);
  return dp_ignore_targets(in, out, B, T, ignore, lo, hi);
}

/* The window of inputs `name` alone and on 2 ranks; returns both outputs. */
static void compare(const char *name, int K, const char *target, char *one, char *two, size_t n) {
  char err[16384], what[128];
  snprintf(what, sizeof what, "%s K=%d %s", name, K, target);
  const char *model = tu_path("tests/models/dp_lm.gdl");
  char args[1024];
  snprintf(args, sizeof args, "--threads 1 --gas %d --target %s --params %s/p.st --inputs %s/%s.st", K, target, tmpdir,
           tmpdir, name);
  if (tu_sh_err(one, n, err, sizeof err, "%s run %s %s --grads-out %s/g1.st", GRADC_BINARY, model, args, tmpdir) != 0)
    fail_msg("%s: one process: %s", what, err);
  if (tu_sh_err(two, n, err, sizeof err, MPIRUN " -np 2 %s run %s %s --dp 2 --grads-out %s/g2.st", GRADC_BINARY,
                tu_path("tests/models/dp_lm.gdl"), args, tmpdir) != 0)
    fail_msg("%s: two ranks: %s%s", what, two, err);
  assert_int_equal(dp_count(two, "loss total "), 1);
  char g1[512], g2[512];
  snprintf(g1, sizeof g1, "%s/g1.st", tmpdir);
  snprintf(g2, sizeof g2, "%s/g2.st", tmpdir);
  double el = dp_compare_losses(two, one, what), eg = dp_compare_files(g2, g1, what);
  print_message("%s: relative error of losses %.3g, of gradients %.3g\n", what, el, eg);
}

/* Rank 0 (samples 0-3): samples 0-2 ignored, sample 3 with 2 valid
 * targets; rank 1 (4-7): sample 5 ignored, one target of sample 6. */
static bool uneven(int s, int t) { return s <= 2 || (s == 3 && t < 4) || s == 5 || (s == 6 && t == 0); }
static bool first_half(int s, int t) { return s < B / 2; }
static bool all(int s, int t) { return true; }

static void test_dp_ignore_uneven_counts_across_ranks(void **state) {
  (void)state;
  if (!dp_have_mpirun()) return;
  assert_int_equal(write_targets("uneven", uneven, 0, B / 2), 2);
  assert_int_equal(write_targets("uneven", uneven, B / 2, B), 17);
  char one[4096], two[4096];
  /* K = 4: one sample per micro-batch; rank 0's first three and rank 1's
   * second have no valid target. */
  compare("uneven", 1, "cpu", one, two, sizeof one);
  compare("uneven", 4, "cpu", one, two, sizeof one);
  compare("uneven", 4, "ref", one, two, sizeof one);
}

static void test_dp_ignore_rank_without_valid_targets(void **state) {
  (void)state;
  if (!dp_have_mpirun()) return;
  assert_int_equal(write_targets("half", first_half, 0, B / 2), 0);
  char one[4096], two[4096];
  compare("half", 2, "cpu", one, two, sizeof one);
}

static void test_dp_ignore_window_without_valid_targets(void **state) {
  (void)state;
  if (!dp_have_mpirun()) return;
  assert_int_equal(write_targets("none", all, 0, B), 0);
  char one[4096], two[4096];
  compare("none", 4, "cpu", one, two, sizeof one);
  /* The divisor is max(count, 1): loss 0, no NaN. */
  assert_true(dp_loss(one, "ce") == 0);
  assert_true(dp_loss(two, "ce") == 0);
  assert_true(dp_loss(two, "act") > 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_dp_ignore_uneven_counts_across_ranks),
      cmocka_unit_test(test_dp_ignore_rank_without_valid_targets),
      cmocka_unit_test(test_dp_ignore_window_without_valid_targets),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
