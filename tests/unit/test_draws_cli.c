/* test_draws_cli.c - the random draws from the command line (DESIGN.md §2
 * Randomness): tests/models/draws.gdl's gradients are its draws, so they
 * must be the same bits for --gas 1, 2 and 4, for the cpu and ref targets,
 * and for --dp 2 over MPI (skipped without mpirun); --seed and --step
 * change them; dropout zeroes p of 10^6 elements within 4 standard
 * deviations; a train run resumed from a checkpoint draws what an
 * uninterrupted one does. */
#include "test_dp.h"

static char tmpdir[] = "/tmp/gradc-draws-XXXXXX";

/* Sample b of x: 1 on rows [2b, 2b + 2), 0 elsewhere (n windows of 4 samples). */
static void write_x(const char *path, int windows) {
  enum { B = 4, T = 8, C = 16 };
  int64_t shape[3] = {(int64_t)B * windows, T, C};
  float *x = calloc((size_t)(B * windows * T * C), sizeof(float));
  for (int w = 0; w < windows; w++)
    for (int b = 0; b < B; b++)
      for (int t = 2 * b; t < 2 * b + 2; t++)
        for (int c = 0; c < C; c++) x[(((size_t)(w * B + b) * T) + t) * C + c] = 1.0f;
  StFile f;
  st_init(&f);
  st_add(&f, "x", ST_F32, 3, shape, x);
  char err[512];
  if (!st_write(path, &f, err, sizeof err)) fail_msg("%s", err);
  st_free(&f);
  free(x);
}

static int setup(void **state) {
  (void)state;
  assert_non_null(mkdtemp(tmpdir));
  tu_gradc("init %s -o %s/p.st", tu_path("tests/models/draws.gdl"), tmpdir);
  char path[256];
  snprintf(path, sizeof path, "%s/x.st", tmpdir);
  write_x(path, 1);
  snprintf(path, sizeof path, "%s/data.st", tmpdir);
  write_x(path, 3);
  return 0;
}

static int teardown(void **state) {
  (void)state;
  tu_rm_rf(tmpdir);
  return 0;
}

/* The bytes of every tensor of two safetensors files are equal (or, with
 * differ, every tensor of the second differs from the first's somewhere). */
static void compare(const char *a, const char *b, bool differ) {
  StFile fa, fb;
  st_init(&fa);
  st_init(&fb);
  char err[512];
  if (!st_read(a, &fa, err, sizeof err) || !st_read(b, &fb, err, sizeof err)) fail_msg("%s", err);
  assert_int_equal(fa.n, fb.n);
  for (int i = 0; i < fa.n; i++) {
    const StTensor *t = st_find(&fb, fa.t[i].name);
    if (!t || t->nbytes != fa.t[i].nbytes) fail_msg("%s: tensor '%s' missing or resized in %s", a, fa.t[i].name, b);
    bool same = memcmp(t->data, fa.t[i].data, t->nbytes) == 0;
    if (same == differ) fail_msg("tensor '%s': %s and %s %s", t->name, a, b, differ ? "are equal" : "differ");
  }
  st_free(&fa);
  st_free(&fb);
}

static void run(const char *extra, const char *out) {
  tu_gradc("run %s --params %s/p.st --inputs %s/x.st --grads-out %s/%s %s", tu_path("tests/models/draws.gdl"), tmpdir,
           tmpdir, tmpdir, out, extra);
}

static void test_draws_same_for_every_gas_and_target(void **state) {
  (void)state;
  run("--seed 9 --step 4", "g1.st");
  run("--seed 9 --step 4 --gas 2", "g2.st");
  run("--seed 9 --step 4 --gas 4", "g4.st");
  run("--seed 9 --step 4 --gas 2 --target ref", "g2ref.st");
  char a[256], b[256];
  snprintf(a, sizeof a, "%s/g1.st", tmpdir);
  const char *others[] = {"g2.st", "g4.st", "g2ref.st"};
  for (int i = 0; i < 3; i++) {
    snprintf(b, sizeof b, "%s/%s", tmpdir, others[i]);
    compare(a, b, false);
  }
  /* Each of seed and step changes every draw. */
  run("--seed 10 --step 4", "s10.st");
  run("--seed 9 --step 5", "n5.st");
  snprintf(b, sizeof b, "%s/s10.st", tmpdir);
  compare(a, b, true);
  snprintf(b, sizeof b, "%s/n5.st", tmpdir);
  compare(a, b, true);
}

static void test_draws_same_over_two_ranks(void **state) {
  (void)state;
  if (!dp_have_mpirun()) return;
  char out[4096], err[16384];
  if (tu_sh_err(out, sizeof out, err, sizeof err,
                MPIRUN " -np 2 %s run %s --dp 2 --threads 1 --seed 9 --step 4 --params %s/p.st --inputs %s/x.st "
                       "--grads-out %s/dp2.st",
                GRADC_BINARY, tu_path("tests/models/draws.gdl"), tmpdir, tmpdir, tmpdir) != 0)
    fail_msg("two ranks: %s%s", out, err);
  run("--seed 9 --step 4 --gas 2", "dpref.st");
  char a[256], b[256];
  snprintf(a, sizeof a, "%s/dpref.st", tmpdir);
  snprintf(b, sizeof b, "%s/dp2.st", tmpdir);
  compare(a, b, false);
}

/* dropout(x, 0.3) of 10^6 ones on the interpreter: the zeros are 0.3 of
 * them within 4 sigma (sigma = sqrt(p (1 - p) / n) = 4.6e-4), the rest 1/(1-p). */
static void test_draws_dropout_zero_fraction(void **state) {
  (void)state;
  const char *src = "model zf {\n  batch B = 1000\n  dim C = 1000\n  input x : f32[B, C]\n"
                    "  loss l = sum(dropout(x, 0.3))\n}\n";
  Diag d;
  FeModel *m = tu_compile("zf.gdl", src, 1, &d);
  if (!m) fail_msg("%s", sb_str(&d.log));
  diag_free(&d);
  IrFunc *f = m->func;
  int64_t n = 1000 * 1000;
  double *x = malloc(sizeof(double) * (size_t)n);
  for (int64_t i = 0; i < n; i++) x[i] = 1;
  double *args[1] = {x};
  InterpState st = {.rng = {77, 0, 0, 0}};
  char err[512];
  if (!interp_run(&st, f, args, NULL, INTERP_STEP, NULL, err, sizeof err)) fail_msg("%s", err);
  const IrValue *y = NULL;
  for (int i = 0; i < f->nops; i++)
    if (f->ops[i]->opcode == IR_OP_MUL) y = f->ops[i]->result;
  assert_non_null(y);
  int64_t zeros = 0;
  float keep = (float)(1 / 0.7);
  for (int64_t i = 0; i < n; i++) {
    double v = st.val[y->id][i];
    if (v == 0) zeros++;
    else if (v != keep) fail_msg("element %lld is %.9g, neither 0 nor 1/(1-p)", (long long)i, v);
  }
  double frac = (double)zeros / (double)n, sigma = sqrt(0.3 * 0.7 / (double)n);
  printf("dropout(p=0.3): %.5f of 10^6 zeroed (sigma %.2g)\n", frac, sigma);
  assert_true(fabs(frac - 0.3) < 4 * sigma);
  interp_free(&st);
  free(x);
  fe_model_free(m);
}

/* Four SGD steps, against two, a checkpoint and two more. */
static void test_draws_resumed_train_draws_the_same(void **state) {
  (void)state;
  const char *model = tu_path("tests/models/draws.gdl");
  char common[1024];
  snprintf(common, sizeof common, "--data %s/data.st --steps 4 --optimizer sgd --lr 0.1 --seed 3", tmpdir);
  tu_gradc("train %s %s --params-out %s/whole.st", model, common, tmpdir);
  model = tu_path("tests/models/draws.gdl");
  tu_gradc("train %s %s --stop-after 2 --checkpoint %s/c.st", model, common, tmpdir);
  model = tu_path("tests/models/draws.gdl");
  tu_gradc("train %s %s --resume %s/c.st --params-out %s/resumed.st", model, common, tmpdir, tmpdir);
  char a[256], b[256];
  snprintf(a, sizeof a, "%s/whole.st", tmpdir);
  snprintf(b, sizeof b, "%s/resumed.st", tmpdir);
  compare(a, b, false);
}

/* The C API: a session draws with its seed at its step; set_draws moves
 * both; an optimiser step moves the step; a checkpoint keeps them. */
static void session_grad(gradc_session *s, float *du) {
  assert_int_equal(gradc_session_run(s), GRADC_OK);
  assert_int_equal(gradc_session_get_grad(s, "u", du, 8 * 16), GRADC_OK);
}

static void test_draws_session_api(void **state) {
  (void)state;
  gradc_compile_options o;
  gradc_compile_options_init(&o);
  o.gas = 2;
  gradc_program *p;
  assert_int_equal(gradc_program_compile_file(tu_path("tests/models/draws.gdl"), &o, &p), GRADC_OK);
  gradc_session *s, *t;
  assert_int_equal(gradc_session_new(p, &s), GRADC_OK);
  assert_int_equal(gradc_session_init_params(s, 0), GRADC_OK);
  float x[4 * 8 * 16] = {0}, a[128], b[128], c[128];
  for (int i = 0; i < 4 * 8 * 16; i++) x[i] = (i / 16) % 8 / 2 == i / (8 * 16) ? 1.0f : 0.0f;
  assert_int_equal(gradc_session_set_input(s, "x", GRADC_F32, x, 4 * 8 * 16), GRADC_OK);
  gradc_session_set_draws(s, 9, 4);
  session_grad(s, a);
  session_grad(s, b);
  assert_memory_equal(a, b, sizeof a); /* the same window draws the same */
  /* The command line's run --seed 9 --step 4 drew these too: du is u itself. */
  char path[256];
  snprintf(path, sizeof path, "%s/g1.st", tmpdir);
  StFile g;
  st_init(&g);
  char err[512];
  if (!st_read(path, &g, err, sizeof err)) fail_msg("%s", err);
  assert_memory_equal(st_find(&g, "u")->data, a, sizeof a);
  st_free(&g);
  gradc_optimizer_options opt;
  gradc_optimizer_options_init(&opt, GRADC_SGD);
  opt.lr = 0; /* the params stay; only the step count moves */
  assert_int_equal(gradc_session_set_optimizer(s, &opt), GRADC_OK);
  assert_int_equal(gradc_session_step(s), GRADC_OK);
  session_grad(s, c);
  assert_memory_not_equal(a, c, sizeof a); /* step 5 */
  snprintf(path, sizeof path, "%s/api.ckpt", tmpdir);
  assert_int_equal(gradc_session_save_checkpoint(s, path), GRADC_OK);
  assert_int_equal(gradc_session_new(p, &t), GRADC_OK);
  assert_int_equal(gradc_session_load_checkpoint(t, path), GRADC_OK);
  assert_int_equal(gradc_session_set_input(t, "x", GRADC_F32, x, 4 * 8 * 16), GRADC_OK);
  session_grad(t, b);
  assert_memory_equal(b, c, sizeof b); /* seed 9 at step 5, from the checkpoint */
  gradc_session_free(t);
  gradc_session_free(s);
  gradc_program_free(p);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_draws_same_for_every_gas_and_target),
      cmocka_unit_test(test_draws_same_over_two_ranks),
      cmocka_unit_test(test_draws_dropout_zero_fraction),
      cmocka_unit_test(test_draws_resumed_train_draws_the_same),
      cmocka_unit_test(test_draws_session_api),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
