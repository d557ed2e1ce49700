/* cuda_blas.c - the step's GEMMs through cuBLASLt (libcublasLt.so, loaded
 * with dlopen on first use).  Each matmul op is planned once as the CPU
 * executor plans it (runtime/gemm_plan.c: views or contiguous operands,
 * transposes as flags, a left-only batch folded into M), with beta = 1
 * into f32 gradient buffers, and handed to cuBLASLt with its layouts, a
 * heuristic algorithm and a preallocated workspace (so the calls can be
 * captured in a CUDA graph).  Row-major C = A B is computed as
 * column-major C^T = B^T A^T.  f32 runs without TF32 unless allowed
 * (DESIGN.md §2: f32 means f32); bf16 and f16 accumulate in f32; f64 in
 * f64. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "cuda.h"
#include "runtime/gemm_plan.h"

typedef int cublasStatus_t; /* CUBLAS_STATUS_SUCCESS = 0 */
typedef struct cublasLtContext *cublasLtHandle_t;
typedef struct cublasLtMatmulDescOpaque *cublasLtMatmulDesc_t;
typedef struct cublasLtMatrixLayoutOpaque *cublasLtMatrixLayout_t;
typedef struct cublasLtMatmulPreferenceOpaque *cublasLtMatmulPreference_t;
typedef struct {
  uint64_t data[8];
} cublasLtMatmulAlgo_t;
typedef struct {
  cublasLtMatmulAlgo_t algo;
  size_t workspaceSize;
  cublasStatus_t state;
  float wavesCount;
  int reserved[4];
} cublasLtMatmulHeuristicResult_t;

enum {
  R_32F = 0, R_64F = 1, R_16F = 2, R_16BF = 14,                    /* cudaDataType */
  COMPUTE_32F = 68, COMPUTE_64F = 70, COMPUTE_32F_FAST_TF32 = 77,  /* cublasComputeType_t */
  OP_N = 0, OP_T = 1,                                              /* cublasOperation_t */
  DESC_TRANSA = 3, DESC_TRANSB = 4,                                /* cublasLtMatmulDescAttributes_t */
  LAYOUT_BATCH_COUNT = 5, LAYOUT_STRIDED_BATCH_OFFSET = 6,         /* cublasLtMatrixLayoutAttribute_t */
  PREF_MAX_WORKSPACE_BYTES = 1,                                    /* cublasLtMatmulPreferenceAttributes_t */
  PREF_MIN_ALIGNMENT_A = 5, PREF_MIN_ALIGNMENT_B = 6, PREF_MIN_ALIGNMENT_C = 7, PREF_MIN_ALIGNMENT_D = 8,
};

#define WORKSPACE (32u << 20)

static struct {
  cublasStatus_t (*Create)(cublasLtHandle_t *);
  cublasStatus_t (*Destroy)(cublasLtHandle_t);
  cublasStatus_t (*DescCreate)(cublasLtMatmulDesc_t *, int, int);
  cublasStatus_t (*DescDestroy)(cublasLtMatmulDesc_t);
  cublasStatus_t (*DescSet)(cublasLtMatmulDesc_t, int, const void *, size_t);
  cublasStatus_t (*LayoutCreate)(cublasLtMatrixLayout_t *, int, uint64_t, uint64_t, int64_t);
  cublasStatus_t (*LayoutDestroy)(cublasLtMatrixLayout_t);
  cublasStatus_t (*LayoutSet)(cublasLtMatrixLayout_t, int, const void *, size_t);
  cublasStatus_t (*PrefCreate)(cublasLtMatmulPreference_t *);
  cublasStatus_t (*PrefDestroy)(cublasLtMatmulPreference_t);
  cublasStatus_t (*PrefSet)(cublasLtMatmulPreference_t, int, const void *, size_t);
  cublasStatus_t (*Heuristic)(cublasLtHandle_t, cublasLtMatmulDesc_t, cublasLtMatrixLayout_t, cublasLtMatrixLayout_t,
                              cublasLtMatrixLayout_t, cublasLtMatrixLayout_t, cublasLtMatmulPreference_t, int,
                              cublasLtMatmulHeuristicResult_t *, int *);
  cublasStatus_t (*Matmul)(cublasLtHandle_t, cublasLtMatmulDesc_t, const void *, const void *, cublasLtMatrixLayout_t,
                           const void *, cublasLtMatrixLayout_t, const void *, const void *, cublasLtMatrixLayout_t, void *,
                           cublasLtMatrixLayout_t, const cublasLtMatmulAlgo_t *, void *, size_t, CUstream);
  cublasLtHandle_t handle;
} lt;
static pthread_once_t once = PTHREAD_ONCE_INIT;
static char lt_error[512];

static void load(void) {
  static const char *const names[] = {
      "libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so.11", "libcublasLt.so",
#ifdef GRADC_CUDA_LIBDIR
      GRADC_CUDA_LIBDIR "/libcublasLt.so",
#endif
      "/usr/local/cuda/lib64/libcublasLt.so",
  };
  void *h = NULL;
  for (size_t i = 0; i < sizeof names / sizeof names[0] && !h; i++) h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    snprintf(lt_error, sizeof lt_error, "cuBLASLt not found (libcublasLt.so): the CUDA target runs GEMMs with it");
    return;
  }
  struct {
    void **slot;
    const char *name;
  } syms[] = {
      {(void **)&lt.Create, "cublasLtCreate"},
      {(void **)&lt.Destroy, "cublasLtDestroy"},
      {(void **)&lt.DescCreate, "cublasLtMatmulDescCreate"},
      {(void **)&lt.DescDestroy, "cublasLtMatmulDescDestroy"},
      {(void **)&lt.DescSet, "cublasLtMatmulDescSetAttribute"},
      {(void **)&lt.LayoutCreate, "cublasLtMatrixLayoutCreate"},
      {(void **)&lt.LayoutDestroy, "cublasLtMatrixLayoutDestroy"},
      {(void **)&lt.LayoutSet, "cublasLtMatrixLayoutSetAttribute"},
      {(void **)&lt.PrefCreate, "cublasLtMatmulPreferenceCreate"},
      {(void **)&lt.PrefDestroy, "cublasLtMatmulPreferenceDestroy"},
      {(void **)&lt.PrefSet, "cublasLtMatmulPreferenceSetAttribute"},
      {(void **)&lt.Heuristic, "cublasLtMatmulAlgoGetHeuristic"},
      {(void **)&lt.Matmul, "cublasLtMatmul"},
  };
  for (size_t i = 0; i < sizeof syms / sizeof syms[0]; i++) {
    *syms[i].slot = dlsym(h, syms[i].name);
    if (!*syms[i].slot) {
      snprintf(lt_error, sizeof lt_error, "cuBLASLt: the library has no %s", syms[i].name);
      return;
    }
  }
  cublasStatus_t s = lt.Create(&lt.handle);
  if (s != 0) snprintf(lt_error, sizeof lt_error, "cuBLASLt: cublasLtCreate failed (status %d)", s);
}

static bool lt_check(cublasStatus_t s, const char *what, const IrOp *op, char *err, size_t errlen) {
  if (s == 0) return true;
  if (err && errlen) {
    if (op && op->loc.file)
      snprintf(err, errlen, "cuBLASLt: %s failed (status %d) for the matmul at %s:%d:%d", what, s, op->loc.file,
               op->loc.line, op->loc.col);
    else
      snprintf(err, errlen, "cuBLASLt: %s failed (status %d)", what, s);
  }
  return false;
}

struct CudaGemm {
  CudaGemmDesc d;
  cublasLtMatmulDesc_t desc;
  cublasLtMatrixLayout_t la, lb, lc; /* cuBLASLt's A (our B), B (our A), C = D */
  cublasLtMatmulAlgo_t algo;
  CUdeviceptr arena;
  CUdeviceptr workspace; /* shared by all (only [0] owns it) */
  bool owns_workspace;
};

/* The alignment (a power of two, at most 256: what cuBLASLt assumes unless
 * told otherwise) that every byte offset in off[0..n) keeps from an
 * aligned base. */
static uint32_t alignment(const int64_t *off, int64_t n) {
  uint32_t a = 256;
  for (int64_t i = 0; i < n; i++)
    while (a > 1 && off[i] % a != 0) a /= 2;
  return a;
}

static int data_type(IrDType dt) {
  switch (dt) {
  case IR_DT_F64: return R_64F;
  case IR_DT_F16: return R_16F;
  case IR_DT_BF16: return R_16BF;
  case IR_DT_F32:
  case IR_DT_I32:
  case IR_DT_BOOL: return R_32F;
  }
  return R_32F;
}

void cuda_gemm_desc_free(CudaGemmDesc *d) {
  free(d->aoff);
  free(d->boff);
  free(d->coff);
  d->aoff = d->boff = d->coff = NULL;
}

/* The largest group of consecutive batches (nb, the last batch axis's,
 * or 1) in which every operand's offsets step by one stride, the same in
 * every group: one strided-batch call per group. */
static int64_t batch_group(const RtGemmPlan *g, int64_t last, int64_t *sa, int64_t *sb, int64_t *sc) {
  int64_t cand[3] = {g->nb, last, 1};
  for (int c = 0; c < 3; c++) {
    int64_t L = cand[c];
    if (L < 1 || g->nb % L != 0) continue;
    *sa = L > 1 ? g->aoff[1] - g->aoff[0] : 0;
    *sb = L > 1 ? g->boff[1] - g->boff[0] : 0;
    *sc = L > 1 ? g->coff[1] - g->coff[0] : 0;
    bool ok = true;
    for (int64_t t = 0; t < g->nb && ok; t++) {
      int64_t i = t % L, base = t - i;
      ok = g->aoff[t] - g->aoff[base] == i * *sa && g->boff[t] - g->boff[base] == i * *sb &&
           g->coff[t] - g->coff[base] == i * *sc;
    }
    if (ok) return L;
  }
  return 1;
}

bool cuda_gemm_describe(const KpViews *vs, const IrOp *op, bool tf32, CudaGemmDesc *d, char *err, size_t errlen) {
  memset(d, 0, sizeof *d);
  d->op = op;
  IrDType dt = op->args[0]->type.dtype;
  if (!ir_dtype_is_float(dt) || op->args[1]->type.dtype != dt || op->args[0]->type.shape.rank < 1 ||
      op->args[1]->type.shape.rank < 1)
    return rt_op_fail(err, errlen, op, "needs float operands of one dtype, of rank >= 1");
  RtGemmPlan g;
  bool ok = dt == IR_DT_F32 || dt == IR_DT_F64 ? rt_gemm_plan_views(vs, op, &g, err, errlen)
                                               : rt_gemm_plan_ir(op, true, &g, err, errlen);
  if (ok && (g.M > INT32_MAX || g.N > INT32_MAX || g.K > INT32_MAX))
    ok = rt_op_fail(err, errlen, op, "is too large for cuBLASLt (a dimension over 2^31)");
  if (!ok) {
    rt_gemm_plan_free(&g);
    return false;
  }
  d->dbl = dt == IR_DT_F64;
  d->accumulate = g.c->storage == IR_STORE_GRAD;
  int64_t es = (int64_t)ir_dtype_size(dt), cs = d->accumulate ? (d->dbl ? 8 : 4) : es;
  d->compute = d->dbl ? COMPUTE_64F : dt == IR_DT_F32 && tf32 ? COMPUTE_32F_FAST_TF32 : COMPUTE_32F;
  d->scale = d->dbl ? R_64F : R_32F;
  d->in = data_type(dt);
  d->out = d->accumulate ? (d->dbl ? R_64F : R_32F) : d->in;
  /* Column-major, a row-major matrix X with rows ld apart is X^T (ld); one
   * with unit stride down its columns is X itself.  So when C is stored
   * by rows, cuBLASLt computes C^T = B^T A^T (its A is our B); when C is
   * stored by columns, C = A B.  A stored matrix whose shape is not the
   * one cuBLASLt needs there gets the transpose op. */
  CudaGemmMat ma = g.ta ? (CudaGemmMat){(uint64_t)g.M, (uint64_t)g.K, g.lda, 0}
                        : (CudaGemmMat){(uint64_t)g.K, (uint64_t)g.M, g.lda, 0}; /* A or A^T as stored */
  CudaGemmMat mb = g.tb ? (CudaGemmMat){(uint64_t)g.K, (uint64_t)g.N, g.ldb, 0}
                        : (CudaGemmMat){(uint64_t)g.N, (uint64_t)g.K, g.ldb, 0};
  const IrValue *ra, *rb;
  const int64_t *oa, *ob;
  if (!g.tc) { /* C^T (N x M) = B^T A^T */
    d->a = mb, d->opa = g.tb ? OP_T : OP_N, ra = g.b, oa = g.boff;
    d->b = ma, d->opb = g.ta ? OP_T : OP_N, rb = g.a, ob = g.aoff;
    d->c = (CudaGemmMat){(uint64_t)g.N, (uint64_t)g.M, g.ldc, 0};
    d->m = g.N, d->n = g.M;
  } else { /* C (M x N) = A B */
    d->a = ma, d->opa = g.ta ? OP_N : OP_T, ra = g.a, oa = g.aoff;
    d->b = mb, d->opb = g.tb ? OP_N : OP_T, rb = g.b, ob = g.boff;
    d->c = (CudaGemmMat){(uint64_t)g.M, (uint64_t)g.N, g.ldc, 0};
    d->m = g.M, d->n = g.N;
  }
  d->k = g.K;
  /* Batches: strided groups (strides in elements), one call per group. */
  int64_t sa = 0, sb = 0, sc = 0, last = 1;
  const IrShape *cshape = &op->result->type.shape;
  if (cshape->rank > 2 && g.nb > 1) last = cshape->dim[cshape->rank - 3];
  int64_t L = batch_group(&g, last, &sa, &sb, &sc);
  d->batch = L;
  d->a.stride = g.tc ? sa : sb;
  d->b.stride = g.tc ? sb : sa;
  d->c.stride = sc;
  d->calls = g.nb / L;
  d->aoff = calloc((size_t)d->calls, sizeof(int64_t));
  d->boff = calloc((size_t)d->calls, sizeof(int64_t));
  d->coff = calloc((size_t)d->calls, sizeof(int64_t));
  if (!d->aoff || !d->boff || !d->coff) abort();
  for (int64_t t = 0; t < d->calls; t++) {
    d->aoff[t] = ra->offset + oa[t * L] * es;
    d->boff[t] = rb->offset + ob[t * L] * es;
    d->coff[t] = g.c->offset + g.coff[t * L] * cs;
  }
  /* The alignment every pointer keeps (the arena's base from cuMemAlloc is
   * aligned; memplan's offsets to 64 bytes, views and batches less), so
   * that the heuristic picks an algorithm that works with them. */
  int64_t st[3] = {d->a.stride * es, d->b.stride * es, d->c.stride * cs};
  d->align_a = alignment(&st[0], 1);
  d->align_b = alignment(&st[1], 1);
  d->align_c = alignment(&st[2], 1);
  for (int64_t t = 0; t < d->calls; t++) {
    uint32_t x = alignment(&d->aoff[t], 1), y = alignment(&d->boff[t], 1), z = alignment(&d->coff[t], 1);
    if (x < d->align_a) d->align_a = x;
    if (y < d->align_b) d->align_b = y;
    if (z < d->align_c) d->align_c = z;
  }
  rt_gemm_plan_free(&g);
  return true;
}

static bool plan_one(CudaGemm *g, const KpViews *vs, const IrOp *op, CUdeviceptr arena, bool tf32, char *err,
                     size_t errlen) {
  CudaGemmDesc *d = &g->d;
  if (!cuda_gemm_describe(vs, op, tf32, d, err, errlen)) return false;
  g->arena = arena;
  if (!lt_check(lt.DescCreate(&g->desc, d->compute, d->scale), "cublasLtMatmulDescCreate", op, err, errlen) ||
      !lt_check(lt.DescSet(g->desc, DESC_TRANSA, &d->opa, sizeof d->opa), "setting TRANSA", op, err, errlen) ||
      !lt_check(lt.DescSet(g->desc, DESC_TRANSB, &d->opb, sizeof d->opb), "setting TRANSB", op, err, errlen) ||
      !lt_check(lt.LayoutCreate(&g->la, d->in, d->a.rows, d->a.cols, d->a.ld), "creating a layout", op, err, errlen) ||
      !lt_check(lt.LayoutCreate(&g->lb, d->in, d->b.rows, d->b.cols, d->b.ld), "creating a layout", op, err, errlen) ||
      !lt_check(lt.LayoutCreate(&g->lc, d->out, d->c.rows, d->c.cols, d->c.ld), "creating a layout", op, err, errlen))
    return false;
  if (d->batch > 1) {
    int32_t nb = (int32_t)d->batch;
    cublasLtMatrixLayout_t ls[3] = {g->la, g->lb, g->lc};
    const int64_t st[3] = {d->a.stride, d->b.stride, d->c.stride};
    for (int i = 0; i < 3; i++)
      if (!lt_check(lt.LayoutSet(ls[i], LAYOUT_BATCH_COUNT, &nb, sizeof nb), "batching", op, err, errlen) ||
          !lt_check(lt.LayoutSet(ls[i], LAYOUT_STRIDED_BATCH_OFFSET, &st[i], sizeof st[i]), "batching", op, err, errlen))
        return false;
  }
  cublasLtMatmulPreference_t pref;
  uint64_t ws = WORKSPACE;
  if (!lt_check(lt.PrefCreate(&pref), "cublasLtMatmulPreferenceCreate", op, err, errlen)) return false;
  bool ok = lt_check(lt.PrefSet(pref, PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws), "setting the workspace", op, err, errlen) &&
            lt_check(lt.PrefSet(pref, PREF_MIN_ALIGNMENT_A, &d->align_a, sizeof d->align_a), "alignments", op, err, errlen) &&
            lt_check(lt.PrefSet(pref, PREF_MIN_ALIGNMENT_B, &d->align_b, sizeof d->align_b), "alignments", op, err, errlen) &&
            lt_check(lt.PrefSet(pref, PREF_MIN_ALIGNMENT_C, &d->align_c, sizeof d->align_c), "alignments", op, err, errlen) &&
            lt_check(lt.PrefSet(pref, PREF_MIN_ALIGNMENT_D, &d->align_c, sizeof d->align_c), "alignments", op, err, errlen);
  cublasLtMatmulHeuristicResult_t res;
  int found = 0;
  memset(&res, 0, sizeof res);
  ok = ok && lt_check(lt.Heuristic(lt.handle, g->desc, g->la, g->lb, g->lc, g->lc, pref, 1, &res, &found),
                      "cublasLtMatmulAlgoGetHeuristic", op, err, errlen);
  lt.PrefDestroy(pref);
  if (ok && found < 1) {
    snprintf(err, errlen, "cuBLASLt has no algorithm for the matmul %s, %lld x %lld x %lld (batch %lld)",
             ir_dtype_name(op->args[0]->type.dtype), (long long)d->m, (long long)d->n, (long long)d->k,
             (long long)d->batch);
    ok = false;
  }
  g->algo = res.algo;
  return ok;
}

CudaGemm *cuda_gemm_plan(const IrFunc *f, const KpViews *vs, CUdeviceptr arena, bool allow_tf32, int *n, char *err,
                         size_t errlen) {
  int nr = 0;
  for (int i = 0; i < f->nops; i++) nr += f->ops[i]->opcode == IR_OP_MATMUL && f->ops[i]->group == 0;
  *n = 0;
  CudaGemm *g = calloc((size_t)nr + 1, sizeof *g);
  if (!g) abort();
  if (nr == 0) return g;
  pthread_once(&once, load);
  const CudaDriver *d = cuda_driver(err, errlen);
  bool ok = d != NULL;
  if (ok && !lt.handle) {
    snprintf(err, errlen, "%s", lt_error);
    ok = false;
  }
  if (ok) ok = cuda_check(d->MemAlloc(&g[0].workspace, WORKSPACE), "allocating the cuBLASLt workspace", err, errlen);
  g[0].owns_workspace = ok;
  for (int i = 0; ok && i < f->nops; i++) {
    const IrOp *op = f->ops[i];
    if (op->opcode != IR_OP_MATMUL || op->group != 0) continue;
    g[*n].workspace = g[0].workspace;
    ok = plan_one(&g[*n], vs, op, arena, allow_tf32, err, errlen);
    (*n)++;
  }
  if (!ok) {
    cuda_gemm_free(g, *n > 0 ? *n : 1);
    *n = 0;
    return NULL;
  }
  return g;
}

bool cuda_gemm_run(CudaGemm *gs, int i, CUstream s, char *err, size_t errlen) {
  CudaGemm *g = &gs[i];
  const CudaGemmDesc *d = &g->d;
  float one = 1.0f, zero = 0.0f;
  double oned = 1.0, zerod = 0.0;
  const void *alpha = d->dbl ? (const void *)&oned : (const void *)&one;
  const void *beta = d->accumulate ? alpha : d->dbl ? (const void *)&zerod : (const void *)&zero;
  for (int64_t t = 0; t < d->calls; t++) {
    CUdeviceptr a = g->arena + (CUdeviceptr)d->aoff[t], b = g->arena + (CUdeviceptr)d->boff[t];
    CUdeviceptr c = g->arena + (CUdeviceptr)d->coff[t];
    if (!lt_check(lt.Matmul(lt.handle, g->desc, alpha, (const void *)(uintptr_t)a, g->la, (const void *)(uintptr_t)b,
                            g->lb, beta, (const void *)(uintptr_t)c, g->lc, (void *)(uintptr_t)c, g->lc, &g->algo,
                            (void *)(uintptr_t)g->workspace, WORKSPACE, s),
                  "cublasLtMatmul", d->op, err, errlen))
      return false;
  }
  return true;
}

const IrOp *cuda_gemm_op(const CudaGemm *g, int i) { return g[i].d.op; }

void cuda_gemm_free(CudaGemm *g, int n) {
  if (!g) return;
  const CudaDriver *d = cuda_driver(NULL, 0);
  for (int i = 0; i < n; i++) {
    if (g[i].desc) lt.DescDestroy(g[i].desc);
    if (g[i].la) lt.LayoutDestroy(g[i].la);
    if (g[i].lb) lt.LayoutDestroy(g[i].lb);
    if (g[i].lc) lt.LayoutDestroy(g[i].lc);
    cuda_gemm_desc_free(&g[i].d);
  }
  if (d && g[0].owns_workspace) d->MemFree(g[0].workspace);
  free(g);
}
