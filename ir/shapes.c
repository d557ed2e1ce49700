/* shapes.c - shape rules: one ir_shape_<rule> per name in the `shape`
 * column of ops.def, dispatched through a table generated from it.
 *
 * A rule checks an op's operands and attributes and computes its result
 * type (PyTorch semantics, DESIGN.md §2).  Errors name the op and the
 * concrete types involved ("cannot broadcast f32[10,6] and f32[10,5]").
 * Rules never trust their input: they are run by the builder, the reader
 * (on arbitrary text) and the verifier (on IR mutated by passes). */
#include <string.h>

#include "ir.h"

/* Largest dimension accepted anywhere (the reader uses the same bound). */
#define MAX_DIM ((int64_t)1 << 40)
/* Largest element count of one tensor. */
#define MAX_NUMEL ((int64_t)1 << 62)

/* ------------------------------------------------------------------ */
/* Helpers                                                             */
/* ------------------------------------------------------------------ */

/* A type as text, usable inline in a printf argument list: ts(t).s */
typedef struct TypeText {
  char s[IR_TYPE_STR_MAX];
} TypeText;

static TypeText ts(const IrType *t) {
  TypeText r;
  ir_type_str(t, r.s, sizeof r.s);
  return r;
}

/* "[2,3]" for a shape (batch dims in messages). */
static TypeText shape_text(const IrShape *s) {
  TypeText r;
  size_t k = 0;
  r.s[k++] = '[';
  r.s[k] = 0;
  for (int i = 0; i < s->rank && k < sizeof r.s; i++)
    k += (size_t)snprintf(r.s + k, sizeof r.s - k, "%s%lld", i ? "," : "", (long long)s->dim[i]);
  if (k < sizeof r.s - 1) {
    r.s[k++] = ']';
    r.s[k] = 0;
  }
  return r;
}

static const char *opname(const IrOp *op) { return ir_op_info[op->opcode].name; }

static const IrType *arg(const IrOp *op, int i) { return &op->args[i]->type; }

/* Element count, or -1 if it would exceed MAX_NUMEL or a dim is negative. */
static int64_t checked_numel(const IrShape *s) {
  int64_t n = 1;
  bool zero = false, over = false;
  for (int i = 0; i < s->rank; i++) {
    int64_t d = s->dim[i];
    if (d < 0) return -1;
    if (d == 0)
      zero = true;
    else if (!over && n > MAX_NUMEL / d)
      over = true;
    else if (!over)
      n *= d;
  }
  return zero ? 0 : over ? -1 : n;
}

/* ---- attributes: fetch with a message naming the op when missing ---- */

static const IrAttr *need_attr(const IrOp *op, const char *key, IrAttrKind kind, const char *what, char *err,
                               size_t n) {
  const IrAttr *a = ir_attr_get(op, key);
  if (!a) {
    errf(err, n, "'%s' needs attribute '%s'", opname(op), key);
    return NULL;
  }
  if (a->kind != kind) {
    errf(err, n, "'%s' attribute '%s' must be %s", opname(op), key, what);
    return NULL;
  }
  return a;
}

static bool need_int(const IrOp *op, const char *key, int64_t *v, char *err, size_t n) {
  const IrAttr *a = need_attr(op, key, IR_ATTR_INT, "an integer", err, n);
  if (!a) return false;
  *v = a->i;
  return true;
}

static bool need_bool(const IrOp *op, const char *key, bool *v, char *err, size_t n) {
  const IrAttr *a = need_attr(op, key, IR_ATTR_BOOL, "true or false", err, n);
  if (!a) return false;
  *v = a->i != 0;
  return true;
}

/* A number: FLOAT, or INT (converted). */
static bool need_number(const IrOp *op, const char *key, double *v, char *err, size_t n) {
  const IrAttr *a = ir_attr_get(op, key);
  if (!a) return errf(err, n, "'%s' needs attribute '%s'", opname(op), key);
  if (a->kind == IR_ATTR_FLOAT)
    *v = a->f;
  else if (a->kind == IR_ATTR_INT)
    *v = (double)a->i;
  else
    return errf(err, n, "'%s' attribute '%s' must be a number", opname(op), key);
  return true;
}

static bool need_str(const IrOp *op, const char *key, const char **v, char *err, size_t n) {
  const IrAttr *a = need_attr(op, key, IR_ATTR_STR, "a string", err, n);
  if (!a) return false;
  *v = a->s ? a->s : "";
  return true;
}

/* *v and *len are set on failure too (empty), so that no caller reads them
 * unset: -O3 cannot see that callers return on false. */
static bool need_ints(const IrOp *op, const char *key, const int64_t **v, int *len, char *err, size_t n) {
  *v = NULL;
  *len = 0;
  const IrAttr *a = need_attr(op, key, IR_ATTR_INTS, "a list of integers", err, n);
  if (!a) return false;
  if (a->n < 0 || (a->n > 0 && !a->ints)) return errf(err, n, "'%s' attribute '%s' is malformed", opname(op), key);
  *v = a->ints;
  *len = a->n;
  return true;
}

/* A shape given as an INTS attribute (reshape, broadcast, unslice). */
static bool need_shape(const IrOp *op, const char *key, IrShape *s, char *err, size_t n) {
  const int64_t *v;
  int len;
  if (!need_ints(op, key, &v, &len, err, n)) return false;
  if (len > IR_MAX_RANK)
    return errf(err, n, "'%s' attribute '%s' has rank %d, more than %d", opname(op), key, len, IR_MAX_RANK);
  memset(s, 0, sizeof *s);
  s->rank = len;
  for (int i = 0; i < len; i++) {
    if (v[i] < 0 || v[i] >= MAX_DIM)
      return errf(err, n, "'%s' attribute '%s' has invalid dimension %lld", opname(op), key, (long long)v[i]);
    s->dim[i] = v[i];
  }
  if (checked_numel(s) < 0) return errf(err, n, "'%s' attribute '%s' is too large", opname(op), key);
  return true;
}

/* Reduction kind of a loss: "mean", "sum" or "none"; sets *none. */
static bool need_reduction(const IrOp *op, bool *none, char *err, size_t n) {
  const char *r;
  if (!need_str(op, "reduction", &r, err, n)) return false;
  if (strcmp(r, "none") == 0)
    *none = true;
  else if (strcmp(r, "mean") == 0 || strcmp(r, "sum") == 0)
    *none = false;
  else
    return errf(err, n, "'%s' reduction must be \"mean\", \"sum\" or \"none\", got \"%s\"", opname(op), r);
  return true;
}

static bool need_float_operand(const IrOp *op, int i, char *err, size_t n) {
  if (!ir_dtype_is_float(arg(op, i)->dtype))
    return errf(err, n, "'%s' needs a floating-point operand, got %s", opname(op), ts(arg(op, i)).s);
  return true;
}

static bool need_dtype(const IrOp *op, int i, IrDType dt, char *err, size_t n) {
  if (arg(op, i)->dtype != dt)
    return errf(err, n, "'%s' operand %d must be %s, got %s", opname(op), i + 1, ir_dtype_name(dt), ts(arg(op, i)).s);
  return true;
}

static bool need_scalar(const IrOp *op, int i, char *err, size_t n) {
  if (arg(op, i)->shape.rank != 0)
    return errf(err, n, "'%s' operand %d must be a scalar, got %s", opname(op), i + 1, ts(arg(op, i)).s);
  return true;
}

static bool need_same_type(const IrOp *op, int i, int j, char *err, size_t n) {
  if (!ir_type_eq(arg(op, i), arg(op, j)))
    return errf(err, n, "'%s': mismatched types %s and %s", opname(op), ts(arg(op, i)).s, ts(arg(op, j)).s);
  return true;
}

static bool need_same_dtype(const IrOp *op, int i, int j, char *err, size_t n) {
  if (arg(op, i)->dtype != arg(op, j)->dtype)
    return errf(err, n, "'%s': mismatched types %s and %s", opname(op), ts(arg(op, i)).s, ts(arg(op, j)).s);
  return true;
}

static bool need_hint(const IrOp *op, const IrType *hint, char *err, size_t n) {
  if (!hint) return errf(err, n, "'%s' needs a result type", opname(op));
  if (hint->shape.rank < 0 || hint->shape.rank > IR_MAX_RANK)
    return errf(err, n, "'%s': invalid result rank %d", opname(op), hint->shape.rank);
  if ((unsigned)hint->dtype >= IR_DT_COUNT) return errf(err, n, "'%s': invalid result dtype", opname(op));
  for (int i = 0; i < hint->shape.rank; i++)
    if (hint->shape.dim[i] < 0 || hint->shape.dim[i] >= MAX_DIM)
      return errf(err, n, "'%s': invalid result dimension %lld", opname(op), (long long)hint->shape.dim[i]);
  return true;
}

/* ------------------------------------------------------------------ */
/* Exported helpers                                                    */
/* ------------------------------------------------------------------ */

bool ir_broadcast_shapes(const IrShape *a, const IrShape *b, IrShape *out) {
  IrShape r;
  memset(&r, 0, sizeof r);
  r.rank = a->rank > b->rank ? a->rank : b->rank;
  for (int i = 0; i < r.rank; i++) {
    /* Right-aligned: i counts from the last axis. */
    int ia = a->rank - 1 - i, ib = b->rank - 1 - i;
    int64_t da = ia >= 0 ? a->dim[ia] : 1, db = ib >= 0 ? b->dim[ib] : 1;
    int64_t d;
    if (da == db || db == 1)
      d = da;
    else if (da == 1)
      d = db;
    else
      return false;
    r.dim[r.rank - 1 - i] = d;
  }
  *out = r;
  return true;
}

bool ir_norm_axis(int64_t axis, int rank, int64_t *out) {
  if (axis < -(int64_t)rank || axis >= rank) return false;
  *out = axis < 0 ? axis + rank : axis;
  return true;
}

/* An axis attribute (key) normalised for rank. */
static bool need_axis(const IrOp *op, const char *key, int rank, int64_t *axis, char *err, size_t n) {
  int64_t a;
  *axis = 0; /* set on every path, so no caller reads it uninitialised */
  if (!need_int(op, key, &a, err, n)) return false;
  if (!ir_norm_axis(a, rank, axis))
    return errf(err, n, "'%s': axis %lld is out of range for %s", opname(op), (long long)a, ts(arg(op, 0)).s);
  return true;
}

/* ------------------------------------------------------------------ */
/* Rules, in the order of ops.def                                      */
/* ------------------------------------------------------------------ */

/* Elementwise on one operand: float, or i32 for neg/abs/sign.  detach is
 * the identity (any dtype); causal_mask needs rank >= 2; pow an exponent;
 * clamp's min= and max= are numbers when present. */
static bool ir_shape_unary(const IrOp *op, const IrType *hint, IrType *out, char *err, size_t n) {
  const IrType *x = arg(op, 0);
  if (op->opcode == IR_OP_NEG || op->opcode == IR_OP_ABS || op->opcode == IR_OP_SIGN) {
    if (!ir_dtype_is_float(x->dtype) && x->dtype != IR_DT_I32)
      return errf(err, n, "'%s' needs a floating-point or i32 operand, got %s", opname(op), ts(x).s);
  } else if (op->opcode == IR_OP_DETACH) {
    /* the identity: any dtype */
  } else {
    if (!need_float_operand(op, 0, err, n)) return false;
    if (op->opcode == IR_OP_CAUSAL_MASK && x->shape.rank < 2)
      return errf(err, n, "'%s' needs an operand of rank >= 2, got %s", opname(op), ts(x).s);
    double e;
    if (op->opcode == IR_OP_POW && !need_number(op, "exponent", &e, err, n)) return false;
    /* clamp: min= and max= are optional numbers */
    if (op->opcode == IR_OP_CLAMP && ((ir_attr_get(op, "min") && !need_number(op, "min", &e, err, n)) ||
                                      (ir_attr_get(op, "max") && !need_number(op, "max", &e, err, n))))
      return false;
  }
  *out = *x;
  return true;
}

/* cast: the result type is the hint; only the dtype may change. */
static bool ir_shape_cast(const IrOp *op, const IrType *hint, IrType *out, char *err, size_t n) {
  if (!need_hint(op, hint, err, n)) return false;
  if (!ir_shape_eq(&hint->shape, &arg(op, 0)->shape))
    return errf(err, n, "'cast' cannot change the shape: %s to %s", ts(arg(op, 0)).s, ts(hint).s);
  *out = *hint;
  return true;
}

/* Two operands of one dtype (float or i32), NumPy broadcasting. */
static bool broadcast2(const IrOp *op, IrShape *s, char *err, size_t n) {
  if (!ir_broadcast_shapes(&arg(op, 0)->shape, &arg(op, 1)->shape, s))
    return errf(err, n, "'%s': cannot broadcast %s and %s", opname(op), ts(arg(op, 0)).s, ts(arg(op, 1)).s);
  return true;
}

static bool ir_shape_binary(const IrOp *op, const IrType *hint, IrType *out, char *err, size_t n) {
  if (!need_same_dtype(op, 0, 1, err, n)) return false;
  IrDType dt = arg(op, 0)->dtype;
  if (!ir_dtype_is_float(dt) && dt != IR_DT_I32)
    return errf(err, n, "'%s' needs floating-point or i32 operands, got %s and %s", opname(op), ts(arg(op, 0)).s,
                ts(arg(op, 1)).s);
  if (!broadcast2(op, &out->shape, err, n)) return false;
  out->dtype = dt;
  return true;
}

static bool ir_shape_compare(const IrOp *op, const IrType *hint, IrType *out, char *err, size_t n) {
  if (!need_same_dtype(op, 0, 1, err, n)) return false;
  if (!broadcast2(op, &out->shape, err, n)) return false;
  out->dtype = IR_DT_BOOL;
  return true;
}

/* select(cond: bool, a, b): all three broadcast together. */
static bool ir_shape_select(const IrOp *op, const IrType *hint, IrType *out, char *err, size_t n) {
  if (!need_dtype(op, 0, IR_DT_BOOL, err, n)) return false;
  if (!need_same_dtype(op, 1, 2, err, n)) return false;
  IrShape s;
  if (!ir_broadcast_shapes(&arg(op, 1)->shape, &arg(op, 2)->shape, &s) ||
      !ir_broadcast_shapes(&arg(op, 0)->shape, &s, &s))
    return errf(err, n, "'select': cannot broadcast %s, %s and %s", ts(arg(op, 0)).s, ts(arg(op, 1)).s,
                ts(arg(op, 2)).s);
  out->dtype = arg(op, 1)->dtype;
  out->shape = s;
  return true;
}

/* const: no operands; the type is the hint, the value an attribute. */
static bool ir_shape_const(const IrOp *op, const IrType *hint, IrType *out, char *err, size_t n) {
  double v;
  if (!need_hint(op, hint, err, n)) return false;
  if (!need_number(op, "value", &v, err, n)) return false;
  *out = *hint;
  return true;
}

/* sum/mean/max/logsumexp over axes=[..] (empty: all axes), keepdim. */
static bool ir_shape_reduce(const IrOp *op, const IrType *hint, IrType *out, char *err, size_t n) {
  const IrType *x = arg(op, 0);
  const int64_t *axes;
  int naxes;
  bool keepdim;
  if (!need_ints(op, "axes", &axes, &naxes, err, n)) return false;
  if (!need_bool(op, "keepdim", &keepdim, err, n)) return false;
  if (!ir_dtype_is_float(x->dtype) && !(op->opcode == IR_OP_SUM && x->dtype == IR_DT_I32))
    return errf(err, n, "'%s' needs a floating-point%s operand, got %s", opname(op),
                op->opcode == IR_OP_SUM ? " or i32" : "", ts(x).s);
  bool reduced[IR_MAX_RANK] = {false};
  if (naxes == 0)
    for (int i = 0; i < x->shape.rank; i++) reduced[i] = true;
  for (int i = 0; i < naxes; i++) {
    int64_t a;
    if (!ir_norm_axis(axes[i], x->shape.rank, &a))
      return errf(err, n, "'%s': axis %lld is out of range for %s", opname(op), (long long)axes[i], ts(x).s);
    if (reduced[a]) return errf(err, n, "'%s': axis %lld is repeated", opname(op), (long long)axes[i]);
    reduced[a] = true;
  }
  IrShape s;
  memset(&s, 0, sizeof s);
  for (int i = 0; i < x->shape.rank; i++) {
    if (!reduced[i])
      s.dim[s.rank++] = x->shape.dim[i];
    else if (keepdim)
      s.dim[s.rank++] = 1;
  }
  out->dtype = x->dtype;
  out->shape = s;
  return true;
}

static bool ir_shape_reshape(const IrOp *op, const IrType *hint, IrType *out, char *err, size_t n) {
  const IrType *x = arg(op, 0);
  IrShape s;
  if (!need_shape(op, "shape", &s, err, n)) return false;
  if (checked_numel(&s) != checked_numel(&x->shape)) {
    IrType t = {x->dtype, s};
    return errf(err, n, "'reshape': cannot reshape %s to %s (element counts differ)", ts(x).s, ts(&t).s);
  }
  out->dtype = x->dtype;
  out->shape = s;
  return true;
}

static bool ir_shape_permute(const IrOp *op, const IrType *hint, IrType *out, char *err, size_t n) {
  const IrType *x = arg(op, 0);
  const int64_t *perm;
  int len;
  if (!need_ints(op, "perm", &perm, &len, err, n)) return false;
  if (len != x->shape.rank)
    return errf(err, n, "'permute': perm has %d entries but the operand %s has rank %d", len, ts(x).s, x->shape.rank);
  bool seen[IR_MAX_RANK] = {false};
  IrShape s;
  memset(&s, 0, sizeof s);
  s.rank = len;
  for (int i = 0; i < len; i++) {
    if (perm[i] < 0 || perm[i] >= len || seen[perm[i]])
      return errf(err, n, "'permute': perm is not a permutation of 0..%d", len - 1);
    seen[perm[i]] = true;
    s.dim[i] = x->shape.dim[perm[i]];
  }
  out->dtype = x->dtype;
  out->shape = s;
  return true;
}

static bool ir_shape_broadcast(const IrOp *op, const IrType *hint, IrType *out, char *err, size_t n) {
  const IrType *x = arg(op, 0);
  IrType t = {x->dtype, {0, {0}}};
  if (!need_shape(op, "shape", &t.shape, err, n)) return false;
  bool ok = x->shape.rank <= t.shape.rank;
  for (int i = 0; ok && i < x->shape.rank; i++) {
    int64_t d = x->shape.dim[x->shape.rank - 1 - i];
    ok = d == 1 || d == t.shape.dim[t.shape.rank - 1 - i];
  }
  if (!ok) return errf(err, n, "'broadcast': cannot broadcast %s to %s", ts(x).s, ts(&t).s);
  *out = t;
  return true;
}

/* Basic slicing of `in` by starts/stops/steps (one range per axis). */
static bool slice_shape(const IrOp *op, const IrType *in, IrShape *res, char *err, size_t n) {
  const int64_t *st[3];
  int len[3];
  static const char *const keys[3] = {"starts", "stops", "steps"};
  for (int k = 0; k < 3; k++) {
    if (!need_ints(op, keys[k], &st[k], &len[k], err, n)) return false;
    if (len[k] != in->shape.rank)
      return errf(err, n, "'%s': '%s' has %d entries, but %s has rank %d", opname(op), keys[k], len[k], ts(in).s,
                  in->shape.rank);
  }
  memset(res, 0, sizeof *res);
  res->rank = in->shape.rank;
  for (int i = 0; i < in->shape.rank; i++) {
    int64_t a = st[0][i], b = st[1][i], c = st[2][i], d = in->shape.dim[i];
    if (c < 1) return errf(err, n, "'%s': step %lld on axis %d must be >= 1", opname(op), (long long)c, i);
    if (a < 0 || a > b || b > d)
      return errf(err, n, "'%s': range %lld:%lld on axis %d is out of bounds for %s", opname(op), (long long)a,
                  (long long)b, i, ts(in).s);
    res->dim[i] = (b - a) / c + ((b - a) % c != 0);
  }
  return true;
}

static bool ir_shape_slice(const IrOp *op, const IrType *hint, IrType *out, char *err, size_t n) {
  const IrType *x = arg(op, 0);
  if (!slice_shape(op, x, &out->shape, err, n)) return false;
  out->dtype = x->dtype;
  return true;
}

/* unslice: zeros of shape=[..] with the operand written at the slice. */
static bool ir_shape_unslice(const IrOp *op, const IrType *hint, IrType *out, char *err, size_t n) {
  const IrType *x = arg(op, 0);
  IrType full = {x->dtype, {0, {0}}};
  if (!need_shape(op, "shape", &full.shape, err, n)) return false;
  IrShape s;
  if (!slice_shape(op, &full, &s, err, n)) return false;
  if (!ir_shape_eq(&s, &x->shape)) {
    IrType t = {x->dtype, s};
    return errf(err, n, "'unslice': the slice of %s is %s, but the operand is %s", ts(&full).s, ts(&t).s, ts(x).s);
  }
  *out = full;
  return true;
}

static bool ir_shape_concat(const IrOp *op, const IrType *hint, IrType *out, char *err, size_t n) {
  const IrType *x = arg(op, 0);
  if (x->shape.rank == 0) return errf(err, n, "'concat' cannot join scalars (%s)", ts(x).s);
  int64_t axis;
  if (!need_axis(op, "axis", x->shape.rank, &axis, err, n)) return false;
  IrType t = *x;
  for (int i = 1; i < op->nargs; i++) {
    const IrType *y = arg(op, i);
    bool ok = y->dtype == x->dtype && y->shape.rank == x->shape.rank;
    for (int k = 0; ok && k < x->shape.rank; k++) ok = k == axis || y->shape.dim[k] == x->shape.dim[k];
    if (!ok) return errf(err, n, "'concat': cannot join %s and %s along axis %lld", ts(x).s, ts(y).s, (long long)axis);
    t.shape.dim[axis] += y->shape.dim[axis];
    if (t.shape.dim[axis] >= MAX_DIM) return errf(err, n, "'concat': result is too large");
  }
  *out = t;
  return true;
}

/* torch.matmul: 1-D operands get a dimension prepended (a) or appended (b)
 * that is removed from the result; batch dimensions broadcast. */
static bool ir_shape_matmul(const IrOp *op, const IrType *hint, IrType *out, char *err, size_t n) {
  const IrType *a = arg(op, 0), *b = arg(op, 1);
  if (a->dtype != b->dtype || !ir_dtype_is_float(a->dtype))
    return errf(err, n, "%s @ %s: mismatched or non-floating-point types", ts(a).s, ts(b).s);
  int ra = a->shape.rank, rb = b->shape.rank;
  if (ra == 0 || rb == 0) return errf(err, n, "%s @ %s: matmul needs operands of rank >= 1", ts(a).s, ts(b).s);
  int64_t m = ra >= 2 ? a->shape.dim[ra - 2] : 1, k = a->shape.dim[ra - 1];
  int64_t k2 = rb >= 2 ? b->shape.dim[rb - 2] : b->shape.dim[0], nn = rb >= 2 ? b->shape.dim[rb - 1] : 1;
  if (k != k2)
    return errf(err, n, "%s @ %s: inner dimensions %lld and %lld differ", ts(a).s, ts(b).s, (long long)k,
                (long long)k2);
  IrShape ba = ir_shape_scalar(), bb = ir_shape_scalar(), batch;
  if (ra > 2) ba = ir_shape_make(ra - 2, a->shape.dim);
  if (rb > 2) bb = ir_shape_make(rb - 2, b->shape.dim);
  if (!ir_broadcast_shapes(&ba, &bb, &batch))
    return errf(err, n, "%s @ %s: batch dimensions %s and %s do not broadcast", ts(a).s, ts(b).s, shape_text(&ba).s,
                shape_text(&bb).s);
  IrShape s = batch;
  if (ra >= 2) s.dim[s.rank++] = m;
  if (rb >= 2) s.dim[s.rank++] = nn;
  out->dtype = a->dtype;
  out->shape = s;
  return true;
}

/* softmax/log_softmax along axis=N. */
static bool ir_shape_softmax(const IrOp *op, const IrType *hint, IrType *out, char *err, size_t n) {
  const IrType *x = arg(op, 0);
  if (!need_float_operand(op, 0, err, n)) return false;
  if (x->shape.rank == 0) return errf(err, n, "'%s' needs an operand of rank >= 1, got %s", opname(op), ts(x).s);
  int64_t axis;
  if (!need_axis(op, "axis", x->shape.rank, &axis, err, n)) return false;
  *out = *x;
  return true;
}

/* x [..., C] normalised over the last axis; operands 1.. are [C] of x's dtype. */
static bool norm_common(const IrOp *op, IrType *out, char *err, size_t n) {
  const IrType *x = arg(op, 0);
  double eps;
  if (!need_float_operand(op, 0, err, n)) return false;
  if (x->shape.rank == 0) return errf(err, n, "'%s' needs an operand of rank >= 1, got %s", opname(op), ts(x).s);
  IrType w = {x->dtype, ir_shape_make(1, &x->shape.dim[x->shape.rank - 1])};
  for (int i = 1; i < op->nargs; i++)
    if (!ir_type_eq(arg(op, i), &w))
      return errf(err, n, "'%s': operand %d of %s must be %s, got %s", opname(op), i + 1, ts(x).s, ts(&w).s,
                  ts(arg(op, i)).s);
  if (!need_number(op, "eps", &eps, err, n)) return false;
  *out = *x;
  return true;
}

static bool ir_shape_layer_norm(const IrOp *op, const IrType *hint, IrType *out, char *err, size_t n) {
  return norm_common(op, out, err, n);
}

static bool ir_shape_rms_norm(const IrOp *op, const IrType *hint, IrType *out, char *err, size_t n) {
  return norm_common(op, out, err, n);
}

/* embedding(idx i32[...], table [V, D]) -> [..., D]. */
static bool ir_shape_embedding(const IrOp *op, const IrType *hint, IrType *out, char *err, size_t n) {
  const IrType *idx = arg(op, 0), *tab = arg(op, 1);
  if (!need_dtype(op, 0, IR_DT_I32, err, n)) return false;
  if (!ir_dtype_is_float(tab->dtype) || tab->shape.rank != 2)
    return errf(err, n, "'embedding': the table must be a floating-point matrix, got %s", ts(tab).s);
  if (idx->shape.rank >= IR_MAX_RANK) return errf(err, n, "'embedding': indices %s have too many axes", ts(idx).s);
  *out = *idx;
  out->dtype = tab->dtype;
  out->shape.dim[out->shape.rank++] = tab->shape.dim[1];
  return true;
}

/* embedding_grad(idx i32[...], dy [..., D]) rows=V -> [V, D] (scatter-add). */
static bool ir_shape_embedding_grad(const IrOp *op, const IrType *hint, IrType *out, char *err, size_t n) {
  const IrType *idx = arg(op, 0), *dy = arg(op, 1);
  int64_t rows;
  if (!need_dtype(op, 0, IR_DT_I32, err, n)) return false;
  if (!need_float_operand(op, 1, err, n)) return false;
  bool ok = dy->shape.rank == idx->shape.rank + 1;
  for (int i = 0; ok && i < idx->shape.rank; i++) ok = dy->shape.dim[i] == idx->shape.dim[i];
  if (!ok) return errf(err, n, "'embedding_grad': gradient %s does not match indices %s", ts(dy).s, ts(idx).s);
  if (!need_int(op, "rows", &rows, err, n)) return false;
  if (rows < 0 || rows >= MAX_DIM) return errf(err, n, "'embedding_grad': invalid rows %lld", (long long)rows);
  int64_t dims[2] = {rows, dy->shape.dim[dy->shape.rank - 1]};
  out->dtype = dy->dtype;
  out->shape = ir_shape_make(2, dims);
  return true;
}

/* cross_entropy(logits [..., V], target i32[...]). */
static bool ir_shape_cross_entropy(const IrOp *op, const IrType *hint, IrType *out, char *err, size_t n) {
  const IrType *lg = arg(op, 0), *tg = arg(op, 1);
  int64_t ignore;
  bool none;
  if (!need_float_operand(op, 0, err, n)) return false;
  if (!need_dtype(op, 1, IR_DT_I32, err, n)) return false;
  bool ok = lg->shape.rank >= 1 && tg->shape.rank == lg->shape.rank - 1;
  for (int i = 0; ok && i < tg->shape.rank; i++) ok = tg->shape.dim[i] == lg->shape.dim[i];
  if (!ok) return errf(err, n, "'cross_entropy': target %s does not match logits %s", ts(tg).s, ts(lg).s);
  if (!need_int(op, "ignore_index", &ignore, err, n)) return false;
  if (!need_reduction(op, &none, err, n)) return false;
  out->dtype = lg->dtype;
  out->shape = none ? tg->shape : ir_shape_scalar();
  return true;
}

/* one_hot(target i32[...]) depth=N -> [..., N] of the hint's float dtype. */
static bool ir_shape_one_hot(const IrOp *op, const IrType *hint, IrType *out, char *err, size_t n) {
  const IrType *tg = arg(op, 0);
  int64_t depth, ignore;
  if (!need_dtype(op, 0, IR_DT_I32, err, n)) return false;
  if (!need_int(op, "depth", &depth, err, n)) return false;
  if (!need_int(op, "ignore_index", &ignore, err, n)) return false;
  if (depth < 0 || depth >= MAX_DIM) return errf(err, n, "'one_hot': invalid depth %lld", (long long)depth);
  if (!need_hint(op, hint, err, n)) return false;
  if (!ir_dtype_is_float(hint->dtype))
    return errf(err, n, "'one_hot' needs a floating-point result type, got %s", ts(hint).s);
  if (tg->shape.rank >= IR_MAX_RANK) return errf(err, n, "'one_hot': target %s has too many axes", ts(tg).s);
  out->dtype = hint->dtype;
  out->shape = tg->shape;
  out->shape.dim[out->shape.rank++] = depth;
  return true;
}

static bool ir_shape_mse_loss(const IrOp *op, const IrType *hint, IrType *out, char *err, size_t n) {
  bool none;
  if (!need_same_type(op, 0, 1, err, n)) return false;
  if (!need_float_operand(op, 0, err, n)) return false;
  if (!need_reduction(op, &none, err, n)) return false;
  out->dtype = arg(op, 0)->dtype;
  out->shape = none ? arg(op, 0)->shape : ir_shape_scalar();
  return true;
}

/* ---- language v2: constructors and selection ---- */

/* arange: the hint, rank 1, a number dtype. */
static bool ir_shape_arange(const IrOp *op, const IrType *hint, IrType *out, char *err, size_t n) {
  if (!need_hint(op, hint, err, n)) return false;
  if (hint->shape.rank != 1 || hint->dtype == IR_DT_BOOL)
    return errf(err, n, "'arange' needs a rank-1 numeric result type, got %s", ts(hint).s);
  *out = *hint;
  return true;
}

/* An index operand of x's rank whose dims equal x's except along axis. */
static bool index_like(const IrOp *op, const IrType *x, const IrType *idx, int64_t axis, const char *what, char *err,
                       size_t n) {
  if (idx->dtype != IR_DT_I32)
    return errf(err, n, "'%s': the index must be i32, got %s", opname(op), ts(idx).s);
  bool ok = idx->shape.rank == x->shape.rank;
  for (int i = 0; ok && i < x->shape.rank; i++) ok = i == axis || idx->shape.dim[i] == x->shape.dim[i];
  if (!ok)
    return errf(err, n, "'%s': index %s must have the dims of %s %s except along axis %lld", opname(op), ts(idx).s,
                what, ts(x).s, (long long)axis);
  return true;
}

/* gather(x, idx i32) axis=a -> idx's shape, x's dtype. */
static bool ir_shape_gather(const IrOp *op, const IrType *hint, IrType *out, char *err, size_t n) {
  const IrType *x = arg(op, 0), *idx = arg(op, 1);
  int64_t axis;
  if (x->shape.rank < 1) return errf(err, n, "'gather' needs an operand of rank >= 1, got %s", ts(x).s);
  if (!need_axis(op, "axis", x->shape.rank, &axis, err, n)) return false;
  if (!index_like(op, x, idx, axis, "the operand", err, n)) return false;
  out->dtype = x->dtype;
  out->shape = idx->shape;
  return true;
}

/* gather_grad(idx i32, dy of idx's shape) axis=a shape=[..] -> shape, dy's dtype. */
static bool ir_shape_gather_grad(const IrOp *op, const IrType *hint, IrType *out, char *err, size_t n) {
  const IrType *idx = arg(op, 0), *dy = arg(op, 1);
  IrShape s;
  int64_t axis;
  if (!need_float_operand(op, 1, err, n)) return false;
  if (!ir_shape_eq(&idx->shape, &dy->shape))
    return errf(err, n, "'gather_grad': gradient %s does not match indices %s", ts(dy).s, ts(idx).s);
  if (!need_shape(op, "shape", &s, err, n)) return false;
  IrType t = {dy->dtype, s};
  if (s.rank < 1) return errf(err, n, "'gather_grad' needs a result of rank >= 1");
  if (!need_axis(op, "axis", s.rank, &axis, err, n)) return false;
  if (!index_like(op, &t, idx, axis, "the result", err, n)) return false;
  *out = t;
  return true;
}

/* topk(float x) k=N axis=a -> i32, x's shape with k along a (1 <= k <= dim). */
static bool ir_shape_topk(const IrOp *op, const IrType *hint, IrType *out, char *err, size_t n) {
  const IrType *x = arg(op, 0);
  int64_t axis, k;
  if (!need_float_operand(op, 0, err, n)) return false;
  if (x->shape.rank < 1) return errf(err, n, "'topk' needs an operand of rank >= 1, got %s", ts(x).s);
  if (!need_axis(op, "axis", x->shape.rank, &axis, err, n)) return false;
  if (!need_int(op, "k", &k, err, n)) return false;
  if (k < 1 || k > x->shape.dim[axis])
    return errf(err, n, "'topk': k = %lld is out of range [1, %lld] for axis %lld of %s", (long long)k,
                (long long)x->shape.dim[axis], (long long)axis, ts(x).s);
  out->dtype = IR_DT_I32;
  out->shape = x->shape;
  out->shape.dim[axis] = k;
  return true;
}

/* window.sum: counts (i32, bool) are summed as f32. */
static bool ir_shape_window_sum(const IrOp *op, const IrType *hint, IrType *out, char *err, size_t n) {
  *out = *arg(op, 0);
  if (!ir_dtype_is_float(out->dtype)) out->dtype = IR_DT_F32;
  return true;
}

static bool ir_shape_grad_seed(const IrOp *op, const IrType *hint, IrType *out, char *err, size_t n) {
  double coef;
  if (!need_float_operand(op, 0, err, n) || !need_scalar(op, 0, err, n)) return false;
  if (!need_number(op, "coef", &coef, err, n)) return false;
  *out = *arg(op, 0);
  return true;
}

static bool ir_shape_loss_term(const IrOp *op, const IrType *hint, IrType *out, char *err, size_t n) {
  if (!need_float_operand(op, 0, err, n) || !need_scalar(op, 0, err, n) || !need_scalar(op, 1, err, n)) return false;
  if (!need_same_type(op, 0, 1, err, n)) return false;
  *out = *arg(op, 0);
  return true;
}

/* rng.state: the draw state of the micro-batch (IR_RNG_WORDS words). */
static bool ir_shape_rng_state(const IrOp *op, const IrType *hint, IrType *out, char *err, size_t n) {
  (void)op, (void)hint, (void)err, (void)n;
  out->dtype = IR_DT_I32;
  out->shape.rank = 1;
  out->shape.dim[0] = IR_RNG_WORDS;
  return true;
}

/* loss.scale: the window's loss scale, an f32 scalar. */
static bool ir_shape_loss_scale(const IrOp *op, const IrType *hint, IrType *out, char *err, size_t n) {
  (void)op, (void)hint, (void)err, (void)n;
  out->dtype = IR_DT_F32;
  out->shape = ir_shape_scalar();
  return true;
}

/* random %state {dist, key, batched}: f32 or f64 draws of the given type;
 * Philox's counter word for the element in the sample has 32 bits. */
static bool ir_shape_random(const IrOp *op, const IrType *hint, IrType *out, char *err, size_t n) {
  const IrType *s = arg(op, 0);
  const char *dist;
  int64_t key;
  bool batched;
  if (s->dtype != IR_DT_I32 || s->shape.rank != 1 || s->shape.dim[0] != IR_RNG_WORDS)
    return errf(err, n, "'random' needs an i32[%d] rng.state operand, got %s", IR_RNG_WORDS, ts(s).s);
  if (!need_hint(op, hint, err, n)) return false;
  if (!need_str(op, "dist", &dist, err, n) || !need_int(op, "key", &key, err, n) ||
      !need_bool(op, "batched", &batched, err, n))
    return false;
  if (strcmp(dist, "uniform") != 0 && strcmp(dist, "normal") != 0)
    return errf(err, n, "'random': dist must be \"uniform\" or \"normal\", got \"%s\"", dist);
  if (key < 0 || key > (int64_t)UINT32_MAX) return errf(err, n, "'random': key %lld is not a 32-bit id", (long long)key);
  if (hint->dtype != IR_DT_F32 && hint->dtype != IR_DT_F64)
    return errf(err, n, "'random' draws f32 or f64, not %s", ts(hint).s);
  if (batched && hint->shape.rank == 0) return errf(err, n, "'random': a batched draw needs a batch axis");
  int64_t per = checked_numel(&hint->shape);
  if (batched && hint->shape.dim[0] > 0) per /= hint->shape.dim[0];
  if (per < 0 || per > (int64_t)UINT32_MAX)
    return errf(err, n, "'random': %s has more than 2^32 elements per sample", ts(hint).s);
  *out = *hint;
  return true;
}

/* Attributes common to collectives: group="..." ranks=N (N >= 1). */
static bool collective_attrs(const IrOp *op, int64_t *ranks, char *err, size_t n) {
  const char *group;
  if (!need_str(op, "group", &group, err, n)) return false;
  if (!need_int(op, "ranks", ranks, err, n)) return false;
  if (*ranks < 1 || *ranks > 65536) return errf(err, n, "'%s': invalid ranks %lld", opname(op), (long long)*ranks);
  return true;
}

static bool ir_shape_all_reduce(const IrOp *op, const IrType *hint, IrType *out, char *err, size_t n) {
  int64_t ranks;
  if (!collective_attrs(op, &ranks, err, n)) return false;
  *out = *arg(op, 0);
  return true;
}

/* tp.copy: group="..." ranks=N; the identity on a float operand. */
static bool ir_shape_tp_copy(const IrOp *op, const IrType *hint, IrType *out, char *err, size_t n) {
  int64_t ranks;
  if (!collective_attrs(op, &ranks, err, n)) return false;
  if (!need_float_operand(op, 0, err, n)) return false;
  *out = *arg(op, 0);
  return true;
}

static bool ir_shape_all_gather(const IrOp *op, const IrType *hint, IrType *out, char *err, size_t n) {
  const IrType *x = arg(op, 0);
  int64_t ranks, axis;
  if (!collective_attrs(op, &ranks, err, n)) return false;
  if (!need_axis(op, "axis", x->shape.rank, &axis, err, n)) return false;
  *out = *x;
  if (x->shape.dim[axis] >= MAX_DIM / ranks) return errf(err, n, "'%s': result is too large", opname(op));
  out->shape.dim[axis] *= ranks;
  return true;
}

static bool ir_shape_reduce_scatter(const IrOp *op, const IrType *hint, IrType *out, char *err, size_t n) {
  const IrType *x = arg(op, 0);
  int64_t ranks, axis;
  if (!collective_attrs(op, &ranks, err, n)) return false;
  if (!need_axis(op, "axis", x->shape.rank, &axis, err, n)) return false;
  if (x->shape.dim[axis] % ranks != 0)
    return errf(err, n, "'%s': axis %lld of %s is not divisible by %lld ranks", opname(op), (long long)axis, ts(x).s,
                (long long)ranks);
  *out = *x;
  out->shape.dim[axis] /= ranks;
  return true;
}

/* tp.scatter / rank.slice: chunk of T along axis of a float operand
 * (rank.slice: shift=j, 0 <= j < T). */
static bool ir_shape_tp_scatter(const IrOp *op, const IrType *hint, IrType *out, char *err, size_t n) {
  const IrType *x = arg(op, 0);
  int64_t ranks, axis;
  if (!collective_attrs(op, &ranks, err, n)) return false;
  if (!need_float_operand(op, 0, err, n)) return false;
  if (!need_axis(op, "axis", x->shape.rank, &axis, err, n)) return false;
  if (x->shape.dim[axis] % ranks != 0)
    return errf(err, n, "'%s': axis %lld of %s is not divisible by %lld ranks", opname(op), (long long)axis, ts(x).s,
                (long long)ranks);
  *out = *x;
  out->shape.dim[axis] /= ranks;
  return true;
}

static bool ir_shape_rank_slice(const IrOp *op, const IrType *hint, IrType *out, char *err, size_t n) {
  int64_t ranks, shift;
  if (!collective_attrs(op, &ranks, err, n)) return false;
  if (!need_int(op, "shift", &shift, err, n)) return false;
  if (shift < 0 || shift >= ranks) return errf(err, n, "'%s': shift %lld is not in [0, ranks)", opname(op), (long long)shift);
  return ir_shape_tp_scatter(op, hint, out, err, n);
}

/* rank.concat: T operands of one float type joined along axis. */
static bool ir_shape_rank_concat(const IrOp *op, const IrType *hint, IrType *out, char *err, size_t n) {
  const IrType *x = arg(op, 0);
  int64_t ranks, axis;
  if (!collective_attrs(op, &ranks, err, n)) return false;
  if (op->nargs != ranks)
    return errf(err, n, "'%s' takes ranks=%lld operands, got %d", opname(op), (long long)ranks, op->nargs);
  if (!need_float_operand(op, 0, err, n)) return false;
  for (int j = 1; j < op->nargs; j++)
    if (!need_same_type(op, 0, j, err, n)) return false;
  if (!need_axis(op, "axis", x->shape.rank, &axis, err, n)) return false;
  *out = *x;
  if (x->shape.dim[axis] >= MAX_DIM / ranks) return errf(err, n, "'%s': result is too large", opname(op));
  out->shape.dim[axis] *= ranks;
  return true;
}

/* *.wait: the operand is the result of the matching *.start. */
static bool ir_shape_wait(const IrOp *op, const IrType *hint, IrType *out, char *err, size_t n) {
  IrOpcode start = IR_OP_ALL_REDUCE_START;
  if (op->opcode == IR_OP_ALL_GATHER_WAIT) start = IR_OP_ALL_GATHER_START;
  if (op->opcode == IR_OP_REDUCE_SCATTER_WAIT) start = IR_OP_REDUCE_SCATTER_START;
  const IrOp *d = op->args[0]->def;
  if (!d || d->opcode != start)
    return errf(err, n, "'%s' must wait on the result of '%s'", opname(op), ir_op_info[start].name);
  *out = *arg(op, 0);
  return true;
}

/* ---- convolution and pooling: patches (im2col) and patches_grad ---- */

/* The geometry of a patches or patches_grad op: kernel=[..] names the d
 * spatial axes (the last d of the image), stride, padding and dilation one
 * per axis; the image is the operand (patches) or shape=[..]
 * (patches_grad).  Checks every attribute and that each kernel fits its
 * padded axis. */
bool ir_patches_geom(const IrOp *op, IrPatches *g, char *err, size_t n) {
  memset(g, 0, sizeof *g);
  const char *keys[4] = {"kernel", "stride", "padding", "dilation"};
  int64_t *dst[4] = {g->kernel, g->stride, g->padding, g->dilation};
  for (int j = 0; j < 4; j++) {
    const int64_t *v;
    int len;
    if (!need_ints(op, keys[j], &v, &len, err, n)) return false;
    if (j == 0) {
      g->d = len;
      if (len < 1) return errf(err, n, "'%s' needs at least one spatial axis in 'kernel'", opname(op));
    } else if (len != g->d) {
      return errf(err, n, "'%s': '%s' has %d entries, 'kernel' %d", opname(op), keys[j], len, g->d);
    }
    for (int i = 0; i < len; i++) {
      int64_t lo = j == 2 ? 0 : 1;
      if (v[i] < lo || v[i] >= MAX_DIM)
        return errf(err, n, "'%s': %s %lld must be %s", opname(op), keys[j], (long long)v[i],
                    j == 2 ? "non-negative" : "positive");
      dst[j][i] = v[i];
    }
  }
  IrShape img;
  if (op->opcode == IR_OP_PATCHES) {
    img = arg(op, 0)->shape;
    if (!need_number(op, "value", &g->value, err, n)) return false;
  } else {
    if (!need_shape(op, "shape", &img, err, n)) return false;
  }
  int r = img.rank;
  if (r < g->d || r - g->d + 2 * g->d > IR_MAX_RANK) {
    IrType t = {arg(op, 0)->dtype, img};
    return errf(err, n, "'%s': %d spatial axes do not fit %s (the result would have rank %d, at most %d)",
                opname(op), g->d, ts(&t).s, r + g->d, IR_MAX_RANK);
  }
  g->lead = r - g->d;
  g->outer = 1;
  for (int i = 0; i < g->lead; i++) g->outer *= img.dim[i];
  g->image = img;
  for (int i = 0; i < g->d; i++) {
    int64_t span = g->dilation[i] * (g->kernel[i] - 1) + 1, avail = img.dim[g->lead + i] + 2 * g->padding[i];
    g->in[i] = img.dim[g->lead + i];
    if (span > avail) {
      IrType t = {arg(op, 0)->dtype, img};
      return errf(err, n,
                  "'%s': kernel %lld (dilation %lld, spanning %lld) is larger than axis %d of %s padded by %lld "
                  "(%lld)",
                  opname(op), (long long)g->kernel[i], (long long)g->dilation[i], (long long)span, g->lead + i,
                  ts(&t).s, (long long)g->padding[i], (long long)avail);
    }
    g->out[i] = (avail - span) / g->stride[i] + 1;
  }
  /* the patches' shape: [lead..., K..., O...] */
  g->cols.rank = g->lead + 2 * g->d;
  for (int i = 0; i < g->lead; i++) g->cols.dim[i] = img.dim[i];
  for (int i = 0; i < g->d; i++) {
    g->cols.dim[g->lead + i] = g->kernel[i];
    g->cols.dim[g->lead + g->d + i] = g->out[i];
  }
  return true;
}

static bool ir_shape_patches(const IrOp *op, const IrType *hint, IrType *out, char *err, size_t n) {
  IrPatches g;
  if (!need_float_operand(op, 0, err, n)) return false;
  if (!ir_patches_geom(op, &g, err, n)) return false;
  if (checked_numel(&g.cols) < 0) return errf(err, n, "'patches': result is too large");
  out->dtype = arg(op, 0)->dtype;
  out->shape = g.cols;
  return true;
}

static bool ir_shape_patches_grad(const IrOp *op, const IrType *hint, IrType *out, char *err, size_t n) {
  IrPatches g;
  const IrType *dy = arg(op, 0);
  if (!need_float_operand(op, 0, err, n)) return false;
  if (!ir_patches_geom(op, &g, err, n)) return false;
  if (!ir_shape_eq(&g.cols, &dy->shape)) {
    IrType t = {dy->dtype, g.cols};
    return errf(err, n, "'patches_grad': the patches of shape %s are %s, but the operand is %s",
                shape_text(&g.image).s, ts(&t).s, ts(dy).s);
  }
  if (checked_numel(&g.image) < 0) return errf(err, n, "'patches_grad': result is too large");
  out->dtype = dy->dtype;
  out->shape = g.image;
  return true;
}

/* loss/grad/output/update outputs: no result; *out is the operand's type.
 * An `output` may be of any dtype (indices, masks); the others are float. */
static bool ir_shape_output(const IrOp *op, const IrType *hint, IrType *out, char *err, size_t n) {
  const char *name;
  if (!need_str(op, "name", &name, err, n)) return false;
  if (op->opcode != IR_OP_OUTPUT && !need_float_operand(op, 0, err, n)) return false;
  const char *w = ir_attr_get_str(op, "window", NULL);
  if (w && strcmp(w, "concat") != 0 && strcmp(w, "sum") != 0 && strcmp(w, "once") != 0)
    return errf(err, n, "'%s': window must be \"concat\", \"sum\" or \"once\", got \"%s\"", opname(op), w);
  if (w && strcmp(w, "concat") == 0 && arg(op, 0)->shape.rank == 0)
    return errf(err, n, "'%s': window=\"concat\" needs a leading batch axis", opname(op));
  if (op->opcode == IR_OP_LOSS && !need_scalar(op, 0, err, n)) return false;
  *out = *arg(op, 0);
  return true;
}

/* ------------------------------------------------------------------ */
/* Dispatch                                                            */
/* ------------------------------------------------------------------ */

static const IrShapeFn shape_rules[IR_OP_COUNT] = {
#define OP(id, name, arity, kind, family, shape, grad, flags) [IR_OP_##id] = ir_shape_##shape,
#include "ops.def"
#undef OP
};

static bool type_ok(const IrType *t) {
  if ((unsigned)t->dtype >= IR_DT_COUNT || t->shape.rank < 0 || t->shape.rank > IR_MAX_RANK) return false;
  for (int i = 0; i < t->shape.rank; i++)
    if (t->shape.dim[i] < 0 || t->shape.dim[i] >= MAX_DIM) return false;
  return true;
}

bool ir_infer_type(const IrOp *op, const IrType *hint, IrType *out, char *err, size_t errlen) {
  if ((unsigned)op->opcode >= (unsigned)IR_OP_COUNT) return errf(err, errlen, "invalid opcode %d", (int)op->opcode);
  const IrOpInfo *info = &ir_op_info[op->opcode];
  if (info->arity >= 0 ? op->nargs != info->arity : op->nargs < 1)
    return errf(err, errlen, "'%s' takes %s%d operand%s, got %d", info->name, info->arity < 0 ? "at least " : "",
                info->arity < 0 ? 1 : info->arity, info->arity == 1 || info->arity < 0 ? "" : "s", op->nargs);
  if (op->nattrs > 0 && !op->attrs) return errf(err, errlen, "'%s': missing attribute array", info->name);
  for (int i = 0; i < op->nargs; i++) {
    if (!op->args || !op->args[i]) return errf(err, errlen, "'%s': operand %d is missing", info->name, i + 1);
    if (!type_ok(&op->args[i]->type)) return errf(err, errlen, "'%s': operand %d has an invalid type", info->name, i + 1);
  }
  IrType t;
  memset(&t, 0, sizeof t);
  if (!shape_rules[op->opcode](op, hint, &t, err, errlen)) return false;
  *out = t;
  return true;
}
