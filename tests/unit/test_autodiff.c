/* test_autodiff.c - the autodiff pass's contract: seeding (loss.term seeds
 * used exactly, loss outputs seeded with 1), fan-out sums, detach stops,
 * tied params accumulate, integer values get no gradient, grad outputs and
 * their names, no dead backward, idempotence, and the collectives' f/g
 * pairing.  Numeric expectations are derived by hand; the per-op finite
 * difference checks are in test_gradcheck.c. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "passes/passes.h"
#include "runtime/runtime.h"
#include "testutil.h"

#define SH(...) ir_shape_make((int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)), (int64_t[]){__VA_ARGS__})

static const IrLoc L0 = {"ad.gir", 1, 1};

static IrValue *param(IrFunc *f, const char *name, IrDType dt, IrShape s) {
  return ir_func_add_arg(f, name, (IrType){dt, s}, IR_ARG_PARAM, false);
}

static IrValue *input(IrFunc *f, const char *name, IrDType dt, IrShape s) {
  return ir_func_add_arg(f, name, (IrType){dt, s}, IR_ARG_INPUT, false);
}

static IrValue *sum_all(IrFunc *f, IrValue *x) { return ir_reduce(f, IR_OP_SUM, x, NULL, 0, false, L0); }

static void loss(IrFunc *f, IrValue *x, const char *name) {
  IrAttr a = ir_attr_str("name", name);
  ir_emit(f, IR_OP_LOSS, &x, 1, &a, 1, NULL, L0);
}

static PassResult run_autodiff(IrFunc *f) {
  Arena scratch;
  arena_init(&scratch);
  PassOptions o = {.gas = 1};
  PassResult r = pass_autodiff(f, &o, &scratch);
  arena_free(&scratch);
  char err[512] = "";
  if (!ir_verify(f, err, sizeof err)) fail_msg("verifier: %s", err);
  return r;
}

static IrOp *grad_op(IrFunc *f, const char *name) {
  for (int i = 0; i < f->nops; i++)
    if (f->ops[i]->opcode == IR_OP_GRAD && strcmp(ir_attr_get_str(f->ops[i], "name", ""), name) == 0)
      return f->ops[i];
  return NULL;
}

static int count_ops(IrFunc *f, IrOpcode o, int from) {
  int n = 0;
  for (int i = from; i < f->nops; i++) n += f->ops[i]->opcode == o;
  return n;
}

/* Evaluate f on args (by argument index) in exact f64; returns the state. */
static void eval(IrFunc *f, double **args, InterpState *st) {
  char err[256] = "";
  InterpOptions opt = {.exact_f64 = true};
  double **ws = calloc((size_t)f->nvalues, sizeof(double *));
  memset(st, 0, sizeof *st);
  bool ok = interp_run(st, f, args, ws, INTERP_STEP, &opt, err, sizeof err);
  free(ws);
  if (!ok) fail_msg("interp_run: %s", err);
}

/* The gradient of param `name` after eval (asserts it has a grad output). */
static const double *grad_of(IrFunc *f, InterpState *st, const char *name) {
  IrOp *g = grad_op(f, name);
  assert_non_null(g);
  assert_non_null(st->val[g->args[0]->id]);
  return st->val[g->args[0]->id];
}

/* L = sum(x * x + x): x fans out three times; dx = 2x + 1. */
static void test_autodiff_fanout_sums(void **state) {
  (void)state;
  IrFunc *f = ir_func_new("fanout");
  IrValue *x = param(f, "x", IR_DT_F64, SH(4));
  IrValue *y = ir_binary(f, IR_OP_ADD, ir_binary(f, IR_OP_MUL, x, x, L0), x, L0);
  loss(f, sum_all(f, y), "L");
  int nfwd = f->nops;
  assert_int_equal(run_autodiff(f), PASS_CHANGED);
  assert_true(count_ops(f, IR_OP_ADD, nfwd) >= 2); /* contributions were summed */
  double xv[4] = {1.5, -2, 0, 0.25};
  double *args[1] = {xv};
  InterpState st;
  eval(f, args, &st);
  const double *dx = grad_of(f, &st, "x");
  for (int i = 0; i < 4; i++) assert_true(dx[i] == 2 * xv[i] + 1);
  interp_free(&st);
  ir_func_free(f);
}

/* L = sum(detach(a) * b): a gets no grad output, db = a. */
static void test_autodiff_detach_stops(void **state) {
  (void)state;
  IrFunc *f = ir_func_new("detach");
  IrValue *a = param(f, "a", IR_DT_F64, SH(3));
  IrValue *b = param(f, "b", IR_DT_F64, SH(3));
  loss(f, sum_all(f, ir_binary(f, IR_OP_MUL, ir_unary(f, IR_OP_DETACH, a, L0), b, L0)), "L");
  int nfwd = f->nops;
  assert_int_equal(run_autodiff(f), PASS_CHANGED);
  assert_null(grad_op(f, "a"));
  assert_non_null(grad_op(f, "b"));
  assert_int_equal(count_ops(f, IR_OP_GRAD, nfwd), 1);
  double av[3] = {1, 2, 3}, bv[3] = {4, 5, 6};
  double *args[2] = {av, bv};
  InterpState st;
  eval(f, args, &st);
  const double *db = grad_of(f, &st, "b");
  for (int i = 0; i < 3; i++) assert_true(db[i] == av[i]);
  interp_free(&st);
  ir_func_free(f);
}

/* A param reached only through detach: no grad output at all. */
static void test_autodiff_only_detached_param_gets_no_grad(void **state) {
  (void)state;
  IrFunc *f = ir_func_new("detach_only");
  IrValue *a = param(f, "a", IR_DT_F64, SH(3));
  IrValue *x = input(f, "x", IR_DT_F64, SH(3));
  loss(f, sum_all(f, ir_binary(f, IR_OP_MUL, ir_unary(f, IR_OP_DETACH, a, L0), x, L0)), "L");
  int nfwd = f->nops;
  assert_int_equal(run_autodiff(f), PASS_UNCHANGED);
  assert_int_equal(f->nops, nfwd);
  ir_func_free(f);
}

/* L = sum(W @ W): W is used twice by one op; dW[i][j] = rowsum(W)[j] + colsum(W)[i]. */
static void test_autodiff_tied_param_accumulates(void **state) {
  (void)state;
  IrFunc *f = ir_func_new("tied");
  IrValue *w = param(f, "W", IR_DT_F64, SH(2, 2));
  loss(f, sum_all(f, ir_matmul(f, w, w, L0)), "L");
  assert_int_equal(run_autodiff(f), PASS_CHANGED);
  double wv[4] = {1, 2, 3, 5};
  double *args[1] = {wv};
  InterpState st;
  eval(f, args, &st);
  const double *dw = grad_of(f, &st, "W");
  double row[2] = {wv[0] + wv[1], wv[2] + wv[3]}, col[2] = {wv[0] + wv[2], wv[1] + wv[3]};
  for (int i = 0; i < 2; i++)
    for (int j = 0; j < 2; j++) assert_true(dw[i * 2 + j] == row[j] + col[i]);
  interp_free(&st);
  ir_func_free(f);
}

/* An i32 param and an i32 input get no gradient; the float param does. */
static void test_autodiff_int_values_get_no_grad(void **state) {
  (void)state;
  IrFunc *f = ir_func_new("ints");
  IrValue *p = param(f, "P", IR_DT_I32, SH(3));
  IrValue *idx = input(f, "idx", IR_DT_I32, SH(2));
  IrValue *w = param(f, "W", IR_DT_F64, SH(3));
  IrValue *t = param(f, "T", IR_DT_F64, SH(4, 3));
  IrValue *pc = ir_cast(f, p, IR_DT_F64, L0);
  IrValue *e = ir_binary(f, IR_OP_EMBEDDING, idx, t, L0); /* [2,3] */
  IrValue *y = ir_binary(f, IR_OP_MUL, ir_binary(f, IR_OP_MUL, pc, w, L0), e, L0);
  loss(f, sum_all(f, y), "L");
  int nfwd = f->nops;
  assert_int_equal(run_autodiff(f), PASS_CHANGED);
  assert_null(grad_op(f, "P"));
  assert_null(grad_op(f, "idx"));
  assert_non_null(grad_op(f, "W"));
  assert_non_null(grad_op(f, "T"));
  assert_int_equal(count_ops(f, IR_OP_GRAD, nfwd), 2);
  double pv[3] = {1, -2, 3}, iv[2] = {3, 0}, wv[3] = {0.5, 2, -1}, tv[12];
  for (int i = 0; i < 12; i++) tv[i] = i + 1;
  double *args[4] = {pv, iv, wv, tv};
  InterpState st;
  eval(f, args, &st);
  /* dW[j] = P[j] * (T[3][j] + T[0][j]) */
  const double *dw = grad_of(f, &st, "W");
  for (int j = 0; j < 3; j++) assert_true(dw[j] == pv[j] * (tv[9 + j] + tv[j]));
  /* dT rows 0 and 3 get P * W; rows 1, 2 get 0. */
  const double *dt = grad_of(f, &st, "T");
  for (int r = 0; r < 4; r++)
    for (int j = 0; j < 3; j++) assert_true(dt[r * 3 + j] == (r == 0 || r == 3 ? pv[j] * wv[j] : 0.0));
  interp_free(&st);
  ir_func_free(f);
}

/* Builds L = sum(exp(x) * c) as a loss.term with seed s; returns dx. */
static double *seeded_grad(double s, const double *xv, const double *cv) {
  IrFunc *f = ir_func_new("seed");
  IrValue *x = param(f, "x", IR_DT_F64, SH(3));
  IrValue *c = input(f, "c", IR_DT_F64, SH(3));
  IrValue *S = sum_all(f, ir_binary(f, IR_OP_MUL, ir_unary(f, IR_OP_EXP, x, L0), c, L0));
  IrValue *sv = ir_const(f, s, IR_DT_F64, L0);
  IrValue *args2[2] = {S, sv};
  IrValue *t = ir_emit(f, IR_OP_LOSS_TERM, args2, 2, NULL, 0, NULL, L0);
  loss(f, t, "L");
  assert_int_equal(run_autodiff(f), PASS_CHANGED);
  double *args[2] = {(double *)xv, (double *)cv};
  InterpState st;
  eval(f, args, &st);
  double *d = malloc(3 * sizeof(double));
  memcpy(d, grad_of(f, &st, "x"), 3 * sizeof(double));
  interp_free(&st);
  ir_func_free(f);
  return d;
}

/* The loss.term seed is used exactly: gradient(S) = seed, nothing else. */
static void test_autodiff_seed_used_exactly(void **state) {
  (void)state;
  double xv[3] = {0.3, -1.2, 2.0}, cv[3] = {1.5, -0.7, 0.2};
  double *g1 = seeded_grad(1.0, xv, cv);
  for (int i = 0; i < 3; i++) assert_true(g1[i] == cv[i] * exp(xv[i]));
  /* A power of two scales exactly, whatever the order of the products. */
  double *g4 = seeded_grad(0.25, xv, cv);
  for (int i = 0; i < 3; i++) assert_true(g4[i] == 0.25 * g1[i]);
  double *g3 = seeded_grad(0.3, xv, cv);
  for (int i = 0; i < 3; i++) assert_true(fabs(g3[i] - 0.3 * g1[i]) <= 1e-15 * fabs(g1[i]));
  free(g1);
  free(g4);
  free(g3);
}

/* With loss.term ops present, `loss` outputs are not seeded again. */
static void test_autodiff_loss_terms_replace_loss_seeds(void **state) {
  (void)state;
  IrFunc *f = ir_func_new("terms");
  IrValue *x = param(f, "x", IR_DT_F64, SH(2));
  IrValue *S = sum_all(f, x);
  IrValue *args2[2] = {S, ir_const(f, 0.5, IR_DT_F64, L0)};
  IrValue *t = ir_emit(f, IR_OP_LOSS_TERM, args2, 2, NULL, 0, NULL, L0);
  loss(f, t, "a");
  loss(f, S, "raw"); /* reported only */
  assert_int_equal(run_autodiff(f), PASS_CHANGED);
  double xv[2] = {1, 2};
  double *args[1] = {xv};
  InterpState st;
  eval(f, args, &st);
  const double *dx = grad_of(f, &st, "x");
  assert_true(dx[0] == 0.5 && dx[1] == 0.5);
  interp_free(&st);
  ir_func_free(f);
}

/* Without loss.term ops, every loss is seeded with 1 and the seeds add. */
static void test_autodiff_losses_seeded_with_one(void **state) {
  (void)state;
  IrFunc *f = ir_func_new("losses");
  IrValue *x = param(f, "x", IR_DT_F64, SH(2));
  loss(f, sum_all(f, x), "a");
  loss(f, sum_all(f, ir_binary(f, IR_OP_MUL, x, x, L0)), "b");
  assert_int_equal(run_autodiff(f), PASS_CHANGED);
  double xv[2] = {1, -3};
  double *args[1] = {xv};
  InterpState st;
  eval(f, args, &st);
  const double *dx = grad_of(f, &st, "x");
  for (int i = 0; i < 2; i++) assert_true(dx[i] == 1 + 2 * xv[i]);
  interp_free(&st);
  ir_func_free(f);
}

/* Grad outputs: one per param with a gradient, value named d<param>,
 * type = the param's (f32 stays f32). */
static void test_autodiff_grad_outputs_named_and_typed(void **state) {
  (void)state;
  IrFunc *f = ir_func_new("names");
  IrValue *w = param(f, "W1", IR_DT_F32, SH(3, 2));
  IrValue *x = input(f, "x", IR_DT_F32, SH(4, 3));
  loss(f, sum_all(f, ir_unary(f, IR_OP_TANH, ir_matmul(f, x, w, L0), L0)), "L");
  int nfwd = f->nops;
  assert_int_equal(run_autodiff(f), PASS_CHANGED);
  IrOp *g = grad_op(f, "W1");
  assert_non_null(g);
  assert_ptr_equal(f->ops[f->nops - 1], g); /* outputs after the backward */
  assert_string_equal(g->args[0]->name, "dW1");
  assert_true(ir_type_eq(&g->args[0]->type, &w->type));
  assert_int_equal(count_ops(f, IR_OP_GRAD, nfwd), 1);
  for (int i = 0; i < nfwd; i++) assert_int_not_equal(f->ops[i]->opcode, IR_OP_GRAD);
  ir_func_free(f);
}

/* Two params sharing one gradient value: no copy, the later name stays. */
static void test_autodiff_shared_grad_value_keeps_later_name(void **state) {
  (void)state;
  IrFunc *f = ir_func_new("shared");
  IrValue *a = param(f, "a", IR_DT_F64, SH(3));
  IrValue *b = param(f, "b", IR_DT_F64, SH(3));
  IrValue *r = input(f, "r", IR_DT_F64, SH(3));
  loss(f, sum_all(f, ir_binary(f, IR_OP_MUL, ir_binary(f, IR_OP_ADD, a, b, L0), r, L0)), "L");
  assert_int_equal(run_autodiff(f), PASS_CHANGED);
  IrOp *ga = grad_op(f, "a"), *gb = grad_op(f, "b");
  assert_non_null(ga);
  assert_non_null(gb);
  assert_ptr_equal(ga->args[0], gb->args[0]);
  assert_string_equal(gb->args[0]->name, "db");
  ir_func_free(f);
}

/* Work on values that do not depend on a param is not differentiated:
 * every backward op feeds a grad output. */
static void test_autodiff_no_dead_backward(void **state) {
  (void)state;
  IrFunc *f = ir_func_new("prune");
  IrValue *w = param(f, "W", IR_DT_F64, SH(3));
  IrValue *x = input(f, "x", IR_DT_F64, SH(3));
  IrValue *z = input(f, "z", IR_DT_F64, SH(3));
  IrValue *ez = ir_unary(f, IR_OP_EXP, z, L0);
  IrValue *y = ir_binary(f, IR_OP_ADD, ir_binary(f, IR_OP_MUL, w, x, L0), ir_unary(f, IR_OP_TANH, ez, L0), L0);
  loss(f, sum_all(f, ir_binary(f, IR_OP_MUL, y, ez, L0)), "L");
  int nfwd = f->nops;
  assert_int_equal(run_autodiff(f), PASS_CHANGED);
  bool *live = calloc((size_t)f->nvalues, sizeof(bool));
  for (int i = f->nops - 1; i >= 0; i--) {
    IrOp *op = f->ops[i];
    if (op->opcode != IR_OP_GRAD && !(op->result && live[op->result->id])) continue;
    for (int j = 0; j < op->nargs; j++) live[op->args[j]->id] = true;
  }
  for (int i = nfwd; i < f->nops; i++)
    if (f->ops[i]->opcode != IR_OP_GRAD) assert_true(live[f->ops[i]->result->id]);
  free(live);
  /* No derivative of tanh(exp(z)) was emitted. */
  assert_int_equal(count_ops(f, IR_OP_TANH, nfwd), 0);
  ir_func_free(f);
}

/* Running autodiff on a function that already has grad outputs changes nothing. */
static void test_autodiff_twice_is_unchanged(void **state) {
  (void)state;
  IrFunc *f = ir_func_new("twice");
  IrValue *x = param(f, "x", IR_DT_F64, SH(2));
  loss(f, sum_all(f, ir_unary(f, IR_OP_EXP, x, L0)), "L");
  assert_int_equal(run_autodiff(f), PASS_CHANGED);
  int n = f->nops, nv = f->nvalues;
  assert_int_equal(run_autodiff(f), PASS_UNCHANGED);
  assert_int_equal(f->nops, n);
  assert_int_equal(f->nvalues, nv);
  ir_func_free(f);
}

/* Collectives: the backward of all_gather is a reduce_scatter (start+wait,
 * same attributes), of reduce_scatter an all_gather, of all_reduce the identity. */
static void check_collective(IrOpcode fs, IrOpcode fw, bool identity, IrOpcode bs, IrOpcode bw, IrShape xs) {
  IrFunc *f = ir_func_new("coll");
  IrValue *x = param(f, "x", IR_DT_F32, xs);
  IrAttr a[3] = {ir_attr_str("group", "tp"), ir_attr_int("ranks", 2), ir_attr_int("axis", 0)};
  IrValue *s = ir_emit(f, fs, &x, 1, a, 3, NULL, L0);
  IrValue *w = ir_emit(f, fw, &s, 1, NULL, 0, NULL, L0);
  IrValue *r = input(f, "r", IR_DT_F32, w->type.shape);
  loss(f, sum_all(f, ir_binary(f, IR_OP_MUL, w, r, L0)), "L");
  int nfwd = f->nops;
  assert_int_equal(run_autodiff(f), PASS_CHANGED);
  IrOp *g = grad_op(f, "x");
  assert_non_null(g);
  assert_true(ir_type_eq(&g->args[0]->type, &x->type));
  if (identity) {
    /* identity: no collective in the backward */
    for (int i = nfwd; i < f->nops; i++) assert_int_not_equal(ir_op_info[f->ops[i]->opcode].kind, IR_KIND_COLLECTIVE);
  } else {
    assert_int_equal(count_ops(f, bs, nfwd), 1);
    assert_int_equal(count_ops(f, bw, nfwd), 1);
    IrOp *wait = g->args[0]->def;
    assert_int_equal(wait->opcode, bw);
    IrOp *start = wait->args[0]->def;
    assert_int_equal(start->opcode, bs);
    assert_string_equal(ir_attr_get_str(start, "group", ""), "tp");
    assert_int_equal(ir_attr_get_int(start, "ranks", 0), 2);
    assert_int_equal(ir_attr_get_int(start, "axis", -1), 0);
  }
  ir_func_free(f);
}

static void test_autodiff_collectives_pair_up(void **state) {
  (void)state;
  check_collective(IR_OP_ALL_GATHER_START, IR_OP_ALL_GATHER_WAIT, false, IR_OP_REDUCE_SCATTER_START,
                   IR_OP_REDUCE_SCATTER_WAIT, SH(2, 3));
  check_collective(IR_OP_REDUCE_SCATTER_START, IR_OP_REDUCE_SCATTER_WAIT, false, IR_OP_ALL_GATHER_START,
                   IR_OP_ALL_GATHER_WAIT, SH(4, 3));
  check_collective(IR_OP_ALL_REDUCE_START, IR_OP_ALL_REDUCE_WAIT, true, IR_OP_ALL_REDUCE_START,
                   IR_OP_ALL_REDUCE_WAIT, SH(4, 3));
}

/* L = sum(layer_norm(x, w, b) * c) + sum(rms_norm(x, w) ** 2)... with
 * rms_norm squared by a multiply: the forward over [6, 10] in f64. */
static IrFunc *norms_model(void) {
  IrFunc *f = ir_func_new("norms");
  IrValue *x = param(f, "x", IR_DT_F64, SH(6, 10));
  IrValue *w = param(f, "w", IR_DT_F64, SH(10));
  IrValue *b = param(f, "b", IR_DT_F64, SH(10));
  IrValue *c = input(f, "c", IR_DT_F64, SH(6, 10));
  IrAttr eps = ir_attr_float("eps", 1e-5);
  IrValue *ln = ir_emit(f, IR_OP_LAYER_NORM, (IrValue *[]){x, w, b}, 3, &eps, 1, NULL, L0);
  IrValue *rms = ir_emit(f, IR_OP_RMS_NORM, (IrValue *[]){x, w}, 2, &eps, 1, NULL, L0);
  IrValue *l = ir_binary(f, IR_OP_ADD, sum_all(f, ir_binary(f, IR_OP_MUL, ln, c, L0)),
                         sum_all(f, ir_binary(f, IR_OP_MUL, rms, rms, L0)), L0);
  loss(f, l, "L");
  return f;
}

/* simplify, then dce for the ops it left unused. */
static void simplify(IrFunc *f) {
  Arena scratch;
  arena_init(&scratch);
  PassOptions o = {.gas = 1};
  (void)pass_simplify(f, &o, &scratch);
  (void)pass_dce(f, &o, &scratch);
  arena_free(&scratch);
  char err[512] = "";
  if (!ir_verify(f, err, sizeof err)) fail_msg("verifier: %s", err);
}

static double loss_of(IrFunc *f, InterpState *st) {
  for (int i = 0; i < f->nops; i++)
    if (f->ops[i]->opcode == IR_OP_LOSS) return st->val[f->ops[i]->args[0]->id][0];
  fail_msg("no loss");
  return 0;
}

/* After autodiff, simplify writes layer_norm and rms_norm over the row
 * statistics their backward recomputes (passes/simplify.c): no norm op is
 * left, and the loss and every gradient are the unsimplified function's
 * (the same formulas in f64, up to rounding).  Without a backward there
 * are no statistics to share, and the norms stay. */
static void test_autodiff_norms_over_backward_statistics(void **state) {
  (void)state;
  IrFunc *plain = norms_model(), *simp = norms_model(), *fwd = norms_model();
  assert_int_equal(run_autodiff(plain), PASS_CHANGED);
  assert_int_equal(run_autodiff(simp), PASS_CHANGED);
  simplify(simp);
  simplify(fwd);
  assert_int_equal(count_ops(plain, IR_OP_LAYER_NORM, 0), 1);
  assert_int_equal(count_ops(plain, IR_OP_RMS_NORM, 0), 1);
  assert_int_equal(count_ops(simp, IR_OP_LAYER_NORM, 0), 0);
  assert_int_equal(count_ops(simp, IR_OP_RMS_NORM, 0), 0);
  assert_int_equal(count_ops(fwd, IR_OP_LAYER_NORM, 0), 1);
  assert_int_equal(count_ops(fwd, IR_OP_RMS_NORM, 0), 1);
  double xv[60], wv[10], bv[10], cv[60];
  for (int i = 0; i < 60; i++) {
    xv[i] = sin(0.7 * i) * (1 + i % 7) + 0.3 * (i / 10); /* rows with different means and spreads */
    cv[i] = cos(1.3 * i);
  }
  for (int i = 0; i < 10; i++) wv[i] = 1 + 0.1 * i, bv[i] = 0.05 * i - 0.2;
  double *args[4] = {xv, wv, bv, cv};
  InterpState a, b;
  eval(plain, args, &a);
  eval(simp, args, &b);
  double la = loss_of(plain, &a), lb = loss_of(simp, &b);
  if (!(fabs(la - lb) <= 1e-12 * fabs(la))) fail_msg("loss %.17g, unsimplified %.17g", lb, la);
  const char *names[] = {"x", "w", "b"};
  const int n[] = {60, 10, 10};
  for (int k = 0; k < 3; k++) {
    const double *ga = grad_of(plain, &a, names[k]), *gb = grad_of(simp, &b, names[k]);
    for (int i = 0; i < n[k]; i++)
      if (!(fabs(ga[i] - gb[i]) <= 1e-12 * (1 + fabs(ga[i]))))
        fail_msg("d%s[%d] = %.17g, unsimplified %.17g", names[k], i, gb[i], ga[i]);
  }
  interp_free(&a);
  interp_free(&b);
  ir_func_free(plain);
  ir_func_free(simp);
  ir_func_free(fwd);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_autodiff_fanout_sums),
      cmocka_unit_test(test_autodiff_detach_stops),
      cmocka_unit_test(test_autodiff_only_detached_param_gets_no_grad),
      cmocka_unit_test(test_autodiff_tied_param_accumulates),
      cmocka_unit_test(test_autodiff_int_values_get_no_grad),
      cmocka_unit_test(test_autodiff_seed_used_exactly),
      cmocka_unit_test(test_autodiff_loss_terms_replace_loss_seeds),
      cmocka_unit_test(test_autodiff_losses_seeded_with_one),
      cmocka_unit_test(test_autodiff_grad_outputs_named_and_typed),
      cmocka_unit_test(test_autodiff_shared_grad_value_keeps_later_name),
      cmocka_unit_test(test_autodiff_no_dead_backward),
      cmocka_unit_test(test_autodiff_twice_is_unchanged),
      cmocka_unit_test(test_autodiff_collectives_pair_up),
      cmocka_unit_test(test_autodiff_norms_over_backward_statistics),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
