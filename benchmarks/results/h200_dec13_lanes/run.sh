#!/usr/bin/env bash
# GPU call: the finish's spills (deep draw weighing lanes) against be29245, kernel times of four
# trees, and the deep-draw GPU test on the 128-lane, four-tile tree.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
SECONDS=0
t() { echo "$1 ${SECONDS}s" >> $OUT/times.txt; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $OUT/times.txt 2>&1
TREES="base head l128 l128x4"
A="--modes top_p_warm,top_p,top_k_top_p,greedy --batches 1,32 --k 20 --no-step"
for tree in $TREES; do
  for shape in "128256 bfloat16" "152064 float32"; do
    set -- $shape
    (cd abl/$tree && timeout -k 5 250 python3 -m benchmarks.profile_kernels --vocab $1 --dtype $2 $A > /dev/null 2>&1; t "compile $tree $1") &
  done
done
for p in 1 16; do
  (cd abl/l128x4 && timeout -k 5 250 python3 -m pytest -q -x -p no:cacheprovider "tests/gpu/test_sampler_gpu.py::test_deep_nucleus_full_vocabulary[$p]" > $OUT/test_deep_$p.txt 2>&1; t "test $p") &
done
wait
for shape in "128256 bfloat16" "152064 float32"; do
  set -- $shape
  OUT=$OUT/ab_$1 ROUNDS=1 timeout -k 5 150 bash benchmarks/ab_trees.sh $(for t in $TREES; do echo abl/$t; done) -- --vocab $1 --dtype $2 $A > $OUT/ab_$1.txt 2>&1
  t "timed $1"
done
