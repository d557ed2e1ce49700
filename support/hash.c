/* hash.c - FNV-1a hashing and an open-addressing string map. */
#include <stdlib.h>
#include <string.h>

#include "support.h"

uint64_t hash_bytes(const void *p, size_t n, uint64_t h) {
  const unsigned char *b = p;
  for (size_t i = 0; i < n; i++) {
    h ^= b[i];
    h *= 0x100000001b3ull;
  }
  return h;
}

uint64_t hash_str(const char *s) { return hash_bytes(s, strlen(s), HASH_SEED); }

struct StrMapEntry {
  const char *key;
  void *val;
};

void strmap_init(StrMap *m) { memset(m, 0, sizeof *m); }

void strmap_free(StrMap *m) {
  free(m->slots);
  memset(m, 0, sizeof *m);
}

static struct StrMapEntry *find(const StrMap *m, const char *key) {
  size_t i = hash_str(key) & (m->cap - 1);
  for (;;) {
    struct StrMapEntry *e = &m->slots[i];
    if (!e->key || strcmp(e->key, key) == 0) return e;
    i = (i + 1) & (m->cap - 1);
  }
}

void *strmap_get(const StrMap *m, const char *key) {
  if (!m->cap) return NULL;
  struct StrMapEntry *e = find(m, key);
  return e->key ? e->val : NULL;
}

void strmap_put(StrMap *m, const char *key, void *val) {
  if ((m->count + 1) * 2 > m->cap) {
    StrMap old = *m;
    m->cap = old.cap ? old.cap * 2 : 16;
    m->count = 0;
    m->slots = mem_calloc(m->cap, sizeof *m->slots);
    for (size_t i = 0; i < old.cap; i++)
      if (old.slots[i].key) *find(m, old.slots[i].key) = old.slots[i], m->count++;
    free(old.slots);
  }
  struct StrMapEntry *e = find(m, key);
  if (!e->key) m->count++;
  e->key = key;
  e->val = val;
}
