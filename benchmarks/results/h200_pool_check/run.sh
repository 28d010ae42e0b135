#!/usr/bin/env bash
# One GPU call on the working tree (the pool check of a top-p row's unfiltered winner): the
# deep and split nucleus GPU tests beside the compiles of the V = 32000 and 128256 bf16 step
# tables (each engine's capture and each batch's sampler-alone call in processes of their own);
# then both tables, alone on the GPU.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export TRITON_CACHE_DIR=$(mktemp -d)
SECONDS=0
log=$OUT/times.txt
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $log 2>&1
gpu_test() {  # name, pytest args...
  local name=$1; shift
  (timeout -k 5 470 python3 -m pytest -q -rs -p no:cacheprovider "$@" > $OUT/t_$name.txt 2>&1
   echo "test $name rc=$? ${SECONDS}s" >> $log) &
}
warm_sampler() {  # vocab, batch
  (timeout -k 5 470 python3 -c "
import torch
from benchmarks.sampling_modes import MAX_LOGPROBS, MODES, make_logits, sampler_call
x = make_logits($2, $1, torch.bfloat16, 'cuda')
sampler_call(x, $1, MODES['greedy'], MAX_LOGPROBS, torch.device('cuda', 0))[0]()
torch.cuda.synchronize()" > /dev/null 2>&1
   echo "warm sampler $1 b=$2 rc=$? ${SECONDS}s" >> $log) &
}
for v in 32000 128256; do
  (timeout -k 5 470 python3 -m benchmarks.bench_sampling --compile-only --shapes $v:bfloat16 \
     --modes greedy --batches 1,8,32 > /dev/null 2>&1
   echo "warm engine $v rc=$? ${SECONDS}s" >> $log) &
  for b in 1 8 32; do warm_sampler $v $b; done
done
gpu_test deep tests/gpu/test_sampler_gpu.py -k "deep_nucleus or split_nucleus"
gpu_test deep_cpu_suite tests/sample/test_deep.py tests/sample/test_nucleus.py
wait
echo "phase 1 done ${SECONDS}s" >> $log
timeout -k 5 $((588 - SECONDS)) python3 -m benchmarks.bench_sampling \
  --shapes 128256:bfloat16,32000:bfloat16 --modes greedy,top_k_top_p,top_p --batches 1,8,32 \
  --out $OUT/sampling.json > $OUT/sampling.log 2>&1
echo "sampling rc=$? ${SECONDS}s" >> $log
