#!/usr/bin/env bash
# Reruns this folder's numbers from the repository root (issue 57):
#  1. the GPT's per-rank memory and step time under ZeRO stages 0, 1, 2 (and stage 2 with the state
#     on the host or in 8 bits) on two MPI ranks, 5 rounds of every combination, round by round
#     (bench/gpt_state_levers.py: the app's default 0.8 M-parameter model, 8 windows of 64 a
#     micro-batch, 4 micro-batches a step over both ranks, 20 steps, one thread a rank);
#  2. past the model-state wall: a 75.7 M-parameter GPT (width 1024, 6 blocks, context 64) on the
#     shakespeare text under a per-rank --memory-budget of 560 MiB, less than half its weights,
#     gradients and AdamW state (1155.6 MiB); first without the state levers (the planner
#     refuses), then with --zero auto --optimizer-state auto (the planner's choice trains 4 steps).
# DATA: the shakespeare folder; the runs' own files stay in WORK, the summaries are copied here.
set -euo pipefail
here=bench/results/2026-11-29-cpu-zero2
work=${WORK:-$(mktemp -d)}
data=${DATA:-../shared/data/shakespeare}
root=$([ "$(id -u)" = 0 ] && echo --allow-run-as-root || true)
{ lscpu | grep -E 'Model name|CPU family|^Model:'; uname -r; build/bin/gpt --version; } > "$here/machine.txt"
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)" >> "$here/machine.txt"

python3 bench/gpt_state_levers.py --gpt build/bin/gpt --data "$data" --out "$work/levers" --steps 20 --rounds 5 \
  --only 2:0:device:32,2:1:device:32,2:2:device:32,2:2:host:32,2:2:device:8
cp "$work/levers/summary.json" "$work/levers/summary.md" "$here/"

wall=(mpirun $root --oversubscribe --bind-to none -np 2 build/bin/gpt train --data "$data" --context 64 --width 1024
      --heads 16 --layers 6 --effective-batch 8 --steps 4 --warmup 1 --eval-every 0 --threads 1
      --memory-budget 560MiB)
"${wall[@]}" --zero 0 > "$here/wall_refused.txt" 2>&1 && { echo "the run without levers was not refused"; exit 1; }
"${wall[@]}" --zero auto --optimizer-state auto --memory-report "$work/wall.json" > "$here/wall_trained.txt" 2>&1
cp "$work/wall.json" "$here/wall_rank0.json"
cp "$work/wall.json.rank1" "$here/wall_rank1.json"
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)" >> "$here/machine.txt"
