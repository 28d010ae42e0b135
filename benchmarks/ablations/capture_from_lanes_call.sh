#!/usr/bin/env bash
# One device call: the trees DIR/NAME (DIR default abl4, NAMES default "reg3 reg2": the
# capture from lanes, benchmarks/ablations/README.md) against the code, three alternating rounds of
# `profile_kernels` at 152064 fp32 (logprobs 5 and 20, greedy and top-k + top-p for control,
# batches 256 and 1024), then the first tree's scan counters at logprobs 20, batch 256. Carry
# [".triton_cache_g5", "abl4"], built as benchmarks/ablations/README.md says ("Left for the
# next calls").
# Usage: OUT=dir [CACHE=.triton_cache_g5] [DIR=abl4] [NAMES="reg3 reg2"] [ROUNDS=3]
#        [COUNTERS=1] bash benchmarks/ablations/capture_from_lanes_call.sh
CACHE=${CACHE:-.triton_cache_g5} source "$(dirname "$0")/call_setup.sh"
names=(${NAMES:-reg3 reg2})
A="--vocab 152064 --dtype float32 --modes greedy,logprobs_5,logprobs_20,top_k_top_p --batches 256,1024 --k 20 --no-step"
for r in $(seq ${ROUNDS:-3}); do for t in base "${names[@]}"; do
  d=$R; [[ $t != base ]] && d=$R/${DIR:-abl4}/$t
  (cd $d && timeout 60 python3 -m benchmarks.profile_kernels $A --out $OUT/${t}_$r.json \
     > $OUT/${t}_$r.txt 2>&1)
  echo "$t $r rc=$? ${SECONDS}s" >> $log
done; done
if [[ ${COUNTERS:-1} == 1 ]]; then
  (cd $R/${DIR:-abl4}/${names[0]} && OUT=$OUT/ctr timeout 100 bash benchmarks/counters.sh \
     logprobs_20:256 > $OUT/counters_${names[0]}.txt 2>&1)
  echo "counters rc=$? ${SECONDS}s" >> $log
fi
tar czf $OUT/0all.tgz -C $OUT --exclude=0all.tgz .
cat $log
for t in base "${names[@]}"; do echo "== $t"; grep -h "_kernel" $OUT/${t}_${ROUNDS:-3}.txt; done
if [[ ${COUNTERS:-1} == 1 ]]; then grep -v "^\s*\[" $OUT/counters_${names[0]}.txt; fi
