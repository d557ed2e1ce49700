/* fuse.c - group ops into kernels (docs/BACKEND.md).
 *
 * Requires: a verified function after the target-independent passes and
 * the rewrites that prepare grouping (weight-grad-gemm, unslice-concat,
 * split-reductions, split-cross-entropy; it is correct without them, only
 * slower).
 * Guarantees: every op the executor does not run itself (see kp_op_group0:
 * matmul, reshape, const, window.sum, loss, grad, collectives) has
 * IrOp.group >= 1; each group's ops are contiguous in the op list, which
 * stays in an order where definitions precede uses; each group with more
 * than one op is a valid row kernel (kp_row_layout); the kernels and the
 * group-0 ops form an acyclic graph.
 *
 * How: every op starts as a kernel of its own.  Candidate merges are the
 * producer->consumer edges between row-kernel ops and the pairs of
 * row-kernel consumers of one whole-size value (siblings, so that
 * cross_entropy's forward and backward read the logits once).  They are
 * tried largest shared value first (the bytes a merge keeps out of
 * memory), producer->consumer edges before siblings, then the deepest
 * consumer first (so a backward op joins the backward kernel that reads
 * it, gelu_grad next to the multiply by the incoming gradient, rather than
 * the forward kernel that made its operand; depth and value ids make the
 * result independent of the op order, so fusing again changes nothing).
 * The exception is gelu's derivative (gelu_grad, gelu_erf_grad): its edge
 * from the op that makes its operand is tried first, so that it joins the
 * forward kernel, where gelu of the same operand computes the same
 * exponential (LLVM merges the two), and what the forward stores for the
 * backward is the derivative instead of its operand, the same size: the
 * backward is then a multiply.  On tinygpt large in f32 at one thread
 * (`gradc train --trace`, last of 5 windows) gelu's forward and backward
 * kernels went from 6.0-6.5 + 15.3 to 8.5 + 5.2-5.4 ms a window.  Not
 * where the operand is a bias added to a widened bf16/f16 GEMM result:
 * that operand is recomputed from the low value instead (below), which
 * keeps 2 bytes an element alive rather than 4.
 * A merge is kept when the union is still one row kernel and no path leaves one side and comes back
 * into the other through another kernel or a group-0 op (a cycle).
 * Finally the kernels are numbered and the op list reordered, kernel by
 * kernel, in a topological order that stays close to the original.
 *
 * A permute of the last two axes read only by matmuls stays in group 0:
 * memplan and the executor turn it into a transpose flag of the GEMMs.
 * So do the permutes, slices and reshapes that GEMMs read or write in
 * place as strided views (kp_views_find: q, k and v of attention read
 * straight out of the qkv projection, heads written straight into the
 * [B, T, C] layout the next GEMM reads), and a concat whose parts GEMMs
 * all write in place.
 * So does a slice that is one contiguous range of its operand (a stacked
 * param's w[l]: memplan aliases it at an offset), and an unslice of one
 * contiguous range that only feeds a gradient (w[l]'s: memplan has its
 * operand accumulate straight into that range of the gradient buffer).
 *
 * The one rewrite inside is rematerialisation (below): it is decided on
 * the kernels a first grouping makes, and the grouping then runs again. */
#include <stdlib.h>
#include <string.h>

#include "kernel.h"
#include "passes.h"

typedef enum { K_GROUP0, K_ROW, K_LOOP } Kind;

typedef struct Fuse {
  IrFunc *f;
  Arena *a;
  int n;          /* ops */
  Kind *kind;     /* by op index */
  int *parent;    /* union-find over op indices (kernels) */
  int *next;      /* member list: next op index of the kernel, -1 */
  int *head;      /* by root: its first member (members are kept in program order) */
  int **users;    /* by op index: indices of ops using its result */
  int *nusers;
  int *cand;      /* candidate membership epoch, by op index */
  int epoch;
  int *seen;      /* DFS visit epoch, by op index */
  int *stack;
  IrOp **buf;
} Fuse;

static int pos_of(const IrOp *op) { return op->mark; } /* ops' marks hold their positions during the pass */

static int root(Fuse *fu, int i) {
  while (fu->parent[i] != i) {
    fu->parent[i] = fu->parent[fu->parent[i]];
    i = fu->parent[i];
  }
  return i;
}

/* The node of op i in the kernel graph: its kernel's root, or itself. */
static int node(Fuse *fu, int i) { return fu->kind[i] == K_GROUP0 ? i : root(fu, i); }

/* ------------------------------------------------------------------ */
/* Merging                                                             */
/* ------------------------------------------------------------------ */

/* The ops of kernels ka and kb, in program order, into fu->buf. */
static int gather(Fuse *fu, int ka, int kb) {
  int m = 0;
  for (int i = fu->head[ka]; i >= 0; i = fu->next[i]) fu->buf[m++] = fu->f->ops[i];
  if (kb != ka)
    for (int i = fu->head[kb]; i >= 0; i = fu->next[i]) fu->buf[m++] = fu->f->ops[i];
  /* Both lists are sorted by position: merge them (insertion sort is fine, kernels are small). */
  for (int i = 1; i < m; i++) {
    IrOp *x = fu->buf[i];
    int j = i - 1;
    while (j >= 0 && pos_of(fu->buf[j]) > pos_of(x)) {
      fu->buf[j + 1] = fu->buf[j];
      j--;
    }
    fu->buf[j + 1] = x;
  }
  return m;
}

static bool used_outside(const IrValue *v, void *ctx) {
  Fuse *fu = ctx;
  int i = pos_of(v->def);
  for (int k = 0; k < fu->nusers[i]; k++)
    if (fu->cand[fu->users[i][k]] != fu->epoch) return true;
  return false;
}

/* Is there a path from kernel `from` to kernel `to` through some other node? */
static bool detour(Fuse *fu, int from, int to) {
  int sp = 0;
  fu->epoch++;
  int mark = fu->epoch;
  for (int i = fu->head[from]; i >= 0; i = fu->next[i])
    for (int k = 0; k < fu->nusers[i]; k++) {
      int u = fu->users[i][k], nu = node(fu, u);
      if (nu == from || nu == to || fu->seen[nu] == mark) continue;
      fu->seen[nu] = mark;
      fu->stack[sp++] = nu;
    }
  while (sp > 0) {
    int x = fu->stack[--sp];
    /* x is a node: a group-0 op or a kernel root; walk its members' users. */
    int first = fu->kind[x] == K_GROUP0 ? x : fu->head[x];
    for (int i = first; i >= 0; i = fu->kind[x] == K_GROUP0 ? -1 : fu->next[i])
      for (int k = 0; k < fu->nusers[i]; k++) {
        int u = fu->users[i][k], nu = node(fu, u);
        if (nu == to) return true;
        if (fu->seen[nu] == mark) continue;
        fu->seen[nu] = mark;
        fu->stack[sp++] = nu;
      }
  }
  return false;
}

/* Merge the kernels of ops i and j if the result is one row kernel and
 * stays acyclic; `shared` (siblings) must then be read whole. */
static void try_merge(Fuse *fu, int i, int j, const IrValue *shared) {
  int ka = root(fu, i), kb = root(fu, j);
  if (ka == kb) return;
  int m = gather(fu, ka, kb);
  fu->epoch++;
  for (int k = 0; k < m; k++) fu->cand[pos_of(fu->buf[k])] = fu->epoch;
  Arena tmp;
  arena_init(&tmp);
  KpRowLayout l;
  bool ok = kp_row_layout(fu->buf, m, used_outside, fu, &tmp, &l, NULL, 0);
  if (ok && shared) {
    KpSlot *s = kp_row_slot(&l, shared);
    ok = s && s->eoff == 0 && ir_numel(&shared->type.shape) == l.rows * l.cols;
  }
  arena_free(&tmp);
  if (!ok || detour(fu, ka, kb) || detour(fu, kb, ka)) return;
  /* Union: the two member lists merged by position. */
  fu->parent[kb] = ka;
  int n = 0;
  int *idx = fu->stack; /* free while not walking */
  for (int x = fu->head[ka]; x >= 0; x = fu->next[x]) idx[n++] = x;
  for (int x = fu->head[kb]; x >= 0; x = fu->next[x]) idx[n++] = x;
  for (int p = 1; p < n; p++) {
    int v = idx[p], q = p - 1;
    while (q >= 0 && idx[q] > v) {
      idx[q + 1] = idx[q];
      q--;
    }
    idx[q + 1] = v;
  }
  for (int p = 0; p < n; p++) fu->next[idx[p]] = p + 1 < n ? idx[p + 1] : -1;
  fu->head[ka] = idx[0];
}

/* ------------------------------------------------------------------ */
/* Candidates                                                          */
/* ------------------------------------------------------------------ */

typedef struct Cand {
  int64_t weight; /* elements of the shared value */
  int depth;      /* the consumer's dependency depth, for ties */
  int id, id2;    /* the consumer's and the other op's result ids, last ties */
  int i, j;       /* op indices */
  const IrValue *shared; /* siblings: the value both read */
} Cand;

static int cand_cmp(const void *pa, const void *pb) {
  const Cand *a = pa, *b = pb;
  if (a->weight != b->weight) return a->weight > b->weight ? -1 : 1;
  if (!a->shared != !b->shared) return a->shared ? 1 : -1; /* producer->consumer first */
  if (a->depth != b->depth) return a->depth > b->depth ? -1 : 1;
  if (a->id != b->id) return a->id > b->id ? -1 : 1;
  return a->id2 > b->id2 ? -1 : a->id2 < b->id2;
}

/* Siblings sorted by depth, then result id. */
static const int *g_depth;
static IrOp *const *g_ops;
static int reader_cmp(const void *pa, const void *pb) {
  int a = *(const int *)pa, b = *(const int *)pb;
  if (g_depth[a] != g_depth[b]) return g_depth[a] < g_depth[b] ? -1 : 1;
  return g_ops[a]->result->id - g_ops[b]->result->id;
}

/* ------------------------------------------------------------------ */
/* Ordering                                                            */
/* ------------------------------------------------------------------ */

/* A binary min-heap of nodes keyed by their first op's position. */
typedef struct Heap {
  int *a;
  int n;
} Heap;

static void heap_push(Heap *h, int x) {
  int i = h->n++;
  h->a[i] = x;
  while (i > 0 && h->a[(i - 1) / 2] > h->a[i]) {
    int p = (i - 1) / 2, t = h->a[p];
    h->a[p] = h->a[i];
    h->a[i] = t;
    i = p;
  }
}

static int heap_pop(Heap *h) {
  int top = h->a[0];
  h->a[0] = h->a[--h->n];
  for (int i = 0;;) {
    int l = 2 * i + 1, r = l + 1, m = i;
    if (l < h->n && h->a[l] < h->a[m]) m = l;
    if (r < h->n && h->a[r] < h->a[m]) m = r;
    if (m == i) break;
    int t = h->a[m];
    h->a[m] = h->a[i];
    h->a[i] = t;
    i = m;
  }
  return top;
}

/* Reorder f->ops kernel by kernel and number the kernels. */
static void schedule(Fuse *fu) {
  int n = fu->n;
  IrFunc *f = fu->f;
  int *indeg = ARENA_ARRAY(fu->a, int, n);
  /* A node is keyed by its first member's position: a kernel root's head. */
  int *key_node = ARENA_ARRAY(fu->a, int, n); /* position -> node */
  for (int i = 0; i < n; i++) key_node[i] = -1;
  for (int i = 0; i < n; i++) {
    int nd = node(fu, i);
    int first = fu->kind[nd] == K_GROUP0 ? nd : fu->head[nd];
    key_node[first] = nd;
    for (int k = 0; k < fu->nusers[i]; k++) {
      int nu = node(fu, fu->users[i][k]);
      if (nu != nd) indeg[nu]++;
    }
  }
  Heap h = {ARENA_ARRAY(fu->a, int, n), 0};
  for (int p = 0; p < n; p++)
    if (key_node[p] >= 0 && indeg[key_node[p]] == 0) heap_push(&h, p);
  IrOp **order = ARENA_ARRAY(fu->a, IrOp *, n);
  int k = 0, group = 0;
  while (h.n > 0) {
    int nd = key_node[heap_pop(&h)];
    bool kernel = fu->kind[nd] != K_GROUP0;
    if (kernel) group++;
    for (int i = kernel ? fu->head[nd] : nd; i >= 0; i = kernel ? fu->next[i] : -1) {
      f->ops[i]->group = kernel ? group : 0;
      order[k++] = f->ops[i];
      for (int u = 0; u < fu->nusers[i]; u++) {
        int nu = node(fu, fu->users[i][u]);
        if (nu == nd) continue;
        if (--indeg[nu] == 0) heap_push(&h, fu->kind[nu] == K_GROUP0 ? nu : fu->head[nu]);
      }
    }
  }
  GRADC_ASSERT(k == n); /* merges never create cycles */
  memcpy(f->ops, order, sizeof(IrOp *) * (size_t)n);
}

/* A permute swapping the last two axes whose every reader is a matmul. */
static bool gemm_transpose(const Fuse *fu, int i) {
  const IrOp *op = fu->f->ops[i];
  if (!rw_is_transpose(op) || fu->nusers[i] == 0) return false;
  for (int k = 0; k < fu->nusers[i]; k++)
    if (fu->f->ops[fu->users[i][k]]->opcode != IR_OP_MATMUL) return false;
  return true;
}

/* A slice that is one contiguous range of its operand (w[l] of a stacked
 * param): memplan makes it an alias at an offset, no copy. */
static bool range_slice(const IrOp *op) {
  int64_t first;
  return op->opcode == IR_OP_SLICE && kp_slice_contiguous(op, &first);
}

/* An unslice of one contiguous range (the gradient of w[l]) whose value
 * reaches `grad` outputs only through adds read by nothing else (memplan
 * splits those into one contribution each), and whose operand, through
 * reshapes read by nothing else, is made by a GEMM or a kernel: memplan
 * stores the operand straight in that range of the gradient buffer, where
 * its producer accumulates, and the unslice does no work. */
static bool grad_unslice(const Fuse *fu, int i) {
  const IrOp *op = fu->f->ops[i];
  int64_t first;
  if (op->opcode != IR_OP_UNSLICE || !kp_slice_contiguous(op, &first)) return false;
  for (int u = i;;) {
    if (fu->nusers[u] != 1) return false;
    const IrOp *user = fu->f->ops[fu->users[u][0]];
    if (user->opcode == IR_OP_GRAD) break;
    if (user->opcode != IR_OP_ADD || user->args[0] == user->args[1] ||
        !ir_type_eq(&user->result->type, &op->result->type))
      return false;
    u = fu->users[u][0];
  }
  const IrValue *x = op->args[0];
  while (x->def && x->def->opcode == IR_OP_RESHAPE) {
    if (fu->nusers[pos_of(x->def)] != 1) return false;
    x = x->def->args[0];
  }
  const IrOp *d = x->def;
  if (!d || fu->nusers[pos_of(d)] != 1) return false;
  return d->opcode == IR_OP_MATMUL || (!kp_op_group0(d->opcode) && !range_slice(d) && d->opcode != IR_OP_UNSLICE);
}

/* Movement ops stay out of kernels while kp_views_find decides which of
 * them GEMMs read or write in place (views); the rest become kernels. */
static bool fuse_outside(const IrOp *op, void *ctx) {
  (void)ctx;
  return kp_op_group0(op->opcode) || op->opcode == IR_OP_PERMUTE || op->opcode == IR_OP_SLICE ||
         op->opcode == IR_OP_CONCAT;
}

/* ------------------------------------------------------------------ */
/* Rematerialising cheap elementwise values                            */
/* ------------------------------------------------------------------ */

/* A value v = E(a, b...) that a kernel computes and a later kernel reads
 * again (the backward reading a layer norm's centred input x - mean) is
 * written to memory by the first and read back by the second.  When E is
 * one cheap elementwise op with exactly one operand as large as v and
 * already in memory (a kernel input, or an output read elsewhere), the
 * rest one value per row (a row statistic, then stored if it was not) or
 * scalars, the reader can compute E itself from
 * the operands: the write of v goes, the read of v becomes a read of its
 * large operand, and the memory kept alive until the reader is the same
 * size.  (A bias, which varies along the row, is left out: recomputing an
 * activation's x @ W + b in its gradient's kernel saved the forward's
 * write but cost the backward more, one more load per element, measured on tinygpt
 * large: 0.6 ms a window slower in all.)  Except where the large operand
 * is a widening cast of a bf16 or f16 value in memory (a mixed-precision
 * GEMM's result): v = cast(x16) + bias is then recomputed from x16, its
 * reader loads 2 bytes an element instead of 4 (the bias stays in cache),
 * the forward writes nothing, and x16 is half v's size; the reader's
 * kernel gets copies of the cast and E.  Every reader of v outside E's
 * kernel must be a row-kernel op (a GEMM reading v keeps it stored
 * anyway).  Each reading kernel gets its own copy of E, placed before
 * its first reader; grouping then runs again, so the copy joins it. */
#define REMAT_MIN_ELEMS 4096
#define REMAT_BEFORE 6 /* copies placed before one op: one per operand it reads, each with its cast */

static void place_before(IrOp **before, int *nbefore, int i, IrOp *op) {
  GRADC_ASSERT(nbefore[i] < REMAT_BEFORE);
  before[REMAT_BEFORE * i + nbefore[i]++] = op;
}

static bool remat_op(IrOpcode opc) { return opc == IR_OP_ADD || opc == IR_OP_SUB || opc == IR_OP_MUL; }

/* A non-const op of the function as grouped (not a copy made since). */
static bool op_here(const Fuse *fu, const IrOp *op) {
  int d = pos_of(op);
  return d >= 0 && d < fu->n && fu->f->ops[d] == op && op->opcode != IR_OP_CONST;
}

/* Whether value a is in memory anyway: an argument, or defined by a
 * non-const op outside kernel ke, or read outside it. */
static bool stored_anyway(Fuse *fu, const IrValue *a, int ke) {
  if (!a->def) return true;
  if (!op_here(fu, a->def)) return false;
  int d = pos_of(a->def);
  if (node(fu, d) != ke) return true;
  for (int j = 0; j < fu->nusers[d]; j++)
    if (node(fu, fu->users[d][j]) != ke) return true;
  return false;
}

/* A widening cast of a large bf16 or f16 value that is in memory anyway. */
static bool low_widening(Fuse *fu, const IrValue *a, int ke) {
  const IrOp *c = a->def;
  if (!c || c->opcode != IR_OP_CAST || (a->type.dtype != IR_DT_F32 && a->type.dtype != IR_DT_F64)) return false;
  const IrValue *x = c->args[0];
  if (x->type.dtype != IR_DT_BF16 && x->type.dtype != IR_DT_F16) return false;
  return op_here(fu, c) && stored_anyway(fu, x, ke);
}

/* Which operand of e, an op of kernel ke whose result has numel
 * elements, is that many elements and a low_widening; -1 if none. */
static int low_operand(Fuse *fu, const IrOp *e, int64_t numel, int ke) {
  int low = -1;
  for (int k = 0; k < e->nargs; k++)
    if (ir_numel(&e->args[k]->type.shape) == numel && low_widening(fu, e->args[k], ke)) low = k;
  return low;
}

static bool rematerialise(Fuse *fu) {
  IrFunc *f = fu->f;
  int n = fu->n;
  /* by op index: the copy of E that op reads instead of v (one per kernel) */
  IrValue **copy_for = ARENA_ARRAY(fu->a, IrValue *, n ? n : 1);
  /* copies, REMAT_BEFORE at most by the index of the op they precede */
  IrOp **before = ARENA_ARRAY(fu->a, IrOp *, REMAT_BEFORE * (n ? n : 1));
  int *nbefore = ARENA_ARRAY(fu->a, int, n ? n : 1);
  bool any = false;
  for (int e = 0; e < n; e++) {
    IrOp *E = f->ops[e];
    IrValue *v = E->result;
    if (fu->kind[e] != K_ROW || !remat_op(E->opcode) || !v || ir_numel(&v->type.shape) < REMAT_MIN_ELEMS ||
        (v->type.dtype != IR_DT_F32 && v->type.dtype != IR_DT_F64))
      continue;
    int ke = root(fu, e), big = 0;
    int low = low_operand(fu, E, ir_numel(&v->type.shape), ke); /* the large operand, when a low_widening */
    for (int k = 0; k < E->nargs; k++) big += ir_numel(&E->args[k]->type.shape) == ir_numel(&v->type.shape);
    bool ok = big == 1;
    for (int k = 0; k < E->nargs && ok; k++) {
      const IrValue *a = E->args[k];
      const IrShape *as = &a->type.shape;
      bool large = ir_numel(as) == ir_numel(&v->type.shape);
      if (k == low) continue;
      /* varies along the row: only beside a low-precision large operand, as one row (a bias) */
      if (!large && as->rank > 0 && as->dim[as->rank - 1] != 1 && (low < 0 || ir_numel(as) != as->dim[as->rank - 1]))
        ok = false;
      /* The large operand must be in memory already (defined elsewhere or
       * read elsewhere); a per-row one may become a (small) output of E's kernel. */
      if (a->def && ok) ok = large ? stored_anyway(fu, a, ke) : op_here(fu, a->def);
    }
    if (!ok) continue;
    int outside = 0;
    for (int k = 0; k < fu->nusers[e] && ok; k++) {
      int u = fu->users[e][k];
      ok = fu->kind[u] == K_ROW;
      if (ok && root(fu, u) != ke) outside++;
    }
    if (!ok || outside == 0) continue;
    /* One copy per reading kernel, before that kernel's first reader. */
    for (int k = 0; k < fu->nusers[e]; k++) {
      int u = fu->users[e][k], ku = root(fu, u);
      if (ku == ke || copy_for[u]) continue;
      int first = u;
      for (int j = 0; j < fu->nusers[e]; j++)
        if (root(fu, fu->users[e][j]) == ku && fu->users[e][j] < first) first = fu->users[e][j];
      IrValue *args[3];
      memcpy(args, E->args, sizeof(IrValue *) * (size_t)E->nargs);
      if (low >= 0) { /* the widening cast too, first */
        const IrOp *w = E->args[low]->def;
        args[low] = ir_cast(f, w->args[0], w->result->type.dtype, w->loc);
        place_before(before, nbefore, first, args[low]->def);
      }
      IrValue *c = ir_emit(f, E->opcode, args, E->nargs, E->attrs, E->nattrs, NULL, E->loc); /* placed below */
      place_before(before, nbefore, first, c->def);
      for (int j = 0; j < fu->nusers[e]; j++)
        if (root(fu, fu->users[e][j]) == ku) copy_for[fu->users[e][j]] = c;
      any = true;
    }
    /* The readers take the copy (copy_for is per op; an op reading two
     * rematerialised values is rewritten for each in turn below). */
    for (int k = 0; k < fu->nusers[e]; k++) {
      int u = fu->users[e][k];
      if (!copy_for[u]) continue;
      IrOp *U = f->ops[u];
      for (int j = 0; j < U->nargs; j++)
        if (U->args[j] == v) U->args[j] = copy_for[u];
      copy_for[u] = NULL;
    }
  }
  if (!any) return false;
  /* Rebuild the op list with the copies in place. */
  IrOp **ops = ARENA_ARRAY(fu->a, IrOp *, f->nops);
  int m = 0;
  for (int i = 0; i < n; i++) {
    for (int k = 0; k < nbefore[i]; k++) ops[m++] = before[REMAT_BEFORE * i + k];
    ops[m++] = f->ops[i];
  }
  GRADC_ASSERT(m == f->nops);
  memcpy(f->ops, ops, sizeof(IrOp *) * (size_t)m);
  for (int i = 0; i < m; i++) f->ops[i]->group = 0;
  return true;
}

/* Whether op, a row op reading value x made by a row op, is gelu's
 * derivative to be fused forward (the exception above): x is not a bias
 * added to a widened low-precision value, which rematerialise recomputes
 * instead (its large operand a low_widening). */
static bool derivative_forward(Fuse *fu, const IrOp *op, const IrValue *x) {
  if (op->opcode != IR_OP_GELU_GRAD && op->opcode != IR_OP_GELU_ERF_GRAD) return false;
  const IrOp *e = x->def;
  return !e || !remat_op(e->opcode) || low_operand(fu, e, ir_numel(&x->type.shape), node(fu, pos_of(e))) < 0;
}

/* Try every candidate merge of fu's kernels, best first: producer->consumer
 * edges between row-kernel ops, then siblings over one value. */
static void merge_candidates(Fuse *fu, const int *depth) {
  IrFunc *f = fu->f;
  int n = fu->n, nn = n ? n : 1;
  int ncand = 0, capcand = 64;
  Cand *cands = malloc(sizeof(Cand) * (size_t)capcand);
  if (!cands) abort();
#define ADD_CAND(W, I, J, S)                                                                                 \
  do {                                                                                                       \
    if (ncand == capcand) {                                                                                  \
      capcand *= 2;                                                                                          \
      Cand *c_ = realloc(cands, sizeof(Cand) * (size_t)capcand);                                             \
      if (!c_) abort();                                                                                      \
      cands = c_;                                                                                            \
    }                                                                                                        \
    cands[ncand++] = (Cand){(W), depth[J], f->ops[J]->result->id, f->ops[I]->result->id, (I), (J), (S)};   \
  } while (0)
  for (int i = 0; i < n; i++) {
    if (fu->kind[i] != K_ROW) continue;
    IrOp *op = f->ops[i];
    for (int k = 0; k < op->nargs; k++) {
      IrOp *d = op->args[k]->def;
      if (!d || fu->kind[pos_of(d)] != K_ROW) continue;
      int64_t w = ir_numel(&op->args[k]->type.shape);
      ADD_CAND(w + derivative_forward(fu, op, op->args[k]), pos_of(d), i, NULL); /* ahead of equal weights */
    }
  }
  /* Siblings: row-kernel readers of one value (not a const), in depth order, consecutive pairs. */
  int *readers = ARENA_ARRAY(fu->a, int, nn);
  g_depth = depth;
  g_ops = f->ops;
  for (int v = 0; v < f->nvalues; v++) {
    IrValue *val = f->values[v];
    if ((val->def && val->def->opcode == IR_OP_CONST) || ir_numel(&val->type.shape) <= 1) continue;
    int nr = 0;
    int p = val->def ? pos_of(val->def) : -1;
    if (p >= 0 && (p >= n || f->ops[p] != val->def)) continue; /* not defined by a live op */
    if (p >= 0) {
      for (int k = 0; k < fu->nusers[p]; k++)
        if (fu->kind[fu->users[p][k]] == K_ROW) readers[nr++] = fu->users[p][k];
    } else {
      for (int i = 0; i < n; i++) {
        if (fu->kind[i] != K_ROW) continue;
        for (int k = 0; k < f->ops[i]->nargs; k++)
          if (f->ops[i]->args[k] == val) {
            readers[nr++] = i;
            break;
          }
      }
    }
    qsort(readers, (size_t)nr, sizeof(int), reader_cmp);
    for (int r = 1; r < nr; r++) ADD_CAND(ir_numel(&val->type.shape), readers[r - 1], readers[r], val);
  }
  qsort(cands, (size_t)ncand, sizeof(Cand), cand_cmp);
  for (int c = 0; c < ncand; c++) try_merge(fu, cands[c].i, cands[c].j, cands[c].shared);
  free(cands);
#undef ADD_CAND
}

/* Group f's ops into kernels (fu's union-find), not yet ordered. */
static void group_ops(IrFunc *f, const PassOptions *o, Arena *scratch, Fuse *out) {
  int n = f->nops;
  Fuse fu;
  memset(&fu, 0, sizeof fu);
  fu.f = f;
  fu.a = scratch;
  fu.n = n;
  int nn = n ? n : 1;
  fu.kind = ARENA_ARRAY(scratch, Kind, nn);
  fu.parent = ARENA_ARRAY(scratch, int, nn);
  fu.next = ARENA_ARRAY(scratch, int, nn);
  fu.head = ARENA_ARRAY(scratch, int, nn);
  fu.users = ARENA_ARRAY(scratch, int *, nn);
  fu.nusers = ARENA_ARRAY(scratch, int, nn);
  fu.cand = ARENA_ARRAY(scratch, int, nn);
  fu.seen = ARENA_ARRAY(scratch, int, nn);
  fu.stack = ARENA_ARRAY(scratch, int, nn);
  fu.buf = ARENA_ARRAY(scratch, IrOp *, nn);
  for (int i = 0; i < n; i++) {
    IrOp *op = f->ops[i];
    op->mark = i;
    bool row = kp_op_rowwise(op) && !(o->no_colsums && kp_op_colsum(op));
    fu.kind[i] = kp_op_group0(op->opcode) ? K_GROUP0 : row ? K_ROW : K_LOOP;
    fu.parent[i] = i;
    fu.next[i] = -1;
    fu.head[i] = i;
  }
  /* Users of each op's result. */
  for (int i = 0; i < n; i++)
    for (int k = 0; k < f->ops[i]->nargs; k++) {
      IrOp *d = f->ops[i]->args[k]->def;
      if (d) fu.nusers[pos_of(d)]++;
    }
  for (int i = 0; i < n; i++) {
    fu.users[i] = ARENA_ARRAY(scratch, int, fu.nusers[i] ? fu.nusers[i] : 1);
    fu.nusers[i] = 0;
  }
  for (int i = 0; i < n; i++)
    for (int k = 0; k < f->ops[i]->nargs; k++) {
      IrOp *d = f->ops[i]->args[k]->def;
      if (!d) continue;
      int p = pos_of(d);
      int *u = fu.users[p];
      if (fu.nusers[p] > 0 && u[fu.nusers[p] - 1] == i) continue; /* x op x */
      u[fu.nusers[p]++] = i;
    }

  for (int i = 0; i < n; i++)
    if (gemm_transpose(&fu, i) || range_slice(f->ops[i]) || grad_unslice(&fu, i)) fu.kind[i] = K_GROUP0;
  KpViews vs;
  kp_views_find(f, fuse_outside, NULL, &vs);
  for (int i = 0; i < n; i++)
    if (kp_view_free_op(&vs, f->ops[i])) fu.kind[i] = K_GROUP0;
  kp_views_free(&vs);

  /* Dependency depth of every op (independent of the op order). */
  int *depth = ARENA_ARRAY(scratch, int, nn);
  for (int i = 0; i < n; i++)
    for (int k = 0; k < f->ops[i]->nargs; k++) {
      IrOp *d = f->ops[i]->args[k]->def;
      if (d && depth[pos_of(d)] + 1 > depth[i]) depth[i] = depth[pos_of(d)] + 1;
    }

  merge_candidates(&fu, depth);
  *out = fu;
}

/* ------------------------------------------------------------------ */
/* The pass                                                            */
/* ------------------------------------------------------------------ */

PassResult pass_fuse(IrFunc *f, const PassOptions *o, Arena *scratch) {
  bool changed = false;
  int n = f->nops, nn = n ? n : 1;
  IrOp **old_order = ARENA_ARRAY(scratch, IrOp *, nn);
  int *old_group = ARENA_ARRAY(scratch, int, nn);
  for (int i = 0; i < n; i++) {
    old_order[i] = f->ops[i];
    old_group[i] = f->ops[i]->group;
  }
  Fuse fu;
  group_ops(f, o, scratch, &fu);
  if (rematerialise(&fu)) {
    changed = true;
    group_ops(f, o, scratch, &fu);
  }
  schedule(&fu);
  if (f->nops != n) changed = true;
  for (int i = 0; i < n && !changed; i++)
    if (f->ops[i] != old_order[i] || f->ops[i]->group != old_group[i]) changed = true;
  for (int i = 0; i < f->nops; i++) f->ops[i]->mark = 0;
  return changed ? PASS_CHANGED : PASS_UNCHANGED;
}
