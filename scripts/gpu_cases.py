#!/usr/bin/env python3
"""The CUDA cases of a test binary, as a GoogleTest filter: what the GPU checkup runs on a GPU.

The CPU cases ran in CI; on a lent GPU (minutes, not hours) only the cases that skip without a GPU
are worth running. Which ones those are is read from the binary's own list (--gtest_list_tests, so
parameter names are the real ones) and from its source, tests/<binary>.cpp:

- a parameterized case whose parameter name says `cuda` (`Devices/Suite.Case/cuda`,
  `Types/PrecisionTest.Case/cuda_bf16`) is one; one whose parameter says `cpu` is not, unless its
  body asks whether the machine has a GPU (cuda_available(), cuda_device_count(): mixing devices);
- any other case is one when its suite or name says CUDA or GPU (`GraphCudaTest.*`,
  `OpCaseTest.CudaMatchesCpu/*`), or when its body or its fixture's class asks for a CUDA device
  (cuda_available(), is_cuda(), Device::cuda, cuda_device_count(), `--device cuda`, cuDNN).

A CPU case that only mentions CUDA is run too (cheap); a CUDA case that mentions none of these is
missed: `--explain` lists what was chosen so that the rehearsal on the CPU shows it.

  gpu_cases.py BINARY [--source tests/NAME.cpp] [--exclude-suite Suite ...] [--explain]
prints the filter (empty, exit 0, when the binary has no CUDA case);
  gpu_cases.py BINARY... --out-dir DIR [--exclude-suite Suite ...]
writes DIR/NAME.filter for each binary that has CUDA cases (the binaries listed in parallel) and
prints one line per binary: how many of its cases were chosen and why.
"""

import argparse
import concurrent.futures
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
CUDA_NAME = re.compile(r"cuda|gpu", re.I)
CUDA_BODY = re.compile(r"cuda_available\s*\(|is_cuda\s*\(|Device::cuda|cuda_device_count\s*\(|--device cuda|"
                       r"cudnn_compiled\s*\(|kCuda\b")
CUDA_MACHINE = re.compile(r"cuda_available\s*\(|cuda_device_count\s*\(")
TEST_HEAD = re.compile(r"^(TEST|TEST_F|TEST_P)\(\s*(\w+)\s*,\s*(\w+)\s*\)", re.M)
CLASS_HEAD = re.compile(r"^(?:class|struct)\s+(\w+)\s*(?:final\s*)?:\s*public\s+([\w:<>, ]+?)\s*\{", re.M)


def top_level_block(text, start):
    """From `start` to the next line that closes a top-level block ("}" or "};" at column 0)."""
    m = re.compile(r"^\};?\s*$", re.M).search(text, start)
    return text[start:m.end() if m else len(text)]


def read_source(path):
    """{(suite, name): body} of every TEST*, and {fixture: (base, body)} of every class."""
    with open(path, errors="replace") as f:
        text = f.read()
    tests = {(m.group(2), m.group(3)): top_level_block(text, m.start()) for m in TEST_HEAD.finditer(text)}
    classes = {m.group(1): (m.group(2), top_level_block(text, m.start())) for m in CLASS_HEAD.finditer(text)}
    return tests, classes


def fixture_wants_cuda(suite, classes, seen=()):
    if suite not in classes or suite in seen:
        return False
    base, body = classes[suite]
    if CUDA_BODY.search(body) and not re.search(r"DeviceTest", base):  # DeviceTest skips only its cuda param
        return True
    return fixture_wants_cuda(re.sub(r"<.*", "", base.split("::")[-1]), classes, seen + (suite,))


def list_cases(binary):
    """[(full suite incl. instance prefix, case name incl. parameter)] from --gtest_list_tests."""
    out = subprocess.run([binary, "--gtest_list_tests"], capture_output=True, text=True, timeout=120).stdout
    cases, suite = [], None
    for line in out.splitlines():
        if not line.strip() or line.startswith("Running main()"):
            continue
        if not line.startswith(" "):
            suite = line.split("#")[0].strip().rstrip(".")
        elif suite:
            cases.append((suite, line.split("#")[0].strip()))
    return cases


def select(binary, source, excluded_suites):
    tests, classes = read_source(source) if source and os.path.exists(source) else ({}, {})
    chosen, why = [], {}
    for full_suite, case in list_cases(binary):
        suite = full_suite.split("/")[-1]                 # Devices/AttentionTest -> AttentionTest
        name, _, param = case.partition("/")              # Foo/cuda -> Foo, cuda
        if suite in excluded_suites:
            continue
        reason = None
        if param and re.search(r"(^|_)cuda", param, re.I):
            reason = "parameter"
        elif param and re.search(r"(^|_)cpu", param, re.I):
            # the CPU instance, unless its body asks the machine for a GPU anyway (mixing devices)
            reason = "body" if CUDA_MACHINE.search(tests.get((suite, name), "")) else None
        elif CUDA_NAME.search(suite) or CUDA_NAME.search(name):
            reason = "name"
        elif CUDA_BODY.search(tests.get((suite, name), "")):
            reason = "body"
        elif fixture_wants_cuda(suite, classes):
            reason = "fixture"
        if reason:
            chosen.append((full_suite, name, param))
            why[reason] = why.get(reason, 0) + 1
    return chosen, why


def as_filter(chosen, all_cases):
    """A compact filter: `Suite.Name/*` when every parameter of Suite.Name was chosen (the op cases),
    `Suite.*/cuda` style patterns are not needed since names are listed."""
    by_test = {}
    for s, n, p in all_cases:
        by_test.setdefault((s, n), []).append(p)
    picked = {}
    for s, n, p in chosen:
        picked.setdefault((s, n), []).append(p)
    parts = []
    for (s, n), ps in picked.items():
        if ps != [""] and len(ps) == len(by_test[(s, n)]) and len(ps) > 1:
            parts.append("%s.%s/*" % (s, n))
        else:
            parts += ["%s.%s%s" % (s, n, "/" + p if p else "") for p in ps]
    return ":".join(parts)


def choose(binary, source, excluded):
    """(filter, explanation) of one binary."""
    name = os.path.basename(binary)
    source = source or os.path.join(os.path.dirname(HERE), "tests", name + ".cpp")
    all_cases = [(s, *c.partition("/")[::2]) for s, c in list_cases(binary)]
    chosen, why = select(binary, source, excluded)
    line = "%s: %d of %d cases are CUDA cases (%s)%s" % (
        name, len(chosen), len(all_cases), ", ".join("%s %d" % kv for kv in sorted(why.items())) or "none",
        "" if os.path.exists(source) else "; no source at " + source)
    return as_filter(chosen, all_cases), line


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("binaries", nargs="+")
    ap.add_argument("--source", help="default: tests/<binary name>.cpp beside this script's folder")
    ap.add_argument("--exclude-suite", action="append", default=[], help="leave this suite out (repeatable)")
    ap.add_argument("--explain", action="store_true", help="counts and reasons on stderr")
    ap.add_argument("--out-dir", help="write NAME.filter files here (several binaries)")
    a = ap.parse_args()
    excluded = set(a.exclude_suite)
    if not a.out_dir:
        if len(a.binaries) != 1:
            sys.exit("gpu_cases.py: several binaries need --out-dir")
        f, line = choose(a.binaries[0], a.source, excluded)
        if a.explain:
            print(line, file=sys.stderr)
        print(f)
        return
    os.makedirs(a.out_dir, exist_ok=True)
    with concurrent.futures.ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:
        jobs = {b: pool.submit(choose, b, None, excluded) for b in a.binaries}
        for b, job in jobs.items():
            try:
                f, line = job.result()
            except (OSError, subprocess.SubprocessError) as e:
                print("%s: not listed (%s): left out" % (os.path.basename(b), e))
                continue
            if f:
                with open(os.path.join(a.out_dir, os.path.basename(b) + ".filter"), "w") as out:
                    out.write(f)
            print(line)


if __name__ == "__main__":
    main()
