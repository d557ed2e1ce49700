/* inputs.c - random inputs for a model: floats ~ N(0, 1), integers drawn in
 * [0, size of the axis they index) (DESIGN.md §5 `bench`): an i32 input that
 * reaches an embedding indexes its table's rows, one that reaches a
 * cross_entropy indexes the logits' classes.  Used by `gradc data random`,
 * the demo and benchmarks. */
#include <stdlib.h>

#include "runtime/runtime.h"

/* The size of the axis that integer value v indexes, or 0 if unknown. */
static int64_t index_range(const IrFunc *f, const IrValue *v, int depth) {
  if (depth > 32) return 0;
  for (int i = 0; i < f->nops; i++) {
    const IrOp *op = f->ops[i];
    for (int j = 0; j < op->nargs; j++) {
      if (op->args[j] != v) continue;
      int64_t r = 0;
      switch (ir_op_info[op->opcode].kind) {
      case IR_KIND_MOVEMENT:
        if (op->result) r = index_range(f, op->result, depth + 1);
        break;
      case IR_KIND_NN:
        if (op->opcode == IR_OP_EMBEDDING && j == 0) r = op->args[1]->type.shape.dim[0];
        if (op->opcode == IR_OP_EMBEDDING_GRAD && j == 0) r = ir_attr_get_int(op, "rows", 0);
        if (op->opcode == IR_OP_CROSS_ENTROPY && j == 1) {
          const IrShape *s = &op->args[0]->type.shape;
          r = s->dim[s->rank - 1];
        }
        if (op->opcode == IR_OP_ONE_HOT) r = ir_attr_get_int(op, "depth", 0);
        if (op->opcode == IR_OP_GATHER && j == 1) {
          int64_t axis = 0;
          const IrShape *xs = &op->args[0]->type.shape;
          if (ir_norm_axis(ir_attr_get_int(op, "axis", 0), xs->rank, &axis)) r = xs->dim[axis];
        }
        break;
      case IR_KIND_ELEMENTWISE:
      case IR_KIND_CONST:
      case IR_KIND_REDUCE:
      case IR_KIND_GEMM:
      case IR_KIND_WINDOW:
      case IR_KIND_COLLECTIVE:
      case IR_KIND_OUTPUT: break;
      }
      if (r > 0) return r;
    }
  }
  return 0;
}

/* Input arg a's window shape (batched inputs get gas micro-batches);
 * false when the shape's size overflows. */
static bool window_shape(const IrValue *a, int gas, IrShape *s, uint64_t *bytes) {
  *s = a->type.shape;
  uint64_t n = ir_dtype_size(a->type.dtype == IR_DT_I32 ? IR_DT_I32 : a->type.dtype == IR_DT_F64 ? IR_DT_F64
                                                                                                 : IR_DT_F32);
  bool ok = true;
  if (a->batched) {
    uint64_t d0;
    ok = mem_mul((uint64_t)s->dim[0], (uint64_t)(gas > 0 ? gas : 1), &d0) && d0 <= INT64_MAX;
    s->dim[0] = ok ? (int64_t)d0 : INT64_MAX;
  }
  for (int k = 0; k < s->rank && ok; k++) ok = mem_mul(n, (uint64_t)s->dim[k], &n);
  *bytes = ok ? n : UINT64_MAX;
  return ok;
}

bool rt_random_inputs_fit(const IrFunc *f, int gas, char *err, size_t errlen) {
  uint64_t total = 0;
  for (int i = 0; i < f->nargs; i++) {
    const IrValue *a = f->args[i];
    if (a->role != IR_ARG_INPUT) continue;
    IrType t = a->type;
    uint64_t bytes;
    bool ok = window_shape(a, gas, &t.shape, &bytes);
    char ty[IR_TYPE_STR_MAX], what[IR_TYPE_STR_MAX + 256];
    ir_type_str(&t, ty, sizeof ty);
    if (!ok) return errf(err, errlen, "input '%s' (%s) has more bytes than 64 bits can count", a->name, ty);
    snprintf(what, sizeof what, "input '%s' (%s)", a->name, ty);
    if (!mem_fits(what, bytes, err, errlen)) return false;
    if (!mem_add(total, bytes, &total)) total = UINT64_MAX;
  }
  return mem_fits("the inputs", total, err, errlen);
}

void rt_random_inputs(const IrFunc *f, int gas, uint64_t seed, StFile *out) {
  Rng rng;
  rng_seed(&rng, seed);
  for (int i = 0; i < f->nargs; i++) {
    const IrValue *a = f->args[i];
    if (a->role != IR_ARG_INPUT) continue;
    IrShape s;
    uint64_t bytes;
    GRADC_ASSERT(window_shape(a, gas, &s, &bytes)); /* rt_random_inputs_fit checked it */
    int64_t n = ir_numel(&s);
    /* Drawn straight into the file's tensor: one copy in memory. */
    if (a->type.dtype == IR_DT_I32) {
      int64_t range = index_range(f, a, 0);
      if (range <= 0) range = 2;
      int32_t *buf = st_add(out, a->name, ST_I32, s.rank, s.dim, NULL)->data;
      for (int64_t j = 0; j < n; j++) buf[j] = (int32_t)(rng_next(&rng) % (uint64_t)range);
    } else {
      bool f64 = a->type.dtype == IR_DT_F64;
      void *buf = st_add(out, a->name, f64 ? ST_F64 : ST_F32, s.rank, s.dim, NULL)->data;
      for (int64_t j = 0; j < n; j++) {
        double x = rng_normal(&rng);
        if (f64) ((double *)buf)[j] = x;
        else ((float *)buf)[j] = (float)x;
      }
    }
  }
}
