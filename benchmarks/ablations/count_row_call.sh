#!/usr/bin/env bash
# One device call: `resolve.count_row` four tiles a step (tree abl7/cnt, the working tree's
# change) against the code (abl7/base). `benchmarks/ab_trees.sh`, two rounds in ABBA order, of
# `profile_kernels` at 152064 fp32 (top_p_warm and five control modes at batches 1, 32, 256 and
# 1024: the small-batch finish, the one-program finish and the capped one), then
# `benchmarks.warm_rows` on each tree at the three shapes, and the compiled tests of the
# winner's check (tests/sample/test_deep.py's kept winners, the GPU file's kept winners and
# logprob cases) on the working tree alongside. Carry [".triton_cache_p", "abl7"], built as
# benchmarks/ablations/README.md says. NEW names the tree under abl7 to time against base
# (default cnt); TESTS, the test shards (pytest arguments, one process each, separated by ";").
# Usage: OUT=dir [CACHE=.triton_cache_p] [NEW=cnt] [TESTS="..."] bash benchmarks/ablations/count_row_call.sh
CACHE=${CACHE:-.triton_cache_p} source "$(dirname "$0")/call_setup.sh"
new=${NEW:-cnt}
tests=${TESTS:-tests/sample/test_deep.py::test_kept_winners_of_deep_nuclei_full_vocabulary;tests/gpu/test_sampler_gpu.py::test_kept_winners_of_deep_nuclei_full_vocabulary;tests/gpu/test_sampler_gpu.py::test_temperature_logprobs_full_vocabulary}
IFS=';' read -ra shards <<< "$tests"
test_shards 400 "${shards[@]}"
OUT=$OUT/ab ROUNDS=2 WARM=0 timeout 300 bash benchmarks/ab_trees.sh abl7/base abl7/$new -- \
  --vocab 152064 --dtype float32 --modes top_p_warm,top_p,top_k_top_p,greedy,logprobs_20,min_p \
  --batches 1,32,256,1024 --k 20 --no-step --pdl > $OUT/ab.txt 2>&1
echo "ab_trees rc=$? ${SECONDS}s" >> $log
for r in 1 2; do
  order="base $new"; [[ $r == 2 ]] && order="$new base"
  for t in $order; do warm_rows $R/abl7/$t $t 152064 float32 9-300 _$r; done
done
for t in base $new; do
  warm_rows $R/abl7/$t $t 128256 bfloat16 9-200
  warm_rows $R/abl7/$t $t 32000 bfloat16 9-200
done
close_call
cat $OUT/ab.txt | tail -30
for t in base $new; do echo "== $t"; tail -2 $OUT/warm_${t}_152064_2.txt; tail -2 $OUT/warm_${t}_128256.txt; \
  tail -2 $OUT/warm_${t}_32000.txt; done
