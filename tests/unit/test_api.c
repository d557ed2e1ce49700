/* test_api.c - the public C API (include/gradc.h): compiling from source
 * and from a file, diagnostics in gradc_last_error, a session's window
 * against step_run_ref on the same tensors, K = 1 against K = 4, artifacts
 * (round trip, corruption, version and host checks), checkpoints (resume
 * is bit-identical, truncated and mismatched files are refused), and the
 * optimisers and learning-rate schedule against hand-computed values.
 *
 * Tests that run a model do it on every target ("ref", "cpu"); until the
 * CPU back end lands both run the reference interpreter. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gradc.h"
#include "passes/passes.h"
#include "runtime/io/artifact.h"
#include "runtime/runtime.h"
#include "testutil.h"

static const char *const targets[] = {"ref", "cpu"};
#define NTARGETS 2

/* A classifier with a batch-independent penalty: splits exactly over K. */
static const char net_src[] = "model net {\n"
                              "  batch B = 8\n"
                              "  dim D = 4\n"
                              "  dim H = 8\n"
                              "  input x : f32[B, D]\n"
                              "  input y : i32[B]\n"
                              "  param W1 : f32[D, H] init normal(0, 0.5)\n"
                              "  param b1 : f32[H]\n"
                              "  param W2 : f32[H, 3] init uniform(-0.5, 0.5)\n"
                              "  h = tanh(x @ W1 + b1)\n"
                              "  loss ce = cross_entropy(h @ W2, y)\n"
                              "  loss l2 = 1e-3 * sum(W1 * W1)\n"
                              "}\n";

/* loss = 0.5 * |w|^2, so the gradient is w itself. */
static const char quad_src[] = "model quad {\n"
                               "  param w : f32[2] init ones\n"
                               "  loss l = 0.5 * sum(w * w)\n"
                               "}\n";
static const char quad64_src[] = "model quad64 {\n"
                                 "  param w : f64[2] init ones\n"
                                 "  loss l = 0.5 * sum(w * w)\n"
                                 "}\n";

static char tmpdir[256];

static int setup(void **state) {
  (void)state;
  snprintf(tmpdir, sizeof tmpdir, "/tmp/gradc_test_api.XXXXXX");
  return mkdtemp(tmpdir) ? 0 : -1;
}

static int teardown(void **state) {
  (void)state;
  char cmd[512];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
  return system(cmd) == 0 ? 0 : -1;
}

static const char *tmp(const char *name) {
  static char buf[4][512];
  static int k;
  char *b = buf[k++ % 4];
  snprintf(b, sizeof buf[0], "%s/%s", tmpdir, name);
  return b;
}

static gradc_program *compile(const char *src, const char *target, int gas) {
  gradc_compile_options o;
  gradc_compile_options_init(&o);
  o.target = target;
  o.gas = gas;
  o.no_cache = 1;
  gradc_program *p = NULL;
  gradc_status st = gradc_program_compile_source("net.gdl", src, &o, &p);
  if (st != GRADC_OK) fail_msg("compile failed: %s", gradc_last_error());
  return p;
}

static void check_ok(gradc_status st) {
  if (st != GRADC_OK) fail_msg("%s", gradc_last_error());
}

/* A window of net's inputs drawn from the session's generator. */
static void set_net_window(gradc_session *s) {
  float x[8 * 4];
  int32_t y[8];
  for (int i = 0; i < 32; i++) x[i] = (float)((double)(gradc_session_rng_next(s) >> 11) * 0x1.0p-53 * 2 - 1);
  for (int i = 0; i < 8; i++) y[i] = (int32_t)(gradc_session_rng_next(s) % 3);
  check_ok(gradc_session_set_input(s, "x", GRADC_F32, x, 32));
  check_ok(gradc_session_set_input(s, "y", GRADC_I32, y, 8));
}

/* ------------------------------------------------------------------ */
/* Programs                                                            */
/* ------------------------------------------------------------------ */

static void test_api_compile_source_signature(void **state) {
  (void)state;
  gradc_program *p = compile(net_src, "ref", 4);
  assert_int_equal(gradc_program_num_params(p), 3);
  assert_int_equal(gradc_program_num_inputs(p), 2);
  assert_int_equal(gradc_program_num_losses(p), 2);
  assert_int_equal(gradc_program_gas(p), 4);
  assert_string_equal(gradc_program_loss_name(p, 0), "ce");
  assert_string_equal(gradc_program_loss_name(p, 1), "l2");
  assert_null(gradc_program_loss_name(p, 2));
  gradc_tensor_info ti;
  check_ok(gradc_program_param_info(p, 2, &ti));
  assert_string_equal(ti.name, "W2");
  assert_int_equal(ti.dtype, GRADC_F32);
  assert_int_equal(ti.rank, 2);
  assert_int_equal(ti.shape[0], 8);
  assert_int_equal(ti.shape[1], 3);
  /* Inputs are one window: B = 8 samples, not the micro-batch of 2. */
  check_ok(gradc_program_input_info(p, 0, &ti));
  assert_string_equal(ti.name, "x");
  assert_int_equal(ti.rank, 2);
  assert_int_equal(ti.shape[0], 8);
  assert_int_equal(ti.shape[1], 4);
  assert_true(ti.batched);
  check_ok(gradc_program_input_info(p, 1, &ti));
  assert_int_equal(ti.dtype, GRADC_I32);
  assert_int_equal(ti.shape[0], 8);
  assert_int_equal(gradc_program_param_info(p, 3, &ti), GRADC_ERR_USER);
  assert_non_null(strstr(gradc_last_error(), "out of range"));
  gradc_program_free(p);
}

static void test_api_compile_file_and_defs(void **state) {
  (void)state;
  gradc_compile_options o;
  gradc_compile_options_init(&o);
  const char *names[] = {"H"};
  int64_t values[] = {32};
  o.def_names = names;
  o.def_values = values;
  o.ndefs = 1;
  o.target = "ref";
  gradc_program *p = NULL;
  check_ok(gradc_program_compile_file(tu_path("examples/mlp.gdl"), &o, &p));
  gradc_tensor_info ti;
  check_ok(gradc_program_param_info(p, 0, &ti));
  assert_string_equal(ti.name, "W1");
  assert_int_equal(ti.shape[0], 784);
  assert_int_equal(ti.shape[1], 32);
  gradc_program_free(p);

  assert_int_equal(gradc_program_compile_file(tmp("no-such.gdl"), &o, &p), GRADC_ERR_USER);
  assert_null(p);
  assert_non_null(strstr(gradc_last_error(), "no-such.gdl: No such file or directory"));
}

static void test_api_compile_errors_carry_diagnostics(void **state) {
  (void)state;
  const char *bad = "model bad {\n"
                    "  input x : f32[4, 3]\n"
                    "  param W : f32[5, 2]\n"
                    "  loss l = sum(x @ W)\n"
                    "}\n";
  gradc_compile_options o;
  gradc_compile_options_init(&o);
  gradc_program *p = (gradc_program *)1;
  assert_int_equal(gradc_program_compile_source("bad.gdl", bad, &o, &p), GRADC_ERR_USER);
  assert_null(p);
  const char *e = gradc_last_error();
  /* clang style: location, message naming both shapes, the line, a caret under '@'. */
  assert_non_null(strstr(e, "bad.gdl:4:18: error: "));
  assert_non_null(strstr(e, "f32[4,3] @ f32[5,2]"));
  assert_non_null(strstr(e, "\n  loss l = sum(x @ W)\n                 ^"));

  /* A loss K > 1 cannot split, refused by gas-fold (a pass, not the frontend). */
  const char *mix = "model mix {\n"
                    "  batch B = 4\n"
                    "  input x : f32[B, 3]\n"
                    "  param w : f32[3]\n"
                    "  loss l = mean(x * w) ** 2\n"
                    "}\n";
  o.gas = 2;
  assert_int_equal(gradc_program_compile_source("mix.gdl", mix, &o, &p), GRADC_ERR_USER);
  assert_non_null(strstr(gradc_last_error(), "mix.gdl:5:"));
  o.gas = 1;
  check_ok(gradc_program_compile_source("mix.gdl", mix, &o, &p));
  gradc_program_free(p);

  o.target = "tpu";
  assert_int_equal(gradc_program_compile_source("mix.gdl", mix, &o, &p), GRADC_ERR_USER);
  assert_non_null(strstr(gradc_last_error(), "unsupported target 'tpu'"));
  o.target = "cpu";
  o.gas = 0;
  assert_int_equal(gradc_program_compile_source("mix.gdl", mix, &o, &p), GRADC_ERR_USER);
  /* The message is per thread and stays until the next failure. */
  assert_non_null(strstr(gradc_last_error(), "gas must be at least 1"));
  assert_string_equal(gradc_version(), GRADC_VERSION);
}

/* ------------------------------------------------------------------ */
/* Sessions                                                            */
/* ------------------------------------------------------------------ */

static void test_api_session_errors(void **state) {
  (void)state;
  gradc_program *p = compile(net_src, "ref", 1);
  gradc_session *s;
  check_ok(gradc_session_new(p, &s));
  float buf[64] = {0};
  assert_int_equal(gradc_session_set_param(s, "W9", buf, 32), GRADC_ERR_USER);
  assert_non_null(strstr(gradc_last_error(), "'W9' is not a param of model 'net'"));
  assert_int_equal(gradc_session_set_param(s, "W1", buf, 31), GRADC_ERR_USER);
  assert_non_null(strstr(gradc_last_error(), "has 32 elements, got 31"));
  assert_int_equal(gradc_session_set_input(s, "x", GRADC_I32, buf, 32), GRADC_ERR_USER);
  assert_non_null(strstr(gradc_last_error(), "cannot take I32 data"));
  assert_int_equal(gradc_session_set_input(s, "W1", GRADC_F32, buf, 32), GRADC_ERR_USER);
  assert_non_null(strstr(gradc_last_error(), "is a param, not an input"));
  assert_int_equal(gradc_session_get_grad(s, "W1", buf, 32), GRADC_ERR_USER);
  assert_non_null(strstr(gradc_last_error(), "call gradc_session_run first"));
  /* y missing: the step driver names the tensor. */
  check_ok(gradc_session_set_input(s, "x", GRADC_F32, buf, 32));
  assert_int_equal(gradc_session_run(s), GRADC_ERR_USER);
  assert_non_null(strstr(gradc_last_error(), "missing tensor 'y'"));
  assert_true(isnan(gradc_session_loss(s, 0)));
  /* A target out of range (I64 data is range-checked). */
  int64_t y[8] = {0, 1, 2, 0, 1, 2, 0, (int64_t)1 << 40};
  check_ok(gradc_session_set_input(s, "y", GRADC_I64, y, 8));
  assert_int_equal(gradc_session_run(s), GRADC_ERR_USER);
  assert_non_null(strstr(gradc_last_error(), "out of range for i32"));
  y[7] = 1;
  check_ok(gradc_session_set_input(s, "y", GRADC_I64, y, 8));
  check_ok(gradc_session_run(s));
  assert_int_equal(gradc_session_step(s), GRADC_ERR_USER);
  assert_non_null(strstr(gradc_last_error(), "no optimiser"));
  gradc_session_free(s);
  gradc_program_free(p);
}

/* init_params gives what `gradc init` writes for the same seed. */
static void test_api_init_params_match_cli(void **state) {
  (void)state;
  char cmd[2048];
  snprintf(cmd, sizeof cmd, "%s init %s -o %s --seed 11", GRADC_BINARY, tu_path("examples/mlp.gdl"),
           tmp("cli.safetensors"));
  assert_int_equal(system(cmd), 0);
  gradc_program *p = NULL;
  gradc_compile_options o;
  gradc_compile_options_init(&o);
  o.target = "ref";
  check_ok(gradc_program_compile_file(tu_path("examples/mlp.gdl"), &o, &p));
  gradc_session *s;
  check_ok(gradc_session_new(p, &s));
  check_ok(gradc_session_init_params(s, 11));
  check_ok(gradc_session_save_params(s, tmp("api.safetensors")));
  StFile a, b;
  char err[512];
  assert_true(st_read(tmp("cli.safetensors"), &a, err, sizeof err));
  assert_true(st_read(tmp("api.safetensors"), &b, err, sizeof err));
  assert_int_equal(a.n, b.n);
  for (int i = 0; i < a.n; i++) {
    const StTensor *t = st_find(&b, a.t[i].name);
    assert_non_null(t);
    assert_int_equal(t->nbytes, a.t[i].nbytes);
    assert_memory_equal(t->data, a.t[i].data, t->nbytes);
  }
  st_free(&a);
  st_free(&b);
  /* And load_params reads it back. */
  check_ok(gradc_session_load_params(s, tmp("cli.safetensors")));
  gradc_session_free(s);
  gradc_program_free(p);
}

/* The session's window equals step_run_ref on the same tensors. */
static void test_api_run_matches_step_run_ref(void **state) {
  (void)state;
  for (int ti = 0; ti < NTARGETS; ti++) {
    const int K = 2;
    gradc_program *p = compile(net_src, targets[ti], K);
    gradc_session *s;
    check_ok(gradc_session_new(p, &s));
    check_ok(gradc_session_init_params(s, 3));
    gradc_session_rng_seed(s, 5);
    set_net_window(s);
    check_ok(gradc_session_run(s));
    check_ok(gradc_session_save_params(s, tmp("p.safetensors")));

    /* The same tensors through the frontend, the pipeline and step_run_ref. */
    Diag d;
    FeModel *m = tu_compile("net.gdl", net_src, K, &d);
    assert_non_null(m);
    int n;
    const char *const *pipe = pass_pipeline(&n);
    PassManager pm;
    pm_init(&pm);
    PassOptions po = {.gas = K, .diag = &d, .src = &m->src};
    assert_int_equal(pm_run(&pm, m->func, pipe, n, &po), 0);
    StFile params, inputs;
    char err[512];
    assert_true(st_read(tmp("p.safetensors"), &params, err, sizeof err));
    st_init(&inputs);
    gradc_session_rng_seed(s, 5);
    float x[32];
    int32_t y[8];
    for (int i = 0; i < 32; i++) x[i] = (float)((double)(gradc_session_rng_next(s) >> 11) * 0x1.0p-53 * 2 - 1);
    for (int i = 0; i < 8; i++) y[i] = (int32_t)(gradc_session_rng_next(s) % 3);
    int64_t xs[2] = {8, 4}, ys[1] = {8};
    st_add(&inputs, "x", ST_F32, 2, xs, x);
    st_add(&inputs, "y", ST_I32, 1, ys, y);
    StepResult r;
    assert_true(step_run_ref(m->func, K, &params, "p", &inputs, "i", NULL, &r, err, sizeof err));
    /* The interpreter is exact; a compiled back end may reorder sums. */
    double tol = strcmp(targets[ti], "ref") == 0 ? 0 : 1e-5;
    double total = 0;
    for (int i = 0; i < r.nlosses; i++) {
      int j = strcmp(r.loss_names[i], "ce") == 0 ? 0 : 1;
      assert_true(fabs(gradc_session_loss(s, j) - r.losses[i]) <= tol * (1 + fabs(r.losses[i])));
      total += r.losses[i];
    }
    assert_true(fabs(gradc_session_loss_total(s) - total) <= tol * (1 + fabs(total)));
    for (int g = 0; g < r.ngrads; g++) {
      int64_t ne = ir_numel(&r.grad_types[g].shape);
      float *out = malloc(sizeof(float) * (size_t)ne);
      check_ok(gradc_session_get_grad(s, r.grad_names[g], out, (size_t)ne));
      for (int64_t e = 0; e < ne; e++)
        if (!(fabs(out[e] - r.grads[g][e]) <= tol * (1 + fabs(r.grads[g][e]))))
          fail_msg("%s: grad %s[%lld] = %.9g, step_run_ref %.9g", targets[ti], r.grad_names[g], (long long)e, out[e],
                   r.grads[g][e]);
      free(out);
    }
    /* save_grads writes the same values. */
    check_ok(gradc_session_save_grads(s, tmp("g.safetensors")));
    StFile gf;
    assert_true(st_read(tmp("g.safetensors"), &gf, err, sizeof err));
    assert_int_equal(gf.n, 3);
    const StTensor *gw = st_find(&gf, "W2");
    assert_non_null(gw);
    float w2[24];
    check_ok(gradc_session_get_grad(s, "W2", w2, 24));
    assert_memory_equal(gw->data, w2, sizeof w2);
    st_free(&gf);
    step_result_free(&r);
    st_free(&params);
    st_free(&inputs);
    fe_model_free(m);
    diag_free(&d);
    gradc_session_free(s);
    gradc_program_free(p);
  }
}

/* Grads and losses of a window do not depend on K (DESIGN.md §3). */
static void test_api_gas_k1_vs_k4(void **state) {
  (void)state;
  for (int ti = 0; ti < NTARGETS; ti++) {
    gradc_program *p1 = compile(net_src, targets[ti], 1), *p4 = compile(net_src, targets[ti], 4);
    gradc_session *s1, *s4;
    check_ok(gradc_session_new(p1, &s1));
    check_ok(gradc_session_new(p4, &s4));
    check_ok(gradc_session_init_params(s1, 9));
    check_ok(gradc_session_init_params(s4, 9));
    gradc_session_rng_seed(s1, 2);
    gradc_session_rng_seed(s4, 2);
    set_net_window(s1);
    set_net_window(s4);
    check_ok(gradc_session_run(s1));
    check_ok(gradc_session_run(s4));
    for (int i = 0; i < 2; i++) {
      double a = gradc_session_loss(s1, i), b = gradc_session_loss(s4, i);
      assert_true(fabs(a - b) <= 1e-5 * (1 + fabs(a)));
    }
    const char *names[] = {"W1", "b1", "W2"};
    int sizes[] = {32, 8, 24};
    for (int k = 0; k < 3; k++) {
      float g1[32], g4[32];
      check_ok(gradc_session_get_grad(s1, names[k], g1, (size_t)sizes[k]));
      check_ok(gradc_session_get_grad(s4, names[k], g4, (size_t)sizes[k]));
      for (int e = 0; e < sizes[k]; e++)
        if (!(fabs(g1[e] - g4[e]) <= 1e-5 * (1 + fabs(g1[e]))))
          fail_msg("%s: %s[%d]: K=1 %.9g, K=4 %.9g", targets[ti], names[k], e, g1[e], g4[e]);
    }
    assert_true(fabs(gradc_session_grad_norm(s1) - gradc_session_grad_norm(s4)) < 1e-5);
    gradc_session_free(s1);
    gradc_session_free(s4);
    gradc_program_free(p1);
    gradc_program_free(p4);
  }
}

/* ------------------------------------------------------------------ */
/* Artifacts                                                           */
/* ------------------------------------------------------------------ */

/* Losses and gradients of one window, for bitwise comparison. */
typedef struct Window {
  double loss[2];
  float g[32 + 8 + 24];
} Window;

static void run_window(const gradc_program *p, Window *w) {
  gradc_session *s;
  check_ok(gradc_session_new(p, &s));
  check_ok(gradc_session_init_params(s, 4));
  gradc_session_rng_seed(s, 8);
  set_net_window(s);
  check_ok(gradc_session_run(s));
  memset(w, 0, sizeof *w);
  w->loss[0] = gradc_session_loss(s, 0);
  w->loss[1] = gradc_session_loss(s, 1);
  check_ok(gradc_session_get_grad(s, "W1", w->g, 32));
  check_ok(gradc_session_get_grad(s, "b1", w->g + 32, 8));
  check_ok(gradc_session_get_grad(s, "W2", w->g + 40, 24));
  gradc_session_free(s);
}

static void test_api_artifact_round_trip(void **state) {
  (void)state;
  for (int ti = 0; ti < NTARGETS; ti++) {
    gradc_program *p = compile(net_src, targets[ti], 2);
    check_ok(gradc_program_save(p, tmp("net.gradc")));
    gradc_program *q = NULL;
    check_ok(gradc_program_load(tmp("net.gradc"), &q));
    assert_int_equal(gradc_program_gas(q), 2);
    assert_int_equal(gradc_program_num_params(q), 3);
    assert_int_equal(gradc_program_num_inputs(q), 2);
    assert_string_equal(gradc_program_loss_name(q, 1), "l2");
    gradc_tensor_info a, b;
    for (int i = 0; i < 2; i++) {
      check_ok(gradc_program_input_info(p, i, &a));
      check_ok(gradc_program_input_info(q, i, &b));
      assert_string_equal(a.name, b.name);
      assert_int_equal(a.dtype, b.dtype);
      assert_int_equal(a.batched, b.batched);
      assert_memory_equal(a.shape, b.shape, sizeof a.shape);
    }
    Window w1, w2;
    run_window(p, &w1);
    run_window(q, &w2);
    assert_memory_equal(&w1, &w2, sizeof w1);
    /* A loaded program saves again, and that loads too. */
    check_ok(gradc_program_save(q, tmp("net2.gradc")));
    gradc_program *r = NULL;
    check_ok(gradc_program_load(tmp("net2.gradc"), &r));
    run_window(r, &w2);
    assert_memory_equal(&w1, &w2, sizeof w1);
    /* The file holds the options, the source and the IR. */
    ArtFile art;
    char err[512];
    assert_true(art_read(tmp("net.gradc"), &art, err, sizeof err));
    const ArtSection *meta = art_find(&art, "META", NULL), *src = art_find(&art, "SRC", NULL);
    assert_non_null(meta);
    assert_non_null(strstr((const char *)meta->data, "\"gas\":2"));
    assert_non_null(strstr((const char *)meta->data, "\"host\":"));
    assert_non_null(src);
    assert_string_equal((const char *)src->data, net_src);
    const char *ir = (const char *)art_find(&art, "IR", NULL)->data;
    assert_non_null(strstr(ir, "func @net("));
#ifdef GRADC_HAVE_LLVM
    /* The cpu target's IR is the CPU pipeline's: fused and planned. */
    bool planned = strstr(ir, "kernel @") && strstr(ir, " arena ");
    assert_true(planned == (strcmp(targets[ti], "cpu") == 0));
#endif
    art_free(&art);
    gradc_program_free(r);
    gradc_program_free(q);
    gradc_program_free(p);
  }
}

static void write_bytes(const char *path, const char *data, size_t n) {
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  assert_int_equal(fwrite(data, 1, n, f), n);
  fclose(f);
}

static void expect_load_error(const char *path, const char *what) {
  gradc_program *q = (gradc_program *)1;
  assert_int_equal(gradc_program_load(path, &q), GRADC_ERR_USER);
  assert_null(q);
  if (!strstr(gradc_last_error(), what)) fail_msg("expected '%s' in: %s", what, gradc_last_error());
}

static void test_api_artifact_corrupt(void **state) {
  (void)state;
  gradc_program *p = compile(net_src, "ref", 1);
  check_ok(gradc_program_save(p, tmp("c.gradc")));
  size_t n;
  const char *why;
  char *bytes = read_file(tmp("c.gradc"), &n, &why);
  assert_non_null(bytes);
  /* One flipped bit anywhere after the header. */
  for (size_t at = 16; at < n; at += n / 7) {
    bytes[at] ^= 0x10;
    write_bytes(tmp("bad.gradc"), bytes, n);
    expect_load_error(tmp("bad.gradc"), "bad.gradc: artifact is corrupt (checksum mismatch)");
    bytes[at] ^= 0x10;
  }
  write_bytes(tmp("bad.gradc"), bytes, n / 2);
  expect_load_error(tmp("bad.gradc"), "artifact is corrupt");
  write_bytes(tmp("bad.gradc"), "GRADCAR", 7);
  expect_load_error(tmp("bad.gradc"), "not a gradc artifact");
  write_bytes(tmp("bad.gradc"), "hello, world", 12);
  expect_load_error(tmp("bad.gradc"), "not a gradc artifact (bad magic)");
  expect_load_error(tmp("missing.gradc"), "missing.gradc: No such file or directory");
  free(bytes);
  gradc_program_free(p);
}

/* Rewrite a section's text; the container (and checksum) stays valid. */
static void rewrite_meta(const char *from, const char *to, const char *key, const char *value, uint32_t format) {
  ArtFile a;
  char err[512];
  assert_true(art_read(from, &a, err, sizeof err));
  ArtSection *m = (ArtSection *)art_find(&a, "META", NULL);
  assert_non_null(m);
  if (key) {
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\":\"", key);
    const char *at = strstr((const char *)m->data, pat);
    assert_non_null(at);
    const char *vbeg = at + strlen(pat), *vend = strchr(vbeg, '"');
    StrBuf sb;
    sb_init(&sb);
    sb_putn(&sb, (const char *)m->data, (size_t)(vbeg - (const char *)m->data));
    sb_puts(&sb, value);
    sb_puts(&sb, vend);
    free(m->data);
    m->len = sb.len;
    m->data = (unsigned char *)sb.data;
  }
  a.format = format;
  assert_true(art_write(to, &a, err, sizeof err));
  art_free(&a);
}

static void test_api_artifact_version_and_host(void **state) {
  (void)state;
  gradc_program *p = compile(net_src, "cpu", 1), *q = NULL;
  check_ok(gradc_program_save(p, tmp("v.gradc")));
  rewrite_meta(tmp("v.gradc"), tmp("same.gradc"), NULL, NULL, ART_FORMAT_VERSION);
  check_ok(gradc_program_load(tmp("same.gradc"), &q));
  gradc_program_free(q);
  rewrite_meta(tmp("v.gradc"), tmp("fmt.gradc"), NULL, NULL, ART_FORMAT_VERSION + 1);
  expect_load_error(tmp("fmt.gradc"), "artifact format version 2 is not supported");
  rewrite_meta(tmp("v.gradc"), tmp("ver.gradc"), "gradc_version", "0.0.0-old", ART_FORMAT_VERSION);
  expect_load_error(tmp("ver.gradc"), "artifact was built by gradc 0.0.0-old; this is gradc " GRADC_VERSION);
  rewrite_meta(tmp("v.gradc"), tmp("host.gradc"), "host", "sparc64-sun-solaris;ultrasparc;+vis", ART_FORMAT_VERSION);
  expect_load_error(tmp("host.gradc"), "artifact was built for another host (sparc64-sun-solaris");
  gradc_program_free(p);
  /* The interpreter's programs run on any host. */
  p = compile(net_src, "ref", 1);
  check_ok(gradc_program_save(p, tmp("r.gradc")));
  rewrite_meta(tmp("r.gradc"), tmp("rhost.gradc"), "host", "sparc64-sun-solaris;ultrasparc;+vis", ART_FORMAT_VERSION);
  check_ok(gradc_program_load(tmp("rhost.gradc"), &q));
  gradc_program_free(q);
  gradc_program_free(p);
}

/* ------------------------------------------------------------------ */
/* Optimisers                                                          */
/* ------------------------------------------------------------------ */

/* Three steps on quad (gradient = w) from w = [1, -2]; each row the
 * expected w after the step, computed by hand from torch's update rules. */
static void expect_steps(const char *src, const gradc_optimizer_options *o, const double want[3][2], double tol) {
  gradc_program *p = compile(src, "ref", 1);
  gradc_session *s;
  check_ok(gradc_session_new(p, &s));
  bool f64 = strstr(src, "f64") != NULL;
  float w32[2] = {1, -2};
  double w64[2] = {1, -2};
  check_ok(gradc_session_set_param(s, "w", f64 ? (void *)w64 : (void *)w32, 2));
  check_ok(gradc_session_set_optimizer(s, o));
  for (int t = 0; t < 3; t++) {
    check_ok(gradc_session_run(s));
    check_ok(gradc_session_step(s));
    check_ok(gradc_session_get_param(s, "w", f64 ? (void *)w64 : (void *)w32, 2));
    for (int k = 0; k < 2; k++) {
      double got = f64 ? w64[k] : w32[k];
      if (!(fabs(got - want[t][k]) <= tol * fabs(want[t][k])))
        fail_msg("%s step %d: w[%d] = %.17g, expected %.17g", src + 6, t + 1, k, got, want[t][k]);
    }
  }
  assert_int_equal(gradc_session_step_count(s), 3);
  gradc_session_free(s);
  gradc_program_free(p);
}

static void test_api_sgd_hand_computed(void **state) {
  (void)state;
  gradc_optimizer_options o;
  gradc_optimizer_options_init(&o, GRADC_SGD);
  assert_true(o.lr == 1e-3 && o.momentum == 0 && o.weight_decay == 0 && o.nesterov == 0);
  o.lr = 0.1;
  o.momentum = 0.9;
  /* b1 = g1; b2 = 0.9 b1 + g2; w -= 0.1 b */
  const double mom[3][2] = {{0.9, -1.8}, {0.72, -1.44}, {0.486, -0.972}};
  expect_steps(quad_src, &o, mom, 1e-6);
  expect_steps(quad64_src, &o, mom, 1e-14);
  o.weight_decay = 0.1; /* g += 0.1 w */
  const double wd[3][2] = {{0.89, -1.78}, {0.6931, -1.3862}, {0.439649, -0.879298}};
  expect_steps(quad_src, &o, wd, 1e-6);
  expect_steps(quad64_src, &o, wd, 1e-14);
  o.weight_decay = 0;
  o.nesterov = 1; /* w -= 0.1 (g + 0.9 b) */
  const double nest[3][2] = {{0.81, -1.62}, {0.5751, -1.1502}, {0.327321, -0.654642}};
  expect_steps(quad_src, &o, nest, 1e-6);
  expect_steps(quad64_src, &o, nest, 1e-14);
  o.nesterov = 0;
  o.dampening = 0.5; /* the first step takes g undamped, as torch */
  const double damp[3][2] = {{0.9, -1.8}, {0.765, -1.53}, {0.60525, -1.2105}};
  expect_steps(quad_src, &o, damp, 1e-6);
  expect_steps(quad64_src, &o, damp, 1e-14);
  /* torch's check. */
  o.nesterov = 1;
  gradc_program *p = compile(quad_src, "ref", 1);
  gradc_session *s;
  check_ok(gradc_session_new(p, &s));
  assert_int_equal(gradc_session_set_optimizer(s, &o), GRADC_ERR_USER);
  assert_non_null(strstr(gradc_last_error(), "Nesterov momentum requires a momentum and zero dampening"));
  gradc_session_free(s);
  gradc_program_free(p);
}

static void test_api_adamw_hand_computed(void **state) {
  (void)state;
  gradc_optimizer_options o;
  gradc_optimizer_options_init(&o, GRADC_ADAMW);
  assert_true(o.lr == 1e-3 && o.beta1 == 0.9 && o.beta2 == 0.999 && o.eps == 1e-8 && o.weight_decay == 0.01);
  o.lr = 0.1;
  /* Step 1: w *= 1 - 0.1 * 0.01; m = 0.1 g, v = 0.001 g^2, so m/(1-0.9) / sqrt(v/(1-0.999)) = sign(g):
   * w = 0.999 w - 0.1 / (1 + 1e-8).  Steps 2 and 3 likewise with the bias corrections 1 - 0.9^t,
   * 1 - 0.999^t. */
  const double want[3][2] = {{0.899000001, -1.8980000005},
                             {0.7985190281887788, -1.7962725891500528},
                             {0.6989111847156934, -1.6949445151502027}};
  expect_steps(quad_src, &o, want, 1e-6);
  expect_steps(quad64_src, &o, want, 1e-14);
}

static void test_api_clip_and_schedule(void **state) {
  (void)state;
  gradc_program *p = compile(quad_src, "ref", 1);
  gradc_session *s;
  check_ok(gradc_session_new(p, &s));
  float w[2] = {3, 4};
  check_ok(gradc_session_set_param(s, "w", w, 2));
  gradc_optimizer_options o;
  gradc_optimizer_options_init(&o, GRADC_SGD);
  o.lr = 1;
  o.clip_norm = 1;
  check_ok(gradc_session_set_optimizer(s, &o));
  check_ok(gradc_session_run(s));
  assert_true(fabs(gradc_session_grad_norm(s) - 5) < 1e-12);
  check_ok(gradc_session_step(s));
  /* g * 1 / (5 + 1e-6): w = [3, 4] - [3, 4] / 5.000001 */
  check_ok(gradc_session_get_param(s, "w", w, 2));
  assert_true(fabs(w[0] - (3 - 3 / 5.000001)) < 1e-6);
  assert_true(fabs(w[1] - (4 - 4 / 5.000001)) < 1e-6);
  /* The gradient itself is left unclipped, as get_grad reports it. */
  float g[2];
  check_ok(gradc_session_get_grad(s, "w", g, 2));
  assert_true(g[0] == 3 && g[1] == 4);
  /* A norm under the limit is not scaled up. */
  o.clip_norm = 100;
  check_ok(gradc_session_set_optimizer(s, &o));
  w[0] = 0.5f;
  w[1] = 0;
  check_ok(gradc_session_set_param(s, "w", w, 2));
  check_ok(gradc_session_run(s));
  check_ok(gradc_session_step(s));
  check_ok(gradc_session_get_param(s, "w", w, 2));
  assert_true(w[0] == 0.0f && w[1] == 0.0f);

  /* Warm-up over 3 steps, cosine to 0.1 at step 10: lr * f(step), with
   * f(s) = (s+1)/3 for s < 3, then 0.1 + 0.9 * (1 + cos(pi (s-3)/7)) / 2, then 0.1. */
  o.clip_norm = 0;
  o.warmup_steps = 3;
  o.total_steps = 10;
  o.min_lr = 0.1;
  o.lr = 1;
  gradc_optimizer_options_init(&o, GRADC_ADAMW);
  o.lr = 1;
  o.warmup_steps = 3;
  o.total_steps = 10;
  o.min_lr = 0.1;
  check_ok(gradc_session_set_optimizer(s, &o)); /* a new kind: fresh state, step 0 */
  assert_int_equal(gradc_session_step_count(s), 0);
  const double want[12] = {0.3333333333333333, 0.6666666666666666, 1.0, 1.0, 0.9554359905560885,
                           0.8305704108364301, 0.6501344202803414, 0.44986557971965857, 0.26942958916356996,
                           0.14456400944391146, 0.1, 0.1};
  for (int t = 0; t < 12; t++) {
    double lr = gradc_session_lr(s);
    if (!(fabs(lr - want[t]) <= 1e-15)) fail_msg("step %d: lr %.17g, expected %.17g", t, lr, want[t]);
    check_ok(gradc_session_step(s));
  }
  gradc_session_free(s);
  gradc_program_free(p);
}

/* ------------------------------------------------------------------ */
/* Checkpoints                                                         */
/* ------------------------------------------------------------------ */

/* n steps of training on windows drawn from the session's generator;
 * losses[i] gets each window's total loss. */
static void train(gradc_session *s, int n, double *losses) {
  for (int i = 0; i < n; i++) {
    set_net_window(s);
    check_ok(gradc_session_run(s));
    losses[i] = gradc_session_loss_total(s);
    check_ok(gradc_session_step(s));
  }
}

static void params_of(gradc_session *s, float *out) {
  check_ok(gradc_session_get_param(s, "W1", out, 32));
  check_ok(gradc_session_get_param(s, "b1", out + 32, 8));
  check_ok(gradc_session_get_param(s, "W2", out + 40, 24));
}

static void resume_case(const char *target, const gradc_optimizer_options *o, bool set_before_load) {
  enum { N = 3 };
  gradc_program *p = compile(net_src, target, 2);
  gradc_session *a, *b, *c;
  double la[2 * N], lb[N], lc[N];
  check_ok(gradc_session_new(p, &a));
  check_ok(gradc_session_init_params(a, 21));
  gradc_session_rng_seed(a, 99);
  check_ok(gradc_session_set_optimizer(a, o));
  train(a, 2 * N, la);

  check_ok(gradc_session_new(p, &b));
  check_ok(gradc_session_init_params(b, 21));
  gradc_session_rng_seed(b, 99);
  check_ok(gradc_session_set_optimizer(b, o));
  train(b, N, lb);
  check_ok(gradc_session_save_checkpoint(b, tmp("ck.safetensors")));
  gradc_session_free(b);

  /* A new session on a program loaded from an artifact: nothing shared but the files. */
  check_ok(gradc_program_save(p, tmp("ck.gradc")));
  gradc_program *q = NULL;
  check_ok(gradc_program_load(tmp("ck.gradc"), &q));
  check_ok(gradc_session_new(q, &c));
  if (set_before_load) check_ok(gradc_session_set_optimizer(c, o));
  check_ok(gradc_session_load_checkpoint(c, tmp("ck.safetensors")));
  assert_int_equal(gradc_session_step_count(c), N);
  train(c, N, lc);
  assert_memory_equal(la, lb, sizeof lb);
  assert_memory_equal(la + N, lc, sizeof lc);
  float pa[64], pc[64];
  params_of(a, pa);
  params_of(c, pc);
  assert_memory_equal(pa, pc, sizeof pa);
  assert_true(gradc_session_rng_next(a) == gradc_session_rng_next(c));
  assert_true(gradc_session_lr(a) == gradc_session_lr(c));
  gradc_session_free(a);
  gradc_session_free(c);
  gradc_program_free(q);
  gradc_program_free(p);
}

static void test_api_checkpoint_resume_bit_identical(void **state) {
  (void)state;
  for (int ti = 0; ti < NTARGETS; ti++) {
    gradc_optimizer_options o;
    gradc_optimizer_options_init(&o, GRADC_ADAMW);
    o.lr = 0.05;
    o.clip_norm = 0.5;
    o.warmup_steps = 2;
    o.total_steps = 5;
    o.min_lr = 0.005;
    resume_case(targets[ti], &o, false);
    gradc_optimizer_options_init(&o, GRADC_SGD);
    o.lr = 0.2;
    o.momentum = 0.9;
    o.nesterov = 1;
    o.weight_decay = 1e-3;
    resume_case(targets[ti], &o, true);
  }
}

static void expect_ckpt_error(gradc_session *s, const char *path, const char *what) {
  assert_int_equal(gradc_session_load_checkpoint(s, path), GRADC_ERR_USER);
  if (!strstr(gradc_last_error(), what)) fail_msg("expected '%s' in: %s", what, gradc_last_error());
}

static void test_api_checkpoint_rejects(void **state) {
  (void)state;
  gradc_program *p = compile(net_src, "ref", 1);
  gradc_session *s;
  check_ok(gradc_session_new(p, &s));
  check_ok(gradc_session_init_params(s, 1));
  gradc_optimizer_options o;
  gradc_optimizer_options_init(&o, GRADC_ADAMW);
  check_ok(gradc_session_set_optimizer(s, &o));
  double l;
  train(s, 1, &l);
  check_ok(gradc_session_save_checkpoint(s, tmp("good.safetensors")));
  float before[64];
  params_of(s, before);

  /* Truncated. */
  size_t n;
  const char *why;
  char *bytes = read_file(tmp("good.safetensors"), &n, &why);
  assert_non_null(bytes);
  write_bytes(tmp("trunc.safetensors"), bytes, n - 16);
  expect_ckpt_error(s, tmp("trunc.safetensors"), "trunc.safetensors: ");
  free(bytes);

  /* A missing optimiser slot. */
  StFile f;
  char err[512];
  assert_true(st_read(tmp("good.safetensors"), &f, err, sizeof err));
  StFile g;
  st_init(&g);
  for (int i = 0; i < f.nmeta; i++) st_set_meta(&g, f.meta_key[i], f.meta_val[i]);
  for (int i = 0; i < f.n; i++)
    if (strcmp(f.t[i].name, "optim.exp_avg_sq.b1") != 0)
      st_add(&g, f.t[i].name, f.t[i].dtype, f.t[i].rank, f.t[i].shape, f.t[i].data);
  assert_true(st_write(tmp("noslot.safetensors"), &g, err, sizeof err));
  expect_ckpt_error(s, tmp("noslot.safetensors"), "missing optimiser slot 'optim.exp_avg_sq.b1'");
  st_free(&g);

  /* An SGD checkpoint into an AdamW session. */
  st_init(&g);
  for (int i = 0; i < f.nmeta; i++)
    st_set_meta(&g, f.meta_key[i], strcmp(f.meta_key[i], "optimizer") == 0 ? "sgd" : f.meta_val[i]);
  for (int i = 0; i < f.n; i++) st_add(&g, f.t[i].name, f.t[i].dtype, f.t[i].rank, f.t[i].shape, f.t[i].data);
  assert_true(st_write(tmp("sgd.safetensors"), &g, err, sizeof err));
  expect_ckpt_error(s, tmp("sgd.safetensors"), "checkpoint holds sgd state; the session's optimiser is adamw");
  st_free(&g);
  st_free(&f);

  /* A different model: the tensor that differs is named. */
  static const char other[] = "model net {\n"
                              "  batch B = 8\n"
                              "  dim D = 4\n"
                              "  dim H = 9\n"
                              "  input x : f32[B, D]\n"
                              "  input y : i32[B]\n"
                              "  param W1 : f32[D, H] init normal(0, 0.5)\n"
                              "  param b1 : f32[H]\n"
                              "  param W2 : f32[H, 3]\n"
                              "  h = tanh(x @ W1 + b1)\n"
                              "  loss ce = cross_entropy(h @ W2, y)\n"
                              "}\n";
  gradc_program *q = compile(other, "ref", 1);
  gradc_session *t;
  check_ok(gradc_session_new(q, &t));
  expect_ckpt_error(t, tmp("good.safetensors"), "good.safetensors: tensor 'W1': expected f32[4,9], got f32[4,8]");
  gradc_session_free(t);
  gradc_program_free(q);
  /* Same shapes, another model name: the fingerprint. */
  char renamed[sizeof net_src + 8];
  snprintf(renamed, sizeof renamed, "model nut%s", net_src + strlen("model net"));
  q = compile(renamed, "ref", 1);
  check_ok(gradc_session_new(q, &t));
  expect_ckpt_error(t, tmp("good.safetensors"), "checkpoint is for another model ('net'");
  gradc_session_free(t);
  gradc_program_free(q);
  /* A params file is not a checkpoint. */
  check_ok(gradc_session_save_params(s, tmp("params.safetensors")));
  expect_ckpt_error(s, tmp("params.safetensors"), "not a gradc checkpoint");

  /* Failed loads changed nothing. */
  float after[64];
  params_of(s, after);
  assert_memory_equal(before, after, sizeof before);
  assert_int_equal(gradc_session_step_count(s), 1);
  check_ok(gradc_session_load_checkpoint(s, tmp("good.safetensors")));
  gradc_session_free(s);
  gradc_program_free(p);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_api_compile_source_signature),
      cmocka_unit_test(test_api_compile_file_and_defs),
      cmocka_unit_test(test_api_compile_errors_carry_diagnostics),
      cmocka_unit_test(test_api_session_errors),
      cmocka_unit_test(test_api_init_params_match_cli),
      cmocka_unit_test(test_api_run_matches_step_run_ref),
      cmocka_unit_test(test_api_gas_k1_vs_k4),
      cmocka_unit_test(test_api_artifact_round_trip),
      cmocka_unit_test(test_api_artifact_corrupt),
      cmocka_unit_test(test_api_artifact_version_and_host),
      cmocka_unit_test(test_api_sgd_hand_computed),
      cmocka_unit_test(test_api_adamw_hand_computed),
      cmocka_unit_test(test_api_clip_and_schedule),
      cmocka_unit_test(test_api_checkpoint_resume_bit_identical),
      cmocka_unit_test(test_api_checkpoint_rejects),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
