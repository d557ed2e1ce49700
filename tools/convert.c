/* convert.c - `gradc convert SRC.safetensors --map MAP.txt -o PARAMS.safetensors
 * [--model MODEL.gdl] [-D N=V]...`: another framework's weights (a Hugging
 * Face checkpoint, say) renamed, transposed and restacked into a params
 * file, as DESIGN.md §5 describes.
 *
 * MAP has one line per param, `DEST <- SOURCE [transpose]`; `#` starts a
 * comment.  `{l}` in SOURCE stands for the layer index: the tensors for
 * l = 0, 1, ... are stacked along a new leading axis (with --model, as many
 * as DEST's first axis; without, as many as the file holds from 0 on).
 * `transpose` swaps the last two axes of each source tensor (of each layer
 * when stacking).  Tensors of SRC that no line names are left out (a
 * framework's buffers, a tied head).  Values are written as F32 (F64 for
 * F64 sources without --model, or for f64 params); F16 and BF16 sources
 * are widened exactly.
 *
 * --model checks the result against the model's params: every DEST is a
 * param with the declared shape, and every param has a line; an error
 * names the map line, or the params nothing covers. */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/cli.h"
#include "gradc.h"
#include "tools.h"

const char convert_help[] =
    "gradc convert SRC.safetensors --map MAP.txt -o PARAMS.safetensors [--model MODEL.gdl] [-D N=V]...\n"
    "  Rename, transpose and restack another framework's tensors into a params file.  Each MAP line\n"
    "  reads `DEST <- SOURCE [transpose]` (# comments): DEST is a param, SOURCE a tensor of SRC;\n"
    "  `{l}` in SOURCE stacks the per-layer tensors l = 0, 1, ... along a new first axis\n"
    "  (w_qkv <- h.{l}.attn.c_attn.weight); `transpose` swaps the last two axes of each.  Tensors\n"
    "  no line names are left out.  --model (with its -D values) checks that every param is covered\n"
    "  with its declared shape and names what is missing.  Output is F32 (F64 for f64 params).\n";


/* One map line. */
typedef struct MapLine {
  char *dest, *src;
  bool transpose;
  int line;
} MapLine;

typedef struct Map {
  MapLine *l;
  int n;
} Map;

static void map_free(Map *m) {
  for (int i = 0; i < m->n; i++) {
    free(m->l[i].dest);
    free(m->l[i].src);
  }
  free(m->l);
}

/* map = { line }; line = DEST "<-" SOURCE ["transpose"] | "" (after # comments). */
static int map_read(const char *path, Map *m) {
  FILE *f = fopen(path, "r");
  if (!f) return tools_error("%s: cannot open the map", path);
  char buf[4096];
  int lineno = 0, rc = 0;
  while (!rc && fgets(buf, sizeof buf, f)) {
    lineno++;
    char *hash = strchr(buf, '#');
    if (hash) *hash = 0;
    char *tok[5];
    int nt = 0;
    for (char *t = strtok(buf, " \t\r\n"); t && nt < 5; t = strtok(NULL, " \t\r\n")) tok[nt++] = t;
    if (nt == 0) continue;
    if (nt < 3 || nt > 4 || strcmp(tok[1], "<-") != 0 || (nt == 4 && strcmp(tok[3], "transpose") != 0)) {
      rc = tools_error("%s:%d: expected `DEST <- SOURCE [transpose]`", path, lineno);
      break;
    }
    for (int i = 0; i < m->n; i++)
      if (strcmp(m->l[i].dest, tok[0]) == 0)
        rc = tools_error("%s:%d: '%s' is mapped twice (first at line %d)", path, lineno, tok[0], m->l[i].line);
    if (rc) break;
    m->l = realloc(m->l, (size_t)(m->n + 1) * sizeof *m->l);
    if (!m->l) abort();
    m->l[m->n++] = (MapLine){strdup(tok[0]), strdup(tok[2]), nt == 4, lineno};
  }
  if (!rc && ferror(f)) rc = tools_error("%s: cannot read the map", path);
  fclose(f);
  if (!rc && m->n == 0) rc = tools_error("%s: the map has no lines", path);
  return rc;
}

/* SOURCE with {l} replaced by l. */
static void layer_name(const char *src, int64_t l, char *out, size_t n) {
  const char *at = strstr(src, "{l}");
  snprintf(out, n, "%.*s%" PRId64 "%s", (int)(at - src), src, l, at + 3);
}

/* Element j of t as a double (F32, F64, F16, BF16). */
static double load(const cli_tensor *t, int64_t j) {
  const unsigned char *p = t->data;
  switch (t->dtype) {
  case GRADC_F32: {
    float v;
    memcpy(&v, p + 4 * j, 4);
    return v;
  }
  case GRADC_F64: {
    double v;
    memcpy(&v, p + 8 * j, 8);
    return v;
  }
  case GRADC_BF16: {
    uint16_t h;
    memcpy(&h, p + 2 * j, 2);
    uint32_t u = (uint32_t)h << 16;
    float v;
    memcpy(&v, &u, 4);
    return v;
  }
  case GRADC_F16: { /* IEEE binary16, widened exactly */
    uint16_t h;
    memcpy(&h, p + 2 * j, 2);
    int e = (h >> 10) & 31, mant = h & 1023;
    double v = e == 0 ? ldexp(mant, -24) : e == 31 ? (mant ? NAN : INFINITY) : ldexp(mant + 1024, e - 25);
    return h & 0x8000 ? -v : v;
  }
  case GRADC_I32:
  case GRADC_I64: break;
  }
  return 0;
}

/* A hint for a SOURCE name the file lacks: a tensor of the file that is the
 * same name with a dotted prefix more or less (a Hugging Face GPT2Model
 * checkpoint names `wte.weight` what GPT2LMHeadModel's names
 * `transformer.wte.weight`).  Empty if there is none. */
static void missing_hint(const cli_tensors *src, const char *name, char *out, size_t n) {
  out[0] = 0;
  size_t ln = strlen(name);
  for (int i = 0; i < cli_tensors_count(src); i++) {
    const char *t = cli_tensors_at(src, i).name;
    size_t lt = strlen(t);
    if (lt < ln && name[ln - lt - 1] == '.' && strcmp(name + ln - lt, t) == 0) {
      snprintf(out, n, "; the file has '%s' (drop the prefix '%.*s' from the map's sources?)", t, (int)(ln - lt), name);
      return;
    }
    if (lt > ln && t[lt - ln - 1] == '.' && strcmp(t + lt - ln, name) == 0) {
      snprintf(out, n, "; the file has '%s' (add the prefix '%.*s' to the map's sources?)", t, (int)(lt - ln), t);
      return;
    }
  }
}

static int64_t numel(int rank, const int64_t *shape) {
  int64_t n = 1;
  for (int k = 0; k < rank; k++) n *= shape[k];
  return n;
}

static void shape_str(gradc_dtype dt, int rank, const int64_t *shape, char *out, size_t n) {
  size_t at = (size_t)snprintf(out, n, "%s[", cli_dtype_name(dt));
  for (int k = 0; k < rank && at < n; k++) at += (size_t)snprintf(out + at, n - at, "%s%" PRId64, k ? "," : "", shape[k]);
  if (at < n) snprintf(out + at, n - at, "]");
}

typedef struct ConvertArgs {
  const char *src, *map, *out, *model;
  Defines defs;
} ConvertArgs;

/* The model's params (compiled for the reference interpreter: only the
 * signature is wanted). */
static int open_model(const ConvertArgs *a, gradc_program **p) {
  gradc_compile_options o;
  gradc_compile_options_init(&o);
  o.target = "ref";
  o.no_cache = 1;
  o.def_names = a->defs.name;
  o.def_values = a->defs.value;
  o.ndefs = a->defs.n;
  gradc_status st = gradc_program_compile_file(a->model, &o, p);
  return st == GRADC_OK ? 0 : cli_report(st);
}

/* Fill dst (n elements of dt) from one source tensor, transposing its last
 * two axes when asked. */
static void put(const cli_tensor *t, bool transpose, gradc_dtype dt, void *dst) {
  int64_t n = numel(t->rank, t->shape);
  int64_t r = transpose ? t->shape[t->rank - 2] : 1, c = transpose ? t->shape[t->rank - 1] : n;
  for (int64_t j = 0; j < n; j++) {
    int64_t k = j; /* the destination index of source element j */
    if (transpose) {
      int64_t base = j / (r * c) * (r * c), i = j % (r * c);
      k = base + (i % c) * r + i / c;
    }
    double v = load(t, j);
    if (dt == GRADC_F64)
      ((double *)dst)[k] = v;
    else
      ((float *)dst)[k] = (float)v;
  }
}

/* One map line into out; want (may be NULL) is the param's declared info. */
static int convert_line(const ConvertArgs *a, const cli_tensors *src, const MapLine *m, const gradc_tensor_info *want,
                        cli_tensors *out) {
  bool stacked = strstr(m->src, "{l}") != NULL;
  int64_t layers = 1;
  char name[1024];
  if (stacked) {
    if (want && want->rank < 1) return tools_error("%s:%d: '%s' is a scalar; {l} stacks along a first axis", a->map, m->line, m->dest);
    if (want) {
      layers = want->shape[0];
    } else {
      for (layers = 0;; layers++) {
        layer_name(m->src, layers, name, sizeof name);
        if (cli_tensors_find(src, name) < 0) break;
      }
    }
  }
  cli_tensor first = {0};
  for (int64_t l = 0; l < layers; l++) {
    if (stacked)
      layer_name(m->src, l, name, sizeof name);
    else
      snprintf(name, sizeof name, "%s", m->src);
    int i = cli_tensors_find(src, name);
    if (i < 0) {
      char hint[1200];
      missing_hint(src, name, hint, sizeof hint);
      return tools_error("%s: tensor '%s' (%s:%d): not in the file%s", a->src, name, a->map, m->line, hint);
    }
    cli_tensor t = cli_tensors_at(src, i);
    if (t.dtype == GRADC_I32 || t.dtype == GRADC_I64)
      return tools_error("%s: tensor '%s' (%s:%d): %s is not a float dtype", a->src, name, a->map, m->line,
                   cli_dtype_name(t.dtype));
    if (m->transpose && t.rank < 2)
      return tools_error("%s:%d: '%s' has %d axes; transpose needs at least 2", a->map, m->line, name, t.rank);
    if (l == 0) {
      first = t;
    } else if (t.rank != first.rank || memcmp(t.shape, first.shape, (size_t)t.rank * sizeof *t.shape) != 0) {
      char s0[128], s1[128];
      shape_str(first.dtype, first.rank, first.shape, s0, sizeof s0);
      shape_str(t.dtype, t.rank, t.shape, s1, sizeof s1);
      return tools_error("%s: tensor '%s' (%s:%d) is %s, layer 0's is %s", a->src, name, a->map, m->line, s1, s0);
    }
  }
  if (layers == 0) {
    layer_name(m->src, 0, name, sizeof name);
    char hint[1200];
    missing_hint(src, name, hint, sizeof hint);
    return tools_error("%s: tensor '%s' (%s:%d): not in the file%s", a->src, name, a->map, m->line, hint);
  }
  /* The destination's shape: [layers] + the (transposed) source's. */
  int64_t shape[9];
  int rank = 0;
  if (stacked) shape[rank++] = layers;
  if (first.rank > 8 - (stacked ? 1 : 0)) return tools_error("%s:%d: too many axes", a->map, m->line);
  for (int k = 0; k < first.rank; k++) shape[rank++] = first.shape[k];
  if (m->transpose) {
    int64_t x = shape[rank - 1];
    shape[rank - 1] = shape[rank - 2];
    shape[rank - 2] = x;
  }
  gradc_dtype dt = want ? (want->dtype == GRADC_F64 ? GRADC_F64 : GRADC_F32)
                        : (first.dtype == GRADC_F64 ? GRADC_F64 : GRADC_F32);
  if (want && (want->rank != rank || memcmp(want->shape, shape, (size_t)rank * sizeof *shape) != 0)) {
    char w[128], g[128];
    shape_str(want->dtype, want->rank, want->shape, w, sizeof w);
    shape_str(dt, rank, shape, g, sizeof g);
    return tools_error("%s:%d: '%s' <- '%s': the model declares %s, the map gives %s%s", a->map, m->line, m->dest, m->src, w,
                 g, !m->transpose && rank >= 2 ? " (transpose?)" : "");
  }
  int64_t per = numel(first.rank, first.shape);
  size_t esz = dt == GRADC_F64 ? 8 : 4;
  char *buf = calloc((size_t)(per * layers) + 1, esz);
  if (!buf) abort();
  for (int64_t l = 0; l < layers; l++) {
    if (stacked)
      layer_name(m->src, l, name, sizeof name);
    else
      snprintf(name, sizeof name, "%s", m->src);
    cli_tensor t = cli_tensors_at(src, cli_tensors_find(src, name));
    put(&t, m->transpose, dt, buf + (size_t)(l * per) * esz);
  }
  cli_tensors_add(out, m->dest, dt, rank, shape, buf);
  free(buf);
  return 0;
}

static int convert(const ConvertArgs *a) {
  Map m = {0};
  int rc = map_read(a->map, &m);
  gradc_program *p = NULL;
  if (!rc && a->model) rc = open_model(a, &p);
  cli_tensors *src = cli_tensors_new(), *out = cli_tensors_new();
  char err[2048];
  if (!rc && !cli_tensors_read(src, a->src, err, sizeof err)) rc = tools_error("%s", err);
  int np = p ? gradc_program_num_params(p) : 0;
  bool *covered = calloc((size_t)np + 1, sizeof *covered);
  for (int i = 0; !rc && i < m.n; i++) {
    gradc_tensor_info info, *want = NULL;
    if (p) {
      int k = 0;
      for (; k < np; k++)
        if (gradc_program_param_info(p, k, &info) == GRADC_OK && strcmp(info.name, m.l[i].dest) == 0) break;
      if (k == np) {
        rc = tools_error("%s:%d: '%s' is not a param of %s", a->map, m.l[i].line, m.l[i].dest, a->model);
        break;
      }
      covered[k] = true;
      want = &info;
    }
    rc = convert_line(a, src, &m.l[i], want, out);
  }
  if (!rc && p) { /* every param covered */
    char missing[1024] = "";
    int nmiss = 0;
    for (int k = 0; k < np; k++) {
      gradc_tensor_info info;
      if (covered[k] || gradc_program_param_info(p, k, &info) != GRADC_OK) continue;
      size_t at = strlen(missing);
      if (at < sizeof missing - 64) snprintf(missing + at, sizeof missing - at, "%s'%s'", nmiss ? ", " : "", info.name);
      nmiss++;
    }
    if (nmiss)
      rc = tools_error("%s: %s of %s %s no line (train --init-partial initialises uncovered params as declared)", a->map,
                 missing, a->model, nmiss == 1 ? "has" : "have");
  }
  if (!rc) {
    cli_tensors_set_meta(out, "converted_from", a->src);
    if (!cli_tensors_write(out, a->out, err, sizeof err)) rc = tools_error("%s", err);
  }
  if (!rc)
    fprintf(stderr, "%s: %d tensors from %s (%s)\n", a->out, cli_tensors_count(out), a->src, a->map);
  free(covered);
  cli_tensors_free(src);
  cli_tensors_free(out);
  gradc_program_free(p);
  map_free(&m);
  return rc;
}

int cmd_convert(int argc, char **argv) {
  ConvertArgs a;
  memset(&a, 0, sizeof a);
  const Flag flags[] = {
      {"--map", FLAG_STRING, .dst = &a.map},
      {"-o", FLAG_STRING, .dst = &a.out},
      {"--model", FLAG_STRING, .dst = &a.model},
  };
  int npos = 0;
  FlagSpec spec = {flags, (int)(sizeof flags / sizeof *flags), " (see gradc help convert)", .see_missing = true,
                   .defines = &a.defs, .positional = &a.src, .max_positional = 1, .npositional = &npos};
  int rc = flags_parse(&spec, argc, argv, 1);
  if (!rc && !a.src) rc = tools_error("convert needs a SRC.safetensors file (see gradc help convert)");
  if (!rc && !a.map) rc = tools_error("convert needs --map MAP.txt (see gradc help convert)");
  if (!rc && !a.out) rc = tools_error("convert needs -o PARAMS.safetensors (see gradc help convert)");
  if (!rc && a.defs.n && !a.model) rc = tools_error("convert: -D applies to --model");
  if (!rc) {
    const ToolsPath in[] = {{"the source", a.src, NULL}, {"--map", a.map, NULL}, {"--model", a.model, NULL}};
    const ToolsPath out = {"-o", a.out, NULL};
    rc = tools_check_paths(in, 3, &out, 1);
  }
  if (!rc) rc = convert(&a);
  defines_free(&a.defs);
  return rc;
}
