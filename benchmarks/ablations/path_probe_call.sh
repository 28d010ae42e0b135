#!/usr/bin/env bash
# One device call: `benchmarks.path_probe` on the top-p setting at batch 32 (152064 fp32, the
# profile's inputs), three processes of 60 synced and 60 chained calls each, then the profile
# that showed the whole-row fallback, for comparison. Runs in the tree abl10/main (the sampler
# as on main; benchmarks/results/dec06_d/README.md builds it and its cache), with this
# checkout's probe copied in. With AB=1 (the default) it then times abl10/beat (the split
# finish's interval shortcut alone, `interval_beaten_split.patch`) against abl10/main at
# batches 1 and 32, two rounds in ABBA order (`benchmarks/ab_trees.sh`), whose logs also count
# the fallback. Carry [CACHE, "abl10"].
# Usage: OUT=dir [CACHE=.triton_cache_s] [AB=0] bash benchmarks/ablations/path_probe_call.sh
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
if [[ ${AB:-1} == 1 ]]; then
  OUT=$OUT/ab ROUNDS=2 WARM=0 timeout 200 bash benchmarks/ab_trees.sh abl10/main abl10/beat -- \
    --vocab 152064 --dtype float32 --modes top_p_warm,top_p,top_k_top_p,greedy --batches 1,32 \
    --k 20 --no-step --pdl > "$OUT/ab.txt" 2>&1
  echo "ab_trees rc=$? ${SECONDS}s" >> "$log"
fi
close_call
grep -h "paths\|row " "$OUT"/probe_*.txt | sort | uniq -c | sort -rn | head -40
grep paths "$OUT/profile.txt"
tail -12 "$OUT/ab.txt" 2>/dev/null
