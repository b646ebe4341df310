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
# The installed plugins are found without --plugin-path (the install's own plugin folder).
"$work/prefix/bin/keel-plugin" inspect llama3 > /dev/null
test -f "$work/prefix/include/keel/keel.h"
echo "out-of-tree plugin trained"
