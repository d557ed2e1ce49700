/* shapes.c - shape rules (placeholder until the op table's rules land). */
#include "ir.h"

bool ir_infer_type(const IrOp *op, const IrType *hint, IrType *out, char *err, size_t errlen) {
  (void)op; (void)hint; (void)out;
  snprintf(err, errlen, "shape rules not implemented yet");
  return false;
}
