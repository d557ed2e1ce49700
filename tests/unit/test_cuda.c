/* test_cuda.c - the CUDA back end on a machine without a GPU.
 *
 * Each op on its own runs in the op-case table (tests/ops/), under the
 * same host emulator (tests/cuda/emu.h: every CUDA thread a coroutine,
 * barriers and warp shuffles emulated).  Here: the kernels of models and
 * of hand-built fused groups, each run on its own through
 * tests/ops/backends.c, its inputs taken from the reference interpreter,
 * its outputs prefilled with garbage (gradient buffers with known values
 * it must add to), and every output compared with the interpreter (f32
 * within 1e-4 relative, f64 1e-12, bf16 2e-2, f16 2e-3, integers exactly;
 * an element's error is relative to max(|want|, 1e-2 * the largest |want|
 * of the tensor), 5e-2 for f32, whose sums accumulate in f32 where the
 * interpreter's use f64); the GEMMs as cuBLASLt is handed them, executed on
 * the host.  Then NVRTC (when it is
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
#include "backends.h"
#include "irbuild.h"
#include "testutil.h"

#ifdef GRADC_HAVE_CUDA
/* Building functions: irbuild.h; running them: tests/ops/backends.h. */

static void run_passes(IrFunc *f, const char *const *names, int n) {
  char err[4096];
  if (!ot_passes(f, names, n, true, err, sizeof err)) fail_msg("%s", err);
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
  PassOptions po = {.gas = 1, .diag = &d, .src = &src, .no_inplace = true, .no_colsums = true};
  if (pm_run(&pm, m->func, pipe, n, &po) != 0) fail_msg("%s: the CPU pipeline failed: %s", rel, sb_str(&d.log));
  diag_free(&d);
  return m;
}

/* ------------------------------------------------------------------ */
/* The emulator                                                        */
/* ------------------------------------------------------------------ */

/* One function under test: its inputs and owner. */
typedef struct Case {
  const char *name;
  IrFunc *f;
  FeModel *fe; /* owns f when it came from a model */
  OtInputs in;
} Case;

static bool emu_or_skip(void) {
  char why[256];
  if (ot_emu_available(why, sizeof why)) return true;
  fprintf(stderr, "skipped: %s\n", why);
  return false;
}

/* Every case's kernels in one emulated program, each kernel run on its own
 * against the interpreter; returns the kernels run. */
static int emu_run(Case *cs, int n) {
  IrFunc **fs = calloc((size_t)n, sizeof *fs);
  const char **names = calloc((size_t)n, sizeof *names);
  for (int c = 0; c < n; c++) fs[c] = cs[c].f, names[c] = cs[c].name;
  static char err[1 << 15];
  OtEmu *e = ot_emu_build(fs, names, n, err, sizeof err);
  if (!e) fail_msg("%s", err);
  int kernels = 0;
  for (int c = 0; c < n; c++) {
    double t0 = rt_now_ms();
    OtStats st = {0};
    if (!ot_emu_check(e, c, &cs[c].in, &st, err, sizeof err)) fail_msg("%s", err);
    kernels += st.kernels;
    if (getenv("GRADC_TEST_TIME")) fprintf(stderr, "%s: %.0f ms\n", cs[c].name, rt_now_ms() - t0);
  }
  ot_emu_free(e);
  free(fs);
  free(names);
  return kernels;
}

static void free_cases(Case *cs, int n) {
  for (int c = 0; c < n; c++) {
    ot_inputs_free(&cs[c].in);
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
    ot_one_kernel_per_op(f);
  }
  char err[512];
  if (!ot_verify(f, err, sizeof err)) fail_msg("%s: verify: %s", name, err);
  ot_trivial_plan(f);
  Case c = {name, f, NULL, ot_inputs_random(f, seed)};
  return c;
}

static Case model(const char *rel, const char *const *defs, uint64_t seed) {
  FeModel *fe = load_model(rel, defs);
  Case c = {rel, fe->func, fe, ot_inputs_random(fe->func, seed)};
  return c;
}

/* ------------------------------------------------------------------ */
/* Hand-built fused groups (each op on its own: tests/ops)              */
/* ------------------------------------------------------------------ */

/* A row max, broadcast back and subtracted, exp, a row sum, a divide. */
static IrFunc *softmax_by_hand(IrDType dt) {
  IrFunc *f = ir_func_new("red");
  IrValue *x = input(f, "x", ty(dt, 3, 3, 4, 45));
  int64_t last = 2;
  IrValue *m = reduce(f, IR_OP_MAX, x, &last, 1, true);
  IrValue *e = un(f, IR_OP_EXP, bin(f, IR_OP_SUB, x, m));
  sink(f, bin(f, IR_OP_DIV, e, reduce(f, IR_OP_SUM, e, &last, 1, true)));
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

static void test_cuda_emulated_fused_groups(void **state) {
  if (!emu_or_skip()) skip();
  Case cs[4];
  int n = 0;
  cs[n++] = built("softmax by hand", softmax_by_hand(IR_DT_F32), false, 21);
  cs[n++] = built("softmax by hand f64", softmax_by_hand(IR_DT_F64), false, 22);
  cs[n++] = built("softmax by hand fused", softmax_by_hand(IR_DT_F32), true, 23);
  cs[n++] = built("gradient buffers", grad_buffers(), true, 61);
  assert_true(emu_run(cs, n) >= 9);
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
  if (!emu_or_skip()) skip();
  static const char *const tiny[] = {"B=2", "T=8", "C=32", "NH=2", "L=2", "V=40", NULL};
  static const char *const torchref[] = {"norms", "softmax_axes", "reductions", "ce_variants", "shape_ops",
                                         "concat_index", "embedding_tied", "f64_model", "attention", "max_ties",
                                         "mse_variants", "minmax", "unary_a", "unary_b", "pow_prec",
                                         "reshape_merge_batch", "matmul_vec", "detach", "batch_affine",
                                         "tinygpt_block", "stacked_for", "param_axis0", "dims_values"};
  enum { NT = sizeof torchref / sizeof torchref[0] };
  Case cs[NT + 16];
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
  /* convolution and pooling: patches, patches_grad and the kernels around them */
  cs[n++] = model("tests/models/lenet.gdl", NULL, 92);
  cs[n++] = model("tests/models/conv_paths.gdl", NULL, 93);
  cs[n++] = model("tests/models/conv_bn.gdl", NULL, 94);
  cs[n++] = model("tests/models/v2_select.gdl", NULL, 95);
  cs[n++] = model("tests/cuda/dropout.gdl", NULL, 96);
  cs[n++] = model("tests/cuda/state.gdl", NULL, 97); /* language v2: buffers, updates, outputs, where */
  for (int i = 0; i < NT; i++) {
    char rel[256];
    snprintf(rel, sizeof rel, "tests/torchref/cases/%s.gdl", torchref[i]);
    cs[n++] = model(keep(strdup(rel)), NULL, 100 + (uint64_t)i);
  }
  assert_true(emu_run(cs, n) >= 200);
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
  case 2: return ot_f16_value(((const uint16_t *)(arena + off))[i]);
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
              h = ot_f16_bits(r);
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
  OtInputs in = ot_inputs_random(f, seed);
  char err[4096];
  OtRef is;
  if (!ot_ref_run(f, &in, &is, err, sizeof err)) fail_msg("%s: %s", rel, err);
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
    for (int64_t e = 0; e < ir_numel(&ra->type.shape); e++) ot_put(arena, ra, e, is.val[ra->id][e]);
    for (int64_t e = 0; e < ir_numel(&rb->type.shape); e++) ot_put(arena, rb, e, is.val[rb->id][e]);
    /* the result's elements, where the GEMM writes them: NaN, or the
     * gradient buffer's prefill */
    const IrValue *y = op->result;
    int64_t ny = ir_numel(&y->type.shape);
    for (int64_t e = 0; e < ny; e++)
      ot_put(arena, rc, view_index(&vc, y, e), rc->storage == IR_STORE_GRAD ? ot_grad_prefill(e) : NAN);
    lt_emulate(&d, arena);
    double *want = calloc((size_t)ny + 1, sizeof(double)), *got = calloc((size_t)ny + 1, sizeof(double));
    for (int64_t e = 0; e < ny; e++) {
      want[e] = is.val[y->id][e];
      got[e] = ot_get(arena, rc, view_index(&vc, y, e));
    }
    /* compared through a contiguous stand-in for the result, at its
     * dtype's tolerance (a bf16 product accumulates unrounded into an f32
     * gradient buffer, where the interpreter rounds it first) */
    IrValue stand = *y;
    stand.storage = rc->storage == IR_STORE_GRAD ? IR_STORE_GRAD : IR_STORE_ARENA;
    stand.offset = 0;
    char *buf = calloc((size_t)ny + 1, 8);
    for (int64_t e = 0; e < ny; e++) ot_put(buf, &stand, e, got[e]);
    char what[512];
    snprintf(what, sizeof what, "%s: matmul at %d:%d (%lld x %lld x %lld, %lld calls of %lld)", rel, op->loc.line,
             op->loc.col, (long long)d.m, (long long)d.n, (long long)d.k, (long long)d.calls, (long long)d.batch);
    if (!ot_compare(what, "cublasLt", &stand, buf, want, &ot_tol_cuda, NULL, err, sizeof err)) fail_msg("%s", err);
    free(buf);
    free(want);
    free(got);
    cuda_gemm_desc_free(&d);
  }
  kp_views_free(&vs);
  free(arena);
  ot_ref_free(&is);
  ot_inputs_free(&in);
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
  /* simplify writes the norm over the statistics its backward computes
   * (rsqrt of the variance): forward and backward share one kernel. */
  golden("tests/cuda/layernorm.gdl", "rsqrt", 0, "tests/cuda/layernorm_backward.cu");
}
static void test_cuda_golden_cross_entropy(void **state) {
  golden("tests/cuda/cross_entropy.gdl", "cross_entropy", 0, "tests/cuda/cross_entropy.cu");
}
static void test_cuda_golden_elementwise(void **state) {
  golden("tests/cuda/elementwise.gdl", "gelu", 0, "tests/cuda/elementwise.cu");
}
static void test_cuda_golden_dropout(void **state) {
  golden("tests/cuda/dropout.gdl", "random", 0, "tests/cuda/dropout.cu");
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
      cmocka_unit_test(test_cuda_golden_dropout),
      cmocka_unit_test(test_cuda_emulated_fused_groups),
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
