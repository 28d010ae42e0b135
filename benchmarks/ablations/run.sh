#!/usr/bin/env bash
# Time the ablation patches of this folder against the unpatched code, in one GPU run.
# Usage: OUT=dir [ROUNDS=1|2] bash benchmarks/ablations/run.sh [VARIANT...] [-- profile_kernels args]
# A VARIANT is NAME=PATCH[+PATCH...] (patch file names without .patch); the default variant is
# capture=scan_one_capture.
# Every tree (base and one per variant) is a copy of this checkout's project files with its
# patches applied, made under a temporary folder (no git needed); then benchmarks/ab_trees.sh
# times them. DRY=1 only builds the trees and says where they are.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
variants=() args=()
while [[ $# -gt 0 && $1 != "--" ]]; do variants+=("$1"); shift; done
[[ $# -gt 0 ]] && { shift; args=("$@"); }
[[ ${#variants[@]} -gt 0 ]] || variants=(capture=scan_one_capture)
work=$(mktemp -d)
copy_tree() {
  mkdir -p "$work/$1"
  (cd "$root" && cp -r graphshard benchmarks tests configs pyproject.toml "$work/$1/")
}
copy_tree base
trees=("$work/base")
for v in "${variants[@]}"; do
  name=${v%%=*} patches=${v#*=}
  [[ $name != "$v" && -n $name && $name != base ]] || { echo "bad variant: $v" >&2; exit 2; }
  copy_tree "$name"
  IFS=+ read -ra list <<< "$patches"
  for p in "${list[@]}"; do
    (cd "$work/$name" && patch -p1 -s < "$here/$p.patch") || { echo "$p.patch does not apply" >&2; exit 2; }
  done
  trees+=("$work/$name")
done
if [[ -n ${DRY:-} ]]; then
  echo "trees: ${trees[*]}"
  exit 0
fi
default=(--modes greedy,top_k,top_k_top_p,top_p,min_p,logprobs_5 --batches 1,256,1024 --k 20 --no-step)
[[ ${#args[@]} -gt 0 ]] || args=("${default[@]}")
status=0
bash "$root/benchmarks/ab_trees.sh" "${trees[@]}" -- "${args[@]}" || status=$?
rm -rf "$work"
exit $status
