/* test_dp_rank_ops.c - the rank-dependent copies of sequence parallelism
 * (ir/ops.def: tp.scatter, rank.slice, rank.concat) on 2 tensor-parallel
 * ranks, executed by the reference interpreter and the CPU executor,
 * along axis 0 and axis 1, forward and backward (autodiff of a small
 * function whose loss uses all three), against values worked out by hand
 * from each rank's inputs.
 *
 * The function (chunks along axis a of the whole f32[4,6] param P: rank
 * r's chunk is P_r, the other rank's P_o; CH the chunk shape):
 *
 *   s  = tp.scatter P            chunk r of P: P_r
 *   q0 = rank.slice P shift=0    P_r
 *   q1 = rank.slice P shift=1    chunk (r + 1) mod 2: P_o
 *   c  = rank.concat 2 q1, s     chunk r of c = 2 P_o, chunk r+1 = P_r
 *   loss = sum(A * s) + sum(B * q0 * q0) + sum(E * c)
 *
 * with rank-dependent inputs A, B (CH) and E (whole).  By hand, on rank r:
 *
 *   loss = sum(A_r P_r) + sum(B_r P_r^2) + sum(E_r[chunk r] 2 P_o)
 *          + sum(E_r[chunk r+1] P_r)
 *   dP   = at chunk k, for each rank k: A_k + E_k[chunk k+1]
 *          (tp.scatter's gradient is all-gathered: the other rank's part
 *          comes from its inputs), plus 2 B_r P_r at chunk r (rank.slice
 *          shift 0's gradient: dy at chunk r), plus 2 E_r[chunk r] at
 *          chunk r+1 (through rank.concat operand 0, then rank.slice
 *          shift 1's gradient: dy at chunk r+1).
 *
 * The cases run this executable again under mpirun (`--worker rank 2 1`)
 * and are skipped with a message when the build has no MPI or mpirun is
 * absent (test_dp.h), or the CPU executor when it has no LLVM. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gradc.h"
#include "passes/passes.h"
#include "runtime/comm/comm.h"
#include "test_dp.h"

/* ---- the function and its inputs ---- */

#define ROWS 4
#define COLS 6

static int chunk_rows(int axis) { return axis == 0 ? ROWS / 2 : ROWS; }
static int chunk_cols(int axis) { return axis == 1 ? COLS / 2 : COLS; }

static char *rank_ir(int axis) {
  static char buf[4096];
  int cr = chunk_rows(axis), cc = chunk_cols(axis);
  snprintf(buf, sizeof buf,
           "func @rank(%%P: f32[4,6] param, %%A: f32[%d,%d] input, %%B: f32[%d,%d] input, %%E: f32[4,6] input) {\n"
           "  %%s = tp.scatter %%P {group=\"tp\", ranks=2, axis=%d} : f32[%d,%d]\n"
           "  %%q0 = rank.slice %%P {group=\"tp\", ranks=2, axis=%d, shift=0} : f32[%d,%d]\n"
           "  %%q1 = rank.slice %%P {group=\"tp\", ranks=2, axis=%d, shift=1} : f32[%d,%d]\n"
           "  %%two = const {value=2} : f32\n"
           "  %%u0 = mul %%q1, %%two : f32[%d,%d]\n"
           "  %%c = rank.concat %%u0, %%s {group=\"tp\", ranks=2, axis=%d} : f32[4,6]\n"
           "  %%as = mul %%A, %%s : f32[%d,%d]\n"
           "  %%qq = mul %%q0, %%q0 : f32[%d,%d]\n"
           "  %%bq = mul %%B, %%qq : f32[%d,%d]\n"
           "  %%ec = mul %%E, %%c : f32[4,6]\n"
           "  %%l1 = sum %%as {axes=[0,1], keepdim=false} : f32\n"
           "  %%l2 = sum %%bq {axes=[0,1], keepdim=false} : f32\n"
           "  %%l3 = sum %%ec {axes=[0,1], keepdim=false} : f32\n"
           "  %%t = add %%l1, %%l2 : f32\n"
           "  %%t2 = add %%t, %%l3 : f32\n"
           "  loss %%t2 {name=\"l\"}\n"
           "}\n",
           cr, cc, cr, cc, axis, cr, cc, axis, cr, cc, axis, cr, cc, cr, cc, axis, cr, cc, cr, cc, cr, cc);
  return buf;
}

/* Inputs of rank r (exact in f32); A and B are indexed in the chunk, E
 * and P in the whole tensor. */
static double aval(int r, int i, int j) { return 0.5 + i + 0.25 * j + 10 * r; }
static double bval(int r, int i, int j) { return 0.125 * (1 + i + j + r); }
static double eval_(int r, int i, int j) { return 1 + 0.5 * i - 0.25 * j + 3 * r; }
static double pval(int r, int i, int j) {
  (void)r;
  return 0.5 * (6 * i + j) - 3;
}

/* Element (i, j) of the chunk k along axis, in whole-tensor indices. */
static void whole_of(int axis, int k, int i, int j, int *wi, int *wj) {
  *wi = axis == 0 ? k * (ROWS / 2) + i : i;
  *wj = axis == 1 ? k * (COLS / 2) + j : j;
}

static double loss_by_hand(int axis, int r) {
  int o = 1 - r, cr = chunk_rows(axis), cc = chunk_cols(axis);
  double l = 0;
  for (int i = 0; i < cr; i++)
    for (int j = 0; j < cc; j++) {
      int ri, rj, oi, oj;
      whole_of(axis, r, i, j, &ri, &rj);
      whole_of(axis, o, i, j, &oi, &oj);
      double pr = pval(0, ri, rj), po = pval(0, oi, oj);
      l += aval(r, i, j) * pr + bval(r, i, j) * pr * pr;
      l += eval_(r, ri, rj) * 2 * po; /* chunk r of c: 2 P_o */
      l += eval_(r, oi, oj) * pr;     /* chunk r+1 of c: P_r */
    }
  return l;
}

static void grad_by_hand(int axis, int r, double *g) {
  int cr = chunk_rows(axis), cc = chunk_cols(axis);
  memset(g, 0, sizeof(double) * ROWS * COLS);
  for (int k = 0; k < 2; k++) /* chunk k: rank k's tp.scatter gradient, all-gathered */
    for (int i = 0; i < cr; i++)
      for (int j = 0; j < cc; j++) {
        int wi, wj, ni, nj;
        whole_of(axis, k, i, j, &wi, &wj);
        whole_of(axis, 1 - k, i, j, &ni, &nj);
        g[wi * COLS + wj] += aval(k, i, j) + eval_(k, ni, nj);
        if (k == r) g[wi * COLS + wj] += 2 * bval(r, i, j) * pval(0, wi, wj);
        else g[wi * COLS + wj] += 2 * eval_(r, ni, nj); /* chunk r of E_r, at chunk r+1 */
      }
}

static void tensor(StFile *f, const char *name, int rows, int cols, double (*v)(int, int, int), int r) {
  int64_t shape[2] = {rows, cols};
  float s[ROWS * COLS];
  for (int i = 0; i < rows; i++)
    for (int j = 0; j < cols; j++) s[i * cols + j] = (float)v(r, i, j);
  st_add(f, name, ST_F32, 2, shape, s);
}

static int count_ops(const IrFunc *f, IrOpcode opc) {
  int n = 0;
  for (int i = 0; i < f->nops; i++) n += f->ops[i]->opcode == opc;
  return n;
}

static int check(const StepResult *r, int axis, int rank, const char *what) {
  double want_l = loss_by_hand(axis, rank), want_g[ROWS * COLS];
  grad_by_hand(axis, rank, want_g);
  CHECK(r->nlosses == 1 && r->ngrads == 1, "%s: %d losses, %d gradients", what, r->nlosses, r->ngrads);
  CHECK(fabs(r->losses[0] - want_l) <= 1e-6 * fabs(want_l), "%s axis %d: loss %.9g, want %.9g", what, axis,
        r->losses[0], want_l);
  CHECK(ir_numel(&r->grad_types[0].shape) == ROWS * COLS, "%s: gradient shape", what);
  for (int k = 0; k < ROWS * COLS; k++)
    CHECK(fabs(r->grads[0][k] - want_g[k]) <= 1e-6 * fmax(1, fabs(want_g[k])), "%s axis %d: dP[%d][%d] = %.9g, want %.9g",
          what, axis, k / COLS, k % COLS, r->grads[0][k], want_g[k]);
  return 0;
}

static int worker_rank_ops(Comm *c, bool cpu_too) {
  char err[2048];
  StepDp d;
  step_dp_init(&d, c);
  for (int axis = 0; axis < 2; axis++) {
    IrFunc *ref = dp_parse("rank.gir", rank_ir(axis)), *cpu = dp_parse("rank.gir", rank_ir(axis));
    CHECK(ref && cpu, "parse");
    int n;
    const char *const *pipe = pass_pipeline(&n);
    CHECK(dp_run_passes(ref, pipe, n, &(PassOptions){.gas = 1}) == 0, "the default pipeline");
    pipe = pass_pipeline_cpu(&n);
    CHECK(dp_run_passes(cpu, pipe, n, &(PassOptions){.gas = 1}) == 0, "the cpu pipeline");
    /* The backward has the gradients' ops: tp.scatter's all-gather,
     * rank.slice's rank.concat and rank.concat's rank.slices. */
    CHECK(count_ops(ref, IR_OP_ALL_GATHER_START) == 1, "tp.scatter's gradient is not all-gathered");
    CHECK(count_ops(ref, IR_OP_RANK_CONCAT) >= 2 && count_ops(ref, IR_OP_RANK_SLICE) >= 3,
          "%d rank.concat, %d rank.slice after autodiff", count_ops(ref, IR_OP_RANK_CONCAT),
          count_ops(ref, IR_OP_RANK_SLICE));
    StFile params, inputs;
    st_init(&params);
    st_init(&inputs);
    tensor(&params, "P", ROWS, COLS, pval, c->rank);
    tensor(&inputs, "A", chunk_rows(axis), chunk_cols(axis), aval, c->rank);
    tensor(&inputs, "B", chunk_rows(axis), chunk_cols(axis), bval, c->rank);
    tensor(&inputs, "E", ROWS, COLS, eval_, c->rank);
    StepResult r;
    step_dp_begin(&d);
    CHECK(step_run_ref(ref, 1, &params, "params", &inputs, "inputs", NULL, &r, err, sizeof err), "ref: %s", err);
    CHECK(step_dp_end(&d, NULL, err, sizeof err), "%s", err);
    if (check(&r, axis, c->rank, "ref")) return 1;
    step_result_free(&r);
    if (cpu_too) {
      CpuOptions co = {.threads = 1, .cache_dir = getenv("GRADC_CACHE_DIR")};
      CpuProgram *p = cpu_program_new(cpu, &co, err, sizeof err);
      CHECK(p, "cpu_program_new: %s", err);
      for (int rep = 0; rep < 2; rep++) { /* buffers reused */
        step_dp_begin(&d);
        CHECK(cpu_step_run(p, 1, &params, "params", &inputs, "inputs", &r, err, sizeof err), "cpu: %s", err);
        CHECK(step_dp_end(&d, NULL, err, sizeof err), "%s", err);
        if (check(&r, axis, c->rank, "cpu")) return 1;
        step_result_free(&r);
      }
      cpu_program_free(p);
    }
    CHECK(comm_check(&c->world, "the test", err, sizeof err), "%s", err);
    if (c->rank == 0)
      printf("axis %d: loss and gradient on rank 0 as by hand (ref%s)\n", axis, cpu_too ? ", cpu" : "");
    st_free(&params);
    st_free(&inputs);
    ir_func_free(ref);
    ir_func_free(cpu);
  }
  step_dp_free(&d);
  return 0;
}

static int worker(const char *name, int tp, int dp) {
  Comm *c = dp_worker_open(tp, dp);
  if (!c) return 1;
  int rc = 1;
  if (strcmp(name, "rank") == 0 || strcmp(name, "rank-ref") == 0) rc = worker_rank_ops(c, strcmp(name, "rank") == 0);
  return dp_worker_close(c, name, rc);
}

/* ------------------------------------------------------------------ */
/* Tests                                                                */
/* ------------------------------------------------------------------ */

/* The interpreter always; the CPU executor when the build has LLVM. */
static void test_dp_rank_ops_forward_and_gradients_by_hand_on_tp2(void **state) {
  (void)state;
#ifdef GRADC_HAVE_LLVM
  dp_run_workers("rank", 2, 1);
#else
  print_message("the CPU executor is skipped: this build has no LLVM\n");
  dp_run_workers("rank-ref", 2, 1);
#endif
}

int main(int argc, char **argv) {
  if (argc == 5 && strcmp(argv[1], "--worker") == 0) return worker(argv[2], atoi(argv[3]), atoi(argv[4]));
  if (!dp_find_self()) return 1;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_dp_rank_ops_forward_and_gradients_by_hand_on_tp2),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
