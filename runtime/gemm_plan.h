/* gemm_plan.h - how a matmul op runs as BLAS calls, planned once for
 * every place that hands one to a BLAS: the CPU executor (exec.c), the
 * CUDA executor (cuda_blas.c, cuBLASLt) and the bench's GEMM floor
 * (gemm_floor.c), so that the three agree on shapes, transposes, batches
 * and error texts.  Also the few helpers of a memory-planned function
 * that the executors share (errors, storage roots, flag transposes).
 * Internal to runtime/; it belongs to the runtime module. */
#ifndef GRADC_GEMM_PLAN_H
#define GRADC_GEMM_PLAN_H

#include "codegen/codegen.h"
#include "ir/ir.h"

/* One matmul op as BLAS calls, in row-major terms (docs/BACKEND.md):
 * C (+)= op(A) op(B), nb matrices (torch.matmul's broadcast batch dims),
 * or one of nb*M rows when only the left operand is batched and its rows
 * and the result's run on as one matrix.  Each matrix has a unit stride
 * along its rows (t false: element (i, j) at i ld + j) or its columns (t
 * true: at i + j ld), at an element offset per batch from its root. */
typedef struct RtGemmPlan {
  const IrValue *a, *b, *c; /* the stored values (roots) A, B and C lie in */
  bool ta, tb, tc;          /* tc: C is written transposed (views only) */
  int64_t M, N, K;
  int64_t lda, ldb, ldc;
  int64_t rows;             /* rows of one result matrix: M before a left-only batch is folded in */
  int64_t nb;               /* BLAS calls */
  int64_t *aoff, *boff, *coff; /* per call: element offset of its A, B and C (malloc'd) */
  /* rt_gemm_plan_ir only: the result's and the operands' batch dims (as
   * before a fold) and how many distinct A and B matrices are read. */
  IrShape batch, abatch, bbatch;
  int64_t na, nbb;
} RtGemmPlan;

/* f32 and f64: operands and result are strided views of stored values
 * (codegen/kernel.c's kp_views_find: a stored value whole, a group-0
 * transpose as a flag, q read out of qkv, heads written into [B, T, C]).
 * Rank-1 operands become a row or a column.  False with the error (a view
 * that is not strided or has no storage, mismatched sizes) in err. */
bool rt_gemm_plan_views(const KpViews *vs, const IrOp *op, RtGemmPlan *g, char *err, size_t n);
/* From the IR alone (bf16 and f16, and the floor): contiguous operands, a
 * group-0 transpose of the last two axes as a flag, rank-1 operands as a
 * row or a column, broadcast batch dims.  With `stored`, the operands and
 * the result must have storage (run memplan).  Inner dimensions and the
 * result's size are not checked.  False with the error in err. */
bool rt_gemm_plan_ir(const IrOp *op, bool stored, RtGemmPlan *g, char *err, size_t n);
/* Frees the offsets (a plan that failed included). */
void rt_gemm_plan_free(RtGemmPlan *g);
/* out[t]: which of an operand's batch matrices (batch dims ob) call t of
 * a batch of shape `batch` reads; broadcast dims (size 1) repeat theirs. */
void rt_gemm_batch_index(const IrShape *batch, const IrShape *ob, int64_t *out);

/* A plan's nb matrices as a grid of n1 x n2: matrix t = o*n2 + i of A
 * (B, C: k = 1, 2) at off[k][0] + o*s1[k] + i*s2[k], a stride 0 where
 * every o (i) reads one matrix; n2 = 1 where one level does (attention's
 * heads as columns of [B, T, C] need two: C/NH apart within a sample,
 * T*C between samples).  False when the offsets are no such grid, a
 * stride is negative, or nb is 1.  What lets a batch run as one BLAS call (gemm.h's batch and
 * outer levels). */
typedef struct RtGemmGrid {
  int64_t n1, n2;
  int64_t s1[3], s2[3];
} RtGemmGrid;
bool rt_gemm_grid(const int64_t *const off[3], int64_t nb, RtGemmGrid *g);

/* ------------------------------------------------------------------ */
/* Helpers of the executors                                            */
/* ------------------------------------------------------------------ */
/* A permute of the last two axes left in group 0 with no storage: memplan
 * made it a flag of the GEMMs that read it. */
bool rt_is_flag_permute(const IrValue *v);
/* The value whose bytes v uses (through reshape aliases). */
const IrValue *rt_storage_root(const IrValue *v);
/* false, with "file:line:col: 'op' what" (or "'op' what") in err. */
bool rt_op_fail(char *err, size_t n, const IrOp *op, const char *what);

#endif
