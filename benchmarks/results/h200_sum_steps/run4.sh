#!/usr/bin/env bash
# Fourth GPU call (kernel times only, no tests): the finish of a large batch (one program per
# row) with 4 warps instead of 8 (abl/w4), against the committed code (abl/base). The trees'
# scans are the same source, so the second tree's warm-up compiles only its finish.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export TRITON_CACHE_DIR=$(mktemp -d)
SECONDS=0
log=$OUT/times.txt
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $log 2>&1
ARGS="--modes greedy,top_k_top_p,logprobs_5,logprobs_20 --batches 256,1024 --k 20 --no-step"
for t in base w4; do
  (cd abl/$t && timeout -k 5 250 python3 -m benchmarks.profile_kernels $ARGS --modes greedy \
     > $OUT/warm_$t.txt 2>&1; echo "warm $t rc=$? ${SECONDS}s" >> $log)
done
OUT=$OUT ROUNDS=2 timeout -k 5 $((370 - SECONDS)) bash benchmarks/ab_trees.sh abl/base abl/w4 -- $ARGS \
  > $OUT/ab.txt 2>&1
echo "ab rc=$? ${SECONDS}s" >> $log
