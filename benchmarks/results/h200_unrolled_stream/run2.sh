#!/usr/bin/env bash
# Second GPU call: three trees (abl/base = the commit before, abl/noz = it without the stream's
# constant Gumbel reductions of rows that do not draw, abl/new = the working tree: that and
# the unrolled stream of logprob rows at large batch). Phase 1 compiles all three at once;
# phase 2 runs the working tree's GPU tests of two-chunk programs (kernels cached by then);
# phase 3 times the three trees alone, one round.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export TRITON_CACHE_DIR=$(mktemp -d)
SECONDS=0
log=$OUT/times.txt
ARGS="--modes greedy,temperature,top_k_top_p,top_p,logprobs_5,logprobs_20 --batches 1,256,1024 --k 20 --no-step"
for t in base noz new; do
  (cd abl/$t && timeout -k 5 400 python3 -m benchmarks.profile_kernels $ARGS --modes greedy \
     > $OUT/warm_$t.txt 2>&1; echo "warm $t rc=$? ${SECONDS}s" >> $log) &
done
wait
echo "phase 1 done ${SECONDS}s" >> $log
timeout -k 5 150 python3 -m pytest -q -rs -p no:cacheprovider tests/gpu/test_sampler_gpu.py \
  -k "(chunks_per_program and dtype0) or large_batches or temperature_logprobs" > $OUT/t_scan.txt 2>&1
echo "tests rc=$? ${SECONDS}s" >> $log
OUT=$OUT ROUNDS=1 timeout -k 5 $((590 - SECONDS)) bash benchmarks/ab_trees.sh abl/base abl/noz abl/new \
  -- $ARGS > $OUT/ab.txt 2>&1
echo "ab rc=$? ${SECONDS}s" >> $log
