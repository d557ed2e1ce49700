/* api_impl.h - what the files of the C API (include/gradc.h) share: the
 * program and session structs and the thread-local error message.
 *
 *   api.c          errors, programs (compile, signature), artifacts
 *   api_session.c  sessions: params, inputs, running a window, gradients
 *   api_optim.c    optimisers, the learning-rate schedule, checkpoints
 *   api_params.c   what both of those do with params (below them both)
 *   api_zero.c     ZeRO-1: the optimiser state sharded over the dp ranks */
#ifndef GRADC_API_IMPL_H
#define GRADC_API_IMPL_H

#include "frontend/frontend.h"
#include "gradc.h"
#include "runtime/backend.h"
#include "runtime/comm/comm.h"
#include "runtime/runtime.h"

/* ZeRO-1 (api_zero.c): per storage dtype (group 0: F32, 1: F64) the
 * params in declaration order form one flat vector of n elements, cut into
 * dp parts of count = ceil(n / dp); this rank owns part `rank`, which is
 * elements [lo, lo + len) of param i (len may be 0). */
typedef struct ZeroLayout {
  int dp, rank;
  int nparams;
  int64_t n[2], count[2];
  int *group;   /* per param: 0 (F32 storage) or 1 (F64) */
  int64_t *off; /* per param: its first element in its group's vector */
  int64_t *lo, *len;
} ZeroLayout;

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
  const char *target;      /* "cpu", "ref", "cuda[:sm_XX]" */
  const Backend *backend;  /* the registry's for target (runtime/backend.h) */
  int threads;
  bool no_cache;
  const char **def_names;  /* the -D values baked in */
  int64_t *def_values;
  int ndefs;
  /* The signature, in declaration order.  params[i].name/type/init/a/b
   * are set (the rest is zero): what rt_init_params needs. */
  FeParam *params;
  int nparams;
  int nbuffers;            /* language v2: the buffers follow the params in params[] (nparams + nbuffers
                              entries), and in a session's params file: read like params, never a
                              gradient or an optimiser's update */
  ApiInput *inputs;
  int ninputs;
  const char **losses;
  int nlosses;
  const char **outputs;    /* `output` names, in statement order */
  int noutputs;
  uint64_t fingerprint;    /* api_fingerprint of the signature */
  /* The compiled function: m->func when compiled from source, else read
   * from an artifact (then owned here). */
  FeModel *fe;
  IrFunc *func;
  char *ir_text;           /* the printed function, as saved in artifacts (malloc'd) */
  void *prog;              /* the back end's program (NULL until it is ready) */
  /* Distributed runs (comm.h): dp and tp ranks (the run has tp x dp);
   * the comm layout is opened by the first session or run
   * (api_dist_start), not at compile time. */
  int dp;
  int tp;
  bool sequence_parallel, no_overlap; /* what the passes were given */
  int64_t bucket_bytes;
  Comm *comm;
  StepDp stepdp;
  bool forward_only;       /* compiled without autodiff (gradc_compile_options.forward_only): no gradients */
  bool zero1;              /* ZeRO-1 asked for (and dp > 1) */
  IrDType precision;       /* --precision: IR_DT_F32, IR_DT_BF16 or IR_DT_F16 (f16: dynamic loss scaling) */
  double loss_scale;       /* f16: what loss.scale gives the next windows (api_run_window_ex; 0 reads as 1):
                              API_LOSS_SCALE_INIT until a session sets its own */
  ZeroLayout *zero;        /* its layout on this rank, set when the run's ranks are joined (NULL: none) */
  uint64_t draw_seed, draw_step; /* the random draws of the next windows (api_set_draws) */
};

struct gradc_session {
  gradc_program *p;
  StFile params;           /* master weights: F32 (F64 for f64 params), in signature order, then the
                              buffers (the window's updates applied after each run) */
  StFile inputs;           /* one window, as set by gradc_session_set_input */
  StepResult res;          /* the last run */
  bool have_res;
  double grad_norm;        /* of res, before clipping */
  /* The optimiser. */
  bool have_opt;
  gradc_optimizer_options opt;  /* opt.no_decay is no_decay below */
  char *no_decay;          /* the session's copy of the patterns (malloc'd), or NULL */
  bool *decay_off;         /* per param: no weight decay (malloc'd, nparams), or NULL */
  void **slot0;            /* per param: exp_avg (AdamW) or momentum_buffer (SGD), or NULL */
  void **slot1;            /* per param: exp_avg_sq (AdamW), or NULL */
  bool momentum_valid;     /* SGD: the momentum buffers exist (torch creates them on the first step) */
  int64_t step;            /* optimiser steps taken */
  Rng rng;
  struct CgOptim *optim_code; /* generated update kernels (CPU back end), built at the first step */
  struct Trace *trace;     /* gradc_session_trace's recorder, or NULL */
  bool grads_sharded;      /* ZeRO-1: res.grads hold only this rank's reduced slices (zeros elsewhere) */
  uint64_t params_gen;     /* taken anew at every change to params (api_params_changed) */
  uint64_t draw_seed;      /* gradc_session_set_draws: the seed of the random draws */
  int64_t draw_offset;     /* their step is the optimiser step count plus this */
  /* f16 loss scaling (gradc_session_set_loss_scaling): the options, S, the
   * clean steps since S last changed, the overflows in a row left before
   * S halves, whether the last run overflowed, the steps skipped. */
  gradc_loss_scale_options ls;
  double loss_scale;
  int clean_steps, overflows_left;
  bool overflow;
  int64_t skipped;
};

/* gradc_program_compile_source with the caller's pass manager (dumps,
 * timing, verification: the command line's --print-ir-* flags); pm may be
 * NULL. */
struct PassManager;
gradc_status api_program_compile(const char *name, const char *text, const gradc_compile_options *o,
                                 struct PassManager *pm, gradc_program **out);

/* f16's first loss scale (gradc_loss_scale_options_init), 2^16 as
 * torch.cuda.amp.GradScaler's. */
#define API_LOSS_SCALE_INIT 65536.0
/* f16 (DESIGN.md §3 rule 7): the one pass after a window that divides the
 * loss scale out of r's losses and gradients (exactly: a power of two)
 * and sums the gradients' squares (the global norm's; not finite: the
 * window overflowed). */
double api_unscale_norm2(StepResult *r, double scale);
/* The sum of g[0, n)'s squares, in a fixed order whatever the machine
 * (eight running sums over the elements mod 8, then added in turn), so
 * that every path that sums gradients' squares gets the same bits. */
double api_sum_squares(const double *g, int64_t n);
/* The same after g[0, n) *= inv in place, in one pass (inv a power of two:
 * exact, so the sum is that of the unscaled gradients' squares). */
double api_unscale_sum_squares(double *g, int64_t n, double inv);
double api_program_loss_scale(const gradc_program *p); /* what the next api_run_window* scales by */
/* The seed and step of the random draws (dropout, rand_like, randn_like)
 * of the next api_run_window* windows (0 and 0 until set). */
void api_set_draws(gradc_program *p, uint64_t seed, uint64_t step);
/* The generation of the params the next api_run_window* gets (the CPU
 * back end skips copying params it holds already; 0: unknown). */
void api_set_params_gen(gradc_program *p, uint64_t gen);
/* Done with a result of api_run_window*: the back end may fill its arrays
 * again in the next window (the CPU's), else it is freed. */
void api_result_free(gradc_program *p, StepResult *r);
/* The CUDA executor's program (its kernels, --allow-tf32), or NULL on another back end. */
struct CudaProgram *api_cuda_program(const gradc_program *p);
/* The CPU executor's program (runtime/cpu/exec.c), NULL on another back end. */
struct CpuProgram *api_cpu_program(const gradc_program *p);

/* Record msg as this thread's last error and return st. */
gradc_status api_fail(gradc_status st, const char *fmt, ...) GRADC_PRINTF(2, 3);
/* The index of a param / input by name, or -1. */
int api_param_index(const gradc_program *p, const char *name);
/* The index of a param or buffer in params[] (and in a session's params), or -1. */
int api_state_index(const gradc_program *p, const char *name);
/* Params and buffers: the tensors of a params file. */
int api_nstate(const gradc_program *p);
int api_input_index(const gradc_program *p, const char *name);
/* The window shape of an input (batched ones hold K micro-batches). */
IrType api_input_window_type(const gradc_program *p, int i);
/* Whether params of this declared type are stored as F64 (else F32). */
bool api_param_f64(const FeParam *p);


/* Run one window on the program's back end (Backend.run); errors name
 * the file each StFile was read from (StFile.path), or "the session's
 * params" / "the session's inputs" for tensors built in memory. */
bool api_run_window(gradc_program *p, const StFile *params, const StFile *inputs, StepResult *r, char *err,
                    size_t errlen);

/* api_run_window, and under ZeRO-1 with keep_shard: the gradients are
 * left reduce-scattered (only this rank's slices of r->grads hold their
 * sums; *sharded is set).  Without keep_shard they are gathered whole. */
bool api_run_window_ex(gradc_program *p, const StFile *params, const StFile *inputs, StepResult *r, bool keep_shard,
                       bool *sharded, char *err, size_t errlen);

/* Join the run's ranks for a program of tp x dp > 1 ranks (once; a no-op
 * for one). */
bool api_dist_start(gradc_program *p, char *err, size_t errlen);
/* This process's rank in the program's run (0 without one). */
int api_program_rank(const gradc_program *p);

/* api_zero.c: ZeRO-1 (see there).  Collectives over the dp group, every
 * rank in the same order. */
ZeroLayout *api_zero_layout(const gradc_program *p); /* NULL unless zero1 over > 1 dp ranks */
void api_zero_free(ZeroLayout *z);
/* Reduce-scatter r's (unreduced) gradients: this rank's slices get the sums, the rest zeros. */
bool api_zero_reduce_scatter(const gradc_program *p, StepResult *r, char *err, size_t errlen);
/* All-gather the slices back into whole gradients. */
bool api_zero_gather_grads(const gradc_program *p, StepResult *r, char *err, size_t errlen);
/* The squared global norm of sharded gradients (all-reduced sums of squares),
 * after dividing this rank's slices and the losses by the loss scale (f16;
 * 1 otherwise): api_unscale_norm2 for ZeRO-1.  Not finite on every rank
 * when any rank's slice overflowed (the sum carries the inf or NaN). */
bool api_zero_norm2(const gradc_program *p, StepResult *r, double scale, double *out, char *err, size_t errlen);
/* All-gather the params' owned slices (after an update) into every rank's whole params. */
bool api_zero_gather_params(const gradc_program *p, StFile *params, char *err, size_t errlen);
/* All-gather an optimiser slot (per param: this rank's slice) into whole
 * vectors per group (malloc'd; param i at whole[group][off[i]]). */
bool api_zero_gather_slot(const gradc_program *p, void *const *slot, void *whole[2], char *err, size_t errlen);
/* Bytes of optimiser state this rank holds (slot0 and slot1). */
int64_t api_optim_state_bytes(const gradc_session *s);

/* api_params.c */
/* The session's params changed (set, loaded, stepped): a new generation,
 * unique in the process, so the CPU back end copies them in again. */
void api_params_changed(gradc_session *s);
/* Check a safetensors file holds every param (some, when partial) with
 * its shape and a float dtype, and nothing else (but optim.* tensors when
 * allow_optim); the error names the file and the tensor, as `gradc run`
 * does. */
bool api_check_params_file(const gradc_program *p, const StFile *f, const char *path, bool allow_optim, bool partial,
                           char *err, size_t errlen);
/* Copy src's elements into dst (same count), converting to dst's dtype. */
void api_copy_tensor(const StTensor *src, StTensor *dst);

/* api_optim.c: the slot names an optimiser keeps ("exp_avg", ...). */
int api_optim_slots(const gradc_optimizer_options *o, const char **names);
void api_optim_free_state(gradc_session *s);
void api_optim_free_code(gradc_session *s); /* the session's generated update kernels */
void api_optim_free_options(gradc_session *s); /* the no-decay patterns and mask */

#endif
