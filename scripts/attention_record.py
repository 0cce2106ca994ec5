#!/usr/bin/env python3
"""Issue 8's record of one device call as a markdown table: at every point of the FlashAttention
sweep (forward and backward), the default plan's rate, its share of the bf16 GEMM ceiling, the
same rows timed in another way (optional), every kernel's rate by name (the table bench's cuDNN,
bespoke and fa3 columns), PyTorch's SDPA backends and the default over PyTorch's fastest; then the
lowest ratio and the own-kernel bar (fa3, head dim 128, L >= 4096, bf16, non-causal).

usage: attention_record.py ours.jsonl --peers peers.jsonl --table table.jsonl
                           [--short ours_1x10.jsonl] [--forward-bar 650] [--backward-bar 500]

ours.jsonl: `bench_attention attention` (BARACUDA_ATTENTION_ONLY=backward, the default rows carry
no note); --short: the same rows timed otherwise (BARACUDA_ATTN_ROW_ROUNDS / _REPS); --table:
`bench_attention attention_hopper` (its {"table_point": ...} lines); --peers: peers.py."""
import argparse
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from default_vs_fastest import load  # noqa: E402 (the bench JSON lines of some files)

CASE = re.compile(r"^b(\d+)_h(\d+)_l(\d+)_d(\d+)(_causal)?$")
PASSES = (("attention_forward", "forward"), ("attention_backward", "backward"))


def defaults(rows):
    """(op, name) -> (kernel, TFLOP/s) of the default rows (no note) of the bf16 sweep."""
    out = {}
    for r in rows:
        if (r.get("op") in dict(PASSES) and CASE.match(r.get("name", "")) and not r.get("note")
                and r.get("dtype", "bf16") == "bf16" and r.get("tflops")):
            out[(r["op"], r["name"])] = (r.get("kernel", "?"), float(r["tflops"]))
    return out


def gemm_ceiling(rows):
    rates = [float(r["gemm_tflops"]) for r in rows if r.get("ceiling") and r.get("gemm_tflops")]
    return max(rates) if rates else 0.0


def table_columns(rows):
    """(pass, head dim, L, causal) -> the table bench's point (bf16)."""
    out = {}
    for r in rows:
        t = r.get("table_point")
        if t and t.get("dtype", "bf16") == "bf16":
            out[(t["pass"], t["head_dim"], t["len"], bool(t["causal"]))] = t
    return out


def peer_rates(rows):
    out = {}
    for r in rows:
        if r.get("tflops") and r.get("op") in dict(PASSES):
            out.setdefault((r["op"], r["name"]), {})[r.get("peer", "?")] = float(r["tflops"])
    return out


def num(x):
    return "%.1f" % x if x else "-"


def record(ours, peers, table, short=None, forward_bar=650.0, backward_bar=500.0):
    """The report's lines; the last ones say the lowest ratio and the bar's points."""
    dflt, alt = defaults(ours), defaults(short or [])
    cols, prs, ceiling = table_columns(table), peer_rates(peers), gemm_ceiling(ours)
    lines = ["| pass | case | default kernel | TFLOP/s | % GEMM | TFLOP/s (other timing) | cuDNN | "
             "bespoke | fa3 | torch cuDNN | torch FA2 | default / fastest torch |",
             "|" + "---|" * 12]
    ratios, bar = [], []

    def order(key):
        m = CASE.match(key[1])
        return (int(m.group(4)), int(m.group(3)), bool(m.group(5)), key[0] != "attention_forward")

    for op, name in sorted(dflt, key=order):
        m = CASE.match(name)
        d, length, causal = int(m.group(4)), int(m.group(3)), bool(m.group(5))
        pas = dict(PASSES)[op]
        kernel, rate = dflt[(op, name)]
        col = cols.get((pas, d, length, causal), {})
        peer = prs.get((op, name), {})
        fastest = max(peer.values()) if peer else 0.0
        ratio = rate / fastest if fastest else 0.0
        if ratio:
            ratios.append((ratio, pas, name))
        lines.append("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
            pas, name, kernel, num(rate), "%.0f%%" % (100 * rate / ceiling) if ceiling else "-",
            num(alt.get((op, name), (None, 0.0))[1]), num(col.get("cudnn_tflops")),
            num(col.get("bespoke_tflops")), num(col.get("fa3_tflops")),
            num(peer.get("torch_sdpa_cudnn")), num(peer.get("torch_sdpa_flash")),
            "%.3fx" % ratio if ratio else "-"))
        if d == 128 and length >= 4096 and not causal:
            own = [(col["fa3_tflops"], "fa3 column")] if col.get("fa3_tflops") else []
            if kernel.startswith("fa3_"):
                own.append((rate, "default " + kernel))
            if own:
                best = max(own)
                want = forward_bar if pas == "forward" else backward_bar
                bar.append("%s L%d: %.1f (%s), bar %.0f: %s" % (
                    pas, length, best[0], best[1], want, "met" if best[0] >= want else "NOT met"))
    if ratios:
        low = min(ratios)
        lines.append("Lowest default / fastest torch: %.3fx (%s %s); at or above 1.0x: %d of %d."
                     % (low[0], low[1], low[2], sum(r[0] >= 1.0 for r in ratios), len(ratios)))
    lines += ["Own-kernel bar (fa3, d128, bf16, non-causal): " + b for b in bar]
    return lines


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("ours")
    ap.add_argument("--peers", required=True)
    ap.add_argument("--table", required=True)
    ap.add_argument("--short")
    ap.add_argument("--forward-bar", type=float, default=650.0)
    ap.add_argument("--backward-bar", type=float, default=500.0)
    a = ap.parse_args()
    lines = record(load([a.ours]), load([a.peers]), load([a.table]),
                   load([a.short]) if a.short else None, a.forward_bar, a.backward_bar)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
