#!/usr/bin/env bash
# Reruns this folder's figures from the repository root: AdamW's update per parameter through the
# library (Optimizer::step) with the state on the device and on the host, beside PyTorch's
# foreach AdamW, two alternating rounds, one thread, pinned to one core. PYTHON: a Python with torch.
set -euo pipefail
out=bench/results/2026-11-29-cpu-host-state
py=${PYTHON:-python3}
for round in 1 2; do
  taskset -c 0 build/bin/bench_optim_update --benchmark_filter="cpu/step" --benchmark_repetitions=5 \
    --benchmark_report_aggregates_only=true --benchmark_format=json > $out/bench_step_round$round.json
  taskset -c 0 "$py" bench/pytorch/optim_update.py --threads 1 > $out/pytorch_round$round.txt
done
