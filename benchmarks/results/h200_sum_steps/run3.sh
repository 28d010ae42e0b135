#!/usr/bin/env bash
# Third GPU call: only a logprob row's pass (the raw logits' sum, no race, no scores' sum) in
# steps of four tiles, unrolled (abl/narrow = the working tree), against the commit before it
# (abl/base). Phase 1: both trees' kernels compile while the working tree's GPU tests of the
# scan run; phase 2: kernel times, two rounds in ABBA order, alone.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export TRITON_CACHE_DIR=$(mktemp -d)
SECONDS=0
log=$OUT/times.txt
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $log 2>&1
ARGS="--modes greedy,temperature,top_k_top_p,top_p,logprobs_5,logprobs_20 --batches 1,256,1024 --k 20 --no-step"
for t in base narrow; do
  (cd abl/$t && timeout -k 5 330 python3 -m benchmarks.profile_kernels $ARGS --modes greedy \
     > $OUT/warm_$t.txt 2>&1; echo "warm $t rc=$? ${SECONDS}s" >> $log) &
done
(timeout -k 5 380 python3 -m pytest -q -rs -p no:cacheprovider tests/gpu/test_sampler_gpu.py \
   -k "chunks_per_program or temperature_logprobs or large_batches" \
   > $OUT/t_scan.txt 2>&1; echo "tests rc=$? ${SECONDS}s" >> $log) &
wait
echo "phase 1 done ${SECONDS}s" >> $log
OUT=$OUT ROUNDS=2 timeout -k 5 $((560 - SECONDS)) bash benchmarks/ab_trees.sh abl/base abl/narrow -- $ARGS \
  > $OUT/ab.txt 2>&1
echo "ab rc=$? ${SECONDS}s" >> $log
