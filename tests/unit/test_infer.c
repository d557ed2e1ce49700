/* test_infer.c - the forward-only commands end to end (DESIGN.md §5):
 * `infer` gives run's losses and outputs; a forward-only program has no
 * gradient buffers (C API, IR dump, artifacts); `eval` over a dataset
 * gives the full-batch value of run -D B=N and, windowed by hand, the
 * count-weighted mean of its windows, with a partial last window and
 * ignored targets; `generate` is deterministic for a seed and at
 * temperature 0 picks the argmax of logits read from run --outputs-out;
 * `train --val-data` logs eval's figures; user errors exit 1. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gradc.h"
#include "runtime/runtime.h"
#include "testutil.h"

static char dir[] = "/tmp/gradc-infer-test-XXXXXX";
/* tinygpt small enough to compile fast; byte tokens. */
#define TG "examples/tinygpt.gdl -D C=32 -D L=1 -D NH=2 -D T=16"
#define NSAMPLES 45 /* not a multiple of the batch, 8 */

static char out[1 << 16], err[1 << 16];

/* gradc ARGS (printf-style) from the source tree: stdout in out, stderr in err. */
static int gradc(const char *fmt, ...) GRADC_PRINTF(1, 2);
static int gradc(const char *fmt, ...) {
  char args[4096];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(args, sizeof args, fmt, ap);
  va_end(ap);
  return tu_sh_err(out, sizeof out, err, sizeof err, "cd %s && %s %s", tu_path(""), GRADC_BINARY, args);
}

static void ok(int rc) {
  if (rc != 0) fail_msg("exit %d\nstdout:\n%s\nstderr:\n%s", rc, out, err);
}

static double loss_of(const char *text, const char *name) {
  char key[64];
  snprintf(key, sizeof key, "loss %s ", name);
  const char *p = strstr(text, key);
  if (!p) fail_msg("no '%s' line in:\n%s", key, text);
  return strtod(p + strlen(key), NULL);
}

static void close_to(double got, double want, double rel, const char *what) {
  if (!(fabs(got - want) <= rel * fabs(want))) fail_msg("%s: got %.9g, want %.9g", what, got, want);
}

static int setup(void **state) {
  (void)state;
  assert_non_null(mkdtemp(dir));
  /* A text of NSAMPLES samples of 16 tokens (and their targets). */
  char path[256];
  snprintf(path, sizeof path, "%s/text.txt", dir);
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  const char *words[] = {"the ", "cat ", "sat ", "on ", "a ", "mat, ", "and ", "then ", "it ", "ran.\n"};
  uint64_t x = 7;
  int len = 0;
  while (len < 16 * NSAMPLES + 1) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    const char *w = words[(x >> 33) % 10];
    int n = (int)strlen(w);
    if (len + n > 16 * NSAMPLES + 1) n = 16 * NSAMPLES + 1 - len;
    fwrite(w, 1, (size_t)n, f);
    len += n;
  }
  fclose(f);
  ok(gradc("data text %s/text.txt -T 16 -o %s/d.st", dir, dir));
  ok(gradc("data text %s/text.txt -T 16 --compact -o %s/dc.st", dir, dir));
  ok(gradc("init " TG " -D V=256 -o %s/p.st --seed 3", dir));
  ok(gradc("data random " TG " -D V=256 -o %s/i.st --seed 4", dir));
  return 0;
}

static int teardown(void **state) {
  (void)state;
  tu_rm_rf(dir);
  return 0;
}

static void read_st(const char *name, StFile *f) {
  char path[256], e[512];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  st_init(f);
  if (!st_read(path, f, e, sizeof e)) fail_msg("%s", e);
}

static void write_st(const char *name, const StFile *f) {
  char path[256], e[512];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  if (!st_write(path, f, e, sizeof e)) fail_msg("%s", e);
}

/* ---- infer ---- */

static void test_infer_equals_run(void **state) {
  (void)state;
  ok(gradc("run " TG " -D V=256 --params %s/p.st --inputs %s/i.st --outputs-out %s/run_out.st", dir, dir, dir));
  double ce = loss_of(out, "ce"), total = loss_of(out, "total");
  ok(gradc("infer " TG " -D V=256 --params %s/p.st --inputs %s/i.st -o %s/inf_out.st", dir, dir, dir));
  close_to(loss_of(out, "ce"), ce, 1e-6, "infer ce");
  close_to(loss_of(out, "total"), total, 1e-6, "infer total");
  /* The outputs: the same logits, [B, T, V]. */
  StFile a, b;
  read_st("run_out.st", &a);
  read_st("inf_out.st", &b);
  const StTensor *la = st_find(&a, "logits"), *lb = st_find(&b, "logits");
  assert_non_null(la);
  assert_non_null(lb);
  assert_int_equal(lb->rank, 3);
  assert_int_equal(lb->shape[0], 8);
  assert_int_equal(lb->shape[1], 16);
  assert_int_equal(lb->shape[2], 256);
  double worst = 0;
  for (int64_t i = 0; i < st_numel(la); i++)
    worst = fmax(worst, fabs(((float *)la->data)[i] - ((float *)lb->data)[i]));
  if (worst > 1e-5) fail_msg("infer's logits differ from run's by %g", worst);
  st_free(&a);
  st_free(&b);
  /* Model with two losses, one without the batch. */
  ok(gradc("init examples/mlp.gdl -D B=8 -o %s/mp.st", dir));
  ok(gradc("data random examples/mlp.gdl -D B=8 -o %s/mi.st", dir));
  ok(gradc("run examples/mlp.gdl -D B=8 --params %s/mp.st --inputs %s/mi.st", dir, dir));
  static char run[sizeof out];
  strcpy(run, out);
  ok(gradc("infer examples/mlp.gdl -D B=8 --params %s/mp.st --inputs %s/mi.st", dir, dir));
  close_to(loss_of(out, "ce"), loss_of(run, "ce"), 1e-6, "mlp ce");
  close_to(loss_of(out, "l2"), loss_of(run, "l2"), 1e-6, "mlp l2");
  close_to(loss_of(out, "total"), loss_of(run, "total"), 1e-6, "mlp total");
}

static void test_infer_forward_only_has_no_gradients(void **state) {
  (void)state;
  char *src = tu_read("examples/tinygpt.gdl");
  gradc_compile_options o;
  gradc_compile_options_init(&o);
  gradc_program *train = NULL, *fwd = NULL;
  assert_int_equal(gradc_program_compile_source("tinygpt.gdl", src, &o, &train), GRADC_OK);
  o.forward_only = 1;
  assert_int_equal(gradc_program_compile_source("tinygpt.gdl", src, &o, &fwd), GRADC_OK);
  assert_int_equal(gradc_program_forward_only(fwd), 1);
  assert_int_equal(gradc_program_forward_only(train), 0);
  /* No gradient buffers: the arena is well under half the training one's
   * (the params alone are a quarter of it, their gradients another). */
  int64_t ab = gradc_program_arena_bytes(fwd), tb = gradc_program_arena_bytes(train);
  assert_true(ab > 0);
  if (!(2 * ab < tb)) fail_msg("forward-only arena %lld bytes, training %lld", (long long)ab, (long long)tb);
  gradc_session *s;
  assert_int_equal(gradc_session_new(fwd, &s), GRADC_OK);
  assert_int_equal(gradc_session_init_params(s, 1), GRADC_OK);
  int32_t tok[8 * 32] = {0};
  for (int i = 0; i < 8 * 32; i++) tok[i] = i % 96;
  assert_int_equal(gradc_session_set_input(s, "idx", GRADC_I32, tok, 8 * 32), GRADC_OK);
  assert_int_equal(gradc_session_set_input(s, "targets", GRADC_I32, tok, 8 * 32), GRADC_OK);
  assert_int_equal(gradc_session_run(s), GRADC_OK);
  assert_true(isfinite(gradc_session_loss_total(s)));
  float g[64];
  assert_int_equal(gradc_session_get_grad(s, "lnf_w", g, 64), GRADC_ERR_USER);
  assert_non_null(strstr(gradc_last_error(), "forward-only"));
  gradc_optimizer_options oo;
  gradc_optimizer_options_init(&oo, GRADC_ADAMW);
  assert_int_equal(gradc_session_set_optimizer(s, &oo), GRADC_ERR_USER);
  assert_int_equal(gradc_session_step(s), GRADC_ERR_USER);
  gradc_session_free(s);
  gradc_program_free(fwd);
  gradc_program_free(train);
  free(src);

  /* The planned IR: no gradient buffers (`@grad OFFSET`), and the
   * training step has them. */
  ok(gradc("compile " TG " -D V=256 --forward-only"));
  assert_null(strstr(out, "@grad "));
  assert_non_null(strstr(out, " arena "));
  long long arena = strtoll(strstr(out, "// arena: ") + strlen("// arena: "), NULL, 10);
  /* bench --forward-only times that program. */
  ok(gradc("bench " TG " -D V=256 --forward-only --steps 1 --warmup 0"));
  assert_int_equal(strtoll(strstr(out, "peak_bytes: ") + strlen("peak_bytes: "), NULL, 10), arena);
  ok(gradc("compile " TG " -D V=256"));
  assert_non_null(strstr(out, "@grad "));

  /* Artifacts keep the mode: infer loads a forward-only one, run refuses it,
   * and infer refuses a training one. */
  ok(gradc("compile " TG " -D V=256 --forward-only -o %s/fwd.gca", dir));
  ok(gradc("compile " TG " -D V=256 -o %s/train.gca", dir));
  ok(gradc("infer " TG " -D V=256 --params %s/p.st --inputs %s/i.st", dir, dir));
  double want = loss_of(out, "total");
  ok(gradc("infer %s/fwd.gca --params %s/p.st --inputs %s/i.st", dir, dir, dir));
  assert_true(loss_of(out, "total") == want);
  assert_int_equal(gradc("run %s/fwd.gca --params %s/p.st --inputs %s/i.st", dir, dir, dir), 1);
  assert_non_null(strstr(err, "gradc: error: "));
  assert_non_null(strstr(err, "forward-only"));
  assert_int_equal(gradc("infer %s/train.gca --params %s/p.st --inputs %s/i.st", dir, dir, dir), 1);
  assert_non_null(strstr(err, "gradc: error: "));
  assert_int_equal(gradc("infer " TG " -D V=256 --params %s/p.st --inputs %s/i.st --grads-out %s/g.st", dir, dir, dir), 1);
  assert_non_null(strstr(err, "gradc: error: "));
}

/* ---- eval ---- */

static void test_eval_equals_one_batch(void **state) {
  (void)state;
  ok(gradc("eval " TG " -D V=256 --params %s/p.st --data %s/d.st", dir, dir));
  /* 45 = 3 * 15: the largest divisor at most 8 is 5. */
  assert_non_null(strstr(err, "45 samples as one window of 9 micro-batches of 5"));
  double ev = loss_of(out, "ce");
  close_to(loss_of(out, "total"), ev, 1e-12, "total = ce");
  /* The whole dataset as one batch. */
  ok(gradc("run " TG " -D V=256 -D B=%d --params %s/p.st --inputs %s/d.st", NSAMPLES, dir, dir));
  close_to(ev, loss_of(out, "ce"), 1e-5, "eval vs run -D B=45");
  /* An artifact's model source, -D values and target give the same program. */
  ok(gradc("compile " TG " -D V=256 -o %s/ev.gca", dir));
  ok(gradc("eval %s/ev.gca --params %s/p.st --data %s/d.st", dir, dir, dir));
  assert_true(loss_of(out, "ce") == ev);
}

/* Samples [lo, hi) of every tensor of f. */
static void slice_samples(const StFile *f, int64_t lo, int64_t hi, StFile *outf) {
  st_init(outf);
  for (int i = 0; i < f->n; i++) {
    const StTensor *t = &f->t[i];
    int64_t row = st_numel(t) / t->shape[0];
    int64_t shape[IR_MAX_RANK];
    memcpy(shape, t->shape, sizeof shape);
    shape[0] = hi - lo;
    size_t es = st_dtype_size(t->dtype);
    st_add(outf, t->name, t->dtype, t->rank, shape, (const char *)t->data + (size_t)(lo * row) * es);
  }
}

static void test_eval_partial_window_counts_each_sample_once(void **state) {
  (void)state;
  /* Some targets ignored, unevenly: sample n keeps the first 16 - (n % 4) * 5. */
  StFile d;
  read_st("d.st", &d);
  StTensor *tg = (StTensor *)st_find(&d, "targets");
  int32_t *t = tg->data;
  for (int n = 0; n < NSAMPLES; n++)
    for (int k = 16 - (n % 4) * 5; k < 16; k++) t[n * 16 + k] = -100;
  write_st("dig.st", &d);
  ok(gradc("eval " TG " -D V=256 --params %s/p.st --data %s/dig.st", dir, dir));
  double ev = loss_of(out, "ce");
  /* By hand: windows of 8 (the last of 5 samples, run with -D B=5); each
   * window's mean weighted by its valid targets. */
  double num = 0, den = 0;
  for (int64_t lo = 0; lo < NSAMPLES; lo += 8) {
    int64_t hi = lo + 8 < NSAMPLES ? lo + 8 : NSAMPLES;
    StFile w;
    slice_samples(&d, lo, hi, &w);
    write_st("w.st", &w);
    st_free(&w);
    int64_t valid = 0;
    for (int64_t i = lo * 16; i < hi * 16; i++) valid += t[i] != -100;
    ok(gradc("run " TG " -D V=256 -D B=%lld --params %s/p.st --inputs %s/w.st", (long long)(hi - lo), dir, dir));
    num += (double)valid * loss_of(out, "ce");
    den += (double)valid;
  }
  close_to(ev, num / den, 1e-5, "eval vs the count-weighted windows");
  ok(gradc("run " TG " -D V=256 -D B=%d --params %s/p.st --inputs %s/dig.st", NSAMPLES, dir, dir));
  close_to(ev, loss_of(out, "ce"), 1e-5, "eval vs run -D B=45");
  st_free(&d);

  /* A batch-independent term counts once, and a prime count runs in
   * micro-batches of one: 13 samples of examples/mlp.gdl with B = 8. */
  ok(gradc("init examples/mlp.gdl -D B=8 -o %s/mp13.st --seed 5", dir));
  ok(gradc("data random examples/mlp.gdl -D B=13 -o %s/md13.st --seed 6", dir));
  ok(gradc("eval examples/mlp.gdl -D B=8 --params %s/mp13.st --data %s/md13.st", dir, dir));
  assert_non_null(strstr(err, "13 samples as one window of 13 micro-batches of 1"));
  static char ev13[sizeof out];
  strcpy(ev13, out);
  ok(gradc("run examples/mlp.gdl -D B=13 --params %s/mp13.st --inputs %s/md13.st", dir, dir));
  close_to(loss_of(ev13, "ce"), loss_of(out, "ce"), 1e-5, "mlp ce over 13");
  close_to(loss_of(ev13, "l2"), loss_of(out, "l2"), 1e-6, "mlp l2 counted once");
  close_to(loss_of(ev13, "total"), loss_of(out, "total"), 1e-5, "mlp total over 13");
}

/* ---- generate ---- */

static void test_generate_seeded_and_argmax(void **state) {
  (void)state;
  /* The compact vocabulary: every token is a byte of the text. */
  StFile dc;
  read_st("dc.st", &dc);
  int nv = atoi(st_get_meta(&dc, "vocab_size"));
  const char *vocab = st_get_meta(&dc, "vocab");
  assert_true(nv > 5 && nv < 40);
  int byte_of[256], n = 0;
  for (const char *q = vocab + 1; *q && *q != ']'; q++) {
    byte_of[n++] = (int)strtol(q, (char **)&q, 10);
    if (*q == ']') break;
  }
  assert_int_equal(n, nv);
  st_free(&dc);
  char defs[64];
  snprintf(defs, sizeof defs, "-D V=%d", nv);
  ok(gradc("init " TG " %s -o %s/pc.st --seed 9", defs, dir));

  static char first[sizeof out];
  ok(gradc("generate " TG " %s --params %s/pc.st --vocab %s/dc.st --prompt 'the cat' --max-tokens 24 --seed 5", defs,
           dir, dir));
  strcpy(first, out);
  assert_int_equal(strncmp(first, "the cat", 7), 0);
  assert_int_equal((int)strlen(first), 7 + 24 + 1);
  ok(gradc("generate " TG " %s --params %s/pc.st --vocab %s/dc.st --prompt 'the cat' --max-tokens 24 --seed 5", defs,
           dir, dir));
  assert_string_equal(out, first);
  ok(gradc("generate " TG " %s --params %s/pc.st --vocab %s/dc.st --prompt 'the cat' --max-tokens 24 --seed 6", defs,
           dir, dir));
  assert_string_not_equal(out, first);

  /* Temperature 0: the argmax of the logits run --outputs-out gives for
   * the prompt in row 0 (zeros after it; one sample). */
  const char *prompt = "the mat";
  ok(gradc("generate " TG " %s --params %s/pc.st --vocab %s/dc.st --prompt '%s' --max-tokens 1 --temperature 0", defs,
           dir, dir, prompt));
  int got = (unsigned char)out[strlen(prompt)];
  int32_t idx[16] = {0}, zeros[16] = {0};
  for (int i = 0; prompt[i]; i++)
    for (int k = 0; k < nv; k++)
      if (byte_of[k] == (unsigned char)prompt[i]) idx[i] = k;
  StFile in;
  st_init(&in);
  int64_t shape[2] = {1, 16};
  st_add(&in, "idx", ST_I32, 2, shape, idx);
  st_add(&in, "targets", ST_I32, 2, shape, zeros);
  write_st("gen_in.st", &in);
  st_free(&in);
  ok(gradc("run " TG " %s -D B=1 --params %s/pc.st --inputs %s/gen_in.st --outputs-out %s/gen_out.st", defs, dir, dir,
           dir));
  StFile o;
  read_st("gen_out.st", &o);
  const float *lg = (const float *)st_find(&o, "logits")->data + (strlen(prompt) - 1) * (size_t)nv;
  int best = 0;
  for (int k = 1; k < nv; k++)
    if (lg[k] > lg[best]) best = k;
  st_free(&o);
  if (got != byte_of[best]) fail_msg("temperature 0 gave byte %d, the argmax is token %d (byte %d)", got, best, byte_of[best]);
}

/* ---- errors ---- */

static void test_infer_user_errors(void **state) {
  (void)state;
  /* generate: no i32[B, T] input; no output logits. */
  assert_int_equal(gradc("generate examples/mlp.gdl --params %s/mp.st --prompt hi", dir), 1);
  assert_non_null(strstr(err, "gradc: error: examples/mlp.gdl: generate needs an i32[B, T] input"));
  char path[256];
  snprintf(path, sizeof path, "%s/nologits.gdl", dir);
  FILE *f = fopen(path, "w");
  fputs("model lm {\n  batch B = 2\n  dim T = 4\n  input idx : i32[B, T]\n  param E : f32[8, 3]\n"
        "  loss l = mean(embedding(idx, E))\n}\n", f);
  fclose(f);
  ok(gradc("init %s -o %s/nl.st", path, dir));
  assert_int_equal(gradc("generate %s --params %s/nl.st --prompt hi", path, dir), 1);
  assert_non_null(strstr(err, "gradc: error: "));
  assert_non_null(strstr(err, "output logits"));
  assert_int_equal(gradc("generate " TG " -D V=256 --params %s/p.st --prompt ''", dir), 1);
  assert_non_null(strstr(err, "gradc: error: --prompt is empty"));
  assert_int_equal(gradc("generate " TG " -D V=256 --params %s/p.st --prompt hi --temperature -1", dir), 1);
  assert_non_null(strstr(err, "gradc: error: "));
  /* A prompt byte the compact vocabulary lacks. */
  assert_int_equal(gradc("generate " TG " -D V=20 --params %s/p.st --vocab %s/dc.st --prompt 'the Z'", dir, dir), 1);
  assert_non_null(strstr(err, "not in the vocabulary"));
  /* eval: a dataset without an input, and one with a tensor too many. */
  assert_int_equal(gradc("eval " TG " -D V=256 --params %s/p.st --data %s/mi.st", dir, dir), 1);
  assert_non_null(strstr(err, "gradc: error: "));
  assert_non_null(strstr(err, "no tensor 'idx'"));
  assert_int_equal(gradc("eval " TG " -D V=256 --params %s/p.st", dir), 1);
  assert_non_null(strstr(err, "gradc: error: eval needs --data"));
  assert_int_equal(gradc("train " TG " -D V=256 --data %s/d.st --val-every 2", dir), 1);
  assert_non_null(strstr(err, "gradc: error: --val-every needs --val-data"));
}

/* ---- train --val-data ---- */

static void test_train_val_data_logs_eval(void **state) {
  (void)state;
  ok(gradc("train " TG " -D V=256 --data %s/d.st --val-data %s/dig.st --val-every 3 --steps 7 --log %s/l.csv --plot "
           "%s/l.svg --params-out %s/po.st",
           dir, dir, dir, dir, dir));
  assert_non_null(strstr(err, "val step 3: loss ce "));
  assert_non_null(strstr(err, "val step 7: loss ce ")); /* the last step */
  char *csv = tu_read_in(dir, "l.csv");
  assert_non_null(strstr(csv, "step,lr,ce,total,grad_norm,elapsed_s,val_ce,val_total\n"));
  /* The last row's val_total is eval's on the params after the last step. */
  char *last = strrchr(csv, '\n');
  *last = 0;
  last = strrchr(csv, '\n') + 1;
  assert_int_equal(strncmp(last, "7,", 2), 0);
  double val = strtod(strrchr(last, ',') + 1, NULL);
  free(csv);
  ok(gradc("eval " TG " -D V=256 --params %s/po.st --data %s/dig.st", dir, dir));
  close_to(val, loss_of(out, "total"), 1e-7, "val_total of the last row");
  char *svg = tu_read_in(dir, "l.svg");
  assert_non_null(strstr(svg, "val total"));
  free(svg);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_infer_equals_run),
      cmocka_unit_test(test_infer_forward_only_has_no_gradients),
      cmocka_unit_test(test_eval_equals_one_batch),
      cmocka_unit_test(test_eval_partial_window_counts_each_sample_once),
      cmocka_unit_test(test_generate_seeded_and_argmax),
      cmocka_unit_test(test_infer_user_errors),
      cmocka_unit_test(test_train_val_data_logs_eval),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
