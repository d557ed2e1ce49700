/* api_session.c - sessions of the C API (include/gradc.h): the params'
 * master weights, one window of inputs, running the window on the
 * program's back end, and the losses and gradients of the last run.
 *
 * Params are kept as a safetensors-shaped StFile in the program's
 * declaration order: F32 for every float param except f64 ones (F64); a
 * new session's params are zeros.  Inputs are kept as given (F32/F64,
 * I32/I64), window-sized; the step driver checks and splits them.
 *
 * ZeRO-1 (api_zero.c): with an optimiser set, a run's gradients stay
 * reduce-scattered (only this rank's slices are summed), the grad norm is
 * all-reduced from the ranks' sums of squares, and get_grad / save_grads
 * gather the whole gradients on demand (collective). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "api_impl.h"
#include "runtime/comm/trace.h"

static gradc_status null_arg(const char *fn) { return api_fail(GRADC_ERR_USER, "gradc: error: %s: NULL argument", fn); }

gradc_status gradc_session_new(const gradc_program *p, gradc_session **out) {
  if (!out) return null_arg("session_new");
  *out = NULL;
  if (!p) return null_arg("session_new");
  char err[2048];
  if (!api_dist_start((gradc_program *)p, err, sizeof err)) return api_fail(GRADC_ERR_USER, "gradc: error: %s", err);
  gradc_session *s = mem_calloc(1, sizeof *s);
  s->p = (gradc_program *)p;
  st_init(&s->params);
  st_init(&s->inputs);
  for (int i = 0; i < api_nstate(p); i++) { /* params, then buffers */
    const FeParam *q = &p->params[i];
    bool f64 = api_param_f64(q);
    int64_t n = ir_numel(&q->type.shape);
    void *zero = mem_calloc((size_t)n, f64 ? 8 : 4);
    st_add(&s->params, q->name, f64 ? ST_F64 : ST_F32, q->type.shape.rank, q->type.shape.dim, zero);
    free(zero);
  }
  rng_seed(&s->rng, 0);
  gradc_loss_scale_options_init(&s->ls);
  s->loss_scale = p->precision == IR_DT_F16 ? s->ls.init_scale : 1.0;
  s->overflows_left = s->ls.hysteresis;
  api_params_changed(s);
  *out = s;
  return GRADC_OK;
}

void gradc_session_free(gradc_session *s) {
  if (!s) return;
  st_free(&s->params);
  st_free(&s->inputs);
  if (s->have_res) step_result_free(&s->res);
  api_optim_free_state(s);
  api_optim_free_code(s);
  api_optim_free_options(s);
  if (s->trace && trace_current() == s->trace) trace_set_current(NULL);
  trace_free(s->trace);
  free(s);
}

/* ------------------------------------------------------------------ */
/* Params                                                              */
/* ------------------------------------------------------------------ */

gradc_status gradc_session_init_params(gradc_session *s, uint64_t seed) {
  if (!s) return null_arg("session_init_params");
  StFile fresh;
  st_init(&fresh);
  rt_init_params(s->p->params, api_nstate(s->p), seed, &fresh); /* params, then buffers (as gradc init) */
  /* Into the session's storage, which gradc_session_param_data hands out. */
  for (int i = 0; i < api_nstate(s->p); i++) api_copy_tensor(st_find(&fresh, s->p->params[i].name), &s->params.t[i]);
  st_free(&fresh);
  api_params_changed(s);
  return GRADC_OK;
}

/* The param tensor of name with n elements, or NULL (error recorded). */
static StTensor *param_tensor(const gradc_session *s, const char *fn, const char *name, size_t n) {
  int i = api_state_index(s->p, name); /* a buffer is read and set like a param */
  if (i < 0) {
    api_fail(GRADC_ERR_USER, "gradc: error: %s: '%s' is not a param%s of model '%s'", fn, name ? name : "(null)",
             s->p->nbuffers ? " or buffer" : "", s->p->model);
    return NULL;
  }
  StTensor *t = &s->params.t[i];
  if ((int64_t)n != st_numel(t)) {
    char ty[IR_TYPE_STR_MAX];
    api_fail(GRADC_ERR_USER, "gradc: error: %s: param '%s' (%s) has %lld elements, got %zu", fn, name,
             ir_type_str(&s->p->params[i].type, ty, sizeof ty), (long long)st_numel(t), n);
    return NULL;
  }
  return t;
}

gradc_status gradc_session_set_param(gradc_session *s, const char *name, const void *data, size_t n) {
  if (!s || (!data && n)) return null_arg("session_set_param");
  StTensor *t = param_tensor(s, "session_set_param", name, n);
  if (!t) return GRADC_ERR_USER;
  if (t->nbytes) memcpy(t->data, data, t->nbytes);
  api_params_changed(s);
  return GRADC_OK;
}

gradc_status gradc_session_get_param(const gradc_session *s, const char *name, void *out, size_t n) {
  if (!s || (!out && n)) return null_arg("session_get_param");
  const StTensor *t = param_tensor(s, "session_get_param", name, n);
  if (!t) return GRADC_ERR_USER;
  if (t->nbytes) memcpy(out, t->data, t->nbytes);
  return GRADC_OK;
}

gradc_status gradc_session_param_data(gradc_session *s, const char *name, void **data, size_t *n) {
  if (!s || !data || !n) return null_arg("session_param_data");
  int i = api_param_index(s->p, name);
  if (i < 0)
    return api_fail(GRADC_ERR_USER, "gradc: error: session_param_data: '%s' is not a param of model '%s'",
                    name ? name : "(null)", s->p->model);
  *data = s->params.t[i].data;
  *n = (size_t)st_numel(&s->params.t[i]);
  return GRADC_OK;
}

void gradc_session_params_written(gradc_session *s) {
  if (s) api_params_changed(s);
}

static gradc_status load_params(gradc_session *s, const char *path, bool partial, int *nloaded) {
  char err[2048];
  StFile f;
  st_init(&f);
  gradc_status st = GRADC_OK;
  int n = 0;
  /* A checkpoint is a params file too: its optim.* tensors are skipped. */
  if (!st_read(path, &f, err, sizeof err) || !api_check_params_file(s->p, &f, path, true, partial, err, sizeof err))
    st = api_fail(GRADC_ERR_USER, "gradc: error: %s", err);
  for (int i = 0; !st && i < api_nstate(s->p); i++) { /* params and buffers */
    const StTensor *t = st_find(&f, s->p->params[i].name);
    if (!t) continue; /* partial: keeps its value */
    api_copy_tensor(t, &s->params.t[i]);
    n++;
  }
  api_params_changed(s);
  st_free(&f);
  if (nloaded) *nloaded = n;
  return st;
}

gradc_status gradc_session_load_params(gradc_session *s, const char *path) {
  if (!s || !path) return null_arg("session_load_params");
  return load_params(s, path, false, NULL);
}

gradc_status gradc_session_load_params_partial(gradc_session *s, const char *path, int *nloaded) {
  if (!s || !path) return null_arg("session_load_params_partial");
  return load_params(s, path, true, nloaded);
}

gradc_status gradc_session_save_params(const gradc_session *s, const char *path) {
  if (!s || !path) return null_arg("session_save_params");
  char err[2048];
  if (!st_write(path, &s->params, err, sizeof err)) return api_fail(GRADC_ERR_USER, "gradc: error: %s", err);
  return GRADC_OK;
}

/* ------------------------------------------------------------------ */
/* Inputs                                                              */
/* ------------------------------------------------------------------ */

static bool input_dtype_ok(IrDType dt, gradc_dtype g) {
  switch (dt) {
  case IR_DT_F32:
  case IR_DT_F64: return g == GRADC_F32 || g == GRADC_F64;
  case IR_DT_BF16:
  case IR_DT_F16: return g == GRADC_F32 || g == GRADC_F64 || g == GRADC_BF16 || g == GRADC_F16;
  case IR_DT_I32: return g == GRADC_I32 || g == GRADC_I64;
  case IR_DT_BOOL: return false;
  }
  return false;
}

static const char *dtype_word(gradc_dtype g) {
  switch (g) {
  case GRADC_F32: return "F32";
  case GRADC_F64: return "F64";
  case GRADC_BF16: return "BF16";
  case GRADC_F16: return "F16";
  case GRADC_I32: return "I32";
  case GRADC_I64: return "I64";
  }
  return "?";
}

static StDType st_dtype(gradc_dtype g) {
  switch (g) {
  case GRADC_F32: return ST_F32;
  case GRADC_F64: return ST_F64;
  case GRADC_BF16: return ST_BF16;
  case GRADC_F16: return ST_F16;
  case GRADC_I32: return ST_I32;
  case GRADC_I64: return ST_I64;
  }
  return ST_F32;
}

gradc_status gradc_session_set_input(gradc_session *s, const char *name, gradc_dtype dt, const void *data, size_t n) {
  if (!s || (!data && n)) return null_arg("session_set_input");
  const gradc_program *p = s->p;
  int i = api_input_index(p, name);
  if (i < 0) {
    if (api_param_index(p, name) >= 0)
      return api_fail(GRADC_ERR_USER, "gradc: error: session_set_input: '%s' is a param, not an input", name);
    return api_fail(GRADC_ERR_USER, "gradc: error: session_set_input: '%s' is not an input of model '%s'",
                    name ? name : "(null)", p->model);
  }
  IrType w = api_input_window_type(p, i);
  char ty[IR_TYPE_STR_MAX];
  if ((unsigned)dt > GRADC_I64 || !input_dtype_ok(w.dtype, dt))
    return api_fail(GRADC_ERR_USER, "gradc: error: session_set_input: input '%s' (%s) cannot take %s data", name,
                    ir_type_str(&w, ty, sizeof ty), (unsigned)dt > GRADC_I64 ? "unknown" : dtype_word(dt));
  int64_t want = ir_numel(&w.shape);
  if ((int64_t)n != want)
    return api_fail(GRADC_ERR_USER,
                    "gradc: error: session_set_input: input '%s' (%s, one window) has %lld elements, got %zu", name,
                    ir_type_str(&w, ty, sizeof ty), (long long)want, n);
  StDType sd = st_dtype(dt);
  size_t nbytes = (size_t)want * st_dtype_size(sd);
  StTensor *t = NULL;
  for (int k = 0; k < s->inputs.n && !t; k++)
    if (strcmp(s->inputs.t[k].name, name) == 0) t = &s->inputs.t[k];
  if (!t) {
    st_add(&s->inputs, name, sd, w.shape.rank, w.shape.dim, data);
    return GRADC_OK;
  }
  if (t->nbytes != nbytes) {
    free(t->data);
    t->data = mem_calloc(nbytes, 1);
    t->nbytes = nbytes;
  }
  t->dtype = sd;
  if (nbytes) memcpy(t->data, data, nbytes);
  return GRADC_OK;
}

/* ------------------------------------------------------------------ */
/* Running                                                             */
/* ------------------------------------------------------------------ */

/* *flag summed over every rank of the run (tensor- and data-parallel). */
static bool api_agree_any(gradc_program *p, double *flag, char *err, size_t errlen) {
  return comm_all_reduce(&p->comm->world, flag, flag, 1, COMM_F64, COMM_SUM, hash_str("loss_scale.overflow"), err,
                         errlen);
}

gradc_status gradc_session_run(gradc_session *s) {
  if (!s) return null_arg("session_run");
  char err[2048];
  StepResult r;
  /* Traced: the executors and the comm layer report to the session's recorder. */
  Trace *prev = trace_current();
  double t0 = s->trace ? trace_now_us(s->trace) : 0;
  if (s->trace) trace_set_current(s->trace);
  /* ZeRO-1 with an optimiser: the gradients stay reduce-scattered (the
   * step updates this rank's slices); whole ones are gathered on demand. */
  bool sharded = false;
  api_set_params_gen(s->p, s->params_gen);
  api_set_draws(s->p, s->draw_seed, (uint64_t)(s->step + s->draw_offset));
  s->p->loss_scale = s->loss_scale;
  bool ok = api_run_window_ex(s->p, &s->params, &s->inputs, &r, s->have_opt, &sharded, err, sizeof err);
  if (s->trace) {
    trace_span(s->trace, TRACE_STEP, "step", t0, trace_now_us(s->trace));
    trace_set_current(prev);
  }
  if (!ok) return api_fail(GRADC_ERR_USER, "gradc: error: %s", err);
  /* The CPU back end reads the next window's gradients into the arrays of
   * the one before (no allocation and page faults per window). */
  if (s->have_res) api_result_free(s->p, &s->res);
  s->res = r;
  s->have_res = true;
  s->grads_sharded = sharded;
  double ss = 0;
  if (sharded) {
    if (!api_zero_norm2(s->p, &s->res, s->loss_scale, &ss, err, sizeof err))
      return api_fail(GRADC_ERR_USER, "gradc: error: %s", err);
  } else if (s->loss_scale != 1.0) {
    ss = api_unscale_norm2(&s->res, s->loss_scale);
  } else {
    for (int i = 0; i < r.ngrads; i++) ss += api_sum_squares(r.grads[i], ir_numel(&r.grad_types[i].shape));
  }
  s->grad_norm = sqrt(ss);
  s->overflow = false;
  if (s->p->precision == IR_DT_F16) {
    /* Every rank skips or steps alike: a rank's own overflow (its
     * gradients after the reduction are everyone's, but not every
     * reduction is in place) counts for all. */
    double bad = isfinite(ss) ? 0.0 : 1.0;
    if (s->p->comm && !api_agree_any(s->p, &bad, err, sizeof err))
      return api_fail(GRADC_ERR_USER, "gradc: error: %s", err);
    s->overflow = bad != 0;
  }
  /* Language v2: the window's buffer updates become the buffers the next
   * window reads (every rank got the same values from step_dp_end). */
  for (int i = 0; i < r.nupdates; i++) {
    int b = api_state_index(s->p, r.update_names[i]);
    if (b < s->p->nparams) return api_fail(GRADC_ERR_INTERNAL, "gradc: internal error: update of '%s', not a buffer",
                                           r.update_names[i]);
    StTensor *t = &s->params.t[b];
    int64_t n = st_numel(t);
    for (int64_t j = 0; j < n; j++) {
      if (t->dtype == ST_F64) ((double *)t->data)[j] = r.updates[i][j];
      else ((float *)t->data)[j] = (float)r.updates[i][j];
    }
  }
  return GRADC_OK;
}

/* ---- loss scaling (f16) ---- */

void gradc_loss_scale_options_init(gradc_loss_scale_options *o) {
  if (!o) return;
  o->init_scale = API_LOSS_SCALE_INIT;
  o->window = 2000;
  o->hysteresis = 1;
  o->min_scale = 1.0;
}

gradc_status gradc_session_set_loss_scaling(gradc_session *s, const gradc_loss_scale_options *o) {
  if (!s || !o) return null_arg("session_set_loss_scaling");
  if (s->p->precision != IR_DT_F16)
    return api_fail(GRADC_ERR_USER, "gradc: error: loss scaling needs a program compiled with precision f16 (this one "
                                    "is %s, which uses no loss scale)", ir_dtype_name(s->p->precision));
  int e;
  if (!(o->init_scale > 0) || !isfinite(o->init_scale) || frexp(o->init_scale, &e) != 0.5)
    return api_fail(GRADC_ERR_USER, "gradc: error: the initial loss scale must be a positive power of two (got %g)",
                    o->init_scale);
  if (o->window < 1 || o->hysteresis < 1 || !(o->min_scale > 0) || frexp(o->min_scale, &e) != 0.5)
    return api_fail(GRADC_ERR_USER, "gradc: error: loss scaling needs window >= 1, hysteresis >= 1 and a positive "
                                    "power-of-two min_scale (got %d, %d, %g)", o->window, o->hysteresis, o->min_scale);
  s->ls = *o;
  s->loss_scale = o->init_scale;
  s->clean_steps = 0;
  s->overflows_left = o->hysteresis;
  return GRADC_OK;
}

double gradc_session_loss_scale(const gradc_session *s) { return s ? s->loss_scale : 1.0; }
int gradc_session_overflow(const gradc_session *s) { return s && s->overflow ? 1 : 0; }
int64_t gradc_session_skipped_steps(const gradc_session *s) { return s ? s->skipped : 0; }

/* ---- outputs (language v2) ---- */

static int output_slot(const gradc_session *s, const char *fn, const char *name) {
  if (!s->have_res) {
    api_fail(GRADC_ERR_USER, "gradc: error: %s: no run yet", fn);
    return -1;
  }
  for (int i = 0; name && i < s->res.noutputs; i++)
    if (strcmp(s->res.output_names[i], name) == 0) return i;
  api_fail(GRADC_ERR_USER, "gradc: error: %s: '%s' is not an output of model '%s'", fn, name ? name : "(null)",
           s->p->model);
  return -1;
}

static gradc_dtype output_dtype(IrDType dt) {
  return dt == IR_DT_F64 ? GRADC_F64 : dt == IR_DT_I32 || dt == IR_DT_BOOL ? GRADC_I32 : GRADC_F32;
}

gradc_status gradc_session_output_info(const gradc_session *s, const char *name, gradc_tensor_info *out) {
  if (!s || !out) return null_arg("session_output_info");
  int i = output_slot(s, "session_output_info", name);
  if (i < 0) return GRADC_ERR_USER;
  const IrType *t = &s->res.output_types[i];
  memset(out, 0, sizeof *out);
  out->name = s->res.output_names[i];
  out->dtype = output_dtype(t->dtype);
  out->rank = t->shape.rank;
  for (int k = 0; k < t->shape.rank; k++) out->shape[k] = t->shape.dim[k];
  out->batched = strcmp(s->res.output_windows[i], "concat") == 0;
  return GRADC_OK;
}

gradc_status gradc_session_get_output(const gradc_session *s, const char *name, void *out, size_t n) {
  if (!s || (!out && n)) return null_arg("session_get_output");
  int i = output_slot(s, "session_get_output", name);
  if (i < 0) return GRADC_ERR_USER;
  const IrType *t = &s->res.output_types[i];
  int64_t m = ir_numel(&t->shape);
  if ((int64_t)n != m) {
    char ty[IR_TYPE_STR_MAX];
    return api_fail(GRADC_ERR_USER, "gradc: error: session_get_output: output '%s' (%s) has %lld elements, got %zu",
                    name, ir_type_str(t, ty, sizeof ty), (long long)m, n);
  }
  const double *v = s->res.outputs[i];
  gradc_dtype dt = output_dtype(t->dtype);
  for (int64_t j = 0; j < m; j++) {
    if (dt == GRADC_F64) ((double *)out)[j] = v[j];
    else if (dt == GRADC_I32) ((int32_t *)out)[j] = (int32_t)v[j];
    else ((float *)out)[j] = (float)v[j];
  }
  return GRADC_OK;
}

double gradc_session_loss(const gradc_session *s, int i) {
  if (!s || !s->have_res || i < 0 || i >= s->p->nlosses) return NAN;
  for (int j = 0; j < s->res.nlosses; j++)
    if (strcmp(s->res.loss_names[j], s->p->losses[i]) == 0) return s->res.losses[j];
  return NAN;
}

double gradc_session_loss_total(const gradc_session *s) {
  if (!s || !s->have_res) return NAN;
  double total = 0;
  for (int i = 0; i < s->p->nlosses; i++) total += gradc_session_loss(s, i);
  return total;
}

/* ZeRO-1: gather the last result's gradient slices into whole gradients
 * (collective over the dp ranks; once per run). */
static gradc_status whole_grads(const gradc_session *cs, const char *fn) {
  gradc_session *s = (gradc_session *)cs;
  if (!s->have_res || !s->grads_sharded) return GRADC_OK;
  char err[2048];
  if (!api_zero_gather_grads(s->p, &s->res, err, sizeof err))
    return api_fail(GRADC_ERR_USER, "gradc: error: %s: %s", fn, err);
  s->grads_sharded = false;
  return GRADC_OK;
}

/* The gradient slot of param name in the last result, or -1 (error recorded). */
static int grad_slot(const gradc_session *s, const char *fn, const char *name) {
  if (s->p->forward_only) {
    api_fail(GRADC_ERR_USER, "gradc: error: %s: model '%s' was compiled forward-only: it has no gradients", fn,
             s->p->model);
    return -1;
  }
  if (!s->have_res) {
    api_fail(GRADC_ERR_USER, "gradc: error: %s: no gradients yet (call gradc_session_run first)", fn);
    return -1;
  }
  for (int i = 0; name && i < s->res.ngrads; i++)
    if (strcmp(s->res.grad_names[i], name) == 0) return i;
  api_fail(GRADC_ERR_USER, "gradc: error: %s: '%s' is not a param of model '%s'", fn, name ? name : "(null)",
           s->p->model);
  return -1;
}

gradc_status gradc_session_get_grad(const gradc_session *s, const char *name, void *out, size_t n) {
  if (!s || (!out && n)) return null_arg("session_get_grad");
  int g = grad_slot(s, "session_get_grad", name);
  if (g < 0) return GRADC_ERR_USER;
  gradc_status ws = whole_grads(s, "session_get_grad");
  if (ws) return ws;
  const IrType *t = &s->res.grad_types[g];
  int64_t numel = ir_numel(&t->shape);
  if ((int64_t)n != numel)
    return api_fail(GRADC_ERR_USER, "gradc: error: session_get_grad: param '%s' has %lld elements, got %zu", name,
                    (long long)numel, n);
  for (int64_t j = 0; j < numel; j++) {
    if (t->dtype == IR_DT_F64)
      ((double *)out)[j] = s->res.grads[g][j];
    else
      ((float *)out)[j] = (float)s->res.grads[g][j];
  }
  return GRADC_OK;
}

gradc_status gradc_session_save_grads(const gradc_session *s, const char *path) {
  if (!s || !path) return null_arg("session_save_grads");
  if (s->p->forward_only)
    return api_fail(GRADC_ERR_USER, "gradc: error: session_save_grads: model '%s' was compiled forward-only: it has "
                                    "no gradients", s->p->model);
  if (!s->have_res)
    return api_fail(GRADC_ERR_USER, "gradc: error: session_save_grads: no gradients yet (call gradc_session_run first)");
  gradc_status ws = whole_grads(s, "session_save_grads");
  if (ws) return ws;
  StFile f;
  st_init(&f);
  for (int i = 0; i < s->res.ngrads; i++) {
    const IrType *t = &s->res.grad_types[i];
    int64_t n = ir_numel(&t->shape);
    if (t->dtype == IR_DT_F64) {
      st_add(&f, s->res.grad_names[i], ST_F64, t->shape.rank, t->shape.dim, s->res.grads[i]);
    } else {
      float *buf = mem_calloc((size_t)n, sizeof(float));
      for (int64_t j = 0; j < n; j++) buf[j] = (float)s->res.grads[i][j];
      st_add(&f, s->res.grad_names[i], ST_F32, t->shape.rank, t->shape.dim, buf);
      free(buf);
    }
  }
  char err[2048];
  gradc_status st = GRADC_OK;
  if (!st_write(path, &f, err, sizeof err)) st = api_fail(GRADC_ERR_USER, "gradc: error: %s", err);
  st_free(&f);
  return st;
}

/* ------------------------------------------------------------------ */
/* Data-parallel replicas                                               */
/* ------------------------------------------------------------------ */

int gradc_session_rank(const gradc_session *s) { return s ? api_program_rank(s->p) : 0; }

gradc_status gradc_session_check_replicas(const gradc_session *s) {
  if (!s) return null_arg("session_check_replicas");
  const gradc_program *p = s->p;
  if (!p->comm) return GRADC_OK;
  uint64_t h = hash_bytes(&s->step, sizeof s->step, HASH_SEED);
  for (int i = 0; i < s->params.n; i++) h = hash_bytes(s->params.t[i].data, s->params.t[i].nbytes, h);
  char err[2048];
  int diff;
  uint64_t h0, hd;
  /* Every rank holds the whole params (tensor-parallel ranks too). */
  if (!comm_agree(&p->comm->world, h, &diff, &h0, &hd, err, sizeof err))
    return api_fail(GRADC_ERR_USER, "gradc: error: %s", err);
  if (diff >= 0)
    return api_fail(GRADC_ERR_USER,
                    "gradc: error: data-parallel ranks hold different params at step %lld: rank %d's hash is "
                    "%016llx, rank 0's %016llx",
                    (long long)s->step, diff, (unsigned long long)hd, (unsigned long long)h0);
  return GRADC_OK;
}

/* ------------------------------------------------------------------ */
/* Traces                                                              */
/* ------------------------------------------------------------------ */

gradc_status gradc_session_trace(gradc_session *s) {
  if (!s) return null_arg("session_trace");
  char err[2048];
  if (!api_dist_start(s->p, err, sizeof err)) return api_fail(GRADC_ERR_USER, "gradc: error: %s", err);
  if (!s->trace) s->trace = trace_new(api_program_rank(s->p));
  return GRADC_OK;
}

/* Collective in a distributed run: rank 0 writes every rank's events. */
gradc_status gradc_session_trace_write(gradc_session *s, const char *path) {
  if (!s) return null_arg("session_trace_write");
  if (!path) return api_fail(GRADC_ERR_USER, "gradc: error: session_trace_write: no path");
  if (!s->trace) return api_fail(GRADC_ERR_USER, "gradc: error: session_trace_write: tracing is off (call gradc_session_trace first)");
  char err[2048];
  const gradc_program *p = s->p;
  if (p->comm && !comm_trace_gather(&p->comm->world, s->trace, err, sizeof err))
    return api_fail(GRADC_ERR_USER, "gradc: error: %s", err);
  if (api_program_rank(p) == 0 && !trace_write(s->trace, path, err, sizeof err))
    return api_fail(GRADC_ERR_USER, "gradc: error: %s", err);
  return GRADC_OK;
}

/* This rank's figures, in milliseconds. */
gradc_status gradc_session_trace_stats(const gradc_session *s, double *comm_ms, double *exposed_ms,
                                       double *compute_ms) {
  if (!s) return null_arg("session_trace_stats");
  if (!s->trace) return api_fail(GRADC_ERR_USER, "gradc: error: session_trace_stats: tracing is off (call gradc_session_trace first)");
  TraceStats st;
  trace_stats(s->trace, &st);
  if (comm_ms) *comm_ms = st.comm_us / 1000;
  if (exposed_ms) *exposed_ms = st.exposed_us / 1000;
  if (compute_ms) *compute_ms = st.compute_us / 1000;
  return GRADC_OK;
}
