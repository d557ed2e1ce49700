/* cuda_blas.c - the step's GEMMs through cuBLASLt (libcublasLt.so, loaded
 * with dlopen on first use).  Each matmul op is planned once as the CPU
 * executor plans it (runtime/gemm_floor.c's rt_gemm_list: transposes as
 * flags, a left-only batch folded into M, beta = 1 into f32 gradient
 * buffers) and handed to cuBLASLt with its layouts, a heuristic algorithm
 * and a preallocated workspace (so the calls can be captured in a CUDA
 * graph).  Row-major C = A B is computed as column-major C^T = B^T A^T.
 * f32 runs without TF32 unless allowed (DESIGN.md §2: f32 means f32);
 * bf16 and f16 accumulate in f32; f64 in f64. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "cuda.h"
#include "gemm_floor.h"

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
  const IrOp *op;
  cublasLtMatmulDesc_t desc;
  cublasLtMatrixLayout_t la, lb, lc; /* cuBLASLt's A (our B), B (our A), C = D */
  cublasLtMatmulAlgo_t algo;
  CUdeviceptr a, b, c;   /* our A, B, C (batch 0) */
  int64_t calls;         /* 1 (strided batch) or one per batch */
  int64_t *aoff, *boff;  /* per call: byte offsets of its A and B (calls > 1) */
  int64_t cstride;       /* bytes between results of consecutive calls */
  bool dbl;
  bool accumulate;
  CUdeviceptr workspace; /* shared by all (only [0] owns it) */
  bool owns_workspace;
};

static const IrValue *storage_root(const IrValue *v) {
  while (v->storage == IR_STORE_ALIAS && v->def && v->def->opcode == IR_OP_RESHAPE) v = v->def->args[0];
  return v;
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

/* Whether idx[0..n) is idx[0] + t * step; the step into *step. */
static bool progression(const int64_t *idx, int64_t n, int64_t *step) {
  *step = n > 1 ? idx[1] - idx[0] : 0;
  for (int64_t t = 1; t < n; t++)
    if (idx[t] - idx[t - 1] != *step) return false;
  return true;
}

static bool plan_one(CudaGemm *g, const RtGemm *r, CUdeviceptr arena, bool tf32, char *err, size_t errlen) {
  const IrOp *op = r->op;
  g->op = op;
  IrDType dt = op->args[0]->type.dtype;
  const IrValue *A = op->args[0], *B = op->args[1];
  if (r->ta) A = A->def->args[0];
  if (r->tb) B = B->def->args[0];
  A = storage_root(A), B = storage_root(B);
  const IrValue *C = storage_root(op->result);
  if (A->storage == IR_STORE_NONE || B->storage == IR_STORE_NONE || C->storage == IR_STORE_NONE) {
    snprintf(err, errlen, "a matmul has an operand or result without storage (run memplan)");
    return false;
  }
  g->dbl = dt == IR_DT_F64;
  g->accumulate = r->accumulate;
  size_t es = ir_dtype_size(dt), cs = g->accumulate ? (g->dbl ? 8 : 4) : es;
  g->a = arena + (CUdeviceptr)A->offset;
  g->b = arena + (CUdeviceptr)B->offset;
  g->c = arena + (CUdeviceptr)C->offset;
  int64_t M = r->M, N = r->N, K = r->K;
  int64_t da = 0, db = 0;
  bool strided = r->nb > 1 && progression(r->aidx, r->nb, &da) && progression(r->bidx, r->nb, &db);
  int64_t batch = strided ? r->nb : 1;
  g->calls = strided || r->nb <= 1 ? 1 : r->nb;
  g->cstride = M * N * (int64_t)cs;
  if (g->calls > 1) {
    g->aoff = calloc((size_t)g->calls, sizeof(int64_t));
    g->boff = calloc((size_t)g->calls, sizeof(int64_t));
    if (!g->aoff || !g->boff) abort();
    for (int64_t t = 0; t < g->calls; t++) {
      g->aoff[t] = r->aidx[t] * M * K * (int64_t)es;
      g->boff[t] = r->bidx[t] * K * N * (int64_t)es;
    }
  }
  int ct = g->dbl ? COMPUTE_64F : dt == IR_DT_F32 && tf32 ? COMPUTE_32F_FAST_TF32 : COMPUTE_32F;
  int st = g->dbl ? R_64F : R_32F;
  int ta = r->tb ? OP_T : OP_N, tb = r->ta ? OP_T : OP_N; /* cuBLASLt's A is our B */
  int in = data_type(dt), out = g->accumulate ? (g->dbl ? R_64F : R_32F) : in;
  if (!lt_check(lt.DescCreate(&g->desc, ct, st), "cublasLtMatmulDescCreate", op, err, errlen) ||
      !lt_check(lt.DescSet(g->desc, DESC_TRANSA, &ta, sizeof ta), "setting TRANSA", op, err, errlen) ||
      !lt_check(lt.DescSet(g->desc, DESC_TRANSB, &tb, sizeof tb), "setting TRANSB", op, err, errlen))
    return false;
  /* Stored shapes, column-major: our B[K,N] row-major is N x K (ld N), or
   * K x N (ld K) when it is stored transposed; likewise our A. */
  if (!lt_check(r->tb ? lt.LayoutCreate(&g->la, in, (uint64_t)K, (uint64_t)N, K)
                      : lt.LayoutCreate(&g->la, in, (uint64_t)N, (uint64_t)K, N),
                "creating B's layout", op, err, errlen) ||
      !lt_check(r->ta ? lt.LayoutCreate(&g->lb, in, (uint64_t)M, (uint64_t)K, M)
                      : lt.LayoutCreate(&g->lb, in, (uint64_t)K, (uint64_t)M, K),
                "creating A's layout", op, err, errlen) ||
      !lt_check(lt.LayoutCreate(&g->lc, out, (uint64_t)N, (uint64_t)M, N), "creating C's layout", op, err, errlen))
    return false;
  if (batch > 1) {
    int32_t nb = (int32_t)batch;
    int64_t sa = db * K * N, sb = da * M * K, sc = M * N;
    if (!lt_check(lt.LayoutSet(g->la, LAYOUT_BATCH_COUNT, &nb, sizeof nb), "batching", op, err, errlen) ||
        !lt_check(lt.LayoutSet(g->la, LAYOUT_STRIDED_BATCH_OFFSET, &sa, sizeof sa), "batching", op, err, errlen) ||
        !lt_check(lt.LayoutSet(g->lb, LAYOUT_BATCH_COUNT, &nb, sizeof nb), "batching", op, err, errlen) ||
        !lt_check(lt.LayoutSet(g->lb, LAYOUT_STRIDED_BATCH_OFFSET, &sb, sizeof sb), "batching", op, err, errlen) ||
        !lt_check(lt.LayoutSet(g->lc, LAYOUT_BATCH_COUNT, &nb, sizeof nb), "batching", op, err, errlen) ||
        !lt_check(lt.LayoutSet(g->lc, LAYOUT_STRIDED_BATCH_OFFSET, &sc, sizeof sc), "batching", op, err, errlen))
      return false;
    /* the first batch's matrices */
    g->a += (CUdeviceptr)(r->aidx[0] * M * K * (int64_t)es);
    g->b += (CUdeviceptr)(r->bidx[0] * K * N * (int64_t)es);
  }
  cublasLtMatmulPreference_t pref;
  uint64_t ws = WORKSPACE;
  if (!lt_check(lt.PrefCreate(&pref), "cublasLtMatmulPreferenceCreate", op, err, errlen)) return false;
  bool ok = lt_check(lt.PrefSet(pref, PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws), "setting the workspace", op, err, errlen);
  cublasLtMatmulHeuristicResult_t res;
  int found = 0;
  memset(&res, 0, sizeof res);
  ok = ok && lt_check(lt.Heuristic(lt.handle, g->desc, g->la, g->lb, g->lc, g->lc, pref, 1, &res, &found),
                      "cublasLtMatmulAlgoGetHeuristic", op, err, errlen);
  lt.PrefDestroy(pref);
  if (ok && found < 1) {
    snprintf(err, errlen, "cuBLASLt has no algorithm for the matmul %s[%lld,%lld] x [%lld,%lld] (batch %lld)",
             ir_dtype_name(dt), (long long)M, (long long)K, (long long)K, (long long)N, (long long)r->nb);
    ok = false;
  }
  g->algo = res.algo;
  return ok;
}

CudaGemm *cuda_gemm_plan(const IrFunc *f, CUdeviceptr arena, bool allow_tf32, int *n, char *err, size_t errlen) {
  RtGemm *r;
  int nr = rt_gemm_list(f, &r);
  *n = 0;
  CudaGemm *g = calloc((size_t)nr + 1, sizeof *g);
  if (!g) abort();
  if (nr == 0) {
    rt_gemm_list_free(r, nr);
    return g;
  }
  pthread_once(&once, load);
  const CudaDriver *d = cuda_driver(err, errlen);
  bool ok = d != NULL;
  if (ok && !lt.handle) {
    snprintf(err, errlen, "%s", lt_error);
    ok = false;
  }
  if (ok) ok = cuda_check(d->MemAlloc(&g[0].workspace, WORKSPACE), "allocating the cuBLASLt workspace", err, errlen);
  g[0].owns_workspace = ok;
  for (int i = 0; ok && i < nr; i++) {
    g[i].workspace = g[0].workspace;
    ok = plan_one(&g[i], &r[i], arena, allow_tf32, err, errlen);
    *n = i + 1;
  }
  rt_gemm_list_free(r, nr);
  if (!ok) {
    cuda_gemm_free(g, *n > 0 ? *n : 1);
    *n = 0;
    return NULL;
  }
  return g;
}

bool cuda_gemm_run(CudaGemm *gs, int i, CUstream s, char *err, size_t errlen) {
  CudaGemm *g = &gs[i];
  float one = 1.0f, zero = 0.0f;
  double oned = 1.0, zerod = 0.0;
  const void *alpha = g->dbl ? (const void *)&oned : (const void *)&one;
  const void *beta = g->accumulate ? alpha : g->dbl ? (const void *)&zerod : (const void *)&zero;
  for (int64_t t = 0; t < g->calls; t++) {
    CUdeviceptr a = g->a + (CUdeviceptr)(g->calls > 1 ? g->aoff[t] : 0);
    CUdeviceptr b = g->b + (CUdeviceptr)(g->calls > 1 ? g->boff[t] : 0);
    CUdeviceptr c = g->c + (CUdeviceptr)(t * g->cstride);
    if (!lt_check(lt.Matmul(lt.handle, g->desc, alpha, (const void *)(uintptr_t)b, g->la, (const void *)(uintptr_t)a,
                            g->lb, beta, (const void *)(uintptr_t)c, g->lc, (void *)(uintptr_t)c, g->lc, &g->algo,
                            (void *)(uintptr_t)g->workspace, WORKSPACE, s),
                  "cublasLtMatmul", g->op, err, errlen))
      return false;
  }
  return true;
}

const IrOp *cuda_gemm_op(const CudaGemm *g, int i) { return g[i].op; }

void cuda_gemm_free(CudaGemm *g, int n) {
  if (!g) return;
  const CudaDriver *d = cuda_driver(NULL, 0);
  for (int i = 0; i < n; i++) {
    if (g[i].desc) lt.DescDestroy(g[i].desc);
    if (g[i].la) lt.LayoutDestroy(g[i].la);
    if (g[i].lb) lt.LayoutDestroy(g[i].lb);
    if (g[i].lc) lt.LayoutDestroy(g[i].lc);
    free(g[i].aoff);
    free(g[i].boff);
  }
  if (d && g[0].owns_workspace) d->MemFree(g[0].workspace);
  free(g);
}
