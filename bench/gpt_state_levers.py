#!/usr/bin/env python3
"""The GPT's per-rank memory and step time under each model-state lever, side by side (issue 57):
data parallel ranks (1 or 2, through mpirun), ZeRO stage (0, 1, 2), the state's placement (device,
host) and its bits (32, 8). Each combination is one `gpt train` run; its memory reports (one a rank)
give the optimizer state on the device and on the host, the gradients and the peak, its metrics the
median step time after the first two steps, its saved weights whether it trained the same as its
baseline (the same ranks with --zero 0, the device and the same bits): bit for bit is expected but
for ZeRO stage 2, which sums the gradients in another order (its relative L2 distance is given).
With --rounds R every combination runs R times, round by round, and the step time is the median of
the rounds' medians (min-max over the rounds' medians), so drifts of the machine hit all alike.

  python3 bench/gpt_state_levers.py --gpt build/bin/gpt --data ../shared/data/shakespeare --out DIR

Writes DIR/summary.json and DIR/summary.md; every run's files stay in DIR/runs/.
"""

import argparse
import hashlib
import json
import os
import statistics
import struct
import subprocess
import sys
from array import array

COMBINATIONS = [  # ranks, zero stage, placement, bits
    (1, 0, "device", 32), (1, 0, "host", 32), (1, 0, "device", 8), (1, 0, "host", 8),
    (2, 0, "device", 32), (2, 1, "device", 32), (2, 0, "host", 32), (2, 1, "host", 32),
    (2, 0, "device", 8), (2, 1, "device", 8), (2, 1, "host", 8),
    (2, 2, "device", 32), (2, 2, "host", 32), (2, 2, "device", 8),
]


def f32_tensors(path):
    """A safetensors file's f32 tensors, as arrays by name (its format: a length, a JSON header, bytes)."""
    data = open(path, "rb").read()
    (length,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + length])
    out = {}
    for name, t in header.items():
        if name != "__metadata__" and t["dtype"] == "F32":
            begin, end = t["data_offsets"]
            out[name] = array("f", data[8 + length + begin:8 + length + end])
    return out


def relative_l2(path, baseline):
    a, b = f32_tensors(path), f32_tensors(baseline)
    diff = sum((x - y) ** 2 for name in b for x, y in zip(a[name], b[name]))
    norm = sum(y * y for name in b for y in b[name])
    return (diff / norm) ** 0.5


def run(args, ranks, zero, placement, bits, round_index=0):
    tag = f"r{ranks}_z{zero}_{placement}_{bits}_round{round_index}"
    base = os.path.join(args.out, "runs", tag)
    # The same global batch at every rank count: --accum-steps per rank.
    accum = args.accum // ranks
    cmd = [args.gpt, "train", "--data", args.data, "--steps", str(args.steps), "--warmup", "2",
           "--eval-every", "0", "--micro-batch", "8", "--accum-steps", str(accum), "--threads", "1",
           "--zero", str(zero), "--optimizer-state", placement, "--optimizer-bits", str(bits), "--quiet",
           "--save", base + ".safetensors", "--metrics", base + ".jsonl", "--memory-report", base + ".json"]
    if ranks > 1:
        root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
        cmd = ["mpirun", *root, "--oversubscribe", "--bind-to", "none", "-np", str(ranks), *cmd]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"{tag} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    steps = [json.loads(l) for l in open(base + ".jsonl") if l.strip()]
    seconds = [s["step_seconds"] for s in steps if "step_seconds" in s][2:]
    rank_rows = []
    for k in range(ranks):
        report = json.load(open(base + ".json" + (f".rank{k}" if k else "")))
        s = report["summary"]
        rank_rows.append({"rank": k, "optimizer_state_bytes": s["optimizer_state_bytes"],
                          "host_optimizer_state_bytes": s["host_optimizer_state_bytes"],
                          "gradients_bytes": s["gradients_bytes"], "parameters_bytes": s["parameters_bytes"],
                          "peak_bytes": s["peak_bytes"]})
    weights = hashlib.sha256(open(base + ".safetensors", "rb").read()).hexdigest()
    return {"tag": tag, "ranks": ranks, "zero": zero, "placement": placement, "bits": bits,
            "step_ms_median": 1e3 * statistics.median(seconds), "per_rank": rank_rows, "weights_sha256": weights,
            "weights": base + ".safetensors"}


def merge_rounds(runs):
    """One row per combination: the first round's memory and weights, the rounds' medians' median."""
    first = dict(runs[0])
    medians = [r["step_ms_median"] for r in runs]
    first.update(step_ms_median=statistics.median(medians), step_ms_min=min(medians), step_ms_max=max(medians),
                 rounds=len(runs), round_medians=medians)
    return first


def same_as_baseline(r, baseline):
    if baseline is None:
        return "-"
    if r["weights_sha256"] == baseline["weights_sha256"]:
        return "bit for bit"
    return f"relative L2 {relative_l2(r['weights'], baseline['weights']):.2e}"


def table(rows):
    lines = ["| ranks | zero | state on | bits | rank | state on device | state on host | gradients | peak | "
             "step ms (median, min-max) | weights as baseline |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    baseline = {(r["ranks"], r["bits"]): r for r in rows if r["zero"] == 0 and r["placement"] == "device"}
    mib = lambda b: f"{b / 2**20:.2f} MiB"
    for r in rows:
        same = same_as_baseline(r, baseline.get((r["ranks"], r["bits"])))
        for p in r["per_rank"]:
            lines.append(f"| {r['ranks']} | {r['zero']} | {r['placement']} | {r['bits']} | {p['rank']} | "
                         f"{mib(p['optimizer_state_bytes'])} | {mib(p['host_optimizer_state_bytes'])} | "
                         f"{mib(p['gradients_bytes'])} | {mib(p['peak_bytes'])} | {r['step_ms_median']:.1f} "
                         f"({r['step_ms_min']:.1f}-{r['step_ms_max']:.1f}) | {same} |")
    return "\n".join(lines) + "\n"


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gpt", required=True)
    p.add_argument("--data", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--accum", type=int, default=4, help="micro-batches a step, all ranks together")
    p.add_argument("--rounds", type=int, default=1, help="runs of every combination, round by round")
    p.add_argument("--only", default="", help="combinations as RANKS:ZERO:PLACEMENT:BITS,... (default: all)")
    args = p.parse_args()
    os.makedirs(os.path.join(args.out, "runs"), exist_ok=True)
    chosen = COMBINATIONS
    if args.only:
        chosen = [(int(r), int(z), pl, int(b)) for r, z, pl, b in (c.split(":") for c in args.only.split(","))]
    runs = {c: [] for c in chosen}
    for k in range(args.rounds):
        for c in chosen:
            runs[c].append(run(args, *c, round_index=k))
    rows = [merge_rounds(runs[c]) for c in chosen]
    json.dump(rows, open(os.path.join(args.out, "summary.json"), "w"), indent=1)
    open(os.path.join(args.out, "summary.md"), "w").write(table(rows))
    print(table(rows))


if __name__ == "__main__":
    main()
