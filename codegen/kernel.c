/* kernel.c - what a fused kernel is: which ops the executor runs itself,
 * which ops fit a row kernel, and how the values of a row kernel lie over
 * its iteration space (docs/BACKEND.md).  `fuse` asks cg_row_layout
 * whether a set of ops can be one kernel; the code generators ask it how
 * to address every value.  No LLVM here: this file is always built.
 *
 * The layout is found by solving one small system: every value gets an
 * "end offset" eoff (0: its last axis is the space's last axis; 1: it
 * ends one axis earlier, a value per row), with one equation per operand
 * (an elementwise op's operands have its result's eoff; a reduction over
 * the last axis keepdim=false adds one; cross_entropy's target is one to
 * the left of its logits, ...).  Values whose last axis must be the row
 * (a reduced or normalised operand) are pinned to eoff 0.  The equations
 * are solved with a union-find that keeps each value's offset to its
 * root; a conflict means the ops do not share one iteration space. */
#include <string.h>

#include "codegen.h"

bool cg_op_group0(IrOpcode opc) {
  switch (opc) {
  case IR_OP_MATMUL:
  case IR_OP_RESHAPE:
  case IR_OP_CONST:
  case IR_OP_WINDOW_SUM:
  case IR_OP_LOSS:
  case IR_OP_GRAD:
  case IR_OP_ALL_REDUCE_START:
  case IR_OP_ALL_REDUCE_WAIT:
  case IR_OP_ALL_GATHER_START:
  case IR_OP_ALL_GATHER_WAIT:
  case IR_OP_REDUCE_SCATTER_START:
  case IR_OP_REDUCE_SCATTER_WAIT: return true;
  case IR_OP_NEG:
  case IR_OP_EXP:
  case IR_OP_LOG:
  case IR_OP_SQRT:
  case IR_OP_RSQRT:
  case IR_OP_TANH:
  case IR_OP_SIGMOID:
  case IR_OP_RELU:
  case IR_OP_GELU:
  case IR_OP_SILU:
  case IR_OP_ABS:
  case IR_OP_SIGN:
  case IR_OP_POW:
  case IR_OP_GELU_GRAD:
  case IR_OP_CAST:
  case IR_OP_DETACH:
  case IR_OP_ADD:
  case IR_OP_SUB:
  case IR_OP_MUL:
  case IR_OP_DIV:
  case IR_OP_MAXIMUM:
  case IR_OP_MINIMUM:
  case IR_OP_EQ:
  case IR_OP_NE:
  case IR_OP_LT:
  case IR_OP_LE:
  case IR_OP_GT:
  case IR_OP_GE:
  case IR_OP_SELECT:
  case IR_OP_SUM:
  case IR_OP_MEAN:
  case IR_OP_MAX:
  case IR_OP_LOGSUMEXP:
  case IR_OP_PERMUTE:
  case IR_OP_BROADCAST:
  case IR_OP_SLICE:
  case IR_OP_UNSLICE:
  case IR_OP_CONCAT:
  case IR_OP_SOFTMAX:
  case IR_OP_LOG_SOFTMAX:
  case IR_OP_LAYER_NORM:
  case IR_OP_RMS_NORM:
  case IR_OP_CAUSAL_MASK:
  case IR_OP_EMBEDDING:
  case IR_OP_EMBEDDING_GRAD:
  case IR_OP_CROSS_ENTROPY:
  case IR_OP_ONE_HOT:
  case IR_OP_MSE_LOSS:
  case IR_OP_GRAD_SEED:
  case IR_OP_LOSS_TERM: return false;
  }
  return false;
}

/* A reduction over exactly the last axis of an operand of rank >= 1. */
static bool reduces_last_axis(const IrOp *op) {
  int r = op->args[0]->type.shape.rank;
  if (r < 1) return false;
  const int64_t *axes;
  int n = ir_attr_get_ints(op, "axes", &axes);
  if (n == 0) return r == 1; /* every axis */
  if (n != 1) return false;
  int64_t a;
  return ir_norm_axis(axes[0], r, &a) && a == r - 1;
}

static bool reduction_none(const IrOp *op) { return strcmp(ir_attr_get_str(op, "reduction", "mean"), "none") == 0; }

bool cg_op_rowwise(const IrOp *op) {
  switch (op->opcode) {
  case IR_OP_NEG:
  case IR_OP_EXP:
  case IR_OP_LOG:
  case IR_OP_SQRT:
  case IR_OP_RSQRT:
  case IR_OP_TANH:
  case IR_OP_SIGMOID:
  case IR_OP_RELU:
  case IR_OP_GELU:
  case IR_OP_SILU:
  case IR_OP_ABS:
  case IR_OP_SIGN:
  case IR_OP_POW:
  case IR_OP_GELU_GRAD:
  case IR_OP_CAST:
  case IR_OP_DETACH:
  case IR_OP_ADD:
  case IR_OP_SUB:
  case IR_OP_MUL:
  case IR_OP_DIV:
  case IR_OP_MAXIMUM:
  case IR_OP_MINIMUM:
  case IR_OP_EQ:
  case IR_OP_NE:
  case IR_OP_LT:
  case IR_OP_LE:
  case IR_OP_GT:
  case IR_OP_GE:
  case IR_OP_SELECT:
  case IR_OP_BROADCAST:
  case IR_OP_LAYER_NORM:
  case IR_OP_RMS_NORM:
  case IR_OP_CAUSAL_MASK:
  case IR_OP_ONE_HOT:
  case IR_OP_EMBEDDING:
  case IR_OP_UNSLICE:
  case IR_OP_GRAD_SEED:
  case IR_OP_LOSS_TERM: return true;
  case IR_OP_SUM:
  case IR_OP_MEAN:
  case IR_OP_MAX:
  case IR_OP_LOGSUMEXP: return reduces_last_axis(op);
  case IR_OP_SOFTMAX:
  case IR_OP_LOG_SOFTMAX: {
    int r = op->args[0]->type.shape.rank;
    int64_t a;
    return r >= 1 && ir_norm_axis(ir_attr_get_int(op, "axis", -1), r, &a) && a == r - 1;
  }
  case IR_OP_CROSS_ENTROPY:
  case IR_OP_MSE_LOSS: return reduction_none(op);
  case IR_OP_PERMUTE:
  case IR_OP_SLICE:
  case IR_OP_CONCAT:
  case IR_OP_EMBEDDING_GRAD:
  case IR_OP_MATMUL:
  case IR_OP_RESHAPE:
  case IR_OP_CONST:
  case IR_OP_WINDOW_SUM:
  case IR_OP_LOSS:
  case IR_OP_GRAD:
  case IR_OP_ALL_REDUCE_START:
  case IR_OP_ALL_REDUCE_WAIT:
  case IR_OP_ALL_GATHER_START:
  case IR_OP_ALL_GATHER_WAIT:
  case IR_OP_REDUCE_SCATTER_START:
  case IR_OP_REDUCE_SCATTER_WAIT: return false;
  }
  return false;
}

/* ------------------------------------------------------------------ */
/* The equations                                                       */
/* ------------------------------------------------------------------ */

typedef struct Solver {
  CgRowLayout *l;
  int cap;
  int *parent, *off; /* off[i] = pot(i) - pot(parent[i]) */
  bool *pinned;
  Arena *a;
  bool conflict;
} Solver;

static int slot_index(Solver *s, IrValue *v) {
  CgRowLayout *l = s->l;
  for (int i = l->nslots - 1; i >= 0; i--)
    if (l->slots[i].v == v) return i;
  if (l->nslots == s->cap) {
    int cap = s->cap ? s->cap * 2 : 32;
    CgSlot *slots = ARENA_ARRAY(s->a, CgSlot, cap);
    int *parent = ARENA_ARRAY(s->a, int, cap), *off = ARENA_ARRAY(s->a, int, cap);
    bool *pinned = ARENA_ARRAY(s->a, bool, cap);
    if (l->nslots) {
      memcpy(slots, l->slots, sizeof(CgSlot) * (size_t)l->nslots);
      memcpy(parent, s->parent, sizeof(int) * (size_t)l->nslots);
      memcpy(off, s->off, sizeof(int) * (size_t)l->nslots);
      memcpy(pinned, s->pinned, sizeof(bool) * (size_t)l->nslots);
    }
    l->slots = slots, s->parent = parent, s->off = off, s->pinned = pinned, s->cap = cap;
  }
  int i = l->nslots++;
  memset(&l->slots[i], 0, sizeof l->slots[i]);
  l->slots[i].v = v;
  s->parent[i] = i;
  s->off[i] = 0;
  s->pinned[i] = false;
  return i;
}

/* Root of i; *pot = pot(i) - pot(root). */
static int find(Solver *s, int i, int *pot) {
  int p = 0;
  while (s->parent[i] != i) {
    p += s->off[i];
    i = s->parent[i];
  }
  *pot = p;
  return i;
}

/* pot(a) - pot(b) = d */
static void relate(Solver *s, IrValue *va, IrValue *vb, int d) {
  int a = slot_index(s, va), b = slot_index(s, vb);
  s->l->slots[a].mapped = s->l->slots[b].mapped = true;
  int pa, pb;
  int ra = find(s, a, &pa), rb = find(s, b, &pb);
  if (ra == rb) {
    if (pa - pb != d) s->conflict = true;
    return;
  }
  s->parent[ra] = rb;
  s->off[ra] = d + pb - pa;
}

static void pin(Solver *s, IrValue *v) {
  int i = slot_index(s, v);
  s->l->slots[i].mapped = true;
  s->pinned[i] = true;
}

static void same(Solver *s, IrValue *a, IrValue *b) { relate(s, a, b, 0); }

static bool fail(char *why, size_t n, const char *fmt, ...) GRADC_PRINTF(3, 4);
static bool fail(char *why, size_t n, const char *fmt, ...) {
  if (why && n) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, n, fmt, ap);
    va_end(ap);
  }
  return false;
}

static int64_t last_dim(const IrValue *v) { return v->type.shape.rank ? v->type.shape.dim[v->type.shape.rank - 1] : 1; }

/* The space axis of value axis i (rank k, end offset e) in a space of rank n. */
static int space_axis(int n, int e, int k, int i) { return n - 1 - e - (k - 1 - i); }

bool cg_row_layout(IrOp *const *ops, int n, CgUsedOutside used_outside, void *ctx, Arena *a, CgRowLayout *out,
                   char *why, size_t whylen) {
  memset(out, 0, sizeof *out);
  Solver s = {out, 0, NULL, NULL, NULL, a, false};
  for (int k = 0; k < n; k++) {
    IrOp *op = ops[k];
    if (!op->result || !cg_op_rowwise(op))
      return fail(why, whylen, "'%s' does not fit a row kernel", ir_op_info[op->opcode].name);
    IrValue *y = op->result;
    /* Operands first, so slots come in order of first appearance. */
    for (int i = 0; i < op->nargs; i++) slot_index(&s, op->args[i]);
    int yi = slot_index(&s, y);
    if (out->slots[yi].defined) return fail(why, whylen, "a value is defined twice");
    out->slots[yi].defined = true;
    out->slots[yi].mapped = true;
    IrValue **x = op->args;
    switch (op->opcode) {
    case IR_OP_SUM:
    case IR_OP_MEAN:
    case IR_OP_MAX:
    case IR_OP_LOGSUMEXP:
      pin(&s, x[0]);
      relate(&s, y, x[0], ir_attr_get_int(op, "keepdim", 0) ? 0 : 1);
      break;
    case IR_OP_SOFTMAX:
    case IR_OP_LOG_SOFTMAX:
    case IR_OP_CAUSAL_MASK:
      pin(&s, x[0]);
      same(&s, y, x[0]);
      break;
    case IR_OP_LAYER_NORM:
    case IR_OP_RMS_NORM:
      pin(&s, x[0]);
      for (int i = 0; i < op->nargs; i++) same(&s, x[i], y);
      break;
    case IR_OP_CROSS_ENTROPY:
      pin(&s, x[0]);
      relate(&s, x[1], x[0], 1);
      relate(&s, y, x[0], 1);
      break;
    case IR_OP_ONE_HOT:
      pin(&s, y);
      relate(&s, x[0], y, 1);
      break;
    case IR_OP_EMBEDDING:
      pin(&s, y);
      relate(&s, x[0], y, 1);
      break; /* the table (x[1]) is gathered by index, not laid over the space */
    case IR_OP_UNSLICE:
      pin(&s, y);
      break; /* the operand is gathered where the slice puts it */
    case IR_OP_NEG:
    case IR_OP_EXP:
    case IR_OP_LOG:
    case IR_OP_SQRT:
    case IR_OP_RSQRT:
    case IR_OP_TANH:
    case IR_OP_SIGMOID:
    case IR_OP_RELU:
    case IR_OP_GELU:
    case IR_OP_SILU:
    case IR_OP_ABS:
    case IR_OP_SIGN:
    case IR_OP_POW:
    case IR_OP_GELU_GRAD:
    case IR_OP_CAST:
    case IR_OP_DETACH:
    case IR_OP_ADD:
    case IR_OP_SUB:
    case IR_OP_MUL:
    case IR_OP_DIV:
    case IR_OP_MAXIMUM:
    case IR_OP_MINIMUM:
    case IR_OP_EQ:
    case IR_OP_NE:
    case IR_OP_LT:
    case IR_OP_LE:
    case IR_OP_GT:
    case IR_OP_GE:
    case IR_OP_SELECT:
    case IR_OP_BROADCAST:
    case IR_OP_MSE_LOSS:
    case IR_OP_GRAD_SEED:
    case IR_OP_LOSS_TERM:
      for (int i = 0; i < op->nargs; i++) same(&s, x[i], y);
      break;
    case IR_OP_CONST:
    case IR_OP_RESHAPE:
    case IR_OP_PERMUTE:
    case IR_OP_SLICE:
    case IR_OP_CONCAT:
    case IR_OP_MATMUL:
    case IR_OP_EMBEDDING_GRAD:
    case IR_OP_WINDOW_SUM:
    case IR_OP_ALL_REDUCE_START:
    case IR_OP_ALL_REDUCE_WAIT:
    case IR_OP_ALL_GATHER_START:
    case IR_OP_ALL_GATHER_WAIT:
    case IR_OP_REDUCE_SCATTER_START:
    case IR_OP_REDUCE_SCATTER_WAIT:
    case IR_OP_LOSS:
    case IR_OP_GRAD: return fail(why, whylen, "'%s' does not fit a row kernel", ir_op_info[op->opcode].name);
    }
    if (s.conflict) return fail(why, whylen, "'%s' would need two row layouts for one value", ir_op_info[op->opcode].name);
  }
  /* Every value defined in the kernel must be a slot result of an op before its uses. */
  for (int k = 0; k < n; k++) {
    IrOpcode opc = ops[k]->opcode;
    if (opc != IR_OP_EMBEDDING && opc != IR_OP_UNSLICE) continue;
    CgSlot *t = cg_row_slot(out, ops[k]->args[opc == IR_OP_EMBEDDING ? 1 : 0]);
    if (t->defined) return fail(why, whylen, "a gathered operand computed in the kernel");
  }

  /* Anchor each class: at its pinned values, else at its smallest offset. */
  int ns = out->nslots;
  int *anchor = ARENA_ARRAY(a, int, ns);
  bool *has = ARENA_ARRAY(a, bool, ns);
  bool *haspin = ARENA_ARRAY(a, bool, ns);
  for (int i = 0; i < ns; i++) {
    if (!out->slots[i].mapped) continue;
    int p, r = find(&s, i, &p);
    if (s.pinned[i]) {
      if (haspin[r] && anchor[r] != -p) return fail(why, whylen, "two values must both end at the row axis");
      haspin[r] = true;
      anchor[r] = -p;
    }
  }
  for (int i = 0; i < ns; i++) {
    if (!out->slots[i].mapped) continue;
    int p, r = find(&s, i, &p);
    if (haspin[r]) continue;
    if (!has[r] || -p > anchor[r]) anchor[r] = -p;
    has[r] = true;
  }
  int rank = 0;
  for (int i = 0; i < ns; i++) {
    CgSlot *sl = &out->slots[i];
    if (!sl->mapped) continue;
    int p, r = find(&s, i, &p);
    sl->eoff = p + anchor[r];
    if (sl->eoff < 0 || sl->eoff > 1) return fail(why, whylen, "a value reduced twice over the row");
    int k = sl->v->type.shape.rank + sl->eoff;
    if (k > IR_MAX_RANK) return fail(why, whylen, "too many axes");
    if (k > rank) rank = k;
  }

  /* The space: the broadcast of every mapped value. */
  IrShape sp;
  memset(&sp, 0, sizeof sp);
  sp.rank = rank;
  for (int d = 0; d < rank; d++) sp.dim[d] = 1;
  for (int i = 0; i < ns; i++) {
    CgSlot *sl = &out->slots[i];
    if (!sl->mapped) continue;
    const IrShape *vs = &sl->v->type.shape;
    for (int d = 0; d < vs->rank; d++) {
      int ax = space_axis(rank, sl->eoff, vs->rank, d);
      if (ax < 0) return fail(why, whylen, "a value does not fit the rows");
      if (vs->dim[d] == 1) continue;
      if (sp.dim[ax] == 1)
        sp.dim[ax] = vs->dim[d];
      else if (sp.dim[ax] != vs->dim[d])
        return fail(why, whylen, "sizes %lld and %lld meet on one axis", (long long)sp.dim[ax], (long long)vs->dim[d]);
    }
  }
  out->space = sp;
  out->cols = rank ? sp.dim[rank - 1] : 1;
  out->rows = 1;
  for (int d = 0; d + 1 < rank; d++) out->rows *= sp.dim[d];

  /* Ops that need their operand's last axis to be the whole row. */
  for (int k = 0; k < n; k++) {
    IrOp *op = ops[k];
    IrValue *row = NULL;
    IrOpcode opc = op->opcode;
    if (opc == IR_OP_SUM || opc == IR_OP_MEAN || opc == IR_OP_MAX || opc == IR_OP_LOGSUMEXP ||
        opc == IR_OP_SOFTMAX || opc == IR_OP_LOG_SOFTMAX || opc == IR_OP_LAYER_NORM || opc == IR_OP_RMS_NORM ||
        opc == IR_OP_CROSS_ENTROPY)
      row = op->args[0];
    else if (opc == IR_OP_ONE_HOT || opc == IR_OP_EMBEDDING)
      row = op->result;
    else if (opc == IR_OP_UNSLICE) {
      if (!ir_shape_eq(&op->result->type.shape, &sp)) return fail(why, whylen, "unslice must cover the rows");
    } else if (opc == IR_OP_CAUSAL_MASK) {
      const IrShape *ys = &op->result->type.shape;
      if (ys->rank < 2 || rank < 2 || ys->dim[ys->rank - 1] != sp.dim[rank - 1] ||
          ys->dim[ys->rank - 2] != sp.dim[rank - 2])
        return fail(why, whylen, "causal_mask must cover the last two axes");
    }
    if (row && (row->type.shape.rank < 1 || last_dim(row) != out->cols))
      return fail(why, whylen, "'%s' needs the whole row", ir_op_info[op->opcode].name);
  }

  /* Outputs: written exactly once, so never broadcast over a row axis. */
  for (int i = 0; i < ns; i++) {
    CgSlot *sl = &out->slots[i];
    sl->varies = sl->mapped && sl->eoff == 0 && sl->v->type.shape.rank > 0 && last_dim(sl->v) == out->cols &&
                 out->cols > 1;
    if (!sl->defined || !used_outside(sl->v, ctx)) continue;
    sl->output = true;
    const IrShape *vs = &sl->v->type.shape;
    bool covered[IR_MAX_RANK] = {false};
    for (int d = 0; d < vs->rank; d++) {
      int ax = space_axis(rank, sl->eoff, vs->rank, d);
      if (vs->dim[d] == sp.dim[ax]) covered[ax] = true;
    }
    for (int d = 0; d + 1 < rank; d++)
      if (sp.dim[d] > 1 && !covered[d]) return fail(why, whylen, "an output would be written by several rows");
  }
  return true;
}

CgSlot *cg_row_slot(const CgRowLayout *l, const IrValue *v) {
  for (int i = 0; i < l->nslots; i++)
    if (l->slots[i].v == v) return &l->slots[i];
  return NULL;
}

void cg_slot_strides(const CgRowLayout *l, const CgSlot *s, int64_t *stride) {
  int n = l->space.rank;
  for (int d = 0; d < n; d++) stride[d] = 0;
  const IrShape *vs = &s->v->type.shape;
  int64_t m = 1;
  for (int d = vs->rank - 1; d >= 0; d--) {
    int ax = space_axis(n, s->eoff, vs->rank, d);
    if (ax >= 0 && vs->dim[d] != 1) stride[ax] = m;
    m *= vs->dim[d];
  }
}

/* ------------------------------------------------------------------ */
/* Slices that are one contiguous range                                */
/* ------------------------------------------------------------------ */

/* Python's slice.indices for one axis: normalises *start, returns the count. */
static int64_t slice_axis(int64_t dim, int64_t *start, int64_t stop, int64_t step) {
  int64_t s = *start;
  if (step > 0) {
    if (s < 0) s += dim;
    if (s < 0) s = 0;
    if (s > dim) s = dim;
    if (stop < 0) stop += dim;
    if (stop < 0) stop = 0;
    if (stop > dim) stop = dim;
    *start = s;
    return stop > s ? (stop - s + step - 1) / step : 0;
  }
  if (s < 0) s += dim;
  if (s < -1) s = -1;
  if (s > dim - 1) s = dim - 1;
  if (stop < 0) stop += dim;
  if (stop < -1) stop = -1;
  if (stop > dim - 1) stop = dim - 1;
  *start = s;
  return s > stop ? (s - stop - step - 1) / (-step) : 0;
}

void cg_slice_ranges(const IrOp *op, const IrShape *full, int64_t *start, int64_t *step) {
  const int64_t *starts, *stops, *steps;
  int ns = ir_attr_get_ints(op, "starts", &starts);
  int ne = ir_attr_get_ints(op, "stops", &stops);
  int np = ir_attr_get_ints(op, "steps", &steps);
  for (int k = 0; k < full->rank; k++) {
    start[k] = k < ns ? starts[k] : 0;
    int64_t stop = k < ne ? stops[k] : full->dim[k];
    step[k] = k < np && steps[k] != 0 ? steps[k] : 1;
    slice_axis(full->dim[k], &start[k], stop, step[k]);
  }
}

bool cg_slice_contiguous(const IrOp *op, int64_t *first) {
  if (op->opcode != IR_OP_SLICE && op->opcode != IR_OP_UNSLICE) return false;
  bool un = op->opcode == IR_OP_UNSLICE;
  const IrShape *full = un ? &op->result->type.shape : &op->args[0]->type.shape;
  const IrShape *part = un ? &op->args[0]->type.shape : &op->result->type.shape;
  if (part->rank != full->rank || ir_numel(part) == 0) return false;
  int64_t start[IR_MAX_RANK], step[IR_MAX_RANK];
  cg_slice_ranges(op, full, start, step);
  /* Axes of extent 1, then one axis with a unit step, then whole axes. */
  int k = 0;
  while (k < part->rank && part->dim[k] == 1) k++;
  if (k < part->rank && part->dim[k] > 1 && step[k] != 1) return false;
  for (int a = k + 1; a < part->rank; a++)
    if (part->dim[a] != full->dim[a] || step[a] != 1) return false;
  int64_t off = 0, stride = 1;
  for (int a = full->rank - 1; a >= 0; a--) {
    off += start[a] * stride;
    stride *= full->dim[a];
  }
  *first = off;
  return true;
}
