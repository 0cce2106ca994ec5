#!/usr/bin/env python3
"""make_table.py's --base merge: a chunk run keeps the base's Lq = Lk points (and their
provenance) and appends its chunk points; a sweep run on that output keeps the chunk points and
replaces the sweep's. Run by ctest (make_table)."""
import json
import os
import re
import subprocess
import sys
import tempfile

here = os.path.dirname(os.path.abspath(__file__))
tool, shipped = os.path.join(here, "make_table.py"), os.path.join(here, "selection_table.hpp")


def rows(text):
    return [line.strip() for line in text.splitlines() if line.strip().startswith("{DType::")]


def provenance(text):
    return "".join(re.findall(r'"([^"]*)"', re.search(
        r'kSelectionProvenance =\s*((?:"[^"]*"\s*)+);', text).group(1)))


def generate(points, base, tmp):
    lines = [{"table_point": p} for p in points] + [{"note": "cudnn 9.19.0 sdpa"}]
    src = os.path.join(tmp, "run.jsonl")
    with open(src, "w") as f:
        f.write("\n".join(json.dumps(x) for x in lines) + "\n")
    out = subprocess.run([sys.executable, tool, src, "--base", base, "--commit", "c0ffee", "--date",
                          "2026-11-30"], capture_output=True, text=True, check=True).stdout
    path = os.path.join(tmp, "table.hpp")
    with open(path, "w") as f:
        f.write(out)
    return out, path


def point(d, lk, lq, cudnn, fa3):
    p = {"dtype": "bf16", "pass": "forward", "head_dim": d, "len": lk, "causal": True,
         "cudnn_tflops": cudnn, "bespoke_tflops": 300.0, "fa3_tflops": fa3, "device": "GPU X"}
    if lq:
        p["len_q"] = lq
    return p


def check(cond, what):
    if not cond:
        sys.exit("make_table_test: " + what)


with tempfile.TemporaryDirectory() as tmp:
    base = open(shipped).read()
    out, path = generate([point(128, 4096, 64, 290.0, 250.0), point(128, 4096, 512, 611.0, 629.0)],
                         shipped, tmp)
    sweep_rows = [r for r in rows(base) if r.count(",") == 8]
    check(rows(out)[:len(sweep_rows)] == sweep_rows, "a chunk run must keep the sweep's rows")
    check(rows(out)[len(sweep_rows):] == [
        "{DType::bf16, Pass::forward, 128, 4096, true, 290.0, 300.0, 250.0, 64},",
        "{DType::bf16, Pass::forward, 128, 4096, true, 611.0, 300.0, 629.0, 512},"],
        "a chunk run must append its chunk points: %s" % rows(out)[len(sweep_rows):])
    check(provenance(out).startswith("chunk points: GPU X, cuDNN 9.19.0, 2026-11-30, commit c0ffee")
          and provenance(base) in provenance(out), "both provenances: " + provenance(out))
    again, _ = generate([point(64, 512, 0, 400.0, 300.0)], path, tmp)
    check(rows(again) == rows(out)[len(sweep_rows):] + [
        "{DType::bf16, Pass::forward, 64, 512, true, 400.0, 300.0, 300.0},"],
        "a sweep run must keep the chunk points and replace the sweep's: %s" % rows(again))
print("make_table_test: ok")
