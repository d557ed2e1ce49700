/* test_safetensors.c - reading and writing safetensors files: round trips of
 * every dtype, rejection of malformed files with a message naming the file,
 * atomic writes, and robustness against truncated and corrupted input. */
#include <dirent.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "runtime/runtime.h"
#include "testutil.h"

/* A fresh temporary directory per test (removed with its files at the end). */
typedef struct TmpDir {
  char dir[256];
  char path[512];
} TmpDir;

static void tmp_init(TmpDir *t) {
  snprintf(t->dir, sizeof t->dir, "/tmp/gradc_st_XXXXXX");
  assert_non_null(mkdtemp(t->dir));
}

static const char *tmp_file(TmpDir *t, const char *name) {
  snprintf(t->path, sizeof t->path, "%s/%s", t->dir, name);
  return t->path;
}

/* Number of entries in the directory (excluding . and ..). */
static int tmp_count(TmpDir *t) {
  DIR *d = opendir(t->dir);
  assert_non_null(d);
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)))
    if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) n++;
  closedir(d);
  return n;
}

static void tmp_done(TmpDir *t) {
  DIR *d = opendir(t->dir);
  if (d) {
    struct dirent *e;
    char p[600];
    while ((e = readdir(d))) {
      if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
      snprintf(p, sizeof p, "%s/%s", t->dir, e->d_name);
      if (remove(p) != 0) rmdir(p);
    }
    closedir(d);
  }
  rmdir(t->dir);
}

static void write_bytes(const char *path, const void *p, size_t n) {
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  assert_int_equal(fwrite(p, 1, n, f), n);
  fclose(f);
}

/* A file from a header string and a blob; the length field is the header's
 * length unless hdrlen_override >= 0. */
static void write_raw(const char *path, const char *header, const void *blob, size_t nblob, long long hdrlen_override) {
  size_t h = strlen(header);
  unsigned long long n = hdrlen_override >= 0 ? (unsigned long long)hdrlen_override : h;
  unsigned char *buf = malloc(8 + h + nblob + 1);
  for (int i = 0; i < 8; i++) buf[i] = (unsigned char)(n >> (8 * i));
  memcpy(buf + 8, header, h);
  if (nblob) memcpy(buf + 8 + h, blob, nblob);
  write_bytes(path, buf, 8 + h + nblob);
  free(buf);
}

static void test_safetensors_round_trips_every_dtype(void **state) {
  (void)state;
  TmpDir t;
  tmp_init(&t);
  StFile f;
  st_init(&f);
  float f32[6] = {1, -2.5f, 3.25f, 0, 1e-30f, -7};
  double f64 = 3.141592653589793;
  uint16_t bf16[4] = {0x3f80, 0xc000, 0x7f80, 0x0001}; /* 1, -2, inf, smallest subnormal */
  uint16_t f16[4] = {0x3c00, 0x7bff, 0x8001, 0x3555};
  int32_t i32[3] = {-1, 0, 2147483647};
  int64_t i64[2] = {-5, (int64_t)1 << 40};
  int64_t s23[2] = {2, 3}, s4[1] = {4}, s22[2] = {2, 2}, s3[1] = {3}, s2[1] = {2}, s03[2] = {0, 3};
  st_add(&f, "w.f32", ST_F32, 2, s23, f32);
  st_add(&f, "scalar", ST_F64, 0, NULL, &f64);
  st_add(&f, "b\"f\\16", ST_BF16, 1, s4, bf16); /* a name that needs JSON escapes (control characters are refused) */
  st_add(&f, "h", ST_F16, 2, s22, f16);
  st_add(&f, "i", ST_I32, 1, s3, i32);
  st_add(&f, "targets", ST_I64, 1, s2, i64);
  st_add(&f, "empty", ST_F32, 2, s03, NULL);
  st_set_meta(&f, "step", "12");
  st_set_meta(&f, "rng", "{\"s\": [1, 2]}");
  st_set_meta(&f, "step", "13"); /* replaces */
  char err[512] = "";
  const char *path = tmp_file(&t, "a.safetensors");
  assert_true(st_write(path, &f, err, sizeof err));

  /* The header length is a multiple of 8 and the first byte after it is data. */
  size_t len;
  const char *e;
  unsigned char *raw = (unsigned char *)read_file(path, &len, &e);
  assert_non_null(raw);
  uint64_t n = 0;
  for (int i = 7; i >= 0; i--) n = (n << 8) | raw[i];
  assert_int_equal(n % 8, 0);
  assert_int_equal(raw[8], '{');
  assert_int_equal(len, 8 + n + 24 + 8 + 8 + 8 + 12 + 16);
  free(raw);

  StFile g;
  if (!st_read(path, &g, err, sizeof err)) fail_msg("%s", err);
  assert_int_equal(g.n, f.n);
  for (int i = 0; i < f.n; i++) {
    assert_string_equal(g.t[i].name, f.t[i].name); /* insertion order is kept */
    assert_int_equal(g.t[i].dtype, f.t[i].dtype);
    assert_int_equal(g.t[i].rank, f.t[i].rank);
    for (int k = 0; k < f.t[i].rank; k++) assert_int_equal(g.t[i].shape[k], f.t[i].shape[k]);
    assert_int_equal(g.t[i].nbytes, f.t[i].nbytes);
    assert_memory_equal(g.t[i].data, f.t[i].data, f.t[i].nbytes);
  }
  assert_int_equal(g.nmeta, 2);
  assert_string_equal(st_get_meta(&g, "step"), "13");
  assert_string_equal(st_get_meta(&g, "rng"), "{\"s\": [1, 2]}");
  assert_null(st_get_meta(&g, "nope"));
  const StTensor *ti = st_find(&g, "targets");
  assert_non_null(ti);
  assert_int_equal(st_numel(ti), 2);
  assert_int_equal(((int64_t *)ti->data)[1], (int64_t)1 << 40);
  assert_int_equal(st_numel(st_find(&g, "scalar")), 1);
  assert_int_equal(st_numel(st_find(&g, "empty")), 0);
  assert_null(st_find(&g, "w"));
  assert_string_equal(st_dtype_name(ST_BF16), "BF16");
  assert_int_equal(st_dtype_size(ST_I64), 8);
  st_free(&g);
  st_free(&f);
  tmp_done(&t);
}

/* A hand-written file as other tools write it: metadata first, unpadded header. */
static void test_safetensors_reads_hand_written_file(void **state) {
  (void)state;
  TmpDir t;
  tmp_init(&t);
  const char *path = tmp_file(&t, "h.safetensors");
  float blob[3] = {1, 2, 3};
  write_raw(path,
            "{\"__metadata__\":{\"format\":\"pt\"},\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]},"
            "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}  \n",
            blob, sizeof blob, -1);
  StFile f;
  char err[512];
  if (!st_read(path, &f, err, sizeof err)) fail_msg("%s", err);
  assert_int_equal(f.n, 2);
  assert_string_equal(f.t[0].name, "b"); /* header order, not offset order */
  assert_true(((float *)f.t[0].data)[0] == 3.0f);
  assert_true(((float *)f.t[1].data)[1] == 2.0f);
  assert_string_equal(st_get_meta(&f, "format"), "pt");
  st_free(&f);
  tmp_done(&t);
}

/* One malformed file: st_read fails with a message that starts with the
 * path and contains `want`. */
static void expect_reject(const char *path, const char *want) {
  StFile f;
  char err[512] = "";
  bool ok = st_read(path, &f, err, sizeof err);
  if (ok) {
    st_free(&f);
    fail_msg("%s was accepted (expected: %s)", path, want);
  }
  assert_int_equal(f.n, 0);
  if (strncmp(err, path, strlen(path)) != 0 || !strstr(err, want))
    fail_msg("message '%s' does not name the file or lacks '%s'", err, want);
}

static void test_safetensors_rejects_malformed_files(void **state) {
  (void)state;
  TmpDir t;
  tmp_init(&t);
  const char *p = tmp_file(&t, "bad.safetensors");
  unsigned char blob[64] = {0};

  write_bytes(p, "\x10\0\0", 3);
  expect_reject(p, "too short");

  write_raw(p, "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", blob, 8, 4096);
  expect_reject(p, "beyond the end of the file");

  write_raw(p, "{}", NULL, 0, (long long)1 << 40);
  expect_reject(p, "too large");

  write_raw(p, "{\"a\":{\"dtype\":\"F32\",", NULL, 0, -1);
  expect_reject(p, "not valid JSON");

  write_raw(p, "{\"a\":1} x", NULL, 0, -1);
  expect_reject(p, "trailing");

  write_raw(p, "[1, 2]", NULL, 0, -1);
  expect_reject(p, "not a JSON object");

  /* Truncated data: the offsets point past the end of what is left. */
  write_raw(p, "{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", blob, 10, -1);
  expect_reject(p, "tensor 'a': data_offsets [0, 16] go beyond the data (10 bytes)");

  write_raw(p, "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
               "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
            blob, 12, -1);
  expect_reject(p, "overlaps");

  write_raw(p, "{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", blob, 8, -1);
  expect_reject(p, "tensor 'a': data_offsets cover 8 bytes, but F32 of that shape needs 12");

  write_raw(p, "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]}}", blob, 8, -1);
  expect_reject(p, "begin 8 > end 0");

  write_raw(p, "{\"q\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]}}", blob, 2, -1);
  expect_reject(p, "tensor 'q': unsupported dtype 'U8'");

  write_raw(p, "{\"a\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", blob, 8, -1);
  expect_reject(p, "non-negative integers");

  write_raw(p, "{\"a\":{\"dtype\":\"F32\",\"shape\":[1.5],\"data_offsets\":[0,8]}}", blob, 8, -1);
  expect_reject(p, "non-negative integers");

  write_raw(p, "{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}", blob, 4, -1);
  expect_reject(p, "rank 9");

  write_raw(p, "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
               "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
            blob, 8, -1);
  expect_reject(p, "tensor 'a': duplicate");

  write_raw(p, "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", blob, 8, -1);
  expect_reject(p, "not contiguous");

  write_raw(p, "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", blob, 8, -1);
  expect_reject(p, "after the last tensor");

  write_raw(p, "{\"a\":{\"shape\":[1],\"data_offsets\":[0,4]}}", blob, 4, -1);
  expect_reject(p, "tensor 'a': missing or non-string \"dtype\"");

  write_raw(p, "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0]}}", blob, 4, -1);
  expect_reject(p, "data_offsets");

  write_raw(p, "{\"__metadata__\":{\"k\":3}}", NULL, 0, -1);
  expect_reject(p, "not a string");

  /* Dims whose product overflows 64 bits. */
  write_raw(p, "{\"a\":{\"dtype\":\"F64\",\"shape\":[4294967296,4294967296,16],\"data_offsets\":[0,0]}}", NULL, 0,
            -1);
  expect_reject(p, "tensor 'a'");

  expect_reject(tmp_file(&t, "missing.safetensors"), "No such file");
  tmp_done(&t);
}

/* A name with a control character is refused: an escaped NUL would cut
 * "W1\u0000hidden" to W1 (and shadow the real W1), a newline or an escape
 * sequence would forge lines in messages and logs.  The writer refuses
 * them too. */
static void test_safetensors_rejects_control_characters_in_names(void **state) {
  (void)state;
  TmpDir t;
  tmp_init(&t);
  const char *p = tmp_file(&t, "names.safetensors");
  unsigned char blob[8] = {0};
  write_raw(p, "{\"W1\\u0000hidden\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", blob, 4, -1);
  expect_reject(p, "names.safetensors: the header holds an escaped NUL (\\u0000)");
  write_raw(p, "{\"W1\\nW2\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", blob, 4, -1);
  expect_reject(p, "names.safetensors: tensor 'W1\\x0aW2': the name holds a control character (byte 0x0a)");
  write_raw(p, "{\"a\\u001b[2J\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", blob, 4, -1);
  expect_reject(p, "tensor 'a\\x1b[2J': the name holds a control character (byte 0x1b)");
  write_raw(p, "{\"__metadata__\":{\"k\\u007f\":\"v\"}}", NULL, 0, -1);
  expect_reject(p, "\"__metadata__\" key 'k\\x7f': the name holds a control character (byte 0x7f)");
  /* A literal backslash before u0000 is no escape: the name is W1\u0000x. */
  write_raw(p, "{\"W1\\\\u0000x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", blob, 4, -1);
  StFile f;
  char err[512];
  if (!st_read(p, &f, err, sizeof err)) fail_msg("%s", err);
  assert_string_equal(f.t[0].name, "W1\\u0000x");
  st_free(&f);
  /* Metadata values may hold newlines. */
  write_raw(p, "{\"__metadata__\":{\"k\":\"two\\nlines\"}}", NULL, 0, -1);
  if (!st_read(p, &f, err, sizeof err)) fail_msg("%s", err);
  assert_string_equal(st_get_meta(&f, "k"), "two\nlines");
  st_free(&f);

  st_init(&f);
  float x = 1;
  st_add(&f, "bad\tname", ST_F32, 1, (int64_t[]){1}, &x);
  assert_false(st_write(tmp_file(&t, "out.safetensors"), &f, err, sizeof err));
  assert_non_null(strstr(err, "tensor 'bad\\x09name': the name holds a control character (byte 0x09)"));
  st_free(&f);
  tmp_done(&t);
}

static void test_safetensors_write_is_atomic(void **state) {
  (void)state;
  TmpDir t;
  tmp_init(&t);
  StFile f;
  st_init(&f);
  float v[2] = {1, 2};
  int64_t s[1] = {2};
  st_add(&f, "v", ST_F32, 1, s, v);
  char err[512];
  const char *path = tmp_file(&t, "out.safetensors");
  assert_true(st_write(path, &f, err, sizeof err));
  assert_true(st_write(path, &f, err, sizeof err)); /* overwrite */
  assert_int_equal(tmp_count(&t), 1);               /* no PATH.tmp.* left behind */
  struct stat sb;
  assert_int_equal(stat(path, &sb), 0);
  assert_int_equal(sb.st_mode & 0777, 0644);

  /* rename onto a directory fails: the error names the path, the temp is gone. */
  const char *dir = tmp_file(&t, "isdir");
  assert_int_equal(mkdir(dir, 0755), 0);
  char dirpath[512];
  snprintf(dirpath, sizeof dirpath, "%s", dir);
  assert_false(st_write(dirpath, &f, err, sizeof err));
  assert_true(strncmp(err, dirpath, strlen(dirpath)) == 0);
  assert_int_equal(tmp_count(&t), 2);

  /* A directory that does not exist. */
  assert_false(st_write("/nonexistent-gradc-dir/x.safetensors", &f, err, sizeof err));
  assert_non_null(strstr(err, "/nonexistent-gradc-dir/x.safetensors: "));
  st_free(&f);
  tmp_done(&t);
}

/* Every truncation and many random corruptions of a valid file are either
 * read or rejected, never crash (ASan/UBSan builds check the memory). */
static void test_safetensors_survives_corruption(void **state) {
  (void)state;
  TmpDir t;
  tmp_init(&t);
  StFile f;
  st_init(&f);
  float v[6] = {1, 2, 3, 4, 5, 6};
  int64_t s[2] = {2, 3}, s1[1] = {2};
  int64_t iv[2] = {7, 8};
  st_add(&f, "w", ST_F32, 2, s, v);
  st_add(&f, "y", ST_I64, 1, s1, iv);
  st_set_meta(&f, "k", "v");
  char err[512];
  const char *path = tmp_file(&t, "good.safetensors");
  assert_true(st_write(path, &f, err, sizeof err));
  st_free(&f);
  size_t len;
  const char *e;
  unsigned char *good = (unsigned char *)read_file(path, &len, &e);
  assert_non_null(good);
  const char *bad = tmp_file(&t, "bad.safetensors");
  char badpath[512];
  snprintf(badpath, sizeof badpath, "%s", bad);
  for (size_t cut = 0; cut < len; cut++) {
    write_bytes(badpath, good, cut);
    StFile g;
    assert_false(st_read(badpath, &g, err, sizeof err));
  }
  Rng r;
  rng_seed(&r, 42);
  unsigned char *m = malloc(len);
  int accepted = 0;
  for (int it = 0; it < 3000; it++) {
    memcpy(m, good, len);
    int flips = 1 + (int)(rng_next(&r) % 3);
    for (int k = 0; k < flips; k++) {
      size_t at = (size_t)(rng_next(&r) % len);
      m[at] = it % 2 ? (unsigned char)rng_next(&r) : (unsigned char)"{}[]\",:0123456789-e. "[rng_next(&r) % 22];
    }
    write_bytes(badpath, m, len);
    StFile g;
    if (st_read(badpath, &g, err, sizeof err)) {
      accepted++;
      st_free(&g);
    } else {
      assert_true(strncmp(err, badpath, strlen(badpath)) == 0);
    }
  }
  assert_true(accepted > 0); /* flips in the data blob are harmless */
  free(m);
  free(good);
  tmp_done(&t);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_safetensors_round_trips_every_dtype),
      cmocka_unit_test(test_safetensors_reads_hand_written_file),
      cmocka_unit_test(test_safetensors_rejects_malformed_files),
      cmocka_unit_test(test_safetensors_rejects_control_characters_in_names),
      cmocka_unit_test(test_safetensors_write_is_atomic),
      cmocka_unit_test(test_safetensors_survives_corruption),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
