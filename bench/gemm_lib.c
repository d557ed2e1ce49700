/* gemm_lib.c - SGEMM throughput of one BLAS at a list of GEMM shapes: the
 * measurement behind the CPU back end's choice of library (DESIGN.md §6:
 * OpenBLAS unless measurement picks BLIS or oneDNN; see bench/RESULTS.md).
 *
 * The same source is compiled against each library's CBLAS interface
 * (bench/run.py --gemm-lib does it):
 *
 *   cc -O2 -DLIB_OPENBLAS bench/gemm_lib.c -I/usr/include/x86_64-linux-gnu/openblas-pthread -lopenblas
 *   cc -O2 -DLIB_BLIS bench/gemm_lib.c -I/usr/include/x86_64-linux-gnu/blis-pthread \
 *      /usr/lib/x86_64-linux-gnu/blis-pthread/libblis.so
 *
 * Usage: gemm_lib THREADS < SHAPES, where each line of SHAPES is one GEMM as
 * `gradc bench --print-gemms` writes it (to stderr):
 *
 *   gemm M N K BATCH TA TB BETA     (TA, TB: N or T; BETA: 0 or 1)
 *
 * Other lines are ignored.  For each shape it prints, one line each,
 * `M N K BATCH TA TB BETA GFLOPS` (row-major C = op(A) op(B) + BETA C,
 * BATCH calls, best of 5 timed repetitions of ~10 ms after a warm-up;
 * repeated shapes are measured once), then
 * `total MS GFLOPS`: the list run once in order (a step's GEMMs), median
 * over repetitions. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cblas.h>

#if defined(LIB_BLIS)
#include <blis.h>
static void set_threads(int n) { bli_thread_set_num_threads(n); }
static const char *lib_name(void) { return "blis"; }
#elif defined(LIB_OPENBLAS)
static void set_threads(int n) { openblas_set_num_threads(n); }
static const char *lib_name(void) { return "openblas"; }
#else
#error "define LIB_OPENBLAS or LIB_BLIS"
#endif

typedef struct Shape {
  int M, N, K, batch, beta;
  char ta, tb;
  float *a, *b, *c;
} Shape;

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

static float *buffer(size_t n) {
  float *p = malloc((n ? n : 1) * sizeof(float));
  if (!p) abort();
  for (size_t i = 0; i < n; i++) p[i] = (float)((i * 2654435761u % 1000) / 1000.0 - 0.5) * 0.1f;
  return p;
}

static void run(const Shape *s) {
  size_t mk = (size_t)s->M * s->K, kn = (size_t)s->K * s->N, mn = (size_t)s->M * s->N;
  int lda = s->ta == 'T' ? s->M : s->K, ldb = s->tb == 'T' ? s->K : s->N;
  for (int t = 0; t < s->batch; t++)
    cblas_sgemm(CblasRowMajor, s->ta == 'T' ? CblasTrans : CblasNoTrans, s->tb == 'T' ? CblasTrans : CblasNoTrans,
                s->M, s->N, s->K, 1.0f, s->a + t * mk, lda, s->b + t * kn, ldb, (float)s->beta, s->c + t * mn, s->N);
}

static double flops(const Shape *s) { return 2.0 * s->M * s->N * (double)s->K * s->batch; }

static int cmp(const void *x, const void *y) {
  double a = *(const double *)x, b = *(const double *)y;
  return (a > b) - (a < b);
}

int main(int argc, char **argv) {
  int threads = argc > 1 ? atoi(argv[1]) : 1;
  set_threads(threads > 0 ? threads : 1);
  Shape *sh = NULL;
  int n = 0, cap = 0;
  char line[512];
  while (fgets(line, sizeof line, stdin)) {
    Shape s = {0};
    if (sscanf(line, " gemm %d %d %d %d %c %c %d", &s.M, &s.N, &s.K, &s.batch, &s.ta, &s.tb, &s.beta) != 7) continue;
    if (n == cap) {
      cap = cap ? 2 * cap : 16;
      sh = realloc(sh, (size_t)cap * sizeof *sh);
      if (!sh) abort();
    }
    s.a = buffer((size_t)s.batch * s.M * s.K);
    s.b = buffer((size_t)s.batch * s.K * s.N);
    s.c = buffer((size_t)s.batch * s.M * s.N);
    sh[n++] = s;
  }
  printf("# %s, %d threads, %d GEMMs\n", lib_name(), threads, n);
  double total_flops = 0;
  double *gf = calloc((size_t)n + 1, sizeof(double));
  if (!gf) abort();
  for (int i = 0; i < n; i++) {
    const Shape *s = &sh[i];
    total_flops += flops(s);
    /* A shape seen before is not measured again. */
    for (int j = 0; j < i && !gf[i]; j++)
      if (s->M == sh[j].M && s->N == sh[j].N && s->K == sh[j].K && s->batch == sh[j].batch && s->ta == sh[j].ta &&
          s->tb == sh[j].tb && s->beta == sh[j].beta)
        gf[i] = gf[j];
    if (!gf[i]) {
      /* Repeat until ~10 ms per measurement, best of 5. */
      run(s);
      double t0 = now_ms();
      run(s);
      double one = now_ms() - t0;
      int reps = one < 10 ? (int)(10 / (one > 1e-3 ? one : 1e-3)) + 1 : 1;
      double best = 1e30;
      for (int r = 0; r < 5; r++) {
        t0 = now_ms();
        for (int k = 0; k < reps; k++) run(s);
        double ms = (now_ms() - t0) / reps;
        if (ms < best) best = ms;
      }
      gf[i] = flops(s) / best / 1e6;
    }
    printf("%d %d %d %d %c %c %d %.1f\n", s->M, s->N, s->K, s->batch, s->ta, s->tb, s->beta, gf[i]);
  }
  free(gf);
  /* The list in order, as a step runs it. */
  double ms[21];
  for (int r = -1; r < 21; r++) {
    double t0 = now_ms();
    for (int i = 0; i < n; i++) run(&sh[i]);
    if (r >= 0) ms[r] = now_ms() - t0;
  }
  qsort(ms, 21, sizeof ms[0], cmp);
  printf("total %.3f %.1f\n", ms[10], total_flops / ms[10] / 1e6);
  for (int i = 0; i < n; i++) {
    free(sh[i].a);
    free(sh[i].b);
    free(sh[i].c);
  }
  free(sh);
  return 0;
}
