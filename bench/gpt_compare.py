#!/usr/bin/env python3
"""cumulus' `gpt train` against its PyTorch twin (bench/pytorch/gpt.py), side by side on one machine.

Both start from the same weights (`gpt train --steps 0 --save`), read the same windows and take the
same steps; runs alternate (cumulus, PyTorch, cumulus, ...) so that load drifts hit both alike.
Reports, per config: the largest per-step loss difference, the validation losses, and the median
time per optimizer step of each (steps after the first two of a run, over all rounds), with their
ratio. Writes summary.json and summary.md to --out.

  bench/gpt_compare.py --gpt build/bin/gpt --data ../shared/data/shakespeare --out DIR
                       [--configs small,large] [--steps 30] [--rounds 3] [--threads 1] [--compile]
"""

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

CONFIGS = {  # nanoGPT-style flag sets; the two sizes
    "small": dict(context=64, width=128, heads=4, layers=4, micro_batch=8, accum_steps=4),
    "large": dict(context=256, width=256, heads=8, layers=6, micro_batch=8, accum_steps=4),
}
HERE = os.path.dirname(os.path.abspath(__file__))


def read_jsonl(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def run(cmd, env=None):
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    if r.returncode != 0:
        sys.exit("failed (%d): %s\n%s" % (r.returncode, " ".join(cmd), r.stdout[-3000:]))
    return r.stdout


def compare(name, cfg, a, corpus, out):
    init = os.path.join(out, name + "_init.safetensors")
    shape = ["--context", str(cfg["context"]), "--width", str(cfg["width"]), "--heads", str(cfg["heads"]),
             "--layers", str(cfg["layers"])]
    common = ["--micro-batch", str(cfg["micro_batch"]), "--accum-steps", str(cfg["accum_steps"]), "--steps",
              str(a.steps), "--warmup", str(max(1, a.steps // 10)), "--eval-every", "0", "--eval-windows",
              str(a.eval_windows), "--threads", str(a.threads), "--seed", "1337"]
    run([a.gpt, "train", "--data", corpus] + shape + ["--steps", "0", "--warmup", "0", "--save", init, "--quiet"])
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads))
    times = {"cumulus": [], "pytorch": []}
    runs = {"cumulus": [], "pytorch": []}
    for r in range(a.rounds):
        for who in ("cumulus", "pytorch"):
            metrics = os.path.join(out, "%s_%s_%d.jsonl" % (name, who, r))
            if os.path.exists(metrics):
                os.remove(metrics)
            if who == "cumulus":
                run([a.gpt, "train", "--data", corpus, "--init", init, "--metrics", metrics, "--quiet"] + shape + common,
                    env)
            else:
                cmd = [sys.executable, os.path.join(HERE, "pytorch", "gpt.py"), "--data", corpus, "--init", init,
                       "--metrics", metrics] + common
                if a.compile:
                    cmd.append("--compile")
                run(cmd, env)
            lines = read_jsonl(metrics)
            steps = [l for l in lines if "loss" in l]
            runs[who].append(lines)
            times[who] += [l["step_seconds"] for l in steps[2:]]
    c_steps = [l for l in runs["cumulus"][0] if "loss" in l]
    p_steps = [l for l in runs["pytorch"][0] if "loss" in l]
    c_val = [l["val_loss"] for l in runs["cumulus"][0] if "val_loss" in l][-1]
    p_val = [l["val_loss"] for l in runs["pytorch"][0] if "val_loss" in l][-1]
    med = {k: statistics.median(v) for k, v in times.items()}
    return {
        "config": dict(cfg, steps=a.steps, threads=a.threads, rounds=a.rounds),
        "max_step_loss_diff": max(abs(x["loss"] - y["loss"]) for x, y in zip(c_steps, p_steps)),
        "final_loss": {"cumulus": c_steps[-1]["loss"], "pytorch": p_steps[-1]["loss"]},
        "val_loss": {"cumulus": c_val, "pytorch": p_val, "diff": abs(c_val - p_val)},
        "median_step_seconds": med,
        "min_step_seconds": {k: min(v) for k, v in times.items()},
        "max_step_seconds": {k: max(v) for k, v in times.items()},
        "ratio_cumulus_over_pytorch": med["cumulus"] / med["pytorch"],
    }


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--gpt", required=True, help="the built gpt app")
    p.add_argument("--data", required=True, help="folder holding shakespeare.txt, or the text file")
    p.add_argument("--out", required=True)
    p.add_argument("--configs", default="small,large")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--eval-windows", type=int, default=32)
    p.add_argument("--compile", action="store_true", help="torch.compile the twin's model")
    a = p.parse_args()
    corpus = os.path.join(a.data, "shakespeare.txt") if os.path.isdir(a.data) else a.data
    os.makedirs(a.out, exist_ok=True)
    import torch
    results = {"date": time.strftime("%Y-%m-%d"), "machine": platform.processor() or platform.machine(),
               "cpu_count": os.cpu_count(), "load_before": os.getloadavg(), "torch": torch.__version__,
               "compile": a.compile, "configs": {}}
    for name in a.configs.split(","):
        results["configs"][name] = compare(name, CONFIGS[name], a, corpus, a.out)
        print(name, json.dumps(results["configs"][name]), flush=True)
    results["load_after"] = os.getloadavg()
    with open(os.path.join(a.out, "summary.json"), "w") as f:
        json.dump(results, f, indent=2)
    rows = ["| config | cumulus ms/step | PyTorch ms/step | ratio | max step-loss diff | val loss (cumulus / PyTorch) |",
            "|---|---|---|---|---|---|"]
    for name, r in results["configs"].items():
        m = r["median_step_seconds"]
        rows.append("| %s | %.1f | %.1f | %.2fx | %.1e | %.6f / %.6f |" % (
            name, m["cumulus"] * 1e3, m["pytorch"] * 1e3, r["ratio_cumulus_over_pytorch"], r["max_step_loss_diff"],
            r["val_loss"]["cumulus"], r["val_loss"]["pytorch"]))
    with open(os.path.join(a.out, "summary.md"), "w") as f:
        f.write("\n".join(rows) + "\n")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
