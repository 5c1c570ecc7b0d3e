"""PyTorch's CPU optimizer update per parameter, the reference for bench/bench_optim_update.cpp:
torch.optim.AdamW(foreach=True) and SGD with momentum (foreach=True) over the seed MLP's 669,706
parameters as its six tensors (784x512, 512, 512x512, 512, 512x10, 10), gradients set once, one
thread unless --threads says otherwise. Prints one line per optimizer: the median and minimum of
--repetitions timings of --steps optimizer.step() calls each, in ns per parameter.
"""

import argparse
import statistics
import time

import torch

SHAPES = [(512, 784), (512,), (512, 512), (512,), (10, 512), (10,)]


def make_parameters(seed):
    gen = torch.Generator().manual_seed(seed)
    params = []
    for shape in SHAPES:
        p = torch.nn.Parameter(torch.rand(shape, generator=gen) * 2 - 1)
        p.grad = (torch.rand(shape, generator=gen) * 2 - 1) * 0.01
        params.append(p)
    return params


def time_updates(make_optimizer, steps, repetitions, seed):
    params = make_parameters(seed)
    count = sum(p.numel() for p in params)
    opt = make_optimizer(params)
    for _ in range(3):  # allocates the state, warms the caches
        opt.step()
    per_parameter = []
    for _ in range(repetitions):
        start = time.perf_counter()
        for _ in range(steps):
            opt.step()
        per_parameter.append((time.perf_counter() - start) / steps / count * 1e9)
    return count, per_parameter


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--repetitions", type=int, default=5)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    optimizers = {
        "adamw_foreach": lambda ps: torch.optim.AdamW(ps, lr=1e-3, betas=(0.9, 0.999), eps=1e-8,
                                                      weight_decay=0.01, foreach=True),
        "sgd_momentum_foreach": lambda ps: torch.optim.SGD(ps, lr=1e-2, momentum=0.9, foreach=True),
    }
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, "
          f"cpu capability {torch.backends.cpu.get_cpu_capability()}")
    for name, make in optimizers.items():
        count, runs = time_updates(make, args.steps, args.repetitions, seed=7)
        print(f"pytorch/update/{name}: parameters {count}, ns_per_parameter median {statistics.median(runs):.3f} "
              f"min {min(runs):.3f} (runs: {', '.join(f'{r:.3f}' for r in runs)})")


if __name__ == "__main__":
    main()
