/* interp.c - the reference interpreter: the oracle every back end is tested
 * against (DESIGN.md §6).
 *
 * Each value is an array of doubles (row-major, numel elements).  Ops run
 * one at a time in program order with PyTorch semantics; after each op the
 * result is rounded to its dtype (ir_round_dtype) unless exact_f64 is set.
 * The elementwise ops' scalar semantics live in ir/scalar.c.
 * Nothing is fused or clever: a reader should be able to check every op
 * against the PyTorch documentation at a glance.
 *
 * Phases (DESIGN.md §3): INTERP_COUNT runs only the ops that window.sum
 * operands depend on, so the step driver can sum them over the window
 * before the first real micro-batch; INTERP_STEP runs everything, taking
 * each window.sum result from the sums the driver collected. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/runtime.h"

typedef struct Ctx {
  InterpState *st;
  const InterpOptions *opt;
  double *const *window_sums;
  InterpPhase phase;
  char *err;
  size_t errlen;
  StepColl *coll; /* collectives in flight, by the start's value id (allocated at the first) */
} Ctx;

static bool fail(Ctx *c, const char *fmt, ...) GRADC_PRINTF(2, 3);
static bool fail(Ctx *c, const char *fmt, ...) {
  if (c->err && c->errlen) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->err, c->errlen, fmt, ap);
    va_end(ap);
  }
  return false;
}

static double *alloc_vals(int64_t n) {
  double *p = calloc((size_t)(n > 0 ? n : 1), sizeof(double));
  if (!p) abort();
  return p;
}

static const char *opname(const IrOp *op) { return ir_op_info[op->opcode].name; }
static const IrShape *shape_of(const IrValue *v) { return &v->type.shape; }
static int64_t numel_of(const IrValue *v) { return ir_numel(&v->type.shape); }
static const double *in(Ctx *c, const IrOp *op, int i) { return c->st->val[op->args[i]->id]; }

/* ------------------------------------------------------------------ */
/* Walking shapes                                                      */
/* ------------------------------------------------------------------ */

/* Visits the elements of a shape in row-major order, keeping one offset per
 * operand; an operand's stride is 0 along the axes it is broadcast over. */
#define WALK_MAX 4
typedef struct Walk {
  int rank, n;
  int64_t dim[IR_MAX_RANK], idx[IR_MAX_RANK];
  int64_t stride[WALK_MAX][IR_MAX_RANK];
  int64_t off[WALK_MAX];
} Walk;

static void walk_init(Walk *w, const IrShape *s) {
  memset(w, 0, sizeof *w);
  w->rank = s->rank;
  for (int k = 0; k < s->rank; k++) w->dim[k] = s->dim[k];
}

static void walk_next(Walk *w) {
  for (int k = w->rank - 1; k >= 0; k--) {
    w->idx[k]++;
    for (int o = 0; o < w->n; o++) w->off[o] += w->stride[o][k];
    if (w->idx[k] < w->dim[k]) return;
    for (int o = 0; o < w->n; o++) w->off[o] -= w->stride[o][k] * w->dim[k];
    w->idx[k] = 0;
  }
}

static void contiguous_strides(const IrShape *s, int64_t *st) {
  int64_t m = 1;
  for (int k = s->rank - 1; k >= 0; k--) {
    st[k] = m;
    m *= s->dim[k];
  }
}

/* Add an operand of shape s broadcast (NumPy rules) to the walk's shape. */
static bool walk_add_bcast(Walk *w, const IrShape *s) {
  GRADC_ASSERT(w->n < WALK_MAX);
  if (s->rank > w->rank) return false;
  int64_t cs[IR_MAX_RANK];
  contiguous_strides(s, cs);
  int lead = w->rank - s->rank;
  for (int k = 0; k < w->rank; k++) {
    int j = k - lead;
    if (j < 0 || (s->dim[j] == 1 && w->dim[k] != 1))
      w->stride[w->n][k] = 0;
    else if (s->dim[j] == w->dim[k])
      w->stride[w->n][k] = cs[j];
    else
      return false;
  }
  w->n++;
  return true;
}

/* Add an operand with explicit strides and a base offset. */
static void walk_add_strided(Walk *w, const int64_t *stride, int64_t base) {
  GRADC_ASSERT(w->n < WALK_MAX);
  for (int k = 0; k < w->rank; k++) w->stride[w->n][k] = stride[k];
  w->off[w->n] = base;
  w->n++;
}

/* ------------------------------------------------------------------ */
/* Elementwise functions                                               */
/* ------------------------------------------------------------------ */
/* One operand, element by element (ir/scalar.c has the semantics). */
static bool map1(Ctx *c, const IrOp *op, double *out) {
  const double *x = in(c, op, 0);
  int64_t n = numel_of(op->result);
  if (numel_of(op->args[0]) != n) return fail(c, "%s: operand and result sizes differ", opname(op));
  IrOpcode k = op->opcode;
  IrDType to = op->result->type.dtype;
  if (k == IR_OP_CAST)
    for (int64_t i = 0; i < n; i++) out[i] = ir_scalar_cast(x[i], to);
  else
    for (int64_t i = 0; i < n; i++) out[i] = ir_scalar_unary_op(op, x[i]);
  return true;
}

/* Two broadcast operands, element by element: fn (binary or comparison). */
static bool map2(Ctx *c, const IrOp *op, double *out, IrOpcode fn) {
  Walk w;
  walk_init(&w, shape_of(op->result));
  if (!walk_add_bcast(&w, shape_of(op->args[0])) || !walk_add_bcast(&w, shape_of(op->args[1])))
    return fail(c, "%s: operands do not broadcast to the result", opname(op));
  const double *a = in(c, op, 0), *b = in(c, op, 1);
  int64_t n = numel_of(op->result), na = numel_of(op->args[0]), nb = numel_of(op->args[1]);
  if ((na == n || na == 1) && (nb == n || nb == 1)) {
    /* Each operand the result's layout (broadcast adds only axes of 1)
     * or one element: indexed directly, without the walk. */
    for (int64_t i = 0; i < n; i++) out[i] = ir_scalar_binary(fn, a[na == 1 ? 0 : i], b[nb == 1 ? 0 : i]);
    return true;
  }
  for (int64_t i = 0; i < n; i++, walk_next(&w)) out[i] = ir_scalar_binary(fn, a[w.off[0]], b[w.off[1]]);
  return true;
}

static bool eval_select(Ctx *c, const IrOp *op, double *out) {
  Walk w;
  walk_init(&w, shape_of(op->result));
  for (int i = 0; i < 3; i++)
    if (!walk_add_bcast(&w, shape_of(op->args[i]))) return fail(c, "select: operands do not broadcast");
  const double *cond = in(c, op, 0), *a = in(c, op, 1), *b = in(c, op, 2);
  int64_t n = numel_of(op->result);
  for (int64_t i = 0; i < n; i++, walk_next(&w)) out[i] = cond[w.off[0]] != 0 ? a[w.off[1]] : b[w.off[2]];
  return true;
}

/* ------------------------------------------------------------------ */
/* Reductions                                                          */
/* ------------------------------------------------------------------ */

/* Which input axes an op reduces (attr axes; empty or absent = all). */
static bool reduced_axes(Ctx *c, const IrOp *op, const IrShape *s, bool *red) {
  const int64_t *ax;
  int n = ir_attr_get_ints(op, "axes", &ax);
  for (int k = 0; k < s->rank; k++) red[k] = n == 0;
  for (int i = 0; i < n; i++) {
    int64_t a;
    if (!ir_norm_axis(ax[i], s->rank, &a))
      return fail(c, "%s: axis %lld out of range for rank %d", opname(op), (long long)ax[i], s->rank);
    red[a] = true;
  }
  return true;
}

static bool eval_reduce(Ctx *c, const IrOp *op, double *out) {
  const IrShape *s = shape_of(op->args[0]);
  bool red[IR_MAX_RANK];
  if (!reduced_axes(c, op, s, red)) return false;
  /* Output stride of each input axis: 0 along reduced axes. */
  int64_t ost[IR_MAX_RANK], m = 1, cnt = 1;
  for (int k = s->rank - 1; k >= 0; k--) {
    if (red[k]) {
      ost[k] = 0;
      cnt *= s->dim[k];
    } else {
      ost[k] = m;
      m *= s->dim[k];
    }
  }
  int64_t nout = numel_of(op->result), nin = ir_numel(s);
  if (m != nout) return fail(c, "%s: result size %lld does not match the reduction", opname(op), (long long)nout);
  const double *x = in(c, op, 0);
  Walk w;
  walk_init(&w, s);
  walk_add_strided(&w, ost, 0);
  if (op->opcode == IR_OP_SUM || op->opcode == IR_OP_MEAN) {
    for (int64_t i = 0; i < nout; i++) out[i] = 0;
    for (int64_t i = 0; i < nin; i++, walk_next(&w)) out[w.off[0]] += x[i];
    if (op->opcode == IR_OP_MEAN)
      for (int64_t i = 0; i < nout; i++) out[i] /= (double)cnt;
    return true;
  }
  /* max, and the maximum that logsumexp subtracts. */
  for (int64_t i = 0; i < nout; i++) out[i] = -INFINITY;
  for (int64_t i = 0; i < nin; i++, walk_next(&w)) {
    double *o = &out[w.off[0]];
    if (isnan(x[i]) || x[i] > *o) *o = x[i];
  }
  if (op->opcode == IR_OP_MAX) return true;
  /* logsumexp: m + log(sum(exp(x - m))) with m the row maximum. */
  double *sum = alloc_vals(nout);
  walk_init(&w, s);
  walk_add_strided(&w, ost, 0);
  for (int64_t i = 0; i < nin; i++, walk_next(&w)) {
    double mx = out[w.off[0]];
    if (isfinite(mx)) sum[w.off[0]] += exp(x[i] - mx);
  }
  for (int64_t i = 0; i < nout; i++)
    if (isfinite(out[i])) out[i] += log(sum[i]); /* -inf (all -inf), +inf and NaN stay */
  free(sum);
  return true;
}

/* ------------------------------------------------------------------ */
/* Data movement                                                       */
/* ------------------------------------------------------------------ */

static bool eval_copy(Ctx *c, const IrOp *op, double *out) {
  int64_t n = numel_of(op->result);
  if (numel_of(op->args[0]) != n) return fail(c, "%s: operand and result sizes differ", opname(op));
  if (n > 0) memcpy(out, in(c, op, 0), sizeof(double) * (size_t)n);
  return true;
}

static bool eval_permute(Ctx *c, const IrOp *op, double *out) {
  const IrShape *s = shape_of(op->args[0]), *o = shape_of(op->result);
  const int64_t *perm;
  int n = ir_attr_get_ints(op, "perm", &perm);
  if (n != s->rank || o->rank != s->rank) return fail(c, "permute: perm does not match the operand's rank");
  int64_t cs[IR_MAX_RANK], st[IR_MAX_RANK];
  contiguous_strides(s, cs);
  bool used[IR_MAX_RANK] = {0};
  for (int k = 0; k < n; k++) {
    if (perm[k] < 0 || perm[k] >= n || used[perm[k]] || o->dim[k] != s->dim[perm[k]])
      return fail(c, "permute: invalid perm");
    used[perm[k]] = true;
    st[k] = cs[perm[k]];
  }
  Walk w;
  walk_init(&w, o);
  walk_add_strided(&w, st, 0);
  const double *x = in(c, op, 0);
  int64_t total = ir_numel(o);
  for (int64_t i = 0; i < total; i++, walk_next(&w)) out[i] = x[w.off[0]];
  return true;
}

static bool eval_broadcast(Ctx *c, const IrOp *op, double *out) {
  Walk w;
  walk_init(&w, shape_of(op->result));
  if (!walk_add_bcast(&w, shape_of(op->args[0]))) return fail(c, "broadcast: operand does not broadcast");
  const double *x = in(c, op, 0);
  int64_t n = numel_of(op->result);
  for (int64_t i = 0; i < n; i++, walk_next(&w)) out[i] = x[w.off[0]];
  return true;
}

/* The strides and base offset that address the slice region of a tensor
 * of shape `full` (one range per axis; missing trailing ranges are whole),
 * checked against the shape of the region `part`. */
static bool slice_region(Ctx *c, const IrOp *op, const IrShape *full, const IrShape *part, int64_t *stride,
                         int64_t *base) {
  const int64_t *starts, *stops, *steps;
  int ns = ir_attr_get_ints(op, "starts", &starts);
  int ne = ir_attr_get_ints(op, "stops", &stops);
  int np = ir_attr_get_ints(op, "steps", &steps);
  if (ns > full->rank || ne > full->rank || np > full->rank || part->rank != full->rank)
    return fail(c, "%s: slice attributes do not match rank %d", opname(op), full->rank);
  int64_t cs[IR_MAX_RANK];
  contiguous_strides(full, cs);
  *base = 0;
  for (int k = 0; k < full->rank; k++) {
    int64_t start = k < ns ? starts[k] : 0;
    int64_t stop = k < ne ? stops[k] : full->dim[k];
    int64_t step = k < np ? steps[k] : 1;
    if (step == 0) return fail(c, "%s: step 0 on axis %d", opname(op), k);
    int64_t len = slice_indices(full->dim[k], &start, stop, step);
    if (len != part->dim[k])
      return fail(c, "%s: axis %d: slice has %lld elements, the type says %lld", opname(op), k, (long long)len,
                  (long long)part->dim[k]);
    stride[k] = step * cs[k];
    if (len > 0) *base += start * cs[k];
  }
  return true;
}

static bool eval_slice(Ctx *c, const IrOp *op, double *out) {
  const IrShape *s = shape_of(op->args[0]), *o = shape_of(op->result);
  int64_t st[IR_MAX_RANK], base;
  if (!slice_region(c, op, s, o, st, &base)) return false;
  Walk w;
  walk_init(&w, o);
  walk_add_strided(&w, st, base);
  const double *x = in(c, op, 0);
  int64_t n = ir_numel(o);
  for (int64_t i = 0; i < n; i++, walk_next(&w)) out[i] = x[w.off[0]];
  return true;
}

static bool eval_unslice(Ctx *c, const IrOp *op, double *out) {
  const IrShape *s = shape_of(op->args[0]), *o = shape_of(op->result);
  int64_t st[IR_MAX_RANK], base;
  if (!slice_region(c, op, o, s, st, &base)) return false;
  Walk w;
  walk_init(&w, s);
  walk_add_strided(&w, st, base);
  const double *x = in(c, op, 0);
  int64_t n = ir_numel(s);
  for (int64_t i = 0; i < n; i++, walk_next(&w)) out[w.off[0]] = x[i]; /* out starts zeroed */
  return true;
}

static bool eval_concat(Ctx *c, const IrOp *op, double *out) {
  const IrShape *o = shape_of(op->result);
  int64_t axis;
  if (!ir_norm_axis(ir_attr_get_int(op, "axis", 0), o->rank, &axis)) return fail(c, "concat: axis out of range");
  int64_t outer = 1, inner = 1;
  for (int k = 0; k < axis; k++) outer *= o->dim[k];
  for (int k = (int)axis + 1; k < o->rank; k++) inner *= o->dim[k];
  int64_t total = 0;
  for (int i = 0; i < op->nargs; i++) {
    const IrShape *s = shape_of(op->args[i]);
    if (s->rank != o->rank) return fail(c, "concat: operand ranks differ");
    total += s->dim[axis];
  }
  if (total != o->dim[axis]) return fail(c, "concat: sizes along the axis do not add up");
  int64_t row = o->dim[axis] * inner, at = 0;
  for (int i = 0; i < op->nargs; i++) {
    int64_t chunk = shape_of(op->args[i])->dim[axis] * inner;
    const double *x = in(c, op, i);
    for (int64_t r = 0; r < outer; r++)
      if (chunk > 0) memcpy(out + r * row + at, x + r * chunk, sizeof(double) * (size_t)chunk);
    at += chunk;
  }
  return true;
}

/* ------------------------------------------------------------------ */
/* Matrix product (torch.matmul)                                       */
/* ------------------------------------------------------------------ */
static bool eval_matmul(Ctx *c, const IrOp *op, double *out) {
  const IrShape *as = shape_of(op->args[0]), *bs = shape_of(op->args[1]);
  if (as->rank < 1 || bs->rank < 1) return fail(c, "matmul: operands must have rank >= 1");
  /* A 1-D left operand is a row [1, K], a 1-D right one a column [K, 1];
   * the added axis is dropped from the result (numel is unchanged). */
  int64_t M = as->rank == 1 ? 1 : as->dim[as->rank - 2], K = as->dim[as->rank - 1];
  int64_t K2 = bs->rank == 1 ? bs->dim[0] : bs->dim[bs->rank - 2], N = bs->rank == 1 ? 1 : bs->dim[bs->rank - 1];
  if (K != K2) return fail(c, "matmul: inner dimensions %lld and %lld differ", (long long)K, (long long)K2);
  IrShape ab = {0}, bb = {0}, batch;
  ab.rank = as->rank > 2 ? as->rank - 2 : 0;
  bb.rank = bs->rank > 2 ? bs->rank - 2 : 0;
  for (int k = 0; k < ab.rank; k++) ab.dim[k] = as->dim[k];
  for (int k = 0; k < bb.rank; k++) bb.dim[k] = bs->dim[k];
  if (!ir_broadcast_shapes(&ab, &bb, &batch)) return fail(c, "matmul: batch dimensions do not broadcast");
  int64_t nb = ir_numel(&batch);
  if (nb * M * N != numel_of(op->result)) return fail(c, "matmul: result size does not match");
  Walk w;
  walk_init(&w, &batch);
  walk_add_bcast(&w, &ab);
  walk_add_bcast(&w, &bb);
  const double *A = in(c, op, 0), *B = in(c, op, 1);
  for (int64_t t = 0; t < nb; t++, walk_next(&w)) {
    const double *a = A + w.off[0] * M * K, *b = B + w.off[1] * K * N;
    double *y = out + t * M * N;
    for (int64_t i = 0; i < M; i++) {
      double *yr = y + i * N;
      for (int64_t j = 0; j < N; j++) yr[j] = 0;
      for (int64_t k = 0; k < K; k++) {
        double aik = a[i * K + k];
        const double *br = b + k * N;
        for (int64_t j = 0; j < N; j++) yr[j] += aik * br[j];
      }
    }
  }
  return true;
}

/* ------------------------------------------------------------------ */
/* Row-wise neural-network ops                                         */
/* ------------------------------------------------------------------ */

static bool eval_softmax(Ctx *c, const IrOp *op, double *out, bool logsm) {
  const IrShape *s = shape_of(op->args[0]);
  int64_t axis;
  if (!ir_norm_axis(ir_attr_get_int(op, "axis", -1), s->rank, &axis))
    return fail(c, "%s: axis out of range", opname(op));
  if (s->rank == 0) { /* a scalar is a row of one */
    out[0] = logsm ? in(c, op, 0)[0] - in(c, op, 0)[0] : 1.0;
    return true;
  }
  int64_t outer = 1, inner = 1, L = s->dim[axis];
  for (int k = 0; k < axis; k++) outer *= s->dim[k];
  for (int k = (int)axis + 1; k < s->rank; k++) inner *= s->dim[k];
  const double *x = in(c, op, 0);
  for (int64_t o = 0; o < outer; o++)
    for (int64_t i = 0; i < inner; i++) {
      const double *xr = x + o * L * inner + i;
      double *yr = out + o * L * inner + i;
      double m = -INFINITY, sum = 0;
      for (int64_t l = 0; l < L; l++)
        if (isnan(xr[l * inner]) || xr[l * inner] > m) m = xr[l * inner];
      for (int64_t l = 0; l < L; l++) sum += exp(xr[l * inner] - m);
      for (int64_t l = 0; l < L; l++)
        yr[l * inner] = logsm ? xr[l * inner] - m - log(sum) : exp(xr[l * inner] - m) / sum;
    }
  return true;
}

/* The per-column parameter of a row op (weight, bias): [D] or a scalar. */
static bool row_param(Ctx *c, const IrOp *op, int i, int64_t D, int64_t *step) {
  int64_t n = numel_of(op->args[i]);
  if (n == D) *step = 1;
  else if (n == 1) *step = 0;
  else return fail(c, "%s: operand %d has %lld elements, expected %lld", opname(op), i + 1, (long long)n, (long long)D);
  return true;
}

static bool eval_norm(Ctx *c, const IrOp *op, double *out, bool layer) {
  const IrShape *s = shape_of(op->args[0]);
  int64_t D = s->rank ? s->dim[s->rank - 1] : 1, n = ir_numel(s);
  int64_t rows = D ? n / D : 0, ws = 0, bs = 0;
  double eps = ir_op_eps(op);
  if (!row_param(c, op, 1, D, &ws) || (layer && !row_param(c, op, 2, D, &bs))) return false;
  const double *x = in(c, op, 0), *wt = in(c, op, 1), *bias = layer ? in(c, op, 2) : NULL;
  for (int64_t r = 0; r < rows; r++) {
    const double *xr = x + r * D;
    double *yr = out + r * D;
    if (layer) {
      double mean = 0, var = 0;
      for (int64_t j = 0; j < D; j++) mean += xr[j];
      mean /= (double)D;
      for (int64_t j = 0; j < D; j++) var += (xr[j] - mean) * (xr[j] - mean);
      var /= (double)D;
      double inv = 1.0 / sqrt(var + eps);
      for (int64_t j = 0; j < D; j++) yr[j] = (xr[j] - mean) * inv * wt[j * ws] + bias[j * bs];
    } else {
      double ms = 0;
      for (int64_t j = 0; j < D; j++) ms += xr[j] * xr[j];
      ms /= (double)D;
      double inv = 1.0 / sqrt(ms + eps);
      for (int64_t j = 0; j < D; j++) yr[j] = xr[j] * inv * wt[j * ws];
    }
  }
  return true;
}

static bool eval_causal_mask(Ctx *c, const IrOp *op, double *out) {
  const IrShape *s = shape_of(op->args[0]);
  int64_t C = s->rank >= 1 ? s->dim[s->rank - 1] : 1, R = s->rank >= 2 ? s->dim[s->rank - 2] : 1;
  const double *x = in(c, op, 0);
  int64_t n = ir_numel(s);
  for (int64_t t = 0; t < n; t++) {
    int64_t j = t % C, i = (t / C) % R;
    out[t] = j > i ? -INFINITY : x[t];
  }
  return true;
}

/* Whether an index (held as a double) lies in [lo, hi). */
static bool index_ok(double v, int64_t lo, int64_t hi) { return v >= (double)lo && v < (double)hi; }

static bool eval_embedding(Ctx *c, const IrOp *op, double *out) {
  const IrShape *ts = shape_of(op->args[1]);
  if (ts->rank != 2) return fail(c, "embedding: table must have rank 2");
  int64_t V = ts->dim[0], D = ts->dim[1], n = numel_of(op->args[0]);
  if (n * D != numel_of(op->result)) return fail(c, "embedding: result size does not match");
  const double *idx = in(c, op, 0), *tab = in(c, op, 1);
  for (int64_t p = 0; p < n; p++) {
    if (!index_ok(idx[p], 0, V))
      return fail(c, "embedding: index %lld out of range [0, %lld)", (long long)idx[p], (long long)V);
    int64_t r = (int64_t)idx[p];
    if (D > 0) memcpy(out + p * D, tab + r * D, sizeof(double) * (size_t)D);
  }
  return true;
}

static bool eval_embedding_grad(Ctx *c, const IrOp *op, double *out) {
  const IrShape *o = shape_of(op->result);
  if (o->rank != 2) return fail(c, "embedding_grad: result must have rank 2");
  int64_t rows = o->dim[0], D = o->dim[1], n = numel_of(op->args[0]);
  if (n * D != numel_of(op->args[1])) return fail(c, "embedding_grad: dy size does not match the indices");
  const double *idx = in(c, op, 0), *dy = in(c, op, 1);
  for (int64_t p = 0; p < n; p++) {
    if (!index_ok(idx[p], 0, rows))
      return fail(c, "embedding_grad: index %lld out of range [0, %lld)", (long long)idx[p], (long long)rows);
    int64_t r = (int64_t)idx[p];
    for (int64_t j = 0; j < D; j++) out[r * D + j] += dy[p * D + j];
  }
  return true;
}

/* patches (im2col): element [l..., k..., o...] is x[l..., o*stride -
 * padding + k*dilation] along each spatial axis, or value where that
 * position is outside x.  patches_grad, its adjoint: each element of dy
 * added to the position it was read from (positions in the padding read
 * nothing).  Both walk the patches' elements in order. */
static bool eval_patches(Ctx *c, const IrOp *op, double *out, bool adjoint) {
  IrPatches g;
  char why[256];
  if (!ir_patches_geom(op, &g, why, sizeof why)) return fail(c, "%s", why);
  const double *x = in(c, op, 0);
  int64_t ist[IR_MAX_RANK];
  int64_t m = 1;
  for (int k = g.image.rank - 1; k >= 0; k--) ist[k] = m, m *= g.image.dim[k];
  Walk w;
  walk_init(&w, &g.cols);
  int64_t n = ir_numel(&g.cols);
  for (int64_t e = 0; e < n; e++, walk_next(&w)) {
    int64_t off = 0;
    bool inside = true;
    for (int i = 0; i < g.lead; i++) off += w.idx[i] * ist[i];
    for (int i = 0; i < g.d; i++) {
      int64_t k = w.idx[g.lead + i], o = w.idx[g.lead + g.d + i];
      int64_t pos = o * g.stride[i] - g.padding[i] + k * g.dilation[i];
      if (pos < 0 || pos >= g.in[i]) inside = false;
      off += pos * ist[g.lead + i];
    }
    if (adjoint) {
      if (inside) out[off] += x[e];
    } else {
      out[e] = inside ? x[off] : g.value;
    }
  }
  return true;
}

/* ---- language v2: arange, gather, gather_grad, topk ---- */

static bool eval_arange(Ctx *c, const IrOp *op, double *out) {
  (void)c;
  int64_t n = numel_of(op->result);
  for (int64_t i = 0; i < n; i++) out[i] = (double)i;
  return true;
}

/* The element of `full` (contiguous) that element e of `part` addresses when
 * its coordinate along axis is replaced by t: part and full differ only
 * along axis. */
static int64_t gather_offset(const IrShape *part, const IrShape *full, int64_t axis, int64_t e, int64_t t) {
  int64_t off = 0, stride = 1;
  for (int d = part->rank - 1; d >= 0; d--) {
    int64_t cd = e % part->dim[d];
    e /= part->dim[d];
    off += (d == axis ? t : cd) * stride;
    stride *= full->dim[d];
  }
  return off;
}

/* gather (grad false): out[e] = x[.., idx[e], ..]; gather_grad (grad true):
 * out[.., idx[e], ..] += dy[e].  An index outside [0, dim) is an error. */
static bool eval_gather(Ctx *c, const IrOp *op, double *out, bool grad) {
  const IrValue *iv = op->args[grad ? 0 : 1];
  const IrShape *part = shape_of(iv), *full = grad ? shape_of(op->result) : shape_of(op->args[0]);
  int64_t axis;
  if (!ir_norm_axis(ir_attr_get_int(op, "axis", 0), full->rank, &axis)) return fail(c, "%s: bad axis", opname(op));
  const double *idx = in(c, op, grad ? 0 : 1), *src = in(c, op, grad ? 1 : 0);
  int64_t n = numel_of(iv), len = full->dim[axis];
  for (int64_t e = 0; e < n; e++) {
    if (!index_ok(idx[e], 0, len))
      return fail(c, "%s: index %lld out of range [0, %lld)", opname(op), (long long)idx[e], (long long)len);
    int64_t o = gather_offset(part, full, axis, e, (int64_t)idx[e]);
    if (grad)
      out[o] += src[e];
    else
      out[e] = src[o];
  }
  return true;
}

/* topk's order: larger first, NaN largest of all, ties by the lower index. */
typedef struct TopkItem {
  double v;
  int64_t i;
} TopkItem;

static int topk_cmp(const void *pa, const void *pb) {
  const TopkItem *a = pa, *b = pb;
  bool na = isnan(a->v), nb = isnan(b->v);
  if (na != nb) return na ? -1 : 1;
  if (!na && a->v != b->v) return a->v > b->v ? -1 : 1;
  return a->i < b->i ? -1 : a->i > b->i;
}

/* topk: sort each line along axis, keep the first k indices. */
static bool eval_topk(Ctx *c, const IrOp *op, double *out) {
  const IrShape *s = shape_of(op->args[0]);
  int64_t axis, k = ir_attr_get_int(op, "k", 1);
  if (!ir_norm_axis(ir_attr_get_int(op, "axis", -1), s->rank, &axis)) return fail(c, "topk: bad axis");
  int64_t len = s->dim[axis], inner = 1, outer = 1;
  for (int d = (int)axis + 1; d < s->rank; d++) inner *= s->dim[d];
  for (int d = 0; d < axis; d++) outer *= s->dim[d];
  if (k < 1 || k > len) return fail(c, "topk: k = %lld out of range", (long long)k);
  const double *x = in(c, op, 0);
  TopkItem *line = calloc((size_t)len, sizeof *line);
  if (!line) abort();
  for (int64_t o = 0; o < outer; o++)
    for (int64_t i = 0; i < inner; i++) {
      for (int64_t t = 0; t < len; t++) line[t] = (TopkItem){x[(o * len + t) * inner + i], t};
      qsort(line, (size_t)len, sizeof *line, topk_cmp);
      for (int64_t r = 0; r < k; r++) out[(o * k + r) * inner + i] = (double)line[r].i;
    }
  free(line);
  return true;
}

typedef enum { RED_NONE, RED_SUM, RED_MEAN } Reduction;

/* *r is set on failure too (RED_MEAN), so that no caller reads it unset. */
static bool reduction_attr(Ctx *c, const IrOp *op, Reduction *r) {
  const char *s = ir_attr_get_str(op, "reduction", "mean");
  *r = RED_MEAN;
  if (strcmp(s, "mean") == 0) *r = RED_MEAN;
  else if (strcmp(s, "sum") == 0) *r = RED_SUM;
  else if (strcmp(s, "none") == 0) *r = RED_NONE;
  else return fail(c, "%s: unknown reduction '%s'", opname(op), s);
  return true;
}

static bool eval_cross_entropy(Ctx *c, const IrOp *op, double *out) {
  Reduction red;
  if (!reduction_attr(c, op, &red)) return false;
  const IrShape *ls = shape_of(op->args[0]);
  if (ls->rank < 1) return fail(c, "cross_entropy: logits must have rank >= 1");
  int64_t V = ls->dim[ls->rank - 1], n = numel_of(op->args[1]);
  if (n * V != ir_numel(ls)) return fail(c, "cross_entropy: logits and target sizes do not match");
  if (numel_of(op->result) != (red == RED_NONE ? n : 1)) return fail(c, "cross_entropy: result size does not match");
  int64_t ignore = ir_attr_get_int(op, "ignore_index", -100);
  const double *x = in(c, op, 0), *t = in(c, op, 1);
  double total = 0;
  int64_t count = 0;
  for (int64_t p = 0; p < n; p++) {
    double loss = 0;
    if (t[p] != (double)ignore) {
      if (!index_ok(t[p], 0, V))
        return fail(c, "cross_entropy: target %lld out of range [0, %lld)", (long long)t[p], (long long)V);
      const double *row = x + p * V;
      double m = -INFINITY, sum = 0;
      for (int64_t v = 0; v < V; v++)
        if (isnan(row[v]) || row[v] > m) m = row[v];
      for (int64_t v = 0; v < V; v++) sum += exp(row[v] - m);
      double lse = isfinite(m) ? m + log(sum) : m;
      loss = lse - row[(int64_t)t[p]];
      count++;
    }
    if (red == RED_NONE) out[p] = loss;
    total += loss;
  }
  if (red == RED_SUM) out[0] = total;
  if (red == RED_MEAN) out[0] = total / (double)(count > 1 ? count : 1);
  return true;
}

static bool eval_one_hot(Ctx *c, const IrOp *op, double *out) {
  int64_t depth = ir_attr_get_int(op, "depth", -1), n = numel_of(op->args[0]);
  if (depth < 0 || n * depth != numel_of(op->result)) return fail(c, "one_hot: depth does not match the result");
  int64_t ignore = ir_attr_get_int(op, "ignore_index", -100);
  const double *t = in(c, op, 0);
  for (int64_t p = 0; p < n; p++) {
    if (t[p] == (double)ignore) continue; /* the row stays zero */
    if (!index_ok(t[p], 0, depth))
      return fail(c, "one_hot: target %lld out of range [0, %lld)", (long long)t[p], (long long)depth);
    out[p * depth + (int64_t)t[p]] = 1;
  }
  return true;
}

static bool eval_mse_loss(Ctx *c, const IrOp *op, double *out) {
  Reduction red;
  if (!reduction_attr(c, op, &red)) return false;
  IrShape s;
  if (!ir_broadcast_shapes(shape_of(op->args[0]), shape_of(op->args[1]), &s))
    return fail(c, "mse_loss: operands do not broadcast");
  int64_t n = ir_numel(&s);
  if (numel_of(op->result) != (red == RED_NONE ? n : 1)) return fail(c, "mse_loss: result size does not match");
  Walk w;
  walk_init(&w, &s);
  walk_add_bcast(&w, shape_of(op->args[0]));
  walk_add_bcast(&w, shape_of(op->args[1]));
  const double *a = in(c, op, 0), *b = in(c, op, 1);
  double total = 0;
  for (int64_t i = 0; i < n; i++, walk_next(&w)) {
    double d = a[w.off[0]] - b[w.off[1]];
    if (red == RED_NONE) out[i] = d * d;
    total += d * d;
  }
  if (red == RED_SUM) out[0] = total;
  if (red == RED_MEAN) out[0] = total / (double)n;
  return true;
}

/* ------------------------------------------------------------------ */
/* Window and collective ops                                           */
/* ------------------------------------------------------------------ */

static bool eval_window_sum(Ctx *c, const IrOp *op, double *out) {
  int id = op->result->id;
  if (c->phase != INTERP_STEP || !c->window_sums || !c->window_sums[id])
    return fail(c, "window.sum: no window value for %%%d (window.sum operands must not depend on window sums)", id);
  int64_t n = numel_of(op->result);
  if (n > 0) memcpy(out, c->window_sums[id], sizeof(double) * (size_t)n);
  return true;
}

/* rng.state: the words the step driver set for this micro-batch, as the
 * i32 an executor's arena holds. */
static bool eval_rng_state(Ctx *c, const IrOp *op, double *out) {
  (void)op;
  for (int i = 0; i < IR_RNG_WORDS; i++) out[i] = (double)(int32_t)c->st->rng[i];
  return true;
}

/* random: element e draws Philox's block for its counter (ir/random.c). */
static bool eval_random(Ctx *c, const IrOp *op, double *out) {
  const double *s = in(c, op, 0);
  uint32_t state[IR_RNG_WORDS], w[4];
  for (int i = 0; i < IR_RNG_WORDS; i++) state[i] = (uint32_t)(int32_t)s[i];
  bool normal = strcmp(ir_attr_get_str(op, "dist", "uniform"), "normal") == 0;
  IrDType dt = op->result->type.dtype;
  int64_t n = numel_of(op->result);
  for (int64_t e = 0; e < n; e++) {
    ir_random_bits(op, state, e, w);
    out[e] = ir_random_value(normal, dt, w);
  }
  return true;
}

static bool eval_grad_seed(Ctx *c, const IrOp *op, double *out) {
  const double *x = in(c, op, 0);
  int64_t n = numel_of(op->result);
  if (numel_of(op->args[0]) != n) return fail(c, "%s: operand and result sizes differ", opname(op));
  double coef = ir_attr_get_float(op, "coef", 1.0);
  for (int64_t i = 0; i < n; i++) out[i] = ir_scalar_binary(IR_OP_MUL, x[i], coef);
  return true;
}

/* A start hands its operand to the comm layer (comm_step.c), which owns
 * the buffer the collective writes; the matching wait completes it into
 * its own result.  The start's result holds nothing.  A data-parallel
 * gradient reduction (last=true) is the identity here: the step layer sums
 * the window's gradients over the ranks after the window (step_dp_end),
 * which is the same value. */
static bool eval_collective(Ctx *c, const IrOp *op, double *out) {
  if (step_coll_last(op) || op->opcode == IR_OP_TP_COPY) return eval_copy(c, op, out);
  bool start = ir_op_is(op->opcode, IR_OPF_START);
  int id = start ? op->result->id : op->args[0]->id;
  if (!c->coll) {
    c->coll = calloc((size_t)c->st->f->nvalues + 1, sizeof(StepColl));
    if (!c->coll) abort();
  }
  char why[1024];
  if (start ? step_coll_start(&c->coll[id], op, true, in(c, op, 0), NULL, why, sizeof why)
            : step_coll_wait(&c->coll[id], out, why, sizeof why))
    return true;
  return fail(c, "%s: %s", opname(op), why);
}

/* tp.scatter, rank.slice, rank.concat: copies that depend on this rank
 * in the op's group (comm_step.c), the identity with ranks=1. */
enum { MAX_CONCAT = 1024 }; /* rank.concat operands */

static bool eval_rank_copy(Ctx *c, const IrOp *op, double *out) {
  int rank;
  char why[1024];
  if (!step_rank_of(op, &rank, why, sizeof why)) return fail(c, "%s: %s", opname(op), why);
  const void *src[MAX_CONCAT];
  if (op->nargs > MAX_CONCAT) return fail(c, "%s: too many operands", opname(op));
  for (int j = 0; j < op->nargs; j++) src[j] = in(c, op, j);
  step_rank_copy(op, rank, sizeof(double), src, out);
  return true;
}

/* ------------------------------------------------------------------ */
/* Dispatch                                                            */
/* ------------------------------------------------------------------ */

/* Compute op's result into out (zeroed, numel of the result). */
static bool eval(Ctx *c, const IrOp *op, double *out) {
  switch (op->opcode) {
  IR_CASES(UNARY) return map1(c, op, out);
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
  case IR_OP_GE: return map2(c, op, out, op->opcode);
  case IR_OP_SELECT: return eval_select(c, op, out);
  case IR_OP_CONST: {
    double v = ir_attr_get_float(op, "value", 0.0);
    int64_t n = numel_of(op->result);
    for (int64_t i = 0; i < n; i++) out[i] = v;
    return true;
  }
  case IR_OP_SUM:
  case IR_OP_MEAN:
  case IR_OP_MAX:
  case IR_OP_LOGSUMEXP: return eval_reduce(c, op, out);
  case IR_OP_RESHAPE: return eval_copy(c, op, out);
  case IR_OP_PERMUTE: return eval_permute(c, op, out);
  case IR_OP_BROADCAST: return eval_broadcast(c, op, out);
  case IR_OP_SLICE: return eval_slice(c, op, out);
  case IR_OP_UNSLICE: return eval_unslice(c, op, out);
  case IR_OP_CONCAT: return eval_concat(c, op, out);
  case IR_OP_MATMUL: return eval_matmul(c, op, out);
  case IR_OP_SOFTMAX: return eval_softmax(c, op, out, false);
  case IR_OP_LOG_SOFTMAX: return eval_softmax(c, op, out, true);
  case IR_OP_LAYER_NORM: return eval_norm(c, op, out, true);
  case IR_OP_RMS_NORM: return eval_norm(c, op, out, false);
  case IR_OP_CAUSAL_MASK: return eval_causal_mask(c, op, out);
  case IR_OP_EMBEDDING: return eval_embedding(c, op, out);
  case IR_OP_EMBEDDING_GRAD: return eval_embedding_grad(c, op, out);
  case IR_OP_CROSS_ENTROPY: return eval_cross_entropy(c, op, out);
  case IR_OP_ONE_HOT: return eval_one_hot(c, op, out);
  case IR_OP_MSE_LOSS: return eval_mse_loss(c, op, out);
  case IR_OP_PATCHES: return eval_patches(c, op, out, false);
  case IR_OP_PATCHES_GRAD: return eval_patches(c, op, out, true);
  case IR_OP_ARANGE: return eval_arange(c, op, out);
  case IR_OP_GATHER: return eval_gather(c, op, out, false);
  case IR_OP_GATHER_GRAD: return eval_gather(c, op, out, true);
  case IR_OP_TOPK: return eval_topk(c, op, out);
  case IR_OP_WINDOW_SUM: return eval_window_sum(c, op, out);
  case IR_OP_GRAD_SEED: return eval_grad_seed(c, op, out);
  /* Randomness */
  case IR_OP_RNG_STATE: return eval_rng_state(c, op, out);
  case IR_OP_LOSS_SCALE: return out[0] = c->st->loss_scale != 0 ? c->st->loss_scale : 1.0, true;
  case IR_OP_RANDOM: return eval_random(c, op, out);
  case IR_OP_LOSS_TERM: return map2(c, op, out, IR_OP_MUL);
  case IR_OP_ALL_REDUCE_START:
  case IR_OP_ALL_GATHER_START:
  case IR_OP_REDUCE_SCATTER_START: return eval_collective(c, op, out);
  case IR_OP_ALL_REDUCE_WAIT:
  case IR_OP_ALL_GATHER_WAIT:
  case IR_OP_TP_COPY:
  case IR_OP_REDUCE_SCATTER_WAIT: return eval_collective(c, op, out);
  case IR_OP_TP_SCATTER:
  case IR_OP_RANK_SLICE:
  case IR_OP_RANK_CONCAT: return eval_rank_copy(c, op, out);
  case IR_OP_LOSS:
  case IR_OP_GRAD:
  case IR_OP_OUTPUT:
  case IR_OP_UPDATE: return true; /* outputs: the caller reads their operands */
  }
  return fail(c, "unknown opcode %d", (int)op->opcode);
}

void interp_free(InterpState *st) {
  if (st->val && st->f)
    for (int i = 0; i < st->f->nvalues; i++) free(st->val[i]);
  free(st->val);
  st->val = NULL;
  st->f = NULL;
}

int interp_index_operand(const IrOp *op) {
  if (op->opcode == IR_OP_EMBEDDING || op->opcode == IR_OP_EMBEDDING_GRAD || op->opcode == IR_OP_ONE_HOT) return 0;
  if (op->opcode == IR_OP_CROSS_ENTROPY || op->opcode == IR_OP_GATHER) return 1;
  if (op->opcode == IR_OP_GATHER_GRAD) return 0;
  return -1;
}

bool interp_index_range(const IrOp *op, InterpIndexRange *r) {
  if (interp_index_operand(op) < 0) return false;
  r->ignorable = op->opcode == IR_OP_CROSS_ENTROPY || op->opcode == IR_OP_ONE_HOT;
  r->what = "index";
  if (op->opcode == IR_OP_EMBEDDING) r->hi = op->args[1]->type.shape.dim[0];
  else if (op->opcode == IR_OP_EMBEDDING_GRAD) r->hi = ir_attr_get_int(op, "rows", 0);
  else if (op->opcode == IR_OP_ONE_HOT) r->hi = ir_attr_get_int(op, "depth", 0);
  else if (op->opcode == IR_OP_GATHER || op->opcode == IR_OP_GATHER_GRAD) {
    const IrShape *fs = op->opcode == IR_OP_GATHER ? &op->args[0]->type.shape : &op->result->type.shape;
    int64_t axis = 0;
    ir_norm_axis(ir_attr_get_int(op, "axis", 0), fs->rank, &axis);
    r->hi = fs->dim[axis];
  } else {
    const IrShape *s = &op->args[0]->type.shape;
    r->hi = s->dim[s->rank - 1];
    r->what = "target";
  }
  r->ignore = ir_attr_get_int(op, "ignore_index", -100);
  return true;
}

/* Every index of op's index operand in its range (or the ignore_index). */
bool interp_check_indices(const IrOp *op, const double *v, int64_t n, int64_t first, char *err, size_t errlen) {
  InterpIndexRange ir = {0};
  if (!interp_index_range(op, &ir)) return true; /* no indices */
  for (int64_t k = 0; k < n; k++) {
    if (ir.ignorable && v[k] == (double)ir.ignore) continue;
    if (v[k] >= 0 && v[k] < (double)ir.hi) continue;
    if (err && errlen) {
      if (op->loc.file)
        snprintf(err, errlen, "%s at %s:%d:%d: %s %lld (element %lld) out of range [0, %lld)", opname(op),
                 op->loc.file, op->loc.line, op->loc.col, ir.what, (long long)v[k], (long long)(first + k),
                 (long long)ir.hi);
      else
        snprintf(err, errlen, "%s: %s %lld (element %lld) out of range [0, %lld)", opname(op), ir.what,
                 (long long)v[k], (long long)(first + k), (long long)ir.hi);
    }
    return false;
  }
  return true;
}

InterpCountPlan *interp_count_plan_new(const IrFunc *f) {
  InterpCountPlan *p = mem_calloc(1, sizeof *p);
  bool *need = mem_calloc((size_t)f->nvalues + 1, sizeof(bool));
  for (int i = 0; i < f->nops; i++) {
    const IrOp *op = f->ops[i];
    int ix = interp_index_operand(op);
    if (op->opcode == IR_OP_WINDOW_SUM) p->nsums++, need[op->args[0]->id] = true;
    if (ix >= 0) p->nchecks++, need[op->args[ix]->id] = true;
  }
  for (int i = f->nops - 1; i >= 0; i--) {
    const IrOp *op = f->ops[i];
    if (op->result && need[op->result->id])
      for (int j = 0; j < op->nargs; j++) need[op->args[j]->id] = true;
  }
  p->ops = mem_calloc((size_t)f->nops + 1, sizeof *p->ops);
  p->sums = mem_calloc((size_t)p->nsums + 1, sizeof *p->sums);
  p->checks = mem_calloc((size_t)p->nchecks + 1, sizeof *p->checks);
  p->nsums = p->nchecks = 0;
  for (int i = 0; i < f->nops; i++) {
    const IrOp *op = f->ops[i];
    if (op->result && need[op->result->id]) p->ops[p->nops++] = op;
    if (op->opcode == IR_OP_WINDOW_SUM) p->sums[p->nsums++] = op;
    if (interp_index_operand(op) >= 0) p->checks[p->nchecks++] = op;
  }
  p->arg_needed = mem_calloc((size_t)f->nargs + 1, sizeof(bool));
  for (int i = 0; i < f->nargs; i++) p->arg_needed[i] = need[f->args[i]->id];
  free(need);
  return p;
}

void interp_count_plan_free(InterpCountPlan *p) {
  if (!p) return;
  free(p->ops);
  free(p->sums);
  free(p->checks);
  free(p->arg_needed);
  free(p);
}

/* Evaluate one op into st->val (its operands must have values). */
static bool run_op(Ctx *c, const IrOp *op) {
  InterpState *st = c->st;
  for (int j = 0; j < op->nargs; j++) {
    const IrValue *a = op->args[j];
    if (!st->val[a->id])
      return fail(c, "%s: operand %d (%s%%%s) has no value", opname(op), j + 1, a->def ? "" : "argument ",
                  a->name ? a->name : "?");
  }
  if (!op->result) return eval(c, op, NULL);
  int64_t n = numel_of(op->result);
  double *out = alloc_vals(n);
  st->val[op->result->id] = out;
  bool ok = eval(c, op, out);
  if (ok && !c->opt->exact_f64)
    ir_round_dtype_n(out, n, op->result->type.dtype);
  return ok;
}

bool interp_run(InterpState *st, const IrFunc *f, double *const *args, double *const *window_sums,
                InterpPhase phase, const InterpOptions *opt, char *err, size_t errlen) {
  static const InterpOptions defaults = {0};
  Ctx c = {st, opt ? opt : &defaults, window_sums, phase, err, errlen, NULL};
  st->f = f;
  st->val = calloc((size_t)(f->nvalues > 0 ? f->nvalues : 1), sizeof(double *));
  if (!st->val) abort();
  for (int i = 0; i < f->nargs; i++) {
    const IrValue *a = f->args[i];
    if (!args || !args[i]) continue; /* an op that needs it reports it */
    int64_t n = numel_of(a);
    double *v = alloc_vals(n);
    memcpy(v, args[i], sizeof(double) * (size_t)n);
    if (!c.opt->exact_f64) ir_round_dtype_n(v, n, a->type.dtype);
    st->val[a->id] = v;
  }
  bool ok = true;
  if (phase == INTERP_COUNT) {
    /* Only what window.sum operands and index operands depend on runs. */
    InterpCountPlan *own = c.opt->count ? NULL : interp_count_plan_new(f);
    const InterpCountPlan *plan = own ? own : c.opt->count;
    for (int i = 0; ok && i < plan->nops; i++) ok = run_op(&c, plan->ops[i]);
    for (int i = 0; ok && i < plan->nchecks; i++) {
      const IrOp *op = plan->checks[i];
      const IrValue *x = op->args[interp_index_operand(op)];
      if (st->val[x->id]) ok = interp_check_indices(op, st->val[x->id], numel_of(x), 0, err, errlen);
    }
    interp_count_plan_free(own);
  } else {
    for (int i = 0; ok && i < f->nops; i++) ok = run_op(&c, f->ops[i]);
  }
  if (c.coll) {
    for (int i = 0; i < f->nvalues; i++) step_coll_free(&c.coll[i]);
    free(c.coll);
  }
  if (!ok) interp_free(st);
  return ok;
}
