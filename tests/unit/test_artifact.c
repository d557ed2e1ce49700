/* test_artifact.c - artifacts of the cpu target carry the kernels' object
 * code (runtime/exec.c's cpu_program_save_objects / _load_objects):
 * loading one runs no code generation (cg_llvm_compile is never called,
 * nothing is written to the cache) and computes the same bits as the
 * program it was saved from; object code for another host or for other
 * IR is refused with a message that says so, whether the file's META
 * section or its KOBJ section is what differs (the files are patched and
 * their checksum fixed, as a file copied from another machine would be);
 * and `gradc run` / `gradc train` of an artifact go through the same path. */
#define _GNU_SOURCE /* memmem */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "codegen/codegen.h"
#include "gradc.h"
#include "runtime/io/artifact.h"
#include "testutil.h"

#ifdef GRADC_HAVE_LLVM

static const char net_src[] = "model net {\n"
                              "  batch B = 8\n"
                              "  dim D = 4\n"
                              "  dim H = 8\n"
                              "  input x : f32[B, D]\n"
                              "  input y : i32[B]\n"
                              "  param W1 : f32[D, H] init normal(0, 0.5)\n"
                              "  param b1 : f32[H]\n"
                              "  param W2 : f32[H, 3] init uniform(-0.5, 0.5)\n"
                              "  h = tanh(x @ W1 + b1)\n"
                              "  loss ce = cross_entropy(h @ W2, y)\n"
                              "  loss l2 = 1e-3 * sum(W1 * W1)\n"
                              "}\n";

static char tmpdir[] = "/tmp/gradc_test_artifact_XXXXXX";

static const char *tmp(const char *name) {
  static char buf[4][512];
  static int k;
  char *b = buf[k++ % 4];
  snprintf(b, sizeof buf[0], "%s/%s", tmpdir, name);
  return b;
}

static int setup(void **state) {
  (void)state;
  return mkdtemp(tmpdir) ? 0 : -1;
}

static int teardown(void **state) {
  (void)state;
  char cmd[512];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
  return system(cmd) == 0 ? 0 : -1;
}

static void check_ok(gradc_status st) {
  if (st != GRADC_OK) fail_msg("%s", gradc_last_error());
}

static gradc_program *compile(int gas) {
  gradc_compile_options o;
  gradc_compile_options_init(&o);
  o.gas = gas;
  o.no_cache = 1;
  gradc_program *p = NULL;
  check_ok(gradc_program_compile_source("net.gdl", net_src, &o, &p));
  return p;
}

/* Losses, gradients and params after three AdamW steps. */
typedef struct Trace {
  double loss[3][2];
  float g[64];
  float w[64];
} Trace;

static void train(const gradc_program *p, Trace *tr) {
  gradc_session *s;
  check_ok(gradc_session_new(p, &s));
  check_ok(gradc_session_init_params(s, 5));
  gradc_optimizer_options o;
  gradc_optimizer_options_init(&o, GRADC_ADAMW);
  o.lr = 0.01;
  check_ok(gradc_session_set_optimizer(s, &o));
  memset(tr, 0, sizeof *tr);
  float x[32];
  int32_t y[8];
  for (int t = 0; t < 3; t++) {
    for (int i = 0; i < 32; i++) x[i] = (float)((i * 7 + t * 3) % 11) / 5.0f - 1.0f;
    for (int i = 0; i < 8; i++) y[i] = (i + t) % 3;
    check_ok(gradc_session_set_input(s, "x", GRADC_F32, x, 32));
    check_ok(gradc_session_set_input(s, "y", GRADC_I32, y, 8));
    check_ok(gradc_session_run(s));
    tr->loss[t][0] = gradc_session_loss(s, 0);
    tr->loss[t][1] = gradc_session_loss(s, 1);
    check_ok(gradc_session_step(s));
  }
  check_ok(gradc_session_get_grad(s, "W1", tr->g, 32));
  check_ok(gradc_session_get_grad(s, "W2", tr->g + 32, 24));
  check_ok(gradc_session_get_param(s, "W1", tr->w, 32));
  check_ok(gradc_session_get_param(s, "W2", tr->w + 32, 24));
  gradc_session_free(s);
}

static void test_artifact_loads_kernels_without_codegen(void **state) {
  (void)state;
  gradc_program *p = compile(2);
  check_ok(gradc_program_save(p, tmp("net.gca")));
  /* One KOBJ section named "IRHASH;HOST", holding the object bundle. */
  ArtFile a;
  char err[512];
  assert_true(art_read(tmp("net.gca"), &a, err, sizeof err));
  const ArtSection *k = art_find(&a, "KOBJ", NULL);
  assert_non_null(k);
  char host[2048];
  art_host_id(host, sizeof host);
  assert_int_equal(strchr(k->name, ';') - k->name, 16);
  assert_string_equal(strchr(k->name, ';') + 1, host);
  assert_true(k->len > 12 && memcmp(k->data, "GRDCOBJ1", 8) == 0);
  art_free(&a);

  int compiles = cg_llvm_compile_count();
  gradc_program *q = NULL;
  check_ok(gradc_program_load(tmp("net.gca"), &q));
  Trace t1, t2;
  train(p, &t1);
  train(q, &t2);
  assert_int_equal(cg_llvm_compile_count(), compiles); /* loading, running and stepping compiled nothing */
  assert_memory_equal(&t1, &t2, sizeof t1);
  /* The loaded program saves again, and that loads without codegen too. */
  check_ok(gradc_program_save(q, tmp("net2.gca")));
  gradc_program *r = NULL;
  check_ok(gradc_program_load(tmp("net2.gca"), &r));
  train(r, &t2);
  assert_memory_equal(&t1, &t2, sizeof t1);
  assert_int_equal(cg_llvm_compile_count(), compiles);
  gradc_program_free(r);
  gradc_program_free(q);
  gradc_program_free(p);
}

static void expect_load_error(const char *path, const char *what) {
  gradc_program *q = (gradc_program *)1;
  assert_int_equal(gradc_program_load(path, &q), GRADC_ERR_USER);
  assert_null(q);
  if (!strstr(gradc_last_error(), what)) fail_msg("expected '%s' in: %s", what, gradc_last_error());
}

/* Copy an artifact, replacing its KOBJ section's name and/or cutting its
 * data to len bytes (art_write computes the new checksum). */
static void rewrite_kobj(const char *from, const char *to, const char *name, size_t len) {
  ArtFile a;
  char err[512];
  assert_true(art_read(from, &a, err, sizeof err));
  ArtSection *k = (ArtSection *)art_find(&a, "KOBJ", NULL);
  assert_non_null(k);
  if (name) {
    free(k->name);
    k->name = strdup(name);
  }
  if (len < k->len) k->len = len;
  assert_true(art_write(to, &a, err, sizeof err));
  art_free(&a);
}

static void test_artifact_refuses_foreign_kernels(void **state) {
  (void)state;
  gradc_program *p = compile(1);
  check_ok(gradc_program_save(p, tmp("k.gca")));
  ArtFile a;
  char err[512];
  assert_true(art_read(tmp("k.gca"), &a, err, sizeof err));
  char name[4096];
  snprintf(name, sizeof name, "%s", art_find(&a, "KOBJ", NULL)->name);
  size_t len = art_find(&a, "KOBJ", NULL)->len;
  art_free(&a);
  int compiles = cg_llvm_compile_count();

  /* Kernels compiled on a CPU with other features (META still says this host). */
  char other[4200];
  snprintf(other, sizeof other, "%.16s;x86_64-unknown-linux-gnu;znver9;+avx1024;llvm19", name);
  rewrite_kobj(tmp("k.gca"), tmp("host.gca"), other, (size_t)-1);
  expect_load_error(tmp("host.gca"), "kernel object code was built for another host (x86_64-unknown-linux-gnu;znver9");
  /* Kernels of this host from another version of the code generator. */
  char host[1024];
  cg_llvm_host_id(host, sizeof host);
  snprintf(other, sizeof other, "%.16s;gradc-cg-0;%s", name, host);
  assert_non_null(strstr(name, cg_generator_id())); /* the saved id names the generator and its sources' hash */
  assert_non_null(strstr(cg_generator_id(), CG_VERSION "+"));
  assert_int_equal(strlen(cg_generator_id()), strlen(CG_VERSION "+") + 16);
  rewrite_kobj(tmp("k.gca"), tmp("gen.gca"), other, (size_t)-1);
  expect_load_error(tmp("gen.gca"), "gradc-cg-0");
  /* Kernels of another model (or another plan). */
  snprintf(other, sizeof other, "0123456789abcdef%s", strchr(name, ';'));
  rewrite_kobj(tmp("k.gca"), tmp("ir.gca"), other, (size_t)-1);
  expect_load_error(tmp("ir.gca"), "kernel object code does not belong to this artifact's IR");
  /* A truncated object bundle is an error, not a crash. */
  rewrite_kobj(tmp("k.gca"), tmp("cut.gca"), NULL, len / 2);
  expect_load_error(tmp("cut.gca"), "truncated object bundle");
  rewrite_kobj(tmp("k.gca"), tmp("same.gca"), NULL, (size_t)-1);
  gradc_program *q = NULL;
  check_ok(gradc_program_load(tmp("same.gca"), &q)); /* the rewrite itself is harmless */
  gradc_program_free(q);
  assert_int_equal(cg_llvm_compile_count(), compiles); /* refusing never falls back to compiling */
  gradc_program_free(p);
}

/* The host id patched in place in the raw bytes of the file (as if it
 * had been built on a machine whose triple starts with another letter),
 * the checksum recomputed: the META check names both hosts. */
static void test_artifact_refuses_other_host(void **state) {
  (void)state;
  gradc_program *p = compile(1);
  check_ok(gradc_program_save(p, tmp("h.gca")));
  size_t n;
  const char *why;
  char *bytes = read_file(tmp("h.gca"), &n, &why);
  assert_non_null(bytes);
  char *at = memmem(bytes, n, "\"host\":\"", 8);
  assert_non_null(at);
  at += 8;
  char patched = *at == 'q' ? 'r' : 'q';
  *at = patched;
  uint64_t sum = hash_bytes(bytes, n - 8, HASH_SEED);
  for (int i = 0; i < 8; i++) bytes[n - 8 + i] = (char)(unsigned char)(sum >> (8 * i));
  FILE *f = fopen(tmp("other.gca"), "wb");
  assert_non_null(f);
  assert_int_equal(fwrite(bytes, 1, n, f), n);
  fclose(f);
  char want[64];
  snprintf(want, sizeof want, "other.gca: artifact was built for another host (%c", patched);
  expect_load_error(tmp("other.gca"), want);
  assert_non_null(strstr(gradc_last_error(), "this host is"));
  free(bytes);
  gradc_program_free(p);
}

/* ------------------------------------------------------------------ */
/* The command line                                                     */
/* ------------------------------------------------------------------ */

static bool exists(const char *path) {
  struct stat st;
  return stat(path, &st) == 0;
}

/* `gradc run` and `gradc train` of an artifact with the cache pointed at
 * a directory that does not exist yet: kernel code generation would write
 * its object code there (cache_put creates the directory), loading the
 * artifact's objects writes nothing. */
static void test_artifact_cli_runs_without_compiling(void **state) {
  (void)state;
  char out[8192], ref[8192];
  FILE *f = fopen(tmp("net.gdl"), "w");
  fputs(net_src, f);
  fclose(f);
  assert_int_equal(tu_sh(out, sizeof out, "%s init %s -o %s --seed 3", GRADC_BINARY, tmp("net.gdl"), tmp("p.st")), 0);
  assert_int_equal(
      tu_sh(out, sizeof out, "%s data random %s -o %s --seed 4", GRADC_BINARY, tmp("net.gdl"), tmp("i.st")), 0);
  assert_int_equal(tu_sh(out, sizeof out, "%s compile %s --gas 2 -o %s", GRADC_BINARY, tmp("net.gdl"), tmp("cli.gca")),
                   0);
  /* The reference multiplies with the artifact's GEMM provider: another
   * one may round differently. */
  ArtFile art;
  char aerr[512];
  assert_true(art_read(tmp("cli.gca"), &art, aerr, sizeof aerr));
  const ArtSection *gs = art_find(&art, "GEMM", NULL);
  assert_non_null(gs);
  char gemm[64];
  snprintf(gemm, sizeof gemm, "%s", gs->name);
  art_free(&art);
  assert_int_equal(tu_sh(ref, sizeof ref, "GRADC_GEMM=%s %s run %s --gas 2 --no-cache --params %s --inputs %s", gemm,
                         GRADC_BINARY, tmp("net.gdl"), tmp("p.st"), tmp("i.st")),
                   0);
  assert_int_equal(tu_sh(out, sizeof out, "GRADC_CACHE_DIR=%s %s run %s --params %s --inputs %s", tmp("fresh"),
                         GRADC_BINARY, tmp("cli.gca"), tmp("p.st"), tmp("i.st")),
                   0);
  assert_string_equal(out, ref);
  assert_false(exists(tmp("fresh")));
  /* train: the optimiser kernels may be cached there, the model's kernels are not. */
  assert_int_equal(tu_sh(out, sizeof out, "GRADC_CACHE_DIR=%s %s train %s --data %s --steps 3 --params-out %s",
                         tmp("fresh2"), GRADC_BINARY, tmp("cli.gca"), tmp("i.st"), tmp("a.st")),
                   0);
  assert_int_equal(tu_sh(out, sizeof out, "ls %s | grep -c '^cpu-obj-'", tmp("fresh2")), 1); /* grep: no match */
  assert_string_equal(out, "0\n");
  /* And it trains exactly as the model compiled from source does. */
  assert_int_equal(tu_sh(out, sizeof out, "GRADC_GEMM=%s %s train %s --gas 2 --no-cache --data %s --steps 3 --params-out %s",
                         gemm, GRADC_BINARY, tmp("net.gdl"), tmp("i.st"), tmp("b.st")),
                   0);
  assert_int_equal(tu_sh(out, sizeof out, "cmp %s %s", tmp("a.st"), tmp("b.st")), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_artifact_loads_kernels_without_codegen),
      cmocka_unit_test(test_artifact_refuses_foreign_kernels),
      cmocka_unit_test(test_artifact_refuses_other_host),
      cmocka_unit_test(test_artifact_cli_runs_without_compiling),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}

#else /* no LLVM: the cpu target interprets, and its artifacts hold no kernels */

static void test_artifact_without_llvm_has_no_kernels(void **state) {
  (void)state;
  gradc_compile_options o;
  gradc_compile_options_init(&o);
  gradc_program *p = NULL, *q = NULL;
  assert_int_equal(gradc_program_compile_source("w.gdl", "model w {\n  param w : f32[2] init ones\n  loss l = sum(w * w)\n}\n",
                                                &o, &p),
                   GRADC_OK);
  char path[] = "/tmp/gradc_test_artifact_XXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  close(fd);
  assert_int_equal(gradc_program_save(p, path), GRADC_OK);
  ArtFile a;
  char err[512];
  assert_true(art_read(path, &a, err, sizeof err));
  assert_null(art_find(&a, "KOBJ", NULL));
  art_free(&a);
  assert_int_equal(gradc_program_load(path, &q), GRADC_OK);
  gradc_session *s;
  assert_int_equal(gradc_session_new(q, &s), GRADC_OK);
  assert_int_equal(gradc_session_init_params(s, 1), GRADC_OK);
  assert_int_equal(gradc_session_run(s), GRADC_OK);
  assert_true(gradc_session_loss_total(s) == 2.0);
  gradc_session_free(s);
  gradc_program_free(q);
  gradc_program_free(p);
  unlink(path);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_artifact_without_llvm_has_no_kernels)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}

#endif
