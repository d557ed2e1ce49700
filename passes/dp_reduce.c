/* dp_reduce.c - data-parallel gradient reduction in buckets
 * (docs/DISTRIBUTED.md, the distributed IR contract).
 *
 * Requires: a differentiated function (`grad %g {name="W"}` outputs), run
 * after dce.  Does nothing when PassOptions.dp <= 1 or when the gradients
 * already go through dp reductions, nor with PassOptions.zero1 (ZeRO-1:
 * the runtime reduce-scatters the window's gradients, runtime/api_zero.c).
 *
 * For every gradient output it inserts, just before the output,
 *     %s = all_reduce.start %g {group="dp", ranks=N, bucket=B, last=true}
 *     %w = all_reduce.wait %s {group="dp", ranks=N, bucket=B, last=true}
 *     grad %w {name="W"}
 * last=true: the runtime communicates only in the window's last micro-batch
 * and reduces the gradient accumulated over the window.
 *
 * Stacked params.  A param stacked over L layers (w : [L, ...], read as
 * w[l]) gets its gradient from autodiff as a sum of unslices, one per
 * layer, of disjoint contiguous ranges; the whole sum is complete only in
 * layer 0's backward, at the very end.  When a gradient is such a sum (a
 * tree of adds read once, whose leaves are unslices read once of
 * contiguous ranges that tile the tensor), each slice is reduced on its
 * own as soon as its contribution is written:
 *     %s1 = all_reduce.start %c1 {..., bucket=B1, last=true}
 *     %w1 = all_reduce.wait %s1 {...}
 *     %u1 = unslice %w1 {the leaf's attributes}
 *     grad %u1 {name="W"}
 * and likewise for every slice (one `grad` per slice, naming the same
 * param: the runtimes add them up, and they are disjoint).  memplan puts
 * %c1, %s1, %w1 in the slice's range of the param's gradient buffer.
 *
 * Buckets follow the backward: the items (whole gradients and slices) are
 * taken in the order their values are defined, i.e. the order in which the
 * backward completes them (ties: later declaration first, then later
 * slice first).  A bucket takes items while their bytes stay within
 * PassOptions.bucket_bytes (default 1 MiB); a single item larger than that
 * is a bucket of its own.  Buckets are numbered 0, 1, ... in the order
 * they are reduced.  The slices of one bucket may lie in several gradient
 * buffers: the executor then issues one all-reduce per contiguous run.
 *
 * Guarantees: nothing is computed differently; each start/wait pair's
 * operand is the gradient (or a slice's contribution), and the wait's
 * result only feeds the output (through the slice's unslice).  `schedule`
 * later moves the starts to the end of each bucket's last contribution and
 * the waits to the end of the step. */
#include <stdlib.h>
#include <string.h>

#include "kernel.h"
#include "passes.h"

/* 1 MiB: the reduction left exposed is the last bucket's (what the end of
 * the backward completes: layer 0's slices, the embeddings).  On
 * bench/dp_overlap.py's tinygpt (C=256, L=4, 13 MB of gradients, a 4 Gb/s
 * link) the cost model hides 74% with 4 MiB buckets, 92% with 1 or 2 MiB
 * and 96% with 0.5 MiB (twice the buckets, each one more latency); the
 * real runs hide 93-95% (of the link's modelled time) with 1 MiB. */
#define DEFAULT_BUCKET_BYTES ((int64_t)1 << 20)
#define MAX_SLICES 256 /* leaves of one gradient's sum */

/* One reduction: a whole gradient, or one slice of a stacked one. */
typedef struct Item {
  IrOp *out;     /* the grad output */
  IrValue *v;    /* what is reduced: the gradient, or the slice's contribution */
  IrOp *un;      /* the slice's unslice (NULL: whole) */
  int ready;     /* op index of v's definition (-1: an argument) */
  int argno;     /* the param's declaration index */
  int64_t first; /* the slice's first element */
  int64_t bytes;
  int bucket;
} Item;

static bool is_dp_wait(const IrValue *v) {
  return v->def && v->def->opcode == IR_OP_ALL_REDUCE_WAIT &&
         strcmp(ir_attr_get_str(v->def, "group", ""), "dp") == 0;
}

/* Earlier completion first; ties: later declaration, then later slice. */
static int by_reduction_order(const void *pa, const void *pb) {
  const Item *a = pa, *b = pb;
  if (a->ready != b->ready) return a->ready < b->ready ? -1 : 1;
  if (a->argno != b->argno) return (a->argno < b->argno) - (a->argno > b->argno);
  return (a->first < b->first) - (a->first > b->first);
}

typedef struct Leaves {
  IrOp *un[MAX_SLICES];
  IrOp *adds[MAX_SLICES];
  int n, nadds;
} Leaves;

/* The leaves of the tree of adds at v (adds of v's type, each read once but
 * the root); false when there are too many. */
static bool add_leaves(IrValue *v, bool root, const int *uses, Leaves *l) {
  IrOp *d = v->def;
  if (d && d->opcode == IR_OP_ADD && (root || uses[v->id] == 1) && d->args[0] != d->args[1] &&
      ir_type_eq(&d->args[0]->type, &v->type) && ir_type_eq(&d->args[1]->type, &v->type)) {
    if (l->nadds == MAX_SLICES) return false;
    l->adds[l->nadds++] = d;
    return add_leaves(d->args[0], false, uses, l) && add_leaves(d->args[1], false, uses, l);
  }
  if (l->n == MAX_SLICES) return false;
  l->un[l->n++] = d;
  return true;
}

static int by_first(const void *pa, const void *pb) {
  const int64_t *a = pa, *b = pb;
  return (a[0] > b[0]) - (a[0] < b[0]);
}

/* Whether gradient v (read once, by its grad output) is a sum of unslices
 * of disjoint contiguous ranges tiling it; fills l. */
static bool sliced_grad(IrValue *v, const int *uses, Leaves *l, Arena *scratch) {
  l->n = l->nadds = 0;
  if (uses[v->id] != 1 || !add_leaves(v, true, uses, l)) return false;
  int64_t *rng = ARENA_ARRAY(scratch, int64_t, 2 * (size_t)l->n);
  for (int k = 0; k < l->n; k++) {
    IrOp *u = l->un[k];
    int64_t first;
    if (!u || u->opcode != IR_OP_UNSLICE || uses[u->result->id] != 1 || !ir_type_eq(&u->result->type, &v->type) ||
        u->args[0]->type.dtype != v->type.dtype || !kp_slice_contiguous(u, &first))
      return false;
    rng[2 * k] = first;
    rng[2 * k + 1] = first + ir_numel(&u->args[0]->type.shape);
  }
  qsort(rng, (size_t)l->n, 2 * sizeof(int64_t), by_first);
  int64_t at = 0;
  for (int k = 0; k < l->n; k++) {
    if (rng[2 * k] != at) return false;
    at = rng[2 * k + 1];
  }
  return at == ir_numel(&v->type.shape);
}

PassResult pass_dp_reduce(IrFunc *f, const PassOptions *o, Arena *scratch) {
  if (o->dp <= 1 || o->zero1) return PASS_UNCHANGED;
  int64_t cap = o->bucket_bytes > 0 ? o->bucket_bytes : DEFAULT_BUCKET_BYTES;

  for (int i = 0; i < f->nops; i++) f->ops[i]->mark = i;
  int *uses = ARENA_ARRAY(scratch, int, f->nvalues + 1);
  ir_count_uses(f, uses);
  int n = 0, cap_items = f->nops + 1;
  Item *it = ARENA_ARRAY(scratch, Item, cap_items);
  Leaves *l = ARENA_ARRAY(scratch, Leaves, 1);
  bool *dead = ARENA_ARRAY(scratch, bool, f->nops + 1); /* sums and unslices replaced by slice reductions */
  for (int i = 0; i < f->nops; i++) {
    IrOp *op = f->ops[i];
    if (op->opcode != IR_OP_GRAD || is_dp_wait(op->args[0])) continue;
    const IrValue *p = ir_func_find_arg(f, ir_attr_get_str(op, "name", ""));
    int argno = f->nargs; /* not a param (cannot happen after autodiff): last */
    for (int k = 0; p && k < f->nargs; k++)
      if (f->args[k] == p) argno = k;
    IrValue *g = op->args[0];
    int64_t esize = ir_dtype_size(g->type.dtype);
    if (sliced_grad(g, uses, l, scratch)) {
      if (n + l->n > cap_items) { /* more slices than ops: cannot happen, but stay in bounds */
        Item *more = ARENA_ARRAY(scratch, Item, 2 * (size_t)(n + l->n));
        memcpy(more, it, sizeof(Item) * (size_t)n);
        it = more;
        cap_items = 2 * (n + l->n);
      }
      for (int k = 0; k < l->n; k++) {
        IrOp *u = l->un[k];
        IrValue *c = u->args[0];
        int64_t first = 0;
        (void)kp_slice_contiguous(u, &first);
        it[n++] = (Item){.out = op, .v = c, .un = u, .ready = c->def ? c->def->mark : -1, .argno = argno,
                         .first = first, .bytes = ir_numel(&c->type.shape) * esize};
        dead[u->mark] = true;
      }
      for (int k = 0; k < l->nadds; k++) dead[l->adds[k]->mark] = true;
      dead[op->mark] = true; /* the grad output: one per slice replaces it */
      continue;
    }
    it[n++] = (Item){.out = op, .v = g, .ready = g->def ? g->def->mark : -1, .argno = argno,
                     .bytes = ir_numel(&g->type.shape) * esize};
  }
  if (n == 0) {
    for (int i = 0; i < f->nops; i++) f->ops[i]->mark = 0;
    return PASS_UNCHANGED;
  }
  qsort(it, (size_t)n, sizeof *it, by_reduction_order);

  int bucket = 0;
  int64_t filled = 0;
  for (int k = 0; k < n; k++) {
    if (filled > 0 && filled + it[k].bytes > cap) {
      bucket++;
      filled = 0;
    }
    it[k].bucket = bucket;
    filled += it[k].bytes;
  }

  /* Emit each item's ops at the end (start, wait; a slice: its unslice and
   * its grad output), then move them before their grad output, items of
   * one output in reduction order. */
  int base = f->nops;
  int *at = ARENA_ARRAY(scratch, int, n + 1); /* first emitted op of each item */
  for (int k = 0; k < n; k++) {
    Item *x = &it[k];
    IrAttr attrs[4] = {ir_attr_str("group", "dp"), ir_attr_int("ranks", o->dp), ir_attr_int("bucket", x->bucket),
                       ir_attr_bool("last", true)};
    at[k] = f->nops;
    IrValue *s = ir_emit(f, IR_OP_ALL_REDUCE_START, &x->v, 1, attrs, 4, NULL, x->out->loc);
    IrValue *w = ir_emit(f, IR_OP_ALL_REDUCE_WAIT, &s, 1, attrs, 4, NULL, x->out->loc);
    if (!x->un) {
      x->out->args[0] = w;
      continue;
    }
    IrValue *u = ir_emit(f, IR_OP_UNSLICE, &w, 1, x->un->attrs, x->un->nattrs, NULL, x->un->loc);
    u->name = x->un->result->name;
    ir_emit(f, IR_OP_GRAD, &u, 1, x->out->attrs, x->out->nattrs, NULL, x->out->loc);
  }
  /* by grad output (its old index): the items, in reduction order */
  int *next = ARENA_ARRAY(scratch, int, n + 1), *head = ARENA_ARRAY(scratch, int, base + 1);
  int *tail = ARENA_ARRAY(scratch, int, base + 1);
  for (int i = 0; i < base; i++) head[i] = tail[i] = -1;
  for (int k = 0; k < n; k++) {
    int i = it[k].out->mark;
    next[k] = -1;
    if (tail[i] < 0) head[i] = k;
    else next[tail[i]] = k;
    tail[i] = k;
  }
  IrOp **ops = ARENA_ARRAY(scratch, IrOp *, f->nops);
  int m = 0;
  for (int i = 0; i < base; i++) {
    IrOp *op = f->ops[i];
    for (int k = head[i]; k >= 0; k = next[k]) {
      int len = it[k].un ? 4 : 2;
      for (int j = 0; j < len; j++) ops[m++] = f->ops[at[k] + j];
    }
    if (!dead[i]) ops[m++] = op;
  }
  /* The replaced sums, unslices and grad outputs are dropped. */
  for (int i = 0; i < f->nops; i++) f->ops[i]->mark = 0;
  memcpy(f->ops, ops, sizeof(IrOp *) * (size_t)m);
  f->nops = m;
  return PASS_CHANGED;
}
