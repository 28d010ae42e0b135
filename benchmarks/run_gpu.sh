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
# Budgets in seconds (one device call may run 10 minutes in all).
T_TESTS=${T_TESTS:-300} T_BENCH=${T_BENCH:-90} T_SWEEP=${T_SWEEP:-240}
if want tests; then
  timeout "$T_TESTS" python3 -m pytest -q -rs --timeout=150 tests/gpu/test_kernels_gpu.py \
    tests/gpu/test_graphs_gpu.py tests/gpu/test_transports_gpu.py tests/gpu/test_engine_gpu.py \
    2>&1 | tee "$OUT/gpu_tests.log" || status=1
fi
if want bench; then
  timeout "$T_BENCH" python3 -m pytest -q benchmarks --benchmark-json="$OUT/bench.json" \
    --benchmark-columns=median,iqr,rounds 2>&1 | tee "$OUT/bench.log" || status=1
fi
if want sweep; then
  timeout "$T_SWEEP" python3 -m graphshard bench --config configs/qwen2-152k.toml --out "$OUT/sweep" \
    ${SWEEP_ARGS:-} 2>&1 | tee "$OUT/sweep.log" || status=1
fi
exit $status
