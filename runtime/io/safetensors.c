/* safetensors.c - reading and writing tensors in the Hugging Face
 * safetensors format:
 *
 *   [8 bytes: N, little-endian u64] [N bytes: JSON header] [data blob]
 *
 * The header maps each tensor name to {"dtype", "shape", "data_offsets"}
 * (offsets relative to the blob) plus an optional "__metadata__" object of
 * string -> string.  Reading validates everything a malformed or hostile
 * file could get wrong (the reader is a fuzz target): sizes, JSON, dtypes,
 * shapes, offsets in bounds, sizes matching shapes, tensors non-overlapping
 * and contiguous (as the reference implementation requires), no duplicate
 * names.  Writing is atomic: a temporary file next to the target, fsync,
 * rename. */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "runtime/runtime.h"

/* Largest header accepted (the reference implementation uses 100 MB). */
#define MAX_HEADER ((uint64_t)100 * 1000 * 1000)
/* Offsets and dims must be exact in a double (cJSON parses numbers as double). */
#define MAX_JSON_INT ((double)((int64_t)1 << 53))

/* The dtype table, one row per StDType: the file's name, the IR's spelling
 * (and include/gradc.h's, whose gradc_dtype has the same order), and the
 * bytes per element.  Every other list of these names should read this. */
static const struct {
  const char *name, *lower;
  size_t size;
} dtypes[] = {
    [ST_F32] = {"F32", "f32", 4}, [ST_F64] = {"F64", "f64", 8}, [ST_BF16] = {"BF16", "bf16", 2},
    [ST_F16] = {"F16", "f16", 2}, [ST_I32] = {"I32", "i32", 4}, [ST_I64] = {"I64", "i64", 8},
};
#define NDTYPES ((int)(sizeof dtypes / sizeof dtypes[0]))
_Static_assert(NDTYPES == ST_I64 + 1, "one row per StDType");

const char *st_dtype_name(StDType dt) { return (unsigned)dt < NDTYPES ? dtypes[dt].name : "?"; }
const char *st_dtype_lower(StDType dt) { return (unsigned)dt < NDTYPES ? dtypes[dt].lower : "?"; }
size_t st_dtype_size(StDType dt) { return (unsigned)dt < NDTYPES ? dtypes[dt].size : 0; }

static bool dtype_parse(const char *s, StDType *out) {
  for (int i = 0; i < NDTYPES; i++)
    if (strcmp(s, dtypes[i].name) == 0) {
      *out = (StDType)i;
      return true;
    }
  return false;
}

/* ------------------------------------------------------------------ */
/* In-memory files                                                     */
/* ------------------------------------------------------------------ */

void st_init(StFile *f) { memset(f, 0, sizeof *f); }

void st_free(StFile *f) {
  for (int i = 0; i < f->n; i++) {
    free(f->t[i].name);
    free(f->t[i].data);
  }
  free(f->t);
  for (int i = 0; i < f->nmeta; i++) {
    free(f->meta_key[i]);
    free(f->meta_val[i]);
  }
  free(f->meta_key);
  free(f->meta_val);
  free(f->path);
  st_init(f);
}

int64_t st_numel(const StTensor *t) {
  int64_t n = 1;
  for (int i = 0; i < t->rank; i++) n *= t->shape[i];
  return n;
}

StTensor *st_add(StFile *f, const char *name, StDType dt, int rank, const int64_t *shape, const void *data) {
  GRADC_ASSERT(rank >= 0 && rank <= IR_MAX_RANK);
  if (f->n == f->cap) {
    f->cap = f->cap ? f->cap * 2 : 8;
    StTensor *t = mem_realloc(f->t, sizeof(StTensor) * (size_t)f->cap);
    f->t = t;
  }
  StTensor *t = &f->t[f->n++];
  memset(t, 0, sizeof *t);
  t->name = mem_strdup(name);
  t->dtype = dt;
  t->rank = rank;
  for (int i = 0; i < rank; i++) {
    GRADC_ASSERT(shape[i] >= 0);
    t->shape[i] = shape[i];
  }
  t->nbytes = (size_t)st_numel(t) * st_dtype_size(dt);
  t->data = mem_alloc(t->nbytes);
  if (data)
    memcpy(t->data, data, t->nbytes);
  else
    memset(t->data, 0, t->nbytes);
  return t;
}

void st_set_meta(StFile *f, const char *key, const char *val) {
  for (int i = 0; i < f->nmeta; i++)
    if (strcmp(f->meta_key[i], key) == 0) {
      free(f->meta_val[i]);
      f->meta_val[i] = mem_strdup(val);
      return;
    }
  char **k = mem_realloc(f->meta_key, sizeof(char *) * (size_t)(f->nmeta + 1));
  f->meta_key = k;
  char **v = mem_realloc(f->meta_val, sizeof(char *) * (size_t)(f->nmeta + 1));
  f->meta_val = v;
  f->meta_key[f->nmeta] = mem_strdup(key);
  f->meta_val[f->nmeta] = mem_strdup(val);
  f->nmeta++;
}

const char *st_get_meta(const StFile *f, const char *key) {
  for (int i = 0; i < f->nmeta; i++)
    if (strcmp(f->meta_key[i], key) == 0) return f->meta_val[i];
  return NULL;
}

const StTensor *st_find(const StFile *f, const char *name) {
  for (int i = 0; i < f->n; i++)
    if (strcmp(f->t[i].name, name) == 0) return &f->t[i];
  return NULL;
}

/* ------------------------------------------------------------------ */
/* Reading                                                             */
/* ------------------------------------------------------------------ */

/* A JSON number that is a non-negative integer exactly representable. */
static bool json_uint(const cJSON *j, int64_t *out) {
  if (!cJSON_IsNumber(j)) return false;
  double d = j->valuedouble;
  if (!(d >= 0) || d >= MAX_JSON_INT || d != floor(d)) return false;
  *out = (int64_t)d;
  return true;
}

/* One tensor's header entry, before the data is copied. */
typedef struct Entry {
  const char *name;
  StDType dtype;
  int rank;
  int64_t shape[IR_MAX_RANK];
  uint64_t begin, end;
} Entry;

static bool parse_entry(const cJSON *j, Entry *e, const char *path, char *err, size_t errlen) {
  const char *name = e->name;
  if (!cJSON_IsObject(j)) return errf(err, errlen, "%s: tensor '%s': entry is not a JSON object", path, name);
  const cJSON *dt = cJSON_GetObjectItemCaseSensitive(j, "dtype");
  const cJSON *shape = cJSON_GetObjectItemCaseSensitive(j, "shape");
  const cJSON *offs = cJSON_GetObjectItemCaseSensitive(j, "data_offsets");
  if (!cJSON_IsString(dt) || !dt->valuestring)
    return errf(err, errlen, "%s: tensor '%s': missing or non-string \"dtype\"", path, name);
  if (!dtype_parse(dt->valuestring, &e->dtype))
    return errf(err, errlen, "%s: tensor '%s': unsupported dtype '%.40s' (expected F32, F64, BF16, F16, I32 or I64)",
                path, name, dt->valuestring);
  if (!cJSON_IsArray(shape)) return errf(err, errlen, "%s: tensor '%s': missing or non-array \"shape\"", path, name);
  int rank = cJSON_GetArraySize(shape);
  if (rank > IR_MAX_RANK)
    return errf(err, errlen, "%s: tensor '%s': rank %d exceeds the maximum of %d", path, name, rank, IR_MAX_RANK);
  e->rank = rank;
  int k = 0;
  const cJSON *d;
  cJSON_ArrayForEach(d, shape) {
    if (!json_uint(d, &e->shape[k]))
      return errf(err, errlen, "%s: tensor '%s': shape entries must be non-negative integers", path, name);
    k++;
  }
  if (!cJSON_IsArray(offs) || cJSON_GetArraySize(offs) != 2)
    return errf(err, errlen, "%s: tensor '%s': \"data_offsets\" must be an array [begin, end]", path, name);
  int64_t b, en;
  if (!json_uint(cJSON_GetArrayItem(offs, 0), &b) || !json_uint(cJSON_GetArrayItem(offs, 1), &en))
    return errf(err, errlen, "%s: tensor '%s': \"data_offsets\" must be non-negative integers", path, name);
  if (b > en) return errf(err, errlen, "%s: tensor '%s': data_offsets begin %lld > end %lld", path, name,
                          (long long)b, (long long)en);
  e->begin = (uint64_t)b;
  e->end = (uint64_t)en;
  /* numel * size without overflow: any product beyond 2^53 cannot match
   * offsets that are themselves below 2^53. */
  uint64_t bytes = st_dtype_size(e->dtype);
  bool zero = false, big = false;
  for (int i = 0; i < rank; i++) {
    uint64_t s = (uint64_t)e->shape[i];
    if (s == 0) zero = true;
    else if (bytes > ((uint64_t)1 << 53) / s) big = true;
    else bytes *= s;
  }
  if (zero) bytes = 0;
  if (big && !zero)
    return errf(err, errlen, "%s: tensor '%s': shape is too large for its data_offsets", path, name);
  if (en - b != (int64_t)bytes)
    return errf(err, errlen, "%s: tensor '%s': data_offsets cover %lld bytes, but %s%s needs %llu", path, name,
                (long long)(en - b), dt->valuestring, rank ? " of that shape" : " scalar", (unsigned long long)bytes);
  return true;
}

static int cmp_entry(const void *a, const void *b) {
  const Entry *x = *(const Entry *const *)a, *y = *(const Entry *const *)b;
  if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
  if (x->end != y->end) return x->end < y->end ? -1 : 1;
  return 0;
}

static uint64_t get_le64(const unsigned char *p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
  return v;
}

/* The header and the tensors, given the whole file in memory. */
/* Names (tensors', metadata keys') are printed in messages and matched
 * against the model's: a control character in one could forge a line of
 * output or hide a difference.  The first such byte's index, or -1. */
static int control_char(const char *name) {
  for (const unsigned char *p = (const unsigned char *)name; *p; p++)
    if (*p < 0x20 || *p == 0x7f) return (int)(p - (const unsigned char *)name);
  return -1;
}

/* name with its control bytes as \xNN, for a message. */
static const char *printable(const char *name, char *buf, size_t n) {
  size_t k = 0;
  for (const unsigned char *p = (const unsigned char *)name; *p && k + 5 < n; p++) {
    if (*p < 0x20 || *p == 0x7f) k += (size_t)snprintf(buf + k, n - k, "\\x%02x", *p);
    else buf[k++] = (char)*p;
  }
  buf[k] = 0;
  return buf;
}

static bool name_error(const char *path, const char *kind, const char *name, char *err, size_t errlen) {
  char shown[256];
  int at = control_char(name);
  return errf(err, errlen, "%s: %s '%s': the name holds a control character (byte 0x%02x)", path, kind,
              printable(name, shown, sizeof shown), (unsigned char)name[at]);
}

/* Whether the JSON text holds the escape \u0000 (in a string: a backslash
 * escapes the character after it).  cJSON would end the C string there,
 * so "W1\u0000hidden" would read as W1. */
static bool escaped_nul(const char *s, size_t n) {
  for (size_t i = 0; i + 1 < n; i++)
    if (s[i] == '\\') {
      if (s[i + 1] == 'u' && i + 5 < n && memcmp(s + i + 2, "0000", 4) == 0) return true;
      i++;
    }
  return false;
}

static bool parse_file(const char *path, const unsigned char *buf, size_t size, StFile *out, char *err,
                       size_t errlen) {
  if (size < 8) return errf(err, errlen, "%s: file too short for a safetensors header (%zu bytes)", path, size);
  uint64_t n = get_le64(buf);
  if (n > MAX_HEADER) return errf(err, errlen, "%s: header length %llu is too large", path, (unsigned long long)n);
  if (n > size - 8)
    return errf(err, errlen, "%s: header length %llu goes beyond the end of the file (%zu bytes)", path,
                (unsigned long long)n, size);
  if (n < 2) return errf(err, errlen, "%s: header is not a JSON object", path);
  const char *hdr = (const char *)buf + 8;
  if (memchr(hdr, 0, n)) return errf(err, errlen, "%s: header contains a NUL byte", path);
  if (escaped_nul(hdr, (size_t)n))
    return errf(err, errlen, "%s: the header holds an escaped NUL (\\u0000), which no name or value may hold", path);
  const char *end = NULL;
  cJSON *root = cJSON_ParseWithLengthOpts(hdr, (size_t)n, &end, 0);
  if (!root) {
    size_t at = end && end >= hdr ? (size_t)(end - hdr) : 0;
    return errf(err, errlen, "%s: header is not valid JSON (near byte %zu of the header)", path, at);
  }
  for (const char *p = end; p && p < hdr + n; p++)
    if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r') {
      cJSON_Delete(root);
      return errf(err, errlen, "%s: trailing characters after the JSON header", path);
    }
  if (!cJSON_IsObject(root)) {
    cJSON_Delete(root);
    return errf(err, errlen, "%s: header is not a JSON object", path);
  }
  const unsigned char *blob = buf + 8 + n;
  uint64_t blobsize = size - 8 - n;

  int count = cJSON_GetArraySize(root);
  Entry *ents = mem_alloc(sizeof(Entry) * (size_t)(count > 0 ? count : 1));
  Entry **sorted = mem_alloc(sizeof(Entry *) * (size_t)(count > 0 ? count : 1));
  int ne = 0;
  bool ok = true, seen_meta = false;
  StrMap names;
  strmap_init(&names);
  StFile f;
  st_init(&f);
  const cJSON *j;
  cJSON_ArrayForEach(j, root) {
    const char *name = j->string ? j->string : "";
    if (control_char(name) >= 0) {
      ok = name_error(path, "tensor", name, err, errlen);
      break;
    }
    if (strmap_get(&names, name) || (strcmp(name, "__metadata__") == 0 && seen_meta)) {
      ok = errf(err, errlen, "%s: tensor '%s': duplicate name in the header", path, name);
      break;
    }
    if (strcmp(name, "__metadata__") == 0) {
      seen_meta = true;
      if (!cJSON_IsObject(j)) {
        ok = errf(err, errlen, "%s: \"__metadata__\" is not a JSON object", path);
        break;
      }
      const cJSON *m;
      cJSON_ArrayForEach(m, j) {
        if (m->string && control_char(m->string) >= 0) {
          ok = name_error(path, "\"__metadata__\" key", m->string, err, errlen);
          break;
        }
        if (!cJSON_IsString(m) || !m->valuestring) {
          ok = errf(err, errlen, "%s: \"__metadata__\" value for '%s' is not a string", path,
                    m->string ? m->string : "");
          break;
        }
        if (st_get_meta(&f, m->string ? m->string : "")) {
          ok = errf(err, errlen, "%s: \"__metadata__\" has a duplicate key '%s'", path, m->string ? m->string : "");
          break;
        }
        st_set_meta(&f, m->string ? m->string : "", m->valuestring);
      }
      if (!ok) break;
      continue;
    }
    strmap_put(&names, name, (void *)j);
    Entry *e = &ents[ne];
    memset(e, 0, sizeof *e);
    e->name = name;
    if (!parse_entry(j, e, path, err, errlen)) {
      ok = false;
      break;
    }
    if (e->end > blobsize) {
      ok = errf(err, errlen, "%s: tensor '%s': data_offsets [%llu, %llu] go beyond the data (%llu bytes)", path, name,
                (unsigned long long)e->begin, (unsigned long long)e->end, (unsigned long long)blobsize);
      break;
    }
    sorted[ne] = e;
    ne++;
  }
  /* Non-overlapping and contiguous, in offset order. */
  if (ok) {
    qsort(sorted, (size_t)ne, sizeof(Entry *), cmp_entry);
    uint64_t at = 0;
    const char *prev = NULL;
    for (int i = 0; i < ne && ok; i++) {
      if (sorted[i]->begin < at)
        ok = errf(err, errlen, "%s: tensor '%s': data overlaps tensor '%s'", path, sorted[i]->name, prev);
      else if (sorted[i]->begin > at)
        ok = errf(err, errlen, "%s: tensor '%s': data is not contiguous (begins at byte %llu, expected %llu)", path,
                  sorted[i]->name, (unsigned long long)sorted[i]->begin, (unsigned long long)at);
      at = sorted[i]->end;
      prev = sorted[i]->name;
    }
    if (ok && at != blobsize)
      ok = errf(err, errlen, "%s: %llu bytes of data after the last tensor", path,
                (unsigned long long)(blobsize - at));
  }
  /* Copy the tensors, in header order. */
  for (int i = 0; i < ne && ok; i++) {
    Entry *e = &ents[i];
    StTensor *t = st_add(&f, e->name, e->dtype, e->rank, e->shape, NULL);
    GRADC_ASSERT(t->nbytes == e->end - e->begin);
    if (t->nbytes) memcpy(t->data, blob + e->begin, t->nbytes);
  }
  strmap_free(&names);
  free(ents);
  free(sorted);
  cJSON_Delete(root);
  if (!ok) {
    st_free(&f);
    return false;
  }
  *out = f;
  return true;
}

bool st_parse(const char *name, const void *buf, size_t size, StFile *out, char *err, size_t errlen) {
  st_init(out);
  bool ok = parse_file(name, buf, size, out, err, errlen);
  if (ok) out->path = mem_strdup(name);
  return ok;
}

bool st_read(const char *path, StFile *out, char *err, size_t errlen) {
  st_init(out);
  const char *why;
  size_t len;
  unsigned char *buf = (unsigned char *)read_file(path, &len, &why); /* regular files of bounded size */
  if (!buf) return errf(err, errlen, "%s: %s", path, why);
  bool ok = parse_file(path, buf, len, out, err, errlen);
  free(buf);
  if (ok) out->path = mem_strdup(path);
  return ok;
}

/* ------------------------------------------------------------------ */
/* Writing                                                             */
/* ------------------------------------------------------------------ */

static void json_string(StrBuf *sb, const char *s) {
  sb_putc(sb, '"');
  for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
    switch (*p) {
    case '"': sb_puts(sb, "\\\""); break;
    case '\\': sb_puts(sb, "\\\\"); break;
    case '\n': sb_puts(sb, "\\n"); break;
    case '\r': sb_puts(sb, "\\r"); break;
    case '\t': sb_puts(sb, "\\t"); break;
    default:
      if (*p < 0x20)
        sb_printf(sb, "\\u%04x", *p);
      else
        sb_putc(sb, (char)*p);
    }
  }
  sb_putc(sb, '"');
}


bool st_write(const char *path, const StFile *f, char *err, size_t errlen) {
  /* Check the tensors before touching the file system. */
  for (int i = 0; i < f->n; i++) {
    const StTensor *t = &f->t[i];
    if (strcmp(t->name, "__metadata__") == 0)
      return errf(err, errlen, "%s: tensor '%s': reserved name", path, t->name);
    if (control_char(t->name) >= 0) return name_error(path, "tensor", t->name, err, errlen);
    if (t->rank < 0 || t->rank > IR_MAX_RANK) return errf(err, errlen, "%s: tensor '%s': bad rank", path, t->name);
    if ((size_t)st_numel(t) * st_dtype_size(t->dtype) != t->nbytes)
      return errf(err, errlen, "%s: tensor '%s': %zu bytes of data do not match its shape", path, t->name, t->nbytes);
    for (int k = 0; k < i; k++)
      if (strcmp(f->t[k].name, t->name) == 0)
        return errf(err, errlen, "%s: tensor '%s': duplicate name", path, t->name);
  }
  StrBuf h;
  sb_init(&h);
  sb_putc(&h, '{');
  bool first = true;
  if (f->nmeta > 0) {
    sb_puts(&h, "\"__metadata__\":{");
    for (int i = 0; i < f->nmeta; i++) {
      if (i) sb_putc(&h, ',');
      json_string(&h, f->meta_key[i]);
      sb_putc(&h, ':');
      json_string(&h, f->meta_val[i]);
    }
    sb_putc(&h, '}');
    first = false;
  }
  uint64_t off = 0;
  for (int i = 0; i < f->n; i++) {
    const StTensor *t = &f->t[i];
    if (!first) sb_putc(&h, ',');
    first = false;
    json_string(&h, t->name);
    sb_printf(&h, ":{\"dtype\":\"%s\",\"shape\":[", st_dtype_name(t->dtype));
    for (int k = 0; k < t->rank; k++) sb_printf(&h, "%s%lld", k ? "," : "", (long long)t->shape[k]);
    sb_printf(&h, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)off, (unsigned long long)(off + t->nbytes));
    off += t->nbytes;
  }
  sb_putc(&h, '}');
  while (h.len % 8) sb_putc(&h, ' ');

  unsigned char len8[8];
  for (int i = 0; i < 8; i++) len8[i] = (unsigned char)((uint64_t)h.len >> (8 * i));
  FilePart *parts = mem_calloc((size_t)f->n + 2, sizeof *parts);
  parts[0] = (FilePart){len8, 8};
  parts[1] = (FilePart){h.data, h.len};
  for (int i = 0; i < f->n; i++) parts[i + 2] = (FilePart){f->t[i].data, f->t[i].nbytes};
  bool ok = write_file_atomic(path, parts, f->n + 2, err, errlen);
  free(parts);
  sb_free(&h);
  return ok;
}
