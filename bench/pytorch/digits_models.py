"""apps/digits in PyTorch: the same two models of one's own (a residual MLP with layer norm, GELU and
dropout; a small attention block over the 8 rows of an 8 x 8 digit), the same data (scikit-learn's
digits, pixels / 16, the first 1500 to train and the rest to test), AdamW with gradient clipping,
micro-batches accumulated into optimizer steps (each step the mean over its group's samples).
--init starts from cumulus's initial weights (`digits --save-init`, loaded with strict=True) with
dropout off and batches in order, as `digits --compare` runs, and prints the loss of every
optimizer step as JSON lines for bench/pytorch/compare_digits.py.
  python3 digits_models.py [--model resmlp|attention] [--init FILE] [--epochs N] [--data digits.csv.gz]
                           [--micro-batch M] [--accum N]"""
import argparse
import gzip
import json
import math
import os

import numpy as np
import sklearn
import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from torch import nn


class Block(nn.Module):  # pre-norm residual MLP block
    def __init__(self, d, hidden, p):
        super().__init__()
        self.norm, self.fc1, self.fc2, self.drop = nn.LayerNorm(d), nn.Linear(d, hidden), nn.Linear(hidden, d), nn.Dropout(p)

    def forward(self, h):
        return h + self.fc2(self.drop(F.gelu(self.fc1(self.norm(h)))))


class ResMLP(nn.Module):
    def __init__(self, p):
        super().__init__()
        self.inp, self.blocks = nn.Linear(64, 128), nn.ModuleList([Block(128, 256, p) for _ in range(2)])
        self.norm, self.head = nn.LayerNorm(128), nn.Linear(128, 10)

    def forward(self, x):
        h = self.inp(x)
        for block in self.blocks:
            h = block(h)
        return self.head(self.norm(h))


class Attention(nn.Module):  # the image's 8 rows are 8 tokens of 8 pixels
    def __init__(self, p, d=32):
        super().__init__()
        self.d, self.tok, self.pos = d, nn.Linear(8, d), nn.Embedding(8, d)
        self.ln1, self.qkv, self.proj = nn.LayerNorm(d), nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.mlp, self.norm, self.head = Block(d, 2 * d, p), nn.LayerNorm(d), nn.Linear(8 * d, 10)

    def forward(self, x):
        h = self.tok(x.view(-1, 8, 8)) + self.pos(torch.arange(8, device=x.device))
        q, k, v = self.qkv(self.ln1(h)).split(self.d, dim=-1)
        attention = torch.softmax(q @ k.transpose(1, 2) / math.sqrt(self.d), dim=-1)
        h = self.mlp(h + self.proj(attention @ v))
        return self.head(self.norm(h).flatten(1))


parser = argparse.ArgumentParser()
parser.add_argument("--model", choices=["resmlp", "attention"], default="resmlp")
parser.add_argument("--init", help="cumulus's initial weights: compare mode (dropout off, batches in order)")
parser.add_argument("--epochs", type=int, default=20)
parser.add_argument("--micro-batch", type=int, default=128)
parser.add_argument("--accum", type=int, default=2)
parser.add_argument("--data", default=os.path.join(os.path.dirname(sklearn.__file__), "datasets/data/digits.csv.gz"))
args = parser.parse_args()
micro_batch, accum_steps, dropout = args.micro_batch, args.accum, 0.0 if args.init else 0.1

data = torch.from_numpy(np.loadtxt(gzip.open(args.data), delimiter=",", dtype=np.float32))
x, y = data[:, :64] / 16, data[:, 64].long()
n_train = min(1500, len(x) * 5 // 6)
x_train, y_train, x_test, y_test = x[:n_train], y[:n_train], x[n_train:], y[n_train:]
torch.manual_seed(0)
model = ResMLP(dropout) if args.model == "resmlp" else Attention(dropout)
if args.init:
    model.load_state_dict(load_file(args.init), strict=True)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
step = 0
for epoch in range(args.epochs):
    model.train()
    order = torch.arange(len(x_train)) if args.init else torch.randperm(len(x_train))
    batches = order.split(micro_batch)
    loss_sum, group_loss, group_samples = 0.0, 0.0, 0
    for i, idx in enumerate(batches):
        loss = F.cross_entropy(model(x_train[idx]), y_train[idx], reduction="sum")
        loss.backward()
        group_loss, group_samples = group_loss + loss.item(), group_samples + len(idx)
        if (i + 1) % accum_steps == 0 or i + 1 == len(batches):
            for p in model.parameters():
                p.grad /= group_samples  # the group's mean, a short last group included
            nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad()
            step += 1
            if args.init:
                print(json.dumps({"step": step, "loss": group_loss / group_samples}))
            loss_sum, group_loss, group_samples = loss_sum + group_loss, 0.0, 0
    model.eval()
    with torch.no_grad():
        accuracy = (model(x_test).argmax(1) == y_test).float().mean().item() * 100
    if not args.init:
        print(f"epoch {epoch + 1:2d}  train loss {loss_sum / len(x_train):.4f}  test accuracy {accuracy:.1f}%")
