"""The PyTorch twin of `gpt train` (apps/gpt): the same character-level GPT written nanoGPT-style in
plain PyTorch, trained the same way, so that losses and time can be compared side by side.

Same model: nanoGPT's GPT class (token + position embeddings, pre-LayerNorm blocks of causal
self-attention through F.scaled_dot_product_attention and a GELU MLP, final LayerNorm, LM head tied
to the token embedding), GELU in its tanh form as cumulus' models::GPT. Same start: --init loads a
checkpoint written by `gpt train --steps 0 --save FILE` (safetensors, nanoGPT's names, strict=True).
Same data: the corpus's distinct bytes as the vocabulary, the first 90% of tokens for training, and
window r of micro-batch i at the offset token_window_offset(seed, i, r, n - T) (splitmix64, as
engine/data/token_windows.cpp). Same step: per micro-batch the token-summed cross-entropy, the
group's gradient divided by its tokens, the global norm clipped, AdamW with decay on 2-D weights
only (--weight-decay-all: every parameter), warmup + cosine as optim::CosineWarmupLR.
Output: one JSON line per step and per evaluation, with the keys `gpt train --metrics` writes.
On CUDA (--device cuda) a step's time ends at a synchronization; --precision bf16 runs the forward
under torch.autocast (the weights, gradients and AdamW in fp32), f32 matmuls stay in full f32 (no
TF32) as cumulus' f32 path.
"""

import argparse
import json
import math
import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

MASK = (1 << 64) - 1


def splitmix64(z):
    z = (z + 0x9E3779B97F4A7C15) & MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


def token_window_offset(seed, index, row, count):
    return splitmix64(splitmix64(splitmix64(seed) ^ index) ^ row) % count


class CausalSelfAttention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.n_head, self.n_embd = c["n_head"], c["n_embd"]
        self.c_attn = nn.Linear(self.n_embd, 3 * self.n_embd)
        self.c_proj = nn.Linear(self.n_embd, self.n_embd)

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class MLP(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c_fc = nn.Linear(c["n_embd"], 4 * c["n_embd"])
        self.gelu = nn.GELU(approximate="tanh")
        self.c_proj = nn.Linear(4 * c["n_embd"], c["n_embd"])

    def forward(self, x):
        return self.c_proj(self.gelu(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.ln_1 = nn.LayerNorm(c["n_embd"])
        self.attn = CausalSelfAttention(c)
        self.ln_2 = nn.LayerNorm(c["n_embd"])
        self.mlp = MLP(c)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(c["vocab_size"], c["n_embd"]),
            wpe=nn.Embedding(c["block_size"], c["n_embd"]),
            h=nn.ModuleList([Block(c) for _ in range(c["n_layer"])]),
            ln_f=nn.LayerNorm(c["n_embd"]),
        ))
        self.lm_head = nn.Linear(c["n_embd"], c["vocab_size"], bias=False)
        self.transformer.wte.weight = self.lm_head.weight

    def forward(self, idx, targets):
        t = idx.size(1)
        pos = torch.arange(t, dtype=torch.long, device=idx.device)
        x = self.transformer.wte(idx) + self.transformer.wpe(pos)
        for block in self.transformer.h:
            x = block(x)
        logits = self.lm_head(self.transformer.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), reduction="sum")


def lr_at(step, lr, warmup, total, min_lr):
    """optim::CosineWarmupLR::lr_at, in float32 as cumulus computes it."""
    f32 = lambda v: torch.tensor(v, dtype=torch.float32)
    if step < warmup:
        return float(f32(lr) * f32(step + 1) / f32(warmup))
    if step >= total:
        return float(f32(min_lr))
    progress = (step - warmup) / (total - warmup)
    return float(f32(min_lr) + (f32(lr) - f32(min_lr)) * f32(0.5 * (1.0 + math.cos(math.pi * progress))))


def saved_bytes(model, x, y):
    """Bytes of the distinct storages autograd saves for backward in one forward, parameters excluded
    (what cumulus' tracker counts as activations, less the outputs it holds)."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    storages = {}

    def pack(t):
        s = t.untyped_storage()
        if s.data_ptr() not in params:
            storages[s.data_ptr()] = s.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(x, y)
    return sum(storages.values())


def load_corpus(path):
    with open(path, "rb") as f:
        text = f.read()
    vocab = sorted(set(text))
    index = {b: i for i, b in enumerate(vocab)}
    tokens = torch.tensor([index[b] for b in text], dtype=torch.long)
    n_train = int(len(tokens) * 0.9)
    return vocab, tokens[:n_train], tokens[n_train:]


def windows(tokens, offsets, T, device="cpu"):
    idx = torch.tensor(offsets, dtype=torch.long)[:, None] + torch.arange(T)[None, :]
    return tokens[idx].to(device), tokens[idx + 1].to(device)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", required=True, help="the corpus text file (shakespeare.txt)")
    p.add_argument("--init", required=True, help="gpt train --steps 0 --save FILE's weights")
    for name, default in [("micro-batch", 8), ("accum-steps", 4), ("steps", 200), ("warmup", 20), ("seed", 1337),
                          ("eval-every", 50), ("eval-windows", 64), ("threads", 1)]:
        p.add_argument("--" + name, type=int, default=default)
    for name, default in [("lr", 1e-3), ("min-lr", 1e-4), ("weight-decay", 0.1), ("beta1", 0.9), ("beta2", 0.99),
                          ("clip", 1.0)]:
        p.add_argument("--" + name, type=float, default=default)
    p.add_argument("--weight-decay-all", action="store_true", help="decay every parameter, not only 2-D weights")
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--precision", choices=["fp32", "bf16"], default="fp32",
                   help="bf16: the forward under torch.autocast")
    p.add_argument("--metrics", help="JSON lines to this file (default: stdout)")
    p.add_argument("--saved-bytes", action="store_true",
                   help="print the bytes autograd saves for backward per token of one micro-batch, and stop")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    torch.set_float32_matmul_precision("highest")  # no TF32: full f32 products, as cumulus' f32 path

    from safetensors import safe_open
    with safe_open(a.init, "pt") as f:
        meta = f.metadata()
        state = {k: f.get_tensor(k) for k in f.keys()}
    c = {k: int(meta["gpt." + k]) for k in ("vocab_size", "block_size", "n_layer", "n_head", "n_embd")}
    model = GPT(c)
    model.load_state_dict({k: v for k, v in state.items() if not k.startswith("optimizer.")}, strict=True)
    device = torch.device("cuda:0" if a.device == "cuda" else "cpu")
    model.to(device)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=a.precision == "bf16")

    def synchronize():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    vocab, train, val = load_corpus(a.data)
    assert len(vocab) == c["vocab_size"], "the corpus's vocabulary differs from the checkpoint's"
    T, B, N = c["block_size"], a.micro_batch, a.accum_steps

    if a.saved_bytes:
        x, y = windows(train, [token_window_offset(a.seed, 0, r, len(train) - T) for r in range(B)], T, device)
        print(json.dumps({"saved_bytes_per_token": saved_bytes(model, x, y) / x.numel()}))
        return

    params = [p for p in model.parameters()]
    if a.weight_decay_all:
        groups = [{"params": params, "weight_decay": a.weight_decay}]
    else:
        groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": a.weight_decay},
                  {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    # On the CPU one parameter at a time (the rounding cumulus matches); on CUDA the fused kernel
    # nanoGPT uses there.
    cuda = device.type == "cuda"
    opt = torch.optim.AdamW(groups, lr=a.lr, betas=(a.beta1, a.beta2), eps=1e-8, foreach=None if cuda else False,
                            fused=True if cuda else None)
    step_model = torch.compile(model) if a.compile else model
    out = open(a.metrics, "a") if a.metrics else sys.stdout

    def evaluate(step):
        model.eval()
        count = min(a.eval_windows or 1 << 62, (len(val) - 1) // T)
        total = 0.0
        with torch.no_grad():
            for first in range(0, count, B):
                x, y = windows(val, [w * T for w in range(first, min(first + B, count))], T, device)
                with autocast:
                    total += float(model(x, y))
        model.train()
        print(json.dumps({"step": step, "val_loss": total / (count * T)}), file=out, flush=True)

    for step in range(a.steps):
        synchronize()
        t0 = time.perf_counter()
        lr = lr_at(step, a.lr, a.warmup, a.steps, a.min_lr)
        for g in opt.param_groups:
            g["lr"] = lr
        group_loss = torch.zeros((), device=device, dtype=torch.float64)  # read once a step: no sync per micro-batch
        for m in range(N):
            i = step * N + m
            x, y = windows(train, [token_window_offset(a.seed, i, r, len(train) - T) for r in range(B)], T, device)
            with autocast:
                loss = step_model(x, y)
            (loss / (B * T * N)).backward()
            group_loss += loss.detach()
        if a.clip > 0:
            torch.nn.utils.clip_grad_norm_(params, a.clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        synchronize()
        seconds = time.perf_counter() - t0
        print(json.dumps({"step": step + 1, "loss": float(group_loss) / (B * T * N), "lr": lr, "step_seconds": seconds,
                          "tokens_per_second": B * T * N / seconds}), file=out, flush=True)
        if (a.eval_every > 0 and (step + 1) % a.eval_every == 0) or step + 1 == a.steps:
            evaluate(step + 1)


if __name__ == "__main__":
    main()
