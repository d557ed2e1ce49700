/* llvm_bmm.c - a batch of small products as one kernel (passes/kernel_bmm.c
 * decides which matmuls, docs/BACKEND.md "Small batched products").
 *
 *   void kN_matmul(ptr arena, i64 begin, i64 end)
 *
 * multiplies batch matrices [begin, end).  Each matrix's B is copied into
 * a panel of K rows of N floats rounded up to whole vectors (zeros after
 * N) unless it already has unit-stride rows of whole vectors (a
 * transposed B in blocks transposed in registers where its sizes are
 * whole vectors, else element by element); C is then
 * computed in register tiles of MR rows by NT vectors: for each k, NT
 * vector loads of the panel's row k, MR broadcasts of A(i, k) and MR x NT
 * multiply-adds, the tile stored once after its K steps.  A is read one
 * element at a time, so any strides serve (a transposed A included); the
 * panel takes any strides of B.  The sum over k runs in order with one
 * rounding a step (a fused multiply-add where the CPU has one), as a BLAS
 * does, not in the reference interpreter's f64.  Sizes and strides are
 * constants, so every index is folded into addressing. */
#include <string.h>

#include "llvm_gen.h"

#define BMM_MAX_ROWS 14 /* rows of a register tile at most */
#define BMM_MAX_VECS 2  /* vectors of a register tile's row at most */

typedef struct Bmm {
  const KpBmm *p;
  int vl;              /* floats a vector */
  LLVMTypeRef vt;      /* <vl x float> */
  LLVMValueRef a, b, c; /* element 0 of this matrix in A, B's rows (the panel or B itself), C */
  int64_t bk;          /* B's row stride as read (Npad for the panel) */
} Bmm;

static LLVMValueRef gep_f32(Gen *g, LLVMValueRef base, LLVMValueRef idx) {
  return LLVMBuildInBoundsGEP2(g->b, g->t_f32, base, &idx, 1, "");
}

static LLVMValueRef add(Gen *g, LLVMValueRef x, LLVMValueRef y) { return LLVMBuildNSWAdd(g->b, x, y, ""); }
static LLVMValueRef mul(Gen *g, LLVMValueRef x, int64_t c) { return LLVMBuildNSWMul(g->b, x, gen_i64(g, c), ""); }

static LLVMValueRef splat(Gen *g, const Bmm *m, LLVMValueRef x) {
  LLVMValueRef v = LLVMBuildInsertElement(g->b, LLVMGetPoison(m->vt), x, LLVMConstInt(g->t_i32, 0, 0), "");
  LLVMValueRef zeros = LLVMConstNull(LLVMVectorType(g->t_i32, (unsigned)m->vl));
  return LLVMBuildShuffleVector(g->b, v, LLVMGetPoison(m->vt), zeros, "");
}

static LLVMValueRef fmuladd(Gen *g, LLVMValueRef x, LLVMValueRef y, LLVMValueRef acc) {
  static const char name[] = "llvm.fmuladd";
  unsigned id = LLVMLookupIntrinsicID(name, sizeof name - 1);
  LLVMTypeRef t = LLVMTypeOf(acc);
  LLVMValueRef fn = LLVMGetIntrinsicDeclaration(g->mod, id, &t, 1);
  LLVMValueRef args[3] = {x, y, acc};
  return LLVMBuildCall2(g->b, LLVMIntrinsicGetType(g->ctx, id, &t, 1), fn, args, 3, "");
}

/* One register tile: rows [m0, m0 + rows) of C, nv vectors from column n0
 * on, the last of them holding only `tail` columns (vl when whole). */
static void emit_tile(Gen *g, const Bmm *m, LLVMValueRef m0, int rows, LLVMValueRef n0, int nv, int tail) {
  const KpBmm *p = m->p;
  GenAcc acc[BMM_MAX_ROWS][BMM_MAX_VECS];
  LLVMValueRef zero = LLVMConstNull(m->vt);
  for (int r = 0; r < rows; r++)
    for (int v = 0; v < nv; v++) {
      acc[r][v] = gen_acc(g, m->vt);
      gen_acc_set(g, acc[r][v], zero);
    }
  LLVMValueRef arow = mul(g, m0, p->am);
  GenLoop k;
  gen_loop_begin(g, &k, gen_i64(g, 0), gen_i64(g, p->K), "k");
  LLVMValueRef bv[BMM_MAX_VECS];
  LLVMValueRef brow = add(g, mul(g, k.iv, m->bk), n0);
  for (int v = 0; v < nv; v++) {
    LLVMValueRef ptr = gep_f32(g, m->b, add(g, brow, gen_i64(g, (int64_t)v * m->vl)));
    bv[v] = LLVMBuildLoad2(g->b, m->vt, ptr, "");
    LLVMSetAlignment(bv[v], 4);
  }
  LLVMValueRef acol = add(g, arow, mul(g, k.iv, p->ak));
  for (int r = 0; r < rows; r++) {
    LLVMValueRef x = LLVMBuildLoad2(g->b, g->t_f32, gep_f32(g, m->a, add(g, acol, gen_i64(g, r * p->am))), "");
    LLVMSetAlignment(x, 4);
    LLVMValueRef xs = splat(g, m, x);
    for (int v = 0; v < nv; v++) gen_acc_set(g, acc[r][v], fmuladd(g, xs, bv[v], gen_acc_get(g, acc[r][v])));
  }
  gen_loop_end(g, &k);
  for (int r = 0; r < rows; r++) {
    LLVMValueRef crow = add(g, mul(g, add(g, m0, gen_i64(g, r)), p->cm), n0);
    for (int v = 0; v < nv; v++) {
      LLVMValueRef y = gen_acc_get(g, acc[r][v]);
      LLVMValueRef at = add(g, crow, gen_i64(g, (int64_t)v * m->vl));
      if (v < nv - 1 || tail == m->vl) {
        LLVMValueRef st = LLVMBuildStore(g->b, y, gep_f32(g, m->c, at));
        LLVMSetAlignment(st, 4);
        continue;
      }
      for (int j = 0; j < tail; j++) { /* the row's last columns, one at a time */
        LLVMValueRef e = LLVMBuildExtractElement(g->b, y, LLVMConstInt(g->t_i32, (unsigned)j, 0), "");
        LLVMValueRef st = LLVMBuildStore(g->b, e, gep_f32(g, m->c, add(g, at, gen_i64(g, j))));
        LLVMSetAlignment(st, 4);
      }
    }
  }
}

/* A vl x vl block of B into the panel when B's columns are its unit
 * stride (B transposed: q k^T, dO v^T): vl vector loads down columns n0..,
 * a transpose in registers (log2 vl stages, each swapping the
 * off-diagonal s x s blocks of every 2s x 2s block with one two-source
 * shuffle a vector), vl vector stores along the panel's rows k0... */
static void pack_block(Gen *g, const Bmm *m, LLVMValueRef b, LLVMValueRef panel, int64_t npad, LLVMValueRef k0,
                       LLVMValueRef n0) {
  const KpBmm *p = m->p;
  int vl = m->vl;
  LLVMValueRef r[16];
  for (int j = 0; j < vl; j++) {
    LLVMValueRef at = add(g, mul(g, add(g, n0, gen_i64(g, j)), p->bn), k0);
    r[j] = LLVMBuildLoad2(g->b, m->vt, gep_f32(g, b, at), "");
    LLVMSetAlignment(r[j], 4);
  }
  for (int st = vl / 2; st >= 1; st /= 2) {
    LLVMValueRef lo[16], hi[16];
    for (int j = 0; j < vl; j++) {
      lo[j] = LLVMConstInt(g->t_i32, (unsigned)((j & st) ? vl + j - st : j), 0);
      hi[j] = LLVMConstInt(g->t_i32, (unsigned)((j & st) ? vl + j : j + st), 0);
    }
    LLVMValueRef mlo = LLVMConstVector(lo, (unsigned)vl), mhi = LLVMConstVector(hi, (unsigned)vl);
    for (int i = 0; i < vl; i++) {
      if (i & st) continue;
      LLVMValueRef x = r[i], y = r[i + st];
      r[i] = LLVMBuildShuffleVector(g->b, x, y, mlo, "");
      r[i + st] = LLVMBuildShuffleVector(g->b, x, y, mhi, "");
    }
  }
  for (int i = 0; i < vl; i++) {
    LLVMValueRef at = add(g, mul(g, add(g, k0, gen_i64(g, i)), npad), n0);
    LLVMValueRef st = LLVMBuildStore(g->b, r[i], gep_f32(g, panel, at));
    LLVMSetAlignment(st, 4);
  }
}

/* Rows of C for the column tile at n0 of nv vectors: tiles of mr rows in a
 * loop, then one of the rows left. */
static void emit_rows(Gen *g, const Bmm *m, int mr, LLVMValueRef n0, int nv, int tail) {
  int64_t full = m->p->M / mr, rest = m->p->M % mr;
  if (full > 0) {
    GenLoop rt;
    gen_loop_begin(g, &rt, gen_i64(g, 0), gen_i64(g, full), "rows");
    emit_tile(g, m, mul(g, rt.iv, mr), mr, n0, nv, tail);
    gen_loop_end(g, &rt);
  }
  if (rest > 0) emit_tile(g, m, gen_i64(g, full * mr), (int)rest, n0, nv, tail);
}

void gen_bmm_kernel(Gen *g, const KpBmm *p) {
  Bmm m = {.p = p};
  m.vl = gen_host_avx512() ? 16 : 8;
  int regs = gen_host_avx512() ? 32 : 16;
  m.vt = LLVMVectorType(g->t_f32, (unsigned)m.vl);
  int64_t whole = p->N / m.vl, tail = p->N % m.vl, nvec = whole + (tail > 0);
  int nt = nvec < BMM_MAX_VECS ? (int)nvec : BMM_MAX_VECS;
  /* Rows a tile: what the registers hold beside nt panel vectors and a
   * broadcast, at most; a divisor of M from half that on, so that every
   * tile is one body (32 rows as 4 x 8 with two vectors a row: compile
   * time), else spread evenly over M (37 as 13 + 12 + 12, not 14 + 14 +
   * 9). */
  int mr = (regs - nt - 1) / nt;
  if (mr > BMM_MAX_ROWS) mr = BMM_MAX_ROWS;
  int div = 0;
  for (int r = mr; r >= (mr + 1) / 2 && !div; r--)
    if (p->M % r == 0) div = r;
  if (p->M <= mr) {
    mr = (int)p->M;
  } else if (div) {
    mr = div;
  } else {
    int64_t ntiles = (p->M + mr - 1) / mr;
    mr = (int)((p->M + ntiles - 1) / ntiles);
  }

  GenBuf A = gen_buf(g, p->a), B = gen_buf(g, p->b), C = gen_buf(g, p->c);
  bool direct = p->bn == 1 && tail == 0; /* B's rows are whole vectors already */
  int64_t npad = nvec * m.vl;
  LLVMValueRef panel = direct ? NULL : gen_alloca(g, g->t_f32, p->K * npad);
  m.bk = direct ? p->bk : npad;
  if (!direct && tail > 0) { /* the panel's columns past N stay zero */
    GenLoop k;
    gen_loop_begin(g, &k, gen_i64(g, 0), gen_i64(g, p->K), "zk");
    for (int64_t j = p->N; j < npad; j++)
      LLVMBuildStore(g->b, LLVMConstReal(g->t_f32, 0), gep_f32(g, panel, add(g, mul(g, k.iv, npad), gen_i64(g, j))));
    gen_loop_end(g, &k);
  }

  GenLoop t;
  gen_loop_begin(g, &t, g->begin, g->end, "t");
  LLVMValueRef aoff = gen_i64(g, p->aoff), boff = gen_i64(g, p->boff), coff = gen_i64(g, p->coff);
  LLVMValueRef rest = t.iv;
  for (int d = p->nbatch - 1; d >= 0; d--) {
    LLVMValueRef i = d > 0 ? LLVMBuildURem(g->b, rest, gen_i64(g, p->bdim[d]), "") : rest;
    if (d > 0) rest = LLVMBuildUDiv(g->b, rest, gen_i64(g, p->bdim[d]), "");
    aoff = add(g, aoff, mul(g, i, p->as[d]));
    boff = add(g, boff, mul(g, i, p->bs[d]));
    coff = add(g, coff, mul(g, i, p->cs[d]));
  }
  m.a = gep_f32(g, A.base, aoff);
  m.c = gep_f32(g, C.base, coff);
  LLVMValueRef b = gep_f32(g, B.base, boff);
  if (direct) {
    m.b = b;
  } else if (p->bk == 1 && p->K % m.vl == 0 && tail == 0) { /* whole blocks of a transposed B */
    m.b = panel;
    GenLoop k, n;
    gen_loop_begin(g, &k, gen_i64(g, 0), gen_i64(g, p->K / m.vl), "tk");
    gen_loop_begin(g, &n, gen_i64(g, 0), gen_i64(g, whole), "tn");
    pack_block(g, &m, b, panel, npad, mul(g, k.iv, m.vl), mul(g, n.iv, m.vl));
    gen_loop_end(g, &n);
    gen_loop_end(g, &k);
  } else {
    m.b = panel;
    GenLoop k, n;
    gen_loop_begin(g, &k, gen_i64(g, 0), gen_i64(g, p->K), "pk");
    gen_loop_begin(g, &n, gen_i64(g, 0), gen_i64(g, p->N), "pn");
    LLVMValueRef x = LLVMBuildLoad2(g->b, g->t_f32, gep_f32(g, b, add(g, mul(g, k.iv, p->bk), mul(g, n.iv, p->bn))), "");
    LLVMSetAlignment(x, 4);
    LLVMBuildStore(g->b, x, gep_f32(g, panel, add(g, mul(g, k.iv, npad), n.iv)));
    gen_loop_end(g, &n);
    gen_loop_end(g, &k);
  }
  /* Column tiles of nt whole vectors, then the vectors left (the last
   * of them partial when N is not a multiple of vl). */
  int64_t ctiles = whole / nt;
  if (ctiles > 0) {
    GenLoop ct;
    gen_loop_begin(g, &ct, gen_i64(g, 0), gen_i64(g, ctiles), "cols");
    emit_rows(g, &m, mr, mul(g, ct.iv, (int64_t)nt * m.vl), nt, m.vl);
    gen_loop_end(g, &ct);
  }
  int left = (int)(nvec - ctiles * nt);
  if (left > 0) emit_rows(g, &m, mr, gen_i64(g, ctiles * nt * m.vl), left, tail > 0 ? (int)tail : m.vl);
  gen_loop_end(g, &t);
  LLVMBuildRetVoid(g->b);
}

void gen_bmm_extent(const KpBmm *p, int64_t *iters, int64_t *cost) {
  *iters = p->nb;
  *cost = p->M * p->N * p->K / 8 + p->M * p->N; /* elements touched, roughly: 8 multiply-adds an element */
}
