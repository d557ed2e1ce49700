/* bench.c - `gradc bench` (DESIGN.md §5): compile a model, run
 * forward+backward windows on random inputs and params, and print what
 * they cost, one `name: value` line per figure in this order:
 *
 *   compile_ms       cold: read + frontend + passes + code generation until
 *                    the program can run, with the object cache bypassed
 *   compile_warm_ms  the same again with the object cache (filled by an
 *                    untimed compile first); without a cache, a second
 *                    measurement of the same work
 *   step_ms_median   one window (K micro-batches) through the back end's
 *   step_ms_min      step entry point, after warm-up windows
 *   gemm_floor_ms    the window's GEMMs alone (every matmul the executor
 *                    hands to the BLAS, with its shapes, batch loop,
 *                    transposes and beta, K times) through the same BLAS on
 *                    the same threads: median over windows
 *   kernels_per_step launches per window: generated kernels plus GEMM ops
 *                    (0 on the reference interpreter, which has no kernels)
 *   gemms_per_step   matmul ops per window (a batched matmul counts once)
 *   peak_bytes       the step's arena (IrFunc.arena_size; 0 on ref)
 *   peak_rss_bytes   the process's peak resident set (getrusage) after the
 *                    compiles and steps, before the floor's own buffers
 *
 * Times are milliseconds per window, printed with %.3f.  --json prints the
 * same figures as one JSON object.  Nothing else goes to stdout. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include <cjson/cJSON.h>

#include "frontend/frontend.h"
#include "passes/passes.h"
#include "runtime/cpu/gemm_floor.h"
#include "runtime/runtime.h"
#include "bench.h"
#include "tools.h"
#ifdef GRADC_HAVE_CUDA
#include "runtime/cuda/cuda.h"
#endif

const char bench_help[] =
    "gradc bench MODEL.gdl [-D N=V]... [--gas K] [--target cpu|ref|cuda[:sm_XX]] [--allow-tf32]\n"
    "            [--threads N] [--steps N]\n"
    "            [--warmup N] [--seed S] [--no-cache] [--json] [--print-gemms]\n"
    "  Compile a model and time forward+backward windows on random inputs and params (after\n"
    "  --warmup windows, default 2; --steps timed windows, default 10).  Prints `name: value`\n"
    "  lines, times in ms per window: compile_ms (cold, cache bypassed), compile_warm_ms (from\n"
    "  the object cache), step_ms_median, step_ms_min, gemm_floor_ms (the window's GEMMs alone,\n"
    "  same BLAS and threads), kernels_per_step (kernel and GEMM launches), gemms_per_step,\n"
    "  peak_bytes (the step's arena), peak_rss_bytes.  --json prints one JSON object instead;\n"
    "  --print-gemms lists the GEMMs on stderr (`gemm M N K BATCH TA TB BETA`, bench/gemm_lib.c).\n";

typedef struct BenchArgs {
  const char *input;
  const char *defs_name[64];
  int64_t defs_value[64];
  int ndefs;
  int gas;
  bool ref; /* --target ref */
  const char *cuda; /* --target cuda[:sm_XX]: the target, else NULL */
  bool allow_tf32;  /* --allow-tf32 (CUDA f32 GEMMs) */
  int threads;
  int steps, warmup;
  uint64_t seed;
  bool json, no_cache;
  bool print_gemms; /* --print-gemms: the GEMM list to stderr */
} BenchArgs;

typedef struct Figures {
  double compile_ms, compile_warm_ms, step_ms_median, step_ms_min, gemm_floor_ms;
  int64_t kernels_per_step, gemms_per_step, peak_bytes, peak_rss_bytes;
} Figures;

/* A model compiled for the bench target. */
typedef struct Compiled {
  char *text;
  SrcFile src;
  FeModel *model;
  CpuProgram *prog; /* NULL on ref */
#ifdef GRADC_HAVE_CUDA
  CudaProgram *cuda; /* --target cuda */
#endif
} Compiled;

static int usage(const char *fmt, const char *arg) {
  fprintf(stderr, "gradc: error: ");
  fprintf(stderr, fmt, arg);
  fprintf(stderr, " (see gradc help bench)\n");
  return 1;
}

static bool parse_int(const char *s, int64_t lo, int64_t hi, int64_t *out) {
  int64_t v;
  if (!tools_parse_i64(s, &v) || v < lo || v > hi) return false;
  *out = v;
  return true;
}

static int parse_args(int argc, char **argv, BenchArgs *a) {
  memset(a, 0, sizeof *a);
  a->gas = 1;
  a->steps = 10;
  a->warmup = 2;
  for (int i = 1; i < argc; i++) {
    char *arg = argv[i];
    const char *v;
    bool missing = false;
    int64_t x;
    if (strcmp(arg, "-D") == 0 || (strncmp(arg, "-D", 2) == 0 && arg[2])) {
      const char *def = arg[2] ? arg + 2 : (i + 1 < argc ? argv[++i] : NULL);
      const char *eq = def ? strchr(def, '=') : NULL;
      if (!eq || eq == def || !parse_int(eq + 1, INT64_MIN, INT64_MAX, &x))
        return usage("-D expects NAME=INTEGER, got '%s'", def ? def : "");
      if (a->ndefs == 64) return usage("too many -D options%s", "");
      a->defs_name[a->ndefs] = strndup(def, (size_t)(eq - def));
      a->defs_value[a->ndefs++] = x;
    } else if ((v = tools_flag_value(argc, argv, &i, "--gas", &missing))) {
      if (!parse_int(v, 1, 1 << 20, &x)) return usage("--gas expects a positive integer, got '%s'", v);
      a->gas = (int)x;
    } else if ((v = tools_flag_value(argc, argv, &i, "--threads", &missing))) {
      if (!parse_int(v, 0, 4096, &x)) return usage("--threads expects a non-negative integer, got '%s'", v);
      a->threads = (int)x;
    } else if ((v = tools_flag_value(argc, argv, &i, "--steps", &missing))) {
      if (!parse_int(v, 1, 1000000, &x)) return usage("--steps expects a positive integer, got '%s'", v);
      a->steps = (int)x;
    } else if ((v = tools_flag_value(argc, argv, &i, "--warmup", &missing))) {
      if (!parse_int(v, 0, 1000000, &x)) return usage("--warmup expects a non-negative integer, got '%s'", v);
      a->warmup = (int)x;
    } else if ((v = tools_flag_value(argc, argv, &i, "--seed", &missing))) {
      if (!parse_int(v, 0, INT64_MAX, &x)) return usage("--seed expects a non-negative integer, got '%s'", v);
      a->seed = (uint64_t)x;
    } else if ((v = tools_flag_value(argc, argv, &i, "--target", &missing))) {
      char arch[32];
      if (strcmp(v, "ref") == 0) a->ref = true;
#ifdef GRADC_HAVE_CUDA
      else if (cg_cuda_parse_target(v, arch, sizeof arch)) a->cuda = v;
#endif
      else if (strcmp(v, "cpu") != 0) return usage("unsupported --target '%s' (bench has: cpu, ref, cuda)", v);
      (void)arch;
    } else if (strcmp(arg, "--allow-tf32") == 0) {
      a->allow_tf32 = true;
    } else if (strcmp(arg, "--json") == 0) {
      a->json = true;
    } else if (strcmp(arg, "--no-cache") == 0) {
      a->no_cache = true;
    } else if (strcmp(arg, "--print-gemms") == 0) {
      a->print_gemms = true;
    } else if (missing) {
      return usage("%s needs a value", arg);
    } else if (arg[0] == '-' && arg[1]) {
      return usage("unknown or incomplete option '%s'", arg);
    } else if (!a->input) {
      a->input = arg;
    } else {
      return usage("unexpected argument '%s'", arg);
    }
  }
  if (!a->input) return usage("bench needs a model file%s", "");
#ifdef GRADC_HAVE_CUDA
  char err[512];
  if (a->cuda && !cuda_device_available(err, sizeof err)) {
    fprintf(stderr, "gradc: error: %s\n", err);
    return 1;
  }
#endif
  return 0;
}

static void unload(Compiled *c) {
  cpu_program_free(c->prog);
#ifdef GRADC_HAVE_CUDA
  cuda_program_free(c->cuda);
#endif
  fe_model_free(c->model);
  free(c->text);
  memset(c, 0, sizeof *c);
}

/* Read, lower, run the target's pipeline and build the program; the
 * elapsed wall time goes to *ms.  Returns the exit status. */
static int compile(const BenchArgs *a, const char *cache, Diag *d, Compiled *c, double *ms) {
  memset(c, 0, sizeof *c);
  double t0 = rt_now_ms();
  const char *err;
  size_t len;
  c->text = read_file(a->input, &len, &err);
  if (!c->text) {
    diag_plain(d, DIAG_ERROR, "%s: %s", a->input, err);
    return 1;
  }
  c->src = (SrcFile){a->input, c->text, len};
  FeOptions fo = {.def_names = (const char **)a->defs_name, .def_values = a->defs_value, .ndefs = a->ndefs,
                  .gas = a->gas, .dp = 1};
  c->model = fe_model_compile(&c->src, &fo, d);
  if (!c->model) return 1;
  int n;
  const char *const *pipe = a->ref ? pass_pipeline(&n) : pass_pipeline_cpu(&n);
  PassManager pm;
  pm_init(&pm);
  PassOptions po = {.gas = a->gas, .diag = d, .src = &c->src};
#ifdef GRADC_HAVE_CUDA
  po.no_inplace = a->cuda != NULL;
#endif
  int rc = pm_run(&pm, c->model->func, pipe, n, &po);
  if (rc) return rc;
#ifdef GRADC_HAVE_CUDA
  if (a->cuda) {
    char msg[16384], arch[32];
    cg_cuda_parse_target(a->cuda, arch, sizeof arch);
    CudaOptions co = {arch, cache, a->threads, a->allow_tf32};
    c->cuda = cuda_program_new(c->model->func, &co, msg, sizeof msg);
    if (!c->cuda) {
      diag_plain(d, DIAG_ERROR, "%s: %s", a->input, msg);
      return 2;
    }
    *ms = rt_now_ms() - t0;
    return 0;
  }
#endif
  if (!a->ref) {
    char msg[1024];
    CpuOptions co = {.threads = a->threads, .cache_dir = cache};
    c->prog = cpu_program_new(c->model->func, &co, msg, sizeof msg);
    if (!c->prog) {
      /* The pipeline accepted the model, so this is the back end's failure. */
      diag_plain(d, DIAG_ERROR, "%s: %s", a->input, msg);
      return 2;
    }
  }
  *ms = rt_now_ms() - t0;
  return 0;
}

static int cmp_double(const void *x, const void *y) {
  double a = *(const double *)x, b = *(const double *)y;
  return (a > b) - (a < b);
}

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* Warm-up and timed windows; per-window times into ms[steps]. */
static int run_steps(const BenchArgs *a, Compiled *c, const StFile *params, const StFile *inputs, Diag *d,
                     double *ms) {
  InterpOptions io = {0};
  char err[1024];
  for (int s = -a->warmup; s < a->steps; s++) {
    StepResult r;
    double t0 = rt_now_ms();
    bool ok;
    if (c->prog) {
      cpu_program_set_params_gen(c->prog, 1); /* the same random params every window */
      cpu_program_skip_grads(c->prog);        /* only the losses are used: the gradients stay in the arena */
    }
#ifdef GRADC_HAVE_CUDA
    if (c->cuda)
      ok = cuda_step_run(c->cuda, a->gas, params, "random params", inputs, "random inputs", &r, err, sizeof err);
    else
#endif
      ok = a->ref ? step_run_ref(c->model->func, a->gas, params, "random params", inputs, "random inputs", &io, &r,
                                 err, sizeof err)
                  : cpu_step_run(c->prog, a->gas, params, "random params", inputs, "random inputs", &r, err,
                                 sizeof err);
    double t1 = rt_now_ms();
    if (!ok) {
      diag_plain(d, DIAG_ERROR, "%s", err);
      return 1;
    }
    for (int i = 0; i < r.nlosses; i++)
      if (!isfinite(r.losses[i]))
        fprintf(stderr, "gradc: warning: loss '%s' is %g on random inputs\n", r.loss_names[i], r.losses[i]);
    bool cpu = c->prog && !a->ref;
#ifdef GRADC_HAVE_CUDA
    cpu = cpu && !c->cuda;
#endif
    if (cpu)
      cpu_program_recycle(c->prog, &r); /* the next window reads its gradients into the same arrays */
    else
      step_result_free(&r);
    if (s >= 0) ms[s] = t1 - t0;
  }
  return 0;
}

/* One line per GEMM, as bench/gemm_lib.c reads them:
 * `gemm M N K BATCH TA TB BETA [f64]  # file:line:col` (the matmul's source). */
static void print_gemms(const RtGemm *g, int n) {
  for (int i = 0; i < n; i++) {
    fprintf(stderr, "gemm %lld %lld %lld %lld %c %c %d%s", (long long)g[i].M, (long long)g[i].N, (long long)g[i].K,
            (long long)g[i].nb, g[i].ta ? 'T' : 'N', g[i].tb ? 'T' : 'N', g[i].accumulate ? 1 : 0,
            g[i].dbl ? " f64" : "");
    if (g[i].op->loc.file)
      fprintf(stderr, "  # %s:%d:%d", g[i].op->loc.file, g[i].op->loc.line, g[i].op->loc.col);
    fputc('\n', stderr);
  }
}

static void count_launches(const IrFunc *f, int gas, bool ref, Figures *fig) {
  int64_t kernels = 0, gemms = 0;
  for (int i = 0; i < f->nops; i++) {
    const IrOp *op = f->ops[i];
    if (op->group > 0 && (i == 0 || f->ops[i - 1]->group != op->group)) kernels++;
    if (op->opcode == IR_OP_MATMUL && op->group == 0) gemms++;
  }
  fig->gemms_per_step = gemms * gas;
  fig->kernels_per_step = ref ? 0 : (kernels + gemms) * gas;
}

static double ms3(double x) { return round(x * 1000.0) / 1000.0; }

static void print_figures(const Figures *g, bool json) {
  if (json) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "compile_ms", ms3(g->compile_ms));
    cJSON_AddNumberToObject(o, "compile_warm_ms", ms3(g->compile_warm_ms));
    cJSON_AddNumberToObject(o, "step_ms_median", ms3(g->step_ms_median));
    cJSON_AddNumberToObject(o, "step_ms_min", ms3(g->step_ms_min));
    cJSON_AddNumberToObject(o, "gemm_floor_ms", ms3(g->gemm_floor_ms));
    cJSON_AddNumberToObject(o, "kernels_per_step", (double)g->kernels_per_step);
    cJSON_AddNumberToObject(o, "gemms_per_step", (double)g->gemms_per_step);
    cJSON_AddNumberToObject(o, "peak_bytes", (double)g->peak_bytes);
    cJSON_AddNumberToObject(o, "peak_rss_bytes", (double)g->peak_rss_bytes);
    char *s = cJSON_PrintUnformatted(o);
    if (!s) abort();
    printf("%s\n", s);
    cJSON_free(s);
    cJSON_Delete(o);
  } else {
    printf("compile_ms: %.3f\n", g->compile_ms);
    printf("compile_warm_ms: %.3f\n", g->compile_warm_ms);
    printf("step_ms_median: %.3f\n", g->step_ms_median);
    printf("step_ms_min: %.3f\n", g->step_ms_min);
    printf("gemm_floor_ms: %.3f\n", g->gemm_floor_ms);
    printf("kernels_per_step: %lld\n", (long long)g->kernels_per_step);
    printf("gemms_per_step: %lld\n", (long long)g->gemms_per_step);
    printf("peak_bytes: %lld\n", (long long)g->peak_bytes);
    printf("peak_rss_bytes: %lld\n", (long long)g->peak_rss_bytes);
  }
  fflush(stdout);
}

static int bench(const BenchArgs *a, Diag *d) {
  Figures fig = {0};
  Compiled c;
  /* Cold: no cache at all. */
  int rc = compile(a, NULL, d, &c, &fig.compile_ms);
  if (rc) {
    unload(&c);
    return rc;
  }
  /* Warm: fill the cache with an untimed compile, then time one that
   * finds its object code there.  The reference interpreter (and
   * --no-cache) has no cache: the warm figure is a second measurement. */
  char dir[4096];
  const char *cache = !a->ref && !a->no_cache && cache_dir(dir, sizeof dir) ? dir : NULL;
  double ignored;
  if (cache) {
    unload(&c);
    rc = compile(a, cache, d, &c, &ignored);
    if (rc) {
      unload(&c);
      return rc;
    }
  }
  unload(&c);
  rc = compile(a, cache, d, &c, &fig.compile_warm_ms);
  if (rc) {
    unload(&c);
    return rc;
  }

  const IrFunc *f = c.model->func;
  StFile params, inputs;
  st_init(&params);
  st_init(&inputs);
  /* Params from each param's `init` (as `gradc init`): realistic magnitudes. */
  rt_init_params(c.model->params, c.model->nparams, a->seed, &params);
  rt_random_inputs(f, a->gas, a->seed + 1, &inputs);
  double *ms = calloc((size_t)a->steps, sizeof(double));
  if (!ms) abort();
  rc = run_steps(a, &c, &params, &inputs, d, ms);
  if (!rc) {
    fig.step_ms_median = median(ms, a->steps);
    fig.step_ms_min = ms[0]; /* sorted by median */
    /* Before the floor, whose private buffers are no part of a step. */
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    fig.peak_rss_bytes = (int64_t)ru.ru_maxrss * 1024;

    RtGemm *g;
    int ng = rt_gemm_list(f, &g);
    if (a->print_gemms) print_gemms(g, ng);
    int reps = a->steps < 3 ? 3 : a->steps;
    double *fms = calloc((size_t)reps, sizeof(double));
    if (!fms) abort();
#ifdef GRADC_HAVE_CUDA
    char ferr[1024];
    if (c.cuda && !cuda_gemm_floor(c.cuda, a->gas, reps, fms, ferr, sizeof ferr)) {
      diag_plain(d, DIAG_ERROR, "%s", ferr);
      rc = 1;
    } else if (!c.cuda)
#endif
      rt_gemm_floor(g, ng, a->gas, a->threads, 1, reps, fms);
    fig.gemm_floor_ms = ng ? median(fms, reps) : 0;
    free(fms);
    rt_gemm_list_free(g, ng);

    count_launches(f, a->gas, a->ref, &fig);
    fig.peak_bytes = f->arena_size;
    if (!rc) print_figures(&fig, a->json);
  }
  free(ms);
  st_free(&params);
  st_free(&inputs);
  unload(&c);
  return rc;
}

int cmd_bench(int argc, char **argv) {
  BenchArgs a;
  int rc = parse_args(argc, argv, &a);
  if (!rc) {
    Diag d;
    diag_init(&d, stderr);
    rc = bench(&a, &d);
    diag_free(&d);
  }
  for (int i = 0; i < a.ndefs; i++) free((void *)a.defs_name[i]);
  return rc;
}
