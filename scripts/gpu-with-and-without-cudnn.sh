#!/usr/bin/env bash
# One device call's two attention trees side by side: `bf`, built with the cuDNN frontend (carry
# third_party/cudnn_frontend/include, an ignored path, or the build has no cuDNN backend), and
# `bn`, built with -DBARACUDA_WITH_CUDNN=OFF (a machine without cuDNN, and the ranking every problem
# cuDNN is not given follows). Each builds test_attention and bench_attention with half the cores
# and runs its own gtest filter; both logs and summaries land in $OUT/with and $OUT/without, then
# the caller's benches can use bf/apps/bench_attention and bn/apps/bench_attention.
#   FILTER_WITH='AttentionCudnnRules.*' FILTER_WITHOUT='Targets/AttentionTest.*/cuda' \
#     bash scripts/gpu-with-and-without-cudnn.sh
# env: FILTER_WITH / FILTER_WITHOUT (gtest filters; "-" builds that tree without running tests),
#      TEST_TIMEOUT (seconds, per tree, default 200), BARACUDA_COMMIT (stamped on bench rows).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
cores=$(nproc)
half=$((cores > 1 ? cores / 2 : 1))
run_tree() {  # <build dir> <out subdir> <gtest filter> [cmake args]
  local stages=test
  [ "$3" = - ] && stages=none
  OUT="$OUT/$2" STAGES=$stages BUILD_DIR=$1 JOBS=$half CMAKE_ARGS="${4:-}" \
    TEST_TIMEOUT=${TEST_TIMEOUT:-200} TEST_FILTER_attention="$3" \
    bash scripts/gpu-family.sh attention >"$OUT/$2.log" 2>&1
}
run_tree bn without "${FILTER_WITHOUT:-*}" -DBARACUDA_WITH_CUDNN=OFF &
run_tree bf with "${FILTER_WITH:-*}"
wait
for tree in with without; do
  echo "== $tree cuDNN"
  grep -E "baracuda: CUDA=|rc=|FAILED" "$OUT/$tree.log" | sort -u
done
