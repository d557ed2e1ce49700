/* gas_fold.c - fold gradient-accumulation scaling into the objective root.
 *
 * DESIGN.md §3.  The step is compiled for one micro-batch; a window is K
 * of them (and every data-parallel rank's).  This pass rewrites every loss
 * as a sum of terms
 *
 *     loss = Σ_t  c_t · w_t · S_t          (%t = loss.term %S_t, %seed_t)
 *
 * where S_t is a sum over the micro-batch's samples (a batch `mean` becomes
 * a `sum`), c_t is the constant coefficient on the term's linear path to the
 * root, and w_t a run-time window weight computed with `window.sum`:
 *     1 / (samples in the window)          for a batch mean,
 *     1 / max(valid targets in window, 1)  for cross_entropy's mean,
 *     1 / (micro-batches in the window)    for a term that does not depend
 *                                          on the batch (counted once),
 *     1                                    for a plain sum over samples.
 * The seed `grad.seed %w {coef=c}` is the only place any scale lives;
 * autodiff seeds S_t with it, so no term is scaled twice or missed.  With
 * --precision f16 the window's loss scale joins it there and nowhere
 * else: `grad.seed (w * %loss_scale)`, %loss_scale = loss.scale, a value
 * the runtime writes (DESIGN.md §3 rule 7; the session divides the
 * reported losses and the gradients by it).
 * Summing every micro-batch's terms gives the full-batch value and gradient.
 *
 * To find the terms, every value is classified by how it depends on the
 * samples of the batch: independent of them, per-sample (with the axis that
 * indexes samples), a linear sum over samples, or something that mixes
 * samples non-linearly.  With K > 1 a loss of the last kind is refused at
 * the first op that mixes them; with K = 1 it is kept whole (w = 1).
 *
 * Requires: the frontend's forward function (loss outputs, no loss.term).
 * Guarantees: every loss output's operand is a sum of loss.term values; no
 * batch mean is left on a term's path; running it again changes nothing. */
#include <math.h>
#include <string.h>

#include "passes.h"

typedef enum {
  C_INDEP,  /* does not depend on the batch's samples */
  C_SAMPLE, /* per-sample: `axis` indexes the samples */
  C_SUM,    /* a linear combination of sums over samples */
  C_BAD,    /* mixes samples in a way that is not a sum over samples */
} Cls;

typedef enum {
  W_ONE,   /* plain sum over samples */
  W_BATCH, /* batch mean: 1 / window sample count */
  W_COUNT, /* cross_entropy mean: 1 / max(window valid-target count, 1) */
  W_ONCE,  /* batch-independent: 1 / number of micro-batches in the window */
} WKind;

typedef struct Info {
  Cls cls;
  int axis;          /* C_SAMPLE: the sample axis */
  int64_t per;       /* C_SAMPLE: elements per sample along that axis (> 1 once
                        the batch axis is merged with the axes after it) */
  WKind w;           /* C_SUM: the divisor its batch reductions carry */
  bool affine;       /* C_SUM: batch-independent values were added to it below
                        the loss's top level (split into two terms) */
  IrOp *wop;         /* W_COUNT: the cross_entropy that defines the count */
  IrOp *bad;         /* C_BAD: the op that mixed samples */
  const char *why;   /* C_BAD: why */
} Info;

typedef struct Fold {
  IrFunc *f;
  const PassOptions *o;
  Info *info;        /* by value id (values created by this pass are not classified) */
  IrValue **rw[2];   /* rewritten value by id, per part (C_SUM values only) */
  int ninfo;
  int64_t micro;     /* samples per micro-batch */
} Fold;

static Info indep(void) { return (Info){.cls = C_INDEP}; }
static Info sample(int axis, int64_t per) { return (Info){.cls = C_SAMPLE, .axis = axis, .per = per}; }
static Info bad(IrOp *op, const char *why) { return (Info){.cls = C_BAD, .bad = op, .why = why}; }
static Info sum_of(WKind w, IrOp *wop) { return (Info){.cls = C_SUM, .w = w, .wop = wop}; }

static Info get(Fold *fd, IrValue *v) { return v->id < fd->ninfo ? fd->info[v->id] : indep(); }

static bool same_weight(const Info *a, const Info *b) {
  if (a->w != b->w) return false;
  if (a->w != W_COUNT) return true;
  /* Same target value and ignore_index. */
  return a->wop->args[1] == b->wop->args[1] &&
         ir_attr_get_int(a->wop, "ignore_index", -100) == ir_attr_get_int(b->wop, "ignore_index", -100);
}

/* Where a per-sample operand's axis lands in a broadcast result of rank r. */
static int bcast_axis(IrValue *v, int axis, int r) { return axis + (r - v->type.shape.rank); }

/* Linear combination (add, sub, concat) of classified operands. */
static Info combine_linear(IrOp *op, Info *in, int n, int rank_out, IrValue **args) {
  int sample_axis = -1;
  int64_t per = 1;
  bool any_sample = false, any_sum = false, any_indep = false, affine = false;
  Info s = indep();
  for (int i = 0; i < n; i++) {
    if (in[i].cls == C_BAD) return in[i];
    if (in[i].cls == C_SAMPLE) {
      int a = op->opcode == IR_OP_CONCAT ? in[i].axis : bcast_axis(args[i], in[i].axis, rank_out);
      if (any_sample && (a != sample_axis || in[i].per != per))
        return bad(op, "it combines values whose samples lie on different axes");
      any_sample = true;
      sample_axis = a;
      per = in[i].per;
    } else if (in[i].cls == C_SUM) {
      if (any_sum && !same_weight(&s, &in[i]))
        return bad(op, "it adds batch reductions with different divisors below the loss's top level");
      any_sum = true;
      affine |= in[i].affine;
      s = in[i];
    } else {
      any_indep = true;
    }
  }
  if (any_sample && any_sum) return bad(op, "it combines per-sample values with a reduction over the batch");
  if (any_sample) return sample(sample_axis, per);
  if (any_sum) {
    s.affine = affine || any_indep;
    return s;
  }
  return indep();
}

/* Is axis `a` (of operand rank r) among the reduction axes? */
static bool reduces(const IrOp *op, int a, int r) {
  const int64_t *axes;
  int n = ir_attr_get_ints(op, "axes", &axes);
  if (n == 0) return true; /* empty list: every axis */
  for (int i = 0; i < n; i++)
    if ((axes[i] < 0 ? axes[i] + r : axes[i]) == a) return true;
  return false;
}

/* The sample axis after a reshape, or -1 if the reshape splits samples
 * apart.  Row-major order is kept: with `pre` elements before the sample
 * axis, each of the b samples owns a contiguous block of per * inner
 * elements; the reshape must keep `pre` as a prefix and give the block to
 * per' consecutive positions of one output axis. */
static int reshape_axis(const IrShape *in, int a, int64_t per, int64_t b, const IrShape *out, int64_t *per_out) {
  int64_t pre = 1, inner = 1;
  for (int i = 0; i < a; i++) pre *= in->dim[i];
  for (int i = a + 1; i < in->rank; i++) inner *= in->dim[i];
  int64_t blk = per * inner, p = 1;
  for (int j = 0; j < out->rank && p <= pre; j++) {
    if (p == pre && b > 0 && out->dim[j] % b == 0) {
      int64_t inner_out = 1;
      for (int k = j + 1; k < out->rank; k++) inner_out *= out->dim[k];
      if ((out->dim[j] / b) * inner_out == blk) {
        *per_out = out->dim[j] / b;
        return j;
      }
    }
    p *= out->dim[j];
  }
  return -1;
}

/* ---- classifying one op from its operands' classes ---- */

/* Elementwise on one operand (and causal_mask): neg, cast and detach are
 * linear; the others must not see a reduction over the batch. */
static Info cls_unary(IrOp *op, const Info *in, int r) {
  if (op->opcode == IR_OP_NEG || op->opcode == IR_OP_CAST || op->opcode == IR_OP_DETACH) return in[0];
  if (in[0].cls == C_SUM) return bad(op, "it applies a non-linear function to a reduction over the batch");
  if (op->opcode == IR_OP_CAUSAL_MASK && in[0].axis >= r - 2)
    return bad(op, "the causal mask's last two axes include the batch axis");
  return in[0];
}

/* mul, div: scaling by something batch-independent keeps the class. */
static Info cls_scale(IrOp *op, Info *in, int rank_out) {
  bool mul = op->opcode == IR_OP_MUL;
  if (in[1].cls == C_INDEP && in[0].cls != C_SAMPLE) return in[0];
  if (mul && in[0].cls == C_INDEP && in[1].cls != C_SAMPLE) return in[1];
  if (in[0].cls == C_SUM && in[1].cls == C_SUM)
    return bad(op, mul ? "it multiplies two batch-dependent reductions" : "it divides two batch-dependent reductions");
  if (in[0].cls == C_SUM || in[1].cls == C_SUM)
    return bad(op, !mul && in[1].cls == C_SUM ? "it divides by a reduction over the batch"
                                              : "it multiplies per-sample values by a reduction over the batch");
  return combine_linear(op, in, 2, rank_out, op->args);
}

/* maximum, minimum, comparisons, select: per-sample operands only. */
static Info cls_compare(IrOp *op, Info *in, int n, int rank_out) {
  for (int i = 0; i < n; i++)
    if (in[i].cls == C_SUM) return bad(op, "it compares or selects using a reduction over the batch");
  return combine_linear(op, in, n, rank_out, op->args);
}

/* The sample axis of a per-sample operand after a reduction that keeps it:
 * it moves left by the reduced axes before it unless keepdim. */
static Info kept_sample(IrOp *op, Info x, int r) {
  if (ir_attr_get_int(op, "keepdim", 0)) return x;
  int a = x.axis;
  for (int i = 0; i < x.axis; i++)
    if (reduces(op, i, r)) a--;
  return sample(a, x.per);
}

/* sum, mean are linear: over the batch axis they make a sum over samples
 * (a mean's divisor becomes the window's sample count); max and logsumexp
 * over it mix samples. */
static Info cls_reduce(IrOp *op, const Info *in, int r) {
  bool linear = op->opcode == IR_OP_SUM || op->opcode == IR_OP_MEAN;
  if (in[0].cls == C_SUM) {
    if (linear) return in[0];
    return bad(op, "it applies a non-linear reduction to a reduction over the batch");
  }
  if (reduces(op, in[0].axis, r)) {
    if (linear) return sum_of(op->opcode == IR_OP_MEAN ? W_BATCH : W_ONE, NULL);
    return bad(op, op->opcode == IR_OP_MAX ? "it takes a max over the batch axis"
                                           : "it takes a logsumexp over the batch axis");
  }
  return kept_sample(op, in[0], r);
}

/* Movement ops copy, so they are linear: a sum over samples passes
 * through (in classify), and a per-sample operand x's sample axis must
 * survive them whole. */
static Info cls_reshape(Fold *fd, IrOp *op, Info x) {
  int64_t per = 1;
  int a = reshape_axis(&op->args[0]->type.shape, x.axis, x.per, fd->micro, &op->result->type.shape, &per);
  if (a < 0) return bad(op, "it reshapes the batch axis apart");
  return sample(a, per);
}

static Info cls_permute(IrOp *op, Info x) {
  const int64_t *perm;
  int np = ir_attr_get_ints(op, "perm", &perm);
  for (int i = 0; i < np; i++)
    if (perm[i] == x.axis) return sample(i, x.per);
  return bad(op, "it permutes the batch axis away");
}

/* slice, unslice: the batch axis must be kept whole. */
static Info cls_slice(IrOp *op, Info x) {
  const int64_t *starts, *stops, *steps;
  ir_attr_get_ints(op, "starts", &starts);
  ir_attr_get_ints(op, "stops", &stops);
  ir_attr_get_ints(op, "steps", &steps);
  int a = x.axis;
  int64_t full = op->opcode == IR_OP_SLICE ? op->args[0]->type.shape.dim[a] : op->result->type.shape.dim[a];
  if (starts && stops && steps && (starts[a] != 0 || stops[a] != full || steps[a] != 1))
    return bad(op, "it indexes or slices the batch axis");
  return x;
}

static Info cls_concat(IrOp *op, Info *in, int n, int rank_out) {
  int64_t axis = ir_attr_get_int(op, "axis", 0);
  for (int i = 0; i < n; i++)
    if (in[i].cls == C_SAMPLE && in[i].axis == axis) return bad(op, "it concatenates along the batch axis");
  return combine_linear(op, in, n, rank_out, op->args);
}

/* a @ b: each operand's sample axis must land on a batch or free axis of
 * the result, and two per-sample operands on the same one. */
static Info cls_matmul(IrOp *op, const Info *in, int rank_out) {
  int ra = op->args[0]->type.shape.rank, rb = op->args[1]->type.shape.rank;
  if (in[0].cls == C_SUM && in[1].cls == C_INDEP) return in[0];
  if (in[1].cls == C_SUM && in[0].cls == C_INDEP) return in[1];
  if (in[0].cls == C_SUM || in[1].cls == C_SUM)
    return bad(op, "it multiplies per-sample values by a reduction over the batch");
  /* Where does each operand's sample axis go? -1: contracted. */
  int out_a = -1, out_b = -1;
  if (in[0].cls == C_SAMPLE) {
    int a = in[0].axis;
    if (ra == 1 || a == ra - 1) out_a = -1;
    else if (a == ra - 2) out_a = rank_out - (rb == 1 ? 1 : 2);
    else out_a = a + (rank_out + (rb == 1) - ra); /* a batch dim; a 1-D b drops the last axis */
    if (out_a == -1) return bad(op, "it contracts the batch axis");
  }
  if (in[1].cls == C_SAMPLE) {
    int a = in[1].axis;
    if (rb == 1 || a == rb - 2) out_b = -1;
    else if (a == rb - 1) out_b = rank_out - 1;
    else out_b = a + (rank_out + (ra == 1) - rb); /* a batch dim; a 1-D a drops the row axis */
    if (out_b == -1) return bad(op, "it contracts the batch axis");
  }
  if (in[0].cls == C_SAMPLE && in[1].cls == C_SAMPLE) {
    if (out_a != out_b || in[0].per != in[1].per || out_a >= rank_out - 2)
      return bad(op, "it multiplies values of different samples together");
  }
  return in[0].cls == C_SAMPLE ? sample(out_a, in[0].per) : sample(out_b, in[1].per);
}

/* softmax, log_softmax and the norms: per row, never over the batch. */
static Info cls_rowwise(IrOp *op, const Info *in, int n, int r) {
  if (op->opcode == IR_OP_SOFTMAX || op->opcode == IR_OP_LOG_SOFTMAX) {
    if (in[0].cls == C_SUM) return bad(op, "it applies a softmax to a reduction over the batch");
    if (ir_attr_get_int(op, "axis", -1) == in[0].axis) return bad(op, "it takes a softmax over the batch axis");
    return in[0];
  }
  for (int i = 1; i < n; i++)
    if (in[i].cls != C_INDEP) return bad(op, "its weight depends on the batch");
  if (in[0].cls == C_SUM) return bad(op, "it normalises a reduction over the batch");
  if (in[0].axis == r - 1) return bad(op, "it normalises over the batch axis");
  return in[0];
}

/* patches, patches_grad (convolution and pooling): copies of each
 * sample's elements when the batch axis is one of the leading axes, which
 * they keep; a sum over samples stays one unless a non-zero padding value
 * would be added once per micro-batch. */
static Info cls_patches(IrOp *op, Info x) {
  const int64_t *kernel;
  int d = ir_attr_get_ints(op, "kernel", &kernel);
  int lead = op->args[0]->type.shape.rank - (op->opcode == IR_OP_PATCHES ? d : 2 * d);
  if (x.cls == C_SUM) {
    if (op->opcode == IR_OP_PATCHES && ir_attr_get_float(op, "value", 0.0) != 0.0)
      return bad(op, "it pads a reduction over the batch with a non-zero value");
    return x;
  }
  if (x.axis >= lead) return bad(op, "it convolves or pools over the batch axis");
  return x;
}

/* cross_entropy, mse_loss: per sample with reduction="none", else a sum
 * over samples whose divisor the reduction gives. */
static Info cls_loss(IrOp *op, Info *in, int r, int rank_out) {
  if (in[0].cls == C_SUM || in[1].cls == C_SUM) return bad(op, "it is applied to a reduction over the batch");
  bool ce = op->opcode == IR_OP_CROSS_ENTROPY;
  Info s;
  if (ce) {
    /* The target has no class axis: its sample axis must be the logits'. */
    if (in[0].cls == C_SAMPLE && in[1].cls == C_SAMPLE && in[0].axis != in[1].axis)
      return bad(op, "its logits and targets index samples on different axes");
    if (in[0].cls == C_SAMPLE && in[0].axis == r - 1) return bad(op, "its class axis is the batch axis");
    s = in[0].cls == C_SAMPLE ? in[0] : in[1];
  } else {
    s = combine_linear(op, in, 2, rank_out, op->args);
    if (s.cls == C_BAD) return s;
  }
  const char *red = ir_attr_get_str(op, "reduction", "mean");
  if (strcmp(red, "none") == 0) return s;
  if (strcmp(red, "sum") == 0) return sum_of(W_ONE, NULL);
  return ce ? sum_of(W_COUNT, op) : sum_of(W_BATCH, NULL);
}

/* gather(x, idx) along a: per-sample when x's samples do not lie along a
 * (the other axes keep their positions); from a batch-independent x, per
 * sample as the index is (an embedding-like lookup). */
static Info cls_gather(IrOp *op, const Info *in) {
  int64_t a = 0;
  ir_norm_axis(ir_attr_get_int(op, "axis", 0), op->args[0]->type.shape.rank, &a);
  if (in[0].cls == C_SUM || in[1].cls == C_SUM) return bad(op, "it gathers from or by a reduction over the batch");
  if (in[0].cls == C_SAMPLE && in[0].axis == a) return bad(op, "it gathers across the batch axis");
  if (in[0].cls == C_SAMPLE && in[1].cls == C_SAMPLE && in[1].axis != in[0].axis)
    return bad(op, "its operand and index index samples on different axes");
  return in[0].cls == C_SAMPLE ? in[0] : in[1];
}

/* How op's result depends on the batch's samples, from its operands'. */
static Info classify(Fold *fd, IrOp *op) {
  Info in[8];
  int n = op->nargs < 8 ? op->nargs : 8;
  for (int i = 0; i < n; i++) in[i] = get(fd, op->args[i]);
  /* A batched draw is per-sample: its counter holds the sample's index in
   * the window (ir/random.c), so K micro-batches draw what one batch does. */
  if (op->opcode == IR_OP_RANDOM) return ir_random_batched(op) ? sample(0, 1) : indep();
  bool all_indep = true;
  for (int i = 0; i < op->nargs; i++)
    if (get(fd, op->args[i]).cls != C_INDEP) all_indep = false;
  if (all_indep) return indep();
  for (int i = 0; i < n; i++)
    if (in[i].cls == C_BAD) return in[i];
  /* Past here some operand is per-sample or a sum over samples. */
  int rank_out = op->result ? op->result->type.shape.rank : 0;
  int r = op->args[0]->type.shape.rank;
  int64_t ax;

  switch (op->opcode) {
  IR_CASES(UNARY)
  case IR_OP_CAUSAL_MASK: return cls_unary(op, in, r);
  case IR_OP_ADD:
  case IR_OP_SUB: return combine_linear(op, in, 2, rank_out, op->args);
  case IR_OP_MUL:
  case IR_OP_DIV: return cls_scale(op, in, rank_out);
  case IR_OP_MAXIMUM:
  case IR_OP_MINIMUM:
  case IR_OP_EQ:
  case IR_OP_NE:
  case IR_OP_LT:
  case IR_OP_LE:
  case IR_OP_GT:
  case IR_OP_GE:
  case IR_OP_SELECT: return cls_compare(op, in, n, rank_out);
  case IR_OP_CONST: return indep();
  /* Randomness */
  case IR_OP_RNG_STATE:
  case IR_OP_LOSS_SCALE:
  case IR_OP_RANDOM: return indep(); /* (a batched draw returned above) */
  case IR_OP_SUM:
  case IR_OP_MEAN:
  case IR_OP_MAX:
  case IR_OP_LOGSUMEXP: return cls_reduce(op, in, r);
  /* Copies: a sum over samples stays one. */
  case IR_OP_RESHAPE: return in[0].cls == C_SUM ? in[0] : cls_reshape(fd, op, in[0]);
  case IR_OP_PERMUTE: return in[0].cls == C_SUM ? in[0] : cls_permute(op, in[0]);
  case IR_OP_BROADCAST:
    return in[0].cls == C_SUM ? in[0] : sample(bcast_axis(op->args[0], in[0].axis, rank_out), in[0].per);
  case IR_OP_SLICE:
  case IR_OP_UNSLICE: return in[0].cls == C_SUM ? in[0] : cls_slice(op, in[0]);
  case IR_OP_CONCAT: return cls_concat(op, in, n, rank_out);
  case IR_OP_MATMUL: return cls_matmul(op, in, rank_out);
  case IR_OP_SOFTMAX:
  case IR_OP_LOG_SOFTMAX:
  IR_CASES(NORM) return cls_rowwise(op, in, n, r);
  case IR_OP_EMBEDDING:
    if (in[1].cls != C_INDEP) return bad(op, "its table depends on the batch");
    return in[0];
  case IR_OP_CROSS_ENTROPY:
  case IR_OP_MSE_LOSS: return cls_loss(op, in, r, rank_out);
  case IR_OP_ONE_HOT: return in[0].cls == C_SAMPLE ? in[0] : bad(op, "it is not a forward operation");
  case IR_OP_EMBEDDING_GRAD: return bad(op, "it is not a forward operation");
  case IR_OP_PATCHES:
  case IR_OP_PATCHES_GRAD: return cls_patches(op, in[0]);
  /* language v2 selection (DESIGN.md §2: gather along a non-batch axis is per-sample) */
  case IR_OP_ARANGE: return indep();
  case IR_OP_GATHER: return cls_gather(op, in);
  case IR_OP_GATHER_GRAD: return bad(op, "it is not a forward operation");
  case IR_OP_TOPK:
    if (in[0].cls == C_SUM) return bad(op, "it selects among reductions over the batch");
    if (ir_norm_axis(ir_attr_get_int(op, "axis", -1), r, &ax) && ax == in[0].axis)
      return bad(op, "it selects the largest values across the batch axis (topk, argmax)");
    return in[0];
  case IR_OP_WINDOW_SUM:
  case IR_OP_GRAD_SEED:
  case IR_OP_LOSS_TERM:
  IR_CASES(COLLECTIVE)
  case IR_OP_LOSS:
  case IR_OP_GRAD:
  case IR_OP_OUTPUT:
  case IR_OP_UPDATE: return in[0];
  }
  return bad(op, "unknown operation");
}

/* ---- rewriting a term: batch means become sums ---- */

static IrValue *const_of(IrFunc *f, double v, IrValue *like, IrLoc loc) { return ir_const(f, v, like->type.dtype, loc); }

/* Elements a batch mean reduces per sample: all reduced elements / samples. */
static double nonbatch_count(Fold *fd, const IrOp *op) {
  IrValue *x = op->args[0];
  int r = x->type.shape.rank;
  double n = 1;
  for (int i = 0; i < r; i++)
    if (reduces(op, i, r)) n *= (double)x->type.shape.dim[i];
  return n / (double)fd->micro;
}

/* The op `op` (a batch mean or a mean-reduced loss) as a micro-batch sum;
 * *coef receives the constant factor 1/(non-batch elements). */
static IrValue *as_sum(Fold *fd, IrOp *op, double *coef) {
  IrFunc *f = fd->f;
  *coef = 1;
  if (op->opcode == IR_OP_MEAN) {
    const int64_t *axes;
    int na = ir_attr_get_ints(op, "axes", &axes);
    *coef = 1.0 / nonbatch_count(fd, op);
    return ir_reduce(f, IR_OP_SUM, op->args[0], axes, na, ir_attr_get_int(op, "keepdim", 0), op->loc);
  }
  GRADC_ASSERT(op->opcode == IR_OP_CROSS_ENTROPY || op->opcode == IR_OP_MSE_LOSS);
  IrAttr attrs[8];
  int na = 0;
  for (int i = 0; i < op->nattrs && na < 8; i++) {
    attrs[na] = op->attrs[i];
    if (strcmp(attrs[na].key, "reduction") == 0) attrs[na].s = "sum";
    na++;
  }
  if (op->opcode == IR_OP_MSE_LOSS) /* mean over every element = sum / (samples * elements per sample) */
    *coef = (double)fd->micro / (double)ir_numel(&op->args[0]->type.shape);
  return ir_emit(f, op->opcode, op->args, op->nargs, attrs, na, NULL, op->loc);
}

static bool is_batch_mean(Fold *fd, IrOp *op) {
  if (!op || get(fd, op->result).cls != C_SUM) return false;
  if (op->opcode == IR_OP_MEAN) return get(fd, op->args[0]).cls == C_SAMPLE;
  if (op->opcode == IR_OP_CROSS_ENTROPY || op->opcode == IR_OP_MSE_LOSS)
    return strcmp(ir_attr_get_str(op, "reduction", "mean"), "mean") == 0;
  return false;
}

/* A C_SUM value is linear in the micro-batch's sample sums and, when
 * `affine`, in the batch-independent values added to them below the loss's
 * top level: v = v(S, 0) + v(0, I).  Each part becomes its own term, the
 * first with the sums' window weight, the second counted once. */
enum { PART_SUM, PART_ONCE };

static IrValue *rewrite(Fold *fd, IrValue *v, int part);

/* v's share of `part`, or NULL when it has none. */
static IrValue *part_of(Fold *fd, IrValue *v, int part) {
  Info in = get(fd, v);
  if (in.cls != C_SUM) return part == PART_ONCE ? v : NULL;
  if (part == PART_ONCE && !in.affine) return NULL;
  return rewrite(fd, v, part);
}

static IrValue *zeros_like(IrFunc *f, IrValue *v, IrLoc loc) { return ir_const_shaped(f, 0.0, v->type, loc); }

/* Rewrite one part of a C_SUM value so that its batch reductions are plain
 * sums; the divisor moves to the term's weight.  Memoised per part: shared
 * sub-graphs are rewritten once. */
static IrValue *rewrite(Fold *fd, IrValue *v, int part) {
  if (v->id >= fd->ninfo || get(fd, v).cls != C_SUM) return v;
  if (fd->rw[part][v->id]) return fd->rw[part][v->id];
  IrFunc *f = fd->f;
  IrOp *op = v->def;
  IrValue *out;
  if (part == PART_SUM && is_batch_mean(fd, op)) {
    double c;
    out = as_sum(fd, op, &c);
    if (c != 1) out = ir_binary(f, IR_OP_MUL, out, const_of(f, c, out, op->loc), op->loc);
  } else if (op->opcode == IR_OP_ADD || op->opcode == IR_OP_SUB) {
    IrValue *a = part_of(fd, op->args[0], part), *b = part_of(fd, op->args[1], part);
    if (a && b) out = ir_binary(f, op->opcode, a, b, op->loc);
    else if (a) out = ir_broadcast(f, a, v->type.shape, op->loc);
    else {
      GRADC_ASSERT(b != NULL);
      if (op->opcode == IR_OP_SUB) b = ir_unary(f, IR_OP_NEG, b, op->loc);
      out = ir_broadcast(f, b, v->type.shape, op->loc);
    }
  } else {
    /* A linear op: its C_SUM operands carry the part; a concat's other
     * operands are additive too, everything else multiplies. */
    IrValue *args[16];
    bool changed = false;
    GRADC_ASSERT(op->nargs <= 16);
    for (int i = 0; i < op->nargs; i++) {
      IrValue *x = op->args[i];
      if (op->opcode == IR_OP_CONCAT) {
        args[i] = part_of(fd, x, part);
        if (!args[i]) args[i] = zeros_like(f, x, op->loc);
      } else {
        args[i] = rewrite(fd, x, part);
      }
      changed |= args[i] != x;
    }
    IrType hint = v->type;
    out = changed ? ir_emit(f, op->opcode, args, op->nargs, op->attrs, op->nattrs, &hint, op->loc) : v;
  }
  fd->rw[part][v->id] = out;
  return out;
}

/* ---- terms ---- */

typedef struct Term {
  IrValue *s;
  double coef;
  WKind w;
  IrOp *wop;
  IrLoc loc;
} Term;

typedef struct Terms {
  Term t[256];
  int n;
  bool refused;
} Terms;

static bool const_scalar(IrValue *v, double *out) {
  if (!v->def || v->def->opcode != IR_OP_CONST || v->type.shape.rank != 0) return false;
  *out = ir_attr_get_float(v->def, "value", 0);
  return true;
}

static void add_term(Fold *fd, Terms *ts, IrValue *s, double c, WKind w, IrOp *wop, IrLoc loc) {
  (void)fd;
  if (ts->n == (int)(sizeof ts->t / sizeof ts->t[0])) {
    /* Too many terms to fold one by one: the caller refuses cleanly. */
    ts->refused = true;
    return;
  }
  ts->t[ts->n++] = (Term){s, c, w, wop, loc};
}

static void refuse(Fold *fd, Terms *ts, const char *loss, const Info *in) {
  ts->refused = true;
  IrLoc l = in->bad ? in->bad->loc : (IrLoc){0};
  const SrcFile *src = fd->o->src;
  diag_at(fd->o->diag, DIAG_ERROR, src && l.file && src->name && strcmp(src->name, l.file) == 0 ? src : NULL,
          l.line, l.col,
          "loss '%s' cannot be split into %d micro-batches: %s, so it is not a sum over samples "
          "(use --gas 1, or make the loss a sum or mean of per-sample terms)",
          loss, fd->o->gas, in->why);
}

/* Walk down from a loss through its linear top: + - neg, and scaling by
 * constants; collect the terms. */
static void extract(Fold *fd, Terms *ts, const char *loss, IrValue *v, double c, IrLoc loc) {
  Info in = get(fd, v);
  IrOp *op = v->def;
  double k;
  if (op && v->type.shape.rank == 0) {
    IrValue *a = op->nargs > 0 ? op->args[0] : NULL, *b = op->nargs > 1 ? op->args[1] : NULL;
    bool scalars = a && a->type.shape.rank == 0 && (!b || b->type.shape.rank == 0);
    if (scalars && op->opcode == IR_OP_ADD) {
      extract(fd, ts, loss, a, c, loc);
      extract(fd, ts, loss, b, c, loc);
      return;
    }
    if (scalars && op->opcode == IR_OP_SUB) {
      extract(fd, ts, loss, a, c, loc);
      extract(fd, ts, loss, b, -c, loc);
      return;
    }
    if (scalars && op->opcode == IR_OP_NEG) {
      extract(fd, ts, loss, a, -c, loc);
      return;
    }
    if (scalars && op->opcode == IR_OP_MUL && const_scalar(a, &k)) {
      extract(fd, ts, loss, b, c * k, loc);
      return;
    }
    if (scalars && op->opcode == IR_OP_MUL && const_scalar(b, &k)) {
      extract(fd, ts, loss, a, c * k, loc);
      return;
    }
    if (scalars && op->opcode == IR_OP_DIV && const_scalar(b, &k) && k != 0) {
      extract(fd, ts, loss, a, c / k, loc);
      return;
    }
  }
  if (in.cls == C_INDEP) {
    add_term(fd, ts, v, c, W_ONCE, NULL, loc);
    return;
  }
  if (in.cls == C_SUM) {
    if (!in.affine && is_batch_mean(fd, op)) {
      double k2;
      IrValue *s = as_sum(fd, op, &k2);
      add_term(fd, ts, s, c * k2, in.w, in.wop, loc);
      return;
    }
    add_term(fd, ts, rewrite(fd, v, PART_SUM), c, in.w, in.wop, loc);
    if (in.affine) add_term(fd, ts, rewrite(fd, v, PART_ONCE), c, W_ONCE, NULL, loc);
    return;
  }
  if (in.cls == C_SAMPLE) in = bad(op, "it keeps the batch axis");
  if (fd->o->gas > 1) {
    refuse(fd, ts, loss, &in);
    return;
  }
  /* K = 1: the micro-batch is the window; keep the loss whole. */
  add_term(fd, ts, v, c, W_ONE, NULL, loc);
}

/* The window weight w of a term, as IR.  Named w_<loss>. */
static IrValue *weight(Fold *fd, const Term *t, const char *loss) {
  IrFunc *f = fd->f;
  IrLoc loc = t->loc;
  IrDType dt = t->s->type.dtype;
  IrValue *one = ir_const(f, 1.0, dt, loc), *w = NULL;
  switch (t->w) {
  case W_ONE: return one;
  case W_BATCH: {
    /* Samples per micro-batch, summed over the window by the runtime. */
    int64_t nb = 0;
    for (int i = 0; i < f->nargs; i++)
      if (f->args[i]->batched) nb = f->args[i]->type.shape.dim[0];
    IrValue *n = ir_unary(f, IR_OP_WINDOW_SUM, ir_const(f, (double)nb, dt, loc), loc);
    w = ir_binary(f, IR_OP_DIV, one, n, loc);
    break;
  }
  case W_COUNT: {
    IrValue *target = t->wop->args[1];
    IrValue *ign = ir_const(f, (double)ir_attr_get_int(t->wop, "ignore_index", -100), IR_DT_I32, loc);
    IrValue *valid = ir_cast(f, ir_binary(f, IR_OP_NE, target, ign, loc), dt, loc);
    int64_t axes[IR_MAX_RANK];
    for (int i = 0; i < valid->type.shape.rank; i++) axes[i] = i;
    IrValue *cnt = ir_reduce(f, IR_OP_SUM, valid, axes, valid->type.shape.rank, false, loc);
    IrValue *n = ir_unary(f, IR_OP_WINDOW_SUM, cnt, loc);
    w = ir_binary(f, IR_OP_DIV, one, ir_binary(f, IR_OP_MAXIMUM, n, one, loc), loc);
    break;
  }
  case W_ONCE: {
    IrValue *k = ir_unary(f, IR_OP_WINDOW_SUM, one, loc);
    w = ir_binary(f, IR_OP_DIV, one, k, loc);
    break;
  }
  }
  w->name = arena_printf(&f->arena, "w_%s", loss);
  return w;
}

/* ---- outputs and buffer updates (language v2) ---- */

static void set_window(IrFunc *f, IrOp *op, const char *w) {
  IrAttr *a = ARENA_ARRAY(&f->arena, IrAttr, op->nattrs + 1);
  int n = 0;
  for (int i = 0; i < op->nattrs; i++)
    if (strcmp(op->attrs[i].key, "window") != 0) a[n++] = op->attrs[i];
  a[n++] = ir_attr_str("window", w);
  op->attrs = a;
  op->nattrs = n;
}

/* An `output` or `update` over a window of `splits` micro-batches and
 * ranks.  How its value combines over them is the op's window= attribute:
 *   - batch-independent: "once" (every micro-batch computes the same value);
 *   - per-sample with the samples on the leading axis: "concat" (the
 *     micro-batches' values in sample order, the ranks' gathered);
 *   - a linear function of sums over samples: "sum", its operand rewritten
 *     as the terms Σ c·w·S that losses get (a batch mean becomes a micro-
 *     batch sum over the window's count, a batch-independent part is
 *     weighted 1/K), so the micro-batches' and ranks' values add up to the
 *     window's: the `update rm = 0.9 * rm + 0.1 * mean(h, axis=0)` of
 *     DESIGN.md §2 uses the mean over the whole window;
 *   - anything else cannot be computed from micro-batches: refused at the
 *     op that mixed samples, as losses are.
 * With one micro-batch and one rank the value is the window's: "once". */
static bool fold_state(Fold *fd, IrOp *op, int splits, Arena *scratch) {
  IrFunc *f = fd->f;
  const char *what = op->opcode == IR_OP_UPDATE ? "update of buffer" : "output";
  const char *name = ir_attr_get_str(op, "name", "?");
  IrValue *v = op->args[0];
  Info in = get(fd, v);
  if (splits == 1 || in.cls == C_INDEP) {
    set_window(f, op, "once");
    return true;
  }
  if (in.cls == C_SAMPLE && in.axis == 0) {
    set_window(f, op, "concat");
    return true;
  }
  if (in.cls == C_SAMPLE || in.cls == C_BAD) {
    IrLoc l = in.cls == C_BAD && in.bad ? in.bad->loc : op->loc;
    const char *why = in.cls == C_BAD ? in.why : "its batch axis is not the leading one";
    const SrcFile *src = fd->o->src;
    diag_at(fd->o->diag, DIAG_ERROR, src && l.file && src->name && strcmp(src->name, l.file) == 0 ? src : NULL,
            l.line, l.col,
            "%s '%s' cannot be computed from %d micro-batches and ranks: %s, so it is neither per-sample nor a "
            "window reduction (use --gas 1, or make it a sum or mean over samples of per-sample values)",
            what, name, splits, why);
    return false;
  }
  Terms *ts = ARENA_NEW(scratch, Terms);
  extract(fd, ts, name, v, 1.0, op->loc);
  if (ts->refused) {
    if (ts->n == (int)(sizeof ts->t / sizeof ts->t[0]))
      diag_at(fd->o->diag, DIAG_ERROR, NULL, op->loc.line, op->loc.col, "%s '%s' has too many terms", what, name);
    return false;
  }
  IrValue *total = NULL;
  for (int t = 0; t < ts->n; t++) {
    Term *tm = &ts->t[t];
    IrValue *w = weight(fd, tm, name);
    IrValue *scale = ir_binary(f, IR_OP_MUL, w, ir_const(f, tm->coef, w->type.dtype, tm->loc), tm->loc);
    IrValue *term = ir_binary(f, IR_OP_MUL, tm->s, scale, tm->loc);
    if (!ir_shape_eq(&term->type.shape, &v->type.shape)) term = ir_broadcast(f, term, v->type.shape, tm->loc);
    total = total ? ir_binary(f, IR_OP_ADD, total, term, op->loc) : term;
  }
  if (!total) total = ir_const_shaped(f, 0.0, v->type, op->loc);
  op->args[0] = total;
  set_window(f, op, "sum");
  return true;
}

PassResult pass_gas_fold(IrFunc *f, const PassOptions *o, Arena *scratch) {
  for (int i = 0; i < f->nops; i++)
    if (f->ops[i]->opcode == IR_OP_LOSS_TERM) return PASS_UNCHANGED;
  Fold fd = {.f = f, .o = o, .ninfo = f->nvalues};
  fd.info = ARENA_ARRAY(scratch, Info, f->nvalues + 1);
  fd.rw[PART_SUM] = ARENA_ARRAY(scratch, IrValue *, f->nvalues + 1);
  fd.rw[PART_ONCE] = ARENA_ARRAY(scratch, IrValue *, f->nvalues + 1);
  for (int i = 0; i < f->nargs; i++) {
    IrValue *a = f->args[i];
    fd.info[a->id] = a->batched ? sample(0, 1) : indep();
    if (a->batched) fd.micro = a->type.shape.dim[0];
  }
  int nops = f->nops;
  IrOp **fwd = ARENA_ARRAY(scratch, IrOp *, nops + 1);
  memcpy(fwd, f->ops, sizeof(IrOp *) * (size_t)nops);
  for (int i = 0; i < nops; i++)
    if (fwd[i]->result) fd.info[fwd[i]->result->id] = classify(&fd, fwd[i]);

  bool refused = false;
  IrValue *scale = NULL; /* f16: the window's loss scale (loss.scale) */
  for (int i = 0; i < nops; i++) {
    IrOp *out = fwd[i];
    if (out->opcode != IR_OP_LOSS) continue;
    const char *loss = ir_attr_get_str(out, "name", "loss");
    Terms *ts = ARENA_NEW(scratch, Terms);
    extract(&fd, ts, loss, out->args[0], 1.0, out->loc);
    if (ts->refused) {
      if (!refused && ts->n == (int)(sizeof ts->t / sizeof ts->t[0]))
        diag_at(o->diag, DIAG_ERROR, NULL, out->loc.line, out->loc.col, "loss '%s' has too many terms", loss);
      refused = true;
      continue;
    }
    IrValue *total = NULL;
    for (int t = 0; t < ts->n; t++) {
      Term *tm = &ts->t[t];
      IrValue *w = weight(&fd, tm, loss);
      if (o->precision == IR_DT_F16) { /* S rides on every seed; the runtime divides the losses by it */
        if (!scale) {
          scale = ir_emit(f, IR_OP_LOSS_SCALE, NULL, 0, NULL, 0, NULL, tm->loc);
          scale->name = "loss_scale";
        }
        IrValue *sw = w->type.dtype == scale->type.dtype ? scale : ir_cast(f, scale, w->type.dtype, tm->loc);
        w = ir_binary(f, IR_OP_MUL, w, sw, tm->loc);
      }
      IrAttr coef = ir_attr_float("coef", tm->coef);
      IrValue *seed = ir_emit(f, IR_OP_GRAD_SEED, &w, 1, &coef, 1, NULL, tm->loc);
      IrValue *args[2] = {tm->s, seed};
      IrValue *term = ir_emit(f, IR_OP_LOSS_TERM, args, 2, NULL, 0, NULL, tm->loc);
      /* Names that say what each value is: the sum S, its seed, the term. */
      if (!tm->s->name) tm->s->name = arena_printf(&f->arena, "S_%s", loss);
      seed->name = arena_printf(&f->arena, "seed_%s", loss);
      term->name = arena_printf(&f->arena, "t_%s", loss);
      total = total ? ir_binary(f, IR_OP_ADD, total, term, out->loc) : term;
    }
    if (!total) total = ir_const(f, 0.0, out->args[0]->type.dtype, out->loc);
    out->args[0] = total;
  }
  int splits = o->gas * (o->dp > 1 ? o->dp : 1);
  for (int i = 0; i < nops; i++) {
    IrOp *out = fwd[i];
    if ((out->opcode == IR_OP_OUTPUT || out->opcode == IR_OP_UPDATE) && !ir_attr_get(out, "window") &&
        !fold_state(&fd, out, splits, scratch))
      refused = true;
  }
  if (refused) return PASS_ERROR;
  /* New ops were appended after the outputs that now use them. */
  if (!ir_func_topo_sort(f)) GRADC_ASSERT(!"gas-fold produced a cycle");
  return PASS_CHANGED;
}
