"""What seed_pytorch.py and fast_pytorch.py share: the command line, the seed model, the IDX
reader, the timing/memory report and its JSON output.

The model is the PyTorch quickstart's NeuralNetwork (Flatten, then linear_relu_stack =
Linear(784, 512), ReLU, Linear(512, 512), ReLU, Linear(512, 10)), trained with SGD lr 1e-3 and
CrossEntropyLoss (mean over the micro-batch). With --accum-steps N each micro-batch's loss is
divided by N and the optimizer steps every N micro-batches; a partial group left at the end of
an epoch is stepped too (as cumulus' Trainer does), so both variants step
ceil(micro-batches / N) times per epoch.
"""

import argparse
import gzip
import json
import math
import os
import platform
import resource
import statistics
import struct
import sys
import time

import numpy as np
import torch
from torch import nn

IDX_DTYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}
FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}


def parse_args(description, default_log_every, add_arguments=None):
    p = argparse.ArgumentParser(description=description)
    if add_arguments:
        add_arguments(p)
    p.add_argument("--data", required=True,
                   help="folder with the Fashion-MNIST IDX files (.gz or uncompressed), e.g. ../shared/data/fashion-mnist")
    p.add_argument("--device", default="cpu", help="cpu or cuda (cuda:N)")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=64, help="micro-batch size")
    p.add_argument("--accum-steps", type=int, default=1, help="micro-batches per optimizer step")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (CPU); default: PyTorch's choice")
    p.add_argument("--train-limit", type=int, default=0, help="use only the first N training samples (0: all)")
    p.add_argument("--test-limit", type=int, default=0, help="use only the first N test samples (0: all)")
    p.add_argument("--no-test", action="store_true", help="skip the test pass after each epoch")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0, help="torch.manual_seed before building the model")
    p.add_argument("--log-every", type=int, default=default_log_every,
                   help="print the loss every N micro-batches to stderr (reads it from the device: a synchronization); 0: never")
    p.add_argument("--out", default=None, help="also write the JSON result to this file")
    a = p.parse_args()
    for name in ("epochs", "batch_size", "accum_steps"):
        if getattr(a, name) <= 0:
            p.error(f"--{name.replace('_', '-')} must be > 0")
    if a.threads is not None and a.threads <= 0:
        p.error("--threads must be > 0")
    return a


def resolve_device(name):
    """torch.device of --device; a bare 'cuda' means 'cuda:0' (torch.cuda.set_device wants an
    index). Exits with a message when the name is unknown or the CUDA device is not there."""
    try:
        device = torch.device(name)
    except (RuntimeError, ValueError) as e:
        sys.exit(f"{sys.argv[0]}: --device {name}: {e}")
    if device.type == "cuda":
        if not torch.cuda.is_available():
            sys.exit(f"{sys.argv[0]}: --device {name}: CUDA is not available to this PyTorch")
        index = 0 if device.index is None else device.index
        count = torch.cuda.device_count()
        if index >= count:
            sys.exit(f"{sys.argv[0]}: --device {name}: this machine has {count} CUDA device(s)")
        device = torch.device("cuda", index)
    return device


def setup(args):
    """Threads, seed and device; returns the torch.device ('cuda' comes back as 'cuda:0')."""
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    device = resolve_device(args.device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    return device


class NeuralNetwork(nn.Module):
    """The quickstart's model; state-dict names linear_relu_stack.{0,2,4}.{weight,bias} as cumulus'."""

    def __init__(self):
        super().__init__()
        self.flatten = nn.Flatten()
        self.linear_relu_stack = nn.Sequential(
            nn.Linear(28 * 28, 512),
            nn.ReLU(),
            nn.Linear(512, 512),
            nn.ReLU(),
            nn.Linear(512, 10),
        )

    def forward(self, x):
        x = self.flatten(x)
        logits = self.linear_relu_stack(x)
        return logits


class CNN(nn.Sequential):
    """cumulus's --model cnn as PyTorch's nn.Sequential; state-dict names 0.weight ... 11.bias."""

    def __init__(self):
        super().__init__(
            nn.Conv2d(1, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(), nn.Linear(64 * 7 * 7, 128), nn.ReLU(), nn.Linear(128, 10))

    def forward(self, x):
        return super().forward(x.reshape(-1, 1, 28, 28))


def _open_idx(folder, stem):
    for name in (stem + ".gz", stem):
        path = os.path.join(folder, name)
        if os.path.exists(path):
            return path
    sys.exit(f"{sys.argv[0]}: neither {stem}.gz nor {stem} in {folder}")


def read_idx(path):
    """An IDX file (gzip or not) as a numpy array: header magic 0x0000TTDD (T: type, D: dims),
    then D big-endian int32 sizes, then the data in row-major order."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        raw = f.read()
    zero, dtype_code, ndim = struct.unpack(">HBB", raw[:4])
    if zero != 0 or dtype_code not in IDX_DTYPES:
        raise ValueError(f"{path}: not an IDX file (magic {raw[:4].hex()})")
    dims = struct.unpack(">" + "i" * ndim, raw[4:4 + 4 * ndim])
    data = np.frombuffer(raw, dtype=IDX_DTYPES[dtype_code], offset=4 + 4 * ndim)
    if data.size != math.prod(dims):
        raise ValueError(f"{path}: {data.size} values for dims {dims}")
    return data.reshape(dims)


def load_split(folder, split, limit=0):
    """(images uint8 [N, 28, 28], labels int64 [N]) of 'train' or 'test', the first `limit` rows."""
    img_stem, lbl_stem = FILES[split]
    images = read_idx(_open_idx(folder, img_stem))
    labels = read_idx(_open_idx(folder, lbl_stem)).astype(np.int64)
    if images.shape[0] != labels.shape[0]:
        raise ValueError(f"{split}: {images.shape[0]} images but {labels.shape[0]} labels")
    if limit and limit > 0:
        images, labels = images[:limit], labels[:limit]
    return images, labels


def synchronize(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def reset_peak(device):
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory(device):
    """(bytes, kind): torch.cuda.max_memory_allocated on CUDA; on CPU the process' peak RSS
    (Linux ru_maxrss is in KiB), which includes the interpreter, PyTorch and the dataset."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device)), "cuda_max_memory_allocated"
    try:
        return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024, "peak_rss"
    except Exception:  # not Linux / no resource module
        return None, None


def machine(device):
    info = {"python": platform.python_version(), "torch": torch.__version__, "hostname": platform.node(),
            "torch_threads": torch.get_num_threads()}
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
        info["cuda"] = torch.version.cuda
    return info


def report(variant, args, device, epochs, extra):
    """Builds, prints (stdout) and optionally writes the JSON result. `epochs` holds per-epoch
    dicts with at least train_s. The headline numbers use the epochs after the first when there
    are several (the first carries CUDA/cuBLAS initialization and allocator warm-up)."""
    steady = epochs[1:] if len(epochs) > 1 else epochs
    epoch_s = statistics.median(e["train_s"] for e in steady)
    samples = extra["train_samples"]
    mbs = extra["micro_batches_per_epoch"]
    steps = extra["steps_per_epoch"]
    peak, peak_kind = peak_memory(device)
    result = {
        "variant": variant,
        "device": str(device),
        "batch_size": args.batch_size,
        "accum_steps": args.accum_steps,
        "effective_batch": args.batch_size * args.accum_steps,
        "threads": torch.get_num_threads(),
        "lr": args.lr,
        "epochs": epochs,
        "epoch_s": epoch_s,
        "epoch_s_from": "median of epochs 2.." if len(epochs) > 1 else "the only epoch",
        "samples_per_s": samples / epoch_s if epoch_s > 0 else None,
        "us_per_micro_batch": epoch_s * 1e6 / mbs if mbs else None,
        "us_per_step": epoch_s * 1e6 / steps if steps else None,
        "peak_memory_bytes": peak,
        "peak_memory_kind": peak_kind,
        "machine": machine(device),
    }
    result.update(extra)
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    return result


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def now():
    return time.perf_counter()
