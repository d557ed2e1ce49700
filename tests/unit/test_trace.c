/* test_trace.c - the trace recorder (runtime/trace.h): spans recorded by
 * hand with known times, written as a Chrome trace and read back with
 * cJSON: every event is there with its lane, times and pid; overlapping
 * collectives go on separate tracks of the comm lane and nest properly;
 * names with quotes and control characters survive; the figures equal the
 * sums worked out by hand; the current recorder is per thread; spans
 * recorded from another thread (as the progress thread does) are kept.
 *
 * The comm layer's side (runtime/comm.h): the simulated link's time for
 * each collective, worked out by hand; collectives started together queue
 * on their group's link (the link's clock, by hand, over the single back
 * end with groups of 2); the single back end is never slowed; and, on 2 MPI ranks (this executable again under mpirun,
 * `test_trace --worker NAME`, skipped when the build has no MPI or mpirun
 * is absent), a slowed all-reduce waited for at once takes at least its
 * modelled time, all of it exposed, while one waited for after compute as
 * long hides it (the wait costs next to nothing), two started together
 * complete one and two model times after their starts, with the progress
 * thread and with polling; each rank's traced spans and exposed time agree with
 * what the worker timed itself; every rank's events gathered into rank 0's
 * file. */
#include <cjson/cJSON.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gradc.h"
#include "runtime/comm/comm.h"
#include "runtime/comm/trace.h"
#include "test_dp.h"

static char *slurp(const char *path) {
  FILE *f = fopen(path, "rb");
  assert_non_null(f);
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *s = malloc((size_t)n + 1);
  assert_int_equal(fread(s, 1, (size_t)n, f), (size_t)n);
  s[n] = 0;
  fclose(f);
  return s;
}

/* Write t and parse it back. */
static cJSON *write_read(const Trace *t) {
  char path[] = "/tmp/gradc-trace-XXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  close(fd);
  char err[256] = "";
  if (!trace_write(t, path, err, sizeof err)) fail_msg("%s", err);
  char *text = slurp(path);
  unlink(path);
  cJSON *j = cJSON_Parse(text);
  if (!j) fail_msg("not JSON:\n%s", text);
  free(text);
  return j;
}

static double num(const cJSON *o, const char *k) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
  if (!cJSON_IsNumber(v)) fail_msg("no number '%s'", k);
  return v->valuedouble;
}

static const char *str(const cJSON *o, const char *k) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
  if (!cJSON_IsString(v)) fail_msg("no string '%s'", k);
  return v->valuestring;
}

/* The X event named name (the n-th of that name). */
static const cJSON *find_x(const cJSON *j, const char *name, int nth) {
  const cJSON *e;
  cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(j, "traceEvents")) {
    if (strcmp(str(e, "ph"), "X") == 0 && strcmp(str(e, "name"), name) == 0 && nth-- == 0) return e;
  }
  fail_msg("no event '%s'", name);
  return NULL;
}

/* The name thread_name metadata gives (pid, tid), or NULL. */
static const char *thread_name(const cJSON *j, int pid, int tid) {
  const cJSON *e;
  cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(j, "traceEvents")) {
    if (strcmp(str(e, "ph"), "M") == 0 && strcmp(str(e, "name"), "thread_name") == 0 && num(e, "pid") == pid &&
        num(e, "tid") == tid)
      return str(cJSON_GetObjectItemCaseSensitive(e, "args"), "name");
  }
  return NULL;
}

static const char *lane_of(const cJSON *j, const cJSON *e) {
  const char *n = thread_name(j, (int)num(e, "pid"), (int)num(e, "tid"));
  if (!n) fail_msg("event '%s' on a thread without a name", str(e, "name"));
  return n;
}

static int count_x(const cJSON *j) {
  int n = 0;
  const cJSON *e;
  cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(j, "traceEvents")) n += strcmp(str(e, "ph"), "X") == 0;
  return n;
}

/* A step of rank 3: two kernels, a GEMM; two all-reduces in flight at once
 * (overlapping without nesting); a wait for the second. */
static Trace *sample(void) {
  Trace *t = trace_new(3);
  trace_span(t, TRACE_STEP, "step 1", 0, 1000);
  trace_span(t, TRACE_COMPUTE, "kernel0", 10, 110);   /* 100 */
  trace_span(t, TRACE_COMPUTE, "gemm1", 120, 420);    /* 300 */
  trace_span(t, TRACE_COMM, "all_reduce dW1", 115, 600);  /* 485 */
  trace_span(t, TRACE_COMM, "all_reduce dW0", 430, 900);  /* 470 */
  trace_span(t, TRACE_COMPUTE, "kernel2", 430, 530);  /* 100 */
  trace_exposed(t, 540, 600);                         /* 60 */
  trace_exposed(t, 600, 905);                         /* 305 */
  return t;
}

static void test_trace_stats_sums(void **state) {
  Trace *t = sample();
  TraceStats s;
  trace_stats(t, &s);
  assert_true(fabs(s.compute_us - 500) < 1e-9);
  assert_true(fabs(s.comm_us - 955) < 1e-9);
  assert_true(fabs(s.exposed_us - 365) < 1e-9);
  assert_int_equal(s.collectives, 2);
  /* Events gathered from another rank do not count towards this one's. */
  trace_add_rank(t, 1, TRACE_COMM, "all_reduce dW1", 0, 5000, false);
  trace_add_rank(t, 1, TRACE_COMM, "wait", 0, 5000, true);
  trace_stats(t, &s);
  assert_true(fabs(s.comm_us - 955) < 1e-9 && fabs(s.exposed_us - 365) < 1e-9);
  assert_int_equal(s.collectives, 2);
  assert_int_equal(trace_count(t), 10);
  TraceEventInfo ev;
  assert_true(trace_event(t, 6, &ev));
  assert_true(ev.exposed && ev.lane == TRACE_COMM && ev.rank == 3 && ev.t0_us == 540 && ev.t1_us == 600);
  assert_string_equal(ev.name, "wait");
  assert_false(trace_event(t, 10, &ev));
  trace_free(t);
}

static void test_trace_write_events(void **state) {
  Trace *t = sample();
  cJSON *j = write_read(t);
  assert_int_equal(count_x(j), 8);
  /* Every span with its times, its rank as pid, on its lane's thread. */
  struct {
    const char *name;
    int nth;
    double ts, dur;
    const char *lane;
  } want[] = {
      {"step 1", 0, 0, 1000, "step"},
      {"kernel0", 0, 10, 100, "compute"},
      {"gemm1", 0, 120, 300, "compute"},
      {"kernel2", 0, 430, 100, "compute"},
      {"all_reduce dW1", 0, 115, 485, "comm"},
      {"all_reduce dW0", 0, 430, 470, "comm"},
      {"wait", 0, 540, 60, "comm"},
      {"wait", 1, 600, 305, "comm"},
  };
  for (size_t i = 0; i < sizeof want / sizeof *want; i++) {
    const cJSON *e = find_x(j, want[i].name, want[i].nth);
    assert_true(fabs(num(e, "ts") - want[i].ts) < 1e-3);
    assert_true(fabs(num(e, "dur") - want[i].dur) < 1e-3);
    assert_int_equal((int)num(e, "pid"), 3);
    const char *lane = lane_of(j, e);
    if (strncmp(lane, want[i].lane, strlen(want[i].lane)) != 0)
      fail_msg("'%s' is on '%s', want '%s'", want[i].name, lane, want[i].lane);
  }
  /* The lanes' first tracks: tid 0 step, 1 compute, 2 comm. */
  assert_string_equal(thread_name(j, 3, 0), "step");
  assert_string_equal(thread_name(j, 3, 1), "compute");
  assert_string_equal(thread_name(j, 3, 2), "comm");
  /* The two all-reduces overlap without nesting: separate tracks. */
  double tid1 = num(find_x(j, "all_reduce dW1", 0), "tid"), tid0 = num(find_x(j, "all_reduce dW0", 0), "tid");
  assert_true(tid1 != tid0);
  /* The process is named after the rank; the figures ride along. */
  const cJSON *e;
  bool named = false;
  cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(j, "traceEvents")) {
    if (strcmp(str(e, "ph"), "M") == 0 && strcmp(str(e, "name"), "process_name") == 0)
      named = num(e, "pid") == 3 && strcmp(str(cJSON_GetObjectItemCaseSensitive(e, "args"), "name"), "rank 3") == 0;
  }
  assert_true(named);
  const cJSON *other = cJSON_GetObjectItemCaseSensitive(j, "otherData");
  assert_true(fabs(num(other, "exposed_us") - 365) < 1e-3 && fabs(num(other, "comm_us") - 955) < 1e-3);
  assert_true(fabs(num(other, "compute_us") - 500) < 1e-3 && num(other, "collectives") == 2);
  cJSON_Delete(j);
  trace_free(t);
}

/* On every thread of the written file, complete events nest or are
 * disjoint (what Chrome's format asks of "X" events on one thread). */
static void test_trace_write_tracks_nest(void **state) {
  Trace *t = trace_new(0);
  /* Many collectives in flight, staggered, and waits inside them. */
  for (int i = 0; i < 20; i++) trace_span(t, TRACE_COMM, "c", 10.0 * i, 10.0 * i + 55);
  for (int i = 0; i < 5; i++) trace_exposed(t, 40.0 * i + 50, 40.0 * i + 52);
  trace_span(t, TRACE_COMPUTE, "outer", 0, 100);
  trace_span(t, TRACE_COMPUTE, "inner", 10, 20);
  trace_span(t, TRACE_COMPUTE, "cross", 90, 150);
  cJSON *j = write_read(t);
  assert_int_equal(count_x(j), 28);
  const cJSON *a, *b;
  cJSON_ArrayForEach(a, cJSON_GetObjectItemCaseSensitive(j, "traceEvents")) {
    if (strcmp(str(a, "ph"), "X") != 0) continue;
    cJSON_ArrayForEach(b, cJSON_GetObjectItemCaseSensitive(j, "traceEvents")) {
      if (a == b || strcmp(str(b, "ph"), "X") != 0 || num(a, "tid") != num(b, "tid")) continue;
      double a0 = num(a, "ts"), a1 = a0 + num(a, "dur"), b0 = num(b, "ts"), b1 = b0 + num(b, "dur");
      bool disjoint = a1 <= b0 || b1 <= a0, nested = (a0 <= b0 && b1 <= a1) || (b0 <= a0 && a1 <= b1);
      if (!disjoint && !nested)
        fail_msg("'%s' [%g, %g] and '%s' [%g, %g] overlap on tid %g", str(a, "name"), a0, a1, str(b, "name"), b0, b1,
                 num(a, "tid"));
    }
    /* Extra tracks keep their lane's name. */
    const char *lane = lane_of(j, a);
    assert_true(strncmp(lane, strcmp(str(a, "name"), "c") == 0 || strcmp(str(a, "name"), "wait") == 0 ? "comm" : "compute",
                        4) == 0);
  }
  /* "inner" nests in "outer" on the compute lane's own thread. */
  assert_true(num(find_x(j, "inner", 0), "tid") == 1 && num(find_x(j, "outer", 0), "tid") == 1);
  assert_true(num(find_x(j, "cross", 0), "tid") != 1);
  cJSON_Delete(j);
  trace_free(t);
}

static void test_trace_write_escapes_names(void **state) {
  Trace *t = trace_new(0);
  const char *odd = "W \"q\" \\ back\nline\ttab\x01 é";
  trace_span(t, TRACE_COMPUTE, odd, 1, 2);
  cJSON *j = write_read(t);
  const cJSON *e = find_x(j, odd, 0);
  assert_string_equal(str(e, "name"), odd);
  cJSON_Delete(j);
  /* An empty trace is valid too. */
  Trace *empty = trace_new(1);
  j = write_read(empty);
  assert_int_equal(count_x(j), 0);
  cJSON_Delete(j);
  trace_free(empty);
  trace_free(t);
  char err[256] = "";
  Trace *u = trace_new(0);
  assert_false(trace_write(u, "/nonexistent-dir/x.json", err, sizeof err));
  assert_non_null(strstr(err, "/nonexistent-dir/x.json"));
  trace_free(u);
}

static void *other_thread(void *arg) {
  Trace *t = arg;
  /* This thread has no current recorder until it sets one. */
  if (trace_current() != NULL) return (void *)1;
  for (int i = 0; i < 1000; i++) trace_span(t, TRACE_COMM, "from the progress thread", i, i + 0.5);
  return NULL;
}

static void test_trace_current_per_thread(void **state) {
  assert_null(trace_current());
  Trace *t = trace_new(0);
  trace_set_current(t);
  assert_ptr_equal(trace_current(), t);
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, other_thread, t), 0);
  for (int i = 0; i < 1000; i++) trace_span(t, TRACE_COMPUTE, "k", i, i + 0.25);
  void *rc;
  pthread_join(th, &rc);
  assert_null(rc);
  TraceStats s;
  trace_stats(t, &s);
  assert_int_equal(s.collectives, 1000);
  assert_true(fabs(s.comm_us - 500) < 1e-9 && fabs(s.compute_us - 250) < 1e-9);
  /* The clock is monotonic microseconds from creation. */
  double a = trace_now_us(t);
  usleep(20000);
  double b = trace_now_us(t);
  assert_true(a >= 0 && b - a >= 19000 && b - a < 2e6);
  trace_set_current(NULL);
  assert_null(trace_current());
  trace_free(t);
}

/* ------------------------------------------------------------------ */
/* The comm layer: the simulated link and its traces                  */
/* ------------------------------------------------------------------ */

/* 1 Gb/s is 125 bytes per microsecond.  250000 f32 (1e6 bytes): a ring
 * all-reduce over 2 ranks moves 2 (2-1)/2 1e6 = 1e6 bytes (8000 us), over
 * 4 ranks 2 (3/4) 1e6 = 1.5e6 (12000 us); all-gather of 250000 per rank
 * over 4 moves 3 1e6 bytes (24000 us); a barrier only waits the latency. */
static void test_trace_link_model_by_hand(void **state) {
  CommGroup g2 = {.name = "dp", .size = 2}, g4 = {.name = "dp", .size = 4}, g1 = {.name = "tp", .size = 1};
  CommArgs ar = {.kind = COMM_ALL_REDUCE, .count = 250000, .dt = COMM_F32};
  CommArgs ag = {.kind = COMM_ALL_GATHER, .count = 250000, .dt = COMM_F32};
  CommArgs rs = {.kind = COMM_REDUCE_SCATTER, .count = 125000, .dt = COMM_F64};
  CommArgs bc = {.kind = COMM_BROADCAST, .count = 1000, .dt = COMM_F64};
  CommArgs ba = {.kind = COMM_BARRIER, .dt = COMM_U64};
  comm_set_link(12000, 1);
  assert_true(fabs(comm_link_us(&g2, &ar) - 20000) < 1e-6);
  assert_true(fabs(comm_link_us(&g4, &ar) - 24000) < 1e-6);
  assert_true(fabs(comm_link_us(&g4, &ag) - 36000) < 1e-6);
  assert_true(fabs(comm_link_us(&g2, &rs) - 20000) < 1e-6);
  assert_true(fabs(comm_link_us(&g2, &bc) - (12000 + 64)) < 1e-6);
  assert_true(fabs(comm_link_us(&g4, &ba) - 12000) < 1e-6);
  assert_true(comm_link_us(&g1, &ar) == 0); /* one rank: nothing moves */
  comm_set_link(0, 8);                      /* bandwidth only: 1000 B/us */
  assert_true(fabs(comm_link_us(&g2, &ar) - 1000) < 1e-6);
  comm_set_link(0, 0);
  assert_true(comm_link_us(&g2, &ar) == 0);
}

/* The environment gives the link until comm_set_link; the single back end
 * ignores it. */
static void test_trace_link_single_backend_unaffected(void **state) {
  comm_set_link(1e6, 0.001); /* a second of latency: would be noticed */
  char err[256] = "";
  Comm *c = comm_open(1, 1, err, sizeof err);
  assert_non_null(c);
  Trace *t = trace_new(0);
  trace_set_current(t);
  float x[4] = {1, 2, 3, 4}, y[4];
  double t0 = comm_now_us();
  assert_true(comm_all_reduce(&c->dp_group, x, y, 4, COMM_F32, COMM_SUM, 1, err, sizeof err));
  assert_true(comm_now_us() - t0 < 1e5);
  assert_true(y[3] == 4);
  TraceStats s;
  trace_stats(t, &s);
  assert_int_equal(s.collectives, 1); /* traced, never blocked */
  assert_true(s.exposed_us == 0 && s.comm_us < 1e5);
  trace_set_current(NULL);
  trace_free(t);
  comm_close(c);
}

/* The link queues collectives: one process, groups of 2 ranks over the
 * single back end (every collective a copy, done at once), so only the
 * simulated link holds them back.  1 Gb/s and 1000 us latency: an
 * all-reduce of 1000 f32 over 2 ranks moves 4000 bytes, 32 us, so 1032 us
 * on the link.  Two started together: the second's transfer begins when
 * the first's ends (1032 us later); a third on another group does not
 * queue behind them; a control collective neither queues nor is slowed;
 * one started once the link is idle begins at its own start. */
static void test_trace_link_queues_collectives_by_hand(void **state) {
  Comm c = {.be = &comm_single_backend, .rank = 0, .size = 2, .tp = 1, .dp = 2, .timeout_s = 20};
  CommGroup dp = {.comm = &c, .name = "dp", .rank = 0, .size = 2};
  CommGroup tp = {.comm = &c, .name = "tp", .rank = 0, .size = 2};
  float x[1000], y[1000], z[1000];
  for (int i = 0; i < 1000; i++) x[i] = (float)i;
  const double model = 1032.0;
  char err[256] = "";
  comm_set_link(1000, 1);
  CommArgs ar = {.kind = COMM_ALL_REDUCE, .count = 1000, .dt = COMM_F32};
  assert_true(fabs(comm_link_us(&dp, &ar) - model) < 1e-9);
  CommReq *r1, *r2, *r3, *rc;
  double t0 = comm_now_us();
  assert_true(comm_all_reduce_start(&dp, x, y, 1000, COMM_F32, COMM_SUM, 1, &r1, err, sizeof err));
  assert_true(comm_all_reduce_start(&dp, x, z, 1000, COMM_F32, COMM_SUM, 2, &r2, err, sizeof err));
  assert_true(comm_all_reduce_start(&tp, x, x, 1000, COMM_F32, COMM_SUM, 3, &r3, err, sizeof err));
  CommArgs ctl = {.kind = COMM_ALL_REDUCE, .send = x, .recv = x, .count = 1000, .dt = COMM_F32, .ctl = true};
  assert_true(comm_start(&dp, &ctl, &rc, err, sizeof err));
  /* The clock: exact figures from each request's start. */
  assert_true(fabs(r1->ready_us - (r1->t0_us + model)) < 1e-6);
  assert_true(fabs(r2->ready_us - (r1->ready_us + model)) < 1e-6); /* queued behind r1 */
  assert_true(fabs(r3->ready_us - (r3->t0_us + model)) < 1e-6);    /* its own group's link */
  assert_true(rc->ready_us == rc->t0_us);                          /* control: not slowed */
  assert_true(fabs(dp.link_free_us - r2->ready_us) < 1e-6 && fabs(tp.link_free_us - r3->ready_us) < 1e-6);
  /* Measured: lower bounds from the clock, upper bounds loose. */
  bool done = true;
  assert_true(comm_test(r2, &done, err, sizeof err));
  assert_false(done && comm_now_us() < r2->ready_us);
  assert_true(comm_wait(rc, err, sizeof err));
  assert_true(comm_wait(r1, err, sizeof err));
  double w1 = comm_now_us();
  assert_true(comm_wait(r2, err, sizeof err));
  double w2 = comm_now_us();
  assert_true(comm_wait(r3, err, sizeof err));
  assert_true(w1 - t0 >= model && w1 - t0 < model + 1e6);
  assert_true(w2 - t0 >= 2 * model && w2 - t0 < 2 * model + 1e6);
  assert_true(y[999] == 999 && z[999] == 999);
  /* Idle link: a later collective begins at its own start, not at the
   * clock (which is in the past). */
  double idle = comm_now_us();
  assert_true(dp.link_free_us <= idle);
  assert_true(comm_all_reduce_start(&dp, x, y, 1000, COMM_F32, COMM_SUM, 4, &r1, err, sizeof err));
  assert_true(fabs(r1->ready_us - (r1->t0_us + model)) < 1e-6 && r1->t0_us >= idle);
  assert_true(comm_wait(r1, err, sizeof err));
  /* Without a link nothing queues and the clock stays. */
  comm_set_link(0, 0);
  double before = dp.link_free_us;
  assert_true(comm_all_reduce_start(&dp, x, y, 1000, COMM_F32, COMM_SUM, 5, &r1, err, sizeof err));
  assert_true(r1->ready_us == r1->t0_us && dp.link_free_us == before);
  assert_true(comm_wait(r1, err, sizeof err));
}

#define LINK_LAT_US 12000.0
#define LINK_GBPS 0.1 /* 12.5 bytes per us */
#define NELEM 25000   /* f32: 1e5 bytes; 8000 us on the link above over 2 ranks (MPI itself: well under 1 ms) */
#define MODEL_US 20000.0
#define SLACK_US 1e6 /* upper bounds are sanity only: 2 oversubscribed ranks on a loaded machine */

static volatile double sink;

/* Compute (real arithmetic) for us microseconds; with poll, comm_test r
 * every 500 us as an executor does between kernels. */
static int compute_for(double us, CommReq *poll) {
  char err[256] = "";
  double t0 = comm_now_us(), next = t0 + 500, acc = 0;
  while (comm_now_us() - t0 < us) {
    for (int i = 0; i < 2000; i++) acc += 1.0 / (1.0 + i * acc);
    if (poll && comm_now_us() >= next) {
      bool done;
      OK(comm_test(poll, &done, err, sizeof err));
      next += 500;
    }
  }
  sink = acc;
  return 0;
}

/* The traced figures of t since *before (exposed and comm time, count). */
static void stats_since(Trace *t, TraceStats *before, TraceStats *d) {
  TraceStats now;
  trace_stats(t, &now);
  d->exposed_us = now.exposed_us - before->exposed_us;
  d->comm_us = now.comm_us - before->comm_us;
  d->collectives = now.collectives - before->collectives;
  *before = now;
}

/* The last comm span of t (not a wait). */
static TraceEventInfo last_span(Trace *t) {
  TraceEventInfo e = {0}, x;
  for (size_t i = 0; trace_event(t, i, &x); i++)
    if (x.lane == TRACE_COMM && !x.exposed) e = x;
  return e;
}

static int link_worker(Comm *c, bool poll) {
  char err[1024] = "";
  CommGroup *g = &c->dp_group;
  Trace *t = trace_new(c->rank);
  trace_set_current(t);
  float *x = malloc(NELEM * sizeof *x);
  for (int i = 0; i < NELEM; i++) x[i] = (float)(c->rank + 1) * (float)(i % 7);
  TraceStats base, d;
  OK(comm_barrier(g, err, sizeof err)); /* line the ranks up (slowed by the latency too) */
  trace_stats(t, &base);
  /* 1. Waited for at once: at least the model, all of it exposed. */
  CommReq *r;
  double t0 = comm_now_us();
  OK(comm_all_reduce_start(g, x, x, NELEM, COMM_F32, COMM_SUM, 1, &r, err, sizeof err));
  double tw = comm_now_us();
  OK(comm_wait(r, err, sizeof err));
  double t1 = comm_now_us(), took = t1 - t0;
  for (int i = 0; i < NELEM; i += 997) CHECK(x[i] == 3.0f * (float)(i % 7), "sum[%d] = %g", i, x[i]);
  stats_since(t, &base, &d);
  TraceEventInfo e = last_span(t);
  CHECK(took >= MODEL_US && took < MODEL_US + SLACK_US, "waited at once: %.0f us, model %.0f", took, MODEL_US);
  CHECK(d.collectives == 1, "collectives %lld", (long long)d.collectives);
  CHECK(e.t1_us - e.t0_us >= MODEL_US && e.t1_us - e.t0_us <= took, "span %.0f us, took %.0f", e.t1_us - e.t0_us, took);
  /* Exposed: the time in the wait (the start itself is not waiting). */
  CHECK(d.exposed_us >= MODEL_US - (tw - t0) - 1 && d.exposed_us <= t1 - tw, "exposed %.0f us, in the wait %.0f",
        d.exposed_us, t1 - tw);
  CHECK(strstr(e.name, "all_reduce dp f32[25000]") != NULL, "span name '%s'", e.name);
  printf("rank %d: at once: took %.0f us (start %.0f), span %.0f, exposed %.0f (model %.0f)\n", c->rank, took,
         tw - t0, e.t1_us - e.t0_us, d.exposed_us, MODEL_US);
  /* 2. Compute as long as the model (plus a margin for the ranks' skew)
   * between start and wait: the wait costs next to nothing. */
  OK(comm_barrier(g, err, sizeof err));
  trace_stats(t, &base);
  t0 = comm_now_us();
  OK(comm_all_reduce_start(g, x, x, NELEM, COMM_F32, COMM_SUM, 2, &r, err, sizeof err));
  if (compute_for(MODEL_US + 5000, poll ? r : NULL)) return 1;
  tw = comm_now_us();
  OK(comm_wait(r, err, sizeof err));
  double wait = comm_now_us() - tw;
  for (int i = 0; i < NELEM; i += 997) CHECK(x[i] == 6.0f * (float)(i % 7), "sum[%d] = %g", i, x[i]);
  stats_since(t, &base, &d);
  e = last_span(t);
  double origin = trace_origin_us(t);
  /* Next to nothing on a quiet machine (~0.1 ms); a loaded one may stall a
   * rank, so the bound is only that most of the model was hidden. */
  CHECK(wait < MODEL_US / 2, "the wait after compute took %.0f us", wait);
  CHECK(d.exposed_us <= wait + 1, "exposed %.0f us, the wait took %.0f", d.exposed_us, wait);
  CHECK(e.t1_us - e.t0_us >= MODEL_US, "span %.0f us", e.t1_us - e.t0_us);
  CHECK(e.t1_us + origin <= tw + 1, "completed at %.0f, after the wait began (%.0f)", e.t1_us + origin, tw);
  CHECK(e.t0_us + origin >= t0 - 1 && e.t0_us + origin <= tw, "span starts %.0f us from the start",
        e.t0_us + origin - t0);
  printf("rank %d: after compute: wait %.0f us, span %.0f, exposed %.0f\n", c->rank, wait, e.t1_us - e.t0_us,
         d.exposed_us);
  /* 3. Two all-reduces started together queue on the link: the second's
   * transfer begins when the first's ends, so it completes a model time
   * after the first, two after the starts, and the wait for both is
   * exposed. */
  float *z = malloc(NELEM * sizeof *z);
  for (int i = 0; i < NELEM; i++) z[i] = (float)(c->rank + 1);
  OK(comm_barrier(g, err, sizeof err));
  trace_stats(t, &base);
  CommReq *r2;
  t0 = comm_now_us();
  OK(comm_all_reduce_start(g, x, x, NELEM, COMM_F32, COMM_SUM, 4, &r, err, sizeof err));
  OK(comm_all_reduce_start(g, z, z, NELEM, COMM_F32, COMM_SUM, 5, &r2, err, sizeof err));
  tw = comm_now_us();
  double ready1 = r->ready_us, ready2 = r2->ready_us;
  CHECK(ready1 >= t0 + MODEL_US && fabs(ready2 - ready1 - MODEL_US) < 1e-3,
        "link clock: first ready %.0f us after the start, second %.0f after the first (model %.0f)", ready1 - t0,
        ready2 - ready1, MODEL_US);
  OK(comm_wait(r, err, sizeof err));
  double d1 = comm_now_us();
  TraceEventInfo e1 = last_span(t);
  OK(comm_wait(r2, err, sizeof err));
  double d2 = comm_now_us();
  TraceEventInfo e2 = last_span(t);
  stats_since(t, &base, &d);
  for (int i = 0; i < NELEM; i += 997) CHECK(x[i] == 12.0f * (float)(i % 7) && z[i] == 3.0f, "sums at %d", i);
  CHECK(d1 - t0 >= MODEL_US && d1 - t0 < MODEL_US + SLACK_US, "first completed after %.0f us", d1 - t0);
  CHECK(d2 - t0 >= 2 * MODEL_US && d2 - t0 < 2 * MODEL_US + SLACK_US, "second completed after %.0f us", d2 - t0);
  CHECK(d.collectives == 2, "collectives %lld", (long long)d.collectives);
  CHECK(e2.t1_us - e1.t0_us >= 2 * MODEL_US && e2.t1_us + origin >= ready2 - 1, "spans end %.0f and %.0f us in",
        e1.t1_us + origin - t0, e2.t1_us + origin - t0);
  CHECK(d.exposed_us >= 2 * MODEL_US - (tw - t0) - 1000 && d.exposed_us <= d2 - tw + 1, "exposed %.0f us, waits %.0f",
        d.exposed_us, d2 - tw);
  printf("rank %d: two together: first %.0f us, second %.0f us (model %.0f each), exposed %.0f\n", c->rank,
         d1 - t0, d2 - t0, MODEL_US, d.exposed_us);
  free(z);
  /* 4. No simulated link, 1 MB, nobody polls during the compute: with
   * the progress thread it completes while the compute runs. */
  comm_set_link(0, 0);
  int64_t big = 1 << 18;
  float *y = calloc((size_t)big, sizeof *y);
  OK(comm_barrier(g, err, sizeof err));
  OK(comm_all_reduce_start(g, y, y, big, COMM_F32, COMM_SUM, 3, &r, err, sizeof err));
  t0 = comm_now_us();
  if (compute_for(100000, NULL)) return 1;
  tw = comm_now_us();
  OK(comm_wait(r, err, sizeof err));
  e = last_span(t);
  printf("rank %d: 1 MB, no polling: completed %.0f us into 100 ms of compute, the wait took %.0f us\n", c->rank,
         e.t1_us + origin - t0, comm_now_us() - tw);
  if (!poll) CHECK(e.t1_us + origin <= tw, "the progress thread did not complete it during the compute");
  free(y);
  free(x);
  trace_set_current(NULL);
  trace_free(t);
  return 0;
}

/* Every rank records spans of its own; rank 0's file holds them all. */
static int gather_worker(Comm *c, const char *path) {
  char err[1024] = "";
  Trace *t = trace_new(c->rank);
  trace_span(t, TRACE_COMPUTE, c->rank ? "kernel of rank 1" : "kernel of rank 0", 10, 20 + c->rank);
  trace_span(t, TRACE_COMM, "c \"quoted\"", 5, 30);
  trace_exposed(t, 25, 30);
  OK(comm_trace_gather(&c->world, t, err, sizeof err));
  if (c->rank == 0) {
    CHECK(trace_count(t) == 6, "rank 0 holds %zu events", trace_count(t));
    TraceStats s;
    trace_stats(t, &s);
    CHECK(s.collectives == 1 && s.exposed_us == 5, "rank 0's figures count the others'");
    OK(trace_write(t, path, err, sizeof err));
  } else {
    CHECK(trace_count(t) == 3, "rank 1 holds %zu events", trace_count(t));
  }
  trace_free(t);
  return 0;
}

static int worker(const char *name, const char *arg) {
  Comm *c = dp_worker_open(1, 2);
  if (!c) return 1;
  int rc = 1;
  if (strcmp(name, "link") == 0) rc = link_worker(c, strcmp(arg, "poll") == 0);
  else if (strcmp(name, "gather") == 0) rc = gather_worker(c, arg);
  return dp_worker_close(c, name, rc);
}

/* The link's figures come from the environment, as mpirun passes them on. */
static void run_link(const char *env, const char *mode) {
  if (!dp_have_mpirun()) return;
  char out[16384], vars[512];
  snprintf(vars, sizeof vars, "%s GRADC_COMM_TIMEOUT=20 GRADC_COMM_LATENCY_US=%g GRADC_COMM_GBPS=%g", env, LINK_LAT_US,
           LINK_GBPS);
  dp_workers(out, sizeof out, vars, 2, "link", mode);
  print_message("%s", out);
}

static void test_trace_mpi_link_hidden_by_compute_progress_thread(void **state) { run_link("", "wait"); }

static void test_trace_mpi_link_hidden_by_compute_polling(void **state) {
  run_link("GRADC_COMM_PROGRESS=0", "poll");
}

static void test_trace_mpi_gather_into_rank0(void **state) {
  if (!dp_have_mpirun()) return;
  char path[] = "/tmp/gradc-trace-gather-XXXXXX", out[16384];
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  close(fd);
  dp_workers(out, sizeof out, "", 2, "gather", path);
  char *text = slurp(path);
  unlink(path);
  cJSON *j = cJSON_Parse(text);
  if (!j) fail_msg("not JSON:\n%s", text);
  free(text);
  assert_int_equal(count_x(j), 6);
  const cJSON *k0 = find_x(j, "kernel of rank 0", 0), *k1 = find_x(j, "kernel of rank 1", 0);
  assert_int_equal((int)num(k0, "pid"), 0);
  assert_int_equal((int)num(k1, "pid"), 1);
  assert_true(fabs(num(k1, "dur") - 11) < 1e-3);
  assert_string_equal(thread_name(j, 1, 2), "comm");
  assert_int_equal((int)num(find_x(j, "c \"quoted\"", 1), "pid"), 1);
  cJSON_Delete(j);
}

int main(int argc, char **argv) {
  if (argc == 4 && strcmp(argv[1], "--worker") == 0) return worker(argv[2], argv[3]);
  if (!dp_find_self()) return 1;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_trace_stats_sums),
      cmocka_unit_test(test_trace_write_events),
      cmocka_unit_test(test_trace_write_tracks_nest),
      cmocka_unit_test(test_trace_write_escapes_names),
      cmocka_unit_test(test_trace_current_per_thread),
      cmocka_unit_test(test_trace_link_model_by_hand),
      cmocka_unit_test(test_trace_link_single_backend_unaffected),
      cmocka_unit_test(test_trace_link_queues_collectives_by_hand),
      cmocka_unit_test(test_trace_mpi_link_hidden_by_compute_progress_thread),
      cmocka_unit_test(test_trace_mpi_link_hidden_by_compute_polling),
      cmocka_unit_test(test_trace_mpi_gather_into_rank0),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
