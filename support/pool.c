/* pool.c - a fixed set of worker threads that split a loop [0, n) with the
 * calling thread: the CPU executor runs each kernel's rows on it.
 *
 * pool_run publishes one job (a pointer to a descriptor on the caller's
 * stack) and bumps a generation counter; workers wake (spinning briefly,
 * then on a condition variable), take chunks from an atomic counter, and
 * the caller takes chunks too.  The caller returns once every chunk is done
 * and no worker still holds the job's pointer, so the descriptor can live
 * on its stack.  The protocol, in sequentially consistent atomics:
 *
 *   worker: active++; job = cur; if job: run chunks; active--
 *   caller: cur = &job; gen++; run chunks; wait done == nchunks;
 *           cur = NULL; wait active == 0
 *
 * A worker that read &job did so before the caller cleared cur, so its
 * active++ is visible to the caller's final wait. */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

#include "support.h"

typedef struct PoolJob {
  PoolFn fn;
  void *ctx;
  int64_t n, chunk, nchunks;
  atomic_llong next; /* next chunk to take */
  atomic_llong done; /* chunks finished */
} PoolJob;

struct Pool {
  int nthreads; /* the caller included */
  pthread_t *threads;
  pthread_mutex_t mu;
  pthread_cond_t wake;
  atomic_uint gen;
  atomic_bool stop;
  _Atomic(PoolJob *) cur;
  atomic_int active;
};

#define SPIN 4000

static void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

static void run_chunks(PoolJob *j) {
  for (;;) {
    int64_t c = atomic_fetch_add(&j->next, 1);
    if (c >= j->nchunks) return;
    int64_t b = c * j->chunk, e = b + j->chunk < j->n ? b + j->chunk : j->n;
    j->fn(j->ctx, b, e);
    atomic_fetch_add(&j->done, 1);
  }
}

static void *worker(void *arg) {
  Pool *p = arg;
  unsigned seen = 0;
  for (;;) {
    int spins = 0;
    while (atomic_load(&p->gen) == seen && !atomic_load(&p->stop) && spins < SPIN) {
      cpu_relax();
      spins++;
    }
    if (atomic_load(&p->gen) == seen && !atomic_load(&p->stop)) {
      pthread_mutex_lock(&p->mu);
      while (atomic_load(&p->gen) == seen && !atomic_load(&p->stop)) pthread_cond_wait(&p->wake, &p->mu);
      pthread_mutex_unlock(&p->mu);
    }
    if (atomic_load(&p->stop)) return NULL;
    seen = atomic_load(&p->gen);
    atomic_fetch_add(&p->active, 1);
    PoolJob *j = atomic_load(&p->cur);
    if (j) run_chunks(j);
    atomic_fetch_sub(&p->active, 1);
  }
}

int pool_ncores(void) {
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? (int)n : 1;
}

Pool *pool_new(int nthreads) {
  if (nthreads <= 0) nthreads = pool_ncores();
  Pool *p = calloc(1, sizeof *p);
  if (!p) abort();
  p->nthreads = nthreads;
  pthread_mutex_init(&p->mu, NULL);
  pthread_cond_init(&p->wake, NULL);
  atomic_init(&p->gen, 0);
  atomic_init(&p->stop, false);
  atomic_init(&p->cur, NULL);
  atomic_init(&p->active, 0);
  p->threads = calloc((size_t)nthreads, sizeof(pthread_t));
  if (!p->threads) abort();
  for (int i = 1; i < nthreads; i++)
    if (pthread_create(&p->threads[i], NULL, worker, p) != 0) {
      p->nthreads = i; /* run with the threads we got */
      break;
    }
  return p;
}

int pool_size(const Pool *p) { return p ? p->nthreads : 1; }

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
  PoolJob j;
  j.fn = fn;
  j.ctx = ctx;
  j.n = n;
  j.chunk = (n + nchunks - 1) / nchunks;
  j.nchunks = (n + j.chunk - 1) / j.chunk;
  atomic_init(&j.next, 0);
  atomic_init(&j.done, 0);
  atomic_store(&p->cur, &j);
  pthread_mutex_lock(&p->mu);
  atomic_fetch_add(&p->gen, 1);
  pthread_cond_broadcast(&p->wake);
  pthread_mutex_unlock(&p->mu);
  run_chunks(&j);
  for (int spins = 0; atomic_load(&j.done) < j.nchunks; spins++)
    if (spins < SPIN)
      cpu_relax();
    else
      sched_yield();
  atomic_store(&p->cur, NULL);
  while (atomic_load(&p->active) != 0) sched_yield();
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
  free(p->threads);
  free(p);
}
