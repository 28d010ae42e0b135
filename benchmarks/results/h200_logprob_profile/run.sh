#!/usr/bin/env bash
# One GPU call: Nsight Compute on the scan and the finish of greedy + logprobs rows against
# greedy rows (V = 152064 fp32, layout K = 20), then the kernel times of the same modes.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export TRITON_CACHE_DIR=$(mktemp -d)
SECONDS=0
log=$OUT/times.txt
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $log 2>&1
python3 -m benchmarks.call_sampler --mode logprobs_5 --batch 1024 --calls 2 > $OUT/warm.txt 2>&1
echo "warm rc=$? ${SECONDS}s" >> $log
OUT=$OUT/scan timeout -k 5 240 bash benchmarks/counters.sh logprobs_5:1024 greedy:1024 logprobs_5:256 \
  > $OUT/scan.txt 2>&1
echo "scan counters rc=$? ${SECONDS}s" >> $log
KERNEL=_finish_kernel OUT=$OUT/finish timeout -k 5 150 bash benchmarks/counters.sh logprobs_5:1024 \
  greedy:1024 > $OUT/finish.txt 2>&1
echo "finish counters rc=$? ${SECONDS}s" >> $log
timeout -k 5 $((585 - SECONDS)) python3 -m benchmarks.profile_kernels --modes greedy,logprobs_5,logprobs_20 \
  --batches 256,1024 --k 20 --no-step --out $OUT/kernels.json > $OUT/kernels.txt 2>&1
echo "kernels rc=$? ${SECONDS}s" >> $log
