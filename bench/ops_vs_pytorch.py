#!/usr/bin/env python3
"""The op families (Note [Op families against PyTorch], bench/op_families.h) timed side by side:
bench_ops' `families/` benchmarks and bench/pytorch/op_families.py, alternating round by round, at
each thread count (and, with --capabilities, each of cumulus's vector paths through
CUMULUS_CPU_CAPABILITY). Per family and pass: the median over rounds of each side's median
repetition, and cumulus / PyTorch (below 1: cumulus is faster). Writes raw.json and summary.md.

PyTorch runs at its default capability (its widest on this CPU) once a round, and each of cumulus's
paths is compared with that run; with --pytorch-capability matched it runs once a round per
capability instead, with ATEN_CPU_CAPABILITY set to the same instruction set as cumulus's path
(avx2 -> avx2, avx512 -> avx512), which is what a user of a CPU with only that instruction set gets
from both (a capability with no ATen name, scalar, takes PyTorch's default), and writes beside
summary.md summary_pytorch_default.md: each path against the run at PyTorch's default capability
on this CPU (when one of the matched runs is at it).

  bench/ops_vs_pytorch.py --bench-ops build/bin/bench_ops --python /path/to/venv/bin/python --out DIR
                          [--threads 1,2] [--capabilities avx512,avx2] [--rounds 3] [--min-time 0.1]
                          [--pytorch-capability default|matched]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
# CUMULUS_CPU_CAPABILITY -> ATEN_CPU_CAPABILITY, for --pytorch-capability matched.
ATEN_CAPABILITY = {"avx512": "avx512", "avx2": "avx2"}


def run_json(cmd, env):
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    if r.returncode != 0:
        sys.exit("failed (%d): %s\n%s" % (r.returncode, " ".join(cmd), r.stderr[-3000:]))
    return json.loads(r.stdout)


def medians(report):
    """name -> median real time (us) over the report's repetitions."""
    times = {}
    for b in report["benchmarks"]:
        if b.get("run_type", "iteration") != "iteration":
            continue  # Google Benchmark's aggregates
        name = b["name"].replace("/manual_time", "")
        scale = {"ns": 1e-3, "us": 1.0, "ms": 1e3}[b.get("time_unit", "ns")]
        times.setdefault(name, []).append(b["real_time"] * scale)
    return {k: statistics.median(v) for k, v in times.items()}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bench-ops", required=True)
    p.add_argument("--python", default=sys.executable, help="an interpreter with torch")
    p.add_argument("--out", required=True)
    p.add_argument("--threads", default="1,%d" % os.cpu_count())
    p.add_argument("--capabilities", default="", help="CUMULUS_CPU_CAPABILITY values, e.g. avx512,avx2 (default: the CPU's)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--min-time", type=float, default=0.1)
    p.add_argument("--repetitions", type=int, default=3)
    p.add_argument("--filter", default="families/")
    p.add_argument("--pytorch-capability", choices=["default", "matched"], default="default",
                   help="PyTorch at its default capability, or at each of cumulus's (ATEN_CPU_CAPABILITY)")
    a = p.parse_args()
    os.makedirs(a.out, exist_ok=True)
    capabilities = a.capabilities.split(",") if a.capabilities else [""]
    raw = {"date": time.strftime("%Y-%m-%d %H:%M"), "load_before": os.getloadavg(),
           "pytorch_capability": a.pytorch_capability, "runs": []}
    # PyTorch's runs a round: ATEN_CPU_CAPABILITY, or None for its default.
    if a.pytorch_capability == "matched":
        theirs_runs = list(dict.fromkeys(ATEN_CAPABILITY.get(cap) for cap in capabilities))
    else:
        theirs_runs = [None]
    ours_t, theirs_t = {}, {}  # (threads, cumulus capability / PyTorch's, name) -> [median per round]
    for threads in [int(t) for t in a.threads.split(",")]:
        for r in range(a.rounds):
            for cap in capabilities:
                env = dict(os.environ, OPENBLAS_NUM_THREADS=str(threads), OMP_NUM_THREADS=str(threads))
                if cap:
                    env["CUMULUS_CPU_CAPABILITY"] = cap
                ours = run_json([a.bench_ops, "--benchmark_filter=" + a.filter, "--benchmark_min_time=%g" % a.min_time,
                                 "--benchmark_repetitions=%d" % a.repetitions, "--benchmark_format=json"], env)
                raw["runs"].append({"who": "cumulus", "threads": threads, "capability": cap, "round": r, "report": ours})
                for name, t in medians(ours).items():
                    ours_t.setdefault((threads, cap, name), []).append(t)
            for aten in theirs_runs:
                env = dict(os.environ, OMP_NUM_THREADS=str(threads))
                env.pop("ATEN_CPU_CAPABILITY", None)
                if aten:
                    env["ATEN_CPU_CAPABILITY"] = aten
                theirs = run_json([a.python, os.path.join(HERE, "pytorch", "op_families.py"), "--threads", str(threads),
                                   "--min-time", str(a.min_time), "--repetitions", str(a.repetitions), "--filter",
                                   a.filter], env)
                raw["runs"].append({"who": "pytorch", "threads": threads, "round": r, "aten_capability": aten or "default",
                                    "report": theirs})
                for name, t in medians(theirs).items():
                    theirs_t.setdefault((threads, aten, name), []).append(t)
    raw["load_after"] = os.getloadavg()
    # PyTorch's default capability on this CPU (AVX512 -> avx512): in a matched run, its run at that
    # capability is also the comparison with PyTorch at its default.
    default = subprocess.run([a.python, "-c", "import torch; print(torch.backends.cpu.get_cpu_capability())"],
                             stdout=subprocess.PIPE, text=True, env={k: v for k, v in os.environ.items()
                                                                     if k != "ATEN_CPU_CAPABILITY"}).stdout.strip().lower()
    raw["pytorch_default_capability"] = default
    with open(os.path.join(a.out, "raw.json"), "w") as f:
        json.dump(raw, f)

    def table(pytorch_of):
        """Rows for each cumulus path against the PyTorch run pytorch_of(cap) (an ATEN capability or None)."""
        rows = ["| threads | cumulus path | PyTorch path | family / pass | cumulus us | PyTorch us | cumulus / PyTorch |",
                "|---|---|---|---|---|---|---|"]
        for (threads, cap, name), mine in sorted(ours_t.items()):
            theirs = theirs_t.get((threads, pytorch_of(cap), name))
            if not theirs:
                continue
            c, t = statistics.median(mine), statistics.median(theirs)
            flag = " **slower**" if c > t else ""
            rows.append("| %d | %s | %s | %s | %.1f | %.1f | %.2fx%s |" % (
                threads, cap or "default", (pytorch_of(cap) or default) + (" (default)" if (pytorch_of(cap) or default) == default else ""),
                name.replace("families/", "").replace("/cpu", ""), c, t, c / t, flag))
        return rows

    if a.pytorch_capability == "matched":
        rows = table(lambda cap: ATEN_CAPABILITY.get(cap))
        if default in theirs_runs:  # each path against PyTorch at its default, from the same runs
            with open(os.path.join(a.out, "summary_pytorch_default.md"), "w") as f:
                f.write("\n".join(table(lambda cap: default)) + "\n")
    else:
        rows = table(lambda cap: None)
    with open(os.path.join(a.out, "summary.md"), "w") as f:
        f.write("\n".join(rows) + "\n")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
