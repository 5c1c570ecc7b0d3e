"""own_llama.cpp's twin in PyTorch: the same model, data, optimizer, schedule and accumulation.
   python own_llama.py CORPUS [steps] [INIT]   (INIT: own_llama's initial weights, to compare per step)
The windows are own_llama's (data::token_window_offset, as bench/pytorch/gpt.py draws them)."""
import math
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, __file__.rsplit("/", 3)[0] + "/bench/pytorch")
from gpt import load_corpus, token_window_offset, windows  # noqa: E402

DIM, HEADS, LAYERS, HIDDEN, CONTEXT, BATCH, ACCUM = 128, 4, 4, 352, 64, 8, 4


def rotate(x, cos, sin):  # Llama's rotate_half
    x1, x2 = x.chunk(2, -1)
    return x * cos + torch.cat([-x2, x1], -1) * sin


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn_norm, self.mlp_norm = nn.RMSNorm(DIM), nn.RMSNorm(DIM)
        self.qkv = nn.Linear(DIM, 3 * DIM, bias=False)
        self.out = nn.Linear(DIM, DIM, bias=False)
        self.gate_up = nn.Linear(DIM, 2 * HIDDEN, bias=False)
        self.down = nn.Linear(HIDDEN, DIM, bias=False)

    def forward(self, x, cos, sin):
        B, T, _ = x.shape
        heads = lambda t: t.view(B, T, HEADS, -1).transpose(1, 2)
        q, k, v = self.qkv(self.attn_norm(x)).chunk(3, -1)
        a = F.scaled_dot_product_attention(rotate(heads(q), cos, sin), rotate(heads(k), cos, sin), heads(v),
                                           is_causal=True)
        h = x + self.out(a.transpose(1, 2).reshape(B, T, DIM))
        gate, up = self.gate_up(self.mlp_norm(h)).chunk(2, -1)
        return h + self.down(F.silu(gate) * up)


class Llama(nn.Module):
    def __init__(self, vocab):
        super().__init__()
        self.embed = nn.Embedding(vocab, DIM)
        self.layers = nn.ModuleList(Block() for _ in range(LAYERS))
        self.norm = nn.RMSNorm(DIM)
        self.head = nn.Linear(DIM, vocab, bias=False)
        nn.init.normal_(self.embed.weight, std=0.02)
        self.head.weight = self.embed.weight
        D = DIM // HEADS
        angles = torch.outer(torch.arange(CONTEXT, dtype=torch.float64),
                             10000.0 ** (-torch.arange(0, D, 2, dtype=torch.float64) / D))
        angles = torch.cat([angles, angles], -1)
        self.register_buffer("cos", angles.cos().float(), persistent=False)
        self.register_buffer("sin", angles.sin().float(), persistent=False)

    def forward(self, tokens):
        T = tokens.size(1)
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x, self.cos[:T], self.sin[:T])
        return self.head(self.norm(x))


def main():
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 100
    vocab, train, _ = load_corpus(sys.argv[1])
    model = Llama(len(vocab))
    if len(sys.argv) > 3:
        from safetensors.torch import load_file
        model.load_state_dict(load_file(sys.argv[3]))
    decay = [p for p in model.parameters() if p.dim() >= 2]
    other = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": other, "weight_decay": 0.0}],
                            lr=3e-3, betas=(0.9, 0.95), eps=1e-8)
    warmup = steps // 10
    schedule = lambda s: (s + 1) / warmup if s < warmup else 0.5 * (1 + math.cos(math.pi * (s - warmup) / (steps - warmup)))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, schedule)
    tokens = BATCH * CONTEXT * ACCUM
    for step in range(steps):
        if step == 1:
            start = time.perf_counter()  # the first step warms the caches
        total = 0.0
        for i in range(step * ACCUM, (step + 1) * ACCUM):
            x, y = windows(train, [token_window_offset(1337, i, r, len(train) - CONTEXT) for r in range(BATCH)], CONTEXT)
            loss = F.cross_entropy(model(x).view(-1, len(vocab)), y.view(-1), reduction="sum")
            (loss / tokens).backward()
            total += loss.item()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        lr = opt.param_groups[0]["lr"]
        opt.step()
        opt.zero_grad()
        sched.step()
        ms = (time.perf_counter() - start) * 1000 / step if step >= 1 else 0.0
        print(f"step {step + 1:4d}  loss {total / tokens:.7f}  lr {lr:.6e}  ms/step {ms:.2f}")


if __name__ == "__main__":
    main()
