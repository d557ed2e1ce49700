/* init.c - initial param values from a model's `init` specs (DESIGN.md §2),
 * shared by `gradc init` and gradc_session_init_params so that both give
 * the same numbers for the same seed.
 *
 * One xoshiro256** generator is seeded with the seed (rng_seed) and the
 * params draw from it in declaration order, element by element in row-major
 * order: normal(mean, std) is mean + std * rng_normal, uniform(lo, hi) is
 * lo + (hi - lo) * rng_uniform; zeros and ones draw nothing.  Values are
 * computed in double and stored as F32 master weights (F64 for f64
 * params). */
#include <stdlib.h>

#include "frontend/frontend.h"
#include "runtime/runtime.h"

bool rt_init_params_fit(const FeParam *params, int n, char *err, size_t errlen) {
  uint64_t total = 0;
  for (int i = 0; i < n; i++) {
    const FeParam *p = &params[i];
    uint64_t bytes = p->type.dtype == IR_DT_F64 ? 8 : 4;
    bool ok = true;
    for (int k = 0; k < p->type.shape.rank && ok; k++) ok = mem_mul(bytes, (uint64_t)p->type.shape.dim[k], &bytes);
    char ty[IR_TYPE_STR_MAX], what[IR_TYPE_STR_MAX + 256];
    ir_type_str(&p->type, ty, sizeof ty);
    if (!ok) return errf(err, errlen, "param '%s' (%s) has more bytes than 64 bits can count", p->name, ty);
    snprintf(what, sizeof what, "param '%s' (%s)", p->name, ty);
    if (!mem_fits(what, bytes, err, errlen)) return false;
    if (!mem_add(total, bytes, &total)) total = UINT64_MAX;
  }
  return mem_fits("the params", total, err, errlen);
}

void rt_init_params(const FeParam *params, int n, uint64_t seed, StFile *out) {
  Rng rng;
  rng_seed(&rng, seed);
  for (int i = 0; i < n; i++) {
    const FeParam *p = &params[i];
    int64_t numel = ir_numel(&p->type.shape);
    bool f64 = p->type.dtype == IR_DT_F64;
    /* Drawn straight into the file's tensor: one copy in memory. */
    void *buf = st_add(out, p->name, f64 ? ST_F64 : ST_F32, p->type.shape.rank, p->type.shape.dim, NULL)->data;
    for (int64_t j = 0; j < numel; j++) {
      double v = 0;
      switch (p->init) {
      case FE_INIT_ZEROS: v = 0; break;
      case FE_INIT_ONES: v = 1; break;
      case FE_INIT_NORMAL: v = p->a + p->b * rng_normal(&rng); break;
      case FE_INIT_UNIFORM: v = p->a + (p->b - p->a) * rng_uniform(&rng); break;
      }
      if (f64)
        ((double *)buf)[j] = v;
      else
        ((float *)buf)[j] = (float)v;
    }
  }
}
