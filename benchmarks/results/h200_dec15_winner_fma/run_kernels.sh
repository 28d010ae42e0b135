#!/usr/bin/env bash
# GPU call: main against `nw` (main + the FMA Gumbel + the small-batch scan-drawn winner of
# top-p-only rows): sampler kernel times (each profile appended to kernels_<shape>.txt as it
# finishes) and the GPU tests of the changed paths on `nw`.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
SECONDS=0
t() { echo "$1 ${SECONDS}s" >> $OUT/times.txt; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $OUT/times.txt 2>&1
M="--modes greedy,temperature,top_p,top_p_warm,top_k_top_p,logprobs_5 --k 20 --no-step"
A="--vocab 152064 --dtype float32 --batches 1,32 $M"
B="--vocab 128256 --dtype bfloat16 --batches 1,32 $M"
C="--vocab 152064 --dtype float32 --batches 1024 --modes greedy,temperature,top_p,top_k_top_p --k 20 --no-step"
compile() {  # tree, name, args
  (cd abl/$1 && timeout -k 5 330 python3 -m benchmarks.profile_kernels $3 --modes greedy > /tmp/c_$1_$2.txt 2>&1; t "compile $1 $2 rc=$?") &
}
for tree in main nw; do compile $tree A "$A"; compile $tree B "$B"; compile $tree C "$C"; done
gpu_test() {  # name, pytest args...
  local name=$1; shift
  (cd abl/nw && timeout -k 5 330 python3 -m pytest -q -rs -p no:cacheprovider "$@" > /tmp/t_$name.txt 2>&1; t "test $name rc=$?") &
}
gpu_test deep tests/gpu/test_sampler_gpu.py -k "deep_nucleus or split_nucleus"
gpu_test deep_cpu_suite tests/sample/test_deep.py tests/sample/test_nucleus.py
wait
for f in /tmp/t_*.txt; do echo "== $f"; tail -n 12 $f; done > $OUT/tests.txt
timed() {  # tree, name, args
  (cd abl/$1 && timeout -k 5 60 python3 -m benchmarks.profile_kernels $3 > /tmp/k.txt 2>&1; grep -v paths /tmp/k.txt | sed "s/^/$1 /" >> $OUT/kernels_$2.txt; t "timed $1 $2")
}
for tree in main nw nw main; do timed $tree A "$A"; timed $tree B "$B"; done
for tree in main nw nw main; do timed $tree C "$C"; done
