"""PyTorch's twin of bench_ops' attention cases from a qkv projection (tests/op_cases/cases_attention.cpp,
sdpa_qkv_causal_gpt2s_bench_*): qkv [B, T, 3C] split into q, k, v viewed as [B, H, T, D] (no copy),
F.scaled_dot_product_attention(q, k, v, is_causal=True), timed as bench_ops times an op on CUDA:
  forward           under no_grad
  forward_backward  recorded, the output cast to f32 and summed, and the backward into qkv's f32
                    leaf (a 16-bit qkv is that leaf's cast, made before the timer starts, as
                    bench_ops recasts untimed; the cast's backward, the gradient to f32, is timed)
Each the median over --reps of one call between CUDA events (the host clock on a CPU), after
--warmup calls. TF32 off, so
f32 is f32 on both sides. Prints one JSON object.

  python bench/pytorch/sdpa_op.py --shape 8,1024,768,12 --dtype bf16 [--device cuda:0]
"""

import argparse
import json
import statistics
import time

import torch
import torch.nn.functional as F

DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}


def heads(qkv, h):
    b, t, c3 = qkv.shape
    c = c3 // 3
    return [p.view(b, t, h, c // h).transpose(1, 2) for p in qkv.split(c, dim=-1)]


def median_ms(fn, before, reps, warmup, device):
    times = []
    for i in range(warmup + reps):
        before()
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            ms = start.elapsed_time(end)
        else:  # a rehearsal without a GPU
            t0 = time.perf_counter()
            fn()
            ms = (time.perf_counter() - t0) * 1e3
        if i >= warmup:
            times.append(ms)
    return statistics.median(times)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", default="8,1024,768,12", help="B,T,C,H (default: GPT-2 small's attention)")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    p.add_argument("--device", default="cuda:0")
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    a = p.parse_args()
    b, t, c, h = (int(x) for x in a.shape.split(","))
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    device, dtype = torch.device(a.device), DTYPES[a.dtype]
    torch.manual_seed(20261124)
    leaf = (torch.rand(b, t, 3 * c, device=device) * 2 - 1).requires_grad_(True)
    state = {}

    def cast():
        state["qkv"] = leaf.to(dtype) if dtype != torch.float32 else leaf

    def forward():
        with torch.no_grad():
            q, k, v = heads(state["qkv"], h)
            F.scaled_dot_product_attention(q, k, v, is_causal=True)

    def forward_backward():
        q, k, v = heads(state["qkv"], h)
        F.scaled_dot_product_attention(q, k, v, is_causal=True).float().sum().backward()

    out = {"shape": {"B": b, "T": t, "C": c, "H": h}, "dtype": a.dtype, "torch": torch.__version__,
           "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
           "forward_ms": median_ms(forward, cast, a.reps, a.warmup, device),
           "forward_backward_ms": median_ms(forward_backward, cast, a.reps, a.warmup, device)}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
