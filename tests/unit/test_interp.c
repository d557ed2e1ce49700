/* test_interp.c - the reference interpreter, op by op, against values
 * derived by hand (or from the defining formula), on small tensors: each
 * test builds a function with ir_build, runs it and compares results. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "passes/passes.h"
#include "runtime/runtime.h"
#include "testutil.h"

/* ------------------------------------------------------------------ */
/* Helpers                                                             */
/* ------------------------------------------------------------------ */

static IrType ty(IrDType dt, int rank, ...) {
  IrType t;
  memset(&t, 0, sizeof t);
  t.dtype = dt;
  t.shape.rank = rank;
  va_list ap;
  va_start(ap, rank);
  for (int i = 0; i < rank; i++) t.shape.dim[i] = va_arg(ap, int);
  va_end(ap);
  return t;
}

static const IrLoc noloc = {NULL, 0, 0};

static IrValue *input(IrFunc *f, const char *name, IrType t) { return ir_func_add_arg(f, name, t, IR_ARG_INPUT, false); }

/* Build one op; fails the test on a shape error. */
static IrValue *build(IrFunc *f, IrOpcode opc, IrValue **args, int nargs, const IrAttr *attrs, int nattrs,
                      const IrType *hint) {
  char err[512];
  IrOp *op = ir_build(f, opc, args, nargs, attrs, nattrs, hint, noloc, err, sizeof err);
  if (!op) fail_msg("cannot build %s: %s", ir_op_info[opc].name, err);
  return op->result;
}

static IrValue *un(IrFunc *f, IrOpcode opc, IrValue *x) { return build(f, opc, &x, 1, NULL, 0, NULL); }
static IrValue *un1(IrFunc *f, IrOpcode opc, IrValue *x, IrAttr a) { return build(f, opc, &x, 1, &a, 1, NULL); }
static IrValue *bin(IrFunc *f, IrOpcode opc, IrValue *a, IrValue *b) {
  IrValue *args[2] = {a, b};
  return build(f, opc, args, 2, NULL, 0, NULL);
}
static IrValue *reduce(IrFunc *f, IrOpcode opc, IrValue *x, const int64_t *axes, int n, bool keepdim) {
  IrAttr a[2] = {ir_attr_ints("axes", axes, n), ir_attr_bool("keepdim", keepdim)};
  return build(f, opc, &x, 1, a, 2, NULL);
}
static IrValue *cnst(IrFunc *f, double v, IrType t) {
  IrAttr a = ir_attr_float("value", v);
  return build(f, IR_OP_CONST, NULL, 0, &a, 1, &t);
}

static bool run(InterpState *st, IrFunc *f, double **args, bool exact, char *err) {
  InterpOptions opt = {.exact_f64 = exact};
  return interp_run(st, f, args, NULL, INTERP_STEP, &opt, err, 512);
}

static void run_ok(InterpState *st, IrFunc *f, double **args, bool exact) {
  char err[512];
  if (!run(st, f, args, exact, err)) fail_msg("interp_run: %s", err);
}

static bool same(double a, double b, double tol) {
  if (isnan(a) || isnan(b)) return isnan(a) && isnan(b);
  if (isinf(a) || isinf(b)) return a == b;
  return fabs(a - b) <= tol;
}

/* Compare value v with want[0..n) (n must be v's numel). */
static void expect_vals(const InterpState *st, const IrValue *v, const double *want, int n, double tol) {
  assert_int_equal(ir_numel(&v->type.shape), n);
  const double *got = st->val[v->id];
  assert_non_null(got);
  for (int i = 0; i < n; i++)
    if (!same(got[i], want[i], tol)) fail_msg("element %d: got %.17g, want %.17g", i, got[i], want[i]);
}
#define EXPECT(st, v, tol, ...)                                                                              \
  do {                                                                                                       \
    const double want_[] = {__VA_ARGS__};                                                                    \
    expect_vals((st), (v), want_, (int)(sizeof want_ / sizeof want_[0]), (tol));                             \
  } while (0)

static void expect_shape(const IrValue *v, int rank, ...) {
  assert_int_equal(v->type.shape.rank, rank);
  va_list ap;
  va_start(ap, rank);
  for (int i = 0; i < rank; i++) assert_int_equal(v->type.shape.dim[i], va_arg(ap, int));
  va_end(ap);
}

/* ------------------------------------------------------------------ */
/* Rounding                                                            */
/* ------------------------------------------------------------------ */

static void test_interp_rounds_results_to_dtype(void **state) {
  (void)state;
  IrFunc *f = ir_func_new("r");
  IrValue *a = input(f, "a", ty(IR_DT_F32, 1, 2));
  IrValue *b = input(f, "b", ty(IR_DT_BF16, 1, 2));
  IrValue *s32 = bin(f, IR_OP_ADD, a, cnst(f, 1e-8, ty(IR_DT_F32, 0)));
  IrValue *s16 = bin(f, IR_OP_ADD, b, cnst(f, 0.00390625, ty(IR_DT_BF16, 0)));
  double av[2] = {1.0, 0.1}, bv[2] = {1.0, 1.0078125};
  double *args[2] = {av, bv};
  InterpState st;
  run_ok(&st, f, args, false);
  EXPECT(&st, a, 0, 1.0, (double)0.1f); /* arguments are rounded to their dtype too */
  EXPECT(&st, s32, 0, 1.0, (double)(0.1f + 1e-8f));
  EXPECT(&st, s16, 0, 1.0, 1.015625);
  interp_free(&st);
  run_ok(&st, f, args, true); /* exact_f64: nothing is rounded */
  EXPECT(&st, s32, 0, 1.00000001, 0.1 + 1e-8);
  EXPECT(&st, s16, 0, 1.00390625, 1.01171875);
  interp_free(&st);
  ir_func_free(f);
}

/* ------------------------------------------------------------------ */
/* Elementwise                                                         */
/* ------------------------------------------------------------------ */

static void test_interp_unary_ops(void **state) {
  (void)state;
  IrFunc *f = ir_func_new("u");
  IrValue *x = input(f, "x", ty(IR_DT_F64, 1, 5));
  IrValue *neg = un(f, IR_OP_NEG, x), *ex = un(f, IR_OP_EXP, x), *lg = un(f, IR_OP_LOG, x);
  IrValue *sq = un(f, IR_OP_SQRT, x), *rs = un(f, IR_OP_RSQRT, x), *th = un(f, IR_OP_TANH, x);
  IrValue *sg = un(f, IR_OP_SIGMOID, x), *re = un(f, IR_OP_RELU, x), *ge = un(f, IR_OP_GELU, x);
  IrValue *si = un(f, IR_OP_SILU, x), *ab = un(f, IR_OP_ABS, x), *sn = un(f, IR_OP_SIGN, x);
  IrValue *p2 = un1(f, IR_OP_POW, x, ir_attr_float("exponent", 2));
  IrValue *pm1 = un1(f, IR_OP_POW, x, ir_attr_float("exponent", -1));
  IrValue *ph = un1(f, IR_OP_POW, x, ir_attr_float("exponent", 0.5));
  IrValue *gg = un(f, IR_OP_GELU_GRAD, x), *dt = un(f, IR_OP_DETACH, x);
  double xv[5] = {-2, -0.5, 0, 1, 1.5};
  double *args[1] = {xv};
  InterpState st;
  run_ok(&st, f, args, false);
  double t = 1e-15;
  EXPECT(&st, neg, 0, 2, 0.5, -0.0, -1, -1.5);
  EXPECT(&st, ex, t, 0.1353352832366127, 0.6065306597126334, 1, 2.718281828459045, 4.4816890703380645);
  EXPECT(&st, lg, t, NAN, NAN, -INFINITY, 0, 0.4054651081081644);
  EXPECT(&st, sq, t, NAN, NAN, 0, 1, 1.224744871391589);
  EXPECT(&st, rs, t, NAN, NAN, INFINITY, 1, 0.8164965809277261);
  EXPECT(&st, th, t, -0.9640275800758169, -0.46211715726000974, 0, 0.7615941559557649, 0.9051482536448664);
  EXPECT(&st, sg, t, 0.11920292202211755, 0.3775406687981454, 0.5, 0.7310585786300049, 0.8175744761936437);
  EXPECT(&st, re, 0, 0, 0, 0, 1, 1.5);
  EXPECT(&st, ge, t, -0.04540230591222494, -0.15428599017485606, 0, 0.8411919906082768, 1.3995715769802328);
  EXPECT(&st, si, t, -0.2384058440442351, -0.1887703343990727, 0, 0.7310585786300049, 1.2263617142904655);
  EXPECT(&st, ab, 0, 2, 0.5, 0, 1, 1.5);
  EXPECT(&st, sn, 0, -1, -1, 0, 1, 1);
  EXPECT(&st, p2, 0, 4, 0.25, 0, 1, 2.25);
  EXPECT(&st, pm1, 0, -0.5, -2, INFINITY, 1, 1 / 1.5);
  EXPECT(&st, ph, t, NAN, NAN, 0, 1, 1.224744871391589);
  EXPECT(&st, dt, 0, -2, -0.5, 0, 1, 1.5);
  /* gelu_grad is the derivative of the gelu above: central differences. */
  for (int i = 0; i < 5; i++) {
    double h = 1e-5, v = xv[i];
#define GELU(z) (0.5 * (z) * (1 + tanh(sqrt(2 / M_PI) * ((z) + 0.044715 * (z) * (z) * (z)))))
    double fd = (GELU(v + h) - GELU(v - h)) / (2 * h);
    assert_true(fabs(st.val[gg->id][i] - fd) < 1e-9);
  }
  interp_free(&st);
  ir_func_free(f);
}

static void test_interp_sigmoid_is_stable(void **state) {
  (void)state;
  IrFunc *f = ir_func_new("s");
  IrValue *x = input(f, "x", ty(IR_DT_F32, 1, 2));
  IrValue *sg = un(f, IR_OP_SIGMOID, x), *si = un(f, IR_OP_SILU, x);
  double xv[2] = {-800, 800};
  double *args[1] = {xv};
  InterpState st;
  run_ok(&st, f, args, false);
  EXPECT(&st, sg, 0, 0, 1);
  EXPECT(&st, si, 0, 0, 800);
  interp_free(&st);
  ir_func_free(f);
}

static void test_interp_binary_ops_broadcast(void **state) {
  (void)state;
  IrFunc *f = ir_func_new("b");
  IrValue *a = input(f, "a", ty(IR_DT_F64, 2, 2, 3));
  IrValue *b = input(f, "b", ty(IR_DT_F64, 1, 3));
  IrValue *c = input(f, "c", ty(IR_DT_F64, 2, 2, 1));
  IrValue *d = input(f, "d", ty(IR_DT_F64, 2, 1, 3));
  IrValue *add = bin(f, IR_OP_ADD, a, b), *sub = bin(f, IR_OP_SUB, b, a), *mul = bin(f, IR_OP_MUL, c, d);
  IrValue *dv = bin(f, IR_OP_DIV, a, c), *mx = bin(f, IR_OP_MAXIMUM, a, d), *mn = bin(f, IR_OP_MINIMUM, d, a);
  IrValue *lt = bin(f, IR_OP_LT, a, cnst(f, 3.5, ty(IR_DT_F64, 0)));
  IrValue *eq = bin(f, IR_OP_EQ, a, d), *ne = bin(f, IR_OP_NE, a, d), *le = bin(f, IR_OP_LE, a, d);
  IrValue *gt = bin(f, IR_OP_GT, a, d), *ge = bin(f, IR_OP_GE, a, d);
  IrValue *cond = bin(f, IR_OP_GT, c, cnst(f, 2.5, ty(IR_DT_F64, 0))); /* bool[2,1]: {0, 1} */
  IrValue *sargs[3] = {cond, a, b};
  IrValue *sel = build(f, IR_OP_SELECT, sargs, 3, NULL, 0, NULL);
  expect_shape(add, 2, 2, 3);
  expect_shape(mul, 2, 2, 3);
  assert_int_equal(lt->type.dtype, IR_DT_BOOL);
  double av[6] = {1, 2, 3, 4, 5, 6}, bv[3] = {10, 20, 30}, cv[2] = {2, 3}, dvv[3] = {1, NAN, 4};
  double *args[4] = {av, bv, cv, dvv};
  InterpState st;
  run_ok(&st, f, args, true);
  EXPECT(&st, add, 0, 11, 22, 33, 14, 25, 36);
  EXPECT(&st, sub, 0, 9, 18, 27, 6, 15, 24);
  EXPECT(&st, mul, 0, 2, NAN, 8, 3, NAN, 12);
  EXPECT(&st, dv, 1e-15, 0.5, 1, 1.5, 4.0 / 3, 5.0 / 3, 2);
  EXPECT(&st, mx, 0, 1, NAN, 4, 4, NAN, 6); /* NaN propagates, as torch.maximum */
  EXPECT(&st, mn, 0, 1, NAN, 3, 1, NAN, 4);
  EXPECT(&st, lt, 0, 1, 1, 1, 0, 0, 0);
  EXPECT(&st, eq, 0, 1, 0, 0, 0, 0, 0);
  EXPECT(&st, ne, 0, 0, 1, 1, 1, 1, 1); /* NaN != x */
  EXPECT(&st, le, 0, 1, 0, 1, 0, 0, 0);
  EXPECT(&st, gt, 0, 0, 0, 0, 1, 0, 1);
  EXPECT(&st, ge, 0, 1, 0, 0, 1, 0, 1);
  EXPECT(&st, sel, 0, 10, 20, 30, 4, 5, 6);
  interp_free(&st);
  ir_func_free(f);
}

static void test_interp_integer_ops(void **state) {
  (void)state;
  IrFunc *f = ir_func_new("i");
  IrValue *a = input(f, "a", ty(IR_DT_I32, 1, 3));
  IrValue *two = cnst(f, 2, ty(IR_DT_I32, 0));
  IrValue *dv = bin(f, IR_OP_DIV, a, two), *ng = un(f, IR_OP_NEG, a), *ab = un(f, IR_OP_ABS, a);
  IrValue *s = reduce(f, IR_OP_SUM, a, NULL, 0, false);
  double av[3] = {7, -7, 4};
  double *args[1] = {av};
  InterpState st;
  run_ok(&st, f, args, false);
  EXPECT(&st, dv, 0, 3, -3, 2); /* toward zero */
  EXPECT(&st, ng, 0, -7, 7, -4);
  EXPECT(&st, ab, 0, 7, 7, 4);
  EXPECT(&st, s, 0, 4);
  interp_free(&st);
  ir_func_free(f);
}

static void test_interp_cast(void **state) {
  (void)state;
  IrFunc *f = ir_func_new("c");
  IrValue *x = input(f, "x", ty(IR_DT_F64, 1, 5));
  IrType ti = ty(IR_DT_I32, 1, 5), tb = ty(IR_DT_BOOL, 1, 5), tf = ty(IR_DT_F32, 1, 5);
  IrValue *ci = build(f, IR_OP_CAST, &x, 1, NULL, 0, &ti);
  IrValue *cb = build(f, IR_OP_CAST, &x, 1, NULL, 0, &tb);
  IrValue *cf = build(f, IR_OP_CAST, &x, 1, NULL, 0, &tf);
  IrType tbf = ty(IR_DT_F32, 1, 5);
  IrValue *back = build(f, IR_OP_CAST, &cb, 1, NULL, 0, &tbf);
  double xv[5] = {-1.7, 2.9, 0, -0.0, 0.1};
  double *args[1] = {xv};
  InterpState st;
  run_ok(&st, f, args, false);
  EXPECT(&st, ci, 0, -1, 2, 0, 0, 0);
  EXPECT(&st, cb, 0, 1, 1, 0, 0, 1);
  EXPECT(&st, cf, 0, (double)-1.7f, (double)2.9f, 0, 0, (double)0.1f);
  EXPECT(&st, back, 0, 1, 1, 0, 0, 1);
  interp_free(&st);
  ir_func_free(f);
}

/* ------------------------------------------------------------------ */
/* Reductions                                                          */
/* ------------------------------------------------------------------ */

static void test_interp_reductions(void **state) {
  (void)state;
  IrFunc *f = ir_func_new("r");
  IrValue *x = input(f, "x", ty(IR_DT_F64, 2, 2, 3));
  IrValue *y = input(f, "y", ty(IR_DT_F64, 3, 2, 2, 2));
  IrValue *z = input(f, "z", ty(IR_DT_F64, 2, 2, 2));
  int64_t ax1[1] = {1}, axm1[1] = {-1}, ax0[1] = {0}, ax02[2] = {0, 2};
  IrValue *s1 = reduce(f, IR_OP_SUM, x, ax1, 1, false), *s1k = reduce(f, IR_OP_SUM, x, ax1, 1, true);
  IrValue *mall = reduce(f, IR_OP_MEAN, x, NULL, 0, false), *mallk = reduce(f, IR_OP_MEAN, x, NULL, 0, true);
  IrValue *mx = reduce(f, IR_OP_MAX, x, axm1, 1, false), *mx0 = reduce(f, IR_OP_MAX, x, ax0, 1, true);
  IrValue *s02 = reduce(f, IR_OP_SUM, y, ax02, 2, false);
  IrValue *lse = reduce(f, IR_OP_LOGSUMEXP, z, axm1, 1, false);
  IrValue *m1 = reduce(f, IR_OP_MEAN, x, ax0, 1, false);
  expect_shape(s1, 1, 2);
  expect_shape(s1k, 2, 2, 1);
  expect_shape(mall, 0);
  expect_shape(mallk, 2, 1, 1);
  expect_shape(mx0, 2, 1, 3);
  expect_shape(s02, 1, 2);
  double xv[6] = {1, 5, 5, -1, 0, 2};
  double yv[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  double zv[4] = {1000, 1000, -INFINITY, -INFINITY};
  double *args[3] = {xv, yv, zv};
  InterpState st;
  run_ok(&st, f, args, false);
  EXPECT(&st, s1, 0, 11, 1);
  EXPECT(&st, s1k, 0, 11, 1);
  EXPECT(&st, mall, 0, 2);
  EXPECT(&st, mallk, 0, 2);
  EXPECT(&st, mx, 0, 5, 2); /* a tie: the value */
  EXPECT(&st, mx0, 0, 1, 5, 5);
  EXPECT(&st, s02, 0, 1 + 2 + 5 + 6, 3 + 4 + 7 + 8); /* y[i][j][k] = 4i + 2j + k + 1, kept axis j */
  EXPECT(&st, lse, 1e-12, 1000 + log(2.0), -INFINITY); /* stable; all -inf -> -inf */
  EXPECT(&st, m1, 0, 0, 2.5, 3.5);
  interp_free(&st);
  ir_func_free(f);
}

/* ------------------------------------------------------------------ */
/* Matrix products                                                     */
/* ------------------------------------------------------------------ */

static void test_interp_matmul_rules(void **state) {
  (void)state;
  IrFunc *f = ir_func_new("m");
  IrValue *A = input(f, "A", ty(IR_DT_F64, 2, 2, 3));
  IrValue *B = input(f, "B", ty(IR_DT_F64, 2, 3, 2));
  IrValue *v = input(f, "v", ty(IR_DT_F64, 1, 3));
  IrValue *X = input(f, "X", ty(IR_DT_F64, 3, 2, 2, 3));
  IrValue *P = input(f, "P", ty(IR_DT_F64, 4, 2, 1, 1, 2));
  IrValue *Q = input(f, "Q", ty(IR_DT_F64, 3, 3, 2, 1));
  IrValue *u = input(f, "u", ty(IR_DT_F64, 1, 2));
  IrValue *AB = bin(f, IR_OP_MATMUL, A, B), *vB = bin(f, IR_OP_MATMUL, v, B), *Av = bin(f, IR_OP_MATMUL, A, v);
  IrValue *vv = bin(f, IR_OP_MATMUL, v, v), *XB = bin(f, IR_OP_MATMUL, X, B), *PQ = bin(f, IR_OP_MATMUL, P, Q);
  IrValue *uQ = bin(f, IR_OP_MATMUL, u, Q);
  expect_shape(vB, 1, 2);
  expect_shape(Av, 1, 2);
  expect_shape(vv, 0);
  expect_shape(XB, 3, 2, 2, 2);
  expect_shape(PQ, 4, 2, 3, 1, 1);
  expect_shape(uQ, 2, 3, 1);
  double a[6] = {1, 2, 3, 4, 5, 6}, b[6] = {7, 8, 9, 10, 11, 12}, vd[3] = {1, 2, 3};
  double x[12] = {1, 2, 3, 4, 5, 6, 1, 0, 0, 0, 1, 0};
  double p[4] = {1, 0, 0, 1}, q[6] = {1, 2, 3, 4, 5, 6}, ud[2] = {1, 1};
  double *args[7] = {a, b, vd, x, p, q, ud};
  InterpState st;
  run_ok(&st, f, args, false);
  EXPECT(&st, AB, 0, 58, 64, 139, 154);
  EXPECT(&st, vB, 0, 58, 64);
  EXPECT(&st, Av, 0, 14, 32);
  EXPECT(&st, vv, 0, 14);
  EXPECT(&st, XB, 0, 58, 64, 139, 154, 7, 8, 9, 10);
  EXPECT(&st, PQ, 0, 1, 3, 5, 2, 4, 6); /* batch [2,1] x [3] broadcast to [2,3] */
  EXPECT(&st, uQ, 0, 3, 7, 11);
  interp_free(&st);
  ir_func_free(f);
}

/* ------------------------------------------------------------------ */
/* Row-wise NN ops                                                     */
/* ------------------------------------------------------------------ */

static void test_interp_softmax_and_norms(void **state) {
  (void)state;
  IrFunc *f = ir_func_new("n");
  IrValue *x = input(f, "x", ty(IR_DT_F64, 2, 2, 2));
  IrValue *h = input(f, "h", ty(IR_DT_F64, 2, 1, 4));
  IrValue *w = input(f, "w", ty(IR_DT_F64, 1, 4));
  IrValue *b = input(f, "b", ty(IR_DT_F64, 1, 4));
  IrValue *r = input(f, "r", ty(IR_DT_F64, 1, 2));
  IrValue *rw = input(f, "rw", ty(IR_DT_F64, 1, 2));
  IrValue *sm = un1(f, IR_OP_SOFTMAX, x, ir_attr_int("axis", -1));
  IrValue *lsm = un1(f, IR_OP_LOG_SOFTMAX, x, ir_attr_int("axis", -1));
  IrValue *sm0 = un1(f, IR_OP_SOFTMAX, x, ir_attr_int("axis", 0));
  IrAttr eps = ir_attr_float("eps", 1e-5);
  IrValue *lnargs[3] = {h, w, b};
  IrValue *ln = build(f, IR_OP_LAYER_NORM, lnargs, 3, &eps, 1, NULL);
  IrAttr eps0 = ir_attr_float("eps", 0);
  IrValue *rmsargs[2] = {r, rw};
  IrValue *rms = build(f, IR_OP_RMS_NORM, rmsargs, 2, &eps0, 1, NULL);
  double l3 = log(3.0);
  double xv[4] = {0, l3, 1000, 1000 + l3}, hv[4] = {1, 2, 3, 4}, wv[4] = {1, 1, 2, 2}, bv[4] = {0, 0, 0, 1};
  double rv[2] = {3, 4}, rwv[2] = {1, 2};
  double *args[6] = {xv, hv, wv, bv, rv, rwv};
  InterpState st;
  run_ok(&st, f, args, true);
  EXPECT(&st, sm, 1e-12, 0.25, 0.75, 0.25, 0.75); /* stable for large values */
  EXPECT(&st, lsm, 1e-12, log(0.25), log(0.75), log(0.25), log(0.75));
  EXPECT(&st, sm0, 1e-12, 0, 0, 1, 1);
  /* mean 2.5, biased variance 1.25; (4 - 2.5) / sqrt(1.25 + 1e-5) = 1.3416354199689269 */
  double z = 1.3416354199689269;
  EXPECT(&st, ln, 1e-12, -z, -z / 3, 2 * z / 3, 2 * z + 1);
  /* mean(x^2) = 12.5: x / sqrt(12.5) * w */
  EXPECT(&st, rms, 1e-12, 3 / sqrt(12.5), 8 / sqrt(12.5));
  interp_free(&st);
  ir_func_free(f);
}

static void test_interp_causal_mask(void **state) {
  (void)state;
  IrFunc *f = ir_func_new("c");
  IrValue *x = input(f, "x", ty(IR_DT_F32, 3, 2, 2, 3));
  IrValue *m = un(f, IR_OP_CAUSAL_MASK, x);
  double xv[12] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
  double *args[1] = {xv};
  InterpState st;
  run_ok(&st, f, args, false);
  double ni = -INFINITY;
  EXPECT(&st, m, 0, 1, ni, ni, 4, 5, ni, 7, ni, ni, 10, 11, ni);
  interp_free(&st);
  ir_func_free(f);
}

/* ------------------------------------------------------------------ */
/* Indices, losses                                                     */
/* ------------------------------------------------------------------ */

static void test_interp_embedding(void **state) {
  (void)state;
  IrFunc *f = ir_func_new("e");
  IrValue *idx = input(f, "idx", ty(IR_DT_I32, 2, 2, 2));
  IrValue *tab = input(f, "tab", ty(IR_DT_F32, 2, 4, 2));
  IrValue *i3 = input(f, "i3", ty(IR_DT_I32, 1, 3));
  IrValue *dy = input(f, "dy", ty(IR_DT_F32, 2, 3, 2));
  IrValue *e = bin(f, IR_OP_EMBEDDING, idx, tab);
  IrValue *gargs[2] = {i3, dy};
  IrAttr rows = ir_attr_int("rows", 4);
  IrValue *g = build(f, IR_OP_EMBEDDING_GRAD, gargs, 2, &rows, 1, NULL);
  expect_shape(e, 3, 2, 2, 2);
  expect_shape(g, 2, 4, 2);
  double iv[4] = {3, 0, 1, 3}, tv[8] = {0, 1, 10, 11, 20, 21, 30, 31}, i3v[3] = {1, 3, 1}, dyv[6] = {1, 2, 3, 4, 5, 6};
  double *args[4] = {iv, tv, i3v, dyv};
  InterpState st;
  run_ok(&st, f, args, false);
  EXPECT(&st, e, 0, 30, 31, 0, 1, 10, 11, 30, 31);
  EXPECT(&st, g, 0, 0, 0, 6, 8, 0, 0, 3, 4); /* rows 1 gets two contributions */
  interp_free(&st);
  ir_func_free(f);
}

static void test_interp_embedding_index_out_of_range(void **state) {
  (void)state;
  IrFunc *f = ir_func_new("e");
  IrValue *idx = input(f, "idx", ty(IR_DT_I32, 1, 2));
  IrValue *tab = input(f, "tab", ty(IR_DT_F32, 2, 96, 1));
  bin(f, IR_OP_EMBEDDING, idx, tab);
  double iv[2] = {5, 120}, tv[96] = {0};
  double *args[2] = {iv, tv};
  InterpState st;
  char err[512];
  assert_false(run(&st, f, args, false, err));
  assert_string_equal(err, "embedding: index 120 out of range [0, 96)");
  interp_free(&st); /* harmless after a failed run */
  iv[1] = -1;
  assert_false(run(&st, f, args, false, err));
  assert_string_equal(err, "embedding: index -1 out of range [0, 96)");
  ir_func_free(f);
}

static IrValue *cross_entropy(IrFunc *f, IrValue *lg, IrValue *tg, int64_t ignore, const char *red) {
  IrValue *args[2] = {lg, tg};
  IrAttr a[2] = {ir_attr_int("ignore_index", ignore), ir_attr_str("reduction", red)};
  return build(f, IR_OP_CROSS_ENTROPY, args, 2, a, 2, NULL);
}

static void test_interp_cross_entropy(void **state) {
  (void)state;
  IrFunc *f = ir_func_new("ce");
  IrValue *lg = input(f, "logits", ty(IR_DT_F64, 2, 3, 3));
  IrValue *tg = input(f, "target", ty(IR_DT_I32, 1, 3));
  IrValue *none = cross_entropy(f, lg, tg, -100, "none"), *sum = cross_entropy(f, lg, tg, -100, "sum");
  IrValue *mean = cross_entropy(f, lg, tg, -100, "mean");
  expect_shape(none, 1, 3);
  expect_shape(mean, 0);
  double lv[9] = {0, 0, 0, 1, 2, 3, 1e4, 0, 0}, tv[3] = {1, 2, -100};
  double *args[2] = {lv, tv};
  InterpState st;
  run_ok(&st, f, args, true);
  /* row 0: log 3; row 1: log(e + e^2 + e^3) - 3 = log(1 + e^-1 + e^-2); row 2 ignored */
  double r1 = 0.4076059644443804;
  EXPECT(&st, none, 1e-14, log(3.0), r1, 0);
  EXPECT(&st, sum, 1e-14, log(3.0) + r1);
  EXPECT(&st, mean, 1e-14, (log(3.0) + r1) / 2); /* over the 2 valid targets */
  interp_free(&st);

  /* All targets ignored: mean is 0, not NaN. */
  double all[3] = {-100, -100, -100};
  args[1] = all;
  run_ok(&st, f, args, true);
  EXPECT(&st, mean, 0, 0);
  EXPECT(&st, sum, 0, 0);
  interp_free(&st);

  /* A target outside [0, V) that is not ignore_index. */
  double bad[3] = {1, 5, 0};
  args[1] = bad;
  char err[512];
  assert_false(run(&st, f, args, true, err));
  assert_string_equal(err, "cross_entropy: target 5 out of range [0, 3)");
  ir_func_free(f);

  /* A custom ignore_index; -100 is then an ordinary (invalid) target. */
  f = ir_func_new("ce2");
  lg = input(f, "logits", ty(IR_DT_F64, 2, 3, 3));
  tg = input(f, "target", ty(IR_DT_I32, 1, 3));
  mean = cross_entropy(f, lg, tg, 2, "mean");
  double t2[3] = {1, 2, 0};
  args[1] = t2;
  run_ok(&st, f, args, true);
  EXPECT(&st, mean, 1e-12, log(3.0) / 2); /* row 1 ignored; row 2: log(1 + 2 e^-1e4) = 0 */
  interp_free(&st);
  args[1] = tv;
  assert_false(run(&st, f, args, true, err));
  assert_string_equal(err, "cross_entropy: target -100 out of range [0, 3)");
  ir_func_free(f);
}

static void test_interp_one_hot_and_mse(void **state) {
  (void)state;
  IrFunc *f = ir_func_new("o");
  IrValue *t = input(f, "t", ty(IR_DT_I32, 1, 3));
  IrValue *a = input(f, "a", ty(IR_DT_F32, 1, 3));
  IrValue *b = input(f, "b", ty(IR_DT_F32, 1, 3));
  IrAttr oa[2] = {ir_attr_int("depth", 3), ir_attr_int("ignore_index", -100)};
  IrType oht = ty(IR_DT_F32, 2, 3, 3);
  IrValue *oh = build(f, IR_OP_ONE_HOT, &t, 1, oa, 2, &oht);
  IrValue *ab[2] = {a, b};
  IrAttr rn = ir_attr_str("reduction", "none"), rs = ir_attr_str("reduction", "sum"),
         rm = ir_attr_str("reduction", "mean");
  IrValue *mn = build(f, IR_OP_MSE_LOSS, ab, 2, &rn, 1, NULL);
  IrValue *ms = build(f, IR_OP_MSE_LOSS, ab, 2, &rs, 1, NULL);
  IrValue *mm = build(f, IR_OP_MSE_LOSS, ab, 2, &rm, 1, NULL);
  double tv[3] = {2, -100, 0}, av[3] = {1, 2, 3}, bv[3] = {1, 0, 6};
  double *args[3] = {tv, av, bv};
  InterpState st;
  run_ok(&st, f, args, false);
  EXPECT(&st, oh, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0);
  EXPECT(&st, mn, 0, 0, 4, 9);
  EXPECT(&st, ms, 0, 13);
  EXPECT(&st, mm, 0, (double)(13.0f / 3.0f));
  interp_free(&st);
  double bad[3] = {3, 0, 0};
  args[0] = bad;
  char err[512];
  assert_false(run(&st, f, args, false, err));
  assert_string_equal(err, "one_hot: target 3 out of range [0, 3)");
  ir_func_free(f);
}

/* ------------------------------------------------------------------ */
/* Data movement                                                       */
/* ------------------------------------------------------------------ */

static void test_interp_movement_ops(void **state) {
  (void)state;
  IrFunc *f = ir_func_new("mv");
  IrValue *x = input(f, "x", ty(IR_DT_F64, 2, 2, 3));
  IrValue *y = input(f, "y", ty(IR_DT_F64, 3, 2, 3, 4));
  IrValue *g = input(f, "g", ty(IR_DT_F64, 2, 4, 5));
  IrValue *c = input(f, "c", ty(IR_DT_F64, 2, 2, 1));
  int64_t s32[2] = {3, 2}, p10[2] = {1, 0}, p201[3] = {2, 0, 1}, s23[2] = {2, 3};
  IrValue *rs = un1(f, IR_OP_RESHAPE, x, ir_attr_ints("shape", s32, 2));
  IrValue *pt = un1(f, IR_OP_PERMUTE, x, ir_attr_ints("perm", p10, 2));
  IrValue *p3 = un1(f, IR_OP_PERMUTE, y, ir_attr_ints("perm", p201, 3));
  IrValue *bc = un1(f, IR_OP_BROADCAST, c, ir_attr_ints("shape", s23, 2));
  int64_t st0[2] = {1, 0}, sp0[2] = {4, 5}, stp[2] = {2, 2}, full[2] = {4, 5};
  IrAttr sa[3] = {ir_attr_ints("starts", st0, 2), ir_attr_ints("stops", sp0, 2), ir_attr_ints("steps", stp, 2)};
  IrValue *sl = build(f, IR_OP_SLICE, &g, 1, sa, 3, NULL);
  IrAttr ua[4] = {ir_attr_ints("shape", full, 2), sa[0], sa[1], sa[2]};
  IrValue *us = build(f, IR_OP_UNSLICE, &x, 1, ua, 4, NULL);
  IrValue *cargs[2] = {c, x};
  IrAttr ax1 = ir_attr_int("axis", 1), ax0 = ir_attr_int("axis", -2);
  IrValue *cc = build(f, IR_OP_CONCAT, cargs, 2, &ax1, 1, NULL);
  IrValue *c0args[2] = {x, x};
  IrValue *c0 = build(f, IR_OP_CONCAT, c0args, 2, &ax0, 1, NULL);
  expect_shape(p3, 3, 4, 2, 3);
  expect_shape(sl, 2, 2, 3);
  expect_shape(cc, 2, 2, 4);
  double xv[6] = {1, 2, 3, 4, 5, 6}, yv[24], gv[20], cv[2] = {-1, -2};
  for (int i = 0; i < 24; i++) yv[i] = i;
  for (int i = 0; i < 20; i++) gv[i] = i;
  double *args[4] = {xv, yv, gv, cv};
  InterpState st;
  run_ok(&st, f, args, false);
  EXPECT(&st, rs, 0, 1, 2, 3, 4, 5, 6);
  EXPECT(&st, pt, 0, 1, 4, 2, 5, 3, 6);
  /* p3[k][i][j] = y[i][j][k] = 12 i + 4 j + k */
  for (int k = 0; k < 4; k++)
    for (int i = 0; i < 2; i++)
      for (int j = 0; j < 3; j++) assert_true(st.val[p3->id][k * 6 + i * 3 + j] == 12 * i + 4 * j + k);
  EXPECT(&st, bc, 0, -1, -1, -1, -2, -2, -2);
  EXPECT(&st, sl, 0, 5, 7, 9, 15, 17, 19); /* rows 1 and 3, columns 0, 2, 4 */
  EXPECT(&st, us, 0, 0, 0, 0, 0, 0, 1, 0, 2, 0, 3, 0, 0, 0, 0, 0, 4, 0, 5, 0, 6);
  EXPECT(&st, cc, 0, -1, 1, 2, 3, -2, 4, 5, 6);
  EXPECT(&st, c0, 0, 1, 2, 3, 4, 5, 6, 1, 2, 3, 4, 5, 6);
  interp_free(&st);
  ir_func_free(f);
}

/* ------------------------------------------------------------------ */
/* Window ops, phases, collectives                                     */
/* ------------------------------------------------------------------ */

static IrValue *collective(IrFunc *f, IrOpcode opc, IrValue *x, int ranks, bool axis) {
  IrAttr a[3] = {ir_attr_str("group", "dp"), ir_attr_int("ranks", ranks), ir_attr_int("axis", 0)};
  return build(f, opc, &x, 1, a, axis ? 3 : 2, NULL);
}

static void test_interp_window_phases(void **state) {
  (void)state;
  IrFunc *f = ir_func_new("w");
  IrValue *x = input(f, "x", ty(IR_DT_F32, 1, 3));
  IrValue *idx = input(f, "idx", ty(IR_DT_I32, 1, 1));
  IrValue *tab = input(f, "tab", ty(IR_DT_F32, 2, 2, 1));
  IrValue *s = reduce(f, IR_OP_SUM, x, NULL, 0, false);
  IrValue *ws = un(f, IR_OP_WINDOW_SUM, s);
  IrValue *seed = un1(f, IR_OP_GRAD_SEED, ws, ir_attr_float("coef", 0.5));
  IrValue *term = bin(f, IR_OP_LOSS_TERM, s, seed);
  IrValue *emb = bin(f, IR_OP_EMBEDDING, idx, tab); /* fails at run time: idx is 7 */
  IrAttr ln = ir_attr_str("name", "l");
  build(f, IR_OP_LOSS, &term, 1, &ln, 1, NULL);
  double xv[3] = {1, 2, 3}, iv[1] = {7}, tv[2] = {0, 0};
  double *args[3] = {xv, iv, tv};
  InterpState st;
  char err[512];
  /* Count phase: it checks index operands before anything else runs. */
  assert_false(interp_run(&st, f, args, NULL, INTERP_COUNT, NULL, err, sizeof err));
  assert_string_equal(err, "embedding: index 7 (element 0) out of range [0, 2)");
  iv[0] = 1;
  /* Then only the window.sum operand's cone (and the indices) run. */
  assert_true(interp_run(&st, f, args, NULL, INTERP_COUNT, NULL, err, sizeof err));
  EXPECT(&st, s, 0, 6);
  assert_null(st.val[ws->id]);
  assert_null(st.val[seed->id]);
  assert_null(st.val[emb->id]);
  interp_free(&st);
  /* The plan a program finds once: the sum (the window.sum operand's
   * cone), the window.sum, the embedding's index check; x and idx read,
   * the table not. */
  InterpCountPlan *plan = interp_count_plan_new(f);
  assert_int_equal(plan->nops, 1);
  assert_ptr_equal(plan->ops[0], s->def);
  assert_int_equal(plan->nsums, 1);
  assert_ptr_equal(plan->sums[0], ws->def);
  assert_int_equal(plan->nchecks, 1);
  assert_ptr_equal(plan->checks[0], emb->def);
  assert_true(plan->arg_needed[0] && plan->arg_needed[1]);
  assert_false(plan->arg_needed[2]);
  /* Run by the plan, the count phase computes and checks the same. */
  InterpOptions po = {.count = plan};
  assert_true(interp_run(&st, f, args, NULL, INTERP_COUNT, &po, err, sizeof err));
  EXPECT(&st, s, 0, 6);
  assert_null(st.val[emb->id]);
  interp_free(&st);
  iv[0] = 7;
  assert_false(interp_run(&st, f, args, NULL, INTERP_COUNT, &po, err, sizeof err));
  assert_string_equal(err, "embedding: index 7 (element 0) out of range [0, 2)");
  iv[0] = 1;
  interp_count_plan_free(plan);
  /* Step phase: window.sum comes from the window sums. */
  double **sums = calloc((size_t)f->nvalues, sizeof(double *));
  double w = 10;
  sums[ws->id] = &w;
  tv[0] = 0;
  iv[0] = 1;
  assert_true(interp_run(&st, f, args, sums, INTERP_STEP, NULL, err, sizeof err));
  EXPECT(&st, ws, 0, 10);
  EXPECT(&st, seed, 0, 5);
  EXPECT(&st, term, 0, 30);
  interp_free(&st);
  iv[0] = 7;
  assert_false(interp_run(&st, f, args, sums, INTERP_STEP, NULL, err, sizeof err));
  assert_string_equal(err, "embedding: index 7 out of range [0, 2)");
  /* Step phase without window sums is an error, not a crash. */
  iv[0] = 0;
  assert_false(interp_run(&st, f, args, NULL, INTERP_STEP, NULL, err, sizeof err));
  free(sums);
  ir_func_free(f);
}

static void test_interp_collectives_single_process(void **state) {
  (void)state;
  IrFunc *f = ir_func_new("c");
  IrValue *x = input(f, "x", ty(IR_DT_F32, 1, 2));
  IrValue *ar = collective(f, IR_OP_ALL_REDUCE_START, x, 1, false);
  IrValue *arw = un(f, IR_OP_ALL_REDUCE_WAIT, ar);
  IrValue *ag = collective(f, IR_OP_ALL_GATHER_START, x, 1, true);
  IrValue *agw = un(f, IR_OP_ALL_GATHER_WAIT, ag);
  IrValue *rs = collective(f, IR_OP_REDUCE_SCATTER_START, x, 1, true);
  IrValue *rsw = un(f, IR_OP_REDUCE_SCATTER_WAIT, rs);
  double xv[2] = {1.5, -2};
  double *args[1] = {xv};
  InterpState st;
  run_ok(&st, f, args, false);
  EXPECT(&st, arw, 0, 1.5, -2);
  EXPECT(&st, agw, 0, 1.5, -2);
  EXPECT(&st, rsw, 0, 1.5, -2);
  interp_free(&st);
  ir_func_free(f);

  f = ir_func_new("c2");
  x = input(f, "x", ty(IR_DT_F32, 1, 2));
  un(f, IR_OP_ALL_REDUCE_WAIT, collective(f, IR_OP_ALL_REDUCE_START, x, 2, false));
  char err[512];
  assert_false(run(&st, f, args, false, err));
  assert_non_null(strstr(err, "collectives need a distributed runtime"));
  ir_func_free(f);
}

/* ------------------------------------------------------------------ */
/* Folding agrees with the interpreter                                 */
/* ------------------------------------------------------------------ */

/* NaN, infinities, signed zeros and a few ordinary values. */
static const double edges[] = {NAN, INFINITY, -INFINITY, 0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 30.0, -30.0, 1e-310};
/* The same values as .gdl number expressions. */
static const char *const edge_src[] = {"sqrt(-1.0)", "exp(1000.0)", "-exp(1000.0)", "0.0", "-0.0", "1.0", "-1.0",
                                       "0.5", "-0.5", "30.0", "-30.0", "1e-310"};

static bool same_value(double a, double b) { return isnan(a) ? isnan(b) : a == b && signbit(a) == signbit(b); }

/* opc on v in the interpreter (f64, so no rounding); p: pow's exponent. */
static double interp_unary(IrOpcode opc, double v, double p) {
  IrFunc *f = ir_func_new("u");
  IrType t = ty(IR_DT_F64, 0);
  IrValue *x = input(f, "x", t);
  IrAttr e = ir_attr_float("exponent", p);
  IrValue *y = build(f, opc, &x, 1, &e, opc == IR_OP_POW, opc == IR_OP_CAST ? &t : NULL);
  double *args[] = {&v};
  InterpState st;
  run_ok(&st, f, args, false);
  double r = st.val[y->id][0];
  interp_free(&st);
  ir_func_free(f);
  return r;
}

/* opc on a const v after simplify (only ops it folds). */
static double simplify_unary(IrOpcode opc, double v, double p) {
  IrFunc *f = ir_func_new("s");
  IrType t = ty(IR_DT_F64, 0);
  IrAttr e = ir_attr_float("exponent", p);
  IrValue *c = cnst(f, v, t);
  IrValue *y = build(f, opc, &c, 1, &e, opc == IR_OP_POW, opc == IR_OP_CAST ? &t : NULL);
  IrAttr name = ir_attr_str("name", "l");
  char err[512];
  assert_non_null(ir_build(f, IR_OP_LOSS, &y, 1, &name, 1, NULL, noloc, err, sizeof err));
  PassOptions o = {.gas = 1};
  Arena scratch;
  arena_init(&scratch);
  assert_int_equal(pass_simplify(f, &o, &scratch), PASS_CHANGED);
  arena_free(&scratch);
  const IrOp *loss = f->ops[f->nops - 1];
  assert_int_equal(loss->opcode, IR_OP_LOSS);
  assert_non_null(loss->args[0]->def);
  assert_int_equal(loss->args[0]->def->opcode, IR_OP_CONST);
  double r = ir_attr_get_float(loss->args[0]->def, "value", 0);
  ir_func_free(f);
  return r;
}

/* The number the frontend folds `expr` to, as the f64 const it makes of it. */
static double frontend_fold(const char *expr) {
  char text[512];
  snprintf(text, sizeof text, "model m {\n  input x : f64\n  loss s = x * (%s)\n}\n", expr);
  Diag d;
  FeModel *m = tu_compile("t.gdl", text, 1, &d);
  if (!m) fail_msg("%s: %s", expr, sb_str(&d.log));
  diag_free(&d);
  const IrOp *c = NULL;
  for (int i = 0; i < m->func->nops && !c; i++)
    if (m->func->ops[i]->opcode == IR_OP_CONST) c = m->func->ops[i];
  assert_non_null(c);
  double r = ir_attr_get_float(c, "value", 0);
  fe_model_free(m);
  return r;
}

/* Every unary elementwise op: the interpreter, ir_scalar_unary, simplify's
 * folding and the frontend's folding give the same value on edge inputs. */
static void test_interp_folding_agrees_on_edge_values(void **state) {
  (void)state;
  static const double exps[] = {3.0, 0.5, -1.0};
  for (int k = 0; k < IR_OP_COUNT; k++) {
    IrOpcode opc = (IrOpcode)k;
    if (!ir_op_is(opc, IR_OPF_UNARY)) continue;
    const char *name = ir_op_info[k].name;
    bool builtin = opc == IR_OP_EXP || opc == IR_OP_LOG || opc == IR_OP_SQRT || opc == IR_OP_RSQRT ||
                   opc == IR_OP_TANH || opc == IR_OP_SIGMOID || opc == IR_OP_RELU || opc == IR_OP_GELU ||
                   opc == IR_OP_SILU || opc == IR_OP_ABS;
    for (int ie = 0; ie < (opc == IR_OP_POW ? 3 : 1); ie++) {
      double p = exps[ie];
      for (size_t i = 0; i < sizeof edges / sizeof edges[0]; i++) {
        double v = edges[i];
        double want = interp_unary(opc, v, p);
        double got = opc == IR_OP_CAST ? ir_scalar_cast(v, IR_DT_F64) : ir_scalar_unary(opc, v, p);
        if (!same_value(got, want)) fail_msg("%s(%g): ir/scalar %.17g, interpreter %.17g", name, v, got, want);
        if (ir_op_is(opc, IR_OPF_FOLD) && !same_value(got = simplify_unary(opc, v, p), want))
          fail_msg("%s(%g): simplify folds to %.17g, interpreter %.17g", name, v, got, want);
        char expr[128];
        if (builtin) snprintf(expr, sizeof expr, "%s(%s)", name, edge_src[i]);
        else if (opc == IR_OP_NEG) snprintf(expr, sizeof expr, "-(%s)", edge_src[i]);
        else if (opc == IR_OP_POW) snprintf(expr, sizeof expr, "(%s) ** %.1f", edge_src[i], p);
        else continue; /* no number form in .gdl */
        if (!same_value(got = frontend_fold(expr), want))
          fail_msg("%s: the frontend folds to %.17g, interpreter %.17g", expr, got, want);
      }
    }
  }
  /* The one fix this agreement brought: torch.relu(NaN) is NaN. */
  assert_true(isnan(frontend_fold("relu(sqrt(-1.0))")));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_interp_rounds_results_to_dtype),
      cmocka_unit_test(test_interp_folding_agrees_on_edge_values),
      cmocka_unit_test(test_interp_unary_ops),
      cmocka_unit_test(test_interp_sigmoid_is_stable),
      cmocka_unit_test(test_interp_binary_ops_broadcast),
      cmocka_unit_test(test_interp_integer_ops),
      cmocka_unit_test(test_interp_cast),
      cmocka_unit_test(test_interp_reductions),
      cmocka_unit_test(test_interp_matmul_rules),
      cmocka_unit_test(test_interp_softmax_and_norms),
      cmocka_unit_test(test_interp_causal_mask),
      cmocka_unit_test(test_interp_embedding),
      cmocka_unit_test(test_interp_embedding_index_out_of_range),
      cmocka_unit_test(test_interp_cross_entropy),
      cmocka_unit_test(test_interp_one_hot_and_mse),
      cmocka_unit_test(test_interp_movement_ops),
      cmocka_unit_test(test_interp_window_phases),
      cmocka_unit_test(test_interp_collectives_single_process),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
