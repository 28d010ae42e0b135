#!/usr/bin/env bash
# One device call: the split finish's one published answer (`nucleus.agree_wide`) with a first
# swap that expects every program of the row opened (tree abl12/guess), and the split half of
# the interval shortcut carried onto the fix (abl12/beat), against the fix (abl11/fix).
# Trees: `bash benchmarks/ablations/trees.sh abl11 fix=97d2cfb`, `bash
# benchmarks/ablations/trees.sh abl12 guess=REV beat=1471a46+interval_beaten_split_on_1471a46`,
# each tree's finish prebuilt into CACHE (benchmarks/results/dec06_e/README.md).
# 1. `benchmarks.path_probe` (top-p, batch 32, 152064 fp32) in guess and beat: pool words left
#    set and slower paths, 120 calls each.
# 2. `benchmarks/ab_trees.sh` fix, guess, beat at batches 1 and 32, two rounds (ABC, CBA).
# 3. Compiled tests, LIMIT seconds a shard: the GPU sampler tests of the split finish in the root
#    (its kernels are the fix's) and guess's agreement tests.
# Carry [CACHE, "abl11", "abl12"].
# Usage: OUT=dir [CACHE=.triton_cache_s] [LIMIT=420] bash benchmarks/ablations/agree_guess_call.sh
CACHE=${CACHE:-.triton_cache_s} source "$(dirname "$0")/call_setup.sh"
g=tests/gpu/test_sampler_gpu.py
test_shards "${LIMIT:-420}" "$g -k repeated" "$g -k split_nucleus" \
  "$g -k benchmark_settings and top_p and dtype0" "$g -k deep_nucleus_full_vocabulary and 16"
TREE=$R/abl12/guess test_shards "${LIMIT:-420}" "tests/sample/test_nucleus.py tests/sample/test_search.py"
for t in abl12/guess abl12/beat; do path_probe $t "$(basename $t)"; done
OUT=$OUT/ab ROUNDS=2 WARM=0 timeout 260 bash benchmarks/ab_trees.sh abl11/fix abl12/guess abl12/beat -- \
  --vocab 152064 --dtype float32 --modes top_p_warm,top_p,top_k_top_p,greedy --batches 1,32 \
  --k 20 --no-step --pdl > "$OUT/ab.txt" 2>&1
echo "ab_trees rc=$? ${SECONDS}s" >> "$log"
close_call
for f in "$OUT"/probe_*.txt; do echo "== $f"; grep -c "pool_words_left" "$f"; tail -1 "$f"; done
tail -14 "$OUT/ab.txt"
