/* infer.c - the forward-only commands that read datasets and sample:
 * `gradc eval` (losses over a whole dataset), the dataset windows that
 * `gradc train --val-data` shares with it, and `gradc generate` (token
 * by token sampling from a language model).  `gradc infer`, one window
 * like `run`, is in gradc.c.
 *
 * eval: the dataset is one window.  A dataset of N samples (one tensor
 * per model input, samples along the first axis, as `train --data` reads
 * them) is compiled forward-only with the batch dim set to N, run as
 * K = N/m micro-batches of m samples, m the largest divisor of N that is
 * at most the model's batch.  The window rule (DESIGN.md §3) then makes
 * every batch mean a mean over the whole dataset (for cross_entropy the
 * divisor counts the valid targets of all N samples), counts every sample
 * once, including those a last partial window of B would hold, and counts
 * a term without the batch (a weight penalty) once: the values are those
 * of `run -D B=N` on the whole dataset as one batch.  docs/DECISIONS.md
 * says why this rather than a smaller tail window or a mask.
 *
 * generate: the model needs an i32[B, T] input (the tokens) and an
 * `output logits` of shape [B, T, V].  From model source it is compiled
 * forward-only with B = 1; an artifact (compile --forward-only) runs as
 * it is, every row holding the same context.  Each step feeds the last T
 * tokens (zeros after them: a causal model's logits at a position see only
 * the positions before it), reads the logits at the last token, and picks
 * the next: argmax at --temperature 0, else a draw from the softmax of
 * logits / temperature over the --top-k largest, from a generator seeded by
 * --seed (one draw per token), so a seed gives the same text every time.
 * Tokens are bytes, or with --vocab DATA (a dataset from `data text
 * --compact`) the indices into the bytes its __metadata__ "vocab" lists.
 * The text (prompt, then the sampled tokens as they come) goes to stdout. */
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/cli.h"
#include "gradc.h"
#include "tools.h"

const char eval_help[] =
    "gradc eval MODEL.gdl|ARTIFACT --params PARAMS.safetensors --data DATA.safetensors [-D N=V]...\n"
    "           [--target cpu|ref|cuda[:sm_XX]] [--threads N] [--no-cache]\n"
    "  Forward-only losses over a whole dataset (the format train --data reads): prints\n"
    "  `loss NAME VALUE` per loss and `loss total`, each a mean over every sample of the dataset\n"
    "  (a batch mean divides by the dataset's count, cross_entropy's by its valid targets).  The\n"
    "  dataset runs as one window of N samples in micro-batches of the largest divisor of N that\n"
    "  is at most the model's batch, so a last partial window counts each of its samples once and\n"
    "  the values equal run -D B=N on the whole dataset.  An artifact is compiled again from the\n"
    "  model source it holds, with its -D values and target, for the dataset's size.\n";

const char generate_help[] =
    "gradc generate MODEL.gdl|ARTIFACT --params PARAMS.safetensors --prompt TEXT [--max-tokens N]\n"
    "               [--temperature X] [--top-k K] [--seed S] [--vocab DATA.safetensors] [--input NAME]\n"
    "               [-D N=V]... [--target cpu|ref|cuda[:sm_XX]] [--threads N] [--no-cache]\n"
    "  Sample text from a language model: one with an i32[B, T] input (the first such, or --input)\n"
    "  and an `output logits` of shape [B, T, V].  Model source is compiled forward-only with\n"
    "  B = 1; an artifact must come from compile --forward-only.  Each of --max-tokens steps (default\n"
    "  64) runs the last T tokens and picks the next from the logits at the last one: the argmax at\n"
    "  --temperature 0, else a draw from softmax(logits / X) (default X = 1) over the --top-k largest\n"
    "  (default: all), seeded by --seed (default 0; the same seed gives the same text).  Tokens are\n"
    "  bytes, or with --vocab the vocabulary a dataset of data text --compact records.  Other inputs\n"
    "  (targets) are fed zeros.  The prompt and the sampled text go to stdout.\n";


static int64_t numel(const int64_t *shape, int rank, int from) {
  int64_t n = 1;
  for (int k = from; k < rank; k++) n *= shape[k];
  return n;
}

static void shape_str(char *buf, size_t n, const int64_t *shape, int rank, int from) {
  size_t k = (size_t)snprintf(buf, n, "[");
  for (int i = from; i < rank && k < n; i++) k += (size_t)snprintf(buf + k, n - k, "%s%" PRId64, i > from ? "," : "", shape[i]);
  if (k < n) snprintf(buf + k, n - k, "]");
}

/* ================================================================== */
/* Datasets as one forward-only window                                 */
/* ================================================================== */

struct EvalSet {
  cli_tensors *st;
  gradc_program *p; /* forward-only, batch = n */
  gradc_session *s;
  int64_t n, micro;
  float *tmp;       /* params copied from another session */
  double *dtmp;
  size_t tmp_n;
};

void eval_free(EvalSet *e) {
  if (!e) return;
  gradc_session_free(e->s);
  gradc_program_free(e->p);
  cli_tensors_free(e->st);
  free(e->tmp);
  free(e->dtmp);
  free(e);
}

int64_t eval_samples(const EvalSet *e) { return e->n; }
int64_t eval_micro(const EvalSet *e) { return e->micro; }
int eval_gas(const EvalSet *e) { return gradc_program_gas(e->p); }

/* The dataset's tensors against sig's inputs: every input has its tensor
 * (batched ones with the samples along the first axis, all with the same
 * count), and no tensor is left over.  *n gets the sample count (0: no
 * batched input). */
static int match_inputs(const cli_tensors *st, const char *path, const gradc_program *sig, int64_t *n) {
  *n = 0;
  const char *first = NULL;
  for (int i = 0; i < gradc_program_num_inputs(sig); i++) {
    gradc_tensor_info in;
    if (gradc_program_input_info(sig, i, &in) != GRADC_OK) return cli_report(GRADC_ERR_INTERNAL);
    bool batched = in.batched && in.rank > 0;
    char want[160], got[160];
    shape_str(want, sizeof want, in.shape, in.rank, batched ? 1 : 0);
    int k = cli_tensors_find(st, in.name);
    if (k < 0)
      return tools_error("%s: no tensor '%s' (the model's input %s : %s%s%s)", path, in.name, in.name,
                   cli_dtype_name(in.dtype), batched ? "[N]+" : "", want);
    cli_tensor t = cli_tensors_at(st, k);
    bool is_int = in.dtype == GRADC_I32 || in.dtype == GRADC_I64;
    bool t_int = t.dtype == GRADC_I32 || t.dtype == GRADC_I64;
    bool ok = t.rank == in.rank && is_int == t_int && t.dtype != GRADC_BF16 && t.dtype != GRADC_F16;
    for (int d = batched ? 1 : 0; ok && d < in.rank; d++) ok = t.shape[d] == in.shape[d];
    if (!ok) {
      shape_str(got, sizeof got, t.shape, t.rank, 0);
      return tools_error("%s: tensor '%s': expected %s%s%s (%s), got %s%s", path, in.name, is_int ? "I32 or I64" : "F32 or F64",
                   batched ? "[N]+" : "", want, batched ? "samples along the first axis" : "the input as it is",
                   cli_dtype_file_name(t.dtype), got);
    }
    if (!batched) continue;
    if (first && t.shape[0] != *n)
      return tools_error("%s: tensor '%s' has %" PRId64 " samples, tensor '%s' %" PRId64, path, in.name, t.shape[0], first, *n);
    if (!first) {
      first = in.name;
      *n = t.shape[0];
    }
  }
  for (int i = 0; i < cli_tensors_count(st); i++) {
    const char *name = cli_tensors_at(st, i).name;
    bool used = false;
    for (int j = 0; j < gradc_program_num_inputs(sig) && !used; j++) {
      gradc_tensor_info in;
      used = gradc_program_input_info(sig, j, &in) == GRADC_OK && strcmp(in.name, name) == 0;
    }
    if (!used) return tools_error("%s: tensor '%s' is not an input of the model", path, name);
  }
  if (first && *n < 1) return tools_error("%s: the dataset has no samples", path);
  return 0;
}

int eval_open(EvalSet **out, const gradc_program *sig, const char *target, const char *path) {
  *out = NULL;
  EvalSet *e = mem_calloc(1, sizeof *e);
  e->st = cli_tensors_new();
  char err[1024];
  int rc = 0;
  if (!cli_tensors_read(e->st, path, err, sizeof err)) rc = tools_error("%s", err);
  if (!rc) rc = match_inputs(e->st, path, sig, &e->n);
  if (!rc) {
    const char *name, *text;
    gradc_compile_options o;
    cli_program_source(sig, &name, &text, &o);
    if (target) o.target = target;
    rc = cli_compile_window(name, text, &o, e->n, false, &e->p, &e->micro);
  }
  gradc_status st = GRADC_OK;
  if (!rc && (st = gradc_session_new(e->p, &e->s)) != GRADC_OK) rc = cli_report(st);
  /* The window is the dataset: its tensors are the inputs as they are. */
  for (int i = 0; !rc && i < cli_tensors_count(e->st); i++) {
    cli_tensor t = cli_tensors_at(e->st, i);
    st = gradc_session_set_input(e->s, t.name, t.dtype, t.data, (size_t)numel(t.shape, t.rank, 0));
    if (st != GRADC_OK) rc = cli_report(st);
  }
  if (rc) {
    eval_free(e);
    return rc;
  }
  *out = e;
  return 0;
}

/* The window's losses (loss[nl] their total) after the params are set. */
static int eval_window(EvalSet *e, double *loss) {
  gradc_status st = gradc_session_run(e->s);
  if (st != GRADC_OK) return cli_report(st);
  int nl = gradc_program_num_losses(e->p);
  for (int i = 0; i < nl; i++) loss[i] = gradc_session_loss(e->s, i);
  loss[nl] = gradc_session_loss_total(e->s);
  return 0;
}

int eval_run_params(EvalSet *e, const char *params, double *loss) {
  gradc_status st = gradc_session_load_params(e->s, params);
  return st != GRADC_OK ? cli_report(st) : eval_window(e, loss);
}

/* Copy one param or buffer of `from` into the set's session. */
static int copy_state(EvalSet *e, const gradc_session *from, const gradc_tensor_info *ti) {
  size_t n = (size_t)numel(ti->shape, ti->rank, 0);
  if (n > e->tmp_n) {
    e->tmp = mem_realloc(e->tmp, sizeof(float) * n);
    e->dtmp = mem_realloc(e->dtmp, sizeof(double) * n);
    e->tmp_n = n;
  }
  void *buf = ti->dtype == GRADC_F64 ? (void *)e->dtmp : (void *)e->tmp; /* storage: F64 for f64, else F32 */
  gradc_status st = gradc_session_get_param(from, ti->name, buf, n);
  if (st == GRADC_OK) st = gradc_session_set_param(e->s, ti->name, buf, n);
  return st == GRADC_OK ? 0 : cli_report(st);
}

int eval_run_session(EvalSet *e, const gradc_session *from, double *loss) {
  int rc = 0;
  for (int i = 0; !rc && i < gradc_program_num_params(e->p); i++) {
    gradc_tensor_info ti;
    rc = gradc_program_param_info(e->p, i, &ti) == GRADC_OK ? copy_state(e, from, &ti) : cli_report(GRADC_ERR_INTERNAL);
  }
  for (int i = 0; !rc && i < gradc_program_num_buffers(e->p); i++) {
    gradc_tensor_info ti;
    rc = gradc_program_buffer_info(e->p, i, &ti) == GRADC_OK ? copy_state(e, from, &ti) : cli_report(GRADC_ERR_INTERNAL);
  }
  return rc ? rc : eval_window(e, loss);
}

/* ================================================================== */
/* gradc eval                                                          */
/* ================================================================== */

typedef struct ModelArgs { /* what eval and generate share */
  const char *model, *params, *target;
  int threads;
  bool no_cache;
  Defines defs;
} ModelArgs;

#define MODEL_FLAGS(a)                                                                                              \
  {"--params", FLAG_STRING, .dst = &(a)->params}, {"--target", FLAG_STRING, .dst = &(a)->target},                \
      {"--threads", FLAG_INT, &(a)->threads, NULL, 0, 4096, .expects = "an integer >= 0"},                       \
      {"--no-cache", FLAG_BOOL, .dst = &(a)->no_cache}

static int check_model_args(const ModelArgs *a, const char *cmd) {
  if (!a->model) return tools_error("%s needs a model file or an artifact (see gradc help %s)", cmd, cmd);
  if (!a->params) return tools_error("%s needs --params PARAMS.safetensors (see gradc help %s)", cmd, cmd);
  if (a->target && strcmp(a->target, "cpu") != 0 && strcmp(a->target, "ref") != 0 && !cli_is_cuda_target(a->target))
    return tools_error("unsupported --target '%s' (this build has: cpu, ref%s)", a->target, cli_cuda_targets());
  if (cli_is_cuda_target(a->target) && cli_need_device()) return 1;
  if (cli_is_artifact(a->model) && (a->defs.n || a->target))
    return tools_error("%s: an artifact fixes its sizes and target; -D and --target apply to model source", a->model);
  return 0;
}

static void model_options(const ModelArgs *a, gradc_compile_options *o) {
  gradc_compile_options_init(o);
  if (a->target) o->target = a->target;
  o->threads = a->threads;
  o->no_cache = a->no_cache;
  o->def_names = a->defs.name;
  o->def_values = a->defs.value;
  o->ndefs = a->defs.n;
}

int cmd_eval(int argc, char **argv) {
  ModelArgs a = {0};
  const char *data = NULL;
  const Flag flags[] = {MODEL_FLAGS(&a), {"--data", FLAG_STRING, .dst = &data}};
  int npos = 0;
  FlagSpec spec = {flags, (int)(sizeof flags / sizeof *flags), " (see gradc help eval)", .see_missing = true,
                   .defines = &a.defs, .positional = &a.model, .max_positional = 1, .npositional = &npos};
  int rc = flags_parse(&spec, argc, argv, 1);
  if (!rc) rc = check_model_args(&a, "eval");
  if (!rc && !data) rc = tools_error("eval needs --data DATA.safetensors (see gradc help eval)");
  /* The signature the dataset is matched against: the artifact, or the
   * model compiled for the interpreter (the frontend and passes only; the
   * dataset's own window is compiled for the target). */
  gradc_program *sig = NULL;
  gradc_status st;
  if (!rc && cli_is_artifact(a.model)) {
    if ((st = gradc_program_load(a.model, &sig)) != GRADC_OK) rc = cli_report(st);
  } else if (!rc) {
    gradc_compile_options o;
    model_options(&a, &o);
    o.target = "ref";
    o.forward_only = 1;
    o.no_outputs = 1;
    rc = cli_compile(a.model, &o, NULL, &sig);
  }
  EvalSet *e = NULL;
  if (!rc) rc = eval_open(&e, sig, cli_is_artifact(a.model) ? NULL : (a.target ? a.target : "cpu"), data);
  if (!rc && eval_micro(e) > 0)
    fprintf(stderr, "eval %s: %" PRId64 " samples as one window of %d micro-batches of %" PRId64 "\n", data,
            eval_samples(e), eval_gas(e), eval_micro(e));
  int nl = sig ? gradc_program_num_losses(sig) : 0;
  double *loss = mem_calloc((size_t)nl + 1, sizeof *loss);
  if (!rc) rc = eval_run_params(e, a.params, loss);
  if (!rc) {
    for (int i = 0; i < nl; i++) printf("loss %s %.9g\n", gradc_program_loss_name(sig, i), loss[i]);
    printf("loss total %.9g\n", loss[nl]);
    fflush(stdout);
  }
  free(loss);
  eval_free(e);
  gradc_program_free(sig);
  defines_free(&a.defs);
  return rc;
}

/* ================================================================== */
/* gradc generate                                                      */
/* ================================================================== */

/* The next token from logits[0..nv): the argmax at temperature 0 (the
 * first of ties), else a draw from softmax(logits / temperature) over the
 * top_k largest (0: all; ties broken by the lower index). */
typedef struct Cand {
  float logit;
  int id;
} Cand;

static int by_logit(const void *x, const void *y) {
  const Cand *a = x, *b = y;
  if (a->logit != b->logit) return a->logit > b->logit ? -1 : 1;
  return (a->id > b->id) - (a->id < b->id);
}

static int sample_token(const float *logits, int nv, double temperature, int top_k, Rng *r, Cand *c) {
  if (temperature == 0) {
    int best = 0;
    for (int i = 1; i < nv; i++)
      if (logits[i] > logits[best]) best = i;
    return best;
  }
  for (int i = 0; i < nv; i++) c[i] = (Cand){logits[i], i};
  qsort(c, (size_t)nv, sizeof *c, by_logit);
  int k = top_k > 0 && top_k < nv ? top_k : nv;
  double total = 0;
  double *w = mem_alloc(sizeof(double) * (size_t)k);
  for (int i = 0; i < k; i++) total += w[i] = exp(((double)c[i].logit - (double)c[0].logit) / temperature);
  double u = rng_uniform(r) * total, acc = 0;
  int pick = c[k - 1].id;
  for (int i = 0; i < k; i++) {
    acc += w[i];
    if (u < acc) {
      pick = c[i].id;
      break;
    }
  }
  free(w);
  return pick;
}

/* The vocabulary: bytes, or the byte of each token id from a dataset of
 * `data text --compact` (__metadata__ "vocab": "[10,32,...]"). */
typedef struct Vocab {
  int n;          /* token ids 0..n-1 decode */
  int byte[256];  /* id -> byte */
  int id[256];    /* byte -> id, or -1 */
} Vocab;

static int vocab_read(Vocab *v, const char *path) {
  v->n = 256;
  for (int b = 0; b < 256; b++) v->byte[b] = v->id[b] = b;
  if (!path) return 0;
  cli_tensors *f = cli_tensors_new();
  char err[1024];
  int rc = 0;
  const char *s = NULL;
  if (!cli_tensors_read(f, path, err, sizeof err)) rc = tools_error("%s", err);
  else if (!(s = cli_tensors_meta(f, "vocab")))
    rc = tools_error("%s: no vocabulary in __metadata__ (a dataset written by gradc data text has one)", path);
  else if (strcmp(s, "bytes") != 0) {
    for (int b = 0; b < 256; b++) v->id[b] = -1;
    v->n = 0;
    const char *q = s;
    bool ok = *q++ == '[';
    while (ok && *q && *q != ']') {
      char *end;
      long b = strtol(q, &end, 10);
      ok = end != q && b >= 0 && b < 256 && v->id[b] < 0 && v->n < 256;
      if (!ok) break;
      v->id[b] = v->n;
      v->byte[v->n++] = (int)b;
      q = end;
      if (*q == ',') q++;
    }
    if (!ok || *q != ']' || v->n == 0) rc = tools_error("%s: __metadata__ vocab is not a list of distinct bytes: '%.60s'", path, s);
  }
  cli_tensors_free(f);
  return rc;
}

typedef struct GenArgs {
  ModelArgs m;
  const char *prompt, *vocab, *input;
  int64_t max_tokens;
  double temperature;
  int top_k;
  uint64_t seed;
} GenArgs;

/* The program: model source forward-only for one sample, or a forward-only artifact. */
static int gen_program(const GenArgs *a, gradc_program **p) {
  *p = NULL;
  if (cli_is_artifact(a->m.model)) {
    gradc_status st = gradc_program_load(a->m.model, p);
    if (st != GRADC_OK) return cli_report(st);
    if (!gradc_program_forward_only(*p))
      return tools_error("%s: it was compiled for training; generate loads an artifact of compile --forward-only (or give "
                   "the model source)", a->m.model);
    return 0;
  }
  const char *why;
  size_t len;
  char *text = read_file(a->m.model, &len, &why);
  if (!text) return tools_error("%s: %s", a->m.model, why);
  gradc_compile_options o;
  model_options(&a->m, &o);
  int rc = cli_compile_window(a->m.model, text, &o, 1, true, p, NULL);
  free(text);
  return rc;
}

/* The token input (--input, else the first i32 [B, T] one) into *tok. */
static int token_input(const GenArgs *a, const gradc_program *p, gradc_tensor_info *tok) {
  StrBuf have;
  sb_init(&have);
  int rc = 1;
  for (int i = 0; i < gradc_program_num_inputs(p); i++) {
    gradc_tensor_info in;
    if (gradc_program_input_info(p, i, &in) != GRADC_OK) break;
    char sh[160];
    shape_str(sh, sizeof sh, in.shape, in.rank, 0);
    sb_printf(&have, "%s%s : %s%s", i ? ", " : "", in.name, cli_dtype_name(in.dtype), sh);
    bool fits = in.dtype == GRADC_I32 && in.rank == 2 && in.batched;
    if (a->input ? strcmp(in.name, a->input) == 0 : fits) {
      if (!fits) {
        rc = tools_error("%s: --input %s is %s%s; generate needs an i32[B, T] input (the tokens)", a->m.model, in.name,
                   cli_dtype_name(in.dtype), sh);
        sb_free(&have);
        return rc;
      }
      *tok = in;
      sb_free(&have);
      return 0;
    }
  }
  if (a->input)
    rc = tools_error("%s: --input %s: the model has no such input (its inputs: %s)", a->m.model, a->input, sb_str(&have));
  else
    rc = tools_error("%s: generate needs an i32[B, T] input (the tokens); the model's inputs are %s", a->m.model,
               have.len ? sb_str(&have) : "none");
  sb_free(&have);
  return rc;
}

static int has_logits(const GenArgs *a, const gradc_program *p) {
  StrBuf names;
  sb_init(&names);
  for (int i = 0; i < gradc_program_num_outputs(p); i++) {
    if (strcmp(gradc_program_output_name(p, i), "logits") == 0) {
      sb_free(&names);
      return 0;
    }
    sb_printf(&names, "%s%s", i ? ", " : "", gradc_program_output_name(p, i));
  }
  int rc = tools_error("%s: generate needs an `output logits` of shape [B, T, V]; the model has %s%s", a->m.model,
                 names.len ? "the outputs " : "no `output` statement", sb_str(&names));
  sb_free(&names);
  return rc;
}

/* Zeros for every input but the tokens (a language model's targets). */
static int zero_inputs(gradc_session *s, const gradc_program *p, const char *tok) {
  for (int i = 0; i < gradc_program_num_inputs(p); i++) {
    gradc_tensor_info in;
    if (gradc_program_input_info(p, i, &in) != GRADC_OK) return cli_report(GRADC_ERR_INTERNAL);
    if (strcmp(in.name, tok) == 0) continue;
    size_t n = (size_t)numel(in.shape, in.rank, 0);
    bool f64 = in.dtype == GRADC_F64;
    bool is_int = in.dtype == GRADC_I32 || in.dtype == GRADC_I64;
    void *z = mem_calloc(n + 1, f64 ? 8 : 4);
    gradc_status st = gradc_session_set_input(s, in.name, is_int ? GRADC_I32 : f64 ? GRADC_F64 : GRADC_F32, z, n);
    free(z);
    if (st != GRADC_OK) return cli_report(st);
  }
  return 0;
}

static int generate(const GenArgs *a) {
  Vocab voc;
  int rc = vocab_read(&voc, a->vocab);
  if (rc) return rc;
  size_t plen = strlen(a->prompt);
  if (plen == 0) return tools_error("--prompt is empty: generate continues a text of at least one token");
  int64_t cap = (int64_t)plen + a->max_tokens, n = 0;
  int32_t *ids = mem_alloc(sizeof(int32_t) * (size_t)cap), *window = NULL;
  for (size_t i = 0; i < plen && !rc; i++) {
    unsigned char c = (unsigned char)a->prompt[i];
    if (voc.id[c] < 0)
      rc = tools_error("--prompt: byte %u ('%c') at offset %zu is not in the vocabulary of %s", c, c >= 32 && c < 127 ? c : '?',
                 i, a->vocab);
    ids[n++] = voc.id[c];
  }
  gradc_program *p = NULL;
  gradc_session *s = NULL;
  gradc_tensor_info tok = {0};
  gradc_status st;
  if (rc || (rc = gen_program(a, &p)) || (rc = token_input(a, p, &tok)) || (rc = has_logits(a, p))) goto done;
  if ((st = gradc_session_new(p, &s)) != GRADC_OK || (st = gradc_session_load_params(s, a->m.params)) != GRADC_OK) {
    rc = cli_report(st);
    goto done;
  }
  if ((rc = zero_inputs(s, p, tok.name))) goto done;
  int64_t B = tok.shape[0], T = tok.shape[1];
  window = mem_calloc((size_t)(B * T), sizeof(int32_t));
  bool shown = false; /* the prompt, on stdout once the first run has checked the logits */
  float *logits = NULL;
  Cand *cand = NULL;
  Rng rng;
  rng_seed(&rng, a->seed);
  int64_t V = 0;
  for (int64_t step = 0; !rc && step < a->max_tokens; step++) {
    int64_t from = n > T ? n - T : 0, len = n - from;
    for (int64_t b = 0; b < B; b++) /* every row the same context, zeros after it */
      for (int64_t t = 0; t < T; t++) window[b * T + t] = t < len ? ids[from + t] : 0;
    if ((st = gradc_session_set_input(s, tok.name, GRADC_I32, window, (size_t)(B * T))) != GRADC_OK ||
        (st = gradc_session_run(s)) != GRADC_OK) {
      rc = cli_report(st);
      break;
    }
    gradc_tensor_info lo;
    if ((st = gradc_session_output_info(s, "logits", &lo)) != GRADC_OK) {
      rc = cli_report(st);
      break;
    }
    if (lo.rank != 3 || lo.shape[0] != B || lo.shape[1] != T || lo.dtype == GRADC_I32) {
      char sh[160];
      shape_str(sh, sizeof sh, lo.shape, lo.rank, 0);
      rc = tools_error("%s: generate needs `output logits` of shape [B, T, V] = [%" PRId64 ", %" PRId64 ", V] (floats); it is "
                 "%s%s", a->m.model, B, T, cli_dtype_name(lo.dtype), sh);
      break;
    }
    if (!logits) {
      V = lo.shape[2];
      logits = mem_alloc(sizeof(float) * (size_t)(B * T * V));
      cand = mem_alloc(sizeof(Cand) * (size_t)V);
      for (int64_t i = 0; i < n && !rc; i++)
        if (ids[i] >= V)
          rc = tools_error("--prompt: token %d is outside the model's %" PRId64 " logits (vocabulary of %s)", ids[i], V,
                     a->vocab ? a->vocab : "bytes");
      if (rc) break;
    }
    size_t m = (size_t)(B * T * V);
    if (lo.dtype == GRADC_F64) { /* read as doubles, kept as floats: sampling needs no more */
      double *d = mem_alloc(sizeof(double) * m);
      st = gradc_session_get_output(s, "logits", d, m);
      for (size_t i = 0; i < m; i++) logits[i] = (float)d[i];
      free(d);
    } else {
      st = gradc_session_get_output(s, "logits", logits, m);
    }
    if (st != GRADC_OK) {
      rc = cli_report(st);
      break;
    }
    /* Tokens the vocabulary cannot print are never drawn. */
    int nv = (int)(V < voc.n ? V : voc.n);
    int next = sample_token(logits + (len - 1) * V, nv, a->temperature, a->top_k, &rng, cand);
    ids[n++] = next;
    if (!shown) fwrite(a->prompt, 1, plen, stdout);
    shown = true;
    putchar(voc.byte[next]);
    fflush(stdout);
  }
  if (!rc && !shown) fwrite(a->prompt, 1, plen, stdout);
  if (!rc) putchar('\n');
  fflush(stdout);
  free(logits);
  free(cand);
done:
  free(ids);
  free(window);
  gradc_session_free(s);
  gradc_program_free(p);
  return rc;
}

int cmd_generate(int argc, char **argv) {
  GenArgs a = {.max_tokens = 64, .temperature = 1.0};
  const Flag flags[] = {
      MODEL_FLAGS(&a.m),
      {"--prompt", FLAG_STRING, .dst = &a.prompt},
      {"--vocab", FLAG_STRING, .dst = &a.vocab},
      {"--input", FLAG_STRING, .dst = &a.input},
      {"--max-tokens", FLAG_I64, &a.max_tokens, NULL, 0, 1 << 24, .expects = "an integer >= 0"},
      {"--temperature", FLAG_REAL, &a.temperature, NULL, 0, 1e6, .expects = "a number >= 0"},
      {"--top-k", FLAG_INT, &a.top_k, NULL, 0, 1 << 30, .expects = "an integer >= 0"},
      {"--seed", FLAG_U64, &a.seed, NULL, 0, (double)INT64_MAX, .expects = "a non-negative integer"},
  };
  int npos = 0;
  FlagSpec spec = {flags, (int)(sizeof flags / sizeof *flags), " (see gradc help generate)", .see_missing = true,
                   .defines = &a.m.defs, .positional = &a.m.model, .max_positional = 1, .npositional = &npos};
  int rc = flags_parse(&spec, argc, argv, 1);
  if (!rc) rc = check_model_args(&a.m, "generate");
  if (!rc && !a.prompt) rc = tools_error("generate needs --prompt TEXT (see gradc help generate)");
  if (!rc) rc = generate(&a);
  defines_free(&a.m.defs);
  return rc;
}
