#!/usr/bin/env python3
"""Summarize an Nsight Compute source page (ncu --page source --csv --print-source sass): the
stall samples and executed instructions by opcode, the top instructions by samples, and the
kernel cut into regions at its synchronization points (barriers, mbarrier waits, wgmma arrive /
wait), each with its share of the samples and instructions per unit of work.
  scripts/sass_regions.py profile_0.sass.csv [--per N] [--launches N]
--per N divides executed instruction counts by N (e.g. warps x chunks, to read instructions per
warp and chunk); default 1. --launches N (warps per CTA x CTAs) also groups the samples by how
many times each instruction ran per warp: about 1.0 is a CTA's prologue and epilogue, the step
count its main loop, fractions the code a few threads or warps run, so a CTA's fixed costs read
apart from its per-step ones (how the fa3 backward's dK / dV stores showed up, fifty-seventh
session)."""
import argparse
import collections
import csv
import sys

SYNC = ("BAR.SYNC", "BAR.ARV", "WARPGROUP.DEPBAR", "WARPGROUP.ARRIVE", "SYNCS", "EXIT")


def number(text):
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return 0.0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--per", type=float, default=1.0)
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--launches", type=float, default=0.0)
    a = ap.parse_args()
    rows = list(csv.reader(open(a.csv)))
    start = next((i for i, r in enumerate(rows) if len(r) > 3 and r[0] == "Address"), None)
    if start is None:
        sys.exit(f"{a.csv}: no source page header")
    col = {k: j for j, k in enumerate(rows[start])}
    data = [r for r in rows[start + 1:] if len(r) == len(rows[start])]
    samples, executed = col["Warp Stall Sampling (All Samples)"], col["Instructions Executed"]
    total = sum(number(r[samples]) for r in data) or 1.0
    print(f"instructions executed (warp level) {sum(number(r[executed]) for r in data):.0f}, "
          f"stall samples {total:.0f}")

    by_op, by_op_samples = collections.Counter(), collections.Counter()
    for r in data:
        words = r[col["Source"]].split()
        op = words[1] if words and words[0].startswith("@") and len(words) > 1 else (
            words[0] if words else "?")
        by_op[op.split(".")[0]] += number(r[executed])
        by_op_samples[op.split(".")[0]] += number(r[samples])
    print("by opcode (executed / per, samples %):")
    for op, n in by_op.most_common(20):
        print(f"  {op:10s} {n / a.per:12.1f} {100 * by_op_samples[op] / total:6.1f}%")

    print("regions (ending at a synchronization point):")
    acc_s = acc_e = 0.0
    first = data[0][0] if data else ""
    for r in data:
        src = r[col["Source"]]
        acc_s += number(r[samples])
        acc_e += number(r[executed])
        if any(k in src for k in SYNC):
            if acc_s > 0.002 * total or acc_e / a.per > 0.5:
                print(f"  {first[-6:]}..{r[0][-6:]} {100 * acc_s / total:5.1f}% samples "
                      f"{acc_e / a.per:9.1f} instructions  ends {src.strip()[:48]}")
            acc_s = acc_e = 0.0
            first = r[0]

    if a.launches > 0:
        stall_cols = [k for k in col if k.startswith("stall_") and "(Not" not in k]
        groups = collections.defaultdict(lambda: [0.0, 0.0, collections.Counter()])
        for r in data:
            runs = number(r[executed]) / a.launches
            key = "never" if runs == 0 else f"x{runs:.2f}" if runs < 1.5 else f"x{runs:.1f}"
            g = groups[key]
            g[0] += number(r[samples])
            g[1] += number(r[executed])
            for k in stall_cols:
                g[2][k[6:]] += number(r[col[k]])
        print("by runs per warp (samples %, top stalls):")
        for key, (smp, _, stalls) in sorted(groups.items(), key=lambda kv: -kv[1][0])[:12]:
            top = ", ".join(f"{k} {100 * v / total:.1f}%" for k, v in stalls.most_common(3))
            print(f"  {key:8s} {100 * smp / total:5.1f}%  {top}")

    print(f"top {a.top} instructions by samples (address, samples, executed / per, source):")
    for r in sorted(data, key=lambda r: -number(r[samples]))[:a.top]:
        print(f"  {r[0][-6:]} {number(r[samples]):7.0f} {number(r[executed]) / a.per:9.2f}  "
              f"{r[col['Source']].strip()[:70]}")


if __name__ == "__main__":
    main()
