/* shard.c - tensor parallelism: from split(N) annotations and --tp, shard
 * params and insert the collectives (docs/DISTRIBUTED.md).  Being written. */
#include "passes.h"

PassResult pass_shard(IrFunc *f, const PassOptions *o, Arena *scratch) {
  (void)f;
  (void)scratch;
  if (o->tp <= 1) return PASS_UNCHANGED;
  if (o->diag) diag_plain(o->diag, DIAG_ERROR, "--tp %d: tensor parallelism is not available in this build", o->tp);
  return PASS_ERROR;
}
