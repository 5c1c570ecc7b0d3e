#!/usr/bin/env python3
"""Before, after and PyTorch in one run: bench/gpt_compare.py's commands (the same initial weights,
windows and flags), with the before and after `gpt` builds and the PyTorch twin taking turns each
round (the order rotating by round), so that the load of a shared machine drifts over all three alike.
Writes <out>/three_way_<config>.json: every step time after the first two of each run, and the medians.

  three_way.py --before DIR --after DIR --data DIR --out DIR --config small|large [--steps N] [--rounds R]

DIR of --before / --after holds that build's `gpt` and libcumulus_engine.so (LD_LIBRARY_PATH)."""
import argparse, json, os, statistics, subprocess, sys, time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", ".."))
from gpt_compare import CONFIGS, read_jsonl  # noqa: E402

p = argparse.ArgumentParser()
for flag in ("--before", "--after", "--data", "--out", "--config"):
    p.add_argument(flag, required=True)
p.add_argument("--steps", type=int, default=20)
p.add_argument("--rounds", type=int, default=6)
a = p.parse_args()
cfg = CONFIGS[a.config]
corpus = os.path.join(a.data, "shakespeare.txt")
os.makedirs(a.out, exist_ok=True)
shape = ["--context", str(cfg["context"]), "--width", str(cfg["width"]), "--heads", str(cfg["heads"]), "--layers",
         str(cfg["layers"])]
common = ["--micro-batch", str(cfg["micro_batch"]), "--accum-steps", str(cfg["accum_steps"]), "--steps", str(a.steps),
          "--warmup", str(max(1, a.steps // 10)), "--eval-every", "0", "--eval-windows", "8", "--threads", "1",
          "--seed", "1337"]
env = dict(os.environ, OMP_NUM_THREADS="1")


def run(cmd, lib=None):
    e = dict(env, LD_LIBRARY_PATH=lib) if lib else env
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=e)
    if r.returncode != 0:
        sys.exit("failed: %s\n%s" % (" ".join(cmd), r.stdout[-2000:]))


init = os.path.join(a.out, a.config + "_init.safetensors")
run([os.path.join(a.after, "gpt"), "train", "--data", corpus] + shape +
    ["--steps", "0", "--warmup", "0", "--save", init, "--quiet"], a.after)
who = ["before", "after", "pytorch"]
times = {w: [] for w in who}
losses = {w: None for w in who}
load = [os.getloadavg()]
for r in range(a.rounds):
    for w in who[r % 3:] + who[:r % 3]:
        metrics = os.path.join(a.out, "%s_%s_%d.jsonl" % (a.config, w, r))
        if os.path.exists(metrics):
            os.remove(metrics)
        if w == "pytorch":
            run([sys.executable, os.path.join(HERE, "..", "..", "pytorch", "gpt.py"), "--data", corpus, "--init", init,
                 "--metrics", metrics] + common)
        else:
            d = a.before if w == "before" else a.after
            run([os.path.join(d, "gpt"), "train", "--data", corpus, "--init", init, "--metrics", metrics, "--quiet"] +
                shape + common, d)
        steps = [l for l in read_jsonl(metrics) if "loss" in l]
        times[w] += [l["step_seconds"] for l in steps[2:]]
        losses[w] = [l["loss"] for l in steps]
    load.append(os.getloadavg())
med = {w: statistics.median(t) for w, t in times.items()}
out = {"date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "config": dict(cfg, steps=a.steps, rounds=a.rounds),
       "load_per_round": load, "step_seconds": times, "median_step_seconds": med,
       "after_over_before": med["after"] / med["before"], "before_over_pytorch": med["before"] / med["pytorch"],
       "after_over_pytorch": med["after"] / med["pytorch"],
       "max_loss_diff_after_pytorch": max(abs(x - y) for x, y in zip(losses["after"], losses["pytorch"]))}
with open(os.path.join(a.out, "three_way_%s.json" % a.config), "w") as f:
    json.dump(out, f, indent=1)
print(a.config, "median ms: before %.1f after %.1f pytorch %.1f; after/before %.2f, before/pytorch %.2fx, "
      "after/pytorch %.2fx" % (med["before"] * 1e3, med["after"] * 1e3, med["pytorch"] * 1e3,
                               out["after_over_before"], out["before_over_pytorch"], out["after_over_pytorch"]))
