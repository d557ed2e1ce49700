/* kernel_row.c - the plan of a row kernel (docs/BACKEND.md): what each op
 * of the kernel does over a row, and the order of the passes over the row.
 *
 * A row kernel runs, for each row of its space (kp_row_layout),
 *
 *   section 0; loop 0 over the row's columns; section 1; loop 1; ...
 *
 * An op whose operands are available after section a (a value computed in
 * loop a - 1, or a per-row value of section a) runs in loop a (or, a
 * per-row elementwise op, in section a).  A reduction accumulates in a
 * loop and is finished in the next section; softmax, log_softmax,
 * logsumexp and cross_entropy take the row maximum in one loop and the
 * sum of exponentials around it in the next; a norm the mean, then the
 * sum of squared deviations (or only the sum of squares); the normalised
 * values come in the loop after their statistics.  A column sum adds each
 * element of its operand, in the operand's loop, to its column's total over
 * the group of rows it sums (KpRowLayout.group), and is written when the
 * group's last row is done; nothing in the kernel reads it.  Both code generators
 * emit this schedule: the CPU one keeps values between loops in row
 * scratch, the CUDA one computes them again where a loop needs them. */
#include <string.h>

#include "kernel.h"

static int maxi(int a, int b) { return a > b ? a : b; }

static int slot_of(const KpRowLayout *l, const IrValue *v) {
  for (int i = 0; i < l->nslots; i++)
    if (l->slots[i].v == v) return i;
  return -1;
}

/* The passes of step p, whose first operand is available after section
 * ax and all its operands after section a. */
static void schedule(KpRowStep *p, int ax, int a) {
  switch (p->kind) {
  case KP_ROW_EW:
  case KP_ROW_ONEHOT:
  case KP_ROW_EMB:
  case KP_ROW_CMASK:
  case KP_ROW_UNSLICE:
  case KP_ROW_RAND: p->pass[0] = p->at = a; break;
  case KP_ROW_RED:
    p->pass[0] = ax;
    p->fin[0] = p->at = ax + 1;
    break;
  case KP_ROW_COLSUM: /* accumulated in a loop; written when its group of rows is done */
    p->pass[0] = ax;
    p->at = ax + 1;
    break;
  case KP_ROW_LSE: /* the maximum, then the sum of exponentials */
    p->pass[0] = ax;
    p->fin[0] = p->pass[1] = ax + 1;
    p->fin[1] = p->at = ax + 2;
    break;
  case KP_ROW_SOFTMAX: /* ... then the output */
    p->pass[0] = ax;
    p->fin[0] = p->pass[1] = ax + 1;
    p->fin[1] = p->pass[2] = p->at = ax + 2;
    break;
  case KP_ROW_LN: /* the mean, the variance around it, the output */
    p->pass[0] = ax;
    p->fin[0] = p->pass[1] = ax + 1;
    p->fin[1] = ax + 2;
    p->pass[2] = p->at = maxi(ax + 2, a);
    break;
  case KP_ROW_RMS: /* the mean square, the output */
    p->pass[0] = ax;
    p->fin[0] = ax + 1;
    p->pass[2] = p->at = maxi(ax + 1, a);
    break;
  case KP_ROW_CE: /* as logsumexp; the row loss once the target is there */
    p->pass[0] = ax;
    p->fin[0] = p->pass[1] = ax + 1;
    p->fin[1] = p->at = maxi(ax + 2, a);
    break;
  case KP_ROW_NONE: break;
  }
}

bool kp_row_plan(const KpRowLayout *l, IrOp *const *ops, int n, Arena *a, KpRowPlan *out) {
  memset(out, 0, sizeof *out);
  out->l = l;
  out->n = n;
  out->steps = ARENA_ARRAY(a, KpRowStep, n ? n : 1);
  int ns = l->nslots ? l->nslots : 1;
  out->def = ARENA_ARRAY(a, int, ns);
  out->at = ARENA_ARRAY(a, int, ns);
  out->konst = ARENA_ARRAY(a, bool, ns);
  out->cval = ARENA_ARRAY(a, double, ns);
  for (int i = 0; i < l->nslots; i++) {
    const KpSlot *s = &l->slots[i];
    const IrValue *v = s->v;
    out->def[i] = -1;
    if (!s->defined && v->def && v->def->opcode == IR_OP_CONST && v->def->group == 0) {
      out->konst[i] = true;
      out->cval[i] = ir_attr_get_float(v->def, "value", 0.0);
    }
  }
  bool ok = true;
  for (int k = 0; k < n; k++) {
    KpRowStep *p = &out->steps[k];
    const IrOp *op = ops[k];
    p->op = op;
    p->kind = kp_op_row_kind(op);
    p->pass[0] = p->pass[1] = p->pass[2] = p->fin[0] = p->fin[1] = -1;
    p->y = slot_of(l, op->result);
    int all = 0; /* when all operands are available */
    for (int i = 0; i < 3; i++) {
      bool gathered = (p->kind == KP_ROW_EMB && i == 1) || p->kind == KP_ROW_UNSLICE || p->kind == KP_ROW_RAND;
      p->x[i] = i < op->nargs && !gathered ? slot_of(l, op->args[i]) : -1;
      if (p->x[i] >= 0) all = maxi(all, out->at[p->x[i]]);
    }
    if (p->kind == KP_ROW_NONE || p->y < 0) ok = false;
    schedule(p, p->x[0] >= 0 ? out->at[p->x[0]] : 0, all);
    if (p->y >= 0) {
      out->def[p->y] = k;
      out->at[p->y] = p->at;
    }
  }
  return ok;
}
