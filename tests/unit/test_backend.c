/* test_backend.c - the back-end registry (runtime/backend.h): each target
 * this build has finds its back end, a target it lacks finds none, the
 * list in messages names what is there; and the host element codec every
 * executor stores and reads an arena's bytes with (window.c) rounds as the
 * interpreter does. */
#include <math.h>
#include <string.h>

#include "runtime/backend.h"
#include "testutil.h"

static void test_backend_registry_finds_targets(void **state) {
  (void)state;
  assert_ptr_equal(rt_backend_find("ref"), &rt_backend_ref);
#ifdef GRADC_HAVE_LLVM
  assert_ptr_equal(rt_backend_find("cpu"), &rt_backend_cpu);
#else
  assert_ptr_equal(rt_backend_find("cpu"), &rt_backend_ref); /* the interpreter runs "cpu" without LLVM */
#endif
#ifdef GRADC_HAVE_CUDA
  assert_ptr_equal(rt_backend_find("cuda"), &rt_backend_cuda);
  assert_ptr_equal(rt_backend_find("cuda:sm_80"), &rt_backend_cuda);
  assert_null(rt_backend_find("cuda[:sm_XX]")); /* the spelling in messages is not a target */
#else
  assert_null(rt_backend_find("cuda"));
#endif
  assert_null(rt_backend_find("tpu"));
  assert_null(rt_backend_find(""));
  assert_null(rt_backend_find("CPU"));
  assert_null(rt_backend_find(NULL));
}

static void test_backend_targets_lists_build(void **state) {
  (void)state;
  char buf[256];
#ifdef GRADC_HAVE_CUDA
  assert_string_equal(rt_backend_targets(buf, sizeof buf), "cpu, ref, cuda[:sm_XX]");
#else
  assert_string_equal(rt_backend_targets(buf, sizeof buf), "cpu, ref");
#endif
  char small[6];
  assert_string_equal(rt_backend_targets(small, sizeof small), "cpu, "); /* cut, terminated */
}

static void test_backend_every_member_set(void **state) {
  (void)state;
  const Backend *all[] = {&rt_backend_ref, rt_backend_find("cpu"), rt_backend_find("cuda")};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
    const Backend *b = all[i];
    if (!b) continue;
    assert_non_null(b->name);
    assert_non_null(b->pipeline);
    assert_non_null(b->compile);
    assert_non_null(b->load);
    assert_non_null(b->run);
    assert_non_null(b->free);
  }
}

/* Stored and read back, a value is what ir_round_dtype makes of it. */
static void test_backend_elem_round_trips(void **state) {
  (void)state;
  static const IrDType dts[] = {IR_DT_F32, IR_DT_F64, IR_DT_BF16, IR_DT_F16, IR_DT_I32, IR_DT_BOOL};
  static const double xs[] = {0.0, -0.0, 1.0, -2.5, 3.14159265358979, 1e-7, 6.1e-5, 65504.0, 1e5, -1e-30, 7.0};
  double buf[2];
  for (size_t d = 0; d < sizeof dts / sizeof dts[0]; d++)
    for (size_t i = 0; i < sizeof xs / sizeof xs[0]; i++) {
      memset(buf, 0xa5, sizeof buf);
      rt_elem_set(buf, dts[d], 1, xs[i]);
      double got = rt_elem_get(buf, dts[d], 1), want = ir_round_dtype(xs[i], dts[d]);
      if (dts[d] == IR_DT_F16 && fabs(xs[i]) > 65504.0) want = copysign(INFINITY, xs[i]);
      if (got != want || (ir_dtype_is_float(dts[d]) && signbit(got) != signbit(want)))
        fail_msg("%s: %.17g stored and read back as %.17g, ir_round_dtype gives %.17g", ir_dtype_name(dts[d]), xs[i],
                 got, want);
    }
  double nan = NAN;
  rt_elem_set(buf, IR_DT_BF16, 0, nan);
  assert_true(isnan(rt_elem_get(buf, IR_DT_BF16, 0)));
  rt_elem_set(buf, IR_DT_F16, 0, nan);
  assert_true(isnan(rt_elem_get(buf, IR_DT_F16, 0)));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_backend_registry_finds_targets),
      cmocka_unit_test(test_backend_targets_lists_build),
      cmocka_unit_test(test_backend_every_member_set),
      cmocka_unit_test(test_backend_elem_round_trips),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
