/* gemm_blis.c - the BLIS GEMM provider (gemm.h): BLIS's typed API
 * (bli_sgemm_ex, bli_dgemm_ex), which takes a row and a column stride per
 * matrix, so row-major operands and transposes need no CBLAS layer.  (The
 * CBLAS names BLIS also exports are OpenBLAS's in this process; its own
 * names are not.)  The thread count goes in a runtime object per call, so
 * calls from the executor's pool run single-threaded beside each other. */
#include <stdio.h>
#include <string.h>

#include <blis.h>

#include "gemm.h"

static bool usable(char *why, size_t n) {
  (void)why, (void)n;
  return true;
}

static void version(char *buf, size_t n) {
  snprintf(buf, n, "BLIS %s; %s", bli_info_get_version_str(), bli_arch_string(bli_arch_query_id()));
}

static void *plan(const CpuGemmDesc *d, char *err, size_t n) {
  if (d->type == CPU_GEMM_BF16 || d->epilogue != CPU_EPI_NONE) {
    snprintf(err, n, "blis runs f32 and f64 products only");
    return NULL;
  }
  return (void *)1;
}

static void run(void *p, const CpuGemmDesc *d, const void *a, const void *b, void *c, const float *extra) {
  (void)p, (void)extra;
  rntm_t rntm;
  bli_rntm_init(&rntm);
  bli_rntm_set_num_threads(d->threads, &rntm);
  trans_t TA = d->ta ? BLIS_TRANSPOSE : BLIS_NO_TRANSPOSE, TB = d->tb ? BLIS_TRANSPOSE : BLIS_NO_TRANSPOSE;
  for (int64_t u = 0; u < cpu_gemm_count(d); u++) {
    int64_t oa, ob, oc;
    cpu_gemm_offsets(d, u, &oa, &ob, &oc);
    if (d->type == CPU_GEMM_F64) {
      double one = 1.0, beta = d->accumulate ? 1.0 : 0.0;
      bli_dgemm_ex(TA, TB, d->M, d->N, d->K, &one, (double *)a + oa, d->lda, 1, (double *)b + ob, d->ldb, 1, &beta,
                   (double *)c + oc, d->ldc, 1, NULL, &rntm);
    } else {
      float one = 1.0f, beta = d->accumulate ? 1.0f : 0.0f;
      bli_sgemm_ex(TA, TB, d->M, d->N, d->K, &one, (float *)a + oa, d->lda, 1, (float *)b + ob, d->ldb, 1, &beta,
                   (float *)c + oc, d->ldc, 1, NULL, &rntm);
    }
  }
}

static void plan_free(void *p) { (void)p; }

const CpuGemmProvider cpu_gemm_blis = {"blis", usable, version, plan, run, plan_free, NULL};
