/* split_cross_entropy.c - `split-cross-entropy`: cross_entropy with
 * reduction="sum" becomes a per-row cross_entropy (reduction="none") and a
 * sum over all its axes, so that the rows run in parallel in a row kernel
 * that `fuse` can share with the backward (which reads the same logits).
 *
 * Requires: a verified function (runs before `fuse`, on ungrouped ops).
 * Guarantees: no cross_entropy with reduction="sum" is left; the new ops
 * take the old op's place (the sum, or the per-row op when the target is a
 * scalar, takes its name), the other attributes are kept. */
#include <string.h>

#include "passes.h"

PassResult pass_split_cross_entropy(IrFunc *f, const PassOptions *o, Arena *scratch) {
  (void)o;
  (void)scratch;
  bool changed = false;
  for (int i = 0; i < f->nops; i++) {
    IrOp *op = f->ops[i];
    if (op->opcode != IR_OP_CROSS_ENTROPY || strcmp(ir_attr_get_str(op, "reduction", "mean"), "sum") != 0) continue;
    IrAttr attrs[8];
    int na = 0;
    for (int k = 0; k < op->nattrs && na < 7; k++)
      if (strcmp(op->attrs[k].key, "reduction") != 0) attrs[na++] = op->attrs[k];
    attrs[na++] = ir_attr_str("reduction", "none");
    int before = f->nops;
    IrValue *rows = ir_emit(f, IR_OP_CROSS_ENTROPY, op->args, 2, attrs, na, NULL, op->loc);
    int64_t axes[IR_MAX_RANK];
    int r = rows->type.shape.rank;
    for (int k = 0; k < r; k++) axes[k] = k;
    IrValue *total = r ? ir_reduce(f, IR_OP_SUM, rows, axes, r, false, op->loc) : rows;
    /* The new ops take the old one's place; it now sits after them. */
    int added = f->nops - before;
    GRADC_ASSERT(added >= 1 && added <= 2);
    rw_splice(f, i, before);
    /* Hand its uses over and drop it. */
    IrValue *old = op->result;
    if (old->name && !total->name) total->name = old->name;
    ir_replace_uses(f, old, total);
    memmove(f->ops + i + added, f->ops + i + added + 1, sizeof(IrOp *) * (size_t)(f->nops - i - added - 1));
    f->nops--;
    changed = true;
  }
  return changed ? PASS_CHANGED : PASS_UNCHANGED;
}
