/* fuzz_gir.c - fuzz target: the IR reader must never crash, hang or leak;
 * what it accepts must verify and print back to text it reads again
 * identically. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ir/ir.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char *text = malloc(size + 1);
  memcpy(text, data, size);
  text[size] = 0;
  SrcFile src = {"fuzz.gir", text, size};
  Diag d;
  diag_init(&d, NULL);
  d.quiet = true;
  IrFunc *f = ir_read(&src, &d);
  if (f) {
    char err[512];
    if (!ir_verify(f, err, sizeof err)) abort();
    StrBuf a, b;
    sb_init(&a);
    sb_init(&b);
    ir_print(f, &a);
    SrcFile again = {"again.gir", sb_str(&a), a.len};
    IrFunc *g = ir_read(&again, &d);
    if (!g) abort();
    ir_print(g, &b);
    if (strcmp(sb_str(&a), sb_str(&b)) != 0) abort();
    ir_func_free(g);
    sb_free(&a);
    sb_free(&b);
  }
  ir_func_free(f);
  diag_free(&d);
  free(text);
  return 0;
}
