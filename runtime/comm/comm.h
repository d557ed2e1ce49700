/* comm.h - collectives between the ranks of a distributed run (DESIGN.md
 * §4 collectives, §5 "Distributed runs", §6 "Collectives";
 * docs/DISTRIBUTED.md), and the data-parallel hooks of the step layer.
 *
 * A Comm is one layout of the run's N = tp × dp ranks, tensor-parallel
 * ranks adjacent (world rank = dp_rank * tp + tp_rank), with three groups:
 * the world, the dp group (the ranks that hold the same shard: one per
 * replica) and the tp group (the shards of one replica).
 *
 * Every collective is a start, which returns a request, and a wait (or
 * polls with comm_test), so a scheduler can place compute between the two.
 * Buffers are float, double (and u64, for the order check); send == recv
 * means in place.  Each group keeps a running hash of the collectives its
 * rank issued (kind, dtype, op, count, root and the caller's tag); a step
 * ends with comm_check, which compares the hashes of every rank of the
 * group: ranks that issued different collectives get an error naming them,
 * not a hang.  Waits give up after GRADC_COMM_TIMEOUT seconds (default
 * 300), which turns a rank that never arrives into an error too.
 *
 * Back ends are tables of functions (CommBackend): "single" (one process;
 * every collective is a copy) and "mpi" (comm_mpi.c: MPI_Init_thread with
 * MPI_THREAD_MULTIPLE, MPI_Iallreduce and friends, progress by MPI_Test
 * polling in the wait).  NCCL slots in as a third table: device buffers,
 * start enqueues on a stream the group owns, test queries an event.  The
 * MPI back end is registered by the program that wants it
 * (gradc_mpi_enable(), which the command line calls), so libgradc.a does
 * not drag libmpi into programs that never run distributed.
 *
 * Errors: functions that can fail return false with a message in err. */
#ifndef GRADC_COMM_H
#define GRADC_COMM_H

#include "runtime/runtime.h"

typedef enum { COMM_F32, COMM_F64, COMM_U64 } CommDType;
typedef enum { COMM_SUM, COMM_MAX, COMM_MIN } CommOp;
typedef enum { COMM_ALL_REDUCE, COMM_ALL_GATHER, COMM_REDUCE_SCATTER, COMM_BROADCAST, COMM_BARRIER } CommKind;

/* One collective as the caller describes it and a back end runs it.
 * count is per rank:
 *   all_reduce      send, recv: count elements
 *   all_gather      send: count; recv: size * count, rank i's part at i * count
 *                   (in place: send == recv + rank * count)
 *   reduce_scatter  send: size * count; recv: count, the reduction of part rank
 *                   (in place: send == recv, the result at its start)
 *   broadcast       recv: count elements, root's on return
 *   barrier         no buffers */
typedef struct CommArgs {
  CommKind kind;
  const void *send;
  void *recv;
  int64_t count;
  CommDType dt;
  CommOp op;     /* all_reduce, reduce_scatter */
  int root;      /* broadcast */
  uint64_t tag;  /* the caller's name for it (a value id, a hashed param name) */
  bool ctl;      /* on the group's control channel (the order check), apart from data;
                  * neither traced nor slowed by the simulated link */
  const char *name; /* optional: what the trace calls it ("bucket 0", a param's name) */
} CommArgs;

/* A back end.  Group and request handles are the back end's own. */
typedef struct CommBackend {
  const char *name;
  /* Once per process (later calls return the same answer). */
  bool (*init)(int *rank, int *size, char *err, size_t n);
  /* A group of the world: ranks with equal color, ordered by key
   * (collective over the world). */
  bool (*split)(int color, int key, void **group, char *err, size_t n);
  void (*group_free)(void *group);
  /* Start a collective; *req = NULL when it completed already. */
  bool (*start)(void *group, const CommArgs *a, void **req, char *err, size_t n);
  /* Poll; on completion *done is set and the request is released. */
  bool (*test)(void *req, bool *done, char *err, size_t n);
  /* End every rank of the run now (does not return), or return when the
   * run has one rank. */
  void (*abort)(int code);
  /* Shut the back end down (init registers this to run at exit too). */
  void (*finalize)(void);
  /* Optional: test, also giving the time (monotonic clock, microseconds)
   * the back end saw the collective complete (its progress thread may see
   * it before anyone polls). */
  bool (*test_at)(void *req, bool *done, double *done_us, char *err, size_t n);
} CommBackend;

typedef struct Comm Comm;

typedef struct CommGroup {
  Comm *comm;
  const char *name; /* "world", "dp", "tp" */
  int rank, size;
  void *impl;       /* the back end's handle */
  uint64_t hash;    /* running hash of the collectives since the last comm_check */
  int64_t issued;   /* their number */
  double link_free_us; /* the simulated link's clock (comm_now_us): when the
                        * last transfer queued on this group's link ends */
} CommGroup;

struct Comm {
  const CommBackend *be;
  int rank, size;   /* in the world */
  int tp, dp;       /* size = tp * dp */
  CommGroup world, dp_group, tp_group;
  double timeout_s; /* a wait's limit */
};

typedef struct CommReq {
  CommGroup *g;
  CommArgs a;
  void *impl;       /* NULL once complete */
  /* Times on the monotonic clock (comm_now_us): the start, when the back
   * end completed it (0 until then), and the earliest completion the
   * simulated link allows (the start when there is none; else after the
   * collectives queued before it on the group's link). */
  double t0_us, done_us, ready_us;
  bool be_done;     /* the back end completed it */
  struct Trace *trace; /* the recorder current when it started (or NULL) */
  bool traced;      /* its span was recorded */
} CommReq;

/* ---- comm.c ---- */
extern const CommBackend comm_single_backend;
/* Use be for runs of more than one rank (gradc_mpi_enable registers MPI). */
void comm_register(const CommBackend *be);
/* Ranks the launcher started, from its environment (mpirun's
 * OMPI_COMM_WORLD_SIZE, PMI_SIZE); 1 when started alone.  Needs no init. */
int comm_launch_size(void);
/* This process's rank among them (OMPI_COMM_WORLD_RANK, PMI_RANK), 0 when
 * started alone.  Needs no init. */
int comm_launch_rank(void);
/* Open the layout tp × dp over the run's ranks: the single back end when
 * tp * dp == 1, else the registered one; its world must have exactly
 * tp * dp ranks.  Collective over the world (every rank opens the same
 * layouts in the same order). */
Comm *comm_open(int tp, int dp, char *err, size_t n);
void comm_close(Comm *c);
/* Shut down the back end that comm_open started (MPI_Finalize), after
 * every Comm is closed; no collective may follow.  Optional: it also runs
 * at exit. */
void comm_finalize(void);
/* End every rank of the run after an error on this one (a rank that stops
 * early would leave the others waiting): MPI_Abort when a back end with
 * more than one rank is initialised, else nothing (returns). */
void comm_abort(int code);

/* A simulated slow link between ranks, for benchmarks and tests.  Each
 * group of N > 1 ranks has one link, and the collectives started on it
 * queue there one after another, as on a real link (or a NCCL stream):
 * a collective's transfer begins at
 *     begin = max(its start, the end of the previous transfer on the link)
 * and the collective completes no earlier than
 *     begin + latency_us + bytes / bandwidth
 * (CommGroup.link_free_us is the link's clock: that end), where bytes is
 * what a ring moves per rank: 2 (N-1)/N of the buffer for all_reduce,
 * (N-1)/N of the whole buffer for all_gather and reduce_scatter, the buffer
 * for broadcast, none for a barrier.  So two all-reduces started together
 * complete one model time (comm_link_us) apart, and a bucket issued as
 * several all-reduces takes the sum of their times, not the longest.
 * The groups' links are independent (tp and dp collectives do not queue
 * behind each other).  gbps is in gigabits per second (1 Gb/s = 125 bytes per
 * microsecond); 0 means no bandwidth limit.  comm_set_link sets it for the
 * process (the command line's --link-latency-us / --link-gbps); until
 * then GRADC_COMM_LATENCY_US and GRADC_COMM_GBPS in the environment give
 * it.  Collectives finish as early as the real ones would, and comm_test
 * reports them done only from that time, so compute placed between start
 * and wait hides the delay exactly as it would hide a slow link.  The
 * control channel and one-rank groups are not slowed. */
void comm_set_link(double latency_us, double gbps);
void comm_get_link(double *latency_us, double *gbps);
/* The simulated time of a collective on g once its transfer begins,
 * latency included, not counting the time it queues behind the link's
 * earlier collectives (0 without a simulated link). */
double comm_link_us(const CommGroup *g, const CommArgs *a);
/* The monotonic clock of the comm layer and the traces, in microseconds. */
double comm_now_us(void);
/* Gather every rank's trace events into rank 0's recorder (collective over
 * g, on its control channel; times are lined up by each recorder's origin
 * on the monotonic clock, which the ranks of one machine share).  Ranks
 * other than 0 keep their own events only. */
bool comm_trace_gather(CommGroup *g, struct Trace *t, char *err, size_t n);

const char *comm_dtype_name(CommDType dt);
size_t comm_dtype_size(CommDType dt);

bool comm_start(CommGroup *g, const CommArgs *a, CommReq **out, char *err, size_t n);
bool comm_all_reduce_start(CommGroup *g, const void *send, void *recv, int64_t count, CommDType dt, CommOp op,
                           uint64_t tag, CommReq **out, char *err, size_t n);
bool comm_all_gather_start(CommGroup *g, const void *send, void *recv, int64_t count, CommDType dt, uint64_t tag,
                           CommReq **out, char *err, size_t n);
bool comm_reduce_scatter_start(CommGroup *g, const void *send, void *recv, int64_t count, CommDType dt, CommOp op,
                               uint64_t tag, CommReq **out, char *err, size_t n);
/* Poll a request: *done once it completed (the request stays valid until
 * comm_wait).  A scheduler calls it between kernels to make progress. */
bool comm_test(CommReq *r, bool *done, char *err, size_t n);
/* Complete and free a request (freed on failure too). */
bool comm_wait(CommReq *r, char *err, size_t n);
/* Blocking forms: start + wait. */
bool comm_all_reduce(CommGroup *g, const void *send, void *recv, int64_t count, CommDType dt, CommOp op, uint64_t tag,
                     char *err, size_t n);
bool comm_broadcast(CommGroup *g, void *buf, int64_t count, CommDType dt, int root, uint64_t tag, char *err, size_t n);
bool comm_barrier(CommGroup *g, char *err, size_t n);
/* Compare the running hashes of every rank of g (on its control channel)
 * and start them afresh: an error names the ranks whose collectives
 * differ.  what says where ("the step", "gradc train"). */
bool comm_check(CommGroup *g, const char *what, char *err, size_t n);
/* Whether every rank of g holds the same value v: *first_diff gets the
 * lowest rank whose value differs from rank 0's (-1: none), *v0 rank 0's
 * value and *vdiff that rank's. */
bool comm_agree(CommGroup *g, uint64_t v, int *first_diff, uint64_t *v0, uint64_t *vdiff, char *err, size_t n);

/* ---- comm_mpi.c (builds with GRADC_MPI) ---- */
#ifdef GRADC_HAVE_MPI
extern const CommBackend comm_mpi_backend;
#endif

/* ---- comm_step.c: data parallelism in the step layer ----
 *
 * A data-parallel window: every rank binds the same files, holding the
 * whole window of B samples; rank r runs samples [r*B/N, (r+1)*B/N) as its
 * K micro-batches.  The window sums are all-reduced before the first
 * micro-batch (step_window_sums), so the divisors of DESIGN.md §3 rule 2
 * count every rank; after the last micro-batch the gradients and window
 * losses are all-reduced (sum) and the collectives' order checked
 * (step_dp_end).  The step drivers (step_run_ref, cpu_step_run) see the
 * window through step_bind and step_window_sums, which consult the
 * thread's current StepDp; api_run_window brackets them with
 * step_dp_begin / step_dp_end. */
typedef struct StepDp {
  Comm *comm;
  CommGroup *g;     /* the dp group */
  StTensor *views;  /* this rank's slices of the bound batched inputs (data not owned) */
  int nviews;
} StepDp;

void step_dp_init(StepDp *d, Comm *c);
void step_dp_free(StepDp *d);
/* Make d the calling thread's data-parallel window. */
void step_dp_begin(StepDp *d);
/* End it: when r is given (the driver succeeded), all-reduce its losses and
 * gradients (gradients rounded to their dtype, as a buffer of that type
 * would hold the sum) and check the collectives' order. */
bool step_dp_end(StepDp *d, StepResult *r, char *err, size_t n);
/* Ranks of the thread's data-parallel window (1: none). */
int step_dp_size(void);
/* This process's rank in it (0: none). */
int step_dp_rank(void);
/* Point bound[i] of each batched input at this rank's slice. */
void step_dp_slice(const IrFunc *f, const StTensor **bound);
/* All-reduce the window.sum results (wsum[value id] of count's sums) over the ranks. */
bool step_dp_reduce_sums(const InterpCountPlan *count, double **wsum, char *err, size_t n);

#endif
