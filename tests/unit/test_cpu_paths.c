/* test_cpu_paths.c - the CPU back end's fast paths against the reference
 * interpreter: GEMMs cut into pieces over the thread pool (batches, row
 * blocks, column blocks, a grid of both with 4 threads, uneven with 3,
 * accumulating into gradient buffers; bf16 row blocks of a transposed A
 * copied dense, within bf16's rounding), weight gradients of batched
 * activations folded into one GEMM, stacked params read and
 * differentiated through range views (w[l] aliases its slice of the
 * param; w[l]'s gradient is accumulated by its GEMM straight into its
 * range of the gradient buffer), bias gradients summed as column sums
 * inside the kernels of their operands, attention's heads read and
 * written through strided views (by generated kernels in f32, by GEMMs
 * in f64), small batched products as generated kernels, and the products
 * of a causal softmax skipping its zeros.  Every loss and gradient equals
 * step_run_ref's within 1e-5 relative (f32) or 1e-12 (f64), at 1 to 4
 * threads (the stacked and attention cases at 1 and 3), K = 1 and 3. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "passes/kernel.h"
#include "passes/passes.h"
#include "runtime/runtime.h"
#include "testutil.h"

static IrFunc *read_ir(const char *text) {
  SrcFile src = {"test.gir", text, strlen(text)};
  Diag d;
  diag_init(&d, NULL);
  d.quiet = true;
  IrFunc *f = ir_read(&src, &d);
  if (!f) fail_msg("cannot read IR: %s", sb_str(&d.log));
  diag_free(&d);
  return f;
}

/* Run passes with options po (its diag is set here), verifying between them. */
static void run_passes(IrFunc *f, const char *const *names, int n, PassOptions po) {
  Diag d;
  diag_init(&d, NULL);
  d.quiet = true;
  PassManager pm;
  pm_init(&pm);
  pm.verify = true;
  po.diag = &d;
  if (pm_run(&pm, f, names, n, &po) != 0) fail_msg("passes failed: %s", sb_str(&d.log));
  diag_free(&d);
}

static void run_pipeline(IrFunc *f, const char *const *names, int n, int gas) {
  run_passes(f, names, n, (PassOptions){.gas = gas});
}

static void random_params(const IrFunc *f, uint64_t seed, double scale, StFile *out) {
  Rng r;
  rng_seed(&r, seed);
  st_init(out);
  for (int i = 0; i < f->nargs; i++) {
    const IrValue *a = f->args[i];
    if (a->role != IR_ARG_PARAM) continue;
    int64_t n = ir_numel(&a->type.shape);
    bool dbl = a->type.dtype == IR_DT_F64;
    void *data = calloc((size_t)(n ? n : 1), dbl ? 8 : 4);
    for (int64_t k = 0; k < n; k++) {
      double v = rng_normal(&r) * scale;
      if (dbl)
        ((double *)data)[k] = v;
      else
        ((float *)data)[k] = (float)v;
    }
    st_add(out, a->name, dbl ? ST_F64 : ST_F32, a->type.shape.rank, a->type.shape.dim, data);
    free(data);
  }
}

/* max |got - want| / max |want| */
static double rel_err(const double *got, const double *want, int64_t n) {
  double d = 0, s = 0;
  for (int64_t i = 0; i < n; i++) {
    if (isnan(got[i]) || isnan(want[i])) return INFINITY;
    if (fabs(got[i] - want[i]) > d) d = fabs(got[i] - want[i]);
    if (fabs(want[i]) > s) s = fabs(want[i]);
  }
  return d == 0 ? 0 : s > 0 ? d / s : INFINITY;
}

/* Run planned f on both back ends; fail past tol, return the worst error. */
static double run_files(IrFunc *f, int K, int threads, const StFile *params_in, const StFile *inputs_in, double tol,
                        const char *label) {
  const StFile params = *params_in, inputs = *inputs_in;
  char err[1024];
  StepResult want, got;
  if (!step_run_ref(f, K, &params, "P", &inputs, "I", NULL, &want, err, sizeof err)) fail_msg("%s: ref: %s", label, err);
  CpuOptions o = {.threads = threads, .cache_dir = getenv("GRADC_CACHE_DIR")};
  CpuProgram *p = cpu_program_new(f, &o, err, sizeof err);
  if (!p) fail_msg("%s: cpu_program_new: %s", label, err);
  if (!cpu_step_run(p, K, &params, "P", &inputs, "I", &got, err, sizeof err)) fail_msg("%s: cpu: %s", label, err);
  double worst = 0;
  assert_int_equal(got.nlosses, want.nlosses);
  assert_int_equal(got.ngrads, want.ngrads);
  for (int i = 0; i < want.nlosses; i++) {
    double e = rel_err(&got.losses[i], &want.losses[i], 1);
    if (e > tol) fail_msg("%s: loss %s: cpu %.17g ref %.17g", label, want.loss_names[i], got.losses[i], want.losses[i]);
    if (e > worst) worst = e;
  }
  for (int i = 0; i < want.ngrads; i++) {
    int64_t n = ir_numel(&want.grad_types[i].shape);
    double e = rel_err(got.grads[i], want.grads[i], n);
    if (e > tol) {
      for (int64_t k = 0; k < n && k < 6; k++)
        print_message("    [%lld] cpu %.17g  ref %.17g\n", (long long)k, got.grads[i][k], want.grads[i][k]);
      fail_msg("%s: gradient %s: relative error %.3g", label, want.grad_names[i], e);
    }
    if (e > worst) worst = e;
  }
  step_result_free(&want);
  step_result_free(&got);
  cpu_program_free(p);
  return worst;
}

static double run_both(IrFunc *f, int K, int threads, uint64_t seed, double tol, const char *label) {
  StFile params, inputs;
  random_params(f, seed, 0.5, &params);
  st_init(&inputs);
  rt_random_inputs(f, K, seed + 1, &inputs);
  double worst = run_files(f, K, threads, &params, &inputs, tol, label);
  st_free(&params);
  st_free(&inputs);
  return worst;
}

static char *replace_all(const char *s, const char *from, const char *to) {
  size_t nf = strlen(from), nt = strlen(to), cap = strlen(s) * 2 + 16, k = 0;
  char *r = malloc(cap);
  for (const char *p = s; *p;) {
    if (k + nt + 2 >= cap) r = realloc(r, cap *= 2);
    if (strncmp(p, from, nf) == 0) {
      memcpy(r + k, to, nt);
      k += nt;
      p += nf;
    } else {
      r[k++] = *p++;
    }
  }
  r[k] = 0;
  return r;
}

/* A model case: its f32 source, run as written and in f64, at K = 1 and
 * 3: compiled through the CPU pipeline, its structure checked by check,
 * then run against the interpreter at threads 1 to 3 in steps of
 * thread_step (seed + K). */
typedef struct ModelCase {
  const char *name;
  const char *src;
  int thread_step;
  uint64_t seed;
  void (*check)(IrFunc *f);
} ModelCase;

/* A model's source compiled for K micro-batches through the CPU pipeline
 * (free with fe_model_free). */
static FeModel *planned_model(const char *file, const char *text, int K) {
  int n;
  const char *const *pipe = pass_pipeline_cpu(&n);
  Diag d;
  FeModel *m = tu_compile(file, text, K, &d);
  if (!m) fail_msg("%s: %s", file, sb_str(&d.log));
  diag_free(&d);
  run_pipeline(m->func, pipe, n, K);
  return m;
}

static void run_model_case(const ModelCase *c) {
  char file[64];
  snprintf(file, sizeof file, "%s.gdl", c->name);
  for (int prec = 0; prec < 2; prec++) {
    char *text = prec ? replace_all(c->src, "f32", "f64") : strdup(c->src);
    for (int K = 1; K <= 3; K += 2) {
      FeModel *m = planned_model(file, text, K);
      IrFunc *f = m->func;
      c->check(f);
      for (int threads = 1; threads <= 3; threads += c->thread_step) {
        char label[64];
        snprintf(label, sizeof label, "%s %s threads=%d K=%d", c->name, prec ? "f64" : "f32", threads, K);
        double e = run_both(f, K, threads, c->seed + (uint64_t)K, prec ? 1e-12 : 1e-5, label);
        print_message("  %-30s worst relative error %.3g\n", label, e);
      }
      fe_model_free(m);
    }
    free(text);
  }
}

/* count(p) of f's CPU program on `threads` threads. */
static int program_count(IrFunc *f, int threads, int (*count)(const CpuProgram *)) {
  char err[1024];
  CpuOptions o = {.threads = threads, .cache_dir = getenv("GRADC_CACHE_DIR")};
  CpuProgram *p = cpu_program_new(f, &o, err, sizeof err);
  if (!p) fail_msg("cpu_program_new: %s", err);
  int n = count(p);
  cpu_program_free(p);
  return n;
}

/* ------------------------------------------------------------------ */
/* Products side by side                                               */
/* ------------------------------------------------------------------ */

/* At two threads, adjacent independent products of about the same work
 * run side by side (exec.c plan_pairs): the backward's dy V^T and h^T
 * dy, dz W^T and u^T dz, dv C^T and (x A)^T dv, three pairs; never x A
 * and (x A) C, adjacent too but the second reads the first.  f64 products
 * are GEMMs: no pairs.  Against the interpreter at one to three threads,
 * over one and three micro-batches (the weight gradients adding into
 * their buffers). */
static const char pairs_src[] =
    "model pairs {\n"
    "  batch B = 384\n"
    "  input x : f32[B, 64]\n"
    "  input t : f32[B, 64]\n"
    "  param A : f32[64, 64] init normal(0, 0.2)\n"
    "  param C : f32[64, 64] init normal(0, 0.2)\n"
    "  param W : f32[64, 96] init normal(0, 0.2)\n"
    "  param V : f32[96, 64] init normal(0, 0.2)\n"
    "  u = (x @ A) @ C\n"
    "  h = tanh(0.01 * (u @ W))\n"
    "  e = h @ V - t\n"
    "  loss l = mean(e * e)\n"
    "}\n";

static void check_pairs(IrFunc *f) {
  bool f32 = f->args[0]->type.dtype == IR_DT_F32;
  assert_int_equal(program_count(f, 2, cpu_program_paired_products), f32 ? 3 : 0);
  assert_int_equal(program_count(f, 1, cpu_program_paired_products), 0);
  assert_int_equal(program_count(f, 3, cpu_program_paired_products), 0);
}

static void test_cpu_paired_products(void **state) {
  (void)state;
  run_model_case(&(ModelCase){"pairs", pairs_src, 1, 53, check_pairs});
}

/* ------------------------------------------------------------------ */
/* Store-first products                                                */
/* ------------------------------------------------------------------ */

/* A generated product into a gradient buffer stores in micro-batch 0 (its
 * store twin) where nothing before it wrote those bytes, and the window
 * does not zero them: in pairs_src each of A, C, W and V gets its
 * gradient from one product.  Here W is used twice: of its two gradient
 * products (g = h W, then u = x W through tanh) only the first to run
 * stores, the second adds; V's stores.  f64 products are GEMMs (their
 * store-first is beta = 0).  Against the interpreter over one and three
 * micro-batches, each run over two windows (run_both: the second over
 * the first's arena). */
static const char twice_src[] =
    "model twice {\n"
    "  batch B = 384\n"
    "  input x : f32[B, 64]\n"
    "  param W : f32[64, 64] init normal(0, 0.2)\n"
    "  param V : f32[64, 32] init normal(0, 0.2)\n"
    "  h = tanh(x @ W)\n"
    "  g = (h @ W) @ V\n"
    "  loss l = mean(g * g)\n"
    "}\n";

/* A stacked param: each layer's product writes its own part of W's
 * buffer, so both store (the range unslices and `grad` between them do
 * no work and do not count as touching the buffer); f64's GEMMs likewise
 * (beta = 0): nothing of W's buffer is zeroed either way. */
static const char layers_src[] =
    "model layers {\n"
    "  batch B = 384\n"
    "  input x : f32[B, 64]\n"
    "  param W : f32[2, 64, 64] init normal(0, 0.2)\n"
    "  h = tanh(x @ W[0])\n"
    "  g = h @ W[1]\n"
    "  loss l = mean(g * g)\n"
    "}\n";

static void check_store_first_pairs(IrFunc *f) {
  check_pairs(f);
  bool f32 = f->args[0]->type.dtype == IR_DT_F32;
  for (int threads = 1; threads <= 2; threads++)
    assert_int_equal(program_count(f, threads, cpu_program_store_first_products), f32 ? 4 : 0);
}

static void check_store_first_tied(IrFunc *f) {
  bool f32 = f->args[0]->type.dtype == IR_DT_F32;
  assert_int_equal(program_count(f, 1, cpu_program_matmul_kernels), f32 ? 8 : 0);
  assert_int_equal(program_count(f, 1, cpu_program_store_first_products), f32 ? 2 : 0);
}

static void check_store_first_stacked(IrFunc *f) {
  bool f32 = f->args[0]->type.dtype == IR_DT_F32;
  assert_int_equal(program_count(f, 1, cpu_program_store_first_products), f32 ? 2 : 0);
  assert_int_equal(program_count(f, 1, cpu_program_zeroed_bytes), 0);
}

static void test_cpu_store_first_products(void **state) {
  (void)state;
  run_model_case(&(ModelCase){"pairs", pairs_src, 1, 59, check_store_first_pairs});
  run_model_case(&(ModelCase){"twice", twice_src, 2, 61, check_store_first_tied});
  run_model_case(&(ModelCase){"layers", layers_src, 2, 67, check_store_first_stacked});
}

/* ------------------------------------------------------------------ */
/* GEMM pieces                                                         */
/* ------------------------------------------------------------------ */

/* GEMMs big enough to be cut (over 2 MFLOP): rows of a tall product, a
 * batch, columns of a wide weight gradient with A transposed (M = 24 is
 * short, N = 1040 wide), B transposed, and gradients accumulating over
 * the window into their buffers (beta = 1) piece by piece.  Every single
 * product is over the size of those the CPU generates itself in f32
 * (kernel_bmm.c: 200 x 130 x 176 is 4.6 M multiply-adds), and the
 * batch's matrices over a batched kernel's. */
static const char gemm_pieces_text[] =
    "func @pieces(%x: f32[200,176] input batch, %q: f32[8,64,64] input batch, %W: f32[176,130] param, "
    "%V: f32[8,64,64] param, %U: f32[24,1040] param) {\n"
    "  %h = matmul %x, %W : f32[200,130]\n"
    "  %Wt = permute %W {perm=[1,0]} : f32[130,176]\n"
    "  %g = matmul %h, %Wt : f32[200,176]\n"
    "  %b = matmul %q, %V : f32[8,64,64]\n"
    "  %xs = slice %x {starts=[0,0], stops=[200,24], steps=[1,1]} : f32[200,24]\n"
    "  %xt = permute %xs {perm=[1,0]} : f32[24,200]\n"
    "  %h2 = matmul %h, %Wt : f32[200,176]\n"
    "  %wide = matmul %x, %W : f32[200,130]\n"
    "  %w3 = concat %wide, %wide, %wide, %wide, %wide, %wide, %wide, %wide, %h {axis=1} : f32[200,1170]\n"
    "  %w4 = slice %w3 {starts=[0,0], stops=[200,1040], steps=[1,1]} : f32[200,1040]\n"
    "  %dU = matmul %xt, %w4 : f32[24,1040]\n"
    "  grad %dU {name=\"U\"}\n"
    "  %ht = permute %x {perm=[1,0]} : f32[176,200]\n"
    "  %dW = matmul %ht, %h : f32[176,130]\n"
    "  grad %dW {name=\"W\"}\n"
    "  %qt = permute %q {perm=[0,2,1]} : f32[8,64,64]\n"
    "  %dV = matmul %qt, %b : f32[8,64,64]\n"
    "  grad %dV {name=\"V\"}\n"
    "  %s1 = sum %g {axes=[0,1], keepdim=false} : f32\n"
    "  %s2 = sum %b {axes=[0,1,2], keepdim=false} : f32\n"
    "  %s3 = sum %h2 {axes=[0,1], keepdim=false} : f32\n"
    "  loss %s1 {name=\"g\"}\n"
    "  loss %s2 {name=\"b\"}\n"
    "  loss %s3 {name=\"h2\"}\n"
    "}\n";

static void test_cpu_gemm_pieces(void **state) {
  (void)state;
  int n;
  const char *const *pipe = pass_pipeline_cpu(&n);
  for (int prec = 0; prec < 2; prec++) {
    char *text = prec ? replace_all(gemm_pieces_text, "f32", "f64") : strdup(gemm_pieces_text);
    for (int threads = 1; threads <= 4; threads++)
      for (int K = 1; K <= 3; K += 2) {
        IrFunc *f = read_ir(text);
        run_pipeline(f, pipe, n, K);
        assert_int_equal(program_count(f, threads, cpu_program_matmul_kernels), 0); /* all of them GEMMs */
        char label[64];
        snprintf(label, sizeof label, "pieces %s threads=%d K=%d", prec ? "f64" : "f32", threads, K);
        double e = run_both(f, K, threads, 5 + (uint64_t)K, prec ? 1e-12 : 1e-5, label);
        print_message("  %-28s worst relative error %.3g\n", label, e);
        ir_func_free(f);
      }
    free(text);
  }
}

/* bf16 GEMMs (autocast) cut in row blocks with A transposed, each block
 * of A copied dense before its piece runs (exec.c gemm_schedule): the
 * weight gradients dW = x^T dh (1040 rows: blocks of 520 at 2 threads,
 * 352 and a shorter last one at 3, 264 and 248 at 4) and a batch of three
 * dV = q^T db (520 rows each, the packed blocks apart per batch matrix;
 * cut at 2 and 4 threads, whole at 3), all whole at 1 thread.
 * GRADC_GEMM_BF16=native takes the provider's bf16 products, where the
 * rows are cut, whatever this host measured faster.  Against the
 * interpreter running the same autocast program (its GEMMs in double):
 * bf16's rounding of the results, as test_mixed allows. */
static const char gemm_pieces_bf16_text[] =
    "func @pieces16(%x: f32[48,1040] input batch, %q: f32[3,32,520] input batch, %W: f32[1040,80] param, "
    "%V: f32[3,520,64] param) {\n"
    "  %h = matmul %x, %W : f32[48,80]\n"
    "  %b = matmul %q, %V : f32[3,32,64]\n"
    "  %h2 = mul %h, %h : f32[48,80]\n"
    "  %s1 = sum %h2 {axes=[0,1], keepdim=false} : f32\n"
    "  %b2 = mul %b, %b : f32[3,32,64]\n"
    "  %s2 = sum %b2 {axes=[0,1,2], keepdim=false} : f32\n"
    "  loss %s1 {name=\"h\"}\n"
    "  loss %s2 {name=\"b\"}\n"
    "}\n";

static void test_cpu_gemm_pieces_bf16(void **state) {
  (void)state;
  int n;
  const char *const *pipe = pass_pipeline_cpu(&n);
  setenv("GRADC_GEMM_BF16", "native", 1);
  const int want[5] = {0, 0, 2, 1, 2}; /* packed GEMMs by threads: at 3 the batch of three runs whole */
  for (int threads = 1; threads <= 4; threads++)
    for (int K = 1; K <= 3; K += 2) {
      IrFunc *f = read_ir(gemm_pieces_bf16_text);
      run_passes(f, pipe, n, (PassOptions){.gas = K, .precision = IR_DT_BF16});
      int packed = program_count(f, threads, cpu_program_packed_gemms);
      assert_int_equal(packed, want[threads]);
      char label[64];
      snprintf(label, sizeof label, "pieces bf16 threads=%d K=%d", threads, K);
      double e = run_both(f, K, threads, 41 + (uint64_t)K, 2e-2, label);
      print_message("  %-28s %d packed, worst relative error %.3g\n", label, packed, e);
      ir_func_free(f);
    }
  unsetenv("GRADC_GEMM_BF16");
}

/* ------------------------------------------------------------------ */
/* Stacked params and batched activations                              */
/* ------------------------------------------------------------------ */

/* Two layers of x[B, T, C] @ w[l] + b[l] with stacked params: the forward
 * reads w[l] and b[l] through range views, the weight gradients are one
 * GEMM over all B*T rows each, accumulated straight into w's and b's
 * buffers (their ranges), K micro-batches adding up in place. */
static const char stacked_src[] =
    "model stacked {\n"
    "  batch B = 6\n"
    "  dim T = 24\n"
    "  dim C = 48\n"
    "  dim L = 2\n"
    "  input x : f32[B, T, C]\n"
    "  input y : i32[B, T]\n"
    "  param w : f32[L, C, C] init normal(0, 0.1)\n"
    "  param b : f32[L, C]\n"
    "  param head : f32[C, C]   init normal(0, 0.1)\n"
    "  h = x\n"
    "  for l in 0..L {\n"
    "    h = h + tanh(h @ w[l] + b[l])\n"
    "  }\n"
    "  loss ce = cross_entropy(h @ head, y)\n"
    "}\n";

/* No copies: every slice and unslice is a group-0 view, and no matmul is
 * batched. */
static void check_stacked(IrFunc *f) {
  for (int i = 0; i < f->nops; i++) {
    const IrOp *op = f->ops[i];
    if (op->opcode == IR_OP_SLICE || op->opcode == IR_OP_UNSLICE) assert_int_equal(op->group, 0);
    if (op->opcode == IR_OP_MATMUL) assert_true(op->args[0]->type.shape.rank <= 3 && op->args[1]->type.shape.rank <= 2);
    if (op->opcode == IR_OP_UNSLICE) assert_int_equal(op->result->storage, IR_STORE_GRAD);
  }
}

static void test_cpu_stacked_views(void **state) {
  (void)state;
  run_model_case(&(ModelCase){"stacked", stacked_src, 2, 21, check_stacked});
}

/* ------------------------------------------------------------------ */
/* Column sums                                                         */
/* ------------------------------------------------------------------ */

/* Bias gradients over [B, T]: split-reductions sums each over T first, a
 * column sum that joins the kernel making its operand (the gelu and tanh
 * backwards), whose parallel iterations are then groups of T rows; the
 * B x C partials are summed after and accumulate over the window into
 * the gradient buffer.  pos's gradient sums over B only (no column sum). */
static const char colsum_src[] =
    "model colsum {\n"
    "  batch B = 24\n"
    "  dim T = 10\n"
    "  dim C = 64\n"
    "  input x : f32[B, T, C]\n"
    "  input y : i32[B, T]\n"
    "  param w : f32[C, C] init normal(0, 0.1)\n"
    "  param b : f32[C]\n"
    "  param b2 : f32[C]\n"
    "  param pos : f32[T, C]\n"
    "  param head : f32[C, C] init normal(0, 0.1)\n"
    "  h = gelu(x @ w + b + pos)\n"
    "  g = tanh(h @ w + b2)\n"
    "  loss ce = cross_entropy(g @ head, y)\n"
    "}\n";

/* Both bias gradients are column sums in the kernels of their operands. */
static void check_colsums(IrFunc *f) {
  Arena a;
  arena_init(&a);
  KpKernels ks;
  char err[256];
  if (!kp_kernels_find(f, &a, &ks, err, sizeof err)) fail_msg("kernels: %s", err);
  int fused = 0;
  for (int k = 0; k < ks.n; k++)
    if (ks.k[k].row && ks.k[k].layout.group == 10 && ks.k[k].n > 1) fused++;
  assert_int_equal(fused, 2);
  arena_free(&a);
}

static void test_cpu_colsums(void **state) {
  (void)state;
  run_model_case(&(ModelCase){"colsum", colsum_src, 1, 31, check_colsums});
}

/* ------------------------------------------------------------------ */
/* Transposed products                                                 */
/* ------------------------------------------------------------------ */

/* A tied embedding's gradient from the logits, x^T dy transposed into
 * [V, C], is the product dy^T x (simplify), written into the gradient
 * buffer with no copy.  Square here (C = V), so operands in the wrong
 * order would still type-check: the interpreter's losses and gradients
 * with the rewrite equal its own without it (1e-12, f64), and the CPU's
 * equal the interpreter's. */
static const char tied_src[] =
    "model tied {\n"
    "  batch B = 4\n"
    "  dim T = 6\n"
    "  dim C = 24\n"
    "  input idx : i32[B, T]\n"
    "  input y : i32[B, T]\n"
    "  param wte : f32[C, C] init normal(0, 0.3)\n"
    "  param w : f32[C, C] init normal(0, 0.3)\n"
    "  x = tanh(embedding(idx, wte) @ w)\n"
    "  loss ce = cross_entropy(x @ transpose(wte, 0, 1), y)\n"
    "}\n";

static void test_cpu_transposed_product(void **state) {
  (void)state;
  char *text = replace_all(tied_src, "f32", "f64");
  FeModel *m = planned_model("tied.gdl", text, 1);
  int copies = 0, products = 0;
  for (int i = 0; i < m->func->nops; i++) {
    const IrOp *op = m->func->ops[i];
    copies += op->opcode == IR_OP_PERMUTE && op->result->storage == IR_STORE_GRAD;
    products += op->opcode == IR_OP_MATMUL && op->result->storage == IR_STORE_GRAD;
  }
  assert_int_equal(copies, 0);
  assert_true(products >= 2); /* dw and the tied dwte */
  /* the same model without simplify's rewrite: its own pipeline, simplify left out */
  Diag d;
  FeModel *plain = tu_compile("tied.gdl", text, 1, &d);
  if (!plain) fail_msg("%s", sb_str(&d.log));
  diag_free(&d);
  static const char *const before[] = {"autodiff", "cse", "dce"};
  run_pipeline(plain->func, before, 3, 1);
  StFile params, inputs;
  random_params(m->func, 51, 0.5, &params);
  st_init(&inputs);
  rt_random_inputs(m->func, 1, 52, &inputs);
  char err[1024];
  StepResult want, got;
  if (!step_run_ref(plain->func, 1, &params, "P", &inputs, "I", NULL, &want, err, sizeof err)) fail_msg("ref: %s", err);
  if (!step_run_ref(m->func, 1, &params, "P", &inputs, "I", NULL, &got, err, sizeof err)) fail_msg("ref: %s", err);
  assert_int_equal(got.ngrads, want.ngrads);
  assert_true(rel_err(got.losses, want.losses, 1) < 1e-12);
  for (int i = 0; i < want.ngrads; i++) {
    int64_t n = ir_numel(&want.grad_types[i].shape);
    double e = rel_err(got.grads[i], want.grads[i], n);
    if (e > 1e-12) fail_msg("gradient %s: relative error %.3g", want.grad_names[i], e);
  }
  step_result_free(&want);
  step_result_free(&got);
  for (int threads = 1; threads <= 2; threads++) run_files(m->func, 1, threads, &params, &inputs, 1e-12, "tied f64");
  st_free(&params);
  st_free(&inputs);
  fe_model_free(plain);
  fe_model_free(m);
  free(text);
}

/* ------------------------------------------------------------------ */
/* Short rows side by side                                             */
/* ------------------------------------------------------------------ */

/* Row kernels over short rows run several rows an iteration
 * (llvm_row.c lanes_for): four rows of 40 (norms, their backwards, a
 * softmax over rows of 7 and its backward), two of 100 (cross_entropy,
 * log_softmax, rms_norm), in groups of rows where a column sum sums over
 * T = 7 rows (a number no lane count divides: one row an iteration) or
 * 14 (two rows).  B x T = 21 and 42 rows leave rows over for the loop of
 * one row, and 2 and 3 threads cut them into chunks of odd sizes. */
static const char lanes_src[] =
    "model lanes {\n"
    "  batch B = 3\n"
    "  dim T = 7\n"
    "  dim C = 40\n"
    "  dim V = 100\n"
    "  input x : f32[B, T, C]\n"
    "  input x2 : f32[B, 2*T, C]\n"
    "  input y : i32[B, T]\n"
    "  param w : f32[C, C] init normal(0, 0.2)\n"
    "  param b : f32[C]\n"
    "  param g : f32[C] init ones\n"
    "  param g2 : f32[V] init ones\n"
    "  param head : f32[C, V] init normal(0, 0.2)\n"
    "  h = layer_norm(gelu(x @ w + b), g, b)\n"
    "  h2 = layer_norm(tanh(x2 @ w + b), g, b)\n"
    "  att = softmax(h @ transpose(h, -2, -1), axis=-1)\n"
    "  o = att @ h + h2[:, 0:T, :]\n"
    "  z = o @ head\n"
    "  loss ce = cross_entropy(z, y)\n"
    "  loss ls = mean(log_softmax(rms_norm(z, g2), axis=-1) * z)\n"
    "}\n";

/* The rows [B, T, C] and [B, T, V] are row kernels' spaces. */
static void check_lanes(IrFunc *f) {
  Arena a;
  arena_init(&a);
  KpKernels ks;
  char err[256];
  if (!kp_kernels_find(f, &a, &ks, err, sizeof err)) fail_msg("kernels: %s", err);
  int by_cols[3] = {0, 0, 0}; /* rows of 7, 40 and 100 */
  for (int k = 0; k < ks.n; k++) {
    if (!ks.k[k].row) continue;
    int64_t c = ks.k[k].layout.cols;
    by_cols[0] += c == 7, by_cols[1] += c == 40, by_cols[2] += c == 100;
  }
  for (int i = 0; i < 3; i++) assert_true(by_cols[i] > 0);
  arena_free(&a);
}

static void test_cpu_row_lanes(void **state) {
  (void)state;
  run_model_case(&(ModelCase){"lanes", lanes_src, 1, 41, check_lanes});
}

/* Causal attention with heads (tinygpt's): q, k and v are read out of
 * the qkv projection as strided views, each head's output and the
 * gradients of q, k and v are written straight into [B, T, C] layouts
 * (dk transposed), and the three gradients are one concat that no kernel
 * copies.  Sizes make the GEMMs of the projections split into pieces. */
static const char attention_src[] =
    "model attn {\n"
    "  batch B = 6\n"
    "  dim T = 16\n"
    "  dim C = 48\n"
    "  dim NH = 3\n"
    "  dim HD = C / NH\n"
    "  input x : f32[B, T, C]\n"
    "  input y : i32[B, T]\n"
    "  param attn_w : f32[C, 3*C] init normal(0, 0.1)\n"
    "  param proj_w : f32[C, C]   init normal(0, 0.1)\n"
    "  fn heads(t) {\n"
    "    return permute(reshape(t, [B, T, NH, HD]), [0, 2, 1, 3])\n"
    "  }\n"
    "  qkv = x @ attn_w\n"
    "  q = heads(qkv[..., 0:C])\n"
    "  k = heads(qkv[..., C:2*C])\n"
    "  v = heads(qkv[..., 2*C:3*C])\n"
    "  att = softmax(causal_mask(q @ transpose(k, -2, -1) * rsqrt(HD)), axis=-1)\n"
    "  o = reshape(permute(att @ v, [0, 2, 1, 3]), [B, T, C]) @ proj_w\n"
    "  loss ce = cross_entropy(o, y)\n"
    "}\n";

/* No copies: every permute, slice and concat is a view or an alias. */
static void check_attention(IrFunc *f) {
  int views = 0;
  for (int i = 0; i < f->nops; i++) {
    const IrOp *op = f->ops[i];
    bool mover = op->opcode == IR_OP_PERMUTE || op->opcode == IR_OP_SLICE || op->opcode == IR_OP_CONCAT;
    if (mover) assert_int_equal(op->group, 0);
    if (op->opcode == IR_OP_MATMUL && op->result->storage == IR_STORE_NONE) views++;
  }
  assert_true(views >= 4); /* att @ v, dq, dk, dv write in place */
}

/* The batched products (the heads', forward and backward): in f32 each
 * is a generated kernel reading and writing the views (kernel_bmm.c); in
 * f64 each runs as batched provider calls, one inline and one block of
 * samples per thread: their matrices are a grid of B x NH (exec.c
 * gemm_group).  In f32 the five single products are small enough to be
 * kernels too: the two weight gradients (x^T dqkv, 48 x 144 over 96
 * rows, and the projection's), x @ attn_w and the projection of the
 * heads' output, [B, T, C] each folded into 96 rows, and the
 * projection's dO proj_w^T. */
static void check_batched_calls(void) {
  for (int prec = 0; prec < 2; prec++) {
    char *text = prec ? replace_all(attention_src, "f32", "f64") : strdup(attention_src);
    FeModel *m = planned_model("attention.gdl", text, 1);
    int batched = 0;
    for (int i = 0; i < m->func->nops; i++) {
      const IrOp *op = m->func->ops[i];
      batched += op->opcode == IR_OP_MATMUL && op->group == 0 && op->args[1]->type.shape.rank > 2;
    }
    assert_int_equal(batched, 6); /* q k^T and att v, and two gradients of each */
    for (int threads = 1; threads <= 3; threads += 2) {
      char err[1024];
      CpuOptions o = {.threads = threads, .cache_dir = getenv("GRADC_CACHE_DIR")};
      CpuProgram *p = cpu_program_new(m->func, &o, err, sizeof err);
      if (!p) fail_msg("cpu_program_new: %s", err);
      assert_int_equal(cpu_program_matmul_kernels(p), prec ? 0 : batched + 5);
      assert_int_equal(cpu_program_batched_gemms(p), prec ? batched : 0);
      cpu_program_free(p);
    }
    fe_model_free(m);
    free(text);
  }
}

static void test_cpu_attention_views(void **state) {
  (void)state;
  check_batched_calls();
  run_model_case(&(ModelCase){"attention", attention_src, 2, 31, check_attention});
}

/* Batches of small products as generated kernels (kernel_bmm.c), in the
 * shapes attention does not make: rows that are no multiple of a register
 * tile (7, 9), rows of C and B that end in a partial vector (21, 19
 * columns), a param broadcast over the batch (rank 3 against rank 4), B
 * transposed (its panel copied element by element at 19 x 5, in blocks
 * transposed in registers at 48 x 32), and the gradients' products with
 * A transposed.  Each product is weighted
 * elementwise by an input before it is summed, so every element of
 * every result counts, in its place.  One product per matrix is too big
 * (64 x 64 x 64 multiply-adds: a GEMM) and one runs in f64 (a GEMM). */
static const char bmm_src[] =
    "model bmm {\n"
    "  batch B = 3\n"
    "  dim H = 3\n"
    "  input x : f32[B, H, 7, 5]\n"
    "  input w1 : f32[B, H, 7, 21]\n"
    "  input w2 : f32[B, H, 9, 21]\n"
    "  input w3 : f32[B, H, 7, 19]\n"
    "  input big : f32[B, 64, 64]\n"
    "  input x5 : f32[B, H, 6, 32]\n"
    "  input w5 : f32[B, H, 6, 48]\n"
    "  param P : f32[H, 5, 21] init normal(0, 0.3)\n"
    "  param R : f32[H, 9, 7] init normal(0, 0.3)\n"
    "  param Q : f32[H, 19, 5] init normal(0, 0.3)\n"
    "  param G : f32[64, 64] init normal(0, 0.1)\n"
    "  param S : f32[H, 48, 32] init normal(0, 0.3)\n"
    "  y1 = x @ P\n"
    "  y2 = R @ y1\n"
    "  y3 = x @ transpose(Q, -2, -1)\n"
    "  y4 = big @ (big * G)\n"
    "  y5 = x5 @ transpose(S, -2, -1)\n"
    "  loss l = sum(y1 * w1) + sum(y2 * w2) + sum(y3 * w3) + 1e-3 * sum(y4) + sum(y5 * w5)\n"
    "}\n";

static void check_bmm(IrFunc *f) { (void)f; }

/* How many of f's matmuls the CPU back end generates as kernels. */
static int matmul_kernels(IrFunc *f) { return program_count(f, 2, cpu_program_matmul_kernels); }

/* Matmuls kernel_bmm.c plans as dot products along K. */
static int dot_products(const IrFunc *f) {
  KpViews vs;
  kp_views_find(f, plan_in_group0, NULL, &vs);
  int n = 0;
  for (int i = 0; i < f->nops; i++) {
    KpBmm p;
    n += kp_bmm_plan(&vs, f->ops[i], &p) && p.dot;
  }
  kp_views_free(&vs);
  return n;
}

static void test_cpu_bmm_kernels(void **state) {
  (void)state;
  for (int prec = 0; prec < 2; prec++) {
    char *text = prec ? replace_all(bmm_src, "f32", "f64") : strdup(bmm_src);
    FeModel *m = planned_model("bmm.gdl", text, 1);
    int products = 0, big = 0;
    for (int i = 0; i < m->func->nops; i++) {
      const IrOp *op = m->func->ops[i];
      if (op->opcode != IR_OP_MATMUL || op->group != 0) continue;
      products++;
      big += op->result->type.shape.dim[op->result->type.shape.rank - 1] == 64;
    }
    /* every product but the big ones (y4 and G's gradient) */
    assert_int_equal(big, 2);
    assert_true(products - big >= 8); /* y1, y2, y3, y5 and at least one gradient product of each */
    assert_int_equal(matmul_kernels(m->func), prec ? 0 : products - big);
    fe_model_free(m);
    free(text);
  }
  run_model_case(&(ModelCase){"bmm", bmm_src, 1, 41, check_bmm});
}

/* Products of a causal softmax P, its transpose and their gradients
 * (kernel_bmm.c's known zeros): P x and P^T x (A zero above or below the
 * diagonal), z P and z P^T (B), and backward the same four kinds against
 * dS (zero above the diagonal after the mask's gradient) and P.  40 rows
 * are 4 tiles of 10, 40 columns a tile of 32 and one of 8, so every kind
 * of bound (a sum ending at a tile's last row or column, or starting at
 * its first) is taken with tiles that cut the diagonal and tiles that
 * miss it; the results against the interpreter show that the terms the
 * kernels skip are 0. */
static const char causal_src[] =
    "model causal {\n"
    "  batch B = 3\n"
    "  dim T = 40\n"
    "  input s : f32[B, 2, T, T]\n"
    "  input xin : f32[B, 2, T, 24]\n"
    "  input zin : f32[B, 2, 24, T]\n"
    "  input w1 : f32[B, 2, T, 24]\n"
    "  input w3 : f32[B, 2, 24, T]\n"
    "  param g : f32[2, T, T] init normal(1, 0.5)\n"
    "  param mx : f32[24] init normal(1, 0.3)\n"
    "  param mz : f32[T] init normal(1, 0.3)\n"
    "  P = softmax(causal_mask(s * g), axis=-1)\n"
    "  x = xin * mx\n"
    "  z = zin * mz\n"
    "  Pt = transpose(P, -2, -1)\n"
    "  loss l = sum((P @ x) * w1) + sum((Pt @ x) * w1) + sum((z @ P) * w3) + sum((z @ Pt) * w3)\n"
    "}\n";

/* Every matmul of f the CPU generates, by the known zeros of its plan:
 * n[0] none, n[1] some in A, n[2] some in B; n[3] of them have a dead
 * region in C. */
static void count_zeros(const IrFunc *f, int n[4]) {
  KpViews vs;
  kp_views_find(f, plan_in_group0, NULL, &vs);
  n[0] = n[1] = n[2] = n[3] = 0;
  for (int i = 0; i < f->nops; i++) {
    KpBmm p;
    if (!kp_bmm_plan(&vs, f->ops[i], &p)) continue;
    assert_false(p.azero && p.bzero); /* no product here has two triangular operands */
    n[p.azero ? 1 : p.bzero ? 2 : 0]++;
    n[3] += p.cdead != 0;
  }
  kp_views_free(&vs);
}

static void check_causal(IrFunc *f) {
  int n[4];
  count_zeros(f, n);
  bool f64 = false;
  for (int i = 0; i < f->nargs; i++) f64 |= f->args[i]->type.dtype == IR_DT_F64;
  if (f64) { /* GEMMs, not kernels */
    assert_int_equal(n[0] + n[1] + n[2], 0);
    return;
  }
  /* the four forward products and x's and z's gradients (P^T dy1, P dy2,
   * dy3 P^T, dy4 P) skip zeros; P's gradients (dy1 x^T, ...) do not, but
   * the softmax's backward multiplies them by P's zeros: each has a dead
   * region (as computed, two of them transposed) */
  assert_int_equal(n[1] + n[2], 8);
  assert_true(n[1] >= 2 && n[2] >= 2);
  assert_int_equal(n[3], 4);
}

static void test_cpu_causal_products(void **state) {
  (void)state;
  run_model_case(&(ModelCase){"causal", causal_src, 2, 47, check_causal});
  /* attention: att v, dv = P^T dO, dq = dS k and dk = q^T dS skip zeros;
   * q k^T and dO v^T do not, but nothing reads them above the diagonal
   * (the mask replaces q k^T there, P's zeros multiply dO v^T); the five
   * single products (two of them over the folded rows of [B, T, C]) have
   * no zeros and no dead region */
  FeModel *m = planned_model("attention.gdl", attention_src, 1);
  int n[4];
  count_zeros(m->func, n);
  assert_int_equal(n[1] + n[2], 4);
  assert_int_equal(n[0], 7);
  assert_int_equal(n[3], 2);
  fe_model_free(m);
}

/* Single products a BLAS runs far below its speed, as generated kernels
 * (kernel_bmm.c): sums over a few k (u @ E, K = 5; dh = dlogits W2^T,
 * K = 10, B transposed; dr v^T, K = 1) and the classifier's weight
 * gradient h^T dlogits (10 columns, A transposed), planned as C^T = B^T
 * A^T and added down C's columns into its gradient buffer (over the
 * micro-batches), v's one column the same way; the small weight
 * gradients x^T dh (40 x 48, a sum over 51 rows into its gradient
 * buffer) and u^T dz (5 rows of 33); and the small products with A in
 * place, the first layer's x @ W1, y8 = A8 @ P40 and its gradient dy8
 * P40^T (B transposed).  Few columns with A in place are dot products
 * along K: the logits h @ W2 (10 columns, a sum over 48), r = h @ v (one
 * column), q = w @ W6 (7 columns, a sum over 33: a partial vector) and
 * Pd's gradient dyd Qd^T (8 columns of 6 rows, a sum over 40 with B
 * transposed, added into its gradient buffer).  51 rows (17 a
 * micro-batch of 3) leave a short last row tile, and 48 or 33 columns a
 * partial vector or tile.  A8^T dy8 and Pd^T dyd (sums over 8 and 6 into
 * a gradient buffer, which a GEMM stores first) stay GEMMs. */
static const char skinny_src[] =
    "model skinny {\n"
    "  batch B = 51\n"
    "  input x : f32[B, 40]\n"
    "  input u : f32[B, 5]\n"
    "  input w : f32[B, 33]\n"
    "  input wr : f32[B, 1]\n"
    "  input y : i32[B]\n"
    "  param W1 : f32[40, 48] init normal(0, 0.2)\n"
    "  param W2 : f32[48, 10] init normal(0, 0.3)\n"
    "  param E : f32[5, 33] init normal(0, 0.3)\n"
    "  param v : f32[48, 1] init normal(0, 0.3)\n"
    "  param A8 : f32[8, 40] init normal(0, 0.3)\n"
    "  param P40 : f32[40, 48] init normal(0, 0.3)\n"
    "  param W6 : f32[33, 7] init normal(0, 0.3)\n"
    "  param Pd : f32[6, 8] init normal(0, 0.3)\n"
    "  param Qd : f32[8, 40] init normal(0, 0.3)\n"
    "  h = tanh(x @ W1)\n"
    "  logits = h @ W2\n"
    "  z = u @ E\n"
    "  r = h @ v\n"
    "  y8 = A8 @ P40\n"
    "  q = w @ W6\n"
    "  yd = Pd @ Qd\n"
    "  loss ce = cross_entropy(logits, y)\n"
    "  loss zw = 0.1 * sum(z * w) + sum(r * wr) + 0.01 * sum(y8 * y8) + 0.1 * sum(q * q) + 0.01 * sum(yd * yd)\n"
    "}\n";

static void test_cpu_skinny_products(void **state) {
  (void)state;
  for (int prec = 0; prec < 2; prec++) {
    char *text = prec ? replace_all(skinny_src, "f32", "f64") : strdup(skinny_src);
    FeModel *m = planned_model("skinny.gdl", text, 1);
    /* z, h's two gradients (dlogits W2^T, dr v^T: K = 1), dW2 and dv,
     * dW1 and dE, x @ W1, y8 and dy8 P40^T, yd (K = 8) and dW6; the dot
     * products logits, r, q and dPd; f64 products stay GEMMs */
    assert_int_equal(matmul_kernels(m->func), prec ? 0 : 16);
    assert_int_equal(dot_products(m->func), prec ? 0 : 4);
    fe_model_free(m);
    free(text);
  }
  run_model_case(&(ModelCase){"skinny", skinny_src, 1, 43, check_bmm});
}

/* An unslice that memplan cannot fill in place (its operand is an input,
 * not made by a GEMM or a kernel) is a kernel of its own, and right. */
static const char unslice_text[] =
    "func @un(%x: f32[4,3] input batch, %u: f32[1,5] input, %w: f32[2,3,5] param, %b: f32[2,5] param) {\n"
    "  %w1 = slice %w {starts=[1,0,0], stops=[2,3,5], steps=[1,1,1]} : f32[1,3,5]\n"
    "  %w1r = reshape %w1 {shape=[3,5]} : f32[3,5]\n"
    "  %h = matmul %x, %w1r : f32[4,5]\n"
    "  %l = sum %h {axes=[0,1], keepdim=false} : f32\n"
    "  loss %l {name=\"l\"}\n"
    "  %xt = permute %x {perm=[1,0]} : f32[3,4]\n"
    "  %dw = matmul %xt, %h : f32[3,5]\n"
    "  %dwr = reshape %dw {shape=[1,3,5]} : f32[1,3,5]\n"
    "  %dW = unslice %dwr {starts=[1,0,0], stops=[2,3,5], steps=[1,1,1], shape=[2,3,5]} : f32[2,3,5]\n"
    "  grad %dW {name=\"w\"}\n"
    "  %db = unslice %u {starts=[1,0], stops=[2,5], steps=[1,1], shape=[2,5]} : f32[2,5]\n"
    "  grad %db {name=\"b\"}\n"
    "}\n";

static void test_cpu_unslice_fallback(void **state) {
  (void)state;
  int n;
  const char *const *pipe = pass_pipeline_cpu(&n);
  /* Planned straight after the target-independent passes (no fuse): the
   * unslice of %u is group 0 but cannot be in place. */
  for (int fused = 0; fused < 2; fused++) {
    IrFunc *f = read_ir(unslice_text);
    if (fused) {
      run_pipeline(f, pipe, n, 2);
    } else {
      const char *names[] = {"memplan"};
      run_pipeline(f, names, 1, 2);
    }
    for (int i = 0; i < f->nops; i++) {
      const IrOp *op = f->ops[i];
      if (op->opcode != IR_OP_UNSLICE) continue;
      bool in_place = op->args[0]->def != NULL;
      assert_int_equal(op->group == 0, in_place);
      assert_int_equal(op->result->storage, IR_STORE_GRAD);
    }
    if (fused) run_both(f, 2, 2, 3, 1e-5, "unslice fallback");
    ir_func_free(f);
  }
}

/* ------------------------------------------------------------------ */
/* Outputs written over dying operands                                 */
/* ------------------------------------------------------------------ */

/* In the kernel of %p, %q and %r, %m dies (%n lives on for a GEMM) and %p
 * (stored: a later kernel sums it) is planned over it; %p is computed
 * before %q reads %m, so the kernel must load %m before it stores %p, or
 * %q would read %p for %m.  With no_inplace nothing is written over. */
static const char write_over_text[] =
    "func @over(%x: f32[64,32] input batch, %W: f32[32,48] input, %V: f32[32,48] input, %U: f32[48,16] input) {\n"
    "  %m = matmul %x, %W : f32[64,48]\n"
    "  %n = matmul %x, %V : f32[64,48]\n"
    "  %p = mul %n, %n : f32[64,48]\n"
    "  %q = add %m, %p : f32[64,48]\n"
    "  %r = mul %q, %q : f32[64,48]\n"
    "  %o = matmul %n, %U : f32[64,16]\n"
    "  %s1 = sum %p {axes=[0,1], keepdim=false} : f32\n"
    "  %s2 = sum %r {axes=[0,1], keepdim=false} : f32\n"
    "  %s3 = sum %o {axes=[0,1], keepdim=false} : f32\n"
    "  loss %s1 {name=\"p\"}\n"
    "  loss %s2 {name=\"r\"}\n"
    "  loss %s3 {name=\"o\"}\n"
    "}\n";

/* %y is planned over %m in a kernel whose layer_norm reads %m in three
 * loops, the last after %y's: %y must be stored once the row is done. */
static const char write_over_later_text[] =
    "func @over2(%x: f32[64,32] input batch, %W: f32[32,48] input, %g: f32[48] input, %b: f32[48] input) {\n"
    "  %m = matmul %x, %W : f32[64,48]\n"
    "  %y = mul %m, %m : f32[64,48]\n"
    "  %z = layer_norm %m, %g, %b {eps=1e-05} : f32[64,48]\n"
    "  %s1 = sum %y {axes=[0,1], keepdim=false} : f32\n"
    "  %zz = mul %z, %z : f32[64,48]\n"
    "  %s2 = sum %zz {axes=[0,1], keepdim=false} : f32\n"
    "  loss %s1 {name=\"y\"}\n"
    "  loss %s2 {name=\"z\"}\n"
    "}\n";

/* %y could lie over %m, which dies in its kernel, but the kernel also
 * reads row 2 of %m through the range slice %r (an alias of those bytes):
 * rows after 2 would read %y's row there, so %y gets a buffer of its own. */
static const char read_through_slice_text[] =
    "func @over3(%x: f32[4,32] input, %W: f32[32,48] input) {\n"
    "  %m = matmul %x, %W : f32[4,48]\n"
    "  %r = slice %m {starts=[2,0], stops=[3,48], steps=[1,1]} : f32[1,48]\n"
    "  %y = sub %m, %r : f32[4,48]\n"
    "  %z = mul %y, %y : f32[4,48]\n"
    "  %s = sum %z {axes=[0,1], keepdim=false} : f32\n"
    "  %s2 = sum %y {axes=[0,1], keepdim=false} : f32\n"
    "  loss %s {name=\"z\"}\n"
    "  loss %s2 {name=\"y\"}\n"
    "}\n";

static const IrValue *named(const IrFunc *f, const char *name) {
  for (int i = 0; i < f->nvalues; i++)
    if (f->values[i]->name && strcmp(f->values[i]->name, name) == 0) return f->values[i];
  fail_msg("no value %%%s", name);
  return NULL;
}

/* Plan text with and without in-place outputs: `out` lies over `over`
 * exactly when in place and `expect`; both plans match the interpreter. */
static void check_write_over(const char *label, const char *text, const char *over, const char *out, bool expect) {
  int n;
  const char *const *pipe = pass_pipeline_cpu(&n);
  for (int inplace = 0; inplace < 2; inplace++) {
    IrFunc *f = read_ir(text);
    run_passes(f, pipe, n, (PassOptions){.gas = 2, .no_inplace = !inplace});
    const IrValue *x = named(f, over), *y = named(f, out);
    assert_int_equal(x->offset == y->offset, inplace && expect);
    for (int threads = 1; threads <= 2; threads++) run_both(f, 2, threads, 11, 1e-5, label);
    ir_func_free(f);
  }
}

static void test_cpu_write_over(void **state) {
  (void)state;
  check_write_over("write over", write_over_text, "m", "p", true);
  check_write_over("write over, read later", write_over_later_text, "m", "y", true);
  check_write_over("read through a slice", read_through_slice_text, "m", "y", false);
}

/* ------------------------------------------------------------------ */
/* Args GEMMs read in place                                            */
/* ------------------------------------------------------------------ */

/* %x and %V are read only by GEMMs (through a transpose flag for the
 * weight gradient), so the executor has them read from the caller's
 * tensors, a micro-batch's rows of %x at a time; %W is also read by a
 * kernel (the L2 term) and is copied into the arena.  Given as f64 files,
 * %x and %V are converted into the arena instead. */
static const char direct_text[] =
    "func @direct(%x: f32[48,40] input batch, %y: i32[48] input batch, %W: f32[40,64] param, %V: f32[64,10] param) {\n"
    "  %h0 = matmul %x, %W : f32[48,64]\n"
    "  %h = relu %h0 : f32[48,64]\n"
    "  %o = matmul %h, %V : f32[48,10]\n"
    "  %ce = cross_entropy %o, %y {ignore_index=-100, reduction=\"sum\"} : f32\n"
    "  %w2 = mul %W, %W : f32[40,64]\n"
    "  %l2 = sum %w2 {axes=[0,1], keepdim=false} : f32\n"
    "  loss %ce {name=\"ce\"}\n"
    "  loss %l2 {name=\"l2\"}\n"
    "}\n";

/* A copy of f with every f32 tensor widened to f64. */
static void widen_file(const StFile *f, StFile *out) {
  st_init(out);
  for (int i = 0; i < f->n; i++) {
    const StTensor *t = &f->t[i];
    if (t->dtype != ST_F32) {
      st_add(out, t->name, t->dtype, t->rank, t->shape, t->data);
      continue;
    }
    size_t n = t->nbytes / 4;
    double *d = calloc(n ? n : 1, sizeof(double));
    for (size_t k = 0; k < n; k++) d[k] = ((const float *)t->data)[k];
    st_add(out, t->name, ST_F64, t->rank, t->shape, d);
    free(d);
  }
}

static void test_cpu_direct_args(void **state) {
  (void)state;
  int n;
  const char *const *pipe = pass_pipeline_cpu(&n);
  const int K = 2;
  IrFunc *f = read_ir(direct_text);
  run_pipeline(f, pipe, n, K);
  StFile params, inputs, params64, inputs64;
  random_params(f, 21, 0.5, &params);
  st_init(&inputs);
  rt_random_inputs(f, K, 22, &inputs);
  widen_file(&params, &params64);
  widen_file(&inputs, &inputs64);
  for (int threads = 1; threads <= 2; threads++) {
    run_files(f, K, threads, &params, &inputs, 1e-5, "direct args, f32 files");
    run_files(f, K, threads, &params64, &inputs64, 1e-5, "direct args, f64 files");
  }
  st_free(&params);
  st_free(&inputs);
  st_free(&params64);
  st_free(&inputs64);
  ir_func_free(f);
}

/* ------------------------------------------------------------------ */
/* GEMM epilogues                                                      */
/* ------------------------------------------------------------------ */

/* Kernels that are nothing but a GEMM's epilogue (exec.c plan_epilogues):
 * bias + relu, bias alone, a residual input, and bias + gelu (an input
 * weight, so the backward needs no pre-activation and the kernel has one
 * output).  By default oneDNN runs all but the residual as post-ops and
 * the other providers none; GRADC_GEMM_EPILOGUES=all takes all four
 * (post-ops, or gemm.c's loop), =off none.  Sizes make the GEMMs split into
 * pieces at 2 and 3 threads (each piece reads its part of the bias or
 * residual), and keep them over the size of products the CPU generates
 * itself (kernel_bmm.c) in every micro-batch: 216 x 160 x 128 is 4.4 M
 * multiply-adds. */
static const char epilogue_src[] =
    "model epi {\n"
    "  batch B = 432\n"
    "  dim D = 128\n"
    "  dim H = 160\n"
    "  input x : f32[B, D]\n"
    "  input r : f32[B, H]\n"
    "  input Wg : f32[D, H]\n"
    "  input bg : f32[H]\n"
    "  input y : i32[B]\n"
    "  param W1 : f32[D, H] init normal(0, 0.1)\n"
    "  param b1 : f32[H]\n"
    "  param W2 : f32[H, H] init normal(0, 0.1)\n"
    "  param b2 : f32[H]\n"
    "  param W3 : f32[H, H] init normal(0, 0.1)\n"
    "  param W4 : f32[H, 10] init normal(0, 0.1)\n"
    "  param W5 : f32[H, 10] init normal(0, 0.1)\n"
    "  h1 = relu(x @ W1 + b1)\n"
    "  h2 = h1 @ W2 + b2\n"
    "  h3 = r + h2 @ W3\n"
    "  g = gelu(x @ Wg + bg)\n"
    "  logits = h3 @ W4 + g @ W5\n"
    "  loss ce = cross_entropy(logits, y)\n"
    "}\n";

static int absorbed_kernels(IrFunc *f) { return program_count(f, 1, cpu_program_absorbed_kernels); }

static void test_cpu_gemm_epilogues(void **state) {
  (void)state;
  const char *prov = getenv("GRADC_GEMM");
  const char *modes[] = {"fused", "all", "off"};
  for (int mode = 0; mode < 3; mode++) {
    setenv("GRADC_GEMM_EPILOGUES", modes[mode], 1);
    for (int K = 1; K <= 2; K++) {
      FeModel *m = planned_model("epi.gdl", epilogue_src, K);
      IrFunc *f = m->func;
      /* bias + relu, bias, residual, bias + gelu (the logits' sum joins
       * cross_entropy's kernel); by default not the residual, and only
       * where the provider has post-ops. */
      int fused = absorbed_kernels(f);
      bool onednn = prov && strcmp(prov, "onednn") == 0;
      if (mode == 1) assert_int_equal(fused, 4);
      else if (mode == 0 && onednn) assert_int_equal(fused, 3);
      else if (mode == 2) assert_int_equal(fused, 0);
      for (int threads = 1; threads <= 3; threads++) {
        char label[64];
        snprintf(label, sizeof label, "epilogues %s threads=%d K=%d", modes[mode], threads, K);
        double e = run_both(f, K, threads, 31 + (uint64_t)K, 1e-5, label);
        print_message("  %-34s %d fused, worst relative error %.3g\n", label, fused, e);
      }
      fe_model_free(m);
    }
  }
  unsetenv("GRADC_GEMM_EPILOGUES");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_cpu_gemm_pieces),
      cmocka_unit_test(test_cpu_gemm_pieces_bf16),
      cmocka_unit_test(test_cpu_stacked_views),
      cmocka_unit_test(test_cpu_colsums),
      cmocka_unit_test(test_cpu_row_lanes),
      cmocka_unit_test(test_cpu_transposed_product),
      cmocka_unit_test(test_cpu_attention_views),
      cmocka_unit_test(test_cpu_bmm_kernels),
      cmocka_unit_test(test_cpu_paired_products),
      cmocka_unit_test(test_cpu_store_first_products),
      cmocka_unit_test(test_cpu_causal_products),
      cmocka_unit_test(test_cpu_skinny_products),
      cmocka_unit_test(test_cpu_unslice_fallback),
      cmocka_unit_test(test_cpu_write_over),
      cmocka_unit_test(test_cpu_direct_args),
      cmocka_unit_test(test_cpu_gemm_epilogues),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
