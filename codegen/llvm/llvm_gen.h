/* llvm_gen.h - internal to the LLVM code generator (codegen/llvm*.c): the
 * generator state and the helpers the kernel emitters share.
 *
 * Values are emitted as scalars of their "register type" (f32 and f64 as
 * float/double, bf16 and f16 as float rounded to their precision after
 * every op, i32 as i32, bool as i1); memory holds the "memory type" (bf16
 * and f16 as i16 bits, bool as i8).  Loops are vectorised by LLVM. */
#ifndef GRADC_LLVM_GEN_H
#define GRADC_LLVM_GEN_H

#include <llvm-c/Core.h>
#include <llvm-c/Error.h>
#include <llvm-c/TargetMachine.h>

#include "codegen/codegen.h"

#define GEN_EXACT_BF16 16 /* Gen.exact_bf16's ring */

typedef struct Gen {
  const IrFunc *f;
  LLVMContextRef ctx;
  LLVMModuleRef mod;
  LLVMTargetMachineRef tm; /* cg_module_begin's, freed by cg_module_finish */
  LLVMBuilderRef b;
  LLVMTypeRef t_void, t_i1, t_i8, t_i16, t_i32, t_i64, t_f32, t_f64, t_ptr;
  /* The kernel being emitted: void name(ptr arena, i64 begin, i64 end,
   * ptr offs), its buffers at constant offsets (offs unused and NULL), or
   * a body kernels share (offs set here) that finds buffer i (in
   * registration order) at arena + offs[i]. */
  LLVMValueRef fn, arena, begin, end, offs;
  LLVMBasicBlockRef entry; /* allocas and loop-invariant addresses go here */
  int group;
  /* Alias scopes of the kernel being emitted: one per set of overlapping
   * arena ranges it touches (gen_scopes_begin / gen_scope_add / ..._end). */
  struct GenScope {
    const IrValue *v;
    int64_t lo, hi; /* bytes */
    int cls;        /* its class: overlapping ranges share one */
  } *scopes;
  int nscopes, capscopes;
  LLVMValueRef *scope_md, *noalias_md; /* by class */
  int nclasses;
  char *err;
  size_t errlen;
  bool failed;
  /* The last registers known to hold a bf16 value exactly (gen_round's
   * results, bf16 loads): a bf16 store of one keeps its top half instead
   * of rounding again.  Reset for each kernel. */
  LLVMValueRef exact_bf16[GEN_EXACT_BF16];
  int nexact_bf16;
} Gen;

/* Record the first error (a value without storage, ...); emission goes on
 * harmlessly and the caller checks g->failed. */
/* llvm.c: an LLVMErrorRef consumed into "LLVM: what: message" (true when
 * there was none; errors are reported with support's errf). */
bool cg_check_llvm(LLVMErrorRef e, const char *what, char *err, size_t n);
/* A context whose diagnostic handler drops LLVM's remarks and warnings. */
LLVMContextRef cg_context_new(void);
/* mod as object code for tm, copied into *obj (malloc'd, *objlen bytes);
 * false with the reason in err. */
bool cg_emit_object(LLVMTargetMachineRef tm, LLVMModuleRef mod, char **obj, size_t *objlen, char *err, size_t n);
/* A module for the host CPU (its features; PIC, -O3 code generation) in a
 * fresh context, g's builder and types set; errors go to err.  False
 * (nothing to free) when there is no host target. */
bool cg_module_begin(Gen *g, const char *name, char *err, size_t n);
/* Verify, optimise (default<O3>, loop unrolling only when unroll; the
 * module printed to stderr when dump), emit object code to *obj, and free
 * what cg_module_begin made.  what names the module in a verifier error. */
bool cg_module_finish(Gen *g, const char *what, bool unroll, bool dump, char **obj, size_t *objlen);
void gen_error(Gen *g, const char *fmt, ...) GRADC_PRINTF(2, 3);

/* llvm_ops.c: types, constants, memory */
LLVMTypeRef gen_reg_type(Gen *g, IrDType dt);
LLVMTypeRef gen_mem_type(Gen *g, IrDType dt);
LLVMTypeRef gen_grad_type(Gen *g, IrDType dt); /* gradient buffers: f64 for f64 values, else f32 */
LLVMValueRef gen_const(Gen *g, IrDType dt, double v);
LLVMValueRef gen_i64(Gen *g, int64_t v);
/* Round a float register to dt's precision (bf16, f16); others unchanged. */
LLVMValueRef gen_round(Gen *g, LLVMValueRef x, IrDType dt);
/* Loads and stores of arena memory carry the alias scope of their buffer
 * (scope: a class from gen_scope_of, -1 for none). */
LLVMValueRef gen_load(Gen *g, LLVMValueRef ptr, IrDType dt, int scope);
/* Store x (register type) at ptr; accumulate (+=) into a gradient buffer. */
void gen_store(Gen *g, LLVMValueRef ptr, LLVMValueRef x, IrDType dt, bool grad, int scope);

/* Before emitting a kernel, register every arena value it reads or writes
 * (gen_kernel_buffers' order); gen_scopes_end builds one alias scope per
 * set of overlapping ranges, so the vectoriser needs no run-time overlap
 * checks between buffers that cannot overlap.  gen_scopes_free after the
 * kernel. */
void gen_scopes_begin(Gen *g);
void gen_scope_add(Gen *g, const IrValue *v);
void gen_scopes_end(Gen *g);
void gen_scopes_free(Gen *g);
int gen_scope_of(Gen *g, const IrValue *v); /* -1 if not registered */
/* The arena values a kernel touches, in a canonical order (layout slots,
 * or operands then result); returns the count (at most n + 1 + slots). */
int gen_kernel_buffers(IrOp **ops, int n, const KpRowLayout *l, const IrValue **out);
LLVMValueRef gen_alloca(Gen *g, LLVMTypeRef t, int64_t n); /* in the entry block */

/* A value in the arena (or an inlined const). */
typedef struct GenBuf {
  const IrValue *v;
  bool is_const;
  double cval;
  bool grad;         /* IR_STORE_GRAD: writes accumulate; elements are gen_grad_type */
  bool discard;      /* an output memplan gave no storage (nothing reads it): not written */
  int scope;         /* its alias scope class, or -1 */
  LLVMValueRef base; /* pointer to element 0 (built in the entry block) */
} GenBuf;
/* The arena buffer of v: checks that memplan gave it storage. */
GenBuf gen_buf(Gen *g, const IrValue *v);
/* The buffer of a kernel output; one without storage is discarded. */
GenBuf gen_buf_out(Gen *g, const IrValue *v);
LLVMTypeRef gen_buf_elem_type(Gen *g, const GenBuf *b);
LLVMValueRef gen_buf_ptr(Gen *g, const GenBuf *b, LLVMValueRef base, LLVMValueRef idx);
LLVMValueRef gen_buf_load(Gen *g, const GenBuf *b, LLVMValueRef idx);
void gen_buf_store(Gen *g, const GenBuf *b, LLVMValueRef idx, LLVMValueRef x);

/* Arithmetic helpers on registers. */
/* A call of an intrinsic overloaded on the types over[0..nover) (an error
 * through gen_error where LLVM has none of that name). */
LLVMValueRef gen_intrinsic(Gen *g, const char *name, LLVMTypeRef *over, int nover, LLVMValueRef *args, int nargs);
LLVMValueRef gen_call1(Gen *g, const char *intrinsic, LLVMValueRef x); /* "llvm.exp", overloaded on x */
LLVMValueRef gen_libm1(Gen *g, const char *fname, LLVMValueRef x);     /* "tanh": tanhf for float */
LLVMValueRef gen_exp(Gen *g, LLVMValueRef x); /* f32 inline (vectorisable), f64 libm */
LLVMValueRef gen_exp_nonpos(Gen *g, LLVMValueRef x); /* the same for x <= 0 (or NaN), cheaper */
LLVMValueRef gen_isnan(Gen *g, LLVMValueRef x);
LLVMValueRef gen_isfinite(Gen *g, LLVMValueRef x);
/* NaN-propagating running maximum (torch.amax), vectorisable. */
LLVMValueRef gen_max_step(Gen *g, LLVMValueRef m, LLVMValueRef x);
/* Sums accumulate in f64 for every float dtype (as the reference
 * interpreter, which rounds once at the end), in i32 for i32. */
LLVMTypeRef gen_acc_type(Gen *g, IrDType dt);
LLVMValueRef gen_widen(Gen *g, LLVMValueRef x);              /* float -> double; others unchanged */
LLVMValueRef gen_narrow(Gen *g, LLVMValueRef x, IrDType dt); /* back to dt's register, rounded */
/* a + b with reassociation allowed (a vectorisable reduction). */
LLVMValueRef gen_add_reassoc(Gen *g, LLVMValueRef a, LLVMValueRef b);
/* Convert a register of type `from` to `to` (cast semantics of the reference interpreter). */
LLVMValueRef gen_convert(Gen *g, LLVMValueRef x, IrDType from, IrDType to);
/* An elementwise op (kernel.c's elementwise set, broadcast, grad.seed,
 * loss.term, mse_loss "none") on operand registers; the result is rounded
 * to its dtype. */
LLVMValueRef gen_elementwise(Gen *g, const IrOp *op, LLVMValueRef *args);

/* Counted loops: for (iv = lo; iv < hi; iv++), hi > lo not required. */
typedef struct GenLoop {
  LLVMBasicBlockRef pre, head, exit;
  LLVMValueRef iv;
  LLVMValueRef hi;
} GenLoop;
void gen_loop_begin(Gen *g, GenLoop *l, LLVMValueRef lo, LLVMValueRef hi, const char *name);
void gen_loop_end(Gen *g, GenLoop *l);
/* Accumulators live in entry-block allocas (promoted to registers by SROA). */
typedef struct GenAcc {
  LLVMValueRef slot;
  LLVMTypeRef t;
} GenAcc;
GenAcc gen_acc(Gen *g, LLVMTypeRef t);
void gen_acc_set(Gen *g, GenAcc a, LLVMValueRef v);
LLVMValueRef gen_acc_get(Gen *g, GenAcc a);

/* llvm_random.c: the draw of a `random` op for element e (i64, row-major
 * in its result), in the result's register type. */
LLVMValueRef gen_random(Gen *g, const IrOp *op, LLVMValueRef e);

/* llvm_row.c / llvm_loop.c: emit the body of g->fn (positioned at the end
 * of its entry block) for one kernel. */
void gen_row_kernel(Gen *g, IrOp **ops, int n, const KpRowLayout *l);
/* Rows one parallel iteration of that row kernel covers (its group, or the
 * rows it runs side by side). */
int64_t gen_row_unit(IrOp **ops, int n, const KpRowLayout *l);
void gen_loop_kernel(Gen *g, const IrOp *op);
/* Iterations and cost without emitting anything (also for loading objects). */
void gen_kernel_extent(const IrFunc *f, IrOp **ops, int n, const KpRowLayout *l, int64_t *iters, int64_t *cost);
/* llvm_bmm.c: a batch of small products (passes/kernel_bmm.c's plan) as
 * the body of g->fn; its iterations are the batch's matrices. */
void gen_bmm_kernel(Gen *g, const KpBmm *p);
/* A product kernel's iterations, their cost, and what a call costs before
 * them (a single product's panel of B, copied once a call). */
void gen_bmm_extent(const KpBmm *p, int64_t *iters, int64_t *cost, int64_t *setup);
/* llvm.c: whether the host has AVX-512F (vectors of 16 floats, 32 registers). */
bool gen_host_avx512(void);

#endif
