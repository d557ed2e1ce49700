/* backends.c - the op tests' adapter onto the library (backends.h): cases
 * built with ir_build, the interpreter, the LLVM and CUDA generators, the
 * emulator, autodiff.  Everything the tests know of the library's internal
 * names is here. */
#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backends.h"
#include "codegen/codegen.h"
#include "passes/passes.h"
#include "runtime/runtime.h"
#include "testutil.h"
#ifdef GRADC_HAVE_CUDA
#include "codegen/cuda/cuda_gen.h"
#endif

static const IrLoc noloc = {NULL, 0, 0};

/* ------------------------------------------------------------------ */
/* The op table                                                        */
/* ------------------------------------------------------------------ */

/* The columns this file reads; columns appended after the derivative
 * rule are ignored (the `...`). */
static const char *const derivative[IR_OP_COUNT] = {
#define OP(id, name, arity, kind, family, shape, grad, ...) [IR_OP_##id] = #grad,
#include "ir/ops.def"
#undef OP
};

static const char *const kind[IR_OP_COUNT] = {
#define OP(id, name, arity, kind, family, shape, grad, ...) [IR_OP_##id] = #kind,
#include "ir/ops.def"
#undef OP
};

const char *ot_op_name(IrOpcode op) { return ir_op_info[op].name; }
const char *ot_op_kind(IrOpcode op) { return kind[op]; }
bool ot_op_has_derivative(IrOpcode op) { return strcmp(derivative[op], "none") != 0; }

/* ------------------------------------------------------------------ */
/* Functions                                                           */
/* ------------------------------------------------------------------ */

IrFunc *ot_func_new(const char *name) { return ir_func_new(name); }
void ot_func_free(IrFunc *f) { ir_func_free(f); }

/* ------------------------------------------------------------------ */
/* Argument values                                                     */
/* ------------------------------------------------------------------ */

static double *add_slot(OtInputs *in, int64_t n) {
  if (in->n == in->cap) {
    in->cap = in->cap ? 2 * in->cap : 16;
    in->a = realloc(in->a, sizeof *in->a * (size_t)in->cap);
    if (!in->a) abort();
  }
  return in->a[in->n++] = calloc((size_t)(n ? n : 1), sizeof(double));
}

OtInputs ot_inputs_random(const IrFunc *f, uint64_t seed) {
  OtInputs in = {0};
  StFile st;
  st_init(&st);
  rt_random_inputs(f, 1, seed, &st);
  Rng rng;
  rng_seed(&rng, seed * 7 + 1);
  for (int i = 0; i < f->nargs; i++) {
    const IrValue *a = f->args[i];
    int64_t n = ir_numel(&a->type.shape);
    double *d = add_slot(&in, n);
    const StTensor *t = a->role == IR_ARG_INPUT ? st_find(&st, a->name) : NULL;
    for (int64_t k = 0; k < n; k++) {
      double v = rng_normal(&rng);
      if (t && t->dtype == ST_I32) v = ((const int32_t *)t->data)[k];
      if (t && t->dtype == ST_F32) v = ((const float *)t->data)[k];
      if (t && t->dtype == ST_F64) v = ((const double *)t->data)[k];
      if (a->type.dtype == IR_DT_I32 && !t) v = (double)(rng_next(&rng) % 5) - 2;
      if (a->type.dtype == IR_DT_BOOL) v = rng_next(&rng) & 1;
      d[k] = ir_round_dtype(v, a->type.dtype);
    }
  }
  st_free(&st);
  return in;
}

void ot_inputs_free(OtInputs *in) {
  for (int i = 0; i < in->n; i++) free(in->a[i]);
  free(in->a);
  memset(in, 0, sizeof *in);
}

double *ot_arg(OtInputs *in, const IrFunc *f, const char *name) {
  for (int i = 0; i < f->nargs; i++)
    if (f->args[i]->name && strcmp(f->args[i]->name, name) == 0) return in->a[i];
  fail_msg("no argument %s", name);
  return NULL;
}

/* ------------------------------------------------------------------ */
/* Building cases                                                      */
/* ------------------------------------------------------------------ */

/* One operand token of cases.h. */
typedef struct Operand {
  IrType t;
  char dist;    /* 0 normal, '+' positive, '~' ties, '<' indices, '!' nonzero, '=' a constant */
  double value; /* '<': the bound; '=': the constant */
} Operand;

static bool parse_operand(const char *s, size_t len, Operand *o, char *err, size_t n) {
  memset(o, 0, sizeof *o);
  size_t k = 0;
  while (k < len && s[k] != '[' && s[k] != '=') k++;
  if (!ir_dtype_parse(s, k, &o->t.dtype)) {
    snprintf(err, n, "bad dtype in operand '%.*s'", (int)len, s);
    return false;
  }
  if (k < len && s[k] == '=') {
    o->dist = '=';
    o->value = strtod(s + k + 1, NULL);
    return true;
  }
  if (k == len) {
    snprintf(err, n, "operand '%.*s' has no shape", (int)len, s);
    return false;
  }
  k++;
  while (k < len && s[k] != ']') {
    char *end;
    o->t.shape.dim[o->t.shape.rank++] = strtoll(s + k, &end, 10);
    k = (size_t)(end - s);
    if (k < len && s[k] == ',') k++;
  }
  k++;
  if (k < len) {
    o->dist = s[k];
    if (o->dist == '<') o->value = strtod(s + k + 1, NULL);
  }
  return true;
}

/* Attributes "key=value ..." (strings and int lists copied into buf). */
static int parse_attrs(const char *s, IrAttr *out, int cap, int64_t *ints, char *buf, char *err, size_t n) {
  int na = 0, ni = 0;
  while (s && *s) {
    while (*s == ' ') s++;
    if (!*s) break;
    const char *eq = strchr(s, '='), *end = strchr(s, ' ');
    if (!end) end = s + strlen(s);
    if (!eq || eq > end || na == cap) {
      snprintf(err, n, "bad attribute list '%s'", s);
      return -1;
    }
    char *key = buf;
    memcpy(key, s, (size_t)(eq - s));
    key[eq - s] = 0;
    buf += eq - s + 1;
    const char *v = eq + 1;
    if (*v == '[') {
      int first = ni;
      for (v++; *v != ']';) {
        char *e;
        ints[ni++] = strtoll(v, &e, 10);
        if (e == v) break;
        v = *e == ',' ? e + 1 : e;
      }
      out[na++] = ir_attr_ints(key, ints + first, ni - first);
    } else if (strncmp(v, "true", 4) == 0 || strncmp(v, "false", 5) == 0) {
      out[na++] = ir_attr_bool(key, *v == 't');
    } else if ((*v >= '0' && *v <= '9') || *v == '-') {
      bool fl = false;
      for (const char *c = v; c < end; c++) fl |= *c == '.' || *c == 'e' || *c == 'i'; /* "-inf" */
      out[na++] = fl ? ir_attr_float(key, strtod(v, NULL)) : ir_attr_int(key, strtoll(v, NULL, 10));
    } else {
      char *str = buf;
      memcpy(str, v, (size_t)(end - v));
      str[end - v] = 0;
      buf += end - v + 1;
      out[na++] = ir_attr_str(key, str);
    }
    s = end;
  }
  return na;
}

/* Values for one operand: its distribution. */
static void fill(double *d, const Operand *o, Rng *rng) {
  int64_t n = ir_numel(&o->t.shape);
  for (int64_t k = 0; k < n; k++) {
    double v = rng_normal(rng);
    switch (o->dist) {
    case '+': v = 0.25 + fabs(v); break;
    case '~': v = (double)(rng_next(rng) % 3) - 1; break;
    case '<': v = (double)(rng_next(rng) % (uint64_t)o->value); break;
    default: break;
    }
    if (o->t.dtype == IR_DT_I32 && o->dist != '<') v = (double)(rng_next(rng) % 5) - 2;
    if (o->t.dtype == IR_DT_I32 && o->dist == '!' && v == 0) v = k % 2 ? 3 : -1;
    if (o->t.dtype == IR_DT_BOOL) v = rng_next(rng) & 1;
    d[k] = ir_round_dtype(v, o->t.dtype);
  }
}

/* Edge values over operand k's values d (cases.h). */
static void edge(OpEdge e, int k, bool index, double *d, const Operand *o) {
  int64_t n = ir_numel(&o->t.shape);
  int64_t w = o->t.shape.rank ? o->t.shape.dim[o->t.shape.rank - 1] : 1;
  switch (e) {
  case OE_NONE: return;
  case OE_SPECIAL:
    if (k > 1 || !ir_dtype_is_float(o->t.dtype) || n < 3 * w || w < 6) return;
    if (k == 1) { /* the second operand: a NaN and an infinity of its own */
      d[0] = NAN, d[w + 2] = INFINITY;
      return;
    }
    d[2] = NAN, d[3] = 1e30, d[4] = -1e30, d[5] = -0.0;
    d[w + 1] = INFINITY, d[w + 5] = -INFINITY;
    for (int64_t i = 2 * w; i < 3 * w; i++) d[i] = -INFINITY;
    return;
  case OE_LARGE:
    if (k == 0 && ir_dtype_is_float(o->t.dtype))
      for (int64_t i = 0; i < n; i++) d[i] = ir_round_dtype(d[i] * 40, o->t.dtype);
    return;
  case OE_LOWP:
    if (k != 0 || n < 3) return;
    d[0] = ir_round_dtype(1e-7, o->t.dtype);
    d[1] = ir_round_dtype(70000, o->t.dtype);
    d[2] = ir_round_dtype(-3e-6, o->t.dtype);
    return;
  case OE_IGNORE:
    if (index)
      for (int64_t i = 0; i < n; i++) d[i] = i % 4 == 1 ? -100 : (double)((i * 5) % (int64_t)o->value);
    return;
  case OE_ALL_IGNORED:
    if (index)
      for (int64_t i = 0; i < n; i++) d[i] = -100;
    return;
  case OE_REPEAT:
    if (!index) return;
    for (int64_t i = 0; i < n; i++) d[i] = (double)((i * 7) % (int64_t)o->value);
    d[n - 1] = d[0];
    return;
  case OE_INTDIV:
    if (k == 0) d[0] = -7;
    if (k == 1) d[0] = -1;
    return;
  }
}

static IrValue *build(IrFunc *f, IrOpcode opc, IrValue **args, int nargs, const IrAttr *attrs, int nattrs,
                      const IrType *hint, char *err, size_t n) {
  IrOp *op = ir_build(f, opc, args, nargs, attrs, nattrs, hint, noloc, err, n);
  return op ? op->result : NULL;
}

/* A group-0 reader, so that v is a kernel output whatever the kernels are. */
static void sink(IrFunc *f, IrValue *v) {
  IrAttr a = ir_attr_ints("shape", v->type.shape.dim, v->type.shape.rank);
  ir_emit(f, IR_OP_RESHAPE, &v, 1, &a, 1, NULL, noloc);
}

/* The case's operands split into tokens. */
static int operands(const OpCase *c, Operand *ops, int cap, char *err, size_t n) {
  int k = 0;
  for (const char *s = c->operands; *s;) {
    while (*s == ' ') s++;
    size_t len = strcspn(s, " ");
    if (!len) break;
    if (k == cap || !parse_operand(s, len, &ops[k], err, n)) return -1;
    k++;
    s += len;
  }
  return k;
}

/* Case c into f, its operands' values appended to in.  For the back ends
 * every operand is an input and the result gets a reader; for the
 * gradient check (grad) float operands become f64 params, their edge
 * values left out. */
static IrValue *emit_case(IrFunc *f, const OpCase *c, int row, bool share, bool grad, OtInputs *in, Rng *rng,
                          char *err, size_t n) {
  Operand ops[8];
  int nops = operands(c, ops, 8, err, n);
  if (nops < 0) return NULL;
  IrValue *args[8];
  int first_index = -1;
  for (int k = 0; k < nops; k++)
    if (ops[k].dist == '<' && first_index < 0) first_index = k;
  for (int k = 0; k < nops; k++) {
    Operand *o = &ops[k];
    if (grad && ir_dtype_is_float(o->t.dtype)) o->t.dtype = IR_DT_F64;
    if (o->dist == '=') {
      IrType st = {o->t.dtype, ir_shape_scalar()};
      IrAttr a = ir_attr_float("value", o->value);
      if (!(args[k] = build(f, IR_OP_CONST, NULL, 0, &a, 1, &st, err, n))) return NULL;
      continue;
    }
    char name[96];
    if (share) {
      /* shared by position, type, distribution and edge values */
      int len = snprintf(name, sizeof name, "s%d_", k);
      for (const char *p = ir_dtype_name(o->t.dtype); *p; p++) name[len++] = *p;
      for (int d = 0; d < o->t.shape.rank; d++) len += snprintf(name + len, sizeof name - (size_t)len, "_%lld",
                                                                (long long)o->t.shape.dim[d]);
      len += snprintf(name + len, sizeof name - (size_t)len, "_%d_%d_%d", o->dist, (int)o->value, (int)c->edge);
      IrValue *old = ir_func_find_arg(f, name);
      if (old) {
        args[k] = old;
        continue;
      }
    } else if (grad) {
      snprintf(name, sizeof name, "operand%d", k);
    } else {
      snprintf(name, sizeof name, "r%d_%d", row, k);
    }
    bool param = grad && ir_dtype_is_float(o->t.dtype);
    args[k] = ir_func_add_arg(f, name, o->t, param ? IR_ARG_PARAM : IR_ARG_INPUT, false);
    double *d = add_slot(in, ir_numel(&o->t.shape));
    if (grad && param && o->dist == '+') {
      for (int64_t e = 0; e < ir_numel(&o->t.shape); e++) d[e] = 0.5 + 1.5 * rng_uniform(rng);
    } else {
      fill(d, o, rng);
    }
    if (!grad || !param) edge(c->edge, k, k == first_index, d, o);
  }
  IrAttr attrs[8];
  int64_t ints[64];
  char buf[512];
  int na = parse_attrs(c->attrs, attrs, 8, ints, buf, err, n);
  if (na < 0) return NULL;
  IrType hint, *hp = NULL;
  if (c->result) {
    Operand r = {0};
    if (strchr(c->result, '[')) {
      if (!parse_operand(c->result, strlen(c->result), &r, err, n)) return NULL;
    } else {
      if (!ir_dtype_parse(c->result, strlen(c->result), &r.t.dtype)) {
        snprintf(err, n, "bad result type '%s'", c->result);
        return NULL;
      }
      r.t.shape = args[0]->type.shape;
    }
    if (grad && ir_dtype_is_float(r.t.dtype) && c->op != IR_OP_CAST) r.t.dtype = IR_DT_F64;
    hint = r.t;
    hp = &hint;
  }
  IrValue *y = build(f, c->op, args, nops, attrs, na, hp, err, n);
  if (y && !grad) {
    char name[32];
    snprintf(name, sizeof name, "r%d", row); /* failures name the row */
    y->name = arena_strdup(&f->arena, name);
    sink(f, y);
  }
  return y;
}

IrValue *ot_case_emit(IrFunc *f, const OpCase *c, int row, bool share, OtInputs *in, char *err, size_t n) {
  Rng rng;
  rng_seed(&rng, 1000 + (uint64_t)row * 31 + (share ? 7 : 0));
  return emit_case(f, c, row, share, false, in, &rng, err, n);
}

/* ------------------------------------------------------------------ */
/* Grouping, planning, passes                                          */
/* ------------------------------------------------------------------ */

void ot_one_kernel_per_op(IrFunc *f) {
  int g = 0;
  for (int i = 0; i < f->nops; i++) f->ops[i]->group = kp_op_group0(f->ops[i]->opcode) ? 0 : ++g;
}

void ot_trivial_plan(IrFunc *f) {
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

bool ot_passes(IrFunc *f, const char *const *names, int n, bool cuda, char *err, size_t errlen) {
  PassManager pm;
  pm_init(&pm);
  pm.verify = true;
  Diag d;
  diag_init(&d, NULL);
  d.quiet = true;
  PassOptions o = {.gas = 1, .diag = &d, .no_inplace = cuda, .no_colsums = cuda};
  int rc = pm_run(&pm, f, names, n, &o);
  if (rc != 0) snprintf(err, errlen, "passes failed (%d): %s", rc, sb_str(&d.log));
  diag_free(&d);
  return rc == 0;
}

bool ot_verify(IrFunc *f, char *err, size_t errlen) { return ir_verify(f, err, errlen); }

/* ------------------------------------------------------------------ */
/* Elements                                                            */
/* ------------------------------------------------------------------ */

uint16_t ot_f16_bits(double v) { /* v is representable in f16 */
  uint16_t s = signbit(v) ? 0x8000 : 0;
  double a = fabs(v);
  if (isnan(v)) return 0x7e00;
  if (isinf(v)) return s | 0x7c00;
  if (a < ldexp(1.0, -14)) return s | (uint16_t)(a * ldexp(1.0, 24));
  int e;
  double m = frexp(a, &e); /* a = m 2^e, m in [0.5, 1) */
  return s | (uint16_t)((e - 1 + 15) << 10) | (uint16_t)((m * 2 - 1) * 1024);
}

double ot_f16_value(uint16_t h) {
  int sign = h >> 15, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
  double v = exp == 0 ? ldexp(man, -24) : exp == 31 ? (man ? NAN : INFINITY) : ldexp(man | 0x400, exp - 25);
  return sign ? -v : v;
}

/* The dtype of v's elements in memory (gradient buffers: f32 or f64). */
static IrDType mem_dtype(const IrValue *v) {
  if (v->storage == IR_STORE_GRAD) return v->type.dtype == IR_DT_F64 ? IR_DT_F64 : IR_DT_F32;
  return v->type.dtype;
}

size_t ot_elem_size(const IrValue *v) { return ir_dtype_size(mem_dtype(v)); }

void ot_put(char *arena, const IrValue *v, int64_t i, double x) {
  char *p = arena + v->offset + i * (int64_t)ot_elem_size(v);
  switch (mem_dtype(v)) {
  case IR_DT_F32: {
    float y = (float)x;
    memcpy(p, &y, 4);
    break;
  }
  case IR_DT_F64: memcpy(p, &x, 8); break;
  case IR_DT_BF16: {
    float y = (float)x;
    uint32_t u;
    memcpy(&u, &y, 4);
    uint16_t h = (uint16_t)(u >> 16); /* exact: the value is a bf16 already */
    memcpy(p, &h, 2);
    break;
  }
  case IR_DT_F16: {
    uint16_t h = ot_f16_bits(x);
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

double ot_get(const char *arena, const IrValue *v, int64_t i) {
  const char *p = arena + v->offset + i * (int64_t)ot_elem_size(v);
  switch (mem_dtype(v)) {
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
    uint32_t u = (uint32_t)h << 16;
    float y;
    memcpy(&y, &u, 4);
    return y;
  }
  case IR_DT_F16: {
    uint16_t h;
    memcpy(&h, p, 2);
    return ot_f16_value(h);
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

double ot_grad_prefill(int64_t i) { return 0.5 + (double)(i % 7) * 0.25; }

/* ------------------------------------------------------------------ */
/* Comparing                                                           */
/* ------------------------------------------------------------------ */

/* CPU: f32 within 1e-5; CUDA: 1e-4, its sums accumulate in f32 where the
 * interpreter's use f64, so an element that cancels gets its error
 * relative to 5% of the tensor's largest. */
const OtTol ot_tol_cpu = {1e-5, 1e-12, 2e-2, 2e-3, 1e-2, 1e-2};
const OtTol ot_tol_cuda = {1e-4, 1e-12, 2e-2, 2e-3, 5e-2, 1e-2};

static double tolerance(const OtTol *t, IrDType dt) {
  switch (dt) {
  case IR_DT_F32: return t->f32;
  case IR_DT_F64: return t->f64;
  case IR_DT_BF16: return t->bf16;
  case IR_DT_F16: return t->f16;
  case IR_DT_I32:
  case IR_DT_BOOL: return 0;
  }
  return 0;
}

bool ot_compare(const char *what, const char *kernel, const IrValue *v, const char *arena, const double *want,
                const OtTol *t, OtStats *st, char *err, size_t errlen) {
  int64_t n = ir_numel(&v->type.shape);
  IrDType dt = v->type.dtype;
  double tol = tolerance(t, dt), big = 0;
  /* Random draws are the same bits on every back end (ir/random.c), but for
   * an f64 normal, whose log and cos are the device's own on a GPU. */
  const IrOp *d = v->def;
  if (d && d->opcode == IR_OP_RANDOM && (dt == IR_DT_F32 || strcmp(ir_attr_get_str(d, "dist", ""), "uniform") == 0))
    tol = 0;
  for (int64_t i = 0; i < n; i++)
    if (isfinite(want[i]) && fabs(want[i]) > big) big = fabs(want[i]);
  double share = dt == IR_DT_F32 ? t->share_f32 : t->share;
  double floor = big * share > 1e-30 ? big * share : 1e-30;
  int bad = 0;
  double worst = 0;
  int64_t worst_i = -1;
  char msg[2048];
  int len = 0;
  for (int64_t i = 0; i < n; i++) {
    double w = want[i], got = ot_get(arena, v, i);
    if (v->storage == IR_STORE_GRAD) w += ot_grad_prefill(i);
    double e;
    if (isnan(w) || isnan(got))
      e = isnan(w) && isnan(got) ? 0 : INFINITY;
    else if (isinf(w) || isinf(got))
      e = w == got ? 0 : INFINITY;
    else
      e = fabs(got - w) / fmax(fabs(w), floor);
    bool ok = tol == 0 ? e == 0 : e < tol;
    if (e > worst || worst_i < 0) worst = e, worst_i = i;
    if (!ok && bad++ < 5 && len < (int)sizeof msg - 200)
      len += snprintf(msg + len, sizeof msg - (size_t)len, "\n  [%lld] got %.9g want %.9g (error %.3g)", (long long)i,
                      got, w, e);
  }
  if (st) {
    if (tol > 0 && worst / tol > st->worst) st->worst = worst / tol;
    st->outputs++;
  }
  if (!bad) return true;
  char nb[64];
  if (v->name)
    snprintf(nb, sizeof nb, "%%%s", v->name);
  else
    snprintf(nb, sizeof nb, "%%#%d", v->id);
  snprintf(err, errlen,
           "%s: kernel %s, output %s (%s, %lld elements): %d mismatches, largest error %.3g at [%lld] "
           "(tolerance %g):%s",
           what, kernel, nb, ir_dtype_name(dt), (long long)n, bad, worst, (long long)worst_i, tol, msg);
  return false;
}

/* ------------------------------------------------------------------ */
/* The interpreter                                                     */
/* ------------------------------------------------------------------ */

bool ot_ref_run(IrFunc *f, OtInputs *in, OtRef *out, char *err, size_t errlen) {
  InterpState *is = calloc(1, sizeof *is);
  double **wsum = calloc((size_t)f->nvalues + 1, sizeof(double *));
  bool any_wsum = false, ok = true;
  for (int i = 0; i < f->nops; i++) any_wsum |= f->ops[i]->opcode == IR_OP_WINDOW_SUM;
  if (any_wsum) {
    ok = interp_run(is, f, in->a, NULL, INTERP_COUNT, NULL, err, errlen);
    for (int i = 0; ok && i < f->nops; i++) {
      const IrOp *op = f->ops[i];
      if (op->opcode != IR_OP_WINDOW_SUM) continue;
      int64_t n = ir_numel(&op->result->type.shape);
      wsum[op->result->id] = calloc((size_t)(n ? n : 1), sizeof(double));
      memcpy(wsum[op->result->id], is->val[op->args[0]->id], sizeof(double) * (size_t)n);
    }
    interp_free(is);
  }
  ok = ok && interp_run(is, f, in->a, wsum, INTERP_STEP, NULL, err, errlen);
  for (int v = 0; v < f->nvalues; v++) free(wsum[v]);
  free(wsum);
  out->val = is->val;
  out->state = is;
  return ok;
}

void ot_ref_free(OtRef *r) {
  if (r->state) interp_free(r->state);
  free(r->state);
  memset(r, 0, sizeof *r);
}

#if defined(GRADC_HAVE_LLVM) || defined(GRADC_HAVE_CUDA) /* running kernels */
/* Which values of f kernel group g writes for others to read. */
static void mark_outputs(const IrFunc *f, int g, bool *is_out) {
  memset(is_out, 0, (size_t)f->nvalues + 1);
  for (int q = 0; q < f->nops; q++) {
    const IrOp *op = f->ops[q];
    if (op->group == g) continue;
    for (int a = 0; a < op->nargs; a++)
      if (op->args[a]->def && op->args[a]->def->group == g) is_out[op->args[a]->id] = true;
  }
}

/* Prefill the outputs of ops[0..n): garbage, or the gradient prefill. */
static void prefill(char *arena, IrOp *const *ops, int n, bool *is_out) {
  for (int q = 0; q < n; q++) {
    const IrValue *v = ops[q]->result;
    if (v && v->storage == IR_STORE_NONE) is_out[v->id] = false; /* nothing reads it in a step */
    if (!v || !is_out[v->id]) continue;
    int64_t n = ir_numel(&v->type.shape);
    if (v->storage == IR_STORE_GRAD)
      for (int64_t e = 0; e < n; e++) ot_put(arena, v, e, ot_grad_prefill(e));
    else
      memset(arena + v->offset, 0xff, (size_t)n * ot_elem_size(v));
  }
}

/* Write the operands ops[0..n) read from outside group g. */
static void write_inputs(char *arena, IrOp *const *ops, int n, int g, const OtRef *ref) {
  for (int q = 0; q < n; q++) {
    const IrOp *op = ops[q];
    for (int a = 0; a < op->nargs; a++) {
      const IrValue *v = op->args[a];
      if (v->def && (v->def->group == g || (v->def->group == 0 && v->def->opcode == IR_OP_CONST))) continue;
      if (v->storage == IR_STORE_NONE) continue;
      int64_t k = ir_numel(&v->type.shape);
      for (int64_t e = 0; e < k; e++) ot_put(arena, v, e, ref->val[v->id][e]);
    }
  }
}

/* Append one failure's message to err (the first ones, while room lasts). */
static void add_failure(char *err, size_t errlen, const char *msg) {
  size_t len = strlen(err);
  if (len + 2 < errlen) snprintf(err + len, errlen - len, "%s%s", len ? "\n" : "", msg);
}

/* Compare the outputs of ops[0..n), every one (the mismatches appended to
 * err); contributions accumulating into one gradient buffer (memplan
 * splits grad(add(p, q))) against their sum. */
static bool check_outputs(const char *what, const char *kname, IrOp *const *ops, int n, const bool *is_out,
                          const char *arena, const OtRef *ref, const OtTol *tol, OtStats *st, char *err,
                          size_t errlen) {
  bool all = true;
  char msg[4096];
  for (int q = 0; q < n; q++) {
    const IrValue *v = ops[q]->result;
    if (!v || !is_out[v->id]) continue;
    const double *want = ref->val[v->id];
    double *sum = NULL;
    if (v->storage == IR_STORE_GRAD) {
      bool first = true;
      for (int r = 0; r < q; r++) {
        const IrValue *w = ops[r]->result;
        first &= !(w && is_out[w->id] && w->storage == IR_STORE_GRAD && w->offset == v->offset);
      }
      if (!first) continue;
      int64_t k = ir_numel(&v->type.shape);
      want = sum = calloc((size_t)(k ? k : 1), sizeof(double));
      for (int r = q; r < n; r++) {
        const IrValue *w = ops[r]->result;
        if (!w || !is_out[w->id] || w->storage != IR_STORE_GRAD || w->offset != v->offset) continue;
        for (int64_t e = 0; e < k; e++) sum[e] += ref->val[w->id][e];
      }
    }
    if (!ot_compare(what, kname, v, arena, want, tol, st, msg, sizeof msg)) {
      add_failure(err, errlen, msg);
      if (st) st->failed++;
      all = false;
    }
    free(sum);
  }
  return all;
}

static char *new_arena(const IrFunc *f) {
  size_t asz = (size_t)(f->arena_size > 0 ? f->arena_size : 64);
  char *arena = aligned_alloc(64, (asz + 63) / 64 * 64);
  if (!arena) abort();
  memset(arena, 0xff, asz);
  return arena;
}
#endif

/* ------------------------------------------------------------------ */
/* The CPU back end                                                    */
/* ------------------------------------------------------------------ */

#ifdef GRADC_HAVE_LLVM
bool ot_cpu_available(void) { return true; }

bool ot_cpu_check(IrFunc *f, OtInputs *in, const char *what, OtStats *st, char *err, size_t errlen) {
  OtRef ref;
  if (!ot_ref_run(f, in, &ref, err, errlen)) {
    ot_ref_free(&ref);
    return false;
  }
  CgOptions o = {0};
  bool trace = getenv("GRADC_TEST_TRACE") != NULL; /* debugging: dump the IR and name each kernel run */
  o.dump_llvm = getenv("GRADC_TEST_DUMP_LLVM") != NULL;
  if (trace) ir_print_file(f, stderr);
  char cerr[1024];
  CgModule *m = cg_llvm_compile(f, &o, cerr, sizeof cerr);
  if (!m) {
    snprintf(err, errlen, "%s: cg_llvm_compile: %s", what, cerr);
    ot_ref_free(&ref);
    return false;
  }
  char *arena = new_arena(f);
  bool *is_out = calloc((size_t)f->nvalues + 1, sizeof(bool)), ok = true, matches = true;
  err[0] = 0;
  for (int i = 0; ok && i < f->nops;) {
    int g = f->ops[i]->group, j = i;
    while (j < f->nops && f->ops[j]->group == g) j++;
    if (g == 0) {
      i = j;
      continue;
    }
    const CgKernel *k = cg_module_kernel(m, g);
    if (!k) {
      snprintf(err, errlen, "%s: no kernel for group %d", what, g);
      ok = false;
      break;
    }
    mark_outputs(f, g, is_out);
    prefill(arena, f->ops + i, j - i, is_out);
    /* inputs after the prefill: memplan may have put an output over an
     * operand that dies in the kernel */
    write_inputs(arena, f->ops + i, j - i, g, &ref);
    if (trace) fprintf(stderr, "running %s over %lld\n", k->name, (long long)k->iters);
    int64_t half = k->iters / 2;
    k->fn(arena, 0, half, k->offs);
    k->fn(arena, half, k->iters, k->offs);
    matches &= check_outputs(what, k->name, f->ops + i, j - i, is_out, arena, &ref, &ot_tol_cpu, st, err, errlen);
    if (st) st->kernels++;
    i = j;
  }
  free(is_out);
  free(arena);
  cg_module_free(m);
  ot_ref_free(&ref);
  return ok && matches;
}
#else
bool ot_cpu_available(void) { return false; }
bool ot_cpu_check(IrFunc *f, OtInputs *in, const char *what, OtStats *st, char *err, size_t errlen) {
  (void)f, (void)in, (void)st;
  snprintf(err, errlen, "%s: this build has no CPU back end", what);
  return false;
}
#endif

/* ------------------------------------------------------------------ */
/* The CUDA back end under the emulator                                */
/* ------------------------------------------------------------------ */

#ifdef GRADC_HAVE_CUDA
struct OtEmu {
  int n;
  IrFunc **fs;
  const char **names;
  CuModule **m;
  void *so;
};

typedef void (*LaunchFn)(void (*)(void **), void **, unsigned, unsigned, unsigned);

bool ot_emu_available(char *why, size_t n) {
  if (system("c++ --version > /dev/null 2>&1") == 0) return true;
  snprintf(why, n, "no C++ compiler for the emulator");
  return false;
}

/* Every function's kernels in one C++ file (renamed c<case>_<name>, each
 * with a trampoline emu_c<case>_<name>(void **args)), compiled, loaded. */
OtEmu *ot_emu_build(IrFunc *const *fs, const char *const *names, int n, char *err, size_t errlen) {
  static int serial;
  OtEmu *e = calloc(1, sizeof *e);
  e->n = n;
  e->fs = calloc((size_t)n + 1, sizeof *e->fs);
  e->names = calloc((size_t)n + 1, sizeof *e->names);
  e->m = calloc((size_t)n + 1, sizeof *e->m);
  StrBuf sb;
  sb_init(&sb);
  sb_puts(&sb, "#include \"emu.h\"\n");
  sb_puts(&sb, cu_prelude);
  for (int c = 0; c < n; c++) {
    e->fs[c] = fs[c];
    e->names[c] = names[c];
    char gerr[2048];
    e->m[c] = cg_cuda_generate(fs[c], gerr, sizeof gerr);
    if (!e->m[c]) {
      snprintf(err, errlen, "%s: %s", names[c], gerr);
      sb_free(&sb);
      ot_emu_free(e);
      return NULL;
    }
    const CuModule *m = e->m[c];
    for (int k = 0; k < m->ncodes; k++) {
      const CuCode *code = &m->codes[k];
      sb_printf(&sb, "\n%s%sc%d_%s%s", code->comment, code->pre, c, code->func, code->post);
      const CuKernel *kn = &m->kernels[code->first];
      sb_printf(&sb, "extern \"C\" void emu_c%d_%s(void **a) {\n  c%d_%s(", c, code->func, c, code->func);
      for (int p = 0; p < kn->nparams; p++)
        sb_printf(&sb, "%s(%s%s *)a[%d]", p ? ", " : "", kn->params[p].out ? "" : "const ",
                  cu_mem_type(kn->params[p].v->type.dtype, kn->params[p].grad), p);
      sb_puts(&sb, ");\n}\n");
    }
  }
  char dir[256], path[512], so[512], cmd[2048];
  snprintf(dir, sizeof dir, "%s/gradc-emu-XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
  if (!mkdtemp(dir)) {
    snprintf(err, errlen, "mkdtemp failed");
    sb_free(&sb);
    ot_emu_free(e);
    return NULL;
  }
  snprintf(path, sizeof path, "%s/prog%d.cpp", dir, serial);
  snprintf(so, sizeof so, "%s/prog%d.so", dir, serial++);
  FILE *fp = fopen(path, "w");
  if (fp) fputs(sb_str(&sb), fp), fclose(fp);
  sb_free(&sb);
  snprintf(cmd, sizeof cmd, "c++ -std=c++17 -O0 -w -fPIC -shared -I%s -o %s %s", tu_path("tests/cuda"), so, path);
  if (!fp || system(cmd) != 0) {
    snprintf(err, errlen, "the emulated program does not compile (%s)", path);
    ot_emu_free(e);
    return NULL;
  }
  e->so = dlopen(so, RTLD_NOW | RTLD_LOCAL);
  if (!e->so) snprintf(err, errlen, "dlopen %s: %s", so, dlerror());
  if (!getenv("GRADC_TEST_KEEP")) {
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0) fprintf(stderr, "cannot remove %s\n", dir);
  } else {
    fprintf(stderr, "emulated program: %s\n", path);
  }
  if (!e->so) {
    ot_emu_free(e);
    return NULL;
  }
  return e;
}

void ot_emu_free(OtEmu *e) {
  if (!e) return;
  if (e->so) {
    void (*release)(void) = (void (*)(void))(uintptr_t)dlsym(e->so, "emu_release");
    if (release) release();
    dlclose(e->so);
  }
  for (int c = 0; c < e->n; c++)
    if (e->m[c]) cg_cuda_free(e->m[c]);
  free(e->m);
  free(e->fs);
  free(e->names);
  free(e);
}

bool ot_emu_check(OtEmu *e, int c, OtInputs *in, OtStats *st, char *err, size_t errlen) {
  IrFunc *f = e->fs[c];
  const CuModule *m = e->m[c];
  const char *what = e->names[c];
  OtRef ref;
  if (!ot_ref_run(f, in, &ref, err, errlen)) {
    ot_ref_free(&ref);
    return false;
  }
  LaunchFn launch = (LaunchFn)(uintptr_t)dlsym(e->so, "emu_launch");
  char *arena = new_arena(f);
  bool *is_out = calloc((size_t)f->nvalues + 1, sizeof(bool)), ok = launch != NULL, matches = true;
  err[0] = 0;
  if (!launch) snprintf(err, errlen, "the emulator has no emu_launch");
  for (int kk = 0; ok && kk < m->nkernels; kk++) {
    const CuKernel *k = &m->kernels[kk];
    write_inputs(arena, k->ops, k->nops, k->group, &ref);
    mark_outputs(f, k->group, is_out);
    prefill(arena, k->ops, k->nops, is_out);
    if (k->code < 0) continue;
    char sym[256];
    snprintf(sym, sizeof sym, "emu_c%d_%s", c, m->codes[k->code].func);
    void (*tramp)(void **) = (void (*)(void **))(uintptr_t)dlsym(e->so, sym);
    if (!tramp) {
      snprintf(err, errlen, "%s: no %s", what, sym);
      ok = false;
      break;
    }
    void **args = calloc((size_t)k->nparams + 1, sizeof(void *));
    for (int p = 0; p < k->nparams; p++) {
      const CuParam *q = &k->params[p];
      size_t es = q->grad ? (q->v->type.dtype == IR_DT_F64 ? 8 : 4) : ir_dtype_size(q->v->type.dtype);
      args[p] = arena + q->v->offset + (size_t)q->elem * es;
    }
    if (getenv("GRADC_TEST_TRACE")) fprintf(stderr, "%s: running %s\n", what, k->name);
    launch(tramp, args, (unsigned)k->grid, k->block[0], k->block[1]);
    free(args);
    matches &= check_outputs(what, k->name, k->ops, k->nops, is_out, arena, &ref, &ot_tol_cuda, st, err, errlen);
    if (st) st->kernels++;
  }
  free(is_out);
  free(arena);
  ot_ref_free(&ref);
  return ok && matches;
}
#else
struct OtEmu {
  int unused;
};
bool ot_emu_available(char *why, size_t n) {
  snprintf(why, n, "this build has no CUDA back end (-DGRADC_CUDA=OFF)");
  return false;
}
OtEmu *ot_emu_build(IrFunc *const *fs, const char *const *names, int n, char *err, size_t errlen) {
  (void)fs, (void)names, (void)n;
  snprintf(err, errlen, "this build has no CUDA back end");
  return NULL;
}
bool ot_emu_check(OtEmu *e, int c, OtInputs *in, OtStats *st, char *err, size_t errlen) {
  (void)e, (void)c, (void)in, (void)st;
  snprintf(err, errlen, "this build has no CUDA back end");
  return false;
}
void ot_emu_free(OtEmu *e) { (void)e; }
#endif

/* ------------------------------------------------------------------ */
/* Derivatives                                                         */
/* ------------------------------------------------------------------ */

#define FD_H 1e-6
#define FD_TOL 1e-6
#define FD_MAX 48 /* elements perturbed per param */

static bool eval(IrFunc *f, OtInputs *in, InterpState *st, char *err, size_t n) {
  InterpOptions opt = {.exact_f64 = true};
  double **ws = calloc((size_t)f->nvalues + 1, sizeof(double *));
  bool ok = interp_run(st, f, in->a, ws, INTERP_STEP, &opt, err, n);
  free(ws);
  return ok;
}

static bool loss(IrFunc *f, OtInputs *in, const IrValue *L, double *out, char *err, size_t n) {
  InterpState st = {0};
  bool ok = eval(f, in, &st, err, n);
  if (ok) *out = st.val[L->id][0];
  interp_free(&st);
  return ok;
}

/* Every op autodiff appended (from op nfwd on) feeds some `grad`. */
static bool no_dead_backward(const IrFunc *f, int nfwd, char *err, size_t n) {
  bool *live = calloc((size_t)f->nvalues + 1, sizeof(bool)), ok = true;
  for (int i = f->nops - 1; i >= 0; i--) {
    const IrOp *op = f->ops[i];
    if (!(op->opcode == IR_OP_GRAD || (op->result && live[op->result->id]))) continue;
    for (int j = 0; j < op->nargs; j++) live[op->args[j]->id] = true;
  }
  for (int i = nfwd; ok && i < f->nops; i++) {
    const IrOp *op = f->ops[i];
    if (op->opcode == IR_OP_GRAD || live[op->result->id]) continue;
    snprintf(err, n, "dead backward op '%s' (op %d)", ir_op_info[op->opcode].name, i);
    ok = false;
  }
  free(live);
  return ok;
}

/* p's gradient on the interpreter against central differences. */
static bool check_param(IrFunc *f, OtInputs *in, int pi, const IrValue *L, const InterpState *st, char *err,
                        size_t n) {
  const IrValue *p = f->args[pi];
  const IrValue *g = NULL;
  for (int i = 0; i < f->nops; i++)
    if (f->ops[i]->opcode == IR_OP_GRAD && strcmp(ir_attr_get_str(f->ops[i], "name", ""), p->name) == 0)
      g = f->ops[i]->args[0];
  /* named d<param>, unless another param shares the value */
  bool shared = false;
  for (int i = 0; g && i < f->nops; i++)
    shared |= f->ops[i]->opcode == IR_OP_GRAD && f->ops[i]->args[0] == g &&
              strcmp(ir_attr_get_str(f->ops[i], "name", ""), p->name) != 0;
  if (g && !shared && (!g->name || g->name[0] != 'd' || strcmp(g->name + 1, p->name) != 0)) {
    snprintf(err, n, "the gradient of %s is named %s, not d%s", p->name, g->name ? g->name : "(none)", p->name);
    return false;
  }
  int64_t np = ir_numel(&p->type.shape);
  int64_t step = np > FD_MAX ? (np + FD_MAX - 1) / FD_MAX : 1;
  double e2 = 0, norm = 0, worst = -1;
  int64_t worst_k = 0;
  double worst_got = 0, worst_want = 0;
  for (int64_t k = 0; k < np; k += step) {
    double x0 = in->a[pi][k], lp, lm;
    in->a[pi][k] = x0 + FD_H;
    bool ok = loss(f, in, L, &lp, err, n);
    in->a[pi][k] = x0 - FD_H;
    ok = ok && loss(f, in, L, &lm, err, n);
    in->a[pi][k] = x0;
    if (!ok) return false;
    double want = (lp - lm) / (2 * FD_H), got = g ? st->val[g->id][k] : 0;
    if (!isfinite(got)) {
      snprintf(err, n, "gradient of %s: element %lld is %g", p->name, (long long)k, got);
      return false;
    }
    double d = (got - want) * (got - want);
    if (d > worst) worst = d, worst_k = k, worst_got = got, worst_want = want;
    e2 += d;
    norm += want * want;
  }
  if (sqrt(e2) <= FD_TOL * fmax(sqrt(norm), 1e-2)) return true;
  snprintf(err, n,
           "gradient of %s: |autodiff - finite differences| = %.3g, |finite differences| = %.3g; worst element "
           "[%lld]: autodiff %.12g, finite differences %.12g",
           p->name, sqrt(e2), sqrt(norm), (long long)worst_k, worst_got, worst_want);
  return false;
}

bool ot_gradcheck(const OpCase *c, uint64_t seed, int *checked, char *err, size_t errlen) {
  *checked = 0;
  IrFunc *f = ir_func_new("gradcheck");
  OtInputs in = {0};
  Rng rng;
  rng_seed(&rng, seed);
  IrValue *y = emit_case(f, c, 0, false, true, &in, &rng, err, errlen);
  if (y && (c->flags & OC_GRAD_SOFTMAX)) {
    IrAttr a = ir_attr_int("axis", -1);
    y = ir_emit(f, IR_OP_SOFTMAX, &y, 1, &a, 1, NULL, noloc);
  }
  bool ok = y != NULL;
  if (y && !ir_dtype_is_float(y->type.dtype)) { /* nothing to differentiate */
    ot_inputs_free(&in);
    ir_func_free(f);
    return true;
  }
  IrValue *L = NULL;
  if (ok) {
    IrValue *R = ir_func_add_arg(f, "R", y->type, IR_ARG_INPUT, false);
    fill(add_slot(&in, ir_numel(&y->type.shape)), &(Operand){.t = y->type}, &rng);
    L = ir_reduce(f, IR_OP_SUM, ir_binary(f, IR_OP_MUL, y, R, noloc), NULL, 0, false, noloc);
    IrAttr a = ir_attr_str("name", "L");
    ir_emit(f, IR_OP_LOSS, &L, 1, &a, 1, NULL, noloc);
  }
  int nfwd = f->nops;
  if (ok) {
    Arena scratch;
    arena_init(&scratch);
    PassOptions o = {.gas = 1};
    pass_autodiff(f, &o, &scratch);
    arena_free(&scratch);
    ok = ir_verify(f, err, errlen) && no_dead_backward(f, nfwd, err, errlen);
  }
  InterpState st = {0};
  if (ok && (ok = eval(f, &in, &st, err, errlen))) {
    for (int i = 0; ok && i < f->nargs; i++) {
      if (f->args[i]->role != IR_ARG_PARAM) continue;
      ok = check_param(f, &in, i, L, &st, err, errlen);
      ++*checked;
    }
  }
  interp_free(&st);
  ot_inputs_free(&in);
  ir_func_free(f);
  return ok;
}
