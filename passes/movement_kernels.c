/* movement_kernels.c - `movement-kernels`: a group-0 movement op that GEMMs
 * do not read or write in place becomes a kernel of its own.
 *
 * fuse leaves permutes, slices and concats in group 0 while it decides
 * which of them GEMMs read or write as strided views (kp_views_find); the
 * gradient passes before memplan change what reads what, so in a fused
 * function a group-0 concat, non-range slice or permute that is not a GEMM
 * transpose flag (plan_gemm_flags) and not a view does work the executor
 * does not do: it becomes a kernel of one op.  Views are found again
 * until none is left over (a new kernel may end another op's view).
 *
 * Requires: a function after `grad-copies` (runs right before memplan).
 * Guarantees: in a function with kernels, every group-0 permute, slice or
 * concat is a GEMM flag, a contiguous-range slice (an alias) or a view
 * (kp_view_free_op); the new kernels get group numbers above every
 * existing one.  An unfused function (no kernels) is left alone.  No op is
 * added, removed or moved. */
#include "kernel.h"
#include "passes.h"

PassResult pass_movement_kernels(IrFunc *f, const PassOptions *o, Arena *scratch) {
  (void)o;
  int maxg = 0;
  for (int i = 0; i < f->nops; i++)
    if (f->ops[i]->group > maxg) maxg = f->ops[i]->group;
  if (maxg == 0) return PASS_UNCHANGED;
  const bool *flag = plan_gemm_flags(f, scratch);
  bool changed = false;
  KpViews vs;
  kp_views_find(f, plan_in_group0, NULL, &vs);
  for (bool again = true; again;) {
    again = false;
    for (int i = 0; i < f->nops; i++) {
      IrOp *op = f->ops[i];
      int64_t first;
      bool mover = op->opcode == IR_OP_CONCAT || (op->opcode == IR_OP_SLICE && !plan_range_slice(op, &first)) ||
                   (op->opcode == IR_OP_PERMUTE && !flag[op->result->id]);
      if (op->group != 0 || !mover || kp_view_free_op(&vs, op)) continue;
      op->group = ++maxg;
      again = changed = true;
    }
    if (again) {
      kp_views_free(&vs);
      kp_views_find(f, plan_in_group0, NULL, &vs);
    }
  }
  kp_views_free(&vs);
  return changed ? PASS_CHANGED : PASS_UNCHANGED;
}
