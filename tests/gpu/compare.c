/* compare.c - the GPU test's judge (tests/gpu/run.sh): compares one
 * window's losses and gradients from `gradc run --target cuda` with a
 * reference, either another run (`gradc run --target ref`: its loss lines
 * and --grads-out file) or a torch-reference case (tests/torchref: CASE.ref.json
 * and CASE.ref.safetensors, float64 full-batch values).
 *
 *   compare LOSSES.txt GRADS.safetensors REF.txt|REF.json REF.safetensors [TOL]
 *
 * As the conformance runner: every loss (and the total) within TOL
 * relative to the reference (default 1e-4); every gradient within TOL in
 * norm, ||g - ref|| / ||ref|| (a reference that is exactly zero: ||g|| <=
 * 1e-6).  Prints one line per loss and gradient with its error, FAIL on
 * the ones beyond the tolerance; exit status 0 when all pass, 1 when one
 * does not, 2 on a missing or unreadable file. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "runtime/runtime.h"

#define MAXL 256

typedef struct Losses {
  char name[MAXL][128];
  double v[MAXL];
  int n;
} Losses;

static int fail_io(const char *what) {
  fprintf(stderr, "compare: %s\n", what);
  return 2;
}

/* `loss NAME VALUE` lines (gradc run's stdout), or a torchref .ref.json. */
static bool read_losses(const char *path, Losses *l) {
  const char *err;
  size_t len;
  char *text = read_file(path, &len, &err);
  if (!text) return false;
  l->n = 0;
  size_t pl = strlen(path);
  if (pl > 5 && strcmp(path + pl - 5, ".json") == 0) {
    cJSON *j = cJSON_Parse(text);
    const cJSON *ls = cJSON_GetObjectItemCaseSensitive(j, "losses"), *t = cJSON_GetObjectItemCaseSensitive(j, "total");
    const cJSON *e;
    cJSON_ArrayForEach(e, ls) {
      if (l->n == MAXL || !cJSON_IsNumber(e)) continue;
      snprintf(l->name[l->n], sizeof l->name[0], "%s", e->string);
      l->v[l->n++] = e->valuedouble;
    }
    if (cJSON_IsNumber(t) && l->n < MAXL) {
      snprintf(l->name[l->n], sizeof l->name[0], "total");
      l->v[l->n++] = t->valuedouble;
    }
    cJSON_Delete(j);
  } else {
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
      char name[128];
      double v;
      if (l->n < MAXL && sscanf(line, "loss %127s %lf", name, &v) == 2) {
        snprintf(l->name[l->n], sizeof l->name[0], "%s", name);
        l->v[l->n++] = v;
      }
    }
  }
  free(text);
  return l->n > 0;
}

static double value(const StTensor *t, int64_t i) {
  double v;
  step_load(t, i, 1, &v);
  return v;
}

int main(int argc, char **argv) {
  if (argc < 5) {
    fprintf(stderr, "usage: compare LOSSES.txt GRADS.safetensors REF.txt|REF.json REF.safetensors [TOL]\n");
    return 2;
  }
  double tol = argc > 5 ? atof(argv[5]) : 1e-4;
  Losses got, want;
  if (!read_losses(argv[1], &got)) return fail_io("no loss lines in the run's output");
  if (!read_losses(argv[3], &want)) return fail_io("no reference losses");
  char err[1024];
  StFile gg, gw;
  st_init(&gg);
  st_init(&gw);
  if (!st_read(argv[2], &gg, err, sizeof err) || !st_read(argv[4], &gw, err, sizeof err)) return fail_io(err);
  int bad = 0;
  double worst = 0;
  for (int i = 0; i < want.n; i++) {
    int k = -1;
    for (int j = 0; j < got.n; j++)
      if (strcmp(got.name[j], want.name[i]) == 0) k = j;
    if (k < 0) {
      printf("FAIL loss %s: missing\n", want.name[i]);
      bad++;
      continue;
    }
    double r = want.v[i], e = fabs(got.v[k] - r) / fmax(fabs(r), 1e-12);
    bool ok = e < tol || (r == 0 && fabs(got.v[k]) < 1e-6);
    if (!ok) bad++;
    if (e > worst) worst = e;
    printf("%s loss %-12s %.9g ref %.9g rel %.3g\n", ok ? "ok  " : "FAIL", want.name[i], got.v[k], r, e);
  }
  for (int i = 0; i < gw.n; i++) {
    const StTensor *w = &gw.t[i], *g = st_find(&gg, w->name);
    if (!g || st_numel(g) != st_numel(w)) {
      printf("FAIL grad %s: %s\n", w->name, g ? "the sizes differ" : "missing");
      bad++;
      continue;
    }
    double dn = 0, rn = 0, gn = 0;
    for (int64_t e = 0; e < st_numel(w); e++) {
      double a = value(g, e), b = value(w, e);
      dn += (a - b) * (a - b);
      rn += b * b;
      gn += a * a;
    }
    dn = sqrt(dn), rn = sqrt(rn), gn = sqrt(gn);
    double e = rn > 0 ? dn / rn : gn;
    bool ok = rn > 0 ? e < tol : gn <= 1e-6;
    if (!ok) bad++;
    if (rn > 0 && e > worst) worst = e;
    printf("%s grad %-12s |ref| %.6g rel %.3g\n", ok ? "ok  " : "FAIL", w->name, rn, e);
  }
  printf("%s: worst relative error %.3g (tolerance %g)\n", bad ? "FAIL" : "PASS", worst, tol);
  st_free(&gg);
  st_free(&gw);
  return bad ? 1 : 0;
}
