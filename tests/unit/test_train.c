/* test_train.c - `gradc train` and `gradc data text` through the command
 * line (GRADC_BINARY): datasets hold the bytes of the text, a run stopped
 * and resumed from its checkpoint logs the same losses bit for bit as an
 * uninterrupted one (across an epoch boundary and mid-epoch), a damaged
 * checkpoint is refused, progress is a line redrawn in place on a terminal
 * (a pseudo-terminal here) and plain text otherwise, and the log and plot
 * files have the promised shape. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <pty.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "runtime/runtime.h"
#include "testutil.h"

/* A byte-level bigram model with a second, batch-independent loss. */
static const char *model_text =
    "model bigram {\n"
    "  batch B = 4\n"
    "  dim   T = 8\n"
    "  dim   V = 256\n"
    "  dim   C = 8\n"
    "  input idx     : i32[B, T]\n"
    "  input targets : i32[B, T]\n"
    "  param emb  : f32[V, C] init normal(0, 0.1)\n"
    "  param head : f32[C, V] init normal(0, 0.1)\n"
    "  loss ce = cross_entropy(embedding(idx, emb) @ head, targets)\n"
    "  loss l2 = 1e-3 * sum(head * head)\n"
    "}\n";

/* 218 bytes: with T = 8 and stride 8, 27 samples, 6 windows of 4 an epoch. */
static const char *corpus =
    "It was the best of times, it was the worst of times, it was the age of wisdom, it was the age of "
    "foolishness, it was the epoch of belief, it was the epoch of incredulity, it was the season of Light, "
    "it was the season.\n";

static char dir[64];

static void write_text(const char *name, const char *text, size_t n) {
  char path[256];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  assert_int_equal(fwrite(text, 1, n, f), n);
  assert_int_equal(fclose(f), 0);
}

/* Run gradc in the scratch directory; stdout and stderr come back
 * (malloc'd), the exit status is returned. */
static int gradc(const char *args, char **out, char **err) {
  char cmd[2048];
  snprintf(cmd, sizeof cmd, "cd %s && '%s' %s 2>stderr.txt", dir, GRADC_BINARY, args);
  FILE *p = popen(cmd, "r");
  assert_non_null(p);
  StrBuf sb;
  sb_init(&sb);
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) sb_putn(&sb, buf, n);
  int st = pclose(p);
  char *e = tu_read_in(dir, "stderr.txt");
  if (err)
    *err = e;
  else
    free(e);
  if (out)
    *out = strdup(sb_str(&sb));
  sb_free(&sb);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void gradc_ok(const char *args) {
  char *err;
  int rc = gradc(args, NULL, &err);
  if (rc != 0) fail_msg("gradc %s: exit %d\n%s", args, rc, err);
  free(err);
}

static int setup(void **state) {
  strcpy(dir, "/tmp/gradc_test_train_XXXXXX");
  if (!mkdtemp(dir)) return -1;
  write_text("bigram.gdl", model_text, strlen(model_text));
  write_text("corpus.txt", corpus, strlen(corpus));
  gradc_ok("data text corpus.txt -T 8 -o data.safetensors");
  return 0;
}

static int teardown(void **state) {
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  return system(cmd) == 0 ? 0 : -1;
}

/* The lines of a file, without the last field (elapsed_s differs). */
static char *without_elapsed(const char *csv) {
  StrBuf sb;
  sb_init(&sb);
  for (const char *line = csv; *line;) {
    const char *nl = strchr(line, '\n'), *end = nl ? nl : line + strlen(line);
    const char *comma = end;
    while (comma > line && *comma != ',') comma--;
    sb_putn(&sb, line, (size_t)(comma - line));
    sb_putc(&sb, '\n');
    line = nl ? nl + 1 : end;
  }
  char *s = strdup(sb_str(&sb));
  sb_free(&sb);
  return s;
}

static int count_lines(const char *s) {
  int n = 0;
  for (; *s; s++) n += *s == '\n';
  return n;
}

static void test_data_text_holds_the_bytes(void **state) {
  char path[256];
  snprintf(path, sizeof path, "%s/data.safetensors", dir);
  StFile f;
  st_init(&f);
  char err[512];
  assert_true(st_read(path, &f, err, sizeof err));
  const StTensor *idx = st_find(&f, "idx"), *tg = st_find(&f, "targets");
  assert_non_null(idx);
  assert_non_null(tg);
  int64_t len = (int64_t)strlen(corpus), N = (len - 8 - 1) / 8 + 1;
  assert_int_equal(idx->dtype, ST_I32);
  assert_int_equal(idx->rank, 2);
  assert_int_equal(idx->shape[0], N);
  assert_int_equal(idx->shape[1], 8);
  const int32_t *a = idx->data, *b = tg->data;
  for (int64_t n = 0; n < N; n++)
    for (int64_t t = 0; t < 8; t++) {
      assert_int_equal(a[n * 8 + t], (unsigned char)corpus[n * 8 + t]);
      assert_int_equal(b[n * 8 + t], (unsigned char)corpus[n * 8 + t + 1]);
    }
  assert_string_equal(st_get_meta(&f, "vocab_size"), "256");
  st_free(&f);

  /* --compact: ids are ranks among the bytes present, listed in vocab. */
  gradc_ok("data text corpus.txt corpus.txt -T 5 --stride 2 --compact --names x,y -o compact.safetensors");
  snprintf(path, sizeof path, "%s/compact.safetensors", dir);
  st_init(&f);
  assert_true(st_read(path, &f, err, sizeof err));
  const StTensor *x = st_find(&f, "x"), *y = st_find(&f, "y");
  assert_non_null(x);
  assert_non_null(y);
  assert_int_equal(x->shape[0], (2 * len - 5 - 1) / 2 + 1);
  cJSON *vocab = cJSON_Parse(st_get_meta(&f, "vocab"));
  assert_non_null(vocab);
  assert_int_equal(cJSON_GetArraySize(vocab), atoi(st_get_meta(&f, "vocab_size")));
  const int32_t *xs = x->data;
  for (int64_t n = 0; n < x->shape[0]; n += 7) /* doubled text, stride 2 */
    for (int t = 0; t < 5; t++)
      assert_int_equal(cJSON_GetArrayItem(vocab, xs[n * 5 + t])->valueint,
                       (unsigned char)corpus[(n * 2 + t) % len]);
  cJSON_Delete(vocab);
  st_free(&f);

  /* Too short a text for one sample and its target. */
  char *err_text;
  assert_int_equal(gradc("data text corpus.txt -T 400 -o x.safetensors", NULL, &err_text), 1);
  assert_non_null(strstr(err_text, "gradc: error: corpus.txt:"));
  free(err_text);
}

#define TRAIN "train bigram.gdl --data data.safetensors --gas 2 --seed 3 --lr 0.05 --clip 1 --warmup 3 --cosine " \
              "--steps 20 "

/* 20 steps straight; 10, a checkpoint, then 10 more.  With 6 windows an
 * epoch the checkpoint falls mid-epoch after one epoch boundary. */
static void test_train_resume_is_bit_identical(void **state) {
  char *out;
  char *err;
  int rc = gradc(TRAIN "--log straight.csv", &out, &err);
  if (rc) fail_msg("%s", err);
  assert_string_equal(out, ""); /* stdout stays clean */
  free(out);
  free(err);
  gradc_ok(TRAIN "--stop-after 10 --checkpoint ck.safetensors --log resumed.csv");
  gradc_ok(TRAIN "--resume ck.safetensors --log resumed.csv --checkpoint ck2.safetensors");
  gradc_ok(TRAIN "--stop-after 10 --checkpoint ck3.safetensors --checkpoint-every 4");
  gradc_ok(TRAIN "--resume ck3.safetensors --log tail.csv");

  char *a = tu_read_in(dir, "straight.csv"), *b = tu_read_in(dir, "resumed.csv"), *c = tu_read_in(dir, "tail.csv");
  char *a2 = without_elapsed(a), *b2 = without_elapsed(b), *c2 = without_elapsed(c);
  assert_int_equal(count_lines(a), 21);
  assert_string_equal(a2, b2);
  /* tail.csv: the header and steps 11..20, as in the straight run. */
  const char *row11 = strstr(a2, "\n11,");
  assert_non_null(row11);
  const char *head_end = strchr(c2, '\n');
  assert_non_null(head_end);
  assert_string_equal(head_end, row11);
  free(a);
  free(b);
  free(c);
  free(a2);
  free(b2);
  free(c2);
}

static void test_train_refuses_truncated_checkpoint(void **state) {
  gradc_ok(TRAIN "--stop-after 2 --checkpoint whole.safetensors");
  char path[256];
  snprintf(path, sizeof path, "%s/whole.safetensors", dir);
  struct stat sb;
  assert_int_equal(stat(path, &sb), 0);
  char *whole = tu_read_in(dir, "whole.safetensors");
  write_text("cut.safetensors", whole, (size_t)sb.st_size / 2);
  free(whole);
  char *err;
  assert_int_equal(gradc(TRAIN "--resume cut.safetensors", NULL, &err), 1);
  assert_non_null(strstr(err, "gradc: error: "));
  assert_non_null(strstr(err, "cut.safetensors"));
  free(err);
}

static void test_train_progress_is_plain_without_a_terminal(void **state) {
  char *err;
  assert_int_equal(gradc(TRAIN "--print-every 5", NULL, &err), 0);
  for (const char *s = err; *s; s++)
    if ((unsigned char)*s < 0x20 && *s != '\n') fail_msg("control character 0x%02x in progress output:\n%s", *s, err);
  assert_non_null(strstr(err, "step  5/20 loss "));
  assert_non_null(strstr(err, "step 20/20 loss "));
  assert_non_null(strstr(err, "tok/s"));
  assert_null(strstr(err, "step  6/20"));
  free(err);
}

static void test_train_progress_redraws_on_a_terminal(void **state) {
  int master;
  pid_t pid = forkpty(&master, NULL, NULL, NULL);
  assert_true(pid >= 0);
  if (pid == 0) {
    if (chdir(dir) == 0)
      execl(GRADC_BINARY, GRADC_BINARY, "train", "bigram.gdl", "--data", "data.safetensors", "--steps", "5",
            (char *)NULL);
    _exit(127);
  }
  StrBuf sb;
  sb_init(&sb);
  char buf[4096];
  for (;;) {
    ssize_t n = read(master, buf, sizeof buf);
    if (n > 0) sb_putn(&sb, buf, (size_t)n);
    else if (n < 0 && errno == EINTR) continue;
    else break; /* EIO once the child has gone */
  }
  close(master);
  int st;
  assert_int_equal(waitpid(pid, &st, 0), pid);
  assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  const char *out = sb_str(&sb);
  assert_non_null(strstr(out, "\rstep 1/5 [")); /* drawn from the line's start */
  assert_non_null(strstr(out, "\rstep 5/5 [########################] loss "));
  assert_non_null(strstr(out, "\033[K"));       /* the rest of the old line erased */
  assert_non_null(strstr(out, "took 0:"));      /* the last redraw says how long it took */
  sb_free(&sb);
}

static void test_train_log_and_plot(void **state) {
  gradc_ok("train bigram.gdl --data data.safetensors --steps 7 --optimizer sgd --lr 0.5 --momentum 0.9 "
           "--log run.csv --plot loss.svg");
  char *csv = tu_read_in(dir, "run.csv");
  assert_int_equal(count_lines(csv), 8);
  assert_true(strncmp(csv, "step,lr,ce,l2,total,grad_norm,elapsed_s\n1,0.5,", 45) == 0);
  assert_non_null(strstr(csv, "\n7,0.5,"));
  free(csv);

  char *svg = tu_read_in(dir, "loss.svg");
  assert_true(strncmp(svg, "<?xml", 5) == 0);
  assert_non_null(strstr(svg, "<svg xmlns=\"http://www.w3.org/2000/svg\""));
  assert_non_null(strstr(svg, "</svg>\n"));
  int polylines = 0;
  for (const char *s = svg; (s = strstr(s, "<polyline")); s++) polylines++;
  assert_int_equal(polylines, 3); /* ce, l2, total */
  assert_non_null(strstr(svg, ">ce</text>"));
  assert_non_null(strstr(svg, ">l2</text>"));
  assert_non_null(strstr(svg, ">total</text>"));
  free(svg);

  gradc_ok("train bigram.gdl --data data.safetensors --steps 3 --log run.jsonl");
  char *jl = tu_read_in(dir, "run.jsonl");
  assert_int_equal(count_lines(jl), 3);
  int step = 0;
  for (char *save = NULL, *line = strtok_r(jl, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
    cJSON *j = cJSON_Parse(line);
    assert_non_null(j);
    assert_int_equal(cJSON_GetObjectItem(j, "step")->valueint, ++step);
    assert_true(cJSON_IsNumber(cJSON_GetObjectItem(cJSON_GetObjectItem(j, "losses"), "ce")));
    assert_true(cJSON_IsNumber(cJSON_GetObjectItem(j, "grad_norm")));
    cJSON_Delete(j);
  }
  free(jl);
}

static void test_train_usage_errors(void **state) {
  const char *bad[] = {
      "train bigram.gdl",                                          /* no --data */
      "train bigram.gdl --data data.safetensors --optimizer adam", /* no such optimizer */
      "train bigram.gdl --data data.safetensors --momentum 0.9",   /* an SGD option with AdamW */
      "train bigram.gdl --data data.safetensors --log run.txt",    /* log format by extension */
      "train bigram.gdl --data data.safetensors -D T=9",           /* dataset shape mismatch */
      "train bigram.gdl --data missing.safetensors",
  };
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    char *err;
    int rc = gradc(bad[i], NULL, &err);
    if (rc != 1 || strncmp(err, "gradc: error: ", 14) != 0) fail_msg("gradc %s: exit %d\n%s", bad[i], rc, err);
    free(err);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_data_text_holds_the_bytes),
      cmocka_unit_test(test_train_resume_is_bit_identical),
      cmocka_unit_test(test_train_refuses_truncated_checkpoint),
      cmocka_unit_test(test_train_progress_is_plain_without_a_terminal),
      cmocka_unit_test(test_train_progress_redraws_on_a_terminal),
      cmocka_unit_test(test_train_log_and_plot),
      cmocka_unit_test(test_train_usage_errors),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
