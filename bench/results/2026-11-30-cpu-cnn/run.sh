#!/bin/bash
# The seed's CNN (fashion_mnist --model cnn) against PyTorch on the CPU, side by side: the build
# before this change (BASE_BIN, BASE_LIB: its fashion_mnist and libcumulus_engine.so), this one
# (NEW_BIN, NEW_LIB) and bench/pytorch/fast_pytorch.py --model cnn, alternated round by round.
# 12800 training samples, 2 epochs (the second is the one compared), 16 x 4 and 64 x 1, one thread
# pinned to core 0 and two threads unpinned.
#   BASE_BIN=... BASE_LIB=... NEW_BIN=build/bin/fashion_mnist NEW_LIB=build/lib PYTHON=... DATA=... OUT=... run.sh
set -eu
ROUNDS=${ROUNDS:-3}
mkdir -p "$OUT"
for threads in 1 2; do
  pin=""; [ "$threads" = 1 ] && pin="taskset -c 0"
  for r in $(seq 1 "$ROUNDS"); do
    for cfg in 16x4 64x1; do
      b=${cfg%x*}; a=${cfg#*x}
      common=(--data "$DATA/fashion-mnist" --epochs 2 --batch-size "$b" --accum-steps "$a" --threads "$threads" --train-limit 12800 --test-limit 320)
      for side in base new; do
        if [ "$side" = base ]; then bin=$BASE_BIN lib=$BASE_LIB; else bin=$NEW_BIN lib=$NEW_LIB; fi
        LD_LIBRARY_PATH=$lib $pin "$bin" --model cnn "${common[@]}" --quiet --metrics "$OUT/${side}_${cfg}_t${threads}_r$r.jsonl" > /dev/null
      done
      OMP_NUM_THREADS=$threads $pin "$PYTHON" "$(dirname "$0")/../../pytorch/fast_pytorch.py" --model cnn --device cpu \
        "${common[@]}" --out "$OUT/pytorch_${cfg}_t${threads}_r$r.json" > /dev/null 2>&1
    done
  done
done
