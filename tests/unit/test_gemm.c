/* test_gemm.c - the CPU back end's GEMM providers (runtime/cpu/gemm.h)
 * against the reference interpreter, and the choice of provider per host.
 *
 * Shapes: every GEMM of every example (at its declared sizes) and of every
 * bench model (at bench/run.py's sizes), as `gradc bench --print-gemms`
 * lists them, each with its own transposes, batch and beta and with the
 * other beta, in f32, f64 and bf16 (f32 accumulation; with beta = 0 also
 * into a bf16 C, rounded once to nearest even).  The operands are
 * multiples of 1/16 in [-1/2, 1/2], exact in bf16, whose products and sums
 * (up to K = 4096) are exact in f32: every provider must then give the
 * interpreter's result exactly, whatever its blocking.  A second pass on
 * random operands checks the rounding bound of an f32 dot product
 * (K * 2^-24 * sum |a b| per element; bf16 operands rounded first).
 *
 * A provider this build lacks is skipped with a message. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "irbuild.h"
#include "passes/passes.h"
#include "runtime/cpu/gemm_floor.h"
#include "runtime/cpu/gemm.h"
#include "runtime/gemm_plan.h"
#include "runtime/io/artifact.h"
#include "runtime/runtime.h"
#include "support/support.h"
#include "testutil.h"

/* ------------------------------------------------------------------ */
/* Shapes                                                              */
/* ------------------------------------------------------------------ */

typedef struct Shape {
  int64_t M, N, K, nb;
  bool ta, tb, acc;
} Shape;

static Shape shapes[512];
static int nshapes;

static void add_shape(Shape s) {
  for (int i = 0; i < nshapes; i++)
    if (!memcmp(&shapes[i], &s, sizeof s)) return;
  assert_true(nshapes < 512);
  shapes[nshapes++] = s;
}

/* Shapes with one logical product (M, N, K, batch) next to each other:
 * they share the operands and the interpreter's result. */
static bool same_logical(const Shape *x, const Shape *y) {
  return x->M == y->M && x->N == y->N && x->K == y->K && x->nb == y->nb;
}

static int cmp_logical(const void *pa, const void *pb) {
  const Shape *a = pa, *b = pb;
  int64_t ka[4] = {a->M, a->N, a->K, a->nb}, kb[4] = {b->M, b->N, b->K, b->nb};
  for (int i = 0; i < 4; i++)
    if (ka[i] != kb[i]) return ka[i] < kb[i] ? -1 : 1;
  return 0;
}

/* The models and sizes: the examples as declared, bench/run.py's configs. */
static const struct {
  const char *file;
  const char *names[8];
  int64_t values[8];
} models[] = {
    {"examples/mlp.gdl", {NULL}, {0}},
    {"examples/multitask.gdl", {NULL}, {0}},
    {"examples/tinygpt.gdl", {NULL}, {0}},
    {"examples/tinygpt.gdl", {"B", "T", "C", "L", "NH", "V"}, {16, 128, 256, 4, 4, 96}},
    {"examples/tinygpt.gdl", {"B", "T", "C", "L"}, {8, 32, 64, 2}},
    {"examples/mlp.gdl", {"B", "D", "H"}, {256, 784, 1024}},
    {"bench/models/mlp2.gdl", {"B", "D", "H"}, {256, 784, 1024}},
};

/* The GEMMs the CPU executor runs for a model: its matmuls after the CPU
 * pipeline, as the GEMM floor lists them (gemm_floor.h). */
static int setup_shapes(void **state) {
  (void)state;
  memset(shapes, 0, sizeof shapes);
  for (size_t m = 0; m < sizeof models / sizeof *models; m++) {
    char *text = tu_read(models[m].file);
    static SrcFile src;
    src = (SrcFile){models[m].file, text, strlen(text)};
    Diag d;
    diag_init(&d, NULL);
    d.quiet = true;
    int nd = 0;
    while (nd < 8 && models[m].names[nd]) nd++;
    FeOptions fo = {.def_names = (const char **)models[m].names, .def_values = models[m].values, .ndefs = nd,
                    .gas = 1, .dp = 1};
    FeModel *fm = fe_model_compile(&src, &fo, &d);
    if (!fm) {
      fprintf(stderr, "%s does not compile\n", models[m].file);
      return -1;
    }
    int np;
    const char *const *pipe = pass_pipeline_cpu(&np);
    PassManager pm;
    pm_init(&pm);
    PassOptions po = {.gas = 1, .diag = &d};
    if (pm_run(&pm, fm->func, pipe, np, &po) != 0) {
      fprintf(stderr, "%s: the CPU pipeline fails\n", models[m].file);
      return -1;
    }
    RtGemm *g;
    int ng = rt_gemm_list(fm->func, &g);
    for (int i = 0; i < ng; i++) {
      Shape sh = {g[i].M, g[i].N, g[i].K, g[i].nb, g[i].ta, g[i].tb, g[i].accumulate};
      add_shape(sh);
      sh.acc = !sh.acc; /* and the other beta */
      add_shape(sh);
    }
    rt_gemm_list_free(g, ng);
    fe_model_free(fm);
    diag_free(&d);
    free(text);
    if (ng == 0 && strstr(models[m].file, "mlp")) {
      fprintf(stderr, "%s lists no GEMMs\n", models[m].file);
      return -1;
    }
  }
  /* Every transpose pair, batched and not, on small shapes of odd sizes. */
  for (int t = 0; t < 4; t++)
    for (int b = 0; b < 2; b++) {
      add_shape((Shape){13, 7, 5, b ? 3 : 1, t & 1, t >> 1, b});
      add_shape((Shape){1, 33, 17, 1, t & 1, t >> 1, !b});
      add_shape((Shape){40, 1, 9, b ? 2 : 1, t & 1, t >> 1, b});
    }
  qsort(shapes, (size_t)nshapes, sizeof *shapes, cmp_logical);
  return 0;
}

/* ------------------------------------------------------------------ */
/* The reference: the interpreter's matmul of the logical matrices      */
/* ------------------------------------------------------------------ */

/* C[nb, M, N] = A[nb, M, K] @ B[nb, K, N] in exact f64 (no rounding). */
static double *interp_matmul(const Shape *s, const double *a, const double *b) {
  IrFunc *f = ir_func_new("gemm");
  IrType ta = s->nb > 1 ? ty(IR_DT_F64, 3, (int)s->nb, (int)s->M, (int)s->K) : ty(IR_DT_F64, 2, (int)s->M, (int)s->K);
  IrType tb = s->nb > 1 ? ty(IR_DT_F64, 3, (int)s->nb, (int)s->K, (int)s->N) : ty(IR_DT_F64, 2, (int)s->K, (int)s->N);
  IrValue *A = param(f, "A", ta), *B = param(f, "B", tb);
  IrValue *C = bin(f, IR_OP_MATMUL, A, B);
  double *args[2] = {(double *)a, (double *)b};
  double **ws = calloc((size_t)f->nvalues + 1, sizeof(double *));
  InterpState st;
  memset(&st, 0, sizeof st);
  InterpOptions opt = {.exact_f64 = true};
  char err[256];
  if (!interp_run(&st, f, args, ws, INTERP_STEP, &opt, err, sizeof err)) fail_msg("interp_run: %s", err);
  size_t n = (size_t)(s->nb * s->M * s->N);
  double *out = malloc(n * sizeof(double));
  memcpy(out, st.val[C->id], n * sizeof(double));
  interp_free(&st);
  free(ws);
  ir_func_free(f);
  return out;
}

static uint16_t to_bf16(double x) {
  float f = (float)ir_round_dtype(x, IR_DT_BF16);
  uint32_t u;
  memcpy(&u, &f, 4);
  return (uint16_t)(u >> 16);
}

/* A logical rows x cols matrix (per batch) stored as the provider reads
 * it: transposed when t, rows ld apart, in the type's element size. */
static void *store(CpuGemmType type, const double *x, int64_t nb, int64_t rows, int64_t cols, bool t, int64_t *ld) {
  *ld = t ? rows : cols;
  size_t es = type == CPU_GEMM_F64 ? 8 : type == CPU_GEMM_F32 ? 4 : 2;
  char *p = calloc((size_t)(nb * rows * cols) + 1, es);
  for (int64_t b = 0; b < nb; b++)
    for (int64_t i = 0; i < rows; i++)
      for (int64_t j = 0; j < cols; j++) {
        double v = x[(b * rows + i) * cols + j];
        int64_t at = b * rows * cols + (t ? j * rows + i : i * cols + j);
        if (type == CPU_GEMM_F64) ((double *)p)[at] = v;
        else if (type == CPU_GEMM_F32) ((float *)p)[at] = (float)v;
        else ((uint16_t *)p)[at] = to_bf16(v);
      }
  return p;
}

static const char *type_name(CpuGemmType t) { return t == CPU_GEMM_F64 ? "f64" : t == CPU_GEMM_F32 ? "f32" : "bf16"; }

/* Run s on p in type; compare C with c0 + ref (tol: per-element bound, or
 * NULL for exact).  Returns the number of mismatches (first few printed). */
static int check(const CpuGemmProvider *p, const Shape *s, CpuGemmType type, const double *a, const double *b,
                 const double *c0, const double *ref, const double *tol, int threads) {
  int64_t lda, ldb, ldc = s->N;
  void *A = store(type, a, s->nb, s->M, s->K, s->ta, &lda), *B = store(type, b, s->nb, s->K, s->N, s->tb, &ldb);
  CpuGemmType ct = type == CPU_GEMM_F64 ? CPU_GEMM_F64 : CPU_GEMM_F32;
  void *C = store(ct, c0, s->nb, s->M, s->N, false, &ldc);
  CpuGemmDesc d = {.type = type, .ta = s->ta, .tb = s->tb, .accumulate = s->acc, .M = s->M, .N = s->N, .K = s->K,
                   .lda = lda, .ldb = ldb, .ldc = ldc, .batch = s->nb, .stride_a = s->M * s->K,
                   .stride_b = s->K * s->N, .stride_c = s->M * s->N, .threads = threads};
  char err[512];
  CpuGemm *g = cpu_gemm_plan(p, &d, err, sizeof err);
  if (!g) fail_msg("%s: cannot plan %s %lldx%lldx%lld: %s", p->name, type_name(type), (long long)s->M,
                   (long long)s->N, (long long)s->K, err);
  cpu_gemm_run(g, A, B, C, NULL);
  cpu_gemm_free(g);
  int bad = 0;
  double worst = 0;
  int64_t n = s->nb * s->M * s->N;
  for (int64_t i = 0; i < n; i++) {
    double got = ct == CPU_GEMM_F64 ? ((double *)C)[i] : ((float *)C)[i];
    double want = (s->acc ? c0[i] : 0) + ref[i], e = fabs(got - want), lim = tol ? tol[i] : 0;
    if (e > worst) worst = e;
    if (e > lim || isnan(got)) {
      if (bad < 3)
        print_error("%s %s M=%lld N=%lld K=%lld nb=%lld t=%c%c beta=%d threads=%d: C[%lld] = %.9g, want %.9g\n",
                    p->name, type_name(type), (long long)s->M, (long long)s->N, (long long)s->K, (long long)s->nb,
                    s->ta ? 'T' : 'N', s->tb ? 'T' : 'N', s->acc, threads, (long long)i, got, want);
      bad++;
    }
  }
  if (bad) print_error("  %d mismatches, largest error %.3g\n", bad, worst);
  free(A);
  free(B);
  free(C);
  return bad;
}

/* s (beta = 0) with a bf16 C (CpuGemmDesc.c_bf16) on p: every element the
 * f32 sum rounded to nearest even once, as the interpreter's cast rounds
 * ref (exact in f32 here).  Returns the number of mismatches. */
static int check_bf16_c(const CpuGemmProvider *p, const Shape *s, const double *a, const double *b, const double *ref) {
  int64_t lda, ldb, n = s->nb * s->M * s->N;
  void *A = store(CPU_GEMM_BF16, a, s->nb, s->M, s->K, s->ta, &lda), *B = store(CPU_GEMM_BF16, b, s->nb, s->K, s->N, s->tb, &ldb);
  uint16_t *C = calloc((size_t)n + 1, sizeof *C);
  CpuGemmDesc d = {.type = CPU_GEMM_BF16, .ta = s->ta, .tb = s->tb, .c_bf16 = true, .M = s->M, .N = s->N, .K = s->K,
                   .lda = lda, .ldb = ldb, .ldc = s->N, .batch = s->nb, .stride_a = s->M * s->K,
                   .stride_b = s->K * s->N, .stride_c = s->M * s->N, .threads = 1};
  char err[512];
  CpuGemm *g = cpu_gemm_plan(p, &d, err, sizeof err);
  if (!g) fail_msg("%s: cannot plan a bf16-result %lldx%lldx%lld: %s", p->name, (long long)s->M, (long long)s->N,
                   (long long)s->K, err);
  cpu_gemm_run(g, A, B, C, NULL);
  cpu_gemm_free(g);
  int bad = 0;
  for (int64_t i = 0; i < n; i++) {
    double got = ir_bf16_to_f32(C[i]), want = ir_round_dtype(ref[i], IR_DT_BF16);
    if (got != want) {
      if (bad < 3)
        print_error("%s bf16 result M=%lld N=%lld K=%lld nb=%lld t=%c%c: C[%lld] = %.9g, want %.9g\n", p->name,
                    (long long)s->M, (long long)s->N, (long long)s->K, (long long)s->nb, s->ta ? 'T' : 'N',
                    s->tb ? 'T' : 'N', (long long)i, got, want);
      bad++;
    }
  }
  free(A);
  free(B);
  free(C);
  return bad;
}

/* Multiples of 1/16 in [-1/2, 1/2]. */
static void exact_values(double *x, int64_t n, uint64_t seed) {
  for (int64_t i = 0; i < n; i++) {
    seed = seed * 6364136223846793005ull + 1442695040888963407ull;
    x[i] = (double)((int)(seed >> 59) - 8) / 16.0;
  }
}

/* The providers of the build by name, and a message for each missing one. */
static int built(const CpuGemmProvider **out) {
  const char *names[] = {"onednn", "openblas", "blis", "loops"};
  int n = 0;
  for (int i = 0; i < 4; i++) {
    const CpuGemmProvider *p = cpu_gemm_provider_find(names[i]);
    if (p) out[n++] = p;
    else if (i < 3) printf("note: skipped: the GEMM provider %s is not in this build\n", names[i]);
  }
  return n;
}

/* Every shape on every provider: the operands and the interpreter's
 * product made once per logical shape. */
static void test_gemm_providers_exact(void **state) {
  (void)state;
  const CpuGemmProvider *provs[4];
  int np = built(provs), bad = 0;
  double *a = NULL, *b = NULL, *c0 = NULL, *ref = NULL;
  for (int i = 0; i < nshapes; i++) {
    const Shape *s = &shapes[i];
    if (i == 0 || !same_logical(s, &shapes[i - 1])) {
      free(ref);
      free(a);
      free(b);
      free(c0);
      int64_t na = s->nb * s->M * s->K, nbb = s->nb * s->K * s->N, nc = s->nb * s->M * s->N;
      a = malloc(sizeof(double) * (size_t)na);
      b = malloc(sizeof(double) * (size_t)nbb);
      c0 = malloc(sizeof(double) * (size_t)nc);
      exact_values(a, na, 1 + (uint64_t)i);
      exact_values(b, nbb, 1000 + (uint64_t)i);
      exact_values(c0, nc, 2000 + (uint64_t)i);
      ref = interp_matmul(s, a, b);
    }
    for (int k = 0; k < np; k++) {
      CpuGemmType types[3] = {CPU_GEMM_F32, CPU_GEMM_F64, CPU_GEMM_BF16};
      for (int t = 0; t < 3; t++) bad += check(provs[k], s, types[t], a, b, c0, ref, NULL, 1);
      if (!s->acc) bad += check_bf16_c(provs[k], s, a, b, ref);
      /* The provider's own threading too (the GEMM floor's). */
      bad += check(provs[k], s, CPU_GEMM_F32, a, b, c0, ref, NULL, 2);
    }
  }
  free(ref);
  free(a);
  free(b);
  free(c0);
  for (int k = 0; k < np; k++)
    printf("%s: %d GEMM shapes against the interpreter, f32, f64 and bf16 (f32 and bf16 results)\n", provs[k]->name,
           nshapes);
  assert_int_equal(bad, 0);
}

/* Two batch levels (gemm.h's outer and batch), laid out as attention's
 * heads are: S[b][h] = Q[b][h] K[b][h]^T with Q and K the columns h*D...
 * of a [B, T, 3C] buffer (C = NH*D), S dense [B, NH, T, T]; then
 * Y[b][h] = S[b][h] V[b][h] written into the columns h*D of a [B, T, C]
 * buffer; and a B operand repeated over the outer level (stride 0).  The
 * operands are exact in every type (exact_values), so every provider, in
 * f32, f64 and bf16, with beta 0 and 1, must give the plain loop's sums
 * exactly. */
typedef struct Levels {
  const char *what;
  int64_t M, N, K, outer, batch;
  bool tb;
  int64_t lda, ldb, ldc, oa, sa, ob, sb, oc, sc, a0, b0; /* leading dims, outer / inner strides, first offsets */
} Levels;

static int check_levels(const CpuGemmProvider *p, const Levels *l, CpuGemmType type, bool acc, int threads) {
  int64_t span = (l->outer + 1) * l->oa + (l->batch + 1) * l->sa + l->M * l->lda + l->a0;
  int64_t bspan = (l->outer + 1) * l->ob + (l->batch + 1) * l->sb + (l->tb ? l->N : l->K) * l->ldb + l->b0;
  int64_t cspan = l->outer * l->oc + l->batch * l->sc + l->M * l->ldc;
  double *a = malloc(sizeof(double) * (size_t)span), *b = malloc(sizeof(double) * (size_t)bspan);
  double *c0 = malloc(sizeof(double) * (size_t)cspan);
  exact_values(a, span, 11);
  exact_values(b, bspan, 12);
  exact_values(c0, cspan, 13);
  size_t es = type == CPU_GEMM_F64 ? 8 : type == CPU_GEMM_F32 ? 4 : 2, esc = type == CPU_GEMM_F64 ? 8 : 4;
  char *A = calloc((size_t)span, es), *B = calloc((size_t)bspan, es), *C = calloc((size_t)cspan, esc);
  for (int64_t i = 0; i < span; i++) {
    if (es == 8) ((double *)A)[i] = a[i];
    else if (es == 4) ((float *)A)[i] = (float)a[i];
    else ((uint16_t *)A)[i] = to_bf16(a[i]);
  }
  for (int64_t i = 0; i < bspan; i++) {
    if (es == 8) ((double *)B)[i] = b[i];
    else if (es == 4) ((float *)B)[i] = (float)b[i];
    else ((uint16_t *)B)[i] = to_bf16(b[i]);
  }
  for (int64_t i = 0; i < cspan; i++) {
    if (esc == 8) ((double *)C)[i] = c0[i];
    else ((float *)C)[i] = (float)c0[i];
  }
  CpuGemmDesc d = {.type = type, .tb = l->tb, .accumulate = acc, .M = l->M, .N = l->N, .K = l->K, .lda = l->lda,
                   .ldb = l->ldb, .ldc = l->ldc, .batch = l->batch, .stride_a = l->sa, .stride_b = l->sb,
                   .stride_c = l->sc, .outer = l->outer, .outer_a = l->oa, .outer_b = l->ob, .outer_c = l->oc,
                   .threads = threads};
  char err[512];
  CpuGemm *g = cpu_gemm_plan(p, &d, err, sizeof err);
  if (!g) fail_msg("%s: cannot plan %s: %s", p->name, l->what, err);
  cpu_gemm_run(g, A + l->a0 * (int64_t)es, B + l->b0 * (int64_t)es, C, NULL);
  cpu_gemm_free(g);
  /* The plain loop, and every element C's matrices do not cover left as it was. */
  double *want = malloc(sizeof(double) * (size_t)cspan);
  memcpy(want, c0, sizeof(double) * (size_t)cspan);
  for (int64_t o = 0; o < l->outer; o++)
    for (int64_t t = 0; t < l->batch; t++)
      for (int64_t i = 0; i < l->M; i++)
        for (int64_t j = 0; j < l->N; j++) {
          double sum = 0;
          for (int64_t k = 0; k < l->K; k++) {
            double x = a[l->a0 + o * l->oa + t * l->sa + i * l->lda + k];
            double y = b[l->b0 + o * l->ob + t * l->sb + (l->tb ? j * l->ldb + k : k * l->ldb + j)];
            sum += x * y;
          }
          int64_t at = o * l->oc + t * l->sc + i * l->ldc + j;
          want[at] = (acc ? c0[at] : 0) + sum;
        }
  int bad = 0;
  for (int64_t i = 0; i < cspan; i++) {
    double got = esc == 8 ? ((double *)C)[i] : ((float *)C)[i];
    if (got != want[i]) {
      if (bad < 3)
        print_error("%s %s %s beta=%d threads=%d: C[%lld] = %.9g, want %.9g\n", p->name, type_name(type), l->what,
                    acc, threads, (long long)i, got, want[i]);
      bad++;
    }
  }
  free(a), free(b), free(c0), free(A), free(B), free(C), free(want);
  return bad;
}

static void test_gemm_providers_batch_levels(void **state) {
  (void)state;
  enum { NB = 3, NH = 2, T = 5, D = 4, C = NH * D };
  const Levels cases[] = {
      {"q k^T of heads", T, T, D, NB, NH, true, 3 * C, 3 * C, T, T * 3 * C, D, T * 3 * C, D, NH * T * T, T * T, 0, C},
      {"att v into heads", T, D, T, NB, NH, false, T, 3 * C, C, NH * T * T, T * T, T * 3 * C, D, T * C, D, 0, 2 * C},
      {"a B shared by the outer level", T, D, T, NB, NH, false, T, D, C, NH * T * T, T * T, 0, T * D, T * C, D, 0, 0},
      {"one level as the outer", T, T, D, NB * NH, 1, true, D, D, T, T * D, 0, T * D, 0, T * T, 0, 0, 0},
  };
  const CpuGemmProvider *provs[4];
  int np = built(provs), bad = 0;
  CpuGemmType types[3] = {CPU_GEMM_F32, CPU_GEMM_F64, CPU_GEMM_BF16};
  for (int k = 0; k < np; k++)
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++)
      for (int t = 0; t < 3; t++)
        for (int acc = 0; acc < 2; acc++) bad += check_levels(provs[k], &cases[c], types[t], acc, 1 + (t == 0 && acc));
  assert_int_equal(bad, 0);
}

/* rt_gemm_grid, by hand: attention's heads (two levels), one level, a
 * broadcast operand, and offsets that are no grid. */
static void test_gemm_grid_offsets(void **state) {
  (void)state;
  enum { NB = 8, NH = 4 };
  int64_t a[NB * NH], b[NB * NH], c[NB * NH], z[NB * NH] = {0};
  for (int t = 0; t < NB * NH; t++) {
    a[t] = 7 + t / NH * 6144 + t % NH * 16; /* q: columns of [B, T, 3C] */
    b[t] = 64 + t / NH * 6144 + t % NH * 16;
    c[t] = t * 1024; /* dense [B, NH, T, T] */
  }
  RtGemmGrid g;
  assert_true(rt_gemm_grid((const int64_t *const[3]){a, b, c}, NB * NH, &g));
  assert_int_equal(g.n1, NB);
  assert_int_equal(g.n2, NH);
  assert_int_equal(g.s1[0], 6144);
  assert_int_equal(g.s2[0], 16);
  assert_int_equal(g.s1[2], NH * 1024);
  assert_int_equal(g.s2[2], 1024);
  /* One level (every stride constant) is the outer one; a broadcast B has stride 0. */
  assert_true(rt_gemm_grid((const int64_t *const[3]){c, z, c}, NB * NH, &g));
  assert_int_equal(g.n1, NB * NH);
  assert_int_equal(g.n2, 1);
  assert_int_equal(g.s1[0], 1024);
  assert_int_equal(g.s1[1], 0);
  assert_int_equal(g.s2[2], 0);
  /* No grid: one offset out of step, a negative stride, a single matrix. */
  int64_t bad[NB * NH];
  memcpy(bad, a, sizeof a);
  bad[NB * NH - 1] += 1;
  assert_false(rt_gemm_grid((const int64_t *const[3]){bad, b, c}, NB * NH, &g));
  int64_t down[3] = {30, 20, 10}, up[3] = {0, 10, 20};
  assert_false(rt_gemm_grid((const int64_t *const[3]){down, up, up}, 3, &g));
  assert_false(rt_gemm_grid((const int64_t *const[3]){a, b, c}, 1, &g));
}

/* Random operands: the rounding bound of an f32 sum of K products. */
static void provider_rounding(const CpuGemmProvider *p) {
  Shape list[] = {{96, 80, 300, 1, false, true, false}, {64, 48, 512, 2, true, false, true}};
  int bad = 0;
  for (size_t k = 0; k < sizeof list / sizeof *list; k++) {
    const Shape *s = &list[k];
    int64_t na = s->nb * s->M * s->K, nbb = s->nb * s->K * s->N, nc = s->nb * s->M * s->N;
    double *a = malloc(sizeof(double) * (size_t)na), *b = malloc(sizeof(double) * (size_t)nbb);
    double *c0 = calloc((size_t)nc, sizeof(double)), *tol = malloc(sizeof(double) * (size_t)nc);
    for (int bf = 0; bf < 2; bf++) {
      uint64_t seed = 77 + k;
      for (int64_t i = 0; i < na + nbb; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        double v = ((double)(seed >> 11) / 9007199254740992.0 - 0.5);
        v = bf ? ir_round_dtype(v, IR_DT_BF16) : (double)(float)v;
        if (i < na) a[i] = v;
        else b[i - na] = v;
      }
      double *ref = interp_matmul(s, a, b);
      for (int64_t t = 0; t < s->nb; t++)
        for (int64_t i = 0; i < s->M; i++)
          for (int64_t j = 0; j < s->N; j++) {
            double m = 0;
            for (int64_t q = 0; q < s->K; q++)
              m += fabs(a[(t * s->M + i) * s->K + q] * b[(t * s->K + q) * s->N + j]);
            tol[(t * s->M + i) * s->N + j] = (double)s->K * 0x1p-24 * m + 0x1p-24 * fabs(m);
          }
      bad += check(p, s, bf ? CPU_GEMM_BF16 : CPU_GEMM_F32, a, b, c0, ref, tol, 1);
      free(ref);
    }
    free(a);
    free(b);
    free(c0);
    free(tol);
  }
  assert_int_equal(bad, 0);
}

static void test_gemm_providers_rounding(void **state) {
  (void)state;
  const CpuGemmProvider *provs[4];
  int np = built(provs);
  for (int k = 0; k < np; k++) provider_rounding(provs[k]);
}

/* oneDNN's kernel per product (gemm_onednn.c): every large weight
 * gradient of the models (f32, one matrix, A transposed, B not, stored or
 * accumulated, one thread or two, at least 2^26 multiply-adds) on the jit
 * sgemm; the same sizes with A in place, a weight gradient with an
 * epilogue or in bf16, and the smaller weight gradients, on what oneDNN
 * lists first, its brgemm kernels where the CPU has AVX-512 (the products
 * themselves are checked against the interpreter above). */
static void test_gemm_onednn_kernels(void **state) {
  (void)state;
  const CpuGemmProvider *p = cpu_gemm_provider_find("onednn");
  char why[512];
  if (!p || !p->usable(why, sizeof why)) {
    printf("note: skipped: no usable oneDNN in this build\n");
    return;
  }
  bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  int nwg = 0, nsmall = 0;
  char err[512];
  for (int i = 0; i < nshapes; i++) {
    const Shape *s = &shapes[i];
    if (!s->ta || s->tb || s->nb != 1) continue;
    bool large = (double)s->M * (double)s->N * (double)s->K >= (double)(1 << 26);
    for (int t = 1; t <= 2; t++)
      for (int acc = 0; acc < 2; acc++) {
        CpuGemmDesc d = {.type = CPU_GEMM_F32, .ta = true, .accumulate = acc, .M = s->M, .N = s->N, .K = s->K,
                         .lda = s->M, .ldb = s->N, .ldc = s->N, .threads = t};
        CpuGemm *g = cpu_gemm_plan(p, &d, err, sizeof err);
        assert_non_null(g);
        if (!large) {
          if (avx512) assert_memory_equal(cpu_gemm_kernel(g), "brg:", 4);
          cpu_gemm_free(g);
          nsmall++;
          continue;
        }
        if (strcmp(cpu_gemm_kernel(g), "gemm:jit") != 0)
          print_error("%lldx%lldx%lld weight gradient on %s\n", (long long)s->M, (long long)s->N, (long long)s->K,
                      cpu_gemm_kernel(g));
        assert_string_equal(cpu_gemm_kernel(g), "gemm:jit");
        cpu_gemm_free(g);
        CpuGemmDesc others[3] = {d, d, d};
        others[0].ta = false, others[0].lda = s->K;  /* A in place */
        others[1].epilogue = CPU_EPI_BIAS;            /* an epilogue */
        others[1].accumulate = false;
        others[2].type = CPU_GEMM_BF16;               /* bf16 (its own kernels) */
        for (int k = 0; k < 3; k++) {
          if (k == 2 && !__builtin_cpu_supports("avx512bf16")) continue; /* else widened: an f32 weight gradient */
          g = cpu_gemm_plan(p, &others[k], err, sizeof err);
          if (!g) continue; /* bf16 without bf16 kernels: widened, another plan's business */
          if (avx512) assert_memory_equal(cpu_gemm_kernel(g), "brg:", 4);
          else assert_string_not_equal(cpu_gemm_kernel(g), "");
          cpu_gemm_free(g);
        }
        nwg++;
      }
  }
  printf("onednn: %d large weight-gradient plans on gemm:jit, their other forms and %d smaller ones on %s\n", nwg,
         nsmall, avx512 ? "brgemm" : "oneDNN's first choice");
  assert_true(nwg > 0 && nsmall > 0);
}

/* Every epilogue on every provider (a post-op or gemm.c's loop), with and
 * without beta = 1, against the same arithmetic in double: C = C0*beta +
 * epilogue(AB), AB exact (multiples of 1/16), so only the epilogue's own
 * rounding (gelu's tanh in f32) is left: 1e-6 relative. */
static void test_gemm_providers_epilogues(void **state) {
  (void)state;
  const CpuGemmProvider *provs[4];
  int np = built(provs), bad = 0;
  const int64_t M = 72, N = 56, K = 40;
  double a[72 * 40], b[40 * 56], c0[72 * 56], extra[72 * 56];
  exact_values(a, M * K, 7);
  exact_values(b, K * N, 8);
  exact_values(c0, M * N, 9);
  exact_values(extra, M * N, 10);
  const CpuGemmEpilogue epis[] = {CPU_EPI_BIAS, CPU_EPI_BIAS_GELU, CPU_EPI_BIAS_RELU, CPU_EPI_RESIDUAL};
  float A[72 * 40], B[40 * 56], C[72 * 56], E[72 * 56];
  for (int64_t i = 0; i < M * K; i++) A[i] = (float)a[i];
  for (int64_t i = 0; i < K * N; i++) B[i] = (float)b[i];
  for (int64_t i = 0; i < M * N; i++) E[i] = (float)extra[i];
  for (int k = 0; k < np; k++)
    for (int e = 0; e < 4; e++)
      for (int acc = 0; acc < 2; acc++)
        for (int threads = 1; threads <= 2; threads++) {
          CpuGemmDesc d = {.type = CPU_GEMM_F32, .accumulate = acc, .M = M, .N = N, .K = K, .lda = K, .ldb = N,
                           .ldc = N, .threads = threads, .epilogue = epis[e], .ldr = N};
          char err[512];
          CpuGemm *g = cpu_gemm_plan(provs[k], &d, err, sizeof err);
          if (!g) fail_msg("%s: cannot plan epilogue %d: %s", provs[k]->name, (int)epis[e], err);
          for (int64_t i = 0; i < M * N; i++) C[i] = (float)c0[i];
          cpu_gemm_run(g, A, B, C, E);
          int nbad = 0;
          for (int64_t i = 0; i < M; i++)
            for (int64_t j = 0; j < N; j++) {
              double s = 0;
              for (int64_t q = 0; q < K; q++) s += a[i * K + q] * b[q * N + j];
              double x = epis[e] == CPU_EPI_RESIDUAL ? s + extra[i * N + j] : s + extra[j];
              if (epis[e] == CPU_EPI_BIAS_GELU) x = ir_scalar_unary(IR_OP_GELU, x, 0);
              if (epis[e] == CPU_EPI_BIAS_RELU) x = ir_scalar_unary(IR_OP_RELU, x, 0);
              double want = (acc ? c0[i * N + j] : 0) + x, got = C[i * N + j];
              if (fabs(got - want) > 1e-6 * (1 + fabs(want)) || isnan(got)) {
                if (nbad++ < 3)
                  print_error("%s epilogue %d beta=%d threads=%d: C[%lld,%lld] = %.9g, want %.9g\n", provs[k]->name,
                              (int)epis[e], acc, threads, (long long)i, (long long)j, got, want);
              }
            }
          printf("%s epilogue %d beta=%d threads=%d: %s, %d mismatches\n", provs[k]->name, (int)epis[e], acc,
                 threads, cpu_gemm_fused(g) ? "fused" : "loop", nbad);
          bad += nbad;
          cpu_gemm_free(g);
        }
  assert_int_equal(bad, 0);
}

/* ------------------------------------------------------------------ */
/* The choice per host, and its cache                                   */
/* ------------------------------------------------------------------ */

static char tmpdir[256];

static int setup_dir(void **state) {
  (void)state;
  snprintf(tmpdir, sizeof tmpdir, "/tmp/gradc-test-gemm-XXXXXX");
  return mkdtemp(tmpdir) ? 0 : -1;
}

static int teardown_dir(void **state) {
  (void)state;
  tu_rm_rf(tmpdir);
  return 0;
}

/* `gradc bench` on a small mlp with this cache directory and environment
 * prefix; the provider it printed into prov (empty if none). */
static int bench_provider(const char *env, const char *cache, char *prov, size_t n, char *err, size_t m) {
  static char out[8192];
  int st = tu_sh_err(out, sizeof out, err, m,
                     "env -u GRADC_GEMM %s GRADC_CACHE_DIR='%s' '%s' bench '%s' -D B=8 -D D=16 -D H=8 --steps 1",
                     env, cache, GRADC_BINARY, tu_path("examples/mlp.gdl"));
  prov[0] = 0;
  const char *l = strstr(out, "gemm_provider: ");
  if (l) sscanf(l + 15, "%63s", prov);
  (void)n;
  return st;
}

/* The one selection entry in dir (its path into path); false if none. */
static bool entry_path(const char *dir, char *path, size_t n) {
  snprintf(path, n, "%s/%s-%016llx", dir, CPU_GEMM_CACHE_KIND, (unsigned long long)cpu_gemm_host_key());
  struct stat sb;
  return stat(path, &sb) == 0;
}

static void test_gemm_select_cached(void **state) {
  (void)state;
  char cache[512], prov[64], err[8192], path[1024];
  snprintf(cache, sizeof cache, "%s/cached", tmpdir);
  /* First sight of the host: measured and written. */
  assert_int_equal(bench_provider("", cache, prov, sizeof prov, err, sizeof err), 0);
  assert_non_null(cpu_gemm_provider_find(prov));
  assert_true(entry_path(cache, path, sizeof path));
  size_t len;
  char *e = cache_get(cache, CPU_GEMM_CACHE_KIND, cpu_gemm_host_key(), &len);
  assert_non_null(e);
  char want[80];
  snprintf(want, sizeof want, "choice %s\n", prov);
  assert_non_null(strstr(e, want));
  /* The entry is what decides: rewritten to name another provider, the
   * next run uses that one without measuring. */
  const CpuGemmProvider *const *all;
  int np = cpu_gemm_providers(&all);
  const char *other = NULL;
  char why[256];
  for (int i = 0; i < np && !other; i++)
    if (strcmp(all[i]->name, prov) != 0 && all[i]->usable(why, sizeof why)) other = all[i]->name;
  if (other) {
    char *c = strstr(e, "choice ");
    StrBuf sb;
    sb_init(&sb);
    sb_putn(&sb, e, (size_t)(c - e));
    sb_printf(&sb, "choice %s\n", other);
    cache_put(cache, CPU_GEMM_CACHE_KIND, cpu_gemm_host_key(), sb_str(&sb), sb.len);
    sb_free(&sb);
    assert_int_equal(bench_provider("", cache, prov, sizeof prov, err, sizeof err), 0);
    assert_string_equal(prov, other);
  } else {
    printf("note: one usable GEMM provider here; the cached choice cannot be told from a measured one\n");
  }
  free(e);
}

/* The measurement's entry: a time for every usable provider (each
 * multiplies every shape, the projection's bias included), a reason for
 * every other, and the choice the rule makes from those times (a later
 * provider displaces an earlier one when 10% faster). */
static void test_gemm_measure_entry(void **state) {
  (void)state;
  char cache[512], prov[64], err[8192];
  snprintf(cache, sizeof cache, "%s/measured", tmpdir);
  assert_int_equal(bench_provider("", cache, prov, sizeof prov, err, sizeof err), 0);
  size_t len;
  char *e = cache_get(cache, CPU_GEMM_CACHE_KIND, cpu_gemm_host_key(), &len);
  assert_non_null(e);
  const CpuGemmProvider *const *all;
  int np = cpu_gemm_providers(&all);
  const char *best = NULL;
  double best_ms = 0;
  for (int i = 0; i < np; i++) {
    char why[256], key[80];
    snprintf(key, sizeof key, "\nms %s ", all[i]->name);
    const char *m = strstr(e, key);
    if (!all[i]->usable(why, sizeof why)) {
      snprintf(key, sizeof key, "\nskipped %s ", all[i]->name);
      assert_non_null(strstr(e, key));
      continue;
    }
    if (!m) fail_msg("no time for usable provider %s in:\n%s", all[i]->name, e);
    double ms = strtod(m + strlen(key), NULL);
    assert_true(ms > 0 && ms < 10000);
    if (!best || ms < 0.9 * best_ms) best = all[i]->name, best_ms = ms;
  }
  assert_non_null(best);
  assert_string_equal(prov, best);
  free(e);
}

static void test_gemm_select_corrupt_entry_remeasured(void **state) {
  (void)state;
  char cache[512], prov[64], err[8192], path[1024];
  snprintf(cache, sizeof cache, "%s/corrupt", tmpdir);
  assert_int_equal(bench_provider("", cache, prov, sizeof prov, err, sizeof err), 0);
  assert_true(entry_path(cache, path, sizeof path));
  /* Bytes changed under the checksum: a warning, a new measurement, a new entry. */
  FILE *f = fopen(path, "r+b");
  assert_non_null(f);
  fseek(f, 30, SEEK_SET);
  fputs("garbage", f);
  fclose(f);
  assert_int_equal(bench_provider("", cache, prov, sizeof prov, err, sizeof err), 0);
  if (!strstr(err, "warning: ignoring corrupted cache entry")) print_error("stderr:\n%s\n", err);
  assert_non_null(strstr(err, "warning: ignoring corrupted cache entry"));
  assert_non_null(cpu_gemm_provider_find(prov));
  size_t len;
  char *e = cache_get(cache, CPU_GEMM_CACHE_KIND, cpu_gemm_host_key(), &len);
  assert_non_null(e);
  free(e);
  /* A well-formed entry naming no provider of this build: the same. */
  const char *bogus = "gradc gemm-provider 1\nchoice nosuch\n";
  cache_put(cache, CPU_GEMM_CACHE_KIND, cpu_gemm_host_key(), bogus, strlen(bogus));
  assert_int_equal(bench_provider("", cache, prov, sizeof prov, err, sizeof err), 0);
  assert_non_null(strstr(err, "warning: ignoring invalid GEMM provider entry"));
  assert_non_null(cpu_gemm_provider_find(prov));
  e = cache_get(cache, CPU_GEMM_CACHE_KIND, cpu_gemm_host_key(), &len);
  assert_non_null(e);
  assert_null(strstr(e, "nosuch"));
  free(e);
}

static void test_gemm_select_env_and_no_cache(void **state) {
  (void)state;
  char cache[512], prov[64], err[8192], path[1024], env[128];
  snprintf(cache, sizeof cache, "%s/env", tmpdir);
  const CpuGemmProvider *const *all;
  int np = cpu_gemm_providers(&all);
  /* GRADC_GEMM is honoured for every provider of the build. */
  for (int i = 0; i < np; i++) {
    snprintf(env, sizeof env, "GRADC_GEMM=%s", all[i]->name);
    assert_int_equal(bench_provider(env, cache, prov, sizeof prov, err, sizeof err), 0);
    assert_string_equal(prov, all[i]->name);
  }
  /* ... and measures nothing, so it writes no entry. */
  assert_false(entry_path(cache, path, sizeof path));
  /* A name that is no provider, or one this build lacks: a user error. */
  assert_int_equal(bench_provider("GRADC_GEMM=mkl", cache, prov, sizeof prov, err, sizeof err), 1);
  assert_non_null(strstr(err, "gradc: error: GRADC_GEMM=mkl: unknown GEMM provider (this build has: "));
  const char *libs[] = {"onednn", "openblas", "blis"};
  for (int i = 0; i < 3; i++) {
    if (cpu_gemm_provider_find(libs[i])) continue;
    snprintf(env, sizeof env, "GRADC_GEMM=%s", libs[i]);
    assert_int_equal(bench_provider(env, cache, prov, sizeof prov, err, sizeof err), 1);
    assert_non_null(strstr(err, "this build of gradc has no"));
    printf("note: %s is not in this build: GRADC_GEMM=%s is refused\n", libs[i], libs[i]);
  }
  /* --no-cache measures and writes nothing. */
  static char out[8192];
  assert_int_equal(tu_sh_err(out, sizeof out, err, sizeof err,
                             "env -u GRADC_GEMM GRADC_CACHE_DIR='%s' '%s' bench '%s' -D B=8 -D D=16 -D H=8 --steps 1 --no-cache", cache,
                             GRADC_BINARY, tu_path("examples/mlp.gdl")),
                   0);
  assert_false(entry_path(cache, path, sizeof path));
  assert_non_null(strstr(out, "gemm_provider: "));
}

/* An artifact records its provider and refuses to load where it is missing. */
static void test_gemm_artifact_records_provider(void **state) {
  (void)state;
#ifndef GRADC_HAVE_LLVM
  printf("[ SKIPPED  ] no LLVM: no CPU artifacts\n");
  skip();
#else
  char art[512], out[8192], err[8192];
  snprintf(art, sizeof art, "%s/mlp.gca", tmpdir);
  const CpuGemmProvider *const *all;
  cpu_gemm_providers(&all);
  const char *name = all[0]->name;
  int st = tu_sh_err(out, sizeof out, err, sizeof err, "GRADC_GEMM=%s '%s' compile '%s' -D B=8 -D D=16 -D H=8 -o '%s'",
                     name, GRADC_BINARY, tu_path("examples/mlp.gdl"), art);
  if (st) print_error("%s\n", err);
  assert_int_equal(st, 0);
  ArtFile a;
  char e[1024];
  assert_true(art_read(art, &a, e, sizeof e));
  const ArtSection *g = art_find(&a, "GEMM", NULL);
  assert_non_null(g);
  assert_string_equal(g->name, name);
  /* The artifact loads and runs here. */
  char params[600], inputs[600];
  snprintf(params, sizeof params, "%s/p.safetensors", tmpdir);
  snprintf(inputs, sizeof inputs, "%s/x.safetensors", tmpdir);
  tu_gradc("init '%s' -D B=8 -D D=16 -D H=8 -o '%s'", tu_path("examples/mlp.gdl"), params);
  tu_gradc("data random '%s' -D B=8 -D D=16 -D H=8 -o '%s'", tu_path("examples/mlp.gdl"), inputs);
  tu_gradc("run '%s' --params '%s' --inputs '%s'", art, params, inputs);
  /* Built for a provider this gradc lacks: refused, with the reason. */
  free(((ArtSection *)g)->name);
  ((ArtSection *)g)->name = strdup("nosuch");
  assert_true(art_write(art, &a, e, sizeof e));
  art_free(&a);
  st = tu_sh_err(out, sizeof out, err, sizeof err, "'%s' run '%s' --params '%s' --inputs '%s'", GRADC_BINARY, art,
                 params, inputs);
  if (st != 1) print_error("exit %d: %s\n", st, err);
  assert_int_equal(st, 1);
  assert_non_null(strstr(err, "built for GEMM provider 'nosuch', which is missing here"));
#endif
}

int main(void) {
  const struct CMUnitTest providers[] = {
      cmocka_unit_test(test_gemm_providers_exact),
      cmocka_unit_test(test_gemm_providers_rounding),
      cmocka_unit_test(test_gemm_providers_epilogues),
      cmocka_unit_test(test_gemm_onednn_kernels),
      cmocka_unit_test(test_gemm_providers_batch_levels),
      cmocka_unit_test(test_gemm_grid_offsets),
  };
  const struct CMUnitTest choice[] = {
      cmocka_unit_test(test_gemm_select_cached),
      cmocka_unit_test(test_gemm_measure_entry),
      cmocka_unit_test(test_gemm_select_corrupt_entry_remeasured),
      cmocka_unit_test(test_gemm_select_env_and_no_cache),
      cmocka_unit_test(test_gemm_artifact_records_provider),
  };
  int rc = cmocka_run_group_tests(providers, setup_shapes, NULL);
  return rc | cmocka_run_group_tests(choice, setup_dir, teardown_dir);
}
