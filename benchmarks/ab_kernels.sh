#!/usr/bin/env bash
# Sampler kernel times of two source trees in one device call: both compile at once (the Triton
# cache keeps them), then each is timed alone, twice, in ABBA order (`benchmarks/ab_trees.sh`
# with trees named "other" and "this" and ROUNDS=2). Every log and result lands under $OUT, so
# nothing depends on what the terminal shows.
# Usage: OUT=dir bash benchmarks/ab_kernels.sh OTHER_TREE [benchmarks.profile_kernels args]
# (default args: every mode of benchmarks/sampling_modes.py at batches 1, 32, 256, 1024, layout
# K = 20 for all, no engine step). OTHER_TREE is a copy of another commit (from this one on: it
# needs profile_kernels' --k and --no-step), e.g. `git archive <commit> | tar -x -C out/base`.
# Files: kernels_{other,this}_{1,2}.json and .log, warm_{other,this}.log.
set -uo pipefail
cd "$(dirname "$0")/.."
[[ $# -ge 1 && -d "$1/graphshard" ]] || { echo "usage: $0 OTHER_TREE [profile_kernels args]" >&2; exit 2; }
other=$(cd "$1" && pwd)
shift
export OUT=${OUT:-out}
mkdir -p "$OUT"
out=$(cd "$OUT" && pwd)
modes=$(python3 -c 'from benchmarks.sampling_modes import MODES; print(",".join(MODES))')
args=("$@")
[[ ${#args[@]} -gt 0 ]] || args=(--modes "$modes" --batches 1,32,256,1024 --k 20 --no-step)
# The two trees under the names their files carry.
names=$(mktemp -d)
ln -s "$other" "$names/other"
ln -s "$(pwd)" "$names/this"
ROUNDS=2 OUT="$out" bash benchmarks/ab_trees.sh "$names/other" "$names/this" -- "${args[@]}"
status=$?
rm -rf "$names"
tar -xzf "$out/ab_trees.tgz" -C "$out" && rm "$out/ab_trees.tgz" || status=1
grep -h -e " paths " "$out"/kernels_this_*.log | grep -v "'draw_fallback': 0, 'logprobs_fallback': 0, 'counted': 0" \
  || echo "every row of this tree settled from its candidates"
exit $status
