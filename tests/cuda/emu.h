// emu.h - a CUDA emulator for the host, just enough to run the kernels
// gradc generates (codegen/cuda*.c) on a machine without a GPU, so that
// tests can compare them with the reference interpreter.  The generated
// program is compiled as C++ after this header:
//
//   every CUDA thread of a block is a coroutine (ucontext) of one OS
//   thread, run round-robin; __syncthreads() and the warp shuffles are
//   barriers (the block's, or the warp's, live threads) at which a
//   coroutine yields until the others arrive; blocks run one after the
//   other, so __shared__ variables can be statics.  A thread that returns
//   leaves the barriers it would have joined (as on the hardware).
//   A deadlock (a barrier that cannot complete) aborts with a message.
//
// Launch with emu_launch(trampoline, args, grid, block.x, block.y), where
// the trampoline calls the kernel with args[i] cast to its parameters;
// emu_release() frees the coroutines' stacks.
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ucontext.h>

#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(n)
#define __restrict__ __restrict
#define __shared__ static

struct dim3 {
  unsigned x, y, z;
};
static dim3 threadIdx, blockIdx, blockDim, gridDim;

static inline float __int_as_float(int i) { float f; memcpy(&f, &i, 4); return f; }
static inline float __uint_as_float(unsigned i) { float f; memcpy(&f, &i, 4); return f; }
static inline unsigned __float_as_uint(float f) { unsigned i; memcpy(&i, &f, 4); return i; }
static inline double __longlong_as_double(long long i) { double d; memcpy(&d, &i, 8); return d; }

namespace emu {

enum { STACK = 64 << 10, MAXT = 1024 };

struct Fiber {
  ucontext_t ctx;
  bool done, waiting;
  int lane, warp;
  unsigned x, y;
};

static ucontext_t main_ctx;
static Fiber fibers[MAXT];
static char *stacks;
static int nthreads, cur;
static void (*body)(void **);
static void **body_args;
/* barriers: the block's and each warp's arrivals in this round */
static int block_arrived, warp_arrived[MAXT / 32], warp_live[MAXT / 32], block_live;
static unsigned long block_gen, warp_gen[MAXT / 32];
static unsigned long long xchg[MAXT / 32][32];

static void yield() { swapcontext(&fibers[cur].ctx, &main_ctx); }

static void entry() {
  body(body_args);
  Fiber &f = fibers[cur];
  f.done = true;
  block_live--;
  warp_live[f.warp]--;
  /* return to main_ctx through uc_link */
}

static void sync_block() {
  unsigned long g = block_gen;
  block_arrived++;
  fibers[cur].waiting = true;
  while (block_gen == g) yield();
}

static void sync_warp() {
  int w = fibers[cur].warp;
  unsigned long g = warp_gen[w];
  warp_arrived[w]++;
  fibers[cur].waiting = true;
  while (warp_gen[w] == g) yield();
}

/* Release the barriers everyone live has reached; false if none moved. */
static bool release() {
  bool moved = false;
  if (block_arrived > 0 && block_arrived == block_live) {
    block_arrived = 0;
    block_gen++;
    for (int t = 0; t < nthreads; t++) fibers[t].waiting = false;
    moved = true;
  }
  for (int w = 0; w * 32 < nthreads; w++)
    if (warp_arrived[w] > 0 && warp_arrived[w] == warp_live[w]) {
      warp_arrived[w] = 0;
      warp_gen[w]++;
      for (int t = w * 32; t < nthreads && t < w * 32 + 32; t++) fibers[t].waiting = false;
      moved = true;
    }
  return moved;
}

static void run_block() {
  for (int t = 0; t < nthreads; t++) {
    Fiber &f = fibers[t];
    f.done = f.waiting = false;
    getcontext(&f.ctx);
    f.ctx.uc_stack.ss_sp = stacks + (size_t)t * STACK;
    f.ctx.uc_stack.ss_size = STACK;
    f.ctx.uc_link = &main_ctx;
    makecontext(&f.ctx, entry, 0);
  }
  block_live = nthreads;
  block_arrived = 0;
  for (int w = 0; w * 32 < nthreads; w++) {
    warp_arrived[w] = 0;
    warp_live[w] = nthreads - w * 32 < 32 ? nthreads - w * 32 : 32;
  }
  for (;;) {
    bool ran = false;
    for (int t = 0; t < nthreads; t++) {
      Fiber &f = fibers[t];
      if (f.done || f.waiting) continue;
      cur = t;
      threadIdx.x = f.x, threadIdx.y = f.y, threadIdx.z = 0;
      swapcontext(&main_ctx, &f.ctx);
      ran = true;
    }
    if (block_live == 0) return;
    if (!release() && !ran) {
      fprintf(stderr, "emu: deadlock in block %u: %d threads live, %d at __syncthreads\n", blockIdx.x, block_live,
              block_arrived);
      abort();
    }
  }
}

} // namespace emu

static inline void __syncthreads() { emu::sync_block(); }

template <typename T> static inline T __shfl_xor_sync(unsigned mask, T v, int o) {
  (void)mask;
  emu::Fiber &f = emu::fibers[emu::cur];
  int w = f.warp, lane = f.lane;
  unsigned long long bits = 0;
  memcpy(&bits, &v, sizeof v);
  emu::xchg[w][lane] = bits;
  emu::sync_warp();
  T r;
  memcpy(&r, &emu::xchg[w][lane ^ o], sizeof r);
  emu::sync_warp();
  return r;
}

extern "C" void emu_launch(void (*tramp)(void **), void **args, unsigned grid, unsigned bx, unsigned by) {
  using namespace emu;
  if (!stacks) stacks = (char *)malloc((size_t)MAXT * STACK);
  nthreads = (int)(bx * by);
  if (nthreads > MAXT) {
    fprintf(stderr, "emu: %d threads a block\n", nthreads);
    abort();
  }
  for (int t = 0; t < nthreads; t++) {
    fibers[t].x = (unsigned)t % bx;
    fibers[t].y = (unsigned)t / bx;
    fibers[t].lane = t % 32;
    fibers[t].warp = t / 32;
  }
  body = tramp;
  body_args = args;
  blockDim.x = bx, blockDim.y = by, blockDim.z = 1;
  gridDim.x = grid, gridDim.y = gridDim.z = 1;
  for (unsigned b = 0; b < grid; b++) {
    blockIdx.x = b, blockIdx.y = blockIdx.z = 0;
    run_block();
  }
}

extern "C" void emu_release(void) {
  free(emu::stacks);
  emu::stacks = NULL;
}
