/* test_optim.c - the optimisers of the C API against PyTorch.
 *
 * tests/optim/expected.json holds trajectories from torch.optim (SGD with
 * momentum, dampening, Nesterov and weight decay; AdamW; clip_grad_norm_;
 * a LambdaLR warm-up + cosine schedule), written by tests/optim/gen.py.
 * Each case is replayed here through include/gradc.h on
 * tests/optim/quad.gdl (gradient g + w, the inputs choose g): per step the
 * learning rate the step uses, the losses, the gradient norm before
 * clipping, and the params after the step must match torch (relative 1e-6
 * for f64 params, 1e-5 for f32).  A checkpoint taken mid-trajectory and
 * resumed in a fresh session lands on the same params bit for bit. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gradc.h"
#include "testutil.h"

static cJSON *expected; /* the whole file */

static cJSON *field(const cJSON *o, const char *key) {
  cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
  if (!v) fail_msg("expected.json: no field '%s'", key);
  return v;
}
static double num(const cJSON *o, const char *key) { return field(o, key)->valuedouble; }

/* The n numbers of a JSON array. */
static void numbers(const cJSON *a, double *out, int n) {
  assert_int_equal(cJSON_GetArraySize(a), n);
  int i = 0;
  for (const cJSON *c = a->child; c; c = c->next) out[i++] = c->valuedouble;
}

static void check_api(gradc_status st, const char *what) {
  if (st != GRADC_OK) fail_msg("%s: %s", what, gradc_last_error());
}

static bool close_rel(double got, double want, double tol) {
  return fabs(got - want) <= tol * fmax(fabs(want), 1e-3);
}

static void expect_close(const char *cs, int step, const char *what, double got, double want, double tol) {
  if (!close_rel(got, want, tol))
    fail_msg("case %s, step %d: %s = %.17g, torch %.17g (relative error %.3g > %g)", cs, step, what, got, want,
             fabs(got - want) / fmax(fabs(want), 1e-3), tol);
}

typedef struct Case {
  const cJSON *c;
  const char *name;
  bool f64;
  double tol;
  gradc_program *p;
} Case;

static const char *pnames[2] = {"w1", "w2"}, *inames[2] = {"g1", "g2"};
static const int sizes[2] = {3, 4};

static void case_open(Case *k, const cJSON *c) {
  k->c = c;
  k->name = field(c, "name")->valuestring;
  char rel[256];
  snprintf(rel, sizeof rel, "tests/optim/%s", field(c, "model")->valuestring);
  k->f64 = strcmp(field(c, "model")->valuestring, "quad.gdl") == 0;
  k->tol = num(field(expected, "tolerance"), k->f64 ? "f64" : "f32");
  gradc_compile_options o;
  gradc_compile_options_init(&o);
  check_api(gradc_program_compile_file(tu_path(rel), &o, &k->p), rel);
}

static void set_optimizer(const Case *k, gradc_session *s) {
  const cJSON *j = field(k->c, "options");
  gradc_optimizer_options o;
  bool sgd = strcmp(field(j, "kind")->valuestring, "sgd") == 0;
  gradc_optimizer_options_init(&o, sgd ? GRADC_SGD : GRADC_ADAMW);
  o.lr = num(j, "lr");
  o.momentum = num(j, "momentum");
  o.dampening = num(j, "dampening");
  o.nesterov = (int)num(j, "nesterov");
  o.beta1 = num(j, "beta1");
  o.beta2 = num(j, "beta2");
  o.eps = num(j, "eps");
  o.weight_decay = num(j, "weight_decay");
  o.clip_norm = num(j, "clip_norm");
  o.warmup_steps = (int64_t)num(j, "warmup_steps");
  o.total_steps = (int64_t)num(j, "total_steps");
  o.min_lr = num(j, "min_lr");
  check_api(gradc_session_set_optimizer(s, &o), "gradc_session_set_optimizer");
}

/* Values as the session stores them: F64, or F32 for quad32. */
static void put(const Case *k, gradc_session *s, const char *name, const double *v, int n, bool input) {
  float f[8];
  for (int i = 0; i < n; i++) f[i] = (float)v[i];
  const void *data = k->f64 ? (const void *)v : (const void *)f;
  if (input)
    check_api(gradc_session_set_input(s, name, k->f64 ? GRADC_F64 : GRADC_F32, data, (size_t)n), name);
  else
    check_api(gradc_session_set_param(s, name, data, (size_t)n), name);
}

static void get_param(const Case *k, gradc_session *s, const char *name, double *v, int n) {
  float f[8];
  check_api(gradc_session_get_param(s, name, k->f64 ? (void *)v : (void *)f, (size_t)n), name);
  if (!k->f64)
    for (int i = 0; i < n; i++) v[i] = f[i];
}

static gradc_session *session_start(const Case *k) {
  gradc_session *s;
  check_api(gradc_session_new(k->p, &s), "gradc_session_new");
  set_optimizer(k, s);
  const cJSON *init = field(k->c, "init");
  for (int i = 0; i < 2; i++) {
    double v[4];
    numbers(field(init, pnames[i]), v, sizes[i]);
    put(k, s, pnames[i], v, sizes[i], false);
  }
  return s;
}

/* Steps [from, to) of the case, each checked against torch. */
static void replay(const Case *k, gradc_session *s, int from, int to) {
  const cJSON *steps = field(k->c, "steps");
  for (int t = from; t < to; t++) {
    const cJSON *e = cJSON_GetArrayItem(steps, t);
    assert_int_equal(gradc_session_step_count(s), t);
    expect_close(k->name, t + 1, "lr", gradc_session_lr(s), num(e, "lr"), 1e-12);
    for (int i = 0; i < 2; i++) {
      double g[4];
      numbers(field(e, inames[i]), g, sizes[i]);
      put(k, s, inames[i], g, sizes[i], true);
    }
    check_api(gradc_session_run(s), "gradc_session_run");
    double losses[2];
    numbers(field(e, "losses"), losses, 2);
    expect_close(k->name, t + 1, "loss lin", gradc_session_loss(s, 0), losses[0], k->tol);
    expect_close(k->name, t + 1, "loss quad", gradc_session_loss(s, 1), losses[1], k->tol);
    expect_close(k->name, t + 1, "grad_norm", gradc_session_grad_norm(s), num(e, "grad_norm"), k->tol);
    check_api(gradc_session_step(s), "gradc_session_step");
    for (int i = 0; i < 2; i++) {
      double want[4], got[4];
      numbers(field(e, pnames[i]), want, sizes[i]);
      get_param(k, s, pnames[i], got, sizes[i]);
      for (int j = 0; j < sizes[i]; j++) {
        char what[32];
        snprintf(what, sizeof what, "%s[%d]", pnames[i], j);
        expect_close(k->name, t + 1, what, got[j], want[j], k->tol);
      }
    }
  }
  assert_int_equal(gradc_session_step_count(s), to);
}

static void test_optim_matches_torch(void **state) {
  Case k;
  case_open(&k, *state);
  gradc_session *s = session_start(&k);
  replay(&k, s, 0, cJSON_GetArraySize(field(k.c, "steps")));
  gradc_session_free(s);
  gradc_program_free(k.p);
}

static const cJSON *find_case(const char *name) {
  for (const cJSON *c = field(expected, "cases")->child; c; c = c->next)
    if (strcmp(field(c, "name")->valuestring, name) == 0) return c;
  fail_msg("expected.json: no case '%s'", name);
  return NULL;
}

/* Half the steps, a checkpoint, a fresh session that loads it, the other
 * half: still torch's trajectory, and bit-identical to running straight. */
static void test_optim_checkpoint_resumes_exactly(void **state) {
  const char *names[] = {"adamw_clip_warmup_cosine", "sgd_warmup_cosine_min_lr", "adamw_f32"};
  for (int n = 0; n < 3; n++) {
    Case k;
    case_open(&k, find_case(names[n]));
    int total = cJSON_GetArraySize(field(k.c, "steps")), half = total / 2;
    gradc_session *straight = session_start(&k);
    replay(&k, straight, 0, total);

    char path[] = "/tmp/gradc_test_optim_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    gradc_session *a = session_start(&k);
    gradc_session_rng_seed(a, 7);
    replay(&k, a, 0, half);
    check_api(gradc_session_save_checkpoint(a, path), "gradc_session_save_checkpoint");
    uint64_t next = gradc_session_rng_next(a);

    gradc_session *b;
    check_api(gradc_session_new(k.p, &b), "gradc_session_new");
    set_optimizer(&k, b);
    check_api(gradc_session_load_checkpoint(b, path), "gradc_session_load_checkpoint");
    assert_int_equal(gradc_session_step_count(b), half);
    assert_true(gradc_session_rng_next(b) == next); /* the generator comes back too */
    replay(&k, b, half, total);
    for (int i = 0; i < 2; i++) {
      double x[4], y[4];
      get_param(&k, straight, pnames[i], x, sizes[i]);
      get_param(&k, b, pnames[i], y, sizes[i]);
      assert_memory_equal(x, y, sizeof(double) * (size_t)sizes[i]);
    }
    unlink(path);
    gradc_session_free(a);
    gradc_session_free(b);
    gradc_session_free(straight);
    gradc_program_free(k.p);
  }
}

int main(void) {
  char *text = tu_read("tests/optim/expected.json");
  expected = cJSON_Parse(text);
  free(text);
  if (!expected) {
    fprintf(stderr, "tests/optim/expected.json: not JSON\n");
    return 1;
  }
  const cJSON *cases = field(expected, "cases");
  int n = cJSON_GetArraySize(cases);
  struct CMUnitTest *tests = calloc((size_t)n + 1, sizeof *tests);
  char (*names)[96] = calloc((size_t)n, sizeof *names);
  int i = 0;
  for (const cJSON *c = cases->child; c; c = c->next, i++) {
    snprintf(names[i], sizeof names[i], "test_optim_matches_torch/%s", field(c, "name")->valuestring);
    tests[i] = (struct CMUnitTest)cmocka_unit_test_prestate(test_optim_matches_torch, (void *)c);
    tests[i].name = names[i];
  }
  tests[n] = (struct CMUnitTest)cmocka_unit_test(test_optim_checkpoint_resumes_exactly);
  int rc = _cmocka_run_group_tests("test_optim", tests, (size_t)n + 1, NULL, NULL);
  free(tests);
  free(names);
  cJSON_Delete(expected);
  return rc;
}
