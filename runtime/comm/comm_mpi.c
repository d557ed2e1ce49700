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
 * MPI_Ireduce_scatter_block, MPI_Ibcast and MPI_Ibarrier.
 *
 * Progress.  Open MPI advances a non-blocking collective only inside MPI
 * calls.  When the library grants MPI_THREAD_MULTIPLE (and we initialised
 * it), a progress thread MPI_Tests the outstanding requests every
 * GRADC_COMM_POLL_US microseconds (default 20; it sleeps on a condition
 * variable while none is outstanding), so collectives advance while the
 * step's thread runs kernels; the step's comm_test then only reads a flag
 * the progress thread set (with the time it saw the completion).  The
 * request list is the progress thread's: a start appends under its lock,
 * the progress thread unlinks a request before it marks it done (a release
 * store), and the owner frees it only after seeing the mark, so neither
 * touches a request the other may be using.  With MPI_THREAD_SERIALIZED,
 * or GRADC_COMM_PROGRESS=0, there is no thread and comm_test / comm_wait
 * poll with MPI_Test themselves.
 *
 * Built only with GRADC_MPI; registered by gradc_mpi_enable() (api/api_mpi.c). */
#include <limits.h>
#include <mpi.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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

/* A request: the MPI request, and what the progress thread reports. */
typedef struct MpiReq {
  MPI_Request req;
  atomic_int done;     /* set (release) by the progress thread, after it unlinked the request */
  int rc;              /* MPI_Test's error, if it failed */
  double done_us;      /* when the progress thread saw it complete */
  struct MpiReq *next; /* in the progress thread's list */
} MpiReq;

static struct {
  bool on;             /* the thread runs */
  bool stop;
  pthread_t th;
  pthread_mutex_t lock;
  pthread_cond_t wake;
  MpiReq *list;        /* outstanding requests (the lock's) */
  long poll_ns;
} progress = {.lock = PTHREAD_MUTEX_INITIALIZER, .wake = PTHREAD_COND_INITIALIZER};

static double mono_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec * 1e-3;
}

static void *progress_main(void *arg) {
  pthread_mutex_lock(&progress.lock);
  while (!progress.stop) {
    if (!progress.list) {
      pthread_cond_wait(&progress.wake, &progress.lock);
      continue;
    }
    for (MpiReq **pp = &progress.list; *pp;) {
      MpiReq *r = *pp;
      int flag = 0, rc = MPI_Test(&r->req, &flag, MPI_STATUS_IGNORE);
      if (rc != MPI_SUCCESS || flag) {
        *pp = r->next;
        r->rc = rc;
        r->done_us = mono_us();
        atomic_store_explicit(&r->done, 1, memory_order_release);
      } else {
        pp = &r->next;
      }
    }
    /* Sleep between sweeps (not holding the lock), leaving the cores to compute. */
    pthread_mutex_unlock(&progress.lock);
    struct timespec ts = {0, progress.poll_ns};
    nanosleep(&ts, NULL);
    pthread_mutex_lock(&progress.lock);
  }
  pthread_mutex_unlock(&progress.lock);
  return NULL;
}

static void progress_start(void) {
  const char *v = getenv("GRADC_COMM_PROGRESS");
  if (v && strcmp(v, "0") == 0) return;
  const char *p = getenv("GRADC_COMM_POLL_US");
  long us = p ? strtol(p, NULL, 10) : 20;
  progress.poll_ns = (us >= 1 && us <= 100000 ? us : 20) * 1000;
  progress.stop = false;
  progress.on = pthread_create(&progress.th, NULL, progress_main, NULL) == 0;
}

static void progress_stop(void) {
  if (!progress.on) return;
  pthread_mutex_lock(&progress.lock);
  progress.stop = true;
  pthread_cond_signal(&progress.wake);
  pthread_mutex_unlock(&progress.lock);
  pthread_join(progress.th, NULL);
  progress.on = false;
}

static void finalize_at_exit(void) {
  progress_stop();
  int fin = 0;
  if (MPI_Finalized(&fin) == MPI_SUCCESS && !fin) MPI_Finalize();
}

static bool mpi_init(int *rank, int *size, char *err, size_t n) {
  int inited = 0, provided = 0;
  bool mine = false;
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
    mine = true;
  } else if (!mpi_ok(MPI_Query_thread(&provided), "MPI_Query_thread", err, n)) {
    return false;
  }
  /* Collectives are issued by one thread at a time (the step's). */
  if (provided < MPI_THREAD_SERIALIZED) {
    if (err && n)
      snprintf(err, n, "MPI: the library provides thread level %d; gradc needs MPI_THREAD_SERIALIZED or above", provided);
    return false;
  }
  bool ok = mpi_ok(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler", err, n) &&
            mpi_ok(MPI_Comm_rank(MPI_COMM_WORLD, rank), "MPI_Comm_rank", err, n) &&
            mpi_ok(MPI_Comm_size(MPI_COMM_WORLD, size), "MPI_Comm_size", err, n);
  /* A progress thread only where MPI allows calls from two threads at
   * once, and only when MPI is ours to finalize (the thread must stop
   * first). */
  if (ok && mine && provided >= MPI_THREAD_MULTIPLE && !progress.on) progress_start();
  return ok;
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
  MpiReq *m = calloc(1, sizeof *m);
  if (!m) abort();
  MPI_Request *r = &m->req;
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
    free(m);
    return false;
  }
  if (progress.on) {
    pthread_mutex_lock(&progress.lock);
    m->next = progress.list;
    progress.list = m;
    pthread_cond_signal(&progress.wake);
    pthread_mutex_unlock(&progress.lock);
  }
  *req = m;
  return true;
}

static bool mpi_test_at(void *req, bool *done, double *done_us, char *err, size_t n) {
  MpiReq *m = req;
  int flag = 0;
  *done = false;
  if (progress.on) {
    if (!atomic_load_explicit(&m->done, memory_order_acquire)) return true;
    *done_us = m->done_us;
    bool ok = mpi_ok(m->rc, "MPI_Test", err, n);
    free(m);
    *done = ok;
    return ok;
  }
  if (!mpi_ok(MPI_Test(&m->req, &flag, MPI_STATUS_IGNORE), "MPI_Test", err, n)) return false;
  *done = flag != 0;
  if (flag) {
    *done_us = mono_us();
    free(m);
  }
  return true;
}

static bool mpi_test(void *req, bool *done, char *err, size_t n) {
  double at;
  return mpi_test_at(req, done, &at, err, n);
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
    .test_at = mpi_test_at,
};
