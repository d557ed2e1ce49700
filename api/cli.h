/* cli.h - what the API exports for the command line (tools/) and the
 * Python package beyond include/gradc.h: the commands' pieces that reach
 * the frontend, the passes and the back ends (check, opt, compile with
 * dumps, IR and kernel output, init and random data, one `run` window,
 * bench's measurements), tensor files for datasets and checkpoints, and
 * the pass list for help text.  Internal to the project: not installed.
 *
 * Functions that return an int return the command's exit status (0, 1
 * user error, 2 internal error) and have already written any diagnostic
 * to stderr (`file:line:col: error: ...` or `gradc: error: ...`), as the
 * command line prints them.  support/support.h (strings, files, random
 * numbers, the cache directory) comes with this header: it is the bottom
 * layer every other one uses. */
#ifndef GRADC_API_CLI_H
#define GRADC_API_CLI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "gradc.h"
#include "support/support.h"

/* ------------------------------------------------------------------ */
/* Errors, targets, ranks                                              */
/* ------------------------------------------------------------------ */
/* Write the C API's last error to stderr (with "gradc: error: " unless it
 * carries a diagnostic prefix); returns the exit status for st. */
int cli_report(gradc_status st);
/* cuda or cuda:sm_XX, in a build with the CUDA back end. */
bool cli_is_cuda_target(const char *target);
/* ", cuda, cuda:sm_XX" in a build with the CUDA back end, else "". */
const char *cli_cuda_targets(void);
/* Whether path starts with the artifact magic (else it is model source). */
bool cli_is_artifact(const char *path);
/* A CUDA device is present: 0, else "gradc: error: why" and 1. */
int cli_need_device(void);
/* Processes the launcher started (mpirun -np N), 1 without one. */
int cli_launch_size(void);
/* This process's rank among them, 0 without a launcher. */
int cli_launch_rank(void);
/* A distributed run failed with rc: end the other ranks too (no-op alone). */
void cli_abort_ranks(int rc);
/* The launcher started as many processes as p has ranks (tp x dp): 0,
 * else the error and 1. */
int cli_check_ranks(const gradc_program *p);
/* One thing every rank of a distributed run must hold alike: a flag's
 * value (INT, REAL as its bits, FLAG), or a hash of what cannot travel
 * (a file, the model, a name). */
typedef enum { CLI_AGREE_INT, CLI_AGREE_REAL, CLI_AGREE_FLAG, CLI_AGREE_HASH } cli_agree_kind;
typedef struct cli_agree_item {
  const char *what; /* "--steps", "the model" */
  cli_agree_kind kind;
  uint64_t v;
} cli_agree_item;
/* Collective over s's ranks (a no-op alone): every rank holds rank 0's
 * items and, with params, rank 0's step count and params (tensor by
 * tensor).  0, else 1 on every rank, and rank 0 writes `gradc: error:
 * ranks disagree: ...` naming the first item or tensor that differs and
 * the rank.  Call it before any other collective, with the same items on
 * every rank, so that ranks that disagree stop instead of waiting. */
int cli_agree(gradc_session *s, const cli_agree_item *items, int n, bool params);
/* A hash of the program: its model text and its compiled IR (sizes, K,
 * dp, tp, passes). */
uint64_t cli_program_hash(const gradc_program *p);

/* ------------------------------------------------------------------ */
/* dtypes: include/gradc.h's, named from runtime/io's one table        */
/* ------------------------------------------------------------------ */
const char *cli_dtype_name(gradc_dtype dt);      /* "f32" */
const char *cli_dtype_file_name(gradc_dtype dt); /* "F32", as safetensors spells it */
size_t cli_dtype_size(gradc_dtype dt);

/* ------------------------------------------------------------------ */
/* Passes                                                              */
/* ------------------------------------------------------------------ */
/* The language's built-in functions with their signatures, one a line
 * (`gradc help functions`). */
void cli_print_functions(FILE *out);

int cli_pass_count(void);
const char *cli_pass_name(int i);
const char *cli_pass_what(int i); /* one line for help text */
bool cli_pass_exists(const char *name);

/* ------------------------------------------------------------------ */
/* The commands' pieces                                                */
/* ------------------------------------------------------------------ */
/* --print-ir-before/--print-ir-after ("all" or names separated by commas),
 * --time-passes and --verify. */
typedef struct cli_dumps {
  const char *print_before, *print_after;
  bool time_passes, verify;
} cli_dumps;

/* Parse, type- and shape-check a model (o: its -D values, gas, dp). */
int cli_check(const char *path, const gradc_compile_options *o);
/* gradc_program_compile_file with the dumps d asks for (may be NULL). */
int cli_compile(const char *path, const gradc_compile_options *o, const cli_dumps *d, gradc_program **out);
/* The target a program was compiled for ("cpu", "ref", "cuda:sm_80"). */
const char *cli_program_target(const gradc_program *p);
/* The model source p was compiled from (an artifact keeps it), its name
 * in diagnostics, and the options it was compiled with (-D values, K,
 * target, threads, no_cache; the rest as gradc_compile_options_init
 * sets it).  Everything lives as long as p. */
void cli_program_source(const gradc_program *p, const char **name, const char **text, gradc_compile_options *o);
/* Compile model source forward-only (gradc_compile_options.forward_only)
 * for one window of `window` samples (<= 0: the model's batch as o's -D
 * values set it): the batch dim is set to window and the window runs as
 * K micro-batches of *micro samples, the largest divisor of window that
 * is at most the model's batch, so every sample counts once and batch
 * means divide by the whole window (DESIGN.md §3).  o gives the other -D
 * values, target, threads and no_cache (its K and distribution are not
 * used); `output` statements are compiled only when outputs. */
int cli_compile_window(const char *name, const char *text, const gradc_compile_options *o, int64_t window,
                       bool outputs, gradc_program **out, int64_t *micro);
/* --print-kernels (the CUDA source to stderr) and --kernels-dir DIR (one
 * .cu file per kernel); an error unless p was compiled for CUDA. */
int cli_write_kernels(const gradc_program *p, bool print, const char *dir);
/* The program's final IR as Graphviz (--dot) or as text. */
int cli_write_dot(const gradc_program *p, const char *path);
void cli_print_ir(const gradc_program *p, FILE *out);
/* The schedule's cost model simulating one step on stderr, for a link of
 * gbps and latency_us (<= 0: the model's defaults). */
void cli_cost_report(const gradc_program *p, double gbps, double latency_us);
/* `opt`: read IR text, run the passes (o: gas and the distributed
 * options), write --dot when dot, print the IR to stdout. */
int cli_opt(const char *path, const char *const *passes, int npasses, const gradc_compile_options *o,
            const cli_dumps *d, const char *dot);
/* `init`: the params as declared, seeded, to a safetensors file. */
int cli_init(const char *path, const gradc_compile_options *o, uint64_t seed, const char *out);
/* `data random`: one window of random inputs for every --dp rank. */
int cli_data_random(const char *path, const gradc_compile_options *o, uint64_t seed, const char *out);
/* `run`: one window on params and inputs files: prints `loss NAME VALUE`
 * lines and `loss total` (rank 0), writes the gradients (grads_out), the
 * outputs (outputs_out), the updated buffers (buffers_out) and a Chrome
 * trace (trace); each may be NULL. */
int cli_run(gradc_program *p, const char *params, const char *inputs, const char *grads_out, const char *outputs_out,
            const char *buffers_out, const char *trace, bool allow_tf32);
/* `run --seed S --step N`: the random draws (dropout, rand_like, randn_like) of its window. */
void cli_set_draws(gradc_program *p, uint64_t seed, uint64_t step);

/* ------------------------------------------------------------------ */
/* bench                                                               */
/* ------------------------------------------------------------------ */
typedef struct cli_bench_figures {
  double step_ms_median, step_ms_min, gemm_floor_ms;
  int64_t kernels_per_step, gemms_per_step, peak_bytes, peak_rss_bytes;
  const char *gemm_provider; /* the CPU's GEMM provider ("onednn", ...); "" on other targets */
} cli_bench_figures;

/* Time warmup + steps windows of p on its declared init (seed) and random
 * inputs (seed + 1), then its GEMMs alone on threads threads (listed on
 * stderr when print_gemms), and count launches: everything but the
 * compile times of `gradc bench`. */
int cli_bench(gradc_program *p, int warmup, int steps, uint64_t seed, int threads, bool allow_tf32,
              bool print_gemms, cli_bench_figures *out);

/* The host's GEMM provider choice as a compile without a cache makes it
 * (measured, not read from the cache; once a process): its milliseconds,
 * so that `gradc bench` can time the cold compile without this once-a-host
 * measurement and report it apart. */
double cli_gemm_select_ms(void);

/* ------------------------------------------------------------------ */
/* Tensor files (safetensors) for datasets and checkpoints             */
/* ------------------------------------------------------------------ */
typedef struct cli_tensors cli_tensors;

typedef struct cli_tensor { /* a view into the file's storage */
  const char *name;
  gradc_dtype dtype;
  int rank;
  const int64_t *shape;
  const void *data;
  size_t nbytes;
} cli_tensor;

cli_tensors *cli_tensors_new(void);
void cli_tensors_free(cli_tensors *f);
/* Read / write atomically; on failure "PATH: reason" into err. */
bool cli_tensors_read(cli_tensors *f, const char *path, char *err, size_t errlen);
bool cli_tensors_write(const cli_tensors *f, const char *path, char *err, size_t errlen);
int cli_tensors_count(const cli_tensors *f);
cli_tensor cli_tensors_at(const cli_tensors *f, int i);
int cli_tensors_find(const cli_tensors *f, const char *name); /* its index, or -1 */
/* Add a tensor (data copied). */
void cli_tensors_add(cli_tensors *f, const char *name, gradc_dtype dt, int rank, const int64_t *shape,
                     const void *data);
const char *cli_tensors_meta(const cli_tensors *f, const char *key); /* NULL if absent */
/* A hash of the tensors' names, dtypes, shapes and data. */
uint64_t cli_tensors_hash(const cli_tensors *f);
/* Every value of a dataset tensor that p takes as indices directly (an
 * input that is cross_entropy's targets, embedding's rows) is in range,
 * so that training refuses a bad one at once, naming its sample in the
 * dataset rather than an element of some window: 0, else
 * `gradc: error: PATH: tensor 'y', sample 37: target 7 out of range [0, 3)
 * (cross_entropy at m.gdl:10:13)` and 1. */
int cli_check_dataset_indices(const gradc_program *p, const cli_tensors *data, const char *path);
void cli_tensors_set_meta(cli_tensors *f, const char *key, const char *value);

#endif
