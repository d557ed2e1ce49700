/* split_draws.c - `split-draws`: a random draw read by several ops, or a
 * value computed from draws and constants alone (dropout's mask: a
 * comparison of a draw and a select of two constants), gets one copy per
 * reading op, so that `fuse` puts each copy in the kernel that reads it.
 * The forward kernel then draws the mask where it applies it, and the
 * backward's kernel draws it again from the same counter (ir/random.c)
 * instead of reading it back from memory: a few integer multiplies per
 * element against a store and a load of it, which is the plan's choice
 * for every draw (docs/DECISIONS.md "Counter-based randomness").
 *
 * Requires: a verified function, before `fuse` (on ungrouped ops).
 * Guarantees: every draw value (a `random`, or an elementwise op whose
 * operands are draw values and consts, one of them a draw) has at most one
 * reading op; copies come right after their original, with its operands,
 * attributes and location, so every definition still precedes its uses
 * and the values are the same bits. */
#include "passes.h"

/* A draw value: a random op's, or an elementwise one of draws and consts. */
static bool is_draw(const IrOp *op, const bool *draw) {
  if (!op->result) return false;
  if (op->opcode == IR_OP_RANDOM) return true;
  if (!ir_op_is(op->opcode, IR_OPF_ELEMENTWISE)) return false;
  bool any = false;
  for (int i = 0; i < op->nargs; i++) {
    const IrValue *a = op->args[i];
    if (draw[a->id]) any = true;
    else if (!a->def || a->def->opcode != IR_OP_CONST) return false;
  }
  return any;
}

PassResult pass_split_draws(IrFunc *f, const PassOptions *o, Arena *scratch) {
  (void)o;
  int n = f->nops;
  bool *draw = ARENA_ARRAY(scratch, bool, f->nvalues > 0 ? f->nvalues : 1);
  bool any = false;
  for (int i = 0; i < n; i++)
    if (is_draw(f->ops[i], draw)) any = draw[f->ops[i]->result->id] = true;
  if (!any) return PASS_UNCHANGED;
  /* Copies are appended to f->ops by ir_emit; orig[k] is the op a copy at
   * position n + k copies (its place in the final list). */
  int cap = 64, ncopies = 0;
  int *orig = ARENA_ARRAY(scratch, int, cap);
  for (int i = n - 1; i >= 0; i--) {
    IrOp *E = f->ops[i];
    if (!E->result || !draw[E->result->id]) continue;
    IrValue *v = E->result;
    /* Its readers now, copies of later draws included; the first keeps v. */
    bool first = true;
    for (int u = 0; u < f->nops; u++) {
      IrOp *U = f->ops[u];
      bool reads = false;
      for (int j = 0; j < U->nargs; j++) reads |= U->args[j] == v;
      if (!reads) continue;
      if (first) {
        first = false;
        continue;
      }
      IrValue *c = ir_emit(f, E->opcode, E->args, E->nargs, E->attrs, E->nattrs, &v->type, E->loc);
      for (int j = 0; j < U->nargs; j++)
        if (U->args[j] == v) U->args[j] = c;
      if (ncopies == cap) {
        int *grown = ARENA_ARRAY(scratch, int, cap * 2);
        for (int k = 0; k < cap; k++) grown[k] = orig[k];
        orig = grown;
        cap *= 2;
      }
      orig[ncopies++] = i;
    }
  }
  if (ncopies == 0) return PASS_UNCHANGED;
  /* Each original, then its copies. */
  IrOp **ops = ARENA_ARRAY(scratch, IrOp *, f->nops);
  int m = 0;
  for (int i = 0; i < n; i++) {
    ops[m++] = f->ops[i];
    for (int k = 0; k < ncopies; k++)
      if (orig[k] == i) ops[m++] = f->ops[n + k];
  }
  GRADC_ASSERT(m == f->nops);
  for (int i = 0; i < m; i++) f->ops[i] = ops[i];
  return PASS_CHANGED;
}
