/* cuda.c - the CUDA back end's code generator driver (DESIGN.md §6,
 * docs/BACKEND.md): every kernel of a planned function becomes
 *
 *   extern "C" __global__ void kN_<ops>(pointers...)
 *
 * written by cuda_row.c (row kernels) or cuda_loop.c (one op in a general
 * loop nest), preceded by a comment holding the kernel's IR region.  The
 * code addresses memory only through its pointer arguments, so kernels
 * whose code is the same text (the blocks of a deep model's layers) share
 * one function: a CuCode, named after its first kernel.  The distinct
 * functions are grouped in order into chunks of a few, each chunk one
 * NVRTC program; the chunks compile in parallel on a thread pool, to
 * cubin for one architecture with the PTX kept (a device of a newer
 * architecture can still load it).  Each chunk's output is cached on disk
 * (support/cache.c, kind "cuda-img"), keyed by its source, the options,
 * the NVRTC version and the architecture, so a warm compile runs no NVRTC
 * at all; a corrupted entry is ignored with a warning. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cuda_gen.h"

#define CU_VERSION "gradc-cuda-1" /* bump when generated code or the image format changes (cache keys) */
#define CHUNK 6                   /* distinct functions per NVRTC program */

/* ------------------------------------------------------------------ */
/* Targets                                                             */
/* ------------------------------------------------------------------ */

bool cg_cuda_parse_target(const char *target, char *arch, size_t n) {
  if (!target || strncmp(target, "cuda", 4) != 0) return false;
  const char *p = target + 4;
  if (!*p) {
    if (n) arch[0] = 0;
    return true;
  }
  if (*p != ':' || strncmp(p + 1, "sm_", 3) != 0) return false;
  const char *d = p + 4;
  size_t k = 0;
  while (d[k] >= '0' && d[k] <= '9') k++;
  if (k == 0 || k > 4) return false;
  if (d[k] >= 'a' && d[k] <= 'z') k++;
  if (d[k] != 0) return false;
  return (size_t)snprintf(arch, n, "%s", p + 1) < n;
}

/* ------------------------------------------------------------------ */
/* Kernels                                                             */
/* ------------------------------------------------------------------ */

static int64_t value_bytes(const IrValue *v) {
  size_t es = v->storage == IR_STORE_GRAD ? (v->type.dtype == IR_DT_F64 ? 8 : 4) : ir_dtype_size(v->type.dtype);
  return ir_numel(&v->type.shape) * (int64_t)es;
}

/* Whether param i may be __restrict__: no other param's bytes overlap it
 * when either of them is written. */
static bool restricted(const CuGen *g, int i) {
  const CuParam *p = &g->params[i];
  int64_t lo = p->v->offset, hi = lo + value_bytes(p->v);
  for (int j = 0; j < g->nparams; j++) {
    const CuParam *q = &g->params[j];
    if (j == i || (!p->out && !q->out)) continue;
    int64_t lo2 = q->v->offset, hi2 = lo2 + value_bytes(q->v);
    if (lo < hi2 && lo2 < hi) return false;
  }
  return true;
}

/* The function's text without its name: what is before and after it. */
static void function_text(CuGen *g, const char **pre, const char **post) {
  StrBuf sb;
  sb_init(&sb);
  sb_printf(&sb, "extern \"C\" __global__ void __launch_bounds__(%u) ", g->block[0] * g->block[1]);
  *pre = arena_strdup(g->a, sb_str(&sb));
  sb.len = 0;
  sb.data[0] = 0;
  sb_puts(&sb, "(");
  char tb[IR_TYPE_STR_MAX];
  for (int i = 0; i < g->nparams; i++) {
    const CuParam *p = &g->params[i];
    sb_printf(&sb, "\n    %s%s *%s%s%s // %s%s", p->out ? "" : "const ", cu_mem_type(p->v->type.dtype, p->grad),
              restricted(g, i) ? "__restrict__ " : "", g->pname[i], i + 1 < g->nparams ? "," : ") {",
              ir_type_str(&p->v->type, tb, sizeof tb),
              p->grad ? ", gradient buffer (+=)" : "");
  }
  if (g->nparams == 0) sb_puts(&sb, ") {");
  sb_putc(&sb, '\n');
  sb_puts(&sb, sb_str(&g->body));
  sb_puts(&sb, "}\n");
  *post = arena_strdup(g->a, sb_str(&sb));
  sb_free(&sb);
}

/* The comment over a function: how it runs, its first kernel's IR region
 * and which value each pointer argument is, the other kernels that launch
 * it.  (The function's own text says nothing that differs between them.) */
static const char *code_comment(CuModule *m, const IrNames *names, int code, const char *how) {
  const CuCode *c = &m->codes[code];
  const CuKernel *k = &m->kernels[c->first];
  StrBuf sb;
  sb_init(&sb);
  sb_printf(&sb, "// %s: %s\n", k->name, how);
  for (int i = 0; i < k->nops; i++) {
    /* the op as it prints, without its arena offset (the pointers say where) */
    StrBuf op;
    sb_init(&op);
    ir_print_op(m->f, names, k->ops[i], &op);
    const char *t = sb_str(&op), *at = strstr(t, " @"), *loc = at ? strstr(at, "  loc(") : NULL;
    sb_puts(&sb, "//   ");
    if (at && loc) {
      sb_putn(&sb, t, (size_t)(at - t));
      sb_puts(&sb, loc);
    } else {
      sb_puts(&sb, t);
    }
    sb_putc(&sb, '\n');
    sb_free(&op);
  }
  int ni = 0, no = 0;
  for (int i = 0; i < k->nparams; i++) {
    const CuParam *p = &k->params[i];
    sb_puts(&sb, i == 0 ? "// " : i % 4 == 0 ? ",\n//   " : ", ");
    if (p->out)
      sb_printf(&sb, "out%d = %%%s", no++, names->name[p->v->id]);
    else
      sb_printf(&sb, "in%d = %%%s", ni++, names->name[p->v->id]);
    if (p->elem) sb_printf(&sb, " + %lld", (long long)p->elem);
  }
  if (k->nparams) sb_putc(&sb, '\n');
  if (c->nkernels > 1) {
    sb_printf(&sb, "// also launched as");
    int shown = 0;
    for (int i = c->first + 1; i < m->nkernels && shown < 12; i++)
      if (m->kernels[i].code == code) sb_printf(&sb, " %s", m->kernels[i].name), shown++;
    if (c->nkernels - 1 > shown) sb_printf(&sb, " and %d more", c->nkernels - 1 - shown);
    sb_puts(&sb, " (the same code, their own buffers)\n");
  }
  const char *r = arena_strdup(&m->a, sb_str(&sb));
  sb_free(&sb);
  return r;
}

CuModule *cg_cuda_generate(const IrFunc *f, char *err, size_t errlen) {
  CuModule *m = calloc(1, sizeof *m);
  if (!m) abort();
  arena_init(&m->a);
  m->f = f;
  KpKernels kk;
  if (!kp_kernels_find(f, &m->a, &kk, err, errlen)) {
    cg_cuda_free(m);
    return NULL;
  }
  const bool *out = kk.used_outside;
  m->maxgroup = kk.maxgroup;
  m->kernels = ARENA_ARRAY(&m->a, CuKernel, kk.n + 1);
  m->codes = ARENA_ARRAY(&m->a, CuCode, kk.n + 1);
  m->by_group = ARENA_ARRAY(&m->a, int, m->maxgroup + 1);
  for (int g = 0; g <= m->maxgroup; g++) m->by_group[g] = -1;
  StrMap reps;
  strmap_init(&reps);
  bool ok = true;
  for (int q = 0; q < kk.n && ok; q++) {
    const KpKernel *kp = &kk.k[q];
    CuKernel *k = &m->kernels[m->nkernels];
    m->by_group[kp->group] = m->nkernels++;
    k->group = kp->group;
    k->ops = kp->ops;
    k->nops = kp->n;
    k->name = kp->name;
    /* A kernel whose results nobody reads from memory (a window.sum's
     * operand, evaluated by the host) has nothing to do. */
    bool live = false;
    for (int q = 0; q < k->nops; q++) {
      const IrValue *y = k->ops[q]->result;
      live |= y && out[y->id] && y->storage != IR_STORE_NONE;
    }
    if (!live) {
      k->code = -1;
      continue;
    }
    CuGen g;
    memset(&g, 0, sizeof g);
    g.f = f;
    g.a = &m->a;
    g.err = err;
    g.errlen = errlen;
    sb_init(&g.body);
    g.indent = 1;
    if (kp->row)
      cu_row_kernel(&g, k->ops, k->nops, &kp->layout);
    else
      cu_loop_kernel(&g, k->ops[0]);
    if (g.failed) {
      char msg[512];
      snprintf(msg, sizeof msg, "%s", err ? err : "");
      errf(err, errlen, "CUDA code generation: kernel %s: %s", k->name, msg);
      sb_free(&g.body);
      ok = false;
      break;
    }
    k->params = g.params;
    k->nparams = g.nparams;
    k->block[0] = g.block[0];
    k->block[1] = g.block[1];
    k->grid = g.grid;
    const char *pre, *post;
    function_text(&g, &pre, &post);
    sb_free(&g.body);
    const char *key = arena_printf(&m->a, "%s\001%s", pre, post);
    intptr_t c = (intptr_t)strmap_get(&reps, key);
    if (!c) {
      c = ++m->ncodes;
      strmap_put(&reps, key, (void *)c);
      CuCode *cc = &m->codes[c - 1];
      cc->func = k->name;
      cc->first = m->nkernels - 1;
      cc->comment = g.how ? g.how : "";
      cc->text = arena_printf(&m->a, "%s%s%s", pre, k->name, post);
      cc->pre = pre;
      cc->post = post;
    }
    k->code = (int)c - 1;
    m->codes[c - 1].nkernels++;
  }
  strmap_free(&reps);
  if (!ok) {
    cg_cuda_free(m);
    return NULL;
  }
  /* Comments (they list the kernels sharing each function), chunks. */
  Arena tmp;
  arena_init(&tmp);
  IrNames names;
  ir_names_init(&names, f, &tmp);
  for (int c = 0; c < m->ncodes; c++) {
    m->codes[c].comment = code_comment(m, &names, c, m->codes[c].comment);
    m->codes[c].chunk = c / CHUNK;
  }
  arena_free(&tmp);
  m->nchunks = (m->ncodes + CHUNK - 1) / CHUNK;
  return m;
}

void cg_cuda_free(CuModule *m) {
  if (!m) return;
  for (int i = 0; m->images && i < m->nchunks; i++) {
    free(m->images[i].cubin);
    free(m->images[i].ptx);
  }
  free(m->images);
  free(m->warnings);
  arena_free(&m->a);
  free(m);
}

const CuKernel *cg_cuda_kernel(const CuModule *m, int group) {
  if (group < 1 || group > m->maxgroup || m->by_group[group] < 0) return NULL;
  return &m->kernels[m->by_group[group]];
}

/* ------------------------------------------------------------------ */
/* Program text                                                        */
/* ------------------------------------------------------------------ */

static int count_lines(const char *s) {
  int n = 0;
  for (; *s; s++) n += *s == '\n';
  return n;
}

void cg_cuda_print(const CuModule *m, StrBuf *out) {
  sb_printf(out, "// %s: %d kernels, %d distinct functions in %d NVRTC programs", m->f->name ? m->f->name : "?",
            m->nkernels, m->ncodes, m->nchunks);
  if (m->arch[0]) sb_printf(out, ", for %s", m->arch);
  sb_puts(out, "\n\n");
  sb_puts(out, cu_prelude);
  for (int c = 0; c < m->ncodes; c++) {
    sb_putc(out, '\n');
    sb_puts(out, m->codes[c].comment);
    sb_puts(out, m->codes[c].text);
  }
}

void cg_cuda_chunk_source(const CuModule *m, int chunk, StrBuf *out) {
  sb_puts(out, cu_prelude);
  for (int c = 0; c < m->ncodes; c++) {
    if (m->codes[c].chunk != chunk) continue;
    sb_putc(out, '\n');
    ((CuModule *)m)->codes[c].line = count_lines(sb_str(out)) + 1;
    sb_puts(out, m->codes[c].comment);
    sb_puts(out, m->codes[c].text);
  }
}

bool cg_cuda_write_dir(const CuModule *m, const char *dir, char *err, size_t errlen) {
  if (!mkdir_p(dir)) return errf(err, errlen, "%s: %s", dir, strerror(errno));
  for (int c = 0; c < m->ncodes; c++) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s.cu", dir, m->codes[c].func);
    FILE *fp = fopen(path, "w");
    if (!fp) return errf(err, errlen, "%s: %s", path, strerror(errno));
    fputs(cu_prelude, fp);
    fputc('\n', fp);
    fputs(m->codes[c].comment, fp);
    fputs(m->codes[c].text, fp);
    if (fclose(fp) != 0) return errf(err, errlen, "%s: %s", path, strerror(errno));
  }
  return true;
}

uint64_t cg_cuda_source_hash(const CuModule *m) {
  uint64_t h = hash_bytes(CU_VERSION, strlen(CU_VERSION), HASH_SEED);
  for (int i = 0; i < m->nchunks; i++) {
    StrBuf sb;
    sb_init(&sb);
    cg_cuda_chunk_source(m, i, &sb);
    h = hash_bytes(sb_str(&sb), sb.len, h);
    sb_free(&sb);
  }
  return h;
}

/* ------------------------------------------------------------------ */
/* Compiling                                                           */
/* ------------------------------------------------------------------ */

/* A cache entry: "GRDCCUI1", u64 cubin length, cubin, u64 PTX length, PTX. */
static const char img_magic[8] = {'G', 'R', 'D', 'C', 'C', 'U', 'I', '1'};

static char *image_pack(const CuImage *img, size_t *len) {
  *len = 8 + 8 + img->cubin_len + 8 + img->ptx_len;
  char *b = malloc(*len), *p = b;
  if (!b) abort();
  uint64_t n;
  memcpy(p, img_magic, 8), p += 8;
  n = img->cubin_len, memcpy(p, &n, 8), p += 8;
  memcpy(p, img->cubin, img->cubin_len), p += img->cubin_len;
  n = img->ptx_len, memcpy(p, &n, 8), p += 8;
  memcpy(p, img->ptx, img->ptx_len);
  return b;
}

static bool image_unpack(const char *b, size_t len, CuImage *img) {
  uint64_t nc, np;
  if (len < 24 || memcmp(b, img_magic, 8) != 0) return false;
  memcpy(&nc, b + 8, 8);
  if (nc > len - 24) return false;
  memcpy(&np, b + 16 + nc, 8);
  if (np != len - 24 - nc) return false;
  img->cubin = malloc(nc ? nc : 1);
  img->ptx = malloc(np + 1);
  if (!img->cubin || !img->ptx) abort();
  memcpy(img->cubin, b + 16, nc);
  memcpy(img->ptx, b + 24 + nc, np);
  img->ptx[np] = 0;
  img->cubin_len = nc;
  img->ptx_len = np;
  return true;
}

typedef struct Job {
  CuModule *m;
  const char *arch;
  char **src;      /* per chunk */
  int *todo;       /* chunks to compile */
  char **log;      /* per chunk: NVRTC's log */
  bool *ok;
} Job;

static void compile_chunks(void *ctx, int64_t begin, int64_t end) {
  Job *j = ctx;
  for (int64_t t = begin; t < end; t++) {
    int c = j->todo[t];
    char name[64], opt[64];
    snprintf(name, sizeof name, "gradc_chunk%d.cu", c);
    snprintf(opt, sizeof opt, "--gpu-architecture=%s", j->arch);
    const char *opts[] = {opt};
    j->ok[c] = cg_nvrtc_compile(j->src[c], name, opts, 1, &j->m->images[c], &j->log[c]);
  }
}

/* The kernel whose text holds line `line` of chunk c's source. */
static const char *kernel_at(const CuModule *m, int c, int line) {
  const char *best = NULL;
  for (int i = 0; i < m->ncodes; i++)
    if (m->codes[i].chunk == c && m->codes[i].line <= line) best = m->codes[i].func;
  return best;
}

/* "kernel k7_add (gradc_chunk0.cu:123)" for the first error of a log. */
static void name_failure(const CuModule *m, int c, const char *log, char *buf, size_t n) {
  const char *p = strstr(log, "): error");
  int line = 0;
  if (p) {
    const char *q = p;
    while (q > log && q[-1] >= '0' && q[-1] <= '9') q--;
    if (q > log && q[-1] == '(') line = atoi(q);
  }
  const char *k = line ? kernel_at(m, c, line) : NULL;
  if (k)
    snprintf(buf, n, "kernel %s (gradc_chunk%d.cu line %d)", k, c, line);
  else
    snprintf(buf, n, "program gradc_chunk%d.cu", c);
}

bool cg_cuda_compile(CuModule *m, const CuCompileOptions *o, char *err, size_t errlen) {
  char have[512], ver[64];
  snprintf(m->arch, sizeof m->arch, "%s", o->arch && *o->arch ? o->arch : CG_CUDA_DEFAULT_ARCH);
  if (m->nchunks == 0) {
    m->images = calloc(1, sizeof(CuImage));
    if (!m->images) abort();
    return true;
  }
  if (!m->images) {
    m->images = calloc((size_t)m->nchunks, sizeof(CuImage));
    if (!m->images) abort();
  }
  /* Sources and keys; the cache first. */
  char **src = calloc((size_t)m->nchunks, sizeof(char *));
  uint64_t *key = calloc((size_t)m->nchunks, sizeof(uint64_t));
  int *todo = calloc((size_t)m->nchunks, sizeof(int));
  char **log = calloc((size_t)m->nchunks, sizeof(char *));
  bool *ok = calloc((size_t)m->nchunks, sizeof(bool));
  if (!src || !key || !todo || !log || !ok) abort();
  bool good = true;
  bool version_known = false;
  int ntodo = 0;
  for (int c = 0; c < m->nchunks; c++) {
    StrBuf sb;
    sb_init(&sb);
    cg_cuda_chunk_source(m, c, &sb);
    src[c] = strdup(sb_str(&sb));
    sb_free(&sb);
    if (!src[c]) abort();
  }
  if (o->cache_dir) {
    if (!cg_nvrtc_version_cached(o->cache_dir, ver, sizeof ver, err, errlen)) {
      good = false;
      goto done;
    }
    version_known = true;
  }
  for (int c = 0; c < m->nchunks; c++) {
    if (o->cache_dir) {
      char opt[64];
      snprintf(opt, sizeof opt, "--gpu-architecture=%s", m->arch);
      uint64_t h = hash_bytes(src[c], strlen(src[c]), HASH_SEED);
      h = hash_bytes(opt, strlen(opt), h);
      h = hash_bytes(ver, strlen(ver), h);
      h = hash_bytes(m->arch, strlen(m->arch), h);
      h = hash_bytes(CU_VERSION, strlen(CU_VERSION), h);
      key[c] = h;
      size_t len = 0;
      char *data = cache_get(o->cache_dir, "cuda-img", h, &len);
      if (data) {
        CuImage *img = &m->images[c];
        bool unpacked = image_unpack(data, len, img);
        free(data);
        if (unpacked) {
          img->from_cache = true;
          ok[c] = true;
          continue;
        }
        fprintf(stderr, "gradc: warning: ignoring malformed cache entry cuda-img-%016llx in %s\n",
                (unsigned long long)h, o->cache_dir);
      }
    }
    todo[ntodo++] = c;
  }
  if (ntodo > 0) {
    if (!cg_nvrtc_load(err, errlen)) {
      good = false;
      goto done;
    }
    if (!cg_nvrtc_supports(m->arch, have, sizeof have)) {
      if (!version_known) cg_nvrtc_version(ver, sizeof ver, NULL, 0);
      good = errf(err, errlen, "%s cannot compile for %s (it supports: %s)", ver, m->arch, have);
      goto done;
    }
    int threads = o->threads > 0 ? o->threads : pool_ncores();
    if (threads > ntodo) threads = ntodo;
    Pool *pool = threads > 1 ? pool_new(threads) : NULL;
    Job job = {m, m->arch, src, todo, log, ok};
    pool_run(pool, ntodo, 1, compile_chunks, &job);
    pool_free(pool);
    for (int t = 0; t < ntodo && good; t++) {
      int c = todo[t];
      if (ok[c]) continue;
      char what[256];
      name_failure(m, c, log[c] ? log[c] : "", what, sizeof what);
      good = errf(err, errlen, "NVRTC cannot compile %s for %s:\n%s", what, m->arch, log[c] ? log[c] : "");
    }
    m->compiled = ntodo;
    for (int t = 0; good && t < ntodo; t++) { /* warnings, kept for tests and --print-kernels */
      const char *l = log[todo[t]];
      if (!l || !*l) continue;
      StrBuf sb;
      sb_init(&sb);
      if (m->warnings) sb_puts(&sb, m->warnings);
      sb_printf(&sb, "gradc_chunk%d.cu:\n%s", todo[t], l);
      free(m->warnings);
      m->warnings = strdup(sb_str(&sb));
      sb_free(&sb);
    }
    for (int t = 0; good && o->cache_dir && t < ntodo; t++) {
      int c = todo[t];
      size_t len;
      char *b = image_pack(&m->images[c], &len);
      cache_put(o->cache_dir, "cuda-img", key[c], b, len);
      free(b);
    }
  }
done:
  for (int c = 0; c < m->nchunks; c++) {
    free(src[c]);
    free(log[c]);
  }
  free(src);
  free(key);
  free(todo);
  free(log);
  free(ok);
  return good;
}

bool cg_cuda_set_images(CuModule *m, const char *arch, const CuImage *img, int n, char *err, size_t errlen) {
  if (n != m->nchunks)
    return errf(err, errlen, "%d compiled programs for %d chunks of kernels", n, m->nchunks);
  snprintf(m->arch, sizeof m->arch, "%s", arch);
  m->images = calloc((size_t)(n ? n : 1), sizeof(CuImage));
  if (!m->images) abort();
  for (int i = 0; i < n; i++) {
    CuImage *d = &m->images[i];
    d->cubin = malloc(img[i].cubin_len ? img[i].cubin_len : 1);
    d->ptx = malloc(img[i].ptx_len + 1);
    if (!d->cubin || !d->ptx) abort();
    memcpy(d->cubin, img[i].cubin, img[i].cubin_len);
    memcpy(d->ptx, img[i].ptx, img[i].ptx_len);
    d->ptx[img[i].ptx_len] = 0;
    d->cubin_len = img[i].cubin_len;
    d->ptx_len = img[i].ptx_len;
  }
  /* The chunk sources record where each function starts (for errors). */
  for (int c = 0; c < m->nchunks; c++) {
    StrBuf sb;
    sb_init(&sb);
    cg_cuda_chunk_source(m, c, &sb);
    sb_free(&sb);
  }
  return true;
}
