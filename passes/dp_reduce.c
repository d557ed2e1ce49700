/* dp_reduce.c - data-parallel gradient buckets (docs/DISTRIBUTED.md).  Being written. */
#include "passes.h"

PassResult pass_dp_reduce(IrFunc *f, const PassOptions *o, Arena *scratch) {
  (void)f;
  (void)o;
  (void)scratch;
  return PASS_UNCHANGED; /* gradients are reduced by the step layer after the window */
}
