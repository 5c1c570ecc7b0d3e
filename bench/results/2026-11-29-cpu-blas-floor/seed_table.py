# seed/table.md from run.sh's seed/: the second epoch's training seconds, medians over 3 rounds.
import json
import statistics
import sys

folder = sys.argv[1]


def second_epoch(side, tag):
    if side == "fast_pytorch":
        return json.load(open(f"{folder}/fast_pytorch_{tag}.json"))["epochs"][-1]["train_s"]
    return json.loads(open(f"{folder}/cumulus_{tag}.jsonl").read().splitlines()[-1])["epoch_seconds"]


print("| threads | config | cumulus s | fast PyTorch s | PyTorch / cumulus | rounds (cumulus / PyTorch) |")
print("|---|---|---|---|---|---|")
for t in (1, 2):
    for cfg in ("16x4", "64x1"):
        runs = {s: [second_epoch(s, f"r{r}_t{t}_{cfg}") for r in (1, 2, 3)] for s in ("cumulus", "fast_pytorch")}
        med = {s: statistics.median(v) for s, v in runs.items()}
        rounds = ", ".join(f"{c:.2f} / {p:.2f}" for c, p in zip(runs["cumulus"], runs["fast_pytorch"]))
        print(f"| {t} | {cfg} | {med['cumulus']:.3f} | {med['fast_pytorch']:.3f} | "
              f"{med['fast_pytorch'] / med['cumulus']:.2f}x | {rounds} |")
