#!/usr/bin/env bash
# One device call: a row's whole-row passes in one finish program with more loads in flight
# (`count_row` four tiles a step; `deep.weigh_row` loading the next step before weighing this
# one; `deep.race_and_copy` two tiles a step in the working tree, `two`, and four in abl7/four,
# whose small-batch finish without bitmask support is held to 128 registers) against the code
# (abl7/base). The compiled sampler tests of the working tree run alongside (they compile their
# own variants on other cores, one shard a process): tests/sample/test_deep.py, test_rows.py
# and the deep, split, logprob and adversarial cases of tests/gpu/test_sampler_gpu.py. Then,
# trees alternating, `benchmarks.warm_rows` at the three shapes and two rounds of
# `profile_kernels` (top_p_warm and four control modes at batches 1, 32 and 256, 152064 fp32). Carry [".triton_cache_p",
# "abl7"], built as benchmarks/ablations/README.md says.
# Usage: OUT=dir bash benchmarks/ablations/whole_row_passes_call.sh
CACHE=.triton_cache_p source "$(dirname "$0")/call_setup.sh"
tree() { [[ $1 == two ]] && echo $R || echo $R/abl7/$1; }
test_shards 480 "tests/sample/test_deep.py::test_deep_nucleus_rows_equal_the_reference" \
  "tests/sample/test_deep.py::test_deep_nucleus_with_bitmask_and_logprobs" \
  "tests/sample/test_deep.py::test_kept_winners_of_deep_nuclei_full_vocabulary" \
  "tests/gpu/test_sampler_gpu.py::test_deep_nucleus_full_vocabulary" \
  "tests/gpu/test_sampler_gpu.py::test_kept_winners_of_deep_nuclei_full_vocabulary" \
  "tests/gpu/test_sampler_gpu.py -k split_nucleus or temperature_logprobs" \
  "tests/gpu/test_sampler_gpu.py -k adversarial" "tests/sample/test_rows.py"
for r in 1 2; do
  order="base two four"; [[ $r == 2 ]] && order="four two base"
  for t in $order; do warm_rows $(tree $t) $t 152064 float32 9-300 _$r; done
done
for t in base two four; do
  warm_rows $(tree $t) $t 128256 bfloat16 9-200
  warm_rows $(tree $t) $t 32000 bfloat16 9-200
done
A="--vocab 152064 --dtype float32 --modes top_p_warm,top_p,top_k_top_p,greedy,logprobs_20 --batches 1,32,256 --k 20 --no-step --pdl"
for r in 1 2; do
  order="base two four"; [[ $r == 2 ]] && order="four two base"
  for t in $order; do
    (cd $(tree $t) && timeout 90 python3 -m benchmarks.profile_kernels $A --out $OUT/kern_${t}_$r.json \
       > $OUT/kern_${t}_$r.txt 2>&1)
    echo "kern $t $r rc=$? ${SECONDS}s" >> $log
  done
done
close_call
for t in base two four; do echo "== $t"; tail -2 $OUT/warm_${t}_152064_2.txt; tail -2 $OUT/warm_${t}_128256.txt; \
  tail -2 $OUT/warm_${t}_32000.txt; grep -h "_kernel\|paths" $OUT/kern_${t}_2.txt | head -40; done
