#!/usr/bin/env bash
# Every GPU test and the benchmark sweep in one call; results land under $OUT (default ./out).
# Usage: bash benchmarks/run_gpu.sh [kernels|sampling|tests|reliability|divergence|bench|exchange|profile|host|anatomy|timeline|sweep|all]...
# (default: all; "kernels" runs the sampler tests compiled on one GPU, "sampling" the sampler
# benchmark against the PyTorch sort sampler, "tests" runs tests/gpu except the long reliability
# run and the divergence check's tests, "reliability" and "divergence" run those; the divergence
# check's random run takes DIVERGENCE_RUN_STEPS steps, 10000 here). "kernels" compiles dozens of
# sampler variants on a fresh machine and takes most of a 10-minute device call: give it its own.
# Comparing the sampler's kernel times with another commit: benchmarks/ab_kernels.sh.
# Several trees at once (an ablation): benchmarks/ab_trees.sh; with GPU tests of one tree
# compiled while the trees warm up, in one call: benchmarks/ab_call.sh.
# Files: machine.txt, run.log (everything printed), sampling.json, bench.json, sampler_table.md, exchange.json,
# gpu_report.jsonl, graph_read.json, variants.json, timeline.json, sweep/loop.{json,md,png},
# sweep/auto.json.
set -uo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export OUT=${OUT:-out}
mkdir -p "$OUT"
parts=("${@:-all}")
want() { [[ " ${parts[*]} " == *" all "* || " ${parts[*]} " == *" $1 "* ]]; }
log="$OUT/run.log"
status=0
{
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv
  nvidia-smi topo -m
  python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__, "cuda", torch.version.cuda, "gpus", torch.cuda.device_count())'
} > "$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt"
# Budgets in seconds (one device call may run 10 minutes in all).
T_KERNELS=${T_KERNELS:-560} T_SAMPLING=${T_SAMPLING:-300} T_TESTS=${T_TESTS:-300} T_RELIABILITY=${T_RELIABILITY:-420} T_BENCH=${T_BENCH:-420} T_SWEEP=${T_SWEEP:-300} T_PROFILE=${T_PROFILE:-120} T_DIVERGENCE=${T_DIVERGENCE:-540}
if want kernels; then
  echo "== sampler tests, compiled" | tee -a "$log"
  timeout "$T_KERNELS" python3 -m pytest -q -rs -x --timeout=200 ${KERNEL_ARGS:-tests/sample/test_rows.py tests/gpu/test_sampler_gpu.py tests/sample/test_floor.py tests/sample/test_search.py tests/gpu/test_kernels_gpu.py tests/sample/test_sampler.py} 2>&1 | tee -a "$log" || status=1
fi
if want sampling; then
  echo "== sampling benchmark (tp = 1) against the PyTorch sort sampler" | tee -a "$log"
  timeout "$T_SAMPLING" python3 -m benchmarks.bench_sampling --out "$OUT/sampling.json" ${SAMPLING_ARGS:-} 2>&1 | tee -a "$log" || status=1
fi
if want tests; then
  echo "== tests/gpu" | tee -a "$log"
  timeout "$T_TESTS" python3 -m pytest -q -rs --timeout=300 ${TEST_ARGS:-tests/gpu --ignore=tests/gpu/test_reliability_gpu.py --ignore=tests/gpu/test_divergence_gpu.py} 2>&1 | tee -a "$log" || status=1
fi
if want reliability; then
  export LONG_RUN_STEPS=${LONG_RUN_STEPS:-100000}
  echo "== tests/gpu/test_reliability_gpu.py (LONG_RUN_STEPS=$LONG_RUN_STEPS)" | tee -a "$log"
  timeout "$T_RELIABILITY" python3 -m pytest -q -rs -s --timeout=400 \
    tests/gpu/test_reliability_gpu.py 2>&1 | tee -a "$log" || status=1
fi
if want divergence; then
  export DIVERGENCE_RUN_STEPS=${DIVERGENCE_RUN_STEPS:-10000}
  echo "== tests/gpu/test_divergence_gpu.py (DIVERGENCE_RUN_STEPS=$DIVERGENCE_RUN_STEPS)" | tee -a "$log"
  timeout "$T_DIVERGENCE" python3 -m pytest -q -rs -s --timeout=500 \
    tests/gpu/test_divergence_gpu.py 2>&1 | tee -a "$log" || status=1
fi
if want bench; then
  echo "== pytest-benchmark suites" | tee -a "$log"
  # The sampler module compiles its variants first (on every core; seconds with a carried cache).
  timeout "$T_BENCH" python3 -m pytest -q benchmarks --benchmark-json="$OUT/bench.json" \
    --benchmark-columns=median,iqr,rounds 2>&1 | tee -a "$log" || status=1
  python3 -m benchmarks.sampler_table "$OUT/bench.json" --out "$OUT/sampler_table.md" 2>&1 | tee -a "$log" || status=1
fi
if want exchange; then
  echo "== exchange microbenchmark" | tee -a "$log"
  timeout "$T_PROFILE" python3 -m benchmarks.bench_exchange --out "$OUT/exchange.json" 2>&1 | tee -a "$log" || status=1
fi
if want profile; then
  echo "== step profile" | tee -a "$log"
  timeout "$T_PROFILE" python3 -m benchmarks.profile_step 2>&1 | tee -a "$log" || status=1
fi
if want host; then
  echo "== host path microbenchmark" | tee -a "$log"
  # Host code only, on CPU tensors: the kernels it touches run under the interpreter.
  TRITON_INTERPRET=1 timeout "$T_PROFILE" python3 -m benchmarks.host_path 2>&1 | tee -a "$log" || status=1
fi
if want anatomy; then
  echo "== where a tp = 1 step's time goes" | tee -a "$log"
  timeout "$T_PROFILE" python3 -m benchmarks.step_anatomy --out "$OUT/anatomy.json" 2>&1 | tee -a "$log" || status=1
fi
if want timeline; then
  echo "== the tp = 1 step: graph nodes and host reads, read paths in rounds, device timeline" | tee -a "$log"
  timeout "$T_PROFILE" python3 -m benchmarks.graph_read --out "$OUT/graph_read.json" 2>&1 | tee -a "$log" || status=1
  timeout "$T_SAMPLING" python3 -m benchmarks.step_variants --out "$OUT/variants.json" 2>&1 | tee -a "$log" || status=1
  timeout "$T_SAMPLING" python3 -m benchmarks.step_timeline --out "$OUT/timeline.json" 2>&1 | tee -a "$log" || status=1
fi
if want sweep; then
  echo "== sweep" | tee -a "$log"
  timeout "$T_SWEEP" python3 -m graphshard bench --config configs/qwen2-152k.toml --out "$OUT/sweep" \
    ${SWEEP_ARGS:-} 2>&1 | tee -a "$log" || status=1
fi
exit $status
