#!/usr/bin/env bash
# Reruns this folder's table from the repository root: the GPT (the app's default 0.8 M-parameter
# model, 8 windows of 64 a micro-batch, 4 micro-batches a step over all ranks, 20 steps, one thread a
# rank) under each optimizer-state lever, on 1 and 2 MPI ranks. DATA: the shakespeare folder.
set -euo pipefail
python3 bench/gpt_state_levers.py --gpt build/bin/gpt --data "${DATA:-../shared/data/shakespeare}" \
  --out bench/results/2026-11-29-cpu-gpt-state-levers/run --steps 20
