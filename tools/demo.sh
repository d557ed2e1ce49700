#!/bin/sh
# demo.sh BUILD - the main job: train examples/tinygpt.gdl, a small GPT, on
# the project's own documentation (README.md and docs/*.md, byte-level
# tokens) on the CPU, with the progress bar and the loss falling; then
# leave in demo/ the loss curve (loss.svg), the per-step log (train.csv),
# the IR of the compiled training step (step.gir), a checkpoint and the
# trained params.  python/README.md, which the corpus leaves out, is held
# out as validation text (train --val-data: its loss every 500 steps).  The
# demo ends with a short sample of text from the trained model (gradc
# generate).
#
# The model is tinygpt widened a little (-D below: 3 layers of width 96,
# context 64; 366k params).  The CPU back end runs 2500 steps (one to two
# minutes on two cores); a build without it (the reference interpreter,
# ~25x slower) runs 300, so either finishes in a few minutes.  A 3-step
# calibration run decides; DEMO_STEPS=N overrides.  One thread: for
# kernels this small a second one costs more in hand-offs than it saves.
set -e
build=${1:-build}
gradc="$build/gradc"
out=demo
model=examples/tinygpt.gdl
# Byte-level tokens need a 256-entry vocabulary; K=2 micro-batches of 4 per window of 8.
dims="-D V=256 -D T=64 -D C=96 -D L=3"
flags="$dims --gas 2"
mkdir -p "$out"

echo "== corpus: README.md docs/*.md -> $out/corpus.txt"
cat README.md docs/*.md > "$out/corpus.txt"
"$gradc" data text "$out/corpus.txt" -T 64 --stride 16 -o "$out/corpus.safetensors"
"$gradc" data text python/README.md -T 64 -o "$out/val.safetensors"

echo
echo "== the training step of $model, compiled: $out/step.gir"
"$gradc" compile $model $flags > "$out/step.gir"
echo "   $(grep -c ' = ' "$out/step.gir") ops, forward and backward (gradc compile $model $flags)"

steps=${DEMO_STEPS:-}
if [ -z "$steps" ]; then
  "$gradc" train $model $flags --threads 1 --data "$out/corpus.safetensors" --steps 3 \
    --log "$out/calibrate.csv" 2> /dev/null
  ms=$(awk -F, 'END { printf "%d", $NF * 1000 / 3 }' "$out/calibrate.csv")
  rm -f "$out/calibrate.csv"
  if [ "$ms" -lt 200 ]; then steps=2500; else steps=300; fi
  echo "   (a step takes ${ms} ms here: training $steps steps)"
fi

echo
echo "== gradc train $model: AdamW, warm-up and cosine decay, gradient clipping"
rm -f "$out/train.csv"
"$gradc" train $model $flags --threads 1 --data "$out/corpus.safetensors" --steps "$steps" \
  --lr 3e-3 --warmup 100 --cosine --min-lr 3e-4 --clip 1 --seed 1 \
  --val-data "$out/val.safetensors" --val-every 500 \
  --log "$out/train.csv" --plot "$out/loss.svg" \
  --checkpoint "$out/tinygpt.ckpt.safetensors" --params-out "$out/tinygpt.params.safetensors"

echo
awk -F, 'NR == 2 { first = $4 } END { printf "== loss %.4f at step 1, %.4f at step %d\n", first, $4, $1 }' "$out/train.csv"
echo "   loss curve           $out/loss.svg"
echo "   per-step log         $out/train.csv   (step,lr,ce,total,grad_norm,elapsed_s,val_ce,val_total)"
echo "   training-step IR     $out/step.gir"
echo "   checkpoint           $out/tinygpt.ckpt.safetensors   (continue: gradc train ... --resume it)"
echo "   trained params       $out/tinygpt.params.safetensors"

echo
echo "== gradc generate: the trained model continues a prompt (temperature 0.8, top-k 20, seed 1)"
"$gradc" generate $model $dims --threads 1 --params "$out/tinygpt.params.safetensors" \
  --prompt "gradc compiles " --max-tokens 160 --temperature 0.8 --top-k 20 --seed 1
