#!/usr/bin/env bash
# One GPU-machine call that measures the attention selection table and regenerates it: builds the
# attention family (scripts/gpu-family.sh, no stages), runs `bench_attention attention_hopper`
# (cuDNN, the bespoke kernels and fa3 at every point of the sweep, on the cuDNN PyTorch loads) and
# turns its table points into $OUT/selection_table.hpp (copy it over
# src/ops/attention_hopper/selection_table.hpp, then clang-format it); the runs' rows and the build
# logs come back packed in $OUT/table_runs.tgz.
#   BARACUDA_COMMIT=<sha> bash scripts/attention-table.sh
# TABLE=chunks measures the chunk points only (bench_attention attention_chunks: chunked prefill,
# Lq < Lk) and keeps the shipped table's Lq = Lk points (make_table.py --base); TABLE=short the
# short Lq = Lk points only (L 128 / 256, BARACUDA_ATTN_SWEEP=short), keeping the others.
# RUNS=<n> runs the bench n times and merges them (default 2, chunks 1).
# BARACUDA_ATTN_DTYPE=f16 measures f16 points (either kind), kept beside the shipped bf16 ones: an
# f16 problem ranks by f16 points only, and (outside fa3_packs) cuDNN first where the table has
# none.
# TABLE_TESTS=1: then builds test_attention with the new table in the tree's place (copied over
# TABLE_DEST, default the shipped header: on the GPU machine that is its copy of the tree) and runs
# the tests that read the table (TABLE_TEST_FILTER), so that one call measures the table and tests
# it as built; the script's status is the tests' ($OUT/table_tests.log; the shipped-picks check
# fails, naming them, where picks moved). TEST_BIN=<test_attention> runs a binary built before.
# Several kinds in one call: TABLE and DTYPES take lists (TABLE="sweep short" DTYPES="bf16 f16").
# Each (dtype, kind) is a job of RUNS processes; the jobs split into one queue a GPU (GPUS, default
# every GPU nvidia-smi lists), the queues side by side, each pinned to its GPU. A dtype's points are
# compared on one GPU (its jobs are next to each other in the split), so a machine of two GPUs
# measures both dtypes in the time of one.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
# BENCH=<bench_attention> uses a binary built before and skips the build.
if [ -n "${BENCH:-}" ]; then
  bench=$BENCH
else
  # bench_attention alone (BUILD_TARGETS=bench): test_attention, which the table does not run,
  # took another 23-27 s of 16 cores beside it (sixty-seventh session).
  # Its logs and (empty) report in a folder of their own, packed with the runs below.
  OUT="$OUT/table_logs" BUILD_TARGETS=${BUILD_TARGETS:-bench} STAGES=none \
    bash scripts/gpu-family.sh attention >"$OUT/table_build.log" 2>&1 || true
  bench="${BUILD_DIR:-build-family}/apps/bench_attention"
fi
[ -x "$bench" ] || { echo "no bench_attention at $bench: see $OUT/table_build.log"; exit 1; }
. scripts/cudnn-env.sh
# Lq = Lk points: each the median of 3 rounds of the columns in alternating order, so that the
# clock's fall under the power cap as the run heats does not favour the column timed first.
export BARACUDA_ATTN_ROUNDS=${BARACUDA_ATTN_ROUNDS:-3}
kinds=(${TABLE:-sweep})
dtypes=(${DTYPES:-${BARACUDA_ATTN_DTYPE:-bf16}})
jobs=()
for dt in "${dtypes[@]}"; do
  for k in "${kinds[@]}"; do
    case $k in sweep | short | chunks) jobs+=("$dt:$k") ;; *) echo "TABLE: unknown kind $k"; exit 2 ;; esac
  done
done
# The GPUs: CUDA_VISIBLE_DEVICES' list where the caller set one, else every GPU nvidia-smi lists;
# GPUS=<n> takes the first n of them.
if [ -n "${CUDA_VISIBLE_DEVICES:-}" ]; then
  ids=(${CUDA_VISIBLE_DEVICES//,/ })
else
  ids=($(nvidia-smi --query-gpu=index --format=csv,noheader 2>/dev/null || true))
fi
[ "${#ids[@]}" -ge 1 ] || ids=(0)
gpus=${GPUS:-${#ids[@]}}
[ "$gpus" -le "${#ids[@]}" ] || gpus=${#ids[@]}
[ "$gpus" -le "${#jobs[@]}" ] || gpus=${#jobs[@]}
# One job: RUNS processes (default 2; chunks 1), later merged point by point into their medians:
# two runs of the bf16 sweep in 3 rounds each disagreed on 8 of 72 picks (H200, sixtieth session).
runs_of() { if [ "$1" = chunks ]; then echo "${RUNS:-1}"; else echo "${RUNS:-2}"; fi; }
run_job() {  # gpu dtype kind
  local sweep=attention_hopper only=()
  [ "$3" = chunks ] && sweep=attention_chunks
  [ "$3" = short ] && only=(BARACUDA_ATTN_SWEEP=short)
  for r in $(seq 1 "$(runs_of "$3")"); do
    env CUDA_VISIBLE_DEVICES="$1" BARACUDA_ATTN_DTYPE="$2" "${only[@]}" "$bench" "$sweep" \
      >"$OUT/table_$2_$3_run$r.jsonl"
  done
}
# Job i goes to GPU i * gpus / jobs: contiguous blocks, so one dtype's kinds share a GPU.
queues=()
for g in $(seq 0 $((gpus - 1))); do
  (
    for i in "${!jobs[@]}"; do
      [ $((i * gpus / ${#jobs[@]})) = "$g" ] || continue
      run_job "${ids[$g]}" "${jobs[$i]%%:*}" "${jobs[$i]#*:}"
    done
  ) &
  queues+=($!)
done
# Each queue waited for by its pid: `wait -n` returned 127 (no job) about once in 1000 when two
# subshells ended together (bash 5.2; attention_table's "two GPUs" case failed so in CI,
# 2026-12-01), failing a run in which nothing had failed.
failed=0
for q in "${queues[@]}"; do wait "$q" || failed=1; done
[ $failed = 0 ] || { echo "a bench run failed"; exit 1; }
# The shipped table's points of the kinds this run does not measure stay (make_table.py --base).
# One make_table.py pass a job, each on the previous pass's header: a pass writes one provenance
# for the kinds it measures, so each kind's names its own runs (a chunk job's 1 beside a sweep's 2).
table=src/ops/attention_hopper/selection_table.hpp
for i in "${!jobs[@]}"; do
  j=${jobs[$i]} files=()
  for r in $(seq 1 "$(runs_of "${j#*:}")"); do files+=("$OUT/table_${j%%:*}_${j#*:}_run$r.jsonl"); done
  python3 src/ops/attention_hopper/make_table.py "${files[@]}" --base "$table" \
    --commit "${BARACUDA_COMMIT:-unknown}" --date "$(date +%F)" >"$OUT/selection_table.pass$i.hpp"
  table=$OUT/selection_table.pass$i.hpp
done
mv "$table" "$OUT/selection_table.hpp"
rm -f "$OUT"/selection_table.pass*.hpp
echo "table: $OUT/selection_table.hpp ($(grep -c 'DType::' "$OUT/selection_table.hpp") points)"
# The GPU machine returns at most 8 files from $OUT: the runs and build logs go back as one
# table_runs.tgz (the sixty-eighth session lost a run's file to that limit).
pack_runs() {
  local parts=()
  for x in "$OUT"/table_*_run*.jsonl "$OUT"/table_build.log "$OUT"/table_tests_build.log \
    "$OUT"/table_logs; do
    [ -e "$x" ] && parts+=("$(basename "$x")")
  done
  [ "${#parts[@]}" = 0 ] || { tar czf "$OUT/table_runs.tgz" -C "$OUT" "${parts[@]}" &&
    (cd "$OUT" && rm -rf "${parts[@]}"); }
}
[ "${TABLE_TESTS:-0}" = 1 ] || { pack_runs; exit 0; }
cp "$OUT/selection_table.hpp" "${TABLE_DEST:-src/ops/attention_hopper/selection_table.hpp}"
tests=${TEST_BIN:-}
if [ -z "$tests" ]; then
  OUT="$OUT/table_logs" BUILD_TARGETS=test STAGES=none bash scripts/gpu-family.sh attention \
    >"$OUT/table_tests_build.log" 2>&1 || true
  tests="${BUILD_DIR:-build-family}/tests/test_attention"
fi
[ -x "$tests" ] || {
  echo "no test_attention at $tests: see table_tests_build.log in $OUT/table_runs.tgz"
  pack_runs
  exit 1
}
selection_tests='AttentionCudnnRules.*:AttentionCudnnGpu.SelectionFollowsTheMeasuredTable'
selection_tests+=':AttentionFa3Gpu.DefaultPlan*:AttentionFa3Gpu.DefaultBackwardPlanFollowsTheTable'
selection_tests+=':AttentionHopperGpu.*'
status=0
"$tests" --gtest_filter="${TABLE_TEST_FILTER:-$selection_tests}" >"$OUT/table_tests.log" 2>&1 ||
  status=$?
grep -E '^\[  (PASSED|FAILED)  \]|base seed' "$OUT/table_tests.log" || true
echo "table tests: exit $status ($OUT/table_tests.log)"
pack_runs
exit $status
