#!/usr/bin/env bash
# One device call: the deep draw's first round weighed by all of a row's finish programs
# (`graphshard/sample/deep_split.py`; tree abl8/split) against the code before it (abl8/base).
# `benchmarks/ab_trees.sh`, two rounds in ABBA order, of `profile_kernels` at 152064 fp32
# (top_p_warm and four control modes at batches 1, 32 and 256: the small-batch finish, which
# changed, and the one-program finish), then `benchmarks.warm_rows` on each tree at the three
# shapes, and the compiled tests of the changed paths on the working tree alongside (TESTS:
# pytest arguments, one process each, separated by ";"). Carry [CACHE, "abl8"], built as
# benchmarks/results/dec06_c/README.md says.
# Usage: OUT=dir [CACHE=.triton_cache_r] [TESTS="..."] bash benchmarks/ablations/deep_split_call.sh
CACHE=${CACHE:-.triton_cache_r} source "$(dirname "$0")/call_setup.sh"
gpu=tests/gpu/test_sampler_gpu.py
tests=${TESTS:-tests/sample/test_deep.py;$gpu -k deep_nucleus_full or kept_winners;$gpu -k split_nucleus or benchmark_settings;tests/sample/test_nucleus.py;$gpu -k adversarial or min_p_rows;$gpu -k temperature_logprobs or large_batches}
IFS=';' read -ra shards <<< "$tests"
test_shards 420 "${shards[@]}"
OUT=$OUT/ab ROUNDS=2 WARM=0 timeout 240 bash benchmarks/ab_trees.sh abl8/base abl8/split -- \
  --vocab 152064 --dtype float32 --modes top_p_warm,top_p,top_k_top_p,greedy,logprobs_20 \
  --batches 1,32,256 --k 20 --no-step --pdl > $OUT/ab.txt 2>&1
echo "ab_trees rc=$? ${SECONDS}s" >> $log
for r in 1 2; do
  order="base split"; [[ $r == 2 ]] && order="split base"
  for t in $order; do warm_rows $R/abl8/$t $t 152064 float32 9-300 _$r; done
done
for t in base split; do
  warm_rows $R/abl8/$t $t 128256 bfloat16 9-150
  warm_rows $R/abl8/$t $t 32000 bfloat16 9-150
done
close_call
tail -30 $OUT/ab.txt
for t in base split; do echo "== $t"; tail -2 $OUT/warm_${t}_152064_2.txt; tail -2 $OUT/warm_${t}_128256.txt; \
  tail -2 $OUT/warm_${t}_32000.txt; done
