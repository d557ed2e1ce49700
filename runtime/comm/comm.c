/* comm.c - the back-end-independent half of the comm layer (comm.h):
 * opening a tp × dp layout and its groups, checking and starting
 * collectives, the running hash of the collectives each rank issued and
 * its comparison across ranks, waits with a time limit, the simulated
 * slow link (one per group, collectives queued on it in start order),
 * tracing (each collective's span from start to completion on
 * the comm lane, and the time a wait blocked as exposed communication),
 * gathering every rank's trace into rank 0's, and the single back end
 * (one process: every collective is a copy). */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm.h"
#include "trace.h"

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

int comm_launch_rank(void) {
  static const char *const vars[] = {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"};
  for (size_t i = 0; i < sizeof vars / sizeof *vars; i++) {
    const char *v = getenv(vars[i]);
    if (v && *v) {
      long n = strtol(v, NULL, 10);
      if (n >= 0) return (int)n;
    }
  }
  return 0;
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
    errf(err, n, "tp and dp must be at least 1 (got tp %d, dp %d)", tp, dp);
    return NULL;
  }
  int want = tp * dp;
  const CommBackend *be = want == 1 ? &comm_single_backend : registered;
  if (!be) {
#ifdef GRADC_HAVE_MPI
    errf(err, n, "%s needs %d ranks, but this program did not enable MPI (gradc_mpi_enable)",
         tp > 1 ? "--tp" : "--dp", want);
#else
    errf(err, n, "%s %d needs several processes, but this build has no MPI (configure with -DGRADC_MPI=ON and "
         "libopenmpi-dev installed)", tp > 1 ? "--tp" : "--dp", tp > 1 ? tp : dp);
#endif
    return NULL;
  }
  Comm *c = mem_calloc(1, sizeof *c);
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
      errf(err, n, "--dp %d needs %d ranks (launch it with mpirun -np %d); this run has %d", dp, dp, dp, c->size);
    else
      errf(err, n, "--tp %d x --dp %d needs %d ranks (launch it with mpirun -np %d); this run has %d", tp, dp, want,
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
  if (a->count < 0) return errf(err, n, "%s over '%s': negative count %lld", kind_name(a->kind), g->name, (long long)a->count);
  if (a->kind == COMM_BROADCAST && (a->root < 0 || a->root >= g->size))
    return errf(err, n, "broadcast over '%s': root %d is not a rank of the group (size %d)", g->name, a->root, g->size);
  if (a->kind != COMM_BARRIER && a->count > 0 && (!a->recv || (a->kind != COMM_BROADCAST && !a->send)))
    return errf(err, n, "%s over '%s': no buffer", kind_name(a->kind), g->name);
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
  double t0 = comm_now_us();
  void *impl = NULL;
  if (!g->comm->be->start(g->impl, a, &impl, err, n)) return false;
  CommReq *r = mem_calloc(1, sizeof *r);
  r->g = g;
  r->a = *a;
  r->impl = impl;
  r->t0_us = t0;
  r->ready_us = t0;
  double link = a->ctl ? 0 : comm_link_us(g, a);
  if (link > 0) { /* queued on the group's link behind the transfers before it */
    r->ready_us = fmax(t0, g->link_free_us) + link;
    g->link_free_us = r->ready_us;
  }
  if (!impl) {
    r->be_done = true;
    r->done_us = t0;
  }
  r->trace = a->ctl ? NULL : trace_current();
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

/* The trace's name of a collective: kind, group, dtype[count], and the
 * caller's name (or the step layer's well-known tags). */
static void span_name(const CommReq *r, const char *prefix, char *buf, size_t n) {
  static uint64_t window_sum, loss;
  if (!window_sum) {
    window_sum = hash_str("window.sum");
    loss = hash_str("loss");
  }
  const char *what = r->a.name ? r->a.name : r->a.tag == window_sum ? "window.sum" : r->a.tag == loss ? "loss" : NULL;
  snprintf(buf, n, "%s%s %s %s[%lld]%s%s", prefix, kind_name(r->a.kind), r->g->name, comm_dtype_name(r->a.dt),
           (long long)r->a.count, what ? " " : "", what ? what : "");
}

/* Record r's span, from its start to its completion (the back end's, or
 * the simulated link's if later), once. */
static void trace_req(CommReq *r) {
  if (!r->trace || r->traced) return;
  r->traced = true;
  double origin = trace_origin_us(r->trace), end = fmax(r->done_us, r->ready_us);
  char name[160];
  span_name(r, "", name, sizeof name);
  trace_span(r->trace, TRACE_COMM, name, r->t0_us - origin, end - origin);
}

/* Ask the back end whether r completed (once it did, never again). */
static bool poll_backend(CommReq *r, char *err, size_t n) {
  if (r->be_done) return true;
  bool fin = false;
  double at = 0;
  const CommBackend *be = r->g->comm->be;
  if (be->test_at) {
    if (!be->test_at(r->impl, &fin, &at, err, n)) return false;
  } else if (!be->test(r->impl, &fin, err, n)) {
    return false;
  }
  if (fin) {
    r->impl = NULL;
    r->be_done = true;
    r->done_us = at > 0 ? at : comm_now_us();
  }
  return true;
}

bool comm_test(CommReq *r, bool *done, char *err, size_t n) {
  *done = false;
  if (!poll_backend(r, err, n)) return false;
  if (!r->be_done || comm_now_us() < r->ready_us) return true;
  trace_req(r);
  *done = true;
  return true;
}

double comm_now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec * 1e-3;
}

static void sleep_us(double us) {
  if (us <= 0) return;
  struct timespec ts = {(time_t)(us / 1e6), (long)(fmod(us, 1e6) * 1e3)};
  nanosleep(&ts, NULL);
}

/* Poll until done: spin briefly, then sleep in growing steps (up to
 * 200 us) so a waiting rank leaves the cores to the ranks still computing;
 * once the back end is done and only the simulated link holds it back,
 * sleep until the link's time.  The time blocked is exposed communication
 * (traced as "wait ..." on the comm lane). */
bool comm_wait(CommReq *r, char *err, size_t n) {
  double t_enter = comm_now_us(), nap_us = 0;
  bool ok = true, done = false, blocked = false;
  for (int spin = 0; ok && !done; spin++) {
    ok = comm_test(r, &done, err, n);
    if (!ok || done) break;
    blocked = true;
    double now = comm_now_us();
    if (r->be_done) {
      sleep_us(r->ready_us - now);
      continue;
    }
    if (spin < 1000) continue;
    if (now - t_enter > r->g->comm->timeout_s * 1e6) {
      ok = errf(err, n,
                "%s over the %s group (%s[%lld], tag %016llx) did not complete in %.0f s: a rank failed or issued "
                "different collectives (GRADC_COMM_TIMEOUT sets the limit)",
                kind_name(r->a.kind), r->g->name, comm_dtype_name(r->a.dt), (long long)r->a.count,
                (unsigned long long)r->a.tag, r->g->comm->timeout_s);
      break;
    }
    nap_us = nap_us ? fmin(nap_us * 2, 200) : 1;
    sleep_us(nap_us);
  }
  if (ok && blocked && r->trace) {
    double origin = trace_origin_us(r->trace);
    char name[170];
    span_name(r, "wait ", name, sizeof name);
    trace_add_rank(r->trace, trace_rank(r->trace), TRACE_COMM, name, t_enter - origin, comm_now_us() - origin, true);
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

/* ------------------------------------------------------------------ */
/* The simulated link                                                   */
/* ------------------------------------------------------------------ */

/* comm_link_us is one collective's time on the link; comm_start queues it
 * behind the group's earlier ones (CommGroup.link_free_us) to get the
 * time it may complete, CommReq.ready_us. */

static bool link_set;
static double link_latency_us, link_gbps;

void comm_set_link(double latency_us, double gbps) {
  link_set = true;
  link_latency_us = latency_us > 0 ? latency_us : 0;
  link_gbps = gbps > 0 ? gbps : 0;
}

static double env_nonneg(const char *name) {
  const char *v = getenv(name);
  char *end;
  double x = v ? strtod(v, &end) : 0;
  return v && end != v && x > 0 && isfinite(x) ? x : 0;
}

void comm_get_link(double *latency_us, double *gbps) {
  if (link_set) {
    *latency_us = link_latency_us;
    *gbps = link_gbps;
  } else {
    *latency_us = env_nonneg("GRADC_COMM_LATENCY_US");
    *gbps = env_nonneg("GRADC_COMM_GBPS");
  }
}

double comm_link_us(const CommGroup *g, const CommArgs *a) {
  double lat, gbps;
  comm_get_link(&lat, &gbps);
  int N = g->size;
  if (N <= 1 || (lat <= 0 && gbps <= 0)) return 0;
  double buf = (double)a->count * (double)comm_dtype_size(a->dt), bytes = 0;
  switch (a->kind) {
  case COMM_ALL_REDUCE: bytes = 2.0 * (N - 1) / N * buf; break;
  case COMM_ALL_GATHER:
  case COMM_REDUCE_SCATTER: bytes = (double)(N - 1) * buf; break; /* (N-1)/N of the N * count whole */
  case COMM_BROADCAST: bytes = buf; break;
  case COMM_BARRIER: bytes = 0; break;
  }
  return lat + (gbps > 0 ? bytes / (gbps * 125.0) : 0);
}

/* ------------------------------------------------------------------ */
/* Gathering traces                                                     */
/* ------------------------------------------------------------------ */

/* One event packed in u64 words: t0, t1 (as f64 bits, on the monotonic
 * clock), lane | exposed << 8 | name length << 16, then the name padded
 * to whole words. */
static size_t pack_events(const Trace *t, uint64_t **out) {
  size_t cap = 64, len = 0, ne = trace_count(t);
  uint64_t *w = mem_calloc(cap, sizeof *w);
  double origin = trace_origin_us(t);
  for (size_t i = 0; i < ne; i++) {
    TraceEventInfo e;
    if (!trace_event(t, i, &e) || e.rank != trace_rank(t)) continue;
    size_t nl = strlen(e.name), words = 3 + (nl + 8) / 8;
    if (len + words > cap) {
      while (len + words > cap) cap *= 2;
      w = realloc(w, cap * sizeof *w);
      if (!w) abort();
    }
    double a = e.t0_us + origin, b = e.t1_us + origin;
    memcpy(&w[len], &a, 8);
    memcpy(&w[len + 1], &b, 8);
    w[len + 2] = (uint64_t)e.lane | (uint64_t)e.exposed << 8 | (uint64_t)nl << 16;
    memset(&w[len + 3], 0, (words - 3) * 8);
    memcpy(&w[len + 3], e.name, nl);
    len += words;
  }
  *out = w;
  return len;
}

bool comm_trace_gather(CommGroup *g, Trace *t, char *err, size_t n) {
  if (g->size == 1) return true;
  uint64_t *mine;
  size_t len = pack_events(t, &mine);
  /* Every rank's length and origin, then the events padded to the longest. */
  uint64_t *lens = mem_calloc((size_t)g->size * 2, sizeof *lens);
  double origin = trace_origin_us(t);
  uint64_t hdr[2] = {len, 0};
  memcpy(&hdr[1], &origin, 8);
  CommArgs a = {.kind = COMM_ALL_GATHER, .send = hdr, .recv = lens, .count = 2, .dt = COMM_U64, .ctl = true};
  CommReq *r;
  bool ok = comm_start(g, &a, &r, err, n) && comm_wait(r, err, n);
  uint64_t most = 0;
  for (int i = 0; ok && i < g->size; i++) most = lens[2 * i] > most ? lens[2 * i] : most;
  uint64_t *all = NULL;
  if (ok && most > 0) {
    uint64_t *send = mem_calloc(most, sizeof *send);
    memcpy(send, mine, len * sizeof *send);
    all = mem_calloc((size_t)most * (size_t)g->size, sizeof *all);
    CommArgs b = {.kind = COMM_ALL_GATHER, .send = send, .recv = all, .count = (int64_t)most, .dt = COMM_U64,
                  .ctl = true};
    ok = comm_start(g, &b, &r, err, n) && comm_wait(r, err, n);
    free(send);
  }
  /* Rank 0 adds the others' events, in its own time.  The pid is the world
   * rank (g's ranks are ordered by world rank in every layout's groups). */
  for (int i = 0; ok && all && g->rank == 0 && i < g->size; i++) {
    if (i == g->rank) continue;
    const uint64_t *w = all + (size_t)i * most, *end = w + lens[2 * i];
    int pid = g == &g->comm->world ? i : -1;
    if (pid < 0) {
      int tp = g->comm->tp, me = g->comm->rank;
      pid = g == &g->comm->dp_group ? i * tp + me % tp : (me / tp) * tp + i;
    }
    while (w + 3 <= end) {
      double a0, a1;
      memcpy(&a0, &w[0], 8);
      memcpy(&a1, &w[1], 8);
      int lane = (int)(w[2] & 0xff);
      bool exposed = (w[2] >> 8) & 1;
      size_t nl = (size_t)(w[2] >> 16), words = 3 + (nl + 8) / 8;
      if (w + words > end || lane > TRACE_STEP) break;
      char *name = mem_calloc(nl + 1, 1);
      memcpy(name, &w[3], nl);
      trace_add_rank(t, pid, (TraceLane)lane, name, a0 - origin, a1 - origin, exposed);
      free(name);
      w += words;
    }
  }
  free(all);
  free(lens);
  free(mine);
  return ok;
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
  uint64_t *all = mem_calloc((size_t)g->size * 2, sizeof(uint64_t));
  bool ok = gather_pairs(g, issued, hash, all, err, n);
  for (int i = 1; ok && i < g->size; i++) {
    if (all[2 * i] == all[0] && all[2 * i + 1] == all[1]) continue;
    ok = errf(err, n,
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
  uint64_t *all = mem_calloc((size_t)g->size * 2, sizeof(uint64_t));
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
