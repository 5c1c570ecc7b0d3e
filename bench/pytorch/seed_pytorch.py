#!/usr/bin/env python3
"""The PyTorch quickstart's Fashion-MNIST training, reproduced for timing (the seed cumulus is
measured against). Model, optimizer, loss, DataLoader and the train/test loops are the tutorial's:
NeuralNetwork (see pt_common.py), SGD(lr=1e-3), CrossEntropyLoss, DataLoader(batch_size, no
shuffle), loss.backward(); optimizer.step(); optimizer.zero_grad(); loss.item() every 100 batches.
With --accum-steps N: loss / N per micro-batch, step every N micro-batches (and at the epoch's end).

Data, offline: the tutorial uses torchvision.datasets.FashionMNIST(transform=ToTensor()). With
--loader torchvision (what --loader auto picks when torchvision imports) the IDX files in --data are unpacked
into a temporary torchvision layout and that class is used as is, per-sample PIL conversion
included. Without torchvision (--loader idx, or auto when it is missing) the files are read with
gzip + numpy (pt_common.read_idx) and wrapped in TensorDataset(images / 255 as float [N, 1, 28, 28],
int64 labels) + the same DataLoader: the same tensors reach the model, but the per-sample
ToTensor work is done once up front, so that loader is faster than the tutorial's; the JSON
says which loader ran ("loader").

Prints one JSON object on stdout (and --out FILE): time per epoch, samples/s, time per micro-batch
and per step, peak memory (torch.cuda.max_memory_allocated, or the peak RSS on CPU).
"""
import gzip
import os
import shutil
import tempfile

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import pt_common as pc


def torchvision_datasets(folder, tmp):
    """FashionMNIST train/test from torchvision, offline: the raw files it expects, uncompressed,
    under tmp/FashionMNIST/raw/."""
    from torchvision import datasets
    from torchvision.transforms import ToTensor
    raw = os.path.join(tmp, "FashionMNIST", "raw")
    os.makedirs(raw, exist_ok=True)
    for stems in pc.FILES.values():
        for stem in stems:
            src = pc._open_idx(folder, stem)
            opener = gzip.open if src.endswith(".gz") else open
            with opener(src, "rb") as fin, open(os.path.join(raw, stem), "wb") as fout:
                shutil.copyfileobj(fin, fout)
    train = datasets.FashionMNIST(root=tmp, train=True, download=False, transform=ToTensor())
    test = datasets.FashionMNIST(root=tmp, train=False, download=False, transform=ToTensor())
    return train, test


def idx_datasets(folder, train_limit, test_limit):
    def wrap(images, labels):
        x = torch.from_numpy(images.copy()).float().div_(255.0).unsqueeze(1)  # ToTensor: [1, 28, 28] in [0, 1]
        return TensorDataset(x, torch.from_numpy(labels))
    return (wrap(*pc.load_split(folder, "train", train_limit)), wrap(*pc.load_split(folder, "test", test_limit)))


def limited(ds, limit):
    return torch.utils.data.Subset(ds, range(min(limit, len(ds)))) if limit and limit > 0 else ds


def train(dataloader, model, loss_fn, optimizer, device, accum_steps, log_every):
    size = len(dataloader.dataset)
    num_batches = len(dataloader)
    model.train()
    steps = 0
    last_loss = None
    for batch, (X, y) in enumerate(dataloader):
        X, y = X.to(device), y.to(device)

        # Compute prediction error
        pred = model(X)
        loss = loss_fn(pred, y)
        if accum_steps > 1:
            loss = loss / accum_steps

        # Backpropagation
        loss.backward()
        if (batch + 1) % accum_steps == 0 or batch + 1 == num_batches:
            optimizer.step()
            optimizer.zero_grad()
            steps += 1

        if log_every and batch % log_every == 0:
            last_loss, current = loss.item() * accum_steps, (batch + 1) * len(X)
            pc.log(f"loss: {last_loss:>7f}  [{current:>5d}/{size:>5d}]")
    return steps, last_loss


def test(dataloader, model, loss_fn, device):
    size = len(dataloader.dataset)
    num_batches = len(dataloader)
    model.eval()
    test_loss, correct = 0, 0
    with torch.no_grad():
        for X, y in dataloader:
            X, y = X.to(device), y.to(device)
            pred = model(X)
            test_loss += loss_fn(pred, y).item()
            correct += (pred.argmax(1) == y).type(torch.float).sum().item()
    test_loss /= num_batches
    correct /= size
    return correct, test_loss


def main():
    def loader_option(p):
        p.add_argument("--loader", choices=("auto", "torchvision", "idx"), default="auto",
                       help="torchvision: the tutorial's FashionMNIST + ToTensor; idx: gzip + numpy + TensorDataset; "
                            "auto: torchvision if it imports, else idx")
    args = pc.parse_args(__doc__.split("\n")[0], default_log_every=100, add_arguments=loader_option)
    device = pc.setup(args)
    loader = args.loader
    if loader == "auto":
        try:
            import torchvision  # noqa: F401
            loader = "torchvision"
        except ImportError:
            loader = "idx"
    tmp = tempfile.mkdtemp(prefix="seed_pytorch_") if loader == "torchvision" else None
    try:
        if loader == "torchvision":
            training_data, test_data = torchvision_datasets(args.data, tmp)
            training_data, test_data = limited(training_data, args.train_limit), limited(test_data, args.test_limit)
        else:
            training_data, test_data = idx_datasets(args.data, args.train_limit, args.test_limit)

        train_dataloader = DataLoader(training_data, batch_size=args.batch_size)
        test_dataloader = DataLoader(test_data, batch_size=64)  # the tutorial's batch size

        model = pc.NeuralNetwork().to(device)
        loss_fn = nn.CrossEntropyLoss()
        optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)

        epochs = []
        pc.reset_peak(device)
        for t in range(args.epochs):
            pc.log(f"Epoch {t + 1}\n-------------------------------")
            pc.synchronize(device)
            t0 = pc.now()
            steps, last_loss = train(train_dataloader, model, loss_fn, optimizer, device, args.accum_steps,
                                     args.log_every)
            pc.synchronize(device)
            train_s = pc.now() - t0
            e = {"epoch": t + 1, "train_s": train_s, "samples_per_s": len(training_data) / train_s,
                 "optimizer_steps": steps, "last_logged_loss": last_loss}
            if not args.no_test:
                t1 = pc.now()
                acc, test_loss = test(test_dataloader, model, loss_fn, device)
                e.update(test_s=pc.now() - t1, test_accuracy=acc, test_loss=test_loss)
                pc.log(f"Test Error: \n Accuracy: {(100 * acc):>0.1f}%, Avg loss: {test_loss:>8f} \n")
            epochs.append(e)
        mbs = len(train_dataloader)
        pc.report("seed_pytorch", args, device, epochs, {
            "loader": "torchvision FashionMNIST + ToTensor" if loader == "torchvision"
                      else "IDX via gzip+numpy, TensorDataset (ToTensor done up front)",
            "train_samples": len(training_data),
            "test_samples": len(test_data),
            "micro_batches_per_epoch": mbs,
            "steps_per_epoch": -(-mbs // args.accum_steps),
        })
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
