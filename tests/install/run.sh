#!/bin/sh
# run.sh BUILD SOURCE [CMAKE] [CC] [PKG_CONFIG] - install a built gradc into a
# temporary prefix, check libgradc.so (its SONAME, its exports), and build
# examples/embed.c against the installed package four times: with
# pkg-config against the shared and the static library, and with a small
# CMake project that uses find_package(gradc), both ways.  Runs every
# build; each must train and exit 0.
set -eu
build=$1
src=$2
cmake=${3:-cmake}
cc=${4:-cc}
pkgconfig=${5:-pkg-config}

tmp=$(mktemp -d "${TMPDIR:-/tmp}/gradc-install.XXXXXX")
trap 'rm -rf "$tmp"' EXIT INT TERM
prefix=$tmp/prefix

step() { printf '== %s\n' "$*"; }

step "install into $prefix"
"$cmake" --install "$build" --prefix "$prefix"

# What the package holds.
pc=$(find "$prefix" -name gradc.pc)
config=$(find "$prefix" -name gradcConfig.cmake)
libdir=$(dirname "$(dirname "$pc")")
for f in "$prefix/bin/gradc" "$prefix/include/gradc.h" "$pc" "$(dirname "$pc")/gradc-static.pc" "$config" \
  "$(dirname "$config")/gradcConfigVersion.cmake" "$libdir/libgradc.a" "$libdir/libgradc.so"; do
  test -f "$f" || { echo "run.sh: the install lacks $f" >&2; exit 1; }
done
"$prefix/bin/gradc" --version

step "libgradc.so: a SONAME with the version, only gradc_ symbols exported"
soname=$(readelf -d "$libdir/libgradc.so" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
version=$("$prefix/bin/gradc" --version | awk '{print $NF}')
echo "SONAME $soname, version $version"
case $soname in libgradc.so.[0-9]*) ;; *) echo "run.sh: SONAME '$soname' carries no version" >&2; exit 1 ;; esac
case $version in "${soname#libgradc.so.}"*) ;; *) echo "run.sh: SONAME $soname is not version $version's" >&2; exit 1 ;; esac
test -e "$libdir/$soname" || { echo "run.sh: no $soname beside libgradc.so" >&2; exit 1; }
nm -D --defined-only "$libdir/libgradc.so" | awk '{print $NF}' > "$tmp/exports"
test -s "$tmp/exports" || { echo "run.sh: libgradc.so exports nothing" >&2; exit 1; }
if grep -v '^gradc_' "$tmp/exports"; then echo "run.sh: libgradc.so exports the symbols above" >&2; exit 1; fi
for f in gradc_program_compile_source gradc_session_run gradc_last_error; do
  grep -qx "$f" "$tmp/exports" || { echo "run.sh: libgradc.so does not export $f" >&2; exit 1; }
done
echo "$(wc -l < "$tmp/exports") symbols, all gradc_*"

# needs BINARY LIB: BINARY's dynamic section names LIB (or, for "", no libgradc).
needs() {
  if [ -n "$2" ]; then
    readelf -d "$1" | grep -q "NEEDED.*\[$2\]" || { echo "run.sh: $1 does not link $2" >&2; exit 1; }
  elif readelf -d "$1" | grep -q 'NEEDED.*libgradc'; then
    echo "run.sh: $1 links libgradc.so, not libgradc.a" >&2; exit 1
  fi
}

PKG_CONFIG_PATH=$(dirname "$pc")
export PKG_CONFIG_PATH
"$pkgconfig" --modversion gradc

step "pkg-config --libs gradc: build and run embed on libgradc.so"
# shellcheck disable=SC2046
"$cc" -std=c11 -Wall -Wextra -Werror -o "$tmp/embed_shared" "$src/examples/embed.c" \
  $("$pkgconfig" --cflags gradc) $("$pkgconfig" --libs gradc) -lm # embed.c calls libm itself
needs "$tmp/embed_shared" "$soname"
LD_LIBRARY_PATH=$libdir "$tmp/embed_shared"

step "pkg-config --static --libs gradc-static: build and run embed on libgradc.a"
# shellcheck disable=SC2046
"$cc" -std=c11 -Wall -Wextra -Werror -o "$tmp/embed_static" "$src/examples/embed.c" \
  $("$pkgconfig" --cflags gradc-static) $("$pkgconfig" --static --libs gradc-static)
needs "$tmp/embed_static" ""
"$tmp/embed_static"

for kind in shared static; do
  step "CMake find_package(gradc), gradc::gradc $kind: build and run embed"
  use_static=OFF
  [ $kind = shared ] || use_static=ON
  "$cmake" -S "$src/tests/install/consumer" -B "$tmp/consumer-$kind" -DCMAKE_C_COMPILER="$cc" \
    -DCMAKE_PREFIX_PATH="$prefix" -Dgradc_USE_STATIC=$use_static -DGRADC_EMBED_SOURCE="$src/examples/embed.c" \
    >"$tmp/configure.log" 2>&1 || { cat "$tmp/configure.log"; exit 1; }
  "$cmake" --build "$tmp/consumer-$kind"
  if [ $kind = shared ]; then needs "$tmp/consumer-$kind/embed" "$soname"; else needs "$tmp/consumer-$kind/embed" ""; fi
  "$tmp/consumer-$kind/embed" # CMake's build rpath finds libgradc.so
done
step "ok"
