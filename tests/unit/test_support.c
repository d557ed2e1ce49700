/* test_support.c - arena, strbuf, diagnostics, hashing, rng. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

static void test_arena_alloc_zeroed_and_aligned(void **state) {
  (void)state;
  Arena a;
  arena_init(&a);
  for (int i = 1; i < 1000; i += 37) {
    unsigned char *p = arena_alloc(&a, (size_t)i);
    assert_int_equal((uintptr_t)p % 16, 0);
    for (int j = 0; j < i; j++) assert_int_equal(p[j], 0);
    memset(p, 0xab, (size_t)i);
  }
  void *big = arena_alloc(&a, 1 << 20); /* larger than a block */
  assert_non_null(big);
  assert_string_equal(arena_printf(&a, "%s-%d", "x", 42), "x-42");
  arena_free(&a);
}

static void test_fmt_double_round_trips(void **state) {
  (void)state;
  double xs[] = {0.5, 1e-3, 1.0, -2.5, 0.1, 1.0 / 3.0, 1e-300, 123456789.0, 3.14159265358979};
  char buf[64];
  for (size_t i = 0; i < sizeof xs / sizeof xs[0]; i++) {
    fmt_double(buf, sizeof buf, xs[i]);
    assert_true(strtod(buf, NULL) == xs[i]);
  }
  fmt_double(buf, sizeof buf, 0.001);
  assert_string_equal(buf, "0.001");
  fmt_double(buf, sizeof buf, 2.0);
  assert_string_equal(buf, "2.0");
}

static void test_diag_prints_caret_under_column(void **state) {
  (void)state;
  Diag d;
  diag_init(&d, NULL);
  d.quiet = true;
  SrcFile src = {"m.gdl", "line one\n  h = a + b\n", 21};
  diag_at(&d, DIAG_ERROR, &src, 2, 9, "bad %s", "thing");
  assert_string_equal(sb_str(&d.log), "m.gdl:2:9: error: bad thing\n  h = a + b\n        ^\n");
  assert_int_equal(d.nerrors, 1);
  diag_free(&d);
}

static void test_diag_stops_after_limit(void **state) {
  (void)state;
  Diag d;
  diag_init(&d, NULL);
  d.quiet = true;
  d.max_errors = 3;
  for (int i = 0; i < 10; i++) diag_at(&d, DIAG_ERROR, NULL, 1, 1, "e%d", i);
  assert_int_equal(d.nerrors, 3);
  assert_null(strstr(sb_str(&d.log), "e3"));
  diag_free(&d);
}

static void test_strmap_put_get(void **state) {
  (void)state;
  StrMap m;
  strmap_init(&m);
  char keys[200][8];
  for (int i = 0; i < 200; i++) {
    snprintf(keys[i], sizeof keys[i], "k%d", i);
    strmap_put(&m, keys[i], (void *)(intptr_t)(i + 1));
  }
  for (int i = 0; i < 200; i++) assert_int_equal((intptr_t)strmap_get(&m, keys[i]), i + 1);
  assert_null(strmap_get(&m, "missing"));
  strmap_free(&m);
}

static void test_rng_is_deterministic_and_normal(void **state) {
  (void)state;
  Rng a, b;
  rng_seed(&a, 7);
  rng_seed(&b, 7);
  double s = 0, s2 = 0;
  int n = 20000;
  for (int i = 0; i < n; i++) {
    double x = rng_normal(&a);
    assert_true(x == rng_normal(&b));
    s += x;
    s2 += x * x;
  }
  assert_true(fabs(s / n) < 0.05);
  assert_true(fabs(s2 / n - 1.0) < 0.05);
}

static void test_cache_round_trip_and_corruption(void **state) {
  (void)state;
  char dir[] = "/tmp/gradc-cache-test-XXXXXX";
  assert_non_null(mkdtemp(dir));
  char sub[256];
  snprintf(sub, sizeof sub, "%s/a/b", dir); /* created on first put */
  size_t len = 0;
  assert_null(cache_get(sub, "obj", 42, &len));
  const char payload[] = "object code bytes";
  cache_put(sub, "obj", 42, payload, sizeof payload);
  char *got = cache_get(sub, "obj", 42, &len);
  assert_non_null(got);
  assert_int_equal(len, sizeof payload);
  assert_memory_equal(got, payload, sizeof payload);
  free(got);
  /* Flip a byte of the stored entry: ignored (a warning), not trusted. */
  char path[512];
  snprintf(path, sizeof path, "%s/obj-%016llx", sub, 42ull);
  FILE *f = fopen(path, "r+b");
  assert_non_null(f);
  fseek(f, 30, SEEK_SET);
  fputc('X', f);
  fclose(f);
  assert_null(cache_get(sub, "obj", 42, &len));
  /* An unwritable location is a warning, never a failure. */
  cache_put("/proc/gradc-no-such-dir", "obj", 1, payload, sizeof payload);
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  assert_int_equal(system(cmd), 0);
}

static void test_write_file_atomic_parts_and_failure(void **state) {
  (void)state;
  char dir[] = "/tmp/gradc-file-test-XXXXXX";
  assert_non_null(mkdtemp(dir));
  char path[256];
  snprintf(path, sizeof path, "%s/out.bin", dir);
  FilePart parts[] = {{"ab", 2}, {"", 0}, {"cde", 3}};
  char err[256];
  assert_true(write_file_atomic(path, parts, 3, err, sizeof err));
  size_t n;
  const char *why;
  char *got = read_file(path, &n, &why);
  assert_non_null(got);
  assert_int_equal(n, 5);
  assert_string_equal(got, "abcde");
  free(got);
  /* A directory that does not exist: the error names the file. */
  snprintf(path, sizeof path, "%s/no/such/out.bin", dir);
  assert_false(write_file_atomic(path, parts, 3, err, sizeof err));
  assert_non_null(strstr(err, path));
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  assert_int_equal(system(cmd), 0);
}

static void test_mem_helpers_never_return_null(void **state) {
  (void)state;
  int *z = mem_calloc(0, sizeof(int));
  assert_non_null(z);
  free(z);
  char *s = mem_strdup("gradc");
  assert_string_equal(s, "gradc");
  s = mem_realloc(s, 64);
  assert_string_equal(s, "gradc");
  free(s);
  s = mem_strndup("gradc", 4);
  assert_string_equal(s, "grad");
  free(s);
}

/* Python: len(range(10)[a:b:c]) and the start slice.indices gives. */
static void test_slice_indices_as_python(void **state) {
  (void)state;
  int64_t start = -3;
  assert_int_equal(slice_indices(10, &start, 10, 1), 3);
  assert_int_equal(start, 7);
  start = 2;
  assert_int_equal(slice_indices(10, &start, 100, 3), 3); /* 2, 5, 8 */
  start = 9;
  assert_int_equal(slice_indices(10, &start, -11, -2), 5); /* 9, 7, 5, 3, 1 */
  assert_int_equal(start, 9);
  start = 5;
  assert_int_equal(slice_indices(10, &start, 2, 1), 0);
}

/* A cgroup memory limit's text: v2's memory.max ("max" or bytes), v1's
 * memory.limit_in_bytes (bytes; "no limit" near 2^63). */
static void test_mem_limit_of_reads_cgroup_text(void **state) {
  (void)state;
  assert_int_equal(mem_limit_of("max"), 0);
  assert_int_equal(mem_limit_of("1073741824"), 1073741824ull);
  assert_int_equal(mem_limit_of("268435456\n"), 268435456ull);
  assert_true(mem_limit_of("9223372036854771712") == 9223372036854771712ull);
  assert_int_equal(mem_limit_of(""), 0);
  assert_int_equal(mem_limit_of("-1"), 0);
  assert_int_equal(mem_limit_of(" -1"), 0); /* strtoull alone reads 2^64 - 1 */
  assert_int_equal(mem_limit_of(" 4096"), 0);
  assert_int_equal(mem_limit_of("lots"), 0);
  assert_int_equal(mem_limit_of("12x"), 0);
}

/* The VmFlags line of the mapping of /proc/self/smaps that holds p ("" if none). */
static void vm_flags_of(const void *p, char *flags, size_t n) {
  flags[0] = 0;
  FILE *f = fopen("/proc/self/smaps", "r");
  if (!f) return;
  char line[512];
  bool in = false;
  while (fgets(line, sizeof line, f)) {
    unsigned long lo, hi;
    if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2) { /* a mapping's first line; the others are "Name: ..." */
      in = (uintptr_t)p >= lo && (uintptr_t)p < hi;
    } else if (in && strncmp(line, "VmFlags:", 8) == 0) {
      snprintf(flags, n, "%s", line + 8);
      break;
    }
  }
  fclose(f);
}

/* mem_alloc_huge: 2 MiB-aligned and advised as huge pages from 2 MiB on
 * (the mapping's VmFlags say "hg" where the kernel has transparent huge
 * pages), 64-byte aligned below, zeroed when asked, NULL for a size whose
 * rounding up would wrap (an allocation too large for the machine is not
 * tried: ASan aborts on it rather than return NULL). */
static void test_mem_alloc_huge(void **state) {
  (void)state;
  size_t big = (size_t)3 << 20;
  unsigned char *p = mem_alloc_huge(big, true);
  assert_non_null(p);
  assert_int_equal((uintptr_t)p % ((size_t)2 << 20), 0);
  for (size_t i = 0; i < big; i += 4093) assert_int_equal(p[i], 0);
  assert_int_equal(p[big - 1], 0);
  p[big - 1] = 7;
  FILE *thp = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
  if (thp) {
    char flags[512];
    vm_flags_of(p, flags, sizeof flags);
    assert_non_null(strstr(flags, " hg"));
    fclose(thp);
  }
  free(p);
  unsigned char *q = mem_alloc_huge(100, true);
  assert_non_null(q);
  assert_int_equal((uintptr_t)q % 64, 0);
  for (int i = 0; i < 100; i++) assert_int_equal(q[i], 0);
  free(q);
  void *z = mem_alloc_huge(0, false);
  assert_non_null(z);
  free(z);
  assert_null(mem_alloc_huge(SIZE_MAX - 10, false)); /* rounding up would wrap */
}

static int child_sees_256_mib(void) { return mem_cgroup_limit() == 268435456ull; }

/* A process in a cgroup (v1's memory hierarchy, where this machine lets
 * the test make one) whose parent has a 256 MiB limit sees it: the limit
 * is read up the hierarchy, not at the root alone.  Skipped where cgroups
 * cannot be made. */
static void test_mem_limit_follows_a_cgroup(void **state) {
  (void)state;
  const char *files[] = {"memory.limit_in_bytes"}, *texts[] = {"268435456"};
  int got = tu_in_cgroup("memory", files, texts, 1, child_sees_256_mib);
  if (got == -1) return;
  assert_int_equal(got, 1);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_arena_alloc_zeroed_and_aligned),
      cmocka_unit_test(test_fmt_double_round_trips),
      cmocka_unit_test(test_diag_prints_caret_under_column),
      cmocka_unit_test(test_diag_stops_after_limit),
      cmocka_unit_test(test_strmap_put_get),
      cmocka_unit_test(test_rng_is_deterministic_and_normal),
      cmocka_unit_test(test_cache_round_trip_and_corruption),
      cmocka_unit_test(test_write_file_atomic_parts_and_failure),
      cmocka_unit_test(test_mem_helpers_never_return_null),
      cmocka_unit_test(test_mem_limit_of_reads_cgroup_text),
      cmocka_unit_test(test_mem_alloc_huge),
      cmocka_unit_test(test_mem_limit_follows_a_cgroup),
      cmocka_unit_test(test_slice_indices_as_python),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
