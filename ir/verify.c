/* verify.c - the IR checker run between passes.
 *
 * Checks, in this order, so that later checks can trust earlier ones:
 *   1. the value table: values[id]->id == id;
 *   2. arguments: in the table, no defining op;
 *   3. every op's pointers: operands and result are values of this function;
 *   4. per op in list order: arity, operands defined earlier (an argument or
 *      the result of an earlier op: SSA dominance), result->def == op,
 *      outputs have no result and other ops one, and the shape rule,
 *      re-run, gives the stored result type (this also checks attributes
 *      and that each *.wait consumes its *.start); every attribute key is
 *      one of the IR's (IR_ATTR_KEYS), and none appears twice.
 * The first problem is written to err, naming the op as it prints. */
#include <stdlib.h>
#include <string.h>

#include "ir.h"

static bool in_table(const IrFunc *f, const IrValue *v) {
  return v && v->id >= 0 && v->id < f->nvalues && f->values[v->id] == v;
}

/* Steps 1-3: everything that must hold before names can be printed. */
static bool check_pointers(const IrFunc *f, char *err, size_t n) {
  for (int i = 0; i < f->nvalues; i++) {
    if (!f->values[i]) return errf(err, n, "value #%d is missing", i);
    if (f->values[i]->id != i) return errf(err, n, "value #%d has id %d", i, f->values[i]->id);
  }
  for (int i = 0; i < f->nargs; i++) {
    const IrValue *a = f->args[i];
    if (!in_table(f, a)) return errf(err, n, "argument %d is not a value of the function", i + 1);
    if (a->def) return errf(err, n, "argument %d has a defining op", i + 1);
  }
  for (int i = 0; i < f->nops; i++) {
    const IrOp *op = f->ops[i];
    if (!op) return errf(err, n, "op #%d is missing", i);
    if ((unsigned)op->opcode >= (unsigned)IR_OP_COUNT) return errf(err, n, "op #%d has invalid opcode %d", i, op->opcode);
    const char *name = ir_op_info[op->opcode].name;
    if (op->nargs < 0 || (op->nargs > 0 && !op->args)) return errf(err, n, "op #%d ('%s') has no operand array", i, name);
    if (op->nattrs < 0 || (op->nattrs > 0 && !op->attrs))
      return errf(err, n, "op #%d ('%s') has no attribute array", i, name);
    for (int j = 0; j < op->nargs; j++)
      if (!in_table(f, op->args[j]))
        return errf(err, n, "op #%d ('%s'): operand %d is not a value of the function", i, name, j + 1);
    if (op->result && !in_table(f, op->result))
      return errf(err, n, "op #%d ('%s'): result is not a value of the function", i, name);
    for (int j = 0; j < op->nattrs; j++)
      if (!op->attrs[j].key) return errf(err, n, "op #%d ('%s'): attribute %d has no key", i, name, j + 1);
  }
  return true;
}

/* Step 4, with names for messages. */
static bool check_ops(const IrFunc *f, const IrNames *names, bool *defined, char *err, size_t n) {
  StrBuf sb;
  sb_init(&sb);
  bool ok = true;
#define BAD(...)                                                                                             \
  do {                                                                                                       \
    sb_puts(&sb, "'");                                                                                       \
    ir_print_op(f, names, op, &sb);                                                                          \
    sb_puts(&sb, "': ");                                                                                     \
    sb_printf(&sb, __VA_ARGS__);                                                                             \
    ok = false;                                                                                              \
    goto done;                                                                                               \
  } while (0)
  for (int i = 0; i < f->nargs; i++) defined[f->args[i]->id] = true;
  for (int i = 0; i < f->nops; i++) {
    const IrOp *op = f->ops[i];
    const IrOpInfo *info = &ir_op_info[op->opcode];
    if (info->arity >= 0 ? op->nargs != info->arity : op->nargs < 1)
      BAD("'%s' takes %s%d operand%s, has %d", info->name, info->arity < 0 ? "at least " : "",
          info->arity < 0 ? 1 : info->arity, info->arity == 1 || info->arity < 0 ? "" : "s", op->nargs);
    for (int j = 0; j < op->nargs; j++)
      if (!defined[op->args[j]->id]) BAD("operand %%%s is used before it is defined", names->name[op->args[j]->id]);
    for (int j = 0; j < op->nattrs; j++) {
      if (!ir_attr_known(op->attrs[j].key)) BAD("unknown attribute '%s'", op->attrs[j].key);
      for (int k = 0; k < j; k++)
        if (strcmp(op->attrs[k].key, op->attrs[j].key) == 0) BAD("attribute '%s' appears twice", op->attrs[j].key);
    }
    bool output = info->kind == IR_KIND_OUTPUT;
    if (output && op->result) BAD("'%s' must have no result", info->name);
    if (!output && !op->result) BAD("'%s' has no result", info->name);
    if (op->result) {
      if (op->result->def != op) BAD("result's defining op is another op");
      if (defined[op->result->id]) BAD("%%%s is defined twice", names->name[op->result->id]);
    }
    char msg[512];
    IrType t;
    if (!ir_infer_type(op, op->result ? &op->result->type : NULL, &t, msg, sizeof msg)) BAD("%s", msg);
    if (op->result && !ir_type_eq(&t, &op->result->type)) {
      char a[IR_TYPE_STR_MAX], b[IR_TYPE_STR_MAX];
      BAD("result type is %s, but the operands give %s", ir_type_str(&op->result->type, a, sizeof a),
          ir_type_str(&t, b, sizeof b));
    }
    if (op->result) defined[op->result->id] = true;
  }
#undef BAD
done:
  if (!ok) errf(err, n, "%s", sb_str(&sb));
  sb_free(&sb);
  return ok;
}

bool ir_verify(const IrFunc *f, char *err, size_t errlen) {
  if (!check_pointers(f, err, errlen)) return false;
  Arena a;
  arena_init(&a);
  IrNames names;
  ir_names_init(&names, f, &a);
  bool *defined = ARENA_ARRAY(&a, bool, f->nvalues > 0 ? f->nvalues : 1);
  bool ok = check_ops(f, &names, defined, err, errlen);
  arena_free(&a);
  return ok;
}
