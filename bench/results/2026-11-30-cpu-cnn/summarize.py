#!/usr/bin/env python3
"""The table of run.sh's files: each (micro-batch x steps, threads) round's second-epoch training
seconds for the build before, this one and PyTorch, with the medians' ratios. Prints Markdown."""
import json
import os
import statistics
import sys

out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "epochs")


def ours(path):
    with open(path) as f:
        return json.loads(f.read().splitlines()[-1])["epoch_seconds"]


def theirs(path):
    with open(path) as f:
        return json.load(f)["epochs"][-1]["train_s"]


print("| config | threads | before (s) | after (s) | PyTorch (s) | after / before | after / PyTorch |")
print("|---|---|---|---|---|---|---|")
for cfg in ("16x4", "64x1"):
    for t in (1, 2):
        rounds = sorted({f.split("_r")[1].split(".")[0] for f in os.listdir(out) if f.startswith("new_%s_t%d_" % (cfg, t))})
        b = [ours(os.path.join(out, "base_%s_t%d_r%s.jsonl" % (cfg, t, r))) for r in rounds]
        n = [ours(os.path.join(out, "new_%s_t%d_r%s.jsonl" % (cfg, t, r))) for r in rounds]
        p = [theirs(os.path.join(out, "pytorch_%s_t%d_r%s.json" % (cfg, t, r))) for r in rounds]
        mb, mn, mp = statistics.median(b), statistics.median(n), statistics.median(p)
        fmt = lambda xs: ", ".join("%.2f" % x for x in xs)
        print("| %s | %d | %s (median %.2f) | %s (median %.2f) | %s (median %.2f) | %.2fx | %.2fx |"
              % (cfg, t, fmt(b), mb, fmt(n), mn, fmt(p), mp, mn / mb, mn / mp))
