#!/usr/bin/env bash
# One device call for some op families (scripts/gpu-check.sh does all of them): build only their
# targets with all cores for sm_90a, run their test binaries (GPU cases included), their
# benchmarks and peers, then compute-sanitizer memcheck on a filter. Every stage is time-boxed so
# the call ends inside the device's 10-minute limit with its logs under $OUT and a table last.
#   scripts/gpu-family.sh write_slice mhc
# env: STAGES (default "test bench peers memcheck"; "none" builds only: an empty STAGES reads as
#      the default), TEST_FILTER_<family>, MEMCHECK_FILTER_<family>
#      (gtest filters), TEST_TIMEOUT / BENCH_TIMEOUT / PEERS_TIMEOUT / MEMCHECK_TIMEOUT (seconds,
#      per family), CMAKE_ARGS (extra configure arguments), BUILD_TARGETS (kinds of target per
#      family, default "test bench"; "bench" builds bench_<family> only), BUILD_DIR, JOBS (build
#      jobs, default nproc), ATTENTION_HOPPER=0 (see below).
#      test_attention (family and Hopper backends, 65 tests) takes ~7 minutes on an H100: give it a
#      call of its own with TEST_TIMEOUT=480, or split it with TEST_FILTER_attention.
#      BARACUDA_COMMIT: the commit to stamp on the rows; pass it from the local checkout (the
#      device's copy of the tree may carry an older .git, so its HEAD can name the wrong commit).
set -uo pipefail
cd "$(dirname "$0")/.."
[ $# -gt 0 ] || { echo "usage: $0 <family>..."; exit 2; }
OUT=${OUT:-$PWD/gpu-out}
L=$OUT/logs  # per-stage logs, packed into logs.tgz at the end (the device returns <= 8 files)
mkdir -p "$L"
export PATH=/usr/local/cuda/bin:$PATH
export BARACUDA_COMMIT=${BARACUDA_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
B=${BUILD_DIR:-build-family}
STAGES=${STAGES:-test bench peers memcheck}
# attention_hopper builds into the attention family's targets (its CMakeLists extends them): name
# attention for both; naming attention_hopper too would configure its directory twice.
families=()
for f in "$@"; do
  [ "$f" = attention_hopper ] && f=attention
  [[ " ${families[*]} " == *" $f "* ]] || families+=("$f")
done
t0=$(date +%s)
stage() { echo "== $1 ($(($(date +%s) - t0)) s)"; }
has() { [[ " $STAGES " == *" $1 "* ]]; }

. scripts/cudnn-env.sh
dirs=$(IFS=';'; echo "${families[*]}")
# ATTENTION_HOPPER=0 leaves the sm_90a attention kernels out (a family-kernel A/B builds in half
# the time without them).
[[ " ${families[*]} " == *" attention "* ]] && [ "${ATTENTION_HOPPER:-1}" != 0 ] &&
  dirs="$dirs;attention_hopper"

stage "configure (${families[*]}, commit $BARACUDA_COMMIT)"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
cmake -S . -B "$B" -G Ninja -DCMAKE_CUDA_ARCHITECTURES=${ARCHS:-90a} "-DBARACUDA_FAMILY_DIRS=$dirs" \
  ${CUDNN_ROOT:+-DCUDNN_ROOT=$CUDNN_ROOT} ${CMAKE_ARGS:-} >"$L/build.log" 2>&1 ||
  { tail -30 "$L/build.log"; exit 1; }
# Which optional libraries the build found: without the frontend's headers (carry
# third_party/cudnn_frontend/include) the attention benches have no cuDNN column.
grep -h "baracuda: CUDA=" "$L/build.log" | tail -1
targets=()
for f in "${families[@]}"; do
  for kind in ${BUILD_TARGETS:-test bench}; do targets+=("${kind}_$f"); done
done
stage "build ${targets[*]}"
cmake --build "$B" -j "${JOBS:-$(nproc)}" --target "${targets[@]}" -- -k 0 >>"$L/build.log" 2>&1 ||
  { echo "BUILD FAILED:"; grep -E "error|FAILED" "$L/build.log" | head -30; }

summary="$OUT/summary.txt"
: >"$summary"
for f in "${families[@]}"; do
  filter_var="TEST_FILTER_$f"
  if has test && [ -x "$B/tests/test_$f" ]; then
    stage "test_$f"
    timeout "${TEST_TIMEOUT:-240}" "$B/tests/test_$f" --gtest_filter="${!filter_var:-*}" \
      >"$L/test_$f.log" 2>&1
    rc=$?
    echo "test_$f rc=$rc $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$L/test_$f.log" | tr '\n' ' ')" |
      tee -a "$summary"
    grep -E "^\[  FAILED  \]" "$L/test_$f.log" | head -20 | tee -a "$summary"
    grep -B2 -A12 "Failure" "$L/test_$f.log" | head -80
  fi
  if has bench && [ -x "$B/apps/bench_$f" ]; then
    stage "bench_$f"
    timeout "${BENCH_TIMEOUT:-200}" "$B/apps/bench_$f" >>"$OUT/bench.jsonl" 2>"$L/bench_$f.err"
    echo "bench_$f rc=$?" | tee -a "$summary"
  fi
  if has peers && [ -f "src/ops/$f/peers.py" ]; then
    stage "peers $f"
    PYTHONUNBUFFERED=1 timeout "${PEERS_TIMEOUT:-200}" python3 "src/ops/$f/peers.py" \
      >>"$OUT/peers.jsonl" 2>"$L/peers_$f.err"
    echo "peers $f rc=$?" | tee -a "$summary"
  fi
done
if has memcheck; then
  for f in "${families[@]}"; do
    filter_var="MEMCHECK_FILTER_$f"
    [ -x "$B/tests/test_$f" ] || continue
    stage "memcheck test_$f"
    timeout "${MEMCHECK_TIMEOUT:-90}" compute-sanitizer --tool memcheck --error-exitcode 9 \
      "$B/tests/test_$f" --gtest_filter="${!filter_var:-*cuda*}" >"$L/memcheck_$f.log" 2>&1
    echo "memcheck test_$f rc=$? $(grep -E 'ERROR SUMMARY' "$L/memcheck_$f.log" | tail -1)" |
      tee -a "$summary"
  done
fi
stage report
python3 scripts/report.py "$OUT/bench.jsonl" "$OUT/peers.jsonl" >"$OUT/report.md" 2>&1
# Each default plan against the fastest plan timed beside it (and the fastest peer).
if [ -s "$OUT/bench.jsonl" ]; then
  peers=()
  [ -s "$OUT/peers.jsonl" ] && peers=(--peers "$OUT/peers.jsonl")
  python3 scripts/default_vs_fastest.py "$OUT/bench.jsonl" "${peers[@]}" >>"$summary" 2>&1
fi
echo "== summary"
cat "$summary"
cut -c1-220 "$OUT/report.md"
tar czf "$OUT/logs.tgz" -C "$OUT" logs && rm -rf "$L"
