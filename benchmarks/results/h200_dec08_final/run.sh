#!/usr/bin/env bash
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
R=$OUT/r; mkdir -p $R
git log --oneline -1 > $R/head.txt; git status --short > $R/status.txt
T=tests/gpu/test_sampler_gpu.py
ids=("tests/sample/test_search.py" "tests/sample/test_sampler.py::test_pools_past_one_sort_tile_settle_from_candidates")
for k in top_p-dtype0 top_p-dtype1 top_k_top_p-dtype0; do ids+=("$T::test_benchmark_settings_settle_from_candidates[$k]"); done
ids+=("$T::test_large_batches_settle_from_candidates[top_p]")
for k in flat ties_at_threshold equal peaked; do ids+=("$T::test_adversarial_rows_full_vocabulary[$k]"); done
for p in 0 1 2 3; do
  sel=(); for i in "${!ids[@]}"; do (( i % 4 == p )) && sel+=("${ids[$i]}"); done
  timeout 230 python3 -m pytest -q -p no:cacheprovider "${sel[@]}" > $R/t$p.txt 2>&1 &
done
wait; echo "tests done ${SECONDS}s"; tail -qn 1 $R/t*.txt
(cd $OUT && tar czf r.tgz r)
