/* fuzz_artifact.c - fuzz target: loading an artifact (gradc_program_load:
 * the container, its metadata, the signature, the IR text, the back end)
 * refuses anything malformed with an error, and never crashes, hangs or
 * leaks.  Each input is loaded as it is, and again with its checksum made
 * right, so that mutations reach the sections behind the checksum; but
 * not one that carries object code (KOBJ, CUBN, PTX sections): the
 * checksum is what keeps corrupt code out, and code that passes it is as
 * trusted as a shared library (the JIT links it). */
#define _GNU_SOURCE /* memmem */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_file.h"
#include "gradc.h"
#include "support/support.h"

static void load(const uint8_t *data, size_t size) {
  gradc_program *p = NULL;
  gradc_status st = gradc_program_load(fuzz_file(".gca", data, size), &p);
  if (st == GRADC_OK) {
    if (!p) abort();
    gradc_program_free(p);
  } else if (p || !gradc_last_error()[0]) {
    abort(); /* a failure says why and returns nothing */
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  load(data, size);
  /* The container ends with an FNV-1a hash of everything before it. */
  bool code = memmem(data, size, "KOBJ", 4) || memmem(data, size, "CUBN", 4) || memmem(data, size, "PTX ", 4);
  if (size >= 24 && memcmp(data, "GRADCART", 8) == 0 && !code) {
    uint8_t *fixed = malloc(size);
    memcpy(fixed, data, size);
    uint64_t h = hash_bytes(fixed, size - 8, HASH_SEED);
    for (int i = 0; i < 8; i++) fixed[size - 8 + i] = (uint8_t)(h >> (8 * i));
    load(fixed, size);
    free(fixed);
  }
  return 0;
}
