# usage: ab.py GPT_A GPT_B ROUNDS STEPS [CAPABILITY]; INIT: the weights both start from.
# Alternate two gpt builds on the small config; median step time of each (steps 3.. of each run).
import json, os, statistics, subprocess, sys
a, b, rounds, steps = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
env_caps = sys.argv[5] if len(sys.argv) > 5 else None
env = dict(os.environ)
if env_caps: env["CUMULUS_CPU_CAPABILITY"] = env_caps
t = {a: [], b: []}
for r in range(rounds):
    for g in (a, b):
        m = os.path.join(os.environ.get("TMPDIR", "/tmp"), "ab_%d.jsonl" % r)
        subprocess.run([os.path.join(os.path.dirname(os.path.abspath(__file__)), "train_small.sh"), g, steps, m], check=True, env=env, stdout=subprocess.DEVNULL)
        ls = [json.loads(l) for l in open(m) if '"loss"' in l]
        t[g] += [l["step_seconds"] for l in ls[2:]]
        last = ls[-1]["loss"]
    print("round", r, {g: round(statistics.median(v) * 1e3, 2) for g, v in t.items()}, "last loss", last, flush=True)
ma, mb = statistics.median(t[a]) * 1e3, statistics.median(t[b]) * 1e3
print("A %s: %.2f ms  B %s: %.2f ms  B/A %.4f" % (a, ma, b, mb, mb / ma))
