/* backend.c - the registry of compute back ends (backend.h): which back
 * end runs each target in this build.  The one place that asks which
 * optional back ends were built in. */
#include <stdio.h>
#include <string.h>

#include "runtime/backend.h"

typedef struct Entry {
  const char *target; /* as the messages spell it */
  const Backend *b;
} Entry;

static const Entry registry[] = {
#ifdef GRADC_HAVE_LLVM
    {"cpu", &rt_backend_cpu},
#else
    {"cpu", &rt_backend_ref}, /* no LLVM for kernels: the interpreter, so the default target works everywhere */
#endif
    {"ref", &rt_backend_ref},
#ifdef GRADC_HAVE_CUDA
    {"cuda[:sm_XX]", &rt_backend_cuda},
#endif
};

enum { NENTRIES = sizeof registry / sizeof registry[0] };

const Backend *rt_backend_find(const char *target) {
  for (int i = 0; target && i < NENTRIES; i++) {
    const Entry *e = &registry[i];
    if (e->b->accepts ? e->b->accepts(target) : strcmp(e->target, target) == 0) return e->b;
  }
  return NULL;
}

char *rt_backend_targets(char *buf, size_t n) {
  size_t k = 0;
  buf[0] = 0;
  for (int i = 0; i < NENTRIES && k < n; i++)
    k += (size_t)snprintf(buf + k, n - k, "%s%s", i ? ", " : "", registry[i].target);
  return buf;
}
