/* cases.c - the op-case table: every op of ir/ops.def that a back end
 * generates a kernel for, on the shapes, dtypes, attributes and edge values
 * that exercise its code paths (the operand and attribute syntax is in
 * cases.h).  Each row runs on the CPU (LLVM) and under the CUDA emulator
 * against the reference interpreter, one kernel per op and fused with the
 * rows that share its operands; rows of an op with a derivative are
 * checked against finite differences in f64.
 *
 * Adding an op: a row here (tests/README.md, "Adding an op"). */
#include "cases.h"

#define N OE_NONE

/* Shapes used throughout: [5,37] (a row not a multiple of any vector
 * width), [37] and [5,1] broadcast along and across it. */
#define X "f32[5,37]"
#define D "f64[5,37]"

const OpCase op_cases[] = {
    /* op, operands, attributes, result, edge, flags, note */

    /* ---- elementwise, one operand ---- */
    {IR_OP_NEG, X, NULL, NULL, N, 0, NULL},
    {IR_OP_NEG, D, NULL, NULL, N, 0, NULL},
    {IR_OP_NEG, "i32[4,9]", NULL, NULL, N, 0, "integers"},
    {IR_OP_EXP, X, NULL, NULL, N, 0, NULL},
    {IR_OP_EXP, D, NULL, NULL, N, 0, NULL},
    {IR_OP_EXP, "f32[3,8]", NULL, NULL, OE_SPECIAL, 0, "NaN and infinities"},
    {IR_OP_EXP, X, NULL, NULL, OE_LARGE, OC_NO_GRAD, "overflow to inf, underflow to 0"},
    {IR_OP_EXP, "bf16[4,33]", NULL, NULL, OE_LOWP, 0, NULL},
    {IR_OP_EXP, "f16[4,33]", NULL, NULL, OE_LOWP, 0, NULL},
    {IR_OP_LOG, X "+", NULL, NULL, N, 0, NULL},
    {IR_OP_LOG, D "+", NULL, NULL, N, 0, NULL},
    {IR_OP_SQRT, X "+", NULL, NULL, N, 0, NULL},
    {IR_OP_SQRT, D "+", NULL, NULL, N, 0, NULL},
    {IR_OP_RSQRT, X "+", NULL, NULL, N, 0, NULL},
    {IR_OP_RSQRT, D "+", NULL, NULL, N, 0, NULL},
    {IR_OP_TANH, X, NULL, NULL, N, 0, NULL},
    {IR_OP_TANH, D, NULL, NULL, N, 0, NULL},
    {IR_OP_TANH, "f32[3,8]", NULL, NULL, OE_SPECIAL, 0, "NaN and infinities"},
    {IR_OP_TANH, X, NULL, NULL, OE_LARGE, OC_NO_GRAD, "saturation"},
    {IR_OP_SIGMOID, X, NULL, NULL, N, 0, NULL},
    {IR_OP_SIGMOID, D, NULL, NULL, N, 0, NULL},
    {IR_OP_SIGMOID, "f32[3,8]", NULL, NULL, OE_SPECIAL, 0, "NaN and infinities"},
    {IR_OP_SIGMOID, X, NULL, NULL, OE_LARGE, OC_NO_GRAD, "saturation"},
    {IR_OP_RELU, X, NULL, NULL, N, 0, NULL},
    {IR_OP_RELU, D, NULL, NULL, N, 0, NULL},
    {IR_OP_RELU, "f32[3,8]", NULL, NULL, OE_SPECIAL, 0, "relu(NaN) is NaN, relu(-0)"},
    {IR_OP_GELU, X, NULL, NULL, N, 0, NULL},
    {IR_OP_GELU, D, NULL, NULL, N, 0, NULL},
    {IR_OP_GELU, "f32[3,8]", NULL, NULL, OE_SPECIAL, 0, "NaN and infinities"},
    {IR_OP_GELU, "bf16[4,33]", NULL, NULL, OE_LOWP, 0, NULL},
    {IR_OP_GELU, "f16[4,33]", NULL, NULL, OE_LOWP, 0, NULL},
    {IR_OP_SILU, X, NULL, NULL, N, 0, NULL},
    {IR_OP_SILU, D, NULL, NULL, N, 0, NULL},
    {IR_OP_ABS, X, NULL, NULL, N, 0, NULL},
    {IR_OP_ABS, D, NULL, NULL, N, 0, NULL},
    {IR_OP_ABS, "i32[4,9]", NULL, NULL, N, 0, "integers"},
    {IR_OP_SIGN, X, NULL, NULL, N, 0, NULL},
    {IR_OP_SIGN, D, NULL, NULL, N, 0, NULL},
    {IR_OP_SIGN, "f32[3,8]", NULL, NULL, OE_SPECIAL, 0, "sign(NaN), sign(-0)"},
    {IR_OP_SIGN, "i32[4,9]", NULL, NULL, N, 0, "integers"},
    {IR_OP_POW, X "+", "exponent=2.0", NULL, N, 0, NULL},
    {IR_OP_POW, X "+", "exponent=3.0", NULL, N, 0, NULL},
    {IR_OP_POW, X "+", "exponent=0.5", NULL, N, 0, "sqrt"},
    {IR_OP_POW, X "+", "exponent=-1.5", NULL, N, 0, NULL},
    {IR_OP_POW, X "+", "exponent=1.0", NULL, N, 0, NULL},
    {IR_OP_POW, X, "exponent=2.0", NULL, N, 0, "negative bases"},
    {IR_OP_POW, D "+", "exponent=2.0", NULL, N, 0, NULL},
    {IR_OP_POW, D "+", "exponent=3.0", NULL, N, 0, NULL},
    {IR_OP_POW, D "+", "exponent=0.5", NULL, N, 0, NULL},
    {IR_OP_POW, D "+", "exponent=-1.5", NULL, N, 0, NULL},
    {IR_OP_POW, D "+", "exponent=1.0", NULL, N, 0, NULL},
    {IR_OP_POW, D, "exponent=2.0", NULL, N, 0, "negative bases"},
    {IR_OP_GELU_GRAD, X, NULL, NULL, N, 0, NULL},
    {IR_OP_GELU_GRAD, D, NULL, NULL, N, 0, NULL},
    {IR_OP_DETACH, X, NULL, NULL, N, 0, NULL},
    {IR_OP_DETACH, D, NULL, NULL, N, 0, NULL},
    {IR_OP_DETACH, "bool[4,9]", NULL, NULL, N, 0, "booleans"},

    /* the same at small ranks and a unit axis (and their derivatives) */
#define UNARY_SHAPES(OP, DIST)                                                                                         \
  {OP, "f64[5]" DIST, NULL, NULL, N, 0, NULL}, {OP, "f64[2,3]" DIST, NULL, NULL, N, 0, NULL},                          \
      {OP, "f64[2,1,3]" DIST, NULL, NULL, N, 0, "a unit axis"}
    UNARY_SHAPES(IR_OP_NEG, ""),
    UNARY_SHAPES(IR_OP_EXP, ""),
    UNARY_SHAPES(IR_OP_LOG, "+"),
    UNARY_SHAPES(IR_OP_SQRT, "+"),
    UNARY_SHAPES(IR_OP_RSQRT, "+"),
    UNARY_SHAPES(IR_OP_TANH, ""),
    UNARY_SHAPES(IR_OP_SIGMOID, ""),
    UNARY_SHAPES(IR_OP_RELU, ""),
    UNARY_SHAPES(IR_OP_GELU, ""),
    UNARY_SHAPES(IR_OP_SILU, ""),
    UNARY_SHAPES(IR_OP_ABS, ""),
    {IR_OP_POW, "f64[2,3]+", "exponent=-2.0", NULL, N, 0, NULL},

    /* ---- casts ---- */
    {IR_OP_CAST, X, NULL, "f64", N, 0, NULL},
    {IR_OP_CAST, D, NULL, "f32", N, 0, NULL},
    {IR_OP_CAST, X, NULL, "i32", N, 0, "truncation toward zero"},
    {IR_OP_CAST, D, NULL, "i32", N, 0, NULL},
    {IR_OP_CAST, X, NULL, "i32", OE_LARGE, 0, "larger integers"},
    {IR_OP_CAST, "i32[4,9]", NULL, "f32", N, 0, NULL},
    {IR_OP_CAST, "i32[4,9]", NULL, "f64", N, 0, NULL},
    {IR_OP_CAST, "i32[4,9]", NULL, "bool", N, 0, NULL},
    {IR_OP_CAST, "bool[4,9]", NULL, "i32", N, 0, NULL},
    {IR_OP_CAST, "bool[5,37]", NULL, "f32", N, 0, NULL},
    {IR_OP_CAST, "bool[5,37]", NULL, "f64", N, 0, NULL},
    {IR_OP_CAST, X "~", NULL, "bool", N, 0, "zero and nonzero"},
    {IR_OP_CAST, D "~", NULL, "bool", N, 0, NULL},
    {IR_OP_CAST, "f32[3,8]", NULL, "bool", OE_SPECIAL, 0, "NaN is true, -0 false"},
    {IR_OP_CAST, X, NULL, "f32", N, 0, "to its own type"},
    {IR_OP_CAST, "bf16[4,33]", NULL, "f32", OE_LOWP, 0, NULL},
    {IR_OP_CAST, "f16[4,33]", NULL, "f32", OE_LOWP, 0, NULL},
    {IR_OP_CAST, "f32[4,33]", NULL, "bf16", OE_LOWP, 0, "rounding to nearest even"},
    {IR_OP_CAST, "f32[4,33]", NULL, "f16", OE_LOWP, 0, "subnormal and overflow"},

    /* ---- elementwise, two operands: same shape, broadcast over rows,
     * along a row, outer; integers; constants ---- */
#define BINARY(OP)                                                                                                     \
  {OP, X " " X, NULL, NULL, N, 0, NULL}, {OP, X " f32[37]", NULL, NULL, N, 0, "broadcast over rows"},                  \
      {OP, "f32[5,1] " X, NULL, NULL, N, 0, "broadcast along the row"},                                                \
      {OP, "f32[5,1] f32[37]", NULL, NULL, N, 0, "outer"}, {OP, D " " D, NULL, NULL, N, 0, NULL},                      \
      {OP, D " f64[37]", NULL, NULL, N, 0, NULL}, {OP, "f64[5,1] " D, NULL, NULL, N, 0, NULL},                         \
      {OP, "f64[5,1] f64[37]", NULL, NULL, N, 0, NULL}
    BINARY(IR_OP_ADD),
    BINARY(IR_OP_SUB),
    BINARY(IR_OP_MUL),
    BINARY(IR_OP_MAXIMUM),
    BINARY(IR_OP_MINIMUM),
    /* broadcasting both ways, across ranks, against a scalar */
#define BINARY_SHAPES(OP, B)                                                                                           \
  {OP, "f64[2,3] f64[2,3]" B, NULL, NULL, N, 0, NULL}, {OP, "f64[3,1,4] f64[5,4]" B, NULL, NULL, N, 0, NULL},          \
      {OP, "f64[4] f64[2,3,4]" B, NULL, NULL, N, 0, NULL}, {OP, "f64[2,3] f64[]" B, NULL, NULL, N, 0, "a scalar"},     \
      {OP, "f64[1,3] f64[2,1]" B, NULL, NULL, N, 0, "both broadcast"}
    BINARY_SHAPES(IR_OP_ADD, ""),
    BINARY_SHAPES(IR_OP_SUB, ""),
    BINARY_SHAPES(IR_OP_MUL, ""),
    BINARY_SHAPES(IR_OP_DIV, "+"),
    BINARY_SHAPES(IR_OP_MAXIMUM, ""),
    BINARY_SHAPES(IR_OP_MINIMUM, ""),
    /* division by normal values (near zero: large quotients) ... */
    {IR_OP_DIV, X " " X, NULL, NULL, N, OC_NO_GRAD, NULL},
    {IR_OP_DIV, D " " D, NULL, NULL, N, OC_NO_GRAD, NULL},
    {IR_OP_DIV, X " f32[37]", NULL, NULL, N, OC_NO_GRAD, NULL},
    /* ... and by positive ones */
    {IR_OP_DIV, X " f32[37]+", NULL, NULL, N, 0, "broadcast over rows"},
    {IR_OP_DIV, "f32[5,1] " X "+", NULL, NULL, N, 0, "broadcast along the row"},
    {IR_OP_DIV, "f32[5,1] f32[37]+", NULL, NULL, N, 0, "outer"},
    {IR_OP_DIV, "f64[5,1] f64[37]+", NULL, NULL, N, 0, NULL},
    {IR_OP_DIV, D " f64[37]", NULL, NULL, N, OC_NO_GRAD, NULL},
    {IR_OP_DIV, "f64[5,1] " D, NULL, NULL, N, OC_NO_GRAD, NULL},
    {IR_OP_DIV, "f32[5,1] " X, NULL, NULL, N, OC_NO_GRAD, NULL},
    {IR_OP_DIV, "f32[5,1] f32[37]", NULL, NULL, N, OC_NO_GRAD, NULL},
    {IR_OP_ADD, X " f32=0.25", NULL, NULL, N, 0, "a constant operand"},
    {IR_OP_MUL, D " f64=3", NULL, NULL, N, 0, "a constant operand"},
    {IR_OP_MAXIMUM, X "~ f32[37]~", NULL, NULL, N, 0, "ties"},
    {IR_OP_MINIMUM, X "~ f32[37]~", NULL, NULL, N, 0, "ties"},
    {IR_OP_MAXIMUM, "f32[3,8] f32[3,8]", NULL, NULL, OE_SPECIAL, 0, "NaN propagates"},
    {IR_OP_MINIMUM, "f32[3,8] f32[3,8]", NULL, NULL, OE_SPECIAL, 0, "NaN propagates"},
    {IR_OP_ADD, "bf16[4,33] bf16[4,33]", NULL, NULL, OE_LOWP, 0, NULL},
    {IR_OP_ADD, "f16[4,33] f16[4,33]", NULL, NULL, OE_LOWP, 0, NULL},
    {IR_OP_MUL, "bf16[4,33] bf16[4,33]", NULL, NULL, OE_LOWP, 0, NULL},
    {IR_OP_MUL, "f16[4,33] f16[4,33]", NULL, NULL, OE_LOWP, 0, NULL},
    {IR_OP_ADD, "i32[4,9] i32[4,9]", NULL, NULL, N, 0, "integers"},
    {IR_OP_SUB, "i32[4,9] i32[4,9]", NULL, NULL, N, 0, "integers"},
    {IR_OP_MUL, "i32[4,9] i32[4,9]", NULL, NULL, N, 0, "integers"},
    {IR_OP_DIV, "i32[4,9] i32[4,9]!0", NULL, NULL, OE_INTDIV, 0, "integer division truncates"},
    {IR_OP_MAXIMUM, "i32[4,9] i32[4,9]", NULL, NULL, N, 0, "integers"},
    {IR_OP_MINIMUM, "i32[4,9] i32[4,9]", NULL, NULL, N, 0, "integers"},

    /* ---- comparisons ---- */
#define COMPARE(OP)                                                                                                    \
  {OP, X " " X, NULL, NULL, N, 0, NULL}, {OP, X "~ f32[37]~", NULL, NULL, N, 0, "ties, broadcast"},                    \
      {OP, D " " D, NULL, NULL, N, 0, NULL}, {OP, D "~ f64[37]~", NULL, NULL, N, 0, NULL},                             \
      {OP, "i32[4,9] i32[4,9]", NULL, NULL, N, 0, "integers"}
    COMPARE(IR_OP_EQ),
    COMPARE(IR_OP_NE),
    COMPARE(IR_OP_LT),
    COMPARE(IR_OP_LE),
    COMPARE(IR_OP_GT),
    COMPARE(IR_OP_GE),
    {IR_OP_NE, "f32[3,8] f32[3,8]", NULL, NULL, OE_SPECIAL, 0, "NaN != NaN"},
    {IR_OP_NE, "bool[4,9] bool[4,9]", NULL, NULL, N, 0, "booleans"},

    /* ---- select ---- */
    {IR_OP_SELECT, "bool[5,37] " X " f32[37]", NULL, NULL, N, 0, "broadcast b"},
    {IR_OP_SELECT, "bool[5,37] " D " f64[37]", NULL, NULL, N, 0, NULL},
    {IR_OP_SELECT, "bool[5,1] f32[37] " X, NULL, NULL, N, 0, "broadcast condition"},
    {IR_OP_SELECT, "bool[4,9] i32[4,9] i32[4,9]", NULL, NULL, N, 0, "integers"},

    /* ---- reductions: every axis set, with and without keepdim ---- */
#define REDUCE_AXES(OP, T)                                                                                             \
  {OP, T, "axes=[2] keepdim=true", NULL, N, 0, NULL}, {OP, T, "axes=[2] keepdim=false", NULL, N, 0, NULL},             \
      {OP, T, "axes=[-1] keepdim=true", NULL, N, 0, NULL}, {OP, T, "axes=[-1] keepdim=false", NULL, N, 0, NULL},       \
      {OP, T, "axes=[0] keepdim=true", NULL, N, 0, NULL}, {OP, T, "axes=[0] keepdim=false", NULL, N, 0, NULL},         \
      {OP, T, "axes=[1] keepdim=true", NULL, N, 0, NULL}, {OP, T, "axes=[1] keepdim=false", NULL, N, 0, NULL},         \
      {OP, T, "axes=[0,1] keepdim=true", NULL, N, 0, NULL}, {OP, T, "axes=[0,1] keepdim=false", NULL, N, 0, NULL},     \
      {OP, T, "axes=[0,2] keepdim=true", NULL, N, 0, NULL}, {OP, T, "axes=[0,2] keepdim=false", NULL, N, 0, NULL},     \
      {OP, T, "axes=[1,2] keepdim=true", NULL, N, 0, NULL}, {OP, T, "axes=[1,2] keepdim=false", NULL, N, 0, NULL},     \
      {OP, T, "axes=[0,1,2] keepdim=true", NULL, N, 0, NULL},                                                          \
      {OP, T, "axes=[0,1,2] keepdim=false", NULL, N, 0, NULL},                                                        \
      {OP, T, "axes=[] keepdim=false", NULL, N, 0, "every axis"}
#define REDUCE(OP)                                                                                                     \
  REDUCE_AXES(OP, "f32[3,4,45]"), REDUCE_AXES(OP, "f64[3,4,45]"),                                                      \
      {OP, "f32[7]", "axes=[] keepdim=true", NULL, N, 0, "a vector"},                                                  \
      {OP, "f64[7]", "axes=[] keepdim=true", NULL, N, 0, NULL},                                                        \
      {OP, "f32[5,1100]", "axes=[1] keepdim=true", NULL, N, 0, "rows longer than a block"},                            \
      {OP, "f32[5,1100]", "axes=[0] keepdim=false", NULL, N, 0, NULL}
    REDUCE(IR_OP_SUM),
    REDUCE(IR_OP_MEAN),
    REDUCE(IR_OP_MAX),
    REDUCE(IR_OP_LOGSUMEXP),
#define REDUCE_SMALL(OP)                                                                                               \
  {OP, "f64[2,3,4]", "axes=[-3,-2] keepdim=true", NULL, N, 0, "negative axes"},                                      \
      {OP, "f64[5]", "axes=[0] keepdim=false", NULL, N, 0, "to a scalar"},                                           \
      {OP, "f64[2,3]", "axes=[] keepdim=false", NULL, N, 0, NULL}
    REDUCE_SMALL(IR_OP_SUM),
    REDUCE_SMALL(IR_OP_MEAN),
    REDUCE_SMALL(IR_OP_MAX),
    REDUCE_SMALL(IR_OP_LOGSUMEXP),
    {IR_OP_SUM, "i32[4,9]", "axes=[1] keepdim=false", NULL, N, 0, "integers"},
    {IR_OP_SUM, "i32[4,9]", "axes=[0] keepdim=false", NULL, N, 0, "integers"},
    {IR_OP_SUM, "bf16[4,33]", "axes=[1] keepdim=true", NULL, OE_LOWP, 0, NULL},
    {IR_OP_SUM, "f16[4,33]", "axes=[1] keepdim=true", NULL, OE_LOWP, 0, NULL},
    {IR_OP_MAX, "f32[3,45]~", "axes=[1] keepdim=true", NULL, N, 0, "ties"},
    {IR_OP_MAX, "f32[3,8]", "axes=[1] keepdim=true", NULL, OE_SPECIAL, 0, "NaN, infinities, an all -inf row"},
    {IR_OP_LOGSUMEXP, "f32[3,8]", "axes=[1] keepdim=true", NULL, OE_SPECIAL, 0, "NaN, infinities"},
    {IR_OP_LOGSUMEXP, "f32[3,8]", "axes=[0] keepdim=true", NULL, OE_SPECIAL, 0, "down the columns"},
    {IR_OP_LOGSUMEXP, "f32[5,37]", "axes=[1] keepdim=false", NULL, OE_LARGE, 0, "no overflow"},
    {IR_OP_LOGSUMEXP, "f32[5,1100]", "axes=[1] keepdim=false", NULL, N, 0, "rows longer than a block"},

    /* ---- data movement ---- */
#define PERMUTES(T)                                                                                                    \
  {IR_OP_PERMUTE, T, "perm=[0,2,1]", NULL, N, 0, NULL}, {IR_OP_PERMUTE, T, "perm=[2,0,1]", NULL, N, 0, NULL},          \
      {IR_OP_PERMUTE, T, "perm=[1,0,2]", NULL, N, 0, NULL}, {IR_OP_PERMUTE, T, "perm=[2,1,0]", NULL, N, 0, NULL},      \
      {IR_OP_PERMUTE, T, "perm=[1,2,0]", NULL, N, 0, NULL}, {IR_OP_PERMUTE, T, "perm=[0,1,2]", NULL, N, 0, "identity"}
    PERMUTES("f32[3,4,5]"),
    PERMUTES("f32[2,70,45]"),
    {IR_OP_PERMUTE, "f64[3,4,5]", "perm=[2,0,1]", NULL, N, 0, NULL},
#define SLICES(OP, SHAPE)                                                                                              \
  {OP, "f32[3,4,5]", "starts=[0,1,0] stops=[3,3,5] steps=[1,1,2]" SHAPE, NULL, N, 0, NULL},                            \
      {OP, "f32[3,4,5]", "starts=[2,0,4] stops=[3,4,5] steps=[1,2,2]" SHAPE, NULL, N, 0, "edge ranges"},               \
      {OP, "f32[3,4,5]", "starts=[1,0,1] stops=[3,4,5] steps=[2,3,1]" SHAPE, NULL, N, 0, NULL},                        \
      {OP, "f32[3,4,5]", "starts=[0,2,0] stops=[3,3,5] steps=[2,1,3]" SHAPE, NULL, N, 0, NULL}
    SLICES(IR_OP_SLICE, ""),
    {IR_OP_SLICE, "f64[4,6]", "starts=[1,0] stops=[3,6] steps=[1,2]", NULL, N, 0, NULL},
    /* unslice: the slices above put back into x's shape */
    {IR_OP_UNSLICE, "f32[3,2,3]", "starts=[0,1,0] stops=[3,3,5] steps=[1,1,2] shape=[3,4,5]", NULL, N, 0, NULL},
    {IR_OP_UNSLICE, "f32[1,2,1]", "starts=[2,0,4] stops=[3,4,5] steps=[1,2,2] shape=[3,4,5]", NULL, N, 0, NULL},
    {IR_OP_UNSLICE, "f32[1,2,4]", "starts=[1,0,1] stops=[3,4,5] steps=[2,3,1] shape=[3,4,5]", NULL, N, 0, NULL},
    {IR_OP_UNSLICE, "f32[2,1,2]", "starts=[0,2,0] stops=[3,3,5] steps=[2,1,3] shape=[3,4,5]", NULL, N, 0, NULL},
    {IR_OP_UNSLICE, "f64[2,3]", "starts=[1,0] stops=[3,6] steps=[1,2] shape=[4,6]", NULL, N, 0, NULL},
    {IR_OP_CONCAT, "f32[3,4,5] f32[3,2,5] f32[3,4,5]", "axis=1", NULL, N, 0, "three operands"},
    {IR_OP_CONCAT, "f32[3,4,2] f32[3,4,5]", "axis=-1", NULL, N, 0, "the last axis"},
    {IR_OP_CONCAT, "f32[3,4,5] f32[3,4,5]", "axis=0", NULL, N, 0, "the first axis"},
    {IR_OP_CONCAT, "f64[2,3] f64[2,1] f64[2,2]", "axis=-1", NULL, N, 0, NULL},
    {IR_OP_CONCAT, "f64[1,4] f64[3,4] f64[2,4]", "axis=0", NULL, N, 0, NULL},
    {IR_OP_BROADCAST, "f32[37]", "shape=[3,5,37]", NULL, N, 0, NULL},
    {IR_OP_BROADCAST, "f64[37]", "shape=[3,5,37]", NULL, N, 0, NULL},
    {IR_OP_BROADCAST, "f32[3,1]", "shape=[2,3,4]", NULL, N, 0, "a unit axis"},
    {IR_OP_BROADCAST, "f64[4]", "shape=[2,3,4]", NULL, N, 0, "two new axes"},
    {IR_OP_BROADCAST, "f32[]", "shape=[2,3,4]", NULL, N, 0, "a scalar"},
    {IR_OP_RESHAPE, "f64[2,6]", "shape=[3,2,2]", NULL, N, 0, "a view: derivative only"},
    {IR_OP_MATMUL, "f64[2,3] f64[3,4]", NULL, NULL, N, 0, "matrix x matrix"},
    {IR_OP_MATMUL, "f64[3] f64[3,4]", NULL, NULL, N, 0, "vector x matrix"},
    {IR_OP_MATMUL, "f64[2,3] f64[3]", NULL, NULL, N, 0, "matrix x vector"},
    {IR_OP_MATMUL, "f64[2,1,2,3] f64[3,3,4]", NULL, NULL, N, 0, "broadcast batch"},
    {IR_OP_MATMUL, "f64[2,4,3] f64[3]", NULL, NULL, N, 0, "batched x vector"},
    {IR_OP_MATMUL, "f64[3] f64[3]", NULL, NULL, N, 0, "a dot product"},
    {IR_OP_MATMUL, "f64[2,2,3] f64[3,4]", NULL, NULL, N, 0, "batched x matrix"},
    {IR_OP_MATMUL, "f64[3] f64[2,3,4]", NULL, NULL, N, 0, "vector x batched"},
    {IR_OP_MATMUL, "f64[2,3] f64[2,3,4]", NULL, NULL, N, 0, "matrix x batched"},

    /* ---- row-wise neural-network ops ---- */
#define AXES3(OP, T)                                                                                                   \
  {OP, T, "axis=-1", NULL, N, 0, NULL}, {OP, T, "axis=-2", NULL, N, 0, NULL}, {OP, T, "axis=-3", NULL, N, 0, NULL}
    AXES3(IR_OP_SOFTMAX, "f32[2,6,21]"),
    AXES3(IR_OP_SOFTMAX, "f64[2,6,21]"),
    AXES3(IR_OP_LOG_SOFTMAX, "f32[2,6,21]"),
    AXES3(IR_OP_LOG_SOFTMAX, "f64[2,6,21]"),
    {IR_OP_SOFTMAX, "f32[3,300]", "axis=-1", NULL, N, 0, "rows wider than a warp"},
    {IR_OP_SOFTMAX, "f32[3,8]", "axis=-1", NULL, OE_SPECIAL, 0, "NaN, infinities, an all -inf row"},
    {IR_OP_SOFTMAX, "f32[5,37]", "axis=-1", NULL, OE_LARGE, 0, "large logits"},
    {IR_OP_SOFTMAX, "bf16[4,33]", "axis=-1", NULL, OE_LOWP, 0, NULL},
    {IR_OP_SOFTMAX, "f16[4,33]", "axis=-1", NULL, OE_LOWP, 0, NULL},
    {IR_OP_LOG_SOFTMAX, "f32[5,37]", "axis=-1", NULL, OE_LARGE, 0, "large logits"},
    {IR_OP_LAYER_NORM, "f32[2,6,21] f32[21] f32[21]", "eps=1e-5", NULL, N, 0, NULL},
    {IR_OP_LAYER_NORM, "f64[2,6,21] f64[21] f64[21]", "eps=1e-5", NULL, N, 0, NULL},
    {IR_OP_LAYER_NORM, "f32[4] f32[4] f32[4]", "eps=1e-5", NULL, N, 0, "one row"},
    {IR_OP_RMS_NORM, "f32[2,6,21] f32[21]", "eps=1e-6", NULL, N, 0, NULL},
    {IR_OP_RMS_NORM, "f64[2,6,21] f64[21]", "eps=1e-6", NULL, N, 0, NULL},
    {IR_OP_RMS_NORM, "f32[4] f32[4]", "eps=1e-6", NULL, N, 0, "one row"},
    {IR_OP_CAUSAL_MASK, "f32[2,6,6]", NULL, NULL, N, OC_GRAD_SOFTMAX, "square"},
    {IR_OP_CAUSAL_MASK, "f32[2,6,21]", NULL, NULL, N, OC_GRAD_SOFTMAX, "wide"},
    {IR_OP_CAUSAL_MASK, "f64[2,6,6]", NULL, NULL, N, OC_GRAD_SOFTMAX, NULL},
    {IR_OP_CAUSAL_MASK, "f64[2,6,21]", NULL, NULL, N, OC_GRAD_SOFTMAX, NULL},
    {IR_OP_CAUSAL_MASK, "f32[3,5]", NULL, NULL, N, OC_GRAD_SOFTMAX, "rank 2"},
    /* every reduction, with targets at ignore_index */
#define REDUCTIONS(OP, T, A, E, NOTE)                                                                                  \
  {OP, T, A " reduction=none", NULL, E, 0, NOTE}, {OP, T, A " reduction=sum", NULL, E, 0, NULL},                       \
      {OP, T, A " reduction=mean", NULL, E, 0, NULL}
    REDUCTIONS(IR_OP_CROSS_ENTROPY, "f32[2,5,13] i32[2,5]<13", "ignore_index=-100", OE_IGNORE, NULL),
    REDUCTIONS(IR_OP_CROSS_ENTROPY, "f64[2,5,13] i32[2,5]<13", "ignore_index=-100", OE_IGNORE, NULL),
    REDUCTIONS(IR_OP_CROSS_ENTROPY, "f32[2,3,5] i32[2,3]<5", "ignore_index=2", N, "a class as ignore_index"),
    REDUCTIONS(IR_OP_CROSS_ENTROPY, "f32[3,4] i32[3]<4", "ignore_index=-100", OE_ALL_IGNORED, "every target ignored"),
    {IR_OP_CROSS_ENTROPY, "f32[5,37] i32[5]<37", "ignore_index=-100 reduction=mean", NULL, OE_LARGE, 0,
     "large logits"},
    {IR_OP_ONE_HOT, "i32[2,5]<13", "depth=13 ignore_index=-100", "f32[2,5,13]", OE_IGNORE, 0, NULL},
    {IR_OP_ONE_HOT, "i32[2,5]<13", "depth=13 ignore_index=-100", "f64[2,5,13]", OE_IGNORE, 0, NULL},
    {IR_OP_EMBEDDING, "i32[2,5]<11 f32[11,24]", NULL, NULL, OE_REPEAT, 0, NULL},
    {IR_OP_EMBEDDING, "i32[2,5]<11 f64[11,24]", NULL, NULL, OE_REPEAT, 0, NULL},
    {IR_OP_EMBEDDING_GRAD, "i32[2,5]<11 f32[2,5,24]", "rows=11", NULL, OE_REPEAT, 0, "colliding rows"},
    {IR_OP_EMBEDDING_GRAD, "i32[2,5]<11 f64[2,5,24]", "rows=11", NULL, OE_REPEAT, 0, NULL},
    REDUCTIONS(IR_OP_MSE_LOSS, X " " X, "", N, NULL),
    REDUCTIONS(IR_OP_MSE_LOSS, D " " D, "", N, NULL),

    /* ---- convolution and pooling: patches (im2col) and patches_grad (col2im) ---- */
#define GEOM(K, S, P, DL) "kernel=" K " stride=" S " padding=" P " dilation=" DL
    {IR_OP_PATCHES, "f32[2,3,7,6]", GEOM("[3,3]", "[1,1]", "[1,1]", "[1,1]") " value=0.0", NULL, N, 0, "3x3, same padding"},
    {IR_OP_PATCHES, "f64[2,3,7,6]", GEOM("[3,3]", "[1,1]", "[1,1]", "[1,1]") " value=0.0", NULL, N, 0, NULL},
    {IR_OP_PATCHES, "f32[2,3,9,8]", GEOM("[3,2]", "[2,3]", "[0,1]", "[1,1]") " value=0.0", NULL, N, 0, "strides"},
    {IR_OP_PATCHES, "f32[2,2,9,9]", GEOM("[2,3]", "[1,1]", "[2,1]", "[2,3]") " value=0.5", NULL, N, 0,
     "dilation, a padding value"},
    {IR_OP_PATCHES, "f32[2,3,6,6]", GEOM("[2,2]", "[2,2]", "[1,1]", "[1,1]") " value=-inf", NULL, N, OC_NO_GRAD,
     "max-pool padding (-inf)"},
    {IR_OP_PATCHES, "f32[1,2,3,3]", GEOM("[2,2]", "[1,1]", "[3,3]", "[1,1]") " value=0.0", NULL, N, 0,
     "padding larger than the kernel: whole patches in the padding"},
    {IR_OP_PATCHES, "f32[2,3,5,5]", GEOM("[5,5]", "[1,1]", "[0,0]", "[1,1]") " value=0.0", NULL, N, 0,
     "kernel = image: one position"},
    {IR_OP_PATCHES, "f32[2,3,11]", GEOM("[3]", "[2]", "[2]", "[2]") " value=0.0", NULL, N, 0, "1-d"},
    {IR_OP_PATCHES, "f64[2,3,11]", GEOM("[3]", "[2]", "[2]", "[2]") " value=0.0", NULL, N, 0, NULL},
    {IR_OP_PATCHES, "f32[2,2,5,4,6]", GEOM("[2,2,3]", "[1,2,1]", "[1,0,1]", "[1,1,2]") " value=0.0", NULL, N, 0,
     "3-d (three leading axes' worth of rank)"},
    {IR_OP_PATCHES_GRAD, "f32[2,3,3,3,7,6]", GEOM("[3,3]", "[1,1]", "[1,1]", "[1,1]") " shape=[2,3,7,6]", NULL, N, 0,
     "3x3, same padding"},
    {IR_OP_PATCHES_GRAD, "f64[2,3,3,3,7,6]", GEOM("[3,3]", "[1,1]", "[1,1]", "[1,1]") " shape=[2,3,7,6]", NULL, N, 0,
     NULL},
    {IR_OP_PATCHES_GRAD, "f32[2,3,3,2,4,3]", GEOM("[3,2]", "[2,3]", "[0,1]", "[1,1]") " shape=[2,3,9,8]", NULL, N, 0,
     "strides: image positions no patch reads"},
    {IR_OP_PATCHES_GRAD, "f32[2,2,2,3,11,5]", GEOM("[2,3]", "[1,1]", "[2,1]", "[2,3]") " shape=[2,2,9,9]", NULL, N, 0,
     "dilation"},
    {IR_OP_PATCHES_GRAD, "f32[1,2,2,2,8,8]", GEOM("[2,2]", "[1,1]", "[3,3]", "[1,1]") " shape=[1,2,3,3]", NULL, N, 0,
     "padding larger than the kernel"},
    {IR_OP_PATCHES_GRAD, "f32[2,3,3,6]", GEOM("[3]", "[2]", "[2]", "[2]") " shape=[2,3,11]", NULL, N, 0, "1-d"},
    {IR_OP_PATCHES_GRAD, "f64[2,3,3,6]", GEOM("[3]", "[2]", "[2]", "[2]") " shape=[2,3,11]", NULL, N, 0, NULL},
    {IR_OP_PATCHES_GRAD, "f32[1,2,3,1100]", GEOM("[3]", "[1]", "[1]", "[1]") " shape=[1,2,1100]", NULL, N, 0,
     "rows longer than one block of columns"},
#undef GEOM
    /* ---- language v2: elementwise math ---- */
    {IR_OP_CLAMP, X, "min=-0.5 max=0.5", NULL, N, 0, NULL},
    {IR_OP_CLAMP, D, "min=-0.5 max=0.5", NULL, N, 0, NULL},
    {IR_OP_CLAMP, X, "min=-0.25", NULL, N, 0, "no upper bound"},
    {IR_OP_CLAMP, D, "max=0.25", NULL, N, 0, "no lower bound"},
    {IR_OP_CLAMP, X, "min=0.5 max=-0.5", NULL, N, 0, "min > max gives max (torch)"},
    {IR_OP_CLAMP, "f32[3,8]", "min=-1.0 max=1.0", NULL, OE_SPECIAL, 0, "NaN stays, infinities clamp"},
    {IR_OP_CLAMP, X "~", "min=0.0 max=1.0", NULL, N, 0, "values on the bounds"},
    {IR_OP_CLAMP, "bf16[4,33]", "min=-0.5 max=0.5", NULL, OE_LOWP, 0, NULL},
    {IR_OP_CLAMP, "f16[4,33]", "min=-0.5 max=0.5", NULL, OE_LOWP, 0, NULL},
    {IR_OP_SIN, X, NULL, NULL, N, 0, NULL},
    {IR_OP_SIN, D, NULL, NULL, N, 0, NULL},
    {IR_OP_SIN, "f32[3,8]", NULL, NULL, OE_SPECIAL, 0, "NaN and infinities"},
    {IR_OP_SIN, X, NULL, NULL, OE_LARGE, 0, "larger arguments"},
    {IR_OP_COS, X, NULL, NULL, N, 0, NULL},
    {IR_OP_COS, D, NULL, NULL, N, 0, NULL},
    {IR_OP_COS, "f32[3,8]", NULL, NULL, OE_SPECIAL, 0, "NaN and infinities"},
    {IR_OP_COS, X, NULL, NULL, OE_LARGE, 0, "larger arguments"},
    {IR_OP_COS, "bf16[4,33]", NULL, NULL, OE_LOWP, 0, NULL},
    {IR_OP_LOG1P, X "+", NULL, NULL, N, 0, NULL},
    {IR_OP_LOG1P, D "+", NULL, NULL, N, 0, NULL},
    {IR_OP_LOG1P, "f32[3,8]", NULL, NULL, OE_SPECIAL, 0, "below -1: NaN; -1: -inf"},
    {IR_OP_LOG1P, "f32[4,33]", NULL, NULL, OE_LOWP, 0, "tiny arguments keep their precision"},
    {IR_OP_SOFTPLUS, X, NULL, NULL, N, 0, NULL},
    {IR_OP_SOFTPLUS, D, NULL, NULL, N, 0, NULL},
    {IR_OP_SOFTPLUS, "f32[3,8]", NULL, NULL, OE_SPECIAL, 0, "NaN and infinities"},
    {IR_OP_SOFTPLUS, X, NULL, NULL, OE_LARGE, OC_NO_GRAD, "past the threshold 20: x itself"},
    {IR_OP_SOFTPLUS, D, NULL, NULL, OE_LARGE, OC_NO_GRAD, NULL},
    {IR_OP_ERF, X, NULL, NULL, N, 0, NULL},
    {IR_OP_ERF, D, NULL, NULL, N, 0, NULL},
    {IR_OP_ERF, "f32[3,8]", NULL, NULL, OE_SPECIAL, 0, "NaN and infinities"},
    {IR_OP_ERF, X, NULL, NULL, OE_LARGE, OC_NO_GRAD, "saturation"},
    {IR_OP_GELU_ERF, X, NULL, NULL, N, 0, NULL},
    {IR_OP_GELU_ERF, D, NULL, NULL, N, 0, NULL},
    {IR_OP_GELU_ERF, "f32[3,8]", NULL, NULL, OE_SPECIAL, 0, "NaN and infinities"},
    {IR_OP_GELU_ERF, X, NULL, NULL, OE_LARGE, OC_NO_GRAD, "large negative x: tiny values, no cancellation"},
    {IR_OP_GELU_ERF, "bf16[4,33]", NULL, NULL, OE_LOWP, 0, NULL},
    {IR_OP_GELU_ERF, "f16[4,33]", NULL, NULL, OE_LOWP, 0, NULL},
    {IR_OP_GELU_ERF_GRAD, X, NULL, NULL, N, 0, NULL},
    {IR_OP_GELU_ERF_GRAD, D, NULL, NULL, N, 0, NULL},
    {IR_OP_GELU_ERF_GRAD, X, NULL, NULL, OE_LARGE, 0, NULL},
    UNARY_SHAPES(IR_OP_SIN, ""),
    UNARY_SHAPES(IR_OP_COS, ""),
    UNARY_SHAPES(IR_OP_LOG1P, "+"),
    UNARY_SHAPES(IR_OP_SOFTPLUS, ""),
    UNARY_SHAPES(IR_OP_ERF, ""),
    UNARY_SHAPES(IR_OP_GELU_ERF, ""),
    {IR_OP_CLAMP, "f64[2,1,3]", "min=-0.3 max=0.4", NULL, N, 0, "a unit axis"},

    /* ---- language v2: constructors and selection ---- */
    {IR_OP_ARANGE, "", NULL, "i32[7]", N, 0, NULL},
    {IR_OP_ARANGE, "", NULL, "f32[300]", N, 0, "more than a block"},
    {IR_OP_ARANGE, "", NULL, "f64[5]", N, 0, NULL},
    {IR_OP_GATHER, "f32[4,7] i32[4,5]<7", "axis=1", NULL, OE_REPEAT, 0, "the last axis, repeated indices"},
    {IR_OP_GATHER, "f64[4,7] i32[4,5]<7", "axis=-1", NULL, OE_REPEAT, 0, NULL},
    {IR_OP_GATHER, "f32[6,3,5] i32[2,3,5]<6", "axis=0", NULL, N, 0, "the first axis"},
    {IR_OP_GATHER, "f64[6,3,5] i32[2,3,5]<6", "axis=0", NULL, N, 0, NULL},
    {IR_OP_GATHER, "f32[3,4,5] i32[3,9,5]<4", "axis=1", NULL, N, 0, "a middle axis, more picks than entries"},
    {IR_OP_GATHER, "f64[3,4,5] i32[3,9,5]<4", "axis=1", NULL, N, 0, NULL},
    {IR_OP_GATHER, "bf16[4,33] i32[4,3]<33", "axis=1", NULL, OE_LOWP, 0, NULL},
    {IR_OP_GATHER, "i32[4,9] i32[4,2]<9", "axis=1", NULL, N, 0, "integers"},
    {IR_OP_GATHER_GRAD, "i32[4,5]<7 f32[4,5]", "axis=1 shape=[4,7]", NULL, OE_REPEAT, 0, "colliding indices add up"},
    {IR_OP_GATHER_GRAD, "i32[4,5]<7 f64[4,5]", "axis=-1 shape=[4,7]", NULL, OE_REPEAT, 0, NULL},
    {IR_OP_GATHER_GRAD, "i32[2,3,5]<6 f32[2,3,5]", "axis=0 shape=[6,3,5]", NULL, N, 0, "the first axis"},
    {IR_OP_GATHER_GRAD, "i32[3,9,5]<4 f64[3,9,5]", "axis=1 shape=[3,4,5]", NULL, N, 0, "a middle axis"},
    {IR_OP_GATHER_GRAD, "i32[2,600]<3 f32[2,600]", "axis=0 shape=[3,600]", NULL, N, 0, "more columns than a block"},
    {IR_OP_TOPK, X, "k=3 axis=-1", NULL, N, 0, NULL},
    {IR_OP_TOPK, D, "k=3 axis=1", NULL, N, 0, NULL},
    {IR_OP_TOPK, X "~", "k=5 axis=1", NULL, N, 0, "ties: the lower index first"},
    {IR_OP_TOPK, "f32[6,4,5]", "k=2 axis=0", NULL, N, 0, "the first axis"},
    {IR_OP_TOPK, "f32[3,7,5]~", "k=7 axis=1", NULL, N, 0, "a middle axis, k = its length: a stable sort"},
    {IR_OP_TOPK, "f32[3,8]", "k=6 axis=1", NULL, OE_SPECIAL, 0, "NaN largest, infinities, -0 ties 0"},
    {IR_OP_TOPK, "bf16[4,33]", "k=4 axis=1", NULL, OE_LOWP, 0, NULL},
    {IR_OP_TOPK, "f32[5,37]", "k=1 axis=1", NULL, N, 0, "argmax"},
    /* ---- randomness: the operand is any i32[4] rng.state (seed, step, first sample) ---- */
    {IR_OP_RANDOM, "i32[4]<65536", "dist=uniform key=7 batched=true", "f32[6,37]", N, 0, "per sample"},
    {IR_OP_RANDOM, "i32[4]<65536", "dist=uniform key=9 batched=false", "f32[5,37]", N, 0, "whole tensor"},
    {IR_OP_RANDOM, "i32[4]<65536", "dist=uniform key=7 batched=true", "f64[4,33]", N, 0, "53 bits"},
    {IR_OP_RANDOM, "i32[4]<65536", "dist=normal key=11 batched=true", "f32[6,37]", N, 0, "Box-Muller"},
    {IR_OP_RANDOM, "i32[4]<65536", "dist=normal key=13 batched=false", "f64[3,21]", N, 0, NULL},
    {IR_OP_RANDOM, "i32[4]<65536", "dist=uniform key=3 batched=true", "f32[2,3,300]", N, 0, "rows wider than a warp"},

    /* ---- gradient accumulation ---- */
    {IR_OP_GRAD_SEED, "f32[]", "coef=0.1", NULL, N, 0, NULL},
    {IR_OP_GRAD_SEED, "f64[]", "coef=0.1", NULL, N, 0, NULL},
    {IR_OP_LOSS_TERM, "f32[] f32[]", NULL, NULL, N, 0, NULL},
    {IR_OP_LOSS_TERM, "f64[] f64[]", NULL, NULL, N, 0, NULL},
};
const int op_ncases = (int)(sizeof op_cases / sizeof op_cases[0]);

const OpExclusion op_exclusions[] = {
    {IR_OP_CONST, "no kernel of its own: folded into the kernels that read it (rows with an f32=V operand)"},
    {IR_OP_RESHAPE, "a view (no kernel, no copy); its derivative has a row"},
    {IR_OP_MATMUL, "run by the executor's GEMM (BLAS, cuBLASLt), not a generated kernel: test_exec, "
                   "test_cuda_gemms_as_cublaslt_sees_them; its derivative has rows"},
    {IR_OP_WINDOW_SUM, "its value comes from the window's count phase (runtime/ref/step.c, test_gas)"},
    {IR_OP_RNG_STATE, "written by the executor before each micro-batch (step_store_rng; test_random)"},
    {IR_OP_LOSS_SCALE, "written by the executor before each micro-batch (step_store_rng; test_mixed)"},
    {IR_OP_LOSS, "an output of the step, no result (test_exec, test_step)"},
    {IR_OP_GRAD, "an output of the step, no result (test_codegen_grad_buffers_accumulate)"},
    {IR_OP_ALL_REDUCE_START, "a collective: needs ranks (test_dp_*, test_tp_run)"},
    {IR_OP_ALL_REDUCE_WAIT, "a collective: needs ranks (test_dp_*, test_tp_run)"},
    {IR_OP_ALL_GATHER_START, "a collective: needs ranks (test_tp_run)"},
    {IR_OP_ALL_GATHER_WAIT, "a collective: needs ranks (test_tp_run)"},
    {IR_OP_REDUCE_SCATTER_START, "a collective: needs ranks (test_tp_run, test_dp_zero)"},
    {IR_OP_REDUCE_SCATTER_WAIT, "a collective: needs ranks (test_tp_run, test_dp_zero)"},
    {IR_OP_TP_COPY, "tensor-parallel: identity on one rank, dropped after autodiff (test_shard)"},
    {IR_OP_TP_SCATTER, "rank-dependent: needs ranks (test_tp_run, test_dp_rank_ops)"},
    {IR_OP_RANK_SLICE, "rank-dependent: needs ranks (test_dp_rank_ops)"},
    {IR_OP_RANK_CONCAT, "rank-dependent: needs ranks (test_dp_rank_ops)"},
    /* Language v2: outputs and buffer updates. */
    {IR_OP_OUTPUT, "an output of the step, no result (test_state, every back end)"},
    {IR_OP_UPDATE, "an output of the step, no result (test_state, every back end)"},
};
const int op_nexclusions = (int)(sizeof op_exclusions / sizeof op_exclusions[0]);
