/* test_random.c - the counter-based draws (ir/random.c, DESIGN.md §2
 * Randomness): Philox-4x32-10 against the published known-answer vectors,
 * the uniform and normal draws against their moments (bounds of 5
 * standard deviations of the estimate), and the counter's contract: the
 * draws of a sample depend on its index in the window, not in the
 * micro-batch, and change with the seed, the step and the op's key. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/runtime.h"
#include "testutil.h"

/* Random123's kat_vectors for philox4x32 with 10 rounds (Salmon et al., SC 2011). */
static void test_philox_known_answers(void **state) {
  (void)state;
  static const struct {
    uint32_t ctr[4], key[2], out[4];
  } kat[] = {
      {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
      {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
       {0xffffffff, 0xffffffff},
       {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
      {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
       {0xa4093822, 0x299f31d0},
       {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
  };
  for (size_t i = 0; i < sizeof kat / sizeof kat[0]; i++) {
    uint32_t out[4];
    ir_philox4x32_10(kat[i].ctr, kat[i].key, out);
    for (int k = 0; k < 4; k++)
      if (out[k] != kat[i].out[k]) fail_msg("vector %zu word %d: got %08x, want %08x", i, k, out[k], kat[i].out[k]);
  }
}

/* A function `random %state {dist, key, batched} : dt[d0, d1]` run on the
 * interpreter with the given rng.state words; its draws (malloc'd). */
static double *draw(const char *dist, IrDType dt, int64_t d0, int64_t d1, bool batched, int64_t key,
                    const uint32_t words[IR_RNG_WORDS]) {
  IrFunc *f = ir_func_new("draws");
  char err[512];
  IrOp *s = ir_build(f, IR_OP_RNG_STATE, NULL, 0, NULL, 0, NULL, (IrLoc){0}, err, sizeof err);
  if (!s) fail_msg("rng.state: %s", err);
  IrType t = {.dtype = dt, .shape = {.rank = 2, .dim = {d0, d1}}};
  IrAttr at[3] = {ir_attr_str("dist", dist), ir_attr_int("key", key), ir_attr_bool("batched", batched)};
  IrOp *r = ir_build(f, IR_OP_RANDOM, &s->result, 1, at, 3, &t, (IrLoc){0}, err, sizeof err);
  if (!r) fail_msg("random: %s", err);
  InterpState st = {0};
  memcpy(st.rng, words, sizeof st.rng);
  if (!interp_run(&st, f, NULL, NULL, INTERP_STEP, NULL, err, sizeof err)) fail_msg("interp_run: %s", err);
  int64_t n = d0 * d1;
  double *v = malloc(sizeof(double) * (size_t)n);
  memcpy(v, st.val[r->result->id], sizeof(double) * (size_t)n);
  interp_free(&st);
  ir_func_free(f);
  return v;
}

enum { NS = 1000, NE = 1000 }; /* 10^6 draws */
static const uint32_t words0[IR_RNG_WORDS] = {1234, 0, 5, 0};

/* Uniform f32: in [0, 1), multiples of 2^-24; mean 1/2 and variance 1/12
 * within 5 sigma of the estimates (sigma 2.9e-4 and 7.5e-5 at 10^6). */
static void test_random_uniform_moments(void **state) {
  (void)state;
  int64_t n = (int64_t)NS * NE;
  double *u = draw("uniform", IR_DT_F32, NS, NE, true, 42, words0);
  double sum = 0, sq = 0;
  for (int64_t i = 0; i < n; i++) {
    if (!(u[i] >= 0 && u[i] < 1)) fail_msg("draw %lld = %g is outside [0, 1)", (long long)i, u[i]);
    if (ldexp(u[i], 24) != floor(ldexp(u[i], 24))) fail_msg("draw %lld = %.17g is not a multiple of 2^-24", (long long)i, u[i]);
    sum += u[i];
  }
  double mean = sum / (double)n;
  for (int64_t i = 0; i < n; i++) sq += (u[i] - 0.5) * (u[i] - 0.5);
  double var = sq / (double)n;
  double smean = sqrt(1.0 / 12.0 / (double)n), svar = sqrt((1.0 / 80.0 - 1.0 / 144.0) / (double)n);
  printf("uniform: mean %.6f (sigma %.2g), variance %.6f (sigma %.2g)\n", mean, smean, var, svar);
  assert_true(fabs(mean - 0.5) < 5 * smean);
  assert_true(fabs(var - 1.0 / 12.0) < 5 * svar);
  free(u);
}

/* Normal: mean 0, variance 1 and P(|z| < 1) = 0.682689 within 5 sigma
 * (sigma 1e-3, 1.4e-3 and 4.7e-4 at 10^6), in f32 and f64. */
static void test_random_normal_moments(void **state) {
  (void)state;
  int64_t n = (int64_t)NS * NE;
  IrDType dts[2] = {IR_DT_F32, IR_DT_F64};
  for (int k = 0; k < 2; k++) {
    double *z = draw("normal", dts[k], NS, NE, false, 43, words0);
    double sum = 0, sq = 0, in1 = 0;
    for (int64_t i = 0; i < n; i++) {
      if (!isfinite(z[i])) fail_msg("draw %lld is %g", (long long)i, z[i]);
      sum += z[i];
      sq += z[i] * z[i];
      in1 += fabs(z[i]) < 1;
    }
    double mean = sum / (double)n, var = sq / (double)n - mean * mean, p1 = in1 / (double)n;
    double p = erf(1.0 / sqrt(2.0));
    printf("normal %s: mean %.5f, variance %.5f, P(|z|<1) %.5f (want %.5f)\n", ir_dtype_name(dts[k]), mean, var, p1, p);
    assert_true(fabs(mean) < 5 / sqrt((double)n));
    assert_true(fabs(var - 1) < 5 * sqrt(2.0 / (double)n));
    assert_true(fabs(p1 - p) < 5 * sqrt(p * (1 - p) / (double)n));
    free(z);
  }
}

/* The window: micro-batches of 2 samples starting at samples 0, 2 and 4
 * draw the rows of one batch of 6; a draw that is not batched is the same
 * in every micro-batch; the seed (both halves), the step and the key each
 * change every draw. */
static void test_random_counter_is_the_window_sample(void **state) {
  (void)state;
  double *whole = draw("uniform", IR_DT_F32, 6, 50, true, 7, words0);
  for (int k = 0; k < 3; k++) {
    uint32_t w[IR_RNG_WORDS] = {words0[0], words0[1], words0[2], (uint32_t)(2 * k)};
    double *part = draw("uniform", IR_DT_F32, 2, 50, true, 7, w);
    assert_memory_equal(part, whole + 2 * k * 50, sizeof(double) * 100);
    double *flat = draw("uniform", IR_DT_F32, 2, 50, false, 7, w);
    double *flat0 = draw("uniform", IR_DT_F32, 2, 50, false, 7, words0);
    assert_memory_equal(flat, flat0, sizeof(double) * 100);
    free(part);
    free(flat);
    free(flat0);
  }
  const uint32_t other[4][IR_RNG_WORDS] = {{1235, 0, 5, 0}, {1234, 1, 5, 0}, {1234, 0, 6, 0}, {1234, 0, 5, 0}};
  for (int c = 0; c < 4; c++) {
    double *d = draw("uniform", IR_DT_F32, 6, 50, true, c == 3 ? 8 : 7, other[c]);
    int same = 0;
    for (int i = 0; i < 300; i++) same += d[i] == whole[i];
    if (same > 2) fail_msg("change %d: %d of 300 draws unchanged", c, same);
    free(d);
  }
  free(whole);
}

/* The key of a location: distinct for each occurrence and location. */
static void test_random_key_of_location(void **state) {
  (void)state;
  assert_int_equal(ir_random_key(3, 7, 0), (3u << 16) | 7u);
  assert_int_not_equal(ir_random_key(3, 7, 1), ir_random_key(3, 7, 0));
  assert_int_not_equal(ir_random_key(3, 7, 1), ir_random_key(3, 8, 0));
  assert_int_not_equal(ir_random_key(4, 7, 0), ir_random_key(3, 7, 0));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_philox_known_answers),
      cmocka_unit_test(test_random_uniform_moments),
      cmocka_unit_test(test_random_normal_moments),
      cmocka_unit_test(test_random_counter_is_the_window_sample),
      cmocka_unit_test(test_random_key_of_location),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
