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
 *   gemm_provider    the CPU's GEMM provider that ran the step and the
 *                    floor (onednn, openblas, blis; runtime/cpu/gemm.h),
 *                    after the contract's figures
 *   gemm_select_ms   the host's measurement that chooses it, which a
 *                    compile without a cache would make and a cached host
 *                    reads from the cache: made before the cold compile, so
 *                    that compile_ms times the compile alone (0 on cuda)
 *
 * Times are milliseconds per window, printed with %.3f.  --json prints the
 * same figures as one JSON object.  Nothing else goes to stdout.
 * --forward-only measures the forward alone, compiled as `gradc infer`
 * compiles it (no autodiff, no gradient buffers). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "api/cli.h"
#include "gradc.h"
#include "tools.h"

const char bench_help[] =
    "gradc bench MODEL.gdl [-D N=V]... [--gas K] [--target cpu|ref|cuda[:sm_XX]] [--allow-tf32]\n"
    "            [--precision f32|bf16|f16] [--threads N] [--steps N]\n"
    "            [--warmup N] [--seed S] [--no-cache] [--json] [--print-gemms] [--forward-only]\n"
    "  Compile a model and time forward+backward windows on random inputs and params (after\n"
    "  --warmup windows, default 2; --steps timed windows, default 10).  Prints `name: value`\n"
    "  lines, times in ms per window: compile_ms (cold, cache bypassed), compile_warm_ms (from\n"
    "  the object cache), step_ms_median, step_ms_min, gemm_floor_ms (the window's GEMMs alone,\n"
    "  same provider, threads and types; on the CPU timed in rounds between the steps'),\n"
    "  kernels_per_step (kernel and GEMM launches), gemms_per_step, peak_bytes (the step's\n"
    "  arena), peak_rss_bytes, gemm_provider (GRADC_GEMM=onednn|openblas|blis\n"
    "  overrides the host's measured choice), gemm_select_ms (that measurement, made once a host\n"
    "  and cached; bench makes it before the cold compile, which it leaves out).  --json prints\n"
    "  one JSON object instead; --print-gemms lists the GEMMs on stderr (`gemm M N K BATCH TA TB\n"
    "  BETA`, bench/gemm_lib.c).\n"
    "  --forward-only times the forward alone, compiled as infer compiles it (no autodiff, no\n"
    "  gradient buffers: compare its compile_ms and peak_bytes with the training step's).\n";

typedef struct BenchArgs {
  const char *input;
  Defines defs; /* -D */
  int gas;
  const char *target; /* --target: cpu (NULL), ref or cuda[:sm_XX] */
  bool ref;           /* --target ref */
  bool allow_tf32;  /* --allow-tf32 (CUDA f32 GEMMs) */
  const char *precision; /* --precision f32|bf16|f16 */
  int threads;
  int steps, warmup;
  uint64_t seed;
  bool json, no_cache;
  bool print_gemms; /* --print-gemms: the GEMM list to stderr */
  bool forward_only; /* --forward-only: the forward alone (gradc_compile_options.forward_only) */
} BenchArgs;

typedef struct Figures {
  double compile_ms, compile_warm_ms;
  double gemm_select_ms; /* the host's GEMM provider measurement, apart from compile_ms */
  cli_bench_figures run; /* the rest, measured through api/cli.h */
} Figures;

static bool is_target(const char *v) { return strcmp(v, "cpu") == 0 || strcmp(v, "ref") == 0 || cli_is_cuda_target(v); }

static int parse_args(int argc, char **argv, BenchArgs *a) {
  memset(a, 0, sizeof *a);
  a->gas = 1;
  a->steps = 10;
  a->warmup = 2;
  const Flag flags[] = {
      {"--gas", FLAG_INT, &a->gas, NULL, 1, 1 << 20, .expects = "a positive integer"},
      {"--threads", FLAG_INT, &a->threads, NULL, 0, 4096, .expects = "a non-negative integer"},
      {"--steps", FLAG_INT, &a->steps, NULL, 1, 1000000, .expects = "a positive integer"},
      {"--warmup", FLAG_INT, &a->warmup, NULL, 0, 1000000, .expects = "a non-negative integer"},
      {"--seed", FLAG_U64, &a->seed, NULL, 0, (double)INT64_MAX, .expects = "a non-negative integer"},
      {"--target", FLAG_STRING, .dst = &a->target, .valid = is_target,
       .invalid = "unsupported --target '%s' (bench has: cpu, ref, cuda)"},
      {"--allow-tf32", FLAG_BOOL, .dst = &a->allow_tf32},
      {"--precision", FLAG_STRING, .dst = &a->precision, .valid = tools_is_precision,
       .invalid = "--precision expects f32, bf16 or f16, got '%s'"},
      {"--json", FLAG_BOOL, .dst = &a->json},
      {"--no-cache", FLAG_BOOL, .dst = &a->no_cache},
      {"--print-gemms", FLAG_BOOL, .dst = &a->print_gemms},
      {"--forward-only", FLAG_BOOL, .dst = &a->forward_only},
  };
  int npos = 0;
  FlagSpec spec = {flags, (int)(sizeof flags / sizeof *flags), " (see gradc help bench)", .see_values = true,
                   .see_missing = true, .defines = &a->defs, .positional = &a->input, .max_positional = 1,
                   .npositional = &npos};
  int rc = flags_parse(&spec, argc, argv, 1);
  if (rc) return rc;
  a->ref = a->target && strcmp(a->target, "ref") == 0;
  if (a->target && strcmp(a->target, "cpu") == 0) a->target = NULL;
  if (!a->input) {
    fprintf(stderr, "gradc: error: bench needs a model file (see gradc help bench)\n");
    return 1;
  }
  if (cli_is_cuda_target(a->target) && cli_need_device()) return 1;
  return 0;
}

/* Read, lower, run the target's pipeline and build the program, with the
 * object cache or without; the elapsed wall time goes to *ms. */
static int compile(const BenchArgs *a, bool cached, gradc_program **p, double *ms) {
  gradc_compile_options o;
  gradc_compile_options_init(&o);
  o.gas = a->gas;
  if (a->target) o.target = a->target;
  o.threads = a->threads;
  o.no_cache = !cached;
  o.forward_only = a->forward_only;
  /* A training step is timed for its losses (run_steps): the outputs'
   * copy into the result is not part of it; a forward-only one keeps
   * them, inference's product. */
  o.no_outputs = !a->forward_only;
  o.precision = a->precision;
  o.def_names = a->defs.name;
  o.def_values = a->defs.value;
  o.ndefs = a->defs.n;
  double t0 = tools_now_ms();
  gradc_status st = gradc_program_compile_file(a->input, &o, p);
  if (st) return cli_report(st);
  *ms = tools_now_ms() - t0;
  return 0;
}

static double ms3(double x) { return round(x * 1000.0) / 1000.0; }

static void print_figures(const Figures *f, bool json) {
  const cli_bench_figures *g = &f->run;
  if (json) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "compile_ms", ms3(f->compile_ms));
    cJSON_AddNumberToObject(o, "compile_warm_ms", ms3(f->compile_warm_ms));
    cJSON_AddNumberToObject(o, "step_ms_median", ms3(g->step_ms_median));
    cJSON_AddNumberToObject(o, "step_ms_min", ms3(g->step_ms_min));
    cJSON_AddNumberToObject(o, "gemm_floor_ms", ms3(g->gemm_floor_ms));
    cJSON_AddNumberToObject(o, "kernels_per_step", (double)g->kernels_per_step);
    cJSON_AddNumberToObject(o, "gemms_per_step", (double)g->gemms_per_step);
    cJSON_AddNumberToObject(o, "peak_bytes", (double)g->peak_bytes);
    cJSON_AddNumberToObject(o, "peak_rss_bytes", (double)g->peak_rss_bytes);
    cJSON_AddStringToObject(o, "gemm_provider", g->gemm_provider ? g->gemm_provider : "");
    cJSON_AddNumberToObject(o, "gemm_select_ms", ms3(f->gemm_select_ms));
    char *s = cJSON_PrintUnformatted(o);
    if (!s) abort();
    printf("%s\n", s);
    cJSON_free(s);
    cJSON_Delete(o);
  } else {
    printf("compile_ms: %.3f\n", f->compile_ms);
    printf("compile_warm_ms: %.3f\n", f->compile_warm_ms);
    printf("step_ms_median: %.3f\n", g->step_ms_median);
    printf("step_ms_min: %.3f\n", g->step_ms_min);
    printf("gemm_floor_ms: %.3f\n", g->gemm_floor_ms);
    printf("kernels_per_step: %lld\n", (long long)g->kernels_per_step);
    printf("gemms_per_step: %lld\n", (long long)g->gemms_per_step);
    printf("peak_bytes: %lld\n", (long long)g->peak_bytes);
    printf("peak_rss_bytes: %lld\n", (long long)g->peak_rss_bytes);
    printf("gemm_provider: %s\n", g->gemm_provider ? g->gemm_provider : "");
    printf("gemm_select_ms: %.3f\n", f->gemm_select_ms);
  }
  fflush(stdout);
}

static int bench(const BenchArgs *a) {
  Figures fig = {0};
  gradc_program *p = NULL;
  /* Cold: no object cache.  The host's GEMM provider choice, which a
   * compile without a cache measures (once a process) and a user's
   * compile reads from the cache after the host's first, is made first
   * and reported apart. */
  if (!cli_is_cuda_target(a->target)) fig.gemm_select_ms = cli_gemm_select_ms();
  int rc = compile(a, false, &p, &fig.compile_ms);
  if (rc) return rc;
  gradc_program_free(p);
  /* Warm: fill the cache with an untimed compile, then time one that
   * finds its object code there.  The reference interpreter (and
   * --no-cache) has no cache: the warm figure is a second measurement. */
  char dir[4096];
  bool cached = !a->ref && !a->no_cache && cache_dir(dir, sizeof dir);
  double ignored;
  if (cached) {
    if ((rc = compile(a, true, &p, &ignored))) return rc;
    gradc_program_free(p);
  }
  if ((rc = compile(a, cached, &p, &fig.compile_warm_ms))) return rc;
  rc = cli_bench(p, a->warmup, a->steps, a->seed, a->threads, a->allow_tf32, a->print_gemms, &fig.run);
  if (!rc) print_figures(&fig, a->json);
  gradc_program_free(p);
  return rc;
}

int cmd_bench(int argc, char **argv) {
  BenchArgs a;
  int rc = parse_args(argc, argv, &a);
  if (!rc) rc = bench(&a);
  defines_free(&a.defs);
  return rc;
}
