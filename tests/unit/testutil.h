/* testutil.h - helpers shared by the unit tests. */
#ifndef GRADC_TESTUTIL_H
#define GRADC_TESTUTIL_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "frontend/frontend.h"
#include "ir/ir.h"

/* Path of a file in the source tree (static buffer, valid until next call). */
const char *tu_path(const char *rel);
/* Whole file from the source tree (malloc'd); fails the test if unreadable. */
char *tu_read(const char *rel);
/* Whole file `name` of directory dir, a test's scratch directory (malloc'd);
 * fails the test if unreadable. */
char *tu_read_in(const char *dir, const char *name);
/* Compile model text (named `name` in diagnostics) with K = gas; diagnostics
 * are kept in d (quiet).  Returns NULL on errors. */
FeModel *tu_compile(const char *name, const char *text, int gas, Diag *d);
/* Run a shell command (printf-style): its exit status (-1 if it did not
 * exit); its stdout and stderr together in out (n bytes, NUL-terminated). */
int tu_sh(char *out, size_t n, const char *fmt, ...) GRADC_PRINTF(3, 4);
/* The same with stdout in out and stderr apart in err (m bytes). */
int tu_sh_err(char *out, size_t n, char *err, size_t m, const char *fmt, ...) GRADC_PRINTF(5, 6);
/* Run the gradc binary under test with these arguments (printf-style);
 * fails the test with what it printed unless it exits 0. */
void tu_gradc(const char *fmt, ...) GRADC_PRINTF(1, 2);
/* Remove the directory dir and everything in it (a test's scratch files). */
void tu_rm_rf(const char *dir);
/* In cgroup v1's hierarchy at /sys/fs/cgroup/HIERARCHY: a cgroup whose
 * files get the given texts (files[i] = texts[i]) and a child cgroup
 * without any; a child process moved into the inner one runs child() and
 * exits with what it returns (0-254).  Returns that status; -1 (with a
 * note) where this machine does not let the test make cgroups, -2 when
 * the set-up failed after the cgroup was made. */
int tu_in_cgroup(const char *hierarchy, const char *const *files, const char *const *texts, int nfiles,
                 int (*child)(void));

#endif
