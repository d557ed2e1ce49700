/* test_codegen.c - the LLVM CPU code generator against the reference
 * interpreter, kernel by kernel: what the op-case table (tests/ops/, which
 * runs every op on this back end) does not cover.  Models through the CPU
 * pipeline (fuse and memplan), hand-built fused groups, gradient buffers,
 * the accuracy of the f32 polynomials, object code and the cache.
 *
 * Each function is grouped into kernels, given storage and compiled, and
 * every kernel runs on its own (tests/ops/backends.c): its inputs written
 * into the arena from the interpreter's values, its outputs prefilled with
 * garbage (gradient buffers with known values, which the kernel must add
 * to), the kernel run over [0, iters) in two pieces, and every output
 * compared with the interpreter (f32: relative error below 1e-5, f64:
 * 1e-12, integers exactly; the error of an element is taken relative to
 * max(|want|, 1e-2 * the largest |want| of the tensor)).  A mismatch prints
 * the first bad elements and the largest error. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backends.h"
#include "codegen/codegen.h"
#include "passes/passes.h"
#include "runtime/runtime.h"
#include "irbuild.h"
#include "testutil.h"

#ifdef GRADC_HAVE_LLVM

/* Building functions: irbuild.h; running them: tests/ops/backends.h. */

static void run_passes(IrFunc *f, const char *const *names, int n) {
  char err[4096];
  if (!ot_passes(f, names, n, false, err, sizeof err)) fail_msg("%s", err);
}

/* Run every kernel of a fused and planned f against the interpreter. */
static OtStats check_kernels(IrFunc *f, OtInputs *in) {
  static char err[1 << 15];
  OtStats st = {0};
  if (!ot_cpu_check(f, in, f->name, &st, err, sizeof err)) fail_msg("%s", err);
  return st;
}

/* Hand-built functions: sinks for the values of interest, one kernel per
 * op or `fuse`, the trivial plan, the check. */
static OtStats check_built(IrFunc *f, bool fuse, uint64_t seed) {
  if (fuse) {
    static const char *const p[] = {"fuse"};
    run_passes(f, p, 1);
  } else {
    ot_one_kernel_per_op(f);
  }
  char err[512];
  if (!ot_verify(f, err, sizeof err)) fail_msg("verify: %s", err);
  ot_trivial_plan(f);
  OtInputs in = ot_inputs_random(f, seed);
  OtStats st = check_kernels(f, &in);
  ot_inputs_free(&in);
  return st;
}

/* A model through the CPU pipeline (fuse and memplan included). */
static OtStats check_model(const char *name, const char *text, uint64_t seed, void (*tweak)(IrFunc *, OtInputs *)) {
  Diag d;
  FeModel *m = tu_compile(name, text, 1, &d);
  if (!m) fail_msg("%s: %s", name, sb_str(&d.log));
  int n;
  const char *const *pipe = pass_pipeline_cpu(&n);
  run_passes(m->func, pipe, n);
  OtInputs in = ot_inputs_random(m->func, seed);
  if (tweak) tweak(m->func, &in);
  OtStats st = check_kernels(m->func, &in);
  ot_inputs_free(&in);
  fe_model_free(m);
  diag_free(&d);
  return st;
}

/* ------------------------------------------------------------------ */
/* The f32 polynomials                                                 */
/* ------------------------------------------------------------------ */

/* exp and tanh are inline polynomials in f32 (so loops vectorise): check
 * them at every scale against the correctly rounded values, within 2 ulp
 * (1 ulp of the subnormal spacing for tiny results). */
/* Unary f32 ops compiled with LLVM, one kernel each, applied to the n
 * values xs: out[k * n + i] is ops[k](xs[i]). */
static void eval_unary(const IrOpcode *ops, int nops, const float *xs, int n, double *out) {
  IrFunc *f = ir_func_new("acc");
  IrValue *x = input(f, "x", ty(IR_DT_F32, 1, n)), *y[8];
  assert_true(nops <= 8);
  for (int k = 0; k < nops; k++) sink(f, y[k] = un(f, ops[k], x));
  ot_one_kernel_per_op(f);
  ot_trivial_plan(f);
  char err[512];
  CgOptions o = {0};
  CgModule *m = cg_llvm_compile(f, &o, err, sizeof err);
  if (!m) fail_msg("%s", err);
  char *arena = aligned_alloc(64, (size_t)(f->arena_size + 63) / 64 * 64);
  for (int i = 0; i < n; i++) ot_put(arena, x, i, xs[i]);
  for (int g = 1; g <= nops; g++) {
    const CgKernel *k = cg_module_kernel(m, g);
    k->fn(arena, 0, k->iters, k->offs);
  }
  for (int k = 0; k < nops; k++)
    for (int i = 0; i < n; i++) out[k * n + i] = ot_get(arena, y[k], i);
  free(arena);
  cg_module_free(m);
  ir_func_free(f);
}

/* CgOptions.threads bounds the threads that compile: 24 kernels that
 * share no body (exp over 24 lengths) compile as one object on one
 * thread and as three on three; every kernel runs either way. */
static void test_codegen_threads_bound_the_compile(void **state) {
  (void)state;
  for (int threads = 1; threads <= 3; threads += 2) {
    IrFunc *f = ir_func_new("chunks");
    for (int k = 0; k < 24; k++) sink(f, un(f, IR_OP_EXP, input(f, "x", ty(IR_DT_F32, 1, 10 + k))));
    ot_one_kernel_per_op(f);
    ot_trivial_plan(f);
    char err[512];
    CgOptions o = {.threads = threads};
    CgModule *m = cg_llvm_compile(f, &o, err, sizeof err);
    if (!m) fail_msg("%s", err);
    assert_int_equal(cg_module_chunks(m), threads);
    for (int g = 1; g <= 24; g++) assert_non_null(cg_module_kernel(m, g));
    cg_module_free(m);
    ir_func_free(f);
  }
}

static void test_codegen_exp_tanh_accuracy(void **state) {
  enum { N = 4001 };
  static const IrOpcode ops[] = {IR_OP_EXP, IR_OP_TANH};
  float xs[N];
  for (int i = 0; i < N; i++) {
    xs[i] = -110.0f + 200.0f * (float)i / (N - 1); /* -110 .. 90, through the subnormal results */
    if (i % 5 == 1) xs[i] = ldexpf((float)(i % 97) - 48.0f, -(i % 40)); /* and small arguments */
  }
  static double got[2 * N];
  eval_unary(ops, 2, xs, N, got);
  for (int i = 0; i < N; i++) {
    double we = (double)(float)exp((double)xs[i]), wt = (double)(float)tanh((double)xs[i]);
    double ge = got[i], gt = got[N + i];
    double ue = fabs(we) < 1.2e-38 ? ldexp(1.0, -149) : fabs(we) * ldexp(1.0, -23);
    double ut = fabs(wt) < 1.2e-38 ? ldexp(1.0, -149) : fabs(wt) * ldexp(1.0, -23);
    if (!(fabs(ge - we) <= 2 * ue) && !(isinf(we) && ge == we))
      fail_msg("exp(%.9g) = %.9g, want %.9g", xs[i], ge, we);
    if (!(fabs(gt - wt) <= 2 * ut)) fail_msg("tanh(%.9g) = %.9g, want %.9g", xs[i], gt, wt);
  }
}

/* sigmoid, silu, gelu and gelu's derivative in f32 take e^-|x| from an
 * exp that flushes results under FLT_MIN to 0 (gen_exp_nonpos).  Against
 * the formulas in double, within 4 ulp of the rounded value times 1 + the
 * function's condition number |x f'(x) / f(x)| (what rounding the f32
 * argument alone costs: ~9 for gelu at -3.5), plus FLT_MIN (1 + |x|)^3
 * where the flush applies, plus 1e-7 absolute for the derivative (it
 * crosses zero near x = -0.75).  NaN stays NaN, and the infinities give
 * PyTorch's values (gelu(-inf) = 0.5 * -inf * (1 + tanh(-inf)) is NaN, and
 * so is the derivative at both infinities). */
static double sigmoid_ref(double x) { return x >= 0 ? 1.0 / (1.0 + exp(-x)) : exp(x) / (1.0 + exp(x)); }
static double silu_ref(double x) { return x * sigmoid_ref(x); }

/* gelu = 0.5 x (1 + tanh u) = x sigmoid(2u), u = c (x + a x^3): the second
 * form, as 1 + tanh u cancels to 0 in double too for x < ~ -5. */
static double gelu_u_ref(double x) { return 0.7978845608028654 * (x + 0.044715 * x * x * x); }
static double gelu_ref(double x) { return x * sigmoid_ref(2 * gelu_u_ref(x)); }

/* 0.5 (1 + t) + 0.5 x (1 - t^2) c (1 + 3 a x^2) with 1 + t = 2p, 1 - t = 2q */
static double gelu_grad_ref(double x) {
  double p = sigmoid_ref(2 * gelu_u_ref(x)), q = sigmoid_ref(-2 * gelu_u_ref(x));
  return p + 2 * x * p * q * 0.7978845608028654 * (1.0 + 3.0 * 0.044715 * x * x);
}

static void test_codegen_sigmoid_gelu_accuracy(void **state) {
  (void)state;
  enum { N = 4006 };
  static const IrOpcode ops[] = {IR_OP_SIGMOID, IR_OP_SILU, IR_OP_GELU, IR_OP_GELU_GRAD};
  float xs[N];
  for (int i = 0; i < N - 5; i++) {
    xs[i] = -110.0f + 200.0f * (float)i / (N - 6); /* through the flushed results */
    if (i % 5 == 1) xs[i] = ldexpf((float)(i % 97) - 48.0f, -(i % 40)); /* and small arguments */
  }
  const float special[] = {NAN, INFINITY, -INFINITY, -87.0f, -88.0f};
  for (int i = 0; i < 5; i++) xs[N - 5 + i] = special[i];
  static double got[4 * N];
  eval_unary(ops, 4, xs, N, got);
  double (*const ref[4])(double) = {sigmoid_ref, silu_ref, gelu_ref, gelu_grad_ref};
  for (int i = 0; i < N; i++) {
    double v = xs[i], want[4];
    for (int k = 0; k < 4; k++) want[k] = ref[k](v);
    if (isinf(v)) { /* as the formulas evaluate in PyTorch */
      want[1] = v > 0 ? INFINITY : NAN;
      want[2] = v > 0 ? INFINITY : NAN;
      want[3] = NAN; /* x (1 - t^2): inf * 0 */
    }
    for (int k = 0; k < 4; k++) {
      double g = got[k * N + i], w = (double)(float)want[k];
      if (isnan(w) || isinf(w)) {
        if (!(isnan(w) ? isnan(g) : g == w)) fail_msg("op %d (x = %.9g) = %.9g, want %.9g", k, v, g, w);
        continue;
      }
      double h = 1e-6, cond = w == 0 ? 0 : fabs((ref[k](v * (1 + h)) - ref[k](v * (1 - h))) / (2 * h * w));
      double flush = 1.18e-38 * pow(1 + fabs(v), 3); /* FLT_MIN times up to x^3 (gelu's derivative) */
      double tol = 4 * (1 + cond) * fabs(w) * ldexp(1.0, -23) + flush + (k == 3 ? 1e-7 : 0);
      if (!(fabs(g - w) <= tol)) fail_msg("op %d (x = %.9g) = %.9g, want %.9g", k, v, g, w);
    }
  }
}

/* ------------------------------------------------------------------ */
/* A hand-written softmax: reductions of reductions                    */
/* ------------------------------------------------------------------ */

/* A row max, broadcast back and subtracted, exp, a row sum, a divide: one
 * kernel per op and fused into one. */
static void softmax_by_hand(IrDType dt, bool fuse) {
  IrFunc *f = ir_func_new("red");
  IrValue *x = input(f, "x", ty(dt, 3, 3, 4, 45));
  int64_t last = 2;
  IrValue *m = reduce(f, IR_OP_MAX, x, &last, 1, true);
  IrValue *e = un(f, IR_OP_EXP, bin(f, IR_OP_SUB, x, m));
  sink(f, bin(f, IR_OP_DIV, e, reduce(f, IR_OP_SUM, e, &last, 1, true)));
  OtStats st = check_built(f, fuse, 21);
  assert_true(st.outputs >= 1);
  ir_func_free(f);
}

static void test_codegen_softmax_by_hand(void **state) { softmax_by_hand(IR_DT_F32, false); }
static void test_codegen_softmax_by_hand_f64(void **state) { softmax_by_hand(IR_DT_F64, false); }
static void test_codegen_softmax_by_hand_fused(void **state) { softmax_by_hand(IR_DT_F32, true); }

/* ------------------------------------------------------------------ */
/* Gradient buffers accumulate                                         */
/* ------------------------------------------------------------------ */

static void test_codegen_grad_buffers_accumulate(void **state) {
  IrFunc *f = ir_func_new("grads");
  IrValue *x = input(f, "x", ty(IR_DT_F32, 2, 6, 10));
  IrValue *W = param(f, "W", ty(IR_DT_F32, 2, 6, 10));
  IrValue *b = param(f, "b", ty(IR_DT_F32, 1, 10));
  (void)b;
  IrValue *V = param(f, "V", ty(IR_DT_F64, 2, 3, 4));
  IrValue *dW = bin(f, IR_OP_MUL, un(f, IR_OP_TANH, x), W); /* a row kernel */
  IrAttr g1 = ir_attr_str("name", "W");
  build(f, IR_OP_GRAD, &dW, 1, &g1, 1, NULL);
  int64_t a0 = 0;
  IrValue *db = reduce(f, IR_OP_SUM, x, &a0, 1, false); /* a loop nest */
  IrAttr g2 = ir_attr_str("name", "b");
  build(f, IR_OP_GRAD, &db, 1, &g2, 1, NULL);
  IrValue *dV = un1(f, IR_OP_PERMUTE, un1(f, IR_OP_PERMUTE, V, ir_attr_ints("perm", (int64_t[]){1, 0}, 2)),
                    ir_attr_ints("perm", (int64_t[]){1, 0}, 2));
  IrAttr g3 = ir_attr_str("name", "V");
  build(f, IR_OP_GRAD, &dV, 1, &g3, 1, NULL);
  OtStats st = check_built(f, true, 61);
  int grads = 0;
  for (int i = 0; i < f->nvalues; i++) grads += f->values[i]->storage == IR_STORE_GRAD;
  assert_int_equal(grads, 3);
  assert_true(st.outputs >= 3);
  ir_func_free(f);
}

/* ------------------------------------------------------------------ */
/* Fused groups from models (the CPU pipeline, memplan included)       */
/* ------------------------------------------------------------------ */

static void ignore_some_targets(IrFunc *f, OtInputs *in) {
  for (int i = 0; i < f->nargs; i++) {
    if (f->args[i]->type.dtype != IR_DT_I32 || !f->args[i]->name || strcmp(f->args[i]->name, "y") != 0) continue;
    int64_t n = ir_numel(&f->args[i]->type.shape);
    for (int64_t k = 0; k < n; k += 3) in->a[i][k] = -100;
  }
}

static void test_codegen_softmax_fwd_bwd(void **state) {
  const char *src = "model sm {\n"
                    "  batch B = 6\n  dim N = 29\n"
                    "  input x : f32[B, 3, N]\n  param w : f32[N]\n"
                    "  p = softmax(x * w, axis=-1)\n"
                    "  q = log_softmax(x + w, axis=-1)\n"
                    "  loss l = sum(p * p) + sum(q * w)\n"
                    "}\n";
  OtStats st = check_model("sm.gdl", src, 81, NULL);
  assert_true(st.kernels >= 2);
}

/* Rows with a NaN (first, inside, last), a +inf, only -inf, and zeros of
 * both signs as their maximum: softmax, log_softmax and cross_entropy
 * share a row maximum that ignores the sign of a zero (llvm_ops.c
 * gen_max_step) and must still give what the interpreter gives, NaN
 * rows included.  29 columns: a whole vector and a tail. */
static void special_rows(IrFunc *f, OtInputs *in) {
  for (int i = 0; i < f->nargs; i++) {
    if (!f->args[i]->name || strcmp(f->args[i]->name, "x") != 0) continue;
    const int64_t n = 29;
    double *x = in->a[i];
    x[0 * n + 0] = NAN;
    x[1 * n + 17] = NAN;
    x[2 * n + n - 1] = NAN;
    x[3 * n + 20] = INFINITY;
    for (int64_t j = 0; j < n; j++) x[4 * n + j] = -INFINITY;
    for (int64_t j = 0; j < n; j++) x[5 * n + j] = j % 3 ? -1.0 - (double)j : (j % 2 ? 0.0 : -0.0);
    x[6 * n + 3] = -0.0; /* a -0 maximum of an otherwise negative row */
    for (int64_t j = 0; j < n; j++)
      if (j != 3) x[6 * n + j] = -2.0 - (double)j;
  }
}

static void test_codegen_row_max_specials(void **state) {
  const char *src = "model sp {\n"
                    "  batch B = 8\n  dim N = 29\n"
                    "  input x : f32[B, N]\n  input y : i32[B]\n  param w : f32[N]\n"
                    "  p = softmax(x, axis=-1)\n"
                    "  q = log_softmax(x, axis=-1)\n"
                    "  loss l = sum(p * w) + sum(q * w)\n"
                    "  loss ce = cross_entropy(x, y)\n"
                    "}\n";
  OtStats st = check_model("sp.gdl", src, 91, special_rows);
  assert_true(st.kernels >= 2);
}

/* A causal softmax over rows of 512 or more computes its exponentials up
 * to the diagonal only (rounded up to whole vectors) and fills the rest:
 * T = 521 has rows whose loop stops short of the row (i < 512) and rows
 * that run to its end.  Shorter rows (T = 37) run the loop over the whole
 * row, the masked columns' exponentials 0. */
static void test_codegen_causal_softmax(void **state) {
  const char *src = "model cs {\n"
                    "  batch B = 3\n  dim T = 37\n"
                    "  input x : f32[B, 2, T, T]\n  param w : f32[T]\n"
                    "  p = softmax(causal_mask(x * 0.5), axis=-1)\n"
                    "  loss l = sum(p * w) + sum(p * p)\n"
                    "}\n";
  OtStats st = check_model("cs.gdl", src, 88, NULL);
  assert_true(st.kernels >= 2);
  const char *longrows = "model cs {\n"
                         "  batch B = 1\n  dim T = 521\n"
                         "  input x : f32[B, 1, T, T]\n  param w : f32[T]\n"
                         "  p = softmax(causal_mask(x * 0.5), axis=-1)\n"
                         "  loss l = sum(p * w) + sum(p * p)\n"
                         "}\n";
  st = check_model("cs.gdl", longrows, 90, NULL);
  assert_true(st.kernels >= 2);
}

/* A layer norm's centred input is recomputed by the backward kernel
 * (fuse), not stored, and gelu's pre-activation x @ W + b is stored: the
 * same results either way. */
static void test_codegen_recomputed_values(void **state) {
  const char *src = "model rc {\n"
                    "  batch B = 4\n  dim T = 32\n  dim C = 48\n  dim H = 64\n"
                    "  input x : f32[B, T, C]\n  param W : f32[C, H]\n  param b : f32[H]\n"
                    "  param g : f32[H] init ones\n  param V : f32[H, C]\n"
                    "  h = layer_norm(gelu(x @ W + b), g, b)\n"
                    "  loss l = sum((h @ V) * x)\n"
                    "}\n";
  OtStats st = check_model("rc.gdl", src, 89, NULL);
  assert_true(st.kernels >= 2);
}

static void test_codegen_layer_norm_fwd_bwd(void **state) {
  const char *src = "model ln {\n"
                    "  batch B = 4\n  dim C = 48\n"
                    "  input x : f32[B, 5, C]\n  param w : f32[C] init ones\n  param b : f32[C]\n"
                    "  param g : f32[C] init ones\n"
                    "  h = layer_norm(x, w, b)\n"
                    "  r = rms_norm(h * 2, g)\n"
                    "  loss l = sum(r * r * w) + sum(h * x)\n"
                    "}\n";
  OtStats st = check_model("ln.gdl", src, 82, NULL);
  assert_true(st.kernels >= 2);
}

static void test_codegen_cross_entropy_fwd_bwd(void **state) {
  const char *src = "model ce {\n"
                    "  batch B = 8\n  dim D = 12\n  dim V = 37\n"
                    "  input x : f32[B, D]\n  input y : i32[B]\n  param W : f32[D, V]\n"
                    "  loss ce = cross_entropy(x @ W, y)\n"
                    "}\n";
  OtStats st = check_model("ce.gdl", src, 83, ignore_some_targets);
  assert_true(st.kernels >= 2);
}

static void test_codegen_gelu_chain_f64(void **state) {
  const char *src = "model gl {\n"
                    "  batch B = 4\n  dim H = 40\n"
                    "  input x : f64[B, H]\n  param b : f64[H]\n  param W : f64[H, H]\n"
                    "  h = gelu(x @ W + b)\n"
                    "  loss l = sum(tanh(h) * sigmoid(h - b)) + mean(silu(h) ** 2)\n"
                    "}\n";
  OtStats st = check_model("gl.gdl", src, 84, NULL);
  assert_true(st.kernels >= 2);
}

static void test_codegen_broadcasting(void **state) {
  const char *src = "model bc {\n"
                    "  batch B = 3\n  dim R = 7\n  dim C = 9\n"
                    "  input x : f32[B, R, C]\n  param a : f32[C]\n  param c : f32[R, 1]\n  param s : f32\n"
                    "  m = mean(x, axis=-1, keepdim=true)\n"
                    "  y = (x - m) * a + c * s\n"
                    "  loss l = sum(maximum(y, 0.5) * minimum(x, c)) + sum(max(x, axis=0) * a)\n"
                    "}\n";
  check_model("bc.gdl", src, 85, NULL);
}

static void test_codegen_mlp_example(void **state) {
  char *src = tu_read("examples/mlp.gdl");
  OtStats st = check_model("examples/mlp.gdl", src, 86, ignore_some_targets);
  assert_true(st.kernels >= 5);
  free(src);
}

static void test_codegen_tinygpt_example(void **state) {
  char *src = tu_read("examples/tinygpt.gdl");
  OtStats st = check_model("examples/tinygpt.gdl", src, 87, NULL);
  assert_true(st.kernels >= 20);
  free(src);
}

/* ------------------------------------------------------------------ */
/* Object code, cache and errors                                       */
/* ------------------------------------------------------------------ */

static IrFunc *small_fused(void) {
  IrFunc *f = ir_func_new("small");
  IrValue *x = input(f, "x", ty(IR_DT_F32, 2, 4, 16));
  int64_t last = 1;
  IrValue *m = reduce(f, IR_OP_MAX, x, &last, 1, true);
  sink(f, un(f, IR_OP_EXP, bin(f, IR_OP_SUB, x, m)));
  static const char *const p[] = {"fuse"};
  run_passes(f, p, 1);
  ot_trivial_plan(f);
  return f;
}

/* Run kernel 1 of m on x = 0..63 and return the first output element. */
static float run_small(const IrFunc *f, const CgModule *m) {
  char *arena = aligned_alloc(64, (size_t)(f->arena_size + 63) / 64 * 64);
  for (int i = 0; i < 64; i++) {
    float v = (float)i / 64;
    memcpy(arena + f->args[0]->offset + 4 * i, &v, 4);
  }
  const CgKernel *k = cg_module_kernel(m, 1);
  assert_non_null(k);
  assert_int_equal(k->iters, 1); /* its 4 rows of 16 run side by side (llvm_row.c lanes_for) */
  k->fn(arena, 0, k->iters, k->offs);
  const IrValue *out = NULL;
  for (int i = 0; i < f->nops; i++)
    if (f->ops[i]->group == 1) out = f->ops[i]->result;
  float r;
  memcpy(&r, arena + out->offset + 4, 4);
  free(arena);
  return r;
}

static void test_codegen_object_round_trip_and_cache(void **state) {
  IrFunc *f = small_fused();
  char err[512];
  CgOptions o = {0};
  CgModule *m = cg_llvm_compile(f, &o, err, sizeof err);
  if (!m) fail_msg("%s", err);
  float want = expf(1.0f / 64 - 15.0f / 64);
  float r1 = run_small(f, m);
  assert_true(fabsf(r1 - want) < 1e-6f);
  const void *obj;
  size_t len;
  cg_module_object(m, &obj, &len);
  assert_true(len > 0);
  CgModule *m2 = cg_module_load_object(f, obj, len, err, sizeof err);
  if (!m2) fail_msg("%s", err);
  assert_true(run_small(f, m2) == r1);
  assert_string_equal(cg_module_kernel(m2, 1)->name, cg_module_kernel(m, 1)->name);
  cg_module_free(m2);
  cg_module_free(m);
  /* garbage is an error, not a crash */
  assert_null(cg_module_load_object(f, "not an object", 13, err, sizeof err));

  char dir[] = "/tmp/gradc-cg-cacheXXXXXX";
  assert_non_null(mkdtemp(dir));
  o.cache_dir = dir;
  CgModule *c1 = cg_llvm_compile(f, &o, err, sizeof err);
  assert_non_null(c1);
  assert_false(cg_module_from_cache(c1));
  CgModule *c2 = cg_llvm_compile(f, &o, err, sizeof err);
  assert_non_null(c2);
  assert_true(cg_module_from_cache(c2));
  assert_true(run_small(f, c2) == r1);
  cg_module_free(c1);
  cg_module_free(c2);
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  assert_int_equal(system(cmd), 0);
  ir_func_free(f);
}

/* Kernels that differ only in where their buffers are share one body:
 * each must still read and write its own buffers. */
static void test_codegen_shared_bodies(void **state) {
  IrFunc *f = ir_func_new("shared");
  IrValue *z[6];
  for (int i = 0; i < 6; i++) {
    char nx[8], ny[8];
    snprintf(nx, sizeof nx, "x%d", i);
    snprintf(ny, sizeof ny, "y%d", i);
    IrValue *x = input(f, nx, ty(IR_DT_F32, 2, 3, 20)), *y = input(f, ny, ty(IR_DT_F32, 2, 3, 20));
    int64_t last = 1;
    IrValue *e = un(f, IR_OP_EXP, bin(f, IR_OP_MUL, x, y));
    z[i] = bin(f, IR_OP_DIV, e, reduce(f, IR_OP_SUM, e, &last, 1, true));
    sink(f, z[i]);
  }
  OtStats st = check_built(f, true, 91);
  assert_int_equal(st.kernels, 6);
  assert_int_equal(st.outputs, 6);
  /* One body for the six, run with each kernel's own table of offsets
   * (no wrapper functions: load_object points every kernel at it). */
  char err[512];
  CgOptions o = {0};
  CgModule *m = cg_llvm_compile(f, &o, err, sizeof err);
  if (!m) fail_msg("compile: %s", err);
  const CgKernel *first = NULL;
  int seen = 0;
  for (int g = 1; g <= cg_module_nkernels(m); g++) {
    const CgKernel *k = cg_module_kernel(m, g);
    if (!k) continue;
    assert_non_null(k->offs);
    if (!first) first = k;
    assert_ptr_equal(k->fn, first->fn);
    if (k != first) assert_true(memcmp(k->offs, first->offs, 2 * sizeof(int64_t)) != 0);
    seen++;
  }
  assert_int_equal(seen, 6);
  cg_module_free(m);
  ir_func_free(f);
}

static void test_codegen_unplanned_value_is_an_error(void **state) {
  IrFunc *f = small_fused();
  f->args[0]->storage = IR_STORE_NONE;
  char err[512] = "";
  CgOptions o = {0};
  assert_null(cg_llvm_compile(f, &o, err, sizeof err));
  assert_non_null(strstr(err, "no storage"));
  ir_func_free(f);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_codegen_threads_bound_the_compile),
      cmocka_unit_test(test_codegen_exp_tanh_accuracy),
      cmocka_unit_test(test_codegen_sigmoid_gelu_accuracy),
      cmocka_unit_test(test_codegen_softmax_by_hand),
      cmocka_unit_test(test_codegen_softmax_by_hand_f64),
      cmocka_unit_test(test_codegen_softmax_by_hand_fused),
      cmocka_unit_test(test_codegen_grad_buffers_accumulate),
      cmocka_unit_test(test_codegen_softmax_fwd_bwd),
      cmocka_unit_test(test_codegen_causal_softmax),
      cmocka_unit_test(test_codegen_row_max_specials),
      cmocka_unit_test(test_codegen_recomputed_values),
      cmocka_unit_test(test_codegen_layer_norm_fwd_bwd),
      cmocka_unit_test(test_codegen_cross_entropy_fwd_bwd),
      cmocka_unit_test(test_codegen_gelu_chain_f64),
      cmocka_unit_test(test_codegen_broadcasting),
      cmocka_unit_test(test_codegen_mlp_example),
      cmocka_unit_test(test_codegen_tinygpt_example),
      cmocka_unit_test(test_codegen_object_round_trip_and_cache),
      cmocka_unit_test(test_codegen_shared_bodies),
      cmocka_unit_test(test_codegen_unplanned_value_is_an_error),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

#else /* no LLVM: the CPU back end is not built */

static void test_codegen_skipped_without_llvm(void **state) { skip(); }

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_codegen_skipped_without_llvm)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}

#endif
