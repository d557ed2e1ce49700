/* test_conv.c - convolution, pooling, pad and batch_norm end to end.
 *
 * tests/models/lenet.gdl (a LeNet-like CNN), conv_paths.gdl (conv1d,
 * groups, dilation, strides, avg_pool2d with padding, pad with a value
 * and a crop) and conv_bn.gdl (batch_norm):
 *   - forward values of every built-in (groups, dilation, strides, pool
 *     padding, a crop, batch_norm's biased variance) equal their PyTorch
 *     definitions written out as loops, in f64;
 *   - the CPU back end equals the reference interpreter at --gas 1 and 2
 *     (f32, 1e-5 relative on every loss and gradient), and --gas 2 equals
 *     --gas 1 on the interpreter (the window rule, DESIGN.md §3; conv_bn
 *     is refused at K = 2 instead, by gas-fold);
 *   - in f64, every param's gradient (autodiff on the interpreter, exact
 *     f64) matches central finite differences of the loss at up to 16
 *     elements per param, h = 1e-6, to 1e-6 relative on their norm. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "passes/passes.h"
#include "runtime/runtime.h"
#include "testutil.h"

#define FD_H 1e-6
#define FD_TOL 1e-6
#define FD_SAMPLES 16

static const char *models[] = {"tests/models/lenet.gdl", "tests/models/conv_paths.gdl", "tests/models/conv_bn.gdl"};

static char *replace_all(const char *s, const char *from, const char *to) {
  size_t nf = strlen(from), nt = strlen(to), n = 0;
  for (const char *p = strstr(s, from); p; p = strstr(p + nf, from)) n++;
  char *out = malloc(strlen(s) + n * (nt > nf ? nt - nf : 0) + 1), *o = out;
  for (const char *p = s;;) {
    const char *q = strstr(p, from);
    if (!q) {
      strcpy(o, p);
      break;
    }
    memcpy(o, p, (size_t)(q - p));
    o += q - p;
    memcpy(o, to, nt);
    o += nt;
    p = q + nf;
  }
  return out;
}

/* The model compiled with K micro-batches and run through a pipeline
 * (cpu: the CPU back end's, else the interpreter's); NULL when gas-fold
 * refuses it (the diagnostic is then in *refusal). */
static FeModel *compile(const char *path, const char *text, int K, bool cpu, char *refusal, size_t n) {
  static SrcFile src;
  src.name = path;
  src.text = text;
  src.len = strlen(text);
  Diag d;
  diag_init(&d, NULL);
  d.quiet = true;
  FeOptions opt = {.gas = K, .dp = 1};
  FeModel *m = fe_model_compile(&src, &opt, &d);
  if (!m) fail_msg("%s: %s", path, sb_str(&d.log));
  int np;
  const char *const *names = cpu ? pass_pipeline_cpu(&np) : pass_pipeline(&np);
  PassManager pm;
  pm_init(&pm);
  pm.verify = true;
  PassOptions po = {.gas = K, .diag = &d};
  int rc = pm_run(&pm, m->func, names, np, &po);
  if (rc == 1 && K > 1) {
    snprintf(refusal, n, "%s", sb_str(&d.log));
    diag_free(&d);
    fe_model_free(m);
    return NULL;
  }
  if (rc != 0) fail_msg("%s K=%d: passes failed: %s", path, K, sb_str(&d.log));
  diag_free(&d);
  return m;
}

/* Random params N(0, 0.3) in the param's dtype (F64 for f64). */
static void random_params(const IrFunc *f, uint64_t seed, StFile *out) {
  Rng r;
  rng_seed(&r, seed);
  st_init(out);
  for (int i = 0; i < f->nargs; i++) {
    const IrValue *a = f->args[i];
    if (a->role != IR_ARG_PARAM) continue;
    int64_t n = ir_numel(&a->type.shape);
    bool dbl = a->type.dtype == IR_DT_F64;
    void *data = calloc((size_t)(n ? n : 1), dbl ? 8 : 4);
    for (int64_t k = 0; k < n; k++) {
      double v = rng_normal(&r) * 0.3;
      if (dbl) ((double *)data)[k] = v;
      else ((float *)data)[k] = (float)v;
    }
    st_add(out, a->name, dbl ? ST_F64 : ST_F32, a->type.shape.rank, a->type.shape.dim, data);
    free(data);
  }
}

static double rel(const double *got, const double *want, int64_t n) {
  double d = 0, w = 0;
  for (int64_t i = 0; i < n; i++) d += (got[i] - want[i]) * (got[i] - want[i]), w += want[i] * want[i];
  return w > 0 ? sqrt(d / w) : sqrt(d);
}

/* The worst relative error of got against want; fails above tol. */
static double compare(const StepResult *got, const StepResult *want, const char *label, double tol) {
  double worst = 0;
  assert_int_equal(got->nlosses, want->nlosses);
  assert_int_equal(got->ngrads, want->ngrads);
  for (int i = 0; i < want->nlosses; i++) {
    double e = rel(&got->losses[i], &want->losses[i], 1);
    if (e > tol) fail_msg("%s: loss %s %.9g, want %.9g", label, want->loss_names[i], got->losses[i], want->losses[i]);
    if (e > worst) worst = e;
  }
  for (int i = 0; i < want->ngrads; i++) {
    double e = rel(got->grads[i], want->grads[i], ir_numel(&want->grad_types[i].shape));
    if (e > tol) fail_msg("%s: gradient of %s off by %.3g relative", label, want->grad_names[i], e);
    if (e > worst) worst = e;
  }
  return worst;
}

static void run_ref(const FeModel *m, int K, const StFile *params, const StFile *inputs, bool exact, StepResult *out) {
  char err[1024];
  InterpOptions o = {.exact_f64 = exact};
  if (!step_run_ref(m->func, K, params, "PARAMS", inputs, "INPUTS", &o, out, err, sizeof err))
    fail_msg("reference: %s", err);
}

static void test_conv_cpu_matches_reference_at_gas_1_and_2(void **state) {
  (void)state;
  for (size_t i = 0; i < sizeof models / sizeof *models; i++) {
    char *text = tu_read(models[i]);
    StFile params, inputs;
    StepResult first;
    double worst = 0, wgas = -1; /* -1: refused at K = 2 */
    for (int K = 1; K <= 2; K++) {
      char refusal[2048] = "";
      FeModel *ref = compile(models[i], text, K, false, refusal, sizeof refusal);
      if (!ref) {
        /* batch_norm mixes samples: refused at the call, saying why */
        if (!strstr(models[i], "conv_bn")) fail_msg("%s refused at K=%d: %s", models[i], K, refusal);
        if (!strstr(refusal, ":14:12: error:") || !strstr(refusal, "reduction over the batch")) fail_msg("refusal not at batch_norm: %s", refusal);
        continue;
      }
      if (K == 1) {
        random_params(ref->func, 7, &params);
        st_init(&inputs);
        rt_random_inputs(ref->func, 1, 8, &inputs);
      }
      StepResult want, got;
      run_ref(ref, K, &params, &inputs, false, &want);
#ifdef GRADC_HAVE_LLVM
      FeModel *cpu = compile(models[i], text, K, true, NULL, 0);
      char err[1024];
      CpuOptions o = {.threads = 2, .cache_dir = getenv("GRADC_CACHE_DIR")};
      CpuProgram *p = cpu_program_new(cpu->func, &o, err, sizeof err);
      if (!p) fail_msg("cpu_program_new: %s", err);
      if (!cpu_step_run(p, K, &params, "PARAMS", &inputs, "INPUTS", &got, err, sizeof err)) fail_msg("%s", err);
      char label[300];
      snprintf(label, sizeof label, "%s cpu K=%d", models[i], K);
      double e = compare(&got, &want, label, 1e-5);
      if (e > worst) worst = e;
      step_result_free(&got);
      cpu_program_free(p);
      fe_model_free(cpu);
#else
      (void)got;
#endif
      if (K == 1) {
        first = want;
      } else {
        char label[300];
        snprintf(label, sizeof label, "%s ref K=2 against K=1", models[i]);
        wgas = compare(&want, &first, label, 1e-5);
        step_result_free(&want);
      }
      fe_model_free(ref);
    }
    if (wgas < 0) print_message("  %-30s cpu against the interpreter %.3g, --gas 2 refused\n", models[i], worst);
    else print_message("  %-30s cpu against the interpreter %.3g, --gas 2 against 1 %.3g\n", models[i], worst, wgas);
    step_result_free(&first);
    st_free(&params);
    st_free(&inputs);
    free(text);
  }
}

static double total_loss(const StepResult *r) {
  double s = 0;
  for (int i = 0; i < r->nlosses; i++) s += r->losses[i];
  return s;
}

static void test_conv_gradients_match_finite_differences_f64(void **state) {
  (void)state;
  for (size_t i = 0; i < sizeof models / sizeof *models; i++) {
    char *t32 = tu_read(models[i]), *text = replace_all(t32, "f32", "f64");
    FeModel *m = compile(models[i], text, 1, false, NULL, 0);
    StFile params, inputs;
    random_params(m->func, 11, &params);
    st_init(&inputs);
    rt_random_inputs(m->func, 1, 12, &inputs);
    StepResult base;
    run_ref(m, 1, &params, &inputs, true, &base);
    double worst = 0;
    for (int gi = 0; gi < base.ngrads; gi++) {
      StTensor *pt = NULL;
      for (int k = 0; k < params.n; k++)
        if (strcmp(params.t[k].name, base.grad_names[gi]) == 0) pt = &params.t[k];
      assert_non_null(pt);
      int64_t n = st_numel(pt), ns = n < FD_SAMPLES ? n : FD_SAMPLES;
      double got[FD_SAMPLES], fd[FD_SAMPLES];
      double *pv = pt->data;
      for (int64_t s = 0; s < ns; s++) {
        int64_t e = s * n / ns; /* spread over the tensor */
        double keep = pv[e];
        StepResult r;
        pv[e] = keep + FD_H;
        run_ref(m, 1, &params, &inputs, true, &r);
        double up = total_loss(&r);
        step_result_free(&r);
        pv[e] = keep - FD_H;
        run_ref(m, 1, &params, &inputs, true, &r);
        double down = total_loss(&r);
        step_result_free(&r);
        pv[e] = keep;
        fd[s] = (up - down) / (2 * FD_H);
        got[s] = base.grads[gi][e];
      }
      double e = rel(got, fd, ns);
      if (e > FD_TOL) fail_msg("%s: gradient of %s off finite differences by %.3g relative", models[i], pt->name, e);
      if (e > worst) worst = e;
    }
    print_message("  %-30s f64 gradients against finite differences: worst %.3g\n", models[i], worst);
    step_result_free(&base);
    st_free(&params);
    st_free(&inputs);
    fe_model_free(m);
    free(text);
    free(t32);
  }
}

/* batch_norm under --gas 2: gradc refuses the model at the batch_norm call,
 * saying why, with the source line and a caret (DESIGN.md §3 rule 4). */
static void test_conv_batch_norm_refused_under_gas(void **state) {
  (void)state;
  char out[8192];
  int rc = tu_sh(out, sizeof out, "cd %s && %s compile tests/models/conv_bn.gdl --gas 2 2>&1",
                 GRADC_SOURCE_DIR, GRADC_BINARY);
  assert_int_equal(rc, 1);
  const char *want = "tests/models/conv_bn.gdl:14:12: error: loss 'ce' cannot be split into 2 micro-batches: it "
                     "combines per-sample values with a reduction over the batch";
  if (!strstr(out, want)) fail_msg("got:\n%s", out);
  if (!strstr(out, "  h = relu(batch_norm(conv2d(x, w, padding=1), g, b))\n           ^")) fail_msg("no caret:\n%s", out);
}

/* ------------------------------------------------------------------ */
/* Forward values against the direct definitions                       */
/* ------------------------------------------------------------------ */
/* The definitions of F.conv1d/F.conv2d, F.avg_pool2d (padding counted),
 * F.max_pool2d and F.pad written out as loops over output elements, with
 * no patches and no matmul, against the interpreter's values of the
 * lowered ops (f64, exact). */

static const char direct_model[] =
    "model direct {\n"
    "  input x : f64[2, 4, 7, 6]\n"
    "  input s : f64[2, 3, 11]\n"
    "  param w : f64[6, 2, 3, 2]\n"
    "  param b : f64[6]\n"
    "  param u : f64[5, 3, 3]\n"
    "  param g : f64[4]\n"
    "  param bb : f64[4]\n"
    "  c = conv2d(x, w, b, stride=[2, 1], padding=[1, 2], dilation=[2, 1], groups=2)\n"
    "  e = conv1d(s, u, stride=2, padding=3, dilation=2)\n"
    "  a = avg_pool2d(x, 3, stride=2, padding=1)\n"
    "  m = max_pool2d(x, [3, 2], stride=[1, 2], padding=[1, 1])\n"
    "  q = pad(x, [1, -2, -1, 3], value=0.25)\n"
    "  n = batch_norm(x, g, bb, eps=0.01)\n"
    "  loss l = sum(c) + sum(e) + sum(a) + sum(m) + sum(q) + sum(n)\n"
    "}\n";

/* Element (i0, i1, ...) of a row-major tensor of shape s. */
static int64_t at(const IrShape *s, const int64_t *i) {
  int64_t o = 0;
  for (int k = 0; k < s->rank; k++) o = o * s->dim[k] + i[k];
  return o;
}

/* y = conv(x, w) + bias over d spatial axes, as F.conv{d}d. */
static void conv_direct(const double *x, const IrShape *xs, const double *w, const IrShape *ws, const double *bias,
                        const int64_t *st, const int64_t *pad, const int64_t *dil, int64_t groups, const IrShape *ys,
                        double *y) {
  int d = xs->rank - 2;
  int64_t Cg = ws->dim[1], Og = ws->dim[0] / groups, n = ir_numel(ys);
  for (int64_t e = 0; e < n; e++) {
    int64_t yi[4], r = e;
    for (int k = ys->rank - 1; k >= 0; k--) yi[k] = r % ys->dim[k], r /= ys->dim[k];
    int64_t o = yi[1], g = o / Og;
    double acc = bias ? bias[o] : 0;
    int64_t K = 1;
    for (int i = 0; i < d; i++) K *= ws->dim[2 + i];
    for (int64_t c = 0; c < Cg; c++)
      for (int64_t kk = 0; kk < K; kk++) {
        int64_t ki[2] = {d == 2 ? kk / ws->dim[3] : kk, d == 2 ? kk % ws->dim[3] : 0};
        int64_t xi[4] = {yi[0], g * Cg + c, 0, 0}, wi[4] = {o, c, ki[0], ki[1]};
        bool in = true;
        for (int i = 0; i < d; i++) {
          xi[2 + i] = yi[2 + i] * st[i] - pad[i] + ki[i] * dil[i];
          in &= xi[2 + i] >= 0 && xi[2 + i] < xs->dim[2 + i];
        }
        if (in) acc += w[at(ws, wi)] * x[at(xs, xi)];
      }
    y[e] = acc;
  }
}

/* max or mean (count_include_pad) over kernel windows of the last two axes. */
static void pool_direct(const double *x, const IrShape *xs, const int64_t *k, const int64_t *st, const int64_t *pad,
                        bool mx, const IrShape *ys, double *y) {
  int64_t n = ir_numel(ys);
  for (int64_t e = 0; e < n; e++) {
    int64_t yi[4], r = e;
    for (int q = 3; q >= 0; q--) yi[q] = r % ys->dim[q], r /= ys->dim[q];
    double acc = mx ? -INFINITY : 0;
    for (int64_t a = 0; a < k[0]; a++)
      for (int64_t bb = 0; bb < k[1]; bb++) {
        int64_t xi[4] = {yi[0], yi[1], yi[2] * st[0] - pad[0] + a, yi[3] * st[1] - pad[1] + bb};
        bool in = xi[2] >= 0 && xi[2] < xs->dim[2] && xi[3] >= 0 && xi[3] < xs->dim[3];
        double v = in ? x[at(xs, xi)] : (mx ? -INFINITY : 0);
        acc = mx ? (v > acc ? v : acc) : acc + v;
      }
    y[e] = mx ? acc : acc / (double)(k[0] * k[1]);
  }
}

static const IrValue *named(const IrFunc *f, const char *name) {
  for (int i = 0; i < f->nvalues; i++)
    if (f->values[i]->name && strcmp(f->values[i]->name, name) == 0) return f->values[i];
  fail_msg("no value named %s", name);
  return NULL;
}

static void test_conv_forward_matches_direct_definitions(void **state) {
  (void)state;
  SrcFile src = {"direct.gdl", direct_model, strlen(direct_model)};
  Diag d;
  diag_init(&d, NULL);
  d.quiet = true;
  FeOptions opt = {.gas = 1, .dp = 1};
  FeModel *m = fe_model_compile(&src, &opt, &d);
  if (!m) fail_msg("%s", sb_str(&d.log));
  diag_free(&d);
  IrFunc *f = m->func;
  Rng rng;
  rng_seed(&rng, 5);
  double *args[16];
  assert_true(f->nargs <= 16);
  for (int i = 0; i < f->nargs; i++) {
    int64_t n = ir_numel(&f->args[i]->type.shape);
    args[i] = malloc((size_t)n * sizeof(double));
    for (int64_t k = 0; k < n; k++) args[i][k] = rng_normal(&rng);
  }
  InterpState st = {0};
  InterpOptions io = {.exact_f64 = true};
  char err[512];
  if (!interp_run(&st, f, args, NULL, INTERP_STEP, &io, err, sizeof err)) fail_msg("%s", err);
  const double *x = args[0], *s = args[1], *w = args[2], *b = args[3], *u = args[4];
  const IrShape *xs = &f->args[0]->type.shape;
  static const char *names[] = {"c", "e", "a", "m", "q", "n"};
  for (int t = 0; t < 6; t++) {
    const IrValue *v = named(f, names[t]);
    const IrShape *ys = &v->type.shape;
    int64_t n = ir_numel(ys);
    double *want = calloc((size_t)n, sizeof(double));
    switch (t) {
    case 0: {
      int64_t st2[2] = {2, 1}, p2[2] = {1, 2}, d2[2] = {2, 1};
      assert_int_equal(ys->dim[2], 3); /* (7 + 2 - 4 - 1) / 2 + 1 */
      assert_int_equal(ys->dim[3], 9); /* (6 + 4 - 1 - 1) / 1 + 1 */
      conv_direct(x, xs, w, &f->args[2]->type.shape, b, st2, p2, d2, 2, ys, want);
      break;
    }
    case 1: {
      int64_t st1 = 2, p1 = 3, d1 = 2;
      assert_int_equal(ys->dim[2], 7); /* (11 + 6 - 4 - 1) / 2 + 1 */
      conv_direct(s, &f->args[1]->type.shape, u, &f->args[4]->type.shape, NULL, &st1, &p1, &d1, 1, ys, want);
      break;
    }
    case 2: {
      int64_t k[2] = {3, 3}, sp[2] = {2, 2}, pp[2] = {1, 1};
      pool_direct(x, xs, k, sp, pp, false, ys, want);
      break;
    }
    case 3: {
      int64_t k[2] = {3, 2}, sp[2] = {1, 2}, pp[2] = {1, 1};
      pool_direct(x, xs, k, sp, pp, true, ys, want);
      break;
    }
    case 5: { /* batch_norm: per channel, the mean and biased variance over N, H, W */
      int64_t C = xs->dim[1], per = n / C;
      for (int64_t c = 0; c < C; c++) {
        double mu = 0, var = 0;
        for (int64_t e = 0; e < n; e++)
          if (e / (xs->dim[2] * xs->dim[3]) % C == c) mu += x[e];
        mu /= (double)per;
        for (int64_t e = 0; e < n; e++)
          if (e / (xs->dim[2] * xs->dim[3]) % C == c) var += (x[e] - mu) * (x[e] - mu);
        var /= (double)per;
        for (int64_t e = 0; e < n; e++)
          if (e / (xs->dim[2] * xs->dim[3]) % C == c) want[e] = (x[e] - mu) / sqrt(var + 0.01) * args[5][c] + args[6][c];
      }
      break;
    }
    default: /* pad [1, -2, -1, 3]: W gains 1 on the left and loses 2 on the right, H loses 1 on top and gains 3 */
      assert_int_equal(ys->dim[2], 7 - 1 + 3);
      assert_int_equal(ys->dim[3], 6 + 1 - 2);
      for (int64_t e = 0; e < n; e++) {
        int64_t yi[4], r = e;
        for (int q = 3; q >= 0; q--) yi[q] = r % ys->dim[q], r /= ys->dim[q];
        int64_t xi[4] = {yi[0], yi[1], yi[2] + 1, yi[3] - 1};
        bool in = xi[2] < xs->dim[2] && xi[3] >= 0 && xi[3] < xs->dim[3];
        want[e] = in ? x[at(xs, xi)] : 0.25;
      }
      break;
    }
    const double *got = st.val[v->id];
    for (int64_t e = 0; e < n; e++)
      if (!(fabs(got[e] - want[e]) <= 1e-12 * (1 + fabs(want[e]))))
        fail_msg("%s: element %lld is %.17g, the definition gives %.17g", names[t], (long long)e, got[e], want[e]);
    print_message("  %s: %lld elements equal the direct definition\n", names[t], (long long)n);
    free(want);
  }
  interp_free(&st);
  for (int i = 0; i < f->nargs; i++) free(args[i]);
  fe_model_free(m);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_conv_forward_matches_direct_definitions),
      cmocka_unit_test(test_conv_cpu_matches_reference_at_gas_1_and_2),
      cmocka_unit_test(test_conv_gradients_match_finite_differences_f64),
      cmocka_unit_test(test_conv_batch_norm_refused_under_gas),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
