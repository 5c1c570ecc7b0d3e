#!/usr/bin/env python3
"""A fair, fast PyTorch version of the seed's training, to compare cumulus with PyTorch at its
best for this workload: the same model, SGD(lr=1e-3), CrossEntropyLoss and accumulation
convention as seed_pytorch.py (loss / N, step every N micro-batches and at the epoch's end), but
the dataset is preloaded on the device once as float [N, 1, 28, 28] in [0, 1] (ToTensor's values)
and micro-batches are slices of it: no DataLoader, no per-batch host-to-device copy, and no
loss.item() synchronization inside the loop (what cumulus' app does: device-resident data).

Prints one JSON object on stdout (and --out FILE): time per epoch, samples/s, time per micro-batch
and per step, peak memory (torch.cuda.max_memory_allocated, or the peak RSS on CPU).
"""
import torch
from torch import nn

import pt_common as pc


def to_device(images, labels, device):
    x = torch.from_numpy(images.copy()).to(device).float().div_(255.0).unsqueeze(1)
    y = torch.from_numpy(labels).to(device)
    return x, y


def main():
    args = pc.parse_args(__doc__.split("\n")[0], default_log_every=0, add_arguments=lambda p: p.add_argument(
        "--model", choices=["mlp", "cnn"], default="mlp", help="the seed's MLP or fashion_mnist's --model cnn"))
    device = pc.setup(args)
    x, y = to_device(*pc.load_split(args.data, "train", args.train_limit), device)
    tx, ty = to_device(*pc.load_split(args.data, "test", args.test_limit), device)
    n, b, accum = x.shape[0], args.batch_size, args.accum_steps
    starts = list(range(0, n, b))

    model = (pc.CNN() if args.model == "cnn" else pc.NeuralNetwork()).to(device)
    loss_fn = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)

    epochs = []
    pc.reset_peak(device)
    for t in range(args.epochs):
        model.train()
        steps = 0
        pc.synchronize(device)
        t0 = pc.now()
        for i, s in enumerate(starts):
            loss = loss_fn(model(x[s:s + b]), y[s:s + b])
            if accum > 1:
                loss = loss / accum
            loss.backward()
            if (i + 1) % accum == 0 or i + 1 == len(starts):
                optimizer.step()
                optimizer.zero_grad()
                steps += 1
            if args.log_every and i % args.log_every == 0:
                pc.log(f"loss: {loss.item() * accum:>7f}  [{s + b:>5d}/{n:>5d}]")
        pc.synchronize(device)
        train_s = pc.now() - t0
        e = {"epoch": t + 1, "train_s": train_s, "samples_per_s": n / train_s, "optimizer_steps": steps}
        if not args.no_test:
            t1 = pc.now()
            model.eval()
            with torch.no_grad():
                loss_sum = torch.zeros((), device=device)
                correct = torch.zeros((), device=device)
                for s in range(0, tx.shape[0], 1000):
                    pred = model(tx[s:s + 1000])
                    loss_sum += loss_fn(pred, ty[s:s + 1000]) * pred.shape[0]
                    correct += (pred.argmax(1) == ty[s:s + 1000]).sum()
            e.update(test_s=pc.now() - t1, test_accuracy=correct.item() / tx.shape[0],
                     test_loss=loss_sum.item() / tx.shape[0])
            pc.log(f"epoch {t + 1}: {train_s:.3f} s, test accuracy {100 * e['test_accuracy']:.1f}%")
        epochs.append(e)
    pc.report("fast_pytorch", args, device, epochs, {
        "loader": "preloaded on the device as float, slices",
        "train_samples": n,
        "test_samples": int(tx.shape[0]),
        "micro_batches_per_epoch": len(starts),
        "steps_per_epoch": -(-len(starts) // accum),
    })


if __name__ == "__main__":
    main()
