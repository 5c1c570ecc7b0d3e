#!/usr/bin/env python3
"""The op profiles of run.sh side by side: per config, each op's median ms a step over the rounds,
one thread (after) and two threads before and after, and two threads' speed-up over one."""
import glob, json, os, statistics
here = os.path.dirname(os.path.abspath(__file__))

def per_step(cfg, t, side):
    runs = [json.load(open(f)) for f in sorted(glob.glob(f"{here}/profiles/{cfg}_t{t}_{side}_*.json"))]
    ops = {}
    for r in runs:
        for o in r["ops"]:
            ops.setdefault(o["op"], []).append(o["ms"] / r["per"])
    total = statistics.median(r["total_ms"] / r["per"] for r in runs)
    return total, {k: statistics.median(v) for k, v in ops.items()}

for cfg in ("small", "large"):
    t1, one = per_step(cfg, 1, "after")
    b, before = per_step(cfg, 2, "before")
    a, after = per_step(cfg, 2, "after")
    print(f"\n### {cfg}: ms a step (op time profiled), median of the rounds\n")
    print("| op | 1 thread | 2 threads before | 2 threads after | speed-up 1 -> 2 before | after |")
    print("|---|---|---|---|---|---|")
    print(f"| **step** | {t1:.1f} | {b:.1f} | {a:.1f} | {t1 / b:.2f}x | {t1 / a:.2f}x |")
    for op in sorted(one, key=lambda k: -one[k])[:12]:
        o, x, y = one[op], before.get(op, 0.0), after.get(op, 0.0)
        print(f"| {op} | {o:.2f} | {x:.2f} | {y:.2f} | {o / x if x else 0:.2f}x | {o / y if y else 0:.2f}x |")
