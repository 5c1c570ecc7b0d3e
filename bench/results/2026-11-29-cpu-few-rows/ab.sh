#!/bin/bash
# The seed MLP's epoch by two builds of fashion_mnist, alternated, 3 rounds at 1 thread (pinned) and 2:
# ab.sh BASE_BIN NEW_BIN OUT (the table on stdout). BASE: 91bfe93; NEW: the few-row GEMMs.
base_bin=$1; new_bin=$2; out=$3; mkdir -p $out
data=${DATA:-../shared/data}/fashion-mnist
for threads in 1 2; do
  pin=$([ $threads = 1 ] && echo "taskset -c 1" || echo "")
  for r in 0 1 2; do
    for ba in "16 4" "64 1"; do set -- $ba
      for v in base new; do
        bin=$([ $v = base ] && echo $base_bin || echo $new_bin)
        $pin $bin --data $data --epochs 2 --batch-size $1 --accum-steps $2 --threads $threads --quiet --metrics $out/${v}_${1}x${2}_t${threads}_r$r.jsonl > /dev/null
      done
    done
  done
done
python3 - $out <<'PY'
import json, sys, glob, statistics, os
out = sys.argv[1]
rows = {}
for f in sorted(glob.glob(out + "/*.jsonl")):
    v, cfg, t, r = os.path.basename(f)[:-6].split("_")
    rows.setdefault((cfg, t), {}).setdefault(v, []).append(json.loads(open(f).read().splitlines()[-1])["epoch_seconds"])
print("| config | threads | 91bfe93 s/epoch (3 rounds) | few rows s/epoch | median ratio |")
print("|---|---|---|---|---|")
for (cfg, t), d in sorted(rows.items()):
    ratios = [b / n for b, n in zip(d["base"], d["new"])]
    print("| %s | %s | %s | %s | %.2fx |" % (cfg, t[1:], " ".join("%.2f" % x for x in d["base"]), " ".join("%.2f" % x for x in d["new"]), statistics.median(ratios)))
PY
