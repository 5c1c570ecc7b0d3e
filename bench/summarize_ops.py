#!/usr/bin/env python3
"""The op-versus-memory-floor tables of a bench_ops results folder: per benchmark, the min and
median wall time (Google Benchmark's manual time) over every repetition of the before*/after* runs
(CSV files), the floor from the best copy rate measured in the same runs, and the ratio of after's
min to the floor (where the folder has those runs); then, where the folder has them, the one- against two-thread runs
(after_threads{1,2}_*.csv) and the fused attention's before and after (attention_{before,after}*.csv).

    python3 bench/summarize_ops.py bench/results/2026-11-27-cpu-speed/ops
"""
import csv, glob, os, statistics, sys

if len(sys.argv) != 2:
    sys.exit("usage: summarize_ops.py FOLDER (the bench_ops CSV files)")
HERE = sys.argv[1]
MIB = 1 << 20


def load(prefix):
    times = {}
    for path in sorted(glob.glob(os.path.join(HERE, prefix + "[0-9].csv"))):
        with open(path) as f:
            lines = f.read().splitlines()
        start = next(i for i, l in enumerate(lines) if l.startswith("name,"))
        for row in csv.DictReader(lines[start:]):
            name = row["name"].strip('"')
            if not name.endswith("/manual_time"):
                continue  # the aggregates (_mean, _median, ...)
            scale = {"ns": 1e-6, "us": 1e-3, "ms": 1.0}[row["time_unit"]]
            times.setdefault(name[: -len("/manual_time")], []).append(float(row["real_time"]) * scale)
    return times



def op_label(case):  # "gelu_tanh_2x3x11_f32_bench512" -> "gelu_tanh"
    return case.replace("_2x3x11_f32_bench512", "").replace("_5x70_f32", "").replace("_2x3x33_affine_f32", " (affine)")

before, after = load("before"), load("after")
allruns = {k: before.get(k, []) + after.get(k, []) for k in set(before) | set(after)}


def best_rate(prefix):  # bytes per ms: the fastest repetition of the fastest thread count
    out = []
    for k, v in allruns.items():
        if k.startswith(prefix):
            mib = int(k.split("/")[2].rstrip("MiB"))
            out.append(2 * mib * MIB / min(v))
    return max(out)


def floor_tables():
    """The ops against the copy rate's floor (before*/after* runs with the mem/copy families)."""
    dram, cache = best_rate("mem/copy/256MiB"), best_rate("mem/copy/1MiB")
    print(f"copy rate: from memory (256 MiB) {dram / 1e6:.1f} GB/s, in cache (1 MiB) {cache / 1e6:.1f} GB/s")
    for k in sorted(allruns):
        if k.startswith("mem/"):
            v = allruns[k]
            print(f"  {k}: min {min(v):.3f} ms, median {statistics.median(v):.3f} ms")

    # Bytes each pass must move, in units of one operand (N bytes): forward reads x and writes y; the
    # op's backward reads x (or y) and dy and writes dx; forward_backward adds sum's read of y, its
    # gradient's fill and the leaf gradient's accumulation (a read of dx).
    UNITS = {"forward": 2, "op_forward_backward": 5, "forward_backward": 8}
    rows = []
    for k in sorted(after):
        if not k.startswith("ops/"):
            continue
        _, case, size, pass_, _ = k.split("/")
        a, b = after[k], before.get(k, [])
        dims = [int(d) for d in size.split("x")]
        n_bytes = 4 * dims[0] * dims[1]
        floor_mem = UNITS[pass_] * n_bytes / dram
        floor_cache = UNITS[pass_] * n_bytes / cache
        rows.append((case, size, pass_, min(b) if b else float("nan"), statistics.median(b) if b else float("nan"),
                     min(a), statistics.median(a), floor_mem, floor_cache))
    print("| op | size | pass | before min | before median | after min | after median | speedup (min) |"
          " memory floor | after / memory floor | cache floor | after / cache floor |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for case, size, pass_, bmin, bmed, amin, amed, fm, fc in rows:
        op = op_label(case)
        print(f"| {op} | {size} | {pass_} | {bmin:.3f} | {bmed:.3f} | {amin:.3f} | {amed:.3f} | {bmin / amin:.1f}x |"
              f" {fm:.3f} | {amin / fm:.2f}x | {fc:.3f} | {amin / fc:.2f}x |")


if allruns:
    floor_tables()

# The after library at one thread and at two (OPENBLAS_NUM_THREADS=1 or 2), alternately.
one, two = load("after_threads1_"), load("after_threads2_")
if one and two:
    print("\n| op | pass | 1 thread min | 1 thread median | 2 threads min | 2 threads median | 1 / 2 (min) |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for k in sorted(two):
        _, case, size, pass_, _ = k.split("/")
        op = op_label(case)
        a, b = one[k], two[k]
        print(f"| {op} | {pass_} | {min(a):.3f} | {statistics.median(a):.3f} | {min(b):.3f} |"
              f" {statistics.median(b):.3f} | {min(a) / min(b):.2f}x |")

# Fused attention alone at one thread (OPENBLAS_NUM_THREADS=1), before and after, alternately.
ab, aa = load("attention_before"), load("attention_after")
if ab and aa:
    print("\n| case | pass | before min | before median | after min | after median | speedup (median) |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for k in sorted(aa):
        _, case, size, pass_, _ = k.split("/")
        b, a = ab[k], aa[k]
        print(f"| {case} {size} | {pass_} | {min(b):.3f} | {statistics.median(b):.3f} | {min(a):.3f} |"
              f" {statistics.median(a):.3f} | {statistics.median(b) / statistics.median(a):.1f}x |")
