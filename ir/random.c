/* random.c - the counter-based random draws (DESIGN.md §2, Randomness):
 * Philox-4x32-10 (Salmon, Moraes, Dror and Shaw, "Parallel random
 * numbers: as easy as 1, 2, 3", SC 2011; the generator of JAX and
 * cuRAND), the counter of one element of a `random` op, and how its bits
 * become a float.  This is the one home of these facts: the reference
 * interpreter calls these functions, and the CPU and CUDA code generators
 * emit the same steps (codegen/llvm/llvm_random.c, codegen/cuda/cuda_ops.c);
 * docs/DECISIONS.md "Counter-based randomness" states the mapping. */
#include <math.h>

#include "ir.h"

/* The round multipliers and the Weyl key increments of Philox4x32. */
#define PHILOX_M0 0xD2511F53u
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u
#define PHILOX_W1 0xBB67AE85u

static uint32_t mulhilo(uint32_t a, uint32_t b, uint32_t *hi) {
  uint64_t p = (uint64_t)a * b;
  *hi = (uint32_t)(p >> 32);
  return (uint32_t)p;
}

/* Ten rounds; the key is bumped between them (nine times). */
void ir_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]) {
  uint32_t c0 = ctr[0], c1 = ctr[1], c2 = ctr[2], c3 = ctr[3], k0 = key[0], k1 = key[1];
  for (int r = 0; r < 10; r++) {
    if (r > 0) {
      k0 += PHILOX_W0;
      k1 += PHILOX_W1;
    }
    uint32_t hi0, hi1;
    uint32_t lo0 = mulhilo(PHILOX_M0, c0, &hi0);
    uint32_t lo1 = mulhilo(PHILOX_M1, c2, &hi1);
    uint32_t n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
    c0 = n0;
    c1 = lo1;
    c2 = n2;
    c3 = lo0;
  }
  out[0] = c0;
  out[1] = c1;
  out[2] = c2;
  out[3] = c3;
}

bool ir_random_batched(const IrOp *op) { return ir_attr_get_int(op, "batched", 0) != 0; }

int64_t ir_random_per_sample(const IrOp *op) {
  const IrShape *s = &op->result->type.shape;
  int64_t n = ir_numel(s);
  if (!ir_random_batched(op) || s->rank == 0 || s->dim[0] == 0) return n;
  return n / s->dim[0];
}

void ir_random_bits(const IrOp *op, const uint32_t state[IR_RNG_WORDS], int64_t e, uint32_t out[4]) {
  int64_t per = ir_random_per_sample(op);
  bool batched = ir_random_batched(op);
  uint32_t key[2] = {state[0], state[1]};
  uint32_t ctr[4] = {
      (uint32_t)(batched ? e % per : e),                           /* element in the sample */
      batched ? state[3] + (uint32_t)(e / per) : 0u,               /* sample in the window */
      state[2],                                                    /* optimiser step */
      (uint32_t)ir_attr_get_int(op, "key", 0),                     /* the op's stable id */
  };
  ir_philox4x32_10(ctr, key, out);
}

double ir_random_value(bool normal, IrDType dt, const uint32_t w[4]) {
  if (!normal) {
    if (dt == IR_DT_F64) return (double)(((uint64_t)w[0] << 21) | (w[1] >> 11)) * 0x1p-53;
    return (double)(w[0] >> 8) * 0x1p-24; /* exact in f32 */
  }
  /* Box-Muller in f64 (u1 in (0, 1], u2 in [0, 1)), then rounded to dt. */
  double u1 = (double)((((uint64_t)w[0] << 21) | (w[1] >> 11)) + 1) * 0x1p-53;
  double u2 = (double)(((uint64_t)w[2] << 21) | (w[3] >> 11)) * 0x1p-53;
  double r = sqrt(-2.0 * log(u1));
  double c = cos(IR_RANDOM_TWO_PI * u2);
  return ir_round_dtype(r * c, dt);
}

uint32_t ir_random_key(int line, int col, int occurrence) {
  uint32_t loc = ((uint32_t)line & 0xffffu) << 16 | ((uint32_t)col & 0xffffu);
  return loc ^ ((uint32_t)occurrence * PHILOX_W0);
}
