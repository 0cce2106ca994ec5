#!/usr/bin/env python3
"""make_table.py's --base merge: a chunk run keeps the base's Lq = Lk points (and their
provenance) and appends its chunk points; a sweep run on that output keeps the chunk points and
replaces the sweep's; runs of one kind after another keep one provenance a kind (no nesting); an
f16 run keeps every bf16 point. Run by ctest (make_table)."""
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


def generate(points, base, tmp, name="table.hpp"):
    lines = [{"table_point": p} for p in points] + [{"note": "cudnn 9.19.0 sdpa"}]
    src = os.path.join(tmp, "run.jsonl")
    with open(src, "w") as f:
        f.write("\n".join(json.dumps(x) for x in lines) + "\n")
    out = subprocess.run([sys.executable, tool, src, "--base", base, "--commit", "c0ffee", "--date",
                          "2026-11-30"], capture_output=True, text=True, check=True).stdout
    path = os.path.join(tmp, name)
    with open(path, "w") as f:
        f.write(out)
    return out, path


def point(d, lk, lq, cudnn, fa3, dtype="bf16"):
    p = {"dtype": dtype, "pass": "forward", "head_dim": d, "len": lk, "causal": True,
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
    base_sweep = [seg for seg in provenance(base).split("; ") if not seg.startswith("chunk points: ")]
    check(provenance(out).startswith("chunk points: GPU X, cuDNN 9.19.0, 2026-11-30, commit c0ffee")
          and provenance(out).count("chunk points: ") == 1
          and provenance(out).count("Lq = Lk points: ") == 1
          and base_sweep[0].split(": ", 1)[-1] in provenance(out),
          "one provenance a kind, the sweep's kept: " + provenance(out))
    twice, _ = generate([point(128, 4096, 64, 291.0, 251.0)], path, tmp, "twice.hpp")
    check(provenance(twice).count("chunk points: ") == 1 and provenance(twice).count("; ") == 1,
          "a second chunk run must not nest the provenances: " + provenance(twice))
    f16, _ = generate([point(128, 4096, 0, 500.0, 520.0, "f16")], shipped, tmp, "f16.hpp")
    check(rows(f16) == rows(base) + ["{DType::f16, Pass::forward, 128, 4096, true, 500.0, 300.0, 520.0},"],
          "an f16 run must keep every bf16 point and add its own: %s" % rows(f16)[-3:])
    check(provenance(f16).startswith("f16 Lq = Lk points: GPU X") and
          provenance(f16).count("; ") == 2, "the f16 run's provenance: " + provenance(f16))
    again, _ = generate([point(64, 512, 0, 400.0, 300.0)], path, tmp)
    check(rows(again) == rows(out)[len(sweep_rows):] + [
        "{DType::bf16, Pass::forward, 64, 512, true, 400.0, 300.0, 300.0},"],
        "a sweep run must keep the chunk points and replace the sweep's: %s" % rows(again))
print("make_table_test: ok")
