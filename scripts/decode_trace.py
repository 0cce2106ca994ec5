#!/usr/bin/env python3
"""Reads the decode's CTA timelines from a measurement build and prints where a launch's time goes.

A build configured with -DBARACUDA_KERNEL_TRACE=ON stamps %globaltimer in every decode CTA
(src/core/cuda/trace.cuh; the slots are listed in src/ops/attention/decode.cuh's trace_stamp) and,
with BARACUDA_KERNEL_TRACE=<file> set, appends every 25th launch to that file, e.g.

  CMAKE_ARGS=-DBARACUDA_KERNEL_TRACE=ON ATTENTION_HOPPER=0 BUILD_TARGETS=bench STAGES=none \\
    bash scripts/gpu-family.sh attention
  BARACUDA_KERNEL_TRACE=$OUT/trace.txt BARACUDA_ATTENTION_ONLY=decode \\
    build-family/apps/bench_attention attention
  python3 scripts/decode_trace.py $OUT/trace.txt

For each kind of launch (fused, split, w4, single) and shape: medians over the launches (10-90% in
brackets) of each step, in us from the first CTA's start. The ninety-fourth session's table in
docs/perf/attention.md was read this way.
"""
import collections
import gzip
import statistics
import sys


def launches(path):
    opener = gzip.open if path.endswith(".gz") else open
    cur = None
    with opener(path, "rt") as f:
        for line in f:
            w = line.split()
            if not w:
                continue
            if w[0] == "launch":
                if cur:
                    yield cur
                # launch <n> decode <kind> key value key value ...
                fields = dict(zip(w[4::2], (int(x) for x in w[5::2])))
                cur = {"kind": w[3], "shape": fields, "rows": {}}
            elif w[0] == "cta" and cur is not None:
                cur["rows"][int(w[1])] = [int(x) for x in w[2:9]]
    if cur:
        yield cur


def us(ns):
    return ns / 1000.0


def steps(launch):
    """One launch's steps (us), or None where a CTA has no start stamp."""
    sh, rows = launch["shape"], launch["rows"]
    ctas = [rows.get(i) for i in range(sh["ctas"])]
    if any(c is None or c[0] == 0 for c in ctas):
        return None
    t0 = min(c[0] for c in ctas)
    loop_end = [us(c[1] - t0) for c in ctas]
    out = {
        "last CTA started": us(max(c[0] for c in ctas) - t0),
        "first CTA out of its key loop": min(loop_end),
        "median CTA out of its key loop": statistics.median(loop_end),
        "last CTA out of its key loop": max(loop_end),
        "loop end to partials stored (median CTA)": statistics.median(
            us(c[2] - c[1]) for c in ctas),
        "last partials stored": us(max(c[2] for c in ctas) - t0),
    }
    if launch["kind"] == "fused":
        heads, batch = sh["heads_kv"], sh["batch"]
        groups = collections.defaultdict(list)
        for i, c in enumerate(ctas):  # split-major: row = (split * batch + b) * heads_kv + hk
            groups[(i // heads) % batch, i % heads].append(c)
        waits, merges, chains, ends = [], [], [], []
        for g in groups.values():
            last = max(c[2] for c in g)
            mergers = [c for c in g if c[4]]
            for c in g:
                ends.append(c[4] if c[4] else c[3])
            if mergers:
                m = min(mergers, key=lambda c: c[4])
                waits.append(us(m[3] - last))
                merges.append(us(m[4] - m[3]))
                chains.append(us(m[4] - last))
        if chains:
            out["last partials to the merger past its wait"] = statistics.median(waits)
            out["the merge (verdict to its end)"] = statistics.median(merges)
            out["last partials to the merge's end"] = statistics.median(chains)
        out["last CTA out"] = us(max(ends) - t0)
    else:
        out["last CTA out"] = out["last partials stored"]
        # The combine's CTAs follow the decode's; a launch past the buffer's rows lacks some.
        comb = [rows.get(sh["ctas"] + i) for i in range(sh.get("combine", 0))]
        if comb and all(c is not None and c[0] for c in comb):
            out["combine: first CTA past its wait"] = us(min(c[0] for c in comb) - t0)
            out["combine: last CTA done"] = us(max(c[1] for c in comb) - t0)
    return out


def main(paths):
    table = collections.defaultdict(lambda: collections.defaultdict(list))
    for path in paths:
        for launch in launches(path):
            s = steps(launch)
            if s is None:
                continue
            key = (launch["kind"],) + tuple(sorted(launch["shape"].items()))
            for name, v in s.items():
                table[key][name].append(v)
    for key, cols in table.items():
        n = len(next(iter(cols.values())))
        shape = " ".join(f"{k} {v}" for k, v in key[1:])
        print(f"{key[0]}: {shape} ({n} launches)")
        for name, v in cols.items():
            v = sorted(v)
            lo, hi = v[len(v) // 10], v[(9 * len(v)) // 10]
            print(f"  {name:44s} {statistics.median(v):7.2f}  [{lo:7.2f} .. {hi:7.2f}]")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1:])
