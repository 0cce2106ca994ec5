#!/usr/bin/env bash
# One device call: bench_attention built twice, from the work tree (B) and from the work tree with
# a patch taken back out (A), and their rows interleaved round by round on one machine. Under
# tensor-heavy load the H100 sits at its 700 W cap and its clock drifts within and between calls
# (docs/perf/attention_hopper.md), so an A/B of two builds is only worth its numbers inside one
# call, interleaved. No .git is needed on the device (its copy may be stale): make the patch here,
# with B checked out, and leave it untracked in the tree so that it travels:
#   git diff <A commit> HEAD > ab.patch
#   BARACUDA_COMMIT=<sha> bash scripts/ab-builds.sh ab.patch
# env: AB_ONLY (BARACUDA_ATTENTION_ONLY of both runs: forward | backward; default backward),
#      AB_POINTS (BARACUDA_ATTN_SWEEP points; default "d64_l4096 d128_l8192"), AB_KERNELS
#      (BARACUDA_ATTN_KERNELS: the A/B rows to time), ROUNDS (default 3), AB_DRY=1 (prepare tree
#      A and stop: checks the patch on a machine without a GPU).
# Rows land in $OUT/ab.jsonl with "build": "A" / "B" and "round"; the medians are printed last.
set -uo pipefail
cd "$(dirname "$0")/.."
[ $# -eq 1 ] && [ -f "$1" ] || { echo "usage: $0 <patch from A to the work tree>"; exit 2; }
patch_file=$(realpath "$1")
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
root=$PWD
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# Tree A: the sources copied (build outputs and the third-party checkouts stay out: the latter are
# linked), then the patch reversed.
mkdir -p "$tmp/a"
tar -C "$root" --exclude='./build*' --exclude='./gpu-out' --exclude='./third_party' \
  --exclude='./.git' -cf - . | tar -C "$tmp/a" -xf -
ln -s "$root/third_party" "$tmp/a/third_party"
(cd "$tmp/a" && patch -R -p1 --quiet <"$patch_file") ||
  { echo "the patch does not reverse cleanly on this tree"; exit 1; }

if [ "${AB_DRY:-0}" = 1 ]; then
  echo "dry run: the patch reverses cleanly; tree A prepared in $tmp/a"
  exit 0
fi
# Both built the way every GPU script builds (scripts/gpu-family.sh, bench_attention only).
build() {  # <tree> <build dir>
  (cd "$1" && OUT="$tmp/out" BUILD_DIR=$2 BUILD_TARGETS=bench STAGES=none \
    bash scripts/gpu-family.sh attention) >>"$OUT/ab_build.log" 2>&1
  [ -x "$2/apps/bench_attention" ] || { echo "BUILD FAILED ($2)"; tail -30 "$OUT/ab_build.log"; exit 1; }
}
build "$tmp/a" "$tmp/build-a"
build "$root" "$root/build-ab"
. scripts/cudnn-env.sh
: >"$OUT/ab.jsonl"
for r in $(seq 1 "${ROUNDS:-3}"); do
  for point in ${AB_POINTS:-d64_l4096 d128_l8192}; do
    for side in A B; do
      bench="$root/build-ab/apps/bench_attention"
      [ $side = A ] && bench="$tmp/build-a/apps/bench_attention"
      BARACUDA_ATTENTION_ONLY=${AB_ONLY:-backward} BARACUDA_ATTN_SWEEP=$point \
        BARACUDA_ATTN_KERNELS=${AB_KERNELS:-} "$bench" attention 2>>"$OUT/ab_run.err" |
        sed -n "s/^{\"family\"/{\"build\": \"$side\", \"round\": $r, \"family\"/p" >>"$OUT/ab.jsonl"
    done
  done
done
python3 - "$OUT/ab.jsonl" <<'EOF'
import collections, json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
t = collections.defaultdict(list)
for r in rows:
    if r.get("tflops"):
        t[(r["name"], r["op"], r["kernel"], r["build"])].append(r["tflops"])
for (name, op, kernel, build) in sorted({k[:3] + ("A",) for k in t}):
    a, b = t.get((name, op, kernel, "A"), []), t.get((name, op, kernel, "B"), [])
    if a and b:
        print(f"{name:28s} {op:20s} {kernel:36s} A {statistics.median(a):7.1f}  "
              f"B {statistics.median(b):7.1f}  B/A {statistics.median(b) / statistics.median(a):.3f}")
EOF
