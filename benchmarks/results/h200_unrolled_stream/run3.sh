#!/usr/bin/env bash
# Third GPU call: more GPU tests of the working tree (the unrolled logprob stream and the
# dropped constant Gumbel reductions), three selections in parallel processes.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export TRITON_CACHE_DIR=$(mktemp -d)
SECONDS=0
log=$OUT/times.txt
gpu_test() {  # name, -k expression
  (timeout -k 5 290 python3 -m pytest -q -rs -p no:cacheprovider tests/gpu/test_sampler_gpu.py \
     -k "$2" > $OUT/t_$1.txt 2>&1; echo "test $1 rc=$? ${SECONDS}s" >> $log) &
}
gpu_test settings "benchmark_settings and dtype0"
gpu_test adversarial "adversarial or min_p_rows"
gpu_test nucleus "deep_nucleus or split_nucleus or kept_winners"
wait
