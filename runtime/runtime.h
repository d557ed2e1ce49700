/* runtime.h - tensors in and out (safetensors), the reference interpreter,
 * the window every executor runs (window.c) and the step drivers that run
 * one: the interpreter's (ref/step.c) and the CPU executor's (cpu/exec.c).
 * The back-end interface over them is backend.h. */
#ifndef GRADC_RUNTIME_H
#define GRADC_RUNTIME_H

#include "ir/ir.h"

/* ------------------------------------------------------------------ */
/* safetensors.c                                                       */
/* ------------------------------------------------------------------ */
typedef enum { ST_F32, ST_F64, ST_BF16, ST_F16, ST_I32, ST_I64 } StDType;

typedef struct StTensor {
  char *name;
  StDType dtype;
  int rank;
  int64_t shape[IR_MAX_RANK];
  void *data;    /* nbytes of little-endian elements (malloc'd, owned) */
  size_t nbytes;
} StTensor;

typedef struct StFile {
  StTensor *t;
  int n, cap;
  /* __metadata__: string -> string pairs */
  char **meta_key, **meta_val;
  int nmeta;
  char *path; /* the file st_read read (malloc'd), for messages; NULL when built in memory */
} StFile;

void st_init(StFile *f);
void st_free(StFile *f);
const char *st_dtype_name(StDType dt);  /* "F32" */
const char *st_dtype_lower(StDType dt); /* "f32", as the IR and gradc.h spell it */
size_t st_dtype_size(StDType dt);
/* Read and validate a file (header JSON, offsets in bounds, contiguous and
 * non-overlapping, sizes match shapes).  On failure writes "FILE: reason"
 * to err and returns false. */
bool st_read(const char *path, StFile *out, char *err, size_t errlen);
/* st_read of a file already in memory; name stands for its path. */
bool st_parse(const char *name, const void *buf, size_t size, StFile *out, char *err, size_t errlen);
/* Write atomically: a temporary file in the same directory, fsync, rename. */
bool st_write(const char *path, const StFile *f, char *err, size_t errlen);
/* Add a tensor (data copied). */
StTensor *st_add(StFile *f, const char *name, StDType dt, int rank, const int64_t *shape, const void *data);
void st_set_meta(StFile *f, const char *key, const char *val);
const char *st_get_meta(const StFile *f, const char *key);
const StTensor *st_find(const StFile *f, const char *name);
int64_t st_numel(const StTensor *t);

/* ------------------------------------------------------------------ */
/* interp.c: the reference interpreter                                 */
/* ------------------------------------------------------------------ */
/* Every value is held as an array of doubles (numel elements, row-major);
 * after each op the result is rounded to its dtype (f32, bf16, f16: round
 * to nearest even; i32 and bool exact), so an f32 program computes what f32
 * hardware would up to the order of operations.  With exact_f64 no rounding
 * is done (finite-difference checks).  Plain, unfused, obviously right. */
typedef struct InterpCountPlan InterpCountPlan;
typedef struct InterpOptions {
  bool exact_f64;
  const InterpCountPlan *count; /* f's count phase (interp_count_plan_new(f)); NULL: found each run */
} InterpOptions;

typedef enum {
  INTERP_COUNT, /* evaluate only what window.sum operands and index operands need, and
                   check every index is in range (interp_index_operand) */
  INTERP_STEP,  /* evaluate everything; window.sum results come from window_sums */
} InterpPhase;

typedef struct InterpState {
  const IrFunc *f;
  double **val; /* by value id; NULL if not computed (malloc'd) */
  uint32_t rng[IR_RNG_WORDS]; /* what rng.state gives this micro-batch (the step driver sets it) */
  double loss_scale;          /* what loss.scale gives this micro-batch (step_loss_scale; 0 reads as 1) */
} InterpState;

/* Evaluate f.  args[i] holds f->args[i] (numel doubles).  In INTERP_COUNT
 * phase only ops that some window.sum depends on run (their operands must
 * not depend on params).  In INTERP_STEP, window_sums[value id] gives each
 * window.sum result (numel doubles).  Results stay in st->val until
 * interp_free.  Returns false with a message in err on a run-time error
 * (an index out of range, say). */
bool interp_run(InterpState *st, const IrFunc *f, double *const *args, double *const *window_sums,
                InterpPhase phase, const InterpOptions *opt, char *err, size_t errlen);
void interp_free(InterpState *st);
/* What the count phase of f runs, found once for the windows of a
 * program rather than by a walk over all of f's ops in each: the ops
 * that window.sum operands and index operands depend on (program order),
 * the window.sum ops, the ops whose index ranges it checks, and which of
 * f's arguments it reads (arg_needed[i] for f->args[i]). */
struct InterpCountPlan {
  int nops, nsums, nchecks;
  const IrOp **ops, **sums, **checks;
  bool *arg_needed;
};
InterpCountPlan *interp_count_plan_new(const IrFunc *f);
void interp_count_plan_free(InterpCountPlan *p);
/* The operand of op that holds indices (embedding rows, cross_entropy
 * targets, one_hot classes), or -1.  The count phase checks their ranges
 * before any micro-batch runs, so every back end rejects a bad index with
 * the same message instead of computing with it. */
int interp_index_operand(const IrOp *op);
/* The range an op's indices must lie in: [0, hi), and whether the
 * ignore_index value is let through; what names them ("target" for
 * cross_entropy's, else "index").  False for an op without indices. */
typedef struct InterpIndexRange {
  int64_t hi;
  bool ignorable;
  int64_t ignore;
  const char *what;
} InterpIndexRange;
bool interp_index_range(const IrOp *op, InterpIndexRange *r);
/* Check n indices of op's index operand, v[k] its element first + k
 * (rounded to the operand's dtype); false with the error for the first
 * out of range. */
bool interp_check_indices(const IrOp *op, const double *v, int64_t n, int64_t first, char *err, size_t errlen);

/* ------------------------------------------------------------------ */
/* window.c: what every executor does the same way in a window          */
/* ------------------------------------------------------------------ */
typedef struct StepResult {
  int nlosses;
  const char **loss_names; /* `loss` outputs in source order (program order without locations) */
  double *losses;          /* window values */
  int ngrads;
  const char **grad_names; /* params, in argument order */
  IrType *grad_types;      /* gradient type (the param's shape, f32 or f64) */
  double **grads;          /* accumulated gradients; zeros for params with no `grad` output */
  bool *dp_reduced;        /* per gradient: already summed over the data-parallel ranks by the driver
                              (the CPU executor's bucket all-reduces), so step_dp_end leaves it; NULL: none */
  /* Language v2: `output` and `update` values of the window (DESIGN.md §2).
   * An output's type is the window's (a window="concat" output's leading
   * axis holds all the window's samples, micro-batches in sample order and
   * data-parallel ranks gathered); an update's is its buffer's.  Values
   * as doubles, rounded to the output's dtype. */
  int noutputs;
  const char **output_names; /* in statement order */
  const char **output_windows; /* the op's window= ("concat", "sum", "once") */
  IrType *output_types;
  double **outputs;
  int nupdates;
  const char **update_names; /* the buffers, in statement order */
  const char **update_windows;
  IrType *update_types;
  double **updates;
} StepResult;

void step_result_free(StepResult *r);
/* Check the files against f's arguments (K >= 1; names, dtypes, window
 * shapes, I64 targets in i32 range) in the order and with the messages of
 * every back end ("FILE: tensor 'x': reason"); bound[i] gets the tensor of
 * f->args[i] (this rank's samples and shards in a distributed window). */
bool step_bind(const IrFunc *f, int gas, const StFile *params, const char *params_path, const StFile *inputs,
               const char *inputs_path, const StTensor **bound, char *err, size_t errlen);
/* "f32[784,255]": a file tensor's type in the IR's spelling ("i64" for I64). */
char *step_tensor_str(const StTensor *t, char *buf, size_t n);
/* Elements [begin, begin + n) of a bound tensor as doubles. */
void step_load(const StTensor *t, int64_t begin, int64_t n, double *out);
/* Check f's outputs (each `grad` names a param of its size) and set up r
 * for a window of gas micro-batches: loss names, gradient names and types,
 * zeroed gradients, zero losses, zeroed outputs and updates. */
bool step_result_init(const IrFunc *f, int gas, StepResult *r, char *err, size_t errlen);
/* Index in r->losses of a `loss` op, in r->grads of a `grad` op (-1: none). */
int step_loss_slot(const StepResult *r, const IrOp *loss);
int step_grad_slot(const StepResult *r, const IrOp *grad);
/* A batched input: its window tensor holds the K micro-batches (of every
 * data-parallel rank) along axis 0, and a micro-batch is a slice of it;
 * every other argument is the same whole tensor in each. */
bool step_arg_split(const IrValue *a);
/* Point args[i] at micro-batch k of each argument's window data (data[i]
 * window-sized doubles, or NULL). */
void step_micro_args(const IrFunc *f, int k, double *const *data, double **args);
/* The window sums: the count phase over each micro-batch (opt->count,
 * when given, says what it runs).  data[i] holds f->args[i] window-sized
 * (NULL where no window.sum needs it); wsum[value id] gets each
 * window.sum result (malloc'd; the caller frees). */
bool step_window_sums(const IrFunc *f, int gas, double *const *data, double **wsum, const InterpOptions *opt,
                      char *err, size_t errlen);

/* Random draws (DESIGN.md §2, Randomness; ir/random.c).  The seed and the
 * optimiser step of the windows the calling thread runs from now on (the
 * API sets them before each window; both 0 until then). */
void step_set_draws(uint64_t seed, uint64_t step);
/* rng.state's words in micro-batch k of a window of gas: the seed's two
 * halves, the step's low 32 bits and the window index of the micro-batch's
 * first sample, (dp rank * gas + k) * micro-batch size, as step_dp_slice
 * and step_micro_args hand out the samples. */
void step_rng_words(const IrFunc *f, int gas, int k, uint32_t out[IR_RNG_WORDS]);
/* Whether f has rng.state ops (executors store their words per micro-batch). */
bool step_has_rng(const IrFunc *f);
/* The f16 loss scale S (DESIGN.md §3 rule 7) that loss.scale gives in the
 * windows the calling thread runs from now on (the API sets it before
 * each window; 1 until then). */
void step_set_loss_scale(double s);
double step_loss_scale(void);
/* A test hook, GRADC_TEST_INF_STEP: whether this window's gradients
 * overflow, as an f16 backward can (the API then makes the first element
 * of the first gradient +inf before the ranks combine their windows).
 * "N" names the window of optimiser step N (the draws' step) on every
 * rank, "N:R" only on data-parallel rank R. */
bool step_inject_inf(void);

/* Elements of IR dtype dt in host memory (an arena's bytes): element i as
 * a double, x rounded to dt (ir_round_dtype) and stored. */
double rt_elem_get(const void *p, IrDType dt, int64_t i);
void rt_elem_set(void *p, IrDType dt, int64_t i, double x);
/* n elements of p as doubles into dst, the type dispatched once. */
void rt_elems_get(const void *p, IrDType dt, int64_t n, double *dst);
/* y[0, n) = x[0, n) widened (the arrays do not overlap). */
void rt_widen_f32(double *restrict y, const float *restrict x, int64_t n);
/* Whether a bound tensor's elements are dtype dt's bytes already (a plain
 * copy of *es bytes each). */
bool rt_tensor_plain(const StTensor *t, IrDType dt, int64_t *es);
/* Elements [begin, begin + n) of a bound tensor into dst, as dtype dt. */
void rt_tensor_convert(const StTensor *t, int64_t begin, int64_t n, IrDType dt, void *dst);

/* The executors of a memory-planned function (exec.c, cuda_exec.c) store
 * bytes into their arena through one of these: n bytes at an offset. */
typedef bool (*StepStoreFn)(void *ctx, int64_t offset, const void *src, size_t n, char *err, size_t errlen);
/* The consts that group-0 ops read (they live in the persistent region). */
bool step_store_consts(const IrFunc *f, StepStoreFn store, void *ctx, char *err, size_t errlen);
/* The window sums (step_window_sums over the bound tensors, by the
 * executor's count plan), each stored as its dtype where the memory plan
 * put it; with store NULL, only the index checks' verdict. */
bool step_store_window_sums(const IrFunc *f, const InterpCountPlan *count, int gas, const StTensor *const *bound,
                            StepStoreFn store, void *ctx, char *err, size_t errlen);
/* The count phase's index checks alone, for a window whose sums the step
 * computes itself: on the bound tensors, without the interpreter, when
 * every index operand is an argument (else through it).  The same errors
 * as step_store_window_sums. */
bool step_check_indices(const IrFunc *f, const InterpCountPlan *count, int gas, const StTensor *const *bound,
                        char *err, size_t errlen);
/* Each rng.state's words for micro-batch k (step_rng_words), and each
 * loss.scale's f32 value (step_loss_scale), where the plan put them. */
bool step_store_rng(const IrFunc *f, int gas, int k, StepStoreFn store, void *ctx, char *err, size_t errlen);
/* A gradient buffer of a planned function: one per param with a `grad`
 * output, where its (first) `grad` operand is stored. */
typedef struct StepGradBuf {
  int arg;        /* the param's index in f->args */
  int slot;       /* its gradient's index in a StepResult */
  int64_t offset; /* in the arena */
  int64_t numel;
  IrDType dt;     /* f32 or f64 */
} StepGradBuf;
/* f's gradient buffers in argument order (malloc'd; *n of them). */
StepGradBuf *step_grad_bufs(const IrFunc *f, int *n);
/* Add a loss's n stored elements (dtype dt), summed in order, into its window loss. */
void step_add_loss(StepResult *r, const IrOp *loss, const void *elems, IrDType dt, int64_t n);
/* An `output` or `update` op's n stored elements (dtype dt) in micro-batch
 * k of gas, combined into its window value as its window= attribute says
 * (concat: at the micro-batch's place among this data-parallel rank's
 * samples; sum: added; once: stored). */
void step_add_state(StepResult *r, const IrOp *op, int k, int gas, const void *elems, IrDType dt, int64_t n);
/* Zero the outputs and updates of a result that is filled again. */
void step_result_zero_state(StepResult *r);
/* Index of an output / update op's value in r (-1: none). */
int step_output_slot(const StepResult *r, const IrOp *op);

/* ------------------------------------------------------------------ */
/* ref/step.c: the reference interpreter's window                       */
/* ------------------------------------------------------------------ */
/* Run one window on the reference interpreter (count phase, then each
 * micro-batch in full, losses and gradients added up, one micro-batch's
 * activations alive at a time).  inputs/params: tensors by argument name
 * (window-sized inputs; batched ones are split into K micro-batches along
 * axis 0).  Errors (a missing or mistyped tensor) are "FILE: tensor 'x':
 * reason" in err. */
bool step_run_ref(const IrFunc *f, int gas, const StFile *params, const char *params_path, const StFile *inputs,
                  const char *inputs_path, const InterpOptions *opt, StepResult *out, char *err, size_t errlen);

/* ------------------------------------------------------------------ */
/* comm_step.c: what the step drivers share in a distributed window     */
/* ------------------------------------------------------------------ */
/* Tensor parallelism (docs/DISTRIBUTED.md): after `shard` a split param's
 * IR type is this rank's shard (split_ranks parts along split_axis); the
 * files, the session and StepResult hold the whole (declared) tensor. */
/* The declared type of an argument: a sharded param's whole shape. */
IrType step_arg_type(const IrValue *a);
/* Point bound[i] of each sharded param at a copy of this tp rank's part
 * (kept until step_dp_end); an error without a tensor-parallel window. */
bool step_tp_slice(const IrFunc *f, const StTensor **bound, char *err, size_t errlen);
/* All-gather the gradients of sharded params over the tp ranks: r->grads[i]
 * holds the local shard's gradient in its first elements and gets the whole
 * gradient (r->grad_types are the whole shapes). */
bool step_tp_gather(const IrFunc *f, StepResult *r, char *err, size_t errlen);

/* One collective op (X.start .. X.wait) in flight on the thread's window's
 * groups (group="tp"|"dp"), on f32 or f64 elements.  An all-gather or a
 * reduce-scatter along an axis with a non-unit extent before it goes
 * through a staging buffer (the ranks' parts are contiguous in MPI) and a
 * permute.  ranks=1 is a copy.  Zero-initialise; step_coll_free releases
 * the buffers (kept between uses) and completes a request still pending. */
struct CommReq;
typedef struct StepColl {
  struct CommReq *req; /* NULL when none is in flight */
  const IrOp *op;      /* the start */
  size_t es;           /* element size: 4 (f32) or 8 (f64) */
  void *recv;          /* where the collective writes (the start's result, or `own`) */
  char *stage, *own;   /* staging (gather: received parts; scatter: permuted send), own result */
  size_t stage_cap, own_cap;
  bool permute_out;    /* at the wait: stage -> the result, parts along the axis */
} StepColl;
/* Start op (a *.start) reading send; recv: the start's result buffer, or
 * NULL for one of the StepColl's own. */
bool step_coll_start(StepColl *c, const IrOp *op, bool f64, const void *send, void *recv, char *err, size_t errlen);
/* Make progress; *done once complete (the request stays until the wait). */
bool step_coll_test(StepColl *c, bool *done, char *err, size_t errlen);
/* Complete it and put the result into dst (the wait's result buffer). */
bool step_coll_wait(StepColl *c, void *dst, char *err, size_t errlen);
void step_coll_free(StepColl *c);
/* Whether a collective is a data-parallel gradient reduction that only
 * communicates in the window's last micro-batch (dp-reduce's last=true). */
bool step_coll_last(const IrOp *op);
/* The window's group an op names (group="tp"|"dp"), NULL with a message
 * when the window has none or its size is not the op's ranks. */
struct CommGroup *step_coll_group(const IrOp *op, char *err, size_t errlen);
/* tp.scatter, rank.slice, rank.concat: *rank = this rank in the op's group
 * (0 when ranks=1); false with a message when the window has no such group. */
bool step_rank_of(const IrOp *op, int *rank, char *err, size_t errlen);
/* The op's result for `rank` into dst (elements of es bytes; src[j]:
 * operand j, dense in its IR shape). */
void step_rank_copy(const IrOp *op, int rank, size_t es, const void *const *src, void *dst);

/* ------------------------------------------------------------------ */
/* exec.c: the CPU executor (docs/BACKEND.md)                           */
/* ------------------------------------------------------------------ */
typedef struct CpuOptions {
  int threads;           /* threads for kernels, GEMMs and the kernels' compile (--threads); 0 = pool_ncores() */
  const char *cache_dir; /* kernel object-code cache (NULL: none) */
  const char *gemm;      /* GEMM provider by name (an artifact's); NULL: the host's (runtime/cpu/gemm.h) */
} CpuOptions;

typedef struct CpuProgram CpuProgram;

/* A program for a function after the CPU pipeline (fuse, memplan): its
 * kernels compiled, its arena allocated.  f must outlive the program.
 * Returns NULL with a message in err (an unplanned function, an op the
 * executor cannot run, a code generation failure). */
CpuProgram *cpu_program_new(IrFunc *f, const CpuOptions *o, char *err, size_t errlen);
/* Run one window, with step_run_ref's checks, errors and results. */
bool cpu_step_run(CpuProgram *p, int gas, const StFile *params, const char *params_path, const StFile *inputs,
                  const char *inputs_path, StepResult *out, char *err, size_t errlen);
void cpu_program_free(CpuProgram *p);
/* The generation of the params the next cpu_step_run gets (that window
 * only): a caller that takes a new generation, unique in the process, at
 * every change to its params (set, loaded, an optimiser step) passes it;
 * a window whose params have the generation the arena's copy was made
 * from, and are the same tensors (data pointers), is not copied in again.
 * Not called, or 0: the params are copied. */
void cpu_program_set_params_gen(CpuProgram *p, uint64_t gen);
/* Hand back a result of cpu_step_run on p that the caller is done with
 * (instead of step_result_free): the next window fills its arrays again
 * rather than allocating new ones.  p keeps one; r is emptied either way. */
void cpu_program_recycle(CpuProgram *p, StepResult *r);
/* The next cpu_step_run (that window only) leaves the gradients in the
 * arena: its result has the losses, and gradients it does not fill (zeros
 * in a fresh result, a recycled one's old values), nor gathers over the tp
 * ranks.  For callers that use only the losses (gradc bench). */
void cpu_program_skip_grads(CpuProgram *p);
/* The GEMM provider the program multiplies with ("onednn", "openblas", "blis"). */
const char *cpu_program_gemm_provider(const CpuProgram *p);
/* Kernels its GEMMs run as epilogues (exec.c plan_epilogues): launches
 * the program does not make. */
int cpu_program_absorbed_kernels(const CpuProgram *p);
/* GEMMs whose pieces read a transposed A copied dense per row block
 * (exec.c gemm_schedule: bf16 on the provider's own kernels). */
int cpu_program_packed_gemms(const CpuProgram *p);
/* GEMMs whose batch runs as a few batched provider calls rather than a
 * call per matrix (exec.c gemm_group). */
int cpu_program_batched_gemms(const CpuProgram *p);
/* Matmuls that run as generated kernels (passes/kernel_bmm.c: batches of
 * small f32 products) rather than provider GEMMs. */
int cpu_program_matmul_kernels(const CpuProgram *p);
/* Pairs of generated products that run side by side, one a thread (at
 * two threads: exec.c plan_pairs). */
int cpu_program_paired_products(const CpuProgram *p);
/* Generated products into a gradient buffer that store rather than add in
 * a window's first micro-batch (their store twins: exec.c plan_zeroing),
 * whose bytes the window does not zero. */
int cpu_program_store_first_products(const CpuProgram *p);
/* Bytes of gradient buffers a window zeroes before its first micro-batch
 * (what store-first GEMMs and products do not cover; INT32_MAX at most). */
int cpu_program_zeroed_bytes(const CpuProgram *p);

/* ------------------------------------------------------------------ */
/* inputs.c                                                            */
/* ------------------------------------------------------------------ */
/* Random window-sized inputs for f's input args (batched ones get K times
 * the micro-batch): floats ~ N(0,1), integers in [0, the size of the axis
 * they index).  Tensors are appended to out. */
void rt_random_inputs(const IrFunc *f, int gas, uint64_t seed, StFile *out);
/* Whether those inputs fit in memory (checked before rt_random_inputs
 * allocates them): else false with the input and its byte count in err. */
bool rt_random_inputs_fit(const IrFunc *f, int gas, char *err, size_t errlen);

/* ------------------------------------------------------------------ */
/* init.c                                                              */
/* ------------------------------------------------------------------ */
struct FeParam;
/* Initial values of n params (in declaration order) from their `init`
 * specs, drawn from one generator seeded with seed: what `gradc init`
 * writes.  Appended to out as F32 (F64 for f64 params). */
void rt_init_params(const struct FeParam *params, int n, uint64_t seed, StFile *out);
/* Whether those params fit in memory (checked before rt_init_params
 * allocates them): else false with the param and its byte count in err. */
bool rt_init_params_fit(const struct FeParam *params, int n, char *err, size_t errlen);

#endif
