/* cuda.h - the CUDA back end's code generator (DESIGN.md §6,
 * docs/BACKEND.md): every kernel of a planned function (after `fuse` and
 * `memplan`, the IR the LLVM generator consumes) becomes one CUDA C
 * function, compiled by NVRTC to cubin for one architecture, PTX kept as a
 * fallback.
 *
 *   cuda.c       kernels of a function, identical code shared, the program
 *                text (--print-kernels, --kernels-dir), NVRTC in parallel
 *                chunks with the on-disk cache
 *   cuda_row.c   row kernels: one block (or one warp) per row when the
 *                kernel reduces rows, else a grid-stride elementwise loop
 *   cuda_loop.c  kernels of one op that do not fit rows
 *   cuda_ops.c   the scalar layer: types, literals, loads and stores,
 *                elementwise ops, the prelude every program starts with
 *   cuda_nvrtc.c NVRTC, loaded with dlopen on first use
 *
 * A generated kernel addresses its data only through pointer arguments
 * (CuParam); shapes are compile-time constants.  So the kernels of the
 * layers of a deep model print the same code and are compiled once: a
 * CuCode is one distinct function, launched by every CuKernel whose code
 * it is. */
#ifndef GRADC_CUDA_H
#define GRADC_CUDA_H

#include "codegen/codegen.h"

/* One pointer argument of a kernel: the arena value, plus `elem` elements
 * (a slice's first element, so that slices at different offsets share
 * code).  Gradient buffers hold f32 (f64 for f64 values) and writes to
 * them accumulate. */
typedef struct CuParam {
  const IrValue *v;
  int64_t elem;
  bool out;  /* written by the kernel */
  bool grad; /* IR_STORE_GRAD */
} CuParam;

typedef struct CuKernel {
  int group;            /* the IrOp.group it implements */
  const char *name;     /* "k7_layer_norm_gelu" */
  int code;             /* its function: index into CuModule.codes; -1: nothing to do (no grid) */
  CuParam *params;      /* in the function's parameter order */
  int nparams;
  unsigned block[2];    /* threads per block (x, y) */
  int64_t grid;         /* blocks */
  IrOp **ops;           /* its ops (into the function's op list) */
  int nops;
} CuKernel;

typedef struct CuCode {
  const char *func;    /* the __global__ function's name: its first kernel's name */
  const char *comment; /* the IR region of its first kernel, the kernels sharing it */
  const char *text;    /* the function itself: pre, func, post */
  const char *pre, *post;
  int first;           /* its first kernel (index into CuModule.kernels) */
  int nkernels;        /* kernels that launch it */
  int chunk;           /* the NVRTC program it is compiled in */
  int line;            /* its first line in its chunk's source (1-based) */
} CuCode;

/* One NVRTC program's output. */
typedef struct CuImage {
  char *cubin; /* malloc'd; NULL when not compiled yet */
  size_t cubin_len;
  char *ptx; /* malloc'd, NUL-terminated */
  size_t ptx_len;
  bool from_cache;
} CuImage;

typedef struct CuModule {
  Arena a;
  const IrFunc *f;
  CuKernel *kernels; /* in op-list order */
  int nkernels;
  int *by_group;     /* group id -> kernel index, -1 (maxgroup + 1 entries) */
  int maxgroup;
  CuCode *codes;
  int ncodes;
  int nchunks;
  char arch[32];     /* set by cg_cuda_compile: "sm_90" */
  CuImage *images;   /* [nchunks], set by cg_cuda_compile */
  char *warnings;    /* NVRTC's logs of programs that compiled (malloc'd), NULL when there were none */
  int compiled;      /* chunks compiled by NVRTC (the others came from the cache) */
} CuModule;

/* ------------------------------------------------------------------ */
/* cuda.c                                                              */
/* ------------------------------------------------------------------ */
/* Generate the CUDA source of every kernel of a planned function (no
 * NVRTC).  NULL with a message on a function the generator cannot handle
 * (an internal error: exit status 2). */
CuModule *cg_cuda_generate(const IrFunc *f, char *err, size_t errlen);
void cg_cuda_free(CuModule *m);
/* The whole program as it is compiled: the prelude once, then every
 * distinct function with its comment (what --print-kernels shows). */
void cg_cuda_print(const CuModule *m, StrBuf *out);
/* The source of one NVRTC program (chunk): the prelude and its functions. */
void cg_cuda_chunk_source(const CuModule *m, int chunk, StrBuf *out);
/* One .cu file per distinct function, each compilable alone (the prelude
 * and the function), named after it: DIR/k7_layer_norm_gelu.cu. */
bool cg_cuda_write_dir(const CuModule *m, const char *dir, char *err, size_t errlen);
/* The kernel of a group (NULL if none). */
const CuKernel *cg_cuda_kernel(const CuModule *m, int group);

/* "cuda" or "cuda:sm_XX" (sm_ then digits and an optional letter, e.g.
 * sm_90a): false for anything else.  arch gets "sm_XX", or "" for plain
 * "cuda" (the caller picks: the present device's, else sm_80). */
bool cg_cuda_parse_target(const char *target, char *arch, size_t n);
#define CG_CUDA_DEFAULT_ARCH "sm_80"

typedef struct CuCompileOptions {
  const char *arch;      /* "sm_90" */
  const char *cache_dir; /* NULL: no cache */
  int threads;           /* NVRTC programs compiled at once; 0: every core */
} CuCompileOptions;

/* Compile every chunk with NVRTC (to cubin for o->arch, PTX kept), those
 * found in the cache (support/cache.c kind "cuda-img", keyed by the chunk's
 * source, the options, the NVRTC version and the architecture) excepted.
 * A compile error names the kernel and shows NVRTC's log. */
bool cg_cuda_compile(CuModule *m, const CuCompileOptions *o, char *err, size_t errlen);
/* Install images compiled earlier (an artifact) instead: nchunks images
 * for architecture arch, copied. */
bool cg_cuda_set_images(CuModule *m, const char *arch, const CuImage *img, int n, char *err, size_t errlen);
/* A hash of every chunk's source: what images must have been built from. */
uint64_t cg_cuda_source_hash(const CuModule *m);

/* ------------------------------------------------------------------ */
/* cuda_nvrtc.c                                                        */
/* ------------------------------------------------------------------ */
/* Load NVRTC (dlopen: $GRADC_NVRTC, then libnvrtc.so.13/.12/.11.2/.so in
 * the library path and the toolkit's directory).  False with a message
 * when there is none. */
bool cg_nvrtc_load(char *err, size_t errlen);
/* "nvrtc 13.0": the loaded NVRTC's version (loads it). */
bool cg_nvrtc_version(char *buf, size_t n, char *err, size_t errlen);
/* The same, when a cache directory is given without loading NVRTC if the
 * file loaded last time is unchanged (a small cache entry remembers it). */
bool cg_nvrtc_version_cached(const char *cache_dir, char *buf, size_t n, char *err, size_t errlen);
/* Whether NVRTC can compile for arch ("sm_90"); the supported ones in
 * `have` (e.g. "sm_75 sm_80 ..."). */
bool cg_nvrtc_supports(const char *arch, char *have, size_t n);
/* Compile one program.  On success img holds the cubin and the PTX and
 * *log NVRTC's log (malloc'd, "" when empty: warnings would be there).
 * On failure false, *log the log or a message. */
bool cg_nvrtc_compile(const char *src, const char *name, const char *const *opts, int nopts, CuImage *img,
                      char **log);
/* nvrtcCompileProgram calls so far in this process (tests count them). */
int cg_nvrtc_compile_calls(void);

#endif
