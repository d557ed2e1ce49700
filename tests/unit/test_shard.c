/* test_shard.c - the shard pass (tensor parallelism, --tp).
 *
 * Numerical equivalence without a multi-process runtime: the sharded
 * program is evaluated for every rank with the reference interpreter (exact
 * f64) in lock-step.  Each round runs every rank's program up to the
 * collectives whose operands are ready (a copy of the program in which the
 * collectives already done are inputs holding their results, and what
 * depends on one not done yet is removed), then performs those collectives
 * across the ranks (sum, concatenation, sum-and-chunk).  The losses on every
 * rank, the replicated params' gradients on every rank and the sharded
 * params' gradients gathered along their split axis must equal the
 * single-process program's.  Then: the collectives sit where Megatron puts
 * them, params get their local types, and what cannot be lowered is an
 * error at the annotation. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "passes/passes.h"
#include "runtime/runtime.h"
#include "testutil.h"

enum { MAXR = 4 };

/* ------------------------------------------------------------------ */
/* Compiling                                                           */
/* ------------------------------------------------------------------ */

/* A deep copy of f through its text form. */
static IrFunc *clone(const IrFunc *f) {
  StrBuf sb;
  sb_init(&sb);
  ir_print(f, &sb);
  SrcFile src = {"clone.gir", sb_str(&sb), sb.len};
  Diag d;
  diag_init(&d, NULL);
  d.quiet = true;
  IrFunc *g = ir_read(&src, &d);
  if (!g) fail_msg("re-reading the IR failed:\n%s\n%s", sb_str(&d.log), sb_str(&sb));
  diag_free(&d);
  sb_free(&sb);
  return g;
}

/* Run shard (with tp, sequence_parallel) and then `rest` on a copy of m's
 * forward function, verifying after every pass.  Returns the function, or
 * NULL on a user error (diagnostics in d). */
static IrFunc *pipeline_k(FeModel *m, int gas, int tp, bool sp, const char *const *rest, int nrest, Diag *d) {
  IrFunc *f = clone(m->func);
  /* The copy lost the annotations' locations (not in the text form). */
  for (int i = 0; i < f->nargs; i++) f->args[i]->split_loc = m->func->args[i]->split_loc;
  PassOptions o = {.gas = gas, .diag = d, .src = &m->src, .tp = tp, .sequence_parallel = sp};
  PassManager pm;
  pm_init(&pm);
  pm.verify = true;
  const char *names[16] = {"shard"};
  for (int i = 0; i < nrest; i++) names[i + 1] = rest[i];
  int rc = pm_run(&pm, f, names, nrest + 1, &o);
  if (rc == 2) fail_msg("internal error in the pipeline");
  if (rc != 0) {
    ir_func_free(f);
    return NULL;
  }
  return f;
}

static IrFunc *pipeline(FeModel *m, int tp, bool sp, const char *const *rest, int nrest, Diag *d) {
  return pipeline_k(m, 1, tp, sp, rest, nrest, d);
}

static const char *const TRAIN[] = {"gas-fold", "autodiff", "simplify", "cse", "dce"};
#define NTRAIN 5

static FeModel *load(const char *rel, Diag *d, char **text) {
  *text = tu_read(rel);
  FeModel *m = tu_compile(rel, *text, 1, d);
  if (!m) fail_msg("%s: %s", rel, sb_str(&d->log));
  return m;
}

/* ------------------------------------------------------------------ */
/* Evaluation                                                          */
/* ------------------------------------------------------------------ */

/* Evaluate f on args in exact f64 (count phase for window sums first). */
static void eval(const IrFunc *f, double *const *args, InterpState *st) {
  char err[512] = "";
  InterpOptions opt = {.exact_f64 = true};
  double **ws = calloc((size_t)f->nvalues + 1, sizeof *ws);
  InterpState cs = {0};
  if (!interp_run(&cs, f, args, NULL, INTERP_COUNT, &opt, err, sizeof err)) fail_msg("count phase: %s", err);
  for (int i = 0; i < f->nops; i++) {
    const IrOp *op = f->ops[i];
    if (op->opcode != IR_OP_WINDOW_SUM) continue;
    int64_t n = ir_numel(&op->result->type.shape);
    ws[op->result->id] = calloc((size_t)(n ? n : 1), sizeof(double));
    memcpy(ws[op->result->id], cs.val[op->args[0]->id], sizeof(double) * (size_t)n);
  }
  interp_free(&cs);
  memset(st, 0, sizeof *st);
  bool ok = interp_run(st, f, args, ws, INTERP_STEP, &opt, err, sizeof err);
  for (int i = 0; i < f->nvalues; i++) free(ws[i]);
  free(ws);
  if (!ok) fail_msg("interp_run: %s", err);
}

/* Sizes around axis a: outer (before), d (the axis), inner (after). */
static void split3(const IrShape *s, int a, int64_t *outer, int64_t *d, int64_t *inner) {
  *outer = *inner = 1;
  for (int i = 0; i < a; i++) *outer *= s->dim[i];
  for (int i = a + 1; i < s->rank; i++) *inner *= s->dim[i];
  *d = s->dim[a];
}

/* Chunk r of T of x (whole shape s) along axis a (malloc'd). */
static double *chunk(const double *x, const IrShape *s, int a, int T, int r) {
  int64_t o, D, in;
  split3(s, a, &o, &D, &in);
  int64_t d = D / T;
  double *y = malloc(sizeof(double) * (size_t)(o * d * in + 1));
  for (int64_t i = 0; i < o; i++)
    for (int64_t j = 0; j < d; j++)
      memcpy(y + (i * d + j) * in, x + (i * D + r * d + j) * in, sizeof(double) * (size_t)in);
  return y;
}

/* The T chunks xs (each of shape s, local) joined along axis a (malloc'd). */
static double *concat(double *const *xs, const IrShape *s, int a, int T) {
  int64_t o, d, in;
  split3(s, a, &o, &d, &in);
  double *y = malloc(sizeof(double) * (size_t)(o * d * T * in + 1));
  for (int r = 0; r < T; r++)
    for (int64_t i = 0; i < o; i++)
      for (int64_t j = 0; j < d; j++)
        memcpy(y + (i * d * T + r * d + j) * in, xs[r] + (i * d + j) * in, sizeof(double) * (size_t)in);
  return y;
}

/* What one rank's program (or the single-process one) outputs. */
typedef struct Outs {
  int nloss, ngrad;
  const char *loss_name[16], *grad_name[64];
  double loss[16];
  double *grad[64];
  IrShape grad_shape[64];
} Outs;

static void collect(const IrFunc *f, const InterpState *st, Outs *out) {
  memset(out, 0, sizeof *out);
  for (int i = 0; i < f->nops; i++) {
    const IrOp *op = f->ops[i];
    if (op->opcode == IR_OP_LOSS && out->nloss < 16) {
      out->loss_name[out->nloss] = strdup(ir_attr_get_str(op, "name", "?"));
      out->loss[out->nloss++] = st->val[op->args[0]->id][0];
    }
    if (op->opcode == IR_OP_GRAD && out->ngrad < 64) {
      const IrShape *s = &op->args[0]->type.shape;
      int64_t n = ir_numel(s);
      out->grad_name[out->ngrad] = strdup(ir_attr_get_str(op, "name", "?"));
      out->grad_shape[out->ngrad] = *s;
      out->grad[out->ngrad] = malloc(sizeof(double) * (size_t)(n + 1));
      memcpy(out->grad[out->ngrad++], st->val[op->args[0]->id], sizeof(double) * (size_t)n);
    }
  }
}

static void outs_free(Outs *o) {
  for (int i = 0; i < o->ngrad; i++) free(o->grad[i]), free((char *)o->grad_name[i]);
  for (int i = 0; i < o->nloss; i++) free((char *)o->loss_name[i]);
}

/* Rank r's program: its rank-dependent copies (tp.scatter, rank.slice,
 * rank.concat) become the slice or concat they are on rank r. */
static void bind_rank(IrFunc *g, int T, int r) {
  for (int k = 0; k < g->nops; k++) {
    IrOp *op = g->ops[k];
    if (op->opcode != IR_OP_TP_SCATTER && op->opcode != IR_OP_RANK_SLICE && op->opcode != IR_OP_RANK_CONCAT) continue;
    assert_int_equal(ir_attr_get_int(op, "ranks", 0), T);
    int axis = (int)ir_attr_get_int(op, "axis", -1);
    if (op->opcode == IR_OP_RANK_CONCAT) {
      /* Operand j goes to chunk (r + j) mod T: position p holds operand (p - r) mod T. */
      assert_int_equal(op->nargs, T);
      IrValue **a = ARENA_ARRAY(&g->arena, IrValue *, T);
      for (int p = 0; p < T; p++) a[p] = op->args[((p - r) % T + T) % T];
      op->args = a;
      IrAttr *at = ARENA_ARRAY(&g->arena, IrAttr, 1);
      at[0] = ir_attr_int("axis", axis);
      op->attrs = at;
      op->nattrs = 1;
      op->opcode = IR_OP_CONCAT;
      continue;
    }
    const IrShape *x = &op->args[0]->type.shape;
    int c = (r + (int)ir_attr_get_int(op, "shift", 0)) % T;
    int64_t *v = ARENA_ARRAY(&g->arena, int64_t, 3 * x->rank);
    for (int i = 0; i < x->rank; i++) {
      v[i] = 0;
      v[x->rank + i] = x->dim[i];
      v[2 * x->rank + i] = 1;
    }
    v[axis] = c * (x->dim[axis] / T);
    v[x->rank + axis] = (c + 1) * (x->dim[axis] / T);
    IrAttr *at = ARENA_ARRAY(&g->arena, IrAttr, 3);
    at[0] = ir_attr_ints("starts", v, x->rank);
    at[1] = ir_attr_ints("stops", v + x->rank, x->rank);
    at[2] = ir_attr_ints("steps", v + 2 * x->rank, x->rank);
    op->attrs = at;
    op->nattrs = 3;
    op->opcode = IR_OP_SLICE;
  }
}

typedef struct LockStep {
  int rounds;       /* rounds of collectives */
  int collectives;  /* collectives performed (each across all ranks) */
} LockStep;

/* Run the sharded program sf on T ranks (args[r][i]: rank r's f->args[i])
 * in lock-step; out[r] gets each rank's outputs. */
static LockStep run_ranks(const IrFunc *sf, int T, double ***args, Outs *out) {
  int n = sf->nops;
  int *wait_of = calloc((size_t)n, sizeof(int));
  bool *done = calloc((size_t)n, sizeof(bool));
  double ***res = calloc((size_t)n, sizeof(double **)); /* by wait index: per-rank results */
  for (int k = 0; k < n; k++) {
    wait_of[k] = -1;
    IrOpcode oc = sf->ops[k]->opcode;
    if (oc != IR_OP_ALL_REDUCE_START && oc != IR_OP_ALL_GATHER_START && oc != IR_OP_REDUCE_SCATTER_START) continue;
    for (int w = k + 1; w < n; w++)
      if (sf->ops[w]->nargs == 1 && sf->ops[w]->args[0] == sf->ops[k]->result) wait_of[k] = w;
    assert_true(wait_of[k] > k);
  }
  LockStep ls = {0, 0};
  for (;;) {
    double ***in = calloc((size_t)n, sizeof(double **)); /* by start index: per-rank operands */
    int pending = 0, ready = 0;
    for (int r = 0; r < T; r++) {
      IrFunc *g = clone(sf);
      GRADC_ASSERT(g->nops == n);
      bind_rank(g, T, r);
      int nargs0 = g->nargs;
      double **ga = calloc((size_t)(nargs0 + n + 1), sizeof(double *));
      memcpy(ga, args[r], sizeof(double *) * (size_t)nargs0);
      int nv0 = g->nvalues;
      bool *dead = calloc((size_t)nv0 + 1, sizeof(bool));
      IrOp **ops = malloc(sizeof(IrOp *) * (size_t)n);
      memcpy(ops, g->ops, sizeof(IrOp *) * (size_t)n);
      for (int k = 0; k < n; k++) {
        IrOp *op = ops[k];
        if (wait_of[k] >= 0 && done[k]) {
          IrOp *w = ops[wait_of[k]];
          char name[32];
          snprintf(name, sizeof name, "lockstep.%d", k);
          IrValue *a = ir_func_add_arg(g, name, w->result->type, IR_ARG_INPUT, false);
          ga[g->nargs - 1] = res[wait_of[k]][r];
          ir_replace_uses(g, w->result, a);
          op->mark = w->mark = 1;
          continue;
        }
        bool d = false;
        for (int j = 0; j < op->nargs; j++) d |= op->args[j]->id < nv0 && dead[op->args[j]->id];
        if (wait_of[k] >= 0 && !done[k]) {
          pending += r == 0;
          if (!d) ready += r == 0;
          d = true;
        }
        if (d) {
          op->mark = 1;
          if (op->result && op->result->id < nv0) dead[op->result->id] = true;
        }
      }
      ir_func_remove_marked(g);
      InterpState st;
      eval(g, ga, &st);
      for (int k = 0; k < n; k++) {
        if (wait_of[k] < 0 || done[k]) continue;
        IrValue *x = ops[k]->args[0];
        if (!st.val[x->id]) continue; /* not ready */
        if (!in[k]) in[k] = calloc(MAXR, sizeof(double *));
        int64_t m = ir_numel(&x->type.shape);
        in[k][r] = malloc(sizeof(double) * (size_t)(m + 1));
        memcpy(in[k][r], st.val[x->id], sizeof(double) * (size_t)m);
      }
      if (pending == 0) collect(g, &st, &out[r]);
      interp_free(&st);
      free(ops);
      free(dead);
      free(ga);
      ir_func_free(g);
    }
    if (pending == 0) {
      free(in);
      break;
    }
    if (ready == 0) fail_msg("lock-step: %d collectives wait on each other", pending);
    ls.rounds++;
    /* Perform the ready collectives. */
    for (int k = 0; k < n; k++) {
      if (!in[k]) continue;
      const IrOp *op = sf->ops[k];
      const IrShape *s = &op->args[0]->type.shape;
      int64_t m = ir_numel(s);
      assert_int_equal(ir_attr_get_int(op, "ranks", 0), T);
      int axis = (int)ir_attr_get_int(op, "axis", 0);
      res[wait_of[k]] = calloc(MAXR, sizeof(double *));
      double *sum = calloc((size_t)m + 1, sizeof(double));
      for (int r = 0; r < T; r++)
        for (int64_t i = 0; i < m; i++) sum[i] += in[k][r][i];
      for (int r = 0; r < T; r++) {
        double *y = NULL;
        if (op->opcode == IR_OP_ALL_REDUCE_START) {
          y = malloc(sizeof(double) * (size_t)(m + 1));
          memcpy(y, sum, sizeof(double) * (size_t)m);
        } else if (op->opcode == IR_OP_ALL_GATHER_START) {
          y = concat(in[k], s, axis, T);
        } else {
          y = chunk(sum, s, axis, T, r);
        }
        res[wait_of[k]][r] = y;
      }
      free(sum);
      for (int r = 0; r < T; r++) free(in[k][r]);
      free(in[k]);
      done[k] = true;
      ls.collectives++;
    }
    free(in);
  }
  for (int k = 0; k < n; k++)
    if (res[k]) {
      for (int r = 0; r < T; r++) free(res[k][r]);
      free(res[k]);
    }
  free(res);
  free(done);
  free(wait_of);
  return ls;
}

static double rel_err(double a, double b) { return fabs(a - b) / (fabs(b) + 1e-6); }

/* Compare the model run on T ranks with one process (exact f64);
 * returns the worst relative error (a gradient's elements relative to its
 * largest) and the lock-step's figures. */
static double check_equivalence_sp(const char *rel, const char *text_or_null, int T, bool sp, LockStep *ls_out) {
  Diag d;
  char *text = NULL;
  FeModel *m;
  if (text_or_null) {
    m = tu_compile(rel, text_or_null, 1, &d);
    if (!m) fail_msg("%s", sb_str(&d.log));
  } else {
    m = load(rel, &d, &text);
  }
  IrFunc *ref = pipeline(m, 1, false, TRAIN, NTRAIN, &d);
  IrFunc *sf = pipeline(m, T, sp, TRAIN, NTRAIN, &d);
  if (!ref || !sf) fail_msg("%s: %s", rel, sb_str(&d.log));

  /* Whole inputs and params (params ~ N(0, 0.5^2), norm weights around 1). */
  StFile inputs;
  st_init(&inputs);
  rt_random_inputs(ref, 1, 42, &inputs);
  Rng rng;
  rng_seed(&rng, 7);
  int na = ref->nargs;
  double **whole = calloc((size_t)na, sizeof(double *));
  for (int i = 0; i < na; i++) {
    IrValue *a = ref->args[i];
    int64_t n = ir_numel(&a->type.shape);
    whole[i] = malloc(sizeof(double) * (size_t)(n + 1));
    if (a->role == IR_ARG_INPUT) {
      const StTensor *t = st_find(&inputs, a->name);
      assert_non_null(t);
      step_load(t, 0, n, whole[i]);
    } else {
      for (int64_t k = 0; k < n; k++) whole[i][k] = 0.5 * rng_normal(&rng);
    }
  }
  /* Each rank's args: its chunk of every sharded param. */
  double **rargs[MAXR];
  for (int r = 0; r < T; r++) {
    rargs[r] = calloc((size_t)na, sizeof(double *));
    for (int i = 0; i < na; i++) {
      IrValue *a = sf->args[i];
      assert_string_equal(a->name, ref->args[i]->name);
      rargs[r][i] = a->split_ranks > 1 ? chunk(whole[i], &ref->args[i]->type.shape, a->split_axis, T, r) : NULL;
      if (!rargs[r][i]) {
        int64_t n = ir_numel(&a->type.shape);
        rargs[r][i] = malloc(sizeof(double) * (size_t)(n + 1));
        memcpy(rargs[r][i], whole[i], sizeof(double) * (size_t)n);
      }
    }
  }
  InterpState st;
  eval(ref, whole, &st);
  Outs want;
  collect(ref, &st, &want);
  interp_free(&st);
  Outs got[MAXR];
  LockStep ls = run_ranks(sf, T, rargs, got);
  if (ls_out) *ls_out = ls;

  double worst = 0;
  for (int r = 0; r < T; r++) {
    assert_int_equal(got[r].nloss, want.nloss);
    assert_int_equal(got[r].ngrad, want.ngrad);
    for (int i = 0; i < want.nloss; i++) {
      assert_string_equal(got[r].loss_name[i], want.loss_name[i]);
      double e = rel_err(got[r].loss[i], want.loss[i]);
      if (e > 1e-10) fail_msg("%s rank %d: loss %s %.17g, want %.17g", rel, r, want.loss_name[i], got[r].loss[i], want.loss[i]);
      if (e > worst) worst = e;
    }
  }
  for (int g = 0; g < want.ngrad; g++) {
    IrValue *p = ir_func_find_arg(sf, want.grad_name[g]);
    assert_non_null(p);
    int64_t n = ir_numel(&want.grad_shape[g]);
    double *gathered[MAXR];
    bool sharded = p->split_ranks > 1;
    double *whole_g = NULL;
    if (sharded) {
      for (int r = 0; r < T; r++) {
        assert_string_equal(got[r].grad_name[g], want.grad_name[g]);
        gathered[r] = got[r].grad[g];
      }
      whole_g = concat(gathered, &got[0].grad_shape[g], p->split_axis, T);
    }
    double scale = 1e-3; /* k_b's gradient is zero up to rounding (softmax ignores it) */
    for (int64_t k = 0; k < n; k++) scale = fmax(scale, fabs(want.grad[g][k]));
    for (int r = 0; r < (sharded ? 1 : T); r++) {
      const double *x = sharded ? whole_g : got[r].grad[g];
      if (!sharded) assert_true(ir_shape_eq(&got[r].grad_shape[g], &want.grad_shape[g]));
      for (int64_t k = 0; k < n; k++) {
        double e = fabs(x[k] - want.grad[g][k]) / scale;
        if (e > 1e-10)
          fail_msg("%s: gradient of %s%s, element %lld: %.17g, want %.17g (rank %d)", rel, want.grad_name[g],
                   sharded ? " (gathered)" : "", (long long)k, x[k], want.grad[g][k], r);
        if (e > worst) worst = e;
      }
    }
    free(whole_g);
  }

  for (int r = 0; r < T; r++) {
    outs_free(&got[r]);
    for (int i = 0; i < na; i++) free(rargs[r][i]);
    free(rargs[r]);
  }
  outs_free(&want);
  for (int i = 0; i < na; i++) free(whole[i]);
  free(whole);
  st_free(&inputs);
  ir_func_free(ref);
  ir_func_free(sf);
  fe_model_free(m);
  diag_free(&d);
  free(text);
  return worst;
}

static double check_equivalence(const char *rel, const char *text_or_null, int T, LockStep *ls_out) {
  return check_equivalence_sp(rel, text_or_null, T, false, ls_out);
}

static int count(const IrFunc *f, IrOpcode oc) {
  int n = 0;
  for (int i = 0; i < f->nops; i++) n += f->ops[i]->opcode == oc;
  return n;
}

/* ------------------------------------------------------------------ */
/* Tests: numerical equivalence                                        */
/* ------------------------------------------------------------------ */

/* mlp: column-parallel W1 (+ b1), row-parallel W2, an L2 term over the
 * sharded W1: losses and gradients equal one process's. */
static void test_shard_mlp_matches_one_process(void **state) {
  (void)state;
  LockStep ls;
  double e = check_equivalence("tests/models/tp_mlp.gdl", NULL, 2, &ls);
  print_message("tp_mlp T=2: worst relative error %.3g, %d collectives in %d rounds\n", e, ls.collectives, ls.rounds);
  /* forward: the logits' and the L2 sum's all-reduces; backward: none
   * (the input x needs no gradient). */
  assert_int_equal(ls.collectives, 2);
}

static void test_shard_gpt_matches_one_process(void **state) {
  (void)state;
  LockStep ls;
  double e = check_equivalence("tests/models/tp_gpt.gdl", NULL, 2, &ls);
  print_message("tp_gpt T=2: worst relative error %.3g, %d collectives in %d rounds\n", e, ls.collectives, ls.rounds);
  /* L = 2 layers: 2 all-reduces forward and 2 backward per layer. */
  assert_int_equal(ls.collectives, 8);
}

static void test_shard_gpt_four_ranks(void **state) {
  (void)state;
  LockStep ls;
  double e = check_equivalence("tests/models/tp_gpt.gdl", NULL, 4, &ls);
  print_message("tp_gpt T=4: worst relative error %.3g\n", e);
  assert_int_equal(ls.collectives, 8);
}

/* Sequence parallelism (Megatron-SP with nanotron's split-shard matmul). */
static void test_shard_sp_gpt_matches_one_process(void **state) {
  (void)state;
  for (int T = 2; T <= 4; T += 2) {
    LockStep ls;
    double e = check_equivalence_sp("tests/models/tp_gpt.gdl", NULL, T, true, &ls);
    print_message("tp_gpt SP T=%d: worst relative error %.3g, %d collectives in %d rounds\n", T, e, ls.collectives,
                  ls.rounds);
  }
}

static void test_shard_sp_mlp_matches_one_process(void **state) {
  (void)state;
  for (int T = 2; T <= 4; T += 2) {
    LockStep ls;
    double e = check_equivalence_sp("tests/models/tp_mlp.gdl", NULL, T, true, &ls);
    print_message("tp_mlp SP T=%d: worst relative error %.3g, %d collectives in %d rounds\n", T, e, ls.collectives,
                  ls.rounds);
  }
}

/* Rules beyond the two models: an embedding split along its width feeding
 * a row-parallel matmul, a replicated param scaling a sharded value
 * (tp.copy: its gradient is summed over ranks), a replicated scale param
 * broadcast along the sharded axis, a mean over a sharded axis (partial,
 * scaled by 1/T; a batch mean too, which gas-fold turns into a sum), a
 * sum over another axis, layer_norm of a batch-sharded value, reshape and
 * permute of a sharded axis. */
static const char misc_model[] =
    "model misc {\n"
    "  batch B = 4\n"
    "  dim D = 6\n"
    "  dim H = 8\n"
    "  dim V = 10\n"
    "  input idx : i32[B]\n"
    "  input y : i32[B]\n"
    "  param emb : f32[V, D] split(1)\n"
    "  param W1 : f32[D, H] split(0)\n"
    "  param g : f32[H]\n"
    "  param W2 : f32[H, H] split(1)\n"
    "  param s : f32[1]\n"
    "  param W3 : f32[H, V] split(0)\n"
    "  param P : f32[2, H, 4] split(0)\n"
    "  param lw : f32[4]\n"
    "  param lb : f32[4]\n"
    "  h = embedding(idx, emb) @ W1\n"
    "  u = tanh((h * g) @ W2) * s\n"
    "  r = reshape(u, [B, 2, H / 2])\n"
    "  r = permute(r, [1, 0, 2])\n"
    "  logits = u @ W3\n"
    "  z = layer_norm(h @ P, lw, lb)\n"
    "  loss ce = cross_entropy(logits, y)\n"
    "  loss pen = mean(W2 * W2) + sum(mean(r, axis=2) ** 2) + sum(z * z) * 0.01\n"
    "  loss m = mean(u)\n"
    "}\n";

static void test_shard_rules_match_one_process(void **state) {
  (void)state;
  double e = check_equivalence("misc.gdl", misc_model, 2, NULL);
  print_message("misc T=2: worst relative error %.3g\n", e);
}

/* ------------------------------------------------------------------ */
/* Tests: the IR                                                       */
/* ------------------------------------------------------------------ */

/* Local types, split_ranks, and the collectives' places for tp_mlp. */
static void test_shard_mlp_ir(void **state) {
  (void)state;
  Diag d;
  char *text;
  FeModel *m = load("tests/models/tp_mlp.gdl", &d, &text);
  IrFunc *f = pipeline(m, 2, false, NULL, 0, &d);
  assert_non_null(f);
  IrValue *W1 = ir_func_find_arg(f, "W1"), *b1 = ir_func_find_arg(f, "b1"), *W2 = ir_func_find_arg(f, "W2");
  int64_t w1[] = {12, 8}, bb[] = {8}, w2[] = {8, 10};
  assert_true(ir_shape_eq(&W1->type.shape, &(IrShape){2, {w1[0], w1[1]}}));
  assert_true(ir_shape_eq(&b1->type.shape, &(IrShape){1, {bb[0]}}));
  assert_true(ir_shape_eq(&W2->type.shape, &(IrShape){2, {w2[0], w2[1]}}));
  assert_int_equal(W1->split_ranks, 2);
  assert_int_equal(W2->split_ranks, 2);
  assert_int_equal(count(f, IR_OP_ALL_REDUCE_START), 2);
  assert_int_equal(count(f, IR_OP_ALL_REDUCE_WAIT), 2);
  assert_int_equal(count(f, IR_OP_TP_COPY), 0); /* x is an input: no gradient to sum */
  /* The row-parallel matmul is followed at once by its all-reduce, whose
   * wait carries the source name. */
  for (int i = 0; i < f->nops; i++) {
    IrOp *op = f->ops[i];
    if (op->opcode != IR_OP_MATMUL || op->args[1] != W2) continue;
    assert_int_equal(f->ops[i + 1]->opcode, IR_OP_ALL_REDUCE_START);
    assert_int_equal(f->ops[i + 2]->opcode, IR_OP_ALL_REDUCE_WAIT);
    assert_string_equal(f->ops[i + 2]->result->name, "logits");
    assert_string_equal(ir_attr_get_str(f->ops[i + 1], "group", ""), "tp");
    assert_int_equal(ir_attr_get_int(f->ops[i + 1], "ranks", 0), 2);
  }
  ir_func_free(f);
  fe_model_free(m);
  diag_free(&d);
  free(text);
}

/* tp_gpt: one tp.copy per layer norm output feeding the column-parallel
 * matmuls (q, k, v share it), all-reduces after proj and fcp. */
static void test_shard_gpt_ir(void **state) {
  (void)state;
  Diag d;
  char *text;
  FeModel *m = load("tests/models/tp_gpt.gdl", &d, &text);
  IrFunc *f = pipeline(m, 2, false, NULL, 0, &d);
  assert_non_null(f);
  assert_int_equal(count(f, IR_OP_TP_COPY), 4);
  assert_int_equal(count(f, IR_OP_ALL_REDUCE_START), 4);
  for (int i = 0; i < f->nops; i++) {
    IrOp *op = f->ops[i];
    if (op->opcode == IR_OP_TP_COPY) assert_int_equal(op->args[0]->def->opcode, IR_OP_LAYER_NORM);
    if (op->opcode == IR_OP_ALL_REDUCE_START) assert_int_equal(op->args[0]->def->opcode, IR_OP_MATMUL);
  }
  /* Heads: [B, T, C/2] -> [B, T, NH/2, HD]. */
  IrValue *q = NULL;
  for (int i = 0; i < f->nvalues; i++)
    if (f->values[i]->name && strcmp(f->values[i]->name, "q") == 0) q = f->values[i];
  assert_non_null(q);
  assert_int_equal(q->type.shape.dim[1], 2);
  assert_int_equal(q->type.shape.dim[3], 4);
  ir_func_free(f);
  /* After autodiff and simplify: the tp.copy's became backward all-reduces. */
  f = pipeline(m, 2, false, TRAIN, NTRAIN, &d);
  assert_int_equal(count(f, IR_OP_TP_COPY), 0);
  assert_int_equal(count(f, IR_OP_ALL_REDUCE_START), 8);
  ir_func_free(f);
  fe_model_free(m);
  diag_free(&d);
  free(text);
}

/* With K = 2 (tp_gpt) and K = 4 (tp_mlp) micro-batches gas-fold folds the sharded program's losses
 * (through the all-reduces) and the collectives stay as with K = 1. */
static void test_shard_with_gas(void **state) {
  (void)state;
  char *text = tu_read("tests/models/tp_gpt.gdl");
  Diag d;
  FeModel *m = tu_compile("tests/models/tp_gpt.gdl", text, 2, &d);
  assert_non_null(m);
  IrFunc *f = pipeline_k(m, 2, 2, false, TRAIN, NTRAIN, &d);
  if (!f) fail_msg("%s", sb_str(&d.log));
  assert_int_equal(count(f, IR_OP_ALL_REDUCE_START), 8);
  assert_int_equal(count(f, IR_OP_LOSS_TERM), 1);
  ir_func_free(f);
  fe_model_free(m);
  diag_free(&d);
  free(text);
  text = tu_read("tests/models/tp_mlp.gdl");
  m = tu_compile("tests/models/tp_mlp.gdl", text, 4, &d);
  assert_non_null(m);
  f = pipeline_k(m, 4, 2, false, TRAIN, NTRAIN, &d);
  if (!f) fail_msg("%s", sb_str(&d.log));
  assert_int_equal(count(f, IR_OP_ALL_REDUCE_START), 2);
  assert_int_equal(count(f, IR_OP_LOSS_TERM), 2);
  ir_func_free(f);
  fe_model_free(m);
  diag_free(&d);
  free(text);
}

/* --tp 1 changes nothing; a model without split(N) is unchanged by --tp 2. */
static void test_shard_noop(void **state) {
  (void)state;
  Diag d;
  char *text;
  FeModel *m = load("tests/models/tp_mlp.gdl", &d, &text);
  Arena a;
  arena_init(&a);
  PassOptions o = {.gas = 1, .diag = &d, .tp = 1};
  assert_int_equal(pass_shard(m->func, &o, &a), PASS_UNCHANGED);
  fe_model_free(m);
  free(text);
  diag_free(&d);
  text = tu_read("examples/mlp.gdl");
  m = tu_compile("mlp.gdl", text, 1, &d);
  o.tp = 2;
  assert_int_equal(pass_shard(m->func, &o, &a), PASS_UNCHANGED);
  arena_free(&a);
  fe_model_free(m);
  free(text);
  diag_free(&d);
}

/* ------------------------------------------------------------------ */
/* Tests: errors at the annotation                                     */
/* ------------------------------------------------------------------ */

/* Compile `body` inside a model with x : f32[B, 8], and shard with --tp 2;
 * the whole diagnostic log must be `want`. */
static void expect_error(const char *body, const char *want) {
  char text[2048];
  snprintf(text, sizeof text,
           "model e {\n"
           "  batch B = 4\n"
           "  input x : f32[B, 8]\n"
           "  input y : i32[B]\n"
           "%s"
           "}\n",
           body);
  Diag d;
  FeModel *m = tu_compile("e.gdl", text, 1, &d);
  if (!m) fail_msg("frontend: %s", sb_str(&d.log));
  assert_null(pipeline(m, 2, false, NULL, 0, &d));
  if (strcmp(sb_str(&d.log), want) != 0) fail_msg("got:\n%s\nwant:\n%s", sb_str(&d.log), want);
  assert_int_equal(d.nerrors, 1);
  fe_model_free(m);
  diag_free(&d);
}

static void test_shard_error_not_divisible(void **state) {
  (void)state;
  expect_error("  param W : f32[8, 5] split(1)\n"
               "  loss l = sum(x @ W)\n",
               "e.gdl:5:29: error: split(1) of 'W' cannot be lowered: axis 1 of f32[8,5] is not divisible by --tp 2\n"
               "  param W : f32[8, 5] split(1)\n"
               "                            ^\n");
}

static void test_shard_error_vocab_parallel_cross_entropy(void **state) {
  (void)state;
  expect_error("  param W : f32[8, 6] split(1)\n"
               "  loss l = cross_entropy(x @ W, y)\n",
               "e.gdl:5:29: error: split(1) of 'W' cannot be lowered: 'cross_entropy' would see its logits split along "
               "the classes (vocab-parallel cross_entropy is not supported)\n"
               "  param W : f32[8, 6] split(1)\n"
               "                            ^\n"
               "e.gdl:6:12: note: at this 'cross_entropy'\n"
               "  loss l = cross_entropy(x @ W, y)\n"
               "           ^\n");
}

static void test_shard_error_row_without_column(void **state) {
  (void)state;
  expect_error("  param W : f32[8, 6] split(0)\n"
               "  loss l = sum(x @ W)\n",
               "e.gdl:5:29: error: split(0) of 'W' cannot be lowered: 'matmul' f32[4,8] @ f32[8,6] contracts over an "
               "axis sharded on one operand only (a row-parallel matmul needs its input sharded along the last axis, "
               "the output of a column-parallel one)\n"
               "  param W : f32[8, 6] split(0)\n"
               "                            ^\n"
               "e.gdl:6:18: note: at this 'matmul'\n"
               "  loss l = sum(x @ W)\n"
               "                 ^\n");
}

static void test_shard_error_bias_not_split(void **state) {
  (void)state;
  expect_error("  param W : f32[8, 6] split(1)\n"
               "  param b : f32[6]\n"
               "  loss l = sum(relu(x @ W + b))\n",
               "e.gdl:5:29: error: split(1) of 'W' cannot be lowered: 'add' combines a value sharded along axis 1 of "
               "f32[4,6] with the replicated f32[6], which is not broadcast along that axis (split that operand along "
               "the same axis)\n"
               "  param W : f32[8, 6] split(1)\n"
               "                            ^\n"
               "e.gdl:7:27: note: at this 'add'\n"
               "  loss l = sum(relu(x @ W + b))\n"
               "                          ^\n");
}

static void test_shard_error_softmax_over_shard(void **state) {
  (void)state;
  expect_error("  param W : f32[8, 6] split(1)\n"
               "  loss l = sum(softmax(x @ W, axis=-1) * 2)\n",
               "e.gdl:5:29: error: split(1) of 'W' cannot be lowered: 'softmax' of f32[4,6] runs over its sharded axis "
               "1\n"
               "  param W : f32[8, 6] split(1)\n"
               "                            ^\n"
               "e.gdl:6:16: note: at this 'softmax'\n"
               "  loss l = sum(softmax(x @ W, axis=-1) * 2)\n"
               "               ^\n");
}

static void test_shard_error_layer_norm_over_shard(void **state) {
  (void)state;
  expect_error("  param W : f32[8, 6] split(1)\n"
               "  param w : f32[6]\n"
               "  param b : f32[6]\n"
               "  loss l = sum(layer_norm(x @ W, w, b))\n",
               "e.gdl:5:29: error: split(1) of 'W' cannot be lowered: 'layer_norm' normalises f32[4,6] over its "
               "sharded last axis\n"
               "  param W : f32[8, 6] split(1)\n"
               "                            ^\n"
               "e.gdl:8:16: note: at this 'layer_norm'\n"
               "  loss l = sum(layer_norm(x @ W, w, b))\n"
               "               ^\n");
}

static void test_shard_error_vocab_parallel_embedding(void **state) {
  (void)state;
  expect_error("  param E : f32[10, 8] split(0)\n"
               "  loss l = sum(embedding(y, E))\n",
               "e.gdl:5:30: error: split(0) of 'E' cannot be lowered: 'embedding' with the table split along the "
               "vocabulary (vocab-parallel embedding) is not supported; split it along axis 1\n"
               "  param E : f32[10, 8] split(0)\n"
               "                             ^\n"
               "e.gdl:6:16: note: at this 'embedding'\n"
               "  loss l = sum(embedding(y, E))\n"
               "               ^\n");
}

static void test_shard_error_max_over_shard(void **state) {
  (void)state;
  expect_error("  param W : f32[8, 6] split(1)\n"
               "  loss l = max(x @ W)\n",
               "e.gdl:5:29: error: split(1) of 'W' cannot be lowered: 'max' reduces f32[4,6] over its sharded axis 1 "
               "(only sum and mean can)\n"
               "  param W : f32[8, 6] split(1)\n"
               "                            ^\n"
               "e.gdl:6:12: note: at this 'max'\n"
               "  loss l = max(x @ W)\n"
               "           ^\n");
}

static void test_shard_error_heads_not_divisible(void **state) {
  (void)state;
  expect_error("  param W : f32[8, 6] split(1)\n"
               "  loss l = sum(softmax(reshape(x @ W, [B, 3, 2]), axis=-1))\n",
               "e.gdl:5:29: error: split(1) of 'W' cannot be lowered: 'reshape' of f32[4,6] (sharded along axis 1) to "
               "f32[4,3,2]: the leading factor of the sharded axis is not divisible by --tp\n"
               "  param W : f32[8, 6] split(1)\n"
               "                            ^\n"
               "e.gdl:6:24: note: at this 'reshape'\n"
               "  loss l = sum(softmax(reshape(x @ W, [B, 3, 2]), axis=-1))\n"
               "                       ^\n");
}

static void test_shard_error_mismatched_axes(void **state) {
  (void)state;
  expect_error("  param A : f32[8, 6] split(1)\n"
               "  param C : f32[8, 6] split(0)\n"
               "  loss l = sum(x @ A * (x @ C))\n",
               "e.gdl:6:29: error: split(0) of 'C' cannot be lowered: 'matmul' f32[4,8] @ f32[8,6] contracts over an "
               "axis sharded on one operand only (a row-parallel matmul needs its input sharded along the last axis, "
               "the output of a column-parallel one)\n"
               "  param C : f32[8, 6] split(0)\n"
               "                            ^\n"
               "e.gdl:7:27: note: at this 'matmul'\n"
               "  loss l = sum(x @ A * (x @ C))\n"
               "                          ^\n");
}

/* The sequence-parallel program of tp_gpt after shard: per layer a
 * reduce-scatter along the sequence after proj and fcp, the column GEMMs
 * (q, k, v, fc; layer 0's attention still reads the replicated embedding)
 * as split-shard matmuls on one all-gather per input (the
 * local chunk's GEMM reads the gathered value not at all), the residual
 * stream scattered once, the logits gathered back for cross_entropy. */
static void test_shard_sp_gpt_ir(void **state) {
  (void)state;
  Diag d;
  char *text;
  FeModel *m = load("tests/models/tp_gpt.gdl", &d, &text);
  for (int T = 2; T <= 4; T += 2) {
    IrFunc *f = pipeline(m, T, true, NULL, 0, &d);
    assert_non_null(f);
    assert_int_equal(count(f, IR_OP_REDUCE_SCATTER_START), 4);
    assert_int_equal(count(f, IR_OP_ALL_REDUCE_START), 0);
    /* Layer 0's attention reads the replicated embedding (tp.copy as
     * without SP); the stream is scattered at its first residual add. */
    assert_int_equal(count(f, IR_OP_ALL_GATHER_START), 1 + 2 + 1);
    assert_int_equal(count(f, IR_OP_RANK_CONCAT), 5);
    assert_int_equal(count(f, IR_OP_RANK_SLICE), 5 * (T - 1));
    assert_int_equal(count(f, IR_OP_MATMUL) - count(f, IR_OP_RANK_SLICE), 2 * 8 + 1);
    assert_int_equal(count(f, IR_OP_TP_SCATTER), 1);
    for (int i = 0; i < f->nops; i++) {
      IrOp *op = f->ops[i];
      if (op->opcode == IR_OP_REDUCE_SCATTER_START) {
        assert_int_equal(ir_attr_get_int(op, "axis", -1), 1);
        assert_int_equal(op->args[0]->def->opcode, IR_OP_MATMUL);
      }
      if (op->opcode == IR_OP_RANK_CONCAT) {
        /* operand 0: the local GEMM on the sequence chunk this rank holds */
        IrOp *y0 = op->args[0]->def;
        assert_int_equal(y0->opcode, IR_OP_MATMUL);
        assert_int_equal(y0->args[0]->type.shape.dim[1], 8 / T);
        assert_int_not_equal(y0->args[0]->def->opcode, IR_OP_ALL_GATHER_WAIT);
        for (int j = 1; j < T; j++) {
          IrOp *sl = op->args[j]->def->args[0]->def;
          assert_int_equal(sl->opcode, IR_OP_RANK_SLICE);
          assert_int_equal(ir_attr_get_int(sl, "shift", -1), j);
          assert_int_equal(sl->args[0]->def->opcode, IR_OP_ALL_GATHER_WAIT);
        }
      }
      if (op->opcode == IR_OP_CROSS_ENTROPY) {
        IrOp *w = op->args[0]->def;
        assert_int_equal(w->opcode, IR_OP_ALL_GATHER_WAIT);
        assert_string_equal(ir_attr_get_str(w, "grad", ""), "scatter");
      }
    }
    ir_func_free(f);
  }
  fe_model_free(m);
  diag_free(&d);
  free(text);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_shard_mlp_matches_one_process),
      cmocka_unit_test(test_shard_gpt_matches_one_process),
      cmocka_unit_test(test_shard_gpt_four_ranks),
      cmocka_unit_test(test_shard_sp_gpt_matches_one_process),
      cmocka_unit_test(test_shard_sp_mlp_matches_one_process),
      cmocka_unit_test(test_shard_rules_match_one_process),
      cmocka_unit_test(test_shard_mlp_ir),
      cmocka_unit_test(test_shard_gpt_ir),
      cmocka_unit_test(test_shard_with_gas),
      cmocka_unit_test(test_shard_noop),
      cmocka_unit_test(test_shard_error_not_divisible),
      cmocka_unit_test(test_shard_error_vocab_parallel_cross_entropy),
      cmocka_unit_test(test_shard_error_row_without_column),
      cmocka_unit_test(test_shard_error_bias_not_split),
      cmocka_unit_test(test_shard_error_softmax_over_shard),
      cmocka_unit_test(test_shard_error_layer_norm_over_shard),
      cmocka_unit_test(test_shard_error_vocab_parallel_embedding),
      cmocka_unit_test(test_shard_error_max_over_shard),
      cmocka_unit_test(test_shard_error_heads_not_divisible),
      cmocka_unit_test(test_shard_error_mismatched_axes),
      cmocka_unit_test(test_shard_sp_gpt_ir),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
