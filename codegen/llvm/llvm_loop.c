/* llvm_loop.c - kernels of one op that do not fit rows (docs/BACKEND.md):
 * permute, slice, unslice, concat, reductions over leading axes,
 * softmax over a leading axis, embedding_grad, cross_entropy/mse_loss
 * reduced to a scalar, and language v2's arange, gather, gather_grad, topk.  Each is a general loop nest whose outer loop
 * [begin, end) runs over independent pieces of the output (output rows,
 * column blocks, or one piece for a full reduction), so every output
 * element is written by exactly one iteration (accumulated into gradient
 * buffers).  The index space is kp_loop_plan's (passes/kernel_loop.c);
 * how it is cut into iterations is this file's.  Semantics follow
 * runtime/interp.c. */
#include <math.h>
#include <string.h>

#include "llvm_gen.h"

#define CHUNK 256 /* columns per iteration of embedding_grad */
/* Columns per iteration of column-blocked reductions: whole rows up to
 * 2048 (a sum over the rows of [2048, 1024] reading each row in one
 * sequential run is 4x faster than four passes over 256-column strips,
 * which touch every page four times; the accumulator, 16 KB of doubles,
 * stays in L1). */
#define RED_CHUNK 2048
/* Image columns per iteration of patches_grad (its accumulators). */
#define PATCH_CHUNK 1024

static int64_t numel(const IrValue *v) { return ir_numel(&v->type.shape); }

/* sum over axes of coord_a(i) * stride[a], where i runs over dims[0..n) row-major. */
static LLVMValueRef strided(Gen *g, LLVMValueRef i, const int64_t *dims, const int64_t *stride, int n) {
  LLVMValueRef off = gen_i64(g, 0);
  int64_t inner = 1;
  for (int a = n - 1; a >= 0; a--) {
    if (stride[a] != 0 && dims[a] != 1) {
      LLVMValueRef q = inner == 1 ? i : LLVMBuildUDiv(g->b, i, gen_i64(g, inner), "");
      if (a > 0) q = LLVMBuildURem(g->b, q, gen_i64(g, dims[a]), "");
      off = LLVMBuildNSWAdd(g->b, off, LLVMBuildNSWMul(g->b, q, gen_i64(g, stride[a]), ""), "");
    }
    inner *= dims[a];
  }
  return off;
}

static LLVMValueRef add(Gen *g, LLVMValueRef a, LLVMValueRef b) { return LLVMBuildNSWAdd(g->b, a, b, ""); }
static LLVMValueRef mul(Gen *g, LLVMValueRef a, int64_t c) { return LLVMBuildNSWMul(g->b, a, gen_i64(g, c), ""); }

/* Column blocks of a reduction that keeps the last axis: ch columns per
 * iteration, nch blocks per output row. */
static void red_chunks(const KpReduce *r, int64_t *ch, int64_t *nch) {
  *ch = r->cols ? (r->blk < RED_CHUNK ? r->blk : RED_CHUNK) : 1;
  *nch = r->cols ? (r->blk + *ch - 1) / (*ch ? *ch : 1) : 1;
}

/* ------------------------------------------------------------------ */
/* Extents                                                             */
/* ------------------------------------------------------------------ */

static void loop_extent(const IrOp *op, int64_t *iters, int64_t *cost) {
  const IrValue *y = op->result;
  int64_t last = y->type.shape.rank ? y->type.shape.dim[y->type.shape.rank - 1] : 1;
  KpLoopPlan p;
  kp_loop_plan(op, &p);
  *iters = 1;
  *cost = numel(y);
  switch (p.kind) {
  case KP_LOOP_TRANSPOSE:
    *iters = p.outer * p.nt * p.nl;
    *cost = KP_TILE * KP_TILE;
    break;
  case KP_LOOP_PERMUTE:
  case KP_LOOP_SLICE:
  case KP_LOOP_UNSLICE:
  case KP_LOOP_CONCAT:
    *iters = last ? numel(y) / last : 0;
    *cost = last;
    break;
  case KP_LOOP_REDUCE: {
    int64_t ch, nch;
    red_chunks(&p.red, &ch, &nch);
    *iters = p.red.cols ? p.red.outer * nch : p.red.outer;
    *cost = p.red.mred * (p.red.cols ? ch : p.red.blk);
    break;
  }
  case KP_LOOP_SOFTMAX:
    if (op->args[0]->type.shape.rank > 0) {
      *iters = p.lines;
      *cost = 3 * p.len;
    }
    break;
  case KP_LOOP_EMBEDDING_GRAD: {
    int64_t D = p.len, ch = D < CHUNK ? D : CHUNK;
    *iters = ch ? (D + ch - 1) / ch : 0;
    *cost = (p.n + p.rows) * ch;
    break;
  }
  case KP_LOOP_CE_TOTAL:
  case KP_LOOP_MSE_TOTAL: *cost = 3 * numel(op->args[0]); break;
  case KP_LOOP_PATCHES:
    *iters = last ? numel(y) / last : 0;
    *cost = last;
    break;
  case KP_LOOP_PATCHES_GRAD: {
    int64_t K = 1, ch = last < PATCH_CHUNK ? last : PATCH_CHUNK;
    for (int i = 0; i < p.pg.d; i++) K *= p.pg.kernel[i];
    *iters = last ? numel(y) / last * ((last + ch - 1) / ch) : 0;
    *cost = ch * K;
    break;
  }
  case KP_LOOP_ARANGE: break;
  case KP_LOOP_GATHER:
    *iters = p.outer * p.n;
    *cost = p.inner;
    break;
  case KP_LOOP_GATHER_GRAD: {
    int64_t ch = p.inner < CHUNK ? p.inner : CHUNK;
    *iters = p.outer * ((p.inner + ch - 1) / ch);
    *cost = (p.len + p.n) * ch;
    break;
  }
  case KP_LOOP_TOPK:
    *iters = p.outer * p.inner;
    *cost = p.n * p.len;
    break;
  case KP_LOOP_NONE: break;
  }
}

void gen_kernel_extent(const IrFunc *f, IrOp **ops, int n, const KpRowLayout *l, int64_t *iters, int64_t *cost) {
  (void)f;
  if (l) {
    int64_t unit = gen_row_unit(ops, n, l);
    *iters = l->rows / unit;
    *cost = l->cols * (n > 0 ? n : 1) * unit;
    return;
  }
  loop_extent(ops[0], iters, cost);
}

/* ------------------------------------------------------------------ */
/* Copies: permute, slice, unslice, concat                             */
/* ------------------------------------------------------------------ */

/* out[r, j] = x[base + strided(r) + j * jstride], one output row per iteration. */
static void gather_rows(Gen *g, const IrOp *op, const int64_t *st, int64_t base) {
  const IrShape *o = &op->result->type.shape;
  int k = o->rank;
  int64_t cols = k ? o->dim[k - 1] : 1;
  GenBuf x = gen_buf(g, op->args[0]), y = gen_buf_out(g, op->result);
  GenLoop rl, cl;
  gen_loop_begin(g, &rl, g->begin, g->end, "row");
  LLVMValueRef xoff = add(g, gen_i64(g, base), strided(g, rl.iv, o->dim, st, k > 0 ? k - 1 : 0));
  LLVMValueRef yoff = mul(g, rl.iv, cols);
  gen_loop_begin(g, &cl, gen_i64(g, 0), gen_i64(g, cols), "col");
  LLVMValueRef xi = add(g, xoff, mul(g, cl.iv, k ? st[k - 1] : 0));
  gen_buf_store(g, &y, add(g, yoff, cl.iv), gen_buf_load(g, &x, xi));
  gen_loop_end(g, &cl);
  gen_loop_end(g, &rl);
}

/* A transpose in KP_TILE x KP_TILE tiles, one per iteration. */
static void gen_transpose(Gen *g, const KpLoopPlan *p) {
  const IrOp *op = p->op;
  const IrShape *o = &op->result->type.shape;
  int k = o->rank, t = p->t;
  int64_t nt = p->nt, nl = p->nl;
  GenBuf x = gen_buf(g, op->args[0]), y = gen_buf_out(g, op->result);
  GenLoop it, il, jl;
  gen_loop_begin(g, &it, g->begin, g->end, "tile");
  LLVMValueRef ob = LLVMBuildUDiv(g->b, it.iv, gen_i64(g, nt * nl), "");
  LLVMValueRef rem = LLVMBuildURem(g->b, it.iv, gen_i64(g, nt * nl), "");
  LLVMValueRef i0 = mul(g, LLVMBuildUDiv(g->b, rem, gen_i64(g, nl), ""), KP_TILE);
  LLVMValueRef j0 = mul(g, LLVMBuildURem(g->b, rem, gen_i64(g, nl), ""), KP_TILE);
  LLVMValueRef xo = strided(g, ob, p->od, p->ist, p->m), yo = strided(g, ob, p->od, p->ost, p->m);
  LLVMValueRef ie = add(g, i0, gen_i64(g, KP_TILE)), je = add(g, j0, gen_i64(g, KP_TILE));
  ie = LLVMBuildSelect(g->b, LLVMBuildICmp(g->b, LLVMIntSLT, ie, gen_i64(g, o->dim[t]), ""), ie, gen_i64(g, o->dim[t]), "");
  je = LLVMBuildSelect(g->b, LLVMBuildICmp(g->b, LLVMIntSLT, je, gen_i64(g, o->dim[k - 1]), ""), je,
                       gen_i64(g, o->dim[k - 1]), "");
  gen_loop_begin(g, &il, i0, ie, "i");
  LLVMValueRef xi = add(g, xo, il.iv), yi = add(g, yo, mul(g, il.iv, p->os[t]));
  gen_loop_begin(g, &jl, j0, je, "j");
  gen_buf_store(g, &y, add(g, yi, jl.iv), gen_buf_load(g, &x, add(g, xi, mul(g, jl.iv, p->st[k - 1]))));
  gen_loop_end(g, &jl);
  gen_loop_end(g, &il);
  gen_loop_end(g, &it);
}

/* Zeros with the slice region filled in: each output row is zeroed (unless
 * it accumulates into a gradient buffer) and, when it lies in the region,
 * the operand's row is written into it. */
static void gen_unslice(Gen *g, const KpLoopPlan *p) {
  const IrOp *op = p->op;
  const IrShape *o = &op->result->type.shape, *s = &op->args[0]->type.shape;
  int k = o->rank;
  const int64_t *start = p->start, *step = p->step, *xs = p->xs;
  int64_t cols = k ? o->dim[k - 1] : 1;
  GenBuf x = gen_buf(g, op->args[0]), y = gen_buf_out(g, op->result);
  IrDType dt = op->result->type.dtype;
  GenLoop rl, cl;
  gen_loop_begin(g, &rl, g->begin, g->end, "row");
  LLVMValueRef yoff = mul(g, rl.iv, cols);
  if (!y.grad) {
    gen_loop_begin(g, &cl, gen_i64(g, 0), gen_i64(g, cols), "zero");
    gen_buf_store(g, &y, add(g, yoff, cl.iv), gen_const(g, dt, 0.0));
    gen_loop_end(g, &cl);
  }
  /* in the region along every row axis? and the operand's row */
  LLVMValueRef in = LLVMConstInt(g->t_i1, 1, 0), xoff = gen_i64(g, 0);
  int64_t inner = 1;
  for (int a = k - 2; a >= 0; a--) {
    LLVMValueRef c = inner == 1 ? rl.iv : LLVMBuildUDiv(g->b, rl.iv, gen_i64(g, inner), "");
    if (a > 0) c = LLVMBuildURem(g->b, c, gen_i64(g, o->dim[a]), "");
    inner *= o->dim[a];
    LLVMValueRef rel = LLVMBuildSub(g->b, c, gen_i64(g, start[a]), "");
    LLVMValueRef q = LLVMBuildSDiv(g->b, rel, gen_i64(g, step[a]), "");
    LLVMValueRef exact = LLVMBuildICmp(g->b, LLVMIntEQ, LLVMBuildSRem(g->b, rel, gen_i64(g, step[a]), ""), gen_i64(g, 0), "");
    LLVMValueRef lo = LLVMBuildICmp(g->b, LLVMIntSGE, q, gen_i64(g, 0), "");
    LLVMValueRef hi = LLVMBuildICmp(g->b, LLVMIntSLT, q, gen_i64(g, s->dim[a]), "");
    in = LLVMBuildAnd(g->b, in, LLVMBuildAnd(g->b, exact, LLVMBuildAnd(g->b, lo, hi, ""), ""), "");
    xoff = add(g, xoff, LLVMBuildMul(g->b, q, gen_i64(g, xs[a]), ""));
  }
  LLVMBasicBlockRef copy = LLVMAppendBasicBlockInContext(g->ctx, g->fn, "region");
  LLVMBasicBlockRef done = LLVMAppendBasicBlockInContext(g->ctx, g->fn, "");
  LLVMBuildCondBr(g->b, in, copy, done);
  LLVMPositionBuilderAtEnd(g->b, copy);
  int64_t n = k ? s->dim[k - 1] : 1;
  gen_loop_begin(g, &cl, gen_i64(g, 0), gen_i64(g, n), "col");
  LLVMValueRef j = add(g, gen_i64(g, k ? start[k - 1] : 0), mul(g, cl.iv, k ? step[k - 1] : 0));
  gen_buf_store(g, &y, add(g, yoff, j), gen_buf_load(g, &x, add(g, xoff, cl.iv)));
  gen_loop_end(g, &cl);
  LLVMBuildBr(g->b, done);
  LLVMPositionBuilderAtEnd(g->b, done);
  gen_loop_end(g, &rl);
}

static void copy_row(Gen *g, const GenBuf *y, LLVMValueRef yoff, const GenBuf *x, LLVMValueRef xoff, int64_t n) {
  GenLoop cl;
  gen_loop_begin(g, &cl, gen_i64(g, 0), gen_i64(g, n), "col");
  gen_buf_store(g, y, add(g, yoff, cl.iv), gen_buf_load(g, x, add(g, xoff, cl.iv)));
  gen_loop_end(g, &cl);
}

static void gen_concat(Gen *g, const KpLoopPlan *p) {
  const IrOp *op = p->op;
  const IrShape *o = &op->result->type.shape;
  int k = o->rank;
  int64_t axis = p->axis;
  int64_t cols = o->dim[k - 1];
  GenBuf y = gen_buf_out(g, op->result);
  GenLoop rl;
  gen_loop_begin(g, &rl, g->begin, g->end, "row");
  LLVMValueRef yoff = mul(g, rl.iv, cols);
  if (axis == k - 1) {
    int64_t at = 0;
    for (int i = 0; i < op->nargs; i++) {
      GenBuf x = gen_buf(g, op->args[i]);
      int64_t w = op->args[i]->type.shape.dim[axis];
      copy_row(g, &y, add(g, yoff, gen_i64(g, at)), &x, mul(g, rl.iv, w), w);
      at += w;
    }
  } else {
    /* r = (outer * O[axis] + c) * inner + rest; the operand holding c */
    int64_t inner = p->row_inner;
    LLVMValueRef c = LLVMBuildURem(g->b, LLVMBuildUDiv(g->b, rl.iv, gen_i64(g, inner), ""), gen_i64(g, o->dim[axis]), "");
    LLVMValueRef outer = LLVMBuildUDiv(g->b, rl.iv, gen_i64(g, inner * o->dim[axis]), "");
    LLVMValueRef rest = LLVMBuildURem(g->b, rl.iv, gen_i64(g, inner), "");
    LLVMBasicBlockRef done = LLVMAppendBasicBlockInContext(g->ctx, g->fn, "");
    int64_t at = 0;
    for (int i = 0; i < op->nargs; i++) {
      int64_t w = op->args[i]->type.shape.dim[axis];
      LLVMBasicBlockRef here = LLVMAppendBasicBlockInContext(g->ctx, g->fn, "part");
      LLVMBasicBlockRef next = LLVMAppendBasicBlockInContext(g->ctx, g->fn, "");
      LLVMValueRef hit = LLVMBuildICmp(g->b, LLVMIntULT, c, gen_i64(g, at + w), "");
      LLVMBuildCondBr(g->b, hit, here, next);
      LLVMPositionBuilderAtEnd(g->b, here);
      GenBuf x = gen_buf(g, op->args[i]);
      LLVMValueRef xr = add(g, mul(g, add(g, mul(g, outer, w), LLVMBuildSub(g->b, c, gen_i64(g, at), "")), inner), rest);
      copy_row(g, &y, yoff, &x, mul(g, xr, cols), cols);
      LLVMBuildBr(g->b, done);
      LLVMPositionBuilderAtEnd(g->b, next);
      at += w;
    }
    LLVMBuildBr(g->b, done);
    LLVMPositionBuilderAtEnd(g->b, done);
  }
  gen_loop_end(g, &rl);
}

/* ------------------------------------------------------------------ */
/* Reductions over leading axes                                        */
/* ------------------------------------------------------------------ */

static void gen_reduce(Gen *g, const KpLoopPlan *p) {
  const IrOp *op = p->op;
  const KpReduce *r = &p->red;
  int64_t ch, nch;
  red_chunks(r, &ch, &nch);
  IrOpcode opc = op->opcode;
  IrDType dt = op->result->type.dtype;
  bool mx = opc == IR_OP_MAX || opc == IR_OP_LOGSUMEXP;
  /* maxima in the register type, sums widened (gen_acc_type) */
  LLVMTypeRef t = mx ? gen_reg_type(g, dt) : gen_acc_type(g, dt), tw = gen_acc_type(g, dt);
  LLVMValueRef init = LLVMGetTypeKind(t) == LLVMIntegerTypeKind ? LLVMConstInt(t, 0, 0) : LLVMConstReal(t, mx ? -INFINITY : 0.0);
  GenBuf x = gen_buf(g, op->args[0]), y = gen_buf_out(g, op->result);
  LLVMValueRef acc = gen_alloca(g, t, ch), acc2 = opc == IR_OP_LOGSUMEXP ? gen_alloca(g, tw, ch) : NULL;
  GenLoop it, ml, jl;
  gen_loop_begin(g, &it, g->begin, g->end, "it");
  /* o: the output row; j0, len: the column block */
  LLVMValueRef o = r->cols ? LLVMBuildUDiv(g->b, it.iv, gen_i64(g, nch), "") : it.iv;
  LLVMValueRef j0 = r->cols ? mul(g, LLVMBuildURem(g->b, it.iv, gen_i64(g, nch), ""), ch) : gen_i64(g, 0);
  LLVMValueRef len = gen_i64(g, ch);
  if (r->cols) {
    LLVMValueRef left = LLVMBuildSub(g->b, gen_i64(g, r->blk), j0, "");
    len = LLVMBuildSelect(g->b, LLVMBuildICmp(g->b, LLVMIntSLT, left, len, ""), left, len, "");
  }
  LLVMValueRef xo = add(g, strided(g, o, r->kd, r->ks, r->nk), j0);
  int64_t inner = r->cols ? 1 : r->blk; /* the contiguous run each reduced step reads */
  /* Pass 1 (and 2 for logsumexp) over the reduced positions. */
  for (int pass = 0; pass < (opc == IR_OP_LOGSUMEXP ? 2 : 1); pass++) {
    LLVMValueRef a = pass == 0 ? acc : acc2;
    LLVMTypeRef at = pass == 0 ? t : tw;
    gen_loop_begin(g, &jl, gen_i64(g, 0), len, "init");
    LLVMBuildStore(g->b, pass == 0 ? init : LLVMConstReal(tw, 0.0), LLVMBuildInBoundsGEP2(g->b, at, a, &jl.iv, 1, ""));
    gen_loop_end(g, &jl);
    gen_loop_begin(g, &ml, gen_i64(g, 0), gen_i64(g, r->mred), "red");
    LLVMValueRef xb = add(g, xo, strided(g, ml.iv, r->rd, r->rs, r->nr));
    gen_loop_begin(g, &jl, gen_i64(g, 0), r->cols ? len : gen_i64(g, inner), "j");
    LLVMValueRef v = gen_buf_load(g, &x, add(g, xb, jl.iv));
    LLVMValueRef ai = r->cols ? jl.iv : gen_i64(g, 0);
    LLVMValueRef p = LLVMBuildInBoundsGEP2(g->b, at, a, &ai, 1, "");
    LLVMValueRef cur = LLVMBuildLoad2(g->b, at, p, "");
    LLVMValueRef nv;
    if (pass == 1) {
      LLVMValueRef m = LLVMBuildLoad2(g->b, t, LLVMBuildInBoundsGEP2(g->b, t, acc, &ai, 1, ""), "");
      nv = gen_add_reassoc(g, cur, gen_widen(g, gen_exp_nonpos(g, LLVMBuildFSub(g->b, v, m, ""))));
    } else {
      nv = mx ? gen_max_step(g, cur, v) : gen_add_reassoc(g, cur, gen_widen(g, v));
    }
    LLVMBuildStore(g->b, nv, p);
    gen_loop_end(g, &jl);
    gen_loop_end(g, &ml);
  }
  /* Write the block. */
  gen_loop_begin(g, &jl, gen_i64(g, 0), len, "out");
  LLVMValueRef v = LLVMBuildLoad2(g->b, t, LLVMBuildInBoundsGEP2(g->b, t, acc, &jl.iv, 1, ""), "");
  if (opc == IR_OP_MEAN) v = LLVMBuildFDiv(g->b, v, LLVMConstReal(t, (double)r->count), "");
  if (opc == IR_OP_LOGSUMEXP) {
    LLVMValueRef s = LLVMBuildLoad2(g->b, tw, LLVMBuildInBoundsGEP2(g->b, tw, acc2, &jl.iv, 1, ""), "");
    LLVMValueRef l = LLVMBuildFAdd(g->b, gen_widen(g, v), gen_call1(g, "llvm.log", s), "");
    v = LLVMBuildSelect(g->b, gen_isfinite(g, v), l, gen_widen(g, v), "");
  }
  LLVMValueRef yi = r->cols ? add(g, add(g, mul(g, o, r->blk), j0), jl.iv) : o;
  gen_buf_store(g, &y, yi, dt == IR_DT_I32 ? v : gen_narrow(g, v, dt));
  gen_loop_end(g, &jl);
  gen_loop_end(g, &it);
}

/* ------------------------------------------------------------------ */
/* Softmax over a leading axis                                         */
/* ------------------------------------------------------------------ */

static void gen_softmax_axis(Gen *g, const KpLoopPlan *p) {
  const IrOp *op = p->op;
  const IrShape *s = &op->args[0]->type.shape;
  bool logsm = op->opcode == IR_OP_LOG_SOFTMAX;
  IrDType dt = op->result->type.dtype;
  LLVMTypeRef t = gen_reg_type(g, dt);
  GenBuf x = gen_buf(g, op->args[0]), y = gen_buf_out(g, op->result);
  GenLoop it, l;
  gen_loop_begin(g, &it, g->begin, g->end, "it");
  if (s->rank == 0) {
    LLVMValueRef v = gen_buf_load(g, &x, gen_i64(g, 0));
    gen_buf_store(g, &y, gen_i64(g, 0), logsm ? LLVMBuildFSub(g->b, v, v, "") : LLVMConstReal(t, 1.0));
    gen_loop_end(g, &it);
    return;
  }
  int64_t L = p->len, inner = p->inner;
  LLVMValueRef o = LLVMBuildUDiv(g->b, it.iv, gen_i64(g, inner), "");
  LLVMValueRef i = LLVMBuildURem(g->b, it.iv, gen_i64(g, inner), "");
  LLVMValueRef base = add(g, mul(g, o, L * inner), i);
  GenAcc m = gen_acc(g, t), z = gen_acc(g, g->t_f64);
  gen_acc_set(g, m, LLVMConstReal(t, -INFINITY));
  gen_acc_set(g, z, LLVMConstReal(g->t_f64, 0.0));
  gen_loop_begin(g, &l, gen_i64(g, 0), gen_i64(g, L), "max");
  gen_acc_set(g, m, gen_max_step(g, gen_acc_get(g, m), gen_buf_load(g, &x, add(g, base, mul(g, l.iv, inner)))));
  gen_loop_end(g, &l);
  LLVMValueRef mv = gen_acc_get(g, m);
  gen_loop_begin(g, &l, gen_i64(g, 0), gen_i64(g, L), "sum");
  LLVMValueRef d = LLVMBuildFSub(g->b, gen_buf_load(g, &x, add(g, base, mul(g, l.iv, inner))), mv, "");
  gen_acc_set(g, z, gen_add_reassoc(g, gen_acc_get(g, z), gen_widen(g, gen_exp_nonpos(g, d))));
  gen_loop_end(g, &l);
  LLVMValueRef zv = gen_acc_get(g, z), lz = gen_call1(g, "llvm.log", zv);
  gen_loop_begin(g, &l, gen_i64(g, 0), gen_i64(g, L), "out");
  LLVMValueRef idx = add(g, base, mul(g, l.iv, inner));
  d = LLVMBuildFSub(g->b, gen_buf_load(g, &x, idx), mv, "");
  LLVMValueRef v = logsm ? LLVMBuildFSub(g->b, gen_widen(g, d), lz, "")
                         : LLVMBuildFDiv(g->b, gen_widen(g, gen_exp_nonpos(g, d)), zv, "");
  gen_buf_store(g, &y, idx, gen_narrow(g, v, dt));
  gen_loop_end(g, &l);
  gen_loop_end(g, &it);
}

/* ------------------------------------------------------------------ */
/* Scalar losses                                                       */
/* ------------------------------------------------------------------ */

/* cross_entropy reduced to a scalar: the total in f64 as the interpreter. */
static void gen_ce_total(Gen *g, const KpLoopPlan *p) {
  const IrOp *op = p->op;
  int64_t V = p->len, n = p->n, ii = p->ignore_index;
  IrDType dt = op->result->type.dtype;
  LLVMTypeRef t = gen_reg_type(g, op->args[0]->type.dtype);
  GenBuf x = gen_buf(g, op->args[0]), tg = gen_buf(g, op->args[1]), y = gen_buf_out(g, op->result);
  GenAcc total = gen_acc(g, g->t_f64), count = gen_acc(g, g->t_i64), m = gen_acc(g, t), z = gen_acc(g, g->t_f64);
  GenLoop it, pl, l;
  gen_loop_begin(g, &it, g->begin, g->end, "it");
  gen_acc_set(g, total, LLVMConstReal(g->t_f64, 0.0));
  gen_acc_set(g, count, gen_i64(g, 0));
  gen_loop_begin(g, &pl, gen_i64(g, 0), gen_i64(g, n), "row");
  LLVMValueRef base = mul(g, pl.iv, V);
  gen_acc_set(g, m, LLVMConstReal(t, -INFINITY));
  gen_acc_set(g, z, LLVMConstReal(g->t_f64, 0.0));
  gen_loop_begin(g, &l, gen_i64(g, 0), gen_i64(g, V), "max");
  gen_acc_set(g, m, gen_max_step(g, gen_acc_get(g, m), gen_buf_load(g, &x, add(g, base, l.iv))));
  gen_loop_end(g, &l);
  LLVMValueRef mv = gen_acc_get(g, m);
  gen_loop_begin(g, &l, gen_i64(g, 0), gen_i64(g, V), "sum");
  LLVMValueRef d = LLVMBuildFSub(g->b, gen_buf_load(g, &x, add(g, base, l.iv)), mv, "");
  gen_acc_set(g, z, gen_add_reassoc(g, gen_acc_get(g, z), gen_widen(g, gen_exp_nonpos(g, d))));
  gen_loop_end(g, &l);
  LLVMValueRef lse = LLVMBuildFAdd(g->b, gen_widen(g, mv), gen_call1(g, "llvm.log", gen_acc_get(g, z)), "");
  lse = LLVMBuildSelect(g->b, gen_isfinite(g, mv), lse, gen_widen(g, mv), "");
  LLVMValueRef tv = gen_buf_load(g, &tg, pl.iv);
  LLVMValueRef t64 = LLVMBuildSExt(g->b, tv, g->t_i64, "");
  LLVMValueRef ignored = LLVMBuildICmp(g->b, LLVMIntEQ, tv, LLVMConstInt(g->t_i32, (unsigned long long)ii, 1), "");
  LLVMValueRef ok = LLVMBuildAnd(g->b, LLVMBuildICmp(g->b, LLVMIntSGE, t64, gen_i64(g, 0), ""),
                                 LLVMBuildICmp(g->b, LLVMIntSLT, t64, gen_i64(g, V), ""), "");
  LLVMValueRef safe = LLVMBuildSelect(g->b, ok, t64, gen_i64(g, 0), "");
  LLVMValueRef loss = LLVMBuildFSub(g->b, lse, gen_widen(g, gen_buf_load(g, &x, add(g, base, safe))), "");
  loss = LLVMBuildSelect(g->b, ok, loss, LLVMConstReal(g->t_f64, NAN), "");
  loss = LLVMBuildSelect(g->b, ignored, LLVMConstReal(g->t_f64, 0.0), loss, "");
  gen_acc_set(g, total, LLVMBuildFAdd(g->b, gen_acc_get(g, total), loss, ""));
  gen_acc_set(g, count, add(g, gen_acc_get(g, count), LLVMBuildZExt(g->b, LLVMBuildNot(g->b, ignored, ""), g->t_i64, "")));
  gen_loop_end(g, &pl);
  LLVMValueRef r = gen_acc_get(g, total);
  if (p->mean) {
    LLVMValueRef c = gen_acc_get(g, count);
    c = LLVMBuildSelect(g->b, LLVMBuildICmp(g->b, LLVMIntSGT, c, gen_i64(g, 1), ""), c, gen_i64(g, 1), "");
    r = LLVMBuildFDiv(g->b, r, LLVMBuildSIToFP(g->b, c, g->t_f64, ""), "");
  }
  gen_buf_store(g, &y, gen_i64(g, 0), gen_convert(g, r, IR_DT_F64, dt));
  gen_loop_end(g, &it);
}

static void gen_mse_total(Gen *g, const KpLoopPlan *p) {
  const IrOp *op = p->op;
  int64_t n = p->n;
  IrDType dt = op->result->type.dtype;
  GenBuf a = gen_buf(g, op->args[0]), b = gen_buf(g, op->args[1]), y = gen_buf_out(g, op->result);
  GenAcc total = gen_acc(g, g->t_f64);
  GenLoop it, l;
  gen_loop_begin(g, &it, g->begin, g->end, "it");
  gen_acc_set(g, total, LLVMConstReal(g->t_f64, 0.0));
  gen_loop_begin(g, &l, gen_i64(g, 0), gen_i64(g, n), "i");
  LLVMValueRef d = LLVMBuildFSub(g->b, gen_buf_load(g, &a, l.iv), gen_buf_load(g, &b, l.iv), "");
  if (LLVMTypeOf(d) != g->t_f64) d = LLVMBuildFPExt(g->b, d, g->t_f64, "");
  gen_acc_set(g, total, gen_add_reassoc(g, gen_acc_get(g, total), LLVMBuildFMul(g->b, d, d, "")));
  gen_loop_end(g, &l);
  LLVMValueRef r = gen_acc_get(g, total);
  if (p->mean) r = LLVMBuildFDiv(g->b, r, LLVMConstReal(g->t_f64, (double)n), "");
  gen_buf_store(g, &y, gen_i64(g, 0), gen_convert(g, r, IR_DT_F64, dt));
  gen_loop_end(g, &it);
}

/* ------------------------------------------------------------------ */
/* embedding_grad: scatter-add, one block of columns per iteration      */
/* ------------------------------------------------------------------ */

static void gen_embedding_grad(Gen *g, const KpLoopPlan *p) {
  const IrOp *op = p->op;
  int64_t rows = p->rows, D = p->len, n = p->n;
  int64_t ch = D < CHUNK ? D : CHUNK;
  IrDType dt = op->result->type.dtype;
  GenBuf idx = gen_buf(g, op->args[0]), dy = gen_buf(g, op->args[1]), y = gen_buf_out(g, op->result);
  GenLoop it, l, pl;
  gen_loop_begin(g, &it, g->begin, g->end, "it");
  LLVMValueRef j0 = mul(g, it.iv, ch);
  LLVMValueRef left = LLVMBuildSub(g->b, gen_i64(g, D), j0, "");
  LLVMValueRef len = LLVMBuildSelect(g->b, LLVMBuildICmp(g->b, LLVMIntSLT, left, gen_i64(g, ch), ""), left, gen_i64(g, ch), "");
  if (!y.grad) {
    GenLoop rl;
    gen_loop_begin(g, &rl, gen_i64(g, 0), gen_i64(g, rows), "zrow");
    gen_loop_begin(g, &l, gen_i64(g, 0), len, "zero");
    gen_buf_store(g, &y, add(g, add(g, mul(g, rl.iv, D), j0), l.iv), gen_const(g, dt, 0.0));
    gen_loop_end(g, &l);
    gen_loop_end(g, &rl);
  }
  gen_loop_begin(g, &pl, gen_i64(g, 0), gen_i64(g, n), "pos");
  LLVMValueRef t = LLVMBuildSExt(g->b, gen_buf_load(g, &idx, pl.iv), g->t_i64, "");
  LLVMValueRef ok = LLVMBuildAnd(g->b, LLVMBuildICmp(g->b, LLVMIntSGE, t, gen_i64(g, 0), ""),
                                 LLVMBuildICmp(g->b, LLVMIntSLT, t, gen_i64(g, rows), ""), "");
  LLVMBasicBlockRef body = LLVMAppendBasicBlockInContext(g->ctx, g->fn, "scatter");
  LLVMBasicBlockRef done = LLVMAppendBasicBlockInContext(g->ctx, g->fn, "");
  LLVMBuildCondBr(g->b, ok, body, done);
  LLVMPositionBuilderAtEnd(g->b, body);
  LLVMValueRef yo = add(g, mul(g, t, D), j0), xo = add(g, mul(g, pl.iv, D), j0);
  gen_loop_begin(g, &l, gen_i64(g, 0), len, "col");
  LLVMValueRef v = gen_buf_load(g, &dy, add(g, xo, l.iv));
  LLVMValueRef yi = add(g, yo, l.iv);
  if (y.grad) {
    gen_buf_store(g, &y, yi, v); /* accumulates */
  } else {
    LLVMValueRef cur = gen_buf_load(g, &y, yi);
    gen_buf_store(g, &y, yi, gen_round(g, LLVMBuildFAdd(g->b, cur, v, ""), dt));
  }
  gen_loop_end(g, &l);
  LLVMBuildBr(g->b, done);
  LLVMPositionBuilderAtEnd(g->b, done);
  gen_loop_end(g, &pl);
  gen_loop_end(g, &it);
}

/* ------------------------------------------------------------------ */
/* Convolution and pooling: patches (im2col) and patches_grad (col2im)  */
/* ------------------------------------------------------------------ */

/* The row-major coordinates of i over dims[0..n). */
static void coords(Gen *g, LLVMValueRef i, const int64_t *dims, int n, LLVMValueRef *c) {
  int64_t inner = 1;
  for (int a = n - 1; a >= 0; a--) {
    LLVMValueRef q = inner == 1 ? i : LLVMBuildUDiv(g->b, i, gen_i64(g, inner), "");
    c[a] = a > 0 ? LLVMBuildURem(g->b, q, gen_i64(g, dims[a]), "") : q;
    inner *= dims[a];
  }
}

static LLVMValueRef and1(Gen *g, LLVMValueRef a, LLVMValueRef b) { return LLVMBuildAnd(g->b, a, b, ""); }
static LLVMValueRef in_range(Gen *g, LLVMValueRef v, int64_t n) {
  return and1(g, LLVMBuildICmp(g->b, LLVMIntSGE, v, gen_i64(g, 0), ""), LLVMBuildICmp(g->b, LLVMIntSLT, v, gen_i64(g, n), ""));
}

/* patches: one row of the last output axis (o_d) per iteration: the
 * leading, kernel and other output coordinates fix the image row, and each
 * element reads x at o_d * stride - padding + k_d * dilation, or the
 * padding value outside the image (the load index is clamped to 0 there). */
static void gen_patches(Gen *g, const KpLoopPlan *p) {
  const IrOp *op = p->op;
  const IrPatches *pg = &p->pg;
  int d = pg->d, lead = pg->lead, k = pg->cols.rank;
  int64_t cols = pg->cols.dim[k - 1];
  IrDType dt = op->result->type.dtype;
  GenBuf x = gen_buf(g, op->args[0]), y = gen_buf_out(g, op->result);
  GenLoop rl, cl;
  gen_loop_begin(g, &rl, g->begin, g->end, "row");
  LLVMValueRef c[IR_MAX_RANK];
  coords(g, rl.iv, pg->cols.dim, k - 1, c);
  LLVMValueRef base = gen_i64(g, 0), in = LLVMConstInt(g->t_i1, 1, 0);
  for (int a = 0; a < lead; a++) base = add(g, base, mul(g, c[a], p->pst[a]));
  for (int i = 0; i < d - 1; i++) {
    LLVMValueRef pos = add(g, LLVMBuildSub(g->b, mul(g, c[lead + d + i], pg->stride[i]), gen_i64(g, pg->padding[i]), ""),
                           mul(g, c[lead + i], pg->dilation[i]));
    in = and1(g, in, in_range(g, pos, pg->in[i]));
    base = add(g, base, mul(g, pos, p->pst[lead + i]));
  }
  int l = d - 1;
  LLVMValueRef k0 = LLVMBuildSub(g->b, mul(g, c[lead + l], pg->dilation[l]), gen_i64(g, pg->padding[l]), "");
  LLVMValueRef yoff = mul(g, rl.iv, cols);
  LLVMValueRef pad = gen_const(g, dt, pg->value);
  gen_loop_begin(g, &cl, gen_i64(g, 0), gen_i64(g, cols), "col");
  LLVMValueRef pos = add(g, k0, mul(g, cl.iv, pg->stride[l]));
  LLVMValueRef ok = and1(g, in, in_range(g, pos, pg->in[l]));
  LLVMValueRef xi = LLVMBuildSelect(g->b, ok, add(g, base, pos), gen_i64(g, 0), "");
  LLVMValueRef v = LLVMBuildSelect(g->b, ok, gen_buf_load(g, &x, xi), pad, "");
  gen_buf_store(g, &y, add(g, yoff, cl.iv), v);
  gen_loop_end(g, &cl);
  gen_loop_end(g, &rl);
}

/* patches_grad: one block of an image row per iteration.  Each image
 * element sums, in f64 and in the order of the kernel positions (as the
 * interpreter's scatter-add), dy at every (k, o) with o * stride - padding
 * + k * dilation = its position: for each kernel position, o = (s +
 * padding - k * dilation) / stride when that divides exactly and is in
 * range. */
static void gen_patches_grad(Gen *g, const KpLoopPlan *p) {
  const IrOp *op = p->op;
  const IrPatches *pg = &p->pg;
  int d = pg->d, lead = pg->lead, r = pg->image.rank, l = d - 1;
  int64_t W = pg->image.dim[r - 1], ch = W < PATCH_CHUNK ? W : PATCH_CHUNK, nch = ch ? (W + ch - 1) / ch : 1;
  IrDType dt = op->result->type.dtype;
  LLVMTypeRef t = gen_acc_type(g, dt);
  GenBuf dy = gen_buf(g, op->args[0]), y = gen_buf_out(g, op->result);
  LLVMValueRef acc = gen_alloca(g, t, ch);
  GenLoop it, jl, kl[IR_MAX_RANK];
  gen_loop_begin(g, &it, g->begin, g->end, "it");
  LLVMValueRef row = LLVMBuildUDiv(g->b, it.iv, gen_i64(g, nch), "");
  LLVMValueRef j0 = mul(g, LLVMBuildURem(g->b, it.iv, gen_i64(g, nch), ""), ch);
  LLVMValueRef left = LLVMBuildSub(g->b, gen_i64(g, W), j0, "");
  LLVMValueRef len = LLVMBuildSelect(g->b, LLVMBuildICmp(g->b, LLVMIntSLT, left, gen_i64(g, ch), ""), left, gen_i64(g, ch), "");
  LLVMValueRef c[IR_MAX_RANK];
  coords(g, row, pg->image.dim, r - 1, c);
  LLVMValueRef lbase = gen_i64(g, 0);
  for (int a = 0; a < lead; a++) lbase = add(g, lbase, mul(g, c[a], p->cst[a]));
  gen_loop_begin(g, &jl, gen_i64(g, 0), len, "init");
  LLVMBuildStore(g->b, LLVMConstReal(t, 0.0), LLVMBuildInBoundsGEP2(g->b, t, acc, &jl.iv, 1, ""));
  gen_loop_end(g, &jl);
  /* kernel positions along every spatial axis, outermost first */
  LLVMValueRef base = lbase, in = LLVMConstInt(g->t_i1, 1, 0);
  for (int i = 0; i < d; i++) {
    gen_loop_begin(g, &kl[i], gen_i64(g, 0), gen_i64(g, pg->kernel[i]), "k");
    base = add(g, base, mul(g, kl[i].iv, p->cst[lead + i]));
    if (i == l) break;
    LLVMValueRef tt = LLVMBuildSub(g->b, add(g, c[lead + i], gen_i64(g, pg->padding[i])), mul(g, kl[i].iv, pg->dilation[i]), "");
    LLVMValueRef o = LLVMBuildSDiv(g->b, tt, gen_i64(g, pg->stride[i]), "");
    LLVMValueRef exact = LLVMBuildICmp(g->b, LLVMIntEQ, LLVMBuildSRem(g->b, tt, gen_i64(g, pg->stride[i]), ""), gen_i64(g, 0), "");
    in = and1(g, in, and1(g, exact, and1(g, LLVMBuildICmp(g->b, LLVMIntSGE, tt, gen_i64(g, 0), ""), in_range(g, o, pg->out[i]))));
    base = add(g, base, mul(g, o, p->cst[lead + d + i]));
  }
  /* skip the row when an outer axis reads nothing here */
  LLVMBasicBlockRef body = LLVMAppendBasicBlockInContext(g->ctx, g->fn, "read");
  LLVMBasicBlockRef skip = LLVMAppendBasicBlockInContext(g->ctx, g->fn, "");
  LLVMBuildCondBr(g->b, in, body, skip);
  LLVMPositionBuilderAtEnd(g->b, body);
  LLVMValueRef t0 = LLVMBuildSub(g->b, add(g, j0, gen_i64(g, pg->padding[l])), mul(g, kl[l].iv, pg->dilation[l]), "");
  gen_loop_begin(g, &jl, gen_i64(g, 0), len, "j");
  LLVMValueRef tt = add(g, t0, jl.iv);
  LLVMValueRef o = LLVMBuildSDiv(g->b, tt, gen_i64(g, pg->stride[l]), "");
  LLVMValueRef ok = and1(g, LLVMBuildICmp(g->b, LLVMIntEQ, LLVMBuildSRem(g->b, tt, gen_i64(g, pg->stride[l]), ""), gen_i64(g, 0), ""),
                         and1(g, LLVMBuildICmp(g->b, LLVMIntSGE, tt, gen_i64(g, 0), ""), in_range(g, o, pg->out[l])));
  LLVMValueRef di = LLVMBuildSelect(g->b, ok, add(g, base, o), gen_i64(g, 0), "");
  LLVMValueRef v = LLVMBuildSelect(g->b, ok, gen_widen(g, gen_buf_load(g, &dy, di)), LLVMConstReal(t, 0.0), "");
  LLVMValueRef ap = LLVMBuildInBoundsGEP2(g->b, t, acc, &jl.iv, 1, "");
  LLVMBuildStore(g->b, LLVMBuildFAdd(g->b, LLVMBuildLoad2(g->b, t, ap, ""), v, ""), ap);
  gen_loop_end(g, &jl);
  LLVMBuildBr(g->b, skip);
  LLVMPositionBuilderAtEnd(g->b, skip);
  for (int i = d - 1; i >= 0; i--) gen_loop_end(g, &kl[i]);
  LLVMValueRef yoff = add(g, mul(g, row, W), j0);
  gen_loop_begin(g, &jl, gen_i64(g, 0), len, "out");
  LLVMValueRef sum = LLVMBuildLoad2(g->b, t, LLVMBuildInBoundsGEP2(g->b, t, acc, &jl.iv, 1, ""), "");
  gen_buf_store(g, &y, add(g, yoff, jl.iv), gen_narrow(g, sum, dt));
  gen_loop_end(g, &jl);
  gen_loop_end(g, &it);
}

/* Language v2: arange, gather, gather_grad, topk                       */
/* ------------------------------------------------------------------ */
/* The full operand is [outer, len, inner] around the axis, the index (and
 * gather's result) [outer, n, inner] (kp_loop_plan).  An index outside
 * [0, len) reads and writes nothing (gather gives 0); the window's count
 * phase refuses such an index before any kernel runs (runtime/window.c). */

/* y[i] = i, in one iteration. */
static void gen_arange(Gen *g, const KpLoopPlan *p) {
  const IrOp *op = p->op;
  IrDType dt = op->result->type.dtype;
  GenBuf y = gen_buf_out(g, op->result);
  GenLoop it, l;
  gen_loop_begin(g, &it, g->begin, g->end, "it");
  gen_loop_begin(g, &l, gen_i64(g, 0), gen_i64(g, p->n), "i");
  LLVMValueRef v = dt == IR_DT_I32 ? LLVMBuildTrunc(g->b, l.iv, g->t_i32, "")
                                   : gen_round(g, LLVMBuildSIToFP(g->b, l.iv, gen_reg_type(g, dt), ""), dt);
  gen_buf_store(g, &y, l.iv, v);
  gen_loop_end(g, &l);
  gen_loop_end(g, &it);
}

/* gather: one result row (o, j) of `inner` elements per iteration. */
static void gen_gather(Gen *g, const KpLoopPlan *p) {
  const IrOp *op = p->op;
  int64_t len = p->len, n = p->n, inner = p->inner;
  IrDType dt = op->result->type.dtype;
  GenBuf x = gen_buf(g, op->args[0]), idx = gen_buf(g, op->args[1]), y = gen_buf_out(g, op->result);
  GenLoop rl, il;
  gen_loop_begin(g, &rl, g->begin, g->end, "row");
  LLVMValueRef xrow = mul(g, LLVMBuildUDiv(g->b, rl.iv, gen_i64(g, n), ""), len * inner);
  LLVMValueRef yrow = mul(g, rl.iv, inner);
  gen_loop_begin(g, &il, gen_i64(g, 0), gen_i64(g, inner), "i");
  LLVMValueRef e = add(g, yrow, il.iv);
  LLVMValueRef t = LLVMBuildSExt(g->b, gen_buf_load(g, &idx, e), g->t_i64, "");
  LLVMValueRef ok = in_range(g, t, len);
  LLVMValueRef safe = LLVMBuildSelect(g->b, ok, t, gen_i64(g, 0), "");
  LLVMValueRef v = gen_buf_load(g, &x, add(g, add(g, xrow, mul(g, safe, inner)), il.iv));
  gen_buf_store(g, &y, e, LLVMBuildSelect(g->b, ok, v, gen_const(g, dt, 0.0), ""));
  gen_loop_end(g, &il);
  gen_loop_end(g, &rl);
}

/* gather_grad: per iteration, a block of up to CHUNK columns i of one o:
 * its result lines zeroed (unless a gradient buffer), then dy added at the
 * indices, positions j in order. */
static void gen_gather_grad(Gen *g, const KpLoopPlan *p) {
  const IrOp *op = p->op;
  int64_t len = p->len, n = p->n, inner = p->inner, ch = inner < CHUNK ? inner : CHUNK;
  int64_t nch = ch ? (inner + ch - 1) / ch : 1;
  IrDType dt = op->result->type.dtype;
  GenBuf idx = gen_buf(g, op->args[0]), dy = gen_buf(g, op->args[1]), y = gen_buf_out(g, op->result);
  GenLoop it, jl, il;
  gen_loop_begin(g, &it, g->begin, g->end, "it");
  LLVMValueRef o = LLVMBuildUDiv(g->b, it.iv, gen_i64(g, nch), "");
  LLVMValueRef i0 = mul(g, LLVMBuildURem(g->b, it.iv, gen_i64(g, nch), ""), ch);
  LLVMValueRef left = LLVMBuildSub(g->b, gen_i64(g, inner), i0, "");
  LLVMValueRef cnt = LLVMBuildSelect(g->b, LLVMBuildICmp(g->b, LLVMIntSLT, left, gen_i64(g, ch), ""), left, gen_i64(g, ch), "");
  LLVMValueRef ybase = add(g, mul(g, o, len * inner), i0), ibase = add(g, mul(g, o, n * inner), i0);
  if (!y.grad) {
    gen_loop_begin(g, &jl, gen_i64(g, 0), gen_i64(g, len), "zt");
    gen_loop_begin(g, &il, gen_i64(g, 0), cnt, "zi");
    gen_buf_store(g, &y, add(g, add(g, ybase, mul(g, jl.iv, inner)), il.iv), gen_const(g, dt, 0.0));
    gen_loop_end(g, &il);
    gen_loop_end(g, &jl);
  }
  gen_loop_begin(g, &jl, gen_i64(g, 0), gen_i64(g, n), "j");
  gen_loop_begin(g, &il, gen_i64(g, 0), cnt, "i");
  LLVMValueRef e = add(g, add(g, ibase, mul(g, jl.iv, inner)), il.iv);
  LLVMValueRef t = LLVMBuildSExt(g->b, gen_buf_load(g, &idx, e), g->t_i64, "");
  LLVMBasicBlockRef body = LLVMAppendBasicBlockInContext(g->ctx, g->fn, "scatter");
  LLVMBasicBlockRef done = LLVMAppendBasicBlockInContext(g->ctx, g->fn, "");
  LLVMBuildCondBr(g->b, in_range(g, t, len), body, done);
  LLVMPositionBuilderAtEnd(g->b, body);
  LLVMValueRef yi = add(g, add(g, ybase, mul(g, t, inner)), il.iv);
  LLVMValueRef v = gen_buf_load(g, &dy, e);
  if (y.grad)
    gen_buf_store(g, &y, yi, v); /* accumulates */
  else
    gen_buf_store(g, &y, yi, gen_round(g, LLVMBuildFAdd(g->b, gen_buf_load(g, &y, yi), v, ""), dt));
  LLVMBuildBr(g->b, done);
  LLVMPositionBuilderAtEnd(g->b, done);
  gen_loop_end(g, &il);
  gen_loop_end(g, &jl);
  gen_loop_end(g, &it);
}

/* a comes before b in topk's order: larger, NaN largest of all, ties by the
 * lower index. */
static LLVMValueRef topk_before(Gen *g, LLVMValueRef a, LLVMValueRef ia, LLVMValueRef b, LLVMValueRef ib) {
  LLVMValueRef na = gen_isnan(g, a), nb = gen_isnan(g, b);
  LLVMValueRef gt = LLVMBuildOr(g->b, LLVMBuildAnd(g->b, na, LLVMBuildNot(g->b, nb, ""), ""),
                                LLVMBuildFCmp(g->b, LLVMRealOGT, a, b, ""), "");
  LLVMValueRef eq = LLVMBuildOr(g->b, LLVMBuildAnd(g->b, na, nb, ""), LLVMBuildFCmp(g->b, LLVMRealOEQ, a, b, ""), "");
  LLVMValueRef lower = LLVMBuildICmp(g->b, LLVMIntSLT, ia, ib, "");
  return LLVMBuildOr(g->b, gt, LLVMBuildAnd(g->b, eq, lower, ""), "");
}

/* topk: one line (o, i) of the axis per iteration; selection r is the
 * first element in topk's order after selection r - 1 (no scratch). */
static void gen_topk(Gen *g, const KpLoopPlan *p) {
  const IrOp *op = p->op;
  int64_t len = p->len, k = p->n, inner = p->inner;
  GenBuf x = gen_buf(g, op->args[0]), y = gen_buf_out(g, op->result);
  LLVMTypeRef t = gen_reg_type(g, op->args[0]->type.dtype);
  GenAcc pv = gen_acc(g, t), pi = gen_acc(g, g->t_i64), bv = gen_acc(g, t), bi = gen_acc(g, g->t_i64);
  GenLoop it, rl, tl;
  gen_loop_begin(g, &it, g->begin, g->end, "line");
  LLVMValueRef o = LLVMBuildUDiv(g->b, it.iv, gen_i64(g, inner), "");
  LLVMValueRef i = LLVMBuildURem(g->b, it.iv, gen_i64(g, inner), "");
  LLVMValueRef xbase = add(g, mul(g, o, len * inner), i), ybase = add(g, mul(g, o, k * inner), i);
  gen_acc_set(g, pv, LLVMConstReal(t, 0.0));
  gen_acc_set(g, pi, gen_i64(g, -1));
  gen_loop_begin(g, &rl, gen_i64(g, 0), gen_i64(g, k), "r");
  gen_acc_set(g, bv, LLVMConstReal(t, 0.0));
  gen_acc_set(g, bi, gen_i64(g, -1));
  gen_loop_begin(g, &tl, gen_i64(g, 0), gen_i64(g, len), "t");
  LLVMValueRef v = gen_buf_load(g, &x, add(g, xbase, mul(g, tl.iv, inner)));
  LLVMValueRef p0 = gen_acc_get(g, pi), b0 = gen_acc_get(g, bi);
  LLVMValueRef after = LLVMBuildOr(g->b, LLVMBuildICmp(g->b, LLVMIntSLT, p0, gen_i64(g, 0), ""),
                                   topk_before(g, gen_acc_get(g, pv), p0, v, tl.iv), "");
  LLVMValueRef better = LLVMBuildOr(g->b, LLVMBuildICmp(g->b, LLVMIntSLT, b0, gen_i64(g, 0), ""),
                                    topk_before(g, v, tl.iv, gen_acc_get(g, bv), b0), "");
  LLVMValueRef take = LLVMBuildAnd(g->b, after, better, "");
  gen_acc_set(g, bv, LLVMBuildSelect(g->b, take, v, gen_acc_get(g, bv), ""));
  gen_acc_set(g, bi, LLVMBuildSelect(g->b, take, tl.iv, b0, ""));
  gen_loop_end(g, &tl);
  gen_buf_store(g, &y, add(g, ybase, mul(g, rl.iv, inner)), LLVMBuildTrunc(g->b, gen_acc_get(g, bi), g->t_i32, ""));
  gen_acc_set(g, pv, gen_acc_get(g, bv));
  gen_acc_set(g, pi, gen_acc_get(g, bi));
  gen_loop_end(g, &rl);
  gen_loop_end(g, &it);
}

void gen_loop_kernel(Gen *g, const IrOp *op) {
  KpLoopPlan p;
  kp_loop_plan(op, &p);
  switch (p.kind) {
  case KP_LOOP_PERMUTE: gather_rows(g, op, p.st, 0); break;
  case KP_LOOP_TRANSPOSE: gen_transpose(g, &p); break;
  case KP_LOOP_SLICE: gather_rows(g, op, p.st, p.base); break;
  case KP_LOOP_UNSLICE: gen_unslice(g, &p); break;
  case KP_LOOP_CONCAT: gen_concat(g, &p); break;
  case KP_LOOP_REDUCE: gen_reduce(g, &p); break;
  case KP_LOOP_SOFTMAX: gen_softmax_axis(g, &p); break;
  case KP_LOOP_CE_TOTAL: gen_ce_total(g, &p); break;
  case KP_LOOP_MSE_TOTAL: gen_mse_total(g, &p); break;
  case KP_LOOP_EMBEDDING_GRAD: gen_embedding_grad(g, &p); break;
  case KP_LOOP_PATCHES: gen_patches(g, &p); break;
  case KP_LOOP_PATCHES_GRAD: gen_patches_grad(g, &p); break;
  case KP_LOOP_ARANGE: gen_arange(g, &p); break;
  case KP_LOOP_GATHER: gen_gather(g, &p); break;
  case KP_LOOP_GATHER_GRAD: gen_gather_grad(g, &p); break;
  case KP_LOOP_TOPK: gen_topk(g, &p); break;
  case KP_LOOP_NONE: gen_error(g, "kernel k%d: no loop-nest code for '%s'", g->group, ir_op_info[op->opcode].name); break;
  }
  LLVMBuildRetVoid(g->b);
}
