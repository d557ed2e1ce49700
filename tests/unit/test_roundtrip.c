/* test_roundtrip.c - print -> read -> print is byte-identical for every
 * model in examples/ and tests/torchref/cases/, after every pass of the
 * pipeline, and every intermediate function verifies. */
#include <dirent.h>
#include <stdlib.h>
#include <string.h>

#include "passes/passes.h"
#include "testutil.h"

static int round_trip(const IrFunc *f, const char *what) {
  StrBuf a, b;
  sb_init(&a);
  sb_init(&b);
  ir_print(f, &a);
  SrcFile src = {what, sb_str(&a), a.len};
  Diag d;
  diag_init(&d, NULL);
  d.quiet = true;
  IrFunc *g = ir_read(&src, &d);
  if (!g) fail_msg("%s: the printed IR does not read back:\n%s", what, sb_str(&d.log));
  ir_print(g, &b);
  if (strcmp(sb_str(&a), sb_str(&b)) != 0) fail_msg("%s: print -> read -> print differs", what);
  char err[512];
  if (!ir_verify(g, err, sizeof err)) fail_msg("%s: read-back IR does not verify: %s", what, err);
  ir_func_free(g);
  diag_free(&d);
  sb_free(&a);
  sb_free(&b);
  return 1;
}

static int check_model(const char *rel, int gas) {
  char *text = tu_read(rel);
  Diag d;
  FeModel *m = tu_compile(rel, text, gas, &d);
  if (!m) { /* error cases of the corpus */
    free(text);
    diag_free(&d);
    return 0;
  }
  round_trip(m->func, rel);
  int n;
  const char *const *pipe = pass_pipeline(&n);
  PassOptions po = {.gas = gas, .diag = &d, .src = &m->src};
  for (int i = 0; i < n; i++) {
    PassManager pm;
    pm_init(&pm);
    pm.verify = true;
    if (pm_run(&pm, m->func, &pipe[i], 1, &po) != 0) break; /* a refusal: nothing more to print */
    char what[1200];
    snprintf(what, sizeof what, "%s after %s", rel, pipe[i]);
    round_trip(m->func, what);
  }
  fe_model_free(m);
  diag_free(&d);
  free(text);
  return 1;
}

static int check_dir(const char *rel, int gas) {
  DIR *dir = opendir(tu_path(rel));
  assert_non_null(dir);
  struct dirent *e;
  int n = 0;
  while ((e = readdir(dir)) != NULL) {
    size_t len = strlen(e->d_name);
    if (len < 5 || strcmp(e->d_name + len - 4, ".gdl") != 0) continue;
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", rel, e->d_name);
    n += check_model(path, gas);
  }
  closedir(dir);
  return n;
}

static void test_roundtrip_examples_after_every_pass(void **state) {
  (void)state;
  int n = check_dir("examples", 1) + check_dir("examples", 4);
  assert_true(n >= 6);
}

static void test_roundtrip_corpus_after_every_pass(void **state) {
  (void)state;
  int n = check_dir("tests/torchref/cases", 2);
  print_message("%d corpus models round-trip after every pass\n", n);
  assert_true(n >= 20);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_roundtrip_examples_after_every_pass),
      cmocka_unit_test(test_roundtrip_corpus_after_every_pass),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
