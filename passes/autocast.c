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
 * The loss scale of f16 is not this pass's business: gas-fold puts it on
 * the seeds (DESIGN.md §3 rule 1).
 *
 * Requires: the forward function, before autodiff.  Guarantees: no matmul
 * with f32 operands is left when PassOptions.precision is bf16 or f16;
 * with f32 (the default) nothing changes. */
#include "passes.h"

PassResult pass_autocast(IrFunc *f, const PassOptions *o, Arena *scratch) {
  (void)scratch;
  IrDType low = o->precision;
  if (low != IR_DT_BF16 && low != IR_DT_F16) return PASS_UNCHANGED;
  for (int i = 0; i < f->nops; i++)
    if (f->ops[i]->opcode == IR_OP_GRAD) return PASS_UNCHANGED; /* after autodiff: too late, and not needed */
  int nops = f->nops, changed = 0;
  for (int i = 0; i < nops; i++) f->ops[i]->mark = 0;
  for (int i = 0; i < nops; i++) {
    IrOp *op = f->ops[i];
    if (op->opcode != IR_OP_MATMUL || op->args[0]->type.dtype != IR_DT_F32 || op->args[1]->type.dtype != IR_DT_F32)
      continue;
    IrValue *a = ir_cast(f, op->args[0], low, op->loc), *b = ir_cast(f, op->args[1], low, op->loc);
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
