#!/usr/bin/env bash
# The head of the queue ("Queued for the next GPU run" in this folder's README) as one device
# call, whatever card comes: the copy-in probe (`benchmarks.copy_cost`, a few seconds), then on
# an H200 the sampler table and `sampling.json` from `.triton_pack/tip` (into $OUT/tip; ~80 s
# with the pack), then on every card the mixed workload at tp = 1 from `.triton_pack/mixed`
# (`mixed_ab_call.sh` on this checkout alone: a 3-step compile run, then `benchmarks.mixed_steps
# --steps 300 --parts --verify`, into $OUT/mixed, the files named after the checkout's folder;
# under a minute with the pack). Its steps copy drafts and a bitmask in through the driver and
# check every token against the oracle: the CUDA check of the one-allocation input buffers.
# Carry [".triton_pack"].
# Usage: OUT=dir bash benchmarks/ablations/queue_call.sh
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
fi
OUT=$OUT/mixed MIXED_PACK=.triton_pack/mixed LAUNCH_TREE= LIMIT=${MIXED_LIMIT:-200} \
  bash benchmarks/ablations/mixed_ab_call.sh "$PWD"
cat "$OUT/mixed/0_log.txt"
