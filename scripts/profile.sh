#!/usr/bin/env bash
# One device call: Nsight Compute profiles of kernels launched by a family's benchmark, one report
# per regex (the first launch whose mangled name matches it), with the details page, the raw
# metrics and the per-SASS-line source counters (stall reasons by instruction) as text, summed by
# scripts/sass_regions.py.
#   scripts/profile.sh mhc 'collapse_cluster16_kernelIfLi16ELb1E' 'logits_mma_kernelIf'
# Builds bench_<family> through scripts/gpu-family.sh (sm_90a) unless $BUILD_DIR has it. env:
# NCU_SET (default full), NCU_TIMEOUT (seconds per report, default 200), BENCH_ENV (extra
# variables for the benchmark, e.g. "BARACUDA_ATTN_SWEEP=d64_l4096"). Clocks are left as found
# (--clock-control none): the card's settings are not ours to change. Pages land in
# $OUT/profile.tgz, reports beside it.
set -uo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 2 ] || { echo "usage: $0 <family> <mangled-name regex>..."; exit 2; }
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
export PATH=/usr/local/cuda/bin:$PATH
B=${BUILD_DIR:-build-family}
family=$1
shift
. scripts/cudnn-env.sh
if [ ! -x "$B/apps/bench_$family" ]; then
  OUT="$OUT/build" BUILD_DIR=$B BUILD_TARGETS=bench STAGES=none bash scripts/gpu-family.sh "$family" \
    >"$OUT/build.log" 2>&1
  rm -rf "$OUT/build"
  [ -x "$B/apps/bench_$family" ] || { tail -30 "$OUT/build.log"; exit 1; }
fi
pages=$(mktemp -d)
i=0
for regex in "$@"; do
  name=profile_$i
  i=$((i + 1))
  # shellcheck disable=SC2086  # BENCH_ENV is a list of assignments
  env ${BENCH_ENV:-} timeout "${NCU_TIMEOUT:-200}" ncu --clock-control none --set "${NCU_SET:-full}" \
    --import-source no --kernel-name-base mangled -k "regex:$regex" -c 1 -f -o "$OUT/$name" \
    "$B/apps/bench_$family" >"$pages/$name.run.log" 2>&1
  echo "$name ($regex): rc=$? $(grep -c '==PROF==' "$pages/$name.run.log") profiler lines"
  ncu --import "$OUT/$name.ncu-rep" --page details >"$pages/$name.details.txt" 2>&1
  ncu --import "$OUT/$name.ncu-rep" --page raw --csv >"$pages/$name.raw.csv" 2>&1
  ncu --import "$OUT/$name.ncu-rep" --page source --csv --print-source sass \
    >"$pages/$name.sass.csv" 2>&1
  grep -E "Duration|Throughput|Registers|Achieved Occupancy|Warp Cycles Per Issued" \
    "$pages/$name.details.txt" | head -20
  # stall samples by opcode and by the code between synchronization points (SASS_PER: the unit
  # to divide executed instructions by, e.g. warps x chunks)
  python3 scripts/sass_regions.py "$pages/$name.sass.csv" --per "${SASS_PER:-1}" \
    >"$pages/$name.regions.txt" 2>&1
  sed -n '/^regions/,/^top/p' "$pages/$name.regions.txt" | head -40
done
tar czf "$OUT/profile.tgz" -C "$pages" .
rm -rf "$pages"
