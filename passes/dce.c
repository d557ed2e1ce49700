/* dce.c - dead code elimination.
 * Requires: a well-formed function.  Guarantees: every remaining op is an
 * output (loss, grad) or (transitively) feeds one; nothing else changes. */
#include "passes.h"

PassResult pass_dce(IrFunc *f, const PassOptions *o, Arena *scratch) {
  (void)o;
  bool *live = ARENA_ARRAY(scratch, bool, f->nvalues + 1);
  int removed = 0;
  for (int i = f->nops - 1; i >= 0; i--) {
    IrOp *op = f->ops[i];
    bool keep = ir_op_info[op->opcode].kind == IR_KIND_OUTPUT || (op->result && live[op->result->id]);
    op->mark = !keep;
    if (!keep) {
      removed++;
      continue;
    }
    for (int j = 0; j < op->nargs; j++) live[op->args[j]->id] = true;
  }
  ir_func_remove_marked(f);
  return removed ? PASS_CHANGED : PASS_UNCHANGED;
}
