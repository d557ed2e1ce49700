/* grad_copies.c - `grad-copies`: a gradient that cannot accumulate in
 * place gets a copy-accumulate kernel.
 *
 * memplan stores the value feeding a `grad` in the param's gradient
 * buffer, so its producer accumulates (+=, GEMM beta = 1) and K
 * micro-batches add up in place.  That is only right when nothing else
 * reads the value (a reader of the buffer would see the window's running
 * sum) and when the value is computed by a kernel or GEMM at all (not an
 * argument, a const, a window.sum result, a collective's wait).  For every
 * other gradient this pass inserts `%dW.acc = detach %v`, a kernel of its
 * own right after v's definition (after v's whole kernel), which the
 * `grad` then reads; under a last=true reduction (dp-reduce) the copy
 * feeds the reduction's start instead, which then is in the buffer with
 * it.  The common case (a gradient that feeds only its `grad`) needs no
 * extra op.
 *
 * Requires: a function after `grad-unslices` (runs before memplan).
 * Guarantees: every `grad` operand is in place (plan_grad_in_place); the
 * copies get new group numbers above every existing one; the op order
 * stays valid. */
#include <string.h>

#include "passes.h"

/* Index of the op after which a copy of v may run: after v's definition
 * (after its whole kernel), or at the start for an argument. */
static int after_def(const IrFunc *f, const IrValue *v) {
  if (!v->def) return 0;
  int i = 0;
  while (i < f->nops && f->ops[i] != v->def) i++;
  GRADC_ASSERT(i < f->nops);
  int g = v->def->group;
  i++;
  while (g > 0 && i < f->nops && f->ops[i]->group == g) i++;
  return i;
}

PassResult pass_grad_copies(IrFunc *f, const PassOptions *o, Arena *scratch) {
  (void)o;
  int ngrads = 0, maxg = 0;
  for (int i = 0; i < f->nops; i++) {
    ngrads += f->ops[i]->opcode == IR_OP_GRAD;
    if (f->ops[i]->group > maxg) maxg = f->ops[i]->group;
  }
  IrOp **grads = ARENA_ARRAY(scratch, IrOp *, ngrads + 1);
  ngrads = 0;
  for (int i = 0; i < f->nops; i++)
    if (f->ops[i]->opcode == IR_OP_GRAD) grads[ngrads++] = f->ops[i];
  int *uses = ARENA_ARRAY(scratch, int, f->nvalues + ngrads + 1); /* room for the copies */
  ir_count_uses(f, uses);
  bool changed = false;
  for (int i = 0; i < ngrads; i++) {
    IrOp *gop = grads[i];
    if (plan_grad_in_place(gop->args[0], uses)) continue;
    IrOp *at_op = gop;
    for (IrValue *u = gop->args[0]; plan_grad_next(u); u = plan_grad_next(u))
      if (plan_last_coll(u->def) && u->def->opcode == IR_OP_ALL_REDUCE_START) at_op = u->def;
    IrValue *v = at_op->args[0];
    IrValue *c = ir_unary(f, IR_OP_DETACH, v, gop->loc); /* appended at the end */
    c->name = arena_printf(&f->arena, "d%s.acc", ir_attr_get_str(gop, "name", ""));
    IrOp *cop = f->ops[f->nops - 1];
    GRADC_ASSERT(cop->result == c);
    cop->group = ++maxg;
    int at = after_def(f, v);
    memmove(&f->ops[at + 1], &f->ops[at], sizeof(IrOp *) * (size_t)(f->nops - 1 - at));
    f->ops[at] = cop;
    at_op->args[0] = c; /* v keeps its use count: the copy reads it instead */
    uses[c->id] = 1;
    changed = true;
  }
  return changed ? PASS_CHANGED : PASS_UNCHANGED;
}
