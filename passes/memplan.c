/* memplan.c - the memory plan: one arena per step (docs/BACKEND.md).
 *
 * Requires: a function after `fuse` (kernel ops carry their group >= 1 and
 * each group is contiguous in the op list); an unfused function is planned
 * as if every op outside the executor's own set were a kernel of one op.
 * Guarantees: every value that is read from or written to memory has a
 * storage and an offset, and IrFunc.arena_size / persist_size are set:
 *
 *   [0, persist_size)           every argument (params, and inputs, which the
 *                               executor copies in: a batched input holds one
 *                               micro-batch), the gradient buffers, the consts
 *                               a group-0 op reads, the window.sum results
 *   [persist_size, arena_size)  one micro-batch's activations, reused by
 *                               liveness, first fit, 64-byte aligned
 *
 * What needs memory.  A kernel reads from memory every operand defined
 * outside its group except group-0 consts (inlined as immediates); a GEMM,
 * a `loss`, a collective and an unfused op read all their operands; a
 * reshape needs its operand when it is needed itself (it aliases it:
 * IR_STORE_ALIAS, same offset), and so does a group-0 slice of one
 * contiguous range (w[l] of a stacked param: an alias at the range's
 * offset); a GEMM result and a window.sum result are always stored.  A window.sum operand is not read from memory: the
 * executor evaluates window sums with the reference interpreter's count
 * phase before the first micro-batch.  A `permute` of the last two axes
 * that is left in group 0 and read only by GEMMs becomes a transpose flag
 * of those GEMMs: it gets no storage and its operand is read instead.  More
 * generally GEMM views (kp_views_find in codegen/kernel.c) get no storage:
 * the value a view reads is needed instead, and the value a GEMM writes
 * through a view is stored and lives from that GEMM's step on.
 * Everything else lives in its kernel's row scratch (IR_STORE_NONE).
 *
 * Gradients.  Each param named by a `grad` output has one persistent buffer
 * (f32, f64 for f64 params, whatever the value's dtype).  The value feeding
 * `grad` (through group-0 reshapes, which alias it) is stored there as
 * IR_STORE_GRAD, so the kernel or GEMM producing it accumulates (+=, GEMM
 * beta = 1) and K micro-batches add up in place with no separate add.  That
 * is only right when nothing else reads the value: a reader of the buffer
 * would see the running sum of the window, not this micro-batch's value.
 * So when the value has any other use (another op, a second `grad`), or is
 * not computed by a kernel or GEMM at all (an argument, a const, a
 * window.sum result), memplan gives the value its ordinary storage and
 * inserts a copy-accumulate kernel of its own right after the value's
 * definition: `%dW.acc = detach %v` in a new group, stored IR_STORE_GRAD,
 * which the `grad` output then reads.  The common case (a gradient that
 * feeds only its `grad`) needs no extra op.  A gradient that is a sum
 * `add(p, q)` of two such values (a weight decay term plus a GEMM, a tied
 * embedding's two uses) is split first into `grad p` and `grad q` naming
 * the same param: both producers accumulate into the one buffer, and the
 * full-size temporary the sum would have needed is gone.  A group-0
 * unslice of one contiguous range on the way from a `grad` to its producer
 * (w[l]'s gradient, which fuse leaves in group 0) is no work: its value is
 * the buffer and its operand is stored in the range, so the producer
 * accumulates into its part of the buffer; a group-0 unslice that cannot
 * be filled so becomes a kernel of its own.
 *
 * Collectives (docs/DISTRIBUTED.md).  A start hands its operand to the
 * comm layer and the collective writes the start's result buffer until
 * the wait: the operand lives until the wait's step, and the wait's result
 * is an alias of the start's (IR_STORE_ALIAS, same offset), so neither is
 * reused in between.  A data-parallel gradient reduction (dp-reduce's
 * last=true all-reduce start and wait) is part of the gradient's chain
 * like a reshape: its operand, start and wait all live in the param's
 * gradient buffer (IR_STORE_GRAD, one offset), where the executor reduces
 * the window's accumulated gradient in place; a copy-accumulate kernel, when
 * one is needed, feeds the start.  A stacked param's gradient reduced one
 * layer slice at a time (dp-reduce: `grad (unslice (wait (start %c)))` per
 * slice) has each slice's contribution, start and wait in the slice's
 * range of the buffer, and its unslice is no work (fuse makes such an
 * unslice a kernel of its own; it goes back to group 0).  The gradient
 * buffers of those params come first in the persistent region, by the
 * first bucket of each (then dtype, then the order of their starts), so
 * a bucket of whole gradients is one contiguous range, and the slices of
 * one param in one bucket (consecutive layers) are one too; slices of
 * different params are not (each param's buffer is whole), and the
 * executor reduces such a bucket as one all-reduce per contiguous run.
 *
 * Liveness is over "steps": a kernel (its contiguous ops) is one step, any
 * other op one step.  A buffer lives from the step that writes it to the
 * last step that reads it or any alias of it, inclusive, so a step never
 * writes over its own inputs, except where a row kernel writes an output
 * over an operand that dies in it (write_in_place).  Buffers are placed
 * largest first at the lowest 64-byte-aligned offset that overlaps no
 * placed buffer with an overlapping lifetime.  Running the pass again
 * gives the same plan. */
#include <stdlib.h>
#include <string.h>

#include "kernel.h"
#include "passes.h"

#define ALIGN 64
static int64_t align_up(int64_t n) { return (n + ALIGN - 1) / ALIGN * ALIGN; }

static int64_t value_bytes(const IrValue *v) {
  return ir_numel(&v->type.shape) * (int64_t)ir_dtype_size(v->type.dtype);
}

/* A permute that swaps exactly the last two axes (a matrix transpose). */
static bool is_transpose(const IrOp *op) {
  if (op->opcode != IR_OP_PERMUTE) return false;
  const int64_t *perm;
  int n = ir_attr_get_ints(op, "perm", &perm);
  if (n < 2 || n != op->result->type.shape.rank) return false;
  for (int i = 0; i < n - 2; i++)
    if (perm[i] != i) return false;
  return perm[n - 2] == n - 1 && perm[n - 1] == n - 2;
}

/* What a group-0 op is to the executor. */
typedef enum {
  X_GEMM,    /* matmul: the BLAS */
  X_ALIAS,   /* reshape: no work, shares its operand's bytes */
  X_CONST,   /* inlined into kernels, stored only when a group-0 op reads it */
  X_WSUM,    /* window.sum: written by the executor before the micro-batches */
  X_LOSS,    /* loss: read by the executor */
  X_GRAD,    /* grad: accumulated in place by its producer */
  X_COPY,    /* collectives (one rank: a copy) */
  X_PERMUTE, /* a transpose, when it can be a GEMM flag; else unfused */
  X_UNFUSED, /* anything else: a kernel of one op */
} ExecKind;

static ExecKind exec_kind(IrOpcode opc) {
  switch (opc) {
  case IR_OP_MATMUL: return X_GEMM;
  case IR_OP_RESHAPE: return X_ALIAS;
  case IR_OP_CONST: return X_CONST;
  case IR_OP_WINDOW_SUM: return X_WSUM;
  case IR_OP_LOSS: return X_LOSS;
  case IR_OP_GRAD: return X_GRAD;
  case IR_OP_ALL_REDUCE_START:
  case IR_OP_ALL_REDUCE_WAIT:
  case IR_OP_ALL_GATHER_START:
  case IR_OP_ALL_GATHER_WAIT:
  case IR_OP_REDUCE_SCATTER_START:
  case IR_OP_TP_COPY:
  case IR_OP_TP_SCATTER:
  case IR_OP_RANK_SLICE:
  case IR_OP_RANK_CONCAT:
  case IR_OP_REDUCE_SCATTER_WAIT: return X_COPY;
  case IR_OP_PERMUTE: return X_PERMUTE;
  case IR_OP_NEG:
  case IR_OP_EXP:
  case IR_OP_LOG:
  case IR_OP_SQRT:
  case IR_OP_RSQRT:
  case IR_OP_TANH:
  case IR_OP_SIGMOID:
  case IR_OP_RELU:
  case IR_OP_GELU:
  case IR_OP_SILU:
  case IR_OP_ABS:
  case IR_OP_SIGN:
  case IR_OP_POW:
  case IR_OP_GELU_GRAD:
  case IR_OP_CAST:
  case IR_OP_DETACH:
  case IR_OP_ADD:
  case IR_OP_SUB:
  case IR_OP_MUL:
  case IR_OP_DIV:
  case IR_OP_MAXIMUM:
  case IR_OP_MINIMUM:
  case IR_OP_EQ:
  case IR_OP_NE:
  case IR_OP_LT:
  case IR_OP_LE:
  case IR_OP_GT:
  case IR_OP_GE:
  case IR_OP_SELECT:
  case IR_OP_SUM:
  case IR_OP_MEAN:
  case IR_OP_MAX:
  case IR_OP_LOGSUMEXP:
  case IR_OP_BROADCAST:
  case IR_OP_SLICE:
  case IR_OP_UNSLICE:
  case IR_OP_CONCAT:
  case IR_OP_SOFTMAX:
  case IR_OP_LOG_SOFTMAX:
  case IR_OP_LAYER_NORM:
  case IR_OP_RMS_NORM:
  case IR_OP_CAUSAL_MASK:
  case IR_OP_EMBEDDING:
  case IR_OP_EMBEDDING_GRAD:
  case IR_OP_CROSS_ENTROPY:
  case IR_OP_ONE_HOT:
  case IR_OP_MSE_LOSS:
  case IR_OP_GRAD_SEED:
  case IR_OP_LOSS_TERM: return X_UNFUSED;
  }
  return X_UNFUSED;
}

static bool is_group0_reshape(const IrOp *op) { return op && op->group == 0 && op->opcode == IR_OP_RESHAPE; }

/* A group-0 slice of one contiguous range of its operand: an alias at an
 * offset (*first: the range's first element). */
static bool is_range_slice(const IrOp *op, int64_t *first) {
  return op && op->group == 0 && op->opcode == IR_OP_SLICE && kp_slice_contiguous(op, first);
}

/* A group-0 unslice of one contiguous range of its result. */
static bool is_range_unslice(const IrOp *op, int64_t *first) {
  return op && op->group == 0 && op->opcode == IR_OP_UNSLICE && kp_slice_contiguous(op, first);
}

/* A data-parallel gradient reduction (dp-reduce's last=true all-reduce
 * start or wait): it lives in the param's gradient buffer with its operand,
 * reduced in place after the window's last contribution. */
static bool is_last_coll(const IrOp *op) {
  if (!op || op->group != 0 || (op->opcode != IR_OP_ALL_REDUCE_START && op->opcode != IR_OP_ALL_REDUCE_WAIT)) return false;
  if (op->opcode == IR_OP_ALL_REDUCE_WAIT && op->args[0]->def) op = op->args[0]->def; /* its start's attributes */
  const IrAttr *a = ir_attr_get(op, "last");
  return a && a->i != 0;
}

/* Any other collective's wait: its result is the start's result buffer,
 * which the collective fills between the two. */
static bool is_coll_wait(const IrOp *op) {
  return op && op->group == 0 && !is_last_coll(op) &&
         (op->opcode == IR_OP_ALL_REDUCE_WAIT || op->opcode == IR_OP_ALL_GATHER_WAIT ||
          op->opcode == IR_OP_REDUCE_SCATTER_WAIT);
}

/* The next value down a gradient's chain from its `grad` to its producer,
 * all in the gradient buffer: through group-0 reshapes, range unslices and
 * last=true reductions; NULL at the producer. */
static IrValue *chain_next(const IrValue *v) {
  int64_t first;
  if (is_group0_reshape(v->def) || is_range_unslice(v->def, &first) || is_last_coll(v->def)) return v->def->args[0];
  return NULL;
}

/* Reshapes and range slices share their operand's bytes. */
static bool is_view(const IrOp *op) {
  int64_t first;
  return is_group0_reshape(op) || is_range_slice(op, &first);
}

/* The same once GEMM views are known: a reshape of a view is a view, and
 * a reshape receiving a GEMM's writes holds them (codegen/kernel.c). */
static bool is_alias(const KpViews *vs, const IrOp *op) {
  int64_t first;
  if (is_range_slice(op, &first) || is_coll_wait(op)) return true;
  return is_group0_reshape(op) && vs->place[op->args[0]->id] == KP_MEM && vs->place[op->result->id] == KP_MEM;
}

static bool in_group0(const IrOp *op, void *ctx) {
  (void)ctx;
  return op->group == 0;
}

/* Whether the op that defines a value can accumulate into a gradient
 * buffer instead of storing: a kernel, a GEMM, or an unfused compute op. */
static bool accumulates(const IrOp *def) {
  if (!def) return false;
  if (def->group > 0) return true;
  if (is_view(def)) return false;
  switch (exec_kind(def->opcode)) {
  case X_GEMM:
  case X_UNFUSED: return true;
  case X_ALIAS:
  case X_CONST:
  case X_WSUM:
  case X_LOSS:
  case X_GRAD:
  case X_COPY:
  case X_PERMUTE: return false;
  }
  return false;
}



/* ------------------------------------------------------------------ */
/* Copy-accumulate kernels for gradients that cannot accumulate in place */
/* ------------------------------------------------------------------ */

/* Index of the op after which a copy of v may run: after v's definition
 * (after its whole kernel), or at the start for an argument. */
static int after_def(const IrFunc *f, const IrValue *v) {
  if (!v->def) return 0;
  int i = 0;
  while (i < f->nops && f->ops[i] != v->def) i++;
  GRADC_ASSERT(i < f->nops);
  int g = v->def->group;
  i++;
  while (g > 0 && i < f->nops && f->ops[i]->group == g) i++;
  return i;
}

/* Whether grad operand v can be the gradient buffer itself: it reaches its
 * producer through group-0 reshapes only, and nothing else reads any of
 * them.  uses[]: operand counts by value id. */
static bool grad_in_place(const IrValue *v, const int *uses) {
  for (const IrValue *next; (next = chain_next(v)); v = next)
    if (uses[v->id] != 1) return false;
  return uses[v->id] == 1 && accumulates(v->def);
}

/* A slice of a stacked param's gradient reduced on its own (dp-reduce):
 * `grad (unslice (all_reduce.wait ...))`, with last=true.  fuse, which
 * keeps only unslices of a GEMM's or kernel's result in group 0, makes
 * this unslice a kernel of its own; it is no work (the reduction is in the
 * slice's range of the gradient buffer), so it goes back to group 0. */
static void ungroup_slice_reductions(IrFunc *f) {
  int64_t first;
  for (int i = 0; i < f->nops; i++) {
    IrOp *op = f->ops[i];
    int g = op->group;
    if (g == 0 || op->opcode != IR_OP_UNSLICE || !kp_slice_contiguous(op, &first) || !op->args[0]->def ||
        op->args[0]->def->opcode != IR_OP_ALL_REDUCE_WAIT || (i > 0 && f->ops[i - 1]->group == g) ||
        (i + 1 < f->nops && f->ops[i + 1]->group == g))
      continue;
    op->group = 0;
    if (!is_last_coll(op->args[0]->def)) op->group = g; /* not a dp gradient reduction */
  }
}

/* Group-0 range unslices (fuse leaves those that feed a gradient there)
 * are no work when their operand accumulates straight into the range of
 * the gradient buffer: those on the way from a `grad` that is in place
 * to its producer.  Any other becomes a kernel of its own. */
static void place_unslices(IrFunc *f, Arena *scratch) {
  int maxg = 0;
  for (int i = 0; i < f->nops; i++)
    if (f->ops[i]->group > maxg) maxg = f->ops[i]->group;
  int *uses = ARENA_ARRAY(scratch, int, f->nvalues + 1);
  ir_count_uses(f, uses);
  for (int i = 0; i < f->nops; i++) f->ops[i]->mark = 0;
  int64_t first;
  for (int i = 0; i < f->nops; i++) {
    IrOp *gop = f->ops[i];
    if (gop->opcode != IR_OP_GRAD) continue;
    /* Under a last=true reduction a copy-accumulate kernel feeds the
     * start when the producer cannot accumulate (insert_grad_copies), so
     * the chain is in place either way. */
    bool reduced = false;
    for (IrValue *v = gop->args[0]; chain_next(v); v = chain_next(v)) reduced |= is_last_coll(v->def);
    if (!reduced && !grad_in_place(gop->args[0], uses)) continue;
    for (IrValue *v = gop->args[0]; chain_next(v); v = chain_next(v)) v->def->mark = 1;
  }
  for (int i = 0; i < f->nops; i++) {
    IrOp *op = f->ops[i];
    if (is_range_unslice(op, &first) && !op->mark) op->group = ++maxg;
    op->mark = 0;
  }
}

/* grad(add(p, q)) with p and q of the sum's type, each read only by the
 * sum and each able to accumulate, becomes grad(p) and grad(q): both
 * producers add into the buffer and the sum (a full-size temporary, say a
 * GEMM's result waiting for a kernel) disappears.  Repeated while the
 * contributions are sums themselves. */
static void split_grad_sums(IrFunc *f, Arena *scratch) {
  for (int i = 0; i < f->nops; i++) f->ops[i]->mark = 0;
  int *uses = ARENA_ARRAY(scratch, int, f->nvalues + 1);
  ir_count_uses(f, uses);
  bool removed = false;
  for (int i = 0; i < f->nops; i++) {
    IrOp *gop = f->ops[i];
    if (gop->opcode != IR_OP_GRAD) continue;
    IrValue *v = gop->args[0];
    IrOp *sum = v->def;
    if (!sum || sum->opcode != IR_OP_ADD || uses[v->id] != 1) continue;
    IrValue *p = sum->args[0], *q = sum->args[1];
    if (p == q || !ir_type_eq(&p->type, &v->type) || !ir_type_eq(&q->type, &v->type)) continue;
    if (!grad_in_place(p, uses) || !grad_in_place(q, uses)) continue;
    char err[256];
    IrOp *gq = ir_build(f, IR_OP_GRAD, &q, 1, gop->attrs, gop->nattrs, NULL, gop->loc, err, sizeof err);
    GRADC_ASSERT(gq && f->ops[f->nops - 1] == gq);
    memmove(&f->ops[i + 2], &f->ops[i + 1], sizeof(IrOp *) * (size_t)(f->nops - 2 - i));
    f->ops[i + 1] = gq;
    gop->args[0] = p;
    /* The parts keep the gradient's name where they have none (%dW, %dW.1). */
    if (!p->name) p->name = v->name;
    if (!q->name) q->name = v->name;
    uses[v->id] = 0;
    sum->mark = 1;
    removed = true;
    i--; /* p may be a sum too */
  }
  if (removed) ir_func_remove_marked(f);
}

static void insert_grad_copies(IrFunc *f, Arena *scratch) {
  int ngrads = 0, maxg = 0;
  for (int i = 0; i < f->nops; i++) {
    ngrads += f->ops[i]->opcode == IR_OP_GRAD;
    if (f->ops[i]->group > maxg) maxg = f->ops[i]->group;
  }
  IrOp **grads = ARENA_ARRAY(scratch, IrOp *, ngrads + 1);
  ngrads = 0;
  for (int i = 0; i < f->nops; i++)
    if (f->ops[i]->opcode == IR_OP_GRAD) grads[ngrads++] = f->ops[i];
  int *uses = ARENA_ARRAY(scratch, int, f->nvalues + ngrads + 1); /* room for the copies */
  ir_count_uses(f, uses);
  for (int i = 0; i < ngrads; i++) {
    IrOp *gop = grads[i];
    if (grad_in_place(gop->args[0], uses)) continue;
    /* Under a last=true reduction the copy feeds the reduction's start,
     * which then is in the buffer with it. */
    IrOp *at_op = gop;
    for (IrValue *u = gop->args[0]; chain_next(u); u = chain_next(u))
      if (is_last_coll(u->def) && u->def->opcode == IR_OP_ALL_REDUCE_START) at_op = u->def;
    IrValue *v = at_op->args[0];
    IrValue *c = ir_unary(f, IR_OP_DETACH, v, gop->loc); /* appended at the end */
    c->name = arena_printf(&f->arena, "d%s.acc", ir_attr_get_str(gop, "name", ""));
    IrOp *cop = f->ops[f->nops - 1];
    GRADC_ASSERT(cop->result == c);
    cop->group = ++maxg;
    int at = after_def(f, v);
    memmove(&f->ops[at + 1], &f->ops[at], sizeof(IrOp *) * (size_t)(f->nops - 1 - at));
    f->ops[at] = cop;
    at_op->args[0] = c; /* v keeps its use count: the copy reads it instead */
    uses[c->id] = 1;
  }
}

/* ------------------------------------------------------------------ */
/* The plan                                                            */
/* ------------------------------------------------------------------ */

typedef struct Buf {
  IrValue *v;
  int64_t size;
  int t0, t1; /* first and last step, inclusive */
  int64_t off;
} Buf;

static int cmp_buf(const void *pa, const void *pb) {
  const Buf *a = *(Buf *const *)pa, *b = *(Buf *const *)pb;
  if (a->size != b->size) return a->size > b->size ? -1 : 1;
  if (a->t0 != b->t0) return a->t0 < b->t0 ? -1 : 1;
  return a->v->id - b->v->id;
}

static int cmp_off(const void *pa, const void *pb) {
  const Buf *a = *(Buf *const *)pa, *b = *(Buf *const *)pb;
  return a->off < b->off ? -1 : a->off > b->off;
}

static int home_of(const int *home, int b) {
  while (home[b] != b) b = home[b];
  return b;
}

typedef struct Outside {
  const IrFunc *f;
  const int *ustart, *use;
} Outside;

static bool used_outside(const IrValue *v, void *ctx) {
  const Outside *o = ctx;
  for (int k = o->ustart[v->id]; k < o->ustart[v->id + 1]; k++)
    if (o->f->ops[o->use[k]]->group != v->def->group) return true;
  return false;
}

/* Whether slots a and b of a row kernel lie over its space alike: element
 * e of one is element e of the other. */
static bool laid_alike(const KpRowLayout *l, const KpSlot *a, const KpSlot *b) {
  if (!a || !b || !a->mapped || !b->mapped || a->eoff != b->eoff) return false;
  int64_t sa[IR_MAX_RANK], sb[IR_MAX_RANK];
  kp_slot_strides(l, a, sa);
  kp_slot_strides(l, b, sb);
  return memcmp(sa, sb, sizeof(int64_t) * (size_t)l->space.rank) == 0;
}

/* Whether the kernel ops[i..j) reads buffer b (a home) through any value
 * but x: a range slice of it, say, whose rows would be overwritten. */
static bool read_otherwise(const IrFunc *f, int i, int j, const IrValue *x, int b, const int *root, const int *bufof,
                           const int *home) {
  for (int q = i; q < j; q++)
    for (int a = 0; a < f->ops[q]->nargs; a++) {
      const IrValue *v = f->ops[q]->args[a];
      if (v == x || (v->def && v->def->group == f->ops[i]->group)) continue;
      int bv = bufof[root[v->id]];
      if (bv >= 0 && home_of(home, bv) == b) return true;
    }
  return false;
}

/* In-place outputs.  A row kernel whose operand x dies in it (its
 * buffer's last step is the kernel's) writes an output y of x's shape and
 * dtype, laid over the kernel's space as x is, and reads x's bytes
 * through no other value, over x: y's buffer joins
 * x's (home[y] = x's home, which then lives until y's last step).  Row r
 * of y depends on row r of x only, and the code generator reads x's row
 * before y's is stored (docs/BACKEND.md), so nothing is lost; what is
 * saved is a fresh buffer's write misses (a read of every line before it
 * is overwritten) and its footprint.  Outputs chain: z may overwrite y in
 * a later kernel, all three in one buffer. */
static void write_in_place(const IrFunc *f, const int *step, const int *root, const int *bufof, const int *ustart,
                           const int *use, Buf *bufs, int *home, Arena *scratch) {
  Outside out = {f, ustart, use};
  for (int i = 0, j; i < f->nops; i = j) {
    int g = f->ops[i]->group;
    for (j = i + 1; g > 0 && j < f->nops && f->ops[j]->group == g; j++) {}
    if (g <= 0 || (j - i == 1 && !kp_op_rowwise(f->ops[i]))) continue;
    KpRowLayout l;
    if (!kp_row_layout(f->ops + i, j - i, used_outside, &out, scratch, &l, NULL, 0)) continue;
    for (int q = i; q < j; q++) {
      const IrValue *y = f->ops[q]->result;
      int by = bufof[y->id];
      if (by < 0 || root[y->id] != y->id || home[by] != by) continue;
      for (int r = i; r < j && home[by] == by; r++)
        for (int a = 0; a < f->ops[r]->nargs; a++) {
          const IrValue *x = f->ops[r]->args[a];
          if (x->def && x->def->group == g) continue;
          int bx = bufof[root[x->id]];
          if (bx < 0) continue;
          bx = home_of(home, bx);
          if (bufs[bx].t1 != step[i] || bufs[bx].size != bufs[by].size || x->type.dtype != y->type.dtype ||
              !ir_shape_eq(&x->type.shape, &y->type.shape) || !laid_alike(&l, kp_row_slot(&l, x), kp_row_slot(&l, y)) ||
              read_otherwise(f, i, j, x, bx, root, bufof, home))
            continue;
          home[by] = bx;
          if (bufs[by].t1 > bufs[bx].t1) bufs[bx].t1 = bufs[by].t1;
          break;
        }
    }
  }
}

/* Place the buffers (greedy by size, first fit); returns the peak bytes. */
static int64_t place(Buf **bufs, int n, Arena *scratch) {
  qsort(bufs, (size_t)n, sizeof *bufs, cmp_buf);
  Buf **live = ARENA_ARRAY(scratch, Buf *, n + 1);
  int64_t peak = 0;
  for (int i = 0; i < n; i++) {
    Buf *b = bufs[i];
    int nl = 0;
    for (int j = 0; j < i; j++)
      if (bufs[j]->t0 <= b->t1 && b->t0 <= bufs[j]->t1) live[nl++] = bufs[j];
    qsort(live, (size_t)nl, sizeof *live, cmp_off);
    int64_t off = 0;
    for (int j = 0; j < nl; j++) {
      if (off + b->size <= live[j]->off) break;
      int64_t end = align_up(live[j]->off + live[j]->size);
      if (end > off) off = end;
    }
    b->off = off;
    if (off + b->size > peak) peak = off + b->size;
  }
  return align_up(peak);
}

PassResult pass_memplan(IrFunc *f, const PassOptions *o, Arena *scratch) {
  (void)o;
  for (int i = 0; i < f->nvalues; i++) {
    f->values[i]->storage = IR_STORE_NONE;
    f->values[i]->offset = 0;
  }
  ungroup_slice_reductions(f);
  split_grad_sums(f, scratch);
  place_unslices(f, scratch);
  insert_grad_copies(f, scratch);

  int nv = f->nvalues, n = f->nops;
  /* Steps: a kernel's ops share the step of its first op. */
  int maxg = 0;
  for (int i = 0; i < n; i++)
    if (f->ops[i]->group > maxg) maxg = f->ops[i]->group;
  int *first = ARENA_ARRAY(scratch, int, maxg + 1);
  for (int g = 0; g <= maxg; g++) first[g] = -1;
  int *step = ARENA_ARRAY(scratch, int, n + 1);
  for (int i = 0; i < n; i++) {
    int g = f->ops[i]->group;
    f->ops[i]->mark = i;
    if (g > 0 && first[g] < 0) first[g] = i;
    step[i] = g > 0 ? first[g] : i;
  }

  /* Uses of each value as a list of op indices (CSR). */
  int *nuse = ARENA_ARRAY(scratch, int, nv + 1), *ustart = ARENA_ARRAY(scratch, int, nv + 2);
  for (int i = 0; i < n; i++)
    for (int j = 0; j < f->ops[i]->nargs; j++) nuse[f->ops[i]->args[j]->id]++;
  for (int v = 0; v < nv; v++) ustart[v + 1] = ustart[v] + nuse[v];
  int *use = ARENA_ARRAY(scratch, int, ustart[nv] + 1), *fill = ARENA_ARRAY(scratch, int, nv + 1);
  for (int i = 0; i < n; i++)
    for (int j = 0; j < f->ops[i]->nargs; j++) {
      int id = f->ops[i]->args[j]->id;
      use[ustart[id] + fill[id]++] = i;
    }

  /* Group-0 transposes read only by GEMMs become GEMM flags. */
  bool *flag = ARENA_ARRAY(scratch, bool, nv + 1);
  for (int i = 0; i < n; i++) {
    IrOp *op = f->ops[i];
    if (op->group != 0 || !is_transpose(op)) continue;
    int id = op->result->id;
    bool only_gemm = nuse[id] > 0;
    for (int k = ustart[id]; k < ustart[id + 1]; k++) {
      const IrOp *u = f->ops[use[k]];
      only_gemm &= u->group == 0 && u->opcode == IR_OP_MATMUL;
    }
    flag[id] = only_gemm;
  }

  /* Views GEMMs read and write in place (strided, no storage).  In a
   * fused function a group-0 movement op that is neither a view nor an
   * alias nor a flag (fuse's views meet memplan's gradient rules) becomes
   * a kernel of its own. */
  KpViews vs;
  kp_views_find(f, in_group0, NULL, &vs);
  for (bool again = maxg > 0; again;) {
    again = false;
    for (int i = 0; i < n; i++) {
      IrOp *op = f->ops[i];
      int64_t first;
      bool mover = op->opcode == IR_OP_CONCAT || (op->opcode == IR_OP_SLICE && !is_range_slice(op, &first)) ||
                   (op->opcode == IR_OP_PERMUTE && !flag[op->result->id]);
      if (op->group != 0 || !mover || kp_view_free_op(&vs, op)) continue;
      op->group = ++maxg;
      step[i] = i;
      again = true;
    }
    if (again) {
      kp_views_free(&vs);
      kp_views_find(f, in_group0, NULL, &vs);
    }
  }

  /* Which values are read from or written to memory (reverse sweep: every
   * use of a result is seen before its definition). */
  bool *need = ARENA_ARRAY(scratch, bool, nv + 1);
  for (int i = n - 1; i >= 0; i--) {
    IrOp *op = f->ops[i];
    if (op->group > 0) {
      for (int j = 0; j < op->nargs; j++) {
        const IrValue *a = op->args[j];
        const IrOp *d = a->def;
        if (d && d->group == op->group) continue;               /* inside the kernel */
        if (d && d->group == 0 && d->opcode == IR_OP_CONST) continue; /* an immediate */
        need[a->id] = true;
      }
      continue;
    }
    int64_t first;
    if (kp_view_free_op(&vs, op)) continue; /* a view: its GEMMs need its home */
    if (is_range_slice(op, &first)) { /* an alias */
      if (need[op->result->id]) need[op->args[0]->id] = true;
      continue;
    }
    if (is_range_unslice(op, &first)) { /* its operand accumulates into the gradient buffer */
      need[op->args[0]->id] = true;
      continue;
    }
    ExecKind k = exec_kind(op->opcode);
    if (k == X_PERMUTE && !flag[op->result->id]) k = X_UNFUSED;
    switch (k) {
    case X_GEMM:
      need[kp_view_home(&vs, op->result)->id] = true;
      for (int j = 0; j < op->nargs; j++) {
        const IrValue *a = op->args[j];
        need[kp_view_home(&vs, flag[a->id] ? a->def->args[0] : a)->id] = true;
      }
      break;
    case X_ALIAS:
      if (need[op->result->id]) need[op->args[0]->id] = true;
      break;
    case X_CONST: break;
    case X_WSUM: need[op->result->id] = true; break;
    case X_PERMUTE: break; /* a GEMM flag: the GEMM reads its operand */
    case X_LOSS:
    case X_GRAD:
    case X_COPY:
    case X_UNFUSED:
      if (op->result && nuse[op->result->id] > 0) need[op->result->id] = true;
      for (int j = 0; j < op->nargs; j++) need[op->args[j]->id] = true;
      break;
    }
  }

  /* Persistent region: arguments, gradient buffers, consts, window sums. */
  int64_t top = 0;
  for (int i = 0; i < f->nargs; i++) {
    IrValue *a = f->args[i];
    a->storage = IR_STORE_ARENA;
    a->offset = top;
    top = align_up(top + value_bytes(a));
  }
  /* Gradient buffers in argument order, but those of a data-parallel
   * bucket first, each bucket's contiguous (the executor reduces a bucket
   * in one collective), by dtype and in the order of their reductions. */
  int *porder = ARENA_ARRAY(scratch, int, f->nargs + 1);
  int64_t *pkey = ARENA_ARRAY(scratch, int64_t, f->nargs + 1);
  for (int i = 0; i < f->nargs; i++) {
    porder[i] = i;
    pkey[i] = INT64_MAX;
    const IrValue *p = f->args[i];
    if (p->role != IR_ARG_PARAM || !p->name) continue;
    for (int k = 0; k < n; k++) {
      IrOp *op = f->ops[k];
      if (op->opcode != IR_OP_GRAD || strcmp(ir_attr_get_str(op, "name", ""), p->name) != 0) continue;
      for (const IrValue *v = op->args[0]; chain_next(v); v = chain_next(v))
        if (is_last_coll(v->def) && v->def->opcode == IR_OP_ALL_REDUCE_START) {
          /* A stacked param's slices may be in several buckets: its first. */
          int64_t key = (ir_attr_get_int(v->def, "bucket", 0) * 2 + (p->type.dtype == IR_DT_F64)) * ((int64_t)n + 1) +
                        v->def->mark;
          if (key < pkey[i]) pkey[i] = key;
        }
    }
  }
  for (int i = 1; i < f->nargs; i++) /* insertion sort: stable, arguments are few */
    for (int j = i; j > 0 && pkey[porder[j - 1]] > pkey[porder[j]]; j--) {
      int t = porder[j];
      porder[j] = porder[j - 1];
      porder[j - 1] = t;
    }
  for (int pi = 0; pi < f->nargs; pi++) {
    IrValue *p = f->args[porder[pi]];
    if (p->role != IR_ARG_PARAM) continue;
    bool has_grad = false;
    for (int k = 0; k < n; k++) {
      IrOp *op = f->ops[k];
      if (op->opcode != IR_OP_GRAD || !p->name || strcmp(ir_attr_get_str(op, "name", ""), p->name) != 0) continue;
      IrValue *v = op->args[0];
      if (ir_numel(&v->type.shape) != ir_numel(&p->type.shape)) {
        if (o && o->diag)
          diag_at(o->diag, DIAG_ERROR, o->src, op->loc.line, op->loc.col,
                  "grad output for '%s' does not have the param's size", p->name);
        return PASS_ERROR;
      }
      /* Through reshapes (aliases) and range unslices (the operand fills
       * its range of the buffer) to the producer, which accumulates. */
      int64_t off = top, first;
      int64_t gsize = p->type.dtype == IR_DT_F64 ? 8 : 4;
      for (;;) {
        if (is_group0_reshape(v->def)) {
          v = v->def->args[0];
          continue;
        }
        if (is_last_coll(v->def)) {
          v->storage = IR_STORE_GRAD;
          v->offset = off;
          v = v->def->args[0];
          continue;
        }
        if (!is_range_unslice(v->def, &first)) break;
        v->storage = IR_STORE_GRAD;
        v->offset = off;
        off += first * gsize;
        v = v->def->args[0];
      }
      v->storage = IR_STORE_GRAD;
      v->offset = off;
      has_grad = true;
    }
    if (has_grad) top = align_up(top + ir_numel(&p->type.shape) * (p->type.dtype == IR_DT_F64 ? 8 : 4));
  }
  for (int i = 0; i < n; i++) {
    IrOp *op = f->ops[i];
    if (op->group != 0 || !op->result || !need[op->result->id]) continue;
    if (op->opcode != IR_OP_CONST && op->opcode != IR_OP_WINDOW_SUM) continue;
    op->result->storage = IR_STORE_ARENA;
    op->result->offset = top;
    top = align_up(top + value_bytes(op->result));
  }
  int64_t persist = top;

  /* Activations: every other needed value that is not an alias. */
  int *root = ARENA_ARRAY(scratch, int, nv + 1); /* value whose bytes a value uses */
  for (int v = 0; v < nv; v++) {
    const IrValue *x = f->values[v];
    if (flag[v]) x = x->def->args[0];
    for (;;) {
      x = kp_view_home(&vs, x);
      if (!x->def || !is_alias(&vs, x->def)) break;
      x = x->def->args[0];
    }
    root[v] = x->id;
  }
  Buf *bufs = ARENA_ARRAY(scratch, Buf, nv + 1);
  int *bufof = ARENA_ARRAY(scratch, int, nv + 1);
  int nb = 0;
  for (int v = 0; v < nv; v++) {
    bufof[v] = -1;
    IrValue *x = f->values[v];
    if (!need[v] || root[v] != v || x->storage != IR_STORE_NONE || !x->def) continue;
    int t = step[x->def->mark];
    bufof[v] = nb;
    bufs[nb++] = (Buf){x, value_bytes(x), t, t, 0};
  }
  /* A buffer that GEMMs write through views lives from the first of them. */
  for (int i = 0; i < n; i++) {
    const IrOp *op = f->ops[i];
    if (op->opcode != IR_OP_MATMUL || vs.place[op->result->id] != KP_VIEW_OUT) continue;
    int b = bufof[root[op->result->id]];
    if (b >= 0 && step[i] < bufs[b].t0) bufs[b].t0 = step[i];
  }
  /* Lifetimes: the last read of the value, of its aliases, or through a
   * transpose flag.  Window sums do not read their operand. */
  for (int v = 0; v < nv; v++) {
    int b = bufof[root[v]];
    if (b < 0) continue;
    for (int k = ustart[v]; k < ustart[v + 1]; k++) {
      const IrOp *u = f->ops[use[k]];
      if (u->opcode == IR_OP_WINDOW_SUM && u->group == 0) continue;
      if (step[use[k]] > bufs[b].t1) bufs[b].t1 = step[use[k]];
    }
  }
  /* A collective reads its start's operand until its wait. */
  for (int i = 0; i < n; i++) {
    const IrOp *op = f->ops[i];
    if (op->group != 0 || is_last_coll(op) || !op->result ||
        (op->opcode != IR_OP_ALL_REDUCE_START && op->opcode != IR_OP_ALL_GATHER_START &&
         op->opcode != IR_OP_REDUCE_SCATTER_START))
      continue;
    int b = bufof[root[op->args[0]->id]], id = op->result->id;
    for (int k = ustart[id]; b >= 0 && k < ustart[id + 1]; k++)
      if (step[use[k]] > bufs[b].t1) bufs[b].t1 = step[use[k]];
  }
  int *home = ARENA_ARRAY(scratch, int, nb + 1);
  for (int i = 0; i < nb; i++) home[i] = i;
  if (!(o && o->no_inplace)) write_in_place(f, step, root, bufof, ustart, use, bufs, home, scratch);
  Buf **order = ARENA_ARRAY(scratch, Buf *, nb + 1);
  int nh = 0;
  for (int i = 0; i < nb; i++)
    if (home[i] == i) order[nh++] = &bufs[i];
  int64_t peak = place(order, nh, scratch);
  for (int i = 0; i < nb; i++) {
    bufs[i].v->storage = IR_STORE_ARENA;
    bufs[i].v->offset = persist + bufs[home_of(home, i)].off;
  }

  /* Aliases, in op order (an operand's storage is set before its views):
   * a group-0 reshape shares its operand's bytes, a range slice the bytes
   * of its range. */
  for (int i = 0; i < n; i++) {
    IrOp *op = f->ops[i];
    int64_t first = 0;
    if (!op->result || !need[op->result->id] || !is_alias(&vs, op)) continue;
    (void)is_range_slice(op, &first);
    const IrValue *x = op->args[0];
    GRADC_ASSERT(x->storage != IR_STORE_NONE);
    op->result->storage = IR_STORE_ALIAS;
    op->result->offset = x->offset + first * (int64_t)ir_dtype_size(x->type.dtype);
  }
  kp_views_free(&vs);
  f->persist_size = persist;
  f->arena_size = persist + peak;
  return PASS_CHANGED;
}
