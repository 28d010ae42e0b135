#!/usr/bin/env bash
# Hardware counters of the sampler's scan kernel (Nsight Compute; needs a machine where ncu can
# read them): one report per (mode, batch), with the warp-stall samples of every SASS
# instruction exported as CSV, all in one file $OUT/counters.tgz (so any number of points
# comes back from the GPU machine); prints the main metrics and `benchmarks.stall_summary`.
# Usage: OUT=dir bash benchmarks/counters.sh [MODE:BATCH ...] (default: greedy:1024 top_k_top_p:1024)
# Env: KERNEL (regex of the kernel name, default _scan_kernel), SKIP (launches of it to skip:
# the first calls compile and warm up, default 2), SECTIONS (ncu --section list), CALL_ARGS
# (more arguments of benchmarks.call_sampler).
set -uo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export OUT=${OUT:-out}
mkdir -p "$OUT" || exit 2
out=$(cd "$OUT" && pwd)
work=$(mktemp -d)
points=("${@:-greedy:1024 top_k_top_p:1024}")
read -ra points <<< "${points[*]}"
kernel=${KERNEL:-_scan_kernel} skip=${SKIP:-2}
sections=(${SECTIONS:-SpeedOfLight MemoryWorkloadAnalysis Occupancy LaunchStats SchedulerStats WarpStateStats SourceCounters})
ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -n 1)
[[ -n $ncu ]] || { echo "ncu not found" >&2; exit 2; }
status=0
for point in "${points[@]}"; do
  mode=${point%%:*} batch=${point#*:}
  name="${mode}_${batch}" rep="$work/${mode}_${batch}"
  args=()
  for s in "${sections[@]}"; do args+=(--section "$s"); done
  echo "== $name"
  timeout 240 "$ncu" --clock-control none --kernel-name "regex:$kernel" --launch-skip "$skip" \
    --launch-count 1 "${args[@]}" -f -o "$rep" \
    python3 -m benchmarks.call_sampler --mode "$mode" --batch "$batch" --calls $((skip + 2)) \
    ${CALL_ARGS:-} \
    > "$rep.log" 2>&1 || { status=1; tail -n 20 "$rep.log"; continue; }
  "$ncu" -i "$rep.ncu-rep" --page details --csv > "$rep.details.csv" 2>&1 || status=1
  "$ncu" -i "$rep.ncu-rep" --page source --csv --print-source sass > "$rep.sass.csv" 2>&1 \
    || status=1
  grep -E "Duration|DRAM Throughput|Registers Per|Warp Cycles Per Issued|Issued Warp|Compute \(SM\) Throughput" \
    "$rep.details.csv" | cut -d, -f13- | head -n 12
  python3 -m benchmarks.stall_summary "$rep.sass.csv" || status=1
done
tar -czf "$out/counters.tgz" -C "$work" . || status=1
rm -rf "$work"
exit $status
