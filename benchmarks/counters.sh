#!/usr/bin/env bash
# Hardware counters of the sampler's scan kernel (Nsight Compute; needs a machine where ncu can
# read them): one report per (mode, batch), with the warp-stall samples of every SASS
# instruction and of every source line, exported as CSV next to the report.
# Usage: OUT=dir bash benchmarks/counters.sh [MODE:BATCH ...] (default: greedy:1024 top_k_top_p:1024)
# Env: KERNEL (regex of the kernel name, default _scan_kernel), SKIP (launches of it to skip:
# the first calls compile and warm up, default 2), SECTIONS (ncu --section list).
set -uo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export OUT=${OUT:-out}
mkdir -p "$OUT"
points=("${@:-greedy:1024 top_k_top_p:1024}")
read -ra points <<< "${points[*]}"
kernel=${KERNEL:-_scan_kernel} skip=${SKIP:-2}
sections=(${SECTIONS:-SpeedOfLight MemoryWorkloadAnalysis Occupancy LaunchStats SchedulerStats WarpStateStats SourceCounters})
ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -n 1)
[[ -n $ncu ]] || { echo "ncu not found" >&2; exit 2; }
status=0
for point in "${points[@]}"; do
  mode=${point%%:*} batch=${point#*:}
  name="${mode}_${batch}" rep="$OUT/${mode}_${batch}"
  args=()
  for s in "${sections[@]}"; do args+=(--section "$s"); done
  echo "== $name"
  # Line info lets the source page map SASS to the kernel's Python lines.
  timeout 240 "$ncu" --clock-control none --kernel-name "regex:$kernel" --launch-skip "$skip" \
    --launch-count 1 --import-source yes "${args[@]}" -f -o "$rep" \
    python3 -m benchmarks.call_sampler --mode "$mode" --batch "$batch" --calls $((skip + 2)) \
    > "$rep.log" 2>&1 || { status=1; tail -n 20 "$rep.log"; continue; }
  "$ncu" -i "$rep.ncu-rep" --page details --csv > "$rep.details.csv" 2>&1 || status=1
  "$ncu" -i "$rep.ncu-rep" --page source --csv --print-source sass > "$rep.sass.csv" 2>&1 \
    || status=1
  "$ncu" -i "$rep.ncu-rep" --page source --csv --print-source cuda > "$rep.source.csv" 2>&1 \
    || true
  grep -E "Duration|Memory Throughput|DRAM Throughput|Achieved Occupancy|Registers Per|Warp Cycles Per Issued|No Eligible" \
    "$rep.details.csv" | head -n 20
done
exit $status
