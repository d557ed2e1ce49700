/* test_dp_cli.c - the command line's --dp: an artifact compiled for
 * --dp 2 runs on 2 ranks as the model does on one process and refuses
 * another --dp; a rank count that does not match --dp (one process, or
 * mpirun without --dp or with another) and a window that does not split
 * are errors with messages that say what to do; ranks started with
 * different flags, files or params (mpirun's rank 0 : rank 1 form) stop at
 * once, naming what differs, instead of waiting for each other.  Skipped with a message
 * when the build has no MPI or mpirun is absent. */
#include <time.h>

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

/* `mpirun -np 1 gradc train ARGS0 : -np 1 gradc train ARGS1`, stopped
 * after 120 s: its exit status and output. */
static int train_two(char *out, size_t n, const char *args0, const char *args1) {
  char common[1024];
  snprintf(common, sizeof common, "train " MLP_DEFS " --dp 2 --threads 1 --print-every 100");
  time_t t = time(NULL);
  int rc = tu_sh(out, n, "cd %s && timeout 120 env " MPIRUN " -np 1 %s %s %s : -np 1 %s %s %s", tmpdir, GRADC_BINARY,
                 common, args0, GRADC_BINARY, common, args1);
  if (rc == 124 || time(NULL) - t > 100) fail_msg("ranks %s | %s: hung (exit %d)\n%s", args0, args1, rc, out);
  return rc;
}

static void disagree(const char *args0, const char *args1, const char *want) {
  char out[32768];
  int rc = train_two(out, sizeof out, args0, args1);
  if (rc == 0 || !strstr(out, want)) fail_msg("ranks '%s' | '%s': exit %d, wanted '%s' in:\n%s", args0, args1, rc, want, out);
}

static void test_dp_cli_ranks_that_disagree_stop(void **state) {
  (void)state;
  if (!dp_have_mpirun()) return;
  char out[32768];
  /* The model, a copy with another text, another params file and dataset. */
  char *mlp = tu_read("examples/mlp.gdl");
  char path[512];
  snprintf(path, sizeof path, "%s/mlp.gdl", tmpdir);
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fputs(mlp, f);
  fclose(f);
  snprintf(path, sizeof path, "%s/mlp2.gdl", tmpdir);
  f = fopen(path, "w");
  assert_non_null(f);
  fprintf(f, "# the same model, another text\n%s", mlp);
  fclose(f);
  free(mlp);
  tu_gradc("init %s " MLP_DEFS " -o %s/other.p.st --seed 12", tu_path("examples/mlp.gdl"), tmpdir);
  tu_gradc("data random %s " MLP_DEFS " -o %s/other.i.st --seed 13", tu_path("examples/mlp.gdl"), tmpdir);
#define RUN "mlp.gdl --data mlp.i.st --steps 3 "
  /* The same flags in the two-part form train. */
  if (train_two(out, sizeof out, RUN, RUN) != 0) fail_msg("%s", out);
  assert_non_null(strstr(out, "trained 3 steps"));
  /* A different --steps used to leave rank 1 waiting for ever. */
  disagree(RUN, "mlp.gdl --data mlp.i.st --steps 5",
           "gradc: error: ranks disagree on --steps: rank 1: 5, rank 0: 3; every rank must be started with the same "
           "model, flags and files");
  disagree(RUN "--zero1", RUN, "gradc: error: ranks disagree on --zero1: rank 1: off, rank 0: on");
  disagree(RUN, RUN "--zero1", "gradc: error: ranks disagree on --zero1: rank 1: on, rank 0: off");
  disagree(RUN "--lr 0.1", RUN "--lr 0.2", "gradc: error: ranks disagree on --lr: rank 1: 0.2, rank 0: 0.1");
  disagree(RUN "--seed 1", RUN "--seed 2", "gradc: error: ranks disagree on --seed: rank 1: 2, rank 0: 1");
  disagree(RUN "--init mlp.p.st", RUN "--init other.p.st",
           "gradc: error: ranks disagree on the initial value of param 'W1': rank 1's differs from rank 0's");
  disagree(RUN, "mlp.gdl --data other.i.st --steps 3", "gradc: error: ranks disagree on --data (the dataset's tensors)");
  disagree(RUN, "mlp2.gdl --data mlp.i.st --steps 3", "gradc: error: ranks disagree on the model");
#undef RUN
  /* gradc run: the same files on every rank. */
  const char *run = "run mlp.gdl " MLP_DEFS " --dp 2 --threads 1 --inputs mlp.i.st";
  int rc = tu_sh(out, sizeof out, "cd %s && timeout 120 env " MPIRUN " -np 1 %s %s --params mlp.p.st : -np 1 %s %s "
                 "--params other.p.st", tmpdir, GRADC_BINARY, run, GRADC_BINARY, run);
  if (rc == 0 || rc == 124 || !strstr(out, "gradc: error: ranks disagree on the tensor of --params 'W1': rank 1's "
                                           "differs from rank 0's"))
    fail_msg("run with two params files: exit %d\n%s", rc, out);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_dp_cli_artifact_keeps_dp),
      cmocka_unit_test(test_dp_cli_rank_count_errors),
      cmocka_unit_test(test_dp_cli_ranks_that_disagree_stop),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
