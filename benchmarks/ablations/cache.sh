#!/usr/bin/env bash
# Build the Triton cache of an ablation's trees on this machine (no GPU needed), for a device
# call to carry in, so that the call spends its time timing instead of compiling.
# Usage: bash benchmarks/ablations/cache.sh CACHE TREE... -- profile_kernels args
# Then run the call with carry [CACHE] and TRITON_CACHE_DIR=CACHE (benchmarks/ab_call.sh points
# the entries at where the cache lies there). CACHE must be a path git ignores (.triton_cache/
# is) and, with everything else carried, under 64 MiB: the sizes are printed at the end.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
[[ $# -ge 3 ]] || { echo "usage: $0 CACHE TREE... -- profile_kernels args" >&2; exit 2; }
mkdir -p "$1"
export TRITON_CACHE_DIR=$(cd "$1" && pwd) TRITON_INTERPRET=0
shift
trees=()
while [[ $# -gt 0 && $1 != "--" ]]; do trees+=("$(cd "$1" && pwd)"); shift; done
[[ $# -gt 0 ]] && shift
# Each tree's build runs in that tree: a file argument given relative to here is made absolute.
args=()
while [[ $# -gt 0 ]]; do
  if [[ $1 == --libtriton && $# -gt 1 ]]; then args+=("$1" "$(realpath "$2")"); shift 2
  else args+=("$1"); shift; fi
done
# The second pass should find every variant (well under a second each): a variant it compiles
# again had a key that depends on something besides the tree's source (Triton's keys depend on
# the order a process computes them in; `benchmarks/prebuild.py` follows the launches' order).
for pass in build check; do
  for tree in "${trees[@]}"; do
    echo "== $pass $tree"
    (cd "$tree" && python3 -m benchmarks.prebuild --jobs "$(nproc)" "${args[@]}")
  done
done
cd "$root" && python3 -m benchmarks.prebuild --relocate
