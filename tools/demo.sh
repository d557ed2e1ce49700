#!/bin/sh
# demo.sh BUILD - the main job: compile examples/mlp.gdl, show its IR after
# gas-fold and the whole optimised step, then run one window of
# examples/multitask.gdl on random params and inputs.
set -e
build=${1:-build}
gradc="$build/gradc"
out=demo
mkdir -p "$out"
echo "== gradc compile examples/mlp.gdl --gas 4 (IR after gas-fold, then the final step IR)"
"$gradc" compile examples/mlp.gdl --gas 4 --print-ir-after=gas-fold > "$out/mlp.step.gir" 2> "$out/mlp.gas-fold.gir"
cat "$out/mlp.gas-fold.gir"
echo
echo "== the optimised forward+backward step ($(grep -c ' = ' "$out/mlp.step.gir") ops) is in $out/mlp.step.gir"
echo
echo "== gradc init + run examples/mlp.gdl --gas 4"
"$gradc" init examples/mlp.gdl -o "$out/mlp.params.safetensors" --seed 1
"$gradc" data random examples/mlp.gdl --gas 4 -o "$out/mlp.inputs.safetensors" --seed 2
if [ -f "$out/mlp.inputs.safetensors" ]; then
  "$gradc" run examples/mlp.gdl --gas 4 --params "$out/mlp.params.safetensors" \
    --inputs "$out/mlp.inputs.safetensors" --grads-out "$out/mlp.grads.safetensors"
  echo "gradients written to $out/mlp.grads.safetensors"
fi
