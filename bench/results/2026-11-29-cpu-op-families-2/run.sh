#!/usr/bin/env bash
# Reruns this folder's measurements from the repository root: every op family of bench/op_families.h
# against PyTorch at one thread, on cumulus's AVX-512 and AVX2 paths, PyTorch at the matched
# capability (--pytorch-capability matched: ATEN_CPU_CAPABILITY=avx512 / avx2; the avx512 run is also
# PyTorch's default on this CPU, so summary_pytorch_default.md compares each path with it), for the
# branch's starting commit (BEFORE: a bench_ops of 47a6ccf with its own engine library, e.g. the
# wrapper build-before/bench_ops) and for this build (build/bin/bench_ops); then the families this
# session worked on with more rounds (close_*), then every family at two threads (ops_t2, no pinning).
# Each run alternates cumulus and PyTorch round by round, pinned to core 1 (CORE), so the ratios
# within a run are what to compare. PYTHON: an interpreter with torch. PARTS (default "full close t2").
set -euo pipefail
out=bench/results/2026-11-29-cpu-op-families-2
py=${PYTHON:-python3}
core=${CORE:-1}
rounds=${ROUNDS:-5}
parts=${PARTS:-full close t2}
before=${BEFORE:-build-before/bench_ops}
pin="taskset -c $core"
run() {  # run PIN BIN OUT [options...]; PIN: "$pin" or "" (both cores)
  local p=$1 bin=$2 dir=$3
  shift 3
  $p "$py" bench/ops_vs_pytorch.py --bench-ops "$bin" --python "$py" --out "$out/$dir" --capabilities avx512,avx2 \
    --pytorch-capability matched "$@"
}
if [[ " $parts " == *" full "* ]]; then
  { lscpu; uname -r; git rev-parse --short HEAD
    "$py" -c "import torch; print('torch', torch.__version__, torch.backends.cpu.get_cpu_capability())"
    echo "load before: $(cat /proc/loadavg)"; } > $out/machine.txt 2>&1 || true
  if [[ -x "$before" ]]; then run "$pin" "$before" ops_before_t1 --threads 1 --rounds "$rounds"; fi
  run "$pin" build/bin/bench_ops ops_t1 --threads 1 --rounds "$rounds"
fi
close='families/(sum_last|embedding|sigmoid|silu|silu_op|softmax_last|cross_entropy_sum)/forward/'
if [[ " $parts " == *" close "* ]]; then
  for side in before after; do
    bin=build/bin/bench_ops
    if [[ $side == before ]]; then bin=$before; [[ -x "$bin" ]] || continue; fi
    run "$pin" "$bin" close_${side}_t1 --threads 1 --rounds "${CLOSE_ROUNDS:-7}" --filter "$close"
  done
fi
if [[ " $parts " == *" t2 "* ]]; then  # both cores: only when nothing else runs
  echo "load before t2: $(cat /proc/loadavg)" >> $out/machine.txt
  run "" build/bin/bench_ops ops_t2 --threads 2 --rounds 3
fi
echo "load after: $(cat /proc/loadavg)" >> $out/machine.txt
