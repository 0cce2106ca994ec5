#!/usr/bin/env python3
"""make_table.py's --base merge: a chunk run keeps the base's Lq = Lk points (and their
provenance) and appends its chunk points; a sweep run on that output keeps the chunk points and
replaces the sweep's; runs of one kind after another keep one provenance a kind (no nesting); a
run of one dtype keeps every point of the other. Written against the shipped table, whatever kinds
it holds. Run by ctest (make_table)."""
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


def kind(row):
    """A row's (dtype, chunk point?, short Lq = Lk point?): the kinds a run replaces one at a
    time."""
    fields = row.strip("{},").split(", ")
    return (fields[0].split("::")[1], len(fields) == 9, len(fields) == 8 and int(fields[3]) < 512)


def segments(text):
    return provenance(text).split("; ")


with tempfile.TemporaryDirectory() as tmp:
    base = open(shipped).read()
    out, path = generate([point(128, 4096, 64, 290.0, 250.0), point(128, 4096, 512, 611.0, 629.0)],
                         shipped, tmp)
    kept = [r for r in rows(base) if kind(r) != ("bf16", True, False)]
    check(rows(out)[:len(kept)] == kept, "a chunk run must keep the other kinds' rows")
    check(rows(out)[len(kept):] == [
        "{DType::bf16, Pass::forward, 128, 4096, true, 290.0, 300.0, 250.0, 64},",
        "{DType::bf16, Pass::forward, 128, 4096, true, 611.0, 300.0, 629.0, 512},"],
        "a chunk run must append its chunk points: %s" % rows(out)[len(kept):])
    base_sweep = [seg for seg in segments(base) if seg.startswith("Lq = Lk points: ")]
    check(segments(out)[0].startswith("chunk points: GPU X, cuDNN 9.19.0, 2026-11-30, commit c0ffee")
          and sum(seg.startswith("chunk points: ") for seg in segments(out)) == 1
          and len(base_sweep) == 1 and base_sweep[0] in segments(out)
          and len(segments(out)) == len({seg.split(": ")[0] for seg in segments(out)}),
          "one provenance a kind, the sweep's kept: " + provenance(out))
    twice, _ = generate([point(128, 4096, 64, 291.0, 251.0)], path, tmp, "twice.hpp")
    check(sum(seg.startswith("chunk points: ") for seg in segments(twice)) == 1
          and len(segments(twice)) == len(segments(out)),
          "a second chunk run must not nest the provenances: " + provenance(twice))
    f16, _ = generate([point(128, 4096, 0, 500.0, 520.0, "f16")], shipped, tmp, "f16.hpp")
    check(rows(f16) == [r for r in rows(base) if kind(r) != ("f16", False, False)] +
          ["{DType::f16, Pass::forward, 128, 4096, true, 500.0, 300.0, 520.0},"],
          "an f16 run must keep every other kind's point and add its own: %s" % rows(f16)[-3:])
    check(segments(f16)[0].startswith("f16 Lq = Lk points: GPU X") and
          len(segments(f16)) == len({seg.split(": ")[0] for seg in segments(base)} |
                                    {"f16 Lq = Lk points"}),
          "the f16 run's provenance: " + provenance(f16))
    again, _ = generate([point(64, 512, 0, 400.0, 300.0)], path, tmp)
    check(rows(again) == [r for r in rows(out) if kind(r) != ("bf16", False, False)] + [
        "{DType::bf16, Pass::forward, 64, 512, true, 400.0, 300.0, 300.0},"],
        "a sweep run must keep the chunk points and replace the sweep's: %s" % rows(again)[-3:])
    # A short run (L 128 / 256) adds its own kind: the whole sweep's points stay, and a later sweep
    # run keeps the short ones.
    # (`path` holds `again` now: generate's default name.)
    short, short_path = generate([point(128, 256, 0, 230.0, 150.0)], path, tmp, "short.hpp")
    check(rows(short) == [r for r in rows(again) if kind(r) != ("bf16", False, True)] + [
        "{DType::bf16, Pass::forward, 128, 256, true, 230.0, 300.0, 150.0},"],
          "a short run must keep every other point: %s" % rows(short)[-3:])
    check(segments(short)[0].startswith("short Lq = Lk points: GPU X") and
          len(segments(short)) == len({seg.split(": ")[0] for seg in segments(again)} |
                                      {"short Lq = Lk points"}),
          "the short run's provenance: " + provenance(short))
    sweep, _ = generate([point(64, 512, 0, 400.0, 300.0)], short_path, tmp, "sweep.hpp")
    check([r for r in rows(sweep) if kind(r)[2]] == [r for r in rows(short) if kind(r)[2]] and
          any(seg.startswith("short Lq = Lk points: GPU X") for seg in segments(sweep)),
          "a sweep run must keep the short points and their provenance: " + provenance(sweep))
print("make_table_test: ok")
