#!/usr/bin/env bash
# Builds the libFuzzer targets of tests/fuzz/ with clang (ASan + UBSan, coverage on the engine) in
# build-fuzz/ and runs each for a bounded time from its seed corpus, tests/fuzz/corpus/<target>/.
# Malformed input must end in a cumulus::Error: a crash, a sanitizer report, an exception of another
# type, an input slower than -timeout, or an allocation past -malloc_limit_mb fails the run; the
# input is then saved as build-fuzz/artifacts/<target>-crash-... (reproduce: build-fuzz/bin/fuzz_<target> FILE).
#   FUZZ_SECONDS   time per target (default 60)
#   FUZZ_TARGETS   which targets (default "idx safetensors size")
# Extra arguments go to every libFuzzer run. New inputs found go to build-fuzz/corpus/<target>/,
# never into the committed seeds.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
scripts/install-deps.sh --fuzz
source scripts/compiler_cache.sh
seconds=${FUZZ_SECONDS:-60}
targets=(${FUZZ_TARGETS:-idx safetensors size})

cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER=clang++ -DCUMULUS_CUDA=OFF \
      -DCUMULUS_FUZZ=ON -DCUMULUS_SANITIZE=address,undefined "${compiler_cache_args[@]}" \
      -DCUMULUS_BUILD_TESTS=OFF -DCUMULUS_BUILD_APPS=OFF -DCUMULUS_BUILD_BENCH=OFF
cmake --build build-fuzz -j "${CUMULUS_JOBS:-2}" --target "${targets[@]/#/fuzz_}"

export ASAN_OPTIONS="halt_on_error=1:detect_leaks=1${ASAN_OPTIONS:+:$ASAN_OPTIONS}"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1${UBSAN_OPTIONS:+:$UBSAN_OPTIONS}"
mkdir -p build-fuzz/artifacts
failed=()
for t in "${targets[@]}"; do
  seeds=tests/fuzz/corpus/$t
  work=build-fuzz/corpus/$t
  mkdir -p "$work"
  dict=()
  [ -f "tests/fuzz/$t.dict" ] && dict=("-dict=tests/fuzz/$t.dict")
  echo "fuzz: $t for ${seconds}s (seeds: $seeds)"
  # -malloc_limit_mb: no single allocation may approach this; inputs are at most -max_len bytes
  # (4 KiB), so anything near it is an allocation the input's size does not justify.
  if ! build-fuzz/bin/fuzz_"$t" -max_total_time="$seconds" -rss_limit_mb=2048 -malloc_limit_mb=64 -timeout=10 \
       -max_len=4096 -print_final_stats=1 -artifact_prefix="build-fuzz/artifacts/$t-" "${dict[@]}" "$@" \
       "$work" "$seeds" > "build-fuzz/fuzz_$t.log" 2>&1; then
    failed+=("$t")
    tail -n 60 "build-fuzz/fuzz_$t.log"
  fi
  grep -E "^(stat::number_of_executed_units|stat::peak_rss_mb|Done|INFO: (-max_total_time|seed|Loaded))" \
       "build-fuzz/fuzz_$t.log" | sed "s/^/  $t: /" || true
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz: FAILED: ${failed[*]} (logs: build-fuzz/fuzz_<target>.log, inputs: build-fuzz/artifacts/)"
  exit 1
fi
echo "fuzz: all clean (${targets[*]}, ${seconds}s each)"
