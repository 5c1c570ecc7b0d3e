# usage (from anywhere, the build at /work/main/build): ab2.py CONFIG THREADS ROUNDS STEPS: cumulus with OpenBLAS's own pick (Cooperlake) against cumulus's (Haswell), alternated.
import json, os, statistics, subprocess, sys
cfg, th, rounds, steps = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
shape = {"small": "--context 64 --width 128 --heads 4 --layers 4", "large": "--context 256 --width 256 --heads 8 --layers 6"}[cfg]
t = {"Cooperlake": [], "Haswell": []}
for r in range(rounds):
    for core in t:
        env = dict(os.environ)
        if core == "Cooperlake": env["OPENBLAS_CORETYPE"] = "Cooperlake"
        else: env.pop("OPENBLAS_CORETYPE", None)
        m = "/tmp/ab2_%s.jsonl" % core
        cmd = "/work/main/build/bin/gpt train --data /work/shared/data/shakespeare/shakespeare.txt --metrics %s --quiet %s --micro-batch 8 --accum-steps 4 --steps %s --warmup 3 --eval-every 0 --eval-windows 64 --threads %s --seed 1337 --device cpu --precision fp32" % (m, shape, steps, th)
        subprocess.run(cmd.split(), check=True, env=env, stdout=subprocess.DEVNULL)
        ls = [json.loads(l) for l in open(m) if '"loss"' in l]
        t[core] += [l["step_seconds"] for l in ls[2:]]
    print("round", r, {c: round(statistics.median(v) * 1e3, 2) for c, v in t.items()}, flush=True)
a, b = statistics.median(t["Cooperlake"]) * 1e3, statistics.median(t["Haswell"]) * 1e3
print("%s t%s: Cooperlake %.2f ms, Haswell %.2f ms, Haswell/Cooperlake %.4f (%d steps each)" % (cfg, th, a, b, b / a, len(t["Haswell"])))
