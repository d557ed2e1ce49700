/* gemm.h - the CPU back end's GEMM providers (docs/BACKEND.md "GEMM
 * providers"): one interface, a struct of function pointers, over the
 * libraries that multiply matrices (oneDNN's matmul primitive, OpenBLAS,
 * BLIS), and the choice among them per host, by measurement.
 *
 * A provider plans one GEMM shape once (cpu_gemm_plan; oneDNN builds its
 * primitive there, from a cache keyed by the shape) and runs the plan on
 * any operands of that shape, from any thread, concurrently.  The CPU
 * executor (exec.c) plans every piece of every GEMM when it builds a
 * program; the bench's GEMM floor (gemm_floor.c) and the tests plan
 * whole GEMMs.  Internal to runtime/cpu/. */
#ifndef GRADC_CPU_GEMM_H
#define GRADC_CPU_GEMM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Operand types: f32 and f64 multiply in their type; bf16 multiplies
 * bf16 A and B (raw uint16_t bits) into an f32 C, accumulating in f32,
 * or into a bf16 C (CpuGemmDesc.c_bf16: the f32 sum rounded to nearest
 * even, as a cast would round it). */
typedef enum { CPU_GEMM_F32, CPU_GEMM_F64, CPU_GEMM_BF16 } CpuGemmType;

/* What runs after the product, on each element of C (oneDNN post-ops;
 * the other providers run it as a loop over the finished block):
 *   BIAS       C = AB + bias[j]                        (bias: N f32)
 *   BIAS_GELU  C = gelu_tanh(AB + bias[j])
 *   BIAS_RELU  C = relu(AB + bias[j])                  (NaN stays NaN)
 *   RESIDUAL   C = AB + R[i, j]                        (R: ldr apart, f32)
 * Accumulation (beta = 1, CpuGemmDesc.accumulate) adds C's old value to
 * the epilogue's result: C += epilogue(AB) (oneDNN's sum post-op last). */
typedef enum { CPU_EPI_NONE, CPU_EPI_BIAS, CPU_EPI_BIAS_GELU, CPU_EPI_BIAS_RELU, CPU_EPI_RESIDUAL } CpuGemmEpilogue;

/* C[o][t] (+)= op(A[o][t]) op(B[o][t]) for o < outer, t < batch,
 * row-major: element (i, j) of a matrix X with leading dimension ldx is
 * at i*ldx + j, and op(X) is X transposed when tx.  A[o][t] starts
 * o*outer_a + t*stride_a elements after A[0][0] (a stride 0: every o, or
 * every t, reads one A), likewise B and C.  Two levels, so that one call
 * multiplies attention's heads of every sample where the heads are
 * columns of a [B, T, C] tensor (strides C/NH within a sample, T*C
 * between samples). */
typedef struct CpuGemmDesc {
  CpuGemmType type;
  bool ta, tb;
  bool accumulate; /* beta = 1 */
  bool c_bf16;     /* bf16 only: C holds bf16, written once (no accumulate, no epilogue) */
  int64_t M, N, K;
  int64_t lda, ldb, ldc;
  int64_t batch, stride_a, stride_b, stride_c; /* batch 0 means 1 */
  int64_t outer, outer_a, outer_b, outer_c;     /* outer 0 means 1 */
  int threads;     /* threads one call may use: 1 inside the executor's pool pieces */
  CpuGemmEpilogue epilogue;
  int64_t ldr;     /* RESIDUAL: the residual's leading dimension */
} CpuGemmDesc;

typedef struct CpuGemm CpuGemm; /* a planned shape; owned by whoever planned it */

/* Matrices of d's batch (outer x batch), and the element offsets of
 * matrix u (outer-major: u = o*batch + t) of A, B and C: for the
 * providers that loop over a batch. */
int64_t cpu_gemm_count(const CpuGemmDesc *d);
void cpu_gemm_offsets(const CpuGemmDesc *d, int64_t u, int64_t *a, int64_t *b, int64_t *c);

/* A provider.  Every member is set; `usable` says why one cannot run here
 * (not built, its library's CPU detection is wrong for this CPU). */
typedef struct CpuGemmProvider {
  const char *name; /* what GRADC_GEMM names it by */
  bool (*usable)(char *why, size_t n);
  /* Its library and version, "OpenBLAS 0.3.21 Zen" (part of the
   * selection cache's key and of messages). */
  void (*version)(char *buf, size_t n);
  /* The plan's private part (NULL with a message: a shape or type it
   * cannot run); CpuGemm wraps it. */
  void *(*plan)(const CpuGemmDesc *d, char *err, size_t n);
  /* Run: a, b, c the first matrices; extra the epilogue's bias or residual. */
  void (*run)(void *plan, const CpuGemmDesc *d, const void *a, const void *b, void *c, const float *extra);
  void (*free)(void *plan);
  /* The library's kernel a plan runs, where the provider picks among
   * several (oneDNN's implementation name: "brg:avx512_core",
   * "gemm:jit"); NULL where the provider is its own one kernel. */
  const char *(*kernel)(const void *plan);
} CpuGemmProvider;

/* ------------------------------------------------------------------ */
/* gemm.c: the registry, plans, and the choice per host                 */
/* ------------------------------------------------------------------ */
/* The providers this build has, in the order of preference on a tie:
 * onednn, openblas, blis (as built), or the plain loops of a build
 * without any of them ("loops"). */
int cpu_gemm_providers(const CpuGemmProvider *const **out);
/* Whether p can run here: it is usable, or no provider of the build is
 * and p is the one chosen as the last resort (the first; a warning says
 * so when the host is measured). */
bool cpu_gemm_runnable(const CpuGemmProvider *p, char *why, size_t n);
/* By name, or NULL. */
const CpuGemmProvider *cpu_gemm_provider_find(const char *name);

/* Plan d on provider p: NULL with a message in err.  A bf16 or epilogue
 * plan that p cannot run itself runs through p's f32 plan (widening the
 * operands into per-call scratch, the epilogue as a loop). */
CpuGemm *cpu_gemm_plan(const CpuGemmProvider *p, const CpuGemmDesc *d, char *err, size_t n);
void cpu_gemm_run(const CpuGemm *g, const void *a, const void *b, void *c, const float *extra);
void cpu_gemm_free(CpuGemm *g);
const CpuGemmDesc *cpu_gemm_desc(const CpuGemm *g);
/* Whether the provider runs g's epilogue itself (a fused post-op). */
bool cpu_gemm_fused(const CpuGemm *g);
/* The kernel that runs g: the provider's kernel (CpuGemmProvider.kernel),
 * else the provider's name. */
const char *cpu_gemm_kernel(const CpuGemm *g);

/* The provider for this process: GRADC_GEMM if set (a name the build
 * does not have, or one not usable here, is a user error in err), else
 * the host's choice from the cache under cache_dir (NULL: measure
 * without caching), measuring the usable providers the first time the
 * host (CPU identity and libraries' versions) is seen.  Decided once per
 * process and cache directory; thread-safe. */
const CpuGemmProvider *cpu_gemm_select(const char *cache_dir, char *err, size_t n);
/* GRADC_GEMM unset, or naming a provider of this build; false with the
 * message cpu_gemm_select would give. */
bool cpu_gemm_check_env(char *err, size_t n);
/* The measurement behind the choice: each usable provider's time in ms
 * over the selection's shapes (ms[i] < 0: not usable, why[i] says why),
 * in cpu_gemm_providers order.  Returns the index of the fastest. */
int cpu_gemm_measure(double *ms, char (*why)[256], int nmax);
/* The selection cache's key for this host (CPU identity and the
 * providers' versions), and the entry's kind in the cache directory. */
uint64_t cpu_gemm_host_key(void);
#define CPU_GEMM_CACHE_KIND "gemm-provider"
/* The CPU as the cache key sees it: vendor, family, model, stepping,
 * brand and the vector features that matter ("AuthenticAMD 25/1/1 AMD
 * EPYC; avx2 fma"). */
void cpu_gemm_cpu_id(char *buf, size_t n);
/* Whether bf16 GEMMs on p are faster as f32 GEMMs of operands widened
 * once by the caller than as p's own bf16 products (measured once per
 * process and provider over the selection's shapes; GRADC_GEMM_BF16=
 * native or widen decides instead).  The results agree: bf16 products
 * are exact in f32 and both accumulate in f32. */
bool cpu_gemm_bf16_widen(const CpuGemmProvider *p);
/* Whether this CPU has AVX2 (cpuid), for the providers' own checks. */
bool cpu_gemm_has_avx2(void);

#endif
