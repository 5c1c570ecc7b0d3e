#!/usr/bin/env python3
"""The planner's time and peak prediction against measurement (issue 31), on this machine.

For each (model, budget) it trains --epochs 1 with --effective-batch and --memory-budget, so the
planner chooses the plan, and reads the first epoch's metrics line: predicted_epoch_seconds and
predicted_peak_bytes (the chosen row) against epoch_seconds (training only, no test pass) and
peak_bytes (the tracker's). Each case runs --repeats times; the table takes the median.

  bench/planner_time.py --bin build/bin/fashion_mnist --data /work/shared/data/fashion-mnist \
      --out bench/results/2026-11-24-cpu-planner-time/raw.json
"""
import argparse, json, os, statistics, subprocess, tempfile

# (name, model, train limit, effective batch, budgets, flags): budgets picked from --plan-only's
# reserved bytes so that each gives a different micro-batch; "levers" lets the planner choose the
# CNN's recompute segments and bf16 too (Note [Plan levers]).
CASES = [
    ("mlp", "mlp", 60000, 4096, ["110MiB", "90MiB", "75MiB", "63MiB", "58MiB"], []),
    ("cnn", "cnn", 10000, 256, ["180MiB", "100MiB", "62MiB", "42MiB", "32MiB"], []),
    ("levers", "cnn", 10000, 256, ["100MiB", "62MiB", "48MiB", "42MiB"], ["--recompute", "auto", "--precision", "auto"]),
]


def run_once(binary, data, model, limit, eff, budget, flags):
    with tempfile.TemporaryDirectory() as d:
        metrics = os.path.join(d, "m.jsonl")
        cmd = [binary, "--data", data, "--device", "cpu", "--model", model, "--train-limit", str(limit),
               "--test-limit", "1000", "--epochs", "1", "--effective-batch", str(eff), "--memory-budget", budget,
               "--metrics", metrics] + flags
        out = subprocess.run(cmd, capture_output=True, text=True)
        if out.returncode != 0:
            raise SystemExit(f"{' '.join(cmd)} failed:\n{out.stdout}{out.stderr}")
        line = json.loads(open(metrics).readline())
        run = {k: line[k] for k in ("micro_batch_size", "accum_steps", "epoch_seconds", "predicted_epoch_seconds",
                                    "peak_bytes", "predicted_peak_bytes", "precision")}
        chosen = [l for l in out.stdout.splitlines() if l.startswith("planner: micro-batch")]
        run["plan"] = chosen[0].split(":")[1].strip() if chosen else ""
        return run


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="build/bin/fashion_mnist")
    ap.add_argument("--data", default="/work/shared/data/fashion-mnist")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", required=True)
    ap.add_argument("--cases", default="mlp,cnn,levers", help="comma-separated case names")
    a = ap.parse_args()
    rows = []
    for name, model, limit, eff, budgets, flags in CASES:
        if name not in a.cases.split(","):
            continue
        for budget in budgets:
            runs = [run_once(a.bin, a.data, model, limit, eff, budget, flags) for _ in range(a.repeats)]
            measured = statistics.median(r["epoch_seconds"] for r in runs)
            predicted = statistics.median(r["predicted_epoch_seconds"] for r in runs)
            row = {"case": name, "flags": flags, "plan": runs[0]["plan"], "model": model, "train_limit": limit, "effective_batch": eff, "budget": budget,
                   "micro_batch": runs[0]["micro_batch_size"], "runs": runs,
                   "predicted_epoch_seconds_median": predicted, "measured_epoch_seconds_median": measured,
                   "error_percent": 100.0 * (predicted - measured) / measured}
            rows.append(row)
            print(f"{name} {budget:>7} {row['plan']}: micro-batch {row['micro_batch']:>5}: predicted {predicted:.3f} s, measured "
                  f"{measured:.3f} s ({row['error_percent']:+.1f}%); peak predicted "
                  f"{[r['predicted_peak_bytes'] for r in runs]} measured {[r['peak_bytes'] for r in runs]}",
                  flush=True)
    with open(a.out, "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
