#!/bin/sh
# run.sh BUILD SOURCE [CMAKE] [CC] [PKG_CONFIG] - install a built gradc into a
# temporary prefix and build examples/embed.c against the installed package
# twice: with pkg-config, and with a small CMake project that uses
# find_package(gradc).  Runs both builds; each must train and exit 0.
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
for f in "$prefix/bin/gradc" "$prefix/include/gradc.h" "$pc" "$config" "$(dirname "$config")/gradcConfigVersion.cmake"; do
  test -f "$f" || { echo "run.sh: the install lacks $f" >&2; exit 1; }
done
test -f "$(dirname "$(dirname "$pc")")/libgradc.a" || { echo "run.sh: no libgradc.a next to pkgconfig/" >&2; exit 1; }
"$prefix/bin/gradc" --version

step "pkg-config: build and run embed"
PKG_CONFIG_PATH=$(dirname "$pc")
export PKG_CONFIG_PATH
"$pkgconfig" --modversion gradc
# shellcheck disable=SC2046
"$cc" -std=c11 -Wall -Wextra -Werror -o "$tmp/embed_pkgconfig" "$src/examples/embed.c" \
  $("$pkgconfig" --cflags gradc) $("$pkgconfig" --static --libs gradc)
"$tmp/embed_pkgconfig"

step "CMake find_package(gradc): build and run embed"
"$cmake" -S "$src/tests/install/consumer" -B "$tmp/consumer" -DCMAKE_C_COMPILER="$cc" \
  -DCMAKE_PREFIX_PATH="$prefix" -DGRADC_EMBED_SOURCE="$src/examples/embed.c" >"$tmp/configure.log" 2>&1 ||
  { cat "$tmp/configure.log"; exit 1; }
"$cmake" --build "$tmp/consumer"
"$tmp/consumer/embed"
step "ok"
