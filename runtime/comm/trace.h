/* trace.h - what a step did and when, per rank: a Chrome trace (the JSON
 * Perfetto and chrome://tracing read) with a compute lane and a comm lane
 * per rank, and the figures that say how much communication was hidden.
 *
 * Tracing is off unless a session turns it on (`--trace FILE.json`,
 * gradc_session_trace).  While on, trace_current() returns the recorder;
 * executors bracket each kernel, GEMM and copy with trace_now_us() and
 * trace_span(TRACE_COMPUTE, ...); the comm layer records each collective
 * from its start to its completion on TRACE_COMM, and the time the rank
 * sat blocked in comm_wait as exposed communication.
 *
 * Times are microseconds since the recorder was created (a monotonic
 * clock).  Names are copied. */
#ifndef GRADC_TRACE_H
#define GRADC_TRACE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum { TRACE_COMPUTE, TRACE_COMM, TRACE_STEP } TraceLane;

typedef struct Trace Trace;

typedef struct TraceStats {
  double comm_us;    /* total time collectives were in flight (start to completion), summed */
  double exposed_us; /* time the rank was blocked waiting for collectives (not covered by compute) */
  double compute_us; /* total time of compute spans */
  int64_t collectives;
} TraceStats;

Trace *trace_new(int rank);
void trace_free(Trace *t);
/* The recorder this thread's executor and comm layer report to, or NULL
 * (tracing off).  trace_set_current(NULL) turns reporting off. */
Trace *trace_current(void);
void trace_set_current(Trace *t);
double trace_now_us(const Trace *t);
void trace_span(Trace *t, TraceLane lane, const char *name, double t0_us, double t1_us);
/* Blocked-in-wait time, added to exposed_us (and drawn on the comm lane as "wait"). */
void trace_exposed(Trace *t, double t0_us, double t1_us);
void trace_stats(const Trace *t, TraceStats *out);
/* Write this rank's events as a Chrome trace JSON file (pid = rank). */
bool trace_write(const Trace *t, const char *path, char *err, size_t n);

/* What gathering every rank's events into one file needs (comm.c's
 * comm_trace_gather).  The recorder's origin on the monotonic clock (ranks
 * of one machine share it, so origins line up their timelines), its rank,
 * its events (this rank's and any added), and adding an event of another
 * rank, in this recorder's time.  trace_stats counts this rank's only. */
typedef struct TraceEventInfo {
  double t0_us, t1_us;
  const char *name;  /* owned by the recorder */
  int rank;
  TraceLane lane;
  bool exposed;      /* a trace_exposed span */
} TraceEventInfo;

double trace_origin_us(const Trace *t);
int trace_rank(const Trace *t);
size_t trace_count(const Trace *t);
bool trace_event(const Trace *t, size_t i, TraceEventInfo *out);
void trace_add_rank(Trace *t, int rank, TraceLane lane, const char *name, double t0_us, double t1_us, bool exposed);

#endif
