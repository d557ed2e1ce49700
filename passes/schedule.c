/* schedule.c - orders ops so collectives overlap compute: starts as early
 * as their operands allow, waits as late as their users allow, chosen by
 * the cost model of cost.c (a list scheduler in the spirit of XLA's
 * latency-hiding scheduler; docs/DISTRIBUTED.md).
 *
 * Requires: a function with collective start/wait pairs (none: unchanged);
 * on the cpu target, fused kernels (contiguous ops of one group).
 * Guarantees: the same ops, only reordered (so the same values, bit for
 * bit); definitions before uses; every kernel still contiguous; the
 * outputs (loss, grad) in their previous relative order; the starts of one
 * dp bucket adjacent, buckets in the order of their ids; an order that is
 * a function of the IR alone (every rank compiles the same program and
 * issues its collectives in the same order).
 *
 * Units.  A kernel moves as a whole; every other op is a unit of its own,
 * except the starts of one dp bucket (group="dp", bucket=B), which are one
 * unit: they are issued together once the bucket's last gradient is
 * written, and the runtime coalesces them into one message.
 *
 * The list scheduler walks the dependency graph of units forwards, keeping
 * a clock for the compute stream and one for each group's link:
 *   1. a ready start goes at once (the earliest its operands allow);
 *      with --no-overlap its waits follow it directly;
 *   2. else a ready wait whose result compute needs ("critical") goes once
 *      the model says its collective is done (waiting costs nothing then,
 *      and what it unblocks may lead to the next start);
 *   3. else a ready compute unit: first those on the way to the nearest
 *      start of a tp collective (so that collective is in flight sooner:
 *      Megatron's input-gradient GEMM before the weight-gradient one),
 *      then the rest in their previous order;
 *   4. else a wait: critical ones first, then the others (dp gradient
 *      reductions, read only by outputs: at the end), each by the time
 *      its collective ends (dp: bucket order), then previous order;
 *   5. else the unslice of a layer slice's dp reduction (dp-reduce
 *      reduces a stacked param's gradient slice by slice), which reads
 *      the wait and feeds only its output: no work (memplan), so not
 *      compute to hide a reduction behind; previous order.
 * Hence a wait is placed only when nothing else can run, or when its
 * collective is already over; the compute placed between a start and its
 * wait is what hides the communication. */
#include <string.h>

#include "passes.h"

typedef enum { U_COMPUTE, U_START, U_WAIT } UnitKind;

typedef struct Unit {
  UnitKind kind;
  int *ops;      /* op indices, in the previous order */
  int nops, cap;
  int orig;      /* previous position (first op index; a bucket: its last start) */
  double cost;   /* compute seconds, or the collective's on its link */
  int link;      /* start: the group's link */
  bool dp;       /* start: a dp gradient reduction */
  bool critical; /* wait: a non-output op reads its result */
  bool tail;     /* compute: a slice's unslice after its dp wait (no work once memplan runs) */
  int start;     /* wait: its start's unit */
  double done;   /* start, once placed: when the collective ends */
  int key;       /* compute: orig of the nearest tp start it leads to (INT_MAX: none) */
  int npred;     /* unplaced predecessors */
  int *succ;
  int nsucc, capsucc;
} Unit;

#define NO_KEY 0x7fffffff

static bool is_start(IrOpcode opc) {
  return opc == IR_OP_ALL_REDUCE_START || opc == IR_OP_ALL_GATHER_START || opc == IR_OP_REDUCE_SCATTER_START;
}

static bool is_wait(IrOpcode opc) {
  return opc == IR_OP_ALL_REDUCE_WAIT || opc == IR_OP_ALL_GATHER_WAIT || opc == IR_OP_REDUCE_SCATTER_WAIT;
}

static bool is_dp_start(const IrOp *op) {
  return is_start(op->opcode) && strcmp(ir_attr_get_str(op, "group", ""), "dp") == 0 && ir_attr_get(op, "bucket");
}

static void push(Arena *a, int **v, int *n, int *cap, int x) {
  if (*n == *cap) {
    int nc = *cap ? 2 * *cap : 4;
    int *nv = ARENA_ARRAY(a, int, nc);
    if (*n) memcpy(nv, *v, sizeof(int) * (size_t)*n);
    *v = nv;
    *cap = nc;
  }
  (*v)[(*n)++] = x;
}

typedef struct Graph {
  Unit *u;
  int n;
  int *unit_of; /* by op index */
  int *stamp;   /* edge dedup: stamp[from] == to + 1 */
  Arena *a;
} Graph;

static void edge(Graph *g, int from, int to) {
  if (from == to || g->stamp[from] == to + 1) return;
  g->stamp[from] = to + 1;
  Unit *u = &g->u[from];
  push(g->a, &u->succ, &u->nsucc, &u->capsucc, to);
  g->u[to].npred++;
}

static int link_of(const char **names, int *n, const IrOp *op) {
  const char *gname = ir_attr_get_str(op, "group", "");
  for (int i = 0; i < *n; i++)
    if (strcmp(names[i], gname) == 0) return i;
  names[*n] = gname;
  return (*n)++;
}

/* Build the units and their dependency graph; false on a cycle (the
 * bucket units cannot form one for dp-reduce's IR; for other IR we leave
 * the order alone). */
static bool build(IrFunc *f, Graph *g, const CostModel *m, Arena *a) {
  g->a = a;
  g->u = ARENA_ARRAY(a, Unit, f->nops + 1);
  g->unit_of = ARENA_ARRAY(a, int, f->nops + 1);
  g->n = 0;
  int *bucket_unit = ARENA_ARRAY(a, int, f->nops + 1); /* bucket id -> unit + 1 */
  const char **links = ARENA_ARRAY(a, const char *, f->nops + 1);
  int nlinks = 0, maxbucket = -1;
  for (int i = 0; i < f->nops; i++) {
    IrOp *op = f->ops[i];
    op->mark = i;
    int u;
    if (is_dp_start(op)) {
      int64_t b = ir_attr_get_int(op, "bucket", 0);
      if (b < 0 || b >= f->nops) b = f->nops - 1; /* not dp-reduce's numbering: one shared unit */
      if (!bucket_unit[b]) {
        bucket_unit[b] = g->n + 1;
        g->u[g->n++] = (Unit){.kind = U_START, .dp = true};
      }
      if (b > maxbucket) maxbucket = (int)b;
      u = bucket_unit[b] - 1;
      g->u[u].cost += cost_collective_s(m, op, g->u[u].nops == 0);
      g->u[u].link = link_of(links, &nlinks, op);
    } else if (i > 0 && op->group > 0 && f->ops[i - 1]->group == op->group) {
      u = g->unit_of[i - 1];
    } else {
      u = g->n++;
      Unit *nu = &g->u[u];
      *nu = (Unit){.kind = U_COMPUTE};
      if (is_start(op->opcode)) {
        nu->kind = U_START;
        nu->cost = cost_collective_s(m, op, true);
        nu->link = link_of(links, &nlinks, op);
      } else if (is_wait(op->opcode)) {
        nu->kind = U_WAIT;
      }
    }
    g->unit_of[i] = u;
    push(a, &g->u[u].ops, &g->u[u].nops, &g->u[u].cap, i);
    /* A bucket's place is its last start's; any other unit's, its first op's. */
    if (g->u[u].dp || g->u[u].nops == 1) g->u[u].orig = i;
  }

  bool *escapes = ARENA_ARRAY(a, bool, f->nvalues + 1);
  cost_escapes(f, escapes);
  int *uses_by_compute = ARENA_ARRAY(a, int, f->nvalues + 1);
  for (int i = 0; i < f->nops; i++)
    if (ir_op_info[f->ops[i]->opcode].kind != IR_KIND_OUTPUT)
      for (int k = 0; k < f->ops[i]->nargs; k++) uses_by_compute[f->ops[i]->args[k]->id]++;
  for (int u = 0; u < g->n; u++) {
    Unit *un = &g->u[u];
    if (un->kind == U_COMPUTE) un->cost = cost_compute_s(m, &f->ops[un->ops[0]], un->nops, escapes);
    if (un->kind == U_WAIT) {
      const IrOp *w = f->ops[un->ops[0]];
      un->start = g->unit_of[w->args[0]->def->mark];
      un->critical = uses_by_compute[w->result->id] > 0 && !g->u[un->start].dp;
    }
  }
  /* A dp gradient reduction's result goes only to outputs, through the
   * unslice of its slice when it reduces one layer of a stacked param
   * (dp-reduce): that unslice is not compute the reduction could hide
   * behind, so it waits until the waits are placed. */
  for (int u = 0; u < g->n; u++) {
    Unit *un = &g->u[u];
    const IrOp *op = f->ops[un->ops[0]];
    const IrValue *x = un->nops == 1 && op->opcode == IR_OP_UNSLICE ? op->args[0] : NULL;
    un->tail = un->kind == U_COMPUTE && x && x->def && is_wait(x->def->opcode) &&
               g->u[g->u[g->unit_of[x->def->mark]].start].dp;
  }

  /* Edges: operands, the outputs' order, the buckets' order. */
  g->stamp = ARENA_ARRAY(a, int, g->n + 1);
  int last_out = -1;
  for (int i = 0; i < f->nops; i++) {
    IrOp *op = f->ops[i];
    int u = g->unit_of[i];
    for (int k = 0; k < op->nargs; k++)
      if (op->args[k]->def) edge(g, g->unit_of[op->args[k]->def->mark], u);
    if (ir_op_info[op->opcode].kind == IR_KIND_OUTPUT) {
      if (last_out >= 0) edge(g, last_out, u);
      last_out = u;
    }
  }
  int prev = -1;
  for (int b = 0; b <= maxbucket; b++) {
    if (!bucket_unit[b]) continue;
    if (prev >= 0) edge(g, prev, bucket_unit[b] - 1);
    prev = bucket_unit[b] - 1;
  }

  /* Keys, in reverse topological order (Kahn); a cycle leaves some unit out. */
  int *order = ARENA_ARRAY(a, int, g->n + 1), *indeg = ARENA_ARRAY(a, int, g->n + 1);
  int head = 0, tail = 0;
  for (int u = 0; u < g->n; u++)
    if ((indeg[u] = g->u[u].npred) == 0) order[tail++] = u;
  while (head < tail) {
    Unit *un = &g->u[order[head++]];
    for (int s = 0; s < un->nsucc; s++)
      if (--indeg[un->succ[s]] == 0) order[tail++] = un->succ[s];
  }
  if (tail != g->n) return false;
  for (int k = g->n - 1; k >= 0; k--) {
    Unit *un = &g->u[order[k]];
    un->key = NO_KEY;
    if (un->kind == U_START && !un->dp) {
      un->key = un->orig;
      continue;
    }
    for (int s = 0; s < un->nsucc; s++)
      if (g->u[un->succ[s]].key < un->key) un->key = g->u[un->succ[s]].key;
  }
  return true;
}

/* Whether unit a goes before unit b among ready compute units. */
static bool compute_before(const Unit *a, const Unit *b) {
  if (a->key != b->key) return a->key < b->key;
  return a->orig < b->orig;
}

PassResult pass_schedule(IrFunc *f, const PassOptions *o, Arena *scratch) {
  bool any = false;
  for (int i = 0; i < f->nops && !any; i++) any = is_start(f->ops[i]->opcode);
  if (!any) return PASS_UNCHANGED;

  CostModel m;
  cost_model_default(&m); /* never per-rank settings: every rank must get the same order */
  Graph g;
  if (!build(f, &g, &m, scratch)) {
    for (int i = 0; i < f->nops; i++) f->ops[i]->mark = 0;
    return PASS_UNCHANGED;
  }

  int *ready = ARENA_ARRAY(scratch, int, g.n + 1), nready = 0;
  int *placed = ARENA_ARRAY(scratch, int, g.n + 1), nplaced = 0;
  double *link_free = ARENA_ARRAY(scratch, double, g.n + 1);
  for (int u = 0; u < g.n; u++)
    if (g.u[u].npred == 0) ready[nready++] = u;
  double t = 0;
  while (nplaced < g.n) {
    GRADC_ASSERT(nready > 0);
    int pick = -1;
    /* 1. starts */
    for (int r = 0; r < nready; r++) {
      Unit *c = &g.u[ready[r]];
      if (c->kind == U_START && (pick < 0 || c->orig < g.u[ready[pick]].orig)) pick = r;
    }
    /* 2. critical waits whose collective is over */
    for (int r = 0; pick < 0 && r < nready; r++) {
      Unit *c = &g.u[ready[r]];
      if (c->kind == U_WAIT && c->critical && g.u[c->start].done <= t) pick = r;
    }
    /* 3. compute */
    if (pick < 0)
      for (int r = 0; r < nready; r++) {
        Unit *c = &g.u[ready[r]];
        if (c->kind == U_COMPUTE && !c->tail && (pick < 0 || compute_before(c, &g.u[ready[pick]]))) pick = r;
      }
    /* 4. waits */
    if (pick < 0)
      for (int r = 0; r < nready; r++) {
        Unit *c = &g.u[ready[r]];
        if (c->kind != U_WAIT) continue;
        if (pick < 0) {
          pick = r;
          continue;
        }
        Unit *p = &g.u[ready[pick]];
        bool before;
        if (c->critical != p->critical) before = c->critical;
        else if (g.u[c->start].done != g.u[p->start].done)
          before = g.u[c->start].done < g.u[p->start].done;
        else before = c->orig < p->orig;
        if (before) pick = r;
      }

    /* 5. the slices' unslices, in their previous order */
    if (pick < 0)
      for (int r = 0; r < nready; r++)
        if (pick < 0 || g.u[ready[r]].orig < g.u[ready[pick]].orig) pick = r;

    int u = ready[pick];
    ready[pick] = ready[--nready];
    Unit *un = &g.u[u];
    placed[nplaced++] = u;
    switch (un->kind) {
    case U_START: {
      double begin = t > link_free[un->link] ? t : link_free[un->link];
      un->done = link_free[un->link] = begin + un->cost;
      if (o->no_overlap) t = un->done;
      break;
    }
    case U_WAIT:
      if (g.u[un->start].done > t) t = g.u[un->start].done;
      break;
    case U_COMPUTE: t += un->cost; break;
    }
    int first_new = nready;
    for (int s = 0; s < un->nsucc; s++)
      if (--g.u[un->succ[s]].npred == 0) ready[nready++] = un->succ[s];
    if (un->kind == U_START && o->no_overlap) {
      /* Its waits next, in their previous order (they depend on it alone). */
      for (;;) {
        int w = -1;
        for (int r = first_new; r < nready; r++) {
          Unit *c = &g.u[ready[r]];
          if (c->kind == U_WAIT && c->start == u && (w < 0 || c->orig < g.u[ready[w]].orig)) w = r;
        }
        if (w < 0) break;
        int wu = ready[w];
        ready[w] = ready[--nready];
        placed[nplaced++] = wu;
        for (int s = 0; s < g.u[wu].nsucc; s++)
          if (--g.u[g.u[wu].succ[s]].npred == 0) ready[nready++] = g.u[wu].succ[s];
      }
    }
  }

  IrOp **ops = ARENA_ARRAY(scratch, IrOp *, f->nops + 1);
  int n = 0;
  bool changed = false;
  for (int k = 0; k < nplaced; k++) {
    Unit *un = &g.u[placed[k]];
    for (int j = 0; j < un->nops; j++) {
      changed |= un->ops[j] != n;
      ops[n++] = f->ops[un->ops[j]];
    }
  }
  GRADC_ASSERT(n == f->nops);
  memcpy(f->ops, ops, sizeof(IrOp *) * (size_t)n);
  for (int i = 0; i < f->nops; i++) f->ops[i]->mark = 0;
  return changed ? PASS_CHANGED : PASS_UNCHANGED;
}
