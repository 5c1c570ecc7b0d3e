#!/usr/bin/env bash
# Builds cumulus and runs the seed experiment on the best device present: the 784-512-512-10 MLP on
# Fashion-MNIST, micro-batch 16 x 4 accumulation steps, SGD lr 1e-3, 20 epochs, with every report
# written under reports/. Extra arguments go to the app and override these (the last value of a
# repeated flag wins: scripts/run.sh --epochs 5). See build/bin/fashion_mnist --help.
#   CUMULUS_BUILD_DIR    the build directory (default build)
#   CUMULUS_REPORTS_DIR  where the reports go (default reports)
#   CUMULUS_SKIP_BUILD=1 use the binary already built there (the tests run this script so)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
build=${CUMULUS_BUILD_DIR:-build}
reports=${CUMULUS_REPORTS_DIR:-reports}
if [ "${CUMULUS_SKIP_BUILD:-0}" != 1 ]; then
  scripts/install-deps.sh
  cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release ${CUMULUS_CMAKE_ARGS:-} >/dev/null
  cmake --build "$build" -j "${CUMULUS_JOBS:-2}" --target fashion_mnist
fi
mkdir -p "$reports"
exec "$build/bin/fashion_mnist" --batch-size 16 --accum-steps 4 --epochs 20 --lr 1e-3 \
  --metrics "$reports/metrics.jsonl" --memory-report "$reports/memory.json" --trace "$reports/trace.json" \
  --memory-plot "$reports/memory.svg" --save "$reports/weights.safetensors" "$@"
