#!/usr/bin/env bash
# GPU call: the deep nucleus draw timed (kernel times) and tested at full vocabulary.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
SECONDS=0
t() { echo "$1 ${SECONDS}s" >> $OUT/times.txt; }
git log --oneline -1 > $OUT/times.txt 2>&1
A="--modes top_p_warm,top_p,top_k_top_p,greedy --batches 1,32 --k 20 --no-step"
(timeout -k 5 240 python3 -m benchmarks.profile_kernels --vocab 128256 --dtype bfloat16 $A > /dev/null 2>&1; t c128
 timeout -k 5 60 python3 -m benchmarks.profile_kernels --vocab 128256 --dtype bfloat16 $A > $OUT/kernels_128256.txt 2>&1; t k128) &
(timeout -k 5 240 python3 -m benchmarks.profile_kernels --vocab 152064 --dtype float32 $A > /dev/null 2>&1; t c152
 timeout -k 5 60 python3 -m benchmarks.profile_kernels --vocab 152064 --dtype float32 $A > $OUT/kernels_152064.txt 2>&1; t k152) &
(timeout -k 5 300 python3 -m pytest -q -x -p no:cacheprovider "tests/gpu/test_sampler_gpu.py::test_deep_nucleus_full_vocabulary[16]" > $OUT/test_deep_16.txt 2>&1; t test16) &
(timeout -k 5 300 python3 -m pytest -q -x -p no:cacheprovider "tests/gpu/test_sampler_gpu.py::test_deep_nucleus_full_vocabulary[1]" > $OUT/test_deep_1.txt 2>&1; t test1) &
wait
