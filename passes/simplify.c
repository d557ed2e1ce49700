/* simplify.c - constant folding and algebraic identities.
 * Folds elementwise ops over scalar constants (never window.sum: window
 * weights are run-time values, DESIGN.md §3 rule 2), and removes x*1, x+0,
 * x-0, x/1, neg(neg x), casts and reshapes/broadcasts to the same type,
 * reshape chains, permute chains and identity permutes, turns a
 * broadcast constant into a shaped constant, and writes a layer_norm or
 * rms_norm whose statistics the function also computes over them.
 * Folding computes with ir/scalar.c, as the interpreter does.  Requires:
 * definitions precede uses.  Guarantees: the same values at every output
 * (up to f32 rounding of folded constants, done as the interpreter rounds,
 * and of a rewritten norm's statistics, which are the backward's). */
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

/* ------------------------------------------------------------------ */
/* Norms over the statistics the function computes anyway              */
/* ------------------------------------------------------------------ */

/* The result of an op of f with this opcode and operands (b NULL: one
 * operand), or NULL. */
static IrValue *find_op(const IrFunc *f, IrOpcode k, const IrValue *a, const IrValue *b) {
  for (int i = 0; i < f->nops; i++) {
    const IrOp *op = f->ops[i];
    if (op->opcode == k && op->result && op->nargs == (b ? 2 : 1) && op->args[0] == a && (!b || op->args[1] == b))
      return op->result;
  }
  return NULL;
}

/* mean(x) over x's last axis, kept, as a norm's statistics take it. */
static IrValue *find_row_mean(const IrFunc *f, const IrValue *x) {
  int64_t last = x->type.shape.rank - 1;
  for (int i = 0; i < f->nops; i++) {
    const IrOp *op = f->ops[i];
    const int64_t *ax;
    if (op->opcode != IR_OP_MEAN || op->args[0] != x || !ir_attr_get_int(op, "keepdim", 0)) continue;
    if (ir_attr_get_ints(op, "axes", &ax) == 1 && ax[0] == last) return op->result;
  }
  return NULL;
}

/* rsqrt(v + eps), with eps a scalar constant equal to the norm's. */
static IrValue *find_rsqrt_eps(const IrFunc *f, const IrValue *v, double eps) {
  for (int i = 0; i < f->nops; i++) {
    const IrOp *op = f->ops[i];
    double c;
    if (op->opcode != IR_OP_ADD || op->args[0] != v || !const_val(op->args[1], &c) || c != eps ||
        op->args[1]->type.shape.rank != 0)
      continue;
    IrValue *r = find_op(f, IR_OP_RSQRT, op->result, NULL);
    if (r) return r;
  }
  return NULL;
}

/* A layer_norm (rms_norm) whose row statistics the function computes as
 * well, as autodiff's backward recomputes them (passes/autodiff_rules.c:
 * xc = x - mean(x), rstd = rsqrt(mean(xc * xc) + eps); for rms_norm
 * r = rsqrt(mean(x * x) + eps)), becomes xc * rstd * w + b (x * r * w)
 * over them: the forward kernel then computes each statistic once, where
 * the fused norm summed the row twice more for its own (docs/DECISIONS.md
 * "A norm over its backward's statistics").  NULL when they are not all
 * there (a forward-only compile, or gradients for b alone). */
static IrValue *norm_over_stats(IrFunc *f, IrOp *op) {
  IrValue *x = op->args[0], *r = op->result;
  double eps = ir_op_eps(op);
  IrValue *y;
  if (op->opcode == IR_OP_LAYER_NORM) {
    IrValue *mu = find_row_mean(f, x), *xc = mu ? find_op(f, IR_OP_SUB, x, mu) : NULL;
    IrValue *sq = xc ? find_op(f, IR_OP_MUL, xc, xc) : NULL, *var = sq ? find_row_mean(f, sq) : NULL;
    IrValue *rstd = var ? find_rsqrt_eps(f, var, eps) : NULL;
    if (!rstd) return NULL;
    y = ir_binary(f, IR_OP_MUL, ir_binary(f, IR_OP_MUL, xc, rstd, op->loc), op->args[1], op->loc);
    y = ir_binary(f, IR_OP_ADD, y, op->args[2], op->loc);
  } else {
    IrValue *sq = find_op(f, IR_OP_MUL, x, x), *ms = sq ? find_row_mean(f, sq) : NULL;
    IrValue *rr = ms ? find_rsqrt_eps(f, ms, eps) : NULL;
    if (!rr) return NULL;
    y = ir_binary(f, IR_OP_MUL, ir_binary(f, IR_OP_MUL, x, rr, op->loc), op->args[1], op->loc);
  }
  GRADC_ASSERT(same_type(y, r));
  return y;
}

/* v^T of a 2-D v: the operand of a transpose, or a new transpose. */
static IrValue *transpose2(IrFunc *f, IrValue *v, IrLoc loc) {
  if (rw_is_transpose(v->def)) return v->def->args[0];
  static const int64_t swap[2] = {1, 0};
  return ir_permute(f, v, swap, loc);
}

/* (A B)^T = B^T A^T: a transposed 2-D product that nothing else reads
 * (through reshapes that keep its shape) is the product of the
 * transposed operands, which GEMMs and product kernels read as views.
 * A tied embedding's gradient from the logits, x^T dy, transposed into
 * the embedding's [V, C], was a copy of its own (tinygpt). */
static IrValue *transposed_product(IrFunc *f, IrOp *op, const int *uses, int nv) {
  IrValue *x = op->args[0];
  const IrShape *s = &x->type.shape;
  while (x->id < nv && uses[x->id] == 1 && x->def && x->def->opcode == IR_OP_RESHAPE)
    x = x->def->args[0];
  if (x->id >= nv || uses[x->id] != 1 || !x->def || x->def->opcode != IR_OP_MATMUL || !ir_shape_eq(&x->type.shape, s))
    return NULL;
  IrValue *a = x->def->args[0], *b = x->def->args[1];
  if (a->type.shape.rank != 2 || b->type.shape.rank != 2) return NULL;
  return ir_matmul(f, transpose2(f, b, op->loc), transpose2(f, a, op->loc), op->loc);
}

/* A replacement for op's result, or NULL. */
static IrValue *simplify_op(IrFunc *f, IrOp *op, const int *uses, int nv) {
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
  } else if (k == IR_OP_LAYER_NORM || k == IR_OP_RMS_NORM) {
    return norm_over_stats(f, op);
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
    if (n == 2 && r->type.shape.rank == 2) {
      IrValue *t = transposed_product(f, op, uses, nv);
      if (t) return t;
    }
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
  int *uses = ARENA_ARRAY(scratch, int, nv + 1);
  ir_count_uses(f, uses);
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
    int before = f->nops;
    IrValue *s = simplify_op(f, op, uses, nv);
    if (s && s->def && s->def->opcode == IR_OP_MATMUL && f->nops > before) {
      /* a transposed product (transposed_product) runs where the copy did,
       * not where the sort below would put it (before its first reader) */
      rw_splice(f, i + 1, before);
      i += f->nops - before;
      nops += f->nops - before;
    }
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
