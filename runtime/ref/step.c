/* step.c - one training window on the reference interpreter (DESIGN.md §3):
 *
 *   1. check the params and inputs files against the function's arguments
 *      (by name, type and window shape) and convert them to doubles;
 *   2. count phase: run each micro-batch far enough to evaluate the
 *      window.sum operands and sum them over the window (the divisor of a
 *      batch mean, the count of non-ignored targets);
 *   3. step phase: run each micro-batch in full, add every `loss` output
 *      into its window loss and every `grad` output into its param's
 *      persistent gradient buffer, then drop the micro-batch's activations.
 *
 * Batched inputs arrive window-sized (K times the micro-batch on axis 0)
 * and are split into K contiguous micro-batches; other inputs and params
 * are passed whole to every micro-batch.  In a data-parallel window
 * (comm_step.c) step_bind takes this rank's samples of the window and
 * step_window_sums adds every rank's counts. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/comm/comm.h"
#include "runtime/runtime.h"

static void *xcalloc(size_t n, size_t size) {
  void *p = calloc(n ? n : 1, size);
  if (!p) abort();
  return p;
}

/* ------------------------------------------------------------------ */
/* Checking and converting the tensors                                  */
/* ------------------------------------------------------------------ */

/* "f32[784,255]" for a file tensor, in the IR's spelling ("i64" for I64). */
static char *st_type_str(const StTensor *t, char *buf, size_t n) {
  static const char *const names[] = {"f32", "f64", "bf16", "f16", "i32", "i64"};
  size_t k = (size_t)snprintf(buf, n, "%s", names[t->dtype]);
  for (int i = 0; i < t->rank && k < n; i++)
    k += (size_t)snprintf(buf + k, n - k, "%c%lld", i ? ',' : '[', (long long)t->shape[i]);
  if (t->rank > 0 && k < n) snprintf(buf + k, n - k, "]");
  return buf;
}

/* Whether a file dtype may feed an argument of dtype dt (DESIGN.md §5). */
static bool dtype_accepted(IrDType dt, StDType sd) {
  switch (dt) {
  case IR_DT_F32:
  case IR_DT_F64: return sd == ST_F32 || sd == ST_F64;
  case IR_DT_BF16:
  case IR_DT_F16: return sd == ST_F32 || sd == ST_F64 || sd == ST_BF16 || sd == ST_F16;
  case IR_DT_I32: return sd == ST_I32 || sd == ST_I64;
  case IR_DT_BOOL: return false;
  }
  return false;
}

static double half_to_double(uint16_t h) {
  int sign = h >> 15, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
  double v;
  if (exp == 0) v = ldexp((double)man, -24); /* subnormal */
  else if (exp == 31) v = man ? NAN : INFINITY;
  else v = ldexp((double)(man | 0x400), exp - 25);
  return sign ? -v : v;
}

/* Element i of t as a double.  Files are little-endian; so is every host
 * this runs on, which read.c-style byte assembly makes explicit. */
static uint64_t load_le(const unsigned char *p, int n) {
  uint64_t v = 0;
  for (int i = n - 1; i >= 0; i--) v = (v << 8) | p[i];
  return v;
}

/* An I64 tensor feeding an i32 argument must hold i32 values. */
static bool check_range(const StTensor *t, const char *path, char *err, size_t errlen) {
  if (t->dtype != ST_I64) return true;
  const unsigned char *p = t->data;
  int64_t n = st_numel(t);
  for (int64_t i = 0; i < n; i++) {
    int64_t v = (int64_t)load_le(p + 8 * i, 8);
    if (v < INT32_MIN || v > INT32_MAX)
      return errf(err, errlen, "%s: tensor '%s': value %lld at element %lld is out of range for i32", path, t->name,
                  (long long)v, (long long)i);
  }
  return true;
}

void step_load(const StTensor *t, int64_t begin, int64_t n, double *out) {
  const unsigned char *p = t->data;
  for (int64_t k = 0; k < n; k++) {
    int64_t i = begin + k;
    switch (t->dtype) {
    case ST_F32: {
      uint32_t u = (uint32_t)load_le(p + 4 * i, 4);
      float f;
      memcpy(&f, &u, 4);
      out[k] = f;
      break;
    }
    case ST_F64: {
      uint64_t u = load_le(p + 8 * i, 8);
      double d;
      memcpy(&d, &u, 8);
      out[k] = d;
      break;
    }
    case ST_BF16: {
      uint32_t u = (uint32_t)load_le(p + 2 * i, 2) << 16;
      float f;
      memcpy(&f, &u, 4);
      out[k] = f;
      break;
    }
    case ST_F16: out[k] = half_to_double((uint16_t)load_le(p + 2 * i, 2)); break;
    case ST_I32: out[k] = (double)(int32_t)(uint32_t)load_le(p + 4 * i, 4); break;
    case ST_I64: out[k] = (double)(int64_t)load_le(p + 8 * i, 8); break;
    }
  }
}

/* The type an argument's tensor must have in the file: batched inputs hold
 * the whole window (K micro-batches on axis 0, of every data-parallel
 * rank). */
static IrType window_type(const IrValue *a, int gas) {
  IrType t = step_arg_type(a); /* a sharded param's file tensor is the whole param */
  if (a->role == IR_ARG_INPUT && a->batched && t.shape.rank > 0) t.shape.dim[0] *= (int64_t)gas * step_dp_size();
  return t;
}

/* Check one file against the arguments of one role; fill bound[arg index]. */
static bool bind_file(const IrFunc *f, int gas, IrArgRole role, const StFile *file, const char *path,
                      const StTensor **bound, char *err, size_t errlen) {
  const char *what = role == IR_ARG_PARAM ? "param" : "input";
  for (int i = 0; i < file->n; i++) {
    const IrValue *a = ir_func_find_arg(f, file->t[i].name);
    if (!a || a->role != role)
      return errf(err, errlen, "%s: tensor '%s': not a%s %s of the model", path, file->t[i].name,
                  role == IR_ARG_INPUT ? "n" : "", what);
  }
  for (int i = 0; i < f->nargs; i++) {
    const IrValue *a = f->args[i];
    if (a->role != role) continue;
    const StTensor *t = st_find(file, a->name);
    if (!t) return errf(err, errlen, "%s: missing tensor '%s'", path, a->name);
    IrType want = window_type(a, gas);
    bool same = t->rank == want.shape.rank && dtype_accepted(want.dtype, t->dtype);
    for (int k = 0; same && k < t->rank; k++) same = t->shape[k] == want.shape.dim[k];
    if (!same) {
      char w[IR_TYPE_STR_MAX], g[IR_TYPE_STR_MAX];
      return errf(err, errlen, "%s: tensor '%s': expected %s, got %s", path, a->name, ir_type_str(&want, w, sizeof w),
                  st_type_str(t, g, sizeof g));
    }
    if (!check_range(t, path, err, errlen)) return false;
    bound[i] = t;
  }
  return true;
}

bool step_bind(const IrFunc *f, int gas, const StFile *params, const char *params_path, const StFile *inputs,
               const char *inputs_path, const StTensor **bound, char *err, size_t errlen) {
  if (gas < 1) return errf(err, errlen, "gradient accumulation steps must be >= 1 (got %d)", gas);
  if (!bind_file(f, gas, IR_ARG_PARAM, params, params_path, bound, err, errlen) ||
      !bind_file(f, gas, IR_ARG_INPUT, inputs, inputs_path, bound, err, errlen))
    return false;
  step_dp_slice(f, bound); /* data-parallel: this rank's samples of the window */
  return step_tp_slice(f, bound, err, errlen); /* tensor-parallel: this rank's shards */
}

/* ------------------------------------------------------------------ */
/* The window                                                          */
/* ------------------------------------------------------------------ */

void step_result_free(StepResult *r) {
  for (int i = 0; i < r->ngrads; i++) free(r->grads ? r->grads[i] : NULL);
  free(r->grads);
  free(r->grad_types);
  free(r->grad_names);
  free(r->losses);
  free(r->loss_names);
  free(r->dp_reduced);
  memset(r, 0, sizeof *r);
}

static const char *output_name(const IrOp *op) { return ir_attr_get_str(op, "name", ""); }

bool step_result_init(const IrFunc *f, StepResult *out, char *err, size_t errlen) {
  int na = f->nargs;
  StepResult r = {0};
  memset(out, 0, sizeof *out);
  /* Outputs: losses by name in source order, one gradient per param. */
  r.loss_names = xcalloc((size_t)f->nops, sizeof(char *));
  r.losses = xcalloc((size_t)f->nops, sizeof(double));
  const IrOp **first = xcalloc((size_t)f->nops + 1, sizeof(IrOp *));
  bool located = true; /* every loss located in one file */
  for (int i = 0; i < f->nops; i++) {
    const IrOp *op = f->ops[i];
    if (op->opcode != IR_OP_LOSS) continue;
    bool seen = false;
    for (int j = 0; j < r.nlosses && !seen; j++) seen = strcmp(r.loss_names[j], output_name(op)) == 0;
    if (seen) continue;
    located &= op->loc.file && (!r.nlosses || strcmp(op->loc.file, first[0]->loc.file) == 0);
    first[r.nlosses] = op;
    r.loss_names[r.nlosses++] = output_name(op);
  }
  /* Back ends may schedule the outputs differently (fuse reorders ops):
   * report losses in the order of their statements when that is known. */
  for (int i = 1; located && i < r.nlosses; i++)
    for (int j = i; j > 0; j--) {
      const IrLoc *a = &first[j - 1]->loc, *b = &first[j]->loc;
      if (a->line < b->line || (a->line == b->line && a->col <= b->col)) break;
      const IrOp *t = first[j];
      first[j] = first[j - 1];
      first[j - 1] = t;
      const char *n = r.loss_names[j];
      r.loss_names[j] = r.loss_names[j - 1];
      r.loss_names[j - 1] = n;
    }
  free(first);
  r.grad_names = xcalloc((size_t)na, sizeof(char *));
  r.grad_types = xcalloc((size_t)na, sizeof(IrType));
  r.grads = xcalloc((size_t)na, sizeof(double *));
  for (int i = 0; i < na; i++) {
    const IrValue *a = f->args[i];
    if (a->role != IR_ARG_PARAM) continue;
    r.grad_names[r.ngrads] = a->name;
    r.grad_types[r.ngrads].dtype = a->type.dtype == IR_DT_F64 ? IR_DT_F64 : IR_DT_F32;
    r.grad_types[r.ngrads].shape = step_arg_type(a).shape; /* whole; a shard's driver fills the first part */
    r.grads[r.ngrads] = xcalloc((size_t)ir_numel(&r.grad_types[r.ngrads].shape), sizeof(double));
    r.ngrads++;
  }
  bool ok = true;
  for (int i = 0; i < f->nops && ok; i++) {
    const IrOp *op = f->ops[i];
    if (op->opcode == IR_OP_GRAD) {
      const IrValue *p = ir_func_find_arg(f, output_name(op));
      if (!p || p->role != IR_ARG_PARAM)
        ok = errf(err, errlen, "grad output names '%s', which is not a param", output_name(op));
      else if (ir_numel(&p->type.shape) != ir_numel(&op->args[0]->type.shape))
        ok = errf(err, errlen, "grad output for '%s' does not have the param's size", p->name);
    }
    if (op->opcode == IR_OP_WINDOW_SUM && ir_numel(&op->result->type.shape) != ir_numel(&op->args[0]->type.shape))
      ok = errf(err, errlen, "window.sum result and operand sizes differ");
  }
  if (!ok) {
    step_result_free(&r);
    return false;
  }
  *out = r;
  return true;
}

int step_loss_slot(const StepResult *r, const IrOp *loss) {
  for (int j = 0; j < r->nlosses; j++)
    if (strcmp(r->loss_names[j], output_name(loss)) == 0) return j;
  return -1;
}

int step_grad_slot(const StepResult *r, const IrOp *grad) {
  for (int j = 0; j < r->ngrads; j++)
    if (strcmp(r->grad_names[j], output_name(grad)) == 0) return j;
  return -1;
}

/* Point args[i] at micro-batch k of each argument's window data. */
static void micro_args(const IrFunc *f, int k, double *const *data, double **args) {
  for (int i = 0; i < f->nargs; i++) {
    const IrValue *a = f->args[i];
    bool split = a->role == IR_ARG_INPUT && a->batched && a->type.shape.rank > 0;
    args[i] = data[i] ? data[i] + (split ? (int64_t)k * ir_numel(&a->type.shape) : 0) : NULL;
  }
}

bool step_window_needs(const IrFunc *f, bool *arg_needed) {
  bool *need = xcalloc((size_t)f->nvalues + 1, sizeof(bool));
  bool any = false;
  for (int i = f->nops - 1; i >= 0; i--) {
    const IrOp *op = f->ops[i];
    bool want = op->opcode == IR_OP_WINDOW_SUM || (op->result && need[op->result->id]);
    int ix = interp_index_operand(op);
    any |= op->opcode == IR_OP_WINDOW_SUM || ix >= 0;
    if (want)
      for (int j = 0; j < op->nargs; j++) need[op->args[j]->id] = true;
    if (ix >= 0) need[op->args[ix]->id] = true; /* the count phase checks index ranges */
  }
  for (int i = 0; i < f->nargs; i++) arg_needed[i] = need[f->args[i]->id];
  free(need);
  return any;
}

bool step_window_sums(const IrFunc *f, int gas, double *const *data, double **wsum, const InterpOptions *opt,
                      char *err, size_t errlen) {
  bool any = false, ok = true;
  for (int i = 0; i < f->nops; i++) {
    const IrOp *op = f->ops[i];
    any |= interp_index_operand(op) >= 0;
    if (op->opcode != IR_OP_WINDOW_SUM) continue;
    wsum[op->result->id] = xcalloc((size_t)ir_numel(&op->result->type.shape), sizeof(double));
    any = true;
  }
  double **args = xcalloc((size_t)f->nargs + 1, sizeof(double *));
  InterpState st = {0};
  for (int k = 0; ok && any && k < gas; k++) {
    micro_args(f, k, data, args);
    ok = interp_run(&st, f, args, NULL, INTERP_COUNT, opt, err, errlen);
    for (int i = 0; ok && i < f->nops; i++) {
      const IrOp *op = f->ops[i];
      if (op->opcode != IR_OP_WINDOW_SUM) continue;
      const double *v = st.val[op->args[0]->id];
      int64_t n = ir_numel(&op->result->type.shape);
      for (int64_t j = 0; j < n; j++) wsum[op->result->id][j] += v[j];
    }
    if (ok) interp_free(&st);
  }
  free(args);
  /* Data-parallel: the window is every rank's micro-batches. */
  return ok && step_dp_reduce_sums(f, wsum, err, errlen);
}

bool step_run_ref(const IrFunc *f, int gas, const StFile *params, const char *params_path, const StFile *inputs,
                  const char *inputs_path, const InterpOptions *opt, StepResult *out, char *err, size_t errlen) {
  static const InterpOptions defaults = {0};
  if (!opt) opt = &defaults;
  memset(out, 0, sizeof *out);
  int na = f->nargs, nv = f->nvalues;
  const StTensor **bound = xcalloc((size_t)na + 1, sizeof(StTensor *));
  double **data = xcalloc((size_t)na + 1, sizeof(double *));
  double **args = xcalloc((size_t)na + 1, sizeof(double *));
  double **wsum = xcalloc((size_t)nv + 1, sizeof(double *));
  InterpState st = {0};
  StepResult r = {0};
  bool ok = step_bind(f, gas, params, params_path, inputs, inputs_path, bound, err, errlen) &&
            step_result_init(f, &r, err, errlen);
  for (int i = 0; ok && i < na; i++) {
    int64_t n = st_numel(bound[i]);
    data[i] = xcalloc((size_t)n, sizeof(double));
    step_load(bound[i], 0, n, data[i]);
  }

  /* Phase 1: window sums over every micro-batch. */
  ok = ok && step_window_sums(f, gas, data, wsum, opt, err, errlen);

  /* Phase 2: the step, one micro-batch's activations alive at a time. */
  for (int k = 0; ok && k < gas; k++) {
    micro_args(f, k, data, args);
    ok = interp_run(&st, f, args, wsum, INTERP_STEP, opt, err, errlen);
    for (int i = 0; ok && i < f->nops; i++) {
      const IrOp *op = f->ops[i];
      if (op->opcode == IR_OP_LOSS) {
        const double *v = st.val[op->args[0]->id];
        int64_t n = ir_numel(&op->args[0]->type.shape);
        int j = step_loss_slot(&r, op);
        for (int64_t e = 0; e < n; e++) r.losses[j] += v[e];
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
