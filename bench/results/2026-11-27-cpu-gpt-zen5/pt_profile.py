import sys, torch
sys.path.insert(0, "/work/main/bench/pytorch")
import gpt
torch.set_num_threads(1)
c = dict(vocab_size=84, n_embd=256, n_head=8, n_layer=6, block_size=256)
m = gpt.GPT(c)
idx = torch.randint(0, 84, (8, 256)); tgt = torch.randint(0, 84, (8, 256))
for _ in range(2): m(idx, tgt).backward()
from torch.profiler import profile, ProfilerActivity
with profile(activities=[ProfilerActivity.CPU]) as prof:
    for _ in range(4): m(idx, tgt).backward()
print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=16))
