/* test_gradcheck.c - every differentiable op's derivative rule against
 * central finite differences.
 *
 * Method: build f(params...) by hand over f64 params, objective
 * L = sum(op(...) * R) with a fixed random R (an input) so every output
 * element matters; run pass_autodiff; evaluate the gradients with the
 * reference interpreter in exact f64 mode and compare them with
 * (L(x + h e_i) - L(x - h e_i)) / 2h, h = 1e-6, to a relative tolerance of
 * 1e-6 on the norm.  Non-smooth points (ties in max, maximum at equality,
 * relu/abs at 0) are checked against hand-derived torch values instead.
 * Every test also checks that no dead backward op was emitted. */
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
static IrValue *gc_param_pos(Gc *g, const char *name, IrShape s) {
  return gc_arg(g, name, IR_DT_F64, s, IR_ARG_PARAM, 1);
}

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

static void check_unary(IrOpcode o, bool positive, uint64_t seed) {
  IrShape shapes[3] = {SH(5), SH(2, 3), SH(2, 1, 3)};
  for (int s = 0; s < 3; s++) {
    Gc g;
    gc_init(&g, seed + (uint64_t)s);
    IrValue *x = positive ? gc_param_pos(&g, "x", shapes[s]) : gc_param(&g, "x", shapes[s]);
    gc_check(&g, un(&g, o, x));
    gc_free(&g);
  }
}

static void test_grad_neg(void **state) { (void)state, check_unary(IR_OP_NEG, false, 1); }
static void test_grad_exp(void **state) { (void)state, check_unary(IR_OP_EXP, false, 2); }
static void test_grad_log(void **state) { (void)state, check_unary(IR_OP_LOG, true, 3); }
static void test_grad_sqrt(void **state) { (void)state, check_unary(IR_OP_SQRT, true, 4); }
static void test_grad_rsqrt(void **state) { (void)state, check_unary(IR_OP_RSQRT, true, 5); }
static void test_grad_tanh(void **state) { (void)state, check_unary(IR_OP_TANH, false, 6); }
static void test_grad_sigmoid(void **state) { (void)state, check_unary(IR_OP_SIGMOID, false, 7); }
static void test_grad_relu(void **state) { (void)state, check_unary(IR_OP_RELU, false, 8); }
static void test_grad_gelu(void **state) { (void)state, check_unary(IR_OP_GELU, false, 9); }
static void test_grad_silu(void **state) { (void)state, check_unary(IR_OP_SILU, false, 10); }
static void test_grad_abs(void **state) { (void)state, check_unary(IR_OP_ABS, false, 11); }

static void test_grad_pow(void **state) {
  (void)state;
  double es[] = {2.0, 3.0, 0.5, -1.5, 1.0, -2.0};
  for (int i = 0; i < 6; i++) {
    Gc g;
    gc_init(&g, 20 + (uint64_t)i);
    IrValue *x = gc_param_pos(&g, "x", SH(2, 3));
    IrAttr a = ir_attr_float("exponent", es[i]);
    gc_check(&g, emit1(&g, IR_OP_POW, x, &a, 1));
    gc_free(&g);
  }
}

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

/* f64 -> f32 -> objective in f32: dx is cast back to f64. */
static void test_grad_cast(void **state) {
  (void)state;
  Gc g;
  gc_init(&g, 28);
  IrValue *x = gc_param(&g, "x", SH(2, 3));
  IrValue *y = ir_cast(g.f, x, IR_DT_F32, L0);
  gc_check(&g, un(&g, IR_OP_TANH, y));
  gc_free(&g);
}

/* Binary ops over pairs of shapes, broadcasting included. */
static void check_binary(IrOpcode o, bool positive_b, uint64_t seed) {
  IrShape sa[5] = {SH(2, 3), SH(3, 1, 4), SH(4), SH(2, 3), SH(1, 3)};
  IrShape sb[5] = {SH(2, 3), SH(5, 4), SH(2, 3, 4), ir_shape_scalar(), SH(2, 1)};
  for (int s = 0; s < 5; s++) {
    Gc g;
    gc_init(&g, seed * 10 + (uint64_t)s);
    IrValue *a = gc_param(&g, "a", sa[s]);
    IrValue *b = positive_b ? gc_param_pos(&g, "b", sb[s]) : gc_param(&g, "b", sb[s]);
    gc_check(&g, bin(&g, o, a, b));
    gc_free(&g);
  }
}

static void test_grad_add(void **state) { (void)state, check_binary(IR_OP_ADD, false, 31); }
static void test_grad_sub(void **state) { (void)state, check_binary(IR_OP_SUB, false, 32); }
static void test_grad_mul(void **state) { (void)state, check_binary(IR_OP_MUL, false, 33); }
static void test_grad_div(void **state) { (void)state, check_binary(IR_OP_DIV, true, 34); }
static void test_grad_maximum(void **state) { (void)state, check_binary(IR_OP_MAXIMUM, false, 35); }
static void test_grad_minimum(void **state) { (void)state, check_binary(IR_OP_MINIMUM, false, 36); }

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

/* select(c > 0, a, b) with a [2,3] and b [3] broadcast. */
static void test_grad_select(void **state) {
  (void)state;
  Gc g;
  gc_init(&g, 38);
  IrValue *c = gc_arg(&g, "c", IR_DT_F64, SH(2, 3), IR_ARG_INPUT, 0);
  IrValue *a = gc_param(&g, "a", SH(2, 3)), *b = gc_param(&g, "b", SH(3));
  IrValue *cond = bin(&g, IR_OP_GT, c, ir_const(g.f, 0.0, IR_DT_F64, L0));
  gc_check(&g, ir_select(g.f, cond, a, b, L0));
  gc_free(&g);
}

/* ------------------------------------------------------------------ */
/* Reductions                                                           */
/* ------------------------------------------------------------------ */

static void check_reduce(IrOpcode o, uint64_t seed) {
  struct {
    IrShape s;
    int64_t axes[3];
    int n;
    bool keep;
  } cases[6] = {
      {SH(2, 3, 4), {1}, 1, false},     {SH(2, 3, 4), {0, 2}, 2, true}, {SH(2, 3, 4), {-1}, 1, false},
      {SH(2, 3, 4), {-3, -2}, 2, true}, {SH(5), {0}, 1, false},         {SH(2, 3), {0}, 0, false},
  };
  for (int k = 0; k < 6; k++) {
    Gc g;
    gc_init(&g, seed * 10 + (uint64_t)k);
    IrValue *x = gc_param(&g, "x", cases[k].s);
    gc_check(&g, ir_reduce(g.f, o, x, cases[k].axes, cases[k].n, cases[k].keep, L0));
    gc_free(&g);
  }
}

static void test_grad_sum(void **state) { (void)state, check_reduce(IR_OP_SUM, 41); }
static void test_grad_mean(void **state) { (void)state, check_reduce(IR_OP_MEAN, 42); }
static void test_grad_max(void **state) { (void)state, check_reduce(IR_OP_MAX, 43); }
static void test_grad_logsumexp(void **state) { (void)state, check_reduce(IR_OP_LOGSUMEXP, 44); }

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
/* Data movement                                                        */
/* ------------------------------------------------------------------ */

static void test_grad_reshape(void **state) {
  (void)state;
  Gc g;
  gc_init(&g, 51);
  IrValue *x = gc_param(&g, "x", SH(2, 6));
  gc_check(&g, un(&g, IR_OP_TANH, ir_reshape(g.f, x, SH(3, 2, 2), L0)));
  gc_free(&g);
}

static void test_grad_permute(void **state) {
  (void)state;
  int64_t perms[2][3] = {{2, 0, 1}, {1, 2, 0}};
  for (int k = 0; k < 2; k++) {
    Gc g;
    gc_init(&g, 52 + (uint64_t)k);
    IrValue *x = gc_param(&g, "x", SH(2, 3, 4));
    gc_check(&g, ir_permute(g.f, x, perms[k], L0));
    gc_free(&g);
  }
}

static void test_grad_broadcast(void **state) {
  (void)state;
  IrShape from[3] = {SH(3, 1), SH(4), ir_shape_scalar()};
  for (int k = 0; k < 3; k++) {
    Gc g;
    gc_init(&g, 54 + (uint64_t)k);
    IrValue *x = gc_param(&g, "x", from[k]);
    gc_check(&g, ir_broadcast(g.f, x, SH(2, 3, 4), L0));
    gc_free(&g);
  }
}

static IrValue *slice(Gc *g, IrValue *x, const int64_t *st, const int64_t *sp, const int64_t *stp) {
  int r = x->type.shape.rank;
  IrAttr a[3] = {ir_attr_ints("starts", st, r), ir_attr_ints("stops", sp, r), ir_attr_ints("steps", stp, r)};
  return emit1(g, IR_OP_SLICE, x, a, 3);
}

static void test_grad_slice(void **state) {
  (void)state;
  Gc g;
  gc_init(&g, 57);
  IrValue *x = gc_param(&g, "x", SH(4, 6));
  int64_t st[2] = {1, 0}, sp[2] = {3, 6}, stp[2] = {1, 2};
  gc_check(&g, slice(&g, x, st, sp, stp));
  gc_free(&g);
}

static void test_grad_unslice(void **state) {
  (void)state;
  Gc g;
  gc_init(&g, 58);
  IrValue *x = gc_param(&g, "x", SH(2, 3));
  int64_t st[2] = {1, 0}, sp[2] = {3, 6}, stp[2] = {1, 2}, full[2] = {4, 6};
  IrAttr a[4] = {ir_attr_ints("starts", st, 2), ir_attr_ints("stops", sp, 2), ir_attr_ints("steps", stp, 2),
                 ir_attr_ints("shape", full, 2)};
  gc_check(&g, emit1(&g, IR_OP_UNSLICE, x, a, 4));
  gc_free(&g);
}

static void test_grad_concat(void **state) {
  (void)state;
  int64_t axes[2] = {-1, 0};
  for (int k = 0; k < 2; k++) {
    Gc g;
    gc_init(&g, 59 + (uint64_t)k);
    IrValue *a = gc_param(&g, "a", k == 0 ? SH(2, 3) : SH(1, 4));
    IrValue *b = gc_param(&g, "b", k == 0 ? SH(2, 1) : SH(3, 4));
    IrValue *c = gc_param(&g, "c", k == 0 ? SH(2, 2) : SH(2, 4));
    IrValue *args[3] = {a, b, c};
    IrAttr at = ir_attr_int("axis", axes[k]);
    gc_check(&g, ir_emit(g.f, IR_OP_CONCAT, args, 3, &at, 1, NULL, L0));
    gc_free(&g);
  }
}

/* ------------------------------------------------------------------ */
/* Matrix products                                                      */
/* ------------------------------------------------------------------ */

static void test_grad_matmul(void **state) {
  (void)state;
  IrShape sa[9] = {SH(2, 3), SH(3), SH(2, 3), SH(3), SH(2, 2, 3), SH(2, 1, 2, 3), SH(3), SH(2, 4, 3), SH(2, 3)};
  IrShape sb[9] = {SH(3, 4), SH(3, 4), SH(3), SH(3), SH(3, 4), SH(3, 3, 4), SH(2, 3, 4), SH(3), SH(2, 3, 4)};
  for (int k = 0; k < 9; k++) {
    Gc g;
    gc_init(&g, 61 + (uint64_t)k);
    IrValue *a = gc_param(&g, "a", sa[k]), *b = gc_param(&g, "b", sb[k]);
    gc_check(&g, ir_matmul(g.f, a, b, L0));
    gc_free(&g);
  }
}

/* ------------------------------------------------------------------ */
/* Neural-network ops                                                   */
/* ------------------------------------------------------------------ */

static void test_grad_softmax(void **state) {
  (void)state;
  int64_t axes[3] = {-1, 0, 1};
  for (int k = 0; k < 3; k++) {
    for (int log = 0; log < 2; log++) {
      Gc g;
      gc_init(&g, 71 + (uint64_t)(k * 2 + log));
      IrValue *x = gc_param(&g, "x", SH(2, 3, 4));
      IrAttr a = ir_attr_int("axis", axes[k]);
      gc_check(&g, emit1(&g, log ? IR_OP_LOG_SOFTMAX : IR_OP_SOFTMAX, x, &a, 1));
      gc_free(&g);
    }
  }
}

static void test_grad_layer_norm(void **state) {
  (void)state;
  IrShape shapes[2] = {SH(2, 3, 5), SH(4)};
  for (int k = 0; k < 2; k++) {
    Gc g;
    gc_init(&g, 81 + (uint64_t)k);
    IrValue *x = gc_param(&g, "x", shapes[k]);
    IrShape ws = SH(shapes[k].dim[shapes[k].rank - 1]);
    IrValue *w = gc_param(&g, "w", ws), *b = gc_param(&g, "b", ws);
    IrValue *args[3] = {x, w, b};
    IrAttr a = ir_attr_float("eps", 1e-5);
    gc_check(&g, ir_emit(g.f, IR_OP_LAYER_NORM, args, 3, &a, 1, NULL, L0));
    gc_free(&g);
  }
}

static void test_grad_rms_norm(void **state) {
  (void)state;
  IrShape shapes[2] = {SH(2, 3, 5), SH(4)};
  for (int k = 0; k < 2; k++) {
    Gc g;
    gc_init(&g, 83 + (uint64_t)k);
    IrValue *x = gc_param(&g, "x", shapes[k]);
    IrValue *w = gc_param(&g, "w", SH(shapes[k].dim[shapes[k].rank - 1]));
    IrValue *args[2] = {x, w};
    IrAttr a = ir_attr_float("eps", 1e-6);
    gc_check(&g, ir_emit(g.f, IR_OP_RMS_NORM, args, 2, &a, 1, NULL, L0));
    gc_free(&g);
  }
}

/* softmax(causal_mask(x)) as in attention; masked entries get no gradient. */
static void test_grad_causal_mask(void **state) {
  (void)state;
  IrShape shapes[2] = {SH(2, 4, 4), SH(3, 5)};
  for (int k = 0; k < 2; k++) {
    Gc g;
    gc_init(&g, 85 + (uint64_t)k);
    IrValue *x = gc_param(&g, "x", shapes[k]);
    IrAttr a = ir_attr_int("axis", -1);
    gc_check(&g, emit1(&g, IR_OP_SOFTMAX, un(&g, IR_OP_CAUSAL_MASK, x), &a, 1));
    gc_free(&g);
  }
}

static void test_grad_embedding(void **state) {
  (void)state;
  Gc g;
  gc_init(&g, 87);
  int idx[6] = {0, 3, 3, 1, 4, 3}; /* repeated rows accumulate; row 2 unused */
  IrValue *i = gc_input_i32(&g, "idx", SH(2, 3), idx);
  IrValue *t = gc_param(&g, "table", SH(5, 4));
  gc_check(&g, bin(&g, IR_OP_EMBEDDING, i, t));
  gc_free(&g);
}

static IrValue *cross_entropy(Gc *g, IrValue *lg, IrValue *tg, int64_t ii, const char *red) {
  IrAttr a[2] = {ir_attr_int("ignore_index", ii), ir_attr_str("reduction", red)};
  IrValue *args[2] = {lg, tg};
  return ir_emit(g->f, IR_OP_CROSS_ENTROPY, args, 2, a, 2, NULL, L0);
}

static void test_grad_cross_entropy(void **state) {
  (void)state;
  const char *reds[3] = {"none", "sum", "mean"};
  for (int r = 0; r < 3; r++) {
    /* [4,5] with one ignored target; [2,3,5] with ignore_index = 2. */
    for (int k = 0; k < 2; k++) {
      Gc g;
      gc_init(&g, 91 + (uint64_t)(r * 2 + k));
      int t1[4] = {1, -100, 4, 0}, t2[6] = {2, 0, 4, 2, 1, 3};
      IrValue *tg = k == 0 ? gc_input_i32(&g, "y", SH(4), t1) : gc_input_i32(&g, "y", SH(2, 3), t2);
      IrValue *lg = gc_param(&g, "logits", k == 0 ? SH(4, 5) : SH(2, 3, 5));
      gc_check(&g, cross_entropy(&g, lg, tg, k == 0 ? -100 : 2, reds[r]));
      gc_free(&g);
    }
  }
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

static void test_grad_mse_loss(void **state) {
  (void)state;
  const char *reds[3] = {"none", "sum", "mean"};
  for (int r = 0; r < 3; r++) {
    Gc g;
    gc_init(&g, 101 + (uint64_t)r);
    IrValue *a = gc_param(&g, "a", SH(2, 3)), *b = gc_param(&g, "b", SH(2, 3));
    IrAttr at = ir_attr_str("reduction", reds[r]);
    IrValue *args[2] = {a, b};
    gc_check(&g, ir_emit(g.f, IR_OP_MSE_LOSS, args, 2, &at, 1, NULL, L0));
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
      cmocka_unit_test(test_grad_neg),
      cmocka_unit_test(test_grad_exp),
      cmocka_unit_test(test_grad_log),
      cmocka_unit_test(test_grad_sqrt),
      cmocka_unit_test(test_grad_rsqrt),
      cmocka_unit_test(test_grad_tanh),
      cmocka_unit_test(test_grad_sigmoid),
      cmocka_unit_test(test_grad_relu),
      cmocka_unit_test(test_grad_gelu),
      cmocka_unit_test(test_grad_silu),
      cmocka_unit_test(test_grad_abs),
      cmocka_unit_test(test_grad_pow),
      cmocka_unit_test(test_grad_pow_zero_exponent),
      cmocka_unit_test(test_grad_relu_abs_at_zero),
      cmocka_unit_test(test_grad_cast),
      cmocka_unit_test(test_grad_add),
      cmocka_unit_test(test_grad_sub),
      cmocka_unit_test(test_grad_mul),
      cmocka_unit_test(test_grad_div),
      cmocka_unit_test(test_grad_maximum),
      cmocka_unit_test(test_grad_minimum),
      cmocka_unit_test(test_grad_maximum_minimum_ties),
      cmocka_unit_test(test_grad_select),
      cmocka_unit_test(test_grad_sum),
      cmocka_unit_test(test_grad_mean),
      cmocka_unit_test(test_grad_max),
      cmocka_unit_test(test_grad_logsumexp),
      cmocka_unit_test(test_grad_max_ties_split_evenly),
      cmocka_unit_test(test_grad_reshape),
      cmocka_unit_test(test_grad_permute),
      cmocka_unit_test(test_grad_broadcast),
      cmocka_unit_test(test_grad_slice),
      cmocka_unit_test(test_grad_unslice),
      cmocka_unit_test(test_grad_concat),
      cmocka_unit_test(test_grad_matmul),
      cmocka_unit_test(test_grad_softmax),
      cmocka_unit_test(test_grad_layer_norm),
      cmocka_unit_test(test_grad_rms_norm),
      cmocka_unit_test(test_grad_causal_mask),
      cmocka_unit_test(test_grad_embedding),
      cmocka_unit_test(test_grad_cross_entropy),
      cmocka_unit_test(test_grad_cross_entropy_all_ignored),
      cmocka_unit_test(test_grad_mse_loss),
      cmocka_unit_test(test_grad_mlp),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
