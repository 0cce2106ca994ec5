#!/usr/bin/env bash
# One GPU-machine call that measures the attention selection table and regenerates it: builds the
# attention family (scripts/gpu-family.sh, no stages), runs `bench_attention attention_hopper`
# (cuDNN, the bespoke kernels and fa3 at every point of the sweep, on the cuDNN PyTorch loads) and
# turns its table points into $OUT/selection_table.hpp (copy it over
# src/ops/attention_hopper/selection_table.hpp, then clang-format it).
#   BARACUDA_COMMIT=<sha> bash scripts/attention-table.sh
# TABLE=chunks measures the chunk points only (bench_attention attention_chunks: chunked prefill,
# Lq < Lk) and keeps the shipped table's Lq = Lk points (make_table.py --base); TABLE=short the
# short Lq = Lk points only (L 128 / 256, BARACUDA_ATTN_SWEEP=short), keeping the others.
# RUNS=<n> runs the bench n times and merges them (default 2, chunks 1).
# BARACUDA_ATTN_DTYPE=f16 measures f16 points (either kind), kept beside the shipped bf16 ones: an
# f16 problem ranks by f16 points only, and (outside fa3_packs) cuDNN first where the table has
# none.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
STAGES=none bash scripts/gpu-family.sh attention >"$OUT/table_build.log" 2>&1 || true
bench="${BUILD_DIR:-build-family}/apps/bench_attention"
[ -x "$bench" ] || { echo "build failed: see $OUT/table_build.log"; exit 1; }
. scripts/cudnn-env.sh
sweep=attention_hopper
# Lq = Lk points: each the median of 3 rounds of the columns in alternating order, so that the
# clock's fall under the power cap as the run heats does not favour the column timed first.
export BARACUDA_ATTN_ROUNDS=${BARACUDA_ATTN_ROUNDS:-3}
[ "${TABLE:-sweep}" = chunks ] && sweep=attention_chunks
[ "${TABLE:-sweep}" = short ] && export BARACUDA_ATTN_SWEEP=short
# RUNS processes (default 2; chunks 1), merged point by point into their medians: two runs of the
# bf16 sweep in 3 rounds each disagreed on 8 of 72 picks (H200, sixtieth session).
runs=${RUNS:-2}
[ "${TABLE:-sweep}" = chunks ] && runs=${RUNS:-1}
files=()
for r in $(seq 1 "$runs"); do
  "$bench" "$sweep" >"$OUT/table_run$r.jsonl"
  files+=("$OUT/table_run$r.jsonl")
done
# The shipped table's points of the kind this run does not measure stay (make_table.py --base).
python3 src/ops/attention_hopper/make_table.py "${files[@]}" \
  --base src/ops/attention_hopper/selection_table.hpp \
  --commit "${BARACUDA_COMMIT:-unknown}" --date "$(date +%F)" >"$OUT/selection_table.hpp"
echo "table: $OUT/selection_table.hpp ($(grep -c 'DType::' "$OUT/selection_table.hpp") points)"
