#!/usr/bin/env bash
# GPU run 2: the split draw's GPU tests and the sampler's other full-vocabulary tests while the
# step benchmark's three shapes compile, then the step table (timed alone).
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv > $R/smi.txt 2>&1
SECONDS=0
T=${T_PAR:-370}
P=(-v -rs -p no:cacheprovider tests/gpu/test_sampler_gpu.py)
timeout -k 5 $T python3 -m pytest "${P[@]}" -k "split_nucleus or benchmark_settings or large_batches" > $R/t1.txt 2>&1 &
timeout -k 5 $T python3 -m pytest "${P[@]}" -k "not (split_nucleus or benchmark_settings or large_batches)" > $R/t2.txt 2>&1 &
M=greedy,top_k_top_p,top_p
for s in 152064:float32 32000:bfloat16 128256:bfloat16; do
  timeout -k 5 $T python3 -m benchmarks.bench_sampling --shapes $s --modes $M --batches 1,8,32 --iters 3 --out /tmp/warm_${s%%:*}.json > $R/warm_${s%%:*}.log 2>&1 &
done
wait
echo "parallel phase done ${SECONDS}s" >> $R/times.txt
timeout -k 5 ${T_STEP:-180} python3 -m benchmarks.bench_sampling --shapes 152064:float32,32000:bfloat16,128256:bfloat16 --modes $M --batches 1,8,32 --out $R/sampling.json > $R/sampling.log 2>&1
echo "step table done ${SECONDS}s" >> $R/times.txt
