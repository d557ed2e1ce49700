/* diag.c - diagnostics in clang's format, with the source line and a caret;
 * and errf, how library functions put an error into a caller's buffer. */
#include <string.h>

#include "support.h"

void diag_init(Diag *d, FILE *out) {
  memset(d, 0, sizeof *d);
  d->out = out;
  d->max_errors = 20;
}

void diag_free(Diag *d) { sb_free(&d->log); }

bool diag_too_many(const Diag *d) { return d->max_errors > 0 && d->nerrors >= d->max_errors; }

static const char *level_name(DiagLevel lvl) {
  switch (lvl) {
  case DIAG_ERROR: return "error";
  case DIAG_WARNING: return "warning";
  case DIAG_NOTE: return "note";
  }
  return "error";
}

static void emit(Diag *d, const char *text) {
  sb_puts(&d->log, text);
  if (!d->quiet && d->out) {
    fputs(text, d->out);
    fflush(d->out);
  }
}

void diag_vat(Diag *d, DiagLevel lvl, const SrcFile *src, int line, int col, const char *fmt, va_list ap) {
  if (lvl == DIAG_ERROR) {
    if (diag_too_many(d)) return;
    d->nerrors++;
  }
  StrBuf sb;
  sb_init(&sb);
  sb_printf(&sb, "%s:%d:%d: %s: ", src && src->name ? src->name : "<input>", line, col, level_name(lvl));
  sb_vprintf(&sb, fmt, ap);
  sb_putc(&sb, '\n');
  if (src && src->text && line >= 1) {
    const char *p = src->text, *end = src->text + src->len;
    for (int l = 1; l < line && p < end; p++)
      if (*p == '\n') l++;
    const char *e = p;
    while (e < end && *e != '\n') e++;
    if (p < end || line == 1) {
      sb_putn(&sb, p, (size_t)(e - p));
      sb_putc(&sb, '\n');
      /* Keep tabs so the caret lines up under tabbed source. */
      for (int i = 1; i < col && p + i - 1 < e; i++) sb_putc(&sb, p[i - 1] == '\t' ? '\t' : ' ');
      sb_puts(&sb, "^\n");
    }
  }
  emit(d, sb_str(&sb));
  if (lvl == DIAG_ERROR && diag_too_many(d)) emit(d, "gradc: note: too many errors, stopping\n");
  sb_free(&sb);
}

void diag_at(Diag *d, DiagLevel lvl, const SrcFile *src, int line, int col, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  diag_vat(d, lvl, src, line, col, fmt, ap);
  va_end(ap);
}

void diag_plain(Diag *d, DiagLevel lvl, const char *fmt, ...) {
  if (lvl == DIAG_ERROR) d->nerrors++;
  StrBuf sb;
  sb_init(&sb);
  sb_printf(&sb, "gradc: %s: ", level_name(lvl));
  va_list ap;
  va_start(ap, fmt);
  sb_vprintf(&sb, fmt, ap);
  va_end(ap);
  sb_putc(&sb, '\n');
  emit(d, sb_str(&sb));
  sb_free(&sb);
}

bool errf(char *err, size_t n, const char *fmt, ...) {
  if (err && n) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, n, fmt, ap);
    va_end(ap);
  }
  return false;
}
