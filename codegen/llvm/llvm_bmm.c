/* llvm_bmm.c - small and skinny products as kernels (passes/kernel_bmm.c
 * decides which matmuls, docs/BACKEND.md "Small and skinny products").
 *
 *   void kN_matmul(ptr arena, i64 begin, i64 end, ptr offs)
 *
 * multiplies batch matrices [begin, end), or for a single product (nb
 * 1) the register tiles [begin, end) of its one matrix.  A matrix's B is
 * copied into a panel of K rows of N floats rounded up to whole vectors
 * (zeros after N) unless it already has unit-stride rows of whole
 * vectors (a transposed B in blocks transposed in registers where its
 * sizes are whole vectors, else element by element): for each batch
 * matrix, or once a call for a single product.  C is then computed in
 * register tiles of MR rows by NT vectors: for each k, NT vector loads of
 * the panel's row k, MR broadcasts of A(i, k) and MR x NT multiply-adds,
 * the tile stored once after its K steps (added to C where C is a
 * gradient buffer); where A or B has known zeros (a causal softmax's),
 * a tile's sum over k runs only over the terms that can be nonzero.  A
 * is read one element at a time, so any strides serve (a transposed A
 * included); the panel takes any strides of B, and
 * C any strides (C^T's rows down C's columns stored as scatters).
 * The sum over k runs in order with one rounding a step (a fused
 * multiply-add where the CPU has one), as a BLAS does, not in the
 * reference interpreter's f64.  Sizes and strides are constants, so
 * every index is folded into addressing. */
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

/* A product's register tiles, the same for its kernel and its extent. */
typedef struct BmmTiling {
  int vl;                    /* floats a vector */
  int64_t whole, tail, nvec; /* whole vectors of a row of C, the floats after them, vectors in all */
  int nt;                    /* vectors of a tile's row */
  int mr;                    /* rows of a (full) tile */
} BmmTiling;

static BmmTiling bmm_tiling(const KpBmm *p) {
  BmmTiling t;
  t.vl = gen_host_avx512() ? 16 : 8;
  int regs = gen_host_avx512() ? 32 : 16;
  t.whole = p->N / t.vl, t.tail = p->N % t.vl, t.nvec = t.whole + (t.tail > 0);
  t.nt = t.nvec < BMM_MAX_VECS ? (int)t.nvec : BMM_MAX_VECS;
  if (p->cdead) t.nt = 1; /* the dead region's edge in steps of one vector */
  /* Rows a tile: what the registers hold beside nt panel vectors and a
   * broadcast, at most; a divisor of M from half that on, so that every
   * tile is one body (32 rows as 4 x 8 with two vectors a row: compile
   * time), else spread evenly over M (37 as 13 + 12 + 12, not 14 + 14 +
   * 9).  A single product's iterations are its tiles of rows, so there
   * the full tiles come first and one shorter one after them. */
  int mr = (regs - t.nt - 1) / t.nt;
  if (mr > BMM_MAX_ROWS) mr = BMM_MAX_ROWS;
  int div = 0;
  for (int r = mr; r >= (mr + 1) / 2 && !div; r--)
    if (p->M % r == 0) div = r;
  if (p->M <= mr) {
    mr = (int)p->M;
  } else if (div) {
    mr = div;
  } else if (p->nb > 1) {
    int64_t ntiles = (p->M + mr - 1) / mr;
    mr = (int)((p->M + ntiles - 1) / ntiles);
  }
  t.mr = mr;
  return t;
}

/* Whether the kernel reads B's rows in place (whole vectors already),
 * rather than copying B into a panel first. */
static bool bmm_direct(const KpBmm *p, const BmmTiling *t) { return p->bn == 1 && t->tail == 0; }

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
  LLVMTypeRef t = LLVMTypeOf(acc);
  LLVMValueRef args[3] = {x, y, acc};
  return gen_intrinsic(g, "llvm.fmuladd", &t, 1, args, 3);
}

/* A vector's mask of its first `lanes` lanes. */
static LLVMValueRef lane_mask(Gen *g, const Bmm *m, int lanes) {
  LLVMValueRef bits[16];
  for (int j = 0; j < m->vl; j++) bits[j] = LLVMConstInt(LLVMInt1TypeInContext(g->ctx), j < lanes, 0);
  return LLVMConstVector(bits, (unsigned)m->vl);
}

/* The first `cols` lanes of y into C from ptr on, p->cn apart (added to
 * what is there where C is a gradient buffer). */
static void store_lanes(Gen *g, const Bmm *m, LLVMValueRef ptr, LLVMValueRef y, int cols) {
  const KpBmm *p = m->p;
  LLVMValueRef idx[16];
  for (int j = 0; j < m->vl; j++) idx[j] = LLVMConstInt(g->t_i64, (unsigned long long)(j * p->cn), 0);
  LLVMValueRef mask = lane_mask(g, m, cols);
  LLVMValueRef align = LLVMConstInt(g->t_i32, 4, 0);
  /* Contiguous lanes: a masked load and store; else a gather and scatter
   * through a vector of pointers. */
  bool unit = p->cn == 1;
  LLVMValueRef lanes = LLVMConstVector(idx, (unsigned)m->vl);
  LLVMValueRef at = unit ? ptr : LLVMBuildGEP2(g->b, g->t_f32, ptr, &lanes, 1, "");
  LLVMTypeRef over[2] = {m->vt, LLVMTypeOf(at)};
  if (p->acc) {
    LLVMValueRef la[4] = {at, align, mask, LLVMConstNull(m->vt)};
    y = LLVMBuildFAdd(g->b, gen_intrinsic(g, unit ? "llvm.masked.load" : "llvm.masked.gather", over, 2, la, 4), y, "");
  }
  LLVMValueRef sa[4] = {y, at, align, mask};
  gen_intrinsic(g, unit ? "llvm.masked.store" : "llvm.masked.scatter", over, 2, sa, 4);
}

/* y (a vector or a float) into C at ptr, added to what is there where C
 * is a gradient buffer. */
static void store_c(Gen *g, const Bmm *m, LLVMValueRef ptr, LLVMValueRef y) {
  if (m->p->acc) {
    LLVMValueRef old = LLVMBuildLoad2(g->b, LLVMTypeOf(y), ptr, "");
    LLVMSetAlignment(old, 4);
    y = LLVMBuildFAdd(g->b, old, y, "");
  }
  LLVMValueRef st = LLVMBuildStore(g->b, y, ptr);
  LLVMSetAlignment(st, 4);
}

static LLVMValueRef imin(Gen *g, LLVMValueRef x, LLVMValueRef y) {
  LLVMValueRef args[2] = {x, y};
  return gen_intrinsic(g, "llvm.smin", &g->t_i64, 1, args, 2);
}

static LLVMValueRef imax(Gen *g, LLVMValueRef x, LLVMValueRef y) {
  LLVMValueRef args[2] = {x, y};
  return gen_intrinsic(g, "llvm.smax", &g->t_i64, 1, args, 2);
}

/* The k that the tile at rows [m0, m0 + rows), columns [n0, n0 + nv
 * vectors) sums over: all of K, less where A's or B's known zeros
 * (kernel.h's KP_ZERO_*) make every term of the tile 0.  A zero where
 * k > i (a causal P) ends the sum at the tile's last row, one where k < i
 * starts it at the first; in B (rows k, columns j) a zero where j > k
 * starts it at the first column, one where j < k ends it at the last.
 * A causal attention's P v then does (1 + 2 + ... + n) / n^2 of the
 * multiply-adds over its n row tiles. */
static void k_range(Gen *g, const Bmm *m, LLVMValueRef m0, int rows, LLVMValueRef n0, int nv, LLVMValueRef *lo,
                    LLVMValueRef *hi) {
  const KpBmm *p = m->p;
  *lo = gen_i64(g, 0);
  *hi = gen_i64(g, p->K);
  if (p->azero & KP_ZERO_LOWER) *hi = imin(g, *hi, add(g, m0, gen_i64(g, rows)));
  if (p->azero & KP_ZERO_UPPER) *lo = imax(g, *lo, m0);
  if (p->bzero & KP_ZERO_LOWER) *lo = imax(g, *lo, n0);
  if (p->bzero & KP_ZERO_UPPER) *hi = imin(g, *hi, add(g, n0, gen_i64(g, (int64_t)nv * m->vl)));
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
  LLVMValueRef klo, khi;
  k_range(g, m, m0, rows, n0, nv, &klo, &khi);
  GenLoop k;
  gen_loop_begin(g, &k, klo, khi, "k");
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
    LLVMValueRef crow = add(g, mul(g, add(g, m0, gen_i64(g, r)), p->cm), mul(g, n0, p->cn));
    for (int v = 0; v < nv; v++) {
      LLVMValueRef y = gen_acc_get(g, acc[r][v]);
      LLVMValueRef at = add(g, crow, gen_i64(g, (int64_t)v * m->vl * p->cn));
      if (p->cn == 1 && (v < nv - 1 || tail == m->vl)) {
        store_c(g, m, gep_f32(g, m->c, at), y);
        continue;
      }
      /* A partial vector (masked), or C^T's row down C's column (a
       * scatter, a gather first where it adds): one instruction each,
       * where the elements one at a time took LLVM's SLP vectorizer 1 s
       * on mlp's dW2. */
      int cols = v < nv - 1 ? m->vl : tail;
      store_lanes(g, m, gep_f32(g, m->c, at), y, cols);
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

/* Zeros into rows [r0, r1) of C, nv vectors from column n0 on, the last
 * of them holding only `tail` columns. */
static void emit_zero_rows(Gen *g, const Bmm *m, LLVMValueRef r0, LLVMValueRef r1, LLVMValueRef n0, int nv, int tail) {
  const KpBmm *p = m->p;
  LLVMValueRef zero = LLVMConstNull(m->vt);
  GenLoop r;
  gen_loop_begin(g, &r, r0, r1, "dead");
  LLVMValueRef crow = add(g, mul(g, r.iv, p->cm), mul(g, n0, p->cn));
  for (int v = 0; v < nv; v++) {
    LLVMValueRef ptr = gep_f32(g, m->c, add(g, crow, gen_i64(g, (int64_t)v * m->vl * p->cn)));
    if (p->cn == 1 && (v < nv - 1 || tail == m->vl)) {
      LLVMValueRef st = LLVMBuildStore(g->b, zero, ptr);
      LLVMSetAlignment(st, 4);
    } else {
      store_lanes(g, m, ptr, zero, v < nv - 1 ? m->vl : tail);
    }
  }
  gen_loop_end(g, &r);
}

/* Rows of C for the column tile at n0 of nv vectors: tiles of mr rows in a
 * loop, then one of the rows left.  Where C has a dead region (KpBmm's
 * cdead), the full tiles wholly inside it are zeros: with the region
 * where the column exceeds the row, tile t (rows t mr .. t mr + mr - 1)
 * when t mr + mr <= n0, the tiles before n0 / mr; with the region below
 * the diagonal, when t mr exceeds the tile's last column, the tiles
 * after (n0 + nv vl - 1) / mr.  The tile of the rows left is computed. */
static void emit_rows(Gen *g, const Bmm *m, int mr, LLVMValueRef n0, int nv, int tail) {
  const KpBmm *p = m->p;
  int64_t full = p->M / mr, rest = p->M % mr;
  if (full > 0) {
    LLVMValueRef lo = gen_i64(g, 0), hi = gen_i64(g, full);
    if (p->cdead & KP_ZERO_LOWER) lo = imin(g, LLVMBuildSDiv(g->b, n0, gen_i64(g, mr), ""), hi);
    if (p->cdead & KP_ZERO_UPPER) {
      LLVMValueRef last = add(g, n0, gen_i64(g, (int64_t)nv * m->vl - 1));
      hi = imax(g, lo, imin(g, hi, add(g, LLVMBuildSDiv(g->b, last, gen_i64(g, mr), ""), gen_i64(g, 1))));
    }
    if (p->cdead) {
      emit_zero_rows(g, m, gen_i64(g, 0), mul(g, lo, mr), n0, nv, tail);
      emit_zero_rows(g, m, mul(g, hi, mr), gen_i64(g, full * mr), n0, nv, tail);
    }
    GenLoop rt;
    gen_loop_begin(g, &rt, lo, hi, "rows");
    emit_tile(g, m, mul(g, rt.iv, mr), mr, n0, nv, tail);
    gen_loop_end(g, &rt);
  }
  if (rest > 0) emit_tile(g, m, gen_i64(g, full * mr), (int)rest, n0, nv, tail);
}

/* The matrix's B at b into the panel (in blocks transposed in registers
 * where B is transposed and its sizes are whole vectors). */
static void emit_panel(Gen *g, const Bmm *m, const BmmTiling *t, LLVMValueRef b, LLVMValueRef panel) {
  const KpBmm *p = m->p;
  int64_t npad = t->nvec * m->vl;
  if (p->bk == 1 && p->K % m->vl == 0 && t->tail == 0) { /* whole blocks of a transposed B */
    GenLoop k, n;
    gen_loop_begin(g, &k, gen_i64(g, 0), gen_i64(g, p->K / m->vl), "tk");
    gen_loop_begin(g, &n, gen_i64(g, 0), gen_i64(g, t->whole), "tn");
    pack_block(g, m, b, panel, npad, mul(g, k.iv, m->vl), mul(g, n.iv, m->vl));
    gen_loop_end(g, &n);
    gen_loop_end(g, &k);
    return;
  }
  GenLoop k, n;
  gen_loop_begin(g, &k, gen_i64(g, 0), gen_i64(g, p->K), "pk");
  gen_loop_begin(g, &n, gen_i64(g, 0), gen_i64(g, p->N), "pn");
  LLVMValueRef x = LLVMBuildLoad2(g->b, g->t_f32, gep_f32(g, b, add(g, mul(g, k.iv, p->bk), mul(g, n.iv, p->bn))), "");
  LLVMSetAlignment(x, 4);
  LLVMBuildStore(g->b, x, gep_f32(g, panel, add(g, mul(g, k.iv, npad), n.iv)));
  gen_loop_end(g, &n);
  gen_loop_end(g, &k);
}

static LLVMValueRef icmp(Gen *g, LLVMIntPredicate pr, LLVMValueRef x, LLVMValueRef y) {
  return LLVMBuildICmp(g->b, pr, x, y, "");
}

/* if (cond) { then } else { other }, as blocks: if_begin, the then part,
 * if_else, the other part, if_end. */
typedef struct BmmIf {
  LLVMBasicBlockRef other, done;
} BmmIf;

static void if_begin(Gen *g, BmmIf *f, LLVMValueRef cond) {
  LLVMBasicBlockRef then = LLVMAppendBasicBlockInContext(g->ctx, g->fn, "then");
  f->other = LLVMAppendBasicBlockInContext(g->ctx, g->fn, "else");
  f->done = LLVMAppendBasicBlockInContext(g->ctx, g->fn, "fi");
  LLVMBuildCondBr(g->b, cond, then, f->other);
  LLVMPositionBuilderAtEnd(g->b, then);
}

static void if_else(Gen *g, BmmIf *f) {
  LLVMBuildBr(g->b, f->done);
  LLVMPositionBuilderAtEnd(g->b, f->other);
}

static void if_end(Gen *g, BmmIf *f) {
  LLVMBuildBr(g->b, f->done);
  LLVMPositionBuilderAtEnd(g->b, f->done);
}

/* A single product's tile (rt, ct): rows rt * mr on (mr of them, or the
 * rows left in the last row tile), the column tile ct (nt vectors, or the
 * vectors left in the last one). */
static void emit_single_tile(Gen *g, const Bmm *m, const BmmTiling *t, LLVMValueRef rt, LLVMValueRef ct) {
  int64_t full = m->p->M / t->mr, fullc = t->whole / t->nt;
  int rest = (int)(m->p->M % t->mr), left = (int)(t->nvec - fullc * t->nt);
  int lasttail = t->tail > 0 ? (int)t->tail : m->vl;
  LLVMValueRef m0 = mul(g, rt, t->mr), n0 = mul(g, ct, (int64_t)t->nt * m->vl);
  for (int part = 0; part < 2; part++) { /* full rows, then the rows left */
    int rows = part ? rest : t->mr;
    if (rows == 0 || (part == 0 && full == 0)) continue;
    BmmIf rif;
    bool rsplit = rest > 0 && full > 0;
    if (rsplit && part == 0) if_begin(g, &rif, icmp(g, LLVMIntSLT, rt, gen_i64(g, full)));
    if (left == 0) {
      emit_tile(g, m, m0, rows, n0, t->nt, m->vl);
    } else if (fullc == 0) {
      emit_tile(g, m, m0, rows, n0, left, lasttail);
    } else {
      BmmIf cif;
      if_begin(g, &cif, icmp(g, LLVMIntSLT, ct, gen_i64(g, fullc)));
      emit_tile(g, m, m0, rows, n0, t->nt, m->vl);
      if_else(g, &cif);
      emit_tile(g, m, m0, rows, n0, left, lasttail);
      if_end(g, &cif);
    }
    if (rsplit) {
      if (part == 0) if_else(g, &rif);
      else if_end(g, &rif);
    }
  }
}

/* ------------------------------------------------------------------ */
/* Dot products (KpBmm.dot): few columns, a long sum                    */
/* ------------------------------------------------------------------ */

/* Rows of C a dot kernel's iteration computes: its accumulators (rows x
 * N vectors), a vector of A per row and one of B^T beside them fill the
 * registers at most, 4 rows at most. */
static int dot_rows(const KpBmm *p) {
  int regs = gen_host_avx512() ? 32 : 16;
  int r = (int)((regs - 1) / (p->N + 1));
  return r < 1 ? 1 : r > 4 ? 4 : r > p->M ? (int)p->M : r;
}

/* The sum of x's lanes, halves added pairwise (lanes i and i + vl/2,
 * then i and i + vl/4, ...): a fixed order, the same on every run. */
static LLVMValueRef lane_sum(Gen *g, LLVMValueRef x, int vl) {
  for (int w = vl / 2; w >= 1; w /= 2) {
    LLVMValueRef lo[16], hi[16];
    for (int j = 0; j < w; j++) {
      lo[j] = LLVMConstInt(g->t_i32, (unsigned)j, 0);
      hi[j] = LLVMConstInt(g->t_i32, (unsigned)(j + w), 0);
    }
    LLVMValueRef a = LLVMBuildShuffleVector(g->b, x, x, LLVMConstVector(lo, (unsigned)w), "");
    LLVMValueRef b = LLVMBuildShuffleVector(g->b, x, x, LLVMConstVector(hi, (unsigned)w), "");
    x = LLVMBuildFAdd(g->b, a, b, "");
  }
  return LLVMBuildExtractElement(g->b, x, LLVMConstInt(g->t_i32, 0, 0), "");
}

/* A vector of x from element at on, its first `lanes` lanes (zeros after). */
static LLVMValueRef load_lanes(Gen *g, const Bmm *m, LLVMValueRef ptr, int lanes) {
  if (lanes == m->vl) {
    LLVMValueRef v = LLVMBuildLoad2(g->b, m->vt, ptr, "");
    LLVMSetAlignment(v, 4);
    return v;
  }
  LLVMTypeRef over[2] = {m->vt, LLVMTypeOf(ptr)};
  LLVMValueRef args[4] = {ptr, LLVMConstInt(g->t_i32, 4, 0), lane_mask(g, m, lanes), LLVMConstNull(m->vt)};
  return gen_intrinsic(g, "llvm.masked.load", over, 2, args, 4);
}

/* Rows [i0, i0 + rows) of C: for each k block of vl, a vector of each
 * row of A and of each row of B^T (the panel, bt apart), rows x N
 * multiply-adds into vectors; then each vector's lanes summed (lane_sum)
 * into its element of C (added to it where C is a gradient buffer). */
static void emit_dot_rows(Gen *g, const Bmm *m, LLVMValueRef i0, int rows, int64_t bt) {
  const KpBmm *p = m->p;
  enum { MAXR = 4, MAXN = KP_SKINNY };
  GenAcc acc[MAXR][MAXN];
  LLVMValueRef zero = LLVMConstNull(m->vt);
  for (int r = 0; r < rows; r++)
    for (int j = 0; j < p->N; j++) {
      acc[r][j] = gen_acc(g, m->vt);
      gen_acc_set(g, acc[r][j], zero);
    }
  LLVMValueRef arow = mul(g, i0, p->am);
  int64_t whole = p->K / m->vl;
  int tail = (int)(p->K % m->vl);
  for (int part = 0; part < 2; part++) { /* the whole vectors, then the tail */
    if (part ? tail == 0 : whole == 0) continue;
    GenLoop k;
    LLVMValueRef k0;
    if (part == 0) {
      gen_loop_begin(g, &k, gen_i64(g, 0), gen_i64(g, whole), "dk");
      k0 = mul(g, k.iv, m->vl);
    } else {
      k0 = gen_i64(g, whole * m->vl);
    }
    int lanes = part ? tail : m->vl;
    LLVMValueRef av[MAXR];
    for (int r = 0; r < rows; r++)
      av[r] = load_lanes(g, m, gep_f32(g, m->a, add(g, add(g, arow, gen_i64(g, r * p->am)), k0)), lanes);
    for (int j = 0; j < p->N; j++) {
      LLVMValueRef bv = load_lanes(g, m, gep_f32(g, m->b, add(g, gen_i64(g, j * bt), k0)), lanes);
      for (int r = 0; r < rows; r++) gen_acc_set(g, acc[r][j], fmuladd(g, av[r], bv, gen_acc_get(g, acc[r][j])));
    }
    if (part == 0) gen_loop_end(g, &k);
  }
  for (int r = 0; r < rows; r++) {
    LLVMValueRef crow = mul(g, add(g, i0, gen_i64(g, r)), p->cm);
    for (int j = 0; j < p->N; j++) {
      store_c(g, m, gep_f32(g, m->c, add(g, crow, gen_i64(g, j))), lane_sum(g, gen_acc_get(g, acc[r][j]), m->vl));
    }
  }
}

/* A dot product kernel: its iterations are tiles of dot_rows rows of C
 * (the last one shorter).  B^T is copied into a panel once a call, its
 * rows kp_dot_stride apart: K rounded up to whole vectors and one more,
 * so that the rows do not lie a multiple of 4 KB apart (ten rows of 1024
 * floats read side by side fell in one set of the L1 cache and took the
 * logits of mlp2 121 us against 61). */
static void gen_dot_kernel(Gen *g, const KpBmm *p) {
  Bmm m = {.p = p, .vl = gen_host_avx512() ? 16 : 8};
  m.vt = LLVMVectorType(g->t_f32, (unsigned)m.vl);
  GenBuf A = gen_buf(g, p->a), B = gen_buf(g, p->b), C = gen_buf(g, p->c);
  m.a = gep_f32(g, A.base, gen_i64(g, p->aoff));
  m.c = gep_f32(g, C.base, gen_i64(g, p->coff));
  LLVMValueRef b = gep_f32(g, B.base, gen_i64(g, p->boff));
  int64_t bt = kp_dot_stride(p);
  m.b = gen_alloca(g, g->t_f32, p->N * bt);
  /* B's unit stride innermost */
  bool kin = p->bk == 1;
  GenLoop outer, inner;
  gen_loop_begin(g, &outer, gen_i64(g, 0), gen_i64(g, kin ? p->N : p->K), "po");
  gen_loop_begin(g, &inner, gen_i64(g, 0), gen_i64(g, kin ? p->K : p->N), "pi");
  LLVMValueRef k = kin ? inner.iv : outer.iv, n = kin ? outer.iv : inner.iv;
  LLVMValueRef x = LLVMBuildLoad2(g->b, g->t_f32, gep_f32(g, b, add(g, mul(g, k, p->bk), mul(g, n, p->bn))), "");
  LLVMSetAlignment(x, 4);
  LLVMBuildStore(g->b, x, gep_f32(g, m.b, add(g, mul(g, n, bt), k)));
  gen_loop_end(g, &inner);
  gen_loop_end(g, &outer);
  int rows = dot_rows(p);
  int64_t full = p->M / rows;
  int rest = (int)(p->M % rows);
  GenLoop it;
  gen_loop_begin(g, &it, g->begin, g->end, "tile");
  LLVMValueRef i0 = mul(g, it.iv, rows);
  if (rest == 0) {
    emit_dot_rows(g, &m, i0, rows, bt);
  } else {
    BmmIf last;
    if_begin(g, &last, icmp(g, LLVMIntSLT, it.iv, gen_i64(g, full)));
    emit_dot_rows(g, &m, i0, rows, bt);
    if_else(g, &last);
    emit_dot_rows(g, &m, i0, rest, bt);
    if_end(g, &last);
  }
  gen_loop_end(g, &it);
  LLVMBuildRetVoid(g->b);
}

void gen_bmm_kernel(Gen *g, const KpBmm *p) {
  if (p->dot) {
    gen_dot_kernel(g, p);
    return;
  }
  BmmTiling t = bmm_tiling(p);
  Bmm m = {.p = p, .vl = t.vl};
  m.vt = LLVMVectorType(g->t_f32, (unsigned)m.vl);
  GenBuf A = gen_buf(g, p->a), B = gen_buf(g, p->b), C = gen_buf(g, p->c);
  bool direct = bmm_direct(p, &t);
  int64_t npad = t.nvec * m.vl;
  LLVMValueRef panel = direct ? NULL : gen_alloca(g, g->t_f32, p->K * npad);
  m.bk = direct ? p->bk : npad;
  if (!direct && t.tail > 0) { /* the panel's columns past N stay zero */
    GenLoop k;
    gen_loop_begin(g, &k, gen_i64(g, 0), gen_i64(g, p->K), "zk");
    for (int64_t j = p->N; j < npad; j++)
      LLVMBuildStore(g->b, LLVMConstReal(g->t_f32, 0), gep_f32(g, panel, add(g, mul(g, k.iv, npad), gen_i64(g, j))));
    gen_loop_end(g, &k);
  }

  if (p->nb == 1) {
    /* One matrix, its register tiles the iterations, row-major (t = rt *
     * nct + ct): C is written along its rows, which a product summing
     * over a few k is bound by (column-major tiles, each packing only its
     * panel columns, took twice as long on mlp's 256x1024x10). */
    int64_t nct = (t.nvec + t.nt - 1) / t.nt;
    m.a = gep_f32(g, A.base, gen_i64(g, p->aoff));
    m.c = gep_f32(g, C.base, gen_i64(g, p->coff));
    LLVMValueRef b = gep_f32(g, B.base, gen_i64(g, p->boff));
    m.b = direct ? b : panel;
    if (!direct) emit_panel(g, &m, &t, b, panel);
    GenAcc rt = gen_acc(g, g->t_i64), ct = gen_acc(g, g->t_i64);
    gen_acc_set(g, rt, LLVMBuildSDiv(g->b, g->begin, gen_i64(g, nct), ""));
    gen_acc_set(g, ct, LLVMBuildSRem(g->b, g->begin, gen_i64(g, nct), ""));
    GenLoop it;
    gen_loop_begin(g, &it, g->begin, g->end, "tile");
    LLVMValueRef r = gen_acc_get(g, rt), c = gen_acc_get(g, ct);
    emit_single_tile(g, &m, &t, r, c);
    LLVMValueRef c1 = add(g, c, gen_i64(g, 1));
    LLVMValueRef wrap = icmp(g, LLVMIntEQ, c1, gen_i64(g, nct));
    gen_acc_set(g, ct, LLVMBuildSelect(g->b, wrap, gen_i64(g, 0), c1, ""));
    gen_acc_set(g, rt, LLVMBuildSelect(g->b, wrap, add(g, r, gen_i64(g, 1)), r, ""));
    gen_loop_end(g, &it);
    LLVMBuildRetVoid(g->b);
    return;
  }

  GenLoop bt;
  gen_loop_begin(g, &bt, g->begin, g->end, "t");
  LLVMValueRef aoff = gen_i64(g, p->aoff), boff = gen_i64(g, p->boff), coff = gen_i64(g, p->coff);
  LLVMValueRef rest = bt.iv;
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
  m.b = direct ? b : panel;
  if (!direct) emit_panel(g, &m, &t, b, panel);
  /* Column tiles outside, rows inside: a column tile's panel stays in
   * the cache over the matrix's rows. */
  int64_t ctiles = t.whole / t.nt;
  if (ctiles > 0) {
    GenLoop ct;
    gen_loop_begin(g, &ct, gen_i64(g, 0), gen_i64(g, ctiles), "cols");
    emit_rows(g, &m, t.mr, mul(g, ct.iv, (int64_t)t.nt * m.vl), t.nt, m.vl);
    gen_loop_end(g, &ct);
  }
  int left = (int)(t.nvec - ctiles * t.nt);
  if (left > 0) emit_rows(g, &m, t.mr, gen_i64(g, ctiles * t.nt * m.vl), left, t.tail > 0 ? (int)t.tail : m.vl);
  gen_loop_end(g, &bt);
  LLVMBuildRetVoid(g->b);
}

void gen_bmm_extent(const KpBmm *p, int64_t *iters, int64_t *cost, int64_t *setup) {
  /* elements touched, roughly: 8 multiply-adds an element; a panel's
   * element copied, one */
  *setup = 0;
  if (p->dot) { /* tiles of dot_rows rows, B^T's panel once a call */
    int rows = dot_rows(p);
    *iters = (p->M + rows - 1) / rows;
    *cost = rows * p->N * p->K / 8 + rows * p->N;
    *setup = p->N * p->K;
    return;
  }
  if (p->nb == 1) { /* a single product's iterations are its tiles; B's panel once a call */
    BmmTiling t = bmm_tiling(p);
    int64_t cols = (int64_t)t.nt * t.vl;
    *iters = (p->M + t.mr - 1) / t.mr * ((t.nvec + t.nt - 1) / t.nt);
    *cost = t.mr * cols * p->K / 8 + t.mr * cols;
    if (!bmm_direct(p, &t)) *setup = p->K * t.nvec * t.vl;
    return;
  }
  *iters = p->nb; /* a batch matrix's panel is part of its iteration */
  *cost = p->M * p->N * p->K / 8 + p->M * p->N;
}
