#!/usr/bin/env bash
# GPU run 1: where the top-p scan's time goes (four trees, one round).
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv > $R/smi.txt 2>&1
mk() { rm -rf /tmp/ab/$1; mkdir -p /tmp/ab/$1; cp -r graphshard benchmarks tests pyproject.toml /tmp/ab/$1/; }
mk new
mk nosum; sed -i 's/sum_s = filtered & (top_p < 1.0) & ~small_k/sum_s = filtered \& (top_p < 0.0)/' /tmp/ab/nosum/graphshard/sample/kernels.py
mk keep; sed -i 's/if (low > float("-inf")) & (need \* 4 <= SMALL_LANES):/if low > float("-inf"):/' /tmp/ab/keep/graphshard/sample/kernels.py
mk c64; sed -i 's/^CHUNK_TOP = 128/CHUNK_TOP = 64/' /tmp/ab/c64/graphshard/sample/workspace.py
for t in nosum keep c64; do diff -r /tmp/ab/new/graphshard /tmp/ab/$t/graphshard; done > $R/trees.txt
SECONDS=0
OUT=$R ROUNDS=1 bash benchmarks/ab_trees.sh /tmp/ab/new /tmp/ab/nosum /tmp/ab/keep /tmp/ab/c64 -- \
  --modes top_p,top_k_top_p,greedy --batches 1,32,1024 --k 20 --no-step > $R/ab.txt 2>&1
echo "ab done ${SECONDS}s" >> $R/times.txt
