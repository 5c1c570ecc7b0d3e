#!/bin/sh
# own_llama (cumulus) against own_llama.py (PyTorch) from the same initial weights, alternating
# rounds at 1 and 2 threads; raw logs beside this script, one summary line per run.
#   sh run.sh BUILD_DIR CORPUS [PYTHON] [STEPS] [ROUNDS]
set -eu
build=$1 corpus=$2 python=${3:-python3} steps=${4:-30} rounds=${5:-3}
here=$(cd "$(dirname "$0")" && pwd)
src=$(cd "$here/../../.." && pwd)
init=$(mktemp)
for threads in 1 2; do
  for round in $(seq "$rounds"); do
    OMP_NUM_THREADS=$threads "$build/bin/own_llama" "$corpus" "$steps" cpu "$init" > "$here/cumulus_t${threads}_r${round}.log"
    OMP_NUM_THREADS=$threads "$python" "$src/apps/quickstart/own_llama.py" "$corpus" "$steps" "$init" > "$here/pytorch_t${threads}_r${round}.log"
    echo "threads $threads round $round: cumulus $(tail -1 "$here/cumulus_t${threads}_r${round}.log" | awk '{print $NF}') ms/step," \
         "PyTorch $(tail -1 "$here/pytorch_t${threads}_r${round}.log" | awk '{print $NF}') ms/step, load $(cut -d' ' -f1 /proc/loadavg)"
  done
done | tee "$here/summary.txt"
rm -f "$init"
