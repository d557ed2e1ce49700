/* cuda.h - the CUDA runtime (DESIGN.md §6, docs/BACKEND.md): a planned
 * function's kernels compiled by codegen/cuda*.c, run on one device.
 *
 *   cuda_drv.c   the driver API (libcuda.so.1), loaded with dlopen on first
 *                use; device discovery ("no CUDA device")
 *   cuda_blas.c  GEMMs through cuBLASLt (libcublasLt.so, dlopen)
 *   cuda_exec.c  the program: one arena of device memory, the step's
 *                launches on a stream (captured into a CUDA graph after
 *                the first micro-batch), windows of K micro-batches,
 *                artifacts (cubin + PTX)
 *
 * Nothing here includes a CUDA header: the few types and functions used
 * are declared below, so the build needs no toolkit, and a CPU run never
 * maps the CUDA libraries. */
#ifndef GRADC_RUNTIME_CUDA_H
#define GRADC_RUNTIME_CUDA_H

#include "codegen/cuda/cuda.h"
#include "runtime/io/artifact.h"
#include "runtime/runtime.h"

typedef struct CudaOptions {
  const char *arch;      /* "sm_90"; NULL or "": the present device's, else sm_80 */
  const char *cache_dir; /* NVRTC output cache (NULL: none) */
  int threads;           /* NVRTC programs compiled at once (0: every core) */
  bool allow_tf32;       /* f32 GEMMs may use TF32 (--allow-tf32) */
} CudaOptions;

typedef struct CudaProgram CudaProgram;

/* ------------------------------------------------------------------ */
/* cuda_exec.c                                                         */
/* ------------------------------------------------------------------ */
/* Generate and compile the kernels of a function after the CPU pipeline
 * (fuse, memplan); no device is needed until the first step.  NULL with a
 * message in err (no NVRTC, a kernel NVRTC rejects: internal errors). */
CudaProgram *cuda_program_new(IrFunc *f, const CudaOptions *o, char *err, size_t errlen);
/* The kernels generated and every op checked (what each runs as, each
 * GEMM's cuBLASLt description), without NVRTC: cuda_program_new's first
 * half, for tests. */
CudaProgram *cuda_program_plan(IrFunc *f, const CudaOptions *o, char *err, size_t errlen);
/* The same from an artifact's compiled images (no NVRTC). */
CudaProgram *cuda_program_load(IrFunc *f, const ArtFile *a, const CudaOptions *o, char *err, size_t errlen);
/* Append the compiled images to an artifact: one "CUDA" section (JSON:
 * architecture, chunks, source hash) and per chunk "CUBN" and "PTX "
 * sections named by the chunk's number. */
bool cuda_program_save(const CudaProgram *p, ArtFile *a, char *err, size_t errlen);
const CuModule *cuda_program_module(const CudaProgram *p);
/* Let f32 GEMMs use TF32 (--allow-tf32); before the first step. */
void cuda_program_allow_tf32(CudaProgram *p, bool on);
/* Run one window on the device, with step_run_ref's checks, errors and
 * results; "no CUDA device" without one.  With $GRADC_CUDA_TIMING set, a
 * line on stderr gives the time of the micro-batches' launches on the
 * device (without the copies of params, inputs and gradients). */
bool cuda_step_run(CudaProgram *p, int gas, const StFile *params, const char *params_path, const StFile *inputs,
                   const char *inputs_path, StepResult *out, char *err, size_t errlen);
/* Time the window's GEMMs alone (gemm_floor_ms of `gradc bench`): gas
 * passes over every GEMM per window, reps windows after a warm-up, ms per
 * window into ms[reps]. */
bool cuda_gemm_floor(CudaProgram *p, int gas, int reps, double *ms, char *err, size_t errlen);
void cuda_program_free(CudaProgram *p);

/* ------------------------------------------------------------------ */
/* cuda_drv.c                                                          */
/* ------------------------------------------------------------------ */
/* Whether a CUDA device can be used; false with "no CUDA device" (or the
 * driver's complaint) in err. */
bool cuda_device_available(char *err, size_t errlen);
/* "sm_90": device 0's architecture; false without a device. */
bool cuda_device_arch(char *arch, size_t n);

/* Internal to runtime/cuda*.c: the driver API, as declared by cuda.h. */
typedef int CUresult; /* CUDA_SUCCESS = 0 */
typedef int CUdevice;
typedef struct CUctx_st *CUcontext;
typedef struct CUmod_st *CUmodule;
typedef struct CUfunc_st *CUfunction;
typedef struct CUstream_st *CUstream;
typedef struct CUgraph_st *CUgraph;
typedef struct CUgraphExec_st *CUgraphExec;
typedef unsigned long long CUdeviceptr;

typedef struct CudaDriver {
  CUresult (*Init)(unsigned);
  CUresult (*DeviceGetCount)(int *);
  CUresult (*DeviceGet)(CUdevice *, int);
  CUresult (*DeviceGetAttribute)(int *, int, CUdevice);
  CUresult (*DeviceGetName)(char *, int, CUdevice);
  CUresult (*DevicePrimaryCtxRetain)(CUcontext *, CUdevice);
  CUresult (*CtxSetCurrent)(CUcontext);
  CUresult (*ModuleLoadData)(CUmodule *, const void *);
  CUresult (*ModuleUnload)(CUmodule);
  CUresult (*ModuleGetFunction)(CUfunction *, CUmodule, const char *);
  CUresult (*MemAlloc)(CUdeviceptr *, size_t);
  CUresult (*MemFree)(CUdeviceptr);
  CUresult (*MemcpyHtoD)(CUdeviceptr, const void *, size_t);
  CUresult (*MemcpyDtoH)(void *, CUdeviceptr, size_t);
  CUresult (*MemsetD8)(CUdeviceptr, unsigned char, size_t);
  CUresult (*MemcpyDtoDAsync)(CUdeviceptr, CUdeviceptr, size_t, CUstream);
  CUresult (*StreamCreate)(CUstream *, unsigned);
  CUresult (*StreamDestroy)(CUstream);
  CUresult (*StreamSynchronize)(CUstream);
  CUresult (*LaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream,
                           void **, void **);
  CUresult (*StreamBeginCapture)(CUstream, int);
  CUresult (*StreamEndCapture)(CUstream, CUgraph *);
  CUresult (*GraphInstantiate)(CUgraphExec *, CUgraph, unsigned long long);
  CUresult (*GraphLaunch)(CUgraphExec, CUstream);
  CUresult (*GraphExecDestroy)(CUgraphExec);
  CUresult (*GraphDestroy)(CUgraph);
  CUresult (*GetErrorString)(CUresult, const char **);
  CUdevice dev;   /* device 0 */
  CUcontext ctx;  /* its primary context (shared with cuBLASLt's runtime) */
  int sms;        /* multiprocessors */
} CudaDriver;

/* The driver with device 0's primary context current on this thread;
 * NULL with "no CUDA device" (or why the driver cannot be used). */
const CudaDriver *cuda_driver(char *err, size_t errlen);
/* false with "CUDA: what: the driver's message" when r is an error. */
bool cuda_check(CUresult r, const char *what, char *err, size_t errlen);

/* ------------------------------------------------------------------ */
/* cuda_blas.c                                                         */
/* ------------------------------------------------------------------ */
/* One matmul op planned for cuBLASLt, as the CPU executor plans it
 * (runtime/exec.c): f32/f64 operands and results are strided views of
 * stored values (codegen/kernel.c's kp_views_find), bf16/f16 ones are
 * contiguous with transposes as flags. */
typedef struct CudaGemm CudaGemm;

/* A matrix as cuBLASLt sees it: column-major rows x cols, leading
 * dimension ld, stride (elements) between the matrices of a batch. */
typedef struct CudaGemmMat {
  uint64_t rows, cols;
  int64_t ld, stride;
} CudaGemmMat;

/* What a GEMM hands cuBLASLt, without cuBLASLt (so that tests can run it
 * on the host): C^T = B^T A^T in column-major terms (cuBLASLt's A is the
 * op's B) when C is stored by rows, C = A B when it is stored by columns;
 * layouts describe the stored matrices, opa and opb whether to transpose
 * them.  `calls` strided batches of `batch` matrices each, at byte offsets
 * in the arena. */
typedef struct CudaGemmDesc {
  const struct IrOp *op;
  int32_t opa, opb;         /* 0: as stored, 1: transposed (cublasOperation_t) */
  CudaGemmMat a, b, c;      /* cuBLASLt's A, B and C (= D) */
  int64_t m, n, k;          /* its C is m x n */
  int64_t batch, calls;
  int64_t *aoff, *boff, *coff; /* per call: the first matrices' byte offsets (malloc'd) */
  int in, out;              /* cudaDataType of A and B, of C */
  int compute, scale;       /* cublasComputeType_t, cudaDataType of alpha and beta */
  bool dbl, accumulate;     /* f64; beta = 1 (a gradient buffer) */
  uint32_t align_a, align_b, align_c; /* bytes every pointer keeps */
} CudaGemmDesc;
bool cuda_gemm_describe(const KpViews *vs, const IrOp *op, bool allow_tf32, CudaGemmDesc *d, char *err,
                        size_t errlen);
void cuda_gemm_desc_free(CudaGemmDesc *d);
/* Plan every group-0 matmul of f (after memplan) for the device; arena is
 * the device arena's base.  NULL with a message (no cuBLASLt, a GEMM it
 * cannot do). */
CudaGemm *cuda_gemm_plan(const IrFunc *f, const KpViews *vs, CUdeviceptr arena, bool allow_tf32, int *n, char *err,
                         size_t errlen);
/* Enqueue GEMM i on the stream. */
bool cuda_gemm_run(CudaGemm *g, int i, CUstream s, char *err, size_t errlen);
/* The op GEMM i implements. */
const IrOp *cuda_gemm_op(const CudaGemm *g, int i);
void cuda_gemm_free(CudaGemm *g, int n);

#endif
