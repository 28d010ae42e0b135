#!/usr/bin/env bash
# Build the trees of an ablation from git revisions, before a GPU run (the GPU machine gets a
# copy of the working tree without the repository's history).
# Usage: bash benchmarks/ablations/trees.sh DIR NAME=REV[+PATCH...]...
# Each tree DIR/NAME is REV's project files (graphshard, benchmarks without its results, tests,
# configs, pyproject.toml) with the named patches of this folder applied (file names without .patch).
# DIR must not be ignored by git, so that the trees travel with the working tree; delete it
# before committing. Then, for example:
#   OUT=$OUT bash benchmarks/ab_call.sh DIR/base DIR/new -- --modes greedy --batches 1 --no-step
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(git -C "$here" rev-parse --show-toplevel)
[[ $# -ge 2 ]] || { echo "usage: $0 DIR NAME=REV[+PATCH...]..." >&2; exit 2; }
dir=$1; shift
for spec in "$@"; do
  name=${spec%%=*} rest=${spec#*=}
  [[ $name != "$spec" && -n $name && -n $rest ]] || { echo "bad tree: $spec" >&2; exit 2; }
  IFS=+ read -ra parts <<< "$rest"
  rev=${parts[0]}
  tree=$dir/$name
  rm -rf "$tree" && mkdir -p "$tree"
  git -C "$root" archive "$rev" graphshard benchmarks tests configs pyproject.toml \
    | tar -x -C "$tree" --exclude=benchmarks/results
  # Every tree is timed and compiled ahead (benchmarks/prebuild.py) by the tip's scripts.
  cp "$root/benchmarks/profile_kernels.py" "$root/benchmarks/prebuild.py" "$tree/benchmarks/"
  for p in "${parts[@]:1}"; do
    (cd "$tree" && patch -p1 -s < "$here/$p.patch") || { echo "$p.patch does not apply to $rev" >&2; exit 2; }
  done
  echo "$tree: $rev${parts[1]:++}$(IFS=+; echo "${parts[*]:1}")"
done
