#!/usr/bin/env python3
"""Turns bench_attention's {"table_point": ...} lines (stdin or files) into selection_table.hpp.
Usage: make_table.py bench.jsonl --commit <sha> --date <YYYY-MM-DD> [--cudnn <release>]
           [--base selection_table.hpp] > selection_table.hpp

Points with a "len_q" are chunk points (Lq queries against len keys, bench_attention
attention_chunks); the others are the Lq = Lk sweep's, "short" below L 512 (BARACUDA_ATTN_SWEEP=short:
the FlashAttention papers' sweep starts at 512). A point's kind is its dtype and which of the three
it is. With --base, the base header's points of the kinds the input does not measure are kept (a
bf16 chunk run keeps the bf16 sweep's points and every f16 point, a short run the whole sweep's,
and so on), each kind with its own provenance ("<kind>: <run>; <kind>: <run>", a kind named "chunk
points", "Lq = Lk points" or "short Lq = Lk points", prefixed by its dtype unless bf16). A measured
kind the base holds takes the place of the base's points of that kind, a new one goes last, and the
provenance names the kinds in the order their points come: measuring a kind again changes its own
lines only.

Each point carries the TFLOP/s of the three candidates timed back to back in one run: cuDNN, the
attention family's bespoke kernel and our sm_90a kernel (fa3_fwd_sm90a forward, fa3_bwd_sm90a
backward); a missing or 0 fa3_tflops means fa3 did not run there, and select() never picks it at
that point. Files that measure the same points (runs of one kind given together) merge: each
column the median of the runs."""
import argparse
import json
import sys

from table_text import point_rows, provenance as provenance_of

ap = argparse.ArgumentParser()
ap.add_argument("files", nargs="*")
ap.add_argument("--commit", default="unknown")
ap.add_argument("--date", default="unknown")
# The cuDNN release the run loaded: releases differ in their engines, so its column is per release.
# By default it is read from the run's cuDNN rows (their note starts "cudnn <release> ").
ap.add_argument("--cudnn", default=None)
ap.add_argument("--base", default=None)
a = ap.parse_args()
points, device, releases = [], "unknown", set()
for f in a.files or ["-"]:
    for line in (sys.stdin if f == "-" else open(f)):
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            r = json.loads(line)
        except ValueError:
            continue
        if "table_point" in r and r["table_point"]["cudnn_tflops"] > 0:
            points.append(r["table_point"])
            device = r["table_point"].get("device", device)
        note = r.get("note") or ""
        if note.startswith("cudnn ") and len(note.split()) > 1:
            releases.add(note.split()[1])
if a.cudnn is None:
    if len(releases) > 1:
        sys.exit("make_table.py: the run's cuDNN rows name several releases: %s" % sorted(releases))
    a.cudnn = releases.pop() if releases else "unknown"
# Several runs of the same points (files of one kind given together): each column the median of
# the runs' rates, in the first run's order. Two runs of the bf16 sweep in 3 rounds each disagreed
# on 8 of 72 picks at the H200's power cap (sixtieth session), so a table may merge more than one. A
# column 0 in any run (did not run there) stays 0.
COLUMNS = ("cudnn_tflops", "bespoke_tflops", "fa3_tflops")


def point_key(p):
    return (p["dtype"], p["pass"], p["head_dim"], p["len"], p["causal"], p.get("len_q", 0))


def median(values):
    v = sorted(values)
    return v[len(v) // 2] if len(v) % 2 else (v[len(v) // 2 - 1] + v[len(v) // 2]) / 2


runs_of = {}
for p in points:
    runs_of.setdefault(point_key(p), []).append(p)
runs = max([len(v) for v in runs_of.values()] or [1])
merged_points = []
for same in runs_of.values():
    p = dict(same[0])
    for c in COLUMNS:
        values = [q.get(c, 0.0) for q in same]
        p[c] = 0.0 if min(values) <= 0 else median(values)
    merged_points.append(p)
points = merged_points
rows = []
for p in points:
    chunk = ", %d" % p["len_q"] if p.get("len_q", 0) > 0 else ""
    rows.append("    {DType::%s, Pass::%s, %d, %d, %s, %.1f, %.1f, %.1f%s}," % (
        p["dtype"], p["pass"], p["head_dim"], p["len"], "true" if p["causal"] else "false",
        p["cudnn_tflops"], p["bespoke_tflops"], p.get("fa3_tflops", 0.0), chunk))
# BARACUDA_ATTN_ROUNDS: a point's rates are medians over that many interleaved rounds.
rounds = max([p.get("rounds", 1) for p in points] or [1])
provenance = (f"{device}, cuDNN {a.cudnn}, {a.date}, commit {a.commit}, bench_attention (TFLOP/s, "
              "median of CUDA-event timings" +
              (f", median of {rounds} interleaved rounds" if rounds > 1 else "") +
              (f", median of {runs} runs" if runs > 1 else "") + ")")


SHORT_BELOW = 512  # the FlashAttention papers' sweep's shortest L


def kind_of(row):
    """(dtype, chunk point?, short Lq = Lk point?) of a generated row: chunk rows carry a ninth
    field, the Lq; the fifth is L."""
    fields = row.strip("{},").split(", ")
    chunk = len(fields) == 9
    return (fields[0].split("::")[1], chunk, not chunk and int(fields[3]) < SHORT_BELOW)


def label(kind):
    return ("" if kind[0] == "bf16" else kind[0] + " ") + (
        "chunk points" if kind[1] else "short Lq = Lk points" if kind[2] else "Lq = Lk points")


if a.base:
    measured = {kind_of(r.strip()) for r in rows}
    text = open(a.base).read()
    base_rows = ["    " + r for r in point_rows(text)]  # indented as this script writes them
    old = provenance_of(text)
    # The base's provenance per kind: its "<kind>: <run>" segments, or one run for all of them.
    labels = {label((t, c, short)) for t in ("bf16", "f16") for c in (False, True)
              for short in (False, True) if not (c and short)}
    parts = {}
    for seg in old.split("; "):
        lab, sep, run = seg.partition(": ")
        if sep and lab in labels:
            parts[lab] = run
    run_rows = {}
    for r in rows:
        run_rows.setdefault(kind_of(r.strip()), []).append(r)
    merged = []
    for line in base_rows:
        k = kind_of(line.strip())
        if k not in measured:
            merged.append(line)
        elif k in run_rows:  # the base's first point of a measured kind: the run's points go here
            merged += run_rows.pop(k)
    for k in run_rows:  # kinds the base does not hold
        merged += run_rows[k]
    if len(merged) > len(rows):  # some of the base's points stay: a provenance a kind
        kinds = list(dict.fromkeys(kind_of(r.strip()) for r in merged))
        provenance = "; ".join(
            f"{label(k)}: {provenance if k in measured else parts.get(label(k), old)}"
            for k in kinds)
    rows = merged
print(f"""// GENERATED by src/ops/attention_hopper/make_table.py from `bench_attention` output
// ({{"table_point": ...}} lines: cuDNN, the bespoke kernel and fa3_fwd_sm90a / fa3_bwd_sm90a timed
// back to back in the same run).
// Do not edit by hand: re-measure and regenerate.
#pragma once

#include <string_view>

#include "baracuda/ops/attention_hopper.hpp"

namespace baracuda::attention_hopper::detail {{

inline constexpr std::string_view kSelectionProvenance =
    "{provenance}";

// dtype, pass, head dim, L (= Lq = Lk; chunk points: Lk), causal, cuDNN, bespoke, fa3 TFLOP/s
// (0: not run)[, chunk points: Lq]
inline constexpr TablePoint kSelectionPoints[] = {{
{chr(10).join(rows)}
}};
inline constexpr std::span<const TablePoint> kSelectionTable{{kSelectionPoints}};

}}  // namespace baracuda::attention_hopper::detail""")
