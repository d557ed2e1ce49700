/* fma_peak.c - the f32 multiply-add throughput one core sustains right
 * now: the yardstick bench/run.py prints beside its tables.  The same CPU
 * model runs at different speeds on different hosts and at different
 * times on one shared host (turbo, a neighbour's load), so a GEMM's
 * GFLOP/s or a step's milliseconds mean little without it.
 *
 * Each thread runs 12 independent chains of vector FMAs (enough to cover
 * the FMA latency with two FMA units), 512 bits wide where the CPU has
 * AVX-512F, else 256 bits with AVX2 and FMA, else 128-bit multiplies and
 * adds (SSE2, counted as two flops an element as well).  Built by `cmake
 * --build build --target fma_peak`; bench/run.py runs it.
 *
 * Usage: fma_peak [THREADS]  (default 1; pin it with taskset)
 * Prints one line: `ISA GFLOPS_PER_THREAD THREADS`, the mean over the
 * threads of each one's best of 5 runs of ~0.1 s. */
#include <immintrin.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define CHAINS 12
/* Every chain in its own register: the inner loop unrolled (GCC and clang
 * both read this pragma), else -O2 keeps acc[] in memory. */
#define UNROLLED(stmt) _Pragma("GCC unroll 12") for (int i = 0; i < CHAINS; i++) stmt
#define REPS 5

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* The chains' sum goes to *sink so the loop is not optimised away. */
__attribute__((target("avx512f"))) static void run_avx512(long iters, float *sink) {
  __m512 acc[CHAINS], m = _mm512_set1_ps(0.999999f), c = _mm512_set1_ps(1e-6f);
  for (int i = 0; i < CHAINS; i++) acc[i] = _mm512_set1_ps((float)i);
  for (long k = 0; k < iters; k++)
    UNROLLED(acc[i] = _mm512_fmadd_ps(acc[i], m, c));
  float s = 0;
  for (int i = 0; i < CHAINS; i++) s += _mm512_reduce_add_ps(acc[i]);
  *sink = s;
}

__attribute__((target("avx2,fma"))) static void run_avx2(long iters, float *sink) {
  __m256 acc[CHAINS], m = _mm256_set1_ps(0.999999f), c = _mm256_set1_ps(1e-6f);
  for (int i = 0; i < CHAINS; i++) acc[i] = _mm256_set1_ps((float)i);
  for (long k = 0; k < iters; k++)
    UNROLLED(acc[i] = _mm256_fmadd_ps(acc[i], m, c));
  float lanes[8], s = 0;
  for (int i = 0; i < CHAINS; i++) {
    _mm256_storeu_ps(lanes, acc[i]);
    for (int j = 0; j < 8; j++) s += lanes[j];
  }
  *sink = s;
}

static void run_sse(long iters, float *sink) {
  __m128 acc[CHAINS], m = _mm_set1_ps(0.999999f), c = _mm_set1_ps(1e-6f);
  for (int i = 0; i < CHAINS; i++) acc[i] = _mm_set1_ps((float)i);
  for (long k = 0; k < iters; k++)
    UNROLLED(acc[i] = _mm_add_ps(_mm_mul_ps(acc[i], m), c));
  float lanes[4], s = 0;
  for (int i = 0; i < CHAINS; i++) {
    _mm_storeu_ps(lanes, acc[i]);
    for (int j = 0; j < 4; j++) s += lanes[j];
  }
  *sink = s;
}

typedef struct {
  int width; /* floats a vector */
  double gflops;
  float sink;
} Probe;

static void run(const Probe *p, long iters, float *sink) {
  if (p->width == 16)
    run_avx512(iters, sink);
  else if (p->width == 8)
    run_avx2(iters, sink);
  else
    run_sse(iters, sink);
}

static void *probe(void *arg) {
  Probe *p = arg;
  long iters = 1000;
  for (;;) { /* ~0.1 s a run */
    double t = now_s();
    run(p, iters, &p->sink);
    t = now_s() - t;
    if (t > 0.1 || iters > (1L << 40)) break;
    iters *= t > 0.01 ? (long)(0.1 / t) + 1 : 10;
  }
  double best = 0;
  for (int r = 0; r < REPS; r++) {
    double t = now_s();
    run(p, iters, &p->sink);
    t = now_s() - t;
    double g = (double)iters * CHAINS * p->width * 2 / t / 1e9;
    if (g > best) best = g;
  }
  p->gflops = best;
  return NULL;
}

int main(int argc, char **argv) {
  int threads = argc > 1 ? atoi(argv[1]) : 1;
  if (threads < 1 || threads > 1024) {
    fprintf(stderr, "fma_peak: THREADS must be 1..1024, not '%s'\n", argv[1]);
    return 1;
  }
  __builtin_cpu_init();
  int width = __builtin_cpu_supports("avx512f")                                      ? 16
              : __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") ? 8
                                                                                      : 4;
  Probe *p = calloc((size_t)threads, sizeof *p);
  pthread_t *t = calloc((size_t)threads, sizeof *t);
  if (!p || !t) return 1;
  for (int i = 0; i < threads; i++) {
    p[i].width = width;
    if (pthread_create(&t[i], NULL, probe, &p[i]) != 0) {
      fprintf(stderr, "fma_peak: cannot start thread %d\n", i);
      return 1;
    }
  }
  double sum = 0;
  for (int i = 0; i < threads; i++) {
    pthread_join(t[i], NULL);
    sum += p[i].gflops;
  }
  printf("%s %.1f %d\n", width == 16 ? "avx512" : width == 8 ? "avx2" : "sse", sum / threads, threads);
  free(p);
  free(t);
  return 0;
}
