/* test_state.c - the statement-level part of language v2 (DESIGN.md §2):
 * comparisons and conditions, compile-time `if` over dims and `training`,
 * several results, where and cast in the frontend; and buffers, their
 * window-reduction `update`s and whole-window `output`s end to end through
 * `gradc run`, `train` and checkpoints on the interpreter and the CPU back
 * end at --gas 1, 2 and 4 (and --dp 2 over MPI), against values derived by
 * hand here from the model's formulas (tests/cuda/state.gdl). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_dp.h"

/* ------------------------------------------------------------------ */
/* The frontend                                                        */
/* ------------------------------------------------------------------ */

static int count_ops(const IrFunc *f, IrOpcode opc) {
  int n = 0;
  for (int i = 0; i < f->nops; i++) n += f->ops[i]->opcode == opc;
  return n;
}

/* Whether `if COND` takes its first branch (which multiplies; the else
 * branch divides), with training as given. */
static bool taken(const char *cond, bool training) {
  char text[1024];
  snprintf(text, sizeof text,
           "model m {\n  dim D = 4\n  dim E = 3\n  input x : f32[D]\n  if %s {\n    x = x * 2\n  } else {\n"
           "    x = x / 2\n  }\n  loss l = sum(x)\n}\n",
           cond);
  Diag d;
  diag_init(&d, NULL);
  d.quiet = true;
  SrcFile src = {"t.gdl", text, strlen(text)};
  FeOptions o = {.gas = 1, .dp = 1, .no_training = !training};
  FeModel *m = fe_model_compile(&src, &o, &d);
  if (!m) fail_msg("%s: %s", cond, sb_str(&d.log));
  bool mul = count_ops(m->func, IR_OP_MUL) == 1, div = count_ops(m->func, IR_OP_DIV) == 1;
  assert_true(mul != div);
  fe_model_free(m);
  diag_free(&d);
  return mul;
}

static void test_state_conditions_have_python_precedence(void **state) {
  (void)state;
  /* not > and > or; comparisons looser than arithmetic. */
  assert_false(taken("not 1 > 2 and 2 > 3", true));        /* (not F) and F, not not (F and F) */
  assert_true(taken("1 > 2 and 2 > 3 or 3 > 2", true));    /* (F and F) or T, not F and (F or T) */
  assert_true(taken("not D == E", true));                  /* not (D == E) */
  assert_true(taken("D + 1 > D * 1", true));               /* 5 > 4 */
  assert_true(taken("D / 2 == 2 and E != 4", true));       /* exact integer division */
  assert_true(taken("D >= 4 and D <= 4 and E < D", true));
  assert_false(taken("2.5 > D", true));
  assert_true(taken("true == (not false)", true)); /* `==` binds tighter than `not`, as in Python */
  /* `training`: run, train and bench compile with it; no_training clears it. */
  assert_true(taken("training", true));
  assert_false(taken("training", false));
  assert_true(taken("not training or D == 4", false));
}

/* The model of a test, compiled (fails the test on errors). */
static FeModel *compile_text(const char *text, bool training) {
  Diag d;
  diag_init(&d, NULL);
  d.quiet = true;
  SrcFile src = {"t.gdl", text, strlen(text)};
  FeOptions o = {.gas = 1, .dp = 1, .no_training = !training};
  FeModel *m = fe_model_compile(&src, &o, &d);
  if (!m) fail_msg("%s", sb_str(&d.log));
  diag_free(&d);
  return m;
}

static void test_state_names_bound_in_if_stay_visible(void **state) {
  (void)state;
  FeModel *m = compile_text("model m {\n  input x : f32[3]\n  if training { h = x * 2 } else { h = x }\n"
                            "  loss l = sum(h * h)\n}\n",
                            true);
  assert_int_equal(count_ops(m->func, IR_OP_MUL), 2);
  fe_model_free(m);
  /* The untaken branch is not lowered, so it may be ill-shaped for these dims. */
  m = compile_text("model m {\n  dim D = 3\n  input x : f32[D]\n  if D == 4 { h = reshape(x, [2, 2]) } else { h = x }\n"
                   "  loss l = sum(h)\n}\n",
                   true);
  assert_int_equal(count_ops(m->func, IR_OP_RESHAPE), 0);
  fe_model_free(m);
}

static void test_state_several_results(void **state) {
  (void)state;
  FeModel *m = compile_text("fn two(a) {\n  return a + 1, 2 * a\n}\nmodel m {\n  input x : f32[3]\n"
                            "  p, q = two(x)\n  loss l = sum(p * q)\n}\n",
                            true);
  assert_int_equal(count_ops(m->func, IR_OP_ADD), 1);
  assert_int_equal(count_ops(m->func, IR_OP_MUL), 2); /* 2 * a, p * q */
  /* Each result is named after its binding. */
  bool p = false, q = false;
  for (int i = 0; i < m->func->nvalues; i++) {
    const char *n = m->func->values[i]->name;
    p |= n && strcmp(n, "p") == 0;
    q |= n && strcmp(n, "q") == 0;
  }
  assert_true(p && q);
  fe_model_free(m);
}

/* dropout is the identity when `training` is false (DESIGN.md §2), and
 * draws its mask when true. */
static void test_state_dropout_follows_training(void **state) {
  (void)state;
  const char *text = "model m {\n  input x : f32[4, 3]\n  loss l = sum(dropout(x, 0.5) * x)\n}\n";
  FeModel *m = compile_text(text, true);
  assert_int_equal(count_ops(m->func, IR_OP_RANDOM), 1);
  fe_model_free(m);
  m = compile_text(text, false);
  assert_int_equal(count_ops(m->func, IR_OP_RANDOM), 0);
  assert_int_equal(count_ops(m->func, IR_OP_SELECT), 0);
  assert_int_equal(count_ops(m->func, IR_OP_MUL), 1); /* x * x only */
  fe_model_free(m);
}

/* topk binds its two results: values (a gather at the indices) and i32
 * indices. */
static void test_state_topk_binds_values_and_indices(void **state) {
  (void)state;
  FeModel *m = compile_text("model m {\n  input x : f32[4, 5]\n  v, i = topk(x, 2, axis=1)\n"
                            "  loss l = sum(v * cast(i, f32))\n}\n",
                            true);
  assert_int_equal(count_ops(m->func, IR_OP_TOPK), 1);
  assert_int_equal(count_ops(m->func, IR_OP_GATHER), 1);
  for (int k = 0; k < m->func->nvalues; k++) {
    const IrValue *v = m->func->values[k];
    if (v->name && strcmp(v->name, "i") == 0) assert_int_equal(v->type.dtype, IR_DT_I32);
    if (v->name && strcmp(v->name, "v") == 0) assert_int_equal(v->type.shape.dim[1], 2);
  }
  fe_model_free(m);
}

static void test_state_where_and_cast_lower_to_select_and_cast(void **state) {
  (void)state;
  FeModel *m = compile_text("model m {\n  input x : f32[3]\n  c = x > 0.5\n  y = where(c, x, 0)\n"
                            "  n = cast(c, f32) + cast(cast(x, f64), f32)\n"
                            "  z = where(training, y, 2 * y)\n  loss l = sum(z * n)\n}\n",
                            true);
  assert_int_equal(count_ops(m->func, IR_OP_GT), 1);
  assert_int_equal(count_ops(m->func, IR_OP_SELECT), 1); /* where(training, ..) picks at compile time */
  assert_int_equal(count_ops(m->func, IR_OP_CAST), 3);
  /* Both of its arguments are evaluated (2 * y is dead code for dce), then z * n. */
  assert_int_equal(count_ops(m->func, IR_OP_MUL), 2);
  fe_model_free(m);
  /* Numbers fold: cast(2.7, i32) is 2, a dim comparison is a bool. */
  m = compile_text("model m {\n  dim D = 4\n  input x : f32[D]\n  x = x[0:cast(2.7, i32)]\n"
                   "  loss l = sum(where(D > 3, x, 0))\n}\n",
                   true);
  assert_int_equal(count_ops(m->func, IR_OP_SELECT), 0);
  assert_int_equal(m->func->args[0]->type.shape.dim[0], 4);
  for (int i = 0; i < m->func->nops; i++)
    if (m->func->ops[i]->opcode == IR_OP_SLICE) assert_int_equal(m->func->ops[i]->result->type.shape.dim[0], 2);
  fe_model_free(m);
}

static void test_state_model_lists_buffers_outputs_updates(void **state) {
  (void)state;
  char *text = tu_read("tests/cuda/state.gdl");
  FeModel *m = compile_text(text, true);
  assert_int_equal(m->nparams, 2);
  assert_int_equal(m->nbuffers, 2);
  assert_string_equal(m->buffers[0].name, "rm");
  assert_int_equal(m->buffers[0].init, FE_INIT_ONES);
  assert_int_equal(m->noutputs, 2);
  assert_string_equal(m->outputs[1], "npos");
  assert_int_equal(m->nupdates, 2);
  assert_int_equal(count_ops(m->func, IR_OP_UPDATE), 2);
  assert_int_equal(ir_func_find_arg(m->func, "rm")->role, IR_ARG_BUFFER);
  fe_model_free(m);
  /* Forward-only: the else branch, no updates. */
  m = compile_text(text, false);
  assert_int_equal(m->nupdates, 0);
  assert_int_equal(count_ops(m->func, IR_OP_UPDATE), 0);
  for (int i = 0; i < m->func->nops; i++) /* the else branch: x @ W, not (x - rm) @ W */
    if (m->func->ops[i]->opcode == IR_OP_MATMUL) assert_ptr_equal(m->func->ops[i]->args[0], ir_func_find_arg(m->func, "x"));
  fe_model_free(m);
  free(text);
}

/* ------------------------------------------------------------------ */
/* End to end: tests/cuda/state.gdl by hand                            */
/* ------------------------------------------------------------------ */

enum { B = 8, D = 4, N = 3 };

static char tmpdir[] = "/tmp/gradc-state-XXXXXX";
static float X[B][D], W[D][N], Bias[N], RM[D], CNT;
static int32_t Y[B];

/* What the model computes, in double, from its formulas. */
typedef struct Hand {
  double logits[B][N], npos, rm[D], cnt, ce, dW[D][N], db[N];
} Hand;

static Hand hand(void) {
  Hand h;
  memset(&h, 0, sizeof h);
  double mean[D] = {0};
  for (int i = 0; i < B; i++)
    for (int d = 0; d < D; d++) mean[d] += X[i][d] / (double)B;
  for (int d = 0; d < D; d++) h.rm[d] = 0.9 * RM[d] + 0.1 * mean[d];
  h.cnt = CNT + 1;
  for (int i = 0; i < B; i++) {
    double z[N], r[N], mx = -INFINITY, se = 0;
    for (int n = 0; n < N; n++) {
      z[n] = Bias[n];
      for (int d = 0; d < D; d++) z[n] += (X[i][d] - RM[d]) * W[d][n]; /* the old rm */
      r[n] = z[n] > 0 ? z[n] : 0.1 * z[n];
      h.npos += z[n] > 0;
      h.logits[i][n] = r[n];
      mx = fmax(mx, r[n]);
    }
    for (int n = 0; n < N; n++) se += exp(r[n] - mx);
    h.ce += (log(se) + mx - r[Y[i]]) / B;
    for (int n = 0; n < N; n++) {
      double dr = (exp(r[n] - mx) / se - (n == Y[i])) / B, dz = dr * (z[n] > 0 ? 1.0 : 0.1);
      h.db[n] += dz;
      for (int d = 0; d < D; d++) h.dW[d][n] += (X[i][d] - RM[d]) * dz;
    }
  }
  return h;
}

static void write_files(void) {
  StFile p, in;
  st_init(&p);
  st_init(&in);
  int64_t sw[2] = {D, N}, sb[1] = {N}, sr[1] = {D}, sx[2] = {B, D}, sy[1] = {B};
  st_add(&p, "W", ST_F32, 2, sw, W);
  st_add(&p, "b", ST_F32, 1, sb, Bias);
  st_add(&p, "rm", ST_F32, 1, sr, RM);
  st_add(&p, "cnt", ST_F32, 0, NULL, &CNT);
  st_add(&in, "x", ST_F32, 2, sx, X);
  st_add(&in, "y", ST_I32, 1, sy, Y);
  char path[512], err[512];
  snprintf(path, sizeof path, "%s/p.st", tmpdir);
  assert_true(st_write(path, &p, err, sizeof err));
  snprintf(path, sizeof path, "%s/i.st", tmpdir);
  assert_true(st_write(path, &in, err, sizeof err));
  st_free(&p);
  st_free(&in);
}

static int setup(void **state) {
  (void)state;
  assert_non_null(mkdtemp(tmpdir));
  /* Values well away from z = 0, so f32 takes every branch f64 does. */
  for (int i = 0; i < B; i++) {
    for (int d = 0; d < D; d++) X[i][d] = (float)(((i * 7 + d * 3) % 11) - 5) / 4.0f;
    Y[i] = (i * 5) % N;
  }
  for (int d = 0; d < D; d++) {
    for (int n = 0; n < N; n++) W[d][n] = (float)(((d * 5 + n * 7) % 9) - 4) / 5.0f;
    RM[d] = 0.25f * (float)d - 0.3f;
  }
  for (int n = 0; n < N; n++) Bias[n] = 0.1f * (float)(n - 1);
  CNT = 3;
  write_files();
  return 0;
}

static int teardown(void **state) {
  (void)state;
  tu_rm_rf(tmpdir);
  return 0;
}

static const StTensor *need(const StFile *f, const char *name, int64_t numel) {
  const StTensor *t = st_find(f, name);
  if (!t) fail_msg("no tensor '%s'", name);
  assert_int_equal(st_numel(t), numel);
  return t;
}

static double at(const StTensor *t, int64_t i) {
  double v;
  step_load(t, i, 1, &v);
  return v;
}

/* |got - want| <= tol * max(1, |want|) for each of n values. */
static void near(const char *what, const StTensor *t, const double *want, int64_t n, double tol) {
  for (int64_t i = 0; i < n; i++)
    if (!(fabs(at(t, i) - want[i]) <= tol * fmax(1.0, fabs(want[i]))))
      fail_msg("%s[%lld]: got %.9g, want %.9g", what, (long long)i, at(t, i), want[i]);
}

/* One `gradc run` (prefix: "" or an mpirun command, extra: flags); checks
 * every file against the hand-derived values. */
static void run_and_check(const char *prefix, const char *target, int gas, const char *extra) {
  char out[16384], err[16384];
  int rc = tu_sh_err(out, sizeof out, err, sizeof err,
                     "%s %s run %s --target %s --gas %d %s --threads 1 --params %s/p.st --inputs %s/i.st "
                     "--grads-out %s/g.st --outputs-out %s/o.st --buffers-out %s/b.st",
                     prefix, GRADC_BINARY, tu_path("tests/cuda/state.gdl"), target, gas, extra, tmpdir, tmpdir,
                     tmpdir, tmpdir, tmpdir);
  if (rc != 0) fail_msg("%s --gas %d %s: %s%s", target, gas, extra, out, err);
  Hand h = hand();
  double ce;
  const char *line = strstr(out, "loss ce ");
  assert_non_null(line);
  assert_int_equal(sscanf(line, "loss ce %lf", &ce), 1);
  if (!(fabs(ce - h.ce) <= 1e-5 * h.ce)) fail_msg("%s --gas %d: loss ce %.9g, want %.9g", target, gas, ce, h.ce);
  StFile o, b, g;
  char path[512], e[512];
  snprintf(path, sizeof path, "%s/o.st", tmpdir);
  assert_true(st_read(path, &o, e, sizeof e));
  snprintf(path, sizeof path, "%s/b.st", tmpdir);
  assert_true(st_read(path, &b, e, sizeof e));
  snprintf(path, sizeof path, "%s/g.st", tmpdir);
  assert_true(st_read(path, &g, e, sizeof e));
  /* Outputs: logits for the whole window (micro-batches in sample order). */
  const StTensor *lg = need(&o, "logits", B * N);
  assert_int_equal(lg->rank, 2);
  assert_int_equal(lg->shape[0], B);
  near("logits", lg, &h.logits[0][0], B * N, 1e-5);
  near("npos", need(&o, "npos", 1), &h.npos, 1, 0);
  assert_int_equal(o.n, 2);
  /* Buffers: the window mean, counted once; only the updated ones. */
  near("rm", need(&b, "rm", D), h.rm, D, 1e-6);
  near("cnt", need(&b, "cnt", 1), &h.cnt, 1, 0);
  assert_int_equal(b.n, 2);
  /* Gradients: params only; where's goes to the chosen side (0.1 below 0). */
  assert_int_equal(g.n, 2);
  near("dW", need(&g, "W", D * N), &h.dW[0][0], D * N, 1e-5);
  near("db", need(&g, "b", N), h.db, N, 1e-5);
  st_free(&o);
  st_free(&b);
  st_free(&g);
}

static void test_state_run_matches_hand_derived_values(void **state) {
  (void)state;
  static const char *const targets[] = {"ref", "cpu"};
  for (int t = 0; t < 2; t++)
    for (int gas = 1; gas <= 4; gas *= 2) run_and_check("", targets[t], gas, "");
}

static void test_state_artifact_carries_outputs_and_updates(void **state) {
  (void)state;
  char out[16384];
  if (tu_sh(out, sizeof out, "%s compile %s --gas 2 -o %s/state.gca", GRADC_BINARY, tu_path("tests/cuda/state.gdl"),
            tmpdir) != 0)
    fail_msg("compile: %s", out);
  char art[512];
  snprintf(art, sizeof art, "%s/state.gca", tmpdir);
  /* run_and_check runs the model file; run the artifact the same way. */
  int rc = tu_sh(out, sizeof out,
                 "%s run %s --threads 1 --params %s/p.st --inputs %s/i.st --outputs-out %s/o.st --buffers-out %s/b.st",
                 GRADC_BINARY, art, tmpdir, tmpdir, tmpdir, tmpdir);
  if (rc != 0) fail_msg("artifact: %s", out);
  StFile o, b;
  char path[512], e[512];
  snprintf(path, sizeof path, "%s/o.st", tmpdir);
  assert_true(st_read(path, &o, e, sizeof e));
  snprintf(path, sizeof path, "%s/b.st", tmpdir);
  assert_true(st_read(path, &b, e, sizeof e));
  Hand h = hand();
  near("logits", need(&o, "logits", B * N), &h.logits[0][0], B * N, 1e-5);
  near("rm", need(&b, "rm", D), h.rm, D, 1e-6);
  st_free(&o);
  st_free(&b);
}

static void test_state_dp2_gathers_outputs_and_reduces_updates(void **state) {
  (void)state;
  if (!dp_have_mpirun()) return;
  run_and_check(MPIRUN " -np 2", "cpu", 2, "--dp 2");
  run_and_check(MPIRUN " -np 2", "ref", 1, "--dp 2");
}

/* A params file needs its buffers; a grads file has none. */
static void test_state_params_file_holds_buffers(void **state) {
  (void)state;
  char out[16384];
  StFile p;
  char path[512], e[512];
  tu_gradc("init %s -o %s/init.st --seed 3", tu_path("tests/cuda/state.gdl"), tmpdir);
  snprintf(path, sizeof path, "%s/init.st", tmpdir);
  assert_true(st_read(path, &p, e, sizeof e));
  assert_int_equal(p.n, 4);
  const StTensor *rm = need(&p, "rm", D);
  for (int d = 0; d < D; d++) assert_true(at(rm, d) == 1.0); /* init ones */
  assert_true(at(need(&p, "cnt", 1), 0) == 0.0);              /* default zeros */
  /* Without a buffer: the error names the file and the tensor. */
  StFile q;
  st_init(&q);
  for (int i = 0; i < p.n; i++)
    if (strcmp(p.t[i].name, "cnt") != 0) st_add(&q, p.t[i].name, p.t[i].dtype, p.t[i].rank, p.t[i].shape, p.t[i].data);
  snprintf(path, sizeof path, "%s/nobuf.st", tmpdir);
  assert_true(st_write(path, &q, e, sizeof e));
  assert_int_equal(tu_sh(out, sizeof out, "%s run %s --params %s --inputs %s/i.st", GRADC_BINARY,
                         tu_path("tests/cuda/state.gdl"), path, tmpdir),
                   1);
  if (!strstr(out, "missing tensor 'cnt'")) fail_msg("%s", out);
  st_free(&p);
  st_free(&q);
}

/* `update` under K > 1 must be a window reduction: refused at the op. */
static void test_state_update_not_a_window_reduction_is_refused(void **state) {
  (void)state;
  char path[512], out[16384];
  snprintf(path, sizeof path, "%s/refuse.gdl", tmpdir);
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fputs("model refuse {\n  batch B = 4\n  input x : f32[B, 2]\n  buffer v : f32[2]\n"
        "  update v = mean(x, axis=0) * mean(x, axis=0)\n  loss l = sum(x * x)\n}\n",
        f);
  fclose(f);
  assert_int_equal(tu_sh(out, sizeof out, "%s compile %s --gas 2 -o %s/r.gca", GRADC_BINARY, path, tmpdir), 1);
  if (!strstr(out, "refuse.gdl:5:30: error: update of buffer 'v' cannot be computed from 2 micro-batches and ranks: "
                   "it multiplies two batch-dependent reductions"))
    fail_msg("%s", out);
  /* With one micro-batch it is the window's value. */
  assert_int_equal(tu_sh(out, sizeof out, "%s compile %s --gas 1 -o %s/r.gca", GRADC_BINARY, path, tmpdir), 0);
}

/* train: the buffers take each window's update after each step, are never
 * weight-decayed or given optimiser state, and checkpoints carry them. */
static void test_state_train_updates_buffers_and_checkpoints_them(void **state) {
  (void)state;
  char path[512], e[512];
  /* The dataset is one window, so every step's mean is the same. */
  tu_gradc("train %s --data %s/i.st --steps 3 --optimizer adamw --lr 0.01 --init %s/p.st --checkpoint %s/ck.st "
           "--threads 1",
           tu_path("tests/cuda/state.gdl"), tmpdir, tmpdir, tmpdir);
  StFile ck;
  snprintf(path, sizeof path, "%s/ck.st", tmpdir);
  assert_true(st_read(path, &ck, e, sizeof e));
  double mean[D] = {0}, want[D];
  for (int i = 0; i < B; i++)
    for (int d = 0; d < D; d++) mean[d] += X[i][d] / (double)B;
  for (int d = 0; d < D; d++) want[d] = pow(0.9, 3) * RM[d] + (1 - pow(0.9, 3)) * mean[d];
  near("rm after 3 steps", need(&ck, "rm", D), want, D, 1e-6);
  double cnt = CNT + 3;
  near("cnt after 3 steps", need(&ck, "cnt", 1), &cnt, 1, 0);
  assert_null(st_find(&ck, "optim.exp_avg.rm"));
  assert_null(st_find(&ck, "optim.exp_avg_sq.cnt"));
  assert_non_null(st_find(&ck, "optim.exp_avg.W"));
  st_free(&ck);
  /* Resumed to 5 steps: two more updates. */
  tu_gradc("train %s --data %s/i.st --steps 5 --optimizer adamw --lr 0.01 --resume %s/ck.st --checkpoint %s/ck5.st "
           "--threads 1",
           tu_path("tests/cuda/state.gdl"), tmpdir, tmpdir, tmpdir);
  snprintf(path, sizeof path, "%s/ck5.st", tmpdir);
  assert_true(st_read(path, &ck, e, sizeof e));
  for (int d = 0; d < D; d++) want[d] = pow(0.9, 5) * RM[d] + (1 - pow(0.9, 5)) * mean[d];
  near("rm after 5 steps", need(&ck, "rm", D), want, D, 1e-6);
  cnt = CNT + 5;
  near("cnt after 5 steps", need(&ck, "cnt", 1), &cnt, 1, 0);
  st_free(&ck);
}

/* The C API: outputs by name after a run, buffers like params. */
static void test_state_c_api_reads_outputs(void **state) {
  (void)state;
  gradc_compile_options o;
  gradc_compile_options_init(&o);
  o.gas = 2;
  o.target = "ref";
  gradc_program *p;
  assert_int_equal(gradc_program_compile_file(tu_path("tests/cuda/state.gdl"), &o, &p), GRADC_OK);
  assert_int_equal(gradc_program_num_outputs(p), 2);
  assert_string_equal(gradc_program_output_name(p, 0), "logits");
  assert_int_equal(gradc_program_num_buffers(p), 2);
  gradc_tensor_info bi;
  assert_int_equal(gradc_program_buffer_info(p, 0, &bi), GRADC_OK);
  assert_string_equal(bi.name, "rm");
  gradc_session *s;
  assert_int_equal(gradc_session_new(p, &s), GRADC_OK);
  char path[512];
  snprintf(path, sizeof path, "%s/p.st", tmpdir);
  assert_int_equal(gradc_session_load_params(s, path), GRADC_OK);
  assert_int_equal(gradc_session_set_input(s, "x", GRADC_F32, X, B * D), GRADC_OK);
  assert_int_equal(gradc_session_set_input(s, "y", GRADC_I32, Y, B), GRADC_OK);
  assert_int_equal(gradc_session_run(s), GRADC_OK);
  Hand h = hand();
  gradc_tensor_info oi;
  assert_int_equal(gradc_session_output_info(s, "logits", &oi), GRADC_OK);
  assert_int_equal(oi.rank, 2);
  assert_int_equal(oi.shape[0], B);
  assert_int_equal(oi.batched, 1);
  float lg[B * N];
  assert_int_equal(gradc_session_get_output(s, "logits", lg, B * N), GRADC_OK);
  for (int i = 0; i < B * N; i++) assert_true(fabs(lg[i] - (&h.logits[0][0])[i]) <= 1e-5);
  assert_int_equal(gradc_session_get_output(s, "nope", lg, 1), GRADC_ERR_USER);
  /* The update is the session's buffer now. */
  float rm[D];
  assert_int_equal(gradc_session_get_param(s, "rm", rm, D), GRADC_OK);
  for (int d = 0; d < D; d++) assert_true(fabs(rm[d] - h.rm[d]) <= 1e-6);
  gradc_session_free(s);
  gradc_program_free(p);
}

/* `gradc help functions` is generated from the built-in table: every row
 * carries a signature that starts with its name. */
static void test_state_every_builtin_has_a_signature(void **state) {
  (void)state;
  assert_true(fe_builtin_count() > 30);
  for (int i = 0; i < fe_builtin_count(); i++) {
    const char *name = fe_builtin_name(i), *sig = fe_builtin_signature(i);
    if (!sig || strncmp(sig, name, strlen(name)) != 0 || sig[strlen(name)] != '(')
      fail_msg("built-in '%s' has no signature of the form %s(...): %s", name, name, sig ? sig : "(none)");
  }
  char out[65536];
  assert_int_equal(tu_sh(out, sizeof out, "%s help functions", GRADC_BINARY), 0);
  assert_non_null(strstr(out, "\n  where(cond, a, b)\n"));
  assert_non_null(strstr(out, "\n  sum(x, axis=all, keepdim=false)\n"));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_state_conditions_have_python_precedence),
      cmocka_unit_test(test_state_names_bound_in_if_stay_visible),
      cmocka_unit_test(test_state_several_results),
      cmocka_unit_test(test_state_dropout_follows_training),
      cmocka_unit_test(test_state_topk_binds_values_and_indices),
      cmocka_unit_test(test_state_where_and_cast_lower_to_select_and_cast),
      cmocka_unit_test(test_state_model_lists_buffers_outputs_updates),
      cmocka_unit_test(test_state_run_matches_hand_derived_values),
      cmocka_unit_test(test_state_artifact_carries_outputs_and_updates),
      cmocka_unit_test(test_state_dp2_gathers_outputs_and_reduces_updates),
      cmocka_unit_test(test_state_params_file_holds_buffers),
      cmocka_unit_test(test_state_update_not_a_window_reduction_is_refused),
      cmocka_unit_test(test_state_train_updates_buffers_and_checkpoints_them),
      cmocka_unit_test(test_state_c_api_reads_outputs),
      cmocka_unit_test(test_state_every_builtin_has_a_signature),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
