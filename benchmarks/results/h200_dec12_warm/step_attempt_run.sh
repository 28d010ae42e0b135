#!/usr/bin/env bash
# GPU call: the tp = 1 step table of top-p at temperature 1 against the PyTorch sort sampler.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
R=/tmp/r; rm -rf $R; mkdir -p $R; trap 'tar -czf $OUT/results.tgz -C /tmp r' EXIT
SECONDS=0
t() { echo "$1 ${SECONDS}s" >> $R/times.txt; }
git log --oneline -1 > $R/head.txt 2>&1; git status --short >> $R/head.txt 2>&1
B=1,32,256
(timeout -k 5 330 python3 -m benchmarks.bench_sampling --shapes 128256:bfloat16 --modes top_p_warm --batches $B --iters 1 --out /tmp/w1.json > $R/compile_128256.txt 2>&1; t c128) &
p1=$!
(timeout -k 5 330 python3 -m benchmarks.bench_sampling --shapes 152064:float32 --modes top_p_warm --batches $B --iters 1 --out /tmp/w2.json > $R/compile_152064.txt 2>&1; t c152) &
p2=$!
wait $p1 $p2
t phase1
timeout -k 5 100 python3 -m benchmarks.bench_sampling --shapes 128256:bfloat16 --modes top_p_warm,top_p,top_k_top_p --batches $B --out $R/sampling_128256.json > $R/sampling_128256.log 2>&1; t s128
timeout -k 5 100 python3 -m benchmarks.bench_sampling --shapes 152064:float32 --modes top_p_warm,top_p,top_k_top_p --batches $B --out $R/sampling_152064.json > $R/sampling_152064.log 2>&1; t s152
