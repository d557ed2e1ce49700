/* codegen.h - code generation for fused kernels (docs/BACKEND.md).
 *
 * cg_llvm_compile turns every kernel of a planned function (after `fuse`
 * and `memplan`) into native code through the LLVM C API: one LLVM
 * function per kernel, optimised with LLVMRunPasses("default<O3>"), emitted
 * as object code and loaded with ORC LLJIT.  A kernel addresses all its
 * data through the arena base pointer and constant offsets. */
#ifndef GRADC_CODEGEN_H
#define GRADC_CODEGEN_H

#include "../ir/ir.h"

/* A compiled kernel: processes its iterations [begin, end) (its outer,
 * parallel loop: rows, blocks, ...); the executor splits [0, iters) across
 * threads.  The arena is the step's single buffer (IrFunc.arena_size). */
typedef void (*CgKernelFn)(char *arena, int64_t begin, int64_t end);

typedef struct CgKernel {
  int group;        /* the IrOp.group it implements */
  const char *name; /* e.g. "k7_layer_norm_gelu" (also the symbol name) */
  CgKernelFn fn;
  int64_t iters;    /* number of parallel iterations */
  int64_t cost;     /* rough work per iteration (elements touched), for splitting */
} CgKernel;

typedef struct CgOptions {
  const char *cache_dir; /* object-code cache directory, NULL = no cache */
  bool dump_llvm;        /* print each kernel's optimised LLVM IR to stderr */
} CgOptions;

typedef struct CgModule CgModule;

/* Compile every kernel of f.  Returns NULL with a message on an LLVM
 * failure (an internal error: exit status 2). */
CgModule *cg_llvm_compile(const IrFunc *f, const CgOptions *o, char *err, size_t errlen);
/* The kernels, indexed by group id (kernels[g] for g in 1..n; [0] unused). */
const CgKernel *cg_module_kernel(const CgModule *m, int group);
int cg_module_nkernels(const CgModule *m);
void cg_module_free(CgModule *m);

#endif
