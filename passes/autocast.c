/* autocast.c - mixed precision: f32 GEMMs in bf16 or f16 (--precision).
 *
 * What PyTorch's autocast does, as a rewrite of the forward graph: every
 * matmul of two f32 operands (the model's own, and the GEMMs that conv1d
 * and conv2d lower to) becomes
 *
 *     %a16 = cast %a : bf16[..]          (round to nearest even)
 *     %b16 = cast %b : bf16[..]
 *     %y16 = matmul %a16, %b16 : bf16[..] (the GEMM accumulates in f32)
 *     %y   = cast %y16 : f32[..]
 *
 * and everything else (reductions, norms, softmax, the losses, window
 * weights, the optimiser) stays f32.  Params stay f32 (the master weights)
 * and so do their gradients: autodiff derives the backward from the casts,
 * so the backward GEMMs run in the low type too (dY cast down once per
 * product, dA and dB cast back up before they are accumulated in f32).
 *
 * An operand reached through data movement (reshape, permute, slice) is
 * cast where the movement starts, and moved in the low type:
 *
 *     cast(permute(slice(%qkv))) -> permute(slice(cast %qkv))
 *
 * which is exact (movement copies values) and moves half the bytes; the
 * casts of several slices of one value are one cast.  When the start is
 * itself a widened low value, cast(cast(%x16 : f32) : bf16) is %x16
 * (widening is exact, so narrowing back gives %x16 again): attention's
 * heads go from one bf16 GEMM to the next without a round trip through
 * f32.  A low value read by several ops sums its gradient's parts in the
 * low type, as PyTorch's autocast does; the parts here (slices of qkv)
 * are disjoint, so the sums add zeros.
 *
 * The loss scale of f16 is not this pass's business: gas-fold puts it on
 * the seeds (DESIGN.md §3 rule 1).
 *
 * Requires: the forward function, before autodiff.  Guarantees: no matmul
 * with f32 operands is left when PassOptions.precision is bf16 or f16;
 * with f32 (the default) nothing changes. */
#include "passes.h"

static bool moves(const IrOp *op) {
  return op->opcode == IR_OP_RESHAPE || op->opcode == IR_OP_PERMUTE || op->opcode == IR_OP_SLICE;
}

/* a in the low type: the movement that produced a replayed on its start
 * cast down (memo: by value id, the values of f before the pass). */
static IrValue *narrow(IrFunc *f, IrValue *a, IrDType low, IrLoc loc, IrValue **memo, int nmemo) {
  if (a->id < nmemo && memo[a->id]) return memo[a->id];
  const IrOp *d = a->def;
  IrValue *r;
  if (d && d->opcode == IR_OP_CAST && d->args[0]->type.dtype == low)
    r = d->args[0];
  else if (d && moves(d))
    r = ir_emit(f, d->opcode, (IrValue *[]){narrow(f, d->args[0], low, loc, memo, nmemo)}, 1, d->attrs, d->nattrs,
                NULL, d->loc);
  else
    r = ir_cast(f, a, low, loc);
  if (a->id < nmemo) memo[a->id] = r;
  return r;
}

PassResult pass_autocast(IrFunc *f, const PassOptions *o, Arena *scratch) {
  IrDType low = o->precision;
  if (low != IR_DT_BF16 && low != IR_DT_F16) return PASS_UNCHANGED;
  for (int i = 0; i < f->nops; i++)
    if (f->ops[i]->opcode == IR_OP_GRAD) return PASS_UNCHANGED; /* after autodiff: too late, and not needed */
  int nops = f->nops, changed = 0, nmemo = f->nvalues;
  IrValue **memo = ARENA_ARRAY(scratch, IrValue *, nmemo + 1);
  for (int i = 0; i < nops; i++) f->ops[i]->mark = 0;
  for (int i = 0; i < nops; i++) {
    IrOp *op = f->ops[i];
    if (op->opcode != IR_OP_MATMUL || op->args[0]->type.dtype != IR_DT_F32 || op->args[1]->type.dtype != IR_DT_F32)
      continue;
    IrValue *a = narrow(f, op->args[0], low, op->loc, memo, nmemo);
    IrValue *b = narrow(f, op->args[1], low, op->loc, memo, nmemo);
    IrValue *y = ir_cast(f, ir_matmul(f, a, b, op->loc), IR_DT_F32, op->loc);
    ir_replace_uses(f, op->result, y);
    y->name = op->result->name; /* %logits stays %logits */
    op->result->name = NULL;
    op->mark = 1;
    changed++;
  }
  if (!changed) return PASS_UNCHANGED;
  ir_func_remove_marked(f);
  if (!ir_func_topo_sort(f)) GRADC_ASSERT(!"autocast produced a cycle");
  return PASS_CHANGED;
}
