/* arena.c - bump allocation in large blocks, freed all at once (QBE's pools). */
#include <stdlib.h>
#include <string.h>

#include "support.h"

struct ArenaBlock {
  ArenaBlock *next;
  size_t cap, used;
  _Alignas(16) unsigned char data[];
};

enum { ARENA_BLOCK = 64 * 1024 };

void gradc_assert_fail(const char *expr, const char *file, int line) {
  fprintf(stderr, "gradc: internal error: assertion '%s' failed at %s:%d\n", expr, file, line);
  abort();
}

void arena_init(Arena *a) { memset(a, 0, sizeof *a); }

void arena_free(Arena *a) {
  ArenaBlock *b = a->head;
  while (b) {
    ArenaBlock *next = b->next;
    free(b);
    b = next;
  }
  memset(a, 0, sizeof *a);
}

void *arena_alloc(Arena *a, size_t n) {
  n = (n + 15) & ~(size_t)15;
  if (n == 0) n = 16;
  ArenaBlock *b = a->head;
  if (!b || b->cap - b->used < n) {
    size_t cap = n > ARENA_BLOCK ? n : ARENA_BLOCK;
    b = malloc(sizeof(ArenaBlock) + cap);
    if (!b) {
      fprintf(stderr, "gradc: error: out of memory\n");
      abort();
    }
    b->cap = cap;
    b->used = 0;
    b->next = a->head;
    a->head = b;
  }
  void *p = b->data + b->used;
  b->used += n;
  a->used += n;
  memset(p, 0, n);
  return p;
}

char *arena_strndup(Arena *a, const char *s, size_t n) {
  char *p = arena_alloc(a, n + 1);
  memcpy(p, s, n);
  p[n] = 0;
  return p;
}

char *arena_strdup(Arena *a, const char *s) { return arena_strndup(a, s, strlen(s)); }

char *arena_printf(Arena *a, const char *fmt, ...) {
  va_list ap, ap2;
  va_start(ap, fmt);
  va_copy(ap2, ap);
  int n = vsnprintf(NULL, 0, fmt, ap);
  va_end(ap);
  char *p = arena_alloc(a, (size_t)n + 1);
  vsnprintf(p, (size_t)n + 1, fmt, ap2);
  va_end(ap2);
  return p;
}
