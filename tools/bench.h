/* bench.h - `gradc bench` (tools/bench.c), called from gradc.c's dispatch. */
#ifndef GRADC_BENCH_H
#define GRADC_BENCH_H

/* `gradc bench MODEL ...`: argv[0] is "bench".  Returns the exit status
 * (0, 1 user error, 2 internal error). */
int cmd_bench(int argc, char **argv);
extern const char bench_help[];

#endif
