/* gemm_epilogue.c - what a fused GEMM epilogue (runtime/cpu/gemm.h) saves
 * against the same work as a separate pass over C, per provider, at the
 * GEMM shapes of tinygpt large (B16 T128 C256): the measurement behind
 * docs/DECISIONS.md "GEMM epilogues".  Built by `cmake --build build
 * --target gemm_epilogue`; bench/run.py --epilogues runs it.
 *
 * Usage: gemm_epilogue [THREADS]
 * For each provider and shape it prints one line:
 *   PROVIDER M N K EPILOGUE plain_ms fused_ms separate_ms
 * plain: the product alone; fused: the product with the epilogue in the
 * plan (a post-op for oneDNN; gemm.c's loop after each call for the
 * others); separate: the product, then a second pass over C doing the
 * epilogue (what a kernel after the GEMM costs: bias and residual adds
 * vectorise; gelu is gradc's tanh form through libm).  EPILOGUE `acc` is
 * beta = 1 (fused: the provider's beta or sum post-op; separate: the
 * product into scratch, then C += scratch).  Best of 7 after a warm-up. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "runtime/cpu/gemm.h"

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

static float *buf(size_t n) {
  float *p = malloc((n ? n : 1) * sizeof(float));
  if (!p) abort();
  for (size_t i = 0; i < n; i++) p[i] = (float)((i * 2654435761u % 1000) / 1000.0 - 0.5) * 0.1f;
  return p;
}

static float gelu(float x) { return 0.5f * x * (1.0f + tanhf(0.7978845608f * (x + 0.044715f * x * x * x))); }

/* The second pass over C (M x N, ldc = N). */
static void separate(CpuGemmEpilogue e, bool acc, float *c, const float *scratch, const float *extra, int64_t M,
                     int64_t N) {
  for (int64_t i = 0; i < M; i++) {
    float *row = c + i * N;
    if (acc) {
      const float *s = scratch + i * N;
      for (int64_t j = 0; j < N; j++) row[j] += s[j];
      continue;
    }
    switch (e) {
    case CPU_EPI_NONE: break;
    case CPU_EPI_BIAS:
      for (int64_t j = 0; j < N; j++) row[j] += extra[j];
      break;
    case CPU_EPI_BIAS_GELU:
      for (int64_t j = 0; j < N; j++) row[j] = gelu(row[j] + extra[j]);
      break;
    case CPU_EPI_BIAS_RELU:
      for (int64_t j = 0; j < N; j++) row[j] = row[j] + extra[j] > 0 ? row[j] + extra[j] : 0.0f;
      break;
    case CPU_EPI_RESIDUAL:
      for (int64_t j = 0; j < N; j++) row[j] += extra[i * N + j];
      break;
    }
  }
}

typedef struct Case {
  int64_t M, N, K;
  bool ta;
  CpuGemmEpilogue e;
  bool acc;
  const char *name;
} Case;

int main(int argc, char **argv) {
  int threads = argc > 1 ? atoi(argv[1]) : 1;
  /* tinygpt large: qkv + bias, fc + bias + gelu, proj + residual, dW
   * accumulate; mlp2's first layer + bias + relu. */
  const Case cases[] = {
      {2048, 768, 256, false, CPU_EPI_BIAS, false, "bias"},
      {256, 1024, 784, false, CPU_EPI_BIAS_RELU, false, "bias_relu"},
      {2048, 1024, 256, false, CPU_EPI_BIAS_GELU, false, "bias_gelu"},
      {2048, 256, 1024, false, CPU_EPI_RESIDUAL, false, "residual"},
      {256, 1024, 2048, true, CPU_EPI_NONE, true, "acc"},
  };
  const CpuGemmProvider *const *provs;
  int np = cpu_gemm_providers(&provs);
  printf("# provider M N K epilogue plain_ms fused_ms separate_ms (threads %d)\n", threads);
  for (int p = 0; p < np; p++)
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
      const Case *c = &cases[k];
      float *a = buf((size_t)(c->M * c->K)), *b = buf((size_t)(c->K * c->N)), *C = buf((size_t)(c->M * c->N));
      float *S = buf((size_t)(c->M * c->N)), *x = buf((size_t)(c->M * c->N));
      CpuGemmDesc d = {.type = CPU_GEMM_F32, .ta = c->ta, .M = c->M, .N = c->N, .K = c->K,
                       .lda = c->ta ? c->M : c->K, .ldb = c->N, .ldc = c->N, .threads = threads, .ldr = c->N};
      CpuGemmDesc df = d;
      df.epilogue = c->e;
      df.accumulate = c->acc;
      char err[512];
      CpuGemm *plain = cpu_gemm_plan(provs[p], &d, err, sizeof err), *fused = cpu_gemm_plan(provs[p], &df, err, sizeof err);
      if (!plain || !fused) {
        printf("%s %lld %lld %lld %s cannot plan: %s\n", provs[p]->name, (long long)c->M, (long long)c->N,
               (long long)c->K, c->name, err);
        continue;
      }
      double best[3] = {INFINITY, INFINITY, INFINITY};
      for (int r = 0; r < 8; r++) {
        double t0 = now_ms();
        cpu_gemm_run(plain, a, b, C, NULL);
        double t1 = now_ms();
        cpu_gemm_run(fused, a, b, C, x);
        double t2 = now_ms();
        cpu_gemm_run(plain, a, b, c->acc ? S : C, NULL);
        separate(c->e, c->acc, C, S, x, c->M, c->N);
        double t3 = now_ms();
        if (r == 0) continue;
        best[0] = fmin(best[0], t1 - t0);
        best[1] = fmin(best[1], t2 - t1);
        best[2] = fmin(best[2], t3 - t2);
      }
      printf("%s %lld %lld %lld %s %.3f %.3f %.3f%s\n", provs[p]->name, (long long)c->M, (long long)c->N,
             (long long)c->K, c->name, best[0], best[1], best[2], c->e == CPU_EPI_NONE || cpu_gemm_fused(fused) ? "" : "  (no post-op: gemm.c's loop)");
      cpu_gemm_free(plain);
      cpu_gemm_free(fused);
      free(a), free(b), free(C), free(S), free(x);
    }
  return 0;
}
