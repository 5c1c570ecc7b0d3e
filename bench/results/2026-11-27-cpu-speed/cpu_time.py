#!/usr/bin/env python3
"""CPU seconds per optimizer step (user + system, from getrusage of the child), before, after and
PyTorch taking turns: each side runs `--steps S0` and `--steps S1` with three_way.py's flags, and
(cpu(S1) - cpu(S0)) / (S1 - S0) is its time per step without startup and the final evaluation. On a
shared machine this leaves out the time a run waits for a core (the other engineers' builds), which
the wall-clock step times of gpt_compare.py include; it keeps what sharing the caches and memory costs.

  cpu_time.py --before DIR --after DIR --data DIR --out DIR --config small|large [--steps 2,12] [--rounds 3]"""
import argparse, json, os, resource, statistics, subprocess, sys, time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", ".."))
from gpt_compare import CONFIGS  # noqa: E402

p = argparse.ArgumentParser()
for flag in ("--before", "--after", "--data", "--out", "--config"):
    p.add_argument(flag, required=True)
p.add_argument("--steps", default="2,12")
p.add_argument("--rounds", type=int, default=3)
a = p.parse_args()
s0, s1 = (int(s) for s in a.steps.split(","))
cfg = CONFIGS[a.config]
corpus = os.path.join(a.data, "shakespeare.txt")
os.makedirs(a.out, exist_ok=True)
shape = ["--context", str(cfg["context"]), "--width", str(cfg["width"]), "--heads", str(cfg["heads"]), "--layers",
         str(cfg["layers"])]
env = dict(os.environ, OMP_NUM_THREADS="1")


def cpu_of(cmd, lib=None):
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    r = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                       env=dict(env, LD_LIBRARY_PATH=lib) if lib else env)
    if r.returncode != 0:
        sys.exit("failed: %s\n%s" % (" ".join(cmd), r.stderr[-2000:]))
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


init = os.path.join(a.out, a.config + "_init.safetensors")
subprocess.run([os.path.join(a.after, "gpt"), "train", "--data", corpus] + shape +
               ["--steps", "0", "--warmup", "0", "--save", init, "--quiet"], check=True,
               env=dict(env, LD_LIBRARY_PATH=a.after), stdout=subprocess.DEVNULL)
who = ["before", "after", "pytorch"]
per_step = {w: [] for w in who}
load = [os.getloadavg()]
for r in range(a.rounds):
    for w in who[r % 3:] + who[:r % 3]:
        cpu = {}
        for steps in (s0, s1):
            common = ["--micro-batch", str(cfg["micro_batch"]), "--accum-steps", str(cfg["accum_steps"]), "--steps",
                      str(steps), "--warmup", "1", "--eval-every", "0", "--eval-windows", "8", "--threads", "1",
                      "--seed", "1337"]
            metrics = os.path.join(a.out, "cpu_%s_%s_%d_%d.jsonl" % (a.config, w, r, steps))
            if os.path.exists(metrics):
                os.remove(metrics)
            if w == "pytorch":
                cpu[steps] = cpu_of([sys.executable, os.path.join(HERE, "..", "..", "pytorch", "gpt.py"), "--data",
                                     corpus, "--init", init, "--metrics", metrics] + common)
            else:
                d = a.before if w == "before" else a.after
                cpu[steps] = cpu_of([os.path.join(d, "gpt"), "train", "--data", corpus, "--init", init, "--metrics",
                                     metrics, "--quiet"] + shape + common, d)
        per_step[w].append((cpu[s1] - cpu[s0]) / (s1 - s0))
    load.append(os.getloadavg())
med = {w: statistics.median(v) for w, v in per_step.items()}
out = {"date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "config": dict(cfg, steps=[s0, s1],
       rounds=a.rounds), "load_per_round": load, "cpu_seconds_per_step": per_step, "median": med,
       "after_over_before": med["after"] / med["before"], "before_over_pytorch": med["before"] / med["pytorch"],
       "after_over_pytorch": med["after"] / med["pytorch"]}
with open(os.path.join(a.out, "cpu_time_%s.json" % a.config), "w") as f:
    json.dump(out, f, indent=1)
print(a.config, "CPU ms per step (median of %d): before %.1f after %.1f pytorch %.1f; after/before %.2f, "
      "before/pytorch %.2fx, after/pytorch %.2fx" % (a.rounds, med["before"] * 1e3, med["after"] * 1e3,
                                                    med["pytorch"] * 1e3, out["after_over_before"],
                                                    out["before_over_pytorch"], out["after_over_pytorch"]))
