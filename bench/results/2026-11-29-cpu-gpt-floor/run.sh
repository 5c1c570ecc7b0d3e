#!/usr/bin/env bash
# Reruns this folder's measurements from the repository root (issue 56): the GPT (small, large)
# against PyTorch at 1 thread (pinned to core 0) and 2 threads, the attention op at the large
# config's shape against PyTorch's, the core's FMA peak and every GEMM of the large step timed
# (scripts/sgemm_timing.c). PYTHON: an interpreter with torch; DATA: the folder holding shakespeare/.
set -euo pipefail
out=bench/results/2026-11-29-cpu-gpt-floor
py=${PYTHON:-python3}
data=${DATA:-../shared/data}
{ lscpu | grep -E "Model name|CPU family|Model:"; grep -o "avx[0-9a-z_]*" /proc/cpuinfo | sort -u | tr "\n" " "; echo
  uname -r; git rev-parse --short HEAD; build/bin/gpt --version
  "$py" -c "import torch; print('torch', torch.__version__); print(torch.__config__.parallel_info())"
  echo "load before: $(cat /proc/loadavg)"; } > $out/machine.txt 2>&1
gcc -O2 -mavx2 -mfma $out/fma_peak.c -o /tmp/fma_peak && taskset -c 0 /tmp/fma_peak > $out/fma_peak.txt
for t in 1 2; do
  pin=(); [[ $t == 1 ]] && pin=(taskset -c 0)
  "${pin[@]}" "$py" bench/gpt_compare.py --gpt build/bin/gpt --data $data/shakespeare --out $out/small_t$t --configs small \
    --steps 20 --rounds 3 --threads $t
  "${pin[@]}" "$py" bench/gpt_compare.py --gpt build/bin/gpt --data $data/shakespeare --out $out/large_t$t --configs large \
    --steps 6 --rounds 2 --threads $t
done
rm -f $out/*_t?/*.safetensors $out/*_t?/*.state
taskset -c 0 "$py" bench/ops_vs_pytorch.py --bench-ops build/bin/bench_ops --python "$py" --out $out/attention_t1 \
  --threads 1 --rounds 3 --filter 'families/attention_causal'
gcc -O2 -shared -fPIC scripts/sgemm_timing.c -o /tmp/sgemm_timing.so -ldl
LD_PRELOAD=/tmp/sgemm_timing.so taskset -c 0 build/bin/gpt train --data $data/shakespeare/shakespeare.txt \
  --metrics /tmp/floor_large.jsonl --quiet --context 256 --width 256 --heads 8 --layers 6 --micro-batch 8 \
  --accum-steps 4 --steps 3 --warmup 1 --eval-every 0 --eval-windows 64 --threads 1 --seed 1337 --device cpu \
  --precision fp32 2> $out/sgemm_large_t1.txt > /dev/null
echo "load after: $(cat /proc/loadavg)" >> $out/machine.txt
