/* test_torchref.c - gradc against the PyTorch float64 corpus of
 * tests/torchref/cases (written by tests/torchref/gen.py; no Python here).
 *
 * The case list is data: one cmocka test per entry of manifest.json, so a
 * new case needs no C change.  For a valid case and each --gas K of the
 * manifest: compile with the library (fe_model_compile at K, the default
 * pass pipeline), run one window with step_run_ref in ordinary f32 mode,
 * and compare every loss and the total (relative error) and every gradient
 * (||g - ref|| / ||ref||; ||g|| when the reference is exactly zero) with the
 * full-batch reference.  A refusal case must, for K > 1, fail with an
 * error on the line of the offending loss.  An error case must report its
 * first `file:line:col: error:` at the expected place, show the source line
 * with a caret under that column, name the shapes involved, and add the
 * expected notes.
 *
 * Finally the command line: the built gradc runs a few cases, and its stdout
 * must be `loss NAME VALUE` lines in %.9g, then `loss total VALUE`. */
#include <ctype.h>
#include <math.h>
#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "passes/passes.h"
#include "runtime/runtime.h"
#include "testutil.h"

#define CASES_DIR "tests/torchref/cases"

static cJSON *manifest;
static double loss_tol = 1e-4, grad_tol = 1e-4, zero_abs = 1e-6;

static char *case_path(const char *file) {
  static char buf[2][4096];
  static int k;
  k ^= 1;
  snprintf(buf[k], sizeof buf[k], "%s/%s/%s", GRADC_SOURCE_DIR, CASES_DIR, file);
  return buf[k];
}

static const char *jstr(const cJSON *c, const char *key) {
  const cJSON *j = cJSON_GetObjectItemCaseSensitive(c, key);
  return cJSON_IsString(j) ? j->valuestring : NULL;
}

static double jnum(const cJSON *c, const char *key, double dflt) {
  const cJSON *j = cJSON_GetObjectItemCaseSensitive(c, key);
  return cJSON_IsNumber(j) ? j->valuedouble : dflt;
}

static cJSON *read_json(const char *path) {
  const char *err = NULL;
  char *text = read_file(path, NULL, &err);
  if (!text) fail_msg("cannot read %s: %s", path, err);
  cJSON *j = cJSON_Parse(text);
  free(text);
  if (!j) fail_msg("%s: not valid JSON", path);
  return j;
}

static void read_st(const char *path, StFile *f) {
  char err[512];
  st_init(f);
  if (!st_read(path, f, err, sizeof err)) fail_msg("%s", err);
}

static double tensor_at(const StTensor *t, int64_t i) {
  switch (t->dtype) {
  case ST_F64: return ((const double *)t->data)[i];
  case ST_F32: return ((const float *)t->data)[i];
  case ST_I32: return ((const int32_t *)t->data)[i];
  case ST_I64: return (double)((const int64_t *)t->data)[i];
  case ST_BF16:
  case ST_F16: break;
  }
  fail_msg("tensor %s: unexpected dtype %s", t->name, st_dtype_name(t->dtype));
  return 0;
}

/* ------------------------------------------------------------------ */
/* Compiling a case                                                    */
/* ------------------------------------------------------------------ */

typedef struct Compiled {
  SrcFile src;
  char *text;
  Diag d;
  FeModel *model;
  int rc; /* 0 ok, 1 user error (frontend or pass), 2 internal */
} Compiled;

/* The model as the CLI would compile it for `run --gas K`: frontend, then
 * the default pipeline.  Diagnostics are kept in c->d.log. */
static void compile_case(Compiled *c, const char *file, int gas) {
  const char *err = NULL;
  size_t len;
  memset(c, 0, sizeof *c);
  c->text = read_file(case_path(file), &len, &err);
  if (!c->text) fail_msg("cannot read %s: %s", file, err);
  c->src = (SrcFile){file, c->text, len};
  diag_init(&c->d, NULL);
  c->d.quiet = true;
  FeOptions fo = {.gas = gas, .dp = 1};
  c->model = fe_model_compile(&c->src, &fo, &c->d);
  if (!c->model) {
    c->rc = 1;
    return;
  }
  int n;
  const char *const *pipe = pass_pipeline(&n);
  PassManager pm;
  pm_init(&pm);
  pm.verify = true;
  PassOptions po = {.gas = gas, .diag = &c->d, .src = &c->src};
  c->rc = pm_run(&pm, c->model->func, pipe, n, &po);
}

static void compiled_free(Compiled *c) {
  fe_model_free(c->model);
  diag_free(&c->d);
  free(c->text);
}

/* The first `FILE:LINE:COL: error:` line of a diagnostic log for `file`:
 * its line, column and start (NULL if none). */
static const char *first_error(const char *log, const char *file, int *line, int *col) {
  size_t n = strlen(file);
  for (const char *p = log; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL) {
    char tail[16];
    if (strncmp(p, file, n) == 0 && sscanf(p + n, ":%d:%d: %8[a-z]:", line, col, tail) == 3 &&
        strcmp(tail, "error") == 0)
      return p;
  }
  return NULL;
}

static char *line_of(const char *text, int line) {
  const char *p = text;
  for (int i = 1; i < line && p; i++) p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL;
  if (!p) return NULL;
  const char *e = strchr(p, '\n');
  size_t n = e ? (size_t)(e - p) : strlen(p);
  char *s = malloc(n + 1);
  memcpy(s, p, n);
  s[n] = 0;
  return s;
}

/* After the diagnostic at `diag`: a line showing the source line, then a
 * caret under column col (as check.py accepts it).  NULL when fine. */
static const char *check_caret(const char *diag, const char *src_line, int col) {
  const char *s = src_line;
  while (*s == ' ' || *s == '\t') s++;
  int indent = (int)(s - src_line);
  const char *p = strchr(diag, '\n');
  for (int k = 0; p && k < 5; k++, p = strchr(p + 1, '\n')) {
    const char *l = p + 1, *e = strchr(l, '\n');
    if (!e) break;
    const char *hit = strstr(l, s);
    if (!hit || hit > e) continue;
    const char *caret = strchr(e + 1, '^');
    const char *e2 = strchr(e + 1, '\n');
    if (!caret || (e2 && caret > e2)) return "no caret under the source line";
    if ((caret - (e + 1)) != (hit - l) + (col - 1 - indent)) return "caret under the wrong column";
    return NULL;
  }
  return "the source line is not printed after the diagnostic";
}

/* ------------------------------------------------------------------ */
/* Comparing a window with the reference                               */
/* ------------------------------------------------------------------ */

typedef struct Worst {
  double e;
  char what[96];
  int nfail;
} Worst;

static void note(Worst *w, double e, const char *what, bool ok, const char *name, int gas) {
  if (isnan(e) || e > w->e) {
    w->e = isnan(e) ? INFINITY : e;
    snprintf(w->what, sizeof w->what, "%s", what);
  }
  if (!ok) {
    w->nfail++;
    print_message("  FAIL %s --gas %d: %s: error %.3g\n", name, gas, what, e);
  }
}

static void run_numeric(const cJSON *c, int gas, double ltol, double gtol, Worst *w) {
  const char *name = jstr(c, "name"), *file = jstr(c, "file");
  Compiled cc;
  compile_case(&cc, file, gas);
  if (cc.rc != 0) {
    print_message("%s", sb_str(&cc.d.log));
    compiled_free(&cc);
    fail_msg("%s --gas %d: does not compile (status %d)", name, gas, cc.rc);
  }
  StFile params, inputs, refg;
  char *ppath = strdup(case_path(jstr(c, "params"))), *ipath = strdup(case_path(jstr(c, "inputs")));
  read_st(ppath, &params);
  read_st(ipath, &inputs);
  read_st(case_path(jstr(c, "ref")), &refg);
  cJSON *ref = read_json(case_path(jstr(c, "ref_json")));

  StepResult r;
  char err[1024];
  InterpOptions io = {.exact_f64 = false};
  if (!step_run_ref(cc.model->func, gas, &params, ppath, &inputs, ipath, &io, &r, err, sizeof err))
    fail_msg("%s --gas %d: step_run_ref: %s", name, gas, err);

  /* Losses: every reference loss exactly once, nothing else; then the total. */
  const cJSON *losses = cJSON_GetObjectItemCaseSensitive(ref, "losses"), *l;
  double total = 0;
  for (int i = 0; i < r.nlosses; i++) total += r.losses[i];
  if (cJSON_GetArraySize(losses) != r.nlosses)
    note(w, INFINITY, "number of losses", false, name, gas);
  cJSON_ArrayForEach(l, losses) {
    int found = -1;
    for (int i = 0; i < r.nlosses; i++)
      if (strcmp(r.loss_names[i], l->string) == 0) found = i;
    char what[96];
    snprintf(what, sizeof what, "loss %s", l->string);
    if (found < 0) {
      note(w, INFINITY, what, false, name, gas);
      continue;
    }
    double v = r.losses[found], rv = l->valuedouble;
    double e = rv != 0 ? fabs(v - rv) / fabs(rv) : fabs(v);
    note(w, e, what, e < ltol, name, gas);
    if (!(e < ltol)) print_message("       got %.9g, reference %.9g\n", v, rv);
  }
  double rt = jnum(ref, "total", NAN);
  double et = fabs(total - rt) / fabs(rt);
  note(w, et, "loss total", et < ltol, name, gas);

  /* Gradients: one per reference tensor, with its shape. */
  if (r.ngrads != refg.n) note(w, INFINITY, "number of gradients", false, name, gas);
  for (int k = 0; k < refg.n; k++) {
    const StTensor *t = &refg.t[k];
    char what[96];
    snprintf(what, sizeof what, "grad %s", t->name);
    int found = -1;
    for (int i = 0; i < r.ngrads; i++)
      if (strcmp(r.grad_names[i], t->name) == 0) found = i;
    if (found < 0) {
      note(w, INFINITY, what, false, name, gas);
      continue;
    }
    const IrShape *gs = &r.grad_types[found].shape;
    bool same = gs->rank == t->rank;
    for (int a = 0; same && a < t->rank; a++) same = gs->dim[a] == t->shape[a];
    if (!same) {
      snprintf(what, sizeof what, "grad %s: shape differs from the param's", t->name);
      note(w, INFINITY, what, false, name, gas);
      continue;
    }
    double dn = 0, rn = 0;
    for (int64_t i = 0; i < st_numel(t); i++) {
      double rv = tensor_at(t, i), d = r.grads[found][i] - rv;
      dn += d * d;
      rn += rv * rv;
    }
    dn = sqrt(dn);
    rn = sqrt(rn);
    if (rn == 0) {
      snprintf(what, sizeof what, "grad %s (reference 0: |g|)", t->name);
      note(w, dn, what, dn <= zero_abs, name, gas);
    } else {
      note(w, dn / rn, what, dn / rn < gtol, name, gas);
    }
  }
  step_result_free(&r);
  cJSON_Delete(ref);
  st_free(&params);
  st_free(&inputs);
  st_free(&refg);
  free(ppath);
  free(ipath);
  compiled_free(&cc);
}

static void run_refused(const cJSON *c, int gas, Worst *w) {
  const char *name = jstr(c, "name"), *file = jstr(c, "file");
  int want = (int)jnum(c, "refuse_line", -1), line = 0, col = 0;
  Compiled cc;
  compile_case(&cc, file, gas);
  const char *at = first_error(sb_str(&cc.d.log), file, &line, &col);
  if (cc.rc != 1 || !at) {
    w->nfail++;
    print_message("  FAIL %s --gas %d: expected a refusal (status 1 with an error), got status %d\n", name, gas,
                  cc.rc);
  } else if (want > 0 && line != want) {
    w->nfail++;
    print_message("  FAIL %s --gas %d: refused on line %d, expected line %d: %.160s\n", name, gas, line, want, at);
  }
  compiled_free(&cc);
}

static void run_error(const cJSON *c) {
  const char *name = jstr(c, "name"), *file = jstr(c, "file");
  int wl = (int)jnum(c, "expected_line", -1), wc = (int)jnum(c, "expected_col", -1), line = 0, col = 0;
  Compiled cc;
  compile_case(&cc, file, 1);
  const char *log = sb_str(&cc.d.log);
  const char *at = first_error(log, file, &line, &col);
  int bad = 0;
  if (cc.rc != 1 || !at) {
    print_message("  FAIL %s: expected an error (status 1), got status %d:\n%s", name, cc.rc, log);
    bad++;
  } else if (line != wl || col != wc) {
    print_message("  FAIL %s: first error at %d:%d, expected %d:%d:\n%s", name, line, col, wl, wc, log);
    bad++;
  } else {
    char *src_line = line_of(cc.text, line);
    const char *why = src_line ? check_caret(at, src_line, col) : "no such source line";
    if (why) {
      print_message("  FAIL %s: %s:\n%s", name, why, log);
      bad++;
    }
    free(src_line);
  }
  /* Shapes the message must name (Python regexes from the manifest; the
   * `\u00d7` alternative is dropped, the GNU ERE takes the rest). */
  const cJSON *shapes = cJSON_GetObjectItemCaseSensitive(c, "expected_shapes"), *s;
  cJSON_ArrayForEach(s, shapes) {
    char pat[256], *o = pat;
    for (const char *p = s->valuestring; *p && o < pat + sizeof pat - 1; p++) {
      if (strncmp(p, "\\u00d7", 6) == 0) p += 5;
      else *o++ = *p;
    }
    *o = 0;
    regex_t re;
    if (regcomp(&re, pat, REG_EXTENDED | REG_NOSUB) != 0) fail_msg("%s: bad regex %s", name, pat);
    if (regexec(&re, log, 0, NULL, 0) != 0) {
      print_message("  FAIL %s: the message does not name the shape /%s/:\n%s", name, pat, log);
      bad++;
    }
    regfree(&re);
  }
  /* Notes (an error inside an inlined fn: one at the call). */
  const cJSON *notes = cJSON_GetObjectItemCaseSensitive(c, "expected_notes"), *nt;
  cJSON_ArrayForEach(nt, notes) {
    char want[512];
    snprintf(want, sizeof want, "%s:%d:%d: note:", file, cJSON_GetArrayItem(nt, 0)->valueint,
             cJSON_GetArrayItem(nt, 1)->valueint);
    if (!strstr(log, want)) {
      print_message("  FAIL %s: no `%s` line:\n%s", name, want, log);
      bad++;
    }
  }
  int nerr = (int)jnum(c, "expected_nerrors", -1);
  if (nerr >= 0 && cc.d.nerrors != nerr) {
    print_message("  FAIL %s: %d errors, expected %d:\n%s", name, cc.d.nerrors, nerr, log);
    bad++;
  }
  print_message("  %-22s error at %d:%d%s\n", name, line, col, bad ? "  FAILED" : "");
  compiled_free(&cc);
  if (bad) fail_msg("%s: %d problem(s)", name, bad);
}

/* One manifest entry (the test's state). */
static void test_torchref_case(void **state) {
  const cJSON *c = *state;
  const char *name = jstr(c, "name"), *kind = jstr(c, "kind");
  assert_non_null(name);
  assert_non_null(kind);
  if (strcmp(kind, "error") == 0) {
    run_error(c);
    return;
  }
  assert_string_equal(kind, "run");
  double ltol = jnum(c, "tol", loss_tol), gtol = jnum(c, "tol", grad_tol);
  bool refuse = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(c, "refuse_gas_gt1"));
  const cJSON *g, *gas = cJSON_GetObjectItemCaseSensitive(c, "gas");
  assert_true(cJSON_GetArraySize(gas) > 0);
  int nfail = 0;
  cJSON_ArrayForEach(g, gas) {
    int K = g->valueint;
    Worst w = {0, "-", 0};
    if (refuse && K > 1) {
      run_refused(c, K, &w);
      print_message("  %-22s --gas %d  %s\n", name, K, w.nfail ? "NOT REFUSED as expected" : "refused");
    } else {
      run_numeric(c, K, ltol, gtol, &w);
      print_message("  %-22s --gas %d  worst %.1e (%s)%s\n", name, K, w.e, w.what, w.nfail ? "  FAILED" : "");
    }
    nfail += w.nfail;
  }
  if (nfail) fail_msg("%s: %d check(s) failed", name, nfail);
}

/* ------------------------------------------------------------------ */
/* The command line                                                    */
/* ------------------------------------------------------------------ */

static const cJSON *find_case(const char *name) {
  const cJSON *c;
  cJSON_ArrayForEach(c, cJSON_GetObjectItemCaseSensitive(manifest, "cases"))
    if (strcmp(jstr(c, "name"), name) == 0) return c;
  fail_msg("no case %s in the manifest", name);
  return NULL;
}

/* Run a shell command; its stdout (and stderr when merge) into out. */
static int run_cmd(const char *cmd, char *out, size_t n) {
  FILE *p = popen(cmd, "r");
  assert_non_null(p);
  size_t k = fread(out, 1, n - 1, p);
  out[k] = 0;
  int st = pclose(p);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* `gradc run` prints every loss as `loss NAME %.9g` in declaration order,
 * then `loss total`, on stdout only; the values are the reference's. */
static void test_torchref_cli_loss_lines(void **state) {
  (void)state;
  static const struct { const char *name; int gas; } runs[] = {{"unary_b", 2}, {"ce_variants", 4}, {"f64_model", 1}};
  char dir[] = "/tmp/gradc-torchref-XXXXXX";
  assert_non_null(mkdtemp(dir));
  for (size_t k = 0; k < sizeof runs / sizeof runs[0]; k++) {
    const cJSON *c = find_case(runs[k].name);
    char cmd[8192], out[16384], gpath[4200];
    snprintf(gpath, sizeof gpath, "%s/grads.safetensors", dir);
    /* case_path keeps its last two results: the command is built in two steps. */
    snprintf(cmd, sizeof cmd, "'%s' run '%s' --gas %d --params '%s'", GRADC_BINARY, case_path(jstr(c, "file")),
             runs[k].gas, case_path(jstr(c, "params")));
    size_t len = strlen(cmd);
    snprintf(cmd + len, sizeof cmd - len, " --inputs '%s' --grads-out '%s' 2>/dev/null", case_path(jstr(c, "inputs")),
             gpath);
    int st = run_cmd(cmd, out, sizeof out);
    if (st != 0) fail_msg("%s: exit status %d\n%s", cmd, st, out);

    cJSON *ref = read_json(case_path(jstr(c, "ref_json")));
    const cJSON *order = cJSON_GetObjectItemCaseSensitive(ref, "loss_order");
    const cJSON *losses = cJSON_GetObjectItemCaseSensitive(ref, "losses");
    int nwant = cJSON_GetArraySize(order), i = 0;
    double tol = fmax(jnum(c, "tol", loss_tol), 1e-8); /* %.9g keeps ~9 digits */
    for (char *l = strtok(out, "\n"); l; l = strtok(NULL, "\n"), i++) {
      char nm[128], val[64], back[64];
      int used = 0;
      if (sscanf(l, "loss %127s %63s%n", nm, val, &used) != 2 || l[used] != 0 || strncmp(l, "loss ", 5) != 0)
        fail_msg("%s: stdout line %d is not `loss NAME VALUE`: '%s'", runs[k].name, i + 1, l);
      const char *want = i < nwant ? cJSON_GetArrayItem(order, i)->valuestring : i == nwant ? "total" : NULL;
      if (!want || strcmp(nm, want) != 0)
        fail_msg("%s: stdout line %d names loss '%s', expected '%s'", runs[k].name, i + 1, nm, want ? want : "(none)");
      char *end;
      double v = strtod(val, &end);
      assert_true(*end == 0);
      snprintf(back, sizeof back, "%.9g", v);
      if (strcmp(back, val) != 0) fail_msg("%s: loss %s printed as '%s', not %%.9g ('%s')", runs[k].name, nm, val, back);
      double rv = i < nwant ? cJSON_GetObjectItemCaseSensitive(losses, nm)->valuedouble : jnum(ref, "total", NAN);
      double e = rv != 0 ? fabs(v - rv) / fabs(rv) : fabs(v);
      if (!(e < tol)) fail_msg("%s: loss %s = %s, reference %.9g", runs[k].name, nm, val, rv);
    }
    if (i != nwant + 1) fail_msg("%s: %d loss lines, expected %d", runs[k].name, i, nwant + 1);
    /* The gradient file holds every param, with the param's dtype. */
    StFile g, p;
    read_st(gpath, &g);
    read_st(case_path(jstr(c, "params")), &p);
    assert_int_equal(g.n, p.n);
    for (int t = 0; t < p.n; t++) {
      const StTensor *gt = st_find(&g, p.t[t].name);
      if (!gt) fail_msg("%s: no gradient for %s", runs[k].name, p.t[t].name);
      assert_int_equal(gt->dtype, p.t[t].dtype);
    }
    print_message("  %-22s gradc run --gas %d: %d loss lines ok\n", runs[k].name, runs[k].gas, i);
    st_free(&g);
    st_free(&p);
    cJSON_Delete(ref);
    unlink(gpath);
  }
  rmdir(dir);
}

/* `gradc compile --gas 2` of a refusal case exits 1 with the error on the
 * loss line, on stderr, and nothing on stdout. */
static void test_torchref_cli_refusal(void **state) {
  (void)state;
  const cJSON *c = find_case("refuse_mean_sq");
  char cmd[8192], out[16384], err[16384];
  snprintf(cmd, sizeof cmd, "'%s' compile '%s' --gas 2 2>/dev/null", GRADC_BINARY, case_path(jstr(c, "file")));
  assert_int_equal(run_cmd(cmd, out, sizeof out), 1);
  assert_string_equal(out, "");
  snprintf(cmd, sizeof cmd, "'%s' compile '%s' --gas 2 2>&1 >/dev/null", GRADC_BINARY, case_path(jstr(c, "file")));
  assert_int_equal(run_cmd(cmd, err, sizeof err), 1);
  int line = 0, col = 0;
  const char *file = case_path(jstr(c, "file"));
  if (!first_error(err, file, &line, &col)) fail_msg("no `%s:L:C: error:` on stderr:\n%s", file, err);
  assert_int_equal(line, (int)jnum(c, "refuse_line", -1));
}

int main(void) {
  const char *err = NULL;
  char *text = read_file(tu_path(CASES_DIR "/manifest.json"), NULL, &err);
  if (!text) {
    fprintf(stderr, "test_torchref: cannot read %s: %s\n", tu_path(CASES_DIR "/manifest.json"), err);
    return 1;
  }
  manifest = cJSON_Parse(text);
  free(text);
  if (!manifest) {
    fprintf(stderr, "test_torchref: manifest.json is not valid JSON\n");
    return 1;
  }
  const cJSON *tol = cJSON_GetObjectItemCaseSensitive(manifest, "tolerance");
  loss_tol = jnum(tol, "loss_rel", loss_tol);
  grad_tol = jnum(tol, "grad_rel", grad_tol);
  zero_abs = jnum(tol, "zero_grad_abs", zero_abs);

  const cJSON *cases = cJSON_GetObjectItemCaseSensitive(manifest, "cases"), *c;
  int n = cJSON_GetArraySize(cases), k = 0;
  struct CMUnitTest *tests = calloc((size_t)n + 2, sizeof *tests);
  char **names = calloc((size_t)n, sizeof *names);
  cJSON_ArrayForEach(c, cases) {
    const char *name = jstr(c, "name");
    names[k] = malloc(strlen(name ? name : "?") + 32);
    sprintf(names[k], "test_torchref_%s", name ? name : "?");
    tests[k] = (struct CMUnitTest){names[k], test_torchref_case, NULL, NULL, (void *)c};
    k++;
  }
  tests[k++] = (struct CMUnitTest)cmocka_unit_test(test_torchref_cli_loss_lines);
  tests[k++] = (struct CMUnitTest)cmocka_unit_test(test_torchref_cli_refusal);
  int rc = _cmocka_run_group_tests("torchref", tests, (size_t)k, NULL, NULL);
  for (int i = 0; i < n; i++) free(names[i]);
  free(names);
  free(tests);
  cJSON_Delete(manifest);
  return rc;
}
