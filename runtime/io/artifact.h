/* artifact.h - the artifact container (DESIGN.md §6 "Artifacts"), the
 * host description artifacts are checked against, and the hook through
 * which a back end stores its compiled kernels in an artifact.
 *
 * File layout (all integers little-endian):
 *
 *   "GRADCART"                          8 bytes, the magic
 *   u32 format version                  ART_FORMAT_VERSION
 *   u32 number of sections
 *   per section:
 *     char tag[4]                       "META", "SRC ", "IR  ", "SIG ", "KOBJ", "GEMM" (space-padded)
 *     u32 name length, u64 data length
 *     name bytes, data bytes            (the name is "" except for KOBJ: the kernel's; GEMM: the provider's)
 *   u64 checksum                        FNV-1a 64 of every byte before it
 *
 * What the sections of a program hold is gradc_program_save's business
 * (runtime/api.c); this file only reads and writes the container. */
#ifndef GRADC_ARTIFACT_H
#define GRADC_ARTIFACT_H

#include "runtime/runtime.h"

#define ART_MAGIC "GRADCART"
#define ART_FORMAT_VERSION 1u

typedef struct ArtSection {
  char tag[5];         /* up to 4 characters, NUL-terminated, without the padding */
  char *name;          /* malloc'd, "" when unnamed */
  unsigned char *data; /* malloc'd, len bytes (+1 NUL so text sections read as strings) */
  size_t len;
} ArtSection;

typedef struct ArtFile {
  uint32_t format; /* art_init sets ART_FORMAT_VERSION; art_read the file's */
  ArtSection *s;
  int n, cap;
} ArtFile;

void art_init(ArtFile *a);
void art_free(ArtFile *a);
/* Append a section (name and data copied; name may be NULL for ""). */
ArtSection *art_add(ArtFile *a, const char *tag, const char *name, const void *data, size_t len);
/* The first section with tag (and name, unless NULL), or NULL. */
const ArtSection *art_find(const ArtFile *a, const char *tag, const char *name);
/* Write atomically (a temporary file next to path, fsync, rename).  On
 * failure "PATH: reason" goes to err. */
bool art_write(const char *path, const ArtFile *a, char *err, size_t errlen);
/* Read and check the magic, the format version and the checksum
 * ("PATH: artifact is corrupt (checksum mismatch)"). */
bool art_read(const char *path, ArtFile *out, char *err, size_t errlen);

/* What compiled code depends on: cg_llvm_host_id ("TRIPLE;CPU;FEATURES;
 * llvmN") in a build with LLVM, else "MACHINE;generic" (uname). */
void art_host_id(char *buf, size_t n);

/* ------------------------------------------------------------------ */
/* The back-end hook: kernel object code in artifacts                   */
/* ------------------------------------------------------------------ */
/* A back end that can serialise its compiled kernels defines these two
 * functions (the CPU executor, runtime/exec.c); until it does they are
 * weak references that resolve to NULL and artifacts carry no KOBJ
 * section (loading then compiles the kernels from the planned IR).
 *
 * cpu_program_save_objects appends the program's object code to a, one
 * art_add(a, "KOBJ", kernel name, bytes, len) per kernel (or one for the
 * whole module).  cpu_program_load_objects builds a program for the
 * planned function f from those sections without running code generation;
 * NULL with a message in err if they do not fit f. */
struct CpuProgram;
struct CpuOptions;
bool cpu_program_save_objects(const struct CpuProgram *p, ArtFile *a, char *err, size_t errlen);
struct CpuProgram *cpu_program_load_objects(IrFunc *f, const ArtFile *a, const struct CpuOptions *o, char *err,
                                            size_t errlen);

#endif
