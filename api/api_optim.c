/* api_optim.c - optimisers, the learning-rate schedule and checkpoints of
 * the C API (include/gradc.h), with torch.optim semantics.
 *
 * One step is one fused pass over each param: scale the gradient by the
 * clipping coefficient, then the optimiser's update, element by element,
 * in the param's precision (f32; f64 for f64 params) and in the order of
 * operations of torch's single-tensor (for-loop) implementations:
 *
 *   clip (torch.nn.utils.clip_grad_norm_, the norm over every gradient):
 *     c = min(max_norm / (total_norm + 1e-6), 1);  g = g * c
 *   SGD:
 *     g = g + wd * p                                     (weight decay: L2)
 *     b = g on the first step, else b = b * momentum + (1 - dampening) * g
 *     g = nesterov ? g + momentum * b : b                (when momentum != 0)
 *     p = p + (-lr) * g
 *   AdamW (t = steps taken, this one included):
 *     p = p * (1 - lr * wd)                              (decoupled decay, first)
 *     m = lerp(m, g, 1 - beta1);  v = v * beta2 + (1 - beta2) * g * g
 *     p = p + (-lr / (1 - beta1^t)) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
 *
 * The gradients of the last run are not modified (clipping is applied on
 * the fly).  Scalars are computed in double and rounded to the param's
 * precision where torch rounds a Python float to the tensor's dtype.
 *
 * Who runs the pass: on the CPU back end a kernel generated with LLVM
 * (codegen/llvm_optim.c: one per optimiser kind and param dtype,
 * vectorised, built at the session's first step and kept in the object
 * cache); on the interpreter and in builds without LLVM the C loop of
 * codegen/optim.c.  Both perform the same operations in the same order,
 * so they give the same bits and a run may switch between them.
 *
 * The learning rate of step s (0-based: s steps taken so far) is lr * f(s),
 * which is what torch.optim.lr_scheduler.LambdaLR(opt, f) gives when
 * scheduler.step() follows every optimizer.step():
 *
 *   W = warmup_steps, T = total_steps
 *   f(s) = (s + 1) / W                                   s < W
 *        = 1                                             s >= W, constant (or T == 0)
 *        = (min_lr + (lr - min_lr) * d(p)) / lr          otherwise,
 *          p = min(max(s - W, 0) / max(T - W, 1), 1)
 *          d(p) = (1 + cos(pi * p)) / 2   cosine;   1 - p   linear
 *
 * so the rate rises linearly to lr over the first W steps (the first step
 * uses lr / W), then stays (constant) or follows a half cosine or a line
 * from lr at step W to min_lr at step T, and stays at min_lr.  The schedule
 * AUTO is cosine when T > 0, else constant.
 *
 * Weight decay skips the params the options exclude (no_decay_1d: rank
 * <= 1; no_decay: fnmatch patterns of names), as a torch param group with
 * weight_decay 0 would: their update is the same with the decay term
 * off.
 *
 * set_optimizer with a new kind starts fresh state (zero slots, step 0);
 * with the kind already in use it changes the options and keeps the state
 * (as changing a torch param group's options does).
 *
 * Checkpoints are safetensors: the params by name, optimiser slots as
 * `optim.<slot>.<param>` (exp_avg, exp_avg_sq, momentum_buffer), and in
 * __metadata__: format, gradc_version, model, fingerprint, step, the four
 * xoshiro256** words of the session generator (rng.s0..rng.s3, decimal),
 * the seed of the random draws and their step's offset from the step count
 * (draws.seed, draws.offset, decimal; optional on loading: 0),
 * and the optimiser (optimizer = sgd|adamw|none, optimizer.<option> as
 * shortest round-trip decimals).  Everything is restored bit for bit, so
 * training resumed from a checkpoint continues exactly as it would have.
 *
 * ZeRO-1 (api_zero.c): the slots hold this rank's slices only, the update
 * runs on those slices and is followed by an all-gather of the params;
 * checkpoints gather the slots whole for rank 0 and loading keeps the
 * slices. */
#include <errno.h>
#include <fnmatch.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "codegen/codegen.h"
#include "api_impl.h"

#define CKPT_FORMAT "gradc-checkpoint-1"

static gradc_status null_arg(const char *fn) { return api_fail(GRADC_ERR_USER, "gradc: error: %s: NULL argument", fn); }

/* ------------------------------------------------------------------ */
/* Options and state                                                    */
/* ------------------------------------------------------------------ */

void gradc_optimizer_options_init(gradc_optimizer_options *o, gradc_optimizer_kind kind) {
  memset(o, 0, sizeof *o);
  o->kind = kind;
  o->lr = 1e-3; /* torch.optim.SGD and AdamW */
  o->beta1 = 0.9;
  o->beta2 = 0.999;
  o->eps = 1e-8;
  o->weight_decay = kind == GRADC_ADAMW ? 1e-2 : 0;
}

static const char *kind_name(gradc_optimizer_kind k) {
  switch (k) {
  case GRADC_SGD: return "sgd";
  case GRADC_ADAMW: return "adamw";
  }
  return "?";
}

int api_optim_slots(const gradc_optimizer_options *o, const char **names) {
  switch (o->kind) {
  case GRADC_SGD:
    if (o->momentum == 0) return 0;
    names[0] = "momentum_buffer";
    return 1;
  case GRADC_ADAMW:
    names[0] = "exp_avg";
    names[1] = "exp_avg_sq";
    return 2;
  }
  return 0;
}

void api_optim_free_state(gradc_session *s) {
  int n = s->p->nparams;
  for (int i = 0; i < n; i++) {
    if (s->slot0) free(s->slot0[i]);
    if (s->slot1) free(s->slot1[i]);
  }
  free(s->slot0);
  free(s->slot1);
  s->slot0 = s->slot1 = NULL;
  s->momentum_valid = false;
}

/* Zeroed slot arrays for every slot o uses that is not allocated yet. */
static void alloc_slots(gradc_session *s, const gradc_optimizer_options *o) {
  const char *names[2];
  int nslots = api_optim_slots(o, names);
  void ***slots[2] = {&s->slot0, &s->slot1};
  for (int k = 0; k < nslots; k++) {
    if (*slots[k]) continue;
    *slots[k] = mem_calloc((size_t)s->p->nparams, sizeof(void *));
    /* ZeRO-1: state for this rank's slice of each param only. */
    for (int i = 0; i < s->p->nparams; i++)
      (*slots[k])[i] = mem_calloc((size_t)(s->p->zero ? s->p->zero->len[i] : st_numel(&s->params.t[i])),
                               st_dtype_size(s->params.t[i].dtype));
  }
}

static gradc_status check_optimizer(const gradc_optimizer_options *o) {
  const char *bad = NULL;
  if (o->kind != GRADC_SGD && o->kind != GRADC_ADAMW) bad = "unknown optimiser kind";
  else if (!(o->lr >= 0) || !isfinite(o->lr)) bad = "lr must be >= 0";
  else if (!(o->min_lr >= 0) || !isfinite(o->min_lr)) bad = "min_lr must be >= 0";
  else if (!(o->weight_decay >= 0)) bad = "weight_decay must be >= 0";
  else if (!(o->clip_norm >= 0)) bad = "clip_norm must be >= 0 (0 = off)";
  else if (o->warmup_steps < 0 || o->total_steps < 0) bad = "warmup_steps and total_steps must be >= 0";
  else if ((unsigned)o->schedule > GRADC_SCHEDULE_COSINE) bad = "unknown schedule";
  else if (o->kind == GRADC_SGD && !(o->momentum >= 0)) bad = "momentum must be >= 0";
  else if (o->kind == GRADC_SGD && o->nesterov && (o->momentum <= 0 || o->dampening != 0))
    bad = "Nesterov momentum requires a momentum and zero dampening";
  else if (o->kind == GRADC_ADAMW && !(o->beta1 >= 0 && o->beta1 < 1 && o->beta2 >= 0 && o->beta2 < 1))
    bad = "betas must be in [0, 1)";
  else if (o->kind == GRADC_ADAMW && !(o->eps >= 0)) bad = "eps must be >= 0";
  if (bad) return api_fail(GRADC_ERR_USER, "gradc: error: set_optimizer: %s", bad);
  return GRADC_OK;
}

void api_optim_free_options(gradc_session *s) {
  free(s->no_decay);
  free(s->decay_off);
  s->no_decay = NULL;
  s->decay_off = NULL;
  s->opt.no_decay = NULL;
}

/* Whether name matches one of the comma-separated fnmatch patterns. */
static bool matches_any(const char *patterns, const char *name) {
  for (const char *p = patterns; p && *p;) {
    const char *end = strchr(p, ',');
    size_t len = end ? (size_t)(end - p) : strlen(p);
    char pat[256];
    if (len > 0 && len < sizeof pat) {
      memcpy(pat, p, len);
      pat[len] = 0;
      if (fnmatch(pat, name, 0) == 0) return true;
    }
    p += len + (end ? 1 : 0);
  }
  return false;
}

/* s->opt = *o, with the session's own copy of the no-decay patterns and
 * the per-param mask they give. */
static void set_options(gradc_session *s, const gradc_optimizer_options *o) {
  char *copy = o->no_decay && *o->no_decay ? mem_strdup(o->no_decay) : NULL;
  api_optim_free_options(s);
  s->opt = *o;
  s->no_decay = copy;
  s->opt.no_decay = copy;
  s->decay_off = mem_calloc((size_t)s->p->nparams + 1, sizeof(bool));
  for (int i = 0; i < s->p->nparams; i++) {
    const FeParam *q = &s->p->params[i];
    s->decay_off[i] = (o->no_decay_1d && q->type.shape.rank <= 1) || matches_any(copy, q->name);
  }
}

/* Install options: a new kind starts fresh state. */
static void install_optimizer(gradc_session *s, const gradc_optimizer_options *o) {
  if (!s->have_opt || s->opt.kind != o->kind) {
    api_optim_free_state(s);
    s->step = 0;
  }
  set_options(s, o);
  s->have_opt = true;
  alloc_slots(s, o);
}

gradc_status gradc_session_set_optimizer(gradc_session *s, const gradc_optimizer_options *o) {
  if (!s || !o) return null_arg("session_set_optimizer");
  if (s->p->forward_only)
    return api_fail(GRADC_ERR_USER, "gradc: error: session_set_optimizer: model '%s' was compiled forward-only: it has "
                                    "no gradients to step with (compile it without forward_only)", s->p->model);
  gradc_status st = check_optimizer(o);
  if (st) return st;
  install_optimizer(s, o);
  return GRADC_OK;
}

/* ------------------------------------------------------------------ */
/* The schedule                                                        */
/* ------------------------------------------------------------------ */

static double lr_factor(const gradc_optimizer_options *o, int64_t step) {
  int64_t w = o->warmup_steps, t = o->total_steps;
  if (w > 0 && step < w) return (double)(step + 1) / (double)w;
  gradc_schedule sched = o->schedule;
  if (sched == GRADC_SCHEDULE_AUTO) sched = t > 0 ? GRADC_SCHEDULE_COSINE : GRADC_SCHEDULE_CONSTANT;
  if (sched == GRADC_SCHEDULE_CONSTANT || t <= 0 || o->lr == 0) return 1.0;
  double p = (double)(step > w ? step - w : 0) / (double)(t - w > 1 ? t - w : 1);
  if (p > 1) p = 1;
  double shape = sched == GRADC_SCHEDULE_LINEAR ? 1.0 - p : 0.5 * (1.0 + cos(M_PI * p));
  return (o->min_lr + (o->lr - o->min_lr) * shape) / o->lr;
}

static double lr_at(const gradc_optimizer_options *o, int64_t step) { return o->lr * lr_factor(o, step); }

int64_t gradc_session_step_count(const gradc_session *s) { return s ? s->step : 0; }

double gradc_session_lr(const gradc_session *s) { return s && s->have_opt ? lr_at(&s->opt, s->step) : 0.0; }

double gradc_session_grad_norm(const gradc_session *s) { return s && s->have_res ? s->grad_norm : NAN; }

/* ------------------------------------------------------------------ */
/* The fused update                                                     */
/* ------------------------------------------------------------------ */

/* This step's scalars (codegen.h's CgOptimScalars), in double: the
 * update rounds them to f32 for f32 params. */
static void step_scalars(const gradc_session *s, CgOptimScalars *sc) {
  const gradc_optimizer_options *o = &s->opt;
  double lr = lr_at(o, s->step), t = (double)(s->step + 1);
  memset(sc, 0, sizeof *sc);
  sc->coef = 1.0;
  if (o->clip_norm > 0) {
    /* clip_grad_norm_: max_norm / (total_norm + 1e-6), clamped to 1 (in f32 for f32 gradients). */
    bool any64 = false;
    for (int i = 0; i < s->p->nparams; i++) any64 |= api_param_f64(&s->p->params[i]);
    if (any64)
      sc->coef = o->clip_norm / (s->grad_norm + 1e-6);
    else
      sc->coef = (float)o->clip_norm / ((float)s->grad_norm + 1e-6f);
    if (sc->coef > 1.0) sc->coef = 1.0;
    sc->clip = 1;
  }
  if (o->kind == GRADC_SGD) {
    sc->neg_lr = -lr;
    sc->wd_on = o->weight_decay != 0;
    sc->wd = o->weight_decay;
    sc->mom_on = o->momentum != 0;
    sc->momentum = o->momentum;
    sc->damp1 = 1.0 - o->dampening;
    sc->nesterov = o->nesterov != 0;
    sc->first = !s->momentum_valid;
    return;
  }
  double bc1 = 1.0 - pow(o->beta1, t), bc2 = 1.0 - pow(o->beta2, t);
  sc->decay = 1.0 - lr * o->weight_decay;
  sc->w1 = 1.0 - o->beta1;
  sc->beta2 = o->beta2;
  sc->w2 = 1.0 - o->beta2;
  sc->eps = o->eps;
  sc->neg_step = -(lr / bc1);
  sc->bc2_sqrt = sqrt(bc2);
}

/* The generated update kernels of the session's optimiser kind, built at
 * the first step of a session on the CPU back end (NULL elsewhere: the C
 * loop runs). */
static gradc_status optim_code(gradc_session *s, CgOptimKind kind, const CgOptim **out) {
  *out = NULL;
#ifdef GRADC_HAVE_LLVM
  if (!s->p->backend->llvm_optim) return GRADC_OK;
  if (!s->optim_code || !(cg_optim_kinds(s->optim_code) & (1u << kind))) {
    unsigned kinds = cg_optim_kinds(s->optim_code) | (1u << kind);
    char dir[4096], err[1024];
    const char *cdir = !s->p->no_cache && cache_dir(dir, sizeof dir) ? dir : NULL;
    CgOptim *m = cg_optim_compile(kinds, cdir, err, sizeof err);
    if (!m) return api_fail(GRADC_ERR_INTERNAL, "gradc: internal error: optimiser kernels: %s", err);
    cg_optim_free(s->optim_code);
    s->optim_code = m;
  }
  *out = s->optim_code;
#else
  (void)s, (void)kind;
#endif
  return GRADC_OK;
}

void api_optim_free_code(gradc_session *s) {
#ifdef GRADC_HAVE_LLVM
  cg_optim_free(s->optim_code);
#endif
  s->optim_code = NULL;
}

/* f16 (DESIGN.md §3 rule 7): after a window that overflowed, skip the step
 * (true: params and optimiser state untouched, the step counted), zero
 * the gradients and halve S once `hysteresis` overflows came in a row;
 * after a clean one, count it towards doubling S (false: step). */
static bool loss_scale_skip(gradc_session *s) {
  if (!s->overflow) {
    s->overflows_left = s->ls.hysteresis;
    if (++s->clean_steps >= s->ls.window) {
      s->loss_scale *= 2;
      s->clean_steps = 0;
    }
    return false;
  }
  for (int i = 0; i < s->res.ngrads; i++)
    memset(s->res.grads[i], 0, (size_t)ir_numel(&s->res.grad_types[i].shape) * sizeof(double));
  s->grad_norm = 0;
  s->clean_steps = 0;
  if (--s->overflows_left <= 0) {
    s->loss_scale = s->loss_scale / 2 >= s->ls.min_scale ? s->loss_scale / 2 : s->ls.min_scale;
    s->overflows_left = s->ls.hysteresis;
  }
  s->skipped++;
  s->step++;
  s->overflow = false; /* the step is done with (a second call steps on zero gradients) */
  return true;
}

gradc_status gradc_session_step(gradc_session *s) {
  if (!s) return null_arg("session_step");
  if (!s->have_opt)
    return api_fail(GRADC_ERR_USER, "gradc: error: session_step: no optimiser (call gradc_session_set_optimizer first)");
  if (!s->have_res)
    return api_fail(GRADC_ERR_USER, "gradc: error: session_step: no gradients (call gradc_session_run first)");
  if (s->p->precision == IR_DT_F16 && loss_scale_skip(s)) return GRADC_OK;
  CgOptimKind kind = s->opt.kind == GRADC_SGD ? CG_OPTIM_SGD : CG_OPTIM_ADAMW;
  const CgOptim *code;
  gradc_status st = optim_code(s, kind, &code);
  if (st) return st;
  CgOptimScalars sc, sc_nd; /* sc_nd: the same step without weight decay */
  step_scalars(s, &sc);
  sc_nd = sc;
  sc_nd.wd_on = 0;
  sc_nd.wd = 0;
  sc_nd.decay = 1.0;
  const ZeroLayout *z = s->p->zero;
  api_params_changed(s);
  for (int i = 0; i < s->p->nparams; i++) {
    StTensor *t = &s->params.t[i];
    const double *g = NULL;
    for (int k = 0; k < s->res.ngrads && !g; k++)
      if (strcmp(s->res.grad_names[k], t->name) == 0) g = s->res.grads[k];
    GRADC_ASSERT(g != NULL);
    void *s0 = s->slot0 ? s->slot0[i] : NULL, *s1 = s->slot1 ? s->slot1[i] : NULL;
    bool f64 = t->dtype == ST_F64;
    const CgOptimScalars *psc = s->decay_off && s->decay_off[i] ? &sc_nd : &sc;
    /* ZeRO-1: only this rank's slice (the update is element-wise, so a
     * slice updates exactly as it would within the whole tensor). */
    void *data = t->data;
    int64_t n = st_numel(t);
    if (z) {
      data = (char *)t->data + (size_t)z->lo[i] * st_dtype_size(t->dtype);
      g += z->lo[i];
      n = z->len[i];
      if (n == 0) continue;
    }
#ifdef GRADC_HAVE_LLVM
    CgOptimFn fn = code ? cg_optim_kernel(code, kind, f64) : NULL;
    if (fn) {
      fn(data, g, s0, s1, n, psc);
      continue;
    }
#endif
    cg_optim_update_c(kind, f64, data, g, s0, s1, n, psc);
  }
  /* ZeRO-1: every rank gets the whole updated params. */
  char err[2048];
  if (z && !api_zero_gather_params(s->p, &s->params, err, sizeof err))
    return api_fail(GRADC_ERR_USER, "gradc: error: session_step: %s", err);
  if (s->opt.kind == GRADC_SGD && s->opt.momentum != 0) s->momentum_valid = true;
  s->step++;
  return GRADC_OK;
}

gradc_status gradc_session_skip_step(gradc_session *s) {
  if (!s) return null_arg("session_skip_step");
  if (!s->have_opt)
    return api_fail(GRADC_ERR_USER, "gradc: error: session_skip_step: no optimiser (call gradc_session_set_optimizer first)");
  s->step++;
  return GRADC_OK;
}

/* ------------------------------------------------------------------ */
/* Non-finite values                                                   */
/* ------------------------------------------------------------------ */

/* Whether element i of b (es bytes each, f32 or f64) is an inf or a NaN:
 * all the exponent bits of its high 32 bits set (mask). */
static inline bool nonfinite_at(const unsigned char *b, int64_t i, int es, uint32_t mask) {
  uint32_t hi;
  if (es == 4) {
    memcpy(&hi, b + 4 * i, 4);
  } else {
    uint64_t u;
    memcpy(&u, b + 8 * i, 8);
    hi = (uint32_t)(u >> 32);
  }
  return (hi & mask) == mask;
}

/* The first element of x[0, n) that is an inf or a NaN, or -1.  Blocks of
 * 64 are tested with straight-line code over the bits, which -O2
 * vectorises (a loop of unknown length it would leave scalar: 8% of
 * tinygpt small's training, params and both AdamW slots every step), so
 * the common case (all finite) costs one read of the data; the first
 * block with one is then searched. */
#define NONFINITE_BLOCK 64
static inline int64_t first_nonfinite_bits(const unsigned char *b, int64_t n, int es, uint32_t mask) {
  int64_t i = 0;
  for (; i + NONFINITE_BLOCK <= n; i += NONFINITE_BLOCK) {
    uint32_t any = 0;
    for (int k = 0; k < NONFINITE_BLOCK; k++) any |= nonfinite_at(b, i + k, es, mask);
    if (any) break;
  }
  for (; i < n; i++)
    if (nonfinite_at(b, i, es, mask)) return i;
  return -1;
}

static int64_t first_nonfinite(const void *x, StDType dt, int64_t n) {
  if (dt == ST_F32) return first_nonfinite_bits(x, n, 4, 0x7f800000u);
  if (dt == ST_F64) return first_nonfinite_bits(x, n, 8, 0x7ff00000u);
  return -1;
}

/* "inf at element 3" into buf. */
static void describe_nonfinite(const void *x, StDType dt, int64_t i, int64_t offset, char *buf, size_t n) {
  double v = 0;
  if (dt == ST_F32) {
    float f;
    memcpy(&f, (const char *)x + 4 * i, 4);
    v = f;
  } else {
    memcpy(&v, (const char *)x + 8 * i, 8);
  }
  snprintf(buf, n, "%s at element %lld", isnan(v) ? "nan" : v > 0 ? "inf" : "-inf", (long long)(i + offset));
}

int gradc_session_find_nonfinite(const gradc_session *s, char *what, size_t n) {
  if (!s) return 0;
  char at[64];
  for (int i = 0; i < s->params.n; i++) {
    const StTensor *t = &s->params.t[i];
    int64_t k = first_nonfinite(t->data, t->dtype, st_numel(t));
    if (k < 0) continue;
    describe_nonfinite(t->data, t->dtype, k, 0, at, sizeof at);
    if (what && n) snprintf(what, n, "param '%s' (%s)", t->name, at);
    return 1;
  }
  if (!s->have_opt) return 0;
  const char *names[2];
  int nslots = api_optim_slots(&s->opt, names);
  void **slots[2] = {s->slot0, s->slot1};
  const ZeroLayout *z = s->p->zero;
  for (int k = 0; k < nslots; k++) {
    if (!slots[k]) continue;
    for (int i = 0; i < s->p->nparams; i++) { /* buffers have no optimiser state */
      const StTensor *t = &s->params.t[i];
      /* ZeRO-1: this rank's slice of the state. */
      int64_t len = z ? z->len[i] : st_numel(t), lo = z ? z->lo[i] : 0;
      int64_t e = first_nonfinite(slots[k][i], t->dtype, len);
      if (e < 0) continue;
      describe_nonfinite(slots[k][i], t->dtype, e, lo, at, sizeof at);
      if (what && n) snprintf(what, n, "optimiser state 'optim.%s.%s' (%s)", names[k], t->name, at);
      return 1;
    }
  }
  return 0;
}

/* ------------------------------------------------------------------ */
/* The session generator                                               */
/* ------------------------------------------------------------------ */

uint64_t gradc_session_rng_next(gradc_session *s) { return s ? rng_next(&s->rng) : 0; }

void gradc_session_set_draws(gradc_session *s, uint64_t seed, int64_t step) {
  if (!s) return;
  s->draw_seed = seed;
  s->draw_offset = step - s->step;
}

void gradc_session_rng_seed(gradc_session *s, uint64_t seed) {
  if (s) rng_seed(&s->rng, seed);
}

/* ------------------------------------------------------------------ */
/* Checkpoints                                                         */
/* ------------------------------------------------------------------ */

static void meta_double(StFile *f, const char *key, double v) {
  char buf[64];
  fmt_double(buf, sizeof buf, v);
  st_set_meta(f, key, buf);
}

static void meta_int(StFile *f, const char *key, uint64_t v) {
  char buf[32];
  snprintf(buf, sizeof buf, "%llu", (unsigned long long)v);
  st_set_meta(f, key, buf);
}

gradc_status gradc_session_save_checkpoint(const gradc_session *s, const char *path) {
  return gradc_session_save_checkpoint_meta(s, path, 0, NULL, NULL);
}

gradc_status gradc_session_save_checkpoint_meta(const gradc_session *s, const char *path, int nmeta,
                                                const char *const *keys, const char *const *values) {
  if (!s || !path || nmeta < 0 || (nmeta && (!keys || !values))) return null_arg("session_save_checkpoint");
  const gradc_program *p = s->p;
  StFile f;
  st_init(&f);
  char buf[64];
  /* The caller's keys first, so that the session's own win a clash. */
  for (int i = 0; i < nmeta; i++) {
    if (!keys[i] || !values[i]) {
      st_free(&f);
      return null_arg("session_save_checkpoint");
    }
    st_set_meta(&f, keys[i], values[i]);
  }
  st_set_meta(&f, "format", CKPT_FORMAT);
  st_set_meta(&f, "gradc_version", GRADC_VERSION);
  st_set_meta(&f, "model", p->model);
  snprintf(buf, sizeof buf, "%016llx", (unsigned long long)p->fingerprint);
  st_set_meta(&f, "fingerprint", buf);
  meta_int(&f, "step", (uint64_t)s->step);
  meta_int(&f, "draws.seed", s->draw_seed);
  meta_int(&f, "draws.offset", (uint64_t)s->draw_offset);
  if (p->precision == IR_DT_F16) { /* the loss scaler, so a resumed run scales as an uninterrupted one */
    meta_double(&f, "loss_scale", s->loss_scale);
    meta_int(&f, "loss_scale.clean_steps", (uint64_t)s->clean_steps);
    meta_int(&f, "loss_scale.overflows_left", (uint64_t)s->overflows_left);
    meta_int(&f, "loss_scale.skipped", (uint64_t)s->skipped);
  }
  for (int k = 0; k < 4; k++) {
    char key[16];
    snprintf(key, sizeof key, "rng.s%d", k);
    meta_int(&f, key, s->rng.s[k]);
  }
  st_set_meta(&f, "optimizer", s->have_opt ? kind_name(s->opt.kind) : "none");
  if (s->have_opt) {
    const gradc_optimizer_options *o = &s->opt;
    meta_double(&f, "optimizer.lr", o->lr);
    meta_double(&f, "optimizer.momentum", o->momentum);
    meta_double(&f, "optimizer.dampening", o->dampening);
    meta_int(&f, "optimizer.nesterov", (uint64_t)(o->nesterov != 0));
    meta_double(&f, "optimizer.beta1", o->beta1);
    meta_double(&f, "optimizer.beta2", o->beta2);
    meta_double(&f, "optimizer.eps", o->eps);
    meta_double(&f, "optimizer.weight_decay", o->weight_decay);
    meta_double(&f, "optimizer.clip_norm", o->clip_norm);
    meta_int(&f, "optimizer.warmup_steps", (uint64_t)o->warmup_steps);
    meta_int(&f, "optimizer.total_steps", (uint64_t)o->total_steps);
    meta_double(&f, "optimizer.min_lr", o->min_lr);
    meta_int(&f, "optimizer.schedule", (uint64_t)o->schedule);
    meta_int(&f, "optimizer.no_decay_1d", (uint64_t)(o->no_decay_1d != 0));
    if (o->no_decay) st_set_meta(&f, "optimizer.no_decay", o->no_decay);
  }
  for (int i = 0; i < s->params.n; i++) {
    const StTensor *t = &s->params.t[i];
    st_add(&f, t->name, t->dtype, t->rank, t->shape, t->data);
  }
  char err[2048];
  gradc_status st = GRADC_OK;
  if (s->have_opt) {
    const char *names[2];
    int nslots = api_optim_slots(&s->opt, names);
    bool have = s->opt.kind == GRADC_ADAMW || s->momentum_valid;
    void **slots[2] = {s->slot0, s->slot1};
    const ZeroLayout *z = p->zero;
    for (int k = 0; k < nslots && have && !st; k++) {
      /* ZeRO-1: the slot's slices gathered whole (one slot at a time). */
      void *whole[2] = {NULL, NULL};
      if (z && !api_zero_gather_slot(p, slots[k], whole, err, sizeof err)) {
        st = api_fail(GRADC_ERR_USER, "gradc: error: session_save_checkpoint: %s", err);
        break;
      }
      for (int i = 0; i < p->nparams; i++) { /* params only: buffers have no optimiser state */
        const StTensor *t = &s->params.t[i];
        char name[1024];
        snprintf(name, sizeof name, "optim.%s.%s", names[k], t->name);
        const void *data = slots[k][i];
        if (z) data = (const char *)whole[z->group[i]] + (size_t)z->off[i] * st_dtype_size(t->dtype);
        st_add(&f, name, t->dtype, t->rank, t->shape, data);
      }
      free(whole[0]);
      free(whole[1]);
    }
  }
  /* ZeRO-1: the state was gathered from every rank (collective); rank 0 writes. */
  bool writer = !p->zero || p->comm->rank == 0;
  /* A checkpoint never holds an inf or a NaN: the file keeps the last
   * state that was finite. */
  for (int i = 0; i < f.n && !st && writer; i++) {
    const StTensor *t = &f.t[i];
    int64_t k = first_nonfinite(t->data, t->dtype, st_numel(t));
    if (k < 0) continue;
    char at[64];
    describe_nonfinite(t->data, t->dtype, k, 0, at, sizeof at);
    st = api_fail(GRADC_ERR_USER, "gradc: error: %s: not written: tensor '%s' is not finite (%s); the file keeps its "
                  "earlier contents", path, t->name, at);
  }
  if (!st && writer && !st_write(path, &f, err, sizeof err)) st = api_fail(GRADC_ERR_USER, "gradc: error: %s", err);
  st_free(&f);
  return st;
}

static bool parse_u64(const char *s, uint64_t *out) {
  if (!s || !*s || *s == '-') return false;
  char *end;
  errno = 0;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno || *end) return false;
  *out = v;
  return true;
}

static bool parse_f64(const char *s, double *out) {
  if (!s || !*s) return false;
  char *end;
  *out = strtod(s, &end);
  return !*end;
}

/* The optimiser options saved in f's metadata. */
static bool read_options(const StFile *f, gradc_optimizer_options *o) {
  const char *kind = st_get_meta(f, "optimizer");
  gradc_optimizer_kind k = strcmp(kind, "sgd") == 0 ? GRADC_SGD : GRADC_ADAMW;
  gradc_optimizer_options_init(o, k);
  uint64_t nesterov = 0, warmup = 0, total = 0; /* read below even when parsing stopped early */
  bool ok = parse_f64(st_get_meta(f, "optimizer.lr"), &o->lr) &&
            parse_f64(st_get_meta(f, "optimizer.momentum"), &o->momentum) &&
            parse_f64(st_get_meta(f, "optimizer.dampening"), &o->dampening) &&
            parse_u64(st_get_meta(f, "optimizer.nesterov"), &nesterov) &&
            parse_f64(st_get_meta(f, "optimizer.beta1"), &o->beta1) &&
            parse_f64(st_get_meta(f, "optimizer.beta2"), &o->beta2) &&
            parse_f64(st_get_meta(f, "optimizer.eps"), &o->eps) &&
            parse_f64(st_get_meta(f, "optimizer.weight_decay"), &o->weight_decay) &&
            parse_f64(st_get_meta(f, "optimizer.clip_norm"), &o->clip_norm) &&
            parse_u64(st_get_meta(f, "optimizer.warmup_steps"), &warmup) &&
            parse_u64(st_get_meta(f, "optimizer.total_steps"), &total) &&
            parse_f64(st_get_meta(f, "optimizer.min_lr"), &o->min_lr);
  o->nesterov = (int)nesterov;
  o->warmup_steps = (int64_t)warmup;
  o->total_steps = (int64_t)total;
  /* Absent from older checkpoints: AUTO, decay everywhere. */
  uint64_t sched = 0, nd1 = 0;
  if (st_get_meta(f, "optimizer.schedule")) ok = ok && parse_u64(st_get_meta(f, "optimizer.schedule"), &sched);
  if (st_get_meta(f, "optimizer.no_decay_1d")) ok = ok && parse_u64(st_get_meta(f, "optimizer.no_decay_1d"), &nd1);
  o->schedule = sched <= GRADC_SCHEDULE_COSINE ? (gradc_schedule)sched : GRADC_SCHEDULE_AUTO;
  o->no_decay_1d = nd1 != 0;
  o->no_decay = st_get_meta(f, "optimizer.no_decay"); /* f's: set_options copies it */
  return ok && warmup <= INT64_MAX && total <= INT64_MAX && sched <= GRADC_SCHEDULE_COSINE;
}

/* Check the optim.* tensors of f against the optimiser o: each names a slot
 * o keeps and a param, with the param's storage type; every slot o needs
 * (need) is there.  Sets *have when o's slots are present. */
static bool check_slots(const gradc_session *s, const StFile *f, const char *path, const gradc_optimizer_options *o,
                        bool need, bool *have, char *err, size_t errlen) {
  const char *names[2];
  int nslots = o ? api_optim_slots(o, names) : 0;
  int found = 0;
  for (int i = 0; i < f->n; i++) {
    const StTensor *t = &f->t[i];
    if (strncmp(t->name, "optim.", 6) != 0) continue;
    const char *rest = t->name + 6, *dot = strchr(rest, '.');
    int slot = -1;
    for (int k = 0; dot && k < nslots; k++)
      if (strlen(names[k]) == (size_t)(dot - rest) && strncmp(rest, names[k], (size_t)(dot - rest)) == 0) slot = k;
    int pi = dot ? api_param_index(s->p, dot + 1) : -1;
    if (slot < 0 || pi < 0) {
      snprintf(err, errlen, "%s: tensor '%s': not a slot of the %s optimiser of model '%s'", path, t->name,
               o ? kind_name(o->kind) : "session's (none set)", s->p->model);
      return false;
    }
    const StTensor *pt = &s->params.t[pi];
    bool same = t->dtype == pt->dtype && t->rank == pt->rank;
    for (int k = 0; same && k < t->rank; k++) same = t->shape[k] == pt->shape[k];
    if (!same) {
      char w[IR_TYPE_STR_MAX];
      IrType want = {.dtype = pt->dtype == ST_F64 ? IR_DT_F64 : IR_DT_F32, .shape = s->p->params[pi].type.shape};
      snprintf(err, errlen, "%s: tensor '%s': expected %s (the param's storage)", path, t->name,
               ir_type_str(&want, w, sizeof w));
      return false;
    }
    found++;
  }
  *have = found > 0;
  if (!need && !found) return true;
  for (int k = 0; k < nslots; k++)
    for (int i = 0; i < s->p->nparams; i++) {
      char name[1024];
      snprintf(name, sizeof name, "optim.%s.%s", names[k], s->p->params[i].name);
      if (!st_find(f, name)) {
        snprintf(err, errlen, "%s: missing optimiser slot '%s'", path, name);
        return false;
      }
    }
  *have = nslots > 0;
  return true;
}

gradc_status gradc_session_load_checkpoint(gradc_session *s, const char *path) {
  if (!s || !path) return null_arg("session_load_checkpoint");
  const gradc_program *p = s->p;
  char err[2048];
  StFile f;
  st_init(&f);
  gradc_status st = GRADC_OK;
#define BAD(...)                                                                                                        \
  do {                                                                                                                  \
    snprintf(err, sizeof err, __VA_ARGS__);                                                                             \
    goto bad;                                                                                                           \
  } while (0)
  if (!st_read(path, &f, err, sizeof err)) goto bad;
  const char *format = st_get_meta(&f, "format");
  if (!format || strcmp(format, CKPT_FORMAT) != 0)
    BAD("%s: not a gradc checkpoint (metadata 'format' is %s%s%s, expected '%s')", path, format ? "'" : "",
        format ? format : "missing", format ? "'" : "", CKPT_FORMAT);
  if (!api_check_params_file(p, &f, path, true, false, err, sizeof err)) goto bad;
  /* Names and shapes agree; the fingerprint also covers the declared dtypes and the model's name. */
  char fp[32];
  snprintf(fp, sizeof fp, "%016llx", (unsigned long long)p->fingerprint);
  const char *ffp = st_get_meta(&f, "fingerprint"), *fmodel = st_get_meta(&f, "model");
  if (!ffp || strcmp(ffp, fp) != 0)
    BAD("%s: checkpoint is for another model ('%s', fingerprint %s); this program is model '%s' (fingerprint %s)", path,
        fmodel ? fmodel : "?", ffp ? ffp : "missing", p->model, fp);
  uint64_t step, words[4], draw_seed = 0, draw_offset = 0;
  if (!parse_u64(st_get_meta(&f, "step"), &step) || step > INT64_MAX) BAD("%s: bad or missing metadata 'step'", path);
  if ((st_get_meta(&f, "draws.seed") && !parse_u64(st_get_meta(&f, "draws.seed"), &draw_seed)) ||
      (st_get_meta(&f, "draws.offset") && !parse_u64(st_get_meta(&f, "draws.offset"), &draw_offset)))
    BAD("%s: bad metadata 'draws.seed' or 'draws.offset'", path);
  for (int k = 0; k < 4; k++) {
    char key[16];
    snprintf(key, sizeof key, "rng.s%d", k);
    if (!parse_u64(st_get_meta(&f, key), &words[k])) BAD("%s: bad or missing metadata '%s'", path, key);
  }
  /* f16: the loss scaler's state (absent: a checkpoint of another precision, the session's own stays). */
  double scale = s->loss_scale;
  uint64_t clean = (uint64_t)s->clean_steps, left = (uint64_t)s->overflows_left, skipped = (uint64_t)s->skipped;
  if (p->precision == IR_DT_F16 && st_get_meta(&f, "loss_scale")) {
    char *end;
    scale = strtod(st_get_meta(&f, "loss_scale"), &end);
    if (*end || !(scale > 0) || !isfinite(scale) || !parse_u64(st_get_meta(&f, "loss_scale.clean_steps"), &clean) ||
        !parse_u64(st_get_meta(&f, "loss_scale.overflows_left"), &left) ||
        !parse_u64(st_get_meta(&f, "loss_scale.skipped"), &skipped) || clean > INT32_MAX || left > INT32_MAX)
      BAD("%s: bad loss_scale metadata", path);
  }
  /* The optimiser: the checkpoint's, unless the session has one of the same kind. */
  const char *kind = st_get_meta(&f, "optimizer");
  if (!kind || (strcmp(kind, "sgd") != 0 && strcmp(kind, "adamw") != 0 && strcmp(kind, "none") != 0))
    BAD("%s: bad or missing metadata 'optimizer'", path);
  gradc_optimizer_options o;
  bool have_opt = s->have_opt;
  if (have_opt) o = s->opt;
  if (strcmp(kind, "none") != 0) {
    gradc_optimizer_options saved;
    if (!read_options(&f, &saved)) BAD("%s: bad or missing optimizer.* metadata", path);
    if (have_opt && saved.kind != o.kind)
      BAD("%s: checkpoint holds %s state; the session's optimiser is %s", path, kind_name(saved.kind),
          kind_name(o.kind));
    if (!have_opt) {
      gradc_status cs = check_optimizer(&saved);
      if (cs) BAD("%s: bad optimizer.* metadata (%s)", path, gradc_last_error());
      o = saved;
      have_opt = true;
    }
  }
  /* AdamW's moments always exist; SGD's momentum buffers once a step was taken. */
  bool need = have_opt && (o.kind == GRADC_ADAMW || step > 0), have = false;
  if (!check_slots(s, &f, path, have_opt ? &o : NULL, need, &have, err, sizeof err)) goto bad;
#undef BAD

  /* Everything checked: commit (params and buffers). */
  for (int i = 0; i < api_nstate(p); i++) api_copy_tensor(st_find(&f, p->params[i].name), &s->params.t[i]);
  api_params_changed(s);
  api_optim_free_state(s);
  s->have_opt = have_opt;
  if (have_opt) {
    set_options(s, &o);
    alloc_slots(s, &o);
    const char *names[2];
    int nslots = api_optim_slots(&o, names);
    void **slots[2] = {s->slot0, s->slot1};
    for (int k = 0; k < nslots && have; k++)
      for (int i = 0; i < p->nparams; i++) {
        char name[1024];
        snprintf(name, sizeof name, "optim.%s.%s", names[k], p->params[i].name);
        const StTensor *t = st_find(&f, name);
        if (p->zero) /* ZeRO-1: this rank's slice of the whole state in the file */
          memcpy(slots[k][i], (const char *)t->data + (size_t)p->zero->lo[i] * st_dtype_size(t->dtype),
                 (size_t)p->zero->len[i] * st_dtype_size(t->dtype));
        else
          memcpy(slots[k][i], t->data, t->nbytes);
      }
    s->momentum_valid = o.kind == GRADC_SGD && have;
  }
  s->step = (int64_t)step;
  s->loss_scale = scale;
  s->clean_steps = (int)clean;
  s->overflows_left = (int)left;
  s->skipped = (int64_t)skipped;
  s->draw_seed = draw_seed;
  s->draw_offset = (int64_t)draw_offset;
  for (int k = 0; k < 4; k++) s->rng.s[k] = words[k];
  /* The last run's gradients belong to the old params. */
  if (s->have_res) step_result_free(&s->res);
  s->have_res = false;
  st_free(&f);
  return GRADC_OK;
bad:
  st = api_fail(GRADC_ERR_USER, "gradc: error: %s", err);
  st_free(&f);
  return st;
}
