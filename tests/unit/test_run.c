/* test_run.c - `gradc run` and `gradc compile -o` end to end, through the
 * binary: both targets agree, artifacts run without recompiling and refuse
 * conflicting flags, and out-of-range indices are errors on every target
 * (never a silent wrong result). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/runtime.h"
#include "testutil.h"

static char tmpdir[] = "/tmp/gradc-run-test-XXXXXX";

static const char *model =
    "model tiny {\n"
    "  batch B = 8\n"
    "  dim V = 11\n"
    "  dim D = 4\n"
    "  input tok : i32[B]\n"
    "  input y : i32[B]\n"
    "  param E : f32[V, D] init normal(0, 1)\n"
    "  param W : f32[D, 3] init normal(0, 1)\n"
    "  loss ce = cross_entropy(embedding(tok, E) @ W, y)\n"
    "  loss l2 = 0.01 * sum(W * W)\n"
    "}\n";

static int setup(void **state) {
  (void)state;
  assert_non_null(mkdtemp(tmpdir));
  char path[256];
  snprintf(path, sizeof path, "%s/tiny.gdl", tmpdir);
  FILE *f = fopen(path, "w");
  fputs(model, f);
  fclose(f);
  char out[4096];
  assert_int_equal(tu_sh(out, sizeof out, "%s init %s/tiny.gdl -o %s/p.st --seed 3", GRADC_BINARY, tmpdir, tmpdir), 0);
  assert_int_equal(
      tu_sh(out, sizeof out, "%s data random %s/tiny.gdl -o %s/i.st --seed 4", GRADC_BINARY, tmpdir, tmpdir), 0);
  return 0;
}

static int teardown(void **state) {
  (void)state;
  tu_rm_rf(tmpdir);
  return 0;
}

static double loss_of(const char *text, const char *name) {
  char key[64];
  snprintf(key, sizeof key, "loss %s ", name);
  const char *p = strstr(text, key);
  if (!p) fail_msg("no '%s' line in:\n%s", key, text);
  return strtod(p + strlen(key), NULL);
}

static void test_run_targets_and_artifact_agree(void **state) {
  (void)state;
  char ref[4096], cpu[4096], art[4096];
  assert_int_equal(tu_sh(ref, sizeof ref, "%s run %s/tiny.gdl --gas 2 --target ref --params %s/p.st --inputs %s/i.st",
                         GRADC_BINARY, tmpdir, tmpdir, tmpdir),
                   0);
  assert_int_equal(tu_sh(cpu, sizeof cpu, "%s run %s/tiny.gdl --gas 2 --params %s/p.st --inputs %s/i.st", GRADC_BINARY,
                         tmpdir, tmpdir, tmpdir),
                   0);
  char out[4096];
  assert_int_equal(
      tu_sh(out, sizeof out, "%s compile %s/tiny.gdl --gas 2 -o %s/tiny.gca", GRADC_BINARY, tmpdir, tmpdir), 0);
  assert_int_equal(tu_sh(art, sizeof art, "%s run %s/tiny.gca --params %s/p.st --inputs %s/i.st", GRADC_BINARY, tmpdir,
                         tmpdir, tmpdir),
                   0);
  const char *names[] = {"ce", "l2", "total"};
  for (int i = 0; i < 3; i++) {
    double r = loss_of(ref, names[i]), c = loss_of(cpu, names[i]), a = loss_of(art, names[i]);
    assert_true(fabs(r - c) <= 1e-5 * fabs(r));
    assert_true(a == c); /* the artifact runs the same compiled step */
  }
  /* An artifact fixes K, sizes and target. */
  assert_int_equal(tu_sh(out, sizeof out, "%s run %s/tiny.gca --gas 4 --params %s/p.st --inputs %s/i.st", GRADC_BINARY,
                         tmpdir, tmpdir, tmpdir),
                   1);
  assert_non_null(strstr(out, "tiny.gca: it was built with --gas 2"));
  assert_int_equal(tu_sh(out, sizeof out, "%s run %s/tiny.gca -D V=12 --params %s/p.st --inputs %s/i.st", GRADC_BINARY,
                         tmpdir, tmpdir, tmpdir),
                   1);
  assert_non_null(strstr(out, "its sizes are fixed"));
  /* A corrupted artifact is rejected, not run. */
  assert_int_equal(tu_sh(out, sizeof out,
                         "printf 'XXXX' | dd of=%s/tiny.gca bs=1 seek=200 conv=notrunc 2>/dev/null; "
                         "%s run %s/tiny.gca --params %s/p.st --inputs %s/i.st",
                         tmpdir, GRADC_BINARY, tmpdir, tmpdir, tmpdir),
                   1);
  assert_non_null(strstr(out, "tiny.gca"));
}

static void test_run_rejects_out_of_range_indices_on_every_target(void **state) {
  (void)state;
  /* Rewrite the inputs with one embedding index and one target out of range. */
  char path[256], err[512];
  StFile in;
  snprintf(path, sizeof path, "%s/i.st", tmpdir);
  assert_true(st_read(path, &in, err, sizeof err));
  StFile bad_tok, bad_y;
  st_init(&bad_tok);
  st_init(&bad_y);
  for (int i = 0; i < in.n; i++) {
    StTensor *t = &in.t[i];
    int32_t v[8];
    memcpy(v, t->data, sizeof v);
    int32_t tv[8], yv[8];
    memcpy(tv, v, sizeof v);
    memcpy(yv, v, sizeof v);
    if (strcmp(t->name, "tok") == 0) tv[5] = 11;
    if (strcmp(t->name, "y") == 0) yv[2] = -1;
    st_add(&bad_tok, t->name, t->dtype, t->rank, t->shape, tv);
    st_add(&bad_y, t->name, t->dtype, t->rank, t->shape, yv);
  }
  snprintf(path, sizeof path, "%s/bad_tok.st", tmpdir);
  assert_true(st_write(path, &bad_tok, err, sizeof err));
  snprintf(path, sizeof path, "%s/bad_y.st", tmpdir);
  assert_true(st_write(path, &bad_y, err, sizeof err));
  /* At --gas 1 the CPU target checks the bound tensors itself (its window
   * sums come from the step): the same messages, elements numbered in the
   * micro-batch (sample 5 is element 1 of the second of two). */
  const char *targets[] = {"cpu", "ref"};
  for (int t = 0; t < 2; t++)
    for (int gas = 1; gas <= 2; gas++) {
      char out[4096], want[64];
      assert_int_equal(
          tu_sh(out, sizeof out, "%s run %s/tiny.gdl --gas %d --target %s --params %s/p.st --inputs %s/bad_tok.st",
                GRADC_BINARY, tmpdir, gas, targets[t], tmpdir, tmpdir),
          1);
      snprintf(want, sizeof want, "index 11 (element %d) out of range [0, 11)", gas == 1 ? 5 : 1);
      if (!strstr(out, want)) fail_msg("%s --gas %d: no '%s' in:\n%s", targets[t], gas, want, out);
      assert_null(strstr(out, "loss "));
      assert_int_equal(
          tu_sh(out, sizeof out, "%s run %s/tiny.gdl --gas %d --target %s --params %s/p.st --inputs %s/bad_y.st",
                GRADC_BINARY, tmpdir, gas, targets[t], tmpdir, tmpdir),
          1);
      if (!strstr(out, "target -1 (element 2) out of range [0, 3)"))
        fail_msg("%s --gas %d: no target error in:\n%s", targets[t], gas, out);
    }
  st_free(&in);
  st_free(&bad_tok);
  st_free(&bad_y);
}

/* tests/models/v2_select.gdl (language v2's math, constructors, gather,
 * index_select, argmax) through the binary: at --gas 1 and 2 the CPU back
 * end gives the interpreter's losses and gradients; a gather index out of
 * range is an error naming the op, on both targets, before any loss. */
static void test_run_v2_selection_targets_agree(void **state) {
  (void)state;
  const char *m = tu_path("tests/models/v2_select.gdl");
  char out[8192], path[256], err[512];
  assert_int_equal(tu_sh(out, sizeof out, "%s init %s -o %s/v2p.st --seed 5", GRADC_BINARY, m, tmpdir), 0);
  assert_int_equal(tu_sh(out, sizeof out, "%s data random %s -o %s/v2i.st --seed 6", GRADC_BINARY, m, tmpdir), 0);
  for (int k = 1; k <= 2; k++) {
    char ref[4096], cpu[4096];
    StFile gr, gc;
    assert_int_equal(tu_sh(ref, sizeof ref, "%s run %s --gas %d --target ref --params %s/v2p.st --inputs %s/v2i.st "
                           "--grads-out %s/gr.st", GRADC_BINARY, m, k, tmpdir, tmpdir, tmpdir), 0);
    assert_int_equal(tu_sh(cpu, sizeof cpu, "%s run %s --gas %d --target cpu --params %s/v2p.st --inputs %s/v2i.st "
                           "--grads-out %s/gc.st", GRADC_BINARY, m, k, tmpdir, tmpdir, tmpdir), 0);
    const char *names[] = {"sel", "l2", "total"};
    for (int i = 0; i < 3; i++) {
      double r = loss_of(ref, names[i]), c = loss_of(cpu, names[i]);
      if (!(fabs(r - c) <= 1e-5 * fabs(r))) fail_msg("K=%d loss %s: cpu %.9g, ref %.9g", k, names[i], c, r);
    }
    snprintf(path, sizeof path, "%s/gr.st", tmpdir);
    assert_true(st_read(path, &gr, err, sizeof err));
    snprintf(path, sizeof path, "%s/gc.st", tmpdir);
    assert_true(st_read(path, &gc, err, sizeof err));
    assert_int_equal(gr.n, gc.n);
    double worst = 0;
    for (int i = 0; i < gr.n; i++) {
      assert_string_equal(gr.t[i].name, gc.t[i].name);
      const float *a = gr.t[i].data, *b = gc.t[i].data;
      size_t n = gr.t[i].nbytes / sizeof(float);
      double scale = 0;
      for (size_t j = 0; j < n; j++) scale = fmax(scale, fabs(a[j]));
      for (size_t j = 0; j < n; j++) worst = fmax(worst, fabs(a[j] - b[j]) / fmax(scale, 1e-30));
    }
    print_message("v2_select --gas %d: cpu against ref, worst gradient error %.3g of the largest\n", k, worst);
    assert_true(worst < 1e-5);
    st_free(&gr);
    st_free(&gc);
  }
  /* One pick index out of range [0, D = 6). */
  StFile in, bad;
  snprintf(path, sizeof path, "%s/v2i.st", tmpdir);
  assert_true(st_read(path, &in, err, sizeof err));
  st_init(&bad);
  for (int i = 0; i < in.n; i++) {
    StTensor *t = &in.t[i];
    if (strcmp(t->name, "pick") == 0) ((int32_t *)t->data)[4] = 6;
    st_add(&bad, t->name, t->dtype, t->rank, t->shape, t->data);
  }
  snprintf(path, sizeof path, "%s/v2bad.st", tmpdir);
  assert_true(st_write(path, &bad, err, sizeof err));
  const char *targets[] = {"cpu", "ref"};
  for (int t = 0; t < 2; t++) {
    assert_int_equal(tu_sh(out, sizeof out, "%s run %s --target %s --params %s/v2p.st --inputs %s/v2bad.st",
                           GRADC_BINARY, m, targets[t], tmpdir, tmpdir),
                     1);
    assert_non_null(strstr(out, "gather at "));
    assert_non_null(strstr(out, "v2_select.gdl:20:7: index 6 (element 4) out of range [0, 6)"));
    assert_null(strstr(out, "loss "));
  }
  st_free(&in);
  st_free(&bad);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_run_targets_and_artifact_agree),
      cmocka_unit_test(test_run_rejects_out_of_range_indices_on_every_target),
      cmocka_unit_test(test_run_v2_selection_targets_agree),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
