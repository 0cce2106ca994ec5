#!/usr/bin/env python3
"""make_table.py's --base merge: a chunk run keeps the base's Lq = Lk points (and their
provenance) and puts its chunk points where the base's were (last when it had none); a sweep run on
that output keeps the chunk points and replaces the sweep's in place; runs of one kind after another
keep one provenance a kind (no nesting), named in the order of the points; a run of one dtype keeps
every point of the other; several runs of the same points merge into their medians. Written against
the shipped table, whatever kinds it holds. Run by ctest (make_table)."""
import json
import os
import subprocess
import sys
import tempfile

from table_text import point_rows as rows, provenance, row_kind as kind

here = os.path.dirname(os.path.abspath(__file__))
tool, shipped = os.path.join(here, "make_table.py"), os.path.join(here, "selection_table.hpp")


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


def segments(text):
    return provenance(text).split("; ")


def placed(base_rows, k, new):
    """base_rows with its points of kind k replaced by new: where the first of them was, or last
    when it had none."""
    kinds = [kind(r) for r in base_rows]
    if k not in kinds:
        return base_rows + new
    at = kinds.index(k)
    rest = [r for r in base_rows if kind(r) != k]
    return rest[:at] + new + rest[at:]


def in_row_order(text):
    """The provenance names one kind a segment, in the order the kinds' points first come."""
    names = [label(k) for k in dict.fromkeys(kind(r) for r in rows(text))]
    return [seg.split(": ")[0] for seg in segments(text)] == names


def label(k):
    return ("" if k[0] == "bf16" else k[0] + " ") + (
        "chunk points" if k[1] else "short Lq = Lk points" if k[2] else "Lq = Lk points")


with tempfile.TemporaryDirectory() as tmp:
    base = open(shipped).read()
    out, path = generate([point(128, 4096, 64, 290.0, 250.0), point(128, 4096, 512, 611.0, 629.0)],
                         shipped, tmp)
    chunk_rows = ["{DType::bf16, Pass::forward, 128, 4096, true, 290.0, 300.0, 250.0, 64},",
                  "{DType::bf16, Pass::forward, 128, 4096, true, 611.0, 300.0, 629.0, 512},"]
    check(rows(out) == placed(rows(base), ("bf16", True, False), chunk_rows),
          "a chunk run must keep the other kinds' rows and put its own where the base's were")
    base_sweep = [seg for seg in segments(base) if seg.startswith("Lq = Lk points: ")]
    check(any(seg.startswith("chunk points: GPU X, cuDNN 9.19.0, 2026-11-30, commit c0ffee")
              for seg in segments(out))
          and sum(seg.startswith("chunk points: ") for seg in segments(out)) == 1
          and len(base_sweep) == 1 and base_sweep[0] in segments(out) and in_row_order(out),
          "one provenance a kind in the points' order, the sweep's kept: " + provenance(out))
    twice, _ = generate([point(128, 4096, 64, 291.0, 251.0)], path, tmp, "twice.hpp")
    check(sum(seg.startswith("chunk points: ") for seg in segments(twice)) == 1
          and len(segments(twice)) == len(segments(out)) and in_row_order(twice),
          "a second chunk run must not nest the provenances: " + provenance(twice))
    check([kind(r) for r in rows(twice)] == [kind(r) for r in rows(out) if r not in chunk_rows[1:]],
          "a second chunk run must leave every kind where it was")
    f16, _ = generate([point(128, 4096, 0, 500.0, 520.0, "f16")], shipped, tmp, "f16.hpp")
    f16_row = "{DType::f16, Pass::forward, 128, 4096, true, 500.0, 300.0, 520.0},"
    check(rows(f16) == placed(rows(base), ("f16", False, False), [f16_row]),
          "an f16 run must keep every other kind's point and place its own")
    check(any(seg.startswith("f16 Lq = Lk points: GPU X") for seg in segments(f16)) and
          in_row_order(f16) and
          len(segments(f16)) == len({seg.split(": ")[0] for seg in segments(base)} |
                                    {"f16 Lq = Lk points"}),
          "the f16 run's provenance: " + provenance(f16))
    again, _ = generate([point(64, 512, 0, 400.0, 300.0)], path, tmp)
    check(rows(again) == placed(rows(out), ("bf16", False, False), [
        "{DType::bf16, Pass::forward, 64, 512, true, 400.0, 300.0, 300.0},"]),
        "a sweep run must keep the chunk points and replace the sweep's in place")
    # A short run (L 128 / 256) adds its own kind: the whole sweep's points stay, and a later sweep
    # run keeps the short ones.
    # (`path` holds `again` now: generate's default name.)
    short, short_path = generate([point(128, 256, 0, 230.0, 150.0)], path, tmp, "short.hpp")
    check(rows(short) == placed(rows(again), ("bf16", False, True), [
        "{DType::bf16, Pass::forward, 128, 256, true, 230.0, 300.0, 150.0},"]),
          "a short run must keep every other point")
    check(any(seg.startswith("short Lq = Lk points: GPU X") for seg in segments(short)) and
          in_row_order(short) and
          len(segments(short)) == len({seg.split(": ")[0] for seg in segments(again)} |
                                      {"short Lq = Lk points"}),
          "the short run's provenance: " + provenance(short))
    sweep, _ = generate([point(64, 512, 0, 400.0, 300.0)], short_path, tmp, "sweep.hpp")
    check([r for r in rows(sweep) if kind(r)[2]] == [r for r in rows(short) if kind(r)[2]] and
          any(seg.startswith("short Lq = Lk points: GPU X") for seg in segments(sweep)),
          "a sweep run must keep the short points and their provenance: " + provenance(sweep))
    # Measuring the shipped sweep's points again with the same numbers changes nothing but the
    # provenance of that kind: every line of every other kind stays where it was.
    sweep_rows = [r for r in rows(base) if kind(r) == ("bf16", False, False)]
    if sweep_rows:
        pts = []
        for r in sweep_rows:
            f = r.strip("{},").split(", ")
            pts.append({"dtype": "bf16", "pass": f[1].split("::")[1], "head_dim": int(f[2]),
                        "len": int(f[3]), "causal": f[4] == "true", "cudnn_tflops": float(f[5]),
                        "bespoke_tflops": float(f[6]), "fa3_tflops": float(f[7]),
                        "device": "GPU X"})
        same, _ = generate(pts, shipped, tmp, "same.hpp")
        check(rows(same) == rows(base), "the same sweep again must give the same lines")
    # Runs of the same points merged: each column the median of the runs (the mean of two), in
    # the first run's order; a column that did not run (0) in one of them stays 0; the provenance
    # counts the runs.
    runs = [point(128, 256, 0, 230.0, 150.0), point(64, 256, 0, 200.0, 180.0),
            point(128, 256, 0, 240.0, 0.0), point(64, 256, 0, 210.0, 190.0),
            point(128, 256, 0, 250.0, 170.0), point(64, 256, 0, 260.0, 220.0)]
    merged, _ = generate(runs, shipped, tmp, "merged.hpp")
    check([r for r in rows(merged) if kind(r) == ("bf16", False, True)] == [
        "{DType::bf16, Pass::forward, 128, 256, true, 240.0, 300.0, 0.0},",
        "{DType::bf16, Pass::forward, 64, 256, true, 210.0, 300.0, 190.0},"],
        "runs of the same points must merge into their medians")
    check(any(seg.startswith("short Lq = Lk points: GPU X") and "median of 3 runs" in seg
              for seg in segments(merged)), "the merged provenance: " + provenance(merged))
    two, _ = generate(runs[:4], shipped, tmp, "two.hpp")
    check([r for r in rows(two) if kind(r) == ("bf16", False, True)][1] ==
          "{DType::bf16, Pass::forward, 64, 256, true, 205.0, 300.0, 185.0},",
          "two runs merge into their mean")
print("make_table_test: ok")
