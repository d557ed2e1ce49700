/* testutil.c - helpers shared by the unit tests. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

const char *tu_path(const char *rel) {
  static char buf[4096];
  snprintf(buf, sizeof buf, "%s/%s", GRADC_SOURCE_DIR, rel);
  return buf;
}

char *tu_read(const char *rel) {
  const char *err = NULL;
  char *s = read_file(tu_path(rel), NULL, &err);
  if (!s) fail_msg("cannot read %s: %s", rel, err);
  return s;
}

FeModel *tu_compile(const char *name, const char *text, int gas, Diag *d) {
  static SrcFile src; /* the model keeps a copy of this struct */
  src.name = name;
  src.text = text;
  src.len = strlen(text);
  diag_init(d, NULL);
  d->quiet = true;
  FeOptions opt = {.gas = gas, .dp = 1};
  return fe_model_compile(&src, &opt, d);
}
