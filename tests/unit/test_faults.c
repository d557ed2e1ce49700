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
 *     skipped step untouched, and --max-loss warns. */
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
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

/* The C API refuses to write a non-finite state and leaves the file alone. */
static void test_checkpoint_refuses_nonfinite_params(void **state) {
  (void)state;
  gradc_compile_options o;
  gradc_compile_options_init(&o);
  gradc_program *p;
  gradc_session *s;
  assert_int_equal(gradc_program_compile_file(in_dir("tiny.gdl"), &o, &p), GRADC_OK);
  assert_int_equal(gradc_session_new(p, &s), GRADC_OK);
  assert_int_equal(gradc_session_init_params(s, 3), GRADC_OK);
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

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_stale_temps_of_dead_writers_only),
      cmocka_unit_test(test_checkpoint_refuses_nonfinite_params),
      cmocka_unit_test(test_nonfinite_update_keeps_the_last_good_checkpoint),
      cmocka_unit_test(test_nan_loss_stops_or_skips),
      cmocka_unit_test(test_max_loss_warns),
      cmocka_unit_test(test_checkpoint_survives_kill_9),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
