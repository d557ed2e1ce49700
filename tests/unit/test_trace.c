/* test_trace.c - the trace recorder (runtime/trace.h): spans recorded by
 * hand with known times, written as a Chrome trace and read back with
 * cJSON: every event is there with its lane, times and pid; overlapping
 * collectives go on separate tracks of the comm lane and nest properly;
 * names with quotes and control characters survive; the figures equal the
 * sums worked out by hand; the current recorder is per thread; spans
 * recorded from another thread (as the progress thread does) are kept. */
#include <cjson/cJSON.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runtime/trace.h"
#include "testutil.h"

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

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_trace_stats_sums),
      cmocka_unit_test(test_trace_write_events),
      cmocka_unit_test(test_trace_write_tracks_nest),
      cmocka_unit_test(test_trace_write_escapes_names),
      cmocka_unit_test(test_trace_current_per_thread),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
