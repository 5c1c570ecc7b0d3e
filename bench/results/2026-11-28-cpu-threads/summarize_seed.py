#!/usr/bin/env python3
"""The seed MLP's epoch time against PyTorch from seed/: cumulus's second epoch (--metrics), fast
PyTorch's and the seed PyTorch's (their epoch_s: the median of epochs 2..), per thread count and
configuration, as a markdown table with the ratios PyTorch / cumulus (above 1: cumulus is faster)."""
import glob, json, os, re, sys

here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "seed")
rows = ["| threads | config | cumulus s/epoch | fast PyTorch | seed PyTorch | fast / cumulus | seed / cumulus |",
        "|---|---|---|---|---|---|---|"]
for path in sorted(glob.glob(os.path.join(here, "cumulus_t*_*.jsonl"))):
    t, cfg = re.match(r".*cumulus_t(\d+)_(\w+)\.jsonl", path).groups()
    lines = [json.loads(l) for l in open(path) if l.strip()]
    c = lines[-1]["epoch_seconds"]
    times = []
    for who in ("fast_pytorch", "seed_pytorch"):
        p = os.path.join(here, "%s_t%s_%s.json" % (who, t, cfg))
        times.append(json.load(open(p))["epoch_s"] if os.path.exists(p) else float("nan"))
    rows.append("| %s | %s | %.2f | %.2f | %.2f | %.2fx | %.2fx |" % (t, cfg, c, times[0], times[1], times[0] / c, times[1] / c))
print("\n".join(rows))
