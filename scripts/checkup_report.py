#!/usr/bin/env python3
"""The GPU checkup's lines for its summary (scripts/gpu_checkup.sh): one subcommand per kind of result,
each printing a few lines and never failing the checkup (a missing or cut result is said as such).

  checkup_report.py test-binary DIR NAME EXIT SECONDS    one test binary's CUDA cases
  checkup_report.py tests DIR                            the tests phase as a whole
  checkup_report.py seed METRICS.jsonl SECONDS           the seed run against its targets
  checkup_report.py memory REPORT.json                   a run's peaks and the device memory outside the allocator
  checkup_report.py kernels DEFAULT.jsonl S GENERIC.jsonl S  the default kernels against the generic ones
  checkup_report.py weights A.safetensors B.safetensors  largest difference of two runs' weights
  checkup_report.py bench BENCH.json                     the step microbenchmarks' targets
  checkup_report.py compare COMPARE.json                 the app against PyTorch with CUDA graphs
  checkup_report.py sanitize LOG                         compute-sanitizer's verdict
  checkup_report.py gpt SUMMARY.json                     the GPT against its twin and the CPU
  checkup_report.py attention BENCH.json LOG...          the attention op against PyTorch's SDPA
  checkup_report.py profile NCU.csv                      Nsight Compute's kernel times, summed by kernel
  checkup_report.py kernel-details NCU.csv               Nsight Compute's sections, a line per kernel
"""

import glob
import json
import os
import struct
import sys

SEED_ACCURACY, SEED_LOSS = 0.783, 0.6197  # the seed run's figures (20 epochs of 16 x 4)


def load(path):
    with open(path) as f:
        return json.load(f)


def cases(report):
    """(suite, name, outcome, message) of a GoogleTest JSON report; outcome: passed, failed, skipped."""
    for suite in report.get("testsuites", []):
        for case in suite.get("testsuite", []):
            if case.get("failures"):
                msg = " | ".join(f.get("failure", "").replace("\n", " ")[:300] for f in case["failures"][:3])
                yield suite["name"], case["name"], "failed", msg
            elif case.get("result") == "SKIPPED" or case.get("status") == "NOTRUN":
                yield suite["name"], case["name"], "skipped", ""
            else:
                yield suite["name"], case["name"], "passed", ""


def test_binary(d, name, code, seconds):
    path = os.path.join(d, name + ".json")
    cut = code in ("124", "137")
    if not os.path.exists(path):
        with open(os.path.join(d, name + ".log"), errors="replace") as f:
            log = f.read()
        running = [l[12:].strip() for l in log.splitlines() if l.startswith("[ RUN      ]")]
        done = {l[12:].split(" (")[0].strip() for l in log.splitlines() if l.startswith(("[       OK ]", "[  FAILED  ]",
                                                                                          "[  SKIPPED ]"))}
        open_cases = [c for c in running if c not in done]
        failed = [l[12:].split(" (")[0].strip() for l in log.splitlines() if l.startswith("[  FAILED  ]")]
        print("  %s: exit %s in %s s, no report%s; %d cases started, %d failed%s; its end: %s" % (
            name, code, seconds, " (cut at the deadline)" if cut else "", len(running), len(set(failed)),
            ", running " + open_cases[-1] if open_cases else "", log[-200:].strip().replace("\n", " | ")))
        return
    counts = {"passed": 0, "failed": 0, "skipped": 0}
    failed = []
    for suite, case, outcome, msg in cases(load(path)):
        counts[outcome] += 1
        if outcome == "failed":
            failed.append("    FAILED %s.%s: %s" % (suite, case, msg))
    print("  %s: exit %s in %s s, %d passed, %d failed, %d skipped" % (name, code, seconds, counts["passed"],
                                                                    counts["failed"], counts["skipped"]))
    for line in failed[:10]:
        print(line)
    if len(failed) > 10:
        print("    ... and %d more failures (the archive has the report)" % (len(failed) - 10))


def tests(d):
    totals = {"passed": 0, "failed": 0, "skipped": 0}
    ran, missing = 0, []
    for exit_file in sorted(glob.glob(os.path.join(d, "*.exit"))):
        name = os.path.basename(exit_file)[:-5]
        ran += 1
        path = os.path.join(d, name + ".json")
        if not os.path.exists(path):
            missing.append(name)
            continue
        for suite, case, outcome, _ in cases(load(path)):
            totals[outcome] += 1
    print("tests: %d binaries run, %d passed, %d failed, %d skipped%s" % (
        ran, totals["passed"], totals["failed"], totals["skipped"],
        "; no report from " + ", ".join(missing) if missing else ""))
    print("  target: zero failing CUDA cases: %s" % ("met" if totals["failed"] == 0 and not missing and ran else
                                                      "NOT met"))


def seed(path, seconds):
    try:
        with open(path) as f:
            lines = [json.loads(l) for l in f if l.strip()]
    except OSError as e:
        print("  no metrics (%s)" % e)
        return
    epochs = [l for l in lines if "epoch" in l]
    if not epochs:
        print("  no epoch in %s" % path)
        return
    last = epochs[-1]
    acc, loss = last.get("test_accuracy"), last.get("test_loss")
    line = "  epoch %d: test accuracy %.2f%%, test loss %.4f, kernels %s, precision %s, %.2f s process start to exit" % (
        last["epoch"], 100 * acc, loss, last.get("kernels", "?"), last.get("precision", "?"), float(seconds))
    epoch_s = sorted(e.get("epoch_seconds", 0) for e in epochs[1:]) or [epochs[0].get("epoch_seconds", 0)]
    line += ", median epoch %.3f s" % epoch_s[len(epoch_s) // 2]
    print(line)
    if last["epoch"] == 20:
        print("  targets: 78.3%% / 0.6197: %s; at most 3 s start to exit: %s" % (
            "met" if abs(acc - SEED_ACCURACY) < 0.0005 and abs(loss - SEED_LOSS) < 0.00005 else "NOT met",
            "met" if float(seconds) <= 3.0 else "NOT met"))


def memory(path):
    """The run's peak and reserved peak, and what the device held outside the caching allocator
    (Note [Memory outside the allocator] in engine/core/cuda_context.cpp)."""
    try:
        s = load(path)["summary"]
    except (OSError, KeyError, ValueError) as e:
        print("  no memory report (%s)" % e)
        return
    mib = lambda key: s.get(key, 0) / 2**20
    print("  memory: peak %.1f MiB, reserved peak %.1f MiB; outside the allocator %.1f MiB (context, libraries), "
          "of which stack frames' local memory about %.1f MiB" % (mib("peak_bytes"), mib("reserved_peak_bytes"),
                                                                  mib("outside_allocator_bytes"),
                                                                  mib("context_local_memory_bytes")))


def kernels(default_path, default_s, generic_path, generic_s):
    """The default kernels' run against the generic one's: which is faster, and what the default is."""
    def read(path):
        with open(path) as f:
            epochs = [json.loads(l) for l in f if l.strip()]
        epochs = [e for e in epochs if "epoch" in e]
        steady = sorted(e.get("epoch_seconds", 0) for e in (epochs[1:] or epochs))
        return epochs[-1].get("kernels", "?"), steady[len(steady) // 2]
    try:
        (dk, de), (gk, ge) = read(default_path), read(generic_path)
    except (OSError, ValueError, IndexError) as e:
        print("  kernels: not compared (%s)" % e)
        return
    if dk == "fused":
        verdict = ("the fused default is the faster: met" if de < ge else
                   "the fused default is slower than the generic path: NOT met (the default should be generic)")
    else:
        verdict = "the default resolves to the %s path here (fused against generic: the speed phase)" % dk
    print("  default kernels (%s): median epoch %.3f s, %s s start to exit; generic: %.3f s, %s s: %s" % (
        dk, de, default_s, ge, generic_s, verdict))


def tensors(path):  # safetensors: an 8-byte header length, the JSON header, then the raw data
    import numpy as np
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    return {k: np.frombuffer(data[v["data_offsets"][0]:v["data_offsets"][1]], dtype=np.float32)
            for k, v in header.items() if k != "__metadata__" and v["dtype"] == "F32"}


def weights(a, b):
    import numpy as np
    try:
        x, y = tensors(a), tensors(b)
    except (OSError, ValueError, ImportError) as e:
        print("  weights: not compared (%s)" % e)
        return
    diff = max(float(np.max(np.abs(x[k] - y[k]))) for k in x)
    print("  weights of %s against %s: %d tensors, largest difference %.3g" % (
        os.path.basename(a), os.path.basename(b), len(x), diff))


def bench_entries(path):
    data = load(path)
    out = {}
    for b in data.get("benchmarks", []):
        if b.get("run_type") == "aggregate" or b.get("error_occurred"):
            continue
        name = b.get("run_name", b["name"]).replace("/process_time", "").replace("/manual_time", "")
        scale = {"ns": 1e-3, "us": 1.0, "ms": 1e3, "s": 1e6}[b.get("time_unit", "ns")]
        out[name] = dict(b, us=b["real_time"] * scale)
    return out


def bench(path):
    try:
        e = bench_entries(path)
    except (OSError, ValueError) as err:
        print("  benchmarks: no results (%s)" % err)
        return
    dev = "cuda" if any(k.startswith("cuda/") for k in e) else "cpu"
    mb = e.get(dev + "/micro_batch_graph/accumulate/16") or e.get(dev + "/micro_batch/accumulate/16")
    if mb:
        print("  captured micro-batch of 16 (%s): %.1f us (target at most 15 us: %s)" % (
            mb["name"].split("/")[1], mb["us"], "met" if mb["us"] <= 15 else "NOT met"))
    for fam in ("step_of_64_graph", "step_of_64_graph_fused", "step_of_64", "step_of_64_fused"):
        a, b = e.get("%s/%s/16x4" % (dev, fam)), e.get("%s/%s/64x1" % (dev, fam))
        if a and b:
            r = a.get("us_per_step", a["us"]) / b.get("us_per_step", b["us"])
            print("  %s: 16x4 step %.1f us, 64x1 step %.1f us, ratio %.2f (target at most 1.3: %s)" % (
                fam, a.get("us_per_step", a["us"]), b.get("us_per_step", b["us"]), r, "met" if r <= 1.3 else "NOT met"))
            if fam.startswith("step_of_64_graph"):
                continue
            break


def attention(bench_path, *pytorch_logs):
    """bench_ops' sdpa_qkv_causal_gpt2s_bench_* cases against bench/pytorch/sdpa_op.py's JSON (the
    last line of each log), per dtype and pass, as cumulus's time over PyTorch's."""
    try:
        e = bench_entries(bench_path)
    except (OSError, ValueError) as err:
        print("  attention op: no cumulus results (%s)" % err)
        return
    for log in pytorch_logs:
        try:
            with open(log) as f:
                pt = json.loads(f.read().strip().splitlines()[-1])
        except (OSError, ValueError, IndexError) as err:
            print("  attention op: no PyTorch result in %s (%s)" % (os.path.basename(log), err))
            continue
        dt = pt["dtype"]
        ours = {k.split("/")[3]: v["us"] / 1e3 for k, v in e.items() if k.startswith("ops/sdpa_qkv_causal_gpt2s_bench_%s/" % dt)}
        for pass_ in ("forward", "forward_backward"):
            if pass_ not in ours:
                print("  attention op %s %s: no cumulus result" % (dt, pass_))
                continue
            r = ours[pass_] / pt[pass_ + "_ms"]
            target = " (target within 1.2x: %s)" % ("met" if r <= 1.2 else "NOT met") if dt == "bf16" and pass_ == "forward_backward" else ""
            print("  attention op %s [8, 12, 1024, 64] causal from qkv, %s: cumulus %.3f ms, PyTorch SDPA %.3f ms, "
                  "cumulus / PyTorch %.2fx%s" % (dt, pass_, ours[pass_], pt[pass_ + "_ms"], r, target))


def profile(path, top=15):
    """Nsight Compute's --csv output with the metric gpu__time_duration.sum: each kernel's time,
    summed by name (its template arguments and parameters cut), largest first."""
    import csv
    unit_us = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3, "second": 1e6}
    with open(path) as f:
        lines = [l for l in f if l.startswith('"')]  # the table; ncu's own messages start with ==
    total, by_name, n = 0.0, {}, 0
    for row in csv.DictReader(lines):
        if row.get("Metric Name") != "gpu__time_duration.sum":
            continue
        us = float(row["Metric Value"].replace(",", "")) * unit_us.get(row.get("Metric Unit", "nsecond"), 1e-3)
        name = row["Kernel Name"].replace("(anonymous namespace)", "{anon}")
        name = name.split("(")[0].split("<")[0].replace("void ", "", 1).strip()[:70]
        t, c = by_name.get(name, (0.0, 0))
        by_name[name] = (t + us, c + 1)
        total, n = total + us, n + 1
    if not n:
        print("  profile: no kernel times in %s" % os.path.basename(path))
        return
    print("  profile %s: %d kernels, %.2f ms of kernel time; the largest by name:" % (
        os.path.basename(path), n, total / 1e3))
    for name, (t, c) in sorted(by_name.items(), key=lambda kv: -kv[1][0])[:top]:
        print("    %8.3f ms %5.1f%% %5d x %8.1f us  %s" % (t / 1e3, 100 * t / total, c, t / c, name))


def kernel_details(path, keep=("Duration", "Throughput", "Registers", "Occupancy", "Ipc", "Issue Slots",
                                 "Warp Cycles Per Issued", "Bank", "Wavefronts", "Shared")):
    """Nsight Compute's --csv --page details output: per profiled kernel, the metrics whose names
    hold one of `keep` (the whole table stays in the archive)."""
    import csv
    with open(path) as f:
        lines = [l for l in f if l.startswith('"')]
    kernels = {}
    for row in csv.DictReader(lines):
        name, value = row.get("Metric Name") or "", row.get("Metric Value") or ""
        if not name or not value or not any(k in name for k in keep):
            continue
        kernel = row["Kernel Name"].replace("(anonymous namespace)", "{anon}").split("(")[0].replace("void ", "", 1)
        entry = kernels.setdefault(row.get("ID", kernel), [kernel.strip()[:90], []])
        entry[1].append("%s %s%s" % (name, value, " " + row["Metric Unit"] if row.get("Metric Unit") else ""))
    if not kernels:
        print("  kernel details: none in %s" % os.path.basename(path))
        return
    for kernel, metrics in kernels.values():
        print("  %s: %s" % (kernel, "; ".join(metrics)))


def compare(path):
    try:
        configs = load(path).get("configs", {})
    except (OSError, ValueError) as e:
        print("  compare: no results (%s)" % e)
        return
    for cfg, cols in configs.items():
        def epoch(name):
            c = cols.get(name) or {}
            return c.get("epoch_s")
        ours = epoch("cumulus graphs") or epoch("cumulus eager") or epoch("cumulus app")
        theirs = epoch("PyTorch graphs")
        fast = epoch("fast PyTorch")
        fused = epoch("cumulus graphs fused")
        parts = ["%s: cumulus %s s/epoch" % (cfg, "%.3f" % ours if ours else "n/a")]
        if fused:
            parts.append("fused kernels %.3f s" % fused)
        if fast:
            parts.append("PyTorch eager %.3f s" % fast)
        if theirs:
            parts.append("PyTorch + CUDA graphs %.3f s" % theirs)
        print("  " + ", ".join(parts))
        if ours and theirs:
            r = theirs / ours
            print("  target at least 4x PyTorch + CUDA graphs per epoch: %.2fx, %s" % (r, "met" if r >= 4 else "NOT met"))


def sanitize(path):
    try:
        with open(path, errors="replace") as f:
            text = f.read()
    except OSError as e:
        print("  no log (%s)" % e)
        return
    verdicts = [l.strip("= \n") for l in text.splitlines() if "ERROR SUMMARY" in l or "RACECHECK SUMMARY" in l]
    if verdicts:
        print("  " + "; ".join(verdicts[-2:]))
    else:
        print("  no sanitizer summary in the log; its end: %s" % text[-120:].strip().replace("\n", " | "))


def gpt(path):
    try:
        r = load(path)
    except (OSError, ValueError) as e:
        print("  no summary (%s)" % e)
        return
    for name, c in r.get("configs", {}).items():
        ratio = c.get("ratio_cumulus_over_pytorch")
        tps = c.get("tokens_per_second", {})
        # ratio is cumulus time / PyTorch time: PyTorch's tokens/s over ours; the targets ask ours over theirs
        line = "  %s %s: cumulus %.0f tokens/s, PyTorch eager %.0f (cumulus / eager %.2fx)" % (
            name, r.get("precision"), tps.get("cumulus", 0), tps.get("pytorch", 0), 1 / ratio if ratio else 0)
        if "pytorch_compile" in tps:
            line += ", compiled %.0f (cumulus / compiled %.2fx)" % (tps["pytorch_compile"],
                                                                    1 / c["ratio_cumulus_over_pytorch_compile"])
        print(line + "; max step-loss diff against eager %.1e" % c.get("max_step_loss_diff", float("nan")))
        for side in (k for k in tps if k.startswith("cumulus_")):
            print("  %s %s: %s (%s) %.0f tokens/s (%s / eager %.2fx); max step-loss diff against eager %.1e" % (
                name, r.get("precision"), side, ",".join("%s=%s" % kv for kv in c.get("variant_env", {}).items()),
                tps[side], side, 1 / c["ratio_%s_over_pytorch" % side], c["max_step_loss_diff_%s" % side]))
        for who, why in c.get("failed", {}).items():
            print("  %s: failed: %s" % (who, why.strip().splitlines()[-1][:200] if why.strip() else "?"))
        ref = c.get("cpu_reference")
        if ref:
            if ref.get("error"):
                print("  against the CPU: failed: %s" % ref["error"].strip().splitlines()[-1][:200])
            else:
                if ref["precision"] == "fp32":
                    verdict = " (fp32 target 1e-5: %s)" % ("met" if (ref["max_loss_diff"] or 0) <= 1e-5 else "NOT met")
                elif "bf16_tolerance" in ref:  # Note [bf16 loss tolerance] in bench/gpt_compare.py
                    verdict = " (bf16 tolerance, the CPU's bf16 against its fp32, %.2e: %s)" % (
                        ref["bf16_tolerance"], "met" if ref["within_bf16_tolerance"] else "NOT met")
                else:
                    verdict = ""
                print("  against cumulus on the CPU (same weights, %s): largest step-loss difference %.2e over %d "
                      "steps%s" % (ref["precision"], ref["max_loss_diff"] or 0, ref["steps"], verdict))


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    cmd, args = sys.argv[1], sys.argv[2:]
    handlers = {"test-binary": test_binary, "tests": tests, "seed": seed, "memory": memory, "kernels": kernels,
                "weights": weights, "bench": bench, "compare": compare, "sanitize": sanitize, "gpt": gpt,
                "attention": attention, "profile": profile, "kernel-details": kernel_details}
    if cmd not in handlers:
        sys.exit("checkup_report.py: unknown report '%s'\n%s" % (cmd, __doc__))
    try:
        handlers[cmd](*args)
    except Exception as e:  # a summary line must never stop the checkup
        print("  (%s report failed: %s: %s)" % (cmd, type(e).__name__, e))


if __name__ == "__main__":
    main()
