/* ir.h - the tensor IR: types, values, ops, functions, and the module's
 * exports (builder, shape rules, printer, reader, verifier, DOT writer).
 *
 * An IrFunc is an SSA graph: every value is defined once, by an op or as a
 * function argument; ops are kept in a list in which every definition comes
 * before its uses.  Every op produces zero or one result.  Everything a
 * function owns lives in its arena and is freed with it. */
#ifndef GRADC_IR_H
#define GRADC_IR_H

#include <string.h>

#include "support/support.h"

/* ------------------------------------------------------------------ */
/* Types                                                               */
/* ------------------------------------------------------------------ */
typedef enum {
  IR_DT_F32,
  IR_DT_F64,
  IR_DT_BF16,
  IR_DT_F16,
  IR_DT_I32,
  IR_DT_BOOL,
} IrDType;
#define IR_DT_COUNT 6

#define IR_MAX_RANK 8
typedef struct IrShape {
  int rank;
  int64_t dim[IR_MAX_RANK];
} IrShape;

typedef struct IrType {
  IrDType dtype;
  IrShape shape;
} IrType;

const char *ir_dtype_name(IrDType dt);            /* "f32" */
bool ir_dtype_parse(const char *s, size_t n, IrDType *out);
bool ir_dtype_is_float(IrDType dt);
size_t ir_dtype_size(IrDType dt);                 /* bytes per element */
int64_t ir_numel(const IrShape *s);
bool ir_shape_eq(const IrShape *a, const IrShape *b);
bool ir_type_eq(const IrType *a, const IrType *b);
IrShape ir_shape_make(int rank, const int64_t *dims);
IrShape ir_shape_scalar(void);
/* "f32[8,12]" / "f32" for a scalar, into buf (returns buf). */
char *ir_type_str(const IrType *t, char *buf, size_t n);
#define IR_TYPE_STR_MAX 160

/* ------------------------------------------------------------------ */
/* Ops                                                                 */
/* ------------------------------------------------------------------ */
typedef enum {
#define OP(id, name, arity, kind, family, shape, grad, flags) IR_OP_##id,
#include "ops.def"
#undef OP
} IrOpcode;
enum {
  IR_OP_COUNT = 0
#define OP(id, name, arity, kind, family, shape, grad, flags) +1
#include "ops.def"
#undef OP
};

typedef enum {
  IR_KIND_ELEMENTWISE,
  IR_KIND_CONST,
  IR_KIND_REDUCE,
  IR_KIND_MOVEMENT,
  IR_KIND_GEMM,
  IR_KIND_NN,
  IR_KIND_WINDOW,
  IR_KIND_COLLECTIVE,
  IR_KIND_OUTPUT,
} IrOpKind;
#define IR_KIND_COUNT 9

/* Op properties: one bit per kind, then the flags column of ops.def (each
 * flag is described there).  Ask with ir_op_is. */
typedef enum {
  IR_OPF_ELEMENTWISE = 1 << IR_KIND_ELEMENTWISE,
  IR_OPF_CONST = 1 << IR_KIND_CONST,
  IR_OPF_REDUCE = 1 << IR_KIND_REDUCE,
  IR_OPF_MOVEMENT = 1 << IR_KIND_MOVEMENT,
  IR_OPF_GEMM = 1 << IR_KIND_GEMM,
  IR_OPF_NN = 1 << IR_KIND_NN,
  IR_OPF_WINDOW = 1 << IR_KIND_WINDOW,
  IR_OPF_COLLECTIVE = 1 << IR_KIND_COLLECTIVE,
  IR_OPF_OUTPUT = 1 << IR_KIND_OUTPUT,
  IR_OPF_UNARY = 1 << (IR_KIND_COUNT + 0),
  IR_OPF_BINARY = 1 << (IR_KIND_COUNT + 1),
  IR_OPF_COMPARE = 1 << (IR_KIND_COUNT + 2),
  IR_OPF_FOLD = 1 << (IR_KIND_COUNT + 3),
  IR_OPF_HINT = 1 << (IR_KIND_COUNT + 4),
  IR_OPF_POINT = 1 << (IR_KIND_COUNT + 5),
  IR_OPF_ROW = 1 << (IR_KIND_COUNT + 6),
  IR_OPF_RED = 1 << (IR_KIND_COUNT + 7),
  IR_OPF_EXEC = 1 << (IR_KIND_COUNT + 8),
  IR_OPF_VIEW = 1 << (IR_KIND_COUNT + 9),
  IR_OPF_START = 1 << (IR_KIND_COUNT + 10),
  IR_OPF_WAIT = 1 << (IR_KIND_COUNT + 11),
  IR_OPF_RANKCOPY = 1 << (IR_KIND_COUNT + 12),
  IR_OPF_OPAQUE = 1 << (IR_KIND_COUNT + 13),
  IR_OPF_COSTLY = 1 << (IR_KIND_COUNT + 14),
} IrOpFlag;
#define IR_OPF_NFLAGS (IR_KIND_COUNT + 15)

/* The family column of ops.def (described there): ops that rules treat
 * alike within their kind. */
typedef enum {
  IR_FAMILY_NONE,
  IR_FAMILY_UNARY,
  IR_FAMILY_NORM,
} IrOpFamily;

typedef struct IrOpInfo {
  const char *name;
  int arity; /* -1: variadic */
  IrOpKind kind;
  unsigned flags; /* IrOpFlag bits: the kind's and the flags column's */
  IrOpFamily family;
} IrOpInfo;

extern const IrOpInfo ir_op_info[IR_OP_COUNT];
bool ir_opcode_parse(const char *s, size_t n, IrOpcode *out);
/* Does opc have any of the properties in `flags` (IrOpFlag bits, or-ed)?
 * ir_op_is(opc, IR_OPF_VIEW), ir_op_is(opc, IR_OPF_WINDOW | IR_OPF_OUTPUT). */
bool ir_op_is(IrOpcode opc, unsigned flags);

/* Case labels from the table.  IR_CASES(K) expands to `case IR_OP_A:
 * case IR_OP_B: ...` for every op whose kind or family column is K (kinds
 * and families have distinct names), so a switch over IrOpcode names a
 * kind or a family instead of its ops, and -Wswitch-enum still checks
 * that it covers every op:
 *
 *   case IR_OP_SELECT: return rule_select(...);
 *   IR_CASES(UNARY) return rule_map(...);
 *
 * How: IR_CASES(K) runs IR_OPS with IR_CASE_K_, which passes each row's
 * column through IR_IS_K_<column>.  That name is defined only for a match,
 * as `~, IR_CASE_YES`; otherwise it stays one undefined name, so the second
 * item of `IR_IS_K_<column>, IR_CASE_NO, ~` is IR_CASE_YES for a match and
 * IR_CASE_NO for the rest.  A new kind or family adds its two lines below. */
#define IR_CASES(K) IR_OPS(IR_CASE_##K##_)
#define IR_CASE_YES(opc) case opc:
#define IR_CASE_NO(opc)
#define IR_CASE_2ND_(a, b, ...) b
#define IR_CASE_2ND(...) IR_CASE_2ND_(__VA_ARGS__)
#define IR_CASE_IF(is, opc) IR_CASE_2ND(is, IR_CASE_NO, ~)(opc)
/* Kinds. */
#define IR_CASE_ELEMENTWISE_(id, nm, ar, kind, ...) IR_CASE_IF(IR_IS_ELEMENTWISE_##kind, IR_OP_##id)
#define IR_CASE_CONST_(id, nm, ar, kind, ...) IR_CASE_IF(IR_IS_CONST_##kind, IR_OP_##id)
#define IR_CASE_REDUCE_(id, nm, ar, kind, ...) IR_CASE_IF(IR_IS_REDUCE_##kind, IR_OP_##id)
#define IR_CASE_MOVEMENT_(id, nm, ar, kind, ...) IR_CASE_IF(IR_IS_MOVEMENT_##kind, IR_OP_##id)
#define IR_CASE_GEMM_(id, nm, ar, kind, ...) IR_CASE_IF(IR_IS_GEMM_##kind, IR_OP_##id)
#define IR_CASE_NN_(id, nm, ar, kind, ...) IR_CASE_IF(IR_IS_NN_##kind, IR_OP_##id)
#define IR_CASE_WINDOW_(id, nm, ar, kind, ...) IR_CASE_IF(IR_IS_WINDOW_##kind, IR_OP_##id)
#define IR_CASE_COLLECTIVE_(id, nm, ar, kind, ...) IR_CASE_IF(IR_IS_COLLECTIVE_##kind, IR_OP_##id)
#define IR_CASE_OUTPUT_(id, nm, ar, kind, ...) IR_CASE_IF(IR_IS_OUTPUT_##kind, IR_OP_##id)
#define IR_IS_ELEMENTWISE_ELEMENTWISE ~, IR_CASE_YES
#define IR_IS_CONST_CONST ~, IR_CASE_YES
#define IR_IS_REDUCE_REDUCE ~, IR_CASE_YES
#define IR_IS_MOVEMENT_MOVEMENT ~, IR_CASE_YES
#define IR_IS_GEMM_GEMM ~, IR_CASE_YES
#define IR_IS_NN_NN ~, IR_CASE_YES
#define IR_IS_WINDOW_WINDOW ~, IR_CASE_YES
#define IR_IS_COLLECTIVE_COLLECTIVE ~, IR_CASE_YES
#define IR_IS_OUTPUT_OUTPUT ~, IR_CASE_YES
/* Families (NONE has none: those ops are named one by one). */
#define IR_CASE_UNARY_(id, nm, ar, kind, fam, ...) IR_CASE_IF(IR_IS_UNARY_##fam, IR_OP_##id)
#define IR_CASE_NORM_(id, nm, ar, kind, fam, ...) IR_CASE_IF(IR_IS_NORM_##fam, IR_OP_##id)
#define IR_IS_UNARY_UNARY ~, IR_CASE_YES
#define IR_IS_NORM_NORM ~, IR_CASE_YES

/* Attributes: small key/value pairs on ops, printed as {key=value, ...}. */
typedef enum {
  IR_ATTR_INT,
  IR_ATTR_FLOAT,
  IR_ATTR_BOOL,
  IR_ATTR_STR,
  IR_ATTR_INTS,
} IrAttrKind;

typedef struct IrAttr {
  const char *key;
  IrAttrKind kind;
  int64_t i;     /* INT, BOOL */
  double f;      /* FLOAT */
  const char *s; /* STR */
  const int64_t *ints; /* INTS */
  int n;               /* INTS: count */
} IrAttr;

IrAttr ir_attr_int(const char *key, int64_t v);
IrAttr ir_attr_float(const char *key, double v);
IrAttr ir_attr_bool(const char *key, bool v);
IrAttr ir_attr_str(const char *key, const char *s);
IrAttr ir_attr_ints(const char *key, const int64_t *v, int n);

typedef struct IrLoc {
  const char *file; /* NULL: unknown location */
  int line, col;
} IrLoc;

typedef enum {
  IR_ARG_INPUT,
  IR_ARG_PARAM,
  IR_ARG_BUFFER, /* non-trainable state: read like a param, never a gradient (`buffer` statements) */
} IrArgRole;

typedef struct IrOp IrOp;

/* Where a value lives once `memplan` has run (docs/BACKEND.md). */
typedef enum {
  IR_STORE_NONE,  /* not planned (before memplan), or never materialised (inline consts) */
  IR_STORE_ARENA, /* a buffer in the step's arena at `offset`, reused when dead */
  IR_STORE_GRAD,  /* the persistent f32/f64 gradient buffer at `offset`: writes accumulate (+=) */
  IR_STORE_ALIAS, /* shares its operand's bytes (a reshape of a contiguous buffer) at `offset` */
} IrStorage;

typedef struct IrValue {
  int id;           /* index into func->values */
  IrType type;
  const char *name; /* name from the source (`logits`), or NULL: numbered when printed */
  IrOp *def;        /* defining op; NULL for function arguments */
  /* Function arguments only: */
  IrArgRole role;
  bool batched;     /* input whose first axis is the batch axis (split into micro-batches) */
  int split_axis;   /* param: the split(N) annotation (tensor parallelism), -1 if none */
  int split_ranks;  /* param: set by `shard`: the value is this rank's 1/split_ranks of the
                       declared tensor along split_axis (0 or 1: the whole tensor) */
  IrLoc split_loc;  /* param: where the annotation is, for errors (file NULL if unknown) */
  /* Set by `memplan` (see docs/BACKEND.md): */
  IrStorage storage;
  int64_t offset;   /* byte offset in the arena (IR_STORE_ARENA, IR_STORE_GRAD, IR_STORE_ALIAS) */
} IrValue;

struct IrOp {
  IrOpcode opcode;
  IrValue **args; /* operands */
  int nargs;
  IrValue *result; /* NULL for outputs (loss, grad) */
  IrAttr *attrs;
  int nattrs;
  IrLoc loc;
  int group; /* kernel id set by `fuse` (>= 1), 0 = not in a kernel; a
                kernel's ops are contiguous in the op list */
  int mark;  /* scratch for passes; no meaning between passes */
};

typedef struct IrFunc {
  Arena arena;
  const char *name;
  IrValue **args; /* inputs, params and buffers, in declaration order */
  int nargs, capargs;
  IrOp **ops;     /* in an order where definitions precede uses */
  int nops, capops;
  IrValue **values; /* every value (args and results), by id */
  int nvalues, capvalues;
  int64_t arena_size;   /* set by memplan: bytes of the step's arena (0 before) */
  int64_t persist_size; /* set by memplan: bytes at the arena's start that live across
                           micro-batches (args, gradient buffers); the rest is reused */
} IrFunc;

/* ------------------------------------------------------------------ */
/* ir.c: functions, values, attributes                                 */
/* ------------------------------------------------------------------ */
IrFunc *ir_func_new(const char *name);
void ir_func_free(IrFunc *f);
IrValue *ir_func_add_arg(IrFunc *f, const char *name, IrType type, IrArgRole role, bool batched);
IrValue *ir_func_find_arg(const IrFunc *f, const char *name);

const IrAttr *ir_attr_get(const IrOp *op, const char *key);
/* Whether key is an attribute of the IR (ops.def's IR_ATTR_KEYS). */
bool ir_attr_known(const char *key);
int64_t ir_attr_get_int(const IrOp *op, const char *key, int64_t def); /* INT or BOOL */
double ir_attr_get_float(const IrOp *op, const char *key, double def); /* FLOAT or INT */
const char *ir_attr_get_str(const IrOp *op, const char *key, const char *def);
/* INTS: returns the count and sets *out (NULL, 0 when absent). */
int ir_attr_get_ints(const IrOp *op, const char *key, const int64_t **out);
/* The eps of an op of family NORM (ops.def).  The shape rule requires the
 * attribute, so every built, read or verified op has it; the frontend
 * writes the language's defaults (frontend/lower.c). */
double ir_op_eps(const IrOp *op);

/* Remove ops with mark != 0, keeping the order of the rest. */
void ir_func_remove_marked(IrFunc *f);
/* Replace every use of `from` by `to` in all ops. */
void ir_replace_uses(IrFunc *f, IrValue *from, IrValue *to);
/* Reorder ops so that every definition precedes its uses, keeping the
 * existing order wherever it is already valid.  Returns false on a cycle. */
bool ir_func_topo_sort(IrFunc *f);
/* Count uses of each value: out[value->id] (array of f->nvalues ints, caller-owned). */
void ir_count_uses(const IrFunc *f, int *out);

/* ------------------------------------------------------------------ */
/* build.c: creating ops                                               */
/* ------------------------------------------------------------------ */
/* Append an op at the end of f.  The result type comes from the op's shape
 * rule; `hint` gives it where the rule needs one (const, cast) and, when not
 * NULL for other ops, must agree with the inferred type.  Attributes and the
 * operand array are copied into the function's arena.  On a type or shape
 * error nothing is added, NULL is returned and `err` holds a message that
 * names the concrete shapes ("f32[8,12] @ f32[20,24]: inner dimensions ...").
 */
IrOp *ir_build(IrFunc *f, IrOpcode opc, IrValue *const *args, int nargs, const IrAttr *attrs, int nattrs,
               const IrType *hint, IrLoc loc, char *err, size_t errlen);
/* As ir_build, for passes: a failure is an internal error (assert). */
IrValue *ir_emit(IrFunc *f, IrOpcode opc, IrValue *const *args, int nargs, const IrAttr *attrs, int nattrs,
                 const IrType *hint, IrLoc loc);

/* Shorthands over ir_emit. */
IrValue *ir_unary(IrFunc *f, IrOpcode opc, IrValue *x, IrLoc loc);
IrValue *ir_binary(IrFunc *f, IrOpcode opc, IrValue *a, IrValue *b, IrLoc loc);
IrValue *ir_select(IrFunc *f, IrValue *cond, IrValue *a, IrValue *b, IrLoc loc);
IrValue *ir_const(IrFunc *f, double v, IrDType dt, IrLoc loc); /* scalar */
IrValue *ir_const_shaped(IrFunc *f, double v, IrType t, IrLoc loc);
IrValue *ir_reduce(IrFunc *f, IrOpcode opc, IrValue *x, const int64_t *axes, int naxes, bool keepdim, IrLoc loc);
IrValue *ir_reshape(IrFunc *f, IrValue *x, IrShape s, IrLoc loc);
IrValue *ir_broadcast(IrFunc *f, IrValue *x, IrShape s, IrLoc loc);
IrValue *ir_permute(IrFunc *f, IrValue *x, const int64_t *perm, IrLoc loc);
IrValue *ir_cast(IrFunc *f, IrValue *x, IrDType dt, IrLoc loc);
IrValue *ir_matmul(IrFunc *f, IrValue *a, IrValue *b, IrLoc loc);
/* Sum x over its broadcast axes so that it has shape s (the inverse of
 * broadcasting s to x's shape): the gradient of a broadcast operand. */
IrValue *ir_sum_to(IrFunc *f, IrValue *x, IrShape s, IrLoc loc);

/* ------------------------------------------------------------------ */
/* shapes.c: shape rules, one per `shape` column of ops.def             */
/* ------------------------------------------------------------------ */
/* Fill *out with the result type of `op` (operands and attributes set);
 * hint as for ir_build.  On error write a message to err and return false. */
typedef bool (*IrShapeFn)(const IrOp *op, const IrType *hint, IrType *out, char *err, size_t errlen);
bool ir_infer_type(const IrOp *op, const IrType *hint, IrType *out, char *err, size_t errlen);
/* NumPy broadcasting of two shapes; false if they do not broadcast. */
bool ir_broadcast_shapes(const IrShape *a, const IrShape *b, IrShape *out);
/* Normalise a possibly negative axis for rank r; false if out of range. */
bool ir_norm_axis(int64_t axis, int rank, int64_t *out);

/* The geometry of patches / patches_grad (ops.def): d spatial axes, the
 * last d of the image, after `lead` others (outer elements in all);
 * in/out: each spatial axis's size in the image and in the output
 * positions; cols the patches' shape [lead..., K..., O...]; value the
 * padding's value (patches).  False with a message naming the shapes when
 * an attribute is missing or wrong or a kernel is larger than its padded
 * axis. */
typedef struct IrPatches {
  int d, lead;
  int64_t kernel[IR_MAX_RANK], stride[IR_MAX_RANK], padding[IR_MAX_RANK], dilation[IR_MAX_RANK];
  int64_t in[IR_MAX_RANK], out[IR_MAX_RANK];
  int64_t outer;
  IrShape image, cols;
  double value;
} IrPatches;
bool ir_patches_geom(const IrOp *op, IrPatches *g, char *err, size_t errlen);

/* ------------------------------------------------------------------ */
/* scalar.c: the elementwise ops on one element, rounding to a dtype   */
/* ------------------------------------------------------------------ */
/* What the interpreter computes for one element, in f64 (PyTorch's
 * semantics); constant folding uses the same functions.  opc must have
 * IR_OPF_UNARY; p is pow's exponent, unused by the others; cast is the
 * identity here (ir_scalar_cast converts). */
double ir_scalar_unary(IrOpcode opc, double x, double p);
/* The same with op's attributes: pow's exponent, clamp's min and max
 * (ir_scalar_unary treats clamp as having neither bound). */
double ir_scalar_unary_op(const IrOp *op, double x);
/* opc must have IR_OPF_BINARY or IR_OPF_COMPARE (a comparison gives 1 or 0). */
double ir_scalar_binary(IrOpcode opc, double a, double b);
/* cast's value for a result of dtype `to`, before rounding: i32 toward
 * zero (a NaN or infinity gives 0), bool 1 or 0, floats unchanged. */
double ir_scalar_cast(double x, IrDType to);
/* x rounded to dt: f32 by a C cast, bf16/f16 to nearest even with
 * subnormals and overflow to infinity, i32 toward zero, bool to 1 or 0. */
double ir_round_dtype(double x, IrDType dt);
/* ir_round_dtype of each of x[0..n), in place (the dtype's case chosen
 * once, not per element: the interpreter's loops). */
void ir_round_dtype_n(double *x, int64_t n, IrDType dt);

/* The same roundings on f32 values, as bits, for the runtime's bulk loops
 * (the executor's low-precision GEMMs, params and inputs converted into an
 * arena): bf16/f16 bits of an f32, to nearest even (NaN quiet, overflow to
 * infinity, f16 subnormals), and back, exactly.  For an f32 x they give
 * ir_round_dtype's value: test_mixed and test_ir check them against it. */
static inline uint32_t ir_f32_bits(float x) {
  uint32_t u;
  memcpy(&u, &x, 4);
  return u;
}
static inline float ir_bits_f32(uint32_t u) {
  float x;
  memcpy(&x, &u, 4);
  return x;
}
static inline uint16_t ir_f32_to_bf16(float x) {
  uint32_t u = ir_f32_bits(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
  return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1)) >> 16);
}
static inline float ir_bf16_to_f32(uint16_t h) { return ir_bits_f32((uint32_t)h << 16); }
static inline float ir_f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ff;
  if (e == 0x1f) return ir_bits_f32(sign | 0x7f800000u | (m << 13));
  if (e == 0) return sign ? -(float)m * 0x1p-24f : (float)m * 0x1p-24f; /* zero and subnormals, exact */
  return ir_bits_f32(sign | ((e + 112) << 23) | (m << 13));
}
static inline uint16_t ir_f32_to_f16(float x) {
  uint32_t u = ir_f32_bits(x), sign = (u >> 16) & 0x8000, a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00);
  if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00); /* rounds to 65536 or more: inf */
  if (a < 0x38800000u) {                                   /* below 2^-14: a subnormal (or zero) */
    float f = ir_bits_f32(a) * 0x1p24f;                    /* exact; the f32 add below rounds to even */
    return (uint16_t)(sign | (uint32_t)(f + 0x1p23f - 0x1p23f));
  }
  uint32_t r = a + 0xfffu + ((a >> 13) & 1); /* to nearest even at bit 13 */
  return (uint16_t)(sign | ((r - 0x38000000u) >> 13));
}

/* ------------------------------------------------------------------ */
/* random.c: counter-based random draws (Philox-4x32-10)               */
/* ------------------------------------------------------------------ */
/* rng.state's words (a run-time i32[4] the executor writes each
 * micro-batch): key (the seed's low and high 32 bits), the optimiser
 * step's low 32 bits, the window index of the micro-batch's first sample. */
#define IR_RNG_WORDS 4
/* 2 pi, the double nearest it (Box-Muller's angle). */
#define IR_RANDOM_TWO_PI 6.283185307179586
/* One Philox-4x32-10 block: out = philox(ctr, key). */
void ir_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]);
/* A `random` op's attributes: whether its first axis is the batch axis
 * (batched=true), and the elements of one sample (the whole tensor when not
 * batched). */
bool ir_random_batched(const IrOp *op);
int64_t ir_random_per_sample(const IrOp *op);
/* The four words element e (row-major in op's result) draws:
 * philox(ctr = (e mod per, base + e / per, step, key), key = seed), with
 * ctr[0] = e, ctr[1] = 0 for a draw that is not batched. */
void ir_random_bits(const IrOp *op, const uint32_t state[IR_RNG_WORDS], int64_t e, uint32_t out[4]);
/* The words as a value of dtype dt (f32 or f64): uniform in [0, 1) from the
 * top 24 bits of w[0] (f32) or 53 bits of w[0], w[1] (f64); normal by
 * Box-Muller in f64 from 53 bits each of (w[0], w[1]) and (w[2], w[3]),
 * rounded to dt. */
double ir_random_value(bool normal, IrDType dt, const uint32_t w[4]);
/* The stable id of a random op: its line and column (16 bits each), xor
 * the number of earlier random ops lowered from the same location (a `for`
 * body, an inlined `fn`) times Philox's first Weyl constant. */
uint32_t ir_random_key(int line, int col, int occurrence);

/* ------------------------------------------------------------------ */
/* print.c: the text form (round-trips through read.c)                 */
/* ------------------------------------------------------------------ */
void ir_print(const IrFunc *f, StrBuf *out);
void ir_print_file(const IrFunc *f, FILE *out);
/* Names used by the printer: value name or number, made unique ("x", "x.1"). */
typedef struct IrNames {
  const char **name; /* by value id, without the % */
} IrNames;
void ir_names_init(IrNames *n, const IrFunc *f, Arena *a);
/* One op as it appears in the text form (without newline); for messages. */
void ir_print_op(const IrFunc *f, const IrNames *names, const IrOp *op, StrBuf *out);

/* ------------------------------------------------------------------ */
/* read.c: parse the text form                                         */
/* ------------------------------------------------------------------ */
/* Parse IR text.  Errors go to d as `file:line:col: error:` with a caret;
 * returns NULL if there was any. */
IrFunc *ir_read(const SrcFile *src, Diag *d);

/* ------------------------------------------------------------------ */
/* verify.c                                                            */
/* ------------------------------------------------------------------ */
/* Check SSA dominance, arity, attribute presence, operand/result types
 * (re-running the shape rules) and id consistency.  Writes the first
 * problem to err and returns false. */
bool ir_verify(const IrFunc *f, char *err, size_t errlen);

/* ------------------------------------------------------------------ */
/* dot.c                                                               */
/* ------------------------------------------------------------------ */
void ir_write_dot(const IrFunc *f, FILE *out);

#endif
