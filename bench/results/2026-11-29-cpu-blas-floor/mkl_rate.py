# PyTorch's (MKL's) one-thread SGEMM rate at the large GPT's shapes, Y = X W^T as a Linear asks it:
# best of 5 x 10 calls after 3 warm-up calls. blas_rate.c times OpenBLAS at the same shapes.
import time

import torch

torch.set_num_threads(1)
for m, n, k in [(2048, 768, 256), (2048, 1024, 256), (2048, 256, 1024), (1024, 1024, 1024)]:
    x, w = torch.randn(m, k), torch.randn(n, k)
    for _ in range(3):
        torch.mm(x, w.t())
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(10):
            torch.mm(x, w.t())
        best = min(best, (time.perf_counter() - start) / 10)
    print(f"MKL      m={m} n={n} k={k}: {2 * m * n * k / best / 1e9:.1f} GFLOP/s")
