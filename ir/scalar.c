/* scalar.c - what the elementwise ops compute on one element, in f64, and
 * the rounding of a value to each dtype.
 *
 * The one home of the ops' scalar semantics (PyTorch's): the reference
 * interpreter evaluates with these functions, and constant folding (the
 * frontend's on numbers, simplify's on scalar consts) calls the same ones,
 * so a folded value is the value the interpreter would compute.  The code
 * generators emit the same formulas in their own languages; they are
 * tested against the interpreter. */
#include <math.h>

#include "ir.h"

#define GELU_C 0.7978845608028654 /* sqrt(2 / pi) */
#define GELU_A 0.044715
#define SQRT1_2 0.70710678118654752440  /* 1 / sqrt(2) */
#define INV_SQRT_2PI 0.39894228040143267794 /* 1 / sqrt(2 pi) */

/* 1 / (1 + e^-x) without overflowing e^-x for very negative x. */
static double sigmoid(double x) {
  if (x >= 0) return 1.0 / (1.0 + exp(-x));
  double e = exp(x);
  return e / (1.0 + e);
}

/* gelu, tanh approximation: 0.5 x (1 + tanh u), u = c (x + a x^3). */
static double gelu(double x) { return 0.5 * x * (1.0 + tanh(GELU_C * (x + GELU_A * x * x * x))); }

/* d/dx of 0.5 x (1 + tanh u), u = c (x + a x^3):
 *   0.5 (1 + tanh u) + 0.5 x (1 - tanh^2 u) c (1 + 3 a x^2) */
static double gelu_grad(double x) {
  double t = tanh(GELU_C * (x + GELU_A * x * x * x));
  return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * GELU_C * (1.0 + 3.0 * GELU_A * x * x);
}

/* softplus, torch's defaults (beta 1, threshold 20): x above 20, else
 * log(1 + e^x), written so that e^x cannot overflow. */
static double softplus(double x) { return x > 20.0 ? x : x > 0 ? x + log1p(exp(-x)) : log1p(exp(x)); }

/* gelu, erf form (approximate="none"): x Phi(x), Phi(x) = 0.5 (1 + erf(x / sqrt 2))
 * written as 0.5 erfc(-x / sqrt 2), which keeps its precision for negative x. */
static double gelu_erf(double x) { return 0.5 * x * erfc(-x * SQRT1_2); }

/* d/dx x Phi(x) = Phi(x) + x phi(x), phi(x) = e^(-x^2/2) / sqrt(2 pi). */
static double gelu_erf_grad(double x) { return 0.5 * erfc(-x * SQRT1_2) + x * exp(-0.5 * x * x) * INV_SQRT_2PI; }

/* torch.clamp: max(x, lo) then min(., hi), NaN kept; lo > hi gives hi. */
static double clamp(double x, double lo, double hi) {
  double r = x < lo ? lo : x;
  return r > hi ? hi : r;
}

/* One switch for both arities: a is the operand (or the first), b the
 * second operand, p pow's exponent, [lo, hi] clamp's bounds. */
static double eval(IrOpcode opc, double a, double b, double p, double lo, double hi) {
  switch (opc) {
  case IR_OP_NEG: return -a;
  case IR_OP_EXP: return exp(a);
  case IR_OP_LOG: return log(a);
  case IR_OP_SQRT: return sqrt(a);
  case IR_OP_RSQRT: return 1.0 / sqrt(a);
  case IR_OP_TANH: return tanh(a);
  case IR_OP_SIGMOID: return sigmoid(a);
  case IR_OP_RELU: return a > 0 || isnan(a) ? a : 0.0; /* torch.relu keeps NaN */
  case IR_OP_GELU: return gelu(a);
  case IR_OP_SILU: return a * sigmoid(a);
  case IR_OP_ABS: return fabs(a);
  case IR_OP_SIGN: return (double)((0 < a) - (a < 0));
  case IR_OP_POW: return pow(a, p);
  case IR_OP_GELU_GRAD: return gelu_grad(a);
  case IR_OP_CAST:
  case IR_OP_DETACH: return a;
  case IR_OP_CLAMP: return clamp(a, lo, hi);
  case IR_OP_SIN: return sin(a);
  case IR_OP_COS: return cos(a);
  case IR_OP_LOG1P: return log1p(a);
  case IR_OP_SOFTPLUS: return softplus(a);
  case IR_OP_ERF: return erf(a);
  case IR_OP_GELU_ERF: return gelu_erf(a);
  case IR_OP_GELU_ERF_GRAD: return gelu_erf_grad(a);
  case IR_OP_ADD: return a + b;
  case IR_OP_SUB: return a - b;
  case IR_OP_MUL: return a * b;
  case IR_OP_DIV: return a / b;
  /* torch.maximum / minimum propagate NaN. */
  case IR_OP_MAXIMUM: return isnan(a) || isnan(b) ? NAN : a > b ? a : b;
  case IR_OP_MINIMUM: return isnan(a) || isnan(b) ? NAN : a < b ? a : b;
  case IR_OP_EQ: return a == b;
  case IR_OP_NE: return a != b;
  case IR_OP_LT: return a < b;
  case IR_OP_LE: return a <= b;
  case IR_OP_GT: return a > b;
  case IR_OP_GE: return a >= b;
  /* Not a scalar function: select and every other kind. */
  case IR_OP_SELECT:
  IR_CASES(CONST)
  IR_CASES(REDUCE)
  IR_CASES(MOVEMENT)
  IR_CASES(GEMM)
  IR_CASES(NN)
  IR_CASES(WINDOW)
  IR_CASES(COLLECTIVE)
  IR_CASES(OUTPUT) break;
  }
  GRADC_ASSERT(!"ir_scalar: not a unary, binary or comparison op");
  return NAN;
}

double ir_scalar_unary(IrOpcode opc, double x, double p) {
  GRADC_ASSERT(ir_op_is(opc, IR_OPF_UNARY));
  return eval(opc, x, 0.0, p, -INFINITY, INFINITY);
}

double ir_scalar_unary_op(const IrOp *op, double x) {
  GRADC_ASSERT(ir_op_is(op->opcode, IR_OPF_UNARY));
  return eval(op->opcode, x, 0.0, ir_attr_get_float(op, "exponent", 1.0), ir_attr_get_float(op, "min", -INFINITY),
              ir_attr_get_float(op, "max", INFINITY));
}

double ir_scalar_binary(IrOpcode opc, double a, double b) {
  GRADC_ASSERT(ir_op_is(opc, IR_OPF_BINARY | IR_OPF_COMPARE));
  return eval(opc, a, b, 0.0, -INFINITY, INFINITY);
}

double ir_scalar_cast(double x, IrDType to) {
  switch (to) {
  case IR_DT_F32:
  case IR_DT_F64:
  case IR_DT_BF16:
  case IR_DT_F16: return x;
  case IR_DT_I32: return isfinite(x) ? trunc(x) : 0; /* toward zero, as a C cast */
  case IR_DT_BOOL: return x != 0;
  }
  return x;
}

/* Round x to a binary floating-point format with p significand bits
 * (implicit bit included) and normal exponents emin..emax: round to
 * nearest even, subnormals below 2^emin, overflow to infinity. */
static double round_format(double x, int p, int emin, int emax) {
  if (!isfinite(x) || x == 0) return x;
  int e;
  frexp(x, &e); /* x = m * 2^e, 0.5 <= |m| < 1: x's exponent is e - 1 */
  int ex = e - 1 < emin ? emin : e - 1;
  double q = ldexp(1.0, ex - (p - 1)); /* spacing of representable values near x */
  double r = nearbyint(x / q) * q;     /* default rounding mode: nearest even */
  double maxf = ldexp(2.0 - ldexp(1.0, 1 - p), emax);
  if (fabs(r) > maxf) return copysign(INFINITY, x);
  return r;
}

double ir_round_dtype(double x, IrDType dt) {
  switch (dt) {
  case IR_DT_F32: return (double)(float)x;
  case IR_DT_F64: return x;
  case IR_DT_BF16: return round_format(x, 8, -126, 127);
  case IR_DT_F16: return round_format(x, 11, -14, 15);
  case IR_DT_I32: return isfinite(x) ? trunc(x) : x; /* exact for every integer value */
  case IR_DT_BOOL: return x != 0 ? 1.0 : 0.0;
  }
  return x;
}

void ir_round_dtype_n(double *x, int64_t n, IrDType dt) {
  switch (dt) {
  case IR_DT_F64: return;
  case IR_DT_F32:
    for (int64_t i = 0; i < n; i++) x[i] = (double)(float)x[i];
    return;
  case IR_DT_BOOL:
    for (int64_t i = 0; i < n; i++) x[i] = x[i] != 0 ? 1.0 : 0.0;
    return;
  case IR_DT_I32:
  case IR_DT_BF16:
  case IR_DT_F16: break;
  }
  for (int64_t i = 0; i < n; i++) x[i] = ir_round_dtype(x[i], dt);
}
