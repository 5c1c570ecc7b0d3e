# Aggregate perf script stacks: leaf symbol class x the nearest op frame.
import sys, re, collections
text = open(sys.argv[1]).read().split("\n\n")
steps_ms = float(sys.argv[2])  # ms per step * steps, to convert
tot = 0; by = collections.Counter(); byleaf = collections.Counter()
for block in text:
    frames = [l.strip().split(" ", 1)[1] if " " in l.strip() else "?" for l in block.strip().split("\n") if l.strip()]
    if not frames: continue
    tot += 1
    if not any("Loop::run" in f for f in frames):
        by[("<outside loop>", "")] += 1; continue
    leaf = frames[0]
    blas = "openblas" if re.match(r"sgemm_|cblas|blas_|gemm_", leaf) and "cumulus" not in leaf else None
    op = None
    for f in frames:
        m = re.search(r"ops::(?:\(anonymous namespace\)::)?(\w+)::backward|ops::(\w+)\(|Trainer::(\w+)\(|optim::(\w+)", f)
        if m:
            op = next(g for g in m.groups() if g); break
    if op is None:
        for f in frames:
            m = re.search(r"cumulus::((?:ops|nn|train|optim|models)::[\w:]+)", f)
            if m: op = m.group(1); break
    short = re.sub(r"cumulus::|\(anonymous namespace\)::|std::_Function_handler<.*", "", leaf)[:70]
    by[(op, blas or "other")] += 1
    if not blas: byleaf[(short, op)] += 1
print("samples", tot)
for (op, k), n in by.most_common(45): print("%6.1f%%  %-40s %s" % (100*n/tot, op, k))
print("--- non-BLAS leaves")
for (s, op), n in byleaf.most_common(45): print("%6.1f%%  %-70s %s" % (100*n/tot, s, op))
