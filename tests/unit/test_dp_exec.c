/* test_dp_exec.c - collectives executed by the step drivers (the CPU
 * executor and the reference interpreter) on the ranks of a distributed
 * window (runtime/comm_step.c, docs/DISTRIBUTED.md):
 *
 *   - every collective kind over the tp and dp groups, along axis 0 and 1,
 *     f32 and f64, several in flight across a kernel and a GEMM, against
 *     values worked out by hand from each rank's input (2 ranks: tp 2; 4
 *     ranks: tp 2 x dp 2);
 *   - a tensor-parallel model (tests/models/tp_mlp.gdl: a column-parallel
 *     W1 split along axis 1, a row-parallel W2) on 2 ranks, each rank
 *     binding its slice of the whole params and getting the whole
 *     gradients, equal to the unsharded model run in the same process;
 *   - data-parallel buckets (dp-reduce's last=true all-reduces): the CPU
 *     executor's in-place bucket reductions equal the step layer's
 *     reduction after the window (the program compiled without dp-reduce),
 *     for small buckets (several per step) and with overlap on and off
 *     (bit for bit), K = 1 and 2; the interpreter on the same IR (K = 1).
 *
 * The cases run this executable again under mpirun (`--worker NAME T D`)
 * and are skipped with a message when the build has no MPI or mpirun is
 * absent (test_dp.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gradc.h"
#include "passes/passes.h"
#include "runtime/comm/comm.h"
#include "test_dp.h"

/* ------------------------------------------------------------------ */
/* Workers (one per rank, under mpirun)                                 */
/* ------------------------------------------------------------------ */

/* Rank r's input: x[i][j] = 100 r + 10 i + j + 0.5 (exact in f32). */
static double xval(int r, int i, int j) { return 100.0 * r + 10.0 * i + j + 0.5; }

/* World rank of member k of this rank's group (tp: adjacent ranks). */
static int member(const Comm *c, bool tp, int k) {
  return tp ? (c->rank / c->tp) * c->tp + k : (c->rank % c->tp) + k * c->tp;
}

/* The expected results.  Shapes: x [2, 4]; G ranks in the group. */
typedef struct Want {
  const char *name;
  int rows, cols;
  double v[64];
} Want;

static void want_all_reduce(const Comm *c, bool tp, double scale, Want *w) {
  int G = tp ? c->tp : c->dp;
  w->rows = 2, w->cols = 4;
  for (int i = 0; i < 2; i++)
    for (int j = 0; j < 4; j++) {
      double s = 0;
      for (int k = 0; k < G; k++) s += scale * xval(member(c, tp, k), i, j);
      w->v[i * 4 + j] = s;
    }
}

static void want_all_gather(const Comm *c, bool tp, int axis, Want *w) {
  int G = tp ? c->tp : c->dp;
  w->rows = axis == 0 ? 2 * G : 2;
  w->cols = axis == 1 ? 4 * G : 4;
  for (int i = 0; i < w->rows; i++)
    for (int j = 0; j < w->cols; j++) {
      int k = axis == 0 ? i / 2 : j / 4;
      w->v[i * w->cols + j] = xval(member(c, tp, k), axis == 0 ? i % 2 : i, axis == 1 ? j % 4 : j);
    }
}

static void want_reduce_scatter(const Comm *c, bool tp, int axis, double scale, Want *w) {
  int G = tp ? c->tp : c->dp, me = tp ? c->rank % c->tp : c->rank / c->tp;
  w->rows = axis == 0 ? 2 / G : 2;
  w->cols = axis == 1 ? 4 / G : 4;
  for (int i = 0; i < w->rows; i++)
    for (int j = 0; j < w->cols; j++) {
      double s = 0;
      for (int k = 0; k < G; k++)
        s += scale * xval(member(c, tp, k), axis == 0 ? me * w->rows + i : i, axis == 1 ? me * w->cols + j : j);
      w->v[i * w->cols + j] = s;
    }
}

/* Every kind over tp (T ranks) and dp (D ranks, the identity when 1),
 * several in flight across a kernel and a GEMM that reads one's result;
 * each result is the gradient of a param of its shape. */
static char *coll_ir(int T, int D) {
  static char buf[8192];
  snprintf(buf, sizeof buf,
           "func @coll(%%x: f32[2,4] input, %%y: f64[2,4] input, %%g0: f32[2,4] param, %%g1: f32[%d,4] param, "
           "%%g2: f32[2,%d] param, %%g3: f32[%d,4] param, %%g4: f32[2,%d] param, %%g5: f32[2,4] param, "
           "%%g6: f32[2,%d] param, %%g7: f64[2,%d] param, %%g8: f32[2,4] param, %%g9: f32[2,%d] param) {\n"
           "  %%s0 = all_reduce.start %%x {group=\"tp\", ranks=%d} : f32[2,4]\n"
           "  %%s1 = all_gather.start %%x {group=\"tp\", ranks=%d, axis=0} : f32[%d,4]\n"
           "  %%s2 = all_gather.start %%x {group=\"tp\", ranks=%d, axis=1} : f32[2,%d]\n"
           "  %%s3 = reduce_scatter.start %%x {group=\"tp\", ranks=%d, axis=0} : f32[%d,4]\n"
           "  %%s4 = reduce_scatter.start %%x {group=\"tp\", ranks=%d, axis=1} : f32[2,%d]\n"
           "  %%h = const {value=0.5} : f32\n"
           "  %%k = mul %%x, %%h : f32[2,4]\n"
           "  %%s5 = all_reduce.start %%k {group=\"dp\", ranks=%d} : f32[2,4]\n"
           "  %%s6 = all_gather.start %%x {group=\"dp\", ranks=%d, axis=1} : f32[2,%d]\n"
           "  %%s7 = reduce_scatter.start %%y {group=\"tp\", ranks=%d, axis=1} : f64[2,%d]\n"
           "  %%s9 = reduce_scatter.start %%x {group=\"dp\", ranks=%d, axis=1} : f32[2,%d]\n"
           "  %%w1 = all_gather.wait %%s1 : f32[%d,4]\n"
           "  %%w0 = all_reduce.wait %%s0 : f32[2,4]\n"
           "  %%m = matmul %%w0, %%w1 : f32[2,4]\n"
           "  %%w2 = all_gather.wait %%s2 : f32[2,%d]\n"
           "  %%w3 = reduce_scatter.wait %%s3 : f32[%d,4]\n"
           "  %%w4 = reduce_scatter.wait %%s4 : f32[2,%d]\n"
           "  %%w5 = all_reduce.wait %%s5 : f32[2,4]\n"
           "  %%w6 = all_gather.wait %%s6 : f32[2,%d]\n"
           "  %%w7 = reduce_scatter.wait %%s7 : f64[2,%d]\n"
           "  %%w9 = reduce_scatter.wait %%s9 : f32[2,%d]\n"
           "  grad %%w0 {name=\"g0\"}\n  grad %%w1 {name=\"g1\"}\n  grad %%w2 {name=\"g2\"}\n"
           "  grad %%w3 {name=\"g3\"}\n  grad %%w4 {name=\"g4\"}\n  grad %%w5 {name=\"g5\"}\n"
           "  grad %%w6 {name=\"g6\"}\n  grad %%w7 {name=\"g7\"}\n  grad %%m {name=\"g8\"}\n  grad %%w9 {name=\"g9\"}\n"
           "}\n",
           2 * T, 4 * T, 2 / T, 4 / T, 4 * D, 4 / T, 4 / D,          /* params */
           T, T, 2 * T, T, 4 * T, T, 2 / T, T, 4 / T,              /* s0..s4 */
           D, D, 4 * D, T, 4 / T, D, 4 / D,                        /* s5..s9 */
           2 * T, 4 * T, 2 / T, 4 / T, 4 * D, 4 / T, 4 / D);       /* waits */
  return buf;
}

static void tensor(StFile *f, const char *name, bool f64, int rows, int cols, double (*v)(int, int, int), int r,
                   double scale) {
  int64_t shape[2] = {rows, cols};
  double d[64];
  float s[64];
  for (int i = 0; i < rows; i++)
    for (int j = 0; j < cols; j++) {
      d[i * cols + j] = v ? scale * v(r, i, j) : 0;
      s[i * cols + j] = (float)d[i * cols + j];
    }
  st_add(f, name, f64 ? ST_F64 : ST_F32, 2, shape, f64 ? (void *)d : (void *)s);
}

/* One driver's results against the hand-computed values. */
static int check_coll(const Comm *c, const StepResult *r, const char *what) {
  Want w[10];
  memset(w, 0, sizeof w);
  want_all_reduce(c, true, 1, &w[0]);
  want_all_gather(c, true, 0, &w[1]);
  want_all_gather(c, true, 1, &w[2]);
  want_reduce_scatter(c, true, 0, 1, &w[3]);
  want_reduce_scatter(c, true, 1, 1, &w[4]);
  want_all_reduce(c, false, 0.5, &w[5]);
  want_all_gather(c, false, 1, &w[6]);
  want_reduce_scatter(c, true, 1, -0.25, &w[7]);
  want_reduce_scatter(c, false, 1, 1, &w[9]);
  /* g8 = w0 @ w1[0:4] (w1 is [2T, 4]: its first 4 rows, T = 2). */
  w[8].rows = 2, w[8].cols = 4;
  for (int i = 0; i < 2; i++)
    for (int j = 0; j < 4; j++) {
      double s = 0;
      for (int k = 0; k < 4; k++) s += w[0].v[i * 4 + k] * w[1].v[k * 4 + j];
      w[8].v[i * 4 + j] = s;
    }
  CHECK(r->ngrads == 10, "%s: %d gradients", what, r->ngrads);
  for (int g = 0; g < 10; g++) {
    int64_t n = ir_numel(&r->grad_types[g].shape);
    CHECK(n == w[g].rows * w[g].cols, "%s: g%d has %lld elements, want %d", what, g, (long long)n, w[g].rows * w[g].cols);
    for (int64_t k = 0; k < n; k++)
      CHECK(fabs(r->grads[g][k] - w[g].v[k]) <= 1e-6 * fabs(w[g].v[k]), "%s: g%d[%lld] = %.9g, want %.9g", what, g,
            (long long)k, r->grads[g][k], w[g].v[k]);
  }
  return 0;
}

static int worker_coll(Comm *c) {
  char err[2048];
  IrFunc *ref = dp_parse("coll.gir", coll_ir(c->tp, c->dp)), *cpu = dp_parse("coll.gir", coll_ir(c->tp, c->dp));
  CHECK(ref && cpu, "parse");
  static const char *const cpu_passes[] = {"fuse", "memplan"};
  PassOptions po = {.gas = 1};
  CHECK(dp_run_passes(cpu, cpu_passes, 2, &po) == 0, "fuse, memplan");
  StFile params, inputs;
  st_init(&params);
  st_init(&inputs);
  tensor(&inputs, "x", false, 2, 4, xval, c->rank, 1);
  tensor(&inputs, "y", true, 2, 4, xval, c->rank, -0.25);
  for (int i = 0; i < ref->nargs; i++) {
    const IrValue *a = ref->args[i];
    if (a->role == IR_ARG_PARAM)
      tensor(&params, a->name, a->type.dtype == IR_DT_F64, (int)a->type.shape.dim[0], (int)a->type.shape.dim[1], NULL,
             0, 0);
  }
  StepDp d;
  step_dp_init(&d, c);
  StepResult r;
  /* The reference interpreter, then the CPU executor (twice: buffers reused). */
  step_dp_begin(&d);
  CHECK(step_run_ref(ref, 1, &params, "params", &inputs, "inputs", NULL, &r, err, sizeof err), "ref: %s", err);
  CHECK(step_dp_end(&d, NULL, err, sizeof err), "%s", err);
  if (check_coll(c, &r, "ref")) return 1;
  step_result_free(&r);
  CpuOptions co = {.threads = 1, .cache_dir = getenv("GRADC_CACHE_DIR")};
  CpuProgram *p = cpu_program_new(cpu, &co, err, sizeof err);
  CHECK(p, "cpu_program_new: %s", err);
  for (int rep = 0; rep < 2; rep++) {
    step_dp_begin(&d);
    CHECK(cpu_step_run(p, 1, &params, "params", &inputs, "inputs", &r, err, sizeof err), "cpu: %s", err);
    CHECK(step_dp_end(&d, NULL, err, sizeof err), "%s", err);
    if (check_coll(c, &r, "cpu")) return 1;
    step_result_free(&r);
  }
  /* Every rank issued the same collectives in the same order. */
  CHECK(comm_check(&c->world, "the test", err, sizeof err), "%s", err);
  cpu_program_free(p);
  step_dp_free(&d);
  st_free(&params);
  st_free(&inputs);
  ir_func_free(ref);
  ir_func_free(cpu);
  return 0;
}

/* ---- models ---- */

static FeModel *model(const char *rel, int gas, int dp, char **text) {
  static SrcFile src;
  *text = tu_read(rel);
  src.name = rel;
  src.text = *text;
  src.len = strlen(*text);
  Diag d;
  diag_init(&d, NULL);
  d.quiet = true;
  FeOptions fo = {.gas = gas, .dp = dp};
  FeModel *m = fe_model_compile(&src, &fo, &d);
  if (!m) fprintf(stderr, "%s\n", sb_str(&d.log));
  diag_free(&d);
  return m;
}

/* Params ~ N(0, 0.3^2), whole (the declared shapes). */
static void whole_params(const IrFunc *f, uint64_t seed, StFile *out) {
  Rng r;
  rng_seed(&r, seed);
  st_init(out);
  for (int i = 0; i < f->nargs; i++) {
    const IrValue *a = f->args[i];
    if (a->role != IR_ARG_PARAM) continue;
    IrType t = step_arg_type(a);
    int64_t n = ir_numel(&t.shape);
    float *data = calloc((size_t)n + 1, sizeof(float));
    for (int64_t k = 0; k < n; k++) data[k] = (float)(rng_normal(&r) * 0.3);
    st_add(out, a->name, ST_F32, t.shape.rank, t.shape.dim, data);
    free(data);
  }
}

static double worst_rel(const StepResult *got, const StepResult *want, bool *same_bits) {
  double worst = 0;
  *same_bits = true;
  for (int i = 0; i < want->nlosses; i++) {
    worst = fmax(worst, dp_rel(got->losses[i], want->losses[i]));
    *same_bits &= got->losses[i] == want->losses[i];
  }
  for (int i = 0; i < want->ngrads; i++) {
    int64_t n = ir_numel(&want->grad_types[i].shape);
    if (ir_numel(&got->grad_types[i].shape) != n) return INFINITY;
    double d = 0, s = 0;
    for (int64_t k = 0; k < n; k++) {
      d = fmax(d, fabs(got->grads[i][k] - want->grads[i][k]));
      s = fmax(s, fabs(want->grads[i][k]));
      *same_bits &= got->grads[i][k] == want->grads[i][k];
    }
    if (d > 0) worst = fmax(worst, s > 0 ? d / s : INFINITY);
  }
  return worst;
}

/* One window of f on this rank's window (under d when given). */
static bool window(IrFunc *f, bool cpu, int gas, StepDp *d, const StFile *params, const StFile *inputs, StepResult *r,
                   char *err, size_t n) {
  if (d) step_dp_begin(d);
  bool ok;
  if (cpu) {
    CpuOptions co = {.threads = 1, .cache_dir = getenv("GRADC_CACHE_DIR")};
    CpuProgram *p = cpu_program_new(f, &co, err, n);
    ok = p && cpu_step_run(p, gas, params, "params", inputs, "inputs", r, err, n);
    cpu_program_free(p);
  } else {
    ok = step_run_ref(f, gas, params, "params", inputs, "inputs", NULL, r, err, n);
  }
  if (d && !step_dp_end(d, ok ? r : NULL, err, n) && ok) {
    step_result_free(r);
    ok = false;
  }
  return ok;
}

/* tp_mlp on T ranks against the unsharded model in this process. */
static int worker_tp(Comm *c) {
  char err[2048];
  StepDp d;
  step_dp_init(&d, c);
  for (int K = 1; K <= 2; K++)
    for (int cpu = 0; cpu < 2; cpu++) {
      char *text, *text2;
      FeModel *m1 = model("tests/models/tp_mlp.gdl", K, 1, &text), *m2 = model("tests/models/tp_mlp.gdl", K, 1, &text2);
      CHECK(m1 && m2, "tp_mlp does not compile");
      int n;
      const char *const *pipe = cpu ? pass_pipeline_cpu(&n) : pass_pipeline(&n);
      PassOptions one = {.gas = K}, sharded = {.gas = K, .tp = c->tp};
      CHECK(dp_run_passes(m1->func, pipe, n, &one) == 0 && dp_run_passes(m2->func, pipe, n, &sharded) == 0, "passes");
      int split = 0;
      for (int i = 0; i < m2->func->nargs; i++) split += m2->func->args[i]->split_ranks > 1;
      CHECK(split == 3, "%d params sharded, want 3", split);
      StFile params, inputs;
      whole_params(m1->func, 11, &params);
      st_init(&inputs);
      rt_random_inputs(m1->func, K, 12, &inputs);
      StepResult want, got;
      CHECK(window(m1->func, cpu, K, NULL, &params, &inputs, &want, err, sizeof err), "one process: %s", err);
      CHECK(window(m2->func, cpu, K, &d, &params, &inputs, &got, err, sizeof err), "tp %d: %s", c->tp, err);
      bool same;
      double e = worst_rel(&got, &want, &same);
      CHECK(e < DP_TOL, "tp_mlp %s K=%d: relative error %.3g", cpu ? "cpu" : "ref", K, e);
      if (c->rank == 0) printf("tp_mlp %s K=%d tp %d: relative error %.3g\n", cpu ? "cpu" : "ref", K, c->tp, e);
      step_result_free(&want);
      step_result_free(&got);
      st_free(&params);
      st_free(&inputs);
      fe_model_free(m1);
      fe_model_free(m2);
      free(text);
      free(text2);
    }
  step_dp_free(&d);
  return 0;
}

/* mlp on D data-parallel ranks: buckets (dp-reduce) against the step
 * layer's reduction after the window. */
static int worker_bucket(Comm *c) {
  char err[2048];
  StepDp d;
  step_dp_init(&d, c);
  const char *models[] = {"examples/mlp.gdl", "examples/tinygpt.gdl"};
  for (int mi = 0; mi < 2; mi++)
    for (int K = 1; K <= 2; K++)
      for (int cpu = K == 1 ? 0 : 1; cpu < 2; cpu++) { /* the interpreter at K = 1 only (time) */
        char *t[4];
        FeModel *m[4];
        for (int k = 0; k < 4; k++) {
          m[k] = model(models[mi], K, c->dp, &t[k]);
          CHECK(m[k], "%s does not compile", models[mi]);
        }
        int n;
        const char *const *pipe = cpu ? pass_pipeline_cpu(&n) : pass_pipeline(&n);
        /* 0: reduced after the window; 1: buckets of 64 KiB; 2: the same
         * without overlap; 3: the default buckets. */
        PassOptions o[4] = {{.gas = K},
                            {.gas = K, .dp = c->dp, .bucket_bytes = 65536},
                            {.gas = K, .dp = c->dp, .bucket_bytes = 65536, .no_overlap = true},
                            {.gas = K, .dp = c->dp}};
        for (int k = 0; k < 4; k++) CHECK(dp_run_passes(m[k]->func, pipe, n, &o[k]) == 0, "passes %d", k);
        int buckets = -1, lasts = 0, nparams = 0; /* a stacked param's slices are reduced one by one */
        for (int i = 0; i < m[1]->func->nops; i++) {
          const IrOp *op = m[1]->func->ops[i];
          if (op->opcode == IR_OP_GRAD) {
            bool seen = false;
            for (int j = 0; j < i && !seen; j++)
              seen = m[1]->func->ops[j]->opcode == IR_OP_GRAD &&
                     strcmp(ir_attr_get_str(m[1]->func->ops[j], "name", ""), ir_attr_get_str(op, "name", "")) == 0;
            nparams += !seen;
          }
          if (op->opcode != IR_OP_ALL_REDUCE_START || !step_coll_last(op)) continue;
          lasts++;
          buckets = (int)fmax(buckets, (double)ir_attr_get_int(op, "bucket", 0));
        }
        CHECK(lasts > 0, "no last=true reductions (dp-reduce)");
        StFile params, inputs;
        whole_params(m[0]->func, 21, &params);
        st_init(&inputs);
        rt_random_inputs(m[0]->func, K * c->dp, 22, &inputs);
        StepResult r[4];
        for (int k = 0; k < 4; k++)
          CHECK(window(m[k]->func, cpu, K, &d, &params, &inputs, &r[k], err, sizeof err), "%s %d: %s", models[mi], k, err);
        bool same;
        for (int k = 1; k < 4; k++) {
          double e = worst_rel(&r[k], &r[0], &same);
          CHECK(e < DP_TOL, "%s %s K=%d variant %d: relative error %.3g", models[mi], cpu ? "cpu" : "ref", K, k, e);
          int reduced = 0;
          for (int g = 0; r[k].dp_reduced && g < r[k].ngrads; g++) reduced += r[k].dp_reduced[g];
          CHECK(cpu ? reduced == nparams : reduced == 0, "%d gradients reduced by the driver", reduced);
        }
        (void)worst_rel(&r[2], &r[1], &same);
        CHECK(same, "%s %s K=%d: overlap on and off differ", models[mi], cpu ? "cpu" : "ref", K);
        if (c->rank == 0)
          printf("%s %s K=%d dp %d: %d reductions in %d buckets, relative error %.3g\n", models[mi], cpu ? "cpu" : "ref",
                 K, c->dp, lasts, buckets + 1, worst_rel(&r[1], &r[0], &same));
        for (int k = 0; k < 4; k++) {
          step_result_free(&r[k]);
          fe_model_free(m[k]);
          free(t[k]);
        }
        st_free(&params);
        st_free(&inputs);
      }
  step_dp_free(&d);
  return 0;
}

static int worker(const char *name, int tp, int dp) {
  Comm *c = dp_worker_open(tp, dp);
  if (!c) return 1;
  int rc = 1;
  if (strcmp(name, "coll") == 0) rc = worker_coll(c);
  else if (strcmp(name, "tp") == 0) rc = worker_tp(c);
  else if (strcmp(name, "bucket") == 0) rc = worker_bucket(c);
  return dp_worker_close(c, name, rc);
}

/* ------------------------------------------------------------------ */
/* Tests                                                                */
/* ------------------------------------------------------------------ */

static bool have_kernels(void) {
#ifdef GRADC_HAVE_LLVM
  return true;
#else
  print_message("skipped: this build has no LLVM (the CPU executor's kernels)\n");
  return false;
#endif
}

static void test_dp_exec_collectives_on_tp2(void **state) {
  (void)state;
  if (have_kernels()) dp_run_workers("coll", 2, 1);
}

static void test_dp_exec_collectives_on_tp2_dp2(void **state) {
  (void)state;
  if (have_kernels()) dp_run_workers("coll", 2, 2);
}

static void test_dp_exec_tp2_model_matches_one_process(void **state) {
  (void)state;
  if (have_kernels()) dp_run_workers("tp", 2, 1);
}

static void test_dp_exec_buckets_match_reduction_after_window(void **state) {
  (void)state;
  if (have_kernels()) dp_run_workers("bucket", 1, 2);
}

/* Without a distributed window a collective over 2 ranks is an error that
 * says what to pass. */
static void test_dp_exec_collective_without_ranks_is_an_error(void **state) {
  (void)state;
  if (!have_kernels()) return;
  IrFunc *ref = dp_parse("coll.gir", coll_ir(2, 1));
  assert_non_null(ref);
  StFile params, inputs;
  st_init(&params);
  st_init(&inputs);
  tensor(&inputs, "x", false, 2, 4, xval, 0, 1);
  tensor(&inputs, "y", true, 2, 4, xval, 0, 1);
  for (int i = 0; i < ref->nargs; i++) {
    const IrValue *a = ref->args[i];
    if (a->role == IR_ARG_PARAM)
      tensor(&params, a->name, a->type.dtype == IR_DT_F64, (int)a->type.shape.dim[0], (int)a->type.shape.dim[1], NULL,
             0, 0);
  }
  StepResult r;
  char err[1024];
  assert_false(step_run_ref(ref, 1, &params, "params", &inputs, "inputs", NULL, &r, err, sizeof err));
  assert_non_null(strstr(err, "collectives need a distributed runtime"));
  assert_non_null(strstr(err, "--tp/--dp"));
  st_free(&params);
  st_free(&inputs);
  ir_func_free(ref);
}

int main(int argc, char **argv) {
  if (argc == 5 && strcmp(argv[1], "--worker") == 0) return worker(argv[2], atoi(argv[3]), atoi(argv[4]));
  if (!dp_find_self()) return 1;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_dp_exec_collective_without_ranks_is_an_error),
      cmocka_unit_test(test_dp_exec_collectives_on_tp2),
      cmocka_unit_test(test_dp_exec_collectives_on_tp2_dp2),
      cmocka_unit_test(test_dp_exec_tp2_model_matches_one_process),
      cmocka_unit_test(test_dp_exec_buckets_match_reduction_after_window),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
