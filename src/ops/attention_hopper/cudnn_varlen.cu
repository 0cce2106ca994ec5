// The passes of cudnn_varlen.hpp. One launch each: the prep writes 2 B + count (B + 1) words (and
// the backward's Tq Hq statistics); the row pass reads every query row's key count and writes its
// LSE (a warp a row, so a keyless row's zeros are stored coalesced); the empty pass a block a
// sequence, storing only where a sequence lacks queries or keys.
#include <algorithm>
#include <cmath>

#include "ops/attention_hopper/cudnn_varlen.hpp"

namespace baracuda::attention_hopper {
namespace {

__device__ int64_t first_row(const int32_t* cu, int64_t b, int64_t total) {
  return std::clamp<int64_t>(cu[b], 0, total);
}

__global__ void ragged_prep(RaggedPrep r) {
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  const int64_t tid = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  for (int64_t b = tid; b <= r.batch; b += stride) {
    const int64_t q0 = first_row(r.cu_q, b, r.total_q), k0 = first_row(r.cu_k, b, r.total_k);
    for (int i = 0; i < r.count; ++i) {
      const RaggedTensor& t = r.tensors[i];
      t.off[b] = static_cast<int32_t>((t.keys ? k0 : q0) * t.row);
    }
    if (b == r.batch) continue;
    const int64_t q1 = std::clamp<int64_t>(r.cu_q[b + 1], q0, r.total_q),
                  k1 = std::clamp<int64_t>(r.cu_k[b + 1], k0, r.total_k);
    r.seq_q[b] = static_cast<int32_t>(std::min(q1 - q0, r.len_q));
    r.seq_kv[b] = static_cast<int32_t>(std::min(k1 - k0, r.len_k));
  }
  if (!r.lse) return;
  for (int64_t e = tid; e < r.total_q * r.heads_q; e += stride) {
    const int64_t t = e / r.heads_q, h = e % r.heads_q;
    const float lse = r.lse[h * r.lse_head + t * r.lse_row];
    r.stats[e] = std::isfinite(lse) ? lse : INFINITY;
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

// Zeros `rows` tokens from `t0` of a [T, H, D] 16-bit tensor, the block's threads over them.
__device__ void zero_rows(void* x, int64_t row, int64_t head, int64_t t0, int64_t rows,
                          int64_t heads, int64_t dim) {
  auto* p = static_cast<uint16_t*>(x);
  for (int64_t e = threadIdx.x; e < rows * heads * dim; e += blockDim.x) {
    const int64_t c = e % dim, h = (e / dim) % heads, t = t0 + e / (dim * heads);
    p[t * row + h * head + c] = 0;  // +0 in bf16 and f16 alike
  }
}

__global__ void ragged_empty(RaggedEmpty r) {
  for (int64_t b = blockIdx.x; b < r.batch; b += gridDim.x) {
    const int64_t lq = r.seq_q[b], lk = r.seq_kv[b];
    if (lq == 0 && lk > 0) {  // keys no query sees: dK = dV = 0
      const int64_t k0 = first_row(r.cu_k, b, r.total_k);
      zero_rows(r.dk, r.dk_row, r.dk_head, k0, lk, r.heads_kv, r.dim_qk);
      zero_rows(r.dv, r.dv_row, r.dv_head, k0, lk, r.heads_kv, r.dim_v);
    } else if (lk == 0 && lq > 0) {  // queries that see no key: dQ = 0
      zero_rows(r.dq, r.dq_row, r.dq_head, first_row(r.cu_q, b, r.total_q), lq, r.heads_q,
                r.dim_qk);
    }
  }
}

unsigned grid_for(int64_t units, int64_t per_block) {
  // Grid-stride loops: at most 2^16 blocks cover any count.
  return static_cast<unsigned>(
      std::clamp<int64_t>((units + per_block - 1) / per_block, 1, int64_t{1} << 16));
}

}  // namespace

cudaError_t launch_ragged_prep(cudaStream_t stream, const RaggedPrep& prep) {
  const int64_t units = std::max(prep.batch + 1, prep.lse ? prep.total_q * prep.heads_q : 0);
  ragged_prep<<<grid_for(units, 256), 256, 0, stream>>>(prep);
  return cudaGetLastError();
}

cudaError_t launch_ragged_rows(cudaStream_t stream, const RaggedRows& rows) {
  ragged_rows<<<grid_for(rows.batch * rows.heads * rows.len_q, kRowsPerBlock), 32 * kRowsPerBlock,
                0, stream>>>(rows);
  return cudaGetLastError();
}

cudaError_t launch_ragged_empty(cudaStream_t stream, const RaggedEmpty& e) {
  ragged_empty<<<grid_for(e.batch, 1), 256, 0, stream>>>(e);
  return cudaGetLastError();
}

}  // namespace baracuda::attention_hopper
