/* lower.c - lowers a parsed .gdl model to the forward IR (fe_model_compile).
 *
 * The model body is executed statement by statement, like an interpreter
 * whose values are compile-time numbers, lists, strings, bools or IR values:
 *   - integer literals, dims and loop variables are exact int64 numbers;
 *     arithmetic among numbers folds at compile time (exactly for integers);
 *     a number meeting a tensor becomes a `const` scalar of the tensor's
 *     float type (f32 when there is none);
 *   - `for` loops are unrolled and `fn` calls inlined; a fn body sees its
 *     arguments and the model's declarations (dims, inputs, params);
 *   - every op goes through ir_build, which checks shapes; its message is
 *     reported at the op's source location (operator token, call name, '[').
 * Errors never stop the walk: the value becomes "poison", which silently
 * poisons everything computed from it, so one mistake gives one message.
 * An error is reported once per source location and chain of inlined calls
 * (so once for a for body, not once per iteration), followed by a note per
 * call site when it lies inside an inlined fn.
 *
 * Choices where DESIGN.md is silent:
 *   - a math built-in applied to a number folds (rsqrt(C / H) is a number,
 *     which then takes the type of the tensor it meets);
 *   - integer division that is not exact gives a float in ordinary
 *     expressions (Python's 7 / 2), and is an error in dims and shapes;
 *   - slices clamp their bounds as in NumPy, steps must be positive, and an
 *     integer index out of range is an error;
 *   - the loop variable exists only inside its loop; variables assigned in
 *     a loop body stay bound after it (Python);
 *   - dims cannot be reassigned; inputs and params can be rebound;
 *   - a model without a `loss` statement is an error;
 *   - without a batch dim, FeModel.batch is NULL and batch_window and
 *     batch_micro are 0;
 *   - language v2 (docs/DECISIONS.md): `if` lowers only its taken branch,
 *     whose names stay bound after it; conditions are compile-time bools;
 *     `update` and `output` statements become `update`/`output` ops (no
 *     `update` when FeOptions.no_training, no `output` when no_outputs); a
 *     statement binding several names takes a tuple of as many results.
 *
 * Bounds that keep any input from exhausting time or memory: MAX_* below,
 * plus the parser's nesting limits. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "frontend.h"

enum {
  MAX_INLINE = 64,     /* nested fn calls */
  MAX_OPS = 1000000,   /* ops in the function after unrolling and inlining */
  MAX_TRIP = 1000000,  /* iterations of one for loop */
  MAX_WORK = 5000000,  /* statements and expression nodes evaluated */
};
#define MAX_DIM ((int64_t)INT32_MAX)
#define MAX_NUMEL ((int64_t)1 << 48)

/* ---- values ---- */

typedef enum { V_NONE, V_POISON, V_INT, V_FLOAT, V_BOOL, V_STR, V_LIST, V_TENSOR, V_DTYPE, V_TUPLE } ValKind;

typedef struct Val Val;
struct Val {
  ValKind kind; /* V_NONE: unbound (a slot whose name went out of scope) */
  int64_t i;    /* INT, BOOL; DTYPE: the IrDType (a dtype name: `cast(x, f32)`) */
  double f;     /* FLOAT */
  const char *s;
  IrValue *t;
  Val *items; /* LIST; TUPLE: the several results of a call (`v, i = topk(..)`) */
  int n;
};

static Val vpoison(void) { return (Val){.kind = V_POISON}; }
static Val vint(int64_t i) { return (Val){.kind = V_INT, .i = i}; }
static Val vfloat(double f) { return (Val){.kind = V_FLOAT, .f = f}; }
static Val vtensor(IrValue *t) { return (Val){.kind = V_TENSOR, .t = t}; }
static Val vbool(bool b) { return (Val){.kind = V_BOOL, .i = b}; }
static bool is_num(Val v) { return v.kind == V_INT || v.kind == V_FLOAT; }
static double num(Val v) { return v.kind == V_INT ? (double)v.i : v.f; }

/* What a value is, for messages: "a list", "f32[4,5]". */
static const char *kind_str(Val v, char *buf, size_t n) {
  switch (v.kind) {
  case V_NONE:
  case V_POISON: return "an invalid value";
  case V_INT: return "an integer";
  case V_FLOAT: return "a number";
  case V_BOOL: return "a bool";
  case V_STR: return "a string";
  case V_LIST: return "a list";
  case V_TENSOR: return ir_type_str(&v.t->type, buf, n);
  case V_DTYPE: return "a dtype";
  case V_TUPLE: snprintf(buf, n, "%d results", v.n); return buf;
  }
  return "?";
}

/* ---- the lowering context ---- */

typedef enum {
  EV_VALUE, /* ordinary expressions: the batch dim is the window size */
  EV_DIM,   /* dim values: integer division must be exact */
  EV_SHAPE, /* tensor shapes and reshape targets: exact, batch dim = micro-batch */
} EvalMode;

typedef struct Decl {
  const char *what; /* "dim", "batch dim", "input", "param" */
  const Token *tok;
  bool is_dim, is_batch;
  bool defining; /* dims: its size expression is being evaluated */
  int64_t value; /* dims */
  Val v;         /* dims: V_INT, inputs/params: V_TENSOR; V_POISON after an error */
} Decl;

typedef struct Frame {
  const FeFn *fn;
  const Token *call;
} Frame;

typedef struct Lower {
  const SrcFile *src;
  const char *file; /* for IrLoc */
  Diag *d;
  const FeOptions *opt;
  Arena *tmp;
  FeModel *m;
  IrFunc *f;
  StrMap decls;      /* name -> Decl */
  StrMap fns;        /* name -> FeFn */
  StrMap reported;   /* error keys already reported */
  StrMap model_vars; /* name -> Val (the model's variables) */
  StrMap *vars;      /* the current scope: model_vars or a fn frame's */
  Frame frames[MAX_INLINE];
  int nframes;
  EvalMode mode;
  bool failed;  /* any error */
  bool stopped; /* give up: too many errors or too much work */
  long work;
  const char **losses;
  const Token **loss_toks;
  int nlosses, caplosses;
  const char **fn_names; /* the file's fns, for "did you mean" */
  int nfn_names;
  StrMap outputs; /* name -> the statement's name token (language v2) */
  StrMap updates; /* buffer name -> the update statement's name token */
  const char **output_order, **update_order;
  int noutputs, nupdates;
  const FeStmt *body; /* the model's statements (to name a dim declared later) */
} Lower;

static IrLoc loc_of(Lower *L, const Token *t) { return (IrLoc){L->file, t->line, t->col}; }

/* Report an error at t, once per location and chain of call sites. */
static void error_at(Lower *L, const Token *t, const char *fmt, ...) GRADC_PRINTF(3, 4);
static void error_at(Lower *L, const Token *t, const char *fmt, ...) {
  L->failed = true;
  if (L->stopped) return;
  StrBuf key;
  sb_init(&key);
  sb_printf(&key, "%d:%d", t->line, t->col);
  for (int i = 0; i < L->nframes; i++) sb_printf(&key, "|%d:%d", L->frames[i].call->line, L->frames[i].call->col);
  bool seen = strmap_get(&L->reported, sb_str(&key)) != NULL;
  if (!seen) strmap_put(&L->reported, arena_strdup(L->tmp, sb_str(&key)), (void *)1);
  sb_free(&key);
  if (seen) return;
  int before = L->d->nerrors;
  va_list ap;
  va_start(ap, fmt);
  diag_vat(L->d, DIAG_ERROR, L->src, t->line, t->col, fmt, ap);
  va_end(ap);
  if (L->d->nerrors > before)
    for (int i = L->nframes - 1; i >= 0; i--)
      diag_at(L->d, DIAG_NOTE, L->src, L->frames[i].call->line, L->frames[i].call->col, "in call to '%s' here",
              L->frames[i].fn->id);
  if (diag_too_many(L->d)) L->stopped = true;
}

/* Count work; false (and stop) once the model is unreasonably large. */
static bool tick(Lower *L, const Token *t) {
  if (L->stopped) return false;
  if (++L->work <= MAX_WORK) return true;
  error_at(L, t, "model is too large after unrolling loops and inlining fns (more than %d steps)", MAX_WORK);
  L->stopped = true;
  return false;
}

/* Build an op at t; on a type or shape error report ir_build's message. */
static Val build(Lower *L, IrOpcode opc, IrValue *const *args, int nargs, const IrAttr *attrs, int nattrs,
                 const IrType *hint, const Token *t) {
  if (L->stopped) return vpoison();
  char err[512];
  err[0] = '\0';
  IrOp *op = ir_build(L->f, opc, args, nargs, attrs, nattrs, hint, loc_of(L, t), err, sizeof err);
  if (!op) {
    error_at(L, t, "%s", err[0] ? err : "invalid operation");
    return vpoison();
  }
  if (L->f->nops > MAX_OPS) {
    error_at(L, t, "model is too large (more than %d operations after unrolling and inlining)", MAX_OPS);
    L->stopped = true;
    return vpoison();
  }
  if (!op->result) return (Val){.kind = V_NONE};
  int64_t n = 1;
  const IrShape *s = &op->result->type.shape;
  for (int i = 0; i < s->rank; i++) {
    if (s->dim[i] < 0 || (s->dim[i] > 0 && n > MAX_NUMEL / s->dim[i])) {
      char buf[IR_TYPE_STR_MAX];
      error_at(L, t, "result %s is too large", ir_type_str(&op->result->type, buf, sizeof buf));
      return vpoison();
    }
    n *= s->dim[i];
  }
  return vtensor(op->result);
}

/* A number as a scalar `const` of type dt, located at t. */
static Val materialize(Lower *L, Val v, IrDType dt, const Token *t) {
  IrAttr a = ir_attr_float("value", num(v));
  IrType ty = {dt, ir_shape_scalar()};
  return build(L, IR_OP_CONST, NULL, 0, &a, 1, &ty, t);
}

/* The type a number takes next to tensor `other`. */
static IrDType const_dtype(Val other, Val number) {
  IrDType dt = other.t->type.dtype;
  if (ir_dtype_is_float(dt)) return dt;
  if (dt == IR_DT_I32 && number.kind == V_INT) return IR_DT_I32;
  return IR_DT_F32;
}

static void name_value(Lower *L, Val v, const char *id) {
  if (v.kind == V_TENSOR && !v.t->name) v.t->name = arena_strdup(&L->f->arena, id);
}

/* ---- scopes ---- */

static Val *find_var(StrMap *m, const char *id) {
  Val *v = strmap_get(m, id);
  return v && v->kind != V_NONE ? v : NULL;
}

static void bind(Lower *L, StrMap *scope, const char *id, Val v) {
  Val *slot = strmap_get(scope, id);
  if (!slot) {
    slot = ARENA_NEW(L->tmp, Val);
    strmap_put(scope, id, slot);
  }
  *slot = v;
}

static Val eval(Lower *L, const FeNode *n);

/* ---- arithmetic ---- */

static int64_t ipow(int64_t b, int64_t e, bool *ovf) {
  int64_t r = 1;
  while (e > 0 && !*ovf) {
    if (e & 1) *ovf |= __builtin_mul_overflow(r, b, &r);
    e >>= 1;
    if (e) *ovf |= __builtin_mul_overflow(b, b, &b);
  }
  return r;
}

/* The binary operations that fold on numbers (all but matmul). */
typedef enum { AR_ADD, AR_SUB, AR_MUL, AR_DIV, AR_MAXIMUM, AR_MINIMUM, AR_MATMUL } Arith;

static IrOpcode arith_opcode(Arith k) {
  switch (k) {
  case AR_ADD: return IR_OP_ADD;
  case AR_SUB: return IR_OP_SUB;
  case AR_MUL: return IR_OP_MUL;
  case AR_DIV: return IR_OP_DIV;
  case AR_MAXIMUM: return IR_OP_MAXIMUM;
  case AR_MINIMUM: return IR_OP_MINIMUM;
  case AR_MATMUL: return IR_OP_MATMUL;
  }
  return IR_OP_ADD;
}

/* Fold a binary op between two numbers. */
static Val fold(Lower *L, Arith k, const Token *t, Val a, Val b) {
  if (a.kind == V_INT && b.kind == V_INT) {
    int64_t r = 0;
    bool ovf = false;
    switch (k) {
    case AR_ADD: ovf = __builtin_add_overflow(a.i, b.i, &r); break;
    case AR_SUB: ovf = __builtin_sub_overflow(a.i, b.i, &r); break;
    case AR_MUL: ovf = __builtin_mul_overflow(a.i, b.i, &r); break;
    case AR_MAXIMUM: r = a.i > b.i ? a.i : b.i; break;
    case AR_MINIMUM: r = a.i < b.i ? a.i : b.i; break;
    case AR_MATMUL: GRADC_ASSERT(!"fold: matmul of numbers"); break;
    case AR_DIV:
      if (b.i == 0) {
        error_at(L, t, "division by zero");
        return vpoison();
      }
      if (a.i == INT64_MIN && b.i == -1) {
        ovf = true;
        break;
      }
      if (a.i % b.i == 0) {
        r = a.i / b.i;
        break;
      }
      if (L->mode != EV_VALUE) {
        error_at(L, t, "%lld / %lld is not an exact division (sizes must divide exactly)", (long long)a.i,
                 (long long)b.i);
        return vpoison();
      }
      return vfloat((double)a.i / (double)b.i);
    }
    if (ovf) {
      error_at(L, t, "integer overflow");
      return vpoison();
    }
    return vint(r);
  }
  /* Floats: as the interpreter computes (ir/scalar.c). */
  double x = num(a), y = num(b);
  GRADC_ASSERT(k != AR_MATMUL);
  if (k == AR_DIV && y == 0) {
    error_at(L, t, "division by zero");
    return vpoison();
  }
  return vfloat(ir_scalar_binary(arith_opcode(k), x, y));
}

/* Check that v can take part in arithmetic. */
static bool operand_ok(Lower *L, Val v, const FeNode *vn, const char *op) {
  if (is_num(v) || v.kind == V_TENSOR) return true;
  char buf[IR_TYPE_STR_MAX];
  error_at(L, vn->begin, "%s cannot be an operand of '%s'", kind_str(v, buf, sizeof buf), op);
  return false;
}

/* a OP b for + - * / @ maximum minimum: fold numbers, else build the op
 * with numbers turned into scalar consts of the other operand's type. */
static Val arith(Lower *L, Arith k, const char *opname, const Token *t, Val a, const FeNode *an, Val b,
                 const FeNode *bn) {
  if (a.kind == V_POISON || b.kind == V_POISON) return vpoison();
  if (!operand_ok(L, a, an, opname) || !operand_ok(L, b, bn, opname)) return vpoison();
  if (k == AR_MATMUL && (a.kind != V_TENSOR || b.kind != V_TENSOR)) {
    char b1[IR_TYPE_STR_MAX], b2[IR_TYPE_STR_MAX];
    error_at(L, t, "'%s' needs two tensors, got %s and %s", opname, kind_str(a, b1, sizeof b1),
             kind_str(b, b2, sizeof b2));
    return vpoison();
  }
  if (is_num(a) && is_num(b)) return fold(L, k, t, a, b);
  if (is_num(a)) a = materialize(L, a, const_dtype(b, a), an->tok);
  if (is_num(b)) b = materialize(L, b, const_dtype(a, b), bn->tok);
  if (a.kind == V_POISON || b.kind == V_POISON) return vpoison();
  IrValue *args[2] = {a.t, b.t};
  return build(L, arith_opcode(k), args, 2, NULL, 0, NULL, t);
}

/* ---- names ---- */

static const struct Builtin *find_builtin(const char *name);

static Val lookup(Lower *L, const FeNode *n) {
  /* `training` is a keyword: true for run, train and bench (FeOptions.no_training). */
  if (strcmp(n->name, "training") == 0) return vbool(!L->opt->no_training);
  Val *v = find_var(L->vars, n->name);
  if (v) return *v;
  Decl *dc = strmap_get(&L->decls, n->name);
  if (dc) {
    if (dc->defining) { /* dim D = D * 2: its size is not known yet */
      error_at(L, n->tok, "'%s' is used in its own size (a %s's size may use only the dims declared before it)",
               n->name, dc->what);
      return vpoison();
    }
    if (dc->is_dim && dc->v.kind == V_INT)
      return vint(dc->is_batch && L->mode == EV_SHAPE ? L->m->batch_micro : dc->value);
    return dc->v;
  }
  if (L->nframes > 0 && find_var(&L->model_vars, n->name)) {
    error_at(L, n->tok, "'%s' is not visible inside fn '%s' (a fn body sees its arguments and the model's dims, "
             "inputs and params)", n->name, L->frames[L->nframes - 1].fn->id);
  } else if (strmap_get(&L->fns, n->name) || find_builtin(n->name)) {
    error_at(L, n->tok, "'%s' is a function; call it as %s(...)", n->name, n->name);
  } else if (ir_dtype_parse(n->name, strlen(n->name), &(IrDType){IR_DT_F32})) {
    IrDType dt;
    ir_dtype_parse(n->name, strlen(n->name), &dt);
    return (Val){.kind = V_DTYPE, .i = dt}; /* a dtype as a value: cast(x, f32) */
  } else {
    /* dim A = B; dim B = A: a cycle is a use before the declaration. */
    const FeStmt *later = NULL;
    for (const FeStmt *s = L->body; s && !later; s = s->next)
      if (s->kind == FE_ST_DIM && strcmp(s->id, n->name) == 0) later = s;
    if (later && L->mode == EV_DIM)
      error_at(L, n->tok, "'%s' is declared after this size (line %d); a size may use only the dims declared before it",
               n->name, later->name->line);
    else
      error_at(L, n->tok, "unknown name '%s'", n->name);
  }
  return vpoison();
}

/* ---- built-in functions ---- */

typedef struct Builtin Builtin;
/* a[i]: the evaluated argument for parameter i; an[i]: its node, NULL if absent.
 *
 * A built-in returns one Val.  One with several results (`v, i = topk(x,
 * k)`) returns them as one tuple, `return vtuple(L, 2, (Val[]){values,
 * indices});`, each a tensor it built; the statement `a, b = ...` binds
 * them in order and reports a count mismatch there, and a tuple anywhere
 * else (an operand, an argument, `x = topk(..)`) is an error.  Nothing else
 * is needed: the table row is as for any built-in. */
typedef Val (*BuiltinFn)(Lower *L, const FeNode *call, const Builtin *b, Val *a, const FeNode **an);

/* Several results (see BuiltinFn), copied into the lowering's arena. */
static Val vtuple(Lower *L, int n, const Val *vals) {
  Val v = {.kind = V_TUPLE, .n = n};
  v.items = ARENA_ARRAY(L->tmp, Val, n);
  for (int i = 0; i < n; i++) {
    if (vals[i].kind == V_POISON) return vpoison();
    v.items[i] = vals[i];
  }
  return v;
}

#define MAX_PARAMS 8
struct Builtin {
  const char *name;
  BuiltinFn fn;
  IrOpcode op;
  int nreq;                      /* required arguments */
  const char *params[MAX_PARAMS]; /* argument names, in positional order */
  int shape_arg;                 /* argument evaluated as a shape (batch = micro-batch), or -1 */
  const char *sig;               /* the signature `gradc help functions` lists: name(args, kw=default) */
};

static bool arg_tensor(Lower *L, const FeNode *call, const Builtin *b, int i, Val *a, const FeNode **an) {
  if (a[i].kind == V_TENSOR) return true;
  if (is_num(a[i])) {
    a[i] = materialize(L, a[i], IR_DT_F32, an[i]->tok);
    return a[i].kind == V_TENSOR;
  }
  char buf[IR_TYPE_STR_MAX];
  error_at(L, an[i]->begin, "argument '%s' of '%s' must be a tensor, got %s", b->params[i], call->name,
           kind_str(a[i], buf, sizeof buf));
  return false;
}

static bool arg_int(Lower *L, const FeNode *call, const Builtin *b, int i, Val *a, const FeNode **an,
                    int64_t *out) {
  if (a[i].kind == V_INT) {
    *out = a[i].i;
    return true;
  }
  char buf[IR_TYPE_STR_MAX];
  error_at(L, an[i]->begin, "argument '%s' of '%s' must be a constant integer, got %s", b->params[i], call->name,
           kind_str(a[i], buf, sizeof buf));
  return false;
}

static bool arg_num(Lower *L, const FeNode *call, const Builtin *b, int i, Val *a, const FeNode **an,
                    double *out) {
  if (is_num(a[i])) {
    *out = num(a[i]);
    return true;
  }
  char buf[IR_TYPE_STR_MAX];
  error_at(L, an[i]->begin, "argument '%s' of '%s' must be a constant number, got %s", b->params[i], call->name,
           kind_str(a[i], buf, sizeof buf));
  return false;
}

static bool arg_bool(Lower *L, const FeNode *call, const Builtin *b, int i, Val *a, const FeNode **an, bool *out) {
  if (a[i].kind == V_BOOL) {
    *out = a[i].i != 0;
    return true;
  }
  char buf[IR_TYPE_STR_MAX];
  error_at(L, an[i]->begin, "argument '%s' of '%s' must be true or false, got %s", b->params[i], call->name,
           kind_str(a[i], buf, sizeof buf));
  return false;
}

/* Normalise a possibly negative axis of a tensor of type t. */
static bool axis_of(Lower *L, int64_t ax, const IrType *t, const Token *at, int64_t *out) {
  int r = t->shape.rank;
  if (ax < -r || ax >= r) {
    char buf[IR_TYPE_STR_MAX];
    error_at(L, at, "axis %lld is out of range for %s", (long long)ax, ir_type_str(t, buf, sizeof buf));
    return false;
  }
  *out = ax < 0 ? ax + r : ax;
  return true;
}

/* axis= int or list of ints, normalised, sorted, distinct; absent: all axes. */
static bool arg_axes(Lower *L, const FeNode *call, const Builtin *b, int i, Val *a, const FeNode **an,
                     const IrType *t, int64_t *axes, int *naxes) {
  int r = t->shape.rank;
  if (!an[i]) {
    for (int k = 0; k < r; k++) axes[k] = k;
    *naxes = r;
    return true;
  }
  const Val *items = &a[i];
  int n = 1;
  if (a[i].kind == V_LIST) {
    items = a[i].items;
    n = a[i].n;
  }
  if (n > r) {
    char buf[IR_TYPE_STR_MAX];
    error_at(L, an[i]->begin, "too many axes for %s", ir_type_str(t, buf, sizeof buf));
    return false;
  }
  for (int k = 0; k < n; k++) {
    if (items[k].kind != V_INT) {
      char buf[IR_TYPE_STR_MAX];
      error_at(L, an[i]->begin, "argument '%s' of '%s' must be a constant integer or a list of them, got %s%s",
               b->params[i], call->name, kind_str(items[k], buf, sizeof buf),
               strcmp(call->name, "max") == 0 && items[k].kind == V_TENSOR
                   ? " (for the elementwise maximum of two tensors use maximum(a, b))"
                   : "");
      return false;
    }
    if (!axis_of(L, items[k].i, t, an[i]->begin, &axes[k])) return false;
    for (int j = k; j > 0 && axes[j - 1] >= axes[j]; j--) {
      if (axes[j - 1] == axes[j]) {
        error_at(L, an[i]->begin, "axis %lld is repeated", (long long)axes[j]);
        return false;
      }
      int64_t tmp = axes[j - 1];
      axes[j - 1] = axes[j];
      axes[j] = tmp;
    }
  }
  *naxes = n;
  return true;
}

/* exp log sqrt rsqrt tanh sigmoid relu gelu silu abs sin cos log1p
 * softplus erf: a number folds (in
 * double with the interpreter's semantics, ir/scalar.c; rounded once when
 * it meets a tensor), a tensor gets the op. */
static Val bi_unary_math(Lower *L, const FeNode *call, const Builtin *b, Val *a, const FeNode **an) {
  if (is_num(a[0])) {
    if (a[0].kind == V_INT && b->op == IR_OP_RELU) return vint(a[0].i > 0 ? a[0].i : 0);
    if (a[0].kind == V_INT && b->op == IR_OP_ABS && a[0].i != INT64_MIN) return vint(a[0].i < 0 ? -a[0].i : a[0].i);
    return vfloat(ir_scalar_unary(b->op, num(a[0]), 0));
  }
  if (!arg_tensor(L, call, b, 0, a, an)) return vpoison();
  return build(L, b->op, &a[0].t, 1, NULL, 0, NULL, call->tok);
}

/* detach causal_mask */
static Val bi_unary(Lower *L, const FeNode *call, const Builtin *b, Val *a, const FeNode **an) {
  if (b->op == IR_OP_DETACH && is_num(a[0])) return a[0];
  if (!arg_tensor(L, call, b, 0, a, an)) return vpoison();
  return build(L, b->op, &a[0].t, 1, NULL, 0, NULL, call->tok);
}

/* maximum minimum matmul */
static Val bi_binary(Lower *L, const FeNode *call, const Builtin *b, Val *a, const FeNode **an) {
  Arith k = b->op == IR_OP_MAXIMUM ? AR_MAXIMUM : b->op == IR_OP_MINIMUM ? AR_MINIMUM : AR_MATMUL;
  return arith(L, k, call->name, call->tok, a[0], an[0], a[1], an[1]);
}

/* transpose(x, dim0, dim1) -> permute */
static Val bi_transpose(Lower *L, const FeNode *call, const Builtin *b, Val *a, const FeNode **an) {
  int64_t d0, d1;
  if (!arg_tensor(L, call, b, 0, a, an) || !arg_int(L, call, b, 1, a, an, &d0) ||
      !arg_int(L, call, b, 2, a, an, &d1))
    return vpoison();
  const IrType *t = &a[0].t->type;
  if (!axis_of(L, d0, t, an[1]->begin, &d0) || !axis_of(L, d1, t, an[2]->begin, &d1)) return vpoison();
  int64_t perm[IR_MAX_RANK];
  for (int i = 0; i < t->shape.rank; i++) perm[i] = i;
  perm[d0] = d1;
  perm[d1] = d0;
  IrAttr at = ir_attr_ints("perm", perm, t->shape.rank);
  return build(L, IR_OP_PERMUTE, &a[0].t, 1, &at, 1, NULL, call->tok);
}

/* permute(x, [axes]) */
static Val bi_permute(Lower *L, const FeNode *call, const Builtin *b, Val *a, const FeNode **an) {
  if (!arg_tensor(L, call, b, 0, a, an)) return vpoison();
  const IrType *t = &a[0].t->type;
  int r = t->shape.rank;
  char buf[IR_TYPE_STR_MAX];
  if (a[1].kind != V_LIST || a[1].n != r) {
    error_at(L, an[1]->begin, "argument 'dims' of 'permute' must be a list of %d axes for %s", r,
             ir_type_str(t, buf, sizeof buf));
    return vpoison();
  }
  int64_t perm[IR_MAX_RANK];
  bool seen[IR_MAX_RANK] = {false};
  for (int i = 0; i < r; i++) {
    if (a[1].items[i].kind != V_INT) {
      error_at(L, an[1]->begin, "argument 'dims' of 'permute' must be a list of constant integers");
      return vpoison();
    }
    if (!axis_of(L, a[1].items[i].i, t, an[1]->begin, &perm[i])) return vpoison();
    if (seen[perm[i]]) {
      error_at(L, an[1]->begin, "axis %lld is repeated in a permutation", (long long)perm[i]);
      return vpoison();
    }
    seen[perm[i]] = true;
  }
  IrAttr at = ir_attr_ints("perm", perm, r);
  return build(L, IR_OP_PERMUTE, &a[0].t, 1, &at, 1, NULL, call->tok);
}

static void shape_str(const int64_t *d, int n, char *buf, size_t len) {
  size_t k = (size_t)snprintf(buf, len, "[");
  for (int i = 0; i < n && k < len; i++) k += (size_t)snprintf(buf + k, len - k, "%s%lld", i ? "," : "", (long long)d[i]);
  if (k < len) snprintf(buf + k, len - k, "]");
}

/* reshape(x, [sizes]) with at most one -1 */
static Val bi_reshape(Lower *L, const FeNode *call, const Builtin *b, Val *a, const FeNode **an) {
  if (!arg_tensor(L, call, b, 0, a, an)) return vpoison();
  const IrType *t = &a[0].t->type;
  char b1[IR_TYPE_STR_MAX], b2[IR_TYPE_STR_MAX];
  if (a[1].kind != V_LIST) {
    error_at(L, an[1]->begin, "argument 'shape' of 'reshape' must be a list of sizes, got %s",
             kind_str(a[1], b1, sizeof b1));
    return vpoison();
  }
  int n = a[1].n;
  if (n > IR_MAX_RANK) {
    error_at(L, an[1]->begin, "a tensor has at most %d dimensions", IR_MAX_RANK);
    return vpoison();
  }
  int64_t dims[IR_MAX_RANK];
  int infer = -1;
  int64_t known = 1;
  for (int i = 0; i < n; i++) {
    Val v = a[1].items[i];
    if (v.kind != V_INT || v.i == 0 || v.i < -1 || v.i > MAX_DIM) {
      const FeNode *at = an[1]->kind == FE_ND_LIST ? an[1]->items[i] : an[1];
      if (v.kind == V_INT)
        error_at(L, at->begin, "a reshape size must be positive or -1, got %lld", (long long)v.i);
      else
        error_at(L, at->begin, "a reshape size must be a constant integer, got %s", kind_str(v, b1, sizeof b1));
      return vpoison();
    }
    dims[i] = v.i;
    if (v.i == -1) {
      if (infer >= 0) {
        const FeNode *at = an[1]->kind == FE_ND_LIST ? an[1]->items[i] : an[1];
        error_at(L, at->begin, "only one reshape size can be -1");
        return vpoison();
      }
      infer = i;
    } else {
      if (known > MAX_NUMEL / v.i) known = MAX_NUMEL + 1; /* no overflow; cannot match */
      else known *= v.i;
    }
  }
  int64_t numel = ir_numel(&t->shape);
  if (infer >= 0 && known > 0 && numel % known == 0 && numel / known > 0) dims[infer] = numel / known;
  else if (infer >= 0) known = -1;
  if (known < 0 || (infer < 0 && known != numel)) {
    shape_str(dims, n, b2, sizeof b2);
    error_at(L, call->tok, "cannot reshape %s (%lld elements) to %s", ir_type_str(t, b1, sizeof b1),
             (long long)numel, b2);
    return vpoison();
  }
  IrAttr at = ir_attr_ints("shape", dims, n);
  return build(L, IR_OP_RESHAPE, &a[0].t, 1, &at, 1, NULL, call->tok);
}

/* sum mean max logsumexp (x, axis, keepdim) */
static Val bi_reduce(Lower *L, const FeNode *call, const Builtin *b, Val *a, const FeNode **an) {
  if (!arg_tensor(L, call, b, 0, a, an)) return vpoison();
  int64_t axes[IR_MAX_RANK];
  int naxes;
  bool keepdim = false;
  if (!arg_axes(L, call, b, 1, a, an, &a[0].t->type, axes, &naxes)) return vpoison();
  if (an[2] && !arg_bool(L, call, b, 2, a, an, &keepdim)) return vpoison();
  IrAttr at[2] = {ir_attr_ints("axes", axes, naxes), ir_attr_bool("keepdim", keepdim)};
  return build(L, b->op, &a[0].t, 1, at, 2, NULL, call->tok);
}

/* softmax log_softmax (x, axis=-1) */
static Val bi_softmax(Lower *L, const FeNode *call, const Builtin *b, Val *a, const FeNode **an) {
  int64_t axis = -1;
  if (!arg_tensor(L, call, b, 0, a, an)) return vpoison();
  if (an[1] && !arg_int(L, call, b, 1, a, an, &axis)) return vpoison();
  if (!axis_of(L, axis, &a[0].t->type, an[1] ? an[1]->begin : call->tok, &axis)) return vpoison();
  IrAttr at = ir_attr_int("axis", axis);
  return build(L, b->op, &a[0].t, 1, &at, 1, NULL, call->tok);
}

/* layer_norm(x, weight, bias, eps=1e-5)  rms_norm(x, weight, eps=1e-6) */
static Val bi_norm(Lower *L, const FeNode *call, const Builtin *b, Val *a, const FeNode **an) {
  int nt = b->op == IR_OP_LAYER_NORM ? 3 : 2;
  double eps = b->op == IR_OP_LAYER_NORM ? 1e-5 : 1e-6;
  for (int i = 0; i < nt; i++)
    if (!arg_tensor(L, call, b, i, a, an)) return vpoison();
  if (an[nt] && !arg_num(L, call, b, nt, a, an, &eps)) return vpoison();
  if (!(eps >= 0)) {
    error_at(L, an[nt]->begin, "eps must not be negative");
    return vpoison();
  }
  IrValue *args[3] = {a[0].t, a[1].t, nt == 3 ? a[2].t : NULL};
  IrAttr at = ir_attr_float("eps", eps);
  return build(L, b->op, args, nt, &at, 1, NULL, call->tok);
}

/* embedding(idx, table) */
static Val bi_embedding(Lower *L, const FeNode *call, const Builtin *b, Val *a, const FeNode **an) {
  if (!arg_tensor(L, call, b, 0, a, an) || !arg_tensor(L, call, b, 1, a, an)) return vpoison();
  IrValue *args[2] = {a[0].t, a[1].t};
  return build(L, IR_OP_EMBEDDING, args, 2, NULL, 0, NULL, call->tok);
}

/* concat([a, b, ...], axis=0) */
static Val bi_concat(Lower *L, const FeNode *call, const Builtin *b, Val *a, const FeNode **an) {
  char buf[IR_TYPE_STR_MAX];
  if (a[0].kind != V_LIST || a[0].n == 0) {
    error_at(L, an[0]->begin, "argument 'tensors' of 'concat' must be a non-empty list of tensors, got %s",
             a[0].kind == V_LIST ? "an empty list" : kind_str(a[0], buf, sizeof buf));
    return vpoison();
  }
  int n = a[0].n;
  IrValue **args = ARENA_ARRAY(L->tmp, IrValue *, n);
  for (int i = 0; i < n; i++) {
    Val v = a[0].items[i];
    if (v.kind != V_TENSOR) {
      const FeNode *at = an[0]->kind == FE_ND_LIST ? an[0]->items[i] : an[0];
      error_at(L, at->begin, "element %d of the list given to 'concat' must be a tensor, got %s", i + 1,
               kind_str(v, buf, sizeof buf));
      return vpoison();
    }
    args[i] = v.t;
  }
  int64_t axis = 0;
  if (an[1] && !arg_int(L, call, b, 1, a, an, &axis)) return vpoison();
  if (!axis_of(L, axis, &args[0]->type, an[1] ? an[1]->begin : call->tok, &axis)) return vpoison();
  IrAttr at = ir_attr_int("axis", axis);
  return build(L, IR_OP_CONCAT, args, n, &at, 1, NULL, call->tok);
}

static bool arg_reduction(Lower *L, const FeNode *call, const Builtin *b, int i, Val *a, const FeNode **an,
                          const char **out) {
  *out = "mean";
  if (!an[i]) return true;
  if (a[i].kind == V_STR &&
      (strcmp(a[i].s, "mean") == 0 || strcmp(a[i].s, "sum") == 0 || strcmp(a[i].s, "none") == 0)) {
    *out = a[i].s;
    return true;
  }
  error_at(L, an[i]->begin, "argument 'reduction' of '%s' must be \"mean\", \"sum\" or \"none\"", call->name);
  (void)b;
  return false;
}

/* cross_entropy(logits, target, ignore_index=-100, reduction="mean") */
static Val bi_cross_entropy(Lower *L, const FeNode *call, const Builtin *b, Val *a, const FeNode **an) {
  int64_t ignore = -100;
  const char *red;
  if (!arg_tensor(L, call, b, 0, a, an) || !arg_tensor(L, call, b, 1, a, an)) return vpoison();
  if (an[2] && !arg_int(L, call, b, 2, a, an, &ignore)) return vpoison();
  if (!arg_reduction(L, call, b, 3, a, an, &red)) return vpoison();
  IrValue *args[2] = {a[0].t, a[1].t};
  IrAttr at[2] = {ir_attr_int("ignore_index", ignore), ir_attr_str("reduction", red)};
  return build(L, IR_OP_CROSS_ENTROPY, args, 2, at, 2, NULL, call->tok);
}

/* mse_loss(input, target, reduction="mean") */
static Val bi_mse_loss(Lower *L, const FeNode *call, const Builtin *b, Val *a, const FeNode **an) {
  const char *red;
  if (!arg_tensor(L, call, b, 0, a, an) || !arg_tensor(L, call, b, 1, a, an)) return vpoison();
  if (!arg_reduction(L, call, b, 2, a, an, &red)) return vpoison();
  IrValue *args[2] = {a[0].t, a[1].t};
  IrAttr at = ir_attr_str("reduction", red);
  return build(L, IR_OP_MSE_LOSS, args, 2, &at, 1, NULL, call->tok);
}

/* ---- language v2: where, cast ---- */

/* where(cond, a, b): IR select.  A compile-time condition (a comparison of
 * dims, `training`) picks a side; a bool tensor selects per element, numbers
 * taking the other side's type.  The gradient goes to the chosen side. */
static Val bi_where(Lower *L, const FeNode *call, const Builtin *b, Val *a, const FeNode **an) {
  if (a[0].kind == V_BOOL) return a[0].i ? a[1] : a[2];
  char buf[IR_TYPE_STR_MAX];
  if (a[0].kind != V_TENSOR || a[0].t->type.dtype != IR_DT_BOOL) {
    error_at(L, an[0]->begin, "argument 'cond' of 'where' must be a bool tensor (a comparison) or a condition "
             "known at compile time, got %s", kind_str(a[0], buf, sizeof buf));
    return vpoison();
  }
  for (int i = 1; i <= 2; i++)
    if (!is_num(a[i]) && a[i].kind != V_TENSOR) {
      error_at(L, an[i]->begin, "argument '%s' of 'where' must be a tensor or a number, got %s", b->params[i],
               kind_str(a[i], buf, sizeof buf));
      return vpoison();
    }
  if (is_num(a[1]) && is_num(a[2])) {
    a[1] = materialize(L, a[1], IR_DT_F32, an[1]->tok);
    a[2] = materialize(L, a[2], IR_DT_F32, an[2]->tok);
  } else if (is_num(a[1])) {
    a[1] = materialize(L, a[1], const_dtype(a[2], a[1]), an[1]->tok);
  } else if (is_num(a[2])) {
    a[2] = materialize(L, a[2], const_dtype(a[1], a[2]), an[2]->tok);
  }
  if (a[1].kind != V_TENSOR || a[2].kind != V_TENSOR) return vpoison();
  IrValue *args[3] = {a[0].t, a[1].t, a[2].t};
  return build(L, IR_OP_SELECT, args, 3, NULL, 0, NULL, call->tok);
}

/* cast(x, dtype): IR cast.  Between float types the gradient passes
 * through; to or from i32 (or bool) none flows.  A number folds. */
static Val bi_cast(Lower *L, const FeNode *call, const Builtin *b, Val *a, const FeNode **an) {
  char buf[IR_TYPE_STR_MAX];
  IrDType named;
  /* A dtype name may also arrive as the string the constructors' dtype= reads. */
  if (a[1].kind == V_STR && an[1]->kind == FE_ND_NAME && ir_dtype_parse(a[1].s, strlen(a[1].s), &named))
    a[1] = (Val){.kind = V_DTYPE, .i = named};
  if (a[1].kind != V_DTYPE) {
    error_at(L, an[1]->begin, "argument 'dtype' of 'cast' must be a dtype (f32, f64, bf16, f16, i32 or bool), got %s",
             kind_str(a[1], buf, sizeof buf));
    return vpoison();
  }
  IrDType dt = (IrDType)a[1].i;
  if (is_num(a[0])) {
    double x = ir_scalar_cast(num(a[0]), dt);
    if (dt == IR_DT_BOOL) return vbool(x != 0);
    if (dt == IR_DT_I32) return vint((int64_t)x);
    return vfloat(ir_round_dtype(x, dt));
  }
  if (a[0].kind == V_BOOL) a[0] = vint(a[0].i);
  if (!arg_tensor(L, call, b, 0, a, an)) return vpoison();
  if (a[0].t->type.dtype == dt) return a[0];
  IrType ty = {dt, a[0].t->type.shape};
  return build(L, IR_OP_CAST, &a[0].t, 1, NULL, 0, &ty, call->tok);
}

/* ------------------------------------------------------------------ */
/* Convolution, pooling, pad and batch_norm (language v2)              */
/* ------------------------------------------------------------------ */
/* conv lowers to patches (im2col) and the IR's matmul, batched over the
 * groups; the pools to patches and the IR's max or mean over the kernel
 * axes; pad to unslice (and slice for negative pads); batch_norm to its
 * expansion in mean and var (docs/DECISIONS.md). */

/* The op's result, or NULL after an error (reported at the call). */
static IrValue *emit_at(Lower *L, const FeNode *call, IrOpcode opc, IrValue *const *args, int nargs,
                        const IrAttr *attrs, int nattrs) {
  Val v = build(L, opc, args, nargs, attrs, nattrs, NULL, call->tok);
  return v.kind == V_TENSOR ? v.t : NULL;
}

static IrValue *reshape_at(Lower *L, const FeNode *call, IrValue *x, const int64_t *dims, int n) {
  IrAttr a = ir_attr_ints("shape", dims, n);
  return x ? emit_at(L, call, IR_OP_RESHAPE, &x, 1, &a, 1) : NULL;
}

/* An int or a list of d ints (stride=2, padding=[1, 0]), each >= lo;
 * absent: def (NULL: no default, the argument is required). */
static bool arg_ints_d(Lower *L, const FeNode *call, const Builtin *b, int i, Val *a, const FeNode **an, int d,
                       int64_t lo, const int64_t *def, int64_t *out) {
  if (!an[i]) {
    for (int k = 0; k < d; k++) out[k] = def ? def[k] : 0;
    return true;
  }
  char buf[IR_TYPE_STR_MAX];
  const Val *items = &a[i];
  int n = 1;
  if (a[i].kind == V_LIST) items = a[i].items, n = a[i].n;
  bool ok = a[i].kind == V_INT || (a[i].kind == V_LIST && n == d);
  for (int k = 0; ok && k < n; k++) ok = items[k].kind == V_INT;
  if (!ok) {
    error_at(L, an[i]->begin, "argument '%s' of '%s' must be a constant integer or a list of %d, got %s",
             b->params[i], call->name, d, kind_str(a[i], buf, sizeof buf));
    return false;
  }
  for (int k = 0; k < d; k++) {
    out[k] = items[n == 1 ? 0 : k].i;
    if (out[k] < lo || out[k] > MAX_DIM) {
      error_at(L, an[i]->begin, "argument '%s' of '%s' must be %s, got %lld", b->params[i], call->name,
               lo == 0 ? "non-negative" : "positive", (long long)out[k]);
      return false;
    }
  }
  return true;
}

/* ---- language v2: clamp, gelu(approximate=), constructors ---- */

/* gelu(x, approximate="tanh"|"none"): "tanh" is the gelu op, "none" the
 * erf form (gelu_erf). */
static Val bi_gelu(Lower *L, const FeNode *call, const Builtin *b, Val *a, const FeNode **an) {
  IrOpcode opc = IR_OP_GELU;
  if (an[1]) {
    if (a[1].kind == V_STR && strcmp(a[1].s, "none") == 0)
      opc = IR_OP_GELU_ERF;
    else if (!(a[1].kind == V_STR && strcmp(a[1].s, "tanh") == 0)) {
      error_at(L, an[1]->begin, "argument 'approximate' of 'gelu' must be \"tanh\" or \"none\"");
      return vpoison();
    }
  }
  if (is_num(a[0])) return vfloat(ir_scalar_unary(opc, num(a[0]), 0));
  if (!arg_tensor(L, call, b, 0, a, an)) return vpoison();
  return build(L, opc, &a[0].t, 1, NULL, 0, NULL, call->tok);
}

/* clamp(x, min=, max=): constant bounds, at least one of them (torch). */
static Val bi_clamp(Lower *L, const FeNode *call, const Builtin *b, Val *a, const FeNode **an) {
  IrAttr at[2];
  int na = 0;
  double lo = -INFINITY, hi = INFINITY;
  if (!an[1] && !an[2]) {
    error_at(L, call->tok, "'clamp' needs 'min', 'max' or both");
    return vpoison();
  }
  if (an[1]) {
    if (!arg_num(L, call, b, 1, a, an, &lo)) return vpoison();
    at[na++] = ir_attr_float("min", lo);
  }
  if (an[2]) {
    if (!arg_num(L, call, b, 2, a, an, &hi)) return vpoison();
    at[na++] = ir_attr_float("max", hi);
  }
  if (is_num(a[0])) {
    double x = num(a[0]), r = x < lo ? lo : x;
    return vfloat(r > hi ? hi : r);
  }
  if (!arg_tensor(L, call, b, 0, a, an)) return vpoison();
  return build(L, IR_OP_CLAMP, &a[0].t, 1, at, na, NULL, call->tok);
}

/* A dtype argument: a type name (f32) or a string ("f32"); absent: def. */
static bool arg_dtype(Lower *L, const FeNode *call, const Builtin *b, int i, Val *a, const FeNode **an, IrDType def,
                      IrDType *out) {
  *out = def;
  if (!an[i]) return true;
  if (a[i].kind == V_STR && ir_dtype_parse(a[i].s, strlen(a[i].s), out) && *out != IR_DT_BOOL) return true;
  error_at(L, an[i]->begin, "argument '%s' of '%s' must be a dtype (f32, f64, bf16, f16 or i32)", b->params[i],
           call->name);
  return false;
}

/* A shape argument: a list of positive constant sizes (or one size). */
static bool arg_shape(Lower *L, const FeNode *call, const Builtin *b, int i, Val *a, const FeNode **an,
                      IrShape *out) {
  const Val *items = &a[i];
  int n = 1;
  if (a[i].kind == V_LIST) {
    items = a[i].items;
    n = a[i].n;
  }
  if (n > IR_MAX_RANK) {
    error_at(L, an[i]->begin, "a tensor has at most %d dimensions", IR_MAX_RANK);
    return false;
  }
  *out = ir_shape_scalar();
  out->rank = n;
  for (int k = 0; k < n; k++) {
    const FeNode *at = an[i]->kind == FE_ND_LIST ? an[i]->items[k] : an[i];
    if (items[k].kind != V_INT || items[k].i <= 0 || items[k].i > MAX_DIM) {
      char buf[IR_TYPE_STR_MAX];
      if (items[k].kind == V_INT)
        error_at(L, at->begin, "a size in argument '%s' of '%s' must be positive, got %lld", b->params[i],
                 call->name, (long long)items[k].i);
      else
        error_at(L, at->begin, "argument '%s' of '%s' must be a list of constant sizes, got %s", b->params[i],
                 call->name, kind_str(items[k], buf, sizeof buf));
      return false;
    }
    out->dim[k] = items[k].i;
  }
  return true;
}

/* "3x3" (d sizes). */
static void sizes_str(const int64_t *v, int d, char *buf, size_t n) {
  size_t k = 0;
  buf[0] = 0;
  for (int i = 0; i < d && k < n; i++) k += (size_t)snprintf(buf + k, n - k, "%s%lld", i ? "x" : "", (long long)v[i]);
}

/* Checks every kernel fits its padded spatial axis of x (rank lead + d). */
static bool kernel_fits(Lower *L, const FeNode *call, const IrType *x, int d, const int64_t *k, const int64_t *pad,
                        const int64_t *dil) {
  int lead = x->shape.rank - d;
  int64_t span[IR_MAX_RANK], avail[IR_MAX_RANK];
  bool ok = true;
  for (int i = 0; i < d; i++) {
    span[i] = dil[i] * (k[i] - 1) + 1;
    avail[i] = x->shape.dim[lead + i] + 2 * pad[i];
    ok &= span[i] <= avail[i];
  }
  if (ok) return true;
  char b1[IR_TYPE_STR_MAX], b2[64], b3[64], b4[64];
  sizes_str(k, d, b2, sizeof b2);
  sizes_str(span, d, b3, sizeof b3);
  sizes_str(avail, d, b4, sizeof b4);
  error_at(L, call->tok, "'%s': kernel %s (spanning %s with its dilation) is larger than the input %s with its padding (%s)",
           call->name, b2, b3, ir_type_str(x, b1, sizeof b1), b4);
  return false;
}

static IrValue *patches_at(Lower *L, const FeNode *call, IrValue *x, int d, const int64_t *k, const int64_t *st,
                           const int64_t *pad, const int64_t *dil, double value) {
  IrAttr a[5] = {ir_attr_ints("kernel", k, d), ir_attr_ints("stride", st, d), ir_attr_ints("padding", pad, d),
                 ir_attr_ints("dilation", dil, d), ir_attr_float("value", value)};
  return emit_at(L, call, IR_OP_PATCHES, &x, 1, a, 5);
}

/* conv1d / conv2d(x, w, bias, stride=1, padding=0, dilation=1, groups=1):
 * x [N, C, S...], w [O, C/groups, K...] (d = 1 or 2 spatial axes), as
 * F.conv1d / F.conv2d.  Lowered to
 *   P = patches(x)                          [N, C, K..., O...]
 *   Y = reshape(w, [g, O/g, C/g*prod(K)]) @ reshape(P, [N, g, C/g*prod(K), L])
 *   y = reshape(Y, [N, O, O...]) + bias     (L = the output positions)
 * so the GEMMs are the IR's matmul: the input gradient is patches_grad of
 * the matmul's, the weight gradient the matmul's own. */
static Val bi_conv(Lower *L, const FeNode *call, const Builtin *b, Val *a, const FeNode **an) {
  int d = strcmp(b->name, "conv1d") == 0 ? 1 : 2;
  if (!arg_tensor(L, call, b, 0, a, an) || !arg_tensor(L, call, b, 1, a, an)) return vpoison();
  if (an[2] && !arg_tensor(L, call, b, 2, a, an)) return vpoison();
  static const int64_t ones[2] = {1, 1}, zeros[2] = {0, 0};
  int64_t st[2], pad[2], dil[2], groups = 1;
  if (!arg_ints_d(L, call, b, 3, a, an, d, 1, ones, st) || !arg_ints_d(L, call, b, 4, a, an, d, 0, zeros, pad) ||
      !arg_ints_d(L, call, b, 5, a, an, d, 1, ones, dil))
    return vpoison();
  if (an[6] && !arg_int(L, call, b, 6, a, an, &groups)) return vpoison();
  IrValue *x = a[0].t, *w = a[1].t, *bias = an[2] ? a[2].t : NULL;
  const IrType *xt = &x->type, *wt = &w->type;
  char b1[IR_TYPE_STR_MAX], b2[IR_TYPE_STR_MAX];
  const char *layout = d == 1 ? "[N, C, L]" : "[N, C, H, W]", *wlayout = d == 1 ? "[O, C/groups, K]" : "[O, C/groups, KH, KW]";
  if (xt->shape.rank != d + 2) {
    error_at(L, an[0]->begin, "'%s' needs an input of rank %d %s, got %s", call->name, d + 2, layout,
             ir_type_str(xt, b1, sizeof b1));
    return vpoison();
  }
  if (wt->shape.rank != d + 2) {
    error_at(L, an[1]->begin, "'%s' needs a weight of rank %d %s, got %s", call->name, d + 2, wlayout,
             ir_type_str(wt, b1, sizeof b1));
    return vpoison();
  }
  int64_t N = xt->shape.dim[0], C = xt->shape.dim[1], O = wt->shape.dim[0], Cg = wt->shape.dim[1];
  if (groups < 1 || C % groups != 0 || O % groups != 0) {
    error_at(L, an[6] ? an[6]->begin : call->tok,
             "'%s': groups=%lld must be positive and divide both the %lld input channels of %s and the %lld output "
             "channels of %s",
             call->name, (long long)groups, (long long)C, ir_type_str(xt, b1, sizeof b1), (long long)O,
             ir_type_str(wt, b2, sizeof b2));
    return vpoison();
  }
  if (Cg * groups != C) {
    error_at(L, call->tok,
             "'%s': input %s has %lld channels, but weight %s takes %lld per group (%lld with groups=%lld)", call->name,
             ir_type_str(xt, b1, sizeof b1), (long long)C, ir_type_str(wt, b2, sizeof b2), (long long)Cg,
             (long long)(Cg * groups), (long long)groups);
    return vpoison();
  }
  if (bias && (bias->type.shape.rank != 1 || bias->type.shape.dim[0] != O)) {
    error_at(L, an[2]->begin, "'%s': bias %s does not match the %lld output channels of weight %s", call->name,
             ir_type_str(&bias->type, b1, sizeof b1), (long long)O, ir_type_str(wt, b2, sizeof b2));
    return vpoison();
  }
  if (xt->dtype != wt->dtype || (bias && bias->type.dtype != xt->dtype)) {
    error_at(L, call->tok, "'%s': input %s and weight %s must have one dtype%s", call->name,
             ir_type_str(xt, b1, sizeof b1), ir_type_str(wt, b2, sizeof b2), bias ? " (and the bias)" : "");
    return vpoison();
  }
  if (!kernel_fits(L, call, xt, d, &wt->shape.dim[2], pad, dil)) return vpoison();
  IrValue *P = patches_at(L, call, x, d, &wt->shape.dim[2], st, pad, dil, 0.0);
  if (!P) return vpoison();
  int64_t K = 1, npos = 1, outs[2];
  for (int i = 0; i < d; i++) {
    K *= wt->shape.dim[2 + i];
    outs[i] = P->type.shape.dim[2 + d + i];
    npos *= outs[i];
  }
  IrValue *Y;
  if (groups == 1) {
    int64_t pd[3] = {N, C * K, npos}, wd[2] = {O, C * K};
    IrValue *mm[2] = {reshape_at(L, call, w, wd, 2), reshape_at(L, call, P, pd, 3)};
    Y = mm[0] && mm[1] ? emit_at(L, call, IR_OP_MATMUL, mm, 2, NULL, 0) : NULL;
  } else {
    int64_t pd[4] = {N, groups, Cg * K, npos}, wd[3] = {groups, O / groups, Cg * K};
    IrValue *mm[2] = {reshape_at(L, call, w, wd, 3), reshape_at(L, call, P, pd, 4)};
    Y = mm[0] && mm[1] ? emit_at(L, call, IR_OP_MATMUL, mm, 2, NULL, 0) : NULL;
  }
  int64_t yd[4] = {N, O, outs[0], d == 2 ? outs[1] : 0};
  Y = reshape_at(L, call, Y, yd, d + 2);
  if (Y && bias) {
    int64_t bd[3] = {O, 1, 1};
    IrValue *args[2] = {Y, reshape_at(L, call, bias, bd, d + 1)};
    Y = args[1] ? emit_at(L, call, IR_OP_ADD, args, 2, NULL, 0) : NULL;
  }
  return Y ? vtensor(Y) : vpoison();
}

/* max_pool2d / avg_pool2d(x, kernel, stride=kernel, padding=0) on the last
 * two axes of x [..., H, W], as F.max_pool2d / F.avg_pool2d: the max
 * (padding counts as -inf) or the mean (padding counts as 0, divided by the
 * kernel's size: count_include_pad=True) over the patches' kernel axes.
 * The max's gradient is split evenly among ties in a window (the IR's
 * max, torch.amax). */
static Val bi_pool(Lower *L, const FeNode *call, const Builtin *b, Val *a, const FeNode **an) {
  bool mx = b->op == IR_OP_MAX;
  if (!arg_tensor(L, call, b, 0, a, an)) return vpoison();
  IrValue *x = a[0].t;
  const IrType *xt = &x->type;
  static const int64_t ones[2] = {1, 1}, zeros[2] = {0, 0};
  int64_t k[2], st[2], pad[2];
  if (!arg_ints_d(L, call, b, 1, a, an, 2, 1, NULL, k)) return vpoison();
  if (!arg_ints_d(L, call, b, 2, a, an, 2, 1, k, st) || !arg_ints_d(L, call, b, 3, a, an, 2, 0, zeros, pad))
    return vpoison();
  char b1[IR_TYPE_STR_MAX];
  if (xt->shape.rank < 3 || !ir_dtype_is_float(xt->dtype)) {
    error_at(L, an[0]->begin, "'%s' needs a floating-point input [N, C, H, W] or [C, H, W], got %s", call->name,
             ir_type_str(xt, b1, sizeof b1));
    return vpoison();
  }
  for (int i = 0; i < 2; i++)
    if (2 * pad[i] > k[i]) {
      error_at(L, an[3]->begin, "'%s': padding %lld is more than half the kernel %lld (as in F.%s)", call->name,
               (long long)pad[i], (long long)k[i], call->name);
      return vpoison();
    }
  if (!kernel_fits(L, call, xt, 2, k, pad, ones)) return vpoison();
  IrValue *P = patches_at(L, call, x, 2, k, st, pad, ones, mx ? -INFINITY : 0.0);
  if (!P) return vpoison();
  int lead = xt->shape.rank - 2;
  int64_t axes[2] = {lead, lead + 1};
  IrAttr at[2] = {ir_attr_ints("axes", axes, 2), ir_attr_bool("keepdim", false)};
  return build(L, mx ? IR_OP_MAX : IR_OP_MEAN, &P, 1, at, 2, NULL, call->tok);
}

/* pad(x, [lo, hi, ...], value=0): pairs from the last axis backwards, as
 * F.pad in constant mode; a negative pad crops (a slice first).  The
 * padded tensor is unslice(x) + (value - unslice(value)) with value as
 * constants: exactly x inside and value outside, and the gradient flows
 * through the unslice only. */
static Val bi_pad(Lower *L, const FeNode *call, const Builtin *b, Val *a, const FeNode **an) {
  if (!arg_tensor(L, call, b, 0, a, an)) return vpoison();
  IrValue *x = a[0].t;
  const IrType *xt = &x->type;
  int r = xt->shape.rank;
  char b1[IR_TYPE_STR_MAX];
  double value = 0;
  if (an[2] && !arg_num(L, call, b, 2, a, an, &value)) return vpoison();
  bool ok = a[1].kind == V_LIST && a[1].n % 2 == 0 && a[1].n <= 2 * r;
  for (int i = 0; ok && i < a[1].n; i++) ok = a[1].items[i].kind == V_INT;
  if (!ok) {
    error_at(L, an[1]->begin,
             "argument 'pad' of 'pad' must be a list of constant integers [lo, hi, ...], a pair per axis from the "
             "last, at most %d for %s",
             2 * r, ir_type_str(xt, b1, sizeof b1));
    return vpoison();
  }
  int64_t lo[IR_MAX_RANK] = {0}, hi[IR_MAX_RANK] = {0};
  for (int i = 0; i < a[1].n; i++) {
    int64_t v = a[1].items[i].i;
    if (v < -MAX_DIM || v > MAX_DIM) {
      error_at(L, an[1]->begin, "pad %lld is out of range", (long long)v);
      return vpoison();
    }
    (i % 2 == 0 ? lo : hi)[r - 1 - i / 2] = v;
  }
  int64_t starts[IR_MAX_RANK], stops[IR_MAX_RANK], steps[IR_MAX_RANK], full[IR_MAX_RANK];
  bool crop = false;
  for (int k = 0; k < r; k++) {
    int64_t dlo = lo[k] < 0 ? -lo[k] : 0, dhi = hi[k] < 0 ? -hi[k] : 0;
    if (dlo + dhi > xt->shape.dim[k]) {
      error_at(L, an[1]->begin, "'pad': cropping %lld and %lld from axis %d of %s leaves less than nothing",
               (long long)dlo, (long long)dhi, k, ir_type_str(xt, b1, sizeof b1));
      return vpoison();
    }
    starts[k] = dlo, stops[k] = xt->shape.dim[k] - dhi, steps[k] = 1;
    crop |= dlo || dhi;
  }
  if (crop) {
    IrAttr at[3] = {ir_attr_ints("starts", starts, r), ir_attr_ints("stops", stops, r), ir_attr_ints("steps", steps, r)};
    x = emit_at(L, call, IR_OP_SLICE, &x, 1, at, 3);
    if (!x) return vpoison();
  }
  bool grow = false;
  for (int k = 0; k < r; k++) {
    int64_t plo = lo[k] > 0 ? lo[k] : 0, phi = hi[k] > 0 ? hi[k] : 0;
    starts[k] = plo, stops[k] = plo + x->type.shape.dim[k], full[k] = stops[k] + phi;
    grow |= plo || phi;
  }
  if (!grow) return vtensor(x);
  IrAttr at[4] = {ir_attr_ints("starts", starts, r), ir_attr_ints("stops", stops, r), ir_attr_ints("steps", steps, r),
                  ir_attr_ints("shape", full, r)};
  IrValue *y = emit_at(L, call, IR_OP_UNSLICE, &x, 1, at, 4);
  if (!y || value == 0) return y ? vtensor(y) : vpoison();
  IrType ct = y->type;
  IrValue *cin = ir_const_shaped(L->f, value, x->type, loc_of(L, call->tok));
  IrValue *cout = ir_const_shaped(L->f, value, ct, loc_of(L, call->tok));
  IrValue *u = emit_at(L, call, IR_OP_UNSLICE, &cin, 1, at, 4);
  IrValue *ring[2] = {cout, u};
  IrValue *rv = u ? emit_at(L, call, IR_OP_SUB, ring, 2, NULL, 0) : NULL;
  IrValue *sum[2] = {y, rv};
  y = rv ? emit_at(L, call, IR_OP_ADD, sum, 2, NULL, 0) : NULL;
  return y ? vtensor(y) : vpoison();
}

/* batch_norm(x, weight, bias, eps=1e-5): over every axis but 1 (the
 * channels), train-mode statistics with the biased variance, as
 * F.batch_norm(training=True); weight and bias [C] may be omitted.  Its
 * expansion in mean and var (DESIGN.md §2), so gas-fold sees the
 * batch-mixing centring and refuses it under K > 1 at this call:
 *   m = mean(x, axes, keepdim)   v = mean((x - m) ** 2, axes, keepdim)
 *   y = (x - m) * rsqrt(v + eps) * weight + bias */
static Val bi_batch_norm(Lower *L, const FeNode *call, const Builtin *b, Val *a, const FeNode **an) {
  if (!arg_tensor(L, call, b, 0, a, an)) return vpoison();
  for (int i = 1; i < 3; i++)
    if (an[i] && !arg_tensor(L, call, b, i, a, an)) return vpoison();
  double eps = 1e-5;
  if (an[3] && !arg_num(L, call, b, 3, a, an, &eps)) return vpoison();
  if (!(eps >= 0)) {
    error_at(L, an[3]->begin, "eps must not be negative");
    return vpoison();
  }
  IrValue *x = a[0].t;
  const IrType *xt = &x->type;
  char b1[IR_TYPE_STR_MAX], b2[IR_TYPE_STR_MAX];
  int r = xt->shape.rank;
  if (r < 2 || !ir_dtype_is_float(xt->dtype)) {
    error_at(L, an[0]->begin, "'batch_norm' needs a floating-point input [N, C, ...], got %s",
             ir_type_str(xt, b1, sizeof b1));
    return vpoison();
  }
  int64_t C = xt->shape.dim[1];
  for (int i = 1; i < 3; i++) {
    const IrType *t = an[i] ? &a[i].t->type : NULL;
    if (t && (t->shape.rank != 1 || t->shape.dim[0] != C || t->dtype != xt->dtype)) {
      error_at(L, an[i]->begin, "'batch_norm': %s %s does not match the %lld channels (axis 1) of %s", b->params[i],
               ir_type_str(t, b1, sizeof b1), (long long)C, ir_type_str(xt, b2, sizeof b2));
      return vpoison();
    }
  }
  IrFunc *f = L->f;
  IrLoc loc = loc_of(L, call->tok);
  int64_t axes[IR_MAX_RANK], cd[IR_MAX_RANK];
  int na = 0;
  for (int k = 0; k < r; k++) {
    if (k != 1) axes[na++] = k;
    cd[k] = k == 1 ? C : 1;
  }
  IrAttr at[2] = {ir_attr_ints("axes", axes, na), ir_attr_bool("keepdim", true)};
  IrValue *m = emit_at(L, call, IR_OP_MEAN, &x, 1, at, 2);
  if (!m) return vpoison();
  IrValue *xc = ir_binary(f, IR_OP_SUB, x, m, loc);
  IrValue *sq = ir_binary(f, IR_OP_MUL, xc, xc, loc);
  IrValue *v = emit_at(L, call, IR_OP_MEAN, &sq, 1, at, 2);
  if (!v) return vpoison();
  IrValue *rs = ir_unary(f, IR_OP_RSQRT, ir_binary(f, IR_OP_ADD, v, ir_const(f, eps, xt->dtype, loc), loc), loc);
  IrValue *y = ir_binary(f, IR_OP_MUL, xc, rs, loc);
  if (an[1]) y = ir_binary(f, IR_OP_MUL, y, reshape_at(L, call, a[1].t, cd, r), loc);
  if (an[2]) y = ir_binary(f, IR_OP_ADD, y, reshape_at(L, call, a[2].t, cd, r), loc);
  return vtensor(y);
}

/* zeros([..], dtype=f32)  ones([..], dtype=f32)  full([..], value, dtype=f32):
 * a const of that type (a batch dim in the shape is the micro-batch). */
static Val bi_fill(Lower *L, const FeNode *call, const Builtin *b, Val *a, const FeNode **an) {
  IrType ty;
  double v = strcmp(b->name, "ones") == 0 ? 1.0 : 0.0;
  bool full = strcmp(b->name, "full") == 0;
  int di = full ? 2 : 1;
  if (!arg_shape(L, call, b, 0, a, an, &ty.shape)) return vpoison();
  if (full && !arg_num(L, call, b, 1, a, an, &v)) return vpoison();
  if (!arg_dtype(L, call, b, di, a, an, IR_DT_F32, &ty.dtype)) return vpoison();
  if (ty.dtype == IR_DT_I32 && (v != trunc(v) || fabs(v) > 2147483647.0)) {
    error_at(L, an[1]->begin, "the value of an i32 'full' must be an i32 integer, got %g", v);
    return vpoison();
  }
  IrAttr at = ir_attr_float("value", v);
  return build(L, IR_OP_CONST, NULL, 0, &at, 1, &ty, call->tok);
}

/* arange(N, dtype=i32): 0, 1, ..., N-1 (i32, f32 or f64). */
static Val bi_arange(Lower *L, const FeNode *call, const Builtin *b, Val *a, const FeNode **an) {
  IrType ty;
  if (a[0].kind != V_INT || a[0].i <= 0 || a[0].i > MAX_DIM) {
    char buf[IR_TYPE_STR_MAX];
    if (a[0].kind == V_INT)
      error_at(L, an[0]->begin, "the length of 'arange' must be positive, got %lld", (long long)a[0].i);
    else
      error_at(L, an[0]->begin, "argument 'end' of 'arange' must be a constant integer, got %s",
               kind_str(a[0], buf, sizeof buf));
    return vpoison();
  }
  if (!arg_dtype(L, call, b, 1, a, an, IR_DT_I32, &ty.dtype)) return vpoison();
  ty.shape = ir_shape_make(1, &a[0].i);
  return build(L, IR_OP_ARANGE, NULL, 0, NULL, 0, &ty, call->tok);
}

/* one_hot(idx, N): i32 [..., N] (the IR's one_hot, cast to i32; -100, the
 * IR's ignore_index, gives an all-zero row). */
static Val bi_one_hot(Lower *L, const FeNode *call, const Builtin *b, Val *a, const FeNode **an) {
  int64_t depth;
  if (!arg_tensor(L, call, b, 0, a, an) || !arg_int(L, call, b, 1, a, an, &depth)) return vpoison();
  if (depth <= 0 || depth > MAX_DIM) {
    error_at(L, an[1]->begin, "the number of classes of 'one_hot' must be positive, got %lld", (long long)depth);
    return vpoison();
  }
  const IrType *it = &a[0].t->type;
  if (it->dtype != IR_DT_I32) {
    char buf[IR_TYPE_STR_MAX];
    error_at(L, an[0]->begin, "argument 'idx' of 'one_hot' must be an i32 tensor, got %s",
             ir_type_str(it, buf, sizeof buf));
    return vpoison();
  }
  if (it->shape.rank >= IR_MAX_RANK) {
    error_at(L, an[0]->begin, "a tensor has at most %d dimensions", IR_MAX_RANK);
    return vpoison();
  }
  IrType ft = {IR_DT_F32, it->shape};
  ft.shape.dim[ft.shape.rank++] = depth;
  IrAttr at[2] = {ir_attr_int("depth", depth), ir_attr_int("ignore_index", -100)};
  Val oh = build(L, IR_OP_ONE_HOT, &a[0].t, 1, at, 2, &ft, call->tok);
  if (oh.kind != V_TENSOR) return oh;
  IrType ty = {IR_DT_I32, ft.shape};
  return build(L, IR_OP_CAST, &oh.t, 1, NULL, 0, &ty, call->tok);
}

/* ---- language v2: selection ---- */

/* An i32 tensor argument (an index). */
static bool arg_index(Lower *L, const FeNode *call, const Builtin *b, int i, Val *a, const FeNode **an) {
  if (a[i].kind == V_TENSOR && a[i].t->type.dtype == IR_DT_I32) return true;
  char buf[IR_TYPE_STR_MAX];
  error_at(L, an[i]->begin, "argument '%s' of '%s' must be an i32 tensor, got %s", b->params[i], call->name,
           a[i].kind == V_TENSOR ? ir_type_str(&a[i].t->type, buf, sizeof buf) : kind_str(a[i], buf, sizeof buf));
  return false;
}

/* The tensor x (argument 0) and its axis (argument i, or -1 when absent). */
static bool arg_x_axis(Lower *L, const FeNode *call, const Builtin *b, int i, Val *a, const FeNode **an,
                       int64_t *axis) {
  *axis = -1;
  if (!arg_tensor(L, call, b, 0, a, an)) return false;
  if (an[i] && !arg_int(L, call, b, i, a, an, axis)) return false;
  return axis_of(L, *axis, &a[0].t->type, an[i] ? an[i]->begin : call->tok, axis);
}

/* gather(x, idx, axis): torch.gather; idx has x's dims except along axis. */
static Val bi_gather(Lower *L, const FeNode *call, const Builtin *b, Val *a, const FeNode **an) {
  int64_t axis;
  if (!arg_x_axis(L, call, b, 2, a, an, &axis) || !arg_index(L, call, b, 1, a, an)) return vpoison();
  IrValue *args[2] = {a[0].t, a[1].t};
  IrAttr at = ir_attr_int("axis", axis);
  return build(L, IR_OP_GATHER, args, 2, &at, 1, NULL, call->tok);
}

/* index_select(x, idx, axis): idx i32[N]; a gather whose index is idx
 * broadcast over x's other axes (its gradient adds repeated indices). */
static Val bi_index_select(Lower *L, const FeNode *call, const Builtin *b, Val *a, const FeNode **an) {
  int64_t axis;
  if (!arg_x_axis(L, call, b, 2, a, an, &axis) || !arg_index(L, call, b, 1, a, an)) return vpoison();
  const IrType *xt = &a[0].t->type, *it = &a[1].t->type;
  if (it->shape.rank != 1) {
    char buf[IR_TYPE_STR_MAX];
    error_at(L, an[1]->begin, "argument 'idx' of 'index_select' must be a 1-D i32 tensor, got %s",
             ir_type_str(it, buf, sizeof buf));
    return vpoison();
  }
  int r = xt->shape.rank;
  int64_t ones[IR_MAX_RANK], full[IR_MAX_RANK];
  for (int d = 0; d < r; d++) {
    ones[d] = d == axis ? it->shape.dim[0] : 1;
    full[d] = d == axis ? it->shape.dim[0] : xt->shape.dim[d];
  }
  IrAttr rs = ir_attr_ints("shape", ones, r), bs = ir_attr_ints("shape", full, r);
  Val v = build(L, IR_OP_RESHAPE, &a[1].t, 1, &rs, 1, NULL, call->tok);
  if (v.kind == V_TENSOR) v = build(L, IR_OP_BROADCAST, &v.t, 1, &bs, 1, NULL, call->tok);
  if (v.kind != V_TENSOR) return vpoison();
  IrValue *args[2] = {a[0].t, v.t};
  IrAttr at = ir_attr_int("axis", axis);
  return build(L, IR_OP_GATHER, args, 2, &at, 1, NULL, call->tok);
}

/* topk(x, k, axis) as the i32 indices: k largest along axis. */
static Val topk_indices(Lower *L, const FeNode *call, IrValue *x, int64_t k, int64_t axis) {
  IrAttr at[2] = {ir_attr_int("k", k), ir_attr_int("axis", axis)};
  return build(L, IR_OP_TOPK, &x, 1, at, 2, NULL, call->tok);
}

/* v, i = topk(x, k, axis=-1): the k largest along axis, largest first, then
 * their i32 indices (ties and NaN as the topk op); the values are gathered
 * at the indices, so their gradient flows to the chosen positions. */
static Val bi_topk(Lower *L, const FeNode *call, const Builtin *b, Val *a, const FeNode **an) {
  int64_t axis, k;
  if (!arg_x_axis(L, call, b, 2, a, an, &axis) || !arg_int(L, call, b, 1, a, an, &k)) return vpoison();
  int64_t len = a[0].t->type.shape.dim[axis];
  if (k < 1 || k > len) {
    char buf[IR_TYPE_STR_MAX];
    error_at(L, an[1]->begin, "k = %lld is out of range [1, %lld] for axis %lld of %s", (long long)k, (long long)len,
             (long long)axis, ir_type_str(&a[0].t->type, buf, sizeof buf));
    return vpoison();
  }
  Val i = topk_indices(L, call, a[0].t, k, axis);
  if (i.kind != V_TENSOR) return i;
  IrValue *args[2] = {a[0].t, i.t};
  IrAttr at = ir_attr_int("axis", axis);
  Val v = build(L, IR_OP_GATHER, args, 2, &at, 1, NULL, call->tok);
  return vtuple(L, 2, (Val[]){v, i});
}

/* argmax(x, axis): i32, the axis dropped; ties and NaN as torch (the first
 * index; NaN counts as the largest): topk with k = 1. */
static Val bi_argmax(Lower *L, const FeNode *call, const Builtin *b, Val *a, const FeNode **an) {
  int64_t axis;
  if (!arg_x_axis(L, call, b, 1, a, an, &axis)) return vpoison();
  Val v = topk_indices(L, call, a[0].t, 1, axis);
  if (v.kind != V_TENSOR) return v;
  const IrShape *s = &a[0].t->type.shape;
  int64_t dims[IR_MAX_RANK];
  int n = 0;
  for (int d = 0; d < s->rank; d++)
    if (d != axis) dims[n++] = s->dim[d];
  IrAttr rs = ir_attr_ints("shape", dims, n);
  return build(L, IR_OP_RESHAPE, &v.t, 1, &rs, 1, NULL, call->tok);
}

/* ---- Randomness (DESIGN.md §2): rand_like, randn_like, dropout ---- */

/* Whether v depends on a batched input (a walk of its operands, without
 * recursion: a deep model must not exhaust the stack). */
static bool batch_dependent(Lower *L, const IrValue *v) {
  int n = L->f->nvalues > 0 ? L->f->nvalues : 1, top = 0;
  bool *seen = ARENA_ARRAY(L->tmp, bool, n);
  const IrValue **stack = ARENA_ARRAY(L->tmp, const IrValue *, n);
  stack[top++] = v;
  seen[v->id] = true;
  while (top > 0) {
    const IrValue *w = stack[--top];
    if (!w->def && w->role == IR_ARG_INPUT && w->batched) return true;
    for (int i = 0; w->def && i < w->def->nargs; i++) {
      const IrValue *x = w->def->args[i];
      if (!seen[x->id]) {
        seen[x->id] = true;
        stack[top++] = x;
      }
    }
  }
  return false;
}

/* Draws of x's type (f32 draws cast to bf16/f16): uniform or normal, from
 * the function's one rng.state.  The draw is per sample (batched=true) when
 * x depends on a batched input and leads with the micro-batch axis; else
 * every micro-batch draws the same values, as one full batch would once.
 * Its key is its location, made distinct for each earlier draw lowered
 * from the same location (ir_random_key). */
static Val random_like(Lower *L, const FeNode *call, IrValue *x, bool normal) {
  char buf[IR_TYPE_STR_MAX];
  IrType t = x->type;
  if (!ir_dtype_is_float(t.dtype)) {
    error_at(L, call->tok, "'%s' needs a floating-point tensor, got %s", call->name, ir_type_str(&t, buf, sizeof buf));
    return vpoison();
  }
  IrFunc *f = L->f;
  IrValue *state = NULL;
  int occurrence = 0;
  IrLoc loc = loc_of(L, call->tok);
  for (int i = 0; i < f->nops; i++) {
    const IrOp *op = f->ops[i];
    if (op->opcode == IR_OP_RNG_STATE && !state) state = op->result;
    if (op->opcode == IR_OP_RANDOM && op->loc.line == loc.line && op->loc.col == loc.col) occurrence++;
  }
  if (!state) {
    Val s = build(L, IR_OP_RNG_STATE, NULL, 0, NULL, 0, NULL, call->tok);
    if (s.kind != V_TENSOR) return vpoison();
    state = s.t;
  }
  bool batched = t.shape.rank > 0 && L->m->batch && t.shape.dim[0] == L->m->batch_micro && batch_dependent(L, x);
  IrType dt = t;
  if (dt.dtype != IR_DT_F64) dt.dtype = IR_DT_F32;
  IrAttr at[3] = {ir_attr_str("dist", normal ? "normal" : "uniform"),
                  ir_attr_int("key", ir_random_key(loc.line, loc.col, occurrence)), ir_attr_bool("batched", batched)};
  Val r = build(L, IR_OP_RANDOM, &state, 1, at, 3, &dt, call->tok);
  if (r.kind != V_TENSOR || dt.dtype == t.dtype) return r;
  return build(L, IR_OP_CAST, &r.t, 1, NULL, 0, &t, call->tok);
}

/* rand_like(x): uniform [0, 1)   randn_like(x): standard normal */
static Val bi_rand_like(Lower *L, const FeNode *call, const Builtin *b, Val *a, const FeNode **an) {
  if (!arg_tensor(L, call, b, 0, a, an)) return vpoison();
  return random_like(L, call, a[0].t, strcmp(b->name, "randn_like") == 0);
}

/* dropout(x, p): x * (u >= p) / (1 - p) for u = rand_like(x); the mask is
 * a select of two constants, so the gradient multiplies by the same mask
 * (and `split-draws` lets each kernel that reads it draw it again). */
static Val bi_dropout(Lower *L, const FeNode *call, const Builtin *b, Val *a, const FeNode **an) {
  double p;
  if (!arg_tensor(L, call, b, 0, a, an) || !arg_num(L, call, b, 1, a, an, &p)) return vpoison();
  if (!(p >= 0 && p <= 1)) {
    error_at(L, an[1]->begin, "dropout probability must be in [0, 1], got %g", p);
    return vpoison();
  }
  if (p == 0 || L->opt->no_training) return a[0]; /* torch: the identity (p = 0, or eval mode) */
  IrValue *x = a[0].t;
  Val u = random_like(L, call, x, false);
  if (u.kind != V_TENSOR) return vpoison();
  IrLoc loc = loc_of(L, call->tok);
  IrDType dt = u.t->type.dtype; /* the draw's: the comparison is in f32 (f64 for f64) */
  IrValue *cmp[2] = {u.t, ir_const(L->f, p, dt, loc)};
  Val keep = build(L, IR_OP_GE, cmp, 2, NULL, 0, NULL, call->tok);
  if (keep.kind != V_TENSOR) return vpoison();
  IrValue *sel[3] = {keep.t, ir_const(L->f, 1.0 / (1.0 - p), x->type.dtype, loc), ir_const(L->f, 0.0, x->type.dtype, loc)};
  Val mask = build(L, IR_OP_SELECT, sel, 3, NULL, 0, NULL, call->tok);
  if (mask.kind != V_TENSOR) return vpoison();
  IrValue *mul[2] = {x, mask.t};
  return build(L, IR_OP_MUL, mul, 2, NULL, 0, NULL, call->tok);
}

static const Builtin builtins[] = {
    {"exp", bi_unary_math, IR_OP_EXP, 1, {"x"}, -1, "exp(x)"},
    {"log", bi_unary_math, IR_OP_LOG, 1, {"x"}, -1, "log(x)"},
    {"sqrt", bi_unary_math, IR_OP_SQRT, 1, {"x"}, -1, "sqrt(x)"},
    {"rsqrt", bi_unary_math, IR_OP_RSQRT, 1, {"x"}, -1, "rsqrt(x)"},
    {"tanh", bi_unary_math, IR_OP_TANH, 1, {"x"}, -1, "tanh(x)"},
    {"sigmoid", bi_unary_math, IR_OP_SIGMOID, 1, {"x"}, -1, "sigmoid(x)"},
    {"relu", bi_unary_math, IR_OP_RELU, 1, {"x"}, -1, "relu(x)"},
    {"gelu", bi_gelu, IR_OP_GELU, 1, {"x", "approximate"}, -1, "gelu(x, approximate=\"tanh\")  (or \"none\": erf)"},
    {"silu", bi_unary_math, IR_OP_SILU, 1, {"x"}, -1, "silu(x)"},
    {"abs", bi_unary_math, IR_OP_ABS, 1, {"x"}, -1, "abs(x)"},
    {"detach", bi_unary, IR_OP_DETACH, 1, {"x"}, -1, "detach(x)  (no gradient flows)"},
    {"causal_mask", bi_unary, IR_OP_CAUSAL_MASK, 1, {"x"}, -1, "causal_mask(x)  (above the diagonal of the last two axes: -inf)"},
    {"maximum", bi_binary, IR_OP_MAXIMUM, 2, {"a", "b"}, -1, "maximum(a, b)"},
    {"minimum", bi_binary, IR_OP_MINIMUM, 2, {"a", "b"}, -1, "minimum(a, b)"},
    {"matmul", bi_binary, IR_OP_MATMUL, 2, {"a", "b"}, -1, "matmul(a, b)  (also a @ b)"},
    {"transpose", bi_transpose, IR_OP_PERMUTE, 3, {"x", "dim0", "dim1"}, -1, "transpose(x, dim0, dim1)"},
    {"permute", bi_permute, IR_OP_PERMUTE, 2, {"x", "dims"}, -1, "permute(x, dims)"},
    {"reshape", bi_reshape, IR_OP_RESHAPE, 2, {"x", "shape"}, 1, "reshape(x, shape)  (one -1 allowed)"},
    {"sum", bi_reduce, IR_OP_SUM, 1, {"x", "axis", "keepdim"}, -1, "sum(x, axis=all, keepdim=false)"},
    {"mean", bi_reduce, IR_OP_MEAN, 1, {"x", "axis", "keepdim"}, -1, "mean(x, axis=all, keepdim=false)"},
    {"max", bi_reduce, IR_OP_MAX, 1, {"x", "axis", "keepdim"}, -1, "max(x, axis=all, keepdim=false)"},
    {"logsumexp", bi_reduce, IR_OP_LOGSUMEXP, 2, {"x", "axis", "keepdim"}, -1, "logsumexp(x, axis, keepdim=false)"},
    {"softmax", bi_softmax, IR_OP_SOFTMAX, 1, {"x", "axis"}, -1, "softmax(x, axis=-1)"},
    {"log_softmax", bi_softmax, IR_OP_LOG_SOFTMAX, 1, {"x", "axis"}, -1, "log_softmax(x, axis=-1)"},
    {"layer_norm", bi_norm, IR_OP_LAYER_NORM, 3, {"x", "weight", "bias", "eps"}, -1, "layer_norm(x, weight, bias, eps=1e-5)"},
    {"rms_norm", bi_norm, IR_OP_RMS_NORM, 2, {"x", "weight", "eps"}, -1, "rms_norm(x, weight, eps=1e-6)"},
    {"embedding", bi_embedding, IR_OP_EMBEDDING, 2, {"idx", "table"}, -1, "embedding(idx, table)"},
    {"concat", bi_concat, IR_OP_CONCAT, 1, {"tensors", "axis"}, -1, "concat(tensors, axis=0)"},
    {"cross_entropy", bi_cross_entropy, IR_OP_CROSS_ENTROPY, 2, {"logits", "target", "ignore_index", "reduction"}, -1, "cross_entropy(logits, target, ignore_index=-100, reduction=\"mean\")"},
    {"mse_loss", bi_mse_loss, IR_OP_MSE_LOSS, 2, {"input", "target", "reduction"}, -1, "mse_loss(input, target, reduction=\"mean\")"},
    /* Language v2: selection and conversion. */
    {"where", bi_where, IR_OP_SELECT, 3, {"cond", "a", "b"}, -1, "where(cond, a, b)"},
    {"cast", bi_cast, IR_OP_CAST, 2, {"x", "dtype"}, -1, "cast(x, dtype)"},
    /* convolution, pooling, pad and batch_norm (language v2) */
    {"conv1d", bi_conv, IR_OP_PATCHES, 2, {"x", "w", "bias", "stride", "padding", "dilation", "groups"}, -1,
     "conv1d(x, w, bias=none, stride=1, padding=0, dilation=1, groups=1)  (NCL, OIK)"},
    {"conv2d", bi_conv, IR_OP_PATCHES, 2, {"x", "w", "bias", "stride", "padding", "dilation", "groups"}, -1,
     "conv2d(x, w, bias=none, stride=1, padding=0, dilation=1, groups=1)  (NCHW, OIHW)"},
    {"max_pool2d", bi_pool, IR_OP_MAX, 2, {"x", "kernel", "stride", "padding"}, -1,
     "max_pool2d(x, kernel, stride=kernel, padding=0)"},
    {"avg_pool2d", bi_pool, IR_OP_MEAN, 2, {"x", "kernel", "stride", "padding"}, -1,
     "avg_pool2d(x, kernel, stride=kernel, padding=0)"},
    {"pad", bi_pad, IR_OP_UNSLICE, 2, {"x", "pad", "value"}, -1, "pad(x, pad, value=0)  (pairs from the last axis)"},
    {"batch_norm", bi_batch_norm, IR_OP_MEAN, 1, {"x", "weight", "bias", "eps"}, -1,
     "batch_norm(x, weight=none, bias=none, eps=1e-5)  (over every axis but 1)"},
    /* language v2: elementwise math */
    {"clamp", bi_clamp, IR_OP_CLAMP, 1, {"x", "min", "max"}, -1, "clamp(x, min=none, max=none)"},
    {"sin", bi_unary_math, IR_OP_SIN, 1, {"x"}, -1, "sin(x)"},
    {"cos", bi_unary_math, IR_OP_COS, 1, {"x"}, -1, "cos(x)"},
    {"log1p", bi_unary_math, IR_OP_LOG1P, 1, {"x"}, -1, "log1p(x)"},
    {"softplus", bi_unary_math, IR_OP_SOFTPLUS, 1, {"x"}, -1, "softplus(x)"},
    {"erf", bi_unary_math, IR_OP_ERF, 1, {"x"}, -1, "erf(x)"},
    /* language v2: constructors (the shape argument is a shape: batch = micro-batch) */
    {"zeros", bi_fill, IR_OP_CONST, 1, {"shape", "dtype"}, 0, "zeros(shape, dtype=f32)"},
    {"ones", bi_fill, IR_OP_CONST, 1, {"shape", "dtype"}, 0, "ones(shape, dtype=f32)"},
    {"full", bi_fill, IR_OP_CONST, 2, {"shape", "value", "dtype"}, 0, "full(shape, value, dtype=f32)"},
    {"arange", bi_arange, IR_OP_ARANGE, 1, {"end", "dtype"}, 0, "arange(end, dtype=i32)"},
    {"one_hot", bi_one_hot, IR_OP_ONE_HOT, 2, {"idx", "num_classes"}, -1, "one_hot(idx, num_classes)"},
    /* language v2: selection */
    {"gather", bi_gather, IR_OP_GATHER, 3, {"x", "idx", "axis"}, -1, "gather(x, idx, axis)"},
    {"index_select", bi_index_select, IR_OP_GATHER, 3, {"x", "idx", "axis"}, -1, "index_select(x, idx, axis)"},
    {"argmax", bi_argmax, IR_OP_TOPK, 2, {"x", "axis"}, -1, "argmax(x, axis)"},
    {"topk", bi_topk, IR_OP_TOPK, 2, {"x", "k", "axis"}, -1, "topk(x, k, axis=-1) -> values, i32 indices"},
    /* Randomness */
    {"rand_like", bi_rand_like, IR_OP_RANDOM, 1, {"x"}, -1, "rand_like(x)  (uniform [0, 1))"},
    {"randn_like", bi_rand_like, IR_OP_RANDOM, 1, {"x"}, -1, "randn_like(x)  (standard normal)"},
    {"dropout", bi_dropout, IR_OP_RANDOM, 2, {"x", "p"}, -1, "dropout(x, p)  (identity when not training)"},
};

static const Builtin *find_builtin(const char *name) {
  for (size_t i = 0; i < sizeof builtins / sizeof *builtins; i++)
    if (strcmp(builtins[i].name, name) == 0) return &builtins[i];
  return NULL;
}

int fe_builtin_count(void) { return (int)(sizeof builtins / sizeof *builtins); }
const char *fe_builtin_name(int i) { return i >= 0 && i < fe_builtin_count() ? builtins[i].name : NULL; }
const char *fe_builtin_signature(int i) { return i >= 0 && i < fe_builtin_count() ? builtins[i].sig : NULL; }

/* Edit distance of a and b (insertions, deletions, substitutions and
 * swaps of two neighbours count one each), or more than `most` once it
 * exceeds it. */
static int edit_distance(const char *a, const char *b, int most) {
  enum { MAXLEN = 64 };
  int n = (int)strlen(a), m = (int)strlen(b);
  if (n >= MAXLEN || m >= MAXLEN || abs(n - m) > most) return most + 1;
  int d[MAXLEN + 1][MAXLEN + 1];
  for (int i = 0; i <= n; i++) d[i][0] = i;
  for (int j = 0; j <= m; j++) d[0][j] = j;
  for (int i = 1; i <= n; i++)
    for (int j = 1; j <= m; j++) {
      int c = a[i - 1] != b[j - 1];
      int v = d[i - 1][j] + 1;
      if (d[i][j - 1] + 1 < v) v = d[i][j - 1] + 1;
      if (d[i - 1][j - 1] + c < v) v = d[i - 1][j - 1] + c;
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] && d[i - 2][j - 2] + 1 < v)
        v = d[i - 2][j - 2] + 1;
      d[i][j] = v;
    }
  return d[n][m];
}

/* The built-in or fn closest to an unknown name, if one is close (at most
 * one edit in four letters, at least one), else NULL. */
static const char *closest_function(Lower *L, const char *name) {
  int most = (int)strlen(name) / 4;
  if (most < 1) most = 1;
  const char *best = NULL;
  int bestd = most + 1;
  for (int i = 0; i < fe_builtin_count(); i++) {
    int d = edit_distance(name, builtins[i].name, most);
    if (d < bestd) {
      bestd = d;
      best = builtins[i].name;
    }
  }
  for (int i = 0; i < L->nfn_names; i++) {
    int d = edit_distance(name, L->fn_names[i], most);
    if (d < bestd) {
      bestd = d;
      best = L->fn_names[i];
    }
  }
  return best;
}

static int nparams_of(const Builtin *b) {
  int n = 0;
  while (n < MAX_PARAMS && b->params[n]) n++;
  return n;
}

/* Match a call's arguments to parameter names: slot[i] is the argument
 * node for parameter i, or NULL. */
static bool bind_args(Lower *L, const FeNode *call, const char *const *names, int nparams, int nreq,
                      const FeNode **slot) {
  for (int i = 0; i < nparams; i++) slot[i] = NULL;
  int npos = 0;
  while (npos < call->nitems && !call->kw[npos]) npos++;
  if (npos > nparams) {
    if (nreq == nparams)
      error_at(L, call->tok, "'%s' takes %d argument%s, got %d", call->name, nparams, nparams == 1 ? "" : "s", npos);
    else
      error_at(L, call->tok, "'%s' takes at most %d arguments, got %d", call->name, nparams, npos);
    return false;
  }
  for (int i = 0; i < npos; i++) slot[i] = call->items[i];
  for (int i = npos; i < call->nitems; i++) {
    const Token *kw = call->kw[i];
    int k = -1;
    for (int j = 0; j < nparams; j++)
      if ((size_t)kw->len == strlen(names[j]) && memcmp(kw->text, names[j], (size_t)kw->len) == 0) k = j;
    if (k < 0) {
      bool axis = false;
      for (int j = 0; j < nparams; j++) axis |= strcmp(names[j], "axis") == 0;
      error_at(L, kw, "'%s' has no argument named '%.*s'%s", call->name, kw->len, kw->text,
               axis && kw->len == 3 && memcmp(kw->text, "dim", 3) == 0 ? " (did you mean 'axis'?)" : "");
      return false;
    }
    if (slot[k]) {
      error_at(L, kw, "argument '%s' of '%s' is given twice", names[k], call->name);
      return false;
    }
    slot[k] = call->items[i];
  }
  for (int i = 0; i < nreq; i++)
    if (!slot[i]) {
      error_at(L, call->tok, "missing argument '%s' in call to '%s'", names[i], call->name);
      return false;
    }
  return true;
}

static Val call_builtin(Lower *L, const FeNode *call, const Builtin *b) {
  const FeNode *an[MAX_PARAMS];
  Val a[MAX_PARAMS];
  int np = nparams_of(b);
  if (!bind_args(L, call, b->params, np, b->nreq, an)) return vpoison();
  bool poisoned = false;
  for (int i = 0; i < np; i++) {
    a[i] = (Val){.kind = V_NONE};
    if (!an[i]) continue;
    EvalMode saved = L->mode;
    L->mode = i == b->shape_arg ? EV_SHAPE : EV_VALUE;
    /* dtype=f32: a type name, read as the string "f32" */
    IrDType dt;
    if (strcmp(b->params[i], "dtype") == 0 && an[i]->kind == FE_ND_NAME &&
        ir_dtype_parse(an[i]->name, strlen(an[i]->name), &dt))
      a[i] = (Val){.kind = V_STR, .s = an[i]->name};
    else
      a[i] = eval(L, an[i]);
    L->mode = saved;
    poisoned |= a[i].kind == V_POISON;
  }
  if (poisoned || L->stopped) return vpoison();
  return b->fn(L, call, b, a, an);
}

static void exec_stmts(Lower *L, const FeStmt *s);

/* Inline a user fn: bind its arguments in a fresh scope, run its body,
 * evaluate its return expression. */
static Val call_fn(Lower *L, const FeNode *call, const FeFn *fn) {
  for (int i = 0; i < L->nframes; i++)
    if (L->frames[i].fn == fn) {
      error_at(L, call->tok, "fn '%s' calls itself (recursion is not supported)", fn->id);
      return vpoison();
    }
  if (L->nframes == MAX_INLINE) {
    error_at(L, call->tok, "fn calls are nested too deeply (more than %d)", MAX_INLINE);
    return vpoison();
  }
  const FeNode **an = ARENA_ARRAY(L->tmp, const FeNode *, fn->nparams ? fn->nparams : 1);
  if (!bind_args(L, call, fn->param_ids, fn->nparams, fn->nparams, an)) return vpoison();
  StrMap scope;
  strmap_init(&scope);
  for (int i = 0; i < fn->nparams; i++) bind(L, &scope, fn->param_ids[i], eval(L, an[i]));
  StrMap *saved_vars = L->vars;
  EvalMode saved_mode = L->mode;
  L->vars = &scope;
  L->mode = EV_VALUE;
  L->frames[L->nframes++] = (Frame){fn, call->tok};
  exec_stmts(L, fn->body);
  Val r = eval(L, fn->ret);
  L->nframes--;
  L->vars = saved_vars;
  L->mode = saved_mode;
  strmap_free(&scope);
  return r;
}

static Val call(Lower *L, const FeNode *n) {
  const FeFn *fn = strmap_get(&L->fns, n->name);
  if (fn) return call_fn(L, n, fn);
  const Builtin *b = find_builtin(n->name);
  if (b) return call_builtin(L, n, b);
  const char *near = NULL;
  if (find_var(L->vars, n->name) || strmap_get(&L->decls, n->name))
    error_at(L, n->tok, "'%s' is not a function", n->name);
  else if ((near = closest_function(L, n->name)))
    error_at(L, n->tok, "unknown function '%s'; did you mean '%s'?", n->name, near);
  else
    error_at(L, n->tok, "unknown function '%s' (gradc help functions lists the built-ins)", n->name);
  return vpoison();
}

/* ---- indexing ---- */

/* One index or slice bound: a constant integer. */
static bool index_int(Lower *L, const FeNode *n, const char *what, int64_t *out) {
  Val v = eval(L, n);
  if (v.kind == V_POISON) return false;
  if (v.kind == V_INT) {
    *out = v.i;
    return true;
  }
  char buf[IR_TYPE_STR_MAX];
  error_at(L, n->begin, "%s must be a constant integer, got %s%s", what, kind_str(v, buf, sizeof buf),
           v.kind == V_TENSOR ? " (use embedding() to gather rows)" : "");
  return false;
}

/* x[items]: NumPy basic indexing.  One `slice` over all axes (left out
 * when everything is selected), then a `reshape` dropping the axes indexed
 * by an integer. */
static Val lower_index(Lower *L, const FeNode *n) {
  Val base = eval(L, n->lhs);
  if (base.kind == V_POISON) return base;
  char buf[IR_TYPE_STR_MAX];
  if (base.kind != V_TENSOR) {
    error_at(L, n->tok, "cannot index %s", kind_str(base, buf, sizeof buf));
    return vpoison();
  }
  const IrType *t = &base.t->type;
  int r = t->shape.rank, m = 0;
  const FeNode *ellipsis = NULL;
  for (int i = 0; i < n->nitems; i++) {
    if (n->items[i]->kind != FE_ND_ELLIPSIS) {
      m++;
    } else if (ellipsis) {
      error_at(L, n->items[i]->tok, "an index can have only one '...'");
      return vpoison();
    } else {
      ellipsis = n->items[i];
    }
  }
  if (m > r) {
    error_at(L, n->tok, "too many indices for %s: %d given", ir_type_str(t, buf, sizeof buf), m);
    return vpoison();
  }
  int64_t starts[IR_MAX_RANK], stops[IR_MAX_RANK], steps[IR_MAX_RANK], keep[IR_MAX_RANK];
  bool drop[IR_MAX_RANK];
  for (int k = 0; k < r; k++) {
    starts[k] = 0;
    stops[k] = t->shape.dim[k];
    steps[k] = 1;
    drop[k] = false;
  }
  int axis = 0;
  for (int i = 0; i < n->nitems; i++) {
    const FeNode *it = n->items[i];
    if (it->kind == FE_ND_ELLIPSIS) {
      axis += r - m;
      continue;
    }
    int64_t len = t->shape.dim[axis];
    if (it->kind == FE_ND_SLICE) {
      int64_t lo = 0, hi = len, step = 1;
      if (it->step) {
        if (!index_int(L, it->step, "a slice step", &step)) return vpoison();
        if (step < 1) {
          error_at(L, it->step->begin, "a slice step must be positive, got %lld", (long long)step);
          return vpoison();
        }
      }
      if (it->start && !index_int(L, it->start, "a slice bound", &lo)) return vpoison();
      if (it->stop && !index_int(L, it->stop, "a slice bound", &hi)) return vpoison();
      if (lo < 0) lo = lo < -len ? 0 : lo + len;
      if (hi < 0) hi = hi < -len ? 0 : hi + len;
      if (lo > len) lo = len;
      if (hi > len) hi = len;
      if (hi <= lo) {
        error_at(L, it->begin, "the slice selects nothing of axis %d (size %lld) of %s", axis, (long long)len,
                 ir_type_str(t, buf, sizeof buf));
        return vpoison();
      }
      starts[axis] = lo;
      stops[axis] = hi;
      steps[axis] = step;
    } else {
      int64_t ix;
      if (!index_int(L, it, "an index", &ix)) return vpoison();
      if (ix < -len || ix >= len) {
        error_at(L, it->begin, "index %lld is out of range for axis %d of %s", (long long)ix, axis,
                 ir_type_str(t, buf, sizeof buf));
        return vpoison();
      }
      if (ix < 0) ix += len;
      starts[axis] = ix;
      stops[axis] = ix + 1;
      drop[axis] = true;
    }
    axis++;
  }
  Val v = base;
  bool full = true, any_drop = false;
  for (int k = 0; k < r; k++) {
    full &= starts[k] == 0 && stops[k] == t->shape.dim[k] && steps[k] == 1;
    any_drop |= drop[k];
  }
  if (!full) {
    IrAttr at[3] = {ir_attr_ints("starts", starts, r), ir_attr_ints("stops", stops, r),
                    ir_attr_ints("steps", steps, r)};
    v = build(L, IR_OP_SLICE, &v.t, 1, at, 3, NULL, n->tok);
    if (v.kind != V_TENSOR) return vpoison();
  }
  if (any_drop) {
    int nk = 0;
    for (int k = 0; k < r; k++)
      if (!drop[k]) keep[nk++] = v.t->type.shape.dim[k];
    IrAttr at = ir_attr_ints("shape", keep, nk);
    v = build(L, IR_OP_RESHAPE, &v.t, 1, &at, 1, NULL, n->tok);
  }
  return v;
}

/* ---- expressions ---- */

static Arith arith_of(FeNodeKind k) {
  return k == FE_ND_ADD ? AR_ADD : k == FE_ND_SUB ? AR_SUB : k == FE_ND_MUL ? AR_MUL : k == FE_ND_DIV ? AR_DIV : AR_MATMUL;
}

static Val eval_pow(Lower *L, const FeNode *n) {
  Val x = eval(L, n->lhs), e = eval(L, n->rhs);
  if (x.kind == V_POISON || e.kind == V_POISON) return vpoison();
  char buf[IR_TYPE_STR_MAX];
  if (!is_num(e)) {
    error_at(L, n->rhs->begin, "the exponent of '**' must be a constant, got %s", kind_str(e, buf, sizeof buf));
    return vpoison();
  }
  if (!operand_ok(L, x, n->lhs, "**")) return vpoison();
  if (x.kind == V_INT && e.kind == V_INT && e.i >= 0) {
    bool ovf = false;
    int64_t r = ipow(x.i, e.i, &ovf);
    if (ovf) {
      error_at(L, n->tok, "integer overflow");
      return vpoison();
    }
    return vint(r);
  }
  if (is_num(x)) return vfloat(ir_scalar_unary(IR_OP_POW, num(x), num(e)));
  IrAttr at = ir_attr_float("exponent", num(e));
  return build(L, IR_OP_POW, &x.t, 1, &at, 1, NULL, n->tok);
}

static Val eval_neg(Lower *L, const FeNode *n) {
  Val x = eval(L, n->lhs);
  if (x.kind == V_POISON) return x;
  if (x.kind == V_INT) {
    if (x.i == INT64_MIN) {
      error_at(L, n->tok, "integer overflow");
      return vpoison();
    }
    return vint(-x.i);
  }
  if (x.kind == V_FLOAT) return vfloat(-x.f);
  if (!operand_ok(L, x, n->lhs, "-")) return vpoison();
  return build(L, IR_OP_NEG, &x.t, 1, NULL, 0, NULL, n->tok);
}

/* ---- comparisons and conditions (language v2) ---- */

static IrOpcode compare_opcode(FeNodeKind k) {
  return k == FE_ND_EQ ? IR_OP_EQ : k == FE_ND_NE ? IR_OP_NE : k == FE_ND_LT ? IR_OP_LT
       : k == FE_ND_LE ? IR_OP_LE : k == FE_ND_GT ? IR_OP_GT : IR_OP_GE;
}

/* a OP b for == != < <= > >=: numbers (and bools, for == and !=) compare at
 * compile time, exactly for integers; with a tensor it is the IR's
 * comparison (a bool tensor, broadcasting), numbers taking the tensor's
 * type. */
static Val eval_compare(Lower *L, const FeNode *n) {
  Val a = eval(L, n->lhs), b = eval(L, n->rhs);
  if (a.kind == V_POISON || b.kind == V_POISON) return vpoison();
  IrOpcode opc = compare_opcode(n->kind);
  char op[4];
  snprintf(op, sizeof op, "%.*s", n->tok->len, n->tok->text);
  bool eqne = opc == IR_OP_EQ || opc == IR_OP_NE;
  if (eqne && a.kind == V_BOOL && b.kind == V_BOOL) return vbool((a.i == b.i) == (opc == IR_OP_EQ));
  if (is_num(a) && is_num(b)) {
    if (a.kind == V_INT && b.kind == V_INT) {
      int c = a.i < b.i ? -1 : a.i > b.i;
      bool r = opc == IR_OP_EQ ? c == 0 : opc == IR_OP_NE ? c != 0 : opc == IR_OP_LT ? c < 0
             : opc == IR_OP_LE ? c <= 0 : opc == IR_OP_GT ? c > 0 : c >= 0;
      return vbool(r);
    }
    return vbool(ir_scalar_binary(opc, num(a), num(b)) != 0);
  }
  if (!operand_ok(L, a, n->lhs, op) || !operand_ok(L, b, n->rhs, op)) return vpoison();
  if (is_num(a)) a = materialize(L, a, const_dtype(b, a), n->lhs->tok);
  if (is_num(b)) b = materialize(L, b, const_dtype(a, b), n->rhs->tok);
  if (a.kind == V_POISON || b.kind == V_POISON) return vpoison();
  IrValue *args[2] = {a.t, b.t};
  return build(L, opc, args, 2, NULL, 0, NULL, n->tok);
}

/* A condition: a bool known at compile time. */
static bool need_cond(Lower *L, Val v, const FeNode *at, const char *what) {
  if (v.kind == V_BOOL) return true;
  char buf[IR_TYPE_STR_MAX];
  error_at(L, at->begin, "%s needs a condition known at compile time (a comparison of dims or numbers, true, false "
           "or training), got %s%s", what, kind_str(v, buf, sizeof buf),
           v.kind == V_TENSOR ? " (for a tensor use where(cond, a, b))" : "");
  return false;
}

/* and, or (short-circuit, as Python's), not */
static Val eval_logic(Lower *L, const FeNode *n) {
  const char *what = n->kind == FE_ND_AND ? "'and'" : n->kind == FE_ND_OR ? "'or'" : "'not'";
  Val a = eval(L, n->lhs);
  if (a.kind == V_POISON || !need_cond(L, a, n->lhs, what)) return vpoison();
  if (n->kind == FE_ND_NOT) return vbool(!a.i);
  if ((n->kind == FE_ND_AND && !a.i) || (n->kind == FE_ND_OR && a.i)) return a;
  Val b = eval(L, n->rhs);
  if (b.kind == V_POISON || !need_cond(L, b, n->rhs, what)) return vpoison();
  return b;
}

static Val eval(Lower *L, const FeNode *n) {
  if (!tick(L, n->tok)) return vpoison();
  switch (n->kind) {
  case FE_ND_INT: return vint(n->ival);
  case FE_ND_FLOAT: return vfloat(n->fval);
  case FE_ND_STR: return (Val){.kind = V_STR, .s = n->str};
  case FE_ND_BOOL: return (Val){.kind = V_BOOL, .i = n->ival};
  case FE_ND_NAME: return lookup(L, n);
  case FE_ND_LIST: {
    Val v = {.kind = V_LIST, .n = n->nitems};
    v.items = ARENA_ARRAY(L->tmp, Val, n->nitems ? n->nitems : 1);
    bool poisoned = false;
    for (int i = 0; i < n->nitems; i++) {
      v.items[i] = eval(L, n->items[i]);
      poisoned |= v.items[i].kind == V_POISON;
    }
    return poisoned ? vpoison() : v;
  }
  case FE_ND_ADD:
  case FE_ND_SUB:
  case FE_ND_MUL:
  case FE_ND_DIV:
  case FE_ND_MATMUL: {
    Val a = eval(L, n->lhs);
    Val b = eval(L, n->rhs);
    char op[4];
    snprintf(op, sizeof op, "%.*s", n->tok->len, n->tok->text);
    return arith(L, arith_of(n->kind), op, n->tok, a, n->lhs, b, n->rhs);
  }
  case FE_ND_NEG: return eval_neg(L, n);
  case FE_ND_POW: return eval_pow(L, n);
  case FE_ND_CALL: return call(L, n);
  case FE_ND_INDEX: return lower_index(L, n);
  case FE_ND_SLICE:
  case FE_ND_ELLIPSIS: error_at(L, n->tok, "a slice is only allowed inside an index"); return vpoison();
  case FE_ND_EQ:
  case FE_ND_NE:
  case FE_ND_LT:
  case FE_ND_LE:
  case FE_ND_GT:
  case FE_ND_GE: return eval_compare(L, n);
  case FE_ND_AND:
  case FE_ND_OR:
  case FE_ND_NOT: return eval_logic(L, n);
  case FE_ND_TUPLE: {
    Val *items = ARENA_ARRAY(L->tmp, Val, n->nitems);
    for (int i = 0; i < n->nitems; i++) {
      items[i] = eval(L, n->items[i]);
      if (items[i].kind == V_POISON) return vpoison();
      if (items[i].kind == V_TUPLE) {
        error_at(L, n->items[i]->begin, "a result cannot itself be several results");
        return vpoison();
      }
    }
    return vtuple(L, n->nitems, items);
  }
  }
  return vpoison();
}

/* ---- declarations ---- */

/* False (reported) if `id` cannot be declared now. */
static bool new_name_ok(Lower *L, const Token *t, const char *id) {
  Decl *dc = strmap_get(&L->decls, id);
  if (dc) {
    error_at(L, t, "'%s' is already declared as %s %s (line %d)", id, strcmp(dc->what, "input") == 0 ? "an" : "a",
             dc->what, dc->tok->line);
    return false;
  }
  if (find_var(&L->model_vars, id)) {
    error_at(L, t, "'%s' is already used as a variable", id);
    return false;
  }
  return true;
}

static Decl *add_decl(Lower *L, const FeStmt *s, const char *what) {
  Decl *dc = ARENA_NEW(L->tmp, Decl);
  dc->what = what;
  dc->tok = s->name;
  dc->v = vpoison();
  strmap_put(&L->decls, s->id, dc);
  return dc;
}

static IrLoc model_loc(Lower *L, const Token *t) {
  return (IrLoc){L->m->src.name, t->line, t->col};
}

/* batch NAME = EXPR | dim NAME = EXPR */
static void decl_dim(Lower *L, const FeStmt *s) {
  if (s->is_batch && L->m->batch) {
    Decl *prev = strmap_get(&L->decls, L->m->batch);
    error_at(L, s->tok, "a model has one batch dim ('%s' is declared at line %d)", L->m->batch, prev->tok->line);
    return;
  }
  if (!new_name_ok(L, s->name, s->id)) return;
  Decl *dc = add_decl(L, s, s->is_batch ? "batch dim" : "dim");
  dc->is_dim = true;
  dc->is_batch = s->is_batch;
  int64_t value = 0;
  bool found = false;
  for (int i = 0; i < L->opt->ndefs; i++)
    if (strcmp(L->opt->def_names[i], s->id) == 0) {
      value = L->opt->def_values[i];
      found = true;
    }
  if (found) {
    if (value <= 0) return; /* reported with the other -D checks */
  } else {
    L->mode = EV_DIM;
    dc->defining = true;
    Val v = eval(L, s->expr);
    dc->defining = false;
    L->mode = EV_VALUE;
    if (v.kind == V_POISON) return;
    char buf[IR_TYPE_STR_MAX];
    if (v.kind != V_INT) {
      error_at(L, s->expr->begin, "the size of '%s' must be an integer expression over dims, got %s", s->id,
               kind_str(v, buf, sizeof buf));
      return;
    }
    if (v.i <= 0 || v.i > MAX_DIM) {
      error_at(L, s->expr->begin, "the size of '%s' must be between 1 and %lld, got %lld", s->id,
               (long long)MAX_DIM, (long long)v.i);
      return;
    }
    value = v.i;
  }
  if (value > MAX_DIM) {
    error_at(L, s->name, "the size of '%s' must be between 1 and %lld, got %lld", s->id, (long long)MAX_DIM,
             (long long)value);
    return;
  }
  dc->value = value;
  dc->v = vint(value);
  FeModel *m = L->m;
  FeDim *d = &m->dims[m->ndims++];
  d->name = arena_strdup(&m->arena, s->id);
  d->value = value;
  d->is_batch = s->is_batch;
  d->loc = model_loc(L, s->name);
  if (s->is_batch) {
    m->batch = d->name;
    m->batch_window = value;
    int64_t k = (int64_t)L->opt->gas * L->opt->dp;
    m->batch_micro = value / k > 0 ? value / k : 1;
    if (value % k != 0) {
      if (L->opt->dp > 1)
        error_at(L, s->tok, "batch size %lld is not divisible by --gas %d times --dp %d (%lld)", (long long)value,
                 L->opt->gas, L->opt->dp, (long long)k);
      else
        error_at(L, s->tok, "batch size %lld is not divisible by --gas %d", (long long)value, L->opt->gas);
    }
  }
}

/* The type of an input or param: shapes are integer expressions over dims
 * in which the batch dim is the micro-batch size. */
static bool decl_type(Lower *L, const FeTypeSpec *ty, IrType *out) {
  out->dtype = ty->dtype;
  out->shape = ir_shape_scalar();
  out->shape.rank = ty->rank;
  int64_t numel = 1;
  for (int i = 0; i < ty->rank; i++) {
    L->mode = EV_SHAPE;
    Val v = eval(L, ty->shape[i]);
    L->mode = EV_VALUE;
    if (v.kind == V_POISON) return false;
    char buf[IR_TYPE_STR_MAX];
    if (v.kind != V_INT) {
      error_at(L, ty->shape[i]->begin, "a dimension must be an integer expression over dims, got %s",
               kind_str(v, buf, sizeof buf));
      return false;
    }
    if (v.i <= 0 || v.i > MAX_DIM) {
      error_at(L, ty->shape[i]->begin, "a dimension must be between 1 and %lld, got %lld", (long long)MAX_DIM,
               (long long)v.i);
      return false;
    }
    if (numel > MAX_NUMEL / v.i) {
      error_at(L, ty->tok, "tensor is too large (more than %lld elements)", (long long)MAX_NUMEL);
      return false;
    }
    numel *= v.i;
    out->shape.dim[i] = v.i;
  }
  return true;
}

/* input NAME : TYPE | param NAME : TYPE init ... split(N) | buffer NAME : TYPE init ... */
static void decl_tensor(Lower *L, const FeStmt *s) {
  bool is_buffer = s->kind == FE_ST_BUFFER, is_param = s->kind == FE_ST_PARAM || is_buffer;
  if (!new_name_ok(L, s->name, s->id)) return;
  Decl *dc = add_decl(L, s, is_buffer ? "buffer" : is_param ? "param" : "input");
  IrType ty;
  if (!decl_type(L, &s->type, &ty)) return;
  FeModel *m = L->m;
  char buf[IR_TYPE_STR_MAX];
  if (!is_param) {
    const FeNode *first = s->type.rank > 0 ? s->type.shape[0] : NULL;
    bool batched = first && first->kind == FE_ND_NAME && m->batch && strcmp(first->name, m->batch) == 0;
    IrValue *v = ir_func_add_arg(L->f, s->id, ty, IR_ARG_INPUT, batched);
    FeInput *in = &m->inputs[m->ninputs++];
    in->name = arena_strdup(&m->arena, s->id);
    in->type = ty;
    in->batched = batched;
    in->loc = model_loc(L, s->name);
    in->value = v;
    dc->v = vtensor(v);
    return;
  }
  if (!ir_dtype_is_float(ty.dtype)) {
    error_at(L, s->type.tok, "a %s must have a float type, not %s", dc->what, ir_type_str(&ty, buf, sizeof buf));
    return;
  }
  double ab[2] = {0, 0};
  for (int i = 0; i < 2 && s->init_args[i]; i++) {
    Val v = eval(L, s->init_args[i]);
    if (v.kind == V_POISON) return;
    if (!is_num(v)) {
      error_at(L, s->init_args[i]->begin, "an init argument must be a constant number, got %s",
               kind_str(v, buf, sizeof buf));
      return;
    }
    ab[i] = num(v);
    if (!isfinite(ab[i])) {
      error_at(L, s->init_args[i]->begin, "an init argument must be finite");
      return;
    }
  }
  if (s->init == FE_INIT_NORMAL && ab[1] < 0) {
    error_at(L, s->init_args[1]->begin, "the std of normal(mean, std) must not be negative");
    return;
  }
  if (s->init == FE_INIT_UNIFORM && ab[0] > ab[1]) {
    error_at(L, s->init_args[0]->begin, "uniform(lo, hi) needs lo <= hi");
    return;
  }
  int64_t split = -1;
  if (s->split) {
    Val v = eval(L, s->split);
    if (v.kind == V_POISON) return;
    if (v.kind != V_INT) {
      error_at(L, s->split->begin, "split(N) needs a constant integer axis, got %s", kind_str(v, buf, sizeof buf));
      return;
    }
    if (!axis_of(L, v.i, &ty, s->split->begin, &split)) return;
  }
  IrValue *v = ir_func_add_arg(L->f, s->id, ty, is_buffer ? IR_ARG_BUFFER : IR_ARG_PARAM, false);
  v->split_axis = (int)split;
  if (s->split) v->split_loc = loc_of(L, s->split->begin);
  FeParam *p = is_buffer ? &m->buffers[m->nbuffers++] : &m->params[m->nparams++];
  p->name = arena_strdup(&m->arena, s->id);
  p->type = ty;
  p->init = s->init_tok ? s->init : FE_INIT_ZEROS;
  p->a = ab[0];
  p->b = ab[1];
  p->split_axis = (int)split;
  p->loc = model_loc(L, s->name);
  p->value = v;
  dc->v = vtensor(v);
}

/* ---- statements ---- */

static void assign(Lower *L, const FeStmt *s) {
  Decl *dc = strmap_get(&L->decls, s->id);
  if (dc && dc->is_dim) {
    error_at(L, s->name, "cannot assign to %s '%s'", dc->what, s->id);
    return;
  }
  Val v = eval(L, s->expr);
  if (v.kind == V_TUPLE) {
    error_at(L, s->name, "the right side gives %d results, but one name is bound (write '%s, ... = ...')", v.n,
             s->id);
    v = vpoison();
  }
  name_value(L, v, s->id);
  bind(L, L->vars, s->id, v);
}

/* NAME, NAME, ... = EXPR: EXPR gives as many results as there are names.
 * A built-in with several results returns a V_TUPLE (see the built-in
 * table); so does a fn that ends in `return a, b`. */
static void assign_multi(Lower *L, const FeStmt *s) {
  for (int i = 0; i < s->nnames; i++) {
    Decl *dc = strmap_get(&L->decls, s->ids[i]);
    if (dc && dc->is_dim) {
      error_at(L, s->names[i], "cannot assign to %s '%s'", dc->what, s->ids[i]);
      return;
    }
  }
  Val v = eval(L, s->expr);
  if (v.kind != V_POISON && (v.kind != V_TUPLE || v.n != s->nnames)) {
    if (v.kind == V_TUPLE)
      error_at(L, s->tok, "the right side gives %d results, but %d names are bound", v.n, s->nnames);
    else
      error_at(L, s->tok, "the right side gives one result, but %d names are bound", s->nnames);
    v = vpoison();
  }
  for (int i = 0; i < s->nnames; i++) {
    Val x = v.kind == V_TUPLE ? v.items[i] : vpoison();
    name_value(L, x, s->ids[i]);
    bind(L, L->vars, s->ids[i], x);
  }
}

static void loss(Lower *L, const FeStmt *s) {
  if (strcmp(s->id, "total") == 0) {
    error_at(L, s->name, "'total' is reserved for the sum of all losses");
    return;
  }
  for (int i = 0; i < L->nlosses; i++)
    if (strcmp(L->losses[i], s->id) == 0) {
      error_at(L, s->name, "duplicate loss '%s' (first defined at line %d)", s->id, L->loss_toks[i]->line);
      return;
    }
  Decl *dc = strmap_get(&L->decls, s->id);
  if (dc && dc->is_dim) {
    error_at(L, s->name, "cannot assign to %s '%s'", dc->what, s->id);
    return;
  }
  if (L->nlosses == L->caplosses) {
    L->caplosses = L->caplosses ? 2 * L->caplosses : 8;
    const char **nl = ARENA_ARRAY(L->tmp, const char *, L->caplosses);
    const Token **nt = ARENA_ARRAY(L->tmp, const Token *, L->caplosses);
    if (L->nlosses) {
      memcpy(nl, L->losses, sizeof(*nl) * (size_t)L->nlosses);
      memcpy(nt, L->loss_toks, sizeof(*nt) * (size_t)L->nlosses);
    }
    L->losses = nl;
    L->loss_toks = nt;
  }
  L->losses[L->nlosses] = s->id;
  L->loss_toks[L->nlosses++] = s->name;
  Val v = eval(L, s->expr);
  if (is_num(v)) v = materialize(L, v, IR_DT_F32, s->expr->tok);
  bind(L, L->vars, s->id, v);
  if (v.kind == V_POISON) return;
  char buf[IR_TYPE_STR_MAX];
  if (v.kind != V_TENSOR || v.t->type.shape.rank != 0 || !ir_dtype_is_float(v.t->type.dtype)) {
    error_at(L, s->expr->begin, "loss '%s' must be a float scalar, got %s", s->id, kind_str(v, buf, sizeof buf));
    bind(L, L->vars, s->id, vpoison());
    return;
  }
  name_value(L, v, s->id);
  IrAttr at = ir_attr_str("name", s->id);
  build(L, IR_OP_LOSS, &v.t, 1, &at, 1, NULL, s->tok);
}

/* ---- language v2 statements ---- */

/* A name's first statement of a kind (update, output): false (reported) if
 * it has one already. */
static bool first_of(Lower *L, StrMap *seen, const FeStmt *s, const char *what, const char ***order, int *n) {
  const Token *prev = strmap_get(seen, s->id);
  if (prev) {
    error_at(L, s->name, "duplicate %s '%s' (first at line %d)", what, s->id, prev->line);
    return false;
  }
  strmap_put(seen, s->id, (void *)s->name);
  const char **grown = ARENA_ARRAY(L->tmp, const char *, *n + 1);
  if (*n) memcpy(grown, *order, sizeof(char *) * (size_t)*n);
  grown[(*n)++] = s->id;
  *order = grown;
  return true;
}

/* update NAME = EXPR: the buffer's value after the window (training only:
 * with no_training the statement is checked but emits nothing).  EXPR
 * reads the buffers' old values; gas-fold makes its batch reductions
 * window reductions. */
static void update_stmt(Lower *L, const FeStmt *s) {
  Decl *dc = strmap_get(&L->decls, s->id);
  if (!dc || strcmp(dc->what, "buffer") != 0) {
    if (dc)
      error_at(L, s->name, "'%s' is %s %s, not a buffer (only buffers are updated)", s->id,
               strcmp(dc->what, "input") == 0 ? "an" : "a", dc->what);
    else
      error_at(L, s->name, "'%s' is not a buffer (declare it with 'buffer %s : TYPE')", s->id, s->id);
    return;
  }
  if (!first_of(L, &L->updates, s, "update of buffer", &L->update_order, &L->nupdates)) return;
  Val v = eval(L, s->expr);
  if (v.kind == V_POISON || dc->v.kind != V_TENSOR) return;
  const IrType *bt = &dc->v.t->type;
  if (is_num(v)) v = materialize(L, v, bt->dtype, s->expr->tok);
  char b1[IR_TYPE_STR_MAX], b2[IR_TYPE_STR_MAX];
  IrShape out;
  if (v.kind != V_TENSOR || v.t->type.dtype != bt->dtype ||
      !ir_broadcast_shapes(&v.t->type.shape, &bt->shape, &out) || !ir_shape_eq(&out, &bt->shape)) {
    error_at(L, s->expr->begin, "update of buffer '%s' (%s) gives %s", s->id, ir_type_str(bt, b1, sizeof b1),
             kind_str(v, b2, sizeof b2));
    return;
  }
  if (!ir_shape_eq(&v.t->type.shape, &bt->shape)) {
    IrAttr at = ir_attr_ints("shape", bt->shape.dim, bt->shape.rank);
    v = build(L, IR_OP_BROADCAST, &v.t, 1, &at, 1, NULL, s->expr->tok);
    if (v.kind != V_TENSOR) return;
  }
  if (L->opt->no_training) return;
  IrAttr at = ir_attr_str("name", s->id);
  build(L, IR_OP_UPDATE, &v.t, 1, &at, 1, NULL, s->tok);
}

/* output NAME = EXPR: a tensor the forward computes; NAME is also bound. */
static void output_stmt(Lower *L, const FeStmt *s) {
  Decl *dc = strmap_get(&L->decls, s->id);
  if (dc && dc->is_dim) {
    error_at(L, s->name, "cannot assign to %s '%s'", dc->what, s->id);
    return;
  }
  if (!first_of(L, &L->outputs, s, "output", &L->output_order, &L->noutputs)) return;
  Val v = eval(L, s->expr);
  if (is_num(v)) v = materialize(L, v, IR_DT_F32, s->expr->tok);
  if (v.kind != V_POISON && v.kind != V_TENSOR) {
    char buf[IR_TYPE_STR_MAX];
    error_at(L, s->expr->begin, "output '%s' must be a tensor, got %s", s->id, kind_str(v, buf, sizeof buf));
    v = vpoison();
  }
  name_value(L, v, s->id);
  bind(L, L->vars, s->id, v);
  if (v.kind != V_TENSOR || L->opt->no_outputs) return;
  IrAttr at = ir_attr_str("name", s->id);
  build(L, IR_OP_OUTPUT, &v.t, 1, &at, 1, NULL, s->tok);
}

static void poison_bound(Lower *L, const FeStmt *s);

/* if COND { .. } else { .. }: resolved now; only the taken branch is
 * lowered (the other is not checked: it may be ill-shaped for these dims).
 * If the condition is bad, the names either branch binds are poisoned, so
 * that one mistake gives one message. */
static void if_stmt(Lower *L, const FeStmt *s) {
  Val c = eval(L, s->expr);
  if (c.kind == V_POISON || !need_cond(L, c, s->expr, "'if'")) {
    poison_bound(L, s->body);
    poison_bound(L, s->orelse);
    return;
  }
  exec_stmts(L, c.i ? s->body : s->orelse);
}

static void poison_bound(Lower *L, const FeStmt *s) {
  for (; s; s = s->next) {
    switch (s->kind) {
    case FE_ST_ASSIGN:
    case FE_ST_LOSS:
    case FE_ST_OUTPUT: bind(L, L->vars, s->id, vpoison()); break;
    case FE_ST_MULTI:
      for (int i = 0; i < s->nnames; i++) bind(L, L->vars, s->ids[i], vpoison());
      break;
    case FE_ST_IF:
      poison_bound(L, s->body);
      poison_bound(L, s->orelse);
      break;
    case FE_ST_FOR: poison_bound(L, s->body); break;
    case FE_ST_DIM:
    case FE_ST_INPUT:
    case FE_ST_PARAM:
    case FE_ST_BUFFER:
    case FE_ST_UPDATE: break;
    }
  }
}

static void for_loop(Lower *L, const FeStmt *s) {
  Val from = eval(L, s->from), to = eval(L, s->to);
  if (from.kind == V_POISON || to.kind == V_POISON) return;
  char buf[IR_TYPE_STR_MAX];
  if (from.kind != V_INT || to.kind != V_INT) {
    const FeNode *bad = from.kind != V_INT ? s->from : s->to;
    error_at(L, bad->begin, "a for range needs constant integer bounds, got %s",
             kind_str(from.kind != V_INT ? from : to, buf, sizeof buf));
    return;
  }
  Decl *dc = strmap_get(&L->decls, s->id);
  if (dc && dc->is_dim) {
    error_at(L, s->name, "the loop variable '%s' would hide the %s '%s'", s->id, dc->what, s->id);
    return;
  }
  if (to.i > from.i && (to.i - from.i > MAX_TRIP || to.i - from.i < 0)) {
    error_at(L, s->tok, "the loop runs too many times (more than %d)", MAX_TRIP);
    return;
  }
  Val *slot = strmap_get(L->vars, s->id);
  Val saved = slot ? *slot : (Val){.kind = V_NONE};
  for (int64_t i = from.i; i < to.i && !L->stopped; i++) {
    bind(L, L->vars, s->id, vint(i));
    exec_stmts(L, s->body);
  }
  if (to.i > from.i) bind(L, L->vars, s->id, saved);
}

static void exec_stmts(Lower *L, const FeStmt *s) {
  for (; s && !L->stopped; s = s->next) {
    if (!tick(L, s->tok)) return;
    switch (s->kind) {
    case FE_ST_DIM: decl_dim(L, s); break;
    case FE_ST_INPUT:
    case FE_ST_PARAM:
    case FE_ST_BUFFER: decl_tensor(L, s); break;
    case FE_ST_ASSIGN: assign(L, s); break;
    case FE_ST_LOSS: loss(L, s); break;
    case FE_ST_FOR: for_loop(L, s); break;
    case FE_ST_UPDATE: update_stmt(L, s); break;
    case FE_ST_OUTPUT: output_stmt(L, s); break;
    case FE_ST_IF: if_stmt(L, s); break;
    case FE_ST_MULTI: assign_multi(L, s); break;
    }
  }
}

/* ---- the model ---- */

/* -D overrides must name a dim and be positive (reported before the model's
 * own errors, as `gradc: error:`). */
static void check_defs(Lower *L, const FeProgram *prog) {
  for (int i = 0; i < L->opt->ndefs; i++) {
    const char *name = L->opt->def_names[i];
    bool found = false;
    for (const FeStmt *s = prog->body; s; s = s->next)
      if (s->kind == FE_ST_DIM && strcmp(s->id, name) == 0) found = true;
    if (!found) {
      diag_plain(L->d, DIAG_ERROR, "-D %s: no dim named %s", name, name);
      L->failed = true;
    } else if (L->opt->def_values[i] <= 0 || L->opt->def_values[i] > MAX_DIM) {
      diag_plain(L->d, DIAG_ERROR, "-D %s=%lld: a dim must be between 1 and %lld", name,
                 (long long)L->opt->def_values[i], (long long)MAX_DIM);
      L->failed = true;
    }
  }
}

static void register_fns(Lower *L, const FeProgram *prog) {
  L->fn_names = ARENA_ARRAY(L->tmp, const char *, prog->nfns + 1);
  for (const FeFn *fn = prog->fns; fn; fn = fn->next) {
    if (L->nfn_names < prog->nfns) L->fn_names[L->nfn_names++] = fn->id;
    const FeFn *prev = strmap_get(&L->fns, fn->id);
    if (find_builtin(fn->id))
      error_at(L, fn->name, "'%s' is a built-in function and cannot be redefined", fn->id);
    else if (prev)
      error_at(L, fn->name, "fn '%s' is already defined (line %d)", fn->id, prev->name->line);
    else
      strmap_put(&L->fns, fn->id, (void *)fn);
  }
}

void fe_model_free(FeModel *m) {
  if (!m) return;
  ir_func_free(m->func);
  arena_free(&m->arena);
  free(m);
}

FeModel *fe_model_compile(const SrcFile *src, const FeOptions *opt, Diag *d) {
  FeOptions defaults = {.gas = 1, .dp = 1};
  if (!opt) opt = &defaults;
  if (opt->gas < 1 || opt->dp < 1) {
    diag_plain(d, DIAG_ERROR, "%s must be at least 1", opt->gas < 1 ? "--gas" : "--dp");
    return NULL;
  }
  Arena tmp;
  arena_init(&tmp);
  Token *toks;
  bool lex_failed;
  lex_tokenize_checked(src, &tmp, d, &toks, &lex_failed);
  FeProgram *prog = lex_failed ? NULL : parse_program(src, toks, &tmp, d);
  if (!prog) {
    arena_free(&tmp);
    return NULL;
  }

  FeModel *m = calloc(1, sizeof *m);
  if (!m) abort();
  arena_init(&m->arena);
  m->src = *src;
  m->src.name = arena_strdup(&m->arena, src->name ? src->name : "<input>");
  m->name = arena_strdup(&m->arena, prog->id);
  m->func = ir_func_new(prog->id);
  int ndims = 0, ninputs = 0, nparams = 0, nbuffers = 0;
  for (const FeStmt *s = prog->body; s; s = s->next) {
    ndims += s->kind == FE_ST_DIM;
    ninputs += s->kind == FE_ST_INPUT;
    nparams += s->kind == FE_ST_PARAM;
    nbuffers += s->kind == FE_ST_BUFFER;
  }
  m->dims = ARENA_ARRAY(&m->arena, FeDim, ndims ? ndims : 1);
  m->inputs = ARENA_ARRAY(&m->arena, FeInput, ninputs ? ninputs : 1);
  m->params = ARENA_ARRAY(&m->arena, FeParam, nparams ? nparams : 1);
  m->buffers = ARENA_ARRAY(&m->arena, FeParam, nbuffers ? nbuffers : 1);

  Lower L;
  memset(&L, 0, sizeof L);
  L.src = src;
  L.file = m->src.name;
  L.d = d;
  L.opt = opt;
  L.tmp = &tmp;
  L.m = m;
  L.f = m->func;
  L.vars = &L.model_vars;
  L.body = prog->body;
  check_defs(&L, prog);
  register_fns(&L, prog);
  exec_stmts(&L, prog->body);
  if (!L.failed && L.nlosses == 0)
    error_at(&L, prog->name, "model '%s' has no loss (add a 'loss NAME = EXPR' statement)", prog->id);

  m->losses = ARENA_ARRAY(&m->arena, const char *, L.nlosses ? L.nlosses : 1);
  for (int i = 0; i < L.nlosses; i++) m->losses[i] = arena_strdup(&m->arena, L.losses[i]);
  m->nlosses = L.nlosses;
  m->outputs = ARENA_ARRAY(&m->arena, const char *, L.noutputs ? L.noutputs : 1);
  for (int i = 0; !opt->no_outputs && i < L.noutputs; i++) m->outputs[i] = arena_strdup(&m->arena, L.output_order[i]);
  m->noutputs = opt->no_outputs ? 0 : L.noutputs;
  /* Updates emitted (none when not training). */
  m->updates = ARENA_ARRAY(&m->arena, const char *, L.nupdates ? L.nupdates : 1);
  for (int i = 0; !opt->no_training && i < L.nupdates; i++) m->updates[i] = arena_strdup(&m->arena, L.update_order[i]);
  m->nupdates = opt->no_training ? 0 : L.nupdates;
  strmap_free(&L.outputs);
  strmap_free(&L.updates);
  strmap_free(&L.decls);
  strmap_free(&L.fns);
  strmap_free(&L.reported);
  strmap_free(&L.model_vars);
  arena_free(&tmp);
  if (L.failed) {
    fe_model_free(m);
    return NULL;
  }
  return m;
}
