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
 * A bias gradient, sum(dy) over [B, T] of dy : [B, T, C], is a kernel of
 * its own that reads dy back from memory.  Summed over T first (a column
 * sum, kp_op_colsum: keepdim, over the axis before the row), the first
 * step joins dy's producer as a row kernel whose parallel iterations are
 * groups of T rows, and the B x C partial sums are summed over B after.
 * Unless PassOptions.no_colsums (the CUDA generator's row kernels have no
 * column sums).
 *
 * Requires: a verified function (runs before `fuse`, on ungrouped ops).
 * Guarantees: every sum, mean or max of an operand of rank >= 2, with at
 * least SPLIT_MIN_ELEMS elements and a last axis of at least 8, reducing
 * the last axis and at least one other, is replaced in place by the two
 * reductions (keepdim as the original's; the second takes its name); so
 * is every sum of such an operand (f32 or f64) that keeps the last axis,
 * reduces the one before it and at least one more, whose first step
 * would be a column sum (the second reduces the original axes). */
#include <string.h>

#include "kernel.h"
#include "passes.h"

#define SPLIT_MIN_ELEMS 4096

/* A sum keeping the last axis, reducing the one before it and others,
 * whose sum over the axis before the last alone is a column sum. */
static bool column_split(const IrOp *op, const bool *red, const PassOptions *o) {
  const IrType *t = &op->args[0]->type;
  return !o->no_colsums && op->opcode == IR_OP_SUM && kp_colsum_operand(t) && red[t->shape.rank - 2];
}

PassResult pass_split_reductions(IrFunc *f, const PassOptions *o, Arena *scratch) {
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
    if (!ok || others == 0) continue;
    bool keep = ir_attr_get_int(op, "keepdim", 0) != 0;
    int before = f->nops;
    IrValue *total;
    if (red[r - 1]) {
      int64_t last = r - 1, rest[IR_MAX_RANK];
      int nr = 0;
      for (int k = 0; k < r - 1; k++)
        if (red[k]) rest[nr++] = k;
      IrValue *rows = ir_reduce(f, op->opcode, x, &last, 1, keep, op->loc);
      total = ir_reduce(f, op->opcode, rows, rest, nr, keep, op->loc);
    } else {
      if (others < 2 || !column_split(op, red, o)) continue;
      int64_t col = r - 2, all[IR_MAX_RANK];
      int nall = 0;
      for (int k = 0; k < r; k++)
        if (red[k]) all[nall++] = k;
      IrValue *cols = ir_reduce(f, IR_OP_SUM, x, &col, 1, true, op->loc);
      total = ir_reduce(f, IR_OP_SUM, cols, all, nall, keep, op->loc);
    }
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
