/* kernel_bmm.c - small and skinny products as generated kernels
 * (kernel.h's KpBmm, docs/BACKEND.md "Small and skinny products").
 *
 * Attention's products are batches of small matrices read out of `qkv`
 * and written into `[B, T, C]` as strided views.  A BLAS takes such a
 * batch badly: oneDNN runs strided batches with its gemm:jit kernels,
 * 50-67 us for tinygpt small's 32 heads of 32x32x16 in a step, where
 * the multiply-adds alone are ~8 us of one core.  A single product with
 * 10 columns or a sum over 10 (an MLP's logits, their gradients) fares
 * as badly: 18-49 GFLOP/s.  So the CPU back end generates these products
 * itself, reading the views directly.  This file decides which matmuls
 * qualify and derives their strides from the same views the executor's
 * GEMMs use; codegen/llvm/llvm_bmm.c emits the kernel and
 * runtime/cpu/exec.c runs it in place of the GEMM. */
#include <string.h>

#include "kernel.h"

/* The value whose bytes v uses (through reshape aliases), as the executor
 * finds a GEMM's result buffer. */
static const IrValue *storage_root(const IrValue *v) {
  while (v->storage == IR_STORE_ALIAS && v->def && v->def->opcode == IR_OP_RESHAPE) v = v->def->args[0];
  return v;
}

/* Batch axis d of the result (of nbatch) in view x (of rank r, its
 * batch axes right-aligned): x's stride, 0 where x broadcasts. */
static int64_t batch_stride(const KpView *x, int nbatch, int d) {
  int a = d - (nbatch - (x->shape.rank - 2));
  return a >= 0 && x->shape.dim[a] != 1 ? x->stride[a] : 0;
}

/* p as C^T = B^T A^T. */
static void transpose(KpBmm *p) {
  KpBmm t = *p;
  p->M = t.N, p->N = t.M;
  p->a = t.b, p->b = t.a;
  p->aoff = t.boff, p->boff = t.aoff;
  p->am = t.bn, p->ak = t.bk;
  p->bk = t.ak, p->bn = t.am;
  p->cm = t.cn, p->cn = t.cm;
  memcpy(p->as, t.bs, sizeof p->as);
  memcpy(p->bs, t.as, sizeof p->bs);
}

bool kp_bmm_plan(const KpViews *vs, const IrOp *op, KpBmm *out) {
  memset(out, 0, sizeof *out);
  if (op->opcode != IR_OP_MATMUL || op->group != 0) return false;
  const IrValue *A = op->args[0], *B = op->args[1], *C = op->result;
  if (A->type.dtype != IR_DT_F32 || B->type.dtype != IR_DT_F32 || C->type.dtype != IR_DT_F32) return false;
  KpView va, vb, vc;
  if (!kp_view_in(vs, A, &va) || !kp_view_in(vs, B, &vb) || !kp_view_out(vs, C, &vc)) return false;
  int ra = va.shape.rank, rb = vb.shape.rank, rc = vc.shape.rank;
  /* Both operands batched, or a single product: a product with one
   * matrix on the right is one GEMM over all rows of the left (gemm_plan.c
   * folds it). */
  bool single = ra == 2 && rb == 2 && rc == 2;
  if (!single && (ra < 3 || rb < 3 || ra > rc || rb > rc)) return false;
  if (va.root->storage == IR_STORE_NONE || vb.root->storage == IR_STORE_NONE || vc.root->storage == IR_STORE_NONE)
    return false;
  out->acc = storage_root(vc.root)->storage == IR_STORE_GRAD;
  out->M = va.shape.dim[ra - 2];
  out->K = va.shape.dim[ra - 1];
  out->N = vb.shape.dim[rb - 1];
  if (vb.shape.dim[rb - 2] != out->K || vc.shape.dim[rc - 2] != out->M || vc.shape.dim[rc - 1] != out->N) return false;
  if (out->M < 1 || out->N < 1 || out->K < 1) return false;
  if (!single && (out->M > KP_BMM_MAX_MACS || out->N > KP_BMM_MAX_MACS || out->K > KP_BMM_MAX_MACS ||
                  out->M * out->N * out->K > KP_BMM_MAX_MACS)) /* (each first: no overflow) */
    return false;
  out->nbatch = rc - 2;
  out->nb = 1;
  for (int d = 0; d < out->nbatch; d++) {
    out->bdim[d] = vc.shape.dim[d];
    out->nb *= out->bdim[d];
    /* an operand's batch axis is the result's or broadcasts */
    int a = d - (out->nbatch - (ra - 2)), b = d - (out->nbatch - (rb - 2));
    if (a >= 0 && va.shape.dim[a] != 1 && va.shape.dim[a] != out->bdim[d]) return false;
    if (b >= 0 && vb.shape.dim[b] != 1 && vb.shape.dim[b] != out->bdim[d]) return false;
    out->as[d] = batch_stride(&va, out->nbatch, d);
    out->bs[d] = batch_stride(&vb, out->nbatch, d);
    out->cs[d] = vc.stride[d];
  }
  if (!single && out->nb < 2) return false;
  out->a = va.root, out->b = vb.root, out->c = vc.root;
  out->aoff = va.offset, out->boff = vb.offset, out->coff = vc.offset;
  out->am = va.stride[ra - 2], out->ak = va.stride[ra - 1];
  out->bk = vb.stride[rb - 2], out->bn = vb.stride[rb - 1];
  out->cm = vc.stride[rc - 2];
  out->cn = vc.stride[rc - 1];
  bool narrow = false;
  if (out->N > 1 && out->cn != 1) {
    /* C written down its columns (a transposed view): C^T = B^T A^T,
     * whose rows have the unit stride. */
    if (out->M > 1 && out->cm != 1) return false;
    transpose(out);
  } else if (single && out->K > KP_SKINNY && out->N <= KP_SKINNY && out->am == 1 && out->M % 16 == 0) {
    /* Few columns, A transposed: C^T's rows are whole vectors of A's
     * rows, read in place. */
    transpose(out);
    narrow = true;
  }
  if (single && out->K > KP_SKINNY && !narrow) return false;
  /* A short sum into a gradient buffer stays a GEMM: the GEMM stores its
   * first micro-batch (exec.c plan_zeroing), where the kernel would add
   * into a zeroed buffer, twice the stores of a product that is its
   * stores.  (A narrow product's C is at most 16 columns.) */
  if (single && out->acc && !narrow) return false;
  bool direct = out->bn == 1 && out->N % 16 == 0; /* B's rows are read in place, no panel */
  return direct || (out->K <= KP_BMM_MAX_PANEL && out->K * ((out->N + 15) / 16 * 16) <= KP_BMM_MAX_PANEL);
}
