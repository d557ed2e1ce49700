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
 * The window in progress is the calling thread's (step_dp_begin), which is
 * how the shared helpers reach it without a parameter: both step drivers
 * (the reference interpreter and the CPU executor) call them. */
#include <stdlib.h>
#include <string.h>

#include "comm.h"

static void *xcalloc(size_t n, size_t size) {
  void *p = calloc(n ? n : 1, size);
  if (!p) abort();
  return p;
}

static _Thread_local StepDp *current;

void step_dp_init(StepDp *d, Comm *c) {
  memset(d, 0, sizeof *d);
  d->comm = c;
  d->g = c ? &c->dp_group : NULL;
}

void step_dp_free(StepDp *d) {
  if (current == d) current = NULL;
  free(d->views);
  memset(d, 0, sizeof *d);
}

void step_dp_begin(StepDp *d) { current = d; }

int step_dp_size(void) { return current && current->g ? current->g->size : 1; }

static bool split_arg(const IrValue *a) { return a->role == IR_ARG_INPUT && a->batched && a->type.shape.rank > 0; }

void step_dp_slice(const IrFunc *f, const StTensor **bound) {
  StepDp *d = current;
  if (!d || step_dp_size() == 1) return;
  if (d->nviews < f->nargs) {
    free(d->views);
    d->views = xcalloc((size_t)f->nargs, sizeof(StTensor));
    d->nviews = f->nargs;
  }
  int size = d->g->size, rank = d->g->rank;
  for (int i = 0; i < f->nargs; i++) {
    const StTensor *t = bound[i];
    if (!t || !split_arg(f->args[i]) || t->shape[0] == 0) continue;
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

bool step_dp_reduce_sums(const IrFunc *f, double **wsum, char *err, size_t n) {
  if (step_dp_size() == 1) return true;
  int64_t total = 0;
  for (int i = 0; i < f->nops; i++)
    if (f->ops[i]->opcode == IR_OP_WINDOW_SUM) total += ir_numel(&f->ops[i]->result->type.shape);
  if (total == 0) return true;
  /* One all-reduce for every window sum, packed in op order. */
  double *buf = xcalloc((size_t)total, sizeof(double));
  int64_t k = 0;
  for (int i = 0; i < f->nops; i++) {
    const IrOp *op = f->ops[i];
    if (op->opcode != IR_OP_WINDOW_SUM) continue;
    int64_t m = ir_numel(&op->result->type.shape);
    memcpy(buf + k, wsum[op->result->id], sizeof(double) * (size_t)m);
    k += m;
  }
  bool ok = comm_all_reduce(current->g, buf, buf, total, COMM_F64, COMM_SUM, hash_str("window.sum"), err, n);
  k = 0;
  for (int i = 0; ok && i < f->nops; i++) {
    const IrOp *op = f->ops[i];
    if (op->opcode != IR_OP_WINDOW_SUM) continue;
    int64_t m = ir_numel(&op->result->type.shape);
    memcpy(wsum[op->result->id], buf + k, sizeof(double) * (size_t)m);
    k += m;
  }
  free(buf);
  return ok;
}

bool step_dp_end(StepDp *d, StepResult *r, char *err, size_t n) {
  if (current == d) current = NULL;
  if (!r || !d->g || d->g->size == 1) return true;
  /* Every gradient and the losses in flight at once, then wait for all
   * (a failed start or wait keeps the first message). */
  CommReq **req = xcalloc((size_t)r->ngrads + 1, sizeof(CommReq *));
  int started = 0;
  bool ok = true;
  char why[1024] = "";
  for (int i = 0; ok && i < r->ngrads; i++) {
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
  /* A gradient buffer of f32 holds the sum rounded to f32. */
  for (int i = 0; ok && i < r->ngrads; i++) {
    if (r->grad_types[i].dtype == IR_DT_F64) continue;
    int64_t m = ir_numel(&r->grad_types[i].shape);
    for (int64_t e = 0; e < m; e++) r->grads[i][e] = interp_round(r->grads[i][e], r->grad_types[i].dtype);
  }
  if (ok) ok = comm_check(d->g, "the step", why, sizeof why);
  if (!ok && err && n) snprintf(err, n, "%s", why);
  return ok;
}
