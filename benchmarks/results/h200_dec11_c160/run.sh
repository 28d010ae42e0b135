#!/usr/bin/env bash
# GPU run 3: chunk_top_160.patch against HEAD at V = 32000 bf16, batches 1 and 32 (kernel times).
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
SECONDS=0
ROOT=$PWD
mk() { rm -rf /tmp/ab/$1; mkdir -p /tmp/ab/$1; cp -r graphshard benchmarks tests configs pyproject.toml /tmp/ab/$1/; }
mk base; mk c160
(cd /tmp/ab/c160 && patch -s -p1 < $ROOT/benchmarks/ablations/chunk_top_160.patch) || echo "patch failed" >> $OUT/times.txt
A=(--vocab 32000 --dtype bfloat16 --modes top_p,top_p_cold,top_k_top_p,logprobs_5,min_p,greedy --batches 1,32 --k 20 --no-step)
(cd /tmp/ab/c160 && timeout -k 5 250 python3 -m benchmarks.floor_audit --vocab 32000 --dtype bfloat16 --mode top_p --batch 32 --calls 3 > $OUT/audit_32000_c160.txt 2>&1) &
OUT=$OUT ROUNDS=2 timeout -k 5 330 bash benchmarks/ab_trees.sh /tmp/ab/base /tmp/ab/c160 -- "${A[@]}" > $OUT/ab.txt 2>&1
echo "ab done ${SECONDS}s" >> $OUT/times.txt
wait
