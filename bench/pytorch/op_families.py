#!/usr/bin/env python3
"""PyTorch's side of bench_ops' op families (Note [Op families against PyTorch], bench/op_families.h):
the same names, shapes and input ranges, timed the same way (3 untimed warm-up iterations, then
iterations until --min-time seconds, per repetition; the forward under no_grad, forward_backward
recorded with its backward from ones, the inputs' gradients set to None before each iteration).
Prints Google Benchmark's JSON shape (benchmarks: name, real_time in ns, one per repetition), so
bench/ops_vs_pytorch.py reads both alike.

    op_families.py --threads 1 [--min-time 0.2] [--repetitions 3] [--filter REGEX]
"""
import argparse
import json
import re
import sys
import time

import torch
import torch.nn.functional as F

ACT = (8, 64, 128)
MAPS, POOLED = (16, 32, 28, 28), (16, 32, 14, 14)  # the CNN's blocks at micro-batch 16


def families():
    def f(name, shapes, fn, integer=(), classes=0):
        return dict(name=name, shapes=shapes, fn=fn, integer=set(integer), classes=classes)

    return [
        f("sum_last", [ACT], lambda x: x.sum(-1)),
        f("sum_first", [ACT], lambda x: x.sum(0)),
        f("mean_middle", [ACT], lambda x: x.mean(1)),
        f("mean_square_last", [ACT], lambda x: (x * x).mean(-1, keepdim=True)),
        f("mul_by_row_scalar", [ACT, (8, 64, 1)], lambda x, r: x * r),
        f("mul_by_channel", [ACT, (128,)], lambda x, w: x * w),
        f("add_same_shape", [ACT, ACT], lambda a, b: a + b),
        f("add_bias", [(512, 512), (512,)], lambda a, b: a + b),
        f("gelu_times", [(8, 64, 344), (8, 64, 344)], lambda a, b: F.gelu(a) * b),
        f("gelu_tanh", [(8, 64, 512)], lambda x: F.gelu(x, approximate="tanh")),
        f("sigmoid", [(8, 64, 344)], torch.sigmoid),
        f("silu", [(8, 64, 344)], lambda x: x * torch.sigmoid(x)),
        f("silu_op", [(8, 64, 344)], F.silu),
        f("relu", [(64, 512)], torch.relu),
        f("softmax_last", [(8, 4, 64, 64)], lambda x: torch.softmax(x, -1)),
        f("layer_norm", [ACT, (128,), (128,)], lambda x, w, b: F.layer_norm(x, (128,), w, b)),
        f("rms_norm", [ACT, (128,)], lambda x, w: F.rms_norm(x, (128,), w)),
        f("rms_norm_4096x1024", [(4096, 1024), (1024,)], lambda x, w: F.rms_norm(x, (1024,), w)),
        f("linear_qkv", [(512, 128), (384, 128), (384,)], F.linear),
        f("linear_mlp", [(64, 784), (512, 784), (512,)], F.linear),
        f("cross_entropy_sum", [(512, 65), (512,)], lambda x, y: F.cross_entropy(x, y, reduction="sum"), [1], 65),
        f("attention_causal", [(8, 4, 64, 32)] * 3,
          lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)),
        f("attention_causal_t256", [(8, 8, 256, 32)] * 3,
          lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)),
        f("permute_heads", [(8, 64, 4, 32)], lambda x: x.permute(0, 2, 1, 3).contiguous()),
        f("embedding", [(8, 64), (65, 128)], F.embedding, [0], 65),
        f("conv2d_3x3", [POOLED, (64, 32, 3, 3), (64,)], lambda x, w, b: F.conv2d(x, w, b, padding=1)),
        f("batch_norm2d", [MAPS, (32,), (32,)], lambda x, w, b: F.batch_norm(x, None, None, w, b, training=True)),
        f("max_pool2d", [MAPS], lambda x: F.max_pool2d(x, 2)),
        f("relu_maps", [MAPS], torch.relu),
    ]


def inputs(fam):
    g = torch.Generator().manual_seed(20261124)
    out = []
    for i, shape in enumerate(fam["shapes"]):
        if i in fam["integer"]:
            out.append(torch.randint(0, fam["classes"], shape, generator=g, dtype=torch.long))
        else:
            out.append((torch.rand(shape, generator=g) * 2 - 1).requires_grad_(True))
    return out


def timed(work, min_time):
    for _ in range(3):
        work()
    n, start = 0, time.perf_counter()
    while True:
        work()
        n += 1
        elapsed = time.perf_counter() - start
        if elapsed >= min_time:
            return elapsed / n


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    p.add_argument("--min-time", type=float, default=0.2, help="seconds per repetition")
    p.add_argument("--repetitions", type=int, default=3)
    p.add_argument("--filter", default="", help="a regex over families/<name>/<pass>")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    results = []
    for fam in families():
        x = inputs(fam)
        dy = None
        fn = fam["fn"]

        def forward():
            with torch.no_grad():
                fn(*x)

        def forward_backward():
            nonlocal dy
            for t in x:
                t.grad = None
            y = fn(*x)
            if dy is None:
                dy = torch.ones_like(y)
            y.backward(dy)

        for pass_name, work in (("forward", forward), ("forward_backward", forward_backward)):
            name = "families/%s/%s/cpu" % (fam["name"], pass_name)
            if a.filter and not re.search(a.filter, name):
                continue
            for _ in range(a.repetitions):
                results.append(dict(name=name, real_time=timed(work, a.min_time) * 1e9, time_unit="ns"))
    json.dump(dict(context=dict(threads=a.threads, torch=torch.__version__,
                                 parallel_info=torch.__config__.parallel_info()), benchmarks=results),
              sys.stdout, indent=1)


if __name__ == "__main__":
    main()
