#!/usr/bin/env bash
# One measuring session on a lent GPU machine (see bench/README.md, "On the GPU machine"): every test
# binary, the CUDA benchmarks, and the seed experiment (20 epochs, 16 x 4, a test pass after each
# epoch, timed from process start to exit) with CUDA graphs on and off, and with the dataset on the
# host (--data-on host, graphs on: the device peak and the time against device-resident data). If a
# second bundle of an earlier commit is in .gpu-base/, its benchmarks and seed run are measured in
# the same session, interleaved, for side-by-side ratios. `precision` (issue 13): bench_precision on
# CUDA, the seed run in bf16 and fp16, and the CNN at micro-batch 256 for 5 epochs in fp32 and bf16.
# `fused` (issue 12): bench_fused_kernels, the graph families fused against generic, the seed run
# with --kernels fused and generic, and compare.py (2 epochs, 64x1 and 16x4, with PyTorch): several
# minutes, so give it a device call of its own. `planner` (issue 31 on CUDA): --plan-only tables with
# every lever weighed (recompute subsets, --data-on auto, --precision auto) for the MLP and the CNN,
# bench/prediction_table (predicted against measured peaks, 1 to 4096), and training runs under
# budgets that move the choice, down to one the device-resident dataset cannot fit (host chosen).
# Writes logs and JSON under $OUT.
# Usage (on the GPU machine, from the repository root):
#   scripts/gpu_session.sh DATA_DIR [tests|bench|seed|precision|fused|planner|all]
set -uo pipefail
data=${1:?usage: scripts/gpu_session.sh DATA_DIR [tests|bench|seed|precision|fused|planner|all]}
what=${2:-all}
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
status=0
bundles=(.gpu)
[ -f .gpu-base/bundle.tar.xz ] && bundles+=(.gpu-base)
if [[ $what == tests || $what == all ]]; then
  OUT=$OUT bash .gpu/run.sh tests || status=1
fi
if [[ $what == bench || $what == all ]]; then
  for rep in 1 2; do
    for b in "${bundles[@]}"; do
      name=$(basename "$b" | tr -d .)
      bash "$b/run.sh" bench_step_vs_accumulate --benchmark_filter='^cuda/(micro_batch|micro_batch_graph|step_of_64|step_of_64_graph|accumulator_step|optimizer_step)/' \
        --benchmark_min_time=0.3 --benchmark_format=console \
        --benchmark_out="$OUT/bench_${name}_${rep}.json" --benchmark_out_format=json > "$OUT/bench_${name}_${rep}.txt" 2>&1 || status=1
      echo "bench $name rep $rep: $(grep -c manual_time "$OUT/bench_${name}_${rep}.txt") entries"
    done
  done
fi
if [[ $what == seed || $what == all ]]; then
  for b in "${bundles[@]}"; do
    name=$(basename "$b" | tr -d .)
    modes=(on off host)
    [ "$name" = gpu-base ] && modes=(default)
    for g in "${modes[@]}"; do
      flag=()
      case $g in
        on|off) flag=(--graphs "$g" --memory-report "$OUT/seed_${name}_${g}_memory.json") ;;
        host) flag=(--graphs on --data-on host --memory-report "$OUT/seed_${name}_${g}_memory.json") ;;
      esac
      # Timed inside run.sh's environment, so unpacking the bundle is not counted.
      bash "$b/run.sh" bash -c 's=$(date +%s%N); fashion_mnist "$@"; r=$?; e=$(date +%s%N);
        echo "wall_ms $(( (e - s) / 1000000 ))"; exit $r' _ --device cuda --batch-size 16 --accum-steps 4 \
        --epochs 20 --data "$data" "${flag[@]}" --metrics "$OUT/seed_${name}_${g}.jsonl" \
        > "$OUT/seed_${name}_${g}.log" 2>&1 || status=1
      printf 'seed run %s mode=%s: %s ms wall; epoch 20: %s; device peak: %s bytes\n' "$name" "$g" \
        "$(grep -o 'wall_ms [0-9]*' "$OUT/seed_${name}_${g}.log" | cut -d' ' -f2)" \
        "$(grep -A3 'Epoch 20' "$OUT/seed_${name}_${g}.log" | grep Accuracy | tr -s ' ')" \
        "$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["summary"]["peak_bytes"])' \
             "$OUT/seed_${name}_${g}_memory.json" 2>/dev/null)"
    done
  done
fi
if [[ $what == precision || $what == all ]]; then
  bash .gpu/run.sh bench_precision --benchmark_filter='^cuda/' --benchmark_min_time=0.3 --benchmark_format=console \
    --benchmark_out="$OUT/bench_precision.json" --benchmark_out_format=json > "$OUT/bench_precision.txt" 2>&1 || status=1
  runs=("seed bf16 --batch-size 16 --accum-steps 4 --epochs 20 --precision bf16"
        "seed fp16 --batch-size 16 --accum-steps 4 --epochs 20 --precision fp16"
        "cnn fp32 --model cnn --batch-size 256 --epochs 5 --precision fp32"
        "cnn bf16 --model cnn --batch-size 256 --epochs 5 --precision bf16")
  for run in "${runs[@]}"; do
    read -r model p args <<< "$run"
    # shellcheck disable=SC2086  # args is a list of flags
    bash .gpu/run.sh bash -c 's=$(date +%s%N); fashion_mnist "$@"; r=$?; e=$(date +%s%N);
      echo "wall_ms $(( (e - s) / 1000000 ))"; exit $r' _ --device cuda --data "$data" $args \
      --metrics "$OUT/${model}_${p}.jsonl" --memory-report "$OUT/${model}_${p}_memory.json" \
      > "$OUT/${model}_${p}.log" 2>&1 || status=1
    printf '%s %s: %s ms wall; last epoch: %s\n' "$model" "$p" \
      "$(grep -o 'wall_ms [0-9]*' "$OUT/${model}_${p}.log" | cut -d' ' -f2)" \
      "$(grep Accuracy "$OUT/${model}_${p}.log" | tail -1 | tr -s ' ')"
  done
fi
if [[ $what == fused || $what == all ]]; then
  bash .gpu/run.sh bench_fused_kernels --benchmark_min_time=0.2 --benchmark_format=console \
    --benchmark_out="$OUT/bench_fused_kernels.json" --benchmark_out_format=json > "$OUT/bench_fused_kernels.txt" 2>&1 \
    || status=1
  bash .gpu/run.sh bench_step_vs_accumulate \
    --benchmark_filter='^cuda/(micro_batch|micro_batch_fused|micro_batch_graph|micro_batch_graph_fused|step_of_64_graph|step_of_64_graph_fused)/' \
    --benchmark_min_time=0.3 --benchmark_format=console \
    --benchmark_out="$OUT/bench_fused_vs_generic.json" --benchmark_out_format=json > "$OUT/bench_fused_vs_generic.txt" 2>&1 \
    || status=1
  for k in fused generic; do
    bash .gpu/run.sh bash -c 's=$(date +%s%N); fashion_mnist "$@"; r=$?; e=$(date +%s%N);
      echo "wall_ms $(( (e - s) / 1000000 ))"; exit $r' _ --device cuda --batch-size 16 --accum-steps 4 --epochs 20 \
      --graphs on --kernels "$k" --data "$data" --metrics "$OUT/seed_kernels_${k}.jsonl" \
      --memory-report "$OUT/seed_kernels_${k}_memory.json" --save "$OUT/seed_kernels_${k}.safetensors" \
      > "$OUT/seed_kernels_${k}.log" 2>&1 || status=1
    printf 'seed run --kernels %s: %s ms wall; epoch 20: %s\n' "$k" \
      "$(grep -o 'wall_ms [0-9]*' "$OUT/seed_kernels_${k}.log" | cut -d' ' -f2)" \
      "$(grep -A3 'Epoch 20' "$OUT/seed_kernels_${k}.log" | grep Accuracy | tr -s ' ')"
  done
  # compare.py with the bundle's binaries (its --build is the folder holding bin/).
  # One repetition of short benchmarks there: the families above are the careful measurement.
  bash .gpu/run.sh bash -c 'python3 bench/compare.py --device cuda --data "$1" --out-dir "$2" \
      --bench-repetitions 1 --bench-min-time 0.2 \
      --build "$(dirname "$(dirname "$(command -v fashion_mnist)")")"' _ "$data" "$OUT/compare" \
    > "$OUT/compare.log" 2>&1 || status=1
  echo "compare.py: $(grep -c . "$OUT/compare/summary.md" 2>/dev/null) lines in compare/summary.md"
fi
if [[ $what == planner || $what == all ]]; then
  levers=(--recompute auto --precision auto --data-on auto)
  for model in mlp cnn; do
    bash .gpu/run.sh fashion_mnist --device cuda --data "$data" --model "$model" --effective-batch 1024 --plan-only \
      "${levers[@]}" > "$OUT/plan_only_${model}.log" 2>&1 || status=1
  done
  bash .gpu/run.sh prediction_table "$OUT" --device cuda > "$OUT/prediction_table.txt" 2>&1 || status=1
  # The MLP's 60000 images are 47 MB on the device as u8: 40MiB leaves room for no device-resident plan.
  for budget in 400MiB 120MiB 80MiB 40MiB; do
    bash .gpu/run.sh fashion_mnist --device cuda --data "$data" --epochs 2 --effective-batch 4096 \
      --memory-budget "$budget" "${levers[@]}" --metrics "$OUT/planned_mlp_${budget}.jsonl" \
      --memory-report "$OUT/planned_mlp_${budget}_memory.json" > "$OUT/planned_mlp_${budget}.log" 2>&1 || status=1
    printf 'planned mlp %s: %s | %s\n' "$budget" "$(grep -m1 '^planner: micro-batch' "$OUT/planned_mlp_${budget}.log" | cut -c1-160)" \
      "$(grep -m1 '^planner: predicted' "$OUT/planned_mlp_${budget}.log")"
  done
fi
exit $status
