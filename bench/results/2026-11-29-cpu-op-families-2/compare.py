"""Before / after table of two ops_vs_pytorch.py summaries in this folder (cumulus us / PyTorch us =
ratio, both vector paths; above 1 in bold). summary.md: PyTorch at the matched capability;
--default: summary_pytorch_default.md (PyTorch at its default, AVX-512, for both paths).

    python3 compare.py ops_before_t1 ops_t1 [family,family,...] [--default] [--threads 2]
"""
import argparse
import os
import re

HERE = os.path.dirname(os.path.abspath(__file__))


def load(folder, default, threads):
    rows = {}
    name = "summary_pytorch_default.md" if default else "summary.md"
    for line in open(os.path.join(HERE, folder, name)):
        m = re.match(r"\| (\d+) \| (\w+) \| [^|]+ \| (\S+) \| ([\d.]+) \| ([\d.]+) \| ([\d.]+)x", line)
        if m and m[1] == threads:
            rows[(m[2], m[3])] = (float(m[4]), float(m[5]), float(m[6]))
    return rows


def cell(rows, cap, name):
    v = rows.get((cap, name))
    if not v:
        return "-"
    s = "%.1f / %.1f = %.2fx" % v
    return "**" + s + "**" if v[2] > 1 else s


def main():
    p = argparse.ArgumentParser()
    p.add_argument("before")
    p.add_argument("after")
    p.add_argument("families", nargs="?")
    p.add_argument("--default", action="store_true")
    p.add_argument("--threads", default="1")
    a = p.parse_args()
    before, after = load(a.before, a.default, a.threads), load(a.after, a.default, a.threads)
    names = sorted({k[1] for k in after})
    if a.families:
        names = [n for n in names if n.split("/")[0] in a.families.split(",")]
    print("| family / pass | AVX-512 before | AVX-512 after | AVX2 before | AVX2 after |")
    print("|---|---|---|---|---|")
    for n in names:
        print("| %s | %s | %s | %s | %s |" % (n, cell(before, "avx512", n), cell(after, "avx512", n),
                                             cell(before, "avx2", n), cell(after, "avx2", n)))


if __name__ == "__main__":
    main()
