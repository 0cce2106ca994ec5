// Host launchers shared by the CUDA translation units of write_slice / kv_append.
#pragma once

#include <cstdint>
#include <string_view>

#include "baracuda/core/plan.hpp"
#include "baracuda/ops/write_slice.hpp"

namespace baracuda::write_slice_cuda {

// Copies rows of contiguous bytes (the byte-level CopyShape) with the widest access unit that the
// addresses, strides and run length allow (16 bytes when they are all 16-byte multiples).
Status copy_rows(const LaunchContext& ctx, std::string_view kernel, char* dst, const char* src,
                 const write_slice_detail::CopyShape& c);
// The pitched 2-D copy (one outer axis, 16-byte units, rows of whole 16 KB tiles) with the last
// two waves in 4 KB tiles; other shapes go to copy_rows.
Status copy_rows_tapered(const LaunchContext& ctx, char* dst, const char* src,
                         const write_slice_detail::CopyShape& c);
// The sub-byte merge for windows that start or end inside a byte.
Status merge_bits(const LaunchContext& ctx, char* dst, const char* src,
                  const write_slice_detail::CopyShape& c);
// The `flat` kernels: the same copy as copy_rows as one flat pass over the window's units, and
// the word-wide sub-byte merge, with evict-first loads and stores.
Status copy_flat(const LaunchContext& ctx, std::string_view kernel, char* dst, const char* src,
                 const write_slice_detail::CopyShape& c);
Status merge_words(const LaunchContext& ctx, char* dst, const char* src,
                   const write_slice_detail::CopyShape& c);
// One launch of kv_append (flags and rows together).
Status kv_append(const LaunchContext& ctx, const KvAppendOp::Problem& p,
                 const KvAppendOp::Arguments& a);

// Largest power of two <= 16 dividing every value (0 divides nothing away).
inline int64_t widest_unit(std::initializer_list<int64_t> values) {
  int64_t u = 16;
  for (int64_t v : values)
    while (u > 1 && v % u != 0) u /= 2;
  return u;
}

}  // namespace baracuda::write_slice_cuda
