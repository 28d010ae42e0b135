#!/usr/bin/env bash
# GPU run 3: the knot pivots (rank: committed candidate; sort: the same knot by tl.sort) against
# the tree before them (base), kernel times, and the sampler's GPU tests on the candidate tree.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
R=$OUT/r; mkdir -p $R
SECONDS=0
ROOT=$PWD
mk() { rm -rf /tmp/ab/$1; mkdir -p /tmp/ab/$1; cp -r graphshard benchmarks tests pyproject.toml /tmp/ab/$1/; }
mk rank; mk sort; mk base
cp abl_nucleus_sort.py /tmp/ab/sort/graphshard/sample/nucleus.py
(cd /tmp/ab/base && patch -s -R -p1 < $ROOT/abl_knot.patch) || echo "patch failed" >> $R/times.txt
for t in sort base; do diff -r /tmp/ab/rank/graphshard /tmp/ab/$t/graphshard; done > $R/trees.txt
ARGS=(--modes top_p,top_p_cold,top_k_top_p,greedy --batches 1,32 --k 20 --no-step)
T=${T_PAR:-280}
P=(-v -rs -p no:cacheprovider --timeout=230 tests/gpu/test_sampler_gpu.py)
timeout -k 5 $T python3 -m pytest "${P[@]}" -k "split_nucleus or (top_p and not top_k)" > $R/t1.txt 2>&1 &
timeout -k 5 $T python3 -m pytest "${P[@]}" -k "adversarial" > $R/t2.txt 2>&1 &
for t in rank sort base; do
  (cd /tmp/ab/$t && timeout -k 5 $T python3 -m benchmarks.profile_kernels "${ARGS[@]}" --modes greedy > $R/warm_$t.log 2>&1) &
done
wait
echo "parallel phase done ${SECONDS}s" >> $R/times.txt
OUT=$R ROUNDS=2 timeout -k 5 ${T_AB:-150} bash benchmarks/ab_trees.sh /tmp/ab/base /tmp/ab/rank /tmp/ab/sort -- "${ARGS[@]}" > $R/ab.txt 2>&1
echo "ab done ${SECONDS}s" >> $R/times.txt
