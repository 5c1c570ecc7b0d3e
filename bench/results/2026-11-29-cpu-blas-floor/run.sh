#!/usr/bin/env bash
# Reruns this folder's measurements from the repository root (issue 56): every CPU speed target in one
# run (bench/cpu_targets.py: the GPT and the seed MLP against PyTorch at 1 thread, pinned, and 2
# threads, the op families at one thread on both vector paths; into targets/); OpenBLAS's and
# MKL's one-thread SGEMM rates at the large GPT's shapes (blas_rate.c, mkl_rate.py); a few-row
# Linear's products asked in other orientations (orientation.c) under OpenBLAS's Haswell kernels.
# PYTHON: an interpreter with torch; DATA: the folder holding shakespeare/ and fashion-mnist/.
set -euo pipefail
out=bench/results/2026-11-29-cpu-blas-floor
py=${PYTHON:-python3}
data=${DATA:-../shared/data}
gcc -O2 $out/orientation.c -o /tmp/orientation -lopenblas
gcc -O2 $out/blas_rate.c -o /tmp/blas_rate -lopenblas
OPENBLAS_CORETYPE=Haswell OPENBLAS_NUM_THREADS=1 taskset -c 1 /tmp/orientation > $out/orientation.txt
{ OPENBLAS_CORETYPE=Haswell OPENBLAS_NUM_THREADS=1 taskset -c 1 /tmp/blas_rate
  taskset -c 1 "$py" $out/mkl_rate.py; } > $out/blas_rates.txt
"$py" bench/cpu_targets.py --python "$py" --data "$data" --out $out/targets
