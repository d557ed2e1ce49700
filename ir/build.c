/* build.c - creating ops: ir_build checks and infers types through the op
 * table's shape rules; the ir_* shorthands are for passes. */
#include <string.h>

#include "ir.h"

IrValue *ir_func_new_value(IrFunc *f, IrType t, const char *name);
void ir_func_append_op(IrFunc *f, IrOp *op);

static IrAttr copy_attr(Arena *a, const IrAttr *src) {
  IrAttr d = *src;
  d.key = arena_strdup(a, src->key);
  if (src->kind == IR_ATTR_STR) d.s = arena_strdup(a, src->s ? src->s : "");
  if (src->kind == IR_ATTR_INTS) {
    int64_t *v = ARENA_ARRAY(a, int64_t, src->n > 0 ? src->n : 1);
    if (src->n > 0) memcpy(v, src->ints, sizeof(int64_t) * (size_t)src->n);
    d.ints = v;
  }
  return d;
}

IrOp *ir_build(IrFunc *f, IrOpcode opc, IrValue *const *args, int nargs, const IrAttr *attrs, int nattrs,
               const IrType *hint, IrLoc loc, char *err, size_t errlen) {
  const IrOpInfo *info = &ir_op_info[opc];
  if (info->arity >= 0 ? nargs != info->arity : nargs < 1) {
    if (info->arity < 0)
      snprintf(err, errlen, "'%s' takes at least one operand", info->name);
    else
      snprintf(err, errlen, "'%s' takes %d operand%s, got %d", info->name, info->arity, info->arity == 1 ? "" : "s",
               nargs);
    return NULL;
  }
  /* Build the op on the stack first so that a failed inference adds nothing. */
  IrOp tmp;
  memset(&tmp, 0, sizeof tmp);
  tmp.opcode = opc;
  tmp.args = (IrValue **)args;
  tmp.nargs = nargs;
  tmp.attrs = (IrAttr *)attrs;
  tmp.nattrs = nattrs;
  tmp.loc = loc;
  IrType rt;
  memset(&rt, 0, sizeof rt);
  if (!ir_infer_type(&tmp, hint, &rt, err, errlen)) return NULL;
  bool has_result = info->kind != IR_KIND_OUTPUT;
  if (has_result && hint && !ir_op_is(opc, IR_OPF_HINT) && !ir_type_eq(hint, &rt)) {
    char a[IR_TYPE_STR_MAX], b[IR_TYPE_STR_MAX];
    snprintf(err, errlen, "'%s' has type %s, but %s was declared", info->name, ir_type_str(&rt, a, sizeof a),
             ir_type_str(hint, b, sizeof b));
    return NULL;
  }
  IrOp *op = ARENA_NEW(&f->arena, IrOp);
  *op = tmp;
  op->args = ARENA_ARRAY(&f->arena, IrValue *, nargs > 0 ? nargs : 1);
  if (nargs > 0) memcpy(op->args, args, sizeof(IrValue *) * (size_t)nargs);
  op->attrs = ARENA_ARRAY(&f->arena, IrAttr, nattrs > 0 ? nattrs : 1);
  for (int i = 0; i < nattrs; i++) op->attrs[i] = copy_attr(&f->arena, &attrs[i]);
  if (loc.file) op->loc.file = arena_strdup(&f->arena, loc.file);
  if (has_result) {
    op->result = ir_func_new_value(f, rt, NULL);
    op->result->def = op;
  }
  ir_func_append_op(f, op);
  return op;
}

IrValue *ir_emit(IrFunc *f, IrOpcode opc, IrValue *const *args, int nargs, const IrAttr *attrs, int nattrs,
                 const IrType *hint, IrLoc loc) {
  char err[512];
  IrOp *op = ir_build(f, opc, args, nargs, attrs, nattrs, hint, loc, err, sizeof err);
  if (!op) {
    fprintf(stderr, "gradc: internal error: cannot build '%s': %s\n", ir_op_info[opc].name, err);
    GRADC_ASSERT(!"ir_emit: ill-typed op");
  }
  return op->result;
}

IrValue *ir_unary(IrFunc *f, IrOpcode opc, IrValue *x, IrLoc loc) { return ir_emit(f, opc, &x, 1, NULL, 0, NULL, loc); }

IrValue *ir_binary(IrFunc *f, IrOpcode opc, IrValue *a, IrValue *b, IrLoc loc) {
  IrValue *args[2] = {a, b};
  return ir_emit(f, opc, args, 2, NULL, 0, NULL, loc);
}

IrValue *ir_select(IrFunc *f, IrValue *cond, IrValue *a, IrValue *b, IrLoc loc) {
  IrValue *args[3] = {cond, a, b};
  return ir_emit(f, IR_OP_SELECT, args, 3, NULL, 0, NULL, loc);
}

IrValue *ir_const_shaped(IrFunc *f, double v, IrType t, IrLoc loc) {
  IrAttr a = ir_attr_float("value", v);
  return ir_emit(f, IR_OP_CONST, NULL, 0, &a, 1, &t, loc);
}

IrValue *ir_const(IrFunc *f, double v, IrDType dt, IrLoc loc) {
  IrType t = {dt, ir_shape_scalar()};
  return ir_const_shaped(f, v, t, loc);
}

IrValue *ir_reduce(IrFunc *f, IrOpcode opc, IrValue *x, const int64_t *axes, int naxes, bool keepdim, IrLoc loc) {
  IrAttr a[2] = {ir_attr_ints("axes", axes, naxes), ir_attr_bool("keepdim", keepdim)};
  return ir_emit(f, opc, &x, 1, a, 2, NULL, loc);
}

IrValue *ir_reshape(IrFunc *f, IrValue *x, IrShape s, IrLoc loc) {
  if (ir_shape_eq(&x->type.shape, &s)) return x;
  IrAttr a = ir_attr_ints("shape", s.dim, s.rank);
  return ir_emit(f, IR_OP_RESHAPE, &x, 1, &a, 1, NULL, loc);
}

IrValue *ir_broadcast(IrFunc *f, IrValue *x, IrShape s, IrLoc loc) {
  if (ir_shape_eq(&x->type.shape, &s)) return x;
  IrAttr a = ir_attr_ints("shape", s.dim, s.rank);
  return ir_emit(f, IR_OP_BROADCAST, &x, 1, &a, 1, NULL, loc);
}

IrValue *ir_permute(IrFunc *f, IrValue *x, const int64_t *perm, IrLoc loc) {
  IrAttr a = ir_attr_ints("perm", perm, x->type.shape.rank);
  return ir_emit(f, IR_OP_PERMUTE, &x, 1, &a, 1, NULL, loc);
}

IrValue *ir_cast(IrFunc *f, IrValue *x, IrDType dt, IrLoc loc) {
  if (x->type.dtype == dt) return x;
  IrType t = {dt, x->type.shape};
  return ir_emit(f, IR_OP_CAST, &x, 1, NULL, 0, &t, loc);
}

IrValue *ir_matmul(IrFunc *f, IrValue *a, IrValue *b, IrLoc loc) { return ir_binary(f, IR_OP_MATMUL, a, b, loc); }

IrValue *ir_sum_to(IrFunc *f, IrValue *x, IrShape s, IrLoc loc) {
  const IrShape *xs = &x->type.shape;
  if (ir_shape_eq(xs, &s)) return x;
  GRADC_ASSERT(xs->rank >= s.rank);
  int64_t axes[IR_MAX_RANK];
  int n = 0, lead = xs->rank - s.rank;
  for (int i = 0; i < xs->rank; i++) {
    if (i < lead)
      axes[n++] = i;
    else if (s.dim[i - lead] == 1 && xs->dim[i] != 1)
      axes[n++] = i;
  }
  IrValue *r = n ? ir_reduce(f, IR_OP_SUM, x, axes, n, true, loc) : x;
  return ir_reshape(f, r, s, loc);
}
