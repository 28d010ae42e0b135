# Sourced by this folder's device-call scripts: OUT made absolute, the repository root as the
# working directory (R), the collective library settings every process keeps, the Triton cache
# CACHE (a folder of the root, carried into the call or unpacked from PACKS: `../packs.sh`)
# relocated to where it now lies, the GPU and the relocation logged to $OUT/0_log.txt ($log), and
# SECONDS started. Also helpers: `test_shards`, `warm_rows`, `path_probe`, `warm32_pdl`,
# `step32_compile`, `step32_pdl`, `close_call`, and `../packs.sh`'s `cache_entries` and
# `bring_back`.
set -u
OUT=$(mkdir -p "${OUT:?set OUT}" && cd "$OUT" && pwd) || exit 2
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
R=$PWD
export TRITON_CACHE_DIR=$R/${CACHE:?set CACHE}
log=$OUT/0_log.txt
nvidia-smi --query-gpu=name,uuid,clocks.sm,clocks.mem --format=csv > "$log" 2>&1
source "$R/benchmarks/packs.sh"
unpack_packs
python3 -m benchmarks.prebuild --relocate >> "$log" 2>&1
SECONDS=0

# test_shards SECONDS SHARD...: each shard ("FILES_OR_NODE_IDS[ -k EXPRESSION]") a pytest
# process of its own, in the background, into $OUT/tests_<n>.txt. They compile their own
# variants into .triton_cache_tests (TEST_CACHE, an absolute path, instead: a cache built ahead),
# one core a process, while the timed parts run. With TREE set (an ablation's tree), they run in
# that tree instead of the root, into $OUT/tests_<n>_<tree name>.txt, with a cache
# .triton_cache_tests_<tree name>.
test_shards() {
  local limit=$1 i=0 shard files k tag=${TREE:+_$(basename "$TREE")}
  shift
  for shard in "$@"; do
    files=${shard%% -k *} k=
    [[ $shard == *" -k "* ]] && k=${shard#* -k }
    (cd "${TREE:-$R}" && TRITON_CACHE_DIR=${TEST_CACHE:-$R/.triton_cache_tests}$tag timeout -k 5 "$limit" \
       python3 -m pytest -q -rs -p no:cacheprovider $files ${k:+-k "$k"} \
       > "$OUT/tests_$i$tag.txt" 2>&1) &
    i=$((i + 1))
  done
}

# warm_rows DIR NAME VOCAB DTYPE SEEDS [SUFFIX]: `benchmarks.warm_rows` in the tree DIR, into
# $OUT/warm_<NAME>_<VOCAB><SUFFIX>.json and .txt, logged.
warm_rows() {
  local name=$OUT/warm_$2_$3${6:-}
  (cd "$1" && timeout 60 python3 -m benchmarks.warm_rows --vocab "$3" --dtype "$4" --seeds "$5" \
     --out "$name.json" > "$name.txt" 2>&1)
  echo "warm $2 $3${6:-} rc=$? ${SECONDS}s" >> "$log"
}

# path_probe DIR NAME: `benchmarks.path_probe` (top-p, batch 32, 152064 fp32, programmatic
# launches, 60 synced and 60 chained calls) in the tree DIR, with this checkout's probe copied
# in, into $OUT/probe_<NAME>.txt and the folder $OUT/probe_<NAME>, logged.
path_probe() {
  cp "$R/benchmarks/path_probe.py" "$1/benchmarks/"
  (cd "$1" && timeout 60 python3 -m benchmarks.path_probe --vocab 152064 --dtype float32 \
     --mode top_p --batch 32 --k 20 --pdl --calls 60 --out "$OUT/probe_$2" \
     > "$OUT/probe_$2.txt" 2>&1)
  echo "probe $2 rc=$? ${SECONDS}s" >> "$log"
}

# warm32_pdl DIR RUNS: warm top-p at 32 rows (152064 fp32) in the tree DIR, RUNS times with
# programmatic launches and RUNS without, alternating, into $OUT/warm32_pdl_<i>.json and
# $OUT/warm32_<i>.json (and .log), logged.
warm32_pdl() {
  local i pdl name
  for i in $(seq 1 "$2"); do
    for pdl in --pdl ""; do
      name=$OUT/warm32_${pdl:+pdl_}$i
      (cd "$1" && timeout 60 python3 -m benchmarks.profile_kernels --vocab 152064 \
         --dtype float32 --modes top_p_warm --batches 32 --k 20 --no-step $pdl \
         --out "$name.json" > "$name.log" 2>&1)
      echo "warm32 ${pdl:-nopdl} $i rc=$? ${SECONDS}s" >> "$log"
    done
  done
}

# step32_compile DIR: compile, in the background, what `step32_pdl` times in the tree DIR (the
# default engine's graphs for 32 requests, with and without programmatic launches:
# `bench_sampling --compile-only`, two processes); their pids in step32_pids.
step32_compile() {
  local pdl
  step32_pids=()
  for pdl in programmatic-launch no-programmatic-launch; do
    (cd "$1" && timeout 300 python3 -m benchmarks.bench_sampling --compile-only \
       --shapes 152064:float32 --modes top_p_warm --batches 32 --$pdl \
       > "$OUT/step32_compile_$pdl.log" 2>&1
     echo "step32 compile $pdl rc=$? ${SECONDS}s" >> "$log") &
    step32_pids+=($!)
  done
}

# step32_pdl DIR RUNS: after `step32_compile`, warm top-p at 32 requests (152064 fp32) as a
# decode loop steps it (`bench_sampling`: the default engine's back-to-back steps with the host
# read, and the sort sampler), RUNS times with programmatic launches and RUNS without,
# alternating, into $OUT/step32_pdl_<i>.json and $OUT/step32_<i>.json (and .log), logged.
step32_pdl() {
  local i pdl name
  wait "${step32_pids[@]}"
  for i in $(seq 1 "$2"); do
    for pdl in programmatic-launch no-programmatic-launch; do
      [[ $pdl == programmatic-launch ]] && name=$OUT/step32_pdl_$i || name=$OUT/step32_$i
      (cd "$1" && timeout 60 python3 -m benchmarks.bench_sampling --shapes 152064:float32 \
         --modes top_p_warm --batches 32 --iters 300 --$pdl --out "$name.json" \
         > "$name.log" 2>&1)
      echo "step32 $pdl $i rc=$? ${SECONDS}s" >> "$log"
    done
  done
}

# close_call: wait for the test shards, log their summaries, put every file of $OUT but the
# packs into $OUT/0all.tgz (a call brings back only a few files) and print the log.
close_call() {
  wait
  grep -H -E "passed|failed|error" "$OUT"/tests_*.txt 2>/dev/null | grep -v "::" >> "$log"
  echo "tests ${SECONDS}s" >> "$log"
  tar czf "$OUT/0all.tgz" -C "$OUT" --exclude=0all.tgz --exclude='0pack_*' .
  cat "$log"
}
