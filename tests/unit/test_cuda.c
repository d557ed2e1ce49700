/* test_cuda.c - the CUDA back end on a machine without a GPU.
 *
 * The generated kernels run under a host emulator (tests/cuda/emu.h: every
 * CUDA thread a coroutine, barriers and warp shuffles emulated): each
 * kernel of hand-built functions and of models runs on its own, its
 * inputs taken from the reference interpreter, its outputs prefilled with
 * garbage (gradient buffers with known values it must add to), and every
 * output compared with the interpreter (f32 within 1e-4 relative, f64
 * 1e-12, bf16 2e-2, f16 2e-3, integers exactly; an element's error is
 * relative to max(|want|, 1e-2 * the largest |want| of the tensor), 5e-2
 * for f32, whose sums accumulate in f32 where the interpreter's use f64), as
 * test_codegen does for the LLVM back end.  Then NVRTC (when it is
 * installed) compiles every kernel of every example and test model for
 * sm_80 and sm_90 without an error or a warning; the on-disk cache is hit
 * without an NVRTC call and survives a corrupted entry; compile errors
 * name the kernel; golden files (tests/cuda/ *.cu) hold the generated code
 * of a few representative kernels; the command line compiles for CUDA
 * without a device and refuses to run without one; and the build without
 * LLVM and BLAS (the GPU test machine's) configures and builds.
 *
 * GRADC_UPDATE_GOLDEN=1 rewrites the golden files. */
#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "codegen/cuda/cuda_gen.h"
#include "passes/passes.h"
#include "runtime/cuda/cuda.h"
#include "runtime/cpu/gemm_floor.h"
#include "runtime/runtime.h"
#include "irbuild.h"
#include "testutil.h"

#ifdef GRADC_HAVE_CUDA

/* Building functions: irbuild.h. */

static void one_kernel_per_op(IrFunc *f) {
  int g = 0;
  for (int i = 0; i < f->nops; i++) f->ops[i]->group = kp_op_group0(f->ops[i]->opcode) ? 0 : ++g;
}

/* Every value its own slot; values read by `grad` are gradient buffers. */
static void trivial_plan(IrFunc *f) {
  int64_t top = 0;
  bool *grad = calloc((size_t)f->nvalues + 1, sizeof(bool));
  for (int i = 0; i < f->nops; i++)
    if (f->ops[i]->opcode == IR_OP_GRAD) grad[f->ops[i]->args[0]->id] = true;
  for (int v = 0; v < f->nvalues; v++) {
    IrValue *x = f->values[v];
    if (x->def && x->def->opcode == IR_OP_CONST) continue;
    x->storage = grad[v] ? IR_STORE_GRAD : IR_STORE_ARENA;
    x->offset = top;
    size_t es = grad[v] ? (x->type.dtype == IR_DT_F64 ? 8 : 4) : ir_dtype_size(x->type.dtype);
    top += (ir_numel(&x->type.shape) * (int64_t)es + 63) / 64 * 64;
  }
  f->arena_size = top;
  free(grad);
}

static void run_passes(IrFunc *f, const char *const *names, int n) {
  PassManager pm;
  pm_init(&pm);
  pm.verify = true;
  Diag d;
  diag_init(&d, NULL);
  d.quiet = true;
  PassOptions o = {.gas = 1, .diag = &d, .no_inplace = true};
  int rc = pm_run(&pm, f, names, n, &o);
  if (rc != 0) fail_msg("passes failed (%d): %s", rc, sb_str(&d.log));
  diag_free(&d);
}

/* Memory that lives until the tests end (model texts and names, which
 * models and their IR locations point into), freed by main. */
static void **kept;
static int nkept, capkept;
static void *keep(void *p) {
  if (nkept == capkept) {
    capkept = capkept ? 2 * capkept : 64;
    kept = realloc(kept, sizeof *kept * (size_t)capkept);
    if (!kept) abort();
  }
  kept[nkept++] = p;
  return p;
}

static void free_kept(void) {
  for (int i = 0; i < nkept; i++) free(kept[i]);
  free(kept);
}

/* A model file through the CPU pipeline; defs: "N=V" strings, NULL-ended. */
static FeModel *load_model(const char *rel, const char *const *defs) {
  char *text = keep(tu_read(rel));
  SrcFile src = {keep(strdup(rel)), text, strlen(text)};
  const char *names[16];
  int64_t values[16];
  int nd = 0;
  for (int i = 0; defs && defs[i]; i++) {
    const char *eq = strchr(defs[i], '=');
    names[nd] = strndup(defs[i], (size_t)(eq - defs[i]));
    values[nd++] = atoll(eq + 1);
  }
  Diag d;
  diag_init(&d, NULL);
  d.quiet = true;
  FeOptions fo = {.def_names = names, .def_values = values, .ndefs = nd, .gas = 1, .dp = 1};
  FeModel *m = fe_model_compile(&src, &fo, &d);
  for (int i = 0; i < nd; i++) free((void *)names[i]);
  if (!m) fail_msg("%s: %s", rel, sb_str(&d.log));
  int n;
  const char *const *pipe = pass_pipeline_cpu(&n);
  PassManager pm;
  pm_init(&pm);
  PassOptions po = {.gas = 1, .diag = &d, .src = &src, .no_inplace = true};
  if (pm_run(&pm, m->func, pipe, n, &po) != 0) fail_msg("%s: the CPU pipeline failed: %s", rel, sb_str(&d.log));
  diag_free(&d);
  return m;
}

/* ------------------------------------------------------------------ */
/* Inputs and elements (as test_codegen.c)                             */
/* ------------------------------------------------------------------ */

typedef struct Inputs {
  double **a; /* by argument index */
  int n;
} Inputs;

static Inputs make_inputs(const IrFunc *f, uint64_t seed) {
  Inputs in = {calloc((size_t)f->nargs + 1, sizeof(double *)), f->nargs};
  StFile st;
  st_init(&st);
  rt_random_inputs(f, 1, seed, &st);
  Rng rng;
  rng_seed(&rng, seed * 7 + 1);
  for (int i = 0; i < f->nargs; i++) {
    const IrValue *a = f->args[i];
    int64_t n = ir_numel(&a->type.shape);
    in.a[i] = calloc((size_t)(n ? n : 1), sizeof(double));
    const StTensor *t = a->role == IR_ARG_INPUT ? st_find(&st, a->name) : NULL;
    for (int64_t k = 0; k < n; k++) {
      double v = rng_normal(&rng);
      if (t && t->dtype == ST_I32) v = ((const int32_t *)t->data)[k];
      if (t && t->dtype == ST_F32) v = ((const float *)t->data)[k];
      if (t && t->dtype == ST_F64) v = ((const double *)t->data)[k];
      if (a->type.dtype == IR_DT_I32 && !t) v = (double)(rng_next(&rng) % 5) - 2;
      if (a->type.dtype == IR_DT_BOOL) v = rng_next(&rng) & 1;
      in.a[i][k] = ir_round_dtype(v, a->type.dtype);
    }
  }
  st_free(&st);
  return in;
}

static void free_inputs(Inputs *in) {
  for (int i = 0; i < in->n; i++) free(in->a[i]);
  free(in->a);
}

static double *arg_data(Inputs *in, const IrFunc *f, const char *name) {
  for (int i = 0; i < f->nargs; i++)
    if (f->args[i]->name && strcmp(f->args[i]->name, name) == 0) return in->a[i];
  fail_msg("no argument %s", name);
  return NULL;
}

static uint16_t f16_bits(double v) { /* v is representable in f16 */
  uint16_t s = signbit(v) ? 0x8000 : 0;
  double a = fabs(v);
  if (isnan(v)) return 0x7e00;
  if (isinf(v)) return s | 0x7c00;
  if (a < ldexp(1.0, -14)) return s | (uint16_t)(a * ldexp(1.0, 24));
  int e;
  double m = frexp(a, &e);
  return s | (uint16_t)((e - 1 + 15) << 10) | (uint16_t)((m * 2 - 1) * 1024);
}
static double f16_value(uint16_t h) {
  int sign = h >> 15, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
  double v = exp == 0 ? ldexp(man, -24) : exp == 31 ? (man ? NAN : INFINITY) : ldexp(man | 0x400, exp - 25);
  return sign ? -v : v;
}

static size_t elem_size(const IrValue *v) {
  if (v->storage == IR_STORE_GRAD) return v->type.dtype == IR_DT_F64 ? 8 : 4;
  return ir_dtype_size(v->type.dtype);
}

static void put(char *arena, const IrValue *v, int64_t i, double x) {
  char *p = arena + v->offset + i * (int64_t)elem_size(v);
  IrDType dt = v->storage == IR_STORE_GRAD ? (v->type.dtype == IR_DT_F64 ? IR_DT_F64 : IR_DT_F32) : v->type.dtype;
  switch (dt) {
  case IR_DT_F32: {
    float y = (float)x;
    memcpy(p, &y, 4);
    break;
  }
  case IR_DT_F64: memcpy(p, &x, 8); break;
  case IR_DT_BF16: {
    float y = (float)x;
    uint32_t u;
    memcpy(&u, &y, 4);
    uint16_t h = (uint16_t)(u >> 16); /* exact: the value is a bf16 already */
    memcpy(p, &h, 2);
    break;
  }
  case IR_DT_F16: {
    uint16_t h = f16_bits(x);
    memcpy(p, &h, 2);
    break;
  }
  case IR_DT_I32: {
    int32_t y = (int32_t)x;
    memcpy(p, &y, 4);
    break;
  }
  case IR_DT_BOOL: *p = x != 0; break;
  }
}

static double get(const char *arena, const IrValue *v, int64_t i) {
  const char *p = arena + v->offset + i * (int64_t)elem_size(v);
  IrDType dt = v->storage == IR_STORE_GRAD ? (v->type.dtype == IR_DT_F64 ? IR_DT_F64 : IR_DT_F32) : v->type.dtype;
  switch (dt) {
  case IR_DT_F32: {
    float y;
    memcpy(&y, p, 4);
    return y;
  }
  case IR_DT_F64: {
    double y;
    memcpy(&y, p, 8);
    return y;
  }
  case IR_DT_BF16: {
    uint16_t h;
    memcpy(&h, p, 2);
    uint32_t u = (uint32_t)h << 16;
    float y;
    memcpy(&y, &u, 4);
    return y;
  }
  case IR_DT_F16: {
    uint16_t h;
    memcpy(&h, p, 2);
    return f16_value(h);
  }
  case IR_DT_I32: {
    int32_t y;
    memcpy(&y, p, 4);
    return y;
  }
  case IR_DT_BOOL: return *p != 0;
  }
  return 0;
}

static double tolerance(IrDType dt) {
  switch (dt) {
  case IR_DT_F32: return 1e-4; /* sums accumulate in f32 (the interpreter: f64) */
  case IR_DT_F64: return 1e-12;
  case IR_DT_BF16: return 2e-2;
  case IR_DT_F16: return 2e-3;
  case IR_DT_I32:
  case IR_DT_BOOL: return 0;
  }
  return 0;
}

static double grad_prefill(int64_t i) { return 0.5 + (double)(i % 7) * 0.25; }

typedef struct Stats {
  int kernels, outputs;
} Stats;

static void compare(const char *what, const char *kname, const IrValue *v, const char *arena, const double *want) {
  int64_t n = ir_numel(&v->type.shape);
  IrDType dt = v->type.dtype;
  double tol = tolerance(dt), big = 0;
  for (int64_t i = 0; i < n; i++)
    if (isfinite(want[i]) && fabs(want[i]) > big) big = fabs(want[i]);
  /* f32 sums accumulate in f32 (the interpreter's in f64): an element that
   * cancels gets its error relative to 5% of the tensor's largest */
  double share = dt == IR_DT_F32 ? 5e-2 : 1e-2;
  double floor = big * share > 1e-30 ? big * share : 1e-30;
  int bad = 0;
  double worst = 0;
  int64_t worst_i = -1;
  char msg[2048];
  int len = 0;
  for (int64_t i = 0; i < n; i++) {
    double w = want[i], got = get(arena, v, i);
    if (v->storage == IR_STORE_GRAD) w += grad_prefill(i);
    double err;
    if (isnan(w) || isnan(got))
      err = isnan(w) && isnan(got) ? 0 : INFINITY;
    else if (isinf(w) || isinf(got))
      err = w == got ? 0 : INFINITY;
    else
      err = fabs(got - w) / fmax(fabs(w), floor);
    bool ok = tol == 0 ? err == 0 : err < tol;
    if (err > worst || worst_i < 0) worst = err, worst_i = i;
    if (!ok && bad++ < 5 && len < (int)sizeof msg - 200)
      len += snprintf(msg + len, sizeof msg - (size_t)len, "\n  [%lld] got %.9g want %.9g (error %.3g)", (long long)i,
                      got, w, err);
  }
  if (bad)
    fail_msg("%s: kernel %s, output %%%s (%s, %lld elements): %d mismatches, largest error %.3g at [%lld] "
             "(tolerance %g):%s",
             what, kname, v->name ? v->name : "?", ir_dtype_name(dt), (long long)n, bad, worst, (long long)worst_i,
             tol, msg);
}

/* ------------------------------------------------------------------ */
/* The emulator                                                        */
/* ------------------------------------------------------------------ */

/* One function under test: its kernels, inputs and owner. */
typedef struct Case {
  const char *name;
  IrFunc *f;
  FeModel *fe;  /* owns f when it came from a model */
  Inputs in;
  CuModule *m;
} Case;

typedef void (*LaunchFn)(void (*)(void **), void **, unsigned, unsigned, unsigned);

static bool have_cxx(void) { return system("c++ --version > /dev/null 2>&1") == 0; }

/* Every case's kernels in one C++ file (functions renamed c<case>_<name>,
 * each with a trampoline emu_c<case>_<name>(void **args)), compiled and
 * loaded. */
static void *emu_build(Case *cs, int n) {
  static int serial;
  StrBuf sb;
  sb_init(&sb);
  sb_puts(&sb, "#include \"emu.h\"\n");
  sb_puts(&sb, cu_prelude);
  for (int c = 0; c < n; c++) {
    char err[2048];
    cs[c].m = cg_cuda_generate(cs[c].f, err, sizeof err);
    if (!cs[c].m) fail_msg("%s: %s", cs[c].name, err);
    const CuModule *m = cs[c].m;
    for (int k = 0; k < m->ncodes; k++) {
      const CuCode *code = &m->codes[k];
      sb_printf(&sb, "\n%s%sc%d_%s%s", code->comment, code->pre, c, code->func, code->post);
      const CuKernel *kn = &m->kernels[code->first];
      sb_printf(&sb, "extern \"C\" void emu_c%d_%s(void **a) {\n  c%d_%s(", c, code->func, c, code->func);
      for (int p = 0; p < kn->nparams; p++)
        sb_printf(&sb, "%s(%s%s *)a[%d]", p ? ", " : "", kn->params[p].out ? "" : "const ",
                  cu_mem_type(kn->params[p].v->type.dtype, kn->params[p].grad), p);
      sb_puts(&sb, ");\n}\n");
    }
  }
  char dir[256], path[512], so[512], cmd[2048];
  snprintf(dir, sizeof dir, "%s/gradc-emu-XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
  if (!mkdtemp(dir)) fail_msg("mkdtemp failed");
  snprintf(path, sizeof path, "%s/prog%d.cpp", dir, serial);
  snprintf(so, sizeof so, "%s/prog%d.so", dir, serial++);
  FILE *fp = fopen(path, "w");
  assert_non_null(fp);
  fputs(sb_str(&sb), fp);
  fclose(fp);
  sb_free(&sb);
  snprintf(cmd, sizeof cmd, "c++ -std=c++17 -O0 -w -fPIC -shared -I%s -o %s %s", tu_path("tests/cuda"), so, path);
  if (system(cmd) != 0) fail_msg("the emulated program does not compile (%s)", path);
  void *h = dlopen(so, RTLD_NOW | RTLD_LOCAL);
  if (!h) fail_msg("dlopen %s: %s", so, dlerror());
  if (!getenv("GRADC_TEST_KEEP")) {
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0) fail_msg("cannot remove %s", dir);
  } else {
    fprintf(stderr, "emulated program: %s\n", path);
  }
  return h;
}

/* Run every kernel of case c under the emulator against the interpreter. */
static void emu_release(void *so) {
  void (*release)(void) = (void (*)(void))(uintptr_t)dlsym(so, "emu_release");
  if (release) release();
  dlclose(so);
}

static Stats emu_check(const Case *cs, int c, void *so) {
  const Case *cc = &cs[c];
  IrFunc *f = cc->f;
  const CuModule *m = cc->m;
  Stats st = {0, 0};
  char err[1024];
  InterpState is = {0};
  double **wsum = calloc((size_t)f->nvalues + 1, sizeof(double *));
  bool any_wsum = false;
  for (int i = 0; i < f->nops; i++) any_wsum |= f->ops[i]->opcode == IR_OP_WINDOW_SUM;
  if (any_wsum) {
    if (!interp_run(&is, f, cc->in.a, NULL, INTERP_COUNT, NULL, err, sizeof err))
      fail_msg("%s: interp count: %s", cc->name, err);
    for (int i = 0; i < f->nops; i++) {
      const IrOp *op = f->ops[i];
      if (op->opcode != IR_OP_WINDOW_SUM) continue;
      int64_t n = ir_numel(&op->result->type.shape);
      wsum[op->result->id] = calloc((size_t)(n ? n : 1), sizeof(double));
      memcpy(wsum[op->result->id], is.val[op->args[0]->id], sizeof(double) * (size_t)n);
    }
    interp_free(&is);
  }
  if (!interp_run(&is, f, cc->in.a, wsum, INTERP_STEP, NULL, err, sizeof err)) fail_msg("%s: interp: %s", cc->name, err);
  LaunchFn launch = (LaunchFn)(uintptr_t)dlsym(so, "emu_launch");
  assert_non_null(launch);
  size_t asz = (size_t)(f->arena_size > 0 ? f->arena_size : 64);
  char *arena = aligned_alloc(64, (asz + 63) / 64 * 64);
  assert_non_null(arena);
  memset(arena, 0xff, asz);
  bool *is_out = calloc((size_t)f->nvalues + 1, sizeof(bool));
  for (int kk = 0; kk < m->nkernels; kk++) {
    const CuKernel *k = &m->kernels[kk];
    int g = k->group;
    IrOp **ops = k->ops;
    int nops = k->nops;
    for (int q = 0; q < nops; q++) {
      const IrOp *op = ops[q];
      for (int a = 0; a < op->nargs; a++) {
        const IrValue *v = op->args[a];
        if (v->def && (v->def->group == g || (v->def->group == 0 && v->def->opcode == IR_OP_CONST))) continue;
        if (v->storage == IR_STORE_NONE) continue;
        int64_t n = ir_numel(&v->type.shape);
        for (int64_t e = 0; e < n; e++) put(arena, v, e, is.val[v->id][e]);
      }
    }
    memset(is_out, 0, (size_t)f->nvalues + 1);
    for (int q = 0; q < f->nops; q++) {
      const IrOp *op = f->ops[q];
      if (op->group == g) continue;
      for (int a = 0; a < op->nargs; a++)
        if (op->args[a]->def && op->args[a]->def->group == g) is_out[op->args[a]->id] = true;
    }
    for (int q = 0; q < nops; q++) {
      const IrValue *v = ops[q]->result;
      if (v && v->storage == IR_STORE_NONE) is_out[v->id] = false; /* nothing reads it in a step */
      if (!v || !is_out[v->id]) continue;
      int64_t n = ir_numel(&v->type.shape);
      if (v->storage == IR_STORE_GRAD)
        for (int64_t e = 0; e < n; e++) put(arena, v, e, grad_prefill(e));
      else
        memset(arena + v->offset, 0xff, (size_t)n * elem_size(v));
    }
    if (k->code < 0) continue;
    char sym[256];
    snprintf(sym, sizeof sym, "emu_c%d_%s", c, m->codes[k->code].func);
    void (*tramp)(void **) = (void (*)(void **))(uintptr_t)dlsym(so, sym);
    if (!tramp) fail_msg("%s: no %s", cc->name, sym);
    void **args = calloc((size_t)k->nparams + 1, sizeof(void *));
    for (int p = 0; p < k->nparams; p++) {
      const CuParam *q = &k->params[p];
      size_t es = q->grad ? (q->v->type.dtype == IR_DT_F64 ? 8 : 4) : ir_dtype_size(q->v->type.dtype);
      args[p] = arena + q->v->offset + (size_t)q->elem * es;
    }
    if (getenv("GRADC_TEST_TRACE")) fprintf(stderr, "%s: running %s\n", cc->name, k->name);
    launch(tramp, args, (unsigned)k->grid, k->block[0], k->block[1]);
    free(args);
    for (int q = 0; q < nops; q++) {
      const IrValue *v = ops[q]->result;
      if (!v || !is_out[v->id]) continue;
      if (v->storage != IR_STORE_GRAD) {
        compare(cc->name, k->name, v, arena, is.val[v->id]);
        st.outputs++;
        continue;
      }
      /* contributions accumulating into one gradient buffer: against their sum */
      bool first = true;
      for (int r = 0; r < q; r++) {
        const IrValue *w = ops[r]->result;
        first &= !(w && is_out[w->id] && w->storage == IR_STORE_GRAD && w->offset == v->offset);
      }
      if (!first) continue;
      int64_t n = ir_numel(&v->type.shape);
      double *sum = calloc((size_t)(n ? n : 1), sizeof(double));
      for (int r = q; r < nops; r++) {
        const IrValue *w = ops[r]->result;
        if (!w || !is_out[w->id] || w->storage != IR_STORE_GRAD || w->offset != v->offset) continue;
        for (int64_t e = 0; e < n; e++) sum[e] += is.val[w->id][e];
      }
      compare(cc->name, k->name, v, arena, sum);
      st.outputs++;
      free(sum);
    }
    st.kernels++;
  }
  free(is_out);
  free(arena);
  interp_free(&is);
  for (int v = 0; v < f->nvalues; v++) free(wsum[v]);
  free(wsum);
  return st;
}

static void free_cases(Case *cs, int n) {
  for (int c = 0; c < n; c++) {
    cg_cuda_free(cs[c].m);
    free_inputs(&cs[c].in);
    if (cs[c].fe)
      fe_model_free(cs[c].fe);
    else
      ir_func_free(cs[c].f);
  }
}

/* A hand-built function: one kernel per op, or `fuse`; the trivial plan. */
static Case built(const char *name, IrFunc *f, bool fuse, uint64_t seed) {
  if (fuse) {
    static const char *const p[] = {"fuse"};
    run_passes(f, p, 1);
  } else {
    one_kernel_per_op(f);
  }
  char err[512];
  if (!ir_verify(f, err, sizeof err)) fail_msg("%s: verify: %s", name, err);
  trivial_plan(f);
  Case c = {name, f, NULL, make_inputs(f, seed), NULL};
  return c;
}

static Case model(const char *rel, const char *const *defs, uint64_t seed) {
  FeModel *fe = load_model(rel, defs);
  Case c = {rel, fe->func, fe, make_inputs(fe->func, seed), NULL};
  return c;
}

/* ------------------------------------------------------------------ */
/* Hand-built functions                                                */
/* ------------------------------------------------------------------ */

static IrFunc *elementwise_ops(IrDType dt) {
  IrFunc *f = ir_func_new("ew");
  IrValue *x = input(f, "x", ty(dt, 2, 5, 37));
  IrValue *y = input(f, "y", ty(dt, 2, 5, 37));
  IrValue *row = input(f, "row", ty(dt, 1, 37));
  IrValue *col = input(f, "col", ty(dt, 2, 5, 1));
  IrValue *pos = bin(f, IR_OP_ADD, un(f, IR_OP_ABS, x), cnst(f, 0.25, ty(dt, 0)));
  static const IrOpcode unary[] = {IR_OP_NEG,  IR_OP_EXP,  IR_OP_TANH, IR_OP_SIGMOID, IR_OP_RELU,
                                   IR_OP_GELU, IR_OP_SILU, IR_OP_ABS,  IR_OP_SIGN,    IR_OP_GELU_GRAD,
                                   IR_OP_DETACH};
  for (size_t i = 0; i < sizeof unary / sizeof unary[0]; i++) sink(f, un(f, unary[i], x));
  sink(f, un(f, IR_OP_LOG, pos));
  sink(f, un(f, IR_OP_SQRT, pos));
  sink(f, un(f, IR_OP_RSQRT, pos));
  static const double exps[] = {2.0, 3.0, 0.5, -1.5, 1.0};
  for (size_t i = 0; i < sizeof exps / sizeof exps[0]; i++)
    sink(f, un1(f, IR_OP_POW, pos, ir_attr_float("exponent", exps[i])));
  static const IrOpcode binary[] = {IR_OP_ADD, IR_OP_SUB, IR_OP_MUL, IR_OP_DIV, IR_OP_MAXIMUM, IR_OP_MINIMUM};
  for (size_t i = 0; i < sizeof binary / sizeof binary[0]; i++) {
    sink(f, bin(f, binary[i], x, y));
    sink(f, bin(f, binary[i], x, row));
    sink(f, bin(f, binary[i], col, y));
    sink(f, bin(f, binary[i], col, row));
  }
  static const IrOpcode cmp[] = {IR_OP_EQ, IR_OP_NE, IR_OP_LT, IR_OP_LE, IR_OP_GT, IR_OP_GE};
  IrValue *xr = un(f, IR_OP_SIGN, x); /* many ties */
  for (size_t i = 0; i < sizeof cmp / sizeof cmp[0]; i++) {
    sink(f, bin(f, cmp[i], x, y));
    sink(f, bin(f, cmp[i], xr, row));
  }
  IrValue *c = bin(f, IR_OP_GT, x, y);
  sink(f, build(f, IR_OP_SELECT, (IrValue *[]){c, x, row}, 3, NULL, 0, NULL));
  IrAttr bs = ir_attr_ints("shape", (int64_t[]){3, 5, 37}, 3);
  sink(f, build(f, IR_OP_BROADCAST, &row, 1, &bs, 1, NULL));
  IrAttr none = ir_attr_str("reduction", "none"), mean = ir_attr_str("reduction", "mean");
  IrAttr sum = ir_attr_str("reduction", "sum");
  sink(f, build(f, IR_OP_MSE_LOSS, (IrValue *[]){x, y}, 2, &none, 1, NULL));
  sink(f, build(f, IR_OP_MSE_LOSS, (IrValue *[]){x, y}, 2, &mean, 1, NULL));
  sink(f, build(f, IR_OP_MSE_LOSS, (IrValue *[]){x, y}, 2, &sum, 1, NULL));
  IrDType other = dt == IR_DT_F32 ? IR_DT_F64 : IR_DT_F32;
  IrValue *scaled = bin(f, IR_OP_MUL, x, cnst(f, 3.0, ty(dt, 0)));
  sink(f, cast(f, scaled, IR_DT_I32));
  sink(f, cast(f, x, other));
  sink(f, cast(f, c, dt));
  sink(f, cast(f, cast(f, scaled, IR_DT_I32), dt));
  sink(f, cast(f, xr, IR_DT_BOOL));
  IrValue *s = input(f, "s", ty(dt, 0));
  IrValue *gs = un1(f, IR_OP_GRAD_SEED, s, ir_attr_float("coef", 0.1));
  sink(f, gs);
  sink(f, bin(f, IR_OP_LOSS_TERM, s, gs));
  return f;
}

static IrFunc *int_ops(void) {
  IrFunc *f = ir_func_new("ints");
  IrValue *a = input(f, "a", ty(IR_DT_I32, 2, 4, 9));
  IrValue *b = input(f, "b", ty(IR_DT_I32, 2, 4, 9));
  IrValue *p = input(f, "p", ty(IR_DT_BOOL, 2, 4, 9));
  static const IrOpcode ops[] = {IR_OP_ADD, IR_OP_SUB, IR_OP_MUL, IR_OP_DIV, IR_OP_MAXIMUM, IR_OP_MINIMUM,
                                 IR_OP_EQ,  IR_OP_NE,  IR_OP_LT,  IR_OP_LE,  IR_OP_GT,      IR_OP_GE};
  for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++) sink(f, bin(f, ops[i], a, b));
  sink(f, un(f, IR_OP_NEG, a));
  sink(f, un(f, IR_OP_ABS, a));
  sink(f, un(f, IR_OP_SIGN, a));
  sink(f, cast(f, a, IR_DT_BOOL));
  sink(f, cast(f, p, IR_DT_I32));
  sink(f, bin(f, IR_OP_NE, p, cast(f, a, IR_DT_BOOL)));
  sink(f, build(f, IR_OP_SELECT, (IrValue *[]){p, a, b}, 3, NULL, 0, NULL));
  int64_t last = 1, first = 0;
  sink(f, reduce(f, IR_OP_SUM, a, &last, 1, false));
  sink(f, reduce(f, IR_OP_SUM, a, &first, 1, false));
  return f;
}

static IrFunc *special_values(void) {
  IrFunc *f = ir_func_new("special");
  IrValue *x = input(f, "x", ty(IR_DT_F32, 2, 3, 8));
  IrValue *y = input(f, "y", ty(IR_DT_F32, 2, 3, 8));
  static const IrOpcode ops[] = {IR_OP_RELU, IR_OP_SIGN, IR_OP_SIGMOID, IR_OP_TANH, IR_OP_EXP, IR_OP_GELU};
  for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++) sink(f, un(f, ops[i], x));
  sink(f, bin(f, IR_OP_MAXIMUM, x, y));
  sink(f, bin(f, IR_OP_MINIMUM, x, y));
  sink(f, bin(f, IR_OP_NE, x, y));
  sink(f, cast(f, x, IR_DT_BOOL));
  int64_t last = 1, first = 0;
  sink(f, reduce(f, IR_OP_MAX, x, &last, 1, true));
  sink(f, reduce(f, IR_OP_LOGSUMEXP, x, &last, 1, true));
  sink(f, reduce(f, IR_OP_LOGSUMEXP, x, &first, 1, true));
  sink(f, un1(f, IR_OP_SOFTMAX, x, ir_attr_int("axis", -1)));
  return f;
}

static void special_inputs(Case *c) {
  double *xv = arg_data(&c->in, c->f, "x");
  /* row 0: a NaN; row 1: +inf and -inf; row 2: all -inf */
  xv[2] = NAN;
  xv[8 + 1] = INFINITY;
  xv[8 + 5] = -INFINITY;
  for (int i = 16; i < 24; i++) xv[i] = -INFINITY;
  xv[3] = 1e30;
  xv[4] = -1e30;
}

static IrFunc *reductions(IrDType dt) {
  IrFunc *f = ir_func_new("red");
  IrValue *x = input(f, "x", ty(dt, 3, 3, 4, 45));
  IrValue *v = input(f, "v", ty(dt, 1, 7));
  IrValue *w = input(f, "w", ty(dt, 2, 5, 1100)); /* rows longer than a block */
  static const IrOpcode ops[] = {IR_OP_SUM, IR_OP_MEAN, IR_OP_MAX, IR_OP_LOGSUMEXP};
  static const int64_t axsets[][3] = {{2}, {-1}, {0}, {1}, {0, 1}, {0, 2}, {1, 2}, {0, 1, 2}};
  static const int naxes[] = {1, 1, 1, 1, 2, 2, 2, 3};
  for (size_t o = 0; o < 4; o++) {
    for (size_t k = 0; k < sizeof naxes / sizeof naxes[0]; k++) {
      sink(f, reduce(f, ops[o], x, axsets[k], naxes[k], true));
      sink(f, reduce(f, ops[o], x, axsets[k], naxes[k], false));
    }
    sink(f, reduce(f, ops[o], x, NULL, 0, false));
    sink(f, reduce(f, ops[o], v, NULL, 0, true));
  }
  int64_t last = 2, one = 1, zero = 0;
  IrValue *m = reduce(f, IR_OP_MAX, x, &last, 1, true);
  IrValue *e = un(f, IR_OP_EXP, bin(f, IR_OP_SUB, x, m));
  sink(f, bin(f, IR_OP_DIV, e, reduce(f, IR_OP_SUM, e, &last, 1, true)));
  sink(f, reduce(f, IR_OP_SUM, w, &one, 1, true));
  sink(f, reduce(f, IR_OP_LOGSUMEXP, w, &one, 1, false));
  sink(f, reduce(f, IR_OP_SUM, w, &zero, 1, false));
  return f;
}

static IrFunc *nn_ops(IrDType dt) {
  IrFunc *f = ir_func_new("nn");
  IrValue *x = input(f, "x", ty(dt, 3, 2, 6, 21));
  IrValue *w = param(f, "w", ty(dt, 1, 21));
  IrValue *b = param(f, "b", ty(dt, 1, 21));
  IrValue *sq = input(f, "sq", ty(dt, 3, 2, 6, 6));
  IrValue *wide = input(f, "wide", ty(dt, 2, 3, 300));
  for (int axis = -1; axis >= -3; axis--) {
    sink(f, un1(f, IR_OP_SOFTMAX, x, ir_attr_int("axis", axis)));
    sink(f, un1(f, IR_OP_LOG_SOFTMAX, x, ir_attr_int("axis", axis)));
  }
  IrAttr eps = ir_attr_float("eps", 1e-5), eps6 = ir_attr_float("eps", 1e-6);
  sink(f, build(f, IR_OP_LAYER_NORM, (IrValue *[]){x, w, b}, 3, &eps, 1, NULL));
  sink(f, build(f, IR_OP_RMS_NORM, (IrValue *[]){x, w}, 2, &eps6, 1, NULL));
  sink(f, un(f, IR_OP_CAUSAL_MASK, sq));
  sink(f, un(f, IR_OP_CAUSAL_MASK, x));
  sink(f, un1(f, IR_OP_SOFTMAX, wide, ir_attr_int("axis", -1)));
  return f;
}

static IrFunc *indexed_ops(IrDType dt) {
  IrFunc *f = ir_func_new("idx");
  IrValue *logits = input(f, "logits", ty(dt, 3, 2, 5, 13));
  IrValue *t = input(f, "t", ty(IR_DT_I32, 2, 2, 5));
  IrValue *ids = input(f, "ids", ty(IR_DT_I32, 2, 2, 5));
  IrValue *table = param(f, "table", ty(dt, 2, 11, 24));
  IrValue *dy = input(f, "dy", ty(dt, 3, 2, 5, 24));
  static const char *const reds[] = {"none", "sum", "mean"};
  for (int r = 0; r < 3; r++) {
    IrAttr a[2] = {ir_attr_int("ignore_index", -100), ir_attr_str("reduction", reds[r])};
    sink(f, build(f, IR_OP_CROSS_ENTROPY, (IrValue *[]){logits, t}, 2, a, 2, NULL));
  }
  IrAttr oa[2] = {ir_attr_int("depth", 13), ir_attr_int("ignore_index", -100)};
  IrType oht = ty(dt, 3, 2, 5, 13);
  sink(f, build(f, IR_OP_ONE_HOT, &t, 1, oa, 2, &oht));
  sink(f, build(f, IR_OP_EMBEDDING, (IrValue *[]){ids, table}, 2, NULL, 0, NULL));
  IrAttr ra = ir_attr_int("rows", 11);
  sink(f, build(f, IR_OP_EMBEDDING_GRAD, (IrValue *[]){ids, dy}, 2, &ra, 1, NULL));
  return f;
}

static void indexed_inputs(Case *c) {
  double *tv = arg_data(&c->in, c->f, "t"), *iv = arg_data(&c->in, c->f, "ids");
  for (int i = 0; i < 10; i++) {
    tv[i] = i % 4 == 1 ? -100 : (i * 5) % 13;
    iv[i] = (i * 7) % 11; /* repeated rows in the scatter */
  }
  iv[9] = iv[0];
}

static IrFunc *movement(void) {
  IrFunc *f = ir_func_new("move");
  IrValue *x = input(f, "x", ty(IR_DT_F32, 3, 3, 4, 5));
  IrValue *z = input(f, "z", ty(IR_DT_F32, 3, 3, 2, 5));
  IrValue *w = input(f, "w", ty(IR_DT_F32, 3, 3, 4, 2));
  IrValue *big = input(f, "big", ty(IR_DT_F32, 3, 2, 70, 45));
  static const int64_t perms[][3] = {{0, 2, 1}, {2, 0, 1}, {1, 0, 2}, {2, 1, 0}, {0, 1, 2}};
  for (int i = 0; i < 5; i++) sink(f, un1(f, IR_OP_PERMUTE, x, ir_attr_ints("perm", perms[i], 3)));
  for (int i = 0; i < 5; i++) sink(f, un1(f, IR_OP_PERMUTE, big, ir_attr_ints("perm", perms[i], 3)));
  static const int64_t st[][3] = {{0, 1, 0}, {2, 0, 4}, {1, 0, 1}, {0, 2, 0}};
  static const int64_t sp[][3] = {{3, 3, 5}, {3, 4, 5}, {3, 4, 5}, {3, 3, 5}};
  static const int64_t ss[][3] = {{1, 1, 2}, {1, 2, 2}, {2, 3, 1}, {2, 1, 3}};
  for (int i = 0; i < 4; i++) {
    IrAttr a[3] = {ir_attr_ints("starts", st[i], 3), ir_attr_ints("stops", sp[i], 3), ir_attr_ints("steps", ss[i], 3)};
    IrValue *s = build(f, IR_OP_SLICE, &x, 1, a, 3, NULL);
    sink(f, s);
    IrAttr b[4] = {a[0], a[1], a[2], ir_attr_ints("shape", x->type.shape.dim, 3)};
    sink(f, build(f, IR_OP_UNSLICE, &s, 1, b, 4, NULL));
  }
  sink(f, build(f, IR_OP_CONCAT, (IrValue *[]){x, z, x}, 3, (IrAttr[]){ir_attr_int("axis", 1)}, 1, NULL));
  sink(f, build(f, IR_OP_CONCAT, (IrValue *[]){w, x}, 2, (IrAttr[]){ir_attr_int("axis", -1)}, 1, NULL));
  sink(f, build(f, IR_OP_CONCAT, (IrValue *[]){x, x}, 2, (IrAttr[]){ir_attr_int("axis", 0)}, 1, NULL));
  return f;
}

static IrFunc *grad_buffers(void) {
  IrFunc *f = ir_func_new("grads");
  IrValue *x = input(f, "x", ty(IR_DT_F32, 2, 6, 10));
  IrValue *W = param(f, "W", ty(IR_DT_F32, 2, 6, 10));
  param(f, "b", ty(IR_DT_F32, 1, 10));
  IrValue *V = param(f, "V", ty(IR_DT_F64, 2, 3, 4));
  IrValue *dW = bin(f, IR_OP_MUL, un(f, IR_OP_TANH, x), W);
  IrAttr g1 = ir_attr_str("name", "W"), g2 = ir_attr_str("name", "b"), g3 = ir_attr_str("name", "V");
  build(f, IR_OP_GRAD, &dW, 1, &g1, 1, NULL);
  int64_t a0 = 0;
  IrValue *db = reduce(f, IR_OP_SUM, x, &a0, 1, false);
  build(f, IR_OP_GRAD, &db, 1, &g2, 1, NULL);
  IrValue *dV = un1(f, IR_OP_PERMUTE, un1(f, IR_OP_PERMUTE, V, ir_attr_ints("perm", (int64_t[]){1, 0}, 2)),
                    ir_attr_ints("perm", (int64_t[]){1, 0}, 2));
  build(f, IR_OP_GRAD, &dV, 1, &g3, 1, NULL);
  return f;
}

static IrFunc *low_precision(IrDType dt) {
  IrFunc *f = ir_func_new(dt == IR_DT_BF16 ? "bf16" : "f16");
  IrValue *x = input(f, "x", ty(dt, 2, 4, 33));
  IrValue *y = input(f, "y", ty(dt, 2, 4, 33));
  sink(f, bin(f, IR_OP_ADD, x, y));
  sink(f, bin(f, IR_OP_MUL, x, y));
  sink(f, un(f, IR_OP_EXP, x));
  sink(f, un(f, IR_OP_GELU, x));
  sink(f, cast(f, x, IR_DT_F32));
  sink(f, cast(f, cast(f, x, IR_DT_F32), dt));
  int64_t last = 1;
  sink(f, reduce(f, IR_OP_SUM, x, &last, 1, true));
  sink(f, un1(f, IR_OP_SOFTMAX, x, ir_attr_int("axis", -1)));
  return f;
}

static void low_precision_inputs(Case *c) {
  double *xv = arg_data(&c->in, c->f, "x");
  IrDType dt = c->f->args[0]->type.dtype;
  xv[0] = 1e-7;  /* an f16 subnormal */
  xv[1] = 70000; /* beyond f16's range */
  xv[2] = -3e-6;
  for (int i = 0; i < 3; i++) xv[i] = ir_round_dtype(xv[i], dt);
}

static void test_cuda_emulated_ops(void **state) {
  if (!have_cxx()) {
    fprintf(stderr, "skipped: no C++ compiler for the emulator\n");
    skip();
  }
  Case cs[20];
  int n = 0;
  cs[n++] = built("elementwise f32", elementwise_ops(IR_DT_F32), false, 11);
  cs[n++] = built("elementwise f64", elementwise_ops(IR_DT_F64), false, 12);
  cs[n++] = built("elementwise f32 fused", elementwise_ops(IR_DT_F32), true, 13);
  cs[n++] = built("i32 and bool", int_ops(), false, 5);
  double *bv = arg_data(&cs[n - 1].in, cs[n - 1].f, "b");
  for (int i = 0; i < 36; i++)
    if (bv[i] == 0) bv[i] = i % 2 ? 3 : -1;
  bv[0] = -1;
  arg_data(&cs[n - 1].in, cs[n - 1].f, "a")[0] = -7;
  cs[n++] = built("special values", special_values(), false, 3);
  special_inputs(&cs[n - 1]);
  cs[n++] = built("reductions f32", reductions(IR_DT_F32), false, 21);
  cs[n++] = built("reductions f64", reductions(IR_DT_F64), false, 22);
  cs[n++] = built("reductions fused", reductions(IR_DT_F32), true, 23);
  cs[n++] = built("nn f32", nn_ops(IR_DT_F32), false, 31);
  cs[n++] = built("nn f64", nn_ops(IR_DT_F64), false, 32);
  cs[n++] = built("nn fused", nn_ops(IR_DT_F32), true, 33);
  cs[n++] = built("indexed f32", indexed_ops(IR_DT_F32), false, 41);
  indexed_inputs(&cs[n - 1]);
  cs[n++] = built("indexed fused", indexed_ops(IR_DT_F32), true, 42);
  indexed_inputs(&cs[n - 1]);
  cs[n++] = built("movement", movement(), false, 51);
  cs[n++] = built("gradient buffers", grad_buffers(), true, 61);
  cs[n++] = built("bf16", low_precision(IR_DT_BF16), false, 71);
  low_precision_inputs(&cs[n - 1]);
  cs[n++] = built("f16", low_precision(IR_DT_F16), false, 72);
  low_precision_inputs(&cs[n - 1]);
  void *so = emu_build(cs, n);
  int outputs = 0;
  for (int c = 0; c < n; c++) {
    double t0 = rt_now_ms();
    outputs += emu_check(cs, c, so).outputs;
    if (getenv("GRADC_TEST_TIME")) fprintf(stderr, "%s: %.0f ms\n", cs[c].name, rt_now_ms() - t0);
  }
  assert_true(outputs >= 400);
  emu_release(so);
  free_cases(cs, n);
}

/* ------------------------------------------------------------------ */
/* Models through the CPU pipeline (fuse and memplan included)          */
/* ------------------------------------------------------------------ */

static void ignore_some_targets(Case *c) {
  const IrFunc *f = c->f;
  for (int i = 0; i < f->nargs; i++) {
    const char *n = f->args[i]->name;
    if (f->args[i]->type.dtype != IR_DT_I32 || !n || (strcmp(n, "y") != 0 && strcmp(n, "targets") != 0)) continue;
    int64_t cnt = ir_numel(&f->args[i]->type.shape);
    for (int64_t k = 0; k < cnt; k += 3) c->in.a[i][k] = -100;
  }
}

static void test_cuda_emulated_models(void **state) {
  if (!have_cxx()) {
    fprintf(stderr, "skipped: no C++ compiler for the emulator\n");
    skip();
  }
  static const char *const tiny[] = {"B=2", "T=8", "C=32", "NH=2", "L=2", "V=40", NULL};
  static const char *const torchref[] = {"norms", "softmax_axes", "reductions", "ce_variants", "shape_ops",
                                         "concat_index", "embedding_tied", "f64_model", "attention", "max_ties",
                                         "mse_variants", "minmax", "unary_a", "unary_b", "pow_prec",
                                         "reshape_merge_batch", "matmul_vec", "detach", "batch_affine",
                                         "tinygpt_block", "stacked_for", "param_axis0", "dims_values"};
  enum { NT = sizeof torchref / sizeof torchref[0] };
  Case cs[NT + 8];
  int n = 0;
  cs[n++] = model("examples/mlp.gdl", NULL, 86);
  ignore_some_targets(&cs[n - 1]);
  cs[n++] = model("examples/tinygpt.gdl", tiny, 87);
  ignore_some_targets(&cs[n - 1]);
  cs[n++] = model("examples/multitask.gdl", NULL, 88);
  cs[n++] = model("tests/cuda/layernorm.gdl", NULL, 89);
  cs[n++] = model("tests/cuda/cross_entropy.gdl", NULL, 90);
  ignore_some_targets(&cs[n - 1]);
  cs[n++] = model("tests/cuda/lowp.gdl", NULL, 91);
  for (int i = 0; i < NT; i++) {
    char rel[256];
    snprintf(rel, sizeof rel, "tests/torchref/cases/%s.gdl", torchref[i]);
    cs[n++] = model(keep(strdup(rel)), NULL, 100 + (uint64_t)i);
  }
  void *so = emu_build(cs, n);
  int kernels = 0;
  for (int c = 0; c < n; c++) kernels += emu_check(cs, c, so).kernels;
  assert_true(kernels >= 200);
  emu_release(so);
  free_cases(cs, n);
}

/* ------------------------------------------------------------------ */
/* GEMMs: what cuBLASLt is handed, executed on the host                 */
/* ------------------------------------------------------------------ */

static const IrValue *root_of(const IrValue *v) {
  while (v->storage == IR_STORE_ALIAS && v->def && v->def->opcode == IR_OP_RESHAPE) v = v->def->args[0];
  return v;
}

/* Element i of a cuBLASLt matrix of cudaDataType t at byte offset off. */
static double lt_get(const char *arena, int t, int64_t off, int64_t i) {
  switch (t) {
  case 0: return ((const float *)(arena + off))[i];
  case 1: return ((const double *)(arena + off))[i];
  case 2: return f16_value(((const uint16_t *)(arena + off))[i]);
  default: {
    uint32_t u = (uint32_t)((const uint16_t *)(arena + off))[i] << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
  }
  }
}

static size_t lt_size(int t) { return t == 1 ? 8 : t == 0 ? 4 : 2; }

/* cublasLtMatmul as documented: D = alpha op(A) op(B) + beta C, column-major. */
static void lt_emulate(const CudaGemmDesc *d, char *arena) {
  size_t ei = lt_size(d->in), eo = lt_size(d->out);
  for (int64_t t = 0; t < d->calls; t++)
    for (int64_t bt = 0; bt < d->batch; bt++) {
      int64_t a = d->aoff[t] + bt * d->a.stride * (int64_t)ei;
      int64_t b = d->boff[t] + bt * d->b.stride * (int64_t)ei;
      int64_t c = d->coff[t] + bt * d->c.stride * (int64_t)eo;
      for (int64_t i = 0; i < d->m; i++)
        for (int64_t j = 0; j < d->n; j++) {
          double sum = 0;
          for (int64_t p = 0; p < d->k; p++) {
            double x = lt_get(arena, d->in, a, d->opa ? p + i * d->a.ld : i + p * d->a.ld);
            double y = lt_get(arena, d->in, b, d->opb ? j + p * d->b.ld : p + j * d->b.ld);
            sum += x * y;
          }
          int64_t ci = i + j * d->c.ld;
          if (d->accumulate) sum += lt_get(arena, d->out, c, ci);
          if (d->out == 1)
            ((double *)(arena + c))[ci] = sum;
          else if (d->out == 0)
            ((float *)(arena + c))[ci] = (float)sum;
          else { /* bf16, f16 results: rounded as the interpreter rounds */
            IrDType dt = d->out == 2 ? IR_DT_F16 : IR_DT_BF16;
            double r = ir_round_dtype(sum, dt);
            uint16_t h;
            if (dt == IR_DT_F16) {
              h = f16_bits(r);
            } else {
              float f = (float)r;
              uint32_t u;
              memcpy(&u, &f, 4);
              h = (uint16_t)(u >> 16);
            }
            ((uint16_t *)(arena + c))[ci] = h;
          }
        }
    }
}

static bool group0(const IrOp *op, void *ctx) {
  (void)ctx;
  return op->group == 0;
}

/* A transpose left in group 0 without storage: a GEMM flag (bf16, f16). */
static const IrValue *packed_root(const IrValue *v) {
  if (v->def && v->def->group == 0 && v->def->opcode == IR_OP_PERMUTE && v->storage == IR_STORE_NONE)
    v = v->def->args[0];
  return root_of(v);
}

/* Element e (row-major over v's shape) of view w: its index in w's root. */
static int64_t view_index(const KpView *w, const IrValue *v, int64_t e) {
  int64_t off = w->offset;
  const IrShape *s = &v->type.shape;
  for (int k = s->rank - 1; k >= 0; k--) {
    off += (e % s->dim[k]) * (k < w->shape.rank ? w->stride[k] : 0);
    e /= s->dim[k];
  }
  return off;
}

/* Every GEMM of a model: its cuBLASLt description run on the host against
 * the interpreter's matmul (batched, broadcast, transposed operands, views
 * of q, k, v in qkv and heads written into [B, T, C], f64, bf16,
 * accumulation into gradient buffers). */
static int check_gemms(const char *rel, const char *const *defs, uint64_t seed) {
  FeModel *fe = load_model(rel, defs);
  IrFunc *f = fe->func;
  Inputs in = make_inputs(f, seed);
  char err[1024];
  InterpState is = {0};
  double **wsum = calloc((size_t)f->nvalues + 1, sizeof(double *));
  bool any_wsum = false;
  for (int i = 0; i < f->nops; i++) any_wsum |= f->ops[i]->opcode == IR_OP_WINDOW_SUM;
  if (any_wsum) {
    if (!interp_run(&is, f, in.a, NULL, INTERP_COUNT, NULL, err, sizeof err)) fail_msg("%s: %s", rel, err);
    for (int i = 0; i < f->nops; i++) {
      const IrOp *op = f->ops[i];
      if (op->opcode != IR_OP_WINDOW_SUM) continue;
      int64_t n = ir_numel(&op->result->type.shape);
      wsum[op->result->id] = calloc((size_t)(n ? n : 1), sizeof(double));
      memcpy(wsum[op->result->id], is.val[op->args[0]->id], sizeof(double) * (size_t)n);
    }
    interp_free(&is);
  }
  if (!interp_run(&is, f, in.a, wsum, INTERP_STEP, NULL, err, sizeof err)) fail_msg("%s: %s", rel, err);
  char *arena = calloc((size_t)f->arena_size + 64, 1);
  KpViews vs;
  kp_views_find(f, group0, NULL, &vs);
  int ng = 0;
  for (int i = 0; i < f->nops; i++) {
    const IrOp *op = f->ops[i];
    if (op->opcode != IR_OP_MATMUL || op->group != 0) continue;
    ng++;
    CudaGemmDesc d;
    if (!cuda_gemm_describe(&vs, op, false, &d, err, sizeof err)) fail_msg("%s: %s", rel, err);
    bool views = op->result->type.dtype == IR_DT_F32 || op->result->type.dtype == IR_DT_F64;
    KpView va, vb, vc;
    if (views) {
      assert_true(kp_view_in(&vs, op->args[0], &va) && kp_view_in(&vs, op->args[1], &vb) &&
                  kp_view_out(&vs, op->result, &vc));
    } else {
      kp_view_whole(packed_root(op->args[0]), &va);
      kp_view_whole(packed_root(op->args[1]), &vb);
      kp_view_whole(root_of(op->result), &vc);
    }
    const IrValue *ra = root_of(va.root), *rb = root_of(vb.root), *rc = root_of(vc.root);
    for (int64_t e = 0; e < ir_numel(&ra->type.shape); e++) put(arena, ra, e, is.val[ra->id][e]);
    for (int64_t e = 0; e < ir_numel(&rb->type.shape); e++) put(arena, rb, e, is.val[rb->id][e]);
    /* the result's elements, where the GEMM writes them: NaN, or the
     * gradient buffer's prefill */
    const IrValue *y = op->result;
    int64_t ny = ir_numel(&y->type.shape);
    for (int64_t e = 0; e < ny; e++)
      put(arena, rc, view_index(&vc, y, e), rc->storage == IR_STORE_GRAD ? grad_prefill(e) : NAN);
    lt_emulate(&d, arena);
    double *want = calloc((size_t)ny + 1, sizeof(double)), *got = calloc((size_t)ny + 1, sizeof(double));
    for (int64_t e = 0; e < ny; e++) {
      want[e] = is.val[y->id][e];
      got[e] = get(arena, rc, view_index(&vc, y, e));
    }
    /* compared through a contiguous stand-in for the result, at its
     * dtype's tolerance (a bf16 product accumulates unrounded into an f32
     * gradient buffer, where the interpreter rounds it first) */
    IrValue stand = *y;
    stand.storage = rc->storage == IR_STORE_GRAD ? IR_STORE_GRAD : IR_STORE_ARENA;
    stand.offset = 0;
    char *buf = calloc((size_t)ny + 1, 8);
    for (int64_t e = 0; e < ny; e++) put(buf, &stand, e, got[e]);
    char what[512];
    snprintf(what, sizeof what, "%s: matmul at %d:%d (%lld x %lld x %lld, %lld calls of %lld)", rel, op->loc.line,
             op->loc.col, (long long)d.m, (long long)d.n, (long long)d.k, (long long)d.calls, (long long)d.batch);
    compare(what, "cublasLt", &stand, buf, want);
    free(buf);
    free(want);
    free(got);
    cuda_gemm_desc_free(&d);
  }
  kp_views_free(&vs);
  free(arena);
  interp_free(&is);
  for (int v = 0; v < f->nvalues; v++) free(wsum[v]);
  free(wsum);
  free_inputs(&in);
  fe_model_free(fe);
  return ng;
}

static void test_cuda_gemms_as_cublaslt_sees_them(void **state) {
  static const char *const tiny[] = {"B=2", "T=8", "C=32", "NH=2", "L=2", "V=40", NULL};
  int n = 0;
  n += check_gemms("examples/tinygpt.gdl", tiny, 1);
  n += check_gemms("examples/mlp.gdl", NULL, 2);
  n += check_gemms("tests/torchref/cases/matmul_shapes.gdl", NULL, 3);
  n += check_gemms("tests/torchref/cases/matmul_vec.gdl", NULL, 4);
  n += check_gemms("tests/torchref/cases/attention.gdl", NULL, 5);
  n += check_gemms("tests/torchref/cases/embedding_tied.gdl", NULL, 6);
  n += check_gemms("tests/torchref/cases/f64_model.gdl", NULL, 7);
  n += check_gemms("tests/cuda/lowp.gdl", NULL, 8);
  assert_true(n >= 40);
}

/* ------------------------------------------------------------------ */
/* NVRTC                                                               */
/* ------------------------------------------------------------------ */

static bool nvrtc_or_skip(void) {
  char err[512];
  if (cg_nvrtc_load(err, sizeof err)) return true;
  fprintf(stderr, "skipped: %s\n", err);
  return false;
}

/* Every model of the repository (examples, torch-reference cases that
 * compile, tests/cuda), K = 1. */
static int all_models(FeModel **out, int cap) {
  int n = 0;
  static const char *const dirs[] = {"examples", "tests/torchref/cases", "tests/cuda"};
  for (int d = 0; d < 3; d++) {
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "ls %s/*.gdl", tu_path(dirs[d]));
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    char line[4096];
    while (fgets(line, sizeof line, p) && n < cap) {
      line[strcspn(line, "\n")] = 0;
      const char *base = strrchr(line, '/') + 1;
      if (strncmp(base, "err_", 4) == 0) continue;
      char rel[512];
      snprintf(rel, sizeof rel, "%s/%s", dirs[d], base);
      out[n++] = load_model(rel, NULL);
    }
    pclose(p);
  }
  return n;
}

/* The distinct functions of many modules in one NVRTC program per arch
 * (names prefixed by the module), compiled on two threads; the result
 * ("no errors, no warnings") cached under the sources' hash. */
typedef struct Prog {
  char *src;
  const char *arch;
  bool ok;
  char *log;
} Prog;

static void compile_progs(void *ctx, int64_t b, int64_t e) {
  Prog *p = ctx;
  for (int64_t i = b; i < e; i++) {
    char opt[64];
    snprintf(opt, sizeof opt, "--gpu-architecture=%s", p[i].arch);
    const char *opts[] = {opt};
    CuImage img = {0};
    p[i].ok = cg_nvrtc_compile(p[i].src, "all_models.cu", opts, 1, &img, &p[i].log);
    free(img.cubin);
    free(img.ptx);
  }
}

/* Every op of every model has something to run it on the device: a
 * kernel, a GEMM cuBLASLt can do, a copy, or nothing (views, aliases). */
static void test_cuda_every_model_plans(void **state) {
  FeModel *models[128];
  int nm = all_models(models, 128);
  for (int i = 0; i < nm; i++) {
    char err[2048];
    CudaProgram *p = cuda_program_plan(models[i]->func, NULL, err, sizeof err);
    if (!p) fail_msg("%s: %s", models[i]->func->name, err);
    cuda_program_free(p);
    fe_model_free(models[i]);
  }
}

static void test_cuda_nvrtc_compiles_every_model(void **state) {
  if (!nvrtc_or_skip()) skip();
  FeModel *models[128];
  int nm = all_models(models, 128);
  assert_true(nm >= 40);
  StrMap seen;
  strmap_init(&seen);
  Arena keys;
  arena_init(&keys);
  StrBuf part[2];
  sb_init(&part[0]);
  sb_init(&part[1]);
  int nfun = 0, nkern = 0;
  CuModule **mods = calloc((size_t)nm, sizeof *mods);
  for (int i = 0; i < nm; i++) {
    char err[2048];
    mods[i] = cg_cuda_generate(models[i]->func, err, sizeof err);
    if (!mods[i]) fail_msg("model %d: %s", i, err);
    nkern += mods[i]->nkernels;
    for (int c = 0; c < mods[i]->ncodes; c++) {
      const CuCode *code = &mods[i]->codes[c];
      char *key = arena_printf(&keys, "%s\001%s", code->pre, code->post);
      if (strmap_get(&seen, key)) continue;
      strmap_put(&seen, key, key);
      StrBuf *sb = &part[nfun % 2];
      sb_printf(sb, "\n%sm%d_%s%s", code->pre, i, code->func, code->post);
      nfun++;
    }
  }
  static const char *const archs[] = {"sm_80", "sm_90"};
  Prog prog[4];
  char ver[64], err[512];
  assert_true(cg_nvrtc_version(ver, sizeof ver, err, sizeof err));
  char dir[4096];
  bool cached = cache_dir(dir, sizeof dir);
  int todo = 0;
  int64_t idx[4];
  for (int a = 0; a < 2; a++)
    for (int h = 0; h < 2; h++) {
      Prog *p = &prog[a * 2 + h];
      StrBuf sb;
      sb_init(&sb);
      sb_puts(&sb, cu_prelude);
      sb_puts(&sb, sb_str(&part[h]));
      p->src = strdup(sb_str(&sb));
      sb_free(&sb);
      p->arch = archs[a];
      p->log = NULL;
      uint64_t key = hash_bytes(p->src, strlen(p->src), hash_str(ver));
      key = hash_bytes(p->arch, strlen(p->arch), key);
      size_t len;
      char *hit = cached ? cache_get(dir, "test-cuda-ok", key, &len) : NULL;
      p->ok = hit != NULL;
      free(hit);
      if (!p->ok) idx[todo++] = a * 2 + h;
    }
  Prog work[4];
  for (int t = 0; t < todo; t++) work[t] = prog[idx[t]];
  Pool *pool = todo > 1 ? pool_new(2) : NULL;
  pool_run(pool, todo, 1, compile_progs, work);
  pool_free(pool);
  for (int t = 0; t < todo; t++) {
    Prog *p = &work[t];
    if (!p->ok) fail_msg("NVRTC (%s) failed on the models' kernels:\n%.4000s", p->arch, p->log ? p->log : "");
    if (p->log && *p->log) fail_msg("NVRTC (%s) warns on the models' kernels:\n%.4000s", p->arch, p->log);
    uint64_t key = hash_bytes(p->src, strlen(p->src), hash_str(ver));
    key = hash_bytes(p->arch, strlen(p->arch), key);
    if (cached) cache_put(dir, "test-cuda-ok", key, "ok", 2);
    free(p->log);
  }
  fprintf(stderr, "%d models, %d kernels, %d distinct functions, compiled for sm_80 and sm_90 (%d programs from the "
                  "cache)\n",
          nm, nkern, nfun, 4 - todo);
  for (int i = 0; i < 4; i++) free(prog[i].src);
  for (int i = 0; i < nm; i++) {
    cg_cuda_free(mods[i]);
    fe_model_free(models[i]);
  }
  free(mods);
  sb_free(&part[0]);
  sb_free(&part[1]);
  strmap_free(&seen);
  arena_free(&keys);
}

static char *tmp_dir(void) {
  char *d = strdup("/tmp/gradc-cuda-XXXXXX");
  assert_non_null(mkdtemp(d));
  return d;
}

static void rm_rf(const char *d) {
  char cmd[512];
  snprintf(cmd, sizeof cmd, "rm -rf %s", d);
  assert_int_equal(system(cmd), 0);
}

static void test_cuda_cache_hit_makes_no_nvrtc_call(void **state) {
  if (!nvrtc_or_skip()) skip();
  FeModel *fe = load_model("examples/mlp.gdl", NULL);
  char *dir = tmp_dir(), err[2048];
  CuCompileOptions o = {"sm_80", dir, 2};
  CuModule *a = cg_cuda_generate(fe->func, err, sizeof err);
  assert_non_null(a);
  int calls = cg_nvrtc_compile_calls();
  if (!cg_cuda_compile(a, &o, err, sizeof err)) fail_msg("%s", err);
  assert_int_equal(cg_nvrtc_compile_calls() - calls, a->nchunks);
  assert_int_equal(a->compiled, a->nchunks);
  assert_null(a->warnings);
  CuModule *b = cg_cuda_generate(fe->func, err, sizeof err);
  calls = cg_nvrtc_compile_calls();
  if (!cg_cuda_compile(b, &o, err, sizeof err)) fail_msg("%s", err);
  assert_int_equal(cg_nvrtc_compile_calls(), calls); /* all from the cache */
  assert_int_equal(b->compiled, 0);
  for (int c = 0; c < a->nchunks; c++) {
    assert_true(b->images[c].from_cache);
    assert_int_equal(a->images[c].cubin_len, b->images[c].cubin_len);
    assert_memory_equal(a->images[c].cubin, b->images[c].cubin, a->images[c].cubin_len);
    assert_string_equal(a->images[c].ptx, b->images[c].ptx);
  }
  /* another architecture is another entry */
  CuModule *c = cg_cuda_generate(fe->func, err, sizeof err);
  CuCompileOptions o90 = {"sm_90", dir, 2};
  calls = cg_nvrtc_compile_calls();
  if (!cg_cuda_compile(c, &o90, err, sizeof err)) fail_msg("%s", err);
  assert_int_equal(cg_nvrtc_compile_calls() - calls, c->nchunks);
  cg_cuda_free(a);
  cg_cuda_free(b);
  cg_cuda_free(c);
  rm_rf(dir);
  free(dir);
  fe_model_free(fe);
}

/* stderr into a file while f runs. */
static char *capture_stderr(void (*fn)(void *), void *ctx) {
  char path[] = "/tmp/gradc-cuda-stderrXXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  fflush(stderr);
  int saved = dup(2);
  dup2(fd, 2);
  fn(ctx);
  fflush(stderr);
  dup2(saved, 2);
  close(saved);
  close(fd);
  char *s = read_file(path, NULL, NULL);
  unlink(path);
  return s;
}

typedef struct CompileJob {
  CuModule *m;
  CuCompileOptions o;
  bool ok;
  char err[2048];
} CompileJob;

static void compile_job(void *ctx) {
  CompileJob *j = ctx;
  j->ok = cg_cuda_compile(j->m, &j->o, j->err, sizeof j->err);
}

static void test_cuda_corrupted_cache_entry_is_ignored(void **state) {
  if (!nvrtc_or_skip()) skip();
  FeModel *fe = load_model("tests/cuda/cross_entropy.gdl", NULL);
  char *dir = tmp_dir(), err[2048];
  CompileJob j = {cg_cuda_generate(fe->func, err, sizeof err), {"sm_80", dir, 1}, false, ""};
  compile_job(&j);
  assert_true(j.ok);
  CuImage want = j.m->images[0];
  /* flip a byte in the middle of every entry */
  char cmd[1024];
  snprintf(cmd, sizeof cmd, "ls %s/cuda-img-*", dir);
  FILE *p = popen(cmd, "r");
  char line[1024];
  int n = 0;
  while (fgets(line, sizeof line, p)) {
    line[strcspn(line, "\n")] = 0;
    FILE *e = fopen(line, "r+b");
    assert_non_null(e);
    fseek(e, 0, SEEK_END);
    long len = ftell(e);
    fseek(e, len / 2, SEEK_SET);
    int ch = fgetc(e);
    fseek(e, len / 2, SEEK_SET);
    fputc(ch ^ 0x5a, e);
    fclose(e);
    n++;
  }
  pclose(p);
  assert_true(n >= 1);
  CompileJob k = {cg_cuda_generate(fe->func, err, sizeof err), {"sm_80", dir, 1}, false, ""};
  int calls = cg_nvrtc_compile_calls();
  char *log = capture_stderr(compile_job, &k);
  assert_true(k.ok);
  assert_int_equal(cg_nvrtc_compile_calls() - calls, k.m->nchunks); /* compiled again */
  if (!strstr(log, "warning: ignoring corrupted cache entry")) fail_msg("no warning; stderr was: %s", log);
  assert_memory_equal(k.m->images[0].cubin, want.cubin, want.cubin_len);
  free(log);
  cg_cuda_free(j.m);
  cg_cuda_free(k.m);
  rm_rf(dir);
  free(dir);
  fe_model_free(fe);
}

static void test_cuda_compile_error_names_the_kernel(void **state) {
  if (!nvrtc_or_skip()) skip();
  FeModel *fe = load_model("examples/mlp.gdl", NULL);
  char err[8192];
  CuModule *m = cg_cuda_generate(fe->func, err, sizeof err);
  assert_non_null(m);
  assert_true(m->ncodes >= 3);
  /* break the third function */
  CuCode *c = &m->codes[2];
  c->text = arena_printf(&m->a, "%s%s(float *x) {\n  x[0] = undefined_thing;\n}\n", c->pre, c->func);
  CuCompileOptions o = {"sm_80", NULL, 1};
  assert_false(cg_cuda_compile(m, &o, err, sizeof err));
  if (!strstr(err, c->func) || !strstr(err, "undefined_thing") || !strstr(err, "error"))
    fail_msg("the message should name %s and show NVRTC's log: %s", c->func, err);
  cg_cuda_free(m);
  fe_model_free(fe);
}

static void test_cuda_unknown_architecture(void **state) {
  if (!nvrtc_or_skip()) skip();
  FeModel *fe = load_model("examples/mlp.gdl", NULL);
  char err[2048];
  CuModule *m = cg_cuda_generate(fe->func, err, sizeof err);
  CuCompileOptions o = {"sm_12", NULL, 1};
  assert_false(cg_cuda_compile(m, &o, err, sizeof err));
  if (!strstr(err, "cannot compile for sm_12") || !strstr(err, "sm_90")) fail_msg("%s", err);
  cg_cuda_free(m);
  fe_model_free(fe);
}

/* ------------------------------------------------------------------ */
/* The generator                                                       */
/* ------------------------------------------------------------------ */

static void test_cuda_target_names(void **state) {
  char a[32];
  assert_true(cg_cuda_parse_target("cuda", a, sizeof a));
  assert_string_equal(a, "");
  assert_true(cg_cuda_parse_target("cuda:sm_90", a, sizeof a));
  assert_string_equal(a, "sm_90");
  assert_true(cg_cuda_parse_target("cuda:sm_90a", a, sizeof a));
  assert_string_equal(a, "sm_90a");
  assert_false(cg_cuda_parse_target("cuda:", a, sizeof a));
  assert_false(cg_cuda_parse_target("cuda:sm_", a, sizeof a));
  assert_false(cg_cuda_parse_target("cuda:compute_90", a, sizeof a));
  assert_false(cg_cuda_parse_target("cuda:sm_90x1", a, sizeof a));
  assert_false(cg_cuda_parse_target("cudax", a, sizeof a));
  assert_false(cg_cuda_parse_target("cpu", a, sizeof a));
}

/* The layers of a deep model share their kernels' code: 12 layers compile
 * no more functions than 2. */
static void test_cuda_layers_share_code(void **state) {
  static const char *const l2[] = {"L=2", NULL}, *const l6[] = {"L=6", NULL};
  FeModel *a = load_model("examples/tinygpt.gdl", l2), *b = load_model("examples/tinygpt.gdl", l6);
  char err[2048];
  CuModule *ma = cg_cuda_generate(a->func, err, sizeof err), *mb = cg_cuda_generate(b->func, err, sizeof err);
  assert_non_null(ma);
  assert_non_null(mb);
  assert_true(mb->nkernels > ma->nkernels + 50);
  assert_int_equal(mb->ncodes, ma->ncodes);
  cg_cuda_free(ma);
  cg_cuda_free(mb);
  fe_model_free(a);
  fe_model_free(b);
}

/* The code of the first function whose kernel holds op `name`. */
static const CuCode *code_with(const CuModule *m, const char *name, int nth) {
  for (int c = 0; c < m->ncodes; c++) {
    const CuKernel *k = &m->kernels[m->codes[c].first];
    for (int i = 0; i < k->nops; i++)
      if (strcmp(ir_op_info[k->ops[i]->opcode].name, name) == 0 && nth-- == 0) return &m->codes[c];
  }
  return NULL;
}

static void golden(const char *model_rel, const char *op, int nth, const char *golden_rel) {
  FeModel *fe = load_model(model_rel, NULL);
  char err[2048];
  CuModule *m = cg_cuda_generate(fe->func, err, sizeof err);
  assert_non_null(m);
  const CuCode *c = code_with(m, op, nth);
  if (!c) fail_msg("%s: no kernel with %s", model_rel, op);
  StrBuf sb;
  sb_init(&sb);
  sb_puts(&sb, c->comment);
  sb_puts(&sb, c->text);
  if (getenv("GRADC_UPDATE_GOLDEN")) {
    FILE *fp = fopen(tu_path(golden_rel), "w");
    assert_non_null(fp);
    fputs(sb_str(&sb), fp);
    fclose(fp);
  }
  char *want = tu_read(golden_rel);
  if (strcmp(want, sb_str(&sb)) != 0)
    fail_msg("%s differs from the generated code (GRADC_UPDATE_GOLDEN=1 rewrites it); generated:\n%s", golden_rel,
             sb_str(&sb));
  free(want);
  sb_free(&sb);
  cg_cuda_free(m);
  fe_model_free(fe);
}

static void test_cuda_golden_layer_norm(void **state) {
  golden("tests/cuda/layernorm.gdl", "layer_norm", 0, "tests/cuda/layernorm_backward.cu");
}
static void test_cuda_golden_cross_entropy(void **state) {
  golden("tests/cuda/cross_entropy.gdl", "cross_entropy", 0, "tests/cuda/cross_entropy.cu");
}
static void test_cuda_golden_elementwise(void **state) {
  golden("tests/cuda/elementwise.gdl", "gelu", 0, "tests/cuda/elementwise.cu");
}
static void test_cuda_golden_transpose(void **state) {
  golden("tests/cuda/transpose.gdl", "permute", 0, "tests/cuda/transpose.cu");
}

/* ------------------------------------------------------------------ */
/* The runtime and the command line without a device                    */
/* ------------------------------------------------------------------ */

static bool no_device(void) {
  char err[512];
  if (!cuda_device_available(err, sizeof err)) {
    assert_string_equal(err, "no CUDA device");
    return true;
  }
  fprintf(stderr, "skipped: this machine has a CUDA device\n");
  return false;
}

static void test_cuda_runtime_without_device(void **state) {
  if (!no_device()) skip();
  char arch[32] = "";
  assert_false(cuda_device_arch(arch, sizeof arch));
}

static int sh(const char *cmd, char **out) {
  char path[] = "/tmp/gradc-cuda-outXXXXXX";
  int fd = mkstemp(path);
  close(fd);
  char full[20000];
  snprintf(full, sizeof full, "(%s) > %s 2>&1", cmd, path);
  int rc = system(full);
  *out = read_file(path, NULL, NULL);
  unlink(path);
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

static void test_cuda_command_line(void **state) {
  if (!nvrtc_or_skip() || !no_device()) skip();
  char *dir = tmp_dir(), cmd[16384], *out;
  const char *g = GRADC_BINARY, *mlp = tu_path("examples/mlp.gdl");
  char mlp_path[4096];
  snprintf(mlp_path, sizeof mlp_path, "%s", mlp);
  /* compile works without a device, prints the kernels */
  snprintf(cmd, sizeof cmd, "GRADC_CACHE_DIR=%s %s compile %s --target cuda:sm_90 --print-kernels -o %s/m.gca", dir, g,
           mlp_path, dir);
  int rc = sh(cmd, &out);
  if (rc != 0 || !strstr(out, "__global__") || !strstr(out, "k1_add_relu")) fail_msg("rc %d: %s", rc, out);
  free(out);
  snprintf(cmd, sizeof cmd, "%s compile %s --target cuda:sm_80 --kernels-dir %s/kernels > /dev/null && ls %s/kernels",
           g, mlp_path, dir, dir);
  rc = sh(cmd, &out);
  if (rc != 0 || !strstr(out, "k1_add_relu.cu")) fail_msg("rc %d: %s", rc, out);
  free(out);
  /* running needs a device */
  snprintf(cmd, sizeof cmd,
           "cd %s && %s init %s -o p.safetensors && %s data random %s -o i.safetensors && "
           "%s run %s --target cuda --params p.safetensors --inputs i.safetensors",
           dir, g, mlp_path, g, mlp_path, g, mlp_path);
  rc = sh(cmd, &out);
  if (rc != 1 || strcmp(out, "gradc: error: no CUDA device\n") != 0) fail_msg("run: rc %d: %s", rc, out);
  free(out);
  /* a CPU run maps none of the CUDA libraries */
  snprintf(cmd, sizeof cmd,
           "cd %s && LD_DEBUG=libs %s run %s --target cpu --params p.safetensors --inputs i.safetensors 2>&1 | "
           "grep -c -i -E 'nvrtc|libcuda|cublas'",
           dir, g, mlp_path);
  rc = sh(cmd, &out);
  if (strcmp(out, "0\n") != 0) fail_msg("a CPU run loads CUDA libraries: %s", out);
  free(out);
  /* the artifact holds the compiled kernels; running it needs a device */
  snprintf(cmd, sizeof cmd, "cd %s && %s run m.gca --params p.safetensors --inputs i.safetensors", dir, g);
  rc = sh(cmd, &out);
  if (rc != 1 || !strstr(out, "no CUDA device")) fail_msg("run artifact: rc %d: %s", rc, out);
  free(out);
  snprintf(cmd, sizeof cmd, "grep -c CUBN %s/m.gca", dir);
  rc = sh(cmd, &out);
  if (rc != 0) fail_msg("the artifact has no cubin: %s", out);
  free(out);
  snprintf(cmd, sizeof cmd, "%s train %s --target cuda --data %s/i.safetensors --steps 1", g, mlp_path, dir);
  rc = sh(cmd, &out);
  if (rc != 1 || !strstr(out, "gradc: error: no CUDA device")) fail_msg("train: rc %d: %s", rc, out);
  free(out);
  snprintf(cmd, sizeof cmd, "%s bench %s --target cuda", g, mlp_path);
  rc = sh(cmd, &out);
  if (rc != 1 || !strstr(out, "gradc: error: no CUDA device")) fail_msg("bench: rc %d: %s", rc, out);
  free(out);
  snprintf(cmd, sizeof cmd, "%s compile %s --target cuda:sm80", g, mlp_path);
  rc = sh(cmd, &out);
  if (rc != 1 || !strstr(out, "unsupported --target 'cuda:sm80'")) fail_msg("bad target: rc %d: %s", rc, out);
  free(out);
  rm_rf(dir);
  free(dir);
}

/* The GPU test machine's configuration: no LLVM, no BLAS, no cmocka (a
 * Debug build, which is quick; tests/gpu/run.sh builds it optimised). */
static void test_cuda_build_without_llvm(void **state) {
  if (getenv("GRADC_SKIP_NOLLVM_BUILD")) skip();
  char *dir = tmp_dir(), cmd[16384], *out, src[4096];
  snprintf(src, sizeof src, "%s", tu_path("")); /* tu_path's buffer is reused */
  snprintf(cmd, sizeof cmd,
           "cmake -S %s -B %s -DCMAKE_BUILD_TYPE=Debug -DGRADC_LLVM=OFF -DGRADC_BLAS=OFF -DGRADC_TESTS=OFF "
           "-DGRADC_MPI=OFF && cmake --build %s -j2 --target gradc && "
           "%s/gradc compile %s --target cuda:sm_80 --print-kernels",
           src, dir, dir, dir, tu_path("examples/mlp.gdl"));
  int rc = sh(cmd, &out);
  if (rc != 0 || !strstr(out, "k1_add_relu")) {
    char log[4200];
    snprintf(log, sizeof log, "%s.log", dir);
    FILE *fp = fopen(log, "w");
    if (fp) fputs(out, fp), fclose(fp);
    fail_msg("rc %d; the output is in %s", rc, log);
  }
  free(out);
  rm_rf(dir);
  free(dir);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_cuda_target_names),
      cmocka_unit_test(test_cuda_layers_share_code),
      cmocka_unit_test(test_cuda_golden_layer_norm),
      cmocka_unit_test(test_cuda_golden_cross_entropy),
      cmocka_unit_test(test_cuda_golden_elementwise),
      cmocka_unit_test(test_cuda_golden_transpose),
      cmocka_unit_test(test_cuda_emulated_ops),
      cmocka_unit_test(test_cuda_emulated_models),
      cmocka_unit_test(test_cuda_gemms_as_cublaslt_sees_them),
      cmocka_unit_test(test_cuda_every_model_plans),
      cmocka_unit_test(test_cuda_nvrtc_compiles_every_model),
      cmocka_unit_test(test_cuda_cache_hit_makes_no_nvrtc_call),
      cmocka_unit_test(test_cuda_corrupted_cache_entry_is_ignored),
      cmocka_unit_test(test_cuda_compile_error_names_the_kernel),
      cmocka_unit_test(test_cuda_unknown_architecture),
      cmocka_unit_test(test_cuda_runtime_without_device),
      cmocka_unit_test(test_cuda_command_line),
      cmocka_unit_test(test_cuda_build_without_llvm),
  };
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  free_kept();
  return rc;
}

#else /* no CUDA back end in this build */

static void test_cuda_skipped_without_cuda(void **state) {
  fprintf(stderr, "skipped: this build has no CUDA back end (-DGRADC_CUDA=OFF)\n");
  skip();
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_cuda_skipped_without_cuda)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}

#endif
