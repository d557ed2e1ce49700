#!/bin/bash
# run.sh - the CUDA back end on a GPU machine, which has the CUDA toolkit,
# CMake, gcc and PyTorch but no LLVM, BLAS, MPI or cmocka:
#
#   1. build gradc without them (RelWithDebInfo, -DGRADC_CUDA=ON) and the
#      judge (tests/gpu/compare.c); libcjson comes from tests/gpu/debs/ when
#      the machine lacks it;
#   2. every torch-reference case (tests/torchref/cases, PyTorch float64
#      references) at each --gas of its manifest: gradc run --target cuda;
#   3. the examples and tests/cuda models against the reference interpreter
#      (gradc run --target ref) at --gas 1 and 2; then tinygpt as a CUDA
#      artifact, without CUDA graphs, with TF32, a short training run
#      next to the interpreter's, and the forward-only commands (infer,
#      eval, generate) next to the interpreter's;
#   4. benchmarks: gradc bench --target cuda (mlp, tinygpt small and large,
#      a GPT-2 124M configuration) with the device-only window time
#      (GRADC_CUDA_TIMING=1), and PyTorch's step time at the same sizes
#      (tests/gpu/torch_gpt.py) when torch sees the GPU.
#
# Usage: tests/gpu/run.sh [--dry-run] [--fake-gpu] [--no-bench] [--quick] [BUILD_DIR]
#   --dry-run   print what would run (no GPU, no build needed)
#   --fake-gpu  run everything, with --target ref in place of cuda: checks
#               this script (and the judge) on a machine without a GPU
#   --no-bench  stop after the correctness checks
#   --quick     --gas 1 only, and the small benchmarks
# BUILD_DIR defaults to build-gpu in the source tree.  Logs and a summary
# go to $OUT when set (the device runner's folder), else BUILD_DIR/gpu-results.
# Exit status: 0 when every check passed, 1 otherwise.
set -u

dry=0
fake=0
bench=1
quick=0
build=""
for a in "$@"; do
  case $a in
  --dry-run) dry=1 ;;
  --fake-gpu) fake=1 ;;
  --no-bench) bench=0 ;;
  --quick) quick=1 ;;
  -h | --help)
    sed -n '2,/^set -u/p' "$0" | sed '$d'
    exit 0
    ;;
  -*)
    echo "run.sh: unknown option $a" >&2
    exit 2
    ;;
  *) build=$a ;;
  esac
done

src=$(cd "$(dirname "$0")/../.." && pwd)
build=${build:-$src/build-gpu}
out=${OUT:-$build/gpu-results}
jobs=$(nproc 2>/dev/null || echo 4)
gradc=$build/gradc
judge=$build/gpu_compare
cases=$src/tests/torchref/cases
passed=0
failed=0
failures=""

mkdir -p "$out"
summary=$out/summary.txt
: >"$summary"

say() { printf '%s\n' "$*" | tee -a "$summary"; }

# Print a command; run it unless --dry-run.
run() {
  printf '+ %s\n' "$*"
  [ $dry = 1 ] || "$@"
}

# The same for a shell command line (redirections).
run_sh() {
  printf '+ %s\n' "$1"
  [ $dry = 1 ] || bash -c "$1"
}

record() { # NAME STATUS(0 = pass) [DETAIL]
  if [ "$2" = 0 ]; then
    passed=$((passed + 1))
    say "PASS $1${3:+  $3}"
  else
    failed=$((failed + 1))
    failures="$failures $1"
    say "FAIL $1${3:+  $3}"
  fi
}

# judge NAME DIR REF_LOSSES REF_GRADS [TOL]: DIR holds losses.txt and grads.safetensors.
judge() {
  local name=$1 dir=$2 tol=${5:-1e-4}
  printf '+ %s\n' "$judge $dir/losses.txt $dir/grads.safetensors $3 $4 $tol"
  [ $dry = 1 ] && return 0
  "$judge" "$dir/losses.txt" "$dir/grads.safetensors" "$3" "$4" "$tol" >"$dir/compare.txt" 2>&1
  local rc=$?
  record "$name" $rc "$(tail -1 "$dir/compare.txt")"
}

# gradc_run DIR ARGS...: gradc run ARGS --grads-out DIR/grads.safetensors, loss lines to DIR/losses.txt.
gradc_run() {
  local dir=$1
  shift
  mkdir -p "$dir"
  run_sh "$(printf '%q ' "$gradc" run "$@" --grads-out "$dir/grads.safetensors") >$dir/losses.txt 2>$dir/stderr.txt"
}

# ---------------------------------------------------------------------
say "== build (no LLVM, BLAS, MPI, cmocka) in $build"
if [ $dry = 0 ] && ! pkg-config --exists libcjson 2>/dev/null; then
  deps=$build/deps
  say "libcjson is not installed: unpacking tests/gpu/debs/*.deb into $deps"
  mkdir -p "$deps"
  for d in "$src"/tests/gpu/debs/*.deb; do dpkg-deb -x "$d" "$deps"; done
  for pc in "$deps"/usr/lib/*/pkgconfig/*.pc; do sed -i "s|=/usr|=$deps/usr|" "$pc"; done
  PKG_CONFIG_PATH=$(dirname "$(ls "$deps"/usr/lib/*/pkgconfig/libcjson.pc)")${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}
  export PKG_CONFIG_PATH
  LD_LIBRARY_PATH=$(dirname "$(ls "$deps"/usr/lib/*/libcjson.so)")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  export LD_LIBRARY_PATH
fi
run_sh "cmake -S $src -B $build -DCMAKE_BUILD_TYPE=RelWithDebInfo -DGRADC_LLVM=OFF -DGRADC_BLAS=OFF \
-DGRADC_TESTS=OFF -DGRADC_MPI=OFF -DGRADC_CUDA=ON > $out/build.log 2>&1" || { tail -30 "$out/build.log"; exit 1; }
run_sh "cmake --build $build -j $jobs --target gradc >> $out/build.log 2>&1" || { tail -30 "$out/build.log"; exit 1; }
cjson_flags=$(pkg-config --cflags --libs libcjson 2>/dev/null || echo "-lcjson")
run_sh "cc -O2 -I$src -I$src/include $src/tests/gpu/compare.c $build/libgradc_core.a $cjson_flags -lm -ldl -lpthread -o $judge" || exit 1
if [ $fake = 1 ]; then
  # gradc with the interpreter in place of the GPU
  cat >"$build/gradc-fake" <<EOF
#!/bin/bash
args=()
for a in "\$@"; do
  case \$a in
  cuda | cuda:*) args+=(ref) ;;
  --target=cuda*) args+=(--target=ref) ;;
  --allow-tf32) ;;
  *) args+=("\$a") ;;
  esac
done
exec "$build/gradc" "\${args[@]}"
EOF
  chmod +x "$build/gradc-fake"
  gradc=$build/gradc-fake
  say "--fake-gpu: $gradc runs --target ref in place of cuda"
fi
run_sh "nvidia-smi -L; $gradc --version" | tee -a "$summary"

# ---------------------------------------------------------------------
say "== torch-reference cases on the GPU (losses and gradients against PyTorch float64)"
# name and --gas values of every case that runs (refused ones: --gas 1 only)
case_list=$(python3 - "$cases/manifest.json" "$quick" <<'EOF'
import json, sys
m = json.load(open(sys.argv[1]))
for c in m["cases"]:
    if c["kind"] != "run":
        continue
    gas = [1] if c.get("refuse_gas_gt1") or sys.argv[2] == "1" else c["gas"]
    print(c["name"], " ".join(str(k) for k in gas))
EOF
)
if [ -z "$case_list" ]; then # no python3: every case with a reference, --gas 1
  for j in "$cases"/*.ref.json; do case_list="$case_list$(basename "$j" .ref.json) 1"$'\n'; done
fi
while read -r name gases; do
  [ -n "$name" ] || continue
  tol=1e-4
  [ "$name" = f64_model ] && tol=1e-8 # losses print with 9 digits
  for k in $gases; do
    dir=$out/torchref/$name.gas$k
    gradc_run "$dir" "$cases/$name.gdl" --target cuda --gas "$k" --params "$cases/$name.params.safetensors" \
      --inputs "$cases/$name.inputs.safetensors"
    if [ $dry = 0 ] && [ ! -s "$dir/losses.txt" ]; then
      record "torchref/$name --gas $k" 1 "$(head -3 "$dir/stderr.txt")"
      continue
    fi
    judge "torchref/$name --gas $k" "$dir" "$cases/$name.ref.json" "$cases/$name.ref.safetensors" "$tol"
  done
done <<<"$case_list"

# ---------------------------------------------------------------------
say "== models against the reference interpreter"
# model tolerance
models="examples/mlp.gdl 1e-4
examples/tinygpt.gdl 1e-4
examples/multitask.gdl 1e-4
tests/cuda/layernorm.gdl 1e-4
tests/cuda/cross_entropy.gdl 1e-4
tests/cuda/elementwise.gdl 1e-4
tests/cuda/transpose.gdl 1e-4
tests/cuda/lowp.gdl 3e-2"
gas_list="1 2"
[ $quick = 1 ] && gas_list=1
while read -r m tol; do
  base=$(basename "$m" .gdl)
  for k in $gas_list; do
    dir=$out/models/$base.gas$k
    mkdir -p "$dir"
    run "$gradc" init "$src/$m" -o "$dir/params.safetensors" --seed 1 || continue
    run "$gradc" data random "$src/$m" --gas "$k" -o "$dir/inputs.safetensors" --seed 2 || continue
    gradc_run "$dir/ref" "$src/$m" --target ref --gas "$k" --params "$dir/params.safetensors" \
      --inputs "$dir/inputs.safetensors"
    gradc_run "$dir/cuda" "$src/$m" --target cuda --gas "$k" --params "$dir/params.safetensors" \
      --inputs "$dir/inputs.safetensors"
    judge "$base --gas $k" "$dir/cuda" "$dir/ref/losses.txt" "$dir/ref/grads.safetensors" "$tol"
  done
done <<<"$models"

# tinygpt at --gas 4 (the step's CUDA graph replays micro-batches 2..4), without
# graphs, as an artifact, and with TF32
tg=$src/examples/tinygpt.gdl
dir=$out/tinygpt
mkdir -p "$dir"
run "$gradc" init "$tg" -o "$dir/params.safetensors" --seed 3
run "$gradc" data random "$tg" --gas 4 -o "$dir/inputs.safetensors" --seed 4
common=(--gas 4 --params "$dir/params.safetensors" --inputs "$dir/inputs.safetensors")
gradc_run "$dir/ref" "$tg" --target ref "${common[@]}"
gradc_run "$dir/graph" "$tg" --target cuda "${common[@]}"
judge "tinygpt --gas 4 (CUDA graph)" "$dir/graph" "$dir/ref/losses.txt" "$dir/ref/grads.safetensors"
export GRADC_CUDA_GRAPHS=0
gradc_run "$dir/nograph" "$tg" --target cuda "${common[@]}"
unset GRADC_CUDA_GRAPHS
judge "tinygpt --gas 4 (no graph)" "$dir/nograph" "$dir/ref/losses.txt" "$dir/ref/grads.safetensors"
run "$gradc" compile "$tg" --target cuda --gas 4 -o "$dir/tinygpt.gca"
gradc_run "$dir/artifact" "$dir/tinygpt.gca" --params "$dir/params.safetensors" --inputs "$dir/inputs.safetensors"
judge "tinygpt artifact" "$dir/artifact" "$dir/ref/losses.txt" "$dir/ref/grads.safetensors"
gradc_run "$dir/tf32" "$tg" --target cuda --allow-tf32 "${common[@]}"
judge "tinygpt --allow-tf32" "$dir/tf32" "$dir/ref/losses.txt" "$dir/ref/grads.safetensors" 1e-2

# training: 10 AdamW steps, the last total loss next to the interpreter's
for t in ref cuda; do
  run "$gradc" train "$tg" --target $t --data "$dir/inputs.safetensors" --steps 10 --log "$dir/train-$t.csv" \
    --print-every 10
done
if [ $dry = 0 ]; then
  last() { tail -1 "$1" | awk -F, -v h="$(head -1 "$1")" 'BEGIN { n = split(h, c, ",") } { for (i = 1; i <= n; i++) if (c[i] == "total") print $i }'; }
  a=$(last "$dir/train-ref.csv" 2>/dev/null)
  b=$(last "$dir/train-cuda.csv" 2>/dev/null)
  ok=$(awk -v a="$a" -v b="$b" 'BEGIN { d = a - b; if (d < 0) d = -d; print (a != "" && b != "" && d <= 1e-3 * (a < 0 ? -a : a)) ? 0 : 1 }')
  record "train tinygpt 10 steps" "$ok" "loss ref $a cuda $b"
fi

# forward only (no autodiff): infer, eval over a dataset of 14 samples (one
# window of 7 micro-batches of 2) and greedy generate, next to the interpreter
fwd=$out/forward
mkdir -p "$fwd"
small=(-D B=4 -D T=16 -D C=32 -D L=1 -D NH=2 -D V=256)
run "$gradc" init "$tg" "${small[@]}" -o "$fwd/params.safetensors" --seed 5
run "$gradc" data random "$tg" "${small[@]}" -o "$fwd/inputs.safetensors" --seed 6
run "$gradc" data random "$tg" "${small[@]}" -D B=14 -o "$fwd/data.safetensors" --seed 7
for t in ref cuda; do
  p=(--target $t --params "$fwd/params.safetensors")
  run_sh "$(printf '%q ' "$gradc" infer "$tg" "${small[@]}" "${p[@]}" --inputs "$fwd/inputs.safetensors") >$fwd/infer-$t.txt 2>&1"
  run_sh "$(printf '%q ' "$gradc" eval "$tg" "${small[@]}" "${p[@]}" --data "$fwd/data.safetensors") >$fwd/eval-$t.txt 2>&1"
  run_sh "$(printf '%q ' "$gradc" generate "$tg" "${small[@]}" "${p[@]}" --prompt "the " --max-tokens 8 --temperature 0) >$fwd/generate-$t.txt 2>&1"
done
if [ $dry = 0 ]; then
  total() { awk '$1 == "loss" && $2 == "total" { print $3 }' "$1"; }
  close() { awk -v a="$1" -v b="$2" 'BEGIN { d = a - b; if (d < 0) d = -d; print (a != "" && b != "" && d <= 1e-4 * (a < 0 ? -a : a)) ? 0 : 1 }'; }
  for c in infer eval; do
    a=$(total "$fwd/$c-ref.txt")
    b=$(total "$fwd/$c-cuda.txt")
    record "$c tinygpt (forward only)" "$(close "$a" "$b")" "loss ref $a cuda $b"
  done
  same=1
  [ "$(head -c 4 "$fwd/generate-cuda.txt")" = "the " ] && cmp -s "$fwd/generate-ref.txt" "$fwd/generate-cuda.txt" && same=0
  record "generate tinygpt --temperature 0" $same "$(head -c 40 "$fwd/generate-cuda.txt" | tr -c '[:print:]' '.')"
fi

# ---------------------------------------------------------------------
if [ $bench = 1 ]; then
  say "== benchmarks (f32, TF32 off; step_ms is a window through the C API, host copies of params and gradients included)"
  configs="mlp examples/mlp.gdl -D B=256 -D D=784 -D H=1024
tinygpt-small examples/tinygpt.gdl -D B=8 -D T=32 -D C=64 -D L=2
tinygpt-large examples/tinygpt.gdl -D B=16 -D T=128 -D C=256 -D L=4 -D NH=4 -D V=96"
  [ $quick = 1 ] || configs="$configs
gpt2-124M examples/tinygpt.gdl -D B=4 -D T=1024 -D C=768 -D NH=12 -D L=12 -D V=50257"
  have_torch=0
  if [ $dry = 0 ] && python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    have_torch=1
  fi
  while read -r name model defs; do
    [ -n "$name" ] || continue
    f=$out/bench-$name
    # shellcheck disable=SC2086
    run_sh "GRADC_CUDA_TIMING=1 $gradc bench $src/$model $defs --target cuda --steps 20 > $f.txt 2> $f.err"
    [ $dry = 1 ] && continue
    dev=$(grep -o 'device [0-9.]* ms' "$f.err" | awk '{ print $2 }' | sort -n | awk '{ v[NR] = $1 } END { if (NR) print v[int((NR + 1) / 2)] }')
    say "$name: $(tr '\n' ' ' <"$f.txt")device_window_ms_median: ${dev:-?}"
    if [ $have_torch = 1 ] && [ "${model#*tinygpt}" != "$model" ]; then
      # shellcheck disable=SC2086
      tdefs=$(echo $defs | sed 's/-D /-D/g')
      # shellcheck disable=SC2086
      say "$name torch: $(python3 "$src/tests/gpu/torch_gpt.py" $tdefs --steps 20 2>&1 | tr '\n' ' ')"
    fi
  done <<<"$configs"
fi

say "== $passed passed, $failed failed${failures:+:$failures}"
[ $dry = 1 ] && exit 0
[ $failed = 0 ]
