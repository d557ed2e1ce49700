/* fuzz_gdl.c - fuzz target: the .gdl frontend must never crash, hang or
 * leak, whatever the input; errors are diagnostics. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "frontend/frontend.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char *text = malloc(size + 1);
  memcpy(text, data, size);
  text[size] = 0;
  SrcFile src = {"fuzz.gdl", text, size};
  Diag d;
  diag_init(&d, NULL);
  d.quiet = true;
  for (int gas = 1; gas <= 2; gas++) {
    FeOptions o = {.gas = gas, .dp = 1};
    FeModel *m = fe_model_compile(&src, &o, &d);
    if (m) {
      char err[512];
      if (!ir_verify(m->func, err, sizeof err)) abort(); /* the frontend built invalid IR */
    }
    fe_model_free(m);
  }
  diag_free(&d);
  free(text);
  return 0;
}
