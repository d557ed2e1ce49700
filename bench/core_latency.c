/* core_latency.c - how long one cache line takes to go from one core to
 * another and back right now: printed by bench/run.py beside its tables,
 * as fma_peak.c's FMA rate is.
 *
 * A virtual machine's two CPUs can sit near each other on the host (one
 * die, one L3) or apart: on an AMD EPYC host the round trip measured
 * 49-67 ns at one moment and 315-340 ns at the next, as the host moved
 * them.  Two independent processes do not notice (each core runs at full
 * speed), but a step that hands every kernel's rows and every GEMM's
 * pieces from one thread to the other does: tinygpt small at two threads
 * took 1.04 ms with the cores near and 1.84-1.90 ms, its one-thread time,
 * with them apart (docs/DECISIONS.md "Two threads on two dies").
 *
 * Two threads, pinned to the first two CPUs of the affinity mask, pass a
 * counter back and forth through one cache line ROUNDS times; five runs,
 * the fastest kept (noise only slows a run).  Built by `cmake --build
 * build --target core_latency`; bench/run.py runs it.
 *
 * Usage: core_latency
 * Prints one line: `ROUND_TRIP_NS CPU_A CPU_B`; exit status 1 when the
 * process may run on fewer than two CPUs. */
#define _GNU_SOURCE /* CPU_SET, pthread_setaffinity_np */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <time.h>

#define ROUNDS 20000
#define RUNS 5

/* The line the two threads pass, alone on its cache line. */
static _Alignas(128) _Atomic long ball;

static double now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

/* Odd values are the first thread's serves, even ones the returns. */
static void *returner(void *arg) {
  (void)arg;
  for (long i = 0; i < (long)RUNS * ROUNDS; i++) {
    while (atomic_load_explicit(&ball, memory_order_acquire) != 2 * i + 1) {
    }
    atomic_store_explicit(&ball, 2 * i + 2, memory_order_release);
  }
  return NULL;
}

int main(void) {
  cpu_set_t mask;
  int cpus[2], n = 0;
  if (sched_getaffinity(0, sizeof mask, &mask) != 0) {
    perror("core_latency: sched_getaffinity");
    return 1;
  }
  for (int c = 0; c < CPU_SETSIZE && n < 2; c++)
    if (CPU_ISSET(c, &mask)) cpus[n++] = c;
  if (n < 2) {
    fprintf(stderr, "core_latency: needs two CPUs, the affinity mask has %d\n", n);
    return 1;
  }
  /* Each thread on its CPU before it runs: the returner is created
   * pinned, so it cannot start anywhere else (or not at all, silently). */
  cpu_set_t a, b;
  CPU_ZERO(&a);
  CPU_SET(cpus[0], &a);
  CPU_ZERO(&b);
  CPU_SET(cpus[1], &b);
  pthread_attr_t attr;
  pthread_t t;
  if (pthread_attr_init(&attr) != 0 || pthread_attr_setaffinity_np(&attr, sizeof b, &b) != 0 ||
      pthread_setaffinity_np(pthread_self(), sizeof a, &a) != 0 || pthread_create(&t, &attr, returner, NULL) != 0) {
    fprintf(stderr, "core_latency: cannot run threads on CPUs %d and %d\n", cpus[0], cpus[1]);
    return 1;
  }
  pthread_attr_destroy(&attr);
  double best = 0;
  for (long r = 0; r < RUNS; r++) {
    double t0 = now_ns();
    for (long i = r * ROUNDS; i < (r + 1) * ROUNDS; i++) {
      atomic_store_explicit(&ball, 2 * i + 1, memory_order_release);
      while (atomic_load_explicit(&ball, memory_order_acquire) != 2 * i + 2) {
      }
    }
    double ns = (now_ns() - t0) / ROUNDS;
    if (r == 0 || ns < best) best = ns;
  }
  pthread_join(t, NULL);
  printf("%.0f %d %d\n", best, cpus[0], cpus[1]);
  return 0;
}
