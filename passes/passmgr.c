/* passmgr.c - the pass registry, the default pipelines, and the manager
 * that runs passes with dumps (--print-ir-before/after), the verifier
 * between passes, and per-pass timing (--time-passes).  A pass may name
 * the passes it needs before it (fuse and memplan: the rewrites that
 * prepare their graph); a list that leaves them out gets them run first,
 * each as a pass of its own. */
#include <string.h>
#include <time.h>

#include "passes.h"

/* Every pass, in pipeline order: name, function, the passes it needs run
 * before it (pm_run runs those a list leaves out), what it does. */
#define FUSE_NEEDS "weight-grad-gemm,unslice-concat,split-reductions,split-cross-entropy,split-draws"
#define MEMPLAN_NEEDS "ungroup-dp-slices,split-grad-sums,grad-unslices,grad-copies,movement-kernels"
static const Pass passes[] = {
    {"shard", pass_shard, NULL, "shard split(N) params over the --tp ranks and insert the collectives"},
    {"autocast", pass_autocast, NULL, "--precision bf16|f16: f32 matmuls run in the low type, everything else in f32"},
    {"gas-fold", pass_gas_fold, NULL, "fold gradient-accumulation scaling into the objective root (DESIGN.md §3)"},
    {"autodiff", pass_autodiff, NULL, "derive the backward graph by reverse-mode differentiation"},
    {"simplify", pass_simplify, NULL, "constant folding and algebraic identities"},
    {"cse", pass_cse, NULL, "merge identical ops"},
    {"dce", pass_dce, NULL, "remove ops whose results are unused"},
    {"dp-reduce", pass_dp_reduce, NULL, "all-reduce gradients over the --dp ranks in buckets, in the last micro-batch"},
    {"weight-grad-gemm", pass_weight_grad_gemm, NULL, "a batched weight gradient summed over the batch becomes one GEMM over all rows"},
    {"unslice-concat", pass_unslice_concat, NULL, "a sum of unslices that tile one axis becomes a concat"},
    {"split-reductions", pass_split_reductions, NULL, "a reduction over the last axis and others becomes a row reduction and a small one"},
    {"split-cross-entropy", pass_split_cross_entropy, NULL, "cross_entropy(reduction=\"sum\") becomes per-row cross_entropy and a sum"},
    {"split-draws", pass_split_draws, NULL, "a random draw (or dropout's mask) read by several ops gets a copy per reader: kernels draw it again"},
    {"fuse", pass_fuse, FUSE_NEEDS, "group ops into kernels: elementwise chains, row reductions and their neighbours"},
    {"schedule", pass_schedule, NULL, "start collectives early and wait late, so communication overlaps compute"},
    {"ungroup-dp-slices", pass_ungroup_dp_slices, NULL, "the unslice of a dp-reduced gradient slice goes back to group 0 (no work)"},
    {"split-grad-sums", pass_split_grad_sums, NULL, "grad(p + q) becomes grad(p) and grad(q), both accumulating into one buffer"},
    {"grad-unslices", pass_grad_unslices, NULL, "a group-0 range unslice that cannot fill its gradient range in place becomes a kernel"},
    {"grad-copies", pass_grad_copies, NULL, "a gradient that cannot accumulate in place gets a copy-accumulate kernel"},
    {"movement-kernels", pass_movement_kernels, NULL, "a group-0 permute, slice or concat that no GEMM reads in place becomes a kernel"},
    {"memplan", pass_memplan, MEMPLAN_NEEDS, "assign every stored value an offset in the step's arena (CPU back end)"},
};
#define NPASSES ((int)(sizeof passes / sizeof passes[0]))

static const char *const pipeline[] = {"shard", "autocast", "gas-fold", "autodiff", "simplify", "cse", "dce", "dp-reduce", "schedule"};

/* The CPU back end (docs/BACKEND.md). */
static const char *const pipeline_cpu[] = {
    "shard", "autocast", "gas-fold", "autodiff", "simplify", "cse", "dce", "dp-reduce",
    "weight-grad-gemm", "simplify", "dce", "unslice-concat", "split-reductions", "split-cross-entropy", "split-draws", "fuse",
    "schedule",
    "ungroup-dp-slices", "split-grad-sums", "grad-unslices", "grad-copies", "movement-kernels", "memplan",
};

const Pass *pass_lookup(const char *name) {
  for (int i = 0; i < NPASSES; i++)
    if (strcmp(passes[i].name, name) == 0) return &passes[i];
  return NULL;
}

const Pass *pass_list(int *n) {
  *n = NPASSES;
  return passes;
}

const char *const *pass_pipeline(int *n) {
  *n = (int)(sizeof pipeline / sizeof pipeline[0]);
  return pipeline;
}

const char *const *pass_pipeline_cpu(int *n) {
  *n = (int)(sizeof pipeline_cpu / sizeof pipeline_cpu[0]);
  return pipeline_cpu;
}

void pm_init(PassManager *pm) {
  memset(pm, 0, sizeof *pm);
  pm->dump_out = stderr;
#ifdef GRADC_VERIFY_DEFAULT
  pm->verify = true;
#endif
}

/* sel: "all", or a comma-separated list of pass names. */
static bool wants(const char *sel, const char *name) {
  if (!sel) return false;
  if (strcmp(sel, "all") == 0) return true;
  size_t n = strlen(name);
  for (const char *p = sel; *p;) {
    const char *e = strchr(p, ',');
    size_t len = e ? (size_t)(e - p) : strlen(p);
    if (len == n && strncmp(p, name, n) == 0) return true;
    if (!e) break;
    p = e + 1;
  }
  return false;
}

static void dump(PassManager *pm, const IrFunc *f, const char *when, const char *name) {
  fprintf(pm->dump_out, "// -----// IR Dump %s %s //----- //\n", when, name);
  ir_print_file(f, pm->dump_out);
  fflush(pm->dump_out);
}

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static const Pass *lookup_n(const char *name, size_t len) {
  for (int i = 0; i < NPASSES; i++)
    if (strlen(passes[i].name) == len && strncmp(passes[i].name, name, len) == 0) return &passes[i];
  return NULL;
}

/* Append p to list[0..k), after those of its needs that list does not
 * hold yet (and theirs); returns the new length. */
static int expand(const Pass *p, const Pass **list, int k, int cap) {
  for (const char *s = p->needs; s && *s;) {
    const char *e = strchr(s, ',');
    size_t len = e ? (size_t)(e - s) : strlen(s);
    const Pass *q = lookup_n(s, len);
    GRADC_ASSERT(q != NULL);
    bool listed = false;
    for (int i = 0; i < k; i++) listed |= list[i] == q;
    if (!listed) k = expand(q, list, k, cap);
    s = e ? e + 1 : s + len;
  }
  GRADC_ASSERT(k < cap);
  list[k++] = p;
  return k;
}

int pm_run(PassManager *pm, IrFunc *f, const char *const *names, int nnames, const PassOptions *o) {
  char err[1024];
  double total = 0;
  enum { CAP = 256 };
  const Pass *list[CAP];
  int n = 0;
  for (int i = 0; i < nnames; i++) {
    const Pass *p = pass_lookup(names[i]);
    GRADC_ASSERT(p != NULL);
    n = expand(p, list, n, CAP);
  }
  for (int i = 0; i < n; i++) {
    const Pass *p = list[i];
    if (wants(pm->print_before, p->name)) dump(pm, f, "Before", p->name);
    Arena scratch;
    arena_init(&scratch);
    double t0 = now_ms();
    PassResult r = p->run(f, o, &scratch);
    double dt = now_ms() - t0;
    arena_free(&scratch);
    if (i < 64) pm->ms[i] = dt;
    total += dt;
    if (r == PASS_ERROR) return 1;
    if (pm->verify && !ir_verify(f, err, sizeof err)) {
      fprintf(stderr, "// -----// IR Dump After %s (failed verification) //----- //\n", p->name);
      ir_print_file(f, stderr);
      fprintf(stderr, "gradc: internal error: IR verifier failed after pass '%s': %s\n", p->name, err);
      return 2;
    }
    if (wants(pm->print_after, p->name)) dump(pm, f, "After", p->name);
  }
  if (pm->time_passes) {
    fprintf(stderr, "===-------------------------------------------------------------------------===\n");
    fprintf(stderr, "                          ... Pass execution timing report ...\n");
    fprintf(stderr, "===-------------------------------------------------------------------------===\n");
    for (int i = 0; i < n && i < 64; i++)
      fprintf(stderr, "  %10.3f ms  %5.1f%%  %s\n", pm->ms[i], total > 0 ? 100.0 * pm->ms[i] / total : 0.0,
              list[i]->name);
    fprintf(stderr, "  %10.3f ms  100.0%%  Total\n", total);
  }
  return 0;
}
