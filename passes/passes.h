/* passes.h - the pass manager and every pass over the IR.
 *
 * A pass is one function in one file: it rewrites an IrFunc and returns
 * PASS_CHANGED, PASS_UNCHANGED or PASS_ERROR (a user error, reported through
 * opts->diag: a loss gas-fold cannot split, say).  Passes never print; the
 * pass manager dumps, verifies and times. */
#ifndef GRADC_PASSES_H
#define GRADC_PASSES_H

#include "ir/ir.h"

typedef enum { PASS_UNCHANGED = 0, PASS_CHANGED = 1, PASS_ERROR = -1 } PassResult;

typedef struct PassOptions {
  int gas;             /* K: micro-batches per window (>= 1) */
  Diag *diag;          /* user errors */
  const SrcFile *src;  /* the model source, for located errors (may be NULL) */
  /* Distributed runs (docs/DISTRIBUTED.md); zero-initialised means one process. */
  int tp;                 /* --tp: tensor-parallel ranks (0 or 1: none) */
  int dp;                 /* --dp: data-parallel ranks (0 or 1: none) */
  bool sequence_parallel; /* --sequence-parallel */
  bool no_overlap;        /* --no-overlap: schedule keeps collectives where they are issued */
  int64_t bucket_bytes;   /* dp-reduce bucket cap in bytes (0: the default) */
  bool zero1;             /* --zero1: the runtime reduce-scatters the gradients after the window (ZeRO-1),
                             so dp-reduce inserts no all-reduces */
  bool no_inplace;        /* memplan: no kernel writes an output over a dying operand (the CUDA
                             generator's kernels do not order their loads for it) */
  bool no_colsums;        /* fuse: no row kernel sums a column over a group of rows (KP_ROW_COLSUM: the CUDA
                             generator's row kernels do not); split-reductions splits no column sums */
  IrDType precision;      /* --precision: IR_DT_BF16 or IR_DT_F16 casts f32 GEMMs down (autocast, gas-fold's
                             loss scale for f16); zero or IR_DT_F32: f32 throughout */
} PassOptions;

typedef PassResult (*PassFn)(IrFunc *f, const PassOptions *o, Arena *scratch);

typedef struct Pass {
  const char *name;  /* as in --passes= and --print-ir-after= */
  PassFn run;
  const char *needs; /* passes that must run before it, comma-separated, in order (NULL: none) */
  const char *what;  /* one line for `gradc help` */
} Pass;

/* passmgr.c */
const Pass *pass_lookup(const char *name);
const Pass *pass_list(int *n);                    /* every registered pass */
const char *const *pass_pipeline(int *n);         /* the default pipeline, in order */
/* The CPU back end's pipeline (docs/BACKEND.md, docs/IR.md): the default
 * one with the rewrites before fuse and fuse ahead of schedule, and the
 * rewrites before memplan and memplan after it. */
const char *const *pass_pipeline_cpu(int *n);

typedef struct PassManager {
  const char *print_before; /* pass name, "all", or NULL */
  const char *print_after;
  FILE *dump_out;           /* where dumps go (stderr for compile, stdout for opt) */
  bool verify;              /* run the verifier after every pass */
  bool time_passes;
  double ms[64];            /* per-pass time of the last run */
} PassManager;

void pm_init(PassManager *pm);
/* Run passes by name.  A pass's `needs` that the list does not name
 * before it run first, just before it, as passes of their own (dumped,
 * verified and timed like the others): `--passes=memplan` runs the
 * gradient rewrites memplan needs, then memplan.  Returns 0 on success, 1
 * on a user error (reported through o->diag), 2 on an internal error (a
 * verifier failure: the IR is dumped and the pass named on stderr). */
int pm_run(PassManager *pm, IrFunc *f, const char *const *names, int n, const PassOptions *o);

/* One function per pass (each in its own file). */
PassResult pass_dce(IrFunc *f, const PassOptions *o, Arena *scratch);
PassResult pass_cse(IrFunc *f, const PassOptions *o, Arena *scratch);
PassResult pass_simplify(IrFunc *f, const PassOptions *o, Arena *scratch);
PassResult pass_gas_fold(IrFunc *f, const PassOptions *o, Arena *scratch);
/* autocast.c: --precision bf16|f16: f32 matmuls in the low type, everything else f32. */
PassResult pass_autocast(IrFunc *f, const PassOptions *o, Arena *scratch);
PassResult pass_autodiff(IrFunc *f, const PassOptions *o, Arena *scratch);
/* The rewrites before fuse (fuse needs them: the shapes its grouping is made for). */
PassResult pass_weight_grad_gemm(IrFunc *f, const PassOptions *o, Arena *scratch);     /* weight_grad_gemm.c */
PassResult pass_unslice_concat(IrFunc *f, const PassOptions *o, Arena *scratch);       /* unslice_concat.c */
PassResult pass_split_reductions(IrFunc *f, const PassOptions *o, Arena *scratch);     /* split_reductions.c */
PassResult pass_split_cross_entropy(IrFunc *f, const PassOptions *o, Arena *scratch);  /* split_cross_entropy.c */
PassResult pass_split_draws(IrFunc *f, const PassOptions *o, Arena *scratch);           /* split_draws.c */
PassResult pass_fuse(IrFunc *f, const PassOptions *o, Arena *scratch);
/* shard.c: split(N) params over --tp ranks, collectives inserted (docs/DISTRIBUTED.md). */
PassResult pass_shard(IrFunc *f, const PassOptions *o, Arena *scratch);
/* dp_reduce.c: gradients all-reduced over --dp ranks in buckets, in the window's last micro-batch. */
PassResult pass_dp_reduce(IrFunc *f, const PassOptions *o, Arena *scratch);
/* schedule.c: collectives' starts early, waits late, by a cost model. */
PassResult pass_schedule(IrFunc *f, const PassOptions *o, Arena *scratch);
/* The rewrites before memplan (memplan needs them: the gradient buffers
 * and the movement ops as the executor runs them). */
PassResult pass_ungroup_dp_slices(IrFunc *f, const PassOptions *o, Arena *scratch); /* ungroup_dp_slices.c */
PassResult pass_split_grad_sums(IrFunc *f, const PassOptions *o, Arena *scratch);   /* split_grad_sums.c */
PassResult pass_grad_unslices(IrFunc *f, const PassOptions *o, Arena *scratch);     /* grad_unslices.c */
PassResult pass_grad_copies(IrFunc *f, const PassOptions *o, Arena *scratch);       /* grad_copies.c */
PassResult pass_movement_kernels(IrFunc *f, const PassOptions *o, Arena *scratch);  /* movement_kernels.c */
/* memplan.c: arena offsets for every stored value (docs/BACKEND.md); CPU pipeline only. */
PassResult pass_memplan(IrFunc *f, const PassOptions *o, Arena *scratch);

/* ------------------------------------------------------------------ */
/* rewrite.c: helpers of the rewriting passes                          */
/* ------------------------------------------------------------------ */
/* Move the ops appended since index `from` (at the end of the list) to
 * index `at`, shifting the ops from `at` on after them. */
void rw_splice(IrFunc *f, int at, int from);
/* A permute that swaps the last two axes and keeps the others (a matrix
 * transpose); false for NULL. */
bool rw_is_transpose(const IrOp *op);

/* ------------------------------------------------------------------ */
/* plan.c: the executor's model that memplan and its rewrites share    */
/* ------------------------------------------------------------------ */
/* What a group-0 op is to the executor (docs/BACKEND.md). */
typedef enum {
  PLAN_EXEC_GEMM,    /* matmul: the BLAS */
  PLAN_EXEC_ALIAS,   /* reshape: no work, shares its operand's bytes */
  PLAN_EXEC_CONST,   /* inlined into kernels, stored only when a group-0 op reads it */
  PLAN_EXEC_WSUM,    /* window.sum, rng.state: written by the executor before the micro-batches (each) */
  PLAN_EXEC_LOSS,    /* loss: read by the executor */
  PLAN_EXEC_GRAD,    /* grad: accumulated in place by its producer */
  PLAN_EXEC_COPY,    /* collectives (one rank: a copy) */
  PLAN_EXEC_PERMUTE, /* a transpose, when it can be a GEMM flag; else unfused */
  PLAN_EXEC_UNFUSED, /* anything else: a kernel of one op */
} PlanExec;
PlanExec plan_exec_kind(IrOpcode opc);
bool plan_group0_reshape(const IrOp *op);
/* A group-0 slice (unslice) of one contiguous range of its operand
 * (result): an alias at an offset; *first: the range's first element. */
bool plan_range_slice(const IrOp *op, int64_t *first);
bool plan_range_unslice(const IrOp *op, int64_t *first);
/* A data-parallel gradient reduction (dp-reduce's last=true all-reduce
 * start or wait): it lives in the param's gradient buffer with its
 * operand, reduced in place after the window's last contribution. */
bool plan_last_coll(const IrOp *op);
/* The next value down a gradient's chain from its `grad` to its producer,
 * all in the gradient buffer: through group-0 reshapes, range unslices and
 * last=true reductions; NULL at the producer. */
IrValue *plan_grad_next(const IrValue *v);
/* Whether `grad` operand v can be the gradient buffer itself: nothing but
 * the chain reads any value of its chain, and the producer at its end can
 * accumulate (a kernel, a GEMM, an unfused compute op).  uses: operand
 * counts by value id. */
bool plan_grad_in_place(const IrValue *v, const int *uses);
/* By value id: a group-0 transpose read only by group-0 GEMMs, which
 * becomes a transpose flag of those GEMMs (no storage). */
bool *plan_gemm_flags(const IrFunc *f, Arena *scratch);
/* Ops outside kernels, for kp_views_find. */
bool plan_in_group0(const IrOp *op, void *ctx);

/* ------------------------------------------------------------------ */
/* cost.c: the cost model of `schedule` and a simulation of a step      */
/* ------------------------------------------------------------------ */
/* One rank's machine: compute is a roofline (FLOPs against a rate, bytes
 * against a memory bandwidth, plus a fixed cost per kernel); a collective
 * moves the bytes of a ring algorithm over a link with a bandwidth and a
 * latency.  Collectives of one group run one after another on that group's
 * link, concurrently with compute. */
typedef struct CostModel {
  double flops_per_s;      /* compute throughput */
  double mem_bytes_per_s;  /* memory bandwidth of compute */
  double kernel_s;         /* fixed cost of each kernel (or unfused op) */
  double link_bytes_per_s; /* bytes per second a rank sends over its link */
  double link_latency_s;   /* per collective (one per coalesced dp bucket) */
} CostModel;

/* Defaults: a few-core CPU rank on a 10 Gb/s link with 20 us latency. */
void cost_model_default(CostModel *m);
/* Floating-point operations of one op (0 for views, outputs, collectives). */
double cost_op_flops(const IrOp *op);
/* escapes[value id]: the value is read by an op outside its defining
 * kernel, or is an output's operand (so a kernel writes it to memory).
 * escapes: f->nvalues bools, caller-owned. */
void cost_escapes(const IrFunc *f, bool *escapes);
/* Seconds of one unit of compute: ops[0..n) are one kernel (contiguous ops
 * of one group) or a single op.  escapes as from cost_escapes (NULL: every
 * result is written). */
double cost_compute_s(const CostModel *m, IrOp *const *ops, int n, const bool *escapes);
/* Bytes a rank sends for a collective start (ring algorithm; 0 for ranks=1). */
double cost_collective_bytes(const IrOp *start);
/* Seconds of a collective start on its link; with_latency false for the
 * second and later starts of a coalesced dp bucket. */
double cost_collective_s(const CostModel *m, const IrOp *start, bool with_latency);

/* The simulation of one pass over f in its op order (a micro-batch in which
 * every collective communicates: the window's last). */
typedef struct CostSim {
  double step_s;    /* when the last op ends */
  double compute_s; /* sum of compute */
  double comm_s;    /* sum of collective durations */
  double exposed_s; /* time compute waited for communication */
  int ncollectives; /* starts (a coalesced dp bucket counts once) */
} CostSim;
/* overlap: collectives run between start and wait as scheduled; false:
 * every start blocks until its collective completes (no overlap). */
void cost_simulate(const IrFunc *f, const CostModel *m, bool overlap, CostSim *out);
/* Both simulations, a few lines: compute, comm, step time, exposed
 * communication and the fraction hidden. */
void cost_report(const IrFunc *f, const CostModel *m, FILE *out);

/* ------------------------------------------------------------------ */
/* autodiff.c / autodiff_rules.c: the derivative rules' interface      */
/* ------------------------------------------------------------------ */
/* Reverse mode walks the forward ops backwards; for each op whose result
 * has a gradient, the op's rule (the `derivative` column of ops.def) emits
 * IR computing the operands' gradient contributions and hands each to
 * ad_accum.  Rules emit with ir_* builders at op->loc. */
typedef struct AdCtx AdCtx;
typedef void (*AdGradFn)(AdCtx *ad, IrOp *op, IrValue *dy);

/* Add `contribution` to the gradient of `x` (summing fan-out).  Ignores x
 * that cannot carry a gradient (integer or bool values).  contribution must
 * have x's type. */
void ad_accum(AdCtx *ad, IrValue *x, IrValue *contribution);
/* The function being differentiated (emit into it). */
IrFunc *ad_func(AdCtx *ad);
/* Whether x (a forward value) depends on a float param through
 * differentiable ops, i.e. whether a contribution to it is used at all;
 * rules skip operands that do not, so no dead backward is emitted. */
bool ad_needs_grad(const AdCtx *ad, const IrValue *x);

#define OP(id, name, arity, kind, family, shape, grad, flags) void ad_grad_##grad(AdCtx *ad, IrOp *op, IrValue *dy);
#include "ir/ops.def"
#undef OP

#endif
