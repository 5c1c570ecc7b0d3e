#!/usr/bin/env python3
"""The engine's CUDA compiler launcher: runs the compile it is given, reads what ptxas reports for
each kernel (the build passes -Xptxas=-v), prints a table of registers, shared memory, stack and
spills per kernel and architecture into the build log, and fails the compile when a kernel of a
checked file (CMake passes every kernel file of ours) has a stack frame or spills (the object is
removed, so the next build compiles it again).

Why a stack frame at all fails a kernel: a frame is local memory, off-chip and cached in L1 at
best, and it is almost always an array indexed at run time (or a call that was not inlined) where the
kernel meant registers. The driver also reserves local memory for the largest frame of any kernel a
context loads (frame x the threads a device keeps resident), outside our caching allocator.

usage: cuda_resources.py --checked a.cu,b.cu -- [launcher...] nvcc ARGS...

Reading ptxas's own report costs nothing beyond the compile: no second compile and no tool that
reads objects (cuobjdump is not part of every toolkit install). A cached compile (ccache) replays
the report with the object, so the table and the check hold on cache hits too.
"""
import os
import re
import subprocess
import sys

ENTRY = re.compile(r"Compiling entry function '([^']+)' for '(sm_\d+)'")
FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
USED = re.compile(r"Used (\d+) registers(?:.*?(\d+) bytes smem)?")


def parse(report):
    """[kernel, arch, registers, smem, stack, spill stores, spill loads] per entry function."""
    rows, current = [], None
    for line in report.splitlines():
        m = ENTRY.search(line)
        if m:
            current = [m.group(1), m.group(2), 0, 0, 0, 0, 0]
            rows.append(current)
            continue
        if current is None:
            continue
        m = FRAME.search(line)
        if m:
            current[4:7] = [int(g) for g in m.groups()]
            continue
        m = USED.search(line)
        if m:
            current[2] = int(m.group(1))
            current[3] = int(m.group(2) or 0)
            current = None  # the entry's last line
    return rows


def demangled(names):
    try:
        out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True, check=True).stdout
        return out.splitlines()
    except (OSError, subprocess.CalledProcessError):
        return list(names)


def short(name, width=70):
    """The kernel's name and template arguments, without namespaces, return type or parameters."""
    name = name.replace("cumulus::kernels::", "").replace("(anonymous namespace)::", "").replace("cumulus::", "")
    name = name[5:] if name.startswith("void ") else name
    depth = 0
    for i, ch in enumerate(name):
        depth += ch == "<"
        depth -= ch == ">"
        if ch == "(" and depth == 0:
            name = name[:i]
            break
    return name if len(name) <= width else name[: width - 3] + "..."


def main(argv):
    split = argv.index("--")
    checked = set(argv[argv.index("--checked") + 1].split(",")) if "--checked" in argv[:split] else set()
    command = argv[split + 1 :]
    result = subprocess.run(command, stderr=subprocess.PIPE, text=True)
    report = result.stderr
    # ptxas's info lines become the table below; anything else (warnings, errors) passes through.
    sys.stderr.write("".join(l + "\n" for l in report.splitlines() if not l.startswith("ptxas info")
                             and not FRAME.search(l)))
    if result.returncode != 0:
        return result.returncode
    source = next((a for a in command if a.endswith(".cu")), "?")
    output = command[command.index("-o") + 1] if "-o" in command else None
    rows = parse(report)
    if not rows:
        return 0
    names = demangled([r[0] for r in rows])
    file = os.path.basename(source)
    print(f"kernel resources: {file}{' (checked: a stack frame or spills fail the build)' if file in checked else ''}")
    print(f"  {'kernel':60} {'arch':6} {'regs':>4} {'smem':>6} {'stack':>5} {'spill st':>8} {'spill ld':>8}")
    for name, r in sorted(zip(names, rows), key=lambda p: (p[0], p[1][1])):
        print(f"  {short(name, 60):60} {r[1]:6} {r[2]:4} {r[3]:6} {r[4]:5} {r[5]:8} {r[6]:8}")
    failing = [(n, r) for n, r in zip(names, rows) if r[4] or r[5] or r[6]]
    if file in checked and failing:
        for name, r in failing:
            print(f"error: {file}: {name} on {r[1]}: {r[4]} bytes stack frame, {r[5]} bytes spill stores, {r[6]} bytes "
                  "spill loads (a kernel of ours keeps its state in registers and shared memory)", file=sys.stderr)
        if output and os.path.exists(output):
            os.remove(output)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
