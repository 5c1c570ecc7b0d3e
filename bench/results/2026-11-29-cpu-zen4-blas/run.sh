#!/usr/bin/env bash
# Reruns this folder's measurements from the repository root: the GPT (small, large) and the seed
# MLP against PyTorch at 1 and 2 threads, with the OpenBLAS kernels cumulus now picks on Zen 4
# (Haswell: `new_*`) and with those OpenBLAS picks itself (OPENBLAS_CORETYPE=Cooperlake: `old_*`).
# PYTHON: an interpreter with torch; DATA: the folder holding shakespeare/ and fashion-mnist/;
# PARTS (default "gpt seed") chooses what runs. ab_cumulus.txt: /tmp/ab2.py's paired runs (README).
set -euo pipefail
out=bench/results/2026-11-29-cpu-zen4-blas
py=${PYTHON:-python3}
data=${DATA:-../shared/data}
{ lscpu | grep -E "Model name|CPU family|Model:"; grep -o "avx[0-9a-z_]*" /proc/cpuinfo | sort -u | tr "\n" " "; echo
  uname -r; build/bin/gpt --version; "$py" -c "import torch; print('torch', torch.__version__); print(torch.__config__.parallel_info())"
  echo "load before: $(cat /proc/loadavg)"; } > $out/machine.txt 2>&1
run_gpt() {  # TAG: new (cumulus's pick) or old (OpenBLAS's own)
  for t in 1 2; do
    "$py" bench/gpt_compare.py --gpt build/bin/gpt --data $data/shakespeare --out $out/${1}_small_t$t --configs small \
      --steps 20 --rounds 3 --threads $t
    "$py" bench/gpt_compare.py --gpt build/bin/gpt --data $data/shakespeare --out $out/${1}_large_t$t --configs large \
      --steps 6 --rounds 2 --threads $t
  done
}
run_seed() {
  mkdir -p $out/seed
  for t in 1 2; do
    for cfg in "64 1" "16 4"; do
      set -- $cfg
      tag=t${t}_${1}x$2
      build/bin/fashion_mnist --data $data/fashion-mnist --epochs 2 --batch-size $1 --accum-steps $2 --threads $t \
        --metrics $out/seed/cumulus_new_$tag.jsonl --quiet > /dev/null
      OPENBLAS_CORETYPE=Cooperlake build/bin/fashion_mnist --data $data/fashion-mnist --epochs 2 --batch-size $1 \
        --accum-steps $2 --threads $t --metrics $out/seed/cumulus_old_$tag.jsonl --quiet > /dev/null
      "$py" bench/pytorch/fast_pytorch.py --data $data/fashion-mnist --device cpu --batch-size $1 --accum-steps $2 \
        --threads $t --epochs 2 --out $out/seed/fast_pytorch_$tag.json > /dev/null
      "$py" bench/pytorch/seed_pytorch.py --data $data/fashion-mnist --device cpu --batch-size $1 --accum-steps $2 \
        --threads $t --epochs 2 --out $out/seed/seed_pytorch_$tag.json > /dev/null
    done
  done
}
parts=${PARTS:-gpt seed}
if [[ " $parts " == *" gpt "* ]]; then
  run_gpt new
  OPENBLAS_CORETYPE=Cooperlake run_gpt old
fi
[[ " $parts " == *" seed "* ]] && run_seed
rm -f $out/*/*_init.safetensors*
echo "load after: $(cat /proc/loadavg)" >> $out/machine.txt
