/* cse.c - common subexpression elimination.
 * Two ops are the same when they have the same opcode, operands, attributes
 * and result type; the later one's uses move to the earlier.  Outputs are
 * never merged.  Requires: definitions precede uses.  Guarantees: no two
 * remaining non-output ops are the same. */
#include <string.h>

#include "passes.h"

static uint64_t attr_hash(const IrAttr *a, uint64_t h) {
  h = hash_bytes(a->key, strlen(a->key), h);
  h = hash_bytes(&a->kind, sizeof a->kind, h);
  switch (a->kind) {
  case IR_ATTR_INT:
  case IR_ATTR_BOOL: return hash_bytes(&a->i, sizeof a->i, h);
  case IR_ATTR_FLOAT: return hash_bytes(&a->f, sizeof a->f, h);
  case IR_ATTR_STR: return hash_bytes(a->s, strlen(a->s), h);
  case IR_ATTR_INTS: return hash_bytes(a->ints, sizeof(int64_t) * (size_t)a->n, h);
  }
  return h;
}

static bool attr_eq(const IrAttr *a, const IrAttr *b) {
  if (strcmp(a->key, b->key) != 0 || a->kind != b->kind) return false;
  switch (a->kind) {
  case IR_ATTR_INT:
  case IR_ATTR_BOOL: return a->i == b->i;
  case IR_ATTR_FLOAT: return memcmp(&a->f, &b->f, sizeof a->f) == 0; /* bitwise: -0.0 and nan stay distinct */
  case IR_ATTR_STR: return strcmp(a->s, b->s) == 0;
  case IR_ATTR_INTS: return a->n == b->n && memcmp(a->ints, b->ints, sizeof(int64_t) * (size_t)a->n) == 0;
  }
  return false;
}

static uint64_t op_hash(const IrOp *op) {
  uint64_t h = hash_bytes(&op->opcode, sizeof op->opcode, HASH_SEED);
  for (int i = 0; i < op->nargs; i++) h = hash_bytes(&op->args[i]->id, sizeof(int), h);
  for (int i = 0; i < op->nattrs; i++) h = attr_hash(&op->attrs[i], h);
  h = hash_bytes(&op->result->type.dtype, sizeof(IrDType), h);
  return hash_bytes(op->result->type.shape.dim, sizeof(int64_t) * (size_t)op->result->type.shape.rank, h);
}

static bool op_eq(const IrOp *a, const IrOp *b) {
  if (a->opcode != b->opcode || a->nargs != b->nargs || a->nattrs != b->nattrs) return false;
  if (!ir_type_eq(&a->result->type, &b->result->type)) return false;
  for (int i = 0; i < a->nargs; i++)
    if (a->args[i] != b->args[i]) return false;
  for (int i = 0; i < a->nattrs; i++)
    if (!attr_eq(&a->attrs[i], &b->attrs[i])) return false;
  return true;
}

PassResult pass_cse(IrFunc *f, const PassOptions *o, Arena *scratch) {
  (void)o;
  /* Open-addressing table of representative ops. */
  size_t cap = 16;
  while (cap < (size_t)f->nops * 2) cap *= 2;
  IrOp **table = ARENA_ARRAY(scratch, IrOp *, cap);
  /* repl[id]: the value that replaces value id, or NULL. */
  IrValue **repl = ARENA_ARRAY(scratch, IrValue *, f->nvalues + 1);
  int merged = 0;
  for (int i = 0; i < f->nops; i++) {
    IrOp *op = f->ops[i];
    op->mark = 0;
    for (int j = 0; j < op->nargs; j++)
      if (repl[op->args[j]->id]) op->args[j] = repl[op->args[j]->id];
    if (!op->result || ir_op_is(op->opcode, IR_OPF_OPAQUE)) continue;
    size_t k = op_hash(op) & (cap - 1);
    while (table[k] && !op_eq(table[k], op)) k = (k + 1) & (cap - 1);
    if (!table[k]) {
      table[k] = op;
      continue;
    }
    IrValue *keep = table[k]->result;
    /* Keep a source name if only the duplicate has one. */
    if (!keep->name && op->result->name) keep->name = op->result->name;
    repl[op->result->id] = keep;
    op->mark = 1;
    merged++;
  }
  ir_func_remove_marked(f);
  return merged ? PASS_CHANGED : PASS_UNCHANGED;
}
