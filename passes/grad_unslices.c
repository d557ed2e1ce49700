/* grad_unslices.c - `grad-unslices`: a group-0 range unslice that cannot
 * be filled in place becomes a kernel of its own.
 *
 * fuse leaves in group 0 the unslices of one contiguous range that feed a
 * gradient (w[l]'s, of a stacked param): they are no work when their
 * operand accumulates straight into that range of the gradient buffer,
 * which memplan arranges for those on the way from a `grad` that is in
 * place (plan_grad_in_place) to its producer, or under a last=true
 * reduction (where `grad-copies` feeds the start when the producer cannot
 * accumulate).  Any other group-0 range unslice (an unfused function's,
 * or one whose gradient has other readers) becomes a kernel.
 *
 * Requires: a function after `split-grad-sums` (runs before memplan).
 * Guarantees: every group-0 contiguous-range unslice left in group 0 is on
 * a gradient chain memplan places in the buffer; the others get new group
 * numbers above every existing one.  No op is added, removed or moved. */
#include "passes.h"

PassResult pass_grad_unslices(IrFunc *f, const PassOptions *o, Arena *scratch) {
  (void)o;
  int maxg = 0;
  for (int i = 0; i < f->nops; i++)
    if (f->ops[i]->group > maxg) maxg = f->ops[i]->group;
  int *uses = ARENA_ARRAY(scratch, int, f->nvalues + 1);
  ir_count_uses(f, uses);
  for (int i = 0; i < f->nops; i++) f->ops[i]->mark = 0;
  int64_t first;
  for (int i = 0; i < f->nops; i++) {
    IrOp *gop = f->ops[i];
    if (gop->opcode != IR_OP_GRAD) continue;
    bool reduced = false;
    for (IrValue *v = gop->args[0]; plan_grad_next(v); v = plan_grad_next(v)) reduced |= plan_last_coll(v->def);
    if (!reduced && !plan_grad_in_place(gop->args[0], uses)) continue;
    for (IrValue *v = gop->args[0]; plan_grad_next(v); v = plan_grad_next(v)) v->def->mark = 1;
  }
  bool changed = false;
  for (int i = 0; i < f->nops; i++) {
    IrOp *op = f->ops[i];
    if (plan_range_unslice(op, &first) && !op->mark) {
      op->group = ++maxg;
      changed = true;
    }
    op->mark = 0;
  }
  return changed ? PASS_CHANGED : PASS_UNCHANGED;
}
