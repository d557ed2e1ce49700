/* unslice_concat.c - `unslice-concat`: a sum of unslices that tile their
 * shape becomes a concat.
 *
 * The gradient of x[..., 0:C], x[..., C:2C], x[..., 2C:3C] (q, k and v cut
 * from one projection) comes out of autodiff as the sum of three unslices
 * into x's shape; a kernel adding them gathers every element from three
 * places.  When the unslices' ranges tile one axis (the other axes whole,
 * unit steps) the sum is a concat of their operands in range order: a
 * plain copy, or nothing when GEMMs write the parts in place (views).
 *
 * Requires: a verified function (runs before `fuse`, on ungrouped ops).
 * Guarantees: only a tree of adds (the root, then adds read once, all of
 * one type) whose leaves are unslices read once, cut along one axis with
 * unit steps and tiling it, is rewritten; the concat takes the root's
 * place and name, the adds and unslices go.  A sum that feeds a `grad`
 * stays (memplan splits it into contributions that accumulate in place,
 * each into its range: stacked params). */
#include <stdlib.h>

#include "kernel.h"
#include "passes.h"

typedef struct Part {
  IrOp *un;      /* the unslice */
  int64_t start; /* along the axis */
} Part;

static int part_cmp(const void *pa, const void *pb) {
  const Part *a = pa, *b = pb;
  return (a->start > b->start) - (a->start < b->start);
}

/* The leaves of the tree of adds at v (the root, then adds read once, of
 * v's type) into parts, its adds into adds; false past cap of either. */
static bool add_leaves(IrValue *v, bool root, const IrType *t, const int *uses, int nv, Part *parts, int *n,
                       IrOp **adds, int *na, int cap) {
  IrOp *d = v->def;
  if (d && d->opcode == IR_OP_ADD && v->id < nv && ir_type_eq(&v->type, t) && d->args[0] != d->args[1] &&
      (root || uses[v->id] == 1)) {
    if (*na == cap) return false;
    adds[(*na)++] = d;
    return add_leaves(d->args[0], false, t, uses, nv, parts, n, adds, na, cap) &&
           add_leaves(d->args[1], false, t, uses, nv, parts, n, adds, na, cap);
  }
  if (*n == cap) return false;
  parts[(*n)++] = (Part){d, 0};
  return true;
}

PassResult pass_unslice_concat(IrFunc *f, const PassOptions *o, Arena *scratch) {
  (void)o;
  int nv = f->nvalues;
  int *uses = ARENA_ARRAY(scratch, int, nv + 1);
  ir_count_uses(f, uses);
  for (int i = 0; i < f->nops; i++) f->ops[i]->mark = 0;
  enum { CAP = 64 };
  Part parts[CAP];
  IrOp *adds[CAP];
  bool changed = false;
  for (int i = f->nops - 1; i >= 0; i--) {
    IrOp *root = f->ops[i];
    if (root->opcode != IR_OP_ADD || root->mark || root->result->id >= nv) continue;
    const IrType *t = &root->result->type;
    /* A gradient's sum stays: memplan splits it into contributions that
     * accumulate in place, each into its range (stacked params). */
    bool to_grad = false;
    for (int k = i + 1; k < f->nops; k++)
      for (int j = 0; j < f->ops[k]->nargs; j++) to_grad |= f->ops[k]->args[j] == root->result && f->ops[k]->opcode == IR_OP_GRAD;
    if (to_grad) continue;
    int n = 0, na = 0;
    if (!add_leaves(root->result, true, t, uses, nv, parts, &n, adds, &na, CAP) || n < 2) continue;
    /* Every leaf an unslice read once, all cut along one axis. */
    int axis = -1;
    bool ok = true;
    for (int k = 0; ok && k < n; k++) {
      IrOp *u = parts[k].un;
      ok = u && u->opcode == IR_OP_UNSLICE && uses[u->result->id] == 1 && ir_type_eq(&u->result->type, t);
      if (!ok) break;
      int64_t start[IR_MAX_RANK], step[IR_MAX_RANK];
      kp_slice_ranges(u, &t->shape, start, step);
      const IrShape *ps = &u->args[0]->type.shape;
      for (int a = 0; ok && a < t->shape.rank; a++) {
        if (ps->dim[a] == t->shape.dim[a] && start[a] == 0 && step[a] == 1) continue;
        if (axis >= 0 && axis != a) ok = false;
        axis = a;
        ok = ok && step[a] == 1;
        parts[k].start = start[a];
      }
    }
    if (!ok || axis < 0) continue;
    qsort(parts, (size_t)n, sizeof(Part), part_cmp);
    int64_t at = 0;
    for (int k = 0; ok && k < n; k++) {
      ok = parts[k].start == at;
      at += parts[k].un->args[0]->type.shape.dim[axis];
    }
    if (!ok || at != t->shape.dim[axis]) continue;
    IrValue *args[CAP];
    for (int k = 0; k < n; k++) args[k] = parts[k].un->args[0];
    IrAttr attr = ir_attr_int("axis", axis);
    int before = f->nops;
    IrValue *cat = ir_emit(f, IR_OP_CONCAT, args, n, &attr, 1, NULL, root->loc);
    cat->name = root->result->name;
    rw_splice(f, i, before);
    ir_replace_uses(f, root->result, cat);
    /* The adds and the unslices go (the tree's adds are read only inside it). */
    for (int k = 0; k < n; k++) parts[k].un->mark = 1;
    for (int k = 0; k < na; k++) adds[k]->mark = 1;
    changed = true;
  }
  if (changed) ir_func_remove_marked(f);
  return changed ? PASS_CHANGED : PASS_UNCHANGED;
}

