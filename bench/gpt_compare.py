#!/usr/bin/env python3
"""cumulus' `gpt train` against its PyTorch twin (bench/pytorch/gpt.py), side by side on one machine.

Both start from the same weights (`gpt train --steps 0 --save`), read the same windows and take the
same steps; runs alternate (cumulus, PyTorch, cumulus, ...) so that load drifts hit both alike.
Reports, per config: the largest per-step loss difference, the validation losses, and the median
time per optimizer step of each (steps after the first two of a run, over all rounds), with their
ratio, and the tokens per second those medians give. Writes summary.json and summary.md to --out.

  bench/gpt_compare.py --gpt build/bin/gpt --data ../shared/data/shakespeare --out DIR
                       [--configs small,large] [--steps 30] [--rounds 3] [--threads 1] [--compile]
                       [--device cpu|cuda] [--precision fp32|bf16] [--also-compile] [--cpu-reference N]
                       [--variant NAME:VAR=VALUE[,VAR=VALUE] [--variant-timeout S]]

On CUDA, `gpt2s` is GPT-2 small's shape (context 1024, width 768, 12 heads, 12 blocks) with the
character vocabulary; both engines then run f32 without TF32, or bf16 compute with fp32 weights.
`parity` is GPT-2 small's block (width 768, 12 heads of 64) at context 256 with 2 blocks: cheap
enough for --cpu-reference over 20 steps.

--also-compile runs a third side in every round, the twin under torch.compile (`pytorch_compile`),
so that eager and compiled PyTorch are measured beside cumulus in one run; a compiled twin that
fails or runs past --compile-timeout is reported, not fatal. --cpu-reference N then runs cumulus on
the CPU from the same weights with the same flags for the first N steps (--stop-after N,
--cpu-threads threads) and reports the per-step loss differences of the device's first round
against it (on the GPU: the CUDA path against the CPU path). --variant runs one more cumulus side
each round after PyTorch's eager side, `cumulus_NAME`, with the given environment (the CUDA paths
an environment variable chooses, such as the fallbacks to the defaults), reported beside the
default one; it may fail or run past --variant-timeout without ending the run. summary.json and summary.md are
rewritten after every config, so a run cut short keeps the configs it finished.
"""

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

CONFIGS = {  # nanoGPT-style flag sets; the two sizes
    "small": dict(context=64, width=128, heads=4, layers=4, micro_batch=8, accum_steps=4),
    "large": dict(context=256, width=256, heads=8, layers=6, micro_batch=8, accum_steps=4),
    "gpt2s": dict(context=1024, width=768, heads=12, layers=12, micro_batch=8, accum_steps=4),
    "parity": dict(context=256, width=768, heads=12, layers=2, micro_batch=4, accum_steps=2),
}
HERE = os.path.dirname(os.path.abspath(__file__))


def read_jsonl(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def run(cmd, env=None, fatal=True, timeout=None):
    try:
        r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        if fatal:
            raise
        raise RuntimeError("past its %d s limit: %s" % (timeout, " ".join(cmd)))
    if r.returncode != 0:
        message = "failed (%d): %s\n%s" % (r.returncode, " ".join(cmd), r.stdout[-3000:])
        if fatal:
            sys.exit(message)
        raise RuntimeError(message)
    return r.stdout


def compare(name, cfg, a, corpus, out):
    init = os.path.join(out, name + "_init.safetensors")
    shape = ["--context", str(cfg["context"]), "--width", str(cfg["width"]), "--heads", str(cfg["heads"]),
             "--layers", str(cfg["layers"])]
    common = ["--micro-batch", str(cfg["micro_batch"]), "--accum-steps", str(cfg["accum_steps"]), "--steps",
              str(a.steps), "--warmup", str(a.warmup or max(1, a.steps // 10)), "--eval-every", str(a.eval_every),
              "--eval-windows",
              str(a.eval_windows), "--threads", str(a.threads), "--seed", "1337", "--device", a.device,
              "--precision", a.precision]
    run([a.gpt, "train", "--data", corpus] + shape + ["--steps", "0", "--warmup", "0", "--save", init, "--quiet"])
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads))
    variant_side, variant_env = variant(a.variant)
    sides = ("cumulus", "pytorch") + ((variant_side,) if variant_side else ()) + (
        ("pytorch_compile",) if a.also_compile else ())
    times = {k: [] for k in sides}
    runs = {k: [] for k in sides}
    failed = {}
    for r in range(a.rounds):
        for who in sides:
            if who in failed:
                continue
            metrics = os.path.join(out, "%s_%s_%d.jsonl" % (name, who, r))
            if os.path.exists(metrics):
                os.remove(metrics)
            if who.startswith("cumulus"):
                try:
                    run([a.gpt, "train", "--data", corpus, "--init", init, "--metrics", metrics, "--quiet"] + shape +
                        common, dict(env, **variant_env) if who == variant_side else env, fatal=who == "cumulus",
                        timeout=a.variant_timeout if who == variant_side and a.variant_timeout else None)
                except RuntimeError as e:  # only the variant side may fail without ending the comparison
                    failed[who] = str(e)[-1500:]
                    print("%s %s: %s" % (name, who, failed[who]), file=sys.stderr, flush=True)
                    continue
            else:
                cmd = [sys.executable, os.path.join(HERE, "pytorch", "gpt.py"), "--data", corpus, "--init", init,
                       "--metrics", metrics] + common
                if a.compile or who == "pytorch_compile":
                    cmd.append("--compile")
                try:
                    run(cmd, env, fatal=who == "pytorch",
                        timeout=a.compile_timeout if who == "pytorch_compile" and a.compile_timeout else None)
                except RuntimeError as e:
                    failed[who] = str(e)[-1500:]
                    print("%s %s: %s" % (name, who, failed[who]), file=sys.stderr, flush=True)
                    continue
            lines = read_jsonl(metrics)
            steps = [l for l in lines if "loss" in l]
            runs[who].append(lines)
            times[who] += [l["step_seconds"] for l in steps[2:]]
    c_steps = [l for l in runs["cumulus"][0] if "loss" in l]
    p_steps = [l for l in runs["pytorch"][0] if "loss" in l]
    c_val = [l["val_loss"] for l in runs["cumulus"][0] if "val_loss" in l][-1]
    p_val = [l["val_loss"] for l in runs["pytorch"][0] if "val_loss" in l][-1]
    med = {k: statistics.median(v) for k, v in times.items() if v}
    if a.plot:
        write_curves(os.path.join(out, name + "_curves.svg"), runs["cumulus"][0], runs["pytorch"][0])
    result = {
        "config": dict(cfg, steps=a.steps, threads=a.threads, rounds=a.rounds),
        "max_step_loss_diff": max(abs(x["loss"] - y["loss"]) for x, y in zip(c_steps, p_steps)),
        "max_step_loss_diff_first_200": max(abs(x["loss"] - y["loss"]) for x, y in zip(c_steps[:200], p_steps[:200])),
        "val_losses": {"cumulus": [(l["step"], l["val_loss"]) for l in runs["cumulus"][0] if "val_loss" in l],
                       "pytorch": [(l["step"], l["val_loss"]) for l in runs["pytorch"][0] if "val_loss" in l]},
        "final_loss": {"cumulus": c_steps[-1]["loss"], "pytorch": p_steps[-1]["loss"]},
        "val_loss": {"cumulus": c_val, "pytorch": p_val, "diff": abs(c_val - p_val)},
        "median_step_seconds": med,
        "min_step_seconds": {k: min(v) for k, v in times.items() if v},
        "max_step_seconds": {k: max(v) for k, v in times.items() if v},
        "ratio_cumulus_over_pytorch": med["cumulus"] / med["pytorch"],
        "tokens_per_second": {k: cfg["micro_batch"] * cfg["accum_steps"] * cfg["context"] / v for k, v in med.items()},
    }
    if "pytorch_compile" in med:
        result["ratio_cumulus_over_pytorch_compile"] = med["cumulus"] / med["pytorch_compile"]
        k_steps = [l for l in runs["pytorch_compile"][0] if "loss" in l]
        result["max_step_loss_diff_compile"] = max(abs(x["loss"] - y["loss"]) for x, y in zip(c_steps, k_steps))
    if variant_side in med:
        result["variant_env"] = variant_env
        result["ratio_%s_over_pytorch" % variant_side] = med[variant_side] / med["pytorch"]
        o_steps = [l for l in runs[variant_side][0] if "loss" in l]
        result["max_step_loss_diff_%s" % variant_side] = max(abs(x["loss"] - y["loss"]) for x, y in zip(o_steps, p_steps))
    if failed:
        result["failed"] = failed
    if a.cpu_reference:
        result["cpu_reference"] = cpu_reference(name, a, corpus, out, init, shape, common, c_steps)
    return result


def variant(text):
    """(side name, environment) of --variant NAME:VAR=VALUE[,VAR=VALUE]; (None, {}) without it."""
    if not text:
        return None, {}
    name, _, assignments = text.partition(":")
    pairs = [kv.split("=", 1) for kv in assignments.split(",") if kv]
    if not name or not pairs or any(len(kv) != 2 or not kv[0] for kv in pairs):
        sys.exit("gpt_compare.py: --variant %r: expected NAME:VAR=VALUE[,VAR=VALUE]" % text)
    return "cumulus_" + name, dict(pairs)


def cpu_losses(name, a, corpus, out, init, shape, common, n, precision):
    """The first n step losses of cumulus on the CPU from the same weights and flags, at `precision`."""
    metrics = os.path.join(out, "%s_cumulus_cpu_reference%s.jsonl" % (name, "" if precision == a.precision
                                                                       else "_" + precision))
    if os.path.exists(metrics):
        os.remove(metrics)
    flags = list(common)
    for flag, value in (("--device", "cpu"), ("--threads", str(a.cpu_threads)), ("--precision", precision)):
        flags[flags.index(flag) + 1] = value
    env = dict(os.environ, OMP_NUM_THREADS=str(a.cpu_threads))
    run([a.gpt, "train", "--data", corpus, "--init", init, "--metrics", metrics, "--quiet", "--stop-after", str(n)]
        + shape + flags, env, fatal=False)
    return [l["loss"] for l in read_jsonl(metrics) if "loss" in l][:n]


def cpu_reference(name, a, corpus, out, init, shape, common, device_steps):
    """cumulus on the CPU from the same weights and flags for the first --cpu-reference steps: the
    per-step loss differences of the device's first round against it. In bf16, also the tolerance
    of Note [bf16 loss tolerance], from a second CPU run in fp32.

    Note [bf16 loss tolerance]
    Two bf16 paths that follow the same recipe round the same tensors to bf16 at the same places;
    they differ only where their f32 arithmetic (the order of a sum, a library's kernel) differs in
    the last bits, which moves some roundings to the neighbouring bf16 value. Each such move is one
    of the roundings the recipe makes anyway, so the loss difference between two such paths is of
    the size of (and, summed over the run, no larger than) the effect of all of them together: the
    distance of the bf16 path from the fp32 one from the same weights. The tolerance is that
    distance measured in the same run, max over the steps of |L_cpu_bf16 - L_cpu_fp32|, and the
    device's bf16 losses are held within it of the CPU's bf16 losses, step by step. It is an
    argument of scale, not a proof: a device path that rounded other tensors, or rounded twice,
    would drift from the CPU's by about as much as bf16 from fp32 and fail it.
    """
    n = min(a.cpu_reference, a.steps)
    t0 = time.perf_counter()
    try:
        cpu = cpu_losses(name, a, corpus, out, init, shape, common, n, a.precision)
        fp32 = cpu_losses(name, a, corpus, out, init, shape, common, n, "fp32") if a.precision == "bf16" else None
    except RuntimeError as e:
        return {"steps": n, "error": str(e)[-1500:]}
    device = [l["loss"] for l in device_steps[:n]]
    diffs = [abs(x - y) for x, y in zip(device, cpu)]
    result = {"steps": len(diffs), "precision": a.precision, "threads": a.cpu_threads,
              "seconds": time.perf_counter() - t0, "max_loss_diff": max(diffs) if diffs else None,
              "loss_diff_per_step": diffs, "losses": {"device": device[:len(diffs)], "cpu": cpu}}
    if fp32:
        own = [abs(x - y) for x, y in zip(cpu, fp32)]
        result["losses"]["cpu_fp32"] = fp32
        result["bf16_tolerance"] = max(own)  # Note [bf16 loss tolerance]
        result["within_bf16_tolerance"] = bool(diffs) and max(diffs) <= max(own)
    return result


def bf16_verdict(ref):
    """', within the bf16 tolerance ...: met' for a bf16 reference with its tolerance, else ''."""
    if "bf16_tolerance" not in ref:
        return ""
    return "; bf16 tolerance (Note [bf16 loss tolerance]: the CPU's bf16 against its fp32) %.2e: %s" % (
        ref["bf16_tolerance"], "met" if ref["within_bf16_tolerance"] else "NOT met")


def write_curves(path, cumulus, pytorch, width=640, height=360):
    """Train (per step) and validation (per evaluation) loss of both runs as one SVG."""
    series = [("cumulus train", "#1f77b4", [(l["step"], l["loss"]) for l in cumulus if "loss" in l], 1.2),
              ("PyTorch train", "#ff7f0e", [(l["step"], l["loss"]) for l in pytorch if "loss" in l], 1.2),
              ("cumulus validation", "#1f3f8f", [(l["step"], l["val_loss"]) for l in cumulus if "val_loss" in l], 2.5),
              ("PyTorch validation", "#c04000", [(l["step"], l["val_loss"]) for l in pytorch if "val_loss" in l], 2.5)]
    xs = [x for _, _, pts, _ in series for x, _ in pts]
    ys = [y for _, _, pts, _ in series for _, y in pts]
    x0, x1, y0, y1 = 0, max(xs), min(ys), min(max(ys), min(ys) + 3.0)
    px = lambda x: 60 + (width - 80) * (x - x0) / (x1 - x0 or 1)
    py = lambda y: 20 + (height - 60) * (1 - (min(y, y1) - y0) / (y1 - y0 or 1))
    out = ['<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="12">'
           % (width, height), '<rect width="100%" height="100%" fill="white"/>']
    for i in range(6):
        y = y0 + (y1 - y0) * i / 5
        out.append('<line x1="60" x2="%d" y1="%.1f" y2="%.1f" stroke="#ddd"/><text x="5" y="%.1f">%.2f</text>'
                   % (width - 20, py(y), py(y), py(y) + 4, y))
    out.append('<text x="%d" y="%d">optimizer step (0 - %d)</text>' % (width // 2 - 60, height - 10, x1))
    for k, (label, color, pts, w) in enumerate(series):
        d = " ".join("%.1f,%.1f" % (px(x), py(y)) for x, y in pts)
        out.append('<polyline fill="none" stroke="%s" stroke-width="%.1f" points="%s"/>' % (color, w, d))
        out.append('<text x="%d" y="%d" fill="%s">%s</text>' % (width - 200, 40 + 16 * k, color, label))
    out.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--gpt", required=True, help="the built gpt app")
    p.add_argument("--data", required=True, help="folder holding shakespeare.txt, or the text file")
    p.add_argument("--out", required=True)
    p.add_argument("--configs", default="small,large")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--eval-windows", type=int, default=32)
    p.add_argument("--eval-every", type=int, default=0, help="validation every E steps (0: at the end only)")
    p.add_argument("--warmup", type=int, default=0, help="warmup steps (0: a tenth of --steps)")
    p.add_argument("--plot", action="store_true", help="also write <config>_curves.svg: train and validation loss")
    p.add_argument("--compile", action="store_true", help="torch.compile the twin's model")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    p.add_argument("--also-compile", action="store_true",
                   help="a third side each round: the twin under torch.compile (pytorch_compile)")
    p.add_argument("--variant", metavar="NAME:VAR=VALUE[,VAR=VALUE]",
                   help="one more cumulus side each round, cumulus_NAME, with these environment variables (the "
                        "fallback CUDA paths: CUMULUS_CUDA_ATTENTION=own, CUMULUS_CUDA_LINEAR16=scratch)")
    p.add_argument("--variant-timeout", type=float, default=0,
                   help="seconds the --variant side may take per run (0: no limit); past it, reported failed")
    p.add_argument("--compile-timeout", type=float, default=0,
                   help="seconds the --also-compile side may take per run (0: no limit); past it, reported failed")
    p.add_argument("--cpu-reference", type=int, default=0, metavar="N",
                   help="cumulus on the CPU from the same weights for N steps: per-step loss differences")
    p.add_argument("--cpu-threads", type=int, default=os.cpu_count(), help="threads of the --cpu-reference run")
    a = p.parse_args()
    corpus = os.path.join(a.data, "shakespeare.txt") if os.path.isdir(a.data) else a.data
    os.makedirs(a.out, exist_ok=True)
    import torch
    results = {"date": time.strftime("%Y-%m-%d"), "machine": platform.processor() or platform.machine(),
               "cpu_count": os.cpu_count(), "load_before": os.getloadavg(), "torch": torch.__version__,
               "compile": a.compile, "device": a.device, "precision": a.precision, "configs": {}}
    if a.also_compile:
        results["also_compile"] = True
    if a.device == "cuda":
        results["gpu"] = torch.cuda.get_device_name(0)
    # Which kernels cumulus' GEMMs run (OpenBLAS's choice, or the environment's OPENBLAS_CORETYPE).
    results["cumulus_cpu_kernels"] = next((l for l in run([a.gpt, "--version"]).splitlines() if l.startswith("CPU:")), "")
    results["OPENBLAS_CORETYPE"] = os.environ.get("OPENBLAS_CORETYPE")
    print(results["cumulus_cpu_kernels"], "| OPENBLAS_CORETYPE:", results["OPENBLAS_CORETYPE"], flush=True)
    for name in a.configs.split(","):
        results["configs"][name] = compare(name, CONFIGS[name], a, corpus, a.out)
        print(name, json.dumps(results["configs"][name]), flush=True)
        results["load_after"] = os.getloadavg()
        rows = write_summary(results, a.out)
    print("\n".join(rows))


def write_summary(results, out):
    """summary.json and summary.md of the configs so far; returns the markdown's lines."""
    with open(os.path.join(out, "summary.json"), "w") as f:
        json.dump(results, f, indent=2)
    rows = ["| config | cumulus ms/step | PyTorch ms/step | ratio | tokens/s (cumulus / PyTorch) | max step-loss diff "
            "| val loss (cumulus / PyTorch) |",
            "|---|---|---|---|---|---|---|"]
    extra = []
    for name, r in results["configs"].items():
        m = r["median_step_seconds"]
        tps = r["tokens_per_second"]
        rows.append("| %s | %.1f | %.1f | %.2fx | %.0f / %.0f | %.1e | %.6f / %.6f |" % (
            name, m["cumulus"] * 1e3, m["pytorch"] * 1e3, r["ratio_cumulus_over_pytorch"], tps["cumulus"],
            tps["pytorch"], r["max_step_loss_diff"], r["val_loss"]["cumulus"], r["val_loss"]["pytorch"]))
        if "pytorch_compile" in m:
            extra.append("%s, PyTorch compiled: %.1f ms/step, %.0f tokens/s, cumulus / compiled %.2fx, max step-loss "
                         "diff %.1e" % (name, m["pytorch_compile"] * 1e3, tps["pytorch_compile"],
                                        r["ratio_cumulus_over_pytorch_compile"], r["max_step_loss_diff_compile"]))
        for side in (k for k in m if k.startswith("cumulus_")):
            extra.append("%s, %s (%s): %.1f ms/step, %.0f tokens/s, %s / PyTorch %.2fx, max step-loss diff %.1e" % (
                name, side, ",".join("%s=%s" % kv for kv in r["variant_env"].items()), m[side] * 1e3, tps[side], side,
                r["ratio_%s_over_pytorch" % side], r["max_step_loss_diff_%s" % side]))
        for who, why in r.get("failed", {}).items():
            extra.append("%s, %s: failed: %s" % (name, who, why.strip().splitlines()[-1][:300] if why.strip() else "?"))
        ref = r.get("cpu_reference")
        if ref and ref.get("error"):
            extra.append("%s, CPU reference: failed: %s" % (name, ref["error"].strip().splitlines()[-1][:300]))
        elif ref:
            extra.append("%s, against cumulus on the CPU (%s, same weights): largest step-loss difference %.2e over %d "
                         "steps (%.0f s)%s" % (name, ref["precision"], ref["max_loss_diff"] if ref["max_loss_diff"]
                                               is not None else float("nan"), ref["steps"], ref["seconds"],
                                               bf16_verdict(ref)))
    with open(os.path.join(out, "summary.md"), "w") as f:
        f.write("\n".join(rows + ([""] + extra if extra else [])) + "\n")
    return rows + ([""] + extra if extra else [])


if __name__ == "__main__":
    main()
