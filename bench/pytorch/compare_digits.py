"""apps/digits against PyTorch from the same initial weights: runs `digits --compare` (which writes
its initial weights, prints its plan and the loss of every optimizer step as JSON lines), then
digits_models.py --init with the same plan, and reports the largest difference in step loss.
  python3 compare_digits.py BUILD/bin/digits DIGITS_CSV_GZ [--epochs N] [--out results.json]"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

parser = argparse.ArgumentParser()
parser.add_argument("digits")
parser.add_argument("data")
parser.add_argument("--epochs", type=int, default=20)
parser.add_argument("--out")
args = parser.parse_args()
here = os.path.dirname(os.path.abspath(__file__))
results = {}
with tempfile.TemporaryDirectory() as tmp:
    for model in ["resmlp", "attention"]:
        init = os.path.join(tmp, model + ".safetensors")
        common = ["--model", model, "--epochs", str(args.epochs), "--data", args.data]
        out = subprocess.run([args.digits, "--compare", init] + common, check=True, capture_output=True, text=True).stdout
        steps = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        micro_batch, accum_steps = re.search(r"planner: micro-batch (\d+) x (\d+) steps", out).groups()
        plan = {"micro_batch": int(micro_batch), "accum_steps": int(accum_steps)}
        theirs = [json.loads(line) for line in subprocess.run(
            [sys.executable, os.path.join(here, "digits_models.py"), "--init", init, "--micro-batch",
             str(plan["micro_batch"]), "--accum", str(plan["accum_steps"])] + common,
            check=True, capture_output=True, text=True).stdout.splitlines()]
        assert len(steps) == len(theirs), f"{model}: {len(steps)} steps against PyTorch's {len(theirs)}"
        diffs = [abs(a["loss"] - b["loss"]) for a, b in zip(steps, theirs)]
        results[model] = {"plan": plan, "steps": len(steps), "max_abs_loss_diff": max(diffs),
                          "first_loss": [steps[0]["loss"], theirs[0]["loss"]],
                          "last_loss": [steps[-1]["loss"], theirs[-1]["loss"]],
                          "cumulus": [s["loss"] for s in steps], "pytorch": [s["loss"] for s in theirs]}
        print(f"{model:9s}  plan {plan['micro_batch']} x {plan['accum_steps']}  {len(steps)} steps  "
              f"last loss {steps[-1]['loss']:.6f} (cumulus) {theirs[-1]['loss']:.6f} (PyTorch)  "
              f"max |difference| {max(diffs):.2e}")
if args.out:
    with open(args.out, "w") as f:
        json.dump(results, f, indent=1)
