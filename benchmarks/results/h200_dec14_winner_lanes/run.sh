#!/usr/bin/env bash
# GPU call: main against scan-winner (the scan draws a top-p row's unfiltered winner) and against
# deep.WEIGH_LANES 64; sampler kernel times at batches 1 and 32, and 32000 bf16 with a bitmask at
# batches 1 and 256.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
SECONDS=0
t() { echo "$1 ${SECONDS}s" >> $OUT/times.txt; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $OUT/times.txt 2>&1
TREES="main winner l64"
A="--modes greedy,temperature,top_p,top_p_warm,top_k_top_p --batches 1,32 --k 20 --no-step"
B="--vocab 32000 --dtype bfloat16 --bitmask --modes greedy,top_p,top_p_warm,top_k_top_p,logprobs_5 --batches 1,256 --k 20 --no-step"
for tree in $TREES; do
  for shape in "128256 bfloat16" "152064 float32"; do
    set -- $shape
    (cd abl/$tree && timeout -k 5 280 python3 -m benchmarks.profile_kernels --vocab $1 --dtype $2 $A > /dev/null 2>&1; t "compile $tree $1") &
  done
  (cd abl/$tree && timeout -k 5 280 python3 -m benchmarks.profile_kernels $B > /dev/null 2>&1; t "compile $tree 32000") &
done
(cd abl/l64 && timeout -k 5 280 python3 -m pytest -q -x -p no:cacheprovider "tests/gpu/test_sampler_gpu.py::test_deep_nucleus_full_vocabulary[1]" > $OUT/test_deep_l64.txt 2>&1; t "test l64") &
wait
for shape in "128256 bfloat16" "152064 float32"; do
  set -- $shape
  OUT=$OUT/ab_$1 ROUNDS=1 timeout -k 5 120 bash benchmarks/ab_trees.sh $(for t in $TREES; do echo abl/$t; done) -- --vocab $1 --dtype $2 $A > $OUT/ab_$1.txt 2>&1
  t "timed $1"
done
OUT=$OUT/ab_32000 ROUNDS=1 timeout -k 5 120 bash benchmarks/ab_trees.sh $(for t in $TREES; do echo abl/$t; done) -- $B > $OUT/ab_32000.txt 2>&1
t "timed 32000"
