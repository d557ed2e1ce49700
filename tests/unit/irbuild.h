/* irbuild.h - building IR functions op by op in the unit tests: types,
 * arguments, and ops whose shape errors fail the test.  Static inline, so
 * each test uses what it needs. */
#ifndef GRADC_TEST_IRBUILD_H
#define GRADC_TEST_IRBUILD_H

#include <stdarg.h>
#include <string.h>

#include "testutil.h"

static const IrLoc noloc = {NULL, 0, 0};

/* ty(IR_DT_F32, 2, 4, 8) is f32[4,8]. */
static inline IrType ty(IrDType dt, int rank, ...) {
  IrType t;
  memset(&t, 0, sizeof t);
  t.dtype = dt;
  t.shape.rank = rank;
  va_list ap;
  va_start(ap, rank);
  for (int i = 0; i < rank; i++) t.shape.dim[i] = va_arg(ap, int);
  va_end(ap);
  return t;
}

/* A batched input and a param. */
static inline IrValue *input(IrFunc *f, const char *name, IrType t) {
  return ir_func_add_arg(f, name, t, IR_ARG_INPUT, true);
}
static inline IrValue *param(IrFunc *f, const char *name, IrType t) {
  return ir_func_add_arg(f, name, t, IR_ARG_PARAM, false);
}

static inline IrValue *build(IrFunc *f, IrOpcode opc, IrValue **args, int nargs, const IrAttr *attrs, int nattrs,
                             const IrType *hint) {
  char err[512];
  IrOp *op = ir_build(f, opc, args, nargs, attrs, nattrs, hint, noloc, err, sizeof err);
  if (!op) fail_msg("cannot build %s: %s", ir_op_info[opc].name, err);
  return op->result;
}
static inline IrValue *un(IrFunc *f, IrOpcode opc, IrValue *x) { return build(f, opc, &x, 1, NULL, 0, NULL); }
static inline IrValue *un1(IrFunc *f, IrOpcode opc, IrValue *x, IrAttr a) { return build(f, opc, &x, 1, &a, 1, NULL); }
static inline IrValue *bin(IrFunc *f, IrOpcode opc, IrValue *a, IrValue *b) {
  IrValue *args[2] = {a, b};
  return build(f, opc, args, 2, NULL, 0, NULL);
}
static inline IrValue *reduce(IrFunc *f, IrOpcode opc, IrValue *x, const int64_t *axes, int n, bool keepdim) {
  IrAttr a[2] = {ir_attr_ints("axes", axes, n), ir_attr_bool("keepdim", keepdim)};
  return build(f, opc, &x, 1, a, 2, NULL);
}
static inline IrValue *cnst(IrFunc *f, double v, IrType t) {
  IrAttr a = ir_attr_float("value", v);
  return build(f, IR_OP_CONST, NULL, 0, &a, 1, &t);
}
static inline IrValue *cast(IrFunc *f, IrValue *x, IrDType dt) {
  IrType t = x->type;
  t.dtype = dt;
  return build(f, IR_OP_CAST, &x, 1, NULL, 0, &t);
}
/* A group-0 reader, so that v is a kernel output whatever the kernels are. */
static inline void sink(IrFunc *f, IrValue *v) {
  IrAttr a = ir_attr_ints("shape", v->type.shape.dim, v->type.shape.rank);
  ir_emit(f, IR_OP_RESHAPE, &v, 1, &a, 1, NULL, noloc);
}

#endif
