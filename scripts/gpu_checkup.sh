#!/usr/bin/env bash
# The CUDA checkup in one run on a lent GPU machine: correctness, the seed run, speed against
# PyTorch, compute-sanitizer, the GPT's tokens/s, the planner, and 16-bit precision (the seed run in
# bf16 and fp16, the CNN), in that order of value.
# Each phase runs under its own time cap and all under one budget (CHECKUP_BUDGET_S, 480 s), so a
# first call does what matters in about 8 minutes and what does not fit is listed as skipped.
# Everything but weights lands in $OUT/checkup.tar.gz (repacked after every phase: the device tool
# brings back only 8 files of at most 16 MiB, and a run cut short keeps what it finished) and
# $OUT/summary.txt.
#
# On the GPU machine, inside the bundle's environment (../shared/gpu/bundle.sh; bin/ on PATH):
#   bash .gpu/run.sh bash scripts/gpu_checkup.sh FASHION_MNIST_DIR SHAKESPEARE_DIR [PHASE...]
# PHASE: tests seed speed sanitize gpt planner precision (default: all of them, in that order).
# Rehearsed on a machine without a GPU with the same command: CUDA test cases skip and every
# --device cuda run fails at once, which exercises each phase's plumbing. CHECKUP_DEVICE=cpu runs
# the device phases on the CPU instead, CHECKUP_GPT_CONFIG=small shrinks the GPT (bench/gpt_compare.py).
set -uo pipefail
usage="usage: gpu_checkup.sh FASHION_MNIST_DIR SHAKESPEARE_DIR [tests|seed|speed|sanitize|gpt|planner|precision ...]"
fashion=${1:?$usage}
shakespeare=${2:?$usage}
shift 2
phases=("$@")
[ ${#phases[@]} -gt 0 ] || phases=(tests seed speed sanitize gpt planner precision)
bin=$(dirname "$(command -v fashion_mnist)") || { echo "gpu_checkup: fashion_mnist is not on PATH"; exit 2; }
device=${CHECKUP_DEVICE:-cuda}
gpt_config=${CHECKUP_GPT_CONFIG:-gpt2s}
budget=${CHECKUP_BUDGET_S:-480}
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
work=$(mktemp -d)/checkup
mkdir -p "$work"
summary=$work/summary.txt
start=$SECONDS

# run.sh puts the system's library folder on LD_LIBRARY_PATH; a Python with its own libpython (pyenv)
# would load the system's instead and lose its site-packages (torch): its own folder goes first.
pylib=$(python3 -c 'import sysconfig; print(sysconfig.get_config_var("LIBDIR") or "")' 2>/dev/null)
py=(env "LD_LIBRARY_PATH=$pylib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" python3)

say() { echo "$*" | tee -a "$summary"; }
# A phase step's time cap: its own, or what is left of the budget when that is less.
cap() {
  local left=$((budget - (SECONDS - start)))
  ((left < $1)) && echo "$left" || echo "$1"
}
pack() {
  cp "$summary" "$OUT/summary.txt"
  tar -C "$(dirname "$work")" --exclude='*.safetensors' -czf "$OUT/checkup.tar.gz" checkup
}
# NAME LIMIT CMD...: CMD under a time limit, its output in $work/NAME.log; says its exit and wall time.
timed() {
  local name=$1 limit=$2
  shift 2
  if ((limit <= 0)); then
    say "$name: skipped (no time left in the ${budget} s budget)"
    return 124
  fi
  local t0 rc
  t0=$(date +%s%N)
  timeout --kill-after=5 "$limit" "$@" > "$work/$name.log" 2>&1
  rc=$?
  say "$name: exit $rc, $((($(date +%s%N) - t0) / 1000000)) ms$( ((rc == 124)) && echo " (past its $limit s cap)")"
  return $rc
}

# One test binary, CUDA cases only: the CPU instances of the device-parameterized suites (named
# .../cpu) and the CPU reference checks of the op cases ran in CI. Other tests run whole.
run_test_binary() {
  local t=$1 limit=$2 dir=$3 filter='-*/cpu'
  [ "$t" = test_op_cases ] && filter='*CudaMatchesCpu*'
  timeout --kill-after=5 "$limit" "$t" --gtest_brief=1 --gtest_filter="$filter" \
    --gtest_output="json:$dir/$t.json" > "$dir/$t.log" 2>&1
  echo "$t exit $?"
}
export -f run_test_binary

phase_tests() {
  local dir=$work/tests limit
  mkdir -p "$dir"
  limit=$(cap 240)
  ((limit > 0)) || { say "tests: skipped (no time left)"; return; }
  find "$bin" -maxdepth 1 -name 'test_*' -printf '%f\n' | sort |
    xargs -P 8 -I{} bash -c 'run_test_binary "$@"' _ {} "$limit" "$dir" | sort > "$dir/exits.txt"
  "${py[@]}" - "$dir" <<'PY' | tee -a "$summary"
import glob, json, os, sys
d = sys.argv[1]
ran = passed = skipped = 0
failures = []
for line in open(os.path.join(d, "exits.txt")):
    name, _, code = line.split()
    path = os.path.join(d, name + ".json")
    if not os.path.exists(path):
        tail = open(os.path.join(d, name + ".log"), errors="replace").read()[-400:]
        failures.append("%s: exit %s, no report (124: past its cap)\n    %s" % (name, code, tail.replace("\n", "\n    ")))
        continue
    for suite in json.load(open(path))["testsuites"]:
        for case in suite["testsuite"]:
            ran += 1
            if case.get("result") == "SKIPPED" or case.get("status") == "NOTRUN":
                skipped += 1
            elif case.get("failures"):
                msg = " | ".join(f["failure"].replace("\n", " ")[:300] for f in case["failures"][:3])
                failures.append("%s: %s.%s: %s" % (name, suite["name"], case["name"], msg))
            else:
                passed += 1
print("tests: %d cases ran, %d passed, %d skipped, %d failed" % (ran, passed, skipped, len(failures)))
for f in failures:
    print("  FAILED " + f)
PY
}

# NAME LIMIT FLAGS...: a fashion_mnist run on the device with its metrics, memory report and
# weights kept under NAME; says its last line of metrics.
app_run() {
  local name=$1 limit=$2
  shift 2
  timed "$name" "$limit" fashion_mnist --device "$device" --data "$fashion" --metrics "$work/$name.jsonl" \
    --memory-report "$work/${name}_memory.json" --save "$work/$name.safetensors" "$@"
  [ -s "$work/$name.jsonl" ] && say "  last epoch: $(tail -n 1 "$work/$name.jsonl" | cut -c1-300)"
}

# The seed run (20 epochs of 16 x 4, a test pass after each) with graphs and the fused kernels,
# the generic ones (today's default, until the fused ones are measured), without graphs, and with
# the dataset on the host (the staging ring); timed from process start to exit. Then whether the
# fused and generic runs' weights agree.
phase_seed() {
  local seed=(--batch-size 16 --accum-steps 4 --epochs 20)
  app_run seed_fused "$(cap 90)" "${seed[@]}" --graphs on --kernels fused
  app_run seed_generic "$(cap 90)" "${seed[@]}" --graphs on --kernels generic
  app_run seed_eager "$(cap 90)" "${seed[@]}" --graphs off
  app_run seed_host "$(cap 90)" "${seed[@]}" --graphs on --data-on host
  "${py[@]}" - "$work/seed_fused.safetensors" "$work/seed_generic.safetensors" <<'PY' 2>&1 | tee -a "$summary"
import json, struct, sys
import numpy as np
def tensors(path):  # safetensors: an 8-byte header length, the JSON header, then the raw data
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    return {k: np.frombuffer(data[v["data_offsets"][0]:v["data_offsets"][1]], dtype=np.float32)
            for k, v in header.items() if k != "__metadata__" and v["dtype"] == "F32"}
try:
    a, b = (tensors(p) for p in sys.argv[1:3])
except OSError as e:
    sys.exit("  weights: not compared (%s)" % e)
diff = max(float(np.max(np.abs(a[k] - b[k]))) for k in a)
print("  weights, fused kernels against generic: %d tensors, largest difference %.3g" % (len(a), diff))
PY
}

# Speed: bench_step_vs_accumulate's CUDA families (generic and fused, eager and graphs), then
# compare.py's app runs against PyTorch eager and PyTorch with CUDA graphs (its benchmarks are the
# families above).
phase_speed() {
  timed bench_step "$(cap 150)" bench_step_vs_accumulate \
    --benchmark_filter='^cuda/(micro_batch|micro_batch_fused|micro_batch_graph|micro_batch_graph_fused|step_of_64|step_of_64_fused|step_of_64_graph|step_of_64_graph_fused|accumulator_step)/' \
    --benchmark_min_time=0.2 --benchmark_out="$work/bench_step.json" --benchmark_out_format=json
  grep -E '^cuda/(micro_batch_graph(_fused)?/accumulate/16|step_of_64_graph(_fused)?/(64x1|16x4))/' \
    "$work/bench_step.log" | tr -s ' ' | tee -a "$summary"
  timed bench_fused_kernels "$(cap 60)" bench_fused_kernels --benchmark_min_time=0.1 \
    --benchmark_out="$work/bench_fused_kernels.json" --benchmark_out_format=json
  timed compare "$(cap 180)" "${py[@]}" bench/compare.py --device "$device" --data "$fashion" --out-dir "$work/compare" \
    --build "$(dirname "$bin")" --skip-bench
  [ -f "$work/compare/summary.md" ] && cat "$work/compare/summary.md" >> "$summary"
}

# compute-sanitizer's memcheck and racecheck on the fused-op, graph and data tests' CUDA cases, all
# six at once (16 CPU cores on that machine).
phase_sanitize() {
  local cs t tool limit
  cs=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  [ -x "$cs" ] || { say "sanitize: no compute-sanitizer on this machine"; return; }
  limit=$(cap 120)
  for t in test_fused_mlp test_graphs test_data; do
    for tool in memcheck racecheck; do
      timed "sanitize_${tool}_$t" "$limit" "$cs" --tool "$tool" --error-exitcode 9 "$t" --gtest_brief=1 \
        --gtest_filter='*/cuda:*Cuda*:*Graph*' &
    done
  done
  wait
  grep -h -E '^=+ (ERROR SUMMARY|RACECHECK SUMMARY)' "$work"/sanitize_*.log | sort | uniq -c | tee -a "$summary"
}

# The GPT on the GPU against its PyTorch twin with SDPA: tokens/s in f32 (no TF32) and bf16, then
# bf16 against torch.compile.
phase_gpt() {
  local p
  for p in fp32 bf16; do
    timed "gpt_$p" "$(cap 150)" "${py[@]}" bench/gpt_compare.py --gpt "$bin/gpt" --data "$shakespeare" \
      --out "$work/gpt_$p" --configs "$gpt_config" --steps 6 --rounds 1 --eval-windows 16 --device "$device" --precision "$p"
    [ -f "$work/gpt_$p/summary.md" ] && tail -n 1 "$work/gpt_$p/summary.md" | sed "s/^/  $p: /" | tee -a "$summary"
  done
  timed gpt_bf16_compile "$(cap 180)" "${py[@]}" bench/gpt_compare.py --gpt "$bin/gpt" --data "$shakespeare" \
    --out "$work/gpt_bf16_compile" --configs "$gpt_config" --steps 6 --rounds 1 --eval-windows 16 --device "$device" \
    --precision bf16 --compile
  [ -f "$work/gpt_bf16_compile/summary.md" ] && tail -n 1 "$work/gpt_bf16_compile/summary.md" | sed "s/^/  bf16 compiled: /" |
    tee -a "$summary"
}

# The planner on CUDA: --plan-only with every lever for both models, and predicted against
# measured peaks (bench/prediction_table).
phase_planner() {
  local model
  for model in mlp cnn; do
    timed "plan_only_$model" "$(cap 60)" fashion_mnist --device "$device" --data "$fashion" --model "$model" \
      --effective-batch 1024 --plan-only --recompute auto --precision auto --data-on auto
  done
  timed prediction_table "$(cap 120)" prediction_table "$work" --device "$device"
  tail -n 20 "$work/prediction_table.log" >> "$summary"
}

# 16 bits: the seed run in bf16 and fp16 (loss scaling), the CNN at micro-batch 256 for one epoch in
# fp32 and bf16, and bench_precision's CUDA cases.
phase_precision() {
  local p
  for p in bf16 fp16; do
    app_run "seed_$p" "$(cap 90)" --batch-size 16 --accum-steps 4 --epochs 20 --precision "$p"
  done
  for p in fp32 bf16; do
    app_run "cnn_$p" "$(cap 120)" --model cnn --batch-size 256 --epochs 1 --precision "$p"
  done
  timed bench_precision "$(cap 60)" bench_precision --benchmark_filter='^cuda/' --benchmark_min_time=0.1 \
    --benchmark_out="$work/bench_precision.json" --benchmark_out_format=json
}

say "checkup $(date -u +%FT%TZ), commit $(cat "$bin/../COMMIT" 2>/dev/null || git rev-parse HEAD 2>/dev/null)," \
  "device $device, phases: ${phases[*]}, budget $budget s"
if command -v nvidia-smi > /dev/null; then
  say "$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | head -n 1)," \
    "$(nvidia-smi | grep -o 'CUDA Version: [0-9.]*')"
else
  say "no nvidia-smi: no NVIDIA driver here"
fi
for phase in "${phases[@]}"; do
  case $phase in
    tests | seed | speed | sanitize | gpt | planner | precision) ;;
    *) say "gpu_checkup: unknown phase '$phase'"; continue ;;
  esac
  say "== $phase (at $((SECONDS - start)) s)"
  "phase_$phase"
  pack
done
say "done at $((SECONDS - start)) s"
pack
