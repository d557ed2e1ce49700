/* test_faults.c - training that survives faults, through the command line
 * (GRADC_BINARY) and the C API:
 *   - `gradc train --checkpoint-every 1` killed with SIGKILL at random
 *     points, hundreds of times: every time the checkpoint loads as
 *     --resume loads it, holds the step just written or the one before,
 *     the resumed steps log the losses of an uninterrupted run bit for
 *     bit, and the temporaries of the dead writers are gone once a run
 *     finishes;
 *   - non-finite values: a checkpoint never holds one (SGD with momentum
 *     1e30 keeps the last good checkpoint, equal to an independent run's
 *     at that step), a NaN loss stops naming the step and the term and
 *     writes the last good state, --nan-policy skip leaves the params of a
 *     skipped step untouched, and --max-loss warns;
 *   - sizes: params, inputs and arenas that cannot fit in any machine's
 *     memory are errors naming them and their byte count (exit 1, not an
 *     abort), and inputs that are not regular files (/dev/zero, a fifo, a
 *     directory) are refused at once instead of read without end;
 *   - outputs: one that exists and is not a regular file (a fifo, a device
 *     node, a directory) is refused by every writer, a symlink is written
 *     through (the link stays, its target gets the contents), an output
 *     that is an input's file (through links) is refused, and one that
 *     cannot be written is an error before the first step;
 *   - SIGHUP ends `train` after the current step, with its checkpoint, as
 *     SIGINT and SIGTERM do;
 *   - messages name files: a params or inputs file that does not fit the
 *     model, and a target out of range by its sample in the dataset;
 *   - malformed files (tests/fuzz/malformed: bad safetensors headers,
 *     artifacts and checkpoints, some behind a valid checksum; and every
 *     truncation and byte flip of an artifact) are errors, exit 1, never a
 *     crash. */
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "gradc.h"
#include "runtime/runtime.h"
#include "testutil.h"

/* A small MLP: one step takes far less time than its checkpoint. */
static const char *model_text =
    "model tiny {\n"
    "  batch B = 4\n"
    "  dim D = 6\n"
    "  dim H = 8\n"
    "  input x : f32[B, D]\n"
    "  input y : i32[B]\n"
    "  param W1 : f32[D, H] init normal(0, 0.5)\n"
    "  param b1 : f32[H]\n"
    "  param W2 : f32[H, 3] init normal(0, 0.5)\n"
    "  loss ce = cross_entropy(relu(x @ W1 + b1) @ W2, y)\n"
    "}\n";

static char dir[64];

static const char *in_dir(const char *name) {
  static char buf[4][256];
  static int k;
  char *b = buf[k++ % 4];
  snprintf(b, sizeof buf[0], "%s/%s", dir, name);
  return b;
}

static void write_text(const char *name, const char *text) {
  FILE *f = fopen(in_dir(name), "wb");
  assert_non_null(f);
  assert_int_equal(fwrite(text, 1, strlen(text), f), strlen(text));
  assert_int_equal(fclose(f), 0);
}

static char *read_text(const char *name) {
  const char *err;
  char *s = read_file(in_dir(name), NULL, &err);
  if (!s) fail_msg("%s: %s", in_dir(name), err);
  return s;
}

/* gradc in the scratch directory: the exit status; stderr in *err (malloc'd). */
static int gradc(const char *args, char **err) {
  char cmd[4096];
  snprintf(cmd, sizeof cmd, "cd %s && '%s' %s >stdout.txt 2>stderr.txt", dir, GRADC_BINARY, args);
  int st = system(cmd);
  char *e = read_text("stderr.txt");
  if (err)
    *err = e;
  else
    free(e);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void gradc_ok(const char *args) {
  char *err;
  int rc = gradc(args, &err);
  if (rc != 0) fail_msg("gradc %s: exit %d\n%s", args, rc, err);
  free(err);
}

static int setup(void **state) {
  (void)state;
  strcpy(dir, "/tmp/gradc_test_faults_XXXXXX");
  if (!mkdtemp(dir)) return -1;
  write_text("tiny.gdl", model_text);
  gradc_ok("data random tiny.gdl -D B=64 -o data.safetensors");
  return 0;
}

static int teardown(void **state) {
  (void)state;
  tu_rm_rf(dir);
  return 0;
}

/* Files of the scratch directory whose name holds ".tmp.". */
static int count_temps(void) {
  DIR *d = opendir(dir);
  assert_non_null(d);
  int n = 0;
  for (struct dirent *e; (e = readdir(d));) n += strstr(e->d_name, ".tmp.") != NULL;
  closedir(d);
  return n;
}

/* The complete rows of a CSV log (lines ending in a newline, the header
 * skipped) without their last field (elapsed_s differs between runs),
 * indexed by step: rows[step] (malloc'd) for steps up to max. */
static int64_t log_rows(const char *text, char **rows, int64_t max) {
  int64_t last = -1;
  for (const char *line = text; *line;) {
    const char *nl = strchr(line, '\n');
    if (!nl) break; /* a row cut by the kill */
    if (strncmp(line, "step,", 5) != 0) {
      char *end;
      long long step = strtoll(line, &end, 10);
      if (end == line || *end != ',' || step < 1 || step > max) fail_msg("bad log row: %.*s", (int)(nl - line), line);
      const char *comma = nl;
      while (comma > line && *comma != ',') comma--;
      free(rows[step]);
      rows[step] = strndup(line, (size_t)(comma - line));
      last = step;
    }
    line = nl + 1;
  }
  return last;
}

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

static void sleep_ms(double ms) {
  struct timespec ts = {(time_t)(ms / 1e3), (long)((ms - (double)(time_t)(ms / 1e3) * 1e3) * 1e6)};
  nanosleep(&ts, NULL);
}

/* Start `gradc train ARGS` in the scratch directory (stdout and stderr to
 * files there); its pid. */
static pid_t spawn_train(const char *const *args, int nargs) {
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    if (chdir(dir) != 0) _exit(126);
    if (!freopen("/dev/null", "w", stdout) || !freopen("killed.stderr", "w", stderr)) _exit(126);
    const char *argv[32];
    int n = 0;
    argv[n++] = GRADC_BINARY;
    argv[n++] = "train";
    for (int i = 0; i < nargs; i++) argv[n++] = args[i];
    argv[n] = NULL;
    execv(GRADC_BINARY, (char *const *)argv);
    _exit(127);
  }
  return pid;
}

enum { KILLS = 200, NSTEPS = 4000 };

/* The checkpoint's step, loaded as --resume loads it (the C API, then the
 * data order gradc train adds); fails the test if it does not load. */
static int64_t checkpoint_step(gradc_program *p, const char *path, int kill_no) {
  gradc_session *s;
  assert_int_equal(gradc_session_new(p, &s), GRADC_OK);
  if (gradc_session_load_checkpoint(s, path) != GRADC_OK)
    fail_msg("after kill %d: the checkpoint does not load: %s", kill_no, gradc_last_error());
  int64_t step = gradc_session_step_count(s);
  gradc_session_free(s);
  StFile f;
  char err[1024];
  if (!st_read(path, &f, err, sizeof err)) fail_msg("after kill %d: %s", kill_no, err);
  bool keyed = st_get_meta(&f, "train.epoch_key") && st_get_meta(&f, "train.samples");
  st_free(&f);
  if (!keyed) fail_msg("after kill %d: the checkpoint has no data order (train.epoch_key)", kill_no);
  return step;
}

#define TRAIN_ARGS "tiny.gdl", "--data", "data.safetensors", "--steps", "4000", "--print-every", "100000"

static void test_checkpoint_survives_kill_9(void **state) {
  (void)state;
  char buf[256];
  /* The uninterrupted run every resumed step is compared with. */
  snprintf(buf, sizeof buf, "train tiny.gdl --data data.safetensors --steps %d --log ref.csv", NSTEPS);
  gradc_ok(buf);
  char **ref = calloc(NSTEPS + 1, sizeof *ref), **got = calloc(NSTEPS + 1, sizeof *got);
  char *text = read_text("ref.csv");
  assert_int_equal(log_rows(text, ref, NSTEPS), NSTEPS);
  free(text);
  /* The chain starts from a checkpoint at step 1 (kept to restart it). */
  gradc_ok("train tiny.gdl --data data.safetensors --steps 4000 --stop-after 1 --checkpoint first.safetensors");
  snprintf(buf, sizeof buf, "cp %s %s", in_dir("first.safetensors"), in_dir("ck.safetensors"));
  assert_int_equal(system(buf), 0);

  gradc_compile_options o;
  gradc_compile_options_init(&o);
  gradc_program *p;
  assert_int_equal(gradc_program_compile_file(in_dir("tiny.gdl"), &o, &p), GRADC_OK);

  /* Each stage of a write pauses 1 ms, so that kills land inside writes
   * whatever fsync costs on this file system. */
  setenv("GRADC_TEST_WRITE_PAUSE_US", "1000", 1);
  const char *args[] = {TRAIN_ARGS, "--resume", "ck.safetensors", "--checkpoint", "ck.safetensors",
                        "--checkpoint-every", "1", "--log", "log.csv"};
  unsigned seed = (unsigned)time(NULL);
  srand(seed);
  int64_t step = 1, compared = 0;
  int in_write = 0, finished = 0, restarts = 0;
  double t0 = now_ms();
  for (int k = 1; k <= KILLS; k++) {
    unlink(in_dir("log.csv"));
    for (int i = 0; i <= NSTEPS; i++) {
      free(got[i]);
      got[i] = NULL;
    }
    pid_t pid = spawn_train(args, (int)(sizeof args / sizeof *args));
    /* Wait for the run to reach its steps (the log is opened after the
     * checkpoint was loaded), then kill it 0-40 ms later. */
    struct stat sb;
    int status = 0;
    bool exited = false;
    for (double t = now_ms(); stat(in_dir("log.csv"), &sb) != 0 && now_ms() - t < 20000;) {
      if (waitpid(pid, &status, WNOHANG) == pid) {
        exited = true;
        break;
      }
      sleep_ms(0.5);
    }
    if (!exited) {
      sleep_ms(40.0 * rand() / RAND_MAX);
      kill(pid, SIGKILL);
      assert_int_equal(waitpid(pid, &status, 0), pid);
    }
    if (WIFEXITED(status)) {
      char *err = read_text("killed.stderr");
      if (WEXITSTATUS(status) != 0) fail_msg("run %d ended by itself with exit %d:\n%s", k, WEXITSTATUS(status), err);
      free(err);
      finished++;
    }
    in_write += count_temps() > 0;

    int64_t ck = checkpoint_step(p, in_dir("ck.safetensors"), k);
    /* The steps this run logged: the uninterrupted run's, bit for bit. */
    text = read_text("log.csv");
    int64_t last = log_rows(text, got, NSTEPS);
    free(text);
    for (int64_t s = step + 1; s <= last; s++) {
      if (!got[s] || strcmp(got[s], ref[s]) != 0)
        fail_msg("kill %d (seed %u): step %lld logged\n  %s\nbut the uninterrupted run logged\n  %s", k, seed,
                 (long long)s, got[s] ? got[s] : "(nothing)", ref[s]);
      compared++;
    }
    /* The checkpoint holds the last logged step, or the one before when
     * the kill came inside its write; never an older one. */
    if (last < 0) last = step;
    if (ck < step || ck < last - 1 || ck > last)
      fail_msg("kill %d (seed %u): the run resumed at step %lld and logged up to %lld, but the checkpoint holds "
               "step %lld",
               k, seed, (long long)step, (long long)last, (long long)ck);
    step = ck;
    if (step > NSTEPS - 100) { /* near the end: start the chain again */
      snprintf(buf, sizeof buf, "cp %s %s", in_dir("first.safetensors"), in_dir("ck.safetensors"));
      assert_int_equal(system(buf), 0);
      step = 1;
      restarts++;
    }
  }
  unsetenv("GRADC_TEST_WRITE_PAUSE_US");
  double took = now_ms() - t0;

  /* A run to the end: its steps match too, and no temporary is left. */
  snprintf(buf, sizeof buf,
           "train tiny.gdl --data data.safetensors --steps %lld --resume ck.safetensors --checkpoint ck.safetensors "
           "--checkpoint-every 1 --log final.csv",
           (long long)step + 10);
  gradc_ok(buf);
  text = read_text("final.csv");
  assert_int_equal(log_rows(text, got, NSTEPS), step + 10);
  free(text);
  for (int64_t s = step + 1; s <= step + 10; s++) assert_string_equal(got[s], ref[s]);
  assert_int_equal(count_temps(), 0);
  assert_int_equal(checkpoint_step(p, in_dir("ck.safetensors"), KILLS + 1), step + 10);

  fprintf(stderr,
          "kill -9: %d kills in %.1f s (seed %u), %d inside a checkpoint write (a temporary left), %d runs finished "
          "first, %d restarts; 0 checkpoints lost, %lld resumed steps identical to the uninterrupted run\n",
          KILLS, took / 1e3, seed, in_write, finished, restarts, (long long)compared);
  for (int i = 0; i <= NSTEPS; i++) {
    free(ref[i]);
    free(got[i]);
  }
  free(ref);
  free(got);
  gradc_program_free(p);
}

/* remove_stale_temps removes a dead writer's temporary, keeps a live
 * one's (this process's parent, and this process's own) and other files. */
static void test_stale_temps_of_dead_writers_only(void **state) {
  (void)state;
  pid_t child = fork();
  assert_true(child >= 0);
  if (child == 0) _exit(0);
  assert_int_equal(waitpid(child, NULL, 0), child); /* reaped: no such process now */
  char dead[128], parent[128], self[128];
  snprintf(dead, sizeof dead, "out.safetensors.tmp.%ld.Ab3xYz", (long)child);
  snprintf(parent, sizeof parent, "out.safetensors.tmp.%ld.Ab3xYz", (long)getppid());
  snprintf(self, sizeof self, "out.safetensors.tmp.%ld.Ab3xYz", (long)getpid());
  const char *keep[] = {parent, self, "out.safetensors", "other.safetensors.tmp.1.Ab3xYz", "out.safetensors.tmp.x"};
  write_text(dead, "partial");
  for (size_t i = 0; i < sizeof keep / sizeof *keep; i++) write_text(keep[i], "keep");
  assert_int_equal(remove_stale_temps(in_dir("out.safetensors"), NULL, NULL), 1);
  struct stat sb;
  assert_int_not_equal(stat(in_dir(dead), &sb), 0);
  for (size_t i = 0; i < sizeof keep / sizeof *keep; i++) {
    assert_int_equal(stat(in_dir(keep[i]), &sb), 0);
    unlink(in_dir(keep[i]));
  }
}


/* ---- non-finite values ---- */

/* tanh saturates, so the loss stays finite while SGD's momentum buffer
 * grows by 1e30 a step: buf1 = g1, buf2 = 1e30 g1 + g2 (finite in f32),
 * buf3 ~ 1e60 = inf.  Step 3's update is the first to make state inf. */
static const char *saturating_model =
    "model sat {\n"
    "  batch B = 4\n"
    "  dim D = 6\n"
    "  input x : f32[B, D]\n"
    "  param w : f32[D] init normal(0, 0.5)\n"
    "  loss t = mean(tanh(x * w))\n"
    "}\n";

/* log(x + 2.8) is NaN for the rare x below -2.8: some windows only. */
static const char *nan_model =
    "model nanny {\n"
    "  batch B = 4\n"
    "  dim D = 6\n"
    "  input x : f32[B, D]\n"
    "  param w : f32[D] init normal(0, 0.5)\n"
    "  loss fit = mean((x * w - 1) * (x * w - 1))\n"
    "  loss odd = 1e-3 * mean(log(x + 2.8))\n"
    "}\n";

/* Every F32 value of a safetensors file is finite; its step. */
static int64_t finite_checkpoint(const char *name) {
  StFile f;
  char err[1024];
  if (!st_read(in_dir(name), &f, err, sizeof err)) fail_msg("%s", err);
  for (int i = 0; i < f.n; i++) {
    assert_int_equal(f.t[i].dtype, ST_F32);
    const float *x = f.t[i].data;
    for (int64_t k = 0; k < st_numel(&f.t[i]); k++)
      if (!isfinite(x[k])) fail_msg("%s: tensor '%s' element %lld is %g", name, f.t[i].name, (long long)k, x[k]);
  }
  const char *step = st_get_meta(&f, "step");
  assert_non_null(step);
  int64_t n = strtoll(step, NULL, 10);
  st_free(&f);
  return n;
}

/* The tensors of two safetensors files are the same, bit for bit. */
static void same_tensors(const char *a, const char *b) {
  StFile fa, fb;
  char err[1024];
  if (!st_read(in_dir(a), &fa, err, sizeof err) || !st_read(in_dir(b), &fb, err, sizeof err)) fail_msg("%s", err);
  assert_int_equal(fa.n, fb.n);
  for (int i = 0; i < fa.n; i++) {
    const StTensor *t = st_find(&fb, fa.t[i].name);
    if (!t) fail_msg("%s has tensor '%s', %s has not", a, fa.t[i].name, b);
    assert_int_equal(t->nbytes, fa.t[i].nbytes);
    if (memcmp(t->data, fa.t[i].data, t->nbytes) != 0) fail_msg("tensor '%s' differs between %s and %s", t->name, a, b);
  }
  st_free(&fa);
  st_free(&fb);
}

#define SGD_1E30 "--optimizer sgd --momentum 1e30 --lr 1e-3 --steps 20 "

static void test_nonfinite_update_keeps_the_last_good_checkpoint(void **state) {
  (void)state;
  write_text("sat.gdl", saturating_model);
  gradc_ok("data random sat.gdl -D B=64 -o sat.safetensors");
  char *err;
  assert_int_equal(gradc("train sat.gdl --data sat.safetensors " SGD_1E30 "--checkpoint bad.safetensors "
                         "--checkpoint-every 1", &err), 1);
  if (!strstr(err, "gradc: error: step 3: after the update, ") || !strstr(err, "is not finite") ||
      !strstr(err, "bad.safetensors keeps step 2, the last good state"))
    fail_msg("unexpected diagnostics:\n%s", err);
  free(err);
  assert_int_equal(finite_checkpoint("bad.safetensors"), 2);
  /* The same as an uninterrupted run's checkpoint at step 2. */
  gradc_ok("train sat.gdl --data sat.safetensors " SGD_1E30 "--stop-after 2 --checkpoint two.safetensors");
  same_tensors("bad.safetensors", "two.safetensors");
}

/* A session of the model in the scratch directory's file `model`, its
 * params initialised (seed 3); its program in *p. */
static gradc_session *new_session(const char *model, gradc_program **p) {
  gradc_compile_options o;
  gradc_compile_options_init(&o);
  gradc_session *s;
  assert_int_equal(gradc_program_compile_file(in_dir(model), &o, p), GRADC_OK);
  assert_int_equal(gradc_session_new(*p, &s), GRADC_OK);
  assert_int_equal(gradc_session_init_params(s, 3), GRADC_OK);
  return s;
}

/* The C API refuses to write a non-finite state and leaves the file alone. */
static void test_checkpoint_refuses_nonfinite_params(void **state) {
  (void)state;
  gradc_program *p;
  gradc_session *s = new_session("tiny.gdl", &p);
  char what[256];
  assert_int_equal(gradc_session_find_nonfinite(s, what, sizeof what), 0);
  assert_int_equal(gradc_session_save_checkpoint(s, in_dir("api.safetensors")), GRADC_OK);
  char *before = read_text("api.safetensors");

  StFile f;
  char err[1024];
  assert_true(st_read(in_dir("api.safetensors"), &f, err, sizeof err));
  StFile params;
  st_init(&params);
  for (int i = 0; i < f.n; i++) {
    StTensor *t = st_add(&params, f.t[i].name, f.t[i].dtype, f.t[i].rank, f.t[i].shape, f.t[i].data);
    if (strcmp(t->name, "W2") == 0) ((float *)t->data)[5] = -INFINITY;
  }
  assert_true(st_write(in_dir("inf.safetensors"), &params, err, sizeof err));
  st_free(&params);
  st_free(&f);
  assert_int_equal(gradc_session_load_params(s, in_dir("inf.safetensors")), GRADC_OK);
  assert_int_equal(gradc_session_find_nonfinite(s, what, sizeof what), 1);
  assert_string_equal(what, "param 'W2' (-inf at element 5)");
  assert_int_equal(gradc_session_save_checkpoint(s, in_dir("api.safetensors")), GRADC_ERR_USER);
  if (!strstr(gradc_last_error(), "api.safetensors: not written: tensor 'W2' is not finite (-inf at element 5)"))
    fail_msg("%s", gradc_last_error());
  char *after = read_text("api.safetensors");
  assert_string_equal(before, after); /* the file keeps its earlier contents */
  free(before);
  free(after);
  assert_int_equal(count_temps(), 0);
  gradc_session_free(s);
  gradc_program_free(p);
}

/* The check after an update finds the first inf or NaN wherever it lies:
 * in a block it reads whole (params of 200 f32 and 150 f64 elements, in
 * blocks of 64), the first of several, and in the elements after the last
 * whole block. */
static void test_nonfinite_search_finds_the_first(void **state) {
  (void)state;
  write_text("wide.gdl", "model wide {\n"
                         "  batch B = 2\n"
                         "  input x : f32[B, 200]\n"
                         "  param w : f32[200] init normal(0, 0.5)\n"
                         "  param v : f64[150] init normal(0, 0.5)\n"
                         "  loss l = sum(x * w)\n"
                         "  loss m = sum(v * v)\n"
                         "}\n");
  gradc_program *p;
  gradc_session *s = new_session("wide.gdl", &p);
  assert_int_equal(gradc_session_save_checkpoint(s, in_dir("wide.safetensors")), GRADC_OK);
  StFile f;
  char err[1024];
  assert_true(st_read(in_dir("wide.safetensors"), &f, err, sizeof err));
  struct {
    const char *param;
    int64_t at[2]; /* elements set non-finite (-1: none) */
    const char *want;
  } cases[] = {
      {"w", {130, 190}, "param 'w' (nan at element 130)"}, {"w", {3, 70}, "param 'w' (nan at element 3)"},
      {"w", {199, -1}, "param 'w' (nan at element 199)"},  {"v", {64, 100}, "param 'v' (nan at element 64)"},
      {"v", {149, -1}, "param 'v' (nan at element 149)"},
  };
  for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
    StFile params;
    st_init(&params);
    for (int i = 0; i < f.n; i++) {
      StTensor *t = st_add(&params, f.t[i].name, f.t[i].dtype, f.t[i].rank, f.t[i].shape, f.t[i].data);
      if (strcmp(t->name, cases[c].param) != 0) continue;
      for (int k = 0; k < 2 && cases[c].at[k] >= 0; k++) {
        if (t->dtype == ST_F32) ((float *)t->data)[cases[c].at[k]] = k ? INFINITY : NAN;
        else ((double *)t->data)[cases[c].at[k]] = k ? INFINITY : NAN;
      }
    }
    assert_true(st_write(in_dir("bad.safetensors"), &params, err, sizeof err));
    st_free(&params);
    assert_int_equal(gradc_session_load_params(s, in_dir("bad.safetensors")), GRADC_OK);
    char what[256];
    assert_int_equal(gradc_session_find_nonfinite(s, what, sizeof what), 1);
    assert_string_equal(what, cases[c].want);
  }
  assert_int_equal(gradc_session_load_params(s, in_dir("wide.safetensors")), GRADC_OK);
  char what[256];
  assert_int_equal(gradc_session_find_nonfinite(s, what, sizeof what), 0);
  st_free(&f);
  gradc_session_free(s);
  gradc_program_free(p);
}

/* The step number in "step N: loss 'odd' is nan", or -1. */
static int64_t nan_step(const char *err) {
  const char *at = strstr(err, ": loss 'odd' is nan");
  if (!at) return -1;
  const char *p = at;
  while (p > err && p[-1] >= '0' && p[-1] <= '9') p--;
  if (p - err < 5 || strncmp(p - 5, "step ", 5) != 0) return -1;
  return strtoll(p, NULL, 10);
}

#define NAN_TRAIN "train nanny.gdl --data nanny.safetensors --steps 60 "

static void test_nan_loss_stops_or_skips(void **state) {
  (void)state;
  write_text("nanny.gdl", nan_model);
  gradc_ok("data random nanny.gdl -D B=64 -o nanny.safetensors");
  /* stop (the default): the error names the step and the term, the
   * checkpoint gets the state before it, as an uninterrupted run to that
   * step writes it. */
  char *err, buf[512];
  assert_int_equal(gradc(NAN_TRAIN "--checkpoint stop.safetensors", &err), 1);
  int64_t first = nan_step(err);
  if (first < 2 || !strstr(err, "gradc: error: step ") || !strstr(err, "stopping without taking the step"))
    fail_msg("unexpected diagnostics:\n%s", err);
  snprintf(buf, sizeof buf, "checkpoint (step %lld, the last good state): stop.safetensors", (long long)first - 1);
  if (!strstr(err, buf)) fail_msg("no '%s' in:\n%s", buf, err);
  free(err);
  assert_int_equal(finite_checkpoint("stop.safetensors"), first - 1);
  snprintf(buf, sizeof buf, NAN_TRAIN "--stop-after %lld --checkpoint before.safetensors", (long long)first - 1);
  gradc_ok(buf);
  same_tensors("stop.safetensors", "before.safetensors");
  /* Without --checkpoint the stop says why there is none. */
  assert_int_equal(gradc(NAN_TRAIN, &err), 1);
  if (!strstr(err, "no checkpoint: --checkpoint was not given")) fail_msg("%s", err);
  free(err);

  /* skip: the same first NaN step; the run goes on to the end, each NaN
   * step counted, and a skipped step leaves params and state as they were. */
  assert_int_equal(gradc(NAN_TRAIN "--nan-policy skip --log skip.csv --checkpoint skip.safetensors", &err), 0);
  assert_int_equal(nan_step(err), first);
  char *log = read_text("skip.csv");
  char **rows = calloc(61, sizeof *rows);
  assert_int_equal(log_rows(log, rows, 60), 60);
  int nan_rows = 0;
  for (int i = 1; i <= 60; i++) nan_rows += strstr(rows[i], "nan") != NULL;
  assert_non_null(strstr(rows[first], "nan"));
  snprintf(buf, sizeof buf, "; %d skipped (non-finite, --nan-policy skip)", nan_rows);
  if (nan_rows < 2 || !strstr(err, buf)) fail_msg("%d NaN rows in the log; no '%s' in:\n%s", nan_rows, buf, err);
  for (int i = 0; i <= 60; i++) free(rows[i]);
  free(rows);
  free(log);
  free(err);
  assert_int_equal(finite_checkpoint("skip.safetensors"), 60);
  snprintf(buf, sizeof buf, NAN_TRAIN "--nan-policy skip --stop-after %lld --checkpoint at.safetensors",
           (long long)first);
  gradc_ok(buf);
  assert_int_equal(finite_checkpoint("at.safetensors"), first);
  same_tensors("at.safetensors", "before.safetensors");
}

static void test_max_loss_warns(void **state) {
  (void)state;
  char *err;
  assert_int_equal(gradc("train tiny.gdl --data data.safetensors --steps 3 --max-loss 0.5", &err), 0);
  if (!strstr(err, "gradc: warning: step 1: loss 'ce' is ") || !strstr(err, ", above --max-loss 0.5"))
    fail_msg("%s", err);
  free(err);
  assert_int_equal(gradc("train tiny.gdl --data data.safetensors --steps 3 --max-loss 100", &err), 0);
  assert_null(strstr(err, "--max-loss"));
  free(err);
  assert_int_equal(gradc("train tiny.gdl --data data.safetensors --nan-policy maybe", &err), 1);
  assert_non_null(strstr(err, "gradc: error: --nan-policy expects stop or skip, got 'maybe'"));
  free(err);
}

/* sqrt(w*w*x*x) at w = 0: the loss is 0, its gradient 0/0 = NaN, so the
 * window is caught by its gradient norm before the update. */
static const char *nan_grad_model =
    "model nangrad {\n"
    "  batch B = 4\n"
    "  dim D = 6\n"
    "  input x : f32[B, D]\n"
    "  param w : f32[D]\n"
    "  loss l = mean(sqrt(x * x * w * w))\n"
    "}\n";

static void test_nan_gradient_stops_before_the_update(void **state) {
  (void)state;
  write_text("nangrad.gdl", nan_grad_model);
  gradc_ok("data random nangrad.gdl -D B=64 -o nangrad.safetensors");
  char *err;
  assert_int_equal(gradc("train nangrad.gdl --data nangrad.safetensors --steps 5 --checkpoint g.safetensors", &err), 1);
  if (!strstr(err, "gradc: error: step 1: the gradient norm is nan (loss 0); stopping without taking the step") ||
      !strstr(err, "checkpoint (step 0, the last good state): g.safetensors"))
    fail_msg("unexpected diagnostics:\n%s", err);
  free(err);
  assert_int_equal(finite_checkpoint("g.safetensors"), 0);
}

/* ---- sizes ---- */

/* "gradc: error: ..." on stderr, exit 1, within a few seconds. */
static void fails_with(const char *args, const char *want) {
  char *err;
  char cmd[1024];
  snprintf(cmd, sizeof cmd, "%s", args);
  double t = now_ms();
  int rc = gradc(cmd, &err);
  if (rc != 1 || !strstr(err, want)) fail_msg("gradc %s: exit %d, wanted 1 and '%s' in:\n%s", args, rc, want, err);
  if (now_ms() - t > 20000) fail_msg("gradc %s took %.0f ms", args, now_ms() - t);
  free(err);
}

/* 6.27 TB (2e9 * 784 * 4 bytes) is more than any machine this runs on. */
static void test_sizes_are_checked_before_allocating(void **state) {
  (void)state;
  char mlp[512], args[1024];
  snprintf(mlp, sizeof mlp, "'%s'", tu_path("examples/mlp.gdl"));
  snprintf(args, sizeof args, "data random %s -D B=2000000000 -o big.safetensors", mlp);
  fails_with(args, "gradc: error: data random: input 'x' (f32[2000000000,784]) needs 6272000000000 bytes, more "
                   "than the ");
  snprintf(args, sizeof args, "init %s -D H=2000000000 -o big.safetensors", mlp);
  fails_with(args, "gradc: error: init: param 'W1' (f32[784,2000000000]) needs 6272000000000 bytes, more than the ");
  /* The arena holds at least h : f32[B, H], 2e9 * 256 * 4 bytes. */
  snprintf(args, sizeof args, "bench %s -D B=2000000000 --steps 1", mlp);
  fails_with(args, "-byte arena: more than the ");
  char *err;
  assert_int_equal(gradc(args, &err), 1);
  const char *at = strstr(err, "gradc: error: cannot allocate the ");
  if (!at) fail_msg("%s", err);
  long long arena = strtoll(at + strlen("gradc: error: cannot allocate the "), NULL, 10);
  assert_true(arena >= 2048000000000LL);
  free(err);
  struct stat sb;
  assert_int_not_equal(stat(in_dir("big.safetensors"), &sb), 0);
}

static void test_inputs_must_be_regular_files(void **state) {
  (void)state;
  fails_with("check /dev/zero", "gradc: error: /dev/zero: not a regular file");
  fails_with("run tiny.gdl --params /dev/zero --inputs data.safetensors", "gradc: error: /dev/zero: not a regular file");
  assert_int_equal(mkfifo(in_dir("fifo"), 0644), 0); /* opening it must not wait for a writer */
  fails_with("check fifo", "gradc: error: fifo: not a regular file");
  fails_with("train tiny.gdl --data fifo", "gradc: error: fifo: not a regular file");
  fails_with("check .", "gradc: error: .: is a directory");
  unlink(in_dir("fifo"));
}


/* ---- outputs ---- */

/* Every command that writes a file, its output named OUT (replaced). */
static const char *const writers[] = {
    "train tiny.gdl --data data.safetensors --steps 2 --checkpoint OUT",
    "train tiny.gdl --data data.safetensors --steps 2 --params-out OUT",
    "run tiny.gdl --params p.safetensors --inputs w.safetensors --grads-out OUT",
    "init tiny.gdl -o OUT",
    "data random tiny.gdl -o OUT",
    "data text text.txt -T 4 -o OUT",
    "compile tiny.gdl -o OUT",
    "convert p.safetensors --map map.txt -o OUT",
};

static void writer_args(char *buf, size_t n, const char *cmd, const char *out) {
  const char *at = strstr(cmd, "OUT");
  snprintf(buf, n, "%.*s%s%s", (int)(at - cmd), cmd, out, at + 3);
}

static void writer_inputs(void) {
  gradc_ok("init tiny.gdl -o p.safetensors --seed 1");
  gradc_ok("data random tiny.gdl -o w.safetensors");
  write_text("text.txt", "the cat sat on the mat and the dog sat on the log\n");
  write_text("map.txt", "W1 <- W1\nb1 <- b1\nW2 <- W2\n");
}

static void test_outputs_that_are_not_regular_files_are_refused(void **state) {
  (void)state;
  writer_inputs();
  assert_int_equal(mkfifo(in_dir("out.fifo"), 0644), 0);
  assert_int_equal(mkdir(in_dir("out.dir"), 0755), 0);
  /* A device node of our own (the null device's numbers): writing must not
   * replace it.  Only where this process may make one. */
  bool dev = mknod(in_dir("out.dev"), S_IFCHR | 0666, makedev(1, 3)) == 0;
  char args[1024];
  for (size_t i = 0; i < sizeof writers / sizeof *writers; i++) {
    writer_args(args, sizeof args, writers[i], "out.fifo");
    fails_with(args, "gradc: error: out.fifo: not a regular file (a device, fifo or socket)");
    writer_args(args, sizeof args, writers[i], "out.dir");
    fails_with(args, "gradc: error: out.dir: is a directory, not a file");
    if (dev) {
      writer_args(args, sizeof args, writers[i], "out.dev");
      fails_with(args, "gradc: error: out.dev: not a regular file");
    }
  }
  struct stat sb;
  assert_int_equal(lstat(in_dir("out.fifo"), &sb), 0);
  assert_true(S_ISFIFO(sb.st_mode));
  if (dev) {
    assert_int_equal(lstat(in_dir("out.dev"), &sb), 0);
    assert_true(S_ISCHR(sb.st_mode));
    unlink(in_dir("out.dev"));
  }
  /* The writer itself refuses too (the C API has no command line). */
  char err[1024];
  assert_false(write_file_atomic(in_dir("out.fifo"), &(FilePart){"x", 1}, 1, err, sizeof err));
  assert_non_null(strstr(err, "not a regular file"));
  assert_int_equal(lstat(in_dir("out.fifo"), &sb), 0);
  assert_true(S_ISFIFO(sb.st_mode));
  assert_int_equal(count_temps(), 0);
  unlink(in_dir("out.fifo"));
  rmdir(in_dir("out.dir"));
}

static void test_symlinked_outputs_are_written_through(void **state) {
  (void)state;
  writer_inputs();
  assert_int_equal(mkdir(in_dir("sub"), 0755), 0);
  char args[1024];
  for (size_t i = 0; i < sizeof writers / sizeof *writers; i++) {
    /* link.out -> sub/chain -> target (relative to sub/), the target
     * existing or not yet. */
    for (int exists = 0; exists < 2; exists++) {
      unlink(in_dir("link.out"));
      unlink(in_dir("sub/chain"));
      unlink(in_dir("sub/target"));
      if (exists) write_text("sub/target", "old contents");
      assert_int_equal(symlink("target", in_dir("sub/chain")), 0);
      assert_int_equal(symlink("sub/chain", in_dir("link.out")), 0);
      writer_args(args, sizeof args, writers[i], "link.out");
      gradc_ok(args);
      struct stat sb;
      assert_int_equal(lstat(in_dir("link.out"), &sb), 0);
      if (!S_ISLNK(sb.st_mode)) fail_msg("gradc %s replaced the symlink", args);
      assert_int_equal(lstat(in_dir("sub/chain"), &sb), 0);
      assert_true(S_ISLNK(sb.st_mode));
      assert_int_equal(lstat(in_dir("sub/target"), &sb), 0);
      assert_true(S_ISREG(sb.st_mode));
      if (sb.st_size <= 12) fail_msg("gradc %s: the target was not written", args);
      assert_int_equal(count_temps(), 0);
    }
  }
  /* The target got one atomic write: its temporary was beside it. */
  char *a = read_text("sub/target");
  assert_null(strstr(a, "old contents"));
  free(a);
  unlink(in_dir("link.out"));
  unlink(in_dir("sub/chain"));
  unlink(in_dir("sub/target"));
  rmdir(in_dir("sub"));
}

static void test_outputs_never_replace_inputs(void **state) {
  (void)state;
  writer_inputs();
  assert_int_equal(symlink("data.safetensors", in_dir("data.link")), 0);
  assert_int_equal(link(in_dir("p.safetensors"), in_dir("p.hard")), 0);
  char *before = read_text("data.safetensors");
  fails_with("train tiny.gdl --data data.safetensors --steps 2 --checkpoint data.safetensors",
             "gradc: error: data.safetensors: --checkpoint would overwrite --data, which this command reads");
  fails_with("train tiny.gdl --data data.safetensors --steps 2 --checkpoint data.link",
             "gradc: error: data.link: --checkpoint would overwrite --data, which this command reads (as "
             "data.safetensors)");
  fails_with("train tiny.gdl --data data.safetensors --steps 2 --params-out tiny.gdl",
             "gradc: error: tiny.gdl: --params-out would overwrite the model");
  fails_with("train tiny.gdl --data data.safetensors --steps 2 --init p.safetensors --plot p.hard",
             "gradc: error: p.hard: --plot would overwrite --init");
  fails_with("train tiny.gdl --data data.safetensors --steps 2 --checkpoint c.safetensors --params-out c.safetensors",
             "gradc: error: c.safetensors: both --checkpoint and --params-out would write it");
  fails_with("run tiny.gdl --params p.safetensors --inputs w.safetensors --grads-out p.safetensors",
             "gradc: error: p.safetensors: --grads-out would overwrite --params, which this command reads");
  fails_with("run tiny.gdl --params p.hard --inputs w.safetensors --outputs-out w.safetensors",
             "gradc: error: w.safetensors: --outputs-out would overwrite --inputs");
  fails_with("data text text.txt -T 4 -o text.txt", "gradc: error: text.txt: -o would overwrite a text file");
  fails_with("convert p.safetensors --map map.txt -o p.hard", "gradc: error: p.hard: -o would overwrite the source");
  fails_with("compile tiny.gdl -o tiny.gdl", "gradc: error: tiny.gdl: -o would overwrite the model");
  char *after = read_text("data.safetensors");
  assert_string_equal(before, after);
  free(before);
  free(after);
  char *model = read_text("tiny.gdl");
  assert_string_equal(model, model_text);
  free(model);
  /* The file a run carries on: --resume into --checkpoint, --init into --params-out. */
  gradc_ok("train tiny.gdl --data data.safetensors --steps 2 --checkpoint ck2.safetensors");
  gradc_ok("train tiny.gdl --data data.safetensors --steps 4 --resume ck2.safetensors --checkpoint ck2.safetensors");
  assert_int_equal(finite_checkpoint("ck2.safetensors"), 4);
  gradc_ok("train tiny.gdl --data data.safetensors --steps 2 --init p.safetensors --params-out p.safetensors");
  unlink(in_dir("data.link"));
  unlink(in_dir("p.hard"));
}

/* Outputs that cannot be written fail before the first step, for root
 * too: a directory that does not exist, a "directory" that is a file, and
 * /proc, which takes no new files. */
static void test_unwritable_outputs_fail_before_the_first_step(void **state) {
  (void)state;
  writer_inputs();
  write_text("plain", "a file, not a directory");
  static const struct {
    const char *flag, *path, *why;
  } bad[] = {
      {"--checkpoint", "nodir/ck.safetensors", "nodir/ck.safetensors: cannot be written: the directory 'nodir' does not exist"},
      {"--checkpoint", "plain/ck.safetensors", "plain/ck.safetensors: cannot be written: 'plain' is not a directory"},
      {"--checkpoint", "/proc/ck.safetensors", "/proc/ck.safetensors: cannot be written: no new file can be made in '/proc'"},
      {"--params-out", "/proc/self/p.safetensors", "/proc/self/p.safetensors: cannot be written"},
      {"--log", "nodir/log.csv", "nodir/log.csv: cannot be written: the directory 'nodir' does not exist"},
      {"--plot", "plain/loss.svg", "plain/loss.svg: cannot be written: 'plain' is not a directory"},
      {"--trace", "/proc/trace.json", "/proc/trace.json: cannot be written"},
  };
  char args[1024], want[512];
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    /* A million steps: only a check before the first step fails at once. */
    snprintf(args, sizeof args, "train tiny.gdl --data data.safetensors --steps 1000000 %s %s", bad[i].flag,
             bad[i].path);
    snprintf(want, sizeof want, "gradc: error: %s", bad[i].why);
    char *err;
    double t = now_ms();
    int rc = gradc(args, &err);
    if (rc != 1 || !strstr(err, want) || strstr(err, "training "))
      fail_msg("gradc %s: exit %d, wanted 1 and '%s' before training in:\n%s", args, rc, want, err);
    if (now_ms() - t > 20000) fail_msg("gradc %s took %.0f ms", args, now_ms() - t);
    free(err);
  }
  fails_with("run tiny.gdl --params p.safetensors --inputs w.safetensors --grads-out nodir/g.safetensors",
             "gradc: error: nodir/g.safetensors: cannot be written: the directory 'nodir' does not exist");
  fails_with("data text text.txt -T 4 -o plain/d.safetensors", "gradc: error: plain/d.safetensors: cannot be written");
  fails_with("compile tiny.gdl -o /proc/tiny.gca", "gradc: error: /proc/tiny.gca: cannot be written");
  fails_with("convert p.safetensors --map map.txt -o nodir/c.safetensors", "gradc: error: nodir/c.safetensors: cannot");
  assert_int_equal(count_temps(), 0);
  unlink(in_dir("plain"));
}

/* SIGHUP (a closed terminal) ends the run after the current step, with its
 * checkpoint, as SIGINT and SIGTERM do. */
static void test_sighup_ends_the_run_with_its_checkpoint(void **state) {
  (void)state;
  const int sigs[] = {SIGHUP, SIGINT, SIGTERM};
  for (size_t i = 0; i < sizeof sigs / sizeof *sigs; i++) {
    unlink(in_dir("hup.safetensors"));
    const char *args[] = {TRAIN_ARGS, "--checkpoint", "hup.safetensors", "--checkpoint-every", "1"};
    pid_t pid = spawn_train(args, (int)(sizeof args / sizeof *args));
    struct stat sb;
    /* The first checkpoint comes after step 1: the handlers are in place. */
    for (double t = now_ms(); stat(in_dir("hup.safetensors"), &sb) != 0 && now_ms() - t < 20000;) sleep_ms(1);
    assert_int_equal(kill(pid, sigs[i]), 0);
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    char *err = read_text("killed.stderr");
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 128 + sigs[i])
      fail_msg("signal %d: %s %d (wanted exit %d)\n%s", sigs[i], WIFEXITED(status) ? "exit" : "killed by signal",
               WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status), 128 + sigs[i], err);
    if (!strstr(err, "interrupted after ") || !strstr(err, "checkpoint (step ")) fail_msg("%s", err);
    free(err);
    int64_t step = finite_checkpoint("hup.safetensors");
    assert_true(step >= 1 && step < NSTEPS);
  }
  assert_int_equal(count_temps(), 0);
}

/* ---- messages name the file ---- */

static void test_messages_name_the_file(void **state) {
  (void)state;
  writer_inputs();
  fails_with("run tiny.gdl --params w.safetensors --inputs w.safetensors",
             "gradc: error: w.safetensors: tensor 'x': not a param of the model");
  fails_with("run tiny.gdl --params p.safetensors --inputs p.safetensors",
             "gradc: error: p.safetensors: tensor 'W1': not an input of the model");
  gradc_ok("data random tiny.gdl -D B=8 -o w8.safetensors");
  fails_with("run tiny.gdl --params p.safetensors --inputs w8.safetensors",
             "gradc: error: w8.safetensors: tensor 'x': expected f32[4,6], got f32[8,6]");

  /* Sample 37 of 64 has target 7 of 3 classes: the error names it, in
   * the dataset, before the first step (not element 1 of step 10's window). */
  StFile f;
  char err[1024];
  if (!st_read(in_dir("data.safetensors"), &f, err, sizeof err)) fail_msg("%s", err);
  StTensor *y = (StTensor *)st_find(&f, "y");
  assert_non_null(y);
  assert_int_equal(y->dtype, ST_I32);
  ((int32_t *)y->data)[37] = 7;
  assert_true(st_write(in_dir("bad.safetensors"), &f, err, sizeof err));
  st_free(&f);
  char *out;
  assert_int_equal(gradc("train tiny.gdl --data bad.safetensors --steps 40 --gas 2", &out), 1);
  if (!strstr(out, "gradc: error: bad.safetensors: tensor 'y', sample 37: target 7 out of range [0, 3) "
                   "(cross_entropy at tiny.gdl:10:13)") ||
      strstr(out, "step "))
    fail_msg("%s", out);
  free(out);
}

/* ---- malformed files ---- */

/* gradc ARGS on a malformed file: exit 1 and an error naming it (a file
 * cut before the artifact magic reads as model source: FILE:1:1: error). */
static void refused(const char *args, const char *file) {
  char *err;
  int rc = gradc(args, &err);
  if (rc != 1 || !strstr(err, "error: ") || !strstr(err, file))
    fail_msg("gradc %s: exit %d (wanted 1, an error naming %s):\n%s", args, rc, file, err);
  free(err);
}

static void test_malformed_files_are_errors(void **state) {
  (void)state;
  writer_inputs();
  const char *mdir = tu_path("tests/fuzz/malformed");
  DIR *d = opendir(mdir);
  assert_non_null(d);
  char args[2048], file[1024];
  int n = 0;
  for (struct dirent *e; (e = readdir(d));) {
    const char *name = e->d_name;
    size_t len = strlen(name);
    if (name[0] == '.') continue;
    snprintf(file, sizeof file, "%s/%s", mdir, name);
    if (len > 4 && strcmp(name + len - 4, ".gca") == 0) {
      snprintf(args, sizeof args, "run '%s' --params p.safetensors --inputs w.safetensors", file);
      refused(args, name);
    } else if (strncmp(name, "ck-", 3) == 0) {
      snprintf(args, sizeof args, "train tiny.gdl --data data.safetensors --steps 3 --resume '%s'", file);
      refused(args, name);
    } else {
      snprintf(args, sizeof args, "run tiny.gdl --params '%s' --inputs w.safetensors", file);
      refused(args, name);
      snprintf(args, sizeof args, "run tiny.gdl --params p.safetensors --inputs '%s'", file);
      refused(args, name);
      snprintf(args, sizeof args, "train tiny.gdl --data '%s' --steps 1", file);
      refused(args, name);
    }
    n++;
  }
  closedir(d);
  assert_true(n >= 30);

  /* Every 61st truncation and byte flip of an artifact: the checksum
   * catches each one. */
  gradc_ok("compile tiny.gdl --target ref -o good.gca");
  size_t len;
  const char *why;
  char *good = read_file(in_dir("good.gca"), &len, &why);
  assert_non_null(good);
  for (size_t at = 0; at < len; at += 61) {
    for (int flip = 0; flip < 2; flip++) {
      FILE *f = fopen(in_dir("bad.gca"), "wb");
      assert_non_null(f);
      if (flip) good[at] ^= 0x20;
      assert_int_equal(fwrite(good, 1, flip ? len : at, f), flip ? len : at);
      if (flip) good[at] ^= 0x20;
      assert_int_equal(fclose(f), 0);
      refused("run bad.gca --params p.safetensors --inputs w.safetensors", "bad.gca");
    }
  }
  free(good);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_stale_temps_of_dead_writers_only),
      cmocka_unit_test(test_checkpoint_refuses_nonfinite_params),
      cmocka_unit_test(test_nonfinite_search_finds_the_first),
      cmocka_unit_test(test_nonfinite_update_keeps_the_last_good_checkpoint),
      cmocka_unit_test(test_nan_loss_stops_or_skips),
      cmocka_unit_test(test_max_loss_warns),
      cmocka_unit_test(test_nan_gradient_stops_before_the_update),
      cmocka_unit_test(test_sizes_are_checked_before_allocating),
      cmocka_unit_test(test_inputs_must_be_regular_files),
      cmocka_unit_test(test_outputs_that_are_not_regular_files_are_refused),
      cmocka_unit_test(test_symlinked_outputs_are_written_through),
      cmocka_unit_test(test_outputs_never_replace_inputs),
      cmocka_unit_test(test_unwritable_outputs_fail_before_the_first_step),
      cmocka_unit_test(test_sighup_ends_the_run_with_its_checkpoint),
      cmocka_unit_test(test_messages_name_the_file),
      cmocka_unit_test(test_malformed_files_are_errors),
      cmocka_unit_test(test_checkpoint_survives_kill_9),
  };
  /* GRADC_TEST_FILTER=test_outputs* runs the tests matching a pattern. */
  if (getenv("GRADC_TEST_FILTER")) cmocka_set_test_filter(getenv("GRADC_TEST_FILTER"));
  return cmocka_run_group_tests(tests, setup, teardown);
}
