/* placeholder.c - removed when the frontend lands. */
#include "frontend.h"
FeModel *fe_model_compile(const SrcFile *src, const FeOptions *opt, Diag *d) {
  (void)opt;
  diag_at(d, DIAG_ERROR, src, 1, 1, "frontend not implemented yet");
  return NULL;
}
void fe_model_free(FeModel *m) { (void)m; }
