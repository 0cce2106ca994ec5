// Device passes around a cuDNN SDPA graph over packed sequences (Descriptor::varlen), which cuDNN
// reads in its ragged layout under a padding mask. Before the graph: from cu_seqlens, each
// sequence's lengths and the element offsets of its first row in every ragged tensor of the pass
// (int32, as cuDNN reads them; cu_seqlens are device data, so both are clamped into the packed
// tensors); in the backward, also the caller's LSE [Hq, Tq] as cuDNN's statistics [Tq, Hq]. After
// the forward: every row's LSE from the statistics into the API's [Hq, Tq], and the rows that see
// no key, which cuDNN leaves undefined, set to y = 0, lse = -inf. After the backward: the rows of
// sequences with no query (dK, dV) or no key (dQ) set to 0, which the API promises and cuDNN
// does not.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "ops/attention/common.hpp"

namespace baracuda::attention_hopper {

// One ragged tensor of a pass: its token stride (elements) and whose rows it holds.
struct RaggedTensor {
  int64_t row = 0;
  bool keys = false;       // K's side (cu_seqlens_k) or Q's (cu_seqlens_q)
  int32_t* off = nullptr;  // [B + 1]: element offset of each sequence's first row
};
constexpr int kMaxRagged = 9;  // the backward's Q K V O Stats dO dQ dK dV

struct RaggedPrep {
  const int32_t* cu_q = nullptr;  // [B + 1]
  const int32_t* cu_k = nullptr;
  int64_t batch = 0, len_q = 0, len_k = 0;  // len_*: the descriptor's longest sequences
  int64_t total_q = 0, total_k = 0;         // rows of the packed tensors
  int32_t* seq_q = nullptr;                 // [B]
  int32_t* seq_kv = nullptr;
  RaggedTensor tensors[kMaxRagged];
  int count = 0;
  // Backward only (lse null otherwise): stats[t * heads_q + h] = lse[h * lse_head + t * lse_row],
  // a row whose LSE is not finite as +inf, so that cuDNN's P = exp(S - stats) is 0 there (the
  // reference skips such rows; -inf would make exp(-inf + inf) = NaN).
  const float* lse = nullptr;
  int64_t lse_head = 0, lse_row = 0, heads_q = 0;
  float* stats = nullptr;
};
cudaError_t launch_ragged_prep(cudaStream_t stream, const RaggedPrep& prep);

struct RaggedRows {
  void* y = nullptr;  // [Tq, Hq, Dv] 16-bit, unit-stride rows
  int64_t y_row = 0, y_head = 0;
  float* lse = nullptr;  // [Hq, Tq]
  int64_t lse_head = 0, lse_row = 0;
  const float* stats = nullptr;  // [Tq, Hq], cuDNN's
  const int32_t* off_stats = nullptr;
  const int32_t* seq_q = nullptr;
  const int32_t* seq_kv = nullptr;
  int64_t batch = 0, heads = 0, len_q = 0, dim_v = 0;
  attention::detail::Band band{};
};
cudaError_t launch_ragged_rows(cudaStream_t stream, const RaggedRows& rows);

struct RaggedEmpty {
  void *dq = nullptr, *dk = nullptr, *dv = nullptr;  // packed 16-bit, unit-stride rows
  int64_t dq_row = 0, dq_head = 0, dk_row = 0, dk_head = 0, dv_row = 0, dv_head = 0;
  const int32_t* cu_q = nullptr;  // [B + 1], clamped as the prep clamps them
  const int32_t* cu_k = nullptr;
  int64_t total_q = 0, total_k = 0;
  const int32_t* seq_q = nullptr;  // the prep's lengths
  const int32_t* seq_kv = nullptr;
  int64_t batch = 0, heads_q = 0, heads_kv = 0, dim_qk = 0, dim_v = 0;
};
cudaError_t launch_ragged_empty(cudaStream_t stream, const RaggedEmpty& e);

}  // namespace baracuda::attention_hopper
