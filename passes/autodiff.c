/* autodiff.c - reverse-mode differentiation of the forward function.
 *
 * Requires: a forward function (no `grad` outputs yet).  The objective is
 * given by `loss.term %S, %seed` ops (gradient(S) is seeded with the seed
 * value itself: DESIGN.md §3 rule 1, the seeds are exactly c·w); with no
 * loss.term, every `loss` output's operand is seeded with 1.0.
 *
 * Does: (1) a forward dependency analysis marks the values that depend on
 * a float param through differentiable ops; only those get gradients, so no
 * dead backward is emitted.  (2) A reverse sweep over the forward ops, in
 * reverse list order, runs each op's derivative rule (the `derivative`
 * column of ops.def, in autodiff_rules.c) once its result's gradient is
 * complete; rules hand operand contributions to ad_accum, which sums
 * fan-out with `add`.
 *
 * Guarantees: backward ops follow the forward ops; then, for every float
 * param that received a gradient, one `grad %dW {name="W"}` output whose
 * value is named "d" + the param's name and has the param's type.  Params
 * reached only through detach (or not at all) get no `grad` op.  A function
 * that already has a `grad` output is left unchanged. */
#include <string.h>

#include "passes.h"

struct AdCtx {
  IrFunc *f;
  int nfwd;        /* values that existed before the pass (forward values) */
  bool *needs;     /* by value id < nfwd: depends on a float param differentiably */
  IrValue **grad;  /* by value id < nfwd: accumulated gradient, NULL if none yet */
  IrLoc loc;       /* location of the op whose rule runs (for fan-out adds) */
};

static const AdGradFn rules[IR_OP_COUNT] = {
#define OP(id, name, arity, kind, family, shape, grad, flags) [IR_OP_##id] = ad_grad_##grad,
#include "ir/ops.def"
#undef OP
};

static const char *const rule_names[IR_OP_COUNT] = {
#define OP(id, name, arity, kind, family, shape, grad, flags) [IR_OP_##id] = #grad,
#include "ir/ops.def"
#undef OP
};

/* Does a gradient flow through this op at all (derivative column not `none`)? */
static bool differentiable(IrOpcode opc) { return strcmp(rule_names[opc], "none") != 0; }

IrFunc *ad_func(AdCtx *ad) { return ad->f; }

bool ad_needs_grad(const AdCtx *ad, const IrValue *x) { return x->id < ad->nfwd && ad->needs[x->id]; }

void ad_accum(AdCtx *ad, IrValue *x, IrValue *contribution) {
  if (!ir_dtype_is_float(x->type.dtype) || !ad_needs_grad(ad, x)) return;
  if (!ir_type_eq(&x->type, &contribution->type)) {
    char a[IR_TYPE_STR_MAX], b[IR_TYPE_STR_MAX];
    fprintf(stderr, "gradc: internal error: autodiff: gradient of %s value gets a %s contribution\n",
            ir_type_str(&x->type, a, sizeof a), ir_type_str(&contribution->type, b, sizeof b));
    GRADC_ASSERT(!"ad_accum: contribution type differs from the value's");
  }
  IrValue **g = &ad->grad[x->id];
  *g = *g ? ir_binary(ad->f, IR_OP_ADD, *g, contribution, ad->loc) : contribution;
}

/* needs[v]: v is a float param, or a float result of a differentiable op
 * with an operand that needs a gradient.  Definitions precede uses, so one
 * pass in list order suffices. */
static void mark_needs(AdCtx *ad) {
  IrFunc *f = ad->f;
  for (int i = 0; i < f->nargs; i++) {
    IrValue *a = f->args[i];
    ad->needs[a->id] = a->role == IR_ARG_PARAM && ir_dtype_is_float(a->type.dtype);
  }
  for (int i = 0; i < f->nops; i++) {
    IrOp *op = f->ops[i];
    if (!op->result || !ir_dtype_is_float(op->result->type.dtype) || !differentiable(op->opcode)) continue;
    for (int j = 0; j < op->nargs; j++)
      if (ad_needs_grad(ad, op->args[j])) {
        ad->needs[op->result->id] = true;
        break;
      }
  }
}

/* Seed gradient(x) += v, v cast and broadcast to x's type. */
static void seed(AdCtx *ad, IrValue *x, IrValue *v, IrLoc loc) {
  if (!ad_needs_grad(ad, x)) return;
  ad->loc = loc;
  v = ir_cast(ad->f, v, x->type.dtype, loc);
  v = ir_broadcast(ad->f, v, x->type.shape, loc);
  ad_accum(ad, x, v);
}

PassResult pass_autodiff(IrFunc *f, const PassOptions *o, Arena *scratch) {
  (void)o;
  for (int i = 0; i < f->nops; i++)
    if (f->ops[i]->opcode == IR_OP_GRAD) return PASS_UNCHANGED;

  AdCtx ad = {.f = f, .nfwd = f->nvalues};
  ad.needs = ARENA_ARRAY(scratch, bool, ad.nfwd > 0 ? ad.nfwd : 1);
  ad.grad = ARENA_ARRAY(scratch, IrValue *, ad.nfwd > 0 ? ad.nfwd : 1);
  mark_needs(&ad);

  int nfwd_ops = f->nops;
  bool has_terms = false;
  for (int i = 0; i < nfwd_ops; i++)
    if (f->ops[i]->opcode == IR_OP_LOSS_TERM) has_terms = true;

  /* Seeds: the objective's terms, or every reported loss with weight 1. */
  for (int i = 0; i < nfwd_ops; i++) {
    IrOp *op = f->ops[i];
    if (has_terms && op->opcode == IR_OP_LOSS_TERM) {
      seed(&ad, op->args[0], op->args[1], op->loc);
    } else if (!has_terms && op->opcode == IR_OP_LOSS) {
      IrValue *x = op->args[0];
      if (ad_needs_grad(&ad, x)) seed(&ad, x, ir_const_shaped(f, 1.0, x->type, op->loc), op->loc);
    }
  }

  /* Reverse sweep: when op i is reached every use of its result (all later
   * in the list) has contributed, so its gradient is complete. */
  for (int i = nfwd_ops - 1; i >= 0; i--) {
    IrOp *op = f->ops[i];
    if (!op->result || !ad_needs_grad(&ad, op->result)) continue;
    IrValue *dy = ad.grad[op->result->id];
    if (!dy) continue;
    ad.loc = op->loc;
    rules[op->opcode](&ad, op, dy);
  }

  /* Outputs: one `grad` per float param with a gradient. */
  bool changed = false;
  for (int i = 0; i < f->nargs; i++) {
    IrValue *p = f->args[i];
    if (p->role != IR_ARG_PARAM || !ad_needs_grad(&ad, p) || !ad.grad[p->id]) continue;
    IrValue *g = ad.grad[p->id];
    const char *pname = p->name ? p->name : "";
    /* A function argument (a seed passed straight through) keeps its name. */
    if (g->def) g->name = arena_printf(&f->arena, "d%s", pname);
    IrAttr a = ir_attr_str("name", pname);
    IrLoc noloc = {0};
    ir_emit(f, IR_OP_GRAD, &g, 1, &a, 1, NULL, noloc);
    changed = true;
  }
  return changed || f->nops != nfwd_ops ? PASS_CHANGED : PASS_UNCHANGED;
}
