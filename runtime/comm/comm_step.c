/* comm_step.c - data parallelism in the step layer (comm.h, DESIGN.md §3
 * rules 2 and 8, docs/DISTRIBUTED.md).
 *
 * A window of B samples runs on N data-parallel ranks.  Every rank binds
 * the same files; step_bind checks the whole window and step_dp_slice
 * points each batched input at this rank's contiguous B/N samples, which
 * the driver splits into its K micro-batches as usual.  The count phase
 * runs on the rank's samples and step_dp_reduce_sums adds the window sums
 * of every rank before the first micro-batch, so a batch mean divides by B
 * and a cross_entropy mean by the valid targets of the whole window (not
 * of one rank).  After the last micro-batch step_dp_end adds the ranks'
 * gradients and window losses (DESIGN.md §3 rule 8: the reduction follows
 * the last contribution) and compares the order of the collectives every
 * rank issued.
 *
 * Tensor parallelism: a param that `shard` split is bound as this tp
 * rank's part of the whole tensor in the file (step_tp_slice, a copy along
 * its split axis) and its gradient, the local shard's, is all-gathered
 * back into the whole gradient (step_tp_gather), so results and params are
 * whole and identical on every rank.  With dp-reduce's buckets the CPU
 * executor has already reduced the gradients it marks in
 * StepResult.dp_reduced, and step_dp_end leaves them.
 *
 * Collective ops (StepColl): the executors run X.start / X.wait through
 * the comm layer on the window's tp or dp group; along an axis with a
 * non-unit extent before it, an all-gather receives the ranks' contiguous
 * parts into a staging buffer and permutes them into place at the wait,
 * and a reduce-scatter permutes its operand into rank-major parts first.
 *
 * The window in progress is the calling thread's (step_dp_begin), which is
 * how the shared helpers reach it without a parameter: both step drivers
 * (the reference interpreter and the CPU executor) call them. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm.h"

static _Thread_local StepDp *current;

/* This rank's parts of the sharded params bound in the thread's window
 * (step_tp_slice), freed when the window ends. */
static _Thread_local StFile *tp_parts;

static void tp_parts_free(void) {
  if (!tp_parts) return;
  st_free(tp_parts);
  free(tp_parts);
  tp_parts = NULL;
}

void step_dp_init(StepDp *d, Comm *c) {
  memset(d, 0, sizeof *d);
  d->comm = c;
  d->g = c ? &c->dp_group : NULL;
}

void step_dp_free(StepDp *d) {
  if (current == d) {
    current = NULL;
    tp_parts_free();
  }
  free(d->views);
  memset(d, 0, sizeof *d);
}

void step_dp_begin(StepDp *d) { current = d; }

int step_dp_size(void) { return current && current->g ? current->g->size : 1; }
int step_dp_rank(void) { return current && current->g ? current->g->rank : 0; }

void step_dp_slice(const IrFunc *f, const StTensor **bound) {
  StepDp *d = current;
  if (!d || step_dp_size() == 1) return;
  if (d->nviews < f->nargs) {
    free(d->views);
    d->views = mem_calloc((size_t)f->nargs, sizeof(StTensor));
    d->nviews = f->nargs;
  }
  int size = d->g->size, rank = d->g->rank;
  for (int i = 0; i < f->nargs; i++) {
    const StTensor *t = bound[i];
    if (!t || !step_arg_split(f->args[i]) || t->shape[0] == 0) continue;
    /* step_bind checked the window: shape[0] = K * micro-batch * size. */
    int64_t rows = t->shape[0] / size;
    size_t row_bytes = t->nbytes / (size_t)t->shape[0];
    StTensor *v = &d->views[i];
    *v = *t;
    v->shape[0] = rows;
    v->data = (char *)t->data + (size_t)(rank * rows) * row_bytes;
    v->nbytes = (size_t)rows * row_bytes;
    bound[i] = v;
  }
}

bool step_dp_reduce_sums(const InterpCountPlan *count, double **wsum, char *err, size_t n) {
  if (step_dp_size() == 1) return true;
  int64_t total = 0;
  for (int i = 0; i < count->nsums; i++) total += ir_numel(&count->sums[i]->result->type.shape);
  if (total == 0) return true;
  /* One all-reduce for every window sum, packed in op order. */
  double *buf = mem_calloc((size_t)total, sizeof(double));
  int64_t k = 0;
  for (int i = 0; i < count->nsums; i++) {
    const IrValue *r = count->sums[i]->result;
    int64_t m = ir_numel(&r->type.shape);
    memcpy(buf + k, wsum[r->id], sizeof(double) * (size_t)m);
    k += m;
  }
  bool ok = comm_all_reduce(current->g, buf, buf, total, COMM_F64, COMM_SUM, hash_str("window.sum"), err, n);
  k = 0;
  for (int i = 0; ok && i < count->nsums; i++) {
    const IrValue *r = count->sums[i]->result;
    int64_t m = ir_numel(&r->type.shape);
    memcpy(wsum[r->id], buf + k, sizeof(double) * (size_t)m);
    k += m;
  }
  free(buf);
  return ok;
}

bool step_dp_end(StepDp *d, StepResult *r, char *err, size_t n) {
  if (current == d) {
    current = NULL;
    tp_parts_free();
  }
  if (!r || !d->comm) return true;
  bool ok = true;
  char why[1024] = "";
  if (d->g && d->g->size > 1) {
    /* Every gradient the driver has not reduced yet and the losses in
     * flight at once, then wait for all (a failed start or wait keeps the
     * first message). */
    CommReq **req = mem_calloc((size_t)r->ngrads + 1, sizeof(CommReq *));
    int started = 0;
    for (int i = 0; ok && i < r->ngrads; i++) {
      if (r->dp_reduced && r->dp_reduced[i]) continue;
      int64_t m = ir_numel(&r->grad_types[i].shape);
      ok = comm_all_reduce_start(d->g, r->grads[i], r->grads[i], m, COMM_F64, COMM_SUM, hash_str(r->grad_names[i]),
                                 &req[started], why, sizeof why);
      started += ok;
    }
    if (ok) {
      ok = comm_all_reduce_start(d->g, r->losses, r->losses, r->nlosses, COMM_F64, COMM_SUM, hash_str("loss"),
                                 &req[started], why, sizeof why);
      started += ok;
    }
    for (int i = 0; i < started; i++) {
      char e[1024];
      if (!comm_wait(req[i], e, sizeof e) && ok) {
        ok = false;
        snprintf(why, sizeof why, "%s", e);
      }
    }
    free(req);
    /* Outputs and updates: window sums add over the ranks; concatenated
     * outputs hold zeros outside each rank's samples, so a sum gathers
     * them; "once" values are every rank's alike. */
    for (int u = 0; ok && u < 2; u++) {
      int nv = u ? r->nupdates : r->noutputs;
      for (int i = 0; ok && i < nv; i++) {
        const char *w = (u ? r->update_windows : r->output_windows)[i];
        if (strcmp(w, "once") == 0) continue;
        double *v = (u ? r->updates : r->outputs)[i];
        int64_t m = ir_numel(&(u ? r->update_types : r->output_types)[i].shape);
        ok = comm_all_reduce(d->g, v, v, m, COMM_F64, COMM_SUM, hash_str((u ? r->update_names : r->output_names)[i]),
                             why, sizeof why);
        if (ok && strcmp(w, "sum") == 0) {
          IrDType dt = (u ? r->update_types : r->output_types)[i].dtype;
          for (int64_t e = 0; e < m; e++) v[e] = ir_round_dtype(v[e], dt);
        }
      }
    }
    /* A gradient buffer of f32 holds the sum rounded to f32. */
    for (int i = 0; ok && i < r->ngrads; i++) {
      if (r->grad_types[i].dtype == IR_DT_F64) continue;
      int64_t m = ir_numel(&r->grad_types[i].shape);
      for (int64_t e = 0; e < m; e++) r->grads[i][e] = ir_round_dtype(r->grads[i][e], r->grad_types[i].dtype);
    }
    if (ok) ok = comm_check(d->g, "the step", why, sizeof why);
  }
  /* The tensor-parallel collectives (the executors' and the gradients'
   * gathers) in the same order on every rank of the replica. */
  if (ok && d->comm->tp_group.size > 1) ok = comm_check(&d->comm->tp_group, "the step", why, sizeof why);
  if (!ok && err && n) snprintf(err, n, "%s", why);
  return ok;
}

/* ------------------------------------------------------------------ */
/* Tensor-parallel params                                              */
/* ------------------------------------------------------------------ */

static bool sharded(const IrValue *a) {
  return a->role == IR_ARG_PARAM && a->split_ranks > 1 && a->split_axis >= 0 && a->split_axis < a->type.shape.rank;
}

IrType step_arg_type(const IrValue *a) {
  IrType t = a->type;
  if (sharded(a)) t.shape.dim[a->split_axis] *= a->split_ranks;
  return t;
}

/* The thread's tp group, which must have `ranks` ranks. */
static CommGroup *tp_group(int64_t ranks, const char *what, char *err, size_t n) {
  CommGroup *g = current && current->comm ? &current->comm->tp_group : NULL;
  if (!g || g->size != ranks) {
    errf(err, n, "%s is sharded over %lld tensor-parallel ranks, and this run has %d (compile and run with --tp %lld "
          "under mpirun)", what, (long long)ranks, g ? g->size : 1, (long long)ranks);
    return NULL;
  }
  return g;
}

/* Elements before, at and after axis of a shape. */
static void axis_split(const IrShape *s, int axis, int64_t *outer, int64_t *inner) {
  *outer = 1;
  *inner = 1;
  for (int k = 0; k < axis; k++) *outer *= s->dim[k];
  for (int k = axis; k < s->rank; k++) *inner *= s->dim[k];
}

/* parts[r] (each outer x inner elements of es bytes, rank-major) into
 * whole, where part r is block r of inner along the axis of each outer row. */
static void parts_to_axis(char *whole, const char *parts, int ranks, int64_t outer, int64_t inner, size_t es) {
  size_t blk = (size_t)inner * es;
  for (int r = 0; r < ranks; r++)
    for (int64_t o = 0; o < outer; o++)
      memcpy(whole + ((size_t)o * (size_t)ranks + (size_t)r) * blk, parts + ((size_t)r * (size_t)outer + (size_t)o) * blk,
             blk);
}

/* The inverse: whole (outer rows of ranks x inner) into rank-major parts. */
static void axis_to_parts(char *parts, const char *whole, int ranks, int64_t outer, int64_t inner, size_t es) {
  size_t blk = (size_t)inner * es;
  for (int r = 0; r < ranks; r++)
    for (int64_t o = 0; o < outer; o++)
      memcpy(parts + ((size_t)r * (size_t)outer + (size_t)o) * blk, whole + ((size_t)o * (size_t)ranks + (size_t)r) * blk,
             blk);
}

bool step_tp_slice(const IrFunc *f, const StTensor **bound, char *err, size_t errlen) {
  /* st_add may move tp_parts' tensors: bind by index once all are added. */
  int *slot = mem_calloc((size_t)f->nargs + 1, sizeof(int));
  for (int i = 0; i < f->nargs; i++) slot[i] = -1;
  for (int i = 0; i < f->nargs; i++) {
    const IrValue *a = f->args[i];
    if (!sharded(a) || !bound[i]) continue;
    CommGroup *g = tp_group(a->split_ranks, a->name ? a->name : "a param", err, errlen);
    if (!g) {
      free(slot);
      return false;
    }
    if (!tp_parts) {
      tp_parts = mem_calloc(1, sizeof(StFile));
      st_init(tp_parts);
    }
    /* The file holds the whole tensor; this rank's part along the axis. */
    const StTensor *t = bound[i];
    int64_t outer, inner;
    IrShape local = a->type.shape;
    axis_split(&local, a->split_axis, &outer, &inner);
    size_t es = st_dtype_size(t->dtype), blk = (size_t)inner * es;
    char *part = mem_calloc((size_t)(outer * inner) + 1, es);
    for (int64_t o = 0; o < outer; o++)
      memcpy(part + (size_t)o * blk, (const char *)t->data + ((size_t)o * (size_t)g->size + (size_t)g->rank) * blk, blk);
    st_add(tp_parts, t->name, t->dtype, local.rank, local.dim, part);
    slot[i] = tp_parts->n - 1;
    free(part);
  }
  for (int i = 0; i < f->nargs; i++)
    if (slot[i] >= 0) bound[i] = &tp_parts->t[slot[i]];
  free(slot);
  return true;
}

bool step_tp_gather(const IrFunc *f, StepResult *r, char *err, size_t errlen) {
  for (int i = 0, k = 0; i < f->nargs; i++) {
    const IrValue *a = f->args[i];
    if (a->role != IR_ARG_PARAM) continue;
    int slot = k++;
    if (!sharded(a)) continue;
    CommGroup *g = tp_group(a->split_ranks, a->name ? a->name : "a param", err, errlen);
    if (!g) return false;
    int64_t outer, inner, m = ir_numel(&a->type.shape);
    axis_split(&a->type.shape, a->split_axis, &outer, &inner);
    double *mine = mem_calloc((size_t)m, sizeof(double)), *parts = mem_calloc((size_t)(m * g->size), sizeof(double));
    memcpy(mine, r->grads[slot], sizeof(double) * (size_t)m);
    CommReq *q;
    bool ok = comm_all_gather_start(g, mine, parts, m, COMM_F64, hash_str(a->name ? a->name : "grad"), &q, err, errlen) &&
              comm_wait(q, err, errlen);
    if (ok) parts_to_axis((char *)r->grads[slot], (const char *)parts, g->size, outer, inner, sizeof(double));
    free(mine);
    free(parts);
    if (!ok) return false;
  }
  return true;
}

/* ------------------------------------------------------------------ */
/* Collective ops                                                      */
/* ------------------------------------------------------------------ */

bool step_coll_last(const IrOp *op) {
  /* A wait's attributes are its start's. */
  bool wait = op->opcode == IR_OP_ALL_REDUCE_WAIT || op->opcode == IR_OP_ALL_GATHER_WAIT ||
              op->opcode == IR_OP_REDUCE_SCATTER_WAIT;
  if (wait && op->args[0]->def) op = op->args[0]->def;
  const IrAttr *a = ir_attr_get(op, "last");
  return a && a->i != 0;
}

CommGroup *step_coll_group(const IrOp *op, char *err, size_t errlen) {
  const char *name = ir_attr_get_str(op, "group", "");
  int64_t ranks = ir_attr_get_int(op, "ranks", 1);
  Comm *c = current ? current->comm : NULL;
  CommGroup *g = !c ? NULL : strcmp(name, "tp") == 0 ? &c->tp_group : strcmp(name, "dp") == 0 ? &c->dp_group : NULL;
  if (!g) {
    errf(err, errlen, "collectives need a distributed runtime: '%s' is over %lld ranks of group \"%s\" (compile and "
          "run with --tp/--dp under mpirun)", ir_op_info[op->opcode].name, (long long)ranks, name);
    return NULL;
  }
  if (g->size != ranks) {
    errf(err, errlen, "'%s' is over %lld ranks of group \"%s\", and the run's %s group has %d",
          ir_op_info[op->opcode].name, (long long)ranks, name, g->name, g->size);
    return NULL;
  }
  return g;
}

static void *grow(char **buf, size_t *cap, size_t bytes) {
  if (*cap < bytes) {
    free(*buf);
    *buf = mem_calloc(bytes, 1);
    *cap = bytes;
  }
  return *buf;
}

bool step_coll_start(StepColl *c, const IrOp *op, bool f64, const void *send, void *recv, char *err, size_t errlen) {
  GRADC_ASSERT(!c->req);
  c->op = op;
  c->es = f64 ? 8 : 4;
  c->permute_out = false;
  const IrShape *in = &op->args[0]->type.shape, *out = &op->result->type.shape;
  size_t in_bytes = (size_t)ir_numel(in) * c->es, out_bytes = (size_t)ir_numel(out) * c->es;
  if (!recv) recv = grow(&c->own, &c->own_cap, out_bytes + 1);
  c->recv = recv;
  int64_t ranks = ir_attr_get_int(op, "ranks", 1);
  if (ranks == 1) { /* one rank: the identity */
    if (recv != send) memmove(recv, send, in_bytes);
    return true;
  }
  CommGroup *g = step_coll_group(op, err, errlen);
  if (!g) return false;
  CommDType dt = f64 ? COMM_F64 : COMM_F32;
  uint64_t tag = hash_str(ir_op_info[op->opcode].name) ^ ((uint64_t)op->result->id * 0x9e3779b97f4a7c15ull);
  int64_t axis = ir_attr_get_int(op, "axis", 0), outer = 1, inner = 1;
  if (op->opcode == IR_OP_ALL_REDUCE_START)
    return comm_all_reduce_start(g, send, recv, ir_numel(in), dt, COMM_SUM, tag, &c->req, err, errlen);
  if (op->opcode == IR_OP_ALL_GATHER_START) {
    axis_split(in, (int)axis, &outer, &inner);
    if (outer == 1) /* the parts are contiguous along the axis already */
      return comm_all_gather_start(g, send, recv, ir_numel(in), dt, tag, &c->req, err, errlen);
    c->permute_out = true;
    return comm_all_gather_start(g, send, grow(&c->stage, &c->stage_cap, out_bytes), ir_numel(in), dt, tag, &c->req,
                                 err, errlen);
  }
  if (op->opcode == IR_OP_REDUCE_SCATTER_START) {
    axis_split(out, (int)axis, &outer, &inner);
    const void *src = send;
    if (outer > 1) { /* rank r's part: block r along the axis of every outer row */
      axis_to_parts(grow(&c->stage, &c->stage_cap, in_bytes), send, g->size, outer, inner, c->es);
      src = c->stage;
    }
    return comm_reduce_scatter_start(g, src, recv, ir_numel(out), dt, COMM_SUM, tag, &c->req, err, errlen);
  }
  return errf(err, errlen, "'%s' is not the start of a collective", ir_op_info[op->opcode].name);
}

bool step_coll_test(StepColl *c, bool *done, char *err, size_t errlen) {
  *done = true;
  return !c->req || comm_test(c->req, done, err, errlen);
}

bool step_coll_wait(StepColl *c, void *dst, char *err, size_t errlen) {
  if (c->req) {
    CommReq *q = c->req;
    c->req = NULL;
    if (!comm_wait(q, err, errlen)) return false;
  }
  if (!c->op) return true;
  const IrOp *op = c->op;
  const IrShape *out = &op->result->type.shape;
  size_t out_bytes = (size_t)ir_numel(out) * c->es;
  if (c->permute_out) {
    int64_t outer, inner;
    axis_split(&op->args[0]->type.shape, (int)ir_attr_get_int(op, "axis", 0), &outer, &inner);
    parts_to_axis(dst, c->stage, (int)ir_attr_get_int(op, "ranks", 1), outer, inner, c->es);
  } else if (dst != c->recv) {
    memmove(dst, c->recv, out_bytes);
  }
  c->op = NULL;
  return true;
}

/* ------------------------------------------------------------------ */
/* Rank-dependent copies (tp.scatter, rank.slice, rank.concat)          */
/* ------------------------------------------------------------------ */

bool step_rank_of(const IrOp *op, int *rank, char *err, size_t errlen) {
  *rank = 0;
  if (ir_attr_get_int(op, "ranks", 1) == 1) return true;
  CommGroup *g = step_coll_group(op, err, errlen);
  if (!g) return false;
  *rank = g->rank;
  return true;
}

void step_rank_copy(const IrOp *op, int rank, size_t es, const void *const *src, void *dst) {
  int T = (int)ir_attr_get_int(op, "ranks", 1);
  bool concat = op->opcode == IR_OP_RANK_CONCAT;
  const IrShape *whole = concat ? &op->result->type.shape : &op->args[0]->type.shape;
  int axis = (int)ir_attr_get_int(op, "axis", 0);
  int64_t outer = 1, inner = 1, d = whole->dim[axis] / T;
  for (int k = 0; k < axis; k++) outer *= whole->dim[k];
  for (int k = axis + 1; k < whole->rank; k++) inner *= whole->dim[k];
  size_t blk = (size_t)(d * inner) * es, row = blk * (size_t)T;
  int shift = op->opcode == IR_OP_RANK_SLICE ? (int)ir_attr_get_int(op, "shift", 0) : 0;
  for (int j = 0; j < (concat ? T : 1); j++) {
    size_t c = (size_t)((rank + (concat ? j : shift)) % T); /* the chunk of the whole value */
    for (int64_t o = 0; o < outer; o++) {
      if (concat)
        memcpy((char *)dst + (size_t)o * row + c * blk, (const char *)src[j] + (size_t)o * blk, blk);
      else
        memcpy((char *)dst + (size_t)o * blk, (const char *)src[0] + (size_t)o * row + c * blk, blk);
    }
  }
}

void step_coll_free(StepColl *c) {
  if (c->req) {
    char e[256];
    (void)comm_wait(c->req, e, sizeof e); /* the buffers are in use until it completes */
  }
  free(c->stage);
  free(c->own);
  memset(c, 0, sizeof *c);
}
