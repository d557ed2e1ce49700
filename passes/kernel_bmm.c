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
 * GEMMs use, and which operands are known to be zero on one side of
 * the diagonal (a causal attention's), whose terms the kernel skips;
 * codegen/llvm/llvm_bmm.c emits the kernel and runtime/cpu/exec.c runs
 * it in place of the GEMM. */
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

/* ------------------------------------------------------------------ */
/* Known zeros                                                         */
/* ------------------------------------------------------------------ */

/* Where the matrices of v (its last two axes) are known to hold zeros
 * (KP_ZERO_* bits), from the ops that make it:
 *   - softmax over the last axis of causal_mask(x): e^-inf is 0 above the
 *     diagonal (the CPU's exp returns exactly 0 there, as the
 *     interpreter's does);
 *   - a constant 0: everywhere;
 *   - mul: the zeros of either operand, select and add/sub/neg/cast the
 *     zeros both (all) operands share; an operand broadcast along the
 *     matrix axes brings none;
 *   - a permute swapping the last two axes swaps lower and upper, one
 *     keeping them keeps them, a reshape keeping them keeps them.
 * mul's rule takes 0 * x as 0, so a product that skips such zeros
 * differs from the full one only where the other operand holds an inf
 * or a NaN (0 * inf is NaN).  The walk stops after `depth` ops. */
static unsigned known_zeros(const IrValue *v, int depth);

static unsigned flip_zeros(unsigned z) { return (z & KP_ZERO_LOWER) << 1 | (z & KP_ZERO_UPPER) >> 1; }

static bool zero_const(const IrValue *x) {
  return x->def && x->def->opcode == IR_OP_CONST && ir_attr_get_float(x->def, "value", 1.0) == 0.0;
}

/* The zeros operand x brings to a result of shape r: none where x is
 * broadcast along the matrix axes (a zero constant is zero everywhere). */
static unsigned operand_zeros(const IrValue *x, const IrShape *r, int depth) {
  const IrShape *s = &x->type.shape;
  bool whole = s->rank >= 2 && s->dim[s->rank - 1] == r->dim[r->rank - 1] && s->dim[s->rank - 2] == r->dim[r->rank - 2];
  if (zero_const(x)) return KP_ZERO_LOWER | KP_ZERO_UPPER;
  return whole ? known_zeros(x, depth) : 0;
}

static unsigned known_zeros(const IrValue *v, int depth) {
  const IrOp *d = v->def;
  const IrShape *s = &v->type.shape;
  if (!d || depth <= 0 || s->rank < 2 || !ir_dtype_is_float(v->type.dtype)) return 0;
  const int r = s->rank;
  const IrOpcode op = d->opcode;
  if (op == IR_OP_CONST) return zero_const(v) ? KP_ZERO_LOWER | KP_ZERO_UPPER : 0;
  if (op == IR_OP_SOFTMAX) {
    int64_t axis = ir_attr_get_int(d, "axis", -1);
    const IrValue *x = d->args[0];
    return (axis == r - 1 || axis == -1) && x->def && x->def->opcode == IR_OP_CAUSAL_MASK ? KP_ZERO_LOWER : 0;
  }
  if (op == IR_OP_MUL) return operand_zeros(d->args[0], s, depth - 1) | operand_zeros(d->args[1], s, depth - 1);
  if (op == IR_OP_SELECT) return operand_zeros(d->args[1], s, depth - 1) & operand_zeros(d->args[2], s, depth - 1);
  if (op == IR_OP_ADD || op == IR_OP_SUB)
    return operand_zeros(d->args[0], s, depth - 1) & operand_zeros(d->args[1], s, depth - 1);
  if (op == IR_OP_NEG || op == IR_OP_CAST) return operand_zeros(d->args[0], s, depth - 1);
  if (op == IR_OP_PERMUTE) {
    const int64_t *perm;
    if (ir_attr_get_ints(d, "perm", &perm) != r) return 0;
    unsigned z = known_zeros(d->args[0], depth - 1);
    if (perm[r - 2] == r - 2 && perm[r - 1] == r - 1) return z;
    if (perm[r - 2] == r - 1 && perm[r - 1] == r - 2) return flip_zeros(z);
    return 0;
  }
  if (op == IR_OP_RESHAPE) {
    const IrShape *x = &d->args[0]->type.shape;
    bool keeps = x->rank >= 2 && x->dim[x->rank - 1] == s->dim[r - 1] && x->dim[x->rank - 2] == s->dim[r - 2];
    return keeps ? known_zeros(d->args[0], depth - 1) : 0;
  }
  return 0;
}

#define ZEROS_DEPTH 8 /* a causal attention's dS is 5 ops from its softmax */

/* Where no reader of v needs the matrices of v (KP_ZERO_* bits over its
 * last two axes), from what every reader does with them:
 *   - causal_mask(v) replaces v where the column exceeds the row;
 *   - mul(v, z) is 0 wherever z is a known zero (known_zeros), whatever
 *     finite value v holds there, and needs nothing of v where its own
 *     result is dead;
 *   - an elementwise op (add, sub, neg, cast, select's branches) needs v
 *     only where its result is needed, as does a reshape or permute
 *     keeping the last two axes (one swapping them swaps the regions);
 *   - any other reader (a reduction, an output, another product) needs
 *     all of v.
 * A product skipping a dead region stores zeros there, so that the mul
 * rule's "finite" holds.  The walk stops after `depth` ops. */
static unsigned dead_region(const KpViews *vs, const IrValue *v, int depth) {
  const IrShape *s = &v->type.shape;
  if (depth <= 0 || s->rank < 2) return 0;
  const KpUses *u = &vs->uses;
  unsigned dead = KP_ZERO_LOWER | KP_ZERO_UPPER;
  for (int k = u->start[v->id]; k < u->start[v->id] + u->n[v->id] && dead; k++) {
    const IrOp *w = u->op[k];
    const IrValue *y = w->result;
    int arg = u->arg[k];
    /* the reader's result has v's matrices: its regions are v's */
    bool same = y && y->type.shape.rank >= 2 && y->type.shape.dim[y->type.shape.rank - 1] == s->dim[s->rank - 1] &&
                y->type.shape.dim[y->type.shape.rank - 2] == s->dim[s->rank - 2];
    const IrOpcode op = w->opcode;
    unsigned need_not = 0;
    if (!same) {
      /* v broadcast into larger matrices, or a reduction over them */
    } else if (op == IR_OP_CAUSAL_MASK) {
      need_not = arg == 0 ? KP_ZERO_LOWER : 0;
    } else if (op == IR_OP_MUL) {
      need_not = operand_zeros(w->args[1 - arg], s, ZEROS_DEPTH) | dead_region(vs, y, depth - 1);
    } else if ((op == IR_OP_SELECT && arg > 0) || op == IR_OP_ADD || op == IR_OP_SUB || op == IR_OP_NEG ||
               op == IR_OP_CAST || op == IR_OP_RESHAPE) {
      need_not = dead_region(vs, y, depth - 1);
    } else if (op == IR_OP_PERMUTE) {
      const int64_t *perm;
      int r = y->type.shape.rank;
      if (ir_attr_get_ints(w, "perm", &perm) == r) {
        if (perm[r - 2] == r - 2 && perm[r - 1] == r - 1) need_not = dead_region(vs, y, depth - 1);
        else if (perm[r - 2] == r - 1 && perm[r - 1] == r - 2) need_not = flip_zeros(dead_region(vs, y, depth - 1));
      }
    }
    dead &= need_not;
  }
  return dead;
}

/* View x of rank >= 3 as a matrix whose rows are all of its axes but the
 * last (each axis's stride the next one's extent times its stride, axes
 * of extent 1 aside): a batch of rows times one matrix is one product
 * over all of them, as gemm_plan.c folds a left-only batch into M.  False
 * (x unchanged) where the axes do not lie so. */
static bool fold_rows(KpView *x) {
  int r = x->shape.rank;
  int64_t rows = x->shape.dim[r - 2], step = x->stride[r - 2];
  for (int d = r - 3; d >= 0; d--) {
    if (x->shape.dim[d] == 1) continue;
    if (x->stride[d] != rows * step) return false;
    rows *= x->shape.dim[d];
  }
  x->shape.dim[0] = rows;
  x->shape.dim[1] = x->shape.dim[r - 1];
  x->stride[0] = step;
  x->stride[1] = x->stride[r - 1];
  x->shape.rank = 2;
  return true;
}

/* Whether p's matrix takes at most `most` multiply-adds (each size
 * compared first: no overflow). */
static bool macs_within(const KpBmm *p, int64_t most) {
  return p->M <= most && p->N <= most && p->K <= most && p->M * p->N * p->K <= most;
}

/* p as C^T = B^T A^T. */
static void transpose(KpBmm *p) {
  KpBmm t = *p;
  p->azero = flip_zeros(t.bzero), p->bzero = flip_zeros(t.azero);
  p->cdead = flip_zeros(t.cdead);
  p->M = t.N, p->N = t.M;
  p->a = t.b, p->b = t.a;
  p->aoff = t.boff, p->boff = t.aoff;
  p->am = t.bn, p->ak = t.bk;
  p->bk = t.ak, p->bn = t.am;
  p->cm = t.cn, p->cn = t.cm;
  memcpy(p->as, t.bs, sizeof p->as);
  memcpy(p->bs, t.as, sizeof p->bs);
}

int64_t kp_dot_stride(const KpBmm *p) { return (p->K + 15) / 16 * 16 + 16; }

bool kp_bmm_plan(const KpViews *vs, const IrOp *op, KpBmm *out) {
  memset(out, 0, sizeof *out);
  if (op->opcode != IR_OP_MATMUL || op->group != 0) return false;
  const IrValue *A = op->args[0], *B = op->args[1], *C = op->result;
  if (A->type.dtype != IR_DT_F32 || B->type.dtype != IR_DT_F32 || C->type.dtype != IR_DT_F32) return false;
  KpView va, vb, vc;
  if (!kp_view_in(vs, A, &va) || !kp_view_in(vs, B, &vb) || !kp_view_out(vs, C, &vc)) return false;
  int ra = va.shape.rank, rb = vb.shape.rank, rc = vc.shape.rank;
  /* Both operands batched, or a single product: a product with one
   * matrix on the right is one product over all rows of the left where
   * its rows and the result's fold into one axis each (x @ W over
   * [B, T, C]). */
  bool fold = ra >= 3 && rb == 2 && rc == ra;
  for (int d = 0; fold && d < ra - 2; d++) fold = va.shape.dim[d] == vc.shape.dim[d];
  if (fold) {
    KpView fa = va, fc = vc;
    fold = fold_rows(&fa) && fold_rows(&fc);
    if (fold) {
      va = fa, vc = fc;
      ra = rc = 2;
    }
  }
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
  /* Known zeros are the IR matrices' (a folded A's rows are not one matrix's). */
  out->azero = fold ? 0 : known_zeros(A, ZEROS_DEPTH);
  out->bzero = known_zeros(B, ZEROS_DEPTH);
  /* Dead regions of a batch written whole into its own buffer: another
   * value's readers would see the zeros through a view. */
  if (!single && !out->acc && vc.root == C && C->storage == IR_STORE_ARENA)
    out->cdead = dead_region(vs, C, ZEROS_DEPTH);
  int64_t most = out->azero || out->bzero || out->cdead ? KP_BMM_MAX_MACS_ZEROS : KP_BMM_MAX_MACS;
  if (!single && !macs_within(out, most)) return false;
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
  /* Few columns summed over a long K with A's rows in place (logits, h
   * W): dot products along K, whatever the size (the library runs these
   * at a fraction of its speed; docs/DECISIONS.md "Logits as dot
   * products"). */
  if (single && !narrow && out->K > KP_SKINNY && out->N <= KP_SKINNY && out->ak == 1 && out->cn == 1) {
    out->dot = true;
    return out->N * kp_dot_stride(out) <= KP_BMM_MAX_PANEL;
  }
  /* A small product summing over more than KP_SKINNY, which the kernel
   * multiplies faster than the library at these sizes: a weight gradient
   * (A transposed, x^T dy over a batch's rows), a layer's x @ W and its
   * dy W^T (docs/DECISIONS.md "Small weight gradients", "Small products
   * of every layout").  Not one of at most KP_SKINNY columns with A in
   * place (a classifier's logits): its one-vector tiles lost to oneDNN
   * on an Intel Xeon (docs/BACKEND.md "Small and skinny products"). */
  bool small = single && !narrow && out->M > 1 && out->K > KP_SKINNY && (out->am == 1 || out->N > KP_SKINNY) &&
               macs_within(out, KP_BMM_MAX_SMALL_MACS);
  if (single && out->K > KP_SKINNY && !narrow && !small) return false;
  /* A short sum into a gradient buffer stays a GEMM: the GEMM stores its
   * first micro-batch (exec.c plan_zeroing), where the kernel would add
   * into a zeroed buffer, twice the stores of a product that is its
   * stores.  (A narrow product's C is at most 16 columns; a small
   * product's sum is long.) */
  if (single && out->acc && !narrow && !small) return false;
  bool direct = out->bn == 1 && out->N % 16 == 0; /* B's rows are read in place, no panel */
  return direct || (out->K <= KP_BMM_MAX_PANEL && out->K * ((out->N + 15) / 16 * 16) <= KP_BMM_MAX_PANEL);
}
