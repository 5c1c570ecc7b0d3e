#!/bin/sh
# usage: train_small.sh GPT STEPS METRICS
exec "$1" train --data "${DATA:-/work/shared/data/shakespeare/shakespeare.txt}" --init "$INIT" --metrics "$3" --quiet --context 64 --width 128 --heads 4 --layers 4 --micro-batch 8 --accum-steps 4 --steps "$2" --warmup 3 --eval-every 0 --eval-windows 64 --threads 1 --seed 1337 --device cpu --precision fp32
