/* cuda_nvrtc.c - NVRTC, the CUDA runtime compiler, loaded with dlopen on
 * first use (DESIGN.md §6): gradc never links it, so a CPU run does not
 * map it and the build needs no CUDA toolkit.  The few types and functions
 * used are declared here (their C ABI is stable across NVRTC 11 to 13).
 *
 * Search order: $GRADC_NVRTC (a path), libnvrtc.so.13, .12, .11.2 and
 * libnvrtc.so through the dynamic linker's path, then the toolkit's
 * directory found at configure time (GRADC_CUDA_LIBDIR) and
 * /usr/local/cuda/lib64.
 *
 * A warm compile finds every program in the cache, whose keys hold the
 * NVRTC version: cg_nvrtc_version_cached then reads the version from a
 * small cache entry naming the library file that was loaded last (its
 * path, size, modification time and inode, under the search's inputs:
 * $GRADC_NVRTC, $LD_LIBRARY_PATH), so that such a compile does not load
 * NVRTC at all (dlopen of its 100 MB costs ~20 ms). */
#define _GNU_SOURCE /* dladdr */
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cuda.h"

typedef int nvrtcResult; /* NVRTC_SUCCESS = 0 */
typedef struct _nvrtcProgram *nvrtcProgram;

static struct {
  void *lib;
  const char *(*GetErrorString)(nvrtcResult);
  nvrtcResult (*Version)(int *, int *);
  nvrtcResult (*GetNumSupportedArchs)(int *);
  nvrtcResult (*GetSupportedArchs)(int *);
  nvrtcResult (*CreateProgram)(nvrtcProgram *, const char *, const char *, int, const char *const *,
                               const char *const *);
  nvrtcResult (*DestroyProgram)(nvrtcProgram *);
  nvrtcResult (*CompileProgram)(nvrtcProgram, int, const char *const *);
  nvrtcResult (*GetPTXSize)(nvrtcProgram, size_t *);
  nvrtcResult (*GetPTX)(nvrtcProgram, char *);
  nvrtcResult (*GetCUBINSize)(nvrtcProgram, size_t *);
  nvrtcResult (*GetCUBIN)(nvrtcProgram, char *);
  nvrtcResult (*GetProgramLogSize)(nvrtcProgram, size_t *);
  nvrtcResult (*GetProgramLog)(nvrtcProgram, char *);
} nv;

static pthread_once_t once = PTHREAD_ONCE_INIT;
static char load_error[512];
static atomic_int compile_calls;

static void *open_first(void) {
  const char *env = getenv("GRADC_NVRTC");
  if (env && *env) return dlopen(env, RTLD_NOW | RTLD_LOCAL);
  static const char *const names[] = {
      "libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so.11.2", "libnvrtc.so",
#ifdef GRADC_CUDA_LIBDIR
      GRADC_CUDA_LIBDIR "/libnvrtc.so",
#endif
      "/usr/local/cuda/lib64/libnvrtc.so",
  };
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
    void *h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    if (h) return h;
  }
  return NULL;
}

static void load(void) {
  void *h = open_first();
  if (!h) {
    const char *env = getenv("GRADC_NVRTC");
    snprintf(load_error, sizeof load_error, "NVRTC not found (%s%s); the CUDA target needs the CUDA toolkit's libnvrtc",
             env && *env ? "GRADC_NVRTC=" : "libnvrtc.so", env && *env ? env : "");
    return;
  }
#define SYM(field, name)                                                                                  \
  do {                                                                                                    \
    *(void **)&nv.field = dlsym(h, name);                                                                 \
    if (!nv.field) {                                                                                      \
      snprintf(load_error, sizeof load_error, "NVRTC: the library has no %s (too old: NVRTC 11.2 or newer needed)", name); \
      dlclose(h);                                                                                         \
      return;                                                                                             \
    }                                                                                                     \
  } while (0)
  SYM(GetErrorString, "nvrtcGetErrorString");
  SYM(Version, "nvrtcVersion");
  SYM(GetNumSupportedArchs, "nvrtcGetNumSupportedArchs");
  SYM(GetSupportedArchs, "nvrtcGetSupportedArchs");
  SYM(CreateProgram, "nvrtcCreateProgram");
  SYM(DestroyProgram, "nvrtcDestroyProgram");
  SYM(CompileProgram, "nvrtcCompileProgram");
  SYM(GetPTXSize, "nvrtcGetPTXSize");
  SYM(GetPTX, "nvrtcGetPTX");
  SYM(GetCUBINSize, "nvrtcGetCUBINSize");
  SYM(GetCUBIN, "nvrtcGetCUBIN");
  SYM(GetProgramLogSize, "nvrtcGetProgramLogSize");
  SYM(GetProgramLog, "nvrtcGetProgramLog");
#undef SYM
  nv.lib = h;
}

bool cg_nvrtc_load(char *err, size_t errlen) {
  pthread_once(&once, load);
  if (nv.lib) return true;
  if (err && errlen) snprintf(err, errlen, "%s", load_error);
  return false;
}

bool cg_nvrtc_version(char *buf, size_t n, char *err, size_t errlen) {
  if (!cg_nvrtc_load(err, errlen)) return false;
  int major = 0, minor = 0;
  if (nv.Version(&major, &minor) != 0) {
    if (err && errlen) snprintf(err, errlen, "NVRTC: nvrtcVersion failed");
    return false;
  }
  snprintf(buf, n, "nvrtc %d.%d", major, minor);
  return true;
}

/* The identity of an NVRTC file: "path size mtime inode". */
static bool file_id(const char *path, char *buf, size_t n) {
  struct stat st;
  if (stat(path, &st) != 0) return false;
  snprintf(buf, n, "%s %lld %lld %llu", path, (long long)st.st_size, (long long)st.st_mtime,
           (unsigned long long)st.st_ino);
  return true;
}

bool cg_nvrtc_version_cached(const char *cache_dir, char *buf, size_t n, char *err, size_t errlen) {
  const char *env = getenv("GRADC_NVRTC"), *ldp = getenv("LD_LIBRARY_PATH");
  char in[8192];
  snprintf(in, sizeof in, "nvrtc-id 1\n%s\n%s\n", env ? env : "", ldp ? ldp : "");
  uint64_t key = hash_str(in);
  size_t len = 0;
  char *e = cache_dir ? cache_get(cache_dir, "nvrtc-id", key, &len) : NULL;
  if (e) {
    /* "ID\nVERSION" */
    char *nl = memchr(e, '\n', len), id[4200];
    if (nl && (size_t)(nl - e) < 4096) {
      *nl = 0;
      char path[4096];
      const char *sp = strchr(e, ' ');
      snprintf(path, sizeof path, "%.*s", sp ? (int)(sp - e) : 0, e);
      if (sp && file_id(path, id, sizeof id) && strcmp(id, e) == 0 && len - (size_t)(nl + 1 - e) < n) {
        snprintf(buf, n, "%.*s", (int)(len - (size_t)(nl + 1 - e)), nl + 1);
        free(e);
        return true;
      }
    }
    free(e);
  }
  if (!cg_nvrtc_version(buf, n, err, errlen)) return false;
  Dl_info info;
  char id[4200];
  if (cache_dir && dladdr((void *)nv.Version, &info) && info.dli_fname && file_id(info.dli_fname, id, sizeof id)) {
    char entry[4400];
    int m = snprintf(entry, sizeof entry, "%s\n%s", id, buf);
    if (m > 0 && (size_t)m < sizeof entry) cache_put(cache_dir, "nvrtc-id", key, entry, (size_t)m);
  }
  return true;
}

bool cg_nvrtc_supports(const char *arch, char *have, size_t n) {
  if (n) have[0] = 0;
  if (!cg_nvrtc_load(NULL, 0)) return false;
  int cnt = 0;
  if (nv.GetNumSupportedArchs(&cnt) != 0 || cnt <= 0) return false;
  int *a = calloc((size_t)cnt, sizeof(int));
  if (!a) abort();
  bool ok = false;
  int want = strncmp(arch, "sm_", 3) == 0 ? atoi(arch + 3) : -1;
  if (nv.GetSupportedArchs(a) == 0) {
    size_t len = 0;
    for (int i = 0; i < cnt; i++) {
      ok |= a[i] == want;
      if (len < n) len += (size_t)snprintf(have + len, n - len, "%ssm_%d", i ? " " : "", a[i]);
    }
  }
  free(a);
  return ok;
}

int cg_nvrtc_compile_calls(void) { return atomic_load(&compile_calls); }

static char *dup_msg(const char *what, nvrtcResult r) {
  char buf[256];
  snprintf(buf, sizeof buf, "NVRTC: %s: %s", what, nv.GetErrorString ? nv.GetErrorString(r) : "error");
  return strdup(buf);
}

bool cg_nvrtc_compile(const char *src, const char *name, const char *const *opts, int nopts, CuImage *img,
                      char **log) {
  *log = NULL;
  char err[512];
  if (!cg_nvrtc_load(err, sizeof err)) {
    *log = strdup(err);
    return false;
  }
  nvrtcProgram prog = NULL;
  nvrtcResult r = nv.CreateProgram(&prog, src, name, 0, NULL, NULL);
  if (r != 0) {
    *log = dup_msg("nvrtcCreateProgram", r);
    return false;
  }
  atomic_fetch_add(&compile_calls, 1);
  nvrtcResult rc = nv.CompileProgram(prog, nopts, opts);
  size_t n = 0;
  if (nv.GetProgramLogSize(prog, &n) == 0 && n > 0) {
    *log = malloc(n + 1);
    if (!*log) abort();
    if (nv.GetProgramLog(prog, *log) != 0) (*log)[0] = 0;
    (*log)[n] = 0;
  } else {
    *log = strdup("");
  }
  bool ok = rc == 0;
  if (!ok && !**log) {
    free(*log);
    *log = dup_msg("nvrtcCompileProgram", rc);
  }
  size_t nc = 0, np = 0;
  if (ok && ((r = nv.GetCUBINSize(prog, &nc)) != 0 || (r = nv.GetPTXSize(prog, &np)) != 0)) {
    free(*log);
    *log = dup_msg("reading the compiled program", r);
    ok = false;
  }
  if (ok) {
    img->cubin = malloc(nc ? nc : 1);
    img->ptx = malloc(np + 1);
    if (!img->cubin || !img->ptx) abort();
    img->ptx[0] = 0;
    if ((nc && (r = nv.GetCUBIN(prog, img->cubin)) != 0) || (np && (r = nv.GetPTX(prog, img->ptx)) != 0)) {
      free(*log);
      *log = dup_msg("reading the compiled program", r);
      ok = false;
    }
    img->ptx[np] = 0;
    img->cubin_len = nc;
    img->ptx_len = np && img->ptx[np - 1] == 0 ? np - 1 : np; /* NVRTC counts the NUL */
    img->from_cache = false;
  }
  nv.DestroyProgram(&prog);
  return ok;
}
