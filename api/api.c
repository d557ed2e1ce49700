/* api.c - the C API (include/gradc.h): errors, programs and artifacts.
 *
 * A program is a model compiled for one window shape: the frontend lowers
 * the source, the pass pipeline differentiates and optimises it, and a
 * back end gets ready to run it.  The back end is the registry's for the
 * target (runtime/backend.h): "ref" the reference interpreter; "cpu" the
 * CPU executor (the fuse and memplan passes, LLVM kernels), or the
 * interpreter in a build without LLVM; "cuda[:sm_XX]" the CUDA executor
 * (the same passes, NVRTC kernels).  Everything here calls through the
 * Backend struct.
 *
 * Errors never exit: user errors (a bad model, a missing tensor) return
 * GRADC_ERR_USER with the whole diagnostic text, clang style with the
 * source line and caret, in gradc_last_error(); a verifier or back-end
 * failure returns GRADC_ERR_INTERNAL.
 *
 * Artifacts (runtime/artifact.h) hold, in sections:
 *   META  JSON: gradc version, API version, host id, target, K, threads,
 *         forward_only (compiled without autodiff),
 *         the -D values, the model's and the source's names
 *   SRC   the model text
 *   IR    the printed function after the target's pipeline (planned for cpu)
 *   SIG   JSON: params (name, dtype, shape, init), inputs (name, dtype,
 *         micro-batch shape, batched), loss names
 *   ...   what the back end's save hook adds: KOBJ, the CPU target's
 *         kernel object code; CUDA, CUBN, PTX, the CUDA target's
 *         compiled kernels; nothing on the interpreter
 * Loading checks the container (magic, version, checksum), the gradc
 * version, and for the cpu target the host, then reads the IR back with
 * ir_read and the signature from SIG: no frontend, no passes. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "passes/passes.h"
#include "api_impl.h"
#include "runtime/io/artifact.h"

/* ------------------------------------------------------------------ */
/* Errors                                                              */
/* ------------------------------------------------------------------ */

static _Thread_local char last_error[16384];

const char *gradc_last_error(void) { return last_error; }

gradc_status api_fail(gradc_status st, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(last_error, sizeof last_error, fmt, ap);
  va_end(ap);
  /* One message, no trailing newline (a diagnostic log ends with one). */
  size_t n = strlen(last_error);
  while (n > 0 && last_error[n - 1] == '\n') last_error[--n] = 0;
  return st;
}

const char *gradc_version(void) { return GRADC_VERSION; }

/* ------------------------------------------------------------------ */
/* Signature helpers                                                    */
/* ------------------------------------------------------------------ */

int api_nstate(const gradc_program *p) { return p->nparams + p->nbuffers; }

int api_state_index(const gradc_program *p, const char *name) {
  for (int i = 0; name && i < api_nstate(p); i++)
    if (strcmp(p->params[i].name, name) == 0) return i;
  return -1;
}

int api_param_index(const gradc_program *p, const char *name) {
  for (int i = 0; name && i < p->nparams; i++)
    if (strcmp(p->params[i].name, name) == 0) return i;
  return -1;
}

int api_input_index(const gradc_program *p, const char *name) {
  for (int i = 0; name && i < p->ninputs; i++)
    if (strcmp(p->inputs[i].name, name) == 0) return i;
  return -1;
}

IrType api_input_window_type(const gradc_program *p, int i) {
  IrType t = p->inputs[i].type;
  if (p->inputs[i].batched && t.shape.rank > 0) t.shape.dim[0] *= (int64_t)p->gas * p->dp;
  return t;
}

bool api_param_f64(const FeParam *p) { return p->type.dtype == IR_DT_F64; }

/* The model's identity for checkpoints: its name and its params' names,
 * declared types and shapes, in declaration order. */
static uint64_t fingerprint(const gradc_program *p) {
  StrBuf sb;
  sb_init(&sb);
  sb_printf(&sb, "model %s\n", p->model);
  for (int i = 0; i < api_nstate(p); i++) {
    char t[IR_TYPE_STR_MAX];
    sb_printf(&sb, "%s %s %s\n", i < p->nparams ? "param" : "buffer", p->params[i].name,
              ir_type_str(&p->params[i].type, t, sizeof t));
  }
  uint64_t h = hash_str(sb_str(&sb));
  sb_free(&sb);
  return h;
}

static gradc_dtype public_dtype(IrDType dt) {
  switch (dt) {
  case IR_DT_F32: return GRADC_F32;
  case IR_DT_F64: return GRADC_F64;
  case IR_DT_BF16: return GRADC_BF16;
  case IR_DT_F16: return GRADC_F16;
  case IR_DT_I32: return GRADC_I32;
  case IR_DT_BOOL: return GRADC_I32;
  }
  return GRADC_F32;
}

static gradc_program *program_new(void) {
  gradc_program *p = calloc(1, sizeof *p);
  if (!p) abort();
  arena_init(&p->arena);
  p->dp = 1;
  p->tp = 1;
  return p;
}

void gradc_program_free(gradc_program *p) {
  if (!p) return;
  if (p->prog) p->backend->free(p->prog);
  step_dp_free(&p->stepdp);
  api_zero_free(p->zero);
  comm_close(p->comm);
  if (p->fe)
    fe_model_free(p->fe);
  else
    ir_func_free(p->func);
  free(p->ir_text);
  free(p->source);
  arena_free(&p->arena);
  free(p);
}

/* ------------------------------------------------------------------ */
/* Back ends (runtime/backend.h)                                        */
/* ------------------------------------------------------------------ */

/* Get the program's back end ready to run p->func; art: the artifact it
 * came from (its compiled kernels), or NULL. */
static gradc_status backend_start(gradc_program *p, const ArtFile *art) {
  char err[16384], dir[4096];
  BackendOptions o = {p->target, p->threads, !p->no_cache && cache_dir(dir, sizeof dir) ? dir : NULL};
  const Backend *b = p->backend;
  if (art) {
    p->prog = b->load(p->func, art, &o, err, sizeof err);
    return p->prog ? GRADC_OK : api_fail(GRADC_ERR_USER, "gradc: error: artifact: %s", err);
  }
  if (b->usable && !b->usable(err, sizeof err)) return api_fail(GRADC_ERR_USER, "gradc: error: %s", err);
  /* A host arena larger than the machine's memory is the user's sizes, not
   * a failure of the back end. */
  if (strcmp(b->name, "cuda") != 0 && p->func->arena_size > 0 && (uint64_t)p->func->arena_size > mem_limit())
    return api_fail(GRADC_ERR_USER,
                    "gradc: error: cannot allocate the %lld-byte arena: more than the %llu bytes of memory this "
                    "machine has (smaller sizes, or --gas K to run the batch in K micro-batches)",
                    (long long)p->func->arena_size, (unsigned long long)mem_limit());
  p->prog = b->compile(p->func, &o, err, sizeof err);
  return p->prog ? GRADC_OK : api_fail(GRADC_ERR_INTERNAL, "gradc: internal error: %s", err);
}

void api_set_draws(gradc_program *p, uint64_t seed, uint64_t step) {
  p->draw_seed = seed;
  p->draw_step = step;
}

double api_program_loss_scale(const gradc_program *p) { return p->loss_scale > 0 ? p->loss_scale : 1.0; }

/* Eight sums rather than one: one running sum is a chain of dependent
 * adds (an add's latency an element), the first cost of a small model's
 * step after its kernels (tinygpt small: about 200 us a window).  The
 * groups of eight are straight-line code, which -O2 keeps in registers.
 * With scale, each element is first multiplied by inv in place, in the
 * same pass. */
static inline double sum_squares(double *g, int64_t n, bool scale, double inv) {
  double a0 = 0, a1 = 0, a2 = 0, a3 = 0, a4 = 0, a5 = 0, a6 = 0, a7 = 0;
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    if (scale)
      for (int k = 0; k < 8; k++) g[j + k] *= inv;
    a0 += g[j] * g[j], a1 += g[j + 1] * g[j + 1], a2 += g[j + 2] * g[j + 2], a3 += g[j + 3] * g[j + 3];
    a4 += g[j + 4] * g[j + 4], a5 += g[j + 5] * g[j + 5], a6 += g[j + 6] * g[j + 6], a7 += g[j + 7] * g[j + 7];
  }
  double t[8] = {a0, a1, a2, a3, a4, a5, a6, a7};
  for (int k = 0; j < n; j++, k++) {
    if (scale) g[j] *= inv;
    t[k] += g[j] * g[j];
  }
  double ss = 0;
  for (int k = 0; k < 8; k++) ss += t[k];
  return ss;
}

double api_sum_squares(const double *g, int64_t n) { return sum_squares((double *)g, n, false, 1.0); }

double api_unscale_sum_squares(double *g, int64_t n, double inv) { return sum_squares(g, n, true, inv); }

double api_unscale_norm2(StepResult *r, double scale) {
  double inv = 1.0 / scale, ss = 0;
  for (int i = 0; i < r->nlosses; i++) r->losses[i] *= inv;
  for (int i = 0; i < r->ngrads; i++) ss += api_unscale_sum_squares(r->grads[i], ir_numel(&r->grad_types[i].shape), inv);
  return ss;
}

void api_set_params_gen(gradc_program *p, uint64_t gen) {
  if (p->backend->set_params_gen) p->backend->set_params_gen(p->prog, gen);
}

void api_result_free(gradc_program *p, StepResult *r) {
  if (p->backend->recycle)
    p->backend->recycle(p->prog, r);
  else
    step_result_free(r);
}

struct CudaProgram *api_cuda_program(const gradc_program *p) {
  return strcmp(p->backend->name, "cuda") == 0 ? p->prog : NULL;
}

struct CpuProgram *api_cpu_program(const gradc_program *p) {
  return strcmp(p->backend->name, "cpu") == 0 ? p->prog : NULL;
}

bool api_dist_start(gradc_program *p, char *err, size_t errlen) {
  if ((int64_t)p->dp * p->tp <= 1 || p->comm) return true;
  p->comm = comm_open(p->tp, p->dp, err, errlen);
  if (!p->comm) return false;
  step_dp_init(&p->stepdp, p->comm);
  p->zero = api_zero_layout(p);
  return true;
}

int api_program_rank(const gradc_program *p) { return p && p->comm ? p->comm->rank : 0; }

/* A data-parallel window brackets the driver with step_dp_begin/end
 * (comm_step.c): the driver's step_bind and step_window_sums take this
 * rank's samples and add every rank's counts; step_dp_end adds the
 * gradients and losses.  The same for every target.  Under ZeRO-1 the
 * pipeline has no gradient all-reduces and step_dp_end is told the
 * gradients are done: they are reduce-scattered here instead (api_zero.c)
 * and, unless the caller keeps the shards, all-gathered whole. */
bool api_run_window(gradc_program *p, const StFile *params, const StFile *inputs, StepResult *r, char *err,
                    size_t errlen) {
  return api_run_window_ex(p, params, inputs, r, false, NULL, err, errlen);
}

bool api_run_window_ex(gradc_program *p, const StFile *params, const StFile *inputs, StepResult *r, bool keep_shard,
                       bool *sharded, char *err, size_t errlen) {
  if (sharded) *sharded = false;
  if (!api_dist_start(p, err, errlen)) return false;
  bool dist = p->comm != NULL, ok;
  if (dist) step_dp_begin(&p->stepdp);
  step_set_draws(p->draw_seed, p->draw_step); /* the executors' rng.state (window.c) */
  step_set_loss_scale(p->loss_scale > 0 ? p->loss_scale : 1.0); /* loss.scale (f16) */
  /* Messages name the files the tensors came from (gradc run's), else
   * what they are (a session's, built in memory). */
  ok = p->backend->run(p->prog, p->gas, params, params->path ? params->path : "the session's params", inputs,
                       inputs->path ? inputs->path : "the session's inputs", r, err, errlen);
  if (ok && r->ngrads > 0 && ir_numel(&r->grad_types[0].shape) > 0 && step_inject_inf())
    r->grads[0][0] = INFINITY; /* the test hook: an overflow on this rank */
  if (ok && p->zero) {
    if (!r->dp_reduced) r->dp_reduced = calloc((size_t)r->ngrads + 1, sizeof(bool));
    if (!r->dp_reduced) abort();
    for (int i = 0; i < r->ngrads; i++) {
      if (r->dp_reduced[i]) { /* the program has dp reductions of its own: they would count twice */
        snprintf(err, errlen, "internal error: ZeRO-1: gradient '%s' was already all-reduced by the program",
                 r->grad_names[i]);
        ok = false;
      }
      r->dp_reduced[i] = true;
    }
    if (ok) ok = api_zero_reduce_scatter(p, r, err, errlen);
    if (ok && !keep_shard) ok = api_zero_gather_grads(p, r, err, errlen);
    if (ok && sharded) *sharded = keep_shard;
    if (!ok) {
      step_dp_end(&p->stepdp, NULL, NULL, 0);
      step_result_free(r);
      return false;
    }
  }
  if (dist && !step_dp_end(&p->stepdp, ok ? r : NULL, err, errlen) && ok) {
    step_result_free(r);
    ok = false;
  }
  return ok;
}

/* ------------------------------------------------------------------ */
/* Compiling                                                           */
/* ------------------------------------------------------------------ */

void gradc_compile_options_init(gradc_compile_options *o) {
  memset(o, 0, sizeof *o);
  o->gas = 1;
  o->target = "cpu";
}

static gradc_status check_options(const gradc_compile_options *o) {
  if (o->gas < 1) return api_fail(GRADC_ERR_USER, "gradc: error: gas must be at least 1 (got %d)", o->gas);
  char targets[256];
  if (o->target && !rt_backend_find(o->target))
    return api_fail(GRADC_ERR_USER, "gradc: error: unsupported target '%s' (this build has: %s)", o->target,
                    rt_backend_targets(targets, sizeof targets));
  if (o->threads < 0) return api_fail(GRADC_ERR_USER, "gradc: error: threads must be >= 0 (got %d)", o->threads);
  if (o->precision && strcmp(o->precision, "f32") != 0 && strcmp(o->precision, "bf16") != 0 &&
      strcmp(o->precision, "f16") != 0)
    return api_fail(GRADC_ERR_USER, "gradc: error: unknown precision '%s' (expected f32, bf16 or f16)", o->precision);
  if (o->dp < 0) return api_fail(GRADC_ERR_USER, "gradc: error: dp must be at least 1 (got %d)", o->dp);
  if (o->tp < 0) return api_fail(GRADC_ERR_USER, "gradc: error: tp must be at least 1 (got %d)", o->tp);
  if (o->bucket_bytes < 0)
    return api_fail(GRADC_ERR_USER, "gradc: error: bucket_bytes must be >= 0 (got %lld)", (long long)o->bucket_bytes);
#ifndef GRADC_HAVE_MPI
  if (o->dp > 1)
    return api_fail(GRADC_ERR_USER, "gradc: error: --dp %d runs over MPI, and this build has none (configure with "
                                    "-DGRADC_MPI=ON and libopenmpi-dev installed)", o->dp);
  if (o->tp > 1)
    return api_fail(GRADC_ERR_USER, "gradc: error: --tp %d runs over MPI, and this build has none (configure with "
                                    "-DGRADC_MPI=ON and libopenmpi-dev installed)", o->tp);
#endif
  if (o->ndefs < 0 || (o->ndefs > 0 && (!o->def_names || !o->def_values)))
    return api_fail(GRADC_ERR_USER, "gradc: error: bad dim overrides (ndefs %d)", o->ndefs);
  for (int i = 0; i < o->ndefs; i++)
    if (!o->def_names[i] || !o->def_names[i][0])
      return api_fail(GRADC_ERR_USER, "gradc: error: dim override %d has no name", i);
  return GRADC_OK;
}

static void set_options(gradc_program *p, const gradc_compile_options *o) {
  p->gas = o->gas;
  p->target = arena_strdup(&p->arena, o->target ? o->target : "cpu");
  p->backend = rt_backend_find(p->target);
  p->threads = o->threads;
  p->no_cache = o->no_cache != 0;
  p->dp = o->dp > 1 ? o->dp : 1;
  p->tp = o->tp > 1 ? o->tp : 1;
  p->sequence_parallel = o->sequence_parallel != 0;
  p->no_overlap = o->no_overlap != 0;
  p->bucket_bytes = o->bucket_bytes;
  p->zero1 = o->zero1 != 0 && p->dp > 1;
  p->forward_only = o->forward_only != 0;
  p->precision = !o->precision ? IR_DT_F32
                 : strcmp(o->precision, "bf16") == 0 ? IR_DT_BF16
                 : strcmp(o->precision, "f16") == 0  ? IR_DT_F16
                                                     : IR_DT_F32;
  p->loss_scale = p->precision == IR_DT_F16 ? API_LOSS_SCALE_INIT : 1.0;
  p->ndefs = o->ndefs;
  p->def_names = ARENA_ARRAY(&p->arena, const char *, o->ndefs + 1);
  p->def_values = ARENA_ARRAY(&p->arena, int64_t, o->ndefs + 1);
  for (int i = 0; i < o->ndefs; i++) {
    p->def_names[i] = arena_strdup(&p->arena, o->def_names[i]);
    p->def_values[i] = o->def_values[i];
  }
}

/* The signature from the frontend's declarations. */
static void signature_from_model(gradc_program *p, const FeModel *m) {
  p->model = arena_strdup(&p->arena, m->name);
  p->nparams = m->nparams;
  p->nbuffers = m->nbuffers;
  p->params = ARENA_ARRAY(&p->arena, FeParam, m->nparams + m->nbuffers + 1);
  for (int i = 0; i < m->nparams + m->nbuffers; i++) {
    FeParam *d = &p->params[i];
    const FeParam *s = i < m->nparams ? &m->params[i] : &m->buffers[i - m->nparams];
    d->name = arena_strdup(&p->arena, s->name);
    d->type = s->type;
    d->init = s->init;
    d->a = s->a;
    d->b = s->b;
    d->split_axis = s->split_axis;
  }
  p->ninputs = m->ninputs;
  p->inputs = ARENA_ARRAY(&p->arena, ApiInput, m->ninputs + 1);
  for (int i = 0; i < m->ninputs; i++) {
    p->inputs[i].name = arena_strdup(&p->arena, m->inputs[i].name);
    p->inputs[i].type = m->inputs[i].type;
    p->inputs[i].batched = m->inputs[i].batched;
  }
  p->nlosses = m->nlosses;
  p->losses = ARENA_ARRAY(&p->arena, const char *, m->nlosses + 1);
  for (int i = 0; i < m->nlosses; i++) p->losses[i] = arena_strdup(&p->arena, m->losses[i]);
  p->noutputs = m->noutputs;
  p->outputs = ARENA_ARRAY(&p->arena, const char *, m->noutputs + 1);
  for (int i = 0; i < m->noutputs; i++) p->outputs[i] = arena_strdup(&p->arena, m->outputs[i]);
}

gradc_status gradc_program_compile_source(const char *name, const char *text, const gradc_compile_options *o,
                                          gradc_program **out) {
  return api_program_compile(name, text, o, NULL, out);
}

gradc_status api_program_compile(const char *name, const char *text, const gradc_compile_options *o, PassManager *pmo,
                                 gradc_program **out) {
  if (!out) return api_fail(GRADC_ERR_USER, "gradc: error: no place for the program (out is NULL)");
  *out = NULL;
  if (!text) return api_fail(GRADC_ERR_USER, "gradc: error: no model text");
  gradc_compile_options defaults;
  gradc_compile_options_init(&defaults);
  if (!o) o = &defaults;
  gradc_status st = check_options(o);
  if (st) return st;

  gradc_program *p = program_new();
  set_options(p, o);
  p->source_name = arena_strdup(&p->arena, name ? name : "<input>");
  p->source = strdup(text);
  if (!p->source) abort();
  SrcFile src = {p->source_name, p->source, strlen(p->source)};
  Diag d;
  diag_init(&d, NULL);
  d.quiet = true;
  FeOptions fo = {.def_names = p->def_names, .def_values = p->def_values, .ndefs = p->ndefs, .gas = p->gas, .dp = p->dp,
                  .no_training = o->no_training != 0 || p->forward_only, .no_outputs = o->no_outputs != 0};
  p->fe = fe_model_compile(&src, &fo, &d);
  if (!p->fe) {
    st = api_fail(GRADC_ERR_USER, "%s", sb_str(&d.log));
    goto fail;
  }
  p->func = p->fe->func;
  signature_from_model(p, p->fe);

  int n;
  const char *const *names = p->backend->pipeline(&n);
  /* ZeRO-1: no dp-reduce (its all-reduce buckets); the gradients are
   * reduce-scattered after the window (api_zero.c).  Forward-only: no
   * autodiff, hence no gradients to reduce either; the gradient rewrites
   * before memplan find nothing to do.  gas-fold stays: it makes a loss's
   * batch means window means, which the printed values need. */
  const char *kept[64];
  if ((p->zero1 || p->forward_only) && n <= 64) {
    int k = 0;
    for (int i = 0; i < n; i++)
      if (strcmp(names[i], "dp-reduce") != 0 && !(p->forward_only && strcmp(names[i], "autodiff") == 0))
        kept[k++] = names[i];
    names = kept;
    n = k;
  }
  PassManager pm;
  pm_init(&pm);
  if (pmo) pm = *pmo;
  /* The micro-batch is B / (K dp): tensor-parallel ranks share samples. */
  PassOptions po = {.gas = p->gas,
                    .diag = &d,
                    .src = &src,
                    .tp = p->tp,
                    .dp = p->dp,
                    .sequence_parallel = p->sequence_parallel,
                    .no_overlap = p->no_overlap,
                    .bucket_bytes = p->bucket_bytes,
                    .zero1 = p->zero1,
                    .no_inplace = p->backend->no_inplace,
                    .no_colsums = p->backend->no_colsums,
                    .precision = p->precision};
  int rc = pm_run(&pm, p->func, names, n, &po);
  if (pmo) *pmo = pm; /* the caller reads the per-pass times */
  if (rc == 1) {
    st = api_fail(GRADC_ERR_USER, "%s", sb_str(&d.log));
    goto fail;
  }
  if (rc != 0) {
    st = api_fail(GRADC_ERR_INTERNAL, "gradc: internal error: the IR verifier failed after a pass (the IR is on stderr)");
    goto fail;
  }
  StrBuf ir;
  sb_init(&ir);
  ir_print(p->func, &ir);
  p->ir_text = strdup(sb_str(&ir));
  sb_free(&ir);
  if (!p->ir_text) abort();
  p->fingerprint = fingerprint(p);
  st = backend_start(p, NULL);
  if (st) goto fail;
  diag_free(&d);
  *out = p;
  return GRADC_OK;
fail:
  diag_free(&d);
  gradc_program_free(p);
  return st;
}

gradc_status gradc_program_compile_file(const char *path, const gradc_compile_options *o, gradc_program **out) {
  if (out) *out = NULL;
  if (!path) return api_fail(GRADC_ERR_USER, "gradc: error: no model file given");
  const char *why;
  size_t len;
  char *text = read_file(path, &len, &why);
  if (!text) return api_fail(GRADC_ERR_USER, "gradc: error: %s: %s", path, why);
  if (strlen(text) != len) {
    free(text);
    return api_fail(GRADC_ERR_USER, "gradc: error: %s: the model file contains a NUL byte", path);
  }
  gradc_status st = gradc_program_compile_source(path, text, o, out);
  free(text);
  return st;
}

/* ------------------------------------------------------------------ */
/* The signature                                                        */
/* ------------------------------------------------------------------ */

int gradc_program_num_params(const gradc_program *p) { return p ? p->nparams : 0; }
int gradc_program_num_inputs(const gradc_program *p) { return p ? p->ninputs : 0; }
int gradc_program_num_losses(const gradc_program *p) { return p ? p->nlosses : 0; }
int gradc_program_gas(const gradc_program *p) { return p ? p->gas : 0; }
int gradc_program_dp(const gradc_program *p) { return p ? p->dp : 0; }
int gradc_program_tp(const gradc_program *p) { return p ? p->tp : 0; }
int gradc_program_zero1(const gradc_program *p) { return p && p->zero1 ? 1 : 0; }
int gradc_program_forward_only(const gradc_program *p) { return p && p->forward_only ? 1 : 0; }
int64_t gradc_program_arena_bytes(const gradc_program *p) { return p && p->func ? p->func->arena_size : 0; }
const char *gradc_program_precision(const gradc_program *p) { return ir_dtype_name(p ? p->precision : IR_DT_F32); }

const char *gradc_program_loss_name(const gradc_program *p, int i) {
  return p && i >= 0 && i < p->nlosses ? p->losses[i] : NULL;
}

int gradc_program_num_outputs(const gradc_program *p) { return p ? p->noutputs : 0; }
const char *gradc_program_output_name(const gradc_program *p, int i) {
  return p && i >= 0 && i < p->noutputs ? p->outputs[i] : NULL;
}
int gradc_program_num_buffers(const gradc_program *p) { return p ? p->nbuffers : 0; }

static void fill_info(gradc_tensor_info *out, const char *name, const IrType *t, bool batched) {
  memset(out, 0, sizeof *out);
  out->name = name;
  out->dtype = public_dtype(t->dtype);
  out->rank = t->shape.rank;
  for (int k = 0; k < t->shape.rank; k++) out->shape[k] = t->shape.dim[k];
  out->batched = batched;
}

gradc_status gradc_program_param_info(const gradc_program *p, int i, gradc_tensor_info *out) {
  if (!p || !out) return api_fail(GRADC_ERR_USER, "gradc: error: param_info: NULL argument");
  if (i < 0 || i >= p->nparams)
    return api_fail(GRADC_ERR_USER, "gradc: error: param index %d out of range (the model has %d)", i, p->nparams);
  fill_info(out, p->params[i].name, &p->params[i].type, false);
  return GRADC_OK;
}

gradc_status gradc_program_buffer_info(const gradc_program *p, int i, gradc_tensor_info *out) {
  if (!p || !out) return api_fail(GRADC_ERR_USER, "gradc: error: buffer_info: NULL argument");
  if (i < 0 || i >= p->nbuffers)
    return api_fail(GRADC_ERR_USER, "gradc: error: buffer index %d out of range (the model has %d)", i, p->nbuffers);
  fill_info(out, p->params[p->nparams + i].name, &p->params[p->nparams + i].type, false);
  return GRADC_OK;
}

gradc_status gradc_program_input_info(const gradc_program *p, int i, gradc_tensor_info *out) {
  if (!p || !out) return api_fail(GRADC_ERR_USER, "gradc: error: input_info: NULL argument");
  if (i < 0 || i >= p->ninputs)
    return api_fail(GRADC_ERR_USER, "gradc: error: input index %d out of range (the model has %d)", i, p->ninputs);
  IrType t = api_input_window_type(p, i);
  fill_info(out, p->inputs[i].name, &t, p->inputs[i].batched);
  return GRADC_OK;
}

/* ------------------------------------------------------------------ */
/* Artifacts: saving                                                    */
/* ------------------------------------------------------------------ */

static const char *init_name(FeInitKind k) {
  switch (k) {
  case FE_INIT_ZEROS: return "zeros";
  case FE_INIT_ONES: return "ones";
  case FE_INIT_NORMAL: return "normal";
  case FE_INIT_UNIFORM: return "uniform";
  }
  return "zeros";
}

static cJSON *shape_json(const IrShape *s) {
  cJSON *a = cJSON_CreateArray();
  for (int k = 0; k < s->rank; k++) cJSON_AddItemToArray(a, cJSON_CreateNumber((double)s->dim[k]));
  return a;
}

static char *meta_json(const gradc_program *p) {
  char host[4096];
  art_host_id(host, sizeof host);
  cJSON *m = cJSON_CreateObject();
  cJSON_AddStringToObject(m, "gradc_version", GRADC_VERSION);
  cJSON_AddNumberToObject(m, "api_version", GRADC_API_VERSION);
  cJSON_AddStringToObject(m, "host", host);
  cJSON_AddStringToObject(m, "target", p->target);
  cJSON_AddNumberToObject(m, "gas", p->gas);
  cJSON_AddNumberToObject(m, "dp", p->dp);
  cJSON_AddNumberToObject(m, "tp", p->tp);
  cJSON_AddBoolToObject(m, "sequence_parallel", p->sequence_parallel);
  cJSON_AddBoolToObject(m, "no_overlap", p->no_overlap);
  cJSON_AddNumberToObject(m, "bucket_bytes", (double)p->bucket_bytes);
  cJSON_AddBoolToObject(m, "zero1", p->zero1);
  cJSON_AddBoolToObject(m, "forward_only", p->forward_only);
  cJSON_AddStringToObject(m, "precision", ir_dtype_name(p->precision));
  cJSON_AddNumberToObject(m, "threads", p->threads);
  cJSON_AddBoolToObject(m, "no_cache", p->no_cache);
  cJSON *defs = cJSON_AddArrayToObject(m, "defs");
  for (int i = 0; i < p->ndefs; i++) {
    cJSON *d = cJSON_CreateObject();
    cJSON_AddStringToObject(d, "name", p->def_names[i]);
    cJSON_AddNumberToObject(d, "value", (double)p->def_values[i]);
    cJSON_AddItemToArray(defs, d);
  }
  cJSON_AddStringToObject(m, "model", p->model);
  cJSON_AddStringToObject(m, "source_name", p->source_name);
  char *s = cJSON_PrintUnformatted(m);
  cJSON_Delete(m);
  return s;
}

static char *sig_json(const gradc_program *p) {
  cJSON *root = cJSON_CreateObject();
  cJSON *params = cJSON_AddArrayToObject(root, "params");
  cJSON *buffers = cJSON_AddArrayToObject(root, "buffers");
  for (int i = 0; i < api_nstate(p); i++) {
    const FeParam *q = &p->params[i];
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "name", q->name);
    cJSON_AddStringToObject(o, "dtype", ir_dtype_name(q->type.dtype));
    cJSON_AddItemToObject(o, "shape", shape_json(&q->type.shape));
    cJSON_AddStringToObject(o, "init", init_name(q->init));
    /* Exact doubles as shortest round-trip strings. */
    char a[64], b[64];
    fmt_double(a, sizeof a, q->a);
    fmt_double(b, sizeof b, q->b);
    cJSON_AddStringToObject(o, "a", a);
    cJSON_AddStringToObject(o, "b", b);
    cJSON_AddItemToArray(i < p->nparams ? params : buffers, o);
  }
  cJSON *inputs = cJSON_AddArrayToObject(root, "inputs");
  for (int i = 0; i < p->ninputs; i++) {
    const ApiInput *q = &p->inputs[i];
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "name", q->name);
    cJSON_AddStringToObject(o, "dtype", ir_dtype_name(q->type.dtype));
    cJSON_AddItemToObject(o, "shape", shape_json(&q->type.shape));
    cJSON_AddBoolToObject(o, "batched", q->batched);
    cJSON_AddItemToArray(inputs, o);
  }
  cJSON *losses = cJSON_AddArrayToObject(root, "losses");
  for (int i = 0; i < p->nlosses; i++) cJSON_AddItemToArray(losses, cJSON_CreateString(p->losses[i]));
  cJSON *outputs = cJSON_AddArrayToObject(root, "outputs");
  for (int i = 0; i < p->noutputs; i++) cJSON_AddItemToArray(outputs, cJSON_CreateString(p->outputs[i]));
  char *s = cJSON_PrintUnformatted(root);
  cJSON_Delete(root);
  return s;
}

gradc_status gradc_program_save(const gradc_program *p, const char *path) {
  if (!p || !path) return api_fail(GRADC_ERR_USER, "gradc: error: program_save: NULL argument");
  ArtFile a;
  art_init(&a);
  char *meta = meta_json(p), *sig = sig_json(p);
  art_add(&a, "META", NULL, meta, strlen(meta));
  art_add(&a, "SRC", NULL, p->source, strlen(p->source));
  art_add(&a, "IR", NULL, p->ir_text, strlen(p->ir_text));
  art_add(&a, "SIG", NULL, sig, strlen(sig));
  cJSON_free(meta);
  cJSON_free(sig);
  char err[2048];
  gradc_status st = GRADC_OK;
  if (p->backend->save && !p->backend->save(p->prog, &a, err, sizeof err))
    st = api_fail(GRADC_ERR_INTERNAL, "gradc: internal error: %s: %s", path, err);
  if (!st && !art_write(path, &a, err, sizeof err)) st = api_fail(GRADC_ERR_USER, "gradc: error: %s", err);
  art_free(&a);
  return st;
}

/* ------------------------------------------------------------------ */
/* Artifacts: loading                                                   */
/* ------------------------------------------------------------------ */

static const char *json_str(const cJSON *o, const char *key) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
  return cJSON_IsString(v) ? v->valuestring : NULL;
}

static bool json_int(const cJSON *o, const char *key, int64_t lo, int64_t hi, int64_t *out) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
  if (!cJSON_IsNumber(v) || v->valuedouble != (double)(int64_t)v->valuedouble) return false;
  int64_t x = (int64_t)v->valuedouble;
  if (x < lo || x > hi) return false;
  *out = x;
  return true;
}

static bool json_type(const cJSON *o, IrType *t) {
  const char *dt = json_str(o, "dtype");
  const cJSON *shape = cJSON_GetObjectItemCaseSensitive(o, "shape");
  if (!dt || !ir_dtype_parse(dt, strlen(dt), &t->dtype) || !cJSON_IsArray(shape)) return false;
  int rank = cJSON_GetArraySize(shape);
  if (rank > IR_MAX_RANK) return false;
  t->shape.rank = rank;
  for (int k = 0; k < rank; k++) {
    const cJSON *d = cJSON_GetArrayItem(shape, k);
    if (!cJSON_IsNumber(d) || d->valuedouble < 0 || d->valuedouble > 9e15) return false;
    t->shape.dim[k] = (int64_t)d->valuedouble;
  }
  return true;
}

static bool parse_double(const char *s, double *out) {
  if (!s) return false;
  char *end;
  *out = strtod(s, &end);
  return end != s && !*end;
}

static bool init_parse(const char *s, FeInitKind *k) {
  static const FeInitKind kinds[] = {FE_INIT_ZEROS, FE_INIT_ONES, FE_INIT_NORMAL, FE_INIT_UNIFORM};
  for (int i = 0; s && i < 4; i++)
    if (strcmp(s, init_name(kinds[i])) == 0) {
      *k = kinds[i];
      return true;
    }
  return false;
}

/* META: options and identity.  Returns a message (static) or NULL. */
static const char *read_meta(gradc_program *p, const char *path, const ArtSection *s, char *err, size_t errlen) {
  cJSON *m = cJSON_ParseWithLength((const char *)s->data, s->len);
  const char *bad = "artifact is corrupt (bad META section)";
  int64_t gas, threads;
  const char *ver = m ? json_str(m, "gradc_version") : NULL;
  const char *host = m ? json_str(m, "host") : NULL, *target = m ? json_str(m, "target") : NULL;
  const char *model = m ? json_str(m, "model") : NULL, *sname = m ? json_str(m, "source_name") : NULL;
  const cJSON *defs = m ? cJSON_GetObjectItemCaseSensitive(m, "defs") : NULL;
  if (!ver || !host || !target || !model || !sname || !cJSON_IsArray(defs) || !json_int(m, "gas", 1, 1 << 20, &gas) ||
      !json_int(m, "threads", 0, 1 << 20, &threads) ||
      !rt_backend_find(target))
    goto done;
  if (strcmp(ver, GRADC_VERSION) != 0) {
    snprintf(err, errlen, "%s: artifact was built by gradc %s; this is gradc %s (recompile the model)", path, ver,
             GRADC_VERSION);
    bad = err;
    goto done;
  }
  /* Interpreted programs run anywhere; compiled kernels only on the host
   * (CPU and features) they were built for. */
  char here[4096];
  art_host_id(here, sizeof here);
  if (strcmp(target, "cpu") == 0 && strcmp(host, here) != 0) {
    snprintf(err, errlen, "%s: artifact was built for another host (%.400s); this host is %.400s", path, host, here);
    bad = err;
    goto done;
  }
  p->gas = (int)gas;
  int64_t dp = 1; /* absent before data parallelism: 1 */
  if (cJSON_GetObjectItemCaseSensitive(m, "dp") && !json_int(m, "dp", 1, 1 << 20, &dp)) goto done;
  p->dp = (int)dp;
  int64_t tp = 1, bucket = 0; /* absent before tensor parallelism: 1 */
  if (cJSON_GetObjectItemCaseSensitive(m, "tp") && !json_int(m, "tp", 1, 1 << 20, &tp)) goto done;
  if (cJSON_GetObjectItemCaseSensitive(m, "bucket_bytes") && !json_int(m, "bucket_bytes", 0, INT64_MAX / 2, &bucket))
    goto done;
  p->tp = (int)tp;
  p->bucket_bytes = bucket;
  p->sequence_parallel = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(m, "sequence_parallel"));
  p->no_overlap = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(m, "no_overlap"));
  p->zero1 = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(m, "zero1")) && p->dp > 1;
  p->forward_only = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(m, "forward_only")); /* absent before: training */
  const cJSON *prec = cJSON_GetObjectItemCaseSensitive(m, "precision"); /* absent before mixed precision: f32 */
  p->precision = IR_DT_F32;
  if (cJSON_IsString(prec) && !ir_dtype_parse(prec->valuestring, strlen(prec->valuestring), &p->precision)) goto done;
  p->loss_scale = p->precision == IR_DT_F16 ? API_LOSS_SCALE_INIT : 1.0;
  p->threads = (int)threads;
  p->no_cache = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(m, "no_cache"));
  p->target = arena_strdup(&p->arena, target);
  p->backend = rt_backend_find(p->target);
  p->model = arena_strdup(&p->arena, model);
  p->source_name = arena_strdup(&p->arena, sname);
  p->ndefs = cJSON_GetArraySize(defs);
  p->def_names = ARENA_ARRAY(&p->arena, const char *, p->ndefs + 1);
  p->def_values = ARENA_ARRAY(&p->arena, int64_t, p->ndefs + 1);
  for (int i = 0; i < p->ndefs; i++) {
    const cJSON *d = cJSON_GetArrayItem(defs, i);
    const char *name = json_str(d, "name");
    if (!name || !json_int(d, "value", INT64_MIN / 2, INT64_MAX / 2, &p->def_values[i])) goto done;
    p->def_names[i] = arena_strdup(&p->arena, name);
  }
  bad = NULL;
done:
  cJSON_Delete(m);
  return bad;
}

/* SIG: the signature; each entry must match an argument of f. */
static bool read_sig(gradc_program *p, const ArtSection *s) {
  cJSON *root = cJSON_ParseWithLength((const char *)s->data, s->len);
  const cJSON *params = root ? cJSON_GetObjectItemCaseSensitive(root, "params") : NULL;
  const cJSON *inputs = root ? cJSON_GetObjectItemCaseSensitive(root, "inputs") : NULL;
  const cJSON *losses = root ? cJSON_GetObjectItemCaseSensitive(root, "losses") : NULL;
  /* Language v2 (absent in older artifacts: none). */
  const cJSON *buffers = root ? cJSON_GetObjectItemCaseSensitive(root, "buffers") : NULL;
  const cJSON *outputs = root ? cJSON_GetObjectItemCaseSensitive(root, "outputs") : NULL;
  bool ok = cJSON_IsArray(params) && cJSON_IsArray(inputs) && cJSON_IsArray(losses) &&
            (!buffers || cJSON_IsArray(buffers)) && (!outputs || cJSON_IsArray(outputs));
  if (ok) {
    p->nparams = cJSON_GetArraySize(params);
    p->nbuffers = buffers ? cJSON_GetArraySize(buffers) : 0;
    p->ninputs = cJSON_GetArraySize(inputs);
    p->nlosses = cJSON_GetArraySize(losses);
    p->noutputs = outputs ? cJSON_GetArraySize(outputs) : 0;
    p->outputs = ARENA_ARRAY(&p->arena, const char *, p->noutputs + 1);
    p->params = ARENA_ARRAY(&p->arena, FeParam, p->nparams + p->nbuffers + 1);
    p->inputs = ARENA_ARRAY(&p->arena, ApiInput, p->ninputs + 1);
    p->losses = ARENA_ARRAY(&p->arena, const char *, p->nlosses + 1);
  }
  for (int i = 0; ok && i < p->nparams + p->nbuffers; i++) {
    bool buf = i >= p->nparams;
    const cJSON *o = buf ? cJSON_GetArrayItem(buffers, i - p->nparams) : cJSON_GetArrayItem(params, i);
    FeParam *q = &p->params[i];
    const char *name = json_str(o, "name");
    ok = name && json_type(o, &q->type) && init_parse(json_str(o, "init"), &q->init) &&
         parse_double(json_str(o, "a"), &q->a) && parse_double(json_str(o, "b"), &q->b);
    if (!ok) break;
    q->name = arena_strdup(&p->arena, name);
    q->split_axis = -1;
    const IrValue *arg = ir_func_find_arg(p->func, name);
    ok = arg && arg->role == (buf ? IR_ARG_BUFFER : IR_ARG_PARAM) && ir_type_eq(&arg->type, &q->type);
  }
  for (int i = 0; ok && i < p->noutputs; i++) {
    const cJSON *o = cJSON_GetArrayItem(outputs, i);
    ok = cJSON_IsString(o);
    if (ok) p->outputs[i] = arena_strdup(&p->arena, o->valuestring);
  }
  for (int i = 0; ok && i < p->ninputs; i++) {
    const cJSON *o = cJSON_GetArrayItem(inputs, i);
    ApiInput *q = &p->inputs[i];
    const char *name = json_str(o, "name");
    ok = name && json_type(o, &q->type);
    if (!ok) break;
    q->name = arena_strdup(&p->arena, name);
    q->batched = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(o, "batched"));
    const IrValue *arg = ir_func_find_arg(p->func, name);
    ok = arg && arg->role == IR_ARG_INPUT && ir_type_eq(&arg->type, &q->type) && arg->batched == q->batched;
  }
  for (int i = 0; ok && i < p->nlosses; i++) {
    const cJSON *o = cJSON_GetArrayItem(losses, i);
    ok = cJSON_IsString(o);
    if (ok) p->losses[i] = arena_strdup(&p->arena, o->valuestring);
  }
  /* Every argument is in the signature. */
  ok = ok && p->func->nargs == p->nparams + p->nbuffers + p->ninputs;
  cJSON_Delete(root);
  return ok;
}

gradc_status gradc_program_load(const char *path, gradc_program **out) {
  if (!out) return api_fail(GRADC_ERR_USER, "gradc: error: no place for the program (out is NULL)");
  *out = NULL;
  if (!path) return api_fail(GRADC_ERR_USER, "gradc: error: no artifact path given");
  char err[2048];
  ArtFile a;
  if (!art_read(path, &a, err, sizeof err)) return api_fail(GRADC_ERR_USER, "gradc: error: %s", err);
  gradc_program *p = program_new();
  gradc_status st = GRADC_OK;
  const ArtSection *meta = art_find(&a, "META", NULL), *src = art_find(&a, "SRC", NULL);
  const ArtSection *ir = art_find(&a, "IR", NULL), *sig = art_find(&a, "SIG", NULL);
  const char *why;
  if (!meta || !src || !ir || !sig) {
    st = api_fail(GRADC_ERR_USER, "gradc: error: %s: artifact is corrupt (a section is missing)", path);
    goto done;
  }
  if ((why = read_meta(p, path, meta, err, sizeof err)) != NULL) {
    st = why == err ? api_fail(GRADC_ERR_USER, "gradc: error: %s", err)
                    : api_fail(GRADC_ERR_USER, "gradc: error: %s: %s", path, why);
    goto done;
  }
  p->source = strdup((const char *)src->data);
  p->ir_text = strdup((const char *)ir->data);
  if (!p->source || !p->ir_text) abort();

  /* The IR as printed after the pipeline: read it, verify it. */
  Diag d;
  diag_init(&d, NULL);
  d.quiet = true;
  char irname[4200];
  snprintf(irname, sizeof irname, "%s(IR)", path);
  SrcFile irsrc = {irname, p->ir_text, strlen(p->ir_text)};
  p->func = ir_read(&irsrc, &d);
  if (!p->func) {
    st = api_fail(GRADC_ERR_USER, "gradc: error: %s: artifact is corrupt (its IR does not parse)\n%s", path,
                  sb_str(&d.log));
    diag_free(&d);
    goto done;
  }
  diag_free(&d);
  if (!ir_verify(p->func, err, sizeof err)) {
    char msg[2200];
    snprintf(msg, sizeof msg, "%s", err);
    st = api_fail(GRADC_ERR_USER, "gradc: error: %s: artifact is corrupt (its IR does not verify: %s)", path, msg);
    goto done;
  }
  if (!read_sig(p, sig)) {
    st = api_fail(GRADC_ERR_USER, "gradc: error: %s: artifact is corrupt (its signature does not match its IR)", path);
    goto done;
  }
  p->fingerprint = fingerprint(p);
  st = backend_start(p, &a);
done:
  art_free(&a);
  if (st) {
    gradc_program_free(p);
    return st;
  }
  *out = p;
  return GRADC_OK;
}
