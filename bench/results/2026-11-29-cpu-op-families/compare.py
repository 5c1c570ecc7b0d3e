"""Before / after table of two ops_vs_pytorch.py summaries in this folder (cumulus us / PyTorch us =
ratio, one thread, both vector paths; above 1 in bold).

    python3 compare.py ops_before_t1 ops_t1 [family,family,...]
"""
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def load(folder):
    rows = {}
    for line in open(os.path.join(HERE, folder, "summary.md")):
        m = re.match(r"\| 1 \| (\w+) \| (\S+) \| ([\d.]+) \| ([\d.]+) \| ([\d.]+)x", line)
        if m:
            rows[(m[1], m[2])] = (float(m[3]), float(m[4]), float(m[5]))
    return rows


def cell(rows, cap, name):
    v = rows.get((cap, name))
    if not v:
        return "-"
    s = "%.1f / %.1f = %.2fx" % v
    return "**" + s + "**" if v[2] > 1 else s


def main():
    before, after = load(sys.argv[1]), load(sys.argv[2])
    families = sys.argv[3].split(",") if len(sys.argv) > 3 else None
    names = sorted({k[1] for k in after})
    if families:
        names = [n for n in names if n.split("/")[0] in families]
    print("| family / pass | AVX-512 before | AVX-512 after | AVX2 before | AVX2 after |")
    print("|---|---|---|---|---|")
    for n in names:
        print("| %s | %s | %s | %s | %s |" % (n, cell(before, "avx512", n), cell(after, "avx512", n),
                                             cell(before, "avx2", n), cell(after, "avx2", n)))


if __name__ == "__main__":
    main()
