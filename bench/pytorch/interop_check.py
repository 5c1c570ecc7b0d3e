#!/usr/bin/env python3
"""Weights move between cumulus and PyTorch in both directions, for the seed MLP and the CNN.

For each model (--model mlp, cnn or both):
1. cumulus -> PyTorch: cumulus trains the model briefly and saves its weights (--save); PyTorch's
   model loads them with load_state_dict(safetensors.torch.load_file(path)) (strict) and evaluates
   the test set with the seed's test loop. Its accuracy and average loss must equal what cumulus
   printed for the same weights after its last epoch. For the CNN the file carries batch norm's
   running statistics and num_batches_tracked (I32 in cumulus's file, int64 in PyTorch).
2. PyTorch -> cumulus: PyTorch saves its model with safetensors.torch.save_file (for the CNN after
   a few training-mode batches, so the running statistics are not their initial values and
   num_batches_tracked is a non-zero int64, dtype I64 in the file); cumulus starts from it (--init)
   and must print the test results PyTorch computes for those weights. With --dtypes including
   bf16, the same weights are also saved in torch.bfloat16 (as mixed-precision checkpoints are) and
   cumulus must convert them to f32 exactly: PyTorch's results for the bf16 weights upcast to f32.

How cumulus evaluates given weights: --eval-only when the app has it; otherwise one epoch at a
learning rate of 1e-30 (weights unchanged), which is only valid for the MLP: a training-mode epoch
moves batch norm's running statistics, so the CNN needs --eval-only.

Usage: python3 bench/pytorch/interop_check.py --app build/bin/fashion_mnist --data ../shared/data/fashion-mnist
Needs torch and safetensors. Exits non-zero on a mismatch."""
import argparse
import json
import os
import re
import struct
import subprocess
import sys
import tempfile

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pt_common import CNN, NeuralNetwork, load_split  # noqa: E402


MODELS = {"mlp": NeuralNetwork, "cnn": CNN}
# How far PyTorch's results may be from those cumulus prints (accuracy in percent, printed to 0.1;
# the loss to 6 decimals). The CNN's convolutions are summed in another order (im2col + OpenBLAS
# here, oneDNN there), so its loss gets a little more room.
TOLERANCE = {"mlp": (0.051, 2e-6), "cnn": (0.051, 1e-5)}


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


def file_dtypes(path):
    """{tensor name: dtype string} from a safetensors header."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
    return {k: v["dtype"] for k, v in header.items() if k != "__metadata__"}


def compare(what, kind, first, second, first_results, second_results):
    (a_acc, a_loss), (b_acc, b_loss) = first_results, second_results
    acc_tol, loss_tol = TOLERANCE[kind]
    same = abs(a_acc - b_acc) < acc_tol and abs(a_loss - b_loss) < loss_tol
    print(f"{kind} {what}: {first} {a_acc:.1f}% / {a_loss:.6f}, {second} {b_acc:.1f}% / {b_loss:.6f}: "
          f"{'match' if same else 'MISMATCH'}")
    return same


def check_model(kind, args, images, labels, tmp, eval_only):
    common = [args.app, "--data", args.data, "--device", "cpu", "--test-limit", str(args.test_limit), "--quiet",
              "--model", kind]
    ok = True
    # 1. cumulus -> PyTorch
    w = os.path.join(tmp, f"cumulus_{kind}.safetensors")
    out = run(common + ["--epochs", "1", "--train-limit", str(args.train_limit), "--batch-size", "16",
                        "--accum-steps", "4", "--lr", "0.05", "--save", w])
    c_results = cumulus_results(out)
    model = MODELS[kind]()
    model.load_state_dict(load_file(w))  # strict: every name, every shape
    p_acc, p_loss = seed_test(model, images, labels)
    ok &= compare("cumulus -> PyTorch", kind, "cumulus printed", "PyTorch computes", c_results,
                  (100 * p_acc, p_loss))
    if kind == "cnn":
        # Batch norm counted one batch per micro-batch: train_limit / 16 of them.
        tracked = int(model[1].num_batches_tracked)
        expected = args.train_limit // 16
        print(f"cnn cumulus -> PyTorch: num_batches_tracked {tracked} (expected {expected}, "
              f"file dtype {file_dtypes(w)['1.num_batches_tracked']})")
        ok &= tracked == expected

    # 2. PyTorch -> cumulus, in each of --dtypes
    torch.manual_seed(0)
    model = MODELS[kind]()
    if kind == "cnn":
        # Running statistics away from (0, 1) and a counter > 0, from training-mode batches.
        model.train()
        x = torch.from_numpy(images[:256].astype(np.float32) / 255.0)
        with torch.no_grad():
            for i in range(0, 256, 64):
                model(x[i:i + 64])
    for dtype in args.dtypes.split(","):
        t = os.path.join(tmp, f"torch_{kind}_{dtype}.safetensors")
        if dtype == "f32":
            state = {k: v.contiguous() for k, v in model.state_dict().items()}
            reference = model
        elif dtype == "bf16":
            state = {k: (v.to(torch.bfloat16) if v.is_floating_point() else v).contiguous()
                     for k, v in model.state_dict().items()}
            reference = MODELS[kind]()
            reference.load_state_dict(state)  # bf16 values upcast to f32 exactly
        else:
            sys.exit(f"interop_check: --dtypes: unknown dtype {dtype} (f32, bf16)")
        save_file(state, t)
        if kind == "cnn":
            print(f"cnn PyTorch ({dtype}) -> cumulus: num_batches_tracked {int(state['1.num_batches_tracked'])}, "
                  f"file dtype {file_dtypes(t)['1.num_batches_tracked']}")
        p_acc, p_loss = seed_test(reference, images, labels)
        if eval_only:
            cmd = common + ["--init", t, "--eval-only"]
        elif kind == "mlp":
            cmd = common + ["--epochs", "1", "--train-limit", "64", "--lr", "1e-30", "--init", t]
        else:
            sys.exit("interop_check: the CNN check needs the app's --eval-only (a training epoch, even at "
                     "lr 1e-30, moves batch norm's running statistics)")
        p = subprocess.run(cmd, capture_output=True, text=True)
        if p.returncode != 0:  # a refused file is a failed check, not the end of the others
            print(f"{kind} PyTorch ({dtype}) -> cumulus: FAILED, the app exited {p.returncode}: "
                  f"{(p.stderr or p.stdout).strip()}")
            ok = False
            continue
        out = p.stdout
        ok &= compare(f"PyTorch ({dtype}) -> cumulus", kind, "PyTorch computes", "cumulus printed",
                      (100 * p_acc, p_loss), cumulus_results(out))
    return ok


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--app", default="build/bin/fashion_mnist")
    ap.add_argument("--data", default="../shared/data/fashion-mnist")
    ap.add_argument("--model", choices=["mlp", "cnn", "both"], default="both")
    ap.add_argument("--dtypes", default="f32,bf16",
                    help="dtypes PyTorch saves its weights in for the PyTorch -> cumulus check (f32, bf16)")
    ap.add_argument("--test-limit", type=int, default=2000)
    ap.add_argument("--train-limit", type=int, default=6400, help="samples cumulus trains on before saving")
    args = ap.parse_args()
    images, labels = load_split(args.data, "test", args.test_limit)
    eval_only = "--eval-only" in subprocess.run([args.app, "--help"], capture_output=True, text=True).stdout
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        for kind in (["mlp", "cnn"] if args.model == "both" else [args.model]):
            ok &= check_model(kind, args, images, labels, tmp, eval_only)
    print("interop_check: " + ("all match" if ok else "MISMATCH"))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
