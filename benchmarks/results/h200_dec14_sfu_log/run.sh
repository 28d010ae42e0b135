#!/usr/bin/env bash
# GPU call: the Gumbel value by the SFU's log2 (tree `fast`) against main: sampler kernel times
# (152064 fp32 at batches 1, 32, 1024; 128256 bf16 at 1 and 32) and the sampler GPU tests that
# compare random draws with the float64 reference, on `fast`.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
SECONDS=0
t() { echo "$1 ${SECONDS}s" >> $OUT/times.txt; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $OUT/times.txt 2>&1
TREES="main fast"
M="--modes greedy,temperature,top_p,top_p_warm,top_k_top_p --k 20 --no-step"
A="--vocab 152064 --dtype float32 --batches 1,32,1024 $M"
B="--vocab 128256 --dtype bfloat16 --batches 1,32 $M"
for tree in $TREES; do
  for args in "$A" "$B"; do
    (cd abl/$tree && timeout -k 5 350 python3 -m benchmarks.profile_kernels $args > /dev/null 2>&1; t "compile $tree ${args:8:6}") &
  done
done
mkdir -p /tmp/tests
gpu_test() {  # name, pytest args...
  local name=$1; shift
  (cd abl/fast && timeout -k 5 350 python3 -m pytest -q -rs -p no:cacheprovider "$@" > /tmp/tests/$name.txt 2>&1; t "test $name") &
}
gpu_test rng tests/sample/test_sampler.py -k "gumbel_close or rng_device or random_sampling_matches or sampling_frequencies or draws_independent"
gpu_test settings tests/gpu/test_sampler_gpu.py::test_benchmark_settings_settle_from_candidates
gpu_test deep "tests/gpu/test_sampler_gpu.py::test_deep_nucleus_full_vocabulary[1]"
gpu_test temperature_logprobs tests/gpu/test_sampler_gpu.py::test_temperature_logprobs_full_vocabulary
gpu_test adversarial tests/gpu/test_sampler_gpu.py::test_adversarial_rows_full_vocabulary
gpu_test large tests/gpu/test_sampler_gpu.py::test_large_batches_settle_from_candidates
wait
for f in /tmp/tests/*.txt; do echo "== $f"; tail -n 15 $f; done > $OUT/tests.txt
for args in "$A" "$B"; do
  v=${args:8:6}
  OUT=$OUT/ab_$v ROUNDS=1 timeout -k 5 120 bash benchmarks/ab_trees.sh abl/main abl/fast -- $args > $OUT/ab_$v.txt 2>&1
  t "timed $v"
done
