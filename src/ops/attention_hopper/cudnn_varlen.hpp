// Device passes around a cuDNN SDPA forward over packed sequences (Descriptor::varlen), which
// cuDNN reads in its ragged layout under a padding mask. Before the graph: from cu_seqlens, each
// sequence's lengths and the element offsets of its first row in Q, K, V, Y and cuDNN's
// statistics (int32, as cuDNN reads them; cu_seqlens are device data, so both are clamped into
// the packed tensors). After it: every row's LSE from the statistics ([Tq, Hq], cuDNN's ragged
// layout) into the API's [Hq, Tq], and the rows that see no key, which cuDNN leaves undefined, set
// to y = 0, lse = -inf.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "ops/attention/common.hpp"

namespace baracuda::attention_hopper {

struct RaggedPrep {
  const int32_t* cu_q = nullptr;  // [B + 1]
  const int32_t* cu_k = nullptr;
  int64_t batch = 0, len_q = 0, len_k = 0;             // len_*: the descriptor's longest sequences
  int64_t total_q = 0, total_k = 0;                    // rows of the packed tensors
  int64_t heads_q = 0;                                 // the statistics' row length
  int64_t q_row = 0, k_row = 0, v_row = 0, y_row = 0;  // token strides (elements)
  int32_t* seq_q = nullptr;                            // [B]
  int32_t* seq_kv = nullptr;
  int32_t *off_q = nullptr, *off_k = nullptr, *off_v = nullptr, *off_y = nullptr,
          *off_stats = nullptr;  // [B + 1]
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

}  // namespace baracuda::attention_hopper
