/* api_zero.c - ZeRO-1 for the C API (gradc_compile_options.zero1 with
 * dp > 1; docs/DISTRIBUTED.md "ZeRO-1"): the optimiser state is sharded
 * over the data-parallel ranks.
 *
 * Layout.  The params, in declaration order, are laid end to end in one
 * flat vector per storage dtype (group 0: F32 master weights, group 1:
 * F64).  A group of n elements is cut into dp parts of count = ceil(n / dp)
 * elements (the last ones shorter, possibly empty): rank r owns elements
 * [r * count, min((r + 1) * count, n)).  A part may begin or end inside a
 * param; per param the layout keeps the slice [lo, lo + len) of it this
 * rank owns (len may be 0).
 *
 * A step.  The program's pipeline has no dp gradient all-reduces (dp-reduce
 * skips under PassOptions.zero1), so after the last micro-batch each
 * rank's gradients are its own window's.  zero_reduce_scatter packs them
 * into one flat buffer per group (f32 gradients as f32, f64 as f64, padded
 * with zeros to dp * count) and reduce-scatters it over the dp group: each
 * rank receives the sum of its part, which it writes back into its slice
 * of each gradient (the rest is zeroed: it is not this rank's to know).
 * The optimiser then updates only the owned slices, with state (AdamW's
 * moments, SGD's momentum) allocated for those slices alone, and
 * zero_gather_params all-gathers the updated params so every rank holds
 * the whole params again (the same bits on every rank).  The global
 * gradient norm is the all-reduce of the ranks' sums of squares of their
 * parts.
 *
 * Whole values when asked: zero_gather_grads all-gathers the gradient
 * parts (collective: gradc_session_get_grad / save_grads on a sharded
 * result, and api_run_window, whose callers such as `gradc run` want whole
 * gradients, so there the reduction is a reduce-scatter plus an
 * all-gather); zero_gather_slots all-gathers one optimiser slot for a
 * checkpoint, which rank 0 writes whole, so checkpoints are the same with
 * or without ZeRO-1.  Loading a checkpoint needs no communication: every
 * rank reads the file and keeps its slices. */
#include <stdlib.h>
#include <string.h>

#include "api_impl.h"

static const char *const group_tag[2] = {"zero1.f32", "zero1.f64"};

ZeroLayout *api_zero_layout(const gradc_program *p) {
  if (!p->zero1 || !p->comm || p->comm->dp_group.size <= 1) return NULL;
  const CommGroup *g = &p->comm->dp_group;
  ZeroLayout *z = mem_calloc(1, sizeof *z);
  z->dp = g->size;
  z->rank = g->rank;
  int n = p->nparams;
  z->nparams = n;
  z->group = mem_calloc((size_t)n, sizeof(int));
  z->off = mem_calloc((size_t)n, sizeof(int64_t));
  z->lo = mem_calloc((size_t)n, sizeof(int64_t));
  z->len = mem_calloc((size_t)n, sizeof(int64_t));
  for (int i = 0; i < n; i++) {
    int gi = api_param_f64(&p->params[i]) ? 1 : 0;
    z->group[i] = gi;
    z->off[i] = z->n[gi];
    z->n[gi] += ir_numel(&p->params[i].type.shape);
  }
  for (int gi = 0; gi < 2; gi++) z->count[gi] = (z->n[gi] + z->dp - 1) / z->dp;
  for (int i = 0; i < n; i++) {
    int gi = z->group[i];
    int64_t numel = ir_numel(&p->params[i].type.shape);
    int64_t begin = (int64_t)z->rank * z->count[gi] - z->off[i], end = begin + z->count[gi];
    if (begin < 0) begin = 0;
    if (end > numel) end = numel;
    z->lo[i] = begin < numel ? begin : numel;
    z->len[i] = end > z->lo[i] ? end - z->lo[i] : 0;
  }
  return z;
}

void api_zero_free(ZeroLayout *z) {
  if (!z) return;
  free(z->group);
  free(z->off);
  free(z->lo);
  free(z->len);
  free(z);
}

/* The param index of each gradient of r (by name). */
static int *grad_params(const gradc_program *p, const StepResult *r) {
  int *pi = mem_calloc((size_t)r->ngrads, sizeof(int));
  for (int k = 0; k < r->ngrads; k++) {
    pi[k] = api_param_index(p, r->grad_names[k]);
    GRADC_ASSERT(pi[k] >= 0);
  }
  return pi;
}

static void put(void *buf, int gi, int64_t at, double v) {
  if (gi)
    ((double *)buf)[at] = v;
  else
    ((float *)buf)[at] = (float)v;
}

static double get(const void *buf, int gi, int64_t at) {
  return gi ? ((const double *)buf)[at] : (double)((const float *)buf)[at];
}

/* Wait for the requests started (the first failure's message is kept). */
static bool wait_all(CommReq **req, int n, bool ok, char *err, size_t errlen) {
  for (int i = 0; i < n; i++) {
    char e[1024];
    if (req[i] && !comm_wait(req[i], e, sizeof e) && ok) {
      ok = false;
      snprintf(err, errlen, "%s", e);
    }
  }
  return ok;
}

bool api_zero_reduce_scatter(const gradc_program *p, StepResult *r, char *err, size_t errlen) {
  const ZeroLayout *z = p->zero;
  CommGroup *g = &p->comm->dp_group;
  int *pi = grad_params(p, r);
  void *send[2] = {NULL, NULL}, *recv[2] = {NULL, NULL};
  CommReq *req[2] = {NULL, NULL};
  bool ok = true;
  for (int gi = 0; ok && gi < 2; gi++) {
    if (z->n[gi] == 0) continue;
    size_t es = gi ? 8 : 4;
    send[gi] = mem_calloc((size_t)(z->count[gi] * z->dp), es);
    recv[gi] = mem_calloc((size_t)z->count[gi], es);
    for (int k = 0; k < r->ngrads; k++) {
      if (z->group[pi[k]] != gi) continue;
      int64_t m = ir_numel(&r->grad_types[k].shape), at = z->off[pi[k]];
      for (int64_t j = 0; j < m; j++) put(send[gi], gi, at + j, r->grads[k][j]);
    }
    ok = comm_reduce_scatter_start(g, send[gi], recv[gi], z->count[gi], gi ? COMM_F64 : COMM_F32, COMM_SUM,
                                   hash_str(group_tag[gi]), &req[gi], err, errlen);
  }
  ok = wait_all(req, 2, ok, err, errlen);
  /* This rank's slice of each gradient gets the sum; the rest is zeroed. */
  for (int k = 0; ok && k < r->ngrads; k++) {
    int i = pi[k], gi = z->group[i];
    int64_t m = ir_numel(&r->grad_types[k].shape), base = z->off[i] - (int64_t)z->rank * z->count[gi];
    for (int64_t j = 0; j < m; j++)
      r->grads[k][j] = j >= z->lo[i] && j < z->lo[i] + z->len[i] ? get(recv[gi], gi, base + j) : 0.0;
  }
  for (int gi = 0; gi < 2; gi++) {
    free(send[gi]);
    free(recv[gi]);
  }
  free(pi);
  return ok;
}

/* All-gather per group: mine(k, gi, buf) packs this rank's part into buf
 * (count elements, at position 0); the whole vectors come back in whole[]
 * (malloc'd; NULL for an empty group). */
typedef void (*PackFn)(const void *ctx, const ZeroLayout *z, int gi, void *part);

static bool gather(const gradc_program *p, PackFn pack, const void *ctx, const char *what, void *whole[2], char *err,
                   size_t errlen) {
  const ZeroLayout *z = p->zero;
  CommGroup *g = &p->comm->dp_group;
  void *part[2] = {NULL, NULL};
  CommReq *req[2] = {NULL, NULL};
  bool ok = true;
  whole[0] = whole[1] = NULL;
  for (int gi = 0; ok && gi < 2; gi++) {
    if (z->n[gi] == 0) continue;
    size_t es = gi ? 8 : 4;
    part[gi] = mem_calloc((size_t)z->count[gi], es);
    whole[gi] = mem_calloc((size_t)(z->count[gi] * z->dp), es);
    pack(ctx, z, gi, part[gi]);
    ok = comm_all_gather_start(g, part[gi], whole[gi], z->count[gi], gi ? COMM_F64 : COMM_F32,
                               hash_str(what) ^ hash_str(group_tag[gi]), &req[gi], err, errlen);
  }
  ok = wait_all(req, 2, ok, err, errlen);
  for (int gi = 0; gi < 2; gi++) {
    free(part[gi]);
    if (!ok) {
      free(whole[gi]);
      whole[gi] = NULL;
    }
  }
  return ok;
}

/* ---- gradients ---- */

typedef struct GradCtx {
  const gradc_program *p;
  const StepResult *r;
  const int *pi;
} GradCtx;

static void pack_grads(const void *ctx, const ZeroLayout *z, int gi, void *part) {
  const GradCtx *c = ctx;
  for (int k = 0; k < c->r->ngrads; k++) {
    int i = c->pi[k];
    if (z->group[i] != gi) continue;
    int64_t base = z->off[i] - (int64_t)z->rank * z->count[gi];
    for (int64_t j = z->lo[i]; j < z->lo[i] + z->len[i]; j++) put(part, gi, base + j, c->r->grads[k][j]);
  }
}

bool api_zero_gather_grads(const gradc_program *p, StepResult *r, char *err, size_t errlen) {
  int *pi = grad_params(p, r);
  GradCtx c = {p, r, pi};
  void *whole[2];
  bool ok = gather(p, pack_grads, &c, "zero1.grads", whole, err, errlen);
  for (int k = 0; ok && k < r->ngrads; k++) {
    int i = pi[k], gi = p->zero->group[i];
    int64_t m = ir_numel(&r->grad_types[k].shape);
    for (int64_t j = 0; j < m; j++) r->grads[k][j] = get(whole[gi], gi, p->zero->off[i] + j);
  }
  free(whole[0]);
  free(whole[1]);
  free(pi);
  return ok;
}

bool api_zero_norm2(const gradc_program *p, StepResult *r, double scale, double *out, char *err, size_t errlen) {
  const ZeroLayout *z = p->zero;
  int *pi = grad_params(p, r);
  double ss = 0, inv = 1.0 / scale;
  if (scale != 1.0)
    for (int i = 0; i < r->nlosses; i++) r->losses[i] *= inv;
  for (int k = 0; k < r->ngrads; k++) {
    int i = pi[k];
    double *g = r->grads[k] + z->lo[i];
    ss += scale != 1.0 ? api_unscale_sum_squares(g, z->len[i], inv) : api_sum_squares(g, z->len[i]);
  }
  free(pi);
  bool ok = comm_all_reduce(&p->comm->dp_group, &ss, &ss, 1, COMM_F64, COMM_SUM, hash_str("zero1.norm"), err, errlen);
  *out = ss;
  return ok;
}

/* ---- params ---- */

static void pack_params(const void *ctx, const ZeroLayout *z, int gi, void *part) {
  const StFile *f = ctx;
  size_t es = gi ? 8 : 4;
  for (int i = 0; i < f->n; i++) {
    if (z->group[i] != gi || !z->len[i]) continue;
    int64_t base = z->off[i] - (int64_t)z->rank * z->count[gi];
    memcpy((char *)part + (size_t)(base + z->lo[i]) * es, (const char *)f->t[i].data + (size_t)z->lo[i] * es,
           (size_t)z->len[i] * es);
  }
}

bool api_zero_gather_params(const gradc_program *p, StFile *params, char *err, size_t errlen) {
  void *whole[2];
  if (!gather(p, pack_params, params, "zero1.params", whole, err, errlen)) return false;
  for (int i = 0; i < params->n; i++) {
    int gi = p->zero->group[i];
    size_t es = gi ? 8 : 4;
    StTensor *t = &params->t[i];
    GRADC_ASSERT(t->dtype == (gi ? ST_F64 : ST_F32));
    memcpy(t->data, (char *)whole[gi] + (size_t)p->zero->off[i] * es, t->nbytes);
  }
  free(whole[0]);
  free(whole[1]);
  return true;
}

/* ---- optimiser slots ---- */

static void pack_slot(const void *ctx, const ZeroLayout *z, int gi, void *part) {
  void *const *slot = ctx;
  size_t es = gi ? 8 : 4;
  for (int i = 0; i < z->nparams; i++) {
    if (z->group[i] != gi || !z->len[i]) continue;
    int64_t base = z->off[i] - (int64_t)z->rank * z->count[gi];
    memcpy((char *)part + (size_t)(base + z->lo[i]) * es, slot[i], (size_t)z->len[i] * es);
  }
}

bool api_zero_gather_slot(const gradc_program *p, void *const *slot, void *whole[2], char *err, size_t errlen) {
  return gather(p, pack_slot, slot, "zero1.slot", whole, err, errlen);
}

int64_t api_optim_state_bytes(const gradc_session *s) {
  int64_t bytes = 0;
  void **slots[2] = {s->slot0, s->slot1};
  for (int k = 0; k < 2; k++)
    for (int i = 0; slots[k] && i < s->p->nparams; i++) {
      int64_t n = s->p->zero ? s->p->zero->len[i] : st_numel(&s->params.t[i]);
      bytes += n * (int64_t)st_dtype_size(s->params.t[i].dtype);
    }
  return bytes;
}
