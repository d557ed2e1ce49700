#!/bin/sh
# make_recover.sh SOURCE [MAKE] - a configure that fails leaves nothing that
# breaks the next `make`: configure a throwaway BUILD dir with a C compiler
# that does not exist (CMake caches it, as it caches a missing package's
# result), check the Makefile left no cache and no stamp, then configure
# the same dir again without the bad flag and check the tree builds.
set -eu
src=$1
make=${2:-make}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/gradc-make.XXXXXX")
trap 'rm -rf "$tmp"' EXIT INT TERM
b=$tmp/build
unset MAKEFLAGS MFLAGS || true

echo "== a configure that fails"
if "$make" -C "$src" BUILD="$b" CMAKE_FLAGS="-DCMAKE_C_COMPILER=$tmp/no-such-cc -DGRADC_TESTS=OFF" configure \
  >"$tmp/fail.log" 2>&1; then
  cat "$tmp/fail.log"; echo "make_recover.sh: configure with a missing compiler succeeded" >&2; exit 1
fi
grep -q "configure failed; the next make configures again" "$tmp/fail.log" ||
  { cat "$tmp/fail.log"; echo "make_recover.sh: no message after the failure" >&2; exit 1; }
test ! -e "$b/.configured" || { echo "make_recover.sh: the stamp survived a failed configure" >&2; exit 1; }
test ! -e "$b/CMakeCache.txt" || { echo "make_recover.sh: the failed configure left its cache" >&2; exit 1; }

echo "== the next make configures again and builds"
"$make" -C "$src" BUILD="$b" CMAKE_FLAGS="-DGRADC_TESTS=OFF -DGRADC_LLVM=OFF -DGRADC_BLAS=OFF -DGRADC_MPI=OFF" configure \
  >"$tmp/ok.log" 2>&1 || { cat "$tmp/ok.log"; echo "make_recover.sh: the second configure failed" >&2; exit 1; }
test -f "$b/.configured" && test -f "$b/Makefile" || { echo "make_recover.sh: no stamp or Makefile" >&2; exit 1; }
# The generated build system answers (the failure this guards against was
# "gmake[1]: Makefile: No such file or directory").
cmake --build "$b" --target help >"$tmp/build.log" 2>&1 && grep -q gradc_core "$tmp/build.log" ||
  { tail -30 "$tmp/build.log"; echo "make_recover.sh: the reconfigured tree does not build" >&2; exit 1; }
echo "== ok"
