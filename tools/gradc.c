/* gradc.c - the command line (DESIGN.md §5).
 *
 *   gradc check   MODEL.gdl
 *   gradc compile MODEL.gdl [-D N=V]... [--gas K] [-o ARTIFACT] [--print-ir-after=P|all] ...
 *   gradc opt     FILE.gir --passes=P1,P2,...
 *   gradc init    MODEL.gdl -o PARAMS.safetensors [--seed S]
 *   gradc run     MODEL.gdl --params P --inputs I [--gas K] [--grads-out G] [--dp N]
 *   gradc data random MODEL.gdl -o BATCH.safetensors [--seed S] [--gas K]
 *   gradc data text   FILE... -T N -o DATA.safetensors      (tools/train.c)
 *   gradc train       MODEL.gdl|ARTIFACT --data DATA ...     (tools/train.c)
 *
 * stdout carries only run's loss lines and IR printed by opt (or compile
 * without -o); everything else goes to stderr.  Exit status: 0 success,
 * 1 user error, 2 internal error. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "frontend/frontend.h"
#include "ir/ir.h"
#include "passes/passes.h"
#include "api/api_impl.h"
#include "runtime/comm/comm.h"
#include "runtime/runtime.h"
#include "runtime/comm/trace.h"
#include "bench.h"
#include "tools.h"
#ifdef GRADC_HAVE_CUDA
#include "runtime/cuda/cuda.h"
#endif

typedef struct Args {
  const char *cmd;
  const char *input;  /* MODEL.gdl or FILE.gir */
  const char *output; /* -o */
  const char *defs_name[64];
  int64_t defs_value[64];
  int ndefs;
  int gas;
  bool gas_set; /* --gas was given (an artifact fixes K) */
  int dp;
  bool dp_set; /* --dp was given (an artifact fixes it) */
  int tp;
  bool tp_set; /* --tp was given (an artifact fixes it) */
  bool sequence_parallel;   /* --sequence-parallel */
  bool no_overlap;          /* --no-overlap */
  int64_t bucket_bytes;     /* --bucket-mb X */
  const char *trace;        /* --trace FILE.json */
  double link_latency_us;   /* --link-latency-us X (a simulated slow link) */
  double link_gbps;         /* --link-gbps X */
  bool cost_report;         /* --cost-report: the schedule's simulated step on stderr */
  bool zero1;               /* --zero1 */
  const char *target;
  const char *passes;
  const char *print_before, *print_after;
  const char *dot;
  bool time_passes;
  bool verify;
  int threads;   /* --threads N, 0 = one per core */
  int no_cache;  /* --no-cache */
  bool print_kernels;      /* --print-kernels: the CUDA kernels' source to stderr */
  const char *kernels_dir; /* --kernels-dir DIR: one .cu file per kernel */
  bool allow_tf32;         /* --allow-tf32: f32 GEMMs on CUDA may use TF32 */
  const char *params, *inputs, *grads_out;
  uint64_t seed;
} Args;

static Diag diag;

static int usage_error(const char *fmt, const char *arg) {
  fprintf(stderr, "gradc: error: ");
  fprintf(stderr, fmt, arg);
  fprintf(stderr, " (see gradc help)\n");
  return 1;
}

static const char *help_text[][2] = {
    {"check", "gradc check MODEL.gdl [-D N=V]...\n"
              "  Parse, type- and shape-check a model.  Prints nothing on success.\n"},
    {"compile", "gradc compile MODEL.gdl [-D N=V]... [--gas K] [--target cpu|ref|cuda[:sm_XX]]\n"
                "              [-o ARTIFACT] [--print-ir-after=PASS|all] [--print-ir-before=PASS|all]\n"
                "              [--dot FILE.dot] [--time-passes] [--verify] [--threads N] [--no-cache] [--dp N]\n"
                "              [--tp T] [--sequence-parallel] [--no-overlap] [--bucket-mb X] [--cost-report]\n"
                "              [--link-latency-us X] [--link-gbps X]\n"
                "              [--print-kernels] [--kernels-dir DIR]\n"
                "  Lower, differentiate and optimise a model for the target (cpu: fused kernels compiled\n"
                "  with LLVM; ref: the reference interpreter; cuda: CUDA C kernels compiled with NVRTC for\n"
                "  sm_XX, by default the present GPU's, else sm_80; no GPU is needed to compile).  Without\n"
                "  -o the final IR goes to stdout; -o writes an artifact that run and train load without\n"
                "  compiling.  --print-kernels writes the CUDA source to stderr, --kernels-dir one .cu file\n"
                "  per kernel.  --tp/--dp/--sequence-parallel/--no-overlap/--bucket-mb compile for a\n"
                "  distributed run (see gradc help run and docs/DISTRIBUTED.md); --cost-report prints the\n"
                "  schedule pass's cost-model simulation of one step (compute, communication, exposed\n"
                "  communication with and without overlap) for the link the --link-* flags describe.\n"},
    {"opt", "gradc opt FILE.gir --passes=P1,P2,... [--gas K] [--print-ir-after=..] [--verify]\n"
            "  Read IR text, run passes, print IR text to stdout.\n"},
    {"init", "gradc init MODEL.gdl -o PARAMS.safetensors [--seed S] [-D N=V]...\n"
             "  Write initial params (each param's `init`) as safetensors.\n"},
    {"data", "gradc data random MODEL.gdl -o BATCH.safetensors [--seed S] [-D N=V]...\n"
             "  Write one window of random inputs: floats ~ N(0,1), integers in [0, the size of the\n"
             "  axis they index).\n"},
    {"data", data_text_help},
    {"run", "gradc run MODEL.gdl|ARTIFACT [-D N=V]... [--gas K] [--target cpu|ref|cuda[:sm_XX]] [--threads N]\n"
            "          [--dp N] [--tp T] [--sequence-parallel] [--no-overlap] [--bucket-mb X] [--allow-tf32]\n"
            "          [--trace FILE.json] [--link-latency-us X] [--link-gbps X]\n"
            "          --params PARAMS.safetensors --inputs BATCH.safetensors [--grads-out GRADS.safetensors]\n"
            "  Compute one window of K micro-batches: prints `loss NAME VALUE` per loss and `loss total`,\n"
            "  writes one gradient per param.  --dp N runs it on N data-parallel processes\n"
            "  (mpirun -np N gradc run ... --dp N): each takes B/N samples of the window, and rank 0\n"
            "  prints the losses and writes the gradients of the whole window.  --tp T shards the params\n"
            "  annotated split(N) over T processes (Megatron-style tensor parallelism; with\n"
            "  --sequence-parallel activations between the parallel regions are sharded along the\n"
            "  sequence); the run is T x N processes.  Gradients are reduced in buckets of --bucket-mb\n"
            "  (default 1) while the backward runs; --no-overlap waits for each collective at once.\n"
            "  --trace writes a Chrome trace (Perfetto) of kernels and collectives per rank and reports\n"
            "  the exposed communication; --link-latency-us and --link-gbps simulate a slow link.\n"},
    {"train", train_help},
    {"bench", bench_help},
};

static void print_help(const char *cmd) {
  int n = (int)(sizeof help_text / sizeof help_text[0]);
  if (cmd) {
    bool found = false; /* a command may have several entries (data random, data text) */
    for (int i = 0; i < n; i++)
      if (strcmp(help_text[i][0], cmd) == 0) {
        fputs(help_text[i][1], stdout);
        if (strcmp(cmd, "opt") == 0 || strcmp(cmd, "compile") == 0) {
          int np;
          const Pass *ps = pass_list(&np);
          printf("  Passes:\n");
          for (int j = 0; j < np; j++) printf("    %-10s %s\n", ps[j].name, ps[j].what);
        }
        found = true;
      }
    if (found) return;
  }
  printf("gradc %s - a graph compiler for training\n\nCommands:\n", GRADC_VERSION);
  for (int i = 0; i < n; i++) printf("%s", help_text[i][1]);
  printf("\nCommon options: -D NAME=VALUE overrides a dim; --gas K runs K micro-batches per window.\n");
  printf("gradc help CMD shows one command; gradc --version prints the version.\n");
}

/* A --print-ir-* value: "all" or pass names separated by commas. */
static bool check_pass_list(const char *flag, const char *list) {
  if (!list || strcmp(list, "all") == 0) return true;
  char *copy = strdup(list);
  bool ok = true;
  for (char *save = NULL, *p = strtok_r(copy, ",", &save); p && ok; p = strtok_r(NULL, ",", &save))
    if (!pass_lookup(p)) {
      fprintf(stderr, "gradc: error: %s: no pass named '%s' (see gradc help compile)\n", flag, p);
      ok = false;
    }
  free(copy);
  return ok;
}

/* Repeated --print-ir-* flags accumulate into one comma-separated list. */
static const char *join_list(const char *old, const char *add) {
  if (!old) return add;
  static char buf[4][1024];
  static int k;
  char *b = buf[k++ % 4];
  snprintf(b, sizeof buf[0], "%s,%s", old, add);
  return b;
}

#ifdef GRADC_HAVE_CUDA
#define CUDA_TARGETS ", cuda, cuda:sm_XX"
#else
#define CUDA_TARGETS ""
#endif

/* Running on CUDA needs a device ("gradc: error: no CUDA device"). */
static int need_device(void) {
#ifdef GRADC_HAVE_CUDA
  char err[512];
  if (!cuda_device_available(err, sizeof err)) {
    diag_plain(&diag, DIAG_ERROR, "%s", err);
    return 1;
  }
#endif
  return 0;
}

static int parse_args(int argc, char **argv, Args *a) {
  memset(a, 0, sizeof *a);
  a->gas = 1;
  a->dp = 1;
  a->tp = 1;
  a->cmd = argv[1];
  for (int i = 2; i < argc; i++) {
    const char *v;
    char *arg = argv[i];
#define FLAG(name) (strncmp(arg, name, strlen(name)) == 0 && (v = tools_flag_value(argc, argv, &i, name, NULL)) != NULL)
    if (strcmp(arg, "-D") == 0 || (strncmp(arg, "-D", 2) == 0 && arg[2])) {
      const char *def = arg[2] ? arg + 2 : (i + 1 < argc ? argv[++i] : NULL);
      const char *eq = def ? strchr(def, '=') : NULL;
      int64_t val;
      if (!eq || eq == def || !tools_parse_i64(eq + 1, &val)) return usage_error("-D expects NAME=INTEGER, got '%s'", def ? def : "");
      if (a->ndefs == 64) return usage_error("too many -D options%s", "");
      a->defs_name[a->ndefs] = strndup(def, (size_t)(eq - def));
      a->defs_value[a->ndefs++] = val;
    } else if (strcmp(arg, "-o") == 0) {
      if (i + 1 >= argc) return usage_error("%s needs a file name", arg);
      a->output = argv[++i];
    } else if (FLAG("--gas")) {
      int64_t k;
      if (!tools_parse_i64(v, &k) || k < 1 || k > 1 << 20) return usage_error("--gas expects a positive integer, got '%s'", v);
      a->gas = (int)k;
      a->gas_set = true;
    } else if (FLAG("--dp")) {
      int64_t k;
      if (!tools_parse_i64(v, &k) || k < 1 || k > 1 << 20) return usage_error("--dp expects a positive integer, got '%s'", v);
      a->dp = (int)k;
      a->dp_set = true;
    } else if (FLAG("--tp")) {
      int64_t k;
      if (!tools_parse_i64(v, &k) || k < 1 || k > 1 << 20) return usage_error("--tp expects a positive integer, got '%s'", v);
      a->tp = (int)k;
      a->tp_set = true;
    } else if (strcmp(arg, "--sequence-parallel") == 0) {
      a->sequence_parallel = true;
    } else if (strcmp(arg, "--no-overlap") == 0) {
      a->no_overlap = true;
    } else if (strcmp(arg, "--zero1") == 0) {
      a->zero1 = true;
    } else if (strcmp(arg, "--cost-report") == 0) {
      a->cost_report = true;
    } else if (FLAG("--bucket-mb")) {
      double mb;
      if (!tools_parse_f64(v, &mb) || !(mb > 0) || mb > 1 << 20)
        return usage_error("--bucket-mb expects a positive size in MiB, got '%s'", v);
      a->bucket_bytes = (int64_t)(mb * (1 << 20));
      if (a->bucket_bytes < 1) a->bucket_bytes = 1;
    } else if (FLAG("--trace")) {
      a->trace = v;
    } else if (FLAG("--link-latency-us")) {
      if (!tools_parse_f64(v, &a->link_latency_us) || !(a->link_latency_us >= 0))
        return usage_error("--link-latency-us expects a non-negative number, got '%s'", v);
    } else if (FLAG("--link-gbps")) {
      if (!tools_parse_f64(v, &a->link_gbps) || !(a->link_gbps > 0))
        return usage_error("--link-gbps expects a positive number, got '%s'", v);
    } else if (FLAG("--seed")) {
      int64_t s;
      if (!tools_parse_i64(v, &s) || s < 0) return usage_error("--seed expects a non-negative integer, got '%s'", v);
      a->seed = (uint64_t)s;
    } else if (FLAG("--target")) {
      a->target = v;
    } else if (FLAG("--passes")) {
      a->passes = v;
    } else if (FLAG("--print-ir-after")) {
      a->print_after = join_list(a->print_after, v);
    } else if (FLAG("--print-ir-before")) {
      a->print_before = join_list(a->print_before, v);
    } else if (FLAG("--dot")) {
      a->dot = v;
    } else if (FLAG("--params")) {
      a->params = v;
    } else if (FLAG("--inputs")) {
      a->inputs = v;
    } else if (FLAG("--grads-out")) {
      a->grads_out = v;
    } else if (FLAG("--threads")) {
      int64_t t;
      if (!tools_parse_i64(v, &t) || t < 0 || t > 1024) return usage_error("--threads expects a count, got '%s'", v);
      a->threads = (int)t;
    } else if (strcmp(arg, "--no-cache") == 0) {
      a->no_cache = 1;
    } else if (strcmp(arg, "--print-kernels") == 0) {
      a->print_kernels = true;
    } else if (FLAG("--kernels-dir")) {
      a->kernels_dir = v;
    } else if (strcmp(arg, "--allow-tf32") == 0) {
      a->allow_tf32 = true;
    } else if (strcmp(arg, "--time-passes") == 0) {
      a->time_passes = true;
    } else if (strcmp(arg, "--verify") == 0) {
      a->verify = true;
    } else if (arg[0] == '-' && arg[1]) {
      return usage_error("unknown or incomplete option '%s'", arg);
    } else if (!a->input) {
      a->input = arg;
    } else {
      return usage_error("unexpected argument '%s'", arg);
    }
#undef FLAG
  }
  if (a->target && strcmp(a->target, "cpu") != 0 && strcmp(a->target, "ref") != 0 && !tools_cuda_target(a->target))
    return usage_error("unsupported --target '%s' (this build has: cpu, ref" CUDA_TARGETS ")", a->target);
  if (!check_pass_list("--print-ir-after", a->print_after) || !check_pass_list("--print-ir-before", a->print_before))
    return 1;
  return 0;
}

/* ---- loading ---- */

typedef struct Loaded {
  SrcFile src;
  char *text;
  FeModel *model;
} Loaded;

static int load_model(const Args *a, Loaded *l) {
  memset(l, 0, sizeof *l);
  if (!a->input) return usage_error("%s needs a model file", a->cmd);
  const char *err;
  size_t len;
  l->text = read_file(a->input, &len, &err);
  if (!l->text) {
    diag_plain(&diag, DIAG_ERROR, "%s: %s", a->input, err);
    return 1;
  }
  l->src = (SrcFile){a->input, l->text, len};
  FeOptions fo = {.def_names = (const char **)a->defs_name, .def_values = a->defs_value, .ndefs = a->ndefs, .gas = a->gas, .dp = a->dp};
  l->model = fe_model_compile(&l->src, &fo, &diag);
  return l->model ? 0 : 1;
}

static void unload(Loaded *l) {
  fe_model_free(l->model);
  free(l->text);
}

static int run_pipeline(const Args *a, IrFunc *f, const SrcFile *src, const char *const *names, int n) {
  PassManager pm;
  pm_init(&pm);
  pm.print_after = a->print_after;
  pm.print_before = a->print_before;
  pm.time_passes = a->time_passes;
  if (a->verify) pm.verify = true;
  PassOptions po = {.gas = a->gas,
                    .diag = &diag,
                    .src = src,
                    .tp = a->tp,
                    .dp = a->dp,
                    .sequence_parallel = a->sequence_parallel,
                    .no_overlap = a->no_overlap,
                    .bucket_bytes = a->bucket_bytes,
                    .zero1 = a->zero1};
  return pm_run(&pm, f, names, n, &po);
}

static int write_dot(const char *path, const IrFunc *f) {
  FILE *out = fopen(path, "w");
  if (!out) {
    diag_plain(&diag, DIAG_ERROR, "%s: %s", path, strerror(errno));
    return 1;
  }
  ir_write_dot(f, out);
  if (fclose(out) != 0) {
    diag_plain(&diag, DIAG_ERROR, "%s: %s", path, strerror(errno));
    return 1;
  }
  return 0;
}

/* ---- commands ---- */

static int cmd_check(const Args *a) {
  Loaded l;
  int rc = load_model(a, &l);
  unload(&l);
  return rc;
}

/* Compile a.input (a .gdl model) for a.target, or load it (an artifact,
 * whose sizes, K and target are fixed: a conflicting flag is an error). */
static int open_program(const Args *a, gradc_program **out) {
  *out = NULL;
  if (!a->input) return usage_error("%s needs a model file or an artifact", a->cmd);
  if (tools_is_artifact(a->input)) {
    gradc_status st = gradc_program_load(a->input, out);
    if (st) return tools_api_error(st);
    const gradc_program *p = *out;
    const char *why = NULL;
    char buf[256];
    if (a->ndefs) why = "its sizes are fixed (no -D)";
    else if (a->gas_set && a->gas != p->gas) why = (snprintf(buf, sizeof buf, "it was built with --gas %d", p->gas), buf);
    else if (a->dp_set && a->dp != p->dp) why = (snprintf(buf, sizeof buf, "it was built with --dp %d", p->dp), buf);
    else if (a->tp_set && a->tp != p->tp) why = (snprintf(buf, sizeof buf, "it was built with --tp %d", p->tp), buf);
    else if (a->target && strcmp(a->target, p->target) != 0)
      why = (snprintf(buf, sizeof buf, "it was built for --target %s", p->target), buf);
    if (why) {
      diag_plain(&diag, DIAG_ERROR, "%s: %s", a->input, why);
      gradc_program_free(*out);
      *out = NULL;
      return 1;
    }
    return 0;
  }
  const char *err;
  size_t len;
  char *text = read_file(a->input, &len, &err);
  if (!text) {
    diag_plain(&diag, DIAG_ERROR, "%s: %s", a->input, err);
    return 1;
  }
  gradc_compile_options o;
  gradc_compile_options_init(&o);
  o.gas = a->gas;
  o.target = a->target ? a->target : "cpu";
  o.threads = a->threads;
  o.no_cache = a->no_cache;
  o.dp = a->dp;
  o.tp = a->tp;
  o.sequence_parallel = a->sequence_parallel;
  o.no_overlap = a->no_overlap;
  o.bucket_bytes = a->bucket_bytes;
  o.zero1 = a->zero1;
  o.def_names = (const char *const *)a->defs_name;
  o.def_values = a->defs_value;
  o.ndefs = a->ndefs;
  PassManager pm;
  pm_init(&pm);
  pm.print_after = a->print_after;
  pm.print_before = a->print_before;
  pm.time_passes = a->time_passes;
  if (a->verify) pm.verify = true;
  gradc_status st = api_program_compile(a->input, text, &o, &pm, out);
  free(text);
  return st ? tools_api_error(st) : 0;
}

/* --print-kernels and --kernels-dir: the CUDA target's kernels. */
static int write_kernels(const Args *a, const gradc_program *p) {
#ifdef GRADC_HAVE_CUDA
  if (api_cuda_program(p)) {
    const CuModule *m = cuda_program_module(api_cuda_program(p));
    if (a->print_kernels) {
      StrBuf sb;
      sb_init(&sb);
      cg_cuda_print(m, &sb);
      fputs(sb_str(&sb), stderr);
      sb_free(&sb);
    }
    char err[1024];
    if (a->kernels_dir && !cg_cuda_write_dir(m, a->kernels_dir, err, sizeof err)) {
      diag_plain(&diag, DIAG_ERROR, "%s", err);
      return 1;
    }
    return 0;
  }
#endif
  (void)p;
  diag_plain(&diag, DIAG_ERROR, "%s shows CUDA kernels: compile with --target cuda or cuda:sm_XX",
             a->print_kernels ? "--print-kernels" : "--kernels-dir");
  return 1;
}

static int cmd_compile(const Args *a) {
  gradc_program *p;
  int rc = open_program(a, &p);
  if (rc) return rc;
  if (a->print_kernels || a->kernels_dir) rc = write_kernels(a, p);
  if (a->dot && !rc) rc = write_dot(a->dot, p->func);
  if (a->cost_report && !rc) {
    /* The cost model's defaults, with the link the flags describe. */
    CostModel m;
    cost_model_default(&m);
    if (a->link_gbps > 0) m.link_bytes_per_s = a->link_gbps * 1e9 / 8;
    if (a->link_latency_us > 0) m.link_latency_s = a->link_latency_us * 1e-6;
    cost_report(p->func, &m, stderr);
  }
  if (!rc) {
    if (a->output) {
      gradc_status st = gradc_program_save(p, a->output);
      if (st) rc = tools_api_error(st);
    } else {
      ir_print_file(p->func, stdout);
    }
  }
  gradc_program_free(p);
  return rc;
}

static int cmd_opt(const Args *a) {
  if (!a->input) return usage_error("%s needs an IR file", "opt");
  if (!a->passes) return usage_error("opt needs --passes=P1,P2,...%s", "");
  const char *names[64];
  int n = 0;
  char *list = strdup(a->passes);
  for (char *save = NULL, *p = strtok_r(list, ",", &save); p; p = strtok_r(NULL, ",", &save)) {
    if (!pass_lookup(p)) {
      int rc = usage_error("no pass named '%s'", p);
      free(list);
      return rc;
    }
    if (n < 64) names[n++] = p;
  }
  const char *err;
  size_t len;
  char *text = read_file(a->input, &len, &err);
  if (!text) {
    diag_plain(&diag, DIAG_ERROR, "%s: %s", a->input, err);
    free(list);
    return 1;
  }
  SrcFile src = {a->input, text, len};
  IrFunc *f = ir_read(&src, &diag);
  int rc = 1;
  if (f) {
    rc = run_pipeline(a, f, &src, names, n);
    if (!rc && a->dot) rc = write_dot(a->dot, f);
    if (!rc) ir_print_file(f, stdout);
  }
  ir_func_free(f);
  free(text);
  free(list);
  return rc;
}

static int cmd_init(const Args *a) {
  if (!a->output) return usage_error("init needs -o PARAMS.safetensors%s", "");
  Loaded l;
  int rc = load_model(a, &l);
  if (rc) {
    unload(&l);
    return rc;
  }
  StFile st;
  st_init(&st);
  rt_init_params(l.model->params, l.model->nparams, a->seed, &st);
  char err[1024];
  if (!st_write(a->output, &st, err, sizeof err)) {
    diag_plain(&diag, DIAG_ERROR, "%s", err);
    rc = 1;
  }
  st_free(&st);
  unload(&l);
  return rc;
}

static int cmd_data(const Args *a) {
  Loaded l;
  if (!a->output) return usage_error("data random needs -o BATCH.safetensors%s", "");
  int rc = load_model(a, &l);
  if (rc) {
    unload(&l);
    return rc;
  }
  StFile st;
  st_init(&st);
  /* The frontend compiled shapes for one micro-batch of K; write a window. */
  rt_random_inputs(l.model->func, a->gas * a->dp, a->seed, &st); /* the window of every --dp rank */
  char err[1024];
  if (!st_write(a->output, &st, err, sizeof err)) {
    diag_plain(&diag, DIAG_ERROR, "%s", err);
    rc = 1;
  }
  st_free(&st);
  unload(&l);
  return rc;
}

static int write_grads(const char *path, const StepResult *r) {
  StFile st;
  st_init(&st);
  for (int i = 0; i < r->ngrads; i++) {
    const IrType *t = &r->grad_types[i];
    int64_t n = ir_numel(&t->shape);
    if (t->dtype == IR_DT_F64) {
      st_add(&st, r->grad_names[i], ST_F64, t->shape.rank, t->shape.dim, r->grads[i]);
    } else {
      float *buf = malloc(sizeof(float) * (size_t)(n ? n : 1));
      if (!buf) abort();
      for (int64_t j = 0; j < n; j++) buf[j] = (float)r->grads[i][j];
      st_add(&st, r->grad_names[i], ST_F32, t->shape.rank, t->shape.dim, buf);
      free(buf);
    }
  }
  char err[1024];
  int rc = 0;
  if (!st_write(path, &st, err, sizeof err)) {
    diag_plain(&diag, DIAG_ERROR, "%s", err);
    rc = 1;
  }
  st_free(&st);
  return rc;
}

/* --trace: every rank's events into the file rank 0 writes, and rank 0's
 * figures on stderr (collective in a distributed run). */
static int write_trace(const char *path, const gradc_program *p, Trace *t) {
  char err[1024];
  if (p->comm && !comm_trace_gather(&p->comm->world, t, err, sizeof err)) {
    diag_plain(&diag, DIAG_ERROR, "%s", err);
    return 1;
  }
  if (api_program_rank(p) != 0) return 0;
  if (!trace_write(t, path, err, sizeof err)) {
    diag_plain(&diag, DIAG_ERROR, "%s", err);
    return 1;
  }
  TraceStats st;
  trace_stats(t, &st);
  fprintf(stderr, "trace: %s: rank 0: compute %.3f ms, %lld collectives in flight %.3f ms, exposed %.3f ms", path,
          st.compute_us / 1000, (long long)st.collectives, st.comm_us / 1000, st.exposed_us / 1000);
  if (st.comm_us > 0) fprintf(stderr, " (%.1f%% hidden)", 100.0 * (1.0 - st.exposed_us / st.comm_us));
  fputc('\n', stderr);
  return 0;
}

static int cmd_run(const Args *a) {
  if (!a->params) return usage_error("run needs --params PARAMS.safetensors%s", "");
  if (!a->inputs) return usage_error("run needs --inputs BATCH.safetensors%s", "");
  if (tools_cuda_target(a->target) && need_device()) return 1;
  gradc_program *p;
  int rc = open_program(a, &p);
  if (rc) return rc;
#ifdef GRADC_HAVE_CUDA
  if (api_cuda_program(p)) cuda_program_allow_tf32(api_cuda_program(p), a->allow_tf32);
#endif
  /* mpirun -np N needs --tp T --dp D with T*D = N (else every rank would compute the whole window). */
  int launched = comm_launch_size(), ranks = p->dp * p->tp;
  if (launched > 1 && ranks != launched) {
    if (p->tp == 1)
      diag_plain(&diag, DIAG_ERROR, "this run has %d ranks (mpirun -np %d) but %s; pass --dp %d", launched, launched,
                 p->dp == 1 ? "no --dp" : "a different --dp", launched);
    else
      diag_plain(&diag, DIAG_ERROR, "this run has %d ranks (mpirun -np %d) but --tp %d x --dp %d = %d; pass --tp and --dp whose product is %d",
                 launched, launched, p->tp, p->dp, ranks, launched);
    gradc_program_free(p);
    return 1;
  }
  char err[1024];
  StFile params, inputs;
  st_init(&params);
  st_init(&inputs);
  StepResult r;
  Trace *trace = NULL;
  if (a->trace) {
    if (!api_dist_start(p, err, sizeof err)) { /* the rank names the trace's events */
      diag_plain(&diag, DIAG_ERROR, "%s", err);
      gradc_program_free(p);
      return 1;
    }
    trace = trace_new(api_program_rank(p));
    trace_set_current(trace);
  }
  if (!st_read(a->params, &params, err, sizeof err) || !st_read(a->inputs, &inputs, err, sizeof err)) {
    diag_plain(&diag, DIAG_ERROR, "%s", err);
    rc = 1;
  } else if (!api_run_window(p, &params, &inputs, &r, err, sizeof err)) {
    diag_plain(&diag, DIAG_ERROR, "%s", err);
    rc = 1;
  } else if (api_program_rank(p) != 0) {
    step_result_free(&r); /* data-parallel: rank 0 prints and writes the window's results */
  } else {
    /* Losses in declaration order, then their sum. */
    double total = 0;
    for (int i = 0; i < p->nlosses; i++)
      for (int j = 0; j < r.nlosses; j++)
        if (strcmp(r.loss_names[j], p->losses[i]) == 0) {
          printf("loss %s %.9g\n", p->losses[i], r.losses[j]);
          total += r.losses[j];
        }
    printf("loss total %.9g\n", total);
    fflush(stdout);
    if (a->grads_out) rc = write_grads(a->grads_out, &r);
    step_result_free(&r);
  }
  if (trace) {
    trace_set_current(NULL);
    if (!rc) rc = write_trace(a->trace, p, trace);
    trace_free(trace);
  }
  st_free(&params);
  st_free(&inputs);
  if (rc) comm_abort(rc); /* a distributed run: end the other ranks too, rather than leave them waiting */
  gradc_program_free(p);
  return rc;
}

int main(int argc, char **argv) {
  diag_init(&diag, stderr);
  if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
    print_help(NULL);
    return argc < 2 ? 1 : 0;
  }
  if (strcmp(argv[1], "--version") == 0) {
    printf("gradc %s\n", GRADC_VERSION);
    return 0;
  }
  if (strcmp(argv[1], "help") == 0) {
    print_help(argc > 2 ? argv[2] : NULL);
    return 0;
  }
#ifdef GRADC_HAVE_MPI
  gradc_mpi_enable(); /* --dp runs over MPI */
#endif
  /* train and data text parse their own flags (tools/train.c). */
  if (strcmp(argv[1], "train") == 0) return cmd_train(argc - 1, argv + 1);
  if (strcmp(argv[1], "bench") == 0) return cmd_bench(argc - 1, argv + 1); /* tools/bench.c */
  if (strcmp(argv[1], "data") == 0 && argc > 2 && strcmp(argv[2], "text") == 0) return cmd_data_text(argc - 2, argv + 2);
  Args a;
  if (strcmp(argv[1], "data") == 0) {
    /* `data random MODEL ...`: drop the sub-command word. */
    if (argc < 3 || strcmp(argv[2], "random") != 0)
      return usage_error("data: unknown or missing sub-command '%s' (have: random, text)", argc > 2 ? argv[2] : "");
    argv[2] = argv[1];
    argv++;
    argc--;
  }
  int rc = parse_args(argc, argv, &a);
  if (rc) return rc;
  tools_set_link(a.link_latency_us, a.link_gbps);
  if (strcmp(a.cmd, "check") == 0) rc = cmd_check(&a);
  else if (strcmp(a.cmd, "compile") == 0) rc = cmd_compile(&a);
  else if (strcmp(a.cmd, "opt") == 0) rc = cmd_opt(&a);
  else if (strcmp(a.cmd, "init") == 0) rc = cmd_init(&a);
  else if (strcmp(a.cmd, "run") == 0) rc = cmd_run(&a);
  else if (strcmp(a.cmd, "data") == 0) rc = cmd_data(&a);
  else rc = usage_error("unknown command '%s'", a.cmd);
  for (int i = 0; i < a.ndefs; i++) free((void *)a.defs_name[i]);
  diag_free(&diag);
  return rc;
}
