/* optim.c - the optimiser update of one param as a plain C loop
 * (codegen.h, "Optimiser updates"): what the `ref` target and builds
 * without LLVM run, and the oracle llvm_optim.c's generated kernels are
 * tested against.  The order of operations is torch's single-tensor
 * (for-loop) one, written out in runtime/api_optim.c's file comment;
 * llvm_optim.c emits exactly these operations in exactly this order, so
 * both paths give the same bits. */
#include <math.h>

#include "codegen.h"

/* torch.lerp for a scalar weight (aten/src/ATen/native/Lerp.h). */
static float lerpf(float a, float b, float w) { return fabsf(w) < 0.5f ? a + w * (b - a) : b - (b - a) * (1.0f - w); }
static double lerpd(double a, double b, double w) { return fabs(w) < 0.5 ? a + w * (b - a) : b - (b - a) * (1.0 - w); }

static void update_f32(CgOptimKind kind, float *p, const double *grad, float *s0, float *s1, int64_t n,
                       const CgOptimScalars *sc) {
  bool clip = sc->clip != 0;
  float coef = (float)sc->coef;
  if (kind == CG_OPTIM_SGD) {
    bool wd_on = sc->wd_on != 0, mom_on = sc->mom_on != 0, nesterov = sc->nesterov != 0, first = sc->first != 0;
    float wd = (float)sc->wd, mom = (float)sc->momentum, damp1 = (float)sc->damp1, neg_lr = (float)sc->neg_lr;
    for (int64_t j = 0; j < n; j++) {
      float g = (float)grad[j];
      if (clip) g = g * coef;
      if (wd_on) g = g + wd * p[j];
      if (mom_on) {
        s0[j] = first ? g : s0[j] * mom + damp1 * g;
        g = nesterov ? g + mom * s0[j] : s0[j];
      }
      p[j] = p[j] + neg_lr * g;
    }
    return;
  }
  float decay = (float)sc->decay, w1 = (float)sc->w1, b2 = (float)sc->beta2, w2 = (float)sc->w2;
  float eps = (float)sc->eps, neg_step = (float)sc->neg_step, bc2_sqrt = (float)sc->bc2_sqrt;
  for (int64_t j = 0; j < n; j++) {
    float g = (float)grad[j];
    if (clip) g = g * coef;
    float pj = p[j] * decay;
    float m = lerpf(s0[j], g, w1);
    float v = s1[j] * b2;
    v = v + w2 * g * g;
    float denom = sqrtf(v) / bc2_sqrt + eps;
    p[j] = pj + neg_step * m / denom;
    s0[j] = m;
    s1[j] = v;
  }
}

static void update_f64(CgOptimKind kind, double *p, const double *grad, double *s0, double *s1, int64_t n,
                       const CgOptimScalars *sc) {
  bool clip = sc->clip != 0;
  if (kind == CG_OPTIM_SGD) {
    bool wd_on = sc->wd_on != 0, mom_on = sc->mom_on != 0, nesterov = sc->nesterov != 0, first = sc->first != 0;
    for (int64_t j = 0; j < n; j++) {
      double g = grad[j];
      if (clip) g = g * sc->coef;
      if (wd_on) g = g + sc->wd * p[j];
      if (mom_on) {
        s0[j] = first ? g : s0[j] * sc->momentum + sc->damp1 * g;
        g = nesterov ? g + sc->momentum * s0[j] : s0[j];
      }
      p[j] = p[j] + sc->neg_lr * g;
    }
    return;
  }
  for (int64_t j = 0; j < n; j++) {
    double g = grad[j];
    if (clip) g = g * sc->coef;
    double pj = p[j] * sc->decay;
    double m = lerpd(s0[j], g, sc->w1);
    double v = s1[j] * sc->beta2;
    v = v + sc->w2 * g * g;
    double denom = sqrt(v) / sc->bc2_sqrt + sc->eps;
    p[j] = pj + sc->neg_step * m / denom;
    s0[j] = m;
    s1[j] = v;
  }
}

_Static_assert(sizeof(CgOptimScalars) == CG_OPTIM_NSCALARS * sizeof(double), "CgOptimScalars is an array of doubles");

void cg_optim_update_c(CgOptimKind kind, bool f64, void *param, const double *grad, void *s0, void *s1, int64_t n,
                       const CgOptimScalars *sc) {
  if (f64)
    update_f64(kind, param, grad, s0, s1, n, sc);
  else
    update_f32(kind, param, grad, s0, s1, n, sc);
}
