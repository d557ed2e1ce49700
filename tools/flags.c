/* flags.c - the command line's one flag parser (tools.h): each command
 * describes its flags in a table (name, kind, destination, accepted range,
 * the wording of "expects ..."), and flags_parse walks argv once, filling
 * the destinations and writing `gradc: error: ...` for a bad one.
 *
 * Values come as "--flag=value" or "--flag value"; a flag spelled with one
 * dash ("-o") takes its value only as the next argument.  -D NAME=VALUE
 * (or -DNAME=VALUE) collects dim overrides, the rest are positionals. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gradc.h"
#include "tools.h"

/* "gradc: error: " fmt, then the command's pointer to its help when see. */
static int usage(const FlagSpec *s, bool see, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int usage(const FlagSpec *s, bool see, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fputs("gradc: error: ", stderr);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fprintf(stderr, "%s\n", see && s->see ? s->see : "");
  return 1;
}

/* -D NAME=INTEGER, or -DNAME=INTEGER; 0, or the exit status. */
static int define(const FlagSpec *s, int argc, char **argv, int *i) {
  const char *arg = argv[*i];
  const char *def = arg[2] ? arg + 2 : (*i + 1 < argc ? argv[++*i] : NULL);
  const char *eq = def ? strchr(def, '=') : NULL;
  int64_t v;
  if (!eq || eq == def || !tools_parse_i64(eq + 1, &v))
    return usage(s, true, "-D expects NAME=INTEGER, got '%s'", def ? def : "");
  Defines *d = s->defines;
  if (d->n == TOOLS_MAX_DEFINES) return usage(s, s->see_values, "too many -D options");
  d->name[d->n] = strndup(def, (size_t)(eq - def));
  d->value[d->n++] = v;
  return 0;
}

/* A value for f: 0, or the exit status. */
static int set_value(const FlagSpec *s, const Flag *f, const char *v) {
  int64_t n = 0;
  double x = 0;
  switch (f->kind) {
  case FLAG_BOOL: *(bool *)f->dst = true; return 0;
  case FLAG_STRING:
    if (f->valid && !f->valid(v)) return usage(s, s->see_values, f->invalid, v);
    *(const char **)f->dst = v;
    return 0;
  case FLAG_LIST: { /* repeated flags accumulate into one comma-separated list */
    const char **dst = f->dst;
    static char buf[4][1024];
    static int k;
    if (*dst) {
      char *b = buf[k++ % 4];
      snprintf(b, sizeof buf[0], "%s,%s", *dst, v);
      v = b;
    }
    *dst = v;
    return 0;
  }
  case FLAG_INT:
  case FLAG_I64:
  case FLAG_U64:
    if (!tools_parse_i64(v, &n) || (double)n < f->lo || (double)n > f->hi) break;
    if (f->kind == FLAG_INT) *(int *)f->dst = (int)n;
    else if (f->kind == FLAG_I64) *(int64_t *)f->dst = n;
    else *(uint64_t *)f->dst = (uint64_t)n;
    return 0;
  case FLAG_REAL:
    if (!tools_parse_f64(v, &x) || x < f->lo || (f->lo_open && x == f->lo) || x > f->hi) break;
    *(double *)f->dst = x;
    return 0;
  }
  return usage(s, s->see_values, "%s expects %s, got '%s'", f->label ? f->label : f->name, f->expects, v);
}

int flags_parse(const FlagSpec *s, int argc, char **argv, int first) {
  for (int i = first; i < argc; i++) {
    const char *arg = argv[i];
    if (s->defines && strncmp(arg, "-D", 2) == 0) {
      int rc = define(s, argc, argv, &i);
      if (rc) return rc;
      continue;
    }
    const Flag *f = NULL;
    const char *v = NULL;
    bool missing = false;
    for (int k = 0; k < s->nflags && !f; k++) {
      const Flag *c = &s->flags[k];
      size_t n = strlen(c->name);
      if (strncmp(arg, c->name, n) != 0) continue;
      if (c->kind == FLAG_BOOL) {
        if (arg[n] == 0) f = c;
      } else if (c->name[1] != '-') { /* "-o FILE" */
        if (arg[n] == 0) f = c, v = i + 1 < argc ? argv[++i] : NULL, missing = !v;
      } else if (arg[n] == '=') {
        f = c, v = arg + n + 1;
      } else if (arg[n] == 0) {
        f = c, v = i + 1 < argc ? argv[++i] : NULL, missing = !v;
      }
    }
    if (f && missing && f->missing) return usage(s, true, f->missing, arg);
    if (f && missing && s->see_missing) return usage(s, true, "%s needs a value", arg);
    if (f && !missing) {
      int rc = set_value(s, f, v);
      if (rc) return rc;
      if (f->given) *f->given = true;
      continue;
    }
    if (arg[0] == '-' && arg[1]) return usage(s, true, "unknown or incomplete option '%s'", arg);
    if (s->npositional && *s->npositional < s->max_positional) {
      s->positional[(*s->npositional)++] = arg;
      continue;
    }
    if (s->too_many) return usage(s, false, "%s", s->too_many);
    return usage(s, true, "unexpected argument '%s'", arg);
  }
  return 0;
}

void defines_free(Defines *d) {
  for (int i = 0; i < d->n; i++) free((void *)d->name[i]);
  d->n = 0;
}

bool tools_is_precision(const char *v) { return strcmp(v, "f32") == 0 || strcmp(v, "bf16") == 0 || strcmp(v, "f16") == 0; }

int64_t tools_bucket_bytes(double mb) {
  if (!(mb > 0)) return 0;
  int64_t b = (int64_t)(mb * (1 << 20));
  return b < 1 ? 1 : b;
}
