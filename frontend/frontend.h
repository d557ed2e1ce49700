/* frontend.h - the .gdl model language: lexer, parser, lowering to IR.
 * fe_model_compile reads a model and returns its forward IR plus the
 * model's declarations (dims, inputs, params with their init). */
#ifndef GRADC_FRONTEND_H
#define GRADC_FRONTEND_H

#include "ir/ir.h"

typedef enum { FE_INIT_ZEROS, FE_INIT_ONES, FE_INIT_NORMAL, FE_INIT_UNIFORM } FeInitKind;

typedef struct FeParam {
  const char *name;
  IrType type;
  FeInitKind init;
  double a, b;    /* normal(mean=a, std=b), uniform(lo=a, hi=b) */
  int split_axis; /* split(N) annotation, -1 if none */
  IrLoc loc;
  IrValue *value; /* the function argument */
} FeParam;

typedef struct FeInput {
  const char *name;
  IrType type;    /* micro-batch shape (the batch dim is B/K) */
  bool batched;   /* first axis is the batch dim: split into micro-batches */
  IrLoc loc;
  IrValue *value;
} FeInput;

typedef struct FeDim {
  const char *name;
  int64_t value; /* for the batch dim: the window size B */
  bool is_batch;
  IrLoc loc;
} FeDim;

typedef struct FeModel {
  Arena arena;
  const char *name;
  SrcFile src;          /* the text (owned by the caller of fe_model_compile) */
  FeDim *dims;
  int ndims;
  const char *batch;    /* name of the batch dim, NULL if none */
  int64_t batch_window; /* B */
  int64_t batch_micro;  /* B / (K * dp) */
  FeParam *params;
  int nparams;
  FeInput *inputs;
  int ninputs;
  FeParam *buffers;     /* `buffer` declarations (split_axis -1), in declaration order */
  int nbuffers;
  const char **losses;  /* loss names in declaration order */
  int nlosses;
  const char **outputs; /* `output` names in statement order */
  int noutputs;
  const char **updates; /* buffers with an `update` (training only), in statement order */
  int nupdates;
  IrFunc *func;         /* forward IR: args = inputs, params and buffers in
                           declaration order; one `loss` output op per loss
                           statement, one `output` / `update` op per output /
                           update statement */
} FeModel;

typedef struct FeOptions {
  const char **def_names; /* -D NAME=VALUE overrides */
  const int64_t *def_values;
  int ndefs;
  int gas; /* K >= 1: shapes use the micro-batch size B/K */
  int dp;  /* data-parallel ranks >= 1 */
  bool no_training; /* the model's flag `training` is false (forward-only commands) and
                       `update` statements are checked but not emitted; default: training */
  bool no_outputs;  /* `output` statements are checked and bind their name, but emit no `output` op
                       (`gradc eval` runs a whole dataset as one window and reads only losses) */
} FeOptions;

/* Parse, check and lower a model.  Errors (all of them, up to d's limit)
 * go to d; returns NULL if there was any. */
FeModel *fe_model_compile(const SrcFile *src, const FeOptions *opt, Diag *d);
void fe_model_free(FeModel *m);

/* lower.c: the built-in functions' table, for `gradc help functions`:
 * row i's name and its signature ("sum(x, axis=all, keepdim=false)"). */
int fe_builtin_count(void);
const char *fe_builtin_name(int i);
const char *fe_builtin_signature(int i);

/* lexer.c: exposed for tests. */
typedef enum {
  TK_EOF,
  TK_NEWLINE, /* statement end: newline or ';' (newlines inside () and [] are skipped) */
  TK_IDENT,
  TK_INT,
  TK_FLOAT,
  TK_STRING,
  TK_PUNCT, /* operators and punctuation: + - * / @ ** < <= > >= == != ( ) [ ] { } , : = . .. ... */
} TokKind;

typedef struct Token {
  TokKind kind;
  const char *text; /* points into the source */
  int len;
  int line, col;
  int64_t ival;
  double fval;
} Token;

/* Tokenize the whole file; errors go to d.  Returns the count; *out is
 * allocated in a (terminated by TK_EOF). */
int lex_tokenize(const SrcFile *src, Arena *a, Diag *d, Token **out);

/* ------------------------------------------------------------------ */
/* parser.c: the syntax tree.  Internal to the frontend (lower.c reads  */
/* it); nodes and statements live in the arena given to parse_program. */
/* ------------------------------------------------------------------ */
typedef enum {
  FE_ND_INT,      /* ival */
  FE_ND_FLOAT,    /* fval */
  FE_ND_STR,      /* str */
  FE_ND_BOOL,     /* ival: true / false */
  FE_ND_NAME,     /* name */
  FE_ND_LIST,     /* [items] */
  FE_ND_ADD,      /* lhs + rhs */
  FE_ND_SUB,      /* lhs - rhs */
  FE_ND_MUL,      /* lhs * rhs */
  FE_ND_DIV,      /* lhs / rhs */
  FE_ND_MATMUL,   /* lhs @ rhs */
  FE_ND_NEG,      /* -lhs */
  FE_ND_POW,      /* lhs ** rhs */
  FE_ND_CALL,     /* name(items), kw[i] names keyword arguments */
  FE_ND_INDEX,    /* lhs[items] */
  FE_ND_SLICE,    /* start:stop:step inside an index, parts may be NULL */
  FE_ND_ELLIPSIS, /* ... inside an index */
  /* Language v2: comparisons and conditions. */
  FE_ND_EQ,       /* lhs == rhs */
  FE_ND_NE,       /* lhs != rhs */
  FE_ND_LT,       /* lhs < rhs */
  FE_ND_LE,       /* lhs <= rhs */
  FE_ND_GT,       /* lhs > rhs */
  FE_ND_GE,       /* lhs >= rhs */
  FE_ND_AND,      /* lhs and rhs */
  FE_ND_OR,       /* lhs or rhs */
  FE_ND_NOT,      /* not lhs */
  FE_ND_TUPLE,    /* items: the several results of `return a, b` */
} FeNodeKind;

typedef struct FeNode FeNode;
struct FeNode {
  FeNodeKind kind;
  Token *tok;       /* what diagnostics point at: operator, call name, literal, '[' */
  Token *begin;     /* first token of the whole expression */
  const char *name; /* NAME, CALL (NUL-terminated) */
  int64_t ival;
  double fval;
  const char *str;
  FeNode *lhs, *rhs;
  FeNode *start, *stop, *step;
  FeNode **items;
  Token **kw; /* CALL: keyword token of each argument, NULL when positional */
  int nitems;
  int depth; /* height of the tree, bounded by the parser */
};

typedef enum {
  FE_ST_DIM,
  FE_ST_INPUT,
  FE_ST_PARAM,
  FE_ST_ASSIGN,
  FE_ST_LOSS,
  FE_ST_FOR,
  /* Language v2 statements. */
  FE_ST_BUFFER, /* buffer NAME : TYPE [init INIT] */
  FE_ST_UPDATE, /* update NAME = EXPR */
  FE_ST_OUTPUT, /* output NAME = EXPR */
  FE_ST_IF,     /* if COND { body } [else { orelse }] */
  FE_ST_MULTI,  /* NAME, NAME, ... = EXPR (a call with several results) */
} FeStmtKind;

typedef struct FeTypeSpec {
  Token *tok; /* the dtype name */
  IrDType dtype;
  FeNode **shape; /* NULL and rank 0 for a scalar */
  int rank;
} FeTypeSpec;

typedef struct FeStmt FeStmt;
struct FeStmt {
  FeStmtKind kind;
  FeStmt *next;
  Token *tok;     /* the keyword; for an assignment its name */
  Token *name;    /* declared or assigned name, loop variable */
  const char *id; /* name as a C string */
  bool is_batch;  /* DIM declared with `batch` */
  FeNode *expr;   /* DIM, ASSIGN, LOSS, UPDATE, OUTPUT, MULTI; IF: the condition */
  FeTypeSpec type;         /* INPUT, PARAM, BUFFER */
  FeInitKind init;         /* PARAM, BUFFER */
  Token *init_tok;         /* PARAM, BUFFER; NULL: default zeros */
  FeNode *init_args[2];
  FeNode *split;           /* PARAM split(N), or NULL */
  Token *split_tok;
  FeNode *from, *to;       /* FOR */
  FeStmt *body;            /* FOR, IF (the taken-when-true branch) */
  FeStmt *orelse;          /* IF: the else branch, or NULL */
  Token **names;           /* MULTI: the bound names, in order */
  const char **ids;
  int nnames;
};

typedef struct FeFn FeFn;
struct FeFn {
  Token *name;
  const char *id;
  Token **params;
  const char **param_ids;
  int nparams;
  FeStmt *body;
  FeNode *ret;
  FeFn *next;
};

typedef struct FeProgram {
  Token *name; /* the model's name */
  const char *id;
  FeStmt *body;
  FeFn *fns; /* every fn of the file, in order */
  int nfns;
} FeProgram;

/* lexer.c: lex_tokenize that also tells whether any error was reported. */
int lex_tokenize_checked(const SrcFile *src, Arena *a, Diag *d, Token **out, bool *failed);

/* Parse a token list from lex_tokenize.  Errors go to d; returns NULL if
 * there was any.  Everything is allocated in a. */
FeProgram *parse_program(const SrcFile *src, Token *toks, Arena *a, Diag *d);

#endif
