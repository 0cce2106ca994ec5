// Host side of the `flat` kernels (kernels_flat.cuh): the flat copy, instantiated once per access
// unit and shared by every dtype, and the word-wide sub-byte merge.
#include <algorithm>

#include "core/cuda/launch.cuh"
#include "ops/write_slice/kernels_flat.cuh"
#include "ops/write_slice/launch.hpp"

namespace baracuda::write_slice_cuda {
namespace {

using write_slice_detail::CopyShape;

OuterAxes outer_axes(const CopyShape& c, int64_t unit) {
  OuterAxes o{};
  o.rank = c.outer_rank;
  for (int k = 0; k < c.outer_rank; ++k) {
    o.extent[k] = FastDiv(static_cast<uint64_t>(c.extent[k]));
    o.dst_stride[k] = c.dst_stride[k] / unit;
    o.src_stride[k] = c.src_stride[k] / unit;
  }
  return o;
}

int sm_count(const LaunchContext& ctx) {
  return ctx.stream.caps().sm_count > 0 ? ctx.stream.caps().sm_count : 128;
}

template <class V>
Status launch_flat(const LaunchContext& ctx, std::string_view kernel, char* dst, const char* src,
                   FlatArgs a) {
  // One wave: as many blocks as fit on the chip at once (occupancy of this instantiation).
  const int per_sm = std::max(
      cuda::blocks_per_sm(reinterpret_cast<const void*>(copy_flat_kernel<V>), kFlatThreads, 0), 1);
  const int64_t wave = int64_t{sm_count(ctx)} * per_sm;
  // Small windows get more blocks with one unit per thread (latency), large ones one wave.
  const int64_t blocks =
      std::clamp<int64_t>(cuda::ceil_div(a.total, int64_t{kFlatThreads}), 1, wave);
  a.span = cuda::ceil_div(cuda::ceil_div(a.total, blocks), int64_t{kFlatThreads}) * kFlatThreads;
  const int64_t grid = cuda::ceil_div(a.total, a.span);
  copy_flat_kernel<V><<<static_cast<unsigned>(grid), kFlatThreads, 0, cuda::stream_of(ctx)>>>(
      reinterpret_cast<V*>(dst), reinterpret_cast<const V*>(src), a);
  return cuda::check_launch(WriteSliceOp::name, kernel);
}

}  // namespace

Status copy_flat(const LaunchContext& ctx, std::string_view kernel, char* dst, const char* src,
                 const CopyShape& c) {
  if (c.rows == 0 || c.inner_bytes == 0) return {};
  int64_t u = widest_unit({c.inner_bytes, static_cast<int64_t>(reinterpret_cast<uintptr_t>(dst)),
                           static_cast<int64_t>(reinterpret_cast<uintptr_t>(src))});
  for (int k = 0; k < c.outer_rank; ++k)
    u = std::min(u, widest_unit({c.dst_stride[k], c.src_stride[k]}));
  FlatArgs a{};
  a.outer = outer_axes(c, u);
  a.inner = FastDiv(static_cast<uint64_t>(c.inner_bytes / u));
  a.total = c.rows * (c.inner_bytes / u);  // the window's size: fits (checked at make_problem)
  switch (u) {
    case 16:
      return launch_flat<uint4>(ctx, kernel, dst, src, a);
    case 8:
      return launch_flat<uint2>(ctx, kernel, dst, src, a);
    case 4:
      return launch_flat<uint32_t>(ctx, kernel, dst, src, a);
    case 2:
      return launch_flat<uint16_t>(ctx, kernel, dst, src, a);
    default:
      return launch_flat<uint8_t>(ctx, kernel, dst, src, a);
  }
}

Status merge_words(const LaunchContext& ctx, char* dst, const char* src, const CopyShape& c) {
  if (c.rows == 0 || c.row_bits == 0) return {};
  MergeWordArgs m{};
  m.outer = outer_axes(c, 1);
  m.rows = c.rows;
  m.first_byte = c.row_bit_offset / 8;
  m.last_byte = (c.row_bit_offset + c.row_bits + 7) / 8;
  m.words = (m.last_byte - m.first_byte + 6) / 4;  // the head word may start 3 bytes early
  m.bit_offset = c.row_bit_offset;
  m.nbits = c.row_bits;
  m.src_bytes = (c.row_bits + 7) / 8;
  // Block: x over a row's words, y over rows; rows past ~32 blocks per SM loop in the kernel.
  int bx = 1;
  while (bx < m.words && bx < 256) bx *= 2;
  const int by = 256 / bx;
  const int64_t gx = std::clamp<int64_t>(cuda::ceil_div(m.words, int64_t{bx} * kMergeWordIlp), 1,
                                         int64_t{1} << 30);
  const int64_t gy = std::clamp<int64_t>(cuda::ceil_div(m.rows, int64_t{by}), 1,
                                         std::clamp<int64_t>(sm_count(ctx) * 32 / gx, 1, 65535));
  merge_words_kernel<uint8_t>
      <<<dim3(static_cast<unsigned>(gx), static_cast<unsigned>(gy)),
         dim3(static_cast<unsigned>(bx), static_cast<unsigned>(by)), 0, cuda::stream_of(ctx)>>>(
          reinterpret_cast<uint8_t*>(dst), reinterpret_cast<const uint8_t*>(src), m);
  return cuda::check_launch(WriteSliceOp::name, "subbyte_merge_words");
}

}  // namespace baracuda::write_slice_cuda
