/* test_dp_comm.c - the comm layer (runtime/comm.h): the single back end is
 * the identity, and the MPI back end computes every collective as worked
 * out by hand, on 2 ranks and on a 2 x 2 layout whose dp and tp groups are
 * checked too; ranks that issue different collectives get an error from
 * comm_check, and a rank left waiting gets one from the wait's time limit.
 *
 * The MPI cases run this executable again under mpirun
 * (`test_dp_comm --worker NAME`); they are skipped with a message when the
 * build has no MPI or mpirun is absent. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "gradc.h"
#include "runtime/comm/comm.h"
#include "test_dp.h"

/* ------------------------------------------------------------------ */
/* Workers (one per rank, under mpirun)                                 */
/* ------------------------------------------------------------------ */

/* Every collective on every dtype and op, on the world of c. */
static int collectives(Comm *c) {
  char err[1024] = "";
  CommGroup *g = &c->world;
  int R = g->rank, N = g->size;
  /* all_reduce f32 sum, out of place and in place: x[i] = 10 R + i. */
  float xf[5], yf[5];
  for (int i = 0; i < 5; i++) xf[i] = (float)(10 * R + i);
  OK(comm_all_reduce(g, xf, yf, 5, COMM_F32, COMM_SUM, 1, err, sizeof err));
  for (int i = 0; i < 5; i++) CHECK(yf[i] == (float)(10 * N * (N - 1) / 2 + N * i), "sum[%d] = %g", i, yf[i]);
  OK(comm_all_reduce(g, xf, xf, 5, COMM_F32, COMM_SUM, 2, err, sizeof err));
  for (int i = 0; i < 5; i++) CHECK(xf[i] == yf[i], "in place sum[%d] = %g", i, xf[i]);
  /* f64 max and min: v = R + 0.25, -R. */
  double d[2] = {R + 0.25, -R};
  OK(comm_all_reduce(g, d, d, 1, COMM_F64, COMM_MAX, 3, err, sizeof err));
  OK(comm_all_reduce(g, d + 1, d + 1, 1, COMM_F64, COMM_MIN, 4, err, sizeof err));
  CHECK(d[0] == N - 1 + 0.25 && d[1] == -(N - 1), "max %g min %g", d[0], d[1]);
  /* all_gather f64: rank r sends {r + 0.5, 2 r}; and in place. */
  double mine[2] = {R + 0.5, 2.0 * R}, all[16], inplace[16];
  CommReq *rq;
  OK(comm_all_gather_start(g, mine, all, 2, COMM_F64, 6, &rq, err, sizeof err));
  OK(comm_wait(rq, err, sizeof err));
  for (int r = 0; r < N; r++) CHECK(all[2 * r] == r + 0.5 && all[2 * r + 1] == 2.0 * r, "gather part %d", r);
  inplace[2 * R] = R + 0.5;
  inplace[2 * R + 1] = 2.0 * R;
  OK(comm_all_gather_start(g, inplace + 2 * R, inplace, 2, COMM_F64, 7, &rq, err, sizeof err));
  OK(comm_wait(rq, err, sizeof err));
  for (int r = 0; r < N; r++) CHECK(inplace[2 * r] == r + 0.5 && inplace[2 * r + 1] == 2.0 * r, "in place gather %d", r);
  /* reduce_scatter f32 sum: send[j] = R + j over N*3 elements; part r of
   * the result is sum_R (R + 3 r + i) = N(N-1)/2 + N (3 r + i). */
  float send[24], part[3];
  for (int j = 0; j < 3 * N; j++) send[j] = (float)(R + j);
  OK(comm_reduce_scatter_start(g, send, part, 3, COMM_F32, COMM_SUM, 8, &rq, err, sizeof err));
  OK(comm_wait(rq, err, sizeof err));
  for (int i = 0; i < 3; i++)
    CHECK(part[i] == (float)(N * (N - 1) / 2 + N * (3 * R + i)), "scatter[%d] = %g", i, part[i]);
  OK(comm_reduce_scatter_start(g, send, send, 3, COMM_F32, COMM_SUM, 9, &rq, err, sizeof err));
  OK(comm_wait(rq, err, sizeof err));
  for (int i = 0; i < 3; i++) CHECK(send[i] == part[i], "in place scatter[%d] = %g", i, send[i]);
  /* broadcast from the last rank. */
  double b[3] = {0, 0, 0};
  if (R == N - 1) b[0] = 42, b[1] = -1, b[2] = 0.5;
  OK(comm_broadcast(g, b, 3, COMM_F64, N - 1, 10, err, sizeof err));
  CHECK(b[0] == 42 && b[1] == -1 && b[2] == 0.5, "broadcast %g %g %g", b[0], b[1], b[2]);
  OK(comm_barrier(g, err, sizeof err));
  /* Several in flight, completed out of order, polled with comm_test. */
  double v[3][4];
  CommReq *rs[3];
  for (int k = 0; k < 3; k++) {
    for (int i = 0; i < 4; i++) v[k][i] = (k + 1) * (R + 1) + i;
    OK(comm_all_reduce_start(g, v[k], v[k], 4, COMM_F64, COMM_SUM, 20 + (uint64_t)k, &rs[k], err, sizeof err));
  }
  bool done = false;
  for (int spins = 0; !done && spins < 100000000; spins++) OK(comm_test(rs[2], &done, err, sizeof err));
  CHECK(done, "comm_test never saw the last request complete");
  for (int k = 2; k >= 0; k--) OK(comm_wait(rs[k], err, sizeof err));
  for (int k = 0; k < 3; k++)
    for (int i = 0; i < 4; i++)
      CHECK(v[k][i] == (k + 1) * N * (N + 1) / 2.0 + N * i, "in flight %d[%d] = %g", k, i, v[k][i]);
  /* Every rank issued the same: the check passes, and resets. */
  OK(comm_check(g, "the test", err, sizeof err));
  CHECK(g->issued == 0, "check did not reset the count");
  return 0;
}

/* Groups of tp x dp: world rank w = dp_rank * tp + tp_rank. */
static int groups(Comm *c) {
  char err[1024] = "";
  int w = c->rank, tp = c->tp;
  CHECK(c->tp_group.rank == w % tp && c->dp_group.rank == w / tp, "group ranks %d %d", c->tp_group.rank,
        c->dp_group.rank);
  CHECK(c->tp_group.size == tp && c->dp_group.size == c->dp, "group sizes");
  /* Sum of world ranks over each group. */
  double x = w, y = w;
  OK(comm_all_reduce(&c->tp_group, &x, &x, 1, COMM_F64, COMM_SUM, 1, err, sizeof err));
  OK(comm_all_reduce(&c->dp_group, &y, &y, 1, COMM_F64, COMM_SUM, 1, err, sizeof err));
  int tpr = w % tp, dpr = w / tp;
  double want_tp = 0, want_dp = 0;
  for (int k = 0; k < tp; k++) want_tp += dpr * tp + k;
  for (int k = 0; k < c->dp; k++) want_dp += k * tp + tpr;
  CHECK(x == want_tp, "tp group sum %g, want %g", x, want_tp);
  CHECK(y == want_dp, "dp group sum %g, want %g", y, want_dp);
  OK(comm_check(&c->tp_group, "the test", err, sizeof err));
  OK(comm_check(&c->dp_group, "the test", err, sizeof err));
  return 0;
}

/* Ranks issue the same sizes in a different order: the check fails on
 * every rank with a message naming the ranks, and a value that differs is
 * found by comm_agree. */
static int mismatch(Comm *c) {
  char err[1024] = "";
  CommGroup *g = &c->world;
  double a[2] = {1, 2}, b[2] = {3, 4};
  uint64_t ta = hash_str("dA"), tb = hash_str("dB");
  OK(comm_all_reduce(g, a, a, 2, COMM_F64, COMM_SUM, g->rank == 0 ? ta : tb, err, sizeof err));
  OK(comm_all_reduce(g, b, b, 2, COMM_F64, COMM_SUM, g->rank == 0 ? tb : ta, err, sizeof err));
  CHECK(!comm_check(g, "the test", err, sizeof err), "the check passed");
  CHECK(strstr(err, "ranks issued different collectives in the test: rank 1 of the world group issued 2"), "message: %s",
        err);
  if (g->rank == 0) printf("%s\n", err);
  /* Afterwards the hashes start afresh: the same collectives pass. */
  OK(comm_all_reduce(g, a, a, 2, COMM_F64, COMM_SUM, ta, err, sizeof err));
  OK(comm_check(g, "the test", err, sizeof err));
  int diff;
  uint64_t v0, vd;
  OK(comm_agree(g, 7, &diff, &v0, &vd, err, sizeof err));
  CHECK(diff == -1 && v0 == 7, "agree on equal values: %d", diff);
  OK(comm_agree(g, g->rank == 1 ? 9 : 7, &diff, &v0, &vd, err, sizeof err));
  CHECK(diff == 1 && v0 == 7 && vd == 9, "agree on different values: %d %llu %llu", diff, (unsigned long long)v0,
        (unsigned long long)vd);
  return 0;
}

/* Rank 1 issues a collective rank 0 never joins: its wait gives up after
 * GRADC_COMM_TIMEOUT (1 s here) with an error, and comm_abort ends the
 * run (rank 0 would otherwise sleep for a minute). */
static int timeout(Comm *c) {
  char err[1024] = "";
  if (c->rank == 0) {
    sleep(60);
    return 1;
  }
  double x = 1;
  CHECK(!comm_all_reduce(&c->world, &x, &x, 1, COMM_F64, COMM_SUM, 5, err, sizeof err), "the lone all_reduce completed");
  printf("%s\n", err);
  fflush(stdout);
  comm_abort(3);
  return 1;
}

static int worker(const char *name, int tp, int dp) {
  Comm *c = dp_worker_open(tp, dp);
  if (!c) return 1;
  int rc = 1;
  if (strcmp(name, "collectives") == 0) rc = collectives(c) || groups(c);
  else if (strcmp(name, "mismatch") == 0) rc = mismatch(c);
  else if (strcmp(name, "timeout") == 0) rc = timeout(c);
  return dp_worker_close(c, name, rc);
}

/* ------------------------------------------------------------------ */
/* Tests                                                                */
/* ------------------------------------------------------------------ */

static void test_comm_single_backend_is_the_identity(void **state) {
  (void)state;
  char err[512];
  Comm *c = comm_open(1, 1, err, sizeof err);
  assert_non_null(c);
  assert_string_equal(c->be->name, "single");
  assert_int_equal(c->size, 1);
  assert_int_equal(c->dp_group.size, 1);
  float x[3] = {1, 2, 3}, y[3] = {0}, z[6] = {0};
  assert_true(comm_all_reduce(&c->dp_group, x, y, 3, COMM_F32, COMM_SUM, 1, err, sizeof err));
  assert_true(y[0] == 1 && y[1] == 2 && y[2] == 3);
  CommReq *r;
  assert_true(comm_all_gather_start(&c->world, x, z, 3, COMM_F32, 2, &r, err, sizeof err));
  bool done = false;
  assert_true(comm_test(r, &done, err, sizeof err));
  assert_true(done);
  assert_true(comm_wait(r, err, sizeof err));
  assert_true(z[0] == 1 && z[2] == 3 && z[3] == 0);
  assert_true(comm_reduce_scatter_start(&c->tp_group, x, y, 2, COMM_F32, COMM_MAX, 3, &r, err, sizeof err));
  assert_true(comm_wait(r, err, sizeof err));
  assert_true(comm_broadcast(&c->world, x, 3, COMM_F32, 0, 4, err, sizeof err));
  assert_true(comm_barrier(&c->world, err, sizeof err));
  assert_int_equal(c->world.issued, 3); /* and one each on the dp and tp groups */
  assert_int_equal(c->dp_group.issued, 1);
  assert_int_equal(c->tp_group.issued, 1);
  assert_true(comm_check(&c->world, "the test", err, sizeof err));
  assert_int_equal(c->world.issued, 0);
  /* Errors: a root outside the group, a negative count. */
  assert_false(comm_broadcast(&c->world, x, 3, COMM_F32, 1, 5, err, sizeof err));
  assert_non_null(strstr(err, "root 1 is not a rank of the group"));
  assert_false(comm_all_reduce(&c->world, x, y, -1, COMM_F32, COMM_SUM, 6, err, sizeof err));
  assert_non_null(strstr(err, "negative count"));
  comm_close(c);
  /* A layout of several ranks in one process is an error, not a hang. */
  c = comm_open(1, 2, err, sizeof err);
  assert_null(c);
  assert_non_null(strstr(err, "--dp"));
}

static void test_comm_mpi_collectives_on_two_ranks(void **state) {
  (void)state;
  dp_run_workers("collectives", 1, 2);
}

static void test_comm_mpi_groups_of_tp_times_dp(void **state) {
  (void)state;
  dp_run_workers("collectives", 2, 2);
}

static void test_comm_mpi_order_mismatch_is_an_error(void **state) {
  (void)state;
  if (!dp_have_mpirun()) return;
  char out[16384];
  dp_workers(out, sizeof out, "", 2, "mismatch", "1 2");
  assert_non_null(strstr(out, "ranks issued different collectives in the test"));
}

static void test_comm_mpi_missing_rank_times_out(void **state) {
  (void)state;
  if (!dp_have_mpirun()) return;
  char out[16384];
  time_t t0 = time(NULL);
  int rc = tu_sh(out, sizeof out, "GRADC_COMM_TIMEOUT=1 " MPIRUN " -np 2 %s --worker timeout 1 2", dp_self);
  assert_int_not_equal(rc, 0);
  if (!strstr(out, "all_reduce over the world group (f64[1], tag 0000000000000005) did not complete in 1 s"))
    fail_msg("no time-out message:\n%s", out);
  assert_true(time(NULL) - t0 < 30); /* comm_abort ended rank 0's minute of sleep */
}

int main(int argc, char **argv) {
  if (argc == 5 && strcmp(argv[1], "--worker") == 0) return worker(argv[2], atoi(argv[3]), atoi(argv[4]));
  if (!dp_find_self()) return 1;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_comm_single_backend_is_the_identity),
      cmocka_unit_test(test_comm_mpi_collectives_on_two_ranks),
      cmocka_unit_test(test_comm_mpi_groups_of_tp_times_dp),
      cmocka_unit_test(test_comm_mpi_order_mismatch_is_an_error),
      cmocka_unit_test(test_comm_mpi_missing_rank_times_out),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
