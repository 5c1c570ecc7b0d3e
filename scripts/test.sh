#!/usr/bin/env bash
# Builds cumulus (CUDA when a toolkit is present, so the CUDA sources always compile) and runs the
# whole test suite. CUDA test cases skip when no GPU is present. Extra arguments go to ctest.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
scripts/install-deps.sh
source scripts/compiler_cache.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release "${compiler_cache_args[@]}" ${CUMULUS_CMAKE_ARGS:-}
cmake --build build -j "${CUMULUS_JOBS:-2}"
ctest --test-dir build --output-on-failure -j "${CUMULUS_JOBS:-2}" "$@"
