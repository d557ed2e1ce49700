/* frontend.h - the .gdl model language: lexer, parser, lowering to IR.
 * fe_model_compile reads a model and returns its forward IR plus the
 * model's declarations (dims, inputs, params with their init). */
#ifndef GRADC_FRONTEND_H
#define GRADC_FRONTEND_H

#include "../ir/ir.h"

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
  const char **losses;  /* loss names in declaration order */
  int nlosses;
  IrFunc *func;         /* forward IR: args = inputs and params in declaration
                           order; one `loss` output op per loss statement */
} FeModel;

typedef struct FeOptions {
  const char **def_names; /* -D NAME=VALUE overrides */
  const int64_t *def_values;
  int ndefs;
  int gas; /* K >= 1: shapes use the micro-batch size B/K */
  int dp;  /* data-parallel ranks >= 1 */
} FeOptions;

/* Parse, check and lower a model.  Errors (all of them, up to d's limit)
 * go to d; returns NULL if there was any. */
FeModel *fe_model_compile(const SrcFile *src, const FeOptions *opt, Diag *d);
void fe_model_free(FeModel *m);

/* lexer.c: exposed for tests. */
typedef enum {
  TK_EOF,
  TK_NEWLINE, /* statement end: newline or ';' (newlines inside () and [] are skipped) */
  TK_IDENT,
  TK_INT,
  TK_FLOAT,
  TK_STRING,
  TK_PUNCT, /* operators and punctuation: + - * / @ ** ( ) [ ] { } , : = . .. ... */
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

#endif
