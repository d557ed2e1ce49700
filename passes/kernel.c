/* kernel.c - what a fused kernel is: which ops the executor runs itself,
 * which ops fit a row kernel, and how the values of a row kernel lie over
 * its iteration space (docs/BACKEND.md).  `fuse` asks kp_row_layout
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
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernel.h"

/* The kernel model's op table: what a kernel does with each op that is not
 * POINT (elementwise in a row kernel: KP_ROW_EW) nor EXEC (run by the
 * executor, never in a kernel), ops.def's flags for those two:
 *   row   what it does in a row kernel (KP_ROW_NONE: it fits none)
 *   loop  the loop nest it needs as a kernel of its own (KP_LOOP_NONE: none) */
static const struct {
  KpRowKind row;
  KpLoopKind loop;
} op_table[IR_OP_COUNT] = {
  [IR_OP_SUM]                  = {KP_ROW_RED,     KP_LOOP_REDUCE},
  [IR_OP_MEAN]                 = {KP_ROW_RED,     KP_LOOP_REDUCE},
  [IR_OP_MAX]                  = {KP_ROW_RED,     KP_LOOP_REDUCE},
  [IR_OP_LOGSUMEXP]            = {KP_ROW_LSE,     KP_LOOP_REDUCE},
  [IR_OP_PERMUTE]              = {KP_ROW_NONE,    KP_LOOP_PERMUTE},
  [IR_OP_SLICE]                = {KP_ROW_NONE,    KP_LOOP_SLICE},
  [IR_OP_UNSLICE]              = {KP_ROW_UNSLICE, KP_LOOP_UNSLICE},
  [IR_OP_CONCAT]               = {KP_ROW_NONE,    KP_LOOP_CONCAT},
  [IR_OP_SOFTMAX]              = {KP_ROW_SOFTMAX, KP_LOOP_SOFTMAX},
  [IR_OP_LOG_SOFTMAX]          = {KP_ROW_SOFTMAX, KP_LOOP_SOFTMAX},
  [IR_OP_LAYER_NORM]           = {KP_ROW_LN,      KP_LOOP_NONE},
  [IR_OP_RMS_NORM]             = {KP_ROW_RMS,     KP_LOOP_NONE},
  [IR_OP_CAUSAL_MASK]          = {KP_ROW_CMASK,   KP_LOOP_NONE},
  [IR_OP_EMBEDDING]            = {KP_ROW_EMB,     KP_LOOP_NONE},
  [IR_OP_EMBEDDING_GRAD]       = {KP_ROW_NONE,    KP_LOOP_EMBEDDING_GRAD},
  [IR_OP_CROSS_ENTROPY]        = {KP_ROW_CE,      KP_LOOP_CE_TOTAL},
  [IR_OP_ONE_HOT]              = {KP_ROW_ONEHOT,  KP_LOOP_NONE},
  [IR_OP_MSE_LOSS]             = {KP_ROW_EW,      KP_LOOP_MSE_TOTAL},
  /* convolution and pooling */
  [IR_OP_PATCHES]              = {KP_ROW_NONE,    KP_LOOP_PATCHES},
  [IR_OP_PATCHES_GRAD]         = {KP_ROW_NONE,    KP_LOOP_PATCHES_GRAD},
  /* language v2 constructors and selection */
  [IR_OP_ARANGE]               = {KP_ROW_NONE,    KP_LOOP_ARANGE},
  [IR_OP_GATHER]               = {KP_ROW_NONE,    KP_LOOP_GATHER},
  [IR_OP_GATHER_GRAD]          = {KP_ROW_NONE,    KP_LOOP_GATHER_GRAD},
  [IR_OP_TOPK]                 = {KP_ROW_NONE,    KP_LOOP_TOPK},
  /* Randomness */
  [IR_OP_RANDOM]               = {KP_ROW_RAND,    KP_LOOP_NONE},
};
/* A new op in ir/ops.def that is neither POINT nor EXEC needs its row here. */
_Static_assert(IR_OP_COUNT == 85, "kernel.c's op table knows every op");

bool kp_op_group0(IrOpcode opc) { return ir_op_is(opc, IR_OPF_EXEC); }
KpRowKind kp_row_kind(IrOpcode opc) { return ir_op_is(opc, IR_OPF_POINT) ? KP_ROW_EW : op_table[opc].row; }
KpLoopKind kp_loop_kind(IrOpcode opc) { return op_table[opc].loop; }

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

bool kp_colsum_operand(const IrType *t) {
  int r = t->shape.rank;
  if (r < 3 || (t->dtype != IR_DT_F32 && t->dtype != IR_DT_F64) || t->shape.dim[r - 2] < 2) return false;
  int64_t groups = 1;
  for (int k = 0; k < r - 2; k++) groups *= t->shape.dim[k];
  return groups >= KP_COLSUM_MIN_GROUPS;
}

bool kp_op_colsum(const IrOp *op) {
  if (op->opcode != IR_OP_SUM || !ir_attr_get_int(op, "keepdim", 0) || !kp_colsum_operand(&op->args[0]->type))
    return false;
  const IrType *t = &op->args[0]->type;
  const int64_t *axes;
  int64_t a;
  return ir_attr_get_ints(op, "axes", &axes) == 1 && ir_norm_axis(axes[0], t->shape.rank, &a) && a == t->shape.rank - 2;
}

KpRowKind kp_op_row_kind(const IrOp *op) { return kp_op_colsum(op) ? KP_ROW_COLSUM : kp_row_kind(op->opcode); }

bool kp_op_row_alone(const IrOp *op) { return kp_op_rowwise(op) && !kp_op_colsum(op); }

bool kp_op_rowwise(const IrOp *op) {
  switch (kp_op_row_kind(op)) {
  case KP_ROW_EW: return op->opcode != IR_OP_MSE_LOSS || reduction_none(op);
  case KP_ROW_LN:
  case KP_ROW_RMS:
  case KP_ROW_CMASK:
  case KP_ROW_ONEHOT:
  case KP_ROW_EMB:
  case KP_ROW_UNSLICE:
  case KP_ROW_RAND:
  case KP_ROW_COLSUM: return true;
  case KP_ROW_RED:
  case KP_ROW_LSE: return reduces_last_axis(op);
  case KP_ROW_SOFTMAX: {
    int r = op->args[0]->type.shape.rank;
    int64_t a;
    return r >= 1 && ir_norm_axis(ir_attr_get_int(op, "axis", -1), r, &a) && a == r - 1;
  }
  case KP_ROW_CE: return reduction_none(op);
  case KP_ROW_NONE: return false;
  }
  return false;
}

/* ------------------------------------------------------------------ */
/* The equations                                                       */
/* ------------------------------------------------------------------ */

typedef struct Solver {
  KpRowLayout *l;
  int cap;
  int *parent, *off; /* off[i] = pot(i) - pot(parent[i]) */
  bool *pinned;
  Arena *a;
  bool conflict;
} Solver;

static int slot_index(Solver *s, IrValue *v) {
  KpRowLayout *l = s->l;
  for (int i = l->nslots - 1; i >= 0; i--)
    if (l->slots[i].v == v) return i;
  if (l->nslots == s->cap) {
    int cap = s->cap ? s->cap * 2 : 32;
    KpSlot *slots = ARENA_ARRAY(s->a, KpSlot, cap);
    int *parent = ARENA_ARRAY(s->a, int, cap), *off = ARENA_ARRAY(s->a, int, cap);
    bool *pinned = ARENA_ARRAY(s->a, bool, cap);
    if (l->nslots) {
      memcpy(slots, l->slots, sizeof(KpSlot) * (size_t)l->nslots);
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

static int64_t last_dim(const IrValue *v) { return v->type.shape.rank ? v->type.shape.dim[v->type.shape.rank - 1] : 1; }

/* The space axis of value axis i (rank k, end offset e) in a space of rank n. */
static int space_axis(int n, int e, int k, int i) { return n - 1 - e - (k - 1 - i); }

/* The equations of op: how its values lie relative to each other. */
static void relate_op(Solver *s, IrOp *op) {
  IrValue *y = op->result, **x = op->args;
  switch (kp_op_row_kind(op)) {
  case KP_ROW_RED:
  case KP_ROW_LSE:
    pin(s, x[0]);
    relate(s, y, x[0], ir_attr_get_int(op, "keepdim", 0) ? 0 : 1);
    break;
  case KP_ROW_COLSUM: /* the result broadcasts over the summed axis */
    pin(s, x[0]);
    same(s, y, x[0]);
    break;
  case KP_ROW_SOFTMAX:
  case KP_ROW_CMASK:
    pin(s, x[0]);
    same(s, y, x[0]);
    break;
  case KP_ROW_LN:
  case KP_ROW_RMS:
    pin(s, x[0]);
    for (int i = 0; i < op->nargs; i++) same(s, x[i], y);
    break;
  case KP_ROW_CE:
    pin(s, x[0]);
    relate(s, x[1], x[0], 1);
    relate(s, y, x[0], 1);
    break;
  case KP_ROW_ONEHOT:
  case KP_ROW_EMB: /* an embedding's table (x[1]) is gathered by index, not laid over the space */
    pin(s, y);
    relate(s, x[0], y, 1);
    break;
  case KP_ROW_UNSLICE: pin(s, y); break; /* the operand is gathered where the slice puts it */
  case KP_ROW_RAND: same(s, y, y); break;  /* the rng.state operand is read by index */
  case KP_ROW_EW:
    for (int i = 0; i < op->nargs; i++) same(s, x[i], y);
    break;
  case KP_ROW_NONE: break; /* refused by kp_op_rowwise */
  }
}

/* Each value's end offset: every class of related values anchored at its
 * pinned values, else at its smallest offset.  *rank gets the space's. */
static bool anchor(Solver *s, int *rank, char *why, size_t whylen) {
  KpRowLayout *out = s->l;
  int ns = out->nslots;
  int *anchor = ARENA_ARRAY(s->a, int, ns);
  bool *has = ARENA_ARRAY(s->a, bool, ns);
  bool *haspin = ARENA_ARRAY(s->a, bool, ns);
  for (int i = 0; i < ns; i++) {
    if (!out->slots[i].mapped) continue;
    int p, r = find(s, i, &p);
    if (s->pinned[i]) {
      if (haspin[r] && anchor[r] != -p) return errf(why, whylen, "two values must both end at the row axis");
      haspin[r] = true;
      anchor[r] = -p;
    }
  }
  for (int i = 0; i < ns; i++) {
    if (!out->slots[i].mapped) continue;
    int p, r = find(s, i, &p);
    if (haspin[r]) continue;
    if (!has[r] || -p > anchor[r]) anchor[r] = -p;
    has[r] = true;
  }
  *rank = 0;
  for (int i = 0; i < ns; i++) {
    KpSlot *sl = &out->slots[i];
    if (!sl->mapped) continue;
    int p, r = find(s, i, &p);
    sl->eoff = p + anchor[r];
    if (sl->eoff < 0 || sl->eoff > 1) return errf(why, whylen, "a value reduced twice over the row");
    int k = sl->v->type.shape.rank + sl->eoff;
    if (k > IR_MAX_RANK) return errf(why, whylen, "too many axes");
    if (k > *rank) *rank = k;
  }
  return true;
}

/* The space: the broadcast of every mapped value. */
static bool find_space(KpRowLayout *out, int rank, char *why, size_t whylen) {
  IrShape sp;
  memset(&sp, 0, sizeof sp);
  sp.rank = rank;
  for (int d = 0; d < rank; d++) sp.dim[d] = 1;
  for (int i = 0; i < out->nslots; i++) {
    KpSlot *sl = &out->slots[i];
    if (!sl->mapped) continue;
    const IrShape *vs = &sl->v->type.shape;
    for (int d = 0; d < vs->rank; d++) {
      int ax = space_axis(rank, sl->eoff, vs->rank, d);
      if (ax < 0) return errf(why, whylen, "a value does not fit the rows");
      if (vs->dim[d] == 1) continue;
      if (sp.dim[ax] == 1)
        sp.dim[ax] = vs->dim[d];
      else if (sp.dim[ax] != vs->dim[d])
        return errf(why, whylen, "sizes %lld and %lld meet on one axis", (long long)sp.dim[ax], (long long)vs->dim[d]);
    }
  }
  out->space = sp;
  out->cols = rank ? sp.dim[rank - 1] : 1;
  out->rows = 1;
  for (int d = 0; d + 1 < rank; d++) out->rows *= sp.dim[d];
  return true;
}

/* Ops that need their operand's (or result's) last axis to be the whole
 * row, or their result to cover the space. */
static bool check_rows(IrOp *const *ops, int n, const KpRowLayout *out, char *why, size_t whylen) {
  const IrShape *sp = &out->space;
  int rank = sp->rank;
  for (int k = 0; k < n; k++) {
    IrOp *op = ops[k];
    IrValue *row = NULL;
    switch (kp_op_row_kind(op)) {
    case KP_ROW_COLSUM:
      if (!ir_shape_eq(&op->args[0]->type.shape, sp)) return errf(why, whylen, "a column sum's operand must cover the rows");
      break;
    case KP_ROW_RED:
    case KP_ROW_LSE:
    case KP_ROW_SOFTMAX:
    case KP_ROW_LN:
    case KP_ROW_RMS:
    case KP_ROW_CE: row = op->args[0]; break;
    case KP_ROW_ONEHOT:
    case KP_ROW_EMB: row = op->result; break;
    case KP_ROW_UNSLICE:
      if (!ir_shape_eq(&op->result->type.shape, sp)) return errf(why, whylen, "unslice must cover the rows");
      break;
    case KP_ROW_CMASK: {
      const IrShape *ys = &op->result->type.shape;
      if (ys->rank < 2 || rank < 2 || ys->dim[ys->rank - 1] != sp->dim[rank - 1] ||
          ys->dim[ys->rank - 2] != sp->dim[rank - 2])
        return errf(why, whylen, "causal_mask must cover the last two axes");
      break;
    }
    case KP_ROW_EW:
    case KP_ROW_RAND:
    case KP_ROW_NONE: break;
    }
    if (row && (row->type.shape.rank < 1 || last_dim(row) != out->cols))
      return errf(why, whylen, "'%s' needs the whole row", ir_op_info[op->opcode].name);
  }
  return true;
}

/* Which values vary along the row, which are outputs; an output is written
 * exactly once, so never broadcast over a row axis. */
static bool mark_outputs(KpRowLayout *out, KpUsedOutside used_outside, void *ctx, char *why, size_t whylen) {
  const IrShape *sp = &out->space;
  int rank = sp->rank;
  for (int i = 0; i < out->nslots; i++) {
    KpSlot *sl = &out->slots[i];
    sl->varies = sl->mapped && sl->eoff == 0 && sl->v->type.shape.rank > 0 && last_dim(sl->v) == out->cols &&
                 out->cols > 1;
    if (!sl->defined || !used_outside(sl->v, ctx)) continue;
    sl->output = true;
    const IrShape *vs = &sl->v->type.shape;
    bool covered[IR_MAX_RANK] = {false};
    for (int d = 0; d < vs->rank; d++) {
      int ax = space_axis(rank, sl->eoff, vs->rank, d);
      if (vs->dim[d] == sp->dim[ax]) covered[ax] = true;
    }
    if (sl->colsum) covered[rank - 2] = true; /* written once per group of rows */
    for (int d = 0; d + 1 < rank; d++)
      if (sp->dim[d] > 1 && !covered[d]) return errf(why, whylen, "an output would be written by several rows");
  }
  return true;
}

bool kp_row_layout(IrOp *const *ops, int n, KpUsedOutside used_outside, void *ctx, Arena *a, KpRowLayout *out,
                   char *why, size_t whylen) {
  memset(out, 0, sizeof *out);
  Solver s = {out, 0, NULL, NULL, NULL, a, false};
  for (int k = 0; k < n; k++) {
    IrOp *op = ops[k];
    if (!op->result || !kp_op_rowwise(op))
      return errf(why, whylen, "'%s' does not fit a row kernel", ir_op_info[op->opcode].name);
    /* Operands first, so slots come in order of first appearance. */
    for (int i = 0; i < op->nargs; i++) slot_index(&s, op->args[i]);
    int yi = slot_index(&s, op->result);
    if (out->slots[yi].defined) return errf(why, whylen, "a value is defined twice");
    out->slots[yi].defined = true;
    out->slots[yi].mapped = true;
    out->slots[yi].colsum = kp_op_colsum(op);
    for (int i = 0; i < op->nargs; i++)
      if (kp_row_slot(out, op->args[i])->colsum) return errf(why, whylen, "a column sum is read in its kernel");
    relate_op(&s, op);
    if (s.conflict) return errf(why, whylen, "'%s' would need two row layouts for one value", ir_op_info[op->opcode].name);
  }
  /* Every value defined in the kernel must be a slot result of an op before its uses. */
  for (int k = 0; k < n; k++) {
    IrOpcode opc = ops[k]->opcode;
    if (opc != IR_OP_EMBEDDING && opc != IR_OP_UNSLICE) continue;
    KpSlot *t = kp_row_slot(out, ops[k]->args[opc == IR_OP_EMBEDDING ? 1 : 0]);
    if (t->defined) return errf(why, whylen, "a gathered operand computed in the kernel");
  }
  int rank = 0;
  if (!anchor(&s, &rank, why, whylen) || !find_space(out, rank, why, whylen) || !check_rows(ops, n, out, why, whylen) ||
      !mark_outputs(out, used_outside, ctx, why, whylen))
    return false;
  out->group = 1;
  for (int i = 0; i < out->nslots; i++)
    if (out->slots[i].colsum) out->group = out->space.dim[rank - 2];
  return true;
}

/* ------------------------------------------------------------------ */
/* The kernels of a function                                           */
/* ------------------------------------------------------------------ */

static bool used_by(const IrValue *v, void *ctx) {
  const bool *out = ctx;
  return out[v->id];
}

/* k<group>_ and up to three distinct op names, as a C symbol. */
static const char *kernel_name(Arena *a, int group, IrOp **ops, int n) {
  char buf[128];
  int len = snprintf(buf, sizeof buf, "k%d", group);
  const char *seen[3];
  int ns = 0;
  for (int i = 0; i < n && ns < 3; i++) {
    const char *nm = ir_op_info[ops[i]->opcode].name;
    bool dup = false;
    for (int k = 0; k < ns; k++) dup |= strcmp(seen[k], nm) == 0;
    if (dup) continue;
    seen[ns++] = nm;
    if (len < (int)sizeof buf - 1) buf[len++] = '_';
    for (const char *p = nm; *p && len < (int)sizeof buf - 1; p++) buf[len++] = *p == '.' ? '_' : *p;
    buf[len] = 0;
  }
  return arena_strdup(a, buf);
}

bool kp_kernels_find(const IrFunc *f, Arena *a, KpKernels *out, char *err, size_t errlen) {
  memset(out, 0, sizeof *out);
  out->used_outside = ARENA_ARRAY(a, bool, f->nvalues > 0 ? f->nvalues : 1);
  int cap = 0;
  for (int i = 0; i < f->nops; i++) {
    const IrOp *op = f->ops[i];
    if (op->group > out->maxgroup) out->maxgroup = op->group;
    if (op->group > 0 && (i == 0 || f->ops[i - 1]->group != op->group)) cap++;
    for (int j = 0; j < op->nargs; j++) {
      const IrValue *v = op->args[j];
      if (v->def && v->def->group > 0 && v->def->group != op->group) out->used_outside[v->id] = true;
    }
  }
  out->k = ARENA_ARRAY(a, KpKernel, cap > 0 ? cap : 1);
  int *seen = ARENA_ARRAY(a, int, out->maxgroup + 1);
  for (int i = 0; i < f->nops;) {
    int g = f->ops[i]->group;
    if (g <= 0) {
      i++;
      continue;
    }
    int j = i;
    while (j < f->nops && f->ops[j]->group == g) j++;
    if (seen[g]++) return errf(err, errlen, "kernel k%d is not contiguous in the op list", g);
    KpKernel *k = &out->k[out->n++];
    k->group = g;
    k->ops = f->ops + i;
    k->n = j - i;
    k->name = kernel_name(a, g, k->ops, k->n);
    char why[256];
    if (k->n == 1 && !kp_op_row_alone(k->ops[0]))
      k->row = false;
    else if (kp_row_layout(k->ops, k->n, used_by, out->used_outside, a, &k->layout, why, sizeof why))
      k->row = true;
    else
      return errf(err, errlen, "kernel k%d: %s", g, why);
    i = j;
  }
  return true;
}

KpSlot *kp_row_slot(const KpRowLayout *l, const IrValue *v) {
  for (int i = 0; i < l->nslots; i++)
    if (l->slots[i].v == v) return &l->slots[i];
  return NULL;
}

void kp_slot_strides(const KpRowLayout *l, const KpSlot *s, int64_t *stride) {
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

void kp_slice_ranges(const IrOp *op, const IrShape *full, int64_t *start, int64_t *step) {
  const int64_t *starts, *stops, *steps;
  int ns = ir_attr_get_ints(op, "starts", &starts);
  int ne = ir_attr_get_ints(op, "stops", &stops);
  int np = ir_attr_get_ints(op, "steps", &steps);
  for (int k = 0; k < full->rank; k++) {
    start[k] = k < ns ? starts[k] : 0;
    int64_t stop = k < ne ? stops[k] : full->dim[k];
    step[k] = k < np && steps[k] != 0 ? steps[k] : 1;
    slice_indices(full->dim[k], &start[k], stop, step[k]);
  }
}

bool kp_slice_contiguous(const IrOp *op, int64_t *first) {
  if (op->opcode != IR_OP_SLICE && op->opcode != IR_OP_UNSLICE) return false;
  bool un = op->opcode == IR_OP_UNSLICE;
  const IrShape *full = un ? &op->result->type.shape : &op->args[0]->type.shape;
  const IrShape *part = un ? &op->args[0]->type.shape : &op->result->type.shape;
  if (part->rank != full->rank || ir_numel(part) == 0) return false;
  int64_t start[IR_MAX_RANK], step[IR_MAX_RANK];
  kp_slice_ranges(op, full, start, step);
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

/* ------------------------------------------------------------------ */
/* Strided views that GEMMs read and write in place                    */
/* ------------------------------------------------------------------ */

void kp_view_whole(const IrValue *v, KpView *out) {
  memset(out, 0, sizeof *out);
  out->root = v;
  out->shape = v->type.shape;
  int64_t m = 1;
  for (int k = out->shape.rank - 1; k >= 0; k--) {
    out->stride[k] = m;
    m *= out->shape.dim[k];
  }
}

/* The view reshaped to s without moving elements, when its axes allow it
 * (NumPy's no-copy reshape): each run of old axes merged or split must be
 * laid out one after the other in memory. */
static bool view_reshape(KpView *v, const IrShape *s) {
  int64_t od[IR_MAX_RANK], os[IR_MAX_RANK], ns[IR_MAX_RANK];
  int on = 0, nn = s->rank;
  if (ir_numel(&v->shape) != ir_numel(s) || ir_numel(s) == 0) return false;
  for (int k = 0; k < v->shape.rank; k++)
    if (v->shape.dim[k] != 1) od[on] = v->shape.dim[k], os[on++] = v->stride[k];
  int oi = 0, oj = 1, ni = 0, nj = 1;
  while (ni < nn && oi < on) {
    int64_t np = s->dim[ni], op = od[oi];
    while (np != op) {
      if (np < op)
        np *= s->dim[nj++];
      else
        op *= od[oj++];
    }
    for (int ok = oi; ok < oj - 1; ok++)
      if (od[ok + 1] * os[ok + 1] != os[ok]) return false;
    ns[nj - 1] = os[oj - 1];
    for (int nk = nj - 1; nk > ni; nk--) ns[nk - 1] = ns[nk] * s->dim[nk];
    ni = nj++;
    oi = oj++;
  }
  int64_t last = ni >= 1 ? ns[ni - 1] : 1;
  for (int nk = ni; nk < nn; nk++) ns[nk] = last;
  v->shape = *s;
  memcpy(v->stride, ns, sizeof ns);
  return true;
}

bool kp_view_apply(KpView *v, const IrOp *op) {
  const IrShape *rs = &op->result->type.shape;
  if (op->opcode == IR_OP_PERMUTE) {
    const int64_t *perm;
    int n = ir_attr_get_ints(op, "perm", &perm);
    if (n != v->shape.rank) return false;
    KpView w = *v;
    for (int i = 0; i < n; i++) {
      w.shape.dim[i] = v->shape.dim[perm[i]];
      w.stride[i] = v->stride[perm[i]];
    }
    *v = w;
    return true;
  }
  if (op->opcode == IR_OP_SLICE) {
    int64_t start[IR_MAX_RANK], step[IR_MAX_RANK];
    kp_slice_ranges(op, &v->shape, start, step);
    for (int k = 0; k < v->shape.rank; k++) {
      if (rs->dim[k] > 1 && step[k] < 1) return false;
      v->offset += start[k] * v->stride[k];
      v->stride[k] *= step[k];
    }
    v->shape = *rs;
    return ir_numel(rs) > 0;
  }
  if (op->opcode == IR_OP_RESHAPE) return view_reshape(v, rs);
  return false;
}

bool kp_view_unapply(KpView *v, const IrOp *op, int operand) {
  const IrShape *xs = &op->args[operand]->type.shape;
  if (op->opcode == IR_OP_PERMUTE) {
    const int64_t *perm;
    int n = ir_attr_get_ints(op, "perm", &perm);
    if (n != v->shape.rank) return false;
    KpView w = *v;
    for (int i = 0; i < n; i++) {
      w.shape.dim[perm[i]] = v->shape.dim[i];
      w.stride[perm[i]] = v->stride[i];
    }
    *v = w;
    return true;
  }
  if (op->opcode == IR_OP_RESHAPE) return view_reshape(v, xs);
  if (op->opcode == IR_OP_CONCAT) {
    int64_t axis;
    if (!ir_norm_axis(ir_attr_get_int(op, "axis", 0), v->shape.rank, &axis)) return false;
    for (int j = 0; j < operand; j++) v->offset += op->args[j]->type.shape.dim[axis] * v->stride[axis];
    v->shape = *xs;
    return true;
  }
  return false;
}

bool kp_view_matrix(const KpView *v, bool *trans, int64_t *ld) {
  int r = v->shape.rank;
  if (r < 2) return false;
  int64_t m = v->shape.dim[r - 2], n = v->shape.dim[r - 1], sm = v->stride[r - 2], sn = v->stride[r - 1];
  if ((n == 1 || sn == 1) && (m == 1 || sm >= n)) {
    *trans = false;
    *ld = m == 1 ? n : sm;
    return true;
  }
  if ((m == 1 || sm == 1) && (n == 1 || sn >= m)) {
    *trans = true;
    *ld = n == 1 ? m : sn;
    return true;
  }
  return false;
}

/* Users of every value (op, operand index), by value id (kernel.h). */
typedef KpUses Uses;

static void uses_build(const IrFunc *f, Uses *u) {
  int nv = f->nvalues, total = 0;
  u->start = calloc((size_t)nv + 1, sizeof(int));
  u->n = calloc((size_t)nv + 1, sizeof(int));
  for (int i = 0; i < f->nops; i++) total += f->ops[i]->nargs;
  u->op = calloc((size_t)total + 1, sizeof(IrOp *));
  u->arg = calloc((size_t)total + 1, sizeof(int));
  if (!u->start || !u->n || !u->op || !u->arg) abort();
  for (int i = 0; i < f->nops; i++)
    for (int j = 0; j < f->ops[i]->nargs; j++) u->n[f->ops[i]->args[j]->id]++;
  for (int v = 0; v < nv; v++) u->start[v + 1] = u->start[v] + u->n[v];
  memset(u->n, 0, sizeof(int) * (size_t)nv);
  for (int i = 0; i < f->nops; i++)
    for (int j = 0; j < f->ops[i]->nargs; j++) {
      int id = f->ops[i]->args[j]->id, k = u->start[id] + u->n[id]++;
      u->op[k] = f->ops[i];
      u->arg[k] = j;
    }
}

static void uses_free(Uses *u) {
  free(u->start);
  free(u->n);
  free(u->op);
  free(u->arg);
  memset(u, 0, sizeof *u);
}

/* Whether v feeds a `grad`, directly or through adds (which memplan may
 * split into one contribution each): its buffer is a gradient's, no
 * place for a view's writes. */
static bool flows_to_grad(const Uses *u, const IrValue *v) {
  for (int k = u->start[v->id]; k < u->start[v->id] + u->n[v->id]; k++) {
    const IrOp *w = u->op[k];
    if (w->opcode == IR_OP_GRAD || (w->opcode == IR_OP_ADD && flows_to_grad(u, w->result))) return true;
  }
  return false;
}

static bool view_dtype(const IrValue *v) { return v->type.dtype == IR_DT_F32 || v->type.dtype == IR_DT_F64; }

static bool view_mover(const IrOp *op) {
  int64_t first;
  if (op->opcode == IR_OP_SLICE) return !kp_slice_contiguous(op, &first); /* a range slice is an alias */
  return op->opcode == IR_OP_PERMUTE || op->opcode == IR_OP_RESHAPE;
}

bool kp_view_in(const KpViews *vs, const IrValue *v, KpView *out) {
  if (vs->place[v->id] != KP_VIEW_IN) {
    kp_view_whole(v, out);
    return true;
  }
  return kp_view_in(vs, v->def->args[0], out) && kp_view_apply(out, v->def);
}

bool kp_view_out(const KpViews *vs, const IrValue *v, KpView *out) {
  if (vs->place[v->id] != KP_VIEW_OUT) {
    kp_view_whole(v, out);
    return true;
  }
  const IrOp *u = vs->user[v->id];
  int j = 0;
  while (u->args[j] != v) j++;
  return kp_view_out(vs, u->result, out) && kp_view_unapply(out, u, j);
}

const IrValue *kp_view_home(const KpViews *vs, const IrValue *v) {
  while (vs->place[v->id] == KP_VIEW_IN) v = v->def->args[0];
  while (vs->place[v->id] == KP_VIEW_OUT) v = vs->user[v->id]->result;
  return v;
}

bool kp_view_free_op(const KpViews *vs, const IrOp *op) {
  if (!op->result || (op->opcode != IR_OP_PERMUTE && op->opcode != IR_OP_RESHAPE && op->opcode != IR_OP_SLICE &&
                      op->opcode != IR_OP_CONCAT))
    return false;
  if (vs->place[op->result->id] != KP_MEM) return true;
  if (op->opcode == IR_OP_SLICE) return false;
  for (int j = 0; j < op->nargs; j++)
    if (vs->place[op->args[j]->id] != KP_VIEW_OUT) return false;
  return op->nargs > 0;
}

typedef bool (*OutsideFn)(const IrOp *op, void *ctx);

/* The values GEMMs read through views (KP_VIEW_IN), and their views. */
static void find_view_ins(const IrFunc *f, OutsideFn outside, void *ctx, const Uses *u, uint8_t *place, KpView *view) {
  /* Operands: every use of the value is a GEMM operand of rank >= 2 or a
   * view itself (users come later in the list: a backward sweep), then
   * demoted until every view composes, fits a GEMM and has only view
   * users. */
  for (int i = f->nops - 1; i >= 0; i--) {
    const IrOp *op = f->ops[i];
    const IrValue *v = op->result;
    if (!v || !outside(op, ctx) || !view_mover(op) || !view_dtype(v) || u->n[v->id] == 0) continue;
    bool ok = true;
    for (int k = u->start[v->id]; ok && k < u->start[v->id] + u->n[v->id]; k++) {
      const IrOp *w = u->op[k];
      ok = (w->opcode == IR_OP_MATMUL && outside(w, ctx) && v->type.shape.rank >= 2) ||
           (w->result && place[w->result->id] == KP_VIEW_IN);
    }
    if (ok) place[v->id] = KP_VIEW_IN;
  }
  for (bool changed = true; changed;) {
    changed = false;
    for (int i = 0; i < f->nops; i++) {
      const IrOp *op = f->ops[i];
      const IrValue *v = op->result;
      if (!v || place[v->id] != KP_VIEW_IN) continue;
      const IrValue *x = op->args[0];
      bool ok = true;
      /* A reshape of a stored value is an alias of it, not a view. */
      if (op->opcode == IR_OP_RESHAPE && place[x->id] != KP_VIEW_IN) ok = false;
      if (ok) {
        if (place[x->id] == KP_VIEW_IN)
          view[v->id] = view[x->id];
        else
          kp_view_whole(x, &view[v->id]);
        ok = kp_view_apply(&view[v->id], op);
      }
      for (int k = u->start[v->id]; ok && k < u->start[v->id] + u->n[v->id]; k++) {
        const IrOp *w = u->op[k];
        bool t;
        int64_t ld;
        if (w->opcode == IR_OP_MATMUL) ok = kp_view_matrix(&view[v->id], &t, &ld);
        else ok = w->result && place[w->result->id] == KP_VIEW_IN;
      }
      if (!ok) {
        place[v->id] = KP_MEM;
        changed = true;
      }
    }
  }
}

/* The values GEMMs write through views (KP_VIEW_OUT), and the ops they
 * are written through. */
static void find_view_outs(const IrFunc *f, OutsideFn outside, void *ctx, const Uses *u, KpViews *out) {
  uint8_t *place = out->place;
  /* Results: a GEMM whose result is read once, by a permute or reshape,
   * and so on until a value that is stored (or is one part of a concat
   * all of whose parts are such), writes straight into that value's
   * buffer.  The chain must hold a permute or end in the concat (a chain
   * of reshapes is an alias already) and feed no gradient. */
  for (int i = 0; i < f->nops; i++) {
    const IrOp *mm = f->ops[i];
    if (mm->opcode != IR_OP_MATMUL || !outside(mm, ctx) || !view_dtype(mm->result) ||
        mm->result->type.shape.rank < 2)
      continue;
    const IrValue *v = mm->result;
    bool permuted = false;
    int len = 0;
    while (u->n[v->id] == 1) {
      const IrOp *w = u->op[u->start[v->id]];
      if ((w->opcode != IR_OP_PERMUTE && w->opcode != IR_OP_RESHAPE) || !outside(w, ctx) ||
          place[w->result->id] != KP_MEM)
        break;
      permuted |= w->opcode == IR_OP_PERMUTE;
      out->user[v->id] = w;
      v = w->result;
      len++;
    }
    bool to_concat = false;
    if (len > 0 && u->n[v->id] == 1) {
      const IrOp *w = u->op[u->start[v->id]];
      to_concat = w->opcode == IR_OP_CONCAT && outside(w, ctx) && view_dtype(w->result);
      if (to_concat) out->user[v->id] = w;
    }
    if (len == 0 || (!permuted && !to_concat) || flows_to_grad(u, v)) continue;
    /* Tentatively: the chain's values (and with a concat, its end too). */
    for (const IrValue *x = mm->result; x != v; x = out->user[x->id]->result) place[x->id] = KP_VIEW_OUT;
    if (to_concat) place[v->id] = KP_VIEW_OUT;
  }
  /* Until nothing changes: a concat is written in place only if all its
   * parts are (else its parts are stored and their chains end there);
   * each GEMM's chain must give it a matrix with a unit stride (else the
   * chain is stored); a chain member whose operand was stored is stored
   * too (a forward sweep carries that down the chain). */
  for (bool changed = true; changed;) {
    changed = false;
    for (int i = 0; i < f->nops; i++) {
      const IrOp *op = f->ops[i];
      if (op->opcode == IR_OP_CONCAT) {
        bool all = true;
        for (int j = 0; j < op->nargs; j++)
          all &= place[op->args[j]->id] == KP_VIEW_OUT && u->n[op->args[j]->id] == 1;
        for (int j = 0; j < op->nargs && !all; j++)
          if (place[op->args[j]->id] == KP_VIEW_OUT) place[op->args[j]->id] = KP_MEM, changed = true;
        continue;
      }
      const IrValue *v = op->result;
      if (!v || place[v->id] != KP_VIEW_OUT) continue;
      if (op->opcode == IR_OP_MATMUL) {
        KpView cv;
        bool t;
        int64_t ld;
        if (kp_view_out(out, v, &cv) && kp_view_matrix(&cv, &t, &ld)) continue;
      } else if (place[op->args[0]->id] == KP_VIEW_OUT) {
        continue;
      }
      place[v->id] = KP_MEM;
      changed = true;
    }
  }
}

void kp_views_find(const IrFunc *f, bool (*outside)(const IrOp *op, void *ctx), void *ctx, KpViews *out) {
  int nv = f->nvalues;
  out->n = nv;
  out->place = calloc((size_t)nv + 1, 1);
  out->user = calloc((size_t)nv + 1, sizeof(IrOp *));
  KpView *view = calloc((size_t)nv + 1, sizeof(KpView));
  if (!out->place || !out->user || !view) abort();
  uses_build(f, &out->uses);
  find_view_ins(f, outside, ctx, &out->uses, out->place, view);
  find_view_outs(f, outside, ctx, &out->uses, out);
  free(view);
}

void kp_views_free(KpViews *vs) {
  free(vs->place);
  free(vs->user);
  uses_free(&vs->uses);
  vs->place = NULL;
  vs->user = NULL;
}
