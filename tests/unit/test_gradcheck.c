/* test_gradcheck.c - derivative rules where finite differences cannot
 * judge them, and a composite.  Every differentiable op's rule is checked
 * against central finite differences row by row in the op-case table
 * (tests/ops/, test_ops_gradcheck); here: the non-smooth points, against
 * hand-derived torch values (ties in max split evenly, maximum/minimum at
 * equality half/half, relu/abs at 0, pow with exponent 0, cross-entropy
 * with every target ignored), and a two-layer MLP whose gradients are
 * checked by finite differences as a whole.
 *
 * Method: build f(params...) by hand over f64 params, objective
 * L = sum(op(...) * R) with a fixed random R (an input) so every output
 * element matters; run pass_autodiff; evaluate the gradients with the
 * reference interpreter in exact f64 mode (and, for the MLP, compare them
 * with (L(x + h e_i) - L(x - h e_i)) / 2h, h = 1e-6, to a relative
 * tolerance of 1e-6 on the norm).  Every test also checks that no dead
 * backward op was emitted. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "passes/passes.h"
#include "runtime/runtime.h"
#include "testutil.h"

#define SH(...) ir_shape_make((int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)), (int64_t[]){__VA_ARGS__})
#define GC_MAX_ARGS 16
#define FD_H 1e-6
#define FD_TOL 1e-6

static const IrLoc L0 = {"gc.gir", 1, 1};

/* ------------------------------------------------------------------ */
/* Harness                                                             */
/* ------------------------------------------------------------------ */

typedef struct Gc {
  IrFunc *f;
  Rng rng;
  double *val[GC_MAX_ARGS]; /* by argument index */
  IrValue *R;               /* the objective's random weights */
  IrValue *L;               /* the objective */
  int nfwd;                 /* forward ops (before autodiff) */
} Gc;

static void gc_init(Gc *g, uint64_t seed) {
  memset(g, 0, sizeof *g);
  g->f = ir_func_new("gc");
  rng_seed(&g->rng, seed);
}

static void gc_free(Gc *g) {
  for (int i = 0; i < g->f->nargs; i++) free(g->val[i]);
  ir_func_free(g->f);
}

static int arg_index(Gc *g, IrValue *v) {
  for (int i = 0; i < g->f->nargs; i++)
    if (g->f->args[i] == v) return i;
  fail_msg("not an argument");
  return -1;
}

/* dist: 0 normal, 1 uniform in [0.5, 2) (positive domain) */
static IrValue *gc_arg(Gc *g, const char *name, IrDType dt, IrShape s, IrArgRole role, int dist) {
  IrType t = {dt, s};
  IrValue *v = ir_func_add_arg(g->f, name, t, role, false);
  int i = g->f->nargs - 1;
  assert_true(i < GC_MAX_ARGS);
  int64_t n = ir_numel(&s);
  g->val[i] = calloc((size_t)(n > 0 ? n : 1), sizeof(double));
  for (int64_t k = 0; k < n; k++)
    g->val[i][k] = dist == 1 ? 0.5 + 1.5 * rng_uniform(&g->rng) : rng_normal(&g->rng);
  return v;
}

static IrValue *gc_param(Gc *g, const char *name, IrShape s) { return gc_arg(g, name, IR_DT_F64, s, IR_ARG_PARAM, 0); }

static void gc_set(Gc *g, IrValue *a, const double *v) {
  int i = arg_index(g, a);
  int64_t n = ir_numel(&a->type.shape);
  memcpy(g->val[i], v, sizeof(double) * (size_t)n);
}

static IrValue *gc_input_i32(Gc *g, const char *name, IrShape s, const int *v) {
  IrValue *a = gc_arg(g, name, IR_DT_I32, s, IR_ARG_INPUT, 0);
  double *d = g->val[arg_index(g, a)];
  for (int64_t k = 0; k < ir_numel(&s); k++) d[k] = v[k];
  return a;
}

/* Objective L = sum(y * R), then autodiff. */
static void gc_finish(Gc *g, IrValue *y) {
  IrFunc *f = g->f;
  g->R = gc_arg(g, "R", y->type.dtype, y->type.shape, IR_ARG_INPUT, 0);
  IrValue *p = ir_binary(f, IR_OP_MUL, y, g->R, L0);
  g->L = ir_reduce(f, IR_OP_SUM, p, NULL, 0, false, L0);
  IrAttr a = ir_attr_str("name", "L");
  IrValue *args[1] = {g->L};
  IrOp *op = ir_build(f, IR_OP_LOSS, args, 1, &a, 1, NULL, L0, NULL, 0);
  assert_non_null(op);
  g->nfwd = f->nops;
  Arena scratch;
  arena_init(&scratch);
  PassOptions o = {.gas = 1};
  PassResult r = pass_autodiff(f, &o, &scratch);
  arena_free(&scratch);
  assert_int_equal(r, PASS_CHANGED);
  char err[512] = "";
  if (!ir_verify(f, err, sizeof err)) fail_msg("verifier after autodiff: %s", err);
}

/* No dead backward: every op appended by autodiff feeds some `grad` output. */
static void check_no_dead_backward(Gc *g) {
  IrFunc *f = g->f;
  bool *live = calloc((size_t)f->nvalues, sizeof(bool));
  for (int i = f->nops - 1; i >= 0; i--) {
    IrOp *op = f->ops[i];
    bool l = op->opcode == IR_OP_GRAD || (op->result && live[op->result->id]);
    if (!l) continue;
    for (int j = 0; j < op->nargs; j++) live[op->args[j]->id] = true;
  }
  for (int i = g->nfwd; i < f->nops; i++) {
    IrOp *op = f->ops[i];
    if (op->opcode == IR_OP_GRAD) continue;
    if (!live[op->result->id]) fail_msg("dead backward op '%s' (op %d)", ir_op_info[op->opcode].name, i);
  }
  free(live);
}

static void gc_eval(Gc *g, InterpState *st) {
  char err[256] = "";
  InterpOptions opt = {.exact_f64 = true};
  double **ws = calloc((size_t)g->f->nvalues, sizeof(double *));
  bool ok = interp_run(st, g->f, g->val, ws, INTERP_STEP, &opt, err, sizeof err);
  free(ws);
  if (!ok) fail_msg("interp_run: %s", err);
}

static double gc_loss(Gc *g) {
  InterpState st;
  memset(&st, 0, sizeof st);
  gc_eval(g, &st);
  double l = st.val[g->L->id][0];
  interp_free(&st);
  return l;
}

/* The `grad` output of param p, or NULL. */
static IrOp *grad_op(Gc *g, IrValue *p) {
  for (int i = 0; i < g->f->nops; i++) {
    IrOp *op = g->f->ops[i];
    if (op->opcode == IR_OP_GRAD && strcmp(ir_attr_get_str(op, "name", ""), p->name) == 0) return op;
  }
  return NULL;
}

/* Analytic gradient of p (zeros if it has no grad output); malloc'd. */
static double *gc_grad(Gc *g, IrValue *p) {
  int64_t n = ir_numel(&p->type.shape);
  double *d = calloc((size_t)(n > 0 ? n : 1), sizeof(double));
  IrOp *op = grad_op(g, p);
  if (!op) return d;
  IrValue *gv = op->args[0];
  assert_true(ir_type_eq(&gv->type, &p->type));
  /* Named d<param>, unless another param shares the value (the later name stays). */
  bool shared = false;
  for (int i = 0; i < g->f->nops; i++)
    shared |= g->f->ops[i]->opcode == IR_OP_GRAD && g->f->ops[i] != op && g->f->ops[i]->args[0] == gv;
  char name[64];
  snprintf(name, sizeof name, "d%s", p->name);
  if (!shared) assert_string_equal(gv->name, name);
  InterpState st;
  memset(&st, 0, sizeof st);
  gc_eval(g, &st);
  assert_non_null(st.val[gv->id]);
  memcpy(d, st.val[gv->id], sizeof(double) * (size_t)n);
  interp_free(&st);
  return d;
}

/* Central finite differences of L with respect to p; malloc'd. */
static double *gc_fd(Gc *g, IrValue *p) {
  int i = arg_index(g, p);
  int64_t n = ir_numel(&p->type.shape);
  double *d = calloc((size_t)(n > 0 ? n : 1), sizeof(double));
  for (int64_t k = 0; k < n; k++) {
    double x0 = g->val[i][k];
    g->val[i][k] = x0 + FD_H;
    double lp = gc_loss(g);
    g->val[i][k] = x0 - FD_H;
    double lm = gc_loss(g);
    g->val[i][k] = x0;
    d[k] = (lp - lm) / (2 * FD_H);
  }
  return d;
}

static void compare(const char *what, const double *got, const double *want, int64_t n, double tol) {
  double err = 0, norm = 0;
  int64_t worst = 0;
  for (int64_t k = 0; k < n; k++) {
    if (!isfinite(got[k])) fail_msg("%s: element %lld is %g", what, (long long)k, got[k]);
    double e = (got[k] - want[k]) * (got[k] - want[k]);
    if (e > (got[worst] - want[worst]) * (got[worst] - want[worst])) worst = k;
    err += e;
    norm += want[k] * want[k];
  }
  err = sqrt(err);
  norm = sqrt(norm);
  if (err > tol * fmax(norm, 1e-2))
    fail_msg("%s: |got - want| = %g, |want| = %g; worst element %lld: got %.12g, want %.12g", what, err, norm,
             (long long)worst, got[worst], want[worst]);
}

/* Check every float param's gradient against finite differences. */
static void gc_check(Gc *g, IrValue *y) {
  gc_finish(g, y);
  check_no_dead_backward(g);
  for (int i = 0; i < g->f->nargs; i++) {
    IrValue *p = g->f->args[i];
    if (p->role != IR_ARG_PARAM || !ir_dtype_is_float(p->type.dtype)) continue;
    double *got = gc_grad(g, p), *want = gc_fd(g, p);
    char what[96];
    snprintf(what, sizeof what, "gradient of %s", p->name);
    compare(what, got, want, ir_numel(&p->type.shape), FD_TOL);
    free(got);
    free(want);
  }
}

/* Emit helpers. */
static IrValue *un(Gc *g, IrOpcode o, IrValue *x) { return ir_unary(g->f, o, x, L0); }
static IrValue *bin(Gc *g, IrOpcode o, IrValue *a, IrValue *b) { return ir_binary(g->f, o, a, b, L0); }
static IrValue *emit1(Gc *g, IrOpcode o, IrValue *x, const IrAttr *a, int na) {
  return ir_emit(g->f, o, &x, 1, a, na, NULL, L0);
}

/* ------------------------------------------------------------------ */
/* Elementwise                                                          */
/* ------------------------------------------------------------------ */

/* torch.pow(x, 0) has gradient 0 (not 0 * x^-1): x gets no grad output.
 * (The seed's backward up to the pow is dead here; dce removes it.) */
static void test_grad_pow_zero_exponent(void **state) {
  (void)state;
  Gc g;
  gc_init(&g, 26);
  IrValue *x = gc_param(&g, "x", SH(3));
  double xv[3] = {0.0, 1.0, -2.0};
  gc_set(&g, x, xv);
  IrAttr a = ir_attr_float("exponent", 0.0);
  gc_finish(&g, emit1(&g, IR_OP_POW, x, &a, 1));
  assert_null(grad_op(&g, x));
  double *d = gc_grad(&g, x);
  for (int i = 0; i < 3; i++) assert_true(d[i] == 0.0);
  free(d);
  gc_free(&g);
}

/* relu and abs at 0 give 0 (torch). */
static void test_grad_relu_abs_at_zero(void **state) {
  (void)state;
  IrOpcode ops[2] = {IR_OP_RELU, IR_OP_ABS};
  for (int k = 0; k < 2; k++) {
    Gc g;
    gc_init(&g, 27);
    IrValue *x = gc_param(&g, "x", SH(4));
    double xv[4] = {0.0, 1.5, -0.5, 0.0};
    gc_set(&g, x, xv);
    gc_finish(&g, un(&g, ops[k], x));
    double *d = gc_grad(&g, x);
    double *r = g.val[arg_index(&g, g.R)];
    double want_relu[4] = {0, r[1], 0, 0}, want_abs[4] = {0, r[1], -r[2], 0};
    for (int i = 0; i < 4; i++) assert_true(d[i] == (k == 0 ? want_relu : want_abs)[i]);
    free(d);
    gc_free(&g);
  }
}


/* maximum/minimum at ties split the gradient half/half (torch). */
static void test_grad_maximum_minimum_ties(void **state) {
  (void)state;
  for (int k = 0; k < 2; k++) {
    Gc g;
    gc_init(&g, 37);
    IrValue *a = gc_param(&g, "a", SH(4)), *b = gc_param(&g, "b", SH(4));
    double av[4] = {1, 2, 3, 4}, bv[4] = {1, 0, 3, 5};
    gc_set(&g, a, av);
    gc_set(&g, b, bv);
    gc_finish(&g, bin(&g, k == 0 ? IR_OP_MAXIMUM : IR_OP_MINIMUM, a, b));
    double *r = g.val[arg_index(&g, g.R)];
    double *da = gc_grad(&g, a), *db = gc_grad(&g, b);
    /* maximum: a wins at 1, b at 3; minimum the other way round. */
    double wa[4] = {0.5 * r[0], k == 0 ? r[1] : 0, 0.5 * r[2], k == 0 ? 0 : r[3]};
    double wb[4] = {0.5 * r[0], k == 0 ? 0 : r[1], 0.5 * r[2], k == 0 ? r[3] : 0};
    for (int i = 0; i < 4; i++) {
      assert_true(da[i] == wa[i]);
      assert_true(db[i] == wb[i]);
    }
    free(da);
    free(db);
    gc_free(&g);
  }
}

/* ------------------------------------------------------------------ */
/* Reductions                                                           */
/* ------------------------------------------------------------------ */


/* max splits the gradient evenly among ties (torch.amax), hand-derived. */
static void test_grad_max_ties_split_evenly(void **state) {
  (void)state;
  for (int keep = 0; keep < 2; keep++) {
    Gc g;
    gc_init(&g, 45);
    IrValue *x = gc_param(&g, "x", SH(3, 3));
    double xv[9] = {1, 3, 3, /**/ 2, 2, 2, /**/ -1, 0, -4};
    gc_set(&g, x, xv);
    int64_t ax = -1;
    gc_finish(&g, ir_reduce(g.f, IR_OP_MAX, x, &ax, 1, keep, L0));
    check_no_dead_backward(&g);
    double *r = g.val[arg_index(&g, g.R)];
    double *d = gc_grad(&g, x);
    double want[9] = {0, r[0] / 2, r[0] / 2, r[1] / 3, r[1] / 3, r[1] / 3, 0, r[2], 0};
    for (int i = 0; i < 9; i++) assert_true(fabs(d[i] - want[i]) <= 1e-15 * fabs(want[i]));
    free(d);
    gc_free(&g);
  }
}

/* ------------------------------------------------------------------ */
/* Neural-network ops                                                   */
/* ------------------------------------------------------------------ */

static IrValue *cross_entropy(Gc *g, IrValue *lg, IrValue *tg, int64_t ii, const char *red) {
  IrAttr a[2] = {ir_attr_int("ignore_index", ii), ir_attr_str("reduction", red)};
  IrValue *args[2] = {lg, tg};
  return ir_emit(g->f, IR_OP_CROSS_ENTROPY, args, 2, a, 2, NULL, L0);
}

/* Every target ignored: zero gradient, no NaN, for every reduction. */
static void test_grad_cross_entropy_all_ignored(void **state) {
  (void)state;
  const char *reds[3] = {"none", "sum", "mean"};
  for (int r = 0; r < 3; r++) {
    Gc g;
    gc_init(&g, 97);
    int t[3] = {-100, -100, -100};
    IrValue *tg = gc_input_i32(&g, "y", SH(3), t);
    IrValue *lg = gc_param(&g, "logits", SH(3, 4));
    gc_finish(&g, cross_entropy(&g, lg, tg, -100, reds[r]));
    check_no_dead_backward(&g);
    double *d = gc_grad(&g, lg);
    for (int i = 0; i < 12; i++) assert_true(d[i] == 0.0);
    free(d);
    gc_free(&g);
  }
}

/* A composite: a two-layer MLP with cross-entropy, bias broadcast and fan-out. */
static void test_grad_mlp(void **state) {
  (void)state;
  Gc g;
  gc_init(&g, 111);
  IrValue *x = gc_arg(&g, "x", IR_DT_F64, SH(3, 4), IR_ARG_INPUT, 0);
  int t[3] = {0, 2, 1};
  IrValue *y = gc_input_i32(&g, "y", SH(3), t);
  IrValue *w1 = gc_param(&g, "W1", SH(4, 5)), *b1 = gc_param(&g, "b1", SH(5)), *w2 = gc_param(&g, "W2", SH(5, 3));
  IrValue *h = un(&g, IR_OP_GELU, bin(&g, IR_OP_ADD, ir_matmul(g.f, x, w1, L0), b1));
  IrValue *ce = cross_entropy(&g, ir_matmul(g.f, h, w2, L0), y, -100, "mean");
  IrValue *l2 = ir_reduce(g.f, IR_OP_SUM, bin(&g, IR_OP_MUL, w1, w1), NULL, 0, false, L0);
  gc_check(&g, bin(&g, IR_OP_ADD, ce, bin(&g, IR_OP_MUL, l2, ir_const(g.f, 1e-2, IR_DT_F64, L0))));
  gc_free(&g);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_grad_pow_zero_exponent),
      cmocka_unit_test(test_grad_relu_abs_at_zero),
      cmocka_unit_test(test_grad_maximum_minimum_ties),
      cmocka_unit_test(test_grad_max_ties_split_evenly),
      cmocka_unit_test(test_grad_cross_entropy_all_ignored),
      cmocka_unit_test(test_grad_mlp),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
