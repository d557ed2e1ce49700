/* gemm_plan.c - a matmul op as BLAS calls (gemm_plan.h), the one plan
 * that the CPU executor, the CUDA executor and the bench's GEMM floor
 * share: torch.matmul semantics (rank-1 operands as a row or a column,
 * broadcast batch dims as a loop of calls), a group-0 transpose of the
 * last two axes as a flag, a left-only batch folded into M, and per call
 * the element offsets of its three matrices from their roots.
 *
 * Two entries: rt_gemm_plan_views reads operands and result through the
 * strided views of codegen/kernel.c (f32 and f64 in the executors);
 * rt_gemm_plan_ir reads the IR alone, every matrix contiguous (bf16 and
 * f16 in the executors, and the floor, which plans without views).  What
 * each caller checks beyond these (dtypes, the BLAS's 2^31 limits) and
 * what it does with the plan stays with the caller. */
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "gemm_plan.h"

bool rt_op_fail(char *err, size_t n, const IrOp *op, const char *what) {
  const char *name = ir_op_info[op->opcode].name;
  if (op->loc.file) return errf(err, n, "%s:%d:%d: '%s' %s", op->loc.file, op->loc.line, op->loc.col, name, what);
  return errf(err, n, "'%s' %s", name, what);
}

bool rt_is_flag_permute(const IrValue *v) {
  const IrOp *d = v->def;
  if (!d || d->group != 0 || d->opcode != IR_OP_PERMUTE || v->storage != IR_STORE_NONE) return false;
  const int64_t *perm;
  int n = ir_attr_get_ints(d, "perm", &perm);
  if (n < 2 || n != v->type.shape.rank) return false;
  for (int i = 0; i < n - 2; i++)
    if (perm[i] != i) return false;
  return perm[n - 2] == n - 1 && perm[n - 1] == n - 2;
}

const IrValue *rt_storage_root(const IrValue *v) {
  while (v->storage == IR_STORE_ALIAS && v->def && v->def->opcode == IR_OP_RESHAPE) v = v->def->args[0];
  return v;
}

void rt_gemm_plan_free(RtGemmPlan *g) {
  free(g->aoff);
  free(g->boff);
  free(g->coff);
  g->aoff = g->boff = g->coff = NULL;
}

void rt_gemm_batch_index(const IrShape *batch, const IrShape *ob, int64_t *out) {
  int64_t nb = ir_numel(batch);
  int64_t idx[IR_MAX_RANK] = {0};
  int lead = batch->rank - ob->rank;
  for (int64_t t = 0; t < nb; t++) {
    int64_t o = 0;
    for (int k = 0; k < ob->rank; k++) o = o * ob->dim[k] + (ob->dim[k] == 1 ? 0 : idx[lead + k]);
    out[t] = o;
    for (int k = batch->rank - 1; k >= 0; k--) {
      if (++idx[k] < batch->dim[k]) break;
      idx[k] = 0;
    }
  }
}

bool rt_gemm_grid(const int64_t *const off[3], int64_t nb, RtGemmGrid *g) {
  if (nb < 2) return false;
  int64_t n2 = nb; /* the shortest run of equal steps of the three */
  for (int k = 0; k < 3; k++) {
    int64_t r = 1;
    while (r < nb && off[k][r] - off[k][r - 1] == off[k][1] - off[k][0]) r++;
    if (r < n2) n2 = r;
  }
  if (nb % n2) return false;
  g->n1 = nb / n2;
  g->n2 = n2;
  for (int k = 0; k < 3; k++) {
    g->s2[k] = n2 > 1 ? off[k][1] - off[k][0] : 0;
    g->s1[k] = g->n1 > 1 ? off[k][n2] - off[k][0] : 0;
    if (g->s1[k] < 0 || g->s2[k] < 0) return false; /* a BLAS's batch strides are not negative */
    for (int64_t t = 0; t < nb; t++)
      if (off[k][t] != off[k][0] + t / n2 * g->s1[k] + t % n2 * g->s2[k]) return false;
  }
  if (n2 == nb) { /* one level: as the outer one, which pieces split */
    g->n1 = nb;
    g->n2 = 1;
    for (int k = 0; k < 3; k++) {
      g->s1[k] = g->s2[k];
      g->s2[k] = 0;
    }
  }
  return true;
}

static void alloc_offsets(RtGemmPlan *g) {
  g->aoff = mem_calloc((size_t)g->nb, sizeof(int64_t));
  g->boff = mem_calloc((size_t)g->nb, sizeof(int64_t));
  g->coff = mem_calloc((size_t)g->nb, sizeof(int64_t));
}

/* ------------------------------------------------------------------ */
/* Through views                                                       */
/* ------------------------------------------------------------------ */

/* A rank-1 operand as a matrix: a row ([K] as [1, K]) or a column. */
static void view_unit_axis(KpView *v, int pos) {
  int r = v->shape.rank;
  for (int k = r; k > pos; k--) {
    v->shape.dim[k] = v->shape.dim[k - 1];
    v->stride[k] = v->stride[k - 1];
  }
  v->stride[pos] = pos < r ? v->stride[pos + 1] * v->shape.dim[pos + 1] : 1;
  v->shape.dim[pos] = 1;
  v->shape.rank = r + 1;
}

/* Whether the view's axes [0, last] are one run of rows `ld` apart. */
static bool rows_collapse(const KpView *v, int last, int64_t ld) {
  int64_t want = ld;
  for (int k = last; k >= 0; k--) {
    if (v->shape.dim[k] != 1 && v->stride[k] != want) return false;
    want *= v->shape.dim[k];
  }
  return true;
}

/* Offset of batch matrix t: the view's batch axes right-aligned to the
 * result's batch shape, broadcast axes (size 1) repeating their matrix. */
static int64_t batch_offset(const KpView *v, const IrShape *batch, int64_t t) {
  int vb = v->shape.rank - 2, lead = batch->rank - vb;
  int64_t off = v->offset;
  for (int k = batch->rank - 1; k >= 0; k--) {
    int64_t i = t % batch->dim[k];
    t /= batch->dim[k];
    int a = k - lead;
    if (a >= 0 && v->shape.dim[a] != 1) off += i * v->stride[a];
  }
  return off;
}

bool rt_gemm_plan_views(const KpViews *vs, const IrOp *op, RtGemmPlan *g, char *err, size_t n) {
  memset(g, 0, sizeof *g);
  KpView va, vb, vc;
  if (!kp_view_in(vs, op->args[0], &va) || !kp_view_in(vs, op->args[1], &vb) || !kp_view_out(vs, op->result, &vc))
    return rt_op_fail(err, n, op, "has an operand or result that is not a strided view");
  if (va.root->storage == IR_STORE_NONE || vb.root->storage == IR_STORE_NONE || vc.root->storage == IR_STORE_NONE)
    return rt_op_fail(err, n, op, "has an operand or result without storage (run memplan)");
  bool a1 = va.shape.rank == 1, b1 = vb.shape.rank == 1;
  if (a1) view_unit_axis(&va, 0);
  if (b1) view_unit_axis(&vb, 1);
  if (a1) view_unit_axis(&vc, vc.shape.rank - (b1 ? 0 : 1));
  if (b1) view_unit_axis(&vc, vc.shape.rank);
  int ra = va.shape.rank, rb = vb.shape.rank, rc = vc.shape.rank;
  g->M = va.shape.dim[ra - 2];
  g->K = va.shape.dim[ra - 1];
  g->N = vb.shape.dim[rb - 1];
  if (vb.shape.dim[rb - 2] != g->K) return rt_op_fail(err, n, op, "has mismatched inner dimensions");
  if (rc < 2 || vc.shape.dim[rc - 2] != g->M || vc.shape.dim[rc - 1] != g->N)
    return rt_op_fail(err, n, op, "has a result of the wrong size");
  if (!kp_view_matrix(&va, &g->ta, &g->lda) || !kp_view_matrix(&vb, &g->tb, &g->ldb) ||
      !kp_view_matrix(&vc, &g->tc, &g->ldc))
    return rt_op_fail(err, n, op, "has a view with no unit stride in its last two axes");
  IrShape batch = ir_shape_make(rc - 2, vc.shape.dim);
  g->nb = ir_numel(&batch);
  g->a = va.root, g->b = vb.root, g->c = vc.root;
  g->rows = g->M;
  /* Only the left operand batched, its rows and the result's one run: one
   * GEMM over all rows. */
  if (rb == 2 && ra > 2 && !g->ta && !g->tc && rows_collapse(&va, ra - 2, g->lda) &&
      rows_collapse(&vc, rc - 2, g->ldc)) {
    g->M *= g->nb;
    g->nb = 1;
    batch = ir_shape_scalar();
  }
  alloc_offsets(g);
  for (int64_t t = 0; t < g->nb; t++) {
    g->aoff[t] = batch_offset(&va, &batch, t);
    g->boff[t] = batch_offset(&vb, &batch, t);
    g->coff[t] = batch_offset(&vc, &batch, t);
  }
  return true;
}

/* ------------------------------------------------------------------ */
/* From the IR                                                         */
/* ------------------------------------------------------------------ */

bool rt_gemm_plan_ir(const IrOp *op, bool stored, RtGemmPlan *g, char *err, size_t n) {
  const IrValue *A = op->args[0], *B = op->args[1];
  const IrShape *as = &A->type.shape, *bs = &B->type.shape;
  memset(g, 0, sizeof *g);
  g->ta = rt_is_flag_permute(A);
  g->tb = rt_is_flag_permute(B);
  g->a = rt_storage_root(g->ta ? A->def->args[0] : A);
  g->b = rt_storage_root(g->tb ? B->def->args[0] : B);
  g->c = rt_storage_root(op->result);
  if (stored && (g->a->storage == IR_STORE_NONE || g->b->storage == IR_STORE_NONE || g->c->storage == IR_STORE_NONE))
    return rt_op_fail(err, n, op, "has an operand or result without storage (run memplan)");
  g->M = as->rank == 1 ? 1 : as->dim[as->rank - 2];
  g->K = as->dim[as->rank - 1];
  g->N = bs->rank == 1 ? 1 : bs->dim[bs->rank - 1];
  IrShape *ab = &g->abatch, *bb = &g->bbatch;
  ab->rank = as->rank > 2 ? as->rank - 2 : 0;
  bb->rank = bs->rank > 2 ? bs->rank - 2 : 0;
  for (int k = 0; k < ab->rank; k++) ab->dim[k] = as->dim[k];
  for (int k = 0; k < bb->rank; k++) bb->dim[k] = bs->dim[k];
  if (!ir_broadcast_shapes(ab, bb, &g->batch)) return rt_op_fail(err, n, op, "has batch dims that do not broadcast");
  g->nb = ir_numel(&g->batch);
  g->na = ir_numel(ab);
  g->nbb = ir_numel(bb);
  g->rows = g->M;
  /* Only the left operand batched, not transposed: one GEMM of nb*M rows. */
  if (bb->rank == 0 && ab->rank > 0 && !g->ta) {
    g->M *= g->nb;
    g->nb = g->na = 1;
  }
  g->lda = g->ta ? g->M : g->K;
  g->ldb = g->tb ? g->K : g->N;
  g->ldc = g->N;
  alloc_offsets(g);
  if (g->nb > 1) {
    rt_gemm_batch_index(&g->batch, ab, g->aoff);
    rt_gemm_batch_index(&g->batch, bb, g->boff);
  }
  for (int64_t t = 0; t < g->nb; t++) {
    g->aoff[t] *= g->M * g->K;
    g->boff[t] *= g->K * g->N;
    g->coff[t] = t * g->M * g->N;
  }
  return true;
}
