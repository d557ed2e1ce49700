/* gradc.h - the public C API of gradc.
 *
 * Compile a model (a .gdl file or source text, or load an ahead-of-time
 * artifact) into a program, open a session on it, bind params and one
 * window of inputs, run the step (forward + backward + in-place
 * accumulation over K micro-batches), read losses and gradients, and apply
 * an optimiser; or compile the forward alone (forward_only) and read a
 * window's losses and outputs.  Programs JIT-compile at start-up; nothing
 * here calls exit().
 *
 * Errors: every function that can fail returns a gradc_status; the message
 * of the last failure on the calling thread is gradc_last_error().  User
 * errors (a bad model, a missing tensor) are GRADC_ERR_USER; internal ones
 * (a verifier or LLVM failure) GRADC_ERR_INTERNAL.
 *
 * Ownership: handles are freed with their *_free function; strings returned
 * by the library live as long as the handle they came from. */
#ifndef GRADC_H
#define GRADC_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define GRADC_API_VERSION 1

/* What libgradc.so exports: the functions declared here and nothing else
 * (the library is built with -fvisibility=hidden). */
#if defined(__GNUC__) || defined(__clang__)
#define GRADC_API __attribute__((visibility("default")))
#else
#define GRADC_API
#endif

typedef enum { GRADC_OK = 0, GRADC_ERR_USER = 1, GRADC_ERR_INTERNAL = 2 } gradc_status;

typedef enum { GRADC_F32, GRADC_F64, GRADC_BF16, GRADC_F16, GRADC_I32, GRADC_I64 } gradc_dtype;

/* The message of the last failure on this thread ("" if none). */
GRADC_API const char *gradc_last_error(void);
GRADC_API const char *gradc_version(void);

/* ---- programs ---- */

typedef struct gradc_program gradc_program;

typedef struct gradc_compile_options {
  int gas;            /* micro-batches per window, K >= 1 (default 1) */
  const char *target; /* "cpu" (default) or "ref" (the reference interpreter) */
  int threads;        /* CPU threads (kernels, GEMMs, the compile), 0 = one per CPU the process may use */
  const char *const *def_names; /* dim overrides, as -D NAME=VALUE */
  const int64_t *def_values;
  int ndefs;
  int no_cache;       /* 1: bypass the on-disk compile cache */
  int dp;             /* data-parallel ranks N >= 1 (default 1; 0 reads as 1): the run is N processes
                         (mpirun -np N, after gradc_mpi_enable), each computing B/N samples of the window */
  int tp;             /* tensor-parallel ranks T >= 1 (default 1): params annotated split(N) are sharded
                         over T processes; the run is T x dp processes, tp ranks adjacent */
  int sequence_parallel; /* 1: between tensor-parallel regions activations are sharded along the
                            sequence axis (all-gather / reduce-scatter instead of all-reduce) */
  int no_overlap;     /* 1: collectives wait right after they start (no compute in between) */
  int64_t bucket_bytes; /* data-parallel gradient bucket cap (0: the default) */
  int zero1;          /* 1: ZeRO-1 (dp > 1): gradients are reduce-scattered over the dp ranks, each rank
                         keeps the optimiser state of and updates its 1/dp of the params, and the params
                         are all-gathered after the step */
  int no_training;    /* 1: the model's flag `training` is false (`if training { .. } else { .. }` takes
                         the else branch) and `update` statements are checked but not compiled: for
                         forward-only use.  0 (the default): training, as run, train and bench */
  int forward_only;   /* 1: compile the forward alone, as `gradc infer`, `eval` and `generate` do: no_training
                         (the flag `training` is false, no `update`), no autodiff, so no gradient buffers and
                         no optimiser; a session's run computes the window's losses and outputs, and asking
                         it for gradients or an optimiser step is an error.  Artifacts keep the mode */
  int no_outputs;     /* 1: `output` statements are checked but not compiled (the program has no outputs):
                         for losses alone over a large window, whose outputs would all be kept */
  const char *precision; /* mixed precision, as PyTorch's autocast: "bf16" or "f16" runs the f32 model's
                            GEMMs (matmul, convolution) in that type with f32 accumulation, everything else
                            (reductions, norms, softmax, losses, the optimiser) in f32, with f32 master
                            weights and gradients; "f16" also scales the loss dynamically (the session's
                            loss scale, gradc_session_loss_scale).  NULL or "f32" (the default): f32 */
} gradc_compile_options;

GRADC_API void gradc_compile_options_init(gradc_compile_options *o);

GRADC_API gradc_status gradc_program_compile_file(const char *path, const gradc_compile_options *o, gradc_program **out);
/* name is used in diagnostics ("model.gdl:3:7: error: ..."). */
GRADC_API gradc_status gradc_program_compile_source(const char *name, const char *text, const gradc_compile_options *o,
                                          gradc_program **out);
/* Load an artifact written by gradc_program_save / `gradc compile -o`
 * without recompiling; fails if it was built for another host or version. */
GRADC_API gradc_status gradc_program_load(const char *artifact_path, gradc_program **out);
GRADC_API gradc_status gradc_program_save(const gradc_program *p, const char *artifact_path);
GRADC_API void gradc_program_free(gradc_program *p);

/* The program's signature. */
typedef struct gradc_tensor_info {
  const char *name;
  gradc_dtype dtype; /* params: their declared type; storage is F32 master weights (F64 for f64) */
  int rank;
  int64_t shape[8];  /* inputs: one window (the batch axis holds B samples) */
  int batched;       /* inputs: 1 if the first axis is the batch axis */
} gradc_tensor_info;

GRADC_API int gradc_program_num_params(const gradc_program *p);
GRADC_API int gradc_program_num_inputs(const gradc_program *p);
GRADC_API int gradc_program_num_losses(const gradc_program *p);
GRADC_API gradc_status gradc_program_param_info(const gradc_program *p, int i, gradc_tensor_info *out);
GRADC_API gradc_status gradc_program_input_info(const gradc_program *p, int i, gradc_tensor_info *out);
GRADC_API const char *gradc_program_loss_name(const gradc_program *p, int i);
/* Language v2: the model's `output` statements (in order) and its buffers
 * (non-trainable state, after the params in params files: a session's
 * buffers are read and set with gradc_session_get_param/set_param, loaded
 * and saved with the params, kept in checkpoints; never a gradient or an
 * optimiser update). */
GRADC_API int gradc_program_num_outputs(const gradc_program *p);
GRADC_API const char *gradc_program_output_name(const gradc_program *p, int i);
GRADC_API int gradc_program_num_buffers(const gradc_program *p);
GRADC_API gradc_status gradc_program_buffer_info(const gradc_program *p, int i, gradc_tensor_info *out);
GRADC_API int gradc_program_gas(const gradc_program *p);
GRADC_API int gradc_program_dp(const gradc_program *p);
GRADC_API int gradc_program_tp(const gradc_program *p);    /* tensor-parallel ranks (1: none) */
GRADC_API int gradc_program_zero1(const gradc_program *p); /* 1: ZeRO-1 over its dp ranks (checkpoints are collective) */
/* 1 if p was compiled forward-only (gradc_compile_options.forward_only),
 * else 0. */
GRADC_API int gradc_program_forward_only(const gradc_program *p);
/* The bytes of the program's arena (its memory plan: params, inputs,
 * gradients and the activations of one micro-batch), or 0 on a target
 * that plans none (the reference interpreter). */
GRADC_API int64_t gradc_program_arena_bytes(const gradc_program *p);
/* gradc_compile_options.precision as compiled: "f32", "bf16" or "f16". */
GRADC_API const char *gradc_program_precision(const gradc_program *p);

/* Data parallelism (gradc_compile_options.dp > 1) runs over MPI: a
 * program launched by mpirun calls this once, before its first session,
 * to use the MPI back end (it links libmpi).  Fails in a build without
 * MPI. */
GRADC_API gradc_status gradc_mpi_enable(void);

/* ---- sessions ---- */

typedef struct gradc_session gradc_session;

GRADC_API gradc_status gradc_session_new(const gradc_program *p, gradc_session **out);
GRADC_API void gradc_session_free(gradc_session *s);

/* Data-parallel sessions (dp > 1) join the run's ranks when created: every
 * rank sets the same params and the same whole window of inputs, and after
 * gradc_session_run each holds the gradients and losses of the whole
 * window (so optimiser steps keep the params identical).  This process's
 * rank (rank 0 is the one that prints), and a check that every rank holds
 * the same params and step count (an error names the first that does
 * not); without dp the rank is 0 and the check passes. */
GRADC_API int gradc_session_rank(const gradc_session *s);
GRADC_API gradc_status gradc_session_check_replicas(const gradc_session *s);
/* Record a Chrome trace (JSON for Perfetto / chrome://tracing) of the
 * session's steps from now on: kernels, GEMMs and copies on a compute lane
 * and collectives on a comm lane, per rank.  gradc_session_trace_write
 * writes it (collective in a distributed run: every rank's events go into
 * the one file rank 0 writes).  The figures are this rank's, in
 * milliseconds: time collectives were in flight, the part of it the rank
 * sat waiting for them (exposed), and time in kernels, GEMMs and copies. */
GRADC_API gradc_status gradc_session_trace(gradc_session *s);
GRADC_API gradc_status gradc_session_trace_write(gradc_session *s, const char *path);
GRADC_API gradc_status gradc_session_trace_stats(const gradc_session *s, double *comm_ms, double *exposed_ms,
                                       double *compute_ms);

/* Params: initialise from the model's `init` specs, or set/get by name.
 * Data is F32 (F64 for f64 params), n elements. */
GRADC_API gradc_status gradc_session_init_params(gradc_session *s, uint64_t seed);
GRADC_API gradc_status gradc_session_set_param(gradc_session *s, const char *name, const void *data, size_t n);
GRADC_API gradc_status gradc_session_get_param(const gradc_session *s, const char *name, void *out, size_t n);
/* The session's own storage of a param (F32, F64 for f64 params; *n
 * elements): it stays at this address until the session is freed, and
 * init_params, set_param, load_params, checkpoints and the optimiser
 * write into it.  After writing through it yourself, call
 * gradc_session_params_written before the next run (the CPU back end
 * otherwise keeps the copy it holds). */
GRADC_API gradc_status gradc_session_param_data(gradc_session *s, const char *name, void **data, size_t *n);
GRADC_API void gradc_session_params_written(gradc_session *s);
/* Params from/to a safetensors file (the names of the model's params).
 * Loading skips a checkpoint's optim.* tensors, so a checkpoint serves as
 * a params file; the _partial form takes a file with some of the params
 * (the others keep their values; *nloaded, if not NULL, counts those
 * loaded), and refuses a tensor that is not a param all the same. */
GRADC_API gradc_status gradc_session_load_params(gradc_session *s, const char *path);
GRADC_API gradc_status gradc_session_load_params_partial(gradc_session *s, const char *path, int *nloaded);
GRADC_API gradc_status gradc_session_save_params(const gradc_session *s, const char *path);

/* One window of an input: F32/F64 for float inputs, I32/I64 for i32 ones. */
GRADC_API gradc_status gradc_session_set_input(gradc_session *s, const char *name, gradc_dtype dt, const void *data, size_t n);

/* Run one window: K micro-batches, gradients accumulated in place.  The
 * buffers' `update` values of the window replace the session's buffers
 * afterwards (the next run reads them), as PyTorch's running statistics
 * change in a training forward. */
GRADC_API gradc_status gradc_session_run(gradc_session *s);
/* An `output` of the last run, by name: its type (an output with a leading
 * batch axis holds the whole window's samples, batched = 1; dtype F32, F64
 * for f64 outputs, I32 for i32 and bool ones) and its n elements in that
 * dtype. */
GRADC_API gradc_status gradc_session_output_info(const gradc_session *s, const char *name, gradc_tensor_info *out);
GRADC_API gradc_status gradc_session_get_output(const gradc_session *s, const char *name, void *out, size_t n);
/* Window values of the last run: loss i (program order), and their sum. */
GRADC_API double gradc_session_loss(const gradc_session *s, int i);
GRADC_API double gradc_session_loss_total(const gradc_session *s);
/* The gradient of the last run (zeros for a param with no gradient).
 * Under zero1 with an optimiser set, the first of these calls after a run
 * all-gathers the reduce-scattered gradients: every dp rank calls it. */
GRADC_API gradc_status gradc_session_get_grad(const gradc_session *s, const char *name, void *out, size_t n);
GRADC_API gradc_status gradc_session_save_grads(const gradc_session *s, const char *path);

/* ---- optimisers (torch.optim semantics and defaults) ---- */

typedef enum { GRADC_SGD, GRADC_ADAMW } gradc_optimizer_kind;

/* The learning-rate schedule after the linear warm-up (gradc_session_lr):
 * AUTO is COSINE when total_steps > 0, else CONSTANT. */
typedef enum { GRADC_SCHEDULE_AUTO, GRADC_SCHEDULE_CONSTANT, GRADC_SCHEDULE_LINEAR, GRADC_SCHEDULE_COSINE } gradc_schedule;

typedef struct gradc_optimizer_options {
  gradc_optimizer_kind kind;
  double lr;           /* peak learning rate */
  double momentum;     /* SGD (torch default 0) */
  double dampening;    /* SGD (0) */
  int nesterov;        /* SGD (0) */
  double beta1, beta2; /* AdamW (0.9, 0.999) */
  double eps;          /* AdamW (1e-8) */
  double weight_decay; /* SGD: L2 added to the gradient (0); AdamW: decoupled (0.01) */
  double clip_norm;    /* global gradient-norm clipping, 0 = off (torch.nn.utils.clip_grad_norm_) */
  int64_t warmup_steps; /* linear warm-up from 0 to lr */
  int64_t total_steps;  /* the step where a linear or cosine decay reaches min_lr (0: constant after warm-up) */
  double min_lr;
  gradc_schedule schedule; /* after warm-up: constant, or a linear or cosine decay to min_lr at total_steps */
  /* Params that get no weight decay (PyTorch's param groups): with
   * no_decay_1d those of rank <= 1 (biases, norm weights); and those whose
   * name matches one of no_decay's comma-separated fnmatch(3) patterns
   * ("*_b,ln*"; NULL: none; copied by set_optimizer). */
  int no_decay_1d;
  const char *no_decay;
} gradc_optimizer_options;

GRADC_API void gradc_optimizer_options_init(gradc_optimizer_options *o, gradc_optimizer_kind kind);
GRADC_API gradc_status gradc_session_set_optimizer(gradc_session *s, const gradc_optimizer_options *o);
/* Apply one optimiser step with the gradients of the last run. */
GRADC_API gradc_status gradc_session_step(gradc_session *s);
/* Count a step without applying it (for a window whose loss or gradients
 * are not finite): the step count advances, and with it the learning-rate
 * schedule; params and optimiser state stay as they were. */
GRADC_API gradc_status gradc_session_skip_step(gradc_session *s);
/* 1 if a param or the optimiser state holds an inf or a NaN (under zero1,
 * this rank's slice of the state), with "param 'W1' (inf at element 3)"
 * or "optimiser state 'optim.exp_avg.W1' (...)" in what (n bytes); else 0. */
GRADC_API int gradc_session_find_nonfinite(const gradc_session *s, char *what, size_t n);
GRADC_API int64_t gradc_session_step_count(const gradc_session *s);

/* Dynamic loss scaling (gradc_compile_options.precision "f16"; DESIGN.md
 * §3 rule 7).  The session's runs seed the backward with the loss scale S
 * (fixed for the window) and, once the window is done, divide it out of
 * the gradients in the one pass that takes their global norm and finds an
 * inf or a NaN (agreed by every data-parallel rank); the losses are
 * reported unscaled.  A step after a window that overflowed is skipped
 * (as gradc_session_skip_step: the step count and the schedule advance,
 * params and optimiser state stay bit for bit), the gradients are zeroed
 * and S halves (after `hysteresis` overflowing steps in a row); after
 * `window` clean steps S doubles.  bf16 and f32 programs use no scale (S
 * reads 1). */
typedef struct gradc_loss_scale_options {
  double init_scale; /* S at the start: 65536 (2^16, torch.cuda.amp.GradScaler's) */
  int window;        /* clean steps after which S doubles: 2000 (GradScaler's growth_interval) */
  int hysteresis;    /* overflowing steps in a row before S halves: 1 (GradScaler; Megatron uses 2) */
  double min_scale;  /* S never halves below this: 1 */
} gradc_loss_scale_options;
GRADC_API void gradc_loss_scale_options_init(gradc_loss_scale_options *o);
/* A user error on a program that is not f16. */
GRADC_API gradc_status gradc_session_set_loss_scaling(gradc_session *s, const gradc_loss_scale_options *o);
GRADC_API double gradc_session_loss_scale(const gradc_session *s);    /* S for the next run */
GRADC_API int gradc_session_overflow(const gradc_session *s);         /* 1: the last run's gradients overflowed */
GRADC_API int64_t gradc_session_skipped_steps(const gradc_session *s); /* steps skipped for an overflow */
GRADC_API double gradc_session_lr(const gradc_session *s); /* the rate the next step uses */
GRADC_API double gradc_session_grad_norm(const gradc_session *s); /* of the last run, before clipping */

/* Checkpoints: params, optimiser state (optim.<slot>.<param>), step and
 * RNG state, written to a temporary file, fsynced and renamed.  The RNG is
 * the session's data-order generator (gradc_session_rng).  A state with
 * an inf or a NaN is refused (GRADC_ERR_USER) and the file left as it was. */
/* Under zero1 saving is collective (every rank sends its optimiser
 * slices; rank 0 writes the whole state); loading is not (each rank keeps
 * its slices), and the file is the same as without zero1. */
GRADC_API gradc_status gradc_session_save_checkpoint(const gradc_session *s, const char *path);
/* The same, with nmeta more key/value strings in the file's __metadata__
 * (the session's own keys, such as "step" or "format", take precedence),
 * all in the one atomic write: a reader sees the old file or the whole new
 * one. */
GRADC_API gradc_status gradc_session_save_checkpoint_meta(const gradc_session *s, const char *path, int nmeta,
                                                          const char *const *keys, const char *const *values);
GRADC_API gradc_status gradc_session_load_checkpoint(gradc_session *s, const char *path);
/* Random draws (dropout, rand_like, randn_like; DESIGN.md §2): a pure
 * function of a seed, a step, the op, the sample's index in the window and
 * the element.  The session's runs draw with `seed` at step `step`, plus
 * one for every optimiser step taken after this call; by default seed 0
 * and the optimiser step count.  Checkpoints keep both, so a resumed
 * session draws what an uninterrupted one would. */
GRADC_API void gradc_session_set_draws(gradc_session *s, uint64_t seed, int64_t step);
/* A 64-bit generator saved with the checkpoint (e.g. for shuffling data). */
GRADC_API uint64_t gradc_session_rng_next(gradc_session *s);
GRADC_API void gradc_session_rng_seed(gradc_session *s, uint64_t seed);

#ifdef __cplusplus
}
#endif

#endif
