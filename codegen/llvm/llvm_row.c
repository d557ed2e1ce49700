/* llvm_row.c - row kernels (docs/BACKEND.md): one function per kernel,
 *
 *   void kN(ptr arena, i64 begin, i64 end, ptr offs)
 *     for r in [begin, end):            rows of the iteration space
 *       section 0; loop 0 over j; section 1; loop 1 over j; ...; section K
 *
 * (with a column sum, [begin, end) are groups of G rows, rows [begin G,
 * end G): the sum's totals are zeroed at a group's first row, added to in
 * its operand's loop, and written after the group's last row).  Short
 * rows that are reduced over run several an iteration, each section and
 * loop doing the work of each row in turn (lanes_for).
 *
 * The passes come from the kernel plan (kp_row_plan, passes/kernel_row.c);
 * this file adds the CPU's policy over them.  An elementwise op whose
 * result varies along the row runs in a loop where all its operands are
 * available (the loop of its first use, so that cheap values are computed
 * where they are needed rather than kept); one that does not (a per-row
 * value) runs in a section between loops; a reduction accumulates in a
 * loop and is finished in the next section (softmax, layer_norm, rms_norm,
 * logsumexp and cross_entropy take two or three such passes, like the
 * reference interpreter's loops; softmax, logsumexp and cross_entropy of
 * one operand share their row maximum and sum; a softmax keeps its
 * exponentials in a row buffer and sums them after their loop, which then
 * runs at the value's vector width, and a causal softmax over long rows
 * computes them only up to the diagonal).  Sums accumulate in f64
 * and the normalisations' statistics are f64, as in the interpreter; the
 * per-element math is in the value's dtype.
 * Values stay in registers inside one loop; a value a later loop reads is
 * materialised (in its output row when it is a plain output, else in row
 * scratch).  Inputs are read from the arena with their broadcast strides;
 * outputs are written once per element (or once per row), accumulated
 * into gradient buffers. */
#include <limits.h>
#include <math.h>
#include <string.h>

#include <llvm-c/DebugInfo.h>

#include "llvm_gen.h"

/* A step of the kernel plan (kp_row_plan) as this generator runs it. */
typedef struct Plan {
  const IrOp *op;
  KpRowKind kind;
  int p[3];   /* the loops of its passes (KpRowStep.pass), -1 when unused */
  int fin[2]; /* the sections of its per-row steps, -1 when unused; a per-row
                 elementwise op runs in section fin[0] */
  GenAcc acc[2];
  LLVMValueRef st[3]; /* per-row state: max, sum, mean, rstd, log-sum */
  int share;          /* softmax/logsumexp/cross_entropy: the earlier plan whose row
                         max and sum of exponentials over the same operand it reuses, or -1 */
  LLVMValueRef erow;  /* the owner of row statistics a softmax reads: exp(x - max) of the
                         row, kept by the sum's loop for the softmax's output loop */
  LLVMValueRef colacc; /* a column sum's totals of the group of rows so far, one per column */
  int y;              /* result slot */
  int x[3];           /* operand slots */
} Plan;

typedef struct RSlot {
  const KpSlot *cs;
  bool elem;        /* one value per element (laid on the row axis) */
  GenBuf buf;       /* arena buffer or inline const */
  bool mem;         /* read from or written to the arena */
  bool out;         /* an output with storage (memplan leaves outputs nothing reads unstored) */
  int avail;        /* loop (computed in a loop) or section where it is available */
  bool in_loop;     /* computed inside a loop (else in a section, or an input) */
  bool mat;         /* read by a later loop or gathered: kept in memory */
  bool defer;       /* an output over an operand (memplan) that a later loop reads again:
                       kept in scratch and stored once the row is done */
  LLVMValueRef scratch;
  int64_t stride[IR_MAX_RANK]; /* element strides over the space's axes */
  LLVMValueRef rowptr;         /* element 0 of this row */
  LLVMValueRef reg;            /* current register */
  int reg_loop;                /* loop it belongs to; -1: a per-row register (valid for the whole row) */
} RSlot;

/* Rows a loop iteration runs side by side, at most (see lanes_for). */
#define ROW_MAX_LANES 4

typedef struct Row {
  Gen *g;
  const KpRowLayout *l;
  RSlot *s; /* the current lane's slots and plans */
  int ns;
  Plan *plan;
  int np;
  LLVMValueRef r, j; /* row and column indices */
  int nlanes;        /* rows an iteration of the row loop runs (lanes_for) */
  RSlot *lane_s[ROW_MAX_LANES];
  Plan *lane_plan[ROW_MAX_LANES];
  LLVMValueRef lane_r[ROW_MAX_LANES];
  Arena *a;
} Row;

/* Make lane u current: its slots, plans and row. */
static void lane(Row *R, int u) {
  R->s = R->lane_s[u];
  R->plan = R->lane_plan[u];
  R->r = R->lane_r[u];
}

static LLVMValueRef slot_ptr(Row *R, RSlot *s, LLVMValueRef base, LLVMValueRef idx) {
  return gen_buf_ptr(R->g, &s->buf, base, idx);
}

/* ------------------------------------------------------------------ */
/* Addressing                                                          */
/* ------------------------------------------------------------------ */

/* Element offset of row r for a slot: the row axes merged where the
 * strides allow, then one div/mod term per merged axis. */
static LLVMValueRef row_offset(Row *R, RSlot *s) {
  Gen *g = R->g;
  int n = R->l->space.rank;
  int64_t ext[IR_MAX_RANK], st[IR_MAX_RANK];
  int m = kp_merge_axes(R->l->space.dim, s->stride, n > 0 ? n - 1 : 0, ext, st);
  LLVMValueRef off = gen_i64(g, 0);
  int64_t inner = 1;
  for (int k = m - 1; k >= 0; k--) {
    if (st[k] != 0) {
      LLVMValueRef q = inner == 1 ? R->r : LLVMBuildUDiv(g->b, R->r, gen_i64(g, inner), "");
      if (k > 0) q = LLVMBuildURem(g->b, q, gen_i64(g, ext[k]), "");
      off = LLVMBuildNSWAdd(g->b, off, LLVMBuildNSWMul(g->b, q, gen_i64(g, st[k]), ""), "");
    }
    inner *= ext[k];
  }
  return off;
}

static bool row_invariant(Row *R, RSlot *s) {
  for (int a = 0; a + 1 < R->l->space.rank; a++)
    if (s->stride[a] != 0) return false;
  return true;
}

/* Index of element j of the row in a slot's row. */
static LLVMValueRef col_index(Row *R, RSlot *s) {
  int n = R->l->space.rank;
  int64_t st = n ? s->stride[n - 1] : 0;
  if (st == 0) return gen_i64(R->g, 0);
  if (st == 1) return R->j;
  return LLVMBuildNSWMul(R->g->b, R->j, gen_i64(R->g, st), "");
}

/* ------------------------------------------------------------------ */
/* Reading and writing values                                          */
/* ------------------------------------------------------------------ */

static LLVMValueRef row_val(Row *R, int i) {
  RSlot *s = &R->s[i];
  if (s->buf.is_const) return gen_const(R->g, s->cs->v->type.dtype, s->buf.cval);
  GRADC_ASSERT(s->reg && s->reg_loop == -1);
  return s->reg;
}

/* Where a materialised value lives: its scratch row or its output row. */
static LLVMValueRef mat_ptr(Row *R, RSlot *s) {
  Gen *g = R->g;
  if (s->scratch) {
    LLVMTypeRef t = gen_mem_type(g, s->cs->v->type.dtype);
    return LLVMBuildInBoundsGEP2(g->b, t, s->scratch, &R->j, 1, "");
  }
  LLVMValueRef idx = col_index(R, s);
  return slot_ptr(R, s, s->rowptr, idx);
}

/* Operand i in loop k: a per-row register, an input load, or a value of an
 * earlier loop read back. */
static LLVMValueRef elem_val(Row *R, int i, int k) {
  Gen *g = R->g;
  RSlot *s = &R->s[i];
  if (s->buf.is_const) return gen_const(g, s->cs->v->type.dtype, s->buf.cval);
  if (s->reg && (s->reg_loop == -1 || s->reg_loop == k)) return s->reg;
  LLVMValueRef v;
  if (!s->cs->defined) {
    v = gen_load(g, slot_ptr(R, s, s->rowptr, col_index(R, s)), s->cs->v->type.dtype, s->buf.scope);
  } else {
    GRADC_ASSERT(s->mat && s->in_loop && s->avail < k);
    v = gen_load(g, mat_ptr(R, s), s->cs->v->type.dtype, s->scratch ? -1 : s->buf.scope);
  }
  s->reg = v;
  s->reg_loop = k;
  return v;
}

static LLVMValueRef operand(Row *R, int i, int k) { return k < 0 ? row_val(R, i) : elem_val(R, i, k); }

/* Define slot i: in loop k (>= 0) or in a section (k = -1). */
static void define(Row *R, int i, LLVMValueRef v, int k) {
  Gen *g = R->g;
  RSlot *s = &R->s[i];
  s->reg = v;
  s->reg_loop = k;
  if (s->out && !s->defer) {
    LLVMValueRef idx = k >= 0 ? col_index(R, s) : gen_i64(g, 0);
    gen_store(g, slot_ptr(R, s, s->rowptr, idx), v, s->cs->v->type.dtype, s->buf.grad, s->buf.scope);
  }
  if (k >= 0 && s->scratch) gen_store(g, mat_ptr(R, s), v, s->cs->v->type.dtype, false, -1);
}

/* ------------------------------------------------------------------ */
/* Planning                                                            */
/* ------------------------------------------------------------------ */

static int maxi(int a, int b) { return a > b ? a : b; }

/* A use of slot i in loop k: an earlier loop's value must be kept. */
static void use_in(Row *R, int i, int k) {
  RSlot *s = &R->s[i];
  if (s->cs->defined && s->in_loop && k > s->avail) s->mat = true;
}

/* A step that computes one value an element and reduces over nothing. */
static bool elementwise(KpRowKind k) {
  return k == KP_ROW_EW || k == KP_ROW_ONEHOT || k == KP_ROW_EMB || k == KP_ROW_CMASK || k == KP_ROW_UNSLICE ||
         k == KP_ROW_RAND;
}

/* Computed in loop p[0] where its operands are: may sink to a later loop. */
static bool sinks(const Plan *p) { return p->p[0] >= 0 && elementwise(p->kind); }

/* Step q of the kernel plan: a per-element elementwise op runs in loop
 * pass[0], a per-row one in section pass[0]. */
static void plan_op(Row *R, Plan *p, const KpRowStep *q) {
  memset(p, 0, sizeof *p);
  p->op = q->op;
  p->kind = q->kind;
  memcpy(p->p, q->pass, sizeof p->p);
  memcpy(p->fin, q->fin, sizeof p->fin);
  memcpy(p->x, q->x, sizeof p->x);
  p->y = q->y;
  RSlot *y = &R->s[p->y];
  if ((p->kind == KP_ROW_EW || p->kind == KP_ROW_RAND) && !y->elem) p->fin[0] = p->p[0], p->p[0] = -1;
  y->avail = q->at;
  y->in_loop = sinks(p) || p->p[2] >= 0;
}

static bool row_stats(KpRowKind k) { return k == KP_ROW_SOFTMAX || k == KP_ROW_LSE || k == KP_ROW_CE; }

/* The loops in which plan p reads its operand i (into loops[]). */
static int reads(const Plan *p, int i, int *loops) {
  int n = 0;
  bool all = p->kind != KP_ROW_LN && p->kind != KP_ROW_RMS ? true : i == 0;
  for (int k = 0; k < 3; k++)
    if (p->p[k] >= 0 && (all || k == 2)) loops[n++] = p->p[k];
  return n;
}

/* After every op is planned: share row statistics, sink elementwise work
 * to the loop of its first use (so that, say, a one_hot is computed where
 * the backward subtracts it rather than kept in scratch), and mark the
 * values later loops read (or a cross_entropy gathers) for materialising. */
static void finish_plans(Row *R) {
  for (int q = 0; q < R->np; q++) {
    Plan *p = &R->plan[q];
    p->share = -1;
    if (!row_stats(p->kind)) continue;
    for (int e = 0; e < q && p->share < 0; e++)
      if (row_stats(R->plan[e].kind) && R->plan[e].share < 0 && R->plan[e].x[0] == p->x[0]) p->share = e;
    if (p->share >= 0) p->p[0] = p->p[1] = -1;
  }
  for (int q = R->np - 1; q >= 0; q--) {
    Plan *p = &R->plan[q];
    if (!sinks(p)) continue;
    int first = -1, loops[3];
    for (int c = q + 1; c < R->np; c++) {
      const Plan *u = &R->plan[c];
      for (int i = 0; i < 3; i++) {
        if (u->x[i] != p->y) continue;
        int n = reads(u, i, loops);
        for (int k = 0; k < n; k++)
          if (first < 0 || loops[k] < first) first = loops[k];
        if (u->kind == KP_ROW_CE && i == 0 && (first < 0 || u->fin[0] - 1 < first)) first = u->fin[0] - 1;
      }
    }
    if (first > p->p[0]) {
      p->p[0] = first;
      R->s[p->y].avail = first;
    }
  }
  for (int i = 0; i < R->ns; i++) R->s[i].mat = false;
  for (int q = 0; q < R->np; q++) {
    Plan *p = &R->plan[q];
    int loops[3];
    for (int i = 0; i < 3; i++) {
      if (p->x[i] < 0) continue;
      int n = reads(p, i, loops);
      for (int k = 0; k < n; k++) use_in(R, p->x[i], loops[k]);
    }
    if (p->kind == KP_ROW_CE && R->s[p->x[0]].cs->defined) R->s[p->x[0]].mat = true; /* gathered at the target */
  }
}

/* ------------------------------------------------------------------ */
/* Emission                                                            */
/* ------------------------------------------------------------------ */

/* The row maximum (after its loop) and sum of exponentials (after the
 * next) of softmax, logsumexp and cross_entropy, or the shared ones. */
static void row_stats_step(Row *R, Plan *p, int k) {
  Gen *g = R->g;
  int ax1 = p->fin[0]; /* the section after the max loop */
  if (k == ax1) p->st[0] = p->share >= 0 ? R->plan[p->share].st[0] : gen_acc_get(g, p->acc[0]);
  if (k == ax1 + 1 && p->share < 0 && p->erow) {
    /* The exponentials were kept in erow by a loop of the value's width:
     * an f64 sum in that loop would halve its vector width (and the exp's). */
    GenLoop sl;
    gen_loop_begin(g, &sl, gen_i64(g, 0), gen_i64(g, R->l->cols), "esum");
    LLVMTypeRef et = gen_reg_type(g, p->op->args[0]->type.dtype);
    LLVMValueRef e = LLVMBuildLoad2(g->b, et, LLVMBuildInBoundsGEP2(g->b, et, p->erow, &sl.iv, 1, ""), "");
    gen_acc_set(g, p->acc[1], gen_add_reassoc(g, gen_acc_get(g, p->acc[1]), gen_widen(g, e)));
    gen_loop_end(g, &sl);
  }
  if (k == ax1 + 1) p->st[1] = p->share >= 0 ? R->plan[p->share].st[1] : gen_acc_get(g, p->acc[1]);
}

/* A random op's draw at (r, j): its element's index in its own result
 * (broadcast axes repeat the draw, as the value repeats). */
static LLVMValueRef random_elem(Row *R, const Plan *p) {
  RSlot *y = &R->s[p->y];
  LLVMValueRef e = LLVMBuildNSWAdd(R->g->b, row_offset(R, y), col_index(R, y), "");
  return gen_random(R->g, p->op, e);
}

/* The per-row steps of plan p in section k. */
static void section_step(Row *R, Plan *p, int k) {
  Gen *g = R->g;
  const IrOp *op = p->op;
  IrDType dt = op->result->type.dtype;
  double cols = (double)R->l->cols;
  /* accumulators of passes in the coming loop k */
  for (int i = 0; i < 3; i++) {
    if (p->p[i] != k) continue;
    int ai = -1;
    double init = 0;
    switch (p->kind) {
    case KP_ROW_RED: ai = 0, init = op->opcode == IR_OP_MAX ? -INFINITY : 0; break;
    case KP_ROW_COLSUM: break; /* zeroed when its group of rows starts (emit_rows) */
    case KP_ROW_LSE:
    case KP_ROW_SOFTMAX:
    case KP_ROW_CE: ai = i == 0 ? 0 : i == 1 ? 1 : -1, init = i == 0 ? -INFINITY : 0; break;
    case KP_ROW_LN: ai = i < 2 ? i : -1; break;
    case KP_ROW_RMS: ai = i == 0 ? 0 : -1; break;
    case KP_ROW_EW:
    case KP_ROW_ONEHOT:
    case KP_ROW_EMB:
    case KP_ROW_CMASK:
    case KP_ROW_UNSLICE:
    case KP_ROW_RAND:
    case KP_ROW_NONE: break;
    }
    if (ai >= 0) {
      LLVMTypeRef at = p->acc[ai].t;
      gen_acc_set(g, p->acc[ai], LLVMGetTypeKind(at) == LLVMIntegerTypeKind ? LLVMConstInt(at, 0, 0) : LLVMConstReal(at, init));
    }
  }
  switch (p->kind) {
  case KP_ROW_EW:
    if (p->fin[0] == k) {
      LLVMValueRef a[3];
      for (int i = 0; i < op->nargs; i++) a[i] = row_val(R, p->x[i]);
      define(R, p->y, gen_elementwise(g, op, a), -1);
    }
    break;
  case KP_ROW_RED:
    if (p->fin[0] == k) {
      LLVMValueRef v = gen_acc_get(g, p->acc[0]);
      if (op->opcode == IR_OP_MEAN) v = LLVMBuildFDiv(g->b, v, LLVMConstReal(LLVMTypeOf(v), cols), "");
      define(R, p->y, gen_narrow(g, v, dt), -1);
    }
    break;
  case KP_ROW_LSE:
    row_stats_step(R, p, k);
    if (p->fin[1] == k) {
      LLVMValueRef m = p->st[0], s = p->st[1];
      LLVMValueRef v = LLVMBuildFAdd(g->b, gen_widen(g, m), gen_call1(g, "llvm.log", s), "");
      v = LLVMBuildSelect(g->b, gen_isfinite(g, m), v, gen_widen(g, m), "");
      define(R, p->y, gen_narrow(g, v, dt), -1);
    }
    break;
  case KP_ROW_SOFTMAX:
    row_stats_step(R, p, k);
    if (p->fin[1] == k) {
      if (op->opcode == IR_OP_LOG_SOFTMAX)
        p->st[2] = gen_narrow(g, gen_call1(g, "llvm.log", p->st[1]), op->args[0]->type.dtype);
      else /* y = e * (1/z), rounded once per row */
        p->st[2] = gen_narrow(g, LLVMBuildFDiv(g->b, LLVMConstReal(g->t_f64, 1.0), p->st[1], ""), op->args[0]->type.dtype);
    }
    break;
  case KP_ROW_LN: /* statistics in f64, as the interpreter */
    if (p->fin[0] == k) {
      p->st[0] = LLVMBuildFDiv(g->b, gen_acc_get(g, p->acc[0]), LLVMConstReal(g->t_f64, cols), "");
      p->st[2] = gen_narrow(g, p->st[0], op->args[0]->type.dtype == IR_DT_F64 ? IR_DT_F64 : IR_DT_F32);
    }
    if (p->fin[1] == k) {
      LLVMValueRef var = LLVMBuildFDiv(g->b, gen_acc_get(g, p->acc[1]), LLVMConstReal(g->t_f64, cols), "");
      var = LLVMBuildFAdd(g->b, var, LLVMConstReal(g->t_f64, ir_op_eps(op)), "");
      p->st[1] = LLVMBuildFDiv(g->b, LLVMConstReal(g->t_f64, 1.0), gen_call1(g, "llvm.sqrt", var), "");
      p->st[1] = gen_narrow(g, p->st[1], op->args[0]->type.dtype == IR_DT_F64 ? IR_DT_F64 : IR_DT_F32);
    }
    break;
  case KP_ROW_RMS:
    if (p->fin[0] == k) {
      LLVMValueRef ms = LLVMBuildFDiv(g->b, gen_acc_get(g, p->acc[0]), LLVMConstReal(g->t_f64, cols), "");
      ms = LLVMBuildFAdd(g->b, ms, LLVMConstReal(g->t_f64, ir_op_eps(op)), "");
      p->st[1] = LLVMBuildFDiv(g->b, LLVMConstReal(g->t_f64, 1.0), gen_call1(g, "llvm.sqrt", ms), "");
      p->st[1] = gen_narrow(g, p->st[1], op->args[0]->type.dtype == IR_DT_F64 ? IR_DT_F64 : IR_DT_F32);
    }
    break;
  case KP_ROW_CE:
    row_stats_step(R, p, k);
    if (p->fin[1] == k) {
      LLVMValueRef m = p->st[0], s = p->st[1];
      LLVMValueRef lse = LLVMBuildFAdd(g->b, gen_widen(g, m), gen_call1(g, "llvm.log", s), "");
      lse = LLVMBuildSelect(g->b, gen_isfinite(g, m), lse, gen_widen(g, m), "");
      LLVMValueRef t = row_val(R, p->x[1]);
      int64_t V = R->l->cols, ii = ir_attr_get_int(op, "ignore_index", -100);
      LLVMValueRef ignored = LLVMBuildICmp(g->b, LLVMIntEQ, t, LLVMConstInt(g->t_i32, (unsigned long long)ii, 1), "");
      LLVMValueRef t64 = LLVMBuildSExt(g->b, t, g->t_i64, "");
      LLVMValueRef ok = LLVMBuildAnd(g->b, LLVMBuildICmp(g->b, LLVMIntSGE, t64, gen_i64(g, 0), ""),
                                     LLVMBuildICmp(g->b, LLVMIntSLT, t64, gen_i64(g, V), ""), "");
      LLVMValueRef safe = LLVMBuildSelect(g->b, ok, t64, gen_i64(g, 0), "");
      /* the logit at the target: read from memory at column `safe` */
      RSlot *xs = &R->s[p->x[0]];
      LLVMValueRef saved = R->j;
      R->j = safe;
      LLVMValueRef xt;
      if (xs->buf.is_const)
        xt = gen_const(g, xs->cs->v->type.dtype, xs->buf.cval);
      else if (xs->cs->defined)
        xt = gen_load(g, mat_ptr(R, xs), xs->cs->v->type.dtype, xs->scratch ? -1 : xs->buf.scope);
      else
        xt = gen_load(g, slot_ptr(R, xs, xs->rowptr, col_index(R, xs)), xs->cs->v->type.dtype, xs->buf.scope);
      R->j = saved;
      LLVMValueRef loss = LLVMBuildFSub(g->b, lse, gen_widen(g, xt), "");
      loss = LLVMBuildSelect(g->b, ok, loss, LLVMConstReal(g->t_f64, NAN), "");
      loss = LLVMBuildSelect(g->b, ignored, LLVMConstReal(g->t_f64, 0.0), loss, "");
      define(R, p->y, gen_narrow(g, loss, dt), -1);
    }
    break;
  case KP_ROW_RAND:
    if (p->fin[0] == k) define(R, p->y, random_elem(R, p), -1);
    break;
  case KP_ROW_COLSUM:
  case KP_ROW_ONEHOT:
  case KP_ROW_EMB:
  case KP_ROW_CMASK:
  case KP_ROW_UNSLICE:
  case KP_ROW_NONE: break;
  }
}

/* Element (r, j) of unslice: the operand's element where the slice puts
 * it, else 0.  The result covers the space (kp_row_layout checks). */
static LLVMValueRef unslice_elem(Row *R, const IrOp *op) {
  Gen *g = R->g;
  const IrShape *o = &op->result->type.shape, *s = &op->args[0]->type.shape;
  int k = o->rank;
  int64_t start[IR_MAX_RANK], step[IR_MAX_RANK], xs[IR_MAX_RANK];
  kp_slice_ranges(op, o, start, step);
  kp_contiguous(s, xs);
  LLVMValueRef in = LLVMConstInt(g->t_i1, 1, 0), xoff = gen_i64(g, 0);
  int64_t inner = 1;
  for (int a = k - 1; a >= 0; a--) {
    LLVMValueRef c;
    if (a == k - 1) {
      c = R->j;
    } else {
      c = inner == 1 ? R->r : LLVMBuildUDiv(g->b, R->r, gen_i64(g, inner), "");
      if (a > 0) c = LLVMBuildURem(g->b, c, gen_i64(g, o->dim[a]), "");
      inner *= o->dim[a];
    }
    LLVMValueRef rel = LLVMBuildSub(g->b, c, gen_i64(g, start[a]), "");
    LLVMValueRef q = step[a] == 1 ? rel : LLVMBuildSDiv(g->b, rel, gen_i64(g, step[a]), "");
    LLVMValueRef ok = LLVMBuildAnd(g->b, LLVMBuildICmp(g->b, LLVMIntSGE, rel, gen_i64(g, 0), ""),
                                   LLVMBuildICmp(g->b, LLVMIntSLT, q, gen_i64(g, s->dim[a]), ""), "");
    if (step[a] != 1)
      ok = LLVMBuildAnd(g->b, ok,
                        LLVMBuildICmp(g->b, LLVMIntEQ, LLVMBuildSRem(g->b, rel, gen_i64(g, step[a]), ""), gen_i64(g, 0), ""),
                        "");
    in = LLVMBuildAnd(g->b, in, ok, "");
    xoff = LLVMBuildAdd(g->b, xoff, LLVMBuildMul(g->b, q, gen_i64(g, xs[a]), ""), "");
  }
  GenBuf xb = gen_buf(g, op->args[0]);
  LLVMValueRef v = gen_buf_load(g, &xb, LLVMBuildSelect(g->b, in, xoff, gen_i64(g, 0), ""));
  return LLVMBuildSelect(g->b, in, v, gen_const(g, op->result->type.dtype, 0.0), "");
}

/* The work of plan p inside loop k (column R->j). */
static void loop_step(Row *R, Plan *p, int k) {
  Gen *g = R->g;
  const IrOp *op = p->op;
  IrDType dt = op->result->type.dtype;
  LLVMTypeRef ft = gen_reg_type(g, dt);
  switch (p->kind) {
  case KP_ROW_EW:
    if (p->p[0] == k) {
      LLVMValueRef a[3];
      for (int i = 0; i < op->nargs; i++) a[i] = operand(R, p->x[i], k);
      define(R, p->y, gen_elementwise(g, op, a), k);
    }
    break;
  case KP_ROW_RED:
    if (p->p[0] == k) {
      LLVMValueRef x = elem_val(R, p->x[0], k), acc = gen_acc_get(g, p->acc[0]);
      gen_acc_set(g, p->acc[0],
                  op->opcode == IR_OP_MAX ? gen_max_step(g, acc, x) : gen_add_reassoc(g, acc, gen_widen(g, x)));
    }
    break;
  case KP_ROW_COLSUM:
    if (p->p[0] == k) {
      LLVMValueRef a = LLVMBuildInBoundsGEP2(g->b, gen_acc_type(g, dt), p->colacc, &R->j, 1, "");
      LLVMValueRef cur = LLVMBuildLoad2(g->b, gen_acc_type(g, dt), a, "");
      LLVMBuildStore(g->b, LLVMBuildFAdd(g->b, cur, gen_widen(g, elem_val(R, p->x[0], k)), ""), a);
    }
    break;
  case KP_ROW_LSE:
  case KP_ROW_SOFTMAX:
  case KP_ROW_CE:
    if (p->p[0] == k) gen_acc_set(g, p->acc[0], gen_max_step(g, gen_acc_get(g, p->acc[0]), elem_val(R, p->x[0], k)));
    if (p->p[1] == k) {
      LLVMValueRef e = gen_exp_nonpos(g, LLVMBuildFSub(g->b, elem_val(R, p->x[0], k), p->st[0], ""));
      if (p->erow) /* summed by row_stats_step after the loop */
        LLVMBuildStore(g->b, e, LLVMBuildInBoundsGEP2(g->b, LLVMTypeOf(e), p->erow, &R->j, 1, ""));
      else
        gen_acc_set(g, p->acc[1], gen_add_reassoc(g, gen_acc_get(g, p->acc[1]), gen_widen(g, e)));
    }
    if (p->kind == KP_ROW_SOFTMAX && p->p[2] == k) {
      LLVMValueRef y;
      if (op->opcode == IR_OP_LOG_SOFTMAX) {
        y = LLVMBuildFSub(g->b, LLVMBuildFSub(g->b, elem_val(R, p->x[0], k), p->st[0], ""), p->st[2], "");
      } else {
        const Plan *o = p->share >= 0 ? &R->plan[p->share] : p;
        LLVMTypeRef et = gen_reg_type(g, op->args[0]->type.dtype);
        LLVMValueRef e = LLVMBuildLoad2(g->b, et, LLVMBuildInBoundsGEP2(g->b, et, o->erow, &R->j, 1, ""), "");
        y = LLVMBuildFMul(g->b, e, p->st[2], "");
      }
      define(R, p->y, gen_round(g, y, dt), k);
    }
    break;
  case KP_ROW_LN:
    if (p->p[0] == k)
      gen_acc_set(g, p->acc[0], gen_add_reassoc(g, gen_acc_get(g, p->acc[0]), gen_widen(g, elem_val(R, p->x[0], k))));
    if (p->p[1] == k) {
      LLVMValueRef d = LLVMBuildFSub(g->b, gen_widen(g, elem_val(R, p->x[0], k)), p->st[0], "");
      gen_acc_set(g, p->acc[1], gen_add_reassoc(g, gen_acc_get(g, p->acc[1]), LLVMBuildFMul(g->b, d, d, "")));
    }
    if (p->p[2] == k) { /* in the value's dtype, with the row's mean and rstd rounded to it */
      LLVMValueRef d = LLVMBuildFSub(g->b, elem_val(R, p->x[0], k), p->st[2], "");
      LLVMValueRef y = LLVMBuildFMul(g->b, LLVMBuildFMul(g->b, d, p->st[1], ""), operand(R, p->x[1], k), "");
      y = LLVMBuildFAdd(g->b, y, operand(R, p->x[2], k), "");
      define(R, p->y, gen_round(g, y, dt), k);
    }
    break;
  case KP_ROW_RMS:
    if (p->p[0] == k) {
      LLVMValueRef x = gen_widen(g, elem_val(R, p->x[0], k));
      gen_acc_set(g, p->acc[0], gen_add_reassoc(g, gen_acc_get(g, p->acc[0]), LLVMBuildFMul(g->b, x, x, "")));
    }
    if (p->p[2] == k) {
      LLVMValueRef y = LLVMBuildFMul(g->b, elem_val(R, p->x[0], k), p->st[1], "");
      y = LLVMBuildFMul(g->b, y, operand(R, p->x[1], k), "");
      define(R, p->y, gen_round(g, y, dt), k);
    }
    break;
  case KP_ROW_ONEHOT:
    if (p->p[0] == k) {
      LLVMValueRef t = row_val(R, p->x[0]);
      int64_t ii = ir_attr_get_int(op, "ignore_index", -100);
      LLVMValueRef hit = LLVMBuildICmp(g->b, LLVMIntEQ, LLVMBuildSExt(g->b, t, g->t_i64, ""), R->j, "");
      LLVMValueRef keep = LLVMBuildICmp(g->b, LLVMIntNE, t, LLVMConstInt(g->t_i32, (unsigned long long)ii, 1), "");
      LLVMValueRef y = LLVMBuildSelect(g->b, LLVMBuildAnd(g->b, hit, keep, ""), LLVMConstReal(ft, 1.0),
                                       LLVMConstReal(ft, 0.0), "");
      define(R, p->y, y, k);
    }
    break;
  case KP_ROW_EMB:
    if (p->p[0] == k) {
      const IrValue *tab = op->args[1];
      int64_t V = tab->type.shape.dim[0], D = tab->type.shape.dim[1];
      GenBuf tb = gen_buf(g, tab);
      LLVMValueRef t64 = LLVMBuildSExt(g->b, row_val(R, p->x[0]), g->t_i64, "");
      LLVMValueRef ok = LLVMBuildAnd(g->b, LLVMBuildICmp(g->b, LLVMIntSGE, t64, gen_i64(g, 0), ""),
                                     LLVMBuildICmp(g->b, LLVMIntSLT, t64, gen_i64(g, V), ""), "");
      LLVMValueRef safe = LLVMBuildSelect(g->b, ok, t64, gen_i64(g, 0), "");
      LLVMValueRef idx = LLVMBuildNSWAdd(g->b, LLVMBuildNSWMul(g->b, safe, gen_i64(g, D), ""), R->j, "");
      LLVMValueRef y = gen_buf_load(g, &tb, idx);
      y = LLVMBuildSelect(g->b, ok, y, LLVMConstReal(ft, 0.0), "");
      define(R, p->y, y, k);
    }
    break;
  case KP_ROW_CMASK:
    if (p->p[0] == k) {
      int n = R->l->space.rank;
      LLVMValueRef i = LLVMBuildURem(g->b, R->r, gen_i64(g, R->l->space.dim[n - 2]), "");
      LLVMValueRef above = LLVMBuildICmp(g->b, LLVMIntSGT, R->j, i, "");
      LLVMValueRef y = LLVMBuildSelect(g->b, above, LLVMConstReal(ft, -INFINITY), elem_val(R, p->x[0], k), "");
      define(R, p->y, y, k);
    }
    break;
  case KP_ROW_UNSLICE:
    if (p->p[0] == k) define(R, p->y, unslice_elem(R, op), k);
    break;
  case KP_ROW_RAND:
    if (p->p[0] == k) define(R, p->y, random_elem(R, p), k);
    break;
  case KP_ROW_NONE: break;
  }
}

/* Outputs written over operands (memplan: an operand that dies in the
 * kernel, laid over the space as the output is) share an alias scope
 * with them.  Row r of the output depends on row r of the operand only,
 * so it is enough that the row's operand elements are read before they
 * are overwritten: every loop loads such an operand first, before its
 * stores (written_over), and an output whose operand a later loop reads
 * again (or a cross_entropy gathers) is kept in row scratch and stored
 * after the row's last loop (defer). */
static bool written_over(Row *R, int i) {
  const RSlot *s = &R->s[i];
  if (s->cs->defined || !s->elem || !s->mem || s->buf.scope < 0) return false;
  for (int k = 0; k < R->ns; k++)
    if (R->s[k].out && R->s[k].buf.scope == s->buf.scope) return true;
  return false;
}

/* The last loop that reads input slot i (INT_MAX if a cross_entropy
 * gathers it, which happens after its loops). */
static int last_read(Row *R, int i) {
  int last = -1, loops[3];
  for (int q = 0; q < R->np; q++) {
    const Plan *p = &R->plan[q];
    for (int a = 0; a < 3; a++) {
      if (p->x[a] != i) continue;
      if (p->kind == KP_ROW_CE) return INT_MAX;
      int n = reads(p, a, loops);
      for (int k = 0; k < n; k++) last = maxi(last, loops[k]);
    }
  }
  return last;
}

/* Whether output slot o must wait for the end of the row: an operand it
 * is written over is read by a loop after the one that computes it. */
static bool must_defer(Row *R, const RSlot *o) {
  if (!o->out || !o->elem || !o->in_loop || o->buf.grad || o->buf.scope < 0) return false;
  for (int i = 0; i < R->ns; i++) {
    const RSlot *s = &R->s[i];
    if (s != o && !s->cs->defined && s->mem && s->buf.scope == o->buf.scope && last_read(R, i) > o->avail) return true;
  }
  return false;
}

/* The causal exp loop's trip count is a multiple of this (one AVX-512
 * vector of f32), and the loop is not interleaved, so that it runs whole
 * vectors only, with no remainder. */
#define CAUSAL_VEC 16

/* One loop hint, key = value. */
static LLVMMetadataRef hint_node(Gen *g, const char *key, int value) {
  LLVMMetadataRef kv[2] = {LLVMMDStringInContext2(g->ctx, key, strlen(key)),
                           LLVMValueAsMetadata(LLVMConstInt(g->t_i32, (unsigned long long)value, 0))};
  return LLVMMDNodeInContext2(g->ctx, kv, 2);
}

/* The vectoriser's hints for the loop whose latch is block latch: its
 * vector width (0: the vectoriser's choice), how many vectors an
 * iteration runs (`interleave`; 0: the vectoriser's choice, 1: one), and
 * whether its vector loop is then unrolled whole (`unroll`; see
 * short_colsums). */
static void loop_hints(Gen *g, LLVMBasicBlockRef latch, int width, int interleave, bool unroll) {
  LLVMValueRef br = LLVMGetBasicBlockTerminator(latch);
  if (!br || (!width && !interleave && !unroll)) return;
  LLVMMetadataRef ops[4];
  int n = 0;
  ops[n++] = LLVMTemporaryMDNode(g->ctx, NULL, 0); /* the loop's own node, itself */
  if (width) ops[n++] = hint_node(g, "llvm.loop.vectorize.width", width);
  if (interleave) ops[n++] = hint_node(g, "llvm.loop.interleave.count", interleave);
  if (unroll) { /* for the vector loop only: the scalar loop unrolled first would not vectorise */
    const char *full = "llvm.loop.unroll.full", *key = "llvm.loop.vectorize.followup_vectorized";
    LLVMMetadataRef u = LLVMMDStringInContext2(g->ctx, full, strlen(full));
    LLVMMetadataRef kv[2] = {LLVMMDStringInContext2(g->ctx, key, strlen(key)), LLVMMDNodeInContext2(g->ctx, &u, 1)};
    ops[n++] = LLVMMDNodeInContext2(g->ctx, kv, 2);
  }
  LLVMMetadataRef loop = LLVMMDNodeInContext2(g->ctx, ops, (size_t)n);
  LLVMMetadataReplaceAllUsesWith(ops[0], loop);
  LLVMSetMetadata(br, LLVMGetMDKindIDInContext(g->ctx, "llvm.loop", 9), LLVMMetadataAsValue(g->ctx, loop));
}

/* Vectors an iteration of an elementwise kernel's loop runs: 2 when no
 * step reduces (over the row or its columns), else 0 (the vectoriser's
 * choice).  The vectoriser ran tinygpt's gelu (its forward and
 * derivative, an exp and a division a vector, 40 instructions) one
 * vector an iteration, whose chain of dependent instructions the core
 * then overlapped with the next one's only in part (docs/DECISIONS.md
 * "Elementwise loops two vectors an iteration"). */
static int elementwise_interleave(const Row *R) {
  for (int q = 0; q < R->np; q++)
    if (!elementwise(R->plan[q].kind) && R->plan[q].kind != KP_ROW_NONE) return 0;
  return 2;
}

/* Rows at least this long skip a causal softmax's masked exponentials.
 * The skip makes the exp loop's trip count change from row to row, and
 * the branch predictor misses its exit: on a Xeon (family 6 model 167)
 * one kernel's [8,4,T,T] forward took 105 / 63 ns a row at T = 32 with
 * and without the skip, 162 / 110 at 64, 231 / 157 at 128, 276 / 263 at
 * 256, and the skip paid from 512 on (454 / 503). */
#define CAUSAL_SKIP_COLS 512

/* A causal softmax's exponentials: when loop k does nothing but the exp
 * pass of a softmax whose operand is causal_mask's result in this kernel,
 * row i's columns past i are -inf, and their exponentials one value per
 * row (0, or NaN where the row's maximum is -inf or NaN): in rows of
 * CAUSAL_SKIP_COLS or more the loop runs over columns [0, i] and the rest
 * of erow is filled.  Returns that plan. */
static Plan *causal_exp_loop(Row *R, int k) {
  if (R->l->cols < CAUSAL_SKIP_COLS) return NULL;
  Plan *sm = NULL;
  for (int q = 0; q < R->np; q++) {
    Plan *p = &R->plan[q];
    bool here = p->p[0] == k || p->p[1] == k || p->p[2] == k;
    if (!here) continue;
    if (sm || p->kind != KP_ROW_SOFTMAX || p->op->opcode != IR_OP_SOFTMAX || p->p[1] != k || p->share >= 0 || !p->erow)
      return NULL;
    sm = p;
  }
  if (!sm || R->l->space.rank < 2 || R->s[sm->x[0]].buf.is_const) return NULL;
  for (int q = 0; q < R->np; q++)
    if (R->plan[q].kind == KP_ROW_CMASK && R->plan[q].y == sm->x[0]) return sm;
  return NULL;
}

/* The slots' buffers and addressing. */
static void setup_slots(Row *R, const KpRowPlan *kp) {
  Gen *g = R->g;
  const KpRowLayout *l = R->l;
  for (int i = 0; i < R->ns; i++) {
    RSlot *s = &R->s[i];
    s->cs = &l->slots[i];
    const IrValue *v = s->cs->v;
    const IrShape *vs = &v->type.shape;
    s->elem = s->cs->mapped && s->cs->eoff == 0 && vs->rank >= 1 && vs->dim[vs->rank - 1] == l->cols;
    s->reg_loop = -2;
    if (s->cs->mapped) kp_slot_strides(l, s->cs, s->stride);
    if (kp->konst[i]) {
      s->buf.v = v;
      s->buf.is_const = true;
      s->buf.cval = kp->cval[i];
    } else if (!s->cs->defined && s->cs->mapped) {
      s->buf = gen_buf(g, v);
      s->mem = !s->buf.is_const; /* else reported: no storage */
    } else if (s->cs->output && v->storage != IR_STORE_NONE) {
      s->mem = s->out = true;
      s->buf = gen_buf(g, v);
    } else {
      s->buf.v = v;
    }
  }
}

/* Accumulators, row buffers of exponentials and scratch rows, in the
 * entry block. */
static void alloc_state(Row *R) {
  Gen *g = R->g;
  for (int k = 0; k < R->np; k++) {
    Plan *p = &R->plan[k];
    IrDType xdt = p->op->args[0]->type.dtype;
    LLVMTypeRef reg = gen_reg_type(g, xdt), wide = gen_acc_type(g, xdt);
    switch (p->kind) {
    case KP_ROW_RED: p->acc[0] = gen_acc(g, p->op->opcode == IR_OP_MAX ? reg : wide); break;
    case KP_ROW_LSE:
    case KP_ROW_SOFTMAX:
    case KP_ROW_CE: /* the maximum, then the sum of exponentials */
      p->acc[0] = gen_acc(g, reg);
      p->acc[1] = gen_acc(g, wide);
      break;
    case KP_ROW_LN:
      p->acc[0] = gen_acc(g, wide);
      p->acc[1] = gen_acc(g, wide);
      break;
    case KP_ROW_RMS: p->acc[0] = gen_acc(g, wide); break;
    case KP_ROW_COLSUM: /* one set of totals, which every lane adds to */
      p->colacc = R->plan == R->lane_plan[0] ? gen_alloca(g, wide, R->l->cols > 0 ? R->l->cols : 1)
                                             : R->lane_plan[0][k].colacc;
      break;
    case KP_ROW_EW:
    case KP_ROW_ONEHOT:
    case KP_ROW_EMB:
    case KP_ROW_CMASK:
    case KP_ROW_UNSLICE:
    case KP_ROW_RAND:
    case KP_ROW_NONE: break;
    }
  }
  for (int q = 0; q < R->np; q++) {
    Plan *p = &R->plan[q];
    if (p->kind != KP_ROW_SOFTMAX || p->op->opcode != IR_OP_SOFTMAX) continue;
    Plan *o = p->share >= 0 ? &R->plan[p->share] : p;
    if (!o->erow) o->erow = gen_alloca(g, gen_reg_type(g, o->op->args[0]->type.dtype), R->l->cols > 0 ? R->l->cols : 1);
  }
  for (int i = 0; i < R->ns; i++) {
    RSlot *s = &R->s[i];
    s->defer = must_defer(R, s);
    if (!s->mat && !s->defer) continue;
    if (s->out && !s->buf.grad && !s->defer) continue; /* its output row serves */
    s->scratch = gen_alloca(g, gen_mem_type(g, s->cs->v->type.dtype), R->l->cols > 0 ? R->l->cols : 1);
  }
}

/* The vector width for loop k when an f32 column sum accumulates in it
 * (else 0): 16 floats, a 512-bit vector.  Its f64 totals would otherwise
 * make the vectoriser halve the loop's width, and every other op of the
 * loop runs at it. */
static int colsum_width(Row *R, int k) {
  for (int q = 0; q < R->np; q++) {
    const Plan *p = &R->plan[q];
    if (p->kind == KP_ROW_COLSUM && p->p[0] == k && p->op->args[0]->type.dtype == IR_DT_F32) return 16;
  }
  return 0;
}

/* Rows at most this long have their column sums' f64 totals kept in
 * registers: see short_colsums. */
#define SHORT_COLSUM_COLS 64

/* Whether this kernel's column loops are unrolled whole once vectorised:
 * when it has a column sum over rows of at most SHORT_COLSUM_COLS.  Its
 * totals (and the row's scratch) are then addressed at constant offsets,
 * so SROA keeps them in registers from row to row, where otherwise each
 * row loaded and stored every total: the three column sums of tinygpt
 * small's norm backwards are 3 x 64 doubles, 24 512-bit loads and 24
 * stores a row of 64 floats (docs/DECISIONS.md "Short rows' column sums
 * in registers").  Longer rows have more totals than registers. */
static bool short_colsums(const Row *R) {
  if (R->l->group <= 1 || R->l->cols <= 0 || R->l->cols > SHORT_COLSUM_COLS) return false;
  for (int q = 0; q < R->np; q++)
    if (R->plan[q].kind == KP_ROW_COLSUM) return true;
  return false;
}

/* The column sums' totals where `when` holds: zeroed (at the first row of
 * a group), or written (after its last row, accumulated into a gradient
 * buffer as any output). */
static void colsums(Row *R, LLVMValueRef when, bool write) {
  Gen *g = R->g;
  for (int q = 0; q < R->np; q++) {
    Plan *p = &R->plan[q];
    RSlot *y = &R->s[p->y];
    if (p->kind != KP_ROW_COLSUM || (write && !y->mem)) continue;
    IrDType dt = p->op->result->type.dtype;
    LLVMTypeRef at = gen_acc_type(g, dt);
    GenLoop cl;
    LLVMValueRef n = LLVMBuildSelect(g->b, when, gen_i64(g, R->l->cols), gen_i64(g, 0), "");
    gen_loop_begin(g, &cl, gen_i64(g, 0), n, write ? "colsum" : "colzero");
    R->j = cl.iv;
    LLVMValueRef a = LLVMBuildInBoundsGEP2(g->b, at, p->colacc, &cl.iv, 1, "");
    if (write)
      gen_store(g, slot_ptr(R, y, y->rowptr, col_index(R, y)), gen_narrow(g, LLVMBuildLoad2(g->b, at, a, ""), dt), dt,
                y->buf.grad, y->buf.scope);
    else
      LLVMBuildStore(g->b, LLVMConstReal(at, 0.0), a);
    LLVMBasicBlockRef latch = LLVMGetInsertBlock(g->b);
    gen_loop_end(g, &cl);
    loop_hints(g, latch, 0, 0, short_colsums(R));
  }
}

/* Slot s's row starts at rowptr; an input with one value a row is
 * loaded there, a per-row register. */
static void bind_row(Row *R, RSlot *s, LLVMValueRef rowptr) {
  s->rowptr = rowptr;
  if (!s->cs->defined && !s->elem && !s->buf.is_const) {
    s->reg = gen_load(R->g, gen_buf_ptr(R->g, &s->buf, rowptr, gen_i64(R->g, 0)), s->cs->v->type.dtype, s->buf.scope);
    s->reg_loop = -1;
  }
}

/* Rows an iteration of the row loop runs (docs/DECISIONS.md "Short rows
 * side by side"), for a kernel of layout l and plan kp of n steps.  Only a kernel that reduces over the row and reads
 * the result in a later loop gains: its rows are chains of dependent
 * instructions (the reduction's halvings, then an exp, a division or a
 * square root) before the next loop can start.  ROW_MAX_LANES when rows
 * are at most LANES_SHORT_COLS long; 2 when they are at most
 * LANES_STATS_COLS long and the kernel normalises them (a norm, a
 * softmax, logsumexp or cross_entropy); else 1.  In groups of rows, only
 * a number that divides the group's size.  A softmax backward over rows
 * of 128 (a sum, then elementwise work) took 2.5 times as long four rows
 * at a time. */
#define LANES_SHORT_COLS 64
#define LANES_STATS_COLS 128
static int lanes_for(const KpRowLayout *l, const KpRowPlan *kp, int n) {
  bool reduces = false, stats = false;
  for (int q = 0; q < n; q++) {
    KpRowKind k = kp->steps[q].kind;
    stats |= row_stats(k) || k == KP_ROW_LN || k == KP_ROW_RMS;
    reduces |= k == KP_ROW_RED;
  }
  int lanes = 1;
  if ((reduces || stats) && l->cols > 0 && l->cols <= LANES_SHORT_COLS)
    lanes = ROW_MAX_LANES;
  else if (stats && l->cols > 0 && l->cols <= LANES_STATS_COLS)
    lanes = 2;
  while (lanes > 1 && l->group > 1 && l->group % lanes) lanes /= 2;
  return lanes;
}

/* Rows a parallel iteration of the kernel covers: its group's, or its
 * lanes' when they divide the rows (then no loop for rows left over is
 * needed), else 1. */
static int64_t unit_for(const KpRowLayout *l, int lanes) {
  if (l->group > 1) return l->group;
  return l->rows % lanes == 0 ? lanes : 1;
}

int64_t gen_row_unit(IrOp **ops, int n, const KpRowLayout *l) {
  Arena a;
  arena_init(&a);
  KpRowPlan kp;
  int64_t unit = l->group > 1 ? l->group : 1;
  if (kp_row_plan(l, ops, n, &a, &kp)) unit = unit_for(l, lanes_for(l, &kp, n));
  arena_free(&a);
  return unit;
}

/* The work of rows R->lane_r[0 .. R->nlanes): sections and loops over the
 * row, each lane's steps after the other's inside every section and loop,
 * so that the rows' chains of dependent instructions (a row's statistics
 * before its outputs) overlap.  in_group is lane 0's row's place in its
 * group of rows. */
static void row_body(Row *R, int K, const bool *loop_used, LLVMValueRef in_group) {
  Gen *g = R->g;
  int U = R->nlanes;
  LLVMValueRef zero = gen_i64(g, 0);
  int64_t G = R->l->group > 1 ? R->l->group : 1;
  lane(R, 0);
  colsums(R, LLVMBuildICmp(g->b, LLVMIntEQ, in_group, zero, ""), false);
  for (int u = 0; u < U; u++) {
    lane(R, u);
    for (int i = 0; i < R->ns; i++) {
      RSlot *s = &R->s[i];
      if (s->mem && !row_invariant(R, s)) bind_row(R, s, gen_buf_ptr(g, &s->buf, s->buf.base, row_offset(R, s)));
    }
  }
  for (int k = 0; k <= K; k++) {
    for (int u = 0; u < U; u++) {
      lane(R, u);
      for (int q = 0; q < R->np; q++) section_step(R, &R->plan[q], k);
    }
    if (k == K || !loop_used[k]) continue;
    lane(R, 0);
    Plan *cs = U == 1 ? causal_exp_loop(R, k) : NULL;
    LLVMValueRef hi = gen_i64(g, R->l->cols);
    if (cs) { /* columns j <= i (up to a whole vector) only: exp(-inf - max) past them */
      int nr = R->l->space.rank;
      LLVMValueRef i = LLVMBuildURem(g->b, R->r, gen_i64(g, R->l->space.dim[nr - 2]), "");
      LLVMValueRef up = LLVMBuildAnd(g->b, LLVMBuildAdd(g->b, i, gen_i64(g, CAUSAL_VEC), ""), gen_i64(g, -CAUSAL_VEC), "");
      hi = LLVMBuildSelect(g->b, LLVMBuildICmp(g->b, LLVMIntSLT, up, hi, ""), up, hi, "");
    }
    GenLoop cl;
    gen_loop_begin(g, &cl, zero, hi, "col");
    R->j = cl.iv;
    for (int u = 0; u < U; u++) { /* before anything is written over them */
      lane(R, u);
      for (int i = 0; i < R->ns; i++)
        if (written_over(R, i)) (void)elem_val(R, i, k);
    }
    for (int u = 0; u < U; u++) {
      lane(R, u);
      for (int q = 0; q < R->np; q++) loop_step(R, &R->plan[q], k);
    }
    LLVMBasicBlockRef latch = LLVMGetInsertBlock(g->b);
    gen_loop_end(g, &cl);
    /* The causal exp loop runs whole vectors only (CAUSAL_VEC), not
     * interleaved.  Not interleaving every loop without a sum or a
     * maximum saved 3% of the compile and cost tinygpt small's softmax
     * and gelu kernels 1-3% (docs/DECISIONS.md "Compile time"). */
    loop_hints(g, latch, colsum_width(R, k), cs ? 1 : elementwise_interleave(R), short_colsums(R));
    if (cs) {
      LLVMTypeRef ft = LLVMTypeOf(cs->st[0]);
      LLVMValueRef tail = gen_exp_nonpos(g, LLVMBuildFSub(g->b, LLVMConstReal(ft, -INFINITY), cs->st[0], ""));
      GenLoop tl;
      gen_loop_begin(g, &tl, hi, gen_i64(g, R->l->cols), "masked");
      LLVMBuildStore(g->b, tail, LLVMBuildInBoundsGEP2(g->b, ft, cs->erow, &tl.iv, 1, ""));
      gen_loop_end(g, &tl);
    }
  }
  for (int u = 0; u < U; u++) { /* deferred outputs, now that the row's operands are read */
    lane(R, u);
    for (int i = 0; i < R->ns; i++) {
      RSlot *s = &R->s[i];
      if (!s->defer) continue;
      GenLoop cl;
      gen_loop_begin(g, &cl, zero, gen_i64(g, R->l->cols), "store");
      R->j = cl.iv;
      IrDType dt = s->cs->v->type.dtype;
      LLVMValueRef v = gen_load(g, mat_ptr(R, s), dt, -1);
      gen_store(g, slot_ptr(R, s, s->rowptr, col_index(R, s)), v, dt, false, s->buf.scope);
      LLVMBasicBlockRef latch = LLVMGetInsertBlock(g->b);
      gen_loop_end(g, &cl);
      loop_hints(g, latch, 0, 0, short_colsums(R));
    }
  }
  lane(R, 0);
  colsums(R, LLVMBuildICmp(g->b, LLVMIntEQ, in_group, gen_i64(g, G - U), ""), true);
}

/* The loop over the rows of the parallel iterations [begin, end) (each
 * unit_for rows), R->nlanes rows an iteration; when the lanes do not
 * divide the unit, the rows left over (fewer than R->nlanes) run one an
 * iteration after it. */
static void emit_rows(Row *R, int K, const bool *loop_used) {
  Gen *g = R->g;
  int U = R->nlanes;
  /* Row-invariant addresses and per-row inputs are set up once. */
  LLVMValueRef zero = gen_i64(g, 0);
  for (int u = 0; u < U; u++) {
    lane(R, u);
    for (int i = 0; i < R->ns; i++) {
      RSlot *s = &R->s[i];
      if (s->mem && row_invariant(R, s)) bind_row(R, s, s->buf.base);
    }
  }
  /* The parallel iterations are groups of rows when a column sum sums
   * over them, else the lanes' rows when they divide the rows (unit_for). */
  int64_t G = R->l->group > 1 ? R->l->group : 1, unit = unit_for(R->l, U);
  /* lane 0's slots as the rows start, for a loop over rows left over */
  RSlot *start = NULL;
  if (unit % U) {
    start = ARENA_ARRAY(R->a, RSlot, R->ns ? R->ns : 1);
    memcpy(start, R->lane_s[0], sizeof *start * (size_t)R->ns);
  }
  LLVMValueRef lo = g->begin, hi = g->end;
  if (unit > 1) lo = LLVMBuildNSWMul(g->b, lo, gen_i64(g, unit), ""), hi = LLVMBuildNSWMul(g->b, hi, gen_i64(g, unit), "");
  LLVMValueRef n = LLVMBuildSDiv(g->b, LLVMBuildNSWSub(g->b, hi, lo, ""), gen_i64(g, U), "");
  GenLoop rows;
  gen_loop_begin(g, &rows, zero, n, "row");
  R->lane_r[0] = LLVMBuildNSWAdd(g->b, lo, U > 1 ? LLVMBuildNSWMul(g->b, rows.iv, gen_i64(g, U), "") : rows.iv, "");
  for (int u = 1; u < U; u++) R->lane_r[u] = LLVMBuildNSWAdd(g->b, R->lane_r[0], gen_i64(g, u), "");
  row_body(R, K, loop_used, G > 1 ? LLVMBuildURem(g->b, R->lane_r[0], gen_i64(g, G), "") : zero);
  gen_loop_end(g, &rows);
  if (unit % U == 0) return;

  memcpy(R->lane_s[0], start, sizeof *start * (size_t)R->ns);
  R->nlanes = 1;
  GenLoop rest;
  gen_loop_begin(g, &rest, LLVMBuildNSWAdd(g->b, lo, LLVMBuildNSWMul(g->b, n, gen_i64(g, U), ""), ""), hi, "rest");
  R->lane_r[0] = rest.iv;
  row_body(R, K, loop_used, zero);
  gen_loop_end(g, &rest);
  R->nlanes = U;
}

void gen_row_kernel(Gen *g, IrOp **ops, int n, const KpRowLayout *l) {
  Row R;
  memset(&R, 0, sizeof R);
  R.g = g;
  R.l = l;
  R.ns = l->nslots;
  Arena a;
  arena_init(&a);
  KpRowPlan kp;
  if (!kp_row_plan(l, ops, n, &a, &kp)) {
    gen_error(g, "kernel k%d: an op does not fit a row kernel", g->group);
    LLVMBuildRetVoid(g->b);
    arena_free(&a);
    return;
  }
  R.s = ARENA_ARRAY(&a, RSlot, R.ns ? R.ns : 1);
  R.plan = ARENA_ARRAY(&a, Plan, n ? n : 1);
  setup_slots(&R, &kp);

  /* Plan every op; K loops, sections 0..K. */
  int K = 0;
  for (int k = 0; k < n; k++) {
    plan_op(&R, &R.plan[k], &kp.steps[k]);
    for (int i = 0; i < 3; i++) K = maxi(K, R.plan[k].p[i] + 1);
    for (int i = 0; i < 2; i++) K = maxi(K, R.plan[k].fin[i]);
  }
  R.np = n;
  finish_plans(&R);
  bool *loop_used = ARENA_ARRAY(&a, bool, K + 1);
  for (int k = 0; k < n; k++)
    for (int i = 0; i < 3; i++)
      if (R.plan[k].p[i] >= 0) loop_used[R.plan[k].p[i]] = true;

  R.a = &a;
  R.nlanes = lanes_for(l, &kp, n);
  for (int u = 0; u < R.nlanes; u++) { /* each lane its own copy of the plans, then its own state */
    R.lane_s[u] = u ? ARENA_ARRAY(&a, RSlot, R.ns ? R.ns : 1) : R.s;
    R.lane_plan[u] = u ? ARENA_ARRAY(&a, Plan, n ? n : 1) : R.plan;
    if (u) memcpy(R.lane_s[u], R.s, sizeof *R.s * (size_t)R.ns), memcpy(R.lane_plan[u], R.plan, sizeof *R.plan * (size_t)n);
  }
  for (int u = 0; u < R.nlanes; u++) {
    lane(&R, u);
    alloc_state(&R);
  }
  emit_rows(&R, K, loop_used);
  LLVMBuildRetVoid(g->b);
  arena_free(&a);
}
