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

void rt_random_inputs(const IrFunc *f, int gas, uint64_t seed, StFile *out) {
  Rng rng;
  rng_seed(&rng, seed);
  for (int i = 0; i < f->nargs; i++) {
    const IrValue *a = f->args[i];
    if (a->role != IR_ARG_INPUT) continue;
    IrShape s = a->type.shape;
    if (a->batched) s.dim[0] *= gas;
    int64_t n = ir_numel(&s);
    if (a->type.dtype == IR_DT_I32) {
      int64_t range = index_range(f, a, 0);
      if (range <= 0) range = 2;
      int32_t *buf = mem_alloc(sizeof(int32_t) * (size_t)(n ? n : 1));
      for (int64_t j = 0; j < n; j++) buf[j] = (int32_t)(rng_next(&rng) % (uint64_t)range);
      st_add(out, a->name, ST_I32, s.rank, s.dim, buf);
      free(buf);
    } else {
      bool f64 = a->type.dtype == IR_DT_F64;
      void *buf = mem_alloc((size_t)(n ? n : 1) * (f64 ? 8 : 4));
      for (int64_t j = 0; j < n; j++) {
        double x = rng_normal(&rng);
        if (f64) ((double *)buf)[j] = x;
        else ((float *)buf)[j] = (float)x;
      }
      st_add(out, a->name, f64 ? ST_F64 : ST_F32, s.rank, s.dim, buf);
      free(buf);
    }
  }
}
