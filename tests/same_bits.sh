#!/bin/bash
# same_bits.sh - is a change behaviour-neutral?  Runs `gradc run` on every
# example, bench model, CUDA test model and public conformance case, at
# K = 1 and 4, 1 and 2 threads, on the cpu and ref targets, and records the
# loss lines (stdout), the exit status and the SHA-256 of the gradient file,
# and the SHA-256 of the planned IR (`compile`) and of the generated CUDA C
# (`compile --target cuda:sm_80 --kernels-dir`).
# Params and inputs are made once, by the binary that records the baseline,
# and reused for the comparison, so two builds see the same bytes.
#
#   tests/same_bits.sh record  GRADC DIR   # DIR/params/..., DIR/results.txt
#   tests/same_bits.sh compare GRADC DIR   # runs again, diffs against DIR/results.txt
#
# Exit status: 0 when every line is identical, 1 otherwise (the diff is printed).
set -u
mode=${1:?usage: same_bits.sh record|compare GRADC DIR}
gradc=$(realpath "${2:?gradc binary}")
dir=${3:?output directory}
dir=$(mkdir -p "$dir" && cd "$dir" && pwd)
# Models are named relative to the source root: their paths are part of the
# IR (loc(...)) and of the CUDA C comments, so two checkouts compare alike.
cd "$(dirname "$0")/.." || exit 2
conf=../shared/conformance/cases

# name | model | -D flags
models=(
  "mlp|examples/mlp.gdl|"
  "multitask|examples/multitask.gdl|"
  "tinygpt|examples/tinygpt.gdl|"
  "tinygpt_large|examples/tinygpt.gdl|-D B=16 -D T=128 -D C=256 -D L=4 -D NH=4 -D V=96"
  "mlp2|bench/models/mlp2.gdl|"
  "lowp|tests/cuda/lowp.gdl|"
  "cuda_ln|tests/cuda/layernorm.gdl|"
  "cuda_ce|tests/cuda/cross_entropy.gdl|"
  "cuda_ew|tests/cuda/elementwise.gdl|"
  "cuda_tr|tests/cuda/transpose.gdl|"
  "dp_lm|tests/models/dp_lm.gdl|"
)
for c in pub_mlp pub_lm pub_refuse; do
  [ -f "$conf/$c.gdl" ] && models+=("$c|$conf/$c.gdl|conf")
done

# Each call runs in a fresh scratch folder with its own kernel cache, so that
# several comparisons may run at once and no build reads another's objects.
mkdir -p "$dir/params"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
out=$dir/results.txt
[ "$mode" = compare ] && out=$work/results.new.txt
: >"$out"
for m in "${models[@]}"; do
  IFS='|' read -r name model defs <<<"$m"
  p=$dir/params/$name.params.safetensors
  if [ "$defs" = conf ]; then
    defs=""
    p=${model%.gdl}.params.safetensors
  fi
  for k in 1 4; do
    in=$dir/params/$name.k$k.inputs.safetensors
    if [ "$mode" = record ]; then
      [ -f "${model%.gdl}.inputs.safetensors" ] && [[ $model == "$conf"* ]] &&
        cp "${model%.gdl}.inputs.safetensors" "$in"
      [ -f "$p" ] || "$gradc" init "$model" $defs -o "$p" --seed 1 2>/dev/null
      [ -f "$in" ] || "$gradc" data random "$model" $defs -o "$in" --seed 2 2>/dev/null
    fi
    # The planned IR (cpu target) and the generated CUDA C (sm_80).
    ir=$("$gradc" compile "$model" $defs --gas $k --no-cache 2>/dev/null | sha256sum | cut -c1-16)
    rm -rf "$work/cu" && mkdir -p "$work/cu"
    "$gradc" compile "$model" $defs --gas $k --target cuda:sm_80 --kernels-dir "$work/cu" \
      -o "$work/cu/a.gca" >/dev/null 2>&1
    cu=$(cat "$work"/cu/*.cu 2>/dev/null | sha256sum | cut -c1-16)
    echo "$name k=$k ir=$ir cuda=$cu kernels=$(ls "$work"/cu/*.cu 2>/dev/null | wc -l)" >>"$out"
    for target in cpu ref; do
      for t in 1 2; do
        [ $target = ref ] && [ $t = 2 ] && continue
        g=$work/g.safetensors
        rm -f "$g"
        losses=$(GRADC_CACHE_DIR=$work/cache "$gradc" run "$model" $defs --gas $k --target $target \
          --threads $t --params "$p" --inputs "$in" --grads-out "$g" 2>"$work/err" | tr '\n' ';')
        rc=$?
        sum=none
        [ -f "$g" ] && sum=$(sha256sum "$g" | cut -c1-16)
        echo "$name k=$k $target t=$t rc=$rc grads=$sum $losses" >>"$out"
      done
    done
  done
done
if [ "$mode" = compare ]; then
  if diff "$dir/results.txt" "$out"; then
    echo "same bits: $(wc -l <"$out") runs identical"
  else
    echo "same bits: differences above" >&2
    exit 1
  fi
else
  echo "recorded $(wc -l <"$out") runs in $out"
fi
