#!/usr/bin/env bash
# GPU run 2: the sampler's split / cold top-p GPU tests on HEAD; the top-p chunk-need ablation
# (NUCLEUS_POOL 2048 and 2560) against HEAD: floor audits and kernel times at 32000 and 128256
# bf16 (and 152064 fp32 for 2560, the one that changes it). Everything lands in one tarball.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
R=/tmp/r; rm -rf $R; mkdir -p $R
finish() { tar -czf $OUT/results.tgz -C /tmp r; }
trap finish EXIT
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv > $R/smi.txt 2>&1
SECONDS=0
ROOT=$PWD
mk() { rm -rf /tmp/ab/$1; mkdir -p /tmp/ab/$1; cp -r graphshard benchmarks tests configs pyproject.toml /tmp/ab/$1/; }
mk base; mk n2048; mk n2560
for t in n2048 n2560; do (cd /tmp/ab/$t && patch -s -p1 < $ROOT/benchmarks/ablations/top_p_chunk_need.patch) || echo "patch failed $t" >> $R/times.txt; done
sed -i 's/^NUCLEUS_POOL = 2048$/NUCLEUS_POOL = 2560/' /tmp/ab/n2560/graphshard/sample/workspace.py
for t in n2048 n2560; do diff -r /tmp/ab/base/graphshard /tmp/ab/$t/graphshard; done > $R/trees.txt
T=${T_PAR:-300}
P=(-v -rA --tb=short -p no:cacheprovider --timeout=290)
F=tests/gpu/test_sampler_gpu.py
for id in "test_split_nucleus_draw_full_vocabulary[1]" "test_split_nucleus_draw_full_vocabulary[16]" \
          "test_benchmark_settings_settle_from_candidates[top_p_cold-dtype0]" \
          "test_benchmark_settings_settle_from_candidates[top_p_cold-dtype1]"; do
  timeout -k 5 $T python3 -m pytest "${P[@]}" "$F::$id" > "$R/t_${id//[^a-z0-9_]/_}.txt" 2>&1 &
done
for t in n2048 n2560; do
  for v in 32000 128256; do
    (cd /tmp/ab/$t && timeout -k 5 $T python3 -m benchmarks.floor_audit --vocab $v --dtype bfloat16 --mode top_p --batch 32 --calls 3 > $R/audit_${v}_$t.txt 2>&1) &
  done
done
A32=(--vocab 32000 --dtype bfloat16 --modes top_p,top_p_cold,min_p,top_k_top_p,greedy --batches 1,32,256 --k 20 --no-step)
A128=(--vocab 128256 --dtype bfloat16 --modes top_p,top_p_cold,top_k_top_p,greedy --batches 1,32 --k 20 --no-step)
A152=(--vocab 152064 --dtype float32 --modes top_p,top_p_cold,top_k_top_p,greedy --batches 1,32 --k 20 --no-step)
for t in base n2048 n2560; do
  (cd /tmp/ab/$t && timeout -k 5 $T python3 -m benchmarks.profile_kernels "${A32[@]}" --modes greedy > $R/warm32_$t.log 2>&1) &
  (cd /tmp/ab/$t && timeout -k 5 $T python3 -m benchmarks.profile_kernels "${A128[@]}" --modes greedy > $R/warm128_$t.log 2>&1) &
done
for t in base n2560; do
  (cd /tmp/ab/$t && timeout -k 5 $T python3 -m benchmarks.profile_kernels "${A152[@]}" --modes greedy > $R/warm152_$t.log 2>&1) &
done
wait
echo "parallel phase done ${SECONDS}s" >> $R/times.txt
OUT=$R/ab32 ROUNDS=2 timeout -k 5 120 bash benchmarks/ab_trees.sh /tmp/ab/base /tmp/ab/n2048 /tmp/ab/n2560 -- "${A32[@]}" > $R/ab32.txt 2>&1
echo "ab32 done ${SECONDS}s" >> $R/times.txt
OUT=$R/ab128 ROUNDS=2 timeout -k 5 100 bash benchmarks/ab_trees.sh /tmp/ab/base /tmp/ab/n2048 /tmp/ab/n2560 -- "${A128[@]}" > $R/ab128.txt 2>&1
echo "ab128 done ${SECONDS}s" >> $R/times.txt
OUT=$R/ab152 ROUNDS=2 timeout -k 5 60 bash benchmarks/ab_trees.sh /tmp/ab/base /tmp/ab/n2560 -- "${A152[@]}" > $R/ab152.txt 2>&1
echo "ab152 done ${SECONDS}s" >> $R/times.txt
