// The passes of cudnn_varlen.hpp. One launch each: the prep writes 7 B + 5 words; the row pass
// reads every query row's key count and writes its LSE (a warp a row, so a keyless row's zeros
// are stored coalesced).
#include <algorithm>
#include <cmath>

#include "ops/attention_hopper/cudnn_varlen.hpp"

namespace baracuda::attention_hopper {
namespace {

__global__ void ragged_prep(RaggedPrep r) {
  for (int64_t b = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; b <= r.batch;
       b += int64_t{gridDim.x} * blockDim.x) {
    const int64_t q0 = std::clamp<int64_t>(r.cu_q[b], 0, r.total_q),
                  k0 = std::clamp<int64_t>(r.cu_k[b], 0, r.total_k);
    r.off_q[b] = static_cast<int32_t>(q0 * r.q_row);
    r.off_y[b] = static_cast<int32_t>(q0 * r.y_row);
    r.off_stats[b] = static_cast<int32_t>(q0 * r.heads_q);
    r.off_k[b] = static_cast<int32_t>(k0 * r.k_row);
    r.off_v[b] = static_cast<int32_t>(k0 * r.v_row);
    if (b == r.batch) continue;
    const int64_t q1 = std::clamp<int64_t>(r.cu_q[b + 1], q0, r.total_q),
                  k1 = std::clamp<int64_t>(r.cu_k[b + 1], k0, r.total_k);
    r.seq_q[b] = static_cast<int32_t>(std::min(q1 - q0, r.len_q));
    r.seq_kv[b] = static_cast<int32_t>(std::min(k1 - k0, r.len_k));
  }
}

constexpr int kRowsPerBlock = 8;  // one warp a row

__global__ void ragged_rows(RaggedRows r) {
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int64_t rows = r.batch * r.heads * r.len_q;
  for (int64_t row = blockIdx.x * int64_t{kRowsPerBlock} + threadIdx.x / 32; row < rows;
       row += int64_t{gridDim.x} * kRowsPerBlock) {
    const int64_t i = row % r.len_q, h = (row / r.len_q) % r.heads, b = row / (r.len_q * r.heads);
    const int64_t lq = r.seq_q[b];
    if (i >= lq) continue;  // past the sequence: another sequence's row, or none
    const int64_t t = r.off_stats[b] / r.heads + i;  // the row's token
    int64_t lo = 0, hi = 0;
    attention::detail::visible_keys(r.band, i, lq, r.seq_kv[b], &lo, &hi);
    float* lse = r.lse + h * r.lse_head + t * r.lse_row;
    if (lo < hi) {
      if (lane == 0) *lse = r.stats[t * r.heads + h];
      continue;
    }
    auto* y = static_cast<uint16_t*>(r.y) + t * r.y_row + h * r.y_head;
    for (int64_t e = lane; e < r.dim_v; e += 32) y[e] = 0;  // +0 in bf16 and f16 alike
    if (lane == 0) *lse = -INFINITY;
  }
}

unsigned grid_for(int64_t units, int64_t per_block) {
  // Grid-stride loops: at most 2^16 blocks cover any count.
  return static_cast<unsigned>(
      std::clamp<int64_t>((units + per_block - 1) / per_block, 1, int64_t{1} << 16));
}

}  // namespace

cudaError_t launch_ragged_prep(cudaStream_t stream, const RaggedPrep& prep) {
  ragged_prep<<<grid_for(prep.batch + 1, 128), 128, 0, stream>>>(prep);
  return cudaGetLastError();
}

cudaError_t launch_ragged_rows(cudaStream_t stream, const RaggedRows& rows) {
  ragged_rows<<<grid_for(rows.batch * rows.heads * rows.len_q, kRowsPerBlock), 32 * kRowsPerBlock,
                0, stream>>>(rows);
  return cudaGetLastError();
}

}  // namespace baracuda::attention_hopper
