/* strbuf.c - growable strings and small text helpers. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "support.h"

void sb_init(StrBuf *sb) { memset(sb, 0, sizeof *sb); }

void sb_free(StrBuf *sb) {
  free(sb->data);
  memset(sb, 0, sizeof *sb);
}

static void grow(StrBuf *sb, size_t extra) {
  if (sb->len + extra + 1 <= sb->cap) return;
  size_t cap = sb->cap ? sb->cap * 2 : 256;
  while (cap < sb->len + extra + 1) cap *= 2;
  char *p = realloc(sb->data, cap);
  if (!p) {
    fprintf(stderr, "gradc: error: out of memory\n");
    abort();
  }
  sb->data = p;
  sb->cap = cap;
}

void sb_putn(StrBuf *sb, const char *s, size_t n) {
  grow(sb, n);
  memcpy(sb->data + sb->len, s, n);
  sb->len += n;
  sb->data[sb->len] = 0;
}

void sb_putc(StrBuf *sb, char c) { sb_putn(sb, &c, 1); }
void sb_puts(StrBuf *sb, const char *s) { sb_putn(sb, s, strlen(s)); }

void sb_vprintf(StrBuf *sb, const char *fmt, va_list ap) {
  va_list ap2;
  va_copy(ap2, ap);
  int n = vsnprintf(NULL, 0, fmt, ap);
  grow(sb, (size_t)n);
  vsnprintf(sb->data + sb->len, (size_t)n + 1, fmt, ap2);
  va_end(ap2);
  sb->len += (size_t)n;
}

void sb_printf(StrBuf *sb, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  sb_vprintf(sb, fmt, ap);
  va_end(ap);
}

const char *sb_str(StrBuf *sb) { return sb->data ? sb->data : ""; }

void fmt_double(char *buf, size_t n, double d) {
  if (isnan(d)) {
    snprintf(buf, n, "nan");
    return;
  }
  if (isinf(d)) {
    snprintf(buf, n, d < 0 ? "-inf" : "inf");
    return;
  }
  if (d == floor(d) && fabs(d) < 1e15) { /* whole numbers in plain notation: "-100.0", not "-1e+02" */
    snprintf(buf, n, "%.1f", d);
    return;
  }
  for (int prec = 1; prec <= 17; prec++) {
    snprintf(buf, n, "%.*g", prec, d);
    if (strtod(buf, NULL) == d) break;
  }
  /* Keep it recognisably a float: "1" -> "1.0" (not for exponent forms). */
  if (!strpbrk(buf, ".eE") && strlen(buf) + 3 < n) strcat(buf, ".0");
}
