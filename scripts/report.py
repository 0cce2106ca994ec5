#!/usr/bin/env python3
"""Joins baracuda-bench JSON lines with peer JSON lines into one Markdown table.
usage: report.py bench.jsonl peers.jsonl
speedup = best peer time / our time (> 1: we are faster)."""
import json
import sys


def load(path):
    rows = []
    try:
        with open(path) as f:
            for line in f:
                line = line.strip()
                if line.startswith("{"):
                    try:
                        rows.append(json.loads(line))
                    except json.JSONDecodeError:
                        pass
    except FileNotFoundError:
        pass
    return rows


ours = load(sys.argv[1])
peers = load(sys.argv[2]) if len(sys.argv) > 2 else []
ceil = next((r for r in ours if r.get("ceiling")), {})
first = next((r for r in ours if "ms" in r), {})
print(f"Device: {ceil.get('device', '?')}; commit {first.get('commit', '?')}; date {first.get('date', '?')}; "
      f"measured ceilings: copy {ceil.get('copy_gbps', 0):.0f} GB/s, bf16 GEMM {ceil.get('gemm_tflops', 0):.0f} TFLOP/s\n")
print("| family | op | case | dtype | kernel | ours ms | GB/s | TFLOP/s | % roofline | peers (ms) | best peer | speedup |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|")
for r in ours:
    if "ms" not in r:
        if "error" in r:
            print(f"| {r.get('family')} | {r.get('op')} | {r.get('name')} | | ERROR: {r['error'][:120]} | | | | | | | |")
        continue
    key = (r["family"], r["op"], r["name"])
    # A peer row that names a dtype pairs only with our row of that dtype.
    ps = [p for p in peers if (p.get("family"), p.get("op"), p.get("name")) == key and p.get("ms")
          and p.get("dtype", r.get("dtype")) == r.get("dtype")]
    ptxt = ", ".join(f"{p['peer']} {p['ms']:.4g}" for p in ps) or "-"
    best = min(ps, key=lambda p: p["ms"]) if ps else None
    speed = f"{best['ms'] / r['ms']:.2f}x" if best and r["ms"] > 0 else "-"
    print(f"| {r['family']} | {r['op']} | {r['name']} | {r.get('dtype', '')} | {r.get('kernel', '')} | "
          f"{r['ms']:.4g} | {r.get('gbps', 0):.0f} | {r.get('tflops', 0):.1f} | {r.get('pct_roofline', 0):.0f}% | "
          f"{ptxt} | {best['peer'] if best else '-'} | {speed} |")
errs = [p for p in peers if "error" in p]
for e in errs:
    print(f"\npeer error ({e.get('family')}): {e['error'][-400:]}")
