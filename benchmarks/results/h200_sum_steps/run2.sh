#!/usr/bin/env bash
# Second GPU call: the scan's passes with a softmax sum taken in steps of tiles, a logprob row's steps unrolled (abl/u2: two
# tiles a step; abl/u4: four) against the commit before them (abl/base). Phase 1: the three
# trees' kernels compile while the working tree's (= abl/u2) GPU tests of the scan run;
# phase 2: kernel times, two rounds in ABBA order, alone.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export TRITON_CACHE_DIR=$(mktemp -d)
SECONDS=0
log=$OUT/times.txt
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $log 2>&1
ARGS="--modes greedy,temperature,top_k_top_p,top_p,logprobs_5,logprobs_20 --batches 1,256,1024 --k 20 --no-step"
for t in base u2 u4; do
  (cd abl/$t && timeout -k 5 330 python3 -m benchmarks.profile_kernels $ARGS --modes greedy \
     > $OUT/warm_$t.txt 2>&1; echo "warm $t rc=$? ${SECONDS}s" >> $log) &
done
(timeout -k 5 330 python3 -m pytest -q -rs -p no:cacheprovider \
   tests/gpu/test_sampler_gpu.py -k "chunks_per_program or temperature_logprobs" \
   > $OUT/t_scan.txt 2>&1; echo "tests rc=$? ${SECONDS}s" >> $log) &
wait
echo "phase 1 done ${SECONDS}s" >> $log
OUT=$OUT ROUNDS=2 timeout -k 5 $((585 - SECONDS)) bash benchmarks/ab_trees.sh abl/base abl/u2 abl/u4 -- $ARGS \
  > $OUT/ab.txt 2>&1
echo "ab rc=$? ${SECONDS}s" >> $log
