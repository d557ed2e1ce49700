/* llvm_ops.c - the LLVM code generator's scalar layer: register and memory
 * types, constants, loads and stores (bf16/f16 converted inline, never
 * through libgcc helpers such as __truncsfbf2, which Debian 12 lacks;
 * gradient buffers accumulate), the elementwise ops with the reference
 * interpreter's semantics (runtime/interp.c), and counted loops. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llvm_gen.h"

void gen_error(Gen *g, const char *fmt, ...) {
  if (g->failed) return;
  g->failed = true;
  if (g->err && g->errlen) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g->err, g->errlen, fmt, ap);
    va_end(ap);
  }
}

/* ------------------------------------------------------------------ */
/* Types and constants                                                 */
/* ------------------------------------------------------------------ */

LLVMTypeRef gen_reg_type(Gen *g, IrDType dt) {
  switch (dt) {
  case IR_DT_F32:
  case IR_DT_BF16:
  case IR_DT_F16: return g->t_f32;
  case IR_DT_F64: return g->t_f64;
  case IR_DT_I32: return g->t_i32;
  case IR_DT_BOOL: return g->t_i1;
  }
  return g->t_f32;
}

LLVMTypeRef gen_mem_type(Gen *g, IrDType dt) {
  switch (dt) {
  case IR_DT_F32: return g->t_f32;
  case IR_DT_F64: return g->t_f64;
  case IR_DT_BF16:
  case IR_DT_F16: return g->t_i16;
  case IR_DT_I32: return g->t_i32;
  case IR_DT_BOOL: return g->t_i8;
  }
  return g->t_f32;
}

LLVMTypeRef gen_grad_type(Gen *g, IrDType dt) { return dt == IR_DT_F64 ? g->t_f64 : g->t_f32; }

static bool is_float(IrDType dt) { return ir_dtype_is_float(dt); }

/* Round to a binary format with p significand bits and exponents
 * emin..emax, to nearest even (as the reference interpreter does). */
static double round_format(double x, int p, int emin, int emax) {
  if (!isfinite(x) || x == 0) return x;
  int e;
  frexp(x, &e);
  int ex = e - 1 < emin ? emin : e - 1;
  double q = ldexp(1.0, ex - (p - 1));
  double r = nearbyint(x / q) * q;
  if (fabs(r) > ldexp(2.0 - ldexp(1.0, 1 - p), emax)) return copysign(INFINITY, x);
  return r;
}

LLVMValueRef gen_const(Gen *g, IrDType dt, double v) {
  switch (dt) {
  case IR_DT_F32: return LLVMConstReal(g->t_f32, (double)(float)v);
  case IR_DT_F64: return LLVMConstReal(g->t_f64, v);
  case IR_DT_BF16: return LLVMConstReal(g->t_f32, round_format(v, 8, -126, 127));
  case IR_DT_F16: return LLVMConstReal(g->t_f32, round_format(v, 11, -14, 15));
  case IR_DT_I32: return LLVMConstInt(g->t_i32, (unsigned long long)(long long)(isfinite(v) ? trunc(v) : 0), 1);
  case IR_DT_BOOL: return LLVMConstInt(g->t_i1, v != 0, 0);
  }
  return LLVMConstReal(g->t_f32, v);
}

LLVMValueRef gen_i64(Gen *g, int64_t v) { return LLVMConstInt(g->t_i64, (unsigned long long)v, 1); }
static LLVMValueRef i32c(Gen *g, int64_t v) { return LLVMConstInt(g->t_i32, (unsigned long long)v, 1); }
static LLVMValueRef f32c(Gen *g, double v) { return LLVMConstReal(g->t_f32, v); }

/* ------------------------------------------------------------------ */
/* Intrinsics and libm                                                 */
/* ------------------------------------------------------------------ */

LLVMValueRef gen_intrinsic(Gen *g, const char *name, LLVMTypeRef *over, int nover, LLVMValueRef *args, int nargs) {
  unsigned id = LLVMLookupIntrinsicID(name, strlen(name));
  if (!id) {
    gen_error(g, "LLVM has no intrinsic %s", name);
    return args[0];
  }
  LLVMValueRef fn = LLVMGetIntrinsicDeclaration(g->mod, id, over, (size_t)nover);
  LLVMTypeRef ft = LLVMIntrinsicGetType(g->ctx, id, over, (size_t)nover);
  return LLVMBuildCall2(g->b, ft, fn, args, (unsigned)nargs, "");
}

LLVMValueRef gen_call1(Gen *g, const char *name, LLVMValueRef x) {
  LLVMTypeRef t = LLVMTypeOf(x);
  return gen_intrinsic(g, name, &t, 1, &x, 1);
}

static LLVMValueRef call2(Gen *g, const char *name, LLVMValueRef x, LLVMValueRef y) {
  LLVMTypeRef t = LLVMTypeOf(x);
  LLVMValueRef args[2] = {x, y};
  return gen_intrinsic(g, name, &t, 1, args, 2);
}

LLVMValueRef gen_libm1(Gen *g, const char *fname, LLVMValueRef x) {
  LLVMTypeRef t = LLVMTypeOf(x);
  char name[32];
  snprintf(name, sizeof name, "%s%s", fname, t == g->t_f32 ? "f" : "");
  LLVMTypeRef ft = LLVMFunctionType(t, &t, 1, 0);
  LLVMValueRef fn = LLVMGetNamedFunction(g->mod, name);
  if (!fn) {
    fn = LLVMAddFunction(g->mod, name, ft);
    LLVMSetLinkage(fn, LLVMExternalLinkage);
  }
  return LLVMBuildCall2(g->b, ft, fn, &x, 1, "");
}

static LLVMValueRef bits(Gen *g, LLVMValueRef x) { return LLVMBuildBitCast(g->b, x, g->t_i32, ""); }
static LLVMValueRef from_bits(Gen *g, LLVMValueRef i) { return LLVMBuildBitCast(g->b, i, g->t_f32, ""); }
static LLVMValueRef fc(LLVMValueRef like, double v) { return LLVMConstReal(LLVMTypeOf(like), v); }

/* The round-to-integer constant of exp_reduced: 1.5 * 2^23, whose ulp
 * is 1, plus the exponent bias. */
#define EXP_SHIFT (12582912.0 + 127.0)
#define EXP_SHIFT_BITS 0x4B40007F /* its bits as an f32 */

/* The core of Cephes expf for a clamped f32 argument xc: e^r for
 * r = xc - n ln 2 (ln 2 in two parts, n = round(xc log2 e)) by a degree-7
 * polynomial, 1 + r + r^2 P(r) with P of degree 5.  n comes from one
 * multiply-add, t = xc log2 e + EXP_SHIFT,
 * which leaves n + 127 in the low bits of t's significand: *tb, t's bits,
 * shifted left 23 is 2^n as a float (the bits of 1.5 * 2^23 shift out), and
 * t - EXP_SHIFT is n exactly.  That replaces a round, a float-to-int
 * conversion and an integer add, on the pipes the kernels of exp are bound by. */
static LLVMValueRef exp_reduced(Gen *g, LLVMValueRef xc, LLVMValueRef *tb) {
  LLVMBuilderRef b = g->b;
  LLVMTypeRef ft = LLVMTypeOf(xc);
  LLVMValueRef args[3] = {xc, fc(xc, 1.44269504088896341), fc(xc, EXP_SHIFT)};
  LLVMValueRef t = gen_intrinsic(g, "llvm.fmuladd", &ft, 1, args, 3); /* exact: the callers clamp |xc| below 150 */
  LLVMValueRef fx = LLVMBuildFSub(b, t, fc(xc, EXP_SHIFT), "");
  LLVMValueRef r = LLVMBuildFSub(b, xc, LLVMBuildFMul(b, fx, fc(xc, 0.693359375), ""), "");
  r = LLVMBuildFSub(b, r, LLVMBuildFMul(b, fx, fc(xc, -2.12194440e-4), ""), "");
  static const double c[] = {1.9875691500E-4, 1.3981999507E-3, 8.3334519073E-3,
                             4.1665795894E-2, 1.6666665459E-1, 5.0000001201E-1};
  LLVMValueRef y = fc(xc, c[0]);
  for (int i = 1; i < 6; i++) y = LLVMBuildFAdd(b, LLVMBuildFMul(b, y, r, ""), fc(xc, c[i]), "");
  *tb = bits(g, t);
  /* 1 + r + r^2 y as 1 + r (1 + r y): two multiply-adds where r^2, a
   * multiply-add and an add took three.  1 + r y lies in [0.8, 1.2], so
   * its rounding adds at most |r| ulp / 2 < 0.2 ulp to the result's. */
  LLVMValueRef q[3] = {r, y, fc(xc, 1.0)};
  LLVMValueRef u = gen_intrinsic(g, "llvm.fmuladd", &ft, 1, q, 3);
  LLVMValueRef e[3] = {r, u, fc(xc, 1.0)};
  return gen_intrinsic(g, "llvm.fmuladd", &ft, 1, e, 3);
}

/* 2^n as a float: n + 127 in the exponent field (-126 <= n <= 127). */
static LLVMValueRef pow2i(Gen *g, LLVMValueRef n) {
  return from_bits(g, LLVMBuildShl(g->b, LLVMBuildAdd(g->b, n, i32c(g, 127), ""), i32c(g, 23), ""));
}

/* exp in f32 without a libm call, so that loops vectorise (Cephes expf,
 * exp_reduced), scaled by 2^n in two steps so that subnormal results round
 * once; about 1 ulp.  f64 keeps libm's exp, the interpreter's own. */
LLVMValueRef gen_exp(Gen *g, LLVMValueRef x) {
  if (LLVMTypeOf(x) != g->t_f32) return gen_call1(g, "llvm.exp", x);
  LLVMBuilderRef b = g->b;
  LLVMValueRef n, xc = call2(g, "llvm.maxnum", call2(g, "llvm.minnum", x, fc(x, 89.0)), fc(x, -104.0));
  LLVMValueRef y = exp_reduced(g, xc, &n);
  n = LLVMBuildSub(b, n, i32c(g, EXP_SHIFT_BITS), "");
  LLVMValueRef n1 = LLVMBuildAShr(b, n, i32c(g, 1), ""), n2 = LLVMBuildSub(b, n, n1, "");
  y = LLVMBuildFMul(b, LLVMBuildFMul(b, y, pow2i(g, n1), ""), pow2i(g, n2), "");
  y = LLVMBuildSelect(b, LLVMBuildFCmp(b, LLVMRealOGT, x, fc(x, 88.72283935546875), ""), fc(x, INFINITY), y, "");
  y = LLVMBuildSelect(b, LLVMBuildFCmp(b, LLVMRealOLT, x, fc(x, -103.972076416), ""), fc(x, 0.0), y, "");
  return LLVMBuildSelect(b, gen_isnan(g, x), x, y, "");
}

/* exp of an argument known to be <= 0 (or NaN): x - max(x) in softmax and
 * its kin, -|x| in sigmoid.  The result lies in [0, 1], so no overflow
 * to handle, and a result below FLT_MIN (x < ln FLT_MIN) is taken as 0:
 * then 2^n is one normal float and scales once.  About a third fewer
 * instructions than gen_exp, which the elementwise kernels of gelu and
 * the softmax rows are bound by.  Within 1 ulp of gen_exp above FLT_MIN;
 * e^x for -103.97 < x < -87.34 (a subnormal, under 1.2e-38) becomes 0, as
 * PyTorch's f32 tanh-gelu gives 0 there too.  f64 keeps libm's exp. */
LLVMValueRef gen_exp_nonpos(Gen *g, LLVMValueRef x) {
  if (LLVMTypeOf(x) != g->t_f32) return gen_call1(g, "llvm.exp", x);
  LLVMBuilderRef b = g->b;
  const double lo = -87.3365478515625; /* ln FLT_MIN, to f32 */
  /* One compare both clamps and zeroes.  A NaN passes it and stays NaN to
   * the end: the rounding by EXP_SHIFT has no float-to-int conversion to
   * make it poison, and NaN times any 2^n is NaN. */
  LLVMValueRef under = LLVMBuildFCmp(b, LLVMRealOLT, x, fc(x, lo), "");
  LLVMValueRef n, y = exp_reduced(g, LLVMBuildSelect(b, under, fc(x, lo), x, ""), &n);
  y = LLVMBuildFMul(b, y, from_bits(g, LLVMBuildShl(b, n, i32c(g, 23), "")), ""); /* 2^n, -126 <= n <= 0 */
  return LLVMBuildSelect(b, under, fc(x, 0.0), y, "");
}

/* tanh in f32 without a libm call (Cephes tanhf): an odd polynomial below
 * 0.625, else 1 - 2 / (e^2|x| + 1) with the sign of x. */
static LLVMValueRef tanh_f32(Gen *g, LLVMValueRef x) {
  LLVMBuilderRef b = g->b;
  LLVMValueRef a = gen_call1(g, "llvm.fabs", x);
  LLVMValueRef z = LLVMBuildFMul(b, x, x, "");
  static const double c[] = {-5.70498872745E-3, 2.06390887954E-2, -5.37397155531E-2, 1.33314422036E-1,
                             -3.33332819422E-1};
  LLVMValueRef p = fc(x, c[0]);
  for (int i = 1; i < 5; i++) p = LLVMBuildFAdd(b, LLVMBuildFMul(b, p, z, ""), fc(x, c[i]), "");
  LLVMValueRef small = LLVMBuildFAdd(b, x, LLVMBuildFMul(b, LLVMBuildFMul(b, x, z, ""), p, ""), "");
  LLVMValueRef e = gen_exp(g, LLVMBuildFMul(b, a, fc(x, 2.0), ""));
  LLVMValueRef big = LLVMBuildFSub(b, fc(x, 1.0), LLVMBuildFDiv(b, fc(x, 2.0), LLVMBuildFAdd(b, e, fc(x, 1.0), ""), ""), "");
  big = call2(g, "llvm.copysign", big, x);
  LLVMValueRef r = LLVMBuildSelect(b, LLVMBuildFCmp(b, LLVMRealOLT, a, fc(x, 0.625), ""), small, big, "");
  return LLVMBuildSelect(b, gen_isnan(g, x), x, r, "");
}

LLVMValueRef gen_isnan(Gen *g, LLVMValueRef x) { return LLVMBuildFCmp(g->b, LLVMRealUNO, x, x, ""); }

LLVMValueRef gen_isfinite(Gen *g, LLVMValueRef x) {
  LLVMValueRef a = gen_call1(g, "llvm.fabs", x);
  return LLVMBuildFCmp(g->b, LLVMRealOLT, a, LLVMConstReal(LLVMTypeOf(x), INFINITY), "");
}

/* llvm.maximum propagates NaN like the interpreter's loop and vectorises
 * as a reduction; only the sign of a zero maximum may differ, and saying
 * so (nsz) lets x86 reduce a vector of maxima without testing signs
 * (docs/DECISIONS.md "Row maxima ignore the sign of a zero"). */
LLVMValueRef gen_max_step(Gen *g, LLVMValueRef m, LLVMValueRef x) {
  if (LLVMGetTypeKind(LLVMTypeOf(x)) == LLVMIntegerTypeKind)
    return LLVMBuildSelect(g->b, LLVMBuildICmp(g->b, LLVMIntSGT, x, m, ""), x, m, "");
  LLVMValueRef r = call2(g, "llvm.maximum", m, x);
  LLVMSetFastMathFlags(r, LLVMFastMathNoSignedZeros);
  return r;
}

LLVMTypeRef gen_acc_type(Gen *g, IrDType dt) { return dt == IR_DT_I32 ? g->t_i32 : g->t_f64; }

LLVMValueRef gen_widen(Gen *g, LLVMValueRef x) {
  return LLVMTypeOf(x) == g->t_f32 ? LLVMBuildFPExt(g->b, x, g->t_f64, "") : x;
}

LLVMValueRef gen_narrow(Gen *g, LLVMValueRef x, IrDType dt) {
  LLVMTypeRef t = gen_reg_type(g, dt);
  if (LLVMTypeOf(x) != t && LLVMGetTypeKind(t) == LLVMFloatTypeKind) x = LLVMBuildFPTrunc(g->b, x, t, "");
  return gen_round(g, x, dt);
}

LLVMValueRef gen_add_reassoc(Gen *g, LLVMValueRef a, LLVMValueRef b) {
  if (LLVMGetTypeKind(LLVMTypeOf(a)) == LLVMIntegerTypeKind) return LLVMBuildAdd(g->b, a, b, ""); /* i32 sums */
  LLVMValueRef r = LLVMBuildFAdd(g->b, a, b, "");
  if (LLVMIsAInstruction(r)) LLVMSetFastMathFlags(r, LLVMFastMathAllowReassoc);
  return r;
}

/* ------------------------------------------------------------------ */
/* bf16 and f16, inline                                                */
/* ------------------------------------------------------------------ */

/* The top 16 of 32 bits: a bf16 value's bits. */
static LLVMValueRef top_half(Gen *g, LLVMValueRef u) {
  return LLVMBuildTrunc(g->b, LLVMBuildLShr(g->b, u, i32c(g, 16), ""), g->t_i16, "");
}

/* f32 -> bf16 bits, round to nearest even; NaN stays a (quiet) NaN. */
static LLVMValueRef f32_to_bf16(Gen *g, LLVMValueRef x) {
  LLVMValueRef u = bits(g, x);
  LLVMValueRef lsb = LLVMBuildAnd(g->b, LLVMBuildLShr(g->b, u, i32c(g, 16), ""), i32c(g, 1), "");
  LLVMValueRef r = LLVMBuildAdd(g->b, u, LLVMBuildAdd(g->b, lsb, i32c(g, 0x7fff), ""), "");
  LLVMValueRef nan = LLVMBuildOr(g->b, u, i32c(g, 0x400000), "");
  return top_half(g, LLVMBuildSelect(g->b, gen_isnan(g, x), nan, r, ""));
}

/* bf16 bits -> the float they are; the register is then exact (gen_store). */
static LLVMValueRef bf16_to_f32(Gen *g, LLVMValueRef h) {
  LLVMValueRef x = from_bits(g, LLVMBuildShl(g->b, LLVMBuildZExt(g->b, h, g->t_i32, ""), i32c(g, 16), ""));
  g->exact_bf16[g->nexact_bf16++ % GEN_EXACT_BF16] = x;
  return x;
}

/* Whether register x is known to hold a bf16 value exactly (Gen.exact_bf16). */
static bool exact_bf16(const Gen *g, LLVMValueRef x) {
  int n = g->nexact_bf16 < GEN_EXACT_BF16 ? g->nexact_bf16 : GEN_EXACT_BF16;
  for (int i = 0; i < n; i++)
    if (g->exact_bf16[i] == x) return true;
  return false;
}

/* Round a float to f16's precision in the float domain: spacing
 * q = 2^(max(e, -14) - 10), r = roundeven(x / q) * q, overflow to inf. */
static LLVMValueRef round_f16(Gen *g, LLVMValueRef x) {
  LLVMValueRef u = bits(g, x);
  LLVMValueRef e = LLVMBuildSub(g->b, LLVMBuildAnd(g->b, LLVMBuildLShr(g->b, u, i32c(g, 23), ""), i32c(g, 0xff), ""),
                                i32c(g, 127), "");
  LLVMValueRef small = LLVMBuildICmp(g->b, LLVMIntSLT, e, i32c(g, -14), "");
  LLVMValueRef ex = LLVMBuildSelect(g->b, small, i32c(g, -14), e, "");
  LLVMValueRef q = from_bits(g, LLVMBuildShl(g->b, LLVMBuildAdd(g->b, ex, i32c(g, 127 - 10), ""), i32c(g, 23), ""));
  LLVMValueRef r = LLVMBuildFMul(g->b, gen_call1(g, "llvm.roundeven", LLVMBuildFDiv(g->b, x, q, "")), q, "");
  LLVMValueRef big = LLVMBuildFCmp(g->b, LLVMRealOGT, gen_call1(g, "llvm.fabs", r), f32c(g, 65504.0), "");
  LLVMValueRef inf = call2(g, "llvm.copysign", f32c(g, INFINITY), x);
  r = LLVMBuildSelect(g->b, big, inf, r, "");
  LLVMValueRef keep = LLVMBuildOr(g->b, LLVMBuildNot(g->b, gen_isfinite(g, x), ""),
                                  LLVMBuildFCmp(g->b, LLVMRealOEQ, x, f32c(g, 0.0), ""), "");
  return LLVMBuildSelect(g->b, keep, x, r, "");
}

/* An f16-representable float -> f16 bits. */
static LLVMValueRef f32_to_f16(Gen *g, LLVMValueRef x) {
  LLVMValueRef u = bits(g, x);
  LLVMValueRef sign = LLVMBuildAnd(g->b, LLVMBuildLShr(g->b, u, i32c(g, 16), ""), i32c(g, 0x8000), "");
  LLVMValueRef a = gen_call1(g, "llvm.fabs", x);
  LLVMValueRef au = bits(g, a);
  /* normal: rebias the exponent, keep the top 10 mantissa bits */
  LLVMValueRef ne = LLVMBuildSub(g->b, LLVMBuildLShr(g->b, au, i32c(g, 23), ""), i32c(g, 127 - 15), "");
  LLVMValueRef nm = LLVMBuildAnd(g->b, LLVMBuildLShr(g->b, au, i32c(g, 13), ""), i32c(g, 0x3ff), "");
  LLVMValueRef normal = LLVMBuildOr(g->b, LLVMBuildShl(g->b, ne, i32c(g, 10), ""), nm, "");
  /* subnormal (and zero): the count of 2^-24 steps */
  LLVMValueRef sub = LLVMBuildFPToUI(g->b, LLVMBuildFMul(g->b, a, f32c(g, 16777216.0), ""), g->t_i32, "");
  LLVMValueRef isnormal = LLVMBuildFCmp(g->b, LLVMRealOGE, a, f32c(g, ldexp(1.0, -14)), "");
  LLVMValueRef h = LLVMBuildSelect(g->b, isnormal, normal, sub, "");
  LLVMValueRef isinf = LLVMBuildFCmp(g->b, LLVMRealOEQ, a, f32c(g, INFINITY), "");
  h = LLVMBuildSelect(g->b, isinf, i32c(g, 0x7c00), h, "");
  h = LLVMBuildSelect(g->b, gen_isnan(g, x), i32c(g, 0x7e00), h, "");
  return LLVMBuildTrunc(g->b, LLVMBuildOr(g->b, h, sign, ""), g->t_i16, "");
}

static LLVMValueRef f16_to_f32(Gen *g, LLVMValueRef h16) {
  LLVMValueRef h = LLVMBuildZExt(g->b, h16, g->t_i32, "");
  LLVMValueRef sign = LLVMBuildShl(g->b, LLVMBuildAnd(g->b, h, i32c(g, 0x8000), ""), i32c(g, 16), "");
  LLVMValueRef e = LLVMBuildAnd(g->b, LLVMBuildLShr(g->b, h, i32c(g, 10), ""), i32c(g, 0x1f), "");
  LLVMValueRef m = LLVMBuildAnd(g->b, h, i32c(g, 0x3ff), "");
  LLVMValueRef normal = LLVMBuildOr(g->b, LLVMBuildShl(g->b, LLVMBuildAdd(g->b, e, i32c(g, 112), ""), i32c(g, 23), ""),
                                    LLVMBuildShl(g->b, m, i32c(g, 13), ""), "");
  LLVMValueRef special = LLVMBuildOr(g->b, i32c(g, 0x7f800000), LLVMBuildShl(g->b, m, i32c(g, 13), ""), "");
  LLVMValueRef sub = bits(g, LLVMBuildFMul(g->b, LLVMBuildUIToFP(g->b, m, g->t_f32, ""), f32c(g, ldexp(1.0, -24)), ""));
  LLVMValueRef r = LLVMBuildSelect(g->b, LLVMBuildICmp(g->b, LLVMIntEQ, e, i32c(g, 31), ""), special, normal, "");
  r = LLVMBuildSelect(g->b, LLVMBuildICmp(g->b, LLVMIntEQ, e, i32c(g, 0), ""), sub, r, "");
  return from_bits(g, LLVMBuildOr(g->b, r, sign, ""));
}

LLVMValueRef gen_round(Gen *g, LLVMValueRef x, IrDType dt) {
  if (dt == IR_DT_BF16) return bf16_to_f32(g, f32_to_bf16(g, x)); /* a NaN stays a (quiet) NaN */
  if (dt == IR_DT_F16) return round_f16(g, x);
  return x;
}

/* ------------------------------------------------------------------ */
/* Memory                                                              */
/* ------------------------------------------------------------------ */

/* ------------------------------------------------------------------ */
/* Alias scopes                                                        */
/* ------------------------------------------------------------------ */

void gen_scopes_begin(Gen *g) {
  g->nscopes = 0;
  g->nclasses = 0;
}

static int64_t value_bytes(const IrValue *v) {
  size_t es = v->storage == IR_STORE_GRAD ? (v->type.dtype == IR_DT_F64 ? 8 : 4) : ir_dtype_size(v->type.dtype);
  return ir_numel(&v->type.shape) * (int64_t)es;
}

void gen_scope_add(Gen *g, const IrValue *v) {
  if (v->storage == IR_STORE_NONE) return;
  for (int i = 0; i < g->nscopes; i++)
    if (g->scopes[i].v == v) return;
  if (g->nscopes == g->capscopes) {
    g->capscopes = g->capscopes ? 2 * g->capscopes : 16;
    g->scopes = realloc(g->scopes, sizeof *g->scopes * (size_t)g->capscopes);
    if (!g->scopes) abort();
  }
  g->scopes[g->nscopes++] = (struct GenScope){v, v->offset, v->offset + value_bytes(v), -1};
}

void gen_scopes_end(Gen *g) {
  int n = g->nscopes;
  /* classes: connected components of overlapping ranges */
  for (int i = 0; i < n; i++) g->scopes[i].cls = i;
  for (bool changed = true; changed;) {
    changed = false;
    for (int i = 0; i < n; i++)
      for (int j = 0; j < n; j++) {
        struct GenScope *a = &g->scopes[i], *b = &g->scopes[j];
        if (a->cls < b->cls && a->lo < b->hi && b->lo < a->hi) {
          b->cls = a->cls;
          changed = true;
        }
      }
  }
  int *renum = malloc(sizeof(int) * (n > 0 ? (size_t)n : 1));
  if (!renum) abort();
  for (int i = 0; i < n; i++) renum[i] = -1;
  int nc = 0;
  for (int i = 0; i < n; i++) {
    int c = g->scopes[i].cls;
    if (renum[c] < 0) renum[c] = nc++;
    g->scopes[i].cls = renum[c];
  }
  free(renum);
  g->nclasses = nc;
  free(g->scope_md);
  free(g->noalias_md);
  g->scope_md = malloc(sizeof(LLVMValueRef) * (size_t)(nc ? nc : 1));
  g->noalias_md = malloc(sizeof(LLVMValueRef) * (size_t)(nc ? nc : 1));
  LLVMMetadataRef *sc = malloc(sizeof(LLVMMetadataRef) * (size_t)(nc ? nc : 1));
  LLVMMetadataRef *others = malloc(sizeof(LLVMMetadataRef) * (size_t)(nc ? nc : 1));
  if (!g->scope_md || !g->noalias_md || !sc || !others) abort();
  char name[64];
  snprintf(name, sizeof name, "gradc.k%d", g->group);
  LLVMMetadataRef dname = LLVMMDStringInContext2(g->ctx, name, strlen(name));
  LLVMMetadataRef domain = LLVMMDNodeInContext2(g->ctx, &dname, 1);
  for (int c = 0; c < nc; c++) {
    snprintf(name, sizeof name, "gradc.k%d.%d", g->group, c);
    LLVMMetadataRef ops[2] = {LLVMMDStringInContext2(g->ctx, name, strlen(name)), domain};
    sc[c] = LLVMMDNodeInContext2(g->ctx, ops, 2);
  }
  for (int c = 0; c < nc; c++) {
    g->scope_md[c] = LLVMMetadataAsValue(g->ctx, LLVMMDNodeInContext2(g->ctx, &sc[c], 1));
    int k = 0;
    for (int d = 0; d < nc; d++)
      if (d != c) others[k++] = sc[d];
    g->noalias_md[c] = LLVMMetadataAsValue(g->ctx, LLVMMDNodeInContext2(g->ctx, others, (size_t)k));
  }
  free(sc);
  free(others);
}

void gen_scopes_free(Gen *g) {
  free(g->scopes);
  free(g->scope_md);
  free(g->noalias_md);
  g->scopes = NULL;
  g->scope_md = g->noalias_md = NULL;
  g->nscopes = g->capscopes = g->nclasses = 0;
}

static bool inline_const(const IrValue *v) { return v->def && v->def->opcode == IR_OP_CONST && v->def->group == 0; }

int gen_kernel_buffers(IrOp **ops, int n, const KpRowLayout *l, const IrValue **out) {
  int k = 0;
  if (l) {
    for (int i = 0; i < l->nslots; i++) {
      const IrValue *v = l->slots[i].v;
      if (!inline_const(v) && v->storage != IR_STORE_NONE && (!l->slots[i].defined || l->slots[i].output))
        out[k++] = v;
    }
    return k;
  }
  const IrOp *op = ops[0];
  for (int i = 0; i <= op->nargs; i++) {
    const IrValue *v = i < op->nargs ? op->args[i] : op->result;
    bool dup = false;
    for (int j = 0; j < k; j++) dup |= out[j] == v;
    if (!dup && !inline_const(v) && v->storage != IR_STORE_NONE) out[k++] = v;
  }
  (void)n;
  return k;
}

int gen_scope_of(Gen *g, const IrValue *v) {
  for (int i = 0; i < g->nscopes; i++)
    if (g->scopes[i].v == v) return g->scopes[i].cls;
  return -1;
}

static void tag(Gen *g, LLVMValueRef inst, int scope) {
  if (scope < 0 || scope >= g->nclasses) return;
  LLVMSetMetadata(inst, LLVMGetMDKindIDInContext(g->ctx, "alias.scope", 11), g->scope_md[scope]);
  LLVMSetMetadata(inst, LLVMGetMDKindIDInContext(g->ctx, "noalias", 7), g->noalias_md[scope]);
}

LLVMValueRef gen_load(Gen *g, LLVMValueRef ptr, IrDType dt, int scope) {
  LLVMValueRef x = LLVMBuildLoad2(g->b, gen_mem_type(g, dt), ptr, "");
  tag(g, x, scope);
  switch (dt) {
  case IR_DT_BOOL: return LLVMBuildICmp(g->b, LLVMIntNE, x, LLVMConstInt(g->t_i8, 0, 0), "");
  case IR_DT_BF16: return bf16_to_f32(g, x);
  case IR_DT_F16: return f16_to_f32(g, x);
  case IR_DT_F32:
  case IR_DT_F64:
  case IR_DT_I32: return x;
  }
  return x;
}

void gen_store(Gen *g, LLVMValueRef ptr, LLVMValueRef x, IrDType dt, bool grad, int scope) {
  if (grad) {
    LLVMTypeRef t = gen_grad_type(g, dt);
    if (!is_float(dt)) {
      gen_error(g, "a gradient buffer holds a %s value", ir_dtype_name(dt));
      return;
    }
    if (LLVMTypeOf(x) != t) x = LLVMBuildFPCast(g->b, x, t, "");
    LLVMValueRef old = LLVMBuildLoad2(g->b, t, ptr, "");
    tag(g, old, scope);
    tag(g, LLVMBuildStore(g->b, LLVMBuildFAdd(g->b, old, x, ""), ptr), scope);
    return;
  }
  switch (dt) {
  case IR_DT_BOOL: x = LLVMBuildZExt(g->b, x, g->t_i8, ""); break;
  case IR_DT_BF16: x = exact_bf16(g, x) ? top_half(g, bits(g, x)) : f32_to_bf16(g, x); break;
  case IR_DT_F16: x = f32_to_f16(g, x); break;
  case IR_DT_F32:
  case IR_DT_F64:
  case IR_DT_I32: break;
  }
  tag(g, LLVMBuildStore(g->b, x, ptr), scope);
}

LLVMValueRef gen_alloca(Gen *g, LLVMTypeRef t, int64_t n) {
  LLVMBasicBlockRef cur = LLVMGetInsertBlock(g->b);
  LLVMValueRef first = LLVMGetFirstInstruction(g->entry);
  if (first)
    LLVMPositionBuilderBefore(g->b, first);
  else
    LLVMPositionBuilderAtEnd(g->b, g->entry);
  LLVMValueRef a = n == 1 ? LLVMBuildAlloca(g->b, t, "") : LLVMBuildArrayAlloca(g->b, t, gen_i64(g, n), "");
  LLVMSetAlignment(a, 64);
  LLVMPositionBuilderAtEnd(g->b, cur);
  return a;
}

GenBuf gen_buf(Gen *g, const IrValue *v) {
  GenBuf b;
  memset(&b, 0, sizeof b);
  b.v = v;
  b.scope = -1;
  if (v->def && v->def->opcode == IR_OP_CONST && v->def->group == 0) {
    b.is_const = true;
    b.cval = ir_attr_get_float(v->def, "value", 0.0);
    return b;
  }
  if (v->storage == IR_STORE_NONE) {
    gen_error(g, "kernel k%d: value %%%s%d has no storage (run memplan first)", g->group, v->name ? v->name : "",
              v->name ? 0 : v->id);
    b.is_const = true;
    return b;
  }
  b.grad = v->storage == IR_STORE_GRAD;
  b.scope = gen_scope_of(g, v);
  /* The address is built in the entry block so it is loop-invariant. */
  LLVMBasicBlockRef cur = LLVMGetInsertBlock(g->b);
  LLVMValueRef term = LLVMGetBasicBlockTerminator(g->entry);
  if (term)
    LLVMPositionBuilderBefore(g->b, term);
  else
    LLVMPositionBuilderAtEnd(g->b, g->entry);
  LLVMValueRef off = gen_i64(g, v->offset);
  int idx = -1;
  for (int i = 0; g->offs && i < g->nscopes; i++)
    if (g->scopes[i].v == v) idx = i;
  for (int i = 0; i < idx; i++) /* written over (memplan): the same address, as the kernel key says */
    if (g->scopes[i].lo == g->scopes[idx].lo && g->scopes[i].hi == g->scopes[idx].hi) {
      idx = i;
      break;
    }
  if (idx >= 0) { /* a shared body: the offset comes from the caller's table */
    LLVMValueRef at = gen_i64(g, idx);
    off = LLVMBuildLoad2(g->b, g->t_i64, LLVMBuildInBoundsGEP2(g->b, g->t_i64, g->offs, &at, 1, ""), "");
  }
  b.base = LLVMBuildInBoundsGEP2(g->b, g->t_i8, g->arena, &off, 1, "");
  LLVMPositionBuilderAtEnd(g->b, cur);
  return b;
}

GenBuf gen_buf_out(Gen *g, const IrValue *v) {
  if (v->storage == IR_STORE_NONE) {
    GenBuf b;
    memset(&b, 0, sizeof b);
    b.v = v;
    b.scope = -1;
    b.discard = true;
    return b;
  }
  return gen_buf(g, v);
}

LLVMTypeRef gen_buf_elem_type(Gen *g, const GenBuf *b) {
  return b->grad ? gen_grad_type(g, b->v->type.dtype) : gen_mem_type(g, b->v->type.dtype);
}

LLVMValueRef gen_buf_ptr(Gen *g, const GenBuf *b, LLVMValueRef base, LLVMValueRef idx) {
  return LLVMBuildInBoundsGEP2(g->b, gen_buf_elem_type(g, b), base ? base : b->base, &idx, 1, "");
}

LLVMValueRef gen_buf_load(Gen *g, const GenBuf *b, LLVMValueRef idx) {
  if (b->is_const) return gen_const(g, b->v->type.dtype, b->cval);
  return gen_load(g, gen_buf_ptr(g, b, NULL, idx), b->v->type.dtype, b->scope);
}

void gen_buf_store(Gen *g, const GenBuf *b, LLVMValueRef idx, LLVMValueRef x) {
  if (b->is_const || b->discard) return; /* reported by gen_buf / not needed */
  gen_store(g, gen_buf_ptr(g, b, NULL, idx), x, b->v->type.dtype, b->grad, b->scope);
}

/* ------------------------------------------------------------------ */
/* Loops and accumulators                                              */
/* ------------------------------------------------------------------ */

void gen_loop_begin(Gen *g, GenLoop *l, LLVMValueRef lo, LLVMValueRef hi, const char *name) {
  l->pre = LLVMGetInsertBlock(g->b);
  l->head = LLVMAppendBasicBlockInContext(g->ctx, g->fn, name);
  l->exit = LLVMAppendBasicBlockInContext(g->ctx, g->fn, "");
  l->hi = hi;
  LLVMBuildCondBr(g->b, LLVMBuildICmp(g->b, LLVMIntSLT, lo, hi, ""), l->head, l->exit);
  LLVMPositionBuilderAtEnd(g->b, l->head);
  l->iv = LLVMBuildPhi(g->b, g->t_i64, name);
  LLVMAddIncoming(l->iv, &lo, &l->pre, 1);
}

void gen_loop_end(Gen *g, GenLoop *l) {
  LLVMBasicBlockRef latch = LLVMGetInsertBlock(g->b);
  LLVMValueRef next = LLVMBuildNSWAdd(g->b, l->iv, gen_i64(g, 1), "");
  LLVMBuildCondBr(g->b, LLVMBuildICmp(g->b, LLVMIntSLT, next, l->hi, ""), l->head, l->exit);
  LLVMAddIncoming(l->iv, &next, &latch, 1);
  LLVMPositionBuilderAtEnd(g->b, l->exit);
}

GenAcc gen_acc(Gen *g, LLVMTypeRef t) {
  GenAcc a = {gen_alloca(g, t, 1), t};
  return a;
}
void gen_acc_set(Gen *g, GenAcc a, LLVMValueRef v) { LLVMBuildStore(g->b, v, a.slot); }
LLVMValueRef gen_acc_get(Gen *g, GenAcc a) { return LLVMBuildLoad2(g->b, a.t, a.slot, ""); }

/* ------------------------------------------------------------------ */
/* Elementwise ops                                                     */
/* ------------------------------------------------------------------ */

#define GELU_C 0.7978845608028654 /* sqrt(2 / pi) */
#define GELU_A 0.044715

LLVMValueRef gen_convert(Gen *g, LLVMValueRef x, IrDType from, IrDType to) {
  if (from == to) return x;
  LLVMTypeRef t = gen_reg_type(g, to);
  if (is_float(from) && is_float(to)) {
    LLVMValueRef r = LLVMTypeOf(x) == t ? x : LLVMBuildFPCast(g->b, x, t, "");
    return gen_round(g, r, to);
  }
  if (is_float(from) && to == IR_DT_I32) {
    /* toward zero as a C cast; non-finite values give 0 (saturating in range) */
    LLVMTypeRef ts[2] = {g->t_i32, LLVMTypeOf(x)};
    LLVMValueRef r = gen_intrinsic(g, "llvm.fptosi.sat", ts, 2, &x, 1);
    return LLVMBuildSelect(g->b, gen_isfinite(g, x), r, i32c(g, 0), "");
  }
  if (is_float(from) && to == IR_DT_BOOL) return LLVMBuildFCmp(g->b, LLVMRealUNE, x, LLVMConstReal(LLVMTypeOf(x), 0), "");
  if (from == IR_DT_I32 && is_float(to)) return gen_round(g, LLVMBuildSIToFP(g->b, x, t, ""), to);
  if (from == IR_DT_BOOL && is_float(to)) return LLVMBuildUIToFP(g->b, x, t, "");
  if (from == IR_DT_I32 && to == IR_DT_BOOL) return LLVMBuildICmp(g->b, LLVMIntNE, x, i32c(g, 0), "");
  if (from == IR_DT_BOOL && to == IR_DT_I32) return LLVMBuildZExt(g->b, x, g->t_i32, "");
  gen_error(g, "cannot convert %s to %s", ir_dtype_name(from), ir_dtype_name(to));
  return LLVMGetUndef(t);
}

/* sigmoid(x) as the interpreter computes it: x >= 0 ? 1/(1+e^-x) : e^x/(1+e^x). */
static LLVMValueRef sigmoid(Gen *g, LLVMValueRef x) {
  LLVMTypeRef t = LLVMTypeOf(x);
  LLVMValueRef one = LLVMConstReal(t, 1.0);
  LLVMValueRef e = gen_exp_nonpos(g, LLVMBuildFNeg(g->b, gen_call1(g, "llvm.fabs", x), ""));
  LLVMValueRef d = LLVMBuildFAdd(g->b, one, e, "");
  LLVMValueRef pos = LLVMBuildFCmp(g->b, LLVMRealOGE, x, LLVMConstReal(t, 0), "");
  return LLVMBuildSelect(g->b, pos, LLVMBuildFDiv(g->b, one, d, ""), LLVMBuildFDiv(g->b, e, d, ""), "");
}

/* p = sigmoid(v) and 1 - p without cancellation: e = exp(-|v|). */
static void sigmoid_pq(Gen *g, LLVMValueRef v, LLVMValueRef *p, LLVMValueRef *q) {
  LLVMTypeRef t = LLVMTypeOf(v);
  LLVMValueRef e = gen_exp_nonpos(g, LLVMBuildFNeg(g->b, gen_call1(g, "llvm.fabs", v), ""));
  LLVMValueRef big = LLVMBuildFDiv(g->b, LLVMConstReal(t, 1.0), LLVMBuildFAdd(g->b, LLVMConstReal(t, 1.0), e, ""), "");
  LLVMValueRef small = LLVMBuildFMul(g->b, e, big, "");
  LLVMValueRef pos = LLVMBuildFCmp(g->b, LLVMRealOGE, v, LLVMConstReal(t, 0), "");
  *p = LLVMBuildSelect(g->b, pos, big, small, "");
  *q = LLVMBuildSelect(g->b, pos, small, big, "");
}

/* u = c (x + a x^3), in f64 as the interpreter writes it. */
static LLVMValueRef gelu_u(Gen *g, LLVMValueRef x) {
  LLVMTypeRef t = LLVMTypeOf(x);
  LLVMValueRef x3 = LLVMBuildFMul(g->b, LLVMBuildFMul(g->b, x, x, ""), x, "");
  LLVMValueRef in = LLVMBuildFAdd(g->b, x, LLVMBuildFMul(g->b, LLVMConstReal(t, GELU_A), x3, ""), "");
  return LLVMBuildFMul(g->b, LLVMConstReal(t, GELU_C), in, "");
}

/* In f32: p = sigmoid(2u) and q = 1 - p for 2u = x (2c + 2ca x^2), with
 * x^2 in *x2.  With the constants folded so, 2u takes two multiplies and a
 * multiply-add, where c (x + a x^3) and then -2|u| took four and one: the
 * gelu kernels are bound by the multiply pipes (docs/DECISIONS.md). */
static void gelu_pq(Gen *g, LLVMValueRef x, LLVMValueRef *x2, LLVMValueRef *p, LLVMValueRef *q) {
  LLVMTypeRef t = LLVMTypeOf(x);
  *x2 = LLVMBuildFMul(g->b, x, x, "");
  LLVMValueRef k = LLVMBuildFAdd(g->b, LLVMBuildFMul(g->b, *x2, LLVMConstReal(t, 2.0 * GELU_C * GELU_A), ""),
                                 LLVMConstReal(t, 2.0 * GELU_C), "");
  sigmoid_pq(g, LLVMBuildFMul(g->b, x, k, ""), p, q);
}

/* gelu: f64 as the interpreter writes it (0.5 x (1 + tanh u)); in f32,
 * x * sigmoid(2u), the same function without the cancellation of 1 + tanh
 * that f32 could not afford. */
static LLVMValueRef gelu(Gen *g, LLVMValueRef x) {
  LLVMTypeRef t = LLVMTypeOf(x);
  if (t == g->t_f64) {
    LLVMValueRef th = gen_libm1(g, "tanh", gelu_u(g, x));
    LLVMValueRef h = LLVMBuildFMul(g->b, LLVMConstReal(t, 0.5), x, "");
    return LLVMBuildFMul(g->b, h, LLVMBuildFAdd(g->b, LLVMConstReal(t, 1.0), th, ""), "");
  }
  LLVMValueRef x2, p, q;
  gelu_pq(g, x, &x2, &p, &q);
  return LLVMBuildFMul(g->b, x, p, "");
}

/* d gelu / dx = 0.5 (1 + t) + 0.5 x (1 - t^2) c (1 + 3 a x^2), t = tanh u;
 * in f32 with 1 + t = 2p and 1 - t = 2q (p = sigmoid(2u), q = 1 - p):
 * p + 2x p q (c + 3ca x^2). */
static LLVMValueRef gelu_grad(Gen *g, LLVMValueRef x) {
  LLVMTypeRef t = LLVMTypeOf(x);
  if (t == g->t_f64) {
    LLVMValueRef x2 = LLVMBuildFMul(g->b, x, x, "");
    LLVMValueRef poly = LLVMBuildFMul(
        g->b, LLVMConstReal(t, GELU_C),
        LLVMBuildFAdd(g->b, LLVMConstReal(t, 1.0), LLVMBuildFMul(g->b, LLVMConstReal(t, 3.0 * GELU_A), x2, ""), ""), "");
    LLVMValueRef th = gen_libm1(g, "tanh", gelu_u(g, x));
    LLVMValueRef a = LLVMBuildFMul(g->b, LLVMConstReal(t, 0.5), LLVMBuildFAdd(g->b, LLVMConstReal(t, 1.0), th, ""), "");
    LLVMValueRef omt2 = LLVMBuildFSub(g->b, LLVMConstReal(t, 1.0), LLVMBuildFMul(g->b, th, th, ""), "");
    LLVMValueRef bb = LLVMBuildFMul(g->b, LLVMBuildFMul(g->b, LLVMBuildFMul(g->b, LLVMConstReal(t, 0.5), x, ""), omt2, ""),
                                    poly, "");
    return LLVMBuildFAdd(g->b, a, bb, "");
  }
  LLVMValueRef x2, p, q;
  gelu_pq(g, x, &x2, &p, &q);
  LLVMValueRef poly = LLVMBuildFAdd(g->b, LLVMBuildFMul(g->b, x2, LLVMConstReal(t, 3.0 * GELU_C * GELU_A), ""),
                                    LLVMConstReal(t, GELU_C), "");
  LLVMValueRef bb = LLVMBuildFMul(g->b, LLVMBuildFAdd(g->b, x, x, ""),
                                  LLVMBuildFMul(g->b, LLVMBuildFMul(g->b, p, q, ""), poly, ""), "");
  return LLVMBuildFAdd(g->b, p, bb, "");
}

static LLVMValueRef sign_of(Gen *g, LLVMValueRef x, IrDType dt) {
  if (dt == IR_DT_I32) {
    LLVMValueRef pos = LLVMBuildZExt(g->b, LLVMBuildICmp(g->b, LLVMIntSGT, x, i32c(g, 0), ""), g->t_i32, "");
    LLVMValueRef neg = LLVMBuildZExt(g->b, LLVMBuildICmp(g->b, LLVMIntSLT, x, i32c(g, 0), ""), g->t_i32, "");
    return LLVMBuildSub(g->b, pos, neg, "");
  }
  LLVMTypeRef t = LLVMTypeOf(x);
  LLVMValueRef zero = LLVMConstReal(t, 0);
  LLVMValueRef r = LLVMBuildSelect(g->b, LLVMBuildFCmp(g->b, LLVMRealOLT, x, zero, ""), LLVMConstReal(t, -1), zero, "");
  return LLVMBuildSelect(g->b, LLVMBuildFCmp(g->b, LLVMRealOGT, x, zero, ""), LLVMConstReal(t, 1), r, "");
}

static LLVMValueRef pow_of(Gen *g, LLVMValueRef x, double p) {
  LLVMTypeRef t = LLVMTypeOf(x);
  if (p == 1.0) return x;
  if (p == 2.0) return LLVMBuildFMul(g->b, x, x, "");
  return call2(g, "llvm.pow", x, LLVMConstReal(t, p));
}

/* i32 division as the interpreter's trunc(a / b); b == 0 gives 0 (no trap). */
static LLVMValueRef idiv(Gen *g, LLVMValueRef a, LLVMValueRef b) {
  LLVMValueRef bad = LLVMBuildOr(g->b, LLVMBuildICmp(g->b, LLVMIntEQ, b, i32c(g, 0), ""),
                                 LLVMBuildICmp(g->b, LLVMIntEQ, b, i32c(g, -1), ""), "");
  LLVMValueRef safe = LLVMBuildSelect(g->b, bad, i32c(g, 1), b, "");
  LLVMValueRef q = LLVMBuildSDiv(g->b, a, safe, "");
  LLVMValueRef m1 = LLVMBuildSub(g->b, i32c(g, 0), a, "");
  LLVMValueRef r = LLVMBuildSelect(g->b, LLVMBuildICmp(g->b, LLVMIntEQ, b, i32c(g, -1), ""), m1, q, "");
  return LLVMBuildSelect(g->b, LLVMBuildICmp(g->b, LLVMIntEQ, b, i32c(g, 0), ""), i32c(g, 0), r, "");
}

static LLVMValueRef compare(Gen *g, IrOpcode opc, LLVMValueRef a, LLVMValueRef b, IrDType dt) {
  if (is_float(dt)) {
    LLVMRealPredicate p = LLVMRealOEQ;
    switch ((int)opc) {
    case IR_OP_EQ: p = LLVMRealOEQ; break;
    case IR_OP_NE: p = LLVMRealUNE; break;
    case IR_OP_LT: p = LLVMRealOLT; break;
    case IR_OP_LE: p = LLVMRealOLE; break;
    case IR_OP_GT: p = LLVMRealOGT; break;
    case IR_OP_GE: p = LLVMRealOGE; break;
    }
    return LLVMBuildFCmp(g->b, p, a, b, "");
  }
  bool u = dt == IR_DT_BOOL;
  LLVMIntPredicate p = LLVMIntEQ;
  switch ((int)opc) {
  case IR_OP_EQ: p = LLVMIntEQ; break;
  case IR_OP_NE: p = LLVMIntNE; break;
  case IR_OP_LT: p = u ? LLVMIntULT : LLVMIntSLT; break;
  case IR_OP_LE: p = u ? LLVMIntULE : LLVMIntSLE; break;
  case IR_OP_GT: p = u ? LLVMIntUGT : LLVMIntSGT; break;
  case IR_OP_GE: p = u ? LLVMIntUGE : LLVMIntSGE; break;
  }
  return LLVMBuildICmp(g->b, p, a, b, "");
}

/* torch.maximum/minimum: NaN if either is NaN, else a > b ? a : b (a < b). */
static LLVMValueRef extremum(Gen *g, bool max, LLVMValueRef a, LLVMValueRef b, IrDType dt) {
  if (!is_float(dt))
    return LLVMBuildSelect(g->b, LLVMBuildICmp(g->b, max ? LLVMIntSGT : LLVMIntSLT, a, b, ""), a, b, "");
  LLVMValueRef r = LLVMBuildSelect(g->b, LLVMBuildFCmp(g->b, max ? LLVMRealOGT : LLVMRealOLT, a, b, ""), a, b, "");
  LLVMValueRef nan = LLVMBuildFCmp(g->b, LLVMRealUNO, a, b, "");
  return LLVMBuildSelect(g->b, nan, LLVMConstReal(LLVMTypeOf(a), NAN), r, "");
}

/* ---- language v2 elementwise math (ir/scalar.c has the formulas) ---- */

/* torch.clamp: x below min -> min, then above max -> max; NaN stays. */
static LLVMValueRef clamp_of(Gen *g, const IrOp *op, LLVMValueRef x) {
  LLVMTypeRef t = LLVMTypeOf(x);
  if (ir_attr_get(op, "min")) {
    LLVMValueRef lo = LLVMConstReal(t, ir_attr_get_float(op, "min", 0));
    x = LLVMBuildSelect(g->b, LLVMBuildFCmp(g->b, LLVMRealOLT, x, lo, ""), lo, x, "");
  }
  if (ir_attr_get(op, "max")) {
    LLVMValueRef hi = LLVMConstReal(t, ir_attr_get_float(op, "max", 0));
    x = LLVMBuildSelect(g->b, LLVMBuildFCmp(g->b, LLVMRealOGT, x, hi, ""), hi, x, "");
  }
  return x;
}

/* softplus: x above 20, else max(x, 0) + log1p(e^-|x|). */
static LLVMValueRef softplus_of(Gen *g, LLVMValueRef x) {
  LLVMTypeRef t = LLVMTypeOf(x);
  LLVMValueRef e = gen_exp_nonpos(g, LLVMBuildFNeg(g->b, gen_call1(g, "llvm.fabs", x), ""));
  LLVMValueRef m = LLVMBuildSelect(g->b, LLVMBuildFCmp(g->b, LLVMRealOGT, x, LLVMConstReal(t, 0), ""), x,
                                   LLVMConstReal(t, 0), "");
  LLVMValueRef r = LLVMBuildFAdd(g->b, m, gen_libm1(g, "log1p", e), "");
  return LLVMBuildSelect(g->b, LLVMBuildFCmp(g->b, LLVMRealOGT, x, LLVMConstReal(t, 20.0), ""), x, r, "");
}

/* Phi(x) = 0.5 erfc(-x / sqrt 2) */
static LLVMValueRef normal_cdf(Gen *g, LLVMValueRef x) {
  LLVMTypeRef t = LLVMTypeOf(x);
  LLVMValueRef a = LLVMBuildFMul(g->b, x, LLVMConstReal(t, -0.70710678118654752440), "");
  return LLVMBuildFMul(g->b, LLVMConstReal(t, 0.5), gen_libm1(g, "erfc", a), "");
}

/* gelu_erf_grad = Phi(x) + x e^(-x^2/2) / sqrt(2 pi) */
static LLVMValueRef gelu_erf_grad_of(Gen *g, LLVMValueRef x) {
  LLVMTypeRef t = LLVMTypeOf(x);
  LLVMValueRef h = LLVMBuildFMul(g->b, LLVMBuildFMul(g->b, x, x, ""), LLVMConstReal(t, -0.5), "");
  LLVMValueRef d = LLVMBuildFMul(g->b, x, gen_exp_nonpos(g, h), "");
  return LLVMBuildFAdd(g->b, normal_cdf(g, x), LLVMBuildFMul(g->b, d, LLVMConstReal(t, 0.39894228040143267794), ""), "");
}

LLVMValueRef gen_elementwise(Gen *g, const IrOp *op, LLVMValueRef *x) {
  IrDType dt = op->result->type.dtype;
  IrDType in = op->nargs ? op->args[0]->type.dtype : dt;
  LLVMTypeRef t = gen_reg_type(g, dt);
  LLVMValueRef r = NULL;
  bool fl = is_float(in);
  switch (op->opcode) {
  case IR_OP_NEG: r = fl ? LLVMBuildFNeg(g->b, x[0], "") : LLVMBuildSub(g->b, i32c(g, 0), x[0], ""); break;
  case IR_OP_EXP: r = gen_exp(g, x[0]); break;
  case IR_OP_LOG: r = gen_call1(g, "llvm.log", x[0]); break;
  case IR_OP_SQRT: r = gen_call1(g, "llvm.sqrt", x[0]); break;
  case IR_OP_RSQRT: r = LLVMBuildFDiv(g->b, LLVMConstReal(t, 1.0), gen_call1(g, "llvm.sqrt", x[0]), ""); break;
  case IR_OP_TANH: r = LLVMTypeOf(x[0]) == g->t_f32 ? tanh_f32(g, x[0]) : gen_libm1(g, "tanh", x[0]); break;
  case IR_OP_SIGMOID: r = sigmoid(g, x[0]); break;
  case IR_OP_RELU: /* x > 0 or NaN: x, else 0 */
    r = LLVMBuildSelect(g->b, LLVMBuildFCmp(g->b, LLVMRealUGT, x[0], LLVMConstReal(t, 0), ""), x[0],
                        LLVMConstReal(t, 0), "");
    break;
  case IR_OP_GELU: r = gelu(g, x[0]); break;
  case IR_OP_GELU_GRAD: r = gelu_grad(g, x[0]); break;
  case IR_OP_SILU: r = LLVMBuildFMul(g->b, x[0], sigmoid(g, x[0]), ""); break;
  case IR_OP_ABS:
    r = fl ? gen_call1(g, "llvm.fabs", x[0])
           : LLVMBuildSelect(g->b, LLVMBuildICmp(g->b, LLVMIntSLT, x[0], i32c(g, 0), ""),
                             LLVMBuildSub(g->b, i32c(g, 0), x[0], ""), x[0], "");
    break;
  case IR_OP_SIGN: r = sign_of(g, x[0], in); break;
  case IR_OP_CLAMP: r = clamp_of(g, op, x[0]); break;
  case IR_OP_SIN: r = gen_libm1(g, "sin", x[0]); break;
  case IR_OP_COS: r = gen_libm1(g, "cos", x[0]); break;
  case IR_OP_LOG1P: r = gen_libm1(g, "log1p", x[0]); break;
  case IR_OP_SOFTPLUS: r = softplus_of(g, x[0]); break;
  case IR_OP_ERF: r = gen_libm1(g, "erf", x[0]); break;
  case IR_OP_GELU_ERF: r = LLVMBuildFMul(g->b, x[0], normal_cdf(g, x[0]), ""); break;
  case IR_OP_GELU_ERF_GRAD: r = gelu_erf_grad_of(g, x[0]); break;
  case IR_OP_POW: r = pow_of(g, x[0], ir_attr_get_float(op, "exponent", 1.0)); break;
  case IR_OP_CAST: return gen_convert(g, x[0], in, dt);
  case IR_OP_DETACH:
  case IR_OP_BROADCAST: return x[0];
  case IR_OP_ADD: r = fl ? LLVMBuildFAdd(g->b, x[0], x[1], "") : LLVMBuildAdd(g->b, x[0], x[1], ""); break;
  case IR_OP_SUB: r = fl ? LLVMBuildFSub(g->b, x[0], x[1], "") : LLVMBuildSub(g->b, x[0], x[1], ""); break;
  case IR_OP_MUL:
  case IR_OP_LOSS_TERM: r = fl ? LLVMBuildFMul(g->b, x[0], x[1], "") : LLVMBuildMul(g->b, x[0], x[1], ""); break;
  case IR_OP_DIV: r = fl ? LLVMBuildFDiv(g->b, x[0], x[1], "") : idiv(g, x[0], x[1]); break;
  case IR_OP_MAXIMUM: r = extremum(g, true, x[0], x[1], in); break;
  case IR_OP_MINIMUM: r = extremum(g, false, x[0], x[1], in); break;
  case IR_OP_EQ:
  case IR_OP_NE:
  case IR_OP_LT:
  case IR_OP_LE:
  case IR_OP_GT:
  case IR_OP_GE: return compare(g, op->opcode, x[0], x[1], in);
  case IR_OP_SELECT: return LLVMBuildSelect(g->b, x[0], x[1], x[2], "");
  case IR_OP_GRAD_SEED: { /* coef * x computed as the interpreter does, in double */
    double coef = ir_attr_get_float(op, "coef", 1.0);
    LLVMValueRef d = LLVMTypeOf(x[0]) == g->t_f64 ? x[0] : LLVMBuildFPExt(g->b, x[0], g->t_f64, "");
    d = LLVMBuildFMul(g->b, d, LLVMConstReal(g->t_f64, coef), "");
    r = t == g->t_f64 ? d : LLVMBuildFPTrunc(g->b, d, t, "");
    break;
  }
  case IR_OP_MSE_LOSS: {
    LLVMValueRef d = LLVMBuildFSub(g->b, x[0], x[1], "");
    r = LLVMBuildFMul(g->b, d, d, "");
    break;
  }
  KP_CASES_NOT_EW: break;
  }
  if (!r) {
    gen_error(g, "'%s' is not an elementwise op", ir_op_info[op->opcode].name);
    return LLVMGetUndef(t);
  }
  return fl ? gen_round(g, r, dt) : r;
}
