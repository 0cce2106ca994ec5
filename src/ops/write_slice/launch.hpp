// Host launchers shared by the CUDA translation units of write_slice / kv_append.
#pragma once

#include <cstdint>
#include <string_view>

#include "baracuda/core/plan.hpp"
#include "baracuda/ops/write_slice.hpp"

namespace baracuda::write_slice_cuda {

// Copies rows of contiguous bytes (the byte-level CopyShape) with the widest access unit that the
// addresses, strides and run length allow (16 bytes when they are all 16-byte multiples).
// `RowsVariant`: units in flight per thread (4 or 8) and evict-first accesses (ilp 8 streams);
// `one_wave` (ilp 8 only): one wave of blocks walking the tiles grid-stride instead of a block
// per tile.
struct RowsVariant {
  int ilp = 4;
  bool streaming = false;
  bool one_wave = false;
};
Status copy_rows(const LaunchContext& ctx, std::string_view kernel, char* dst, const char* src,
                 const write_slice_detail::CopyShape& c, RowsVariant v = {});
// The sub-byte merge for windows that start or end inside a byte.
Status merge_bits(const LaunchContext& ctx, char* dst, const char* src,
                  const write_slice_detail::CopyShape& c);
// The `flat` kernels: the same copy as copy_rows as one flat pass over the window's units, and
// the word-wide sub-byte merge, with evict-first loads and stores.
Status copy_flat(const LaunchContext& ctx, std::string_view kernel, char* dst, const char* src,
                 const write_slice_detail::CopyShape& c);
Status merge_words(const LaunchContext& ctx, char* dst, const char* src,
                   const write_slice_detail::CopyShape& c);
// The `bulk_copy` kernel (sm_90+): rows move through shared memory on the bulk copy engine.
// It needs 16-byte multiples everywhere and rows long enough to amortize a chunk's issue;
// `bulk_copy_fits` checks the layout, the launch checks the base pointers (and falls back to
// copy_rows when they are not 16-byte aligned).
inline constexpr int64_t kMinBulkRowBytes = 2048;
bool bulk_copy_fits(const write_slice_detail::CopyShape& c);
Status copy_bulk(const LaunchContext& ctx, char* dst, const char* src,
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
