/* test_exec.c - the CPU executor against the reference interpreter.
 *
 * Every model in examples/, tests/models/ and the shared conformance cases
 * (f32, and f64 made by replacing f32 in the text; K = 1 and K = 4), with
 * random params and inputs: every loss and gradient of the CPU target
 * equals step_run_ref's within 1e-5 relative (f32) or 1e-12 (f64); the
 * worst error per model is printed.  Hand-written programs of group-0 ops
 * only exercise the GEMM paths (transposes as flags, 1-D operands,
 * broadcast batch dims, gradient accumulation with beta = 1), window sums,
 * aliases and consts.  Gradients accumulate: K = 4 equals the sum of four
 * K = 1 runs on the slices; the arena does not grow with K; the thread pool
 * visits every iteration once and is as wide as the process's affinity
 * mask and its cgroup's CPU quota allow. */
#define _GNU_SOURCE /* sched_setaffinity */
#include <dirent.h>
#include <math.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "passes/passes.h"
#include "runtime/runtime.h"
#include "testutil.h"

/* ------------------------------------------------------------------ */
/* Helpers                                                             */
/* ------------------------------------------------------------------ */

static IrFunc *read_ir(const char *text) {
  SrcFile src = {"test.gir", text, strlen(text)};
  Diag d;
  diag_init(&d, NULL);
  d.quiet = true;
  IrFunc *f = ir_read(&src, &d);
  if (!f) fail_msg("cannot read IR: %s", sb_str(&d.log));
  diag_free(&d);
  return f;
}

static int run_passes(IrFunc *f, const char *const *names, int n, int gas, Diag *d) {
  PassManager pm;
  pm_init(&pm);
  pm.verify = true;
  PassOptions po = {.gas = gas, .diag = d};
  return pm_run(&pm, f, names, n, &po);
}

static void plan(IrFunc *f) {
  Diag d;
  diag_init(&d, NULL);
  d.quiet = true;
  const char *names[] = {"memplan"};
  if (run_passes(f, names, 1, 1, &d) != 0) fail_msg("memplan failed: %s", sb_str(&d.log));
  diag_free(&d);
}

/* Random params: N(0, scale) in the param's file dtype (F64 for f64). */
static void random_params(const IrFunc *f, uint64_t seed, double scale, StFile *out) {
  Rng r;
  rng_seed(&r, seed);
  st_init(out);
  for (int i = 0; i < f->nargs; i++) {
    const IrValue *a = f->args[i];
    /* Buffers too (a model with `buffer` reads them like params); they get
     * positive values, as running variances need. */
    if (a->role != IR_ARG_PARAM && a->role != IR_ARG_BUFFER) continue;
    int64_t n = ir_numel(&a->type.shape);
    bool dbl = a->type.dtype == IR_DT_F64;
    void *data = calloc((size_t)(n ? n : 1), dbl ? 8 : 4);
    for (int64_t k = 0; k < n; k++) {
      double v = rng_normal(&r) * scale;
      if (a->role == IR_ARG_BUFFER) v = fabs(v) + 0.5;
      if (dbl)
        ((double *)data)[k] = v;
      else
        ((float *)data)[k] = (float)v;
    }
    st_add(out, a->name, dbl ? ST_F64 : ST_F32, a->type.shape.rank, a->type.shape.dim, data);
    free(data);
  }
}

static double max_abs(const double *x, int64_t n) {
  double m = 0;
  for (int64_t i = 0; i < n; i++)
    if (fabs(x[i]) > m) m = fabs(x[i]);
  return m;
}

/* Relative error of got against want: max |got - want| / max |want| (a
 * tensor's scale), 0 when both are zero. */
static double rel_err(const double *got, const double *want, int64_t n) {
  double d = 0;
  for (int64_t i = 0; i < n; i++) {
    double e = fabs(got[i] - want[i]);
    if (isnan(got[i]) || isnan(want[i])) return INFINITY; /* random params never give NaN */
    if (e > d) d = e;
  }
  double s = max_abs(want, n);
  if (d == 0) return 0;
  return s > 0 ? d / s : INFINITY;
}

/* Worst relative error over every loss and gradient; fails on a mismatch
 * of names, and prints the first values of the worst tensor. */
static double compare(const StepResult *got, const StepResult *want, const char *label, double tol) {
  assert_int_equal(got->nlosses, want->nlosses);
  assert_int_equal(got->ngrads, want->ngrads);
  double worst = 0;
  const char *where = "";
  /* Losses in the same (source) order, although `fuse` reorders the outputs. */
  for (int i = 0; i < want->nlosses; i++) {
    int j = i;
    if (strcmp(got->loss_names[j], want->loss_names[i]) != 0)
      fail_msg("%s: loss %d is '%s', the reference's is '%s'", label, i, got->loss_names[j], want->loss_names[i]);
    double e = rel_err(&got->losses[j], &want->losses[i], 1);
    if (e > worst) worst = e, where = want->loss_names[i];
    if (e > tol) print_message("%s: loss %s: cpu %.17g ref %.17g\n", label, want->loss_names[i], got->losses[j], want->losses[i]);
  }
  /* A gradient that is zero up to rounding (a key bias under softmax's
   * shift invariance) is all noise: it is measured against the scale of
   * the model's gradients instead of its own. */
  double global = 0;
  for (int i = 0; i < want->ngrads; i++) global = fmax(global, max_abs(want->grads[i], ir_numel(&want->grad_types[i].shape)));
  for (int i = 0; i < want->ngrads; i++) {
    assert_string_equal(got->grad_names[i], want->grad_names[i]);
    int64_t n = ir_numel(&want->grad_types[i].shape);
    double e = rel_err(got->grads[i], want->grads[i], n);
    if (max_abs(want->grads[i], n) < tol * global) {
      double d = 0;
      for (int64_t k = 0; k < n; k++) d = fmax(d, fabs(got->grads[i][k] - want->grads[i][k]));
      e = d / global;
    }
    if (e > worst) worst = e, where = want->grad_names[i];
    if (e > tol) {
      print_message("%s: gradient %s: relative error %.3g\n", label, want->grad_names[i], e);
      for (int64_t k = 0; k < n && k < 6; k++)
        print_message("    [%lld] cpu %.17g  ref %.17g\n", (long long)k, got->grads[i][k], want->grads[i][k]);
    }
  }
  if (worst > tol) fail_msg("%s: worst relative error %.3g (in %s) exceeds %.0e", label, worst, where, tol);
  return worst;
}

static CpuProgram *program(IrFunc *f, int threads) {
  char err[1024];
  /* ctest sets GRADC_CACHE_DIR: kernels compiled once are loaded from there. */
  CpuOptions o = {.threads = threads, .cache_dir = getenv("GRADC_CACHE_DIR")};
  CpuProgram *p = cpu_program_new(f, &o, err, sizeof err);
  if (!p) fail_msg("cpu_program_new: %s", err);
  return p;
}

/* Run f (planned) on both back ends with K micro-batches; returns the worst error. */
static double run_both(IrFunc *f, int K, uint64_t seed, const char *label, double tol, int threads) {
  StFile params, inputs;
  random_params(f, seed, 0.5, &params);
  st_init(&inputs);
  rt_random_inputs(f, K, seed + 1, &inputs);
  char err[1024];
  StepResult want, got;
  if (!step_run_ref(f, K, &params, "PARAMS", &inputs, "INPUTS", NULL, &want, err, sizeof err))
    fail_msg("%s: reference: %s", label, err);
  CpuProgram *p = program(f, threads);
  if (!cpu_step_run(p, K, &params, "PARAMS", &inputs, "INPUTS", &got, err, sizeof err)) fail_msg("%s: cpu: %s", label, err);
  double e = compare(&got, &want, label, tol);
  /* A second window on the same program gives the same result (buffers re-zeroed). */
  StepResult again;
  if (!cpu_step_run(p, K, &params, "PARAMS", &inputs, "INPUTS", &again, err, sizeof err)) fail_msg("%s: %s", label, err);
  compare(&again, &got, label, 0);
  step_result_free(&again);
  cpu_program_free(p);
  step_result_free(&want);
  step_result_free(&got);
  st_free(&params);
  st_free(&inputs);
  return e;
}

static char *replace_all(const char *s, const char *from, const char *to) {
  size_t nf = strlen(from), nt = strlen(to), cap = strlen(s) * 2 + 16, k = 0;
  char *r = malloc(cap);
  for (const char *p = s; *p;) {
    if (k + nt + 2 >= cap) r = realloc(r, cap *= 2);
    if (strncmp(p, from, nf) == 0) {
      memcpy(r + k, to, nt);
      k += nt;
      p += nf;
    } else {
      r[k++] = *p++;
    }
  }
  r[k] = 0;
  return r;
}

/* ------------------------------------------------------------------ */
/* Group-0 programs: GEMMs, aliases, consts, window sums               */
/* ------------------------------------------------------------------ */

/* Losses are summed through a 1-D GEMM with a ones vector (a GEMM reads a
 * const: stored once at start-up).  Gradients are GEMMs (accumulating into
 * their buffers), with operand transposes as flags. */
static char *gemm_text(void) {
  return strdup(
      "func @gemms(%x: f32[6,5] input batch, %u: f32[6] input batch, %q: f32[2,3,4,5] input, "
      "%W: f32[5,7] param, %V: f32[3,5,4] param, %Z: f32[2,7] param) {\n"
      "  %h = matmul %x, %W : f32[6,7]\n"
      "  %Wt = permute %W {perm=[1,0]} : f32[7,5]\n"
      "  %g = matmul %h, %Wt : f32[6,5]\n"                  /* transposed right */
      "  %gt = permute %g {perm=[1,0]} : f32[5,6]\n"
      "  %xt = permute %x {perm=[1,0]} : f32[5,6]\n"
      "  %hx = matmul %xt, %h : f32[5,7]\n"                 /* transposed left */
      "  %sq = matmul %gt, %g : f32[5,5]\n"
      "  %b1 = matmul %q, %W : f32[2,3,4,7]\n"              /* batch folded into M */
      "  %b2 = matmul %q, %V : f32[2,3,4,4]\n"              /* broadcast batch dims */
      "  %qt = permute %q {perm=[0,1,3,2]} : f32[2,3,5,4]\n"
      "  %b3 = matmul %q, %qt : f32[2,3,4,4]\n"             /* batched, transposed right */
      "  %row = matmul %u, %x : f32[5]\n"                   /* 1-D left */
      "  %col = matmul %q, %row : f32[2,3,4]\n"             /* 1-D right, batched left */
      "  %vb = matmul %row, %V : f32[3,4]\n"                /* 1-D left, batched right */
      "  %ones5 = const {value=1.0} : f32[5]\n"
      "  %ones7 = const {value=1.0} : f32[7]\n"
      "  %ones24 = const {value=1.0} : f32[24]\n"
      "  %ones12 = const {value=1.0} : f32[12]\n"
      "  %half96 = const {value=0.5} : f32[96]\n"
      "  %ones168 = const {value=1.0} : f32[168]\n"
      "  %f1 = reshape %b1 {shape=[168]} : f32[168]\n"
      "  %l1 = matmul %f1, %ones168 : f32\n"
      "  loss %l1 {name=\"b1\"}\n"
      "  %f2 = reshape %b2 {shape=[96]} : f32[96]\n"
      "  %l2 = matmul %f2, %half96 : f32\n"
      "  loss %l2 {name=\"b2\"}\n"
      "  %f3 = reshape %b3 {shape=[96]} : f32[96]\n"
      "  %l3 = matmul %f3, %half96 : f32\n"
      "  loss %l3 {name=\"b3\"}\n"
      "  %fc = reshape %col {shape=[24]} : f32[24]\n"
      "  %lc = matmul %fc, %ones24 : f32\n"
      "  loss %lc {name=\"col\"}\n"
      "  %fv = reshape %vb {shape=[12]} : f32[12]\n"
      "  %lv = matmul %fv, %ones12 : f32\n"
      "  loss %lv {name=\"vb\"}\n"
      "  %lr = matmul %row, %ones5 : f32\n"
      "  loss %lr {name=\"row\"}\n"
      "  %ws = window.sum %u : f32[6]\n"                    /* stored before the micro-batches */
      "  %lw = matmul %ws, %u : f32\n"
      "  loss %lw {name=\"wsum\"}\n"
      "  %cnt = window.sum %ones7 : f32[7]\n"
      "  %lcnt = matmul %cnt, %ones7 : f32\n"
      "  loss %lcnt {name=\"count\"}\n"
      "  %dW = matmul %sq, %hx : f32[5,7]\n"                /* accumulates into W's buffer */
      "  grad %dW {name=\"W\"}\n"
      "  %m26 = reshape %fv {shape=[2,6]} : f32[2,6]\n"     /* an alias of an alias */
      "  %dZ = matmul %m26, %h : f32[2,7]\n"
      "  %dZf = reshape %dZ {shape=[14]} : f32[14]\n"       /* the buffer through an alias */
      "  %dZr = reshape %dZf {shape=[2,7]} : f32[2,7]\n"
      "  grad %dZr {name=\"Z\"}\n"
      "}\n");
}

static void test_exec_gemm_paths(void **state) {
  (void)state;
  for (int prec = 0; prec < 2; prec++) {
    char *text = gemm_text();
    if (prec) {
      char *t = replace_all(text, "f32", "f64");
      free(text);
      text = t;
    }
    for (int K = 1; K <= 3; K += 2) {
      /* Batched inputs are per micro-batch: 6 rows per micro-batch either way. */
      IrFunc *f = read_ir(text);
      plan(f);
      char label[64];
      snprintf(label, sizeof label, "gemms %s K=%d", prec ? "f64" : "f32", K);
      double e = run_both(f, K, 7 + (uint64_t)K, label, prec ? 1e-12 : 1e-5, 2);
      print_message("  %-22s worst relative error %.3g\n", label, e);
      ir_func_free(f);
    }
    free(text);
  }
}

/* Gradients add up over the window: K = 4 equals the sum of four K = 1
 * windows on the four micro-batches (f64: exact to rounding). */
static void test_exec_gradients_accumulate(void **state) {
  (void)state;
  char *text32 = gemm_text(), *text = replace_all(text32, "f32", "f64");
  free(text32);
  IrFunc *f = read_ir(text);
  plan(f);
  CpuProgram *p = program(f, 1);
  StFile params, inputs;
  random_params(f, 11, 0.5, &params);
  st_init(&inputs);
  rt_random_inputs(f, 4, 12, &inputs);
  char err[512];
  StepResult whole;
  if (!cpu_step_run(p, 4, &params, "P", &inputs, "I", &whole, err, sizeof err)) fail_msg("%s", err);
  double *sum[8] = {0};
  for (int g = 0; g < whole.ngrads; g++) sum[g] = calloc((size_t)ir_numel(&whole.grad_types[g].shape), sizeof(double));
  for (int k = 0; k < 4; k++) {
    /* Micro-batch k alone: slices of the batched inputs, the rest whole. */
    StFile part;
    st_init(&part);
    for (int i = 0; i < inputs.n; i++) {
      const StTensor *t = &inputs.t[i];
      const IrValue *a = ir_func_find_arg(f, t->name);
      int64_t shape[IR_MAX_RANK];
      memcpy(shape, t->shape, sizeof shape);
      size_t es = st_dtype_size(t->dtype), n = (size_t)st_numel(t) * es;
      if (a->batched) {
        shape[0] /= 4;
        n /= 4;
      }
      st_add(&part, t->name, t->dtype, t->rank, shape, (const char *)t->data + (a->batched ? (size_t)k * n : 0));
    }
    StepResult one;
    if (!cpu_step_run(p, 1, &params, "P", &part, "I", &one, err, sizeof err)) fail_msg("%s", err);
    for (int g = 0; g < one.ngrads; g++)
      for (int64_t e = 0; e < ir_numel(&one.grad_types[g].shape); e++) sum[g][e] += one.grads[g][e];
    step_result_free(&one);
    st_free(&part);
  }
  for (int g = 0; g < whole.ngrads; g++) {
    int64_t n = ir_numel(&whole.grad_types[g].shape);
    double e = rel_err(whole.grads[g], sum[g], n);
    if (e > 1e-13) fail_msg("gradient %s: K=4 differs from the sum of 4 windows by %.3g", whole.grad_names[g], e);
    free(sum[g]);
  }
  step_result_free(&whole);
  st_free(&params);
  st_free(&inputs);
  cpu_program_free(p);
  ir_func_free(f);
  free(text);
}

/* Bad tensors are reported as by the reference path; unplanned or unfused
 * functions are refused. */
static void test_exec_errors(void **state) {
  (void)state;
  char *text = gemm_text();
  IrFunc *f = read_ir(text);
  char err[512], want[512];
  CpuOptions o = {0};
  assert_null(cpu_program_new(f, &o, err, sizeof err));
  assert_non_null(strstr(err, "memplan"));
  plan(f);
  CpuProgram *p = program(f, 0);
  StFile params, inputs;
  random_params(f, 1, 1, &params);
  st_init(&inputs);
  rt_random_inputs(f, 2, 2, &inputs);
  StepResult r;
  assert_false(step_run_ref(f, 3, &params, "P.st", &inputs, "I.st", NULL, &r, want, sizeof want));
  assert_false(cpu_step_run(p, 3, &params, "P.st", &inputs, "I.st", &r, err, sizeof err));
  assert_string_equal(err, want);
  assert_false(cpu_step_run(p, 2, &inputs, "I.st", &params, "P.st", &r, err, sizeof err));
  assert_non_null(strstr(err, "not a param of the model"));
  cpu_program_free(p);
  st_free(&params);
  st_free(&inputs);
  ir_func_free(f);
  free(text);

  IrFunc *g = read_ir("func @u(%x: f32[4] input, %W: f32[4] param) {\n"
                      "  %y = mul %x, %W : f32[4]  loc(\"u.gdl\":3:9)\n"
                      "  grad %y {name=\"W\"}\n}\n");
  plan(g);
  assert_null(cpu_program_new(g, &o, err, sizeof err));
  assert_non_null(strstr(err, "u.gdl:3:9: 'mul' is not in a kernel"));
  ir_func_free(g);
}

/* ------------------------------------------------------------------ */
/* Every model                                                         */
/* ------------------------------------------------------------------ */

static bool have_kernels(void) {
#ifdef GRADC_HAVE_LLVM
  return true;
#else
  return false;
#endif
}

static FeModel *compile_model(const char *path, const char *text, int gas, bool small, Diag *d) {
  static SrcFile src;
  static const char *dn_gpt[] = {"B", "T", "C", "NH", "L", "V"};
  static const int64_t dv_gpt[] = {4, 8, 16, 2, 2, 24};
  static const char *dn_mlp[] = {"B", "D", "H"};
  static const int64_t dv_mlp[] = {8, 24, 16};
  src.name = path;
  src.text = text;
  src.len = strlen(text);
  diag_init(d, NULL);
  d->quiet = true;
  FeOptions opt = {.gas = gas, .dp = 1};
  if (small && strstr(path, "/tinygpt.gdl")) opt.def_names = dn_gpt, opt.def_values = dv_gpt, opt.ndefs = 6;
  if (small && strstr(path, "/mlp.gdl")) opt.def_names = dn_mlp, opt.def_values = dv_mlp, opt.ndefs = 3;
  return fe_model_compile(&src, &opt, d);
}

static int cpu_pipeline(IrFunc *f, int gas, Diag *d) {
  int n;
  const char *const *names = pass_pipeline_cpu(&n);
  return run_passes(f, names, n, gas, d);
}

/* Window sums from the step: over one micro-batch on one rank the CPU
 * executor copies a window sum's operand into its slot (I_WSUM) instead
 * of running the count phase; over K it is K times the operand here (a
 * param's sum, an unbatched input's), from the count phase.  "count"
 * sums an i32 operand into an f32 window sum: no byte copy, the count
 * phase at K = 1 too.  Against the interpreter, each over two windows. */
static void test_exec_window_sums_in_step(void **state) {
  (void)state;
  if (!have_kernels()) skip();
  const char *texts[] = {
      "func @share(%x: f32[6,5] input batch, %W: f32[5,7] param) {\n"
      "  %h = matmul %x, %W : f32[6,7]\n"
      "  %e = exp %h : f32[6,7]\n"
      "  %s = sum %e {axes=[0,1], keepdim=false} : f32\n"
      "  %w2 = mul %W, %W : f32[5,7]\n"
      "  %n = sum %w2 {axes=[0,1], keepdim=false} : f32\n"
      "  %wn = window.sum %n : f32\n"
      "  %r = div %s, %wn : f32\n"
      "  loss %r {name=\"share\"}\n"
      "}\n",
      "func @count(%x: f32[6,5] input batch, %y: i32[6] input, %W: f32[5,7] param) {\n"
      "  %h = matmul %x, %W : f32[6,7]\n"
      "  %e = exp %h : f32[6,7]\n"
      "  %s = sum %e {axes=[0,1], keepdim=false} : f32\n"
      "  %yc = sum %y {axes=[0], keepdim=false} : i32\n"
      "  %wy = window.sum %yc : f32\n"
      "  %one = const {value=1.0} : f32\n"
      "  %d = add %wy, %one : f32\n"
      "  %r = div %s, %d : f32\n"
      "  loss %r {name=\"count\"}\n"
      "}\n"};
  for (int t = 0; t < 2; t++)
    for (int K = 1; K <= 3; K += 2) {
      Diag d;
      diag_init(&d, NULL);
      d.quiet = true;
      IrFunc *ref = read_ir(texts[t]), *cpu = read_ir(texts[t]);
      int n;
      const char *const *pipe = pass_pipeline(&n);
      if (run_passes(ref, pipe, n, K, &d) != 0) fail_msg("reference passes: %s", sb_str(&d.log));
      if (cpu_pipeline(cpu, K, &d) != 0) fail_msg("CPU pipeline: %s", sb_str(&d.log));
      diag_free(&d);
      StFile params, inputs;
      random_params(ref, 31 + (uint64_t)K, 0.3, &params);
      st_init(&inputs);
      rt_random_inputs(ref, K, 41 + (uint64_t)K, &inputs);
      char err[1024], label[64];
      snprintf(label, sizeof label, "%s K=%d", t ? "count" : "share", K);
      StepResult want, got;
      if (!step_run_ref(ref, K, &params, "PARAMS", &inputs, "INPUTS", NULL, &want, err, sizeof err))
        fail_msg("%s: reference: %s", label, err);
      CpuProgram *p = program(cpu, 1);
      for (int w = 0; w < 2; w++) { /* the second window over the first one's arena */
        if (!cpu_step_run(p, K, &params, "PARAMS", &inputs, "INPUTS", &got, err, sizeof err))
          fail_msg("%s: cpu: %s", label, err);
        compare(&got, &want, label, 1e-5);
        step_result_free(&got);
      }
      cpu_program_free(p);
      step_result_free(&want);
      st_free(&params);
      st_free(&inputs);
      ir_func_free(ref);
      ir_func_free(cpu);
    }
}

static void check_model(const char *path, const char *label) {
  const char *rerr = NULL;
  char *text = read_file(path, NULL, &rerr);
  if (!text) return;
  double worst[2] = {0, 0};
  bool ran = false;
  for (int prec = 0; prec < 2; prec++) {
    char *t = prec ? replace_all(text, "f32", "f64") : strdup(text);
    for (int K = 1; K <= 4; K += 3) {
      Diag d;
      FeModel *ref = compile_model(path, t, K, true, &d);
      if (!ref) { /* an error model */
        diag_free(&d);
        continue;
      }
      int n;
      const char *const *pipe = pass_pipeline(&n);
      int rc = run_passes(ref->func, pipe, n, K, &d);
      diag_free(&d);
      if (rc == 1 && K > 1) { /* refused: not a sum over samples */
        fe_model_free(ref);
        continue;
      }
      if (rc != 0) fail_msg("%s: passes failed", label);
      FeModel *cpu = compile_model(path, t, K, true, &d);
      if (cpu_pipeline(cpu->func, K, &d) != 0) fail_msg("%s: CPU pipeline failed: %s", label, sb_str(&d.log));
      diag_free(&d);
      char l[400];
      snprintf(l, sizeof l, "%s %s K=%d", label, prec ? "f64" : "f32", K);
      /* The CPU function runs; the reference runs its own (unfused) copy. */
      StFile params, inputs;
      random_params(ref->func, 100 + (uint64_t)K, 0.3, &params);
      st_init(&inputs);
      rt_random_inputs(ref->func, K, 200 + (uint64_t)K, &inputs);
      char err[1024];
      StepResult want, got;
      if (!step_run_ref(ref->func, K, &params, "PARAMS", &inputs, "INPUTS", NULL, &want, err, sizeof err))
        fail_msg("%s: reference: %s", l, err);
      CpuProgram *p = program(cpu->func, 2);
      if (!cpu_step_run(p, K, &params, "PARAMS", &inputs, "INPUTS", &got, err, sizeof err)) fail_msg("%s: %s", l, err);
      double e = compare(&got, &want, l, prec ? 1e-12 : 1e-5);
      if (e > worst[prec]) worst[prec] = e;
      ran = true;
      cpu_program_free(p);
      step_result_free(&want);
      step_result_free(&got);
      st_free(&params);
      st_free(&inputs);
      fe_model_free(ref);
      fe_model_free(cpu);
    }
    free(t);
  }
  if (ran) print_message("  %-32s worst relative error f32 %.3g  f64 %.3g\n", label, worst[0], worst[1]);
  free(text);
}

static void check_dir(const char *dir, const char *prefix) {
  DIR *dp = opendir(dir);
  if (!dp) return;
  struct dirent *e;
  char *names[256];
  int n = 0;
  while ((e = readdir(dp)) && n < 256) {
    size_t l = strlen(e->d_name);
    if (l > 4 && strcmp(e->d_name + l - 4, ".gdl") == 0) names[n++] = strdup(e->d_name);
  }
  closedir(dp);
  for (int i = 0; i < n; i++) {
    char path[4096], label[300];
    snprintf(path, sizeof path, "%s/%s", dir, names[i]);
    snprintf(label, sizeof label, "%s%s", prefix, names[i]);
    check_model(path, label);
    free(names[i]);
  }
}

static void test_exec_every_model_matches_reference(void **state) {
  (void)state;
  if (!have_kernels()) skip(); /* needs the LLVM code generator */
  check_dir(tu_path("examples"), "");
  check_dir(tu_path("tests/models"), "models/");
  check_dir("/work/shared/conformance/cases", "conformance/");
}

/* A gradient that other ops also read (dt feeds grad a and, through * 2,
 * grad b) and one value feeding two grads (du is grad c and grad e):
 * memplan gives each a copy-accumulate kernel, and over K = 4
 * micro-batches the buffers still add up to the reference. */
static void test_exec_gradient_read_elsewhere(void **state) {
  (void)state;
  if (!have_kernels()) skip();
  const char *model = "model shared {\n"
                      "  batch B = 8\n"
                      "  dim D = 6\n"
                      "  input x : f32[B, D]\n"
                      "  param a : f32[D]\n"
                      "  param b : f32[D]\n"
                      "  param c : f32[D, D]\n"
                      "  param e : f32[D, D]\n"
                      "  t = a + b * 2\n"
                      "  h = tanh(x @ (c + e) + t)\n"
                      "  loss l = sum(h * h)\n"
                      "}\n";
  for (int prec = 0; prec < 2; prec++) {
    char *text = prec ? replace_all(model, "f32", "f64") : strdup(model);
    for (int K = 1; K <= 4; K += 3) {
      Diag d;
      FeModel *ref = compile_model("shared.gdl", text, K, false, &d);
      assert_non_null(ref);
      int n;
      const char *const *pipe = pass_pipeline(&n);
      assert_int_equal(run_passes(ref->func, pipe, n, K, &d), 0);
      diag_free(&d);
      FeModel *cpu = compile_model("shared.gdl", text, K, false, &d);
      assert_int_equal(cpu_pipeline(cpu->func, K, &d), 0);
      diag_free(&d);
      int copies = 0;
      for (int i = 0; i < cpu->func->nops; i++) {
        const IrOp *op = cpu->func->ops[i];
        if (op->opcode == IR_OP_DETACH && op->group > 0 && op->result->storage == IR_STORE_GRAD) copies++;
      }
      assert_true(copies >= 3); /* a, and c and e (b's gradient is 2 * dt, read by nothing else) */
      StFile params, inputs;
      random_params(ref->func, 5, 0.5, &params);
      st_init(&inputs);
      rt_random_inputs(ref->func, K, 6, &inputs);
      char err[512], label[64];
      StepResult want, got;
      if (!step_run_ref(ref->func, K, &params, "P", &inputs, "I", NULL, &want, err, sizeof err)) fail_msg("%s", err);
      CpuProgram *p = program(cpu->func, 2);
      if (!cpu_step_run(p, K, &params, "P", &inputs, "I", &got, err, sizeof err)) fail_msg("%s", err);
      snprintf(label, sizeof label, "shared %s K=%d (%d copies)", prec ? "f64" : "f32", K, copies);
      double e = compare(&got, &want, label, prec ? 1e-12 : 1e-5);
      print_message("  %-28s worst relative error %.3g\n", label, e);
      cpu_program_free(p);
      step_result_free(&want);
      step_result_free(&got);
      st_free(&params);
      st_free(&inputs);
      fe_model_free(ref);
      fe_model_free(cpu);
    }
    free(text);
  }
}

/* Only one micro-batch's activations are alive: the arena of a window of
 * K micro-batches of b samples is the arena of one window of b samples. */
static void test_exec_arena_independent_of_K(void **state) {
  (void)state;
  static const char *models[] = {"examples/mlp.gdl", "examples/tinygpt.gdl"};
  for (int m = 0; m < 2; m++) {
    char *text = tu_read(models[m]);
    int64_t size[2];
    for (int v = 0; v < 2; v++) {
      int K = v ? 4 : 1;
      static SrcFile src;
      src.name = models[m];
      src.text = text;
      src.len = strlen(text);
      Diag d;
      diag_init(&d, NULL);
      d.quiet = true;
      const char *dn[] = {"B"};
      int64_t dv[] = {4 * K};
      FeOptions opt = {.gas = K, .dp = 1, .def_names = dn, .def_values = dv, .ndefs = 1};
      FeModel *fm = fe_model_compile(&src, &opt, &d);
      assert_non_null(fm);
      if (cpu_pipeline(fm->func, K, &d) != 0) fail_msg("%s", sb_str(&d.log));
      size[v] = fm->func->arena_size;
      fe_model_free(fm);
      diag_free(&d);
    }
    print_message("  %-22s arena %lld bytes for B=4 K=1 and for B=16 K=4\n", models[m], (long long)size[0]);
    assert_int_equal(size[0], size[1]);
    free(text);
  }
}

/* Arena and peak of the examples at their own sizes (reported, K = 1). */
static void test_exec_report_example_arenas(void **state) {
  (void)state;
  static const char *models[] = {"examples/mlp.gdl", "examples/tinygpt.gdl"};
  for (int m = 0; m < 2; m++) {
    char *text = tu_read(models[m]);
    Diag d;
    FeModel *fm = compile_model(models[m], text, 1, false, &d);
    assert_non_null(fm);
    if (cpu_pipeline(fm->func, 1, &d) != 0) fail_msg("%s", sb_str(&d.log));
    const IrFunc *f = fm->func;
    print_message("  %-22s arena %lld bytes (persistent %lld, peak activations %lld)\n", models[m],
                  (long long)f->arena_size, (long long)f->persist_size, (long long)(f->arena_size - f->persist_size));
    fe_model_free(fm);
    diag_free(&d);
    free(text);
  }
}

/* ------------------------------------------------------------------ */
/* The thread pool                                                     */
/* ------------------------------------------------------------------ */

typedef struct {
  atomic_int *hits;
  atomic_long calls;
} Cover;

static void cover(void *ctx, int64_t b, int64_t e) {
  Cover *c = ctx;
  for (int64_t i = b; i < e; i++) atomic_fetch_add(&c->hits[i], 1);
  atomic_fetch_add(&c->calls, 1);
}

static void test_pool_visits_every_iteration_once(void **state) {
  (void)state;
  for (int threads = 1; threads <= 4; threads++) {
    Pool *p = pool_new(threads);
    assert_int_equal(pool_size(p), threads);
    for (int64_t n = 0; n < 300; n += 37)
      for (int rep = 0; rep < 50; rep++) {
        atomic_int hits[300];
        for (int i = 0; i < 300; i++) atomic_init(&hits[i], 0);
        Cover c = {hits, 0};
        pool_run(p, n, 1 + rep % 7, cover, &c);
        for (int64_t i = 0; i < 300; i++) assert_int_equal(atomic_load(&hits[i]), i < n ? 1 : 0);
      }
    pool_free(p);
  }
}

/* A job's chunks are dealt out in contiguous shares, thread t (the caller
 * is thread 0) the t-th, and each thread starts at the front of its own:
 * every chunk here waits until every thread has begun one (2 s at most),
 * so no share is stolen before its owner starts, and the first chunks the
 * threads run are the shares' first, t c / nt for c chunks.  Run twice a
 * pool size, the second time on workers that slept. */
typedef struct {
  int gen, nt;
  atomic_int started;
  atomic_int first[16];
} Deal;

static _Thread_local int deal_seen;

static void deal(void *ctx, int64_t b, int64_t e) {
  Deal *d = ctx;
  (void)e;
  if (deal_seen != d->gen) { /* this thread's first chunk of the job */
    deal_seen = d->gen;
    atomic_store(&d->first[b], 1);
    atomic_fetch_add(&d->started, 1);
  }
  const struct timespec tick = {0, 10 * 1000};
  for (int i = 0; i < 200000 && atomic_load(&d->started) < d->nt; i++) nanosleep(&tick, NULL);
}

static void test_pool_deals_shares(void **state) {
  (void)state;
  static int gen;
  for (int threads = 2; threads <= 4; threads++) {
    Pool *p = pool_new(threads);
    for (int rep = 0; rep < 2; rep++) {
      if (rep) {
        const struct timespec asleep = {0, 5 * 1000 * 1000};
        nanosleep(&asleep, NULL);
      }
      Deal d = {.gen = ++gen, .nt = threads};
      atomic_init(&d.started, 0);
      for (int i = 0; i < 16; i++) atomic_init(&d.first[i], 0);
      int chunks = 4 * threads; /* pool_run's most: one iteration a chunk */
      pool_run(p, chunks, 1, deal, &d);
      for (int c = 0; c < chunks; c++) {
        bool share_start = false;
        for (int t = 0; t < threads; t++) share_start |= c == chunks * t / threads;
        assert_int_equal(atomic_load(&d.first[c]), share_start);
      }
    }
    pool_free(p);
  }
}

/* pool_wake rouses workers asleep since the last job; they spin a while
 * for the next one and sleep again when none comes.  Jobs after a wake,
 * after a wake that no job followed, after several wakes in a row and
 * with nobody asleep still visit every iteration once; a wake of a NULL
 * pool does nothing, and a pool frees right after a wake. */
static void test_pool_wake_keeps_jobs_whole(void **state) {
  (void)state;
  pool_wake(NULL);
  const struct timespec asleep = {0, 5 * 1000 * 1000}; /* 100 times the workers' spin */
  for (int threads = 2; threads <= 4; threads++) {
    Pool *p = pool_new(threads);
    for (int rep = 0; rep < 12; rep++) {
      nanosleep(&asleep, NULL);
      for (int w = 0; w <= rep % 3; w++) pool_wake(p);
      if (rep % 4 == 3) nanosleep(&asleep, NULL); /* woken for nothing: asleep again */
      atomic_int hits[97];
      for (int i = 0; i < 97; i++) atomic_init(&hits[i], 0);
      Cover c = {hits, 0};
      pool_run(p, 97, 3, cover, &c);
      pool_wake(p); /* right after a job: the workers are still spinning */
      for (int i = 0; i < 97; i++) assert_int_equal(atomic_load(&hits[i]), 1);
    }
    pool_wake(p);
    pool_free(p);
  }
}

/* A process pinned to some CPUs (taskset, a cpuset, mpirun's binding) gets
 * a default pool of that many threads, not one per online CPU: the mask is
 * narrowed to its first CPU and restored. */
static void test_pool_counts_the_affinity_mask(void **state) {
  (void)state;
  cpu_set_t all, one;
  assert_int_equal(sched_getaffinity(0, sizeof all, &all), 0);
  assert_int_equal(pool_ncores(), CPU_COUNT(&all));
  int first = 0;
  while (!CPU_ISSET(first, &all)) first++;
  CPU_ZERO(&one);
  CPU_SET(first, &one);
  assert_int_equal(sched_setaffinity(0, sizeof one, &one), 0);
  int narrowed = pool_ncores();
  Pool *p = pool_new(0);
  int width = pool_size(p);
  pool_free(p);
  assert_int_equal(sched_setaffinity(0, sizeof all, &all), 0);
  assert_int_equal(narrowed, 1);
  assert_int_equal(width, 1);
  assert_int_equal(pool_ncores(), CPU_COUNT(&all));
}

/* A CFS quota's text as CPUs: cgroup v2's cpu.max, v1's two files. */
static void test_pool_reads_cpu_quotas(void **state) {
  (void)state;
  assert_int_equal(pool_quota_cpus_of("max 100000\n", NULL), 0);
  assert_int_equal(pool_quota_cpus_of("150000 100000\n", NULL), 2);
  assert_int_equal(pool_quota_cpus_of("100000 100000", NULL), 1);
  assert_int_equal(pool_quota_cpus_of("50000 100000\n", NULL), 1);
  assert_int_equal(pool_quota_cpus_of("400000 50000\n", NULL), 8);
  assert_int_equal(pool_quota_cpus_of("-1\n", "100000\n"), 0);
  assert_int_equal(pool_quota_cpus_of("250000\n", "100000\n"), 3);
  assert_int_equal(pool_quota_cpus_of("200000\n", NULL), 2); /* v1 without its period file: the default 100 ms */
  assert_int_equal(pool_quota_cpus_of("200000\n", "0\n"), 0);
  assert_int_equal(pool_quota_cpus_of("lots", NULL), 0);
  assert_int_equal(pool_quota_cpus_of("", NULL), 0);
  assert_int_equal(pool_quota_cpus_of(NULL, "100000"), 0);
}

static int child_pool_cores(void) { return pool_ncores(); }

/* A process in a cgroup (v1's cpu hierarchy, where this machine lets the
 * test make one) whose parent has a one-CPU quota gets a pool of one: the
 * limit is read up the hierarchy.  Skipped where cgroups cannot be made. */
static void test_pool_follows_a_cgroup_quota(void **state) {
  (void)state;
  const char *files[] = {"cpu.cfs_period_us", "cpu.cfs_quota_us"}, *texts[] = {"100000", "100000"};
  int got = tu_in_cgroup("cpu", files, texts, 2, child_pool_cores);
  if (got == -1) return;
  assert_int_equal(got, 1);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_pool_visits_every_iteration_once),
      cmocka_unit_test(test_pool_deals_shares),
      cmocka_unit_test(test_pool_wake_keeps_jobs_whole),
      cmocka_unit_test(test_pool_counts_the_affinity_mask),
      cmocka_unit_test(test_pool_reads_cpu_quotas),
      cmocka_unit_test(test_pool_follows_a_cgroup_quota),
      cmocka_unit_test(test_exec_gemm_paths),
      cmocka_unit_test(test_exec_window_sums_in_step),
      cmocka_unit_test(test_exec_gradients_accumulate),
      cmocka_unit_test(test_exec_errors),
      cmocka_unit_test(test_exec_arena_independent_of_K),
      cmocka_unit_test(test_exec_report_example_arenas),
      cmocka_unit_test(test_exec_gradient_read_elsewhere),
      cmocka_unit_test(test_exec_every_model_matches_reference),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
