/* gemm_openblas.c - the OpenBLAS GEMM provider (gemm.h): cblas_sgemm and
 * cblas_dgemm, a call per batch matrix.  bf16 and epilogues run through
 * gemm.c's widening and loops.
 *
 * OpenBLAS picks its kernels by its own CPU detection, which Debian 12's
 * 0.3.21 gets wrong on CPUs newer than it (a current Xeon runs the
 * "Prescott" kernels at a fifth of the speed).  So the provider is not
 * usable when the core it reports predates AVX2 on a CPU that has it;
 * GRADC_GEMM=openblas still runs it, with a warning (cpu_gemm_select). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cblas.h>

#include "gemm.h"

/* Cores OpenBLAS names whose kernels have no AVX2 (its TARGET list). */
static const char *const pre_avx2[] = {"Prescott", "Nehalem", "Core2",   "Penryn",   "Dunnington", "Atom",
                                       "Katmai",   "Coppermine", "Northwood", "Banias", "Yonah",   "Sandybridge",
                                       "Athlon",   "Opteron", "Opteron_SSE3", "Barcelona", "Bobcat", "Bulldozer",
                                       "Piledriver", "Steamroller", "Unknown", "generic"};

static bool usable(char *why, size_t n) {
  const char *core = openblas_get_corename();
  if (!core || !cpu_gemm_has_avx2()) return true;
  for (size_t i = 0; i < sizeof pre_avx2 / sizeof *pre_avx2; i++)
    if (strcasecmp(core, pre_avx2[i]) == 0) {
      snprintf(why, n, "OpenBLAS detected this CPU as '%s', whose kernels lack the AVX2 it has", core);
      return false;
    }
  return true;
}

static void version(char *buf, size_t n) {
  const char *cfg = openblas_get_config(), *core = openblas_get_corename();
  snprintf(buf, n, "%s; core %s", cfg ? cfg : "OpenBLAS", core ? core : "?");
}

static void *plan(const CpuGemmDesc *d, char *err, size_t n) {
  if (d->type == CPU_GEMM_BF16 || d->epilogue != CPU_EPI_NONE) {
    snprintf(err, n, "openblas runs f32 and f64 products only");
    return NULL;
  }
  if (d->M > INT32_MAX || d->N > INT32_MAX || d->K > INT32_MAX || d->lda > INT32_MAX || d->ldb > INT32_MAX ||
      d->ldc > INT32_MAX) {
    snprintf(err, n, "a dimension over 2^31 is too large for OpenBLAS");
    return NULL;
  }
  return (void *)1; /* nothing to keep: the descriptor says it all */
}

static void run(void *p, const CpuGemmDesc *d, const void *a, const void *b, void *c, const float *extra) {
  (void)p, (void)extra;
  if (openblas_get_num_threads() != d->threads) openblas_set_num_threads(d->threads);
  enum CBLAS_TRANSPOSE TA = d->ta ? CblasTrans : CblasNoTrans, TB = d->tb ? CblasTrans : CblasNoTrans;
  for (int64_t u = 0; u < cpu_gemm_count(d); u++) {
    int64_t oa, ob, oc;
    cpu_gemm_offsets(d, u, &oa, &ob, &oc);
    if (d->type == CPU_GEMM_F64)
      cblas_dgemm(CblasRowMajor, TA, TB, (blasint)d->M, (blasint)d->N, (blasint)d->K, 1.0, (const double *)a + oa,
                  (blasint)d->lda, (const double *)b + ob, (blasint)d->ldb, d->accumulate ? 1.0 : 0.0,
                  (double *)c + oc, (blasint)d->ldc);
    else
      cblas_sgemm(CblasRowMajor, TA, TB, (blasint)d->M, (blasint)d->N, (blasint)d->K, 1.0f, (const float *)a + oa,
                  (blasint)d->lda, (const float *)b + ob, (blasint)d->ldb, d->accumulate ? 1.0f : 0.0f,
                  (float *)c + oc, (blasint)d->ldc);
  }
}

static void plan_free(void *p) { (void)p; }

const CpuGemmProvider cpu_gemm_openblas = {"openblas", usable, version, plan, run, plan_free, NULL};
