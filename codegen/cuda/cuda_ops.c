/* cuda_ops.c - the CUDA code generator's scalar layer: the prelude every
 * program starts with (bf16/f16 conversions inline, the interpreter's
 * math, warp and block reductions), register and memory types, literals,
 * loads and stores (gradient buffers accumulate), and the elementwise ops
 * with the reference interpreter's semantics (ir/scalar.c), written as
 * C expressions. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_gen.h"

/* ------------------------------------------------------------------ */
/* The prelude                                                         */
/* ------------------------------------------------------------------ */

const char cu_prelude[] =
    "// gradc CUDA prelude: element types, bf16/f16 conversions, math with the\n"
    "// reference interpreter's semantics, warp and block reductions.\n"
    "typedef unsigned short bf16_t; // bfloat16 bits\n"
    "typedef unsigned short f16_t;  // IEEE half bits\n"
    "#define GRADC_INF __int_as_float(0x7f800000)\n"
    "#define GRADC_NAN __int_as_float(0x7fffffff)\n"
    "#define GRADC_INF_D __longlong_as_double(0x7ff0000000000000LL)\n"
    "#define GRADC_NAN_D __longlong_as_double(0x7ff8000000000000LL)\n"
    "\n"
    "__device__ __forceinline__ float bf16_to_f32(bf16_t h) { return __uint_as_float((unsigned)h << 16); }\n"
    "// Round to nearest even; a NaN stays a quiet NaN.\n"
    "__device__ __forceinline__ bf16_t f32_to_bf16(float x) {\n"
    "  unsigned u = __float_as_uint(x);\n"
    "  if (x != x) return (bf16_t)((u | 0x400000u) >> 16);\n"
    "  return (bf16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);\n"
    "}\n"
    "__device__ __forceinline__ float f16_to_f32(f16_t h) {\n"
    "  unsigned sign = (unsigned)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;\n"
    "  if (e == 0) return __uint_as_float(sign | __float_as_uint((float)m * 5.9604644775390625e-08f)); // m 2^-24\n"
    "  if (e == 31) return __uint_as_float(sign | 0x7f800000u | (m << 13));\n"
    "  return __uint_as_float(sign | ((e + 112u) << 23) | (m << 13));\n"
    "}\n"
    "// Round to nearest even; beyond the largest half (65504) to infinity.\n"
    "__device__ __forceinline__ f16_t f32_to_f16(float x) {\n"
    "  unsigned u = __float_as_uint(x), sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;\n"
    "  if (a > 0x7f800000u) return (f16_t)(sign | 0x7e00u);\n"
    "  if (a >= 0x477ff000u) return (f16_t)(sign | 0x7c00u);\n"
    "  if (a < 0x38800000u) return (f16_t)(sign | (unsigned)rintf(__uint_as_float(a) * 16777216.0f)); // subnormal\n"
    "  return (f16_t)(sign | ((a + 0xfffu + ((a >> 13) & 1u) - 0x38000000u) >> 13));\n"
    "}\n"
    "__device__ __forceinline__ float round_bf16(float x) { return x != x ? x : bf16_to_f32(f32_to_bf16(x)); }\n"
    "__device__ __forceinline__ float round_f16(float x) { return x != x ? x : f16_to_f32(f32_to_f16(x)); }\n"
    "\n"
    "template <typename T> __device__ __forceinline__ T sq(T x) { return x * x; }\n"
    "// torch.maximum / torch.minimum: NaN when either operand is NaN.\n"
    "template <typename T> __device__ __forceinline__ T maximum(T a, T b) {\n"
    "  return (a != a || b != b) ? a + b : (a > b ? a : b);\n"
    "}\n"
    "template <typename T> __device__ __forceinline__ T minimum(T a, T b) {\n"
    "  return (a != a || b != b) ? a + b : (a < b ? a : b);\n"
    "}\n"
    "template <typename T> __device__ __forceinline__ T sign(T x) { return x > T(0) ? T(1) : x < T(0) ? T(-1) : T(0); }\n"
    "template <typename T> __device__ __forceinline__ T relu(T x) { return x > T(0) || x != x ? x : T(0); }\n"
    "// i32 division truncates; by 0 gives 0 (no trap), by -1 negates.\n"
    "__device__ __forceinline__ int idiv(int a, int b) { return b == 0 ? 0 : b == -1 ? -a : a / b; }\n"
    "__device__ __forceinline__ float sigmoid(float x) {\n"
    "  float e = expf(-fabsf(x)), d = 1.0f + e;\n"
    "  return x >= 0.0f ? 1.0f / d : e / d;\n"
    "}\n"
    "__device__ __forceinline__ double sigmoid(double x) {\n"
    "  double e = exp(-fabs(x)), d = 1.0 + e;\n"
    "  return x >= 0.0 ? 1.0 / d : e / d;\n"
    "}\n"
    "template <typename T> __device__ __forceinline__ T silu(T x) { return x * sigmoid(x); }\n"
    "// gelu, tanh approximation: 0.5 x (1 + tanh u), u = sqrt(2/pi) (x + 0.044715 x^3);\n"
    "// in f32 as x sigmoid(2u), the same function without the cancellation of 1 + tanh u.\n"
    "__device__ __forceinline__ float gelu(float x) {\n"
    "  float u = 0.7978845608028654f * (x + 0.044715f * (x * x * x));\n"
    "  float e = expf(-2.0f * fabsf(u)), big = 1.0f / (1.0f + e);\n"
    "  return x * (u >= 0.0f ? big : e * big);\n"
    "}\n"
    "__device__ __forceinline__ double gelu(double x) {\n"
    "  double u = 0.7978845608028654 * (x + 0.044715 * (x * x * x));\n"
    "  return 0.5 * x * (1.0 + tanh(u));\n"
    "}\n"
    "// d gelu / dx = 0.5 (1 + t) + 0.5 x (1 - t^2) c (1 + 3 a x^2), t = tanh u;\n"
    "// in f32 with 1 + t = 2p, 1 - t = 2q (p = sigmoid(2u), q = 1 - p).\n"
    "__device__ __forceinline__ float gelu_grad(float x) {\n"
    "  float u = 0.7978845608028654f * (x + 0.044715f * (x * x * x));\n"
    "  float poly = 0.7978845608028654f * (1.0f + 0.134145f * (x * x));\n"
    "  float e = expf(-2.0f * fabsf(u)), big = 1.0f / (1.0f + e), small = e * big;\n"
    "  float p = u >= 0.0f ? big : small, q = u >= 0.0f ? small : big;\n"
    "  return p + 2.0f * x * (p * q) * poly;\n"
    "}\n"
    "__device__ __forceinline__ double gelu_grad(double x) {\n"
    "  double t = tanh(0.7978845608028654 * (x + 0.044715 * (x * x * x)));\n"
    "  double poly = 0.7978845608028654 * (1.0 + 0.134145 * (x * x));\n"
    "  return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * poly;\n"
    "}\n"
    "// Language v2 math: softplus (beta 1, threshold 20), gelu's erf form and\n"
    "// its derivative, Phi(x) = 0.5 erfc(-x / sqrt 2).\n"
    "__device__ __forceinline__ float softplus(float x) {\n"
    "  return x > 20.0f ? x : (x > 0.0f ? x : 0.0f) + log1pf(expf(-fabsf(x)));\n"
    "}\n"
    "__device__ __forceinline__ double softplus(double x) {\n"
    "  return x > 20.0 ? x : (x > 0.0 ? x : 0.0) + log1p(exp(-fabs(x)));\n"
    "}\n"
    "__device__ __forceinline__ float gelu_erf(float x) { return x * (0.5f * erfcf(x * -0.70710678118654752f)); }\n"
    "__device__ __forceinline__ double gelu_erf(double x) { return x * (0.5 * erfc(x * -0.70710678118654752)); }\n"
    "__device__ __forceinline__ float gelu_erf_grad(float x) {\n"
    "  return 0.5f * erfcf(x * -0.70710678118654752f) + x * expf(-0.5f * (x * x)) * 0.39894228040143267f;\n"
    "}\n"
    "__device__ __forceinline__ double gelu_erf_grad(double x) {\n"
    "  return 0.5 * erfc(x * -0.70710678118654752) + x * exp(-0.5 * (x * x)) * 0.39894228040143267;\n"
    "}\n"
    "// topk's order: a before b when larger, NaN largest of all, ties by the lower index.\n"
    "template <typename T> __device__ __forceinline__ bool topk_before(T a, long ia, T b, long ib) {\n"
    "  bool na = a != a, nb = b != b;\n"
    "  return (na && !nb) || a > b || ((a == b || (na && nb)) && ia < ib);\n"
    "}\n"
    "\n"
    "// Sums and maxima over a warp and over a block (whose size is a multiple\n"
    "// of 32; red: 32 elements of shared memory), returned to every thread.\n"
    "// The order of additions is fixed: results do not vary between runs.\n"
    "template <typename T> __device__ __forceinline__ T warp_sum(T v) {\n"
    "  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);\n"
    "  return v;\n"
    "}\n"
    "template <typename T> __device__ __forceinline__ T warp_max(T v) {\n"
    "  for (int o = 16; o > 0; o >>= 1) v = maximum(v, __shfl_xor_sync(0xffffffffu, v, o));\n"
    "  return v;\n"
    "}\n"
    "template <typename T> __device__ T block_sum(T v, T *red) {\n"
    "  v = warp_sum(v);\n"
    "  __syncthreads(); // red may still be read by the previous reduction\n"
    "  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;\n"
    "  __syncthreads();\n"
    "  v = (threadIdx.x & 31) < (blockDim.x >> 5) ? red[threadIdx.x & 31] : T(0);\n"
    "  return warp_sum(v);\n"
    "}\n"
    "template <typename T> __device__ T block_max(T v, T *red, T lowest) {\n"
    "  v = warp_max(v);\n"
    "  __syncthreads();\n"
    "  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;\n"
    "  __syncthreads();\n"
    "  v = (threadIdx.x & 31) < (blockDim.x >> 5) ? red[threadIdx.x & 31] : lowest;\n"
    "  return warp_max(v);\n"
    "}\n"
    "\n"
    "// Counter-based draws (ir/random.c): Philox-4x32-10 of the counter (element\n"
    "// in the sample, sample in the window, step, op key) under the seed, and\n"
    "// its bits as floats.  st is a rng.state: seed low, seed high, step, the\n"
    "// micro-batch's first sample; per the elements of a sample (0: not batched).\n"
    "__device__ __forceinline__ void philox4x32_10(unsigned c[4], unsigned k0, unsigned k1) {\n"
    "  for (int r = 0; r < 10; r++) {\n"
    "    if (r > 0) k0 += 0x9E3779B9u, k1 += 0xBB67AE85u;\n"
    "    unsigned long long p0 = 0xD2511F53ull * c[0], p1 = 0xCD9E8D57ull * c[2];\n"
    "    unsigned n0 = (unsigned)(p1 >> 32) ^ c[1] ^ k0, n2 = (unsigned)(p0 >> 32) ^ c[3] ^ k1;\n"
    "    c[0] = n0, c[1] = (unsigned)p1, c[2] = n2, c[3] = (unsigned)p0;\n"
    "  }\n"
    "}\n"
    "__device__ __forceinline__ void draw_bits(unsigned w[4], const int *st, long long e, long long per, unsigned key) {\n"
    "  w[0] = per ? (unsigned)(e % per) : (unsigned)e;\n"
    "  w[1] = per ? (unsigned)st[3] + (unsigned)(e / per) : 0u;\n"
    "  w[2] = (unsigned)st[2], w[3] = key;\n"
    "  philox4x32_10(w, (unsigned)st[0], (unsigned)st[1]);\n"
    "}\n"
    "__device__ __forceinline__ unsigned long long bits53(unsigned a, unsigned b) {\n"
    "  return ((unsigned long long)a << 21) | (b >> 11);\n"
    "}\n"
    "// uniform [0, 1): the top 24 bits of w[0] (f32), 53 bits of w[0], w[1] (f64)\n"
    "__device__ __forceinline__ float rand_uniform_f32(const int *st, long long e, long long per, unsigned key) {\n"
    "  unsigned w[4];\n"
    "  draw_bits(w, st, e, per, key);\n"
    "  return (float)(w[0] >> 8) * 5.9604644775390625e-08f; // 2^-24\n"
    "}\n"
    "__device__ __forceinline__ double rand_uniform_f64(const int *st, long long e, long long per, unsigned key) {\n"
    "  unsigned w[4];\n"
    "  draw_bits(w, st, e, per, key);\n"
    "  return (double)bits53(w[0], w[1]) * 1.1102230246251565e-16; // 2^-53\n"
    "}\n"
    "// standard normal: Box-Muller in f64, u1 in (0, 1], u2 in [0, 1)\n"
    "__device__ __forceinline__ double rand_normal(const int *st, long long e, long long per, unsigned key) {\n"
    "  unsigned w[4];\n"
    "  draw_bits(w, st, e, per, key);\n"
    "  double u1 = (double)(bits53(w[0], w[1]) + 1ull) * 1.1102230246251565e-16;\n"
    "  double u2 = (double)bits53(w[2], w[3]) * 1.1102230246251565e-16;\n"
    "  double r = sqrt(-2.0 * log(u1));\n"
    "  double c = cos(6.283185307179586 * u2);\n"
    "  return r * c;\n"
    "}\n";

/* ------------------------------------------------------------------ */
/* Writing                                                             */
/* ------------------------------------------------------------------ */

void cu_error(CuGen *g, const char *fmt, ...) {
  if (g->failed) return;
  g->failed = true;
  if (g->err && g->errlen) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g->err, g->errlen, fmt, ap);
    va_end(ap);
  }
}

void cu_line(CuGen *g, const char *fmt, ...) {
  for (int i = 0; i < g->indent; i++) sb_puts(&g->body, "  ");
  va_list ap;
  va_start(ap, fmt);
  sb_vprintf(&g->body, fmt, ap);
  va_end(ap);
  sb_putc(&g->body, '\n');
}

const char *cu_fmt(CuGen *g, const char *fmt, ...) {
  StrBuf sb;
  sb_init(&sb);
  va_list ap;
  va_start(ap, fmt);
  sb_vprintf(&sb, fmt, ap);
  va_end(ap);
  const char *s = arena_strdup(g->a, sb_str(&sb));
  sb_free(&sb);
  return s;
}

const char *cu_param(CuGen *g, const IrValue *v, int64_t elem, bool out) {
  for (int i = 0; i < g->nparams; i++)
    if (g->params[i].v == v && g->params[i].elem == elem) {
      g->params[i].out |= out;
      return g->pname[i];
    }
  if (v->storage == IR_STORE_NONE)
    cu_error(g, "value %%%s (%s) has no storage (run memplan first)", v->name ? v->name : "?",
             ir_op_info[v->def ? v->def->opcode : IR_OP_CONST].name);
  if (g->nparams == g->capparams) {
    int cap = g->capparams ? 2 * g->capparams : 8;
    CuParam *p = ARENA_ARRAY(g->a, CuParam, cap);
    const char **n = ARENA_ARRAY(g->a, const char *, cap);
    if (g->nparams) {
      memcpy(p, g->params, sizeof *p * (size_t)g->nparams);
      memcpy(n, g->pname, sizeof *n * (size_t)g->nparams);
    }
    g->params = p, g->pname = n, g->capparams = cap;
  }
  int i = g->nparams++;
  g->params[i] = (CuParam){v, elem, out, v->storage == IR_STORE_GRAD};
  g->pname[i] = out ? cu_fmt(g, "out%d", g->nout++) : cu_fmt(g, "in%d", g->nin++);
  return g->pname[i];
}

/* ------------------------------------------------------------------ */
/* Types, literals, memory                                             */
/* ------------------------------------------------------------------ */

const char *cu_reg_type(IrDType dt) {
  switch (dt) {
  case IR_DT_F32:
  case IR_DT_BF16:
  case IR_DT_F16: return "float";
  case IR_DT_F64: return "double";
  case IR_DT_I32: return "int";
  case IR_DT_BOOL: return "bool";
  }
  return "float";
}

const char *cu_mem_type(IrDType dt, bool grad) {
  if (grad) return dt == IR_DT_F64 ? "double" : "float";
  switch (dt) {
  case IR_DT_F32: return "float";
  case IR_DT_F64: return "double";
  case IR_DT_BF16: return "bf16_t";
  case IR_DT_F16: return "f16_t";
  case IR_DT_I32: return "int";
  case IR_DT_BOOL: return "unsigned char";
  }
  return "float";
}

const char *cu_acc_type(IrDType dt) { return dt == IR_DT_F64 ? "double" : dt == IR_DT_I32 ? "int" : "float"; }

/* A finite double as a C literal that reads back exactly. */
static const char *real(CuGen *g, double v, bool f32) {
  char buf[64];
  fmt_double(buf, sizeof buf, v);
  bool point = strpbrk(buf, ".e") != NULL;
  return cu_fmt(g, "%s%s%s%s%s", v < 0 ? "(" : "", buf, point ? "" : ".0", f32 ? "f" : "", v < 0 ? ")" : "");
}

const char *cu_lit(CuGen *g, IrDType dt, double v) {
  switch (dt) {
  case IR_DT_F32:
  case IR_DT_BF16:
  case IR_DT_F16: {
    double r = ir_round_dtype(v, dt);
    if (isnan(r)) return "GRADC_NAN";
    if (isinf(r)) return r > 0 ? "GRADC_INF" : "(-GRADC_INF)";
    return real(g, (double)(float)r, true);
  }
  case IR_DT_F64:
    if (isnan(v)) return "GRADC_NAN_D";
    if (isinf(v)) return v > 0 ? "GRADC_INF_D" : "(-GRADC_INF_D)";
    return real(g, v, false);
  case IR_DT_I32: {
    long long i = isfinite(v) ? (long long)trunc(v) : 0;
    if (i == INT32_MIN) return "(-2147483647 - 1)";
    return i < 0 ? cu_fmt(g, "(%lld)", i) : cu_fmt(g, "%lld", i);
  }
  case IR_DT_BOOL: return v != 0 ? "true" : "false";
  }
  return "0";
}

const char *cu_lowest(CuGen *g, IrDType dt) {
  if (dt == IR_DT_I32) return "(-2147483647 - 1)";
  return cu_lit(g, dt, -INFINITY);
}

const char *cu_load(CuGen *g, IrDType dt, bool grad, const char *lv) {
  if (grad) return lv;
  switch (dt) {
  case IR_DT_BF16: return cu_fmt(g, "bf16_to_f32(%s)", lv);
  case IR_DT_F16: return cu_fmt(g, "f16_to_f32(%s)", lv);
  case IR_DT_BOOL: return cu_fmt(g, "(%s != 0)", lv);
  case IR_DT_F32:
  case IR_DT_F64:
  case IR_DT_I32: return lv;
  }
  return lv;
}

void cu_store(CuGen *g, IrDType dt, bool grad, const char *lv, const char *x) {
  if (grad) {
    if (!ir_dtype_is_float(dt)) cu_error(g, "a gradient buffer holds a %s value", ir_dtype_name(dt));
    cu_line(g, "%s += %s;", lv, dt == IR_DT_F64 ? x : dt == IR_DT_F32 ? x : cu_fmt(g, "(float)%s", x));
    return;
  }
  switch (dt) {
  case IR_DT_BF16: cu_line(g, "%s = f32_to_bf16(%s);", lv, x); break;
  case IR_DT_F16: cu_line(g, "%s = f32_to_f16(%s);", lv, x); break;
  case IR_DT_BOOL: cu_line(g, "%s = (unsigned char)%s;", lv, x); break;
  case IR_DT_F32:
  case IR_DT_F64:
  case IR_DT_I32: cu_line(g, "%s = %s;", lv, x); break;
  }
}

const char *cu_round(CuGen *g, IrDType dt, const char *x) {
  if (dt == IR_DT_BF16) return cu_fmt(g, "round_bf16(%s)", x);
  if (dt == IR_DT_F16) return cu_fmt(g, "round_f16(%s)", x);
  return x;
}

const char *cu_math1(CuGen *g, const char *fn, IrDType dt, const char *x) {
  return cu_fmt(g, "%s%s(%s)", fn, dt == IR_DT_F64 ? "" : "f", x);
}

/* ------------------------------------------------------------------ */
/* Elementwise ops                                                     */
/* ------------------------------------------------------------------ */

static bool is_float(IrDType dt) { return ir_dtype_is_float(dt); }

const char *cu_convert(CuGen *g, const char *x, IrDType from, IrDType to) {
  if (from == to) return x;
  bool d = from == IR_DT_F64;
  if (is_float(from) && is_float(to)) {
    if (to == IR_DT_F64) return cu_fmt(g, "(double)%s", x);
    return cu_round(g, to, d ? cu_fmt(g, "(float)%s", x) : x);
  }
  if (is_float(from) && to == IR_DT_I32) /* toward zero as a C cast; non-finite values give 0 */
    return cu_fmt(g, "(%s(%s) < %s ? (int)%s : 0)", d ? "fabs" : "fabsf", x, d ? "GRADC_INF_D" : "GRADC_INF", x);
  if (is_float(from) && to == IR_DT_BOOL) return cu_fmt(g, "(%s != %s)", x, d ? "0.0" : "0.0f");
  if (from == IR_DT_I32 && is_float(to))
    return to == IR_DT_F64 ? cu_fmt(g, "(double)%s", x) : cu_round(g, to, cu_fmt(g, "(float)%s", x));
  if (from == IR_DT_BOOL && is_float(to)) return cu_fmt(g, "(%s ? %s : %s)", x, cu_lit(g, to, 1), cu_lit(g, to, 0));
  if (from == IR_DT_I32 && to == IR_DT_BOOL) return cu_fmt(g, "(%s != 0)", x);
  if (from == IR_DT_BOOL && to == IR_DT_I32) return cu_fmt(g, "(%s ? 1 : 0)", x);
  cu_error(g, "cannot convert %s to %s", ir_dtype_name(from), ir_dtype_name(to));
  return x;
}

static const char *binop(CuGen *g, const char *a, const char *op, const char *b) {
  return cu_fmt(g, "(%s %s %s)", a, op, b);
}

const char *cu_elementwise(CuGen *g, const IrOp *op, const char *const *x) {
  IrDType dt = op->result->type.dtype;
  IrDType in = op->nargs ? op->args[0]->type.dtype : dt;
  bool fl = is_float(in), d = in == IR_DT_F64;
  const char *r = NULL;
  switch (op->opcode) {
  case IR_OP_NEG: r = cu_fmt(g, "(-%s)", x[0]); break;
  case IR_OP_EXP: r = cu_math1(g, "exp", in, x[0]); break;
  case IR_OP_LOG: r = cu_math1(g, "log", in, x[0]); break;
  case IR_OP_SQRT: r = cu_math1(g, "sqrt", in, x[0]); break;
  case IR_OP_RSQRT: r = cu_fmt(g, "(%s / %s)", d ? "1.0" : "1.0f", cu_math1(g, "sqrt", in, x[0])); break;
  case IR_OP_TANH: r = cu_math1(g, "tanh", in, x[0]); break;
  case IR_OP_SIGMOID: r = cu_fmt(g, "sigmoid(%s)", x[0]); break;
  case IR_OP_RELU: r = cu_fmt(g, "relu(%s)", x[0]); break;
  case IR_OP_GELU: r = cu_fmt(g, "gelu(%s)", x[0]); break;
  case IR_OP_GELU_GRAD: r = cu_fmt(g, "gelu_grad(%s)", x[0]); break;
  case IR_OP_SILU: r = cu_fmt(g, "silu(%s)", x[0]); break;
  case IR_OP_ABS: r = fl ? cu_math1(g, "fabs", in, x[0]) : cu_fmt(g, "abs(%s)", x[0]); break;
  case IR_OP_SIGN: r = cu_fmt(g, "sign(%s)", x[0]); break;
  case IR_OP_CLAMP: { /* torch.clamp: below min -> min, then above max -> max; NaN stays */
    r = x[0];
    if (ir_attr_get(op, "min")) {
      const char *lo = cu_lit(g, d ? IR_DT_F64 : IR_DT_F32, ir_attr_get_float(op, "min", 0));
      r = cu_fmt(g, "(%s < %s ? %s : %s)", r, lo, lo, r);
    }
    if (ir_attr_get(op, "max")) {
      const char *hi = cu_lit(g, d ? IR_DT_F64 : IR_DT_F32, ir_attr_get_float(op, "max", 0));
      r = cu_fmt(g, "(%s > %s ? %s : %s)", r, hi, hi, r);
    }
    break;
  }
  case IR_OP_SIN: r = cu_math1(g, "sin", in, x[0]); break;
  case IR_OP_COS: r = cu_math1(g, "cos", in, x[0]); break;
  case IR_OP_LOG1P: r = cu_math1(g, "log1p", in, x[0]); break;
  case IR_OP_SOFTPLUS: r = cu_fmt(g, "softplus(%s)", x[0]); break;
  case IR_OP_ERF: r = cu_math1(g, "erf", in, x[0]); break;
  case IR_OP_GELU_ERF: r = cu_fmt(g, "gelu_erf(%s)", x[0]); break;
  case IR_OP_GELU_ERF_GRAD: r = cu_fmt(g, "gelu_erf_grad(%s)", x[0]); break;
  case IR_OP_POW: {
    double p = ir_attr_get_float(op, "exponent", 1.0);
    if (p == 1.0)
      r = x[0];
    else if (p == 2.0)
      r = cu_fmt(g, "sq(%s)", x[0]);
    else
      r = cu_fmt(g, "%s(%s, %s)", d ? "pow" : "powf", x[0], cu_lit(g, d ? IR_DT_F64 : IR_DT_F32, p));
    break;
  }
  case IR_OP_CAST: return cu_convert(g, x[0], in, dt);
  case IR_OP_DETACH:
  case IR_OP_BROADCAST: return x[0];
  case IR_OP_ADD: r = binop(g, x[0], "+", x[1]); break;
  case IR_OP_SUB: r = binop(g, x[0], "-", x[1]); break;
  case IR_OP_MUL:
  case IR_OP_LOSS_TERM: r = binop(g, x[0], "*", x[1]); break;
  case IR_OP_DIV: r = fl ? binop(g, x[0], "/", x[1]) : cu_fmt(g, "idiv(%s, %s)", x[0], x[1]); break;
  case IR_OP_MAXIMUM: r = cu_fmt(g, "maximum(%s, %s)", x[0], x[1]); break;
  case IR_OP_MINIMUM: r = cu_fmt(g, "minimum(%s, %s)", x[0], x[1]); break;
  case IR_OP_EQ: return binop(g, x[0], "==", x[1]);
  case IR_OP_NE: return binop(g, x[0], "!=", x[1]);
  case IR_OP_LT: return binop(g, x[0], "<", x[1]);
  case IR_OP_LE: return binop(g, x[0], "<=", x[1]);
  case IR_OP_GT: return binop(g, x[0], ">", x[1]);
  case IR_OP_GE: return binop(g, x[0], ">=", x[1]);
  case IR_OP_SELECT: return cu_fmt(g, "(%s ? %s : %s)", x[0], x[1], x[2]);
  case IR_OP_GRAD_SEED: { /* coef * x in double, as the interpreter */
    const char *c = cu_lit(g, IR_DT_F64, ir_attr_get_float(op, "coef", 1.0));
    r = d ? cu_fmt(g, "(%s * %s)", x[0], c) : cu_fmt(g, "(float)((double)%s * %s)", x[0], c);
    break;
  }
  case IR_OP_MSE_LOSS: r = cu_fmt(g, "sq(%s - %s)", x[0], x[1]); break;
  KP_CASES_NOT_EW: break;
  }
  if (!r) {
    cu_error(g, "'%s' is not an elementwise op", ir_op_info[op->opcode].name);
    return "0";
  }
  return is_float(dt) ? cu_round(g, dt, r) : r;
}

/* ------------------------------------------------------------------ */
/* Shapes and indices                                                  */
/* ------------------------------------------------------------------ */

const char *cu_add(CuGen *g, const char *a, const char *b) {
  if (strcmp(a, "0") == 0) return b;
  if (strcmp(b, "0") == 0) return a;
  return cu_fmt(g, "%s + %s", a, b);
}

static const char *num(CuGen *g, int64_t v) { return cu_fmt(g, "%lld%s", (long long)v, v > INT32_MAX ? "L" : ""); }

const char *cu_random(CuGen *g, const IrOp *op, const char *state, const char *e) {
  bool normal = strcmp(ir_attr_get_str(op, "dist", "uniform"), "normal") == 0;
  bool f64 = op->result->type.dtype == IR_DT_F64;
  long long per = ir_random_batched(op) ? (long long)ir_random_per_sample(op) : 0;
  unsigned key = (unsigned)ir_attr_get_int(op, "key", 0);
  const char *fn = normal ? "rand_normal" : f64 ? "rand_uniform_f64" : "rand_uniform_f32";
  const char *call = cu_fmt(g, "%s(%s, %s, %lldLL, %uu)", fn, state, e, per, key);
  return normal && !f64 ? cu_fmt(g, "(float)%s", call) : call;
}

const char *cu_index(CuGen *g, const char *i, const int64_t *dims, const int64_t *stride, int n) {
  int64_t ext[IR_MAX_RANK], st[IR_MAX_RANK];
  int m = kp_merge_axes(dims, stride, n, ext, st);
  StrBuf sb;
  sb_init(&sb);
  int64_t inner = 1;
  for (int k = m - 1; k >= 0; k--) {
    if (st[k] != 0) {
      const char *q = inner == 1 ? i : cu_fmt(g, "%s / %s", i, num(g, inner));
      if (k > 0) q = cu_fmt(g, "%s %% %s", inner == 1 ? q : cu_fmt(g, "(%s)", q), num(g, ext[k]));
      if (sb.len) sb_puts(&sb, " + ");
      bool simple = strcspn(q, " +-*/%") == strlen(q);
      if (st[k] == 1)
        sb_puts(&sb, simple ? q : cu_fmt(g, "(%s)", q));
      else
        sb_printf(&sb, simple ? "%s * %s" : "(%s) * %s", q, num(g, st[k]));
    }
    inner *= ext[k];
  }
  const char *r = arena_strdup(g->a, sb.len ? sb_str(&sb) : "0");
  sb_free(&sb);
  return r;
}
