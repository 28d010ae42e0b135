#!/usr/bin/env bash
# Every GPU test and the benchmark sweep in one call; results land under $OUT (default ./out).
# Usage: bash benchmarks/run_gpu.sh [tests|bench|sweep|all]...   (default: all)
set -uo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
OUT=${OUT:-out}
mkdir -p "$OUT"
parts=("${@:-all}")
want() { [[ " ${parts[*]} " == *" all "* || " ${parts[*]} " == *" $1 "* ]]; }
status=0
{
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv
  nvidia-smi topo -m
  python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__, "cuda", torch.version.cuda, "gpus", torch.cuda.device_count())'
} > "$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt"
if want tests; then
  timeout 900 python3 -m pytest -q -x --timeout=600 tests/gpu 2>&1 | tee "$OUT/gpu_tests.log" || status=1
fi
if want bench; then
  timeout 900 python3 -m pytest -q benchmarks --benchmark-json="$OUT/bench.json" \
    --benchmark-columns=median,iqr,rounds 2>&1 | tee "$OUT/bench.log" || status=1
fi
if want sweep; then
  timeout 1200 python3 -m graphshard bench --config configs/qwen2-152k.toml --out "$OUT/sweep" 2>&1 \
    | tee "$OUT/sweep.log" || status=1
fi
exit $status
