/* codegen.h - code generation for fused kernels (docs/BACKEND.md).
 *
 * cg_llvm_compile turns every kernel of a planned function (after `fuse`
 * and `memplan`) into native code through the LLVM C API: one LLVM
 * function per kernel, optimised with LLVMRunPasses("default<O3>"), emitted
 * as object code and loaded with ORC LLJIT.  A kernel addresses all its
 * data through the arena base pointer and constant offsets, or offsets
 * from a table where kernels that differ only in them share one code. */
#ifndef GRADC_CODEGEN_H
#define GRADC_CODEGEN_H

#include "ir/ir.h"
#include "passes/kernel.h"

/* A compiled kernel: processes its iterations [begin, end) (its outer,
 * parallel loop: rows, blocks, ...); the executor splits [0, iters) across
 * threads.  The arena is the step's single buffer (IrFunc.arena_size). */
typedef void (*CgKernelFn)(char *arena, int64_t begin, int64_t end, const int64_t *offs);

typedef struct CgKernel {
  int group;           /* the IrOp.group it implements */
  const char *name;    /* e.g. "k7_layer_norm_gelu" (the symbol of code it alone runs) */
  CgKernelFn fn;       /* called as fn(arena, begin, end, offs) */
  const int64_t *offs; /* its buffers' offsets where fn is code kernels share, else NULL */
  int64_t iters;       /* number of parallel iterations */
  int64_t cost;        /* rough work per iteration (elements touched), for splitting */
  int64_t setup;       /* rough work a call does before its iterations (a product's panel of B) */
} CgKernel;

typedef struct CgOptions {
  const char *cache_dir; /* object-code cache directory, NULL = no cache */
  bool dump_llvm;        /* print each kernel's optimised LLVM IR to stderr */
  int threads;           /* threads compiling kernels in parallel; 0: pool_ncores() */
} CgOptions;

typedef struct CgModule CgModule;


/* ------------------------------------------------------------------ */
/* llvm.c                                                              */
/* ------------------------------------------------------------------ */
/* Compile every kernel of f.  Returns NULL with a message on an LLVM
 * failure (an internal error: exit status 2). */
CgModule *cg_llvm_compile(const IrFunc *f, const CgOptions *o, char *err, size_t errlen);
/* The kernels, indexed by group id (kernels[g] for g in 1..n; [0] unused). */
const CgKernel *cg_module_kernel(const CgModule *m, int group);
int cg_module_nkernels(const CgModule *m);
/* How many objects the kernels were compiled into: one per thread that
 * compiled them (CgOptions.threads), fewer for a few kernels. */
int cg_module_chunks(const CgModule *m);
/* The kernel a group-0 matmul runs as (passes/kernel_bmm.c: a batch of
 * small f32 products), NULL when it is a GEMM (or m is NULL).  Such
 * kernels have group ids after the IR's, up to cg_module_nkernels. */
const CgKernel *cg_module_matmul(const CgModule *m, const IrOp *op);
/* The twin of such a kernel whose C is a gradient buffer: it stores the
 * product where the kernel adds it (NULL for one that does not add). */
const CgKernel *cg_module_matmul_store(const CgModule *m, const IrOp *op);
void cg_module_free(CgModule *m);

/* The module's object code (owned by m: a small bundle of object files,
 * one per compiled chunk), for an on-disk cache or an artifact; cg_module_load_object loads such bytes again for the same
 * planned function (same IR, same plan, same host) without running LLVM's
 * optimiser.  Returns NULL with a message on a failure. */
void cg_module_object(const CgModule *m, const void **data, size_t *len);
CgModule *cg_module_load_object(const IrFunc *f, const void *obj, size_t len, char *err, size_t errlen);
/* Whether cg_llvm_compile found the module in CgOptions.cache_dir
 * (support/cache.c entries of kind "cpu-obj", keyed by the planned IR, the
 * host CPU and the generator's version; cache failures are warnings). */
bool cg_module_from_cache(const CgModule *m);
/* The generator's version.  Its identity, cg_generator_id(), adds a hash
 * of codegen/'s sources made at build time; the identity is part of the
 * object cache's keys and of an artifact's host id.  Edits in codegen/
 * change it by themselves; bump CG_VERSION when generated code changes
 * for another reason (the bundle's layout, say). */
#define CG_VERSION "gradc-cg-9"
/* "triple;cpu;features;llvmN" of this host: what object code depends on. */
void cg_llvm_host_id(char *buf, size_t n);
/* CG_VERSION "+" the hash of codegen/'s sources this build was made from. */
const char *cg_generator_id(void);

/* How many times cg_llvm_compile has run in this process (a cache hit
 * counts too): lets tests show that loading an artifact compiles nothing. */
int cg_llvm_compile_count(void);

/* ------------------------------------------------------------------ */
/* Optimiser updates: one fused pass over a param (runtime/api_optim.c) */
/* ------------------------------------------------------------------ */
/* The update of one param of n elements with torch.optim's single-tensor
 * semantics and order of operations (api_optim.c's file comment): the
 * gradient (always f64, a StepResult's) scaled by the clipping
 * coefficient, then SGD (weight decay, momentum, Nesterov) or AdamW.  The
 * param and its slots are f32 or f64; the f32 update rounds each scalar to
 * f32 once and computes in f32.  s0 is the momentum buffer (SGD with
 * momentum) or exp_avg (AdamW), s1 exp_avg_sq (AdamW); NULL when unused.
 *
 * The scalars are doubles (flags are 0 or 1), so the struct is laid out
 * as an array of CG_OPTIM_NSCALARS doubles that generated code indexes. */
typedef enum { CG_OPTIM_SGD, CG_OPTIM_ADAMW } CgOptimKind;

typedef struct CgOptimScalars {
  double clip;      /* 1: g = g * coef */
  double coef;      /* clip_grad_norm_'s coefficient */
  /* SGD */
  double neg_lr;    /* -lr */
  double wd_on;     /* 1 when weight_decay != 0: g = g + wd * p */
  double wd;
  double mom_on;    /* 1 when momentum != 0 (s0 exists) */
  double momentum;
  double damp1;     /* 1 - dampening */
  double nesterov;  /* 1: g = g + momentum * b, else g = b */
  double first;     /* 1: no momentum buffer yet, b = g */
  /* AdamW (t = this step's number, from 1) */
  double decay;     /* 1 - lr * weight_decay */
  double w1;        /* 1 - beta1: the lerp weight of exp_avg */
  double beta2;
  double w2;        /* 1 - beta2 */
  double eps;
  double neg_step;  /* -(lr / (1 - beta1^t)) */
  double bc2_sqrt;  /* sqrt(1 - beta2^t) */
} CgOptimScalars;
#define CG_OPTIM_NSCALARS 17

typedef void (*CgOptimFn)(void *param, const double *grad, void *s0, void *s1, int64_t n, const CgOptimScalars *sc);

/* optim.c: the update as a C loop (the ref target, builds without LLVM,
 * and the oracle for the generated kernels). */
void cg_optim_update_c(CgOptimKind kind, bool f64, void *param, const double *grad, void *s0, void *s1, int64_t n,
                       const CgOptimScalars *sc);

/* llvm_optim.c: the same update generated with LLVM, one kernel per
 * (kind, dtype), vectorised for the host.  cg_optim_compile builds the
 * kernels of the kinds in kinds_mask (bit 1 << CgOptimKind) for f32 and
 * f64 in one module, or loads it from cache_dir (support/cache.c entries
 * of kind "cpu-optim", keyed by the host, the kinds and the generator's
 * version; NULL: no cache).  NULL with a message on an LLVM failure. */
typedef struct CgOptim CgOptim;
CgOptim *cg_optim_compile(unsigned kinds_mask, const char *cache_dir, char *err, size_t errlen);
/* The kernel for (kind, f64), NULL if kind was not compiled. */
CgOptimFn cg_optim_kernel(const CgOptim *m, CgOptimKind kind, bool f64);
unsigned cg_optim_kinds(const CgOptim *m);
bool cg_optim_from_cache(const CgOptim *m);
void cg_optim_free(CgOptim *m);

#endif
