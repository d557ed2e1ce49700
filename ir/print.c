/* print.c - the IR text form (DESIGN.md §4), as read back by read.c:
 *
 *   func @mlp(%x: f32[5,7] input batch, %W1: f32[7,18] param) {
 *     %0 = matmul %x, %W1 : f32[5,18]  loc("mlp.gdl":20:15)
 *     %5 = sum %4 {axes=[0,1], keepdim=false} : f32  loc(unknown)
 *     loss %5 {name="ce"}  loc("mlp.gdl":23:3)
 *   }
 *
 * After `memplan` (docs/BACKEND.md) a value's storage follows its type
 * (`: f32[64,256] @4096`, `@grad 128`, `@alias 4096`) and the function
 * header ends with `arena N persist M`, under a comment line giving the
 * peak.
 *
 * After `fuse`, each kernel's ops (IrOp.group >= 1, contiguous) print as a
 * block listing the values it reads from outside and the values it defines
 * that are used outside, in order of first use and of definition:
 *
 *   kernel @k3(%1, %b1) -> (%h) {
 *     %2 = add %1, %b1 : f32[64,256]  loc("mlp.gdl":13:19)
 *     %h = relu %2 : f32[64,256]  loc("mlp.gdl":13:7)
 *   }
 *
 * Values print as their source name, or as a number counting the unnamed
 * values in definition order; repeated names get ".1", ".2", ... so that
 * every printed name is unique.  Printing what read.c read gives the same
 * text again. */
#include <string.h>

#include "ir.h"

/* ------------------------------------------------------------------ */
/* Names                                                               */
/* ------------------------------------------------------------------ */

/* A name the reader accepts after % or @: [A-Za-z0-9_.]+, not all digits
 * (all-digit names are the printer's numbers). */
static bool printable_name(const char *s) {
  if (!s || !*s) return false;
  bool digits = true;
  for (const char *p = s; *p; p++) {
    char c = *p;
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '.';
    if (!ok) return false;
    if (c < '0' || c > '9') digits = false;
  }
  return !digits;
}

/* A source name made printable: other characters become '_'; a name of
 * digits only gets a leading '_'. */
static const char *sanitize(Arena *a, const char *s) {
  if (printable_name(s)) return s;
  size_t n = strlen(s);
  char *r = arena_alloc(a, n + 2);
  size_t k = 0;
  bool digits = true;
  for (size_t i = 0; i < n; i++) {
    char c = s[i];
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '.';
    if (c < '0' || c > '9') digits = false;
    r[k++] = ok ? c : '_';
  }
  if (digits) {
    memmove(r + 1, r, k);
    r[0] = '_';
    k++;
  }
  r[k] = 0;
  return r;
}

static bool in_table(const IrFunc *f, const IrValue *v) {
  return v && v->id >= 0 && v->id < f->nvalues && f->values[v->id] == v;
}

/* Give v its printed name: its own (made unique) or the next number. */
static void name_value(IrNames *n, const IrFunc *f, const IrValue *v, Arena *a, StrMap *taken, int *counter) {
  if (!in_table(f, v) || n->name[v->id]) return;
  const char *base;
  if (v->name && *v->name) {
    base = sanitize(a, v->name);
  } else {
    n->name[v->id] = arena_printf(a, "%d", (*counter)++);
    return;
  }
  const char *s = base;
  for (int k = 1; strmap_get(taken, s); k++) s = arena_printf(a, "%s.%d", base, k);
  strmap_put(taken, s, (void *)s);
  n->name[v->id] = s;
}

void ir_names_init(IrNames *n, const IrFunc *f, Arena *a) {
  n->name = ARENA_ARRAY(a, const char *, f->nvalues > 0 ? f->nvalues : 1);
  StrMap taken;
  strmap_init(&taken);
  int counter = 0;
  for (int i = 0; i < f->nargs; i++) name_value(n, f, f->args[i], a, &taken, &counter);
  for (int i = 0; i < f->nops; i++)
    if (f->ops[i]) name_value(n, f, f->ops[i]->result, a, &taken, &counter);
  /* Values no longer defined by any op (left behind by a pass): named
   * after the live ones so they do not disturb the numbering. */
  for (int i = 0; i < f->nvalues; i++) name_value(n, f, f->values[i], a, &taken, &counter);
  strmap_free(&taken);
}

/* ------------------------------------------------------------------ */
/* Pieces                                                              */
/* ------------------------------------------------------------------ */

static void print_value(const IrFunc *f, const IrNames *names, const IrValue *v, StrBuf *out) {
  if (in_table(f, v) && names->name[v->id])
    sb_printf(out, "%%%s", names->name[v->id]);
  else
    sb_puts(out, v ? "%<unknown>" : "%<null>");
}

static void print_type(const IrType *t, StrBuf *out) {
  if ((unsigned)t->dtype >= IR_DT_COUNT || t->shape.rank < 0 || t->shape.rank > IR_MAX_RANK) {
    sb_puts(out, "<invalid type>");
    return;
  }
  char buf[IR_TYPE_STR_MAX];
  sb_puts(out, ir_type_str(t, buf, sizeof buf));
}

/* A string literal: \" \\ \n \t escaped, other control bytes as \xHH. */
static void print_string(const char *s, StrBuf *out) {
  sb_putc(out, '"');
  for (const unsigned char *p = (const unsigned char *)(s ? s : ""); *p; p++) {
    if (*p == '"' || *p == '\\')
      sb_printf(out, "\\%c", *p);
    else if (*p == '\n')
      sb_puts(out, "\\n");
    else if (*p == '\t')
      sb_puts(out, "\\t");
    else if (*p < 0x20 || *p == 0x7f)
      sb_printf(out, "\\x%02x", *p);
    else
      sb_putc(out, (char)*p);
  }
  sb_putc(out, '"');
}

static void print_attr(const IrAttr *a, StrBuf *out) {
  sb_printf(out, "%s=", a->key ? a->key : "?");
  switch (a->kind) {
  case IR_ATTR_INT: sb_printf(out, "%lld", (long long)a->i); break;
  case IR_ATTR_FLOAT: {
    char buf[64];
    fmt_double(buf, sizeof buf, a->f);
    sb_puts(out, buf);
    break;
  }
  case IR_ATTR_BOOL: sb_puts(out, a->i ? "true" : "false"); break;
  case IR_ATTR_STR: print_string(a->s, out); break;
  case IR_ATTR_INTS:
    sb_putc(out, '[');
    for (int i = 0; a->ints && i < a->n; i++) sb_printf(out, "%s%lld", i ? "," : "", (long long)a->ints[i]);
    sb_putc(out, ']');
    break;
  }
}

/* Where memplan put a value: " @4096", " @grad 128", " @alias 4096"; nothing
 * when unplanned. */
static void print_storage(const IrValue *v, StrBuf *out) {
  switch (v->storage) {
  case IR_STORE_NONE: break;
  case IR_STORE_ARENA: sb_printf(out, " @%lld", (long long)v->offset); break;
  case IR_STORE_GRAD: sb_printf(out, " @grad %lld", (long long)v->offset); break;
  case IR_STORE_ALIAS: sb_printf(out, " @alias %lld", (long long)v->offset); break;
  }
}

static void print_loc(IrLoc loc, StrBuf *out) {
  if (!loc.file) {
    sb_puts(out, "loc(unknown)");
    return;
  }
  sb_puts(out, "loc(");
  print_string(loc.file, out);
  sb_printf(out, ":%d:%d)", loc.line, loc.col);
}

void ir_print_op(const IrFunc *f, const IrNames *names, const IrOp *op, StrBuf *out) {
  Arena tmp;
  IrNames own;
  arena_init(&tmp);
  if (!names) {
    ir_names_init(&own, f, &tmp);
    names = &own;
  }
  if ((unsigned)op->opcode >= (unsigned)IR_OP_COUNT) {
    sb_printf(out, "<invalid opcode %d>", (int)op->opcode);
    arena_free(&tmp);
    return;
  }
  if (op->result) {
    print_value(f, names, op->result, out);
    sb_puts(out, " = ");
  }
  sb_puts(out, ir_op_info[op->opcode].name);
  for (int i = 0; i < op->nargs && op->args; i++) {
    sb_puts(out, i ? ", " : " ");
    print_value(f, names, op->args[i], out);
  }
  if (op->nattrs > 0 && op->attrs) {
    sb_puts(out, " {");
    for (int i = 0; i < op->nattrs; i++) {
      if (i) sb_puts(out, ", ");
      print_attr(&op->attrs[i], out);
    }
    sb_putc(out, '}');
  }
  if (op->result) {
    sb_puts(out, " : ");
    print_type(&op->result->type, out);
    print_storage(op->result, out);
  }
  sb_puts(out, "  ");
  print_loc(op->loc, out);
  arena_free(&tmp);
}

/* ------------------------------------------------------------------ */
/* Whole functions                                                     */
/* ------------------------------------------------------------------ */

/* ------------------------------------------------------------------ */
/* Kernel blocks                                                       */
/* ------------------------------------------------------------------ */

/* By value id: defined in a kernel and used by an op outside it. */
static bool *kernel_outputs(const IrFunc *f, Arena *a) {
  bool *out = ARENA_ARRAY(a, bool, f->nvalues > 0 ? f->nvalues : 1);
  for (int i = 0; i < f->nops; i++) {
    const IrOp *op = f->ops[i];
    for (int j = 0; j < op->nargs && op->args; j++) {
      const IrValue *v = op->args[j];
      if (in_table(f, v) && v->def && v->def->group > 0 && v->def->group != op->group) out[v->id] = true;
    }
  }
  return out;
}

/* "kernel @kG(inputs) -> (outputs) {" for the kernel starting at ops[i]. */
static void print_kernel_header(const IrFunc *f, const IrNames *names, int i, const bool *outside, StrBuf *out) {
  int g = f->ops[i]->group, end = i;
  while (end < f->nops && f->ops[end]->group == g) end++;
  sb_printf(out, "  kernel @k%d(", g);
  int n = 0;
  for (int k = i; k < end; k++) {
    const IrOp *op = f->ops[k];
    for (int j = 0; j < op->nargs && op->args; j++) {
      const IrValue *v = op->args[j];
      if (v && v->def && v->def->group == g) continue; /* defined in the kernel */
      bool dup = false;                                /* listed already? */
      for (int k2 = i; k2 <= k && !dup; k2++)
        for (int j2 = 0; j2 < (k2 == k ? j : f->ops[k2]->nargs) && !dup; j2++) dup = f->ops[k2]->args[j2] == v;
      if (dup) continue;
      sb_puts(out, n++ ? ", " : "");
      print_value(f, names, v, out);
    }
  }
  sb_puts(out, ") -> (");
  n = 0;
  for (int k = i; k < end; k++) {
    const IrValue *v = f->ops[k]->result;
    if (!v || !in_table(f, v) || !outside[v->id]) continue;
    sb_puts(out, n++ ? ", " : "");
    print_value(f, names, v, out);
  }
  sb_puts(out, ") {\n");
}

void ir_print(const IrFunc *f, StrBuf *out) {
  Arena a;
  arena_init(&a);
  IrNames names;
  ir_names_init(&names, f, &a);
  if (f->arena_size > 0 || f->persist_size > 0)
    sb_printf(out, "// arena: %lld bytes (persistent %lld, peak activations %lld)\n", (long long)f->arena_size,
              (long long)f->persist_size, (long long)(f->arena_size - f->persist_size));
  sb_puts(out, "func @");
  if (printable_name(f->name))
    sb_puts(out, f->name);
  else
    print_string(f->name, out);
  sb_putc(out, '(');
  for (int i = 0; i < f->nargs; i++) {
    const IrValue *v = f->args[i];
    if (i) sb_puts(out, ", ");
    print_value(f, &names, v, out);
    sb_puts(out, ": ");
    print_type(&v->type, out);
    print_storage(v, out);
    if (v->role == IR_ARG_PARAM) {
      sb_puts(out, " param");
      if (v->split_axis >= 0) sb_printf(out, " split(%d)", v->split_axis);
      if (v->split_axis >= 0 && v->split_ranks > 1) sb_printf(out, " ranks %d", v->split_ranks);
    } else if (v->role == IR_ARG_BUFFER) {
      sb_puts(out, " buffer");
    } else
      sb_puts(out, v->batched ? " input batch" : " input");
  }
  sb_putc(out, ')');
  if (f->arena_size > 0 || f->persist_size > 0)
    sb_printf(out, " arena %lld persist %lld", (long long)f->arena_size, (long long)f->persist_size);
  sb_puts(out, " {\n");
  bool *outside = kernel_outputs(f, &a);
  for (int i = 0; i < f->nops; i++) {
    int g = f->ops[i]->group;
    if (g > 0 && (i == 0 || f->ops[i - 1]->group != g)) print_kernel_header(f, &names, i, outside, out);
    sb_puts(out, g > 0 ? "    " : "  ");
    ir_print_op(f, &names, f->ops[i], out);
    sb_putc(out, '\n');
    if (g > 0 && (i + 1 == f->nops || f->ops[i + 1]->group != g)) sb_puts(out, "  }\n");
  }
  sb_puts(out, "}\n");
  arena_free(&a);
}

void ir_print_file(const IrFunc *f, FILE *out) {
  StrBuf sb;
  sb_init(&sb);
  ir_print(f, &sb);
  fputs(sb_str(&sb), out);
  sb_free(&sb);
}
