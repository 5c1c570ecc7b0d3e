#!/usr/bin/env python3
"""cumulus' `gpt train` against its PyTorch twin (bench/pytorch/gpt.py), side by side on one machine.

Both start from the same weights (`gpt train --steps 0 --save`), read the same windows and take the
same steps; runs alternate (cumulus, PyTorch, cumulus, ...) so that load drifts hit both alike.
Reports, per config: the largest per-step loss difference, the validation losses, and the median
time per optimizer step of each (steps after the first two of a run, over all rounds), with their
ratio, and the tokens per second those medians give. Writes summary.json and summary.md to --out.

  bench/gpt_compare.py --gpt build/bin/gpt --data ../shared/data/shakespeare --out DIR
                       [--configs small,large] [--steps 30] [--rounds 3] [--threads 1] [--compile]
                       [--device cpu|cuda] [--precision fp32|bf16]

On CUDA, `gpt2s` is GPT-2 small's shape (context 1024, width 768, 12 heads, 12 blocks) with the
character vocabulary; both engines then run f32 without TF32, or bf16 compute with fp32 weights.
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
    "gpt2s": dict(context=1024, width=768, heads=12, layers=12, micro_batch=8, accum_steps=4),
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
              str(a.steps), "--warmup", str(a.warmup or max(1, a.steps // 10)), "--eval-every", str(a.eval_every),
              "--eval-windows",
              str(a.eval_windows), "--threads", str(a.threads), "--seed", "1337", "--device", a.device,
              "--precision", a.precision]
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
    if a.plot:
        write_curves(os.path.join(out, name + "_curves.svg"), runs["cumulus"][0], runs["pytorch"][0])
    return {
        "config": dict(cfg, steps=a.steps, threads=a.threads, rounds=a.rounds),
        "max_step_loss_diff": max(abs(x["loss"] - y["loss"]) for x, y in zip(c_steps, p_steps)),
        "max_step_loss_diff_first_200": max(abs(x["loss"] - y["loss"]) for x, y in zip(c_steps[:200], p_steps[:200])),
        "val_losses": {"cumulus": [(l["step"], l["val_loss"]) for l in runs["cumulus"][0] if "val_loss" in l],
                       "pytorch": [(l["step"], l["val_loss"]) for l in runs["pytorch"][0] if "val_loss" in l]},
        "final_loss": {"cumulus": c_steps[-1]["loss"], "pytorch": p_steps[-1]["loss"]},
        "val_loss": {"cumulus": c_val, "pytorch": p_val, "diff": abs(c_val - p_val)},
        "median_step_seconds": med,
        "min_step_seconds": {k: min(v) for k, v in times.items()},
        "max_step_seconds": {k: max(v) for k, v in times.items()},
        "ratio_cumulus_over_pytorch": med["cumulus"] / med["pytorch"],
        "tokens_per_second": {k: cfg["micro_batch"] * cfg["accum_steps"] * cfg["context"] / v for k, v in med.items()},
    }


def write_curves(path, cumulus, pytorch, width=640, height=360):
    """Train (per step) and validation (per evaluation) loss of both runs as one SVG."""
    series = [("cumulus train", "#1f77b4", [(l["step"], l["loss"]) for l in cumulus if "loss" in l], 1.2),
              ("PyTorch train", "#ff7f0e", [(l["step"], l["loss"]) for l in pytorch if "loss" in l], 1.2),
              ("cumulus validation", "#1f3f8f", [(l["step"], l["val_loss"]) for l in cumulus if "val_loss" in l], 2.5),
              ("PyTorch validation", "#c04000", [(l["step"], l["val_loss"]) for l in pytorch if "val_loss" in l], 2.5)]
    xs = [x for _, _, pts, _ in series for x, _ in pts]
    ys = [y for _, _, pts, _ in series for _, y in pts]
    x0, x1, y0, y1 = 0, max(xs), min(ys), min(max(ys), min(ys) + 3.0)
    px = lambda x: 60 + (width - 80) * (x - x0) / (x1 - x0 or 1)
    py = lambda y: 20 + (height - 60) * (1 - (min(y, y1) - y0) / (y1 - y0 or 1))
    out = ['<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="12">'
           % (width, height), '<rect width="100%" height="100%" fill="white"/>']
    for i in range(6):
        y = y0 + (y1 - y0) * i / 5
        out.append('<line x1="60" x2="%d" y1="%.1f" y2="%.1f" stroke="#ddd"/><text x="5" y="%.1f">%.2f</text>'
                   % (width - 20, py(y), py(y), py(y) + 4, y))
    out.append('<text x="%d" y="%d">optimizer step (0 - %d)</text>' % (width // 2 - 60, height - 10, x1))
    for k, (label, color, pts, w) in enumerate(series):
        d = " ".join("%.1f,%.1f" % (px(x), py(y)) for x, y in pts)
        out.append('<polyline fill="none" stroke="%s" stroke-width="%.1f" points="%s"/>' % (color, w, d))
        out.append('<text x="%d" y="%d" fill="%s">%s</text>' % (width - 200, 40 + 16 * k, color, label))
    out.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")


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
    p.add_argument("--eval-every", type=int, default=0, help="validation every E steps (0: at the end only)")
    p.add_argument("--warmup", type=int, default=0, help="warmup steps (0: a tenth of --steps)")
    p.add_argument("--plot", action="store_true", help="also write <config>_curves.svg: train and validation loss")
    p.add_argument("--compile", action="store_true", help="torch.compile the twin's model")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    a = p.parse_args()
    corpus = os.path.join(a.data, "shakespeare.txt") if os.path.isdir(a.data) else a.data
    os.makedirs(a.out, exist_ok=True)
    import torch
    results = {"date": time.strftime("%Y-%m-%d"), "machine": platform.processor() or platform.machine(),
               "cpu_count": os.cpu_count(), "load_before": os.getloadavg(), "torch": torch.__version__,
               "compile": a.compile, "device": a.device, "precision": a.precision, "configs": {}}
    if a.device == "cuda":
        results["gpu"] = torch.cuda.get_device_name(0)
    # Which kernels cumulus' GEMMs run (OpenBLAS's choice, or the environment's OPENBLAS_CORETYPE).
    results["cumulus_cpu_kernels"] = next((l for l in run([a.gpt, "--version"]).splitlines() if l.startswith("CPU:")), "")
    results["OPENBLAS_CORETYPE"] = os.environ.get("OPENBLAS_CORETYPE")
    print(results["cumulus_cpu_kernels"], "| OPENBLAS_CORETYPE:", results["OPENBLAS_CORETYPE"], flush=True)
    for name in a.configs.split(","):
        results["configs"][name] = compare(name, CONFIGS[name], a, corpus, a.out)
        print(name, json.dumps(results["configs"][name]), flush=True)
    results["load_after"] = os.getloadavg()
    with open(os.path.join(a.out, "summary.json"), "w") as f:
        json.dump(results, f, indent=2)
    rows = ["| config | cumulus ms/step | PyTorch ms/step | ratio | tokens/s (cumulus / PyTorch) | max step-loss diff "
            "| val loss (cumulus / PyTorch) |",
            "|---|---|---|---|---|---|---|"]
    for name, r in results["configs"].items():
        m = r["median_step_seconds"]
        tps = r["tokens_per_second"]
        rows.append("| %s | %.1f | %.1f | %.2fx | %.0f / %.0f | %.1e | %.6f / %.6f |" % (
            name, m["cumulus"] * 1e3, m["pytorch"] * 1e3, r["ratio_cumulus_over_pytorch"], tps["cumulus"],
            tps["pytorch"], r["max_step_loss_diff"], r["val_loss"]["cumulus"], r["val_loss"]["pytorch"]))
    with open(os.path.join(a.out, "summary.md"), "w") as f:
        f.write("\n".join(rows) + "\n")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
