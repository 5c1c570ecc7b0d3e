#!/usr/bin/env bash
# Reruns this folder's measurements from the repository root: the op families, the GPT (small and
# large) and the seed MLP against PyTorch at 1 and 2 threads. PYTHON: an interpreter with torch;
# PARTS (default "ops gpt seed") and THREADS (default "1 2") choose what runs.
set -euo pipefail
parts=${PARTS:-ops gpt seed}
threads=${THREADS:-1 2}
out=bench/results/2026-11-28-cpu-threads
py=${PYTHON:-python3}
data=${DATA:-../shared/data}
{ lscpu | grep -E "Model name|CPU family|Model:"; grep -o "avx[0-9a-z_]*" /proc/cpuinfo | sort -u | tr "\n" " "; echo
  uname -r; build/bin/gpt --version; "$py" -c "import torch; print('torch', torch.__version__); print(torch.__config__.parallel_info())"
  echo "load before: $(cat /proc/loadavg)"; } > $out/machine.txt 2>&1
for t in $threads; do
  [[ " $parts " == *" ops "* ]] || continue
  "$py" bench/ops_vs_pytorch.py --bench-ops build/bin/bench_ops --python "$py" --out $out/ops_t$t --threads $t \
    --capabilities avx512,avx2 --rounds 3
done
for t in $threads; do
  [[ " $parts " == *" gpt "* ]] || continue
  "$py" bench/gpt_compare.py --gpt build/bin/gpt --data $data/shakespeare --out $out/gpt_small_t$t --configs small \
    --steps 20 --rounds 3 --threads $t
  "$py" bench/gpt_compare.py --gpt build/bin/gpt --data $data/shakespeare --out $out/gpt_large_t$t --configs large \
    --steps 6 --rounds 2 --threads $t
done
rm -f $out/gpt_*/*_init.safetensors*
mkdir -p $out/seed
for t in $threads; do
  [[ " $parts " == *" seed "* ]] || continue
  for cfg in "64 1" "16 4"; do
    set -- $cfg
    tag=t${t}_${1}x$2
    build/bin/fashion_mnist --data $data/fashion-mnist --epochs 2 --batch-size $1 --accum-steps $2 --threads $t \
      --metrics $out/seed/cumulus_$tag.jsonl --quiet > /dev/null
    "$py" bench/pytorch/fast_pytorch.py --data $data/fashion-mnist --device cpu --batch-size $1 --accum-steps $2 \
      --threads $t --epochs 2 --out $out/seed/fast_pytorch_$tag.json > /dev/null
    "$py" bench/pytorch/seed_pytorch.py --data $data/fashion-mnist --device cpu --batch-size $1 --accum-steps $2 \
      --threads $t --epochs 2 --out $out/seed/seed_pytorch_$tag.json > /dev/null
  done
done
echo "load after: $(cat /proc/loadavg)" >> $out/machine.txt
