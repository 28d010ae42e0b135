#!/usr/bin/env bash
# One device call: the mixed workload (`benchmarks.mixed_steps`, every step checked against the
# oracle) on two or more trees, and GPU tests on this checkout. Phase 1 (LIMIT seconds in all,
# default 420) compiles the trees' engines by running a few untimed steps, one tree after
# another, into one Triton cache: an engine's capture already compiles its sampler variants on
# every core, and trees whose sampler source is the same share every variant (the cache is keyed
# by source), so the first tree's ~200 s on an H100 host (~320 s on an H200 host) are the
# phase's whole cost, and the next trees take ~9 s each; compiled
# side by side, each tree in a cache of its own, three trees had not finished in 420 s. The test
# shards (TESTS, as tests_call.sh takes them) run beside phase 1 and take cores from it: give
# LIMIT ~100 s more per busy shard, or run them in a call of their own. Phase 2 times the trees
# one after another, alone on the GPU, from the cache phase 1 filled, then pairs each timed
# tree's steps with the first's (`mixed_steps --compare`). The cache lies in the machine's /tmp:
# a call on the same warm machine compiles nothing again, and a call that compiled brings the
# cache back as $OUT/0pack_mixed.NN: copied to .triton_pack/mixed.NN here and carried in with
# MIXED_PACK=.triton_pack/mixed, a later call's trees of the same kernels compile nothing. Files
# under $OUT: mixed_<tree>.json and .txt, paired_<tree>.txt, compile_<tree>.txt, tests_<n>.txt,
# 0_log.txt, 0all.tgz and the pack.
# TEST_LIMIT (default LIMIT) bounds the test shards. LAUNCH_TREE (one of the trees) then times
# its eager step's sampler launches, plain and bound (`--launch-cost 100`, launch_<tree>.txt).
# Usage: OUT=dir [TESTS="..."] [LIMIT=420] [TEST_LIMIT=s] [STEPS=300] [LAUNCH_TREE=tree]
#        [MIXED_PACK=.triton_pack/mixed] bash benchmarks/ablations/mixed_ab_call.sh TREE...
CACHE=.triton_cache_tests source "$(dirname "$0")/call_setup.sh"
[[ $# -gt 0 ]] || { echo "usage: $0 TREE..." >&2; exit 2; }
limit=${LIMIT:-420}
mixed_cache=/tmp/mixed_cache
mkdir -p "$mixed_cache"
[[ -n ${MIXED_PACK:-} ]] && unpack_pack "$MIXED_PACK" "$(dirname "$mixed_cache")"
cached=$(cache_entries "$mixed_cache")
declare -A compiled  # the trees whose compile finished: phase 2 times only these
# mixed TREE SECONDS FILE ARGS...: `benchmarks.mixed_steps ARGS` in TREE from the shared cache,
# for at most SECONDS, its output into FILE; returns its exit status.
mixed() {
  local tree=$1 seconds=$2 file=$3
  shift 3
  (cd "$tree" && TRITON_CACHE_DIR=$mixed_cache timeout -k 5 "$seconds" \
     python3 -m benchmarks.mixed_steps --profile-steps 0 "$@" > "$file" 2>&1)
}
[[ -n ${TESTS:-} ]] && { IFS=';' read -ra shards <<< "$TESTS"; test_shards "${TEST_LIMIT:-$limit}" "${shards[@]}"; }
for tree in "$@"; do
  name=$(basename "$tree")
  left=$((limit - SECONDS))
  ((left > 0)) || { echo "compile $name skipped: phase 1's ${limit}s spent" >> "$log"; continue; }
  mixed "$tree" "$left" "$OUT/compile_$name.txt" --steps 3
  rc=$?
  echo "compile $name rc=$rc ${SECONDS}s" >> "$log"
  ((rc == 0)) && compiled[$name]=1
done
# Phase 2 waits for the tests too: they would share the GPU with the timed steps.
wait
grep -H -E "passed|failed|error" "$OUT"/tests_*.txt 2>/dev/null | grep -v "::" >> "$log"
echo "phase 1 ${SECONDS}s" >> "$log"
for tree in "$@"; do
  name=$(basename "$tree")
  [[ -n ${compiled[$name]:-} ]] || { echo "mixed $name skipped: not compiled" >> "$log"; continue; }
  mixed "$tree" 150 "$OUT/mixed_$name.txt" --steps "${STEPS:-300}" --parts --verify \
    --out "$OUT/mixed_$name.json"
  echo "mixed $name rc=$? ${SECONDS}s" >> "$log"
done
timed=()
for tree in "$@"; do [[ -s $OUT/mixed_$(basename "$tree").json ]] && timed+=("$(basename "$tree")"); done
for name in "${timed[@]:1}"; do
  python3 -m benchmarks.mixed_steps --compare "$OUT/mixed_${timed[0]}.json" "$OUT/mixed_$name.json" \
    > "$OUT/paired_$name.txt" 2>&1
done
if [[ -n ${LAUNCH_TREE:-} && -n ${compiled[$(basename "$LAUNCH_TREE")]:-} ]]; then
  name=$(basename "$LAUNCH_TREE")
  mixed "$LAUNCH_TREE" 90 "$OUT/launch_$name.txt" --steps 30 --launch-cost 100
  echo "launch cost $name rc=$? ${SECONDS}s" >> "$log"
fi
bring_back mixed "$mixed_cache" "$cached"
close_call
