#!/usr/bin/env bash
# Data parallel step time on this machine: the seed MLP for one epoch at an effective batch of 64
# (micro-batch 16) and of 256 (micro-batch 64) on 1, 2 and 4 ranks through mpirun, one OpenBLAS
# thread per rank, the same weights on every layout (tests/test_dist.cpp). From each run's --metrics line: the epoch's wall
# time, the optimizer steps, and the host time spent waiting for the gradient all-reduces (a
# share of the epoch). Writes results.json and README.md into OUT_DIR.
#
#   bench/dist_scaling.sh BUILD_DIR OUT_DIR [extra app flags, e.g. --data DIR]
set -euo pipefail
build=${1:?usage: bench/dist_scaling.sh BUILD_DIR OUT_DIR [app flags]}
out=${2:?usage: bench/dist_scaling.sh BUILD_DIR OUT_DIR [app flags]}
shift 2
app="$build/bin/fashion_mnist"
[ -x "$app" ] || { echo "dist_scaling: no app at $app (build it first)" >&2; exit 2; }
command -v mpirun > /dev/null || { echo "dist_scaling: mpirun not found (install openmpi-bin)" >&2; exit 2; }
mkdir -p "$out"
root=""
[ "$(id -u)" -eq 0 ] && root="--allow-run-as-root"
ranks_list=(1 2 4)
configs=("16 64" "64 256")  # micro-batch, effective batch
for config in "${configs[@]}"; do
  read -r micro effective <<< "$config"
  for ranks in "${ranks_list[@]}"; do
    rm -f "$out/metrics_${micro}_$ranks.jsonl"
    echo "dist_scaling: micro-batch $micro, effective batch $effective, $ranks rank(s)" >&2
    mpirun $root --oversubscribe -np "$ranks" "$app" --device cpu --threads 1 --epochs 1 --batch-size "$micro" \
      --effective-batch "$effective" --quiet --metrics "$out/metrics_${micro}_$ranks.jsonl" "$@" \
      > "$out/log_${micro}_$ranks.txt" 2>&1
  done
done
python3 - "$out" "${ranks_list[@]}" <<'PY'
import json, os, platform, subprocess, sys
out, ranks = sys.argv[1], [int(r) for r in sys.argv[2:]]
rows = []
for micro, effective in ((16, 64), (64, 256)):
    for r in ranks:
        m = json.loads(open(os.path.join(out, f"metrics_{micro}_{r}.jsonl")).readline())
        steps = m["optimizer_steps"]
        # On the CPU the reductions' time is the host's wait for MPI (older metrics: communication_wait_seconds).
        wait = m.get("communication_seconds", m.get("communication_wait_seconds", 0.0))
        rows.append({"micro_batch": micro, "effective_batch": effective, "ranks": r,
                     "epoch_seconds": m["epoch_seconds"], "optimizer_steps": steps,
                     "step_ms": 1e3 * m["epoch_seconds"] / steps, "communication_wait_seconds": wait,
                     "communication_share": wait / m["epoch_seconds"],
                     "gradient_reductions": m.get("gradient_reductions", 0), "test_accuracy": m["test_accuracy"],
                     "train_loss": m["train_loss"]})
commit = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True).stdout.strip()
meta = {"machine": f"{platform.machine()}, {os.cpu_count()} cores, no GPU", "commit": commit,
        "workload": "seed MLP, 1 epoch of 60000 samples, effective batch = micro-batch x steps x ranks, "
                    "--threads 1 (one OpenBLAS thread per rank), SGD lr 1e-3"}
json.dump({"meta": meta, "runs": rows}, open(os.path.join(out, "results.json"), "w"), indent=1)
with open(os.path.join(out, "README.md"), "w") as f:
    f.write(f"# Data parallel on the CPU ({meta['machine']}, commit {meta['commit']})\n\n{meta['workload']}.\n\n")
    f.write("| micro x effective | ranks | epoch s | steps | ms/step | speedup | waiting for all-reduce | share | "
            "reductions | test acc | train loss |\n")
    f.write("|---|---|---|---|---|---|---|---|---|---|---|\n")
    for x in rows:
        base = next(y for y in rows if y["micro_batch"] == x["micro_batch"] and y["ranks"] == 1)
        f.write(f"| {x['micro_batch']} x {x['effective_batch']} | {x['ranks']} | {x['epoch_seconds']:.2f} | "
                f"{x['optimizer_steps']} | {x['step_ms']:.3f} | {base['epoch_seconds'] / x['epoch_seconds']:.2f}x | "
                f"{x['communication_wait_seconds']:.2f} s | {100 * x['communication_share']:.0f}% | "
                f"{x['gradient_reductions']} | {100 * x['test_accuracy']:.2f}% | {x['train_loss']:.6f} |\n")
print(open(os.path.join(out, "README.md")).read())
PY
