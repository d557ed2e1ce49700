/* weight_grad_gemm.c - `weight-grad-gemm`: a batched weight gradient
 * becomes one GEMM over all rows.
 *
 * The weight gradient of x[b..., T, C] @ W[C, F] comes out of autodiff as
 *   sum(matmul(permute(x, swap last two), dy[b..., T, F]), axes = the batch axes)
 * : a batch of [C, F] GEMMs over T rows each, written whole to memory and
 * then summed.  With the batch and T axes merged it is one GEMM over all
 * rows, x^T[C, b*T] @ dy[b*T, F], which the BLAS runs faster, needs no
 * [b..., C, F] temporary and no sum kernel, and writes straight into the
 * gradient buffer (memplan):
 *   reshape(matmul(permute(reshape(x, [b*T, C]), [1,0]), reshape(dy, [b*T, F])), the sum's shape)
 *
 * Requires: a verified function (runs before `fuse`, on ungrouped ops).
 * Guarantees: only a sum whose operand is a batched matmul read by the sum
 * alone, with both operands of the same batch dims (no broadcasting), the
 * left one a transpose of the last two axes and dy not one (it would have
 * to be materialised to be reshaped), and the sum over exactly the batch
 * axes, is rewritten; the new ops take the sum's place, and the sum, the
 * batched matmul and a transpose read by nothing else go.  The op order
 * stays valid (the new ops read only values defined before the matmul). */
#include "passes.h"

PassResult pass_weight_grad_gemm(IrFunc *f, const PassOptions *o, Arena *scratch) {
  (void)o;
  int nv = f->nvalues;
  int *uses = ARENA_ARRAY(scratch, int, nv + 1);
  ir_count_uses(f, uses);
  for (int i = 0; i < f->nops; i++) f->ops[i]->mark = 0;
  bool changed = false;
  int n0 = f->nops;
  for (int i = 0; i < n0; i++) {
    IrOp *s = f->ops[i];
    if (s->opcode != IR_OP_SUM || s->mark) continue;
    IrValue *x = s->args[0];
    IrOp *mm = x->def;
    if (x->id >= nv || !mm || mm->opcode != IR_OP_MATMUL || uses[x->id] != 1) continue;
    IrValue *a = mm->args[0], *b = mm->args[1];
    int r = a->type.shape.rank;
    if (r < 3 || b->type.shape.rank != r || !rw_is_transpose(a->def) || rw_is_transpose(b->def)) continue;
    bool ok = true;
    for (int k = 0; k < r - 2; k++) ok &= a->type.shape.dim[k] == b->type.shape.dim[k];
    const int64_t *axes;
    int na = ir_attr_get_ints(s, "axes", &axes);
    bool red[IR_MAX_RANK] = {false};
    for (int k = 0; k < na; k++) {
      int64_t ax;
      if (!ir_norm_axis(axes[k], r, &ax)) ok = false;
      else red[ax] = true;
    }
    for (int k = 0; k < r; k++) ok &= red[k] == (k < r - 2);
    if (!ok) continue;
    IrValue *x0 = a->def->args[0]; /* [b..., T, C] */
    int64_t rows = 1;
    for (int k = 0; k < r - 1; k++) rows *= x0->type.shape.dim[k];
    int64_t C = x0->type.shape.dim[r - 1], F = b->type.shape.dim[r - 1];
    int before = f->nops;
    IrValue *x2 = ir_reshape(f, x0, ir_shape_make(2, (int64_t[]){rows, C}), mm->loc);
    IrValue *xt = ir_permute(f, x2, (int64_t[]){1, 0}, mm->loc);
    IrValue *dy2 = ir_reshape(f, b, ir_shape_make(2, (int64_t[]){rows, F}), mm->loc);
    IrValue *w = ir_matmul(f, xt, dy2, mm->loc);
    if (!ir_shape_eq(&w->type.shape, &s->result->type.shape)) w = ir_reshape(f, w, s->result->type.shape, s->loc);
    if (!w->name) w->name = s->result->name;
    /* The new ops take the sum's place; the sum, the batched matmul and a
     * transpose read by nothing else go. */
    rw_splice(f, i, before);
    int added = f->nops - before;
    i += added;
    n0 += added;
    ir_replace_uses(f, s->result, w);
    s->mark = 1;
    mm->mark = 1;
    if (--uses[a->id] == 0) a->def->mark = 1;
    changed = true;
  }
  if (changed) ir_func_remove_marked(f);
  return changed ? PASS_CHANGED : PASS_UNCHANGED;
}
