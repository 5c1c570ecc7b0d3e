#!/usr/bin/env bash
# The few-row loops against OpenBLAS (few_rows_rate.txt), from the repository root after a Release
# build in build/. One thread on core 1, with the kernels the library picks on this CPU
# (OpenBLAS's Haswell kernels on Zen 4: core/threads.cpp).
set -euo pipefail
out=bench/results/2026-11-29-cpu-few-rows
g++ -O2 -std=c++17 -I. $out/few_rows_rate.cpp -o /tmp/few_rows_rate -Lbuild/lib -lcumulus_engine -lopenblas \
  -Wl,-rpath,$PWD/build/lib
{ lscpu | grep -E "Model name|Flags" | sed 's/Flags:.*avx512f.*/Flags: ... avx512f .../'; git rev-parse --short HEAD; } \
  > $out/machine.txt
OPENBLAS_CORETYPE=Haswell OPENBLAS_NUM_THREADS=1 taskset -c 1 /tmp/few_rows_rate > $out/few_rows_rate.txt
