/* artifact.c - reading and writing the artifact container (artifact.h):
 * a magic, a format version, tagged length-prefixed sections and an
 * FNV-1a checksum of everything before it.  Reading checks the magic, the
 * version and the checksum before it trusts a single length; every length
 * is bounds-checked against the file.  Writing is atomic. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <unistd.h>

#include "codegen/codegen.h"
#include "artifact.h"

void art_init(ArtFile *a) {
  memset(a, 0, sizeof *a);
  a->format = ART_FORMAT_VERSION;
}

void art_free(ArtFile *a) {
  for (int i = 0; i < a->n; i++) {
    free(a->s[i].name);
    free(a->s[i].data);
  }
  free(a->s);
  art_init(a);
}

ArtSection *art_add(ArtFile *a, const char *tag, const char *name, const void *data, size_t len) {
  GRADC_ASSERT(strlen(tag) >= 1 && strlen(tag) <= 4);
  if (a->n == a->cap) {
    a->cap = a->cap ? 2 * a->cap : 8;
    a->s = mem_realloc(a->s, sizeof(ArtSection) * (size_t)a->cap);
  }
  ArtSection *s = &a->s[a->n++];
  memset(s, 0, sizeof *s);
  memcpy(s->tag, tag, strlen(tag));
  if (!name) name = "";
  s->name = mem_alloc(strlen(name) + 1);
  memcpy(s->name, name, strlen(name) + 1);
  s->data = mem_alloc(len + 1);
  if (len) memcpy(s->data, data, len);
  s->data[len] = 0;
  s->len = len;
  return s;
}

const ArtSection *art_find(const ArtFile *a, const char *tag, const char *name) {
  for (int i = 0; i < a->n; i++)
    if (strcmp(a->s[i].tag, tag) == 0 && (!name || strcmp(a->s[i].name, name) == 0)) return &a->s[i];
  return NULL;
}

/* ------------------------------------------------------------------ */
/* Bytes                                                               */
/* ------------------------------------------------------------------ */

static void put_le(StrBuf *b, uint64_t v, int n) {
  for (int i = 0; i < n; i++) sb_putc(b, (char)(unsigned char)(v >> (8 * i)));
}

static uint64_t get_le(const unsigned char *p, int n) {
  uint64_t v = 0;
  for (int i = n - 1; i >= 0; i--) v = (v << 8) | p[i];
  return v;
}


/* ------------------------------------------------------------------ */
/* The container                                                       */
/* ------------------------------------------------------------------ */

bool art_write(const char *path, const ArtFile *a, char *err, size_t errlen) {
  StrBuf b;
  sb_init(&b);
  sb_putn(&b, ART_MAGIC, 8);
  put_le(&b, a->format, 4);
  put_le(&b, (uint64_t)a->n, 4);
  for (int i = 0; i < a->n; i++) {
    const ArtSection *s = &a->s[i];
    char tag[4] = {' ', ' ', ' ', ' '};
    memcpy(tag, s->tag, strlen(s->tag));
    sb_putn(&b, tag, 4);
    put_le(&b, strlen(s->name), 4);
    put_le(&b, s->len, 8);
    sb_putn(&b, s->name, strlen(s->name));
    if (s->len) sb_putn(&b, (const char *)s->data, s->len);
  }
  put_le(&b, hash_bytes(b.data, b.len, HASH_SEED), 8);
  bool ok = write_file_atomic(path, &(FilePart){b.data, b.len}, 1, err, errlen);
  sb_free(&b);
  return ok;
}

bool art_read(const char *path, ArtFile *out, char *err, size_t errlen) {
  art_init(out);
  const char *why;
  size_t len;
  unsigned char *p = (unsigned char *)read_file(path, &len, &why);
  if (!p) return errf(err, errlen, "%s: %s", path, why);
  bool ok = false;
  if (len < 8 || memcmp(p, ART_MAGIC, 8) != 0) {
    errf(err, errlen, "%s: not a gradc artifact (bad magic)", path);
    goto done;
  }
  if (len < 8 + 4 + 4 + 8) {
    errf(err, errlen, "%s: artifact is corrupt (truncated)", path);
    goto done;
  }
  uint32_t format = (uint32_t)get_le(p + 8, 4);
  if (format != ART_FORMAT_VERSION) {
    errf(err, errlen, "%s: artifact format version %u is not supported (this gradc reads version %u)", path, format,
         ART_FORMAT_VERSION);
    goto done;
  }
  size_t body = len - 8;
  if (get_le(p + body, 8) != hash_bytes(p, body, HASH_SEED)) {
    errf(err, errlen, "%s: artifact is corrupt (checksum mismatch)", path);
    goto done;
  }
  out->format = format;
  uint64_t nsec = get_le(p + 12, 4);
  size_t at = 16;
  for (uint64_t i = 0; i < nsec; i++) {
    if (body - at < 16) goto corrupt;
    char tag[5] = {0};
    memcpy(tag, p + at, 4);
    for (int k = 3; k >= 0 && tag[k] == ' '; k--) tag[k] = 0;
    uint64_t nlen = get_le(p + at + 4, 4), dlen = get_le(p + at + 8, 8);
    at += 16;
    if (!tag[0] || nlen > body - at || dlen > body - at - nlen) goto corrupt;
    char *name = mem_alloc(nlen + 1);
    memcpy(name, p + at, nlen);
    name[nlen] = 0;
    if (strlen(name) != nlen) {
      free(name);
      goto corrupt;
    }
    art_add(out, tag, name, p + at + nlen, dlen);
    free(name);
    at += nlen + dlen;
  }
  if (at != body) goto corrupt;
  ok = true;
  goto done;
corrupt:
  /* The checksum matched, so the writer itself was wrong. */
  errf(err, errlen, "%s: artifact is corrupt (bad section table)", path);
  art_free(out);
done:
  free(p);
  return ok;
}

/* ------------------------------------------------------------------ */
/* The host                                                            */
/* ------------------------------------------------------------------ */

void art_host_id(char *buf, size_t n) {
#ifdef GRADC_HAVE_LLVM
  /* What the kernels' object code depends on: the host and the generator
   * that wrote it (a newer gradc may generate different kernels for the
   * same IR, so its objects are not interchangeable). */
  char host[1024];
  cg_llvm_host_id(host, sizeof host);
  snprintf(buf, n, "%s;%s", cg_generator_id(), host);
#else
  struct utsname u;
  if (uname(&u) != 0) snprintf(u.machine, sizeof u.machine, "unknown");
  snprintf(buf, n, "%s;generic", u.machine);
#endif
}
