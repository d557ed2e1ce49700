/* test_frontend.c - lowering .gdl to IR: the examples, op counts and
 * attributes for small snippets, rebinding, for/fn, indexing, -D overrides,
 * micro-batch shapes, dims as values, and inputs that must not crash. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "testutil.h"

/* ---- helpers ---- */

static int count_ops(const IrFunc *f, IrOpcode opc) {
  int n = 0;
  for (int i = 0; i < f->nops; i++) n += f->ops[i]->opcode == opc;
  return n;
}

/* The k-th op (from 0) with this opcode. */
static const IrOp *nth_op(const IrFunc *f, IrOpcode opc, int k) {
  for (int i = 0; i < f->nops; i++)
    if (f->ops[i]->opcode == opc && k-- == 0) return f->ops[i];
  fail_msg("no op '%s' #%d", ir_op_info[opc].name, k);
  return NULL;
}

static void assert_ints(const IrOp *op, const char *key, const int64_t *want, int n) {
  const int64_t *v;
  int got = ir_attr_get_ints(op, key, &v);
  assert_int_equal(got, n);
  for (int i = 0; i < n; i++) assert_int_equal(v[i], want[i]);
}

static void assert_shape(const IrValue *v, int rank, const int64_t *dims) {
  assert_int_equal(v->type.shape.rank, rank);
  for (int i = 0; i < rank; i++) assert_int_equal(v->type.shape.dim[i], dims[i]);
}

static void assert_verifies(const FeModel *m) {
  char err[512];
  if (!ir_verify(m->func, err, sizeof err)) fail_msg("IR does not verify: %s", err);
}

/* Compile and expect success; prints the diagnostics otherwise. */
static FeModel *compile_ok(const char *text, int gas) {
  Diag d;
  FeModel *m = tu_compile("t.gdl", text, gas, &d);
  if (!m) fail_msg("compile failed:\n%s", sb_str(&d.log));
  diag_free(&d);
  assert_verifies(m);
  return m;
}

/* Compile with -D overrides. */
static FeModel *compile_defs(const char *text, const char **names, const int64_t *values, int n, int gas, Diag *d) {
  static SrcFile src;
  src = (SrcFile){"t.gdl", text, strlen(text)};
  diag_init(d, NULL);
  d->quiet = true;
  FeOptions opt = {.def_names = names, .def_values = values, .ndefs = n, .gas = gas, .dp = 1};
  return fe_model_compile(&src, &opt, d);
}

static const FeParam *param(const FeModel *m, const char *name) {
  for (int i = 0; i < m->nparams; i++)
    if (strcmp(m->params[i].name, name) == 0) return &m->params[i];
  fail_msg("no param %s", name);
  return NULL;
}

/* ---- the examples ---- */

static void test_frontend_example_mlp(void **state) {
  (void)state;
  char *text = tu_read("examples/mlp.gdl");
  FeModel *m = compile_ok(text, 1);
  const IrFunc *f = m->func;
  assert_string_equal(m->name, "mlp");
  assert_int_equal(f->nargs, 5);
  static const char *const args[] = {"x", "y", "W1", "b1", "W2"};
  for (int i = 0; i < 5; i++) assert_string_equal(f->args[i]->name, args[i]);
  assert_int_equal(m->ninputs, 2);
  assert_int_equal(m->nparams, 3);
  assert_int_equal(m->ndims, 3);
  assert_string_equal(m->batch, "B");
  assert_int_equal(m->batch_window, 64);
  assert_int_equal(m->batch_micro, 64);
  assert_int_equal(m->nlosses, 2);
  assert_string_equal(m->losses[0], "ce");
  assert_string_equal(m->losses[1], "l2");
  assert_int_equal(count_ops(f, IR_OP_MATMUL), 2);
  assert_int_equal(count_ops(f, IR_OP_ADD), 1);
  assert_int_equal(count_ops(f, IR_OP_RELU), 1);
  assert_int_equal(count_ops(f, IR_OP_CROSS_ENTROPY), 1);
  assert_int_equal(count_ops(f, IR_OP_MUL), 2);
  assert_int_equal(count_ops(f, IR_OP_SUM), 1);
  assert_int_equal(count_ops(f, IR_OP_CONST), 1);
  assert_int_equal(count_ops(f, IR_OP_LOSS), 2);
  assert_int_equal(f->nops, 11);
  /* locations as in DESIGN.md section 4: the operator token */
  const IrOp *mm = nth_op(f, IR_OP_MATMUL, 0), *add = nth_op(f, IR_OP_ADD, 0);
  assert_string_equal(mm->loc.file, "t.gdl");
  assert_int_equal(mm->loc.line, 13);
  assert_int_equal(mm->loc.col, 14);
  assert_int_equal(add->loc.line, 13);
  assert_int_equal(add->loc.col, 19);
  const IrOp *ce = nth_op(f, IR_OP_CROSS_ENTROPY, 0);
  assert_int_equal(ir_attr_get_int(ce, "ignore_index", 0), -100);
  assert_string_equal(ir_attr_get_str(ce, "reduction", ""), "mean");
  assert_string_equal(ce->result->name, "ce");
  const IrOp *l2 = nth_op(f, IR_OP_LOSS, 1);
  assert_string_equal(ir_attr_get_str(l2, "name", ""), "l2");
  assert_int_equal(l2->loc.line, 16);
  assert_int_equal(l2->loc.col, 3);
  assert_true(ir_attr_get_float(nth_op(f, IR_OP_CONST, 0), "value", 0) == 1e-4);
  const FeParam *w1 = param(m, "W1"), *b1 = param(m, "b1");
  assert_int_equal(w1->init, FE_INIT_NORMAL);
  assert_true(w1->a == 0 && w1->b == 0.02);
  assert_int_equal(w1->split_axis, -1);
  assert_int_equal(b1->init, FE_INIT_ZEROS);
  assert_ptr_equal(w1->value, f->args[2]);
  fe_model_free(m);
  free(text);
}

static void test_frontend_example_tinygpt(void **state) {
  (void)state;
  char *text = tu_read("examples/tinygpt.gdl");
  FeModel *m = compile_ok(text, 1);
  const IrFunc *f = m->func;
  /* L = 2 layers: per layer 4 GEMMs for the projections, 2 in attention */
  assert_int_equal(count_ops(f, IR_OP_MATMUL), 2 * 6 + 1);
  assert_int_equal(count_ops(f, IR_OP_LAYER_NORM), 2 * 2 + 1);
  assert_int_equal(count_ops(f, IR_OP_SOFTMAX), 2);
  assert_int_equal(count_ops(f, IR_OP_CAUSAL_MASK), 2);
  assert_int_equal(count_ops(f, IR_OP_GELU), 2);
  assert_int_equal(count_ops(f, IR_OP_EMBEDDING), 1);
  assert_int_equal(count_ops(f, IR_OP_LOSS), 1);
  const IrOp *logits = nth_op(f, IR_OP_MATMUL, 12);
  assert_string_equal(logits->result->name, "logits");
  static const int64_t btv[] = {8, 32, 96};
  assert_shape(logits->result, 3, btv);
  /* the attention scale rsqrt(HD) = 1/4 folds to a constant */
  assert_int_equal(count_ops(f, IR_OP_RSQRT), 0);
  assert_true(ir_attr_get_float(nth_op(f, IR_OP_CONST, 0), "value", 0) == 0.25);
  static const int64_t wqkv[] = {2, 64, 192};
  assert_shape(param(m, "attn_w")->value, 3, wqkv);
  fe_model_free(m);

  /* -D scales it: HD and F follow C and NH */
  Diag d;
  const char *names[] = {"C", "NH", "L", "T"};
  const int64_t values[] = {128, 8, 3, 16};
  m = compile_defs(text, names, values, 4, 2, &d);
  if (!m) fail_msg("%s", sb_str(&d.log));
  assert_verifies(m);
  static const int64_t wqkv2[] = {3, 128, 384}, wfc[] = {3, 128, 512}, idx[] = {4, 16};
  assert_shape(param(m, "attn_w")->value, 3, wqkv2);
  assert_shape(param(m, "fc_w")->value, 3, wfc);
  assert_shape(m->inputs[0].value, 2, idx);
  assert_int_equal(count_ops(m->func, IR_OP_SOFTMAX), 3);
  bool found = false;
  for (int i = 0; i < m->ndims; i++)
    if (strcmp(m->dims[i].name, "HD") == 0) {
      assert_int_equal(m->dims[i].value, 16);
      found = true;
    }
  assert_true(found);
  fe_model_free(m);
  diag_free(&d);
  free(text);
}

static void test_frontend_example_multitask(void **state) {
  (void)state;
  char *text = tu_read("examples/multitask.gdl");
  FeModel *m = compile_ok(text, 4);
  const IrFunc *f = m->func;
  assert_int_equal(m->nlosses, 2);
  assert_int_equal(count_ops(f, IR_OP_CROSS_ENTROPY), 1);
  assert_int_equal(count_ops(f, IR_OP_MSE_LOSS), 1);
  assert_int_equal(count_ops(f, IR_OP_DETACH), 2);
  /* P is used only through detach */
  const FeParam *p = param(m, "P");
  for (int i = 0; i < f->nops; i++)
    for (int j = 0; j < f->ops[i]->nargs; j++)
      if (f->ops[i]->args[j] == p->value) assert_int_equal(f->ops[i]->opcode, IR_OP_DETACH);
  static const int64_t x[] = {8, 20};
  assert_shape(m->inputs[0].value, 2, x);
  fe_model_free(m);
  free(text);
}

/* ---- snippets ---- */

static void test_frontend_rebinding_and_names(void **state) {
  (void)state;
  FeModel *m = compile_ok("model m {\n"
                          "  input a : f32[4]\n"
                          "  x = a\n"          /* already named: bound, not renamed */
                          "  x = x + 1\n"
                          "  x = x * x\n"
                          "  y = x\n"
                          "  loss s = sum(y)\n"
                          "}\n",
                          1);
  const IrFunc *f = m->func;
  assert_string_equal(f->args[0]->name, "a");
  const IrOp *add = nth_op(f, IR_OP_ADD, 0), *mul = nth_op(f, IR_OP_MUL, 0);
  assert_ptr_equal(add->args[0], f->args[0]);
  assert_string_equal(add->result->name, "x");
  assert_ptr_equal(mul->args[0], add->result);
  assert_ptr_equal(mul->args[1], add->result);
  assert_string_equal(mul->result->name, "x");
  const IrOp *sum = nth_op(f, IR_OP_SUM, 0);
  assert_ptr_equal(sum->args[0], mul->result); /* y = x binds the same value */
  assert_string_equal(sum->result->name, "s");
  const IrOp *loss = nth_op(f, IR_OP_LOSS, 0);
  assert_ptr_equal(loss->args[0], sum->result);
  assert_int_equal(loss->loc.line, 7);
  assert_int_equal(loss->loc.col, 3);
  fe_model_free(m);
}

static void test_frontend_for_unrolls_with_layer_index(void **state) {
  (void)state;
  FeModel *m = compile_ok("model m {\n"
                          "  dim L = 3\n"
                          "  input h : f32[2, 5]\n"
                          "  param W : f32[L, 5, 5]\n"
                          "  for l in 0..L { h = tanh(h @ W[l]) }\n"
                          "  for i in 1..1 { h = h @ h }\n" /* empty range: nothing */
                          "  loss s = sum(h)\n"
                          "}\n",
                          1);
  const IrFunc *f = m->func;
  assert_int_equal(count_ops(f, IR_OP_MATMUL), 3);
  assert_int_equal(count_ops(f, IR_OP_SLICE), 3);
  assert_int_equal(count_ops(f, IR_OP_RESHAPE), 3);
  assert_int_equal(count_ops(f, IR_OP_TANH), 3);
  for (int l = 0; l < 3; l++) {
    const IrOp *s = nth_op(f, IR_OP_SLICE, l);
    int64_t starts[] = {l, 0, 0}, stops[] = {l + 1, 5, 5}, steps[] = {1, 1, 1};
    assert_ints(s, "starts", starts, 3);
    assert_ints(s, "stops", stops, 3);
    assert_ints(s, "steps", steps, 3);
  }
  /* each layer reads the previous one's result */
  assert_ptr_equal(nth_op(f, IR_OP_MATMUL, 2)->args[0], nth_op(f, IR_OP_TANH, 1)->result);
  fe_model_free(m);
}

static void test_frontend_fn_inlined_per_call(void **state) {
  (void)state;
  FeModel *m = compile_ok("fn lin(x, w) { y = x @ w; return y + bias }\n"
                          "model m {\n"
                          "  dim D = 3\n"
                          "  input a : f32[2, D]\n"
                          "  param W : f32[D, D]\n"
                          "  param bias : f32[D]\n"
                          "  fn twice(x) { return lin(lin(x, W), w=W) * D }\n"
                          "  loss s = sum(twice(a))\n"
                          "}\n",
                          1);
  const IrFunc *f = m->func;
  assert_int_equal(count_ops(f, IR_OP_MATMUL), 2);
  assert_int_equal(count_ops(f, IR_OP_ADD), 2);
  assert_ptr_equal(nth_op(f, IR_OP_ADD, 0)->args[1], param(m, "bias")->value);
  assert_string_equal(nth_op(f, IR_OP_MATMUL, 1)->result->name, "y");
  /* D as a value: a const of the other operand's type */
  const IrOp *c = nth_op(f, IR_OP_CONST, 0);
  assert_true(ir_attr_get_float(c, "value", 0) == 3.0);
  assert_int_equal(c->result->type.dtype, IR_DT_F32);
  fe_model_free(m);
}

static void test_frontend_indexing_lowering(void **state) {
  (void)state;
  FeModel *m = compile_ok("model m {\n"
                          "  input x : f32[4, 6, 8]\n"
                          "  a = x[1]\n"           /* slice + reshape [6,8] */
                          "  b = x[..., 2:7:2]\n"  /* slice only: [4,6,3] */
                          "  c = x[:, -1, :]\n"    /* [4,8] */
                          "  d = x[:]\n"           /* everything: no op */
                          "  e = x[-1, ..., 0]\n"  /* [6] */
                          "  g = x[1:100, :-2]\n"  /* slices clamp like NumPy: [3,4,8] */
                          "  loss s = sum(a) + sum(b) + sum(c) + sum(d) + sum(e) + sum(g)\n"
                          "}\n",
                          1);
  const IrFunc *f = m->func;
  assert_int_equal(count_ops(f, IR_OP_SLICE), 5);
  assert_int_equal(count_ops(f, IR_OP_RESHAPE), 3);
  const IrOp *s0 = nth_op(f, IR_OP_SLICE, 0), *r0 = nth_op(f, IR_OP_RESHAPE, 0);
  int64_t st[] = {1, 0, 0}, sp[] = {2, 6, 8}, one[] = {1, 1, 1}, sh[] = {6, 8};
  assert_ints(s0, "starts", st, 3);
  assert_ints(s0, "stops", sp, 3);
  assert_ints(s0, "steps", one, 3);
  assert_ints(r0, "shape", sh, 2);
  assert_string_equal(r0->result->name, "a");
  assert_int_equal(s0->loc.line, 3);
  assert_int_equal(s0->loc.col, 8); /* the '[' */
  const IrOp *s1 = nth_op(f, IR_OP_SLICE, 1);
  int64_t st1[] = {0, 0, 2}, sp1[] = {4, 6, 7}, step1[] = {1, 1, 2}, b[] = {4, 6, 3};
  assert_ints(s1, "starts", st1, 3);
  assert_ints(s1, "stops", sp1, 3);
  assert_ints(s1, "steps", step1, 3);
  assert_shape(s1->result, 3, b);
  assert_string_equal(s1->result->name, "b");
  int64_t c[] = {4, 8}, e[] = {6}, g[] = {3, 4, 8}, st4[] = {1, 0, 0}, sp4[] = {4, 4, 8};
  assert_shape(nth_op(f, IR_OP_RESHAPE, 1)->result, 2, c);
  assert_shape(nth_op(f, IR_OP_RESHAPE, 2)->result, 1, e);
  const IrOp *s4 = nth_op(f, IR_OP_SLICE, 4);
  assert_shape(s4->result, 3, g);
  assert_ints(s4, "starts", st4, 3);
  assert_ints(s4, "stops", sp4, 3);
  /* d = x[:] is x itself */
  assert_ptr_equal(nth_op(f, IR_OP_SUM, 3)->args[0], f->args[0]);
  fe_model_free(m);
}

static void test_frontend_reduction_and_axis_attrs(void **state) {
  (void)state;
  FeModel *m = compile_ok("model m {\n"
                          "  input x : f32[2, 3, 4]\n"
                          "  a = sum(x, axis=-1, keepdim=true)\n"
                          "  b = mean(x, [2, 0])\n"
                          "  c = max(x)\n"
                          "  d = logsumexp(x, 1)\n"
                          "  e = softmax(x)\n"
                          "  g = log_softmax(x, axis=-2)\n"
                          "  h = transpose(x, -2, -1)\n"
                          "  k = permute(x, [2, 0, -2])\n"
                          "  r = reshape(x, [4, -1])\n"
                          "  q = concat([x, x], axis=-1)\n"
                          "  loss s = sum(a) + sum(b) + c + sum(d) + sum(e) + sum(g) + sum(h) + sum(k) + sum(r)"
                          " + sum(q)\n"
                          "}\n",
                          1);
  const IrFunc *f = m->func;
  const IrOp *a = nth_op(f, IR_OP_SUM, 0), *b = nth_op(f, IR_OP_MEAN, 0), *c = nth_op(f, IR_OP_MAX, 0),
             *d = nth_op(f, IR_OP_LOGSUMEXP, 0);
  int64_t ax2[] = {2}, ax02[] = {0, 2}, all[] = {0, 1, 2}, ax1[] = {1};
  assert_ints(a, "axes", ax2, 1);
  assert_int_equal(ir_attr_get_int(a, "keepdim", 0), 1);
  assert_ints(b, "axes", ax02, 2);
  assert_int_equal(ir_attr_get_int(b, "keepdim", 1), 0);
  assert_ints(c, "axes", all, 3);
  assert_ints(d, "axes", ax1, 1);
  assert_int_equal(ir_attr_get_int(d, "keepdim", 1), 0);
  assert_int_equal(ir_attr_get_int(nth_op(f, IR_OP_SOFTMAX, 0), "axis", -9), 2);
  assert_int_equal(ir_attr_get_int(nth_op(f, IR_OP_LOG_SOFTMAX, 0), "axis", -9), 1);
  int64_t p0[] = {0, 2, 1}, p1[] = {2, 0, 1}, r[] = {4, 6};
  assert_ints(nth_op(f, IR_OP_PERMUTE, 0), "perm", p0, 3);
  assert_ints(nth_op(f, IR_OP_PERMUTE, 1), "perm", p1, 3);
  assert_ints(nth_op(f, IR_OP_RESHAPE, 0), "shape", r, 2);
  const IrOp *q = nth_op(f, IR_OP_CONCAT, 0);
  assert_int_equal(q->nargs, 2);
  assert_int_equal(ir_attr_get_int(q, "axis", -9), 2);
  fe_model_free(m);
}

static void test_frontend_pow_neg_and_nn_attrs(void **state) {
  (void)state;
  FeModel *m = compile_ok("model m {\n"
                          "  dim D = 4\n"
                          "  input x : f64[3, D]\n"
                          "  input t : i32[3]\n"
                          "  param w : f64[D]\n"
                          "  param b : f64[D]\n"
                          "  p = x ** -2\n"
                          "  n = -x ** 2\n" /* -(x ** 2) */
                          "  u = layer_norm(x, w, b) + rms_norm(x, w, eps=1e-3) + layer_norm(x, w, b, 0.5)\n"
                          "  loss ce = cross_entropy(u, t, ignore_index=3, reduction=\"sum\")\n"
                          "  loss se = mse_loss(p, n, reduction=\"none\")[0, 0] + 2 ** 3\n"
                          "}\n",
                          1);
  const IrFunc *f = m->func;
  const IrOp *p0 = nth_op(f, IR_OP_POW, 0), *p1 = nth_op(f, IR_OP_POW, 1), *neg = nth_op(f, IR_OP_NEG, 0);
  assert_true(ir_attr_get_float(p0, "exponent", 0) == -2.0);
  assert_true(ir_attr_get_float(p1, "exponent", 0) == 2.0);
  assert_ptr_equal(neg->args[0], p1->result);
  assert_string_equal(neg->result->name, "n");
  assert_true(ir_attr_get_float(nth_op(f, IR_OP_LAYER_NORM, 0), "eps", 0) == 1e-5);
  assert_true(ir_attr_get_float(nth_op(f, IR_OP_LAYER_NORM, 1), "eps", 0) == 0.5);
  assert_true(ir_attr_get_float(nth_op(f, IR_OP_RMS_NORM, 0), "eps", 0) == 1e-3);
  const IrOp *ce = nth_op(f, IR_OP_CROSS_ENTROPY, 0);
  assert_int_equal(ir_attr_get_int(ce, "ignore_index", 0), 3);
  assert_string_equal(ir_attr_get_str(ce, "reduction", ""), "sum");
  assert_string_equal(ir_attr_get_str(nth_op(f, IR_OP_MSE_LOSS, 0), "reduction", ""), "none");
  /* 2 ** 3 folds to 8, a const of the other operand's type (f64) */
  const IrOp *c = nth_op(f, IR_OP_CONST, 0);
  assert_true(ir_attr_get_float(c, "value", 0) == 8.0);
  assert_int_equal(c->result->type.dtype, IR_DT_F64);
  fe_model_free(m);
}

static void test_frontend_defines_override_dims(void **state) {
  (void)state;
  const char *text = "model m {\n"
                     "  batch B = 8\n"
                     "  dim H = 16\n"
                     "  dim NH = 4\n"
                     "  dim HD = H / NH\n"
                     "  input x : f32[B, H]\n"
                     "  param W : f32[H, HD * NH]\n"
                     "  loss s = sum(x @ W)\n"
                     "}\n";
  Diag d;
  const char *n1[] = {"H", "B"};
  const int64_t v1[] = {32, 12};
  FeModel *m = compile_defs(text, n1, v1, 2, 3, &d);
  if (!m) fail_msg("%s", sb_str(&d.log));
  static const int64_t x[] = {4, 32}, w[] = {32, 32};
  assert_shape(m->inputs[0].value, 2, x);
  assert_shape(m->params[0].value, 2, w);
  assert_int_equal(m->batch_window, 12);
  assert_int_equal(m->batch_micro, 4);
  fe_model_free(m);
  diag_free(&d);

  /* an override of a derived dim wins over its expression */
  const char *n2[] = {"HD"};
  const int64_t v2[] = {2};
  m = compile_defs(text, n2, v2, 1, 1, &d);
  if (!m) fail_msg("%s", sb_str(&d.log));
  static const int64_t w2[] = {16, 8};
  assert_shape(m->params[0].value, 2, w2);
  fe_model_free(m);
  diag_free(&d);

  /* inexact division after an override is an error at the expression */
  const char *n3[] = {"NH"};
  const int64_t v3[] = {3};
  assert_null(compile_defs(text, n3, v3, 1, 1, &d));
  assert_non_null(strstr(sb_str(&d.log), "t.gdl:5:14: error: 16 / 3 is not an exact division"));
  diag_free(&d);

  const char *n4[] = {"FOO"};
  const int64_t v4[] = {3};
  assert_null(compile_defs(text, n4, v4, 1, 1, &d));
  assert_string_equal(sb_str(&d.log), "gradc: error: -D FOO: no dim named FOO\n");
  diag_free(&d);
}

static void test_frontend_batched_inputs_use_micro_batch(void **state) {
  (void)state;
  FeModel *m = compile_ok("model m {\n"
                          "  batch B = 64\n"
                          "  dim T = 3\n"
                          "  dim D = 5\n"
                          "  input x : f32[B, T, D]\n"
                          "  input y : i32[B]\n"
                          "  input table : f32[T, D]\n"   /* not batched: every micro-batch sees it */
                          "  input z : f32[2 * B, D]\n"   /* first axis is not exactly B: not batched */
                          "  param W : f32[D, D]\n"
                          "  h = reshape(x, [B * T, D]) @ W\n"
                          "  loss s = sum(h) / B + sum(table) + sum(z)\n"
                          "  loss c = cross_entropy(reshape(h, [B, -1]), y)\n"
                          "}\n",
                          4);
  assert_int_equal(m->batch_window, 64);
  assert_int_equal(m->batch_micro, 16);
  static const int64_t x[] = {16, 3, 5}, y[] = {16}, z[] = {32, 5}, h[] = {48, 5}, r[] = {16, 15};
  assert_shape(m->inputs[0].value, 3, x);
  assert_true(m->inputs[0].batched && m->inputs[0].value->batched);
  assert_shape(m->inputs[1].value, 1, y);
  assert_true(m->inputs[1].batched);
  assert_false(m->inputs[2].batched);
  assert_false(m->inputs[3].batched);
  assert_shape(m->inputs[3].value, 2, z);
  assert_int_equal(m->inputs[0].value->role, IR_ARG_INPUT);
  assert_int_equal(m->params[0].value->role, IR_ARG_PARAM);
  assert_shape(nth_op(m->func, IR_OP_MATMUL, 0)->result, 2, h);
  assert_shape(nth_op(m->func, IR_OP_RESHAPE, 1)->result, 2, r);
  /* B as a value is the window size, not the micro-batch */
  assert_true(ir_attr_get_float(nth_op(m->func, IR_OP_CONST, 0), "value", 0) == 64.0);
  fe_model_free(m);
}

static void test_frontend_dims_as_values_fold_exactly(void **state) {
  (void)state;
  FeModel *m = compile_ok("model m {\n"
                          "  dim C = 12\n"
                          "  dim H = 3\n"
                          "  input x : bf16[C]\n"
                          "  input y : f32[C]\n"
                          "  a = x * rsqrt(C / H)\n"       /* rsqrt(4) = 0.5, a bf16 const */
                          "  b = y * (C * H - 7) / 2\n"    /* 29 / 2: (y * 29) / 2 */
                          "  c = y + 7 / 2 + C / H\n"      /* 3.5 then 4 */
                          "  loss s = sum(b) + sum(c)\n"
                          "  loss t = sum(a)\n"
                          "}\n",
                          1);
  const IrFunc *f = m->func;
  const IrOp *c0 = nth_op(f, IR_OP_CONST, 0), *c1 = nth_op(f, IR_OP_CONST, 1), *c2 = nth_op(f, IR_OP_CONST, 2),
             *c3 = nth_op(f, IR_OP_CONST, 3), *c4 = nth_op(f, IR_OP_CONST, 4);
  assert_true(ir_attr_get_float(c0, "value", 0) == 0.5);
  assert_int_equal(c0->result->type.dtype, IR_DT_BF16);
  assert_int_equal(c0->result->type.shape.rank, 0);
  assert_int_equal(count_ops(f, IR_OP_RSQRT), 0);
  assert_true(ir_attr_get_float(c1, "value", 0) == 29.0);
  assert_true(ir_attr_get_float(c2, "value", 0) == 2.0);
  assert_true(ir_attr_get_float(c3, "value", 0) == 3.5);
  assert_true(ir_attr_get_float(c4, "value", 0) == 4.0);
  assert_int_equal(c4->result->type.dtype, IR_DT_F32);
  fe_model_free(m);
}

static void test_frontend_params_init_and_split(void **state) {
  (void)state;
  FeModel *m = compile_ok("model m {\n"
                          "  dim C = 4\n"
                          "  param a : f32[C, 4*C] split(1) init normal(0.5, 0.02)\n"
                          "  param b : f32[4*C, C] init uniform(-0.1, 1/C) split(-2)\n"
                          "  param c : f64[C] init ones\n"
                          "  param s : f32\n"
                          "  loss l = sum(a @ b) + s\n"
                          "}\n",
                          1);
  assert_int_equal(m->nparams, 4);
  const FeParam *a = &m->params[0], *b = &m->params[1], *c = &m->params[2], *s = &m->params[3];
  assert_int_equal(a->init, FE_INIT_NORMAL);
  assert_true(a->a == 0.5 && a->b == 0.02);
  assert_int_equal(a->split_axis, 1);
  assert_int_equal(b->init, FE_INIT_UNIFORM);
  assert_true(b->a == -0.1 && b->b == 0.25);
  assert_int_equal(b->split_axis, 0);
  assert_int_equal(c->init, FE_INIT_ONES);
  assert_int_equal(c->type.dtype, IR_DT_F64);
  assert_int_equal(c->split_axis, -1);
  assert_int_equal(s->init, FE_INIT_ZEROS);
  assert_int_equal(s->type.shape.rank, 0);
  assert_int_equal(a->loc.line, 3);
  assert_int_equal(a->loc.col, 9);
  fe_model_free(m);
}

static void test_frontend_errors_keep_going(void **state) {
  (void)state;
  Diag d;
  FeModel *m = tu_compile("t.gdl",
                          "model m {\n"
                          "  input x : f32[4, 5]\n"
                          "  a = x @ x\n"            /* shape error */
                          "  b = a + 1\n"            /* poisoned: no cascade */
                          "  c = nope(x)\n"          /* unknown function */
                          "  for i in 0..4 {\n"
                          "    d = x[i + 1]\n"       /* out of range once (i = 3), reported once */
                          "    e = x + q\n"          /* every iteration, reported once */
                          "  }\n"
                          "  loss l = x\n"           /* not a scalar */
                          "}\n",
                          1, &d);
  assert_null(m);
  const char *log = sb_str(&d.log);
  assert_int_equal(d.nerrors, 5);
  assert_non_null(strstr(log, "t.gdl:3:9: error: f32[4,5] @ f32[4,5]: inner dimensions 5 and 4 differ"));
  assert_non_null(strstr(log, "t.gdl:5:7: error: unknown function 'nope'"));
  assert_non_null(strstr(log, "t.gdl:7:11: error: index 4 is out of range for axis 0 of f32[4,5]"));
  assert_non_null(strstr(log, "t.gdl:8:13: error: unknown name 'q'"));
  assert_non_null(strstr(log, "t.gdl:10:12: error: loss 'l' must be a float scalar, got f32[4,5]"));
  diag_free(&d);
}

/* Pathological inputs: an error (or a model), never a crash or a hang. */
static void test_frontend_pathological_inputs(void **state) {
  (void)state;
  enum { N = 300000 };
  char *buf = malloc(N * 3 + 256);
  const char *heads[] = {"model m {\n x = ", "model m {\n x = ", "model m {\n input a : f32[2]\n x = a",
                         "model m {\n", "model m {\n input a : f32[3]\n x = a"};
  const char *units[] = {"(", "-", "+a", "for i in 0..1 {", "[0:3]"};
  for (int k = 0; k < 5; k++) {
    strcpy(buf, heads[k]);
    size_t n = strlen(buf), u = strlen(units[k]);
    for (int i = 0; i < N / (int)u; i++, n += u) memcpy(buf + n, units[k], u);
    strcpy(buf + n, "\n}\n");
    Diag d;
    clock_t t0 = clock();
    FeModel *m = tu_compile("p.gdl", buf, 1, &d);
    assert_null(m);
    assert_true(d.nerrors >= 1);
    assert_true((double)(clock() - t0) / CLOCKS_PER_SEC < 5.0);
    diag_free(&d);
  }
  free(buf);
  static const char *const texts[] = {
      "model m {\n dim D = 99999999999999999999999\n}\n",
      "model m {\n dim D = 2 ** 70\n}\n",
      "model m {\n dim D = 2000000000\n input a : f32[D, D, D]\n loss l = sum(a)\n}\n",
      "model m {\n for i in 0..1000000000 { x = 1 }\n}\n",
      "model m {\n for i in 0..100000 { for j in 0..100000 { x = 1 } }\n}\n",
      "fn f(x) { return f(x) }\nmodel m {\n input a : f32[3]\n loss l = sum(f(a))\n}\n",
      "model m {\n input a : f32[3]\n for i in 0..2000000 { a = a + a }\n loss l = sum(a)\n}\n",
      "model m {\n x = 1 / 0\n y = -9223372036854775807 - 2\n}\n",
      "model m {\n input a : f32[4]\n x = reshape(a, [2147483647, 2147483647, -1])\n}\n",
      "model m {\n batch B = 4\n input x : f32[B, ",
      "model",
      "}}}}",
      "",
  };
  for (size_t i = 0; i < sizeof texts / sizeof *texts; i++) {
    Diag d;
    FeModel *m = tu_compile("p.gdl", texts[i], 2, &d);
    assert_null(m);
    assert_true(d.nerrors >= 1);
    diag_free(&d);
  }
  /* exponential inlining hits the work limit */
  StrBuf sb;
  sb_init(&sb);
  for (int i = 0; i < 40; i++) sb_printf(&sb, "fn f%d(x) { return f%d(x) + f%d(x) }\n", i, i + 1, i + 1);
  sb_puts(&sb, "fn f40(x) { return x }\nmodel m {\n input a : f32[3]\n loss l = sum(f0(a))\n}\n");
  Diag d;
  assert_null(tu_compile("p.gdl", sb_str(&sb), 1, &d));
  assert_non_null(strstr(sb_str(&d.log), "model is too large"));
  diag_free(&d);
  sb_free(&sb);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_frontend_example_mlp),
      cmocka_unit_test(test_frontend_example_tinygpt),
      cmocka_unit_test(test_frontend_example_multitask),
      cmocka_unit_test(test_frontend_rebinding_and_names),
      cmocka_unit_test(test_frontend_for_unrolls_with_layer_index),
      cmocka_unit_test(test_frontend_fn_inlined_per_call),
      cmocka_unit_test(test_frontend_indexing_lowering),
      cmocka_unit_test(test_frontend_reduction_and_axis_attrs),
      cmocka_unit_test(test_frontend_pow_neg_and_nn_attrs),
      cmocka_unit_test(test_frontend_defines_override_dims),
      cmocka_unit_test(test_frontend_batched_inputs_use_micro_batch),
      cmocka_unit_test(test_frontend_dims_as_values_fold_exactly),
      cmocka_unit_test(test_frontend_params_init_and_split),
      cmocka_unit_test(test_frontend_errors_keep_going),
      cmocka_unit_test(test_frontend_pathological_inputs),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
