#!/usr/bin/env bash
# One device call: `benchmarks.path_probe` on the top-p setting at batch 32 (152064 fp32, the
# profile's inputs), three processes of 60 synced and 60 chained calls each, then the profile
# that showed the whole-row fallback, for comparison. Runs in the tree abl10/main (the sampler
# as on main; benchmarks/results/dec06_d/README.md builds it and its cache), with this
# checkout's probe copied in. Carry [CACHE, "abl10"].
# Usage: OUT=dir [CACHE=.triton_cache_s] bash benchmarks/ablations/path_probe_call.sh
CACHE=${CACHE:-.triton_cache_s} source "$(dirname "$0")/call_setup.sh"
cp benchmarks/path_probe.py abl10/main/benchmarks/
cd abl10/main
for i in 1 2 3; do
  timeout 120 python3 -m benchmarks.path_probe --vocab 152064 --dtype float32 --mode top_p \
    --batch 32 --k 20 --pdl --calls 60 --out "$OUT/probe_$i" > "$OUT/probe_$i.txt" 2>&1
  echo "probe $i rc=$? ${SECONDS}s" >> "$log"
done
timeout 120 python3 -m benchmarks.profile_kernels --vocab 152064 --dtype float32 --modes top_p \
  --batches 1,32 --k 20 --no-step --pdl > "$OUT/profile.txt" 2>&1
echo "profile rc=$? ${SECONDS}s" >> "$log"
cd "$R"
close_call
grep -h "paths\|row " "$OUT"/probe_*.txt | sort | uniq -c | sort -rn | head -40
grep paths "$OUT/profile.txt"
