/* gemm_floor.h - a program's GEMMs, listed and timed alone (the
 * `gemm_floor_ms` figure of `gradc bench`, DESIGN.md §5).  Kept apart from
 * runtime.h so the bench tool can use it without touching the executor's
 * contract; it belongs to the runtime module. */
#ifndef GRADC_GEMM_FLOOR_H
#define GRADC_GEMM_FLOOR_H

#include "ir/ir.h"

/* One matmul op as the CPU executor hands it to the BLAS (docs/BACKEND.md):
 * row-major C[M,N] (+)= op(A)[M,K] op(B)[K,N], `nb` times (torch.matmul's
 * batch dims, broadcast), or once with nb*M rows when only the left operand
 * is batched and not transposed. */
typedef struct RtGemm {
  const IrOp *op;
  bool dbl;        /* f64 (dgemm) */
  bool bf16;       /* bf16 operands: the provider's bf16 GEMM where the executor uses it
                    * (cpu_gemm_bf16_widen), else sgemm as for f32 and f16 */
  bool c_bf16;     /* bf16: the result is bf16 (not a gradient buffer) */
  bool ta, tb;     /* an operand that is a group-0 permute of its last two axes (a flag) */
  bool accumulate; /* beta = 1: the result is a gradient buffer */
  int64_t M, N, K;
  int64_t nb;      /* BLAS calls for this op */
  int64_t na, nbb; /* distinct A and B matrices (broadcast batch dims) */
  int64_t *aidx, *bidx; /* per call: which A and which B matrix (malloc'd) */
} RtGemm;

/* Every matmul of f outside a kernel (every matmul before `fuse`), in
 * program order.  *out is malloc'd; free with rt_gemm_list_free.  Returns
 * the count. */
int rt_gemm_list(const IrFunc *f, RtGemm **out);
void rt_gemm_list_free(RtGemm *g, int n);
/* Floating-point operations of one pass over the list (2*M*N*K per call). */
double rt_gemm_flops(const RtGemm *g, int n);

/* Time the list alone through GEMM provider `provider` (by name: the
 * program's, cpu_program_gemm_provider) on `threads` threads (0: one per
 * core), each GEMM threaded by the provider: a window runs every GEMM
 * `gas` times, on buffers of the GEMMs' sizes filled with small random
 * values.  After `warmup` windows, `reps` windows are timed; ms gets each
 * window's wall time (reps entries).  False with a message (a provider
 * this build lacks, a shape it cannot plan). */
bool rt_gemm_floor(const RtGemm *g, int n, int gas, int threads, const char *provider, int warmup, int reps, double *ms,
                   char *err, size_t errlen);
/* The same in parts, so that a caller can time the floor between its own
 * runs: the plans and buffers (NULL with a message, as above), `reps`
 * windows after `warmup` (ms: reps entries), and freeing them. */
typedef struct RtGemmFloor RtGemmFloor;
RtGemmFloor *rt_gemm_floor_new(const RtGemm *g, int n, int gas, int threads, const char *provider, char *err,
                               size_t errlen);
void rt_gemm_floor_time(RtGemmFloor *fl, int warmup, int reps, double *ms);
void rt_gemm_floor_free(RtGemmFloor *fl);

/* Wall-clock milliseconds (CLOCK_MONOTONIC). */
double rt_now_ms(void);

#endif
