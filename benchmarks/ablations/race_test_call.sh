#!/usr/bin/env bash
# One device call: the 1024-row top-p race test (tests/gpu/test_sampler_gpu.py
# `test_large_top_p_batches_race_their_draws`) in fp32 and in bf16, two shards in the
# background (each compiles its own one-program finish, ~240 s on one core), LIMIT seconds each.
# Nothing is timed, so nothing needs carrying.
# Usage: OUT=dir [LIMIT=300] bash benchmarks/ablations/race_test_call.sh
CACHE=${CACHE:-.triton_cache_tests} source "$(dirname "$0")/call_setup.sh"
g=tests/gpu/test_sampler_gpu.py
test_shards "${LIMIT:-300}" "$g -k large_top_p_batches and dtype0" \
  "$g -k large_top_p_batches and dtype1"
close_call
