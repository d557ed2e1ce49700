/* train.c - `gradc train` (a training loop over the C API of
 * include/gradc.h) and `gradc data text` (a byte-level language-model
 * dataset from text files).
 *
 * A dataset is a safetensors file with one tensor per model input, named as
 * the input, whose leading axis counts samples: for `input idx : i32[B, T]`
 * it holds `idx : I32[N, T]`.  Inputs without a batch axis are stored with
 * their own shape and fed unchanged every step.
 *
 * Data order: the windows of an epoch are B consecutive samples of a
 * permutation of the N samples (the last N mod B are dropped that epoch).
 * Each epoch's permutation is a Fisher-Yates shuffle seeded by one draw from
 * the session's generator (gradc_session_rng_next) at the epoch's first
 * step, so the order follows from --seed alone.  A checkpoint keeps the
 * generator (the C API saves it) and the current epoch's draw (this file
 * adds it to the checkpoint's __metadata__ as train.epoch_key), so a
 * resumed run continues the same order mid-epoch and its steps are
 * bit-identical to an uninterrupted run's.
 *
 * Progress goes to stderr: on a terminal one line redrawn in place, else
 * plain lines every --print-every steps.  stdout stays empty.
 *
 * With --dp N (mpirun -np N) every rank reads the dataset and draws the
 * same order; each runs B/N samples of every window, the gradients are
 * summed over the ranks, and every rank takes the same optimiser step, so
 * the params stay identical (checked at the end).  Rank 0 alone prints,
 * logs, plots and writes checkpoints and params. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>

#include "api/cli.h"
#include "gradc.h"
#include "tools.h"

const char train_help[] =
    "gradc train MODEL.gdl|ARTIFACT --data DATA.safetensors [--steps N] [--gas K] [--target cpu|ref|cuda]\n"
    "            [--optimizer sgd|adamw] [--lr X] [--momentum M] [--dampening D] [--nesterov]\n"
    "            [--beta1 B] [--beta2 B] [--eps E] [--weight-decay W] [--clip C]\n"
    "            [--warmup N] [--schedule constant|linear|cosine] [--cosine] [--min-lr X]\n"
    "            [--no-decay PATTERN[,PATTERN]] [--decay-1d] [--seed S] [--init PARAMS.safetensors]\n"
    "            [--init-partial]\n"
    "            [--params-out PARAMS.safetensors] [--checkpoint FILE] [--checkpoint-every N]\n"
    "            [--resume FILE] [--stop-after N] [--log FILE.csv|FILE.jsonl] [--plot FILE.svg]\n"
    "            [--print-every N] [--threads N] [--no-cache] [--dp N] [--tp T] [--sequence-parallel]\n"
    "            [--no-overlap] [--bucket-mb X] [--zero1] [--trace FILE.json] [--link-latency-us X]\n"
    "            [--link-gbps X] [--nan-policy stop|skip] [--max-loss X] [--val-data DATA.safetensors]\n"
    "            [--val-every N] [-D N=V]...\n"
    "            [--precision f32|bf16|f16] [--init-scale S] [--scale-window N] [--scale-hysteresis N]\n"
    "  Train on a dataset (one tensor per input, samples along the first axis; see gradc data).\n"
    "  Each step takes one window of B samples of a seeded per-epoch shuffle, runs K micro-batches\n"
    "  and an optimiser step: torch.optim semantics, AdamW unless --optimizer sgd, --lr 1e-3 and\n"
    "  torch's defaults unless given.  --steps N is the run's total (default 100): a resumed run\n"
    "  continues to it.  The rate rises linearly over --warmup N steps (default 0; the first step\n"
    "  uses lr/N), then --schedule constant (the default) keeps it, linear or cosine decay it to\n"
    "  --min-lr (default 0) at step N (transformers' get_linear/cosine_schedule_with_warmup);\n"
    "  --cosine is --schedule cosine.  Weight decay (--weight-decay: AdamW 0.01, SGD 0) skips\n"
    "  params of rank <= 1 (biases, norm weights, as GPT recipes' param groups do; --decay-1d\n"
    "  decays them too) and params whose name matches a --no-decay pattern (fnmatch: '*_b,ln*';\n"
    "  a stacked per-layer vector, f32[L, C], is 2-D here: name it).  --init FILE starts from\n"
    "  a params file (every param; with --init-partial a subset, the rest initialised as\n"
    "  declared; a checkpoint's optim.* tensors are skipped).\n"
    "  --seed S (default 0) seeds the params' init, the data order and the random draws (dropout,\n"
    "  rand_like, randn_like: drawn anew at each optimiser step).\n"
    "  --resume continues a checkpoint bit-identically (same data order, same optimiser state);\n"
    "  --checkpoint is written at the end and every --checkpoint-every steps, each time in one atomic\n"
    "  write (a run killed mid-write leaves the previous checkpoint whole, and the next run removes the\n"
    "  dead run's temporary); --stop-after N ends this run after N steps, as Ctrl-C (SIGINT, SIGTERM,\n"
    "  SIGHUP) does after the current one.  Every output is checked before the first step: one that\n"
    "  cannot be written, is not a regular file, or is an input's file is an error at once.  Progress goes to stderr: a\n"
    "  bar redrawn in place on a terminal, else a line every --print-every steps.  --log writes a\n"
    "  row per step (step, lr, each loss, total, grad_norm, elapsed_s) as CSV or JSON lines;\n"
    "  --plot draws the loss curves as SVG.  stdout stays empty.  --dp N trains on N data-parallel\n"
    "  processes (mpirun -np N gradc train ... --dp N): each runs B/N samples of every window, all take\n"
    "  the same steps, and rank 0 prints and writes the files.  --tp T shards params annotated split(N)\n"
    "  over T processes (T x N in all); --zero1 shards the optimiser over the --dp ranks (ZeRO-1:\n"
    "  gradients reduce-scattered, each rank updates 1/N of the params, params all-gathered); the\n"
    "  other distributed flags are those of gradc help run.\n"
    "  A window whose loss or gradient norm is not finite (inf or NaN) ends the run with --nan-policy\n"
    "  stop (the default): the error names the step and the loss term, the step is not taken, and\n"
    "  --checkpoint gets the last good state; with --nan-policy skip the step is counted but its\n"
    "  update is not applied (params and optimiser state stay as they were; the count is reported).\n"
    "  An update that makes a param or the optimiser state non-finite always stops the run, naming\n"
    "  the step and the tensor: a checkpoint never holds an inf or a NaN, so the last one written\n"
    "  stays.  --max-loss X warns when a loss (a term or the total) rises above X.\n"
    "  --val-data FILE (a dataset like --data) computes the forward-only losses over all of it, as\n"
    "  gradc eval does, every --val-every N steps (default: at the end only) and after the last\n"
    "  step: a `val step N: ...` line on stderr, val_ columns in --log, a val curve in --plot.\n"
    "  --precision bf16|f16 trains an f32 model in mixed precision, as PyTorch's autocast: GEMMs\n"
    "  (matmul, convolution) in the low type with f32 accumulation, everything else in f32, f32\n"
    "  master weights, gradients and optimiser state.  f16 scales the loss dynamically: the scale\n"
    "  (--init-scale, default 65536) is fixed for a window; a window whose gradients overflow skips\n"
    "  its step on every rank (params and optimiser state unchanged, the step counted) and halves\n"
    "  the scale (after --scale-hysteresis overflows in a row, default 1); --scale-window clean\n"
    "  steps (default 2000) double it.  The progress line, the log (loss_scale and skipped columns)\n"
    "  and the final line count the skipped steps; checkpoints keep the scale.  bf16 needs no scale.\n";

const char data_text_help[] =
    "gradc data text FILE... -T N -o DATA.safetensors [--stride S] [--names IDX,TARGETS] [--compact]\n"
    "  A language-model dataset from text files (concatenated): byte-level tokens, sample i is\n"
    "  bytes [i*S, i*S+T) as idx and the next bytes [i*S+1, i*S+T+1) as targets, both I32[N, T]\n"
    "  (S defaults to T).  Token ids are byte values (train with -D V=256), or with --compact the\n"
    "  index of the byte among the distinct bytes of the text, in byte order (vocabulary size and\n"
    "  bytes in __metadata__ as vocab_size and vocab).  --names renames the two tensors.\n";

/* ---- small helpers ---- */

static void warning(const char *fmt, ...) GRADC_PRINTF(1, 2);
static void warning(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fputs("gradc: warning: ", stderr);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
}

static double now_s(void) { return tools_now_ms() * 1e-3; }

static bool ends_with(const char *s, const char *suffix) {
  size_t n = strlen(s), m = strlen(suffix);
  return n >= m && strcmp(s + n - m, suffix) == 0;
}

static void shape_str(char *buf, size_t n, const int64_t *shape, int rank, int from) {
  size_t k = 0;
  k += (size_t)snprintf(buf + k, n - k, "[");
  for (int i = from; i < rank && k < n; i++)
    k += (size_t)snprintf(buf + k, n - k, "%s%" PRId64, i > from ? "," : "", shape[i]);
  if (k < n) snprintf(buf + k, n - k, "]");
}

/* ================================================================== */
/* gradc data text                                                     */
/* ================================================================== */

int cmd_data_text(int argc, char **argv) {
  const char *files[256], *output = NULL, *names = NULL;
  int nfiles = 0;
  int64_t T = 0, stride = 0;
  bool compact = false;
  const char *context = "a positive context length";
  const Flag flags[] = {
      {"-T", FLAG_I64, &T, NULL, 1, 1 << 24, .expects = context, .missing = "%s expects a positive context length, got ''"},
      {"--context", FLAG_I64, &T, NULL, 1, 1 << 24, .expects = context, .label = "-T"},
      {"--stride", FLAG_I64, &stride, NULL, 1, (double)INT64_MAX, .expects = "a positive integer"},
      {"--names", FLAG_STRING, .dst = &names},
      {"-o", FLAG_STRING, .dst = &output, .missing = "%s needs a file name"},
      {"--compact", FLAG_BOOL, .dst = &compact},
  };
  FlagSpec spec = {flags, (int)(sizeof flags / sizeof *flags), " (see gradc help data)", .see_values = true,
                   .see_missing = true, .positional = files, .max_positional = (int)(sizeof files / sizeof *files),
                   .npositional = &nfiles, .too_many = "too many text files"};
  int rc = flags_parse(&spec, argc, argv, 1);
  if (rc) return rc;
  if (!nfiles) return tools_error("data text needs a text file (see gradc help data)");
  if (!T) return tools_error("data text needs -T N, the context length (see gradc help data)");
  if (!output) return tools_error("data text needs -o DATA.safetensors (see gradc help data)");
  if (!stride) stride = T;
  {
    ToolsPath in[256];
    for (int i = 0; i < nfiles; i++) in[i] = (ToolsPath){"a text file", files[i], NULL};
    const ToolsPath out = {"-o", output, NULL};
    if ((rc = tools_check_paths(in, nfiles, &out, 1))) return rc;
  }

  char idx_name[256] = "idx", tgt_name[256] = "targets";
  if (names) {
    const char *comma = strchr(names, ',');
    size_t a = comma ? (size_t)(comma - names) : 0;
    if (!comma || a == 0 || !comma[1] || strchr(comma + 1, ',') || a >= sizeof idx_name ||
        strlen(comma + 1) >= sizeof tgt_name || strncmp(names, comma + 1, a) == 0)
      return tools_error("--names expects two different names IDX,TARGETS, got '%s'", names);
    memcpy(idx_name, names, a);
    idx_name[a] = 0;
    strcpy(tgt_name, comma + 1);
  }

  /* The text: all files, concatenated. */
  StrBuf text;
  sb_init(&text);
  for (int i = 0; i < nfiles; i++) {
    const char *err;
    size_t len;
    char *s = read_file(files[i], &len, &err);
    if (!s) {
      sb_free(&text);
      return tools_error("%s: %s", files[i], err);
    }
    sb_putn(&text, s, len);
    free(s);
  }
  const unsigned char *bytes = (const unsigned char *)sb_str(&text);
  int64_t len = (int64_t)text.len;
  if (len < T + 1) {
    sb_free(&text);
    return tools_error("%s: %" PRId64 " bytes of text, too few for one sample of %" PRId64 " tokens and its target",
                       files[0], len, T);
  }
  int64_t N = (len - T - 1) / stride + 1;

  /* Token ids: byte values, or ranks among the bytes present. */
  int id[256], nvocab = 256;
  bool present[256] = {false};
  for (int64_t i = 0; i < len; i++) present[bytes[i]] = true;
  for (int b = 0; b < 256; b++) id[b] = b;
  StrBuf vocab;
  sb_init(&vocab);
  if (compact) {
    nvocab = 0;
    sb_putc(&vocab, '[');
    for (int b = 0; b < 256; b++)
      if (present[b]) {
        sb_printf(&vocab, "%s%d", nvocab ? "," : "", b);
        id[b] = nvocab++;
      }
    sb_putc(&vocab, ']');
  }

  if ((uint64_t)N * (uint64_t)T > ((uint64_t)1 << 31)) {
    sb_free(&text);
    sb_free(&vocab);
    return tools_error("%" PRId64 " samples of %" PRId64 " tokens is too large a dataset; raise --stride", N, T);
  }
  int32_t *idx = mem_alloc(sizeof(int32_t) * (size_t)(N * T)), *tgt = mem_alloc(sizeof(int32_t) * (size_t)(N * T));
  for (int64_t n = 0; n < N; n++)
    for (int64_t t = 0; t < T; t++) {
      idx[n * T + t] = id[bytes[n * stride + t]];
      tgt[n * T + t] = id[bytes[n * stride + t + 1]];
    }

  cli_tensors *st = cli_tensors_new();
  int64_t shape[2] = {N, T};
  cli_tensors_add(st, idx_name, GRADC_I32, 2, shape, idx);
  cli_tensors_add(st, tgt_name, GRADC_I32, 2, shape, tgt);
  char buf[64];
  cli_tensors_set_meta(st, "format", "gradc.text");
  snprintf(buf, sizeof buf, "%d", nvocab);
  cli_tensors_set_meta(st, "vocab_size", buf);
  cli_tensors_set_meta(st, "vocab", compact ? sb_str(&vocab) : "bytes");
  snprintf(buf, sizeof buf, "%" PRId64, stride);
  cli_tensors_set_meta(st, "stride", buf);
  snprintf(buf, sizeof buf, "%" PRId64, len);
  cli_tensors_set_meta(st, "text_bytes", buf);
  char err[1024];
  if (!cli_tensors_write(st, output, err, sizeof err))
    rc = tools_error("%s", err);
  else
    fprintf(stderr,
            "%s: %" PRId64 " samples of %" PRId64 " tokens from %" PRId64 " bytes (stride %" PRId64
            "), vocabulary %d%s; train with -D T=%" PRId64 " -D V=%d\n",
            output, N, T, len, stride, nvocab, compact ? " (compact)" : " (bytes)", T, nvocab);
  cli_tensors_free(st);
  free(idx);
  free(tgt);
  sb_free(&text);
  sb_free(&vocab);
  return rc;
}

/* ================================================================== */
/* gradc train                                                         */
/* ================================================================== */

typedef struct TrainArgs {
  const char *model, *data;
  int64_t steps, stop_after, print_every;
  int gas;
  bool gas_set;
  int dp;
  bool dp_set;
  int tp;
  bool tp_set;
  bool sequence_parallel, no_overlap, zero1;
  int64_t bucket_bytes;
  const char *trace;
  const char *precision; /* --precision f32|bf16|f16 */
  double init_scale;     /* --init-scale: f16's first loss scale (0: the API's 65536) */
  int scale_window, scale_hysteresis; /* --scale-window, --scale-hysteresis (0: the API's 2000, 1) */
  double link_latency_us, link_gbps;
  const char *target;
  int threads;
  bool no_cache;
  double bucket_mb;
  gradc_optimizer_kind kind;
  const char *optimizer; /* --optimizer sgd|adamw */
  double lr, momentum, dampening, beta1, beta2, eps, weight_decay, clip, min_lr;
  bool lr_set, momentum_set, dampening_set, nesterov, beta1_set, beta2_set, eps_set, wd_set, min_lr_set;
  int64_t warmup;
  bool cosine;
  const char *schedule;  /* --schedule constant|linear|cosine (NULL: constant, or cosine with --cosine) */
  const char *no_decay;  /* --no-decay patterns, comma-separated */
  bool decay_1d, init_partial;
  uint64_t seed;
  const char *init, *params_out, *checkpoint, *resume, *log, *plot;
  int64_t checkpoint_every;
  const char *nan_policy; /* --nan-policy stop|skip */
  bool nan_skip;
  double max_loss;
  bool max_loss_set;
  const char *val_data; /* --val-data: forward-only losses over this dataset (tools/infer.c) */
  int64_t val_every;    /* --val-every N (0: after the last step only) */
  Defines defs;
} TrainArgs;

static bool is_optimizer(const char *v) { return strcmp(v, "sgd") == 0 || strcmp(v, "adamw") == 0; }
static bool is_schedule(const char *v) {
  return strcmp(v, "constant") == 0 || strcmp(v, "linear") == 0 || strcmp(v, "cosine") == 0;
}
static bool is_nan_policy(const char *v) { return strcmp(v, "stop") == 0 || strcmp(v, "skip") == 0; }

static int parse_train_args(int argc, char **argv, TrainArgs *a) {
  memset(a, 0, sizeof *a);
  a->steps = 100;
  a->gas = 1;
  a->dp = 1;
  a->tp = 1;
  const double any = (double)INT64_MAX;
  const Flag flags[] = {
      {"--steps", FLAG_I64, &a->steps, NULL, 1, any, .expects = "an integer >= 1"},
      {"--stop-after", FLAG_I64, &a->stop_after, NULL, 1, any, .expects = "an integer >= 1"},
      {"--print-every", FLAG_I64, &a->print_every, NULL, 1, any, .expects = "an integer >= 1"},
      {"--warmup", FLAG_I64, &a->warmup, NULL, 0, any, .expects = "an integer >= 0"},
      {"--checkpoint-every", FLAG_I64, &a->checkpoint_every, NULL, 1, any, .expects = "an integer >= 1"},
      {"--lr", FLAG_REAL, &a->lr, &a->lr_set, 0, HUGE_VAL, .expects = "a non-negative number"},
      {"--momentum", FLAG_REAL, &a->momentum, &a->momentum_set, 0, HUGE_VAL, .expects = "a non-negative number"},
      {"--dampening", FLAG_REAL, &a->dampening, &a->dampening_set, 0, HUGE_VAL, .expects = "a non-negative number"},
      {"--beta1", FLAG_REAL, &a->beta1, &a->beta1_set, 0, HUGE_VAL, .expects = "a non-negative number"},
      {"--beta2", FLAG_REAL, &a->beta2, &a->beta2_set, 0, HUGE_VAL, .expects = "a non-negative number"},
      {"--eps", FLAG_REAL, &a->eps, &a->eps_set, 0, HUGE_VAL, .expects = "a non-negative number"},
      {"--weight-decay", FLAG_REAL, &a->weight_decay, &a->wd_set, 0, HUGE_VAL, .expects = "a non-negative number"},
      {"--min-lr", FLAG_REAL, &a->min_lr, &a->min_lr_set, 0, HUGE_VAL, .expects = "a non-negative number"},
      TOOLS_RUN_FLAGS(a),
      {"--threads", FLAG_INT, &a->threads, NULL, 0, 4096, .expects = "an integer >= 0"},
      {"--clip", FLAG_REAL, &a->clip, NULL, 0, HUGE_VAL, .lo_open = true, .expects = "a positive norm"},
      {"--seed", FLAG_U64, &a->seed, NULL, 0, any, .expects = "a non-negative integer"},
      {"--optimizer", FLAG_STRING, .dst = &a->optimizer, .valid = is_optimizer,
       .invalid = "--optimizer expects sgd or adamw, got '%s'"},
      {"--data", FLAG_STRING, .dst = &a->data},
      {"--target", FLAG_STRING, .dst = &a->target},
      {"--init", FLAG_STRING, .dst = &a->init},
      {"--params-out", FLAG_STRING, .dst = &a->params_out},
      {"--checkpoint", FLAG_STRING, .dst = &a->checkpoint},
      {"--resume", FLAG_STRING, .dst = &a->resume},
      {"--log", FLAG_STRING, .dst = &a->log},
      {"--plot", FLAG_STRING, .dst = &a->plot},
      {"--nesterov", FLAG_BOOL, .dst = &a->nesterov},
      {"--cosine", FLAG_BOOL, .dst = &a->cosine},
      {"--schedule", FLAG_STRING, .dst = &a->schedule, .valid = is_schedule,
       .invalid = "--schedule expects constant, linear or cosine, got '%s'"},
      {"--no-decay", FLAG_LIST, .dst = &a->no_decay},
      {"--decay-1d", FLAG_BOOL, .dst = &a->decay_1d},
      {"--init-partial", FLAG_BOOL, .dst = &a->init_partial},
      {"--no-cache", FLAG_BOOL, .dst = &a->no_cache},
      {"--nan-policy", FLAG_STRING, .dst = &a->nan_policy, .valid = is_nan_policy,
       .invalid = "--nan-policy expects stop or skip, got '%s'"},
      {"--max-loss", FLAG_REAL, &a->max_loss, &a->max_loss_set, -HUGE_VAL, HUGE_VAL, .expects = "a number"},
      {"--val-data", FLAG_STRING, .dst = &a->val_data},
      {"--val-every", FLAG_I64, &a->val_every, NULL, 1, any, .expects = "an integer >= 1"},
      {"--init-scale", FLAG_REAL, &a->init_scale, NULL, 0, HUGE_VAL, .lo_open = true,
       .expects = "a positive power of two"},
      {"--scale-window", FLAG_INT, &a->scale_window, NULL, 1, INT32_MAX, .expects = "a positive integer"},
      {"--scale-hysteresis", FLAG_INT, &a->scale_hysteresis, NULL, 1, INT32_MAX, .expects = "a positive integer"},
  };
  int npos = 0;
  FlagSpec spec = {flags, (int)(sizeof flags / sizeof *flags), " (see gradc help train)", .see_missing = true,
                   .defines = &a->defs, .positional = &a->model, .max_positional = 1, .npositional = &npos};
  int rc = flags_parse(&spec, argc, argv, 1);
  if (rc) return rc;
  a->kind = a->optimizer && strcmp(a->optimizer, "sgd") == 0 ? GRADC_SGD : GRADC_ADAMW;
  a->nan_skip = a->nan_policy && strcmp(a->nan_policy, "skip") == 0;
  a->bucket_bytes = tools_bucket_bytes(a->bucket_mb);
  if (!a->model) return tools_error("train needs a model file or artifact (see gradc help train)");
  if (!a->data) return tools_error("train needs --data DATA.safetensors (see gradc help data)");
  if (a->target && strcmp(a->target, "cpu") != 0 && strcmp(a->target, "ref") != 0 && !cli_is_cuda_target(a->target))
    return tools_error("unsupported --target '%s' (this build has: cpu, ref%s)", a->target, cli_cuda_targets());
  if (cli_is_cuda_target(a->target) && cli_need_device()) return 1;
  bool sgd = a->kind == GRADC_SGD;
  if (!sgd && (a->momentum_set || a->dampening_set || a->nesterov))
    return tools_error("--momentum, --dampening and --nesterov are options of --optimizer sgd");
  if (sgd && (a->beta1_set || a->beta2_set || a->eps_set))
    return tools_error("--beta1, --beta2 and --eps are options of --optimizer adamw");
  if (a->nesterov && (a->momentum <= 0 || a->dampening != 0))
    return tools_error("--nesterov needs --momentum > 0 and no dampening (as torch.optim.SGD)");
  if ((a->beta1_set && a->beta1 >= 1) || (a->beta2_set && a->beta2 >= 1))
    return tools_error("--beta1 and --beta2 must be below 1");
  if (a->cosine && a->schedule && strcmp(a->schedule, "cosine") != 0)
    return tools_error("--cosine and --schedule %s disagree; pass one", a->schedule);
  if (!a->schedule) a->schedule = a->cosine ? "cosine" : "constant";
  if (a->min_lr_set && strcmp(a->schedule, "constant") == 0)
    return tools_error("--min-lr applies to --schedule linear or cosine");
  if (a->init_partial && !a->init) return tools_error("--init-partial needs --init FILE");
  if (a->warmup > a->steps)
    return tools_error("--warmup %" PRId64 " is longer than --steps %" PRId64, a->warmup, a->steps);
  if (a->checkpoint_every && !a->checkpoint) return tools_error("--checkpoint-every needs --checkpoint FILE");
  if (a->init && a->resume) return tools_error("--init and --resume both set the params; pass one");
  if (a->val_every && !a->val_data) return tools_error("--val-every needs --val-data FILE");
  if (a->log && !ends_with(a->log, ".csv") && !ends_with(a->log, ".jsonl"))
    return tools_error("--log: '%s' should end in .csv or .jsonl", a->log);
  return 0;
}

/* ---- the dataset ---- */

typedef struct Feed { /* a program input and the dataset tensor that feeds it */
  const char *name;
  int index;       /* its tensor in the dataset */
  cli_tensor t;
  gradc_dtype dt;  /* as passed to gradc_session_set_input */
  bool batched;
  size_t row_bytes; /* batched: bytes per sample */
  int64_t window;   /* elements per window */
  char *buf;        /* one window (batched) */
} Feed;

typedef struct Data {
  cli_tensors *st;
  Feed *feed;
  int nfeed;
  int64_t n;   /* samples */
  int64_t b;   /* window size */
  int64_t wpe; /* windows per epoch */
  int64_t tokens_per_window;
  const char *unit; /* "tok/s" or "samples/s" */
  int64_t *perm;    /* this epoch's order */
  uint64_t key;     /* its shuffle seed */
  bool have_perm;
} Data;

static void data_free(Data *d) {
  for (int i = 0; i < d->nfeed; i++) free(d->feed[i].buf);
  free(d->feed);
  free(d->perm);
  cli_tensors_free(d->st);
}

/* Match the dataset's tensors to the program's inputs. */
static int data_open(Data *d, const char *path, const gradc_program *p) {
  memset(d, 0, sizeof *d);
  char err[1024];
  d->st = cli_tensors_new();
  if (!cli_tensors_read(d->st, path, err, sizeof err)) return tools_error("%s", err);
  int ni = gradc_program_num_inputs(p);
  d->feed = mem_calloc((size_t)(ni ? ni : 1), sizeof *d->feed);
  d->n = -1;
  d->unit = "samples/s";
  for (int i = 0; i < ni; i++) {
    gradc_tensor_info in;
    if (gradc_program_input_info(p, i, &in) != GRADC_OK) return cli_report(GRADC_ERR_INTERNAL);
    Feed *f = &d->feed[d->nfeed++];
    f->name = in.name;
    f->batched = in.batched && in.rank > 0;
    char want[160], got[160];
    shape_str(want, sizeof want, in.shape, in.rank, f->batched ? 1 : 0);
    f->index = cli_tensors_find(d->st, in.name);
    if (f->index < 0)
      return tools_error("%s: no tensor '%s' (the model's input %s : %s%s%s)", path, in.name, in.name,
                         cli_dtype_name(in.dtype), f->batched ? "[N]+" : "", want);
    f->t = cli_tensors_at(d->st, f->index);
    const cli_tensor *t = &f->t;
    bool is_int = in.dtype == GRADC_I32 || in.dtype == GRADC_I64;
    bool t_int = t->dtype == GRADC_I32 || t->dtype == GRADC_I64;
    bool t_low = t->dtype == GRADC_BF16 || t->dtype == GRADC_F16;
    f->dt = t_low ? GRADC_BF16 : t->dtype;
    bool shape_ok = t->rank == in.rank;
    for (int k = f->batched ? 1 : 0; shape_ok && k < in.rank; k++) shape_ok = t->shape[k] == in.shape[k];
    if (t_low || is_int != t_int || !shape_ok) {
      shape_str(got, sizeof got, t->shape, t->rank, 0);
      return tools_error("%s: tensor '%s': expected %s%s%s (%s), got %s%s", path, in.name,
                         is_int ? "I32 or I64" : "F32 or F64", f->batched ? "[N]+" : "", want,
                         f->batched ? "samples along the first axis" : "the input as it is",
                         cli_dtype_file_name(t->dtype), got);
    }
    int64_t per = 1;
    for (int k = f->batched ? 1 : 0; k < in.rank; k++) per *= in.shape[k];
    f->row_bytes = (size_t)per * cli_dtype_size(t->dtype);
    if (f->batched) {
      if (d->n >= 0 && t->shape[0] != d->n)
        return tools_error("%s: tensor '%s' has %" PRId64 " samples, tensor '%s' %" PRId64, path, in.name,
                           t->shape[0], d->feed[0].name, d->n);
      if (d->n < 0) {
        d->n = t->shape[0];
        d->b = in.shape[0];
      }
      f->window = per * in.shape[0];
      f->buf = mem_alloc(f->row_bytes * (size_t)in.shape[0] + 1);
      if (is_int && in.rank >= 2 && !d->tokens_per_window) {
        d->tokens_per_window = in.shape[0] * in.shape[1];
        d->unit = "tok/s";
      }
    } else {
      f->window = per;
    }
  }
  for (int i = 0; i < cli_tensors_count(d->st); i++) {
    bool used = false;
    for (int j = 0; j < d->nfeed; j++) used |= d->feed[j].index == i;
    if (!used) return tools_error("%s: tensor '%s' is not an input of the model", path, cli_tensors_at(d->st, i).name);
  }
  if (d->n < 0) { /* no batched input: every step sees the same data */
    d->n = d->b = 1;
  } else if (d->n < d->b) {
    return tools_error("%s: %" PRId64 " samples, fewer than one window of %" PRId64, path, d->n, d->b);
  }
  if (!d->tokens_per_window) d->tokens_per_window = d->b;
  d->wpe = d->n / d->b;
  d->perm = mem_alloc(sizeof(int64_t) * (size_t)d->n);
  return 0;
}

/* The epoch's order: a Fisher-Yates shuffle of 0..n-1 seeded by key. */
static void data_shuffle(Data *d, uint64_t key) {
  Rng r;
  rng_seed(&r, key);
  for (int64_t i = 0; i < d->n; i++) d->perm[i] = i;
  for (int64_t i = d->n - 1; i > 0; i--) {
    int64_t j = (int64_t)(((unsigned __int128)rng_next(&r) * (uint64_t)(i + 1)) >> 64);
    int64_t t = d->perm[i];
    d->perm[i] = d->perm[j];
    d->perm[j] = t;
  }
  d->key = key;
  d->have_perm = true;
}

/* Bind the window of step s (0-based) to the session. */
static int data_feed(Data *d, gradc_session *s, int64_t step) {
  int64_t w = step % d->wpe;
  if (w == 0) data_shuffle(d, gradc_session_rng_next(s));
  GRADC_ASSERT(d->have_perm);
  for (int i = 0; i < d->nfeed; i++) {
    Feed *f = &d->feed[i];
    const void *src = f->t.data;
    if (f->batched) {
      for (int64_t k = 0; k < d->b; k++)
        memcpy(f->buf + (size_t)k * f->row_bytes, (const char *)f->t.data + (size_t)d->perm[w * d->b + k] * f->row_bytes,
               f->row_bytes);
      src = f->buf;
    }
    gradc_status st = gradc_session_set_input(s, f->name, f->dt, src, (size_t)f->window);
    if (st != GRADC_OK) return cli_report(st);
  }
  return 0;
}

/* ---- checkpoints: the C API's file plus the data order ---- */

/* One atomic write holds everything --resume needs: the API's params,
 * optimiser state, step and generator, and the data order's keys, so a
 * reader sees the previous checkpoint or the whole new one. */
static int save_checkpoint(gradc_session *s, const char *path, const Data *d) {
  char key[32], samples[32], window[32];
  snprintf(key, sizeof key, "%016" PRIx64, d->key);
  snprintf(samples, sizeof samples, "%" PRId64, d->n);
  snprintf(window, sizeof window, "%" PRId64, d->b);
  const char *keys[] = {"train.epoch_key", "train.samples", "train.window"};
  const char *values[] = {key, samples, window};
  /* --zero1: every rank sends rank 0 its optimiser state; rank 0 writes. */
  gradc_status st = gradc_session_save_checkpoint_meta(s, path, 3, keys, values);
  return st == GRADC_OK ? 0 : cli_report(st);
}

static void removed_temp(const char *file, long pid, void *ctx) {
  (void)ctx;
  fprintf(stderr, "removed %s, the temporary of a write that did not finish (process %ld is gone)\n", file, pid);
}

/* Temporaries that a killed run left beside this run's outputs. */
static void remove_dead_temps(const TrainArgs *a) {
  const char *outs[] = {a->checkpoint, a->params_out, a->plot};
  for (size_t i = 0; i < sizeof outs / sizeof *outs; i++)
    if (outs[i]) remove_stale_temps(outs[i], removed_temp, NULL);
}

/* Resume: the API restores params, optimiser state, step and generator;
 * a checkpoint taken mid-epoch also needs that epoch's shuffle seed. */
static int load_checkpoint(gradc_session *s, const char *path, Data *d) {
  cli_tensors *f = cli_tensors_new();
  char err[1024];
  if (!cli_tensors_read(f, path, err, sizeof err)) {
    cli_tensors_free(f);
    return tools_error("%s", err);
  }
  gradc_status st = gradc_session_load_checkpoint(s, path);
  if (st != GRADC_OK) {
    cli_tensors_free(f);
    return cli_report(st);
  }
  int rc = 0;
  int64_t step = gradc_session_step_count(s);
  if (step % d->wpe != 0) {
    const char *key = cli_tensors_meta(f, "train.epoch_key"), *n = cli_tensors_meta(f, "train.samples"),
               *b = cli_tensors_meta(f, "train.window");
    char *end = NULL;
    uint64_t k = key ? strtoull(key, &end, 16) : 0;
    if (!key || !end || *end || !n || !b)
      rc = tools_error("%s: checkpoint at step %" PRId64 " (mid-epoch) has no data order (train.epoch_key); "
                       "it was not written by gradc train",
                       path, step);
    else if (strtoll(n, NULL, 10) != d->n || strtoll(b, NULL, 10) != d->b)
      rc = tools_error("%s: checkpoint was taken mid-epoch on %s samples in windows of %s; --data has %" PRId64
                       " in windows of %" PRId64 ", so the data order cannot continue",
                       path, n, b, d->n, d->b);
    else
      data_shuffle(d, k);
  }
  cli_tensors_free(f);
  return rc;
}

/* ---- the log and the loss history ---- */

typedef struct History {
  int nl;           /* losses + total */
  int64_t n, cap;
  double *step;     /* [cap] */
  double **loss;    /* [nl][cap] */
} History;

static void hist_push(History *h, int64_t step, const double *loss) {
  if (h->n == h->cap) {
    h->cap = h->cap ? 2 * h->cap : 256;
    h->step = mem_realloc(h->step, sizeof(double) * (size_t)h->cap);
    for (int i = 0; i < h->nl; i++) {
      h->loss[i] = mem_realloc(h->loss[i], sizeof(double) * (size_t)h->cap);
    }
  }
  h->step[h->n] = (double)step;
  for (int i = 0; i < h->nl; i++) h->loss[i][h->n] = loss[i];
  h->n++;
}

typedef struct Log {
  FILE *out;
  bool jsonl;
  bool val;            /* --val-data: val_ columns after elapsed_s (empty in rows without a val run) */
  const char **col;    /* loss column names (CSV) */
  double elapsed0;     /* elapsed_s of the last row kept from a resumed log */
  const gradc_session *scaler; /* --precision f16: loss_scale and skipped columns from it */
} Log;

static bool reserved_column(const char *name) {
  return strcmp(name, "step") == 0 || strcmp(name, "lr") == 0 || strcmp(name, "grad_norm") == 0 ||
         strcmp(name, "elapsed_s") == 0 || strcmp(name, "total") == 0 || strcmp(name, "loss_scale") == 0 ||
         strcmp(name, "skipped") == 0;
}

static void csv_header(StrBuf *sb, const gradc_program *p, const char **col, bool val) {
  sb_puts(sb, "step,lr");
  for (int i = 0; i < gradc_program_num_losses(p); i++) sb_printf(sb, ",%s", col[i]);
  sb_puts(sb, ",total,grad_norm,elapsed_s");
  for (int i = 0; val && i < gradc_program_num_losses(p); i++) sb_printf(sb, ",val_%s", col[i]);
  if (val) sb_puts(sb, ",val_total");
  if (strcmp(gradc_program_precision(p), "f16") == 0) sb_puts(sb, ",loss_scale,skipped");
}

/* A kept row's val figures (nl of them, the total last): *has_val when
 * the row has them.  CSV: the fields after elapsed_s at q (",v,..." or
 * ",,..."); JSON lines: the "val" object of j. */
static void parse_val_csv(const char *q, int nl, double *val, bool *has_val) {
  *has_val = false;
  for (int i = 0; i < nl && *q == ','; i++) {
    char *end;
    val[i] = strtod(q + 1, &end);
    if (end == q + 1) return; /* empty: no val run at this step */
    q = end;
    *has_val = i == nl - 1;
  }
}

static void parse_val_json(const cJSON *j, int nl, double *val, bool *has_val) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, "val");
  *has_val = cJSON_IsObject(v) && cJSON_GetArraySize(v) == nl;
  int i = 0;
  for (const cJSON *c = *has_val ? v->child : NULL; c; c = c->next) val[i++] = cJSON_IsNumber(c) ? c->valuedouble : NAN;
}

/* A kept line of an earlier log: its step and losses, or false. */
static bool parse_row(const Log *lg, const char *line, int nl, int64_t *step, double *loss, double *elapsed,
                      double *val, bool *has_val) {
  *has_val = false;
  if (lg->jsonl) {
    cJSON *j = cJSON_Parse(line);
    if (!j) return false;
    cJSON *s = cJSON_GetObjectItemCaseSensitive(j, "step"), *ls = cJSON_GetObjectItemCaseSensitive(j, "losses"),
          *t = cJSON_GetObjectItemCaseSensitive(j, "total"), *e = cJSON_GetObjectItemCaseSensitive(j, "elapsed_s");
    bool ok = cJSON_IsNumber(s) && cJSON_IsObject(ls) && cJSON_GetArraySize(ls) == nl - 1;
    if (ok) {
      *step = (int64_t)s->valuedouble;
      int i = 0;
      for (cJSON *c = ls->child; c; c = c->next) loss[i++] = cJSON_IsNumber(c) ? c->valuedouble : NAN;
      loss[nl - 1] = cJSON_IsNumber(t) ? t->valuedouble : NAN;
      *elapsed = cJSON_IsNumber(e) ? e->valuedouble : 0;
      if (lg->val) parse_val_json(j, nl, val, has_val);
    }
    cJSON_Delete(j);
    return ok;
  }
  char *end;
  *step = strtoll(line, &end, 10);
  if (end == line || *end != ',') return false;
  const char *q = end + 1;
  strtod(q, &end); /* lr */
  for (int i = 0; i < nl; i++) {
    if (*end != ',') return false;
    q = end + 1;
    loss[i] = strtod(q, &end);
  }
  if (*end != ',') return false;
  strtod(end + 1, &end); /* grad_norm */
  if (*end != ',') return false;
  *elapsed = strtod(end + 1, &end);
  if (lg->val) parse_val_csv(end, nl, val, has_val);
  return true;
}

/* Open the log.  When resuming, rows up to the checkpoint's step are kept
 * (and go into the history for the plot); later ones are dropped. */
static int log_open(Log *lg, const char *path, const gradc_program *p, bool resume, int64_t step0, History *h,
                    bool val, History *vh) {
  memset(lg, 0, sizeof *lg);
  lg->jsonl = ends_with(path, ".jsonl");
  lg->val = val;
  int nl = gradc_program_num_losses(p);
  lg->col = mem_calloc((size_t)(nl ? nl : 1), sizeof *lg->col);
  for (int i = 0; i < nl; i++) {
    const char *name = gradc_program_loss_name(p, i);
    if (reserved_column(name)) {
      char *c = mem_alloc(strlen(name) + 6);
      sprintf(c, "loss_%s", name);
      lg->col[i] = c;
    } else {
      lg->col[i] = mem_strdup(name);
    }
  }
  StrBuf header, kept;
  sb_init(&header);
  sb_init(&kept);
  csv_header(&header, p, lg->col, val);
  if (resume) {
    const char *err;
    char *old = read_file(path, NULL, &err);
    if (old) {
      double *loss = mem_alloc(sizeof(double) * (size_t)(nl + 1)), *vloss = mem_alloc(sizeof(double) * (size_t)(nl + 1));
      char *save = NULL;
      bool first = true, compatible = true;
      for (char *line = strtok_r(old, "\n", &save); line && compatible; line = strtok_r(NULL, "\n", &save), first = false) {
        if (!lg->jsonl && first) {
          compatible = strcmp(line, sb_str(&header)) == 0;
          continue;
        }
        int64_t step;
        double elapsed;
        bool has_val;
        if (!parse_row(lg, line, nl + 1, &step, loss, &elapsed, vloss, &has_val)) {
          compatible = false;
        } else if (step <= step0) {
          sb_printf(&kept, "%s\n", line);
          hist_push(h, step, loss);
          if (has_val) hist_push(vh, step, vloss);
          lg->elapsed0 = elapsed;
        }
      }
      if (!compatible) {
        warning("%s: not a log of this model; starting it afresh", path);
        sb_free(&kept);
        sb_init(&kept);
        h->n = 0;
        vh->n = 0;
        lg->elapsed0 = 0;
      }
      free(loss);
      free(vloss);
      free(old);
    }
  }
  lg->out = fopen(path, "w");
  if (!lg->out) {
    sb_free(&header);
    sb_free(&kept);
    return tools_error("%s: %s", path, strerror(errno));
  }
  if (!lg->jsonl) fprintf(lg->out, "%s\n", sb_str(&header));
  fputs(sb_str(&kept), lg->out);
  fflush(lg->out);
  sb_free(&header);
  sb_free(&kept);
  return 0;
}

static void put_num(FILE *out, double v, bool json) {
  char buf[64];
  if (json && !isfinite(v)) {
    fputs("null", out);
    return;
  }
  fmt_double(buf, sizeof buf, v);
  fputs(buf, out);
}

/* val: the val run's losses and total at this step, or NULL. */
static void log_row(Log *lg, const gradc_program *p, int64_t step, double lr, const double *loss, double grad_norm,
                    double elapsed, const double *val) {
  if (!lg->out) return;
  int nl = gradc_program_num_losses(p);
  FILE *o = lg->out;
  if (lg->jsonl) {
    fprintf(o, "{\"step\":%" PRId64 ",\"lr\":", step);
    put_num(o, lr, true);
    fputs(",\"losses\":{", o);
    for (int i = 0; i < nl; i++) {
      fprintf(o, "%s\"%s\":", i ? "," : "", gradc_program_loss_name(p, i));
      put_num(o, loss[i], true);
    }
    fputs("},\"total\":", o);
    put_num(o, loss[nl], true);
    fputs(",\"grad_norm\":", o);
    put_num(o, grad_norm, true);
    fputs(",\"elapsed_s\":", o);
    put_num(o, elapsed, true);
    if (val) {
      fputs(",\"val\":{", o);
      for (int i = 0; i <= nl; i++) {
        fprintf(o, "%s\"%s\":", i ? "," : "", i < nl ? gradc_program_loss_name(p, i) : "total");
        put_num(o, val[i], true);
      }
      fputc('}', o);
    }
    if (lg->scaler) {
      fputs(",\"loss_scale\":", o);
      put_num(o, gradc_session_loss_scale(lg->scaler), true);
      fprintf(o, ",\"skipped\":%" PRId64, gradc_session_skipped_steps(lg->scaler));
    }
    fputs("}\n", o);
  } else {
    fprintf(o, "%" PRId64 ",", step);
    put_num(o, lr, false);
    for (int i = 0; i <= nl; i++) {
      fputc(',', o);
      put_num(o, loss[i], false);
    }
    fputc(',', o);
    put_num(o, grad_norm, false);
    fputc(',', o);
    put_num(o, elapsed, false);
    for (int i = 0; lg->val && i <= nl; i++) {
      fputc(',', o);
      if (val) put_num(o, val[i], false);
    }
    if (lg->scaler) {
      fputc(',', o);
      put_num(o, gradc_session_loss_scale(lg->scaler), false);
      fprintf(o, ",%" PRId64, gradc_session_skipped_steps(lg->scaler));
    }
    fputc('\n', o);
  }
  fflush(o);
}

static int log_close(Log *lg, const char *path, int nl) {
  int rc = 0;
  if (lg->out && (ferror(lg->out) | fclose(lg->out))) rc = tools_error("%s: %s", path, strerror(errno ? errno : EIO));
  if (lg->col)
    for (int i = 0; i < nl; i++) free((void *)lg->col[i]);
  free(lg->col);
  return rc;
}

/* vh: the val runs' losses (--val-data), drawn as one more line, or NULL. */
static int write_plot(const char *path, const char *title, const gradc_program *p, const History *h,
                      const History *vh) {
  int nl = gradc_program_num_losses(p), ns = nl + 1;
  PlotSeries *s = mem_calloc((size_t)nl + 2, sizeof *s);
  for (int i = 0; i <= nl; i++)
    s[i] = (PlotSeries){i < nl ? gradc_program_loss_name(p, i) : "total", h->step, h->loss[i], (int)h->n, i == nl};
  if (vh && vh->n) s[ns++] = (PlotSeries){"val total", vh->step, vh->loss[nl], (int)vh->n, false};
  char err[1024];
  char head[512];
  snprintf(head, sizeof head, "%s: training loss%s", title, vh ? " and val loss" : "");
  int rc = plot_svg(path, head, "step", "loss", s, ns, err, sizeof err) ? 0 : tools_error("%s", err);
  free(s);
  return rc;
}

/* ---- progress ---- */

static void fmt_duration(char *buf, size_t n, double s) {
  if (!isfinite(s) || s < 0) s = 0;
  long t = (long)(s + 0.5);
  if (t >= 3600)
    snprintf(buf, n, "%ld:%02ld:%02ld", t / 3600, t / 60 % 60, t % 60);
  else
    snprintf(buf, n, "%ld:%02ld", t / 60, t % 60);
}

static void fmt_rate(char *buf, size_t n, double r) {
  if (r >= 1e6)
    snprintf(buf, n, "%.2fM", r / 1e6);
  else if (r >= 1e4)
    snprintf(buf, n, "%.1fk", r / 1e3);
  else
    snprintf(buf, n, "%.0f", r);
}

typedef struct Progress {
  bool tty;
  int64_t every;
  int64_t first, total; /* steps of this run: (first, total] */
  double t0;
  const char *unit;
  int64_t per_window;
  double drawn; /* when the terminal line was last redrawn */
  const int64_t *skipped; /* --nan-policy skip: steps skipped so far */
  gradc_session *scaler;  /* --precision f16: the session whose loss scale and overflow skips are shown */
} Progress;

static void progress(Progress *pr, const gradc_program *p, int64_t step, const double *loss, double lr,
                     double grad_norm, bool last) {
  double now = now_s();
  bool due = last || step == pr->first + 1;
  if (pr->tty)
    due |= now - pr->drawn >= 0.1; /* at most 10 redraws a second */
  else
    due |= (step - pr->first) % pr->every == 0;
  if (!due) return;
  pr->drawn = now;
  int nl = gradc_program_num_losses(p);
  double el = now - pr->t0, per = el / (double)(step - pr->first);
  char rate[32], eta[32], elapsed[32];
  fmt_rate(rate, sizeof rate, (double)pr->per_window / (per > 0 ? per : 1e-9));
  fmt_duration(eta, sizeof eta, per * (double)(pr->total - step));
  fmt_duration(elapsed, sizeof elapsed, el);
  StrBuf sb;
  sb_init(&sb);
  int digits = snprintf(NULL, 0, "%" PRId64, pr->total);
  sb_printf(&sb, "step %*" PRId64 "/%" PRId64, digits, step, pr->total);
  if (pr->tty) {
    enum { BAR = 24 };
    int fill = (int)((double)BAR * (double)step / (double)pr->total);
    sb_puts(&sb, " [");
    for (int i = 0; i < BAR; i++) sb_putc(&sb, i < fill ? '#' : '.');
    sb_puts(&sb, "]");
  }
  sb_printf(&sb, " loss %.4f", loss[nl]);
  if (nl > 1 || (nl == 1 && strcmp(gradc_program_loss_name(p, 0), "total") != 0)) {
    sb_puts(&sb, " (");
    for (int i = 0; i < nl; i++) sb_printf(&sb, "%s%s %.4f", i ? ", " : "", gradc_program_loss_name(p, i), loss[i]);
    sb_puts(&sb, ")");
  }
  if (!pr->tty) sb_printf(&sb, " lr %.3g grad_norm %.3g", lr, grad_norm);
  if (pr->skipped && *pr->skipped) sb_printf(&sb, " skipped %" PRId64, *pr->skipped);
  if (pr->scaler) {
    if (!pr->tty) sb_printf(&sb, " loss_scale %g", gradc_session_loss_scale(pr->scaler));
    int64_t n = gradc_session_skipped_steps(pr->scaler);
    if (n) sb_printf(&sb, " overflow-skipped %" PRId64, n);
  }
  sb_printf(&sb, " | %s %s | %s %s", rate, pr->unit, last ? "took" : "ETA", last ? elapsed : eta);
  if (pr->tty) {
    struct winsize ws;
    size_t cols = ioctl(STDERR_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0 ? ws.ws_col : 100;
    const char *line = sb_str(&sb);
    size_t len = strlen(line);
    if (len >= cols) len = cols - 1;
    fprintf(stderr, "\r%.*s\033[K%s", (int)len, line, last ? "\n" : "");
  } else {
    fprintf(stderr, "%s\n", sb_str(&sb));
  }
  fflush(stderr);
  sb_free(&sb);
}

static volatile sig_atomic_t interrupted;
static void on_interrupt(int sig) { interrupted = sig; }

/* ---- the loop ---- */

static int open_program(const TrainArgs *a, gradc_program **p) {
  gradc_status st;
  if (!cli_is_artifact(a->model)) {
    gradc_compile_options o;
    gradc_compile_options_init(&o);
    o.gas = a->gas;
    if (a->target) o.target = a->target;
    o.threads = a->threads;
    o.def_names = a->defs.name;
    o.def_values = a->defs.value;
    o.ndefs = a->defs.n;
    o.no_cache = a->no_cache;
    o.no_outputs = 1; /* training reads the losses, never the window's outputs */
    o.dp = a->dp;
    o.tp = a->tp;
    o.sequence_parallel = a->sequence_parallel;
    o.no_overlap = a->no_overlap;
    o.bucket_bytes = a->bucket_bytes;
    o.zero1 = a->zero1;
    o.precision = a->precision;
    st = gradc_program_compile_file(a->model, &o, p);
    return st == GRADC_OK ? 0 : cli_report(st);
  }
  if (a->defs.n || a->target)
    return tools_error("%s: an artifact fixes its sizes and target; -D and --target apply to model source", a->model);
  st = gradc_program_load(a->model, p);
  if (st != GRADC_OK) return cli_report(st);
  if (a->gas_set && a->gas != gradc_program_gas(*p))
    return tools_error("%s: the artifact was compiled for --gas %d, not %d", a->model, gradc_program_gas(*p), a->gas);
  if (a->precision && strcmp(a->precision, gradc_program_precision(*p)) != 0)
    return tools_error("%s: the artifact was compiled for --precision %s, not %s", a->model,
                       gradc_program_precision(*p), a->precision);
  if (a->dp_set && a->dp != gradc_program_dp(*p))
    return tools_error("%s: the artifact was compiled for --dp %d, not %d", a->model, gradc_program_dp(*p), a->dp);
  if (a->tp_set && a->tp != gradc_program_tp(*p))
    return tools_error("%s: the artifact was compiled for --tp %d, not %d", a->model, gradc_program_tp(*p), a->tp);
  return 0;
}

/* --lr, else torch's AdamW default (1e-3; also SGD's here, which has none). */
static double lr_peak(const TrainArgs *a) { return a->lr_set ? a->lr : 1e-3; }

static int set_optimizer(const TrainArgs *a, gradc_session *s) {
  gradc_optimizer_options o;
  gradc_optimizer_options_init(&o, a->kind);
  o.lr = lr_peak(a);
  if (a->momentum_set) o.momentum = a->momentum;
  if (a->dampening_set) o.dampening = a->dampening;
  o.nesterov = a->nesterov;
  if (a->beta1_set) o.beta1 = a->beta1;
  if (a->beta2_set) o.beta2 = a->beta2;
  if (a->eps_set) o.eps = a->eps;
  if (a->wd_set) o.weight_decay = a->weight_decay;
  o.clip_norm = a->clip;
  o.warmup_steps = a->warmup;
  o.schedule = strcmp(a->schedule, "linear") == 0   ? GRADC_SCHEDULE_LINEAR
               : strcmp(a->schedule, "cosine") == 0 ? GRADC_SCHEDULE_COSINE
                                                    : GRADC_SCHEDULE_CONSTANT;
  o.total_steps = o.schedule == GRADC_SCHEDULE_CONSTANT ? 0 : a->steps;
  o.min_lr = a->min_lr;
  o.no_decay_1d = !a->decay_1d;
  o.no_decay = a->no_decay;
  gradc_status st = gradc_session_set_optimizer(s, &o);
  return st == GRADC_OK ? 0 : cli_report(st);
}

static const char *base_name(const char *path) {
  const char *slash = strrchr(path, '/');
  return slash ? slash + 1 : path;
}

/* ---- the run: open, announce, step, finish, close ---- */

/* One `gradc train` run: what its phases share. */
typedef struct Run {
  const TrainArgs *a;
  gradc_program *p;
  gradc_session *s;
  Data d;
  Log lg;
  History h;
  double *loss; /* [nl + 1]: the last step's losses and their total */
  int nl;
  bool lead;    /* rank 0 of a distributed run (or the only process) prints and writes */
  bool zero1;   /* the program's ZeRO-1 (from the flag or the artifact): checkpoints are collective */
  int64_t step0, end, step; /* where this run starts, where it stops, where it is */
  double t0;    /* when the first step started */
  double first_loss, last_loss;
  int64_t skipped;   /* --nan-policy skip: steps whose update was not applied */
  bool f16;          /* --precision f16: a loss scale, and steps skipped for its overflows */
  int64_t ckpt_step; /* the step of the last checkpoint this run wrote, or -1 */
  bool above_max;    /* --max-loss: the last step's loss was above it */
  EvalSet *val;      /* --val-data (rank 0): the dataset as one forward-only window, or NULL */
  History vh;        /* the val runs' losses and totals */
  double *val_loss;  /* [nl + 1]: the last val run's */
} Run;

static uint64_t real_bits(double d) {
  uint64_t v;
  memcpy(&v, &d, sizeof v);
  return v;
}

static uint64_t str_hash(const char *s) { return s ? hash_str(s) : 0; }

/* A distributed run: every rank was started with rank 0's model, flags and
 * dataset (before any other collective, so that ranks that differ stop
 * with a message instead of waiting for each other), and, once the params
 * are set, holds rank 0's step and params. */
static int agree_ranks(Run *r, bool params) {
  const TrainArgs *a = r->a;
  const gradc_program *p = r->p;
  const cli_agree_item items[] = {
      {"--steps", CLI_AGREE_INT, (uint64_t)a->steps},
      {"--stop-after", CLI_AGREE_INT, (uint64_t)a->stop_after},
      {"--zero1", CLI_AGREE_FLAG, r->zero1},
      {"--bucket-mb", CLI_AGREE_INT, (uint64_t)a->bucket_bytes},
      {"--gas", CLI_AGREE_INT, (uint64_t)gradc_program_gas(p)},
      {"--target", CLI_AGREE_HASH, str_hash(cli_program_target(p))},
      {"the model (its text, -D sizes, --dp, --tp)", CLI_AGREE_HASH, cli_program_hash(p)},
      {"--data (the dataset's tensors)", CLI_AGREE_HASH, cli_tensors_hash(r->d.st)},
      {"--seed", CLI_AGREE_INT, a->seed},
      {"--optimizer", CLI_AGREE_INT, (uint64_t)a->kind},
      {"--lr", CLI_AGREE_REAL, real_bits(a->lr_set ? a->lr : NAN)},
      {"--momentum", CLI_AGREE_REAL, real_bits(a->momentum)},
      {"--dampening", CLI_AGREE_REAL, real_bits(a->dampening)},
      {"--nesterov", CLI_AGREE_FLAG, a->nesterov},
      {"--beta1", CLI_AGREE_REAL, real_bits(a->beta1_set ? a->beta1 : NAN)},
      {"--beta2", CLI_AGREE_REAL, real_bits(a->beta2_set ? a->beta2 : NAN)},
      {"--eps", CLI_AGREE_REAL, real_bits(a->eps_set ? a->eps : NAN)},
      {"--weight-decay", CLI_AGREE_REAL, real_bits(a->wd_set ? a->weight_decay : NAN)},
      {"--clip", CLI_AGREE_REAL, real_bits(a->clip)},
      {"--warmup", CLI_AGREE_INT, (uint64_t)a->warmup},
      {"--schedule", CLI_AGREE_HASH, str_hash(a->schedule)},
      {"--min-lr", CLI_AGREE_REAL, real_bits(a->min_lr)},
      {"--no-decay", CLI_AGREE_HASH, str_hash(a->no_decay)},
      {"--decay-1d", CLI_AGREE_FLAG, a->decay_1d},
      {"--checkpoint-every", CLI_AGREE_INT, (uint64_t)a->checkpoint_every},
      {"--nan-policy", CLI_AGREE_FLAG, a->nan_skip},
  };
  return cli_agree(r->s, items, (int)(sizeof items / sizeof *items), params);
}

/* The program, the dataset, a session with its optimiser and params (from
 * --resume, --init or the declared init), and the log. */
static int run_open(Run *r) {
  const TrainArgs *a = r->a;
  int rc = open_program(a, &r->p);
  if (rc || (rc = cli_check_ranks(r->p))) return rc;
  gradc_program *p = r->p;
  r->zero1 = gradc_program_zero1(p) != 0;
  r->nl = gradc_program_num_losses(p);
  r->h.nl = r->nl + 1;
  r->h.loss = mem_calloc((size_t)r->h.nl, sizeof *r->h.loss);
  r->loss = mem_calloc((size_t)r->h.nl, sizeof *r->loss);
  if ((rc = data_open(&r->d, a->data, p))) return rc;
  r->vh.nl = r->h.nl;
  r->vh.loss = mem_calloc((size_t)r->vh.nl, sizeof *r->vh.loss);
  r->val_loss = mem_calloc((size_t)r->vh.nl, sizeof *r->val_loss);
  /* A target out of range is named by its sample in --data, before the first step. */
  if ((rc = cli_check_dataset_indices(p, r->d.st, a->data))) return rc;

  gradc_status st = gradc_session_new(p, &r->s);
  if (st != GRADC_OK) return cli_report(st);
  gradc_session *s = r->s;
  r->lead = gradc_session_rank(s) == 0;
  if ((rc = agree_ranks(r, false))) return rc;
  if (r->lead) remove_dead_temps(a);
  if (a->trace && (st = gradc_session_trace(s)) != GRADC_OK) return cli_report(st);
  if ((rc = set_optimizer(a, s))) return rc;
  r->f16 = strcmp(gradc_program_precision(p), "f16") == 0;
  if (!r->f16 && (a->init_scale || a->scale_window || a->scale_hysteresis))
    return tools_error("--init-scale, --scale-window and --scale-hysteresis are options of --precision f16");
  if (r->f16) {
    gradc_loss_scale_options ls;
    gradc_loss_scale_options_init(&ls);
    if (a->init_scale) ls.init_scale = a->init_scale;
    if (a->scale_window) ls.window = a->scale_window;
    if (a->scale_hysteresis) ls.hysteresis = a->scale_hysteresis;
    if ((st = gradc_session_set_loss_scaling(s, &ls)) != GRADC_OK) return cli_report(st);
  }
  /* The data order's generator is seeded apart from the params' init, so
   * the two draw different streams from one --seed. */
  gradc_session_rng_seed(s, a->seed ^ 0x5851f42d4c957f2dull);
  /* The random draws: --seed at each optimiser step (a checkpoint keeps both). */
  gradc_session_set_draws(s, a->seed, 0);
  if (a->resume) {
    rc = load_checkpoint(s, a->resume, &r->d);
  } else if (a->init && a->init_partial) { /* the rest as declared */
    int n = 0;
    st = gradc_session_init_params(s, a->seed);
    if (st == GRADC_OK) st = gradc_session_load_params_partial(s, a->init, &n);
    rc = st == GRADC_OK ? 0 : cli_report(st);
    if (!rc && r->lead)
      fprintf(stderr, "%s: %d of %d params; the others initialised as declared\n", a->init, n,
              gradc_program_num_params(p));
  } else if (a->init) {
    st = gradc_session_load_params(s, a->init);
    bool missing = st != GRADC_OK && strstr(gradc_last_error(), "missing tensor");
    rc = st == GRADC_OK ? 0 : cli_report(st);
    if (missing) fprintf(stderr, "gradc: note: --init-partial takes a file with some of the params\n");
  } else {
    st = gradc_session_init_params(s, a->seed);
    rc = st == GRADC_OK ? 0 : cli_report(st);
  }
  if (rc || (rc = agree_ranks(r, true))) return rc;

  r->step0 = r->step = gradc_session_step_count(s);
  r->end = a->steps;
  if (a->stop_after && r->step0 + a->stop_after < r->end) r->end = r->step0 + a->stop_after;
  /* --val-data: rank 0 alone runs it (the params are the same on every rank). */
  if (a->val_data && r->lead && (rc = eval_open(&r->val, p, NULL, a->val_data))) return rc;
  if (a->log && r->lead) {
    rc = log_open(&r->lg, a->log, p, a->resume != NULL, r->step0, &r->h, a->val_data != NULL, &r->vh);
    if (r->f16) r->lg.scaler = s;
    return rc;
  }
  return 0;
}

/* The run's one line on stderr: model, params, dataset, optimiser, ranks. */
static void announce(const Run *r) {
  const TrainArgs *a = r->a;
  const gradc_program *p = r->p;
  int64_t nparams = 0;
  for (int i = 0; i < gradc_program_num_params(p); i++) {
    gradc_tensor_info pi;
    if (gradc_program_param_info(p, i, &pi) != GRADC_OK) continue;
    int64_t n = 1;
    for (int k = 0; k < pi.rank; k++) n *= pi.shape[k];
    nparams += n;
  }
  fprintf(stderr, "training %s: %" PRId64 " params; %s: %" PRId64 " samples, %" PRId64 " windows of %" PRId64
                  " per epoch, K=%d; %s lr %g",
          base_name(a->model), nparams, base_name(a->data), r->d.n, r->d.wpe, r->d.b, gradc_program_gas(p),
          a->kind == GRADC_SGD ? "sgd" : "adamw", lr_peak(a));
  if (gradc_program_dp(p) > 1) fprintf(stderr, ", %d data-parallel ranks", gradc_program_dp(p));
  if (gradc_program_tp(p) > 1) fprintf(stderr, ", %d tensor-parallel ranks", gradc_program_tp(p));
  if (r->zero1) fprintf(stderr, ", ZeRO-1");
  if (a->warmup) fprintf(stderr, ", warm-up %" PRId64, a->warmup);
  if (strcmp(a->schedule, "constant") != 0) fprintf(stderr, ", %s to %g at step %" PRId64, a->schedule, a->min_lr, a->steps);
  if (r->step0) fprintf(stderr, "; resuming at step %" PRId64, r->step0);
  fprintf(stderr, "\n");
  if (r->val)
    fprintf(stderr, "val %s: %" PRId64 " samples as one forward-only window (%d micro-batches of %" PRId64 "), %s\n",
            base_name(a->val_data), eval_samples(r->val), eval_gas(r->val), eval_micro(r->val),
            a->val_every ? "every --val-every steps and after the last" : "after the last step");

}

/* Is the window just run unusable (a loss or the gradient norm not
 * finite)?  What is wrong, naming the loss terms, into why. */
static bool nonfinite_window(const Run *r, const double *loss, double grad_norm, char *why, size_t n) {
  StrBuf sb;
  sb_init(&sb);
  int bad = 0;
  for (int i = 0; i < r->nl; i++)
    if (!isfinite(loss[i]))
      sb_printf(&sb, "%sloss '%s' is %s", bad++ ? ", " : "", gradc_program_loss_name(r->p, i),
                isnan(loss[i]) ? "nan" : loss[i] > 0 ? "inf" : "-inf");
  if (!bad && !isfinite(loss[r->nl]))
    sb_printf(&sb, "the total loss is %s", isnan(loss[r->nl]) ? "nan" : "inf"), bad++;
  if (!bad && !isfinite(grad_norm))
    sb_printf(&sb, "the gradient norm is %s (loss %g)", isnan(grad_norm) ? "nan" : "inf", loss[r->nl]), bad++;
  snprintf(why, n, "%s", sb_str(&sb));
  sb_free(&sb);
  return bad > 0;
}

/* --max-loss: warn when a loss rises above the bound (once per excursion). */
static void check_max_loss(Run *r, const double *loss) {
  if (!r->a->max_loss_set || !r->lead) return;
  int over = -1;
  for (int i = 0; i <= r->nl && over < 0; i++)
    if (loss[i] > r->a->max_loss) over = i;
  if (over >= 0 && !r->above_max)
    warning("step %" PRId64 ": %s%s%s is %g, above --max-loss %g", r->step + 1, over < r->nl ? "loss '" : "the total loss",
            over < r->nl ? gradc_program_loss_name(r->p, over) : "", over < r->nl ? "'" : "", loss[over], r->a->max_loss);
  r->above_max = over >= 0;
}

/* After a non-finite stop: the checkpoint keeps the last good state.  When
 * the session's state is still finite (the step was not taken), it is
 * written now; else the checkpoint already on disk is that state. */
static int keep_last_good(Run *r, bool state_good) {
  const TrainArgs *a = r->a;
  if (!a->checkpoint) {
    if (r->lead) fprintf(stderr, "no checkpoint: --checkpoint was not given\n");
    return 1;
  }
  if (state_good && (r->lead || r->zero1)) {
    if (save_checkpoint(r->s, a->checkpoint, &r->d)) return 1;
    if (r->lead) fprintf(stderr, "checkpoint (step %" PRId64 ", the last good state): %s\n", r->step, a->checkpoint);
    return 1;
  }
  if (!r->lead) return 1;
  if (r->ckpt_step >= 0)
    fprintf(stderr, "checkpoint: %s keeps step %" PRId64 ", the last good state\n", a->checkpoint, r->ckpt_step);
  else if (access(a->checkpoint, F_OK) == 0)
    fprintf(stderr, "checkpoint: %s is left as it was (this run wrote none before step %" PRId64 ")\n",
            a->checkpoint, r->step + 1);
  else
    fprintf(stderr, "no checkpoint: none was due before step %" PRId64 " (see --checkpoint-every)\n", r->step + 1);
  return 1;
}

/* --val-data after step (every --val-every steps and at the run's last):
 * the losses over the whole val dataset on stderr and into the history;
 * *out the figures for the log row, or NULL when none was due. */
static int val_run(Run *r, int64_t step, bool tty, const double **out) {
  *out = NULL;
  if (!r->val || !(step == r->end || (r->a->val_every && step % r->a->val_every == 0))) return 0;
  int rc = eval_run_session(r->val, r->s, r->val_loss);
  if (rc) return rc;
  StrBuf sb;
  sb_init(&sb);
  sb_printf(&sb, "val step %" PRId64 ":", step);
  for (int i = 0; i < r->nl; i++) sb_printf(&sb, " loss %s %.6g", gradc_program_loss_name(r->p, i), r->val_loss[i]);
  sb_printf(&sb, " loss total %.6g", r->val_loss[r->nl]);
  fprintf(stderr, "%s%s\n", tty ? "\r\033[K" : "", sb_str(&sb)); /* a progress bar is redrawn below it */
  sb_free(&sb);
  hist_push(&r->vh, step, r->val_loss);
  *out = r->val_loss;
  return 0;
}

/* A step that was counted without its update (an f16 overflow, or
 * --nan-policy skip): logged, reported and checkpointed as any other,
 * without a val run. */
static int after_skipped_step(Run *r, Progress *pr, double lr, const double *loss, double grad_norm) {
  const TrainArgs *a = r->a;
  r->step = gradc_session_step_count(r->s);
  log_row(&r->lg, r->p, r->step, lr, loss, grad_norm, r->lg.elapsed0 + now_s() - r->t0, NULL);
  if (r->lead) progress(pr, r->p, r->step, loss, lr, grad_norm, r->step == r->end);
  if ((r->lead || r->zero1) && a->checkpoint_every && r->step % a->checkpoint_every == 0 && r->step != r->end) {
    int rc = save_checkpoint(r->s, a->checkpoint, &r->d);
    if (rc) return rc;
    r->ckpt_step = r->step;
  }
  return 0;
}

/* The steps, until r->end or Ctrl-C (SIGINT, SIGTERM and SIGHUP, which a
 * closed terminal or ssh session sends, end the current step first): feed, run, check the loss, step, log, report, checkpoint. */
static int run_steps(Run *r) {
  const TrainArgs *a = r->a;
  gradc_session *s = r->s;
  struct sigaction sa, old_int, old_term, old_hup;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_interrupt;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, &old_int);
  sigaction(SIGTERM, &sa, &old_term);
  sigaction(SIGHUP, &sa, &old_hup);

  r->t0 = now_s();
  Progress pr = {.tty = r->lead && isatty(STDERR_FILENO) != 0, .first = r->step0, .total = a->steps, .t0 = r->t0,
                 .unit = r->d.unit, .per_window = r->d.tokens_per_window};
  pr.every = a->print_every ? a->print_every : (a->steps - r->step0 + 19) / 20;
  pr.skipped = &r->skipped;
  if (r->f16) pr.scaler = s;
  if (pr.every < 1) pr.every = 1;
  r->first_loss = r->last_loss = NAN;
  double *loss = r->loss;
  int nl = r->nl, rc = 0;
  gradc_status st;
  while (r->step < r->end && !interrupted) {
    if ((rc = data_feed(&r->d, s, r->step))) break;
    double lr = gradc_session_lr(s);
    if ((st = gradc_session_run(s)) != GRADC_OK) {
      rc = cli_report(st);
      break;
    }
    for (int i = 0; i < nl; i++) loss[i] = gradc_session_loss(s, i);
    loss[nl] = gradc_session_loss_total(s);
    double grad_norm = gradc_session_grad_norm(s);
    char why[512];
    /* f16: gradients that overflowed the loss scale (the losses are
     * finite) are the scaler's to handle: the step skips itself, on every
     * rank, and the scale halves. */
    bool finite_loss = true;
    for (int i = 0; i <= nl; i++) finite_loss &= isfinite(loss[i]) != 0;
    if (r->f16 && finite_loss && gradc_session_overflow(s)) {
      if ((st = gradc_session_step(s)) != GRADC_OK) {
        rc = cli_report(st);
        break;
      }
      if ((rc = after_skipped_step(r, &pr, lr, loss, grad_norm))) break;
      continue;
    }
    if (nonfinite_window(r, loss, grad_norm, why, sizeof why)) {
      if (pr.tty) fputc('\n', stderr);
      if (!a->nan_skip) {
        tools_error("step %" PRId64 ": %s; stopping without taking the step (try a lower --lr, --clip, or "
                    "--nan-policy skip)", r->step + 1, why);
        rc = keep_last_good(r, true);
        break;
      }
      if (r->lead) warning("step %" PRId64 ": %s; the step is skipped (--nan-policy skip)", r->step + 1, why);
      if ((st = gradc_session_skip_step(s)) != GRADC_OK) {
        rc = cli_report(st);
        break;
      }
      r->skipped++;
      if ((rc = after_skipped_step(r, &pr, lr, loss, grad_norm))) break;
      continue;
    }
    check_max_loss(r, loss);
    if ((st = gradc_session_step(s)) != GRADC_OK) {
      rc = cli_report(st);
      break;
    }
    if (gradc_session_find_nonfinite(s, why, sizeof why)) {
      if (pr.tty) fputc('\n', stderr);
      tools_error("step %" PRId64 ": after the update, %s is not finite; stopping (try a lower --lr or --momentum, "
                  "or --clip)", r->step + 1, why);
      rc = keep_last_good(r, false);
      break;
    }
    int64_t step = r->step = gradc_session_step_count(s);
    if (isnan(r->first_loss)) r->first_loss = loss[nl];
    r->last_loss = loss[nl];
    hist_push(&r->h, step, loss);
    const double *val;
    if ((rc = val_run(r, step, pr.tty, &val))) break;
    log_row(&r->lg, r->p, step, lr, loss, grad_norm, r->lg.elapsed0 + now_s() - r->t0, val);
    if (r->lead) progress(&pr, r->p, step, loss, lr, grad_norm, step == r->end);
    /* --zero1: saving a checkpoint is collective (the optimiser state is sharded). */
    if ((r->lead || r->zero1) && a->checkpoint_every && step % a->checkpoint_every == 0 && step != r->end) {
      if ((rc = save_checkpoint(s, a->checkpoint, &r->d))) break;
      r->ckpt_step = step;
      if (r->lead && a->plot && (rc = write_plot(a->plot, base_name(a->model), r->p, &r->h, r->val ? &r->vh : NULL)))
        break;
    }
  }
  if (interrupted && pr.tty) fputc('\n', stderr);
  sigaction(SIGINT, &old_int, NULL);
  sigaction(SIGTERM, &old_term, NULL);
  sigaction(SIGHUP, &old_hup, NULL);
  return rc;
}

/* After the steps: the replicas agree, the trace, and (rank 0) the
 * summary line, the checkpoint, the params, the plot. */
static int run_finish(Run *r) {
  const TrainArgs *a = r->a;
  gradc_session *s = r->s;
  gradc_status st;
  int rc;
  /* Data-parallel ranks took the same steps on the same gradients. */
  if ((st = gradc_session_check_replicas(s)) != GRADC_OK) return cli_report(st);
  /* Every rank's events go into the one file rank 0 writes (collective). */
  if (a->trace && (st = gradc_session_trace_write(s, a->trace)) != GRADC_OK) return cli_report(st);
  if (a->trace && r->lead) {
    double comm_ms = 0, exposed_ms = 0, compute_ms = 0;
    gradc_session_trace_stats(s, &comm_ms, &exposed_ms, &compute_ms);
    fprintf(stderr, "trace: %s: rank 0: compute %.3f ms, collectives in flight %.3f ms, exposed %.3f ms", a->trace,
            compute_ms, comm_ms, exposed_ms);
    if (comm_ms > 0) fprintf(stderr, " (%.1f%% hidden)", 100.0 * (1.0 - exposed_ms / comm_ms));
    fputc('\n', stderr);
  }
  if (!r->lead) {
    if (r->zero1 && a->checkpoint && (rc = save_checkpoint(s, a->checkpoint, &r->d))) return rc;
    return interrupted ? 128 + (int)interrupted : 0;
  }

  double took = now_s() - r->t0;
  if (r->step > r->step0) {
    char rate[32];
    fmt_rate(rate, sizeof rate,
             (double)(r->step - r->step0) * (double)r->d.tokens_per_window / (took > 0 ? took : 1e-9));
    fprintf(stderr, "%s %" PRId64 " steps in %.1f s (%s %s): loss %.4f -> %.4f",
            interrupted ? "interrupted after" : "trained", r->step - r->step0, took, rate, r->d.unit, r->first_loss,
            r->last_loss);
    if (r->skipped) fprintf(stderr, "; %" PRId64 " skipped (non-finite, --nan-policy skip)", r->skipped);
    if (r->f16)
      fprintf(stderr, "; loss scale %g, %" PRId64 " skipped for an f16 overflow", gradc_session_loss_scale(s),
              gradc_session_skipped_steps(s));
    fputc('\n', stderr);
  }
  if (a->checkpoint && (rc = save_checkpoint(s, a->checkpoint, &r->d))) return rc;
  if (a->checkpoint) fprintf(stderr, "checkpoint (step %" PRId64 "): %s\n", r->step, a->checkpoint);
  if (a->params_out) {
    if ((st = gradc_session_save_params(s, a->params_out)) != GRADC_OK) return cli_report(st);
    fprintf(stderr, "params: %s\n", a->params_out);
  }
  if (a->log) fprintf(stderr, "log: %s\n", a->log);
  if (a->plot) {
    if ((rc = write_plot(a->plot, base_name(a->model), r->p, &r->h, r->val ? &r->vh : NULL))) return rc;
    fprintf(stderr, "plot: %s\n", a->plot);
  }
  return interrupted ? 128 + (int)interrupted : 0;
}

/* Close the log, end the other ranks after a failure, free; returns rc
 * (or the log's failure). */
static int run_close(Run *r, int rc) {
  if (r->a->log && r->lead) {
    int lrc = log_close(&r->lg, r->a->log, r->nl);
    if (!rc) rc = lrc;
  }
  if (rc) cli_abort_ranks(rc); /* a distributed run: end the other ranks too, rather than leave them waiting */
  for (int i = 0; i < r->h.nl && r->h.loss; i++) free(r->h.loss[i]);
  free(r->h.loss);
  free(r->h.step);
  for (int i = 0; i < r->vh.nl && r->vh.loss; i++) free(r->vh.loss[i]);
  free(r->vh.loss);
  free(r->vh.step);
  free(r->val_loss);
  eval_free(r->val);
  free(r->loss);
  data_free(&r->d);
  gradc_session_free(r->s);
  gradc_program_free(r->p);
  return rc;
}

/* Before compiling: every output can be written and none replaces an
 * input (rank 0, which writes them, checks; its failure ends the run).
 * --checkpoint may be --resume's file and --params-out --init's: they
 * carry the same state on. */
static int check_paths(const TrainArgs *a) {
  if (cli_launch_rank() != 0) return 0;
  const ToolsPath in[] = {{"the model", a->model, NULL},
                          {"--data", a->data, NULL},
                          {"--init", a->init, NULL},
                          {"--resume", a->resume, NULL}};
  const ToolsPath out[] = {{"--checkpoint", a->checkpoint, "--resume"},
                           {"--params-out", a->params_out, "--init"},
                           {"--log", a->log, NULL},
                           {"--plot", a->plot, NULL},
                           {"--trace", a->trace, NULL}};
  return tools_check_paths(in, 4, out, 5);
}

static int train(const TrainArgs *a) {
  int rc = check_paths(a);
  if (rc) {
    cli_abort_ranks(rc);
    return rc;
  }
  Run r = {.a = a, .lead = true, .ckpt_step = -1};
  rc = run_open(&r);
  if (!rc) {
    if (r.lead) announce(&r);
    if (r.step0 >= a->steps) {
      if (r.lead) fprintf(stderr, "nothing to do: step %" PRId64 " of --steps %" PRId64 "\n", r.step0, a->steps);
      r.end = r.step0;
    }
    rc = run_steps(&r);
  }
  if (!rc) rc = run_finish(&r);
  return run_close(&r, rc);
}

int cmd_train(int argc, char **argv) {
  TrainArgs a;
  int rc = parse_train_args(argc, argv, &a);
  if (!rc) tools_set_link(a.link_latency_us, a.link_gbps);
  if (!rc) rc = train(&a);
  defines_free(&a.defs);
  return rc;
}
