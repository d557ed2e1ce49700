/* api_impl.h - what the files of the C API (include/gradc.h) share: the
 * program and session structs and the thread-local error message.
 *
 *   api.c          errors, programs (compile, signature), artifacts
 *   api_session.c  sessions: params, inputs, running a window, gradients
 *   api_optim.c    optimisers, the learning-rate schedule, checkpoints */
#ifndef GRADC_API_IMPL_H
#define GRADC_API_IMPL_H

#include "../frontend/frontend.h"
#include "../include/gradc.h"
#include "comm.h"
#include "runtime.h"

/* An input of the program's signature. */
typedef struct ApiInput {
  const char *name;
  IrType type;  /* one micro-batch (the batch axis holds B/K samples) */
  bool batched; /* first axis is the batch axis */
} ApiInput;

struct gradc_program {
  Arena arena;             /* the signature's strings and arrays */
  const char *model;       /* the model's name */
  const char *source_name; /* the name diagnostics used ("mlp.gdl") */
  char *source;            /* the model text (malloc'd) */
  int gas;
  const char *target;      /* "cpu" or "ref" */
  int threads;
  bool no_cache;
  const char **def_names;  /* the -D values baked in */
  int64_t *def_values;
  int ndefs;
  /* The signature, in declaration order.  params[i].name/type/init/a/b
   * are set (the rest is zero): what rt_init_params needs. */
  FeParam *params;
  int nparams;
  ApiInput *inputs;
  int ninputs;
  const char **losses;
  int nlosses;
  uint64_t fingerprint;    /* api_fingerprint of the signature */
  /* The compiled function: m->func when compiled from source, else read
   * from an artifact (then owned here). */
  FeModel *fe;
  IrFunc *func;
  char *ir_text;           /* the printed function, as saved in artifacts (malloc'd) */
  struct CpuProgram *cpu;  /* the CPU back end's program, NULL on the interpreter */
  struct CudaProgram *cuda; /* the CUDA back end's program (target "cuda[:sm_XX]"), or NULL */
  /* Distributed runs (comm.h): dp and tp ranks (the run has tp x dp);
   * the comm layout is opened by the first session or run
   * (api_dist_start), not at compile time. */
  int dp;
  int tp;
  bool sequence_parallel, no_overlap; /* what the passes were given */
  int64_t bucket_bytes;
  Comm *comm;
  StepDp stepdp;
};

struct gradc_session {
  gradc_program *p;
  StFile params;           /* master weights: F32 (F64 for f64 params), in signature order */
  StFile inputs;           /* one window, as set by gradc_session_set_input */
  StepResult res;          /* the last run */
  bool have_res;
  double grad_norm;        /* of res, before clipping */
  /* The optimiser. */
  bool have_opt;
  gradc_optimizer_options opt;
  void **slot0;            /* per param: exp_avg (AdamW) or momentum_buffer (SGD), or NULL */
  void **slot1;            /* per param: exp_avg_sq (AdamW), or NULL */
  bool momentum_valid;     /* SGD: the momentum buffers exist (torch creates them on the first step) */
  int64_t step;            /* optimiser steps taken */
  Rng rng;
  struct CgOptim *optim_code; /* generated update kernels (CPU back end), built at the first step */
  struct Trace *trace;     /* gradc_session_trace's recorder, or NULL */
};

/* gradc_program_compile_source with the caller's pass manager (dumps,
 * timing, verification: the command line's --print-ir-* flags); pm may be
 * NULL. */
struct PassManager;
gradc_status api_program_compile(const char *name, const char *text, const gradc_compile_options *o,
                                 struct PassManager *pm, gradc_program **out);

/* Record msg as this thread's last error and return st. */
gradc_status api_fail(gradc_status st, const char *fmt, ...) GRADC_PRINTF(2, 3);
/* The index of a param / input by name, or -1. */
int api_param_index(const gradc_program *p, const char *name);
int api_input_index(const gradc_program *p, const char *name);
/* The window shape of an input (batched ones hold K micro-batches). */
IrType api_input_window_type(const gradc_program *p, int i);
/* Whether params of this declared type are stored as F64 (else F32). */
bool api_param_f64(const FeParam *p);

/* Check a safetensors file holds every param with its shape and a float
 * dtype, and nothing else (but optim.* tensors when allow_optim); the
 * error names the file and the tensor, as `gradc run` does. */
bool api_check_params_file(const gradc_program *p, const StFile *f, const char *path, bool allow_optim, char *err,
                           size_t errlen);
/* Copy src's elements into dst (same count), converting to dst's dtype. */
void api_copy_tensor(const StTensor *src, StTensor *dst);

/* Run one window on the program's back end (step_run_ref or cpu_step_run);
 * errors name the tensors as "params: ..." / "inputs: ...". */
bool api_run_window(gradc_program *p, const StFile *params, const StFile *inputs, StepResult *r, char *err,
                    size_t errlen);

/* Join the run's ranks for a program of tp x dp > 1 ranks (once; a no-op
 * for one). */
bool api_dist_start(gradc_program *p, char *err, size_t errlen);
/* This process's rank in the program's run (0 without one). */
int api_program_rank(const gradc_program *p);

/* api_optim.c: the slot names an optimiser keeps ("exp_avg", ...). */
int api_optim_slots(const gradc_optimizer_options *o, const char **names);
void api_optim_free_state(gradc_session *s);
void api_optim_free_code(gradc_session *s); /* the session's generated update kernels */

#endif
