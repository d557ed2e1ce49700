/* llvm.c - the CPU back end's driver (DESIGN.md §6, docs/BACKEND.md):
 * every kernel of a planned function becomes one LLVM function
 *
 *   void kN_<ops>(ptr arena, i64 begin, i64 end, ptr offs)
 *
 * (kernels whose code differs only in their buffers' offsets share one,
 * body<N>, given the offsets in offs: emit_body) in one module, emitted
 * by llvm_row.c (row kernels) or llvm_loop.c (one op in a general loop
 * nest); the module is optimised for the host CPU
 * with LLVMRunPasses("default<O3>"), emitted as object code with
 * LLVMTargetMachineEmitToMemoryBuffer (without loop strength reduction:
 * init_llvm; kernels are split into chunks,
 * each its own LLVM context and module, compiled on a thread pool) and
 * loaded with ORC LLJIT
 * (LLVMOrcLLJITAddObjectFile), libm and libc symbols resolved from the
 * process.  The object bytes are kept (cg_module_object) so that a cache
 * or an artifact can load them again without LLVM's optimiser
 * (cg_module_load_object).  Every LLVM call that can fail is checked and
 * reported through err; nothing here exits.
 *
 * For profiling: GRADC_DUMP_LLVM (set) prints the optimised module to
 * stderr as CgOptions.dump_llvm does (the cache is bypassed), and
 * GRADC_PERF_MAP appends the loaded kernels' addresses to
 * /tmp/perf-<pid>.map, where `perf report` finds their names. */
#include <llvm-c/Core.h>
#include <llvm-c/Analysis.h>
#include <llvm-c/Error.h>
#include <llvm/Config/llvm-config.h>
#include <llvm-c/LLJIT.h>
#include <llvm-c/Object.h>
#include <llvm-c/Orc.h>
#include <llvm-c/Support.h>
#include <llvm-c/Target.h>
#include <llvm-c/TargetMachine.h>
#include <llvm-c/Transforms/PassBuilder.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cg_source_hash.h" /* GRADC_CG_SOURCE_HASH: made by the build (cmake/cg_hash.cmake) */
#include "llvm_gen.h"
#include "passes/passes.h" /* plan_in_group0: the views GEMMs (and matmul kernels) read */


struct CgModule {
  LLVMOrcLLJITRef jit;
  CgKernel *kernels; /* by group id, [0] unused */
  int maxgroup;
  /* Group-0 matmuls generated as kernels (passes/kernel_bmm.c), by
   * group ids after the IR's: bmm_ops[i] is kernel first_bmm + i. */
  const IrOp **bmm_ops;
  bool *bmm_store; /* bmm_ops[i] is the store twin (cg_module_matmul_store) */
  int nbmm, first_bmm;
  char *obj;         /* the object file (malloc'd) */
  size_t objlen;
  Arena names; /* the kernels' names and offset tables */
  bool from_cache;
};

bool cg_check_llvm(LLVMErrorRef e, const char *what, char *err, size_t n) {
  if (!e) return true;
  char *msg = LLVMGetErrorMessage(e);
  errf(err, n, "LLVM: %s: %s", what, msg ? msg : "unknown error");
  LLVMDisposeErrorMessage(msg);
  return false;
}

/* LLVM's remarks and warnings (a vectorisation hint it could not follow)
 * are not the user's business; an error (none is expected) is printed. */
static void diagnostic(LLVMDiagnosticInfoRef di, void *ctx) {
  (void)ctx;
  if (LLVMGetDiagInfoSeverity(di) != LLVMDSError) return;
  char *msg = LLVMGetDiagInfoDescription(di);
  fprintf(stderr, "gradc: LLVM: %s\n", msg ? msg : "unknown error");
  LLVMDisposeMessage(msg);
}

LLVMContextRef cg_context_new(void) {
  LLVMContextRef ctx = LLVMContextCreate();
  LLVMContextSetDiagnosticHandler(ctx, diagnostic, NULL);
  return ctx;
}

bool cg_emit_object(LLVMTargetMachineRef tm, LLVMModuleRef mod, char **obj, size_t *objlen, char *err, size_t n) {
  char *msg = NULL;
  LLVMMemoryBufferRef buf = NULL;
  if (LLVMTargetMachineEmitToMemoryBuffer(tm, mod, LLVMObjectFile, &msg, &buf)) {
    errf(err, n, "LLVM: emitting object code: %s", msg ? msg : "");
    LLVMDisposeMessage(msg);
    return false;
  }
  LLVMDisposeMessage(msg);
  *objlen = LLVMGetBufferSize(buf);
  *obj = mem_alloc(*objlen ? *objlen : 1);
  memcpy(*obj, LLVMGetBufferStart(buf), *objlen);
  LLVMDisposeMemoryBuffer(buf);
  return true;
}

static pthread_once_t init_once = PTHREAD_ONCE_INIT;
static bool init_ok;
static bool host_avx512; /* the host has AVX-512F (prefer_wide_vectors, gen_host_avx512) */
static void init_llvm(void) {
  init_ok = !LLVMInitializeNativeTarget() && !LLVMInitializeNativeAsmPrinter();
  /* Code generation without loop strength reduction: it was a third of
   * LLVM's time on the kernels (193 of 510 ms of llc on tinygpt large's)
   * and the kernels ran as fast without it (docs/DECISIONS.md).  LLVM's
   * options are the process's: a program that embeds gradc and uses the
   * same libLLVM gets it too, and its code stays correct (the pass only
   * chooses addressing). */
  const char *argv[] = {"gradc", "-disable-lsr"};
  LLVMParseCommandLineOptions(2, argv, NULL);
  char *feat = LLVMGetHostCPUFeatures();
  host_avx512 = feat && strstr(feat, "+avx512f") != NULL;
  LLVMDisposeMessage(feat);
}

bool gen_host_avx512(void) {
  pthread_once(&init_once, init_llvm);
  return host_avx512;
}

/* ------------------------------------------------------------------ */
/* Kernels of a function                                               */
/* ------------------------------------------------------------------ */

typedef struct KInfo {
  int group;
  IrOp **ops; /* into f->ops */
  int n;
  bool row;
  KpRowLayout layout;
  const char *name;
  int64_t iters, cost, setup;
  const IrValue **bufs; /* the arena values it touches (gen_kernel_buffers) */
  int nbufs;
  const KpBmm *bmm; /* a group-0 matmul generated as a kernel (ops[0]), or NULL */
  bool store;       /* bmm: the twin of a product into a gradient buffer that stores C */
  const char *key; /* its code without the buffers' offsets */
  int rep;         /* the first kernel of the same key (index into Kernels.k) */
  int copies;      /* kernels sharing this one's key (on the representative) */
} KInfo;

typedef struct Kernels {
  KInfo *k;
  int n;
  int maxgroup;
  int first_bmm; /* the group id of the first matmul kernel (maxgroup + 1 when none) */
  Arena a;
} Kernels;

/* A kernel's code does not depend on where its buffers are, only on its
 * ops, attributes, types, storage kinds and which buffers overlap: the
 * key says all that, so kernels that differ only in offsets (the layers
 * of a deep model) share one compiled body. */
static const char *kernel_key(Arena *a, const KInfo *ki) {
  StrBuf sb;
  sb_init(&sb);
  char tb[IR_TYPE_STR_MAX];
  if (ki->bmm) {
    /* The plan's numbers say its code; its buffers (the roots) differ only
     * in where they are (its loads carry no alias scopes), or in being
     * one address (gen_buf then reads one offset for both). */
    const KpBmm *p = ki->bmm;
    sb_printf(&sb, "bmm %lld %lld %lld %lld %lld %lld %lld %lld %lld %lld %lld %lld %lld %d %u %u %u;", (long long)p->M,
              (long long)p->N, (long long)p->K, (long long)p->aoff, (long long)p->boff, (long long)p->coff,
              (long long)p->am, (long long)p->ak, (long long)p->bk, (long long)p->bn, (long long)p->cm,
              (long long)p->cn, (long long)p->nbatch, (int)p->acc, p->azero, p->bzero, p->cdead);
    for (int d = 0; d < p->nbatch; d++)
      sb_printf(&sb, "%lld:%lld:%lld:%lld;", (long long)p->bdim[d], (long long)p->as[d], (long long)p->bs[d],
                (long long)p->cs[d]);
    for (int i = 0; i < ki->nbufs; i++) {
      int same = -1;
      for (int j = 0; j < i && same < 0; j++)
        if (ki->bufs[j]->offset == ki->bufs[i]->offset &&
            ir_numel(&ki->bufs[j]->type.shape) == ir_numel(&ki->bufs[i]->type.shape))
          same = j;
      sb_printf(&sb, "b%d:%d;", i, same);
    }
    const char *key = arena_strdup(a, sb_str(&sb));
    sb_free(&sb);
    return key;
  }
  for (int i = 0; i < ki->nbufs; i++) {
    const IrValue *v = ki->bufs[i];
    int cls = i, same = -1;
    int64_t lo = v->offset, hi = lo + ir_numel(&v->type.shape) * 8;
    for (int j = 0; j < i; j++) {
      const IrValue *w = ki->bufs[j];
      int64_t lo2 = w->offset, hi2 = lo2 + ir_numel(&w->type.shape) * 8;
      if (lo < hi2 && lo2 < hi) cls = j < cls ? j : cls; /* conservative: 8 bytes an element */
      if (same < 0 && lo == lo2 && v->storage == w->storage && ir_numel(&v->type.shape) == ir_numel(&w->type.shape))
        same = j; /* an output written over an operand (memplan): one address */
    }
    sb_printf(&sb, "b%d:%d:%d:%d;", i, (int)v->storage, cls, same);
  }
  for (int q = 0; q < ki->n; q++) {
    const IrOp *op = ki->ops[q];
    sb_printf(&sb, "|%s", ir_op_info[op->opcode].name);
    for (int j = 0; j < op->nargs; j++) {
      const IrValue *v = op->args[j];
      int d = -1, b = -1;
      for (int r = 0; r < q; r++)
        if (ki->ops[r]->result == v) d = r;
      for (int r = 0; r < ki->nbufs; r++)
        if (ki->bufs[r] == v) b = r;
      if (d >= 0)
        sb_printf(&sb, " d%d", d);
      else if (b >= 0)
        sb_printf(&sb, " b%d", b);
      else if (v->def && v->def->opcode == IR_OP_CONST)
        sb_printf(&sb, " c%.17g", ir_attr_get_float(v->def, "value", 0.0));
      else
        sb_puts(&sb, " n");
      sb_printf(&sb, ":%s", ir_type_str(&v->type, tb, sizeof tb));
    }
    for (int k = 0; k < op->nattrs; k++) {
      const IrAttr *at = &op->attrs[k];
      sb_printf(&sb, " %s=", at->key);
      switch (at->kind) {
      case IR_ATTR_INT:
      case IR_ATTR_BOOL: sb_printf(&sb, "%lld", (long long)at->i); break;
      case IR_ATTR_FLOAT: sb_printf(&sb, "%.17g", at->f); break;
      case IR_ATTR_STR: sb_printf(&sb, "\"%s\"", at->s); break;
      case IR_ATTR_INTS:
        for (int i = 0; i < at->n; i++) sb_printf(&sb, "%s%lld", i ? "," : "[", (long long)at->ints[i]);
        sb_putc(&sb, ']');
        break;
      }
    }
    int b = -1;
    for (int r = 0; r < ki->nbufs; r++)
      if (ki->bufs[r] == op->result) b = r;
    sb_printf(&sb, " -> %s b%d", ir_type_str(&op->result->type, tb, sizeof tb), b);
  }
  const char *key = arena_strdup(a, sb_str(&sb));
  sb_free(&sb);
  return key;
}

/* Collect the kernels (kp_kernels_find) and what the generator needs of each. */
static bool find_kernels(const IrFunc *f, Kernels *K, char *err, size_t errlen) {
  memset(K, 0, sizeof *K);
  arena_init(&K->a);
  KpKernels kk;
  if (!kp_kernels_find(f, &K->a, &kk, err, errlen)) return false;
  K->k = ARENA_ARRAY(&K->a, KInfo, kk.n > 0 ? kk.n : 1);
  K->maxgroup = kk.maxgroup;
  for (int q = 0; q < kk.n; q++) {
    const KpKernel *kp = &kk.k[q];
    KInfo *ki = &K->k[K->n++];
    ki->group = kp->group;
    ki->ops = kp->ops;
    ki->n = kp->n;
    ki->row = kp->row;
    ki->layout = kp->layout;
    ki->name = kp->name;
    gen_kernel_extent(f, ki->ops, ki->n, ki->row ? &ki->layout : NULL, &ki->iters, &ki->cost);
    int maxb = (ki->row ? ki->layout.nslots : 0) + (ki->n > 0 ? ki->ops[0]->nargs : 0) + 2;
    ki->bufs = ARENA_ARRAY(&K->a, const IrValue *, maxb);
    ki->nbufs = gen_kernel_buffers(ki->ops, ki->n, ki->row ? &ki->layout : NULL, ki->bufs);
    ki->key = kernel_key(&K->a, ki);
  }
  /* Then the group-0 matmuls that run as generated kernels. */
  K->first_bmm = K->maxgroup + 1;
  KpViews vs;
  kp_views_find(f, plan_in_group0, NULL, &vs);
  int nbmm = 0;
  for (int i = 0; i < f->nops; i++) {
    KpBmm p;
    nbmm += kp_bmm_plan(&vs, f->ops[i], &p);
  }
  if (nbmm > 0) {
    /* Room for a store twin of each (below). */
    KInfo *all = ARENA_ARRAY(&K->a, KInfo, K->n + 2 * nbmm);
    if (K->n) memcpy(all, K->k, sizeof(KInfo) * (size_t)K->n);
    K->k = all;
  }
  for (int i = 0; i < f->nops && nbmm > 0; i++) {
    KpBmm *p = ARENA_NEW(&K->a, KpBmm);
    if (!kp_bmm_plan(&vs, f->ops[i], p)) continue;
    KInfo *ki = &K->k[K->n++];
    memset(ki, 0, sizeof *ki);
    ki->group = ++K->maxgroup;
    ki->ops = f->ops + i;
    ki->n = 1;
    ki->bmm = p;
    char name[64];
    snprintf(name, sizeof name, "k%d_matmul", ki->group);
    ki->name = arena_strdup(&K->a, name);
    gen_bmm_extent(p, &ki->iters, &ki->cost, &ki->setup);
    ki->bufs = ARENA_ARRAY(&K->a, const IrValue *, 3);
    const IrValue *roots[3] = {p->a, p->b, p->c};
    for (int r = 0; r < 3; r++) {
      bool seen = false;
      for (int q = 0; q < ki->nbufs; q++) seen |= ki->bufs[q] == roots[r];
      if (!seen) ki->bufs[ki->nbufs++] = roots[r];
    }
    ki->key = kernel_key(&K->a, ki);
  }
  /* A product that adds into a gradient buffer has a twin that stores
   * instead (group ids after every product's): the CPU executor runs it
   * in a window's first micro-batch where nothing before it wrote those
   * bytes, which then need no zeroing (exec.c plan_zeroing). */
  for (int k = 0, n = K->n; k < n; k++) {
    if (!K->k[k].bmm || !K->k[k].bmm->acc) continue;
    KpBmm *p = ARENA_NEW(&K->a, KpBmm);
    *p = *K->k[k].bmm;
    p->acc = false;
    KInfo *ki = &K->k[K->n++];
    *ki = K->k[k];
    ki->group = ++K->maxgroup;
    ki->bmm = p;
    ki->store = true;
    char name[64];
    snprintf(name, sizeof name, "k%d_matmul_store", K->k[k].group);
    ki->name = arena_strdup(&K->a, name);
    ki->key = kernel_key(&K->a, ki);
  }
  kp_views_free(&vs);
  /* Representatives of each key. */
  StrMap reps;
  strmap_init(&reps);
  for (int k = 0; k < K->n; k++) {
    KInfo *ki = &K->k[k];
    intptr_t r = (intptr_t)strmap_get(&reps, ki->key);
    if (!r) {
      strmap_put(&reps, ki->key, (void *)(intptr_t)(k + 1));
      r = k + 1;
    }
    ki->rep = (int)r - 1;
    K->k[ki->rep].copies++;
  }
  strmap_free(&reps);
  return true;
}

/* ------------------------------------------------------------------ */
/* Host and target machine                                             */
/* ------------------------------------------------------------------ */

void cg_llvm_host_id(char *buf, size_t n) {
  pthread_once(&init_once, init_llvm);
  char *triple = LLVMGetDefaultTargetTriple(), *cpu = LLVMGetHostCPUName(), *feat = LLVMGetHostCPUFeatures();
  snprintf(buf, n, "%s;%s;%s;llvm%d", triple ? triple : "", cpu ? cpu : "", feat ? feat : "", LLVM_VERSION_MAJOR);
  LLVMDisposeMessage(triple);
  LLVMDisposeMessage(cpu);
  LLVMDisposeMessage(feat);
}

static LLVMTargetMachineRef host_machine(char *err, size_t errlen) {
  char *triple = LLVMGetDefaultTargetTriple(), *cpu = LLVMGetHostCPUName(), *feat = LLVMGetHostCPUFeatures();
  LLVMTargetRef target = NULL;
  char *msg = NULL;
  LLVMTargetMachineRef tm = NULL;
  if (LLVMGetTargetFromTriple(triple, &target, &msg)) {
    errf(err, errlen, "LLVM: no target for %s: %s", triple, msg ? msg : "");
  } else {
    tm = LLVMCreateTargetMachine(target, triple, cpu, feat, LLVMCodeGenLevelAggressive, LLVMRelocPIC,
                                 LLVMCodeModelDefault);
    if (!tm) errf(err, errlen, "LLVM: cannot create a target machine for %s (%s)", triple, cpu);
  }
  LLVMDisposeMessage(msg);
  LLVMDisposeMessage(triple);
  LLVMDisposeMessage(cpu);
  LLVMDisposeMessage(feat);
  return tm;
}

bool cg_module_begin(Gen *g, const char *name, char *err, size_t errlen) {
  LLVMTargetMachineRef tm = host_machine(err, errlen);
  if (!tm) return false;
  g->tm = tm;
  g->err = err;
  g->errlen = errlen;
  g->ctx = cg_context_new();
  g->mod = LLVMModuleCreateWithNameInContext(name, g->ctx);
  char *triple = LLVMGetTargetMachineTriple(tm);
  LLVMSetTarget(g->mod, triple);
  LLVMDisposeMessage(triple);
  LLVMTargetDataRef td = LLVMCreateTargetDataLayout(tm);
  LLVMSetModuleDataLayout(g->mod, td);
  LLVMDisposeTargetData(td);
  g->b = LLVMCreateBuilderInContext(g->ctx);
  g->t_void = LLVMVoidTypeInContext(g->ctx);
  g->t_i1 = LLVMInt1TypeInContext(g->ctx);
  g->t_i8 = LLVMInt8TypeInContext(g->ctx);
  g->t_i16 = LLVMInt16TypeInContext(g->ctx);
  g->t_i32 = LLVMInt32TypeInContext(g->ctx);
  g->t_i64 = LLVMInt64TypeInContext(g->ctx);
  g->t_f32 = LLVMFloatTypeInContext(g->ctx);
  g->t_f64 = LLVMDoubleTypeInContext(g->ctx);
  g->t_ptr = LLVMPointerTypeInContext(g->ctx, 0);
  return true;
}

bool cg_module_finish(Gen *g, const char *what, bool unroll, bool dump, char **obj, size_t *objlen) {
  bool ok = !g->failed;
  char *msg = NULL;
  if (ok && LLVMVerifyModule(g->mod, LLVMReturnStatusAction, &msg))
    ok = errf(g->err, g->errlen, "LLVM: the %s does not verify: %.400s", what, msg ? msg : "");
  LLVMDisposeMessage(msg);
  if (ok) {
    LLVMPassBuilderOptionsRef po = LLVMCreatePassBuilderOptions();
    LLVMPassBuilderOptionsSetLoopVectorization(po, 1);
    LLVMPassBuilderOptionsSetSLPVectorization(po, 1);
    LLVMPassBuilderOptionsSetLoopInterleaving(po, 1);
    if (!unroll) LLVMPassBuilderOptionsSetLoopUnrolling(po, 0);
    ok = cg_check_llvm(LLVMRunPasses(g->mod, "default<O3>", g->tm, po), "optimising", g->err, g->errlen);
    LLVMDisposePassBuilderOptions(po);
  }
  if (ok && dump) {
    char *text = LLVMPrintModuleToString(g->mod);
    fputs(text, stderr);
    LLVMDisposeMessage(text);
  }
  ok = ok && cg_emit_object(g->tm, g->mod, obj, objlen, g->err, g->errlen);
  LLVMDisposeBuilder(g->b);
  LLVMDisposeModule(g->mod);
  LLVMContextDispose(g->ctx);
  LLVMDisposeTargetMachine(g->tm);
  return ok;
}

/* ------------------------------------------------------------------ */
/* Emission                                                            */
/* ------------------------------------------------------------------ */

static void add_attr(Gen *g, LLVMValueRef fn, const char *name) {
  unsigned kind = LLVMGetEnumAttributeKindForName(name, strlen(name));
  LLVMAddAttributeAtIndex(fn, LLVMAttributeFunctionIndex, LLVMCreateEnumAttribute(g->ctx, kind, 0));
}

/* Let the backend fuse a multiply and the add that consumes it into one
 * FMA (the polynomials of exp, tanh and the activations are chains of
 * them): one rounding fewer per pair, well within what the kernels promise
 * against the reference interpreter, and about a fifth fewer instructions. */
static void allow_contraction(LLVMValueRef fn) {
  for (LLVMBasicBlockRef bb = LLVMGetFirstBasicBlock(fn); bb; bb = LLVMGetNextBasicBlock(bb))
    for (LLVMValueRef in = LLVMGetFirstInstruction(bb); in; in = LLVMGetNextInstruction(in)) {
      LLVMOpcode op = LLVMGetInstructionOpcode(in);
      if ((op == LLVMFMul || op == LLVMFAdd || op == LLVMFSub) && LLVMCanValueUseFastMathFlags(in))
        LLVMSetFastMathFlags(in, LLVMGetFastMathFlags(in) | LLVMFastMathAllowContract);
    }
}

/* On a host with AVX-512, kernels vectorise 16 floats wide (LLVM's
 * default for these CPUs is 8, against AVX-512's frequency drop on early
 * Xeons): on an Intel Xeon exposing AMX (lscpu model 167) tinygpt large's
 * gelu backward kernels went from 17.2 to 12.8 ms a step and add_gelu
 * from 6.6 to 5.5 (one thread, bench/RESULTS.md).  The host's features
 * are in every kernel's cache key already (cg_llvm_host_id). */
static void prefer_wide_vectors(Gen *g, LLVMValueRef fn) {
  if (!host_avx512) return; /* set by init_llvm, which every compile runs first */
  LLVMAttributeRef a = LLVMCreateStringAttribute(g->ctx, "prefer-vector-width", 19, "512", 3);
  LLVMAddAttributeAtIndex(fn, LLVMAttributeFunctionIndex, a);
}

/* The symbol of representative ki's code: its own name, or body<group>
 * where kernels share it. */
static void body_name(const KInfo *ki, char *buf, size_t n) {
  if (ki->copies > 1) snprintf(buf, n, "body%d", ki->group);
  else snprintf(buf, n, "%s", ki->name);
}

/* The code of representative ki: void name(arena, begin, end, offs),
 * every kernel's signature (CgKernelFn).  Alone (ki->copies 1) it is
 * named for the kernel and its buffers' offsets are constants; shared,
 * it is the body every kernel of its key runs, named body<group>, and
 * buffer i is at arena + offs[i], the table the kernel's CgKernel holds
 * (load_object).  Kernels call their body directly rather than
 * through a wrapper each: on tinygpt large's 88 kernels of 16 keys the
 * wrappers, two instructions each, were a tenth of the cold compile
 * (LLVM's pipelines run per function). */
static void emit_body(Gen *g, const KInfo *ki) {
  LLVMTypeRef params[4] = {g->t_ptr, g->t_i64, g->t_i64, g->t_ptr};
  LLVMTypeRef ft = LLVMFunctionType(g->t_void, params, 4, 0);
  char name[64];
  body_name(ki, name, sizeof name);
  g->fn = LLVMAddFunction(g->mod, name, ft);
  g->group = ki->group;
  g->arena = LLVMGetParam(g->fn, 0);
  g->begin = LLVMGetParam(g->fn, 1);
  g->end = LLVMGetParam(g->fn, 2);
  g->offs = ki->copies > 1 ? LLVMGetParam(g->fn, 3) : NULL;
  LLVMSetValueName2(g->arena, "arena", 5);
  LLVMSetValueName2(g->begin, "begin", 5);
  LLVMSetValueName2(g->end, "end", 3);
  LLVMSetValueName2(LLVMGetParam(g->fn, 3), "offs", 4);
  add_attr(g, g->fn, "nounwind");
  prefer_wide_vectors(g, g->fn);
  g->entry = LLVMAppendBasicBlockInContext(g->ctx, g->fn, "entry");
  LLVMPositionBuilderAtEnd(g->b, g->entry);
  g->nexact_bf16 = 0;
  gen_scopes_begin(g);
  for (int i = 0; i < ki->nbufs; i++) gen_scope_add(g, ki->bufs[i]);
  gen_scopes_end(g);
  if (ki->bmm)
    gen_bmm_kernel(g, ki->bmm);
  else if (ki->row)
    gen_row_kernel(g, ki->ops, ki->n, &ki->layout);
  else
    gen_loop_kernel(g, ki->ops[0]);
  gen_scopes_free(g);
  g->offs = NULL;
  allow_contraction(g->fn);
}

/* Build, verify, optimise and emit one module holding the code of the
 * representatives ks[0..n); its object bytes to *obj (malloc'd). */
static bool compile_chunk(const IrFunc *f, KInfo *const *ks, int n, bool dump, char **obj, size_t *objlen, char *err,
                          size_t errlen) {
  Gen g;
  memset(&g, 0, sizeof g);
  g.f = f;
  if (!cg_module_begin(&g, f->name ? f->name : "gradc", err, errlen)) return false;
  for (int i = 0; i < n && !g.failed; i++) emit_body(&g, ks[i]);
  /* Full unrolling of short rows costs more compile time than it saves. */
  return cg_module_finish(&g, "generated module", false, dump, obj, objlen);
}

/* The object bundle: "GRDCOBJ1", a u32 count, then per object a u64
 * length and its bytes (little-endian, as every supported host). */
static const char bundle_magic[8] = {'G', 'R', 'D', 'C', 'O', 'B', 'J', '1'};

/* Whether obj starts as a bundle does, and its object count. */
static bool bundle_count(const char *obj, size_t len, uint32_t *n) {
  if (len < sizeof bundle_magic + 4 || memcmp(obj, bundle_magic, sizeof bundle_magic) != 0) return false;
  memcpy(n, obj + sizeof bundle_magic, 4);
  return true;
}

typedef struct Chunk {
  KInfo **ks;
  int n;
  int64_t work;
  char *obj;
  size_t len;
  bool ok;
  char err[512];
} Chunk;

typedef struct ChunkJob {
  const IrFunc *f;
  Kernels *K;
  Chunk *c;
  bool dump;
} ChunkJob;

static void compile_chunks(void *ctx, int64_t begin, int64_t end) {
  ChunkJob *job = ctx;
  for (int64_t i = begin; i < end; i++) {
    Chunk *c = &job->c[i];
    c->ok = compile_chunk(job->f, c->ks, c->n, job->dump, &c->obj, &c->len, c->err, sizeof c->err);
  }
}

static int64_t kernel_work(const KInfo *k) { return 4 + (int64_t)k->n; }

/* Compile every kernel, in chunks on CgOptions.threads threads (0: every
 * core), into one bundle of objects. */
static bool compile_object(const IrFunc *f, Kernels *K, const CgOptions *o, char **obj, size_t *objlen, char *err,
                           size_t errlen) {
  bool dump = (o && o->dump_llvm) || getenv("GRADC_DUMP_LLVM");
  int threads = o && o->threads > 0 ? o->threads : pool_ncores();
  int nreps = 0;
  for (int i = 0; i < K->n; i++) nreps += K->k[i].rep == i;
  int nch = dump ? 1 : nreps / 8 + 1; /* a chunk of a few kernels is worth a thread */
  if (nch > threads) nch = threads;
  if (nch > nreps) nch = nreps > 0 ? nreps : 1;
  Chunk *c = calloc((size_t)nch, sizeof *c);
  KInfo **order = malloc(sizeof(KInfo *) * (size_t)(K->n ? K->n : 1));
  if (!c || !order) abort();
  for (int i = 0; i < nch; i++) {
    c[i].ks = malloc(sizeof(KInfo *) * (size_t)(K->n ? K->n : 1));
    if (!c[i].ks) abort();
  }
  /* Representatives, largest first, into the lightest chunk. */
  int nrep = 0;
  for (int i = 0; i < K->n; i++)
    if (K->k[i].rep == i) order[nrep++] = &K->k[i];
  for (int i = 1; i < nrep; i++)
    for (int j = i; j > 0 && kernel_work(order[j]) > kernel_work(order[j - 1]); j--) {
      KInfo *t = order[j];
      order[j] = order[j - 1];
      order[j - 1] = t;
    }
  for (int i = 0; i < nrep; i++) {
    int best = 0;
    for (int q = 1; q < nch; q++)
      if (c[q].work < c[best].work) best = q;
    c[best].ks[c[best].n++] = order[i];
    c[best].work += kernel_work(order[i]);
  }
  ChunkJob job = {f, K, c, dump};
  Pool *pool = nch > 1 ? pool_new(nch) : NULL;
  pool_run(pool, nch, 1, compile_chunks, &job);
  pool_free(pool);
  bool ok = true;
  size_t total = sizeof bundle_magic + 4;
  for (int i = 0; i < nch; i++) {
    if (!c[i].ok && ok) ok = errf(err, errlen, "%s", c[i].err);
    total += 8 + c[i].len;
  }
  if (ok) {
    char *b = malloc(total), *p = b;
    if (!b) abort();
    memcpy(p, bundle_magic, sizeof bundle_magic);
    p += sizeof bundle_magic;
    uint32_t n32 = (uint32_t)nch;
    memcpy(p, &n32, 4);
    p += 4;
    for (int i = 0; i < nch; i++) {
      uint64_t l = c[i].len;
      memcpy(p, &l, 8);
      memcpy(p + 8, c[i].obj, c[i].len);
      p += 8 + c[i].len;
    }
    *obj = b;
    *objlen = total;
  }
  for (int i = 0; i < nch; i++) {
    free(c[i].obj);
    free(c[i].ks);
  }
  free(c);
  free(order);
  return ok;
}

/* ------------------------------------------------------------------ */
/* Loading object code                                                 */
/* ------------------------------------------------------------------ */

/* With GRADC_PERF_MAP set, every function of the loaded objects (kernels,
 * their shared bodies) is appended to /tmp/perf-<pid>.map, so that
 * `perf report` names generated code.  An object's .text is loaded whole:
 * one exported kernel's JIT address fixes the others'. */
static void perf_map(CgModule *m, const Kernels *K, const char *obj, size_t len) {
  LLVMMemoryBufferRef mb = LLVMCreateMemoryBufferWithMemoryRangeCopy(obj, len, "gradc-kernels");
  char *msg = NULL;
  LLVMBinaryRef bin = LLVMCreateBinary(mb, NULL, &msg);
  LLVMDisposeMessage(msg);
  if (!bin) {
    LLVMDisposeMemoryBuffer(mb);
    return;
  }
  int64_t delta = 0;
  bool found = false;
  LLVMSymbolIteratorRef it = LLVMObjectFileCopySymbolIterator(bin);
  for (; !found && !LLVMObjectFileIsSymbolIteratorAtEnd(bin, it); LLVMMoveToNextSymbol(it)) {
    const char *nm = LLVMGetSymbolName(it);
    for (int i = 0; nm && i < K->n && !found; i++)
      if (strcmp(nm, K->k[i].name) == 0 && m->kernels[K->k[i].group].fn) {
        delta = (int64_t)(uintptr_t)m->kernels[K->k[i].group].fn - (int64_t)LLVMGetSymbolAddress(it);
        found = true;
      }
  }
  LLVMDisposeSymbolIterator(it);
  char path[64];
  snprintf(path, sizeof path, "/tmp/perf-%d.map", (int)getpid());
  FILE *fp = found ? fopen(path, "a") : NULL;
  if (fp) {
    it = LLVMObjectFileCopySymbolIterator(bin);
    for (; !LLVMObjectFileIsSymbolIteratorAtEnd(bin, it); LLVMMoveToNextSymbol(it)) {
      const char *nm = LLVMGetSymbolName(it);
      uint64_t size = LLVMGetSymbolSize(it);
      if (nm && *nm && size > 0)
        fprintf(fp, "%llx %llx %s\n", (unsigned long long)(LLVMGetSymbolAddress(it) + (uint64_t)delta),
                (unsigned long long)size, nm);
    }
    LLVMDisposeSymbolIterator(it);
    fclose(fp);
  }
  LLVMDisposeBinary(bin);
  LLVMDisposeMemoryBuffer(mb);
}

static bool load_object(CgModule *m, const Kernels *K, char *err, size_t errlen) {
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
  /* the bundle's objects */
  const char *p = m->obj, *end = m->obj + m->objlen;
  uint32_t n = 0;
  if (!bundle_count(m->obj, m->objlen, &n)) return errf(err, errlen, "not a gradc object bundle");
  p += sizeof bundle_magic + 4;
  for (uint32_t i = 0; i < n; i++) {
    uint64_t len;
    if (end - p < 8) return errf(err, errlen, "a truncated object bundle");
    memcpy(&len, p, 8);
    p += 8;
    if ((uint64_t)(end - p) < len) return errf(err, errlen, "a truncated object bundle");
    LLVMMemoryBufferRef buf = LLVMCreateMemoryBufferWithMemoryRangeCopy(p, (size_t)len, "gradc-kernels");
    if (!cg_check_llvm(LLVMOrcLLJITAddObjectFile(m->jit, jd, buf), "loading object code", err, errlen)) return false;
    p += len;
  }
  for (int i = 0; i < K->n; i++) {
    const KInfo *ki = &K->k[i], *rep = &K->k[ki->rep];
    char sym[64];
    body_name(rep, sym, sizeof sym);
    LLVMOrcExecutorAddress addr = 0;
    if (!cg_check_llvm(LLVMOrcLLJITLookup(m->jit, &addr, sym), ki->name, err, errlen)) return false;
    CgKernel *k = &m->kernels[ki->group];
    k->group = ki->group;
    k->name = arena_strdup(&m->names, ki->name);
    k->fn = (CgKernelFn)(uintptr_t)addr;
    k->offs = NULL;
    if (rep->copies > 1) { /* its buffers' offsets, in the order the body registered them */
      int64_t *offs = ARENA_ARRAY(&m->names, int64_t, ki->nbufs > 0 ? ki->nbufs : 1);
      for (int j = 0; j < ki->nbufs; j++) offs[j] = ki->bufs[j]->offset;
      k->offs = offs;
    }
    k->iters = ki->iters;
    k->cost = ki->cost;
    k->setup = ki->setup;
  }
  if (getenv("GRADC_PERF_MAP")) {
    p = m->obj + sizeof bundle_magic + 4;
    for (uint32_t i = 0; i < n; i++) {
      uint64_t len;
      memcpy(&len, p, 8);
      perf_map(m, K, p + 8, (size_t)len);
      p += 8 + len;
    }
  }
  return true;
}

static CgModule *module_new(const Kernels *K) {
  CgModule *m = calloc(1, sizeof *m);
  if (!m) abort();
  arena_init(&m->names);
  m->maxgroup = K->maxgroup;
  m->kernels = calloc((size_t)K->maxgroup + 1, sizeof(CgKernel));
  m->first_bmm = K->first_bmm;
  m->nbmm = K->maxgroup - K->first_bmm + 1;
  m->bmm_ops = calloc((size_t)m->nbmm + 1, sizeof(IrOp *));
  m->bmm_store = calloc((size_t)m->nbmm + 1, sizeof(bool));
  if (!m->kernels || !m->bmm_ops || !m->bmm_store) abort();
  for (int i = 0; i < K->n; i++) {
    if (!K->k[i].bmm) continue;
    m->bmm_ops[K->k[i].group - K->first_bmm] = K->k[i].ops[0];
    m->bmm_store[K->k[i].group - K->first_bmm] = K->k[i].store;
  }
  return m;
}

void cg_module_free(CgModule *m) {
  if (!m) return;
  if (m->jit) {
    LLVMErrorRef e = LLVMOrcDisposeLLJIT(m->jit);
    if (e) LLVMConsumeError(e);
  }
  free(m->kernels);
  free(m->bmm_ops);
  free(m->bmm_store);
  free(m->obj);
  arena_free(&m->names);
  free(m);
}

/* ------------------------------------------------------------------ */
/* The on-disk cache (support/cache.c, kind "cpu-obj"): keyed by the    */
/* planned IR, the host and this generator's version.                  */
/* ------------------------------------------------------------------ */

const char *cg_generator_id(void) { return CG_VERSION "+" GRADC_CG_SOURCE_HASH; }

static uint64_t cache_key(const IrFunc *f) {
  StrBuf sb;
  sb_init(&sb);
  ir_print(f, &sb);
  char host[1024];
  cg_llvm_host_id(host, sizeof host);
  uint64_t h = hash_bytes(sb_str(&sb), sb.len, HASH_SEED);
  h = hash_bytes(host, strlen(host), h);
  h = hash_bytes(cg_generator_id(), strlen(cg_generator_id()), h);
  sb_free(&sb);
  return h;
}

/* ------------------------------------------------------------------ */
/* API                                                                 */
/* ------------------------------------------------------------------ */

static _Atomic int compile_count;

int cg_llvm_compile_count(void) { return compile_count; }

CgModule *cg_llvm_compile(const IrFunc *f, const CgOptions *o, char *err, size_t errlen) {
  compile_count++;
  pthread_once(&init_once, init_llvm);
  if (!init_ok) {
    errf(err, errlen, "LLVM: cannot initialise the native target");
    return NULL;
  }
  Kernels K;
  if (!find_kernels(f, &K, err, errlen)) {
    arena_free(&K.a);
    return NULL;
  }
  CgModule *m = module_new(&K);
  uint64_t key = 0;
  bool cached = o && o->cache_dir && !o->dump_llvm && !getenv("GRADC_DUMP_LLVM");
  if (cached) {
    key = cache_key(f);
    size_t len = 0;
    char *data = cache_get(o->cache_dir, "cpu-obj", key, &len);
    if (data) {
      m->obj = data;
      m->objlen = len;
      char lerr[256];
      if (load_object(m, &K, lerr, sizeof lerr)) {
        m->from_cache = true;
        arena_free(&K.a);
        return m;
      }
      /* an entry that does not load: compile afresh */
      cg_module_free(m);
      m = module_new(&K);
    }
  }
  bool ok = compile_object(f, &K, o, &m->obj, &m->objlen, err, errlen) && load_object(m, &K, err, errlen);
  if (ok && cached) cache_put(o->cache_dir, "cpu-obj", key, m->obj, m->objlen);
  arena_free(&K.a);
  if (!ok) {
    cg_module_free(m);
    return NULL;
  }
  return m;
}

CgModule *cg_module_load_object(const IrFunc *f, const void *obj, size_t len, char *err, size_t errlen) {
  pthread_once(&init_once, init_llvm);
  if (!init_ok) {
    errf(err, errlen, "LLVM: cannot initialise the native target");
    return NULL;
  }
  Kernels K;
  if (!find_kernels(f, &K, err, errlen)) {
    arena_free(&K.a);
    return NULL;
  }
  CgModule *m = module_new(&K);
  m->obj = malloc(len ? len : 1);
  if (!m->obj) abort();
  memcpy(m->obj, obj, len);
  m->objlen = len;
  bool ok = load_object(m, &K, err, errlen);
  arena_free(&K.a);
  if (!ok) {
    cg_module_free(m);
    return NULL;
  }
  return m;
}

void cg_module_object(const CgModule *m, const void **data, size_t *len) {
  *data = m->obj;
  *len = m->objlen;
}

bool cg_module_from_cache(const CgModule *m) { return m->from_cache; }

const CgKernel *cg_module_kernel(const CgModule *m, int group) {
  if (group < 1 || group > m->maxgroup || !m->kernels[group].fn) return NULL;
  return &m->kernels[group];
}

int cg_module_nkernels(const CgModule *m) { return m->maxgroup; }

int cg_module_chunks(const CgModule *m) {
  uint32_t n = 0;
  return bundle_count(m->obj, m->objlen, &n) ? (int)n : 0;
}

static const CgKernel *module_matmul(const CgModule *m, const IrOp *op, bool store) {
  for (int i = 0; m && i < m->nbmm; i++)
    if (m->bmm_ops[i] == op && m->bmm_store[i] == store) return cg_module_kernel(m, m->first_bmm + i);
  return NULL;
}

const CgKernel *cg_module_matmul(const CgModule *m, const IrOp *op) { return module_matmul(m, op, false); }

const CgKernel *cg_module_matmul_store(const CgModule *m, const IrOp *op) { return module_matmul(m, op, true); }
