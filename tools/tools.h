/* tools.h - the command line's pieces that live outside gradc.c: the flag
 * parser (flags.c), reading numbers (common.c), the training loop and
 * dataset writer (train.c), `gradc bench` (bench.c) and the SVG plot
 * writer (plot.c).  The commands use include/gradc.h and api/cli.h,
 * nothing below them. */
#ifndef GRADC_TOOLS_H
#define GRADC_TOOLS_H

#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gradc.h"

/* ------------------------------------------------------------------ */
/* common.c                                                            */
/* ------------------------------------------------------------------ */
bool tools_parse_i64(const char *s, int64_t *out); /* the whole string, base 10 */
bool tools_parse_f64(const char *s, double *out);  /* the whole string, finite */
/* --link-latency-us / --link-gbps: a simulated slow link between ranks,
 * handed to the comm layer through GRADC_COMM_LATENCY_US / GRADC_COMM_GBPS
 * (docs/DISTRIBUTED.md) before it starts.  Values <= 0 leave them alone. */
void tools_set_link(double latency_us, double gbps);
/* Wall-clock milliseconds (CLOCK_MONOTONIC). */
double tools_now_ms(void);
/* "gradc: error: " and the message on stderr; returns 1 (the user-error exit status). */
int tools_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* A file a command reads or writes, as its flag names it. */
typedef struct ToolsPath {
  const char *flag;   /* "--checkpoint", "-o", "the model" */
  const char *path;   /* NULL: not given */
  const char *update; /* an output that may be this input's file (--checkpoint: "--resume"), or NULL */
} ToolsPath;
/* Before a command does its work: every output can be written
 * (file_check_output: a regular file or none, in a directory that takes a
 * new file), none is the file of an input (device and inode, through
 * symlinks; but an output may be the input its `update` names) and no two
 * outputs are one file.  0, else `gradc: error: FILE: reason` and 1. */
int tools_check_paths(const ToolsPath *in, int nin, const ToolsPath *out, int nout);

/* ------------------------------------------------------------------ */
/* flags.c: the one flag parser, driven by a table per command         */
/* ------------------------------------------------------------------ */
typedef enum {
  FLAG_BOOL,   /* bool: set when present ("--verify") */
  FLAG_STRING, /* const char *: the value */
  FLAG_LIST,   /* const char *: repeated values joined with commas */
  FLAG_INT,    /* int in [lo, hi] */
  FLAG_I64,    /* int64_t in [lo, hi] */
  FLAG_U64,    /* uint64_t in [lo, hi] */
  FLAG_REAL,   /* double in [lo, hi], finite; lo_open: lo itself is refused */
} FlagKind;

typedef struct Flag {
  const char *name; /* "--gas"; one dash ("-o"): the value is the next argument only */
  FlagKind kind;
  void *dst;            /* as the kind says */
  bool *given;          /* set when the flag appears, or NULL */
  double lo, hi;        /* numbers: the accepted range */
  bool lo_open;
  const char *expects;  /* numbers: "%s expects EXPECTS, got 'VALUE'" */
  const char *missing;  /* the message when the value is absent (%s: the flag), or NULL */
  bool (*valid)(const char *v); /* strings: accepted values, or NULL (any) */
  const char *invalid;  /* ... and the message for another (%s: the value) */
  const char *label;    /* the name messages use, if not name (an alias) */
} Flag;

#define TOOLS_MAX_DEFINES 64
typedef struct Defines { /* -D NAME=VALUE, in order (names malloc'd) */
  const char *name[TOOLS_MAX_DEFINES];
  int64_t value[TOOLS_MAX_DEFINES];
  int n;
} Defines;

typedef struct FlagSpec {
  const Flag *flags;
  int nflags;
  const char *see;   /* appended to usage errors: " (see gradc help train)" */
  bool see_values;   /* ... and to bad values and "too many -D options" */
  bool see_missing;  /* a value flag without its value: "FLAG needs a value" (else: an incomplete option) */
  Defines *defines;  /* where -D goes, or NULL (no -D) */
  const char **positional; /* the other arguments, up to max_positional */
  int max_positional;
  int *npositional;
  const char *too_many; /* the message for one positional more, or NULL ("unexpected argument") */
} FlagSpec;

/* The flags of K and of distributed runs that `gradc compile/run` and
 * `gradc train` share (docs/DISTRIBUTED.md): table rows for a struct *a
 * with these fields. */
#define TOOLS_RUN_FLAGS(a)                                                                                         \
  {"--gas", FLAG_INT, &(a)->gas, &(a)->gas_set, 1, 1 << 20, .expects = "a positive integer"},                     \
      {"--dp", FLAG_INT, &(a)->dp, &(a)->dp_set, 1, 1 << 20, .expects = "a positive integer"},                    \
      {"--tp", FLAG_INT, &(a)->tp, &(a)->tp_set, 1, 1 << 20, .expects = "a positive integer"},                    \
      {"--sequence-parallel", FLAG_BOOL, .dst = &(a)->sequence_parallel},                                         \
      {"--no-overlap", FLAG_BOOL, .dst = &(a)->no_overlap}, {"--zero1", FLAG_BOOL, .dst = &(a)->zero1},           \
      {"--bucket-mb", FLAG_REAL, &(a)->bucket_mb, NULL, 0, 1 << 20, .lo_open = true,                               \
       .expects = "a positive size in MiB"},                                                                      \
      {"--trace", FLAG_STRING, .dst = &(a)->trace},                                                               \
      {"--precision", FLAG_STRING, .dst = &(a)->precision, .valid = tools_is_precision,                            \
       .invalid = "--precision expects f32, bf16 or f16, got '%s'"},                                              \
      {"--link-latency-us", FLAG_REAL, &(a)->link_latency_us, NULL, 0, HUGE_VAL,                                  \
       .expects = "a non-negative number"},                                                                       \
      {"--link-gbps", FLAG_REAL, &(a)->link_gbps, NULL, 0, HUGE_VAL, .lo_open = true, .expects = "a positive number"}
/* --precision's values: f32, bf16, f16. */
bool tools_is_precision(const char *v);
/* --bucket-mb's MiB in bytes (at least 1); 0 when it was not given. */
int64_t tools_bucket_bytes(double mb);

/* Parse argv[first..argc) by s; 0, or 1 after writing `gradc: error: ...`. */
int flags_parse(const FlagSpec *s, int argc, char **argv, int first);
void defines_free(Defines *d);

/* ------------------------------------------------------------------ */
/* train.c                                                             */
/* ------------------------------------------------------------------ */
/* `gradc train MODEL ...` and `gradc data text FILE... ...`.  argv[0] is the
 * command word ("train"; "text" for the data sub-command); each returns the
 * exit status (0, 1 user error, 2 internal error). */
int cmd_train(int argc, char **argv);
int cmd_data_text(int argc, char **argv);
extern const char train_help[];
extern const char data_text_help[];

/* ------------------------------------------------------------------ */
/* infer.c: eval, generate, and datasets as one forward-only window    */
/* ------------------------------------------------------------------ */
int cmd_eval(int argc, char **argv);     /* argv[0] is "eval" */
int cmd_generate(int argc, char **argv); /* argv[0] is "generate" */
extern const char eval_help[];
extern const char generate_help[];

/* A dataset (one tensor per input, as train --data reads it) compiled as
 * one forward-only window of all its samples (DESIGN.md §3's rule over
 * the whole dataset; see infer.c), with a session holding it. */
typedef struct EvalSet EvalSet;
/* Match the dataset at path to sig's inputs and compile sig's model source
 * (its -D values; target, if not NULL, instead of sig's) for it.  0, or
 * the exit status after the error. */
int eval_open(EvalSet **out, const gradc_program *sig, const char *target, const char *path);
void eval_free(EvalSet *e);
int64_t eval_samples(const EvalSet *e);
int64_t eval_micro(const EvalSet *e); /* samples per micro-batch (0: the model has no batch dim) */
int eval_gas(const EvalSet *e);       /* micro-batches in the window */
/* The losses over the dataset (loss[i] in the model's order, loss[nl] the
 * total) with the params of a file, or those of a session of a program with
 * the same params and buffers (a training session). */
int eval_run_params(EvalSet *e, const char *params, double *loss);
int eval_run_session(EvalSet *e, const gradc_session *from, double *loss);

/* ------------------------------------------------------------------ */
/* bench.c                                                             */
/* ------------------------------------------------------------------ */
/* `gradc bench MODEL ...`: argv[0] is "bench".  Returns the exit status
 * (0, 1 user error, 2 internal error). */
int cmd_bench(int argc, char **argv);
extern const char bench_help[];

/* ------------------------------------------------------------------ */
/* convert.c                                                           */
/* ------------------------------------------------------------------ */
/* `gradc convert SRC --map MAP -o OUT ...`: argv[0] is "convert". */
int cmd_convert(int argc, char **argv);
extern const char convert_help[];

/* ------------------------------------------------------------------ */
/* plot.c                                                              */
/* ------------------------------------------------------------------ */
typedef struct PlotSeries {
  const char *name;    /* legend entry */
  const double *x, *y; /* n points; non-finite y values break the line */
  int n;
  bool emphasis;       /* drawn thicker and dashed (e.g. the total) */
} PlotSeries;

/* Write a standalone SVG line chart (axes, ticks, grid, one polyline per
 * series, a legend) to path, atomically.  On failure writes "PATH: reason"
 * to err and returns false. */
bool plot_svg(const char *path, const char *title, const char *xlabel, const char *ylabel, const PlotSeries *s,
              int ns, char *err, size_t errlen);

#endif
