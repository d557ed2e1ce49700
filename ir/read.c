/* read.c - parse the IR text form written by print.c back into an IrFunc.
 *
 * Grammar (one op per line; `//` comments and blank lines are skipped):
 *
 *   file   = func EOF
 *   func   = "func" "@" (NAME | STRING) "(" (arg ("," arg)*)? ")" plan? "{" (op | kernel)* "}"
 *   kernel = "kernel" "@" "k" INT "(" values? ")" "->" "(" values? ")" "{" op* "}"   (after `fuse`)
 *   plan   = "arena" INT "persist" INT
 *   arg    = "%" NAME ":" type store? ("input" "batch"? | "param")
 *   op     = ("%" NAME "=")? OPNAME (value ("," value)*)? attrs? (":" type store?)? loc?
 *   store  = "@" INT | "@grad" INT | "@alias" INT           (memplan's storage)
 *   attrs  = "{" attr ("," attr)* "}"
 *   attr   = NAME "=" (INT | FLOAT | "true" | "false" | STRING | "[" (INT ("," INT)*)? "]")
 *   type   = DTYPE ("[" INT ("," INT)* "]")?
 *   loc    = "loc" "(" ("unknown" | STRING ":" INT ":" INT) ")"
 *
 * A kernel block gives its ops IrOp.group = N; the values it lists must
 * be exactly those its ops read from outside (inputs) and those they
 * define that something outside uses (outputs), which is checked once the
 * whole function is read.
 *
 * Every op is built with ir_build, the printed type as the hint, so the
 * shape rules check the text.  The first error is reported through diag_at
 * (file:line:col with a caret) and unwinds with longjmp to ir_read, which
 * frees everything and returns NULL.  The reader must not crash on any
 * input: it never reads past src->len, bounds every number, and has no
 * recursion. */
#include <errno.h>
#include <limits.h>
#include <setjmp.h>
#include <stdlib.h>
#include <string.h>

#include "ir.h"

#define MAX_DIM ((int64_t)1 << 40)

typedef enum {
  TK_EOF,
  TK_IDENT,   /* func, f32, matmul, grad.seed, true, loc, keys */
  TK_VALUE,   /* %name */
  TK_GLOBAL,  /* @name */
  TK_INT,     /* -12 */
  TK_FLOAT,   /* 1.5, 1e-05, inf, -inf, nan */
  TK_STRING,  /* "..." (text holds the quoted form) */
  TK_PUNCT,   /* one of ( ) { } [ ] , : = and -> */
} TokKind;

typedef struct Tok {
  TokKind kind;
  const char *s; /* start in the source */
  size_t n;      /* length */
  int line, col;
  bool bol; /* first token on its line */
} Tok;

typedef struct Reader {
  const SrcFile *src;
  Diag *diag;
  jmp_buf fail;
  const char *p, *end;
  int line, col;
  Tok tok; /* current token */
  IrFunc *f;
  StrMap values; /* name -> IrValue*, names owned by f's arena */
  /* Growable scratch (malloc'd, freed by ir_read). */
  IrValue **args;
  int nargs, capargs;
  IrAttr *attrs;
  int nattrs, capattrs;
  int64_t *ints;
  int nints, capints;
  /* Kernel blocks: listed outputs, checked at the end of the function. */
  struct KOut {
    int group;
    IrValue *v; /* NULL: the closing marker of a kernel's list */
    int line, col;
  } *kouts;
  int nkouts, capkouts;
  struct KSeen {
    int group, line, col;
  } *kseen;
  int nkseen, capkseen;
  struct KOut *kin; /* the inputs of the kernel being read */
  int nkin, capkin;
  Tok *kname; /* the output names of the kernel being read */
  int nkname, capkname;
} Reader;

GRADC_NORETURN static void error_at(Reader *r, int line, int col, const char *fmt, ...) GRADC_PRINTF(4, 5);
static void error_at(Reader *r, int line, int col, const char *fmt, ...) {
  /* A source line holding a NUL byte would cut the diagnostic short:
   * report such errors without the source excerpt. */
  const SrcFile *src = r->src;
  SrcFile name_only = {r->src->name, NULL, 0};
  const char *p = r->src->text, *end = p ? p + r->src->len : p;
  for (int l = 1; p && p < end && l < line; p++)
    if (*p == '\n') l++;
  for (; p && p < end && *p != '\n'; p++)
    if (*p == 0) src = &name_only;
  va_list ap;
  va_start(ap, fmt);
  diag_vat(r->diag, DIAG_ERROR, src, line, col, fmt, ap);
  va_end(ap);
  longjmp(r->fail, 1);
}

/* A token as text for messages: at most 32 bytes, control bytes escaped. */
static const char *tok_text(const Tok *t, char *buf, size_t n) {
  if (t->kind == TK_EOF) return "end of file";
  size_t k = 0;
  buf[k++] = '\'';
  for (size_t i = 0; i < t->n && i < 32 && k + 6 < n; i++) {
    unsigned char c = (unsigned char)t->s[i];
    if (c < 0x20 || c >= 0x7f)
      k += (size_t)snprintf(buf + k, n - k, "\\x%02x", c);
    else
      buf[k++] = (char)c;
  }
  if (t->n > 32 && k + 4 < n) {
    memcpy(buf + k, "...", 3);
    k += 3;
  }
  buf[k++] = '\'';
  buf[k] = 0;
  return buf;
}

GRADC_NORETURN static void error_tok(Reader *r, const char *what) {
  char buf[200];
  error_at(r, r->tok.line, r->tok.col, "expected %s, got %s", what, tok_text(&r->tok, buf, sizeof buf));
}

/* ------------------------------------------------------------------ */
/* Lexer                                                               */
/* ------------------------------------------------------------------ */

static bool is_name_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '.';
}

static bool is_digit(char c) { return c >= '0' && c <= '9'; }

static void advance(Reader *r) {
  if (*r->p == '\n') {
    r->line++;
    r->col = 1;
  } else {
    r->col++;
  }
  r->p++;
}

static bool at(Reader *r, const char *s) {
  size_t n = strlen(s);
  return (size_t)(r->end - r->p) >= n && memcmp(r->p, s, n) == 0;
}

/* Read the next token into r->tok. */
static void next(Reader *r) {
  int start_line = r->tok.line;
  bool newline = r->tok.kind == TK_EOF && r->tok.s == NULL; /* the first token */
  for (;;) {
    if (r->p >= r->end) break;
    char c = *r->p;
    if (c == ' ' || c == '\t' || c == '\r' || c == '\n') {
      advance(r);
    } else if (at(r, "//")) {
      while (r->p < r->end && *r->p != '\n') advance(r);
    } else {
      break;
    }
  }
  Tok t = {TK_EOF, r->p, 0, r->line, r->col, false};
  t.bol = newline || r->line != start_line;
  if (r->p >= r->end) {
    r->tok = t;
    r->tok.bol = true;
    return;
  }
  const char *s = r->p;
  char c = *s;
  if (c == '%' || c == '@') {
    advance(r);
    if (c == '@' && r->p < r->end && *r->p == '"') {
      /* @"quoted name": the token holds the string; parsed by the caller */
      t.kind = TK_GLOBAL;
    } else {
      while (r->p < r->end && is_name_char(*r->p)) advance(r);
      if (r->p == s + 1) {
        r->tok = t;
        error_at(r, t.line, t.col, "expected a name after '%c'", c);
      }
      t.kind = c == '%' ? TK_VALUE : TK_GLOBAL;
    }
  } else if (c == '"') {
    advance(r);
    while (r->p < r->end && *r->p != '"' && *r->p != '\n') {
      if (*r->p == '\\' && r->p + 1 < r->end && r->p[1] != '\n') advance(r);
      advance(r);
    }
    if (r->p >= r->end || *r->p != '"') error_at(r, t.line, t.col, "unterminated string");
    advance(r);
    t.kind = TK_STRING;
  } else if (is_digit(c) || (c == '-' && r->p + 1 < r->end && (is_digit(r->p[1]) || r->p[1] == 'i'))) {
    /* -?digits(.digits)?([eE][+-]?digits)? | -inf */
    bool is_float = false;
    if (c == '-') advance(r);
    if (at(r, "inf")) {
      for (int i = 0; i < 3; i++) advance(r);
      is_float = true;
    } else {
      while (r->p < r->end && is_digit(*r->p)) advance(r);
      if (r->p < r->end && *r->p == '.') {
        is_float = true;
        advance(r);
        while (r->p < r->end && is_digit(*r->p)) advance(r);
      }
      if (r->p < r->end && (*r->p == 'e' || *r->p == 'E')) {
        is_float = true;
        advance(r);
        if (r->p < r->end && (*r->p == '+' || *r->p == '-')) advance(r);
        if (r->p >= r->end || !is_digit(*r->p)) error_at(r, t.line, t.col, "malformed number");
        while (r->p < r->end && is_digit(*r->p)) advance(r);
      }
    }
    if (r->p < r->end && is_name_char(*r->p)) error_at(r, t.line, t.col, "malformed number");
    t.kind = is_float ? TK_FLOAT : TK_INT;
  } else if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_') {
    while (r->p < r->end && is_name_char(*r->p)) advance(r);
    t.kind = TK_IDENT;
  } else if (c == '-' && r->p + 1 < r->end && r->p[1] == '>') {
    advance(r);
    advance(r);
    t.kind = TK_PUNCT; /* "->" */
  } else if (strchr("(){}[],:=", c) && c != 0) {
    advance(r);
    t.kind = TK_PUNCT;
  } else {
    unsigned char u = (unsigned char)c;
    if (u >= 0x20 && u < 0x7f)
      error_at(r, t.line, t.col, "unexpected character '%c'", c);
    else
      error_at(r, t.line, t.col, "unexpected byte 0x%02x", u);
  }
  t.n = (size_t)(r->p - s);
  r->tok = t;
}

static bool is_punct(const Reader *r, char c) { return r->tok.kind == TK_PUNCT && r->tok.s[0] == c; }

static bool is_ident(const Reader *r, const char *s) {
  return r->tok.kind == TK_IDENT && strlen(s) == r->tok.n && memcmp(r->tok.s, s, r->tok.n) == 0;
}

static void expect_punct(Reader *r, char c) {
  if (!is_punct(r, c)) {
    char what[8] = {'\'', c, '\'', 0};
    error_tok(r, what);
  }
  next(r);
}

/* ------------------------------------------------------------------ */
/* Literals                                                            */
/* ------------------------------------------------------------------ */

static int64_t parse_int(Reader *r) {
  if (r->tok.kind != TK_INT) error_tok(r, "an integer");
  char buf[64];
  if (r->tok.n >= sizeof buf) error_at(r, r->tok.line, r->tok.col, "integer out of range");
  memcpy(buf, r->tok.s, r->tok.n);
  buf[r->tok.n] = 0;
  errno = 0;
  char *e;
  long long v = strtoll(buf, &e, 10);
  if (errno == ERANGE || *e) error_at(r, r->tok.line, r->tok.col, "integer out of range");
  next(r);
  return (int64_t)v;
}

static double parse_float(Reader *r) {
  char buf[512];
  if (r->tok.n >= sizeof buf) error_at(r, r->tok.line, r->tok.col, "number too long");
  memcpy(buf, r->tok.s, r->tok.n);
  buf[r->tok.n] = 0;
  char *e;
  double v = strtod(buf, &e);
  if (*e) error_at(r, r->tok.line, r->tok.col, "malformed number");
  next(r);
  return v; /* overflow gives inf, underflow 0: both exact enough for text */
}

/* Decode the current STRING token into f's arena. */
static const char *parse_string(Reader *r) {
  if (r->tok.kind != TK_STRING) error_tok(r, "a string");
  const char *s = r->tok.s + 1, *e = r->tok.s + r->tok.n - 1;
  char *out = arena_alloc(&r->f->arena, (size_t)(e - s) + 1);
  size_t k = 0;
  for (const char *p = s; p < e; p++) {
    if (*p == 0) error_at(r, r->tok.line, r->tok.col + (int)(p - r->tok.s), "NUL byte in string");
    if (*p != '\\') {
      out[k++] = *p;
      continue;
    }
    int col = r->tok.col + (int)(p - r->tok.s);
    p++;
    switch (*p) {
    case '"':
    case '\\': out[k++] = *p; break;
    case 'n': out[k++] = '\n'; break;
    case 't': out[k++] = '\t'; break;
    case 'x': {
      int v = 0;
      for (int i = 0; i < 2; i++) {
        char c = p + 1 < e ? p[1] : 0;
        int d = is_digit(c) ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0) error_at(r, r->tok.line, col, "malformed \\x escape");
        v = v * 16 + d;
        p++;
      }
      if (v == 0) error_at(r, r->tok.line, col, "NUL byte in string");
      out[k++] = (char)v;
      break;
    }
    default: error_at(r, r->tok.line, col, "unknown escape sequence");
    }
  }
  out[k] = 0;
  next(r);
  return out;
}

/* type = DTYPE ("[" INT ("," INT)* "]")? */
static IrType parse_type(Reader *r) {
  IrType t;
  memset(&t, 0, sizeof t);
  if (r->tok.kind != TK_IDENT) error_tok(r, "a type");
  if (!ir_dtype_parse(r->tok.s, r->tok.n, &t.dtype)) {
    char buf[200];
    error_at(r, r->tok.line, r->tok.col, "unknown type %s", tok_text(&r->tok, buf, sizeof buf));
  }
  next(r);
  /* A '[' directly after the dtype is its shape (attributes are in '{'). */
  if (!is_punct(r, '[')) return t;
  next(r);
  for (;;) {
    if (t.shape.rank == IR_MAX_RANK) error_at(r, r->tok.line, r->tok.col, "more than %d dimensions", IR_MAX_RANK);
    int line = r->tok.line, col = r->tok.col;
    int64_t d = parse_int(r);
    if (d < 0 || d >= MAX_DIM) error_at(r, line, col, "dimension %lld out of range", (long long)d);
    t.shape.dim[t.shape.rank++] = d;
    if (is_punct(r, ']')) break;
    expect_punct(r, ',');
  }
  next(r);
  return t;
}

static bool all_digits(const char *s, size_t n);

/* A byte count or offset of the memory plan: a non-negative INT. */
static int64_t parse_bytes(Reader *r) {
  int line = r->tok.line, col = r->tok.col;
  int64_t v = parse_int(r);
  if (v < 0) error_at(r, line, col, "negative offset or size %lld", (long long)v);
  return v;
}

/* store = "@" INT | "@grad" INT | "@alias" INT, when the current token
 * (on the same line) starts one; sets v's storage. */
static void parse_storage(Reader *r, IrValue *v) {
  if (r->tok.kind != TK_GLOBAL || r->tok.bol) return;
  const char *s = r->tok.s + 1;
  size_t n = r->tok.n - 1;
  if (n == 4 && memcmp(s, "grad", 4) == 0) {
    next(r);
    v->storage = IR_STORE_GRAD;
    v->offset = parse_bytes(r);
  } else if (n == 5 && memcmp(s, "alias", 5) == 0) {
    next(r);
    v->storage = IR_STORE_ALIAS;
    v->offset = parse_bytes(r);
  } else {
    char buf[64];
    if (n == 0 || n >= sizeof buf || !all_digits(s, n)) error_tok(r, "a storage '@OFFSET', '@grad OFFSET' or '@alias OFFSET'");
    memcpy(buf, s, n);
    buf[n] = 0;
    errno = 0;
    long long off = strtoll(buf, NULL, 10);
    if (errno == ERANGE) error_at(r, r->tok.line, r->tok.col, "offset out of range");
    v->storage = IR_STORE_ARENA;
    v->offset = (int64_t)off;
    next(r);
  }
}

/* ------------------------------------------------------------------ */
/* Values                                                              */
/* ------------------------------------------------------------------ */

static bool all_digits(const char *s, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (!is_digit(s[i])) return false;
  return true;
}

/* The name of the current %value token, in f's arena (without the %). */
static const char *value_name(Reader *r) { return arena_strndup(&r->f->arena, r->tok.s + 1, r->tok.n - 1); }

/* Bind a %name to v; a name used twice is an error at `t`. */
static void define(Reader *r, const Tok *t, const char *name, IrValue *v) {
  if (strmap_get(&r->values, name)) error_at(r, t->line, t->col, "redefinition of '%%%s'", name);
  strmap_put(&r->values, name, v);
  if (!all_digits(name, strlen(name))) v->name = name;
}

static IrValue *use(Reader *r) {
  if (r->tok.kind != TK_VALUE) error_tok(r, "a value");
  char buf[200];
  const char *name = value_name(r);
  IrValue *v = strmap_get(&r->values, name);
  if (!v) error_at(r, r->tok.line, r->tok.col, "undefined value %s", tok_text(&r->tok, buf, sizeof buf));
  next(r);
  return v;
}

/* ------------------------------------------------------------------ */
/* Ops                                                                 */
/* ------------------------------------------------------------------ */

#define GROW(arr, n, cap)                                                                                    \
  do {                                                                                                       \
    if ((n) == (cap)) {                                                                                      \
      (cap) = (cap) ? (cap) * 2 : 16;                                                                        \
      void *p_ = realloc((arr), sizeof(*(arr)) * (size_t)(cap));                                             \
      if (!p_) abort();                                                                                      \
      (arr) = p_;                                                                                            \
    }                                                                                                        \
  } while (0)

/* attr = NAME "=" value */
static void parse_attr(Reader *r) {
  char buf[200];
  if (r->tok.kind != TK_IDENT) error_tok(r, "an attribute name");
  Tok key = r->tok;
  const char *k = arena_strndup(&r->f->arena, key.s, key.n);
  for (int i = 0; i < r->nattrs; i++)
    if (strcmp(r->attrs[i].key, k) == 0) error_at(r, key.line, key.col, "duplicate attribute '%s'", k);
  if (!ir_attr_known(k)) error_at(r, key.line, key.col, "unknown attribute '%s' (docs/IR.md lists them)", k);
  next(r);
  expect_punct(r, '=');
  IrAttr a;
  if (r->tok.kind == TK_INT) {
    a = ir_attr_int(k, parse_int(r));
  } else if (r->tok.kind == TK_FLOAT || is_ident(r, "inf") || is_ident(r, "nan")) {
    a = ir_attr_float(k, parse_float(r));
  } else if (is_ident(r, "true") || is_ident(r, "false")) {
    a = ir_attr_bool(k, r->tok.s[0] == 't');
    next(r);
  } else if (r->tok.kind == TK_STRING) {
    a = ir_attr_str(k, parse_string(r));
  } else if (is_punct(r, '[')) {
    next(r);
    r->nints = 0;
    if (!is_punct(r, ']')) {
      for (;;) {
        GROW(r->ints, r->nints, r->capints);
        r->ints[r->nints++] = parse_int(r);
        if (is_punct(r, ']')) break;
        expect_punct(r, ',');
      }
    }
    next(r);
    int64_t *v = ARENA_ARRAY(&r->f->arena, int64_t, r->nints > 0 ? r->nints : 1);
    if (r->nints) memcpy(v, r->ints, sizeof(int64_t) * (size_t)r->nints);
    a = ir_attr_ints(k, v, r->nints);
  } else {
    error_at(r, r->tok.line, r->tok.col, "expected an attribute value, got %s", tok_text(&r->tok, buf, sizeof buf));
  }
  GROW(r->attrs, r->nattrs, r->capattrs);
  r->attrs[r->nattrs++] = a;
}

/* loc = "loc" "(" ("unknown" | STRING ":" INT ":" INT) ")" */
static IrLoc parse_loc(Reader *r) {
  IrLoc loc = {NULL, 0, 0};
  next(r); /* loc */
  expect_punct(r, '(');
  if (is_ident(r, "unknown")) {
    next(r);
  } else {
    loc.file = parse_string(r);
    expect_punct(r, ':');
    int line = r->tok.line, col = r->tok.col;
    int64_t l = parse_int(r);
    expect_punct(r, ':');
    int line2 = r->tok.line, col2 = r->tok.col;
    int64_t c = parse_int(r);
    if (l < 0 || l > INT_MAX) error_at(r, line, col, "line number out of range");
    if (c < 0 || c > INT_MAX) error_at(r, line2, col2, "column number out of range");
    loc.line = (int)l;
    loc.col = (int)c;
  }
  expect_punct(r, ')');
  return loc;
}

/* op = ("%" NAME "=")? OPNAME operands? attrs? (":" type)? loc? */
static void parse_op(Reader *r) {
  char buf[200];
  Tok res = r->tok;
  const char *res_name = NULL;
  if (res.kind == TK_VALUE) {
    res_name = value_name(r);
    next(r);
    expect_punct(r, '=');
  }
  if (r->tok.kind != TK_IDENT) error_tok(r, "an op");
  Tok optok = r->tok;
  IrOpcode opc;
  if (!ir_opcode_parse(optok.s, optok.n, &opc))
    error_at(r, optok.line, optok.col, "unknown op %s", tok_text(&optok, buf, sizeof buf));
  bool has_result = ir_op_info[opc].kind != IR_KIND_OUTPUT;
  if (has_result && !res_name) error_at(r, optok.line, optok.col, "'%s' needs a result: '%%name = %s ...'",
                                        ir_op_info[opc].name, ir_op_info[opc].name);
  if (!has_result && res_name) error_at(r, res.line, res.col, "'%s' has no result", ir_op_info[opc].name);
  next(r);

  r->nargs = 0;
  if (r->tok.kind == TK_VALUE && !r->tok.bol) {
    for (;;) {
      GROW(r->args, r->nargs, r->capargs);
      r->args[r->nargs++] = use(r);
      if (!is_punct(r, ',')) break;
      next(r);
    }
  }
  r->nattrs = 0;
  if (is_punct(r, '{') && !r->tok.bol) {
    next(r);
    for (;;) {
      parse_attr(r);
      if (is_punct(r, '}')) break;
      expect_punct(r, ',');
    }
    next(r);
  }
  IrType type;
  IrValue store; /* the storage, moved to the result once it is built */
  memset(&store, 0, sizeof store);
  bool has_type = false;
  if (is_punct(r, ':') && !r->tok.bol) {
    if (!has_result) error_at(r, r->tok.line, r->tok.col, "'%s' has no result type", ir_op_info[opc].name);
    next(r);
    type = parse_type(r);
    has_type = true;
    parse_storage(r, &store);
  }
  if (has_result && !has_type) error_tok(r, "':' and the result type");
  IrLoc loc = {NULL, 0, 0};
  if (is_ident(r, "loc") && !r->tok.bol) loc = parse_loc(r);
  if (r->tok.kind != TK_EOF && !r->tok.bol)
    error_at(r, r->tok.line, r->tok.col, "unexpected %s after the op", tok_text(&r->tok, buf, sizeof buf));

  char err[512];
  IrOp *op = ir_build(r->f, opc, r->args, r->nargs, r->attrs, r->nattrs, has_type ? &type : NULL, loc, err,
                      sizeof err);
  if (!op) error_at(r, optok.line, optok.col, "%s", err);
  if (has_result) define(r, &res, res_name, op->result);
  if (has_result) {
    op->result->storage = store.storage;
    op->result->offset = store.offset;
  }
}

/* ------------------------------------------------------------------ */
/* Functions                                                           */
/* ------------------------------------------------------------------ */

/* arg = "%" NAME ":" type ("input" "batch"? | "param" ("split" "(" INT ")" ("ranks" INT)?)? | "buffer") */
static void parse_arg(Reader *r) {
  if (r->tok.kind != TK_VALUE) error_tok(r, "an argument '%name: type'");
  Tok t = r->tok;
  const char *name = value_name(r);
  next(r);
  expect_punct(r, ':');
  IrType type = parse_type(r);
  IrValue store;
  memset(&store, 0, sizeof store);
  parse_storage(r, &store);
  IrArgRole role;
  bool batched = false;
  int64_t split = -1, ranks = 0;
  if (is_ident(r, "input")) {
    role = IR_ARG_INPUT;
    next(r);
    if (is_ident(r, "batch")) {
      batched = true;
      next(r);
    }
  } else if (is_ident(r, "param")) {
    role = IR_ARG_PARAM;
    next(r);
    if (is_ident(r, "split")) {
      next(r);
      expect_punct(r, '(');
      Tok at = r->tok;
      split = parse_int(r);
      if (split < 0 || split >= type.shape.rank) {
        r->tok = at;
        error_tok(r, "an axis of the param's type");
      }
      expect_punct(r, ')');
      if (is_ident(r, "ranks")) {
        next(r);
        at = r->tok;
        ranks = parse_int(r);
        if (ranks < 1 || ranks > 1 << 20) {
          r->tok = at;
          error_tok(r, "a rank count between 1 and 2^20");
        }
      }
    }
  } else if (is_ident(r, "buffer")) {
    role = IR_ARG_BUFFER;
    next(r);
  } else {
    error_tok(r, "'input', 'param' or 'buffer'");
  }
  IrValue *v = ir_func_add_arg(r->f, NULL, type, role, batched);
  v->split_axis = (int)split;
  v->split_ranks = (int)ranks;
  v->storage = store.storage;
  v->offset = store.offset;
  define(r, &t, name, v);
}

/* ------------------------------------------------------------------ */
/* Kernel blocks                                                       */
/* ------------------------------------------------------------------ */

static bool listed(IrValue *const *vs, int n, const IrValue *v) {
  for (int i = 0; i < n; i++)
    if (vs[i] == v) return true;
  return false;
}

static const char *vtext(const IrValue *v, char *buf, size_t n) {
  if (v->name)
    snprintf(buf, n, "%%%s", v->name);
  else
    snprintf(buf, n, "an unnamed value");
  return buf;
}

/* kernel = "kernel" "@" "k" INT "(" values? ")" "->" "(" values? ")" "{" op* "}" */
static void parse_kernel(Reader *r) {
  char buf[200];
  Tok kt = r->tok;
  next(r);
  if (r->tok.kind != TK_GLOBAL) error_tok(r, "a kernel name '@kN'");
  Tok nt = r->tok;
  long long g = 0;
  bool ok = nt.n >= 3 && nt.s[1] == 'k' && nt.s[2] != '0' && nt.n <= 11;
  for (size_t i = 2; ok && i < nt.n; i++) {
    ok = is_digit(nt.s[i]);
    g = g * 10 + (nt.s[i] - '0');
  }
  if (!ok || g < 1 || g > INT_MAX)
    error_at(r, nt.line, nt.col, "expected a kernel name '@k1', '@k2', ..., got %s", tok_text(&nt, buf, sizeof buf));
  for (int i = 0; i < r->nkseen; i++)
    if (r->kseen[i].group == g)
      error_at(r, nt.line, nt.col, "kernel @k%lld appears twice (first at line %d)", g, r->kseen[i].line);
  GROW(r->kseen, r->nkseen, r->capkseen);
  r->kseen[r->nkseen++] = (struct KSeen){(int)g, kt.line, kt.col};
  next(r);

  /* inputs: defined before the block (reader-owned lists: errors unwind) */
  expect_punct(r, '(');
  r->nkin = 0;
  if (!is_punct(r, ')')) {
    for (;;) {
      Tok vt = r->tok;
      IrValue *v = use(r);
      GROW(r->kin, r->nkin, r->capkin);
      r->kin[r->nkin++] = (struct KOut){(int)g, v, vt.line, vt.col};
      if (is_punct(r, ')')) break;
      expect_punct(r, ',');
    }
  }
  next(r);
  if (!(r->tok.kind == TK_PUNCT && r->tok.n == 2 && r->tok.s[0] == '-')) error_tok(r, "'->'");
  next(r);
  /* outputs: names defined inside the block, resolved after it */
  expect_punct(r, '(');
  r->nkname = 0;
  if (!is_punct(r, ')')) {
    for (;;) {
      if (r->tok.kind != TK_VALUE) error_tok(r, "a value");
      GROW(r->kname, r->nkname, r->capkname);
      r->kname[r->nkname++] = r->tok;
      next(r);
      if (is_punct(r, ')')) break;
      expect_punct(r, ',');
    }
  }
  next(r);
  Tok open = r->tok;
  expect_punct(r, '{');
  int nin = r->nkin, nout_names = r->nkname;
  IrValue **ins = ARENA_ARRAY(&r->f->arena, IrValue *, nin > 0 ? nin : 1);
  int *in_line = ARENA_ARRAY(&r->f->arena, int, 2 * (nin > 0 ? nin : 1));
  for (int i = 0; i < nin; i++) {
    ins[i] = r->kin[i].v;
    in_line[2 * i] = r->kin[i].line;
    in_line[2 * i + 1] = r->kin[i].col;
  }
  int first_out = r->nkouts;
  const char **out_text = ARENA_ARRAY(&r->f->arena, const char *, nout_names > 0 ? nout_names : 1);
  for (int i = 0; i < nout_names; i++) {
    out_text[i] = arena_strndup(&r->f->arena, r->kname[i].s + 1, r->kname[i].n - 1);
    GROW(r->kouts, r->nkouts, r->capkouts);
    r->kouts[r->nkouts++] = (struct KOut){(int)g, NULL, r->kname[i].line, r->kname[i].col};
  }

  if (r->tok.kind != TK_EOF && !r->tok.bol && !is_punct(r, '}'))
    error_at(r, r->tok.line, r->tok.col, "expected a new line after '{'");
  int first = r->f->nops;
  while (!is_punct(r, '}')) {
    if (r->tok.kind == TK_EOF)
      error_at(r, r->tok.line, r->tok.col, "expected '}' (to close kernel @k%lld at line %d)", g, open.line);
    if (is_ident(r, "kernel")) error_at(r, r->tok.line, r->tok.col, "a kernel cannot contain a kernel");
    parse_op(r);
  }
  next(r);
  int last = r->f->nops;
  if (last == first) error_at(r, kt.line, kt.col, "kernel @k%lld has no ops", g);
  for (int i = first; i < last; i++) r->f->ops[i]->group = (int)g;

  /* Inputs: exactly the operands defined outside the block. */
  for (int i = 0; i < nin; i++) {
    for (int k = 0; k < i; k++)
      if (ins[k] == ins[i]) error_at(r, in_line[2 * i], in_line[2 * i + 1], "kernel @k%lld lists an input twice", g);
    bool read = false;
    for (int k = first; k < last && !read; k++) {
      IrOp *op = r->f->ops[k];
      for (int a = 0; a < op->nargs; a++) read |= op->args[a] == ins[i];
    }
    if (!read)
      error_at(r, in_line[2 * i], in_line[2 * i + 1], "kernel @k%lld does not read its input %s", g,
               vtext(ins[i], buf, sizeof buf));
  }
  for (int k = first; k < last; k++) {
    IrOp *op = r->f->ops[k];
    for (int a = 0; a < op->nargs; a++) {
      IrValue *v = op->args[a];
      if (v->def && v->def->group == (int)g) continue;
      if (!listed(ins, nin, v))
        error_at(r, kt.line, kt.col, "kernel @k%lld reads %s, which is not among its inputs", g,
                 vtext(v, buf, sizeof buf));
    }
  }
  /* Outputs: defined by the block (used-outside is checked at the end). */
  for (int i = 0; i < nout_names; i++) {
    struct KOut *o = &r->kouts[first_out + i];
    IrValue *v = strmap_get(&r->values, out_text[i]);
    if (!v || !v->def || v->def->group != (int)g)
      error_at(r, o->line, o->col, "kernel @k%lld: %%%s is not defined in the kernel", g, out_text[i]);
    for (int k = first_out; k < first_out + i; k++)
      if (r->kouts[k].v == v) error_at(r, o->line, o->col, "kernel @k%lld lists an output twice", g);
    o->v = v;
  }
  GROW(r->kouts, r->nkouts, r->capkouts);
  r->kouts[r->nkouts++] = (struct KOut){(int)g, NULL, kt.line, kt.col}; /* the kernel itself */
}

/* After the function: every kernel lists exactly the values it defines
 * that an op outside it uses. */
static void check_kernel_outputs(Reader *r) {
  if (r->nkseen == 0) return;
  IrFunc *f = r->f;
  bool *outside = ARENA_ARRAY(&f->arena, bool, f->nvalues > 0 ? f->nvalues : 1);
  for (int i = 0; i < f->nops; i++) {
    IrOp *op = f->ops[i];
    for (int a = 0; a < op->nargs; a++) {
      IrValue *v = op->args[a];
      if (v->def && v->def->group > 0 && v->def->group != op->group) outside[v->id] = true;
    }
  }
  char buf[200];
  int start = 0;
  for (int k = 0; k < r->nkouts; k++) {
    struct KOut *o = &r->kouts[k];
    if (o->v) {
      if (!outside[o->v->id])
        error_at(r, o->line, o->col, "kernel @k%d lists the output %s, which nothing outside the kernel uses", o->group,
                 vtext(o->v, buf, sizeof buf));
      continue;
    }
    /* the kernel's marker: everything used outside must be listed */
    for (int i = 0; i < f->nops; i++) {
      IrValue *v = f->ops[i]->result;
      if (f->ops[i]->group != o->group || !v || !outside[v->id]) continue;
      bool found = false;
      for (int q = start; q < k; q++) found |= r->kouts[q].v == v;
      if (!found)
        error_at(r, o->line, o->col, "kernel @k%d defines %s, used outside the kernel, which is not among its outputs",
                 o->group, vtext(v, buf, sizeof buf));
    }
    start = k + 1;
  }
}

/* func = "func" "@" (NAME | STRING) "(" args ")" "{" op* "}" */
static void parse_func(Reader *r) {
  if (!is_ident(r, "func")) error_tok(r, "'func'");
  next(r);
  if (r->tok.kind != TK_GLOBAL) error_tok(r, "a function name '@name'");
  if (r->tok.n == 1) {
    /* @"quoted name" */
    next(r);
    r->f->name = parse_string(r);
  } else {
    r->f->name = arena_strndup(&r->f->arena, r->tok.s + 1, r->tok.n - 1);
    next(r);
  }
  expect_punct(r, '(');
  if (!is_punct(r, ')')) {
    for (;;) {
      parse_arg(r);
      if (is_punct(r, ')')) break;
      expect_punct(r, ',');
    }
  }
  next(r);
  if (is_ident(r, "arena")) {
    next(r);
    r->f->arena_size = parse_bytes(r);
    if (!is_ident(r, "persist")) error_tok(r, "'persist'");
    next(r);
    int line = r->tok.line, col = r->tok.col;
    r->f->persist_size = parse_bytes(r);
    if (r->f->persist_size > r->f->arena_size)
      error_at(r, line, col, "persistent size %lld exceeds the arena size %lld", (long long)r->f->persist_size,
               (long long)r->f->arena_size);
  }
  Tok open = r->tok;
  expect_punct(r, '{');
  if (r->tok.kind != TK_EOF && !r->tok.bol && !is_punct(r, '}'))
    error_at(r, r->tok.line, r->tok.col, "expected a new line after '{'");
  while (!is_punct(r, '}')) {
    if (r->tok.kind == TK_EOF)
      error_at(r, r->tok.line, r->tok.col, "expected '}' (to close '{' at line %d)", open.line);
    if (is_ident(r, "kernel") && r->tok.bol)
      parse_kernel(r);
    else
      parse_op(r);
  }
  next(r);
  if (r->tok.kind != TK_EOF) {
    char buf[200];
    error_at(r, r->tok.line, r->tok.col, "expected end of file after the function, got %s",
             tok_text(&r->tok, buf, sizeof buf));
  }
  check_kernel_outputs(r);
}

IrFunc *ir_read(const SrcFile *src, Diag *d) {
  Reader *r = calloc(1, sizeof *r);
  if (!r) abort();
  r->src = src;
  r->diag = d;
  r->p = src->text ? src->text : "";
  r->end = r->p + (src->text ? src->len : 0);
  r->line = r->col = 1;
  r->f = ir_func_new("");
  strmap_init(&r->values);
  IrFunc *result = NULL;
  if (setjmp(r->fail) == 0) {
    next(r);
    parse_func(r);
    result = r->f;
  } else {
    ir_func_free(r->f);
  }
  strmap_free(&r->values);
  free(r->args);
  free(r->attrs);
  free(r->ints);
  free(r->kouts);
  free(r->kseen);
  free(r->kin);
  free(r->kname);
  free(r);
  return result;
}
