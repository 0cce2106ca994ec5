// The byte-level copy engine of write_slice (pitched 2-D and generic N-D paths) and the sub-byte
// merge. Instantiated once per access unit, shared by every dtype.
#include <algorithm>

#include "core/cuda/launch.cuh"
#include "ops/write_slice/kernels.cuh"
#include "ops/write_slice/launch.hpp"

namespace baracuda::write_slice_cuda {
namespace {

using write_slice_detail::CopyShape;

struct Grid {
  dim3 grid, block;
};

// Block: 256 threads, x over a row's units (up to the row length), y over rows.
// `ilp`: units each thread moves per step (the kernels' kCopyIlp / kMergeIlp). Rows beyond about
// 32 blocks per SM are looped over inside the kernel rather than launched as more blocks: many
// short-lived blocks made block scheduling the limit on H100 (one 16-byte unit per thread).
Grid grid_for(const LaunchContext& ctx, int64_t rows, int64_t inner, int ilp) {
  int bx = 1;
  while (bx < inner && bx < 256) bx *= 2;
  const int by = 256 / bx;
  const int sms = ctx.stream.caps().sm_count > 0 ? ctx.stream.caps().sm_count : 128;
  const int64_t gx =
      std::clamp<int64_t>(cuda::ceil_div(inner, int64_t{bx} * ilp), 1, int64_t{1} << 30);
  const int64_t max_gy = std::clamp<int64_t>(int64_t{sms} * 32 / gx, 1, 65535);
  const int64_t gy = std::clamp<int64_t>(cuda::ceil_div(rows, by), 1, max_gy);
  return {dim3(static_cast<unsigned>(gx), static_cast<unsigned>(gy)),
          dim3(static_cast<unsigned>(bx), static_cast<unsigned>(by))};
}

RowsArgs rows_args(const CopyShape& c, int64_t unit, int64_t inner_units) {
  RowsArgs a{};
  a.outer_rank = c.outer_rank;
  for (int k = 0; k < c.outer_rank; ++k) {
    a.extent[k] = c.extent[k];
    a.dst_stride[k] = c.dst_stride[k] / unit;
    a.src_stride[k] = c.src_stride[k] / unit;
  }
  a.rows = c.rows;
  a.inner = inner_units;
  return a;
}

template <class V>
Status launch_rows(const LaunchContext& ctx, std::string_view kernel, char* dst, const char* src,
                   const RowsArgs& a) {
  const Grid g = grid_for(ctx, a.rows, a.inner, kCopyIlp);
  copy_rows_kernel<V><<<g.grid, g.block, 0, cuda::stream_of(ctx)>>>(
      reinterpret_cast<V*>(dst), reinterpret_cast<const V*>(src), a);
  return cuda::check_launch(WriteSliceOp::name, kernel);
}

// The widest unit every address, stride and the run length are multiples of: 16-byte accesses
// on aligned data, an exact narrower fallback otherwise.
int64_t copy_unit(const char* dst, const char* src, const CopyShape& c) {
  int64_t u = widest_unit({c.inner_bytes, static_cast<int64_t>(reinterpret_cast<uintptr_t>(dst)),
                           static_cast<int64_t>(reinterpret_cast<uintptr_t>(src))});
  for (int k = 0; k < c.outer_rank; ++k)
    u = std::min(u, widest_unit({c.dst_stride[k], c.src_stride[k]}));
  return u;
}

}  // namespace

Status copy_rows(const LaunchContext& ctx, std::string_view kernel, char* dst, const char* src,
                 const CopyShape& c) {
  if (c.rows == 0 || c.inner_bytes == 0) return {};
  const int64_t u = copy_unit(dst, src, c);
  const RowsArgs a = rows_args(c, u, c.inner_bytes / u);
  switch (u) {
    case 16:
      return launch_rows<uint4>(ctx, kernel, dst, src, a);
    case 8:
      return launch_rows<uint2>(ctx, kernel, dst, src, a);
    case 4:
      return launch_rows<uint32_t>(ctx, kernel, dst, src, a);
    case 2:
      return launch_rows<uint16_t>(ctx, kernel, dst, src, a);
    default:
      return launch_rows<uint8_t>(ctx, kernel, dst, src, a);
  }
}

Status copy_rows_tapered(const LaunchContext& ctx, char* dst, const char* src, const CopyShape& c) {
  if (c.rows == 0 || c.inner_bytes == 0) return {};
  const int64_t inner = c.inner_bytes / 16;
  // Its shape only: one outer axis, 16-byte units, rows of whole big tiles. Anything else is the
  // block-per-tile kernel's.
  if (c.outer_rank != 1 || copy_unit(dst, src, c) != 16 || inner % kTaperBig != 0)
    return copy_rows(ctx, "kv_2d_tapered", dst, src, c);
  const int sms = ctx.stream.caps().sm_count > 0 ? ctx.stream.caps().sm_count : 128;
  // The last two waves of 256-thread blocks (8 resident per SM) in small tiles.
  const int64_t total = c.rows * inner;
  const int64_t small_units =
      std::min(total, (int64_t{2} * sms * 8 * kTaperSmall) / kTaperBig * kTaperBig);
  const TaperArgs a{inner, c.dst_stride[0] / 16, c.src_stride[0] / 16,
                    (total - small_units) / kTaperBig};
  const int64_t blocks = a.n_big + small_units / kTaperSmall;
  if (blocks >= (int64_t{1} << 31)) return copy_rows(ctx, "kv_2d_tapered", dst, src, c);
  copy_rows_tapered_kernel<uint4><<<static_cast<unsigned>(blocks), 256, 0, cuda::stream_of(ctx)>>>(
      reinterpret_cast<uint4*>(dst), reinterpret_cast<const uint4*>(src), a);
  return cuda::check_launch(WriteSliceOp::name, "kv_2d_tapered");
}

Status merge_bits(const LaunchContext& ctx, char* dst, const char* src, const CopyShape& c) {
  if (c.rows == 0 || c.row_bits == 0) return {};
  MergeArgs m{};
  m.first_byte = c.row_bit_offset / 8;
  m.bit_offset = c.row_bit_offset;
  m.nbits = c.row_bits;
  m.rows = rows_args(c, 1, (c.row_bit_offset + c.row_bits + 7) / 8 - m.first_byte);
  const Grid g = grid_for(ctx, m.rows.rows, m.rows.inner, kMergeIlp);
  merge_bits_kernel<uint8_t><<<g.grid, g.block, 0, cuda::stream_of(ctx)>>>(
      reinterpret_cast<uint8_t*>(dst), reinterpret_cast<const uint8_t*>(src), m);
  return cuda::check_launch(WriteSliceOp::name, "subbyte_merge");
}

}  // namespace baracuda::write_slice_cuda
