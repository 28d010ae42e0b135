#!/usr/bin/env bash
# One device call: three changes to the top-p finish against the code, timed, and the compiled
# tests of all three together alongside (one process per shard, LIMIT seconds). Trees
# (benchmarks/results/dec06_d/README.md builds them and the cache):
#   abl10/main  the code;
#   abl10/gap   deep_split.wants_row takes the scan winner's score from z - g and loads its
#               logit only near the pool's floor (`winner_score_from_gumbel.patch`);
#   abl10/beat  nucleus.settle_split takes the best Gumbel score above the threshold's
#               interval when it beats the interval's, without gathering and sorting it;
#   abl10/both  gap and beat;
#   abl10/race  both, and candidates.search_mass (the one-program finish, batches above 64)
#               races the scores above the threshold's interval against those in it: the
#               same shortcut as beat's, with no copy, sort or draw pass.
# `benchmarks/ab_trees.sh`, two rounds in ABBA order, of `profile_kernels`: 152064 fp32 at
# batches 1 and 32 (all trees) and 256 and 1024 (both, race), 128256 bf16 at 1 and 32 (main,
# both); then `benchmarks.warm_rows` at 152064 fp32 on the small-batch trees, twice in ABBA
# order. Carry [CACHE, "abl10"].
# SHORT=1 (a call of ~5 minutes): the split, search, large-batch and fp32 settings shards only;
# trees main, gap and race at batches 1 and 32; one round of warm rows; no 128256 bf16.
# Usage: OUT=dir [CACHE=.triton_cache_s] [LIMIT=500] [SHORT=1] bash benchmarks/ablations/split_finish_call.sh
CACHE=${CACHE:-.triton_cache_s} source "$(dirname "$0")/call_setup.sh"
d=tests/sample/test_deep.py g=tests/gpu/test_sampler_gpu.py n=tests/sample/test_nucleus.py
deep=("$d -k bitmask" "$d -k kept_winners and 16" "$d -k kept_winners and not 16"
      "$d -k not kept_winners and not bitmask" "$g -k deep_nucleus_full_vocabulary and 16")
split=("$n tests/sample/test_search.py" "$g -k split_nucleus" "$g -k large_batches"
       "$g -k benchmark_settings and top_p and dtype0" "$g -k benchmark_settings and top_p and dtype1")
short=${SHORT:-0} small=(abl10/main abl10/gap abl10/beat abl10/both abl10/race) rounds=2
[[ $short == 1 ]] && deep=() split=("${split[@]:0:4}") small=(abl10/main abl10/gap abl10/race) rounds=1
TREE=$R/abl10/race test_shards "${LIMIT:-500}" "${deep[@]}" "${split[@]}"
modes=top_p_warm,top_p,top_k_top_p,greedy
OUT=$OUT/ab ROUNDS=2 WARM=0 timeout 200 bash benchmarks/ab_trees.sh "${small[@]}" -- \
  --vocab 152064 --dtype float32 --modes $modes --batches 1,32 --k 20 --no-step --pdl \
  > $OUT/ab.txt 2>&1
echo "ab_trees 152064 small rc=$? ${SECONDS}s" >> $log
OUT=$OUT/ab_large ROUNDS=2 WARM=0 timeout 150 bash benchmarks/ab_trees.sh abl10/both abl10/race \
  -- --vocab 152064 --dtype float32 --modes top_p,top_k_top_p,greedy,min_p,logprobs_20 \
  --batches 256,1024 --k 20 --no-step --pdl > $OUT/ab_large.txt 2>&1
echo "ab_trees 152064 large rc=$? ${SECONDS}s" >> $log
if [[ $short != 1 ]]; then
  OUT=$OUT/ab_bf16 ROUNDS=2 WARM=0 timeout 100 bash benchmarks/ab_trees.sh abl10/main abl10/both \
    -- --vocab 128256 --dtype bfloat16 --modes $modes --batches 1,32 --k 20 --no-step --pdl \
    > $OUT/ab_bf16.txt 2>&1
  echo "ab_trees 128256 rc=$? ${SECONDS}s" >> $log
fi
for r in $(seq 1 $rounds); do
  order="main gap beat both"; [[ $r == 2 ]] && order="both beat gap main"
  [[ $short == 1 ]] && order="main gap race"
  for t in $order; do warm_rows $R/abl10/$t $t 152064 float32 9-300 _$r; done
done
close_call
tail -9 $OUT/ab.txt; tail -11 $OUT/ab_large.txt; tail -9 $OUT/ab_bf16.txt 2>/dev/null
for f in $OUT/warm_*.txt; do echo "== $f"; tail -1 $f; done
