/* test_mixed.c - mixed precision (--precision bf16|f16, docs/DECISIONS.md
 * "Mixed precision").
 *
 * Each check compares against something computed independently: the bf16
 * and f16 programs on the CPU against the reference interpreter running
 * the same autocast program (the same roundings, the GEMM in double), and
 * both against the f32 interpreter within the low type's tolerance;
 * training runs of bf16 and f16 against the f32 run of the same model,
 * data and seed; the f16 loss scale's overflow handling against the params
 * before the step, bit for bit. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gradc.h"
#include "test_dp.h"
#include "testutil.h"

static void check_api(gradc_status st, const char *what) {
  if (st != GRADC_OK) fail_msg("%s: %s", what, gradc_last_error());
}

static gradc_program *compile(const char *model, const char *target, const char *precision, int gas,
                              const char *const *names, const int64_t *values, int ndefs) {
  gradc_compile_options o;
  gradc_compile_options_init(&o);
  o.target = target;
  o.precision = precision;
  o.gas = gas;
  o.threads = 2;
  o.def_names = names;
  o.def_values = values;
  o.ndefs = ndefs;
  gradc_program *p;
  char what[256];
  snprintf(what, sizeof what, "compile %s for %s at %s", model, target, precision ? precision : "f32");
  check_api(gradc_program_compile_file(tu_path(model), &o, &p), what);
  return p;
}

static uint64_t lcg(uint64_t *s) {
  *s = *s * 6364136223846793005ull + 1442695040888963407ull;
  return *s >> 33;
}
static float unit(uint64_t *s) { return (float)((double)lcg(s) / 2147483648.0) * 2.0f - 1.0f; }

/* mlp's window: x uniform in [-1, 1), y the argmax of x's first 10
 * features (something to learn). */
static void mlp_inputs(gradc_session *s, uint64_t seed) {
  enum { B = 64, D = 784 };
  static float x[B * D];
  static int32_t y[B];
  for (int i = 0; i < B * D; i++) x[i] = unit(&seed);
  for (int b = 0; b < B; b++) {
    int best = 0;
    for (int j = 1; j < 10; j++)
      if (x[b * D + j] > x[b * D + best]) best = j;
    y[b] = best;
  }
  check_api(gradc_session_set_input(s, "x", GRADC_F32, x, B * D), "set x");
  check_api(gradc_session_set_input(s, "y", GRADC_I32, y, B), "set y");
}

/* tinygpt's window: random tokens, each target the next token of a fixed
 * permutation of the vocabulary (learnable in a few dozen steps). */
static void gpt_inputs(gradc_session *s, uint64_t seed) {
  enum { B = 8, T = 32, V = 96 };
  static int32_t idx[B * T], tgt[B * T];
  for (int i = 0; i < B * T; i++) {
    idx[i] = (int32_t)(lcg(&seed) % V);
    tgt[i] = (idx[i] * 7 + 3) % V;
  }
  check_api(gradc_session_set_input(s, "idx", GRADC_I32, idx, B * T), "set idx");
  check_api(gradc_session_set_input(s, "targets", GRADC_I32, tgt, B * T), "set targets");
}

/* lenet's window: images uniform in [-1, 1), labels from the sign of
 * their corners' sum. */
static void lenet_inputs(gradc_session *s, uint64_t seed) {
  enum { B = 8, P = 16 * 16 };
  static float x[B * P];
  static int32_t y[B];
  for (int i = 0; i < B * P; i++) x[i] = unit(&seed);
  for (int b = 0; b < B; b++) y[b] = (int32_t)(lcg(&seed) % 10);
  check_api(gradc_session_set_input(s, "x", GRADC_F32, x, B * P), "set x");
  check_api(gradc_session_set_input(s, "y", GRADC_I32, y, B), "set y");
}

typedef void (*InputsFn)(gradc_session *, uint64_t);

/* Every gradient of one run as one vector (program order). */
static float *grads(const gradc_program *p, gradc_session *s, int64_t *n) {
  int64_t total = 0;
  for (int i = 0; i < gradc_program_num_params(p); i++) {
    gradc_tensor_info t;
    check_api(gradc_program_param_info(p, i, &t), "param info");
    int64_t k = 1;
    for (int d = 0; d < t.rank; d++) k *= t.shape[d];
    total += k;
  }
  float *g = malloc((size_t)total * sizeof *g);
  int64_t at = 0;
  for (int i = 0; i < gradc_program_num_params(p); i++) {
    gradc_tensor_info t;
    check_api(gradc_program_param_info(p, i, &t), "param info");
    int64_t k = 1;
    for (int d = 0; d < t.rank; d++) k *= t.shape[d];
    check_api(gradc_session_get_grad(s, t.name, g + at, (size_t)k), "get grad");
    at += k;
  }
  *n = total;
  return g;
}

/* max |a - b| / max |b|, printing the first mismatch over tol. */
static double rel_err(const char *what, const float *a, const float *b, int64_t n, double tol) {
  double scale = 0, worst = 0;
  int64_t at = 0;
  for (int64_t i = 0; i < n; i++) scale = fmax(scale, fabs(b[i]));
  for (int64_t i = 0; i < n; i++) {
    double e = fabs((double)a[i] - b[i]);
    if (e > worst) worst = e, at = i;
  }
  double r = scale > 0 ? worst / scale : worst;
  if (r > tol) print_message("%s: element %lld: %.9g against %.9g (max |b| %.3g)\n", what, (long long)at, a[at], b[at], scale);
  return r;
}

typedef struct Run {
  gradc_program *p;
  gradc_session *s;
  double loss;
  float *g;
  int64_t n;
} Run;

static Run run_once(const char *model, const char *target, const char *precision, InputsFn inputs) {
  Run r = {compile(model, target, precision, 1, NULL, NULL, 0), NULL, 0, NULL, 0};
  check_api(gradc_session_new(r.p, &r.s), "session");
  check_api(gradc_session_init_params(r.s, 7), "init params");
  inputs(r.s, 11);
  check_api(gradc_session_run(r.s), "run");
  r.loss = gradc_session_loss_total(r.s);
  r.g = grads(r.p, r.s, &r.n);
  return r;
}

static void run_free(Run *r) {
  free(r->g);
  gradc_session_free(r->s);
  gradc_program_free(r->p);
}

/* The CPU's bf16 (f16) GEMMs against the interpreter running the same
 * program, and against f32: the loss and every gradient. */
static void compare_precision(const char *model, const char *precision, InputsFn inputs, double tol_same,
                              double tol_f32) {
  Run cpu = run_once(model, "cpu", precision, inputs);
  Run ref = run_once(model, "ref", precision, inputs);
  Run f32 = run_once(model, "ref", NULL, inputs);
  assert_int_equal(cpu.n, ref.n);
  char what[256];
  snprintf(what, sizeof what, "%s %s: cpu against ref", model, precision);
  double e_same = rel_err(what, cpu.g, ref.g, cpu.n, tol_same);
  snprintf(what, sizeof what, "%s %s: cpu against f32 ref", model, precision);
  double e_f32 = rel_err(what, cpu.g, f32.g, cpu.n, tol_f32);
  print_message("%s %s: loss cpu %.7g ref %.7g f32 %.7g; gradient error against ref %.3g, against f32 %.3g\n", model,
                precision, cpu.loss, ref.loss, f32.loss, e_same, e_f32);
  assert_true(fabs(cpu.loss - ref.loss) <= tol_same * fabs(ref.loss));
  assert_true(fabs(cpu.loss - f32.loss) <= tol_f32 * fabs(f32.loss));
  assert_true(e_same <= tol_same);
  assert_true(e_f32 <= tol_f32);
  run_free(&cpu);
  run_free(&ref);
  run_free(&f32);
}

/* ir.h's bit codecs (the executor's GEMM loops, params into an arena)
 * against ir_round_dtype, the interpreter's rounding: every f32 whose top
 * 16 bits and low bits take a spread of values, ties and the f16
 * overflow and subnormal edges among them. */
static void test_mixed_codecs_match_ir_round_dtype(void **state) {
  (void)state;
  uint64_t seed = 5;
  int64_t checked = 0;
  for (uint32_t hi = 0; hi < 0x10000; hi++) {
    uint32_t lows[6] = {0, 0x8000, 0x7fff, 0x8001, 0xffff, (uint32_t)(lcg(&seed) & 0xffff)};
    for (int k = 0; k < 6; k++) {
      float x = ir_bits_f32(hi << 16 | lows[k]);
      const IrDType dts[2] = {IR_DT_BF16, IR_DT_F16};
      for (int d = 0; d < 2; d++) {
        double want = ir_round_dtype(x, dts[d]);
        float got = d == 0 ? ir_bf16_to_f32(ir_f32_to_bf16(x)) : ir_f16_to_f32(ir_f32_to_f16(x));
        bool sign_differs = !signbit(got) != !signbit(want);
        if (isnan(want) ? !isnan(got) : (double)got != want || sign_differs)
          fail_msg("%s(%a = 0x%08x): %a, ir_round_dtype %a", d ? "f16" : "bf16", x, ir_f32_bits(x), got, want);
        checked++;
      }
    }
  }
  const float edges[] = {65504.0f, 65519.996f, 65520.0f, 0x1p-14f, 0x1p-24f, 0x1.8p-25f, 0x1p-25f, 0x1.0p-26f, -0.0f};
  for (size_t i = 0; i < sizeof edges / sizeof *edges; i++) {
    double want = ir_round_dtype(edges[i], IR_DT_F16);
    assert_true((double)ir_f16_to_f32(ir_f32_to_f16(edges[i])) == want);
  }
  print_message("%lld conversions agree with ir_round_dtype\n", (long long)checked);
}

/* bf16 has 8 significant bits (relative rounding 2^-9 = 0.2%), f16 11.
 * The same program on the CPU and the interpreter differs only where an
 * f32-accumulated product rounds to the other side of a bf16 (f16) tie
 * than the double one, a few units of the low type's last place; against
 * f32 every GEMM operand is rounded once more. */
static void test_mixed_bf16_mlp_matches_interpreter(void **state) {
  (void)state;
  compare_precision("examples/mlp.gdl", "bf16", mlp_inputs, 2e-2, 3e-2);
}

static void test_mixed_f16_mlp_matches_interpreter(void **state) {
  (void)state;
  compare_precision("examples/mlp.gdl", "f16", mlp_inputs, 4e-3, 1e-2);
}

static void test_mixed_bf16_tinygpt_matches_interpreter(void **state) {
  (void)state;
  compare_precision("examples/tinygpt.gdl", "bf16", gpt_inputs, 2e-2, 5e-2);
}

/* f16 through attention's heads: the GEMM operands autocast casts where
 * their movement starts (slices and permutes in f16). */
static void test_mixed_f16_tinygpt_matches_interpreter(void **state) {
  (void)state;
  compare_precision("examples/tinygpt.gdl", "f16", gpt_inputs, 4e-3, 1e-2);
}

/* Convolutions: autocast reaches the GEMMs conv2d lowers to (im2col's
 * matmul, and the backward's). */
static void test_mixed_bf16_lenet_matches_interpreter(void **state) {
  (void)state;
  compare_precision("examples/lenet.gdl", "bf16", lenet_inputs, 2e-2, 5e-2);
}

/* 50 AdamW steps at each precision from the same params and data: the
 * bf16 and f16 losses follow the f32 one. */
static void train(const char *model, const char *precision, InputsFn inputs, int steps, double *loss) {
  gradc_program *p = compile(model, "cpu", precision, 1, NULL, NULL, 0);
  gradc_session *s;
  check_api(gradc_session_new(p, &s), "session");
  check_api(gradc_session_init_params(s, 3), "init params");
  gradc_optimizer_options o;
  gradc_optimizer_options_init(&o, GRADC_ADAMW);
  o.lr = 3e-3;
  check_api(gradc_session_set_optimizer(s, &o), "optimizer");
  for (int k = 0; k < steps; k++) {
    inputs(s, 100 + (uint64_t)k);
    check_api(gradc_session_run(s), "run");
    loss[k] = gradc_session_loss_total(s);
    check_api(gradc_session_step(s), "step");
  }
  gradc_session_free(s);
  gradc_program_free(p);
}

static void tracks(const char *model, InputsFn inputs, double tol) {
  enum { STEPS = 50 };
  double f32[STEPS], low[STEPS];
  train(model, NULL, inputs, STEPS, f32);
  const char *precisions[2] = {"bf16", "f16"};
  for (int q = 0; q < 2; q++) {
    train(model, precisions[q], inputs, STEPS, low);
    double worst = 0;
    for (int k = 0; k < STEPS; k++) worst = fmax(worst, fabs(low[k] - f32[k]) / fabs(f32[k]));
    print_message("%s %s: loss %.5g -> %.5g (f32 %.5g -> %.5g), largest relative gap %.3g\n", model, precisions[q],
                  low[0], low[STEPS - 1], f32[0], f32[STEPS - 1], worst);
    assert_true(f32[STEPS - 1] < 0.9 * f32[0]); /* it learns at all */
    assert_true(worst <= tol);
  }
}

static void test_mixed_train_mlp_tracks_f32(void **state) {
  (void)state;
  tracks("examples/mlp.gdl", mlp_inputs, 0.05);
}

static void test_mixed_train_tinygpt_tracks_f32(void **state) {
  (void)state;
  tracks("examples/tinygpt.gdl", gpt_inputs, 0.05);
}

/* f16 loss scaling: an overflow injected into step 3's window (the
 * GRADC_TEST_INF_STEP hook) skips exactly that step: the params after it
 * are the params before it, bit for bit, S halves, the step is counted;
 * the steps around it train as usual, and after `window` clean steps S
 * doubles. */
static void test_mixed_f16_overflow_skips_the_step(void **state) {
  (void)state;
  gradc_program *p = compile("examples/mlp.gdl", "cpu", "f16", 2, NULL, NULL, 0);
  gradc_session *s;
  check_api(gradc_session_new(p, &s), "session");
  check_api(gradc_session_init_params(s, 3), "init params");
  gradc_optimizer_options o;
  gradc_optimizer_options_init(&o, GRADC_ADAMW);
  o.lr = 1e-3;
  check_api(gradc_session_set_optimizer(s, &o), "optimizer");
  gradc_loss_scale_options ls;
  gradc_loss_scale_options_init(&ls);
  assert_true(ls.init_scale == 65536.0);
  ls.window = 4;
  check_api(gradc_session_set_loss_scaling(s, &ls), "loss scaling");
  enum { N = 784 * 256 + 256 + 256 * 10 };
  static float before[N], after[N];
  const char *names[3] = {"W1", "b1", "W2"};
  const size_t sizes[3] = {784 * 256, 256, 256 * 10};
  setenv("GRADC_TEST_INF_STEP", "3", 1);
  double scale_before = 0;
  for (int k = 0; k < 9; k++) {
    mlp_inputs(s, 100 + (uint64_t)k);
    check_api(gradc_session_run(s), "run");
    assert_true(isfinite(gradc_session_loss_total(s))); /* the losses are unscaled and finite all along */
    assert_int_equal(gradc_session_overflow(s), k == 3);
    size_t at = 0;
    for (int i = 0; i < 3; i++, at += sizes[i - 1])
      check_api(gradc_session_get_param(s, names[i], before + at, sizes[i]), "get param");
    scale_before = gradc_session_loss_scale(s);
    check_api(gradc_session_step(s), "step");
    at = 0;
    for (int i = 0; i < 3; i++, at += sizes[i - 1])
      check_api(gradc_session_get_param(s, names[i], after + at, sizes[i]), "get param");
    bool same = memcmp(before, after, sizeof before) == 0;
    double scale = gradc_session_loss_scale(s);
    print_message("step %d: overflow %d, params %s, S %g -> %g, skipped %lld\n", k, k == 3,
                  same ? "unchanged" : "updated", scale_before, scale, (long long)gradc_session_skipped_steps(s));
    assert_int_equal(same, k == 3);
    assert_int_equal(gradc_session_step_count(s), k + 1);
    assert_int_equal(gradc_session_skipped_steps(s), k >= 3 ? 1 : 0);
    /* 65536 for steps 0-2; the overflow halves it; 4 clean steps (4-7) double it. */
    double want = k < 3 ? 65536.0 : k < 7 ? 32768.0 : 65536.0;
    assert_true(scale == want);
  }
  unsetenv("GRADC_TEST_INF_STEP");
  /* bf16 uses no scale, and refuses loss-scaling options. */
  gradc_program *pb = compile("examples/mlp.gdl", "cpu", "bf16", 1, NULL, NULL, 0);
  gradc_session *sb;
  check_api(gradc_session_new(pb, &sb), "session");
  assert_true(gradc_session_loss_scale(sb) == 1.0);
  assert_int_equal(gradc_session_set_loss_scaling(sb, &ls), GRADC_ERR_USER);
  gradc_session_free(sb);
  gradc_program_free(pb);
  gradc_session_free(s);
  gradc_program_free(p);
}

/* The same on 2 data-parallel ranks through `gradc train`, with and
 * without ZeRO-1: an overflow on rank 1 alone (after the gradients were
 * reduced; with --zero1 in rank 1's slice or not) skips the step on both,
 * and the run ends with the params, scale and log of a one-process run
 * that overflowed at the same step. */
static void test_mixed_f16_overflow_on_one_rank_skips_on_every_rank(void **state) {
  (void)state;
  if (!dp_have_mpirun()) return;
  char dir[] = "/tmp/gradc-mixed-XXXXXX";
  assert_non_null(mkdtemp(dir));
  tu_gradc("data random %s -D D=24 -D H=12 -D B=48 -o %s/data.st --seed 31", tu_path("examples/mlp.gdl"), dir);
  char args[2048], one[4096], two[4096], err1[16384], err2[16384];
  snprintf(args, sizeof args,
           "train %s -D D=24 -D H=12 -D B=16 --gas 2 --data %s/data.st --steps 7 --seed 3 --threads 1 "
           "--precision f16 --scale-window 2 --print-every 1",
           tu_path("examples/mlp.gdl"), dir);
  if (tu_sh_err(one, sizeof one, err1, sizeof err1, "GRADC_TEST_INF_STEP=3 %s %s --params-out %s/p1.st --log %s/l1.csv",
                GRADC_BINARY, args, dir, dir) != 0)
    fail_msg("one process: %s", err1);
  assert_int_equal(dp_count(err1, "1 skipped for an f16 overflow"), 1);
  const char *modes[2] = {"", " --zero1"};
  for (int m = 0; m < 2; m++) {
    if (tu_sh_err(two, sizeof two, err2, sizeof err2,
                  "GRADC_TEST_INF_STEP=3:1 " MPIRUN " -np 2 %s %s --dp 2%s --params-out %s/p2-%d.st --log %s/l2-%d.csv",
                  GRADC_BINARY, args, modes[m], dir, m, dir, m) != 0)
      fail_msg("two ranks%s: %s%s", modes[m], two, err2);
    assert_int_equal(dp_count(err2, "1 skipped for an f16 overflow"), 1);
    char p1[512], p2[512];
    snprintf(p1, sizeof p1, "%s/p1.st", dir);
    snprintf(p2, sizeof p2, "%s/p2-%d.st", dir, m);
    /* f16 rounds each rank's smaller micro-batch products on their own
     * (2^-11 relative), so the two runs agree to f16's precision, not
     * f32's; a step taken on one rank and not the other would move W1 by
     * about lr / |W1| (5e-2) apart. */
    double e = dp_file_rel(p2, p1, "f16 params, 2 ranks vs 1", 2e-3, NULL);
    print_message("f16 params, 2 ranks%s vs 1: relative error %.3g\n", modes[m], e);
  }
  /* Row 4 (the window of step 3) skipped with the scale halved, in every
   * log: 65536 doubles after steps 1-2, halves at 4, doubles again
   * after 5-6. */
  const char *logs[3] = {"l1.csv", "l2-0.csv", "l2-1.csv"};
  for (int k = 0; k < 3; k++) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, logs[k]);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    char line[1024];
    double want[8] = {0, 65536, 131072, 131072, 65536, 65536, 131072, 131072};
    int row = 0;
    while (fgets(line, sizeof line, f)) {
      if (row++ == 0) {
        assert_non_null(strstr(line, ",loss_scale,skipped"));
        continue;
      }
      char *last = strrchr(line, ','), *prev;
      *last = 0;
      prev = strrchr(line, ',');
      double scale = strtod(prev + 1, NULL);
      long skipped = strtol(last + 1, NULL, 10);
      assert_true(scale == want[row - 1]);
      assert_int_equal(skipped, row - 1 >= 4 ? 1 : 0);
    }
    fclose(f);
    assert_int_equal(row, 8);
  }
  tu_rm_rf(dir);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_mixed_codecs_match_ir_round_dtype),
      cmocka_unit_test(test_mixed_bf16_mlp_matches_interpreter),
      cmocka_unit_test(test_mixed_f16_mlp_matches_interpreter),
      cmocka_unit_test(test_mixed_bf16_tinygpt_matches_interpreter),
      cmocka_unit_test(test_mixed_f16_tinygpt_matches_interpreter),
      cmocka_unit_test(test_mixed_bf16_lenet_matches_interpreter),
      cmocka_unit_test(test_mixed_train_mlp_tracks_f32),
      cmocka_unit_test(test_mixed_train_tinygpt_tracks_f32),
      cmocka_unit_test(test_mixed_f16_overflow_skips_the_step),
      cmocka_unit_test(test_mixed_f16_overflow_on_one_rank_skips_on_every_rank),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
