/* test_dp_cli.c - the command line's --dp: an artifact compiled for
 * --dp 2 runs on 2 ranks as the model does on one process and refuses
 * another --dp; a rank count that does not match --dp (one process, or
 * mpirun without --dp or with another) and a window that does not split
 * are errors with messages that say what to do.  Skipped with a message
 * when the build has no MPI or mpirun is absent. */
#include "test_dp.h"

static char tmpdir[] = "/tmp/gradc-dp-cli-XXXXXX";

#define MLP_DEFS "-D B=16 -D D=24 -D H=12"

static int setup(void **state) {
  (void)state;
  assert_non_null(mkdtemp(tmpdir));
  tu_gradc("init %s " MLP_DEFS " -o %s/mlp.p.st --seed 11", tu_path("examples/mlp.gdl"), tmpdir);
  tu_gradc("data random %s " MLP_DEFS " -o %s/mlp.i.st --seed 12", tu_path("examples/mlp.gdl"), tmpdir);
  return 0;
}

static int teardown(void **state) {
  (void)state;
  tu_rm_rf(tmpdir);
  return 0;
}

static void test_dp_cli_artifact_keeps_dp(void **state) {
  (void)state;
  if (!dp_have_mpirun()) return;
  char out[4096], err[16384], one[4096];
  if (tu_sh(out, sizeof out, "%s compile %s " MLP_DEFS " --gas 2 --dp 2 -o %s/mlp.gca", GRADC_BINARY,
            tu_path("examples/mlp.gdl"), tmpdir) != 0)
    fail_msg("compile: %s", out);
  if (tu_sh_err(out, sizeof out, err, sizeof err,
                MPIRUN " -np 2 %s run %s/mlp.gca --threads 1 --params %s/mlp.p.st --inputs %s/mlp.i.st", GRADC_BINARY,
                tmpdir, tmpdir, tmpdir) != 0)
    fail_msg("artifact on two ranks: %s%s", out, err);
  if (tu_sh_err(one, sizeof one, err, sizeof err,
                "%s run %s " MLP_DEFS " --gas 2 --params %s/mlp.p.st --inputs %s/mlp.i.st", GRADC_BINARY,
                tu_path("examples/mlp.gdl"), tmpdir, tmpdir) != 0)
    fail_msg("one process: %s", err);
  dp_compare_losses(out, one, "artifact");
  /* The artifact fixes dp. */
  assert_int_equal(tu_sh(out, sizeof out, "%s run %s/mlp.gca --dp 4 --params %s/mlp.p.st --inputs %s/mlp.i.st",
                         GRADC_BINARY, tmpdir, tmpdir, tmpdir),
                   1);
  assert_non_null(strstr(out, "mlp.gca: it was built with --dp 2"));
}

static void test_dp_cli_rank_count_errors(void **state) {
  (void)state;
  if (!dp_have_mpirun()) return;
  char out[16384];
  const char *files = "--params %s/mlp.p.st --inputs %s/mlp.i.st";
  char args[1024];
  snprintf(args, sizeof args, files, tmpdir, tmpdir);
  /* --dp 2 on one process. */
  assert_int_equal(
      tu_sh(out, sizeof out, "%s run %s " MLP_DEFS " --dp 2 %s", GRADC_BINARY, tu_path("examples/mlp.gdl"), args), 1);
  if (!strstr(out, "gradc: error: --dp 2 needs 2 ranks (launch it with mpirun -np 2); this run has 1"))
    fail_msg("%s", out);
  /* --dp 4 on two ranks, and no --dp on two ranks. */
  assert_int_not_equal(tu_sh(out, sizeof out, MPIRUN " -np 2 %s run %s " MLP_DEFS " --dp 4 %s", GRADC_BINARY,
                             tu_path("examples/mlp.gdl"), args),
                       0);
  if (!strstr(out, "gradc: error: this run has 2 ranks (mpirun -np 2) but a different --dp; pass --dp 2"))
    fail_msg("%s", out);
  assert_int_not_equal(tu_sh(out, sizeof out, MPIRUN " -np 2 %s run %s " MLP_DEFS " %s", GRADC_BINARY,
                             tu_path("examples/mlp.gdl"), args),
                       0);
  if (!strstr(out, "gradc: error: this run has 2 ranks (mpirun -np 2) but no --dp; pass --dp 2")) fail_msg("%s", out);
  /* The window must split into K micro-batches on every rank. */
  assert_int_equal(tu_sh(out, sizeof out, "%s run %s " MLP_DEFS " --gas 4 --dp 3 %s", GRADC_BINARY,
                         tu_path("examples/mlp.gdl"), args),
                   1);
  if (!strstr(out, "batch size 16 is not divisible by --gas 4 times --dp 3")) fail_msg("%s", out);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_dp_cli_artifact_keeps_dp),
      cmocka_unit_test(test_dp_cli_rank_count_errors),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
