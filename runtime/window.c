/* window.c - what every executor does the same way in a window of K
 * micro-batches (DESIGN.md §3), written once for the reference
 * interpreter (ref/step.c), the CPU executor (cpu/exec.c) and the CUDA
 * executor (cuda/cuda_exec.c):
 *
 *   - binding: the params and inputs files checked against the function's
 *     arguments (by name, dtype and window shape), I64 targets range
 *     checked, this rank's samples and shards taken (comm_step.c);
 *   - the result: loss names in source order, one gradient per param,
 *     and the slots the losses and gradients are added into;
 *   - the window sums: the interpreter's count phase run over every
 *     micro-batch before the first one runs for real (the divisor of a
 *     batch mean, the count of non-ignored targets), added over the
 *     data-parallel ranks, and stored where an executor's program reads
 *     them; or, for an executor that takes a one-micro-batch window's
 *     sums from its own step, the index checks alone on the bound
 *     tensors (step_check_indices);
 *   - elements on the host: a tensor's elements as doubles, converted to
 *     an argument's dtype, and back (the bytes an arena holds);
 *   - the read-out: a loss's elements summed in order into its window
 *     loss, the gradient buffers read into the result after the window.
 *
 * Batched inputs arrive window-sized (K times the micro-batch on axis 0)
 * and are split into K contiguous micro-batches; other inputs and params
 * are passed whole to every micro-batch. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/comm/comm.h"
#include "runtime/gemm_plan.h"
#include "runtime/runtime.h"

/* ------------------------------------------------------------------ */
/* Checking and converting the tensors                                  */
/* ------------------------------------------------------------------ */

char *step_tensor_str(const StTensor *t, char *buf, size_t n) {
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
  if (step_arg_split(a)) t.shape.dim[0] *= (int64_t)gas * step_dp_size();
  return t;
}

/* The file an argument comes from: params and buffers (DESIGN.md §2,
 * language v2: buffers live in the params file), or inputs. */
static bool in_file(IrArgRole file, IrArgRole role) {
  return file == IR_ARG_INPUT ? role == IR_ARG_INPUT : role != IR_ARG_INPUT;
}

/* Check one file against the arguments of one role; fill bound[arg index]. */
static bool bind_file(const IrFunc *f, int gas, IrArgRole role, const StFile *file, const char *path,
                      const StTensor **bound, char *err, size_t errlen) {
  bool buffers = false;
  for (int i = 0; i < f->nargs; i++) buffers |= f->args[i]->role == IR_ARG_BUFFER;
  const char *what = role == IR_ARG_INPUT ? "input" : buffers ? "param or buffer" : "param";
  for (int i = 0; i < file->n; i++) {
    const IrValue *a = ir_func_find_arg(f, file->t[i].name);
    if (!a || !in_file(role, a->role))
      return errf(err, errlen, "%s: tensor '%s': not a%s %s of the model", path, file->t[i].name,
                  role == IR_ARG_INPUT ? "n" : "", what);
  }
  for (int i = 0; i < f->nargs; i++) {
    const IrValue *a = f->args[i];
    if (!in_file(role, a->role)) continue;
    const StTensor *t = st_find(file, a->name);
    if (!t) return errf(err, errlen, "%s: missing tensor '%s'", path, a->name);
    IrType want = window_type(a, gas);
    bool same = t->rank == want.shape.rank && dtype_accepted(want.dtype, t->dtype);
    for (int k = 0; same && k < t->rank; k++) same = t->shape[k] == want.shape.dim[k];
    if (!same) {
      char w[IR_TYPE_STR_MAX], g[IR_TYPE_STR_MAX];
      return errf(err, errlen, "%s: tensor '%s': expected %s, got %s", path, a->name, ir_type_str(&want, w, sizeof w),
                  step_tensor_str(t, g, sizeof g));
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
  for (int i = 0; i < r->noutputs; i++) free(r->outputs[i]);
  free(r->outputs);
  free(r->output_types);
  free(r->output_names);
  free(r->output_windows);
  free(r->update_windows);
  for (int i = 0; i < r->nupdates; i++) free(r->updates[i]);
  free(r->updates);
  free(r->update_types);
  free(r->update_names);
  memset(r, 0, sizeof *r);
}

static const char *output_name(const IrOp *op) { return ir_attr_get_str(op, "name", ""); }

bool step_result_init(const IrFunc *f, int gas, StepResult *out, char *err, size_t errlen) {
  int na = f->nargs;
  StepResult r = {0};
  memset(out, 0, sizeof *out);
  /* Outputs: losses by name in source order, one gradient per param. */
  r.loss_names = mem_calloc((size_t)f->nops, sizeof(char *));
  r.losses = mem_calloc((size_t)f->nops, sizeof(double));
  const IrOp **first = mem_calloc((size_t)f->nops + 1, sizeof(IrOp *));
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
  r.grad_names = mem_calloc((size_t)na, sizeof(char *));
  r.grad_types = mem_calloc((size_t)na, sizeof(IrType));
  r.grads = mem_calloc((size_t)na, sizeof(double *));
  for (int i = 0; i < na; i++) {
    const IrValue *a = f->args[i];
    if (a->role != IR_ARG_PARAM) continue;
    r.grad_names[r.ngrads] = a->name;
    r.grad_types[r.ngrads].dtype = a->type.dtype == IR_DT_F64 ? IR_DT_F64 : IR_DT_F32;
    r.grad_types[r.ngrads].shape = step_arg_type(a).shape; /* whole; a shard's driver fills the first part */
    r.grads[r.ngrads] = mem_calloc((size_t)ir_numel(&r.grad_types[r.ngrads].shape), sizeof(double));
    r.ngrads++;
  }
  /* Language v2: outputs and updates, one value per name, in program order
   * (the frontend emits them in statement order; passes keep it). */
  r.output_names = mem_calloc((size_t)f->nops + 1, sizeof(char *));
  r.output_types = mem_calloc((size_t)f->nops + 1, sizeof(IrType));
  r.outputs = mem_calloc((size_t)f->nops + 1, sizeof(double *));
  r.update_names = mem_calloc((size_t)f->nops + 1, sizeof(char *));
  r.output_windows = mem_calloc((size_t)f->nops + 1, sizeof(char *));
  r.update_windows = mem_calloc((size_t)f->nops + 1, sizeof(char *));
  r.update_types = mem_calloc((size_t)f->nops + 1, sizeof(IrType));
  r.updates = mem_calloc((size_t)f->nops + 1, sizeof(double *));
  bool ok = true;
  for (int i = 0; i < f->nops; i++) {
    const IrOp *op = f->ops[i];
    if (op->opcode != IR_OP_OUTPUT && op->opcode != IR_OP_UPDATE) continue;
    bool upd = op->opcode == IR_OP_UPDATE;
    int *n = upd ? &r.nupdates : &r.noutputs;
    const char **names = upd ? r.update_names : r.output_names;
    bool seen = false;
    for (int j = 0; j < *n && !seen; j++) seen = strcmp(names[j], output_name(op)) == 0;
    if (seen) continue;
    IrType t = op->args[0]->type;
    if (upd) {
      const IrValue *b = ir_func_find_arg(f, output_name(op));
      if (!b || b->role != IR_ARG_BUFFER || !ir_type_eq(&b->type, &t)) {
        ok = errf(err, errlen, "update names '%s', which is not a buffer of its type", output_name(op));
        break;
      }
    }
    if (strcmp(ir_attr_get_str(op, "window", "once"), "concat") == 0)
      t.shape.dim[0] *= (int64_t)gas * step_dp_size();
    names[*n] = output_name(op);
    (upd ? r.update_windows : r.output_windows)[*n] = ir_attr_get_str(op, "window", "once");
    (upd ? r.update_types : r.output_types)[*n] = t;
    (upd ? r.updates : r.outputs)[*n] = mem_calloc((size_t)ir_numel(&t.shape) + 1, sizeof(double));
    (*n)++;
  }
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

bool step_arg_split(const IrValue *a) { return a->role == IR_ARG_INPUT && a->batched && a->type.shape.rank > 0; }

/* Point args[i] at micro-batch k of each argument's window data. */
void step_micro_args(const IrFunc *f, int k, double *const *data, double **args) {
  for (int i = 0; i < f->nargs; i++) {
    const IrValue *a = f->args[i];
    args[i] = data[i] ? data[i] + (step_arg_split(a) ? (int64_t)k * ir_numel(&a->type.shape) : 0) : NULL;
  }
}

bool step_window_sums(const IrFunc *f, int gas, double *const *data, double **wsum, const InterpOptions *opt,
                      char *err, size_t errlen) {
  InterpOptions o = opt ? *opt : (InterpOptions){0};
  InterpCountPlan *own = o.count ? NULL : interp_count_plan_new(f);
  if (own) o.count = own;
  const InterpCountPlan *plan = o.count;
  for (int i = 0; i < plan->nsums; i++) {
    const IrValue *r = plan->sums[i]->result;
    wsum[r->id] = mem_calloc((size_t)ir_numel(&r->type.shape), sizeof(double));
  }
  bool ok = true;
  double **args = mem_calloc((size_t)f->nargs + 1, sizeof(double *));
  InterpState st = {0};
  for (int k = 0; ok && (plan->nsums || plan->nchecks) && k < gas; k++) {
    step_micro_args(f, k, data, args);
    ok = interp_run(&st, f, args, NULL, INTERP_COUNT, &o, err, errlen);
    for (int i = 0; ok && i < plan->nsums; i++) {
      const IrOp *op = plan->sums[i];
      const double *v = st.val[op->args[0]->id];
      int64_t n = ir_numel(&op->result->type.shape);
      for (int64_t j = 0; j < n; j++) wsum[op->result->id][j] += v[j];
    }
    if (ok) interp_free(&st);
  }
  free(args);
  /* Data-parallel: the window is every rank's micro-batches. */
  ok = ok && step_dp_reduce_sums(plan, wsum, err, errlen);
  interp_count_plan_free(own);
  return ok;
}


/* ------------------------------------------------------------------ */
/* Random draws                                                         */
/* ------------------------------------------------------------------ */

/* The calling thread's draws, as the window in progress is (comm_step.c). */
static _Thread_local uint64_t draw_seed, draw_step;

void step_set_draws(uint64_t seed, uint64_t step) {
  draw_seed = seed;
  draw_step = step;
}

/* Samples per micro-batch: a batched input's first axis (0 without one:
 * then no draw is batched, ir_random_batched). */
static int64_t micro_samples(const IrFunc *f) {
  for (int i = 0; i < f->nargs; i++) {
    const IrValue *a = f->args[i];
    if (step_arg_split(a)) return a->type.shape.dim[0];
  }
  return 0;
}

void step_rng_words(const IrFunc *f, int gas, int k, uint32_t out[IR_RNG_WORDS]) {
  int64_t first = ((int64_t)step_dp_rank() * gas + k) * micro_samples(f);
  out[0] = (uint32_t)draw_seed;
  out[1] = (uint32_t)(draw_seed >> 32);
  out[2] = (uint32_t)draw_step;
  out[3] = (uint32_t)first;
}

static _Thread_local double loss_scale = 1.0;

void step_set_loss_scale(double s) { loss_scale = s; }

double step_loss_scale(void) { return loss_scale; }

bool step_inject_inf(void) {
  const char *e = getenv("GRADC_TEST_INF_STEP");
  if (!e || !*e) return false;
  long long n = -1, rank = -1;
  int got = sscanf(e, "%lld:%lld", &n, &rank);
  return got >= 1 && n >= 0 && (uint64_t)n == draw_step && (got < 2 || rank == step_dp_rank());
}

bool step_has_rng(const IrFunc *f) {
  for (int i = 0; i < f->nops; i++)
    if (f->ops[i]->opcode == IR_OP_RNG_STATE) return true;
  return false;
}

/* ------------------------------------------------------------------ */
/* Elements on the host                                                 */
/* ------------------------------------------------------------------ */

/* x rounded to f16 (ir_round_dtype) and packed into its bits. */
static uint16_t f16_encode(double x) {
  x = ir_round_dtype(x, IR_DT_F16);
  uint16_t sign = signbit(x) ? 0x8000 : 0;
  double a = fabs(x);
  if (isnan(x)) return 0x7e00;
  if (isinf(a)) return sign | 0x7c00;
  if (a == 0) return sign;
  int e;
  frexp(a, &e); /* a = m * 2^e, 0.5 <= m < 1 */
  if (e - 1 < -14) return sign | (uint16_t)ldexp(a, 24); /* subnormal: a / 2^-24 */
  uint16_t man = (uint16_t)(ldexp(a, 11 - e) - 1024);   /* 10 fraction bits */
  return sign | (uint16_t)((e - 1 + 15) << 10) | man;
}

static uint16_t bf16_encode(double x) {
  float f = (float)ir_round_dtype(x, IR_DT_BF16);
  uint32_t u;
  memcpy(&u, &f, 4);
  if (isnan(f)) return 0x7fc0;
  return (uint16_t)(u >> 16);
}

static float bf16_decode(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

double rt_elem_get(const void *p, IrDType dt, int64_t i) {
  switch (dt) {
  case IR_DT_F32: return ((const float *)p)[i];
  case IR_DT_F64: return ((const double *)p)[i];
  case IR_DT_BF16: return bf16_decode(((const uint16_t *)p)[i]);
  case IR_DT_F16: return half_to_double(((const uint16_t *)p)[i]);
  case IR_DT_I32: return ((const int32_t *)p)[i];
  case IR_DT_BOOL: return ((const uint8_t *)p)[i] != 0;
  }
  return 0;
}

/* Groups of 8 between restrict parameters vectorise at -O2: GCC honours
 * restrict on parameters, not on local pointers, and leaves a loop of
 * unknown length scalar (the gradients' widening out of the arena, such a
 * loop, was 4% of tinygpt small's training). */
void rt_widen_f32(double *restrict y, const float *restrict x, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; j++) y[i + j] = x[i + j];
  for (; i < n; i++) y[i] = x[i];
}

void rt_elems_get(const void *p, IrDType dt, int64_t n, double *dst) {
  if (dt == IR_DT_F32) {
    rt_widen_f32(dst, p, n);
  } else if (dt == IR_DT_F64) {
    memcpy(dst, p, sizeof(double) * (size_t)n);
  } else {
    for (int64_t i = 0; i < n; i++) dst[i] = rt_elem_get(p, dt, i);
  }
}

void rt_elem_set(void *p, IrDType dt, int64_t i, double x) {
  switch (dt) {
  case IR_DT_F32: ((float *)p)[i] = (float)x; break;
  case IR_DT_F64: ((double *)p)[i] = x; break;
  case IR_DT_BF16: ((uint16_t *)p)[i] = bf16_encode(x); break;
  case IR_DT_F16: ((uint16_t *)p)[i] = f16_encode(x); break;
  case IR_DT_I32: ((int32_t *)p)[i] = (int32_t)x; break;
  case IR_DT_BOOL: ((uint8_t *)p)[i] = x != 0; break;
  }
}

bool rt_tensor_plain(const StTensor *t, IrDType dt, int64_t *es) {
  *es = (t->dtype == ST_F32 && dt == IR_DT_F32) || (t->dtype == ST_I32 && dt == IR_DT_I32) ? 4
        : t->dtype == ST_F64 && dt == IR_DT_F64                                             ? 8
                                                                                            : 0;
  return *es > 0; /* little-endian host */
}

void rt_tensor_convert(const StTensor *t, int64_t begin, int64_t n, IrDType dt, void *dst) {
  int64_t es;
  if (rt_tensor_plain(t, dt, &es)) {
    memcpy(dst, (const char *)t->data + es * begin, (size_t)(es * n));
    return;
  }
  /* The master weights of a bf16/f16 model, every window: f32 to the
   * low type in one loop (the same bits as through double, for f32). */
  if (t->dtype == ST_F32 && (dt == IR_DT_BF16 || dt == IR_DT_F16)) {
    const float *s = (const float *)t->data + begin;
    uint16_t *d = dst;
    if (dt == IR_DT_BF16)
      for (int64_t i = 0; i < n; i++) d[i] = ir_f32_to_bf16(s[i]);
    else
      for (int64_t i = 0; i < n; i++) d[i] = ir_f32_to_f16(s[i]);
    return;
  }
  double buf[1024];
  for (int64_t k = 0; k < n; k += 1024) {
    int64_t m = n - k < 1024 ? n - k : 1024;
    step_load(t, begin + k, m, buf);
    for (int64_t i = 0; i < m; i++) rt_elem_set(dst, dt, k + i, buf[i]);
  }
}

/* ------------------------------------------------------------------ */
/* What an executor's arena gets and gives back                         */
/* ------------------------------------------------------------------ */

/* n values v[i] (or v[0] for all, when same) as dtype dt at an arena offset. */
static bool store_values(int64_t offset, IrDType dt, int64_t n, const double *v, bool same, StepStoreFn store,
                         void *ctx, char *err, size_t errlen) {
  if (n == 0) return true;
  char *buf = mem_calloc((size_t)n, ir_dtype_size(dt));
  for (int64_t k = 0; k < n; k++) rt_elem_set(buf, dt, k, v[same ? 0 : k]);
  bool ok = store(ctx, offset, buf, (size_t)n * ir_dtype_size(dt), err, errlen);
  free(buf);
  return ok;
}

bool step_store_consts(const IrFunc *f, StepStoreFn store, void *ctx, char *err, size_t errlen) {
  for (int i = 0; i < f->nops; i++) {
    const IrOp *op = f->ops[i];
    if (op->opcode != IR_OP_CONST || op->group != 0 || op->result->storage != IR_STORE_ARENA) continue;
    double v = ir_attr_get_float(op, "value", 0.0);
    if (!store_values(op->result->offset, op->result->type.dtype, ir_numel(&op->result->type.shape), &v, true, store,
                      ctx, err, errlen))
      return false;
  }
  return true;
}

bool step_store_window_sums(const IrFunc *f, const InterpCountPlan *count, int gas, const StTensor *const *bound,
                            StepStoreFn store, void *ctx, char *err, size_t errlen) {
  if (!count->nsums && !count->nchecks) return true;
  double **data = mem_calloc((size_t)f->nargs + 1, sizeof(double *));
  double **wsum = mem_calloc((size_t)f->nvalues + 1, sizeof(double *));
  for (int i = 0; i < f->nargs; i++) {
    if (!count->arg_needed[i]) continue;
    int64_t n = st_numel(bound[i]);
    data[i] = mem_calloc((size_t)n, sizeof(double));
    step_load(bound[i], 0, n, data[i]);
  }
  InterpOptions o = {.count = count};
  bool ok = step_window_sums(f, gas, data, wsum, &o, err, errlen);
  for (int i = 0; ok && store && i < count->nsums; i++) {
    const IrValue *r = count->sums[i]->result;
    if (r->storage == IR_STORE_NONE) continue;
    ok = store_values(r->offset, r->type.dtype, ir_numel(&r->type.shape), wsum[r->id], false, store, ctx, err,
                      errlen);
  }
  for (int i = 0; i < f->nargs; i++) free(data[i]);
  for (int i = 0; i < count->nsums; i++) free(wsum[count->sums[i]->result->id]);
  free(data);
  free(wsum);
  return ok;
}

bool step_check_indices(const IrFunc *f, const InterpCountPlan *count, int gas, const StTensor *const *bound,
                        char *err, size_t errlen) {
  /* An index operand computed by ops (not an argument) needs the interpreter. */
  for (int i = 0; i < count->nchecks; i++)
    if (count->checks[i]->args[interp_index_operand(count->checks[i])]->def)
      return step_store_window_sums(f, count, gas, bound, NULL, NULL, err, errlen);
  double buf[512];
  for (int i = 0; i < count->nchecks; i++) {
    const IrOp *op = count->checks[i];
    const IrValue *x = op->args[interp_index_operand(op)];
    int a = 0;
    while (f->args[a] != x) a++;
    /* Micro-batch by micro-batch, as the interpreter numbers elements. */
    bool split = step_arg_split(x);
    int64_t n = ir_numel(&x->type.shape);
    for (int k = 0; k < (split ? gas : 1); k++)
      for (int64_t at = 0; at < n; at += 512) {
        int64_t m = n - at < 512 ? n - at : 512;
        step_load(bound[a], (split ? (int64_t)k * n : 0) + at, m, buf);
        ir_round_dtype_n(buf, m, x->type.dtype);
        if (!interp_check_indices(op, buf, m, at, err, errlen)) return false;
      }
  }
  return true;
}

bool step_store_rng(const IrFunc *f, int gas, int k, StepStoreFn store, void *ctx, char *err, size_t errlen) {
  uint32_t w[IR_RNG_WORDS];
  step_rng_words(f, gas, k, w);
  float s = (float)loss_scale;
  for (int i = 0; i < f->nops; i++) {
    const IrOp *op = f->ops[i];
    if (op->opcode == IR_OP_LOSS_SCALE && op->result->storage != IR_STORE_NONE) {
      if (!store(ctx, op->result->offset, &s, sizeof s, err, errlen)) return false;
      continue;
    }
    if (op->opcode != IR_OP_RNG_STATE || op->result->storage == IR_STORE_NONE) continue;
    if (!store(ctx, op->result->offset, w, sizeof w, err, errlen)) return false;
  }
  return true;
}

StepGradBuf *step_grad_bufs(const IrFunc *f, int *n) {
  StepGradBuf *g = mem_calloc((size_t)f->nargs + 1, sizeof(StepGradBuf));
  int slot = 0;
  *n = 0;
  for (int i = 0; i < f->nargs; i++) {
    const IrValue *a = f->args[i];
    if (a->role != IR_ARG_PARAM) continue;
    for (int k = 0; k < f->nops; k++) {
      const IrOp *op = f->ops[k];
      if (op->opcode != IR_OP_GRAD || !a->name || strcmp(output_name(op), a->name) != 0) continue;
      g[(*n)++] = (StepGradBuf){i, slot, rt_storage_root(op->args[0])->offset, ir_numel(&a->type.shape),
                                a->type.dtype == IR_DT_F64 ? IR_DT_F64 : IR_DT_F32};
      break;
    }
    slot++; /* step_result_init: one gradient per param, in argument order */
  }
  return g;
}

void step_add_loss(StepResult *r, const IrOp *loss, const void *elems, IrDType dt, int64_t n) {
  double s = 0;
  for (int64_t e = 0; e < n; e++) s += rt_elem_get(elems, dt, e);
  r->losses[step_loss_slot(r, loss)] += s;
}

/* ------------------------------------------------------------------ */
/* Outputs and buffer updates (language v2)                             */
/* ------------------------------------------------------------------ */

int step_output_slot(const StepResult *r, const IrOp *op) {
  bool upd = op->opcode == IR_OP_UPDATE;
  int n = upd ? r->nupdates : r->noutputs;
  for (int j = 0; j < n; j++)
    if (strcmp((upd ? r->update_names : r->output_names)[j], output_name(op)) == 0) return j;
  return -1;
}

void step_add_state(StepResult *r, const IrOp *op, int k, int gas, const void *elems, IrDType dt, int64_t n) {
  int j = step_output_slot(r, op);
  GRADC_ASSERT(j >= 0);
  bool upd = op->opcode == IR_OP_UPDATE;
  double *dst = (upd ? r->updates : r->outputs)[j];
  IrDType odt = (upd ? r->update_types : r->output_types)[j].dtype;
  const char *w = ir_attr_get_str(op, "window", "once");
  if (strcmp(w, "concat") == 0) {
    /* This rank's samples follow the ranks before it; zeros elsewhere, so
     * step_dp_end's sum over the ranks gathers them. */
    rt_elems_get(elems, dt, n, dst + ((int64_t)step_dp_rank() * gas + k) * n);
  } else if (strcmp(w, "sum") == 0) {
    for (int64_t e = 0; e < n; e++) dst[e] = ir_round_dtype(dst[e] + rt_elem_get(elems, dt, e), odt);
  } else if (k == gas - 1) {
    rt_elems_get(elems, dt, n, dst);
  }
}

void step_result_zero_state(StepResult *r) {
  for (int i = 0; i < r->noutputs; i++)
    memset(r->outputs[i], 0, sizeof(double) * (size_t)ir_numel(&r->output_types[i].shape));
  for (int i = 0; i < r->nupdates; i++)
    memset(r->updates[i], 0, sizeof(double) * (size_t)ir_numel(&r->update_types[i].shape));
}
