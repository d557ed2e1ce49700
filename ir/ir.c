/* ir.c - functions, values, attributes, types, and whole-function edits. */
#include <stdlib.h>
#include <string.h>

#include "ir.h"

/* The flags column of ops.def names IR_OPF_* without the prefix. */
enum {
  UNARY = IR_OPF_UNARY,
  BINARY = IR_OPF_BINARY,
  COMPARE = IR_OPF_COMPARE,
  FOLD = IR_OPF_FOLD,
  HINT = IR_OPF_HINT,
  POINT = IR_OPF_POINT,
  ROW = IR_OPF_ROW,
  RED = IR_OPF_RED,
  EXEC = IR_OPF_EXEC,
  VIEW = IR_OPF_VIEW,
  START = IR_OPF_START,
  WAIT = IR_OPF_WAIT,
  RANKCOPY = IR_OPF_RANKCOPY,
  OPAQUE = IR_OPF_OPAQUE,
  COSTLY = IR_OPF_COSTLY,
};

const IrOpInfo ir_op_info[IR_OP_COUNT] = {
#define OP(id, name, arity, kind, family, shape, grad, flags) \
  [IR_OP_##id] = {name, arity, IR_KIND_##kind, (unsigned)(flags) | 1u << IR_KIND_##kind, IR_FAMILY_##family},
#include "ops.def"
#undef OP
};

/* One entry per row, in order: the table above has no gap. */
static const unsigned char rows[] = {
#define OP(id, name, arity, kind, family, shape, grad, flags) 0,
#include "ops.def"
#undef OP
};
_Static_assert(sizeof rows == IR_OP_COUNT, "ops.def: one row per opcode");
_Static_assert(IR_KIND_OUTPUT + 1 == IR_KIND_COUNT, "IR_KIND_COUNT: one flag bit per kind");
_Static_assert(IR_OPF_NFLAGS <= 31, "IrOpFlag: the flags fit an int");

bool ir_op_is(IrOpcode opc, unsigned flags) { return (ir_op_info[opc].flags & flags) != 0; }

bool ir_attr_known(const char *key) {
#define KEY(k) #k,
  static const char *const keys[] = {IR_ATTR_KEYS(KEY)};
#undef KEY
  for (size_t i = 0; i < sizeof keys / sizeof *keys; i++)
    if (strcmp(keys[i], key) == 0) return true;
  return false;
}

bool ir_opcode_parse(const char *s, size_t n, IrOpcode *out) {
  for (int i = 0; i < IR_OP_COUNT; i++) {
    const char *name = ir_op_info[i].name;
    if (strlen(name) == n && memcmp(name, s, n) == 0) {
      *out = (IrOpcode)i;
      return true;
    }
  }
  return false;
}

/* ---- types ---- */

static const char *const dtype_names[IR_DT_COUNT] = {"f32", "f64", "bf16", "f16", "i32", "bool"};

const char *ir_dtype_name(IrDType dt) { return dtype_names[dt]; }

bool ir_dtype_parse(const char *s, size_t n, IrDType *out) {
  for (int i = 0; i < IR_DT_COUNT; i++)
    if (strlen(dtype_names[i]) == n && memcmp(dtype_names[i], s, n) == 0) {
      *out = (IrDType)i;
      return true;
    }
  return false;
}

bool ir_dtype_is_float(IrDType dt) {
  switch (dt) {
  case IR_DT_F32:
  case IR_DT_F64:
  case IR_DT_BF16:
  case IR_DT_F16: return true;
  case IR_DT_I32:
  case IR_DT_BOOL: return false;
  }
  return false;
}

size_t ir_dtype_size(IrDType dt) {
  switch (dt) {
  case IR_DT_F32: return 4;
  case IR_DT_F64: return 8;
  case IR_DT_BF16: return 2;
  case IR_DT_F16: return 2;
  case IR_DT_I32: return 4;
  case IR_DT_BOOL: return 1;
  }
  return 0;
}

int64_t ir_numel(const IrShape *s) {
  int64_t n = 1;
  for (int i = 0; i < s->rank; i++) n *= s->dim[i];
  return n;
}

bool ir_shape_eq(const IrShape *a, const IrShape *b) {
  if (a->rank != b->rank) return false;
  for (int i = 0; i < a->rank; i++)
    if (a->dim[i] != b->dim[i]) return false;
  return true;
}

bool ir_type_eq(const IrType *a, const IrType *b) { return a->dtype == b->dtype && ir_shape_eq(&a->shape, &b->shape); }

IrShape ir_shape_make(int rank, const int64_t *dims) {
  IrShape s;
  memset(&s, 0, sizeof s);
  GRADC_ASSERT(rank >= 0 && rank <= IR_MAX_RANK);
  s.rank = rank;
  for (int i = 0; i < rank; i++) s.dim[i] = dims[i];
  return s;
}

IrShape ir_shape_scalar(void) {
  IrShape s;
  memset(&s, 0, sizeof s);
  return s;
}

char *ir_type_str(const IrType *t, char *buf, size_t n) {
  size_t k = (size_t)snprintf(buf, n, "%s", ir_dtype_name(t->dtype));
  if (t->shape.rank > 0) {
    for (int i = 0; i < t->shape.rank && k < n; i++)
      k += (size_t)snprintf(buf + k, n - k, "%c%lld", i ? ',' : '[', (long long)t->shape.dim[i]);
    if (k < n) snprintf(buf + k, n - k, "]");
  }
  return buf;
}

/* ---- attributes ---- */

IrAttr ir_attr_int(const char *key, int64_t v) { return (IrAttr){.key = key, .kind = IR_ATTR_INT, .i = v}; }
IrAttr ir_attr_float(const char *key, double v) { return (IrAttr){.key = key, .kind = IR_ATTR_FLOAT, .f = v}; }
IrAttr ir_attr_bool(const char *key, bool v) { return (IrAttr){.key = key, .kind = IR_ATTR_BOOL, .i = v}; }
IrAttr ir_attr_str(const char *key, const char *s) { return (IrAttr){.key = key, .kind = IR_ATTR_STR, .s = s}; }
IrAttr ir_attr_ints(const char *key, const int64_t *v, int n) {
  return (IrAttr){.key = key, .kind = IR_ATTR_INTS, .ints = v, .n = n};
}

const IrAttr *ir_attr_get(const IrOp *op, const char *key) {
  for (int i = 0; i < op->nattrs; i++)
    if (strcmp(op->attrs[i].key, key) == 0) return &op->attrs[i];
  return NULL;
}

int64_t ir_attr_get_int(const IrOp *op, const char *key, int64_t def) {
  const IrAttr *a = ir_attr_get(op, key);
  return a && (a->kind == IR_ATTR_INT || a->kind == IR_ATTR_BOOL) ? a->i : def;
}

double ir_attr_get_float(const IrOp *op, const char *key, double def) {
  const IrAttr *a = ir_attr_get(op, key);
  if (!a) return def;
  if (a->kind == IR_ATTR_FLOAT) return a->f;
  if (a->kind == IR_ATTR_INT) return (double)a->i;
  return def;
}

const char *ir_attr_get_str(const IrOp *op, const char *key, const char *def) {
  const IrAttr *a = ir_attr_get(op, key);
  return a && a->kind == IR_ATTR_STR ? a->s : def;
}

int ir_attr_get_ints(const IrOp *op, const char *key, const int64_t **out) {
  const IrAttr *a = ir_attr_get(op, key);
  if (!a || a->kind != IR_ATTR_INTS) {
    *out = NULL;
    return 0;
  }
  *out = a->ints;
  return a->n;
}

double ir_op_eps(const IrOp *op) {
  GRADC_ASSERT(ir_op_info[op->opcode].family == IR_FAMILY_NORM && ir_attr_get(op, "eps"));
  return ir_attr_get_float(op, "eps", 0);
}

/* ---- functions ---- */

IrFunc *ir_func_new(const char *name) {
  IrFunc *f = calloc(1, sizeof *f);
  if (!f) abort();
  arena_init(&f->arena);
  f->name = arena_strdup(&f->arena, name);
  return f;
}

void ir_func_free(IrFunc *f) {
  if (!f) return;
  free(f->args);
  free(f->ops);
  free(f->values);
  arena_free(&f->arena);
  free(f);
}

#define PUSH(arr, n, cap, x)                                                                                 \
  do {                                                                                                       \
    if ((n) == (cap)) {                                                                                      \
      (cap) = (cap) ? (cap) * 2 : 64;                                                                        \
      void *p_ = realloc((arr), sizeof(*(arr)) * (size_t)(cap));                                             \
      if (!p_) abort();                                                                                      \
      (arr) = p_;                                                                                            \
    }                                                                                                        \
    (arr)[(n)++] = (x);                                                                                      \
  } while (0)

IrValue *ir_func_new_value(IrFunc *f, IrType t, const char *name);
IrValue *ir_func_new_value(IrFunc *f, IrType t, const char *name) {
  IrValue *v = ARENA_NEW(&f->arena, IrValue);
  v->id = f->nvalues;
  v->type = t;
  v->name = name ? arena_strdup(&f->arena, name) : NULL;
  PUSH(f->values, f->nvalues, f->capvalues, v);
  return v;
}

void ir_func_append_op(IrFunc *f, IrOp *op);
void ir_func_append_op(IrFunc *f, IrOp *op) { PUSH(f->ops, f->nops, f->capops, op); }

IrValue *ir_func_add_arg(IrFunc *f, const char *name, IrType type, IrArgRole role, bool batched) {
  IrValue *v = ir_func_new_value(f, type, name);
  v->role = role;
  v->batched = batched;
  v->split_axis = -1;
  PUSH(f->args, f->nargs, f->capargs, v);
  return v;
}

IrValue *ir_func_find_arg(const IrFunc *f, const char *name) {
  for (int i = 0; i < f->nargs; i++)
    if (f->args[i]->name && strcmp(f->args[i]->name, name) == 0) return f->args[i];
  return NULL;
}

void ir_func_remove_marked(IrFunc *f) {
  int k = 0;
  for (int i = 0; i < f->nops; i++)
    if (!f->ops[i]->mark) f->ops[k++] = f->ops[i];
  f->nops = k;
}

void ir_replace_uses(IrFunc *f, IrValue *from, IrValue *to) {
  for (int i = 0; i < f->nops; i++) {
    IrOp *op = f->ops[i];
    for (int j = 0; j < op->nargs; j++)
      if (op->args[j] == from) op->args[j] = to;
  }
}

void ir_count_uses(const IrFunc *f, int *out) {
  memset(out, 0, sizeof(int) * (size_t)f->nvalues);
  for (int i = 0; i < f->nops; i++)
    for (int j = 0; j < f->ops[i]->nargs; j++) out[f->ops[i]->args[j]->id]++;
}

/* Depth-first post-order from each op in list order: an op is placed once
 * all its operands' definitions are placed.  Already-valid orders are kept. */
bool ir_func_topo_sort(IrFunc *f) {
  int n = f->nops;
  IrOp **out = malloc(sizeof(IrOp *) * (size_t)(n ? n : 1));
  IrOp **stack = malloc(sizeof(IrOp *) * (size_t)(n ? n : 1));
  int *argi = malloc(sizeof(int) * (size_t)(n ? n : 1));
  if (!out || !stack || !argi) abort();
  /* mark: 0 = not placed, 1 = on stack, 2 = placed */
  for (int i = 0; i < n; i++) f->ops[i]->mark = 0;
  /* Values defined by ops outside this list (stale) are treated as placed. */
  int k = 0;
  bool ok = true;
  for (int i = 0; i < n && ok; i++) {
    if (f->ops[i]->mark) continue;
    int sp = 0;
    stack[sp] = f->ops[i];
    argi[sp++] = 0;
    f->ops[i]->mark = 1;
    while (sp > 0) {
      IrOp *op = stack[sp - 1];
      if (argi[sp - 1] < op->nargs) {
        IrValue *a = op->args[argi[sp - 1]++];
        IrOp *d = a->def;
        if (!d || d->mark == 2) continue;
        if (d->mark == 1) {
          ok = false;
          break;
        }
        d->mark = 1;
        stack[sp] = d;
        argi[sp++] = 0;
      } else {
        op->mark = 2;
        out[k++] = op;
        sp--;
      }
    }
  }
  if (ok) {
    GRADC_ASSERT(k == n);
    memcpy(f->ops, out, sizeof(IrOp *) * (size_t)n);
  }
  for (int i = 0; i < n; i++) f->ops[i]->mark = 0;
  free(out);
  free(stack);
  free(argi);
  return ok;
}
