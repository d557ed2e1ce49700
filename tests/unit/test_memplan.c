/* test_memplan.c - the memory plan, checked independently of memplan.c:
 * for every example, test and conformance model (f32 and f64, K = 1 and
 * 4, after the CPU pipeline) no two buffers whose lifetimes share a step
 * overlap (brute force over all pairs), offsets are 64-byte aligned,
 * reshapes alias their operand, gradient buffers are persistent and sized
 * f32/f64, every value a GEMM, loss or other kernel reads is stored; on a
 * chain of GEMMs the peak is a fraction of the sum of the buffers; a
 * gradient that is also read elsewhere gets a copy-accumulate kernel;
 * memplan itself changes no op (the passes before it do) and plans a
 * planned function the same way again. */
#include <dirent.h>
#include <stdlib.h>
#include <string.h>

#include "codegen/codegen.h"
#include "passes/passes.h"
#include "testutil.h"

/* ------------------------------------------------------------------ */
/* Compiling                                                           */
/* ------------------------------------------------------------------ */

/* Small sizes for the big examples (the plan's shape does not depend on them). */
static const char *def_names[] = {"D", "H", "C", "T", "NH", "L", "V", "B"};

static FeModel *compile_model(const char *name, const char *text, int gas, const char **dn, const int64_t *dv,
                              int nd, Diag *d) {
  static SrcFile src;
  src.name = name;
  src.text = text;
  src.len = strlen(text);
  diag_init(d, NULL);
  d->quiet = true;
  FeOptions opt = {.gas = gas, .dp = 1, .def_names = dn, .def_values = dv, .ndefs = nd};
  return fe_model_compile(&src, &opt, d);
}

/* The CPU pipeline: the target-independent passes, fuse, memplan. */
static int run_cpu_passes(IrFunc *f, int gas, Diag *d) {
  int n;
  const char *const *names = pass_pipeline_cpu(&n);
  PassManager pm;
  pm_init(&pm);
  pm.verify = true;
  PassOptions po = {.gas = gas, .diag = d, .src = NULL};
  return pm_run(&pm, f, names, n, &po);
}

static int run_pass(IrFunc *f, const char *name) {
  Diag d;
  diag_init(&d, NULL);
  d.quiet = true;
  PassManager pm;
  pm_init(&pm);
  pm.verify = true;
  PassOptions po = {.gas = 1, .diag = &d};
  int rc = pm_run(&pm, f, &name, 1, &po);
  diag_free(&d);
  return rc;
}

static IrFunc *read_ir(const char *text) {
  SrcFile src = {"test.gir", text, strlen(text)};
  Diag d;
  diag_init(&d, NULL);
  d.quiet = true;
  IrFunc *f = ir_read(&src, &d);
  if (!f) fail_msg("cannot read IR: %s", sb_str(&d.log));
  diag_free(&d);
  return f;
}

static char *print_ir(const IrFunc *f) {
  StrBuf sb;
  sb_init(&sb);
  ir_print(f, &sb);
  char *s = strdup(sb_str(&sb));
  sb_free(&sb);
  return s;
}

/* ------------------------------------------------------------------ */
/* The independent check                                               */
/* ------------------------------------------------------------------ */

static int64_t bytes_of(const IrValue *v) { return ir_numel(&v->type.shape) * (int64_t)ir_dtype_size(v->type.dtype); }

static bool group0(const IrOp *op, IrOpcode opc) { return op && op->group == 0 && op->opcode == opc; }

/* A group-0 slice or unslice of one contiguous range (*first: its first element). */
static bool range_op(const IrOp *op, IrOpcode opc, int64_t *first) {
  return group0(op, opc) && kp_slice_contiguous(op, first);
}

/* The value whose bytes are read when v is read: through reshape and
 * range-slice aliases and through the views GEMMs read (group-0 permutes,
 * slices and reshapes with no storage: transpose flags, q out of qkv). */
static const IrValue *owner(const IrValue *v) {
  int64_t first;
  for (;;) {
    if (v->storage == IR_STORE_ALIAS && (group0(v->def, IR_OP_RESHAPE) || range_op(v->def, IR_OP_SLICE, &first)))
      v = v->def->args[0];
    else if (v->storage == IR_STORE_NONE &&
             (group0(v->def, IR_OP_PERMUTE) || group0(v->def, IR_OP_SLICE) || group0(v->def, IR_OP_RESHAPE)))
      v = v->def->args[0];
    else
      return v;
  }
}

/* Where a GEMM result with no storage is written: down its one reader,
 * group-0 permutes and reshapes (and a concat), to a stored value; NULL
 * if there is none. */
static const IrValue *home_of(const IrFunc *f, const IrValue *v) {
  while (v->storage == IR_STORE_NONE) {
    const IrOp *user = NULL;
    int n = 0;
    for (int i = 0; i < f->nops; i++)
      for (int j = 0; j < f->ops[i]->nargs; j++)
        if (f->ops[i]->args[j] == v) user = f->ops[i], n++;
    if (n != 1 || !(group0(user, IR_OP_PERMUTE) || group0(user, IR_OP_RESHAPE) || group0(user, IR_OP_CONCAT)))
      return NULL;
    v = user->result;
  }
  return v;
}

static const IrValue *param_named(const IrFunc *f, const char *name) {
  const IrValue *p = ir_func_find_arg(f, name);
  return p && p->role == IR_ARG_PARAM ? p : NULL;
}

/* Whether y (first stored at step t0) is written over x (last read at
 * step t1) as memplan may do: the same bytes, y defined by a kernel at
 * x's last step that reads x (or a reshape of it) as an operand of y's
 * shape and dtype. */
static bool written_over(const IrFunc *f, const IrValue *x, int t1, const IrValue *y, int t0) {
  if (t1 != t0 || x->offset != y->offset || !y->def || y->def->group <= 0) return false;
  bool reads = false;
  for (int i = 0; i < f->nops; i++) {
    const IrOp *op = f->ops[i];
    if (op->group != y->def->group) continue;
    for (int a = 0; a < op->nargs; a++) {
      const IrValue *v = op->args[a];
      reads |= (v == x || (v->storage == IR_STORE_ALIAS && v->offset == x->offset)) &&
               v->type.dtype == y->type.dtype && ir_shape_eq(&v->type.shape, &y->type.shape);
    }
  }
  return reads;
}

/* Check every property of a plan; returns the sum of the activation
 * buffers' sizes. */
static int64_t check_plan(const IrFunc *f, const char *what) {
  int n = f->nops, nv = f->nvalues;
  int64_t P = f->persist_size, A = f->arena_size;
  if (P % 64 || A % 64 || P > A) fail_msg("%s: arena %lld persist %lld", what, (long long)A, (long long)P);

  /* Steps and uses. */
  int *step = calloc((size_t)n + 1, sizeof(int)), *defstep = calloc((size_t)nv + 1, sizeof(int));
  int *last = calloc((size_t)nv + 1, sizeof(int)), *nuses = calloc((size_t)nv + 1, sizeof(int));
  for (int i = 0; i < n; i++) {
    int g = f->ops[i]->group, s = i;
    if (g > 0)
      for (int j = 0; j < i; j++)
        if (f->ops[j]->group == g) {
          s = step[j];
          break;
        }
    step[i] = s;
  }
  for (int v = 0; v < nv; v++) last[v] = -1;
  for (int i = 0; i < n; i++) {
    const IrOp *op = f->ops[i];
    if (op->result) defstep[op->result->id] = last[op->result->id] = step[i];
    for (int j = 0; j < op->nargs; j++) {
      nuses[op->args[j]->id]++;
      if (group0(op, IR_OP_WINDOW_SUM)) continue; /* evaluated by the interpreter, not read from the arena */
      const IrValue *o = owner(op->args[j]);
      if (step[i] > last[o->id]) last[o->id] = step[i];
    }
  }

  /* Gradient buffers: the value a `grad` reads, and down from it through
   * reshapes and range unslices (whose operands fill a range of the
   * buffer), belong to the param's buffer. */
  const char **grad_of = calloc((size_t)nv + 1, sizeof(char *));
  for (int i = 0; i < n; i++) {
    const IrOp *op = f->ops[i];
    if (op->opcode != IR_OP_GRAD) continue;
    int64_t first;
    const IrValue *x = owner(op->args[0]);
    for (;;) {
      grad_of[x->id] = ir_attr_get_str(op, "name", "");
      if (x->storage == IR_STORE_ALIAS && group0(x->def, IR_OP_RESHAPE))
        x = x->def->args[0];
      else if (x->storage == IR_STORE_GRAD && range_op(x->def, IR_OP_UNSLICE, &first))
        x = x->def->args[0];
      else
        break;
    }
  }

  /* Storage rules. */
  for (int v = 0; v < nv; v++) {
    const IrValue *x = f->values[v];
    int64_t first;
    /* Activations and whole gradient buffers are aligned; views of part of one need not be. */
    bool part = x->storage == IR_STORE_ALIAS || (x->storage == IR_STORE_GRAD && x->def && x->def->group == 0 &&
                                                 grad_of[x->id] && !(x->def->opcode == IR_OP_UNSLICE));
    if (x->storage != IR_STORE_NONE && !part && x->offset % 64) fail_msg("%s: value %d offset %lld not aligned", what, v, (long long)x->offset);
    if (x->storage == IR_STORE_ALIAS) {
      if (group0(x->def, IR_OP_RESHAPE)) {
        const IrValue *o = x->def->args[0];
        if (o->storage == IR_STORE_NONE || o->offset != x->offset) fail_msg("%s: alias %d does not share its operand's bytes", what, v);
      } else if (range_op(x->def, IR_OP_SLICE, &first)) {
        const IrValue *o = x->def->args[0];
        if (o->storage == IR_STORE_NONE || x->offset != o->offset + first * (int64_t)ir_dtype_size(o->type.dtype))
          fail_msg("%s: slice alias %d is not its range of its operand's bytes", what, v);
      } else {
        fail_msg("%s: value %d aliases but is not a reshape or a range slice", what, v);
      }
    }
    if (x->storage == IR_STORE_GRAD && range_op(x->def, IR_OP_UNSLICE, &first)) {
      const IrValue *o = x->def->args[0];
      while (o->storage == IR_STORE_ALIAS && group0(o->def, IR_OP_RESHAPE)) o = o->def->args[0];
      int64_t gsize = x->type.dtype == IR_DT_F64 ? 8 : 4;
      if (o->storage != IR_STORE_GRAD || o->offset != x->offset + first * gsize)
        fail_msg("%s: the operand of unslice %d does not fill its range of the gradient buffer", what, v);
    }
    if (!x->def && x->storage != IR_STORE_ARENA) fail_msg("%s: argument %d not in the arena", what, v);
  }
  for (int i = 0; i < n; i++) {
    const IrOp *op = f->ops[i];
    for (int j = 0; j < op->nargs; j++) {
      const IrValue *a = op->args[j];
      bool must = false;
      if (op->group > 0)
        must = !(a->def && a->def->group == op->group) && !group0(a->def, IR_OP_CONST);
      else if (op->opcode == IR_OP_MATMUL || op->opcode == IR_OP_LOSS)
        must = true;
      if (must && owner(a)->storage == IR_STORE_NONE)
        fail_msg("%s: operand %d of op %d (%s) has no storage", what, j, i, ir_op_info[op->opcode].name);
    }
    if (group0(op, IR_OP_MATMUL) && op->result->storage == IR_STORE_NONE) {
      const IrValue *h = home_of(f, op->result);
      if (!h || h->storage != IR_STORE_ARENA) fail_msg("%s: GEMM %d not stored", what, i);
      /* Written at the GEMM's step: the buffer lives from there. */
      if (step[i] < defstep[h->id]) defstep[h->id] = step[i];
    }
    if (op->opcode == IR_OP_GRAD) {
      const IrValue *o = owner(op->args[0]);
      if (o->storage != IR_STORE_GRAD) fail_msg("%s: grad %d does not read a gradient buffer", what, i);
      /* Nothing else may read an accumulating buffer. */
      int64_t first;
      const IrValue *stop = o; /* through range unslices: down to the producer of the range */
      for (const IrValue *x = op->args[0];; x = x->def->args[0]) {
        if (nuses[x->id] != 1) fail_msg("%s: gradient value of grad %d has %d uses", what, i, nuses[x->id]);
        bool un = x->storage == IR_STORE_GRAD && range_op(x->def, IR_OP_UNSLICE, &first);
        if (un) stop = owner(x->def->args[0]);
        else if (x == stop) break;
      }
      const IrValue *p = param_named(f, ir_attr_get_str(op, "name", ""));
      assert_non_null(p);
      if (o->offset + ir_numel(&p->type.shape) * (p->type.dtype == IR_DT_F64 ? 8 : 4) > P)
        fail_msg("%s: gradient buffer of %s not persistent", what, p->name);
    }
  }

  /* Buffers: persistent ones never overlap each other; activations live at
   * the same step never overlap; every buffer lies in its region. */
  typedef struct {
    int64_t lo, hi;
    int t0, t1;
    const IrValue *v;
    const char *grad_of;
  } B;
  B *b = calloc((size_t)nv + 1, sizeof(B));
  int nb = 0;
  int64_t act_sum = 0;
  for (int v = 0; v < nv; v++) {
    const IrValue *x = f->values[v];
    if (x->storage == IR_STORE_ARENA) {
      bool persistent = !x->def || x->offset < P;
      if (persistent && x->offset + bytes_of(x) > P) fail_msg("%s: value %d crosses the persistent boundary", what, v);
      if (!persistent) act_sum += bytes_of(x);
      b[nb++] = (B){x->offset, x->offset + bytes_of(x), persistent ? -1 : defstep[v], persistent ? n : last[v], x, NULL};
    } else if (x->storage == IR_STORE_GRAD) {
      const char *pname = grad_of[v];
      if (!pname) fail_msg("%s: value %d in a gradient buffer feeds no grad", what, v);
      const IrValue *p = param_named(f, pname);
      int64_t gsize = p->type.dtype == IR_DT_F64 ? 8 : 4;
      b[nb++] = (B){x->offset, x->offset + ir_numel(&x->type.shape) * gsize, -1, n, x, pname};
    }
  }
  for (int i = 0; i < nb; i++) {
    if (b[i].hi > A) fail_msg("%s: value %d ends past the arena", what, b[i].v->id);
    if (b[i].t0 >= 0 && b[i].lo < P) fail_msg("%s: activation %d in the persistent region", what, b[i].v->id);
  }
  /* All pairs: two buffers whose lifetimes share a step must not share bytes. */
  for (int i = 0; i < nb; i++)
    for (int j = i + 1; j < nb; j++) {
      if (b[i].t1 < b[j].t0 || b[j].t1 < b[i].t0) continue;
      if (b[i].grad_of && b[j].grad_of && strcmp(b[i].grad_of, b[j].grad_of) == 0) continue; /* one buffer */
      if (written_over(f, b[i].v, b[i].t1, b[j].v, b[j].t0) || written_over(f, b[j].v, b[j].t1, b[i].v, b[i].t0))
        continue;
      if (b[i].lo < b[j].hi && b[j].lo < b[i].hi && b[i].hi > b[i].lo && b[j].hi > b[j].lo)
        fail_msg("%s: values %d [%lld,%lld) and %d [%lld,%lld) overlap at step %d", what, b[i].v->id,
                 (long long)b[i].lo, (long long)b[i].hi, b[j].v->id, (long long)b[j].lo, (long long)b[j].hi,
                 b[i].t0 > b[j].t0 ? b[i].t0 : b[j].t0);
    }
  free(b);
  free(grad_of);
  free(step);
  free(defstep);
  free(last);
  free(nuses);
  return act_sum;
}

/* ------------------------------------------------------------------ */
/* Every model                                                         */
/* ------------------------------------------------------------------ */

static char *replace_all(const char *s, const char *from, const char *to) {
  size_t nf = strlen(from), nt = strlen(to), cap = strlen(s) * 2 + 16, k = 0;
  char *r = malloc(cap);
  for (const char *p = s; *p;) {
    if (k + nt + 2 >= cap) r = realloc(r, cap *= 2);
    if (strncmp(p, from, nf) == 0) {
      memcpy(r + k, to, nt);
      k += nt;
      p += nf;
    } else {
      r[k++] = *p++;
    }
  }
  r[k] = 0;
  return r;
}

/* memplan on a planned function changes no op, operand or group (it only
 * places), and gives the same plan again. */
static void check_only_places(IrFunc *f, const char *what) {
  int n = f->nops, nv = f->nvalues;
  IrOp **ops = malloc(sizeof(IrOp *) * (size_t)(n + 1));
  int *groups = malloc(sizeof(int) * (size_t)(n + 1)), nargs = 0;
  for (int i = 0; i < n; i++) nargs += f->ops[i]->nargs;
  IrValue **args = malloc(sizeof(IrValue *) * (size_t)(nargs + 1));
  int64_t *offsets = malloc(sizeof(int64_t) * (size_t)(nv + 1));
  int *storage = malloc(sizeof(int) * (size_t)(nv + 1));
  nargs = 0;
  for (int i = 0; i < n; i++) {
    ops[i] = f->ops[i];
    groups[i] = f->ops[i]->group;
    for (int j = 0; j < f->ops[i]->nargs; j++) args[nargs++] = f->ops[i]->args[j];
  }
  for (int v = 0; v < nv; v++) {
    offsets[v] = f->values[v]->offset;
    storage[v] = (int)f->values[v]->storage;
  }
  int64_t arena = f->arena_size, persist = f->persist_size;
  Arena scratch;
  arena_init(&scratch);
  PassOptions po = {.gas = 1};
  assert_int_equal(pass_memplan(f, &po, &scratch), PASS_CHANGED);
  arena_free(&scratch);
  if (f->nops != n || f->nvalues != nv) fail_msg("%s: memplan added or removed ops", what);
  nargs = 0;
  for (int i = 0; i < n; i++) {
    if (f->ops[i] != ops[i] || f->ops[i]->group != groups[i]) fail_msg("%s: memplan moved or regrouped op %d", what, i);
    for (int j = 0; j < f->ops[i]->nargs; j++)
      if (f->ops[i]->args[j] != args[nargs++]) fail_msg("%s: memplan rewired op %d", what, i);
  }
  for (int v = 0; v < nv; v++)
    if (f->values[v]->offset != offsets[v] || (int)f->values[v]->storage != storage[v])
      fail_msg("%s: memplan placed value %d elsewhere the second time", what, v);
  assert_true(f->arena_size == arena && f->persist_size == persist);
  free(ops);
  free(groups);
  free(args);
  free(offsets);
  free(storage);
}

static void plan_file(const char *path, const char *label) {
  const char *err = NULL;
  char *text = read_file(path, NULL, &err);
  if (!text) return;
  static const int64_t small[] = {12, 10, 16, 8, 2, 2, 16, 8}; /* D H C T NH L V B */
  for (int prec = 0; prec < 2; prec++) {
    char *t = prec ? replace_all(text, "f32", "f64") : strdup(text);
    for (int K = 1; K <= 4; K += 3) {
      Diag d;
      /* Only the names a model declares may be overridden: try small sizes, else the model's own. */
      FeModel *m = NULL;
      const char *dn[8];
      int64_t dv[8];
      int nd = 0;
      for (int i = 0; i < 8; i++) {
        char pat[16];
        snprintf(pat, sizeof pat, " %s ", def_names[i]);
        if (strstr(t, pat) && (strstr(path, "/tinygpt.gdl") || strstr(path, "/mlp.gdl")))
          dn[nd] = def_names[i], dv[nd++] = small[i];
      }
      m = compile_model(path, t, K, dn, dv, nd, &d);
      if (!m) { /* an error model, or one that refuses K > 1 */
        diag_free(&d);
        continue;
      }
      int rc = run_cpu_passes(m->func, K, &d);
      if (rc == 1 && K > 1) { /* a loss gas-fold refuses to split */
        fe_model_free(m);
        diag_free(&d);
        continue;
      }
      if (rc != 0) fail_msg("%s: passes failed: %s", label, sb_str(&d.log));
      char what[400];
      snprintf(what, sizeof what, "%s %s K=%d", label, prec ? "f64" : "f32", K);
      check_plan(m->func, what);
      check_only_places(m->func, what);
      print_message("  %-28s arena %8lld  persistent %8lld  peak activations %8lld\n", what,
                    (long long)m->func->arena_size, (long long)m->func->persist_size,
                    (long long)(m->func->arena_size - m->func->persist_size));
      fe_model_free(m);
      diag_free(&d);
    }
    free(t);
  }
  free(text);
}

static void plan_dir(const char *dir, const char *prefix) {
  DIR *dp = opendir(dir);
  if (!dp) return;
  struct dirent *e;
  char *names[256];
  int n = 0;
  while ((e = readdir(dp)) && n < 256) {
    size_t l = strlen(e->d_name);
    if (l > 4 && strcmp(e->d_name + l - 4, ".gdl") == 0) names[n++] = strdup(e->d_name);
  }
  closedir(dp);
  for (int i = 0; i < n; i++) {
    char path[4096], label[300];
    snprintf(path, sizeof path, "%s/%s", dir, names[i]);
    snprintf(label, sizeof label, "%s%s", prefix, names[i]);
    plan_file(path, label);
    free(names[i]);
  }
}

static void test_memplan_every_model(void **state) {
  (void)state;
  plan_dir(tu_path("examples"), "");
  plan_dir(tu_path("tests/models"), "models/");
  plan_dir("/work/shared/conformance/cases", "conformance/");
}

/* ------------------------------------------------------------------ */
/* Hand-written functions                                              */
/* ------------------------------------------------------------------ */

/* A chain of 8 GEMMs: each activation dies at the next GEMM, so two
 * buffers (plus the loss's) suffice, far below the sum of all of them. */
static void test_memplan_chain_peak_below_sum(void **state) {
  (void)state;
  StrBuf sb;
  sb_init(&sb);
  sb_puts(&sb, "func @chain(%x: f32[16,64] input batch, %W: f32[64,64] param) {\n  %h0 = matmul %x, %W : f32[16,64]\n");
  for (int i = 1; i < 8; i++) sb_printf(&sb, "  %%h%d = matmul %%h%d, %%W : f32[16,64]\n", i, i - 1);
  sb_puts(&sb, "  %flat = reshape %h7 {shape=[1024]} : f32[1024]\n"
               "  %ones = const {value=1.0} : f32[1024]\n"
               "  %s = matmul %flat, %ones : f32\n"
               "  loss %s {name=\"l\"}\n"
               "  %h6T = permute %h6 {perm=[1,0]} : f32[64,16]\n"
               "  %dW = matmul %h6T, %h7 : f32[64,64]\n"
               "  grad %dW {name=\"W\"}\n}\n");
  IrFunc *f = read_ir(sb_str(&sb));
  sb_free(&sb);
  assert_int_equal(run_pass(f, "memplan"), 0);
  int64_t sum = check_plan(f, "chain");
  int64_t peak = f->arena_size - f->persist_size;
  print_message("  chain: peak activations %lld, sum of activation buffers %lld\n", (long long)peak, (long long)sum);
  assert_true(sum >= 8 * 4096);
  assert_true(peak <= 3 * 4096 + 64);
  assert_true(peak < sum / 2);
  /* persistent: x, W, dW, the ones const */
  assert_int_equal(f->persist_size, 4096 + 16384 + 16384 + 4096);
  IrValue *ones = NULL, *flat = NULL, *h7 = NULL, *dW = NULL;
  for (int i = 0; i < f->nvalues; i++) {
    const char *nm = f->values[i]->name;
    if (!nm) continue;
    if (!strcmp(nm, "ones")) ones = f->values[i];
    if (!strcmp(nm, "flat")) flat = f->values[i];
    if (!strcmp(nm, "h7")) h7 = f->values[i];
    if (!strcmp(nm, "dW")) dW = f->values[i];
  }
  assert_int_equal(ones->storage, IR_STORE_ARENA);
  assert_true(ones->offset < f->persist_size);
  assert_int_equal(flat->storage, IR_STORE_ALIAS);
  assert_int_equal(flat->offset, h7->offset);
  assert_int_equal(dW->storage, IR_STORE_GRAD);
  /* The printed plan reads back to the same text. */
  char *once = print_ir(f);
  IrFunc *g = read_ir(once);
  char *again = print_ir(g);
  assert_string_equal(once, again);
  assert_non_null(strstr(once, "// arena: "));
  assert_non_null(strstr(once, " arena "));
  assert_non_null(strstr(once, "@grad "));
  assert_non_null(strstr(once, "@alias "));
  free(once);
  free(again);
  ir_func_free(g);
  ir_func_free(f);
}

static IrOp *find_op(IrFunc *f, IrOpcode opc, const char *name) {
  for (int i = 0; i < f->nops; i++)
    if (f->ops[i]->opcode == opc && (!name || !strcmp(ir_attr_get_str(f->ops[i], "name", ""), name))) return f->ops[i];
  return NULL;
}

/* Gradients read by other ops, arguments and shared gradient values are
 * accumulated by a copy kernel; a gradient read only by `grad` is the
 * buffer itself.  Running memplan again changes nothing. */
static void test_memplan_grad_copies(void **state) {
  (void)state;
  const char *text =
      "func @g(%x: f32[4] input, %a: f32[4] param, %b: f32[4] param, %c: f32[4] param, %e: f32[4] param, "
      "%p: f64[2,2] param, %q: f32[4] param) {\n"
      "  %d = mul %x, %a : f32[4]\n"
      "  %t = exp %d : f32[4]\n"
      "  %s = sum %t {axes=[0], keepdim=false} : f32\n"
      "  loss %s {name=\"l\"}\n"
      "  %u = tanh %x : f32[4]\n"
      "  %w = cast %x : f64[4]\n"
      "  %wp = reshape %w {shape=[2,2]} : f64[2,2]\n"
      "  grad %d {name=\"a\"}\n"  /* also read by exp: copy */
      "  grad %x {name=\"c\"}\n"  /* an argument: copy */
      "  grad %u {name=\"b\"}\n"  /* read by two grads: two copies */
      "  grad %u {name=\"e\"}\n"
      "  grad %wp {name=\"p\"}\n" /* through a reshape: in place */
      "}\n";
  IrFunc *f = read_ir(text);
  int before = f->nops;
  assert_int_equal(run_pass(f, "memplan"), 0);
  check_plan(f, "grad copies");
  assert_int_equal(f->nops, before + 4);
  const char *copied[] = {"a", "c", "b", "e"};
  int groups[4];
  for (int i = 0; i < 4; i++) {
    IrOp *g = find_op(f, IR_OP_GRAD, copied[i]);
    const IrOp *c = g->args[0]->def;
    assert_non_null(c);
    assert_int_equal(c->opcode, IR_OP_DETACH);
    assert_true(c->group > 0);
    groups[i] = c->group;
    for (int j = 0; j < i; j++) assert_int_not_equal(groups[i], groups[j]);
    assert_int_equal(g->args[0]->storage, IR_STORE_GRAD);
    assert_true(c->args[0]->storage == IR_STORE_ARENA); /* the value keeps its own storage */
  }
  /* The copy of %d runs right after %d. */
  IrOp *dop = find_op(f, IR_OP_MUL, NULL);
  for (int i = 0; i + 1 < f->nops; i++)
    if (f->ops[i] == dop) assert_int_equal(f->ops[i + 1]->opcode, IR_OP_DETACH);
  IrOp *gp = find_op(f, IR_OP_GRAD, "p");
  assert_int_equal(gp->args[0]->storage, IR_STORE_ALIAS);
  const IrValue *w = gp->args[0]->def->args[0];
  assert_int_equal(w->storage, IR_STORE_GRAD);
  assert_int_equal(w->offset, gp->args[0]->offset);

  char *once = print_ir(f);
  assert_int_equal(run_pass(f, "memplan"), 0);
  char *twice = print_ir(f);
  assert_string_equal(once, twice);
  free(once);
  free(twice);
  ir_func_free(f);
}

/* A gradient that is a sum of a kernel value and a GEMM becomes two
 * contributions accumulating into one buffer; a sum with an argument (it
 * cannot accumulate) or of a value with itself stays one. */
static void test_memplan_grad_sum_split(void **state) {
  (void)state;
  const char *text = "func @s(%x: f32[4,4] input batch, %W: f32[4,4] param, %b: f32[4] param) {\n"
                     "  %xt = permute %x {perm=[1,0]} : f32[4,4]\n"
                     "  %g = matmul %xt, %x : f32[4,4]\n"
                     "  %k = mul %W, %W : f32[4,4]\n"
                     "  %k2 = add %k, %k : f32[4,4]\n"
                     "  %dW = add %k2, %g : f32[4,4]\n"
                     "  grad %dW {name=\"W\"}\n"
                     "  %r = sum %x {axes=[0], keepdim=false} : f32[4]\n"
                     "  %db = add %r, %b : f32[4]\n"
                     "  grad %db {name=\"b\"}\n"
                     "}\n";
  IrFunc *f = read_ir(text);
  assert_int_equal(run_pass(f, "memplan"), 0);
  check_plan(f, "sum split");
  int nW = 0;
  for (int i = 0; i < f->nops; i++) {
    const IrOp *op = f->ops[i];
    assert_false(op->result && op->result->name && !strcmp(op->result->name, "dW")); /* the sum is gone */
    if (op->opcode != IR_OP_GRAD) continue;
    const IrValue *v = op->args[0];
    assert_int_equal(v->storage, IR_STORE_GRAD);
    if (!strcmp(ir_attr_get_str(op, "name", ""), "W")) {
      nW++;
      assert_true(!strcmp(v->name, "k2") || !strcmp(v->name, "g"));
    } else {
      assert_string_equal(v->name, "db");
    }
  }
  assert_int_equal(nW, 2);
  const IrOp *g1 = find_op(f, IR_OP_GRAD, "W");
  for (int i = 0; i < f->nops; i++)
    if (f->ops[i]->opcode == IR_OP_GRAD && f->ops[i] != g1 && !strcmp(ir_attr_get_str(f->ops[i], "name", ""), "W"))
      assert_int_equal(f->ops[i]->args[0]->offset, g1->args[0]->offset);
  ir_func_free(f);
}

/* A transpose read only by GEMMs is a flag: no storage, its operand lives
 * until the last GEMM that reads it. */
static void test_memplan_transpose_flags(void **state) {
  (void)state;
  const char *text = "func @t(%x: f32[8,4] input batch, %W: f32[4,6] param) {\n"
                     "  %h = matmul %x, %W : f32[8,6]\n"
                     "  %hT = permute %h {perm=[1,0]} : f32[6,8]\n"
                     "  %g = matmul %hT, %x : f32[6,4]\n"
                     "  %gT = permute %g {perm=[1,0]} : f32[4,6]\n"
                     "  grad %gT {name=\"W\"}\n"
                     "}\n";
  IrFunc *f = read_ir(text);
  assert_int_equal(run_pass(f, "memplan"), 0);
  check_plan(f, "transpose");
  IrOp *p0 = find_op(f, IR_OP_PERMUTE, NULL);
  assert_int_equal(p0->result->storage, IR_STORE_NONE);
  /* The second permute feeds a grad, not a GEMM: not a flag. */
  IrOp *g = find_op(f, IR_OP_GRAD, "W");
  assert_int_not_equal(g->args[0]->storage, IR_STORE_NONE);
  ir_func_free(f);
}

/* Kernel-internal values get no storage; kernel outputs and the values a
 * kernel reads from another kernel do. */
static void test_memplan_kernel_scratch(void **state) {
  (void)state;
  const char *text = "func @k(%x: f32[8,4] input batch, %W: f32[4,4] param) {\n"
                     "  %h = matmul %x, %W : f32[8,4]\n"
                     "  %a = tanh %h : f32[8,4]\n"
                     "  %b = exp %a : f32[8,4]\n"
                     "  %c = neg %b : f32[8,4]\n"
                     "  %s = sum %c {axes=[0,1], keepdim=false} : f32\n"
                     "  loss %s {name=\"l\"}\n"
                     "  %g = matmul %b, %W : f32[8,4]\n"
                     "  %k = const {value=2.0} : f32\n"
                     "  %m = mul %g, %k : f32[8,4]\n"
                     "  %xT = permute %x {perm=[1,0]} : f32[4,8]\n"
                     "  %dW = matmul %xT, %m : f32[4,4]\n"
                     "  grad %dW {name=\"W\"}\n"
                     "}\n";
  IrFunc *f = read_ir(text);
  /* Kernels as fuse would form them: {a, b, c, s} and {m}. */
  for (int i = 0; i < f->nops; i++) {
    IrOp *op = f->ops[i];
    if (op->opcode == IR_OP_TANH || op->opcode == IR_OP_EXP || op->opcode == IR_OP_NEG || op->opcode == IR_OP_SUM)
      op->group = 1;
    if (op->opcode == IR_OP_MUL) op->group = 2;
  }
  assert_int_equal(run_pass(f, "memplan"), 0);
  check_plan(f, "kernels");
  for (int i = 0; i < f->nops; i++) {
    const IrOp *op = f->ops[i];
    IrOpcode c = op->opcode;
    IrStorage want = IR_STORE_ARENA;
    if (c == IR_OP_TANH || c == IR_OP_NEG || c == IR_OP_CONST || c == IR_OP_PERMUTE)
      want = IR_STORE_NONE; /* row scratch; an immediate; a GEMM flag */
    if (c == IR_OP_MATMUL && op->result->name && !strcmp(op->result->name, "dW")) want = IR_STORE_GRAD;
    if (op->result) assert_int_equal(op->result->storage, want);
  }
  ir_func_free(f);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_memplan_chain_peak_below_sum),
      cmocka_unit_test(test_memplan_grad_copies),
      cmocka_unit_test(test_memplan_grad_sum_split),
      cmocka_unit_test(test_memplan_transpose_flags),
      cmocka_unit_test(test_memplan_kernel_scratch),
      cmocka_unit_test(test_memplan_every_model),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
