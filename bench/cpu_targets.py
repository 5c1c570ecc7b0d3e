"""cumulus against PyTorch on this machine's CPU, in one run: the GPT (small and large configs), the
seed MLP's epoch (16 x 4 and 64 x 1) and the op families, at one thread and at every core, each
side by side with alternated rounds; then targets.md, each CPU speed target with its measured
value and whether it is met.

It drives the scripts that measure each part (gpt_compare.py, pytorch/fast_pytorch.py beside the
fashion_mnist app, ops_vs_pytorch.py) and keeps their outputs under --out. One-thread runs are
pinned to one core; "every core" is the process's CPU affinity. --quick makes every part tiny
(a rehearsal of the script, not a measurement); --no-run reads a finished run's outputs again (on a
machine with as many cores). From the repository root:
    python3 bench/cpu_targets.py --python /path/to/venv/bin/python --out bench/results/<date>-cpu-targets
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
# The targets: GPT step time at most this fraction of PyTorch's; seed epochs at least this many
# times faster than fast PyTorch's.
GPT_RATIO, SEED_SPEEDUP = 0.7, 2.0


def run(a, cmd, log):
    if a.no_run:
        return
    print("+", " ".join(cmd), flush=True)
    with open(log, "a") as f:
        f.write("+ " + " ".join(cmd) + "\n")
        f.flush()
        subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, check=True)


def pinned(threads):
    """taskset to the first allowed core for one thread, nothing otherwise."""
    return ["taskset", "-c", str(min(os.sched_getaffinity(0)))] if threads == 1 else []


def write_machine(a, out):
    lines = [time.strftime("%Y-%m-%d %H:%M"), "load before: %.2f %.2f %.2f" % os.getloadavg()]
    for cmd in (["lscpu"], [os.path.join(a.bin, "gpt"), "--version"],
                [a.python, "-c", "import torch; print('torch', torch.__version__); print(torch.__config__.parallel_info())"]):
        lines.append(subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True).stdout)
    lines.append(subprocess.run(["git", "-C", HERE, "rev-parse", "--short", "HEAD"], stdout=subprocess.PIPE,
                                text=True).stdout)
    with open(os.path.join(out, "machine.txt"), "w") as f:
        f.write("\n".join(lines))


def gpt_part(a, out, thread_counts):
    """{(config, threads): (cumulus s, PyTorch s)} from gpt_compare.py's summaries."""
    plans = {"small": (4, 1) if a.quick else (20, 3), "large": (2, 1) if a.quick else (6, 2)}
    configs = ["small"] if a.quick else ["small", "large"]
    result = {}
    for threads in thread_counts:
        for config in configs:
            steps, rounds = plans[config]
            folder = os.path.join(out, "gpt_%s_t%d" % (config, threads))
            cmd = [a.python, os.path.join(HERE, "gpt_compare.py"), "--gpt", os.path.join(a.bin, "gpt"), "--data",
                   os.path.join(a.data, "shakespeare"), "--out", folder, "--configs", config, "--steps", str(steps),
                   "--rounds", str(rounds), "--threads", str(threads)]
            run(a, pinned(threads) + cmd + (["--warmup", "1", "--eval-windows", "8"] if a.quick else []),
                os.path.join(out, "log.txt"))
            if not os.path.isdir(folder):  # --no-run over a run without this part
                continue
            for f in os.listdir(folder):  # weights and optimizer state: large, and not results
                if f.endswith((".safetensors", ".state")) and not a.no_run:
                    os.remove(os.path.join(folder, f))
            with open(os.path.join(folder, "summary.json")) as f:
                median = json.load(f)["configs"][config]["median_step_seconds"]
            result[(config, threads)] = (median["cumulus"], median["pytorch"])
    return result


def seed_part(a, out, thread_counts):
    """{(config, threads): [(cumulus s, PyTorch s) a round]}: the second epoch's training seconds."""
    folder = os.path.join(out, "seed")
    os.makedirs(folder, exist_ok=True)
    data = os.path.join(a.data, "fashion-mnist")
    limit = ["--train-limit", "3200", "--test-limit", "320"] if a.quick else []
    times = {}
    for threads in thread_counts:
        for r in range(1 if a.quick else 3):
            for batch, accum in ((16, 4), (64, 1)):
                tag = "%dx%d_t%d_r%d" % (batch, accum, threads, r)
                ours, theirs = os.path.join(folder, "cumulus_%s.jsonl" % tag), os.path.join(folder, "pytorch_%s.json" % tag)
                common = ["--data", data, "--epochs", "2", "--batch-size", str(batch), "--accum-steps", str(accum),
                          "--threads", str(threads)] + limit
                run(a, pinned(threads) + [os.path.join(a.bin, "fashion_mnist")] + common + ["--quiet", "--metrics", ours],
                    os.path.join(out, "log.txt"))
                run(a, pinned(threads) + [a.python, os.path.join(HERE, "pytorch", "fast_pytorch.py"), "--device", "cpu"]
                    + common + ["--out", theirs], os.path.join(out, "log.txt"))
                if not (os.path.exists(ours) and os.path.exists(theirs)):  # --no-run over a shorter run
                    continue
                with open(ours) as f:
                    mine = json.loads(f.read().splitlines()[-1])["epoch_seconds"]
                with open(theirs) as f:
                    pytorch = json.load(f)["epochs"][-1]["train_s"]
                times.setdefault(("%dx%d" % (batch, accum), threads), []).append((mine, pytorch))
    return times


# The seed CNN's families (bench/op_families.h): measured with the others, reported beside the
# target, which names the families a transformer or the seed MLP runs.
CNN_FAMILIES = ("conv2d_3x3", "batch_norm2d", "max_pool2d", "relu_maps")


def ops_part(a, out):
    """{cumulus path (the CNN's: "<path>, CNN"): [families/passes slower than PyTorch's at one
    thread]} from ops_vs_pytorch.py."""
    with open("/proc/cpuinfo") as f:
        capabilities = "avx512,avx2" if "avx512f" in f.read() else "avx2"
    folder = os.path.join(out, "ops_t1")
    cmd = [a.python, os.path.join(HERE, "ops_vs_pytorch.py"), "--bench-ops", os.path.join(a.bin, "bench_ops"),
           "--python", a.python, "--out", folder, "--threads", "1", "--capabilities", capabilities,
           "--pytorch-capability", "matched", "--rounds", "1" if a.quick else "5"]
    run(a, pinned(1) + cmd + (["--min-time", "0.01", "--repetitions", "1"] if a.quick else []),
        os.path.join(out, "log.txt"))
    slower = {key: [] for cap in capabilities.split(",") for key in (cap, cap + ", CNN")}
    if not os.path.exists(os.path.join(folder, "summary.md")):  # --no-run over a run without this part
        return {}
    with open(os.path.join(folder, "summary.md")) as f:
        for line in f:
            cells = [c.strip() for c in line.split("|")[1:-1]]
            if len(cells) == 7 and cells[0] == "1" and "slower" in cells[6]:
                cnn = cells[3].split("/")[0] in CNN_FAMILIES
                slower[cells[1] + (", CNN" if cnn else "")].append("%s (%s)" % (cells[3], cells[6].split()[0]))
    return slower


def verdict(ok):
    return "met" if ok else "**not met**"


def write_targets(out, all_cores, gpt, seed, ops):
    rows = ["| target | measured | |", "|---|---|---|"]
    for config in ("small", "large"):
        for threads in (1, all_cores):
            if (config, threads) in gpt:
                c, p = gpt[(config, threads)]
                rows.append("| GPT %s, %d thread%s: step at most %.1fx PyTorch's | %.1f / %.1f ms = %.3fx | %s |" % (
                    config, threads, "" if threads == 1 else "s", GPT_RATIO, c * 1e3, p * 1e3, c / p,
                    verdict(c / p <= GPT_RATIO)))
        if (config, 1) in gpt and (config, all_cores) in gpt and all_cores > 1:
            (c1, p1), (cn, pn) = gpt[(config, 1)], gpt[(config, all_cores)]
            rows.append("| GPT %s: speed-up from 1 to %d threads at least PyTorch's | %.2fx / %.2fx | %s |" % (
                config, all_cores, c1 / cn, p1 / pn, verdict(c1 / cn >= p1 / pn)))
    # The seed's rounds pair each epoch with the PyTorch epoch run right after it: the median of the
    # pairs' ratios, so that a slow minute of the machine moves one pair, not one side.
    for (config, threads), rounds in sorted(seed.items()):
        ratios = [p / c for c, p in rounds]
        ratio = statistics.median(ratios)
        rows.append("| seed MLP %s, %d thread%s: at least %.0fx fast PyTorch's speed | PyTorch / cumulus s a round: %s;"
                    " median %.2fx | %s |" % (config, threads, "" if threads == 1 else "s", SEED_SPEEDUP,
                                              ", ".join("%.2f / %.2f = %.2fx" % (p, c, p / c) for c, p in rounds),
                                              ratio, verdict(ratio >= SEED_SPEEDUP)))
    for cap, slow in (ops or {}).items():
        if cap.endswith(", CNN"):
            rows.append("| the seed CNN's op families, 1 thread, cumulus's %s path (beside the target) | %s | |"
                        % (cap[:-len(", CNN")], "slower: " + ", ".join(slow) if slow else "none slower"))
            continue
        rows.append("| op families, 1 thread, cumulus's %s path: none slower than PyTorch's (at the same capability) "
                    "| %s | %s |" % (cap, ", ".join(slow) if slow else "none slower", verdict(not slow)))
    with open(os.path.join(out, "targets.md"), "w") as f:
        f.write("\n".join(rows) + "\n")
    print("\n".join(rows))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bin", default="build/bin", help="the folder holding gpt, fashion_mnist and bench_ops")
    p.add_argument("--python", default=sys.executable, help="an interpreter with torch")
    p.add_argument("--data", default=os.path.join(HERE, "..", "..", "shared", "data"),
                   help="the folder holding shakespeare/ and fashion-mnist/")
    p.add_argument("--out", required=True)
    p.add_argument("--parts", default="gpt,seed,ops", help="any of gpt, seed, ops")
    p.add_argument("--quick", action="store_true", help="every part tiny: rehearse the script, measure nothing")
    p.add_argument("--no-run", action="store_true", help="run nothing: read --out's outputs again, rewrite targets.md")
    a = p.parse_args()
    os.makedirs(a.out, exist_ok=True)
    all_cores = len(os.sched_getaffinity(0))
    thread_counts = [1] if all_cores == 1 else [1, all_cores]
    parts = a.parts.split(",")
    if not a.no_run:
        write_machine(a, a.out)
    gpt = gpt_part(a, a.out, thread_counts) if "gpt" in parts else {}
    seed = seed_part(a, a.out, thread_counts) if "seed" in parts else {}
    ops = ops_part(a, a.out) if "ops" in parts else {}
    if not a.no_run:
        with open(os.path.join(a.out, "machine.txt"), "a") as f:
            f.write("load after: %.2f %.2f %.2f\n" % os.getloadavg())
    write_targets(a.out, all_cores, gpt, seed, ops)


if __name__ == "__main__":
    main()
