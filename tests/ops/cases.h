/* cases.h - one op case: an op of ir/ops.def applied to operands of given
 * types and values, with its attributes.  The table of them is cases.c;
 * test_ops.c runs every row on every back end against the reference
 * interpreter and checks its derivative by finite differences.
 *
 * Operands, one token each, separated by spaces:
 *   f32[5,37]    normal values (scale 1)        f32[]       a scalar
 *   f32[5,37]+   positive: 0.25 + |normal|       f32[5,37]~  -1, 0 or 1 (many ties)
 *   i32[4,9]     integers in [-2, 2]             i32[4,9]!0  the same, never 0
 *   i32[2,5]<13  integers in [0, 13) (indices)   bool[4,9]   0 or 1
 *   f32=3        a scalar constant 3 (a `const` op feeding the case's op)
 * Attributes, IR text style: `axes=[0,2] keepdim=true eps=1e-5
 * reduction=mean`; a number with `.` or `e` is a float attribute.
 * Result: the result type where the op takes it from the builder rather
 * than its shape rule (cast: "f64", the operand's shape; one_hot:
 * "f32[2,5,13]"), else NULL. */
#ifndef GRADC_TEST_OPS_CASES_H
#define GRADC_TEST_OPS_CASES_H

#include "ir/ir.h"

/* Edge values written over the random ones (applied to one operand). */
typedef enum {
  OE_NONE,
  OE_SPECIAL, /* operand 0, rows of the last axis: row 0 NaN, 1e30, -1e30, -0;
                 row 1 +inf and -inf; row 2 all -inf */
  OE_LARGE,   /* operand 0 scaled by 40: exp overflows, tanh/sigmoid saturate */
  OE_LOWP,    /* operand 0: an f16 subnormal, a value beyond f16's range, a tiny negative */
  OE_IGNORE,  /* the index operand: every fourth target is ignore_index=-100 */
  OE_ALL_IGNORED, /* the index operand: every target is -100 */
  OE_REPEAT,  /* the index operand: rows repeat (scatter-add collisions) */
  OE_INTDIV,  /* operand 0 [0] = -7, operand 1 [0] = -1: truncating division */
} OpEdge;

/* Where a row runs (all by default). */
enum {
  OC_NO_GRAD = 1,      /* no finite-difference check (ill-conditioned at these values) */
  OC_GRAD_SOFTMAX = 2, /* checked as softmax(op(...), axis=-1): its -inf entries have no finite
                          difference, as in attention */
};

typedef struct OpCase {
  IrOpcode op;
  const char *operands;
  const char *attrs;  /* NULL: none */
  const char *result; /* NULL: the shape rule's */
  OpEdge edge;
  int flags;
  const char *note; /* what the row is for, printed with a failure */
} OpCase;

extern const OpCase op_cases[];
extern const int op_ncases;

/* Ops with no row, each with its reason (test_ops fails on an op that has
 * neither a row nor an entry here). */
typedef struct OpExclusion {
  IrOpcode op;
  const char *why;
} OpExclusion;

extern const OpExclusion op_exclusions[];
extern const int op_nexclusions;

#endif
