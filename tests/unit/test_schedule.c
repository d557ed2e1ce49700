/* test_schedule.c - dp-reduce's gradient buckets (reverse order of forward
 * use, the size cap; a stacked param's gradient one layer slice at a
 * time), the schedule pass (a bucket's starts adjacent and
 * right after its last gradient, waits late, tp collectives overlapping
 * independent GEMMs, --no-overlap order, determinism), the same gradients
 * through the reference interpreter with overlap on and off, and the cost
 * model and its simulation against hand-derived figures (views free, the
 * rank-dependent copies a memory copy, collectives queued per group's
 * link). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "passes/passes.h"
#include "runtime/runtime.h"
#include "testutil.h"

/* An MLP whose params' sizes give known buckets: W1 512 B, b1 64, W2 1024,
 * b2 64, W3 256, b3 16.  Forward use order W1 b1 W2 b2 W3 b3. */
static const char *mlp3 = "model mlp3 {\n"
                          "  batch B = 8\n"
                          "  dim D = 8\n"
                          "  input x : f32[B, D]\n"
                          "  input y : i32[B]\n"
                          "  param W1 : f32[D, 16]  init normal(0, 0.3)\n"
                          "  param b1 : f32[16]\n"
                          "  param W2 : f32[16, 16] init normal(0, 0.3)\n"
                          "  param b2 : f32[16]\n"
                          "  param W3 : f32[16, 4]  init normal(0, 0.3)\n"
                          "  param b3 : f32[4]\n"
                          "  h1 = tanh(x @ W1 + b1)\n"
                          "  h2 = tanh(h1 @ W2 + b2)\n"
                          "  loss ce = cross_entropy(h2 @ W3 + b3, y)\n"
                          "}\n";

typedef struct Compiled {
  FeModel *m;
  Diag d;
} Compiled;

/* Compile `text` and run the default (ref) pipeline with these options. */
static void compile(Compiled *c, const char *text, int gas, int dp, int64_t bucket_bytes, bool no_overlap) {
  c->m = tu_compile("m.gdl", text, gas, &c->d);
  if (!c->m) fail_msg("compile: %s", sb_str(&c->d.log));
  PassManager pm;
  pm_init(&pm);
  pm.verify = true;
  PassOptions po = {.gas = gas, .diag = &c->d, .src = &c->m->src, .dp = dp, .bucket_bytes = bucket_bytes,
                    .no_overlap = no_overlap};
  int n;
  const char *const *pipe = pass_pipeline(&n);
  if (pm_run(&pm, c->m->func, pipe, n, &po) != 0) fail_msg("passes: %s", sb_str(&c->d.log));
}

static void release(Compiled *c) {
  fe_model_free(c->m);
  diag_free(&c->d);
}

static bool is_start(const IrOp *op) {
  return op->opcode == IR_OP_ALL_REDUCE_START || op->opcode == IR_OP_ALL_GATHER_START ||
         op->opcode == IR_OP_REDUCE_SCATTER_START;
}

static bool is_wait(const IrOp *op) {
  return op->opcode == IR_OP_ALL_REDUCE_WAIT || op->opcode == IR_OP_ALL_GATHER_WAIT ||
         op->opcode == IR_OP_REDUCE_SCATTER_WAIT;
}

static int pos_of(const IrFunc *f, const IrOp *op) {
  for (int i = 0; i < f->nops; i++)
    if (f->ops[i] == op) return i;
  return -1;
}

/* The grad output of param `name` and its dp start (through the wait). */
static const IrOp *grad_out(const IrFunc *f, const char *name) {
  for (int i = 0; i < f->nops; i++)
    if (f->ops[i]->opcode == IR_OP_GRAD && strcmp(ir_attr_get_str(f->ops[i], "name", ""), name) == 0)
      return f->ops[i];
  fail_msg("no grad output for %s", name);
  return NULL;
}

static const IrOp *dp_start(const IrFunc *f, const char *name) {
  const IrOp *g = grad_out(f, name);
  const IrOp *w = g->args[0]->def;
  assert_non_null(w);
  assert_int_equal(w->opcode, IR_OP_ALL_REDUCE_WAIT);
  const IrOp *s = w->args[0]->def;
  assert_int_equal(s->opcode, IR_OP_ALL_REDUCE_START);
  return s;
}

static int bucket_of(const IrFunc *f, const char *name) {
  return (int)ir_attr_get_int(dp_start(f, name), "bucket", -1);
}

static const char *mlp3_params[] = {"W1", "b1", "W2", "b2", "W3", "b3"};

static void test_dp_reduce_buckets_reverse_forward_use(void **state) {
  (void)state;
  /* Reverse forward use: b3 (16 B), W3 (256), b2 (64), W2 (1024), b1 (64),
   * W1 (512).  Cap 400: {b3, W3, b2} = 336; W2 alone (larger than the cap);
   * {b1} (64 + 512 > 400); {W1}. */
  Compiled c;
  compile(&c, mlp3, 1, 2, 400, false);
  const IrFunc *f = c.m->func;
  int want[] = {3, 2, 1, 0, 0, 0};
  for (int i = 0; i < 6; i++) {
    const IrOp *s = dp_start(f, mlp3_params[i]);
    assert_int_equal(bucket_of(f, mlp3_params[i]), want[i]);
    assert_string_equal(ir_attr_get_str(s, "group", ""), "dp");
    assert_int_equal(ir_attr_get_int(s, "ranks", 0), 2);
    assert_int_equal(ir_attr_get_int(s, "last", 0), 1);
    const IrOp *w = grad_out(f, mlp3_params[i])->args[0]->def;
    assert_int_equal(ir_attr_get_int(w, "bucket", -1), want[i]);
    assert_int_equal(ir_attr_get_int(w, "last", 0), 1);
    /* The start reduces the gradient itself: not an output, not a collective. */
    assert_true(s->args[0]->def == NULL || !is_wait(s->args[0]->def));
  }
  release(&c);

  /* The default cap (1 MiB) holds everything in one bucket; dp = 1 inserts nothing. */
  compile(&c, mlp3, 1, 2, 0, false);
  for (int i = 0; i < 6; i++) assert_int_equal(bucket_of(c.m->func, mlp3_params[i]), 0);
  release(&c);
  compile(&c, mlp3, 1, 1, 0, false);
  for (int i = 0; i < c.m->func->nops; i++)
    assert_int_not_equal(ir_op_info[c.m->func->ops[i]->opcode].kind, IR_KIND_COLLECTIVE);
  release(&c);

  /* A cap of one byte: every gradient its own bucket, in reverse forward use. */
  compile(&c, mlp3, 1, 2, 1, false);
  int order[] = {5, 4, 3, 2, 1, 0};
  for (int i = 0; i < 6; i++) assert_int_equal(bucket_of(c.m->func, mlp3_params[i]), order[i]);
  release(&c);
}

/* The unslice of a stacked param's layer slice after its dp wait (no work:
 * memplan puts the slice in its range of the gradient buffer). */
static bool slice_tail(const IrOp *op) {
  return op->opcode == IR_OP_UNSLICE && op->args[0]->def && op->args[0]->def->opcode == IR_OP_ALL_REDUCE_WAIT;
}

/* Each bucket's starts are adjacent, in bucket order, and the first comes
 * right after the later of (the bucket's last gradient, the previous
 * bucket's starts); every dp wait comes after the last compute op (the
 * slices' unslices are not compute). */
static void check_dp_schedule(const IrFunc *f, int nbuckets) {
  int last_compute = -1;
  for (int i = 0; i < f->nops; i++) {
    IrOpKind k = ir_op_info[f->ops[i]->opcode].kind;
    if (k != IR_KIND_COLLECTIVE && k != IR_KIND_OUTPUT && k != IR_KIND_CONST && !slice_tail(f->ops[i]))
      last_compute = i;
  }
  int prev_end = -1;
  for (int b = 0; b < nbuckets; b++) {
    int first = -1, last = -1, ready = -1;
    for (int i = 0; i < f->nops; i++) {
      const IrOp *op = f->ops[i];
      if (op->opcode != IR_OP_ALL_REDUCE_START || ir_attr_get_int(op, "bucket", -1) != b) continue;
      if (first < 0) first = i;
      if (last >= 0 && i != last + 1) fail_msg("bucket %d: starts not adjacent (%d after %d)", b, i, last);
      last = i;
      int d = op->args[0]->def ? pos_of(f, op->args[0]->def) : -1;
      if (d > ready) ready = d;
    }
    assert_true(first >= 0);
    if (prev_end > ready) ready = prev_end;
    if (first != ready + 1) fail_msg("bucket %d starts at %d, its gradients are ready at %d", b, first, ready);
    prev_end = last;
  }
  for (int i = 0; i < f->nops; i++)
    if (is_wait(f->ops[i]) && i < last_compute) fail_msg("a dp wait at %d before compute at %d", i, last_compute);
}

static void test_schedule_bucket_starts_after_last_contribution(void **state) {
  (void)state;
  Compiled c;
  compile(&c, mlp3, 1, 2, 400, false);
  check_dp_schedule(c.m->func, 4);
  /* Bucket 0 starts inside the backward: before W1's gradient GEMM. */
  const IrFunc *f = c.m->func;
  const IrOp *s0 = dp_start(f, "b3");
  const IrOp *gW1 = dp_start(f, "W1")->args[0]->def;
  assert_true(pos_of(f, s0) < pos_of(f, gW1));
  release(&c);

  /* tinygpt, K = 2, small buckets. */
  char *text = tu_read("examples/tinygpt.gdl");
  compile(&c, text, 2, 2, 100000, false);
  int nb = 0;
  for (int i = 0; i < c.m->func->nops; i++)
    if (c.m->func->ops[i]->opcode == IR_OP_ALL_REDUCE_START) {
      int b = (int)ir_attr_get_int(c.m->func->ops[i], "bucket", -1);
      nb = b + 1 > nb ? b + 1 : nb;
    }
  assert_true(nb >= 5);
  check_dp_schedule(c.m->func, nb);
  print_message("tinygpt, dp 2, 100 kB buckets (%d):\n", nb);
  CostModel m;
  cost_model_default(&m);
  m.link_bytes_per_s = 0.25e9; /* a 2 Gb/s link */
  cost_report(c.m->func, &m, stdout);
  release(&c);
  free(text);
}

static void check_same_gradients(const char *text, int gas, int64_t bucket_bytes);

/* A stack of L = 3 tanh layers whose weights are stacked params, read as
 * W[l] and b[l] (as tinygpt's per-layer params): W 3 x 256 B, b 3 x 32 B. */
static const char *stacked = "model stacked {\n"
                             "  batch B = 8\n"
                             "  dim D = 8\n"
                             "  dim L = 3\n"
                             "  input x : f32[B, D]\n"
                             "  input y : i32[B]\n"
                             "  param W : f32[L, D, D] init normal(0, 0.3)\n"
                             "  param b : f32[L, D]\n"
                             "  h = x\n"
                             "  for l in 0..L {\n"
                             "    h = tanh(h @ W[l] + b[l])\n"
                             "  }\n"
                             "  loss ce = cross_entropy(h, y)\n"
                             "}\n";

/* The slice reductions of a stacked param: for each of its grad outputs
 * (one per layer, in layer order of the leading index), the start. */
static int slice_starts(const IrFunc *f, const char *name, const IrOp **starts, int64_t *layer) {
  int n = 0;
  for (int i = 0; i < f->nops; i++) {
    const IrOp *g = f->ops[i];
    if (g->opcode != IR_OP_GRAD || strcmp(ir_attr_get_str(g, "name", ""), name) != 0) continue;
    const IrOp *u = g->args[0]->def;
    assert_non_null(u);
    assert_int_equal(u->opcode, IR_OP_UNSLICE);
    const IrOp *w = u->args[0]->def;
    assert_int_equal(w->opcode, IR_OP_ALL_REDUCE_WAIT);
    const IrOp *s = w->args[0]->def;
    assert_int_equal(s->opcode, IR_OP_ALL_REDUCE_START);
    assert_int_equal(ir_attr_get_int(s, "last", 0), 1);
    assert_int_equal(s->args[0]->type.shape.dim[0], 1); /* one layer's slice */
    const int64_t *st;
    assert_int_equal(ir_attr_get_ints(u, "starts", &st), u->result->type.shape.rank);
    layer[n] = st[0];
    starts[n++] = s;
  }
  return n;
}

static void test_dp_reduce_stacked_param_one_reduction_per_layer(void **state) {
  (void)state;
  Compiled c;
  compile(&c, stacked, 1, 2, 1, false); /* one-byte cap: every slice its own bucket */
  const IrFunc *f = c.m->func;
  const char *names[] = {"W", "b"};
  for (int k = 0; k < 2; k++) {
    const IrOp *s[8];
    int64_t layer[8];
    int n = slice_starts(f, names[k], s, layer);
    assert_int_equal(n, 3);
    bool seen[3] = {false, false, false};
    for (int i = 0; i < n; i++) {
      assert_true(layer[i] >= 0 && layer[i] < 3 && !seen[layer[i]]);
      seen[layer[i]] = true;
    }
    /* Slice l starts inside layer l's backward: right after its own
     * contribution, before layer l - 1's contribution is computed. */
    for (int i = 0; i < n; i++)
      for (int j = 0; j < n; j++) {
        if (layer[j] != layer[i] - 1) continue;
        int c_i = pos_of(f, s[i]->args[0]->def), c_j = pos_of(f, s[j]->args[0]->def);
        assert_true(c_i < pos_of(f, s[i]));
        if (!(pos_of(f, s[i]) < c_j))
          fail_msg("%s[%d] starts at %d, after %s[%d]'s contribution at %d", names[k], (int)layer[i], pos_of(f, s[i]),
                   names[k], (int)layer[j], c_j);
        assert_true(ir_attr_get_int(s[i], "bucket", -1) < ir_attr_get_int(s[j], "bucket", -1));
      }
  }
  check_dp_schedule(f, 6);
  release(&c);
  /* The same values as one process, with overlap on and off. */
  check_same_gradients(stacked, 1, 1);
  check_same_gradients(stacked, 2, 300);

  /* The cpu pipeline: each slice's contribution, start and wait in the
   * slice's range of the param's gradient buffer; the unslice is no work. */
  c.m = tu_compile("m.gdl", stacked, 1, &c.d);
  assert_non_null(c.m);
  PassManager pm;
  pm_init(&pm);
  pm.verify = true;
  PassOptions po = {.gas = 1, .diag = &c.d, .src = &c.m->src, .dp = 2, .bucket_bytes = 300};
  int np;
  const char *const *pipe = pass_pipeline_cpu(&np);
  if (pm_run(&pm, c.m->func, pipe, np, &po) != 0) fail_msg("passes: %s", sb_str(&c.d.log));
  f = c.m->func;
  for (int k = 0; k < 2; k++) {
    const IrOp *s[8];
    int64_t layer[8];
    int n = slice_starts(f, names[k], s, layer);
    assert_int_equal(n, 3);
    int64_t base = -1, slice = ir_numel(&s[0]->args[0]->type.shape) * 4;
    for (int i = 0; i < f->nops; i++) {
      const IrOp *g = f->ops[i];
      if (g->opcode != IR_OP_GRAD || strcmp(ir_attr_get_str(g, "name", ""), names[k]) != 0) continue;
      assert_int_equal(g->args[0]->storage, IR_STORE_GRAD);
      assert_int_equal(g->args[0]->def->group, 0);
      if (base < 0) base = g->args[0]->offset;
      assert_int_equal(g->args[0]->offset, base); /* the unslice's result: the whole buffer */
    }
    for (int i = 0; i < n; i++) {
      const IrValue *vs[3] = {s[i]->args[0], s[i]->result, NULL};
      for (int j = 0; j < f->nops; j++)
        if (f->ops[j]->opcode == IR_OP_ALL_REDUCE_WAIT && f->ops[j]->args[0] == s[i]->result) vs[2] = f->ops[j]->result;
      for (int j = 0; j < 3; j++) {
        assert_non_null(vs[j]);
        while (vs[j]->storage == IR_STORE_ALIAS && vs[j]->def->opcode == IR_OP_RESHAPE) vs[j] = vs[j]->def->args[0];
        assert_int_equal(vs[j]->storage, IR_STORE_GRAD);
        assert_int_equal(vs[j]->offset, base + layer[i] * slice);
      }
    }
  }
  release(&c);
}

/* The reference IR of Megatron's backward of a column-parallel linear:
 * dW is emitted before dx, whose all-reduce over tp gates what follows. */
static const char *megatron =
    "func @meg(%x: f32[64,64] input, %dy: f32[64,128] input, %W: f32[64,128] param, %V: f32[64,64] param) {\n"
    "  %xt = permute %x {perm=[1,0]} : f32[64,64]\n"
    "  %dW = matmul %xt, %dy : f32[64,128]\n"
    "  %Wt = permute %W {perm=[1,0]} : f32[128,64]\n"
    "  %dx = matmul %dy, %Wt : f32[64,64]\n"
    "  %s = all_reduce.start %dx {group=\"tp\", ranks=2} : f32[64,64]\n"
    "  %r = all_reduce.wait %s {group=\"tp\", ranks=2} : f32[64,64]\n"
    "  %rt = permute %r {perm=[1,0]} : f32[64,64]\n"
    "  %dV = matmul %rt, %x : f32[64,64]\n"
    "  grad %dW {name=\"W\"}\n"
    "  grad %dV {name=\"V\"}\n"
    "}\n";

/* Sequence parallelism: the gathered sequence feeds a GEMM; another GEMM
 * (the local work) does not need it. */
static const char *seqpar =
    "func @sp(%x: f32[32,64] input, %y: f32[64,64] input, %W: f32[64,64] param, %U: f32[64,64] param) {\n"
    "  %s = all_gather.start %x {group=\"tp\", ranks=2, axis=0} : f32[64,64]\n"
    "  %g = all_gather.wait %s {group=\"tp\", ranks=2, axis=0} : f32[64,64]\n"
    "  %a = matmul %g, %W : f32[64,64]\n"
    "  %b = matmul %y, %U : f32[64,64]\n"
    "  %c = add %a, %b : f32[64,64]\n"
    "  %l = sum %c {axes=[0,1], keepdim=false} : f32\n"
    "  loss %l {name=\"l\"}\n"
    "}\n";

static IrFunc *read_ir(const char *text) {
  SrcFile src = {"t.gir", text, strlen(text)};
  Diag d;
  diag_init(&d, NULL);
  d.quiet = true;
  IrFunc *f = ir_read(&src, &d);
  if (!f) fail_msg("read: %s", sb_str(&d.log));
  diag_free(&d);
  return f;
}

static void schedule(IrFunc *f, bool no_overlap) {
  Diag d;
  diag_init(&d, NULL);
  d.quiet = true;
  PassManager pm;
  pm_init(&pm);
  pm.verify = true;
  PassOptions po = {.gas = 1, .diag = &d, .no_overlap = no_overlap};
  static const char *const names[] = {"schedule"};
  if (pm_run(&pm, f, names, 1, &po) != 0) fail_msg("schedule: %s", sb_str(&d.log));
  diag_free(&d);
}

static int pos_def(const IrFunc *f, const char *name) {
  for (int i = 0; i < f->nops; i++)
    if (f->ops[i]->result && f->ops[i]->result->name && strcmp(f->ops[i]->result->name, name) == 0) return i;
  fail_msg("no value %%%s", name);
  return -1;
}

static void test_schedule_megatron_weight_gradient_under_reduction(void **state) {
  (void)state;
  IrFunc *f = read_ir(megatron);
  schedule(f, false);
  /* dx first, its all-reduce in flight while dW's GEMM runs, then the wait. */
  assert_true(pos_def(f, "dx") < pos_def(f, "s"));
  assert_true(pos_def(f, "s") < pos_def(f, "dW"));
  assert_true(pos_def(f, "dW") < pos_def(f, "r"));
  assert_true(pos_def(f, "r") < pos_def(f, "dV"));
  ir_func_free(f);

  f = read_ir(megatron);
  schedule(f, true); /* no overlap: the wait right after its start */
  assert_int_equal(pos_def(f, "r"), pos_def(f, "s") + 1);
  ir_func_free(f);
}

static void test_schedule_gather_overlaps_local_gemm(void **state) {
  (void)state;
  IrFunc *f = read_ir(seqpar);
  schedule(f, false);
  assert_int_equal(pos_def(f, "s"), 0);
  assert_true(pos_def(f, "b") < pos_def(f, "g"));
  assert_true(pos_def(f, "g") < pos_def(f, "a"));
  ir_func_free(f);
}

static void test_schedule_no_overlap_waits_follow_starts(void **state) {
  (void)state;
  Compiled c;
  compile(&c, mlp3, 1, 2, 400, true);
  const IrFunc *f = c.m->func;
  /* Each bucket: its starts, then their waits, then compute resumes. */
  for (int i = 0; i < f->nops; i++) {
    if (!is_start(f->ops[i])) continue;
    int j = i;
    while (j < f->nops && is_start(f->ops[j])) j++;
    int nstarts = j - i;
    for (int k = 0; k < nstarts; k++) {
      assert_true(is_wait(f->ops[j + k]));
      assert_ptr_equal(f->ops[j + k]->args[0]->def, f->ops[i + k]);
    }
    i = j + nstarts - 1;
  }
  release(&c);
}

/* Run one window on the interpreter after rewriting ranks=N to 1 (one
 * process: a collective of one rank is the identity). */
static void run_ref(IrFunc *f, int gas, StepResult *r) {
  for (int i = 0; i < f->nops; i++)
    for (int a = 0; a < f->ops[i]->nattrs; a++)
      if (strcmp(f->ops[i]->attrs[a].key, "ranks") == 0) f->ops[i]->attrs[a].i = 1;
  StFile params, inputs;
  st_init(&inputs);
  rt_random_inputs(f, gas, 7, &inputs);
  st_init(&params);
  Rng rng;
  rng_seed(&rng, 11);
  for (int i = 0; i < f->nargs; i++) {
    const IrValue *p = f->args[i];
    if (p->role != IR_ARG_PARAM) continue;
    int64_t n = ir_numel(&p->type.shape);
    float *buf = malloc(sizeof(float) * (size_t)(n ? n : 1));
    for (int64_t j = 0; j < n; j++) buf[j] = (float)(0.3 * rng_normal(&rng));
    st_add(&params, p->name, ST_F32, p->type.shape.rank, p->type.shape.dim, buf);
    free(buf);
  }
  InterpOptions io = {.exact_f64 = false};
  char err[512];
  if (!step_run_ref(f, gas, &params, "params", &inputs, "inputs", &io, r, err, sizeof err)) fail_msg("run: %s", err);
  st_free(&params);
  st_free(&inputs);
}

static void order_str(const IrFunc *f, StrBuf *out) {
  for (int i = 0; i < f->nops; i++) sb_printf(out, "%d,", f->ops[i]->result ? f->ops[i]->result->id : -1);
}

static void check_same_gradients(const char *text, int gas, int64_t bucket_bytes) {
  Compiled plain, on, off;
  compile(&plain, text, gas, 1, 0, false);
  compile(&on, text, gas, 2, bucket_bytes, false);
  compile(&off, text, gas, 2, bucket_bytes, true);
  StrBuf a, b;
  sb_init(&a);
  sb_init(&b);
  order_str(on.m->func, &a);
  order_str(off.m->func, &b);
  assert_string_not_equal(sb_str(&a), sb_str(&b)); /* the schedules differ */
  sb_free(&a);
  sb_free(&b);
  StepResult r0, r1, r2;
  run_ref(plain.m->func, gas, &r0);
  run_ref(on.m->func, gas, &r1);
  run_ref(off.m->func, gas, &r2);
  assert_int_equal(r0.ngrads, r1.ngrads);
  assert_int_equal(r0.ngrads, r2.ngrads);
  for (int i = 0; i < r0.nlosses; i++) {
    assert_memory_equal(&r0.losses[i], &r1.losses[i], sizeof(double));
    assert_memory_equal(&r0.losses[i], &r2.losses[i], sizeof(double));
  }
  for (int i = 0; i < r0.ngrads; i++) {
    size_t n = (size_t)ir_numel(&r0.grad_types[i].shape);
    assert_string_equal(r0.grad_names[i], r1.grad_names[i]);
    assert_memory_equal(r0.grads[i], r1.grads[i], n * sizeof(double));
    assert_memory_equal(r0.grads[i], r2.grads[i], n * sizeof(double));
  }
  step_result_free(&r0);
  step_result_free(&r1);
  step_result_free(&r2);
  release(&plain);
  release(&on);
  release(&off);
}

static void test_schedule_same_gradients_overlap_on_off(void **state) {
  (void)state;
  check_same_gradients(mlp3, 1, 400);
  check_same_gradients(mlp3, 4, 1);
  char *text = tu_read("examples/tinygpt.gdl");
  check_same_gradients(text, 2, 100000);
  free(text);
}

static void test_schedule_deterministic(void **state) {
  (void)state;
  char *text = tu_read("examples/tinygpt.gdl");
  StrBuf a, b;
  sb_init(&a);
  sb_init(&b);
  Compiled c1, c2;
  compile(&c1, text, 1, 2, 50000, false);
  compile(&c2, text, 1, 2, 50000, false);
  ir_print(c1.m->func, &a);
  ir_print(c2.m->func, &b);
  assert_string_equal(sb_str(&a), sb_str(&b));
  /* Scheduling again changes nothing. */
  schedule(c1.m->func, false);
  sb_free(&b);
  sb_init(&b);
  ir_print(c1.m->func, &b);
  assert_string_equal(sb_str(&a), sb_str(&b));
  sb_free(&a);
  sb_free(&b);
  release(&c1);
  release(&c2);
  free(text);
}

/* Cost model: a 64x64x64 GEMM is 2*64^3 FLOPs; an all-reduce of 1024 f32
 * over 2 ranks sends 2*(1/2)*4096 bytes; the simulation of start, GEMM,
 * wait hides the GEMM's time under the collective. */
static void test_cost_model_hand_figures(void **state) {
  (void)state;
  const char *text = "func @c(%x: f32[64,64] input, %v: f32[1024] input) {\n"
                     "  %s = all_reduce.start %v {group=\"dp\", ranks=2} : f32[1024]\n"
                     "  %m = matmul %x, %x : f32[64,64]\n"
                     "  %r = all_reduce.wait %s {group=\"dp\", ranks=2} : f32[1024]\n"
                     "  %a = sum %m {axes=[0,1], keepdim=false} : f32\n"
                     "  %b = sum %r {axes=[0], keepdim=false} : f32\n"
                     "  %t = add %a, %b : f32\n"
                     "  loss %t {name=\"l\"}\n"
                     "}\n";
  IrFunc *f = read_ir(text);
  const IrOp *start = f->ops[0], *mm = f->ops[1];
  assert_true(cost_op_flops(mm) == 2.0 * 64 * 64 * 64);
  assert_true(cost_collective_bytes(start) == 4096.0);
  CostModel m = {.flops_per_s = 2.0 * 64 * 64 * 64 / 0.25, /* the GEMM: 0.25 s */
                 .mem_bytes_per_s = 1e30,
                 .kernel_s = 0,
                 .link_bytes_per_s = 4096.0 / 0.75, /* 0.75 s of bytes */
                 .link_latency_s = 0.25};           /* + 0.25 s: 1 s in all */
  assert_true(cost_collective_s(&m, start, true) > 0.999999 && cost_collective_s(&m, start, true) < 1.000001);
  /* The sums and add: 4096 + 1024 + 1 FLOPs at this rate. */
  double tail = (4096.0 + 1024.0 + 1.0) / m.flops_per_s;
  CostSim on, off;
  cost_simulate(f, &m, true, &on);
  cost_simulate(f, &m, false, &off);
  assert_int_equal(on.ncollectives, 1);
  assert_true(fabs(on.comm_s - 1.0) < 1e-9);
  assert_true(fabs(on.compute_s - (0.25 + tail)) < 1e-9);
  assert_true(fabs(on.exposed_s - 0.75) < 1e-9);
  assert_true(fabs(on.step_s - (1.0 + tail)) < 1e-9);
  assert_true(fabs(off.exposed_s - 1.0) < 1e-9);
  assert_true(fabs(off.step_s - (1.25 + tail)) < 1e-9);
  ir_func_free(f);
}

/* Views cost nothing: a contiguous range slice (an alias), a group-0
 * range unslice (filled in place), and the unslice of a stacked
 * gradient's slice reduction that fuse made a kernel of its own (memplan
 * puts it back in group 0); the same unslice of anything else in a kernel
 * of its own is work.  The rank-dependent copies cost a memory copy of
 * their result: kernel_s + 2 bytes / bandwidth. */
static void test_cost_model_views_and_rank_copies(void **state) {
  (void)state;
  const char *text =
      "func @v(%W: f32[3,8,8] param, %x: f32[2,8,16] input) {\n"
      "  %w1 = slice %W {starts=[1,0,0], stops=[2,8,8], steps=[1,1,1]} : f32[1,8,8]\n"
      "  %sl = slice %W {starts=[0,0,0], stops=[3,8,4], steps=[1,1,1]} : f32[3,8,4]\n"
      "  %st = all_reduce.start %w1 {group=\"dp\", ranks=2, bucket=0, last=true} : f32[1,8,8]\n"
      "  %wt = all_reduce.wait %st {group=\"dp\", ranks=2, bucket=0, last=true} : f32[1,8,8]\n"
      "  %g = unslice %wt {starts=[1,0,0], stops=[2,8,8], steps=[1,1,1], shape=[3,8,8]} : f32[3,8,8]\n"
      "  %u = unslice %w1 {starts=[1,0,0], stops=[2,8,8], steps=[1,1,1], shape=[3,8,8]} : f32[3,8,8]\n"
      "  %a = tp.scatter %x {group=\"tp\", ranks=2, axis=1} : f32[2,4,16]\n"
      "  %b = rank.slice %x {group=\"tp\", ranks=2, axis=2, shift=1} : f32[2,8,8]\n"
      "  %c = rank.concat %b, %b {group=\"tp\", ranks=2, axis=2} : f32[2,8,16]\n"
      "  grad %g {name=\"W\"}\n"
      "  grad %u {name=\"W\"}\n"
      "  %sa = sum %a {axes=[0,1,2], keepdim=false} : f32\n"
      "  %sc = sum %c {axes=[0,1,2], keepdim=false} : f32\n"
      "  %ss = sum %sl {axes=[0,1,2], keepdim=false} : f32\n"
      "  %t = add %sa, %sc : f32\n"
      "  %t2 = add %t, %ss : f32\n"
      "  loss %t2 {name=\"l\"}\n"
      "}\n";
  IrFunc *f = read_ir(text);
  CostModel m = {.flops_per_s = 1e30, .mem_bytes_per_s = 1e9, .kernel_s = 1e-6, .link_bytes_per_s = 1e9,
                 .link_latency_s = 0};
  IrOp *w1 = f->ops[0], *sl = f->ops[1], *g = f->ops[4], *u = f->ops[5], *a = f->ops[6], *b = f->ops[7],
       *c = f->ops[8];
  assert_int_equal(g->opcode, IR_OP_UNSLICE);
  assert_int_equal(c->opcode, IR_OP_RANK_CONCAT);
  assert_true(cost_compute_s(&m, &w1, 1, NULL) == 0);
  assert_true(cost_compute_s(&m, &u, 1, NULL) == 0);
  assert_true(cost_compute_s(&m, &g, 1, NULL) == 0);
  g->group = 1; /* fuse's kernel of its own */
  assert_true(cost_compute_s(&m, &g, 1, NULL) == 0);
  u->group = 2; /* an unslice of something else in a kernel: zeros and the slice, 768 B, plus its 256 B operand */
  assert_true(fabs(cost_compute_s(&m, &u, 1, NULL) - (1e-6 + 1024e-9)) < 1e-15);
  /* Not one contiguous range: a copy (768 B read, 384 written). */
  assert_true(fabs(cost_compute_s(&m, &sl, 1, NULL) - (1e-6 + 1152e-9)) < 1e-15);
  /* tp.scatter [2,4,16] and rank.slice [2,8,8]: 512 B each, read and
   * written; rank.concat [2,8,16]: 1024 B. */
  assert_true(fabs(cost_compute_s(&m, &a, 1, NULL) - (1e-6 + 1024e-9)) < 1e-15);
  assert_true(fabs(cost_compute_s(&m, &b, 1, NULL) - (1e-6 + 1024e-9)) < 1e-15);
  assert_true(fabs(cost_compute_s(&m, &c, 1, NULL) - (1e-6 + 2048e-9)) < 1e-15);
  ir_func_free(f);
}

/* Collectives queue on their group's link, as on the runtime's simulated
 * link: two dp all-reduces started together of 1 s each end at 1 s and
 * 2 s; a tp one started with them has its own link (ends at 1 s).  With a
 * 0.25 s GEMM between the starts and the waits: exposed 0.75 s (dp 1)
 * + 1 s (dp 2, queued), tp hidden.  Without overlap every start blocks:
 * 3 s exposed. */
static void test_cost_model_links_queue_per_group(void **state) {
  (void)state;
  const char *text = "func @q(%x: f32[64,64] input, %u: f32[1024] input, %v: f32[1024] input) {\n"
                     "  %s1 = all_reduce.start %u {group=\"dp\", ranks=2} : f32[1024]\n"
                     "  %s2 = all_reduce.start %v {group=\"dp\", ranks=2} : f32[1024]\n"
                     "  %s3 = all_reduce.start %u {group=\"tp\", ranks=2} : f32[1024]\n"
                     "  %m = matmul %x, %x : f32[64,64]\n"
                     "  %r1 = all_reduce.wait %s1 {group=\"dp\", ranks=2} : f32[1024]\n"
                     "  %r2 = all_reduce.wait %s2 {group=\"dp\", ranks=2} : f32[1024]\n"
                     "  %r3 = all_reduce.wait %s3 {group=\"tp\", ranks=2} : f32[1024]\n"
                     "  %a = sum %m {axes=[0,1], keepdim=false} : f32\n"
                     "  %b = sum %r1 {axes=[0], keepdim=false} : f32\n"
                     "  %c = sum %r2 {axes=[0], keepdim=false} : f32\n"
                     "  %d = sum %r3 {axes=[0], keepdim=false} : f32\n"
                     "  %t1 = add %a, %b : f32\n"
                     "  %t2 = add %t1, %c : f32\n"
                     "  %t3 = add %t2, %d : f32\n"
                     "  loss %t3 {name=\"l\"}\n"
                     "}\n";
  IrFunc *f = read_ir(text);
  CostModel m = {.flops_per_s = 2.0 * 64 * 64 * 64 / 0.25, .mem_bytes_per_s = 1e30, .kernel_s = 0,
                 .link_bytes_per_s = 4096.0 / 0.75, .link_latency_s = 0.25};
  double tail = (4096.0 + 3 * 1024.0 + 3.0) / m.flops_per_s;
  CostSim on, off;
  cost_simulate(f, &m, true, &on);
  cost_simulate(f, &m, false, &off);
  assert_int_equal(on.ncollectives, 3);
  assert_true(fabs(on.comm_s - 3.0) < 1e-9);
  assert_true(fabs(on.compute_s - (0.25 + tail)) < 1e-9);
  assert_true(fabs(on.exposed_s - 1.75) < 1e-9);
  assert_true(fabs(on.step_s - (2.0 + tail)) < 1e-9);
  assert_true(fabs(off.exposed_s - 3.0) < 1e-9);
  assert_true(fabs(off.step_s - (3.25 + tail)) < 1e-9);
  ir_func_free(f);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_dp_reduce_buckets_reverse_forward_use),
      cmocka_unit_test(test_schedule_bucket_starts_after_last_contribution),
      cmocka_unit_test(test_dp_reduce_stacked_param_one_reduction_per_layer),
      cmocka_unit_test(test_schedule_megatron_weight_gradient_under_reduction),
      cmocka_unit_test(test_schedule_gather_overlaps_local_gemm),
      cmocka_unit_test(test_schedule_no_overlap_waits_follow_starts),
      cmocka_unit_test(test_schedule_same_gradients_overlap_on_off),
      cmocka_unit_test(test_schedule_deterministic),
      cmocka_unit_test(test_cost_model_hand_figures),
      cmocka_unit_test(test_cost_model_views_and_rank_copies),
      cmocka_unit_test(test_cost_model_links_queue_per_group),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
