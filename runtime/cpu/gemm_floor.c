/* gemm_floor.c - the GEMMs of a program, alone: what `gradc bench` reports
 * as gemm_floor_ms, the time a step would take if it did nothing but its
 * matrix products through the same BLAS on the same threads.
 *
 * rt_gemm_list reads the matmul ops of a function the way the CPU executor
 * plans them from the IR (runtime/gemm_plan.c's rt_gemm_plan_ir,
 * docs/BACKEND.md): torch.matmul semantics (1-D operands, broadcast batch
 * dims; a batch on a grid is one call, as the executor makes it), a
 * group-0 permute of the last two axes becomes a transpose flag, a
 * left-only batch folds into M, and a result in a gradient buffer
 * accumulates (beta = 1).
 * rt_gemm_floor runs that list on private buffers through a GEMM provider
 * (gemm.h: the one the program multiplies with), each GEMM whole, threaded
 * by the provider itself, and times each window.  bf16 GEMMs run as the
 * executor runs them: the provider's bf16 products (a bf16 result where
 * the op's is) unless the host measured widened f32 faster. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gemm_floor.h"
#include "runtime/gemm_plan.h"

#include "gemm.h"

double rt_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

/* One matmul op as a BLAS plan, as the executor plans it from the IR
 * (gemm_plan.c); false for ops the executor would refuse (non-float or
 * mismatched operands), which the floor leaves out. */
static bool plan(const IrOp *op, RtGemm *g) {
  const IrValue *A = op->args[0], *B = op->args[1];
  memset(g, 0, sizeof *g);
  if (!ir_dtype_is_float(A->type.dtype) || B->type.dtype != A->type.dtype || A->type.shape.rank < 1 ||
      B->type.shape.rank < 1)
    return false;
  RtGemmPlan s;
  if (!rt_gemm_plan_ir(op, false, &s, NULL, 0)) return false;
  g->op = op;
  g->dbl = A->type.dtype == IR_DT_F64;
  g->bf16 = A->type.dtype == IR_DT_BF16;
  g->accumulate = s.c->storage == IR_STORE_GRAD;
  g->c_bf16 = g->bf16 && !g->accumulate && op->result->type.dtype == IR_DT_BF16;
  g->ta = s.ta;
  g->tb = s.tb;
  g->M = s.M;
  g->N = s.N;
  g->K = s.K;
  g->nb = s.nb;
  g->na = s.na;
  g->nbb = s.nbb;
  g->aidx = mem_calloc((size_t)g->nb, sizeof(int64_t));
  g->bidx = mem_calloc((size_t)g->nb, sizeof(int64_t));
  if (g->nb > 1) {
    rt_gemm_batch_index(&s.batch, &s.abatch, g->aidx);
    rt_gemm_batch_index(&s.batch, &s.bbatch, g->bidx);
  }
  rt_gemm_plan_free(&s);
  return true;
}

int rt_gemm_list(const IrFunc *f, RtGemm **out) {
  RtGemm *g = mem_calloc((size_t)f->nops + 1, sizeof(RtGemm));
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

/* Element sizes as the provider reads A and B and writes C. */
static size_t es_ab(const RtGemm *g, bool native) { return g->dbl ? 8 : g->bf16 && native ? 2 : 4; }
static size_t es_c(const RtGemm *g, bool native) { return g->dbl ? 8 : g->c_bf16 && native ? 2 : 4; }

/* An operand's buffer, zeroed, on huge pages as the executor's arena is
 * (mem_alloc_huge), so that the floor and the step read memory alike. */
static void *buffer(size_t bytes) {
  void *p = mem_alloc_huge(bytes, true);
  if (!p) abort();
  return p;
}

static void fill(void *p, size_t es, int64_t n, uint64_t *seed) {
  for (int64_t i = 0; i < n; i++) {
    *seed = *seed * 6364136223846793005ull + 1442695040888963407ull;
    double x = ((double)(*seed >> 11) / 9007199254740992.0 - 0.5) * 0.1; /* [-0.05, 0.05) */
    if (es == 8) ((double *)p)[i] = x;
    else if (es == 4) ((float *)p)[i] = (float)x;
    else ((uint16_t *)p)[i] = ir_f32_to_bf16((float)x);
  }
}

/* A batch whose matrices lie on a grid (they do unless a broadcast
 * operand repeats irregularly) runs as one call, as the executor runs it
 * (exec.c gemm_group): the batch levels of d (left unset: a call per
 * matrix). */
static void batch_levels(const RtGemm *g, CpuGemmDesc *d) {
  int64_t *off[3] = {mem_calloc((size_t)g->nb, sizeof(int64_t)), mem_calloc((size_t)g->nb, sizeof(int64_t)),
                     mem_calloc((size_t)g->nb, sizeof(int64_t))};
  for (int64_t t = 0; t < g->nb; t++) {
    off[0][t] = g->aidx[t] * g->M * g->K;
    off[1][t] = g->bidx[t] * g->K * g->N;
    off[2][t] = t * g->M * g->N;
  }
  RtGemmGrid q;
  bool grid = rt_gemm_grid((const int64_t *const *)off, g->nb, &q);
  if (grid && q.n2 == 1) {
    d->batch = q.n1, d->stride_a = q.s1[0], d->stride_b = q.s1[1], d->stride_c = q.s1[2];
  } else if (grid) {
    d->outer = q.n1, d->outer_a = q.s1[0], d->outer_b = q.s1[1], d->outer_c = q.s1[2];
    d->batch = q.n2, d->stride_a = q.s2[0], d->stride_b = q.s2[1], d->stride_c = q.s2[2];
  }
  for (int k = 0; k < 3; k++) free(off[k]);
}

/* One op's calls through the provider's plan of its shape. */
static void run_one(const RtGemm *g, const CpuGemm *plan, const Bufs *b, bool native) {
  int64_t mk = g->M * g->K, kn = g->K * g->N, mn = g->M * g->N;
  size_t es = es_ab(g, native), esc = es_c(g, native);
  if (cpu_gemm_count(cpu_gemm_desc(plan)) > 1) { /* the whole batch in one call */
    cpu_gemm_run(plan, (const char *)b->a + (size_t)(g->aidx[0] * mk) * es,
                 (const char *)b->b + (size_t)(g->bidx[0] * kn) * es, b->c, NULL);
    return;
  }
  for (int64_t t = 0; t < g->nb; t++) {
    const char *a = (const char *)b->a + (size_t)(g->aidx[t] * mk) * es;
    const char *bm = (const char *)b->b + (size_t)(g->bidx[t] * kn) * es;
    char *c = (char *)b->c + (size_t)(t * mn) * esc;
    cpu_gemm_run(plan, a, bm, c, NULL);
  }
}

struct RtGemmFloor {
  const RtGemm *g;
  int n, gas;
  bool native; /* bf16 GEMMs as the provider's own, as the executor runs them */
  CpuGemm **plans;
  Bufs *b;
};

static void floor_free_parts(CpuGemm **plans, Bufs *b, int n) {
  for (int i = 0; i < n; i++) {
    if (b) {
      free(b[i].a);
      free(b[i].b);
      free(b[i].c);
    }
    cpu_gemm_free(plans[i]);
  }
  free(b);
  free(plans);
}

RtGemmFloor *rt_gemm_floor_new(const RtGemm *g, int n, int gas, int threads, const char *provider, char *err,
                               size_t errlen) {
  const CpuGemmProvider *prov = provider ? cpu_gemm_provider_find(provider) : NULL;
  if (!prov) {
    errf(err, errlen, "no GEMM provider '%s' in this build", provider ? provider : "(none)");
    return NULL;
  }
  CpuGemm **plans = mem_calloc((size_t)n + 1, sizeof(CpuGemm *));
  bool ok = true, native = false;
  for (int i = 0; i < n && !native; i++) native = g[i].bf16 && !cpu_gemm_bf16_widen(prov);
  for (int i = 0; i < n && ok; i++) {
    CpuGemmType t = g[i].dbl ? CPU_GEMM_F64 : g[i].bf16 && native ? CPU_GEMM_BF16 : CPU_GEMM_F32;
    CpuGemmDesc d = {.type = t, .ta = g[i].ta, .tb = g[i].tb, .c_bf16 = g[i].c_bf16 && native,
                     .accumulate = g[i].accumulate, .M = g[i].M, .N = g[i].N, .K = g[i].K,
                     .lda = g[i].ta ? g[i].M : g[i].K, .ldb = g[i].tb ? g[i].K : g[i].N, .ldc = g[i].N,
                     .threads = threads > 0 ? threads : pool_ncores()};
    batch_levels(&g[i], &d);
    plans[i] = cpu_gemm_plan(prov, &d, err, errlen);
    ok = plans[i] != NULL;
  }
  if (!ok) {
    floor_free_parts(plans, NULL, n);
    return NULL;
  }
  Bufs *b = mem_calloc((size_t)n + 1, sizeof(Bufs));
  uint64_t seed = 0x9e3779b97f4a7c15ull;
  for (int i = 0; i < n; i++) {
    size_t es = es_ab(&g[i], native);
    int64_t na = g[i].na, nbb = g[i].nbb;
    for (int64_t t = 0; t < g[i].nb; t++) {
      if (g[i].aidx[t] + 1 > na) na = g[i].aidx[t] + 1;
      if (g[i].bidx[t] + 1 > nbb) nbb = g[i].bidx[t] + 1;
    }
    b[i].a = buffer((size_t)(na * g[i].M * g[i].K) * es);
    b[i].b = buffer((size_t)(nbb * g[i].K * g[i].N) * es);
    b[i].c = buffer((size_t)(g[i].nb * g[i].M * g[i].N) * es_c(&g[i], native));
    fill(b[i].a, es, na * g[i].M * g[i].K, &seed);
    fill(b[i].b, es, nbb * g[i].K * g[i].N, &seed);
  }
  RtGemmFloor *fl = mem_calloc(1, sizeof *fl);
  *fl = (RtGemmFloor){g, n, gas, native, plans, b};
  return fl;
}

void rt_gemm_floor_time(RtGemmFloor *fl, int warmup, int reps, double *ms) {
  for (int r = -warmup; r < reps; r++) {
    double t0 = rt_now_ms();
    /* Results that accumulate (beta = 1) keep growing across windows;
     * with operands in [-0.05, 0.05) they stay far from overflow. */
    for (int k = 0; k < fl->gas; k++)
      for (int i = 0; i < fl->n; i++) run_one(&fl->g[i], fl->plans[i], &fl->b[i], fl->native);
    double t1 = rt_now_ms();
    if (r >= 0) ms[r] = t1 - t0;
  }
}

void rt_gemm_floor_free(RtGemmFloor *fl) {
  if (!fl) return;
  floor_free_parts(fl->plans, fl->b, fl->n);
  free(fl);
}

bool rt_gemm_floor(const RtGemm *g, int n, int gas, int threads, const char *provider, int warmup, int reps, double *ms,
                   char *err, size_t errlen) {
  RtGemmFloor *fl = rt_gemm_floor_new(g, n, gas, threads, provider, err, errlen);
  if (!fl) return false;
  rt_gemm_floor_time(fl, warmup, reps, ms);
  rt_gemm_floor_free(fl);
  return true;
}
