/* kernel_loop.c - the plan of a loop kernel (docs/BACKEND.md): a kernel of
 * one op that does not fit rows (permute, slice, unslice, concat,
 * reductions over leading axes, softmax over a leading axis,
 * embedding_grad, cross_entropy / mse_loss reduced to a scalar).  The plan
 * says which loop nest the op needs and derives its index space: the
 * operand strides of every output axis, the tiles of a transpose, the kept
 * and reduced axes of a reduction, the lines of a softmax.  Both code
 * generators emit their loops from it; how they split the index space
 * among iterations or threads is theirs. */
#include <string.h>

#include "kernel.h"

void kp_contiguous(const IrShape *s, int64_t *st) {
  int64_t m = 1;
  for (int k = s->rank - 1; k >= 0; k--) {
    st[k] = m;
    m *= s->dim[k];
  }
}

int kp_merge_axes(const int64_t *dims, const int64_t *stride, int n, int64_t *ext, int64_t *st) {
  int m = 0;
  for (int a = 0; a < n; a++) {
    int64_t e = dims[a], t = stride[a];
    if (e == 1) continue;
    if (m > 0 && st[m - 1] == t * e) {
      ext[m - 1] *= e;
      st[m - 1] = t;
      continue;
    }
    ext[m] = e;
    st[m] = t;
    m++;
  }
  return m;
}

static int64_t numel(const IrValue *v) { return ir_numel(&v->type.shape); }

/* Input strides of the output's axes; a permute that moves the input's
 * contiguous axis away from the output's last one is a transpose: axis t
 * of the output reads the input's contiguous axis, the other axes (all but
 * t and the last) are listed with their extents and strides, and the
 * output is covered by TILE x TILE tiles of axes t and last. */
static void plan_permute(const IrOp *op, KpLoopPlan *p) {
  const IrShape *s = &op->args[0]->type.shape, *o = &op->result->type.shape;
  int64_t cs[IR_MAX_RANK];
  kp_contiguous(s, cs);
  const int64_t *perm;
  int n = ir_attr_get_ints(op, "perm", &perm), k = s->rank, t = -1;
  for (int a = 0; a < k; a++) {
    int64_t q = a < n ? perm[a] : a;
    if (q < 0) q += k;
    p->st[a] = q >= 0 && q < k ? cs[q] : 0;
    if (p->st[a] == 1 && s->dim[q] > 1) t = a;
  }
  if (k < 2 || t < 0 || t == k - 1 || o->dim[k - 1] < 2) return;
  p->kind = KP_LOOP_TRANSPOSE;
  p->t = t;
  kp_contiguous(o, p->os);
  p->outer = 1;
  for (int a = 0; a < k - 1; a++)
    if (a != t) p->od[p->m] = o->dim[a], p->ist[p->m] = p->st[a], p->ost[p->m++] = p->os[a], p->outer *= o->dim[a];
  p->nt = (o->dim[t] + KP_TILE - 1) / KP_TILE;
  p->nl = (o->dim[k - 1] + KP_TILE - 1) / KP_TILE;
}

/* Input strides of the output's axes and the first element read. */
static void plan_slice(const IrOp *op, KpLoopPlan *p) {
  const IrShape *s = &op->args[0]->type.shape;
  int64_t cs[IR_MAX_RANK];
  kp_contiguous(s, cs);
  kp_slice_ranges(op, s, p->start, p->step);
  for (int a = 0; a < s->rank; a++) {
    p->st[a] = p->step[a] * cs[a];
    if (op->result->type.shape.dim[a] > 0) p->base += p->start[a] * cs[a];
  }
}

/* The kept and reduced axes of a reduction (attr axes; empty = all): the
 * contiguous suffix of kept axes (cols) or of reduced ones, then the
 * outer axes of each kind. */
static void plan_reduce(const IrOp *op, KpReduce *r) {
  const IrShape *s = &op->args[0]->type.shape;
  bool red[IR_MAX_RANK];
  const int64_t *ax;
  int n = ir_attr_get_ints(op, "axes", &ax);
  for (int k = 0; k < s->rank; k++) red[k] = n == 0;
  for (int i = 0; i < n; i++) {
    int64_t a;
    if (ir_norm_axis(ax[i], s->rank, &a)) red[a] = true;
  }
  int k = s->rank;
  int64_t cs[IR_MAX_RANK];
  kp_contiguous(s, cs);
  r->cols = k > 0 && !red[k - 1];
  int t = k;
  while (t > 0 && red[t - 1] == !r->cols) t--;
  r->blk = 1;
  for (int a = t; a < k; a++) r->blk *= s->dim[a];
  r->outer = r->mred = 1;
  for (int a = 0; a < t; a++) {
    if (red[a]) {
      r->rd[r->nr] = s->dim[a], r->rs[r->nr++] = cs[a];
      r->mred *= s->dim[a];
    } else {
      r->kd[r->nk] = s->dim[a], r->ks[r->nk++] = cs[a];
      r->outer *= s->dim[a];
    }
  }
  r->count = r->mred * (r->cols ? 1 : r->blk);
}

static void plan_concat(const IrOp *op, KpLoopPlan *p) {
  const IrShape *o = &op->result->type.shape;
  int k = o->rank;
  ir_norm_axis(ir_attr_get_int(op, "axis", 0), k, &p->axis);
  p->inner = p->row_inner = 1;
  for (int a = (int)p->axis + 1; a < k; a++) {
    p->inner *= o->dim[a];
    if (a < k - 1) p->row_inner *= o->dim[a];
  }
}

void kp_loop_plan(const IrOp *op, KpLoopPlan *p) {
  memset(p, 0, sizeof *p);
  p->op = op;
  p->kind = kp_loop_kind(op->opcode);
  p->t = -1;
  const IrShape *o = &op->result->type.shape, *s = op->nargs ? &op->args[0]->type.shape : o;
  switch (p->kind) {
  case KP_LOOP_PERMUTE: plan_permute(op, p); break;
  case KP_LOOP_SLICE: plan_slice(op, p); break;
  case KP_LOOP_UNSLICE:
    kp_slice_ranges(op, o, p->start, p->step);
    kp_contiguous(s, p->xs);
    break;
  case KP_LOOP_CONCAT: plan_concat(op, p); break;
  case KP_LOOP_REDUCE: plan_reduce(op, &p->red); break;
  case KP_LOOP_SOFTMAX:
    if (s->rank == 0) break;
    ir_norm_axis(ir_attr_get_int(op, "axis", -1), s->rank, &p->axis);
    p->len = s->dim[p->axis];
    p->inner = 1;
    for (int a = (int)p->axis + 1; a < s->rank; a++) p->inner *= s->dim[a];
    p->lines = p->len ? numel(op->args[0]) / p->len : 0;
    break;
  case KP_LOOP_CE_TOTAL:
    p->len = s->rank ? s->dim[s->rank - 1] : 1;
    p->n = numel(op->args[1]);
    p->ignore_index = ir_attr_get_int(op, "ignore_index", -100);
    p->mean = strcmp(ir_attr_get_str(op, "reduction", "mean"), "mean") == 0;
    break;
  case KP_LOOP_MSE_TOTAL:
    p->n = numel(op->args[0]);
    p->mean = strcmp(ir_attr_get_str(op, "reduction", "mean"), "mean") == 0;
    break;
  case KP_LOOP_EMBEDDING_GRAD:
    p->rows = o->dim[0];
    p->len = o->dim[1];
    p->n = numel(op->args[0]);
    break;
  case KP_LOOP_PATCHES:
  case KP_LOOP_PATCHES_GRAD: {
    char why[256];
    bool ok = ir_patches_geom(op, &p->pg, why, sizeof why);
    GRADC_ASSERT(ok); /* the verifier ran the shape rule */
    kp_contiguous(&p->pg.image, p->pst);
    kp_contiguous(&p->pg.cols, p->cst);
    break;
  }
  case KP_LOOP_TRANSPOSE:
  case KP_LOOP_NONE: break;
  }
}
