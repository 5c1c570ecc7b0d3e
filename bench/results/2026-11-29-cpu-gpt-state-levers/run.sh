#!/usr/bin/env bash
# Reruns this folder's table from the repository root: the GPT (the app's default 0.8 M-parameter
# model, 8 windows of 64 a micro-batch, 4 micro-batches a step over all ranks, 20 steps, one thread a
# rank) under each optimizer-state lever, on 1 and 2 MPI ranks. DATA: the shakespeare folder; the
# runs' own files (weights, reports) stay in WORK, the summaries are copied here.
set -euo pipefail
here=bench/results/2026-11-29-cpu-gpt-state-levers
work=${WORK:-$(mktemp -d)}
python3 bench/gpt_state_levers.py --gpt build/bin/gpt --data "${DATA:-../shared/data/shakespeare}" --out "$work" --steps 20
cp "$work"/summary.json "$work"/summary.md "$here"/
