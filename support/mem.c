/* mem.c - heap allocation that cannot fail: running out of memory aborts
 * (DESIGN.md §5: the program detects no recovery from it), and a request
 * for zero bytes still returns a unique pointer. */
#include <stdlib.h>
#include <string.h>

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
