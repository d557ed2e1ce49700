/* cuda_drv.c - the CUDA driver API (libcuda.so.1, installed with the GPU
 * driver), loaded with dlopen on first use so that a CPU run never maps
 * it.  Device 0 is used, through its primary context, which the CUDA
 * runtime inside cuBLASLt shares.  Every call is checked; failures are
 * messages, never exits. */
#include <dlfcn.h>
#include <pthread.h>
#include <string.h>

#include "cuda.h"

enum {
  CUDA_ERROR_NO_DEVICE = 100,
  ATTR_MULTIPROCESSOR_COUNT = 16,
  ATTR_CC_MAJOR = 75,
  ATTR_CC_MINOR = 76,
};

static CudaDriver drv;
static bool drv_ok;
static char drv_error[512];
static pthread_once_t once = PTHREAD_ONCE_INIT;

bool cuda_check(CUresult r, const char *what, char *err, size_t errlen) {
  if (r == 0) return true;
  const char *msg = NULL;
  if (drv.GetErrorString) drv.GetErrorString(r, &msg);
  if (err && errlen) snprintf(err, errlen, "CUDA: %s: %s (error %d)", what, msg ? msg : "unknown error", r);
  return false;
}

static void load(void) {
  void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    snprintf(drv_error, sizeof drv_error, "no CUDA device");
    return;
  }
  struct {
    void **slot;
    const char *name;
  } syms[] = {
      {(void **)&drv.Init, "cuInit"},
      {(void **)&drv.DeviceGetCount, "cuDeviceGetCount"},
      {(void **)&drv.DeviceGet, "cuDeviceGet"},
      {(void **)&drv.DeviceGetAttribute, "cuDeviceGetAttribute"},
      {(void **)&drv.DeviceGetName, "cuDeviceGetName"},
      {(void **)&drv.DevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain"},
      {(void **)&drv.CtxSetCurrent, "cuCtxSetCurrent"},
      {(void **)&drv.ModuleLoadData, "cuModuleLoadData"},
      {(void **)&drv.ModuleUnload, "cuModuleUnload"},
      {(void **)&drv.ModuleGetFunction, "cuModuleGetFunction"},
      {(void **)&drv.MemAlloc, "cuMemAlloc_v2"},
      {(void **)&drv.MemFree, "cuMemFree_v2"},
      {(void **)&drv.MemcpyHtoD, "cuMemcpyHtoD_v2"},
      {(void **)&drv.MemcpyDtoH, "cuMemcpyDtoH_v2"},
      {(void **)&drv.MemsetD8, "cuMemsetD8_v2"},
      {(void **)&drv.MemcpyDtoDAsync, "cuMemcpyDtoDAsync_v2"},
      {(void **)&drv.StreamCreate, "cuStreamCreate"},
      {(void **)&drv.StreamDestroy, "cuStreamDestroy_v2"},
      {(void **)&drv.StreamSynchronize, "cuStreamSynchronize"},
      {(void **)&drv.LaunchKernel, "cuLaunchKernel"},
      {(void **)&drv.StreamBeginCapture, "cuStreamBeginCapture_v2"},
      {(void **)&drv.StreamEndCapture, "cuStreamEndCapture"},
      {(void **)&drv.GraphInstantiate, "cuGraphInstantiateWithFlags"},
      {(void **)&drv.GraphLaunch, "cuGraphLaunch"},
      {(void **)&drv.GraphExecDestroy, "cuGraphExecDestroy"},
      {(void **)&drv.GraphDestroy, "cuGraphDestroy"},
      {(void **)&drv.GetErrorString, "cuGetErrorString"},
  };
  for (size_t i = 0; i < sizeof syms / sizeof syms[0]; i++) {
    *syms[i].slot = dlsym(h, syms[i].name);
    if (!*syms[i].slot) {
      snprintf(drv_error, sizeof drv_error, "CUDA: the driver has no %s (a driver for CUDA 12 or newer is needed)",
               syms[i].name);
      dlclose(h);
      memset(&drv, 0, sizeof drv);
      return;
    }
  }
  int n = 0;
  CUresult r = drv.Init(0);
  if (r == CUDA_ERROR_NO_DEVICE || (r == 0 && (drv.DeviceGetCount(&n) != 0 || n == 0))) {
    snprintf(drv_error, sizeof drv_error, "no CUDA device");
    return;
  }
  if (!cuda_check(r, "cuInit", drv_error, sizeof drv_error) ||
      !cuda_check(drv.DeviceGet(&drv.dev, 0), "cuDeviceGet", drv_error, sizeof drv_error) ||
      !cuda_check(drv.DevicePrimaryCtxRetain(&drv.ctx, drv.dev), "cuDevicePrimaryCtxRetain", drv_error,
                  sizeof drv_error) ||
      !cuda_check(drv.DeviceGetAttribute(&drv.sms, ATTR_MULTIPROCESSOR_COUNT, drv.dev), "cuDeviceGetAttribute",
                  drv_error, sizeof drv_error))
    return;
  drv_ok = true;
}

const CudaDriver *cuda_driver(char *err, size_t errlen) {
  pthread_once(&once, load);
  if (!drv_ok) {
    if (err && errlen) snprintf(err, errlen, "%s", drv_error);
    return NULL;
  }
  if (!cuda_check(drv.CtxSetCurrent(drv.ctx), "cuCtxSetCurrent", err, errlen)) return NULL;
  return &drv;
}

bool cuda_device_available(char *err, size_t errlen) { return cuda_driver(err, errlen) != NULL; }

bool cuda_device_arch(char *arch, size_t n) {
  const CudaDriver *d = cuda_driver(NULL, 0);
  int major = 0, minor = 0;
  if (!d || d->DeviceGetAttribute(&major, ATTR_CC_MAJOR, d->dev) != 0 ||
      d->DeviceGetAttribute(&minor, ATTR_CC_MINOR, d->dev) != 0)
    return false;
  snprintf(arch, n, "sm_%d%d", major, minor);
  return true;
}
