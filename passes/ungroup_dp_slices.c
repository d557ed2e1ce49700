/* ungroup_dp_slices.c - `ungroup-dp-slices`: the unslice of a stacked
 * param's gradient slice that dp-reduce reduces on its own goes back to
 * group 0.
 *
 * dp-reduce reduces a stacked param's gradient one layer slice at a time:
 * `grad (unslice (all_reduce.wait (all_reduce.start %c)))`, last=true.
 * fuse, which keeps in group 0 only the unslices of a GEMM's or kernel's
 * result, makes this unslice a kernel of its own; it is no work (the
 * reduction runs in the slice's range of the gradient buffer, memplan), so
 * it goes back to group 0.
 *
 * Requires: a fused function (after `schedule`; runs before memplan).
 * Guarantees: only a one-op kernel that is a contiguous-range unslice of a
 * last=true all_reduce.wait changes, to group 0; no op is added, removed
 * or moved. */
#include "kernel.h"
#include "passes.h"

PassResult pass_ungroup_dp_slices(IrFunc *f, const PassOptions *o, Arena *scratch) {
  (void)o;
  (void)scratch;
  bool changed = false;
  int64_t first;
  for (int i = 0; i < f->nops; i++) {
    IrOp *op = f->ops[i];
    int g = op->group;
    if (g == 0 || op->opcode != IR_OP_UNSLICE || !kp_slice_contiguous(op, &first) || !op->args[0]->def ||
        op->args[0]->def->opcode != IR_OP_ALL_REDUCE_WAIT || (i > 0 && f->ops[i - 1]->group == g) ||
        (i + 1 < f->nops && f->ops[i + 1]->group == g) || !plan_last_coll(op->args[0]->def))
      continue;
    op->group = 0;
    changed = true;
  }
  return changed ? PASS_CHANGED : PASS_UNCHANGED;
}
