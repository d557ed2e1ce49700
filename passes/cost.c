/* cost.c - the cost model the `schedule` pass orders ops by, and a
 * simulation of one step under it (passes.h: CostModel).
 *
 * Compute is a roofline per unit (a fused kernel, or one op outside
 * kernels): kernel_s + max(FLOPs / flops_per_s, bytes / mem_bytes_per_s),
 * where the bytes are the unit's operands from outside it and the results
 * it writes for others.  Views cost nothing (reshapes, and the slices and
 * unslices memplan aliases or turns into no work: view_op); the
 * rank-dependent copies (tp.scatter, rank.slice, rank.concat) cost a
 * memory copy of their result: kernel_s + 2 bytes / mem_bytes_per_s.  A collective sends the bytes of a ring algorithm
 * (all-reduce 2(n-1)/n of the buffer, all-gather and reduce-scatter
 * (n-1)/n of the whole tensor) at link_bytes_per_s after link_latency_s;
 * the starts of one dp bucket are one message (one latency).  Collectives
 * of a group queue on that group's link as on the runtime's simulated link
 * (runtime/comm.h, comm_set_link): a transfer begins at max(its start, the
 * end of the previous transfer on the link) and ends its time later; the
 * groups' links are independent.  The compute stream stalls at a wait
 * whose collective has not finished, and that stall is the exposed
 * communication. */
#include <string.h>

#include "kernel.h"
#include "passes.h"

void cost_model_default(CostModel *m) {
  m->flops_per_s = 50e9;
  m->mem_bytes_per_s = 10e9;
  m->kernel_s = 2e-6;
  m->link_bytes_per_s = 1.25e9;
  m->link_latency_s = 20e-6;
}

static double numel(const IrValue *v) { return (double)ir_numel(&v->type.shape); }

static double nbytes(const IrValue *v) { return numel(v) * (double)ir_dtype_size(v->type.dtype); }

/* Elementwise ops that cost more than an add: a transcendental or a
 * polynomial of one. */
static bool expensive(IrOpcode opc) { return ir_op_is(opc, IR_OPF_COSTLY); }

double cost_op_flops(const IrOp *op) {
  switch (ir_op_info[op->opcode].kind) {
  case IR_KIND_ELEMENTWISE: return numel(op->result) * (expensive(op->opcode) ? 8.0 : 1.0);
  case IR_KIND_REDUCE: return numel(op->args[0]) * (op->opcode == IR_OP_LOGSUMEXP ? 9.0 : 1.0);
  case IR_KIND_GEMM: {
    const IrShape *a = &op->args[0]->type.shape;
    double k = (double)a->dim[a->rank - 1];
    return 2.0 * numel(op->result) * k;
  }
  case IR_KIND_NN: {
    if (op->opcode == IR_OP_EMBEDDING || op->opcode == IR_OP_ONE_HOT) return numel(op->result);
    if (op->opcode == IR_OP_EMBEDDING_GRAD) return numel(op->args[1]);
    if (op->opcode == IR_OP_ARANGE || op->opcode == IR_OP_GATHER) return numel(op->result);
    if (op->opcode == IR_OP_GATHER_GRAD) return numel(op->args[1]) + numel(op->result);
    if (op->opcode == IR_OP_TOPK) return numel(op->args[0]) * (double)ir_attr_get_int(op, "k", 1);
    double n = numel(op->args[0]) > numel(op->result) ? numel(op->args[0]) : numel(op->result);
    return 5.0 * n; /* a few passes over the row, one exp per element */
  }
  case IR_KIND_CONST:
  case IR_KIND_MOVEMENT:
  case IR_KIND_WINDOW:
  case IR_KIND_COLLECTIVE:
  case IR_KIND_OUTPUT: return 0.0;
  }
  return 0.0;
}

void cost_escapes(const IrFunc *f, bool *escapes) {
  memset(escapes, 0, sizeof(bool) * (size_t)f->nvalues);
  for (int i = 0; i < f->nops; i++) {
    const IrOp *op = f->ops[i];
    for (int a = 0; a < op->nargs; a++) {
      const IrValue *v = op->args[a];
      if (!v->def || op->group == 0 || v->def->group != op->group) escapes[v->id] = true;
    }
  }
}

/* The rank-dependent copies: no communication, a strided copy of their
 * result's bytes at this rank's offsets (never fused). */
static bool rank_copy(IrOpcode opc) {
  return opc == IR_OP_TP_SCATTER || opc == IR_OP_RANK_SLICE || opc == IR_OP_RANK_CONCAT;
}

/* Whether a slice or unslice is a view memplan gives no work: a group-0
 * slice of one contiguous range (an alias of its operand: a stacked
 * param's w[l]); a group-0 unslice of one (its operand accumulates into
 * its range of the gradient buffer: w[l]'s gradient; memplan turns any
 * other group-0 unslice into a kernel, and schedule, before memplan, takes
 * them as views); and the unslice of a stacked gradient's slice
 * reduction (dp-reduce: `grad (unslice (all_reduce.wait ...))`, last=true),
 * which fuse makes a kernel of its own and memplan puts back in group 0. */
static bool view_op(const IrOp *op) {
  int64_t first;
  if (op->opcode == IR_OP_SLICE) return op->group == 0 && kp_slice_contiguous(op, &first);
  if (op->opcode != IR_OP_UNSLICE || !kp_slice_contiguous(op, &first)) return false;
  if (op->group == 0) return true;
  const IrOp *w = op->args[0]->def;
  if (!w || w->opcode != IR_OP_ALL_REDUCE_WAIT || !w->args[0]->def) return false;
  const IrAttr *last = ir_attr_get(w->args[0]->def, "last");
  return last && last->i != 0;
}

/* Whether a unit costs nothing: ops that only rename memory (a reshape, a
 * view slice or unslice, an output, a const the executor stores once,
 * window ops the step layer evaluates, collectives whose cost is on the
 * link).  The rank-dependent copies are not free (a memory copy). */
static bool free_op(const IrOp *op) {
  IrOpKind k = ir_op_info[op->opcode].kind;
  if (rank_copy(op->opcode)) return false;
  return op->opcode == IR_OP_RESHAPE || view_op(op) || k == IR_KIND_CONST || k == IR_KIND_OUTPUT ||
         k == IR_KIND_WINDOW || k == IR_KIND_COLLECTIVE;
}

double cost_compute_s(const CostModel *m, IrOp *const *ops, int n, const bool *escapes) {
  if (n == 1 && free_op(ops[0])) return 0.0;
  if (n == 1 && rank_copy(ops[0]->opcode)) /* reads its result's bytes, writes them */
    return m->kernel_s + 2.0 * nbytes(ops[0]->result) / m->mem_bytes_per_s;
  double flops = 0, bytes = 0;
  for (int i = 0; i < n; i++) {
    const IrOp *op = ops[i];
    flops += cost_op_flops(op);
    for (int a = 0; a < op->nargs; a++) {
      const IrValue *v = op->args[a];
      bool inside = false; /* defined in this unit: read from registers/cache */
      for (int j = 0; j < n && !inside; j++) inside = ops[j]->result == v;
      bool seen = false; /* read once however many ops read it */
      for (int j = 0; j < i && !seen; j++)
        for (int b = 0; b < ops[j]->nargs && !seen; b++) seen = ops[j]->args[b] == v;
      for (int b = 0; b < a && !seen; b++) seen = op->args[b] == v;
      if (!inside && !seen && !(v->def && v->def->opcode == IR_OP_CONST && ir_numel(&v->type.shape) <= 1))
        bytes += nbytes(v);
    }
    if (op->result && (!escapes || escapes[op->result->id])) bytes += nbytes(op->result);
  }
  double t = flops / m->flops_per_s, tb = bytes / m->mem_bytes_per_s;
  return m->kernel_s + (t > tb ? t : tb);
}

static bool is_start(IrOpcode opc) {
  return opc == IR_OP_ALL_REDUCE_START || opc == IR_OP_ALL_GATHER_START || opc == IR_OP_REDUCE_SCATTER_START;
}

static bool is_wait(IrOpcode opc) {
  return opc == IR_OP_ALL_REDUCE_WAIT || opc == IR_OP_ALL_GATHER_WAIT || opc == IR_OP_REDUCE_SCATTER_WAIT;
}

double cost_collective_bytes(const IrOp *start) {
  double n = (double)ir_attr_get_int(start, "ranks", 1);
  if (n <= 1) return 0.0;
  if (start->opcode == IR_OP_ALL_REDUCE_START) return 2.0 * (n - 1) / n * nbytes(start->args[0]);
  if (start->opcode == IR_OP_ALL_GATHER_START) return (n - 1) / n * nbytes(start->result);
  if (start->opcode == IR_OP_REDUCE_SCATTER_START) return (n - 1) / n * nbytes(start->args[0]);
  return 0.0; /* not a start */
}

double cost_collective_s(const CostModel *m, const IrOp *start, bool with_latency) {
  if (ir_attr_get_int(start, "ranks", 1) <= 1) return 0.0;
  return (with_latency ? m->link_latency_s : 0.0) + cost_collective_bytes(start) / m->link_bytes_per_s;
}

/* The link of a collective's group: one per distinct group name. */
#define MAX_LINKS 8
typedef struct Links {
  const char *name[MAX_LINKS];
  double free_at[MAX_LINKS];
  int n;
} Links;

static int link_of(Links *l, const IrOp *op) {
  const char *g = ir_attr_get_str(op, "group", "");
  for (int i = 0; i < l->n; i++)
    if (strcmp(l->name[i], g) == 0) return i;
  if (l->n == MAX_LINKS) return MAX_LINKS - 1; /* more groups than links: they share the last */
  l->name[l->n] = g;
  l->free_at[l->n] = 0;
  return l->n++;
}

/* Whether start b continues the coalesced dp bucket of the start a just before it. */
static bool same_bucket(const IrOp *a, const IrOp *b) {
  if (!a || !is_start(a->opcode) || !ir_attr_get(a, "bucket") || !ir_attr_get(b, "bucket")) return false;
  return ir_attr_get_int(a, "bucket", -1) == ir_attr_get_int(b, "bucket", -2) &&
         strcmp(ir_attr_get_str(a, "group", ""), ir_attr_get_str(b, "group", "")) == 0;
}

void cost_simulate(const IrFunc *f, const CostModel *m, bool overlap, CostSim *out) {
  memset(out, 0, sizeof *out);
  Arena a;
  arena_init(&a);
  bool *escapes = ARENA_ARRAY(&a, bool, f->nvalues + 1);
  double *done = ARENA_ARRAY(&a, double, f->nvalues + 1); /* by start result id */
  cost_escapes(f, escapes);
  Links links = {.n = 0};
  double t = 0;
  const IrOp *prev = NULL;
  for (int i = 0; i < f->nops;) {
    IrOp *op = f->ops[i];
    if (is_start(op->opcode)) {
      bool cont = same_bucket(prev, op);
      double d = cost_collective_s(m, op, !cont);
      int l = link_of(&links, op);
      double begin = t > links.free_at[l] ? t : links.free_at[l];
      links.free_at[l] = begin + d;
      done[op->result->id] = begin + d;
      out->comm_s += d;
      if (!cont && ir_attr_get_int(op, "ranks", 1) > 1) out->ncollectives++;
      if (!overlap) { /* blocks here: the time it queues and runs is exposed */
        out->exposed_s += begin + d - t;
        t = begin + d;
      }
      prev = op;
      i++;
      continue;
    }
    if (is_wait(op->opcode)) {
      double d = done[op->args[0]->id];
      if (d > t) {
        out->exposed_s += d - t;
        t = d;
      }
      prev = op;
      i++;
      continue;
    }
    int j = i + 1;
    if (op->group > 0)
      while (j < f->nops && f->ops[j]->group == op->group) j++;
    double c = cost_compute_s(m, &f->ops[i], j - i, escapes);
    out->compute_s += c;
    t += c;
    if (c > 0 || j - i > 1) prev = f->ops[j - 1];
    i = j;
  }
  out->step_s = t;
  arena_free(&a);
}

void cost_report(const IrFunc *f, const CostModel *m, FILE *out) {
  CostSim on, off;
  cost_simulate(f, m, true, &on);
  cost_simulate(f, m, false, &off);
  double hidden = on.comm_s > 0 ? 100.0 * (1.0 - on.exposed_s / on.comm_s) : 100.0;
  if (hidden < 0) hidden = 0; /* queueing behind another collective counts as exposed too */
  fprintf(out, "cost model: %.3g FLOP/s, %.3g B/s memory, %.3g us per kernel; link %.3g B/s, %.3g us latency\n",
          m->flops_per_s, m->mem_bytes_per_s, m->kernel_s * 1e6, m->link_bytes_per_s, m->link_latency_s * 1e6);
  fprintf(out, "estimated compute %.3f ms, communication %.3f ms in %d collectives\n", on.compute_s * 1e3,
          on.comm_s * 1e3, on.ncollectives);
  fprintf(out, "estimated step (as scheduled): %.3f ms, exposed communication %.3f ms (%.1f%% hidden)\n",
          on.step_s * 1e3, on.exposed_s * 1e3, hidden);
  fprintf(out, "estimated step (no overlap):   %.3f ms, exposed communication %.3f ms\n", off.step_s * 1e3,
          off.exposed_s * 1e3);
}
