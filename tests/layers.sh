#!/bin/sh
# layers.sh - the layer order of DESIGN.md §7, checked on the includes:
#
#   support <- ir <- {frontend, passes} <- codegen <- runtime <- api <- tools
#
# A source file may include a project header from its own layer or from a
# layer below it, never from above; frontend and passes do not include each
# other; the public header include/gradc.h belongs to the api layer; tools/
# sees only gradc.h, api/cli.h (what the API exports for the command line)
# and its own headers.  Prints every include against the order and exits 1
# if there is one.
#
#   tests/layers.sh [SOURCE_DIR]
root=${1:-$(dirname "$0")/..}
cd "$root" || exit 2

# The rank of a path's layer; frontend and passes share rank 2.
rank() {
  case $1 in
  support/*) echo 0 ;;
  ir/*) echo 1 ;;
  frontend/* | passes/*) echo 2 ;;
  codegen/*) echo 3 ;;
  runtime/*) echo 4 ;;
  api/* | include/* | gradc.h) echo 5 ;;
  tools/*) echo 6 ;;
  *) echo "" ;;
  esac
}

bad=0
for f in $(find support ir frontend passes codegen runtime api tools -name '*.[ch]' | sort); do
  from=$(rank "$f")
  dir=$(dirname "$f")
  grep -n '^[[:space:]]*#[[:space:]]*include[[:space:]]*"' "$f" | while IFS= read -r line; do
    inc=$(printf '%s\n' "$line" | sed 's/.*include[[:space:]]*"\([^"]*\)".*/\1/')
    n=${line%%:*}
    # Resolve the include as the compiler does: beside the file, then from the
    # root, then include/.  Generated headers (the build folder) and anything
    # else outside the tree are not layered.
    if [ -f "$dir/$inc" ]; then
      path=$(realpath --relative-to=. "$dir/$inc")
    elif [ -f "$inc" ]; then
      path=$inc
    elif [ -f "include/$inc" ]; then
      path=include/$inc
    else
      continue
    fi
    to=$(rank "$path")
    [ -n "$to" ] || continue
    why=""
    if [ "$to" -gt "$from" ]; then
      why="includes a layer above its own"
    elif [ "${f%%/*}" = frontend ] && [ "${path%%/*}" = passes ] ||
      [ "${f%%/*}" = passes ] && [ "${path%%/*}" = frontend ]; then
      why="frontend and passes do not include each other"
    elif [ "${f%%/*}" = tools ] && [ "${path%%/*}" != tools ] &&
      [ "$path" != include/gradc.h ] && [ "$path" != api/cli.h ]; then
      why="tools/ sees only gradc.h and api/cli.h"
    fi
    if [ -n "$why" ]; then
      echo "$f:$n: #include \"$inc\": $why"
      echo x >>"${TMPDIR:-/tmp}/layers.$$"
    fi
  done
done
if [ -s "${TMPDIR:-/tmp}/layers.$$" ]; then
  rm -f "${TMPDIR:-/tmp}/layers.$$"
  echo "layers: includes against DESIGN.md §7 above" >&2
  exit 1
fi
rm -f "${TMPDIR:-/tmp}/layers.$$"
echo "layers: every include follows support <- ir <- {frontend, passes} <- codegen <- runtime <- api <- tools"
