#!/usr/bin/env bash
# Sampler kernel times of two source trees in one device call: both compile at once (the Triton
# cache keeps them), then each is timed alone, twice, in ABBA order. Every log and result lands
# under $OUT, so nothing depends on what the terminal shows.
# Usage: OUT=dir bash benchmarks/ab_kernels.sh OTHER_TREE [benchmarks.profile_kernels args]
# (default args: every mode of benchmarks/sampling_modes.py at batches 1, 32, 256, 1024, layout
# K = 20 for all, no engine step). OTHER_TREE is a copy of another commit (from this one on: it
# needs profile_kernels' --k and --no-step), e.g. `git archive <commit> | tar -x -C out/base`.
# Files: kernels_{other,this}_{1,2}.json and .log, warm_{other,this}.log.
set -uo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
[[ $# -ge 1 && -d "$1/graphshard" ]] || { echo "usage: $0 OTHER_TREE [profile_kernels args]" >&2; exit 2; }
other=$(cd "$1" && pwd)
shift
export OUT=${OUT:-out}
mkdir -p "$OUT"
out=$(cd "$OUT" && pwd)
modes=$(python3 -c 'from benchmarks.sampling_modes import MODES; print(",".join(MODES))')
args=("$@")
[[ ${#args[@]} -gt 0 ]] || args=(--modes "$modes" --batches 1,32,256,1024 --k 20 --no-step)
warm=(--modes greedy --batches 1 --k 20 --no-step)
(cd "$other" && timeout 300 python3 -m benchmarks.profile_kernels "${warm[@]}" \
  > "$out/warm_other.log" 2>&1) &
timeout 300 python3 -m benchmarks.profile_kernels "${warm[@]}" > "$out/warm_this.log" 2>&1
wait
status=0
# Two rounds in ABBA order (other, this, this, other): a drift of the GPU over the run (clocks,
# heat) shows as a difference between the rounds instead of passing for a difference between
# the trees.
time_tree() {  # tree name round
  (cd "$1" && timeout 200 python3 -m benchmarks.profile_kernels "${args[@]}" \
    --out "$out/kernels_$2_$3.json" > "$out/kernels_$2_$3.log" 2>&1) || status=1
}
time_tree "$other" other 1
time_tree . this 1
time_tree . this 2
time_tree "$other" other 2
grep -h -e " paths " "$out"/kernels_this_*.log | grep -v "'draw_fallback': 0, 'logprobs_fallback': 0, 'counted': 0" \
  || echo "every row of this tree settled from its candidates"
exit $status
