/* mem.c - heap allocation that cannot fail: running out of memory aborts
 * (DESIGN.md §5: the program detects no recovery from it), and a request
 * for zero bytes still returns a unique pointer.  Sizes a user controls
 * (dims, file headers) are checked against mem_limit before they get
 * here, so that what cannot fit is an error naming it, not an abort. */
#include <ctype.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "support.h"

void *mem_alloc(size_t n) {
  void *p = malloc(n ? n : 1);
  if (!p) abort();
  return p;
}

void *mem_calloc(size_t n, size_t size) {
  void *p = calloc(n ? n : 1, size ? size : 1);
  if (!p) abort();
  return p;
}

void *mem_realloc(void *p, size_t n) {
  void *q = realloc(p, n ? n : 1);
  if (!q) abort();
  return q;
}

/* A GEMM's operands walked down their columns touch a page a row, and
 * with 4 KiB pages a 1024 x 1024 f32 matrix is 1024 of them: mlp2's
 * one-thread step took 1.7% less with its arena on huge pages
 * (docs/DECISIONS.md "Huge pages for the arena"). */
#define HUGE_PAGE ((size_t)2 << 20)
void *mem_alloc_huge(size_t n, bool zero) {
  size_t align = n >= HUGE_PAGE ? HUGE_PAGE : 64;
  if (n > SIZE_MAX - align) return NULL;
  size_t size = n ? (n + align - 1) / align * align : align;
  void *p = aligned_alloc(align, size);
  if (!p) return NULL;
  if (align == HUGE_PAGE) madvise(p, size, MADV_HUGEPAGE); /* advice: where the kernel has none, 4 KiB pages */
  if (zero) memset(p, 0, size);
  return p;
}

char *mem_strdup(const char *s) {
  size_t n = strlen(s) + 1;
  return memcpy(mem_alloc(n), s, n);
}

char *mem_strndup(const char *s, size_t n) {
  size_t k = strnlen(s, n);
  char *p = mem_alloc(k + 1);
  memcpy(p, s, k);
  p[k] = 0;
  return p;
}

bool mem_mul(uint64_t a, uint64_t b, uint64_t *out) { return !__builtin_mul_overflow(a, b, out); }

bool mem_add(uint64_t a, uint64_t b, uint64_t *out) { return !__builtin_add_overflow(a, b, out); }

uint64_t mem_limit_of(const char *text) {
  /* Digits first: strtoull would skip blanks and negate a '-' after them. */
  if (!isdigit((unsigned char)text[0])) return 0;
  char *end;
  errno = 0;
  unsigned long long c = strtoull(text, &end, 10);
  if (errno || (*end && *end != '\n' && *end != ' ')) return 0;
  return c;
}

static uint64_t cgroup_memory(const char *dir, bool v2) {
  char buf[64];
  return cgroup_read(dir, v2 ? "memory.max" : "memory.limit_in_bytes", buf, sizeof buf) ? mem_limit_of(buf) : 0;
}

uint64_t mem_cgroup_limit(void) { return cgroup_least_limit("memory", cgroup_memory); }

uint64_t mem_limit(void) {
  static uint64_t limit;
  if (limit) return limit;
  uint64_t m = UINT64_MAX;
  long pages = sysconf(_SC_PHYS_PAGES), size = sysconf(_SC_PAGESIZE);
  if (pages > 0 && size > 0) m = (uint64_t)pages * (uint64_t)size;
  /* A container's limit, when it is lower (v1 writes "no limit" as a
   * number near 2^63). */
  uint64_t c = mem_cgroup_limit();
  if (c > 0 && c < m) m = c;
  limit = m;
  return m;
}

bool mem_fits(const char *what, uint64_t bytes, char *err, size_t errlen) {
  uint64_t m = mem_limit();
  if (bytes <= m) return true;
  return errf(err, errlen, "%s needs %llu bytes, more than the %llu bytes of memory this machine has", what,
              (unsigned long long)bytes, (unsigned long long)m);
}
