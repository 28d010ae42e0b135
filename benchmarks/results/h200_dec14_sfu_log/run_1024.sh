#!/usr/bin/env bash
# GPU call: the SFU Gumbel (tree `fast`) against main at batch 1024, 152064 fp32: sampler kernel
# times, each tree's profile written as it finishes.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
SECONDS=0
t() { echo "$1 ${SECONDS}s" >> $OUT/times.txt; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $OUT/times.txt 2>&1
A="--vocab 152064 --dtype float32 --batches 1024 --modes greedy,temperature,top_p,top_k_top_p --k 20 --no-step"
for tree in main fast; do
  (cd abl/$tree && timeout -k 5 300 python3 -m benchmarks.profile_kernels $A --modes greedy > /dev/null 2>&1; t "compile $tree") &
done
wait
for tree in main fast main fast; do
  (cd abl/$tree && timeout -k 5 60 python3 -m benchmarks.profile_kernels $A > /tmp/k.txt 2>&1; grep -v paths /tmp/k.txt | sed "s/^/$tree /" >> $OUT/kernels_1024.txt; t "timed $tree")
done
