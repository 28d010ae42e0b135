#!/usr/bin/env bash
# One device call: the 1024-row top-p race test (tests/gpu/test_sampler_gpu.py
# `test_large_top_p_batches_race_their_draws`) in fp32 and in bf16, two shards in the
# background, LIMIT seconds each. Nothing is timed.
# Its sampler variants are those `benchmarks.prebuild` builds for greedy at batch 1024, V =
# 152064, K = 20, in each dtype (checked on the CPU machine: the test's launches find both
# entries). Built ahead and carried (carry [".triton_cache_race"]), the shards compile nothing
# and the call takes about a minute (two references of ~20 s); without the cache each shard
# compiles its one-program finish, ~240 s on one core:
#   for d in float32 bfloat16; do TRITON_INTERPRET=0 TRITON_CACHE_DIR=$PWD/.triton_cache_race \
#     python3 -m benchmarks.prebuild --vocab 152064 --dtype $d --modes greedy --batches 1024 \
#     --k 20 --libtriton .triton_lib/cp312/libtriton.so; done
#   TRITON_CACHE_DIR=$PWD/.triton_cache_race python3 -m benchmarks.prebuild --relocate
# Usage: OUT=dir [LIMIT=300] bash benchmarks/ablations/race_test_call.sh
CACHE=${CACHE:-.triton_cache_race} source "$(dirname "$0")/call_setup.sh"
g=tests/gpu/test_sampler_gpu.py
TEST_CACHE=$TRITON_CACHE_DIR test_shards "${LIMIT:-300}" "$g -k large_top_p_batches and dtype0" \
  "$g -k large_top_p_batches and dtype1"
close_call
