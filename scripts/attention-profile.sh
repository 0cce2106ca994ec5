#!/usr/bin/env bash
# One device call: Nsight Compute profiles of our attention forward next to PyTorch's on the same
# sweep point, so that the two kernels' counters (issue slots, stalls, shared-memory traffic,
# instruction mix) can be compared side by side.
#   scripts/attention-profile.sh d64_l4096 [d128_l4096_causal ...]
# Builds bench_attention through scripts/gpu-family.sh (sm_90a) unless $BUILD_DIR has it. Per
# point: one of the family's forward kernels (FAMILY_KERNEL, default flash_fwd_mma_m32s_n128m_sm80;
# bench_attention with BARACUDA_ATTN_SWEEP and BARACUDA_ATTN_KERNELS, its first launch) against
# PyTorch SDPA's flash backend (FlashAttention-2). env: KERNELS (ncu regex of ours, default
# flash_fwd_mma), PEER (torch_sdpa_flash | torch_sdpa_cudnn), NCU_SET (default full), PASS (forward
# | backward: flash_bwd_fused against FA2's backward kernel), BENCH_FAMILY (bench_attention's
# family, default attention; attention_hopper profiles an fa3 forward instance, e.g.
# FAMILY_KERNEL=fa3_fwd_sm90a_persistent KERNELS=fa3_fwd PEER=torch_sdpa_cudnn, at non-causal
# points only). Reports (.ncu-rep) and their text pages land in $OUT. Clocks are left as found
# (--clock-control none): the card's settings are not ours to change.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
export PATH=/usr/local/cuda/bin:$PATH
B=${BUILD_DIR:-build-family}
KERNELS=${KERNELS:-flash_fwd_mma}
PEER=${PEER:-torch_sdpa_flash}
PASS=${PASS:-forward}  # backward: our first flash_bwd_fused launch against FA2's backward kernel
[ "$PASS" = backward ] && KERNELS=${KERNELS_BWD:-flash_bwd_fused}
NCU_SET=${NCU_SET:-full}
. scripts/cudnn-env.sh
if [ ! -x "$B/apps/bench_attention" ]; then  # built the way every GPU script builds
  OUT="$OUT/build" BUILD_DIR=$B BUILD_TARGETS=bench STAGES=none bash scripts/gpu-family.sh attention \
    >"$OUT/build.log" 2>&1
  rm -rf "$OUT/build"
  [ -x "$B/apps/bench_attention" ] || { tail -30 "$OUT/build.log"; exit 1; }
fi
ncu_run() {  # <report name> <kernel regex> <command...>
  local name=$1 regex=$2
  shift 2
  timeout 240 ncu --clock-control none --set "$NCU_SET" -k "regex:$regex" -c 1 -f -o "$OUT/$name" "$@" \
    >"$OUT/$name.run.log" 2>&1
  echo "$name: rc=$? $(grep -c '==PROF==' "$OUT/$name.run.log") profiler lines"
  ncu --import "$OUT/$name.ncu-rep" --page details >"$OUT/$name.details.txt" 2>&1
  ncu --import "$OUT/$name.ncu-rep" --page raw --csv >"$OUT/$name.raw.csv" 2>&1
  # Per-instruction counters (stall reasons by SASS line): where the two kernels differ.
  ncu --import "$OUT/$name.ncu-rep" --page source --csv --print-source sass \
    >"$OUT/$name.sass.csv" 2>&1
}
for point in "$@"; do
  BARACUDA_ATTENTION_ONLY=$PASS BARACUDA_ATTN_SWEEP=$point \
    BARACUDA_ATTN_KERNELS=${FAMILY_KERNEL:-flash_fwd_mma_m32s_n128m_sm80} \
    ncu_run "ours_$point" "$KERNELS" "$B/apps/bench_attention" "${BENCH_FAMILY:-attention}"
  d=${point#d}
  d=${d%%_*}
  l=${point#*_l}
  l=${l%%_*}
  causal=False
  [[ $point == *_causal ]] && causal=True
  peer_regex=flash_fwd
  [ "$PASS" = backward ] && peer_regex=flash_bwd_dq_dk_dv
  [ "$PEER" = torch_sdpa_cudnn ] && peer_regex='sm90|cudnn|fmha'
  cat >"$OUT/peer_$point.py" <<EOF
import torch, torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
d, l = $d, $l
b, h = 16384 // l, 2048 // d
q, k, v = (torch.randn(b, h, l, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
backend = {"torch_sdpa_flash": SDPBackend.FLASH_ATTENTION,
           "torch_sdpa_cudnn": SDPBackend.CUDNN_ATTENTION}["$PEER"]
with sdpa_kernel(backend):
    for _ in range(3):
        if "$PASS" == "backward":
            q.requires_grad_(), k.requires_grad_(), v.requires_grad_()
            y = F.scaled_dot_product_attention(q, k, v, is_causal=$causal)
            torch.autograd.grad(y, (q, k, v), torch.randn_like(y))
        else:
            F.scaled_dot_product_attention(q, k, v, is_causal=$causal)
torch.cuda.synchronize()
EOF
  ncu_run "peer_$point" "$peer_regex" python3 "$OUT/peer_$point.py"
done
# The device returns at most 8 files: the text pages in one archive, the reports beside it.
tmp=$(mktemp -d)
[ -f "$OUT/profile.tgz" ] && tar xzf "$OUT/profile.tgz" -C "$tmp"  # an earlier run's pages
find "$OUT" -maxdepth 1 -type f ! -name '*.ncu-rep' ! -name profile.tgz -exec mv {} "$tmp/" \;
tar czf "$OUT/profile.tgz" -C "$tmp" . && rm -rf "$tmp"
