#!/bin/sh
# lit.sh GRADC FILECHECK TEST - a tiny lit: run every `RUN:` line of TEST
# (comment marker `//` or `#`) with %gradc, %FileCheck and %s substituted.
# The test passes when every RUN line exits 0.
gradc=$1 filecheck=$2 test=$3
n=0
grep -E '^(//|#) *RUN:' "$test" | sed -E 's/^(\/\/|#) *RUN: *//' > "${TMPDIR:-/tmp}/lit.$$"
while IFS= read -r line; do
  n=$((n + 1))
  cmd=$(printf '%s' "$line" | sed -e "s|%gradc|$gradc|g" -e "s|%FileCheck|$filecheck|g" -e "s|%s|$test|g")
  if ! sh -c "set -e; $cmd"; then
    echo "FAILED: RUN line $n: $cmd" >&2
    rm -f "${TMPDIR:-/tmp}/lit.$$"
    exit 1
  fi
done < "${TMPDIR:-/tmp}/lit.$$"
rm -f "${TMPDIR:-/tmp}/lit.$$"
if [ "$n" -eq 0 ]; then
  echo "no RUN lines in $test" >&2
  exit 1
fi
