#!/usr/bin/env bash
# One device call: the deep draw's first-round pivots spaced by the pool's density (tree
# abl6/dens, `deep_pivots_by_density.patch`) against the code. Two alternating rounds of
# `profile_kernels` at 152064 fp32 (top-p 0.9 at temperature 1, where rows take the deep draw,
# and top-p, top-k + top-p and greedy for control, batches 1 and 32), then
# `benchmarks.warm_rows --seeds 9-300` on each tree. Carry [".triton_cache_d", "abl6"], built as
# benchmarks/ablations/README.md says.
# Usage: OUT=dir bash benchmarks/ablations/deep_pivots_call.sh
CACHE=.triton_cache_d source "$(dirname "$0")/call_setup.sh"
A="--vocab 152064 --dtype float32 --modes top_p_warm,top_p,top_k_top_p,greedy --batches 1,32 --k 20 --no-step"
for r in 1 2; do for t in base dens; do
  d=$R; [[ $t != base ]] && d=$R/abl6/$t
  (cd $d && timeout 90 python3 -m benchmarks.profile_kernels $A --out $OUT/${t}_$r.json \
     > $OUT/${t}_$r.txt 2>&1)
  echo "$t $r rc=$? ${SECONDS}s" >> $log
done; done
for t in base dens; do
  d=$R; [[ $t != base ]] && d=$R/abl6/$t
  (cd $d && timeout 120 python3 -m benchmarks.warm_rows --seeds 9-300 --out $OUT/warm_$t.json \
     > $OUT/warm_$t.txt 2>&1)
  echo "warm $t rc=$? ${SECONDS}s" >> $log
done
tar czf $OUT/0all.tgz -C $OUT --exclude=0all.tgz .
cat $log
for t in base dens; do echo "== $t"; grep -h "_kernel\|paths" $OUT/${t}_2.txt | head -40; tail -2 $OUT/warm_$t.txt; done
