#!/usr/bin/env bash
# Reruns this folder's measurement from the repository root (issue 56): the seed MLP's epoch
# (fashion_mnist, 16 x 4 and 64 x 1) before and after ReLU's gradient went through the vector rows,
# against fast PyTorch, at 1 thread (pinned to core 0) and 2, rounds alternating. BEFORE: a
# fashion_mnist built at the commit before (default ../before/build/bin/fashion_mnist); PYTHON: an
# interpreter with torch; DATA: the folder holding fashion-mnist/; ROUNDS (default 3).
set -euo pipefail
out=bench/results/2026-11-29-cpu-seed-relu
py=${PYTHON:-python3}
data=${DATA:-../shared/data}
before=${BEFORE:-../before/build/bin/fashion_mnist}
rounds=${ROUNDS:-3}
{ lscpu | grep -E "Model name|CPU family|Model:"; grep -o "avx[0-9a-z_]*" /proc/cpuinfo | sort -u | tr "\n" " "; echo
  uname -r; git rev-parse --short HEAD; build/bin/fashion_mnist --version
  "$py" -c "import torch; print('torch', torch.__version__); print(torch.__config__.parallel_info())"
  echo "load before: $(cat /proc/loadavg)"; } > $out/machine.txt 2>&1
mkdir -p $out/raw
for r in $(seq 1 "$rounds"); do
  for t in 1 2; do
    pin=(); [[ $t == 1 ]] && pin=(taskset -c 0)
    for cfg in "16 4" "64 1"; do
      set -- $cfg
      tag=r${r}_t${t}_${1}x$2
      for side in before after; do
        bin=build/bin/fashion_mnist; [[ $side == before ]] && bin=$before
        "${pin[@]}" "$bin" --data $data/fashion-mnist --epochs 2 --batch-size $1 --accum-steps $2 --threads $t \
          --metrics $out/raw/${side}_$tag.jsonl --quiet > /dev/null
      done
      "${pin[@]}" "$py" bench/pytorch/fast_pytorch.py --data $data/fashion-mnist --device cpu --batch-size $1 \
        --accum-steps $2 --threads $t --epochs 2 --out $out/raw/fast_pytorch_$tag.json > /dev/null 2>&1
    done
  done
done
echo "load after: $(cat /proc/loadavg)" >> $out/machine.txt
"$py" - "$out" "$rounds" > $out/table.md <<'PY'
import json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
def second_epoch(side, tag):
    if side == "fast_pytorch":
        return json.load(open(f"{out}/raw/fast_pytorch_{tag}.json"))["epochs"][-1]["train_s"]
    return json.loads(open(f"{out}/raw/{side}_{tag}.jsonl").read().splitlines()[-1])["epoch_seconds"]
print("| threads | config | before s | after s | fast PyTorch s | after / before | PyTorch / after |")
print("|---|---|---|---|---|---|---|")
for t in (1, 2):
    for cfg in ("16x4", "64x1"):
        med = {s: statistics.median(second_epoch(s, f"r{r}_t{t}_{cfg}") for r in range(1, rounds + 1))
               for s in ("before", "after", "fast_pytorch")}
        print(f"| {t} | {cfg} | {med['before']:.3f} | {med['after']:.3f} | {med['fast_pytorch']:.3f} | "
              f"{med['after'] / med['before']:.3f}x | {med['fast_pytorch'] / med['after']:.2f}x |")
PY
cat $out/table.md
