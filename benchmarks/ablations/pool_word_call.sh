#!/usr/bin/env bash
# One device call: the pool word a small-batch top-p row's finish left set, before and after
# the row's programs agree on one answer (`nucleus.agree_wide`). Trees: abl10/main (the sampler
# before, with the cache benchmarks/results/dec06_d/README.md builds) and abl11/fix (the fix;
# `bash benchmarks/ablations/trees.sh abl11 fix=REV`, its cache prebuilt the same way).
# 1. `benchmarks.path_probe` (top-p, batch 32, 152064 fp32, programmatic launches) in each
#    tree, twice: the rows whose pool word a launch left set, and the paths per call.
# 2. `benchmarks/ab_trees.sh` main against fix at batches 1 and 32, two rounds in ABBA order.
# 3. The compiled split-finish tests of fix, one process a shard, LIMIT seconds.
# Carry [CACHE, "abl10/main", "abl11"].
# Usage: OUT=dir [CACHE=.triton_cache_s] [LIMIT=200] bash benchmarks/ablations/pool_word_call.sh
CACHE=${CACHE:-.triton_cache_s} source "$(dirname "$0")/call_setup.sh"
for t in abl10/main abl11/fix; do
  for i in 1 2; do path_probe $t "$(basename $t)_$i"; done
done
OUT=$OUT/ab ROUNDS=2 WARM=0 timeout 150 bash benchmarks/ab_trees.sh abl10/main abl11/fix -- \
  --vocab 152064 --dtype float32 --modes top_p_warm,top_p,top_k_top_p,greedy --batches 1,32 \
  --k 20 --no-step --pdl > "$OUT/ab.txt" 2>&1
echo "ab_trees rc=$? ${SECONDS}s" >> "$log"
g=tests/gpu/test_sampler_gpu.py
TREE=$R/abl11/fix test_shards "${LIMIT:-200}" "tests/sample/test_nucleus.py tests/sample/test_search.py" \
  "$g -k split_nucleus" "$g -k benchmark_settings and top_p and dtype0"
close_call
for f in "$OUT"/probe_*.txt; do echo "== $f"; grep -c "pool_words_left" "$f"; tail -1 "$f"; done
tail -10 "$OUT/ab.txt"
