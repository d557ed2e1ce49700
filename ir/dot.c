/* dot.c - write a function as a Graphviz digraph: one node per argument
 * and per op, labelled with the printed name and type ("%h\nf32[5,18]"),
 * an edge from each operand's definition to its user. */
#include "ir.h"

/* A label string for DOT: quotes and backslashes escaped. */
static void put_escaped(FILE *out, const char *s) {
  for (; *s; s++) {
    if (*s == '"' || *s == '\\') fputc('\\', out);
    if (*s == '\n')
      fputs("\\n", out);
    else
      fputc(*s, out);
  }
}

static bool in_table(const IrFunc *f, const IrValue *v) {
  return v && v->id >= 0 && v->id < f->nvalues && f->values[v->id] == v;
}

void ir_write_dot(const IrFunc *f, FILE *out) {
  Arena a;
  arena_init(&a);
  IrNames names;
  ir_names_init(&names, f, &a);
  char ty[IR_TYPE_STR_MAX];

  fputs("digraph \"", out);
  put_escaped(out, f->name ? f->name : "");
  fputs("\" {\n  node [fontname=\"monospace\"];\n", out);
  for (int i = 0; i < f->nargs; i++) {
    const IrValue *v = f->args[i];
    if (!in_table(f, v)) continue;
    fprintf(out, "  v%d [shape=%s, label=\"", v->id, v->role == IR_ARG_INPUT ? "invhouse" : "box");
    put_escaped(out, arena_printf(&a, "%%%s\n%s%s", names.name[v->id], ir_type_str(&v->type, ty, sizeof ty),
                                  v->role == IR_ARG_PARAM    ? " param"
                                  : v->role == IR_ARG_BUFFER ? " buffer"
                                                             : " input"));
    fputs("\"];\n", out);
  }
  for (int i = 0; i < f->nops; i++) {
    const IrOp *op = f->ops[i];
    if (!op || (unsigned)op->opcode >= (unsigned)IR_OP_COUNT) continue;
    const char *opname = ir_op_info[op->opcode].name;
    const char *label;
    if (in_table(f, op->result))
      label = arena_printf(&a, "%%%s = %s\n%s", names.name[op->result->id], opname,
                           ir_type_str(&op->result->type, ty, sizeof ty));
    else
      label = arena_printf(&a, "%s \"%s\"", opname, ir_attr_get_str(op, "name", ""));
    fprintf(out, "  op%d [shape=%s, label=\"", i, op->result ? "ellipse" : "doublecircle");
    put_escaped(out, label);
    fputs("\"];\n", out);
  }
  /* Edges: from the argument node or the defining op's node. */
  int *def_index = ARENA_ARRAY(&a, int, f->nvalues > 0 ? f->nvalues : 1);
  for (int i = 0; i < f->nvalues; i++) def_index[i] = -1;
  for (int i = 0; i < f->nops; i++)
    if (f->ops[i] && in_table(f, f->ops[i]->result)) def_index[f->ops[i]->result->id] = i;
  for (int i = 0; i < f->nops; i++) {
    const IrOp *op = f->ops[i];
    if (!op) continue;
    for (int j = 0; j < op->nargs && op->args; j++) {
      const IrValue *v = op->args[j];
      if (!in_table(f, v)) continue;
      if (!v->def)
        fprintf(out, "  v%d -> op%d;\n", v->id, i);
      else if (def_index[v->id] >= 0)
        fprintf(out, "  op%d -> op%d;\n", def_index[v->id], i);
    }
  }
  fputs("}\n", out);
  arena_free(&a);
}
