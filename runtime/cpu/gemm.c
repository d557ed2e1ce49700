/* gemm.c - the GEMM providers' registry, what every provider shares
 * (bf16 operands widened to f32, epilogues as loops where a provider has
 * no post-ops, f64 handed to the next provider where one has no f64), and
 * the choice of provider per host (gemm.h, docs/BACKEND.md).
 *
 * The choice: GRADC_GEMM names a provider; otherwise each usable provider
 * multiplies a few representative shapes (about a hundred MFLOP each, one
 * thread, the providers taking turns, each shape's best of six after a
 * warm-up, about 0.1 s in all) and
 * the fastest wins (by 10% over the order of preference).  The result is cached in gradc's cache directory,
 * keyed by the CPU's identity (cpuid) and every provider's version string
 * (which includes the core OpenBLAS detected and the kernels BLIS chose),
 * so a host is measured once, and again when a library or the CPU
 * changes.  A corrupt or unreadable entry is a warning and a new
 * measurement. */
#include <cpuid.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gemm.h"
#include "ir/ir.h"
#include "support/support.h"

/* ------------------------------------------------------------------ */
/* Batches                                                             */
/* ------------------------------------------------------------------ */

int64_t cpu_gemm_count(const CpuGemmDesc *d) { return (d->outer > 0 ? d->outer : 1) * (d->batch > 0 ? d->batch : 1); }

void cpu_gemm_offsets(const CpuGemmDesc *d, int64_t u, int64_t *a, int64_t *b, int64_t *c) {
  int64_t nb = d->batch > 0 ? d->batch : 1, o = u / nb, t = u % nb;
  *a = o * d->outer_a + t * d->stride_a;
  *b = o * d->outer_b + t * d->stride_b;
  *c = o * d->outer_c + t * d->stride_c;
}

/* ------------------------------------------------------------------ */
/* The plain loops: a build without any GEMM library                   */
/* ------------------------------------------------------------------ */
#if !defined(GRADC_HAVE_ONEDNN) && !defined(GRADC_HAVE_BLAS) && !defined(GRADC_HAVE_BLIS)
#define GRADC_GEMM_LOOPS 1

static bool loops_usable(char *why, size_t n) {
  (void)why, (void)n;
  return true;
}

static void loops_version(char *buf, size_t n) { snprintf(buf, n, "loops"); }

static void *loops_plan(const CpuGemmDesc *d, char *err, size_t n) {
  if (d->type == CPU_GEMM_BF16 || d->epilogue != CPU_EPI_NONE) {
    snprintf(err, n, "loops run f32 and f64 products only");
    return NULL;
  }
  return (void *)1;
}

/* Accumulated in the operands' type, as a BLAS does. */
static void loops_run(void *p, const CpuGemmDesc *d, const void *a, const void *b, void *c, const float *extra) {
  (void)p, (void)extra;
  bool dbl = d->type == CPU_GEMM_F64;
  for (int64_t u = 0; u < cpu_gemm_count(d); u++)
    for (int64_t i = 0; i < d->M; i++)
      for (int64_t j = 0; j < d->N; j++) {
        int64_t oa, ob, oc;
        cpu_gemm_offsets(d, u, &oa, &ob, &oc);
        double s = 0;
        float sf = 0;
        for (int64_t k = 0; k < d->K; k++) {
          int64_t ia = oa + (d->ta ? k * d->lda + i : i * d->lda + k);
          int64_t ib = ob + (d->tb ? j * d->ldb + k : k * d->ldb + j);
          if (dbl) s += ((const double *)a)[ia] * ((const double *)b)[ib];
          else sf += ((const float *)a)[ia] * ((const float *)b)[ib];
        }
        int64_t ic = oc + i * d->ldc + j;
        if (dbl) ((double *)c)[ic] = s + (d->accumulate ? ((double *)c)[ic] : 0);
        else ((float *)c)[ic] = sf + (d->accumulate ? ((float *)c)[ic] : 0.0f);
      }
}

static void loops_free(void *p) { (void)p; }

static const CpuGemmProvider cpu_gemm_loops = {"loops",   loops_usable, loops_version, loops_plan,
                                                 loops_run, loops_free,   NULL};
#endif

/* ------------------------------------------------------------------ */
/* The registry                                                        */
/* ------------------------------------------------------------------ */

#ifdef GRADC_HAVE_ONEDNN
extern const CpuGemmProvider cpu_gemm_onednn;
#endif
#ifdef GRADC_HAVE_BLAS
extern const CpuGemmProvider cpu_gemm_openblas;
#endif
#ifdef GRADC_HAVE_BLIS
extern const CpuGemmProvider cpu_gemm_blis;
#endif

static const CpuGemmProvider *const registry[] = {
#ifdef GRADC_HAVE_ONEDNN
    &cpu_gemm_onednn,
#endif
#ifdef GRADC_HAVE_BLAS
    &cpu_gemm_openblas,
#endif
#ifdef GRADC_HAVE_BLIS
    &cpu_gemm_blis,
#endif
#ifdef GRADC_GEMM_LOOPS
    &cpu_gemm_loops,
#endif
};
#define NPROVIDERS ((int)(sizeof registry / sizeof *registry))

int cpu_gemm_providers(const CpuGemmProvider *const **out) {
  *out = registry;
  return NPROVIDERS;
}

const CpuGemmProvider *cpu_gemm_provider_find(const char *name) {
  for (int i = 0; i < NPROVIDERS; i++)
    if (strcmp(registry[i]->name, name) == 0) return registry[i];
  return NULL;
}

/* ------------------------------------------------------------------ */
/* Plans                                                               */
/* ------------------------------------------------------------------ */

struct CpuGemm {
  CpuGemmDesc d;               /* as asked */
  CpuGemmDesc pd;              /* as the provider runs it */
  const CpuGemmProvider *p;    /* who runs the product */
  void *impl;
  bool widen;                  /* bf16 A and B widened to contiguous f32 per call */
  bool epi_loop;               /* the epilogue runs as a loop after the product */
  bool scratch_c;              /* the product goes to scratch first (an accumulating looped epilogue) */
  bool round_c;                /* a bf16 C: the f32 product goes to scratch, then is rounded into C */
};

const CpuGemmDesc *cpu_gemm_desc(const CpuGemm *g) { return &g->d; }
bool cpu_gemm_fused(const CpuGemm *g) { return g->d.epilogue != CPU_EPI_NONE && !g->epi_loop; }
const char *cpu_gemm_kernel(const CpuGemm *g) { return g->p->kernel ? g->p->kernel(g->impl) : g->p->name; }

/* The fallbacks' f32 copies (widened operands, a product in scratch)
 * hold every matrix of the batch, contiguous, outer-major. */
static void dense_batch(const CpuGemmDesc *d, int64_t per, int64_t *stride, int64_t *outer) {
  *stride = per;
  *outer = (d->batch > 0 ? d->batch : 1) * per;
}

CpuGemm *cpu_gemm_plan(const CpuGemmProvider *p, const CpuGemmDesc *d, char *err, size_t n) {
  CpuGemm *g = mem_calloc(1, sizeof *g);
  g->d = *d;
  if (g->d.threads < 1) g->d.threads = 1;
  g->pd = g->d;
  g->p = p;
  char why[512] = "";
  g->impl = p->plan(&g->pd, why, sizeof why);
  if (g->impl) return g;
  /* What the provider cannot run itself: a bf16 C as an f32 product
   * rounded after, bf16 as widened f32, an epilogue as a loop, f64 on
   * the next provider that has it. */
  if (d->c_bf16) {
    GRADC_ASSERT(d->type == CPU_GEMM_BF16 && !d->accumulate && d->epilogue == CPU_EPI_NONE);
    g->round_c = true;
    g->pd.c_bf16 = false;
    g->pd.ldc = d->N;
    dense_batch(d, d->M * d->N, &g->pd.stride_c, &g->pd.outer_c);
    g->impl = p->plan(&g->pd, why, sizeof why);
  }
  if (!g->impl && d->type == CPU_GEMM_BF16) {
    g->widen = true;
    g->pd.type = CPU_GEMM_F32;
    g->pd.lda = d->ta ? d->M : d->K;
    g->pd.ldb = d->tb ? d->K : d->N;
    if (d->stride_a || d->outer_a) dense_batch(d, d->M * d->K, &g->pd.stride_a, &g->pd.outer_a);
    if (d->stride_b || d->outer_b) dense_batch(d, d->K * d->N, &g->pd.stride_b, &g->pd.outer_b);
    g->impl = p->plan(&g->pd, why, sizeof why);
  }
  if (!g->impl && d->epilogue != CPU_EPI_NONE) {
    g->epi_loop = true;
    g->pd.epilogue = CPU_EPI_NONE;
    g->impl = p->plan(&g->pd, why, sizeof why);
  }
  for (int i = 0; !g->impl && d->type == CPU_GEMM_F64 && i < NPROVIDERS; i++) {
    char w[256];
    if (registry[i] == p || !registry[i]->usable(w, sizeof w)) continue;
    g->p = registry[i];
    g->impl = g->p->plan(&g->pd, w, sizeof w);
  }
  if (!g->impl) {
    snprintf(err, n, "GEMM provider %s cannot run a %lldx%lldx%lld GEMM: %s", p->name, (long long)d->M,
             (long long)d->N, (long long)d->K, why);
    free(g);
    return NULL;
  }
  if (g->epi_loop && d->accumulate) {
    g->scratch_c = true;
    g->pd.accumulate = false;
    g->pd.ldc = d->N;
    dense_batch(d, d->M * d->N, &g->pd.stride_c, &g->pd.outer_c);
  }
  return g;
}

void cpu_gemm_free(CpuGemm *g) {
  if (!g) return;
  g->p->free(g->impl);
  free(g);
}

static float bf16_to_f32(uint16_t x) {
  uint32_t u = (uint32_t)x << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

/* Matrix t of a bf16 operand (stored rows x cols, ld apart) into dst. */
static void widen(const uint16_t *src, int64_t rows, int64_t cols, int64_t ld, float *dst) {
  for (int64_t i = 0; i < rows; i++)
    for (int64_t j = 0; j < cols; j++) dst[i * cols + j] = bf16_to_f32(src[i * ld + j]);
}

static float epilogue(CpuGemmEpilogue e, float x, const float *extra, int64_t i, int64_t j, int64_t ldr) {
  switch (e) {
  case CPU_EPI_NONE: return x;
  case CPU_EPI_BIAS: return x + extra[j];
  case CPU_EPI_BIAS_GELU: return (float)ir_scalar_unary(IR_OP_GELU, (double)(x + extra[j]), 0);
  case CPU_EPI_BIAS_RELU: return (float)ir_scalar_unary(IR_OP_RELU, (double)(x + extra[j]), 0);
  case CPU_EPI_RESIDUAL: return x + extra[i * ldr + j];
  }
  return x;
}

void cpu_gemm_run(const CpuGemm *g, const void *a, const void *b, void *c, const float *extra) {
  const CpuGemmDesc *d = &g->d;
  int64_t nb = cpu_gemm_count(d), oa, ob, oc;
  float *wa = NULL, *wb = NULL, *sc = NULL;
  if (g->widen) {
    int64_t ra = d->ta ? d->K : d->M, ca = d->ta ? d->M : d->K, rb = d->tb ? d->N : d->K, cb = d->tb ? d->K : d->N;
    int64_t na = d->stride_a || d->outer_a ? nb : 1, nbb = d->stride_b || d->outer_b ? nb : 1;
    wa = mem_alloc(sizeof(float) * (size_t)(na * ra * ca + 1));
    wb = mem_alloc(sizeof(float) * (size_t)(nbb * rb * cb + 1));
    for (int64_t u = 0; u < na; u++) {
      cpu_gemm_offsets(d, u, &oa, &ob, &oc);
      widen((const uint16_t *)a + oa, ra, ca, d->lda, wa + u * ra * ca);
    }
    for (int64_t u = 0; u < nbb; u++) {
      cpu_gemm_offsets(d, u, &oa, &ob, &oc);
      widen((const uint16_t *)b + ob, rb, cb, d->ldb, wb + u * rb * cb);
    }
    a = wa;
    b = wb;
  }
  void *out = c;
  if (g->scratch_c || g->round_c) out = sc = mem_alloc(sizeof(float) * (size_t)(nb * d->M * d->N + 1));
  g->p->run(g->impl, &g->pd, a, b, out, extra);
  if (g->round_c)
    for (int64_t u = 0; u < nb; u++)
      for (int64_t i = 0; i < d->M; i++) {
        cpu_gemm_offsets(d, u, &oa, &ob, &oc);
        uint16_t *row = (uint16_t *)c + oc + i * d->ldc;
        const float *src = sc + (u * d->M + i) * d->N;
        for (int64_t j = 0; j < d->N; j++) row[j] = ir_f32_to_bf16(src[j]);
      }
  if (g->epi_loop) { /* f32 results only: epilogues are for f32 and bf16 GEMMs */
    for (int64_t u = 0; u < nb; u++)
      for (int64_t i = 0; i < d->M; i++) {
        cpu_gemm_offsets(d, u, &oa, &ob, &oc);
        float *row = (float *)c + oc + i * d->ldc;
        const float *src = sc ? sc + (u * d->M + i) * d->N : row;
        for (int64_t j = 0; j < d->N; j++) {
          float v = epilogue(d->epilogue, src[j], extra, i, j, d->ldr);
          row[j] = sc ? row[j] + v : v;
        }
      }
  }
  free(wa);
  free(wb);
  free(sc);
}

/* ------------------------------------------------------------------ */
/* The host                                                            */
/* ------------------------------------------------------------------ */

bool cpu_gemm_has_avx2(void) {
  unsigned a, b, c, d;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
  return (b >> 5) & 1;
}

void cpu_gemm_cpu_id(char *buf, size_t n) {
  unsigned a = 0, b = 0, c = 0, d = 0;
  char vendor[13] = "unknown", brand[49] = "";
  if (__get_cpuid(0, &a, &b, &c, &d)) {
    memcpy(vendor, &b, 4);
    memcpy(vendor + 4, &d, 4);
    memcpy(vendor + 8, &c, 4);
    vendor[12] = 0;
  }
  unsigned sig = 0;
  if (__get_cpuid(1, &a, &b, &c, &d)) sig = a;
  unsigned fam = (sig >> 8) & 15, model = (sig >> 4) & 15, step = sig & 15;
  if (fam == 15) fam += (sig >> 20) & 255;
  if (fam >= 6) model += ((sig >> 16) & 15) << 4;
  unsigned ext = 0;
  if (__get_cpuid(0x80000000u, &ext, &b, &c, &d) && ext >= 0x80000004u)
    for (unsigned k = 0; k < 3; k++) {
      unsigned r[4];
      __get_cpuid(0x80000002u + k, &r[0], &r[1], &r[2], &r[3]);
      memcpy(brand + 16 * k, r, 16);
    }
  brand[48] = 0;
  unsigned b7 = 0, c7 = 0, d7 = 0, a7 = 0;
  __get_cpuid_count(7, 0, &a7, &b7, &c7, &d7);
  unsigned a71 = 0, b71, c71, d71;
  __get_cpuid_count(7, 1, &a71, &b71, &c71, &d71);
  const char *brand_start = brand;
  while (*brand_start == ' ') brand_start++;
  snprintf(buf, n, "%s %u/%u/%u %s;%s%s%s%s%s", vendor, fam, model, step, brand_start, (b7 >> 5) & 1 ? " avx2" : "",
           (b7 >> 16) & 1 ? " avx512f" : "", (a71 >> 5) & 1 ? " avx512_bf16" : "", (d7 >> 22) & 1 ? " amx_bf16" : "",
           (d7 >> 24) & 1 ? " amx_tile" : "");
}

/* Bumped when the measurement changes, so old choices are measured again. */
#define SELECT_VERSION 1

static void host_text(StrBuf *sb) {
  char buf[1024];
  cpu_gemm_cpu_id(buf, sizeof buf);
  sb_printf(sb, "gradc gemm-provider %d\nhost %s\n", SELECT_VERSION, buf);
  for (int i = 0; i < NPROVIDERS; i++) {
    registry[i]->version(buf, sizeof buf);
    sb_printf(sb, "lib %s %s\n", registry[i]->name, buf);
  }
}

uint64_t cpu_gemm_host_key(void) {
  StrBuf sb;
  sb_init(&sb);
  host_text(&sb);
  uint64_t h = hash_bytes(sb_str(&sb), sb.len, HASH_SEED);
  sb_free(&sb);
  return h;
}

/* ------------------------------------------------------------------ */
/* The measurement                                                     */
/* ------------------------------------------------------------------ */

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

/* Shapes of the models' GEMMs: a projection with its bias (fused where
 * the provider has post-ops, else a pass over C after the product, as
 * the executor's bias kernel makes), a weight gradient (A transposed,
 * accumulating) and an input gradient (B transposed).  2*M*N*K: 67, 134
 * and 134 MFLOP. */
static const struct {
  int64_t M, N, K;
  bool ta, tb, acc;
  CpuGemmEpilogue epi; /* f32 only (the bf16 measurement times bare products) */
} shapes[] = {
    {512, 256, 256, false, false, false, CPU_EPI_BIAS},
    {256, 256, 1024, true, false, true, CPU_EPI_NONE},
    {1024, 256, 256, false, true, false, CPU_EPI_NONE},
};
#define NSHAPES ((int)(sizeof shapes / sizeof *shapes))

/* Shape s as a dense one-thread descriptor of type t (the epilogue set
 * by the caller). */
static CpuGemmDesc shape_desc(int s, CpuGemmType t) {
  CpuGemmDesc d = {.type = t, .ta = shapes[s].ta, .tb = shapes[s].tb, .accumulate = shapes[s].acc,
                   .M = shapes[s].M, .N = shapes[s].N, .K = shapes[s].K, .threads = 1};
  d.lda = d.ta ? d.M : d.K;
  d.ldb = d.tb ? d.K : d.N;
  d.ldc = d.N;
  return d;
}

/* Rounds of the measurement: one to warm up, then MEASURE_ROUNDS timed. */
#define MEASURE_ROUNDS 6

/* ms[i] for each provider i with plan[i] set: over the shapes, each its
 * best of MEASURE_ROUNDS after a warm-up.  The providers take turns, a
 * round of every shape each, so that a moment when the host is slow (a
 * neighbour's burst on a shared machine) falls on all of them rather than
 * on whichever was being timed (docs/DECISIONS.md "GEMM providers"). */
static void measure_all(CpuGemm *(*plan)[NSHAPES], int n, float *a, float *b, float *c, double *ms) {
  double best[16][NSHAPES];
  for (int i = 0; i < n; i++)
    for (int s = 0; s < NSHAPES; s++) best[i][s] = INFINITY;
  for (int r = 0; r <= MEASURE_ROUNDS; r++)
    for (int i = 0; i < n; i++)
      for (int s = 0; s < NSHAPES && plan[i][0]; s++) {
        double t0 = now_ms();
        cpu_gemm_run(plan[i][s], a, b, c, b); /* b's first N values the bias */
        double t = now_ms() - t0;
        if (r > 0 && t < best[i][s]) best[i][s] = t;
      }
  for (int i = 0; i < n; i++) {
    ms[i] = plan[i][0] ? 0 : -1;
    for (int s = 0; s < NSHAPES && plan[i][0]; s++) ms[i] += best[i][s];
  }
}

/* bf16: the provider's own kernels against f32 ones on the operands
 * widened once (what the executor does then), over the same shapes, one
 * thread.  oneDNN 2.6.3's AVX512-BF16 brgemm ran at 35-78 GFLOP/s where
 * its f32 one ran at 63-139 on the Xeon these were first measured on
 * (VDPBF16PS at a quarter of VFMADD's rate there): the widened f32
 * product, exact in f32 as the bf16 one is, is the faster bf16 GEMM. */
typedef struct Bf16Choice {
  const CpuGemmProvider *p;
  bool widen;
} Bf16Choice;
static pthread_mutex_t bf16_lock = PTHREAD_MUTEX_INITIALIZER;
static Bf16Choice bf16_choice[8];
static int nbf16_choice;

static double measure_bf16(const CpuGemmProvider *p, bool native, const uint16_t *a16, const uint16_t *b16, float *a,
                           float *b, float *c) {
  double total = 0;
  for (int s = 0; s < NSHAPES; s++) {
    CpuGemmDesc d = shape_desc(s, native ? CPU_GEMM_BF16 : CPU_GEMM_F32);
    char err[512];
    CpuGemm *g = cpu_gemm_plan(p, &d, err, sizeof err);
    if (!g) return INFINITY;
    if (native && g->widen) { /* the provider widens per call itself: the executor's widening is no slower */
      cpu_gemm_free(g);
      return INFINITY;
    }
    int64_t na = d.M * d.K, nb = d.K * d.N;
    double best = INFINITY;
    for (int r = 0; r < 4; r++) {
      double t0 = now_ms();
      if (native) {
        cpu_gemm_run(g, a16, b16, c, NULL);
      } else {
        for (int64_t i = 0; i < na; i++) a[i] = bf16_to_f32(a16[i]);
        for (int64_t i = 0; i < nb; i++) b[i] = bf16_to_f32(b16[i]);
        cpu_gemm_run(g, a, b, c, NULL);
      }
      double t = now_ms() - t0;
      if (r > 0 && t < best) best = t;
    }
    cpu_gemm_free(g);
    total += best;
  }
  return total;
}

bool cpu_gemm_bf16_widen(const CpuGemmProvider *p) {
  const char *e = getenv("GRADC_GEMM_BF16");
  if (e && strcmp(e, "native") == 0) return false;
  if (e && strcmp(e, "widen") == 0) return true;
  pthread_mutex_lock(&bf16_lock);
  for (int i = 0; i < nbf16_choice; i++)
    if (bf16_choice[i].p == p) {
      bool w = bf16_choice[i].widen;
      pthread_mutex_unlock(&bf16_lock);
      return w;
    }
  size_t most = 0;
  for (int s = 0; s < NSHAPES; s++) {
    size_t x = (size_t)(shapes[s].M * shapes[s].K + shapes[s].K * shapes[s].N);
    most = x > most ? x : most;
  }
  uint16_t *a16 = mem_calloc(most, 2), *b16 = mem_calloc(most, 2);
  float *a = mem_calloc(most, 4), *b = mem_calloc(most, 4), *c = mem_calloc(most, 4);
  for (size_t i = 0; i < most; i++) a16[i] = b16[i] = (uint16_t)(0x3f80 + (i * 2654435761u >> 25)); /* in [1, 2) */
  double native = measure_bf16(p, true, a16, b16, a, b, c), widened = measure_bf16(p, false, a16, b16, a, b, c);
  free(a16), free(b16), free(a), free(b), free(c);
  bool w = !(native < widened);
  if (nbf16_choice < (int)(sizeof bf16_choice / sizeof *bf16_choice)) bf16_choice[nbf16_choice++] = (Bf16Choice){p, w};
  pthread_mutex_unlock(&bf16_lock);
  return w;
}

int cpu_gemm_measure(double *ms, char (*why)[256], int nmax) {
  size_t most = 0;
  for (int s = 0; s < NSHAPES; s++) {
    size_t x = (size_t)(shapes[s].M * shapes[s].K + shapes[s].K * shapes[s].N + shapes[s].M * shapes[s].N);
    if (x > most) most = x;
  }
  float *a = mem_alloc(most * sizeof(float)), *b = mem_alloc(most * sizeof(float)), *c = mem_alloc(most * sizeof(float));
  for (size_t i = 0; i < most; i++) a[i] = b[i] = c[i] = (float)((i * 2654435761u) % 1000) * 1e-4f - 0.05f;
  int n = NPROVIDERS < nmax ? NPROVIDERS : nmax;
  if (n > 16) n = 16;
  CpuGemm *plan[16][NSHAPES];
  memset(plan, 0, sizeof plan);
  for (int i = 0; i < n; i++) {
    why[i][0] = 0;
    if (!registry[i]->usable(why[i], sizeof why[i])) continue;
    for (int s = 0; s < NSHAPES; s++) {
      CpuGemmDesc d = shape_desc(s, CPU_GEMM_F32);
      d.epilogue = shapes[s].epi;
      char err[512];
      plan[i][s] = cpu_gemm_plan(registry[i], &d, err, sizeof err);
      if (!plan[i][s]) {
        snprintf(why[i], sizeof why[i], "cannot plan an f32 GEMM");
        for (int t = 0; t < s; t++) cpu_gemm_free(plan[i][t]);
        plan[i][0] = NULL;
        break;
      }
    }
  }
  measure_all(plan, n, a, b, c, ms);
  int best = -1;
  for (int i = 0; i < n; i++) {
    for (int s = 0; s < NSHAPES && plan[i][0]; s++) cpu_gemm_free(plan[i][s]);
    /* A later provider must be clearly faster (10%) to displace an
     * earlier one: noise on a busy machine should not flip the choice
     * (and with it the rounding of every GEMM) from one host measurement
     * to the next. */
    if (ms[i] >= 0 && (best < 0 || ms[i] < 0.9 * ms[best])) best = i;
  }
  free(a);
  free(b);
  free(c);
  return best;
}

/* ------------------------------------------------------------------ */
/* The choice                                                          */
/* ------------------------------------------------------------------ */

/* The provider chosen when none is usable: the first of the build, which
 * is correct if slow (OpenBLAS's generic kernels, say), rather than none. */
static const CpuGemmProvider *last_resort(void) {
  char why[256];
  for (int i = 0; i < NPROVIDERS; i++)
    if (registry[i]->usable(why, sizeof why)) return NULL;
  return registry[0];
}

bool cpu_gemm_runnable(const CpuGemmProvider *p, char *why, size_t n) {
  return p->usable(why, n) || p == last_resort();
}

static pthread_mutex_t select_lock = PTHREAD_MUTEX_INITIALIZER;
static const CpuGemmProvider *chosen;
static char chosen_dir[4096];
static bool chosen_valid, chosen_nodir;

/* The choice an entry records ("choice NAME" after the host lines), if
 * the entry is this host's and the provider is usable here. */
static const CpuGemmProvider *parse_entry(const char *text, size_t len, const char *want_head) {
  size_t hl = strlen(want_head);
  if (len < hl || memcmp(text, want_head, hl) != 0) return NULL;
  const char *c = text + hl;
  if (strncmp(c, "choice ", 7) != 0) return NULL;
  c += 7;
  const char *e = memchr(c, '\n', len - (size_t)(c - text));
  if (!e) return NULL;
  char name[64];
  size_t nl = (size_t)(e - c);
  if (nl == 0 || nl >= sizeof name) return NULL;
  memcpy(name, c, nl);
  name[nl] = 0;
  const CpuGemmProvider *p = cpu_gemm_provider_find(name);
  char why[256];
  return p && cpu_gemm_runnable(p, why, sizeof why) ? p : NULL;
}

static const CpuGemmProvider *choose(const char *dir) {
  StrBuf head;
  sb_init(&head);
  host_text(&head);
  uint64_t key = hash_bytes(sb_str(&head), head.len, HASH_SEED);
  const CpuGemmProvider *p = NULL;
  size_t len = 0;
  char *entry = dir ? cache_get(dir, CPU_GEMM_CACHE_KIND, key, &len) : NULL;
  if (entry) {
    p = parse_entry(entry, len, sb_str(&head));
    if (!p)
      fprintf(stderr, "gradc: warning: ignoring invalid GEMM provider entry %s/%s-%016llx; measuring again\n", dir,
              CPU_GEMM_CACHE_KIND, (unsigned long long)key);
    free(entry);
  }
  if (!p) {
    double ms[16];
    char why[16][256];
    int best = cpu_gemm_measure(ms, why, 16);
    p = best >= 0 ? registry[best] : registry[0];
    if (best < 0)
      fprintf(stderr,
              "gradc: warning: no GEMM provider of this build runs at full speed on this CPU (%s: %s); using it "
              "anyway (a build with oneDNN or BLIS avoids this)\n",
              p->name, why[0]);
    /* Another process that measured this host meanwhile wrote first: its
     * choice stands, so that processes started together agree. */
    char *again = dir ? cache_get(dir, CPU_GEMM_CACHE_KIND, key, &len) : NULL;
    const CpuGemmProvider *theirs = again ? parse_entry(again, len, sb_str(&head)) : NULL;
    free(again);
    if (theirs) {
      sb_free(&head);
      return theirs;
    }
    StrBuf sb;
    sb_init(&sb);
    sb_printf(&sb, "%schoice %s\n", sb_str(&head), p->name);
    for (int i = 0; i < NPROVIDERS && i < 16; i++) {
      if (ms[i] >= 0) sb_printf(&sb, "ms %s %.3f\n", registry[i]->name, ms[i]);
      else sb_printf(&sb, "skipped %s %s\n", registry[i]->name, why[i]);
    }
    if (dir) cache_put(dir, CPU_GEMM_CACHE_KIND, key, sb_str(&sb), sb.len);
    sb_free(&sb);
  }
  sb_free(&head);
  return p;
}

/* "onednn, openblas, blis" */
static void names(char *buf, size_t n) {
  buf[0] = 0;
  for (int i = 0; i < NPROVIDERS; i++)
    snprintf(buf + strlen(buf), n - strlen(buf), "%s%s", i ? ", " : "", registry[i]->name);
}

bool cpu_gemm_check_env(char *err, size_t n) {
  const char *env = getenv("GRADC_GEMM");
  if (!env || !*env || cpu_gemm_provider_find(env)) return true;
  char list[256];
  names(list, sizeof list);
  const char *known[] = {"onednn", "openblas", "blis"};
  bool lib = false;
  for (int i = 0; i < 3; i++) lib |= strcmp(env, known[i]) == 0;
  if (lib) snprintf(err, n, "GRADC_GEMM=%s: this build of gradc has no %s (it has: %s)", env, env, list);
  else snprintf(err, n, "GRADC_GEMM=%s: unknown GEMM provider (this build has: %s)", env, list);
  return false;
}

const CpuGemmProvider *cpu_gemm_select(const char *cache_dir, char *err, size_t n) {
  const char *env = getenv("GRADC_GEMM");
  if (env && *env) {
    const CpuGemmProvider *p = cpu_gemm_provider_find(env);
    char why[512];
    if (!p) {
      cpu_gemm_check_env(err, n);
      return NULL;
    }
    if (!cpu_gemm_runnable(p, why, sizeof why)) {
      static bool warned;
      pthread_mutex_lock(&select_lock);
      if (!warned) fprintf(stderr, "gradc: warning: GRADC_GEMM=%s: %s\n", env, why);
      warned = true;
      pthread_mutex_unlock(&select_lock);
    }
    return p;
  }
  pthread_mutex_lock(&select_lock);
  bool same = chosen_valid && (cache_dir ? !chosen_nodir && strcmp(chosen_dir, cache_dir) == 0 : chosen_nodir);
  if (!same) {
    chosen = choose(cache_dir);
    chosen_valid = true;
    chosen_nodir = !cache_dir;
    snprintf(chosen_dir, sizeof chosen_dir, "%s", cache_dir ? cache_dir : "");
  }
  const CpuGemmProvider *p = chosen;
  pthread_mutex_unlock(&select_lock);
  return p;
}
