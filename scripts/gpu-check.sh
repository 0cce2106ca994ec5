#!/usr/bin/env bash
# One command for the GPU machine: build with all cores (sm_90a), run the whole test suite
# (GPU cases included), run the GPU tests once under compute-sanitizer memcheck, run the
# benchmarks and the peers, and write everything under $OUT (default ./gpu-out).
# Needs third_party/ (googletest, CUTLASS headers) carried from the setup machine.
#   scripts/gpu-check.sh [--quick|--tests|--bench]
#     (none)   build, tests, memcheck, benchmarks, peers, report
#     --quick  build + tests;  --tests  build + tests + memcheck;  --bench  build + benchmarks + peers
#   (the halves let one long check span two calls of a time-limited machine)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}
LOGS=$OUT/logs  # per-binary logs, packed into logs.tgz at the end (the GPU tool returns <= 8 files)
mkdir -p "$LOGS"
summary="$OUT/summary.txt"; : >"$summary"
export PATH=/usr/local/cuda/bin:$PATH
export BARACUDA_COMMIT=${BARACUDA_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
BUILD_DIR=${BUILD_DIR:-build-gpu}
status=0

echo "== device"; nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv | tee "$LOGS/device.txt"
. scripts/cudnn-env.sh >"$LOGS/cudnn.txt"; cat "$LOGS/cudnn.txt"
echo "== build ($BUILD_DIR, commit $BARACUDA_COMMIT)"
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_CUDA_ARCHITECTURES=${ARCHS:-90a} ${CUDNN_ROOT:+-DCUDNN_ROOT=$CUDNN_ROOT} ${CMAKE_ARGS:-} >"$LOGS/build.log" 2>&1 ||
  { tail -40 "$LOGS/build.log"; exit 1; }
# Keep going past a failing target so every family that builds is still tested.
if ! cmake --build "$BUILD_DIR" -j "$(nproc)" -- -k 0 >>"$LOGS/build.log" 2>&1; then
  status=1
  echo "BUILD FAILED for some targets:"; grep -E "^FAILED|error" "$LOGS/build.log" | head -20
fi
echo "built"

mode=${1:-full}
if [ "$mode" != "--bench" ]; then
echo "== tests"
"$BUILD_DIR/apps/baracuda-info" >"$LOGS/info.txt" 2>&1
# Reference data from real implementations installed there (DeepSeek-V4's hyper-connection in
# transformers), for the parity tests that need it.
export BARACUDA_MHC_DEEPSEEK="$LOGS/mhc_deepseek.bin"
OUT="$LOGS" timeout 300 python3 src/ops/mhc/deepseek_check.py >"$LOGS/deepseek_check.jsonl" 2>&1 ||
  echo "deepseek_check.py failed (see logs)"
[ -s "$BARACUDA_MHC_DEEPSEEK" ] || unset BARACUDA_MHC_DEEPSEEK
for t in "$BUILD_DIR"/tests/test_*; do
  name=$(basename "$t")
  timeout 600 "$t" >"$LOGS/$name.log" 2>&1; rc=$?
  line=$(grep -E "^\[  (PASSED|FAILED) +\]|tests? from .* ran" "$LOGS/$name.log" | tr '\n' ' ')
  echo "$name rc=$rc $line" | tee -a "$summary"
  grep -E "^\[  FAILED  \]" "$LOGS/$name.log" | head -20 | tee -a "$summary"
  [ $rc -eq 0 ] || status=1
done
if [ "$mode" = full ] || [ "$mode" = --tests ]; then
  echo "== compute-sanitizer memcheck (CUDA cases)"
  for t in "$BUILD_DIR"/tests/test_*; do
    name=$(basename "$t")
    timeout ${MEMCHECK_TIMEOUT:-90} compute-sanitizer --tool memcheck --error-exitcode 9 "$t" --gtest_filter='*cuda*:*Cuda*:*CUDA*:*gpu*:*Gpu*:*GPU*' \
      >"$LOGS/memcheck-$name.log" 2>&1; rc=$?
    echo "memcheck $name rc=$rc $(grep -E 'ERROR SUMMARY' "$LOGS/memcheck-$name.log" | tail -1)" | tee -a "$summary"
  done
fi
fi
if [ "$mode" = full ] || [ "$mode" = --bench ]; then
  echo "== benchmarks"
  if [ -x "$BUILD_DIR/apps/baracuda-bench" ]; then
    timeout ${BENCH_TIMEOUT:-400} "$BUILD_DIR/apps/baracuda-bench" >"$OUT/bench.jsonl" 2>"$LOGS/bench.err"; echo "bench rc=$?"
  else
    for b in "$BUILD_DIR"/apps/bench_*; do timeout 200 "$b" >>"$OUT/bench.jsonl" 2>>"$LOGS/bench.err"; done
  fi
  echo "== peers"
  timeout ${PEERS_TIMEOUT:-400} python3 scripts/peers.py >"$OUT/peers.jsonl" 2>"$LOGS/peers.err"; echo "peers rc=$?"
  python3 scripts/report.py "$OUT/bench.jsonl" "$OUT/peers.jsonl" | tee "$OUT/report.md"
fi
echo "== summary"; cat "$summary"
tar czf "$OUT/logs.tgz" -C "$OUT" logs && rm -rf "$LOGS"
exit $status
