/* test_optimgen.c - the optimiser update kernels generated with LLVM
 * (codegen/llvm_optim.c) against the C loop (codegen/optim.c) they
 * replace: SGD (weight decay, momentum with and without dampening, its
 * first step, Nesterov, clipping) and AdamW (both branches of torch.lerp,
 * weight decay, clipping), f32 and f64, over a few hundred random
 * elements (a length that is no multiple of any vector width, with zeros,
 * signed zeros, tiny and huge values) and several steps of evolving
 * state.  The kernel performs the C loop's operations in the C loop's
 * order, so the params and slots must agree bit for bit (within 2 ulp
 * where the C compiler itself contracts a * b + c into an FMA).  Then
 * the C API: a session on the cpu target uses the kernels (they land in
 * the object cache) and follows the ref target's session bit for bit. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "codegen/codegen.h"
#include "gradc.h"
#include "testutil.h"

#define N 517

/* A value from a small deterministic generator: mostly N(0, 1)-ish,
 * sometimes an edge case. */
static uint64_t seed = 0x9e3779b97f4a7c15ull;
static double rnd(void) {
  seed = seed * 6364136223846793005ull + 1442695040888963407ull;
  return (double)(seed >> 11) / 9007199254740992.0; /* [0, 1) */
}
static double value(void) {
  double u = rnd();
  if (u < 0.02) return 0.0;
  if (u < 0.03) return -0.0;
  if (u < 0.04) return 1e-30 * (rnd() - 0.5);
  if (u < 0.05) return 1e6 * (rnd() - 0.5);
  return (rnd() + rnd() + rnd() - 1.5) * 2;
}

#ifdef GRADC_HAVE_LLVM

/* Distance in units in the last place (same sign assumed; else huge). */
static int64_t ulps64(double a, double b) {
  int64_t x, y;
  memcpy(&x, &a, 8);
  memcpy(&y, &b, 8);
  return x > y ? x - y : y - x;
}
static int64_t ulps32(float a, float b) {
  int32_t x, y;
  memcpy(&x, &a, 4);
  memcpy(&y, &b, 4);
  return x > y ? (int64_t)x - y : (int64_t)y - x;
}

#ifdef __FP_FAST_FMA
#define MAX_ULPS 2 /* the C compiler may fuse a * b + c */
#else
#define MAX_ULPS 0
#endif

/* Compare n elements of two arrays; fail with the first mismatch. */
static void expect_same(const char *what, const char *opts, bool f64, const void *gen, const void *ref, int n) {
  int64_t worst = 0;
  int at = -1;
  for (int j = 0; j < n; j++) {
    double a = f64 ? ((const double *)gen)[j] : ((const float *)gen)[j];
    double b = f64 ? ((const double *)ref)[j] : ((const float *)ref)[j];
    bool same = f64 ? memcmp((const double *)gen + j, (const double *)ref + j, 8) == 0
                    : memcmp((const float *)gen + j, (const float *)ref + j, 4) == 0;
    if (same || (isnan(a) && isnan(b))) continue;
    int64_t u = f64 ? ulps64(a, b) : ulps32((float)a, (float)b);
    if (u > worst) {
      worst = u;
      at = j;
    }
  }
  if (worst > MAX_ULPS) {
    double a = f64 ? ((const double *)gen)[at] : ((const float *)gen)[at];
    double b = f64 ? ((const double *)ref)[at] : ((const float *)ref)[at];
    fail_msg("%s (%s, %s): element %d: generated %.17g, C loop %.17g (%lld ulp)", what, opts, f64 ? "f64" : "f32", at, a,
             b, (long long)worst);
  }
}

typedef struct Arrays {
  double g[N];
  double p[N], s0[N], s1[N];    /* f64 state */
  float pf[N], s0f[N], s1f[N];  /* f32 state */
} Arrays;

static void fill(Arrays *a) {
  for (int j = 0; j < N; j++) {
    a->p[j] = value();
    a->s0[j] = value();
    a->s1[j] = fabs(value()); /* exp_avg_sq >= 0 */
    a->pf[j] = (float)a->p[j];
    a->s0f[j] = (float)a->s0[j];
    a->s1f[j] = (float)a->s1[j];
  }
}

static void new_grad(Arrays *a) {
  for (int j = 0; j < N; j++) a->g[j] = value();
}

/* Steps of one configuration on both paths from the same state. */
static void compare(const CgOptim *m, CgOptimKind kind, const CgOptimScalars *base, const char *opts, int steps) {
  for (int f64 = 0; f64 < 2; f64++) {
    static Arrays gen, ref;
    fill(&gen);
    memcpy(&ref, &gen, sizeof gen);
    CgOptimFn fn = cg_optim_kernel(m, kind, f64);
    assert_non_null(fn);
    for (int t = 0; t < steps; t++) {
      CgOptimScalars sc = *base;
      if (t > 0) sc.first = 0;
      new_grad(&gen);
      memcpy(ref.g, gen.g, sizeof gen.g);
      bool slots = kind == CG_OPTIM_ADAMW || sc.mom_on != 0;
      if (f64) {
        fn(gen.p, gen.g, slots ? gen.s0 : NULL, kind == CG_OPTIM_ADAMW ? gen.s1 : NULL, N, &sc);
        cg_optim_update_c(kind, true, ref.p, ref.g, slots ? ref.s0 : NULL, kind == CG_OPTIM_ADAMW ? ref.s1 : NULL, N,
                          &sc);
      } else {
        fn(gen.pf, gen.g, slots ? gen.s0f : NULL, kind == CG_OPTIM_ADAMW ? gen.s1f : NULL, N, &sc);
        cg_optim_update_c(kind, false, ref.pf, ref.g, slots ? ref.s0f : NULL, kind == CG_OPTIM_ADAMW ? ref.s1f : NULL,
                          N, &sc);
      }
      expect_same("param", opts, f64, f64 ? (void *)gen.p : (void *)gen.pf, f64 ? (void *)ref.p : (void *)ref.pf, N);
      if (slots)
        expect_same("slot 0", opts, f64, f64 ? (void *)gen.s0 : (void *)gen.s0f, f64 ? (void *)ref.s0 : (void *)ref.s0f,
                    N);
      if (kind == CG_OPTIM_ADAMW)
        expect_same("slot 1", opts, f64, f64 ? (void *)gen.s1 : (void *)gen.s1f, f64 ? (void *)ref.s1 : (void *)ref.s1f,
                    N);
    }
    /* A zero-length update touches nothing. */
    fn(NULL, NULL, NULL, NULL, 0, base);
  }
}

static CgOptim *compile_both(void) {
  char err[1024];
  CgOptim *m = cg_optim_compile(1u << CG_OPTIM_SGD | 1u << CG_OPTIM_ADAMW, NULL, err, sizeof err);
  if (!m) fail_msg("cg_optim_compile: %s", err);
  return m;
}

static void test_optimgen_sgd_matches_c_loop(void **state) {
  (void)state;
  CgOptim *m = compile_both();
  struct {
    const char *name;
    double wd, mom, damp, nesterov, clip;
  } cfg[] = {
      {"plain", 0, 0, 0, 0, 0},
      {"weight decay", 0.01, 0, 0, 0, 0},
      {"momentum", 0, 0.9, 0, 0, 0},
      {"momentum, dampening, weight decay", 0.05, 0.9, 0.3, 0, 0},
      {"nesterov, weight decay", 1e-4, 0.95, 0, 1, 0},
      {"nesterov, clipped", 0, 0.5, 0, 1, 0.37},
      {"clipped", 0, 0, 0, 0, 0.01},
  };
  for (size_t i = 0; i < sizeof cfg / sizeof cfg[0]; i++) {
    CgOptimScalars sc = {0};
    double lr = 0.0173;
    sc.clip = cfg[i].clip != 0;
    sc.coef = cfg[i].clip != 0 ? cfg[i].clip : 1.0;
    sc.neg_lr = -lr;
    sc.wd_on = cfg[i].wd != 0;
    sc.wd = cfg[i].wd;
    sc.mom_on = cfg[i].mom != 0;
    sc.momentum = cfg[i].mom;
    sc.damp1 = 1.0 - cfg[i].damp;
    sc.nesterov = cfg[i].nesterov;
    sc.first = 1; /* the first step creates the buffer; later ones update it */
    compare(m, CG_OPTIM_SGD, &sc, cfg[i].name, 4);
  }
  assert_null(cg_optim_kernel(m, (CgOptimKind)7, false));
  cg_optim_free(m);
}

static void test_optimgen_adamw_matches_c_loop(void **state) {
  (void)state;
  CgOptim *m = compile_both();
  struct {
    const char *name;
    double lr, beta1, beta2, eps, wd, clip;
  } cfg[] = {
      {"defaults", 1e-3, 0.9, 0.999, 1e-8, 0.01, 0},
      {"beta1 0.2 (lerp's other branch)", 3e-2, 0.2, 0.95, 1e-6, 0.1, 0},
      {"no decay, clipped", 5e-4, 0.8, 0.99, 1e-8, 0, 0.25},
      {"beta1 0.5, large eps", 1e-2, 0.5, 0.5, 1e-3, 0.3, 0},
  };
  for (size_t i = 0; i < sizeof cfg / sizeof cfg[0]; i++)
    for (int t = 1; t <= 7; t += 3) {
      CgOptimScalars sc = {0};
      double bc1 = 1.0 - pow(cfg[i].beta1, t), bc2 = 1.0 - pow(cfg[i].beta2, t);
      sc.clip = cfg[i].clip != 0;
      sc.coef = cfg[i].clip != 0 ? cfg[i].clip : 1.0;
      sc.decay = 1.0 - cfg[i].lr * cfg[i].wd;
      sc.w1 = 1.0 - cfg[i].beta1;
      sc.beta2 = cfg[i].beta2;
      sc.w2 = 1.0 - cfg[i].beta2;
      sc.eps = cfg[i].eps;
      sc.neg_step = -(cfg[i].lr / bc1);
      sc.bc2_sqrt = sqrt(bc2);
      compare(m, CG_OPTIM_ADAMW, &sc, cfg[i].name, 3);
    }
  cg_optim_free(m);
}

/* The object cache: a second build loads the kernels instead of running
 * LLVM, and they compute the same. */
static void test_optimgen_cached(void **state) {
  (void)state;
  char dir[] = "/tmp/gradc_test_optimgen_XXXXXX";
  assert_non_null(mkdtemp(dir));
  char err[1024];
  CgOptim *a = cg_optim_compile(1u << CG_OPTIM_ADAMW, dir, err, sizeof err);
  assert_non_null(a);
  assert_false(cg_optim_from_cache(a));
  assert_null(cg_optim_kernel(a, CG_OPTIM_SGD, false)); /* only what was asked for */
  CgOptim *b = cg_optim_compile(1u << CG_OPTIM_ADAMW, dir, err, sizeof err);
  assert_non_null(b);
  assert_true(cg_optim_from_cache(b));
  CgOptimScalars sc = {.decay = 0.99, .w1 = 0.1, .beta2 = 0.999, .w2 = 0.001, .eps = 1e-8, .neg_step = -0.01,
                       .bc2_sqrt = 0.05};
  static Arrays x, y;
  fill(&x);
  new_grad(&x);
  memcpy(&y, &x, sizeof x);
  cg_optim_kernel(a, CG_OPTIM_ADAMW, false)(x.pf, x.g, x.s0f, x.s1f, N, &sc);
  cg_optim_kernel(b, CG_OPTIM_ADAMW, false)(y.pf, y.g, y.s0f, y.s1f, N, &sc);
  assert_memory_equal(x.pf, y.pf, sizeof x.pf);
  assert_memory_equal(x.s1f, y.s1f, sizeof x.s1f);
  cg_optim_free(a);
  cg_optim_free(b);
  char cmd[256];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  assert_int_equal(system(cmd), 0);
}

/* A session on the cpu target runs the generated kernels (they are built
 * at its first step and land in the cache) and follows a session on the
 * interpreter (the C loop) bit for bit, f32 and f64, SGD and AdamW. */
static const char *models[2] = {"model q32 {\n"
                                "  input x : f32[5]\n"
                                "  param w : f32[5] init normal(0, 1)\n"
                                "  param u : f32[3] init normal(0, 1)\n"
                                "  loss l = sum(w * x) + 0.5 * sum(w * w) + sum(u * u * u)\n"
                                "}\n",
                                "model q64 {\n"
                                "  input x : f64[5]\n"
                                "  param w : f64[5] init normal(0, 1)\n"
                                "  loss l = sum(w * x) + 0.5 * sum(w * w * w)\n"
                                "}\n"};

static void test_optimgen_session_follows_the_c_loop(void **state) {
  (void)state;
  char dir[] = "/tmp/gradc_test_optimgen_XXXXXX";
  assert_non_null(mkdtemp(dir));
  const char *old = getenv("GRADC_CACHE_DIR");
  char *saved = old ? strdup(old) : NULL;
  setenv("GRADC_CACHE_DIR", dir, 1);
  for (int mi = 0; mi < 2; mi++)
    for (int kind = 0; kind < 2; kind++) {
      gradc_session *s[2];
      gradc_program *p[2];
      for (int ti = 0; ti < 2; ti++) {
        gradc_compile_options o;
        gradc_compile_options_init(&o);
        o.target = ti ? "ref" : "cpu";
        if (gradc_program_compile_source("q.gdl", models[mi], &o, &p[ti]))
          fail_msg("compile: %s", gradc_last_error());
        assert_int_equal(gradc_session_new(p[ti], &s[ti]), GRADC_OK);
        assert_int_equal(gradc_session_init_params(s[ti], 11), GRADC_OK);
        gradc_optimizer_options oo;
        gradc_optimizer_options_init(&oo, kind ? GRADC_ADAMW : GRADC_SGD);
        oo.lr = 0.05;
        oo.momentum = kind ? 0 : 0.9;
        oo.nesterov = !kind;
        oo.weight_decay = 0.02;
        oo.clip_norm = 1.5;
        oo.warmup_steps = 2;
        assert_int_equal(gradc_session_set_optimizer(s[ti], &oo), GRADC_OK);
      }
      for (int t = 0; t < 5; t++) {
        double x[5], xs[5];
        float xf[5];
        for (int j = 0; j < 5; j++) x[j] = value();
        for (int ti = 0; ti < 2; ti++) {
          for (int j = 0; j < 5; j++) xf[j] = (float)(xs[j] = x[j]);
          assert_int_equal(gradc_session_set_input(s[ti], "x", mi ? GRADC_F64 : GRADC_F32, mi ? (void *)xs : (void *)xf, 5),
                           GRADC_OK);
          assert_int_equal(gradc_session_run(s[ti]), GRADC_OK);
          assert_int_equal(gradc_session_step(s[ti]), GRADC_OK);
        }
        double w[2][5];
        float wf[2][5];
        for (int ti = 0; ti < 2; ti++)
          assert_int_equal(gradc_session_get_param(s[ti], "w", mi ? (void *)w[ti] : (void *)wf[ti], 5), GRADC_OK);
        if (mi)
          assert_memory_equal(w[0], w[1], sizeof w[0]);
        else
          assert_memory_equal(wf[0], wf[1], sizeof wf[0]);
      }
      for (int ti = 0; ti < 2; ti++) {
        gradc_session_free(s[ti]);
        gradc_program_free(p[ti]);
      }
    }
  /* The kernels were built (and cached) by the cpu sessions. */
  char cmd[512];
  snprintf(cmd, sizeof cmd, "ls '%s' | grep -q '^cpu-optim-'", dir);
  assert_int_equal(system(cmd), 0);
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  assert_int_equal(system(cmd), 0);
  if (saved) {
    setenv("GRADC_CACHE_DIR", saved, 1);
    free(saved);
  } else {
    unsetenv("GRADC_CACHE_DIR");
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_optimgen_sgd_matches_c_loop),
      cmocka_unit_test(test_optimgen_adamw_matches_c_loop),
      cmocka_unit_test(test_optimgen_cached),
      cmocka_unit_test(test_optimgen_session_follows_the_c_loop),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

#else /* no LLVM: only the C loop exists; check it against hand-computed values */

static void test_optimgen_c_loop_by_hand(void **state) {
  (void)state;
  double p[1] = {1.0}, g[1] = {0.5}, b[1] = {0};
  CgOptimScalars sc = {.coef = 1, .neg_lr = -0.1, .mom_on = 1, .momentum = 0.9, .damp1 = 1, .first = 1};
  cg_optim_update_c(CG_OPTIM_SGD, true, p, g, b, NULL, 1, &sc);
  assert_true(b[0] == 0.5 && p[0] == 1.0 - 0.1 * 0.5);
  sc.first = 0;
  cg_optim_update_c(CG_OPTIM_SGD, true, p, g, b, NULL, 1, &sc);
  assert_true(b[0] == 0.5 * 0.9 + 0.5);
  (void)value;
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_optimgen_c_loop_by_hand)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}

#endif
