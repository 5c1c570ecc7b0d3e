#!/usr/bin/env python3
"""Weights move between cumulus and PyTorch in both directions (DESIGN.md, decision 10).

1. cumulus trains the seed MLP briefly and saves its weights (--save); PyTorch's seed NeuralNetwork
   loads them with load_state_dict(safetensors.torch.load_file(path)) and evaluates the test set
   with the seed's test loop. Its accuracy and average loss must equal what cumulus printed for
   the same weights after its last epoch.
2. PyTorch saves a freshly initialized NeuralNetwork with safetensors.torch.save_file; cumulus
   starts from it (--init) with a learning rate of 1e-30 (weights unchanged) and must print the
   test results PyTorch computes for those weights.

Usage: python3 bench/pytorch/interop_check.py --app build/bin/fashion_mnist --data ../shared/data/fashion-mnist
Needs torch and safetensors. Exits non-zero on a mismatch."""
import argparse
import os
import re
import subprocess
import sys
import tempfile

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pt_common import NeuralNetwork, load_split  # noqa: E402


def seed_test(model, images, labels, batch_size=64):
    """The seed's test loop: accuracy, and the mean over batches of the batch-mean loss."""
    model.eval()
    loss_fn = nn.CrossEntropyLoss()
    x = torch.from_numpy(images.astype(np.float32) / 255.0)
    y = torch.from_numpy(labels)
    n = len(y)
    batches = (n + batch_size - 1) // batch_size
    loss, correct = 0.0, 0
    with torch.no_grad():
        for i in range(batches):
            xb, yb = x[i * batch_size:(i + 1) * batch_size], y[i * batch_size:(i + 1) * batch_size]
            pred = model(xb)
            loss += loss_fn(pred, yb).item()
            correct += (pred.argmax(1) == yb).type(torch.float).sum().item()
    return correct / n, loss / batches


def cumulus_results(output):
    m = re.findall(r"Accuracy: ([0-9.]+)%, Avg loss: ([0-9.]+)", output)
    if not m:
        sys.exit("interop_check: no test results in the app's output:\n" + output)
    return float(m[-1][0]), float(m[-1][1])


def run(cmd):
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"interop_check: {' '.join(cmd)} exited {p.returncode}:\n{p.stdout}{p.stderr}")
    return p.stdout


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--app", default="build/bin/fashion_mnist")
    ap.add_argument("--data", default="../shared/data/fashion-mnist")
    ap.add_argument("--test-limit", type=int, default=2000)
    args = ap.parse_args()
    images, labels = load_split(args.data, "test", args.test_limit)
    common = [args.app, "--data", args.data, "--device", "cpu", "--test-limit", str(args.test_limit), "--quiet"]
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        # 1. cumulus -> PyTorch
        w = os.path.join(tmp, "cumulus.safetensors")
        out = run(common + ["--epochs", "1", "--train-limit", "6400", "--batch-size", "16", "--accum-steps", "4",
                            "--lr", "0.05", "--save", w])
        c_acc, c_loss = cumulus_results(out)
        model = NeuralNetwork()
        model.load_state_dict(load_file(w))
        p_acc, p_loss = seed_test(model, images, labels)
        same = abs(100 * p_acc - c_acc) < 0.051 and abs(p_loss - c_loss) < 2e-6
        ok &= same
        print(f"cumulus -> PyTorch: cumulus printed {c_acc:.1f}% / {c_loss:.6f}, PyTorch computes "
              f"{100 * p_acc:.1f}% / {p_loss:.6f}: {'match' if same else 'MISMATCH'}")
        # 2. PyTorch -> cumulus
        torch.manual_seed(0)
        model = NeuralNetwork()
        t = os.path.join(tmp, "torch.safetensors")
        save_file({k: v.contiguous() for k, v in model.state_dict().items()}, t)
        p_acc, p_loss = seed_test(model, images, labels)
        out = run(common + ["--epochs", "1", "--train-limit", "64", "--lr", "1e-30", "--init", t])
        c_acc, c_loss = cumulus_results(out)
        same = abs(100 * p_acc - c_acc) < 0.051 and abs(p_loss - c_loss) < 2e-6
        ok &= same
        print(f"PyTorch -> cumulus: PyTorch computes {100 * p_acc:.1f}% / {p_loss:.6f}, cumulus printed "
              f"{c_acc:.1f}% / {c_loss:.6f}: {'match' if same else 'MISMATCH'}")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
