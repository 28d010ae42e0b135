#!/usr/bin/env bash
# Second GPU call: the five test selections that call 1 cut, each given 480 s, beside the
# compiles of the V = 128256 bf16 step table (the engine's capture, and the sampler-alone calls
# of each batch, whose finish is the variant without bitmask support, in processes of their
# own); then that table, alone on the GPU, with the time left.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export TRITON_CACHE_DIR=$(mktemp -d)
SECONDS=0
log=$OUT/times.txt
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $log 2>&1
gpu_test() {  # name, pytest args...
  local name=$1; shift
  (timeout -k 5 480 python3 -m pytest -q -rs -p no:cacheprovider "$@" > $OUT/t_$name.txt 2>&1
   echo "test $name rc=$? ${SECONDS}s" >> $log) &
}
warm_sampler() {  # batch
  (timeout -k 5 480 python3 -c "
import torch
from benchmarks.sampling_modes import MAX_LOGPROBS, MODES, make_logits, sampler_call
x = make_logits($1, 128256, torch.bfloat16, 'cuda')
sampler_call(x, 128256, MODES['greedy'], MAX_LOGPROBS, torch.device('cuda', 0))[0]()
torch.cuda.synchronize()" > $OUT/w_sampler_$1.txt 2>&1
   echo "warm sampler b=$1 rc=$? ${SECONDS}s" >> $log) &
}
(timeout -k 5 480 python3 -m benchmarks.bench_sampling --compile-only --shapes 128256:bfloat16 \
   --modes greedy --batches 1,8,32 > $OUT/w_engine.txt 2>&1
 echo "warm engine rc=$? ${SECONDS}s" >> $log) &
for b in 1 8 32; do warm_sampler $b; done
gpu_test deep tests/gpu/test_sampler_gpu.py -k "deep_nucleus or split_nucleus"
gpu_test deep_cpu_suite tests/sample/test_deep.py tests/sample/test_nucleus.py
gpu_test large tests/gpu/test_sampler_gpu.py -k "large_batches or temperature_logprobs or min_p_rows"
gpu_test settings tests/gpu/test_sampler_gpu.py -k "benchmark_settings"
gpu_test adversarial tests/gpu/test_sampler_gpu.py -k "adversarial_rows"
wait
echo "phase 1 done ${SECONDS}s" >> $log
left=$((588 - SECONDS))
if [ $left -gt 60 ]; then
  timeout -k 5 $left python3 -m benchmarks.bench_sampling --shapes 128256:bfloat16 \
    --modes greedy,top_k_top_p,top_p --batches 1,8,32 --out $OUT/sampling_128256.json \
    > $OUT/sampling_128256.log 2>&1
  echo "sampling rc=$? ${SECONDS}s" >> $log
fi
