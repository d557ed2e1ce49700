/* fuzz_checkpoint.c - fuzz target: loading a checkpoint (and the same file
 * as params) into a session of a small model refuses anything malformed
 * or foreign with an error, and never crashes, hangs or leaks; a
 * checkpoint it accepts leaves the session able to run a window. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_file.h"
#include "gradc.h"

/* The model the seed checkpoints were written for (tests/fuzz/corpus/checkpoint). */
static const char model[] =
    "model tiny {\n"
    "  batch B = 4\n"
    "  dim D = 6\n"
    "  dim H = 8\n"
    "  input x : f32[B, D]\n"
    "  input y : i32[B]\n"
    "  param W1 : f32[D, H] init normal(0, 0.5)\n"
    "  param b1 : f32[H]\n"
    "  param W2 : f32[H, 3] init normal(0, 0.5)\n"
    "  loss ce = cross_entropy(relu(x @ W1 + b1) @ W2, y)\n"
    "}\n";

static gradc_program *program(void) {
  static gradc_program *p;
  if (!p) {
    gradc_compile_options o;
    gradc_compile_options_init(&o);
    o.target = "ref";
    if (gradc_program_compile_source("tiny.gdl", model, &o, &p) != GRADC_OK) abort();
  }
  return p;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const char *path = fuzz_file(".safetensors", data, size);
  gradc_session *s;
  if (gradc_session_new(program(), &s) != GRADC_OK) abort();
  if (gradc_session_load_checkpoint(s, path) == GRADC_OK) {
    static const float x[24];
    static const int32_t y[4];
    if (gradc_session_set_input(s, "x", GRADC_F32, x, 24) != GRADC_OK ||
        gradc_session_set_input(s, "y", GRADC_I32, y, 4) != GRADC_OK)
      abort();
    (void)gradc_session_run(s); /* a loaded state runs (non-finite values are the caller's to check) */
  } else if (!gradc_last_error()[0]) {
    abort();
  }
  gradc_session_free(s);
  if (gradc_session_new(program(), &s) != GRADC_OK) abort();
  (void)gradc_session_load_params(s, path);
  gradc_session_free(s);
  return 0;
}
