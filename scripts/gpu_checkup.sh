#!/usr/bin/env bash
# The CUDA checkup in one call on a lent GPU machine (issue 58), its phases in order of value:
#   probe      20 s  GPU, driver, every library, the engine runs a CUDA case, compute-sanitizer and
#                    PyTorch work; stops the checkup (exit 3) when the GPU, a library or the engine fails
#   tests      90 s  every test binary's CUDA cases (scripts/gpu_cases.py), 8 binaries at a time, one
#                    deadline for the whole phase; CPU-only binaries and CPU cases ran in CI; the
#                    attention and Linear op cases again on the fallback CUDA paths (test_op_cases_fallback)
#   gpt       285 s  the attention op at GPT-2 small's shape against PyTorch's SDPA, bf16 and f32 (f32
#                    also on the opt-in tiled kernels); the GPT at GPT-2 small's shape
#                    (bench/gpt_compare.py gpt2s), bf16 then fp32, against the PyTorch twin eager
#                    (SDPA, fused AdamW) and torch.compile, bf16 also on the fallback CUDA paths (our
#                    attention, 16-bit Linears through an f32 scratch: cumulus_fallback), fp32 also
#                    on the tiled attention kernels (cumulus_tiled);
#                    then the losses over 20 steps against cumulus on the CPU from the same weights (`parity`)
#   sanitize   55 s  compute-sanitizer memcheck and racecheck on the CUDA cases of attention, the
#                    GPT, layer norm, embedding, reductions, the fused MLP, graphs and data, all at once
#   seed       30 s  the seed run with the default and the generic kernels, graphs on, timed from
#                    process start to exit; whether their weights agree
#   speed      70 s  the step microbenchmarks, then the app against PyTorch eager and with CUDA
#                    graphs (bench/compare.py, 16 x 4, 2 epochs)
#   planner    60 s  --plan-only for the MLP and the CNN, predicted against measured peaks
#   precision  40 s  the seed run in bf16 and fp16, the CNN in fp32 and bf16, bench_precision
#   profile   220 s  our op profile of GPT-2 small's step (fp32 and bf16: gpt --op-profile), Nsight
#                    Compute on our tiled f32 attention kernels (throughputs, occupancy, stalls, shared
#                    memory), then the time of every kernel of one GPT-2-small micro-batch, fp32 then
#                    bf16, then of about 30 of the seed's micro-batches of 16, summed by kernel: where
#                    the step goes (past the default budget: asked for by naming the phase or raising
#                    CHECKUP_BUDGET_S)
# Each phase has its cap (CHECKUP_CAP_<PHASE> overrides one) and all share one budget
# (CHECKUP_BUDGET_S, 480 s): a phase never starts a step past its cap or the budget, and what did not
# fit is said as skipped. Results are kept as they come: every step appends to $OUT/summary.txt and
# repacks $OUT/checkup.tar.gz (logs trimmed, no weights), so a call cut at any second returns what
# it finished. Two files come back, well under the device tool's 8.
#
# On the GPU machine, inside the bundle's environment (../shared/gpu/bundle.sh, staged with the data
# by scripts/gpu_preflight.sh):
#   bash .gpu/run.sh bash scripts/gpu_checkup.sh .gpu/data/fashion-mnist .gpu/data/shakespeare [PHASE...]
# Rehearsal on a machine without a GPU (scripts/gpu_preflight.sh does it): CHECKUP_DEVICE=cpu runs
# every phase on the CPU with small shapes (CHECKUP_SMALL=1: 2 epochs of 2,048 samples, the GPT's
# `small` config) and every cap doubled (CHECKUP_CAP_FACTOR=2: 2 shared cores), compute-sanitizer
# replaced by running the cases plainly when it is absent.
# CHECKUP_PYTHON: the Python with torch (default python3).
set -euo pipefail
usage="usage: gpu_checkup.sh FASHION_MNIST_DIR SHAKESPEARE_DIR [PHASE...]
  PHASE: probe tests gpt sanitize seed speed planner precision profile (default: all, in that order)"
if [ $# -lt 2 ]; then
  echo "$usage" >&2
  exit 2
fi
fashion=$(cd "$1" && pwd) || { echo "gpu_checkup: no folder $1" >&2; exit 2; }
shakespeare=$(cd "$2" && pwd) || { echo "gpu_checkup: no folder $2" >&2; exit 2; }
shift 2
all_phases=(probe tests gpt sanitize seed speed planner precision profile)
phases=("$@")
[ ${#phases[@]} -gt 0 ] || phases=("${all_phases[@]}")
for phase in "${phases[@]}"; do
  case " ${all_phases[*]} " in *" $phase "*) ;; *) echo "gpu_checkup: unknown phase '$phase'; $usage" >&2; exit 2 ;; esac
done
device=${CHECKUP_DEVICE:-cuda}
case $device in cuda | cpu) ;; *) echo "gpu_checkup: CHECKUP_DEVICE is cuda or cpu, not '$device'" >&2; exit 2 ;; esac
small=${CHECKUP_SMALL:-$([ "$device" = cpu ] && echo 1 || echo 0)}
budget=${CHECKUP_BUDGET_S:-480}
# The rehearsal's machine (2 shared cores) is slower than the GPU machine's 16 for the CPU work of
# a step (process start, PyTorch's import, the data): it doubles every cap unless told otherwise.
factor=${CHECKUP_CAP_FACTOR:-$( ((small)) && echo 2 || echo 1)}
declare -A cap_of=([probe]=20 [tests]=90 [gpt]=285 [sanitize]=55 [seed]=30 [speed]=70 [planner]=60 [precision]=40
  [profile]=220)
for phase in "${all_phases[@]}"; do
  var=CHECKUP_CAP_${phase^^}
  cap_of[$phase]=${!var:-${cap_of[$phase]}}
done
fm=$(command -v fashion_mnist) || { echo "gpu_checkup: fashion_mnist is not on PATH (run it through .gpu/run.sh)" >&2; exit 2; }
bin=$(dirname "$fm")
root=$(cd "$(dirname "$0")/.." && pwd)  # the checkout: tests/ sources, bench/ scripts
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
base=$(mktemp -d "${TMPDIR:-/tmp}/checkup.XXXXXX")
[ "${CHECKUP_KEEP_WORK:-0}" = 1 ] || trap 'rm -rf "$base"' EXIT  # what matters is in $OUT already
work=$base/checkup
mkdir -p "$work"
summary=$OUT/summary.txt
: > "$summary"
start=$(date +%s)
budget_end=$((start + budget))
phase_end=$budget_end
export CUMULUS_DATA=$fashion  # test_data's case on the real dataset

# run.sh puts the system's library folder on LD_LIBRARY_PATH; a Python with its own libpython (pyenv)
# would load the system's instead and lose its site-packages (torch): its own folder goes first.
python=${CHECKUP_PYTHON:-python3}
pylib=$("$python" -c 'import sysconfig; print(sysconfig.get_config_var("LIBDIR") or "")' 2>/dev/null || true)
# A system folder there would put the system's libraries before the bundle's for every program the
# Python scripts start (the apps): only a Python's own folder goes first.
case $pylib in /usr/lib | /usr/lib64 | /usr/lib/x86_64-linux-gnu | /lib | /lib64 | /lib/x86_64-linux-gnu) pylib="" ;; esac
py=$base/py
if [ -n "$pylib" ]; then
  printf '#!/bin/sh\nLD_LIBRARY_PATH=%q${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} exec %q "$@"\n' "$pylib" "$(command -v "$python")" > "$py"
else
  printf '#!/bin/sh\nexec %q "$@"\n' "$(command -v "$python")" > "$py"
fi
chmod +x "$py"
report=$root/scripts/checkup_report.py

say() { printf '%s\n' "$*" | tee -a "$summary"; }
# Everything but weights and optimizer state into $OUT/checkup.tar.gz, one packer at a time; the
# archive is replaced only once the new one is whole.
pack() {
  (
    flock 9 2> /dev/null || true
    cp "$summary" "$work/summary.txt"
    local keep_out=(--exclude='*.safetensors' --exclude='*.state')
    tar -C "$base" "${keep_out[@]}" --warning=no-file-changed -czf "$OUT/checkup.tar.gz.part" checkup 2> /dev/null || true
    # the device tool brings back files of 16 MiB at most: past 15, the JSON reports stay behind
    if [ "$(stat -c %s "$OUT/checkup.tar.gz.part" 2> /dev/null || echo 0)" -gt 15728640 ]; then
      echo "the archive passed 15 MiB: JSON left out of it" > "$work/ARCHIVE_TRIMMED"
      tar -C "$base" "${keep_out[@]}" --exclude='*.json' --warning=no-file-changed -czf "$OUT/checkup.tar.gz.part" \
        checkup 2> /dev/null || true
    fi
    mv -f "$OUT/checkup.tar.gz.part" "$OUT/checkup.tar.gz" 2> /dev/null || true
  ) 9> "$base/pack.lock"
}
# A finished log over 256 KiB keeps its first 64 KiB and its last 128 KiB.
trim() {
  local f=$1 size
  [ -f "$f" ] || return 0
  size=$(stat -c %s "$f")
  if ((size > 262144)); then
    { head -c 65536 "$f"; printf '\n[... %d bytes cut by the checkup ...]\n' $((size - 196608)); tail -c 131072 "$f"; } > "$f.trim"
    mv -f "$f.trim" "$f"
  fi
}
export work base OUT summary py report root device
export -f say pack trim
# Seconds a step may take: its own cap, or what is left of its phase or of the budget when less.
cap() {
  local now left own=$(($1 * factor))
  now=$(date +%s)
  left=$((phase_end - now))
  if ((budget_end - now < left)); then left=$((budget_end - now)); fi
  if ((own < left)); then echo "$own"; elif ((left > 0)); then echo "$left"; else echo 0; fi
}
# NAME LIMIT CMD...: CMD under LIMIT seconds, its output in $work/NAME.log, its exit in
# $work/NAME.rc and its wall time (ms) in $work/NAME.ms; says both and packs.
timed() {
  local name=$1 limit=$2 rc=0 t0 ms note=""
  shift 2
  if ((limit <= 0)); then
    say "$name: skipped (no time left in its phase's cap or the ${budget} s budget)"
    echo 124 > "$work/$name.rc"
    return 0
  fi
  t0=$(date +%s%N)
  timeout --kill-after=5 "$limit" "$@" > "$work/$name.log" 2>&1 || rc=$?
  ms=$((($(date +%s%N) - t0) / 1000000))
  echo "$rc" > "$work/$name.rc"
  echo "$ms" > "$work/$name.ms"
  trim "$work/$name.log"
  if ((rc == 124 || rc == 137)); then note=" (past its $limit s cap)"; fi
  say "$name: exit $rc, $((ms / 1000)).$(printf '%03d' $((ms % 1000))) s$note"
  if ((rc != 0)) && [ -s "$work/$name.log" ]; then
    say "  its log ends: $(tail -c 300 "$work/$name.log" | tr '\n' ' ' | tr -s ' ')"
  fi
  pack
}
rc_of() { cat "$work/$1.rc" 2> /dev/null || echo 1; }
seconds_of() {
  local ms
  ms=$(cat "$work/$1.ms" 2> /dev/null || echo 0)
  echo "$((ms / 1000)).$(printf '%03d' $((ms % 1000)))"
}
stop_reason=""
stop() {
  stop_reason=$*
  say "probe: STOP: $*"
}

# ---- 1. probe -----------------------------------------------------------------------------------
sanitizer=""
torch_ok=0
have_mpirun=0
phase_probe() {
  local gpu cuda_version missing case=Devices/TensorTest.Factories/$device cs
  say "commit $(cat "$bin/../COMMIT" 2> /dev/null || git -C "$root" rev-parse HEAD 2> /dev/null || echo unknown)," \
    "device $device, phases: ${phases[*]}, budget $budget s, $(nproc) CPUs"
  if [ "$device" = cuda ]; then
    command -v nvidia-smi > /dev/null || { stop "no nvidia-smi: no NVIDIA driver on this machine"; return 0; }
    gpu=$(timeout 15 nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | head -n 1) || true
    cuda_version=$(timeout 10 nvidia-smi 2> /dev/null | grep -o 'CUDA Version: [0-9.]*' || true)
    say "GPU: ${gpu:-none}, ${cuda_version:-CUDA version unknown}"
    if [ -z "$gpu" ] || grep -qiE 'fail|error|not found' <<< "$gpu"; then
      stop "nvidia-smi sees no GPU: ${gpu:-no answer}"
      return 0
    fi
  else
    say "no GPU asked for: a rehearsal on the CPU (small shapes: $small)"
  fi
  missing=$(for f in "$bin"/*; do ldd "$f" 2> /dev/null | grep 'not found' || true; done | sort -u | tr -s ' \t' ' ')
  if [ -n "$missing" ]; then
    stop "libraries not found:$missing"
    return 0
  fi
  say "libraries: all $(ls "$bin" | wc -l) bundled programs resolve every library" \
    "($(ldd "$bin/fashion_mnist" | grep -oE 'lib(cudart|cublas|cudnn|nccl)[^ ]*' | sort -u | tr '\n' ' '| sed 's/ $//'))"
  timed probe_version 10 fashion_mnist --version
  say "  $(head -n 4 "$work/probe_version.log" | tr '\n' ';')"
  timed probe_engine "$(cap 15)" test_tensor --gtest_brief=1 --gtest_filter="$case" --gtest_output="json:$work/probe_engine.json"
  if [ "$(rc_of probe_engine)" != 0 ] || ! grep -q '"result": "COMPLETED"' "$work/probe_engine.json" 2> /dev/null; then
    stop "the engine did not run its $device case $case (see probe_engine.log)"
    return 0
  fi
  say "engine: ran $case"
  # compute-sanitizer and PyTorch, side by side
  cs=${CHECKUP_SANITIZER:-$(command -v compute-sanitizer || true)}
  for c in /usr/local/cuda/bin/compute-sanitizer /usr/local/cuda/compute-sanitizer/compute-sanitizer; do
    [ -n "$cs" ] || { [ -x "$c" ] && cs=$c; } || true
  done
  if [ -n "$cs" ]; then
    timed probe_sanitizer "$(cap 20)" "$cs" --tool memcheck --error-exitcode 9 "$bin/test_tensor" --gtest_brief=1 \
      --gtest_filter="$case" &
  fi
  timed probe_torch "$(cap 20)" "$py" -c "import numpy, torch
print('torch', torch.__version__, 'CUDA', torch.version.cuda, 'available', torch.cuda.is_available(),
      torch.cuda.get_device_name(0) if torch.cuda.is_available() else '')
assert '$device' == 'cpu' or torch.cuda.is_available(), 'PyTorch sees no CUDA device'" &
  wait
  if [ -z "$cs" ]; then
    if [ "$device" = cpu ]; then
      sanitizer=$base/no-sanitizer
      printf '#!/bin/sh\n# rehearsal: no compute-sanitizer here; the cases run plainly\nwhile [ "${1#--}" != "$1" ]; do shift 2; done\necho "rehearsal: no compute-sanitizer, ran plainly"\nexec "$@"\n' > "$sanitizer"
      chmod +x "$sanitizer"
      say "compute-sanitizer: not here; the sanitize phase runs its cases plainly (rehearsal)"
    else
      say "compute-sanitizer: not found: the sanitize phase will be skipped"
    fi
  elif [ "$(rc_of probe_sanitizer)" = 0 ] && grep -q 'ERROR SUMMARY: 0 errors' "$work/probe_sanitizer.log"; then
    sanitizer=$cs
    say "compute-sanitizer: works ($cs)"
  elif [ "$(rc_of probe_sanitizer)" = 124 ]; then
    sanitizer=$cs  # slow to start is not broken: the phase runs, under its own deadline
    say "compute-sanitizer: did not finish one case within the probe's limit: unverified; the sanitize phase runs anyway"
  else
    say "compute-sanitizer: does not work here (exit $(rc_of probe_sanitizer)): the sanitize phase will be skipped;" \
      "$(tail -c 200 "$work/probe_sanitizer.log" | tr '\n' ' ')"
  fi
  if [ "$(rc_of probe_torch)" = 0 ]; then
    torch_ok=1
    say "PyTorch: $(tail -n 1 "$work/probe_torch.log")"
  else
    say "PyTorch: cannot use the $device: the comparisons with PyTorch will be skipped"
  fi
  if command -v mpirun > /dev/null; then have_mpirun=1; fi
  say "mpirun: $( ((have_mpirun)) && echo present || echo "absent: test_dist's MpiRunTest cases are left out")"
}

# ---- 2. tests -----------------------------------------------------------------------------------
# One test binary's chosen cases under what is left until the phase's deadline (CK_END, epoch s).
run_test_binary() {
  local name=$1 left rc=0 t0 ms line
  left=$((CK_END - $(date +%s)))
  if ((left <= 0)); then
    say "  $name: not started (the phase's deadline had passed)"
    return 0
  fi
  t0=$(date +%s%N)
  # 8 binaries share the CPUs: CPU work in a case (the references) gets CK_THREADS threads each
  OPENBLAS_NUM_THREADS=$CK_THREADS OMP_NUM_THREADS=$CK_THREADS \
    timeout --kill-after=3 "$left" "$name" --gtest_filter="$(cat "$CK_DIR/$name.filter")" \
    --gtest_output="json:$CK_DIR/$name.json" > "$CK_DIR/$name.log" 2>&1 || rc=$?
  ms=$((($(date +%s%N) - t0) / 1000000))
  echo "$rc" > "$CK_DIR/$name.exit"
  trim "$CK_DIR/$name.log"
  line=$("$py" "$report" test-binary "$CK_DIR" "$name" "$rc" "$((ms / 1000)).$((ms % 1000 / 100))")
  say "$line"
  pack
}
export -f run_test_binary

# The CUDA paths an environment variable chooses (cuDNN's fused attention or ours; 16-bit Linears
# writing their output directly or through an f32 scratch): DIR/test_op_cases_fallback runs the
# attention and Linear op cases' CUDA comparisons on the fallbacks, beside the default run.
fallback_op_cases() {
  local dir=$1
  [ -s "$dir/test_op_cases.filter" ] || return 0
  local cases=Registry/OpCaseTest.CudaMatchesCpu
  echo "$cases/*sdpa*:$cases/*attention*:$cases/*linear*" > "$dir/test_op_cases_fallback.filter"
  printf '#!/usr/bin/env bash\nCUMULUS_CUDA_ATTENTION=own CUMULUS_CUDA_LINEAR16=scratch exec test_op_cases "$@"\n' \
    > "$dir/test_op_cases_fallback"
  chmod +x "$dir/test_op_cases_fallback"
}

phase_tests() {
  local dir=$work/tests excl=() names=() order=() heavy n
  mkdir -p "$dir"
  ((have_mpirun)) || excl=(--exclude-suite MpiRunTest)
  local skip=" test_kernels_emulated ${CHECKUP_TESTS_SKIP-$( ((small)) && echo test_app)} "
  for t in "$bin"/test_*; do
    case $skip in *" $(basename "$t") "*) ;; *) names+=("$t") ;; esac
  done
  # test_kernels_emulated: our kernels on the CPU emulation, CI's; test_app: its chosen cases also
  # train on the CPU (about 25 s here), left out of the rehearsal unless CHECKUP_TESTS_SKIP says otherwise
  [ "$skip" = " test_kernels_emulated  " ] || say "tests: left out by CHECKUP_TESTS_SKIP or the rehearsal:$skip"
  timeout 60 "$py" "$root/scripts/gpu_cases.py" "${names[@]}" --out-dir "$dir" "${excl[@]}" > "$dir/selection.txt" 2>&1 || true
  say "tests: $(ls "$dir"/*.filter 2> /dev/null | wc -l) of ${#names[@]} binaries have CUDA cases" \
    "($(grep -oE '^[a-z_]+: [0-9]+ of' "$dir/selection.txt" | awk '{s += $2} END {print s + 0}') cases);" \
    "left out, no CUDA case: $(grep -E ': 0 of ' "$dir/selection.txt" | cut -d: -f1 | tr '\n' ' ')test_kernels_emulated"
  fallback_op_cases "$dir"
  # the longest first, so that the deadline cuts the short ones least
  for heavy in test_op_cases test_op_cases_fallback test_precision test_app test_recompute test_prediction test_gpt test_trainer test_cnn; do
    [ -s "$dir/$heavy.filter" ] && order+=("$heavy")
  done
  for f in "$dir"/*.filter; do
    n=$(basename "$f" .filter)
    case " ${order[*]} " in *" $n "*) ;; *) order+=("$n") ;; esac
  done
  if [ ${#order[@]} -eq 0 ]; then
    say "tests: no binary with CUDA cases (see tests/selection.txt)"
    return 0
  fi
  local jobs=${CHECKUP_TEST_JOBS:-8}
  PATH=$dir:$PATH CK_DIR=$dir CK_END=$((phase_end - 3)) CK_THREADS=$(($(nproc) / jobs > 0 ? $(nproc) / jobs : 1)) \
    xargs -P "$jobs" -I{} bash -c 'run_test_binary "$1"' _ {} <<< "$(printf '%s\n' "${order[@]}")" || true
  "$py" "$report" tests "$dir" | tee -a "$summary"
}

# ---- 3. the GPT -----------------------------------------------------------------------------------
corpus() {  # shakespeare.txt, unpacked from shakespeare.txt.xz when that is what travelled
  if [ -f "$shakespeare/shakespeare.txt" ]; then
    echo "$shakespeare/shakespeare.txt"
  else
    [ -f "$base/shakespeare.txt" ] || xz -dc "$shakespeare/shakespeare.txt.xz" > "$base/shakespeare.txt"
    echo "$base/shakespeare.txt"
  fi
}
# NAME LIMIT ARGS...: bench/gpt_compare.py into $work/NAME, then its lines in the summary.
gpt_compare() {
  local name=$1 limit=$2
  shift 2
  timed "$name" "$limit" "$py" "$root/bench/gpt_compare.py" --gpt "$bin/gpt" --data "$(corpus)" --out "$work/$name" \
    --rounds 1 --eval-windows 8 --device "$device" "$@"
  "$py" "$report" gpt "$work/$name/summary.json" | tee -a "$summary"
  pack
}
# The attention op alone at GPT-2 small's shape from a qkv projection, forward and forward +
# backward in bf16 and f32: bench_ops' sdpa_qkv_causal_gpt2s_bench_* cases against PyTorch's SDPA.
attention_op() {
  local dt torch_device=cuda:0 min_time=0.2 reps=()
  if [ "$device" = cpu ]; then torch_device=cpu min_time=0.01 reps=(--reps 2 --warmup 1); fi
  timed attention_op_cumulus "$(cap 20)" bench_ops \
    --benchmark_filter="^ops/sdpa_qkv_causal_gpt2s_bench_(bf16|f32)/[^/]*/(forward|forward_backward)/$device(:0)?/" \
    --benchmark_min_time="$min_time" --benchmark_out="$work/attention_op.json" --benchmark_out_format=json
  # f32 on the opt-in tiled kernels (Note [Tiled CUDA attention kernels])
  CUMULUS_CUDA_ATTENTION_KERNELS=tiled timed attention_op_cumulus_tiled "$(cap 20)" bench_ops \
    --benchmark_filter="^ops/sdpa_qkv_causal_gpt2s_bench_f32/[^/]*/(forward|forward_backward)/$device(:0)?/" \
    --benchmark_min_time="$min_time" --benchmark_out="$work/attention_op_tiled.json" --benchmark_out_format=json
  for dt in bf16 f32; do
    timed "attention_op_pytorch_$dt" "$(cap 20)" "$py" "$root/bench/pytorch/sdpa_op.py" --dtype "$dt" \
      --device "$torch_device" "${reps[@]}"
  done
  "$py" "$report" attention "$work/attention_op.json" "$work"/attention_op_pytorch_{bf16,f32}.log | tee -a "$summary"
  echo "  the tiled kernels (CUMULUS_CUDA_ATTENTION_KERNELS=tiled):" | tee -a "$summary"
  "$py" "$report" attention "$work/attention_op_tiled.json" "$work"/attention_op_pytorch_f32.log | tee -a "$summary"
}
phase_gpt() {
  local big=gpt2s parity=parity steps=6 parity_steps=20 limit compile_s
  # the bf16 run also times the fallback CUDA paths (see fallback_op_cases) as the side cumulus_fallback
  local variant=fallback:CUMULUS_CUDA_ATTENTION=own,CUMULUS_CUDA_LINEAR16=scratch variant_s=30
  if ((small)); then big=small parity=small steps=3 parity_steps=3; fi
  if ((!torch_ok)); then
    say "gpt: skipped: PyTorch cannot use the $device (see probe_torch.log)"
    return 0
  fi
  attention_op
  limit=$(cap 150)  # cumulus, the eager twin, the fallback paths, then the compiled twin within what is left
  compile_s=$((limit - 40 - variant_s))
  ((!small)) || compile_s=10  # the rehearsal: the compiled twin cut at its limit, reported, not fatal
  if ((limit > 60)); then
    gpt_compare gpt_bf16 "$limit" --configs "$big" --steps "$steps" --precision bf16 --variant "$variant" \
      --variant-timeout "$variant_s" --also-compile --compile-timeout "$compile_s"
  else
    gpt_compare gpt_bf16 "$limit" --configs "$big" --steps "$steps" --precision bf16 --variant "$variant" \
      --variant-timeout "$variant_s"
  fi
  if ((small)); then
    say "gpt_fp32: not rehearsed (the bf16 run's code with --precision fp32)"
  else
    # the opt-in tiled attention kernels (Note [Tiled CUDA attention kernels]) beside the default ones
    gpt_compare gpt_fp32 "$(cap 60)" --configs "$big" --steps "$steps" --precision fp32 \
      --variant tiled:CUMULUS_CUDA_ATTENTION_KERNELS=tiled --variant-timeout 25
  fi
  gpt_compare gpt_parity_fp32 "$(cap 45)" --configs "$parity" --steps "$parity_steps" --precision fp32 \
    --cpu-reference "$parity_steps" --cpu-threads "$(nproc)"
  # bf16 also runs the CPU in fp32: the tolerance of Note [bf16 loss tolerance] (bench/gpt_compare.py)
  gpt_compare gpt_parity_bf16 "$(cap 80)" --configs "$parity" --steps "$parity_steps" --precision bf16 \
    --cpu-reference "$parity_steps" --cpu-threads "$(nproc)"
}

# ---- 4. compute-sanitizer -------------------------------------------------------------------------
run_sanitizer() {  # "TOOL BINARY": its CUDA cases under the tool until the phase's deadline
  local tool=${1% *} name=${1#* } left log
  log=$CK_DIR/${tool}_$name.log
  left=$((CK_END - $(date +%s)))
  if ((left <= 0)); then
    say "  $tool $name: not started (the phase's deadline had passed)"
    return 0
  fi
  local rc=0
  local filter=$CK_DIR/$name.filter
  [ ! -s "$CK_DIR/$name.$tool.filter" ] || filter=$CK_DIR/$name.$tool.filter
  OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 timeout --kill-after=3 "$left" "$CK_SANITIZER" --tool "$tool" \
    --error-exitcode 9 --print-limit 20 "$CK_BIN/$name" --gtest_filter="$(cat "$filter")" \
    > "$log" 2>&1 || rc=$?
  trim "$log"
  # clean: exit 0 and the tool's own summary says so (racecheck's RACECHECK SUMMARY where it prints one)
  if ((rc == 0)) && { grep -q 'RACECHECK SUMMARY: 0 hazards' "$log" ||
    { ! grep -q 'RACECHECK SUMMARY' "$log" && grep -q 'ERROR SUMMARY: 0 errors' "$log"; }; }; then
    touch "$log.clean"
  fi
  say "  $tool $name: exit $rc$( ((rc == 124 || rc == 137)) && echo ' (cut at the deadline)' || true)$("$py" "$report" sanitize "$log")"
  pack
}
export -f run_sanitizer
exclude() {  # FILTER_FILE PATTERNS: a gtest filter file, now also leaving out PATTERNS (':'-separated)
  [ -s "$1" ] || return 0
  if grep -q -- - "$1"; then sed -i "s/\$/:$2/" "$1"; else sed -i "s/\$/-$2/" "$1"; fi
}
phase_sanitize() {
  local dir=$work/sanitize t ops pairs=()
  mkdir -p "$dir"
  if [ -z "$sanitizer" ]; then
    say "sanitize: skipped: no working compute-sanitizer (see the probe)"
    return 0
  fi
  for t in test_attention test_gpt test_tensor_ops test_reduce_dims test_fused_mlp test_graphs test_data; do
    if [ -s "$work/tests/$t.filter" ]; then
      cp "$work/tests/$t.filter" "$dir/$t.filter"
    else
      timeout 30 "$py" "$root/scripts/gpu_cases.py" "$bin/$t" > "$dir/$t.filter" 2> /dev/null || true
    fi
  done
  # Cases that provoke a CUDA error on purpose (a capture that fails, one that cannot begin):
  # memcheck counts the API errors they test for, so they run in the tests phase only.
  local provoked=GraphCudaTest.ASynchronizingClosureFailsTheCaptureWithAClearError
  provoked+=:GraphCudaTest.ACaptureThatCannotBeginLeavesNothingBehind
  exclude "$dir/test_graphs.filter" "$provoked"
  # racecheck's shared-memory tracking makes the fused MLP's parity case (the seed's widths at
  # batches up to 1024) outlast the phase; its kernels are raced on the smaller cases.
  if [ -s "$dir/test_fused_mlp.filter" ]; then
    cp "$dir/test_fused_mlp.filter" "$dir/test_fused_mlp.racecheck.filter"
    exclude "$dir/test_fused_mlp.racecheck.filter" "FusedMLPParity.*"
  fi
  ops=""
  for t in sdpa layer_norm embedding sum mean max amax softmax cross_entropy rms_norm gelu mlp block gpt; do
    ops+="Registry/OpCaseTest.CudaMatchesCpu/${t}_*:"
  done
  # not the benchmark shapes (GPT-2 small's attention: minutes under a sanitizer)
  echo "${ops%:}-*_bench*" > "$dir/test_op_cases.filter"
  for t in test_attention test_gpt test_tensor_ops test_op_cases test_reduce_dims test_fused_mlp test_graphs test_data; do
    if [ -s "$dir/$t.filter" ]; then pairs+=("memcheck $t" "racecheck $t"); else say "  $t: no CUDA case found"; fi
  done
  CK_DIR=$dir CK_END=$((phase_end - 2)) CK_SANITIZER=$sanitizer CK_BIN=$bin \
    xargs -P "${CHECKUP_SANITIZE_JOBS:-16}" -I{} bash -c 'run_sanitizer "$1"' _ {} <<< "$(printf '%s\n' "${pairs[@]}")" || true
  local clean
  clean=$(find "$dir" -name '*.log.clean' | wc -l)
  if [ "$sanitizer" = "$base/no-sanitizer" ]; then
    say "sanitize: rehearsal: ${#pairs[@]} runs without compute-sanitizer"
  else
    say "sanitize: $clean of ${#pairs[@]} runs report no error or hazard" \
      "(target all clean: $([ "$clean" = ${#pairs[@]} ] && echo met || echo 'NOT met, or not all ran'))"
  fi
}

# ---- 5. the seed run ------------------------------------------------------------------------------
seed_flags=(--batch-size 16 --accum-steps 4 --epochs 20)
graph_flags=(--graphs on)
if ((small)); then
  seed_flags=(--batch-size 16 --accum-steps 4 --epochs 2 --train-limit 2048 --test-limit 512)
fi
if [ "$device" = cpu ]; then graph_flags=(); fi
# NAME LIMIT FLAGS...: the app on the device, its metrics, memory report and weights under NAME.
app_run() {
  local name=$1 limit=$2
  shift 2
  timed "$name" "$limit" fashion_mnist --device "$device" --data "$fashion" --quiet --metrics "$work/$name.jsonl" \
    --memory-report "$work/${name}_memory.json" --save "$work/$name.safetensors" "$@"
  "$py" "$report" seed "$work/$name.jsonl" "$(seconds_of "$name")" | tee -a "$summary"
  "$py" "$report" memory "$work/${name}_memory.json" | tee -a "$summary"
}
phase_seed() {
  app_run seed_default "$(cap 15)" "${seed_flags[@]}" "${graph_flags[@]}"
  app_run seed_generic "$(cap 15)" "${seed_flags[@]}" "${graph_flags[@]}" --kernels generic
  "$py" "$report" kernels "$work/seed_default.jsonl" "$(seconds_of seed_default)" "$work/seed_generic.jsonl" \
    "$(seconds_of seed_generic)" | tee -a "$summary"
  "$py" "$report" weights "$work/seed_default.safetensors" "$work/seed_generic.safetensors" | tee -a "$summary"
}

# ---- 6. speed against PyTorch --------------------------------------------------------------------
phase_speed() {
  local d=$device limits=() epochs=2
  timed bench_step "$(cap 20)" bench_step_vs_accumulate \
    --benchmark_filter="^$d/(micro_batch|micro_batch_fused|micro_batch_graph|micro_batch_graph_fused)/accumulate/16(/|\$)|^$d/(step_of_64|step_of_64_fused|step_of_64_graph|step_of_64_graph_fused)/(16x4|64x1)(/|\$)" \
    --benchmark_min_time=0.1 --benchmark_out="$work/bench_step.json" --benchmark_out_format=json
  "$py" "$report" bench "$work/bench_step.json" | tee -a "$summary"
  if ((!torch_ok)); then
    say "compare: skipped: PyTorch cannot use the $device"
    return 0
  fi
  if ((small)); then limits=(--train-limit 2048 --test-limit 512) epochs=1; fi
  timed compare "$(cap 60)" "$py" "$root/bench/compare.py" --device "$device" --data "$fashion" --out-dir "$work/compare" \
    --build "$(dirname "$bin")" --bench-json "$work/bench_step.json" --configs 16x4 --epochs "$epochs" \
    --pytorch-variants "$([ "$device" = cuda ] && echo fast,graphs || echo fast)" --python "$py" "${limits[@]}"
  "$py" "$report" compare "$work/compare/compare.json" | tee -a "$summary"
}

# ---- 7. the planner -------------------------------------------------------------------------------
phase_planner() {
  local model sizes=() levers=(--effective-batch 1024 --recompute auto --precision auto --data-on auto)
  ((!small)) || levers=(--effective-batch 64)  # every lever probes 72 candidates: 48 s on 2 CPU cores
  for model in mlp cnn; do
    timed "plan_only_$model" "$(cap 35)" fashion_mnist --device "$device" --data "$fashion" --model "$model" \
      --plan-only "${levers[@]}"
    grep -E '^planner:' "$work/plan_only_$model.log" | cut -c1-400 | sed 's/^/  /' | tee -a "$summary" || true
  done
  ((!small)) || sizes=(--max-size 256)
  timed prediction_table "$(cap 25)" prediction_table "$work/prediction" --device "$device" "${sizes[@]}"
  grep -E 'predicted' "$work/prediction_table.log" | tail -n 12 | sed 's/^/  /' | tee -a "$summary" || true
  grep -oE '\([+-][0-9.]+%\)' "$work/prediction_table.log" | tr -d '()%+-' |
    awk '{ if ($1 > m) m = $1; n++ } END { if (n) printf "  predicted against measured: %d figures, largest gap %.3f%% (target within 5%%: %s)\n", n, m, m <= 5 ? "met" : "NOT met" }' |
    tee -a "$summary" || true
}

# ---- 8. 16 bits -----------------------------------------------------------------------------------
phase_precision() {
  local p cnn=(--model cnn --batch-size 256 --epochs 1) benches=^$device/
  if ((small)); then cnn+=(--train-limit 1024 --test-limit 256) benches=^$device/mlp; fi
  for p in bf16 fp16; do
    app_run "seed_$p" "$(cap 10)" "${seed_flags[@]}" "${graph_flags[@]}" --precision "$p"
  done
  for p in fp32 bf16; do
    app_run "cnn_$p" "$(cap 8)" "${cnn[@]}" --precision "$p"
  done
  timed bench_precision "$(cap 15)" bench_precision --benchmark_filter="$benches" --benchmark_min_time=0.05 \
    --benchmark_out="$work/bench_precision.json" --benchmark_out_format=json
}

# ---- 9. where the GPT's step goes ---------------------------------------------------------------
# Our op profile of GPT-2 small's step, then every kernel of one micro-batch of that shape (weight
# initialization included: it is named apart) timed by Nsight Compute, one metric, the clocks left
# alone; summed by kernel name.
phase_profile() {
  local ncu p shape=(--context 1024 --width 768 --heads 12 --layers 12 --micro-batch 8)
  ((!small)) || shape=()
  # Our own op profile of GPT-2 small's step (3 steps of one micro-batch, the last 2 timed): each
  # op's device time between CUDA events (Note [Op time profile]); no tool needed.
  for p in fp32 bf16; do
    timed "op_profile_gpt_$p" "$(cap 40)" "$bin/gpt" train --data "$(corpus)" "${shape[@]}" --accum-steps 1 \
      --steps 3 --warmup 0 --eval-every 0 --eval-windows 1 --device "$device" --precision "$p" \
      --op-profile "$work/op_profile_gpt_$p.json"
    awk '/^op time on/ { table = 1; print; next } table && /^  / { print; next } { table = 0 }' \
      "$work/op_profile_gpt_$p.log" | tee -a "$summary"
  done
  ncu=$(command -v ncu || true)
  [ -n "$ncu" ] || { [ -x /usr/local/cuda/bin/ncu ] && ncu=/usr/local/cuda/bin/ncu; } || true
  if [ "$device" = cpu ]; then
    say "profile: Nsight Compute not rehearsed (it times GPU kernels)"
    return 0
  fi
  if [ -z "$ncu" ]; then
    say "profile: Nsight Compute skipped (no ncu here)"
    return 0
  fi
  # The opt-in tiled f32 attention kernels at GPT-2 small's shape, one forward + backward: where
  # their time goes (Note [Tiled CUDA attention kernels] counts shared memory as their bound)
  CUMULUS_CUDA_ATTENTION_KERNELS=tiled timed profile_attention "$(cap 40)" "$ncu" --clock-control none --kernel-name regex:attention_ --launch-count 4 \
    --section SpeedOfLight --section ComputeWorkloadAnalysis --section Occupancy --section WarpStateStats \
    --section MemoryWorkloadAnalysis_Tables --csv --page details --log-file "$work/profile_attention.csv" \
    "$bin/bench_ops" --benchmark_filter='^ops/sdpa_qkv_causal_gpt2s_bench_f32/[^/]*/forward_backward/cuda(:0)?/' \
    --benchmark_min_time=0.01
  "$py" "$report" kernel-details "$work/profile_attention.csv" | tee -a "$summary"
  for p in fp32 bf16; do
    timed "profile_gpt_$p" "$(cap 70)" "$ncu" --clock-control none --metrics gpu__time_duration.sum --csv \
      --launch-count 3000 --log-file "$work/profile_gpt_$p.csv" "$bin/gpt" train --data "$(corpus)" "${shape[@]}" \
      --accum-steps 1 --steps 1 --warmup 0 --eval-every 0 --eval-windows 1 --device cuda --precision "$p" --quiet
    "$py" "$report" profile "$work/profile_gpt_$p.csv" | tee -a "$summary"
  done
  # The seed's micro-batch of 16 (fused kernels, no graphs: each launch its own line): about 30
  # micro-batches after the first 300 launches.
  timed profile_seed "$(cap 30)" "$ncu" --clock-control none --metrics gpu__time_duration.sum --csv \
    --launch-skip 300 --launch-count 200 --log-file "$work/profile_seed.csv" "$bin/fashion_mnist" \
    --device cuda --data "$fashion" --epochs 1 --batch-size 16 --accum-steps 4 --graphs off --quiet
  "$py" "$report" profile "$work/profile_seed.csv" | tee -a "$summary"
}

say "gpu_checkup $(date -u +%FT%TZ): results in $OUT/summary.txt and $OUT/checkup.tar.gz as they come"
for phase in "${phases[@]}"; do
  now=$(date +%s)
  if ((budget_end - now <= 0)); then
    say "== $phase: skipped (the ${budget} s budget is spent)"
    continue
  fi
  phase_end=$((now + ${cap_of[$phase]} * factor))
  ((phase_end <= budget_end)) || phase_end=$budget_end
  say "== $phase (at $((now - start)) s, cap $((${cap_of[$phase]} * factor)) s)"
  "phase_$phase"
  say "== $phase: $(($(date +%s) - now)) s"
  pack
  if [ -n "$stop_reason" ]; then
    say "gpu_checkup: stopped after the probe: $stop_reason"
    exit 3
  fi
done
say "gpu_checkup: done at $(($(date +%s) - start)) s of the $budget s budget"
pack
