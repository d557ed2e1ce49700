/* lexer.c - turns .gdl source text into tokens.
 *
 * Statements end at a newline or ';' (both become one TK_NEWLINE; runs of
 * them collapse into one, and a final one is added before TK_EOF).  Inside
 * () and [] newlines are skipped so an expression may span lines; a '{' or
 * '}' closes any such group, so an unbalanced '(' cannot swallow the rest of
 * the file.  Columns count bytes from 1.  Errors (a stray character, a bad
 * number, an unterminated string) are reported and the lexer goes on. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "frontend.h"

enum { MAX_SOURCE = 1 << 30 };

typedef struct Lexer {
  const SrcFile *src;
  Diag *d;
  const char *p, *end;
  const char *line_start;
  int line;
  int depth; /* open ( and [ */
  Token *toks;
  int n, cap;
  bool failed;
} Lexer;

static void error_at(Lexer *L, const char *at, const char *fmt, ...) GRADC_PRINTF(3, 4);
static void error_at(Lexer *L, const char *at, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  diag_vat(L->d, DIAG_ERROR, L->src, L->line, (int)(at - L->line_start) + 1, fmt, ap);
  va_end(ap);
  L->failed = true;
}

static Token *push(Lexer *L, TokKind kind, const char *start, int len) {
  if (L->n == L->cap) {
    L->cap = L->cap ? L->cap * 2 : 256;
    Token *t = realloc(L->toks, sizeof(Token) * (size_t)L->cap);
    if (!t) abort();
    L->toks = t;
  }
  Token *t = &L->toks[L->n++];
  memset(t, 0, sizeof *t);
  t->kind = kind;
  t->text = start;
  t->len = len;
  t->line = L->line;
  t->col = (int)(start - L->line_start) + 1;
  return t;
}

static void push_newline(Lexer *L, const char *at) {
  if (L->n == 0 || L->toks[L->n - 1].kind == TK_NEWLINE) return;
  push(L, TK_NEWLINE, at, 1);
}

static bool is_ident_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
static bool is_digit(char c) { return c >= '0' && c <= '9'; }
static bool is_ident_char(char c) { return is_ident_start(c) || is_digit(c); }

/* number = digits ("." digits?)? exponent? | "." digits exponent?
 * exponent = ("e" | "E") ("+" | "-")? digits
 * A '.' directly followed by another '.' is a range, not a fraction: 0..L */
static void lex_number(Lexer *L) {
  const char *start = L->p, *q = L->p;
  bool is_float = false;
  while (q < L->end && is_digit(*q)) q++;
  if (q < L->end && *q == '.' && !(q + 1 < L->end && q[1] == '.')) {
    is_float = true;
    q++;
    while (q < L->end && is_digit(*q)) q++;
  }
  bool bad = false;
  if (q < L->end && (*q == 'e' || *q == 'E')) {
    is_float = true;
    q++;
    if (q < L->end && (*q == '+' || *q == '-')) q++;
    if (q >= L->end || !is_digit(*q)) bad = true;
    while (q < L->end && is_digit(*q)) q++;
  }
  if (q < L->end && (is_ident_char(*q) || *q == '.') && !(q + 1 < L->end && q[0] == '.' && q[1] == '.')) {
    /* 3x, 1e, 1.2.3: one error for the whole run */
    while (q < L->end && (is_ident_char(*q) || (*q == '.' && !(q + 1 < L->end && q[1] == '.')))) q++;
    bad = true;
  }
  int len = (int)(q - start);
  Token *t = push(L, is_float ? TK_FLOAT : TK_INT, start, len);
  L->p = q;
  if (bad) {
    error_at(L, start, "invalid number '%.*s'", len > 40 ? 40 : len, start);
    return;
  }
  if (len > 400) {
    error_at(L, start, "number is too long");
    return;
  }
  char buf[512];
  memcpy(buf, start, (size_t)len);
  buf[len] = '\0';
  if (!is_float) {
    int64_t v = 0;
    for (int i = 0; i < len; i++) {
      int dg = buf[i] - '0';
      if (v > (INT64_MAX - dg) / 10) {
        error_at(L, start, "integer literal '%.*s' is too large", len > 40 ? 40 : len, start);
        return;
      }
      v = v * 10 + dg;
    }
    t->ival = v;
    t->fval = (double)v;
    return;
  }
  errno = 0;
  double v = strtod(buf, NULL);
  if (errno == ERANGE && (v > 1.0 || v < -1.0)) {
    error_at(L, start, "number '%.*s' is out of range", len > 40 ? 40 : len, start);
    return;
  }
  t->fval = v;
}

/* The punctuators, longest first. */
static const char *const puncts[] = {"...", "..", "**", "<=", ">=", "==", "!=", "<", ">", "+", "-", "*", "/", "@",
                                     "(",   ")",  "[",  "]",  "{",  "}",  ",",  ":", "=", "."};

static void lex_run(Lexer *L) {
  while (L->p < L->end) {
    char c = *L->p;
    if (c == ' ' || c == '\t' || c == '\r' || c == '\f' || c == '\v') {
      L->p++;
      continue;
    }
    if (c == '#') {
      while (L->p < L->end && *L->p != '\n') L->p++;
      continue;
    }
    if (c == '\n') {
      if (L->depth == 0) push_newline(L, L->p);
      L->p++;
      L->line++;
      L->line_start = L->p;
      continue;
    }
    if (c == ';') {
      push_newline(L, L->p);
      L->p++;
      continue;
    }
    if (is_ident_start(c)) {
      const char *q = L->p;
      while (q < L->end && is_ident_char(*q)) q++;
      push(L, TK_IDENT, L->p, (int)(q - L->p));
      L->p = q;
      continue;
    }
    if (is_digit(c) || (c == '.' && L->p + 1 < L->end && is_digit(L->p[1]))) {
      lex_number(L);
      continue;
    }
    if (c == '"') {
      const char *q = L->p + 1;
      while (q < L->end && *q != '"' && *q != '\n') q++;
      if (q >= L->end || *q != '"') {
        error_at(L, L->p, "unterminated string");
        L->p = q;
        continue;
      }
      push(L, TK_STRING, L->p, (int)(q + 1 - L->p));
      L->p = q + 1;
      continue;
    }
    bool matched = false;
    for (size_t i = 0; i < sizeof puncts / sizeof *puncts; i++) {
      size_t n = strlen(puncts[i]);
      if ((size_t)(L->end - L->p) >= n && memcmp(L->p, puncts[i], n) == 0) {
        push(L, TK_PUNCT, L->p, (int)n);
        if (c == '(' || c == '[') {
          L->depth++;
        } else if ((c == ')' || c == ']') && L->depth > 0) {
          L->depth--;
        } else if (c == '{' || c == '}') {
          L->depth = 0;
        }
        L->p += n;
        matched = true;
        break;
      }
    }
    if (matched) continue;
    /* One error for a run of stray bytes (a UTF-8 character is several). */
    unsigned char u = (unsigned char)c;
    if (u >= 0x21 && u < 0x7f)
      error_at(L, L->p, "unexpected character '%c'", c);
    else
      error_at(L, L->p, "unexpected byte 0x%02x", u);
    L->p++;
    while (L->p < L->end && (unsigned char)*L->p >= 0x80) L->p++;
  }
  push_newline(L, L->p);
  push(L, TK_EOF, L->p, 0);
}

int lex_tokenize_checked(const SrcFile *src, Arena *a, Diag *d, Token **out, bool *failed) {
  Lexer L;
  memset(&L, 0, sizeof L);
  L.src = src;
  L.d = d;
  L.p = src->text ? src->text : "";
  size_t len = src->text ? src->len : 0;
  L.line = 1;
  L.line_start = L.p;
  if (len > MAX_SOURCE) {
    diag_at(d, DIAG_ERROR, src, 1, 1, "file is too large (%zu bytes)", len);
    L.failed = true;
    len = 0;
  }
  L.end = L.p + len;
  lex_run(&L);
  Token *t = ARENA_ARRAY(a, Token, L.n);
  memcpy(t, L.toks, sizeof(Token) * (size_t)L.n);
  free(L.toks);
  *out = t;
  *failed = L.failed;
  return L.n;
}

int lex_tokenize(const SrcFile *src, Arena *a, Diag *d, Token **out) {
  bool failed;
  return lex_tokenize_checked(src, a, d, out, &failed);
}
