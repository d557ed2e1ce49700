/* backend.h - a compute back end is a struct of function pointers
 * (DESIGN.md §7, docs/BACKEND.md "The back-end interface"), as the comm
 * layer's CommBackend is: what the API needs to get a function after the
 * target's pipeline ready to run (compile it, or load it from an
 * artifact), save what it compiled, run windows of K micro-batches on it
 * and free it.  A program is the back end's own (opaque) handle.
 *
 * The registry (backend.c) is the one place that knows which back ends
 * this build has: the reference interpreter always; the CPU executor with
 * LLVM (without it the interpreter runs the "cpu" target); the CUDA
 * executor with GRADC_CUDA.  A target no registered back end accepts is
 * not found. */
#ifndef GRADC_RUNTIME_BACKEND_H
#define GRADC_RUNTIME_BACKEND_H

#include "runtime/io/artifact.h"
#include "runtime/runtime.h"

typedef struct BackendOptions {
  const char *target;    /* the target as given ("cpu", "cuda:sm_90") */
  int threads;           /* threads for kernels, GEMMs and compilers; 0: pool_ncores() */
  const char *cache_dir; /* compiled-kernel cache (NULL: none) */
} BackendOptions;

typedef struct Backend {
  const char *name; /* "ref", "cpu", "cuda" */
  /* Whether target names this back end ("cuda:sm_80"); NULL: the word
   * the registry lists it under ("cpu"). */
  bool (*accepts)(const char *target);
  /* The pass pipeline its functions are compiled with (passes.h). */
  const char *const *(*pipeline)(int *n);
  bool no_inplace;  /* PassOptions.no_inplace: no kernel writes over its operand */
  bool no_colsums;  /* PassOptions.no_colsums: no row kernel sums columns over a group of rows */
  bool llvm_optim;  /* the optimiser step runs generated LLVM kernels (else the C loop; the same bits) */
  /* Whether it can compile in this process (a library it loads is
   * there), else a user error in err; NULL: always. */
  bool (*usable)(char *err, size_t errlen);
  /* A program for f (which must outlive it), or NULL with an internal
   * error in err. */
  void *(*compile)(IrFunc *f, const BackendOptions *o, char *err, size_t errlen);
  /* Append what compile made to an artifact; NULL: nothing to keep. */
  bool (*save)(const void *prog, ArtFile *a, char *err, size_t errlen);
  /* A program for f from an artifact a saved one into (f read from the
   * same artifact), or NULL with the reason in err (a user error). */
  void *(*load)(IrFunc *f, const ArtFile *a, const BackendOptions *o, char *err, size_t errlen);
  /* One window, with step_bind's checks and errors; out gets the window's
   * losses and accumulated gradients (step_result_free, or recycle). */
  bool (*run)(void *prog, int gas, const StFile *params, const char *params_path, const StFile *inputs,
              const char *inputs_path, StepResult *out, char *err, size_t errlen);
  /* The generation of the params the next run gets (cpu_program_set_params_gen); NULL: ignored. */
  void (*set_params_gen)(void *prog, uint64_t gen);
  /* Hand back a result of run the caller is done with; NULL: step_result_free. */
  void (*recycle)(void *prog, StepResult *r);
  void (*free)(void *prog);
} Backend;

/* The back ends (ref/step.c, cpu/exec.c, cuda/cuda_exec.c). */
extern const Backend rt_backend_ref, rt_backend_cpu, rt_backend_cuda;

/* The back end this build runs target on, or NULL. */
const Backend *rt_backend_find(const char *target);
/* The targets this build has, for messages: "cpu, ref, cuda[:sm_XX]". */
char *rt_backend_targets(char *buf, size_t n);

#endif
