/* api_params.c - params as the sessions of the C API hold them
 * (api_session.c) and checkpoints restore them (api_optim.c): the
 * generation that tells the back end they changed, the check of a params
 * file against the program's signature, and a tensor copied across float
 * dtypes.  Below both of its users, which call nothing of each other's
 * but the optimiser state's release (session -> optim). */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "api_impl.h"

void api_params_changed(gradc_session *s) {
  static _Atomic uint64_t last;
  s->params_gen = atomic_fetch_add(&last, 1) + 1;
}

/* Whether file dtype sd may hold a param of declared dtype dt (as `run`). */
static bool param_dtype_ok(IrDType dt, StDType sd) {
  bool half = dt == IR_DT_BF16 || dt == IR_DT_F16;
  return sd == ST_F32 || sd == ST_F64 || (half && (sd == ST_BF16 || sd == ST_F16));
}

bool api_check_params_file(const gradc_program *p, const StFile *f, const char *path, bool allow_optim, bool partial,
                           char *err, size_t errlen) {
  for (int i = 0; i < f->n; i++) {
    const char *name = f->t[i].name;
    if (allow_optim && strncmp(name, "optim.", 6) == 0) continue;
    if (api_param_index(p, name) < 0) {
      snprintf(err, errlen, "%s: tensor '%s': not a param of model '%s'", path, name, p->model);
      return false;
    }
  }
  for (int i = 0; i < p->nparams; i++) {
    const FeParam *q = &p->params[i];
    const StTensor *t = st_find(f, q->name);
    if (!t && partial) continue;
    if (!t) {
      snprintf(err, errlen, "%s: missing tensor '%s'", path, q->name);
      return false;
    }
    bool same = t->rank == q->type.shape.rank && param_dtype_ok(q->type.dtype, t->dtype);
    for (int k = 0; same && k < t->rank; k++) same = t->shape[k] == q->type.shape.dim[k];
    if (!same) {
      char w[IR_TYPE_STR_MAX], g[IR_TYPE_STR_MAX];
      snprintf(err, errlen, "%s: tensor '%s': expected %s, got %s", path, q->name, ir_type_str(&q->type, w, sizeof w),
               step_tensor_str(t, g, sizeof g));
      return false;
    }
  }
  return true;
}

void api_copy_tensor(const StTensor *src, StTensor *dst) {
  if (src->dtype == dst->dtype) {
    memcpy(dst->data, src->data, dst->nbytes);
    return;
  }
  int64_t n = st_numel(src);
  double *tmp = calloc((size_t)(n ? n : 1), sizeof(double));
  if (!tmp) abort();
  step_load(src, 0, n, tmp);
  for (int64_t j = 0; j < n; j++) {
    if (dst->dtype == ST_F64)
      ((double *)dst->data)[j] = tmp[j];
    else
      ((float *)dst->data)[j] = (float)tmp[j];
  }
  free(tmp);
}
