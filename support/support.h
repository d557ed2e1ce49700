/* support.h - small utilities shared by every module: arenas, growable
 * strings, diagnostics, hashing, assertions.  Written once, used everywhere. */
#ifndef GRADC_SUPPORT_H
#define GRADC_SUPPORT_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#if defined(__GNUC__)
#define GRADC_PRINTF(f, a) __attribute__((format(printf, f, a)))
#define GRADC_NORETURN __attribute__((noreturn))
#else
#define GRADC_PRINTF(f, a)
#define GRADC_NORETURN
#endif

/* Internal bugs: abort with file and line (DESIGN.md §5: assertion failures abort). */
GRADC_NORETURN void gradc_assert_fail(const char *expr, const char *file, int line);
#define GRADC_ASSERT(e) ((e) ? (void)0 : gradc_assert_fail(#e, __FILE__, __LINE__))

/* ------------------------------------------------------------------ */
/* arena.c: bump allocator; everything is freed at once.               */
/* ------------------------------------------------------------------ */
typedef struct ArenaBlock ArenaBlock;
typedef struct Arena {
  ArenaBlock *head;
  size_t used; /* bytes handed out, for statistics */
} Arena;

void arena_init(Arena *a);
void arena_free(Arena *a);
/* Zeroed, 16-byte aligned memory that lives until arena_free. */
void *arena_alloc(Arena *a, size_t n);
char *arena_strdup(Arena *a, const char *s);
char *arena_strndup(Arena *a, const char *s, size_t n);
char *arena_printf(Arena *a, const char *fmt, ...) GRADC_PRINTF(2, 3);
#define ARENA_NEW(a, T) ((T *)arena_alloc((a), sizeof(T)))
#define ARENA_ARRAY(a, T, n) ((T *)arena_alloc((a), sizeof(T) * (size_t)(n)))

/* ------------------------------------------------------------------ */
/* strbuf.c: growable heap string (malloc'd; sb_free releases it).     */
/* ------------------------------------------------------------------ */
typedef struct StrBuf {
  char *data; /* always NUL-terminated once anything was appended */
  size_t len, cap;
} StrBuf;

void sb_init(StrBuf *sb);
void sb_free(StrBuf *sb);
void sb_putc(StrBuf *sb, char c);
void sb_puts(StrBuf *sb, const char *s);
void sb_putn(StrBuf *sb, const char *s, size_t n);
void sb_printf(StrBuf *sb, const char *fmt, ...) GRADC_PRINTF(2, 3);
void sb_vprintf(StrBuf *sb, const char *fmt, va_list ap);
const char *sb_str(StrBuf *sb); /* "" when empty; never NULL */

/* Shortest decimal form of d that parses back to exactly d ("0.5", "1e-05", "inf"). */
void fmt_double(char *buf, size_t n, double d);


/* ------------------------------------------------------------------ */
/* mem.c: malloc and friends that abort when memory runs out (and      */
/* never return NULL, even for 0 bytes); release with free().          */
/* ------------------------------------------------------------------ */
void *mem_alloc(size_t n);
void *mem_calloc(size_t n, size_t size);
void *mem_realloc(void *p, size_t n);
/* n bytes (zeroed when zero) for a large working set, NULL when memory
 * runs out: from 2 MiB on, 2 MiB-aligned and advised as transparent huge
 * pages (madvise MADV_HUGEPAGE, which the kernel's default `madvise`
 * mode waits for), else 64-byte aligned.  Release with free(). */
void *mem_alloc_huge(size_t n, bool zero);
char *mem_strdup(const char *s);
char *mem_strndup(const char *s, size_t n);
/* a * b and a + b into *out; false when the result does not fit in 64 bits. */
bool mem_mul(uint64_t a, uint64_t b, uint64_t *out);
bool mem_add(uint64_t a, uint64_t b, uint64_t *out);
/* The most memory this process can hope for: the machine's physical
 * memory, or its cgroups' limit when that is lower (cgroup_least_limit:
 * v2's memory.max, v1's memory.limit_in_bytes; UINT64_MAX if unknown). */
uint64_t mem_limit(void);
/* A cgroup memory limit's text as bytes: "max" (v2, none) and text that
 * is not a number give 0. */
uint64_t mem_limit_of(const char *text);
/* The cgroups' memory limit alone, read now (mem_limit reads it once); 0 when none. */
uint64_t mem_cgroup_limit(void);
/* Whether bytes can fit in memory: else false, with "WHAT needs N bytes,
 * more than the M bytes of memory this machine has" in err. */
bool mem_fits(const char *what, uint64_t bytes, char *err, size_t errlen);

/* ------------------------------------------------------------------ */
/* cgroup.c: a container's limits                                      */
/* ------------------------------------------------------------------ */
/* One controller's limit on the cgroup directory dir (v2: of the unified
 * hierarchy), 0 when it sets none. */
typedef uint64_t (*CgroupLimitFn)(const char *dir, bool v2);
/* The least non-zero limit(dir) over this process's cgroup of controller
 * ("cpu", "memory") and its parents, in v2 and in v1; 0 when none. */
uint64_t cgroup_least_limit(const char *controller, CgroupLimitFn limit);
/* The first line of dir/name, without its newline, into buf. */
bool cgroup_read(const char *dir, const char *name, char *buf, size_t n);

/* ------------------------------------------------------------------ */
/* file.c: whole files                                                 */
/* ------------------------------------------------------------------ */
/* Read a whole file into malloc'd memory (NUL-terminated).  Returns NULL
 * and sets *err (a static string) on failure; a path that is not a regular
 * file (a device, fifo, directory) or one larger than mem_limit() fails. */
char *read_file(const char *path, size_t *len, const char **err);
/* Write the parts, in order, to path atomically: PATH.tmp.PID.XXXXXX next
 * to it (PID the writer's process id), fsync, rename, fsync the directory;
 * the file gets mode 0644.  A symlink is written through: its target (at
 * the end of the chain) gets the new contents, the link stays.  A path
 * that exists and is not a regular file (a directory, device, fifo) is
 * refused.  On failure "PATH: reason" goes to err and path is untouched.
 * A writer killed mid-way leaves at most its temporary. */
typedef struct FilePart {
  const void *data;
  size_t len;
} FilePart;
bool write_file_atomic(const char *path, const FilePart *parts, int nparts, char *err, size_t errlen);
/* Whether write_file_atomic could write path now (before a command does
 * its work, so that an unwritable output fails at once and not after
 * hours of training): path is, or links to, a regular file or nothing, and
 * a temporary can be created beside it (created and removed: this answers
 * for root, read-only mounts and missing directories alike).  Else false
 * with "PATH: reason" in err. */
bool file_check_output(const char *path, char *err, size_t errlen);
/* Whether a and b name one existing file (device and inode, through
 * symlinks and hard links). */
bool file_same(const char *a, const char *b);
/* Remove the temporaries PATH.tmp.PID.XXXXXX that write_file_atomic left
 * behind when its process died (PID no longer exists; a live writer's are
 * kept).  Calls removed(file, pid, ctx) for each (may be NULL); returns
 * how many were removed. */
int remove_stale_temps(const char *path, void (*removed)(const char *file, long pid, void *ctx), void *ctx);
/* mkdir -p: path and its missing parents (0755); false with errno set. */
bool mkdir_p(const char *path);

/* ------------------------------------------------------------------ */
/* slice.c                                                             */
/* ------------------------------------------------------------------ */
/* Python's slice.indices for one axis of size dim (step != 0): clamps
 * *start and stop, stores the normalised start in *start and returns
 * the number of elements. */
int64_t slice_indices(int64_t dim, int64_t *start, int64_t stop, int64_t step);

/* ------------------------------------------------------------------ */
/* diag.c: user-facing diagnostics, clang style.                        */
/*   file:line:col: error: message                                     */
/*     source line                                                     */
/*         ^                                                            */
/* ------------------------------------------------------------------ */
typedef struct SrcFile {
  const char *name; /* as given on the command line */
  const char *text; /* whole contents, NUL-terminated */
  size_t len;
} SrcFile;

typedef enum { DIAG_ERROR, DIAG_WARNING, DIAG_NOTE } DiagLevel;

typedef struct Diag {
  FILE *out;      /* where diagnostics go (stderr by default) */
  int nerrors;    /* errors reported so far */
  int max_errors; /* stop reporting after this many (DESIGN.md: 20) */
  bool quiet;     /* count but print nothing (used by tests / fuzzers) */
  StrBuf log;     /* everything printed, kept for tests and the C API */
} Diag;

void diag_init(Diag *d, FILE *out);
void diag_free(Diag *d);
/* A located diagnostic with the source line and a caret under col (1-based,
 * bytes).  src may be NULL (then no source line is printed). */
void diag_at(Diag *d, DiagLevel lvl, const SrcFile *src, int line, int col, const char *fmt, ...)
    GRADC_PRINTF(6, 7);
void diag_vat(Diag *d, DiagLevel lvl, const SrcFile *src, int line, int col, const char *fmt, va_list ap);
/* An error outside a model file: "gradc: error: message". */
void diag_plain(Diag *d, DiagLevel lvl, const char *fmt, ...) GRADC_PRINTF(3, 4);
bool diag_too_many(const Diag *d);
/* How library functions report an error through (char *err, size_t n):
 * the message into err (when err and n), and false to return. */
bool errf(char *err, size_t n, const char *fmt, ...) GRADC_PRINTF(3, 4);

/* ------------------------------------------------------------------ */
/* hash.c: FNV-1a 64 and a string -> pointer hash map.                 */
/* ------------------------------------------------------------------ */
uint64_t hash_bytes(const void *p, size_t n, uint64_t h);
#define HASH_SEED 0xcbf29ce484222325ull
uint64_t hash_str(const char *s);

typedef struct StrMap {
  struct StrMapEntry *slots;
  size_t cap, count;
} StrMap;

void strmap_init(StrMap *m);
void strmap_free(StrMap *m);
void *strmap_get(const StrMap *m, const char *key);
/* Insert or replace; the key is not copied (keep it alive, e.g. in an arena). */
void strmap_put(StrMap *m, const char *key, void *val);

/* ------------------------------------------------------------------ */
/* rng.c: deterministic random numbers (init, bench inputs, tests).    */
/* ------------------------------------------------------------------ */
typedef struct Rng {
  uint64_t s[4];
} Rng;
void rng_seed(Rng *r, uint64_t seed);
uint64_t rng_next(Rng *r);
double rng_uniform(Rng *r); /* [0, 1) */
double rng_normal(Rng *r);  /* standard normal (Box-Muller) */

/* ------------------------------------------------------------------ */
/* pool.c: worker threads that split a loop with the caller.           */
/* ------------------------------------------------------------------ */
typedef struct Pool Pool;
/* Process iterations [begin, end) of a loop; ctx is pool_run's. */
typedef void (*PoolFn)(void *ctx, int64_t begin, int64_t end);
int pool_ncores(void);           /* CPUs in the process's affinity mask, at most its CPU quota (>= 1) */
/* A CFS quota as CPUs, ceil(quota / period): cgroup v2's cpu.max line
 * ("150000 100000", "max 100000"; period NULL) or v1's cpu.cfs_quota_us
 * and cpu.cfs_period_us; 0 for no limit or text that is not one. */
int pool_quota_cpus_of(const char *quota, const char *period);
/* A pool of nthreads threads in all, the caller of pool_run included
 * (nthreads <= 0: pool_ncores()).  Free with pool_free. */
Pool *pool_new(int nthreads);
int pool_size(const Pool *p);    /* 1 for a NULL pool */
/* Run fn over [0, n) in chunks of at least `grain` iterations, split
 * across the pool's threads and the caller; returns when all are done.
 * One pool_run at a time per pool (p may be NULL: run inline). */
void pool_run(Pool *p, int64_t n, int64_t grain, PoolFn fn, void *ctx);
/* Wake the workers that sleep, to spin for a job about to come (the start
 * of a step, whose host work then hides their wake-up).  p may be NULL. */
void pool_wake(Pool *p);
void pool_free(Pool *p);

/* ------------------------------------------------------------------ */
/* cache.c: the on-disk cache (DESIGN.md §5 "Caches")                  */
/* ------------------------------------------------------------------ */
/* The cache directory ($GRADC_CACHE_DIR, $XDG_CACHE_HOME/gradc,
 * ~/.cache/gradc) into buf; false if none can be named. */
bool cache_dir(char *buf, size_t n);
/* The entry of `kind` (e.g. "obj") under key, malloc'd with a NUL after
 * its *len bytes (a text entry reads as a string), or NULL on a miss; a
 * corrupted entry is a warning and a miss. */
void *cache_get(const char *dir, const char *kind, uint64_t key, size_t *len);
/* Store an entry atomically; failures are warnings. */
void cache_put(const char *dir, const char *kind, uint64_t key, const void *data, size_t len);

#endif
