#!/usr/bin/env bash
# Builds cumulus and runs the seed experiment on the best device present: the 784-512-512-10 MLP on
# Fashion-MNIST, micro-batch 16 x 4 accumulation steps, SGD lr 1e-3, 20 epochs, with every report
# written under reports/. Extra arguments go to the app and override these (see --help).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
scripts/install-deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release ${CUMULUS_CMAKE_ARGS:-} >/dev/null
cmake --build build -j "${CUMULUS_JOBS:-2}" --target fashion_mnist
mkdir -p reports
exec build/bin/fashion_mnist --batch-size 16 --accum-steps 4 --epochs 20 --lr 1e-3 \
  --metrics reports/metrics.jsonl --memory-report reports/memory.json --trace reports/trace.json \
  --memory-plot reports/memory.svg --save reports/weights.safetensors "$@"
