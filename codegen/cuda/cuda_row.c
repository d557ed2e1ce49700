/* cuda_row.c - row kernels (docs/BACKEND.md) in CUDA C.
 *
 * A row kernel's ops lie over an iteration space of rows x cols
 * (kp_row_layout).  Values are "per element" (they vary along the row) or
 * "per row" (one value per row).  Ops that reduce a row (sum, mean, max,
 * logsumexp, softmax, log_softmax, layer_norm, rms_norm, cross_entropy)
 * need row statistics: a sum or a maximum over the row, accumulated in a
 * loop over the row's columns and combined across threads.
 *
 * A kernel with statistics runs one block per row (a warp per row when
 * rows are at most 32 long, 8 rows a block): the block's threads stride
 * over the columns (consecutive threads, consecutive addresses), and
 *
 *   section 0, loop 0, section 1, loop 1, ..., section K
 *
 * (the schedule of kp_row_plan, passes/kernel_row.c) where loop k accumulates the statistics whose operands are available
 * after section k, section k+1 combines them across the block (warp
 * shuffles, then one value per warp through shared memory: a fixed order,
 * so results do not vary between runs) and computes the per-row values
 * that need them.  The last loop also writes every per-element output;
 * per-row outputs are written by one thread in their section.  A
 * per-element value is not kept between loops: it is computed again from
 * the kernel's inputs and per-row values wherever a loop needs it (inputs
 * are re-read from cache), so no row scratch is needed however long the
 * row.  Sums accumulate in f32 for f32, bf16 and f16 (in f64 for f64),
 * statistics are f32; the per-element math is rounded to the value's
 * dtype after every op, as the reference interpreter does.
 *
 * A kernel without statistics is elementwise: a grid-stride loop with one
 * thread per element; per-row values are computed where they are used,
 * and per-row outputs are written by the thread of column 0. */
#include <math.h>
#include <string.h>

#include "cuda_gen.h"

typedef struct RVal {
  const KpSlot *cs;
  const IrValue *v;
  bool elem;            /* one value per element */
  bool is_const;        /* an inline group-0 const */
  double cval;
  const char *ptr;      /* its pointer argument, or NULL */
  bool grad;            /* written into a gradient buffer */
  bool out;             /* an output with storage */
  int64_t stride[IR_MAX_RANK];
  const char *rowoff;   /* offset of the row's first element ("0": the same for every row) */
  bool dense;           /* laid over the whole space contiguously (offset = the element index) */
  int def;              /* defining op (index in the kernel), or -1 */
  int ready;            /* the section after which it is available */
  const char *rowvar;   /* a per-row value's variable, once computed */
  int scope;            /* a per-element value: the scope where evar holds it */
  const char *evar;
  bool use_rowptr;      /* block mode: the row pointer is used */
  bool use_rowval;      /* a per-row input: its load is used */
  bool need;            /* an output with storage, or read by an op that is needed */
} RVal;

typedef enum { S_SUM, S_MAX, S_SUMEXP, S_DEV2, S_SUMSQ } StatKind;

typedef struct Stat {
  StatKind kind;
  int x;              /* the operand's slot */
  int dep;            /* S_SUMEXP: the max (a stat); S_DEV2: the sum (a stat); -1 */
  const char *center; /* S_DEV2: the mean's variable */
  int loop;
  IrDType dt;         /* the operand's dtype */
  const char *acc, *res;
} Stat;

typedef struct ROp {
  const IrOp *op;
  KpRowKind kind;
  int y;     /* result slot */
  int x[3];  /* operand slots, -1 when not a slot */
  int st[2]; /* its statistics, -1 */
  const char *t[2]; /* per-row temporaries it defines (mean and rstd, 1/sum, ...) */
  int tsec[2];      /* their sections */
} ROp;

typedef struct Row {
  CuGen *g;
  const KpRowLayout *l;
  KpRowPlan kp;
  RVal *s;
  int ns;
  ROp *o;
  int no;
  Stat *st;
  int nst;
  int nloops;       /* loops 0..nloops-1 */
  int final;        /* the loop writing per-element outputs, -1 */
  bool grid;        /* no statistics: a grid-stride elementwise kernel */
  bool warp;        /* a warp per row */
  int scope;        /* current scope id for per-element values */
  const char *col;  /* the column in the current scope */
  bool use_row, use_j;
  bool red_f, red_d, red_i; /* shared scratch used by block reductions */
} Row;

static int slot_of(Row *R, const IrValue *v) {
  for (int i = 0; i < R->ns; i++)
    if (R->s[i].v == v) return i;
  return -1;
}

/* ------------------------------------------------------------------ */
/* Statistics                                                          */
/* ------------------------------------------------------------------ */

static int stat(Row *R, StatKind kind, int x, int dep, int loop) {
  for (int i = 0; i < R->nst; i++)
    if (R->st[i].kind == kind && R->st[i].x == x && R->st[i].dep == dep) return i;
  int i = R->nst++;
  Stat *s = &R->st[i];
  memset(s, 0, sizeof *s);
  s->kind = kind;
  s->x = x;
  s->dep = dep;
  s->loop = loop;
  s->dt = R->s[x].v->type.dtype;
  s->acc = cu_fmt(R->g, "acc%d", i);
  s->res = cu_fmt(R->g, "%s%d", kind == S_MAX ? "max" : "sum", i);
  if (loop + 1 > R->nloops) R->nloops = loop + 1;
  return i;
}

static const char *stat_type(const Stat *s) { return s->kind == S_MAX ? cu_reg_type(s->dt) : cu_acc_type(s->dt); }

/* Op k as the kernel plan schedules it: the statistics it needs, in the
 * loops of its passes, and its per-row temporaries, in its sections. */
static void plan(Row *R, int k) {
  ROp *o = &R->o[k];
  const KpRowStep *p = &R->kp.steps[k];
  const IrOp *op = p->op;
  CuGen *g = R->g;
  o->op = op;
  o->kind = p->kind;
  o->y = p->y;
  memcpy(o->x, p->x, sizeof o->x);
  o->st[0] = o->st[1] = -1;
  o->tsec[0] = o->tsec[1] = -1;
  RVal *y = &R->s[o->y];
  y->def = k;
  if (!y->need) return; /* computes nothing anyone reads (a window.sum operand, say) */
  y->ready = p->at;
  int x = o->x[0];
  switch (p->kind) {
  case KP_ROW_RED: o->st[0] = stat(R, op->opcode == IR_OP_MAX ? S_MAX : S_SUM, x, -1, p->pass[0]); break;
  case KP_ROW_LSE:
  case KP_ROW_SOFTMAX:
  case KP_ROW_CE:
    o->st[0] = stat(R, S_MAX, x, -1, p->pass[0]);
    o->st[1] = stat(R, S_SUMEXP, x, o->st[0], p->pass[1]);
    if (op->opcode == IR_OP_LOG_SOFTMAX) {
      o->t[0] = cu_fmt(g, "logz%d", k);
      o->tsec[0] = p->fin[1];
    }
    break;
  case KP_ROW_LN:
    o->st[0] = stat(R, S_SUM, x, -1, p->pass[0]);
    o->t[0] = cu_fmt(g, "mean%d", k);
    o->tsec[0] = p->fin[0];
    o->st[1] = stat(R, S_DEV2, x, o->st[0], p->pass[1]);
    if (!R->st[o->st[1]].center) R->st[o->st[1]].center = o->t[0];
    o->t[1] = cu_fmt(g, "rstd%d", k);
    o->tsec[1] = p->fin[1];
    break;
  case KP_ROW_RMS:
    o->st[0] = stat(R, S_SUMSQ, x, -1, p->pass[0]);
    o->t[1] = cu_fmt(g, "rstd%d", k);
    o->tsec[1] = p->fin[0];
    break;
  case KP_ROW_EW:
  case KP_ROW_ONEHOT:
  case KP_ROW_EMB:
  case KP_ROW_CMASK:
  case KP_ROW_UNSLICE:
  case KP_ROW_RAND: break;
  case KP_ROW_COLSUM: /* the CUDA back end compiles with PassOptions.no_colsums */
  case KP_ROW_NONE: cu_error(g, "'%s' does not fit a row kernel", ir_op_info[op->opcode].name); break;
  }
}

/* ------------------------------------------------------------------ */
/* Values                                                              */
/* ------------------------------------------------------------------ */

static const char *rowval(Row *R, int i);
static const char *elem(Row *R, int i);

/* Element `col` of a mapped slot in memory, as an lvalue. */
static const char *elem_lvalue(Row *R, RVal *s, const char *col) {
  CuGen *g = R->g;
  if (R->grid) {
    if (strcmp(col, "j") == 0 && s->dense) return cu_fmt(g, "%s[i]", s->ptr);
    R->use_j |= strcmp(col, "j") == 0;
    if (strcmp(s->rowoff, "0") == 0) return cu_fmt(g, "%s[%s]", s->ptr, col);
    R->use_row = true;
    return cu_fmt(g, "%s[%s + %s]", s->ptr, s->rowoff, col);
  }
  if (strcmp(s->rowoff, "0") == 0) return cu_fmt(g, "%s[%s]", s->ptr, col);
  s->use_rowptr = true;
  R->use_row = true;
  return cu_fmt(g, "%s_row[%s]", s->ptr, col);
}

/* The one element of a per-row slot, as an lvalue. */
static const char *row_lvalue(Row *R, RVal *s) {
  if (strcmp(s->rowoff, "0") != 0) R->use_row = true;
  return cu_fmt(R->g, "%s[%s]", s->ptr, s->rowoff);
}

static const char *rowval(Row *R, int i) {
  RVal *s = &R->s[i];
  IrDType dt = s->v->type.dtype;
  if (s->is_const) return cu_lit(R->g, dt, s->cval);
  if (s->def < 0) {
    s->use_rowval = true;
    if (strcmp(s->rowoff, "0") != 0) R->use_row = true;
    return cu_fmt(R->g, "p%d", i);
  }
  if (!s->rowvar) {
    cu_error(R->g, "row kernel: a per-row value is used before it is computed");
    return "0";
  }
  return s->rowvar;
}

/* Define a per-element temporary in the current scope. */
static const char *temp(Row *R, RVal *s, int i, const char *type, const char *expr) {
  s->evar = cu_fmt(R->g, "e%d", i);
  s->scope = R->scope;
  cu_line(R->g, "const %s %s = %s;", type, s->evar, expr);
  return s->evar;
}

/* The coordinate of axis a (< rank - 1) of the space for the current row. */
static const char *row_coord(Row *R, int a) {
  const IrShape *sp = &R->l->space;
  int64_t inner = 1;
  for (int k = a + 1; k + 1 < sp->rank; k++) inner *= sp->dim[k];
  R->use_row = true;
  CuGen *g = R->g;
  const char *q = inner == 1 ? "row" : cu_fmt(g, "(row / %lld)", (long long)inner);
  return a == 0 ? q : cu_fmt(g, "(%s %% %lld)", q, (long long)sp->dim[a]);
}

/* Element (row, col) of unslice: the operand's element where the slice
 * puts it, else 0 (the result covers the space: kp_row_layout). */
static const char *unslice_elem(Row *R, const ROp *o, int i) {
  CuGen *g = R->g;
  const IrOp *op = o->op;
  const IrShape *out = &op->result->type.shape, *xs = &op->args[0]->type.shape;
  int k = out->rank;
  int64_t start[IR_MAX_RANK], step[IR_MAX_RANK], xst[IR_MAX_RANK];
  kp_slice_ranges(op, out, start, step);
  kp_contiguous(xs, xst);
  int xs_slot = slot_of(R, op->args[0]);
  bool konst = xs_slot >= 0 && R->s[xs_slot].is_const; /* an inline const (pad's value): no storage */
  const char *x = konst ? NULL : cu_param(g, op->args[0], 0, false);
  IrDType dt = op->result->type.dtype;
  StrBuf cond, off;
  sb_init(&cond);
  sb_init(&off);
  cu_line(g, "%s e%d = %s;", cu_reg_type(dt), i, cu_lit(g, dt, 0));
  cu_line(g, "{ // unslice: inside the slice?");
  g->indent++;
  for (int a = 0; a < k; a++) {
    const char *c = a == k - 1 ? R->col : row_coord(R, a);
    if (a == k - 1) R->use_j |= strcmp(c, "j") == 0;
    cu_line(g, "const long d%d = %s - %lld;", a, c, (long long)start[a]);
    if (cond.len) sb_puts(&cond, " && ");
    if (step[a] == 1) {
      sb_printf(&cond, "d%d >= 0 && d%d < %lld", a, a, (long long)xs->dim[a]);
      if (off.len) sb_puts(&off, " + ");
      sb_printf(&off, "d%d * %lld", a, (long long)xst[a]);
    } else {
      sb_printf(&cond, "d%d >= 0 && d%d %% %lld == 0 && d%d / %lld < %lld", a, a, (long long)step[a], a,
                (long long)step[a], (long long)xs->dim[a]);
      if (off.len) sb_puts(&off, " + ");
      sb_printf(&off, "d%d / %lld * %lld", a, (long long)step[a], (long long)xst[a]);
    }
  }
  const char *v = konst ? cu_lit(g, dt, R->s[xs_slot].cval)
                        : cu_load(g, dt, false, cu_fmt(g, "%s[%s]", x, off.len ? sb_str(&off) : "0"));
  cu_line(g, "if (%s) e%d = %s;", cond.len ? sb_str(&cond) : "true", i, v);
  g->indent--;
  cu_line(g, "}");
  sb_free(&cond);
  sb_free(&off);
  R->s[i].evar = cu_fmt(g, "e%d", i);
  R->s[i].scope = R->scope;
  return R->s[i].evar;
}

/* A per-element value at column R->col in the current scope: emitted on
 * first use in the scope (with what it needs), then reused. */
static const char *elem(Row *R, int i) {
  RVal *s = &R->s[i];
  CuGen *g = R->g;
  IrDType dt = s->v->type.dtype;
  const char *type = cu_reg_type(dt);
  if (s->is_const) return cu_lit(g, dt, s->cval);
  if (!s->elem) return rowval(R, i);
  if (s->evar && s->scope == R->scope) return s->evar;
  if (s->def < 0) return temp(R, s, i, type, cu_load(g, dt, false, elem_lvalue(R, s, R->col)));
  const ROp *o = &R->o[s->def];
  const IrOp *op = o->op;
  const char *x0 = o->x[0] >= 0 ? elem(R, o->x[0]) : NULL;
  switch (o->kind) {
  case KP_ROW_SOFTMAX: {
    const Stat *m = &R->st[o->st[0]], *z = &R->st[o->st[1]];
    if (op->opcode == IR_OP_LOG_SOFTMAX)
      return temp(R, s, i, type, cu_round(g, dt, cu_fmt(g, "(%s - %s) - %s", x0, m->res, o->t[0])));
    /* exp(x - max) / sum, rounded once */
    const char *e = cu_math1(g, "exp", dt, cu_fmt(g, "%s - %s", x0, m->res));
    return temp(R, s, i, type, cu_round(g, dt, cu_fmt(g, "%s / %s", e, z->res)));
  }
  case KP_ROW_LN: {
    const char *w = elem(R, o->x[1]), *b = elem(R, o->x[2]);
    return temp(R, s, i, type, cu_round(g, dt, cu_fmt(g, "(%s - %s) * %s * %s + %s", x0, o->t[0], o->t[1], w, b)));
  }
  case KP_ROW_RMS: {
    const char *w = elem(R, o->x[1]);
    return temp(R, s, i, type, cu_round(g, dt, cu_fmt(g, "%s * %s * %s", x0, o->t[1], w)));
  }
  case KP_ROW_RAND: {
    /* the element's index in the op's own result: its offset over the space */
    int n = R->l->space.rank;
    int64_t cst = n ? s->stride[n - 1] : 0;
    const char *e = cu_fmt(g, "(long long)(%s)", s->rowoff);
    if (strcmp(s->rowoff, "0") != 0) R->use_row = true;
    if (cst != 0) {
      R->use_j |= strcmp(R->col, "j") == 0;
      e = cu_fmt(g, "%s + (long long)%s * %lld", e, R->col, (long long)cst);
    }
    return temp(R, s, i, type, cu_random(g, op, cu_param(g, op->args[0], 0, false), e));
  }
  case KP_ROW_CMASK: {
    int n = R->l->space.rank;
    const char *r = cu_fmt(g, "row %% %lld", (long long)R->l->space.dim[n - 2]);
    R->use_row = true;
    R->use_j |= strcmp(R->col, "j") == 0;
    return temp(R, s, i, type, cu_fmt(g, "%s > %s ? %s : %s", R->col, r, cu_lit(g, dt, -INFINITY), x0));
  }
  case KP_ROW_ONEHOT: {
    int64_t ii = ir_attr_get_int(op, "ignore_index", -100);
    R->use_j |= strcmp(R->col, "j") == 0;
    return temp(R, s, i, type,
                cu_fmt(g, "%s == %s && %s != %lld ? %s : %s", x0, R->col, x0, (long long)ii, cu_lit(g, dt, 1),
                       cu_lit(g, dt, 0)));
  }
  case KP_ROW_EMB: {
    const IrValue *tab = op->args[1];
    int64_t V = tab->type.shape.dim[0], D = tab->type.shape.dim[1];
    const char *t = cu_param(g, tab, 0, false);
    R->use_j |= strcmp(R->col, "j") == 0;
    const char *lv = cu_fmt(g, "%s[(long)%s * %lld + %s]", t, x0, (long long)D, R->col);
    return temp(R, s, i, type,
                cu_fmt(g, "%s >= 0 && %s < %lld ? %s : %s", x0, x0, (long long)V, cu_load(g, dt, false, lv),
                       cu_lit(g, dt, 0)));
  }
  case KP_ROW_UNSLICE: return unslice_elem(R, o, i);
  case KP_ROW_EW: {
    const char *a[3] = {x0, NULL, NULL};
    for (int k = 1; k < op->nargs && k < 3; k++) a[k] = elem(R, o->x[k]);
    const char *e = cu_elementwise(g, op, a);
    if (e == x0) { /* broadcast, detach: the operand itself */
      s->evar = x0;
      s->scope = R->scope;
      return x0;
    }
    return temp(R, s, i, type, e);
  }
  case KP_ROW_RED:
  case KP_ROW_COLSUM:
  case KP_ROW_LSE:
  case KP_ROW_CE:
  case KP_ROW_NONE: break;
  }
  cu_error(g, "row kernel: '%s' has no per-element value", ir_op_info[op->opcode].name);
  return "0";
}

/* Start a new scope for per-element values, at column col. */
static void open_scope(Row *R, const char *col) {
  R->scope++;
  R->col = col;
}

/* ------------------------------------------------------------------ */
/* Sections: per-row work                                              */
/* ------------------------------------------------------------------ */

/* Write a per-row output by one thread. */
static void write_row_output(Row *R, RVal *s) {
  CuGen *g = R->g;
  const char *lv = row_lvalue(R, s);
  if (R->grid) {
    if (R->l->cols > 1) {
      R->use_j = true;
      cu_line(g, "if (j == 0) {");
    } else {
      cu_line(g, "{");
    }
  } else {
    cu_line(g, "if (tid == 0) {");
  }
  g->indent++;
  cu_store(g, s->v->type.dtype, s->grad, lv, s->rowvar);
  g->indent--;
  cu_line(g, "}");
}

static void define_row(Row *R, int i, const char *expr) {
  RVal *s = &R->s[i];
  s->rowvar = cu_fmt(R->g, "r%d", i);
  cu_line(R->g, "const %s %s = %s;", cu_reg_type(s->v->type.dtype), s->rowvar, expr);
  if (s->out) write_row_output(R, s);
}

/* The row loss of cross_entropy (reduction "none"): logsumexp - the
 * target's logit; 0 for the ignore_index; NaN for a target out of range
 * (the count phase rejects those before any micro-batch runs). */
static void cross_entropy_row(Row *R, int k) {
  CuGen *g = R->g;
  const ROp *o = &R->o[k];
  const IrOp *op = o->op;
  IrDType dt = op->result->type.dtype, xt = op->args[0]->type.dtype;
  const Stat *m = &R->st[o->st[0]], *z = &R->st[o->st[1]];
  RVal *y = &R->s[o->y];
  int64_t V = R->l->cols, ii = ir_attr_get_int(op, "ignore_index", -100);
  y->rowvar = cu_fmt(g, "r%d", o->y);
  const char *ft = cu_reg_type(xt);
  cu_line(g, "%s %s; // cross_entropy: logsumexp - the target's logit", cu_reg_type(dt), y->rowvar);
  cu_line(g, "{");
  g->indent++;
  const char *t = cu_fmt(g, "tgt%d", k);
  cu_line(g, "const int %s = %s;", t, rowval(R, o->x[1]));
  cu_line(g, "if (%s == %lld) {", t, (long long)ii);
  cu_line(g, "  %s = %s;", y->rowvar, cu_lit(g, dt, 0));
  cu_line(g, "} else if (%s < 0 || %s >= %lld) {", t, t, (long long)V);
  cu_line(g, "  %s = %s;", y->rowvar, cu_lit(g, dt, NAN));
  cu_line(g, "} else {");
  g->indent++;
  const char *saved = R->col;
  open_scope(R, t);
  const char *xt_val = elem(R, o->x[0]);
  const char *lse = cu_fmt(g, "%s(%s) < %s ? %s + %s : %s", xt == IR_DT_F64 ? "fabs" : "fabsf", m->res,
                           xt == IR_DT_F64 ? "GRADC_INF_D" : "GRADC_INF", m->res, cu_math1(g, "log", xt, z->res), m->res);
  cu_line(g, "const %s lse = %s;", ft, lse);
  cu_line(g, "%s = %s;", y->rowvar, cu_round(g, dt, cu_fmt(g, "lse - %s", xt_val)));
  open_scope(R, saved);
  g->indent--;
  cu_line(g, "}");
  g->indent--;
  cu_line(g, "}");
  if (y->out) write_row_output(R, y);
}

/* Finish the statistics of loop k - 1 at the start of section k. */
static void finish_stats(Row *R, int k) {
  CuGen *g = R->g;
  for (int i = 0; i < R->nst; i++) {
    Stat *s = &R->st[i];
    if (s->loop != k - 1) continue;
    const char *t = stat_type(s);
    const char *red = strcmp(t, "float") == 0 ? "red_f" : strcmp(t, "double") == 0 ? "red_d" : "red_i";
    if (R->warp)
      cu_line(g, "const %s %s = warp_%s(%s);", t, s->res, s->kind == S_MAX ? "max" : "sum", s->acc);
    else if (s->kind == S_MAX)
      cu_line(g, "const %s %s = block_max(%s, %s, %s);", t, s->res, s->acc, red, cu_lowest(g, s->dt));
    else
      cu_line(g, "const %s %s = block_sum(%s, %s);", t, s->res, s->acc, red);
    if (!R->warp) {
      if (strcmp(red, "red_f") == 0) R->red_f = true;
      else if (strcmp(red, "red_d") == 0) R->red_d = true;
      else R->red_i = true;
    }
  }
}

static void section(Row *R, int k) {
  CuGen *g = R->g;
  if (!R->grid) finish_stats(R, k);
  double cols = (double)R->l->cols;
  for (int q = 0; q < R->no; q++) {
    ROp *o = &R->o[q];
    const IrOp *op = o->op;
    RVal *y = &R->s[o->y];
    IrDType dt = op->result->type.dtype, xt = op->nargs ? op->args[0]->type.dtype : dt;
    const char *ft = xt == IR_DT_F64 ? "double" : "float";
    bool d = xt == IR_DT_F64;
    if (!y->need) continue;
    /* per-row temporaries */
    if (o->tsec[0] == k) {
      const Stat *s0 = &R->st[o->st[0]];
      if (op->opcode == IR_OP_LAYER_NORM)
        cu_line(g, "const %s %s = %s / %s;", ft, o->t[0], s0->res, cu_lit(g, d ? IR_DT_F64 : IR_DT_F32, cols));
      else if (op->opcode == IR_OP_LOG_SOFTMAX)
        cu_line(g, "const %s %s = %s;", ft, o->t[0], cu_round(g, xt, cu_math1(g, "log", xt, R->st[o->st[1]].res)));
    }
    if (o->tsec[1] == k) {
      double eps = ir_op_eps(op);
      const Stat *s = &R->st[o->st[op->opcode == IR_OP_LAYER_NORM ? 1 : 0]];
      IrDType st = d ? IR_DT_F64 : IR_DT_F32;
      cu_line(g, "const %s %s = %s / %s(%s / %s + %s);", ft, o->t[1], d ? "1.0" : "1.0f", d ? "sqrt" : "sqrtf",
              s->res, cu_lit(g, st, cols), cu_lit(g, st, eps));
    }
    if (y->elem || y->ready != k) continue;
    /* the per-row result */
    switch (o->kind) {
    case KP_ROW_RED: {
      const char *r = R->st[o->st[0]].res;
      if (op->opcode == IR_OP_MEAN) r = cu_fmt(g, "%s / %s", r, cu_lit(g, d ? IR_DT_F64 : IR_DT_F32, cols));
      define_row(R, o->y, dt == IR_DT_I32 || dt == xt ? cu_round(g, dt, r) : cu_convert(g, r, d ? IR_DT_F64 : IR_DT_F32, dt));
      break;
    }
    case KP_ROW_LSE: {
      const char *m = R->st[o->st[0]].res, *z = R->st[o->st[1]].res;
      define_row(R, o->y,
                 cu_round(g, dt,
                          cu_fmt(g, "%s(%s) < %s ? %s + %s : %s", d ? "fabs" : "fabsf", m, d ? "GRADC_INF_D" : "GRADC_INF",
                                 m, cu_math1(g, "log", xt, z), m)));
      break;
    }
    case KP_ROW_CE: cross_entropy_row(R, q); break;
    case KP_ROW_EW: {
      const char *a[3] = {NULL, NULL, NULL};
      for (int i = 0; i < op->nargs && i < 3; i++) a[i] = rowval(R, o->x[i]);
      define_row(R, o->y, cu_elementwise(g, op, a));
      break;
    }
    case KP_ROW_SOFTMAX:
    case KP_ROW_LN:
    case KP_ROW_RMS:
    case KP_ROW_CMASK:
    case KP_ROW_ONEHOT:
    case KP_ROW_EMB:
    case KP_ROW_UNSLICE:
    case KP_ROW_RAND: {
      /* a row of one column: the per-element value at column 0, in a block of its own */
      const char *saved = R->col;
      y->rowvar = cu_fmt(g, "r%d", o->y);
      cu_line(g, "%s %s;", cu_reg_type(dt), y->rowvar);
      cu_line(g, "{");
      g->indent++;
      open_scope(R, "0");
      y->elem = true;
      cu_line(g, "%s = %s;", y->rowvar, elem(R, o->y));
      y->elem = false;
      open_scope(R, saved);
      g->indent--;
      cu_line(g, "}");
      if (y->out) write_row_output(R, y);
      break;
    }
    case KP_ROW_COLSUM:
    case KP_ROW_NONE: cu_error(g, "'%s' in a row kernel", ir_op_info[op->opcode].name); break;
    }
  }
}

/* ------------------------------------------------------------------ */
/* Loops: per-element work                                             */
/* ------------------------------------------------------------------ */

static void accumulate(Row *R, const Stat *s) {
  CuGen *g = R->g;
  const char *x = elem(R, s->x);
  switch (s->kind) {
  case S_SUM: cu_line(g, "%s += %s;", s->acc, x); break;
  case S_MAX: cu_line(g, "%s = maximum(%s, %s);", s->acc, s->acc, x); break;
  case S_SUMEXP:
    cu_line(g, "%s += %s;", s->acc, cu_math1(g, "exp", s->dt, cu_fmt(g, "%s - %s", x, R->st[s->dep].res)));
    break;
  case S_DEV2: cu_line(g, "%s += sq(%s - %s);", s->acc, x, s->center); break;
  case S_SUMSQ: cu_line(g, "%s += sq(%s);", s->acc, x); break;
  }
}

static void write_outputs(Row *R) {
  CuGen *g = R->g;
  for (int i = 0; i < R->ns; i++) {
    RVal *s = &R->s[i];
    if (!s->out || !s->elem) continue;
    const char *v = elem(R, i);
    cu_store(g, s->v->type.dtype, s->grad, elem_lvalue(R, s, R->col), v);
  }
}

static void loop(Row *R, int k) {
  CuGen *g = R->g;
  StrBuf c; /* what this pass over the row is for */
  sb_init(&c);
  for (int i = 0; i < R->nst; i++) {
    const Stat *st = &R->st[i];
    if (st->loop != k) continue;
    sb_printf(&c, "%s%s = ", c.len ? ", " : "", st->acc);
    switch (st->kind) {
    case S_SUM: sb_puts(&c, "the sum"); break;
    case S_MAX: sb_puts(&c, "the maximum"); break;
    case S_SUMEXP: sb_printf(&c, "the sum of exp(x - %s)", R->st[st->dep].res); break;
    case S_DEV2: sb_printf(&c, "the sum of (x - %s)^2", st->center); break;
    case S_SUMSQ: sb_puts(&c, "the sum of squares"); break;
    }
  }
  if (k == R->final) sb_printf(&c, "%sthe outputs", c.len ? "; " : "");
  if (c.len) cu_line(g, "// pass %d over the row: %s", k + 1, sb_str(&c));
  bool any = c.len > 0;
  sb_free(&c);
  if (!any) return;
  for (int i = 0; i < R->nst; i++) {
    Stat *s = &R->st[i];
    if (s->loop != k) continue;
    const char *t = stat_type(s);
    const char *init = s->kind == S_MAX ? cu_lowest(g, s->dt) : strcmp(t, "int") == 0 ? "0" : strcmp(t, "double") == 0 ? "0.0" : "0.0f";
    cu_line(g, "%s %s = %s;", t, s->acc, init);
  }
  cu_line(g, "for (int j = tid; j < %lld; j += %d) {", (long long)R->l->cols, R->warp ? 32 : (int)g->block[0]);
  g->indent++;
  open_scope(R, "j");
  for (int i = 0; i < R->nst; i++)
    if (R->st[i].loop == k) accumulate(R, &R->st[i]);
  if (k == R->final) write_outputs(R);
  g->indent--;
  cu_line(g, "}");
}

/* ------------------------------------------------------------------ */
/* The kernel                                                          */
/* ------------------------------------------------------------------ */

static void setup(Row *R, IrOp **ops, int n) {
  const KpRowLayout *l = R->l;
  CuGen *g = R->g;
  R->ns = l->nslots;
  R->s = ARENA_ARRAY(g->a, RVal, R->ns ? R->ns : 1);
  R->no = n;
  R->o = ARENA_ARRAY(g->a, ROp, n ? n : 1);
  R->st = ARENA_ARRAY(g->a, Stat, 2 * n + 1);
  R->final = -1;
  int nrow = l->space.rank > 0 ? l->space.rank - 1 : 0;
  int64_t sp_st[IR_MAX_RANK];
  kp_contiguous(&l->space, sp_st);
  for (int i = 0; i < R->ns; i++) {
    RVal *s = &R->s[i];
    s->cs = &l->slots[i];
    s->v = s->cs->v;
    s->def = -1;
    s->scope = -1;
    s->elem = s->cs->varies;
    s->rowoff = "0";
    if (s->cs->mapped) {
      kp_slot_strides(l, s->cs, s->stride);
      s->rowoff = cu_index(g, "row", l->space.dim, s->stride, nrow);
      s->dense = ir_numel(&s->v->type.shape) == l->rows * l->cols;
      for (int a = 0; a < l->space.rank; a++)
        if (l->space.dim[a] != 1 && s->stride[a] != sp_st[a]) s->dense = false;
    }
    s->is_const = R->kp.konst[i];
    s->cval = R->kp.cval[i];
  }
  /* Pointer arguments: the inputs in order of first use, then the outputs. */
  for (int i = 0; i < R->ns; i++) {
    RVal *s = &R->s[i];
    if (!s->cs->defined && !s->is_const && s->cs->mapped) s->ptr = cu_param(g, s->v, 0, false);
  }
  for (int i = 0; i < R->ns; i++) {
    RVal *s = &R->s[i];
    if (s->cs->output && s->v->storage != IR_STORE_NONE) {
      s->out = true;
      s->grad = s->v->storage == IR_STORE_GRAD;
      s->ptr = cu_param(g, s->v, 0, true);
    }
  }
  /* What is needed: the stored outputs and, backwards, what they read. */
  for (int i = 0; i < R->ns; i++) R->s[i].need = R->s[i].out;
  for (int k = n - 1; k >= 0; k--) {
    int y = slot_of(R, ops[k]->result);
    if (y < 0 || !R->s[y].need) continue;
    for (int a = 0; a < ops[k]->nargs; a++) {
      int x = slot_of(R, ops[k]->args[a]);
      if (x >= 0) R->s[x].need = true;
    }
  }
  for (int k = 0; k < n; k++) plan(R, k);
  for (int i = 0; i < R->ns; i++)
    if (R->s[i].out && R->s[i].elem && R->s[i].ready > R->final) R->final = R->s[i].ready;
  if (R->final >= 0 && R->final + 1 > R->nloops) R->nloops = R->final + 1;
  R->grid = R->nst == 0;
}

/* Row pointers and per-row inputs, for the values the body used. */
static void prologue(Row *R) {
  CuGen *g = R->g;
  for (int i = 0; i < R->ns; i++) {
    RVal *s = &R->s[i];
    if (s->use_rowptr)
      cu_line(g, "%s%s *%s_row = %s + %s;", s->out ? "" : "const ", cu_mem_type(s->v->type.dtype, s->grad), s->ptr,
              s->ptr, s->rowoff);
  }
  for (int i = 0; i < R->ns; i++) {
    RVal *s = &R->s[i];
    if (s->use_rowval)
      cu_line(g, "const %s p%d = %s;", cu_reg_type(s->v->type.dtype), i,
              cu_load(g, s->v->type.dtype, false, row_lvalue(R, s)));
  }
}

/* Text written since mark, cut out of the body (for a prologue that goes before it). */
static char *take_since(CuGen *g, size_t mark) {
  char *t = arena_strdup(g->a, sb_str(&g->body) + mark);
  g->body.len = mark;
  if (g->body.data) g->body.data[mark] = 0;
  return t;
}

static void grid_kernel(Row *R) {
  CuGen *g = R->g;
  int64_t n = R->l->rows * R->l->cols, cols = R->l->cols;
  int block = 256;
  int64_t blocks = (n + block - 1) / block;
  g->block[0] = (unsigned)block;
  g->block[1] = 1;
  g->grid = blocks < 65536 ? blocks : 65536;
  g->how = cu_fmt(g, "elementwise: one thread per element (%lld rows of %lld), grid-stride", (long long)R->l->rows,
                  (long long)cols);
  cu_line(g, "for (long i = (long)blockIdx.x * %d + threadIdx.x; i < %lld; i += (long)gridDim.x * %d) {", block,
          (long long)n, block);
  g->indent++;
  size_t mark = g->body.len;
  open_scope(R, "j");
  section(R, 0);
  write_outputs(R);
  char *body = take_since(g, mark);
  if (R->use_row || R->use_j)
    cu_line(g, "const long row = %s;", cols == 1 ? "i" : cu_fmt(g, "i / %lld", (long long)cols));
  if (R->use_j) cu_line(g, "const int j = %s;", cols == 1 ? "0" : cu_fmt(g, "(int)(i - row * %lld)", (long long)cols));
  prologue(R);
  sb_puts(&g->body, body);
  g->indent--;
  cu_line(g, "}");
}

static void block_kernel(Row *R) {
  CuGen *g = R->g;
  const KpRowLayout *l = R->l;
  int64_t rows = l->rows, cols = l->cols;
  int rpb = 1; /* rows per block */
  if (cols <= 32 && rows > 1) {
    R->warp = true;
    rpb = rows < 8 ? (int)rows : 8;
    g->block[0] = (unsigned)(32 * rpb);
    g->how = cu_fmt(g, "one warp per row (%d rows a block), %lld rows of %lld", rpb, (long long)rows, (long long)cols);
  } else {
    int64_t b = (cols + 31) / 32 * 32;
    g->block[0] = (unsigned)(b > 1024 ? 1024 : b < 32 ? 32 : b);
    g->how = cu_fmt(g, "one block of %u threads per row, %lld rows of %lld", g->block[0], (long long)rows,
                    (long long)cols);
  }
  g->block[1] = 1;
  g->grid = (rows + rpb - 1) / rpb;
  size_t mark = g->body.len;
  for (int k = 0; k <= R->nloops; k++) {
    section(R, k);
    if (k < R->nloops) loop(R, k);
  }
  char *body = take_since(g, mark);
  if (R->red_f) cu_line(g, "__shared__ float red_f[32];");
  if (R->red_d) cu_line(g, "__shared__ double red_d[32];");
  if (R->red_i) cu_line(g, "__shared__ int red_i[32];");
  if (R->warp) {
    cu_line(g, "const long row = (long)blockIdx.x * %d + (threadIdx.x >> 5);", rpb);
    cu_line(g, "const int tid = threadIdx.x & 31;");
    cu_line(g, "if (row >= %lld) return;", (long long)rows);
  } else {
    if (R->use_row) cu_line(g, "const long row = blockIdx.x;");
    cu_line(g, "const int tid = threadIdx.x;");
  }
  prologue(R);
  sb_puts(&g->body, body);
}

void cu_row_kernel(CuGen *g, IrOp **ops, int n, const KpRowLayout *l) {
  Row R;
  memset(&R, 0, sizeof R);
  R.g = g;
  R.l = l;
  R.col = "j";
  if (!kp_row_plan(l, ops, n, g->a, &R.kp)) {
    cu_error(g, "an op does not fit a row kernel");
    return;
  }
  setup(&R, ops, n);
  if (g->failed) return;
  if (R.grid)
    grid_kernel(&R);
  else
    block_kernel(&R);
}
