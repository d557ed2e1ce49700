/* memplan.c - the memory plan: one arena per step (docs/BACKEND.md).
 *
 * Requires: a function after `fuse` (kernel ops carry their group >= 1 and
 * each group is contiguous in the op list) and after the passes that
 * prepare the gradients and the movement ops for the plan
 * (ungroup-dp-slices, split-grad-sums, grad-unslices, grad-copies,
 * movement-kernels; passmgr.c runs them first when a list names memplan
 * without them); an unfused function is planned as if every op outside the
 * executor's own set were a kernel of one op.  memplan adds, removes and
 * regroups no op: it only decides storage.
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
 * offset); a GEMM result and a window.sum result are always stored.  A
 * window.sum operand is not read from memory: the executor evaluates
 * window sums with the reference interpreter's count phase before the
 * first micro-batch.  A `permute` of the last two axes that is left in
 * group 0 and read only by GEMMs becomes a transpose flag of those GEMMs
 * (plan_gemm_flags): it gets no storage and its operand is read instead.
 * More generally GEMM views (kp_views_find in passes/kernel.c) get no
 * storage: the value a view reads is needed instead, and the value a GEMM
 * writes through a view is stored and lives from that GEMM's step on.
 * Everything else lives in its kernel's row scratch (IR_STORE_NONE).
 *
 * Gradients.  Each param named by a `grad` output has one persistent buffer
 * (f32, f64 for f64 params, whatever the value's dtype).  The value feeding
 * `grad` (through group-0 reshapes, which alias it) is stored there as
 * IR_STORE_GRAD, so the kernel or GEMM producing it accumulates (+=, GEMM
 * beta = 1) and K micro-batches add up in place with no separate add
 * (`grad-copies` has made that right for every `grad`; `split-grad-sums`
 * has made two `grad`s of one param out of a sum of two contributions,
 * both stored in the one buffer).  A group-0 unslice of one contiguous
 * range on the way from a `grad` to its producer (w[l]'s gradient, which
 * fuse leaves in group 0) is no work: its value is the buffer and its
 * operand is stored in the range, so the producer accumulates into its
 * part of the buffer (`grad-unslices` has made the others kernels).
 *
 * Collectives (docs/DISTRIBUTED.md).  A start hands its operand to the
 * comm layer and the collective writes the start's result buffer until
 * the wait: the operand lives until the wait's step, and the wait's result
 * is an alias of the start's (IR_STORE_ALIAS, same offset), so neither is
 * reused in between.  A data-parallel gradient reduction (dp-reduce's
 * last=true all-reduce start and wait) is part of the gradient's chain
 * like a reshape: its operand, start and wait all live in the param's
 * gradient buffer (IR_STORE_GRAD, one offset), where the executor reduces
 * the window's accumulated gradient in place.  A stacked param's gradient
 * reduced one layer slice at a time (dp-reduce: `grad (unslice (wait
 * (start %c)))` per slice) has each slice's contribution, start and wait
 * in the slice's range of the buffer, and its unslice is no work
 * (`ungroup-dp-slices` has put it back in group 0).  The gradient buffers
 * of those params come first in the persistent region, by the first
 * bucket of each (then dtype, then the order of their starts), so a
 * bucket of whole gradients is one contiguous range, and the slices of
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

/* Any collective's wait but a gradient reduction's: its result is the
 * start's result buffer, which the collective fills between the two. */
static bool is_coll_wait(const IrOp *op) {
  return op && op->group == 0 && !plan_last_coll(op) &&
         (op->opcode == IR_OP_ALL_REDUCE_WAIT || op->opcode == IR_OP_ALL_GATHER_WAIT ||
          op->opcode == IR_OP_REDUCE_SCATTER_WAIT);
}

/* Whether op's result shares its operand's bytes once GEMM views are
 * known: a range slice, a collective's wait, a reshape of a stored value
 * (a reshape of a view is a view, and a reshape receiving a GEMM's writes
 * holds them: passes/kernel.c). */
static bool is_alias(const KpViews *vs, const IrOp *op) {
  int64_t first;
  if (plan_range_slice(op, &first) || is_coll_wait(op)) return true;
  return plan_group0_reshape(op) && vs->place[op->args[0]->id] == KP_MEM && vs->place[op->result->id] == KP_MEM;
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
    if (g <= 0 || (j - i == 1 && !kp_op_row_alone(f->ops[i]))) continue;
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

/* ------------------------------------------------------------------ */
/* The pass                                                            */
/* ------------------------------------------------------------------ */

/* What the parts of the plan share. */
typedef struct Plan {
  IrFunc *f;
  int n, nv;            /* ops, values */
  int *step;            /* by op index; ops' marks hold their indices */
  int *nuse, *ustart;   /* by value id: reads, and where they start in use[] */
  int *use;             /* op indices of the reads (CSR) */
  const bool *flag;     /* by value id: a transpose that is a GEMM flag */
  KpViews vs;           /* GEMM views */
  bool *need;           /* by value id: read from or written to memory */
} Plan;

/* Steps (a kernel's ops share the step of its first op) and the uses of
 * each value as lists of op indices. */
static void steps_and_uses(Plan *p, Arena *scratch) {
  IrFunc *f = p->f;
  int n = p->n, nv = p->nv, maxg = 0;
  for (int i = 0; i < n; i++)
    if (f->ops[i]->group > maxg) maxg = f->ops[i]->group;
  int *first = ARENA_ARRAY(scratch, int, maxg + 1);
  for (int g = 0; g <= maxg; g++) first[g] = -1;
  p->step = ARENA_ARRAY(scratch, int, n + 1);
  for (int i = 0; i < n; i++) {
    int g = f->ops[i]->group;
    f->ops[i]->mark = i;
    if (g > 0 && first[g] < 0) first[g] = i;
    p->step[i] = g > 0 ? first[g] : i;
  }
  p->nuse = ARENA_ARRAY(scratch, int, nv + 1);
  p->ustart = ARENA_ARRAY(scratch, int, nv + 2);
  for (int i = 0; i < n; i++)
    for (int j = 0; j < f->ops[i]->nargs; j++) p->nuse[f->ops[i]->args[j]->id]++;
  for (int v = 0; v < nv; v++) p->ustart[v + 1] = p->ustart[v] + p->nuse[v];
  p->use = ARENA_ARRAY(scratch, int, p->ustart[nv] + 1);
  int *fill = ARENA_ARRAY(scratch, int, nv + 1);
  for (int i = 0; i < n; i++)
    for (int j = 0; j < f->ops[i]->nargs; j++) {
      int id = f->ops[i]->args[j]->id;
      p->use[p->ustart[id] + fill[id]++] = i;
    }
}

/* Which values are read from or written to memory (a reverse sweep: every
 * use of a result is seen before its definition). */
static void find_needed(Plan *p, Arena *scratch) {
  IrFunc *f = p->f;
  bool *need = p->need = ARENA_ARRAY(scratch, bool, p->nv + 1);
  const bool *flag = p->flag;
  for (int i = p->n - 1; i >= 0; i--) {
    IrOp *op = f->ops[i];
    if (op->group > 0) {
      for (int j = 0; j < op->nargs; j++) {
        const IrValue *a = op->args[j];
        const IrOp *d = a->def;
        if (d && d->group == op->group) continue;                     /* inside the kernel */
        if (d && d->group == 0 && d->opcode == IR_OP_CONST) continue; /* an immediate */
        need[a->id] = true;
      }
      continue;
    }
    int64_t first;
    if (kp_view_free_op(&p->vs, op)) continue; /* a view: its GEMMs need its home */
    if (plan_range_slice(op, &first)) {        /* an alias */
      if (need[op->result->id]) need[op->args[0]->id] = true;
      continue;
    }
    if (plan_range_unslice(op, &first)) { /* its operand accumulates into the gradient buffer */
      need[op->args[0]->id] = true;
      continue;
    }
    PlanExec k = plan_exec_kind(op->opcode);
    if (k == PLAN_EXEC_PERMUTE && !flag[op->result->id]) k = PLAN_EXEC_UNFUSED;
    switch (k) {
    case PLAN_EXEC_GEMM:
      need[kp_view_home(&p->vs, op->result)->id] = true;
      for (int j = 0; j < op->nargs; j++) {
        const IrValue *a = op->args[j];
        need[kp_view_home(&p->vs, flag[a->id] ? a->def->args[0] : a)->id] = true;
      }
      break;
    case PLAN_EXEC_ALIAS:
      if (need[op->result->id]) need[op->args[0]->id] = true;
      break;
    case PLAN_EXEC_CONST: break;
    case PLAN_EXEC_WSUM:
      need[op->result->id] = true;
      /* A window of one micro-batch copies its window sums from their
       * operands in the step (the CPU executor): they have bytes. */
      if (op->opcode == IR_OP_WINDOW_SUM) need[op->args[0]->id] = true;
      break;
    case PLAN_EXEC_PERMUTE: break; /* a GEMM flag: the GEMM reads its operand */
    case PLAN_EXEC_LOSS:
    case PLAN_EXEC_GRAD:
    case PLAN_EXEC_COPY:
    case PLAN_EXEC_UNFUSED:
      if (op->result && p->nuse[op->result->id] > 0) need[op->result->id] = true;
      for (int j = 0; j < op->nargs; j++) need[op->args[j]->id] = true;
      break;
    }
  }
}

/* The order of the gradient buffers: argument order, but those of a
 * data-parallel bucket first, each bucket's contiguous (the executor
 * reduces a bucket in one collective), by dtype and in the order of their
 * reductions.  Returns argument indices. */
static int *grad_order(const Plan *p, Arena *scratch) {
  const IrFunc *f = p->f;
  int *porder = ARENA_ARRAY(scratch, int, f->nargs + 1);
  int64_t *pkey = ARENA_ARRAY(scratch, int64_t, f->nargs + 1);
  for (int i = 0; i < f->nargs; i++) {
    porder[i] = i;
    pkey[i] = INT64_MAX;
    const IrValue *a = f->args[i];
    if (a->role != IR_ARG_PARAM || !a->name) continue;
    for (int k = 0; k < p->n; k++) {
      IrOp *op = f->ops[k];
      if (op->opcode != IR_OP_GRAD || strcmp(ir_attr_get_str(op, "name", ""), a->name) != 0) continue;
      for (const IrValue *v = op->args[0]; plan_grad_next(v); v = plan_grad_next(v))
        if (plan_last_coll(v->def) && v->def->opcode == IR_OP_ALL_REDUCE_START) {
          /* A stacked param's slices may be in several buckets: its first. */
          int64_t key = (ir_attr_get_int(v->def, "bucket", 0) * 2 + (a->type.dtype == IR_DT_F64)) * ((int64_t)p->n + 1) +
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
  return porder;
}

/* Store the gradient chain from `grad` operand v down to its producer in
 * the buffer at off: through reshapes (aliases), last=true reductions (in
 * the buffer) and range unslices (the operand fills its range). */
static void place_grad(IrValue *v, int64_t off, int64_t gsize) {
  int64_t first;
  for (;;) {
    if (plan_group0_reshape(v->def)) {
      v = v->def->args[0];
      continue;
    }
    if (plan_last_coll(v->def)) {
      v->storage = IR_STORE_GRAD;
      v->offset = off;
      v = v->def->args[0];
      continue;
    }
    if (!plan_range_unslice(v->def, &first)) break;
    v->storage = IR_STORE_GRAD;
    v->offset = off;
    off += first * gsize;
    v = v->def->args[0];
  }
  v->storage = IR_STORE_GRAD;
  v->offset = off;
}

/* The persistent region: arguments, gradient buffers, then the consts and
 * window sums that need memory.  Its size in *persist; false (reported
 * through o->diag) when a `grad` does not have its param's size. */
static bool place_persistent(Plan *p, const PassOptions *o, Arena *scratch, int64_t *persist) {
  IrFunc *f = p->f;
  int64_t top = 0;
  for (int i = 0; i < f->nargs; i++) {
    IrValue *a = f->args[i];
    a->storage = IR_STORE_ARENA;
    a->offset = top;
    top = align_up(top + value_bytes(a));
  }
  const int *porder = grad_order(p, scratch);
  for (int pi = 0; pi < f->nargs; pi++) {
    IrValue *a = f->args[porder[pi]];
    if (a->role != IR_ARG_PARAM) continue;
    int64_t gsize = a->type.dtype == IR_DT_F64 ? 8 : 4;
    bool has_grad = false;
    for (int k = 0; k < p->n; k++) {
      IrOp *op = f->ops[k];
      if (op->opcode != IR_OP_GRAD || !a->name || strcmp(ir_attr_get_str(op, "name", ""), a->name) != 0) continue;
      if (ir_numel(&op->args[0]->type.shape) != ir_numel(&a->type.shape)) {
        if (o && o->diag)
          diag_at(o->diag, DIAG_ERROR, o->src, op->loc.line, op->loc.col,
                  "grad output for '%s' does not have the param's size", a->name);
        return false;
      }
      place_grad(op->args[0], top, gsize);
      has_grad = true;
    }
    if (has_grad) top = align_up(top + ir_numel(&a->type.shape) * gsize);
  }
  for (int i = 0; i < p->n; i++) {
    IrOp *op = f->ops[i];
    if (op->group != 0 || !op->result || !p->need[op->result->id]) continue;
    if (op->opcode != IR_OP_CONST && op->opcode != IR_OP_WINDOW_SUM && op->opcode != IR_OP_RNG_STATE &&
        op->opcode != IR_OP_LOSS_SCALE)
      continue;
    op->result->storage = IR_STORE_ARENA;
    op->result->offset = top;
    top = align_up(top + value_bytes(op->result));
  }
  *persist = top;
  return true;
}

/* The buffers of the activations (every other needed value that is not
 * an alias) with their lifetimes.  root[v]: the value whose bytes v uses;
 * bufof[root]: its buffer, -1 for none. */
static int activation_buffers(const Plan *p, const int *root, Buf *bufs, int *bufof) {
  const IrFunc *f = p->f;
  const int *step = p->step, *ustart = p->ustart, *use = p->use;
  int nb = 0;
  for (int v = 0; v < p->nv; v++) {
    bufof[v] = -1;
    IrValue *x = f->values[v];
    if (!p->need[v] || root[v] != v || x->storage != IR_STORE_NONE || !x->def) continue;
    int t = step[x->def->mark];
    bufof[v] = nb;
    bufs[nb++] = (Buf){x, value_bytes(x), t, t, 0};
  }
  /* A buffer that GEMMs write through views lives from the first of them. */
  for (int i = 0; i < p->n; i++) {
    const IrOp *op = f->ops[i];
    if (op->opcode != IR_OP_MATMUL || p->vs.place[op->result->id] != KP_VIEW_OUT) continue;
    int b = bufof[root[op->result->id]];
    if (b >= 0 && step[i] < bufs[b].t0) bufs[b].t0 = step[i];
  }
  /* Lifetimes: the last read of the value, of its aliases, or through a
   * transpose flag (a window sum's included: see find_needed). */
  for (int v = 0; v < p->nv; v++) {
    int b = bufof[root[v]];
    if (b < 0) continue;
    for (int k = ustart[v]; k < ustart[v + 1]; k++) {
      const IrOp *u = f->ops[use[k]];
      if (step[use[k]] > bufs[b].t1) bufs[b].t1 = step[use[k]];
      /* The executors read an output's or update's value after the
       * micro-batch: it lives to the last step. */
      if ((u->opcode == IR_OP_OUTPUT || u->opcode == IR_OP_UPDATE) && p->n > 0) bufs[b].t1 = step[p->n - 1];
    }
  }
  /* A collective reads its start's operand until its wait. */
  for (int i = 0; i < p->n; i++) {
    const IrOp *op = f->ops[i];
    if (op->group != 0 || plan_last_coll(op) || !op->result ||
        (op->opcode != IR_OP_ALL_REDUCE_START && op->opcode != IR_OP_ALL_GATHER_START &&
         op->opcode != IR_OP_REDUCE_SCATTER_START))
      continue;
    int b = bufof[root[op->args[0]->id]], id = op->result->id;
    for (int k = ustart[id]; b >= 0 && k < ustart[id + 1]; k++)
      if (step[use[k]] > bufs[b].t1) bufs[b].t1 = step[use[k]];
  }
  return nb;
}

/* The activations from offset persist on; returns their peak bytes. */
static int64_t place_activations(Plan *p, const PassOptions *o, int64_t persist, Arena *scratch) {
  IrFunc *f = p->f;
  int nv = p->nv;
  int *root = ARENA_ARRAY(scratch, int, nv + 1);
  for (int v = 0; v < nv; v++) {
    const IrValue *x = f->values[v];
    if (p->flag[v]) x = x->def->args[0];
    for (;;) {
      x = kp_view_home(&p->vs, x);
      if (!x->def || !is_alias(&p->vs, x->def)) break;
      x = x->def->args[0];
    }
    root[v] = x->id;
  }
  Buf *bufs = ARENA_ARRAY(scratch, Buf, nv + 1);
  int *bufof = ARENA_ARRAY(scratch, int, nv + 1);
  int nb = activation_buffers(p, root, bufs, bufof);
  int *home = ARENA_ARRAY(scratch, int, nb + 1);
  for (int i = 0; i < nb; i++) home[i] = i;
  if (!(o && o->no_inplace)) write_in_place(f, p->step, root, bufof, p->ustart, p->use, bufs, home, scratch);
  Buf **order = ARENA_ARRAY(scratch, Buf *, nb + 1);
  int nh = 0;
  for (int i = 0; i < nb; i++)
    if (home[i] == i) order[nh++] = &bufs[i];
  int64_t peak = place(order, nh, scratch);
  for (int i = 0; i < nb; i++) {
    bufs[i].v->storage = IR_STORE_ARENA;
    bufs[i].v->offset = persist + bufs[home_of(home, i)].off;
  }
  return peak;
}

/* Aliases, in op order (an operand's storage is set before its views): a
 * group-0 reshape shares its operand's bytes, a range slice the bytes of
 * its range, a collective's wait its start's. */
static void place_aliases(Plan *p) {
  for (int i = 0; i < p->n; i++) {
    IrOp *op = p->f->ops[i];
    int64_t first = 0;
    if (!op->result || !p->need[op->result->id] || !is_alias(&p->vs, op)) continue;
    (void)plan_range_slice(op, &first);
    const IrValue *x = op->args[0];
    GRADC_ASSERT(x->storage != IR_STORE_NONE);
    op->result->storage = IR_STORE_ALIAS;
    op->result->offset = x->offset + first * (int64_t)ir_dtype_size(x->type.dtype);
  }
}

PassResult pass_memplan(IrFunc *f, const PassOptions *o, Arena *scratch) {
  for (int i = 0; i < f->nvalues; i++) {
    f->values[i]->storage = IR_STORE_NONE;
    f->values[i]->offset = 0;
  }
  Plan p = {.f = f, .n = f->nops, .nv = f->nvalues};
  steps_and_uses(&p, scratch);
  p.flag = plan_gemm_flags(f, scratch);
  kp_views_find(f, plan_in_group0, NULL, &p.vs);
  find_needed(&p, scratch);
  int64_t persist;
  if (!place_persistent(&p, o, scratch, &persist)) {
    kp_views_free(&p.vs);
    return PASS_ERROR;
  }
  int64_t peak = place_activations(&p, o, persist, scratch);
  place_aliases(&p);
  kp_views_free(&p.vs);
  f->persist_size = persist;
  f->arena_size = persist + peak;
  return PASS_CHANGED;
}
