#!/usr/bin/env bash
# One device call: bench_attention built from several trees and their rows interleaved round by
# round on one machine. Under tensor-heavy load the H100 sits at its 700 W cap and its clock drifts
# within and between calls (docs/perf/attention_hopper.md), so an A/B of builds is only worth its
# numbers inside one call, interleaved. No .git is needed on the device (its copy may be stale):
# make the patches here and leave them untracked in the tree so that they travel. Two forms:
#   git diff <A commit> HEAD > ab.patch                 # B = the work tree, A = B minus the patch
#   BARACUDA_COMMIT=<sha> bash scripts/ab-builds.sh ab.patch
#   git diff main next/x > x.patch; git diff main next/y > y.patch   # with main checked out
#   BARACUDA_COMMIT=<sha> bash scripts/ab-builds.sh --onto x.patch y.patch
#                                                       # A = the work tree, B1, B2 = A plus each
# env: AB_ONLY (BARACUDA_ATTENTION_ONLY of every run: forward | backward; default backward),
#      AB_POINTS (BARACUDA_ATTN_SWEEP points; default "d64_l4096 d128_l8192"), AB_KERNELS
#      (BARACUDA_ATTN_KERNELS: the A/B rows to time), ROUNDS (default 3), AB_DRY=1 (prepare the
#      trees, compile their attention host C++ and stop: checks the patches on a machine without a
#      GPU; run it before every A/B call), AB_FAMILY (the
#      bench_attention family: attention (default) or attention_hopper), AB_RUNS (several kinds of
#      rows in one call: space-separated family:only:point,point[:build,build], e.g.
#      "attention:forward:d128_l512 attention_hopper:backward:d128_l4096:A,B1"; each item's points
#      are timed in the builds it names, every build when it names none; replaces AB_FAMILY,
#      AB_ONLY and AB_POINTS), AB_TEST=<gtest filter>
#      (then build test_attention in the B whose median ratio to A, over the rows timed in A, is
#      highest, and run that filter there: one call measures the patches and tests the winner;
#      its log lands in $OUT/ab_test.log; skipped when no B's median ratio exceeds 1 unless
#      AB_TEST_ANY=1; AB_TEST_BUILD=<name> tests that build instead; AB_TEST_FIRST=1 tests it, or
#      the last B, right after the builds, before any round, so that the rounds cannot leave the
#      tests no time: the sixty-seventh session lost two calls' tests so), AB_DEADLINE=<seconds>
#      (the time the caller's own timeout leaves the script: the tests' time box shrinks to end
#      10 s before it, so a test run cut short still reports the tests that passed or failed, on
#      stdout and in ab_test.log, instead of being killed with the script), AB_ROUNDS_UNTIL=<seconds>
#      (no new round starts once the script has run that long: the medians of the rounds done and
#      AB_TEST still come back; a call that runs out of its 600 s mid-round returns neither. The
#      fortieth session's call 3 lost its tests so: two builds' attention_features rows fit 2 of 3
#      rounds in what the builds left of the call).
# A point may join the hopper bench's lengths with '+' (its l<L>,<L> sweep; e.g.
# "attention_hopper:forward:l128+256+512+1024" runs BARACUDA_ATTN_SWEEP=l128,256,512,1024 in one
# process), so the bench's start (context, ceilings, cuDNN's load) is paid once for them all; the
# sixty-seventh session's one-length processes took ~19 s each.
# Rows land in $OUT/ab.jsonl with "build": "A" / "B" (or "B1", "B2", ...) and "round"; the medians
# and each B's ratio to A are printed last. $OUT gets four files (ab.jsonl, ab_build.log,
# ab_run.err, ab_test.log) and a device call returns at most 8: a command that writes more beside
# them (further benches from build-ab) should bundle them (the forty-fifth session's call 1 lost
# its ninth file).
set -uo pipefail
cd "$(dirname "$0")/.."
onto=0
if [ "${1:-}" = --onto ]; then
  onto=1
  shift
fi
[ $# -ge 1 ] || { echo "usage: $0 <patch> | $0 --onto <patch>..."; exit 2; }
[ $onto = 1 ] || [ $# -eq 1 ] || { echo "one patch without --onto"; exit 2; }
patches=()
for f in "$@"; do
  [ -f "$f" ] || { echo "no such patch: $f"; exit 2; }
  patches+=("$(realpath "$f")")
done
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
root=$PWD
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# A copy of the sources (build outputs and the third-party checkouts stay out: the latter are
# linked) with a patch applied (forward, or reversed with -R).
tree_with() {  # <dir> <patch> [-R]
  mkdir -p "$1"
  tar -C "$root" --exclude='./build*' --exclude='./gpu-out' --exclude='./third_party' \
    --exclude='./.git' -cf - . | tar -C "$1" -xf -
  ln -s "$root/third_party" "$1/third_party"
  (cd "$1" && patch ${3:-} -p1 --quiet <"$2") ||
    { echo "the patch $2 does not apply${3:+ in reverse} on this tree"; exit 1; }
}
# Builds: name -> tree and build directory. The work tree always builds into build-ab.
names=() trees=() dirs=()
if [ $onto = 0 ]; then
  tree_with "$tmp/a" "${patches[0]}" -R
  names=(A B) trees=("$tmp/a" "$root") dirs=("$tmp/build-a" "$root/build-ab")
else
  names=(A) trees=("$root") dirs=("$root/build-ab")
  for i in "${!patches[@]}"; do
    tree_with "$tmp/b$((i + 1))" "${patches[$i]}"
    names+=("B$((i + 1))") trees+=("$tmp/b$((i + 1))") dirs+=("$tmp/build-b$((i + 1))")
  done
fi
if [ "${AB_DRY:-0}" = 1 ]; then
  # The attention families' host C++ too, in every tree (g++ syntax pass, ~10 s a tree): a patch
  # that applies can still leave a tree that does not build (the seventy-first session's A tree
  # kept rules.cpp's use of a constant the reversed header no longer declared, and its call built
  # nothing). The .cu files' host passes are not checked here.
  cxx_failed=0
  for t in "${trees[@]}"; do
    for f in "$t"/src/ops/attention/*.cpp "$t"/src/ops/attention_hopper/*.cpp; do
      # The test files build only for AB_TEST.
      [[ $f != *_test.cpp || -n ${AB_TEST:-} ]] || continue
      g++ -std=c++20 -fsyntax-only -Wall -Wextra -Werror -Wno-unused-parameter \
        -DBARACUDA_WITH_CUDA=1 -DBARACUDA_HAVE_CUDNN_FRONTEND=1 -I"$t/include" -I"$t/src" \
        -isystem /usr/local/cuda/include -isystem "$root/third_party/cudnn_frontend/include" \
        -isystem "$root/third_party/googletest/googletest/include" "$f" ||
        { echo "does not compile: $f"; cxx_failed=1; }
    done
  done
  [ $cxx_failed = 0 ] || exit 1
  echo "dry run: every patch applies and the attention host C++ compiles; trees ${trees[*]}"
  exit 0
fi
# Each built the way every GPU script builds (scripts/gpu-family.sh, bench_attention only), all at
# once: one tree's build is bound by its largest kernel files (~90 s for the attention family on
# 16 cores, most cores idle at the end), so the trees share the machine instead of taking turns
# (four sequential builds took ~400 s of a 600 s call). Jobs per build: 2 nproc / builds, >= 4.
jobs=$((2 * $(nproc) / ${#names[@]}))
[ "$jobs" -ge 4 ] || jobs=4
for i in "${!names[@]}"; do
  (cd "${trees[$i]}" && OUT="$tmp/out-${names[$i]}" BUILD_DIR=${dirs[$i]} BUILD_TARGETS=bench \
    STAGES=none JOBS=$jobs bash scripts/gpu-family.sh attention) >"$tmp/build-${names[$i]}.log" 2>&1 &
done
wait
failed=0
for i in "${!names[@]}"; do
  { echo "== ${names[$i]} (${trees[$i]})"; cat "$tmp/build-${names[$i]}.log"; } >>"$OUT/ab_build.log"
  [ -x "${dirs[$i]}/apps/bench_attention" ] ||
    { echo "BUILD FAILED (${names[$i]})"; tail -30 "$tmp/build-${names[$i]}.log"; failed=1; }
done
[ $failed = 0 ] || exit 1
. scripts/cudnn-env.sh
: >"$OUT/ab.jsonl"
# Runs: family:only:points[:builds] (see the header).
runs=(${AB_RUNS:-"${AB_FAMILY:-attention}:${AB_ONLY:-backward}:$(echo ${AB_POINTS:-d64_l4096 d128_l8192} | tr ' ' ,)"})
bench() {  # <build index> <family> <only> <point>: its rows on stdout
  BARACUDA_ATTENTION_ONLY=$3 BARACUDA_ATTN_SWEEP=${4//+/,} \
    BARACUDA_ATTN_KERNELS=${AB_KERNELS:-} "${dirs[$1]}/apps/bench_attention" "$2" \
    2>>"$OUT/ab_run.err"
}
# One untimed pass first: the first process on a rested card read low (call 3 of the nineteenth
# session: A's first round 226.5 against 250.3, 250.3 after), and that process was always A's.
# test_attention in build <name> with the AB_TEST filter, inside AB_DEADLINE when it is set.
run_tests() {
  local i limit log
  for i in "${!names[@]}"; do
    [ "${names[$i]}" = "$1" ] || continue
    # Built first, so that the time box below is the tests' alone.
    (cd "${trees[$i]}" && OUT="$tmp/out-test-build" BUILD_DIR=${dirs[$i]} BUILD_TARGETS=test \
      STAGES=none bash scripts/gpu-family.sh attention) >"$OUT/ab_test.log" 2>&1
    limit=${TEST_TIMEOUT:-240}
    if [ -n "${AB_DEADLINE:-}" ]; then
      limit=$((AB_DEADLINE - SECONDS - 10 < limit ? AB_DEADLINE - SECONDS - 10 : limit))
      [ "$limit" -ge 30 ] || { echo "AB_DEADLINE=$AB_DEADLINE: no time left for the tests"; return; }
    fi
    echo "== test_attention in $1 (--gtest_filter=$AB_TEST, ${limit} s)"
    (cd "${trees[$i]}" && OUT="$tmp/out-test" BUILD_DIR=${dirs[$i]} BUILD_TARGETS=test \
      STAGES=test TEST_TIMEOUT=$limit TEST_FILTER_attention="$AB_TEST" \
      bash scripts/gpu-family.sh attention) >>"$OUT/ab_test.log" 2>&1
    grep -E "^test_attention rc=" "$OUT/ab_test.log" | head -1
    log=$(tar xzf "$tmp/out-test/logs.tgz" -O logs/test_attention.log 2>/dev/null)
    grep -E "base seed|^\[ +(OK|FAILED) +\]" <<<"$log" | head -60 | tee -a "$OUT/ab_test.log"
    grep -E "Failure" -A3 <<<"$log" | head -40 >>"$OUT/ab_test.log" || true
  done
}
tested=0
if [ -n "${AB_TEST:-}" ] && [ "${AB_TEST_FIRST:-0}" = 1 ]; then
  run_tests "${AB_TEST_BUILD:-${names[-1]}}"
  tested=1
fi
IFS=: read -r fam0 only0 pts0 _ <<<"${runs[0]}"
bench 0 "$fam0" "$only0" "${pts0%%,*}" >/dev/null
for r in $(seq 1 "${ROUNDS:-3}"); do
  if [ -n "${AB_ROUNDS_UNTIL:-}" ] && [ "$SECONDS" -ge "$AB_ROUNDS_UNTIL" ]; then
    echo "AB_ROUNDS_UNTIL=$AB_ROUNDS_UNTIL: stopped after $((r - 1)) rounds ($SECONDS s)"
    break
  fi
  for run in "${runs[@]}"; do
    IFS=: read -r fam only pts want <<<"$run"
    for point in ${pts//,/ }; do
      # The builds take turns going first (round r starts with build r - 1), so whatever drifts
      # within a round does not always favour the same build.
      for k in "${!names[@]}"; do
        i=$(((k + r - 1) % ${#names[@]}))
        [ -z "$want" ] || [[ ",$want," == *",${names[$i]},"* ]] || continue
        bench "$i" "$fam" "$only" "$point" |
          sed -n "s/^{\"family\"/{\"build\": \"${names[$i]}\", \"round\": $r, \"family\"/p" \
            >>"$OUT/ab.jsonl"
      done
    done
  done
done
python3 - "$OUT/ab.jsonl" "$tmp/best" <<'PY'
import collections, json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
t = collections.defaultdict(list)
for r in rows:
    # TFLOP/s where the row counts FLOPs, GB/s where it only counts bytes (decode): higher is
    # better either way, so the ratios read the same.
    v = r.get("tflops") or r.get("gbps")
    if v:
        t[(r["name"], r["op"], r["kernel"], r["build"])].append(v)
builds = sorted({k[3] for k in t}, key=lambda b: (b != "A", len(b), b))
for key in sorted({k[:3] for k in t}):
    a = t.get(key + ("A",), [])
    if not a:
        continue
    line = f"{key[0]:28s} {key[1]:20s} {key[2]:36s} A {statistics.median(a):7.1f}"
    for b in builds[1:]:
        v = t.get(key + (b,), [])
        if v:
            line += f"  {b} {statistics.median(v):7.1f} ({statistics.median(v) / statistics.median(a):.3f})"
    print(line)
# The B whose median ratio to A is highest over the A/B kernels' rows (AB_KERNELS; every row
# timed in A when unset), for AB_TEST.
import os
wanted = [k for k in os.environ.get("AB_KERNELS", "").split(",") if k]
score = {}
for b in builds[1:]:
    ratios = [statistics.median(t[key + (b,)]) / statistics.median(t[key + ("A",)])
              for key in {k[:3] for k in t}
              if (not wanted or key[2] in wanted) and t.get(key + ("A",)) and t.get(key + (b,))]
    if ratios:
        score[b] = statistics.median(ratios)
if score:
    best = max(score, key=score.get)
    print("median ratio to A: " + ", ".join(f"{b} {v:.3f}" for b, v in score.items()) +
          f"; best {best}")
    # A B no better than A has nothing to land: its test would only spend the call's time.
    if score[best] > 1.0 or os.environ.get("AB_TEST_ANY") == "1":
        open(sys.argv[2], "w").write(best)
    else:
        print("no B above A: AB_TEST skipped (AB_TEST_ANY=1 tests the best B anyway)")
PY
# AB_TEST_BUILD=<name>: test that build whatever the ratios say.
[ -z "${AB_TEST_BUILD:-}" ] || echo "$AB_TEST_BUILD" >"$tmp/best"
if [ -n "${AB_TEST:-}" ] && [ $tested = 0 ] && [ -s "$tmp/best" ]; then
  run_tests "$(cat "$tmp/best")"
fi
