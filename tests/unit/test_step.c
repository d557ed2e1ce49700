/* test_step.c - one window on the reference interpreter: accumulation over
 * K micro-batches equals the full-batch loss and gradient (computed here
 * independently, in plain C), window sums count the whole window, and
 * missing or mistyped tensors are reported with the file and tensor. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runtime/runtime.h"
#include "testutil.h"

static const IrLoc noloc = {NULL, 0, 0};

static IrType ty(IrDType dt, int rank, const int64_t *dims) {
  IrType t;
  memset(&t, 0, sizeof t);
  t.dtype = dt;
  t.shape = ir_shape_make(rank, dims);
  return t;
}

static IrValue *build(IrFunc *f, IrOpcode opc, IrValue **args, int nargs, const IrAttr *attrs, int nattrs,
                      const IrType *hint) {
  char err[512];
  IrOp *op = ir_build(f, opc, args, nargs, attrs, nattrs, hint, noloc, err, sizeof err);
  if (!op) fail_msg("cannot build %s: %s", ir_op_info[opc].name, err);
  return op->result;
}
static IrValue *bin(IrFunc *f, IrOpcode opc, IrValue *a, IrValue *b) {
  IrValue *args[2] = {a, b};
  return build(f, opc, args, 2, NULL, 0, NULL);
}
static IrValue *sum_all(IrFunc *f, IrValue *x) {
  IrAttr a[2] = {ir_attr_ints("axes", NULL, 0), ir_attr_bool("keepdim", false)};
  return build(f, IR_OP_SUM, &x, 1, a, 2, NULL);
}
static IrValue *cf32(IrFunc *f, double v) {
  IrType t = ty(IR_DT_F32, 0, NULL);
  IrAttr a = ir_attr_float("value", v);
  return build(f, IR_OP_CONST, NULL, 0, &a, 1, &t);
}
static void output(IrFunc *f, IrOpcode opc, const char *name, IrValue *x) {
  IrAttr a = ir_attr_str("name", name);
  build(f, opc, &x, 1, &a, 1, NULL);
}

/* A classifier over a window of 4 samples, compiled for K micro-batches,
 * as gas-fold and autodiff would leave it (backward written by hand):
 *
 *   logits = (x @ W) * scale                       x: f32[4/K, 3] batched
 *   loss ce = sum_ce(logits, y) / max(window count of valid y, 1)
 *   loss l2 = 0.5 * sum(W * W)                     weight 1/K per micro-batch
 *   grad W  = x^T ((softmax - one_hot) * valid * seed * scale) + W * (2 * seed2)
 *   b: f64[4] param that gets no gradient. */
static IrFunc *tiny_model(int K) {
  int64_t B = 4 / K, dx[2] = {B, 3}, dy[1] = {B}, dW[2] = {3, 4}, db[1] = {4}, dB1[2] = {B, 1}, dBV[2] = {B, 4};
  IrFunc *f = ir_func_new("tiny");
  IrValue *x = ir_func_add_arg(f, "x", ty(IR_DT_F32, 2, dx), IR_ARG_INPUT, true);
  IrValue *y = ir_func_add_arg(f, "y", ty(IR_DT_I32, 1, dy), IR_ARG_INPUT, true);
  IrValue *scale = ir_func_add_arg(f, "scale", ty(IR_DT_F32, 0, NULL), IR_ARG_INPUT, false);
  IrValue *W = ir_func_add_arg(f, "W", ty(IR_DT_F32, 2, dW), IR_ARG_PARAM, false);
  ir_func_add_arg(f, "b", ty(IR_DT_F64, 1, db), IR_ARG_PARAM, false);

  IrValue *logits = bin(f, IR_OP_MUL, bin(f, IR_OP_MATMUL, x, W), scale);
  IrValue *ceargs[2] = {logits, y};
  IrAttr cea[2] = {ir_attr_int("ignore_index", -100), ir_attr_str("reduction", "sum")};
  IrValue *ce = build(f, IR_OP_CROSS_ENTROPY, ceargs, 2, cea, 2, NULL);
  IrType ti = ty(IR_DT_I32, 0, NULL), tvf = ty(IR_DT_F32, 1, dy);
  IrAttr m100 = ir_attr_float("value", -100);
  IrValue *ign = build(f, IR_OP_CONST, NULL, 0, &m100, 1, &ti);
  IrValue *valid = bin(f, IR_OP_NE, y, ign);
  IrValue *vf = build(f, IR_OP_CAST, &valid, 1, NULL, 0, &tvf);
  IrValue *ws = build(f, IR_OP_WINDOW_SUM, (IrValue *[]){sum_all(f, vf)}, 1, NULL, 0, NULL);
  IrValue *wgt = bin(f, IR_OP_DIV, cf32(f, 1), bin(f, IR_OP_MAXIMUM, ws, cf32(f, 1)));
  IrAttr c1 = ir_attr_float("coef", 1);
  IrValue *seed = build(f, IR_OP_GRAD_SEED, &wgt, 1, &c1, 1, NULL);
  output(f, IR_OP_LOSS, "ce", bin(f, IR_OP_LOSS_TERM, ce, seed));

  IrAttr ax = ir_attr_int("axis", -1);
  IrValue *p = build(f, IR_OP_SOFTMAX, &logits, 1, &ax, 1, NULL);
  IrAttr oha[2] = {ir_attr_int("depth", 4), ir_attr_int("ignore_index", -100)};
  IrType toh = ty(IR_DT_F32, 2, dBV);
  IrValue *oh = build(f, IR_OP_ONE_HOT, &y, 1, oha, 2, &toh);
  IrAttr rs = ir_attr_ints("shape", dB1, 2);
  IrValue *mask = build(f, IR_OP_RESHAPE, &vf, 1, &rs, 1, NULL);
  IrValue *d = bin(f, IR_OP_MUL, bin(f, IR_OP_MUL, bin(f, IR_OP_MUL, bin(f, IR_OP_SUB, p, oh), mask), seed), scale);
  int64_t perm[2] = {1, 0};
  IrAttr pa = ir_attr_ints("perm", perm, 2);
  IrValue *xt = build(f, IR_OP_PERMUTE, &x, 1, &pa, 1, NULL);
  output(f, IR_OP_GRAD, "W", bin(f, IR_OP_MATMUL, xt, d));

  IrValue *l2 = sum_all(f, bin(f, IR_OP_MUL, W, W));
  IrValue *invk = cf32(f, 1.0 / K);
  IrAttr c05 = ir_attr_float("coef", 0.5);
  IrValue *seed2 = build(f, IR_OP_GRAD_SEED, &invk, 1, &c05, 1, NULL);
  output(f, IR_OP_LOSS, "l2", bin(f, IR_OP_LOSS_TERM, l2, seed2));
  output(f, IR_OP_GRAD, "W", bin(f, IR_OP_MUL, W, bin(f, IR_OP_MUL, cf32(f, 2), seed2)));
  return f;
}

/* The window's data. */
static const float X[12] = {0.5f, -1, 2, 1, 0.25f, -0.5f, -2, 1, 0.75f, 0.1f, 0.2f, -0.3f};
static const float Wv[12] = {0.1f, -0.2f, 0.3f, 0.05f, -0.4f, 0.2f, 0.1f, -0.1f, 0.25f, 0.15f, -0.35f, 0.3f};
static const double SCALE = 0.5;

/* Full-batch loss and gradient, computed directly from the definition. */
static void reference(const int64_t *y, double *ce, double *l2, double *dW) {
  double total = 0;
  int count = 0;
  memset(dW, 0, sizeof(double) * 12);
  for (int n = 0; n < 4; n++) {
    if (y[n] == -100) continue;
    double l[4], m = -INFINITY, s = 0;
    for (int v = 0; v < 4; v++) {
      l[v] = 0;
      for (int k = 0; k < 3; k++) l[v] += (double)X[n * 3 + k] * (double)Wv[k * 4 + v];
      l[v] *= SCALE;
      m = fmax(m, l[v]);
    }
    for (int v = 0; v < 4; v++) s += exp(l[v] - m);
    total += m + log(s) - l[y[n]];
    count++;
    for (int v = 0; v < 4; v++) {
      double g = (exp(l[v] - m) / s - (v == y[n])) * SCALE;
      for (int k = 0; k < 3; k++) dW[k * 4 + v] += X[n * 3 + k] * g;
    }
  }
  int c = count > 1 ? count : 1;
  *ce = total / c;
  for (int i = 0; i < 12; i++) dW[i] /= c;
  *l2 = 0;
  for (int i = 0; i < 12; i++) {
    *l2 += 0.5 * (double)Wv[i] * Wv[i];
    dW[i] += Wv[i];
  }
}

/* ---- files ---- */

typedef struct Files {
  char dir[64], params[128], inputs[128];
  StFile p, in;
} Files;

static void files_init(Files *fs) {
  snprintf(fs->dir, sizeof fs->dir, "/tmp/gradc_step_XXXXXX");
  assert_non_null(mkdtemp(fs->dir));
  snprintf(fs->params, sizeof fs->params, "%s/p.safetensors", fs->dir);
  snprintf(fs->inputs, sizeof fs->inputs, "%s/i.safetensors", fs->dir);
  st_init(&fs->p);
  st_init(&fs->in);
}

/* Write both files with st_write and read them back with st_read. */
static void files_sync(Files *fs, StFile *p, StFile *in) {
  char err[512];
  if (!st_write(fs->params, p, err, sizeof err) || !st_write(fs->inputs, in, err, sizeof err)) fail_msg("%s", err);
  st_free(&fs->p);
  st_free(&fs->in);
  if (!st_read(fs->params, &fs->p, err, sizeof err) || !st_read(fs->inputs, &fs->in, err, sizeof err))
    fail_msg("%s", err);
}

static void files_done(Files *fs) {
  st_free(&fs->p);
  st_free(&fs->in);
  unlink(fs->params);
  unlink(fs->inputs);
  rmdir(fs->dir);
}

/* The standard params and inputs (y as I64, scale as F64). */
static void make_tensors(StFile *p, StFile *in, const int64_t *y) {
  int64_t sW[2] = {3, 4}, sb[1] = {4}, sx[2] = {4, 3}, sy[1] = {4};
  double b[4] = {0};
  st_init(p);
  st_init(in);
  st_add(p, "W", ST_F32, 2, sW, Wv);
  st_add(p, "b", ST_F64, 1, sb, b);
  st_add(in, "x", ST_F32, 2, sx, X);
  st_add(in, "y", ST_I64, 1, sy, y);
  st_add(in, "scale", ST_F64, 0, NULL, &SCALE);
}

static void run_window(const int64_t *y, int K, bool exact, StepResult *r) {
  Files fs;
  files_init(&fs);
  StFile p, in;
  make_tensors(&p, &in, y);
  files_sync(&fs, &p, &in);
  IrFunc *f = tiny_model(K);
  InterpOptions opt = {.exact_f64 = exact};
  char err[512];
  if (!step_run_ref(f, K, &fs.p, fs.params, &fs.in, fs.inputs, &opt, r, err, sizeof err)) fail_msg("%s", err);
  ir_func_free(f); /* names in r point into f: only compare numbers after this */
  st_free(&p);
  st_free(&in);
  files_done(&fs);
}

static void expect_window(const StepResult *r, const int64_t *y, double tol) {
  double ce, l2, dW[12];
  reference(y, &ce, &l2, dW);
  assert_int_equal(r->nlosses, 2);
  assert_int_equal(r->ngrads, 2);
  if (!(fabs(r->losses[0] - ce) <= tol)) fail_msg("loss ce: got %.17g, want %.17g", r->losses[0], ce);
  if (!(fabs(r->losses[1] - l2) <= tol)) fail_msg("loss l2: got %.17g, want %.17g", r->losses[1], l2);
  for (int i = 0; i < 12; i++)
    if (!(fabs(r->grads[0][i] - dW[i]) <= tol)) fail_msg("dW[%d]: got %.17g, want %.17g", i, r->grads[0][i], dW[i]);
  for (int i = 0; i < 4; i++) assert_true(r->grads[1][i] == 0.0); /* b: no grad output */
}

static void test_step_accumulates_to_full_batch(void **state) {
  (void)state;
  const int64_t y[4] = {1, 3, -100, 0}; /* micro-batch 2 has an ignored target */
  for (int K = 1; K <= 4; K *= 2) {
    StepResult r;
    run_window(y, K, true, &r);
    expect_window(&r, y, 1e-12);
    step_result_free(&r);
    run_window(y, K, false, &r); /* f32 rounding: close, not exact */
    expect_window(&r, y, 2e-6);
    step_result_free(&r);
  }
}

static void test_step_all_ignored_gives_zero_loss(void **state) {
  (void)state;
  const int64_t y[4] = {-100, -100, -100, -100};
  StepResult r;
  run_window(y, 2, true, &r);
  assert_true(r.losses[0] == 0.0);
  expect_window(&r, y, 1e-12); /* dW = W from the l2 term only, no NaN */
  step_result_free(&r);
}

static void test_step_result_names_and_types(void **state) {
  (void)state;
  Files fs;
  files_init(&fs);
  const int64_t y[4] = {0, 1, 2, 3};
  StFile p, in;
  make_tensors(&p, &in, y);
  files_sync(&fs, &p, &in);
  IrFunc *f = tiny_model(2);
  StepResult r;
  char err[512];
  assert_true(step_run_ref(f, 2, &fs.p, fs.params, &fs.in, fs.inputs, NULL, &r, err, sizeof err));
  assert_string_equal(r.loss_names[0], "ce");
  assert_string_equal(r.loss_names[1], "l2");
  assert_string_equal(r.grad_names[0], "W");
  assert_string_equal(r.grad_names[1], "b");
  assert_int_equal(r.grad_types[0].dtype, IR_DT_F32);
  assert_int_equal(r.grad_types[0].shape.rank, 2);
  assert_int_equal(r.grad_types[0].shape.dim[1], 4);
  assert_int_equal(r.grad_types[1].dtype, IR_DT_F64);
  assert_int_equal(r.grad_types[1].shape.dim[0], 4);
  step_result_free(&r);
  assert_int_equal(r.ngrads, 0);
  ir_func_free(f);
  st_free(&p);
  st_free(&in);
  files_done(&fs);
}

/* Batched inputs are split into contiguous micro-batches; unbatched ones
 * reach every micro-batch whole. */
static void test_step_splits_contiguously(void **state) {
  (void)state;
  int64_t d2[1] = {2}, d1[1] = {1}, d4[1] = {4};
  IrFunc *f = ir_func_new("split");
  IrValue *x = ir_func_add_arg(f, "x", ty(IR_DT_F64, 1, d2), IR_ARG_INPUT, true);
  IrValue *r = ir_func_add_arg(f, "r", ty(IR_DT_F64, 1, d2), IR_ARG_INPUT, false);
  ir_func_add_arg(f, "w", ty(IR_DT_F32, 1, d1), IR_ARG_PARAM, false);
  output(f, IR_OP_LOSS, "s", sum_all(f, bin(f, IR_OP_MUL, x, r)));
  Files fs;
  files_init(&fs);
  StFile p, in;
  st_init(&p);
  st_init(&in);
  double xv[4] = {1, 2, 3, 4}, rv[2] = {10, 100};
  float wv[1] = {0};
  st_add(&p, "w", ST_F32, 1, d1, wv);
  st_add(&in, "x", ST_F64, 1, d4, xv);
  st_add(&in, "r", ST_F64, 1, d2, rv);
  files_sync(&fs, &p, &in);
  StepResult res;
  char err[512];
  if (!step_run_ref(f, 2, &fs.p, fs.params, &fs.in, fs.inputs, NULL, &res, err, sizeof err)) fail_msg("%s", err);
  assert_true(res.losses[0] == 10 + 200 + 30 + 400); /* {1,2} then {3,4}, each times {10,100} */
  assert_true(res.grads[0][0] == 0.0);
  step_result_free(&res);
  ir_func_free(f);
  st_free(&p);
  st_free(&in);
  files_done(&fs);
}

/* A bf16 model: params arrive as BF16 (or F32/F16), every op rounds to
 * bf16, and the gradient buffer is f32. */
static void test_step_bf16_param(void **state) {
  (void)state;
  int64_t d2[1] = {2};
  IrFunc *f = ir_func_new("half");
  IrValue *w = ir_func_add_arg(f, "w", ty(IR_DT_BF16, 1, d2), IR_ARG_PARAM, false);
  IrValue *x = ir_func_add_arg(f, "x", ty(IR_DT_BF16, 1, d2), IR_ARG_INPUT, false);
  output(f, IR_OP_LOSS, "s", sum_all(f, bin(f, IR_OP_MUL, w, x)));
  output(f, IR_OP_GRAD, "w", x);
  Files fs;
  files_init(&fs);
  StFile p, in;
  st_init(&p);
  st_init(&in);
  uint16_t wv[2] = {0x3f80, 0x3f81}; /* 1.0, 1.0078125 */
  float xv[2] = {0.5f, 3.0f};
  st_add(&p, "w", ST_BF16, 1, d2, wv);
  st_add(&in, "x", ST_F32, 1, d2, xv);
  files_sync(&fs, &p, &in);
  StepResult r;
  char err[512];
  if (!step_run_ref(f, 1, &fs.p, fs.params, &fs.in, fs.inputs, NULL, &r, err, sizeof err)) fail_msg("%s", err);
  /* 3 * 1.0078125 = 3.0234375 rounds (tie, to even) to 3.03125; + 0.5 = 3.53125 */
  assert_true(r.losses[0] == 3.53125);
  assert_int_equal(r.grad_types[0].dtype, IR_DT_F32);
  assert_true(r.grads[0][0] == 0.5 && r.grads[0][1] == 3.0);
  step_result_free(&r);
  InterpOptions exact = {.exact_f64 = true};
  if (!step_run_ref(f, 1, &fs.p, fs.params, &fs.in, fs.inputs, &exact, &r, err, sizeof err)) fail_msg("%s", err);
  assert_true(r.losses[0] == 3.5234375);
  step_result_free(&r);
  ir_func_free(f);
  st_free(&p);
  st_free(&in);
  files_done(&fs);
}

/* ---- errors ---- */

typedef void (*Mutate)(StFile *p, StFile *in);

/* Run K=2 with the standard tensors changed by `mutate`; expect failure
 * with exactly `want` (where PARAMS and INPUTS stand for the paths). */
static void expect_error(Mutate mutate, const int64_t *y, const char *want) {
  Files fs;
  files_init(&fs);
  StFile p, in;
  make_tensors(&p, &in, y);
  if (mutate) mutate(&p, &in);
  files_sync(&fs, &p, &in);
  IrFunc *f = tiny_model(2);
  StepResult r;
  char err[512], expect[512];
  const char *at;
  if ((at = strstr(want, "PARAMS")))
    snprintf(expect, sizeof expect, "%.*s%s%s", (int)(at - want), want, fs.params, at + 6);
  else if ((at = strstr(want, "INPUTS")))
    snprintf(expect, sizeof expect, "%.*s%s%s", (int)(at - want), want, fs.inputs, at + 6);
  else
    snprintf(expect, sizeof expect, "%s", want);
  bool ok = step_run_ref(f, 2, &fs.p, fs.params, &fs.in, fs.inputs, NULL, &r, err, sizeof err);
  if (ok) {
    step_result_free(&r);
    fail_msg("accepted; expected: %s", expect);
  }
  assert_string_equal(err, expect);
  assert_int_equal(r.ngrads, 0);
  ir_func_free(f);
  st_free(&p);
  st_free(&in);
  files_done(&fs);
}

/* Replace tensor `name` in f by a new one (order kept at the end). */
static void replace(StFile *f, const char *name, StDType dt, int rank, const int64_t *shape, const void *data) {
  StFile g;
  st_init(&g);
  for (int i = 0; i < f->n; i++)
    if (strcmp(f->t[i].name, name) != 0)
      st_add(&g, f->t[i].name, f->t[i].dtype, f->t[i].rank, f->t[i].shape, f->t[i].data);
  if (data || rank >= 0) st_add(&g, name, dt, rank, shape, data);
  st_free(f);
  *f = g;
}

static void drop_W(StFile *p, StFile *in) { replace(p, "W", ST_F32, -1, NULL, NULL); }
static void extra_W9(StFile *p, StFile *in) {
  int64_t s[1] = {1};
  st_add(p, "W9", ST_F32, 1, s, NULL);
}
static void W_shape(StFile *p, StFile *in) {
  int64_t s[2] = {3, 5};
  replace(p, "W", ST_F32, 2, s, NULL);
}
static void W_dtype(StFile *p, StFile *in) {
  int64_t s[2] = {3, 4};
  replace(p, "W", ST_I32, 2, s, NULL);
}
static void x_micro(StFile *p, StFile *in) {
  int64_t s[2] = {2, 3};
  replace(in, "x", ST_F32, 2, s, NULL);
}
static void y_float(StFile *p, StFile *in) {
  int64_t s[1] = {4};
  replace(in, "y", ST_F32, 1, s, NULL);
}
static void y_huge(StFile *p, StFile *in) {
  int64_t s[1] = {4}, v[4] = {0, 1, (int64_t)1 << 40, 2};
  replace(in, "y", ST_I64, 1, s, v);
}
static void W_in_inputs(StFile *p, StFile *in) {
  int64_t s[2] = {3, 4};
  st_add(in, "W", ST_F32, 2, s, NULL);
}
static void drop_scale(StFile *p, StFile *in) { replace(in, "scale", ST_F32, -1, NULL, NULL); }
static void b_bf16(StFile *p, StFile *in) {
  int64_t s[1] = {4};
  replace(p, "b", ST_BF16, 1, s, NULL);
}
static void y_i32(StFile *p, StFile *in) {
  int64_t s[1] = {4};
  int32_t v[4] = {0, 1, 2, 3};
  replace(in, "y", ST_I32, 1, s, v);
}

static void test_step_reports_bad_tensors(void **state) {
  (void)state;
  const int64_t y[4] = {1, 3, -100, 0};
  expect_error(drop_W, y, "PARAMS: missing tensor 'W'");
  expect_error(extra_W9, y, "PARAMS: tensor 'W9': not a param of the model");
  expect_error(W_shape, y, "PARAMS: tensor 'W': expected f32[3,4], got f32[3,5]");
  expect_error(W_dtype, y, "PARAMS: tensor 'W': expected f32[3,4], got i32[3,4]");
  expect_error(b_bf16, y, "PARAMS: tensor 'b': expected f64[4], got bf16[4]");
  expect_error(x_micro, y, "INPUTS: tensor 'x': expected f32[4,3], got f32[2,3]");
  expect_error(y_float, y, "INPUTS: tensor 'y': expected i32[4], got f32[4]");
  expect_error(y_huge, y, "INPUTS: tensor 'y': value 1099511627776 at element 2 is out of range for i32");
  expect_error(W_in_inputs, y, "INPUTS: tensor 'W': not an input of the model");
  expect_error(drop_scale, y, "INPUTS: missing tensor 'scale'");
  /* A run-time error inside the window. */
  const int64_t bad[4] = {1, 3, -100, 7};
  expect_error(NULL, bad, "cross_entropy: target 7 (element 1) out of range [0, 4)");
}

/* I32 targets are accepted as well as I64 (and F64 for f32 args, as above). */
static void test_step_accepts_i32_targets(void **state) {
  (void)state;
  const int64_t y[4] = {0, 1, 2, 3};
  Files fs;
  files_init(&fs);
  StFile p, in;
  make_tensors(&p, &in, y);
  y_i32(&p, &in);
  files_sync(&fs, &p, &in);
  IrFunc *f = tiny_model(2);
  StepResult r;
  char err[512];
  if (!step_run_ref(f, 2, &fs.p, fs.params, &fs.in, fs.inputs, NULL, &r, err, sizeof err)) fail_msg("%s", err);
  expect_window(&r, y, 2e-6);
  step_result_free(&r);
  assert_false(step_run_ref(f, 0, &fs.p, fs.params, &fs.in, fs.inputs, NULL, &r, err, sizeof err));
  ir_func_free(f);
  st_free(&p);
  st_free(&in);
  files_done(&fs);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_step_accumulates_to_full_batch),
      cmocka_unit_test(test_step_all_ignored_gives_zero_loss),
      cmocka_unit_test(test_step_result_names_and_types),
      cmocka_unit_test(test_step_splits_contiguously),
      cmocka_unit_test(test_step_bf16_param),
      cmocka_unit_test(test_step_reports_bad_tensors),
      cmocka_unit_test(test_step_accepts_i32_targets),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
