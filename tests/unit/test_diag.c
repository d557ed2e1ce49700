/* test_diag.c - runs every .gdl file in tests/diag/ through the frontend and checks
 * its diagnostics against the file's own comment lines:
 *   # expect: FILE:LINE:COL: error: MESSAGE   the first diagnostic line, exactly
 *   # expect-note: ...                        a line that must appear
 *   # expect-errors: N                        the number of errors
 *   # gas: K          # define: NAME=V        compile options
 * A located error must be followed by its source line and a caret under
 * the column (DESIGN.md section 2, Diagnostics). */
#include <dirent.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

enum { MAX_FILES = 256, MAX_DEFS = 8 };

typedef struct Expect {
  char first[512];
  char notes[4][512];
  int nnotes;
  int nerrors; /* -1: not checked */
  int gas;
  const char *def_names[MAX_DEFS];
  int64_t def_values[MAX_DEFS];
  char def_buf[MAX_DEFS][64];
  int ndefs;
} Expect;

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* Line `n` (1-based) of text, into buf. */
static void nth_line(const char *text, int n, char *buf, size_t len) {
  const char *p = text;
  for (int i = 1; i < n && p; i++) {
    p = strchr(p, '\n');
    if (p) p++;
  }
  if (!p) p = "";
  size_t k = strcspn(p, "\n");
  if (k >= len) k = len - 1;
  memcpy(buf, p, k);
  buf[k] = '\0';
}

/* Copy the rest of a directive line after `key` into out. */
static bool directive(const char *line, const char *key, char *out, size_t len) {
  size_t k = strlen(key);
  if (strncmp(line, key, k) != 0) return false;
  size_t n = strlen(line + k);
  if (n >= len) n = len - 1;
  memcpy(out, line + k, n);
  out[n] = '\0';
  return true;
}

static void parse_expect(const char *text, Expect *e) {
  memset(e, 0, sizeof *e);
  e->nerrors = -1;
  e->gas = 1;
  char line[1024], val[512];
  for (int n = 1;; n++) {
    nth_line(text, n, line, sizeof line);
    if (directive(line, "# expect: ", val, sizeof val)) snprintf(e->first, sizeof e->first, "%s", val);
    if (directive(line, "# expect-note: ", val, sizeof val) && e->nnotes < 4)
      snprintf(e->notes[e->nnotes++], sizeof e->notes[0], "%s", val);
    if (directive(line, "# expect-errors: ", val, sizeof val)) e->nerrors = atoi(val);
    if (directive(line, "# gas: ", val, sizeof val)) e->gas = atoi(val);
    if (directive(line, "# define: ", val, sizeof val) && e->ndefs < MAX_DEFS) {
      char *eq = strchr(val, '=');
      if (eq) {
        *eq = '\0';
        snprintf(e->def_buf[e->ndefs], sizeof e->def_buf[0], "%.63s", val);
        e->def_names[e->ndefs] = e->def_buf[e->ndefs];
        e->def_values[e->ndefs++] = atoll(eq + 1);
      }
    }
    /* directives live in the leading comment block */
    if (line[0] != '#') break;
  }
}

/* Check one file; append a description of any mismatch to `problems`. */
static void check_file(const char *name, StrBuf *problems) {
  char rel[512];
  snprintf(rel, sizeof rel, "tests/diag/%s", name);
  char *text = tu_read(rel);
  Expect e;
  parse_expect(text, &e);
  if (!e.first[0]) {
    sb_printf(problems, "%s: no '# expect:' line\n", name);
    free(text);
    return;
  }
  SrcFile src = {name, text, strlen(text)};
  Diag d;
  diag_init(&d, NULL);
  d.quiet = true;
  FeOptions opt = {.def_names = e.def_names, .def_values = e.def_values, .ndefs = e.ndefs, .gas = e.gas, .dp = 1};
  FeModel *m = fe_model_compile(&src, &opt, &d);
  const char *log = sb_str(&d.log);
  char got[1024], src_line[1024], caret[1024], want_src[1024];
  nth_line(log, 1, got, sizeof got);
  if (m) {
    sb_printf(problems, "%s: compiled without error\n", name);
  } else if (strcmp(got, e.first) != 0) {
    sb_printf(problems, "%s: first diagnostic\n  got:  %s\n  want: %s\n", name, got, e.first);
  } else {
    int line, col;
    size_t nlen = strlen(name);
    if (strncmp(got, name, nlen) == 0 && sscanf(got + nlen, ":%d:%d:", &line, &col) == 2) {
      nth_line(log, 2, src_line, sizeof src_line);
      nth_line(log, 3, caret, sizeof caret);
      nth_line(text, line, want_src, sizeof want_src);
      bool caret_ok = (int)strlen(caret) == col && caret[col - 1] == '^';
      for (int i = 0; i + 1 < col && caret_ok; i++) caret_ok = caret[i] == ' ' || caret[i] == '\t';
      if (strcmp(src_line, want_src) != 0 || !caret_ok)
        sb_printf(problems, "%s: source line or caret wrong:\n%s\n%s\n", name, src_line, caret);
    }
  }
  for (int i = 0; i < e.nnotes; i++) {
    char want[600];
    snprintf(want, sizeof want, "\n%s\n", e.notes[i]);
    if (!strstr(log, want)) sb_printf(problems, "%s: missing note '%s'\n", name, e.notes[i]);
  }
  if (e.nerrors >= 0 && d.nerrors != e.nerrors)
    sb_printf(problems, "%s: %d errors, want %d:\n%s", name, d.nerrors, e.nerrors, log);
  fe_model_free(m);
  diag_free(&d);
  free(text);
}

static void test_diag_files_give_expected_first_error(void **state) {
  (void)state;
  DIR *dir = opendir(tu_path("tests/diag"));
  assert_non_null(dir);
  char *names[MAX_FILES];
  int n = 0;
  struct dirent *ent;
  while ((ent = readdir(dir)) && n < MAX_FILES) {
    size_t len = strlen(ent->d_name);
    if (len > 4 && strcmp(ent->d_name + len - 4, ".gdl") == 0) names[n++] = strdup(ent->d_name);
  }
  closedir(dir);
  qsort(names, (size_t)n, sizeof *names, cmp_str);
  assert_true(n >= 15);
  StrBuf problems;
  sb_init(&problems);
  for (int i = 0; i < n; i++) check_file(names[i], &problems);
  for (int i = 0; i < n; i++) free(names[i]);
  if (problems.len) fail_msg("%s", sb_str(&problems));
  sb_free(&problems);
}

/* The conformance case (pub_err_shape) as printed, in full. */
static void test_diag_broadcast_error_format(void **state) {
  (void)state;
  char *text = tu_read("tests/diag/shape_broadcast.gdl");
  Diag d;
  assert_null(tu_compile("pub_err_shape.gdl", text, 1, &d));
  assert_string_equal(sb_str(&d.log), "pub_err_shape.gdl:18:20: error: 'add': cannot broadcast f32[10,6] and f32[10,5]\n"
                                      "  h = tanh(x @ Wa) + sigmoid(x @ Wb)\n"
                                      "                   ^\n");
  assert_int_equal(d.nerrors, 1);
  diag_free(&d);
  free(text);
}

/* Diag caps the errors of one file at 20. */
static void test_diag_at_most_twenty_errors(void **state) {
  (void)state;
  StrBuf sb;
  sb_init(&sb);
  sb_puts(&sb, "model m {\n");
  for (int i = 0; i < 50; i++) sb_printf(&sb, "  x%d = y%d\n", i, i);
  sb_puts(&sb, "}\n");
  Diag d;
  assert_null(tu_compile("t.gdl", sb_str(&sb), 1, &d));
  assert_int_equal(d.nerrors, 20);
  assert_non_null(strstr(sb_str(&d.log), "t.gdl:21:9: error: unknown name 'y19'"));
  assert_null(strstr(sb_str(&d.log), "'y20'"));
  diag_free(&d);
  sb_free(&sb);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_diag_files_give_expected_first_error),
      cmocka_unit_test(test_diag_broadcast_error_format),
      cmocka_unit_test(test_diag_at_most_twenty_errors),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
