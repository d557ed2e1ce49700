/* llvm_random.c - the `random` op inside a kernel: Philox-4x32-10 on the
 * element's counter and the bits as a float, the steps of ir/random.c
 * (the interpreter's) emitted as LLVM IR, so that both draw the same
 * numbers bit for bit.  The four mulhilo products are 64-bit multiplies of
 * zero-extended words, which the vectoriser widens like any other integer
 * arithmetic; the normal's log and cos are libm's (the interpreter's own,
 * called by name so that no vector library replaces them). */
#include <string.h>

#include "llvm_gen.h"

static LLVMValueRef u32(Gen *g, uint32_t v) { return LLVMConstInt(g->t_i32, v, 0); }
static LLVMValueRef u64(Gen *g, uint64_t v) { return LLVMConstInt(g->t_i64, v, 0); }

/* (hi, lo) of the 64-bit product of word x and the constant m. */
static LLVMValueRef mulhilo(Gen *g, uint32_t m, LLVMValueRef x, LLVMValueRef *hi) {
  LLVMBuilderRef b = g->b;
  LLVMValueRef p = LLVMBuildMul(b, LLVMBuildZExt(b, x, g->t_i64, ""), u64(g, m), "");
  *hi = LLVMBuildTrunc(b, LLVMBuildLShr(b, p, u64(g, 32), ""), g->t_i32, "");
  return LLVMBuildTrunc(b, p, g->t_i32, "");
}

/* One Philox-4x32-10 block of c under key k (ir_philox4x32_10). */
static void philox(Gen *g, LLVMValueRef c[4], LLVMValueRef k0, LLVMValueRef k1) {
  LLVMBuilderRef b = g->b;
  for (int r = 0; r < 10; r++) {
    if (r > 0) {
      k0 = LLVMBuildAdd(b, k0, u32(g, 0x9E3779B9u), "");
      k1 = LLVMBuildAdd(b, k1, u32(g, 0xBB67AE85u), "");
    }
    LLVMValueRef hi0, hi1;
    LLVMValueRef lo0 = mulhilo(g, 0xD2511F53u, c[0], &hi0);
    LLVMValueRef lo1 = mulhilo(g, 0xCD9E8D57u, c[2], &hi1);
    LLVMValueRef n0 = LLVMBuildXor(b, LLVMBuildXor(b, hi1, c[1], ""), k0, "");
    LLVMValueRef n2 = LLVMBuildXor(b, LLVMBuildXor(b, hi0, c[3], ""), k1, "");
    c[0] = n0;
    c[1] = lo1;
    c[2] = n2;
    c[3] = lo0;
  }
}

/* 53 bits of (a, b) as a double in [0, 2^53), plus `plus`. */
static LLVMValueRef bits53(Gen *g, LLVMValueRef a, LLVMValueRef bw, uint64_t plus) {
  LLVMBuilderRef b = g->b;
  LLVMValueRef hi = LLVMBuildShl(b, LLVMBuildZExt(b, a, g->t_i64, ""), u64(g, 21), "");
  LLVMValueRef lo = LLVMBuildZExt(b, LLVMBuildLShr(b, bw, u32(g, 11), ""), g->t_i64, "");
  LLVMValueRef v = LLVMBuildOr(b, hi, lo, "");
  if (plus) v = LLVMBuildAdd(b, v, u64(g, plus), "");
  return LLVMBuildUIToFP(b, v, g->t_f64, "");
}

LLVMValueRef gen_random(Gen *g, const IrOp *op, LLVMValueRef e) {
  LLVMBuilderRef b = g->b;
  GenBuf sb = gen_buf(g, op->args[0]);
  LLVMValueRef st[IR_RNG_WORDS];
  for (int i = 0; i < IR_RNG_WORDS; i++) st[i] = gen_buf_load(g, &sb, gen_i64(g, i));
  LLVMValueRef c[4];
  if (ir_random_batched(op)) {
    LLVMValueRef per = gen_i64(g, ir_random_per_sample(op));
    c[0] = LLVMBuildTrunc(b, LLVMBuildURem(b, e, per, ""), g->t_i32, "");
    c[1] = LLVMBuildAdd(b, st[3], LLVMBuildTrunc(b, LLVMBuildUDiv(b, e, per, ""), g->t_i32, ""), "");
  } else {
    c[0] = LLVMBuildTrunc(b, e, g->t_i32, "");
    c[1] = u32(g, 0);
  }
  c[2] = st[2];
  c[3] = u32(g, (uint32_t)ir_attr_get_int(op, "key", 0));
  philox(g, c, st[0], st[1]);
  IrDType dt = op->result->type.dtype;
  if (strcmp(ir_attr_get_str(op, "dist", "uniform"), "normal") != 0) {
    if (dt == IR_DT_F64) return LLVMBuildFMul(b, bits53(g, c[0], c[1], 0), LLVMConstReal(g->t_f64, 0x1p-53), "");
    LLVMValueRef top = LLVMBuildUIToFP(b, LLVMBuildLShr(b, c[0], u32(g, 8), ""), g->t_f32, "");
    return LLVMBuildFMul(b, top, LLVMConstReal(g->t_f32, 0x1p-24), "");
  }
  LLVMValueRef u1 = LLVMBuildFMul(b, bits53(g, c[0], c[1], 1), LLVMConstReal(g->t_f64, 0x1p-53), "");
  LLVMValueRef u2 = LLVMBuildFMul(b, bits53(g, c[2], c[3], 0), LLVMConstReal(g->t_f64, 0x1p-53), "");
  LLVMValueRef r = gen_call1(g, "llvm.sqrt", LLVMBuildFMul(b, LLVMConstReal(g->t_f64, -2.0), gen_libm1(g, "log", u1), ""));
  LLVMValueRef cs = gen_libm1(g, "cos", LLVMBuildFMul(b, LLVMConstReal(g->t_f64, IR_RANDOM_TWO_PI), u2, ""));
  LLVMValueRef z = LLVMBuildFMul(b, r, cs, "");
  return dt == IR_DT_F64 ? z : LLVMBuildFPTrunc(b, z, g->t_f32, "");
}
