/* cuda_loop.c - kernels of one op that do not fit rows (docs/BACKEND.md)
 * in CUDA C: permute, slice, unslice, concat (one thread per output
 * element, grid-stride; a permute that moves the contiguous axis goes
 * through 32x32 tiles in shared memory so that reads and writes are both
 * coalesced), reductions over leading axes (a thread per output column
 * and a block's rows splitting the reduced positions, or a block per
 * output), softmax over a leading axis (a thread per row of the axis),
 * embedding_grad (a thread per column and group of rows walking the
 * positions in order, so the sums do not depend on scheduling) and cross_entropy / mse_loss
 * reduced to a scalar (one block).  Every output element is written by
 * exactly one thread, accumulated into gradient buffers; sums combine in a
 * fixed order.  The index space is kp_loop_plan's (passes/kernel_loop.c);
 * the launch geometry is this file's.  Semantics follow runtime/interp.c. */
#include <math.h>
#include <string.h>

#include "cuda_gen.h"

#define BLOCK 256

static int64_t numel(const IrValue *v) { return ir_numel(&v->type.shape); }

/* The dtype whose literal initialises a sum of dt (cu_acc_type). */
static IrDType acc_dtype(IrDType dt) { return dt == IR_DT_F64 ? IR_DT_F64 : dt == IR_DT_I32 ? IR_DT_I32 : IR_DT_F32; }

/* An operand of a loop kernel: a pointer argument, or an inline group-0
 * const (no storage: its value is a literal). */
typedef struct In {
  const IrValue *v;
  const char *ptr;
  const char *lit;
} In;

static In in_of(CuGen *g, const IrValue *v, int64_t elem) {
  In in = {v, NULL, NULL};
  if (v->def && v->def->opcode == IR_OP_CONST && v->def->group == 0 && v->storage == IR_STORE_NONE)
    in.lit = cu_lit(g, v->type.dtype, ir_attr_get_float(v->def, "value", 0.0));
  else
    in.ptr = cu_param(g, v, elem, false);
  return in;
}

/* Element `off` of an operand, as a register. */
static const char *elem_at(CuGen *g, const In *in, const char *off) {
  if (in->lit) return in->lit;
  return cu_load(g, in->v->type.dtype, false, cu_fmt(g, "%s[%s]", in->ptr, off));
}

/* The grid-stride loop over n output elements: `for (long i ...) {`. */
static void grid_loop(CuGen *g, int64_t n, const char *how) {
  int64_t blocks = (n + BLOCK - 1) / BLOCK;
  g->block[0] = BLOCK;
  g->block[1] = 1;
  g->grid = blocks < 65536 ? blocks : 65536;
  g->how = how;
  cu_line(g, "for (long i = (long)blockIdx.x * %d + threadIdx.x; i < %lld; i += (long)gridDim.x * %d) {", BLOCK,
          (long long)n, BLOCK);
  g->indent++;
}

static void end_block(CuGen *g) {
  g->indent--;
  cu_line(g, "}");
}

/* y[i] = x[off] (accumulated into a gradient buffer). */
static void copy_elem(CuGen *g, const In *x, const char *off, const IrValue *y, const char *yp) {
  cu_store(g, y->type.dtype, y->storage == IR_STORE_GRAD, cu_fmt(g, "%s[i]", yp), elem_at(g, x, off));
}

/* ------------------------------------------------------------------ */
/* Copies                                                              */
/* ------------------------------------------------------------------ */

static void gen_transpose(CuGen *g, const KpLoopPlan *p) {
  const IrOp *op = p->op;
  const IrValue *x = op->args[0], *y = op->result;
  const IrShape *o = &y->type.shape;
  int k = o->rank, t = p->t, m = p->m;
  const int64_t *st = p->st, *os = p->os, *od = p->od, *ist = p->ist, *ost = p->ost;
  int64_t outer = p->outer, nt = p->nt, nl = p->nl;
  int64_t DT = o->dim[t], DL = o->dim[k - 1];
  In xi = in_of(g, x, 0);
  const char *yp = cu_param(g, y, 0, true);
  IrDType dt = y->type.dtype;
  g->block[0] = KP_TILE;
  g->block[1] = 8;
  g->grid = outer * nt * nl;
  g->how = cu_fmt(g, "transpose: %lld tiles of 32x32 through shared memory (axis %d of the result is contiguous in "
                     "the operand)",
                  (long long)g->grid, t);
  cu_line(g, "__shared__ %s tile[%d][%d];", cu_reg_type(dt), KP_TILE, KP_TILE + 1);
  cu_line(g, "const long b = blockIdx.x;");
  if (outer > 1) cu_line(g, "const long o = b / %lld;", (long long)(nt * nl));
  cu_line(g, "const long a0 = (b %% %lld) / %lld * %d, c0 = b %% %lld * %d;", (long long)(nt * nl), (long long)nl, KP_TILE,
          (long long)nl, KP_TILE);
  const char *xo = outer > 1 ? cu_index(g, "o", od, ist, m) : "0", *yo = outer > 1 ? cu_index(g, "o", od, ost, m) : "0";
  cu_line(g, "for (int k = threadIdx.y; k < %d; k += 8) { // read along the operand's contiguous axis", KP_TILE);
  cu_line(g, "  const long a = a0 + threadIdx.x, c = c0 + k;");
  cu_line(g, "  if (a < %lld && c < %lld) tile[k][threadIdx.x] = %s;", (long long)DT, (long long)DL,
          elem_at(g, &xi, cu_add(g, xo, cu_fmt(g, "a + c * %lld", (long long)st[k - 1]))));
  cu_line(g, "}");
  cu_line(g, "__syncthreads();");
  cu_line(g, "for (int k = threadIdx.y; k < %d; k += 8) { // write along the result's last axis", KP_TILE);
  g->indent++;
  cu_line(g, "const long a = a0 + k, c = c0 + threadIdx.x;");
  cu_line(g, "if (a < %lld && c < %lld) {", (long long)DT, (long long)DL);
  g->indent++;
  cu_store(g, dt, y->storage == IR_STORE_GRAD,
           cu_fmt(g, "%s[%s]", yp, cu_add(g, yo, cu_fmt(g, "a * %lld + c", (long long)os[t]))), "tile[threadIdx.x][k]");
  end_block(g);
  end_block(g);
}

static void gen_permute(CuGen *g, const KpLoopPlan *p) {
  const IrOp *op = p->op;
  const int64_t *st = p->st;
  const IrValue *y = op->result;
  In x = in_of(g, op->args[0], 0);
  const char *yp = cu_param(g, y, 0, true);
  grid_loop(g, numel(y), "permute: one thread per output element, grid-stride");
  const IrShape *o = &y->type.shape;
  copy_elem(g, &x, cu_index(g, "i", o->dim, st, o->rank), y, yp);
  end_block(g);
}

/* The slice's first element is folded into the pointer argument, so
 * slices at different offsets (the layers of a stacked param, q k v of
 * one projection) share their code. */
static void gen_slice(CuGen *g, const KpLoopPlan *p) {
  const IrOp *op = p->op;
  const IrValue *x = op->args[0], *y = op->result;
  const IrShape *o = &y->type.shape;
  const int64_t *st = p->st;
  In xi = in_of(g, x, p->base);
  const char *yp = cu_param(g, y, 0, true);
  grid_loop(g, numel(y), "slice: one thread per output element, grid-stride");
  copy_elem(g, &xi, cu_index(g, "i", o->dim, st, o->rank), y, yp);
  end_block(g);
}

static void gen_unslice(CuGen *g, const KpLoopPlan *p) {
  const IrOp *op = p->op;
  const IrValue *x = op->args[0], *y = op->result;
  const IrShape *o = &y->type.shape, *xs = &x->type.shape;
  int k = o->rank;
  const int64_t *start = p->start, *step = p->step, *xst = p->xs;
  int64_t inner = 1;
  In xi = in_of(g, x, 0);
  const char *yp = cu_param(g, y, 0, true);
  IrDType dt = y->type.dtype;
  bool grad = y->storage == IR_STORE_GRAD;
  grid_loop(g, numel(y), "unslice: one thread per output element, grid-stride");
  StrBuf cond, off;
  sb_init(&cond);
  sb_init(&off);
  for (int a = k - 1; a >= 0; a--) {
    const char *q = inner == 1 ? "i" : cu_fmt(g, "(i / %lld)", (long long)inner);
    cu_line(g, "const long d%d = %s%s - %lld;", a, q, a > 0 ? cu_fmt(g, " %% %lld", (long long)o->dim[a]) : "",
            (long long)start[a]);
    inner *= o->dim[a];
    if (cond.len) sb_puts(&cond, " && ");
    if (off.len) sb_puts(&off, " + ");
    if (step[a] == 1) {
      sb_printf(&cond, "d%d >= 0 && d%d < %lld", a, a, (long long)xs->dim[a]);
      sb_printf(&off, "d%d * %lld", a, (long long)xst[a]);
    } else {
      sb_printf(&cond, "d%d >= 0 && d%d %% %lld == 0 && d%d / %lld < %lld", a, a, (long long)step[a], a,
                (long long)step[a], (long long)xs->dim[a]);
      sb_printf(&off, "d%d / %lld * %lld", a, (long long)step[a], (long long)xst[a]);
    }
  }
  const char *in = cond.len ? sb_str(&cond) : "true";
  const char *v = elem_at(g, &xi, off.len ? sb_str(&off) : "0");
  if (grad) { /* outside the slice there is nothing to add */
    cu_line(g, "if (%s) {", in);
    g->indent++;
    cu_store(g, dt, true, cu_fmt(g, "%s[i]", yp), v);
    end_block(g);
  } else {
    cu_store(g, dt, false, cu_fmt(g, "%s[i]", yp), cu_fmt(g, "(%s) ? %s : %s", in, v, cu_lit(g, dt, 0)));
  }
  sb_free(&cond);
  sb_free(&off);
  end_block(g);
}

static void gen_concat(CuGen *g, const KpLoopPlan *p) {
  const IrOp *op = p->op;
  const IrValue *y = op->result;
  const IrShape *o = &y->type.shape;
  int64_t axis = p->axis, inner = p->inner;
  In *xp = ARENA_ARRAY(g->a, In, op->nargs);
  for (int i = 0; i < op->nargs; i++) xp[i] = in_of(g, op->args[i], 0);
  const char *yp = cu_param(g, y, 0, true);
  IrDType dt = y->type.dtype;
  bool grad = y->storage == IR_STORE_GRAD;
  grid_loop(g, numel(y), "concat: one thread per output element, grid-stride");
  cu_line(g, "const long c = i / %lld %% %lld, o = i / %lld, rest = i %% %lld;", (long long)inner,
          (long long)o->dim[axis], (long long)(inner * o->dim[axis]), (long long)inner);
  int64_t at = 0;
  for (int i = 0; i < op->nargs; i++) {
    const IrValue *x = op->args[i];
    int64_t w = x->type.shape.dim[axis];
    if (i + 1 < op->nargs)
      cu_line(g, "%sif (c < %lld) {", i ? "} else " : "", (long long)(at + w));
    else
      cu_line(g, "%s{", i ? "} else " : "");
    g->indent++;
    const char *off = cu_fmt(g, "(o * %lld + c - %lld) * %lld + rest", (long long)w, (long long)at, (long long)inner);
    cu_store(g, dt, grad, cu_fmt(g, "%s[i]", yp), elem_at(g, &xp[i], off));
    g->indent--;
    at += w;
  }
  cu_line(g, "}");
  end_block(g);
}

/* ------------------------------------------------------------------ */
/* Reductions over leading axes                                        */
/* ------------------------------------------------------------------ */

/* The reduced value's final form: a mean divides, logsumexp adds the
 * maximum back, and the result is rounded to its dtype. */
static const char *red_result(CuGen *g, const IrOp *op, const KpReduce *r, const char *acc, const char *mx) {
  IrDType dt = op->result->type.dtype;
  bool d = dt == IR_DT_F64;
  if (op->opcode == IR_OP_MEAN)
    return cu_round(g, dt, cu_fmt(g, "%s / %s", acc, cu_lit(g, d ? IR_DT_F64 : IR_DT_F32, (double)r->count)));
  if (op->opcode == IR_OP_LOGSUMEXP)
    return cu_round(g, dt,
                    cu_fmt(g, "(%s(%s) < %s ? %s + %s : %s)", d ? "fabs" : "fabsf", mx, d ? "GRADC_INF_D" : "GRADC_INF",
                           mx, cu_math1(g, "log", dt, acc), mx));
  return cu_round(g, dt, acc);
}

/* Last axis kept: block (32, 8), thread x an output column, the 8 rows of
 * the block splitting the reduced positions, combined in shared memory. */
static void reduce_columns(CuGen *g, const IrOp *op, const KpReduce *r) {
  const IrValue *x = op->args[0], *y = op->result;
  IrDType dt = y->type.dtype, xt = x->type.dtype;
  bool mx = op->opcode == IR_OP_MAX, lse = op->opcode == IR_OP_LOGSUMEXP;
  const char *acc_t = mx ? cu_reg_type(xt) : cu_acc_type(xt);
  In xi = in_of(g, x, 0);
  const char *yp = cu_param(g, y, 0, true);
  int64_t nb = (r->blk + 31) / 32;
  g->block[0] = 32;
  g->block[1] = 8;
  g->grid = r->outer * nb;
  g->how = cu_fmt(g, "reduction over leading axes: a thread per output column (%lld of them), 8 threads splitting the "
                     "%lld reduced positions",
                  (long long)(r->outer * r->blk), (long long)r->mred);
  cu_line(g, "__shared__ %s part[8][33];", lse ? cu_reg_type(xt) : acc_t);
  if (lse) cu_line(g, "__shared__ %s part2[8][33];", cu_acc_type(xt));
  cu_line(g, "const long o = blockIdx.x / %lld, j = blockIdx.x %% %lld * 32 + threadIdx.x;", (long long)nb, (long long)nb);
  const char *xo = cu_index(g, "o", r->kd, r->ks, r->nk);
  const char *xr = cu_index(g, "m", r->rd, r->rs, r->nr);
  const char *xv = elem_at(g, &xi, cu_add(g, cu_add(g, xo, xr), "j"));
  bool two = mx || lse;
  /* pass 1: the sum (or the maximum), then the 8 partial results in order */
  cu_line(g, "%s acc = %s;", two ? cu_reg_type(xt) : acc_t, two ? cu_lowest(g, xt) : cu_lit(g, acc_dtype(xt), 0));
  cu_line(g, "if (j < %lld)", (long long)r->blk);
  cu_line(g, "  for (long m = threadIdx.y; m < %lld; m += 8) acc = %s;", (long long)r->mred,
          two ? cu_fmt(g, "maximum(acc, %s)", xv) : cu_fmt(g, "acc + %s", xv));
  cu_line(g, "part[threadIdx.y][threadIdx.x] = acc;");
  cu_line(g, "__syncthreads();");
  cu_line(g, "acc = part[0][threadIdx.x];");
  cu_line(g, "for (int k = 1; k < 8; k++) acc = %s;", two ? "maximum(acc, part[k][threadIdx.x])" : "acc + part[k][threadIdx.x]");
  if (lse) {
    /* pass 2: the sum of exponentials around the maximum */
    cu_line(g, "%s z = %s;", cu_acc_type(xt), cu_lit(g, acc_dtype(xt), 0));
    cu_line(g, "if (j < %lld)", (long long)r->blk);
    cu_line(g, "  for (long m = threadIdx.y; m < %lld; m += 8) z += %s;", (long long)r->mred,
            cu_math1(g, "exp", xt, cu_fmt(g, "%s - acc", xv)));
    cu_line(g, "part2[threadIdx.y][threadIdx.x] = z;");
    cu_line(g, "__syncthreads();");
    cu_line(g, "z = part2[0][threadIdx.x];");
    cu_line(g, "for (int k = 1; k < 8; k++) z += part2[k][threadIdx.x];");
  }
  cu_line(g, "if (threadIdx.y == 0 && j < %lld) {", (long long)r->blk);
  g->indent++;
  cu_store(g, dt, y->storage == IR_STORE_GRAD, cu_fmt(g, "%s[o * %lld + j]", yp, (long long)r->blk),
           red_result(g, op, r, lse ? "z" : "acc", "acc"));
  end_block(g);
}

/* Last axis reduced: a block per output element (one block of 1024 for a
 * full reduction), block reductions. */
static void reduce_blocks(CuGen *g, const IrOp *op, const KpReduce *r) {
  const IrValue *x = op->args[0], *y = op->result;
  IrDType dt = y->type.dtype, xt = x->type.dtype;
  bool mx = op->opcode == IR_OP_MAX, lse = op->opcode == IR_OP_LOGSUMEXP;
  const char *acc_t = cu_acc_type(xt), *reg_t = cu_reg_type(xt);
  In xi = in_of(g, x, 0);
  const char *yp = cu_param(g, y, 0, true);
  int block = r->outer == 1 ? 1024 : 256;
  int64_t n = r->mred * r->blk;
  g->block[0] = (unsigned)block;
  g->block[1] = 1;
  g->grid = r->outer;
  g->how = cu_fmt(g, "reduction: a block of %d threads for each of %lld outputs, %lld elements each", block,
                  (long long)r->outer, (long long)n);
  bool two = mx || lse;
  if (two) cu_line(g, "__shared__ %s red_m[32];", reg_t);
  if (!mx) cu_line(g, "__shared__ %s red_s[32];", acc_t);
  cu_line(g, "const long o = blockIdx.x;");
  const char *xo = cu_index(g, "o", r->kd, r->ks, r->nk);
  /* element e of the output's reduced set: reduced position e / blk, then e % blk in the contiguous suffix */
  const char *pos = r->blk == 1 ? cu_index(g, "e", r->rd, r->rs, r->nr)
                               : cu_index(g, cu_fmt(g, "(e / %lld)", (long long)r->blk), r->rd, r->rs, r->nr);
  const char *in = r->blk == 1 ? "0" : r->mred == 1 ? "e" : cu_fmt(g, "e %% %lld", (long long)r->blk);
  const char *xv = elem_at(g, &xi, cu_add(g, cu_add(g, xo, pos), in));
  const char *zero = cu_lit(g, acc_dtype(xt), 0);
  if (two) {
    cu_line(g, "%s m = %s;", reg_t, cu_lowest(g, xt));
    cu_line(g, "for (long e = threadIdx.x; e < %lld; e += %d) m = maximum(m, %s);", (long long)n, block, xv);
    cu_line(g, "m = block_max(m, red_m, %s);", cu_lowest(g, xt));
  }
  if (!mx) {
    cu_line(g, "%s s = %s;", acc_t, zero);
    cu_line(g, "for (long e = threadIdx.x; e < %lld; e += %d) s += %s;", (long long)n, block,
            lse ? cu_math1(g, "exp", xt, cu_fmt(g, "%s - m", xv)) : xv);
    cu_line(g, "s = block_sum(s, red_s);");
  }
  cu_line(g, "if (threadIdx.x == 0) {");
  g->indent++;
  cu_store(g, dt, y->storage == IR_STORE_GRAD, cu_fmt(g, "%s[o]", yp), red_result(g, op, r, mx ? "m" : "s", "m"));
  end_block(g);
}

static void gen_reduce(CuGen *g, const KpLoopPlan *p) {
  if (p->red.cols)
    reduce_columns(g, p->op, &p->red);
  else
    reduce_blocks(g, p->op, &p->red);
}

/* ------------------------------------------------------------------ */
/* Softmax over a leading axis                                         */
/* ------------------------------------------------------------------ */

static void gen_softmax_axis(CuGen *g, const KpLoopPlan *p) {
  const IrOp *op = p->op;
  const IrValue *x = op->args[0], *y = op->result;
  const IrShape *s = &x->type.shape;
  bool logsm = op->opcode == IR_OP_LOG_SOFTMAX;
  IrDType dt = y->type.dtype;
  bool d = dt == IR_DT_F64;
  In xi = in_of(g, x, 0);
  const char *yp = cu_param(g, y, 0, true);
  bool grad = y->storage == IR_STORE_GRAD;
  if (s->rank == 0) {
    g->block[0] = 32, g->block[1] = 1, g->grid = 1;
    g->how = "softmax of a scalar";
    cu_line(g, "if (threadIdx.x == 0) {");
    g->indent++;
    cu_store(g, dt, grad, cu_fmt(g, "%s[0]", yp), cu_lit(g, dt, logsm ? 0 : 1));
    end_block(g);
    return;
  }
  int64_t axis = p->axis, L = p->len, inner = p->inner, lines = p->lines;
  grid_loop(g, lines, cu_fmt(g, "softmax over axis %lld: a thread for each of %lld lines of %lld (stride %lld)",
                             (long long)axis, (long long)lines, (long long)L, (long long)inner));
  cu_line(g, "const long base = i / %lld * %lld + i %% %lld;", (long long)inner, (long long)(L * inner), (long long)inner);
  const char *xv = elem_at(g, &xi, cu_fmt(g, "base + l * %lld", (long long)inner));
  cu_line(g, "%s m = %s;", cu_reg_type(dt), cu_lowest(g, dt));
  cu_line(g, "for (long l = 0; l < %lld; l++) m = maximum(m, %s);", (long long)L, xv);
  cu_line(g, "%s z = %s;", cu_acc_type(dt), d ? "0.0" : "0.0f");
  cu_line(g, "for (long l = 0; l < %lld; l++) z += %s;", (long long)L, cu_math1(g, "exp", dt, cu_fmt(g, "%s - m", xv)));
  if (logsm) cu_line(g, "const %s logz = %s;", cu_acc_type(dt), cu_math1(g, "log", dt, "z"));
  cu_line(g, "for (long l = 0; l < %lld; l++) {", (long long)L);
  g->indent++;
  const char *v = logsm ? cu_fmt(g, "(%s - m) - logz", xv) : cu_fmt(g, "%s / z", cu_math1(g, "exp", dt, cu_fmt(g, "%s - m", xv)));
  cu_store(g, dt, grad, cu_fmt(g, "%s[base + l * %lld]", yp, (long long)inner), cu_round(g, dt, v));
  end_block(g);
  end_block(g);
}

/* ------------------------------------------------------------------ */
/* Scalar losses                                                       */
/* ------------------------------------------------------------------ */

/* cross_entropy reduced to a scalar: one block, a warp per row. */
static void gen_ce_total(CuGen *g, const KpLoopPlan *p) {
  const IrOp *op = p->op;
  const IrValue *x = op->args[0], *tg = op->args[1], *y = op->result;
  int64_t V = p->len, n = p->n, ii = p->ignore_index;
  IrDType xt = x->type.dtype, dt = y->type.dtype;
  bool d = xt == IR_DT_F64;
  const char *ft = cu_reg_type(xt);
  In xi = in_of(g, x, 0), ti = in_of(g, tg, 0);
  const char *yp = cu_param(g, y, 0, true);
  g->block[0] = 1024, g->block[1] = 1, g->grid = 1;
  g->how = cu_fmt(g, "cross_entropy total: one block, a warp for each of %lld rows of %lld", (long long)n, (long long)V);
  cu_line(g, "__shared__ double tot[32];");
  cu_line(g, "__shared__ long cnt[32];");
  cu_line(g, "const int w = threadIdx.x >> 5, lane = threadIdx.x & 31;");
  cu_line(g, "double total = 0.0;");
  cu_line(g, "long count = 0;");
  cu_line(g, "for (long p = w; p < %lld; p += 32) {", (long long)n);
  g->indent++;
  cu_line(g, "const int t = %s;", elem_at(g, &ti, "p"));
  cu_line(g, "if (t == %lld) continue; // ignored (the whole warp)", (long long)ii);
  cu_line(g, "count++;");
  const char *xv = elem_at(g, &xi, cu_fmt(g, "p * %lld + v", (long long)V));
  cu_line(g, "%s m = %s;", ft, cu_lowest(g, xt));
  cu_line(g, "for (long v = lane; v < %lld; v += 32) m = maximum(m, %s);", (long long)V, xv);
  cu_line(g, "m = warp_max(m);");
  cu_line(g, "%s z = %s;", ft, d ? "0.0" : "0.0f");
  cu_line(g, "for (long v = lane; v < %lld; v += 32) z += %s;", (long long)V, cu_math1(g, "exp", xt, cu_fmt(g, "%s - m", xv)));
  cu_line(g, "z = warp_sum(z);");
  cu_line(g, "const %s lse = %s(m) < %s ? m + %s : m;", ft, d ? "fabs" : "fabsf", d ? "GRADC_INF_D" : "GRADC_INF",
          cu_math1(g, "log", xt, "z"));
  cu_line(g, "total += t < 0 || t >= %lld ? GRADC_NAN_D : (double)(lse - %s);", (long long)V,
          elem_at(g, &xi, cu_fmt(g, "p * %lld + t", (long long)V)));
  end_block(g);
  cu_line(g, "if (lane == 0) {");
  cu_line(g, "  tot[w] = total;");
  cu_line(g, "  cnt[w] = count;");
  cu_line(g, "}");
  cu_line(g, "__syncthreads();");
  cu_line(g, "if (threadIdx.x == 0) { // the warps' totals in a fixed order");
  g->indent++;
  cu_line(g, "double s = 0.0;");
  cu_line(g, "long c = 0;");
  cu_line(g, "for (int k = 0; k < 32; k++) {");
  cu_line(g, "  s += tot[k];");
  cu_line(g, "  c += cnt[k];");
  cu_line(g, "}");
  const char *r = p->mean ? "s / (double)(c > 1 ? c : 1)" : "s";
  cu_store(g, dt, y->storage == IR_STORE_GRAD, cu_fmt(g, "%s[0]", yp), cu_convert(g, r, IR_DT_F64, dt));
  end_block(g);
}

static void gen_mse_total(CuGen *g, const KpLoopPlan *p) {
  const IrOp *op = p->op;
  const IrValue *a = op->args[0], *b = op->args[1], *y = op->result;
  int64_t n = p->n;
  IrDType xt = a->type.dtype, dt = y->type.dtype;
  const char *at = cu_acc_type(xt);
  In ai = in_of(g, a, 0), bi = in_of(g, b, 0);
  const char *yp = cu_param(g, y, 0, true);
  g->block[0] = 1024, g->block[1] = 1, g->grid = 1;
  g->how = cu_fmt(g, "mse_loss total: one block over %lld elements", (long long)n);
  cu_line(g, "__shared__ %s red_s[32];", at);
  cu_line(g, "%s s = %s;", at, xt == IR_DT_F64 ? "0.0" : "0.0f");
  cu_line(g, "for (long i = threadIdx.x; i < %lld; i += 1024) s += sq(%s - %s);", (long long)n,
          elem_at(g, &ai, "i"), elem_at(g, &bi, "i"));
  cu_line(g, "s = block_sum(s, red_s);");
  cu_line(g, "if (threadIdx.x == 0) {");
  g->indent++;
  const char *r = p->mean ? cu_fmt(g, "s / %s", cu_lit(g, xt == IR_DT_F64 ? IR_DT_F64 : IR_DT_F32, (double)n)) : "s";
  cu_store(g, dt, y->storage == IR_STORE_GRAD, cu_fmt(g, "%s[0]", yp),
           cu_convert(g, r, xt == IR_DT_F64 ? IR_DT_F64 : IR_DT_F32, dt));
  end_block(g);
}

/* ------------------------------------------------------------------ */
/* embedding_grad                                                      */
/* ------------------------------------------------------------------ */

/* Rows of the result are dealt to EMB_GROUPS groups (row t to group t %
 * EMB_GROUPS); the thread of column j and group q walks every position in
 * order and adds those whose row is in its group: each element is summed
 * by one thread in position order (no atomics, the same result every
 * run), and D x EMB_GROUPS threads share the work. */
#define EMB_GROUPS 64

static void gen_embedding_grad(CuGen *g, const KpLoopPlan *p) {
  const IrOp *op = p->op;
  const IrValue *idx = op->args[0], *dy = op->args[1], *y = op->result;
  int64_t rows = p->rows, D = p->len, n = p->n;
  int64_t groups = rows < EMB_GROUPS ? (rows > 0 ? rows : 1) : EMB_GROUPS;
  int64_t gy = (groups + 7) / 8; /* blocks of 8 groups per column block */
  IrDType dt = y->type.dtype;
  bool grad = y->storage == IR_STORE_GRAD;
  In ii = in_of(g, idx, 0), di = in_of(g, dy, 0);
  const char *yp = cu_param(g, y, 0, true);
  g->block[0] = 32, g->block[1] = 8, g->grid = (D + 31) / 32 * gy;
  g->how = cu_fmt(g, "embedding_grad: a thread per column (%lld) and group of rows (%lld groups), walking the %lld "
                     "positions in order",
                  (long long)D, (long long)groups, (long long)n);
  cu_line(g, "const long j = (long)(blockIdx.x / %lld) * 32 + threadIdx.x;", (long long)gy);
  cu_line(g, "const int q = (int)(blockIdx.x %% %lld) * 8 + threadIdx.y; // rows t with t %% %lld == q",
          (long long)gy, (long long)groups);
  cu_line(g, "if (j >= %lld || q >= %lld) return;", (long long)D, (long long)groups);
  if (!grad) {
    cu_line(g, "for (long r = q; r < %lld; r += %lld) {", (long long)rows, (long long)groups);
    g->indent++;
    cu_store(g, dt, false, cu_fmt(g, "%s[r * %lld + j]", yp, (long long)D), cu_lit(g, dt, 0));
    end_block(g);
  }
  cu_line(g, "for (long p = 0; p < %lld; p++) {", (long long)n);
  g->indent++;
  cu_line(g, "const int t = %s;", elem_at(g, &ii, "p"));
  cu_line(g, "if (t < 0 || t >= %lld || t %% %lld != q) continue;", (long long)rows, (long long)groups);
  const char *v = elem_at(g, &di, cu_fmt(g, "p * %lld + j", (long long)D));
  const char *lv = cu_fmt(g, "%s[(long)t * %lld + j]", yp, (long long)D);
  if (grad)
    cu_store(g, dt, true, lv, v);
  else
    cu_store(g, dt, false, lv, cu_round(g, dt, cu_fmt(g, "%s + %s", cu_load(g, dt, false, lv), v)));
  end_block(g);
}

/* The row-major coordinates of `i` over dims[0..n), as `const long NAMEa`. */
static void coord_lines(CuGen *g, const char *i, const char *name, const int64_t *dims, int n) {
  int64_t inner = 1;
  for (int a = n - 1; a >= 0; a--) {
    const char *q = inner == 1 ? i : cu_fmt(g, "(%s / %lld)", i, (long long)inner);
    if (a > 0)
      cu_line(g, "const long %s%d = %s %% %lld;", name, a, q, (long long)dims[a]);
    else
      cu_line(g, "const long %s%d = %s;", name, a, q);
    inner *= dims[a];
  }
}

/* patches (im2col): one thread per patch element [l..., k..., o...],
 * reading x at o * stride - padding + k * dilation along each spatial
 * axis, or the padding value outside the image. */
static void gen_patches(CuGen *g, const KpLoopPlan *p) {
  const IrOp *op = p->op;
  const IrPatches *pg = &p->pg;
  const IrValue *x = op->args[0], *y = op->result;
  int d = pg->d, lead = pg->lead;
  IrDType dt = y->type.dtype;
  In xi = in_of(g, x, 0);
  const char *yp = cu_param(g, y, 0, true);
  grid_loop(g, numel(y), "patches: one thread per patch element, grid-stride");
  coord_lines(g, "i", "c", pg->cols.dim, pg->cols.rank);
  StrBuf cond, off;
  sb_init(&cond);
  sb_init(&off);
  sb_puts(&off, "0");
  for (int a = 0; a < lead; a++) sb_printf(&off, " + c%d * %lld", a, (long long)p->pst[a]);
  for (int i = 0; i < d; i++) {
    cu_line(g, "const long s%d = c%d * %lld - %lld + c%d * %lld;", i, lead + d + i, (long long)pg->stride[i],
            (long long)pg->padding[i], lead + i, (long long)pg->dilation[i]);
    sb_printf(&cond, "%ss%d >= 0 && s%d < %lld", i ? " && " : "", i, i, (long long)pg->in[i]);
    sb_printf(&off, " + s%d * %lld", i, (long long)p->pst[lead + i]);
  }
  const char *v = elem_at(g, &xi, sb_str(&off));
  cu_store(g, dt, false, cu_fmt(g, "%s[i]", yp), cu_fmt(g, "(%s) ? %s : %s", sb_str(&cond), v, cu_lit(g, dt, pg->value)));
  sb_free(&cond);
  sb_free(&off);
  end_block(g);
}

/* patches_grad (col2im): one thread per image element, summing dy over
 * the kernel positions in order (as the interpreter's scatter-add): for
 * each, o = (s + padding - k * dilation) / stride when that divides
 * exactly and is in range.  No atomics, so the sums do not depend on
 * scheduling. */
static void gen_patches_grad(CuGen *g, const KpLoopPlan *p) {
  const IrOp *op = p->op;
  const IrPatches *pg = &p->pg;
  const IrValue *dy = op->args[0], *y = op->result;
  int d = pg->d, lead = pg->lead;
  IrDType dt = y->type.dtype;
  bool grad = y->storage == IR_STORE_GRAD;
  In di = in_of(g, dy, 0);
  const char *yp = cu_param(g, y, 0, true);
  grid_loop(g, numel(y), "patches_grad: one thread per image element, summing over the kernel positions");
  coord_lines(g, "i", "c", pg->image.dim, pg->image.rank);
  cu_line(g, "%s acc = %s;", cu_acc_type(dt), cu_lit(g, acc_dtype(dt), 0));
  StrBuf off;
  sb_init(&off);
  sb_puts(&off, "0");
  for (int a = 0; a < lead; a++) sb_printf(&off, " + c%d * %lld", a, (long long)p->cst[a]);
  for (int i = 0; i < d; i++) {
    cu_line(g, "for (long k%d = 0; k%d < %lld; k%d++) {", i, i, (long long)pg->kernel[i], i);
    g->indent++;
    cu_line(g, "const long t%d = c%d + %lld - k%d * %lld;", i, lead + i, (long long)pg->padding[i], i,
            (long long)pg->dilation[i]);
    cu_line(g, "if (t%d < 0 || t%d %% %lld != 0 || t%d / %lld >= %lld) continue;", i, i, (long long)pg->stride[i], i,
            (long long)pg->stride[i], (long long)pg->out[i]);
    sb_printf(&off, " + k%d * %lld + t%d / %lld * %lld", i, (long long)p->cst[lead + i], i, (long long)pg->stride[i],
              (long long)p->cst[lead + d + i]);
  }
  cu_line(g, "acc += %s;", elem_at(g, &di, sb_str(&off)));
  for (int i = 0; i < d; i++) end_block(g);
  cu_store(g, dt, grad, cu_fmt(g, "%s[i]", yp), cu_round(g, dt, "acc"));
  sb_free(&off);
  end_block(g);
}

void cu_loop_kernel(CuGen *g, const IrOp *op) {
  KpLoopPlan p;
  kp_loop_plan(op, &p);
  switch (p.kind) {
  case KP_LOOP_PERMUTE: gen_permute(g, &p); break;
  case KP_LOOP_TRANSPOSE: gen_transpose(g, &p); break;
  case KP_LOOP_SLICE: gen_slice(g, &p); break;
  case KP_LOOP_UNSLICE: gen_unslice(g, &p); break;
  case KP_LOOP_CONCAT: gen_concat(g, &p); break;
  case KP_LOOP_REDUCE: gen_reduce(g, &p); break;
  case KP_LOOP_SOFTMAX: gen_softmax_axis(g, &p); break;
  case KP_LOOP_CE_TOTAL: gen_ce_total(g, &p); break;
  case KP_LOOP_MSE_TOTAL: gen_mse_total(g, &p); break;
  case KP_LOOP_EMBEDDING_GRAD: gen_embedding_grad(g, &p); break;
  case KP_LOOP_PATCHES: gen_patches(g, &p); break;
  case KP_LOOP_PATCHES_GRAD: gen_patches_grad(g, &p); break;
  case KP_LOOP_NONE: cu_error(g, "no loop-nest code for '%s'", ir_op_info[op->opcode].name); break;
  }
}
