/* test_exec_window.c - what the CPU executor does around the program in
 * a window: params it already holds are not copied in again, and a GEMM
 * that writes a whole gradient first stores instead of accumulating.
 *
 * The model is linear, so every value is derived by hand: with
 * loss s = sum(x @ W), s = sum_d colsum(x)[d] * rowsum(W)[d] and
 * dW[d][j] = colsum(x)[d] (the weight gradient is one GEMM, x^T @ ones,
 * the window's only writer of dW).  Through the session API: a run sees
 * every set_param, load_params, optimiser step and checkpoint load before
 * it, also when the params are unchanged in between (no copy) and with two
 * sessions taking turns on one program; K = 1 and K = 4 (the store in the
 * first micro-batch, accumulation in the others).  Through the executor:
 * the same params generation with other tensors is still copied, and a
 * result handed back (cpu_program_recycle) is filled again by the next
 * window: its arrays reused, nothing of the poisoned old values left
 * (cpu_program_skip_grads: one window's gradients are not read out). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gradc.h"
#include "passes/passes.h"
#include "runtime/runtime.h"
#include "testutil.h"

/* B = 8 rows (a window; K micro-batches of 8 / K), D = 3, two columns. */
static const char lin_src[] = "model lin {\n"
                              "  batch B = 8\n"
                              "  dim D = 3\n"
                              "  input x : f32[B, D]\n"
                              "  param W : f32[D, 2] init zeros\n"
                              "  loss s = sum(x @ W)\n"
                              "}\n";

enum { B = 8, D = 3, J = 2 };

static float X[B * D];

static void make_x(void) {
  for (int i = 0; i < B * D; i++) X[i] = (float)((i * 7) % 11) - 4.0f; /* small integers: exact sums */
}

static double colsum(int d) {
  double s = 0;
  for (int b = 0; b < B; b++) s += X[b * D + d];
  return s;
}

/* The loss for W, by hand. */
static double loss_of(const float *w) {
  double s = 0;
  for (int d = 0; d < D; d++) s += colsum(d) * ((double)w[d * J] + w[d * J + 1]);
  return s;
}

static void check_run(gradc_session *s, const float *w, const char *what) {
  assert_int_equal(gradc_session_run(s), GRADC_OK);
  double got = gradc_session_loss(s, 0), want = loss_of(w);
  if (!(fabs(got - want) <= 1e-4 * (1 + fabs(want)))) fail_msg("%s: loss %.9g, by hand %.9g", what, got, want);
  float g[D * J];
  assert_int_equal(gradc_session_get_grad(s, "W", g, D * J), GRADC_OK);
  for (int d = 0; d < D; d++)
    for (int j = 0; j < J; j++)
      if (!(fabs(g[d * J + j] - colsum(d)) <= 1e-4)) fail_msg("%s: dW[%d][%d] %.9g, by hand %.9g", what, d, j, g[d * J + j], colsum(d));
}

static gradc_program *compile(int gas) {
  gradc_compile_options o;
  gradc_compile_options_init(&o);
  o.target = "cpu";
  o.gas = gas;
  o.no_cache = true;
  gradc_program *p = NULL;
  if (gradc_program_compile_source("lin.gdl", lin_src, &o, &p) != GRADC_OK) fail_msg("compile: %s", gradc_last_error());
  return p;
}

static gradc_session *session(gradc_program *p, const float *w) {
  gradc_session *s = NULL;
  assert_int_equal(gradc_session_new(p, &s), GRADC_OK);
  assert_int_equal(gradc_session_set_input(s, "x", GRADC_F32, X, B * D), GRADC_OK);
  assert_int_equal(gradc_session_set_param(s, "W", w, D * J), GRADC_OK);
  return s;
}

static void test_exec_window_session_sees_every_param_change(void **state) {
  (void)state;
  make_x();
  char dir[] = "/tmp/gradc_exec_window_XXXXXX";
  assert_non_null(mkdtemp(dir));
  char saved[300], ckpt[300];
  snprintf(saved, sizeof saved, "%s/params.safetensors", dir);
  snprintf(ckpt, sizeof ckpt, "%s/ckpt.safetensors", dir);
  for (int gas = 1; gas <= 4; gas += 3) {
    gradc_program *p = compile(gas);
    float w[D * J] = {1, 2, 3, 4, 5, 6}, v[D * J] = {-1, 0.5f, 2, -3, 0.25f, 1};
    gradc_session *s = session(p, w);
    check_run(s, w, "first run");
    check_run(s, w, "unchanged params");
    w[3] = -7;
    assert_int_equal(gradc_session_set_param(s, "W", w, D * J), GRADC_OK);
    check_run(s, w, "after set_param");

    /* A second session on the same program, then the first again. */
    gradc_session *t = session(p, v);
    check_run(t, v, "second session");
    check_run(s, w, "first session again");
    check_run(t, v, "second session again");
    gradc_session_free(t);

    /* An optimiser step: SGD, W -= lr * dW. */
    gradc_optimizer_options oo;
    gradc_optimizer_options_init(&oo, GRADC_SGD);
    oo.lr = 0.125;
    assert_int_equal(gradc_session_set_optimizer(s, &oo), GRADC_OK);
    assert_int_equal(gradc_session_save_params(s, saved), GRADC_OK);
    float before[D * J];
    memcpy(before, w, sizeof w);
    assert_int_equal(gradc_session_step(s), GRADC_OK);
    for (int d = 0; d < D; d++)
      for (int j = 0; j < J; j++) w[d * J + j] = (float)(w[d * J + j] - 0.125 * colsum(d));
    check_run(s, w, "after a step");
    assert_int_equal(gradc_session_save_checkpoint(s, ckpt), GRADC_OK);

    /* Loads: the params saved before the step, then the checkpoint after it. */
    assert_int_equal(gradc_session_load_params(s, saved), GRADC_OK);
    check_run(s, before, "after load_params");
    assert_int_equal(gradc_session_load_checkpoint(s, ckpt), GRADC_OK);
    check_run(s, w, "after load_checkpoint");
    assert_int_equal(gradc_session_init_params(s, 1), GRADC_OK); /* init zeros */
    float zero[D * J] = {0};
    check_run(s, zero, "after init_params");
    gradc_session_free(s);
    gradc_program_free(p);
  }
  unlink(saved);
  unlink(ckpt);
  rmdir(dir);
}

/* A model for K micro-batches through the CPU pipeline, as the
 * executor's program on one thread; the model in *m (free both). */
static CpuProgram *cpu_program_of(const char *file, const char *src, int gas, FeModel **m) {
  Diag d;
  *m = tu_compile(file, src, gas, &d);
  assert_non_null(*m);
  int n;
  const char *const *names = pass_pipeline_cpu(&n);
  PassManager pm;
  pm_init(&pm);
  PassOptions po = {.gas = gas, .diag = &d};
  assert_int_equal(pm_run(&pm, (*m)->func, names, n, &po), 0);
  diag_free(&d);
  char err[1024];
  CpuOptions o = {.threads = 1};
  CpuProgram *p = cpu_program_new((*m)->func, &o, err, sizeof err);
  if (!p) fail_msg("%s", err);
  return p;
}

static CpuProgram *cpu_program(int gas, FeModel **m) { return cpu_program_of("lin.gdl", lin_src, gas, m); }

/* Window i's inputs: other values every window. */
static void window_inputs(StFile *in, int i) {
  int64_t xshape[2] = {B, D};
  make_x();
  for (int k = 0; k < B * D; k++) X[k] *= (float)(i + 1);
  st_init(in);
  st_add(in, "x", ST_F32, 2, xshape, X);
}

/* The params file of W. */
static void w_params(StFile *a, float *w) {
  int64_t wshape[2] = {D, J};
  st_init(a);
  st_add(a, "W", ST_F32, 2, wshape, w);
}

/* The executor: a params generation held with other tensors is copied. */
static void test_exec_window_same_generation_other_tensors(void **state) {
  (void)state;
  make_x();
  FeModel *m;
  CpuProgram *p = cpu_program(1, &m);
  char err[1024];
  float w1[D * J] = {1, 2, 3, 4, 5, 6}, w2[D * J] = {6, 5, 4, 3, 2, 1};
  int64_t wshape[2] = {D, J}, xshape[2] = {B, D};
  StFile a, b, in;
  st_init(&a);
  st_init(&b);
  st_init(&in);
  st_add(&a, "W", ST_F32, 2, wshape, w1);
  st_add(&b, "W", ST_F32, 2, wshape, w2);
  st_add(&in, "x", ST_F32, 2, xshape, X);
  const StFile *order[] = {&a, &a, &b, &a};
  const float *want[] = {w1, w1, w2, w1};
  for (int i = 0; i < 4; i++) {
    StepResult r;
    cpu_program_set_params_gen(p, 42); /* one generation throughout: only the tensors differ */
    if (!cpu_step_run(p, 1, order[i], "P", &in, "I", &r, err, sizeof err)) fail_msg("%s", err);
    assert_true(fabs(r.losses[0] - loss_of(want[i])) < 1e-4 * (1 + fabs(loss_of(want[i]))));
    for (int k = 0; k < D * J; k++) assert_true(fabs(r.grads[0][k] - colsum(k / J)) < 1e-4);
    step_result_free(&r);
  }
  st_free(&a);
  st_free(&b);
  st_free(&in);
  cpu_program_free(p);
  fe_model_free(m);
}

/* A recycled result's arrays come back in the next window with that
 * window's values only: the old ones are poisoned (NaN, dp_reduced set)
 * before they are handed back, and each window has other inputs.  A
 * window told to skip the gradients has its losses and leaves the old
 * (poisoned) gradients; the window after it reads them out again. */
static void test_exec_window_recycled_result_is_refilled(void **state) {
  (void)state;
  FeModel *m;
  CpuProgram *p = cpu_program(4, &m); /* K = 4: micro-batches of 2 */
  char err[1024];
  float w[D * J] = {1, -2, 3, 0.5f, 5, 6};
  StFile a;
  w_params(&a, w);
  double *first = NULL;
  for (int i = 0; i < 4; i++) {
    StFile in;
    window_inputs(&in, i);
    StepResult r;
    bool skip = i == 2; /* this window only: the gradients stay in the arena */
    if (skip) cpu_program_skip_grads(p);
    if (!cpu_step_run(p, 4, &a, "P", &in, "I", &r, err, sizeof err)) fail_msg("%s", err);
    st_free(&in);
    if (!(fabs(r.losses[0] - loss_of(w)) <= 1e-4 * (1 + fabs(loss_of(w))))) /* NaN fails too */
      fail_msg("window %d: loss %.9g, by hand %.9g", i, r.losses[0], loss_of(w));
    for (int k = 0; k < D * J; k++)
      if (skip ? !isnan(r.grads[0][k]) : !(fabs(r.grads[0][k] - colsum(k / J)) <= 1e-4))
        fail_msg("window %d: dW[%d] %.9g, by hand %.9g", i, k, r.grads[0][k], colsum(k / J));
    assert_null(r.dp_reduced);
    if (i == 0)
      first = r.grads[0];
    else
      assert_ptr_equal(r.grads[0], first); /* the same array, refilled */
    for (int k = 0; k < D * J; k++) r.grads[0][k] = NAN;
    r.losses[0] = NAN;
    r.dp_reduced = calloc(2, sizeof(bool));
    r.dp_reduced[0] = true;
    cpu_program_recycle(p, &r);
    assert_null(r.grads);
  }
  st_free(&a);
  cpu_program_free(p); /* frees the result it holds */
  fe_model_free(m);
}

/* Outputs come back in a recycled result too, with this window's values
 * only: y (batched: the window's rows, micro-batches concatenated) and t
 * (a sum over the window) after windows of other inputs, the old arrays
 * poisoned before they are handed back. */
static const char lin_out_src[] = "model linout {\n"
                                  "  batch B = 8\n"
                                  "  dim D = 3\n"
                                  "  input x : f32[B, D]\n"
                                  "  param W : f32[D, 2] init zeros\n"
                                  "  output y = x @ W\n"
                                  "  output t = sum(x @ W)\n"
                                  "  loss s = sum(x @ W)\n"
                                  "}\n";

static void test_exec_window_recycled_outputs_are_refilled(void **state) {
  (void)state;
  FeModel *m;
  CpuProgram *p = cpu_program_of("linout.gdl", lin_out_src, 4, &m);
  char err[1024];
  float w[D * J] = {1, -2, 3, 0.5f, 5, 6};
  StFile a;
  w_params(&a, w);
  double *first = NULL;
  for (int i = 0; i < 3; i++) {
    StFile in;
    window_inputs(&in, i);
    StepResult r;
    if (!cpu_step_run(p, 4, &a, "P", &in, "I", &r, err, sizeof err)) fail_msg("%s", err);
    st_free(&in);
    assert_int_equal(r.noutputs, 2);
    assert_string_equal(r.output_names[0], "y");
    for (int b = 0; b < B; b++)
      for (int j = 0; j < J; j++) {
        double want = 0;
        for (int k = 0; k < D; k++) want += (double)X[b * D + k] * w[k * J + j];
        if (!(fabs(r.outputs[0][b * J + j] - want) <= 1e-4)) fail_msg("window %d: y[%d, %d] %.9g, by hand %.9g", i, b, j,
                                                                  r.outputs[0][b * J + j], want);
      }
    if (!(fabs(r.outputs[1][0] - loss_of(w)) <= 1e-4 * (1 + fabs(loss_of(w))))) /* NaN fails too */
      fail_msg("window %d: t %.9g, by hand %.9g", i, r.outputs[1][0], loss_of(w));
    if (i == 0)
      first = r.outputs[0];
    else
      assert_ptr_equal(r.outputs[0], first); /* the same array, refilled */
    for (int k = 0; k < B * J; k++) r.outputs[0][k] = NAN;
    r.outputs[1][0] = NAN;
    cpu_program_recycle(p, &r);
  }
  st_free(&a);
  cpu_program_free(p);
  fe_model_free(m);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_exec_window_session_sees_every_param_change),
      cmocka_unit_test(test_exec_window_same_generation_other_tensors),
      cmocka_unit_test(test_exec_window_recycled_result_is_refilled),
      cmocka_unit_test(test_exec_window_recycled_outputs_are_refilled),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
