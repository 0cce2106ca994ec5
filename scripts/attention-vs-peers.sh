#!/usr/bin/env bash
# One device call: the attention default plan against PyTorch's SDPA backends in the same process
# order and machine state, the check behind issue 8's "the default >= the fastest PyTorch backend
# at every point" (the forty-ninth session's call 3 ran it by hand). Builds bench_attention with
# the cuDNN frontend (carry third_party/cudnn_frontend/include) through scripts/gpu-family.sh unless
# $BUILD_DIR has it, times the FlashAttention sweep's default plans (forward and backward, no A/B
# rows) and the decode rows, then peers.py on the same names, and reads both with
# default_vs_fastest.py (the cases a peer won by more than --over are listed as "peer" lines).
#   bash scripts/attention-vs-peers.sh
# env: BUILD_DIR (default bf), JOBS, OVER (default 1.0), BARACUDA_COMMIT (stamped on the rows).
# RECORD=1 (issue 8's record in the same call, about 100 s more): the default rows again in one
# round of 10 calls (BARACUDA_ATTN_ROW_ROUNDS / _REPS, near the burst of PyTorch's do_bench: under
# the power cap the long rows read up to 9% higher than in the bench's 5 rounds), the table bench's
# bf16 columns (cuDNN, bespoke, fa3 by name; one round), then attention_record.py's table of them
# all with the GEMM ceiling's share and the own-kernel bar, in $OUT/record.md.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
B=${BUILD_DIR:-bf}
if [ ! -x "$B/apps/bench_attention" ]; then
  OUT="$OUT/build" STAGES=none BUILD_DIR=$B BUILD_TARGETS=bench JOBS=${JOBS:-$(nproc)} \
    bash scripts/gpu-family.sh attention >"$OUT/build.log" 2>&1
fi
[ -x "$B/apps/bench_attention" ] || { echo "build failed: see $OUT/build.log"; exit 1; }
. scripts/cudnn-env.sh
BARACUDA_ATTENTION_ONLY=backward BARACUDA_ATTN_KERNELS=none timeout 300 \
  "$B/apps/bench_attention" attention >"$OUT/ours.jsonl" 2>"$OUT/ours.err"
BARACUDA_ATTENTION_ONLY=decode timeout 120 "$B/apps/bench_attention" attention \
  >>"$OUT/ours.jsonl" 2>>"$OUT/ours.err"
for only in backward decode; do
  BARACUDA_ATTENTION_ONLY=$only PYTHONUNBUFFERED=1 timeout 300 python3 src/ops/attention/peers.py \
    >>"$OUT/peers.jsonl" 2>>"$OUT/peers.err"
done
python3 scripts/default_vs_fastest.py "$OUT/ours.jsonl" --peers "$OUT/peers.jsonl" \
  --over "${OVER:-1.0}" | tee "$OUT/summary.txt"
if [ "${RECORD:-0}" = 1 ]; then
  BARACUDA_ATTN_ROW_ROUNDS=1 BARACUDA_ATTN_ROW_REPS=10 BARACUDA_ATTENTION_ONLY=backward \
    BARACUDA_ATTN_KERNELS=none timeout 300 "$B/apps/bench_attention" attention \
    >"$OUT/ours_1x10.jsonl" 2>>"$OUT/ours.err"
  BARACUDA_ATTN_DTYPE=bf16 timeout 300 "$B/apps/bench_attention" attention_hopper \
    >"$OUT/table_bf16.jsonl" 2>>"$OUT/ours.err"
  python3 scripts/attention_record.py "$OUT/ours.jsonl" --peers "$OUT/peers.jsonl" \
    --table "$OUT/table_bf16.jsonl" --short "$OUT/ours_1x10.jsonl" | tee "$OUT/record.md"
fi
