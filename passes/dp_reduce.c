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
 * Buckets follow the backward: params are taken in reverse order of their
 * first use in the forward (following views: the first op that reads the
 * param or a slice/reshape/permute/broadcast of it), because the backward
 * completes the gradients of the params used last first.  Ties (two params
 * read by one op) go in reverse declaration order.  A bucket takes params
 * while its gradients' bytes stay within PassOptions.bucket_bytes (default
 * 4 MiB); a single gradient larger than that is a bucket of its own.
 * Buckets are numbered 0, 1, ... in the order they are reduced.
 *
 * Guarantees: nothing is computed differently; each start/wait pair's
 * operand is the gradient, and the wait's result only feeds the output.
 * `schedule` later moves the starts to the end of each bucket's last
 * contribution and the waits to the end of the step. */
#include <stdlib.h>
#include <string.h>

#include "passes.h"

#define DEFAULT_BUCKET_BYTES ((int64_t)4 << 20)

typedef struct GradOut {
  IrOp *out;     /* the grad output */
  int first_use; /* op index of the param's first forward use (views followed) */
  int argno;     /* the param's declaration index */
  int64_t bytes; /* the gradient's size */
  int bucket;
} GradOut;

/* A view: an op whose result reads only its operand's elements. */
static bool is_view(IrOpcode opc) {
  return opc == IR_OP_RESHAPE || opc == IR_OP_PERMUTE || opc == IR_OP_BROADCAST || opc == IR_OP_SLICE;
}

static bool is_dp_wait(const IrValue *v) {
  return v->def && v->def->opcode == IR_OP_ALL_REDUCE_WAIT &&
         strcmp(ir_attr_get_str(v->def, "group", ""), "dp") == 0;
}

/* Later first use first; ties: later declaration first. */
static int by_reduction_order(const void *pa, const void *pb) {
  const GradOut *a = pa, *b = pb;
  if (a->first_use != b->first_use) return a->first_use > b->first_use ? -1 : 1;
  return (a->argno < b->argno) - (a->argno > b->argno);
}

PassResult pass_dp_reduce(IrFunc *f, const PassOptions *o, Arena *scratch) {
  if (o->dp <= 1 || o->zero1) return PASS_UNCHANGED;
  int64_t cap = o->bucket_bytes > 0 ? o->bucket_bytes : DEFAULT_BUCKET_BYTES;

  /* root[value id]: the param a value is a view of (arg index + 1), 0: none.
   * first[arg index]: the first op that reads the param other than as a view. */
  int *root = ARENA_ARRAY(scratch, int, f->nvalues + 1);
  int *first = ARENA_ARRAY(scratch, int, f->nargs + 1);
  for (int i = 0; i < f->nargs; i++) {
    first[i] = f->nops;
    if (f->args[i]->role == IR_ARG_PARAM) root[f->args[i]->id] = i + 1;
  }
  for (int i = 0; i < f->nops; i++) {
    IrOp *op = f->ops[i];
    if (is_view(op->opcode) && root[op->args[0]->id]) {
      root[op->result->id] = root[op->args[0]->id];
      continue;
    }
    for (int a = 0; a < op->nargs; a++) {
      int r = root[op->args[a]->id];
      if (r && first[r - 1] > i) first[r - 1] = i;
    }
  }

  int n = 0;
  GradOut *g = ARENA_ARRAY(scratch, GradOut, f->nops + 1);
  for (int i = 0; i < f->nops; i++) {
    IrOp *op = f->ops[i];
    if (op->opcode != IR_OP_GRAD || is_dp_wait(op->args[0])) continue;
    const IrValue *p = ir_func_find_arg(f, ir_attr_get_str(op, "name", ""));
    int argno = f->nargs; /* not a param (cannot happen after autodiff): last */
    for (int k = 0; p && k < f->nargs; k++)
      if (f->args[k] == p) argno = k;
    const IrType *t = &op->args[0]->type;
    g[n++] = (GradOut){.out = op,
                       .first_use = argno < f->nargs ? first[argno] : f->nops,
                       .argno = argno,
                       .bytes = ir_numel(&t->shape) * (int64_t)ir_dtype_size(t->dtype)};
  }
  if (n == 0) return PASS_UNCHANGED;
  qsort(g, (size_t)n, sizeof *g, by_reduction_order);

  int bucket = 0;
  int64_t filled = 0;
  for (int k = 0; k < n; k++) {
    if (filled > 0 && filled + g[k].bytes > cap) {
      bucket++;
      filled = 0;
    }
    g[k].bucket = bucket;
    filled += g[k].bytes;
  }

  /* Emit the pairs at the end, then move each before its output. */
  for (int i = 0; i < f->nops; i++) f->ops[i]->mark = 0;
  IrOp **pair = ARENA_ARRAY(scratch, IrOp *, 2 * (size_t)n);
  int base = f->nops;
  for (int k = 0; k < n; k++) {
    IrOp *out = g[k].out;
    IrAttr attrs[4] = {ir_attr_str("group", "dp"), ir_attr_int("ranks", o->dp), ir_attr_int("bucket", g[k].bucket),
                       ir_attr_bool("last", true)};
    IrValue *gv = out->args[0];
    IrValue *s = ir_emit(f, IR_OP_ALL_REDUCE_START, &gv, 1, attrs, 4, NULL, out->loc);
    IrValue *w = ir_emit(f, IR_OP_ALL_REDUCE_WAIT, &s, 1, attrs, 4, NULL, out->loc);
    out->args[0] = w;
    out->mark = k + 1;
  }
  for (int k = 0; k < 2 * n; k++) pair[k] = f->ops[base + k];
  IrOp **ops = ARENA_ARRAY(scratch, IrOp *, f->nops);
  int m = 0;
  for (int i = 0; i < base; i++) {
    IrOp *op = f->ops[i];
    if (op->opcode == IR_OP_GRAD && op->mark > 0) {
      ops[m++] = pair[2 * (op->mark - 1)];
      ops[m++] = pair[2 * (op->mark - 1) + 1];
    }
    ops[m++] = op;
  }
  GRADC_ASSERT(m == f->nops);
  memcpy(f->ops, ops, sizeof(IrOp *) * (size_t)m);
  for (int i = 0; i < f->nops; i++) f->ops[i]->mark = 0;
  return PASS_CHANGED;
}
