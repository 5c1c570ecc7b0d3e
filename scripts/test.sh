#!/usr/bin/env bash
# Builds cumulus (CUDA when a toolkit is present, so the CUDA sources always compile) and runs the
# whole test suite. CUDA test cases skip when no GPU is present. Extra arguments go to ctest.
# Each test binary runs as CUMULUS_TEST_SHARDS ctest tests (default 4; 0: one per gtest case, for
# `ctest -R Case`), see tests/CMakeLists.txt.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
scripts/install-deps.sh
source scripts/compiler_cache.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DCUMULUS_TEST_SHARDS="${CUMULUS_TEST_SHARDS:-4}" "${compiler_cache_args[@]}" ${CUMULUS_CMAKE_ARGS:-}
cmake --build build -j "${CUMULUS_JOBS:-2}"
ctest --test-dir build --output-on-failure -j "${CUMULUS_JOBS:-2}" "$@"
