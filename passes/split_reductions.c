/* split_reductions.c - `split-reductions`: a reduction over the last axis
 * and others becomes a row reduction and a small one.
 *
 * sum(x) over all axes (an L2 term's sum(W * W)) is a kernel of one
 * iteration: one thread, and x materialised for it.  Reduced over the last
 * axis first, sum(sum(x, [-1]), the other axes), the first step is a row
 * reduction that fuses with x's producer and with the other readers of
 * x's operands, runs in parallel, and leaves a small vector for the
 * second.  The same for mean and max (both exact in two steps).
 *
 * Requires: a verified function (runs before `fuse`, on ungrouped ops).
 * Guarantees: every sum, mean or max of an operand of rank >= 2, with at
 * least SPLIT_MIN_ELEMS elements and a last axis of at least 8, reducing
 * the last axis and at least one other, is replaced in place by the two
 * reductions (keepdim as the original's; the second takes its name). */
#include <string.h>

#include "passes.h"

#define SPLIT_MIN_ELEMS 4096

PassResult pass_split_reductions(IrFunc *f, const PassOptions *o, Arena *scratch) {
  (void)o;
  (void)scratch;
  bool changed = false;
  int n0 = f->nops;
  for (int i = 0; i < n0; i++) {
    IrOp *op = f->ops[i];
    if (op->opcode != IR_OP_SUM && op->opcode != IR_OP_MEAN && op->opcode != IR_OP_MAX) continue;
    IrValue *x = op->args[0];
    int r = x->type.shape.rank;
    if (r < 2 || ir_numel(&x->type.shape) < SPLIT_MIN_ELEMS || x->type.shape.dim[r - 1] < 8) continue;
    const int64_t *axes;
    int na = ir_attr_get_ints(op, "axes", &axes);
    bool red[IR_MAX_RANK] = {false}, ok = true;
    for (int k = 0; k < na; k++) {
      int64_t a;
      if (!ir_norm_axis(axes[k], r, &a)) ok = false;
      else red[a] = true;
    }
    if (na == 0)
      for (int k = 0; k < r; k++) red[k] = true;
    int others = 0;
    for (int k = 0; k < r - 1; k++) others += red[k];
    if (!ok || !red[r - 1] || others == 0) continue;
    bool keep = ir_attr_get_int(op, "keepdim", 0) != 0;
    int before = f->nops;
    int64_t last = r - 1, rest[IR_MAX_RANK];
    int nr = 0;
    for (int k = 0; k < r - 1; k++)
      if (red[k]) rest[nr++] = k;
    IrValue *rows = ir_reduce(f, op->opcode, x, &last, 1, keep, op->loc);
    IrValue *total = ir_reduce(f, op->opcode, rows, rest, nr, keep, op->loc);
    total->name = op->result->name;
    rw_splice(f, i, before);
    int added = f->nops - before;
    i += added;
    n0 += added;
    ir_replace_uses(f, op->result, total);
    /* The old op, now at i, goes. */
    memmove(f->ops + i, f->ops + i + 1, sizeof(IrOp *) * (size_t)(f->nops - i - 1));
    f->nops--;
    n0--;
    i--;
    changed = true;
  }
  return changed ? PASS_CHANGED : PASS_UNCHANGED;
}
