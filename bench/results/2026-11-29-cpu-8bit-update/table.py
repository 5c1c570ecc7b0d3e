"""The README's table from bench_optim_update's JSON (every repetition kept): per case the median
and minimum ns per parameter, and the ratio of each median to the same optimizer's fp32 median."""

import json
import statistics
import sys
from collections import defaultdict

runs = defaultdict(list)
for b in json.load(open(sys.argv[1]))["benchmarks"]:
    if b.get("run_type") == "iteration":
        runs[b["run_name"].removesuffix("/manual_time")].append(b["ns_per_parameter"])
print("| update | median ns/parameter | min | median / fp32's |")
print("|---|---|---|---|")
order = ["fp32", "8bit_scalar", "8bit_avx2", "8bit_avx512"]
for name, values in sorted(runs.items(), key=lambda r: (r[0].split("/")[2], order.index(r[0].split("/")[3]))):
    optimizer = name.split("/")[2]
    fp32 = statistics.median(runs[f"cpu/update/{optimizer}/fp32"])
    median = statistics.median(values)
    print(f"| {name} | {median:.2f} | {min(values):.2f} | {median / fp32:.2f} |")
