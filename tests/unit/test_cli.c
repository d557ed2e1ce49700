/* test_cli.c - what the API exports for the command line (api/cli.h):
 * dtype names from the one table, tensor files with metadata, the pass
 * list, and telling artifacts from model source.  The commands themselves
 * are tested through the binary (test_run, test_train, test_bench, lit). */
#include <stdlib.h>
#include <string.h>

#include "api/cli.h"
#include "testutil.h"

static void test_cli_dtype_names_follow_the_table(void **state) {
  (void)state;
  assert_string_equal(cli_dtype_name(GRADC_BF16), "bf16");
  assert_string_equal(cli_dtype_file_name(GRADC_I64), "I64");
  assert_int_equal(cli_dtype_size(GRADC_F16), 2);
  assert_int_equal(cli_dtype_size(GRADC_F64), 8);
}

static void test_cli_tensors_round_trip_with_metadata(void **state) {
  (void)state;
  char dir[] = "/tmp/gradc-cli-test-XXXXXX";
  assert_non_null(mkdtemp(dir));
  char path[256], err[512];
  snprintf(path, sizeof path, "%s/t.safetensors", dir);
  cli_tensors *f = cli_tensors_new();
  const int32_t idx[6] = {1, 2, 3, 4, 5, 6};
  const int64_t shape[2] = {2, 3};
  cli_tensors_add(f, "idx", GRADC_I32, 2, shape, idx);
  cli_tensors_set_meta(f, "format", "gradc.text");
  assert_true(cli_tensors_write(f, path, err, sizeof err));
  cli_tensors_free(f);

  f = cli_tensors_new();
  assert_true(cli_tensors_read(f, path, err, sizeof err));
  assert_int_equal(cli_tensors_count(f), 1);
  assert_int_equal(cli_tensors_find(f, "idx"), 0);
  assert_int_equal(cli_tensors_find(f, "nope"), -1);
  cli_tensor t = cli_tensors_at(f, 0);
  assert_int_equal(t.dtype, GRADC_I32);
  assert_int_equal(t.rank, 2);
  assert_int_equal(t.shape[1], 3);
  assert_memory_equal(t.data, idx, sizeof idx);
  assert_string_equal(cli_tensors_meta(f, "format"), "gradc.text");
  assert_null(cli_tensors_meta(f, "vocab"));
  /* A missing file: the error names it. */
  assert_false(cli_tensors_read(f, "/nonexistent/x.safetensors", err, sizeof err));
  assert_non_null(strstr(err, "/nonexistent/x.safetensors"));
  cli_tensors_free(f);
  tu_rm_rf(dir);
}

static void test_cli_passes_and_artifacts(void **state) {
  (void)state;
  assert_true(cli_pass_count() > 5);
  for (int i = 0; i < cli_pass_count(); i++) {
    assert_true(cli_pass_exists(cli_pass_name(i)));
    assert_non_null(cli_pass_what(i));
  }
  assert_true(cli_pass_exists("cse"));
  assert_false(cli_pass_exists("no-such-pass"));
  assert_null(cli_pass_name(cli_pass_count()));
  assert_false(cli_is_artifact(tu_path("examples/mlp.gdl")));
  assert_false(cli_is_artifact("/nonexistent.gca"));
  assert_false(cli_is_cuda_target("cpu"));
  assert_false(cli_is_cuda_target(NULL));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_cli_dtype_names_follow_the_table),
      cmocka_unit_test(test_cli_tensors_round_trip_with_metadata),
      cmocka_unit_test(test_cli_passes_and_artifacts),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
