/* plan.c - what `memplan` and the passes that prepare its graph share
 * (docs/BACKEND.md): what a group-0 op is to the executor, which group-0
 * transposes become GEMM flags, and which values live in a param's
 * gradient buffer (the chain from a `grad` down to the op that
 * accumulates into it). */
#include "kernel.h"
#include "passes.h"

PlanExec plan_exec_kind(IrOpcode opc) {
  switch (opc) {
  case IR_OP_MATMUL: return PLAN_EXEC_GEMM;
  case IR_OP_RESHAPE: return PLAN_EXEC_ALIAS;
  case IR_OP_CONST: return PLAN_EXEC_CONST;
  case IR_OP_WINDOW_SUM:
  case IR_OP_RNG_STATE:
  case IR_OP_LOSS_SCALE: return PLAN_EXEC_WSUM; /* (written before each micro-batch) */
  case IR_OP_LOSS:
  case IR_OP_OUTPUT:
  case IR_OP_UPDATE: return PLAN_EXEC_LOSS;
  case IR_OP_GRAD: return PLAN_EXEC_GRAD;
  IR_CASES(COLLECTIVE) return PLAN_EXEC_COPY;
  case IR_OP_PERMUTE: return PLAN_EXEC_PERMUTE;
  IR_CASES(ELEMENTWISE)
  IR_CASES(REDUCE)
  IR_CASES(NN)
  case IR_OP_BROADCAST:
  case IR_OP_SLICE:
  case IR_OP_UNSLICE:
  case IR_OP_CONCAT:
  case IR_OP_PATCHES:
  case IR_OP_PATCHES_GRAD:
  case IR_OP_GRAD_SEED:
  case IR_OP_LOSS_TERM: return PLAN_EXEC_UNFUSED;
  }
  return PLAN_EXEC_UNFUSED;
}

bool plan_group0_reshape(const IrOp *op) { return op && op->group == 0 && op->opcode == IR_OP_RESHAPE; }

bool plan_range_slice(const IrOp *op, int64_t *first) {
  return op && op->group == 0 && op->opcode == IR_OP_SLICE && kp_slice_contiguous(op, first);
}

bool plan_range_unslice(const IrOp *op, int64_t *first) {
  return op && op->group == 0 && op->opcode == IR_OP_UNSLICE && kp_slice_contiguous(op, first);
}

bool plan_last_coll(const IrOp *op) {
  if (!op || op->group != 0 || (op->opcode != IR_OP_ALL_REDUCE_START && op->opcode != IR_OP_ALL_REDUCE_WAIT)) return false;
  if (op->opcode == IR_OP_ALL_REDUCE_WAIT && op->args[0]->def) op = op->args[0]->def; /* its start's attributes */
  const IrAttr *a = ir_attr_get(op, "last");
  return a && a->i != 0;
}

IrValue *plan_grad_next(const IrValue *v) {
  int64_t first;
  if (plan_group0_reshape(v->def) || plan_range_unslice(v->def, &first) || plan_last_coll(v->def))
    return v->def->args[0];
  return NULL;
}

/* Whether the op that defines a value can accumulate into a gradient
 * buffer instead of storing: a kernel, a GEMM, or an unfused compute op
 * (not a view: reshapes and range slices share their operand's bytes). */
static bool accumulates(const IrOp *def) {
  int64_t first;
  if (!def) return false;
  if (def->group > 0) return true;
  if (plan_group0_reshape(def) || plan_range_slice(def, &first)) return false;
  switch (plan_exec_kind(def->opcode)) {
  case PLAN_EXEC_GEMM:
  case PLAN_EXEC_UNFUSED: return true;
  case PLAN_EXEC_ALIAS:
  case PLAN_EXEC_CONST:
  case PLAN_EXEC_WSUM:
  case PLAN_EXEC_LOSS:
  case PLAN_EXEC_GRAD:
  case PLAN_EXEC_COPY:
  case PLAN_EXEC_PERMUTE: return false;
  }
  return false;
}

bool plan_grad_in_place(const IrValue *v, const int *uses) {
  for (const IrValue *next; (next = plan_grad_next(v)); v = next)
    if (uses[v->id] != 1) return false;
  return uses[v->id] == 1 && accumulates(v->def);
}

bool *plan_gemm_flags(const IrFunc *f, Arena *scratch) {
  int nv = f->nvalues;
  bool *flag = ARENA_ARRAY(scratch, bool, nv + 1);
  int *readers = ARENA_ARRAY(scratch, int, nv + 1);
  bool *other = ARENA_ARRAY(scratch, bool, nv + 1); /* read by anything but a group-0 GEMM */
  for (int i = 0; i < f->nops; i++) {
    const IrOp *u = f->ops[i];
    for (int j = 0; j < u->nargs; j++) {
      int id = u->args[j]->id;
      readers[id]++;
      other[id] |= u->group != 0 || u->opcode != IR_OP_MATMUL;
    }
  }
  for (int i = 0; i < f->nops; i++) {
    const IrOp *op = f->ops[i];
    if (op->group != 0 || !rw_is_transpose(op)) continue;
    int id = op->result->id;
    flag[id] = readers[id] > 0 && !other[id];
  }
  return flag;
}

bool plan_in_group0(const IrOp *op, void *ctx) {
  (void)ctx;
  return op->group == 0;
}
