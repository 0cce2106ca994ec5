#!/usr/bin/env python3
"""default_vs_fastest.py on made-up rows: the default row is the un-noted one or the one whose note
starts with "default plan", the ratio is against the fastest row of the same case (op, name,
dtype), cases past --over are listed with the row that beat the default, the fastest peer's time
is over the default's, and the cases a peer won by more than --over are listed.
Run by ctest (default_vs_fastest)."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from default_vs_fastest import summarize  # noqa: E402


def row(name, ms, note, kernel="k", op="attention_forward", dtype="bf16"):
    return {"op": op, "name": name, "dtype": dtype, "ms": ms, "note": note, "kernel": kernel}


def check(cond, what):
    if not cond:
        sys.exit("default_vs_fastest_test: " + what)


ours = [
    row("a", 1.0, "default plan", "fa3"), row("a", 0.8, "fa3 packed by name", "fa3_packed"),
    row("b", 2.0, "", "cudnn"), row("b", 2.1, "A/B: kernel forced by name", "mma"),
    row("b", 4.0, "default plan", "x", dtype="f16"), row("b", 3.0, "bespoke", "y", dtype="f16"),
    row("c", 5.0, "bespoke"),  # no default row: not a case
    {"op": "attention_forward", "name": "a", "error": "unsupported"},
]
peers = [{"op": "attention_forward", "name": "b", "peer": "torch", "ms": 2.2},
         {"op": "attention_forward", "name": "b", "peer": "slow", "ms": 9.0},
         {"op": "attention_forward", "name": "b", "peer": "f16 only", "ms": 3.6, "dtype": "f16"}]
lines = summarize(ours, peers, 1.02)
check(lines[0].startswith("attention_forward: 3 cases, default / fastest median 1.250, max 1.333"),
      "the op's line: " + lines[0])
# b bf16: the un-typed peer's 2.2 over 2.0; b f16: the f16 peer's 3.6 over 4.0.
check(lines[0].endswith("fastest peer / default 0.900-1.100 over 2 cases"),
      "the peer ratios: " + lines[0])
check(lines[1].startswith("  1.333 b f16: default x 4000.0 us, fastest bespoke (y) 3000.0 us"),
      "the worst case first: " + lines[1])
check(lines[2].startswith("  1.250 a bf16: default fa3") and "fa3 packed by name" in lines[2],
      "then the next: " + lines[2])
# b f16: the peer's 3.6 us beat the default's 4.0 by more than --over; b bf16's peer did not.
check(lines[3] == "  peer 0.900 b f16: default x 4000.0 us, fastest peer f16 only 3600.0 us",
      "the case a peer won: %s" % lines[3:])
check(len(lines) == 4, "b bf16 (the default is the fastest, ahead of its peer) is not listed: %s"
      % lines)
check(len(summarize(ours, peers, 1.5)) == 1, "within --over 1.5 nothing listed: %s"
      % summarize(ours, peers, 1.5))
check(summarize([row("a", 1.0, "bespoke")], [], 1.02) == [], "no default rows: no lines")
# The decode rows' default note says more after "default plan"; an A/B note naming it is not one.
decode = [row("d", 1.0, "default plan; % of copy bandwidth on KV bytes", "dec", "attention_decode"),
          row("d", 1.1, "A/B: kernel forced by name", "w4", "attention_decode")]
check(summarize(decode, [], 1.02) == [
    "attention_decode: 1 cases, default / fastest median 1.000, max 1.000"],
      "a default note with more after it: %s" % summarize(decode, [], 1.02))
print("default_vs_fastest_test: ok")
