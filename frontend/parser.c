/* parser.c - recursive-descent parser for .gdl models (chibicc style).
 *
 * Each parse function has its grammar rule above it, takes the current
 * token and returns the rest of the input through `Token **rest`.  The only
 * state is the Parser context (diagnostics, arena, nesting depth).  A syntax
 * error is reported once; the statement is then skipped up to its end (a
 * newline or ';', or the '}' closing its block) and parsing goes on, so that
 * several errors can be reported per file.  A parse function that failed
 * returns NULL and its callers return NULL without reporting again.
 *
 * Nesting is bounded (parentheses, unary operators, blocks, and the height of
 * the tree), so that no input can exhaust the stack here or in lower.c. */
#include <string.h>

#include "frontend.h"

enum {
  MAX_NEST = 200,   /* recursion depth of the parser */
  MAX_HEIGHT = 1000 /* height of an expression tree (long a+b+c+... chains) */
};

typedef struct Parser {
  const SrcFile *src;
  Diag *d;
  Arena *a;
  int depth;
  bool failed;
  int nerr;     /* errors reported */
  bool in_fn;   /* parsing a fn body */
  int in_loop;  /* for bodies around the current statement */
  int in_if;    /* if/else branches around the current statement */
  FeFn **fn_tail;
  int nfns;
  FeProgram *prog;
} Parser;

/* ---- tokens ---- */

static bool equal(const Token *t, const char *s) {
  return (t->kind == TK_PUNCT || t->kind == TK_IDENT) && (size_t)t->len == strlen(s) && memcmp(t->text, s, t->len) == 0;
}

static bool is_punct(const Token *t, const char *s) { return t->kind == TK_PUNCT && equal(t, s); }
static bool is_kw(const Token *t, const char *s) { return t->kind == TK_IDENT && equal(t, s); }

/* A token as it appears in messages. */
static const char *describe(const Token *t, char *buf, size_t n) {
  switch (t->kind) {
  case TK_EOF: return "end of file";
  case TK_NEWLINE: return t->text[0] == ';' ? "';'" : "end of line";
  case TK_IDENT:
  case TK_INT:
  case TK_FLOAT:
  case TK_STRING:
  case TK_PUNCT: snprintf(buf, n, "'%.*s'", t->len > 40 ? 40 : t->len, t->text); return buf;
  }
  return "?";
}

static void error_tok(Parser *P, const Token *t, const char *fmt, ...) GRADC_PRINTF(3, 4);
static void error_tok(Parser *P, const Token *t, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  diag_vat(P->d, DIAG_ERROR, P->src, t->line, t->col, fmt, ap);
  va_end(ap);
  P->failed = true;
  P->nerr++;
}

/* Report "expected X, got Y" at t. */
static void expected(Parser *P, const Token *t, const char *what) {
  char buf[64];
  error_tok(P, t, "expected %s, got %s", what, describe(t, buf, sizeof buf));
}

/* Consume the punctuator s or report an error. */
static bool skip(Parser *P, Token **tok, const char *s) {
  if (is_punct(*tok, s)) {
    *tok = *tok + 1;
    return true;
  }
  char what[16];
  snprintf(what, sizeof what, "'%s'", s);
  expected(P, *tok, what);
  return false;
}

/* Consume the closing bracket s of the group opened at `open`. */
static bool close_group(Parser *P, Token **tok, const char *s, const Token *open) {
  if (is_punct(*tok, s)) {
    *tok = *tok + 1;
    return true;
  }
  char buf[64];
  error_tok(P, *tok, "expected '%s' (to close '%.*s' at line %d), got %s", s, open->len, open->text, open->line,
            describe(*tok, buf, sizeof buf));
  return false;
}

static char *tok_str(Parser *P, const Token *t) { return arena_strndup(P->a, t->text, (size_t)t->len); }

static bool enter(Parser *P, const Token *t) {
  if (++P->depth > MAX_NEST) {
    error_tok(P, t, "nested too deeply (more than %d levels)", MAX_NEST);
    return false;
  }
  return true;
}

static void leave(Parser *P) { P->depth--; }

/* ---- nodes ---- */

static FeNode *new_node(Parser *P, FeNodeKind kind, Token *tok, Token *begin) {
  FeNode *n = ARENA_NEW(P->a, FeNode);
  n->kind = kind;
  n->tok = tok;
  n->begin = begin;
  n->depth = 1;
  return n;
}

/* Account for child c in n's height; false (reported) if it gets too tall. */
static bool grow(Parser *P, FeNode *n, const FeNode *c) {
  if (c && c->depth + 1 > n->depth) n->depth = c->depth + 1;
  if (n->depth > MAX_HEIGHT) {
    error_tok(P, n->tok, "expression is too complex (nested more than %d deep)", MAX_HEIGHT);
    return false;
  }
  return true;
}

static FeNode *new_binary(Parser *P, FeNodeKind kind, Token *op, FeNode *lhs, FeNode *rhs) {
  FeNode *n = new_node(P, kind, op, lhs->begin);
  n->lhs = lhs;
  n->rhs = rhs;
  if (!grow(P, n, lhs) || !grow(P, n, rhs)) return NULL;
  return n;
}

/* Growable arrays of nodes while parsing a list. */
typedef struct NodeVec {
  FeNode **v;
  Token **kw;
  int n, cap;
} NodeVec;

static void vec_push(Parser *P, NodeVec *vec, FeNode *x, Token *kw) {
  if (vec->n == vec->cap) {
    int cap = vec->cap ? vec->cap * 2 : 4;
    FeNode **v = ARENA_ARRAY(P->a, FeNode *, cap);
    Token **k = ARENA_ARRAY(P->a, Token *, cap);
    if (vec->n) {
      memcpy(v, vec->v, sizeof(FeNode *) * (size_t)vec->n);
      memcpy(k, vec->kw, sizeof(Token *) * (size_t)vec->n);
    }
    vec->v = v;
    vec->kw = k;
    vec->cap = cap;
  }
  vec->kw[vec->n] = kw;
  vec->v[vec->n++] = x;
}

/* ---- expressions ---- */

static FeNode *expr(Parser *P, Token **rest, Token *tok);
static FeNode *unary(Parser *P, Token **rest, Token *tok);

/* args = "(" (arg ("," arg)* ","?)? ")"
 * arg  = (IDENT "=")? expr */
static FeNode *call(Parser *P, Token **rest, Token *tok) {
  FeNode *n = new_node(P, FE_ND_CALL, tok, tok);
  n->name = tok_str(P, tok);
  Token *open = tok + 1;
  tok = tok + 2;
  NodeVec args = {0};
  bool seen_kw = false;
  while (!is_punct(tok, ")")) {
    if (args.n > 0) {
      if (!is_punct(tok, ",")) {
        close_group(P, &tok, ")", open);
        return NULL;
      }
      tok++;
      if (is_punct(tok, ")")) break;
    }
    Token *kw = NULL;
    if (tok->kind == TK_IDENT && is_punct(tok + 1, "=")) {
      kw = tok;
      tok += 2;
      seen_kw = true;
    } else if (seen_kw) {
      error_tok(P, tok, "positional argument after a keyword argument");
      return NULL;
    }
    FeNode *a = expr(P, &tok, tok);
    if (!a) return NULL;
    vec_push(P, &args, a, kw);
    if (!grow(P, n, a)) return NULL;
  }
  n->items = args.v;
  n->kw = args.kw;
  n->nitems = args.n;
  *rest = tok + 1;
  return n;
}

/* list = "[" (expr ("," expr)* ","?)? "]" */
static FeNode *list(Parser *P, Token **rest, Token *tok) {
  FeNode *n = new_node(P, FE_ND_LIST, tok, tok);
  Token *open = tok;
  tok++;
  NodeVec items = {0};
  while (!is_punct(tok, "]")) {
    if (items.n > 0) {
      if (!is_punct(tok, ",")) {
        close_group(P, &tok, "]", open);
        return NULL;
      }
      tok++;
      if (is_punct(tok, "]")) break;
    }
    FeNode *a = expr(P, &tok, tok);
    if (!a) return NULL;
    vec_push(P, &items, a, NULL);
    if (!grow(P, n, a)) return NULL;
  }
  n->items = items.v;
  n->nitems = items.n;
  *rest = tok + 1;
  return n;
}

/* primary = "(" expr ")" | list | IDENT args? | INT | FLOAT | STRING */
static FeNode *primary(Parser *P, Token **rest, Token *tok) {
  if (is_punct(tok, "(")) {
    Token *open = tok;
    FeNode *n = expr(P, &tok, tok + 1);
    if (!n) return NULL;
    if (!close_group(P, &tok, ")", open)) return NULL;
    *rest = tok;
    return n;
  }
  if (is_punct(tok, "[")) return list(P, rest, tok);
  if (tok->kind == TK_IDENT) {
    if (is_punct(tok + 1, "(")) return call(P, rest, tok);
    *rest = tok + 1;
    if (is_kw(tok, "true") || is_kw(tok, "false")) {
      FeNode *n = new_node(P, FE_ND_BOOL, tok, tok);
      n->ival = is_kw(tok, "true");
      return n;
    }
    FeNode *n = new_node(P, FE_ND_NAME, tok, tok);
    n->name = tok_str(P, tok);
    return n;
  }
  if (tok->kind == TK_INT) {
    FeNode *n = new_node(P, FE_ND_INT, tok, tok);
    n->ival = tok->ival;
    *rest = tok + 1;
    return n;
  }
  if (tok->kind == TK_FLOAT) {
    FeNode *n = new_node(P, FE_ND_FLOAT, tok, tok);
    n->fval = tok->fval;
    *rest = tok + 1;
    return n;
  }
  if (tok->kind == TK_STRING) {
    FeNode *n = new_node(P, FE_ND_STR, tok, tok);
    n->str = arena_strndup(P->a, tok->text + 1, (size_t)tok->len - 2);
    *rest = tok + 1;
    return n;
  }
  expected(P, tok, "an expression");
  return NULL;
}

/* index_item = "..." | expr? (":" expr? (":" expr?)?)? */
static FeNode *index_item(Parser *P, Token **rest, Token *tok) {
  if (is_punct(tok, "...")) {
    *rest = tok + 1;
    return new_node(P, FE_ND_ELLIPSIS, tok, tok);
  }
  Token *begin = tok;
  FeNode *start = NULL;
  if (!is_punct(tok, ":")) {
    if (is_punct(tok, ",") || is_punct(tok, "]")) {
      expected(P, tok, "an index");
      return NULL;
    }
    start = expr(P, &tok, tok);
    if (!start) return NULL;
    if (!is_punct(tok, ":")) {
      *rest = tok;
      return start;
    }
  }
  FeNode *n = new_node(P, FE_ND_SLICE, tok, begin);
  n->start = start;
  tok++; /* the first ':' */
  for (int part = 0; part < 2; part++) {
    if (part == 1) {
      if (!is_punct(tok, ":")) break;
      tok++;
    }
    if (is_punct(tok, ",") || is_punct(tok, "]") || is_punct(tok, ":")) continue;
    FeNode *e = expr(P, &tok, tok);
    if (!e) return NULL;
    if (part == 0)
      n->stop = e;
    else
      n->step = e;
  }
  if (!grow(P, n, n->start) || !grow(P, n, n->stop) || !grow(P, n, n->step)) return NULL;
  *rest = tok;
  return n;
}

/* postfix = primary ("[" index_item ("," index_item)* "]")* */
static FeNode *postfix(Parser *P, Token **rest, Token *tok) {
  FeNode *n = primary(P, &tok, tok);
  if (!n) return NULL;
  while (is_punct(tok, "[")) {
    Token *open = tok;
    FeNode *ix = new_node(P, FE_ND_INDEX, tok, n->begin);
    ix->lhs = n;
    if (!grow(P, ix, n)) return NULL;
    tok++;
    NodeVec items = {0};
    for (;;) {
      FeNode *it = index_item(P, &tok, tok);
      if (!it) return NULL;
      vec_push(P, &items, it, NULL);
      if (!grow(P, ix, it)) return NULL;
      if (is_punct(tok, ",") && !is_punct(tok + 1, "]")) {
        tok++;
        continue;
      }
      if (is_punct(tok, ",")) tok++;
      break;
    }
    if (!close_group(P, &tok, "]", open)) return NULL;
    ix->items = items.v;
    ix->nitems = items.n;
    n = ix;
  }
  *rest = tok;
  return n;
}

/* power = postfix ("**" unary)?
 * Right-associative and tighter than unary minus: -a ** -b ** c is
 * -(a ** (-(b ** c))). */
static FeNode *power(Parser *P, Token **rest, Token *tok) {
  FeNode *n = postfix(P, &tok, tok);
  if (!n) return NULL;
  if (is_punct(tok, "**")) {
    Token *op = tok;
    FeNode *e = unary(P, &tok, tok + 1);
    if (!e) return NULL;
    n = new_binary(P, FE_ND_POW, op, n, e);
    if (!n) return NULL;
  }
  *rest = tok;
  return n;
}

/* unary = ("-" | "+") unary | power */
static FeNode *unary(Parser *P, Token **rest, Token *tok) {
  if (!enter(P, tok)) return NULL;
  FeNode *n;
  if (is_punct(tok, "-") || is_punct(tok, "+")) {
    Token *op = tok;
    FeNode *x = unary(P, rest, tok + 1);
    if (!x) {
      n = NULL;
    } else if (is_punct(op, "+")) {
      n = x;
    } else {
      n = new_node(P, FE_ND_NEG, op, op);
      n->lhs = x;
      if (!grow(P, n, x)) n = NULL;
    }
  } else {
    n = power(P, rest, tok);
  }
  leave(P);
  return n;
}

/* mul = unary (("*" | "/" | "@") unary)* */
static FeNode *mul(Parser *P, Token **rest, Token *tok) {
  FeNode *n = unary(P, &tok, tok);
  while (n) {
    FeNodeKind k;
    if (is_punct(tok, "*"))
      k = FE_ND_MUL;
    else if (is_punct(tok, "/"))
      k = FE_ND_DIV;
    else if (is_punct(tok, "@"))
      k = FE_ND_MATMUL;
    else
      break;
    Token *op = tok;
    FeNode *r = unary(P, &tok, tok + 1);
    if (!r) return NULL;
    n = new_binary(P, k, op, n, r);
  }
  *rest = tok;
  return n;
}

/* add = mul (("+" | "-") mul)* */
static FeNode *add(Parser *P, Token **rest, Token *tok) {
  FeNode *n = mul(P, &tok, tok);
  while (n) {
    FeNodeKind k;
    if (is_punct(tok, "+"))
      k = FE_ND_ADD;
    else if (is_punct(tok, "-"))
      k = FE_ND_SUB;
    else
      break;
    Token *op = tok;
    FeNode *r = mul(P, &tok, tok + 1);
    if (!r) return NULL;
    n = new_binary(P, k, op, n, r);
  }
  *rest = tok;
  return n;
}

/* Language v2: comparisons bind looser than arithmetic; `not`, `and`, `or`
 * as in Python (`not` > `and` > `or`). */

static bool cmp_kind(const Token *t, FeNodeKind *k) {
  static const struct {
    const char *op;
    FeNodeKind kind;
  } ops[] = {{"==", FE_ND_EQ}, {"!=", FE_ND_NE}, {"<", FE_ND_LT}, {"<=", FE_ND_LE}, {">", FE_ND_GT}, {">=", FE_ND_GE}};
  for (size_t i = 0; i < sizeof ops / sizeof *ops; i++)
    if (is_punct(t, ops[i].op)) {
      *k = ops[i].kind;
      return true;
    }
  return false;
}

/* comparison = add (("==" | "!=" | "<" | "<=" | ">" | ">=") add)?
 * Python chains `a < b < c`; here a second comparison is an error. */
static FeNode *comparison(Parser *P, Token **rest, Token *tok) {
  FeNode *n = add(P, &tok, tok);
  FeNodeKind k;
  if (n && cmp_kind(tok, &k)) {
    Token *op = tok;
    FeNode *r = add(P, &tok, tok + 1);
    if (!r) return NULL;
    n = new_binary(P, k, op, n, r);
    if (n && cmp_kind(tok, &k)) {
      error_tok(P, tok, "comparisons cannot be chained (write 'a < b and b < c')");
      return NULL;
    }
  }
  *rest = tok;
  return n;
}

/* not = "not" not | comparison */
static FeNode *not_expr(Parser *P, Token **rest, Token *tok) {
  if (!is_kw(tok, "not")) return comparison(P, rest, tok);
  if (!enter(P, tok)) return NULL;
  Token *op = tok;
  FeNode *x = not_expr(P, rest, tok + 1);
  FeNode *n = NULL;
  if (x) {
    n = new_node(P, FE_ND_NOT, op, op);
    n->lhs = x;
    if (!grow(P, n, x)) n = NULL;
  }
  leave(P);
  return n;
}

/* and = not ("and" not)* */
static FeNode *and_expr(Parser *P, Token **rest, Token *tok) {
  FeNode *n = not_expr(P, &tok, tok);
  while (n && is_kw(tok, "and")) {
    Token *op = tok;
    FeNode *r = not_expr(P, &tok, tok + 1);
    if (!r) return NULL;
    n = new_binary(P, FE_ND_AND, op, n, r);
  }
  *rest = tok;
  return n;
}

/* expr = and ("or" and)* */
static FeNode *expr(Parser *P, Token **rest, Token *tok) {
  FeNode *n = and_expr(P, &tok, tok);
  while (n && is_kw(tok, "or")) {
    Token *op = tok;
    FeNode *r = and_expr(P, &tok, tok + 1);
    if (!r) return NULL;
    n = new_binary(P, FE_ND_OR, op, n, r);
  }
  *rest = tok;
  return n;
}

/* ---- statements ---- */

static FeStmt *new_stmt(Parser *P, FeStmtKind kind, Token *tok) {
  FeStmt *s = ARENA_NEW(P->a, FeStmt);
  s->kind = kind;
  s->tok = tok;
  return s;
}

static const char *const reserved[] = {"model", "batch", "dim",  "input",  "param",  "loss",  "for",
                                       "fn",    "return", "true", "false",  "buffer", "update", "output",
                                       "if",    "else",  "and",  "or",     "not",    "training"};

static bool is_reserved(const Token *t) {
  for (size_t i = 0; i < sizeof reserved / sizeof *reserved; i++)
    if (is_kw(t, reserved[i])) return true;
  return false;
}

/* A name being declared or assigned. */
static bool name(Parser *P, Token **rest, Token *tok, const char *after) {
  if (tok->kind != TK_IDENT) {
    char what[64];
    snprintf(what, sizeof what, "a name after '%s'", after);
    expected(P, tok, what);
    return false;
  }
  if (is_reserved(tok)) {
    error_tok(P, tok, "'%.*s' is a keyword and cannot be used as a name", tok->len, tok->text);
    return false;
  }
  *rest = tok + 1;
  return true;
}

/* type = IDENT ("[" expr ("," expr)* "]")? */
static bool type(Parser *P, Token **rest, Token *tok, FeTypeSpec *ty) {
  if (tok->kind != TK_IDENT) {
    expected(P, tok, "a type (f32, f64, bf16, f16 or i32)");
    return false;
  }
  if (!ir_dtype_parse(tok->text, (size_t)tok->len, &ty->dtype) || ty->dtype == IR_DT_BOOL) {
    error_tok(P, tok, "unknown type '%.*s' (expected f32, f64, bf16, f16 or i32)", tok->len > 40 ? 40 : tok->len,
              tok->text);
    return false;
  }
  ty->tok = tok;
  tok++;
  if (is_punct(tok, "[")) {
    Token *open = tok;
    tok++;
    FeNode **dims = ARENA_ARRAY(P->a, FeNode *, IR_MAX_RANK);
    int rank = 0;
    for (;;) {
      if (rank == IR_MAX_RANK) {
        error_tok(P, tok, "a tensor has at most %d dimensions", IR_MAX_RANK);
        return false;
      }
      if (is_punct(tok, "]")) {
        expected(P, tok, "a dimension");
        return false;
      }
      FeNode *e = expr(P, &tok, tok);
      if (!e) return false;
      dims[rank++] = e;
      if (!is_punct(tok, ",")) break;
      tok++;
    }
    if (!close_group(P, &tok, "]", open)) return false;
    ty->shape = dims;
    ty->rank = rank;
  }
  *rest = tok;
  return true;
}

/* dim = ("batch" | "dim") IDENT "=" expr */
static FeStmt *dim_stmt(Parser *P, Token **rest, Token *tok) {
  FeStmt *s = new_stmt(P, FE_ST_DIM, tok);
  s->is_batch = is_kw(tok, "batch");
  s->name = tok + 1;
  if (!name(P, &tok, tok + 1, s->is_batch ? "batch" : "dim")) return NULL;
  s->id = tok_str(P, s->name);
  if (!skip(P, &tok, "=")) return NULL;
  s->expr = expr(P, &tok, tok);
  if (!s->expr) return NULL;
  *rest = tok;
  return s;
}

/* input = "input" IDENT ":" type */
static FeStmt *input_stmt(Parser *P, Token **rest, Token *tok) {
  FeStmt *s = new_stmt(P, FE_ST_INPUT, tok);
  s->name = tok + 1;
  if (!name(P, &tok, tok + 1, "input")) return NULL;
  s->id = tok_str(P, s->name);
  if (!skip(P, &tok, ":")) return NULL;
  if (!type(P, &tok, tok, &s->type)) return NULL;
  if (is_kw(tok, "init") || is_kw(tok, "split")) {
    error_tok(P, tok, "'%.*s' applies to params, not inputs", tok->len, tok->text);
    return NULL;
  }
  *rest = tok;
  return s;
}

/* init = ("zeros" | "ones") ("(" ")")? | ("normal" | "uniform") "(" expr "," expr ")" */
static bool init(Parser *P, Token **rest, Token *tok, FeStmt *s) {
  static const struct {
    const char *name;
    FeInitKind kind;
    int nargs;
  } inits[] = {{"zeros", FE_INIT_ZEROS, 0}, {"ones", FE_INIT_ONES, 0}, {"normal", FE_INIT_NORMAL, 2},
               {"uniform", FE_INIT_UNIFORM, 2}};
  int k = -1;
  for (int i = 0; i < 4; i++)
    if (is_kw(tok, inits[i].name)) k = i;
  if (k < 0) {
    char buf[64];
    error_tok(P, tok, "unknown init %s (expected zeros, ones, normal(mean, std) or uniform(lo, hi))",
              describe(tok, buf, sizeof buf));
    return false;
  }
  s->init = inits[k].kind;
  Token *name_tok = tok;
  tok++;
  if (inits[k].nargs == 0) {
    if (is_punct(tok, "(") && is_punct(tok + 1, ")")) tok += 2;
    *rest = tok;
    return true;
  }
  if (!is_punct(tok, "(")) {
    error_tok(P, tok, "'%s' needs two arguments: %s", inits[k].name,
              k == 2 ? "normal(mean, std)" : "uniform(lo, hi)");
    return false;
  }
  FeNode *c = call(P, &tok, name_tok);
  if (!c) return false;
  if (c->nitems != 2) {
    error_tok(P, name_tok, "'%s' takes 2 arguments, got %d", inits[k].name, c->nitems);
    return false;
  }
  for (int i = 0; i < 2; i++) {
    if (c->kw[i]) {
      error_tok(P, c->kw[i], "'%s' takes no keyword arguments", inits[k].name);
      return false;
    }
    s->init_args[i] = c->items[i];
  }
  *rest = tok;
  return true;
}

/* param  = "param" IDENT ":" type ("init" init | "split" "(" expr ")")*
 * buffer = "buffer" IDENT ":" type ("init" init)? */
static FeStmt *param_stmt(Parser *P, Token **rest, Token *tok) {
  bool buffer = is_kw(tok, "buffer");
  FeStmt *s = new_stmt(P, buffer ? FE_ST_BUFFER : FE_ST_PARAM, tok);
  s->name = tok + 1;
  if (!name(P, &tok, tok + 1, buffer ? "buffer" : "param")) return NULL;
  s->id = tok_str(P, s->name);
  if (!skip(P, &tok, ":")) return NULL;
  if (!type(P, &tok, tok, &s->type)) return NULL;
  for (;;) {
    if (is_kw(tok, "init")) {
      if (s->init_tok) {
        error_tok(P, tok, "duplicate 'init'");
        return NULL;
      }
      s->init_tok = tok;
      if (!init(P, &tok, tok + 1, s)) return NULL;
    } else if (is_kw(tok, "split") && buffer) {
      error_tok(P, tok, "'split' applies to params, not buffers");
      return NULL;
    } else if (is_kw(tok, "split")) {
      if (s->split_tok) {
        error_tok(P, tok, "duplicate 'split'");
        return NULL;
      }
      s->split_tok = tok;
      Token *open = tok + 1;
      tok = open;
      if (!skip(P, &tok, "(")) return NULL;
      s->split = expr(P, &tok, tok);
      if (!s->split) return NULL;
      if (!close_group(P, &tok, ")", open)) return NULL;
    } else {
      break;
    }
  }
  *rest = tok;
  return s;
}

/* loss   = "loss" IDENT "=" expr
 * update = "update" IDENT "=" expr
 * output = "output" IDENT "=" expr */
static FeStmt *loss_stmt(Parser *P, Token **rest, Token *tok) {
  FeStmtKind kind = is_kw(tok, "update") ? FE_ST_UPDATE : is_kw(tok, "output") ? FE_ST_OUTPUT : FE_ST_LOSS;
  FeStmt *s = new_stmt(P, kind, tok);
  s->name = tok + 1;
  char kw[16];
  snprintf(kw, sizeof kw, "%.*s", tok->len, tok->text);
  if (!name(P, &tok, tok + 1, kw)) return NULL;
  s->id = tok_str(P, s->name);
  if (!skip(P, &tok, "=")) return NULL;
  s->expr = expr(P, &tok, tok);
  if (!s->expr) return NULL;
  *rest = tok;
  return s;
}

/* assign = IDENT "=" expr */
static FeStmt *assign_stmt(Parser *P, Token **rest, Token *tok) {
  FeStmt *s = new_stmt(P, FE_ST_ASSIGN, tok);
  s->name = tok;
  s->id = tok_str(P, tok);
  tok++;
  if (!is_punct(tok, "=")) {
    char buf[64];
    error_tok(P, tok, "expected '=' after '%.*s', got %s", s->name->len > 40 ? 40 : s->name->len, s->name->text,
              describe(tok, buf, sizeof buf));
    return NULL;
  }
  s->expr = expr(P, &tok, tok + 1);
  if (!s->expr) return NULL;
  *rest = tok;
  return s;
}

/* multi = IDENT ("," IDENT)+ "=" expr
 * Binds the several results of a call (`v, i = topk(x, 2)`); lower.c
 * checks the count. */
static FeStmt *multi_stmt(Parser *P, Token **rest, Token *tok) {
  FeStmt *s = new_stmt(P, FE_ST_MULTI, tok);
  NodeVec names = {0};
  for (;;) {
    if (!name(P, &tok, tok, names.n ? "," : "the start of a statement")) return NULL;
    for (int i = 0; i < names.n; i++)
      if (names.kw[i]->len == tok[-1].len && memcmp(names.kw[i]->text, tok[-1].text, (size_t)tok[-1].len) == 0) {
        error_tok(P, tok - 1, "'%.*s' is bound twice in one statement", tok[-1].len, tok[-1].text);
        return NULL;
      }
    vec_push(P, &names, NULL, tok - 1);
    if (!is_punct(tok, ",")) break;
    tok++;
  }
  if (!is_punct(tok, "=")) {
    expected(P, tok, "'=' after the names");
    return NULL;
  }
  s->names = names.kw;
  s->nnames = names.n;
  s->ids = ARENA_ARRAY(P->a, const char *, names.n);
  for (int i = 0; i < names.n; i++) s->ids[i] = tok_str(P, names.kw[i]);
  s->name = names.kw[0];
  s->id = s->ids[0];
  s->expr = expr(P, &tok, tok + 1);
  if (!s->expr) return NULL;
  *rest = tok;
  return s;
}

static FeStmt *stmts(Parser *P, Token **rest, Token *tok, FeNode **ret, const FeFn *fn);

/* block = "{" stmts "}" */
static FeStmt *block(Parser *P, Token **rest, Token *tok, FeNode **ret, const FeFn *fn, bool *ok) {
  Token *open = tok;
  *ok = false;
  if (!skip(P, &tok, "{")) return NULL;
  if (!enter(P, open)) return NULL;
  FeStmt *body = stmts(P, &tok, tok, ret, fn);
  leave(P);
  if (!close_group(P, &tok, "}", open)) {
    *rest = tok;
    return body;
  }
  *ok = true;
  *rest = tok;
  return body;
}

/* for = "for" IDENT "in" expr ".." expr "{" stmts "}" */
static FeStmt *for_stmt(Parser *P, Token **rest, Token *tok) {
  FeStmt *s = new_stmt(P, FE_ST_FOR, tok);
  s->name = tok + 1;
  if (!name(P, &tok, tok + 1, "for")) return NULL;
  s->id = tok_str(P, s->name);
  if (!is_kw(tok, "in")) {
    expected(P, tok, "'in'");
    return NULL;
  }
  s->from = expr(P, &tok, tok + 1);
  if (!s->from) return NULL;
  if (!skip(P, &tok, "..")) return NULL;
  s->to = expr(P, &tok, tok);
  if (!s->to) return NULL;
  P->in_loop++;
  bool ok;
  s->body = block(P, &tok, tok, NULL, NULL, &ok);
  P->in_loop--;
  *rest = tok;
  return ok ? s : NULL;
}

/* if = "if" expr "{" stmts "}" ("else" (if | "{" stmts "}"))?
 * Resolved at compile time (lower.c): the condition is over dims, numbers
 * and the flag `training`.  The branches share the enclosing scope. */
static FeStmt *if_stmt(Parser *P, Token **rest, Token *tok, FeNode **ret, const FeFn *fn) {
  FeStmt *s = new_stmt(P, FE_ST_IF, tok);
  if (!enter(P, tok)) return NULL;
  FeStmt *out = NULL;
  s->expr = expr(P, &tok, tok + 1);
  if (s->expr) {
    P->in_if++;
    bool ok;
    s->body = block(P, &tok, tok, ret, fn, &ok);
    if (ok && tok->kind == TK_NEWLINE && is_kw(tok + 1, "else")) tok++; /* `}` and `else` on two lines */
    if (ok && is_kw(tok, "else")) {
      if (is_kw(tok + 1, "if")) {
        s->orelse = if_stmt(P, &tok, tok + 1, ret, fn);
        ok = s->orelse != NULL;
      } else {
        s->orelse = block(P, &tok, tok + 1, ret, fn, &ok);
      }
    }
    P->in_if--;
    if (ok) out = s;
  }
  leave(P);
  *rest = tok;
  return out;
}

/* fn = "fn" IDENT "(" (IDENT ("," IDENT)* ","?)? ")" "{" stmts "}"
 * The body's last statement is `return expr`. */
static FeFn *fn_def(Parser *P, Token **rest, Token *tok) {
  Token *kw = tok;
  FeFn *fn = ARENA_NEW(P->a, FeFn);
  fn->name = tok + 1;
  if (!name(P, &tok, tok + 1, "fn")) return NULL;
  fn->id = tok_str(P, fn->name);
  Token *open = tok;
  if (!skip(P, &tok, "(")) return NULL;
  NodeVec params = {0};
  while (!is_punct(tok, ")")) {
    if (params.n > 0) {
      if (!is_punct(tok, ",")) {
        close_group(P, &tok, ")", open);
        return NULL;
      }
      tok++;
      if (is_punct(tok, ")")) break;
    }
    if (!name(P, &tok, tok, params.n ? "," : "(")) return NULL;
    for (int i = 0; i < params.n; i++)
      if (params.kw[i]->len == tok[-1].len && memcmp(params.kw[i]->text, tok[-1].text, (size_t)tok[-1].len) == 0) {
        error_tok(P, tok - 1, "duplicate argument '%.*s'", tok[-1].len, tok[-1].text);
        return NULL;
      }
    vec_push(P, &params, NULL, tok - 1);
  }
  tok++;
  fn->nparams = params.n;
  fn->params = params.kw;
  fn->param_ids = ARENA_ARRAY(P->a, const char *, params.n ? params.n : 1);
  for (int i = 0; i < params.n; i++) fn->param_ids[i] = tok_str(P, params.kw[i]);
  bool saved = P->in_fn;
  P->in_fn = true;
  bool ok;
  int nerr = P->nerr;
  fn->body = block(P, &tok, tok, &fn->ret, fn, &ok);
  P->in_fn = saved;
  *rest = tok;
  if (!ok || P->nerr != nerr) return NULL;
  if (!fn->ret) {
    error_tok(P, kw, "fn '%s' has no 'return'", fn->id);
    return NULL;
  }
  return fn;
}

/* End of a statement: a newline or ';' (consumed), or a '}' or the end of
 * the file (left for the caller).  A statement ending in a block needs no
 * separator: `for i in 0..2 { ... } x = y`. */
static bool stmt_end(Parser *P, Token **rest, Token *tok) {
  if (tok->kind == TK_NEWLINE) {
    *rest = tok + 1;
    return true;
  }
  if (is_punct(tok, "}") || tok->kind == TK_EOF || is_punct(tok - 1, "}")) {
    *rest = tok;
    return true;
  }
  expected(P, tok, "end of statement (newline or ';')");
  return false;
}

/* Skip the rest of a statement after an error: up to and including the next
 * newline outside braces, or up to the '}' closing the current block. */
static Token *sync(Token *tok) {
  int braces = 0;
  for (; tok->kind != TK_EOF; tok++) {
    if (is_punct(tok, "{")) braces++;
    if (is_punct(tok, "}")) {
      if (braces == 0) return tok;
      braces--;
      if (braces == 0 && tok[1].kind == TK_NEWLINE) return tok + 2;
    }
    if (tok->kind == TK_NEWLINE && braces == 0) return tok + 1;
  }
  return tok;
}

/* stmt = dim | input | param | buffer | loss | update | output | for | if | fn
 *      | "return" expr ("," expr)* | multi | assign
 * `ret` is where a fn body's return expression goes (NULL outside fns). */
static FeStmt *stmt(Parser *P, Token **rest, Token *tok, FeNode **ret, const FeFn *fn, bool *failed) {
  *failed = true;
  bool top = !P->in_fn && !P->in_loop && !P->in_if;
  if (is_kw(tok, "batch") || is_kw(tok, "dim") || is_kw(tok, "input") || is_kw(tok, "param") ||
      is_kw(tok, "buffer")) {
    if (!top) {
      error_tok(P, tok, "'%.*s' is only allowed at the top level of a model", tok->len, tok->text);
      return NULL;
    }
    FeStmt *s = is_kw(tok, "input")                           ? input_stmt(P, &tok, tok)
                : is_kw(tok, "param") || is_kw(tok, "buffer") ? param_stmt(P, &tok, tok)
                                                              : dim_stmt(P, &tok, tok);
    if (!s || !stmt_end(P, rest, tok)) return NULL;
    *failed = false;
    return s;
  }
  if (is_kw(tok, "loss") || is_kw(tok, "update") || is_kw(tok, "output")) {
    if (P->in_fn) {
      error_tok(P, tok, "'%.*s' is not allowed inside a fn (return the value and write the %.*s in the model)",
                tok->len, tok->text, tok->len, tok->text);
      return NULL;
    }
    FeStmt *s = loss_stmt(P, &tok, tok);
    if (!s || !stmt_end(P, rest, tok)) return NULL;
    *failed = false;
    return s;
  }
  if (is_kw(tok, "if")) {
    FeStmt *s = if_stmt(P, &tok, tok, ret, fn);
    if (!s || !stmt_end(P, rest, tok)) return NULL;
    *failed = false;
    return s;
  }
  if (is_kw(tok, "else")) {
    error_tok(P, tok, "'else' without an 'if' before it");
    return NULL;
  }
  if (is_kw(tok, "for")) {
    FeStmt *s = for_stmt(P, &tok, tok);
    if (!s || !stmt_end(P, rest, tok)) return NULL;
    *failed = false;
    return s;
  }
  if (is_kw(tok, "fn")) {
    if (!top) {
      error_tok(P, tok, "fn definitions are only allowed at the top level");
      return NULL;
    }
    FeFn *f = fn_def(P, &tok, tok);
    if (!f || !stmt_end(P, rest, tok)) return NULL;
    *P->fn_tail = f;
    P->fn_tail = &f->next;
    P->nfns++;
    *failed = false;
    return NULL;
  }
  if (is_kw(tok, "return")) {
    if (!ret || P->in_loop || P->in_if) {
      error_tok(P, tok, !P->in_fn  ? "'return' outside a fn"
                        : P->in_if ? "'return' must be the last statement of a fn, not inside an if"
                                   : "'return' must be the last statement of a fn, not inside a for loop");
      return NULL;
    }
    Token *kw = tok;
    FeNode *e = expr(P, &tok, tok + 1);
    if (e && is_punct(tok, ",")) {
      /* return a, b: several results (bound with `x, y = f(...)`) */
      FeNode *t = new_node(P, FE_ND_TUPLE, kw + 1, kw + 1);
      NodeVec items = {0};
      vec_push(P, &items, e, NULL);
      if (!grow(P, t, e)) return NULL;
      while (e && is_punct(tok, ",")) {
        e = expr(P, &tok, tok + 1);
        if (!e) return NULL;
        vec_push(P, &items, e, NULL);
        if (!grow(P, t, e)) return NULL;
      }
      t->items = items.v;
      t->nitems = items.n;
      e = t;
    }
    if (!e || !stmt_end(P, &tok, tok)) return NULL;
    while (tok->kind == TK_NEWLINE) tok++;
    if (!is_punct(tok, "}")) {
      error_tok(P, kw, "'return' must be the last statement of fn '%s'", fn->id);
      return NULL;
    }
    *ret = e;
    *rest = tok;
    *failed = false;
    return NULL;
  }
  if (tok->kind == TK_IDENT && !is_reserved(tok)) {
    FeStmt *s = is_punct(tok + 1, ",") ? multi_stmt(P, &tok, tok) : assign_stmt(P, &tok, tok);
    if (!s || !stmt_end(P, rest, tok)) return NULL;
    *failed = false;
    return s;
  }
  if (is_kw(tok, "model")) {
    error_tok(P, tok, "a model cannot be nested in another");
    return NULL;
  }
  expected(P, tok, "a statement");
  return NULL;
}

/* stmts = (stmt | NEWLINE)*, up to a '}' or the end of the file */
static FeStmt *stmts(Parser *P, Token **rest, Token *tok, FeNode **ret, const FeFn *fn) {
  FeStmt head = {0}, *cur = &head;
  while (!is_punct(tok, "}") && tok->kind != TK_EOF) {
    if (tok->kind == TK_NEWLINE) {
      tok++;
      continue;
    }
    if (P->failed && diag_too_many(P->d)) {
      while (tok->kind != TK_EOF) tok++;
      break;
    }
    bool failed;
    FeStmt *s = stmt(P, &tok, tok, ret, fn, &failed);
    if (failed) {
      tok = sync(tok);
      continue;
    }
    if (s) cur = cur->next = s;
  }
  *rest = tok;
  return head.next;
}

/* model = "model" IDENT "{" stmts "}" */
static bool model(Parser *P, Token **rest, Token *tok) {
  Token *kw = tok;
  if (!name(P, &tok, tok + 1, "model")) return false;
  if (P->prog->name) {
    error_tok(P, kw, "a file holds one model ('%s' was declared at line %d)", P->prog->id, P->prog->name->line);
    return false;
  }
  P->prog->name = kw + 1;
  P->prog->id = tok_str(P, kw + 1);
  bool ok;
  P->prog->body = block(P, &tok, tok, NULL, NULL, &ok);
  *rest = tok;
  return ok;
}

/* program = (model | fn | NEWLINE)* EOF */
FeProgram *parse_program(const SrcFile *src, Token *toks, Arena *a, Diag *d) {
  Parser P;
  memset(&P, 0, sizeof P);
  P.src = src;
  P.d = d;
  P.a = a;
  P.prog = ARENA_NEW(a, FeProgram);
  P.fn_tail = &P.prog->fns;
  Token *tok = toks;
  while (tok->kind != TK_EOF) {
    if (tok->kind == TK_NEWLINE) {
      tok++;
      continue;
    }
    if (P.failed && diag_too_many(d)) break;
    bool ok;
    if (is_kw(tok, "model")) {
      ok = model(&P, &tok, tok) && stmt_end(&P, &tok, tok);
    } else if (is_kw(tok, "fn")) {
      bool failed;
      stmt(&P, &tok, tok, NULL, NULL, &failed);
      ok = !failed;
    } else {
      expected(&P, tok, "'model' or 'fn'");
      ok = false;
    }
    if (!ok) {
      tok = sync(tok);
      if (is_punct(tok, "}")) tok++;
    }
  }
  if (!P.failed && !P.prog->name) {
    error_tok(&P, tok, "no model in this file (expected 'model NAME { ... }')");
  }
  P.prog->nfns = P.nfns;
  return P.failed ? NULL : P.prog;
}
