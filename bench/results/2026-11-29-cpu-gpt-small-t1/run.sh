#!/bin/sh
# The small GPT at one thread, before and after this folder's commits, alternated run by run
# (each run itself alternates cumulus and PyTorch rounds: bench/gpt_compare.py).
#   GPT_BEFORE, GPT_AFTER: the two builds' `gpt` (a wrapper script setting LD_LIBRARY_PATH to the
#   build's own libcumulus_engine works); PYTHON: a Python with PyTorch; DATA: shakespeare.txt;
#   OUT: where the runs go (outside the repository); PARTS: which of the runs below.
set -eu
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../../.." && pwd)
PYTHON=${PYTHON:-python3}
DATA=${DATA:-/work/shared/data/shakespeare/shakespeare.txt}
OUT=${OUT:-/tmp/gpt-small-t1}
PARTS=${PARTS:-"avx512 avx2 large"}
compare() {  # name gpt capability configs extra...
  name=$1 gpt=$2 cap=$3 configs=$4
  shift 4
  echo "== $name ($(date -u +%H:%M:%S), load $(cut -d' ' -f1-3 /proc/loadavg))"
  CUMULUS_CPU_CAPABILITY=$cap taskset -c 1 "$PYTHON" "$REPO/bench/gpt_compare.py" --gpt "$gpt" --data "$DATA" \
    --out "$OUT/$name" --configs "$configs" --threads 1 "$@"
}
for part in $PARTS; do
  case $part in
    avx512 | avx2)
      for r in 1 2; do
        compare "${part}_before_$r" "$GPT_BEFORE" "$part" small --rounds 3
        compare "${part}_after_$r" "$GPT_AFTER" "$part" small --rounds 3
      done ;;
    large)
      compare large_before "$GPT_BEFORE" avx512 large --steps 6 --rounds 2
      compare large_after "$GPT_AFTER" avx512 large --steps 6 --rounds 2 ;;
  esac
done
