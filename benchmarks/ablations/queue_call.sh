#!/usr/bin/env bash
# The head of the queue ("Queued for the next GPU run" in this folder's README) as one device
# call, whatever card comes: the copy-in probe (`benchmarks.copy_cost`, a few seconds), then on
# an H200 the sampler table and `sampling.json` from `.triton_pack/tip` (into $OUT/tip; ~80 s
# with the pack), on any other card the mixed workload at tp = 1 from `.triton_pack/mixed`
# (three runs of `benchmarks.mixed_steps --steps 300 --parts --verify`, into $OUT/mixed).
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
else
  mkdir -p "$OUT/mixed"
  log=$OUT/mixed/0_log.txt
  source benchmarks/packs.sh
  cache=/tmp/mixed_cache
  unpack_pack .triton_pack/mixed /tmp
  before=$(cache_entries "$cache")
  for run in 1 2 3; do
    TRITON_CACHE_DIR=$cache timeout 400 python3 -m benchmarks.mixed_steps --profile-steps 0 \
      --steps 300 --parts --verify --out "$OUT/mixed/run$run.json" > "$OUT/mixed/run$run.txt" 2>&1
    echo "run $run rc=$?" >> "$log"
    head -4 "$OUT/mixed/run$run.txt"
    [[ -f $OUT/mixed/run$run.json ]] && gzip -f "$OUT/mixed/run$run.json"
  done
  OUT=$OUT/mixed bring_back mixed "$cache" "$before"
  cat "$log"
fi
