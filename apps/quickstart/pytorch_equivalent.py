"""quickstart.cpp's job in plain PyTorch, to compare the two loops line for line (the suite does not
run it; it needs torch and safetensors): the same model, data, AdamW with clipping and warmup +
cosine, micro-batch 32 x 2 then 32 x 4 with each group the mean over its samples (32 x 2 is what
quickstart's planner chooses for the effective batch 64 under its default budget; PyTorch has no
planner, so it is written in), and the weights as safetensors under the same names. PyTorch has no
per-category memory table: memory_summary() is the nearest."""
import math
import sys

import torch
from safetensors.torch import save_file
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(64, 1024), nn.Linear(1024, 10)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def make_digits(n, seed, device):
    pattern = torch.rand(10, 64, generator=torch.Generator().manual_seed(7)) * 255
    y = torch.arange(n) % 10
    noise = torch.randn(n, 64, generator=torch.Generator().manual_seed(seed)) * 160
    return (pattern[y] + noise).clamp(0, 255).to(torch.uint8).float().div(255).to(device), y.to(device)


device = sys.argv[1] if len(sys.argv) > 1 else ("cuda" if torch.cuda.is_available() else "cpu")
epochs, accum_steps, micro_batch, warmup = 10, 2, 32, 10
x, y = make_digits(1500, 1, device)
x_test, y_test = make_digits(300, 2, device)
torch.manual_seed(0)
model = Net().to(device)
batches = math.ceil(len(x) / micro_batch)
steps = epochs // 2 * (math.ceil(batches / accum_steps) + math.ceil(batches / (2 * accum_steps)))
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: (s + 1) / warmup if s < warmup else 0.5 * (
    1 + math.cos(math.pi * min(s - warmup, steps - warmup) / (steps - warmup))))
step = 0
for epoch in range(epochs):
    n = accum_steps if epoch < epochs // 2 else 2 * accum_steps
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(epoch)).to(device)
    loss_sum, group_samples = 0.0, 0
    for i, idx in enumerate(order.split(micro_batch)):
        loss = nn.functional.cross_entropy(model(x[idx]), y[idx], reduction="sum")
        loss.backward()
        loss_sum, group_samples = loss_sum + loss.item(), group_samples + len(idx)
        if (i + 1) % n == 0 or i + 1 == batches:
            for p in model.parameters():
                p.grad /= group_samples  # the group's mean, a short last group included
            nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step(), schedule.step(), optimizer.zero_grad()
            step, group_samples = step + 1, 0
    with torch.no_grad():
        accuracy = (model(x_test).argmax(1) == y_test).float().mean().item() * 100
    print(f"epoch {epoch + 1:2d}  train loss {loss_sum / len(x):.4f}  lr {schedule.get_last_lr()[0]:.5f}  "
          f"steps {step:3d}  test accuracy {accuracy:.1f}%")
if device.startswith("cuda"):
    print(torch.cuda.memory_summary())
save_file(model.state_dict(), "quickstart.safetensors")
