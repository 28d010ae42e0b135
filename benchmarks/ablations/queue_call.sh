#!/usr/bin/env bash
# The head of the queue ("Queued for the next GPU run" in this folder's README) as one device
# call, whatever card comes: the copy-in probe (`benchmarks.copy_cost`, a few seconds on the idle
# host), then on an H200 the sampler table and `sampling.json` from `.triton_pack/tip` (item 1,
# into $OUT/tip), on any other card the 10 sampler GPU tests not yet run on this code (item 2,
# their compiles brought back as $OUT/0pack_tests.NN). Carry [".triton_pack"].
# Usage: OUT=dir [TESTS_LIMIT=450] bash benchmarks/ablations/queue_call.sh
set -u
cd "$(dirname "$0")/../.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
OUT=$(mkdir -p "${OUT:?set OUT}" && cd "$OUT" && pwd) || exit 2
card=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>&1 | head -1)
echo "card: $card"
timeout 120 python3 -m benchmarks.copy_cost --out "$OUT/copy_cost.json" > "$OUT/copy_cost.txt" 2>&1
echo "copy_cost rc=$?"
cat "$OUT/copy_cost.txt"
if [[ $card == *H200* ]]; then
  OUT=$OUT/tip PACKS=.triton_pack/tip BUDGET=240 PARTS="bench sampling" bash benchmarks/tip_call.sh
  cat "$OUT/tip/sampler_table.md" 2>/dev/null
else
  F=tests/gpu/test_sampler_gpu.py
  OUT=$OUT/tests LIMIT=${TESTS_LIMIT:-450} TESTS="$F -k chunks_per_program and dtype1;\
$F -k capped_finish and dtype0;$F -k capped_finish and dtype1;$F -k capped_bitmask;\
$F -k adversarial_rows and (one_allowed or two_allowed or all_neg_inf);\
$F -k min_p_rows and (one_allowed or two_allowed or all_neg_inf)" bash benchmarks/ablations/tests_call.sh
fi
