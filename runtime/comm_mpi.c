/* comm_mpi.c - the MPI back end of the comm layer (comm.h), for ranks that
 * are CPU processes launched by mpirun.
 *
 * init calls MPI_Init_thread asking for MPI_THREAD_MULTIPLE (unless the
 * program initialised MPI itself) and finalizes at exit; every
 * communicator returns errors instead of aborting, and every call is
 * checked.  A group is two communicators split from the world: one for
 * data collectives and one for the control channel (the order check), so
 * a check can never be matched against a stray data collective.
 * Collectives are the non-blocking MPI_Iallreduce, MPI_Iallgather,
 * MPI_Ireduce_scatter_block, MPI_Ibcast and MPI_Ibarrier; progress is
 * made by MPI_Test polling (comm_test, and comm_wait's loop): Open MPI
 * advances a non-blocking collective only inside MPI calls, so a schedule
 * that overlaps compute calls comm_test between kernels.
 *
 * Built only with GRADC_MPI; registered by gradc_mpi_enable(). */
#include <limits.h>
#include <mpi.h>
#include <stdlib.h>

#include "api_impl.h"
#include "comm.h"

static bool mpi_ok(int rc, const char *what, char *err, size_t n) {
  if (rc == MPI_SUCCESS) return true;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(rc, msg, &len) != MPI_SUCCESS) len = 0;
  msg[len] = 0;
  if (err && n) snprintf(err, n, "MPI: %s failed: %s", what, len ? msg : "unknown error");
  return false;
}

static void finalize_at_exit(void) {
  int fin = 0;
  if (MPI_Finalized(&fin) == MPI_SUCCESS && !fin) MPI_Finalize();
}

static bool mpi_init(int *rank, int *size, char *err, size_t n) {
  int inited = 0, provided = 0;
  if (!mpi_ok(MPI_Initialized(&inited), "MPI_Initialized", err, n)) return false;
  if (!inited) {
    int fin = 0;
    MPI_Finalized(&fin);
    if (fin) {
      if (err && n) snprintf(err, n, "MPI: cannot start again after MPI_Finalize");
      return false;
    }
    if (!mpi_ok(MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &provided), "MPI_Init_thread", err, n)) return false;
    atexit(finalize_at_exit);
  } else if (!mpi_ok(MPI_Query_thread(&provided), "MPI_Query_thread", err, n)) {
    return false;
  }
  /* Collectives are issued by one thread at a time (the step's). */
  if (provided < MPI_THREAD_SERIALIZED) {
    if (err && n)
      snprintf(err, n, "MPI: the library provides thread level %d; gradc needs MPI_THREAD_SERIALIZED or above", provided);
    return false;
  }
  return mpi_ok(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler", err, n) &&
         mpi_ok(MPI_Comm_rank(MPI_COMM_WORLD, rank), "MPI_Comm_rank", err, n) &&
         mpi_ok(MPI_Comm_size(MPI_COMM_WORLD, size), "MPI_Comm_size", err, n);
}

typedef struct MpiGroup {
  MPI_Comm data, ctl;
} MpiGroup;

static void mpi_group_free(void *group) {
  MpiGroup *g = group;
  int fin = 0;
  MPI_Finalized(&fin);
  if (!fin) {
    if (g->data != MPI_COMM_NULL) MPI_Comm_free(&g->data);
    if (g->ctl != MPI_COMM_NULL) MPI_Comm_free(&g->ctl);
  }
  free(g);
}

static bool mpi_split(int color, int key, void **group, char *err, size_t n) {
  MpiGroup *g = calloc(1, sizeof *g);
  if (!g) abort();
  g->data = g->ctl = MPI_COMM_NULL;
  bool ok = mpi_ok(MPI_Comm_split(MPI_COMM_WORLD, color, key, &g->data), "MPI_Comm_split", err, n) &&
            mpi_ok(MPI_Comm_dup(g->data, &g->ctl), "MPI_Comm_dup", err, n) &&
            mpi_ok(MPI_Comm_set_errhandler(g->data, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler", err, n) &&
            mpi_ok(MPI_Comm_set_errhandler(g->ctl, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler", err, n);
  if (!ok) {
    mpi_group_free(g);
    return false;
  }
  *group = g;
  return true;
}

static MPI_Datatype mpi_dtype(CommDType dt) {
  switch (dt) {
  case COMM_F32: return MPI_FLOAT;
  case COMM_F64: return MPI_DOUBLE;
  case COMM_U64: return MPI_UINT64_T;
  }
  return MPI_DATATYPE_NULL;
}

static MPI_Op mpi_op(CommOp op) {
  switch (op) {
  case COMM_SUM: return MPI_SUM;
  case COMM_MAX: return MPI_MAX;
  case COMM_MIN: return MPI_MIN;
  }
  return MPI_OP_NULL;
}

static bool mpi_start(void *group, const CommArgs *a, void **req, char *err, size_t n) {
  MpiGroup *g = group;
  MPI_Comm comm = a->ctl ? g->ctl : g->data;
  if (a->count > INT_MAX) {
    if (err && n) snprintf(err, n, "MPI: a collective of %lld elements is over MPI's limit of %d", (long long)a->count, INT_MAX);
    return false;
  }
  int count = (int)a->count, rank = 0;
  MPI_Datatype dt = mpi_dtype(a->dt);
  MPI_Request *r = malloc(sizeof *r);
  if (!r) abort();
  int rc = MPI_SUCCESS;
  const char *what = "";
  switch (a->kind) {
  case COMM_ALL_REDUCE:
    what = "MPI_Iallreduce";
    rc = MPI_Iallreduce(a->send == a->recv ? MPI_IN_PLACE : a->send, a->recv, count, dt, mpi_op(a->op), comm, r);
    break;
  case COMM_ALL_GATHER: {
    what = "MPI_Iallgather";
    rc = MPI_Comm_rank(comm, &rank);
    const char *mine = (const char *)a->recv + (size_t)rank * (size_t)count * comm_dtype_size(a->dt);
    if (rc == MPI_SUCCESS)
      rc = MPI_Iallgather(a->send == mine ? MPI_IN_PLACE : a->send, count, dt, a->recv, count, dt, comm, r);
    break;
  }
  case COMM_REDUCE_SCATTER:
    what = "MPI_Ireduce_scatter_block";
    rc = MPI_Ireduce_scatter_block(a->send == a->recv ? MPI_IN_PLACE : a->send, a->recv, count, dt, mpi_op(a->op),
                                   comm, r);
    break;
  case COMM_BROADCAST:
    what = "MPI_Ibcast";
    rc = MPI_Ibcast(a->recv, count, dt, a->root, comm, r);
    break;
  case COMM_BARRIER:
    what = "MPI_Ibarrier";
    rc = MPI_Ibarrier(comm, r);
    break;
  }
  if (!mpi_ok(rc, what, err, n)) {
    free(r);
    return false;
  }
  *req = r;
  return true;
}

static bool mpi_test(void *req, bool *done, char *err, size_t n) {
  MPI_Request *r = req;
  int flag = 0;
  if (!mpi_ok(MPI_Test(r, &flag, MPI_STATUS_IGNORE), "MPI_Test", err, n)) return false;
  *done = flag != 0;
  if (flag) free(r);
  return true;
}

static void mpi_abort(int code) {
  int inited = 0, fin = 0, size = 1;
  MPI_Initialized(&inited);
  MPI_Finalized(&fin);
  if (!inited || fin) return;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (size > 1) MPI_Abort(MPI_COMM_WORLD, code);
}

const CommBackend comm_mpi_backend = {
    .name = "mpi",
    .init = mpi_init,
    .split = mpi_split,
    .group_free = mpi_group_free,
    .start = mpi_start,
    .test = mpi_test,
    .abort = mpi_abort,
    .finalize = finalize_at_exit,
};

gradc_status gradc_mpi_enable(void) {
  comm_register(&comm_mpi_backend);
  return GRADC_OK;
}
