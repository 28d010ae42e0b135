#!/usr/bin/env bash
# GPU call: the GPU tests of the changed sampler paths on the working tree, five selections at once.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
SECONDS=0
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $OUT/times.txt 2>&1
gpu_test() {  # name, pytest args...
  local name=$1; shift
  (timeout -k 5 ${LIMIT:-540} python3 -m pytest -q -rs -p no:cacheprovider "$@" > $OUT/t_$name.txt 2>&1
   echo "test $name rc=$? ${SECONDS}s" >> $OUT/times.txt) &
}
gpu_test rng tests/sample/test_sampler.py -k "gumbel_close or rng_device or random_sampling_matches or sampling_frequencies or draws_independent"
gpu_test deep tests/gpu/test_sampler_gpu.py -k "deep_nucleus or split_nucleus"
gpu_test deep_cpu_suite tests/sample/test_deep.py tests/sample/test_nucleus.py
gpu_test large tests/gpu/test_sampler_gpu.py -k "large_batches or temperature_logprobs or min_p_rows"
gpu_test settings tests/gpu/test_sampler_gpu.py -k "benchmark_settings"
gpu_test adversarial tests/gpu/test_sampler_gpu.py -k "adversarial_rows"
wait
