/* cuda_gen.h - internal to the CUDA code generator (codegen/cuda*.c): the
 * state of the kernel being written and the helpers the emitters share.
 *
 * Values live in registers of their "register type" (f32, bf16 and f16 as
 * float, rounded to their precision after every op; f64 as double; i32 as
 * int; bool as bool); memory holds the "memory type" (bf16_t and f16_t
 * are 16-bit patterns, bool is unsigned char; gradient buffers float, or
 * double for f64).  Expressions are strings allocated in the kernel's
 * arena. */
#ifndef GRADC_CUDA_GEN_H
#define GRADC_CUDA_GEN_H

#include "cuda.h"

typedef struct CuGen {
  const IrFunc *f;
  Arena *a;          /* strings of this kernel (the module's arena) */
  StrBuf body;       /* the function body being written */
  int indent;        /* in levels of two spaces */
  CuParam *params;   /* pointer arguments, in order of registration */
  const char **pname;
  int nparams, capparams;
  int nin, nout;     /* for the names in0.., out0.. */
  unsigned block[2]; /* launch geometry chosen by the emitter */
  int64_t grid;
  const char *how;   /* one line for the comment: how the kernel runs */
  char *err;
  size_t errlen;
  bool failed;
} CuGen;

/* cuda_ops.c */
/* The first error wins; emission goes on harmlessly, the caller checks g->failed. */
void cu_error(CuGen *g, const char *fmt, ...) GRADC_PRINTF(2, 3);
/* One indented line of the body. */
void cu_line(CuGen *g, const char *fmt, ...) GRADC_PRINTF(2, 3);
const char *cu_fmt(CuGen *g, const char *fmt, ...) GRADC_PRINTF(2, 3); /* in the arena */

/* The pointer argument for (v, elem), registered on first use; out: the
 * kernel writes it.  Returns its C name ("in2", "out0"). */
const char *cu_param(CuGen *g, const IrValue *v, int64_t elem, bool out);

const char *cu_reg_type(IrDType dt);
const char *cu_mem_type(IrDType dt, bool grad);
const char *cu_acc_type(IrDType dt); /* sums: float for f32/bf16/f16, double, int */
/* A literal of dt's register type (rounded to bf16/f16 as a value of that type). */
const char *cu_lit(CuGen *g, IrDType dt, double v);
/* An element of memory (an lvalue of dt's memory type) as a register. */
const char *cu_load(CuGen *g, IrDType dt, bool grad, const char *lvalue);
/* The statement storing register x into lvalue (accumulating into a gradient buffer). */
void cu_store(CuGen *g, IrDType dt, bool grad, const char *lvalue, const char *x);
/* x (a float register) rounded to dt's precision: bf16 and f16; others unchanged. */
const char *cu_round(CuGen *g, IrDType dt, const char *x);
/* Convert a register of type `from` to `to` (the interpreter's cast). */
const char *cu_convert(CuGen *g, const char *x, IrDType from, IrDType to);
/* An elementwise op (kernel.c's elementwise set, broadcast, grad.seed,
 * loss.term, mse_loss "none") on operand expressions, rounded to its dtype. */
const char *cu_elementwise(CuGen *g, const IrOp *op, const char *const *x);
/* The identity of a max reduction of dt (-inf, or INT_MIN). */
const char *cu_lowest(CuGen *g, IrDType dt);
/* exp, log, sqrt of a register of dt's register type. */
const char *cu_math1(CuGen *g, const char *fn, IrDType dt, const char *x);

/* The expression sum_a coord_a(i) * stride[a] where i (an expression)
 * runs over dims[0..n) row-major; axes of extent 1 or stride 0 are
 * skipped, contiguous runs merged. */
/* The draw of a `random` op for element e (an expression of its index in
 * the op's result), state the rng.state pointer: a call of the prelude's
 * rand_* helpers, in the result's register type. */
const char *cu_random(CuGen *g, const IrOp *op, const char *state, const char *e);
const char *cu_index(CuGen *g, const char *i, const int64_t *dims, const int64_t *stride, int n);

/* a + b, dropping a "0" term. */
const char *cu_add(CuGen *g, const char *a, const char *b);

/* The prelude every program starts with. */
extern const char cu_prelude[];

/* cuda_row.c: a row kernel (ops[0..n) over layout l) into g. */
void cu_row_kernel(CuGen *g, IrOp **ops, int n, const KpRowLayout *l);
/* cuda_loop.c: a kernel of one op that does not fit rows. */
void cu_loop_kernel(CuGen *g, const IrOp *op);

#endif
