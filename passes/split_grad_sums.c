/* split_grad_sums.c - `split-grad-sums`: a gradient that is a sum of two
 * contributions becomes two `grad` outputs naming the same param.
 *
 * grad(add(p, q)), p and q of the sum's type, each read only by the sum
 * and each able to accumulate in place (plan_grad_in_place: a weight decay
 * term plus a GEMM, a tied embedding's two uses), becomes grad(p) and
 * grad(q): memplan stores both in the one gradient buffer, both producers
 * add into it, and the full-size temporary the sum would have needed (a
 * GEMM's result waiting for a kernel) is gone.  Repeated while the
 * contributions are sums themselves.
 *
 * Requires: a fused function after `ungroup-dp-slices` (runs before
 * memplan).
 * Guarantees: the sums so split are removed, the new `grad` sits right
 * after the one it came from, with its attributes; the parts keep the
 * gradient's name where they have none (%dW, %dW.1).  Nothing else
 * changes. */
#include <string.h>

#include "passes.h"

PassResult pass_split_grad_sums(IrFunc *f, const PassOptions *o, Arena *scratch) {
  (void)o;
  for (int i = 0; i < f->nops; i++) f->ops[i]->mark = 0;
  int *uses = ARENA_ARRAY(scratch, int, f->nvalues + 1);
  ir_count_uses(f, uses);
  bool removed = false;
  for (int i = 0; i < f->nops; i++) {
    IrOp *gop = f->ops[i];
    if (gop->opcode != IR_OP_GRAD) continue;
    IrValue *v = gop->args[0];
    IrOp *sum = v->def;
    if (!sum || sum->opcode != IR_OP_ADD || uses[v->id] != 1) continue;
    IrValue *p = sum->args[0], *q = sum->args[1];
    if (p == q || !ir_type_eq(&p->type, &v->type) || !ir_type_eq(&q->type, &v->type)) continue;
    if (!plan_grad_in_place(p, uses) || !plan_grad_in_place(q, uses)) continue;
    char err[256];
    IrOp *gq = ir_build(f, IR_OP_GRAD, &q, 1, gop->attrs, gop->nattrs, NULL, gop->loc, err, sizeof err);
    GRADC_ASSERT(gq && f->ops[f->nops - 1] == gq);
    memmove(&f->ops[i + 2], &f->ops[i + 1], sizeof(IrOp *) * (size_t)(f->nops - 2 - i));
    f->ops[i + 1] = gq;
    gop->args[0] = p;
    /* The parts keep the gradient's name where they have none (%dW, %dW.1). */
    if (!p->name) p->name = v->name;
    if (!q->name) q->name = v->name;
    uses[v->id] = 0;
    sum->mark = 1;
    removed = true;
    i--; /* p may be a sum too */
  }
  if (removed) ir_func_remove_marked(f);
  return removed ? PASS_CHANGED : PASS_UNCHANGED;
}
