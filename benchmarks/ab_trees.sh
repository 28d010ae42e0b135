#!/usr/bin/env bash
# Sampler kernel times of several source trees in one GPU run (an ablation: copies of this
# tree with one change each). Every tree compiles at once (the Triton cache keeps them), then
# each is timed alone: round 1 in the order given, round 2 (ROUNDS=2) in reverse, so a drift of
# the GPU over the run shows as a difference between the rounds.
# Usage: OUT=dir [ROUNDS=1|2] [WARM=0] bash benchmarks/ab_trees.sh TREE... [-- benchmarks.profile_kernels args]
# (default args: greedy, top-k, top-k + top-p, top-p, min-p and logprobs 5 at batches 1, 256 and
# 1024, layout K = 20, no engine step). A TREE is a directory holding a copy of the project,
# e.g. `git archive HEAD | tar -x -C out/abl/base`, then edited; it is named by its last path
# component (names must differ). Paths are relative to where the script runs. Results:
# $OUT/ab_trees.tgz holding kernels_<tree>_<round>.json and .log (one file, so any number of
# trees comes back from the GPU machine), plus the summary printed at the end.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
usage() { echo "usage: $0 TREE... [-- profile_kernels args]" >&2; exit 2; }
trees=() names=()
declare -A seen
while [[ $# -gt 0 && $1 != "--" ]]; do
  [[ -d "$1/graphshard" ]] || { echo "not a project tree: $1" >&2; exit 2; }
  tree=$(cd "$1" && pwd) name=$(basename "$1")
  [[ -z ${seen[$name]:-} ]] || { echo "two trees named $name: results would overwrite" >&2; exit 2; }
  seen[$name]=1 trees+=("$tree") names+=("$name")
  shift
done
[[ ${#trees[@]} -gt 0 ]] || usage
[[ $# -gt 0 ]] && shift
args=("$@")
[[ ${#args[@]} -gt 0 ]] || args=(--modes greedy,top_k,top_k_top_p,top_p,min_p,logprobs_5
                                 --batches 1,256,1024 --k 20 --no-step)
rounds=${ROUNDS:-1}
[[ $rounds == 1 || $rounds == 2 ]] || { echo "ROUNDS must be 1 or 2, got $rounds" >&2; exit 2; }
export OUT=${OUT:-out}
mkdir -p "$OUT" || exit 2
out=$(cd "$OUT" && pwd)
cd "$(dirname "$0")/.."
# Under $OUT, so that the runs finished before a timeout still come back.
work=$out/ab_work
rm -rf "$work" && mkdir -p "$work"
status=0
# WARM=0: the caller compiled every tree already (benchmarks/ab_call.sh).
if [[ ${WARM:-1} != 0 ]]; then
  for i in "${!trees[@]}"; do
    # The timed arguments at one mode: the same kernel variants (a bitmask's too; the batches
    # pick the finish's programs per row, so they stay), compiled for every tree at once.
    (cd "${trees[$i]}" && timeout 300 python3 -m benchmarks.profile_kernels "${args[@]}" \
      --modes greedy > "$work/warm_${names[$i]}.log" 2>&1) &
  done
  wait
fi
order=("${!trees[@]}")
for round in $(seq 1 "$rounds"); do
  for i in "${order[@]}"; do
    name=${names[$i]}
    (cd "${trees[$i]}" && timeout 200 python3 -m benchmarks.profile_kernels "${args[@]}" \
      --out "$work/kernels_${name}_$round.json" > "$work/kernels_${name}_$round.log" 2>&1) \
      || { status=1; tail -n 5 "$work/kernels_${name}_$round.log"; }
    echo "$name round $round done at ${SECONDS}s"
  done
  mapfile -t order < <(printf '%s\n' "${order[@]}" | tac)
done
tar -czf "$out/ab_trees.tgz" -C "$work" . || status=1
rm -rf "$work"
# Scan / finish µs per tree, from the round-1 files.
python3 - "$out/ab_trees.tgz" "${names[@]}" <<'EOF' || status=1
import collections, io, json, sys, tarfile
runs = collections.defaultdict(dict)
with tarfile.open(sys.argv[1]) as tar:
    for member in tar.getmembers():
        if member.name.endswith("_1.json"):
            tree = member.name.split("/")[-1][len("kernels_"):-len("_1.json")]
            for row in json.load(io.TextIOWrapper(tar.extractfile(member))):
                if "us" in row:
                    runs[tree][(row["what"], row["batch"], row["kernel"].strip("_"))] = row["us"]
names = [n for n in sys.argv[2:] if n in runs]
points = sorted({(w, b) for t in runs.values() for (w, b, _) in t})
print("what batch | " + " | ".join(names))
for what, batch in points:
    cells = [f"{t.get((what, batch, 'scan_kernel'), 0):.1f}/{t.get((what, batch, 'finish_kernel'), 0):.1f}"
             for t in (runs[n] for n in names)]
    print(f"{what} {batch} | " + " | ".join(cells))
EOF
exit $status
