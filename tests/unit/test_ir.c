/* test_ir.c - the IR module: shape rules, text form round trip, reader
 * errors, verifier. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

/* ------------------------------------------------------------------ */
/* Helpers                                                             */
/* ------------------------------------------------------------------ */

/* Parse "f32[2,3]" / "i32" (test-only, trusted input). */
static IrType ty(const char *s) {
  IrType t;
  memset(&t, 0, sizeof t);
  size_t k = strcspn(s, "[");
  assert_true(ir_dtype_parse(s, k, &t.dtype));
  if (s[k] == '[') {
    const char *p = s + k + 1;
    while (*p && *p != ']') {
      t.shape.dim[t.shape.rank++] = strtoll(p, (char **)&p, 10);
      if (*p == ',') p++;
    }
  }
  return t;
}

static IrFunc *fn;
static char err[512];

static IrValue *arg_of(const char *type) {
  return ir_func_add_arg(fn, NULL, ty(type), IR_ARG_INPUT, false);
}

/* Build opc over operands of the given types; returns the result type as
 * text, or "error: <message>". */
static const char *infer(IrOpcode opc, const char *types, const IrAttr *attrs, int nattrs, const char *hint) {
  static char out[600];
  IrValue *args[8];
  int n = 0;
  char buf[256];
  snprintf(buf, sizeof buf, "%s", types);
  for (char *tok = strtok(buf, " "); tok; tok = strtok(NULL, " ")) args[n++] = arg_of(tok);
  IrType h;
  if (hint) h = ty(hint);
  IrLoc loc = {0};
  IrOp *op = ir_build(fn, opc, args, n, attrs, nattrs, hint ? &h : NULL, loc, err, sizeof err);
  if (!op) {
    snprintf(out, sizeof out, "error: %s", err);
    return out;
  }
  if (!op->result) return "none";
  return ir_type_str(&op->result->type, out, sizeof out);
}

static int setup(void **state) {
  (void)state;
  fn = ir_func_new("t");
  return 0;
}

static int teardown(void **state) {
  (void)state;
  ir_func_free(fn);
  fn = NULL;
  return 0;
}

#define assert_has(hay, needle)                                                                              \
  do {                                                                                                       \
    if (!strstr((hay), (needle))) fail_msg("'%s' does not contain '%s'", (hay), (needle));                   \
  } while (0)

/* ------------------------------------------------------------------ */
/* Shape rules                                                         */
/* ------------------------------------------------------------------ */

static void test_shape_broadcast_helpers(void **state) {
  (void)state;
  IrShape a = ty("f32[8,1,6]").shape, b = ty("f32[7,1]").shape, c = ty("f32[3]").shape, r;
  assert_true(ir_broadcast_shapes(&a, &b, &r));
  IrShape want = ty("f32[8,7,6]").shape;
  assert_true(ir_shape_eq(&r, &want));
  assert_false(ir_broadcast_shapes(&a, &c, &r));
  IrShape s0 = ir_shape_scalar();
  assert_true(ir_broadcast_shapes(&s0, &c, &r));
  assert_true(ir_shape_eq(&r, &c));
  IrShape z = ty("f32[0,1]").shape, z2 = ty("f32[5]").shape;
  assert_true(ir_broadcast_shapes(&z, &z2, &r)); /* [0,5] */
  assert_int_equal(r.dim[0], 0);
  assert_int_equal(r.dim[1], 5);
  int64_t ax;
  assert_true(ir_norm_axis(-1, 3, &ax));
  assert_int_equal(ax, 2);
  assert_true(ir_norm_axis(-3, 3, &ax));
  assert_int_equal(ax, 0);
  assert_false(ir_norm_axis(3, 3, &ax));
  assert_false(ir_norm_axis(-4, 3, &ax));
  assert_false(ir_norm_axis(0, 0, &ax));
}

static void test_shape_unary(void **state) {
  (void)state;
  assert_string_equal(infer(IR_OP_EXP, "f32[2,3]", NULL, 0, NULL), "f32[2,3]");
  assert_string_equal(infer(IR_OP_NEG, "i32[4]", NULL, 0, NULL), "i32[4]");
  assert_string_equal(infer(IR_OP_ABS, "i32", NULL, 0, NULL), "i32");
  assert_has(infer(IR_OP_EXP, "i32[4]", NULL, 0, NULL), "'exp' needs a floating-point operand, got i32[4]");
  assert_has(infer(IR_OP_NEG, "bool[4]", NULL, 0, NULL), "error");
  assert_has(infer(IR_OP_POW, "f32[2]", NULL, 0, NULL), "'pow' needs attribute 'exponent'");
  IrAttr e = ir_attr_float("exponent", 2.0);
  assert_string_equal(infer(IR_OP_POW, "f64[2]", &e, 1, NULL), "f64[2]");
  IrAttr bad = ir_attr_str("exponent", "two");
  assert_has(infer(IR_OP_POW, "f64[2]", &bad, 1, NULL), "'pow' attribute 'exponent' must be a number");
  assert_string_equal(infer(IR_OP_CAUSAL_MASK, "f32[2,4,4]", NULL, 0, NULL), "f32[2,4,4]");
  assert_has(infer(IR_OP_CAUSAL_MASK, "f32[4]", NULL, 0, NULL), "rank >= 2, got f32[4]");
  assert_string_equal(infer(IR_OP_DETACH, "bf16[3]", NULL, 0, NULL), "bf16[3]");
  /* cast: the hint is the result; only the dtype changes. */
  assert_string_equal(infer(IR_OP_CAST, "f32[2,3]", NULL, 0, "bf16[2,3]"), "bf16[2,3]");
  assert_has(infer(IR_OP_CAST, "f32[2,3]", NULL, 0, NULL), "'cast' needs a result type");
  assert_has(infer(IR_OP_CAST, "f32[2,3]", NULL, 0, "f32[3,2]"), "f32[2,3] to f32[3,2]");
  /* wrong arity */
  assert_has(infer(IR_OP_EXP, "f32 f32", NULL, 0, NULL), "'exp' takes 1 operand, got 2");
}

static void test_shape_const(void **state) {
  (void)state;
  IrAttr v = ir_attr_float("value", 0.5);
  assert_string_equal(infer(IR_OP_CONST, "", &v, 1, "f32"), "f32");
  assert_string_equal(infer(IR_OP_CONST, "", &v, 1, "f64[3,4]"), "f64[3,4]");
  IrAttr vi = ir_attr_int("value", 3);
  assert_string_equal(infer(IR_OP_CONST, "", &vi, 1, "i32"), "i32");
  assert_has(infer(IR_OP_CONST, "", &v, 1, NULL), "needs a result type");
  assert_has(infer(IR_OP_CONST, "", NULL, 0, "f32"), "'const' needs attribute 'value'");
}

static void test_shape_binary_broadcasts(void **state) {
  (void)state;
  assert_string_equal(infer(IR_OP_ADD, "f32[10,6] f32[6]", NULL, 0, NULL), "f32[10,6]");
  assert_string_equal(infer(IR_OP_MUL, "f32[4,1,3] f32[5,1]", NULL, 0, NULL), "f32[4,5,3]");
  assert_string_equal(infer(IR_OP_SUB, "f32 f32[2]", NULL, 0, NULL), "f32[2]");
  assert_string_equal(infer(IR_OP_MAXIMUM, "i32[2] i32[2]", NULL, 0, NULL), "i32[2]");
  assert_has(infer(IR_OP_ADD, "f32[10,6] f32[10,5]", NULL, 0, NULL), "cannot broadcast f32[10,6] and f32[10,5]");
  assert_has(infer(IR_OP_DIV, "f32[3] f64[3]", NULL, 0, NULL), "mismatched types f32[3] and f64[3]");
  assert_has(infer(IR_OP_ADD, "bool[3] bool[3]", NULL, 0, NULL), "bool[3] and bool[3]");
  /* a hint that disagrees with the inferred type is an error */
  assert_has(infer(IR_OP_ADD, "f32[2] f32[2]", NULL, 0, "f32[3]"), "'add' has type f32[2], but f32[3] was declared");
}

static void test_shape_compare_and_select(void **state) {
  (void)state;
  assert_string_equal(infer(IR_OP_LT, "f32[2,3] f32[3]", NULL, 0, NULL), "bool[2,3]");
  assert_string_equal(infer(IR_OP_EQ, "i32[4] i32", NULL, 0, NULL), "bool[4]");
  assert_has(infer(IR_OP_GT, "f32[2] i32[2]", NULL, 0, NULL), "mismatched types f32[2] and i32[2]");
  assert_string_equal(infer(IR_OP_SELECT, "bool[2,1] f32[3] f32", NULL, 0, NULL), "f32[2,3]");
  assert_has(infer(IR_OP_SELECT, "f32[2] f32[2] f32[2]", NULL, 0, NULL), "must be bool, got f32[2]");
  assert_has(infer(IR_OP_SELECT, "bool[4] f32[3] f32[3]", NULL, 0, NULL), "cannot broadcast bool[4], f32[3] and f32[3]");
  assert_has(infer(IR_OP_SELECT, "bool f32[3] f64[3]", NULL, 0, NULL), "mismatched types f32[3] and f64[3]");
}

static void test_shape_reduce(void **state) {
  (void)state;
  int64_t ax1[] = {1}, axneg[] = {-1, 0}, dup[] = {0, -2}, oob[] = {2};
  IrAttr a[2] = {ir_attr_ints("axes", ax1, 1), ir_attr_bool("keepdim", false)};
  assert_string_equal(infer(IR_OP_SUM, "f32[4,5]", a, 2, NULL), "f32[4]");
  a[1] = ir_attr_bool("keepdim", true);
  assert_string_equal(infer(IR_OP_MEAN, "f32[4,5]", a, 2, NULL), "f32[4,1]");
  a[0] = ir_attr_ints("axes", axneg, 2);
  assert_string_equal(infer(IR_OP_MAX, "f32[4,5,6]", a, 2, NULL), "f32[1,5,1]");
  a[1] = ir_attr_bool("keepdim", false);
  assert_string_equal(infer(IR_OP_LOGSUMEXP, "f32[4,5,6]", a, 2, NULL), "f32[5]");
  a[0] = ir_attr_ints("axes", NULL, 0); /* all axes */
  assert_string_equal(infer(IR_OP_SUM, "f32[4,5,6]", a, 2, NULL), "f32");
  assert_string_equal(infer(IR_OP_SUM, "i32[4]", a, 2, NULL), "i32");
  assert_has(infer(IR_OP_MEAN, "i32[4]", a, 2, NULL), "'mean' needs a floating-point operand, got i32[4]");
  a[0] = ir_attr_ints("axes", dup, 2);
  assert_has(infer(IR_OP_SUM, "f32[4,5]", a, 2, NULL), "axis -2 is repeated");
  a[0] = ir_attr_ints("axes", oob, 1);
  assert_has(infer(IR_OP_SUM, "f32[4,5]", a, 2, NULL), "axis 2 is out of range for f32[4,5]");
  assert_has(infer(IR_OP_SUM, "f32[4,5]", &a[1], 1, NULL), "'sum' needs attribute 'axes'");
  assert_has(infer(IR_OP_SUM, "f32[4,5]", a, 1, NULL), "'sum' needs attribute 'keepdim'");
  IrAttr wrong[2] = {ir_attr_int("axes", 0), ir_attr_bool("keepdim", false)};
  assert_has(infer(IR_OP_SUM, "f32[4,5]", wrong, 2, NULL), "'sum' attribute 'axes' must be a list of integers");
}

static void test_shape_movement(void **state) {
  (void)state;
  int64_t s1[] = {3, 4}, s2[] = {5, 5}, neg[] = {-1, 12};
  IrAttr a = ir_attr_ints("shape", s1, 2);
  assert_string_equal(infer(IR_OP_RESHAPE, "f32[2,6]", &a, 1, NULL), "f32[3,4]");
  assert_string_equal(infer(IR_OP_RESHAPE, "f32[12]", &a, 1, NULL), "f32[3,4]");
  a = ir_attr_ints("shape", s2, 2);
  assert_has(infer(IR_OP_RESHAPE, "f32[2,6]", &a, 1, NULL), "cannot reshape f32[2,6] to f32[5,5]");
  a = ir_attr_ints("shape", neg, 2);
  assert_has(infer(IR_OP_RESHAPE, "f32[12]", &a, 1, NULL), "invalid dimension -1");

  int64_t p[] = {2, 0, 1}, pbad[] = {0, 0, 1};
  a = ir_attr_ints("perm", p, 3);
  assert_string_equal(infer(IR_OP_PERMUTE, "f32[2,3,4]", &a, 1, NULL), "f32[4,2,3]");
  a = ir_attr_ints("perm", pbad, 3);
  assert_has(infer(IR_OP_PERMUTE, "f32[2,3,4]", &a, 1, NULL), "not a permutation");
  a = ir_attr_ints("perm", p, 2);
  assert_has(infer(IR_OP_PERMUTE, "f32[2,3,4]", &a, 1, NULL), "perm has 2 entries");

  int64_t b1[] = {4, 2, 3};
  a = ir_attr_ints("shape", b1, 3);
  assert_string_equal(infer(IR_OP_BROADCAST, "f32[2,1]", &a, 1, NULL), "f32[4,2,3]");
  assert_string_equal(infer(IR_OP_BROADCAST, "f32", &a, 1, NULL), "f32[4,2,3]");
  assert_has(infer(IR_OP_BROADCAST, "f32[3,3]", &a, 1, NULL), "cannot broadcast f32[3,3] to f32[4,2,3]");
  assert_has(infer(IR_OP_BROADCAST, "f32[1,4,2,3]", &a, 1, NULL), "cannot broadcast");
}

static void test_shape_slice_unslice(void **state) {
  (void)state;
  int64_t st[] = {0, 1}, sp[] = {4, 10}, stp[] = {1, 3};
  IrAttr a[4] = {ir_attr_ints("starts", st, 2), ir_attr_ints("stops", sp, 2), ir_attr_ints("steps", stp, 2),
                 ir_attr_ints("shape", NULL, 0)};
  /* axis 1: 1:10:3 -> 1,4,7 -> 3 elements */
  assert_string_equal(infer(IR_OP_SLICE, "f32[4,10]", a, 3, NULL), "f32[4,3]");
  assert_has(infer(IR_OP_SLICE, "f32[4,9]", a, 3, NULL), "range 1:10 on axis 1 is out of bounds for f32[4,9]");
  int64_t zero[] = {1, 0};
  a[2] = ir_attr_ints("steps", zero, 2);
  assert_has(infer(IR_OP_SLICE, "f32[4,10]", a, 3, NULL), "step 0 on axis 1");
  a[2] = ir_attr_ints("steps", stp, 2);
  assert_has(infer(IR_OP_SLICE, "f32[4,10,2]", a, 3, NULL), "'starts' has 2 entries");
  int64_t full[] = {4, 10};
  a[3] = ir_attr_ints("shape", full, 2);
  assert_string_equal(infer(IR_OP_UNSLICE, "f32[4,3]", a, 4, NULL), "f32[4,10]");
  assert_has(infer(IR_OP_UNSLICE, "f32[4,4]", a, 4, NULL), "the slice of f32[4,10] is f32[4,3], but the operand is f32[4,4]");
}

static void test_shape_concat(void **state) {
  (void)state;
  IrAttr ax = ir_attr_int("axis", -1);
  assert_string_equal(infer(IR_OP_CONCAT, "f32[2,3] f32[2,4] f32[2,1]", &ax, 1, NULL), "f32[2,8]");
  assert_string_equal(infer(IR_OP_CONCAT, "f32[2,3]", &ax, 1, NULL), "f32[2,3]");
  assert_has(infer(IR_OP_CONCAT, "f32[2,3] f32[3,3]", &ax, 1, NULL), "cannot join f32[2,3] and f32[3,3] along axis 1");
  assert_has(infer(IR_OP_CONCAT, "f32[2,3] f64[2,3]", &ax, 1, NULL), "cannot join f32[2,3] and f64[2,3]");
  assert_has(infer(IR_OP_CONCAT, "f32[2,3] f32[2,3]", NULL, 0, NULL), "'concat' needs attribute 'axis'");
  assert_has(infer(IR_OP_CONCAT, "", &ax, 1, NULL), "got 0");
}

static void test_shape_matmul(void **state) {
  (void)state;
  assert_string_equal(infer(IR_OP_MATMUL, "f32[8,12] f32[12,24]", NULL, 0, NULL), "f32[8,24]");
  assert_string_equal(infer(IR_OP_MATMUL, "f32[5] f32[5]", NULL, 0, NULL), "f32");
  assert_string_equal(infer(IR_OP_MATMUL, "f32[5] f32[5,3]", NULL, 0, NULL), "f32[3]");
  assert_string_equal(infer(IR_OP_MATMUL, "f32[4,5] f32[5]", NULL, 0, NULL), "f32[4]");
  assert_string_equal(infer(IR_OP_MATMUL, "f32[5] f32[2,5,3]", NULL, 0, NULL), "f32[2,3]");
  assert_string_equal(infer(IR_OP_MATMUL, "f32[2,4,5] f32[5]", NULL, 0, NULL), "f32[2,4]");
  assert_string_equal(infer(IR_OP_MATMUL, "f32[2,1,4,5] f32[3,5,6]", NULL, 0, NULL), "f32[2,3,4,6]");
  assert_string_equal(infer(IR_OP_MATMUL, "f32[2,4,5] f32[5,6]", NULL, 0, NULL), "f32[2,4,6]");
  assert_has(infer(IR_OP_MATMUL, "f32[8,12] f32[20,24]", NULL, 0, NULL),
             "f32[8,12] @ f32[20,24]: inner dimensions 12 and 20 differ");
  assert_has(infer(IR_OP_MATMUL, "f32[5] f32[4]", NULL, 0, NULL), "f32[5] @ f32[4]: inner dimensions 5 and 4 differ");
  assert_has(infer(IR_OP_MATMUL, "f32[2,4,5] f32[3,5,6]", NULL, 0, NULL),
             "f32[2,4,5] @ f32[3,5,6]: batch dimensions [2] and [3] do not broadcast");
  assert_has(infer(IR_OP_MATMUL, "f32 f32[3]", NULL, 0, NULL), "rank >= 1");
  assert_has(infer(IR_OP_MATMUL, "f32[2,3] f64[3,2]", NULL, 0, NULL), "f32[2,3] @ f64[3,2]");
}

static void test_shape_nn(void **state) {
  (void)state;
  IrAttr ax = ir_attr_int("axis", -1);
  assert_string_equal(infer(IR_OP_SOFTMAX, "f32[2,5]", &ax, 1, NULL), "f32[2,5]");
  assert_has(infer(IR_OP_LOG_SOFTMAX, "f32[2,5]", NULL, 0, NULL), "'log_softmax' needs attribute 'axis'");
  ax = ir_attr_int("axis", 2);
  assert_has(infer(IR_OP_SOFTMAX, "f32[2,5]", &ax, 1, NULL), "axis 2 is out of range for f32[2,5]");

  IrAttr eps = ir_attr_float("eps", 1e-5);
  assert_string_equal(infer(IR_OP_LAYER_NORM, "f32[4,8] f32[8] f32[8]", &eps, 1, NULL), "f32[4,8]");
  assert_has(infer(IR_OP_LAYER_NORM, "f32[4,8] f32[4] f32[8]", &eps, 1, NULL), "operand 2 of f32[4,8] must be f32[8], got f32[4]");
  assert_string_equal(infer(IR_OP_RMS_NORM, "f64[2,3,8] f64[8]", &eps, 1, NULL), "f64[2,3,8]");
  assert_has(infer(IR_OP_RMS_NORM, "f64[2,3,8] f64[8]", NULL, 0, NULL), "'rms_norm' needs attribute 'eps'");

  assert_string_equal(infer(IR_OP_EMBEDDING, "i32[2,7] f32[50,16]", NULL, 0, NULL), "f32[2,7,16]");
  assert_has(infer(IR_OP_EMBEDDING, "f32[2,7] f32[50,16]", NULL, 0, NULL), "operand 1 must be i32, got f32[2,7]");
  IrAttr rows = ir_attr_int("rows", 50);
  assert_string_equal(infer(IR_OP_EMBEDDING_GRAD, "i32[2,7] f32[2,7,16]", &rows, 1, NULL), "f32[50,16]");
  assert_has(infer(IR_OP_EMBEDDING_GRAD, "i32[2,7] f32[2,6,16]", &rows, 1, NULL), "f32[2,6,16] does not match indices i32[2,7]");

  IrAttr ce[2] = {ir_attr_int("ignore_index", -100), ir_attr_str("reduction", "mean")};
  assert_string_equal(infer(IR_OP_CROSS_ENTROPY, "f32[4,10] i32[4]", ce, 2, NULL), "f32");
  ce[1] = ir_attr_str("reduction", "none");
  assert_string_equal(infer(IR_OP_CROSS_ENTROPY, "f32[2,4,10] i32[2,4]", ce, 2, NULL), "f32[2,4]");
  assert_has(infer(IR_OP_CROSS_ENTROPY, "f32[4,10] i32[5]", ce, 2, NULL), "target i32[5] does not match logits f32[4,10]");
  ce[1] = ir_attr_str("reduction", "avg");
  assert_has(infer(IR_OP_CROSS_ENTROPY, "f32[4,10] i32[4]", ce, 2, NULL), "got \"avg\"");

  IrAttr oh[2] = {ir_attr_int("depth", 10), ir_attr_int("ignore_index", -100)};
  assert_string_equal(infer(IR_OP_ONE_HOT, "i32[4]", oh, 2, "f32[4,10]"), "f32[4,10]");
  assert_has(infer(IR_OP_ONE_HOT, "i32[4]", oh, 2, "i32[4,10]"), "floating-point result type");
  assert_has(infer(IR_OP_ONE_HOT, "i32[4]", oh, 2, "f32[4,9]"), "has type f32[4,10], but f32[4,9] was declared");

  IrAttr red = ir_attr_str("reduction", "sum");
  assert_string_equal(infer(IR_OP_MSE_LOSS, "f32[3,2] f32[3,2]", &red, 1, NULL), "f32");
  assert_has(infer(IR_OP_MSE_LOSS, "f32[3,2] f32[2]", &red, 1, NULL), "mismatched types f32[3,2] and f32[2]");
}

static void test_shape_window_and_outputs(void **state) {
  (void)state;
  assert_string_equal(infer(IR_OP_WINDOW_SUM, "i32", NULL, 0, NULL), "f32");
  assert_string_equal(infer(IR_OP_WINDOW_SUM, "bool[3]", NULL, 0, NULL), "f32[3]");
  assert_string_equal(infer(IR_OP_WINDOW_SUM, "f64", NULL, 0, NULL), "f64");
  IrAttr coef = ir_attr_float("coef", 0.5);
  assert_string_equal(infer(IR_OP_GRAD_SEED, "f32", &coef, 1, NULL), "f32");
  assert_has(infer(IR_OP_GRAD_SEED, "f32[2]", &coef, 1, NULL), "must be a scalar, got f32[2]");
  assert_string_equal(infer(IR_OP_LOSS_TERM, "f32 f32", NULL, 0, NULL), "f32");
  assert_has(infer(IR_OP_LOSS_TERM, "f32 f64", NULL, 0, NULL), "mismatched types f32 and f64");
  IrAttr name = ir_attr_str("name", "ce");
  assert_string_equal(infer(IR_OP_LOSS, "f32", &name, 1, NULL), "none");
  assert_has(infer(IR_OP_LOSS, "f32[2]", &name, 1, NULL), "must be a scalar");
  assert_has(infer(IR_OP_LOSS, "f32", NULL, 0, NULL), "'loss' needs attribute 'name'");
  assert_string_equal(infer(IR_OP_GRAD, "f32[3,4]", &name, 1, NULL), "none");
}

static void test_shape_collectives(void **state) {
  (void)state;
  IrAttr a[3] = {ir_attr_str("group", "tp"), ir_attr_int("ranks", 4), ir_attr_int("axis", 1)};
  assert_string_equal(infer(IR_OP_ALL_REDUCE_START, "f32[2,3]", a, 2, NULL), "f32[2,3]");
  assert_string_equal(infer(IR_OP_ALL_GATHER_START, "f32[2,3]", a, 3, NULL), "f32[2,12]");
  assert_string_equal(infer(IR_OP_REDUCE_SCATTER_START, "f32[2,8]", a, 3, NULL), "f32[2,2]");
  assert_has(infer(IR_OP_REDUCE_SCATTER_START, "f32[2,6]", a, 3, NULL), "axis 1 of f32[2,6] is not divisible by 4 ranks");
  assert_has(infer(IR_OP_ALL_REDUCE_START, "f32[2,3]", &a[1], 1, NULL), "needs attribute 'group'");
  /* a wait must consume the matching start */
  IrValue *x = arg_of("f32[2,8]");
  IrLoc loc = {0};
  IrValue *s = ir_emit(fn, IR_OP_REDUCE_SCATTER_START, &x, 1, a, 3, NULL, loc);
  IrOp *w = ir_build(fn, IR_OP_REDUCE_SCATTER_WAIT, &s, 1, NULL, 0, NULL, loc, err, sizeof err);
  assert_non_null(w);
  char buf[64];
  assert_string_equal(ir_type_str(&w->result->type, buf, sizeof buf), "f32[2,2]");
  assert_null(ir_build(fn, IR_OP_ALL_REDUCE_WAIT, &s, 1, NULL, 0, NULL, loc, err, sizeof err));
  assert_has(err, "'all_reduce.wait' must wait on the result of 'all_reduce.start'");
  assert_null(ir_build(fn, IR_OP_ALL_GATHER_WAIT, &x, 1, NULL, 0, NULL, loc, err, sizeof err));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_shape_broadcast_helpers, setup, teardown),
      cmocka_unit_test_setup_teardown(test_shape_unary, setup, teardown),
      cmocka_unit_test_setup_teardown(test_shape_const, setup, teardown),
      cmocka_unit_test_setup_teardown(test_shape_binary_broadcasts, setup, teardown),
      cmocka_unit_test_setup_teardown(test_shape_compare_and_select, setup, teardown),
      cmocka_unit_test_setup_teardown(test_shape_reduce, setup, teardown),
      cmocka_unit_test_setup_teardown(test_shape_movement, setup, teardown),
      cmocka_unit_test_setup_teardown(test_shape_slice_unslice, setup, teardown),
      cmocka_unit_test_setup_teardown(test_shape_concat, setup, teardown),
      cmocka_unit_test_setup_teardown(test_shape_matmul, setup, teardown),
      cmocka_unit_test_setup_teardown(test_shape_nn, setup, teardown),
      cmocka_unit_test_setup_teardown(test_shape_window_and_outputs, setup, teardown),
      cmocka_unit_test_setup_teardown(test_shape_collectives, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
