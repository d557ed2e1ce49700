/* backends.h - the op tests' one adapter onto the library's internals:
 * building a case's function, the reference interpreter, planning by hand,
 * the CPU (LLVM) back end, the CUDA back end under the host emulator
 * (tests/cuda/emu.h), and autodiff with finite differences.  test_ops.c
 * and the back ends' unit tests (test_codegen.c, test_cuda.c) reach the
 * library's kernels only through these functions, so a rename there is
 * fixed here once.
 *
 * Checks return false with a message in err (the first mismatches and the
 * largest error, ggml/llm.c style); the callers decide whether to stop. */
#ifndef GRADC_TEST_OPS_BACKENDS_H
#define GRADC_TEST_OPS_BACKENDS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cases.h"
#include "ir/ir.h"

/* ---- the op table ---- */
const char *ot_op_name(IrOpcode op);
/* Whether a gradient flows through op (its derivative column is not `none`). */
bool ot_op_has_derivative(IrOpcode op);
/* Its kind column ("ELEMENTWISE", "REDUCE", ...). */
const char *ot_op_kind(IrOpcode op);

IrFunc *ot_func_new(const char *name);
void ot_func_free(IrFunc *f);

/* ---- argument values, as doubles, by argument index ---- */
typedef struct OtInputs {
  double **a;
  int n, cap;
} OtInputs;

/* Random values for every argument of f: normal floats, integers from
 * rt_random_inputs' rule (indices in range) for inputs, else in [-2, 2]. */
OtInputs ot_inputs_random(const IrFunc *f, uint64_t seed);
void ot_inputs_free(OtInputs *in);
/* The values of argument `name` (fails the test if there is none). */
double *ot_arg(OtInputs *in, const IrFunc *f, const char *name);

/* ---- building cases ---- */
/* Append case c (row `row` of the table) to f: its operands as new inputs
 * (with their values and edge values in *in), or, with share, as inputs
 * shared with earlier rows of the same operand type and position; the op;
 * a reader that keeps its result a kernel output.  Returns the op's result,
 * or NULL with a message in err. */
IrValue *ot_case_emit(IrFunc *f, const OpCase *c, int row, bool share, OtInputs *in, char *err, size_t n);

/* ---- grouping, planning, passes ---- */
void ot_one_kernel_per_op(IrFunc *f);     /* every op outside the executor's set its own kernel */
void ot_trivial_plan(IrFunc *f);          /* every value its own slot; values read by `grad` gradient buffers */
/* cuda: with the CUDA back end's PassOptions (no_inplace, no_colsums). */
bool ot_passes(IrFunc *f, const char *const *names, int n, bool cuda, char *err, size_t errlen);
bool ot_verify(IrFunc *f, char *err, size_t errlen);

/* ---- elements in an arena (a value's storage, dtype, offset) ---- */
size_t ot_elem_size(const IrValue *v);
void ot_put(char *arena, const IrValue *v, int64_t i, double x);
double ot_get(const char *arena, const IrValue *v, int64_t i);
double ot_grad_prefill(int64_t i); /* what gradient buffers hold before a kernel adds to them */
uint16_t ot_f16_bits(double v);     /* v representable in f16 */
double ot_f16_value(uint16_t h);

/* ---- comparing with the interpreter ---- */
/* Relative tolerance by dtype, and the share of the tensor's largest |want|
 * below which an element's error is taken relative to that share. */
typedef struct OtTol {
  double f32, f64, bf16, f16, share_f32, share;
} OtTol;
extern const OtTol ot_tol_cpu, ot_tol_cuda;

typedef struct OtStats {
  int kernels, outputs, failed;
  double worst; /* largest error relative to its tolerance */
} OtStats;

/* Compare v (in arena; gradient buffers less their prefill) with want;
 * counts the output in st (may be NULL). */
bool ot_compare(const char *what, const char *kernel, const IrValue *v, const char *arena, const double *want,
                const OtTol *tol, OtStats *st, char *err, size_t errlen);

/* ---- the CPU back end ---- */
bool ot_cpu_available(void);
/* Compile a grouped, planned f and run each kernel on its own: inputs from
 * the interpreter, outputs prefilled with garbage (gradient buffers with
 * ot_grad_prefill), the kernel run over its iterations in two pieces, and
 * every output compared with the interpreter.  Every mismatching output is
 * reported (in err, while it has room), not only the first.  The result
 * of a case's op is named %r<row>, so a message names its row. */
bool ot_cpu_check(IrFunc *f, OtInputs *in, const char *what, OtStats *st, char *err, size_t errlen);

/* ---- the CUDA back end under the host emulator ---- */
/* Whether the emulator can run here (the CUDA generator is built and a
 * C++ compiler is found); if not, why. */
bool ot_emu_available(char *why, size_t n);
typedef struct OtEmu OtEmu;
/* Generate the CUDA C of every function (grouped, planned) and compile it
 * all into one emulated program. */
OtEmu *ot_emu_build(IrFunc *const *fs, const char *const *names, int n, char *err, size_t errlen);
/* Run every kernel of function c as ot_cpu_check does. */
bool ot_emu_check(OtEmu *e, int c, OtInputs *in, OtStats *st, char *err, size_t errlen);
void ot_emu_free(OtEmu *e);

/* ---- derivatives ---- */
/* Case c rebuilt in f64 (float operands params, integer ones inputs), the
 * objective sum(y * R) for a random R (OC_GRAD_SOFTMAX: sum(softmax(y) *
 * R)), autodiff, and every param's gradient on the interpreter (exact
 * f64) against central differences (h = 1e-6, relative error of the norm
 * below 1e-6; at most 48 elements of each param are perturbed).  Also
 * fails on a backward op whose value nothing reads and on a gradient not
 * named d<param>.  *checked: the params checked. */
bool ot_gradcheck(const OpCase *c, uint64_t seed, int *checked, char *err, size_t errlen);

/* The interpreter's values of f (a step; window sums from a count phase). */
typedef struct OtRef {
  double **val; /* by value id */
  void *state;
} OtRef;
bool ot_ref_run(IrFunc *f, OtInputs *in, OtRef *out, char *err, size_t errlen);
void ot_ref_free(OtRef *r);

#endif
