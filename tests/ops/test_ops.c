/* test_ops.c - every row of the op-case table (cases.c) on every back end
 * against the reference interpreter, and every differentiable row's
 * derivative against finite differences (ggml's test-backend-ops).
 *
 *   every op has a row   ops.def's X-macro: each op has a row that runs on
 *                        the back ends, or an entry (and a reason) in the
 *                        exclusion list; a new op cannot land without one
 *   cpu, cuda emulator   the rows one kernel per op, then fused with the
 *                        rows of their kind that share operands (`fuse`):
 *                        each kernel run on its own, inputs from the
 *                        interpreter, outputs compared (tolerances in
 *                        backends.c); a failure names the row, the first
 *                        mismatches and the largest error
 *   gradcheck            the row in f64: autodiff on the interpreter
 *                        against central differences
 *
 * GRADC_OPS_ROW=N runs row N alone (debugging), GRADC_TEST_TRACE=1 names
 * every kernel as it runs.  The library is reached through backends.h
 * only. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends.h"
#include "testutil.h"

/* "row 17: exp f32[3,8] (NaN and infinities)" */
static const char *describe(int row, char *buf, size_t n) {
  const OpCase *c = &op_cases[row];
  int len = snprintf(buf, n, "row %d: %s %s", row, ot_op_name(c->op), c->operands);
  if (c->attrs) len += snprintf(buf + len, n - (size_t)len, " {%s}", c->attrs);
  if (c->result) len += snprintf(buf + len, n - (size_t)len, " -> %s", c->result);
  if (c->note) snprintf(buf + len, n - (size_t)len, " (%s)", c->note);
  return buf;
}

static const OpExclusion *excluded(IrOpcode op) {
  for (int i = 0; i < op_nexclusions; i++)
    if (op_exclusions[i].op == op) return &op_exclusions[i];
  return NULL;
}

/* Rows the back ends run: not excluded, and GRADC_OPS_ROW if set. */
static bool backend_row(int row) {
  const char *only = getenv("GRADC_OPS_ROW");
  if (only && *only && atoi(only) != row) return false;
  return !excluded(op_cases[row].op);
}

/* After a failed check: the rows its messages name (%r<row>), then the messages. */
static void report(const char *backend, const char *err, int *failed) {
  fprintf(stderr, "%s: FAIL\n", backend);
  for (const char *p = err; (p = strstr(p, "%r")) != NULL; p += 2) {
    char *end;
    long row = strtol(p + 2, &end, 10);
    if (end == p + 2 || row < 0 || row >= op_ncases) continue;
    char d[512];
    fprintf(stderr, "  %s\n", describe((int)row, d, sizeof d));
    ++*failed;
  }
  fprintf(stderr, "%s\n", err);
}

/* ------------------------------------------------------------------ */
/* Every op has a row                                                  */
/* ------------------------------------------------------------------ */

/* The ops of ops.def with neither a row in rows[0..n) nor an exclusion,
 * named in list; their number. */
static int missing_ops(const OpCase *rows, int n, char *list, size_t len) {
  int missing = 0;
  list[0] = 0;
  for (int op = 0; op < IR_OP_COUNT; op++) {
    int k = 0;
    for (int r = 0; r < n; r++) k += rows[r].op == (IrOpcode)op;
    if (k || excluded((IrOpcode)op)) continue;
    size_t used = strlen(list);
    snprintf(list + used, len - used, " %s", ot_op_name((IrOpcode)op));
    missing++;
  }
  return missing;
}

static void test_ops_every_op_has_a_case(void **state) {
  (void)state;
  for (int i = 0; i < op_nexclusions; i++) {
    const OpExclusion *x = &op_exclusions[i];
    if (!x->why || !*x->why) fail_msg("the exclusion of %s gives no reason", ot_op_name(x->op));
    for (int j = 0; j < i; j++)
      if (op_exclusions[j].op == x->op) fail_msg("%s is excluded twice", ot_op_name(x->op));
  }
  char list[4096];
  int missing = missing_ops(op_cases, op_ncases, list, sizeof list);
  if (missing)
    fail_msg("%d op%s of ir/ops.def without a row in tests/ops/cases.c (nor an exclusion with a reason):%s", missing,
             missing == 1 ? "" : "s", list);
}

/* The check itself: the table without its gelu rows misses gelu, only. */
static void test_ops_a_missing_row_is_caught(void **state) {
  (void)state;
  OpCase *rows = calloc((size_t)op_ncases, sizeof *rows);
  int n = 0;
  for (int r = 0; r < op_ncases; r++)
    if (op_cases[r].op != IR_OP_GELU) rows[n++] = op_cases[r];
  char list[4096];
  assert_int_equal(missing_ops(rows, n, list, sizeof list), 1);
  assert_string_equal(list, " gelu");
  free(rows);
}

/* ------------------------------------------------------------------ */
/* Building the functions                                              */
/* ------------------------------------------------------------------ */

/* The kind groups of the table: rows of one kind (ops.def's kind column)
 * share a function (one module, one compile); fused, operands too. */
enum { NGROUPS = 16 };

typedef struct Fn {
  const char *kind;
  IrFunc *f;
  OtInputs in;
  char name[64];
  int rows;
} Fn;

/* Whether every operand of the row is f32 (or an integer, a boolean): the
 * fused functions, as the model pipelines see them. */
static bool f32_row(const OpCase *c) {
  return !strstr(c->operands, "f64") && !strstr(c->operands, "bf16") && !strstr(c->operands, "f16");
}

/* Every back-end row in functions by op kind; fused: f32 rows only, with
 * shared operands, through `fuse`, else one kernel per op; cuda: with the
 * CUDA back end's pass options. */
static int build_fns(Fn *fns, bool fused, bool cuda) {
  memset(fns, 0, sizeof *fns * NGROUPS);
  for (int r = 0; r < op_ncases; r++) {
    const OpCase *c = &op_cases[r];
    if (!backend_row(r) || (fused && !f32_row(c))) continue;
    Fn *fn = NULL;
    for (int g = 0; g < NGROUPS && !fn; g++)
      if (!fns[g].f || fns[g].kind == ot_op_kind(c->op)) fn = &fns[g];
    if (!fn) fail_msg("more than %d op kinds", NGROUPS);
    if (!fn->f) {
      snprintf(fn->name, sizeof fn->name, "%s%s", ot_op_kind(c->op), fused ? " fused" : "");
      for (char *p = fn->name; *p && *p != ' '; p++) *p = (char)(*p - 'A' + 'a');
      fn->f = ot_func_new(fused ? "fused" : "ops");
      fn->kind = ot_op_kind(c->op);
    }
    char err[1024], d[512];
    if (!ot_case_emit(fn->f, c, r, fused, &fn->in, err, sizeof err)) fail_msg("%s: %s", describe(r, d, sizeof d), err);
    fn->rows++;
  }
  int n = 0;
  for (int g = 0; g < NGROUPS; g++) {
    if (!fns[g].f) continue;
    char err[4096];
    if (fused) {
      static const char *const p[] = {"fuse"};
      if (!ot_passes(fns[g].f, p, 1, cuda, err, sizeof err)) fail_msg("%s: %s", fns[g].name, err);
    } else {
      ot_one_kernel_per_op(fns[g].f);
    }
    if (!ot_verify(fns[g].f, err, sizeof err)) fail_msg("%s: verify: %s", fns[g].name, err);
    ot_trivial_plan(fns[g].f);
    fns[n++] = fns[g];
  }
  return n;
}

static void free_fns(Fn *fns, int n) {
  for (int i = 0; i < n; i++) {
    ot_inputs_free(&fns[i].in);
    ot_func_free(fns[i].f);
  }
}

/* ------------------------------------------------------------------ */
/* The back ends                                                       */
/* ------------------------------------------------------------------ */

static void cpu(bool fused) {
  if (!ot_cpu_available()) {
    fprintf(stderr, "skipped: this build has no CPU back end\n");
    skip();
  }
  Fn fns[NGROUPS];
  int n = build_fns(fns, fused, false), failed = 0, rows = 0;
  OtStats all = {0};
  static char err[1 << 16];
  for (int i = 0; i < n; i++) {
    OtStats st = {0};
    if (!ot_cpu_check(fns[i].f, &fns[i].in, fns[i].name, &st, err, sizeof err)) report(fns[i].name, err, &failed);
    if (st.outputs < fns[i].rows && !failed)
      fail_msg("%s: %d rows but %d outputs", fns[i].name, fns[i].rows, st.outputs);
    all.kernels += st.kernels, all.outputs += st.outputs, rows += fns[i].rows;
    if (st.worst > all.worst) all.worst = st.worst;
  }
  free_fns(fns, n);
  fprintf(stderr, "cpu%s: %d rows, %d kernels, %d outputs, largest error %.3g of its tolerance\n",
          fused ? " fused" : "", rows, all.kernels, all.outputs, all.worst);
  if (failed) fail_msg("%d row%s failed on the CPU back end (above)", failed, failed == 1 ? "" : "s");
}

static void test_ops_cpu(void **state) { (void)state, cpu(false); }
static void test_ops_cpu_fused(void **state) { (void)state, cpu(true); }

static void test_ops_cuda_emulator(void **state) {
  (void)state;
  char why[256];
  if (!ot_emu_available(why, sizeof why)) {
    fprintf(stderr, "skipped: %s\n", why);
    skip();
  }
  Fn fns[2 * NGROUPS];
  int n = build_fns(fns, false, true);
  n += build_fns(fns + n, true, true);
  IrFunc *fs[2 * NGROUPS];
  const char *names[2 * NGROUPS];
  for (int i = 0; i < n; i++) fs[i] = fns[i].f, names[i] = fns[i].name;
  static char err[1 << 16];
  OtEmu *e = ot_emu_build(fs, names, n, err, sizeof err);
  if (!e) fail_msg("%s", err);
  int failed = 0, rows = 0;
  OtStats all = {0};
  for (int i = 0; i < n; i++) {
    OtStats st = {0};
    if (!ot_emu_check(e, i, &fns[i].in, &st, err, sizeof err)) report(fns[i].name, err, &failed);
    if (st.outputs < fns[i].rows && !failed)
      fail_msg("%s: %d rows but %d outputs", fns[i].name, fns[i].rows, st.outputs);
    all.kernels += st.kernels, all.outputs += st.outputs, rows += fns[i].rows;
    if (st.worst > all.worst) all.worst = st.worst;
  }
  ot_emu_free(e);
  free_fns(fns, n);
  fprintf(stderr, "cuda emulator: %d rows (one kernel per op and fused), %d kernels, %d outputs, largest error %.3g "
                  "of its tolerance\n",
          rows, all.kernels, all.outputs, all.worst);
  if (failed) fail_msg("%d row%s failed on the CUDA back end (above)", failed, failed == 1 ? "" : "s");
}

/* ------------------------------------------------------------------ */
/* Derivatives                                                         */
/* ------------------------------------------------------------------ */

/* The row as the gradient check sees it (every float type f64): rows that
 * differ only in float type are checked once. */
static void grad_key(const OpCase *c, char *buf, size_t n) {
  char ops[256];
  size_t k = 0;
  for (const char *p = c->operands; *p && k + 4 < sizeof ops;) {
    if (strncmp(p, "bf16", 4) == 0 || strncmp(p, "f16", 3) == 0 || strncmp(p, "f32", 3) == 0) {
      memcpy(ops + k, "f64", 3);
      k += 3;
      p += p[0] == 'b' ? 4 : 3;
    } else {
      ops[k++] = *p++;
    }
  }
  ops[k] = 0;
  snprintf(buf, n, "%d|%s|%s|%s|%d", (int)c->op, ops, c->attrs ? c->attrs : "",
           c->result && c->op != IR_OP_CAST ? c->result : "", (int)c->edge);
}

/* Finite differences need smooth points: no ties, no special values. */
static bool grad_row(const OpCase *c) {
  if (!ot_op_has_derivative(c->op) || (c->flags & OC_NO_GRAD) || strchr(c->operands, '~')) return false;
  return c->edge == OE_NONE || c->edge == OE_IGNORE || c->edge == OE_ALL_IGNORED || c->edge == OE_REPEAT;
}

static void test_ops_gradcheck(void **state) {
  (void)state;
  const char *only = getenv("GRADC_OPS_ROW");
  if (only && !*only) only = NULL;
  char (*keys)[512] = calloc((size_t)op_ncases, sizeof *keys);
  int nkeys = 0, failed = 0, checked = 0, params = 0;
  bool seen_op[IR_OP_COUNT] = {false};
  for (int r = 0; r < op_ncases; r++) {
    const OpCase *c = &op_cases[r];
    if ((only && atoi(only) != r) || !grad_row(c)) continue;
    grad_key(c, keys[nkeys], sizeof keys[nkeys]);
    bool dup = false;
    for (int k = 0; k < nkeys; k++) dup |= strcmp(keys[k], keys[nkeys]) == 0;
    if (dup) continue;
    nkeys++;
    char err[2048], d[512];
    int np = 0;
    if (!ot_gradcheck(c, 500 + (uint64_t)r, &np, err, sizeof err)) {
      fprintf(stderr, "gradcheck: FAIL %s\n  %s\n", describe(r, d, sizeof d), err);
      failed++;
    }
    checked++;
    params += np;
    if (np > 0) seen_op[c->op] = true;
  }
  free(keys);
  /* every differentiable op the table has a row for is checked somewhere */
  for (int r = 0; !only && r < op_ncases; r++) {
    IrOpcode op = op_cases[r].op;
    if (ot_op_has_derivative(op) && !seen_op[op] && op != IR_OP_CAST)
      fail_msg("%s has a derivative but no row whose gradient is checked", ot_op_name(op));
  }
  fprintf(stderr, "gradcheck: %d rows, %d params checked against finite differences\n", checked, params);
  if (failed) fail_msg("%d row%s failed the gradient check (above)", failed, failed == 1 ? "" : "s");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_ops_every_op_has_a_case),
      cmocka_unit_test(test_ops_a_missing_row_is_caught),
      cmocka_unit_test(test_ops_cpu),
      cmocka_unit_test(test_ops_cpu_fused),
      cmocka_unit_test(test_ops_cuda_emulator),
      cmocka_unit_test(test_ops_gradcheck),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
