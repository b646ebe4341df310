#!/usr/bin/env bash
# Installs the Keel build to a temporary prefix, builds the out-of-tree plugin against the
# installed SDK only, and trains with it from the installed keel-train.
# Usage: run_test.sh KEEL_BUILD_DIR WORK_DIR
set -euo pipefail
build=$1
work=$2
here=$(cd "$(dirname "$0")" && pwd)
rm -rf "$work"
mkdir -p "$work"
cmake --install "$build" --prefix "$work/prefix" > "$work/install.log"
cmake -S "$here" -B "$work/build" -DCMAKE_PREFIX_PATH="$work/prefix" -DCMAKE_BUILD_TYPE=Release > "$work/configure.log"
cmake --build "$work/build" > "$work/build.log"
out=$("$work/prefix/bin/keel-train" --config "$here/job.toml" --plugin-path "$work/build" \
  --set "job.run_dir=\"$work/run\"" 2>&1) || { echo "$out"; exit 1; }
echo "$out" | tail -n 8
grep -q "value_clipper: clamping gradients to" <<< "$out"
grep -q "step 5/5" <<< "$out"
# Swapping in the out-of-tree clipper under pipeline parallelism keeps the replicas exact.
out=$("$work/prefix/bin/keel-launch" --nproc 2 -- "$work/prefix/bin/keel-train" --config "$here/job_pp2.toml" \
  --plugin-path "$work/build" --set "job.run_dir=\"$work/run_pp2\"" 2>&1) || { echo "$out"; exit 1; }
echo "$out" | tail -n 3
grep -q "replica guard: 5 check(s), every copy of every parameter bitwise equal" <<< "$out"
# Clipper hot-swap: save with norm_clipper, resume with the out-of-tree clipper, and back. The
# norm_clipper's state (its step counters) rides through the value_clipper run unused and is
# restored when norm_clipper returns; replicas stay bitwise equal throughout.
# The job file holds both clippers' tables; each swap is `--set clipper.plugin=NAME` alone.
swap() {  # swap RUN STEPS CLIPPER [LOAD]; the job is $swap_job (default job_swap.toml)
  local args=(--config "$here/${swap_job:-job_swap.toml}" --plugin-path "$work/build" --set "job.run_dir=\"$work/$1\""
    --set "training.steps=$2" --set "clipper.plugin=$3")
  [ -n "${4:-}" ] && args+=(--set "checkpoint.load=\"$work/$4\"")
  "$work/prefix/bin/keel-launch" --nproc 2 -- "$work/prefix/bin/keel-train" "${args[@]}" 2>&1
}
clipper_steps() {  # clipper_steps CHECKPOINT -> norm_clipper's step counter in it
  python3 -c "import sys
from safetensors import safe_open
with safe_open(sys.argv[1] + '/rank-00000.safetensors', 'pt') as f:
    print(int(f.get_tensor('clipper.norm_clipper.steps').item()))" "$work/$1"
}
out=$(swap swap1 4 norm_clipper) || { echo "$out"; exit 1; }
out=$(swap swap2 8 value_clipper swap1/checkpoints/step-4) || { echo "$out"; exit 1; }
# value_clipper read its own table, and the unselected one was kept and named once.
grep -q "value_clipper: clamping gradients to +-0.005000" <<< "$out" || { echo "$out"; exit 1; }
grep -q "\[clipper.norm_clipper\] holds settings of a component not selected (the clipper is 'value_clipper')" \
  <<< "$out" || { echo "$out"; exit 1; }
grep -q "checkpoint saved with clipper 'norm_clipper'; this run clips with 'value_clipper', whose state is empty; 2 other clipper state tensor(s) kept, unused" <<< "$out" || { echo "$out"; exit 1; }
grep -q "replica guard: 4 check(s), every copy of every parameter bitwise equal" <<< "$out"
[ "$(clipper_steps swap2/checkpoints/step-8)" = 4 ]
out=$(swap swap3 12 norm_clipper swap2/checkpoints/step-8) || { echo "$out"; exit 1; }
grep -q "checkpoint saved with clipper 'value_clipper'; this run clips with 'norm_clipper', whose state is restored from the checkpoint" <<< "$out" || { echo "$out"; exit 1; }
grep -q "replica guard after load: every copy bitwise equal" <<< "$out"
[ "$(clipper_steps swap3/checkpoints/step-12)" = 8 ]
grep -q "\[clipper.value_clipper\] holds settings of a component not selected (the clipper is 'norm_clipper')" \
  <<< "$out" || { echo "$out"; exit 1; }
echo "clipper hot-swap: norm_clipper -> value_clipper -> norm_clipper, state carried"
# The same swap with tied llama3: the head's REPLICA of the embedding stays bitwise equal to its
# owner through the load and every step the out-of-tree clipper takes.
out=$(swap_job=job_swap_tied.toml swap tied1 4 norm_clipper) || { echo "$out"; exit 1; }
grep -q "replica guard: 4 check(s), every copy of every parameter bitwise equal" <<< "$out" || { echo "$out"; exit 1; }
out=$(swap_job=job_swap_tied.toml swap tied2 8 value_clipper tied1/checkpoints/step-4) || { echo "$out"; exit 1; }
grep -q "replica guard after load: every copy bitwise equal" <<< "$out" || { echo "$out"; exit 1; }
grep -q "replica guard: 4 check(s), every copy of every parameter bitwise equal" <<< "$out" || { echo "$out"; exit 1; }
echo "clipper hot-swap with tied llama3 at PP2: replicas bitwise equal"
# The installed plugins are found without --plugin-path (the install's own plugin folder).
"$work/prefix/bin/keel-plugin" inspect llama3 > /dev/null
test -f "$work/prefix/include/keel/keel.h"
echo "out-of-tree plugin trained"
