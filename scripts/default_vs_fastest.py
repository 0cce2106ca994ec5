#!/usr/bin/env python3
"""How far each default plan is from the fastest plan we timed on the same case, and from the
fastest peer: the check behind "select() picks the fastest candidate" (issue 8), read from bench
JSON lines instead of by eye.

usage: default_vs_fastest.py bench.jsonl [more.jsonl ...] [--peers peers.jsonl ...] [--over 1.02]

A case is (op, name, dtype). Its default row is the one noted "default plan" (the attention_hopper
benches, or a note that starts so) or carrying no note (the family benches' own rows); every other
row of ours on the case is a candidate (a kernel forced by name, a backend, an A/B variant). Per op
it prints the number of cases, the median and the largest default / fastest ratio, the cases past
--over with the row that beat the default, and, where peers.py timed the case, the fastest peer's
time over the default's (> 1: ours is faster), with the cases where a peer beat the default by more
than --over listed too ("peer" lines)."""
import argparse
import json
import statistics
import sys


def load(paths):
    rows = []
    for path in paths:
        with open(path) as f:
            for line in f:
                line = line.strip()
                if not line.startswith("{"):
                    continue
                try:
                    rows.append(json.loads(line))
                except ValueError:
                    pass
    return rows


def summarize(ours, peers, over):
    """The report's lines: per op, the ratios and the cases past `over`."""
    cases = {}
    for r in ours:
        if not r.get("ms") or "name" not in r:
            continue
        key = (r["op"], r["name"], r.get("dtype", ""))
        note = r.get("note") or ""
        # The decode rows say more after it ("default plan; % of copy bandwidth on KV bytes").
        role = "default" if note == "" or note.startswith("default plan") else "candidate"
        label = note or r.get("kernel", "")
        cases.setdefault(key, []).append((role, r["ms"], r.get("kernel", ""), label))
    best_peer = {}
    for p in peers:
        if not p.get("ms"):
            continue
        # A peer row that names a dtype pairs only with our rows of that dtype (as in report.py).
        key = (p["op"], p["name"], p.get("dtype"))
        if key not in best_peer or p["ms"] < best_peer[key][0]:
            best_peer[key] = (p["ms"], p.get("peer", "?"))
    by_op = {}
    for (op, name, dtype), rows in sorted(cases.items()):
        defaults = [r for r in rows if r[0] == "default"]
        if not defaults:
            continue
        default = min(defaults, key=lambda r: r[1])
        fastest = min(rows, key=lambda r: r[1])
        peer = best_peer.get((op, name, dtype)) or best_peer.get((op, name, None))
        by_op.setdefault(op, []).append(
            (default[1] / fastest[1], name, dtype, default, fastest,
             peer[0] / default[1] if peer else None, peer[1] if peer else None))
    lines = []
    for op, items in by_op.items():
        ratios = [i[0] for i in items]
        line = (f"{op}: {len(items)} cases, default / fastest median {statistics.median(ratios):.3f}"
                f", max {max(ratios):.3f}")
        vs_peer = [i[5] for i in items if i[5] is not None]
        if vs_peer:
            line += (f"; fastest peer / default {min(vs_peer):.3f}-{max(vs_peer):.3f} over "
                     f"{len(vs_peer)} cases")
        lines.append(line)
        for ratio, name, dtype, default, fastest, _, _ in sorted(items, reverse=True):
            if ratio <= over:
                break
            lines.append(f"  {ratio:.3f} {name} {dtype}: default {default[2]} "
                         f"{default[1] * 1e3:.1f} us, fastest {fastest[3]} ({fastest[2]}) "
                         f"{fastest[1] * 1e3:.1f} us")
        behind = [i for i in items if i[5] is not None and i[5] * over < 1.0]
        for _, name, dtype, default, _, vs, peer_name in sorted(behind, key=lambda i: i[5]):
            lines.append(f"  peer {vs:.3f} {name} {dtype}: default {default[2]} "
                         f"{default[1] * 1e3:.1f} us, fastest peer {peer_name} "
                         f"{vs * default[1] * 1e3:.1f} us")
    return lines


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("files", nargs="+")
    ap.add_argument("--peers", nargs="*", default=[])
    ap.add_argument("--over", type=float, default=1.02)
    a = ap.parse_args()
    lines = summarize(load(a.files), load(a.peers), a.over)
    print("\n".join(lines) if lines else "no default-plan rows")
    return 0


if __name__ == "__main__":
    sys.exit(main())
