/* comm.c - the back-end-independent half of the comm layer (comm.h):
 * opening a tp × dp layout and its groups, checking and starting
 * collectives, the running hash of the collectives each rank issued and
 * its comparison across ranks, waits with a time limit, and the single
 * back end (one process: every collective is a copy). */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "api_impl.h"
#include "comm.h"

static bool fail(char *err, size_t n, const char *fmt, ...) GRADC_PRINTF(3, 4);
static bool fail(char *err, size_t n, const char *fmt, ...) {
  if (err && n) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, n, fmt, ap);
    va_end(ap);
  }
  return false;
}

static void *xcalloc(size_t n, size_t size) {
  void *p = calloc(n ? n : 1, size);
  if (!p) abort();
  return p;
}

/* ------------------------------------------------------------------ */
/* The single back end                                                  */
/* ------------------------------------------------------------------ */

static bool single_init(int *rank, int *size, char *err, size_t n) {
  *rank = 0;
  *size = 1;
  return true;
}

static bool single_split(int color, int key, void **group, char *err, size_t n) {
  *group = NULL;
  return true;
}

static void single_group_free(void *group) {}

/* With one rank every collective leaves recv holding send. */
static bool single_start(void *group, const CommArgs *a, void **req, char *err, size_t n) {
  *req = NULL;
  size_t bytes = (size_t)a->count * comm_dtype_size(a->dt);
  switch (a->kind) {
  case COMM_ALL_REDUCE:
  case COMM_ALL_GATHER:
  case COMM_REDUCE_SCATTER:
    if (a->send != a->recv && bytes) memmove(a->recv, a->send, bytes);
    break;
  case COMM_BROADCAST:
  case COMM_BARRIER: break;
  }
  return true;
}

static bool single_test(void *req, bool *done, char *err, size_t n) {
  *done = true;
  return true;
}

static void single_abort(int code) {}

static void single_finalize(void) {}

const CommBackend comm_single_backend = {
    .name = "single",
    .init = single_init,
    .split = single_split,
    .group_free = single_group_free,
    .start = single_start,
    .test = single_test,
    .abort = single_abort,
    .finalize = single_finalize,
};

/* ------------------------------------------------------------------ */
/* Back ends and layouts                                               */
/* ------------------------------------------------------------------ */

static const CommBackend *registered;   /* for runs of more than one rank */
static const CommBackend *initialised;  /* the back end whose init ran, if any */
static int world_size = 1;

void comm_register(const CommBackend *be) { registered = be; }

#ifndef GRADC_HAVE_MPI
/* Without MPI the public switch only reports that (comm_mpi.c has the real one). */
gradc_status gradc_mpi_enable(void) {
  return api_fail(GRADC_ERR_USER, "gradc: error: this build has no MPI (configure with -DGRADC_MPI=ON and "
                                  "libopenmpi-dev installed)");
}
#endif

int comm_launch_size(void) {
  static const char *const vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE"};
  for (size_t i = 0; i < sizeof vars / sizeof *vars; i++) {
    const char *v = getenv(vars[i]);
    if (v && *v) {
      long n = strtol(v, NULL, 10);
      if (n >= 1) return (int)n;
    }
  }
  return 1;
}

const char *comm_dtype_name(CommDType dt) {
  switch (dt) {
  case COMM_F32: return "f32";
  case COMM_F64: return "f64";
  case COMM_U64: return "u64";
  }
  return "?";
}

size_t comm_dtype_size(CommDType dt) {
  switch (dt) {
  case COMM_F32: return 4;
  case COMM_F64: return 8;
  case COMM_U64: return 8;
  }
  return 0;
}

static const char *kind_name(CommKind k) {
  switch (k) {
  case COMM_ALL_REDUCE: return "all_reduce";
  case COMM_ALL_GATHER: return "all_gather";
  case COMM_REDUCE_SCATTER: return "reduce_scatter";
  case COMM_BROADCAST: return "broadcast";
  case COMM_BARRIER: return "barrier";
  }
  return "?";
}

static double timeout_from_env(void) {
  const char *v = getenv("GRADC_COMM_TIMEOUT");
  char *end;
  double t = v ? strtod(v, &end) : 0;
  return v && end != v && t > 0 ? t : 300.0;
}

static bool open_group(Comm *c, CommGroup *g, const char *name, int color, int key, char *err, size_t n) {
  g->comm = c;
  g->name = name;
  g->hash = HASH_SEED;
  if (!c->be->split(color, key, &g->impl, err, n)) return false;
  return true;
}

Comm *comm_open(int tp, int dp, char *err, size_t n) {
  if (tp < 1 || dp < 1) {
    fail(err, n, "tp and dp must be at least 1 (got tp %d, dp %d)", tp, dp);
    return NULL;
  }
  int want = tp * dp;
  const CommBackend *be = want == 1 ? &comm_single_backend : registered;
  if (!be) {
#ifdef GRADC_HAVE_MPI
    fail(err, n, "%s needs %d ranks, but this program did not enable MPI (gradc_mpi_enable)",
         tp > 1 ? "--tp" : "--dp", want);
#else
    fail(err, n, "%s %d needs several processes, but this build has no MPI (configure with -DGRADC_MPI=ON and "
         "libopenmpi-dev installed)", tp > 1 ? "--tp" : "--dp", tp > 1 ? tp : dp);
#endif
    return NULL;
  }
  Comm *c = xcalloc(1, sizeof *c);
  c->be = be;
  c->tp = tp;
  c->dp = dp;
  c->timeout_s = timeout_from_env();
  if (!be->init(&c->rank, &c->size, err, n)) {
    free(c);
    return NULL;
  }
  initialised = be;
  world_size = c->size;
  if (c->size != want) {
    if (tp == 1)
      fail(err, n, "--dp %d needs %d ranks (launch it with mpirun -np %d); this run has %d", dp, dp, dp, c->size);
    else
      fail(err, n, "--tp %d x --dp %d needs %d ranks (launch it with mpirun -np %d); this run has %d", tp, dp, want,
           want, c->size);
    free(c);
    return NULL;
  }
  /* Tensor-parallel ranks adjacent: world rank = dp_rank * tp + tp_rank. */
  int tp_rank = c->rank % tp, dp_rank = c->rank / tp;
  bool ok = open_group(c, &c->world, "world", 0, c->rank, err, n) &&
            open_group(c, &c->dp_group, "dp", tp_rank, dp_rank, err, n) &&
            open_group(c, &c->tp_group, "tp", dp_rank, tp_rank, err, n);
  if (!ok) {
    comm_close(c);
    return NULL;
  }
  c->world.rank = c->rank;
  c->world.size = c->size;
  c->dp_group.rank = dp_rank;
  c->dp_group.size = dp;
  c->tp_group.rank = tp_rank;
  c->tp_group.size = tp;
  return c;
}

void comm_close(Comm *c) {
  if (!c) return;
  CommGroup *gs[3] = {&c->world, &c->dp_group, &c->tp_group};
  for (int i = 0; i < 3; i++)
    if (gs[i]->impl) c->be->group_free(gs[i]->impl);
  free(c);
}

void comm_finalize(void) {
  if (initialised) initialised->finalize();
}

void comm_abort(int code) {
  if (initialised && world_size > 1) initialised->abort(code);
}

/* ------------------------------------------------------------------ */
/* Collectives                                                          */
/* ------------------------------------------------------------------ */

static uint64_t mix(uint64_t h, uint64_t v) { return hash_bytes(&v, sizeof v, h); }

bool comm_start(CommGroup *g, const CommArgs *a, CommReq **out, char *err, size_t n) {
  *out = NULL;
  if (a->count < 0) return fail(err, n, "%s over '%s': negative count %lld", kind_name(a->kind), g->name, (long long)a->count);
  if (a->kind == COMM_BROADCAST && (a->root < 0 || a->root >= g->size))
    return fail(err, n, "broadcast over '%s': root %d is not a rank of the group (size %d)", g->name, a->root, g->size);
  if (a->kind != COMM_BARRIER && a->count > 0 && (!a->recv || (a->kind != COMM_BROADCAST && !a->send)))
    return fail(err, n, "%s over '%s': no buffer", kind_name(a->kind), g->name);
  if (!a->ctl) {
    uint64_t h = g->hash;
    h = mix(h, (uint64_t)a->kind);
    h = mix(h, (uint64_t)a->dt);
    h = mix(h, (uint64_t)a->count);
    h = mix(h, a->kind == COMM_ALL_REDUCE || a->kind == COMM_REDUCE_SCATTER ? (uint64_t)a->op : 0);
    h = mix(h, a->kind == COMM_BROADCAST ? (uint64_t)a->root : 0);
    h = mix(h, a->tag);
    g->hash = h;
    g->issued++;
  }
  void *impl = NULL;
  if (!g->comm->be->start(g->impl, a, &impl, err, n)) return false;
  CommReq *r = xcalloc(1, sizeof *r);
  r->g = g;
  r->a = *a;
  r->impl = impl;
  *out = r;
  return true;
}

bool comm_all_reduce_start(CommGroup *g, const void *send, void *recv, int64_t count, CommDType dt, CommOp op,
                           uint64_t tag, CommReq **out, char *err, size_t n) {
  CommArgs a = {.kind = COMM_ALL_REDUCE, .send = send, .recv = recv, .count = count, .dt = dt, .op = op, .tag = tag};
  return comm_start(g, &a, out, err, n);
}

bool comm_all_gather_start(CommGroup *g, const void *send, void *recv, int64_t count, CommDType dt, uint64_t tag,
                           CommReq **out, char *err, size_t n) {
  CommArgs a = {.kind = COMM_ALL_GATHER, .send = send, .recv = recv, .count = count, .dt = dt, .tag = tag};
  return comm_start(g, &a, out, err, n);
}

bool comm_reduce_scatter_start(CommGroup *g, const void *send, void *recv, int64_t count, CommDType dt, CommOp op,
                               uint64_t tag, CommReq **out, char *err, size_t n) {
  CommArgs a = {.kind = COMM_REDUCE_SCATTER, .send = send, .recv = recv, .count = count, .dt = dt, .op = op, .tag = tag};
  return comm_start(g, &a, out, err, n);
}

bool comm_test(CommReq *r, bool *done, char *err, size_t n) {
  if (!r->impl) {
    *done = true;
    return true;
  }
  bool fin = false;
  if (!r->g->comm->be->test(r->impl, &fin, err, n)) return false;
  if (fin) r->impl = NULL;
  *done = fin;
  return true;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Poll until done: spin briefly, then sleep in growing steps (up to 1 ms)
 * so a waiting rank leaves the cores to the ranks still computing. */
bool comm_wait(CommReq *r, char *err, size_t n) {
  double t0 = now_s();
  long nap_ns = 0;
  bool ok = true, done = false;
  for (int spin = 0; ok && !done; spin++) {
    ok = comm_test(r, &done, err, n);
    if (!ok || done) break;
    if (spin < 1000) continue;
    if (now_s() - t0 > r->g->comm->timeout_s) {
      ok = fail(err, n,
                "%s over the %s group (%s[%lld], tag %016llx) did not complete in %.0f s: a rank failed or issued "
                "different collectives (GRADC_COMM_TIMEOUT sets the limit)",
                kind_name(r->a.kind), r->g->name, comm_dtype_name(r->a.dt), (long long)r->a.count,
                (unsigned long long)r->a.tag, r->g->comm->timeout_s);
      break;
    }
    nap_ns = nap_ns ? (nap_ns * 2 > 1000000 ? 1000000 : nap_ns * 2) : 1000;
    struct timespec ts = {0, nap_ns};
    nanosleep(&ts, NULL);
  }
  /* A request that failed or timed out stays with the back end: its
   * buffers may still be written, and the run is about to end. */
  free(r);
  return ok;
}

bool comm_all_reduce(CommGroup *g, const void *send, void *recv, int64_t count, CommDType dt, CommOp op, uint64_t tag,
                     char *err, size_t n) {
  CommReq *r;
  return comm_all_reduce_start(g, send, recv, count, dt, op, tag, &r, err, n) && comm_wait(r, err, n);
}

bool comm_broadcast(CommGroup *g, void *buf, int64_t count, CommDType dt, int root, uint64_t tag, char *err, size_t n) {
  CommArgs a = {.kind = COMM_BROADCAST, .send = buf, .recv = buf, .count = count, .dt = dt, .root = root, .tag = tag};
  CommReq *r;
  return comm_start(g, &a, &r, err, n) && comm_wait(r, err, n);
}

bool comm_barrier(CommGroup *g, char *err, size_t n) {
  CommArgs a = {.kind = COMM_BARRIER, .dt = COMM_U64};
  CommReq *r;
  return comm_start(g, &a, &r, err, n) && comm_wait(r, err, n);
}

/* Every rank's pair (issued, hash), gathered on the control channel. */
static bool gather_pairs(CommGroup *g, uint64_t a, uint64_t b, uint64_t *all, char *err, size_t n) {
  uint64_t mine[2] = {a, b};
  CommArgs args = {.kind = COMM_ALL_GATHER, .send = mine, .recv = all, .count = 2, .dt = COMM_U64, .ctl = true};
  CommReq *r;
  return comm_start(g, &args, &r, err, n) && comm_wait(r, err, n);
}

bool comm_check(CommGroup *g, const char *what, char *err, size_t n) {
  uint64_t issued = (uint64_t)g->issued, hash = g->hash;
  g->issued = 0;
  g->hash = HASH_SEED;
  if (g->size == 1) return true;
  uint64_t *all = xcalloc((size_t)g->size * 2, sizeof(uint64_t));
  bool ok = gather_pairs(g, issued, hash, all, err, n);
  for (int i = 1; ok && i < g->size; i++) {
    if (all[2 * i] == all[0] && all[2 * i + 1] == all[1]) continue;
    ok = fail(err, n,
              "ranks issued different collectives in %s: rank %d of the %s group issued %llu (order hash %016llx), "
              "rank 0 %llu (order hash %016llx); every rank must issue the same collectives in the same order",
              what, i, g->name, (unsigned long long)all[2 * i], (unsigned long long)all[2 * i + 1],
              (unsigned long long)all[0], (unsigned long long)all[1]);
  }
  free(all);
  return ok;
}

bool comm_agree(CommGroup *g, uint64_t v, int *first_diff, uint64_t *v0, uint64_t *vdiff, char *err, size_t n) {
  *first_diff = -1;
  *v0 = *vdiff = v;
  if (g->size == 1) return true;
  uint64_t *all = xcalloc((size_t)g->size * 2, sizeof(uint64_t));
  bool ok = gather_pairs(g, v, 0, all, err, n);
  if (ok) *v0 = all[0];
  for (int i = 1; ok && i < g->size && *first_diff < 0; i++)
    if (all[2 * i] != all[0]) {
      *first_diff = i;
      *vdiff = all[2 * i];
    }
  free(all);
  return ok;
}
