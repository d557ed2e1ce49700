/* gradc.c - the command line (DESIGN.md §5).
 *
 *   gradc check   MODEL.gdl
 *   gradc compile MODEL.gdl [-D N=V]... [--gas K] [-o ARTIFACT] [--print-ir-after=P|all] ...
 *   gradc opt     FILE.gir --passes=P1,P2,...
 *   gradc init    MODEL.gdl -o PARAMS.safetensors [--seed S]
 *   gradc run     MODEL.gdl --params P --inputs I [--gas K] [--grads-out G] [--dp N]
 *   gradc infer   MODEL.gdl|ARTIFACT --params P --inputs I [-o OUTPUTS]
 *   gradc eval        MODEL.gdl|ARTIFACT --params P --data D          (tools/infer.c)
 *   gradc generate    MODEL.gdl|ARTIFACT --params P --prompt TEXT ... (tools/infer.c)
 *   gradc data random MODEL.gdl -o BATCH.safetensors [--seed S] [--gas K]
 *   gradc data text   FILE... -T N -o DATA.safetensors      (tools/train.c)
 *   gradc train       MODEL.gdl|ARTIFACT --data DATA ...     (tools/train.c)
 *
 * stdout carries only run's loss lines and IR printed by opt (or compile
 * without -o); everything else goes to stderr.  Exit status: 0 success,
 * 1 user error, 2 internal error. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/cli.h"
#include "gradc.h"
#include "tools.h"

typedef struct Args {
  const char *cmd;
  const char *input;  /* MODEL.gdl or FILE.gir */
  const char *output; /* -o */
  Defines defs; /* -D */
  int gas;
  bool gas_set; /* --gas was given (an artifact fixes K) */
  int dp;
  bool dp_set; /* --dp was given (an artifact fixes it) */
  int tp;
  bool tp_set; /* --tp was given (an artifact fixes it) */
  bool sequence_parallel;   /* --sequence-parallel */
  bool no_overlap;          /* --no-overlap */
  double bucket_mb;         /* --bucket-mb X */
  int64_t bucket_bytes;     /* ... in bytes */
  const char *trace;        /* --trace FILE.json */
  const char *precision;    /* --precision f32|bf16|f16 */
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
  int threads;   /* --threads N, 0 = one per CPU the process may use (pool_ncores) */
  bool no_cache; /* --no-cache */
  bool print_kernels;      /* --print-kernels: the CUDA kernels' source to stderr */
  const char *kernels_dir; /* --kernels-dir DIR: one .cu file per kernel */
  bool allow_tf32;         /* --allow-tf32: f32 GEMMs on CUDA may use TF32 */
  bool forward_only;       /* compile --forward-only; infer always */
  const char *params, *inputs, *grads_out;
  const char *outputs_out, *buffers_out; /* run --outputs-out, --buffers-out (language v2) */
  uint64_t seed;
  uint64_t step; /* run --step N: the optimiser step the random draws are for */
} Args;

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
                "              [--link-latency-us X] [--link-gbps X] [--precision f32|bf16|f16]\n"
                "              [--print-kernels] [--kernels-dir DIR]\n"
                "  Lower, differentiate and optimise a model for the target (cpu: fused kernels compiled\n"
                "  with LLVM; ref: the reference interpreter; cuda: CUDA C kernels compiled with NVRTC for\n"
                "  sm_XX, by default the present GPU's, else sm_80; no GPU is needed to compile).  Without\n"
                "  -o the final IR goes to stdout; -o writes an artifact that run and train load without\n"
                "  compiling.  --print-kernels writes the CUDA source to stderr, --kernels-dir one .cu file\n"
                "  per kernel.  --tp/--dp/--sequence-parallel/--no-overlap/--bucket-mb compile for a\n"
                "  distributed run (see gradc help run and docs/DISTRIBUTED.md); --cost-report prints the\n"
                "  schedule pass's cost-model simulation of one step (compute, communication, exposed\n"
                "  communication with and without overlap) for the link the --link-* flags describe.\n"
                "  --forward-only compiles the forward alone (`training` false, no autodiff, no gradient\n"
                "  buffers): the artifact infer, eval and generate load.\n"
                "  --precision bf16|f16 compiles an f32 model in mixed precision, as PyTorch's autocast:\n"
                "  GEMMs (matmul, convolution) in the low type with f32 accumulation; reductions, norms,\n"
                "  softmax, losses and the optimiser in f32; f32 master weights and gradients.  f16 also\n"
                "  seeds the backward with a loss scale (see gradc help train); the default is f32.\n"},
    {"opt", "gradc opt FILE.gir --passes=P1,P2,... [--gas K] [--precision f32|bf16|f16] [--print-ir-after=..]\n"
            "          [--verify]\n"
            "  Read IR text, run passes, print IR text to stdout (--precision: what autocast and gas-fold\n"
            "  compile for).\n"},
    {"init", "gradc init MODEL.gdl -o PARAMS.safetensors [--seed S] [-D N=V]...\n"
             "  Write initial params and buffers (each one's `init`) as safetensors.\n"},
    {"data", "gradc data random MODEL.gdl -o BATCH.safetensors [--seed S] [-D N=V]...\n"
             "  Write one window of random inputs: floats ~ N(0,1), integers in [0, the size of the\n"
             "  axis they index).\n"},
    {"data", data_text_help},
    {"run", "gradc run MODEL.gdl|ARTIFACT [-D N=V]... [--gas K] [--target cpu|ref|cuda[:sm_XX]] [--threads N]\n"
            "          [--dp N] [--tp T] [--sequence-parallel] [--no-overlap] [--bucket-mb X] [--allow-tf32]\n"
            "          [--trace FILE.json] [--link-latency-us X] [--link-gbps X] [--seed S] [--step N]\n"
            "          [--precision f32|bf16|f16]\n"
            "          --params PARAMS.safetensors --inputs BATCH.safetensors [--grads-out GRADS.safetensors]\n"
            "          [--outputs-out OUTPUTS.safetensors] [--buffers-out BUFFERS.safetensors]\n"
            "  Compute one window of K micro-batches: prints `loss NAME VALUE` per loss and `loss total`,\n"
            "  writes one gradient per param (--params may be a checkpoint: its optim.* tensors are\n"
            "  skipped), each `output` for the whole window (--outputs-out; one with a leading batch\n"
            "  axis holds every sample) and each buffer's value after its `update` (--buffers-out; the\n"
            "  params file holds the buffers).  --dp N runs it on N data-parallel processes\n"
            "  (mpirun -np N gradc run ... --dp N): each takes B/N samples of the window, and rank 0\n"
            "  prints the losses and writes the gradients of the whole window.  --tp T shards the params\n"
            "  annotated split(N) over T processes (Megatron-style tensor parallelism; with\n"
            "  --sequence-parallel activations between the parallel regions are sharded along the\n"
            "  sequence); the run is T x N processes.  Gradients are reduced in buckets of --bucket-mb\n"
            "  (default 1) while the backward runs; --no-overlap waits for each collective at once.\n"
            "  --trace writes a Chrome trace (Perfetto) of kernels and collectives per rank and reports\n"
            "  the exposed communication; --link-latency-us and --link-gbps simulate a slow link.\n"
            "  --seed S and --step N (default 0 and 0) choose the random draws of dropout, rand_like and\n"
            "  randn_like, which are the same for every --gas and --dp.  --precision bf16|f16 runs the\n"
            "  window in mixed precision (see gradc help compile); with f16 the window is scaled by the\n"
            "  loss scale a training run starts with (65536) and unscaled after it, as its first step is.\n"},
    {"infer", "gradc infer MODEL.gdl|ARTIFACT --params PARAMS.safetensors --inputs BATCH.safetensors\n"
              "            [-o OUTPUTS.safetensors] [-D N=V]... [--gas K] [--target cpu|ref|cuda[:sm_XX]]\n"
              "            [--threads N] [--no-cache] [--allow-tf32]\n"
              "  Compute one window forward only: the model is compiled with `training` false (dropout is\n"
              "  the identity, `if training` takes its else branch, no `update`) and without autodiff, so no\n"
              "  gradient buffers.  Prints `loss NAME VALUE` per loss and `loss total` as run does, and writes each\n"
              "  `output` for the whole window to -o.  An artifact must come from compile --forward-only.\n"},
    {"eval", eval_help},
    {"generate", generate_help},
    {"train", train_help},
    {"bench", bench_help},
    {"convert", convert_help},
    {"functions", "gradc help functions\n"
                  "  List the model language's built-in functions with their signatures.\n"},
};

static void print_help(const char *cmd) {
  int n = (int)(sizeof help_text / sizeof help_text[0]);
  if (cmd) {
    bool found = false; /* a command may have several entries (data random, data text) */
    for (int i = 0; i < n; i++)
      if (strcmp(help_text[i][0], cmd) == 0) {
        fputs(help_text[i][1], stdout);
        if (strcmp(cmd, "opt") == 0 || strcmp(cmd, "compile") == 0) {
          printf("  Passes:\n");
          for (int j = 0; j < cli_pass_count(); j++) printf("    %-10s %s\n", cli_pass_name(j), cli_pass_what(j));
        }
        if (strcmp(cmd, "functions") == 0) cli_print_functions(stdout);
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
    if (!cli_pass_exists(p)) {
      fprintf(stderr, "gradc: error: %s: no pass named '%s' (see gradc help compile)\n", flag, p);
      ok = false;
    }
  free(copy);
  return ok;
}

static int parse_args(int argc, char **argv, Args *a) {
  memset(a, 0, sizeof *a);
  a->gas = 1;
  a->dp = 1;
  a->tp = 1;
  a->cmd = argv[1];
  const Flag flags[] = {
      {"-o", FLAG_STRING, .dst = &a->output, .missing = "%s needs a file name"},
      TOOLS_RUN_FLAGS(a),
      {"--cost-report", FLAG_BOOL, .dst = &a->cost_report},
      {"--seed", FLAG_U64, &a->seed, NULL, 0, (double)INT64_MAX, .expects = "a non-negative integer"},
      {"--step", FLAG_U64, &a->step, NULL, 0, (double)INT64_MAX, .expects = "a non-negative integer"},
      {"--target", FLAG_STRING, .dst = &a->target},
      {"--passes", FLAG_STRING, .dst = &a->passes},
      {"--print-ir-after", FLAG_LIST, .dst = &a->print_after},
      {"--print-ir-before", FLAG_LIST, .dst = &a->print_before},
      {"--dot", FLAG_STRING, .dst = &a->dot},
      {"--params", FLAG_STRING, .dst = &a->params},
      {"--inputs", FLAG_STRING, .dst = &a->inputs},
      {"--grads-out", FLAG_STRING, .dst = &a->grads_out},
      {"--outputs-out", FLAG_STRING, .dst = &a->outputs_out},
      {"--buffers-out", FLAG_STRING, .dst = &a->buffers_out},
      {"--threads", FLAG_INT, &a->threads, NULL, 0, 1024, .expects = "a count"},
      {"--no-cache", FLAG_BOOL, .dst = &a->no_cache},
      {"--print-kernels", FLAG_BOOL, .dst = &a->print_kernels},
      {"--kernels-dir", FLAG_STRING, .dst = &a->kernels_dir},
      {"--allow-tf32", FLAG_BOOL, .dst = &a->allow_tf32},
      {"--time-passes", FLAG_BOOL, .dst = &a->time_passes},
      {"--verify", FLAG_BOOL, .dst = &a->verify},
      {"--forward-only", FLAG_BOOL, .dst = &a->forward_only},
  };
  int npos = 0;
  FlagSpec spec = {flags, (int)(sizeof flags / sizeof *flags), " (see gradc help)", .see_values = true,
                   .defines = &a->defs, .positional = &a->input, .max_positional = 1, .npositional = &npos};
  int rc = flags_parse(&spec, argc, argv, 2);
  if (rc) return rc;
  a->bucket_bytes = tools_bucket_bytes(a->bucket_mb);
  if (a->target && strcmp(a->target, "cpu") != 0 && strcmp(a->target, "ref") != 0 && !cli_is_cuda_target(a->target)) {
    fprintf(stderr, "gradc: error: unsupported --target '%s' (this build has: cpu, ref%s) (see gradc help)\n", a->target,
            cli_cuda_targets());
    return 1;
  }
  if (!check_pass_list("--print-ir-after", a->print_after) || !check_pass_list("--print-ir-before", a->print_before))
    return 1;
  return 0;
}

/* ---- commands ---- */

/* What the flags ask of the compiler: sizes, K, target, distribution. */
static void compile_options(const Args *a, gradc_compile_options *o) {
  gradc_compile_options_init(o);
  o->gas = a->gas;
  o->target = a->target ? a->target : "cpu";
  o->threads = a->threads;
  o->no_cache = a->no_cache;
  o->dp = a->dp;
  o->tp = a->tp;
  o->sequence_parallel = a->sequence_parallel;
  o->no_overlap = a->no_overlap;
  o->bucket_bytes = a->bucket_bytes;
  o->zero1 = a->zero1;
  o->forward_only = a->forward_only;
  o->precision = a->precision;
  o->def_names = a->defs.name;
  o->def_values = a->defs.value;
  o->ndefs = a->defs.n;
}

static cli_dumps dumps(const Args *a) {
  return (cli_dumps){a->print_before, a->print_after, a->time_passes, a->verify};
}

static int cmd_check(const Args *a) {
  if (!a->input) return usage_error("%s needs a model file", a->cmd);
  gradc_compile_options o;
  compile_options(a, &o);
  return cli_check(a->input, &o);
}

/* Compile a.input (a .gdl model) for a.target, or load it (an artifact,
 * whose sizes, K and target are fixed: a conflicting flag is an error). */
static int open_program(const Args *a, gradc_program **out) {
  *out = NULL;
  if (!a->input) return usage_error("%s needs a model file or an artifact", a->cmd);
  if (cli_is_artifact(a->input)) {
    gradc_status st = gradc_program_load(a->input, out);
    if (st) return cli_report(st);
    const gradc_program *p = *out;
    const char *why = NULL;
    char buf[256];
    if (a->defs.n) why = "its sizes are fixed (no -D)";
    else if (a->gas_set && a->gas != gradc_program_gas(p))
      why = (snprintf(buf, sizeof buf, "it was built with --gas %d", gradc_program_gas(p)), buf);
    else if (a->dp_set && a->dp != gradc_program_dp(p))
      why = (snprintf(buf, sizeof buf, "it was built with --dp %d", gradc_program_dp(p)), buf);
    else if (a->tp_set && a->tp != gradc_program_tp(p))
      why = (snprintf(buf, sizeof buf, "it was built with --tp %d", gradc_program_tp(p)), buf);
    else if (a->target && strcmp(a->target, cli_program_target(p)) != 0)
      why = (snprintf(buf, sizeof buf, "it was built for --target %s", cli_program_target(p)), buf);
    else if (a->forward_only && !gradc_program_forward_only(p))
      why = strcmp(a->cmd, "infer") == 0 ? "it was compiled for training; infer loads an artifact of compile "
                                           "--forward-only (or give the model source)"
                                         : "it was compiled for training, not --forward-only";
    else if (!a->forward_only && gradc_program_forward_only(p) && strcmp(a->cmd, "compile") != 0)
      why = "it was compiled --forward-only (no gradients); run computes them: use gradc infer, or compile the "
            "model without --forward-only";
    else if (a->precision && strcmp(a->precision, gradc_program_precision(p)) != 0)
      why = (snprintf(buf, sizeof buf, "it was built with --precision %s", gradc_program_precision(p)), buf);
    if (why) {
      fprintf(stderr, "gradc: error: %s: %s\n", a->input, why);
      gradc_program_free(*out);
      *out = NULL;
      return 1;
    }
    return 0;
  }
  gradc_compile_options o;
  compile_options(a, &o);
  cli_dumps d = dumps(a);
  return cli_compile(a->input, &o, &d, out);
}

static int cmd_compile(const Args *a) {
  gradc_program *p;
  int rc = open_program(a, &p);
  if (rc) return rc;
  if (a->print_kernels || a->kernels_dir) rc = cli_write_kernels(p, a->print_kernels, a->kernels_dir);
  if (a->dot && !rc) rc = cli_write_dot(p, a->dot);
  if (a->cost_report && !rc) cli_cost_report(p, a->link_gbps, a->link_latency_us);
  if (!rc) {
    if (a->output) {
      gradc_status st = gradc_program_save(p, a->output);
      if (st) rc = cli_report(st);
    } else {
      cli_print_ir(p, stdout);
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
    if (!cli_pass_exists(p)) {
      int rc = usage_error("no pass named '%s'", p);
      free(list);
      return rc;
    }
    if (n < 64) names[n++] = p;
  }
  gradc_compile_options o;
  compile_options(a, &o);
  cli_dumps d = dumps(a);
  int rc = cli_opt(a->input, names, n, &o, &d, a->dot);
  free(list);
  return rc;
}

static int cmd_init(const Args *a) {
  if (!a->output) return usage_error("init needs -o PARAMS.safetensors%s", "");
  if (!a->input) return usage_error("%s needs a model file", a->cmd);
  gradc_compile_options o;
  compile_options(a, &o);
  return cli_init(a->input, &o, a->seed, a->output);
}

static int cmd_data(const Args *a) {
  if (!a->output) return usage_error("data random needs -o BATCH.safetensors%s", "");
  if (!a->input) return usage_error("%s needs a model file", a->cmd);
  gradc_compile_options o;
  compile_options(a, &o);
  return cli_data_random(a->input, &o, a->seed, a->output);
}

static int cmd_run(const Args *a) {
  if (!a->params) return usage_error("run needs --params PARAMS.safetensors%s", "");
  if (!a->inputs) return usage_error("run needs --inputs BATCH.safetensors%s", "");
  if (cli_is_cuda_target(a->target) && cli_need_device()) return 1;
  gradc_program *p;
  int rc = open_program(a, &p);
  if (rc) return rc;
  cli_set_draws(p, a->seed, a->step);
  rc = cli_run(p, a->params, a->inputs, a->grads_out, a->outputs_out, a->buffers_out, a->trace, a->allow_tf32);
  gradc_program_free(p);
  return rc;
}

/* Before any work: the outputs can be written and none replaces an input
 * (rank 0 of a distributed run writes them, and checks). */
static int check_paths(const Args *a) {
  if (cli_launch_rank() != 0) return 0;
  const ToolsPath in[] = {{"the model", a->input, NULL}, {"--params", a->params, NULL}, {"--inputs", a->inputs, NULL}};
  const ToolsPath out[] = {{"-o", a->output, NULL},           {"--grads-out", a->grads_out, NULL},
                           {"--outputs-out", a->outputs_out, NULL}, {"--buffers-out", a->buffers_out, NULL},
                           {"--trace", a->trace, NULL},       {"--dot", a->dot, NULL}};
  return tools_check_paths(in, 3, out, 6);
}

/* `infer`: run's window, forward only (the flags that ask for gradients are refused). */
static int cmd_infer(const Args *a) {
  if (!a->params) return usage_error("infer needs --params PARAMS.safetensors%s", "");
  if (!a->inputs) return usage_error("infer needs --inputs BATCH.safetensors%s", "");
  if (a->grads_out) return usage_error("infer computes no gradients (--grads-out is run's)%s", "");
  if (a->buffers_out) return usage_error("infer runs no `update` (--buffers-out is run's)%s", "");
  if (a->outputs_out) return usage_error("infer writes its outputs to -o OUTPUTS.safetensors%s", "");
  if (a->dp_set || a->tp_set) return usage_error("infer runs in one process (no --dp or --tp)%s", "");
  if (cli_is_cuda_target(a->target) && cli_need_device()) return 1;
  gradc_program *p;
  int rc = open_program(a, &p);
  if (rc) return rc;
  rc = cli_run(p, a->params, a->inputs, NULL, a->output, NULL, a->trace, a->allow_tf32);
  gradc_program_free(p);
  return rc;
}

int main(int argc, char **argv) {
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
  if (strcmp(argv[1], "convert") == 0) return cmd_convert(argc - 1, argv + 1); /* tools/convert.c */
  if (strcmp(argv[1], "eval") == 0) return cmd_eval(argc - 1, argv + 1);         /* tools/infer.c */
  if (strcmp(argv[1], "generate") == 0) return cmd_generate(argc - 1, argv + 1); /* tools/infer.c */
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
  if (!rc) rc = check_paths(&a);
  if (rc) {
    defines_free(&a.defs);
    return rc;
  }
  if (strcmp(a.cmd, "infer") == 0) a.forward_only = true;
  tools_set_link(a.link_latency_us, a.link_gbps);
  if (strcmp(a.cmd, "check") == 0) rc = cmd_check(&a);
  else if (strcmp(a.cmd, "compile") == 0) rc = cmd_compile(&a);
  else if (strcmp(a.cmd, "opt") == 0) rc = cmd_opt(&a);
  else if (strcmp(a.cmd, "init") == 0) rc = cmd_init(&a);
  else if (strcmp(a.cmd, "run") == 0) rc = cmd_run(&a);
  else if (strcmp(a.cmd, "infer") == 0) rc = cmd_infer(&a);
  else if (strcmp(a.cmd, "data") == 0) rc = cmd_data(&a);
  else rc = usage_error("unknown command '%s'", a.cmd);
  defines_free(&a.defs);
  return rc;
}
