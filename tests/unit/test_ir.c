/* test_ir.c - the IR module: scalar semantics and rounding, op properties,
 * shape rules, text form round trip, reader errors, verifier. */
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
/* Scalars (scalar.c)                                                  */
/* ------------------------------------------------------------------ */

/* ir_round_dtype_n rounds an array as ir_round_dtype rounds each element
 * (the same bits, NaN for NaN), for every dtype. */
static void test_round_dtype_n_matches_elementwise(void **state) {
  (void)state;
  const double vals[] = {0.0,     -0.0,     1.0,          -1.5,      2.5,      3.141592653589793, 1e-40, -1e-45,
                         65520.0, 1e39,     -3.4e38,      1.00390625, 7.9e-8,  -2147483648.0,     0.49,  -0.51,
                         NAN,     INFINITY, -INFINITY,    1e300,     5e-324,   123456789.987654321};
  enum { N = sizeof vals / sizeof vals[0] };
  const IrDType dts[] = {IR_DT_F32, IR_DT_F64, IR_DT_BF16, IR_DT_F16, IR_DT_I32, IR_DT_BOOL};
  for (size_t d = 0; d < sizeof dts / sizeof dts[0]; d++) {
    double x[N];
    memcpy(x, vals, sizeof x);
    ir_round_dtype_n(x, N, dts[d]);
    for (int i = 0; i < N; i++) {
      double want = ir_round_dtype(vals[i], dts[d]);
      if (isnan(want) ? !isnan(x[i]) : memcmp(&x[i], &want, sizeof want) != 0)
        fail_msg("%s: %.17g rounds to %.17g, ir_round_dtype gives %.17g", ir_dtype_name(dts[d]), vals[i], x[i], want);
    }
  }
}

static void test_round_dtype_known_values(void **state) {
  (void)state;
  /* bf16: 8 significant bits. */
  assert_true(ir_round_dtype(3.141592653589793, IR_DT_BF16) == 3.140625);
  assert_true(ir_round_dtype(1.00390625, IR_DT_BF16) == 1.0);       /* tie -> even (down) */
  assert_true(ir_round_dtype(1.01171875, IR_DT_BF16) == 1.015625);  /* tie -> even (up) */
  assert_true(ir_round_dtype(1.0 / 3.0, IR_DT_BF16) == 0.333984375);
  assert_true(ir_round_dtype(-300.5, IR_DT_BF16) == -300.0);
  assert_true(ir_round_dtype(3.39e38, IR_DT_BF16) == 3.3895313892515355e38); /* largest finite */
  assert_true(isinf(ir_round_dtype(3.4e38, IR_DT_BF16)) && ir_round_dtype(3.4e38, IR_DT_BF16) > 0);
  assert_true(isinf(ir_round_dtype(-3.4e38, IR_DT_BF16)) && ir_round_dtype(-3.4e38, IR_DT_BF16) < 0);
  assert_true(ir_round_dtype(1e-40, IR_DT_BF16) == 9.183549615799121e-41); /* subnormal */
  assert_true(ir_round_dtype(ldexp(1, -134), IR_DT_BF16) == 0.0);        /* half the smallest subnormal: tie -> 0 */
  assert_true(isnan(ir_round_dtype(NAN, IR_DT_BF16)));
  /* f16: 11 significant bits, max 65504. */
  assert_true(ir_round_dtype(0.1, IR_DT_F16) == 0.0999755859375);
  assert_true(ir_round_dtype(1.0 / 3.0, IR_DT_F16) == 0.333251953125);
  assert_true(ir_round_dtype(65519.0, IR_DT_F16) == 65504.0);
  assert_true(isinf(ir_round_dtype(65520.0, IR_DT_F16)));
  assert_true(ir_round_dtype(ldexp(1, -25), IR_DT_F16) == 0.0);
  assert_true(ir_round_dtype(3 * ldexp(1, -26), IR_DT_F16) == ldexp(1, -24));
  assert_true(ir_round_dtype(-2.5e-5, IR_DT_F16) == -2.4974346160888672e-05);
  /* f32, i32, bool. */
  assert_true(ir_round_dtype(0.1, IR_DT_F32) == (double)0.1f);
  assert_true(ir_round_dtype(1.0 + 1e-9, IR_DT_F32) == 1.0);
  assert_true(ir_round_dtype(1.0 + 1e-9, IR_DT_F64) == 1.0 + 1e-9);
  assert_true(ir_round_dtype(-7.0, IR_DT_I32) == -7.0);
  assert_true(ir_round_dtype(2.5, IR_DT_BOOL) == 1.0);
  assert_true(ir_round_dtype(0.0, IR_DT_BOOL) == 0.0);
}

static void test_scalar_ops(void **state) {
  (void)state;
  assert_true(ir_scalar_unary(IR_OP_RSQRT, 4.0, 0) == 0.5);
  assert_true(ir_scalar_unary(IR_OP_POW, 2.0, 3.0) == 8.0);
  assert_true(isnan(ir_scalar_unary(IR_OP_RELU, NAN, 0)));   /* torch.relu keeps NaN */
  assert_true(ir_scalar_unary(IR_OP_RELU, -2.0, 0) == 0.0);
  assert_true(ir_scalar_unary(IR_OP_SIGMOID, -1000.0, 0) == 0.0); /* no overflow */
  assert_true(fabs(ir_scalar_unary(IR_OP_GELU, 1.0, 0) - 0.8411919906082768) < 1e-15);
  assert_true(ir_scalar_unary(IR_OP_SIGN, -3.0, 0) == -1.0);
  assert_true(isnan(ir_scalar_binary(IR_OP_MAXIMUM, NAN, 1.0))); /* torch.maximum propagates NaN */
  assert_true(isnan(ir_scalar_binary(IR_OP_MINIMUM, 1.0, NAN)));
  assert_true(ir_scalar_binary(IR_OP_LE, 1.0, 1.0) == 1.0);
  assert_true(ir_scalar_binary(IR_OP_NE, NAN, NAN) == 1.0);
  assert_true(ir_scalar_cast(-2.7, IR_DT_I32) == -2.0); /* toward zero */
  assert_true(ir_scalar_cast(INFINITY, IR_DT_I32) == 0.0);
  assert_true(ir_scalar_cast(0.25, IR_DT_BOOL) == 1.0);
  /* language v2, against tabulated values */
  assert_true(fabs(ir_scalar_unary(IR_OP_ERF, 1.0, 0) - 0.8427007929497149) < 1e-15);
  assert_true(fabs(ir_scalar_unary(IR_OP_GELU_ERF, 1.0, 0) - 0.8413447460685429) < 1e-15);
  assert_true(fabs(ir_scalar_unary(IR_OP_GELU_ERF, -3.0, 0) + 0.0040496940948903) < 1e-15);
  assert_true(fabs(ir_scalar_unary(IR_OP_GELU_ERF, -10.0, 0) + 7.619853024160527e-23) < 1e-36); /* no cancellation */
  assert_true(ir_scalar_unary(IR_OP_GELU_ERF_GRAD, 0.0, 0) == 0.5);
  assert_true(fabs(ir_scalar_unary(IR_OP_GELU_ERF_GRAD, 1.0, 0) - 1.0833154705876863) < 1e-15);
  assert_true(fabs(ir_scalar_unary(IR_OP_SOFTPLUS, 0.0, 0) - 0.6931471805599453) < 1e-15);
  assert_true(ir_scalar_unary(IR_OP_SOFTPLUS, 25.0, 0) == 25.0); /* past the threshold: x */
  assert_true(fabs(ir_scalar_unary(IR_OP_SOFTPLUS, -30.0, 0) - 9.357622968839737e-14) < 1e-27); /* e^-30 - e^-60/2 */
  assert_true(fabs(ir_scalar_unary(IR_OP_LOG1P, 1e-10, 0) - 9.9999999995e-11) < 1e-25);
  assert_true(fabs(ir_scalar_unary(IR_OP_SIN, 0.5235987755982989, 0) - 0.5) < 1e-15);
  assert_true(ir_scalar_unary(IR_OP_COS, 0.0, 0) == 1.0);
  assert_true(ir_scalar_unary(IR_OP_CLAMP, 3.0, 0) == 3.0); /* no bounds without its attributes */
}

/* ------------------------------------------------------------------ */
/* Op properties (the flags column of ops.def)                         */
/* ------------------------------------------------------------------ */

/* Is `name` one of the space-separated words of `list`? */
static bool listed(const char *list, const char *name) {
  size_t n = strlen(name);
  for (const char *p = list; *p;) {
    size_t k = strcspn(p, " ");
    if (k == n && memcmp(p, name, n) == 0) return true;
    p += k;
    p += strspn(p, " ");
  }
  return false;
}

#define EW_UNARY                                                                                           \
  "neg exp log sqrt rsqrt tanh sigmoid relu gelu silu abs sign pow gelu_grad cast detach "                 \
  "clamp sin cos log1p softplus erf gelu_erf gelu_erf_grad"
#define EW_BINARY "add sub mul div maximum minimum"
#define EW_COMPARE "eq ne lt le gt ge"
#define EW EW_UNARY " " EW_BINARY " " EW_COMPARE " select"
#define COLLECTIVES                                                                                        \
  "all_reduce.start all_reduce.wait all_gather.start all_gather.wait reduce_scatter.start "               \
  "reduce_scatter.wait tp.copy tp.scatter rank.slice rank.concat"

/* Each flag and the ops that have it, written out: the lists the flags
 * replaced (the code generators' elementwise lists, the kernel model's
 * group-0 and row-kernel lists, the executors' view and collective lists). */
static const struct {
  unsigned flag;
  const char *ops;
} flag_ops[] = {
    {IR_OPF_UNARY, EW_UNARY},
    {IR_OPF_BINARY, EW_BINARY},
    {IR_OPF_COMPARE, EW_COMPARE},
    {IR_OPF_FOLD, "neg exp log sqrt rsqrt pow cast add sub mul div maximum minimum "
                  "sin cos log1p softplus erf gelu_erf gelu_erf_grad"},
    {IR_OPF_HINT, "const cast arange random"},
    {IR_OPF_POINT, EW " broadcast mse_loss grad.seed loss.term"},
    {IR_OPF_ROW, EW " broadcast mse_loss grad.seed loss.term sum mean max logsumexp softmax log_softmax "
                 "layer_norm rms_norm causal_mask one_hot embedding unslice cross_entropy random"},
    {IR_OPF_RED, "sum mean max logsumexp softmax log_softmax layer_norm rms_norm cross_entropy"},
    {IR_OPF_EXEC, "const reshape matmul window.sum loss.scale loss grad rng.state output update " COLLECTIVES},
    {IR_OPF_VIEW, "reshape permute slice concat"},
    {IR_OPF_START, "all_reduce.start all_gather.start reduce_scatter.start"},
    {IR_OPF_WAIT, "all_reduce.wait all_gather.wait reduce_scatter.wait"},
    {IR_OPF_RANKCOPY, "tp.scatter rank.slice rank.concat"},
    {IR_OPF_OPAQUE, "window.sum loss.scale grad.seed loss.term loss grad output update " COLLECTIVES},
    {IR_OPF_COSTLY, "exp log sqrt rsqrt tanh sigmoid gelu silu pow gelu_grad "
                    "sin cos log1p softplus erf gelu_erf gelu_erf_grad"},
};

static void test_op_flags_as_listed(void **state) {
  (void)state;
  unsigned all = 0;
  for (size_t k = 0; k < sizeof flag_ops / sizeof flag_ops[0]; k++) {
    all |= flag_ops[k].flag;
    for (int i = 0; i < IR_OP_COUNT; i++) {
      const char *name = ir_op_info[i].name;
      if (ir_op_is((IrOpcode)i, flag_ops[k].flag) != listed(flag_ops[k].ops, name))
        fail_msg("'%s' %s flag %#x", name, listed(flag_ops[k].ops, name) ? "lacks" : "has", flag_ops[k].flag);
    }
  }
  /* Every flag is listed above; the rest of the bits are the kind's. */
  assert_int_equal(all, ((1u << IR_OPF_NFLAGS) - 1) & ~((1u << IR_KIND_COUNT) - 1));
  for (int i = 0; i < IR_OP_COUNT; i++)
    assert_int_equal(ir_op_info[i].flags & ~all, 1u << ir_op_info[i].kind);
}

/* The family column, and the case labels IR_CASES generates from the
 * table: a switch over every opcode names each one once. */
static int case_group(IrOpcode opc) {
  switch (opc) {
  IR_CASES(UNARY) return 1;
  IR_CASES(NORM) return 2;
  case IR_OP_ADD:
  case IR_OP_SUB:
  case IR_OP_MUL:
  case IR_OP_DIV:
  case IR_OP_MAXIMUM:
  case IR_OP_MINIMUM:
  case IR_OP_EQ:
  case IR_OP_NE:
  case IR_OP_LT:
  case IR_OP_LE:
  case IR_OP_GT:
  case IR_OP_GE:
  case IR_OP_SELECT: return 3;
  case IR_OP_SOFTMAX:
  case IR_OP_LOG_SOFTMAX:
  case IR_OP_CAUSAL_MASK:
  case IR_OP_EMBEDDING:
  case IR_OP_EMBEDDING_GRAD:
  case IR_OP_CROSS_ENTROPY:
  case IR_OP_ONE_HOT:
  case IR_OP_MSE_LOSS:
  case IR_OP_ARANGE:
  case IR_OP_GATHER:
  case IR_OP_GATHER_GRAD:
  case IR_OP_TOPK: return 4;
  case IR_OP_RANDOM: return 4;
  IR_CASES(CONST)
  IR_CASES(REDUCE)
  IR_CASES(MOVEMENT)
  IR_CASES(GEMM)
  IR_CASES(WINDOW)
  IR_CASES(COLLECTIVE)
  IR_CASES(OUTPUT) return 5;
  }
  return 0;
}

static void test_op_family_and_cases(void **state) {
  (void)state;
  for (int i = 0; i < IR_OP_COUNT; i++) {
    IrOpcode opc = (IrOpcode)i;
    const IrOpInfo *info = &ir_op_info[i];
    const char *name = info->name;
    bool norm = listed("layer_norm rms_norm", name);
    assert_int_equal(info->family == IR_FAMILY_UNARY, ir_op_is(opc, IR_OPF_UNARY));
    assert_int_equal(info->family == IR_FAMILY_NORM, norm);
    int want = info->family == IR_FAMILY_UNARY ? 1
               : norm                          ? 2
               : info->kind == IR_KIND_ELEMENTWISE ? 3
               : info->kind == IR_KIND_NN          ? 4
                                                   : 5;
    if (case_group(opc) != want) fail_msg("'%s' in case group %d, not %d", name, case_group(opc), want);
  }
}

/* What the flags mean, against the other columns. */
static void test_op_flags_agree_with_kind_and_arity(void **state) {
  (void)state;
  for (int i = 0; i < IR_OP_COUNT; i++) {
    IrOpcode opc = (IrOpcode)i;
    const IrOpInfo *info = &ir_op_info[i];
    bool ew = info->kind == IR_KIND_ELEMENTWISE;
    assert_true(ir_op_is(opc, 1u << info->kind));
    assert_int_equal(ir_op_is(opc, IR_OPF_ELEMENTWISE), ew);
    int groups = ir_op_is(opc, IR_OPF_UNARY) + ir_op_is(opc, IR_OPF_BINARY) + ir_op_is(opc, IR_OPF_COMPARE);
    if (ew) assert_true(groups == 1 || opc == IR_OP_SELECT);
    else assert_int_equal(groups, 0);
    if (ir_op_is(opc, IR_OPF_UNARY)) assert_int_equal(info->arity, 1);
    if (ir_op_is(opc, IR_OPF_BINARY | IR_OPF_COMPARE)) assert_int_equal(info->arity, 2);
    if (ir_op_is(opc, IR_OPF_FOLD)) assert_true(ir_op_is(opc, IR_OPF_UNARY | IR_OPF_BINARY));
    if (ew) assert_true(ir_op_is(opc, IR_OPF_POINT));
    if (ir_op_is(opc, IR_OPF_POINT | IR_OPF_RED)) assert_true(ir_op_is(opc, IR_OPF_ROW));
    if (ir_op_is(opc, IR_OPF_EXEC)) assert_false(ir_op_is(opc, IR_OPF_ROW));
    if (ir_op_is(opc, IR_OPF_VIEW)) assert_int_equal(info->kind, IR_KIND_MOVEMENT);
    if (ir_op_is(opc, IR_OPF_START | IR_OPF_WAIT | IR_OPF_RANKCOPY)) assert_int_equal(info->kind, IR_KIND_COLLECTIVE);
    if (info->kind == IR_KIND_COLLECTIVE || info->kind == IR_KIND_OUTPUT)
      assert_true(ir_op_is(opc, IR_OPF_EXEC) && ir_op_is(opc, IR_OPF_OPAQUE));
    assert_int_equal(ir_op_is(opc, IR_OPF_OPAQUE), ir_op_is(opc, IR_OPF_WINDOW | IR_OPF_COLLECTIVE | IR_OPF_OUTPUT));
  }
}

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

/* patches (im2col) and patches_grad: [N, C, H, W] -> [N, C, KH, KW, OH, OW]
 * with OH = (H + 2p - dil*(KH-1) - 1) / stride + 1, as F.unfold. */
static void test_shape_patches(void **state) {
  (void)state;
  int64_t k[] = {3, 2}, s[] = {2, 1}, p[] = {1, 0}, d[] = {1, 2}, one[] = {1, 1}, zero[] = {0, 0}, big[] = {5, 5};
  IrAttr a[5] = {ir_attr_ints("kernel", k, 2), ir_attr_ints("stride", s, 2), ir_attr_ints("padding", p, 2),
                 ir_attr_ints("dilation", d, 2), ir_attr_float("value", 0.0)};
  /* H: (7 + 2 - 2 - 1) / 2 + 1 = 4; W: (6 + 0 - 2 - 1) / 1 + 1 = 4 */
  assert_string_equal(infer(IR_OP_PATCHES, "f32[2,3,7,6]", a, 5, NULL), "f32[2,3,3,2,4,4]");
  assert_string_equal(infer(IR_OP_PATCHES, "f64[7,6]", a, 5, NULL), "f64[3,2,4,4]");
  a[0] = ir_attr_ints("kernel", big, 2);
  a[1] = a[3] = ir_attr_ints("stride", one, 2);
  a[3].key = "dilation";
  a[2] = ir_attr_ints("padding", zero, 2);
  assert_has(infer(IR_OP_PATCHES, "f32[2,3,4,6]", a, 5, NULL),
             "kernel 5 (dilation 1, spanning 5) is larger than axis 2 of f32[2,3,4,6] padded by 0 (4)");
  a[2] = ir_attr_ints("padding", one, 2);
  assert_string_equal(infer(IR_OP_PATCHES, "f32[2,3,4,6]", a, 5, NULL), "f32[2,3,5,5,2,4]");
  a[1] = ir_attr_ints("stride", zero, 2);
  assert_has(infer(IR_OP_PATCHES, "f32[2,3,4,6]", a, 5, NULL), "stride 0 must be positive");
  a[1] = ir_attr_ints("stride", k, 1);
  assert_has(infer(IR_OP_PATCHES, "f32[2,3,4,6]", a, 5, NULL), "'stride' has 1 entries, 'kernel' 2");
  a[1] = ir_attr_ints("stride", one, 2);
  assert_has(infer(IR_OP_PATCHES, "f32[2,3,4,6]", a, 4, NULL), "'patches' needs attribute 'value'");
  assert_has(infer(IR_OP_PATCHES, "f32[2,3,4,6,1,1,1]", a, 5, NULL), "the result would have rank 9, at most 8");
  assert_has(infer(IR_OP_PATCHES, "i32[2,3,4,6]", a, 5, NULL), "floating-point");
  int64_t img[] = {2, 3, 4, 6};
  a[4] = ir_attr_ints("shape", img, 4);
  assert_string_equal(infer(IR_OP_PATCHES_GRAD, "f32[2,3,5,5,2,4]", a, 5, NULL), "f32[2,3,4,6]");
  assert_has(infer(IR_OP_PATCHES_GRAD, "f32[2,3,5,5,2,5]", a, 5, NULL),
             "the patches of shape [2,3,4,6] are f32[2,3,5,5,2,4], but the operand is f32[2,3,5,5,2,5]");
}

static void test_shape_concat(void **state) {
  (void)state;
  IrAttr ax = ir_attr_int("axis", -1);
  assert_string_equal(infer(IR_OP_CONCAT, "f32[2,3] f32[2,4] f32[2,1]", &ax, 1, NULL), "f32[2,8]");
  assert_string_equal(infer(IR_OP_CONCAT, "f32[2,3]", &ax, 1, NULL), "f32[2,3]");
  assert_has(infer(IR_OP_CONCAT, "f32[2,3] f32[3,3]", &ax, 1, NULL), "cannot join f32[2,3] and f32[3,3] along axis 1");
  assert_has(infer(IR_OP_CONCAT, "f32[2,3] f64[2,3]", &ax, 1, NULL), "cannot join f32[2,3] and f64[2,3]");
  assert_has(infer(IR_OP_CONCAT, "f32[2,3] f32[2,3]", NULL, 0, NULL), "'concat' needs attribute 'axis'");
  assert_has(infer(IR_OP_CONCAT, "", &ax, 1, NULL), "takes at least one operand");
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
  assert_has(infer(IR_OP_LAYER_NORM, "f32[4,8] f32[8] f32[8]", NULL, 0, NULL), "'layer_norm' needs attribute 'eps'");
  /* Every norm that builds has its eps: ir_op_eps reads it, no default. */
  IrAttr eps3 = ir_attr_float("eps", 1e-3);
  IrValue *nargs[2] = {arg_of("f32[4,8]"), arg_of("f32[8]")};
  IrOp *rms = ir_build(fn, IR_OP_RMS_NORM, nargs, 2, &eps3, 1, NULL, (IrLoc){0}, err, sizeof err);
  assert_non_null(rms);
  assert_true(ir_op_eps(rms) == 1e-3);

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

/* Language v2: clamp's optional bounds, arange, gather, gather_grad, topk. */
static void test_shape_v2_math_and_selection(void **state) {
  (void)state;
  assert_string_equal(infer(IR_OP_CLAMP, "f32[2,3]", NULL, 0, NULL), "f32[2,3]");
  IrAttr lo = ir_attr_float("min", -1.0), hi = ir_attr_str("max", "one");
  assert_string_equal(infer(IR_OP_CLAMP, "f64[4]", &lo, 1, NULL), "f64[4]");
  assert_has(infer(IR_OP_CLAMP, "f64[4]", &hi, 1, NULL), "'clamp' attribute 'max' must be a number");
  assert_has(infer(IR_OP_SIN, "i32[4]", NULL, 0, NULL), "'sin' needs a floating-point operand, got i32[4]");
  assert_string_equal(infer(IR_OP_GELU_ERF, "bf16[3]", NULL, 0, NULL), "bf16[3]");

  assert_string_equal(infer(IR_OP_ARANGE, "", NULL, 0, "i32[7]"), "i32[7]");
  assert_string_equal(infer(IR_OP_ARANGE, "", NULL, 0, "f32[3]"), "f32[3]");
  assert_has(infer(IR_OP_ARANGE, "", NULL, 0, "f32[3,2]"), "rank-1 numeric result type, got f32[3,2]");
  assert_has(infer(IR_OP_ARANGE, "", NULL, 0, NULL), "needs a result type");

  IrAttr ax = ir_attr_int("axis", 1);
  assert_string_equal(infer(IR_OP_GATHER, "f32[4,7] i32[4,5]", &ax, 1, NULL), "f32[4,5]");
  assert_string_equal(infer(IR_OP_GATHER, "f64[4,7,3] i32[4,9,3]", &ax, 1, NULL), "f64[4,9,3]");
  assert_has(infer(IR_OP_GATHER, "f32[4,7] f32[4,5]", &ax, 1, NULL), "the index must be i32, got f32[4,5]");
  assert_has(infer(IR_OP_GATHER, "f32[4,7] i32[3,5]", &ax, 1, NULL),
             "index i32[3,5] must have the dims of the operand f32[4,7] except along axis 1");
  assert_has(infer(IR_OP_GATHER, "f32[4,7] i32[4]", &ax, 1, NULL), "except along axis 1");
  IrAttr ax5 = ir_attr_int("axis", 5);
  assert_has(infer(IR_OP_GATHER, "f32[4,7] i32[4,5]", &ax5, 1, NULL), "axis 5 is out of range for f32[4,7]");
  assert_has(infer(IR_OP_GATHER, "f32[4,7] i32[4,5]", NULL, 0, NULL), "'gather' needs attribute 'axis'");

  int64_t dims[2] = {4, 7};
  IrAttr gg[2] = {ir_attr_int("axis", 1), ir_attr_ints("shape", dims, 2)};
  assert_string_equal(infer(IR_OP_GATHER_GRAD, "i32[4,5] f32[4,5]", gg, 2, NULL), "f32[4,7]");
  assert_has(infer(IR_OP_GATHER_GRAD, "i32[4,5] f32[4,6]", gg, 2, NULL), "gradient f32[4,6] does not match indices");
  gg[0] = ir_attr_int("axis", 0);
  assert_has(infer(IR_OP_GATHER_GRAD, "i32[4,5] f32[4,5]", gg, 2, NULL), "except along axis 0");

  IrAttr tk[2] = {ir_attr_int("k", 3), ir_attr_int("axis", -1)};
  assert_string_equal(infer(IR_OP_TOPK, "f32[4,7]", tk, 2, NULL), "i32[4,3]");
  tk[1] = ir_attr_int("axis", 0);
  assert_string_equal(infer(IR_OP_TOPK, "f64[4,7]", tk, 2, NULL), "i32[3,7]");
  tk[0] = ir_attr_int("k", 5);
  assert_has(infer(IR_OP_TOPK, "f32[4,7]", tk, 2, NULL), "k = 5 is out of range [1, 4] for axis 0 of f32[4,7]");
  tk[0] = ir_attr_int("k", 0);
  assert_has(infer(IR_OP_TOPK, "f32[4,7]", tk, 2, NULL), "k = 0 is out of range");
  tk[0] = ir_attr_int("k", 1);
  assert_has(infer(IR_OP_TOPK, "i32[4,7]", tk, 2, NULL), "'topk' needs a floating-point operand");
  assert_has(infer(IR_OP_TOPK, "f32", tk, 2, NULL), "rank >= 1");
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

/* ------------------------------------------------------------------ */
/* Text form                                                           */
/* ------------------------------------------------------------------ */

static char *print_str(const IrFunc *f) {
  StrBuf sb;
  sb_init(&sb);
  ir_print(f, &sb);
  char *s = strdup(sb_str(&sb));
  sb_free(&sb);
  return s;
}

/* Read text named "t.gir"; on failure returns NULL and the diagnostics in *log. */
static IrFunc *read_str(const char *text, size_t len, char *log, size_t loglen) {
  SrcFile src = {"t.gir", text, len};
  Diag d;
  diag_init(&d, NULL);
  d.quiet = true;
  IrFunc *f = ir_read(&src, &d);
  if (log) snprintf(log, loglen, "%s", sb_str(&d.log));
  diag_free(&d);
  return f;
}

/* A function using every attribute kind, a variadic op, unnamed args,
 * rebound names and both location forms, built by hand. */
static IrFunc *sample(void) {
  IrFunc *f = ir_func_new("pub_mlp");
  IrValue *x = ir_func_add_arg(f, "x", ty("f32[5,7]"), IR_ARG_INPUT, true);
  IrValue *y = ir_func_add_arg(f, "y", ty("i32[5]"), IR_ARG_INPUT, true);
  IrValue *w = ir_func_add_arg(f, "W1", ty("f32[7,18]"), IR_ARG_PARAM, false);
  IrValue *b = ir_func_add_arg(f, NULL, ty("f32[18]"), IR_ARG_PARAM, false);
  IrValue *m = ir_func_add_arg(f, NULL, ty("f64"), IR_ARG_INPUT, false);
  IrLoc l1 = {"pub_mlp.gdl", 20, 15}, none = {0};
  IrValue *mm = ir_matmul(f, x, w, l1);
  IrValue *h = ir_binary(f, IR_OP_ADD, mm, b, (IrLoc){"pub_mlp.gdl", 20, 19});
  h->name = "h";
  IrValue *h2 = ir_unary(f, IR_OP_TANH, h, (IrLoc){"pub_mlp.gdl", 21, 3});
  h2->name = "h"; /* rebound: prints as h.1 */
  IrValue *xx = ir_unary(f, IR_OP_RELU, h2, none);
  xx->name = "x"; /* clashes with the argument: x.1 */
  IrValue *xx1 = ir_unary(f, IR_OP_EXP, xx, none);
  xx1->name = "x.1"; /* taken by the previous one: x.1.1 */
  int64_t all[] = {0, 1};
  IrValue *s = ir_reduce(f, IR_OP_SUM, xx1, all, 2, false, (IrLoc){"pub_mlp.gdl", 24, 19});
  IrValue *s2 = ir_reduce(f, IR_OP_MEAN, h2, NULL, 0, true, none);
  IrValue *c = ir_const(f, 0.001, IR_DT_F32, (IrLoc){"dir/we\"ird\\.gdl", 1, 2});
  IrValue *c2 = ir_const(f, -INFINITY, IR_DT_F32, none);
  IrValue *c3 = ir_const(f, 2.0, IR_DT_F64, none);
  IrAttr ci = ir_attr_int("value", -7);
  IrType ti = ty("i32[2]");
  ir_emit(f, IR_OP_CONST, NULL, 0, &ci, 1, &ti, none);
  IrAttr ax = ir_attr_int("axis", 0);
  IrValue *cat[3] = {h2, h, mm};
  ir_emit(f, IR_OP_CONCAT, cat, 3, &ax, 1, NULL, none);
  IrAttr ce[2] = {ir_attr_int("ignore_index", -100), ir_attr_str("reduction", "mean")};
  IrValue *lg[2] = {h2, y};
  IrValue *loss = ir_emit(f, IR_OP_CROSS_ENTROPY, lg, 2, ce, 2, NULL, l1);
  loss->name = "ce";
  IrValue *sm[2] = {ir_binary(f, IR_OP_MUL, s, c, none), c2};
  ir_binary(f, IR_OP_ADD, sm[0], sm[1], none);
  ir_binary(f, IR_OP_SUB, m, c3, none);
  (void)s2;
  IrAttr pe = ir_attr_float("exponent", 3.0);
  ir_emit(f, IR_OP_POW, &h2, 1, &pe, 1, NULL, none);
  IrAttr nm = ir_attr_str("name", "c\"e\\");
  ir_emit(f, IR_OP_LOSS, &loss, 1, &nm, 1, NULL, (IrLoc){"pub_mlp.gdl", 23, 3});
  IrAttr gn = ir_attr_str("name", "W1");
  ir_emit(f, IR_OP_GRAD, &w, 1, &gn, 1, NULL, none);
  return f;
}

static const char sample_text[] =
    "func @pub_mlp(%x: f32[5,7] input batch, %y: i32[5] input batch, %W1: f32[7,18] param, %0: f32[18] param, "
    "%1: f64 input) {\n"
    "  %2 = matmul %x, %W1 : f32[5,18]  loc(\"pub_mlp.gdl\":20:15)\n"
    "  %h = add %2, %0 : f32[5,18]  loc(\"pub_mlp.gdl\":20:19)\n"
    "  %h.1 = tanh %h : f32[5,18]  loc(\"pub_mlp.gdl\":21:3)\n"
    "  %x.1 = relu %h.1 : f32[5,18]  loc(unknown)\n"
    "  %x.1.1 = exp %x.1 : f32[5,18]  loc(unknown)\n"
    "  %3 = sum %x.1.1 {axes=[0,1], keepdim=false} : f32  loc(\"pub_mlp.gdl\":24:19)\n"
    "  %4 = mean %h.1 {axes=[], keepdim=true} : f32[1,1]  loc(unknown)\n"
    "  %5 = const {value=0.001} : f32  loc(\"dir/we\\\"ird\\\\.gdl\":1:2)\n"
    "  %6 = const {value=-inf} : f32  loc(unknown)\n"
    "  %7 = const {value=2.0} : f64  loc(unknown)\n"
    "  %8 = const {value=-7} : i32[2]  loc(unknown)\n"
    "  %9 = concat %h.1, %h, %2 {axis=0} : f32[15,18]  loc(unknown)\n"
    "  %ce = cross_entropy %h.1, %y {ignore_index=-100, reduction=\"mean\"} : f32  loc(\"pub_mlp.gdl\":20:15)\n"
    "  %10 = mul %3, %5 : f32  loc(unknown)\n"
    "  %11 = add %10, %6 : f32  loc(unknown)\n"
    "  %12 = sub %1, %7 : f64  loc(unknown)\n"
    "  %13 = pow %h.1 {exponent=3.0} : f32[5,18]  loc(unknown)\n"
    "  loss %ce {name=\"c\\\"e\\\\\"}  loc(\"pub_mlp.gdl\":23:3)\n"
    "  grad %W1 {name=\"W1\"}  loc(unknown)\n"
    "}\n";

static void test_print_writes_documented_format(void **state) {
  (void)state;
  IrFunc *f = sample();
  char *text = print_str(f);
  assert_string_equal(text, sample_text);
  free(text);
  ir_func_free(f);
}

static void test_print_read_round_trip(void **state) {
  (void)state;
  IrFunc *f = sample();
  char *t1 = print_str(f);
  char log[2048];
  IrFunc *g = read_str(t1, strlen(t1), log, sizeof log);
  if (!g) fail_msg("reader rejected printed IR:\n%s", log);
  char *t2 = print_str(g);
  assert_string_equal(t1, t2);
  /* The reader rebuilt the same graph: names, roles, attributes, locations. */
  assert_int_equal(g->nops, f->nops);
  assert_int_equal(g->nargs, 5);
  assert_string_equal(g->args[0]->name, "x");
  assert_true(g->args[0]->batched);
  assert_null(g->args[3]->name); /* numbered: the number is not kept */
  assert_int_equal(g->args[3]->role, IR_ARG_PARAM);
  assert_string_equal(g->ops[2]->result->name, "h.1");
  assert_ptr_equal(g->ops[2]->args[0], g->ops[1]->result);
  const IrAttr *v = ir_attr_get(g->ops[8], "value");
  assert_int_equal(v->kind, IR_ATTR_FLOAT);
  assert_true(isinf(v->f) && v->f < 0);
  assert_int_equal(ir_attr_get(g->ops[10], "value")->kind, IR_ATTR_INT);
  assert_string_equal(g->ops[7]->loc.file, "dir/we\"ird\\.gdl");
  assert_string_equal(ir_attr_get_str(g->ops[17], "name", ""), "c\"e\\");
  char err2[256];
  assert_true(ir_verify(g, err2, sizeof err2));
  free(t1);
  free(t2);
  ir_func_free(g);
  ir_func_free(f);
}

static void test_read_accepts_dumps_and_comments(void **state) {
  (void)state;
  const char *text = "// -----// IR Dump After cse //----- //\n"
                     "\n"
                     "func @f(%a: f32[2] param) {   // trailing comment\n"
                     "\n"
                     "  %t = neg %a : f32[2]\n"
                     "  %17 = exp %t:f32[2] loc(unknown)  // numbers are renumbered\n"
                     "  grad %17 {name=\"a\"}\n"
                     "}\n"
                     "// end\n";
  char log[1024];
  IrFunc *f = read_str(text, strlen(text), log, sizeof log);
  if (!f) fail_msg("%s", log);
  char *t = print_str(f);
  assert_string_equal(t, "func @f(%a: f32[2] param) {\n"
                         "  %t = neg %a : f32[2]  loc(unknown)\n"
                         "  %0 = exp %t : f32[2]  loc(unknown)\n"
                         "  grad %0 {name=\"a\"}  loc(unknown)\n"
                         "}\n");
  free(t);
  ir_func_free(f);
}

/* Each malformed input gives one error at the expected place. */
static void test_read_error_positions(void **state) {
  (void)state;
  static const struct {
    const char *text, *want;
  } cases[] = {
      {"func @f(%x: f32[3] input) {\n  %0 = foo %x : f32[3]\n}\n", "t.gir:2:8: error: unknown op 'foo'\n"},
      {"func @f(%x: f32[3] input) {\n  %0 = exp %y : f32[3]\n}\n", "t.gir:2:12: error: undefined value '%y'\n"},
      {"func @f(%x: f32[3] input) {\n  %x = exp %x : f32[3]\n}\n", "t.gir:2:3: error: redefinition of '%x'\n"},
      {"func @f(%x: f32[3] input) {\n  %0 = exp %x : f32[4]\n}\n",
       "t.gir:2:8: error: 'exp' has type f32[3], but f32[4] was declared\n"},
      {"func @f(%x: f32[3] input, %w: f32[4,5] param) {\n  %0 = matmul %x, %w : f32[5]\n}\n",
       "t.gir:2:8: error: f32[3] @ f32[4,5]: inner dimensions 3 and 4 differ\n"},
      {"func @f(%x: f32[3] input) {\n  %0 = exp %x : f32[3] loc(unknown) junk\n}\n",
       "t.gir:2:37: error: unexpected 'junk' after the op\n"},
      {"func @f(%x: f32[3] input) {\n  %0 = exp %x : f32[3]\n", "t.gir:3:1: error: expected '}' (to close '{' at line 1)\n"},
      {"func @f(%x: f33[3] input) {\n}\n", "t.gir:1:13: error: unknown type 'f33'\n"},
      {"func @f(%x: f32[3] input) {\n  %0 = sum %x {axes=true, keepdim=false} : f32\n}\n",
       "t.gir:2:8: error: 'sum' attribute 'axes' must be a list of integers\n"},
      {"func @f(%x: f32[3] input) {\n  %0 = sum %x {axes=[0], axes=[0]} : f32\n}\n",
       "t.gir:2:26: error: duplicate attribute 'axes'\n"},
      {"func @f(%x: f32[3] input) {\n  %0 = sum %x {axes=*} : f32\n}\n", "t.gir:2:21: error: unexpected character '*'\n"},
      /* A misspelt attribute would be ignored and its default taken. */
      {"func @f(%x: f32[3] input) {\n  %0 = exp %x {bogus=[1,2]} : f32[3]\n}\n",
       "t.gir:2:16: error: unknown attribute 'bogus' (docs/IR.md lists them)\n"},
      {"func @f(%x: f32[3] input) {\n  %0 = sum %x {axes=[0], keepdims=false} : f32\n}\n",
       "t.gir:2:26: error: unknown attribute 'keepdims' (docs/IR.md lists them)\n"},
      {"func @f(%x: f32[3] input) {\n  %0 = sum %x {axes=x} : f32\n}\n",
       "t.gir:2:21: error: expected an attribute value, got 'x'\n"},
      {"func @f(%x: f32[99999999999999999999] input) {\n}\n", "t.gir:1:17: error: integer out of range\n"},
      {"func @f(%x: f32[1099511627776] input) {\n}\n", "t.gir:1:17: error: dimension 1099511627776 out of range\n"},
      {"func @f(%x: f32[-1] input) {\n}\n", "t.gir:1:17: error: dimension -1 out of range\n"},
      {"func @f(%x: f32[1,1,1,1,1,1,1,1,1] input) {\n}\n", "t.gir:1:33: error: more than 8 dimensions\n"},
      {"func @f() {\n}\nfunc @g() {\n}\n", "t.gir:3:1: error: expected end of file after the function, got 'func'\n"},
      {"func @f(%x: f32 input) {\n  loss %x\n}\n", "t.gir:2:3: error: 'loss' needs attribute 'name'\n"},
      {"func @f(%x: f32[2,4] input, %w: f32[4] param) {\n  %y = rms_norm %x, %w : f32[2,4]\n}\n",
       "t.gir:2:8: error: 'rms_norm' needs attribute 'eps'\n"},
      {"func @f(%x: f32 input) {\n  %l = loss %x {name=\"l\"}\n}\n", "t.gir:2:3: error: 'loss' has no result\n"},
      {"func @f(%x: f32 input) {\n  exp %x : f32\n}\n", "t.gir:2:3: error: 'exp' needs a result"},
      {"func @f(%x: f32 input) {\n  %0 = exp %x\n}\n", "t.gir:3:1: error: expected ':' and the result type, got '}'\n"},
      {"func @f(%x: f32 wat) {\n}\n", "t.gir:1:17: error: expected 'input', 'param' or 'buffer', got 'wat'\n"},
      {"func @f(%x: f32 input) {\n  %0 = exp %x : f32 loc(\"a\":1:99999999999)\n}\n",
       "t.gir:2:31: error: column number out of range\n"},
      {"func @f(%x: f32 input) {\n  %0 = const {value=\"unterminated} : f32\n}\n",
       "t.gir:2:21: error: unterminated string\n"},
      {"func @f(%x: f32 input) {\n  %0 = const {value=1.5e} : f32\n}\n", "t.gir:2:21: error: malformed number\n"},
      {"", "t.gir:1:1: error: expected 'func', got end of file\n"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char log[2048];
    IrFunc *f = read_str(cases[i].text, strlen(cases[i].text), log, sizeof log);
    if (f) fail_msg("case %zu: accepted:\n%s", i, cases[i].text);
    if (strncmp(log, cases[i].want, strlen(cases[i].want)) != 0)
      fail_msg("case %zu: got\n%s\nwant\n%s", i, log, cases[i].want);
  }
  /* The caret sits under the column. */
  char log[2048];
  const char *text = "func @f(%x: f32[3] input) {\n  %0 = exp %y : f32[3]\n}\n";
  assert_null(read_str(text, strlen(text), log, sizeof log));
  assert_string_equal(log, "t.gir:2:12: error: undefined value '%y'\n  %0 = exp %y : f32[3]\n           ^\n");
  /* An embedded NUL is an error, reported without the source excerpt. */
  const char nul[] = "func @f(%x: f32 input) {\n  %0 = exp\0 %x : f32\n}\n";
  assert_null(read_str(nul, sizeof nul - 1, log, sizeof log));
  assert_string_equal(log, "t.gir:2:11: error: unexpected byte 0x00\n");
}

/* Truncations and byte mutations of a valid dump never crash the reader,
 * and whatever it accepts prints and re-reads to the same text. */
static void test_read_survives_mutations(void **state) {
  (void)state;
  size_t n = strlen(sample_text);
  char *buf = malloc(n + 1);
  static const char bytes[] = "%@{}[](),:=\"\\-.0123456789ex \n\0\xff";
  Rng rng;
  rng_seed(&rng, 42);
  for (int it = 0; it < 3000; it++) {
    memcpy(buf, sample_text, n + 1);
    size_t len = it < 300 ? (size_t)(rng_next(&rng) % n) : n; /* truncated */
    int muts = it < 300 ? 0 : 1 + (int)(rng_next(&rng) % 4);
    for (int k = 0; k < muts; k++) buf[rng_next(&rng) % len] = bytes[rng_next(&rng) % (sizeof bytes - 1)];
    IrFunc *f = read_str(buf, len, NULL, 0);
    if (f) {
      char err2[512];
      if (!ir_verify(f, err2, sizeof err2)) fail_msg("accepted IR does not verify: %s", err2);
      char *t1 = print_str(f);
      IrFunc *g = read_str(t1, strlen(t1), NULL, 0);
      assert_non_null(g);
      char *t2 = print_str(g);
      assert_string_equal(t1, t2);
      free(t1);
      free(t2);
      ir_func_free(g);
      ir_func_free(f);
    }
  }
  free(buf);
}

/* ------------------------------------------------------------------ */
/* Verifier                                                            */
/* ------------------------------------------------------------------ */

/* f(x: f32[4,8], w: f32[8,8]): a matmul, an all-reduce pair, a loss. */
static IrFunc *small(void) {
  const char *text = "func @f(%x: f32[4,8] input, %w: f32[8,8] param) {\n"
                     "  %y = matmul %x, %w : f32[4,8]\n"
                     "  %s = all_reduce.start %y {group=\"tp\", ranks=2} : f32[4,8]\n"
                     "  %r = all_reduce.wait %s : f32[4,8]\n"
                     "  %t = tanh %r : f32[4,8]\n"
                     "  %l = sum %t {axes=[], keepdim=false} : f32\n"
                     "  loss %l {name=\"l\"}\n"
                     "}\n";
  char log[1024];
  IrFunc *f = read_str(text, strlen(text), log, sizeof log);
  if (!f) fail_msg("%s", log);
  return f;
}

static void expect_verify_error(IrFunc *f, const char *want) {
  char e[1024];
  if (ir_verify(f, e, sizeof e)) fail_msg("verifier accepted broken IR (want '%s')", want);
  assert_has(e, want);
}

static void test_verify_accepts_valid(void **state) {
  (void)state;
  IrFunc *f = small();
  char e[512];
  assert_true(ir_verify(f, e, sizeof e));
  ir_func_free(f);
}

static void test_verify_wrong_result_type(void **state) {
  (void)state;
  IrFunc *f = small();
  f->ops[3]->result->type.shape.dim[0] = 5; /* tanh: f32[5,8] */
  expect_verify_error(f, "'%t = tanh %r : f32[5,8]  loc(unknown)': result type is f32[5,8], but the operands give f32[4,8]");
  ir_func_free(f);
  f = small();
  f->ops[0]->result->type.dtype = IR_DT_F64;
  expect_verify_error(f, "result type is f64[4,8], but the operands give f32[4,8]");
  ir_func_free(f);
}

static void test_verify_use_before_def(void **state) {
  (void)state;
  IrFunc *f = small();
  IrOp *t = f->ops[3];
  f->ops[3] = f->ops[4]; /* sum before the tanh it reads */
  f->ops[4] = t;
  expect_verify_error(f, "'%l = sum %t {axes=[], keepdim=false} : f32  loc(unknown)': operand %t is used before it is defined");
  ir_func_free(f);
  /* an operand whose op was removed from the list */
  f = small();
  f->ops[3]->mark = 1;
  ir_func_remove_marked(f);
  expect_verify_error(f, "operand %t is used before it is defined");
  ir_func_free(f);
}

static void test_verify_wrong_arity(void **state) {
  (void)state;
  IrFunc *f = small();
  f->ops[0]->nargs = 1;
  expect_verify_error(f, "'matmul' takes 2 operands, has 1");
  ir_func_free(f);
}

/* IR built without the reader (a pass, the C API) gets the same check. */
static void test_verify_unknown_attributes(void **state) {
  (void)state;
  IrFunc *f = small();
  IrOp *sum = f->ops[4];
  IrAttr *a = arena_alloc(&f->arena, sizeof(IrAttr) * 3);
  memcpy(a, sum->attrs, sizeof(IrAttr) * 2);
  a[2] = ir_attr_ints("bogus", (const int64_t[]){1, 2}, 2);
  sum->attrs = a;
  sum->nattrs = 3;
  expect_verify_error(f, "'%l = sum %t {axes=[], keepdim=false, bogus=[1,2]} : f32  loc(unknown)': unknown attribute 'bogus'");
  a[2] = a[0];
  expect_verify_error(f, "attribute 'axes' appears twice");
  ir_func_free(f);
}

static void test_verify_wait_without_start(void **state) {
  (void)state;
  IrFunc *f = small();
  f->ops[2]->args[0] = f->ops[0]->result; /* wait on the matmul */
  expect_verify_error(f, "'all_reduce.wait' must wait on the result of 'all_reduce.start'");
  ir_func_free(f);
}

static void test_verify_structure(void **state) {
  (void)state;
  IrFunc *f = small();
  f->ops[1]->result->def = f->ops[0]; /* result points at another op */
  expect_verify_error(f, "result's defining op is another op");
  ir_func_free(f);

  f = small();
  f->ops[5]->result = f->ops[4]->result; /* loss with a result, defined twice */
  expect_verify_error(f, "'loss' must have no result");
  ir_func_free(f);

  f = small();
  f->ops[4]->result = NULL;
  expect_verify_error(f, "'sum' has no result");
  ir_func_free(f);

  f = small();
  f->values[2]->id = 3;
  expect_verify_error(f, "value #2 has id 3");
  ir_func_free(f);

  f = small();
  f->args[0]->def = f->ops[0];
  expect_verify_error(f, "argument 1 has a defining op");
  ir_func_free(f);

  f = small();
  f->ops[4]->attrs[0].kind = IR_ATTR_INT; /* sum {axes=<int>} */
  expect_verify_error(f, "'sum' attribute 'axes' must be a list of integers");
  ir_func_free(f);

  /* a value from another function */
  f = small();
  IrFunc *g = small();
  f->ops[3]->args[0] = g->values[5];
  expect_verify_error(f, "operand 1 is not a value of the function");
  ir_func_free(g);
  ir_func_free(f);
}

static void test_dot_lists_nodes_and_edges(void **state) {
  (void)state;
  IrFunc *f = small();
  char *buf = NULL;
  size_t len = 0;
  FILE *m = open_memstream(&buf, &len);
  ir_write_dot(f, m);
  fclose(m);
  assert_has(buf, "digraph \"f\" {");
  assert_has(buf, "v0 [shape=invhouse, label=\"%x\\nf32[4,8] input\"];");
  assert_has(buf, "op0 [shape=ellipse, label=\"%y = matmul\\nf32[4,8]\"];");
  assert_has(buf, "v0 -> op0;");
  assert_has(buf, "v1 -> op0;");
  assert_has(buf, "op0 -> op1;");
  assert_has(buf, "op4 -> op5;");
  assert_has(buf, "op5 [shape=doublecircle, label=\"loss \\\"l\\\"\"];");
  free(buf);
  ir_func_free(f);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_round_dtype_known_values),
      cmocka_unit_test(test_round_dtype_n_matches_elementwise),
      cmocka_unit_test(test_scalar_ops),
      cmocka_unit_test(test_op_flags_as_listed),
      cmocka_unit_test(test_op_family_and_cases),
      cmocka_unit_test(test_op_flags_agree_with_kind_and_arity),
      cmocka_unit_test_setup_teardown(test_shape_broadcast_helpers, setup, teardown),
      cmocka_unit_test_setup_teardown(test_shape_unary, setup, teardown),
      cmocka_unit_test_setup_teardown(test_shape_const, setup, teardown),
      cmocka_unit_test_setup_teardown(test_shape_binary_broadcasts, setup, teardown),
      cmocka_unit_test_setup_teardown(test_shape_compare_and_select, setup, teardown),
      cmocka_unit_test_setup_teardown(test_shape_reduce, setup, teardown),
      cmocka_unit_test_setup_teardown(test_shape_movement, setup, teardown),
      cmocka_unit_test_setup_teardown(test_shape_slice_unslice, setup, teardown),
      cmocka_unit_test_setup_teardown(test_shape_patches, setup, teardown),
      cmocka_unit_test_setup_teardown(test_shape_concat, setup, teardown),
      cmocka_unit_test_setup_teardown(test_shape_matmul, setup, teardown),
      cmocka_unit_test_setup_teardown(test_shape_nn, setup, teardown),
      cmocka_unit_test_setup_teardown(test_shape_v2_math_and_selection, setup, teardown),
      cmocka_unit_test_setup_teardown(test_shape_window_and_outputs, setup, teardown),
      cmocka_unit_test_setup_teardown(test_shape_collectives, setup, teardown),
      cmocka_unit_test(test_print_writes_documented_format),
      cmocka_unit_test(test_print_read_round_trip),
      cmocka_unit_test(test_read_accepts_dumps_and_comments),
      cmocka_unit_test(test_read_error_positions),
      cmocka_unit_test(test_read_survives_mutations),
      cmocka_unit_test(test_verify_accepts_valid),
      cmocka_unit_test(test_verify_wrong_result_type),
      cmocka_unit_test(test_verify_use_before_def),
      cmocka_unit_test(test_verify_wrong_arity),
      cmocka_unit_test(test_verify_wait_without_start),
      cmocka_unit_test(test_verify_unknown_attributes),
      cmocka_unit_test(test_verify_structure),
      cmocka_unit_test(test_dot_lists_nodes_and_edges),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
