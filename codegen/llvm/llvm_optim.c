/* llvm_optim.c - optimiser updates as generated kernels (codegen.h,
 * "Optimiser updates"): one LLVM function per (kind, dtype)
 *
 *   void gradc_optim_<sgd|adamw>_<f32|f64>(ptr param, ptr grad, ptr s0, ptr s1,
 *                                          i64 n, ptr scalars)
 *
 * that updates the param and its slots in one vectorised pass.  The body
 * is optim.c's C loop, operation for operation and in the same order
 * (no contraction into FMAs, no reassociation), so the result is bit for
 * bit the C path's; the option flags (clipping, weight decay, Nesterov,
 * the first momentum step) are loop-invariant selects, and SGD without
 * momentum is a second loop that never touches the absent momentum
 * buffer.  The module is optimised with LLVMRunPasses("default<O3>") for
 * the host CPU, emitted as object code (cached in the on-disk cache under
 * kind "cpu-optim") and loaded with its own ORC LLJIT. */
#include <llvm-c/Core.h>
#include <llvm-c/Error.h>
#include <llvm-c/LLJIT.h>
#include <llvm-c/Orc.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "llvm_gen.h"

#define OPTIM_VERSION "gradc-optim-1" /* bump when the generated code changes (cache keys) */

struct CgOptim {
  LLVMOrcLLJITRef jit;
  CgOptimFn fn[2][2]; /* [kind][f64] */
  unsigned kinds;
  bool from_cache;
};

static const char *kernel_symbol(CgOptimKind kind, bool f64) {
  static const char *const names[2][2] = {{"gradc_optim_sgd_f32", "gradc_optim_sgd_f64"},
                                          {"gradc_optim_adamw_f32", "gradc_optim_adamw_f64"}};
  return names[kind][f64];
}

/* ------------------------------------------------------------------ */
/* Emission                                                            */
/* ------------------------------------------------------------------ */

typedef struct Ctx {
  Gen *g;
  LLVMTypeRef t;  /* float or double: the param's register type */
  LLVMValueRef sc; /* ptr to the scalars */
  LLVMValueRef p, grad, s0, s1;
} Ctx;

/* Scalar k of the struct, as a double. */
static LLVMValueRef scalar(Ctx *c, size_t offset) {
  Gen *g = c->g;
  LLVMValueRef idx = gen_i64(g, (int64_t)(offset / sizeof(double)));
  LLVMValueRef ptr = LLVMBuildGEP2(g->b, g->t_f64, c->sc, &idx, 1, "");
  return LLVMBuildLoad2(g->b, g->t_f64, ptr, "");
}
#define SCALAR(c, field) scalar(c, offsetof(CgOptimScalars, field))

/* Scalar rounded once to the param's type, as optim.c's (float)sc->x. */
static LLVMValueRef scalar_t(Ctx *c, size_t offset, const char *name) {
  LLVMValueRef v = scalar(c, offset);
  if (c->t != c->g->t_f64) v = LLVMBuildFPTrunc(c->g->b, v, c->t, "");
  LLVMSetValueName2(v, name, strlen(name));
  return v;
}
#define SCALAR_T(c, field) scalar_t(c, offsetof(CgOptimScalars, field), #field)

/* A flag: scalar != 0 (as C's `sc->x != 0`, true for NaN). */
static LLVMValueRef flag(Ctx *c, size_t offset, const char *name) {
  LLVMValueRef v = LLVMBuildFCmp(c->g->b, LLVMRealUNE, scalar(c, offset), LLVMConstReal(c->g->t_f64, 0.0), name);
  return v;
}
#define FLAG(c, field) flag(c, offsetof(CgOptimScalars, field), #field)

static LLVMValueRef elem_ptr(Ctx *c, LLVMTypeRef t, LLVMValueRef base, LLVMValueRef j) {
  return LLVMBuildGEP2(c->g->b, t, base, &j, 1, "");
}

static LLVMValueRef load(Ctx *c, LLVMTypeRef t, LLVMValueRef base, LLVMValueRef j) {
  return LLVMBuildLoad2(c->g->b, t, elem_ptr(c, t, base, j), "");
}

static void store(Ctx *c, LLVMValueRef base, LLVMValueRef j, LLVMValueRef x) {
  LLVMBuildStore(c->g->b, x, elem_ptr(c, c->t, base, j));
}

/* g = (T)grad[j], times coef when clipping. */
static LLVMValueRef load_grad(Ctx *c, LLVMValueRef j, LLVMValueRef clip, LLVMValueRef coef) {
  LLVMBuilderRef b = c->g->b;
  LLVMValueRef gr = load(c, c->g->t_f64, c->grad, j);
  if (c->t != c->g->t_f64) gr = LLVMBuildFPTrunc(b, gr, c->t, "");
  return LLVMBuildSelect(b, clip, LLVMBuildFMul(b, gr, coef, ""), gr, "g");
}

/* SGD (optim.c update_*: kind SGD). */
static void emit_sgd(Ctx *c) {
  Gen *g = c->g;
  LLVMBuilderRef b = g->b;
  LLVMValueRef clip = FLAG(c, clip), coef = SCALAR_T(c, coef);
  LLVMValueRef wd_on = FLAG(c, wd_on), wd = SCALAR_T(c, wd);
  LLVMValueRef mom_on = FLAG(c, mom_on), mom = SCALAR_T(c, momentum), damp1 = SCALAR_T(c, damp1);
  LLVMValueRef nesterov = FLAG(c, nesterov), first = FLAG(c, first), neg_lr = SCALAR_T(c, neg_lr);
  LLVMValueRef n = LLVMGetParam(g->fn, 4);
  LLVMBasicBlockRef with_mom = LLVMAppendBasicBlockInContext(g->ctx, g->fn, "momentum");
  LLVMBasicBlockRef plain = LLVMAppendBasicBlockInContext(g->ctx, g->fn, "plain");
  LLVMBuildCondBr(b, mom_on, with_mom, plain);
  for (int m = 0; m < 2; m++) {
    LLVMPositionBuilderAtEnd(b, m ? with_mom : plain);
    GenLoop l;
    gen_loop_begin(g, &l, gen_i64(g, 0), n, "j");
    LLVMValueRef j = l.iv;
    LLVMValueRef p = load(c, c->t, c->p, j);
    LLVMValueRef gv = load_grad(c, j, clip, coef);
    gv = LLVMBuildSelect(b, wd_on, LLVMBuildFAdd(b, gv, LLVMBuildFMul(b, wd, p, ""), ""), gv, "g.wd");
    if (m) {
      /* b = first ? g : b * momentum + (1 - dampening) * g */
      LLVMValueRef old = load(c, c->t, c->s0, j);
      LLVMValueRef upd = LLVMBuildFAdd(b, LLVMBuildFMul(b, old, mom, ""), LLVMBuildFMul(b, damp1, gv, ""), "");
      LLVMValueRef buf = LLVMBuildSelect(b, first, gv, upd, "buf");
      store(c, c->s0, j, buf);
      LLVMValueRef nes = LLVMBuildFAdd(b, gv, LLVMBuildFMul(b, mom, buf, ""), "");
      gv = LLVMBuildSelect(b, nesterov, nes, buf, "g.mom");
    }
    store(c, c->p, j, LLVMBuildFAdd(b, p, LLVMBuildFMul(b, neg_lr, gv, ""), "p.new"));
    gen_loop_end(g, &l);
    LLVMBuildRetVoid(b);
  }
}

/* AdamW (optim.c update_*: kind AdamW). */
static void emit_adamw(Ctx *c) {
  Gen *g = c->g;
  LLVMBuilderRef b = g->b;
  LLVMValueRef clip = FLAG(c, clip), coef = SCALAR_T(c, coef);
  LLVMValueRef decay = SCALAR_T(c, decay), w1 = SCALAR_T(c, w1), b2 = SCALAR_T(c, beta2), w2 = SCALAR_T(c, w2);
  LLVMValueRef eps = SCALAR_T(c, eps), neg_step = SCALAR_T(c, neg_step), bc2_sqrt = SCALAR_T(c, bc2_sqrt);
  LLVMValueRef one = LLVMConstReal(c->t, 1.0);
  /* torch.lerp: |w| < 0.5 ? a + w * (b - a) : b - (b - a) * (1 - w) */
  LLVMValueRef low_w = LLVMBuildFCmp(b, LLVMRealOLT, gen_call1(g, "llvm.fabs", w1), LLVMConstReal(c->t, 0.5), "low_w");
  LLVMValueRef one_minus_w = LLVMBuildFSub(b, one, w1, "one_minus_w");
  LLVMValueRef n = LLVMGetParam(g->fn, 4);
  GenLoop l;
  gen_loop_begin(g, &l, gen_i64(g, 0), n, "j");
  LLVMValueRef j = l.iv;
  LLVMValueRef gv = load_grad(c, j, clip, coef);
  LLVMValueRef pj = LLVMBuildFMul(b, load(c, c->t, c->p, j), decay, "p.decayed");
  LLVMValueRef m0 = load(c, c->t, c->s0, j);
  LLVMValueRef diff = LLVMBuildFSub(b, gv, m0, "");
  LLVMValueRef lo = LLVMBuildFAdd(b, m0, LLVMBuildFMul(b, w1, diff, ""), "");
  LLVMValueRef hi = LLVMBuildFSub(b, gv, LLVMBuildFMul(b, diff, one_minus_w, ""), "");
  LLVMValueRef m = LLVMBuildSelect(b, low_w, lo, hi, "m");
  LLVMValueRef v = LLVMBuildFMul(b, load(c, c->t, c->s1, j), b2, "");
  v = LLVMBuildFAdd(b, v, LLVMBuildFMul(b, LLVMBuildFMul(b, w2, gv, ""), gv, ""), "v");
  LLVMValueRef denom = LLVMBuildFAdd(b, LLVMBuildFDiv(b, gen_call1(g, "llvm.sqrt", v), bc2_sqrt, ""), eps, "denom");
  LLVMValueRef step = LLVMBuildFDiv(b, LLVMBuildFMul(b, neg_step, m, ""), denom, "");
  store(c, c->p, j, LLVMBuildFAdd(b, pj, step, "p.new"));
  store(c, c->s0, j, m);
  store(c, c->s1, j, v);
  gen_loop_end(g, &l);
  LLVMBuildRetVoid(b);
}

static void emit_kernel(Gen *g, CgOptimKind kind, bool f64) {
  LLVMTypeRef params[6] = {g->t_ptr, g->t_ptr, g->t_ptr, g->t_ptr, g->t_i64, g->t_ptr};
  g->fn = LLVMAddFunction(g->mod, kernel_symbol(kind, f64), LLVMFunctionType(g->t_void, params, 6, 0));
  static const char *const pnames[6] = {"param", "grad", "s0", "s1", "n", "scalars"};
  unsigned noalias = LLVMGetEnumAttributeKindForName("noalias", 7);
  unsigned nounwind = LLVMGetEnumAttributeKindForName("nounwind", 8);
  LLVMAddAttributeAtIndex(g->fn, LLVMAttributeFunctionIndex, LLVMCreateEnumAttribute(g->ctx, nounwind, 0));
  for (unsigned i = 0; i < 6; i++) {
    LLVMSetValueName2(LLVMGetParam(g->fn, i), pnames[i], strlen(pnames[i]));
    /* The param, its gradient and its slots are distinct arrays. */
    if (i < 4) LLVMAddAttributeAtIndex(g->fn, i + 1, LLVMCreateEnumAttribute(g->ctx, noalias, 0));
  }
  g->entry = LLVMAppendBasicBlockInContext(g->ctx, g->fn, "entry");
  LLVMPositionBuilderAtEnd(g->b, g->entry);
  Ctx c = {g, f64 ? g->t_f64 : g->t_f32, LLVMGetParam(g->fn, 5), LLVMGetParam(g->fn, 0), LLVMGetParam(g->fn, 1),
           LLVMGetParam(g->fn, 2), LLVMGetParam(g->fn, 3)};
  if (kind == CG_OPTIM_SGD)
    emit_sgd(&c);
  else
    emit_adamw(&c);
}

/* Build, verify, optimise and emit the kernels of kinds; object bytes to
 * *obj (malloc'd). */
static bool compile_object(unsigned kinds, char **obj, size_t *objlen, char *err, size_t errlen) {
  Gen g;
  memset(&g, 0, sizeof g);
  if (!cg_module_begin(&g, "gradc_optim", err, errlen)) return false;
  for (int k = 0; k < 2; k++)
    if (kinds & (1u << k))
      for (int f64 = 0; f64 < 2; f64++) emit_kernel(&g, (CgOptimKind)k, f64);
  return cg_module_finish(&g, "optimiser module", true, false, obj, objlen);
}

/* Load the object into a fresh JIT and look the kernels up. */
static bool load_object(CgOptim *m, const char *obj, size_t len, char *err, size_t errlen) {
  if (!cg_check_llvm(LLVMOrcCreateLLJIT(&m->jit, NULL), "creating the JIT", err, errlen)) {
    m->jit = NULL;
    return false;
  }
  LLVMOrcJITDylibRef jd = LLVMOrcLLJITGetMainJITDylib(m->jit);
  LLVMOrcDefinitionGeneratorRef gen = NULL;
  if (!cg_check_llvm(LLVMOrcCreateDynamicLibrarySearchGeneratorForProcess(&gen, LLVMOrcLLJITGetGlobalPrefix(m->jit), NULL, NULL),
             "resolving process symbols", err, errlen))
    return false;
  LLVMOrcJITDylibAddGenerator(jd, gen);
  LLVMMemoryBufferRef buf = LLVMCreateMemoryBufferWithMemoryRangeCopy(obj, len, "gradc-optim");
  if (!cg_check_llvm(LLVMOrcLLJITAddObjectFile(m->jit, jd, buf), "loading the optimiser kernels", err, errlen)) return false;
  for (int k = 0; k < 2; k++)
    for (int f64 = 0; f64 < 2 && (m->kinds & (1u << k)); f64++) {
      LLVMOrcExecutorAddress addr = 0;
      if (!cg_check_llvm(LLVMOrcLLJITLookup(m->jit, &addr, kernel_symbol((CgOptimKind)k, f64)), kernel_symbol((CgOptimKind)k, f64),
                 err, errlen))
        return false;
      m->fn[k][f64] = (CgOptimFn)(uintptr_t)addr;
    }
  return true;
}

/* ------------------------------------------------------------------ */
/* API                                                                 */
/* ------------------------------------------------------------------ */

void cg_optim_free(CgOptim *m) {
  if (!m) return;
  if (m->jit) {
    LLVMErrorRef e = LLVMOrcDisposeLLJIT(m->jit);
    if (e) LLVMConsumeError(e);
  }
  free(m);
}

CgOptim *cg_optim_compile(unsigned kinds_mask, const char *cache_dir, char *err, size_t errlen) {
  /* The host id first: it initialises LLVM's native target (llvm.c). */
  char host[2048];
  cg_llvm_host_id(host, sizeof host);
  CgOptim *m = calloc(1, sizeof *m);
  if (!m) abort();
  m->kinds = kinds_mask & 3u;
  uint64_t key = hash_bytes(host, strlen(host), HASH_SEED);
  key = hash_bytes(OPTIM_VERSION, strlen(OPTIM_VERSION), key);
  key = hash_bytes(cg_generator_id(), strlen(cg_generator_id()), key); /* codegen/'s edits, as the kernels' keys */
  key = hash_bytes(&m->kinds, sizeof m->kinds, key);
  if (cache_dir) {
    size_t len = 0;
    char *data = cache_get(cache_dir, "cpu-optim", key, &len);
    if (data) {
      char lerr[256];
      bool ok = load_object(m, data, len, lerr, sizeof lerr);
      free(data);
      if (ok) {
        m->from_cache = true;
        return m;
      }
      /* an entry that does not load: compile afresh */
      unsigned kinds = m->kinds;
      cg_optim_free(m);
      m = calloc(1, sizeof *m);
      if (!m) abort();
      m->kinds = kinds;
    }
  }
  char *obj = NULL;
  size_t len = 0;
  bool ok = compile_object(m->kinds, &obj, &len, err, errlen) && load_object(m, obj, len, err, errlen);
  if (ok && cache_dir) cache_put(cache_dir, "cpu-optim", key, obj, len);
  free(obj);
  if (!ok) {
    cg_optim_free(m);
    return NULL;
  }
  return m;
}

CgOptimFn cg_optim_kernel(const CgOptim *m, CgOptimKind kind, bool f64) {
  if (!m || (kind != CG_OPTIM_SGD && kind != CG_OPTIM_ADAMW)) return NULL;
  return m->fn[kind][f64 ? 1 : 0];
}

unsigned cg_optim_kinds(const CgOptim *m) { return m ? m->kinds : 0; }

bool cg_optim_from_cache(const CgOptim *m) { return m && m->from_cache; }
