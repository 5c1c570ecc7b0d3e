#!/usr/bin/env bash
# Reruns this folder's measurements from the repository root (issue 56): the GPT (small, large) and
# the seed MLP (16 x 4, 64 x 1) against PyTorch at 1 thread (pinned to core 1) and 2 threads, each
# side by side in one run with alternated rounds; OpenBLAS's and MKL's one-thread SGEMM rates at
# the large GPT's shapes (blas_rate.c, mkl_rate.py); a few-row Linear's products asked in other
# orientations (orientation.c) under OpenBLAS's Haswell kernels. PYTHON: an interpreter with torch;
# DATA: the folder holding shakespeare/ and fashion-mnist/; PARTS: any of "blas gpt seed".
set -euo pipefail
out=bench/results/2026-11-29-cpu-blas-floor
py=${PYTHON:-python3}
data=${DATA:-../shared/data}
parts=${PARTS:-blas gpt seed}
{ lscpu | grep -E "Model name|CPU family|Model:"; grep -o "avx[0-9a-z_]*" /proc/cpuinfo | sort -u | tr "\n" " "; echo
  uname -r; git rev-parse --short HEAD; build/bin/gpt --version
  "$py" -c "import torch; print('torch', torch.__version__); print(torch.__config__.parallel_info())"
  echo "load before: $(cat /proc/loadavg)"; } > $out/machine.txt 2>&1
if [[ $parts == *blas* ]]; then
  gcc -O2 $out/orientation.c -o /tmp/orientation -lopenblas
  gcc -O2 $out/blas_rate.c -o /tmp/blas_rate -lopenblas
  OPENBLAS_CORETYPE=Haswell OPENBLAS_NUM_THREADS=1 taskset -c 1 /tmp/orientation > $out/orientation.txt
  { OPENBLAS_CORETYPE=Haswell OPENBLAS_NUM_THREADS=1 taskset -c 1 /tmp/blas_rate
    taskset -c 1 "$py" $out/mkl_rate.py; } > $out/blas_rates.txt
fi
for t in 1 2; do
  pin=(); [[ $t == 1 ]] && pin=(taskset -c 1)
  if [[ $parts == *gpt* ]]; then
    "${pin[@]}" "$py" bench/gpt_compare.py --gpt build/bin/gpt --data $data/shakespeare --out $out/gpt_small_t$t \
      --configs small --steps 20 --rounds 3 --threads $t
    "${pin[@]}" "$py" bench/gpt_compare.py --gpt build/bin/gpt --data $data/shakespeare --out $out/gpt_large_t$t \
      --configs large --steps 6 --rounds 2 --threads $t
    rm -f $out/gpt_*_t$t/*.safetensors $out/gpt_*_t$t/*.state
  fi
  if [[ $parts == *seed* ]]; then
    mkdir -p $out/seed
    for r in 1 2 3; do
      for cfg in "16 4" "64 1"; do
        set -- $cfg
        tag=r${r}_t${t}_${1}x$2
        "${pin[@]}" build/bin/fashion_mnist --data $data/fashion-mnist --epochs 2 --batch-size $1 --accum-steps $2 \
          --threads $t --metrics $out/seed/cumulus_$tag.jsonl --quiet > /dev/null
        "${pin[@]}" "$py" bench/pytorch/fast_pytorch.py --data $data/fashion-mnist --device cpu --batch-size $1 \
          --accum-steps $2 --threads $t --epochs 2 --out $out/seed/fast_pytorch_$tag.json > /dev/null 2>&1
      done
    done
  fi
done
echo "load after: $(cat /proc/loadavg)" >> $out/machine.txt
[[ $parts == *seed* ]] && "$py" $out/seed_table.py $out/seed > $out/seed/table.md
exit 0
