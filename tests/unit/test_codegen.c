/* test_codegen.c - the LLVM CPU code generator against the reference
 * interpreter, op by op and kernel by kernel.
 *
 * Each test builds a function (by hand with ir_build, or from .gdl text
 * through the CPU pipeline), groups it into kernels (`fuse`, or one kernel
 * per op), gives every value storage (`memplan`, or a trivial plan where
 * each value has its own slot and values feeding `grad` are gradient
 * buffers), compiles it, and then runs every kernel on its own: its inputs
 * are written into the arena from the interpreter's values, its outputs
 * prefilled with garbage (gradient buffers with known values, which the
 * kernel must add to), the kernel run over [0, iters) in two pieces, and
 * every output compared with the interpreter (f32: relative error below
 * 1e-5, f64: 1e-12, integers exactly; the error of an element is taken
 * relative to max(|want|, 1e-3 * the largest |want| of the tensor)).  A
 * mismatch prints the first bad elements and the largest error. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "codegen/codegen.h"
#include "passes/passes.h"
#include "runtime/runtime.h"
#include "irbuild.h"
#include "testutil.h"

#ifdef GRADC_HAVE_LLVM

/* Building functions: irbuild.h. */

/* ------------------------------------------------------------------ */
/* Inputs                                                              */
/* ------------------------------------------------------------------ */

typedef struct Inputs {
  double **a; /* by argument index */
  int n;
} Inputs;

/* Normal floats (scale 1), integers in [0, hi) where hi is the axis they
 * index (rt_random_inputs' rule) or 2. */
static Inputs make_inputs(const IrFunc *f, uint64_t seed) {
  Inputs in = {calloc((size_t)f->nargs + 1, sizeof(double *)), f->nargs};
  StFile st;
  st_init(&st);
  rt_random_inputs(f, 1, seed, &st);
  Rng rng;
  rng_seed(&rng, seed * 7 + 1);
  for (int i = 0; i < f->nargs; i++) {
    const IrValue *a = f->args[i];
    int64_t n = ir_numel(&a->type.shape);
    in.a[i] = calloc((size_t)(n ? n : 1), sizeof(double));
    const StTensor *t = a->role == IR_ARG_INPUT ? st_find(&st, a->name) : NULL;
    for (int64_t k = 0; k < n; k++) {
      double v = rng_normal(&rng);
      if (t && t->dtype == ST_I32) v = ((const int32_t *)t->data)[k];
      if (t && t->dtype == ST_F32) v = ((const float *)t->data)[k];
      if (t && t->dtype == ST_F64) v = ((const double *)t->data)[k];
      if (a->type.dtype == IR_DT_I32 && !t) v = (double)(rng_next(&rng) % 5) - 2;
      if (a->type.dtype == IR_DT_BOOL) v = rng_next(&rng) & 1;
      in.a[i][k] = ir_round_dtype(v, a->type.dtype);
    }
  }
  st_free(&st);
  return in;
}

static void free_inputs(Inputs *in) {
  for (int i = 0; i < in->n; i++) free(in->a[i]);
  free(in->a);
}

static double *arg_data(Inputs *in, const IrFunc *f, const char *name) {
  for (int i = 0; i < f->nargs; i++)
    if (f->args[i]->name && strcmp(f->args[i]->name, name) == 0) return in->a[i];
  fail_msg("no argument %s", name);
  return NULL;
}

/* ------------------------------------------------------------------ */
/* Grouping and planning by hand                                       */
/* ------------------------------------------------------------------ */

/* One kernel per op (every op outside the executor's set). */
static void one_kernel_per_op(IrFunc *f) {
  int g = 0;
  for (int i = 0; i < f->nops; i++) f->ops[i]->group = kp_op_group0(f->ops[i]->opcode) ? 0 : ++g;
}

/* Every value its own slot; values read by `grad` are gradient buffers. */
static void trivial_plan(IrFunc *f) {
  int64_t top = 0;
  bool *grad = calloc((size_t)f->nvalues + 1, sizeof(bool));
  for (int i = 0; i < f->nops; i++)
    if (f->ops[i]->opcode == IR_OP_GRAD) grad[f->ops[i]->args[0]->id] = true;
  for (int v = 0; v < f->nvalues; v++) {
    IrValue *x = f->values[v];
    if (x->def && x->def->opcode == IR_OP_CONST) continue;
    x->storage = grad[v] ? IR_STORE_GRAD : IR_STORE_ARENA;
    x->offset = top;
    size_t es = grad[v] ? (x->type.dtype == IR_DT_F64 ? 8 : 4) : ir_dtype_size(x->type.dtype);
    top += (ir_numel(&x->type.shape) * (int64_t)es + 63) / 64 * 64;
  }
  f->arena_size = top;
  free(grad);
}

static void run_passes(IrFunc *f, const char *const *names, int n) {
  PassManager pm;
  pm_init(&pm);
  pm.verify = true;
  Diag d;
  diag_init(&d, NULL);
  d.quiet = true;
  PassOptions o = {.gas = 1, .diag = &d};
  int rc = pm_run(&pm, f, names, n, &o);
  if (rc != 0) fail_msg("passes failed (%d): %s", rc, sb_str(&d.log));
  diag_free(&d);
}

/* ------------------------------------------------------------------ */
/* Element access in the arena                                         */
/* ------------------------------------------------------------------ */

static uint16_t f32_to_bf16_bits(float x) {
  uint32_t u;
  memcpy(&u, &x, 4);
  return (uint16_t)(u >> 16); /* exact: the value is a bf16 already */
}
static float bf16_bits_to_f32(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float x;
  memcpy(&x, &u, 4);
  return x;
}
static uint16_t f16_bits(double v) { /* v is representable in f16 */
  uint16_t s = signbit(v) ? 0x8000 : 0;
  double a = fabs(v);
  if (isnan(v)) return 0x7e00;
  if (isinf(v)) return s | 0x7c00;
  if (a < ldexp(1.0, -14)) return s | (uint16_t)(a * ldexp(1.0, 24));
  int e;
  double m = frexp(a, &e); /* a = m 2^e, m in [0.5, 1) */
  return s | (uint16_t)((e - 1 + 15) << 10) | (uint16_t)((m * 2 - 1) * 1024);
}
static double f16_value(uint16_t h) {
  int sign = h >> 15, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
  double v = exp == 0 ? ldexp(man, -24) : exp == 31 ? (man ? NAN : INFINITY) : ldexp(man | 0x400, exp - 25);
  return sign ? -v : v;
}

static size_t elem_size(const IrValue *v) {
  if (v->storage == IR_STORE_GRAD) return v->type.dtype == IR_DT_F64 ? 8 : 4;
  return ir_dtype_size(v->type.dtype);
}

static void put(char *arena, const IrValue *v, int64_t i, double x) {
  char *p = arena + v->offset + i * (int64_t)elem_size(v);
  if (v->storage == IR_STORE_GRAD) {
    if (v->type.dtype == IR_DT_F64) memcpy(p, &x, 8);
    else {
      float y = (float)x;
      memcpy(p, &y, 4);
    }
    return;
  }
  switch (v->type.dtype) {
  case IR_DT_F32: {
    float y = (float)x;
    memcpy(p, &y, 4);
    break;
  }
  case IR_DT_F64: memcpy(p, &x, 8); break;
  case IR_DT_BF16: {
    uint16_t h = f32_to_bf16_bits((float)x);
    memcpy(p, &h, 2);
    break;
  }
  case IR_DT_F16: {
    uint16_t h = f16_bits(x);
    memcpy(p, &h, 2);
    break;
  }
  case IR_DT_I32: {
    int32_t y = (int32_t)x;
    memcpy(p, &y, 4);
    break;
  }
  case IR_DT_BOOL: *p = x != 0; break;
  }
}

static double get(const char *arena, const IrValue *v, int64_t i) {
  const char *p = arena + v->offset + i * (int64_t)elem_size(v);
  if (v->storage == IR_STORE_GRAD) {
    if (v->type.dtype == IR_DT_F64) {
      double y;
      memcpy(&y, p, 8);
      return y;
    }
    float y;
    memcpy(&y, p, 4);
    return y;
  }
  switch (v->type.dtype) {
  case IR_DT_F32: {
    float y;
    memcpy(&y, p, 4);
    return y;
  }
  case IR_DT_F64: {
    double y;
    memcpy(&y, p, 8);
    return y;
  }
  case IR_DT_BF16: {
    uint16_t h;
    memcpy(&h, p, 2);
    return bf16_bits_to_f32(h);
  }
  case IR_DT_F16: {
    uint16_t h;
    memcpy(&h, p, 2);
    return f16_value(h);
  }
  case IR_DT_I32: {
    int32_t y;
    memcpy(&y, p, 4);
    return y;
  }
  case IR_DT_BOOL: return *p != 0;
  }
  return 0;
}

/* ------------------------------------------------------------------ */
/* The check                                                           */
/* ------------------------------------------------------------------ */

static double tolerance(IrDType dt) {
  switch (dt) {
  case IR_DT_F32: return 1e-5;
  case IR_DT_F64: return 1e-12;
  case IR_DT_BF16: return 2e-2;
  case IR_DT_F16: return 2e-3;
  case IR_DT_I32:
  case IR_DT_BOOL: return 0;
  }
  return 0;
}

static const char *vname(const IrValue *v, char *buf, size_t n) {
  if (v->name)
    snprintf(buf, n, "%%%s", v->name);
  else
    snprintf(buf, n, "%%#%d", v->id);
  return buf;
}

static double grad_prefill(int64_t i) { return 0.5 + (double)(i % 7) * 0.25; }

typedef struct Stats {
  int kernels;
  int outputs;
  double worst; /* largest error relative to the tolerance */
} Stats;

/* Compare output v of kernel k with want[] (+ the prefill for gradient
 * buffers); fail with the first mismatches. */
static void compare(const CgKernel *k, const IrValue *v, const char *arena, const double *want, Stats *st) {
  int64_t n = ir_numel(&v->type.shape);
  double tol = tolerance(v->type.dtype), big = 0;
  for (int64_t i = 0; i < n; i++)
    if (isfinite(want[i]) && fabs(want[i]) > big) big = fabs(want[i]);
  double floor = big * 1e-2 > 1e-30 ? big * 1e-2 : 1e-30;
  int bad = 0;
  double worst = 0;
  int64_t worst_i = -1;
  char msg[2048];
  int len = 0;
  for (int64_t i = 0; i < n; i++) {
    double w = want[i], got = get(arena, v, i);
    if (v->storage == IR_STORE_GRAD) w += grad_prefill(i);
    double err;
    if (isnan(w) || isnan(got))
      err = isnan(w) && isnan(got) ? 0 : INFINITY;
    else if (isinf(w) || isinf(got))
      err = w == got ? 0 : INFINITY;
    else
      err = fabs(got - w) / fmax(fabs(w), floor);
    bool ok = tol == 0 ? err == 0 : err < tol;
    if (err > worst || worst_i < 0) worst = err, worst_i = i;
    if (!ok && bad++ < 5 && len < (int)sizeof msg - 200)
      len += snprintf(msg + len, sizeof msg - (size_t)len, "\n  [%lld] got %.9g want %.9g (error %.3g)", (long long)i,
                      got, w, err);
  }
  char nb[64];
  if (bad)
    fail_msg("kernel %s, output %s (%s, %lld elements): %d mismatches, largest error %.3g at [%lld] (tolerance %g):%s",
             k->name, vname(v, nb, sizeof nb), ir_dtype_name(v->type.dtype), (long long)n, bad, worst,
             (long long)worst_i, tol, msg);
  if (tol > 0 && worst / tol > st->worst) st->worst = worst / tol;
  st->outputs++;
}

/* Run every kernel of a fused and planned f against the interpreter. */
static Stats check_kernels(IrFunc *f, Inputs *in) {
  Stats st = {0, 0, 0};
  char err[1024];
  InterpState is = {0};
  double **wsum = calloc((size_t)f->nvalues + 1, sizeof(double *));
  bool any_wsum = false;
  for (int i = 0; i < f->nops; i++) any_wsum |= f->ops[i]->opcode == IR_OP_WINDOW_SUM;
  if (any_wsum) {
    if (!interp_run(&is, f, in->a, NULL, INTERP_COUNT, NULL, err, sizeof err)) fail_msg("interp count: %s", err);
    for (int i = 0; i < f->nops; i++) {
      const IrOp *op = f->ops[i];
      if (op->opcode != IR_OP_WINDOW_SUM) continue;
      int64_t n = ir_numel(&op->result->type.shape);
      wsum[op->result->id] = calloc((size_t)(n ? n : 1), sizeof(double));
      memcpy(wsum[op->result->id], is.val[op->args[0]->id], sizeof(double) * (size_t)n);
    }
    interp_free(&is);
  }
  if (!interp_run(&is, f, in->a, wsum, INTERP_STEP, NULL, err, sizeof err)) fail_msg("interp: %s", err);

  CgOptions o = {0};
  bool trace = getenv("GRADC_TEST_TRACE") != NULL; /* debugging: dump the IR and name each kernel run */
  o.dump_llvm = getenv("GRADC_TEST_DUMP_LLVM") != NULL;
  if (trace) ir_print_file(f, stderr);
  CgModule *m = cg_llvm_compile(f, &o, err, sizeof err);
  if (!m) fail_msg("cg_llvm_compile: %s", err);
  size_t asz = (size_t)(f->arena_size > 0 ? f->arena_size : 64);
  char *arena = aligned_alloc(64, (asz + 63) / 64 * 64);
  assert_non_null(arena);
  memset(arena, 0xff, asz);

  for (int i = 0; i < f->nops;) {
    int g = f->ops[i]->group;
    int j = i;
    while (j < f->nops && f->ops[j]->group == g) j++;
    if (g == 0) {
      i = j;
      continue;
    }
    const CgKernel *k = cg_module_kernel(m, g);
    if (!k) fail_msg("no kernel for group %d", g);
    /* outputs prefilled */
    bool *is_out = calloc((size_t)f->nvalues + 1, sizeof(bool));
    for (int q = 0; q < f->nops; q++) {
      if (q >= i && q < j) continue;
      const IrOp *op = f->ops[q];
      for (int a = 0; a < op->nargs; a++)
        if (op->args[a]->def && op->args[a]->def->group == g) is_out[op->args[a]->id] = true;
    }
    for (int q = i; q < j; q++) {
      const IrValue *v = f->ops[q]->result;
      if (v && v->storage == IR_STORE_NONE) is_out[v->id] = false; /* nothing reads it in a step */
      if (!v || !is_out[v->id]) continue;
      int64_t n = ir_numel(&v->type.shape);
      if (v->storage == IR_STORE_GRAD)
        for (int64_t e = 0; e < n; e++) put(arena, v, e, grad_prefill(e));
      else
        memset(arena + v->offset, 0xff, (size_t)n * elem_size(v));
    }
    /* inputs from the interpreter, after the prefill: memplan may have
     * put an output over an operand that dies in the kernel */
    for (int q = i; q < j; q++) {
      const IrOp *op = f->ops[q];
      for (int a = 0; a < op->nargs; a++) {
        const IrValue *v = op->args[a];
        if (v->def && (v->def->group == g || (v->def->group == 0 && v->def->opcode == IR_OP_CONST))) continue;
        int64_t n = ir_numel(&v->type.shape);
        for (int64_t e = 0; e < n; e++) put(arena, v, e, is.val[v->id][e]);
      }
    }
    if (trace) fprintf(stderr, "running %s over %lld\n", k->name, (long long)k->iters);
    int64_t half = k->iters / 2;
    k->fn(arena, 0, half);
    k->fn(arena, half, k->iters);
    for (int q = i; q < j; q++) {
      const IrValue *v = f->ops[q]->result;
      if (!v || !is_out[v->id]) continue;
      if (v->storage != IR_STORE_GRAD) {
        compare(k, v, arena, is.val[v->id], &st);
        continue;
      }
      /* Outputs accumulating into one gradient buffer (memplan splits
       * grad(add(p, q))) are checked once, against their sum. */
      bool first = true;
      for (int r = i; r < q; r++) {
        const IrValue *w = f->ops[r]->result;
        first &= !(w && is_out[w->id] && w->storage == IR_STORE_GRAD && w->offset == v->offset);
      }
      if (!first) continue;
      int64_t n = ir_numel(&v->type.shape);
      double *sum = calloc((size_t)(n ? n : 1), sizeof(double));
      for (int r = q; r < j; r++) {
        const IrValue *w = f->ops[r]->result;
        if (!w || !is_out[w->id] || w->storage != IR_STORE_GRAD || w->offset != v->offset) continue;
        assert_int_equal(ir_numel(&w->type.shape), n);
        for (int64_t e = 0; e < n; e++) sum[e] += is.val[w->id][e];
      }
      compare(k, v, arena, sum, &st);
      free(sum);
    }
    free(is_out);
    st.kernels++;
    i = j;
  }
  free(arena);
  cg_module_free(m);
  interp_free(&is);
  for (int v = 0; v < f->nvalues; v++) free(wsum[v]);
  free(wsum);
  return st;
}

/* Hand-built functions: sinks for the values of interest, one kernel per
 * op or `fuse`, the trivial plan, the check. */
static Stats check_built(IrFunc *f, bool fuse, uint64_t seed) {
  if (fuse) {
    static const char *const p[] = {"fuse"};
    run_passes(f, p, 1);
  } else {
    one_kernel_per_op(f);
  }
  char err[512];
  if (!ir_verify(f, err, sizeof err)) fail_msg("verify: %s", err);
  trivial_plan(f);
  Inputs in = make_inputs(f, seed);
  Stats st = check_kernels(f, &in);
  free_inputs(&in);
  return st;
}

/* A model through the CPU pipeline (fuse and memplan included). */
static Stats check_model(const char *name, const char *text, uint64_t seed, void (*tweak)(IrFunc *, Inputs *)) {
  Diag d;
  FeModel *m = tu_compile(name, text, 1, &d);
  if (!m) fail_msg("%s: %s", name, sb_str(&d.log));
  int n;
  const char *const *pipe = pass_pipeline_cpu(&n);
  run_passes(m->func, pipe, n);
  Inputs in = make_inputs(m->func, seed);
  if (tweak) tweak(m->func, &in);
  Stats st = check_kernels(m->func, &in);
  free_inputs(&in);
  fe_model_free(m);
  diag_free(&d);
  return st;
}

/* ------------------------------------------------------------------ */
/* Elementwise ops                                                     */
/* ------------------------------------------------------------------ */

static void elementwise_ops(IrDType dt, bool fuse) {
  IrFunc *f = ir_func_new("ew");
  IrValue *x = input(f, "x", ty(dt, 2, 5, 37));
  IrValue *y = input(f, "y", ty(dt, 2, 5, 37));
  IrValue *row = input(f, "row", ty(dt, 1, 37));
  IrValue *col = input(f, "col", ty(dt, 2, 5, 1));
  IrValue *pos = bin(f, IR_OP_ADD, un(f, IR_OP_ABS, x), cnst(f, 0.25, ty(dt, 0)));
  static const IrOpcode unary[] = {IR_OP_NEG,  IR_OP_EXP,  IR_OP_TANH, IR_OP_SIGMOID, IR_OP_RELU,
                                   IR_OP_GELU, IR_OP_SILU, IR_OP_ABS,  IR_OP_SIGN,    IR_OP_GELU_GRAD,
                                   IR_OP_DETACH};
  for (size_t i = 0; i < sizeof unary / sizeof unary[0]; i++) sink(f, un(f, unary[i], x));
  sink(f, un(f, IR_OP_LOG, pos));
  sink(f, un(f, IR_OP_SQRT, pos));
  sink(f, un(f, IR_OP_RSQRT, pos));
  static const double exps[] = {2.0, 3.0, 0.5, -1.5, 1.0};
  for (size_t i = 0; i < sizeof exps / sizeof exps[0]; i++)
    sink(f, un1(f, IR_OP_POW, pos, ir_attr_float("exponent", exps[i])));
  sink(f, un1(f, IR_OP_POW, x, ir_attr_float("exponent", 2.0)));
  static const IrOpcode binary[] = {IR_OP_ADD, IR_OP_SUB, IR_OP_MUL, IR_OP_DIV, IR_OP_MAXIMUM, IR_OP_MINIMUM};
  for (size_t i = 0; i < sizeof binary / sizeof binary[0]; i++) {
    sink(f, bin(f, binary[i], x, y));
    sink(f, bin(f, binary[i], x, row)); /* broadcast over rows */
    sink(f, bin(f, binary[i], col, y)); /* broadcast along the row */
    sink(f, bin(f, binary[i], col, row)); /* outer */
  }
  static const IrOpcode cmp[] = {IR_OP_EQ, IR_OP_NE, IR_OP_LT, IR_OP_LE, IR_OP_GT, IR_OP_GE};
  IrValue *xr = un(f, IR_OP_SIGN, x); /* many ties */
  for (size_t i = 0; i < sizeof cmp / sizeof cmp[0]; i++) {
    sink(f, bin(f, cmp[i], x, y));
    sink(f, bin(f, cmp[i], xr, row));
  }
  IrValue *c = bin(f, IR_OP_GT, x, y);
  IrValue *sargs[3] = {c, x, row};
  sink(f, build(f, IR_OP_SELECT, sargs, 3, NULL, 0, NULL));
  IrAttr bs = ir_attr_ints("shape", (int64_t[]){3, 5, 37}, 3);
  sink(f, build(f, IR_OP_BROADCAST, &row, 1, &bs, 1, NULL));
  IrAttr none = ir_attr_str("reduction", "none");
  sink(f, build(f, IR_OP_MSE_LOSS, (IrValue *[]){x, y}, 2, &none, 1, NULL));
  IrAttr mean = ir_attr_str("reduction", "mean"), sum = ir_attr_str("reduction", "sum");
  sink(f, build(f, IR_OP_MSE_LOSS, (IrValue *[]){x, y}, 2, &mean, 1, NULL));
  sink(f, build(f, IR_OP_MSE_LOSS, (IrValue *[]){x, y}, 2, &sum, 1, NULL));
  /* casts */
  IrDType other = dt == IR_DT_F32 ? IR_DT_F64 : IR_DT_F32;
  IrValue *scaled = bin(f, IR_OP_MUL, x, cnst(f, 3.0, ty(dt, 0)));
  sink(f, cast(f, scaled, IR_DT_I32));
  sink(f, cast(f, x, other));
  sink(f, cast(f, cast(f, c, dt), dt));
  sink(f, cast(f, c, dt));
  sink(f, cast(f, cast(f, scaled, IR_DT_I32), dt));
  sink(f, cast(f, xr, IR_DT_BOOL));
  /* scalar ops */
  IrValue *s = input(f, "s", ty(dt, 0));
  IrValue *gs = un1(f, IR_OP_GRAD_SEED, s, ir_attr_float("coef", 0.1));
  sink(f, gs);
  sink(f, bin(f, IR_OP_LOSS_TERM, s, gs));
  Stats st = check_built(f, fuse, 11);
  assert_true(st.outputs >= 60);
  ir_func_free(f);
}

static void test_codegen_elementwise_f32(void **state) { elementwise_ops(IR_DT_F32, false); }
static void test_codegen_elementwise_f64(void **state) { elementwise_ops(IR_DT_F64, false); }
static void test_codegen_elementwise_fused(void **state) { elementwise_ops(IR_DT_F32, true); }

static void test_codegen_i32_and_bool_ops(void **state) {
  IrFunc *f = ir_func_new("ints");
  IrValue *a = input(f, "a", ty(IR_DT_I32, 2, 4, 9));
  IrValue *b = input(f, "b", ty(IR_DT_I32, 2, 4, 9));
  IrValue *p = input(f, "p", ty(IR_DT_BOOL, 2, 4, 9));
  static const IrOpcode ops[] = {IR_OP_ADD, IR_OP_SUB, IR_OP_MUL, IR_OP_DIV, IR_OP_MAXIMUM, IR_OP_MINIMUM,
                                 IR_OP_EQ,  IR_OP_NE,  IR_OP_LT,  IR_OP_LE,  IR_OP_GT,      IR_OP_GE};
  for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++) sink(f, bin(f, ops[i], a, b));
  sink(f, un(f, IR_OP_NEG, a));
  sink(f, un(f, IR_OP_ABS, a));
  sink(f, un(f, IR_OP_SIGN, a));
  sink(f, cast(f, a, IR_DT_BOOL));
  sink(f, cast(f, p, IR_DT_I32));
  sink(f, bin(f, IR_OP_NE, p, cast(f, a, IR_DT_BOOL)));
  IrValue *sa[3] = {p, a, b};
  sink(f, build(f, IR_OP_SELECT, sa, 3, NULL, 0, NULL));
  sink(f, un(f, IR_OP_DETACH, p));
  int64_t last = 1;
  sink(f, reduce(f, IR_OP_SUM, a, &last, 1, false));
  one_kernel_per_op(f);
  trivial_plan(f);
  Inputs in = make_inputs(f, 5);
  double *bv = arg_data(&in, f, "b");
  for (int i = 0; i < 36; i++)
    if (bv[i] == 0) bv[i] = i % 2 ? 3 : -1; /* no division by zero */
  bv[0] = -1;
  arg_data(&in, f, "a")[0] = -7;
  check_kernels(f, &in);
  free_inputs(&in);
  ir_func_free(f);
}

/* NaN and infinities where the interpreter has rules for them. */
static void test_codegen_special_values(void **state) {
  IrFunc *f = ir_func_new("special");
  IrValue *x = input(f, "x", ty(IR_DT_F32, 2, 3, 8));
  IrValue *y = input(f, "y", ty(IR_DT_F32, 2, 3, 8));
  static const IrOpcode ops[] = {IR_OP_RELU, IR_OP_SIGN, IR_OP_SIGMOID, IR_OP_TANH, IR_OP_EXP, IR_OP_GELU};
  for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++) sink(f, un(f, ops[i], x));
  sink(f, bin(f, IR_OP_MAXIMUM, x, y));
  sink(f, bin(f, IR_OP_MINIMUM, x, y));
  sink(f, bin(f, IR_OP_NE, x, y));
  sink(f, cast(f, x, IR_DT_BOOL));
  int64_t last = 1;
  sink(f, reduce(f, IR_OP_MAX, x, &last, 1, true));
  sink(f, reduce(f, IR_OP_LOGSUMEXP, x, &last, 1, true));
  sink(f, un1(f, IR_OP_SOFTMAX, x, ir_attr_int("axis", -1)));
  one_kernel_per_op(f);
  trivial_plan(f);
  Inputs in = make_inputs(f, 3);
  double *xv = arg_data(&in, f, "x");
  /* row 0: a NaN; row 1: +inf and -inf; row 2: all -inf */
  xv[2] = NAN;
  xv[8 + 1] = INFINITY;
  xv[8 + 5] = -INFINITY;
  for (int i = 16; i < 24; i++) xv[i] = -INFINITY;
  xv[3] = 1e30;
  xv[4] = -1e30;
  check_kernels(f, &in);
  free_inputs(&in);
  ir_func_free(f);
}

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
  one_kernel_per_op(f);
  trivial_plan(f);
  char err[512];
  CgOptions o = {0};
  CgModule *m = cg_llvm_compile(f, &o, err, sizeof err);
  if (!m) fail_msg("%s", err);
  char *arena = aligned_alloc(64, (size_t)(f->arena_size + 63) / 64 * 64);
  for (int i = 0; i < n; i++) put(arena, x, i, xs[i]);
  for (int g = 1; g <= nops; g++) {
    const CgKernel *k = cg_module_kernel(m, g);
    k->fn(arena, 0, k->iters);
  }
  for (int k = 0; k < nops; k++)
    for (int i = 0; i < n; i++) out[k * n + i] = get(arena, y[k], i);
  free(arena);
  cg_module_free(m);
  ir_func_free(f);
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
/* Reductions and row ops                                              */
/* ------------------------------------------------------------------ */

static void reductions(IrDType dt, bool fuse) {
  IrFunc *f = ir_func_new("red");
  IrValue *x = input(f, "x", ty(dt, 3, 3, 4, 45));
  IrValue *v = input(f, "v", ty(dt, 1, 7));
  static const IrOpcode ops[] = {IR_OP_SUM, IR_OP_MEAN, IR_OP_MAX, IR_OP_LOGSUMEXP};
  static const int64_t axsets[][3] = {{2}, {-1}, {0}, {1}, {0, 1}, {0, 2}, {1, 2}, {0, 1, 2}};
  static const int naxes[] = {1, 1, 1, 1, 2, 2, 2, 3};
  for (size_t o = 0; o < 4; o++) {
    for (size_t k = 0; k < sizeof naxes / sizeof naxes[0]; k++) {
      sink(f, reduce(f, ops[o], x, axsets[k], naxes[k], true));
      sink(f, reduce(f, ops[o], x, axsets[k], naxes[k], false));
    }
    sink(f, reduce(f, ops[o], x, NULL, 0, false)); /* every axis */
    sink(f, reduce(f, ops[o], v, NULL, 0, true));
  }
  /* a reduction of a reduction, and row values broadcast back */
  int64_t last = 2;
  IrValue *m = reduce(f, IR_OP_MAX, x, &last, 1, true);
  IrValue *e = un(f, IR_OP_EXP, bin(f, IR_OP_SUB, x, m));
  sink(f, bin(f, IR_OP_DIV, e, reduce(f, IR_OP_SUM, e, &last, 1, true)));
  Stats st = check_built(f, fuse, 21);
  assert_true(st.outputs >= 70);
  ir_func_free(f);
}

static void test_codegen_reductions_f32(void **state) { reductions(IR_DT_F32, false); }
static void test_codegen_reductions_f64(void **state) { reductions(IR_DT_F64, false); }
static void test_codegen_reductions_fused(void **state) { reductions(IR_DT_F32, true); }

static void nn_ops(IrDType dt, bool fuse) {
  IrFunc *f = ir_func_new("nn");
  IrValue *x = input(f, "x", ty(dt, 3, 2, 6, 21));
  IrValue *w = param(f, "w", ty(dt, 1, 21));
  IrValue *b = param(f, "b", ty(dt, 1, 21));
  IrValue *sq = input(f, "sq", ty(dt, 3, 2, 6, 6));
  for (int axis = -1; axis >= -3; axis--) {
    sink(f, un1(f, IR_OP_SOFTMAX, x, ir_attr_int("axis", axis)));
    sink(f, un1(f, IR_OP_LOG_SOFTMAX, x, ir_attr_int("axis", axis)));
  }
  IrValue *lw[3] = {x, w, b};
  IrAttr eps = ir_attr_float("eps", 1e-5);
  sink(f, build(f, IR_OP_LAYER_NORM, lw, 3, &eps, 1, NULL));
  IrAttr eps6 = ir_attr_float("eps", 1e-6);
  sink(f, build(f, IR_OP_RMS_NORM, lw, 2, &eps6, 1, NULL));
  sink(f, un(f, IR_OP_CAUSAL_MASK, sq));
  sink(f, un(f, IR_OP_CAUSAL_MASK, x));
  Stats st = check_built(f, fuse, 31);
  assert_true(st.outputs >= 10);
  ir_func_free(f);
}

static void test_codegen_nn_f32(void **state) { nn_ops(IR_DT_F32, false); }
static void test_codegen_nn_f64(void **state) { nn_ops(IR_DT_F64, false); }

/* cross_entropy in every reduction, one_hot, embedding and its gradient,
 * with targets that hit ignore_index. */
static void indexed_ops(IrDType dt, bool fuse) {
  IrFunc *f = ir_func_new("idx");
  IrValue *logits = input(f, "logits", ty(dt, 3, 2, 5, 13));
  IrValue *t = input(f, "t", ty(IR_DT_I32, 2, 2, 5));
  IrValue *ids = input(f, "ids", ty(IR_DT_I32, 2, 2, 5));
  IrValue *table = param(f, "table", ty(dt, 2, 11, 24));
  IrValue *dy = input(f, "dy", ty(dt, 3, 2, 5, 24));
  static const char *const reds[] = {"none", "sum", "mean"};
  for (int r = 0; r < 3; r++) {
    IrAttr a[2] = {ir_attr_int("ignore_index", -100), ir_attr_str("reduction", reds[r])};
    sink(f, build(f, IR_OP_CROSS_ENTROPY, (IrValue *[]){logits, t}, 2, a, 2, NULL));
  }
  IrAttr oa[2] = {ir_attr_int("depth", 13), ir_attr_int("ignore_index", -100)};
  IrType oht = ty(dt, 3, 2, 5, 13);
  sink(f, build(f, IR_OP_ONE_HOT, &t, 1, oa, 2, &oht));
  sink(f, build(f, IR_OP_EMBEDDING, (IrValue *[]){ids, table}, 2, NULL, 0, NULL));
  IrAttr ra = ir_attr_int("rows", 11);
  sink(f, build(f, IR_OP_EMBEDDING_GRAD, (IrValue *[]){ids, dy}, 2, &ra, 1, NULL));
  if (fuse) {
    static const char *const p[] = {"fuse"};
    run_passes(f, p, 1);
  } else {
    one_kernel_per_op(f);
  }
  trivial_plan(f);
  Inputs in = make_inputs(f, 41);
  double *tv = arg_data(&in, f, "t"), *iv = arg_data(&in, f, "ids");
  for (int i = 0; i < 10; i++) {
    tv[i] = i % 4 == 1 ? -100 : (i * 5) % 13;
    iv[i] = (i * 7) % 11; /* repeated rows in the scatter */
  }
  iv[9] = iv[0];
  Stats st = check_kernels(f, &in);
  assert_true(st.outputs >= 6);
  free_inputs(&in);
  ir_func_free(f);
}

static void test_codegen_indexed_f32(void **state) { indexed_ops(IR_DT_F32, false); }
static void test_codegen_indexed_f64(void **state) { indexed_ops(IR_DT_F64, false); }
static void test_codegen_indexed_fused(void **state) { indexed_ops(IR_DT_F32, true); }

/* ------------------------------------------------------------------ */
/* Data movement                                                       */
/* ------------------------------------------------------------------ */

static void test_codegen_movement(void **state) {
  IrFunc *f = ir_func_new("move");
  IrValue *x = input(f, "x", ty(IR_DT_F32, 3, 3, 4, 5));
  IrValue *z = input(f, "z", ty(IR_DT_F32, 3, 3, 2, 5));
  IrValue *w = input(f, "w", ty(IR_DT_F32, 3, 3, 4, 2));
  static const int64_t perms[][3] = {{0, 2, 1}, {2, 0, 1}, {1, 0, 2}, {2, 1, 0}, {0, 1, 2}};
  for (int i = 0; i < 5; i++) sink(f, un1(f, IR_OP_PERMUTE, x, ir_attr_ints("perm", perms[i], 3)));
  /* slices: plain, strided, empty-free edge ranges */
  static const int64_t st[][3] = {{0, 1, 0}, {2, 0, 4}, {1, 0, 1}, {0, 2, 0}};
  static const int64_t sp[][3] = {{3, 3, 5}, {3, 4, 5}, {3, 4, 5}, {3, 3, 5}};
  static const int64_t ss[][3] = {{1, 1, 2}, {1, 2, 2}, {2, 3, 1}, {2, 1, 3}};
  for (int i = 0; i < 4; i++) {
    IrAttr a[3] = {ir_attr_ints("starts", st[i], 3), ir_attr_ints("stops", sp[i], 3), ir_attr_ints("steps", ss[i], 3)};
    IrValue *s = build(f, IR_OP_SLICE, &x, 1, a, 3, NULL);
    sink(f, s);
    /* and back: unslice into x's shape */
    IrAttr b[4] = {a[0], a[1], a[2], ir_attr_ints("shape", x->type.shape.dim, 3)};
    sink(f, build(f, IR_OP_UNSLICE, &s, 1, b, 4, NULL));
  }
  sink(f, build(f, IR_OP_CONCAT, (IrValue *[]){x, z, x}, 3, (IrAttr[]){ir_attr_int("axis", 1)}, 1, NULL));
  sink(f, build(f, IR_OP_CONCAT, (IrValue *[]){w, x}, 2, (IrAttr[]){ir_attr_int("axis", -1)}, 1, NULL));
  sink(f, build(f, IR_OP_CONCAT, (IrValue *[]){x, x}, 2, (IrAttr[]){ir_attr_int("axis", 0)}, 1, NULL));
  Stats s1 = check_built(f, false, 51);
  assert_true(s1.outputs >= 15);
  ir_func_free(f);
}

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
  Stats st = check_built(f, true, 61);
  int grads = 0;
  for (int i = 0; i < f->nvalues; i++) grads += f->values[i]->storage == IR_STORE_GRAD;
  assert_int_equal(grads, 3);
  assert_true(st.outputs >= 3);
  ir_func_free(f);
}

/* ------------------------------------------------------------------ */
/* bf16 and f16                                                        */
/* ------------------------------------------------------------------ */

static void low_precision(IrDType dt) {
  IrFunc *f = ir_func_new("lowp");
  IrValue *x = input(f, "x", ty(dt, 2, 4, 33));
  IrValue *y = input(f, "y", ty(dt, 2, 4, 33));
  sink(f, bin(f, IR_OP_ADD, x, y));
  sink(f, bin(f, IR_OP_MUL, x, y));
  sink(f, un(f, IR_OP_EXP, x));
  sink(f, un(f, IR_OP_GELU, x));
  sink(f, cast(f, x, IR_DT_F32));
  sink(f, cast(f, cast(f, x, IR_DT_F32), dt));
  int64_t last = 1;
  sink(f, reduce(f, IR_OP_SUM, x, &last, 1, true));
  sink(f, un1(f, IR_OP_SOFTMAX, x, ir_attr_int("axis", -1)));
  one_kernel_per_op(f);
  trivial_plan(f);
  Inputs in = make_inputs(f, 71);
  double *xv = arg_data(&in, f, "x");
  xv[0] = 1e-7; /* an f16 subnormal */
  xv[1] = 70000; /* beyond f16's range */
  xv[2] = -3e-6;
  for (int i = 0; i < 3; i++) xv[i] = ir_round_dtype(xv[i], dt);
  check_kernels(f, &in);
  free_inputs(&in);
  ir_func_free(f);
}

static void test_codegen_bf16(void **state) { low_precision(IR_DT_BF16); }
static void test_codegen_f16(void **state) { low_precision(IR_DT_F16); }

/* ------------------------------------------------------------------ */
/* Fused groups from models (the CPU pipeline, memplan included)       */
/* ------------------------------------------------------------------ */

static void ignore_some_targets(IrFunc *f, Inputs *in) {
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
  Stats st = check_model("sm.gdl", src, 81, NULL);
  assert_true(st.kernels >= 2);
}

/* A causal softmax computes its exponentials up to the diagonal only
 * (rounded up to whole vectors) and fills the rest: T = 37 has rows whose
 * loop stops short of the row (i < 32) and rows that run to its end. */
static void test_codegen_causal_softmax(void **state) {
  const char *src = "model cs {\n"
                    "  batch B = 3\n  dim T = 37\n"
                    "  input x : f32[B, 2, T, T]\n  param w : f32[T]\n"
                    "  p = softmax(causal_mask(x * 0.5), axis=-1)\n"
                    "  loss l = sum(p * w) + sum(p * p)\n"
                    "}\n";
  Stats st = check_model("cs.gdl", src, 88, NULL);
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
  Stats st = check_model("rc.gdl", src, 89, NULL);
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
  Stats st = check_model("ln.gdl", src, 82, NULL);
  assert_true(st.kernels >= 2);
}

static void test_codegen_cross_entropy_fwd_bwd(void **state) {
  const char *src = "model ce {\n"
                    "  batch B = 8\n  dim D = 12\n  dim V = 37\n"
                    "  input x : f32[B, D]\n  input y : i32[B]\n  param W : f32[D, V]\n"
                    "  loss ce = cross_entropy(x @ W, y)\n"
                    "}\n";
  Stats st = check_model("ce.gdl", src, 83, ignore_some_targets);
  assert_true(st.kernels >= 2);
}

static void test_codegen_gelu_chain_f64(void **state) {
  const char *src = "model gl {\n"
                    "  batch B = 4\n  dim H = 40\n"
                    "  input x : f64[B, H]\n  param b : f64[H]\n  param W : f64[H, H]\n"
                    "  h = gelu(x @ W + b)\n"
                    "  loss l = sum(tanh(h) * sigmoid(h - b)) + mean(silu(h) ** 2)\n"
                    "}\n";
  Stats st = check_model("gl.gdl", src, 84, NULL);
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
  Stats st = check_model("examples/mlp.gdl", src, 86, ignore_some_targets);
  assert_true(st.kernels >= 5);
  free(src);
}

static void test_codegen_tinygpt_example(void **state) {
  char *src = tu_read("examples/tinygpt.gdl");
  Stats st = check_model("examples/tinygpt.gdl", src, 87, NULL);
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
  trivial_plan(f);
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
  assert_int_equal(k->iters, 4);
  k->fn(arena, 0, k->iters);
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
  Stats st = check_built(f, true, 91);
  assert_int_equal(st.kernels, 6);
  assert_int_equal(st.outputs, 6);
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
      cmocka_unit_test(test_codegen_elementwise_f32),
      cmocka_unit_test(test_codegen_elementwise_f64),
      cmocka_unit_test(test_codegen_elementwise_fused),
      cmocka_unit_test(test_codegen_i32_and_bool_ops),
      cmocka_unit_test(test_codegen_special_values),
      cmocka_unit_test(test_codegen_exp_tanh_accuracy),
      cmocka_unit_test(test_codegen_reductions_f32),
      cmocka_unit_test(test_codegen_reductions_f64),
      cmocka_unit_test(test_codegen_reductions_fused),
      cmocka_unit_test(test_codegen_nn_f32),
      cmocka_unit_test(test_codegen_nn_f64),
      cmocka_unit_test(test_codegen_indexed_f32),
      cmocka_unit_test(test_codegen_indexed_f64),
      cmocka_unit_test(test_codegen_indexed_fused),
      cmocka_unit_test(test_codegen_movement),
      cmocka_unit_test(test_codegen_grad_buffers_accumulate),
      cmocka_unit_test(test_codegen_bf16),
      cmocka_unit_test(test_codegen_f16),
      cmocka_unit_test(test_codegen_softmax_fwd_bwd),
      cmocka_unit_test(test_codegen_causal_softmax),
      cmocka_unit_test(test_codegen_recomputed_values),
      cmocka_unit_test(test_codegen_layer_norm_fwd_bwd),
      cmocka_unit_test(test_codegen_cross_entropy_fwd_bwd),
      cmocka_unit_test(test_codegen_gelu_chain_f64),
      cmocka_unit_test(test_codegen_sigmoid_gelu_accuracy),
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
