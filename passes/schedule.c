/* schedule.c - places collectives' starts early and waits late (docs/DISTRIBUTED.md).  Being written. */
#include "passes.h"

PassResult pass_schedule(IrFunc *f, const PassOptions *o, Arena *scratch) {
  (void)f;
  (void)o;
  (void)scratch;
  return PASS_UNCHANGED;
}
