/* tools.h - the command line's pieces that live outside gradc.c: flag
 * values (common.c), the training loop and dataset writer (train.c),
 * `gradc bench` (bench.c) and the SVG plot writer (plot.c).  The commands
 * use include/gradc.h and api/cli.h, nothing below them. */
#ifndef GRADC_TOOLS_H
#define GRADC_TOOLS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gradc.h"

/* ------------------------------------------------------------------ */
/* common.c                                                            */
/* ------------------------------------------------------------------ */
/* "--flag=value" or "--flag value" at argv[*i] (advancing *i past the
 * value): the value, or NULL when argv[*i] is not the flag, or (setting
 * *missing when missing is given) when its value is absent. */
const char *tools_flag_value(int argc, char **argv, int *i, const char *flag, bool *missing);
bool tools_parse_i64(const char *s, int64_t *out); /* the whole string, base 10 */
bool tools_parse_f64(const char *s, double *out);  /* the whole string, finite */
/* --link-latency-us / --link-gbps: a simulated slow link between ranks,
 * handed to the comm layer through GRADC_COMM_LATENCY_US / GRADC_COMM_GBPS
 * (docs/DISTRIBUTED.md) before it starts.  Values <= 0 leave them alone. */
void tools_set_link(double latency_us, double gbps);
/* Wall-clock milliseconds (CLOCK_MONOTONIC). */
double tools_now_ms(void);

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
/* bench.c                                                             */
/* ------------------------------------------------------------------ */
/* `gradc bench MODEL ...`: argv[0] is "bench".  Returns the exit status
 * (0, 1 user error, 2 internal error). */
int cmd_bench(int argc, char **argv);
extern const char bench_help[];

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
