/* exec.c - the CPU executor (docs/BACKEND.md): runs one window of a
 * function after the CPU pipeline (fuse, memplan) in a single arena.
 *
 * cpu_program_new checks the planned function, compiles its kernels with
 * cg_llvm_compile, allocates the arena, stores the consts that group-0 ops
 * read, and turns the op list into a short program:
 *
 *   kernel   a compiled kernel over [0, iters), split across the pool
 *            (run inline on the calling thread when iters * cost is small)
 *   gemm     cblas_sgemm / cblas_dgemm as gemm_plan.c plans the matmul
 *            (torch.matmul semantics: 1-D operands, broadcast batch dims
 *            by a loop or folded into M when only the left operand has
 *            them, operands and results that are strided views of stored
 *            values: kp_views_find's group-0 transposes as flags, q read
 *            out of qkv, heads written into [B, T, C]), beta = 1 when the
 *            result is a gradient buffer; split over the pool, the BLAS
 *            single-threaded in each piece; the kernel after it as its
 *            epilogue where it is only a bias, bias + relu/gelu or
 *            residual add and the provider fuses it (plan_epilogues)
 *   copy     a collective on one rank
 *   loss     add the loss operand into its window loss
 *
 * reshape, const, window.sum, rng.state and grad need no work during a
 * micro-batch (rng.state's words are stored before each, step_store_rng).
 *
 * cpu_step_run runs a window: it checks and binds the tensors (window.c,
 * as every executor does), zeroes the gradient buffers but the parts a
 * store-first GEMM or generated product writes whole (plan_zeroing:
 * with beta = 0 or the product's store twin in micro-batch 0), copies
 * the params in unless the arena holds them
 * already (the caller's params generation, cpu_program_set_params_gen,
 * and the same tensors), stores the window sums (the interpreter's count
 * phase, step_store_window_sums, over the ops the program's count plan
 * found once; a window of one micro-batch on one rank only checks its
 * indices, step_check_indices, and its I_WSUM instructions copy the sums
 * from their operands in the step), then for each micro-batch copies its
 * input slices in and runs the program; at the end the gradients are read
 * out of their buffers.
 *
 * Artifacts (artifact.h's hook): cpu_program_save_objects stores the
 * kernels' object code, cpu_program_load_objects builds the program from
 * it without running code generation (no LLVM optimiser, no codegen).
 *
 * rt_backend_cpu, at the end, is the executor as a back end (backend.h). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "codegen/codegen.h"
#include "passes/passes.h"
#include "runtime/backend.h"
#include "runtime/io/artifact.h"
#include "runtime/comm/comm.h"
#include "runtime/gemm_plan.h"
#include "runtime/runtime.h"
#include "runtime/comm/trace.h"

#include "runtime/cpu/gemm.h"

/* Kernels smaller than this many element-visits run on the calling thread;
 * larger ones are split in chunks of about this size. */
#define INLINE_WORK 32768

/* ------------------------------------------------------------------ */
/* The program                                                         */
/* ------------------------------------------------------------------ */

typedef struct Gemm {
  IrDType dt;         /* operand dtype */
  IrDType cdt;        /* result buffer dtype (f32/f64 for a gradient buffer) */
  int64_t a, b, c;    /* byte offsets in the arena of the buffers A, B and C lie in */
  bool ta, tb, accumulate;
  bool store_first;   /* accumulate, but the window's first writer of all of C: beta = 0 in micro-batch 0 */
  bool tc;            /* C is written transposed (a view with unit stride down its columns) */
  int64_t M, N, K, lda, ldb, ldc;
  int64_t nb;         /* GEMMs in the batch loop */
  int64_t *aoff, *boff, *coff; /* per batch: element offset of its A, B and C matrices */
  int aarg, barg;     /* A (B) read in place from the caller's tensor of this arg (CpuProgram.argbase), or -1 */
  /* How it runs (gemm_schedule): inline, or a grid of pm x pn pieces of
   * mblk x nblk per batch matrix on the pool; the provider's plan of
   * every piece shape and beta (gemm_plan_pieces). */
  bool inline_run;
  int threads; /* the provider's threads per call: 1, or all of them (GRADC_GEMM_THREADS=library) */
  int64_t pm, pn, mblk, nblk;
  /* A batch whose matrices lie on a grid (rt_gemm_grid) runs as a few
   * provider calls, bo rows of the grid each (gemm_group); bo 0: a call
   * per matrix. */
  RtGemmGrid grid;
  int64_t bo;
  CpuGemm *plans[8];
  int nplans;
  bool widen; /* bf16/f16 A and B widened to f32 scratch first (f16 always; bf16 where f32 is faster) */
  bool pack_a; /* each row block of a transposed A copied dense before its piece runs (gemm_schedule) */
  const IrValue *aroot, *broot; /* the stored values A and B are read from (plan_epilogues' overlap checks) */
  /* The kernel after it that the provider runs as it writes C
   * (plan_epilogues): the epilogue, the byte offset of its bias or
   * residual in the arena, the residual's leading dimension, and the
   * kernel's instruction (-1: none). */
  CpuGemmEpilogue epi;
  int64_t extra, ldr;
  int absorbs;
} Gemm;

typedef enum {
  I_KERNEL,
  I_GEMM,
  I_COPY,
  I_WSUM, /* a window sum from its operand: a copy, in a window of one micro-batch on one rank only */
  I_LOSS,
  I_START,
  I_WAIT,
  I_BUCKET_START,
  I_BUCKET_WAIT,
  I_RANK,
  I_STATE
} InstrKind;

typedef struct Instr {
  InstrKind kind;
  const IrOp *op;
  const CgKernel *kernel;
  Gemm gemm;
  int64_t src, dst, bytes; /* I_COPY, I_WSUM, I_START (send, recv), I_WAIT (dst); I_LOSS, I_STATE: src = offset of the operand */
  int slot;                /* I_START, I_WAIT: the StepColl; I_BUCKET_*: the bucket */
  bool f64;                /* I_START: f64 elements (else f32) */
  bool issue;              /* I_BUCKET_*: this op starts / waits for the bucket (the others do nothing) */
  bool absorbed;           /* I_KERNEL: its GEMM runs it as an epilogue (plan_epilogues): nothing to do */
  bool pair;               /* I_KERNEL: a product run beside the next one, each by one thread (plan_pairs) */
  /* I_KERNEL, a generated product into a gradient buffer: its twin that
   * stores C rather than adding to it, and whether micro-batch 0 runs it
   * (plan_zeroing: then nothing zeroes those bytes). */
  const CgKernel *twin;
  bool store_first;
} Instr;

/* A data-parallel gradient bucket (dp-reduce's last=true all-reduces): in
 * the window's last micro-batch its gradient buffers are all-reduced in
 * place, one collective per contiguous run of buffers of one dtype, started
 * at the bucket's last start and waited for at its first wait; in the
 * other micro-batches its ops do nothing.  A bucket whose waits are not all
 * after its starts (no overlap) is one of these per start/wait pair. */
typedef struct BucketRun {
  int64_t lo, hi;  /* byte range in the arena */
  bool f64;
  CommReq *req;
  bool done;       /* comm_test saw it complete */
} BucketRun;

typedef struct Bucket {
  const IrOp *op;  /* a start (its group and ranks) */
  BucketRun *runs;
  int nruns;
  bool open;       /* started, not yet waited for */
} Bucket;

struct CpuProgram {
  IrFunc *f;
  CgModule *cg;
  Pool *pool;
  int threads;
  int gas, micro; /* the window running: its micro-batches, and the one running (I_STATE) */
  const CpuGemmProvider *gemm; /* who multiplies (gemm.h) */
  char *arena;
  Instr *code;
  int ncode;
  StepGradBuf *grads;
  int ngrads;
  InterpCountPlan *count; /* the window's count phase (window sums, index checks) */
  /* Every window sum is an I_WSUM (its operand has bytes in the step), so
   * a window of one micro-batch on one rank takes them from the step
   * (sums_here) and its count phase only checks indices. */
  bool sums_in_step, sums_here;
  bool *reduced; /* per gradient buffer: a data-parallel bucket all-reduces it (its `grad` reads a last=true wait) */
  /* What the window zeroes: the gradient buffers less the parts a
   * store-first GEMM or product writes whole (byte ranges in the arena). */
  int64_t (*zero)[2];
  int nzero;
  /* Params already in the arena: the generation the caller gave for the
   * next window (cpu_program_set_params_gen; 0 = unknown), the one the
   * arena holds, and the tensors it was copied from. */
  uint64_t params_gen, arena_gen;
  bool no_grads; /* the next window's gradients stay in the arena (cpu_program_skip_grads) */
  const void **arena_src;
  /* Args only GEMMs read (plan_direct_args): this micro-batch's elements,
   * in the caller's tensor when its dtype is the arg's, else in the arena. */
  bool *direct;
  const char **argbase;
  KpViews views; /* what GEMMs read and write in place (codegen/kernel.c) */
  /* Collectives: one StepColl per start (tensor-parallel and other
   * collectives that run in every micro-batch), the buckets. */
  StepColl *colls;
  bool *coll_open; /* started, not yet waited for */
  int ncolls;
  Bucket *buckets;
  int nbuckets;
  /* A result of an earlier window handed back (cpu_program_recycle): the
   * next window reads its gradients into these arrays instead of fresh
   * ones (no allocation, zeroing or page faults per window). */
  StepResult spare;
  bool have_spare;
  int spare_gas; /* the window the spare result was laid out for (its outputs' sizes depend on it) */
  /* bf16 and f16 GEMMs (low_scratch): their f32 products before they are
   * rounded into a bf16/f16 result, and their operands widened to f32. */
  float *low;
  int64_t nlow; /* floats */
};

/* The arena is not zeroed: every byte a step reads is written first in
 * the step (activations by their producers, a GEMM's C with beta = 0 is
 * not read) or per window (gradient buffers, params, inputs, window sums),
 * and consts are stored at start-up.  Zeroing it up front cost a large
 * model tens of milliseconds of start-up and all its resident memory at
 * once.  It comes from malloc (on huge pages from 2 MiB on:
 * mem_alloc_huge), not a private mapping: freeing a large block is what
 * raises glibc's mmap threshold, without which every step's
 * megabyte-sized result arrays were mapped, faulted in and unmapped again
 * (a tenth of a small model's step). */
static char *arena_new(int64_t size) { return mem_alloc_huge((size_t)size + 64, false); }

/* Bytes into the arena (window sums, consts). */
static bool store(void *ctx, int64_t offset, const void *src, size_t n, char *err, size_t errlen) {
  memcpy((char *)ctx + offset, src, n);
  return true;
}

static bool in_group0(const IrOp *op, void *ctx) {
  (void)ctx;
  return op->group == 0;
}

/* A matmul op as the executor runs it (gemm_plan.h): f32 and f64 through
 * strided views (codegen/kernel.c: a stored value whole, q read out of
 * qkv, heads written into [B, T, C]); bf16 and f16 contiguous (transposes
 * as flags): bf16 A and B straight into the provider's bf16 GEMM (f32
 * accumulation), or widened to f32 first where the host measured that
 * faster (cpu_gemm_bf16_widen), f16 always widened (oneDNN 2.6 has no
 * f16 matmul on the CPU); the f32 product rounded into a bf16/f16
 * result (by the provider itself where it multiplies bf16: one pass over
 * C instead of three), or accumulated into an f32 gradient buffer as it is. */
static bool plan_gemm(const KpViews *vs, const IrOp *op, Gemm *g, char *err, size_t n) {
  const IrValue *A = op->args[0], *B = op->args[1], *C = op->result;
  memset(g, 0, sizeof *g);
  g->dt = A->type.dtype;
  if (!ir_dtype_is_float(g->dt) || B->type.dtype != g->dt)
    return rt_op_fail(err, n, op, "needs float operands of one dtype");
  if (A->type.shape.rank < 1 || B->type.shape.rank < 1) return rt_op_fail(err, n, op, "needs operands of rank >= 1");
  bool packed = g->dt != IR_DT_F32 && g->dt != IR_DT_F64;
  RtGemmPlan s;
  bool ok = packed ? rt_gemm_plan_ir(op, true, &s, err, n) : rt_gemm_plan_views(vs, op, &s, err, n);
  if (ok && packed) {
    const IrShape *bs = &B->type.shape;
    if (s.K != (bs->rank == 1 ? bs->dim[0] : bs->dim[bs->rank - 2]))
      ok = rt_op_fail(err, n, op, "has mismatched inner dimensions");
    else if (s.nb * s.M * s.N != ir_numel(&C->type.shape))
      ok = rt_op_fail(err, n, op, "has a result of the wrong size");
  }
  /* The BLAS's 32-bit sizes: contiguous GEMMs as folded, views by the rows
   * of one result matrix (M before a left-only batch is folded in). */
  int64_t m = packed ? s.M : s.rows;
  if (ok && (m > INT32_MAX || s.N > INT32_MAX || s.K > INT32_MAX || s.lda > INT32_MAX || s.ldb > INT32_MAX ||
             s.ldc > INT32_MAX))
    ok = rt_op_fail(err, n, op, "is too large for the BLAS (a dimension over 2^31)");
  if (!ok) {
    rt_gemm_plan_free(&s);
    return false;
  }
  g->a = s.a->offset;
  g->b = s.b->offset;
  g->c = s.c->offset;
  g->accumulate = rt_storage_root(s.c)->storage == IR_STORE_GRAD;
  g->cdt = g->accumulate ? (g->dt == IR_DT_F64 ? IR_DT_F64 : IR_DT_F32) : C->type.dtype;
  g->ta = s.ta, g->tb = s.tb, g->tc = s.tc;
  g->M = s.M, g->N = s.N, g->K = s.K;
  g->lda = s.lda, g->ldb = s.ldb, g->ldc = s.ldc;
  g->nb = s.nb;
  g->aoff = s.aoff, g->boff = s.boff, g->coff = s.coff; /* g owns them now */
  g->aarg = g->barg = -1;                               /* plan_direct_args */
  g->aroot = s.a, g->broot = s.b;
  g->absorbs = -1;
  return true;
}

/* GEMMs run on the pool like kernels, with the provider single-threaded
 * inside each piece: one set of threads.  A threaded BLAS next to the pool
 * oversubscribes the cores (its threads spin after every call while the
 * pool's run kernels), which made two threads slower than one.  A GEMM is
 * cut into pieces over its batch and over a grid of row and column blocks
 * of C (disjoint, so accumulating into a gradient buffer stays exact); one
 * too small to pay for waking the workers runs on the calling thread.
 *
 * Every piece is a provider call of its own, which packs the rows of A and
 * the columns of B it reads: a grid of pm row blocks by pn column blocks
 * packs A pn times and B pm times.  So the grid is as coarse as the threads
 * allow, one piece per thread, in the shape that packs least
 * (gemm_grid).  Four column blocks per thread, for balance, packed mlp2's
 * 256x1024 activations eight times per GEMM and cost its step ~4% at two
 * threads.  The grid is fixed when the program is built (the pool's size
 * is), and so is every piece's plan (gemm.h: at most four piece shapes,
 * twice for a store-first GEMM's two betas). */
#define GEMM_INLINE_FLOPS 1000000 /* ~10 us of one core */
#define GEMM_CALL_FLOPS 200000    /* what one BLAS call costs beyond its flops (~2 us) */
#define GEMM_MIN_PIECE_FLOPS 1000000
#define GEMM_ROW_UNIT 8 /* blocks of whole register tiles (row-major C is
                         * the BLAS's column-major C^T: its 16-wide tiles
                         * run along our rows' length) */
#define GEMM_COL_UNIT 16
#define GEMM_DENSE_ROWS 128 /* bf16 row blocks at least this tall run dense (gemm_schedule) */
#define GEMM_PACK_MAX_K 512 /* and with A transposed, when K is at most this */

static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* Cut len into at most `want` blocks of whole units; the block length. */
static int64_t block_len(int64_t len, int64_t want, int64_t unit) {
  int64_t blk = ceil_div(ceil_div(len, want), unit) * unit;
  return blk < len ? blk : len;
}

/* Cut each batch matrix of g into about q pieces: the pm x pn grid with
 * pm * pn <= q closest to q, then packing least (pn * M*K + pm * K*N
 * elements packed over the grid); with rows, q row blocks. */
static void gemm_grid(Gemm *g, int64_t q, bool rows) {
  int64_t best_n = 0;
  double best_pack = 0;
  g->pm = g->pn = 1;
  g->mblk = g->M;
  g->nblk = g->N;
  for (int64_t pm = rows ? q : 1; pm <= q; pm++) {
    int64_t mblk = block_len(g->M, pm, GEMM_ROW_UNIT), nblk = block_len(g->N, q / pm, GEMM_COL_UNIT);
    int64_t gm = ceil_div(g->M, mblk), gn = ceil_div(g->N, nblk);
    double pack = (double)gn * (double)(g->M * g->K) + (double)gm * (double)(g->K * g->N);
    if (gm * gn > best_n || (gm * gn == best_n && pack < best_pack)) {
      best_n = gm * gn;
      best_pack = pack;
      g->pm = gm;
      g->pn = gn;
      g->mblk = mblk;
      g->nblk = nblk;
    }
  }
}

/* How g runs on nt threads: inline, or cut into pieces on the pool.  A
 * batch of tiny GEMMs (attention's heads) is mostly call overhead, which
 * splits over threads as well as flops do.  q pieces per batch matrix: the
 * fewest that keep every thread busy to within 1/8 (a batch of 3 on 2
 * threads is cut in 6), none under GEMM_MIN_PIECE_FLOPS.
 *
 * A bf16 GEMM the provider multiplies itself (not widened) is cut in row
 * blocks only where they are at least GEMM_DENSE_ROWS tall and, with A
 * transposed, K is at most GEMM_PACK_MAX_K; each row block of a transposed
 * A is then copied dense before its piece runs (pack_a).  Every piece
 * reads and writes dense matrices: oneDNN 2.6 runs its AMX kernels
 * (brg:avx512_core_amx_bf16) on dense operands only and falls back to
 * gemm:jit on a strided one (a column block of B or C, a row block of a
 * transposed A), which ran mlp2's weight gradients (K = 256) at half the
 * speed, while at tinygpt's K = 2048 gemm:jit was the faster of the two.
 * Shorter blocks keep the grid that packs least: every piece reorders all
 * of B for the AMX tiles (docs/DECISIONS.md "Who threads it"). */
static void gemm_schedule(Gemm *g, int nt, bool library) {
  g->pack_a = false;
  double flops = 2.0 * (double)(g->M * g->N) * (double)g->K;
  g->pm = g->pn = 1;
  g->mblk = g->M;
  g->nblk = g->N;
  g->threads = 1;
  g->inline_run = nt == 1 || (flops + GEMM_CALL_FLOPS) * (double)g->nb < GEMM_INLINE_FLOPS;
  if (library && !g->inline_run) { /* the provider threads each GEMM itself */
    g->inline_run = true;
    g->threads = nt;
  }
  if (g->inline_run) return;
  int64_t most = (int64_t)(flops / GEMM_MIN_PIECE_FLOPS), q = 1;
  while (q < most && 8 * ceil_div(g->nb * q, nt) * nt > 9 * g->nb * q) q++;
  bool rows = g->dt == IR_DT_BF16 && !g->widen && !g->tc && g->M >= q * GEMM_DENSE_ROWS &&
              (!g->ta || g->K <= GEMM_PACK_MAX_K);
  if (q > 1) gemm_grid(g, q, rows);
  g->pack_a = rows && g->ta && g->pm > 1;
  GRADC_ASSERT(!g->pack_a || g->pn == 1); /* one piece per row block writes its packed A */
}

/* A batch of matrices too small to cut (one piece each) whose offsets
 * are a grid runs as one provider call per block of bo grid rows: one
 * call in all inline or where the provider threads it, else a block per
 * thread when that keeps them busy to within 1/8.  A batched call
 * multiplies the batch in one go where a call per matrix paid the
 * library's per-call work each time: oneDNN 2.6.3 takes 9.2 us for
 * attention's 32 heads of 32x32x16 in one call against 20.8 us in 32
 * (tinygpt small, one thread; docs/DECISIONS.md). */
static void gemm_group(Gemm *g, int nt) {
  g->bo = 0;
  const int64_t *const off[3] = {g->aoff, g->boff, g->coff};
  RtGemmGrid q;
  if (g->nb < 2 || g->pm * g->pn != 1 || g->epi != CPU_EPI_NONE || !rt_gemm_grid(off, g->nb, &q)) return;
  int64_t bo = g->inline_run ? q.n1 : ceil_div(q.n1, nt);
  if (!g->inline_run && 8 * bo * nt > 9 * q.n1) return;
  g->grid = q;
  g->bo = bo;
}

/* Pieces of one run of g. */
static int64_t gemm_npieces(const Gemm *g) { return g->bo ? ceil_div(g->grid.n1, g->bo) : g->nb * g->pm * g->pn; }

/* Whether g's provider writes its bf16 result itself (rounding its f32
 * accumulator as the cast after it would): a bf16 GEMM that is not
 * widened, into a bf16 buffer.  Otherwise a bf16/f16 result is the f32
 * product rounded by low_copy. */
static bool gemm_writes_low(const Gemm *g) { return g->dt == IR_DT_BF16 && !g->widen && g->cdt == IR_DT_BF16; }

/* The provider's descriptor of one m x n piece (a tc GEMM as C^T = B^T
 * A^T), of `rows` rows of g's grid (0: one matrix). */
static CpuGemmDesc piece_desc(const Gemm *g, int64_t m, int64_t n, bool acc, int64_t rows) {
  CpuGemmType t = g->dt == IR_DT_F64 ? CPU_GEMM_F64 : g->dt == IR_DT_BF16 && !g->widen ? CPU_GEMM_BF16 : CPU_GEMM_F32;
  CpuGemmDesc d = {.type = t, .accumulate = acc, .c_bf16 = gemm_writes_low(g), .K = g->K,
                   .ldc = g->ldc, .threads = g->threads, .epilogue = g->epi, .ldr = g->ldr};
  if (g->tc) {
    d.ta = !g->tb, d.tb = !g->ta, d.M = n, d.N = m, d.lda = g->ldb, d.ldb = g->lda;
  } else {
    d.ta = g->ta, d.tb = g->tb, d.M = m, d.N = n, d.lda = g->pack_a ? m : g->lda, d.ldb = g->ldb;
  }
  if (rows) {
    const RtGemmGrid *q = &g->grid;
    int ka = g->tc ? 1 : 0, kb = 1 - ka; /* the provider's A is B when C is transposed */
    if (q->n2 == 1) {
      d.batch = rows, d.stride_a = q->s1[ka], d.stride_b = q->s1[kb], d.stride_c = q->s1[2];
    } else {
      d.outer = rows, d.outer_a = q->s1[ka], d.outer_b = q->s1[kb], d.outer_c = q->s1[2];
      d.batch = q->n2, d.stride_a = q->s2[ka], d.stride_b = q->s2[kb], d.stride_c = q->s2[2];
    }
  }
  return d;
}

static bool same_piece(const CpuGemmDesc *x, const CpuGemmDesc *y) {
  return x->M == y->M && x->N == y->N && x->accumulate == y->accumulate && x->batch == y->batch &&
         x->outer == y->outer;
}

/* The plan of an m x n piece of `rows` grid rows (planned by gemm_plan_pieces). */
static const CpuGemm *piece_plan(const Gemm *g, int64_t m, int64_t n, bool acc, int64_t rows) {
  CpuGemmDesc want = piece_desc(g, m, n, acc, rows);
  for (int i = 0; i < g->nplans; i++)
    if (same_piece(cpu_gemm_desc(g->plans[i]), &want)) return g->plans[i];
  GRADC_ASSERT(!"a GEMM piece without a plan");
  return NULL;
}

static bool add_plan(Gemm *g, const CpuGemmProvider *prov, CpuGemmDesc d, char *err, size_t n) {
  for (int i = 0; i < g->nplans; i++)
    if (same_piece(cpu_gemm_desc(g->plans[i]), &d)) return true;
  GRADC_ASSERT(g->nplans < (int)(sizeof g->plans / sizeof *g->plans));
  g->plans[g->nplans] = cpu_gemm_plan(prov, &d, err, n);
  return g->plans[g->nplans++] != NULL;
}

/* Every plan g's runs need: the grid's (up to) four piece shapes, or
 * the batch's (up to) two block heights, for each beta it runs with. */
static bool gemm_plan_pieces(Gemm *g, const CpuGemmProvider *prov, char *err, size_t n) {
  int64_t ms[2] = {g->mblk, g->M - (g->pm - 1) * g->mblk}, ns[2] = {g->nblk, g->N - (g->pn - 1) * g->nblk};
  int64_t rows[2] = {g->bo, g->bo ? g->grid.n1 - (gemm_npieces(g) - 1) * g->bo : 0};
  for (int b = 0; b < 2; b++) {
    bool acc = b == 1;
    if (acc ? !g->accumulate : g->accumulate && !g->store_first) continue;
    if (g->bo) { /* whole matrices, blocks of grid rows */
      for (int i = 0; i < 2; i++)
        if (!add_plan(g, prov, piece_desc(g, g->M, g->N, acc, rows[i]), err, n)) return false;
      continue;
    }
    for (int i = 0; i < 2; i++)
      for (int j = 0; j < 2; j++)
        if (!add_plan(g, prov, piece_desc(g, ms[i], ns[j], acc, 0), err, n)) return false;
  }
  return true;
}

typedef struct GemmRun {
  const Gemm *g;
  const char *abase, *bbase; /* where A and B lie: the arena's buffers, the caller's tensors, or widened to f32 */
  char *cbase;               /* where C lies: the arena, or f32 scratch for a bf16/f16 result */
  bool acc;                  /* beta = 1 */
  char *arena;               /* the arena (an epilogue's bias or residual lies in it) */
  char *pack;                /* pack_a: scratch for A's row blocks, K x mblk each, per batch matrix */
} GemmRun;

static void gemm_pieces(void *ctx, int64_t begin, int64_t end) {
  const GemmRun *r = ctx;
  const Gemm *g = r->g;
  /* Bytes per element: A and B as the provider reads them (bf16 unless
   * widened, f16 widened), C as it writes it (f32 for bf16/f16 unless
   * the provider writes bf16). */
  int64_t es = g->dt == IR_DT_F64 ? 8 : g->dt == IR_DT_BF16 && !g->widen ? 2 : 4;
  int64_t esc = g->dt == IR_DT_F64 ? 8 : gemm_writes_low(g) ? 2 : 4;
  if (g->bo) { /* blocks of grid rows, one call each */
    for (int64_t i = begin; i < end; i++) {
      int64_t o = i * g->bo, rows = g->grid.n1 - o < g->bo ? g->grid.n1 - o : g->bo;
      const char *a = r->abase + (g->aoff[0] + o * g->grid.s1[0]) * es;
      const char *b = r->bbase + (g->boff[0] + o * g->grid.s1[1]) * es;
      char *c = r->cbase + (g->coff[0] + o * g->grid.s1[2]) * esc;
      const CpuGemm *plan = piece_plan(g, g->M, g->N, r->acc, rows);
      if (g->tc) cpu_gemm_run(plan, b, a, c, NULL);
      else cpu_gemm_run(plan, a, b, c, NULL);
    }
    return;
  }
  int64_t per = g->pm * g->pn;
  for (int64_t i = begin; i < end; i++) {
    int64_t t = i / per, qm = i % per / g->pn, qn = i % g->pn;
    const char *a = r->abase + g->aoff[t] * es, *b = r->bbase + g->boff[t] * es;
    char *c = r->cbase + g->coff[t] * esc;
    int64_t m0 = qm * g->mblk, n0 = qn * g->nblk;
    int64_t M = g->M - m0 < g->mblk ? g->M - m0 : g->mblk, N = g->N - n0 < g->nblk ? g->N - n0 : g->nblk;
    a += (g->ta ? m0 : m0 * g->lda) * es;
    if (g->pack_a) { /* the K x M columns of A^T this piece reads, dense (one piece per row block) */
      char *d = r->pack + (t * g->pm + qm) * g->K * g->mblk * es;
      for (int64_t k = 0; k < g->K; k++) memcpy(d + k * M * es, a + k * g->lda * es, (size_t)(M * es));
      a = d;
    }
    b += (g->tb ? n0 * g->ldb : n0) * es;
    c += (g->tc ? n0 * g->ldc + m0 : m0 * g->ldc + n0) * esc;
    const CpuGemm *plan = piece_plan(g, M, N, r->acc, 0);
    /* The piece's part of the bias (columns n0...) or residual (rows m0...). */
    const float *extra = NULL;
    if (g->epi == CPU_EPI_RESIDUAL) extra = (const float *)(r->arena + g->extra) + m0 * g->ldr + n0;
    else if (g->epi != CPU_EPI_NONE) extra = (const float *)(r->arena + g->extra) + n0;
    if (g->tc) /* C^T = B^T A^T, written row by row down C's columns */
      cpu_gemm_run(plan, b, a, c, NULL);
    else
      cpu_gemm_run(plan, a, b, c, extra);
  }
}

typedef struct KernelRun {
  const CgKernel *k;
  char *arena;
} KernelRun;

static void kernel_chunk(void *ctx, int64_t begin, int64_t end) {
  KernelRun *r = ctx;
  r->k->fn(r->arena, begin, end, r->k->offs);
}

/* Iterations a chunk of a kernel takes: chunks of about INLINE_WORK, as
 * many as a multiple of the threads, of equal size.  Chunks of
 * INLINE_WORK / cost iterations left the last one short (tinygpt small's
 * 32 head products in chunks of 10, 10, 10 and 2), and the thread that
 * took more set the kernel's time.  A kernel whose every call first does
 * `setup` work (a product copying B into its panel) gets chunks of at
 * least SETUP_SHARE times that: eight chunks of a dy W^T at two threads
 * packed W^T eight times, and with 8 times it each of two threads
 * still packed it twice (docs/DECISIONS.md "A panel once a thread"). */
#define SETUP_SHARE 32
static int64_t kernel_grain(int64_t iters, int64_t cost, int64_t setup, int threads) {
  int64_t n = ceil_div(iters * cost, INLINE_WORK);
  if (setup > 0) {
    int64_t most = iters * cost / (SETUP_SHARE * setup);
    if (n > most) n = most;
  }
  if (n < 1) n = 1;
  n = ceil_div(n, threads) * threads;
  if (n > iters) n = iters;
  return ceil_div(iters, n);
}

static void run_kernel(CpuProgram *p, const CgKernel *k) {
  int64_t cost = k->cost > 0 ? k->cost : 1;
  if (k->iters <= 0) return;
  if (pool_size(p->pool) == 1 || k->iters == 1 || k->iters * cost < INLINE_WORK) {
    k->fn(p->arena, 0, k->iters, k->offs);
    return;
  }
  KernelRun run = {k, p->arena};
  pool_run(p->pool, k->iters, kernel_grain(k->iters, cost, k->setup, pool_size(p->pool)), kernel_chunk, &run);
}

/* Two kernels at once, each whole on one thread (plan_pairs). */
typedef struct PairRun {
  const CgKernel *k[2];
  char *arena;
} PairRun;

static void pair_chunk(void *ctx, int64_t begin, int64_t end) {
  PairRun *r = ctx;
  for (int64_t j = begin; j < end; j++) r->k[j]->fn(r->arena, 0, r->k[j]->iters, r->k[j]->offs);
}

static void run_pair(CpuProgram *p, const CgKernel *a, const CgKernel *b) {
  PairRun run = {{a, b}, p->arena};
  pool_run(p->pool, 2, 1, pair_chunk, &run);
}

/* The widening and rounding loops of the low-precision GEMMs (ir.h's
 * bit codecs; the kernels' conversions are generated). */
typedef struct LowCopy {
  const void *src;
  void *dst;
  IrDType dt; /* the bf16/f16 side */
  bool widen; /* src dt -> dst f32; else src f32 -> dst dt */
} LowCopy;

static void low_copy(void *ctx, int64_t begin, int64_t end) {
  const LowCopy *c = ctx;
  if (c->widen && c->dt == IR_DT_BF16) {
    const uint16_t *s = c->src;
    float *d = c->dst;
    for (int64_t i = begin; i < end; i++) d[i] = ir_bf16_to_f32(s[i]);
  } else if (c->widen) {
    const uint16_t *s = c->src;
    float *d = c->dst;
    for (int64_t i = begin; i < end; i++) d[i] = ir_f16_to_f32(s[i]);
  } else if (c->dt == IR_DT_BF16) {
    const float *s = c->src;
    uint16_t *d = c->dst;
    for (int64_t i = begin; i < end; i++) d[i] = ir_f32_to_bf16(s[i]);
  } else {
    const float *s = c->src;
    uint16_t *d = c->dst;
    for (int64_t i = begin; i < end; i++) d[i] = ir_f32_to_f16(s[i]);
  }
}

static void low_copy_run(CpuProgram *p, const void *src, void *dst, int64_t n, IrDType dt, bool widen) {
  LowCopy c = {src, dst, dt, widen};
  if (n < INLINE_WORK || pool_size(p->pool) == 1) low_copy(&c, 0, n);
  else pool_run(p->pool, n, INLINE_WORK, low_copy, &c);
}

/* Elements a contiguous low-precision GEMM reads of A (B) and writes of C
 * over its batch: up to the last matrix's end. */
static int64_t low_extent(const int64_t *off, int64_t nb, int64_t per) {
  int64_t hi = 0;
  for (int64_t t = 0; t < nb; t++) hi = off[t] + per > hi ? off[t] + per : hi;
  return hi;
}

/* The f32 scratch g needs (CpuProgram.low): its product when the result is
 * bf16/f16, its operands when they are widened, and A's row blocks when
 * they are packed (after the product). */
static int64_t low_scratch(const Gemm *g) {
  if (g->dt != IR_DT_BF16 && g->dt != IR_DT_F16) return 0;
  int64_t n = g->cdt == IR_DT_F32 || gemm_writes_low(g) ? 0 : low_extent(g->coff, g->nb, g->M * g->N);
  if (g->widen) n += low_extent(g->aoff, g->nb, g->M * g->K) + low_extent(g->boff, g->nb, g->K * g->N);
  if (g->pack_a) n += ceil_div(g->nb * g->pm * g->K * g->mblk, 2); /* bf16 */
  return n;
}

/* first: the window's first micro-batch. */
static void run_gemm(CpuProgram *p, const Gemm *g, bool first) {
  bool acc = g->accumulate && !(first && g->store_first);
  GemmRun r = {g, g->aarg >= 0 ? p->argbase[g->aarg] : p->arena + g->a,
               g->barg >= 0 ? p->argbase[g->barg] : p->arena + g->b, p->arena + g->c, acc, p->arena, NULL};
  bool low = g->dt == IR_DT_BF16 || g->dt == IR_DT_F16, round = low && g->cdt != IR_DT_F32 && !gemm_writes_low(g);
  int64_t nc = round ? low_extent(g->coff, g->nb, g->M * g->N) : 0;
  if (low) {
    float *s = p->low;
    if (round) { /* the f32 product, rounded into C below (beta = 0: a bf16/f16 C is never a gradient buffer) */
      r.cbase = (char *)s;
      s += nc;
    }
    if (g->widen) {
      int64_t na = low_extent(g->aoff, g->nb, g->M * g->K), nbb = low_extent(g->boff, g->nb, g->K * g->N);
      low_copy_run(p, r.abase, s, na, g->dt, true);
      low_copy_run(p, r.bbase, s + na, nbb, g->dt, true);
      r.abase = (const char *)s;
      r.bbase = (const char *)(s + na);
    }
  }
  if (g->pack_a) r.pack = (char *)(p->low + nc);
  if (g->inline_run) gemm_pieces(&r, 0, gemm_npieces(g));
  else pool_run(p->pool, gemm_npieces(g), 1, gemm_pieces, &r);
  if (round) low_copy_run(p, p->low, p->arena + g->c, nc, g->cdt, false);
}

/* ------------------------------------------------------------------ */
/* Building the program                                                */
/* ------------------------------------------------------------------ */

void cpu_program_free(CpuProgram *p) {
  if (!p) return;
  for (int i = 0; i < p->ncode; i++) {
    free(p->code[i].gemm.aoff);
    free(p->code[i].gemm.boff);
    free(p->code[i].gemm.coff);
    for (int k = 0; k < p->code[i].gemm.nplans; k++) cpu_gemm_free(p->code[i].gemm.plans[k]);
  }
  free(p->code);
  free(p->low);
  free(p->grads);
  interp_count_plan_free(p->count);
  free(p->reduced);
  free(p->zero);
  free(p->arena_src);
  free(p->direct);
  free(p->argbase);
  for (int i = 0; i < p->ncolls; i++) step_coll_free(&p->colls[i]);
  free(p->colls);
  free(p->coll_open);
  for (int i = 0; i < p->nbuckets; i++) {
    for (int k = 0; k < p->buckets[i].nruns; k++)
      if (p->buckets[i].runs[k].req) {
        char e[256];
        (void)comm_wait(p->buckets[i].runs[k].req, e, sizeof e);
      }
    free(p->buckets[i].runs);
  }
  free(p->buckets);
  if (p->have_spare) step_result_free(&p->spare);
  kp_views_free(&p->views);
  free(p->arena);
  pool_free(p->pool);
#ifdef GRADC_HAVE_LLVM
  if (p->cg) cg_module_free(p->cg);
#endif
  free(p);
}

static void emit(CpuProgram *p, Instr in) { p->code[p->ncode++] = in; }

/* Check one group-0 op and add what it needs to the program. */
static bool build_op(CpuProgram *p, const IrOp *op, char *err, size_t n) {
  IrOpcode opc = op->opcode;
#ifdef GRADC_HAVE_LLVM
  const CgKernel *bmm = opc == IR_OP_MATMUL ? cg_module_matmul(p->cg, op) : NULL;
  if (bmm) { /* a batch of small products, generated (passes/kernel_bmm.c) */
    emit(p, (Instr){.kind = I_KERNEL, .op = op, .kernel = bmm, .twin = cg_module_matmul_store(p->cg, op)});
    return true;
  }
#endif
  if (opc == IR_OP_MATMUL) {
    Instr in = {.kind = I_GEMM, .op = op};
    if (!plan_gemm(&p->views, op, &in.gemm, err, n)) {
      free(in.gemm.aoff);
      free(in.gemm.boff);
      free(in.gemm.coff);
      return false;
    }
    emit(p, in);
    return true;
  }
  /* Views: GEMMs read or write them in place. */
  if ((opc == IR_OP_PERMUTE || opc == IR_OP_RESHAPE || opc == IR_OP_SLICE || opc == IR_OP_CONCAT) &&
      kp_view_free_op(&p->views, op))
    return true;
  if (opc == IR_OP_WINDOW_SUM && op->result->storage == IR_STORE_ARENA) {
    /* Over one micro-batch on one rank a window sum is its operand (the
     * same bytes where it has the result's dtype: an integer operand's
     * sum is f32). */
    const IrValue *s = rt_storage_root(op->args[0]);
    if (s->storage == IR_STORE_ARENA && s->def && op->args[0]->type.dtype == op->result->type.dtype) {
      int64_t bytes = ir_numel(&op->result->type.shape) * (int64_t)ir_dtype_size(op->result->type.dtype);
      emit(p, (Instr){.kind = I_WSUM, .op = op, .src = s->offset, .dst = op->result->offset, .bytes = bytes});
    } else {
      p->sums_in_step = false; /* converted, or an artifact planned before window sums' operands had bytes */
    }
    return true;
  }
  if (opc == IR_OP_RESHAPE || opc == IR_OP_CONST || opc == IR_OP_WINDOW_SUM || opc == IR_OP_RNG_STATE ||
      opc == IR_OP_LOSS_SCALE) {
    if (opc == IR_OP_RESHAPE && op->result->storage != IR_STORE_NONE && op->result->storage != IR_STORE_ALIAS)
      return rt_op_fail(err, n, op, "must alias its operand (run memplan)");
    return true;
  }
  if (opc == IR_OP_PERMUTE && rt_is_flag_permute(op->result)) return true;
  /* Range slices alias their operand; range unslices have their operand
   * accumulate into the gradient buffer (memplan). */
  if (opc == IR_OP_SLICE) {
    if (op->result->storage != IR_STORE_NONE && op->result->storage != IR_STORE_ALIAS)
      return rt_op_fail(err, n, op, "must alias its operand (run memplan)");
    return true;
  }
  if (opc == IR_OP_UNSLICE) {
    if (op->result->storage != IR_STORE_GRAD || rt_storage_root(op->args[0])->storage != IR_STORE_GRAD)
      return rt_op_fail(err, n, op, "is not in a kernel and not a range of a gradient buffer (run memplan)");
    return true;
  }
  if (opc == IR_OP_LOSS) {
    const IrValue *v = rt_storage_root(op->args[0]);
    if (v->storage == IR_STORE_NONE) return rt_op_fail(err, n, op, "reads a value without storage (run memplan)");
    emit(p, (Instr){.kind = I_LOSS, .op = op, .src = v->offset});
    return true;
  }
  if (opc == IR_OP_OUTPUT || opc == IR_OP_UPDATE) {
    const IrValue *v = rt_storage_root(op->args[0]);
    if (v->storage == IR_STORE_NONE) return rt_op_fail(err, n, op, "reads a value without storage (run memplan)");
    emit(p, (Instr){.kind = I_STATE, .op = op, .src = v->offset});
    return true;
  }
  if (opc == IR_OP_GRAD) {
    if (rt_storage_root(op->args[0])->storage != IR_STORE_GRAD)
      return rt_op_fail(err, n, op, "reads a value outside the gradient buffers (run memplan)");
    return true;
  }
  if (opc == IR_OP_TP_SCATTER || opc == IR_OP_RANK_SLICE || opc == IR_OP_RANK_CONCAT) {
    /* Strided copies at this rank's offsets (known at run time). */
    const IrValue *d = rt_storage_root(op->result);
    for (int j = 0; j < op->nargs; j++) {
      const IrValue *s = rt_storage_root(op->args[j]);
      if (s->storage == IR_STORE_NONE) return rt_op_fail(err, n, op, "has an operand without storage (run memplan)");
      if (s->offset == d->offset && op->nargs > 1) return rt_op_fail(err, n, op, "shares its result's storage with an operand");
    }
    if (d->storage == IR_STORE_NONE || d->storage == IR_STORE_GRAD)
      return rt_op_fail(err, n, op, "needs its own result storage (run memplan)");
    int64_t bytes = ir_numel(&op->result->type.shape) * (int64_t)ir_dtype_size(op->result->type.dtype);
    if (ir_attr_get_int(op, "ranks", 1) == 1) { /* the identity */
      int64_t so = rt_storage_root(op->args[0])->offset;
      if (so != d->offset) emit(p, (Instr){.kind = I_COPY, .op = op, .src = so, .dst = d->offset, .bytes = bytes});
      return true;
    }
    emit(p, (Instr){.kind = I_RANK, .op = op, .dst = d->offset, .bytes = bytes});
    return true;
  }
  if (opc == IR_OP_ALL_REDUCE_START || opc == IR_OP_ALL_REDUCE_WAIT || opc == IR_OP_ALL_GATHER_START ||
      opc == IR_OP_ALL_GATHER_WAIT || opc == IR_OP_REDUCE_SCATTER_START || opc == IR_OP_REDUCE_SCATTER_WAIT ||
      opc == IR_OP_TP_COPY) {
    const IrValue *s = rt_storage_root(op->args[0]), *d = rt_storage_root(op->result);
    if (s->storage == IR_STORE_NONE || d->storage == IR_STORE_NONE)
      return rt_op_fail(err, n, op, "has an operand or result without storage (run memplan)");
    bool start = opc == IR_OP_ALL_REDUCE_START || opc == IR_OP_ALL_GATHER_START || opc == IR_OP_REDUCE_SCATTER_START;
    /* A wait's attributes are its start's. */
    const IrOp *sop = start || opc == IR_OP_TP_COPY || !op->args[0]->def ? op : op->args[0]->def;
    if (opc != IR_OP_TP_COPY && step_coll_last(op)) {
      /* A gradient bucket's member: in place in the gradient buffer. */
      if (opc != IR_OP_ALL_REDUCE_START && opc != IR_OP_ALL_REDUCE_WAIT)
        return rt_op_fail(err, n, op, "with last=true must be an all-reduce");
      if (s->storage != IR_STORE_GRAD || d->storage != IR_STORE_GRAD || s->offset != d->offset)
        return rt_op_fail(err, n, op, "with last=true must be in its param's gradient buffer (run memplan)");
      emit(p, (Instr){.kind = start ? I_BUCKET_START : I_BUCKET_WAIT, .op = op, .slot = -1});
      return true;
    }
    if (d->storage == IR_STORE_GRAD) return rt_op_fail(err, n, op, "cannot accumulate into a gradient buffer");
    int64_t bytes = ir_numel(&op->result->type.shape) * (int64_t)ir_dtype_size(op->result->type.dtype);
    if (opc == IR_OP_TP_COPY || ir_attr_get_int(sop, "ranks", 1) == 1) {
      if (s->offset != d->offset)
        emit(p, (Instr){.kind = I_COPY, .op = op, .src = s->offset, .dst = d->offset, .bytes = bytes});
      return true;
    }
    IrDType dt = op->args[0]->type.dtype;
    if (dt != IR_DT_F32 && dt != IR_DT_F64) return rt_op_fail(err, n, op, "needs f32 or f64 values on the CPU target");
    if (start) {
      emit(p, (Instr){.kind = I_START, .op = op, .src = s->offset, .dst = d->offset, .slot = p->ncolls++,
                      .f64 = dt == IR_DT_F64});
      return true;
    }
    /* A wait: the StepColl of its start, emitted before it. */
    int slot = -1;
    for (int i = p->ncode - 1; i >= 0 && slot < 0; i--)
      if (p->code[i].kind == I_START && p->code[i].op->result == op->args[0]) slot = p->code[i].slot;
    if (slot < 0) return rt_op_fail(err, n, op, "waits for a collective that was not started before it");
    emit(p, (Instr){.kind = I_WAIT, .op = op, .dst = d->offset, .slot = slot});
    return true;
  }
  return rt_op_fail(err, n, op, "is not in a kernel (the CPU target runs fuse before memplan)");
}

/* The gradient buffer range of a bucket member (a last=true start). */
static BucketRun member_range(const IrOp *start) {
  const IrValue *v = rt_storage_root(start->args[0]);
  bool f64 = v->type.dtype == IR_DT_F64;
  return (BucketRun){v->offset, v->offset + ir_numel(&v->type.shape) * (f64 ? 8 : 4), f64, NULL, false};
}

static int cmp_run(const void *pa, const void *pb) {
  const BucketRun *a = pa, *b = pb;
  if (a->f64 != b->f64) return a->f64 ? 1 : -1;
  return a->lo < b->lo ? -1 : a->lo > b->lo;
}

/* Whether a `grad` operand is a bucket's reduction (a last=true wait over
 * more than one rank), through aliases and a slice's range unslice. */
static bool bucket_reduced(const IrValue *v) {
  v = rt_storage_root(v);
  if (v->def && v->def->opcode == IR_OP_UNSLICE) v = rt_storage_root(v->def->args[0]);
  const IrOp *w = v->def;
  if (!w || w->opcode != IR_OP_ALL_REDUCE_WAIT || !step_coll_last(w)) return false;
  return ir_attr_get_int(w->args[0]->def ? w->args[0]->def : w, "ranks", 1) > 1;
}

/* Add a bucket of the given members (start instructions); their buffers
 * merged into contiguous runs (memplan lays a bucket out so, each buffer
 * 64-byte aligned: the padding between two is zeroed with them). */
static int add_bucket(CpuProgram *p, const int *starts, int n) {
  Bucket *b = &p->buckets[p->nbuckets];
  b->op = p->code[starts[0]].op;
  b->runs = mem_calloc((size_t)n, sizeof(BucketRun));
  for (int i = 0; i < n; i++) b->runs[i] = member_range(p->code[starts[i]].op);
  qsort(b->runs, (size_t)n, sizeof(BucketRun), cmp_run);
  int m = 0;
  for (int i = 0; i < n; i++) {
    BucketRun *last = m ? &b->runs[m - 1] : NULL;
    if (last && last->f64 == b->runs[i].f64 && b->runs[i].lo >= last->hi && b->runs[i].lo - last->hi < 64) {
      if (b->runs[i].hi > last->hi) last->hi = b->runs[i].hi;
      continue;
    }
    b->runs[m++] = b->runs[i];
  }
  b->nruns = m;
  return p->nbuckets++;
}

/* Group the last=true starts and waits into buckets (see Bucket). */
static bool plan_buckets(CpuProgram *p, char *err, size_t n) {
  int *starts = mem_calloc((size_t)p->ncode + 1, sizeof(int)), *waits = mem_calloc((size_t)p->ncode + 1, sizeof(int));
  int ns = 0, nw = 0;
  for (int i = 0; i < p->ncode; i++) {
    if (p->code[i].kind == I_BUCKET_START) starts[ns++] = i;
    if (p->code[i].kind == I_BUCKET_WAIT) waits[nw++] = i;
  }
  p->buckets = mem_calloc((size_t)ns + 1, sizeof(Bucket));
  int *members = mem_calloc((size_t)ns + 1, sizeof(int));
  bool ok = true;
  for (int i = 0; i < ns && ok; i++) {
    Instr *s0 = &p->code[starts[i]];
    if (s0->slot >= 0) continue;
    int64_t id = ir_attr_get_int(s0->op, "bucket", -1);
    /* The bucket's starts and waits; coalesced when every wait follows every start. */
    int nm = 0, last_start = -1, first_wait = INT32_MAX;
    for (int k = i; k < ns; k++) {
      const Instr *sk = &p->code[starts[k]];
      if (sk->slot >= 0 || ir_attr_get_int(sk->op, "bucket", -1) != id || (id < 0 && k != i)) continue;
      members[nm++] = starts[k];
      last_start = starts[k];
    }
    for (int k = 0; k < nw; k++)
      for (int j = 0; j < nm; j++)
        if (p->code[waits[k]].op->args[0] == p->code[members[j]].op->result && waits[k] < first_wait)
          first_wait = waits[k];
    bool together = first_wait > last_start;
    for (int j = 0; j < nm; j++) {
      int one = together ? nm : 1, *set = together ? members : &members[j];
      if (together && j > 0) break;
      int b = add_bucket(p, set, one);
      /* Its starts and waits: the last start and the first wait act. */
      int issue_start = set[one - 1], issue_wait = -1;
      for (int m = 0; m < one; m++) {
        p->code[set[m]].slot = b;
        p->code[set[m]].issue = set[m] == issue_start;
        for (int k = 0; k < nw; k++) {
          Instr *w = &p->code[waits[k]];
          if (w->op->args[0] != p->code[set[m]].op->result) continue;
          w->slot = b;
          if (issue_wait < 0 || waits[k] < issue_wait) issue_wait = waits[k];
        }
      }
      if (issue_wait >= 0) p->code[issue_wait].issue = true;
    }
  }
  for (int k = 0; k < nw && ok; k++)
    if (p->code[waits[k]].slot < 0) ok = rt_op_fail(err, n, p->code[waits[k]].op, "waits for a collective that is not started");
  free(members);
  free(starts);
  free(waits);
  return ok;
}

/* Bytes [*lo, *hi) of the arena a stored value occupies (a gradient
 * buffer's elements counted as 8 bytes, whatever their type: an upper bound). */
static bool value_bytes(const IrValue *v, int64_t *lo, int64_t *hi) {
  if (!v || v->storage == IR_STORE_NONE) return false;
  int64_t es = v->storage == IR_STORE_GRAD ? 8 : (int64_t)ir_dtype_size(v->type.dtype);
  *lo = v->offset;
  *hi = v->offset + ir_numel(&v->type.shape) * es;
  return true;
}

/* Bytes a GEMM may write: from its first batch matrix's C to past its
 * last (bf16/f16 results counted as 8-byte elements: an upper bound). */
static void gemm_c_bytes(const Gemm *g, int64_t *lo, int64_t *hi) {
  bool packed = g->dt != IR_DT_F32 && g->dt != IR_DT_F64;
  int64_t es = packed || g->dt == IR_DT_F64 ? 8 : 4, mn = 0, mx = 0;
  for (int64_t t = 0; t < g->nb; t++) {
    if (t == 0 || g->coff[t] < mn) mn = g->coff[t];
    if (t == 0 || g->coff[t] > mx) mx = g->coff[t];
  }
  int64_t span = packed ? g->M * g->N : g->tc ? g->N * g->ldc + g->M : g->M * g->ldc + g->N;
  *lo = g->c + mn * es;
  *hi = g->c + (mx + span) * es;
}

static bool overlaps(int64_t a0, int64_t a1, int64_t b0, int64_t b1) { return a0 < b1 && b0 < a1; }

/* Whether two stored values may share bytes of the arena (value_bytes;
 * either without storage counts as sharing). */
static bool values_meet(const IrValue *u, const IrValue *v) {
  int64_t u0, u1, v0, v1;
  return !value_bytes(u, &u0, &u1) || !value_bytes(v, &v0, &v1) || overlaps(u0, u1, v0, v1);
}

/* Whether two generated products may run at once: neither writes bytes
 * the other reads or writes (memplan reuses a dead value's bytes, so
 * being different values is not enough). */
static bool products_apart(const KpViews *vs, const IrOp *x, const IrOp *y) {
  KpBmm a, b;
  if (!kp_bmm_plan(vs, x, &a) || !kp_bmm_plan(vs, y, &b)) return false;
  return !values_meet(a.c, b.c) && !values_meet(a.c, b.a) && !values_meet(a.c, b.b) && !values_meet(b.c, a.a) &&
         !values_meet(b.c, a.b);
}

static int64_t kernel_work(const CgKernel *k) { return k->iters * k->cost + k->setup; }

/* At two threads, two adjacent generated products that are independent,
 * each big enough to be a pool job of its own (INLINE_WORK) and the
 * smaller at least three quarters of the larger's work, run side by side,
 * each whole on one thread:
 * a backward's `dy W^T` and `x^T dy`.  Cut by rows over both threads,
 * each of them paid the hand-out, the wait and (for `dy W^T`) a copy of
 * W^T on both threads (docs/DECISIONS.md "Products side by side"). */
static void plan_pairs(CpuProgram *p) {
  if (p->threads != 2) return;
  for (int i = 0; i + 1 < p->ncode; i++) {
    Instr *x = &p->code[i], *y = &p->code[i + 1];
    if (x->kind != I_KERNEL || y->kind != I_KERNEL || x->op->opcode != IR_OP_MATMUL || y->op->opcode != IR_OP_MATMUL)
      continue;
    int64_t wx = kernel_work(x->kernel), wy = kernel_work(y->kernel);
    int64_t lo = wx < wy ? wx : wy, hi = wx < wy ? wy : wx;
    if (lo < INLINE_WORK || lo * 4 < hi * 3 || !products_apart(&p->views, x->op, y->op)) continue;
    x->pair = true;
    i++;
  }
}

static int cmp_range(const void *pa, const void *pb) {
  const int64_t *a = pa, *b = pb;
  return a[0] < b[0] ? -1 : a[0] > b[0];
}

/* The bytes a store-first candidate would write whole, as [lo, hi): a
 * GEMM that accumulates (f32/f64, one contiguous matrix), or a generated
 * product with a store twin whose C is one dense block (f32). */
static bool store_first_bytes(const CpuProgram *p, const Instr *in, int64_t *lo, int64_t *hi) {
  if (in->kind == I_GEMM) {
    const Gemm *g = &in->gemm;
    if (!g->accumulate || (g->dt != IR_DT_F32 && g->dt != IR_DT_F64)) return false;
    if (g->nb != 1 || g->tc || (g->ldc != g->N && g->M != 1)) return false;
    int64_t es = g->dt == IR_DT_F64 ? 8 : 4;
    *lo = g->c;
    *hi = g->c + g->M * g->N * es;
    return true;
  }
#ifdef GRADC_HAVE_LLVM
  KpBmm b;
  if (in->kind != I_KERNEL || !in->twin || !kp_bmm_plan(&p->views, in->op, &b)) return false;
  if (b.cn != 1 || (b.cm != b.N && b.M != 1)) return false;
  int64_t dense = b.M * b.N; /* the stride of a dense batch axis, innermost first */
  for (int d = b.nbatch - 1; d >= 0; d--) {
    if (b.bdim[d] > 1 && b.cs[d] != dense) return false;
    dense *= b.bdim[d];
  }
  *lo = b.c->offset + b.coff * 4;
  *hi = *lo + b.nb * b.M * b.N * 4;
  return true;
#else
  (void)p;
  return false;
#endif
}

/* The bytes an instruction may write that its op's values do not show: a
 * GEMM's C through strides, a generated product's C root. */
static bool writes_bytes(const CpuProgram *p, const Instr *in, int64_t *lo, int64_t *hi) {
  if (in->kind == I_GEMM) {
    gemm_c_bytes(&in->gemm, lo, hi);
    return true;
  }
#ifdef GRADC_HAVE_LLVM
  KpBmm b;
  if (in->kind == I_KERNEL && in->op->group == 0 && kp_bmm_plan(&p->views, in->op, &b)) {
    /* From C's first element to its last (f32), or its whole root where
     * a stride is negative. */
    int64_t last = (b.M - 1) * b.cm + (b.N - 1) * b.cn;
    bool forward = b.cm >= 0 && b.cn >= 0;
    for (int d = 0; d < b.nbatch; d++) {
      last += (b.bdim[d] - 1) * b.cs[d];
      forward &= b.cs[d] >= 0;
    }
    if (!forward) return value_bytes(b.c, lo, hi);
    *lo = b.c->offset + b.coff * 4;
    *hi = *lo + (last + 1) * 4;
    return true;
  }
#else
  (void)p;
#endif
  return false;
}

/* The end of a gradient buffer's bytes in the arena. */
static int64_t grad_buf_end(const StepGradBuf *b) { return b->offset + b->numel * (int64_t)ir_dtype_size(b->dt); }

/* The gradient buffer whose bytes include byte `at` of the arena, and
 * the end of its bytes; NULL where none does. */
static const StepGradBuf *grad_buf_at(const CpuProgram *p, int64_t at, int64_t *end) {
  for (int k = 0; k < p->ngrads; k++) {
    const StepGradBuf *b = &p->grads[k];
    *end = grad_buf_end(b);
    if (at >= b->offset && at < *end) return b;
  }
  return NULL;
}

/* value_bytes with a gradient buffer's elements at the buffer's own size
 * (f32 or f64): the bytes a layer's part of a stacked param's gradient
 * and its neighbours really occupy. */
static bool grad_exact_bytes(const CpuProgram *p, const IrValue *v, int64_t *lo, int64_t *hi) {
  if (!value_bytes(v, lo, hi)) return false;
  int64_t end;
  const StepGradBuf *b = v->storage == IR_STORE_GRAD ? grad_buf_at(p, v->offset, &end) : NULL;
  if (b) *hi = v->offset + ir_numel(&v->type.shape) * (int64_t)ir_dtype_size(b->dt);
  return true;
}

/* Store-first products and the ranges the window zeroes.  A GEMM or a
 * generated product that accumulates into a gradient buffer writes the
 * window's first value of every byte of its result when its result is
 * one dense block inside one buffer and nothing earlier in the program
 * (a value any earlier op but a range unslice or `grad` reads or writes,
 * or an earlier product's result) touches those bytes: in micro-batch 0
 * it stores (a GEMM with beta = 0, a product through its store twin),
 * and the buffer's range it covers needs no zeroing.  The rest of every
 * buffer is zeroed as before (kernels accumulate with +=). */
static void plan_zeroing(CpuProgram *p) {
  const IrFunc *f = p->f;
  int64_t(*cover)[2] = mem_calloc((size_t)p->ncode + 1, sizeof *cover);
  int ncover = 0, opi = 0;
  for (int i = 0; i < p->ncode; i++) {
    int64_t lo, hi;
    if (!store_first_bytes(p, &p->code[i], &lo, &hi)) continue;
    int64_t end;
    bool first = grad_buf_at(p, lo, &end) && hi <= end; /* inside one gradient buffer */
    while (opi < f->nops && f->ops[opi] != p->code[i].op) opi++;
    for (int k = 0; first && k < opi; k++) {
      const IrOp *op = f->ops[k];
      int64_t a, b;
      /* A range unslice into a gradient buffer (a layer's part of a
       * stacked param's) and a `grad` do no work: their values span the
       * whole buffer, but only their operands' producers write it. */
      if (op->opcode == IR_OP_GRAD || plan_range_unslice(op, &a)) continue;
      if (grad_exact_bytes(p, op->result, &a, &b) && overlaps(a, b, lo, hi)) first = false;
      for (int j = 0; first && j < op->nargs; j++)
        if (grad_exact_bytes(p, op->args[j], &a, &b) && overlaps(a, b, lo, hi)) first = false;
    }
    for (int k = 0; first && k < i; k++) {
      int64_t a, b;
      if (writes_bytes(p, &p->code[k], &a, &b) && overlaps(a, b, lo, hi)) first = false;
    }
    if (!first) continue;
    if (p->code[i].kind == I_GEMM) p->code[i].gemm.store_first = true;
    else p->code[i].store_first = true;
    cover[ncover][0] = lo;
    cover[ncover++][1] = hi;
  }
  qsort(cover, (size_t)ncover, sizeof *cover, cmp_range);
  p->zero = mem_calloc((size_t)(p->ngrads + ncover) + 1, sizeof *p->zero);
  for (int k = 0; k < p->ngrads; k++) {
    const StepGradBuf *b = &p->grads[k];
    int64_t at = b->offset, end = grad_buf_end(b);
    for (int c = 0; c < ncover; c++) {
      if (cover[c][1] <= at || cover[c][0] >= end) continue;
      if (cover[c][0] > at) {
        p->zero[p->nzero][0] = at;
        p->zero[p->nzero++][1] = cover[c][0];
      }
      at = cover[c][1];
    }
    if (at < end) {
      p->zero[p->nzero][0] = at;
      p->zero[p->nzero++][1] = end;
    }
  }
  free(cover);
}

/* Args read in place.  An f32 or f64 input or param that only GEMMs read
 * (through reshapes and transpose flags; window sums read the bound
 * tensors themselves) is not copied into the arena: its GEMMs read the
 * caller's tensor, as torch reads a batch in place.  A tensor that needs
 * converting (an f64 file for an f32 arg) is still copied, and its GEMMs
 * then read the arena; copy_args sets argbase either way.  Matmuls that
 * run as generated kernels read the arena, so their args are copied. */
static void plan_direct_args(CpuProgram *p) {
  const IrFunc *f = p->f;
  p->direct = mem_calloc((size_t)f->nargs + 1, sizeof(bool));
  p->argbase = mem_calloc((size_t)f->nargs + 1, sizeof(char *));
  for (int i = 0; i < f->nargs; i++) {
    const IrValue *a = f->args[i];
    p->direct[i] = (a->role == IR_ARG_INPUT || a->role == IR_ARG_PARAM) &&
                   (a->type.dtype == IR_DT_F32 || a->type.dtype == IR_DT_F64);
  }
  for (int k = 0; k < f->nops; k++) {
    const IrOp *op = f->ops[k];
    bool gemm_side = op->group == 0 && (op->opcode == IR_OP_MATMUL || op->opcode == IR_OP_RESHAPE ||
                                        op->opcode == IR_OP_WINDOW_SUM ||
                                        (op->opcode == IR_OP_PERMUTE && rt_is_flag_permute(op->result)));
    for (int j = 0; j < op->nargs && !gemm_side; j++) {
      const IrValue *r = rt_storage_root(op->args[j]);
      for (int i = 0; i < f->nargs; i++)
        if (f->args[i] == r) p->direct[i] = false;
    }
  }
  /* A matmul kernel reads its operands' roots in the arena, through any
   * flag transposes and reshapes between them and the args. */
  for (int c = 0; c < p->ncode; c++) {
    const IrOp *op = p->code[c].op;
    if (p->code[c].kind != I_KERNEL || op->opcode != IR_OP_MATMUL) continue;
    for (int j = 0; j < op->nargs; j++) {
      KpView v;
      if (!kp_view_in(&p->views, op->args[j], &v)) continue;
      const IrValue *r = rt_storage_root(v.root);
      for (int i = 0; i < f->nargs; i++)
        if (f->args[i] == r) p->direct[i] = false;
    }
  }
  for (int c = 0; c < p->ncode; c++) {
    Gemm *g = &p->code[c].gemm;
    if (p->code[c].kind != I_GEMM) continue;
    for (int i = 0; i < f->nargs; i++) {
      if (!p->direct[i]) continue;
      if (f->args[i]->offset == g->a) g->aarg = i;
      if (f->args[i]->offset == g->b) g->barg = i;
    }
  }
}

/* ------------------------------------------------------------------ */
/* Epilogues                                                           */
/* ------------------------------------------------------------------ */

/* A GEMM's epilogue instead of the kernel after it (docs/BACKEND.md "GEMM
 * epilogues").  A kernel that is nothing but
 *   add(C, bias)              BIAS        bias: [N] (or [1, .., N]), broadcast over C's rows
 *   relu(add(C, bias))        BIAS_RELU
 *   gelu(add(C, bias))        BIAS_GELU   (gelu's tanh form, as ir/scalar.c)
 *   add(C, R)                 RESIDUAL    R: C's shape, contiguous
 * where C is the result of the f32 GEMM just before it (one matrix, M
 * folded, stored whole) and read by nothing else, and whose one output
 * is a stored f32 value of C's shape, is run by the GEMM: it writes the
 * kernel's output (the provider's post-ops, gemm.h), and the kernel does
 * nothing.  The two run back to back (no instruction between them), so the
 * output's bytes are free when the GEMM writes them unless they are A's
 * or B's (a value whose last reader is the GEMM): those, and an output
 * that overlaps the bias or residual it reads, stay as they were.
 * Whether the provider fuses the epilogue is only known from its plans:
 * program_new undoes the ones it would run as a loop (gemm.c) unless
 * GRADC_GEMM_EPILOGUES=all; =off fuses none.  RESIDUAL is taken only with
 * =all: oneDNN 2.6's binary-add post-op cost more than the kernel's pass
 * it saves (tinygpt large's 2048x256x1024 projection: 16.0 vs 15.3 ms,
 * bench/gemm_epilogue, docs/DECISIONS.md), the others win. */
static bool bias_operand(const IrValue *x, const IrValue *c, int64_t N) {
  const IrShape *s = &x->type.shape;
  if (x->type.dtype != IR_DT_F32 || s->rank < 1 || s->rank > c->type.shape.rank || s->dim[s->rank - 1] != N ||
      ir_numel(s) != N)
    return false;
  return x->storage == IR_STORE_ARENA || x->storage == IR_STORE_ALIAS;
}

static bool residual_operand(const IrValue *x, const IrValue *c) {
  return x->type.dtype == IR_DT_F32 && ir_shape_eq(&x->type.shape, &c->type.shape) &&
         (x->storage == IR_STORE_ARENA || x->storage == IR_STORE_ALIAS);
}

/* The epilogue kernel ops[first..] computes on c (N columns): its output
 * and bias or residual in *out and *extra, or CPU_EPI_NONE. */
static CpuGemmEpilogue match_epilogue(const IrFunc *f, int first, const IrValue *c, int64_t N, const IrValue **extra,
                                      const IrValue **out) {
  int nk = 1;
  while (first + nk < f->nops && f->ops[first + nk]->group == f->ops[first]->group) nk++;
  const IrOp *o0 = f->ops[first];
  if (nk > 2 || o0->opcode != IR_OP_ADD || o0->nargs != 2 || o0->args[0] == o0->args[1]) return CPU_EPI_NONE;
  if (o0->args[0] != c && o0->args[1] != c) return CPU_EPI_NONE;
  const IrValue *x = o0->args[0] == c ? o0->args[1] : o0->args[0];
  CpuGemmEpilogue e = bias_operand(x, c, N) ? CPU_EPI_BIAS : residual_operand(x, c) ? CPU_EPI_RESIDUAL : CPU_EPI_NONE;
  const IrValue *last = o0->result;
  if (e != CPU_EPI_NONE && nk == 2) {
    const IrOp *o1 = f->ops[first + 1];
    if (e != CPU_EPI_BIAS || o1->nargs != 1 || o1->args[0] != o0->result || o0->result->storage != IR_STORE_NONE)
      return CPU_EPI_NONE;
    e = o1->opcode == IR_OP_RELU ? CPU_EPI_BIAS_RELU : o1->opcode == IR_OP_GELU ? CPU_EPI_BIAS_GELU : CPU_EPI_NONE;
    last = o1->result;
  }
  if (e == CPU_EPI_NONE || last->storage != IR_STORE_ARENA || last->type.dtype != IR_DT_F32 ||
      !ir_shape_eq(&last->type.shape, &c->type.shape))
    return CPU_EPI_NONE;
  *extra = x;
  *out = last;
  return e;
}

static void plan_epilogues(CpuProgram *p) {
  const IrFunc *f = p->f;
  const char *env = getenv("GRADC_GEMM_EPILOGUES");
  if (env && strcmp(env, "off") == 0) return;
  bool all = env && strcmp(env, "all") == 0;
  int *uses = mem_calloc((size_t)f->nvalues + 1, sizeof(int));
  for (int k = 0; k < f->nops; k++)
    for (int j = 0; j < f->ops[k]->nargs; j++) uses[f->ops[k]->args[j]->id]++;
  int opi = 0;
  for (int i = 0; i + 1 < p->ncode; i++) {
    Gemm *g = &p->code[i].gemm;
    const Instr *next = &p->code[i + 1];
    if (p->code[i].kind != I_GEMM || next->kind != I_KERNEL || next->op->group == 0) continue;
    const IrValue *c = p->code[i].op->result;
    if (g->dt != IR_DT_F32 || g->accumulate || g->nb != 1 || g->tc || g->ldc != g->N || g->coff[0] != 0 ||
        c->storage != IR_STORE_ARENA || g->c != c->offset || uses[c->id] != 1)
      continue;
    while (opi < f->nops && f->ops[opi] != next->op) opi++;
    if (opi == f->nops) break;
    const IrValue *extra, *out;
    CpuGemmEpilogue e = match_epilogue(f, opi, c, g->N, &extra, &out);
    if (e == CPU_EPI_NONE || (e == CPU_EPI_RESIDUAL && !all)) continue;
    int64_t lo = 0, hi = 0, a0, a1;
    value_bytes(out, &lo, &hi);
    if ((value_bytes(g->aroot, &a0, &a1) && overlaps(lo, hi, a0, a1)) ||
        (value_bytes(g->broot, &a0, &a1) && overlaps(lo, hi, a0, a1)) ||
        (value_bytes(extra, &a0, &a1) && overlaps(lo, hi, a0, a1)))
      continue;
    g->epi = e;
    g->extra = extra->offset;
    g->ldr = g->N;
    g->c = out->offset;
    g->absorbs = i + 1;
    p->code[i + 1].absorbed = true;
  }
  free(uses);
}

/* Undo g's epilogue: the kernel runs after it again. */
static void unfuse_epilogue(CpuProgram *p, Gemm *g) {
  p->code[g->absorbs].absorbed = false;
  g->c = p->code[g->absorbs - 1].op->result->offset;
  g->epi = CPU_EPI_NONE;
  g->extra = g->ldr = 0;
  g->absorbs = -1;
  for (int k = 0; k < g->nplans; k++) cpu_gemm_free(g->plans[k]);
  g->nplans = 0;
}

int cpu_program_packed_gemms(const CpuProgram *p) {
  int n = 0;
  for (int i = 0; i < p->ncode; i++) n += p->code[i].kind == I_GEMM && p->code[i].gemm.pack_a;
  return n;
}

int cpu_program_batched_gemms(const CpuProgram *p) {
  int n = 0;
  for (int i = 0; i < p->ncode; i++) n += p->code[i].kind == I_GEMM && p->code[i].gemm.bo > 0;
  return n;
}

int cpu_program_matmul_kernels(const CpuProgram *p) {
  int n = 0;
  for (int i = 0; i < p->ncode; i++) n += p->code[i].kind == I_KERNEL && p->code[i].op->opcode == IR_OP_MATMUL;
  return n;
}

int cpu_program_paired_products(const CpuProgram *p) {
  int n = 0;
  for (int i = 0; i < p->ncode; i++) n += p->code[i].pair;
  return n;
}

int cpu_program_store_first_products(const CpuProgram *p) {
  int n = 0;
  for (int i = 0; i < p->ncode; i++) n += p->code[i].kind == I_KERNEL && p->code[i].store_first;
  return n;
}

int cpu_program_zeroed_bytes(const CpuProgram *p) {
  int64_t n = 0;
  for (int i = 0; i < p->nzero; i++) n += p->zero[i][1] - p->zero[i][0];
  for (int i = 0; i < p->nbuckets; i++)
    for (int k = 0; k < p->buckets[i].nruns; k++) n += p->buckets[i].runs[k].hi - p->buckets[i].runs[k].lo;
  return n > INT32_MAX ? INT32_MAX : (int)n;
}

int cpu_program_absorbed_kernels(const CpuProgram *p) {
  int n = 0;
  for (int i = 0; i < p->ncode; i++) n += p->code[i].kind == I_KERNEL && p->code[i].absorbed;
  return n;
}

/* cpu_program_new, or with cg != NULL a program around kernels already
 * loaded (cpu_program_load_objects; the program owns cg, even on failure). */
static CpuProgram *program_new(IrFunc *f, const CpuOptions *o, CgModule *cg, char *err, size_t errlen) {
  static const CpuOptions defaults = {0};
  if (!o) o = &defaults;
  bool planned = f->arena_size > 0;
  for (int i = 0; i < f->nargs && planned; i++) planned = f->args[i]->storage == IR_STORE_ARENA;
  if (!planned && (f->nargs > 0 || f->nops > 0)) {
    errf(err, errlen, "function '%s' has no memory plan (run memplan)", f->name);
#ifdef GRADC_HAVE_LLVM
    if (cg) cg_module_free(cg);
#endif
    return NULL;
  }
  const CpuGemmProvider *gemm = o->gemm ? cpu_gemm_provider_find(o->gemm) : cpu_gemm_select(o->cache_dir, err, errlen);
  if (!gemm) {
    if (o->gemm) errf(err, errlen, "GEMM provider '%s' is not in this build", o->gemm);
#ifdef GRADC_HAVE_LLVM
    if (cg) cg_module_free(cg);
#endif
    return NULL;
  }
  CpuProgram *p = mem_calloc(1, sizeof *p);
  p->f = f;
  p->cg = cg;
  p->gemm = gemm;
  p->threads = o->threads > 0 ? o->threads : pool_ncores();
  p->code = mem_calloc((size_t)f->nops + 1, sizeof(Instr));
  kp_views_find(f, in_group0, NULL, &p->views);

  /* Kernels: contiguous groups, compiled by the code generator. */
  int maxg = 0;
  for (int i = 0; i < f->nops; i++)
    if (f->ops[i]->group > maxg) maxg = f->ops[i]->group;
  bool *started = mem_calloc((size_t)maxg + 1, sizeof(bool));
  for (int i = 0; i < f->nops; i++) {
    int g = f->ops[i]->group;
    if (g == 0 || (i > 0 && f->ops[i - 1]->group == g)) continue;
    if (started[g]) {
      free(started);
      rt_op_fail(err, errlen, f->ops[i], "is in a kernel whose ops are not contiguous");
      goto error;
    }
    started[g] = true;
  }
  free(started);
  if (maxg > 0 && !p->cg) {
#ifdef GRADC_HAVE_LLVM
    CgOptions co = {.cache_dir = o->cache_dir, .dump_llvm = false, .threads = o->threads};
    p->cg = cg_llvm_compile(f, &co, err, errlen);
    if (!p->cg) goto error;
#else
    errf(err, errlen, "this build has no LLVM: the CPU target cannot run kernels (configure with -DGRADC_LLVM=ON)");
    goto error;
#endif
  }

  p->sums_in_step = true;
  for (int i = 0; i < f->nops; i++) {
    const IrOp *op = f->ops[i];
    if (op->group > 0) {
      if (i > 0 && f->ops[i - 1]->group == op->group) continue;
#ifdef GRADC_HAVE_LLVM
      const CgKernel *k = cg_module_kernel(p->cg, op->group);
      if (!k || !k->fn) {
        rt_op_fail(err, errlen, op, "is in a kernel the code generator did not produce");
        goto error;
      }
      emit(p, (Instr){.kind = I_KERNEL, .op = op, .kernel = k});
#endif
      continue;
    }
    if (!build_op(p, op, err, errlen)) goto error;
  }
  plan_pairs(p);
  if (!plan_buckets(p, err, errlen)) goto error;
  p->colls = mem_calloc((size_t)p->ncolls + 1, sizeof(StepColl));
  p->coll_open = mem_calloc((size_t)p->ncolls + 1, sizeof(bool));

  /* The buckets reduce a gradient buffer when every `grad` of its param
   * reads a last=true wait (a stacked param reduced by slices has one per
   * slice). */
  p->grads = step_grad_bufs(f, &p->ngrads);
  p->count = interp_count_plan_new(f);
  p->reduced = mem_calloc((size_t)p->ngrads + 1, sizeof(bool));
  for (int i = 0; i < p->ngrads; i++) {
    const char *name = f->args[p->grads[i].arg]->name;
    p->reduced[i] = true;
    for (int k = 0; k < f->nops; k++) {
      const IrOp *op = f->ops[k];
      if (op->opcode == IR_OP_GRAD && strcmp(ir_attr_get_str(op, "name", ""), name) == 0)
        p->reduced[i] &= bucket_reduced(op->args[0]);
    }
  }

  p->arena = arena_new(f->arena_size);
  if (!p->arena) {
    errf(err, errlen, "cannot allocate the %lld-byte arena", (long long)f->arena_size);
    goto error;
  }
  plan_epilogues(p);
  plan_zeroing(p);
  plan_direct_args(p);
  /* GRADC_GEMM_THREADS=library: each GEMM threaded by its provider
   * rather than cut over the pool (measured in docs/DECISIONS.md). */
  const char *gt = getenv("GRADC_GEMM_THREADS"), *ge = getenv("GRADC_GEMM_EPILOGUES");
  bool library = gt && strcmp(gt, "library") == 0, loops = ge && strcmp(ge, "all") == 0;
  for (int i = 0; i < p->ncode; i++) {
    Gemm *g = &p->code[i].gemm;
    if (p->code[i].kind != I_GEMM) continue;
    g->widen = g->dt == IR_DT_F16 || (g->dt == IR_DT_BF16 && cpu_gemm_bf16_widen(p->gemm));
    gemm_schedule(g, p->threads, library);
    gemm_group(g, p->threads);
    char e[1024];
    bool ok = gemm_plan_pieces(g, p->gemm, e, sizeof e);
    bool fused = true;
    for (int k = 0; ok && k < g->nplans; k++) fused &= cpu_gemm_fused(g->plans[k]);
    if (ok && g->epi != CPU_EPI_NONE && !fused && !loops) {
      unfuse_epilogue(p, g);
      ok = gemm_plan_pieces(g, p->gemm, e, sizeof e);
    }
    if (!ok) {
      rt_op_fail(err, errlen, p->code[i].op, e);
      goto error;
    }
    int64_t nlow = low_scratch(&p->code[i].gemm);
    if (nlow > p->nlow) p->nlow = nlow;
  }
  if (p->nlow) p->low = mem_alloc((size_t)p->nlow * sizeof(float));
  p->arena_src = mem_calloc((size_t)f->nargs + 1, sizeof(void *));
  step_store_consts(f, store, p->arena, err, errlen);
  p->pool = pool_new(p->threads);
  return p;

error:
  cpu_program_free(p);
  return NULL;
}

CpuProgram *cpu_program_new(IrFunc *f, const CpuOptions *o, char *err, size_t errlen) {
  return program_new(f, o, NULL, err, errlen);
}

void cpu_program_set_params_gen(CpuProgram *p, uint64_t gen) { p->params_gen = gen; }

void cpu_program_skip_grads(CpuProgram *p) { p->no_grads = true; }

const char *cpu_program_gemm_provider(const CpuProgram *p) { return p->gemm->name; }

void cpu_program_recycle(CpuProgram *p, StepResult *r) {
  /* Keep one, and only a result laid out for this program: its gradients
   * are this function's params in order, of their whole sizes. */
  bool fits = !p->have_spare && r->grads && r->losses;
  const IrFunc *f = p->f;
  int k = 0;
  for (int i = 0; fits && i < f->nargs; i++) {
    const IrValue *a = f->args[i];
    if (a->role != IR_ARG_PARAM) continue;
    IrType whole = step_arg_type(a);
    fits = k < r->ngrads && r->grad_names[k] == a->name && r->grads[k] &&
           ir_numel(&r->grad_types[k].shape) == ir_numel(&whole.shape);
    k++;
  }
  if (!fits || k != r->ngrads) {
    step_result_free(r);
    return;
  }
  p->spare = *r;
  p->have_spare = true;
  p->spare_gas = p->gas;
  memset(r, 0, sizeof *r);
}

/* The result of the window starting: the spare one's arrays with its
 * losses, outputs, updates and the gradients that no buffer fills zeroed,
 * else a fresh one (allocating a gradient and an output array a window,
 * page faults and all, was 51 us of tinygpt small's 1.8 ms step). */
static bool result_begin(CpuProgram *p, int gas, StepResult *r, char *err, size_t errlen) {
  if (p->have_spare && (p->spare.noutputs > 0 || p->spare.nupdates > 0) && p->spare_gas != gas) {
    /* Their window shapes depend on gas: a fresh result. */
    step_result_free(&p->spare);
    p->have_spare = false;
  }
  if (!p->have_spare) return step_result_init(p->f, gas, r, err, errlen);
  *r = p->spare;
  p->have_spare = false;
  memset(&p->spare, 0, sizeof p->spare);
  for (int i = 0; i < r->nlosses; i++) r->losses[i] = 0;
  step_result_zero_state(r);
  free(r->dp_reduced);
  r->dp_reduced = NULL;
  for (int j = 0; j < r->ngrads; j++) {
    bool filled = false;
    for (int i = 0; i < p->ngrads && !filled; i++) filled = p->grads[i].slot == j;
    if (!filled) memset(r->grads[j], 0, sizeof(double) * (size_t)ir_numel(&r->grad_types[j].shape));
  }
  return true;
}

/* ------------------------------------------------------------------ */
/* Kernels in artifacts (artifact.h's back-end hook)                    */
/* ------------------------------------------------------------------ */

/* One KOBJ section holds the module's object bundle (cg_module_object).
 * Its name, "HASH;HOST", ties it to the planned function it was compiled
 * from (FNV-1a of the artifact's IR text, 16 hex digits) and to the host
 * it runs on (art_host_id), so that objects that do not fit are refused
 * instead of run, whatever the META section says. */

#ifdef GRADC_HAVE_LLVM
static void kobj_name(const IrFunc *f, const ArtFile *a, char *buf, size_t n) {
  /* The artifact's IR section is f as printed (and what f was read
   * from): hash its bytes rather than print a large function again. */
  const ArtSection *ir = art_find(a, "IR", NULL);
  uint64_t h;
  if (ir) {
    h = hash_bytes(ir->data, ir->len, HASH_SEED);
  } else {
    StrBuf sb;
    sb_init(&sb);
    ir_print(f, &sb);
    h = hash_bytes(sb_str(&sb), sb.len, HASH_SEED);
    sb_free(&sb);
  }
  char host[2048];
  art_host_id(host, sizeof host);
  snprintf(buf, n, "%016llx;%s", (unsigned long long)h, host);
}
#endif

bool cpu_program_save_objects(const CpuProgram *p, ArtFile *a, char *err, size_t errlen) {
  if (!p->cg) return true; /* no kernels: nothing to store */
#ifdef GRADC_HAVE_LLVM
  const void *obj;
  size_t len;
  cg_module_object(p->cg, &obj, &len);
  if (!obj || !len) return errf(err, errlen, "the CPU program has no object code to save");
  char name[2200];
  kobj_name(p->f, a, name, sizeof name);
  art_add(a, "KOBJ", name, obj, len);
  return true;
#else
  (void)a;
  return errf(err, errlen, "this build has no LLVM: cannot save kernel objects");
#endif
}

CpuProgram *cpu_program_load_objects(IrFunc *f, const ArtFile *a, const CpuOptions *o, char *err, size_t errlen) {
#ifdef GRADC_HAVE_LLVM
  const ArtSection *s = art_find(a, "KOBJ", NULL);
  if (!s) {
    errf(err, errlen, "no kernel object code (KOBJ section)");
    return NULL;
  }
  char want[2200];
  kobj_name(f, a, want, sizeof want);
  const char *semi = strchr(s->name, ';'), *host = strchr(want, ';') + 1;
  if (!semi || (size_t)(semi - s->name) != 16 || strncmp(s->name, want, 16) != 0) {
    errf(err, errlen, "kernel object code does not belong to this artifact's IR (recompile the model)");
    return NULL;
  }
  if (strcmp(semi + 1, host) != 0) {
    errf(err, errlen, "kernel object code was built for another host (%.400s); this host is %.400s (recompile the model)",
         semi + 1, host);
    return NULL;
  }
  CgModule *cg = cg_module_load_object(f, s->data, s->len, err, errlen);
  if (!cg) return NULL;
  return program_new(f, o, cg, err, errlen);
#else
  (void)f, (void)a, (void)o;
  errf(err, errlen, "this build has no LLVM: the CPU target cannot run kernels");
  return NULL;
#endif
}

/* ------------------------------------------------------------------ */
/* A window                                                            */
/* ------------------------------------------------------------------ */

/* The window's bulk moves (params and inputs in, gradient buffers zeroed,
 * gradients out as doubles) are split over the pool like kernels: at 2
 * threads they were a sixth of an MLP step. */
typedef enum { BULK_COPY, BULK_ZERO, BULK_WIDEN } BulkKind;

typedef struct Bulk {
  BulkKind kind;
  char *dst;
  const char *src;
} Bulk;

#define BULK_CHUNK 65536 /* bytes (BULK_COPY, BULK_ZERO) or f32 elements (BULK_WIDEN) per piece */

static void bulk_chunk(void *ctx, int64_t begin, int64_t end) {
  const Bulk *b = ctx;
  switch (b->kind) {
  case BULK_COPY: memcpy(b->dst + begin, b->src + begin, (size_t)(end - begin)); break;
  case BULK_ZERO: memset(b->dst + begin, 0, (size_t)(end - begin)); break;
  case BULK_WIDEN: rt_widen_f32((double *)b->dst + begin, (const float *)b->src + begin, end - begin); break;
  }
}

/* n bytes (copy, zero) or n f32 elements widened to doubles. */
static void bulk(CpuProgram *p, BulkKind kind, void *dst, const void *src, int64_t n) {
  Bulk b = {kind, dst, src};
  if (n <= 0) return;
  if (n < 4 * BULK_CHUNK || pool_size(p->pool) == 1) {
    bulk_chunk(&b, 0, n);
    return;
  }
  pool_run(p->pool, n, BULK_CHUNK, bulk_chunk, &b);
}

/* Copy micro-batch k of every argument that changes per micro-batch
 * (batched inputs), or every other argument (k < 0). */
static void copy_args(CpuProgram *p, const StTensor *const *bound, int k, bool keep_params) {
  const IrFunc *f = p->f;
  for (int i = 0; i < f->nargs; i++) {
    const IrValue *a = f->args[i];
    bool split = step_arg_split(a);
    if (split != (k >= 0)) continue;
    int64_t n = ir_numel(&a->type.shape), begin = split ? (int64_t)k * n : 0, es;
    if (p->direct[i] && rt_tensor_plain(bound[i], a->type.dtype, &es)) { /* read in place */
      p->argbase[i] = (const char *)bound[i]->data + es * begin;
      p->arena_src[i] = NULL;
      continue;
    }
    p->argbase[i] = p->arena + a->offset;
    if (a->role == IR_ARG_PARAM) {
      /* The same tensors, unchanged since they were copied (the caller's generation). */
      if (keep_params && p->arena_src[i] == bound[i]->data) continue;
      p->arena_src[i] = bound[i]->data;
    }
    if (rt_tensor_plain(bound[i], a->type.dtype, &es))
      bulk(p, BULK_COPY, p->arena + a->offset, (const char *)bound[i]->data + es * begin, es * n);
    else
      rt_tensor_convert(bound[i], begin, n, a->type.dtype, p->arena + a->offset);
  }
}

/* Start a bucket's all-reduces (in place in the gradient buffers). */
static bool bucket_start(CpuProgram *p, Bucket *b, char *err, size_t n) {
  b->open = true;
  if (ir_attr_get_int(b->op, "ranks", 1) == 1) return true;
  CommGroup *g = step_coll_group(b->op, err, n);
  if (!g) return false;
  uint64_t tag = hash_str("bucket") ^ (uint64_t)ir_attr_get_int(b->op, "bucket", -1);
  for (int k = 0; k < b->nruns; k++) {
    BucketRun *r = &b->runs[k];
    char *buf = p->arena + r->lo;
    r->done = false;
    if (!comm_all_reduce_start(g, buf, buf, (r->hi - r->lo) / (r->f64 ? 8 : 4), r->f64 ? COMM_F64 : COMM_F32, COMM_SUM,
                               tag, &r->req, err, n))
      return false;
  }
  return true;
}

static bool bucket_wait(Bucket *b, char *err, size_t n) {
  bool ok = true;
  b->open = false;
  for (int k = 0; k < b->nruns; k++) {
    CommReq *q = b->runs[k].req;
    b->runs[k].req = NULL;
    char e[1024];
    if (q && !comm_wait(q, e, sizeof e) && ok) ok = errf(err, n, "%s", e);
  }
  return ok;
}

/* Let the comm layer progress the collectives in flight (MPI advances
 * non-blocking collectives only inside its calls). */
static bool progress(CpuProgram *p, char *err, size_t n) {
  for (int i = 0; i < p->ncolls; i++) {
    bool done;
    if (p->coll_open[i] && !step_coll_test(&p->colls[i], &done, err, n)) return false;
  }
  for (int i = 0; i < p->nbuckets; i++) {
    Bucket *b = &p->buckets[i];
    for (int k = 0; b->open && k < b->nruns; k++) {
      BucketRun *r = &b->runs[k];
      if (r->req && !r->done && !comm_test(r->req, &r->done, err, n)) return false;
    }
  }
  return true;
}

/* After a failure: complete whatever is still in flight. */
static void drain(CpuProgram *p) {
  char e[256];
  for (int i = 0; i < p->ncolls; i++)
    if (p->coll_open[i]) {
      p->coll_open[i] = false;
      (void)step_coll_wait(&p->colls[i], p->colls[i].recv, e, sizeof e);
    }
  for (int i = 0; i < p->nbuckets; i++)
    if (p->buckets[i].open) (void)bucket_wait(&p->buckets[i], e, sizeof e);
}

/* tp.scatter, rank.slice, rank.concat: copies at this rank's offsets. */
static bool run_rank_copy(CpuProgram *p, const Instr *in, char *err, size_t n) {
  const IrOp *op = in->op;
  int rank;
  if (!step_rank_of(op, &rank, err, n)) return false;
  enum { MAXOPS = 1024 };
  const void *src[MAXOPS];
  if (op->nargs > MAXOPS) return rt_op_fail(err, n, op, "has too many operands");
  for (int j = 0; j < op->nargs; j++) src[j] = p->arena + rt_storage_root(op->args[j])->offset;
  step_rank_copy(op, rank, ir_dtype_size(op->result->type.dtype), src, p->arena + in->dst);
  return true;
}

/* The code an I_KERNEL runs: a store-first product's twin in a window's
 * first micro-batch (plan_zeroing). */
static const CgKernel *kernel_of(const Instr *in, bool first) {
  return first && in->store_first ? in->twin : in->kernel;
}

/* One micro-batch; first: the window's first (store-first GEMMs and
 * products store); last: the window's last, where buckets communicate. */
static bool run_micro_batch(CpuProgram *p, StepResult *r, bool first, bool last, char *err, size_t n) {
  int open = 0; /* collectives in flight */
  bool ok = true;
  Trace *t = trace_current(); /* compute spans when tracing */
  for (int i = 0; ok && i < p->ncode; i++) {
    const Instr *in = &p->code[i];
    double t0 = t && in->kind <= I_COPY ? trace_now_us(t) : 0;
    switch (in->kind) {
    case I_KERNEL:
      if (in->absorbed) continue;
      if (in->pair) { /* both kernels' spans are the pair's time */
        run_pair(p, kernel_of(in, first), kernel_of(&p->code[i + 1], first));
        if (t) trace_span(t, TRACE_COMPUTE, in->kernel->name, t0, trace_now_us(t));
        in = &p->code[++i];
        break;
      }
      run_kernel(p, kernel_of(in, first));
      break;
    case I_GEMM: run_gemm(p, &in->gemm, first); break;
    case I_COPY: memmove(p->arena + in->dst, p->arena + in->src, (size_t)in->bytes); break;
    case I_WSUM:
      if (p->sums_here) memcpy(p->arena + in->dst, p->arena + in->src, (size_t)in->bytes);
      break;
    case I_LOSS: {
      const IrValue *v = in->op->args[0];
      step_add_loss(r, in->op, p->arena + in->src, v->type.dtype, ir_numel(&v->type.shape));
      break;
    }
    case I_STATE: {
      const IrValue *v = in->op->args[0];
      step_add_state(r, in->op, p->micro, p->gas, p->arena + in->src, v->type.dtype, ir_numel(&v->type.shape));
      break;
    }
    case I_START:
      ok = step_coll_start(&p->colls[in->slot], in->op, in->f64, p->arena + in->src, p->arena + in->dst, err, n);
      p->coll_open[in->slot] = ok;
      open += ok;
      continue;
    case I_WAIT:
      p->coll_open[in->slot] = false;
      open--;
      ok = step_coll_wait(&p->colls[in->slot], p->arena + in->dst, err, n);
      continue;
    case I_BUCKET_START:
      if (last && in->issue) {
        ok = bucket_start(p, &p->buckets[in->slot], err, n);
        open++;
      }
      continue;
    case I_BUCKET_WAIT:
      if (last && in->issue) {
        ok = bucket_wait(&p->buckets[in->slot], err, n);
        open--;
      }
      continue;
    case I_RANK: ok = run_rank_copy(p, in, err, n); break;
    }
    if (t && in->kind <= I_COPY)
      trace_span(t, TRACE_COMPUTE, in->kind == I_KERNEL ? in->kernel->name : in->kind == I_GEMM ? "matmul" : "copy", t0,
                 trace_now_us(t));
    if (open > 0) ok = progress(p, err, n);
  }
  if (!ok) drain(p);
  return ok;
}

bool cpu_step_run(CpuProgram *p, int gas, const StFile *params, const char *params_path, const StFile *inputs,
                  const char *inputs_path, StepResult *out, char *err, size_t errlen) {
  const IrFunc *f = p->f;
  pool_wake(p->pool); /* workers asleep since the last window: up while the arguments are bound and copied */
  memset(out, 0, sizeof *out);
  uint64_t gen = p->params_gen;
  p->params_gen = 0; /* for this window only */
  bool no_grads = p->no_grads;
  p->no_grads = false;
  const StTensor **bound = mem_calloc((size_t)f->nargs + 1, sizeof(StTensor *));
  StepResult r = {0};
  bool ok = step_bind(f, gas, params, params_path, inputs, inputs_path, bound, err, errlen) &&
            result_begin(p, gas, &r, err, errlen);
  if (ok) {
    for (int i = 0; i < p->nzero; i++) bulk(p, BULK_ZERO, p->arena + p->zero[i][0], NULL, p->zero[i][1] - p->zero[i][0]);
    for (int i = 0; i < p->nbuckets; i++) /* with the padding between a bucket's buffers */
      for (int k = 0; k < p->buckets[i].nruns; k++)
        bulk(p, BULK_ZERO, p->arena + p->buckets[i].runs[k].lo, NULL, p->buckets[i].runs[k].hi - p->buckets[i].runs[k].lo);
    bool keep = gen != 0 && gen == p->arena_gen;
    p->arena_gen = 0; /* while the params are copied */
    copy_args(p, bound, -1, keep);
    p->arena_gen = gen;
    /* One micro-batch on one rank: its window sums are the step's own. */
    p->sums_here = p->sums_in_step && gas == 1 && step_dp_size() == 1;
    ok = p->sums_here ? step_check_indices(f, p->count, gas, bound, err, errlen)
                      : step_store_window_sums(f, p->count, gas, bound, store, p->arena, err, errlen);
  }
  p->gas = gas;
  for (int k = 0; ok && k < gas; k++) {
    copy_args(p, bound, k, false);
    p->micro = k;
    ok = step_store_rng(f, gas, k, store, p->arena, err, errlen) &&
         run_micro_batch(p, &r, k == 0, k == gas - 1, err, errlen);
  }
  if (ok && !no_grads) {
    for (int i = 0; i < p->ngrads; i++) {
      const StepGradBuf *g = &p->grads[i];
      /* Gradient buffers are f32 or f64. */
      if (g->dt == IR_DT_F32)
        bulk(p, BULK_WIDEN, r.grads[g->slot], p->arena + g->offset, g->numel);
      else
        bulk(p, BULK_COPY, r.grads[g->slot], p->arena + g->offset, g->numel * 8);
      if (p->reduced[i]) {
        if (!r.dp_reduced) r.dp_reduced = mem_calloc((size_t)r.ngrads + 1, sizeof(bool));
        r.dp_reduced[g->slot] = true;
      }
    }
    /* Sharded params: the whole gradient from every tp rank's shard. */
    ok = step_tp_gather(f, &r, err, errlen);
  }
  free(bound);
  if (!ok) {
    step_result_free(&r);
    return false;
  }
  *out = r;
  return true;
}

/* ------------------------------------------------------------------ */
/* The CPU executor as a back end                                       */
/* ------------------------------------------------------------------ */

static void *cpu_compile(IrFunc *f, const BackendOptions *o, char *err, size_t errlen) {
  CpuOptions co = {.threads = o->threads, .cache_dir = o->cache_dir};
  return cpu_program_new(f, &co, err, errlen);
}

/* The kernels' objects, and the GEMM provider (a GEMM section named
 * after it): an artifact runs its GEMMs with the provider it was built
 * with, and refuses to load where that provider is missing, as it
 * refuses another CPU. */
static bool cpu_save(const void *prog, ArtFile *a, char *err, size_t errlen) {
  const CpuProgram *p = prog;
  art_add(a, "GEMM", p->gemm->name, "", 0);
  return cpu_program_save_objects(prog, a, err, errlen);
}

/* From the artifact's kernel objects; an artifact without any (a program
 * with no kernels) is compiled again.  GRADC_GEMM, when set, overrides
 * the artifact's provider. */
static void *cpu_load(IrFunc *f, const ArtFile *a, const BackendOptions *o, char *err, size_t errlen) {
  CpuOptions co = {.threads = o->threads, .cache_dir = o->cache_dir};
  const ArtSection *gs = art_find(a, "GEMM", NULL);
  const char *env = getenv("GRADC_GEMM");
  if (gs && !(env && *env)) {
    const CpuGemmProvider *g = cpu_gemm_provider_find(gs->name);
    char why[512] = "this build of gradc does not have it";
    if (!g || !cpu_gemm_runnable(g, why, sizeof why)) {
      errf(err, errlen, "built for GEMM provider '%s', which is missing here (%s); recompile the model", gs->name, why);
      return NULL;
    }
    co.gemm = gs->name;
  }
  if (!art_find(a, "KOBJ", NULL)) return cpu_program_new(f, &co, err, errlen);
  return cpu_program_load_objects(f, a, &co, err, errlen);
}

/* GRADC_GEMM names a provider this build has. */
static bool cpu_usable(char *err, size_t errlen) { return cpu_gemm_check_env(err, errlen); }

static bool cpu_run(void *prog, int gas, const StFile *params, const char *params_path, const StFile *inputs,
                    const char *inputs_path, StepResult *out, char *err, size_t errlen) {
  return cpu_step_run(prog, gas, params, params_path, inputs, inputs_path, out, err, errlen);
}

static void cpu_set_params_gen(void *prog, uint64_t gen) { cpu_program_set_params_gen(prog, gen); }
static void cpu_recycle(void *prog, StepResult *r) { cpu_program_recycle(prog, r); }
static void cpu_free(void *prog) { cpu_program_free(prog); }

const Backend rt_backend_cpu = {
    .name = "cpu",
    .pipeline = pass_pipeline_cpu,
    .llvm_optim = true,
    .usable = cpu_usable,
    .compile = cpu_compile,
    .save = cpu_save,
    .load = cpu_load,
    .run = cpu_run,
    .set_params_gen = cpu_set_params_gen,
    .recycle = cpu_recycle,
    .free = cpu_free,
};
