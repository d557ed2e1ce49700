/* gemm_floor.c - the GEMMs of a program, alone: what `gradc bench` reports
 * as gemm_floor_ms, the time a step would take if it did nothing but its
 * matrix products through the same BLAS on the same threads.
 *
 * rt_gemm_list reads the matmul ops of a function the way the CPU executor
 * plans them (runtime/exec.c, docs/BACKEND.md): torch.matmul semantics
 * (1-D operands, broadcast batch dims as a loop of calls), a group-0
 * permute of the last two axes becomes a transpose flag, a left-only batch
 * folds into M, and a result in a gradient buffer accumulates (beta = 1).
 * rt_gemm_floor runs that list on private buffers and times each window. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gemm_floor.h"

#ifdef GRADC_HAVE_BLAS
#include <cblas.h>
#endif

double rt_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

static void *xcalloc(size_t n, size_t size) {
  void *p = calloc(n ? n : 1, size);
  if (!p) abort();
  return p;
}

/* A permute of the last two axes left to the executor as a GEMM flag (as
 * exec.c decides: group 0, no storage of its own). */
static bool is_flag_permute(const IrValue *v) {
  const IrOp *d = v->def;
  if (!d || d->group != 0 || d->opcode != IR_OP_PERMUTE || v->storage != IR_STORE_NONE) return false;
  const int64_t *perm;
  int n = ir_attr_get_ints(d, "perm", &perm);
  if (n < 2 || n != v->type.shape.rank) return false;
  for (int i = 0; i < n - 2; i++)
    if (perm[i] != i) return false;
  return perm[n - 2] == n - 1 && perm[n - 1] == n - 2;
}

static const IrValue *storage_root(const IrValue *v) {
  while (v->storage == IR_STORE_ALIAS && v->def && v->def->opcode == IR_OP_RESHAPE) v = v->def->args[0];
  return v;
}

/* out[t]: the operand's batch matrix used by call t (broadcast dims of
 * size 1 repeat their one matrix). */
static void batch_index(const IrShape *batch, const IrShape *ob, int64_t *out) {
  int64_t nb = ir_numel(batch);
  int64_t idx[IR_MAX_RANK] = {0};
  int lead = batch->rank - ob->rank;
  for (int64_t t = 0; t < nb; t++) {
    int64_t o = 0;
    for (int k = 0; k < ob->rank; k++) o = o * ob->dim[k] + (ob->dim[k] == 1 ? 0 : idx[lead + k]);
    out[t] = o;
    for (int k = batch->rank - 1; k >= 0; k--) {
      if (++idx[k] < batch->dim[k]) break;
      idx[k] = 0;
    }
  }
}

/* One matmul op as a BLAS plan; false for ops the executor would refuse
 * (non-float or mismatched operands), which the floor leaves out. */
static bool plan(const IrOp *op, RtGemm *g) {
  const IrValue *A = op->args[0], *B = op->args[1];
  const IrShape *as = &A->type.shape, *bs = &B->type.shape;
  memset(g, 0, sizeof *g);
  if (!ir_dtype_is_float(A->type.dtype) || B->type.dtype != A->type.dtype || as->rank < 1 || bs->rank < 1)
    return false;
  g->op = op;
  g->dbl = A->type.dtype == IR_DT_F64;
  g->ta = is_flag_permute(A);
  g->tb = is_flag_permute(B);
  g->accumulate = storage_root(op->result)->storage == IR_STORE_GRAD;
  g->M = as->rank == 1 ? 1 : as->dim[as->rank - 2];
  g->K = as->dim[as->rank - 1];
  g->N = bs->rank == 1 ? 1 : bs->dim[bs->rank - 1];
  IrShape ab = {0}, bb = {0}, batch;
  ab.rank = as->rank > 2 ? as->rank - 2 : 0;
  bb.rank = bs->rank > 2 ? bs->rank - 2 : 0;
  for (int k = 0; k < ab.rank; k++) ab.dim[k] = as->dim[k];
  for (int k = 0; k < bb.rank; k++) bb.dim[k] = bs->dim[k];
  if (!ir_broadcast_shapes(&ab, &bb, &batch)) return false;
  g->nb = ir_numel(&batch);
  g->na = ir_numel(&ab);
  g->nbb = ir_numel(&bb);
  if (bb.rank == 0 && ab.rank > 0 && !g->ta) {
    g->M *= g->nb;
    g->nb = g->na = 1;
  }
  g->aidx = xcalloc((size_t)g->nb, sizeof(int64_t));
  g->bidx = xcalloc((size_t)g->nb, sizeof(int64_t));
  if (g->nb > 1) {
    batch_index(&batch, &ab, g->aidx);
    batch_index(&batch, &bb, g->bidx);
  }
  return true;
}

int rt_gemm_list(const IrFunc *f, RtGemm **out) {
  RtGemm *g = xcalloc((size_t)f->nops + 1, sizeof(RtGemm));
  int n = 0;
  for (int i = 0; i < f->nops; i++) {
    const IrOp *op = f->ops[i];
    if (op->opcode != IR_OP_MATMUL || op->group != 0) continue;
    if (plan(op, &g[n])) n++;
  }
  *out = g;
  return n;
}

void rt_gemm_list_free(RtGemm *g, int n) {
  if (!g) return;
  for (int i = 0; i < n; i++) {
    free(g[i].aidx);
    free(g[i].bidx);
  }
  free(g);
}

double rt_gemm_flops(const RtGemm *g, int n) {
  double s = 0;
  for (int i = 0; i < n; i++) s += 2.0 * (double)g[i].M * (double)g[i].N * (double)g[i].K * (double)g[i].nb;
  return s;
}

/* Buffers of one GEMM: every A and B matrix it reads and its nb results. */
typedef struct Bufs {
  void *a, *b, *c;
} Bufs;

static void fill(void *p, bool dbl, int64_t n, uint64_t *seed) {
  for (int64_t i = 0; i < n; i++) {
    *seed = *seed * 6364136223846793005ull + 1442695040888963407ull;
    double x = ((double)(*seed >> 11) / 9007199254740992.0 - 0.5) * 0.1; /* [-0.05, 0.05) */
    if (dbl) ((double *)p)[i] = x;
    else ((float *)p)[i] = (float)x;
  }
}

static void run_one(const RtGemm *g, const Bufs *b) {
  int64_t mk = g->M * g->K, kn = g->K * g->N, mn = g->M * g->N;
  size_t es = g->dbl ? 8 : 4;
  int64_t lda = g->ta ? g->M : g->K, ldb = g->tb ? g->K : g->N;
  for (int64_t t = 0; t < g->nb; t++) {
    const char *a = (const char *)b->a + (size_t)(g->aidx[t] * mk) * es;
    const char *bm = (const char *)b->b + (size_t)(g->bidx[t] * kn) * es;
    char *c = (char *)b->c + (size_t)(t * mn) * es;
#ifdef GRADC_HAVE_BLAS
    enum CBLAS_TRANSPOSE TA = g->ta ? CblasTrans : CblasNoTrans, TB = g->tb ? CblasTrans : CblasNoTrans;
    if (g->dbl)
      cblas_dgemm(CblasRowMajor, TA, TB, (blasint)g->M, (blasint)g->N, (blasint)g->K, 1.0, (const double *)a,
                  (blasint)lda, (const double *)bm, (blasint)ldb, g->accumulate ? 1.0 : 0.0, (double *)c, (blasint)g->N);
    else
      cblas_sgemm(CblasRowMajor, TA, TB, (blasint)g->M, (blasint)g->N, (blasint)g->K, 1.0f, (const float *)a,
                  (blasint)lda, (const float *)bm, (blasint)ldb, g->accumulate ? 1.0f : 0.0f, (float *)c, (blasint)g->N);
#else
    /* No BLAS in this build: the executor's plain loop. */
    for (int64_t i = 0; i < g->M; i++)
      for (int64_t j = 0; j < g->N; j++) {
        double s = 0;
        for (int64_t k = 0; k < g->K; k++) {
          int64_t ia = g->ta ? k * lda + i : i * lda + k, ib = g->tb ? j * ldb + k : k * ldb + j;
          s += g->dbl ? ((const double *)a)[ia] * ((const double *)bm)[ib]
                      : (double)(((const float *)a)[ia] * ((const float *)bm)[ib]);
        }
        if (g->dbl) ((double *)c)[i * g->N + j] = s + (g->accumulate ? ((double *)c)[i * g->N + j] : 0);
        else ((float *)c)[i * g->N + j] = (float)s + (g->accumulate ? ((float *)c)[i * g->N + j] : 0.0f);
      }
#endif
  }
}

void rt_gemm_floor(const RtGemm *g, int n, int gas, int threads, int warmup, int reps, double *ms) {
#ifdef GRADC_HAVE_BLAS
  openblas_set_num_threads(threads > 0 ? threads : pool_ncores());
#else
  (void)threads;
#endif
  Bufs *b = xcalloc((size_t)n + 1, sizeof(Bufs));
  uint64_t seed = 0x9e3779b97f4a7c15ull;
  for (int i = 0; i < n; i++) {
    size_t es = g[i].dbl ? 8 : 4;
    int64_t na = g[i].na, nbb = g[i].nbb;
    for (int64_t t = 0; t < g[i].nb; t++) {
      if (g[i].aidx[t] + 1 > na) na = g[i].aidx[t] + 1;
      if (g[i].bidx[t] + 1 > nbb) nbb = g[i].bidx[t] + 1;
    }
    b[i].a = xcalloc((size_t)(na * g[i].M * g[i].K), es);
    b[i].b = xcalloc((size_t)(nbb * g[i].K * g[i].N), es);
    b[i].c = xcalloc((size_t)(g[i].nb * g[i].M * g[i].N), es);
    fill(b[i].a, g[i].dbl, na * g[i].M * g[i].K, &seed);
    fill(b[i].b, g[i].dbl, nbb * g[i].K * g[i].N, &seed);
  }
  for (int r = -warmup; r < reps; r++) {
    double t0 = rt_now_ms();
    /* Results that accumulate (beta = 1) keep growing across windows;
     * with operands in [-0.05, 0.05) they stay far from overflow. */
    for (int k = 0; k < gas; k++)
      for (int i = 0; i < n; i++) run_one(&g[i], &b[i]);
    double t1 = rt_now_ms();
    if (r >= 0) ms[r] = t1 - t0;
  }
  for (int i = 0; i < n; i++) {
    free(b[i].a);
    free(b[i].b);
    free(b[i].c);
  }
  free(b);
}
