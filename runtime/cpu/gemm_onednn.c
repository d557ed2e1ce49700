/* gemm_onednn.c - the oneDNN GEMM provider (gemm.h): one matmul
 * primitive per GEMM shape, from a cache keyed by the whole descriptor
 * (type, transposes, sizes, leading dimensions, batch strides, beta,
 * epilogue, threads), so a program's pieces of one shape and every
 * program in the process share one primitive.
 *
 * oneDNN dispatches on the ISA itself (brgemm kernels for AVX-512 and
 * AMX, its jit sgemm for AVX2); the choice of provider measures it rather
 * than trusting that.  What the matmul primitive does here:
 *   - operands are strided memory descriptors: a transpose is a pair of
 *     strides, each batch level a leading dimension (stride 0: a
 *     broadcast operand, dimension 1);
 *   - beta = 1 is the sum post-op; bias is the matmul's bias argument;
 *     gelu (tanh) and relu eltwise post-ops; the residual a binary add post-op;
 *   - bf16 A and B into f32 C, or into bf16 C (the primitive rounds its
 *     f32 accumulator), where the CPU has bf16 kernels (else pd creation
 *     fails and gemm.c widens to f32 and rounds);
 *   - no f64 matmul on the CPU: f64 plans fail and gemm.c hands them to
 *     the next provider;
 *   - a large weight gradient (f32, one matrix, A transposed and B not,
 *     no epilogue, at least JIT_MIN_MACS multiply-adds: x^T dy over a
 *     batch's rows, stored or accumulated) runs on the jit sgemm
 *     (gemm:jit) where oneDNN offers it, every other product on the
 *     implementation oneDNN lists first (its brgemm kernels on AVX-512):
 *     a rule of the shape, not a measurement, so every process on a CPU
 *     picks the same kernel and rounds alike (docs/DECISIONS.md
 *     "oneDNN's kernel for weight gradients").
 * Concurrency: the scratchpad is the caller's (user mode), so one
 * primitive can run in several threads at once; each call takes a stream,
 * a scratch buffer and the memory objects of its arguments from a small
 * free list of contexts (the objects are made once per context and
 * primitive and pointed at each call's buffers: creating and destroying
 * five per call was ~15% of tinygpt small's step, in malloc and free).  Threads: the library is
 * built on OpenMP, whose per-thread thread count (omp_set_num_threads
 * from the calling thread) is what a primitive runs with; a plan records
 * the count it was built for and a call sets it when it differs. */
#include <omp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <oneapi/dnnl/dnnl.h>

#include "gemm.h"
#include "support/support.h"

#if DNNL_CPU_RUNTIME != DNNL_RUNTIME_OMP
#error "gradc's oneDNN provider sets threads through OpenMP (a oneDNN built with DNNL_CPU_RUNTIME=OMP)"
#endif

static pthread_once_t engine_once = PTHREAD_ONCE_INIT;
static dnnl_engine_t engine;
static dnnl_status_t engine_status;

static void engine_init(void) { engine_status = dnnl_engine_create(&engine, dnnl_cpu, 0); }

static bool usable(char *why, size_t n) {
  pthread_once(&engine_once, engine_init);
  if (engine_status != dnnl_success) {
    snprintf(why, n, "oneDNN cannot create a CPU engine (status %d)", (int)engine_status);
    return false;
  }
  return true;
}

static void version(char *buf, size_t n) {
  const dnnl_version_t *v = dnnl_version();
  snprintf(buf, n, "oneDNN %d.%d.%d (%s)", v->major, v->minor, v->patch, v->hash ? v->hash : "");
}

/* ------------------------------------------------------------------ */
/* Streams and scratch for one call                                    */
/* ------------------------------------------------------------------ */

/* A context's memory objects for one primitive: src, weights, dst, the
 * bias or binary operand, the scratchpad (NULL where it has none). */
#define NARGS 5
typedef struct Args {
  const struct Prim *prim;
  dnnl_memory_t m[NARGS];
} Args;

#define NSLOTS 128 /* primitives whose objects a context keeps, by Prim.id */

typedef struct Ctx {
  dnnl_stream_t stream;
  void *scratch;
  size_t cap;
  Args slot[NSLOTS];
  struct Ctx *next;
} Ctx;

static pthread_mutex_t ctx_lock = PTHREAD_MUTEX_INITIALIZER;
static Ctx *ctx_free;

static Ctx *ctx_get(void) {
  pthread_mutex_lock(&ctx_lock);
  Ctx *c = ctx_free;
  if (c) ctx_free = c->next;
  pthread_mutex_unlock(&ctx_lock);
  if (c) return c;
  c = mem_calloc(1, sizeof *c);
  dnnl_status_t s = dnnl_stream_create(&c->stream, engine, dnnl_stream_default_flags);
  GRADC_ASSERT(s == dnnl_success);
  return c;
}

static void ctx_put(Ctx *c) {
  pthread_mutex_lock(&ctx_lock);
  c->next = ctx_free;
  ctx_free = c;
  pthread_mutex_unlock(&ctx_lock);
}

/* ------------------------------------------------------------------ */
/* Primitives, cached by descriptor                                    */
/* ------------------------------------------------------------------ */

typedef struct Prim {
  CpuGemmDesc d;
  int id; /* in order of building: its slot in a context (Ctx.slot) */
  dnnl_primitive_t prim;
  dnnl_memory_desc_t a, b, c, bias, extra;
  size_t scratch; /* bytes */
  char impl[64];  /* oneDNN's implementation name (brg:avx512_core, gemm:jit, ...) */
  struct Prim *next;
} Prim;

static pthread_mutex_t cache_lock = PTHREAD_MUTEX_INITIALIZER;
#define NBUCKETS 256
static Prim *cache[NBUCKETS];
static int nprims;

/* The descriptor as a cache key: every field, padding excluded. */
static uint64_t desc_hash(const CpuGemmDesc *d) {
  int64_t k[20] = {d->type,      d->ta,       d->tb,       d->accumulate, d->M,       d->N,       d->K,
                   d->lda,       d->ldb,      d->ldc,      d->batch,      d->stride_a, d->stride_b, d->stride_c,
                   d->outer,     d->outer_a,  d->outer_b,  d->outer_c,    d->threads,
                   (d->epilogue * 1000003 + d->ldr) * 2 + d->c_bf16};
  return hash_bytes(k, sizeof k, HASH_SEED);
}

static bool desc_eq(const CpuGemmDesc *x, const CpuGemmDesc *y) {
  return x->type == y->type && x->ta == y->ta && x->tb == y->tb && x->accumulate == y->accumulate && x->M == y->M &&
         x->N == y->N && x->K == y->K && x->lda == y->lda && x->ldb == y->ldb && x->ldc == y->ldc &&
         x->batch == y->batch && x->stride_a == y->stride_a && x->stride_b == y->stride_b &&
         x->stride_c == y->stride_c && x->outer == y->outer && x->outer_a == y->outer_a &&
         x->outer_b == y->outer_b && x->outer_c == y->outer_c && x->threads == y->threads && x->epilogue == y->epilogue && x->ldr == y->ldr &&
         x->c_bf16 == y->c_bf16;
}

/* The batch levels of a descriptor, outer first: none, one (batch) or
 * two (outer, batch); their sizes in n. */
static int batch_levels(const CpuGemmDesc *d, int64_t n[2]) {
  n[0] = d->outer > 1 ? d->outer : d->batch > 1 ? d->batch : 1;
  n[1] = d->batch > 1 ? d->batch : 1;
  return d->outer > 1 ? 2 : d->batch > 1 ? 1 : 0;
}

/* A matrix rows x cols (logical), stored row-major with leading dimension
 * ld, transposed when t; with nl batch dimensions of sizes n and element
 * strides s in front (stride 0: one matrix broadcast over that level,
 * dimension 1). */
static dnnl_status_t matrix_md(dnnl_memory_desc_t *md, int nl, const int64_t *n, const int64_t *s, int64_t rows,
                               int64_t cols, int64_t ld, bool t, dnnl_data_type_t dt) {
  dnnl_dims_t dims, strides;
  int nd = 0;
  for (int l = 0; l < nl; l++) {
    dims[nd] = s[l] ? n[l] : 1;
    strides[nd++] = s[l] ? s[l] : rows * cols;
  }
  dims[nd] = rows;
  strides[nd++] = t ? 1 : ld;
  dims[nd] = cols;
  strides[nd++] = t ? ld : 1;
  return dnnl_memory_desc_init_by_strides(md, nd, dims, dt, strides);
}

#define CHECK(call)                                                                                                    \
  do {                                                                                                                 \
    dnnl_status_t s_ = (call);                                                                                         \
    if (s_ != dnnl_success) {                                                                                          \
      snprintf(err, n, "oneDNN: %s failed (status %d)", #call, (int)s_);                                               \
      goto fail;                                                                                                       \
    }                                                                                                                  \
  } while (0)

/* Whether d is a weight gradient, x^T dy, in the sense of the kernel
 * rule above. */
#define JIT_MIN_MACS (1 << 26) /* 256 x 256 x 1024 */
static bool weight_gradient(const CpuGemmDesc *d) {
  return d->type == CPU_GEMM_F32 && d->ta && !d->tb && d->epilogue == CPU_EPI_NONE && d->batch <= 1 &&
         d->outer <= 1 && (double)d->M * (double)d->N * (double)d->K >= JIT_MIN_MACS;
}

/* md's implementation named `name` (oneDNN's own order, first match),
 * or NULL where it offers none. */
static dnnl_primitive_desc_t impl_named(const dnnl_matmul_desc_t *md, dnnl_primitive_attr_t attr, const char *name) {
  dnnl_primitive_desc_iterator_t it;
  if (dnnl_primitive_desc_iterator_create(&it, md, attr, engine, NULL) != dnnl_success) return NULL;
  dnnl_primitive_desc_t found = NULL;
  do {
    dnnl_primitive_desc_t q = dnnl_primitive_desc_iterator_fetch(it);
    const char *impl = NULL;
    if (q && dnnl_primitive_desc_query(q, dnnl_query_impl_info_str, 0, &impl) == dnnl_success && impl &&
        strcmp(impl, name) == 0)
      found = q;
    else if (q)
      dnnl_primitive_desc_destroy(q);
  } while (!found && dnnl_primitive_desc_iterator_next(it) == dnnl_success);
  dnnl_primitive_desc_iterator_destroy(it);
  return found;
}

static Prim *build(const CpuGemmDesc *d, char *err, size_t n) {
  Prim *p = mem_calloc(1, sizeof *p);
  p->d = *d;
  dnnl_primitive_attr_t attr = NULL;
  dnnl_post_ops_t po = NULL;
  dnnl_primitive_desc_t pd = NULL;
  dnnl_data_type_t in = d->type == CPU_GEMM_BF16 ? dnnl_bf16 : dnnl_f32;
  int64_t nb[2], one[2] = {1, 1}, none[2] = {0, 0};
  int nl = batch_levels(d, nb);
  int64_t sa[2] = {d->outer_a, d->stride_a}, sb[2] = {d->outer_b, d->stride_b}, sc[2] = {d->outer_c, d->stride_c};
  if (nl == 1) sa[0] = d->stride_a, sb[0] = d->stride_b, sc[0] = d->stride_c;
  for (int l = 0; l < nl; l++)
    if (!sc[l]) sc[l] = l == nl - 1 ? d->M * d->ldc : nb[l + 1] * sc[l + 1]; /* C's matrices never repeat */
  CHECK(matrix_md(&p->a, nl, nb, sa, d->M, d->K, d->lda, d->ta, in));
  CHECK(matrix_md(&p->b, nl, nb, sb, d->K, d->N, d->ldb, d->tb, in));
  CHECK(matrix_md(&p->c, nl, nb, sc, d->M, d->N, d->ldc, false, d->c_bf16 ? dnnl_bf16 : dnnl_f32));
  bool bias = d->epilogue == CPU_EPI_BIAS || d->epilogue == CPU_EPI_BIAS_GELU || d->epilogue == CPU_EPI_BIAS_RELU;
  if (bias) CHECK(matrix_md(&p->bias, nl, one, none, 1, d->N, d->N, false, dnnl_f32));
  dnnl_matmul_desc_t md;
  CHECK(dnnl_matmul_desc_init(&md, &p->a, &p->b, bias ? &p->bias : NULL, &p->c));
  CHECK(dnnl_primitive_attr_create(&attr));
  CHECK(dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user));
  CHECK(dnnl_post_ops_create(&po));
  if (d->epilogue == CPU_EPI_BIAS_GELU) CHECK(dnnl_post_ops_append_eltwise(po, 1.0f, dnnl_eltwise_gelu_tanh, 0.f, 0.f));
  if (d->epilogue == CPU_EPI_BIAS_RELU) CHECK(dnnl_post_ops_append_eltwise(po, 1.0f, dnnl_eltwise_relu, 0.f, 0.f));
  if (d->epilogue == CPU_EPI_RESIDUAL) {
    CHECK(matrix_md(&p->extra, nl, one, none, d->M, d->N, d->ldr, false, dnnl_f32));
    CHECK(dnnl_post_ops_append_binary(po, dnnl_binary_add, &p->extra));
  }
  if (d->accumulate) CHECK(dnnl_post_ops_append_sum(po, 1.0f));
  CHECK(dnnl_primitive_attr_set_post_ops(attr, po));
  /* Built for the thread count it runs with (a primitive sizes its work
   * split by the count it sees at creation). */
  int old = omp_get_max_threads();
  omp_set_num_threads(d->threads);
  dnnl_status_t s = dnnl_primitive_desc_create(&pd, &md, attr, engine, NULL);
  dnnl_primitive_desc_t jit = s == dnnl_success && weight_gradient(d) ? impl_named(&md, attr, "gemm:jit") : NULL;
  if (jit) {
    dnnl_primitive_desc_destroy(pd);
    pd = jit;
  }
  omp_set_num_threads(old);
  if (s != dnnl_success) {
    snprintf(err, n, "oneDNN has no matmul for this shape and type (status %d)", (int)s);
    goto fail;
  }
  const dnnl_memory_desc_t *smd = dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
  p->scratch = smd ? dnnl_memory_desc_get_size(smd) : 0;
  const char *impl = NULL;
  if (dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl) == dnnl_success && impl)
    snprintf(p->impl, sizeof p->impl, "%s", impl);
  omp_set_num_threads(d->threads);
  s = dnnl_primitive_create(&p->prim, pd);
  omp_set_num_threads(old);
  if (s != dnnl_success) {
    snprintf(err, n, "oneDNN: cannot create the matmul primitive (status %d)", (int)s);
    goto fail;
  }
  dnnl_primitive_desc_destroy(pd);
  dnnl_post_ops_destroy(po);
  dnnl_primitive_attr_destroy(attr);
  return p;
fail:
  if (pd) dnnl_primitive_desc_destroy(pd);
  if (po) dnnl_post_ops_destroy(po);
  if (attr) dnnl_primitive_attr_destroy(attr);
  free(p);
  return NULL;
}

static void *plan(const CpuGemmDesc *d, char *err, size_t n) {
  if (!usable(err, n)) return NULL;
  if (d->type == CPU_GEMM_F64) {
    snprintf(err, n, "oneDNN has no f64 matmul on the CPU");
    return NULL;
  }
  uint64_t h = desc_hash(d);
  pthread_mutex_lock(&cache_lock);
  Prim *p = cache[h % NBUCKETS];
  while (p && !desc_eq(&p->d, d)) p = p->next;
  if (!p) {
    p = build(d, err, n);
    if (p) {
      p->id = nprims++;
      p->next = cache[h % NBUCKETS];
      cache[h % NBUCKETS] = p;
    }
  }
  pthread_mutex_unlock(&cache_lock);
  return p;
}

/* x's memory objects for p (made on first use, or when another
 * primitive held the slot), pointed at this call's buffers. */
static dnnl_memory_t *args_for(Ctx *x, const Prim *p, const void *a, const void *b, void *c, const float *extra) {
  Args *s = &x->slot[p->id % NSLOTS];
  const dnnl_memory_desc_t *mds[NARGS] = {&p->a, &p->b, &p->c, NULL, NULL};
  if (p->d.epilogue == CPU_EPI_RESIDUAL) mds[3] = &p->extra;
  else if (p->d.epilogue != CPU_EPI_NONE) mds[3] = &p->bias;
  void *ptr[NARGS] = {(void *)a, (void *)b, c, (void *)extra, x->scratch};
  if (s->prim != p) {
    dnnl_memory_desc_t smd;
    if (p->scratch) {
      dnnl_status_t st = dnnl_memory_desc_init_by_tag(&smd, 1, (dnnl_dims_t){(int64_t)p->scratch}, dnnl_u8, dnnl_a);
      GRADC_ASSERT(st == dnnl_success);
      mds[4] = &smd;
    }
    for (int k = 0; k < NARGS; k++) {
      if (s->m[k]) dnnl_memory_destroy(s->m[k]);
      s->m[k] = NULL;
      if (mds[k]) {
        dnnl_status_t st = dnnl_memory_create(&s->m[k], mds[k], engine, ptr[k]);
        GRADC_ASSERT(st == dnnl_success);
      }
    }
    s->prim = p;
    return s->m;
  }
  for (int k = 0; k < NARGS; k++)
    if (s->m[k]) {
      dnnl_status_t st = dnnl_memory_set_data_handle(s->m[k], ptr[k]);
      GRADC_ASSERT(st == dnnl_success);
    }
  return s->m;
}

static void run(void *plan, const CpuGemmDesc *d, const void *a, const void *b, void *c, const float *extra) {
  const Prim *p = plan;
  Ctx *x = ctx_get();
  if (x->cap < p->scratch) {
    free(x->scratch);
    x->scratch = mem_alloc_huge(p->scratch, false);
    if (!x->scratch) abort();
    x->cap = p->scratch;
  }
  dnnl_memory_t *m = args_for(x, p, a, b, c, extra);
  dnnl_exec_arg_t args[NARGS] = {{DNNL_ARG_SRC, m[0]}, {DNNL_ARG_WEIGHTS, m[1]}, {DNNL_ARG_DST, m[2]}};
  int na = 3;
  if (m[4]) args[na++] = (dnnl_exec_arg_t){DNNL_ARG_SCRATCHPAD, m[4]};
  if (d->epilogue == CPU_EPI_RESIDUAL) args[na++] = (dnnl_exec_arg_t){DNNL_ARG_ATTR_MULTIPLE_POST_OP(0) | DNNL_ARG_SRC_1, m[3]};
  else if (d->epilogue != CPU_EPI_NONE) args[na++] = (dnnl_exec_arg_t){DNNL_ARG_BIAS, m[3]};
  if (omp_get_max_threads() != d->threads) omp_set_num_threads(d->threads);
  dnnl_status_t s = dnnl_primitive_execute(p->prim, x->stream, na, args);
  GRADC_ASSERT(s == dnnl_success);
  s = dnnl_stream_wait(x->stream);
  GRADC_ASSERT(s == dnnl_success);
  ctx_put(x);
}

/* Primitives stay in the cache for the process's life. */
static void plan_free(void *plan) { (void)plan; }

static const char *kernel(const void *plan) { return ((const Prim *)plan)->impl; }

const CpuGemmProvider cpu_gemm_onednn = {"onednn", usable, version, plan, run, plan_free, kernel};

