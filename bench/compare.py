#!/usr/bin/env python3
"""cumulus against PyTorch on one device, in one command.

Runs, on the same device and (on CPU) with the same thread count:
  1. the cumulus microbenchmarks (build/bin/bench_step_vs_accumulate, Google Benchmark JSON);
  2. the cumulus app build/bin/fashion_mnist with --metrics, if it is built (skipped otherwise);
  3. bench/pytorch/seed_pytorch.py (the PyTorch quickstart) and bench/pytorch/fast_pytorch.py
     (dataset preloaded on the device) for each configuration (default 64x1 and 16x4), if the
     Python given by --python imports torch (skipped otherwise);
then prints a markdown table of the times (per epoch, per micro-batch, per step) and peak memory
with PyTorch / cumulus ratios, and writes everything to bench/results/<date>-<device>/:
machine.json, summary.md, compare.json and the raw outputs of every run.

With --device cuda each configuration runs five trainings side by side: the app with CUDA graphs
(--graphs on) and without (--graphs off), fast_pytorch.py (PyTorch eager), graphs_pytorch.py
(PyTorch with CUDA graphs) and seed_pytorch.py; the tables add the graph microbenchmarks
(cuda/micro_batch_graph/..., cuda/step_of_64_graph/...) next to the eager ones when the benchmark
binary has them.

  python3 bench/compare.py --device cpu --data ../shared/data/fashion-mnist
  python3 bench/compare.py --device cuda --data DIR --python /path/to/python-with-torch
"""
import argparse
import datetime
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = "bench_step_vs_accumulate"


def sh(cmd, **kw):
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=30, **kw).stdout.strip()
    except Exception:
        return ""


def machine_info(device, bindir):
    info = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "hostname": socket.gethostname(), "os": platform.platform(), "logical_cpus": os.cpu_count(),
            "load_average_start": list(os.getloadavg())}
    for line in sh(["lscpu"]).splitlines():
        if line.startswith("Model name:"):
            info["cpu_model"] = line.split(":", 1)[1].strip()
    try:
        with open("/proc/meminfo") as f:
            info["memory"] = f.readline().split(":", 1)[1].strip()
    except OSError:
        pass
    if shutil.which("nvidia-smi"):
        gpus = sh(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"])
        info["gpus"] = [g.strip() for g in gpus.splitlines() if g.strip()]
    info["git_commit"] = sh(["git", "-C", ROOT, "rev-parse", "HEAD"])
    commit_file = os.path.join(os.path.dirname(bindir), "COMMIT")  # a GPU bundle (../shared/gpu) records it
    if not info["git_commit"] and os.path.exists(commit_file):
        with open(commit_file) as f:
            info["git_commit"] = f.read().strip() + " (from the bundle)"
    dirty = sh(["git", "-C", ROOT, "status", "--porcelain"])
    info["git_dirty_files"] = len(dirty.splitlines()) if dirty else 0
    info["device"] = device
    return info


def run(cmd, env, log_path, out_dir):
    """Runs cmd, stdout+stderr into log_path; returns (rc, stdout)."""
    print("$ " + " ".join(cmd), file=sys.stderr, flush=True)
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=ROOT)
    with open(os.path.join(out_dir, log_path), "w") as f:
        f.write("$ " + " ".join(cmd) + "\n" + p.stdout + ("\n--- stderr ---\n" + p.stderr if p.stderr else ""))
    if p.returncode != 0:
        print(f"  exit {p.returncode}; see {log_path}", file=sys.stderr)
    return p.returncode, p.stdout


# ---- cumulus benchmarks ---------------------------------------------------------------------------
def parse_bench(path):
    """{run_name: entry} from Google Benchmark JSON, the median aggregate when repetitions ran."""
    with open(path) as f:
        data = json.load(f)
    by_name = {}
    for b in data.get("benchmarks", []):
        name = b.get("run_name", b["name"])
        if b.get("run_type") == "aggregate":
            if b.get("aggregate_name") == "median":
                by_name[name] = dict(b, _median=True)
        elif isinstance(by_name.setdefault(name, []), list):  # a median, once seen, wins
            by_name[name].append(b)
    out = {}
    for name, v in by_name.items():
        if isinstance(v, list):  # repetitions without aggregates: the median by time
            v = sorted(v, key=lambda e: e.get("real_time", 0))[len(v) // 2]
        if v.get("error_occurred"):
            continue
        out[name.replace("/process_time", "").replace("/manual_time", "")] = v
    return out, data.get("context", {})


def to_us(entry, key="real_time"):
    scale = {"ns": 1e-3, "us": 1.0, "ms": 1e3, "s": 1e6}[entry.get("time_unit", "ns")]
    return entry[key] * scale


# ---- formatting -------------------------------------------------------------------------------------
def fmt_bytes(b):
    if b is None:
        return "n/a"
    for unit, div in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(b) >= div:
            return f"{b / div:.2f} {unit}"
    return f"{int(b)} B"


def fmt(v, digits=1):
    if v is None:
        return "n/a"
    if abs(v) >= 1e5:
        return f"{v:,.0f}"
    return f"{v:.{digits}f}"


def ratio(a, b):
    return f"{a / b:.2f}" if a is not None and b not in (None, 0) else "n/a"


def table(header, rows):
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def bench_tables(bench, dev):
    md = []
    g = lambda n: bench.get(f"{dev}/{n}")  # noqa: E731
    # CUDA-graph variants (cuda/micro_batch_graph/..., cuda/step_of_64_graph/...): extra columns
    # next to the eager ones, only when the benchmark binary has them
    has_mb_graph = any(g(f"micro_batch_graph/{v}/{b}") for v in ("overwrite", "accumulate") for b in (16, 64, 256, 1024))
    has_step_graph = any(g(f"step_of_64_graph/{c}") for c in ("64x1", "16x4", "4x16", "1x64"))
    rows = []
    for b in (16, 64, 256, 1024):
        o, a = g(f"micro_batch/overwrite/{b}"), g(f"micro_batch/accumulate/{b}")
        if not (o and a):
            continue
        row = [b, fmt(to_us(o)), fmt(to_us(a)), ratio(to_us(a), to_us(o)),
               ratio(to_us(a, "cpu_time"), to_us(o, "cpu_time")),
               fmt(a.get("samples_per_s"), 0), fmt_bytes(a.get("activation_bytes_per_micro_batch")),
               fmt_bytes(a.get("peak_bytes_excl_data")), fmt(a.get("launches_per_micro_batch"))]
        if has_mb_graph:
            go, ga = g(f"micro_batch_graph/overwrite/{b}"), g(f"micro_batch_graph/accumulate/{b}")
            row += [fmt(to_us(go)) if go else "n/a", fmt(to_us(ga)) if ga else "n/a",
                    ratio(to_us(a), to_us(ga)) if ga else "n/a",
                    fmt(ga.get("launches_per_micro_batch")) if ga else "n/a"]
        rows.append(row)
    if rows:
        md.append("### Forward + backward of one micro-batch: overwrite (beta 0) vs accumulate (beta 1)\n")
        md.append(table(["micro-batch", "overwrite µs", "accumulate µs", "accumulate / overwrite",
                         "same, CPU time", "samples/s (acc.)", "activations / micro-batch",
                         "peak excl. data", "launches / micro-batch"]
                        + (["graph overwrite µs", "graph accumulate µs", "accumulate eager / graph",
                            "launches / micro-batch (graph)"] if has_mb_graph else []), rows))
    rows = []
    base = g("step_of_64/64x1")
    for cfg in ("64x1", "16x4", "4x16", "1x64"):
        e = g(f"step_of_64/{cfg}")
        if not e:
            continue
        row = [cfg, fmt(e.get("us_per_step")), fmt(e.get("us_per_micro_batch")), fmt(e.get("samples_per_s"), 0),
               ratio(to_us(e), to_us(base)) if base else "n/a",
               fmt_bytes(e.get("activation_bytes_per_micro_batch")), fmt_bytes(e.get("peak_bytes_excl_data")),
               ratio(e.get("peak_bytes_excl_data"), base.get("peak_bytes_excl_data")) if base else "n/a",
               fmt(e.get("launches_per_step"))]
        if has_step_graph:
            ge = g(f"step_of_64_graph/{cfg}")
            row += [fmt(ge.get("us_per_step")) if ge else "n/a", fmt(ge.get("us_per_micro_batch")) if ge else "n/a",
                    fmt(ge.get("samples_per_s"), 0) if ge else "n/a",
                    ratio(e.get("us_per_step"), ge.get("us_per_step")) if ge else "n/a",
                    fmt(ge.get("launches_per_step")) if ge else "n/a"]
        rows.append(row)
    if rows:
        md.append("\n### One optimizer step of 64 samples (SGD), as micro-batch x steps\n")
        md.append(table(["B x N", "µs / step", "µs / micro-batch", "samples/s", "time vs 64x1",
                         "activations / micro-batch", "peak excl. data", "peak vs 64x1", "launches / step"]
                        + (["graph µs / step", "graph µs / micro-batch", "graph samples/s", "step eager / graph",
                            "launches / step (graph)"] if has_step_graph else []), rows))
        if has_mb_graph or has_step_graph:
            md.append("\n'graph' columns: the same work captured once in a CUDA graph and replayed "
                      "(`micro_batch_graph/...`, `step_of_64_graph/...`); 'eager / graph' above 1: the graph is faster.")
    rows = []
    for opt in ("sgd", "sgd_momentum", "adamw"):
        u, s = g(f"optimizer_step/{opt}"), g(f"accumulator_step/{opt}")
        if u or s:
            rows.append([opt, fmt(to_us(u)) if u else "n/a", fmt(to_us(s)) if s else "n/a",
                         fmt_bytes(u.get("optimizer_state_bytes")) if u else "n/a",
                         fmt(u.get("launches_per_step")) if u else "n/a", fmt(s.get("launches_per_step")) if s else "n/a"])
    z, w = g("zero_grad/mark_stale"), g("zero_grad/write_zeros")
    if rows:
        md.append("\n### Optimizer step alone (669,706 parameters)\n")
        md.append(table(["optimizer", "fused update µs", "Trainer step µs (norm + update + stale)",
                         "state", "launches (update)", "launches (Trainer step)"], rows))
    if z or w:
        md.append(f"\nzero_grad (mark stale, flags only, host time): {fmt(to_us(z) * 1e3) if z else 'n/a'} ns; "
                  f"writing zeros over the 2.55 MB flat gradient instead: {fmt(to_us(w)) if w else 'n/a'} µs.")
    rows = []
    for b in (16, 64, 256, 1024):  # the fused MLP op against the generic ops, same form of loop
        cells = []
        for fam in ("micro_batch", "micro_batch_graph"):
            gen, fus = g(f"{fam}/accumulate/{b}"), g(f"{fam}_fused/accumulate/{b}")
            cells += [fmt(to_us(gen)) if gen else "n/a", fmt(to_us(fus)) if fus else "n/a",
                      ratio(to_us(gen), to_us(fus)) if gen and fus else "n/a"]
        if any(c != "n/a" for c in cells):
            rows.append([b] + cells)
    for cfg in ("64x1", "16x4"):
        cells = []
        for fam in ("step_of_64", "step_of_64_graph"):
            gen, fus = g(f"{fam}/{cfg}"), g(f"{fam}_fused/{cfg}")
            cells += [fmt(gen.get("us_per_step")) if gen else "n/a", fmt(fus.get("us_per_step")) if fus else "n/a",
                      ratio(gen.get("us_per_step"), fus.get("us_per_step")) if gen and fus else "n/a"]
        if any(c != "n/a" for c in cells):
            rows.append([f"step {cfg}"] + cells)
    if rows:
        md.append("\n### Fused MLP op vs generic ops (accumulating micro-batch; optimizer step of 64)\n")
        md.append(table(["micro-batch", "generic µs", "fused µs", "generic / fused", "graph generic µs",
                         "graph fused µs", "graph generic / fused"], rows))
    return "\n".join(md)


# ---- side by side ---------------------------------------------------------------------------------
def app_metrics(path):
    """Per-epoch records of the app's --metrics JSONL (lines with an "epoch")."""
    recs = []
    try:
        with open(path) as f:
            for line in f:
                line = line.strip()
                if line:
                    try:
                        r = json.loads(line)
                    except json.JSONDecodeError:
                        continue
                    if isinstance(r, dict) and "epoch" in r:
                        recs.append(r)
    except OSError:
        pass
    return recs


def first(d, *keys):
    for k in keys:
        if isinstance(d, dict) and d.get(k) is not None:
            return d[k]
    return None


def summarize_app(recs, b, n, train_samples):
    if not recs:
        return None
    steady = recs[1:] if len(recs) > 1 else recs
    epoch_s = statistics.median([first(r, "epoch_seconds", "train_seconds", "epoch_s", "train_s") or 0 for r in steady]) or None
    peak = max((first(r, "peak_bytes", "peak_memory_bytes") or 0 for r in recs), default=0) or None
    mbs = -(-train_samples // b) if train_samples else None
    return {"epoch_s": epoch_s, "samples_per_s": statistics.median([first(r, "samples_per_s") or 0 for r in steady]) or None,
            "us_per_micro_batch": epoch_s * 1e6 / mbs if epoch_s and mbs else None,
            "us_per_step": epoch_s * 1e6 / -(-mbs // n) if epoch_s and mbs else None,
            "peak_bytes": peak, "test_accuracy": first(recs[-1], "test_accuracy", "accuracy")}


def side_by_side(cfg, b, n, bench, dev, app, seed, fast, train_samples):
    train_samples = first(seed, "train_samples") or first(fast, "train_samples") or train_samples
    micro_batches = -(-train_samples // b)  # ceil
    steps = -(-micro_batches // n)          # the last, partial group steps too
    e = bench.get(f"{dev}/step_of_64/{cfg}") if b * n == 64 else None
    mb = bench.get(f"{dev}/micro_batch/accumulate/{b}")
    bench_step = e.get("us_per_step") if e else None
    bench_mb = e.get("us_per_micro_batch") if e else (to_us(mb) if mb else None)
    bench_epoch = bench_step * steps / 1e6 if bench_step and steps else None
    ref = app if app and app.get("epoch_s") else None
    cols = {"cumulus app": app, "cumulus bench": {"epoch_s": bench_epoch, "us_per_micro_batch": bench_mb,
                                                    "us_per_step": bench_step,
                                                    "samples_per_s": e.get("samples_per_s") if e else None,
                                                    "peak_bytes": e.get("peak_bytes") if e else None},
            "seed PyTorch": seed, "fast PyTorch": fast}
    base = ref or cols["cumulus bench"]
    base_name = "app" if ref else "bench"
    peak_kind = first(seed, "peak_memory_kind") or first(fast, "peak_memory_kind")
    rows = []
    for label, key, f in (("train time per epoch (s)", "epoch_s", lambda v: fmt(v, 3)),
                          ("time per micro-batch (µs)", "us_per_micro_batch", fmt),
                          ("time per optimizer step (µs)", "us_per_step", fmt),
                          ("samples/s", "samples_per_s", lambda v: fmt(v, 0)),
                          ("peak memory", None, fmt_bytes)):
        vals = []
        for name, c in cols.items():
            if key:
                v = first(c, key)
            else:
                v = first(c, "peak_memory_bytes") if "PyTorch" in name else first(c, "peak_bytes")
            vals.append(v)
        if key == "samples_per_s":
            rs = [ratio(base.get(key), first(seed, key)), ratio(base.get(key), first(fast, key))]
        elif key:
            rs = [ratio(first(seed, key), base.get(key)), ratio(first(fast, key), base.get(key))]
        else:
            rs = [ratio(first(seed, "peak_memory_bytes"), base.get("peak_bytes")),
                  ratio(first(fast, "peak_memory_bytes"), base.get("peak_bytes"))]
            if peak_kind == "peak_rss":
                rs = [r + " (RSS, not comparable)" for r in rs]
        rows.append([label] + [f(v) for v in vals] + rs)
    header = ["", "cumulus app", "cumulus bench", "seed PyTorch", "fast PyTorch",
              f"seed / {base_name}", f"fast / {base_name}"]
    return table(header, rows), {k: v for k, v in cols.items()}


def bench_column(bench, dev, cfg, b, n, steps, graph):
    """The microbenchmarks as a side-by-side column: step_of_64[_graph]/BxN when B x N = 64, else
    the micro-batch alone (micro_batch[_graph]/accumulate/B); per epoch = µs/step x steps."""
    sfx = "_graph" if graph else ""
    e = bench.get(f"{dev}/step_of_64{sfx}/{cfg}") if b * n == 64 else None
    mb = bench.get(f"{dev}/micro_batch{sfx}/accumulate/{b}")
    if not (e or mb):
        return None
    step = e.get("us_per_step") if e else None
    return {"epoch_s": step * steps / 1e6 if step and steps else None,
            "us_per_micro_batch": e.get("us_per_micro_batch") if e else to_us(mb),
            "us_per_step": step, "samples_per_s": e.get("samples_per_s") if e else None,
            "peak_bytes": e.get("peak_bytes") if e else None}


def side_by_side_cuda(cfg, b, n, bench, dev, runs, train_samples):
    """CUDA: cumulus app with and without graphs, PyTorch with graphs, fast (eager) and seed, and
    the graph / eager microbenchmarks; then the ratios. runs: app_graphs, app_eager, graphs, fast,
    seed (each a dict or None). Returns (markdown, columns)."""
    train_samples = next((first(runs.get(k), "train_samples") for k in ("graphs", "fast", "seed")
                          if first(runs.get(k), "train_samples")), None) or train_samples
    micro_batches = -(-train_samples // b)
    steps = -(-micro_batches // n)
    cols = {"cumulus graphs": runs.get("app_graphs"), "cumulus eager": runs.get("app_eager"),
            "cumulus graphs fused": runs.get("app_graphs_fused"),
            "PyTorch graphs": runs.get("graphs"), "fast PyTorch": runs.get("fast"), "seed PyTorch": runs.get("seed"),
            "cumulus bench graphs": bench_column(bench, dev, cfg, b, n, steps, graph=True),
            "cumulus bench eager": bench_column(bench, dev, cfg, b, n, steps, graph=False)}
    metrics = (("train time per epoch (s)", "epoch_s", lambda v: fmt(v, 3)),
               ("time per micro-batch (µs)", "us_per_micro_batch", fmt),
               ("time per optimizer step (µs)", "us_per_step", fmt),
               ("samples/s", "samples_per_s", lambda v: fmt(v, 0)),
               ("peak memory", "peak", fmt_bytes))

    def val(c, key):
        return first(c, "peak_memory_bytes", "peak_bytes") if key == "peak" else first(c, key)

    rows = [[label] + [f(val(c, key)) for c in cols.values()] for label, key, f in metrics]
    md = [table([""] + list(cols), rows)]

    # cumulus reference of each kind: the app, else the microbenchmark
    def ref(kind):
        app = cols[f"cumulus {kind}"]
        if first(app, "epoch_s"):
            return app, f"cumulus {kind}"
        return cols[f"cumulus bench {kind}"], f"cumulus bench {kind}"
    (cg, cg_name), (ce, ce_name) = ref("graphs"), ref("eager")
    pairs = (("PyTorch graphs", cols["PyTorch graphs"], cg_name, cg),
             ("fast PyTorch", cols["fast PyTorch"], ce_name, ce),
             ("fast PyTorch", cols["fast PyTorch"], cg_name, cg),
             ("seed PyTorch", cols["seed PyTorch"], cg_name, cg),
             (ce_name, ce, cg_name, cg),
             (cg_name, cg, "cumulus graphs fused", cols["cumulus graphs fused"]),
             ("fast PyTorch", cols["fast PyTorch"], "PyTorch graphs", cols["PyTorch graphs"]))
    rows = []
    for label, key, _ in metrics:
        row = [label]
        for _, num, _, den in pairs:
            # times and memory: numerator / denominator; samples/s the other way round, so that
            # above 1 always means the denominator's side is faster or smaller
            row.append(ratio(val(den, key), val(num, key)) if key == "samples_per_s" else ratio(val(num, key), val(den, key)))
        rows.append(row)
    header = [""] + [f"{a} / {c}" for a, _, c, _ in pairs]
    md.append("\nRatios (above 1: the right-hand side of the '/' is faster or smaller):\n")
    md.append(table(header, rows))
    return "\n".join(md), cols


def app_supports_flag(app_exe, env, flag):
    """Whether the app's --help lists `flag`."""
    try:
        p = subprocess.run([app_exe, "--help"], env=env, capture_output=True, text=True, timeout=60)
    except Exception:
        return False
    return flag in p.stdout + p.stderr


def app_supports_graphs(app_exe, env):
    """Whether the app's --help lists --graphs (CUDA builds with graph support)."""
    return app_supports_flag(app_exe, env, "--graphs")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--data", default=os.path.join(os.path.dirname(ROOT), "shared", "data", "fashion-mnist"))
    p.add_argument("--build", default=None,
                   help="build folder holding bin/ (default: build or build-cpu, whichever has the benchmark and the app)")
    p.add_argument("--threads", type=int, default=os.cpu_count(), help="CPU threads for cumulus (OpenBLAS) and PyTorch")
    p.add_argument("--configs", default="64x1,16x4", help="micro-batch x accumulation steps, comma-separated")
    p.add_argument("--epochs", type=int, default=2, help="epochs per training run (the first is treated as warm-up)")
    p.add_argument("--train-limit", type=int, default=0, help="first N training samples only (0: all 60000)")
    p.add_argument("--test-limit", type=int, default=0)
    p.add_argument("--bench-min-time", type=float, default=0.5, help="--benchmark_min_time of the cumulus benchmarks")
    p.add_argument("--bench-repetitions", type=int, default=3,
                   help=">1: medians over repetitions, randomly interleaved (robust to a busy machine)")
    p.add_argument("--python", default=sys.executable, help="the Python with torch for the PyTorch scripts")
    p.add_argument("--seed-loader", choices=("auto", "torchvision", "idx"), default="auto")
    p.add_argument("--out-dir", default=None, help="default: bench/results/<date>-<device>")
    p.add_argument("--skip-bench", action="store_true")
    p.add_argument("--bench-json", default=None,
                   help="the benchmarks' Google Benchmark JSON from an earlier run: read for the tables, not rerun")
    p.add_argument("--pytorch-variants", default=None,
                   help="comma-separated subset of seed,fast,graphs (default: seed,fast on CPU, all three on CUDA)")
    p.add_argument("--skip-app", action="store_true")
    p.add_argument("--skip-pytorch", action="store_true")
    a = p.parse_args()

    def has(d, exe):
        return os.path.exists(os.path.join(ROOT, d, "bin", exe))
    # default: the build folder holding the benchmark and, preferably, the app too
    build = a.build or max(("build", "build-cpu"), key=lambda d: (has(d, BENCH), has(d, "fashion_mnist"), d == "build"))
    bindir = os.path.join(ROOT, build, "bin") if not os.path.isabs(build) else os.path.join(build, "bin")
    info = machine_info(a.device, bindir)
    out_dir = a.out_dir or os.path.join(ROOT, "bench", "results", f"{info['date'][:10]}-{a.device}")
    os.makedirs(out_dir, exist_ok=True)
    env = dict(os.environ)
    if a.device == "cpu":
        for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            env[var] = str(a.threads)
    info["threads"] = a.threads if a.device == "cpu" else None
    configs = [tuple(int(x) for x in c.lower().split("x")) for c in a.configs.split(",") if c]
    notes, commands = [], []
    limits = (["--train-limit", str(a.train_limit)] if a.train_limit else []) + \
             (["--test-limit", str(a.test_limit)] if a.test_limit else [])

    bench, bench_ctx = {}, {}
    exe = os.path.join(bindir, BENCH)
    if a.bench_json:
        if os.path.exists(a.bench_json):
            bench, bench_ctx = parse_bench(a.bench_json)
            notes.append(f"cumulus benchmarks: read from {a.bench_json} ({len(bench)} results), not rerun")
        else:
            notes.append(f"cumulus benchmarks: {a.bench_json} does not exist")
    elif a.skip_bench:
        notes.append("cumulus benchmarks: skipped (--skip-bench)")
    elif not os.path.exists(exe):
        notes.append(f"cumulus benchmarks: {exe} not built (cmake --build {build} --target {BENCH})")
    else:
        out = os.path.join(out_dir, BENCH + ".json")
        cmd = [exe, f"--benchmark_filter=^{a.device}/", f"--benchmark_min_time={a.bench_min_time}",
               f"--benchmark_out={out}", "--benchmark_out_format=json"]
        if a.bench_repetitions > 1:
            cmd += [f"--benchmark_repetitions={a.bench_repetitions}", "--benchmark_report_aggregates_only=true",
                    "--benchmark_enable_random_interleaving=true"]
        commands.append(" ".join(cmd))
        rc, _ = run(cmd, env, BENCH + ".log", out_dir)
        if os.path.exists(out):
            bench, bench_ctx = parse_bench(out)
        if rc != 0 or not bench:
            notes.append(f"cumulus benchmarks: exit {rc}, {len(bench)} results (see {BENCH}.log)")

    app_exe = os.path.join(bindir, "fashion_mnist")
    have_app = os.path.exists(app_exe) and not a.skip_app
    if not have_app:
        notes.append("cumulus app: " + ("skipped (--skip-app)" if a.skip_app else f"{app_exe} not built: skipped"))
    torch_ok = False
    if a.skip_pytorch:
        notes.append("PyTorch: skipped (--skip-pytorch)")
    else:
        torch_ok = subprocess.run([a.python, "-c", "import torch, numpy"], capture_output=True).returncode == 0
        if not torch_ok:
            notes.append(f"PyTorch: {a.python} cannot import torch and numpy: skipped (pass --python)")

    cuda = a.device == "cuda"
    # On CUDA the app runs twice per configuration, with CUDA graphs and without (--graphs on|off,
    # a flag of CUDA builds only); a build whose --help has no --graphs runs once, as 'eager'.
    app_modes = [("", [])]
    if have_app and cuda:
        if app_supports_graphs(app_exe, env):
            app_modes = [("graphs", ["--graphs", "on"]), ("eager", ["--graphs", "off"])]
            # The app's default kernels are the generic ops until the fused MLP op is measured on a
            # GPU; the fused op with graphs is measured against them.
            if app_supports_flag(app_exe, env, "--kernels"):
                app_modes.append(("graphs_fused", ["--graphs", "on", "--kernels", "fused"]))
        else:
            app_modes = [("eager", [])]
            notes.append("cumulus app: its --help lists no --graphs flag: ran once without it, shown as 'cumulus eager'")
    variants = ("seed", "fast", "graphs") if cuda else ("seed", "fast")
    if a.pytorch_variants:
        variants = tuple(v for v in variants if v in a.pytorch_variants.split(","))

    results = {"machine": info, "bench_context": bench_ctx, "configs": {}}
    sections = []
    for b, n in configs:
        cfg = f"{b}x{n}"
        runs = {}
        if have_app:
            for mode, flags in app_modes:
                tag = f"app_{mode}_{cfg}" if mode else f"app_{cfg}"
                jl = os.path.join(out_dir, f"{tag}.jsonl")
                if os.path.exists(jl):
                    os.remove(jl)  # the app appends
                cmd = [app_exe, "--device", a.device, "--epochs", str(a.epochs), "--batch-size", str(b),
                       "--accum-steps", str(n), "--metrics", jl, "--quiet", "--data", a.data] + flags + limits
                commands.append(" ".join(cmd))
                rc, _ = run(cmd, env, f"{tag}.log", out_dir)
                recs = app_metrics(jl)
                train_n = a.train_limit or 60000
                runs[f"app_{mode}" if mode else "app"] = summary = summarize_app(recs, b, n, train_n)
                if rc != 0 or not summary:
                    notes.append(f"cumulus app{' ' + mode if mode else ''} {cfg}: exit {rc}, {len(recs)} metric lines "
                                 f"(see {tag}.log)")
        if torch_ok:
            for variant in variants:
                script = os.path.join(ROOT, "bench", "pytorch", f"{variant}_pytorch.py")
                outj = os.path.join(out_dir, f"pytorch_{variant}_{cfg}.json")
                cmd = [a.python, script, "--data", a.data, "--device", a.device, "--epochs", str(a.epochs),
                       "--batch-size", str(b), "--accum-steps", str(n), "--out", outj] + limits
                if a.device == "cpu":
                    cmd += ["--threads", str(a.threads)]
                if variant == "seed":
                    cmd += ["--loader", a.seed_loader]
                commands.append(" ".join(cmd))
                rc, _ = run(cmd, env, f"pytorch_{variant}_{cfg}.log", out_dir)
                if rc == 0 and os.path.exists(outj):
                    with open(outj) as f:
                        runs[variant] = json.load(f)
                else:
                    notes.append(f"PyTorch {variant} {cfg}: exit {rc} (see pytorch_{variant}_{cfg}.log)")
        if not (any(runs.values()) or bench):
            continue
        if cuda:
            md, cols = side_by_side_cuda(cfg, b, n, bench, a.device, runs, a.train_limit or 60000)
        else:
            md, cols = side_by_side(cfg, b, n, bench, a.device, runs.get("app"), runs.get("seed"), runs.get("fast"),
                                    a.train_limit or 60000)
        loader = first(runs.get("seed"), "loader")
        sections.append(f"### {cfg}: micro-batch {b} x {n} steps (effective batch {b * n})\n\n{md}"
                        + (f"\n\nseed PyTorch loader: {loader}." if loader else ""))
        results["configs"][cfg] = cols

    info["load_average_end"] = list(os.getloadavg())
    torch_v = next((c.get("machine", {}).get("torch") for cfg in results["configs"].values()
                    for c in cfg.values() if isinstance(c, dict) and c.get("machine")), None)
    head = [f"# cumulus vs PyTorch, {a.device}, {info['date']}", "",
            f"- machine: {info.get('hostname')}, {info.get('cpu_model', '?')}, {info.get('logical_cpus')} logical CPUs, "
            f"{info.get('memory', '?')} RAM" + (f"; GPU: {'; '.join(info['gpus'])}" if info.get("gpus") else ""),
            f"- commit: {info['git_commit']}" + (f" (working tree dirty: {info['git_dirty_files']} files)"
                                                   if info["git_dirty_files"] else ""),
            f"- threads: {a.threads} (OPENBLAS_NUM_THREADS, OMP_NUM_THREADS, torch.set_num_threads)" if a.device == "cpu"
            else "- device: cuda (times from CUDA events for cumulus, torch.cuda.synchronize for PyTorch)",
            f"- PyTorch: {torch_v or 'not run'}; epochs per run: {a.epochs} (first = warm-up)"
            + (f"; train limit {a.train_limit}" if a.train_limit else ""),
            f"- load average: start {info['load_average_start'][0]:.2f}, end {info['load_average_end'][0]:.2f}",
            "", "Ratios are PyTorch / cumulus (for samples/s: cumulus / PyTorch): above 1, cumulus is faster or smaller. "
            "'cumulus bench' per epoch is µs/step x steps per epoch (no data loading, no test pass). Peak memory: "
            "cumulus counts its allocator's peak; PyTorch torch.cuda.max_memory_allocated on CUDA, the process's "
            "peak RSS on CPU (not comparable).", ""]
    if cuda:
        head[-2] = (
            "Columns: 'cumulus graphs' / 'cumulus eager' are the app with `--graphs on` / `--graphs off` and its "
            "default kernels (the generic ops, one per layer), 'cumulus graphs fused' the app with "
            "`--graphs on --kernels fused` (the fused MLP op); 'PyTorch "
            "graphs' is graphs_pytorch.py (micro-batch and optimizer step captured in CUDA graphs), 'fast PyTorch' "
            "fast_pytorch.py (eager, data preloaded on the device), 'seed PyTorch' seed_pytorch.py (the quickstart); "
            "'cumulus bench graphs' / 'eager' are the microbenchmarks `step_of_64_graph/BxN` / `step_of_64/BxN` "
            "(or `micro_batch[_graph]/accumulate/B` when B x N is not 64; per epoch = µs/step x steps per epoch, no data "
            "loading, no test pass). Ratios 'X / Y' are X's time (or memory) over Y's, and Y's samples/s over X's: "
            "above 1, Y is faster or smaller; a cumulus column that did not run is replaced by its microbenchmark "
            "(the header names it). Peak memory: cumulus counts its allocator's peak (graph memory included when it "
            "is the allocator's), PyTorch torch.cuda.max_memory_allocated (graph pools included).")
    body = "\n\n".join(sections) if sections else "(no side-by-side results)"
    md = "\n".join(head) + "\n## Side by side\n\n" + body + "\n\n## cumulus microbenchmarks\n\n" + \
        (bench_tables(bench, a.device) or "(not run)") + "\n\n## Notes\n\n" + \
        ("\n".join(f"- {x}" for x in notes) or "- none") + "\n\n## Commands\n\n```\n" + "\n".join(commands) + "\n```\n"
    with open(os.path.join(out_dir, "summary.md"), "w") as f:
        f.write(md)
    with open(os.path.join(out_dir, "machine.json"), "w") as f:
        json.dump(info, f, indent=2)
    with open(os.path.join(out_dir, "compare.json"), "w") as f:
        json.dump(results, f, indent=2, default=str)
    print(md)
    print(f"written to {os.path.relpath(out_dir, os.getcwd())}/", file=sys.stderr)


if __name__ == "__main__":
    main()
