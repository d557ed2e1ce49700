/* fuzz_safetensors.c - fuzz target: the safetensors reader refuses any
 * malformed file with a message that names it, and never crashes, hangs or
 * leaks; what it accepts holds together (every tensor's bytes match its
 * dtype and shape, its data lies inside the file, its name has no control
 * character). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/runtime.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  StFile f;
  char err[1024];
  if (!st_parse("fuzz.safetensors", data, size, &f, err, sizeof err)) {
    if (strncmp(err, "fuzz.safetensors: ", 18) != 0) abort(); /* the message names the file */
    return 0;
  }
  for (int i = 0; i < f.n; i++) {
    const StTensor *t = &f.t[i];
    if (t->rank < 0 || t->rank > 8) abort();
    if ((uint64_t)st_numel(t) * st_dtype_size(t->dtype) != t->nbytes || t->nbytes > size) abort();
    for (const unsigned char *c = (const unsigned char *)t->name; *c; c++)
      if (*c < 0x20 || *c == 0x7f) abort();
    volatile unsigned char sum = 0; /* touch every byte: ASan checks the bounds */
    for (size_t k = 0; k < t->nbytes; k++) sum ^= ((const unsigned char *)t->data)[k];
    (void)sum;
  }
  st_free(&f);
  return 0;
}
