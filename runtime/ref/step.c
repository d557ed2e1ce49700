/* step.c - one training window on the reference interpreter (DESIGN.md §3):
 *
 *   1. check the params and inputs files against the function's arguments
 *      and convert them to doubles (window.c);
 *   2. count phase: the window sums over every micro-batch (window.c);
 *   3. step phase: run each micro-batch in full, add every `loss` output
 *      into its window loss and every `grad` output into its param's
 *      persistent gradient buffer, rounded as that buffer's dtype would
 *      be, every `output` and `update` into its window value (window.c),
 *      then drop the micro-batch's activations.
 *
 * Also the interpreter as a back end (backend.h): the "ref" target, and
 * "cpu" in a build without LLVM. */
#include <stdlib.h>
#include <string.h>

#include "passes/passes.h"
#include "runtime/backend.h"
#include "runtime/gemm_plan.h"
#include "runtime/runtime.h"

bool step_run_ref(const IrFunc *f, int gas, const StFile *params, const char *params_path, const StFile *inputs,
                  const char *inputs_path, const InterpOptions *opt, StepResult *out, char *err, size_t errlen) {
  static const InterpOptions defaults = {0};
  if (!opt) opt = &defaults;
  memset(out, 0, sizeof *out);
  int na = f->nargs, nv = f->nvalues;
  const StTensor **bound = mem_calloc((size_t)na + 1, sizeof(StTensor *));
  double **data = mem_calloc((size_t)na + 1, sizeof(double *));
  double **args = mem_calloc((size_t)na + 1, sizeof(double *));
  double **wsum = mem_calloc((size_t)nv + 1, sizeof(double *));
  InterpState st = {0};
  StepResult r = {0};
  bool ok = step_bind(f, gas, params, params_path, inputs, inputs_path, bound, err, errlen) &&
            step_result_init(f, gas, &r, err, errlen);
  for (int i = 0; ok && i < na; i++) {
    int64_t n = st_numel(bound[i]);
    data[i] = mem_calloc((size_t)n, sizeof(double));
    step_load(bound[i], 0, n, data[i]);
  }

  /* Phase 1: window sums over every micro-batch. */
  ok = ok && step_window_sums(f, gas, data, wsum, opt, err, errlen);

  /* Phase 2: the step, one micro-batch's activations alive at a time. */
  for (int k = 0; ok && k < gas; k++) {
    step_micro_args(f, k, data, args);
    step_rng_words(f, gas, k, st.rng);
    st.loss_scale = step_loss_scale();
    ok = interp_run(&st, f, args, wsum, INTERP_STEP, opt, err, errlen);
    for (int i = 0; ok && i < f->nops; i++) {
      const IrOp *op = f->ops[i];
      if (op->opcode == IR_OP_LOSS) {
        const double *v = st.val[op->args[0]->id];
        int64_t n = ir_numel(&op->args[0]->type.shape);
        int j = step_loss_slot(&r, op);
        for (int64_t e = 0; e < n; e++) r.losses[j] += v[e];
      } else if (op->opcode == IR_OP_OUTPUT || op->opcode == IR_OP_UPDATE) {
        step_add_state(&r, op, k, gas, st.val[op->args[0]->id], IR_DT_F64, ir_numel(&op->args[0]->type.shape));
      } else if (op->opcode == IR_OP_GRAD) {
        int g = step_grad_slot(&r, op);
        const double *v = st.val[op->args[0]->id];
        int64_t n = ir_numel(&op->args[0]->type.shape); /* the param's (this rank's shard's) size */
        double *dst = r.grads[g];
        /* The buffer is f32 (f64 for f64 params): round as it would. */
        for (int64_t e = 0; e < n; e++)
          dst[e] = opt->exact_f64 ? dst[e] + v[e] : ir_round_dtype(dst[e] + v[e], r.grad_types[g].dtype);
      }
    }
    if (ok) interp_free(&st);
  }
  /* Sharded params: the whole gradient from every tp rank's shard. */
  ok = ok && step_tp_gather(f, &r, err, errlen);

  for (int i = 0; i < na; i++) free(data[i]);
  for (int i = 0; i < nv; i++) free(wsum[i]);
  free(bound);
  free(data);
  free(args);
  free(wsum);
  if (!ok) {
    step_result_free(&r);
    return false;
  }
  *out = r;
  return true;
}

/* ------------------------------------------------------------------ */
/* The interpreter as a back end                                        */
/* ------------------------------------------------------------------ */

/* Its program is the function itself: nothing is compiled. */
static void *ref_compile(IrFunc *f, const BackendOptions *o, char *err, size_t errlen) { return f; }

static void *ref_load(IrFunc *f, const ArtFile *a, const BackendOptions *o, char *err, size_t errlen) { return f; }

static bool ref_run(void *prog, int gas, const StFile *params, const char *params_path, const StFile *inputs,
                    const char *inputs_path, StepResult *out, char *err, size_t errlen) {
  return step_run_ref(prog, gas, params, params_path, inputs, inputs_path, NULL, out, err, errlen);
}

static void ref_free(void *prog) {}

const Backend rt_backend_ref = {
    .name = "ref",
    .pipeline = pass_pipeline,
    .compile = ref_compile,
    .load = ref_load,
    .run = ref_run,
    .free = ref_free,
};
