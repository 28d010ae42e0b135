#!/usr/bin/env bash
# GPU call: the top-p cliff at temperature 1 (kernel times, floor audit), the refactored settings
# test, the mixed workload at tp = 1.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
R=/tmp/r; rm -rf $R; mkdir -p $R; trap 'tar -czf $OUT/results.tgz -C /tmp r' EXIT
SECONDS=0
t() { echo "$1 ${SECONDS}s" >> $R/times.txt; }
git log --oneline -1 > $R/head.txt 2>&1; git status --short >> $R/head.txt 2>&1
nvidia-smi > $R/nvidia-smi.txt 2>&1
M=top_p_warm,top_p,top_k_top_p,greedy
(timeout -k 5 300 python3 -m benchmarks.profile_kernels --vocab 128256 --dtype bfloat16 --modes $M --batches 1,32 --k 20 --no-step > $R/compile_128256.txt 2>&1; t c128) &
p1=$!
(timeout -k 5 300 python3 -m benchmarks.profile_kernels --vocab 152064 --dtype float32 --modes $M --batches 1,32 --k 20 --no-step > $R/compile_152064.txt 2>&1; t c152) &
p2=$!
(timeout -k 5 300 python3 -m benchmarks.floor_audit --vocab 128256 --dtype bfloat16 --mode top_p_warm --batch 32 --calls 3 > $R/audit_128256_warm.txt 2>&1; t audit) &
p3=$!
(timeout -k 5 300 python3 -m pytest -q -x -p no:cacheprovider "tests/gpu/test_sampler_gpu.py::test_benchmark_settings_settle_from_candidates[top_p_cold-dtype0]" > $R/test_settings.txt 2>&1; t test) &
p4=$!
wait $p1 $p2 $p3 $p4
t phase1
timeout -k 5 80 python3 -m benchmarks.profile_kernels --vocab 128256 --dtype bfloat16 --modes $M --batches 1,32 --k 20 --no-step --out $R/kernels_128256.json > $R/kernels_128256.txt 2>&1; t k128
timeout -k 5 80 python3 -m benchmarks.profile_kernels --vocab 152064 --dtype float32 --modes $M --batches 1,32 --k 20 --no-step --out $R/kernels_152064.json > $R/kernels_152064.txt 2>&1; t k152
left=$((560 - SECONDS))
GRAPHSHARD_GPU_TP=1 OUT=$R timeout -k 5 $left python3 -m pytest -q -x -s -p no:cacheprovider "tests/gpu/test_engine_gpu.py::test_mixed_workload_equals_oracle[nccl]" > $R/mixed_tp1.txt 2>&1; t mixed
