/* autodiff_rules.c - derivative rules, one ad_grad_<rule> per name in the
 * `derivative` column of ir/ops.def.
 *
 * Each rule receives a forward op and the complete gradient dy of its
 * result, emits the backward as ordinary IR ops (located at the op), and
 * hands each operand's contribution, of that operand's type, to ad_accum.
 * Operands that need no gradient (ad_needs_grad) are skipped before any
 * work is emitted for them.  Semantics are PyTorch's (DESIGN.md §2),
 * including its choices at non-differentiable points: relu and abs give 0
 * at 0, maximum/minimum split ties half/half, max splits evenly among ties
 * (torch.amax). */
#include <string.h>

#include "passes.h"

/* ------------------------------------------------------------------ */
/* Helpers                                                             */
/* ------------------------------------------------------------------ */

static IrValue *bin(AdCtx *ad, IrOpcode opc, IrValue *a, IrValue *b, IrOp *op) {
  return ir_binary(ad_func(ad), opc, a, b, op->loc);
}

static IrValue *un(AdCtx *ad, IrOpcode opc, IrValue *x, IrOp *op) { return ir_unary(ad_func(ad), opc, x, op->loc); }

/* A scalar constant of like's dtype (broadcasts in binary ops). */
static IrValue *num(AdCtx *ad, double v, const IrValue *like, IrOp *op) {
  return ir_const(ad_func(ad), v, like->type.dtype, op->loc);
}

/* Contribute g (broadcast shape) to x, summed back over broadcast axes. */
static void accum_to(AdCtx *ad, IrValue *x, IrValue *g, IrOp *op) {
  if (!ad_needs_grad(ad, x)) return;
  ad_accum(ad, x, ir_sum_to(ad_func(ad), g, x->type.shape, op->loc));
}

/* The reduced axes of a reduction over a rank-r operand: red[i] set for
 * each axis in axes=[..] (negative axes count from the end); no axes
 * attribute or an empty list reduces every axis. */
static void reduced_axes(IrOp *op, int r, bool *red) {
  const int64_t *axes;
  int n = ir_attr_get_ints(op, "axes", &axes);
  for (int i = 0; i < r; i++) red[i] = n == 0;
  for (int i = 0; i < n; i++) {
    int64_t a;
    bool ok = ir_norm_axis(axes[i], r, &a);
    GRADC_ASSERT(ok);
    red[a] = true;
  }
}

/* x's shape with the reduced axes set to 1 (a keepdim result's shape). */
static IrShape keep_shape(const IrShape *xs, const bool *red) {
  IrShape s = *xs;
  for (int i = 0; i < s.rank; i++)
    if (red[i]) s.dim[i] = 1;
  return s;
}

/* One normalised axis attribute (default -1) for an operand of rank r. */
static int64_t axis_attr(IrOp *op, int r) {
  int64_t a;
  bool ok = ir_norm_axis(ir_attr_get_int(op, "axis", -1), r, &a);
  GRADC_ASSERT(ok);
  return a;
}

/* sum/mean over one axis, keepdim. */
static IrValue *reduce1(AdCtx *ad, IrOpcode opc, IrValue *x, int64_t axis, IrOp *op) {
  return ir_reduce(ad_func(ad), opc, x, &axis, 1, true, op->loc);
}

/* x with its last two axes swapped (rank >= 2). */
static IrValue *transpose_last2(AdCtx *ad, IrValue *x, IrOp *op) {
  int r = x->type.shape.rank;
  int64_t perm[IR_MAX_RANK];
  for (int i = 0; i < r; i++) perm[i] = i;
  perm[r - 2] = r - 1;
  perm[r - 1] = r - 2;
  return ir_permute(ad_func(ad), x, perm, op->loc);
}

/* ------------------------------------------------------------------ */
/* No gradient                                                          */
/* ------------------------------------------------------------------ */

void ad_grad_none(AdCtx *ad, IrOp *op, IrValue *dy) { (void)ad, (void)op, (void)dy; }

/* ------------------------------------------------------------------ */
/* Elementwise, one operand                                             */
/* ------------------------------------------------------------------ */

/* y = -x: dx = -dy */
void ad_grad_neg(AdCtx *ad, IrOp *op, IrValue *dy) { ad_accum(ad, op->args[0], un(ad, IR_OP_NEG, dy, op)); }

/* y = exp(x): dx = dy * y */
void ad_grad_exp(AdCtx *ad, IrOp *op, IrValue *dy) {
  ad_accum(ad, op->args[0], bin(ad, IR_OP_MUL, dy, op->result, op));
}

/* y = log(x): dx = dy / x */
void ad_grad_log(AdCtx *ad, IrOp *op, IrValue *dy) {
  ad_accum(ad, op->args[0], bin(ad, IR_OP_DIV, dy, op->args[0], op));
}

/* y = sqrt(x): dx = dy / (2 y) */
void ad_grad_sqrt(AdCtx *ad, IrOp *op, IrValue *dy) {
  IrValue *y2 = bin(ad, IR_OP_MUL, op->result, num(ad, 2.0, dy, op), op);
  ad_accum(ad, op->args[0], bin(ad, IR_OP_DIV, dy, y2, op));
}

/* y = x^-1/2: dx = -0.5 * dy * y^3 */
void ad_grad_rsqrt(AdCtx *ad, IrOp *op, IrValue *dy) {
  IrValue *y = op->result;
  IrValue *y3 = bin(ad, IR_OP_MUL, bin(ad, IR_OP_MUL, y, y, op), y, op);
  IrValue *g = bin(ad, IR_OP_MUL, dy, y3, op);
  ad_accum(ad, op->args[0], bin(ad, IR_OP_MUL, g, num(ad, -0.5, dy, op), op));
}

/* y = tanh(x): dx = dy * (1 - y^2) */
void ad_grad_tanh(AdCtx *ad, IrOp *op, IrValue *dy) {
  IrValue *y = op->result;
  IrValue *d = bin(ad, IR_OP_SUB, num(ad, 1.0, y, op), bin(ad, IR_OP_MUL, y, y, op), op);
  ad_accum(ad, op->args[0], bin(ad, IR_OP_MUL, dy, d, op));
}

/* y = sigmoid(x): dx = dy * y * (1 - y) */
void ad_grad_sigmoid(AdCtx *ad, IrOp *op, IrValue *dy) {
  IrValue *y = op->result;
  IrValue *d = bin(ad, IR_OP_MUL, y, bin(ad, IR_OP_SUB, num(ad, 1.0, y, op), y, op), op);
  ad_accum(ad, op->args[0], bin(ad, IR_OP_MUL, dy, d, op));
}

/* y = relu(x): dx = y > 0 ? dy : 0 (torch: 0 at x == 0) */
void ad_grad_relu(AdCtx *ad, IrOp *op, IrValue *dy) {
  IrValue *pos = bin(ad, IR_OP_GT, op->result, num(ad, 0.0, op->result, op), op);
  ad_accum(ad, op->args[0], ir_select(ad_func(ad), pos, dy, num(ad, 0.0, dy, op), op->loc));
}

/* y = gelu(x) (tanh approximation): dx = dy * gelu_grad(x) */
void ad_grad_gelu(AdCtx *ad, IrOp *op, IrValue *dy) {
  IrValue *d = un(ad, IR_OP_GELU_GRAD, op->args[0], op);
  ad_accum(ad, op->args[0], bin(ad, IR_OP_MUL, dy, d, op));
}

/* y = x * s, s = sigmoid(x): dx = dy * s * (1 + x * (1 - s)) */
void ad_grad_silu(AdCtx *ad, IrOp *op, IrValue *dy) {
  IrValue *x = op->args[0];
  IrValue *s = un(ad, IR_OP_SIGMOID, x, op);
  IrValue *one = num(ad, 1.0, x, op);
  IrValue *t = bin(ad, IR_OP_ADD, one, bin(ad, IR_OP_MUL, x, bin(ad, IR_OP_SUB, one, s, op), op), op);
  ad_accum(ad, x, bin(ad, IR_OP_MUL, dy, bin(ad, IR_OP_MUL, s, t, op), op));
}

/* y = |x|: dx = sign(x) * dy (0 at x == 0, as torch) */
void ad_grad_abs(AdCtx *ad, IrOp *op, IrValue *dy) {
  IrValue *s = un(ad, IR_OP_SIGN, op->args[0], op);
  ad_accum(ad, op->args[0], bin(ad, IR_OP_MUL, s, dy, op));
}

/* y = x ** e: dx = dy * e * x^(e-1); e == 0 gives no gradient (torch: zeros). */
void ad_grad_pow(AdCtx *ad, IrOp *op, IrValue *dy) {
  IrValue *x = op->args[0];
  double e = ir_attr_get_float(op, "exponent", 1.0);
  if (e == 0.0) return;
  if (e == 1.0) {
    ad_accum(ad, x, dy);
    return;
  }
  IrValue *p = x;
  if (e != 2.0) {
    IrAttr a = ir_attr_float("exponent", e - 1.0);
    p = ir_emit(ad_func(ad), IR_OP_POW, &x, 1, &a, 1, NULL, op->loc);
  }
  IrValue *d = bin(ad, IR_OP_MUL, p, num(ad, e, x, op), op);
  ad_accum(ad, x, bin(ad, IR_OP_MUL, dy, d, op));
}

/* y = cast(x): dx = cast(dy) back to x's dtype */
void ad_grad_cast(AdCtx *ad, IrOp *op, IrValue *dy) {
  IrValue *x = op->args[0];
  if (!ad_needs_grad(ad, x)) return;
  ad_accum(ad, x, ir_cast(ad_func(ad), dy, x->type.dtype, op->loc));
}

/* ------------------------------------------------------------------ */
/* Elementwise, two operands, broadcasting                              */
/* ------------------------------------------------------------------ */

void ad_grad_add(AdCtx *ad, IrOp *op, IrValue *dy) {
  accum_to(ad, op->args[0], dy, op);
  accum_to(ad, op->args[1], dy, op);
}

void ad_grad_sub(AdCtx *ad, IrOp *op, IrValue *dy) {
  accum_to(ad, op->args[0], dy, op);
  if (ad_needs_grad(ad, op->args[1])) accum_to(ad, op->args[1], un(ad, IR_OP_NEG, dy, op), op);
}

void ad_grad_mul(AdCtx *ad, IrOp *op, IrValue *dy) {
  IrValue *a = op->args[0], *b = op->args[1];
  if (ad_needs_grad(ad, a)) accum_to(ad, a, bin(ad, IR_OP_MUL, dy, b, op), op);
  if (ad_needs_grad(ad, b)) accum_to(ad, b, bin(ad, IR_OP_MUL, dy, a, op), op);
}

/* y = a / b: da = dy / b, db = -dy * a / (b * b) (torch's form) */
void ad_grad_div(AdCtx *ad, IrOp *op, IrValue *dy) {
  IrValue *a = op->args[0], *b = op->args[1];
  if (ad_needs_grad(ad, a)) accum_to(ad, a, bin(ad, IR_OP_DIV, dy, b, op), op);
  if (ad_needs_grad(ad, b)) {
    IrValue *n = bin(ad, IR_OP_MUL, dy, a, op);
    IrValue *q = bin(ad, IR_OP_DIV, n, bin(ad, IR_OP_MUL, b, b, op), op);
    accum_to(ad, b, un(ad, IR_OP_NEG, q, op), op);
  }
}

/* maximum/minimum: the winner gets dy, ties split dy half/half (torch). */
static void grad_extremum(AdCtx *ad, IrOp *op, IrValue *dy, IrOpcode a_loses, IrOpcode b_loses) {
  IrValue *a = op->args[0], *b = op->args[1];
  IrFunc *f = ad_func(ad);
  IrValue *tie = bin(ad, IR_OP_EQ, a, b, op);
  IrValue *g = ir_select(f, tie, bin(ad, IR_OP_MUL, dy, num(ad, 0.5, dy, op), op), dy, op->loc);
  IrValue *zero = num(ad, 0.0, dy, op);
  if (ad_needs_grad(ad, a)) accum_to(ad, a, ir_select(f, bin(ad, a_loses, a, b, op), zero, g, op->loc), op);
  if (ad_needs_grad(ad, b)) accum_to(ad, b, ir_select(f, bin(ad, b_loses, a, b, op), zero, g, op->loc), op);
}

void ad_grad_maximum(AdCtx *ad, IrOp *op, IrValue *dy) { grad_extremum(ad, op, dy, IR_OP_LT, IR_OP_GT); }
void ad_grad_minimum(AdCtx *ad, IrOp *op, IrValue *dy) { grad_extremum(ad, op, dy, IR_OP_GT, IR_OP_LT); }

/* y = cond ? a : b: da = cond ? dy : 0, db = cond ? 0 : dy, each summed to its shape. */
void ad_grad_select(AdCtx *ad, IrOp *op, IrValue *dy) {
  IrValue *c = op->args[0], *a = op->args[1], *b = op->args[2];
  IrFunc *f = ad_func(ad);
  IrValue *zero = num(ad, 0.0, dy, op);
  if (ad_needs_grad(ad, a)) accum_to(ad, a, ir_select(f, c, dy, zero, op->loc), op);
  if (ad_needs_grad(ad, b)) accum_to(ad, b, ir_select(f, c, zero, dy, op->loc), op);
}

/* ------------------------------------------------------------------ */
/* Reductions                                                           */
/* ------------------------------------------------------------------ */

/* dy of a reduction, reshaped to the keepdim shape (broadcasts against x). */
static IrValue *dy_keep(AdCtx *ad, IrOp *op, IrValue *v, const bool *red) {
  IrShape ks = keep_shape(&op->args[0]->type.shape, red);
  return ir_reshape(ad_func(ad), v, ks, op->loc);
}

/* y = sum(x, axes): dx = broadcast(dy) */
void ad_grad_sum(AdCtx *ad, IrOp *op, IrValue *dy) {
  IrValue *x = op->args[0];
  bool red[IR_MAX_RANK];
  reduced_axes(op, x->type.shape.rank, red);
  ad_accum(ad, x, ir_broadcast(ad_func(ad), dy_keep(ad, op, dy, red), x->type.shape, op->loc));
}

/* y = mean(x, axes): dx = broadcast(dy) / (number of reduced elements) */
void ad_grad_mean(AdCtx *ad, IrOp *op, IrValue *dy) {
  IrValue *x = op->args[0];
  const IrShape *xs = &x->type.shape;
  bool red[IR_MAX_RANK];
  reduced_axes(op, xs->rank, red);
  int64_t count = 1;
  for (int i = 0; i < xs->rank; i++)
    if (red[i]) count *= xs->dim[i];
  IrValue *g = ir_broadcast(ad_func(ad), dy_keep(ad, op, dy, red), *xs, op->loc);
  ad_accum(ad, x, bin(ad, IR_OP_DIV, g, num(ad, (double)count, dy, op), op));
}

/* y = max(x, axes): mask = (x == y), dx = mask * dy / count(mask) (torch.amax) */
void ad_grad_max(AdCtx *ad, IrOp *op, IrValue *dy) {
  IrValue *x = op->args[0];
  IrFunc *f = ad_func(ad);
  int r = x->type.shape.rank;
  bool red[IR_MAX_RANK];
  reduced_axes(op, r, red);
  int64_t axes[IR_MAX_RANK];
  int n = 0;
  for (int i = 0; i < r; i++)
    if (red[i]) axes[n++] = i;
  IrValue *yk = dy_keep(ad, op, op->result, red);
  IrValue *mask = ir_cast(f, bin(ad, IR_OP_EQ, x, yk, op), x->type.dtype, op->loc);
  IrValue *count = n ? ir_reduce(f, IR_OP_SUM, mask, axes, n, true, op->loc) : mask;
  IrValue *g = bin(ad, IR_OP_DIV, dy_keep(ad, op, dy, red), count, op);
  ad_accum(ad, x, bin(ad, IR_OP_MUL, mask, g, op));
}

/* y = logsumexp(x, axes): dx = exp(x - y) * dy (softmax * dy) */
void ad_grad_logsumexp(AdCtx *ad, IrOp *op, IrValue *dy) {
  IrValue *x = op->args[0];
  bool red[IR_MAX_RANK];
  reduced_axes(op, x->type.shape.rank, red);
  IrValue *p = un(ad, IR_OP_EXP, bin(ad, IR_OP_SUB, x, dy_keep(ad, op, op->result, red), op), op);
  ad_accum(ad, x, bin(ad, IR_OP_MUL, p, dy_keep(ad, op, dy, red), op));
}

/* ------------------------------------------------------------------ */
/* Data movement                                                        */
/* ------------------------------------------------------------------ */

void ad_grad_reshape(AdCtx *ad, IrOp *op, IrValue *dy) {
  IrValue *x = op->args[0];
  ad_accum(ad, x, ir_reshape(ad_func(ad), dy, x->type.shape, op->loc));
}

/* y = permute(x, perm): dx = permute(dy, inverse(perm)) */
void ad_grad_permute(AdCtx *ad, IrOp *op, IrValue *dy) {
  IrValue *x = op->args[0];
  int r = x->type.shape.rank;
  const int64_t *perm;
  int n = ir_attr_get_ints(op, "perm", &perm);
  GRADC_ASSERT(n == r);
  int64_t inv[IR_MAX_RANK];
  for (int i = 0; i < r; i++) {
    int64_t p;
    bool ok = ir_norm_axis(perm[i], r, &p);
    GRADC_ASSERT(ok);
    inv[p] = i;
  }
  ad_accum(ad, x, ir_permute(ad_func(ad), dy, inv, op->loc));
}

/* y = broadcast(x): dx = dy summed over the broadcast axes */
void ad_grad_broadcast(AdCtx *ad, IrOp *op, IrValue *dy) { accum_to(ad, op->args[0], dy, op); }

/* y = slice(x): dx = unslice(dy) into zeros of x's shape, same ranges */
void ad_grad_slice(AdCtx *ad, IrOp *op, IrValue *dy) {
  IrValue *x = op->args[0];
  IrAttr a[8];
  int n = 0;
  for (int i = 0; i < op->nattrs && n < 7; i++)
    if (strcmp(op->attrs[i].key, "shape") != 0) a[n++] = op->attrs[i];
  a[n++] = ir_attr_ints("shape", x->type.shape.dim, x->type.shape.rank);
  ad_accum(ad, x, ir_emit(ad_func(ad), IR_OP_UNSLICE, &dy, 1, a, n, NULL, op->loc));
}

/* y = unslice(x) (zeros with x filled in): dx = slice(dy), same ranges */
void ad_grad_unslice(AdCtx *ad, IrOp *op, IrValue *dy) {
  IrValue *x = op->args[0];
  IrAttr a[8];
  int n = 0;
  for (int i = 0; i < op->nattrs && n < 8; i++)
    if (strcmp(op->attrs[i].key, "shape") != 0) a[n++] = op->attrs[i];
  ad_accum(ad, x, ir_emit(ad_func(ad), IR_OP_SLICE, &dy, 1, a, n, NULL, op->loc));
}

/* y = concat(x0, x1, ..., axis): dxi = dy's slice at xi's offset */
void ad_grad_concat(AdCtx *ad, IrOp *op, IrValue *dy) {
  const IrShape *ys = &dy->type.shape;
  int r = ys->rank;
  int64_t axis = axis_attr(op, r);
  int64_t off = 0;
  for (int k = 0; k < op->nargs; k++) {
    IrValue *x = op->args[k];
    int64_t len = x->type.shape.dim[axis];
    if (ad_needs_grad(ad, x)) {
      int64_t starts[IR_MAX_RANK], stops[IR_MAX_RANK], steps[IR_MAX_RANK];
      for (int i = 0; i < r; i++) {
        starts[i] = 0;
        stops[i] = ys->dim[i];
        steps[i] = 1;
      }
      starts[axis] = off;
      stops[axis] = off + len;
      IrAttr a[3] = {ir_attr_ints("starts", starts, r), ir_attr_ints("stops", stops, r),
                     ir_attr_ints("steps", steps, r)};
      ad_accum(ad, x, ir_emit(ad_func(ad), IR_OP_SLICE, &dy, 1, a, 3, NULL, op->loc));
    }
    off += len;
  }
}

/* ------------------------------------------------------------------ */
/* Matrix products                                                      */
/* ------------------------------------------------------------------ */

/* y = a @ b (torch.matmul).  A 1-D a is a row [1,K], a 1-D b a column
 * [K,1]; dy is reshaped to the product's shape with those unit axes kept.
 * Then da = dy @ b^T and db = a^T @ dy, each summed over the broadcast
 * batch axes back to the operand's shape. */
void ad_grad_matmul(AdCtx *ad, IrOp *op, IrValue *dy) {
  IrFunc *f = ad_func(ad);
  IrValue *a = op->args[0], *b = op->args[1];
  bool need_a = ad_needs_grad(ad, a), need_b = ad_needs_grad(ad, b);
  if (!need_a && !need_b) return;
  IrShape as = a->type.shape, bs = b->type.shape;
  if (as.rank == 1) as = ir_shape_make(2, (int64_t[]){1, as.dim[0]});
  if (bs.rank == 1) bs = ir_shape_make(2, (int64_t[]){bs.dim[0], 1});
  /* The 2-D product's shape: broadcast batch dims, then [M, N]. */
  IrShape ab = ir_shape_make(as.rank - 2, as.dim), bb = ir_shape_make(bs.rank - 2, bs.dim), ys;
  bool ok = ir_broadcast_shapes(&ab, &bb, &ys);
  GRADC_ASSERT(ok && ys.rank + 2 <= IR_MAX_RANK);
  ys.dim[ys.rank++] = as.dim[as.rank - 2];
  ys.dim[ys.rank++] = bs.dim[bs.rank - 1];
  IrValue *D = ir_reshape(f, dy, ys, op->loc);
  if (need_a) {
    IrValue *B = ir_reshape(f, b, bs, op->loc);
    IrValue *da = ir_matmul(f, D, transpose_last2(ad, B, op), op->loc);
    da = ir_sum_to(f, da, as, op->loc);
    ad_accum(ad, a, ir_reshape(f, da, a->type.shape, op->loc));
  }
  if (need_b) {
    IrValue *A = ir_reshape(f, a, as, op->loc);
    IrValue *db = ir_matmul(f, transpose_last2(ad, A, op), D, op->loc);
    db = ir_sum_to(f, db, bs, op->loc);
    ad_accum(ad, b, ir_reshape(f, db, b->type.shape, op->loc));
  }
}

/* ------------------------------------------------------------------ */
/* Row-wise neural-network ops                                          */
/* ------------------------------------------------------------------ */

/* y = softmax(x, axis): dx = y * (dy - sum(dy * y, axis)) */
void ad_grad_softmax(AdCtx *ad, IrOp *op, IrValue *dy) {
  IrValue *y = op->result;
  int64_t axis = axis_attr(op, y->type.shape.rank);
  IrValue *s = reduce1(ad, IR_OP_SUM, bin(ad, IR_OP_MUL, dy, y, op), axis, op);
  ad_accum(ad, op->args[0], bin(ad, IR_OP_MUL, y, bin(ad, IR_OP_SUB, dy, s, op), op));
}

/* y = log_softmax(x, axis): dx = dy - exp(y) * sum(dy, axis) */
void ad_grad_log_softmax(AdCtx *ad, IrOp *op, IrValue *dy) {
  IrValue *y = op->result;
  int64_t axis = axis_attr(op, y->type.shape.rank);
  IrValue *s = reduce1(ad, IR_OP_SUM, dy, axis, op);
  IrValue *p = un(ad, IR_OP_EXP, y, op);
  ad_accum(ad, op->args[0], bin(ad, IR_OP_SUB, dy, bin(ad, IR_OP_MUL, p, s, op), op));
}

/* y = xhat * w + b over the last axis, xhat = (x - mean) * rstd,
 * rstd = rsqrt(var + eps) (biased variance).  Recomputed here:
 *   dxhat = dy * w
 *   dx = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat))
 *   dw = sum over leading axes of dy * xhat,  db = sum over leading axes of dy */
void ad_grad_layer_norm(AdCtx *ad, IrOp *op, IrValue *dy) {
  IrValue *x = op->args[0], *w = op->args[1], *b = op->args[2];
  int64_t last = x->type.shape.rank - 1;
  bool need_x = ad_needs_grad(ad, x), need_w = ad_needs_grad(ad, w);
  if (need_x || need_w) {
    IrValue *mu = reduce1(ad, IR_OP_MEAN, x, last, op);
    IrValue *xc = bin(ad, IR_OP_SUB, x, mu, op);
    IrValue *var = reduce1(ad, IR_OP_MEAN, bin(ad, IR_OP_MUL, xc, xc, op), last, op);
    double eps = ir_op_eps(op);
    IrValue *rstd = un(ad, IR_OP_RSQRT, bin(ad, IR_OP_ADD, var, num(ad, eps, x, op), op), op);
    IrValue *xhat = bin(ad, IR_OP_MUL, xc, rstd, op);
    if (need_w) accum_to(ad, w, bin(ad, IR_OP_MUL, dy, xhat, op), op);
    if (need_x) {
      IrValue *dxhat = bin(ad, IR_OP_MUL, dy, w, op);
      IrValue *m1 = reduce1(ad, IR_OP_MEAN, dxhat, last, op);
      IrValue *m2 = reduce1(ad, IR_OP_MEAN, bin(ad, IR_OP_MUL, dxhat, xhat, op), last, op);
      IrValue *t = bin(ad, IR_OP_SUB, bin(ad, IR_OP_SUB, dxhat, m1, op), bin(ad, IR_OP_MUL, xhat, m2, op), op);
      ad_accum(ad, x, bin(ad, IR_OP_MUL, rstd, t, op));
    }
  }
  accum_to(ad, b, dy, op);
}

/* y = xn * w, xn = x * r, r = rsqrt(mean(x * x) + eps) over the last axis:
 *   dxn = dy * w,  dx = r * (dxn - xn * mean(dxn * xn)),  dw = sum of dy * xn */
void ad_grad_rms_norm(AdCtx *ad, IrOp *op, IrValue *dy) {
  IrValue *x = op->args[0], *w = op->args[1];
  int64_t last = x->type.shape.rank - 1;
  bool need_x = ad_needs_grad(ad, x), need_w = ad_needs_grad(ad, w);
  if (!need_x && !need_w) return;
  IrValue *ms = reduce1(ad, IR_OP_MEAN, bin(ad, IR_OP_MUL, x, x, op), last, op);
  double eps = ir_op_eps(op);
  IrValue *r = un(ad, IR_OP_RSQRT, bin(ad, IR_OP_ADD, ms, num(ad, eps, x, op), op), op);
  IrValue *xn = bin(ad, IR_OP_MUL, x, r, op);
  if (need_w) accum_to(ad, w, bin(ad, IR_OP_MUL, dy, xn, op), op);
  if (need_x) {
    IrValue *dxn = bin(ad, IR_OP_MUL, dy, w, op);
    IrValue *m = reduce1(ad, IR_OP_MEAN, bin(ad, IR_OP_MUL, dxn, xn, op), last, op);
    IrValue *t = bin(ad, IR_OP_SUB, dxn, bin(ad, IR_OP_MUL, xn, m, op), op);
    ad_accum(ad, x, bin(ad, IR_OP_MUL, r, t, op));
  }
}

/* y = causal_mask(x): dx = dy where the mask keeps x, 0 above the diagonal.
 * The kept positions are those where causal_mask of zeros is still 0. */
void ad_grad_causal_mask(AdCtx *ad, IrOp *op, IrValue *dy) {
  IrFunc *f = ad_func(ad);
  IrValue *x = op->args[0];
  IrValue *z = ir_const_shaped(f, 0.0, x->type, op->loc);
  IrValue *keep = bin(ad, IR_OP_EQ, un(ad, IR_OP_CAUSAL_MASK, z, op), num(ad, 0.0, x, op), op);
  ad_accum(ad, x, ir_select(f, keep, dy, num(ad, 0.0, dy, op), op->loc));
}

/* y = embedding(idx, table): dtable = scatter-add of dy rows at idx */
void ad_grad_embedding(AdCtx *ad, IrOp *op, IrValue *dy) {
  IrValue *idx = op->args[0], *table = op->args[1];
  if (!ad_needs_grad(ad, table)) return;
  IrValue *args[2] = {idx, dy};
  IrAttr a = ir_attr_int("rows", table->type.shape.dim[0]);
  IrValue *g = ir_emit(ad_func(ad), IR_OP_EMBEDDING_GRAD, args, 2, &a, 1, NULL, op->loc);
  ad_accum(ad, table, ir_cast(ad_func(ad), g, table->type.dtype, op->loc));
}

/* y = cross_entropy(logits [..., V], target [...]):
 *   dlogits = (softmax(logits) - one_hot(target)) * valid * scale
 * valid = (target != ignore_index); scale = dy per row ('none'), dy
 * ('sum'), dy / max(count(valid), 1) ('mean': no NaN when all are ignored). */
void ad_grad_cross_entropy(AdCtx *ad, IrOp *op, IrValue *dy) {
  IrFunc *f = ad_func(ad);
  IrValue *logits = op->args[0], *target = op->args[1];
  if (!ad_needs_grad(ad, logits)) return;
  IrDType dt = logits->type.dtype;
  const IrShape *ls = &logits->type.shape;
  const IrShape *ts = &target->type.shape;
  int64_t ii = ir_attr_get_int(op, "ignore_index", -100);
  const char *red = ir_attr_get_str(op, "reduction", "mean");

  IrAttr sa = ir_attr_int("axis", ls->rank - 1);
  IrValue *sm = ir_emit(f, IR_OP_SOFTMAX, &logits, 1, &sa, 1, NULL, op->loc);
  IrAttr oa[2] = {ir_attr_int("depth", ls->dim[ls->rank - 1]), ir_attr_int("ignore_index", ii)};
  IrValue *oh = ir_emit(f, IR_OP_ONE_HOT, &target, 1, oa, 2, &logits->type, op->loc);
  IrValue *ne = bin(ad, IR_OP_NE, target, ir_const(f, (double)ii, target->type.dtype, op->loc), op);
  IrValue *valid = ir_cast(f, ne, dt, op->loc); /* [...] */

  IrValue *scale; /* [...] */
  if (strcmp(red, "mean") == 0) {
    IrValue *count = valid;
    if (ts->rank > 0) {
      int64_t axes[IR_MAX_RANK];
      for (int i = 0; i < ts->rank; i++) axes[i] = i;
      count = ir_reduce(f, IR_OP_SUM, valid, axes, ts->rank, false, op->loc);
    }
    IrValue *den = bin(ad, IR_OP_MAXIMUM, count, ir_const(f, 1.0, dt, op->loc), op);
    scale = bin(ad, IR_OP_MUL, valid, bin(ad, IR_OP_DIV, dy, den, op), op);
  } else {
    /* 'sum': dy is a scalar; 'none': dy has target's shape. */
    scale = bin(ad, IR_OP_MUL, valid, dy, op);
  }
  IrShape ks = *ts;
  ks.dim[ks.rank++] = 1;
  scale = ir_reshape(f, scale, ks, op->loc);
  ad_accum(ad, logits, bin(ad, IR_OP_MUL, bin(ad, IR_OP_SUB, sm, oh, op), scale, op));
}

/* y = mse_loss(a, b): g = 2 * (a - b) * dy (divided by the element count
 * for 'mean'); da = g, db = -g, each summed to its operand's shape. */
void ad_grad_mse_loss(AdCtx *ad, IrOp *op, IrValue *dy) {
  IrValue *a = op->args[0], *b = op->args[1];
  bool need_a = ad_needs_grad(ad, a), need_b = ad_needs_grad(ad, b);
  if (!need_a && !need_b) return;
  IrValue *diff = bin(ad, IR_OP_SUB, a, b, op);
  IrValue *g = bin(ad, IR_OP_MUL, bin(ad, IR_OP_MUL, diff, num(ad, 2.0, diff, op), op), dy, op);
  if (strcmp(ir_attr_get_str(op, "reduction", "mean"), "mean") == 0)
    g = bin(ad, IR_OP_DIV, g, num(ad, (double)ir_numel(&diff->type.shape), g, op), op);
  if (need_a) accum_to(ad, a, g, op);
  if (need_b) accum_to(ad, b, un(ad, IR_OP_NEG, g, op), op);
}

/* ------------------------------------------------------------------ */
/* Collectives (Megatron's f/g pairing)                                 */
/* ------------------------------------------------------------------ */

/* A start and its wait are one collective: the wait forwards dy to the
 * start's result, whose rule emits the backward collective. */
void ad_grad_wait(AdCtx *ad, IrOp *op, IrValue *dy) { ad_accum(ad, op->args[0], dy); }

/* The forward wait that completes `start` (for its attributes), or NULL. */
static IrOp *find_wait(AdCtx *ad, IrOp *start) {
  IrFunc *f = ad_func(ad);
  for (int i = 0; i < f->nops; i++) {
    IrOp *w = f->ops[i];
    if (w->nargs == 1 && w->args[0] == start->result && ir_op_info[w->opcode].kind == IR_KIND_COLLECTIVE) return w;
  }
  return NULL;
}

/* Emit `opc_start` + `opc_wait` on dy with the forward collective's attributes. */
static IrValue *collective(AdCtx *ad, IrOp *op, IrValue *dy, IrOpcode opc_start, IrOpcode opc_wait) {
  IrFunc *f = ad_func(ad);
  IrOp *fw = find_wait(ad, op);
  const IrOp *wattrs = fw ? fw : op;
  IrValue *s = ir_emit(f, opc_start, &dy, 1, op->attrs, op->nattrs, NULL, op->loc);
  return ir_emit(f, opc_wait, &s, 1, wattrs->attrs, wattrs->nattrs, NULL, op->loc);
}

/* Forward all-reduce: the backward is the identity. */
void ad_grad_all_reduce(AdCtx *ad, IrOp *op, IrValue *dy) { ad_accum(ad, op->args[0], dy); }

/* tp.copy (Megatron's f): the identity whose backward all-reduces dy, so
 * the partial input gradients of a column-parallel GEMM are summed. */
void ad_grad_tp_copy(AdCtx *ad, IrOp *op, IrValue *dy) {
  if (!ad_needs_grad(ad, op->args[0])) return;
  IrFunc *f = ad_func(ad);
  IrValue *s = ir_emit(f, IR_OP_ALL_REDUCE_START, &dy, 1, op->attrs, op->nattrs, NULL, op->loc);
  ad_accum(ad, op->args[0], ir_emit(f, IR_OP_ALL_REDUCE_WAIT, &s, 1, op->attrs, op->nattrs, NULL, op->loc));
}

/* group, ranks and axis of a rank-dependent op or collective (and shift). */
static int rank_attrs(IrOp *op, IrAttr *a, int64_t shift) {
  int n = 0;
  a[n++] = ir_attr_str("group", ir_attr_get_str(op, "group", "tp"));
  a[n++] = ir_attr_int("ranks", ir_attr_get_int(op, "ranks", 1));
  a[n++] = ir_attr_int("axis", ir_attr_get_int(op, "axis", 0));
  if (shift >= 0) a[n++] = ir_attr_int("shift", shift);
  return n;
}

/* Forward all-gather: the backward reduce-scatters dy (the ranks' dy are
 * partial sums, as behind a column-parallel GEMM).  With grad="scatter"
 * the gathered value feeds replicated computation, whose dy is the same
 * on every rank: the backward is this rank's chunk of it (tp.scatter). */
void ad_grad_all_gather(AdCtx *ad, IrOp *op, IrValue *dy) {
  if (!ad_needs_grad(ad, op->args[0])) return;
  if (strcmp(ir_attr_get_str(op, "grad", ""), "scatter") == 0) {
    IrAttr a[4];
    int n = rank_attrs(op, a, -1);
    ad_accum(ad, op->args[0], ir_emit(ad_func(ad), IR_OP_TP_SCATTER, &dy, 1, a, n, NULL, op->loc));
    return;
  }
  ad_accum(ad, op->args[0], collective(ad, op, dy, IR_OP_REDUCE_SCATTER_START, IR_OP_REDUCE_SCATTER_WAIT));
}

/* tp.scatter (this rank's chunk of a replicated value): the backward
 * all-gathers the chunks' gradients into the whole one. */
void ad_grad_tp_scatter(AdCtx *ad, IrOp *op, IrValue *dy) {
  if (!ad_needs_grad(ad, op->args[0])) return;
  IrFunc *f = ad_func(ad);
  IrAttr a[4];
  int n = rank_attrs(op, a, -1);
  IrValue *s = ir_emit(f, IR_OP_ALL_GATHER_START, &dy, 1, a, n, NULL, op->loc);
  ad_accum(ad, op->args[0], ir_emit(f, IR_OP_ALL_GATHER_WAIT, &s, 1, a, n, NULL, op->loc));
}

/* rank.slice shift=j (chunk (r + j) mod T): dy placed at that chunk, zeros
 * elsewhere, which is rank.concat with dy as operand j. */
void ad_grad_rank_slice(AdCtx *ad, IrOp *op, IrValue *dy) {
  if (!ad_needs_grad(ad, op->args[0])) return;
  IrFunc *f = ad_func(ad);
  int64_t T = ir_attr_get_int(op, "ranks", 1), shift = ir_attr_get_int(op, "shift", 0);
  IrValue **ys = ARENA_ARRAY(&f->arena, IrValue *, T);
  IrValue *zero = T > 1 ? ir_const_shaped(f, 0.0, dy->type, op->loc) : NULL;
  for (int64_t j = 0; j < T; j++) ys[j] = j == shift ? dy : zero;
  IrAttr a[4];
  int n = rank_attrs(op, a, -1);
  ad_accum(ad, op->args[0], ir_emit(f, IR_OP_RANK_CONCAT, ys, (int)T, a, n, NULL, op->loc));
}

/* rank.concat: operand j's gradient is its chunk of dy, rank.slice shift=j. */
void ad_grad_rank_concat(AdCtx *ad, IrOp *op, IrValue *dy) {
  for (int j = 0; j < op->nargs; j++) {
    if (!ad_needs_grad(ad, op->args[j])) continue;
    IrAttr a[4];
    int n = rank_attrs(op, a, j);
    ad_accum(ad, op->args[j], ir_emit(ad_func(ad), IR_OP_RANK_SLICE, &dy, 1, a, n, NULL, op->loc));
  }
}

/* Forward reduce-scatter: the backward all-gathers dy. */
void ad_grad_reduce_scatter(AdCtx *ad, IrOp *op, IrValue *dy) {
  if (!ad_needs_grad(ad, op->args[0])) return;
  ad_accum(ad, op->args[0], collective(ad, op, dy, IR_OP_ALL_GATHER_START, IR_OP_ALL_GATHER_WAIT));
}

/* ------------------------------------------------------------------ */
/* Convolution and pooling: patches and its adjoint                    */
/* ------------------------------------------------------------------ */

/* op's geometry attributes (kernel, stride, padding, dilation) into a,
 * then `extra`; returns the count. */
static int patches_attrs(IrOp *op, IrAttr *a, IrAttr extra) {
  static const char *keys[4] = {"kernel", "stride", "padding", "dilation"};
  int n = 0;
  for (int j = 0; j < 4; j++) {
    const IrAttr *at = ir_attr_get(op, keys[j]);
    GRADC_ASSERT(at);
    a[n++] = *at;
  }
  a[n++] = extra;
  return n;
}

/* y = patches(x): dx = patches_grad(dy), the sum over every patch element
 * that read a position (col2im); the padding gets nothing. */
void ad_grad_patches(AdCtx *ad, IrOp *op, IrValue *dy) {
  IrValue *x = op->args[0];
  if (!ad_needs_grad(ad, x)) return;
  IrAttr a[5];
  int n = patches_attrs(op, a, ir_attr_ints("shape", x->type.shape.dim, x->type.shape.rank));
  ad_accum(ad, x, ir_emit(ad_func(ad), IR_OP_PATCHES_GRAD, &dy, 1, a, n, NULL, op->loc));
}

/* y = patches_grad(x) (linear, the adjoint of patches with padding 0):
 * dx = patches(dy) with value 0. */
void ad_grad_patches_grad(AdCtx *ad, IrOp *op, IrValue *dy) {
  IrValue *x = op->args[0];
  if (!ad_needs_grad(ad, x)) return;
  IrAttr a[5];
  int n = patches_attrs(op, a, ir_attr_float("value", 0.0));
  ad_accum(ad, x, ir_emit(ad_func(ad), IR_OP_PATCHES, &dy, 1, a, n, NULL, op->loc));
}
