/* trace.c - the recorder of trace.h: a growing array of events (spans on
 * the compute, comm and step lanes, and blocked-in-wait spans), the
 * figures summed from them, and the Chrome trace JSON writer.
 *
 * Events come from the thread that runs the step and, for collectives
 * whose completion the MPI progress thread observes, from that thread too,
 * so appending takes a lock.  The current recorder is a thread-local.
 *
 * The writer gives each rank a process (pid = rank, named "rank N") and
 * each lane a thread (tid 0 "step", 1 "compute", 2 "comm").  Chrome's
 * complete events ("ph":"X") on one thread must nest; collectives in
 * flight at once overlap without nesting, so a lane's events are laid out
 * greedily on as many tracks as that takes (the first track keeps the
 * lane's tid; more are named "comm 2", "comm 3"...).  Events gathered
 * from other ranks (trace_add_rank) keep their rank as pid. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "trace.h"

typedef struct TraceEvent {
  double t0, t1;   /* microseconds since this recorder's origin */
  char *name;
  int rank;        /* pid */
  uint8_t lane;    /* TraceLane */
  bool exposed;    /* a trace_exposed span (a "wait" on the comm lane) */
} TraceEvent;

struct Trace {
  int rank;
  double origin_us;  /* CLOCK_MONOTONIC at creation */
  pthread_mutex_t lock;
  TraceEvent *ev;
  size_t nev, cap;
};

static _Thread_local Trace *current;

static double mono_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec * 1e-3;
}

Trace *trace_new(int rank) {
  Trace *t = calloc(1, sizeof *t);
  if (!t) abort();
  t->rank = rank;
  t->origin_us = mono_us();
  pthread_mutex_init(&t->lock, NULL);
  return t;
}

void trace_free(Trace *t) {
  if (!t) return;
  if (current == t) current = NULL;
  for (size_t i = 0; i < t->nev; i++) free(t->ev[i].name);
  free(t->ev);
  pthread_mutex_destroy(&t->lock);
  free(t);
}

Trace *trace_current(void) { return current; }

void trace_set_current(Trace *t) { current = t; }

double trace_now_us(const Trace *t) { return mono_us() - t->origin_us; }

double trace_origin_us(const Trace *t) { return t->origin_us; }

int trace_rank(const Trace *t) { return t->rank; }

static char *dupstr(const char *s) {
  size_t n = strlen(s ? s : "") + 1;
  char *d = malloc(n);
  if (!d) abort();
  memcpy(d, s ? s : "", n);
  return d;
}

static void add(Trace *t, int rank, TraceLane lane, const char *name, double t0, double t1, bool exposed) {
  if (t1 < t0) t1 = t0;
  char *copy = dupstr(name);
  pthread_mutex_lock(&t->lock);
  if (t->nev == t->cap) {
    t->cap = t->cap ? 2 * t->cap : 256;
    t->ev = realloc(t->ev, t->cap * sizeof *t->ev);
    if (!t->ev) abort();
  }
  t->ev[t->nev++] = (TraceEvent){.t0 = t0, .t1 = t1, .name = copy, .rank = rank, .lane = (uint8_t)lane,
                                 .exposed = exposed};
  pthread_mutex_unlock(&t->lock);
}

void trace_span(Trace *t, TraceLane lane, const char *name, double t0_us, double t1_us) {
  add(t, t->rank, lane, name, t0_us, t1_us, false);
}

void trace_exposed(Trace *t, double t0_us, double t1_us) { add(t, t->rank, TRACE_COMM, "wait", t0_us, t1_us, true); }

void trace_add_rank(Trace *t, int rank, TraceLane lane, const char *name, double t0_us, double t1_us, bool exposed) {
  add(t, rank, lane, name, t0_us, t1_us, exposed);
}

size_t trace_count(const Trace *t) {
  Trace *m = (Trace *)t;
  pthread_mutex_lock(&m->lock);
  size_t n = t->nev;
  pthread_mutex_unlock(&m->lock);
  return n;
}

bool trace_event(const Trace *t, size_t i, TraceEventInfo *out) {
  Trace *m = (Trace *)t;
  pthread_mutex_lock(&m->lock);
  bool ok = i < t->nev;
  if (ok) {
    const TraceEvent *e = &t->ev[i];
    *out = (TraceEventInfo){.t0_us = e->t0, .t1_us = e->t1, .name = e->name, .rank = e->rank,
                            .lane = (TraceLane)e->lane, .exposed = e->exposed};
  }
  pthread_mutex_unlock(&m->lock);
  return ok;
}

/* This rank's figures (events gathered from other ranks are not counted). */
void trace_stats(const Trace *t, TraceStats *out) {
  memset(out, 0, sizeof *out);
  Trace *m = (Trace *)t;
  pthread_mutex_lock(&m->lock);
  for (size_t i = 0; i < t->nev; i++) {
    const TraceEvent *e = &t->ev[i];
    if (e->rank != t->rank) continue;
    double d = e->t1 - e->t0;
    switch ((TraceLane)e->lane) {
    case TRACE_COMPUTE: out->compute_us += d; break;
    case TRACE_COMM:
      if (e->exposed) {
        out->exposed_us += d;
      } else {
        out->comm_us += d;
        out->collectives++;
      }
      break;
    case TRACE_STEP: break;
    }
  }
  pthread_mutex_unlock(&m->lock);
}

/* ------------------------------------------------------------------ */
/* The Chrome trace writer                                              */
/* ------------------------------------------------------------------ */

static const char *const lane_names[] = {"compute", "comm", "step"};
/* tids: step first, so Perfetto shows step / compute / comm top down. */
static int lane_tid(int lane) { return lane == TRACE_STEP ? 0 : lane == TRACE_COMPUTE ? 1 : 2; }

/* A JSON string: quotes, backslashes and control characters escaped
 * (names are the program's, but a param could be called anything). */
static void put_str(FILE *f, const char *s) {
  fputc('"', f);
  for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
    switch (*p) {
    case '"': fputs("\\\"", f); break;
    case '\\': fputs("\\\\", f); break;
    case '\n': fputs("\\n", f); break;
    case '\t': fputs("\\t", f); break;
    case '\r': fputs("\\r", f); break;
    default:
      if (*p < 0x20) fprintf(f, "\\u%04x", *p);
      else fputc(*p, f);
    }
  }
  fputc('"', f);
}

static int by_start(const void *a, const void *b) {
  const TraceEvent *x = *(const TraceEvent *const *)a, *y = *(const TraceEvent *const *)b;
  if (x->rank != y->rank) return x->rank < y->rank ? -1 : 1;
  if (x->lane != y->lane) return x->lane < y->lane ? -1 : 1;
  if (x->t0 != y->t0) return x->t0 < y->t0 ? -1 : 1;
  /* Longer first, so an enclosing span comes before what it encloses. */
  if (x->t1 != y->t1) return x->t1 > y->t1 ? -1 : 1;
  return 0;
}

/* A track: the ends of its open (enclosing) spans, innermost last. */
typedef struct Track {
  double *open;
  int nopen, cap;
} Track;

/* Whether [t0, t1] can go on the track: after the spans that ended, and
 * inside the innermost one still open. */
static bool fits(Track *k, double t0, double t1) {
  int n = k->nopen;
  while (n > 0 && k->open[n - 1] <= t0) n--;
  return n == 0 || t1 <= k->open[n - 1];
}

static void push(Track *k, double t0, double t1) {
  while (k->nopen > 0 && k->open[k->nopen - 1] <= t0) k->nopen--;
  if (k->nopen == k->cap) {
    k->cap = k->cap ? 2 * k->cap : 8;
    k->open = realloc(k->open, (size_t)k->cap * sizeof *k->open);
    if (!k->open) abort();
  }
  k->open[k->nopen++] = t1;
}

static void put_meta(FILE *f, bool *first, const char *what, int pid, int tid, const char *key, const char *sval,
                     long ival) {
  fprintf(f, "%s\n{\"ph\":\"M\",\"name\":\"%s\",\"pid\":%d,\"tid\":%d,\"args\":{\"%s\":", *first ? "" : ",", what, pid,
          tid, key);
  if (sval) put_str(f, sval);
  else fprintf(f, "%ld", ival);
  fputs("}}", f);
  *first = false;
}

bool trace_write(const Trace *t, const char *path, char *err, size_t n) {
  Trace *m = (Trace *)t;
  pthread_mutex_lock(&m->lock);
  size_t nev = t->nev;
  const TraceEvent **order = malloc((nev ? nev : 1) * sizeof *order);
  if (!order) abort();
  for (size_t i = 0; i < nev; i++) order[i] = &t->ev[i];
  qsort(order, nev, sizeof *order, by_start);
  FILE *f = fopen(path, "w");
  if (!f) {
    pthread_mutex_unlock(&m->lock);
    free(order);
    if (err && n) snprintf(err, n, "cannot write the trace %s", path);
    return false;
  }
  fputs("{\"displayTimeUnit\":\"ms\",\"traceEvents\":[", f);
  bool first = true;
  int next_tid = 3;  /* extra tracks of a lane, per rank */
  Track *tracks = NULL;
  int ntracks = 0, captracks = 0;
  for (size_t i = 0; i < nev;) {
    /* One run of events of the same rank and lane. */
    int rank = order[i]->rank, lane = order[i]->lane;
    if (i == 0 || order[i - 1]->rank != rank) {
      char pname[32];
      snprintf(pname, sizeof pname, "rank %d", rank);
      put_meta(f, &first, "process_name", rank, 0, "name", pname, 0);
      put_meta(f, &first, "process_sort_index", rank, 0, "sort_index", NULL, rank);
      next_tid = 3;
    }
    ntracks = 0;
    int *tids = NULL;
    size_t j = i;
    for (; j < nev && order[j]->rank == rank && order[j]->lane == lane; j++) {
      const TraceEvent *e = order[j];
      int k = 0;
      while (k < ntracks && !fits(&tracks[k], e->t0, e->t1)) k++;
      if (k == ntracks) {
        if (ntracks == captracks) {
          captracks = captracks ? 2 * captracks : 4;
          tracks = realloc(tracks, (size_t)captracks * sizeof *tracks);
          if (!tracks) abort();
          memset(tracks + ntracks, 0, (size_t)(captracks - ntracks) * sizeof *tracks);
        }
        tids = realloc(tids, (size_t)(ntracks + 1) * sizeof *tids);
        if (!tids) abort();
        tids[ntracks] = ntracks == 0 ? lane_tid(lane) : next_tid++;
        char tname[32];
        if (ntracks == 0) snprintf(tname, sizeof tname, "%s", lane_names[lane]);
        else snprintf(tname, sizeof tname, "%s %d", lane_names[lane], ntracks + 1);
        put_meta(f, &first, "thread_name", rank, tids[ntracks], "name", tname, 0);
        put_meta(f, &first, "thread_sort_index", rank, tids[ntracks], "sort_index", NULL,
                 lane_tid(lane) * 100 + ntracks);
        tracks[ntracks].nopen = 0;
        ntracks++;
      }
      push(&tracks[k], e->t0, e->t1);
      fprintf(f, ",\n{\"ph\":\"X\",\"name\":");
      put_str(f, e->name);
      fprintf(f, ",\"cat\":\"%s\",\"pid\":%d,\"tid\":%d,\"ts\":%.3f,\"dur\":%.3f}",
              e->exposed ? "exposed" : lane_names[lane], rank, tids[k], e->t0, e->t1 - e->t0);
    }
    free(tids);
    i = j;
  }
  for (int k = 0; k < captracks; k++) free(tracks[k].open);
  free(tracks);
  pthread_mutex_unlock(&m->lock);
  /* This rank's figures ride along for scripts (Perfetto ignores them). */
  TraceStats s;
  trace_stats(t, &s);
  fprintf(f,
          "\n],\"otherData\":{\"rank\":%d,\"comm_us\":%.3f,\"exposed_us\":%.3f,\"compute_us\":%.3f,"
          "\"collectives\":%lld}}\n",
          t->rank, s.comm_us, s.exposed_us, s.compute_us, (long long)s.collectives);
  free(order);
  bool ok = !ferror(f);
  if (fclose(f) != 0) ok = false;
  if (!ok && err && n) snprintf(err, n, "cannot write the trace %s", path);
  return ok;
}
