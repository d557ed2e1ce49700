/* shard.c - tensor parallelism: shard split(N) params over the --tp ranks
 * and insert the collectives (DESIGN.md §2, docs/DISTRIBUTED.md).
 *
 * Every rank runs the same program on its own 1/T of each split param (T =
 * --tp).  A split param's type becomes its local shard (dim[split_axis] / T,
 * split_ranks = T).  The pass then walks the forward graph in order and
 * gives every value a state:
 *
 *     R      replicated: every rank holds the whole value;
 *     S(a)   sharded along axis a: rank r holds the r-th of T contiguous
 *            chunks of that axis (the value's type is the local chunk);
 *     P      partial sum: the value is the sum over ranks of what they hold.
 *
 * Rules (Megatron / nanotron):
 *   matmul(R, S(last of B))           -> S(last)   column-parallel
 *   matmul(S(last of A), S(row of B)) -> P         row-parallel
 *   matmul with both operands sharded on one batch axis, or one operand
 *   sharded on its row (batch) axis and the other replicated -> that axis
 *   elementwise: the sharded operands agree on the result axis; replicated
 *   operands broadcast along it (size 1 or absent)
 *   reshape: a sharded axis split into [NH, HD] keeps the shard on the
 *   leading factor NH (NH % T == 0), and merged back the same way
 *   permute moves the axis; slice / broadcast / concat keep it when they do
 *   not cut it; reductions, softmax, the norms, causal_mask over other axes
 *   keep it; sum (mean) over the sharded axis -> P
 *   embedding with the table split along its width -> S(last)
 * A P value is all-reduced at once (all_reduce.start/wait {group="tp"}),
 * so what follows it (the bias of a row-parallel layer) sees R; the
 * all-reduce's gradient is the identity.  A replicated value that takes
 * part in computing a sharded one gets a `tp.copy` (Megatron's f: the
 * identity whose gradient is all-reduced), one per value, so the partial
 * gradients that the ranks' shards give it are summed and every rank ends
 * with the whole gradient of every replicated value and param.  Values
 * that do not depend on a param (inputs, constants) need none.
 *
 * What the rules cannot lower (a loss that would not be replicated, a
 * normalisation or softmax over the sharded axis, operands sharded on
 * axes that do not match, a vocabulary-split embedding, ...) is an error
 * at the split(N) annotation, with a note at the op.
 *
 * Requires: the frontend's forward function (before gas-fold and
 * autodiff).  Guarantees: every op's types re-inferred for the local
 * shards; every loss replicated; a no-op for --tp <= 1.
 *
 * --sequence-parallel (Megatron-SP): the sequence axis is the axis before
 * the last of an activation (axis 1 of [B, T, C]; the token axis 0 of a
 * [B, C] one).  A row-parallel matmul's partial output is reduce-scattered
 * along it (state S(seq)) when divisible by T, else all-reduced; a
 * replicated operand of an elementwise op with an S(seq) one of the same
 * extent is tp.scatter'd (the residual stream entering SP); a column-
 * parallel matmul of an S(seq) input is nanotron's split-shard matmul
 * (sp_column); any other op that cannot take an S(seq) operand gets it
 * all-gathered back to R (grad="scatter": its gradient is replicated).
 * Replicated params meeting S(seq) values get tp.copy as before. */
#include <string.h>

#include "passes.h"

typedef enum { ST_R, ST_S, ST_P } StKind;

typedef struct Shard {
  StKind k;
  int axis;        /* ST_S */
  IrValue *origin; /* ST_S, ST_P: the split param the shard comes from (for errors) */
  bool seq;        /* ST_S: sharded along the sequence by sequence parallelism */
} Shard;

typedef struct Ctx {
  IrFunc *f;
  const PassOptions *o;
  int T;
  int cap;          /* size of the by-id tables */
  int nv0;          /* values that existed before the pass */
  IrType *gtype;    /* by id (< nv0): the value's type before the pass (global) */
  Shard *st;        /* by id */
  bool *dep;        /* by id: a float value that depends on a param (needs a gradient) */
  IrValue **repl;   /* by id: the all-reduced value that replaces a partial one */
  IrValue **copy;   /* by id: the value's tp.copy */
  IrOp **order;     /* the new op list */
  int norder;
  bool failed;
  /* Sequence parallelism: */
  bool sp;
  bool probe;       /* trying an op's rule: an error is not reported */
  IrValue **gath;   /* by id: a sequence-sharded value all-gathered to R for replicated use */
  IrValue **full;   /* by id: the same gathered for column-parallel GEMMs (split-shard matmul) */
  IrValue **scat;   /* by id: this rank's tp.scatter chunk of a replicated value */
} Ctx;

static const Shard R = {ST_R, -1, NULL, false};
static Shard S(int axis, IrValue *origin) { return (Shard){ST_S, axis, origin, false}; }
static Shard with_axis(Shard s, int axis) {
  s.axis = axis;
  return s;
}

static const char *opname(const IrOp *op) { return ir_op_info[op->opcode].name; }

/* The value's type before the pass, or for a value the pass made, its
 * whole (global) type. */
static const IrType *gtype(Ctx *c, const IrValue *v) { return &c->gtype[v->id]; }

static char *tstr(const IrType *t, char *buf) { return ir_type_str(t, buf, IR_TYPE_STR_MAX); }

static const SrcFile *src_for(Ctx *c, IrLoc l) {
  const SrcFile *src = c->o->src;
  return src && l.file && src->name && strcmp(src->name, l.file) == 0 ? src : NULL;
}

/* "split(A) of 'W' cannot be lowered: ..." at the annotation of origin, and
 * a note at the op.  Reports only the pass's first error. */
static bool refuse(Ctx *c, IrValue *origin, const IrOp *op, const char *fmt, ...) GRADC_PRINTF(4, 5);
static bool refuse(Ctx *c, IrValue *origin, const IrOp *op, const char *fmt, ...) {
  if (c->failed) return false;
  c->failed = true;
  if (!c->o->diag || c->probe) return false;
  StrBuf sb;
  sb_init(&sb);
  va_list ap;
  va_start(ap, fmt);
  sb_vprintf(&sb, fmt, ap);
  va_end(ap);
  IrLoc l = origin ? origin->split_loc : (IrLoc){0};
  const char *name = origin && origin->name ? origin->name : "?";
  int axis = origin ? origin->split_axis : -1;
  if (l.file)
    diag_at(c->o->diag, DIAG_ERROR, src_for(c, l), l.line, l.col, "split(%d) of '%s' cannot be lowered: %s", axis,
            name, sb_str(&sb));
  else
    diag_plain(c->o->diag, DIAG_ERROR, "split(%d) of '%s' cannot be lowered: %s", axis, name, sb_str(&sb));
  if (op && op->loc.file)
    diag_at(c->o->diag, DIAG_NOTE, src_for(c, op->loc), op->loc.line, op->loc.col, "at this '%s'", opname(op));
  sb_free(&sb);
  return false;
}

/* The first sharded operand's origin (for errors). */
static IrValue *origin_of(Ctx *c, const IrOp *op) {
  for (int j = 0; j < op->nargs; j++)
    if (c->st[op->args[j]->id].k != ST_R) return c->st[op->args[j]->id].origin;
  return NULL;
}

/* Record a value made by the pass. */
static void track(Ctx *c, IrValue *v, Shard s, bool dep) {
  GRADC_ASSERT(v->id < c->cap);
  c->st[v->id] = s;
  c->dep[v->id] = dep;
  c->gtype[v->id] = v->type;
  if (s.k == ST_S) c->gtype[v->id].shape.dim[s.axis] *= c->T;
}

/* Operand j of op is replicated and takes part in a sharded result: give it
 * a tp.copy (one per value) if it needs a gradient. */
static void copy_operand(Ctx *c, IrOp *op, int j) {
  IrValue *x = op->args[j];
  if (c->st[x->id].k != ST_R || !c->dep[x->id]) return;
  if (!c->copy[x->id]) {
    IrAttr at[2] = {ir_attr_str("group", "tp"), ir_attr_int("ranks", c->T)};
    IrValue *y = ir_emit(c->f, IR_OP_TP_COPY, &x, 1, at, 2, NULL, op->loc);
    track(c, y, R, true);
    c->order[c->norder++] = y->def;
    c->copy[x->id] = y;
  }
  op->args[j] = c->copy[x->id];
}

/* A copy of op's attributes with key set to the ints v (n of them). */
static void set_ints(Ctx *c, IrOp *op, const char *key, const int64_t *v, int n) {
  IrAttr *a = ARENA_ARRAY(&c->f->arena, IrAttr, op->nattrs + 1);
  int64_t *ints = ARENA_ARRAY(&c->f->arena, int64_t, n > 0 ? n : 1);
  memcpy(ints, v, sizeof *v * (size_t)n);
  int na = 0;
  bool found = false;
  for (int i = 0; i < op->nattrs; i++) {
    a[na] = op->attrs[i];
    if (strcmp(a[na].key, key) == 0) {
      a[na] = ir_attr_ints(op->attrs[i].key, ints, n);
      found = true;
    }
    na++;
  }
  if (!found) a[na++] = ir_attr_ints(arena_strdup(&c->f->arena, key), ints, n);
  op->attrs = a;
  op->nattrs = na;
}

/* ------------------------------------------------------------------ */
/* Sequence parallelism                                                 */
/* ------------------------------------------------------------------ */

/* Emit op opc over args with group="tp" ranks=T axis=axis (shift >= 0:
 * and shift; grad: and grad="..."), tracked with state s. */
static IrValue *emit_tp(Ctx *c, IrOpcode opc, IrValue *const *args, int nargs, int axis, int shift, const char *grad,
                        Shard s, bool dep, IrLoc loc) {
  IrAttr at[5] = {ir_attr_str("group", "tp"), ir_attr_int("ranks", c->T)};
  int na = 2;
  if (axis >= 0) at[na++] = ir_attr_int("axis", axis);
  if (shift >= 0) at[na++] = ir_attr_int("shift", shift);
  if (grad) at[na++] = ir_attr_str("grad", grad);
  IrValue *y = ir_emit(c->f, opc, args, nargs, at, na, NULL, loc);
  track(c, y, s, dep);
  c->order[c->norder++] = y->def;
  return y;
}

/* x all-gathered along its sharded axis: a start and its wait. */
static IrValue *gather(Ctx *c, IrValue *x, const char *grad, IrLoc loc) {
  Shard s = c->st[x->id];
  IrValue *st = emit_tp(c, IR_OP_ALL_GATHER_START, &x, 1, s.axis, -1, grad, s, c->dep[x->id], loc);
  return emit_tp(c, IR_OP_ALL_GATHER_WAIT, &st, 1, s.axis, -1, grad, R, c->dep[x->id], loc);
}

/* A sequence-sharded value made replicated for an op that cannot take it
 * (a loss, cross_entropy, a softmax over the sequence, ...): what follows
 * is replicated, so its gradient is too, and the gather's backward is this
 * rank's chunk of it (grad="scatter") rather than a reduce-scatter. */
static IrValue *gather_replicated(Ctx *c, IrValue *x, IrLoc loc) {
  if (!c->gath[x->id]) c->gath[x->id] = gather(c, x, "scatter", loc);
  return c->gath[x->id];
}

/* This rank's chunk along axis a of the replicated x (tp.scatter; its
 * backward all-gathers the chunks' gradients). */
static IrValue *scatter_value(Ctx *c, IrValue *x, int a, IrValue *origin, IrLoc loc) {
  IrValue *y = c->scat[x->id];
  if (y && c->st[y->id].axis == a) return y;
  Shard s = S(a, origin);
  s.seq = true;
  y = emit_tp(c, IR_OP_TP_SCATTER, &x, 1, a, -1, NULL, s, c->dep[x->id], loc);
  c->scat[x->id] = y;
  return y;
}

/* A column-parallel matmul (B split along its columns) whose input A is
 * sequence-sharded (axis rank-2 of A).  Megatron all-gathers A first;
 * nanotron's split-shard matmul starts the gather, multiplies the local
 * chunk meanwhile (op itself, now x_loc @ W), then the remote chunks
 * (rank.slice of the gathered value, shifts 1..T-1), and joins the T
 * products along the sequence (rank.concat).  The gather's backward
 * reduce-scatters the remote chunks' partial input gradients, and the
 * local GEMM adds this rank's own: no tp.copy.  Returns false if op is
 * not such a matmul. */
static bool is_sp_column(Ctx *c, const IrOp *op) {
  if (!c->sp || op->opcode != IR_OP_MATMUL) return false;
  Shard sa = c->st[op->args[0]->id], sb = c->st[op->args[1]->id];
  int ra = gtype(c, op->args[0])->shape.rank, rb = gtype(c, op->args[1])->shape.rank;
  return sa.k == ST_S && sa.seq && ra >= 2 && sa.axis == ra - 2 && sb.k == ST_S && !sb.seq && rb >= 2 &&
         sb.axis == rb - 1 && gtype(c, op->result)->shape.rank == ra;
}

static bool sp_column(Ctx *c, IrOp *op) {
  IrValue *A = op->args[0], *B = op->args[1];
  Shard sa = c->st[A->id], sb = c->st[B->id];
  const IrType *g = gtype(c, op->result);
  int rr = g->shape.rank;
  if (g->shape.dim[rr - 1] % c->T != 0) {
    char b[IR_TYPE_STR_MAX];
    return refuse(c, sb.origin, op, "'matmul' gives %s split along its columns, which are not divisible by --tp %d",
                  tstr(g, b), c->T);
  }
  if (!c->full[A->id]) c->full[A->id] = gather(c, A, NULL, op->loc);
  IrValue *full = c->full[A->id];
  bool dep = c->dep[A->id] || c->dep[B->id];
  Shard out = with_axis(sb, rr - 1);
  /* y_0 = x_loc @ W: the op, on local types. */
  char err[512];
  IrType got;
  if (!ir_infer_type(op, NULL, &got, err, sizeof err)) return refuse(c, sb.origin, op, "%s", err);
  op->result->type = got;
  c->st[op->result->id] = out;
  c->dep[op->result->id] = dep;
  c->order[c->norder++] = op;
  IrValue **ys = ARENA_ARRAY(&c->f->arena, IrValue *, c->T);
  ys[0] = op->result;
  for (int j = 1; j < c->T; j++) {
    IrValue *x = emit_tp(c, IR_OP_RANK_SLICE, &full, 1, sa.axis, j, NULL, sa, c->dep[A->id], op->loc);
    IrValue *ab[2] = {x, B};
    ys[j] = ir_emit(c->f, IR_OP_MATMUL, ab, 2, op->attrs, op->nattrs, NULL, op->loc);
    track(c, ys[j], out, dep);
    c->order[c->norder++] = ys[j]->def;
  }
  IrValue *y = emit_tp(c, IR_OP_RANK_CONCAT, ys, c->T, rr - 2, -1, NULL, out, dep, op->loc);
  y->name = op->result->name;
  op->result->name = NULL;
  c->repl[op->result->id] = y;
  (void)sa;
  return true;
}

/* ------------------------------------------------------------------ */
/* Rules: each computes op's result state from its operands' (and may  */
/* wrap operands in tp.copy or rewrite attributes); false on an error.  */
/* ------------------------------------------------------------------ */

/* Ops that take replicated operands only. */
static bool rule_replicated(Ctx *c, IrOp *op, Shard *out) {
  for (int j = 0; j < op->nargs; j++) {
    Shard s = c->st[op->args[j]->id];
    if (s.k == ST_R) continue;
    char b[IR_TYPE_STR_MAX];
    return refuse(c, s.origin, op, "'%s' gets operand %d sharded along axis %d of %s; it can only take replicated values",
                  opname(op), j + 1, s.axis, tstr(gtype(c, op->args[j]), b));
  }
  *out = R;
  return true;
}

/* Elementwise ops, NumPy broadcasting: the sharded operands must agree on
 * the result axis, and the replicated ones broadcast along it. */
static bool rule_elementwise(Ctx *c, IrOp *op, Shard *out) {
  int rr = gtype(c, op->result)->shape.rank;
  Shard res = R;
  for (int j = 0; j < op->nargs; j++) {
    Shard s = c->st[op->args[j]->id];
    if (s.k == ST_R) continue;
    int ra = s.axis + rr - gtype(c, op->args[j])->shape.rank;
    if (s.k == ST_P || (res.k == ST_S && res.axis != ra)) {
      char b1[IR_TYPE_STR_MAX], b2[IR_TYPE_STR_MAX];
      return refuse(c, s.origin, op, "'%s' combines operands sharded along different axes (%s and %s)", opname(op),
                    tstr(gtype(c, op->args[0]), b1), tstr(gtype(c, op->args[j]), b2));
    }
    res = with_axis(s, ra);
  }
  if (res.k == ST_R) return *out = R, true;
  for (int j = 0; j < op->nargs; j++) {
    IrValue *x = op->args[j];
    if (c->st[x->id].k != ST_R) continue;
    const IrType *t = gtype(c, x);
    int a = res.axis - (rr - t->shape.rank);
    if (a >= 0 && t->shape.dim[a] != 1 && res.seq && t->shape.dim[a] == gtype(c, op->result)->shape.dim[res.axis] &&
        ir_dtype_is_float(x->type.dtype)) {
      /* The replicated residual stream meets sequence-parallel values. */
      op->args[j] = scatter_value(c, x, a, res.origin, op->loc);
      continue;
    }
    if (a >= 0 && t->shape.dim[a] != 1) {
      char b1[IR_TYPE_STR_MAX], b2[IR_TYPE_STR_MAX];
      return refuse(c, res.origin, op,
                    "'%s' combines a value sharded along axis %d of %s with the replicated %s, which is not "
                    "broadcast along that axis (split that operand along the same axis)",
                    opname(op), res.axis, tstr(gtype(c, op->result), b1), tstr(t, b2));
    }
    if (ir_dtype_is_float(x->type.dtype)) copy_operand(c, op, j);
  }
  *out = res;
  return true;
}

/* sum/mean/max/logsumexp: over other axes the shard stays; sum or mean
 * over the sharded axis gives a partial sum (*scale: mean's 1/T). */
static bool rule_reduce(Ctx *c, IrOp *op, Shard *out, double *scale) {
  Shard s = c->st[op->args[0]->id];
  if (s.k == ST_R) return *out = R, true;
  const IrType *t = gtype(c, op->args[0]);
  const int64_t *axes;
  int naxes = ir_attr_get_ints(op, "axes", &axes);
  bool keep = ir_attr_get_int(op, "keepdim", 0) != 0, reduced[IR_MAX_RANK] = {false};
  for (int i = 0; i < t->shape.rank; i++) reduced[i] = naxes == 0;
  for (int i = 0; i < naxes; i++) {
    int64_t a;
    if (ir_norm_axis(axes[i], t->shape.rank, &a)) reduced[a] = true;
  }
  if (reduced[s.axis]) {
    if (op->opcode == IR_OP_MEAN) *scale = 1.0 / c->T;
    if (op->opcode == IR_OP_SUM || op->opcode == IR_OP_MEAN) return *out = (Shard){ST_P, -1, s.origin, false}, true;
    char b[IR_TYPE_STR_MAX];
    return refuse(c, s.origin, op, "'%s' reduces %s over its sharded axis %d (only sum and mean can)", opname(op),
                  tstr(t, b), s.axis);
  }
  int a = s.axis;
  if (!keep)
    for (int i = 0; i < s.axis; i++) a -= reduced[i];
  *out = with_axis(s, a);
  return true;
}

/* Axes of shape s of size > 1, into idx; returns their count. */
static int big_axes(const IrShape *s, int *idx) {
  int n = 0;
  for (int i = 0; i < s->rank; i++)
    if (s->dim[i] != 1) idx[n++] = i;
  return n;
}

/* reshape: find the group of axes the sharded one belongs to (input and
 * output axes with equal products, size-1 axes ignored).  One input axis
 * split into several keeps the shard on the leading one; several merged
 * into one keep it if the sharded axis leads. */
static bool rule_reshape(Ctx *c, IrOp *op, Shard *out) {
  Shard s = c->st[op->args[0]->id];
  if (s.k == ST_R) return *out = R, true;
  const IrShape *in = &gtype(c, op->args[0])->shape, *os = &gtype(c, op->result)->shape;
  int ia[IR_MAX_RANK], oa[IR_MAX_RANK];
  int ni = big_axes(in, ia), no = big_axes(os, oa);
  char b1[IR_TYPE_STR_MAX], b2[IR_TYPE_STR_MAX];
  const char *why = "it mixes the sharded axis with others";
  for (int i = 0, j = 0; i < ni && j < no;) {
    int i0 = i, j0 = j;
    int64_t pi = in->dim[ia[i++]], po = os->dim[oa[j++]];
    while (pi != po) {
      if (pi < po) {
        if (i == ni) break;
        pi *= in->dim[ia[i++]];
      } else {
        if (j == no) break;
        po *= os->dim[oa[j++]];
      }
    }
    if (pi != po) break;
    bool in_group = false;
    for (int k = i0; k < i; k++) in_group |= ia[k] == s.axis;
    if (!in_group) continue;
    if (ia[i0] != s.axis || (i - i0 > 1 && j - j0 > 1)) break;
    int a = oa[j0];
    if (os->dim[a] % c->T != 0) {
      why = "the leading factor of the sharded axis is not divisible by --tp";
      break;
    }
    *out = with_axis(s, a);
    return true;
  }
  return refuse(c, s.origin, op, "'reshape' of %s (sharded along axis %d) to %s: %s", tstr(gtype(c, op->args[0]), b1),
                s.axis, tstr(gtype(c, op->result), b2), why);
}

static bool rule_permute(Ctx *c, IrOp *op, Shard *out) {
  Shard s = c->st[op->args[0]->id];
  if (s.k == ST_R) return *out = R, true;
  const int64_t *perm;
  int n = ir_attr_get_ints(op, "perm", &perm);
  for (int j = 0; j < n; j++)
    if (perm[j] == s.axis) return *out = with_axis(s, j), true;
  GRADC_ASSERT(!"permute without the sharded axis");
  return false;
}

static bool rule_broadcast(Ctx *c, IrOp *op, Shard *out) {
  Shard s = c->st[op->args[0]->id];
  if (s.k == ST_R) return *out = R, true;
  *out = with_axis(s, s.axis + gtype(c, op->result)->shape.rank - gtype(c, op->args[0])->shape.rank);
  return true;
}

/* slice: the whole of the sharded axis, any part of the others. */
static bool rule_slice(Ctx *c, IrOp *op, Shard *out) {
  Shard s = c->st[op->args[0]->id];
  if (s.k == ST_R) return *out = R, true;
  const int64_t *starts, *stops, *steps;
  int n = ir_attr_get_ints(op, "starts", &starts);
  ir_attr_get_ints(op, "stops", &stops);
  ir_attr_get_ints(op, "steps", &steps);
  int64_t d = gtype(c, op->args[0])->shape.dim[s.axis];
  if (s.axis >= n || starts[s.axis] != 0 || stops[s.axis] != d || steps[s.axis] != 1) {
    char b[IR_TYPE_STR_MAX];
    return refuse(c, s.origin, op, "'slice' cuts %s along its sharded axis %d", tstr(gtype(c, op->args[0]), b),
                  s.axis);
  }
  int64_t st2[IR_MAX_RANK];
  memcpy(st2, stops, sizeof *stops * (size_t)n);
  st2[s.axis] = d / c->T;
  set_ints(c, op, "stops", st2, n);
  *out = s;
  return true;
}

static bool rule_concat(Ctx *c, IrOp *op, Shard *out) {
  Shard s0 = c->st[op->args[0]->id];
  int64_t axis = -1;
  ir_norm_axis(ir_attr_get_int(op, "axis", 0), gtype(c, op->args[0])->shape.rank, &axis);
  for (int j = 1; j < op->nargs; j++) {
    Shard s = c->st[op->args[j]->id];
    if (s.k != s0.k || s.axis != s0.axis)
      return refuse(c, s.k != ST_R ? s.origin : s0.origin, op, "'concat' joins operands that are not sharded alike");
  }
  if (s0.k == ST_S && s0.axis == axis)
    return refuse(c, s0.origin, op, "'concat' joins along the sharded axis %d", s0.axis);
  *out = s0;
  return true;
}

/* matmul (torch.matmul rules).  Operand axes play a role: the contraction
 * axis K, the row axis M of A, the column axis N of B, or a batch axis;
 * M, N and batch axes map to result axes. */
typedef enum { MM_K, MM_MN, MM_BATCH } MmRole;

static MmRole mm_role(int rank, int axis, bool is_a) {
  if (rank == 1) return MM_K;
  if (axis == rank - 1) return is_a ? MM_K : MM_MN;
  if (axis == rank - 2) return is_a ? MM_MN : MM_K;
  return MM_BATCH;
}

/* The result axis of a non-K axis of an operand. */
static int mm_result_axis(int ra, int rb, int rr, int axis, bool is_a) {
  int r = is_a ? ra : rb;
  if (mm_role(r, axis, is_a) == MM_MN) return is_a ? (rb == 1 ? rr - 1 : rr - 2) : rr - 1;
  int nb = rr - (ra >= 2) - (rb >= 2);
  return axis + nb - (r - 2);
}

static bool rule_matmul(Ctx *c, IrOp *op, Shard *out) {
  IrValue *A = op->args[0], *B = op->args[1];
  Shard sa = c->st[A->id], sb = c->st[B->id];
  if (sa.k == ST_R && sb.k == ST_R) return *out = R, true;
  const IrType *ta = gtype(c, A), *tb = gtype(c, B);
  int ra = ta->shape.rank, rb = tb->shape.rank, rr = gtype(c, op->result)->shape.rank;
  char b1[IR_TYPE_STR_MAX], b2[IR_TYPE_STR_MAX];
  tstr(ta, b1);
  tstr(tb, b2);
  IrValue *origin = sb.k != ST_R ? sb.origin : sa.origin;
  if (sa.k == ST_P || sb.k == ST_P) return refuse(c, origin, op, "'matmul' of a partial sum");
  MmRole ka = sa.k == ST_S ? mm_role(ra, sa.axis, true) : MM_K, kb = sb.k == ST_S ? mm_role(rb, sb.axis, false) : MM_K;
  /* Row-parallel: both sharded along the contraction. */
  if (sa.k == ST_S && sb.k == ST_S && ka == MM_K && kb == MM_K) return *out = (Shard){ST_P, -1, origin, false}, true;
  if ((sa.k == ST_S && ka == MM_K) || (sb.k == ST_S && kb == MM_K))
    return refuse(c, origin, op,
                  "'matmul' %s @ %s contracts over an axis sharded on one operand only (a row-parallel matmul "
                  "needs its input sharded along the last axis, the output of a column-parallel one)",
                  b1, b2);
  int xa = sa.k == ST_S ? mm_result_axis(ra, rb, rr, sa.axis, true) : -1;
  int xb = sb.k == ST_S ? mm_result_axis(ra, rb, rr, sb.axis, false) : -1;
  if (sa.k == ST_S && sb.k == ST_S) {
    if (xa != xb || ka != MM_BATCH || sa.seq != sb.seq)
      return refuse(c, origin, op, "'matmul' %s @ %s has operands sharded along axes that do not match", b1, b2);
    return *out = with_axis(sa, xa), true;
  }
  /* One operand sharded along a row, column or batch axis; the other is
   * replicated and must broadcast along a batch axis. */
  int x = xa >= 0 ? xa : xb;
  bool a_sharded = sa.k == ST_S;
  const IrType *tr = a_sharded ? tb : ta;
  int rrep = a_sharded ? rb : ra;
  if ((a_sharded ? ka : kb) == MM_BATCH && rrep > 2) {
    int nb = rr - (ra >= 2) - (rb >= 2);
    int k = x - (nb - (rrep - 2));
    if (k >= 0 && tr->shape.dim[k] != 1)
      return refuse(c, origin, op,
                    "'matmul' %s @ %s has one operand sharded along a batch axis that the other, replicated, "
                    "does not broadcast along",
                    b1, b2);
  }
  copy_operand(c, op, a_sharded ? 1 : 0);
  *out = with_axis(a_sharded ? sa : sb, x);
  return true;
}

/* softmax / log_softmax over another axis than the sharded one. */
static bool rule_softmax(Ctx *c, IrOp *op, Shard *out) {
  Shard s = c->st[op->args[0]->id];
  if (s.k == ST_R) return *out = R, true;
  int64_t axis = -1;
  ir_norm_axis(ir_attr_get_int(op, "axis", -1), gtype(c, op->args[0])->shape.rank, &axis);
  if (axis == s.axis) {
    char b[IR_TYPE_STR_MAX];
    return refuse(c, s.origin, op, "'%s' of %s runs over its sharded axis %d", opname(op),
                  tstr(gtype(c, op->args[0]), b), s.axis);
  }
  *out = s;
  return true;
}

/* A norm (family NORM) over the last axis: x sharded along another one,
 * weight and bias replicated (their gradients are partial: tp.copy). */
static bool rule_norm(Ctx *c, IrOp *op, Shard *out) {
  Shard s = c->st[op->args[0]->id];
  char b[IR_TYPE_STR_MAX];
  for (int j = 1; j < op->nargs; j++) {
    Shard w = c->st[op->args[j]->id];
    if (w.k != ST_R)
      return refuse(c, w.origin, op, "the %s of '%s' is split but it normalises whole rows",
                    j == 1 ? "weight" : "bias", opname(op));
  }
  if (s.k == ST_R) return *out = R, true;
  int rank = gtype(c, op->args[0])->shape.rank;
  if (s.axis == rank - 1)
    return refuse(c, s.origin, op, "'%s' normalises %s over its sharded last axis", opname(op),
                  tstr(gtype(c, op->args[0]), b));
  for (int j = 1; j < op->nargs; j++) copy_operand(c, op, j);
  *out = s;
  return true;
}

static bool rule_causal_mask(Ctx *c, IrOp *op, Shard *out) {
  Shard s = c->st[op->args[0]->id];
  if (s.k == ST_R) return *out = R, true;
  int rank = gtype(c, op->args[0])->shape.rank;
  if (s.axis >= rank - 2) {
    char b[IR_TYPE_STR_MAX];
    return refuse(c, s.origin, op, "'causal_mask' of %s masks along its sharded axis %d", tstr(gtype(c, op->args[0]), b),
                  s.axis);
  }
  *out = s;
  return true;
}

/* embedding(idx, table): a table split along its width gives rows split
 * the same way; split along the vocabulary it would need a masked lookup
 * and an all-reduce (vocab-parallel embedding), not supported. */
static bool rule_embedding(Ctx *c, IrOp *op, Shard *out) {
  Shard si = c->st[op->args[0]->id], st = c->st[op->args[1]->id];
  if (si.k != ST_R) return rule_replicated(c, op, out);
  if (st.k == ST_R) return *out = R, true;
  if (st.k == ST_S && st.axis == 1) return *out = S(gtype(c, op->result)->shape.rank - 1, st.origin), true;
  return refuse(c, st.origin, op, "'embedding' with the table split along the vocabulary (vocab-parallel embedding) is "
                                  "not supported; split it along axis 1");
}

static bool rule_cross_entropy(Ctx *c, IrOp *op, Shard *out) {
  Shard s = c->st[op->args[0]->id];
  if (s.k == ST_S && s.axis == gtype(c, op->args[0])->shape.rank - 1)
    return refuse(c, s.origin, op, "'cross_entropy' would see its logits split along the classes (vocab-parallel "
                                   "cross_entropy is not supported)");
  return rule_replicated(c, op, out);
}

static bool rule_loss(Ctx *c, IrOp *op, Shard *out) {
  Shard s = c->st[op->args[0]->id];
  *out = R;
  if (s.k == ST_R) return true;
  return refuse(c, s.origin, op, "%s '%s' would not be replicated (its value is sharded along axis %d)",
                op->opcode == IR_OP_LOSS ? "loss" : op->opcode == IR_OP_UPDATE ? "update of buffer" : "output",
                ir_attr_get_str(op, "name", "?"), s.axis);
}

static bool lower(Ctx *c, IrOp *op, Shard *out, double *scale) {
  switch (op->opcode) {
  IR_CASES(ELEMENTWISE) return rule_elementwise(c, op, out);
  case IR_OP_CONST: return *out = R, true;
  /* Randomness: the draws are replicated (every tp rank draws the same). */
  case IR_OP_RNG_STATE:
  case IR_OP_LOSS_SCALE: return *out = R, true;
  case IR_OP_RANDOM: return rule_replicated(c, op, out);
  case IR_OP_SUM:
  case IR_OP_MEAN:
  case IR_OP_MAX:
  case IR_OP_LOGSUMEXP: return rule_reduce(c, op, out, scale);
  case IR_OP_RESHAPE: return rule_reshape(c, op, out);
  case IR_OP_PERMUTE: return rule_permute(c, op, out);
  case IR_OP_BROADCAST: return rule_broadcast(c, op, out);
  case IR_OP_SLICE: return rule_slice(c, op, out);
  case IR_OP_CONCAT: return rule_concat(c, op, out);
  case IR_OP_MATMUL: return rule_matmul(c, op, out);
  case IR_OP_SOFTMAX:
  case IR_OP_LOG_SOFTMAX: return rule_softmax(c, op, out);
  IR_CASES(NORM) return rule_norm(c, op, out);
  case IR_OP_CAUSAL_MASK: return rule_causal_mask(c, op, out);
  case IR_OP_EMBEDDING: return rule_embedding(c, op, out);
  case IR_OP_CROSS_ENTROPY: return rule_cross_entropy(c, op, out);
  case IR_OP_LOSS:
  case IR_OP_OUTPUT:
  case IR_OP_UPDATE: return rule_loss(c, op, out);
  /* Backward-only, accumulation and collective ops: replicated operands only. */
  case IR_OP_UNSLICE:
  case IR_OP_EMBEDDING_GRAD:
  case IR_OP_ONE_HOT:
  case IR_OP_ARANGE:
  case IR_OP_GATHER:
  case IR_OP_GATHER_GRAD:
  case IR_OP_TOPK:
  case IR_OP_MSE_LOSS:
  /* convolution and pooling: no tensor-parallel rule yet (a split
   * channel axis would need one); replicated operands only */
  case IR_OP_PATCHES:
  case IR_OP_PATCHES_GRAD:
  case IR_OP_WINDOW_SUM:
  case IR_OP_GRAD_SEED:
  case IR_OP_LOSS_TERM:
  IR_CASES(COLLECTIVE)
  case IR_OP_GRAD: return rule_replicated(c, op, out);
  }
  GRADC_ASSERT(!"unknown opcode");
  return false;
}

/* The local type of a value of global type t in state s. */
static IrType local_type(Ctx *c, const IrType *t, Shard s) {
  IrType l = *t;
  if (s.k == ST_S) l.shape.dim[s.axis] /= c->T;
  return l;
}

/* Rewrite op for its operands' local types and give its result the local
 * type of state s (checked against the shape rule).  A partial result is
 * all-reduced right after the op. */
static bool rebuild(Ctx *c, IrOp *op, Shard s, double scale) {
  if (!op->result) return true;
  const IrType *g = gtype(c, op->result);
  if (s.k == ST_S && g->shape.dim[s.axis] % c->T != 0) {
    char b[IR_TYPE_STR_MAX];
    return refuse(c, s.origin, op, "'%s' gives %s sharded along axis %d, which is not divisible by --tp %d", opname(op),
                  tstr(g, b), s.axis, c->T);
  }
  IrType want = local_type(c, g, s);
  if (s.k == ST_S && (op->opcode == IR_OP_RESHAPE || op->opcode == IR_OP_BROADCAST))
    set_ints(c, op, "shape", want.shape.dim, want.shape.rank);
  IrType got;
  char err[512];
  if (!ir_infer_type(op, &want, &got, err, sizeof err)) return refuse(c, s.origin ? s.origin : origin_of(c, op), op, "%s", err);
  if (!ir_type_eq(&got, &want)) {
    char b1[IR_TYPE_STR_MAX], b2[IR_TYPE_STR_MAX];
    return refuse(c, s.origin ? s.origin : origin_of(c, op), op, "'%s' gives %s on each rank where %s was expected",
                  opname(op), tstr(&got, b1), tstr(&want, b2));
  }
  op->result->type = got;
  bool dep = false;
  for (int j = 0; j < op->nargs; j++) dep |= c->dep[op->args[j]->id];
  if (op->opcode == IR_OP_DETACH || !ir_dtype_is_float(got.dtype)) dep = false;
  c->st[op->result->id] = s;
  c->dep[op->result->id] = dep;
  c->order[c->norder++] = op;
  if (s.k != ST_P) return true;
  /* P: (scale,) all-reduce; later ops read the reduced value. */
  IrValue *x = op->result;
  if (scale != 1.0) {
    IrValue *k = ir_const(c->f, scale, got.dtype, op->loc);
    track(c, k, R, false);
    c->order[c->norder++] = k->def;
    x = ir_binary(c->f, IR_OP_MUL, x, k, op->loc);
    track(c, x, s, dep);
    c->order[c->norder++] = x->def;
  }
  IrValue *w;
  int sa = got.shape.rank - 2; /* the sequence axis of an activation (axis 1 of [B, T, C]) */
  if (c->sp && op->opcode == IR_OP_MATMUL && sa >= 0 && got.shape.dim[sa] % c->T == 0) {
    /* Sequence parallelism: a row-parallel output is reduce-scattered along
     * the sequence (Megatron's reduce_scatter_to_sequence_parallel_region). */
    Shard q = S(sa, s.origin);
    q.seq = true;
    IrValue *st = emit_tp(c, IR_OP_REDUCE_SCATTER_START, &x, 1, sa, -1, NULL, s, dep, op->loc);
    w = emit_tp(c, IR_OP_REDUCE_SCATTER_WAIT, &st, 1, sa, -1, NULL, q, dep, op->loc);
  } else {
    IrValue *st = emit_tp(c, IR_OP_ALL_REDUCE_START, &x, 1, -1, -1, NULL, s, dep, op->loc);
    w = emit_tp(c, IR_OP_ALL_REDUCE_WAIT, &st, 1, -1, -1, NULL, R, dep, op->loc);
  }
  w->name = op->result->name; /* the name the source gave the whole value */
  op->result->name = NULL;
  c->repl[op->result->id] = w;
  return true;
}

PassResult pass_shard(IrFunc *f, const PassOptions *o, Arena *scratch) {
  if (o->tp <= 1) return PASS_UNCHANGED;
  for (int i = 0; i < f->nops; i++)
    if (ir_op_is(f->ops[i]->opcode, IR_OPF_WINDOW) || f->ops[i]->opcode == IR_OP_GRAD) {
      if (o->diag) diag_plain(o->diag, DIAG_ERROR, "shard must run before gas-fold and autodiff");
      return PASS_ERROR;
    }
  Ctx c = {.f = f, .o = o, .T = o->tp, .nv0 = f->nvalues, .sp = o->sequence_parallel};
  bool any = false;
  for (int i = 0; i < f->nargs; i++) any |= f->args[i]->role == IR_ARG_PARAM && f->args[i]->split_axis >= 0;
  if (!any) return PASS_UNCHANGED;
  int n0 = f->nops;
  /* New values per op: a tp.copy per operand, a scale and its constant, a start and a wait. */
  int grow = 8;
  for (int i = 0; i < n0; i++) grow += f->ops[i]->nargs + 4;
  /* Sequence parallelism: per operand a gather or a scatter, per matmul the split-shard's 2 T + 1. */
  if (c.sp)
    for (int i = 0; i < n0; i++) grow += 2 * f->ops[i]->nargs + 2 * c.T + 2;
  c.cap = f->nvalues + grow;
  c.gtype = ARENA_ARRAY(scratch, IrType, c.cap);
  c.st = ARENA_ARRAY(scratch, Shard, c.cap);
  c.dep = ARENA_ARRAY(scratch, bool, c.cap);
  c.repl = ARENA_ARRAY(scratch, IrValue *, c.cap);
  c.copy = ARENA_ARRAY(scratch, IrValue *, c.cap);
  c.gath = ARENA_ARRAY(scratch, IrValue *, c.cap);
  c.full = ARENA_ARRAY(scratch, IrValue *, c.cap);
  c.scat = ARENA_ARRAY(scratch, IrValue *, c.cap);
  c.order = ARENA_ARRAY(scratch, IrOp *, n0 + grow);
  for (int i = 0; i < c.nv0; i++) c.gtype[i] = f->values[i]->type;
  for (int i = 0; i < c.cap; i++) c.st[i] = R;
  IrOp **ops0 = ARENA_ARRAY(scratch, IrOp *, n0 + 1);
  memcpy(ops0, f->ops, sizeof *ops0 * (size_t)n0);

  /* Params: their local shard. */
  for (int i = 0; i < f->nargs; i++) {
    IrValue *v = f->args[i];
    if (v->role != IR_ARG_PARAM) continue;
    c.dep[v->id] = ir_dtype_is_float(v->type.dtype);
    if (v->split_axis < 0) continue;
    int64_t d = v->type.shape.dim[v->split_axis];
    if (d % c.T != 0) {
      char b[IR_TYPE_STR_MAX];
      refuse(&c, v, NULL, "axis %d of %s is not divisible by --tp %d", v->split_axis, tstr(&v->type, b), c.T);
      return PASS_ERROR;
    }
    v->type.shape.dim[v->split_axis] = d / c.T;
    v->split_ranks = c.T;
    c.st[v->id] = S(v->split_axis, v);
  }

  for (int i = 0; i < n0 && !c.failed; i++) {
    IrOp *op = ops0[i];
    for (int j = 0; j < op->nargs; j++)
      if (c.repl[op->args[j]->id]) op->args[j] = c.repl[op->args[j]->id];
    Shard s = R;
    double scale = 1.0;
    bool seq = false;
    for (int j = 0; j < op->nargs; j++) seq |= c.st[op->args[j]->id].seq;
    if (seq && is_sp_column(&c, op)) {
      if (!sp_column(&c, op)) break;
      continue;
    }
    if (seq) {
      /* An op that cannot take its sequence-sharded operands gets them
       * all-gathered back to replicated. */
      c.probe = true;
      bool ok = lower(&c, op, &s, &scale);
      c.probe = false;
      if (ok) goto lowered;
      c.failed = false;
      s = R;
      scale = 1.0;
      for (int j = 0; j < op->nargs; j++)
        if (c.st[op->args[j]->id].seq) op->args[j] = gather_replicated(&c, op->args[j], op->loc);
    }
    if (!lower(&c, op, &s, &scale)) break;
  lowered:
    if (!op->result) {
      c.order[c.norder++] = op;
      continue;
    }
    if (!rebuild(&c, op, s, scale)) break;
  }
  if (c.failed) return PASS_ERROR;
  GRADC_ASSERT(c.norder == f->nops);
  memcpy(f->ops, c.order, sizeof *f->ops * (size_t)c.norder);
  return PASS_CHANGED;
}
