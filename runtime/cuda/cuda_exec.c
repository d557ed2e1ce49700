/* cuda_exec.c - the CUDA executor (docs/BACKEND.md): runs one window of a
 * function after the CPU pipeline (fuse, memplan) on device 0, in one
 * arena of device memory laid out as the memory plan says.
 *
 * cuda_program_new generates the kernels (codegen/cuda.c) and compiles
 * them with NVRTC; that needs no device.  The first step sets the device
 * up: the arena (cuMemAlloc, once), the compiled modules (cubin, the PTX
 * when the cubin does not fit the device), the consts group-0 ops read,
 * the GEMMs (cuBLASLt) and the micro-batch's launch list in op order:
 *
 *   kernel   cuLaunchKernel with the pointers of its buffers
 *   gemm     cublasLtMatmul (beta = 1 into gradient buffers)
 *   copy     a collective on one rank
 *
 * A window: zero the gradient buffers, copy params (converted to their
 * dtypes) and unbatched inputs in, evaluate window sums on the host (the
 * interpreter's count phase, as the CPU executor) and copy them in; then
 * per micro-batch copy its inputs in, run the launch list on the stream
 * (the second micro-batch onwards replays a CUDA graph captured from it),
 * and read the losses back.  The gradients are read out at the end.
 * Artifacts carry the compiled images (cubin and PTX per chunk).
 * What the window shares with the other executors (binding, window sums,
 * consts, the read-out) is window.c's; rt_backend_cuda, at the end, is
 * the executor as a back end (backend.h). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "cuda.h"
#include "passes/passes.h"
#include "runtime/backend.h"
#include "runtime/cpu/gemm_floor.h"
#include "runtime/gemm_plan.h"

typedef enum { L_KERNEL, L_GEMM, L_COPY } LaunchKind;

typedef struct Launch {
  LaunchKind kind;
  const IrOp *op;
  int idx;             /* kernel (index into the module's kernels) or GEMM */
  CUdeviceptr *ptrs;   /* L_KERNEL: its pointer arguments */
  void **args;         /* &ptrs[i] */
  int64_t src, dst;    /* L_COPY: arena offsets */
  size_t bytes;
} Launch;

typedef struct Loss {
  const IrOp *op;
  int64_t offset, numel;
  IrDType dt;
} Loss;

struct CudaProgram {
  IrFunc *f;
  CuModule *m;
  KpViews views; /* what GEMMs read and write in place (codegen/kernel.c) */
  bool allow_tf32;
  /* The device, set up by the first step. */
  const CudaDriver *d;
  bool ready;      /* device resources may exist (cuda_program_free releases them) */
  int setup;       /* 0: not tried, 1: done, -1: failed (setup_err says why) */
  char setup_err[512];
  CUdeviceptr arena;
  CUstream stream;
  CUmodule *mods;
  CUfunction *fns; /* per code */
  CudaGemm *gemms;
  int ngemms;
  Launch *code;
  int ncode;
  Loss *losses;
  int nlosses;
  Loss *states; /* `output` and `update` operands, read after each micro-batch */
  int nstates;
  StepGradBuf *grads;
  int ngrads;
  InterpCountPlan *count; /* the window's count phase (window sums, index checks) */
  CUgraphExec graph;
  bool use_graph;
  int64_t runs; /* micro-batches run */
};

/* ------------------------------------------------------------------ */
/* Elements on the host                                                */
/* ------------------------------------------------------------------ */

/* Elements [begin, begin + n) of a bound tensor, as dt, into the arena at offset. */
static bool copy_in(CudaProgram *p, const StTensor *t, int64_t begin, int64_t n, IrDType dt, int64_t offset, char *err,
                    size_t errlen) {
  size_t es = ir_dtype_size(dt);
  char *buf = mem_calloc((size_t)n, es);
  rt_tensor_convert(t, begin, n, dt, buf);
  bool ok = n == 0 || cuda_check(p->d->MemcpyHtoD(p->arena + (CUdeviceptr)offset, buf, (size_t)n * es),
                                 "copying to the device", err, errlen);
  free(buf);
  return ok;
}

/* ------------------------------------------------------------------ */
/* Building the program                                                */
/* ------------------------------------------------------------------ */

const CuModule *cuda_program_module(const CudaProgram *p) { return p->m; }

void cuda_program_allow_tf32(CudaProgram *p, bool on) { p->allow_tf32 = on; }

static bool build_code(CudaProgram *p, char *err, size_t errlen);

static bool in_group0(const IrOp *op, void *ctx) {
  (void)ctx;
  return op->group == 0;
}

static CudaProgram *program_alloc(IrFunc *f, const CudaOptions *o, char *err, size_t errlen) {
  bool planned = f->arena_size > 0;
  for (int i = 0; i < f->nargs && planned; i++) planned = f->args[i]->storage == IR_STORE_ARENA;
  if (!planned && (f->nargs > 0 || f->nops > 0)) {
    errf(err, errlen, "function '%s' has no memory plan (run memplan)", f->name);
    return NULL;
  }
  CudaProgram *p = mem_calloc(1, sizeof *p);
  p->f = f;
  p->allow_tf32 = o && o->allow_tf32;
  const char *g = getenv("GRADC_CUDA_GRAPHS");
  p->use_graph = !(g && strcmp(g, "0") == 0);
  p->m = cg_cuda_generate(f, err, errlen);
  if (!p->m) {
    free(p);
    return NULL;
  }
  kp_views_find(f, in_group0, NULL, &p->views);
  if (!build_code(p, err, errlen)) {
    cuda_program_free(p);
    return NULL;
  }
  return p;
}

CudaProgram *cuda_program_plan(IrFunc *f, const CudaOptions *o, char *err, size_t errlen) {
  return program_alloc(f, o, err, errlen);
}

CudaProgram *cuda_program_new(IrFunc *f, const CudaOptions *o, char *err, size_t errlen) {
  static const CudaOptions defaults = {0};
  if (!o) o = &defaults;
  CudaProgram *p = program_alloc(f, o, err, errlen);
  if (!p) return NULL;
  char arch[32];
  if (o->arch && *o->arch)
    snprintf(arch, sizeof arch, "%s", o->arch);
  else if (!cuda_device_arch(arch, sizeof arch))
    snprintf(arch, sizeof arch, "%s", CG_CUDA_DEFAULT_ARCH);
  CuCompileOptions co = {arch, o->cache_dir, o->threads};
  if (!cg_cuda_compile(p->m, &co, err, errlen)) {
    cuda_program_free(p);
    return NULL;
  }
  return p;
}

void cuda_program_free(CudaProgram *p) {
  if (!p) return;
  const CudaDriver *d = p->ready ? p->d : NULL;
  if (d) {
    if (p->graph) d->GraphExecDestroy(p->graph);
    for (int i = 0; p->mods && i < p->m->nchunks; i++)
      if (p->mods[i]) d->ModuleUnload(p->mods[i]);
    if (p->stream) d->StreamDestroy(p->stream);
    if (p->arena) d->MemFree(p->arena);
  }
  if (p->gemms) cuda_gemm_free(p->gemms, p->ngemms > 0 ? p->ngemms : 1);
  for (int i = 0; i < p->ncode; i++) {
    free(p->code[i].ptrs);
    free(p->code[i].args);
  }
  free(p->code);
  free(p->mods);
  free(p->fns);
  free(p->losses);
  free(p->states);
  free(p->grads);
  interp_count_plan_free(p->count);
  kp_views_free(&p->views);
  cg_cuda_free(p->m);
  free(p);
}

/* Load every chunk: its cubin, or its PTX (JIT-compiled by the driver)
 * when the cubin was built for another architecture. */
static bool load_modules(CudaProgram *p, char *err, size_t errlen) {
  const CudaDriver *d = p->d;
  CuModule *m = p->m;
  p->mods = mem_calloc((size_t)m->nchunks, sizeof(CUmodule));
  p->fns = mem_calloc((size_t)m->ncodes, sizeof(CUfunction));
  for (int c = 0; c < m->nchunks; c++) {
    CUresult r = d->ModuleLoadData(&p->mods[c], m->images[c].cubin);
    if (r != 0) r = d->ModuleLoadData(&p->mods[c], m->images[c].ptx);
    if (r != 0) {
      char arch[32] = "?";
      cuda_device_arch(arch, sizeof arch);
      char what[128];
      snprintf(what, sizeof what, "loading kernels compiled for %s on a %s device", m->arch, arch);
      return cuda_check(r, what, err, errlen);
    }
  }
  for (int c = 0; c < m->ncodes; c++)
    if (!cuda_check(d->ModuleGetFunction(&p->fns[c], p->mods[m->codes[c].chunk], m->codes[c].func),
                    m->codes[c].func, err, errlen))
      return false;
  return true;
}

static size_t elem_size(const CuParam *q) {
  if (q->grad) return q->v->type.dtype == IR_DT_F64 ? 8 : 4;
  return ir_dtype_size(q->v->type.dtype);
}

/* The launch list of one micro-batch, in op order (kernels' pointers and
 * GEMMs are resolved when the device is set up), the losses, the
 * gradient buffers: checked when the program is made, without a device. */
static bool build_code(CudaProgram *p, char *err, size_t errlen) {
  const IrFunc *f = p->f;
  p->code = mem_calloc((size_t)f->nops + 1, sizeof(Launch));
  p->losses = mem_calloc((size_t)f->nops + 1, sizeof(Loss));
  p->states = mem_calloc((size_t)f->nops + 1, sizeof(Loss));
  int gemm = 0;
  for (int i = 0; i < f->nops; i++) {
    const IrOp *op = f->ops[i];
    IrOpcode opc = op->opcode;
    if (op->group > 0) {
      if (i > 0 && f->ops[i - 1]->group == op->group) continue;
      const CuKernel *k = cg_cuda_kernel(p->m, op->group);
      if (!k) return rt_op_fail(err, errlen, op, "is in a kernel the code generator did not produce");
      Launch *l = &p->code[p->ncode++];
      l->kind = L_KERNEL;
      l->idx = (int)(k - p->m->kernels);
      l->ptrs = mem_calloc((size_t)k->nparams, sizeof(CUdeviceptr));
      l->args = mem_calloc((size_t)k->nparams, sizeof(void *));
      continue;
    }
    if (opc == IR_OP_MATMUL) {
      CudaGemmDesc d; /* what cuBLASLt will be asked, checked now */
      bool ok = cuda_gemm_describe(&p->views, op, p->allow_tf32, &d, err, errlen);
      cuda_gemm_desc_free(&d);
      if (!ok) return false;
      p->code[p->ncode++] = (Launch){.kind = L_GEMM, .op = op, .idx = gemm++};
      continue;
    }
    /* Views GEMMs read or write in place; aliases (reshapes, range slices);
     * a range unslice, whose operand accumulates into its range of the
     * gradient buffer (memplan): no work of their own. */
    if ((opc == IR_OP_PERMUTE || opc == IR_OP_RESHAPE || opc == IR_OP_SLICE || opc == IR_OP_CONCAT) &&
        kp_view_free_op(&p->views, op))
      continue;
    if (opc == IR_OP_RESHAPE || opc == IR_OP_SLICE) {
      if (op->result->storage != IR_STORE_NONE && op->result->storage != IR_STORE_ALIAS)
        return rt_op_fail(err, errlen, op, "must alias its operand (run memplan)");
      continue;
    }
    if (opc == IR_OP_UNSLICE) {
      if (op->result->storage != IR_STORE_GRAD || rt_storage_root(op->args[0])->storage != IR_STORE_GRAD)
        return rt_op_fail(err, errlen, op, "is not in a kernel and not a range of a gradient buffer (run memplan)");
      continue;
    }
    if (opc == IR_OP_CONST || opc == IR_OP_WINDOW_SUM || opc == IR_OP_RNG_STATE || opc == IR_OP_LOSS_SCALE ||
        opc == IR_OP_GRAD)
      continue;
    if (opc == IR_OP_PERMUTE && rt_is_flag_permute(op->result)) continue;
    if (opc == IR_OP_LOSS) {
      const IrValue *v = rt_storage_root(op->args[0]);
      if (v->storage == IR_STORE_NONE) return rt_op_fail(err, errlen, op, "reads a value without storage (run memplan)");
      p->losses[p->nlosses++] = (Loss){op, v->offset, ir_numel(&v->type.shape), op->args[0]->type.dtype};
      continue;
    }
    if (opc == IR_OP_OUTPUT || opc == IR_OP_UPDATE) { /* memplan keeps the operand to the step's end */
      const IrValue *v = rt_storage_root(op->args[0]);
      if (v->storage == IR_STORE_NONE) return rt_op_fail(err, errlen, op, "reads a value without storage (run memplan)");
      p->states[p->nstates++] = (Loss){op, v->offset, ir_numel(&v->type.shape), op->args[0]->type.dtype};
      continue;
    }
    if (opc == IR_OP_TP_SCATTER || opc == IR_OP_RANK_SLICE || opc == IR_OP_RANK_CONCAT)
      return rt_op_fail(err, errlen, op, "needs a distributed runtime");
    if (opc == IR_OP_ALL_REDUCE_START || opc == IR_OP_ALL_REDUCE_WAIT || opc == IR_OP_ALL_GATHER_START ||
        opc == IR_OP_ALL_GATHER_WAIT || opc == IR_OP_REDUCE_SCATTER_START || opc == IR_OP_REDUCE_SCATTER_WAIT ||
        opc == IR_OP_TP_COPY) {
      if (opc != IR_OP_TP_COPY && ir_attr_get_int(op, "ranks", 1) > 1) return rt_op_fail(err, errlen, op, "needs a distributed runtime");
      const IrValue *s = rt_storage_root(op->args[0]), *dv = rt_storage_root(op->result);
      if (s->storage == IR_STORE_NONE || dv->storage == IR_STORE_NONE)
        return rt_op_fail(err, errlen, op, "has an operand or result without storage (run memplan)");
      size_t bytes = (size_t)ir_numel(&op->result->type.shape) * ir_dtype_size(op->result->type.dtype);
      if (s->offset != dv->offset)
        p->code[p->ncode++] = (Launch){.kind = L_COPY, .src = s->offset, .dst = dv->offset, .bytes = bytes};
      continue;
    }
    return rt_op_fail(err, errlen, op, "is not in a kernel (the CUDA target runs fuse before memplan)");
  }
  p->grads = step_grad_bufs(f, &p->ngrads);
  p->count = interp_count_plan_new(f);
  return true;
}

/* The kernels' pointers into the device's arena; the GEMMs as planned. */
static bool bind_code(CudaProgram *p, char *err, size_t errlen) {
  for (int i = 0; i < p->ncode; i++) {
    Launch *l = &p->code[i];
    if (l->kind == L_GEMM) {
      if (l->idx >= p->ngemms || cuda_gemm_op(p->gemms, l->idx) != l->op)
        return errf(err, errlen, "the GEMM plan does not match the program");
      continue;
    }
    if (l->kind != L_KERNEL) continue;
    const CuKernel *k = &p->m->kernels[l->idx];
    for (int a = 0; a < k->nparams; a++) {
      const CuParam *q = &k->params[a];
      l->ptrs[a] = p->arena + (CUdeviceptr)q->v->offset + (CUdeviceptr)((size_t)q->elem * elem_size(q));
      l->args[a] = &l->ptrs[a];
    }
  }
  return true;
}

/* Bytes into the device's arena (consts, window sums). */
static bool store(void *ctx, int64_t offset, const void *src, size_t n, char *err, size_t errlen) {
  CudaProgram *p = ctx;
  return cuda_check(p->d->MemcpyHtoD(p->arena + (CUdeviceptr)offset, src, n), "copying to the device", err, errlen);
}

/* The first step's setup: device, arena, modules, GEMMs, launch list. */
static bool setup_once(CudaProgram *p, char *err, size_t errlen) {
  p->d = cuda_driver(err, errlen);
  if (!p->d) return false;
  const CudaDriver *d = p->d;
  p->ready = true; /* from here on, cuda_program_free releases what exists */
  size_t bytes = (size_t)(p->f->arena_size > 0 ? p->f->arena_size : 64);
  if (!cuda_check(d->MemAlloc(&p->arena, bytes), "allocating the arena", err, errlen) ||
      !cuda_check(d->MemsetD8(p->arena, 0, bytes), "clearing the arena", err, errlen) ||
      !cuda_check(d->StreamCreate(&p->stream, 0), "creating a stream", err, errlen) || !load_modules(p, err, errlen))
    return false;
  p->gemms = cuda_gemm_plan(p->f, &p->views, p->arena, p->allow_tf32, &p->ngemms, err, errlen);
  if (!p->gemms) return false;
  return bind_code(p, err, errlen) && step_store_consts(p->f, store, p, err, errlen);
}

/* The first step's setup; a failed one fails every later step the same way. */
static bool device_setup(CudaProgram *p, char *err, size_t errlen) {
  if (p->setup == 0) {
    p->setup = setup_once(p, p->setup_err, sizeof p->setup_err) ? 1 : -1;
  }
  if (p->setup < 0 && err && errlen) snprintf(err, errlen, "%s", p->setup_err);
  return p->setup > 0;
}

/* ------------------------------------------------------------------ */
/* Running                                                             */
/* ------------------------------------------------------------------ */

static bool enqueue(CudaProgram *p, char *err, size_t errlen) {
  const CudaDriver *d = p->d;
  for (int i = 0; i < p->ncode; i++) {
    Launch *l = &p->code[i];
    if (l->kind == L_GEMM) {
      if (!cuda_gemm_run(p->gemms, l->idx, p->stream, err, errlen)) return false;
    } else if (l->kind == L_COPY) {
      if (!cuda_check(d->MemcpyDtoDAsync(l->dst, l->src, l->bytes, p->stream), "copying", err, errlen)) return false;
    } else {
      const CuKernel *k = &p->m->kernels[l->idx];
      if (k->grid <= 0) continue;
      CUresult r = d->LaunchKernel(p->fns[k->code], (unsigned)k->grid, 1, 1, k->block[0], k->block[1], 1, 0, p->stream,
                                   l->args, NULL);
      if (!cuda_check(r, k->name, err, errlen)) return false;
    }
  }
  return true;
}

enum { CAPTURE_THREAD_LOCAL = 1 };

/* One micro-batch: the launch list, or its CUDA graph (captured on the
 * second micro-batch, after cuBLASLt has loaded what it needs). */
static bool run_micro_batch(CudaProgram *p, char *err, size_t errlen) {
  const CudaDriver *d = p->d;
  if (p->graph) return cuda_check(d->GraphLaunch(p->graph, p->stream), "launching the step's graph", err, errlen);
  if (!p->use_graph || p->runs++ == 0) return enqueue(p, err, errlen);
  CUgraph g = NULL;
  char why[512];
  bool ok = cuda_check(d->StreamBeginCapture(p->stream, CAPTURE_THREAD_LOCAL), "capture", why, sizeof why);
  if (ok) {
    ok = enqueue(p, why, sizeof why);
    CUresult r = d->StreamEndCapture(p->stream, &g);
    ok = ok && cuda_check(r, "capture", why, sizeof why);
  }
  if (ok) ok = cuda_check(d->GraphInstantiate(&p->graph, g, 0), "instantiating the step's graph", why, sizeof why);
  if (g) d->GraphDestroy(g);
  if (ok) return cuda_check(d->GraphLaunch(p->graph, p->stream), "launching the step's graph", err, errlen);
  /* No graph then: launch one by one from now on. */
  fprintf(stderr, "gradc: warning: CUDA graph capture failed (%s); launching kernels one by one\n", why);
  p->graph = NULL;
  p->use_graph = false;
  return enqueue(p, err, errlen);
}

/* The outputs and updates of micro-batch k of gas. */
static bool read_states(CudaProgram *p, StepResult *r, int k, int gas, char *err, size_t errlen) {
  for (int i = 0; i < p->nstates; i++) {
    const Loss *l = &p->states[i];
    size_t es = ir_dtype_size(l->dt);
    char *buf = mem_calloc((size_t)l->numel + 1, es);
    bool ok = cuda_check(p->d->MemcpyDtoH(buf, p->arena + (CUdeviceptr)l->offset, (size_t)l->numel * es),
                         "reading an output", err, errlen);
    if (ok) step_add_state(r, l->op, k, gas, buf, l->dt, l->numel);
    free(buf);
    if (!ok) return false;
  }
  return true;
}

static bool read_losses(CudaProgram *p, StepResult *r, char *err, size_t errlen) {
  for (int i = 0; i < p->nlosses; i++) {
    const Loss *l = &p->losses[i];
    size_t es = ir_dtype_size(l->dt);
    char *buf = mem_calloc((size_t)l->numel, es);
    bool ok = cuda_check(p->d->MemcpyDtoH(buf, p->arena + (CUdeviceptr)l->offset, (size_t)l->numel * es),
                         "reading a loss", err, errlen);
    if (ok) step_add_loss(r, l->op, buf, l->dt, l->numel);
    free(buf);
    if (!ok) return false;
  }
  return true;
}

/* Micro-batch k of the batched inputs, or every other argument (k < 0). */
static bool copy_args(CudaProgram *p, const StTensor *const *bound, int k, char *err, size_t errlen) {
  const IrFunc *f = p->f;
  for (int i = 0; i < f->nargs; i++) {
    const IrValue *a = f->args[i];
    bool split = step_arg_split(a);
    if (split != (k >= 0)) continue;
    int64_t n = ir_numel(&a->type.shape);
    if (!copy_in(p, bound[i], split ? (int64_t)k * n : 0, n, a->type.dtype, a->offset, err, errlen)) return false;
  }
  return true;
}

bool cuda_step_run(CudaProgram *p, int gas, const StFile *params, const char *params_path, const StFile *inputs,
                   const char *inputs_path, StepResult *out, char *err, size_t errlen) {
  const IrFunc *f = p->f;
  memset(out, 0, sizeof *out);
  const StTensor **bound = mem_calloc((size_t)f->nargs + 1, sizeof(StTensor *));
  StepResult r = {0};
  bool ok = step_bind(f, gas, params, params_path, inputs, inputs_path, bound, err, errlen) &&
            step_result_init(f, gas, &r, err, errlen) && device_setup(p, err, errlen);
  for (int i = 0; ok && i < p->ngrads; i++)
    ok = cuda_check(p->d->MemsetD8(p->arena + (CUdeviceptr)p->grads[i].offset, 0,
                                   (size_t)p->grads[i].numel * ir_dtype_size(p->grads[i].dt)),
                    "clearing gradients", err, errlen);
  double t0 = rt_now_ms(), dev = 0;
  ok = ok && copy_args(p, bound, -1, err, errlen) && step_store_window_sums(f, p->count, gas, bound, store, p, err, errlen);
  for (int k = 0; ok && k < gas; k++) {
    ok = copy_args(p, bound, k, err, errlen) && step_store_rng(f, gas, k, store, p, err, errlen);
    double t1 = rt_now_ms();
    ok = ok && run_micro_batch(p, err, errlen) &&
         cuda_check(p->d->StreamSynchronize(p->stream), "running the step", err, errlen);
    dev += rt_now_ms() - t1;
    ok = ok && read_losses(p, &r, err, errlen) && read_states(p, &r, k, gas, err, errlen);
  }
  for (int i = 0; ok && i < p->ngrads; i++) {
    const StepGradBuf *g = &p->grads[i];
    size_t es = ir_dtype_size(g->dt);
    char *buf = mem_calloc((size_t)g->numel, es);
    ok = cuda_check(p->d->MemcpyDtoH(buf, p->arena + (CUdeviceptr)g->offset, (size_t)g->numel * es),
                    "reading gradients", err, errlen);
    double *dst = r.grads[g->slot];
    for (int64_t e = 0; ok && e < g->numel; e++) dst[e] = rt_elem_get(buf, g->dt, e);
    free(buf);
  }
  if (ok && getenv("GRADC_CUDA_TIMING"))
    fprintf(stderr, "gradc: cuda: window of %d micro-batches: device %.3f ms, window %.3f ms\n", gas, dev,
            rt_now_ms() - t0);
  free(bound);
  if (!ok) {
    step_result_free(&r);
    return false;
  }
  *out = r;
  return true;
}

bool cuda_gemm_floor(CudaProgram *p, int gas, int reps, double *ms, char *err, size_t errlen) {
  if (!device_setup(p, err, errlen)) return false;
  for (int w = -1; w < reps; w++) {
    double t0 = rt_now_ms();
    for (int k = 0; k < gas; k++)
      for (int i = 0; i < p->ngemms; i++)
        if (!cuda_gemm_run(p->gemms, i, p->stream, err, errlen)) return false;
    if (!cuda_check(p->d->StreamSynchronize(p->stream), "running GEMMs", err, errlen)) return false;
    if (w >= 0) ms[w] = rt_now_ms() - t0;
  }
  return true;
}

/* ------------------------------------------------------------------ */
/* Artifacts                                                           */
/* ------------------------------------------------------------------ */

bool cuda_program_save(const CudaProgram *p, ArtFile *a, char *err, size_t errlen) {
  const CuModule *m = p->m;
  cJSON *o = cJSON_CreateObject();
  char hash[32];
  snprintf(hash, sizeof hash, "%016llx", (unsigned long long)cg_cuda_source_hash(m));
  cJSON_AddStringToObject(o, "arch", m->arch);
  cJSON_AddNumberToObject(o, "chunks", m->nchunks);
  cJSON_AddStringToObject(o, "source_hash", hash);
  char *s = cJSON_PrintUnformatted(o);
  cJSON_Delete(o);
  if (!s) return errf(err, errlen, "cannot describe the CUDA images");
  art_add(a, "CUDA", NULL, s, strlen(s));
  cJSON_free(s);
  for (int c = 0; c < m->nchunks; c++) {
    char name[16];
    snprintf(name, sizeof name, "%d", c);
    art_add(a, "CUBN", name, m->images[c].cubin, m->images[c].cubin_len);
    art_add(a, "PTX", name, m->images[c].ptx, m->images[c].ptx_len);
  }
  return true;
}

CudaProgram *cuda_program_load(IrFunc *f, const ArtFile *a, const CudaOptions *o, char *err, size_t errlen) {
  const ArtSection *meta = art_find(a, "CUDA", NULL);
  if (!meta) {
    errf(err, errlen, "artifact has no CUDA kernels (a CUDA section is missing)");
    return NULL;
  }
  CudaProgram *p = program_alloc(f, o, err, errlen);
  if (!p) return NULL;
  cJSON *j = cJSON_ParseWithLength((const char *)meta->data, meta->len);
  const cJSON *arch = cJSON_GetObjectItemCaseSensitive(j, "arch"), *chunks = cJSON_GetObjectItemCaseSensitive(j, "chunks");
  const cJSON *hash = cJSON_GetObjectItemCaseSensitive(j, "source_hash");
  char want[32];
  snprintf(want, sizeof want, "%016llx", (unsigned long long)cg_cuda_source_hash(p->m));
  bool ok = cJSON_IsString(arch) && cJSON_IsNumber(chunks) && cJSON_IsString(hash);
  if (!ok) errf(err, errlen, "artifact is corrupt (bad CUDA section)");
  if (ok && (strcmp(hash->valuestring, want) != 0 || chunks->valueint != p->m->nchunks))
    ok = errf(err, errlen, "artifact's CUDA kernels were built from other sources (by another gradc?)");
  CuImage *img = mem_calloc((size_t)p->m->nchunks, sizeof(CuImage));
  for (int c = 0; ok && c < p->m->nchunks; c++) {
    char name[16];
    snprintf(name, sizeof name, "%d", c);
    const ArtSection *cb = art_find(a, "CUBN", name), *px = art_find(a, "PTX", name);
    if (!cb || !px) {
      ok = errf(err, errlen, "artifact is corrupt (compiled kernels %d are missing)", c);
      break;
    }
    img[c] = (CuImage){(char *)cb->data, cb->len, (char *)px->data, px->len, false};
  }
  if (ok) ok = cg_cuda_set_images(p->m, arch->valuestring, img, p->m->nchunks, err, errlen);
  free(img);
  cJSON_Delete(j);
  if (!ok) {
    cuda_program_free(p);
    return NULL;
  }
  return p;
}

/* ------------------------------------------------------------------ */
/* The CUDA executor as a back end                                      */
/* ------------------------------------------------------------------ */

/* "cuda" or "cuda:sm_XX". */
static bool cuda_accepts(const char *target) {
  char arch[32];
  return cg_cuda_parse_target(target, arch, sizeof arch);
}

/* Compiling needs NVRTC (no device: that waits for the first step). */
static bool cuda_usable(char *err, size_t errlen) { return cg_nvrtc_load(err, errlen); }

static CudaOptions cuda_options(const BackendOptions *o, char *arch, size_t n) {
  cg_cuda_parse_target(o->target, arch, n);
  return (CudaOptions){arch, o->cache_dir, o->threads, false};
}

static void *cuda_compile(IrFunc *f, const BackendOptions *o, char *err, size_t errlen) {
  char arch[32];
  CudaOptions co = cuda_options(o, arch, sizeof arch);
  return cuda_program_new(f, &co, err, errlen);
}

static bool cuda_save(const void *prog, ArtFile *a, char *err, size_t errlen) {
  return cuda_program_save(prog, a, err, errlen);
}

static void *cuda_load(IrFunc *f, const ArtFile *a, const BackendOptions *o, char *err, size_t errlen) {
  char arch[32];
  CudaOptions co = cuda_options(o, arch, sizeof arch);
  return cuda_program_load(f, a, &co, err, errlen);
}

static bool cuda_run(void *prog, int gas, const StFile *params, const char *params_path, const StFile *inputs,
                     const char *inputs_path, StepResult *out, char *err, size_t errlen) {
  return cuda_step_run(prog, gas, params, params_path, inputs, inputs_path, out, err, errlen);
}

static void cuda_free(void *prog) { cuda_program_free(prog); }

const Backend rt_backend_cuda = {
    .name = "cuda",
    .accepts = cuda_accepts,
    .pipeline = pass_pipeline_cpu, /* the same kernels and memory plan as the CPU's */
    .no_inplace = true,
    .no_colsums = true,
    .usable = cuda_usable,
    .compile = cuda_compile,
    .save = cuda_save,
    .load = cuda_load,
    .run = cuda_run,
    .free = cuda_free,
};
