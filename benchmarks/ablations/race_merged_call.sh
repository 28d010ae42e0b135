#!/usr/bin/env bash
# One device call after the one-program finish's top-p race was merged: the compiled tests of
# the root (LIMIT seconds a shard, in the background: the search and agreement tests, 1024
# top-p rows racing their draws in fp32 and in bf16; 256 when it ran), the root's tree
# (abl15/race: `bash benchmarks/ablations/trees.sh abl15 race=REV`) against the code before
# it (abl14/main) at batches 1 and 32, where the race is not compiled in, two rounds; and warm
# top-p at batch 32 with and without programmatic launches, three runs each, alternating, by
# kernel (CUPTI) and as the default engine's decode-loop step (`bench_sampling`, wall time per
# step with the host read; its graphs compiled in the background from the start).
# Both trees' variants prebuilt into CACHE (benchmarks/results/dec06_g/README.md).
# Carry [CACHE, "abl14", "abl15"].
# Usage: OUT=dir [CACHE=.triton_cache_t] [LIMIT=300] bash benchmarks/ablations/race_merged_call.sh
CACHE=${CACHE:-.triton_cache_t} source "$(dirname "$0")/call_setup.sh"
g=tests/gpu/test_sampler_gpu.py
test_shards "${LIMIT:-300}" \
  "tests/sample/test_search.py tests/sample/test_nucleus.py" \
  "$g -k large_top_p_batches and dtype0" "$g -k large_top_p_batches and dtype1"
step32_compile abl15/race
OUT=$OUT/ab_small ROUNDS=2 WARM=0 timeout 200 bash benchmarks/ab_trees.sh abl14/main abl15/race -- \
  --vocab 152064 --dtype float32 --modes top_p,top_k_top_p,logprobs_5,greedy --batches 1,32 \
  --k 20 --no-step --pdl > "$OUT/ab_small.txt" 2>&1
echo "ab_small rc=$? ${SECONDS}s" >> "$log"
warm32_pdl abl14/main 3
step32_pdl abl15/race 3
close_call
tail -10 "$OUT/ab_small.txt"
grep -h "_kernel" "$OUT"/warm32_*.log
grep -h "graphshard=" "$OUT"/step32_*.log
