#!/usr/bin/env bash
# Reruns this folder's measurements from the repository root: every op family of bench/op_families.h
# against PyTorch at one thread, on cumulus's AVX-512 and AVX2 paths, for the commit before this
# session's work (BEFORE: a bench_ops of d261b76, e.g. build-before/bench_ops) and for this build
# (build/bin/bench_ops). Each run alternates cumulus and PyTorch round by round, pinned to core 1
# (CORE), so the ratios within a run are what to compare. PYTHON: an interpreter with torch; PARTS
# (default "full close"): every family (ops_*), then the families near 1x with more rounds (close_*).
set -euo pipefail
out=bench/results/2026-11-29-cpu-op-families
py=${PYTHON:-python3}
core=${CORE:-1}
rounds=${ROUNDS:-5}
parts=${PARTS:-full close}
before=${BEFORE:-build-before/bench_ops}
[[ " $parts " == *" full "* ]] && { lscpu | grep -E "Model name|CPU family|Model:|Thread|MHz"; grep -o "avx[0-9a-z_]*" /proc/cpuinfo | sort -u | tr "\n" " "; echo
  uname -r; build/bin/gpt --version; git rev-parse --short HEAD
  "$py" -c "import torch; print('torch', torch.__version__); print(torch.__config__.parallel_info())"
  echo "load before: $(cat /proc/loadavg)"; } > $out/machine.txt 2>&1 || true
if [[ " $parts " == *" full "* && -x "$before" ]]; then
  taskset -c "$core" "$py" bench/ops_vs_pytorch.py --bench-ops "$before" --python "$py" --out $out/ops_before_t1 \
    --threads 1 --capabilities avx512,avx2 --rounds "$rounds"
fi
if [[ " $parts " == *" full "* ]]; then
  taskset -c "$core" "$py" bench/ops_vs_pytorch.py --bench-ops build/bin/bench_ops --python "$py" --out $out/ops_t1 \
    --threads 1 --capabilities avx512,avx2 --rounds "$rounds"
fi
# Then the families near 1x again, with more rounds (the VM's times swing 5-10% between minutes).
close='families/(sum_last|add_bias|cross_entropy_sum|sigmoid|silu|silu_op|softmax_last|gelu_times|linear_mlp|relu)/'
for side in before after; do
  [[ " $parts " == *" close "* ]] || continue
  bin=build/bin/bench_ops
  if [[ $side == before ]]; then bin=$before; [[ -x "$bin" ]] || continue; fi
  taskset -c "$core" "$py" bench/ops_vs_pytorch.py --bench-ops "$bin" --python "$py" --out $out/close_${side}_t1 \
    --threads 1 --capabilities avx512,avx2 --rounds "${CLOSE_ROUNDS:-7}" --filter "$close"
done
echo "load after: $(cat /proc/loadavg)" >> $out/machine.txt
