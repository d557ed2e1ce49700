/* test_bench.c - `gradc bench` (tools/bench.c) run as a program, and the
 * GEMM list behind its gemm_floor_ms figure (runtime/gemm_floor.c).
 *
 * The bench runs on examples/mlp.gdl shrunk with -D (B=8, D=16, H=8): its
 * matmuls are hand-counted (forward x@W1 and h@W2; backward dW1 = x^T dh,
 * dh = dlogits W2^T, dW2 = h^T dlogits; x needs no gradient), and its
 * arena must at least hold the params, their gradients and the inputs. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "passes/passes.h"
#include "runtime/cpu/gemm.h"
#include "runtime/cpu/gemm_floor.h"
#include "testutil.h"

static const char *figure_names[] = {"compile_ms",       "compile_warm_ms", "step_ms_median",
                                     "step_ms_min",      "gemm_floor_ms",   "kernels_per_step",
                                     "gemms_per_step",   "peak_bytes",      "peak_rss_bytes"};
#define NFIGURES 9

#define MLP_DEFS "-D B=8 -D D=16 -D H=8"
/* Bytes of W1 [16,8], b1 [8], W2 [8,10] as f32, and of x [8,16] + y [8]. */
#define MLP_PARAM_BYTES ((16 * 8 + 8 + 8 * 10) * 4)
#define MLP_INPUT_BYTES ((8 * 16 + 8) * 4)

/* The CPU back end is the default target when the build has LLVM. */
#ifdef GRADC_HAVE_LLVM
#define HAVE_CPU 1
#define TARGET "cpu"
#else
#define HAVE_CPU 0
#define TARGET "ref"
#endif

/* Run a command; its stdout (malloc'd) and exit status. */
static char *run(const char *cmd, int *status) {
  FILE *p = popen(cmd, "r");
  assert_non_null(p);
  size_t cap = 4096, len = 0;
  char *buf = malloc(cap);
  assert_non_null(buf);
  size_t n;
  while ((n = fread(buf + len, 1, cap - len - 1, p)) > 0) {
    len += n;
    if (cap - len < 2) {
      cap *= 2;
      buf = realloc(buf, cap);
      assert_non_null(buf);
    }
  }
  buf[len] = 0;
  int st = pclose(p);
  *status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return buf;
}

static char *bench(const char *args, int *status) {
  char cmd[2048];
  snprintf(cmd, sizeof cmd, "'%s' bench '%s' %s", GRADC_BINARY, tu_path("examples/mlp.gdl"), args);
  return run(cmd, status);
}

/* The JSON form: every figure a non-negative number; returns the object. */
static cJSON *bench_json(const char *args) {
  int status;
  char *out = bench(args, &status);
  if (status != 0) print_error("gradc bench %s: exit %d, stdout:\n%s\n", args, status, out);
  assert_int_equal(status, 0);
  cJSON *o = cJSON_Parse(out);
  if (!o) print_error("not JSON:\n%s\n", out);
  assert_non_null(o);
  assert_true(cJSON_IsObject(o));
  assert_int_equal(cJSON_GetArraySize(o), NFIGURES + 2);
  /* After the contract's figures, the GEMM provider (one this build has)
   * and the time of the measurement that chose it. */
  const cJSON *gp = cJSON_GetObjectItemCaseSensitive(o, "gemm_provider");
  assert_true(cJSON_IsString(gp));
  assert_non_null(cpu_gemm_provider_find(gp->valuestring));
  const cJSON *gs = cJSON_GetObjectItemCaseSensitive(o, "gemm_select_ms");
  assert_true(cJSON_IsNumber(gs) && isfinite(gs->valuedouble) && gs->valuedouble >= 0);
  for (int i = 0; i < NFIGURES; i++) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, figure_names[i]);
    if (!cJSON_IsNumber(v)) print_error("missing figure %s in\n%s\n", figure_names[i], out);
    assert_true(cJSON_IsNumber(v));
    assert_true(isfinite(v->valuedouble) && v->valuedouble >= 0);
  }
  free(out);
  return o;
}

static double fig(const cJSON *o, const char *name) {
  return cJSON_GetObjectItemCaseSensitive(o, name)->valuedouble;
}

static void test_bench_json_figures(void **state) {
  (void)state;
  cJSON *o = bench_json("--json --steps 2 " MLP_DEFS " --target " TARGET);
  assert_true(fig(o, "step_ms_min") <= fig(o, "step_ms_median"));
  assert_true(fig(o, "step_ms_median") > 0);
  assert_true(fig(o, "compile_ms") > 0);
  assert_int_equal((int)fig(o, "gemms_per_step"), 5);
  assert_true(fig(o, "peak_rss_bytes") > 1 << 20);
  if (HAVE_CPU) {
    /* At least one kernel (the loss) besides the five GEMMs. */
    assert_true(fig(o, "kernels_per_step") > 5);
    assert_true(fig(o, "peak_bytes") >= 2 * MLP_PARAM_BYTES + MLP_INPUT_BYTES);
  }
  cJSON_Delete(o);
  /* Five steps: the floor is timed in rounds between them (2, 1, 1, 1
   * steps); every step and every floor window is timed (an untimed entry
   * would read 0). */
  o = bench_json("--json --steps 5 " MLP_DEFS " --target " TARGET);
  assert_true(fig(o, "step_ms_min") > 0);
  assert_true(fig(o, "step_ms_min") <= fig(o, "step_ms_median"));
  assert_true(fig(o, "gemm_floor_ms") > 0);
  cJSON_Delete(o);
}

/* K micro-batches: every GEMM and kernel runs K times a window. */
static void test_bench_gas_counts_per_window(void **state) {
  (void)state;
  cJSON *one = bench_json("--json --steps 1 --warmup 0 " MLP_DEFS " --target " TARGET);
  cJSON *two = bench_json("--json --steps 1 --warmup 0 --gas 2 " MLP_DEFS " --target " TARGET);
  assert_int_equal((int)fig(two, "gemms_per_step"), 10);
  assert_int_equal((int)fig(two, "kernels_per_step"), 2 * (int)fig(one, "kernels_per_step"));
  cJSON_Delete(one);
  cJSON_Delete(two);
}

/* With oneDNN, mlp's relu(x @ W1 + b1) runs as the first GEMM's epilogue
 * (bias and relu post-ops): one kernel fewer a micro-batch than with
 * GRADC_GEMM_EPILOGUES=off, at K = 1 and 2.  x @ W1 is 256 x 160 x 128
 * or more a micro-batch: smaller, or with a sum over 16 or fewer, it
 * would be a generated kernel (passes/kernel_bmm.c), not a GEMM. */
static void test_bench_epilogue_drops_a_kernel(void **state) {
  (void)state;
  if (!HAVE_CPU || !cpu_gemm_provider_find("onednn")) {
    print_message("note: skipped: needs the CPU target and oneDNN\n");
    return;
  }
  for (int K = 1; K <= 2; K++) {
    char args[256];
    snprintf(args, sizeof args, "--json --steps 1 --warmup 0 --gas %d -D B=512 -D D=128 -D H=160 --target cpu", K);
    setenv("GRADC_GEMM", "onednn", 1);
    setenv("GRADC_GEMM_EPILOGUES", "off", 1);
    cJSON *off = bench_json(args);
    unsetenv("GRADC_GEMM_EPILOGUES");
    cJSON *on = bench_json(args);
    unsetenv("GRADC_GEMM");
    assert_int_equal((int)fig(on, "kernels_per_step"), (int)fig(off, "kernels_per_step") - K);
    assert_int_equal((int)fig(on, "gemms_per_step"), 5 * K);
    cJSON_Delete(off);
    cJSON_Delete(on);
  }
}

static void test_bench_ref_has_no_kernels(void **state) {
  (void)state;
  cJSON *o = bench_json("--json --steps 1 " MLP_DEFS " --target ref");
  assert_int_equal((int)fig(o, "kernels_per_step"), 0);
  assert_int_equal((int)fig(o, "peak_bytes"), 0);
  assert_int_equal((int)fig(o, "gemms_per_step"), 5);
  cJSON_Delete(o);
}

/* The text form: exactly the nine `name: value` lines, in order, times
 * with three decimals and counts as integers, then `gemm_provider: NAME`
 * and `gemm_select_ms: X.XXX`. */
static void test_bench_text_order(void **state) {
  (void)state;
  int status;
  char *out = bench("--steps 2 " MLP_DEFS " --target " TARGET " 2>/dev/null", &status);
  assert_int_equal(status, 0);
  char *save = NULL, *line = strtok_r(out, "\n", &save);
  for (int i = 0; i < NFIGURES; i++) {
    if (!line) print_error("line %d (%s) missing\n", i + 1, figure_names[i]);
    assert_non_null(line);
    size_t n = strlen(figure_names[i]);
    if (strncmp(line, figure_names[i], n) != 0 || strncmp(line + n, ": ", 2) != 0)
      print_error("line %d: expected '%s: ...', got '%s'\n", i + 1, figure_names[i], line);
    assert_true(strncmp(line, figure_names[i], n) == 0 && strncmp(line + n, ": ", 2) == 0);
    const char *v = line + n + 2, *dot = strchr(v, '.');
    char *end;
    double x = strtod(v, &end);
    assert_true(end != v && *end == 0 && x >= 0);
    if (i < 5) assert_true(dot && strlen(dot + 1) == 3); /* %.3f */
    else assert_null(dot);
    line = strtok_r(NULL, "\n", &save);
  }
  assert_non_null(line);
  assert_true(strncmp(line, "gemm_provider: ", 15) == 0);
  assert_non_null(cpu_gemm_provider_find(line + 15));
  line = strtok_r(NULL, "\n", &save);
  assert_non_null(line);
  assert_true(strncmp(line, "gemm_select_ms: ", 16) == 0);
  const char *dot = strchr(line + 16, '.');
  assert_true(dot && strlen(dot + 1) == 3 && strtod(line + 16, NULL) >= 0);
  line = strtok_r(NULL, "\n", &save);
  assert_null(line);
  free(out);
}

static void test_bench_usage_errors(void **state) {
  (void)state;
  const char *bad[] = {"--steps 0", "--threads x", "--target tpu", "--frobnicate", "--gas"};
  for (int i = 0; i < 5; i++) {
    char args[256];
    snprintf(args, sizeof args, "%s 2>&1", bad[i]);
    int status;
    char *out = bench(args, &status);
    assert_int_equal(status, 1);
    if (strncmp(out, "gradc: error: ", 14) != 0) print_error("%s: got '%s'\n", bad[i], out);
    assert_true(strncmp(out, "gradc: error: ", 14) == 0);
    free(out);
  }
  /* A model error: reported with its location, nothing on stdout. */
  char dir[] = "/tmp/gradc-bench-XXXXXX";
  assert_non_null(mkdtemp(dir));
  char path[256], cmd[1024];
  snprintf(path, sizeof path, "%s/bad.gdl", dir);
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fputs("model bad {\n  input x : f32[4, 3]\n  param w : f32[5, 2]\n  loss l = sum(x @ w)\n}\n", f);
  fclose(f);
  int status;
  snprintf(cmd, sizeof cmd, "'%s' bench '%s' 2>/dev/null", GRADC_BINARY, path);
  char *out = run(cmd, &status);
  assert_int_equal(status, 1);
  assert_string_equal(out, "");
  free(out);
  snprintf(cmd, sizeof cmd, "'%s' bench '%s' 2>&1", GRADC_BINARY, path);
  out = run(cmd, &status);
  assert_non_null(strstr(out, "bad.gdl:4:"));
  free(out);
  remove(path);
  rmdir(dir);
}

/* ---- the GEMM list ---- */

static IrType f32(int rank, const int64_t *dims) { return (IrType){IR_DT_F32, ir_shape_make(rank, dims)}; }

static void test_gemm_list_shapes(void **state) {
  (void)state;
  IrFunc *f = ir_func_new("g");
  IrLoc loc = {0};
  /* [2,3,4,5] @ [5,6]: the left-only batch folds into M = 24, one call. */
  IrValue *a = ir_func_add_arg(f, "a", f32(4, (int64_t[]){2, 3, 4, 5}), IR_ARG_INPUT, true);
  IrValue *w = ir_func_add_arg(f, "w", f32(2, (int64_t[]){5, 6}), IR_ARG_PARAM, false);
  ir_matmul(f, a, w, loc);
  /* [2,4,5] @ [2,5,6]: two calls, one per batch. */
  IrValue *p = ir_func_add_arg(f, "p", f32(3, (int64_t[]){2, 4, 5}), IR_ARG_INPUT, true);
  IrValue *q = ir_func_add_arg(f, "q", f32(3, (int64_t[]){2, 5, 6}), IR_ARG_INPUT, true);
  ir_matmul(f, p, q, loc);
  /* [3,1,4,5] @ [2,5,6]: broadcast to 3x2 calls; B matrix t % 2, A t / 2. */
  IrValue *r = ir_func_add_arg(f, "r", f32(4, (int64_t[]){3, 1, 4, 5}), IR_ARG_INPUT, true);
  ir_matmul(f, r, q, loc);
  /* p @ transpose(p): a permute of the last two axes is a flag (tb). */
  IrValue *pt = ir_permute(f, p, (int64_t[]){0, 2, 1}, loc);
  ir_matmul(f, p, pt, loc);
  /* [5] @ [5,6]: a vector, M = 1. */
  IrValue *v = ir_func_add_arg(f, "v", f32(1, (int64_t[]){5}), IR_ARG_INPUT, false);
  ir_matmul(f, v, w, loc);

  RtGemm *g;
  int n = rt_gemm_list(f, &g);
  assert_int_equal(n, 5);
  assert_true(g[0].M == 24 && g[0].N == 6 && g[0].K == 5 && g[0].nb == 1 && !g[0].ta && !g[0].tb);
  assert_true(g[1].M == 4 && g[1].N == 6 && g[1].K == 5 && g[1].nb == 2);
  assert_true(g[1].aidx[1] == 1 && g[1].bidx[1] == 1);
  assert_true(g[2].nb == 6 && g[2].na == 3 && g[2].nbb == 2);
  for (int t = 0; t < 6; t++) assert_true(g[2].aidx[t] == t / 2 && g[2].bidx[t] == t % 2);
  assert_true(g[3].M == 4 && g[3].N == 4 && g[3].K == 5 && g[3].nb == 2 && !g[3].ta && g[3].tb);
  assert_true(g[4].M == 1 && g[4].N == 6 && g[4].K == 5 && g[4].nb == 1);
  for (int i = 0; i < n; i++) assert_false(g[i].accumulate || g[i].dbl);
  /* 2*M*N*K per call. */
  double flops = 2.0 * (24 * 6 * 5 + 2 * 4 * 6 * 5 + 6 * 4 * 6 * 5 + 2 * 4 * 4 * 5 + 6 * 5);
  assert_true(rt_gemm_flops(g, n) == flops);

  /* The floor runs every GEMM and times each window. */
  double ms[3] = {-1, -1, -1};
  const CpuGemmProvider *const *provs;
  char err[512];
  assert_true(cpu_gemm_providers(&provs) > 0);
  assert_true(rt_gemm_floor(g, n, 2, 1, provs[0]->name, 0, 3, ms, err, sizeof err));
  for (int i = 0; i < 3; i++) assert_true(ms[i] >= 0);
  rt_gemm_list_free(g, n);
  ir_func_free(f);
}

/* examples/tinygpt.gdl through the pass pipeline at a precision (f32:
 * IR_DT_F32); *text and *d are the caller's to free with the model. */
static FeModel *compile_tinygpt(IrDType precision, char **text, Diag *d) {
  *text = tu_read("examples/tinygpt.gdl");
  diag_init(d, NULL);
  d->quiet = true;
  FeModel *m = tu_compile("tinygpt.gdl", *text, 1, d);
  assert_non_null(m);
  int np;
  const char *const *pipe = pass_pipeline(&np);
  PassManager pm;
  pm_init(&pm);
  PassOptions po = {.gas = 1, .diag = d, .precision = precision};
  assert_int_equal(pm_run(&pm, m->func, pipe, np, &po), 0);
  return m;
}

/* On a compiled model: the GEMM list is every matmul of the program. */
static void test_gemm_list_tinygpt(void **state) {
  (void)state;
  char *text;
  Diag d;
  FeModel *m = compile_tinygpt(IR_DT_F32, &text, &d);
  int matmuls = 0;
  for (int i = 0; i < m->func->nops; i++) matmuls += m->func->ops[i]->opcode == IR_OP_MATMUL;
  RtGemm *g;
  int n = rt_gemm_list(m->func, &g);
  assert_int_equal(n, matmuls);
  /* Per layer 6 forward matmuls (qkv, q k^T, att v, proj, fc, fcp) plus
   * the tied logits; each has two backward products except where an
   * operand needs no gradient.  At least the forward ones are there. */
  assert_true(n >= 6 * 2 + 1);
  /* The attention scores: [B,NH,T,HD] @ [B,NH,HD,T] batched B*NH = 32 times. */
  bool scores = false;
  for (int i = 0; i < n; i++)
    if (g[i].nb == 32 && g[i].M == 32 && g[i].N == 32 && g[i].K == 16) scores = true;
  assert_true(scores);
  rt_gemm_list_free(g, n);
  fe_model_free(m);
  diag_free(&d);
  free(text);
}

/* A bf16 program (--precision bf16): every GEMM is listed as bf16, with a
 * bf16 result exactly where the op's result is bf16 and no gradient
 * buffer; the floor plans and runs them on every provider (the provider's
 * bf16 products, or gemm.c's widening and rounding). */
static void test_gemm_list_bf16(void **state) {
  (void)state;
  char *text;
  Diag d;
  FeModel *m = compile_tinygpt(IR_DT_BF16, &text, &d);
  RtGemm *g;
  int n = rt_gemm_list(m->func, &g), low_results = 0;
  assert_true(n >= 6 * 2 + 1);
  for (int i = 0; i < n; i++) {
    assert_true(g[i].bf16 && !g[i].dbl);
    assert_true(g[i].c_bf16 == (g[i].op->result->type.dtype == IR_DT_BF16 && !g[i].accumulate));
    low_results += g[i].c_bf16;
  }
  assert_true(low_results >= 6 * 2 + 1); /* the forward's at least */
  const CpuGemmProvider *const *provs;
  int nprov = cpu_gemm_providers(&provs);
  for (int k = 0; k < nprov; k++) {
    char why[256], err[512];
    if (!provs[k]->usable(why, sizeof why)) continue;
    double ms[2] = {-1, -1};
    if (!rt_gemm_floor(g, n, 1, 1, provs[k]->name, 0, 2, ms, err, sizeof err)) fail_msg("%s: %s", provs[k]->name, err);
    assert_true(ms[0] >= 0 && ms[1] >= 0);
  }
  rt_gemm_list_free(g, n);
  fe_model_free(m);
  diag_free(&d);
  free(text);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_bench_json_figures),   cmocka_unit_test(test_bench_gas_counts_per_window),
      cmocka_unit_test(test_bench_ref_has_no_kernels),
      cmocka_unit_test(test_bench_epilogue_drops_a_kernel), cmocka_unit_test(test_bench_text_order),
      cmocka_unit_test(test_bench_usage_errors),   cmocka_unit_test(test_gemm_list_shapes),
      cmocka_unit_test(test_gemm_list_tinygpt),   cmocka_unit_test(test_gemm_list_bf16),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
