#!/usr/bin/env python3
"""The GPT table of README.md from the gpt_compare.py summaries here (gpt_{small,large}_{before,after}.json):
per config, cumulus' and PyTorch's median time per optimizer step in each run, and their ratio."""
import json, os

HERE = os.path.dirname(os.path.abspath(__file__))
print("| config | run | cumulus median (min-max) | PyTorch median (min-max) | cumulus / PyTorch | loss difference |")
print("|---|---|---|---|---|---|")
for cfg in ("small", "large"):
    for run in ("before", "after"):
        path = os.path.join(HERE, f"gpt_{cfg}_{run}.json")
        if not os.path.exists(path):
            continue
        with open(path) as f:
            s = json.load(f)
        r = s["configs"][cfg]
        med, lo, hi = r["median_step_seconds"], r["min_step_seconds"], r["max_step_seconds"]
        cell = lambda k: "%.1f ms (%.1f-%.1f)" % (med[k] * 1e3, lo[k] * 1e3, hi[k] * 1e3)
        print(f"| {cfg} | {run} | {cell('cumulus')} | {cell('pytorch')} | {r['ratio_cumulus_over_pytorch']:.2f}x |"
              f" {r['max_step_loss_diff']:.1e} |")
