#!/bin/bash
# Op profiles of the GPT (small and large) at 1 and 2 threads, before (BASE: a build of the commit
# before, its bin/ and lib/) and after (NEW: this build), alternated round by round.
#   BASE=/tmp/base NEW=build DATA=/work/shared/data bash run.sh
set -eu
here=$(cd "$(dirname "$0")" && pwd)
small="--context 64 --width 128 --heads 4 --layers 4 --micro-batch 8 --accum-steps 4 --steps 30 --warmup 2"
large="--context 256 --width 256 --heads 8 --layers 6 --micro-batch 8 --accum-steps 4 --steps 6 --warmup 1"
{ date -u; grep -m1 'model name' /proc/cpuinfo; grep -m1 -E '^cpu family' /proc/cpuinfo; grep -m1 -E '^model\s' /proc/cpuinfo;
  nproc; uptime; } > "$here/machine.txt"
for r in 1 2 3; do
  for side in before after; do
    if [ $side = before ]; then bin=$BASE/bin; lib=$BASE/lib; else bin=$NEW/bin; lib=$NEW/lib; fi
    for cfg in small large; do
      for t in 1 2; do
        ((t == 1 && r > 1)) && continue  # one thread: no helpers, the same code before and after
        eval "args=\$$cfg"
        LD_LIBRARY_PATH=$lib "$bin/gpt" train --data "$DATA/shakespeare" $args --eval-every 0 --eval-windows 4 \
          --threads $t --quiet --op-profile "$here/profiles/${cfg}_t${t}_${side}_$r.json" > /dev/null
      done
    done
  done
done
uptime >> "$here/machine.txt"
