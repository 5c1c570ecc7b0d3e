#!/usr/bin/env python3
"""PyTorch with CUDA graphs: the fastest PyTorch we could write for the seed's training, to compare with cumulus' graphs.

The same model, SGD(lr=1e-3), CrossEntropyLoss and accumulation convention as seed_pytorch.py and
fast_pytorch.py (loss / N per micro-batch, a step every N micro-batches and one for a partial
group at the epoch's end), the dataset preloaded on the device as in fast_pytorch.py, and:

- the micro-batch is a CUDA graph (torch.cuda.graph): rows = cursor + arange(B) on the device,
  index_select of those rows into static x / y buffers, cursor += B, forward, loss, the loss
  (times B) added to a device-side sum, (loss / N).backward(). The host only calls replay(): no
  copies, no index upload, no sync;
- gradients as cumulus does them, overwrite then accumulate, with two captures of that
  micro-batch: the first of a group is captured with every .grad None, so backward writes the
  grads (no zeroing, no addition; PyTorch's documented whole-network capture), the others with
  those .grad tensors in place, so backward adds into them (AccumulateGrad's in-place +=);
- the optimizer step is a third graph: optimizer.step() (no zero_grad needed: the next group's
  first micro-batch overwrites the grads);
- all are warmed up on a side stream before capture (as PyTorch's CUDA-graph notes require); the
  weights are restored afterwards, so training starts from the seeded initialization;
- a micro-batch of another size (the epoch's last, when B does not divide the training set) runs
  eagerly into the same .grad tensors (zeroed first when it opens a group), and partial groups
  are stepped by the step graph, exactly as fast_pytorch.py steps them;
- the training loss is read once per epoch, and the test pass (eager, batches of 1000) keeps its
  sums on the device: one read for the epoch's train loss, test loss and accuracy.

CUDA only: with --device cpu it exits with status 2. Prints one JSON object on stdout (and --out
FILE) like fast_pytorch.py: time per epoch, samples/s, time per micro-batch and per step, peak
memory (torch.cuda.max_memory_allocated, graph pools included).
"""
import sys

import torch
from torch import nn

import pt_common as pc

WARMUP_ITERS = 3


def to_device(images, labels, device):
    x = torch.from_numpy(images.copy()).to(device).float().div_(255.0).unsqueeze(1)
    y = torch.from_numpy(labels).to(device)
    return x, y


def refuse_without_cuda(args):
    try:
        kind = torch.device(args.device).type
    except (RuntimeError, ValueError):
        kind = args.device
    if kind != "cuda" or not torch.cuda.is_available():
        why = "CUDA is not available to this PyTorch" if kind == "cuda" else "use fast_pytorch.py there"
        print(f"{sys.argv[0]}: --device {args.device}: graphs need CUDA (torch.cuda.graph); {why}",
              file=sys.stderr)
        sys.exit(2)


def main():
    args = pc.parse_args(__doc__.split("\n")[0], default_log_every=0)
    refuse_without_cuda(args)
    device = pc.setup(args)
    x, y = to_device(*pc.load_split(args.data, "train", args.train_limit), device)
    tx, ty = to_device(*pc.load_split(args.data, "test", args.test_limit), device)
    n, b, accum = x.shape[0], args.batch_size, args.accum_steps
    full = n // b                      # micro-batches of exactly B rows: replayed from the graph
    micro_batches = -(-n // b)         # + one eager micro-batch of n % B rows when B does not divide n
    steps_per_epoch = -(-micro_batches // accum)

    model = pc.NeuralNetwork().to(device)
    loss_fn = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    params = list(model.parameters())

    # Static state the graphs read and write.
    static_x = torch.empty((b,) + tuple(x.shape[1:]), device=device, dtype=x.dtype)
    static_y = torch.empty((b,), device=device, dtype=y.dtype)
    offsets = torch.arange(b, device=device)
    cursor = torch.zeros((), device=device, dtype=torch.int64)       # first row of the next graphed micro-batch
    loss_sum = torch.zeros((), device=device, dtype=torch.float32)   # sum over samples of the training loss

    def graphed_micro_batch():
        rows = cursor + offsets
        torch.index_select(x, 0, rows, out=static_x)
        torch.index_select(y, 0, rows, out=static_y)
        cursor.add_(b)
        loss = loss_fn(model(static_x), static_y)
        loss_sum.add_(loss.detach(), alpha=b)
        (loss / accum if accum > 1 else loss).backward()
        return loss.detach()

    def eager_micro_batch(s):
        xb, yb = x[s:s + b], y[s:s + b]
        loss = loss_fn(model(xb), yb)
        loss_sum.add_(loss.detach(), alpha=xb.shape[0])
        (loss / accum if accum > 1 else loss).backward()
        return loss.detach()

    def grads_to_none():
        for p in params:
            p.grad = None

    # Gradients, as cumulus does them (overwrite, then accumulate): the first micro-batch of a
    # group is captured with every .grad None, so backward writes the grads (AccumulateGrad takes
    # the new gradient as .grad: no zeroing, no addition; the tensors come from that graph's pool,
    # as in PyTorch's whole-network capture example); the other micro-batches are a second graph,
    # captured with those .grad tensors in place, so backward adds into them (AccumulateGrad's
    # in-place "variable_grad += new_grad"). The .grad tensors are never replaced afterwards.
    # Warm-up first, on a side stream, both ways; the weights are restored after capture.
    t_capture = pc.now()
    initial = [p.detach().clone() for p in params]
    use_graph = full > 0   # warm-up reads rows 0..B-1: needs at least one full micro-batch
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(WARMUP_ITERS):
            cursor.zero_()
            grads_to_none()
            for _ in range(min(accum, 2)):
                graphed_micro_batch() if use_graph else eager_micro_batch(0)
            optimizer.step()
    torch.cuda.current_stream(device).wait_stream(side)
    pc.synchronize(device)

    first_graph = acc_graph = None
    first_loss = acc_loss = None
    if use_graph:
        grads_to_none()
        first_graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(first_graph):
            first_loss = graphed_micro_batch()
        if any(p.grad is None for p in params):
            sys.exit(f"{sys.argv[0]}: backward left a .grad unset during capture")
        if accum > 1:
            acc_graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(acc_graph):
                acc_loss = graphed_micro_batch()
    else:
        for p in params:
            p.grad = torch.zeros_like(p)
    grads = [p.grad for p in params]
    step_graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(step_graph):
        optimizer.step()
    if any(p.grad is not g for p, g in zip(params, grads)):
        sys.exit(f"{sys.argv[0]}: the .grad tensors were replaced during capture: the graphs would not accumulate")
    with torch.no_grad():
        for p, p0 in zip(params, initial):
            p.copy_(p0)
            p.grad.zero_()
    del initial
    cursor.zero_()
    loss_sum.zero_()
    pc.synchronize(device)
    capture_s = pc.now() - t_capture

    epochs = []
    pc.reset_peak(device)
    for t in range(args.epochs):
        model.train()
        cursor.zero_()
        loss_sum.zero_()
        steps = 0
        pc.synchronize(device)
        t0 = pc.now()
        for i in range(micro_batches):
            first = i % accum == 0
            if i < full and use_graph:
                if first:
                    first_graph.replay()
                    loss = first_loss
                else:
                    acc_graph.replay()
                    loss = acc_loss
            else:  # the epoch's last micro-batch, of n % B rows, or every one when n < B
                if first:
                    for g in grads:
                        g.zero_()
                loss = eager_micro_batch(i * b)
            if (i + 1) % accum == 0 or i + 1 == micro_batches:
                step_graph.replay()
                steps += 1
            if args.log_every and i % args.log_every == 0:
                pc.log(f"loss: {loss.item():>7f}  [{min(i * b + b, n):>5d}/{n:>5d}]")
        pc.synchronize(device)
        train_s = pc.now() - t0
        e = {"epoch": t + 1, "train_s": train_s, "samples_per_s": n / train_s, "optimizer_steps": steps}
        sums = [loss_sum]
        if not args.no_test:
            t1 = pc.now()
            model.eval()
            with torch.no_grad():
                test_loss = torch.zeros((), device=device)
                correct = torch.zeros((), device=device, dtype=torch.int64)
                for s in range(0, tx.shape[0], 1000):
                    pred = model(tx[s:s + 1000])
                    test_loss += loss_fn(pred, ty[s:s + 1000]) * pred.shape[0]
                    correct += (pred.argmax(1) == ty[s:s + 1000]).sum()
                sums += [test_loss, correct.to(torch.float32)]
        values = torch.stack(sums).tolist()   # the epoch's one read
        e["train_loss"] = values[0] / n
        if not args.no_test:
            e.update(test_s=pc.now() - t1, test_accuracy=values[2] / tx.shape[0], test_loss=values[1] / tx.shape[0])
            pc.log(f"epoch {t + 1}: {train_s:.3f} s, train loss {e['train_loss']:.4f}, "
                   f"test accuracy {100 * e['test_accuracy']:.1f}%")
        epochs.append(e)
    pc.report("graphs_pytorch", args, device, epochs, {
        "loader": "preloaded on the device as float; static x/y filled by index_select inside the graph",
        "graphs": {
            "micro_batch_first": "captured with .grad None: index_select into static x/y, forward, loss / N, "
                                 "backward writing the grads" if use_graph else "eager (fewer than B training samples)",
            "micro_batch_accumulate": ("captured with the .grad tensors in place: the same, backward adding into them"
                                       if use_graph else "eager") if accum > 1 else "not needed (N = 1)",
            "step": "captured: optimizer.step() (SGD, foreach)",
            "graphed_micro_batches_per_epoch": full if use_graph else 0,
            "eager_micro_batches_per_epoch": micro_batches - (full if use_graph else 0),
            "warmup_iterations": WARMUP_ITERS,
            "warmup_and_capture_s": capture_s,
        },
        "train_samples": n,
        "test_samples": int(tx.shape[0]),
        "micro_batches_per_epoch": micro_batches,
        "steps_per_epoch": steps_per_epoch,
    })


if __name__ == "__main__":
    main()
