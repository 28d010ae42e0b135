#!/usr/bin/env bash
# One device call: the split finish with the interval shortcut and agree_wide's first swap
# expecting every program opened (tree abl13/merged: `bash benchmarks/ablations/trees.sh abl13
# merged=REV`), against the fix (abl11/fix), each tree's finish prebuilt into CACHE as in
# benchmarks/results/dec06_e/README.md.
# 1. `benchmarks.path_probe` (top-p, batch 32, 152064 fp32) in merged: pool words left set and
#    slower paths, 120 calls.
# 2. `benchmarks/ab_trees.sh` fix against merged at batches 1 and 32, two rounds in ABBA order.
# 3. Compiled tests of merged, LIMIT seconds a shard: the agreement and search tests, the
#    repeated top-p launches, the fp32 top-p settings (which count the beaten rows).
# Carry [CACHE, "abl11", "abl13"].
# Usage: OUT=dir [CACHE=.triton_cache_s] [LIMIT=240] bash benchmarks/ablations/beaten_merged_call.sh
CACHE=${CACHE:-.triton_cache_s} source "$(dirname "$0")/call_setup.sh"
g=tests/gpu/test_sampler_gpu.py
TREE=$R/abl13/merged test_shards "${LIMIT:-240}" \
  "tests/sample/test_nucleus.py tests/sample/test_search.py" "$g -k repeated" \
  "$g -k benchmark_settings and top_p and dtype0"
path_probe abl13/merged merged
OUT=$OUT/ab ROUNDS=2 WARM=0 timeout 150 bash benchmarks/ab_trees.sh abl11/fix abl13/merged -- \
  --vocab 152064 --dtype float32 --modes top_p_warm,top_p,top_k_top_p,greedy --batches 1,32 \
  --k 20 --no-step --pdl > "$OUT/ab.txt" 2>&1
echo "ab_trees rc=$? ${SECONDS}s" >> "$log"
close_call
grep -c "pool_words_left" "$OUT/probe_merged.txt"; tail -1 "$OUT/probe_merged.txt"
tail -10 "$OUT/ab.txt"
