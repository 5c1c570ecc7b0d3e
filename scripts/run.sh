#!/usr/bin/env bash
# Builds cumulus and runs the main job on the best device present. Until apps/fashion_mnist lands
# that is the quickstart: the seed MLP on a synthetic problem, with loss and memory by category.
# Arguments go to the app (see --help).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
scripts/install-deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release ${CUMULUS_CMAKE_ARGS:-} >/dev/null
cmake --build build -j "${CUMULUS_JOBS:-2}" --target quickstart
exec build/bin/quickstart "$@"
