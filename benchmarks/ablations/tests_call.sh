#!/usr/bin/env bash
# One device call of compiled tests alone: each shard of TESTS (pytest arguments, shards
# separated by ";", a shard "FILES -k EXPRESSION" where it selects) a process of its own for
# LIMIT seconds (default 540), into $OUT/tests_<n>.txt, all of $OUT also in $OUT/0all.tgz. Each
# process compiles its own variants on one core: split a file by test where its variants
# would take past the limit. What they compiled comes back as $OUT/0pack_tests.NN: carried
# back in as .triton_pack/tests with PACKS=.triton_pack/tests, a later call compiles none of it.
# Usage: OUT=dir TESTS="..." [LIMIT=540] [PACKS=...] bash benchmarks/ablations/tests_call.sh
CACHE=${CACHE:-.triton_cache_tests} source "$(dirname "$0")/call_setup.sh"
IFS=';' read -ra shards <<< "${TESTS:?set TESTS}"
before=$(cache_entries "$TRITON_CACHE_DIR")
test_shards "${LIMIT:-540}" "${shards[@]}"
wait
bring_back tests "$TRITON_CACHE_DIR" "$before"
close_call
