#!/usr/bin/env bash
# One GPU call for the code as it is (no ablation), within one device call's time, with the
# sampler's variants taken from a Triton cache built ahead on a CPU machine (carry it in).
# Its parts, in the order they run (PARTS names a subset, e.g. when little device time is left):
#   variants  `benchmarks.step_variants` at 32000 bf16 (its engines: plain launches with one
#             graph a bucket, programmatic launches, no bitmask support, and the config's
#             defaults, beside the captured sort, in the same rounds): the step target the
#             engine options are for, so it runs first;
#   variants_large  the same at batches 256 and 1024, where programmatic launches must cost
#             nothing before they become the default (not in the default PARTS);
#   timeline  `benchmarks.step_timeline` at 32000 bf16, batch 1, for the default engine on the
#             step loop's buckets and sampler variants (1, 8, 32; K = 0): where the step's device
#             time and gaps are (not in the default PARTS);
#   gpu_tests `tests/gpu/test_pdl_gpu.py` (programmatic launches return what plain ones do),
#             the tp = 1 tests of `tests/gpu/test_host_path_gpu.py` (`read()` of every step, the
#             publish kernel's host copy) and
#             `tests/gpu/test_compile_ahead_gpu.py` (the capture's compile ahead, with and without
#             bitmask support; compiles its own variants on purpose: its vocabularies are new),
#             in parallel shards as kernel_tests runs them;
#   bench     `benchmarks/test_bench_sampler.py` (every mode x batch x shape) and its table;
#   logprobs  the logprob kernels at 152064 fp32, batches 256 and 1024 (`benchmarks.profile_kernels`,
#             CUPTI, beside greedy and top-k + top-p), then the scan's hardware counters at
#             batch 256 (`benchmarks/counters.sh logprobs_20:256 greedy:256`): where the logprob
#             rows miss 1.5x greedy (variants in `.triton_cache_s`; not in the default PARTS);
#   sampling  `benchmarks.bench_sampling` over the three shapes and batches 1-1024 with the
#             default engine: `sampling.json`, the side-by-side file of the filtered-sampling
#             issue (variants in `.triton_cache_bs`, carried alone; not in the default PARTS);
#   kernel_tests  the compiled sampler's tests (`tests/gpu/test_sampler_gpu.py`,
#             `test_kernels_gpu.py`, `tests/sample/test_rows.py`) and the compile-ahead test
#             without bitmask support, in parallel shards of one pytest process each: they
#             compile their own variants, one core a process (not in the default PARTS).
# Usage: OUT=dir [TRITON_CACHE_DIR=.triton_cache_tip] [BUDGET=560] [PARTS="variants gpu_tests
#        bench"] [PACKS=".triton_pack/NAME ..."] bash benchmarks/tip_call.sh
# Build the cache first (benchmarks/ablations/README.md, "Queued for the next GPU run"), and
# carry it in as it is or packed (`packs.sh`: PACKS unpacked into the root before the run).
# Where the call compiled new entries into TRITON_CACHE_DIR, they come back as $OUT/0pack_tip.NN.
# Files under $OUT: times.txt (clocks, cache relocation, each part's end and exit status),
# variants_32000.json and .txt, variants_32000_large.json and .txt, timeline_default.json
# (and .txt), gpu_tests_<shard>.txt, kernels_logprobs.json (and .txt), counters.tgz and
# counters.txt, sampling.json (and .txt),
# gpu_report.jsonl, bench.json, bench.txt, sampler_table.md, kernel_tests_<shard>.txt, and all of
# them in all.tgz.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
cd "$(dirname "$0")/.."
export OUT=${OUT:-out}
mkdir -p "$OUT" || exit 2
export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-.triton_cache_tip}
mkdir -p "$TRITON_CACHE_DIR" && TRITON_CACHE_DIR=$(cd "$TRITON_CACHE_DIR" && pwd)
budget=${BUDGET:-560}
log=$OUT/times.txt
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > "$log" 2>&1
source benchmarks/packs.sh
unpack_packs
python3 -m benchmarks.prebuild --relocate >> "$log" 2>&1
cached=$(cache_entries "$TRITON_CACHE_DIR")
SECONDS=0
left() { local t=$(( budget - SECONDS )); (( t > 5 )) && echo $t || echo 5; }
part() {  # part NAME SHARE_OF_WHAT_IS_LEFT(%) COMMAND...
  local name=$1 share=$2; shift 2
  timeout -k 5 $(( $(left) * share / 100 )) "$@" > "$OUT/$name.txt" 2>&1
  echo "$name rc=$? ${SECONDS}s" >> "$log"
}
step_loop() {  # step_loop NAME BATCHES ROUNDS STEPS: the four engines and the sort, 32000 bf16
  part "$1" 40 python3 -m benchmarks.step_variants --shape 32000:bfloat16 \
    --modes greedy,top_k_top_p --batches "$2" --rounds "$3" --steps "$4" --out "$OUT/$1.json"
}
shards() {  # shards NAME SHARD...: each shard a pytest process of its own, all at once, within
            # 95% of what is left (they compile their own variants, one core a process)
  local name=$1 t=$(( $(left) * 95 / 100 )) i=0 shard; shift
  for shard in "$@"; do
    local files=${shard%% -k *} k=
    [[ $shard == *" -k "* ]] && k=${shard#* -k }
    timeout -k 5 $t python3 -m pytest -q -rs -p no:cacheprovider $files ${k:+-k "$k"} \
      > "$OUT/${name}_$i.txt" 2>&1 &
    i=$(( i + 1 ))
  done
  wait
  grep -H -E "passed|failed|error" "$OUT"/${name}_*.txt | grep -v "^.*::" >> "$log"
  echo "$name ${SECONDS}s" >> "$log"
}
parts=${PARTS:-variants gpu_tests bench}
for name in $parts; do
  case $name in
    variants) step_loop variants_32000 1,8,32 8 200 ;;
    variants_large) step_loop variants_32000_large 256,1024 6 100 ;;
    timeline)
      part timeline_default 25 python3 -m benchmarks.step_timeline --shape 32000:bfloat16 \
        --modes greedy,top_k_top_p --batches 1 --buckets 1,8,32 --k 0 --programmatic-launch \
        --out "$OUT/timeline_default.json" ;;
    gpu_tests) shards gpu_tests "tests/gpu/test_pdl_gpu.py" \
      "tests/gpu/test_host_path_gpu.py -k auto or read or publish" \
      "tests/gpu/test_compile_ahead_gpu.py -k True" "tests/gpu/test_compile_ahead_gpu.py -k False" ;;
    bench) part bench 95 python3 -m pytest -q -p no:cacheprovider benchmarks/test_bench_sampler.py \
      --benchmark-json="$OUT/bench.json" --benchmark-columns=median,rounds
      python3 -m benchmarks.sampler_table "$OUT/bench.json" --out "$OUT/sampler_table.md" \
        >> "$log" 2>&1 ;;
    logprobs)
      part kernels_logprobs 40 python3 -m benchmarks.profile_kernels --vocab 152064 \
        --dtype float32 --modes greedy,logprobs_5,logprobs_20,top_k_top_p --batches 256,1024 \
        --k 20 --no-step --out "$OUT/kernels_logprobs.json"
      part counters 90 bash benchmarks/counters.sh logprobs_20:256 greedy:256 ;;
    sampling) part sampling 95 python3 -m benchmarks.bench_sampling --out "$OUT/sampling.json" \
      --shapes 152064:float32,128256:bfloat16,32000:bfloat16 --batches 1,8,32,256,1024 ;;
    kernel_tests) shards kernel_tests \
      "tests/gpu/test_sampler_gpu.py -k small_rows_at_large_grids or large_batches_settle" \
      "tests/gpu/test_sampler_gpu.py -k benchmark_settings" \
      "tests/gpu/test_sampler_gpu.py -k split_nucleus or deep_nucleus or kept_winners" \
      "tests/gpu/test_sampler_gpu.py -k chunks_per_program or capped or temperature_logprobs" \
      "tests/gpu/test_sampler_gpu.py -k adversarial or min_p_rows" \
      "tests/gpu/test_kernels_gpu.py tests/sample/test_rows.py" \
      "tests/gpu/test_compile_ahead_gpu.py -k False" ;;
    *) echo "unknown part $name (variants, variants_large, timeline, gpu_tests, bench," \
         "logprobs, sampling, kernel_tests)" >> "$log" ;;
  esac
done
bring_back tip "$TRITON_CACHE_DIR" "$cached"
cat "$log"
# A call brings back only a few files (alphabetically first): all.tgz holds every one of them
# but the pack.
tmp=$(mktemp) && tar czf "$tmp" -C "$OUT" --exclude=all.tgz --exclude='0pack_*' . \
  && mv "$tmp" "$OUT/all.tgz"
