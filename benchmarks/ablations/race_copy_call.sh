#!/usr/bin/env bash
# One device call: the one-program finish's two prepared top-p changes timed against the code,
# the code's split finish against the merged interval shortcut, and the compiled tests of the
# code's kernels. Trees (`bash benchmarks/ablations/trees.sh abl14 main=REV
# race=REV+pool_race_one_program copy=REV+pool_draw_in_copy`, and abl13/merged from 06aaca0),
# each tree's variants prebuilt into CACHE (benchmarks/results/dec06_g/README.md).
# 1. Compiled tests of the root, LIMIT seconds a shard, in the background: the agreement and
#    search tests, the repeated top-p launches, the fp32 top-p settings.
# 2. `benchmarks.path_probe` (top-p, batch 32, 152064 fp32) in abl14/main.
# 3. `benchmarks/ab_trees.sh` merged against main at batches 1 and 32, two rounds (ABBA).
# 4. `benchmarks/ab_trees.sh` main, race and copy at batches 256 and 1024, two rounds.
# 5. Warm top-p at batch 32 in abl14/main, two runs with programmatic launches and two
#    without, alternating: does the scan's slow mode come from a kernel waiting on its
#    predecessor inside its own CUPTI interval?
# Carry [CACHE, "abl13", "abl14"].
# Usage: OUT=dir [CACHE=.triton_cache_t] [LIMIT=420] bash benchmarks/ablations/race_copy_call.sh
CACHE=${CACHE:-.triton_cache_t} source "$(dirname "$0")/call_setup.sh"
g=tests/gpu/test_sampler_gpu.py
test_shards "${LIMIT:-420}" \
  "tests/sample/test_nucleus.py tests/sample/test_search.py" "$g -k repeated" \
  "$g -k benchmark_settings and top_p and dtype0"
path_probe abl14/main main
OUT=$OUT/ab_small ROUNDS=2 WARM=0 timeout 150 bash benchmarks/ab_trees.sh abl13/merged abl14/main -- \
  --vocab 152064 --dtype float32 --modes top_p_warm,top_p,top_k_top_p,greedy --batches 1,32 \
  --k 20 --no-step --pdl > "$OUT/ab_small.txt" 2>&1
echo "ab_small rc=$? ${SECONDS}s" >> "$log"
OUT=$OUT/ab_big ROUNDS=2 WARM=0 timeout 240 bash benchmarks/ab_trees.sh abl14/main abl14/race abl14/copy -- \
  --vocab 152064 --dtype float32 --modes top_p,top_k_top_p,logprobs_5,greedy --batches 256,1024 \
  --k 20 --no-step --pdl > "$OUT/ab_big.txt" 2>&1
echo "ab_big rc=$? ${SECONDS}s" >> "$log"
warm32_pdl abl14/main 2
close_call
grep -c "pool_words_left" "$OUT/probe_main.txt"; tail -1 "$OUT/probe_main.txt"
tail -12 "$OUT/ab_small.txt"; tail -16 "$OUT/ab_big.txt"
