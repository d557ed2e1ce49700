#!/bin/sh
# zoo.sh - the examples of the standard zoo, end to end through the CLI.
# For each model: init params, one window of random inputs, then `run` at
# --gas 1 on cpu and ref with every loss line agreeing to 1e-4 relative; a
# model with no batch-mixing term also at --gas 2, equal to --gas 1 to 1e-5
# (resnet_block's batch_norm and moe's load-balancing loss mix the batch:
# --gas 1 only); and `train --steps 5` exiting 0 with finite losses.  Exits 1 on the first failure.
#
#   tests/zoo.sh GRADC SOURCE_DIR
gradc=$1
src=$2
tmp=$(mktemp -d) || exit 2
trap 'rm -rf "$tmp"' EXIT

fail() { echo "FAIL $*"; exit 1; }

# agree A B TOL: the `loss` lines of files A and B, name for name, within TOL relative
agree() {
  awk -v tol="$3" '
    FNR == NR && $1 == "loss" { a[$2] = $3; n++; next }
    $1 == "loss" { if (!($2 in a)) { print "missing " $2; bad = 1; next }
      d = a[$2] - $3; if (d < 0) d = -d; m = a[$2] < 0 ? -a[$2] : a[$2]
      if (d > tol * (m > 1e-12 ? m : 1e-12)) { print $2 ": " a[$2] " vs " $3; bad = 1 }
      k++ }
    END { if (n == 0 || k != n) { print "loss lines differ in number"; bad = 1 }; exit bad }' "$1" "$2"
}

for spec in lenet:gas2 resnet_block:gas1 llama:gas2 moe:gas1 vae:gas2; do
  m=${spec%%:*}
  f=$src/examples/$m.gdl
  [ -f "$f" ] || fail "$m: no $f"
  d=$tmp/$m
  mkdir -p "$d"
  "$gradc" init "$f" -o "$d/p.st" --seed 1 || fail "$m: init"
  "$gradc" data random "$f" -o "$d/x1.st" --seed 2 || fail "$m: data"
  "$gradc" run "$f" --gas 1 --target cpu --params "$d/p.st" --inputs "$d/x1.st" >"$d/cpu1" || fail "$m: run cpu"
  "$gradc" run "$f" --gas 1 --target ref --params "$d/p.st" --inputs "$d/x1.st" >"$d/ref1" || fail "$m: run ref"
  agree "$d/cpu1" "$d/ref1" 1e-4 || fail "$m: cpu and ref differ"
  if [ "${spec#*:}" = gas2 ]; then
    "$gradc" run "$f" --gas 2 --target cpu --params "$d/p.st" --inputs "$d/x1.st" >"$d/cpu2" || fail "$m: run --gas 2"
    agree "$d/cpu1" "$d/cpu2" 1e-5 || fail "$m: --gas 2 differs from --gas 1"
  fi
  "$gradc" data random "$f" -o "$d/data.st" --seed 3 || fail "$m: data for train"
  "$gradc" train "$f" --data "$d/data.st" --steps 5 --seed 1 --print-every 1 >"$d/train" 2>&1 ||
    { cat "$d/train"; fail "$m: train"; }
  # five `step N/5 loss X` lines, each X finite
  awk '$1 == "step" && $3 == "loss" { if ($4 + 0 != $4 || $4 ~ /[nN][aA][nN]|[iI][nN][fF]/) bad = 1; n++ }
       END { exit !(n == 5 && !bad) }' "$d/train" || { cat "$d/train"; fail "$m: train losses not finite"; }
  echo "ok $m: $(grep '^loss total' "$d/cpu1")"
done
