/* pool.c - a fixed set of worker threads that split a loop [0, n) with the
 * calling thread: the CPU executor runs each kernel's rows and each GEMM's
 * blocks on it.
 *
 * pool_run writes the job (function, context, chunking) into the pool,
 * then deals its chunks out in contiguous shares, thread t (the caller
 * is thread 0) the t-th share, by storing one 64-bit slot per thread,
 * (generation, end of its share, next chunk), and bumping the wake
 * counter.  Each thread takes its own share's chunks from the front by
 * compare-and-swap on its slot, then the chunks other threads have not
 * started from the back of their shares (so a thread that is late,
 * descheduled or asleep holds up nobody).  A take fails once the slot's
 * generation is not the one the taker woke for: a worker that wakes late
 * cannot take a chunk of a finished job or of the next one.  The job's
 * fields are read only after a successful take, and the caller rewrites
 * them only after every taken chunk is done, so they are stable while
 * anyone uses them; the caller never waits for idle workers.
 *
 * Why shares: a kernel's iterations are rows (or row tiles) in order, so
 * with the same thread taking the same part of every job, the rows one
 * thread writes in one kernel are the ones it reads in the next, from its
 * own cache rather than from the other core's (docs/DECISIONS.md
 * "Chunks in shares, by thread").
 *
 * Waiting never burns a core for long and never yields in a loop (on a
 * machine with as many threads as cores, sched_yield storms cost more
 * system time than the work): workers spin about 50 us for the next job
 * (kernels come back to back within a step), then sleep on a condition
 * variable; the caller, once no chunk is left to take, spins as long for
 * the chunks still running, then sleeps until the thread that finishes
 * the last one wakes it.  pool_wake rouses sleeping workers ahead of the
 * jobs to come, so that a step's first kernel does not wait out their
 * wake-up (tens of microseconds on a VM) on top of its own work. */
#define _GNU_SOURCE /* sched_getaffinity */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "support.h"

/* A thread's slot: generation << 32 | end of its share << 16 | next
 * chunk of it; chunks [next, end) are left. */
#define S_GEN(t) ((uint32_t)((t) >> 32))
#define S_END(t) ((int64_t)(((t) >> 16) & 0xffff))
#define S_NEXT(t) ((int64_t)((t) & 0xffff))
#define S_ONE_END ((uint64_t)1 << 16)
#define MAX_CHUNKS 0xffff

/* On a cache line of its own: the owner and thieves write it. */
typedef struct Slot {
  _Alignas(64) _Atomic uint64_t w;
} Slot;

typedef struct Worker {
  struct Pool *pool;
  int id; /* 1 .. nthreads - 1 */
} Worker;

struct Pool {
  int nthreads; /* the caller included */
  pthread_t *threads;
  Worker *workers;
  pthread_mutex_t mu;
  pthread_cond_t wake;     /* workers: a new job (gen changed) or stop */
  pthread_cond_t finished; /* the caller: the last chunk of its job is done */
  atomic_uint gen;         /* bumped for every job; workers wake on a change */
  atomic_bool stop;
  atomic_int sleepers;     /* workers asleep on `wake` (or about to be) */
  unsigned pokes;          /* pool_wake calls, under mu: a sleeper wakes on a change */
  Slot *slots;             /* by thread: its share of the current job */
  atomic_llong done;       /* chunks of the current job finished */
  /* The current job (see above for who may read it when). */
  PoolFn fn;
  void *ctx;
  int64_t n, chunk, nchunks;
};

/* About 50 us of pause instructions (~25 ns each on current x86). */
#define SPIN 2000

static void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

/* One chunk of job generation g from slot w: its first left (own, the
 * front) or its last (another's, the back); -1 when none is left. */
static int64_t take(_Atomic uint64_t *w, uint32_t g, bool own) {
  uint64_t t = atomic_load(w);
  for (;;) {
    if (S_GEN(t) != g || S_NEXT(t) >= S_END(t)) return -1;
    uint64_t left = own ? t + 1 : t - S_ONE_END;
    if (atomic_compare_exchange_weak(w, &t, left)) return own ? S_NEXT(t) : S_END(t) - 1;
  }
}

/* Thread `me` runs chunks of job generation g until none is left: its
 * own share's, then the others' (the next thread's first). */
static void run_chunks(Pool *p, uint32_t g, int me) {
  for (int k = 0; k < p->nthreads; k++) {
    int who = (me + k) % p->nthreads;
    for (int64_t c; (c = take(&p->slots[who].w, g, k == 0)) >= 0;) {
      int64_t b = c * p->chunk, e = b + p->chunk < p->n ? b + p->chunk : p->n;
      p->fn(p->ctx, b, e);
      if (atomic_fetch_add(&p->done, 1) + 1 == p->nchunks) {
        /* The last chunk: wake the caller if it went to sleep (it checks
         * `done` under the mutex, so the wake-up cannot be lost). */
        pthread_mutex_lock(&p->mu);
        pthread_cond_signal(&p->finished);
        pthread_mutex_unlock(&p->mu);
      }
    }
  }
}

static void *worker(void *arg) {
  const Worker *me = arg;
  Pool *p = me->pool;
  unsigned seen = 0;
  for (;;) {
    for (int spins = 0; atomic_load(&p->gen) == seen && !atomic_load(&p->stop) && spins < SPIN; spins++)
      cpu_relax();
    if (atomic_load(&p->gen) == seen && !atomic_load(&p->stop)) {
      pthread_mutex_lock(&p->mu);
      atomic_fetch_add(&p->sleepers, 1);
      unsigned pokes = p->pokes;
      while (atomic_load(&p->gen) == seen && !atomic_load(&p->stop) && p->pokes == pokes)
        pthread_cond_wait(&p->wake, &p->mu);
      atomic_fetch_sub(&p->sleepers, 1);
      pthread_mutex_unlock(&p->mu);
      if (atomic_load(&p->gen) == seen && !atomic_load(&p->stop)) continue; /* woken early: spin for the job */
    }
    if (atomic_load(&p->stop)) return NULL;
    seen = atomic_load(&p->gen);
    run_chunks(p, seen, me->id);
  }
}

int pool_quota_cpus_of(const char *quota, const char *period) {
  char *end;
  if (!quota) return 0;
  errno = 0;
  long long q = strtoll(quota, &end, 10);
  if (end == quota || errno || q <= 0) return 0; /* "max" (v2), -1 (v1): no limit */
  long long per = 100000;                        /* the kernel's default period */
  const char *ps = period ? period : end;        /* v2: "quota period" in one file */
  while (*ps == ' ') ps++;
  if (*ps && *ps != '\n') {
    per = strtoll(ps, &end, 10);
    if (end == ps || errno || per <= 0) return 0;
  }
  long long n = (q + per - 1) / per;
  return n > 4096 ? 4096 : (int)n;
}

/* CPUs a CFS bandwidth limit on one cgroup directory leaves. */
static uint64_t cgroup_cpus(const char *dir, bool v2) {
  char q[128], per[64];
  if (!cgroup_read(dir, v2 ? "cpu.max" : "cpu.cfs_quota_us", q, sizeof q)) return 0;
  bool has_per = !v2 && cgroup_read(dir, "cpu.cfs_period_us", per, sizeof per);
  return (uint64_t)pool_quota_cpus_of(q, has_per ? per : NULL);
}

/* CPUs a CFS bandwidth limit leaves this process (docker --cpus, a
 * Kubernetes CPU limit): ceil(quota / period) over its cgroup and the
 * cgroup's parents, v2 (cpu.max) or v1 (cpu.cfs_quota_us), 0 when none. */
static int quota_cpus(void) { return (int)cgroup_least_limit("cpu", cgroup_cpus); }

/* The CPUs this process may run on: its affinity mask (taskset, a
 * container's cpuset, mpirun's binding), as OpenMP and PyTorch count them,
 * not every online CPU, and no more than a CPU quota allows.  A pool wider
 * than that time-slices its threads or is throttled: tinygpt small under
 * `taskset -c 0` trained at two thirds of the rate of --threads 1, under a
 * one-CPU quota at two thirds to four fifths (docs/DECISIONS.md). */
int pool_ncores(void) {
  int n = 0;
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0) n = CPU_COUNT(&set);
  if (n <= 0) {
    long on = sysconf(_SC_NPROCESSORS_ONLN);
    n = on > 0 ? (int)on : 1;
  }
  int q = quota_cpus();
  return q > 0 && q < n ? q : n;
}

Pool *pool_new(int nthreads) {
  if (nthreads <= 0) nthreads = pool_ncores();
  if (nthreads > MAX_CHUNKS / 4) nthreads = MAX_CHUNKS / 4;
  Pool *p = mem_calloc(1, sizeof *p);
  p->nthreads = nthreads;
  pthread_mutex_init(&p->mu, NULL);
  pthread_cond_init(&p->wake, NULL);
  pthread_cond_init(&p->finished, NULL);
  atomic_init(&p->gen, 0);
  atomic_init(&p->stop, false);
  atomic_init(&p->sleepers, 0);
  atomic_init(&p->done, 0);
  p->slots = aligned_alloc(_Alignof(Slot), sizeof(Slot) * (size_t)nthreads);
  if (!p->slots) abort(); /* as mem_alloc does */
  for (int i = 0; i < nthreads; i++) atomic_init(&p->slots[i].w, 0);
  p->threads = mem_calloc((size_t)nthreads, sizeof(pthread_t));
  p->workers = mem_calloc((size_t)nthreads, sizeof(Worker));
  for (int i = 1; i < nthreads; i++) {
    p->workers[i] = (Worker){p, i};
    if (pthread_create(&p->threads[i], NULL, worker, &p->workers[i]) != 0) {
      p->nthreads = i; /* run with the threads we got */
      break;
    }
  }
  return p;
}

int pool_size(const Pool *p) { return p ? p->nthreads : 1; }

void pool_wake(Pool *p) {
  if (!p || atomic_load(&p->sleepers) == 0) return;
  pthread_mutex_lock(&p->mu);
  p->pokes++;
  pthread_cond_broadcast(&p->wake);
  pthread_mutex_unlock(&p->mu);
}

void pool_run(Pool *p, int64_t n, int64_t grain, PoolFn fn, void *ctx) {
  if (n <= 0) return;
  if (grain < 1) grain = 1;
  int nt = pool_size(p);
  int64_t nchunks = (n + grain - 1) / grain;
  if (nchunks > 4 * (int64_t)nt) nchunks = 4 * (int64_t)nt;
  if (nt == 1 || nchunks <= 1) {
    fn(ctx, 0, n);
    return;
  }
  p->fn = fn;
  p->ctx = ctx;
  p->n = n;
  p->chunk = (n + nchunks - 1) / nchunks;
  nchunks = (n + p->chunk - 1) / p->chunk;
  p->nchunks = nchunks;
  atomic_store(&p->done, 0);
  uint32_t g = atomic_load(&p->gen) + 1;
  for (int t = 0; t < nt; t++) /* thread t's share: chunks [t c / nt, (t + 1) c / nt) */
    atomic_store(&p->slots[t].w,
                 (uint64_t)g << 32 | (uint64_t)(nchunks * (t + 1) / nt) << 16 | (uint64_t)(nchunks * t / nt));
  atomic_store(&p->gen, g);
  /* Spinning workers see gen change by themselves; only sleeping ones
   * need the (system-call) broadcast.  A worker counts itself a sleeper
   * under the mutex before it checks gen, so taking the mutex (pool_wake) orders
   * the two: either it sees the new gen or we see it asleep. */
  pool_wake(p);
  run_chunks(p, g, 0);
  for (int spins = 0; atomic_load(&p->done) < nchunks && spins < SPIN; spins++) cpu_relax();
  if (atomic_load(&p->done) < nchunks) {
    pthread_mutex_lock(&p->mu);
    while (atomic_load(&p->done) < nchunks) pthread_cond_wait(&p->finished, &p->mu);
    pthread_mutex_unlock(&p->mu);
  }
}

void pool_free(Pool *p) {
  if (!p) return;
  pthread_mutex_lock(&p->mu);
  atomic_store(&p->stop, true);
  pthread_cond_broadcast(&p->wake);
  pthread_mutex_unlock(&p->mu);
  for (int i = 1; i < p->nthreads; i++) pthread_join(p->threads[i], NULL);
  pthread_mutex_destroy(&p->mu);
  pthread_cond_destroy(&p->wake);
  pthread_cond_destroy(&p->finished);
  free(p->threads);
  free(p->workers);
  free(p->slots);
  free(p);
}
