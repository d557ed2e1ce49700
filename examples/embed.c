/* embed.c - gradc embedded in a C program: JIT-compile a model from source
 * text at start-up, initialise its params, and train it with AdamW on
 * synthetic data, printing the loss as it falls.  Uses only the public API
 * (gradc.h).  Exits 0 if the last window's loss is below the first's.
 *
 *   cc embed.c $(pkg-config --cflags gradc) $(pkg-config --libs gradc) -lm
 *
 * or, in CMake: find_package(gradc) and link gradc::gradc. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include <gradc.h>

/* A small regression network: 8 features -> 16 tanh units -> 1 output. */
static const char model_src[] =
    "model regress {\n"
    "  batch B = 32\n"
    "  dim   D = 8\n"
    "  dim   H = 16\n"
    "  input x : f32[B, D]\n"
    "  input y : f32[B, 1]\n"
    "  param W1 : f32[D, H] init normal(0, 0.3)\n"
    "  param b1 : f32[H]\n"
    "  param W2 : f32[H, 1] init normal(0, 0.3)\n"
    "  pred = tanh(x @ W1 + b1) @ W2\n"
    "  loss mse = mse_loss(pred, y)\n"
    "}\n";

enum { B = 32, D = 8, STEPS = 50 };

static int fail(const char *what) {
  fprintf(stderr, "embed: %s failed:\n%s\n", what, gradc_last_error());
  return 1;
}

/* Uniform in [-1, 1) from the session's generator (saved in checkpoints,
 * so a resumed run would draw the same data). */
static float uniform(gradc_session *s) { return (float)((double)(gradc_session_rng_next(s) >> 11) * 0x1.0p-52 - 1.0); }

/* One window of data from a fixed teacher: y = sin(x . a) + 0.5 x0 x1. */
static void make_window(gradc_session *s, float *x, float *y) {
  static const float a[D] = {0.9f, -0.6f, 0.4f, 0.8f, -0.3f, 0.5f, -0.7f, 0.2f};
  for (int i = 0; i < B; i++) {
    float dot = 0;
    for (int j = 0; j < D; j++) {
      x[i * D + j] = uniform(s);
      dot += a[j] * x[i * D + j];
    }
    y[i] = sinf(dot) + 0.5f * x[i * D] * x[i * D + 1];
  }
}

int main(void) {
  printf("gradc %s\n", gradc_version());

  /* Compile: 2 micro-batches of 16 samples per window of 32. */
  gradc_compile_options co;
  gradc_compile_options_init(&co);
  co.gas = 2;
  gradc_program *prog = NULL;
  if (gradc_program_compile_source("regress.gdl", model_src, &co, &prog) != GRADC_OK) return fail("compile");
  printf("compiled '%s': %d params, %d inputs, K = %d\n", "regress.gdl", gradc_program_num_params(prog),
         gradc_program_num_inputs(prog), gradc_program_gas(prog));

  gradc_session *s = NULL;
  if (gradc_session_new(prog, &s) != GRADC_OK) return fail("session_new");
  if (gradc_session_init_params(s, 42) != GRADC_OK) return fail("init_params");
  gradc_session_rng_seed(s, 7);

  gradc_optimizer_options oo;
  gradc_optimizer_options_init(&oo, GRADC_ADAMW);
  oo.lr = 2e-2;
  oo.weight_decay = 1e-4;
  oo.clip_norm = 1.0;
  oo.warmup_steps = 5;
  oo.total_steps = STEPS;
  oo.min_lr = 2e-3;
  if (gradc_session_set_optimizer(s, &oo) != GRADC_OK) return fail("set_optimizer");

  float x[B * D], y[B];
  double first = 0, last = 0;
  for (int step = 0; step < STEPS; step++) {
    make_window(s, x, y);
    if (gradc_session_set_input(s, "x", GRADC_F32, x, B * D) != GRADC_OK) return fail("set_input x");
    if (gradc_session_set_input(s, "y", GRADC_F32, y, B) != GRADC_OK) return fail("set_input y");
    if (gradc_session_run(s) != GRADC_OK) return fail("run");
    double loss = gradc_session_loss_total(s), lr = gradc_session_lr(s), norm = gradc_session_grad_norm(s);
    if (gradc_session_step(s) != GRADC_OK) return fail("step");
    if (step == 0) first = loss;
    last = loss;
    if (step % 5 == 0 || step == STEPS - 1)
      printf("step %3d  loss %.6f  grad_norm %.4f  lr %.5f\n", step, loss, norm, lr);
  }
  gradc_session_free(s);
  gradc_program_free(prog);

  int fell = isfinite(last) && last < first;
  printf("loss %.6f -> %.6f: %s\n", first, last, fell ? "falling" : "NOT falling");
  return fell ? 0 : 1;
}
