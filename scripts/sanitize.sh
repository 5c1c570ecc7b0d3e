#!/usr/bin/env bash
# The CPU test suite under AddressSanitizer (with LeakSanitizer) and UndefinedBehaviorSanitizer:
# configures build-asan/ (CPU only, no benchmarks), builds, and runs ctest with every sanitizer
# report fatal. Extra arguments go to ctest. CUMULUS_JOBS sets the parallel jobs (default 2);
# CUMULUS_TEST_SHARDS the ctest tests per binary (default 4, as scripts/test.sh).
# Left to the Release pass (scripts/test.sh), which runs them: the end-to-end trainings through the
# app (label unit_end_to_end: test_app, test_dist), whose code paths the unit tests and the app's
# hostile-input and fault tests already take here, and the package tests, which build cumulus
# again in their own trees. CUMULUS_SANITIZE_ALL=1 runs those too.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
scripts/install-deps.sh
source scripts/compiler_cache.sh
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCUMULUS_CUDA=OFF "${compiler_cache_args[@]}" \
      -DCUMULUS_SANITIZE=address,undefined -DCUMULUS_BUILD_BENCH=OFF \
      -DCUMULUS_TEST_SHARDS="${CUMULUS_TEST_SHARDS:-4}"
cmake --build build-asan -j "${CUMULUS_JOBS:-2}"
# halt_on_error: the first report fails the test (UBSan is also built with -fno-sanitize-recover).
# Child processes the tests start (the app) inherit these, so their reports fail the tests too.
# No suppressions: OpenBLAS's thread pool has given LeakSanitizer nothing to report so far.
export ASAN_OPTIONS="halt_on_error=1:detect_leaks=1:check_initialization_order=1:strict_init_order=1:detect_odr_violation=2${ASAN_OPTIONS:+:$ASAN_OPTIONS}"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1${UBSAN_OPTIONS:+:$UBSAN_OPTIONS}"
skip=(-LE "end_to_end|package")
[ "${CUMULUS_SANITIZE_ALL:-0}" = 1 ] && skip=()
ctest --test-dir build-asan --output-on-failure -j "${CUMULUS_JOBS:-2}" "${skip[@]}" "$@"
