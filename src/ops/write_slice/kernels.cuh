// CUDA kernels of write_slice and kv_append. A copy is dtype-agnostic, so the templates are over
// the access unit V (1, 2, 4, 8 or 16 bytes, picked at launch from the alignment of pointers,
// strides and run lengths) and never over the dtype: five instantiations serve all 17 dtypes.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace baracuda::write_slice_cuda {

inline constexpr int kMaxAxes = 9;  // 8 tensor axes + the element's own bytes

// Rows of `inner` contiguous units; the row index decomposes over `outer_rank` axes. Strides are
// in units of V.
struct RowsArgs {
  int outer_rank;
  int64_t extent[kMaxAxes];
  int64_t dst_stride[kMaxAxes];
  int64_t src_stride[kMaxAxes];
  int64_t rows;
  int64_t inner;
};

__device__ __forceinline__ void row_offsets(const RowsArgs& a, int64_t r, int64_t* d, int64_t* s) {
  if (a.outer_rank == 1) {  // the 2-D (KV-cache) case: no division
    *d = r * a.dst_stride[0];
    *s = r * a.src_stride[0];
    return;
  }
  int64_t doff = 0, soff = 0;
  for (int k = a.outer_rank - 1; k >= 0; --k) {
    const int64_t i = r % a.extent[k];
    r /= a.extent[k];
    doff += i * a.dst_stride[k];
    soff += i * a.src_stride[k];
  }
  *d = doff;
  *s = soff;
}

// Units (copy) or bytes (merge) each thread moves per step, spaced blockDim.x apart so every warp
// access stays coalesced. Several loads in flight per thread, and blocks that do real work: with
// one unit per thread a 64 MiB copy needs ~16k blocks and block scheduling, not DRAM, limits it
// (measured on H100: 75% of copy bandwidth for the 2-D path, 6% for the byte-wise merge).
inline constexpr int kCopyIlp = 4;
inline constexpr int kMergeIlp = 8;

// threadIdx.x/blockIdx.x walk a row's units, threadIdx.y/blockIdx.y walk rows: short rows (a
// decode append's 256-byte head row) still fill whole warps because a block covers several rows.
template <class V>
__global__ void __launch_bounds__(256)
    copy_rows_kernel(V* __restrict__ dst, const V* __restrict__ src, RowsArgs a) {
  const int64_t step = int64_t{gridDim.x} * blockDim.x * kCopyIlp;
  for (int64_t r = int64_t{blockIdx.y} * blockDim.y + threadIdx.y; r < a.rows;
       r += int64_t{gridDim.y} * blockDim.y) {
    int64_t doff, soff;
    row_offsets(a, r, &doff, &soff);
    for (int64_t base = int64_t{blockIdx.x} * blockDim.x * kCopyIlp + threadIdx.x; base < a.inner;
         base += step) {
      V v[kCopyIlp];
#pragma unroll
      for (int j = 0; j < kCopyIlp; ++j) {
        const int64_t c = base + int64_t{j} * blockDim.x;
        if (c < a.inner) v[j] = src[soff + c];
      }
#pragma unroll
      for (int j = 0; j < kCopyIlp; ++j) {
        const int64_t c = base + int64_t{j} * blockDim.x;
        if (c < a.inner) dst[doff + c] = v[j];
      }
    }
  }
}

// The pitched 2-D copy with a tapered tail: rows of `inner` units (a multiple of kTaperBig), cut
// into big tiles (256 threads x 4 units: 16 KB at 16-byte units, as kv_2d's blocks) and then, for
// the last `n_small` tiles, small ones (256 threads x 1 unit). Blocks are dispatched in index
// order, so the final waves, which leave SMs idle while the last blocks drain, run blocks a
// quarter as long. A tile never crosses a row (kTaperBig divides `inner`).
inline constexpr int kTaperBig = 256 * 4, kTaperSmall = 256;
struct TaperArgs {
  int64_t inner;       // units per row
  int64_t dst_stride;  // units between rows
  int64_t src_stride;
  int64_t n_big;  // big tiles first, small ones after
};

template <class V>
__global__ void __launch_bounds__(256)
    copy_rows_tapered_kernel(V* __restrict__ dst, const V* __restrict__ src, TaperArgs a) {
  const int64_t b = blockIdx.x;
  const bool big = b < a.n_big;
  const int64_t u0 = big ? b * kTaperBig : a.n_big * kTaperBig + (b - a.n_big) * kTaperSmall;
  const int64_t r = u0 / a.inner, c0 = u0 - r * a.inner + threadIdx.x;
  const V* s = src + r * a.src_stride + c0;
  V* d = dst + r * a.dst_stride + c0;
  if (big) {
    V v[kTaperBig / 256];
#pragma unroll
    for (int j = 0; j < kTaperBig / 256; ++j) v[j] = s[j * 256];
#pragma unroll
    for (int j = 0; j < kTaperBig / 256; ++j) d[j * 256] = v[j];
  } else {
    d[0] = s[0];
  }
}

// Sub-byte windows that start or end inside a byte. Each thread owns one destination byte of a
// row and writes it once: the window's bits come from the source (which may sit at a different
// bit phase), the other bits of that byte are kept. No byte has two writers, so no atomics and no
// read-modify-write race. Strides in bytes.
struct MergeArgs {
  RowsArgs rows;       // `inner` = destination bytes the window touches per row
  int64_t first_byte;  // first touched byte within a destination row
  int64_t bit_offset;  // window start within a destination row, in bits
  int64_t nbits;       // window length in bits
};

// (A template only so that including this header from several .cu files defines it once.)
template <class Byte = uint8_t>
__global__ void __launch_bounds__(256)
    merge_bits_kernel(Byte* __restrict__ dst, const Byte* __restrict__ src, MergeArgs m) {
  const RowsArgs& a = m.rows;
  for (int64_t r = int64_t{blockIdx.y} * blockDim.y + threadIdx.y; r < a.rows;
       r += int64_t{gridDim.y} * blockDim.y) {
    int64_t doff, soff;
    row_offsets(a, r, &doff, &soff);
    for (int64_t c0 = int64_t{blockIdx.x} * blockDim.x * kMergeIlp + threadIdx.x; c0 < a.inner;
         c0 += int64_t{gridDim.x} * blockDim.x * kMergeIlp)
#pragma unroll
      for (int j = 0; j < kMergeIlp; ++j) {
        const int64_t c = c0 + int64_t{j} * blockDim.x;
        if (c >= a.inner) break;
        const int64_t byte_bit = (m.first_byte + c) * 8;
        const int64_t lo = max(byte_bit, m.bit_offset);
        const int64_t hi = min(byte_bit + 8, m.bit_offset + m.nbits);
        const int width = static_cast<int>(hi - lo);
        const int64_t sbit = lo - m.bit_offset;
        const int shift = static_cast<int>(sbit & 7);
        const Byte* s = src + soff + (sbit >> 3);
        uint32_t v = s[0];
        if (shift + width > 8) v |= uint32_t{s[1]} << 8;  // only when the bits straddle
        const uint32_t ones = (1u << width) - 1;
        v = ((v >> shift) & ones) << (lo - byte_bit);
        Byte* d = dst + doff + m.first_byte + c;
        if (width == 8) {
          *d = static_cast<Byte>(v);
        } else {
          const uint32_t mask = ones << (lo - byte_bit);
          *d = static_cast<Byte>((*d & ~mask) | v);
        }
      }
  }
}

// kv_append: row r = (b, h, t); every row of batch b goes to position positions[b] + t. A row is
// `inner` units made of runs of `upe` contiguous units (one run per row when the head dimension
// is contiguous on both sides). Strides in units of V, position/flag strides in elements.
struct KvArgs {
  int64_t batch, heads, tokens, max_len;
  int64_t inner, upe;
  int64_t c_b, c_h, c_l, c_e;
  int64_t s_b, s_h, s_t, s_e;
  int64_t pos_stride, rej_stride;
};

template <class V, class P>
__global__ void __launch_bounds__(256)
    kv_append_kernel(V* __restrict__ cache, const V* __restrict__ src, const P* __restrict__ pos,
                     int32_t* __restrict__ rejected, KvArgs a) {
  const int64_t flat = (int64_t{blockIdx.y} * gridDim.x + blockIdx.x) * (blockDim.x * blockDim.y) +
                       threadIdx.y * blockDim.x + threadIdx.x;
  if (flat < a.batch) {  // the launch has at least `batch` threads; each flag written every run
    const int64_t p = static_cast<int64_t>(pos[flat * a.pos_stride]);
    rejected[flat * a.rej_stride] = (p < 0 || p > a.max_len - a.tokens) ? 1 : 0;
  }
  const int64_t rows = a.batch * a.heads * a.tokens;
  for (int64_t r = int64_t{blockIdx.y} * blockDim.y + threadIdx.y; r < rows;
       r += int64_t{gridDim.y} * blockDim.y) {
    const int64_t t = r % a.tokens;
    const int64_t bh = r / a.tokens;
    const int64_t h = bh % a.heads;
    const int64_t b = bh / a.heads;
    const int64_t p = static_cast<int64_t>(pos[b * a.pos_stride]);
    if (p < 0 || p > a.max_len - a.tokens) continue;  // reported above, never written
    const int64_t doff = b * a.c_b + h * a.c_h + (p + t) * a.c_l;
    const int64_t soff = b * a.s_b + h * a.s_h + t * a.s_t;
    if (a.upe == a.inner) {
      for (int64_t c = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; c < a.inner;
           c += int64_t{gridDim.x} * blockDim.x)
        cache[doff + c] = src[soff + c];
    } else {
      for (int64_t c = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; c < a.inner;
           c += int64_t{gridDim.x} * blockDim.x) {
        const int64_t e = c / a.upe, part = c - e * a.upe;
        cache[doff + e * a.c_e + part] = src[soff + e * a.s_e + part];
      }
    }
  }
}

}  // namespace baracuda::write_slice_cuda
