#!/usr/bin/env python3
"""attention-table.sh's jobs, run against a stand-in bench (BENCH=, so nothing is built and no GPU
is needed): each (dtype, kind) job runs RUNS processes on one GPU, the jobs split into contiguous
blocks, one queue a GPU, the queues side by side; the runs merge into one header that replaces the
measured kinds and keeps the shipped table's others, each measured kind's provenance naming its own
runs; a failed run fails the script and writes no header; an unknown kind is refused. Run by ctest
(attention_table)."""
import os
import subprocess
import sys
import tarfile
import tempfile

here = os.path.dirname(os.path.abspath(__file__))
root = os.path.dirname(here)
script = os.path.join(here, "attention-table.sh")
tools = os.path.join(root, "src", "ops", "attention_hopper")
shipped = os.path.join(tools, "selection_table.hpp")
sys.path.insert(0, tools)
from table_text import point_rows as rows, provenance, row_kind  # noqa: E402

# The stand-in: logs its GPU, dtype, sweep and start / end times, then prints two table points
# per pass; the n-th run of a (dtype, kind) reports cuDNN at 300 + 10 n so that merged medians
# can be checked. FAIL_DTYPE makes that dtype's runs fail.
FAKE = r"""#!/usr/bin/env bash
kind=sweep; [ "$1" = attention_chunks ] && kind=chunks
[ "${BARACUDA_ATTN_SWEEP:-}" = short ] && kind=short
dt=$BARACUDA_ATTN_DTYPE
count="$LOGDIR/count_${dt}_$kind"; n=$(( $(cat "$count" 2>/dev/null || echo 0) + 1 )); echo $n > "$count"
echo "start $CUDA_VISIBLE_DEVICES $dt $kind $(date +%s.%N)" >> "$LOGDIR/log"
sleep 1
[ "${FAIL_DTYPE:-}" = "$dt" ] && exit 3
case $kind in sweep) lens="512 1024";; short) lens="128 256";; chunks) lens="4096";; esac
for L in $lens; do for pass in forward backward; do
  q=""; [ $kind = chunks ] && q=', "len_q": 2048'
  echo "{\"table_point\": {\"dtype\": \"$dt\", \"pass\": \"$pass\", \"head_dim\": 64, \"len\": $L, \"causal\": false, \"cudnn_tflops\": $((300 + 10 * n)).0, \"bespoke_tflops\": 100.0, \"fa3_tflops\": 400.0, \"device\": \"stand-in\", \"rounds\": 3$q}}"
done; done
echo '{"kernel": "cudnn_sdpa", "note": "cudnn 9.19.0 stand-in"}'
echo "end $CUDA_VISIBLE_DEVICES $dt $kind $(date +%s.%N)" >> "$LOGDIR/log"
"""


def kind_of(row):
    """row_kind named as the script's TABLE kinds: (dtype, "sweep" | "short" | "chunks")."""
    dtype, chunk, short = row_kind(row)
    return (dtype, "chunks" if chunk else "short" if short else "sweep")


def run(tmp, name, **env):
    logdir = os.path.join(tmp, name)
    os.makedirs(logdir)
    e = dict(os.environ, BENCH=os.path.join(tmp, "bench_attention"), OUT=os.path.join(logdir, "out"),
             LOGDIR=logdir, BARACUDA_COMMIT="c0ffee")
    e.pop("BARACUDA_ATTN_DTYPE", None)
    e.update(env)
    r = subprocess.run(["bash", script], env=e, capture_output=True, text=True)
    log = []
    if os.path.exists(os.path.join(logdir, "log")):
        log = [line.split() for line in open(os.path.join(logdir, "log"))]
    header = os.path.join(logdir, "out", "selection_table.hpp")
    return r, log, (open(header).read() if os.path.exists(header) else None)


failures = []


def check(cond, what):
    if not cond:
        failures.append(what)


base_rows = rows(open(shipped).read())
with tempfile.TemporaryDirectory() as tmp:
    fake = os.path.join(tmp, "bench_attention")
    with open(fake, "w") as f:
        f.write(FAKE)
    os.chmod(fake, 0o755)

    # Two GPUs, both dtypes, two kinds: GPU 3 takes bf16's jobs, GPU 5 f16's, side by side.
    r, log, text = run(tmp, "two", CUDA_VISIBLE_DEVICES="3,5", DTYPES="bf16 f16",
                       TABLE="sweep short")
    check(r.returncode == 0, f"two GPUs: exit {r.returncode}: {r.stdout}{r.stderr}")
    starts = [x for x in log if x[0] == "start"]
    check(len(starts) == 8, f"two GPUs: {len(starts)} bench runs, expected 8 (2 kinds x 2 dtypes x 2)")
    by_gpu = {g: {(x[2], x[3]) for x in starts if x[1] == g} for g in ("3", "5")}
    check(by_gpu["3"] == {("bf16", "sweep"), ("bf16", "short")}, f"GPU 3 ran {by_gpu['3']}")
    check(by_gpu["5"] == {("f16", "sweep"), ("f16", "short")}, f"GPU 5 ran {by_gpu['5']}")
    first_end = min(float(x[4]) for x in log if x[0] == "end")
    check(sum(float(x[4]) < first_end for x in starts) == 2,
          "two GPUs: the queues did not run side by side")
    if text:
        got = rows(text)
        measured = {("bf16", "sweep"), ("bf16", "short"), ("f16", "sweep"), ("f16", "short")}
        kept = [x for x in base_rows if kind_of(x) not in measured]
        check([x for x in got if kind_of(x) not in measured] == kept,
              "two GPUs: the shipped chunk points were not kept as they were")
        new = [x for x in got if kind_of(x) in measured]
        check(len(new) == 16, f"two GPUs: {len(new)} measured points, expected 16")
        # Runs 1 and 2 report cuDNN 310 and 320: the merged point is their median, 315.
        check(all(", 315.0, 100.0, 400.0}" in x for x in new), "two GPUs: runs not merged: " + new[0])
        check("commit c0ffee" in provenance(text) and "median of 2 runs" in provenance(text),
              "two GPUs: provenance lacks the commit or the runs")
    else:
        failures.append("two GPUs: no header written")

    # The runs go back packed (the GPU machine returns at most 8 files): one table_runs.tgz
    # holding each run's output, beside the header.
    out = os.path.join(tmp, "two", "out")
    left = sorted(os.listdir(out)) if os.path.isdir(out) else []
    check(left == ["selection_table.hpp", "table_runs.tgz"], f"two GPUs: $OUT holds {left}")
    if "table_runs.tgz" in left:
        with tarfile.open(os.path.join(out, "table_runs.tgz")) as tgz:
            packed = sorted(tgz.getnames())
        check(packed == sorted(f"table_{d}_{k}_run{r}.jsonl" for d in ("bf16", "f16")
                               for k in ("sweep", "short") for r in (1, 2)),
              f"two GPUs: table_runs.tgz holds {packed}")

    # One GPU (the caller's CUDA_VISIBLE_DEVICES), one dtype from BARACUDA_ATTN_DTYPE: every job
    # in turn, chunks once by default.
    r, log, text = run(tmp, "one", CUDA_VISIBLE_DEVICES="7", BARACUDA_ATTN_DTYPE="f16",
                       TABLE="chunks short")
    check(r.returncode == 0, f"one GPU: exit {r.returncode}: {r.stdout}{r.stderr}")
    starts = [x for x in log if x[0] == "start"]
    check([(x[1], x[2], x[3]) for x in starts] ==
          [("7", "f16", "chunks"), ("7", "f16", "short"), ("7", "f16", "short")],
          f"one GPU: ran {[(x[1], x[2], x[3]) for x in starts]}")
    ends = [float(x[4]) for x in log if x[0] == "end"]
    check(all(float(s[4]) >= e for s, e in zip(starts[1:], ends)), "one GPU: runs overlapped")
    if text:
        got = rows(text)
        check(sum(kind_of(x) == ("f16", "chunks") for x in got) == 2 and
              sum(kind_of(x) == ("f16", "short") for x in got) == 4,
              "one GPU: the f16 chunk / short points are not the run's")
        check([x for x in got if kind_of(x)[0] == "bf16"] ==
              [x for x in base_rows if kind_of(x)[0] == "bf16"], "one GPU: bf16 points changed")
        # Each kind's provenance names its own runs: the chunk job ran once, the short one twice.
        segs = dict(seg.partition(": ")[::2] for seg in provenance(text).split("; "))
        check("commit c0ffee" in segs.get("f16 chunk points", "") and
              "median of 2 runs" not in segs.get("f16 chunk points", ""),
              "one GPU: the chunk points' provenance: " + segs.get("f16 chunk points", ""))
        check("commit c0ffee" in segs.get("f16 short Lq = Lk points", "") and
              "median of 2 runs" in segs.get("f16 short Lq = Lk points", ""),
              "one GPU: the short points' provenance: " + segs.get("f16 short Lq = Lk points", ""))
    else:
        failures.append("one GPU: no header written")

    # A failed run fails the script (after the other queue is done) and writes no header.
    r, log, text = run(tmp, "fail", CUDA_VISIBLE_DEVICES="0,1", DTYPES="bf16 f16",
                       FAIL_DTYPE="f16")
    check(r.returncode != 0 and "a bench run failed" in r.stdout,
          f"failed run: exit {r.returncode}, {r.stdout.strip()!r}")
    check(text is None, "failed run: a header was written")
    check(sum(x[0] == "end" and x[2] == "bf16" for x in log) == 2,
          "failed run: the other GPU's queue did not finish")

    # An unknown kind is refused before anything runs.
    r, log, text = run(tmp, "kind", CUDA_VISIBLE_DEVICES="0", TABLE="sweep shrot")
    check(r.returncode == 2 and "unknown kind shrot" in r.stdout and not log,
          f"unknown kind: exit {r.returncode}, {r.stdout.strip()!r}, {len(log)} runs")

    # TABLE_TESTS=1: the new header goes to TABLE_DEST and the tests run once on it; their exit
    # status is the script's. The stand-in test binary records its filter and the header it saw.
    tests = os.path.join(tmp, "test_attention")
    with open(tests, "w") as f:
        f.write('#!/usr/bin/env bash\necho "$1" > "$TESTLOG"; cp "$TABLE_DEST" "$TESTLOG.hpp"\n'
                'echo "[  FAILED  ] 1 test, listed below:"; exit "${TEST_EXIT:-0}"\n')
    os.chmod(tests, 0o755)
    for want in (0, 1):
        dest, testlog = os.path.join(tmp, f"dest{want}.hpp"), os.path.join(tmp, f"tests{want}.log")
        r, log, text = run(tmp, f"tests{want}", CUDA_VISIBLE_DEVICES="0", TABLE="short",
                           TABLE_TESTS="1", TEST_BIN=tests, TABLE_DEST=dest, TESTLOG=testlog,
                           TEST_EXIT=str(want))
        check(r.returncode == want, f"table tests: exit {r.returncode}, expected {want}: {r.stdout}")
        check(os.path.exists(testlog) and "SelectionFollowsTheMeasuredTable" in open(testlog).read(),
              "table tests: the selection filter was not run")
        check(text is not None and os.path.exists(testlog + ".hpp") and
              open(testlog + ".hpp").read() == text, "table tests: they did not see the new header")
        check("[  FAILED  ]" in r.stdout and f"exit {want}" in r.stdout,
              f"table tests: their result was not printed: {r.stdout!r}")
        out = os.path.join(tmp, f"tests{want}", "out")
        left = sorted(os.listdir(out)) if os.path.isdir(out) else []
        check(left == ["selection_table.hpp", "table_runs.tgz", "table_tests.log"],
              f"table tests: $OUT holds {left}")

for f in failures:
    print("FAIL:", f)
print("attention_table_test:", "FAILED" if failures else "passed", f"({len(failures)} failures)")
sys.exit(1 if failures else 0)
