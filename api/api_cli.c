/* api_cli.c - what the API exports for the command line (api/cli.h): the
 * commands' pieces that reach the frontend, the passes and the back ends,
 * so that tools/ sees only include/gradc.h and api/cli.h.  Diagnostics go
 * to stderr as they happen, through one Diag, as the command line prints
 * them. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "api/cli.h"
#include "api_impl.h"
#include "passes/passes.h"
#include "runtime/comm/trace.h"
#include "runtime/cpu/gemm.h"
#include "runtime/cpu/gemm_floor.h"
#include "runtime/io/artifact.h"
#ifdef GRADC_HAVE_CUDA
#include "codegen/cuda/cuda.h"
#include "runtime/cuda/cuda.h"
#endif

/* gradc_dtype and StDType list the same types in the same order. */
_Static_assert((int)GRADC_F32 == (int)ST_F32 && (int)GRADC_F64 == (int)ST_F64 && (int)GRADC_BF16 == (int)ST_BF16 &&
                   (int)GRADC_F16 == (int)ST_F16 && (int)GRADC_I32 == (int)ST_I32 && (int)GRADC_I64 == (int)ST_I64,
               "gradc_dtype and StDType agree");

static Diag diag;
static bool diag_ready;

static Diag *err_out(void) {
  if (!diag_ready) {
    diag_init(&diag, stderr);
    diag_ready = true;
  }
  return &diag;
}

/* "gradc: error: ..." and the user-error status. */
static int fail(const char *fmt, ...) GRADC_PRINTF(1, 2);
static int fail(const char *fmt, ...) {
  char msg[4096];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  diag_plain(err_out(), DIAG_ERROR, "%s", msg);
  return 1;
}

/* ------------------------------------------------------------------ */
/* Errors, targets, ranks                                              */
/* ------------------------------------------------------------------ */

int cli_report(gradc_status st) {
  const char *msg = gradc_last_error();
  if (!msg || !*msg) msg = "unknown failure";
  if (strstr(msg, "error: ")) /* model diagnostics and "gradc: error: ..." carry their prefix */
    fprintf(stderr, "%s%s", msg, msg[strlen(msg) - 1] == '\n' ? "" : "\n");
  else
    fprintf(stderr, "gradc: error: %s\n", msg);
  return st == GRADC_ERR_INTERNAL ? 2 : 1;
}

bool cli_is_cuda_target(const char *t) {
#ifdef GRADC_HAVE_CUDA
  char arch[32];
  return t && cg_cuda_parse_target(t, arch, sizeof arch);
#else
  (void)t;
  return false;
#endif
}

const char *cli_cuda_targets(void) {
#ifdef GRADC_HAVE_CUDA
  return ", cuda, cuda:sm_XX";
#else
  return "";
#endif
}

bool cli_is_artifact(const char *path) {
  char magic[8] = {0};
  FILE *f = fopen(path, "rb");
  if (!f) return false;
  size_t n = fread(magic, 1, sizeof magic, f);
  fclose(f);
  return n == sizeof magic && memcmp(magic, ART_MAGIC, 8) == 0;
}

int cli_need_device(void) {
#ifdef GRADC_HAVE_CUDA
  char err[512];
  if (!cuda_device_available(err, sizeof err)) return fail("%s", err);
#endif
  return 0;
}

int cli_launch_size(void) { return comm_launch_size(); }

int cli_launch_rank(void) { return comm_launch_rank(); }

void cli_abort_ranks(int rc) { comm_abort(rc); }

int cli_check_ranks(const gradc_program *p) {
  /* mpirun -np N needs --tp T --dp D with T*D = N (else every rank would compute the whole window). */
  int launched = comm_launch_size(), ranks = p->dp * p->tp;
  if (launched <= 1 || ranks == launched) return 0;
  if (p->tp == 1)
    return fail("this run has %d ranks (mpirun -np %d) but %s; pass --dp %d", launched, launched,
                p->dp == 1 ? "no --dp" : "a different --dp", launched);
  return fail("this run has %d ranks (mpirun -np %d) but --tp %d x --dp %d = %d; pass --tp and --dp whose product is %d",
              launched, launched, p->tp, p->dp, ranks, launched);
}

/* One collective answer: whether every rank holds v; rank 0's value and
 * the first other rank's into *v0, *vd (that rank into *rank). */
static bool agree_one(Comm *c, uint64_t v, int *rank, uint64_t *v0, uint64_t *vd, bool *same) {
  char err[1024];
  if (!comm_agree(&c->world, v, rank, v0, vd, err, sizeof err)) return fail("%s", err), false;
  *same = *rank < 0;
  return true;
}

static void show_item(const cli_agree_item *it, uint64_t v, char *buf, size_t n) {
  double d;
  switch (it->kind) {
  case CLI_AGREE_INT: snprintf(buf, n, "%lld", (long long)v); break;
  case CLI_AGREE_REAL:
    memcpy(&d, &v, sizeof d);
    if (isnan(d)) snprintf(buf, n, "the default"); /* not given */
    else fmt_double(buf, n, d);
    break;
  case CLI_AGREE_FLAG: snprintf(buf, n, "%s", v ? "on" : "off"); break;
  case CLI_AGREE_HASH: snprintf(buf, n, "hash %016llx", (unsigned long long)v); break;
  }
}

static uint64_t tensor_hash(const StTensor *t, uint64_t h) {
  h = hash_bytes(t->name, strlen(t->name) + 1, h);
  h = hash_bytes(&t->dtype, sizeof t->dtype, h);
  h = hash_bytes(t->shape, sizeof(int64_t) * (size_t)t->rank, h);
  return hash_bytes(t->data, t->nbytes, h);
}

/* cli_agree over c, for a state of step `step` and tensors st (NULL: the
 * items only); `state` names the tensors in messages ("param", "tensor of
 * --params"). */
static int agree(Comm *c, const cli_agree_item *items, int n, const int64_t *step, const StFile *st,
                 const char *state) {
  if (!c || c->size <= 1) return 0;
  bool lead = c->rank == 0, same;
  int rank;
  uint64_t v0, vd;
  /* One collective when all is well; one per item to name what differs. */
  uint64_t all = hash_bytes(&n, sizeof n, HASH_SEED);
  for (int i = 0; i < n; i++) all = hash_bytes(&items[i].v, sizeof items[i].v, hash_str(items[i].what) ^ all);
  if (step) all = hash_bytes(step, sizeof *step, all);
  for (int i = 0; st && i < st->n; i++) all = tensor_hash(&st->t[i], all);
  if (!agree_one(c, all, &rank, &v0, &vd, &same)) return 1;
  if (same) return 0;
  for (int i = 0; i < n; i++) {
    if (!agree_one(c, items[i].v, &rank, &v0, &vd, &same)) return 1;
    if (same) continue;
    if (lead) {
      char a[64], b[64];
      show_item(&items[i], vd, a, sizeof a);
      show_item(&items[i], v0, b, sizeof b);
      fail("ranks disagree on %s: rank %d: %s, rank 0: %s; every rank must be started with the same "
           "model, flags and files", items[i].what, rank, a, b);
    }
    return 1;
  }
  if (step) {
    if (!agree_one(c, (uint64_t)*step, &rank, &v0, &vd, &same)) return 1;
    if (!same) {
      if (lead)
        fail("ranks disagree on the step they start at (--resume): rank %d is at step %lld, rank 0 at %lld", rank,
             (long long)vd, (long long)v0);
      return 1;
    }
  }
  /* Every rank holds the same tensors (the items agreed on the model). */
  for (int i = 0; st && i < st->n; i++) {
    if (!agree_one(c, tensor_hash(&st->t[i], HASH_SEED), &rank, &v0, &vd, &same)) return 1;
    if (same) continue;
    if (lead)
      fail("ranks disagree on the %s '%s': rank %d's differs from rank 0's (hash %016llx, rank 0 %016llx)%s",
           state, st->t[i].name, rank, (unsigned long long)vd, (unsigned long long)v0,
           step ? "; give every rank the same --init, --resume and --seed" : "");
    return 1;
  }
  if (lead) fail("ranks disagree (rank %d), on what this rank cannot tell", rank);
  return 1;
}

int cli_agree(gradc_session *s, const cli_agree_item *items, int n, bool params) {
  return agree(s->p->comm, items, n, params ? &s->step : NULL, params ? &s->params : NULL, "initial value of param");
}

uint64_t cli_program_hash(const gradc_program *p) {
  uint64_t h = hash_str(p->source ? p->source : "");
  return hash_str(p->ir_text ? p->ir_text : "") ^ (h * 0x100000001b3ull);
}

/* ------------------------------------------------------------------ */
/* dtypes                                                              */
/* ------------------------------------------------------------------ */

const char *cli_dtype_name(gradc_dtype dt) { return st_dtype_lower((StDType)dt); }
const char *cli_dtype_file_name(gradc_dtype dt) { return st_dtype_name((StDType)dt); }
size_t cli_dtype_size(gradc_dtype dt) { return st_dtype_size((StDType)dt); }

/* ------------------------------------------------------------------ */
/* Passes                                                              */
/* ------------------------------------------------------------------ */

static const Pass *pass_at(int i) {
  int n;
  const Pass *ps = pass_list(&n);
  return i >= 0 && i < n ? &ps[i] : NULL;
}

void cli_print_functions(FILE *out) {
  for (int i = 0; i < fe_builtin_count(); i++) fprintf(out, "  %s\n", fe_builtin_signature(i));
}

int cli_pass_count(void) {
  int n;
  pass_list(&n);
  return n;
}

const char *cli_pass_name(int i) { return pass_at(i) ? pass_at(i)->name : NULL; }
const char *cli_pass_what(int i) { return pass_at(i) ? pass_at(i)->what : NULL; }
bool cli_pass_exists(const char *name) { return pass_lookup(name) != NULL; }

/* ------------------------------------------------------------------ */
/* Models and IR                                                       */
/* ------------------------------------------------------------------ */

typedef struct Loaded {
  SrcFile src;
  char *text;
  FeModel *model;
} Loaded;

/* Read and lower a model for one micro-batch of o->gas (the frontend only). */
static int load_model(const char *path, const gradc_compile_options *o, Loaded *l) {
  memset(l, 0, sizeof *l);
  const char *err;
  size_t len;
  l->text = read_file(path, &len, &err);
  if (!l->text) return fail("%s: %s", path, err);
  l->src = (SrcFile){path, l->text, len};
  FeOptions fo = {.def_names = (const char **)o->def_names, .def_values = o->def_values, .ndefs = o->ndefs,
                  .gas = o->gas, .dp = o->dp > 0 ? o->dp : 1};
  l->model = fe_model_compile(&l->src, &fo, err_out());
  return l->model ? 0 : 1;
}

static void unload(Loaded *l) {
  fe_model_free(l->model);
  free(l->text);
}

static void pm_dumps(PassManager *pm, const cli_dumps *d) {
  pm_init(pm);
  if (!d) return;
  pm->print_after = d->print_after;
  pm->print_before = d->print_before;
  pm->time_passes = d->time_passes;
  if (d->verify) pm->verify = true;
}

int cli_check(const char *path, const gradc_compile_options *o) {
  Loaded l;
  int rc = load_model(path, o, &l);
  unload(&l);
  return rc;
}

int cli_compile(const char *path, const gradc_compile_options *o, const cli_dumps *d, gradc_program **out) {
  *out = NULL;
  const char *err;
  size_t len;
  char *text = read_file(path, &len, &err);
  if (!text) return fail("%s: %s", path, err);
  PassManager pm;
  pm_dumps(&pm, d);
  gradc_status st = api_program_compile(path, text, o, &pm, out);
  free(text);
  return st ? cli_report(st) : 0;
}

const char *cli_program_target(const gradc_program *p) { return p->target; }

void cli_program_source(const gradc_program *p, const char **name, const char **text, gradc_compile_options *o) {
  *name = p->source_name;
  *text = p->source;
  gradc_compile_options_init(o);
  o->gas = p->gas;
  o->target = p->target;
  o->threads = p->threads;
  o->no_cache = p->no_cache;
  o->def_names = p->def_names;
  o->def_values = p->def_values;
  o->ndefs = p->ndefs;
}

/* The largest divisor of n that is at most cap (1 <= cap). */
static int64_t divisor_at_most(int64_t n, int64_t cap) {
  for (int64_t d = cap < n ? cap : n; d > 1; d--)
    if (n % d == 0) return d;
  return 1;
}

int cli_compile_window(const char *name, const char *text, const gradc_compile_options *o, int64_t window,
                       bool outputs, gradc_program **out, int64_t *micro) {
  *out = NULL;
  /* The model's batch dim and its size under o's -D values: the frontend alone. */
  SrcFile src = {name, text, strlen(text)};
  FeOptions fo = {.def_names = (const char **)o->def_names, .def_values = o->def_values, .ndefs = o->ndefs, .gas = 1,
                  .dp = 1, .no_training = true, .no_outputs = true};
  FeModel *m = fe_model_compile(&src, &fo, err_out());
  if (!m) return 1;
  const char *batch = m->batch ? mem_strdup(m->batch) : NULL;
  int64_t b0 = m->batch_window;
  fe_model_free(m);
  if (!batch) {
    if (window > 1) return fail("%s: the model has no batch dim (`batch NAME = SIZE`), so it cannot run %lld samples "
                                "as one window", name, (long long)window);
    window = 0;
  }
  if (window <= 0) window = b0;
  int64_t mb = batch ? divisor_at_most(window, b0 > 0 ? b0 : 1) : 0;
  /* o's -D values, but the batch dim's: the window's. */
  const char **names = mem_calloc((size_t)o->ndefs + 1, sizeof *names);
  int64_t *values = mem_calloc((size_t)o->ndefs + 1, sizeof *values);
  int n = 0;
  for (int i = 0; i < o->ndefs; i++)
    if (!batch || strcmp(o->def_names[i], batch) != 0) {
      names[n] = o->def_names[i];
      values[n++] = o->def_values[i];
    }
  if (batch) {
    names[n] = batch;
    values[n++] = window;
  }
  gradc_compile_options w = *o;
  w.def_names = names;
  w.def_values = values;
  w.ndefs = n;
  w.gas = batch ? (int)(window / mb) : 1;
  w.dp = w.tp = 1;
  w.zero1 = w.sequence_parallel = 0;
  w.forward_only = 1;
  w.no_outputs = !outputs;
  gradc_status st = batch && window / mb > (1 << 30)
                        ? api_fail(GRADC_ERR_USER, "gradc: error: %s: %lld samples is too large a window", name,
                                   (long long)window)
                        : api_program_compile(name, text, &w, NULL, out);
  free(names);
  free(values);
  free((void *)batch);
  if (micro) *micro = mb;
  int rc = st ? cli_report(st) : 0;
  if (st == GRADC_ERR_USER && w.gas > 1)
    fprintf(stderr, "gradc: note: the %lld samples run as one window of %d micro-batches of %lld (the largest divisor "
                    "of %lld that is at most the model's batch)\n",
            (long long)window, w.gas, (long long)mb, (long long)window);
  return rc;
}

int cli_write_kernels(const gradc_program *p, bool print, const char *dir) {
#ifdef GRADC_HAVE_CUDA
  if (api_cuda_program(p)) {
    const CuModule *m = cuda_program_module(api_cuda_program(p));
    if (print) {
      StrBuf sb;
      sb_init(&sb);
      cg_cuda_print(m, &sb);
      fputs(sb_str(&sb), stderr);
      sb_free(&sb);
    }
    char err[1024];
    if (dir && !cg_cuda_write_dir(m, dir, err, sizeof err)) return fail("%s", err);
    return 0;
  }
#endif
  (void)p;
  (void)dir;
  return fail("%s shows CUDA kernels: compile with --target cuda or cuda:sm_XX",
              print ? "--print-kernels" : "--kernels-dir");
}

static int write_dot(const char *path, const IrFunc *f) {
  FILE *out = fopen(path, "w");
  if (!out) return fail("%s: %s", path, strerror(errno));
  ir_write_dot(f, out);
  if (fclose(out) != 0) return fail("%s: %s", path, strerror(errno));
  return 0;
}

int cli_write_dot(const gradc_program *p, const char *path) { return write_dot(path, p->func); }

void cli_print_ir(const gradc_program *p, FILE *out) { ir_print_file(p->func, out); }

void cli_cost_report(const gradc_program *p, double gbps, double latency_us) {
  CostModel m;
  cost_model_default(&m);
  if (gbps > 0) m.link_bytes_per_s = gbps * 1e9 / 8;
  if (latency_us > 0) m.link_latency_s = latency_us * 1e-6;
  cost_report(p->func, &m, stderr);
}

int cli_opt(const char *path, const char *const *passes, int npasses, const gradc_compile_options *o,
            const cli_dumps *d, const char *dot) {
  const char *err;
  size_t len;
  char *text = read_file(path, &len, &err);
  if (!text) return fail("%s: %s", path, err);
  SrcFile src = {path, text, len};
  IrFunc *f = ir_read(&src, err_out());
  int rc = 1;
  if (f) {
    PassManager pm;
    pm_dumps(&pm, d);
    PassOptions po = {.gas = o->gas,
                      .diag = err_out(),
                      .src = &src,
                      .tp = o->tp > 0 ? o->tp : 1,
                      .dp = o->dp > 0 ? o->dp : 1,
                      .sequence_parallel = o->sequence_parallel,
                      .no_overlap = o->no_overlap,
                      .bucket_bytes = o->bucket_bytes,
                      .zero1 = o->zero1};
    if (o->precision && !ir_dtype_parse(o->precision, strlen(o->precision), &po.precision)) po.precision = IR_DT_F32;
    rc = pm_run(&pm, f, passes, npasses, &po);
    if (!rc && dot) rc = write_dot(dot, f);
    if (!rc) ir_print_file(f, stdout);
  }
  ir_func_free(f);
  free(text);
  return rc;
}

/* The tensors of `init` or `data random` to out. */
static int write_tensors(const char *out, StFile *st) {
  char err[1024];
  int rc = st_write(out, st, err, sizeof err) ? 0 : fail("%s", err);
  st_free(st);
  return rc;
}

int cli_init(const char *path, const gradc_compile_options *o, uint64_t seed, const char *out) {
  Loaded l;
  int rc = load_model(path, o, &l);
  if (!rc) {
    StFile st;
    st_init(&st);
    /* Params, then buffers (language v2): one generator, params first, so
     * a model's params draw the same values with or without buffers. */
    int n = l.model->nparams + l.model->nbuffers;
    FeParam *all = mem_calloc((size_t)n + 1, sizeof(FeParam));
    memcpy(all, l.model->params, sizeof(FeParam) * (size_t)l.model->nparams);
    memcpy(all + l.model->nparams, l.model->buffers, sizeof(FeParam) * (size_t)l.model->nbuffers);
    char err[1024];
    if (!rt_init_params_fit(all, n, err, sizeof err)) {
      rc = fail("init: %s", err);
    } else {
      rt_init_params(all, n, seed, &st);
      rc = write_tensors(out, &st);
    }
    free(all);
  }
  unload(&l);
  return rc;
}

int cli_data_random(const char *path, const gradc_compile_options *o, uint64_t seed, const char *out) {
  Loaded l;
  int rc = load_model(path, o, &l);
  if (!rc) {
    StFile st;
    st_init(&st);
    /* The frontend compiled shapes for one micro-batch of K; write the
     * window of every --dp rank. */
    int k = o->gas * (o->dp > 0 ? o->dp : 1);
    char err[1024];
    if (!rt_random_inputs_fit(l.model->func, k, err, sizeof err)) {
      rc = fail("data random: %s", err);
    } else {
      rt_random_inputs(l.model->func, k, seed, &st);
      rc = write_tensors(out, &st);
    }
  }
  unload(&l);
  return rc;
}

/* ------------------------------------------------------------------ */
/* run                                                                 */
/* ------------------------------------------------------------------ */

/* F32 gradients (F64 for f64 params), named as the params. */
static int write_grads(const char *path, const StepResult *r) {
  StFile st;
  st_init(&st);
  for (int i = 0; i < r->ngrads; i++) {
    const IrType *t = &r->grad_types[i];
    int64_t n = ir_numel(&t->shape);
    if (t->dtype == IR_DT_F64) {
      st_add(&st, r->grad_names[i], ST_F64, t->shape.rank, t->shape.dim, r->grads[i]);
    } else {
      float *buf = mem_alloc(sizeof(float) * (size_t)n);
      for (int64_t j = 0; j < n; j++) buf[j] = (float)r->grads[i][j];
      st_add(&st, r->grad_names[i], ST_F32, t->shape.rank, t->shape.dim, buf);
      free(buf);
    }
  }
  return write_tensors(path, &st);
}

/* Language v2: the window's outputs (--outputs-out) or updated buffers
 * (--buffers-out), named as declared: F32 (F64 for f64), I32 for i32 and
 * bool outputs. */
static int write_states(const char *path, int n, const char *const *names, const IrType *types,
                        double *const *values) {
  StFile st;
  st_init(&st);
  for (int i = 0; i < n; i++) {
    const IrType *t = &types[i];
    int64_t m = ir_numel(&t->shape);
    if (t->dtype == IR_DT_F64) {
      st_add(&st, names[i], ST_F64, t->shape.rank, t->shape.dim, values[i]);
    } else if (t->dtype == IR_DT_I32 || t->dtype == IR_DT_BOOL) {
      int32_t *buf = mem_alloc(sizeof(int32_t) * (size_t)(m + 1));
      for (int64_t j = 0; j < m; j++) buf[j] = (int32_t)values[i][j];
      st_add(&st, names[i], ST_I32, t->shape.rank, t->shape.dim, buf);
      free(buf);
    } else {
      float *buf = mem_alloc(sizeof(float) * (size_t)(m + 1));
      for (int64_t j = 0; j < m; j++) buf[j] = (float)values[i][j];
      st_add(&st, names[i], ST_F32, t->shape.rank, t->shape.dim, buf);
      free(buf);
    }
  }
  return write_tensors(path, &st);
}

/* --trace: every rank's events into the file rank 0 writes, and rank 0's
 * figures on stderr (collective in a distributed run). */
static int write_trace(const char *path, const gradc_program *p, Trace *t) {
  char err[1024];
  if (p->comm && !comm_trace_gather(&p->comm->world, t, err, sizeof err)) return fail("%s", err);
  if (api_program_rank(p) != 0) return 0;
  if (!trace_write(t, path, err, sizeof err)) return fail("%s", err);
  TraceStats st;
  trace_stats(t, &st);
  fprintf(stderr, "trace: %s: rank 0: compute %.3f ms, %lld collectives in flight %.3f ms, exposed %.3f ms", path,
          st.compute_us / 1000, (long long)st.collectives, st.comm_us / 1000, st.exposed_us / 1000);
  if (st.comm_us > 0) fprintf(stderr, " (%.1f%% hidden)", 100.0 * (1.0 - st.exposed_us / st.comm_us));
  fputc('\n', stderr);
  return 0;
}

/* Losses in declaration order, then their sum. */
static void print_losses(const gradc_program *p, const StepResult *r) {
  double total = 0;
  for (int i = 0; i < p->nlosses; i++)
    for (int j = 0; j < r->nlosses; j++)
      if (strcmp(r->loss_names[j], p->losses[i]) == 0) {
        printf("loss %s %.9g\n", p->losses[i], r->losses[j]);
        total += r->losses[j];
      }
  printf("loss total %.9g\n", total);
  fflush(stdout);
}

/* A checkpoint serves as a params file: drop its optim.* tensors. */
static void drop_optim_state(StFile *f) {
  bool any = false;
  for (int i = 0; i < f->n && !any; i++) any = strncmp(f->t[i].name, "optim.", 6) == 0;
  if (!any) return;
  StFile kept;
  st_init(&kept);
  for (int i = 0; i < f->n; i++) {
    const StTensor *t = &f->t[i];
    if (strncmp(t->name, "optim.", 6) != 0) st_add(&kept, t->name, t->dtype, t->rank, t->shape, t->data);
  }
  st_free(f);
  *f = kept;
}

void cli_set_draws(gradc_program *p, uint64_t seed, uint64_t step) { api_set_draws(p, seed, step); }

/* A distributed run: every rank has rank 0's model and files (before the
 * window's collectives, which ranks that differ would wait in). */
static int agree_files(gradc_program *p, const StFile *params, const StFile *inputs) {
  uint64_t hi = HASH_SEED;
  for (int i = 0; i < inputs->n; i++) hi = tensor_hash(&inputs->t[i], hi);
  const cli_agree_item items[] = {
      {"the model (its text, -D sizes, --gas, --dp, --tp)", CLI_AGREE_HASH, cli_program_hash(p)},
      {"--target", CLI_AGREE_HASH, hash_str(p->target)},
      {"--seed and --step (the random draws)", CLI_AGREE_HASH,
       hash_bytes(&p->draw_step, sizeof p->draw_step, hash_bytes(&p->draw_seed, sizeof p->draw_seed, HASH_SEED))},
      {"--inputs (the window's tensors)", CLI_AGREE_HASH, hi},
  };
  return agree(p->comm, items, (int)(sizeof items / sizeof *items), NULL, params, "tensor of --params");
}

int cli_run(gradc_program *p, const char *params_path, const char *inputs_path, const char *grads_out,
            const char *outputs_out, const char *buffers_out, const char *trace_path, bool allow_tf32) {
#ifdef GRADC_HAVE_CUDA
  if (api_cuda_program(p)) cuda_program_allow_tf32(api_cuda_program(p), allow_tf32);
#else
  (void)allow_tf32;
#endif
  int rc = cli_check_ranks(p);
  if (rc) return rc;
  char err[1024];
  Trace *trace = NULL;
  if (trace_path) {
    if (!api_dist_start(p, err, sizeof err)) return fail("%s", err); /* the rank names the trace's events */
    trace = trace_new(api_program_rank(p));
    trace_set_current(trace);
  }
  StFile params, inputs;
  st_init(&params);
  st_init(&inputs);
  StepResult r;
  if (!st_read(params_path, &params, err, sizeof err) || !st_read(inputs_path, &inputs, err, sizeof err)) {
    rc = fail("%s", err);
  } else if ((int64_t)p->dp * p->tp > 1 && !api_dist_start(p, err, sizeof err)) {
    rc = fail("%s", err);
  } else if ((rc = agree_files(p, &params, &inputs))) {
    /* ranks given different files: said on rank 0 */
  } else if (drop_optim_state(&params), !api_run_window(p, &params, &inputs, &r, err, sizeof err)) {
    rc = fail("%s", err);
  } else {
    if (api_program_loss_scale(p) != 1.0) (void)api_unscale_norm2(&r, api_program_loss_scale(p)); /* f16 */
    if (api_program_rank(p) == 0) { /* data-parallel: rank 0 prints and writes the window's results */
      print_losses(p, &r);
      if (grads_out) rc = write_grads(grads_out, &r);
      if (!rc && outputs_out) rc = write_states(outputs_out, r.noutputs, r.output_names, r.output_types, r.outputs);
      if (!rc && buffers_out) rc = write_states(buffers_out, r.nupdates, r.update_names, r.update_types, r.updates);
    }
    step_result_free(&r);
  }
  if (trace) {
    trace_set_current(NULL);
    if (!rc) rc = write_trace(trace_path, p, trace);
    trace_free(trace);
  }
  st_free(&params);
  st_free(&inputs);
  if (rc) comm_abort(rc); /* a distributed run: end the other ranks too, rather than leave them waiting */
  return rc;
}

/* ------------------------------------------------------------------ */
/* bench                                                               */
/* ------------------------------------------------------------------ */

static int cmp_double(const void *x, const void *y) {
  double a = *(const double *)x, b = *(const double *)y;
  return (a > b) - (a < b);
}

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* The step clock: wall time, or with GRADC_BENCH_CLOCK=cpu the process's
 * CPU time (every thread's), which other processes on a shared machine
 * disturb far less at one thread (they take the core, not the work; at
 * more threads it also counts the pool's waiting).  For A/B comparisons
 * on a loaded machine, not for the figures of record. */
static double step_clock_ms(bool cpu) {
  if (!cpu) return rt_now_ms();
  struct timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

/* Warm-up and timed windows through the back end's step entry point;
 * per-window times into ms[steps]. */
static int run_steps(gradc_program *p, int warmup, int steps, const StFile *params, const StFile *inputs,
                     double *ms) {
  InterpOptions io = {0};
  char err[1024];
  const char *clk = getenv("GRADC_BENCH_CLOCK");
  bool cpu = clk && strcmp(clk, "cpu") == 0;
  for (int s = -warmup; s < steps; s++) {
    StepResult r;
    double t0 = step_clock_ms(cpu);
    bool ok;
    if (api_cpu_program(p)) {
      cpu_program_set_params_gen(api_cpu_program(p), 1); /* the same random params every window */
      cpu_program_skip_grads(api_cpu_program(p));        /* only the losses are used: the gradients stay in the arena */
    }
#ifdef GRADC_HAVE_CUDA
    if (api_cuda_program(p))
      ok = cuda_step_run(api_cuda_program(p), p->gas, params, "random params", inputs, "random inputs", &r, err, sizeof err);
    else
#endif
      ok = api_cpu_program(p) ? cpu_step_run(api_cpu_program(p), p->gas, params, "random params", inputs, "random inputs", &r, err,
                                 sizeof err)
                  : step_run_ref(p->func, p->gas, params, "random params", inputs, "random inputs", &io, &r, err,
                                 sizeof err);
    double t1 = step_clock_ms(cpu);
    if (!ok) return fail("%s", err);
    for (int i = 0; i < r.nlosses; i++)
      if (!isfinite(r.losses[i]))
        fprintf(stderr, "gradc: warning: loss '%s' is %g on random inputs\n", r.loss_names[i], r.losses[i]);
    if (api_cpu_program(p))
      cpu_program_recycle(api_cpu_program(p), &r); /* the next window reads its gradients into the same arrays */
    else
      step_result_free(&r);
    if (s >= 0) ms[s] = t1 - t0;
  }
  return 0;
}

/* One line per GEMM, as bench/gemm_lib.c reads them:
 * `gemm M N K BATCH TA TB BETA [f64|bf16]  # file:line:col` (the matmul's source). */
static void list_gemms(const RtGemm *g, int n) {
  for (int i = 0; i < n; i++) {
    fprintf(stderr, "gemm %lld %lld %lld %lld %c %c %d%s", (long long)g[i].M, (long long)g[i].N, (long long)g[i].K,
            (long long)g[i].nb, g[i].ta ? 'T' : 'N', g[i].tb ? 'T' : 'N', g[i].accumulate ? 1 : 0,
            g[i].dbl ? " f64" : g[i].bf16 ? " bf16" : "");
    if (g[i].op->loc.file)
      fprintf(stderr, "  # %s:%d:%d", g[i].op->loc.file, g[i].op->loc.line, g[i].op->loc.col);
    fputc('\n', stderr);
  }
}

/* Launches per window: generated kernels plus GEMM ops (none on the
 * reference interpreter; kernels a GEMM runs as its epilogue not counted),
 * and matmuls (a batched one counts once). */
static void count_launches(const gradc_program *p, cli_bench_figures *fig) {
  const IrFunc *f = p->func;
  int64_t kernels = 0, gemms = 0;
  for (int i = 0; i < f->nops; i++) {
    const IrOp *op = f->ops[i];
    if (op->group > 0 && (i == 0 || f->ops[i - 1]->group != op->group)) kernels++;
    if (op->opcode == IR_OP_MATMUL && op->group == 0) gemms++;
  }
  bool ref = !api_cpu_program(p);
#ifdef GRADC_HAVE_CUDA
  ref = ref && !api_cuda_program(p);
#endif
  fig->gemms_per_step = gemms * p->gas;
  if (api_cpu_program(p)) kernels -= cpu_program_absorbed_kernels(api_cpu_program(p)); /* GEMM epilogues */
  fig->kernels_per_step = ref ? 0 : (kernels + gemms) * p->gas;
}

double cli_gemm_select_ms(void) {
  char err[1024];
  double t0 = rt_now_ms();
  (void)cpu_gemm_select(NULL, err, sizeof err); /* an unknown GRADC_GEMM fails the compile after it */
  return rt_now_ms() - t0;
}

/* Rounds of timed steps, each followed by a round of the GEMM floor. */
#define BENCH_ROUNDS 4

/* Round r's part of n items cut into `rounds` (the first ones larger). */
static int round_share(int n, int rounds, int r) { return n / rounds + (r < n % rounds); }

int cli_bench(gradc_program *p, int warmup, int steps, uint64_t seed, int threads, bool allow_tf32,
              bool print_gemms, cli_bench_figures *fig) {
  memset(fig, 0, sizeof *fig);
#ifdef GRADC_HAVE_CUDA
  if (api_cuda_program(p)) cuda_program_allow_tf32(api_cuda_program(p), allow_tf32);
#else
  (void)allow_tf32;
#endif
  StFile params, inputs;
  st_init(&params);
  st_init(&inputs);
  char err[1024];
  if (!rt_init_params_fit(p->params, p->nparams, err, sizeof err) ||
      !rt_random_inputs_fit(p->func, p->gas, err, sizeof err))
    return fail("bench: %s", err);
  /* Params from each param's `init` (as `gradc init`): realistic magnitudes. */
  rt_init_params(p->params, api_nstate(p), seed, &params); /* params and buffers */
  rt_random_inputs(p->func, p->gas, seed + 1, &inputs);
  double *ms = mem_calloc((size_t)steps, sizeof(double));
  int reps = steps < 3 ? 3 : steps;
  double *fms = mem_calloc((size_t)reps, sizeof(double));
  /* The CPU's floor is timed in rounds between the steps' (BENCH_ROUNDS):
   * a shared host's speed drifts over seconds, and a floor timed after
   * every step saw another machine than the steps did. */
  bool cuda = false;
#ifdef GRADC_HAVE_CUDA
  cuda = api_cuda_program(p) != NULL;
#endif
  int rounds = cuda || steps < BENCH_ROUNDS ? 1 : BENCH_ROUNDS;
  int rc = run_steps(p, warmup, round_share(steps, rounds, 0), &params, &inputs, ms);
  RtGemm *g = NULL;
  int ng = 0;
  RtGemmFloor *fl = NULL;
  char ferr[1024];
  if (!rc) {
    /* Before the floor, whose private buffers are no part of a step. */
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    fig->peak_rss_bytes = (int64_t)ru.ru_maxrss * 1024;
    ng = rt_gemm_list(p->func, &g);
    /* The floor multiplies with the program's provider (the host's
     * choice for the interpreter, which has none of its own). */
    char dir[4096];
    if (api_cpu_program(p)) fig->gemm_provider = cpu_program_gemm_provider(api_cpu_program(p));
    else {
      const CpuGemmProvider *gp = cpu_gemm_select(!p->no_cache && cache_dir(dir, sizeof dir) ? dir : NULL, ferr, sizeof ferr);
      fig->gemm_provider = gp ? gp->name : "";
    }
    if (print_gemms) list_gemms(g, ng);
#ifdef GRADC_HAVE_CUDA
    if (cuda && !cuda_gemm_floor(api_cuda_program(p), p->gas, reps, fms, ferr, sizeof ferr)) rc = fail("%s", ferr);
#endif
    if (!cuda && !(fl = rt_gemm_floor_new(g, ng, p->gas, threads, fig->gemm_provider, ferr, sizeof ferr)))
      rc = fail("%s", ferr);
  }
  int done = round_share(steps, rounds, 0), fdone = 0;
  for (int r = 0; !rc && fl && r < rounds; r++) {
    if (r > 0) {
      /* The provider's own threads (the floor's) spin a while after its
       * last call: let them sleep before the steps' threads run, and warm
       * the step's buffers again with one untimed window. */
      struct timespec pause = {0, 100 * 1000 * 1000};
      nanosleep(&pause, NULL);
      int ns = round_share(steps, rounds, r);
      rc = run_steps(p, 1, ns, &params, &inputs, ms + done);
      done += ns;
    }
    int nf = round_share(reps, rounds, r);
    if (!rc) rt_gemm_floor_time(fl, 1, nf, fms + fdone);
    fdone += nf;
  }
  if (!rc) {
    fig->step_ms_median = median(ms, steps);
    fig->step_ms_min = ms[0]; /* sorted by median */
    fig->gemm_floor_ms = ng ? median(fms, reps) : 0;
    count_launches(p, fig);
    fig->peak_bytes = p->func->arena_size;
  }
  rt_gemm_floor_free(fl);
  rt_gemm_list_free(g, ng);
  free(fms);
  free(ms);
  st_free(&params);
  st_free(&inputs);
  return rc;
}

/* ------------------------------------------------------------------ */
/* Tensor files                                                        */
/* ------------------------------------------------------------------ */

struct cli_tensors {
  StFile st;
};

cli_tensors *cli_tensors_new(void) {
  cli_tensors *f = mem_calloc(1, sizeof *f);
  st_init(&f->st);
  return f;
}

void cli_tensors_free(cli_tensors *f) {
  if (!f) return;
  st_free(&f->st);
  free(f);
}

uint64_t cli_tensors_hash(const cli_tensors *f) {
  uint64_t h = HASH_SEED;
  for (int i = 0; i < f->st.n; i++) h = tensor_hash(&f->st.t[i], h);
  return h;
}

int cli_check_dataset_indices(const gradc_program *p, const cli_tensors *data, const char *path) {
  const IrFunc *f = p->func;
  for (int i = 0; i < f->nops; i++) {
    const IrOp *op = f->ops[i];
    InterpIndexRange r;
    if (!interp_index_range(op, &r)) continue;
    const IrValue *x = op->args[interp_index_operand(op)];
    if (x->def || x->role != IR_ARG_INPUT) continue; /* computed indices: the window's check */
    const StTensor *t = st_find(&data->st, x->name);
    if (!t || (t->dtype != ST_I32 && t->dtype != ST_I64)) continue;
    int64_t n = st_numel(t), row = x->batched && t->rank > 0 && t->shape[0] > 0 ? n / t->shape[0] : 0;
    for (int64_t k = 0; k < n; k++) {
      int64_t v = t->dtype == ST_I32 ? ((const int32_t *)t->data)[k] : ((const int64_t *)t->data)[k];
      if ((r.ignorable && v == r.ignore) || (v >= 0 && v < r.hi)) continue;
      char at[64] = "", where[512] = "";
      if (row) {
        int m = snprintf(at, sizeof at, ", sample %lld", (long long)(k / row));
        if (row > 1) snprintf(at + m, sizeof at - (size_t)m, " (element %lld of it)", (long long)(k % row));
      } else {
        snprintf(at, sizeof at, ", element %lld", (long long)k);
      }
      if (op->loc.file) snprintf(where, sizeof where, " at %s:%d:%d", op->loc.file, op->loc.line, op->loc.col);
      return fail("%s: tensor '%s'%s: %s %lld out of range [0, %lld) (%s%s)", path, t->name, at, r.what, (long long)v,
                  (long long)r.hi, ir_op_info[op->opcode].name, where);
    }
  }
  return 0;
}

bool cli_tensors_read(cli_tensors *f, const char *path, char *err, size_t errlen) {
  st_free(&f->st);
  st_init(&f->st);
  return st_read(path, &f->st, err, errlen);
}

bool cli_tensors_write(const cli_tensors *f, const char *path, char *err, size_t errlen) {
  return st_write(path, &f->st, err, errlen);
}

int cli_tensors_count(const cli_tensors *f) { return f->st.n; }

cli_tensor cli_tensors_at(const cli_tensors *f, int i) {
  const StTensor *t = &f->st.t[i];
  return (cli_tensor){t->name, (gradc_dtype)t->dtype, t->rank, t->shape, t->data, t->nbytes};
}

int cli_tensors_find(const cli_tensors *f, const char *name) {
  const StTensor *t = st_find(&f->st, name);
  return t ? (int)(t - f->st.t) : -1;
}

void cli_tensors_add(cli_tensors *f, const char *name, gradc_dtype dt, int rank, const int64_t *shape,
                     const void *data) {
  st_add(&f->st, name, (StDType)dt, rank, shape, data);
}

const char *cli_tensors_meta(const cli_tensors *f, const char *key) { return st_get_meta(&f->st, key); }

void cli_tensors_set_meta(cli_tensors *f, const char *key, const char *value) { st_set_meta(&f->st, key, value); }
