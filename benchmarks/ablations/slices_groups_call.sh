#!/usr/bin/env bash
# One device call, from the repository root with carry [".triton_cache_g4", "abl3"] (built as
# benchmarks/ablations/README.md says, "Left for the next calls"): the staging slice A/B
# (trees abl3/old, abl3/s128, abl3/s64, alternating; `step_configs` at batches 1, 8, 32), the
# scan's chunks per program from 256 rows (2, the default, against 4, alternating;
# `profile_kernels` at 152064 fp32), then the logprob scan's counters (`counters.sh`, whose
# per-instruction samples `benchmarks.stall_summary --cubin` names by source line).
# Usage: OUT=dir bash benchmarks/ablations/slices_groups_call.sh
CACHE=.triton_cache_g4 source "$(dirname "$0")/call_setup.sh"
for r in 1 2; do for t in old s128 s64; do
  (cd abl3/$t && timeout 120 python3 -m benchmarks.step_configs --batches 1,8,32 --rounds 4 \
     --out $OUT/ab_${t}_$r.json > $OUT/ab_${t}_$r.txt 2>&1)
  echo "$t $r rc=$? ${SECONDS}s" >> $log
done; done
A="--vocab 152064 --dtype float32 --modes greedy,logprobs_5,logprobs_20,top_k_top_p,top_p --batches 256,1024 --k 20 --no-step"
for r in 1 2; do for g in 2 4; do
  timeout 90 python3 -m benchmarks.profile_kernels $A --splits-per-program $g \
    --out $OUT/g${g}_$r.json > $OUT/g${g}_$r.txt 2>&1
  echo "g$g $r rc=$? ${SECONDS}s" >> $log
done; done
OUT=$OUT/ctr timeout 150 bash benchmarks/counters.sh logprobs_20:256 greedy:256 > $OUT/counters.txt 2>&1
echo "counters rc=$? ${SECONDS}s" >> $log
tar czf $OUT/0all.tgz -C $OUT --exclude=0all.tgz .
cat $log; grep -h "_kernel" $OUT/g*_2.txt; cat $OUT/counters.txt | grep -v "^\s*\[" 
