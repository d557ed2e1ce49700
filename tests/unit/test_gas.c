/* test_gas.c - the gradient-accumulation rule end to end (DESIGN.md §3):
 * a window of K micro-batches gives the full-batch losses and gradients.
 *
 * The oracle for "full batch" is independent of gas-fold: the frontend's
 * graph differentiated as written (K = 1, no folding; every mean divides by
 * its own count in-graph), and central finite differences of the loss.
 * Everything runs on the reference interpreter in exact f64. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "passes/passes.h"
#include "runtime/runtime.h"
#include "testutil.h"

typedef struct Run {
  StepResult r;
  double total;
} Run;

static FeModel *compile_defs(const char *name, const char *text, int gas, const char **dn, const int64_t *dv, int nd,
                             Diag *d) {
  static SrcFile src;
  src = (SrcFile){name, text, strlen(text)};
  diag_init(d, NULL);
  d->quiet = true;
  FeOptions o = {.def_names = dn, .def_values = dv, .ndefs = nd, .gas = gas, .dp = 1};
  return fe_model_compile(&src, &o, d);
}

/* Run the default pipeline (fold = true) or autodiff alone (fold = false,
 * K must be 1) and one window on the interpreter. */
static bool run_model(FeModel *m, int gas, bool fold, const StFile *params, const StFile *inputs, Run *out, Diag *d) {
  PassManager pm;
  pm_init(&pm);
  pm.verify = true;
  PassOptions po = {.gas = gas, .diag = d, .src = &m->src};
  int n;
  const char *const *pipe = pass_pipeline(&n);
  const char *unfolded[] = {"autodiff", "simplify", "cse", "dce"};
  int rc = fold ? pm_run(&pm, m->func, pipe, n, &po) : pm_run(&pm, m->func, unfolded, 4, &po);
  if (rc) return false;
  InterpOptions io = {.exact_f64 = true};
  char err[512];
  if (!step_run_ref(m->func, gas, params, "params", inputs, "inputs", &io, &out->r, err, sizeof err))
    fail_msg("step failed: %s", err);
  out->total = 0;
  for (int i = 0; i < out->r.nlosses; i++) out->total += out->r.losses[i];
  return true;
}

static void random_params(const FeModel *m, uint64_t seed, StFile *st) {
  Rng rng;
  rng_seed(&rng, seed);
  st_init(st);
  for (int i = 0; i < m->nparams; i++) {
    const FeParam *p = &m->params[i];
    int64_t n = ir_numel(&p->type.shape);
    double *buf = malloc(sizeof(double) * (size_t)(n ? n : 1));
    for (int64_t j = 0; j < n; j++) buf[j] = 0.3 * rng_normal(&rng) + (p->init == FE_INIT_ONES ? 1.0 : 0.0);
    st_add(st, p->name, ST_F64, p->type.shape.rank, p->type.shape.dim, buf);
    free(buf);
  }
}

static double rel_err(const double *a, const double *b, int64_t n) {
  double d = 0, r = 0;
  for (int64_t i = 0; i < n; i++) {
    d += (a[i] - b[i]) * (a[i] - b[i]);
    r += b[i] * b[i];
  }
  if (r == 0) return sqrt(d);
  return sqrt(d / r);
}

/* Compare two runs loss by loss and gradient by gradient; returns the worst error. */
static double compare(const Run *a, const Run *b) {
  double worst = 0;
  assert_int_equal(a->r.nlosses, b->r.nlosses);
  assert_int_equal(a->r.ngrads, b->r.ngrads);
  for (int i = 0; i < a->r.nlosses; i++) {
    assert_string_equal(a->r.loss_names[i], b->r.loss_names[i]);
    double e = fabs(a->r.losses[i] - b->r.losses[i]) / fmax(fabs(b->r.losses[i]), 1e-300);
    if (b->r.losses[i] == 0) e = fabs(a->r.losses[i]);
    if (e > worst) worst = e;
  }
  for (int i = 0; i < a->r.ngrads; i++) {
    assert_string_equal(a->r.grad_names[i], b->r.grad_names[i]);
    double e = rel_err(a->r.grads[i], b->r.grads[i], ir_numel(&a->r.grad_types[i].shape));
    if (e > worst) worst = e;
  }
  return worst;
}

/* K micro-batches (folded) vs the unfolded full batch, on one model text. */
static double check_window(const char *name, const char *text, int gas, const StFile *inputs_or_null,
                           const char **dn, const int64_t *dv, int nd, uint64_t seed) {
  Diag d1, d2;
  FeModel *full = compile_defs(name, text, 1, dn, dv, nd, &d1);
  if (!full) fail_msg("%s", sb_str(&d1.log));
  FeModel *win = compile_defs(name, text, gas, dn, dv, nd, &d2);
  if (!win) fail_msg("%s", sb_str(&d2.log));
  StFile params, inputs;
  random_params(full, seed, &params);
  if (inputs_or_null) {
    inputs = *inputs_or_null;
  } else {
    st_init(&inputs);
    rt_random_inputs(full->func, 1, seed + 1, &inputs);
  }
  Run a, b;
  assert_true(run_model(full, 1, false, &params, &inputs, &a, &d1));
  if (!run_model(win, gas, true, &params, &inputs, &b, &d2)) fail_msg("%s", sb_str(&d2.log));
  double e = compare(&b, &a);
  step_result_free(&a.r);
  step_result_free(&b.r);
  st_free(&params);
  if (!inputs_or_null) st_free(&inputs);
  fe_model_free(full);
  fe_model_free(win);
  diag_free(&d1);
  diag_free(&d2);
  return e;
}

static void test_gas_examples_match_full_batch(void **state) {
  (void)state;
  struct {
    const char *file;
    const char *dn[8];
    int64_t dv[8];
    int nd;
  } ex[] = {
      {"examples/mlp.gdl", {"B", "D", "H"}, {8, 12, 10}, 3},
      {"examples/multitask.gdl", {"B"}, {8}, 1},
      {"examples/tinygpt.gdl", {"B", "T", "C", "L", "V"}, {4, 8, 16, 2, 24}, 5},
  };
  for (size_t i = 0; i < sizeof ex / sizeof ex[0]; i++) {
    char *text = tu_read(ex[i].file);
    for (int k = 2; k <= 4; k += 2) {
      double e = check_window(ex[i].file, text, k, NULL, ex[i].dn, ex[i].dv, ex[i].nd, 11 + i);
      print_message("%s K=%d: worst relative error %.3g\n", ex[i].file, k, e);
      assert_true(e < 1e-6);
    }
    free(text);
  }
}

/* A language-model head whose samples have very different numbers of
 * valid targets: per-micro-batch means would be wrong. */
static const char *lm_text =
    "model lm {\n"
    "  batch B = 8\n"
    "  dim T = 5\n"
    "  dim V = 7\n"
    "  dim D = 6\n"
    "  input tok : i32[B, T]\n"
    "  input lbl : i32[B, T]\n"
    "  param E : f32[V, D]\n"
    "  param W : f32[D, V]\n"
    "  param g : f32[D] init ones\n"
    "  x = rms_norm(embedding(tok, E), g)\n"
    "  loss ce = cross_entropy(x @ W, lbl, ignore_index=-100)\n"
    "}\n";

static void lm_inputs(StFile *st, const int *valid_per_sample, uint64_t seed) {
  Rng rng;
  rng_seed(&rng, seed);
  int32_t tok[8 * 5], lbl[8 * 5];
  for (int b = 0; b < 8; b++)
    for (int t = 0; t < 5; t++) {
      tok[b * 5 + t] = (int32_t)(rng_next(&rng) % 7);
      lbl[b * 5 + t] = t < valid_per_sample[b] ? (int32_t)(rng_next(&rng) % 7) : -100;
    }
  int64_t shape[2] = {8, 5};
  st_init(st);
  st_add(st, "tok", ST_I32, 2, shape, tok);
  st_add(st, "lbl", ST_I32, 2, shape, lbl);
}

static void test_gas_ignore_index_uses_window_count(void **state) {
  (void)state;
  int valid[8] = {1, 0, 5, 2, 5, 5, 1, 4};
  StFile in;
  lm_inputs(&in, valid, 3);
  for (int k = 2; k <= 8; k *= 2) {
    double e = check_window("lm.gdl", lm_text, k, &in, NULL, NULL, 0, 5);
    print_message("ignore_index K=%d: worst relative error %.3g\n", k, e);
    assert_true(e < 1e-6);
  }
  st_free(&in);
}

static void test_gas_empty_micro_batch_and_empty_window(void **state) {
  (void)state;
  /* First micro-batch (of 2) has no valid target at all. */
  int some[8] = {0, 0, 0, 0, 3, 5, 1, 2};
  StFile in;
  lm_inputs(&in, some, 4);
  double e = check_window("lm.gdl", lm_text, 2, &in, NULL, NULL, 0, 6);
  assert_true(e < 1e-6);
  st_free(&in);
  /* No valid target in the whole window: loss 0 and gradient 0, no NaN. */
  int none[8] = {0};
  lm_inputs(&in, none, 5);
  Diag d;
  FeModel *m = compile_defs("lm.gdl", lm_text, 4, NULL, NULL, 0, &d);
  assert_non_null(m);
  StFile params;
  random_params(m, 9, &params);
  Run r;
  assert_true(run_model(m, 4, true, &params, &in, &r, &d));
  assert_true(r.r.losses[0] == 0.0);
  for (int i = 0; i < r.r.ngrads; i++)
    for (int64_t j = 0; j < ir_numel(&r.r.grad_types[i].shape); j++) assert_true(r.r.grads[i][j] == 0.0);
  step_result_free(&r.r);
  st_free(&params);
  st_free(&in);
  fe_model_free(m);
  diag_free(&d);
}

/* Two losses share a sub-graph; a penalty does not depend on the batch. */
static const char *shared_text =
    "model shared {\n"
    "  batch B = 8\n"
    "  dim D = 3\n"
    "  input x : f32[B, D]\n"
    "  input y : f32[B, 2]\n"
    "  param W : f32[D, 2]\n"
    "  param V : f32[D, 2]\n"
    "  e = mse_loss(tanh(x @ W), y)\n"
    "  loss a = e\n"
    "  loss b = 0.5 * e - 2 * mean(x @ W) + 0.1 * sum(W * W) + sum(V * V) / B\n"
    "  loss c = detach(e) + sum(x @ V) / B\n"
    "}\n";

static void test_gas_shared_subgraph_and_penalty_counted_once(void **state) {
  (void)state;
  for (int k = 2; k <= 8; k *= 2) {
    double e = check_window("shared.gdl", shared_text, k, NULL, NULL, NULL, 0, 21);
    print_message("shared K=%d: worst relative error %.3g\n", k, e);
    assert_true(e < 1e-6);
  }
}

/* After gas-fold every scale lives in a grad.seed: no batch mean is left,
 * and there is exactly one seed per term. */
static void test_gas_fold_puts_scales_at_the_root(void **state) {
  (void)state;
  Diag d;
  FeModel *m = compile_defs("shared.gdl", shared_text, 4, NULL, NULL, 0, &d);
  assert_non_null(m);
  PassOptions po = {.gas = 4, .diag = &d, .src = &m->src};
  Arena scratch;
  arena_init(&scratch);
  assert_int_equal(pass_gas_fold(m->func, &po, &scratch), PASS_CHANGED);
  arena_free(&scratch);
  arena_init(&scratch);
  assert_int_equal(pass_dce(m->func, &po, &scratch), PASS_CHANGED);
  arena_free(&scratch);
  int seeds = 0, terms = 0, means = 0, windows = 0;
  for (int i = 0; i < m->func->nops; i++) {
    IrOp *op = m->func->ops[i];
    seeds += op->opcode == IR_OP_GRAD_SEED;
    terms += op->opcode == IR_OP_LOSS_TERM;
    windows += op->opcode == IR_OP_WINDOW_SUM;
    if (op->opcode == IR_OP_MSE_LOSS) assert_string_equal(ir_attr_get_str(op, "reduction", ""), "sum");
    means += op->opcode == IR_OP_MEAN;
  }
  /* a: e;  b: e, mean, penalty W, penalty V (a sum over no samples: once);
   * c: detach(e), sum(x @ V) / B. */
  assert_int_equal(terms, 7);
  assert_int_equal(seeds, terms);
  assert_int_equal(means, 0);
  assert_true(windows >= 2);
  char err[256];
  assert_true(ir_verify(m->func, err, sizeof err));
  fe_model_free(m);
  diag_free(&d);
}

static const char *refuse_text =
    "model refuse {\n"
    "  batch B = 8\n"
    "  dim D = 3\n"
    "  input x : f32[B, D]\n"
    "  param W : f32[D, 4]\n"
    "  h = sigmoid(x @ W)\n"
    "  loss ok = mean(h)\n"
    "  loss cov = 0.5 * mean(h) * mean(h * h)\n"
    "  loss var = sum((h - mean(h, axis=0)) ** 2)\n"
    "}\n";

static void test_gas_refuses_non_decomposable_loss_with_location(void **state) {
  (void)state;
  Diag d;
  FeModel *m = compile_defs("refuse.gdl", refuse_text, 2, NULL, NULL, 0, &d);
  assert_non_null(m);
  PassOptions po = {.gas = 2, .diag = &d, .src = &m->src};
  Arena scratch;
  arena_init(&scratch);
  assert_int_equal(pass_gas_fold(m->func, &po, &scratch), PASS_ERROR);
  arena_free(&scratch);
  const char *log = sb_str(&d.log);
  /* The product of two batch reductions: at the second `*` of line 8. */
  assert_non_null(strstr(log, "refuse.gdl:8:28: error: loss 'cov' cannot be split into 2 micro-batches"));
  /* Centring feeding a square: refused at line 9 (the `-` that mixes). */
  assert_non_null(strstr(log, "refuse.gdl:9:"));
  assert_int_equal(d.nerrors, 2);
  fe_model_free(m);
  diag_free(&d);
  /* With K = 1 the same model runs, and equals the unfolded graph. */
  double e = check_window("refuse.gdl", refuse_text, 1, NULL, NULL, NULL, 0, 3);
  assert_true(e < 1e-12);
}

/* Language v2 selection (DESIGN.md §2, GAS rule): along a non-batch axis,
 * or rows of a param by a per-sample index, a term stays a sum over
 * samples, so K = 2 gives the full-batch losses and gradients ... */
static void test_gas_v2_selection_per_sample_matches_full_batch(void **state) {
  (void)state;
  char *text = tu_read("tests/models/v2_select.gdl");
  for (char *p = strstr(text, "f32"); p; p = strstr(p, "f32")) p[1] = '6', p[2] = '4'; /* f64: no f32 rounding */
  for (int k = 2; k <= 4; k += 2) {
    double e = check_window("v2_select.gdl", text, k, NULL, NULL, NULL, 0, 30 + (uint64_t)k);
    print_message("tests/models/v2_select.gdl (f64) K=%d: worst relative error %.3g\n", k, e);
    assert_true(e < 1e-12);
  }
  free(text);
}

/* ... while argmax (topk), gather and index_select across the batch axis
 * mix samples and are refused at the op under K > 1, with the reason. */
static const char *select_refuse_text =
    "model sel {\n"
    "  batch B = 8\n"
    "  dim D = 3\n"
    "  input x : f32[B, D]\n"
    "  input i : i32[2, D]\n"
    "  input j : i32[4]\n"
    "  param W : f32[D, D]\n"
    "  h = x @ W\n"
    "  loss am = sum(gather(h, reshape(argmax(h, axis=0), [1, D]), 0))\n"
    "  loss ga = sum(gather(h, i, 0))\n"
    "  loss is = sum(index_select(h, j, 0))\n"
    "  loss ok = sum(gather(h, reshape(argmax(h, axis=1), [B, 1]), 1) * 0) + mean(index_select(h, j[0:2], 1))\n"
    "}\n";

static void test_gas_v2_refuses_selection_across_batch(void **state) {
  (void)state;
  Diag d;
  FeModel *m = compile_defs("sel.gdl", select_refuse_text, 2, NULL, NULL, 0, &d);
  if (!m) fail_msg("%s", sb_str(&d.log));
  PassOptions po = {.gas = 2, .diag = &d, .src = &m->src};
  Arena scratch;
  arena_init(&scratch);
  assert_int_equal(pass_gas_fold(m->func, &po, &scratch), PASS_ERROR);
  arena_free(&scratch);
  const char *log = sb_str(&d.log);
  assert_non_null(strstr(log, "sel.gdl:9:35: error: loss 'am' cannot be split into 2 micro-batches: it selects the "
                              "largest values across the batch axis (topk, argmax)"));
  assert_non_null(strstr(log, "sel.gdl:10:17: error: loss 'ga' cannot be split into 2 micro-batches: it gathers "
                              "across the batch axis"));
  assert_non_null(strstr(log, "sel.gdl:11:17: error: loss 'is' cannot be split into 2 micro-batches: it gathers "
                              "across the batch axis"));
  assert_int_equal(d.nerrors, 3);
  fe_model_free(m);
  diag_free(&d);
}

/* Finite differences of the window loss vs the K = 4 gradient. */
/* only: the params to probe (NULL-terminated), NULL = all.  Finite
 * differences see through detach, gradients do not: a model with detach
 * probes only the params no detached path depends on. */
static double fd_check(const char *file, const char **dn, const int64_t *dv, int nd, const char *const *only) {
  char *text = tu_read(file);
  Diag d;
  FeModel *m = compile_defs(file, text, 4, dn, dv, nd, &d);
  if (!m) fail_msg("%s", sb_str(&d.log));
  FeModel *fwd = compile_defs(file, text, 4, dn, dv, nd, &d);
  StFile params, inputs;
  random_params(m, 17, &params);
  st_init(&inputs);
  rt_random_inputs(m->func, 4, 18, &inputs);
  Run r;
  assert_true(run_model(m, 4, true, &params, &inputs, &r, &d));
  /* Loss-only program: gas-fold without autodiff. */
  PassManager pm;
  pm_init(&pm);
  PassOptions po = {.gas = 4, .diag = &d, .src = &fwd->src};
  const char *fold_only[] = {"gas-fold"};
  assert_int_equal(pm_run(&pm, fwd->func, fold_only, 1, &po), 0);
  InterpOptions io = {.exact_f64 = true};
  Rng rng;
  rng_seed(&rng, 99);
  double worst = 0;
  for (int g = 0; g < r.r.ngrads; g++) {
    bool probe_it = !only;
    for (int i = 0; only && only[i]; i++) probe_it |= strcmp(only[i], r.r.grad_names[g]) == 0;
    if (!probe_it) continue;
    StTensor *t = NULL;
    for (int i = 0; i < params.n; i++)
      if (strcmp(params.t[i].name, r.r.grad_names[g]) == 0) t = &params.t[i];
    assert_non_null(t);
    int64_t n = st_numel(t);
    for (int probe = 0; probe < 3; probe++) {
      int64_t j = (int64_t)(rng_next(&rng) % (uint64_t)n);
      double *p = (double *)t->data + j, x0 = *p, h = 1e-5, lp, lm;
      Run a;
      char err[256];
      *p = x0 + h;
      assert_true(step_run_ref(fwd->func, 4, &params, "p", &inputs, "i", &io, &a.r, err, sizeof err));
      lp = 0;
      for (int i = 0; i < a.r.nlosses; i++) lp += a.r.losses[i];
      step_result_free(&a.r);
      *p = x0 - h;
      assert_true(step_run_ref(fwd->func, 4, &params, "p", &inputs, "i", &io, &a.r, err, sizeof err));
      lm = 0;
      for (int i = 0; i < a.r.nlosses; i++) lm += a.r.losses[i];
      step_result_free(&a.r);
      *p = x0;
      double fd = (lp - lm) / (2 * h), got = r.r.grads[g][j];
      double e = fabs(fd - got) / fmax(1e-3, fabs(fd));
      if (e > worst) worst = e;
      if (e > 1e-5) fail_msg("d%s[%lld]: autodiff %.10g, finite differences %.10g", r.r.grad_names[g], (long long)j, got, fd);
    }
  }
  print_message("%s K=4 vs finite differences: worst relative error %.3g\n", file, worst);
  step_result_free(&r.r);
  st_free(&params);
  st_free(&inputs);
  fe_model_free(m);
  fe_model_free(fwd);
  free(text);
  diag_free(&d);
  return worst;
}

static void test_gas_gradient_matches_finite_differences(void **state) {
  (void)state;
  const char *gpt[] = {"B", "T", "C", "L", "V"};
  int64_t gptv[] = {4, 6, 8, 1, 11};
  const char *mlp[] = {"B", "D", "H"};
  int64_t mlpv[] = {8, 12, 10};
  const char *mt[] = {"B"};
  int64_t mtv[] = {8};
  /* multitask's trunk feeds the regression head through detach. */
  const char *heads[] = {"Wc", "bc", "Wr", "br", NULL};
  assert_true(fd_check("examples/tinygpt.gdl", gpt, gptv, 5, NULL) < 1e-5);
  assert_true(fd_check("examples/mlp.gdl", mlp, mlpv, 3, NULL) < 1e-5);
  assert_true(fd_check("examples/multitask.gdl", mt, mtv, 1, heads) < 1e-5);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_gas_examples_match_full_batch),
      cmocka_unit_test(test_gas_v2_selection_per_sample_matches_full_batch),
      cmocka_unit_test(test_gas_v2_refuses_selection_across_batch),
      cmocka_unit_test(test_gas_ignore_index_uses_window_count),
      cmocka_unit_test(test_gas_empty_micro_batch_and_empty_window),
      cmocka_unit_test(test_gas_shared_subgraph_and_penalty_counted_once),
      cmocka_unit_test(test_gas_fold_puts_scales_at_the_root),
      cmocka_unit_test(test_gas_refuses_non_decomposable_loss_with_location),
      cmocka_unit_test(test_gas_gradient_matches_finite_differences),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
