#!/usr/bin/env bash
# One GPU call on the working tree: the sampler's GPU tests and the V = 32000 and 128256 bf16
# step tables. Phase 1 runs the six test selections and the two shapes' `--compile-only` runs at
# once (CPU-bound compiles into one Triton cache); phase 2, alone on the GPU once phase 1 is
# done, times both shapes, which then find their kernels compiled.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export TRITON_CACHE_DIR=$(mktemp -d)
SECONDS=0
times=$OUT/times.txt
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $times 2>&1
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)' >> $times
SHAPES=32000:bfloat16,128256:bfloat16
MODES=greedy,top_k_top_p,top_p
BATCHES=1,8,32
gpu_test() {  # name, pytest args...
  local name=$1; shift
  (timeout -k 5 ${LIMIT:-330} python3 -m pytest -q -rs -p no:cacheprovider "$@" > $OUT/tests_$name.txt 2>&1
   echo "test $name rc=$? ${SECONDS}s" >> $times) &
}
warm() {  # vocab:dtype
  (timeout -k 5 330 python3 -m benchmarks.bench_sampling --compile-only --shapes $1 --modes greedy \
     --batches $BATCHES > $OUT/compile_${1%%:*}.txt 2>&1
   echo "compile $1 rc=$? ${SECONDS}s" >> $times) &
}
warm 32000:bfloat16
warm 128256:bfloat16
gpu_test rng tests/sample/test_sampler.py -k "gumbel_close or rng_device or random_sampling_matches or sampling_frequencies or draws_independent"
gpu_test deep tests/gpu/test_sampler_gpu.py -k "deep_nucleus or split_nucleus"
gpu_test deep_cpu_suite tests/sample/test_deep.py tests/sample/test_nucleus.py
gpu_test large tests/gpu/test_sampler_gpu.py -k "large_batches or temperature_logprobs or min_p_rows"
gpu_test settings tests/gpu/test_sampler_gpu.py -k "benchmark_settings"
gpu_test adversarial tests/gpu/test_sampler_gpu.py -k "adversarial_rows"
wait
echo "phase 1 done ${SECONDS}s" >> $times
timeout -k 5 $((590 - SECONDS)) python3 -m benchmarks.bench_sampling --shapes $SHAPES --modes $MODES \
  --batches $BATCHES --out $OUT/sampling.json > $OUT/sampling.log 2>&1
echo "sampling rc=$? ${SECONDS}s" >> $times
