/* simplify.c - constant folding and algebraic identities.
 * Folds elementwise ops over scalar constants (never window.sum: window
 * weights are run-time values, DESIGN.md §3 rule 2), and removes x*1, x+0,
 * x-0, x/1, neg(neg x), casts and reshapes/broadcasts to the same type,
 * reshape chains, permute chains and identity permutes, and turns a
 * broadcast constant into a shaped constant.  Folding computes with
 * ir/scalar.c, as the interpreter does.  Requires: definitions precede
 * uses.  Guarantees: the same values at every output (up to f32 rounding of
 * folded constants, done as the interpreter rounds). */
#include <string.h>

#include "passes.h"

static bool const_val(IrValue *v, double *out) {
  if (!v->def || v->def->opcode != IR_OP_CONST) return false;
  *out = ir_attr_get_float(v->def, "value", 0);
  return true;
}

static bool is_const(IrValue *v, double want) {
  double c;
  return const_val(v, &c) && c == want;
}

/* Fold an op of ops.def's FOLD column over scalar constants, with the
 * interpreter's semantics and rounding; false if not foldable. */
static bool fold(IrOp *op, double *out) {
  double a = 0, b = 0;
  IrOpcode k = op->opcode;
  if (!ir_op_is(k, IR_OPF_FOLD) || !const_val(op->args[0], &a)) return false;
  if (op->nargs == 2 && !const_val(op->args[1], &b)) return false;
  IrDType dt = op->result->type.dtype;
  if (!ir_dtype_is_float(dt)) return false;
  double r;
  if (k == IR_OP_CAST) r = ir_scalar_cast(a, dt);
  else if (op->nargs == 1) r = ir_scalar_unary(k, a, ir_attr_get_float(op, "exponent", 1));
  else r = ir_scalar_binary(k, a, b);
  *out = ir_round_dtype(r, dt);
  return true;
}

static bool same_type(IrValue *a, IrValue *b) { return ir_type_eq(&a->type, &b->type); }

/* A replacement for op's result, or NULL. */
static IrValue *simplify_op(IrFunc *f, IrOp *op) {
  IrValue *x = op->nargs > 0 ? op->args[0] : NULL, *y = op->nargs > 1 ? op->args[1] : NULL;
  IrValue *r = op->result;
  double c;
  if (fold(op, &c)) return ir_const_shaped(f, c, r->type, op->loc);
  IrOpcode k = op->opcode;
  if (k == IR_OP_ADD) {
    if (is_const(y, 0) && same_type(x, r)) return x;
    if (is_const(x, 0) && same_type(y, r)) return y;
  } else if (k == IR_OP_SUB) {
    if (is_const(y, 0) && same_type(x, r)) return x;
  } else if (k == IR_OP_MUL) {
    if (is_const(y, 1) && same_type(x, r)) return x;
    if (is_const(x, 1) && same_type(y, r)) return y;
  } else if (k == IR_OP_DIV) {
    if (is_const(y, 1) && same_type(x, r)) return x;
  } else if (k == IR_OP_NEG) {
    if (x->def && x->def->opcode == IR_OP_NEG) return x->def->args[0];
  } else if (k == IR_OP_CAST) {
    if (same_type(x, r)) return x;
  } else if (k == IR_OP_RESHAPE) {
    if (same_type(x, r)) return x;
    if (x->def && x->def->opcode == IR_OP_RESHAPE) return ir_reshape(f, x->def->args[0], r->type.shape, op->loc);
    if (const_val(x, &c)) return ir_const_shaped(f, c, r->type, op->loc);
  } else if (k == IR_OP_BROADCAST) {
    if (same_type(x, r)) return x;
    if (const_val(x, &c)) return ir_const_shaped(f, c, r->type, op->loc);
  } else if (k == IR_OP_PERMUTE) {
    const int64_t *p;
    int n = ir_attr_get_ints(op, "perm", &p);
    bool ident = true;
    for (int i = 0; i < n; i++) ident &= p[i] == i;
    if (ident) return x;
    if (x->def && x->def->opcode == IR_OP_PERMUTE) {
      /* permute(permute(z, q), p)[i] = z[q[p[i]]] */
      const int64_t *q;
      ir_attr_get_ints(x->def, "perm", &q);
      /* Not a swap of the last two axes over a permute that keeps the
       * last axis (k's heads, then k^T): the swap is a GEMM's transpose
       * flag and the inner permute copies whole rows, where the composed
       * one would be a transposing copy (the operands that are not
       * strided views: bf16 and f16, bench/RESULTS.md). */
      bool swap = n >= 2 && p[n - 2] == n - 1 && p[n - 1] == n - 2;
      for (int i = 0; i + 2 < n; i++) swap &= p[i] == i;
      if (swap && q[n - 1] == n - 1) return NULL;
      int64_t comp[IR_MAX_RANK];
      bool back = true;
      for (int i = 0; i < n; i++) {
        comp[i] = q[p[i]];
        back &= comp[i] == i;
      }
      return back ? x->def->args[0] : ir_permute(f, x->def->args[0], comp, op->loc);
    }
  }
  return NULL;
}

PassResult pass_simplify(IrFunc *f, const PassOptions *o, Arena *scratch) {
  (void)o;
  int changed = 0;
  /* tp.copy matters only to autodiff (its gradient is all-reduced): once
   * the function has its gradients it is the identity. */
  bool differentiated = false;
  for (int i = 0; i < f->nops; i++) differentiated |= f->ops[i]->opcode == IR_OP_GRAD;
  /* Values created here get ids past the table: size it generously and
   * only record replacements of existing values. */
  int nv = f->nvalues;
  IrValue **repl = ARENA_ARRAY(scratch, IrValue *, nv + 1);
  int nops = f->nops;
  for (int i = 0; i < nops; i++) {
    IrOp *op = f->ops[i];
    for (int j = 0; j < op->nargs; j++) {
      IrValue *a = op->args[j];
      while (a->id < nv && repl[a->id]) a = repl[a->id];
      op->args[j] = a;
    }
    if (!op->result || op->result->id >= nv) continue;
    if (op->opcode == IR_OP_TP_COPY && differentiated) {
      repl[op->result->id] = op->args[0];
      changed++;
      continue;
    }
    if (ir_op_is(op->opcode, IR_OPF_OPAQUE)) continue;
    IrValue *s = simplify_op(f, op);
    if (!s || s == op->result) continue;
    if (!s->name && op->result->name) s->name = op->result->name;
    repl[op->result->id] = s;
    changed++;
  }
  if (!changed) return PASS_UNCHANGED;
  /* Ops appended above may be used by earlier ops now: restore the order,
   * then apply replacements the appended ops' users still need. */
  for (int i = 0; i < f->nops; i++) {
    IrOp *op = f->ops[i];
    for (int j = 0; j < op->nargs; j++) {
      IrValue *a = op->args[j];
      while (a->id < nv && repl[a->id]) a = repl[a->id];
      op->args[j] = a;
    }
  }
  if (!ir_func_topo_sort(f)) GRADC_ASSERT(!"simplify produced a cycle");
  /* Dead ops are left for dce. */
  return PASS_CHANGED;
}
