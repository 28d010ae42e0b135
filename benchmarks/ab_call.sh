#!/usr/bin/env bash
# One GPU call of an ablation, within one device call's time: phase 1 compiles every tree's
# kernels (`benchmarks.prebuild`, then `benchmarks.profile_kernels` at one mode) while the GPU
# tests run on one tree; phase 2
# times the trees alone with benchmarks/ab_trees.sh (two rounds, ABBA, no warm-up of its own),
# their kernels taken from the Triton cache phase 1 filled.
# Usage: OUT=dir [BUDGET=560] [TRITON_CACHE_DIR=.triton_cache] [TEST_TREE=.]
#        [TEST_FILES=tests/gpu/test_sampler_gpu.py]
#        [TEST_K="pytest -k expression"] bash benchmarks/ab_call.sh TREE... -- profile_kernels args
# No TEST_K: no tests. Arguments profile_kernels refuses (`--check`) and a TEST_K that selects
# no test stop the call first, before anything compiles. Files under $OUT: times.txt (the
# GPU's clocks, the cache's size, when each phase ended and its exit status), build_<tree>.txt
# (seconds per kernel variant), warm_<tree>.txt, tests.txt, ab.txt
# (the summary) and ab_trees.tgz.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
trees=()
while [[ $# -gt 0 && $1 != "--" ]]; do trees+=("$1"); shift; done
[[ $# -gt 0 ]] && shift
[[ ${#trees[@]} -gt 0 && $# -gt 0 ]] || {
  echo "usage: $0 TREE... -- profile_kernels args" >&2; exit 2; }
export OUT=${OUT:-out}
mkdir -p "$OUT" || exit 2
# A typo in the timing's arguments or a -k that selects nothing is refused here, in seconds,
# before the call's time goes into compiling.
root=$(cd "$(dirname "$0")/.." && pwd)
(cd "$root" && python3 -m benchmarks.profile_kernels "$@" --check) || exit 2
test_tree=${TEST_TREE:-.} test_files=${TEST_FILES:-tests/gpu/test_sampler_gpu.py}
if [[ -n ${TEST_K:-} ]]; then
  selected=$(cd "$test_tree" && python3 -m pytest --collect-only -q -p no:cacheprovider \
    $test_files -k "$TEST_K" 2>/dev/null | grep -c "::")
  [[ $selected -gt 0 ]] || { echo "TEST_K=$TEST_K selects no test" >&2; exit 2; }
  echo "TEST_K selects $selected tests" >&2
fi
budget=${BUDGET:-560}
export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-$(mktemp -d)}
mkdir -p "$TRITON_CACHE_DIR" && TRITON_CACHE_DIR=$(cd "$TRITON_CACHE_DIR" && pwd)
log=$OUT/times.txt
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > "$log" 2>&1
# A cache built ahead on another machine (benchmarks/prebuild.py) names its files by the paths
# they had there.
(cd "$root" && python3 -m benchmarks.prebuild --relocate) >> "$log" 2>&1
SECONDS=0
# Compiling takes most of phase 1; the tests get what is left of it after the timing's share.
# Each tree's kernel variants compile in parallel over the machine's cores (seconds when the
# carried cache has them), then one run at one mode loads them and builds Triton's launchers.
phase1=$((budget * 2 / 3))
jobs=$(( $(nproc) / ${#trees[@]} )); (( jobs > 0 )) || jobs=1
for tree in "${trees[@]}"; do
  name=$(basename "$tree")
  (cd "$tree" && TRITON_INTERPRET=0 timeout -k 5 "$phase1" python3 -m benchmarks.prebuild \
     --jobs "$jobs" "$@" > "$OUT/build_$name.txt" 2>&1
   echo "build $name rc=$? ${SECONDS}s" >> "$log"
   timeout -k 5 $(( phase1 > SECONDS ? phase1 - SECONDS : 1 )) python3 -m benchmarks.profile_kernels \
     "$@" --modes greedy > "$OUT/warm_$name.txt" 2>&1
   echo "warm $name rc=$? ${SECONDS}s" >> "$log") &
done
if [[ -n ${TEST_K:-} ]]; then
  (cd "$test_tree" && timeout -k 5 "$phase1" python3 -m pytest -q -rs -p no:cacheprovider \
     $test_files -k "$TEST_K" > "$OUT/tests.txt" 2>&1
   echo "tests rc=$? ${SECONDS}s" >> "$log") &
fi
wait
echo "phase 1 done ${SECONDS}s" >> "$log"
ROUNDS=2 WARM=0 timeout -k 5 $((budget - SECONDS)) bash "$(dirname "$0")/ab_trees.sh" "${trees[@]}" \
  -- "$@" > "$OUT/ab.txt" 2>&1
echo "ab rc=$? ${SECONDS}s" >> "$log"
