/* rewrite.c - small helpers the rewriting passes share: moving the ops a
 * rewrite has just emitted (at the end of the op list) to where they
 * belong, and recognising a matrix transpose. */
#include <stdlib.h>
#include <string.h>

#include "passes.h"

void rw_splice(IrFunc *f, int at, int from) {
  int added = f->nops - from;
  IrOp **tmp = malloc(sizeof(IrOp *) * (size_t)(added ? added : 1));
  if (!tmp) abort();
  memcpy(tmp, f->ops + from, sizeof(IrOp *) * (size_t)added);
  memmove(f->ops + at + added, f->ops + at, sizeof(IrOp *) * (size_t)(from - at));
  memcpy(f->ops + at, tmp, sizeof(IrOp *) * (size_t)added);
  free(tmp);
}

bool rw_is_transpose(const IrOp *op) {
  if (!op || op->opcode != IR_OP_PERMUTE) return false;
  const int64_t *perm;
  int n = ir_attr_get_ints(op, "perm", &perm);
  if (n < 2 || n != op->result->type.shape.rank) return false;
  for (int k = 0; k < n - 2; k++)
    if (perm[k] != k) return false;
  return perm[n - 2] == n - 1 && perm[n - 1] == n - 2;
}
