// The `flat` kernels of write_slice (see engine.hpp): a flat copy over every unit of the window
// and the word-wide sub-byte merge. No 64-bit `/` or `%` anywhere: indices decompose with FastDiv.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "ops/write_slice/fastdiv.hpp"
#include "ops/write_slice/kernels.cuh"

namespace baracuda::write_slice_cuda {

using write_slice_detail::FastDiv;

// Outer axes of a row index (outermost first): extents as divisors, strides in units (copy) or
// bytes (merge). Axis 0 needs no divisor: what is left of the row index after the inner axes.
struct OuterAxes {
  int rank;
  FastDiv extent[kMaxAxes];
  int64_t dst_stride[kMaxAxes];
  int64_t src_stride[kMaxAxes];
};

__device__ __forceinline__ void outer_offsets(const OuterAxes& a, uint64_t r, int64_t* d,
                                              int64_t* s) {
  int64_t doff = 0, soff = 0;
  for (int k = a.rank - 1; k > 0; --k) {
    uint64_t q, i;
    a.extent[k].divmod(r, &q, &i);
    doff += static_cast<int64_t>(i) * a.dst_stride[k];
    soff += static_cast<int64_t>(i) * a.src_stride[k];
    r = q;
  }
  if (a.rank > 0) {
    doff += static_cast<int64_t>(r) * a.dst_stride[0];
    soff += static_cast<int64_t>(r) * a.src_stride[0];
  }
  *d = doff;
  *s = soff;
}

// Streaming (evict-first) accesses: every byte is touched once, so caching it only evicts data
// the caller may still want (cached accesses measured no faster on the H100 at b292e38).
template <class T>
__device__ __forceinline__ T load_unit(const T* p) {
  return __ldcs(p);
}
template <class T>
__device__ __forceinline__ void store_unit(T* p, T v) {
  __stcs(p, v);
}

inline constexpr int kFlatThreads = 256;
inline constexpr int kFlatIlp = 8;  // units in flight per thread (8 x 16 B)

// The window as `total` = rows x inner units. Block b owns the contiguous span
// [b * span, (b + 1) * span): equal work per block on a one-wave grid, so no tail of late blocks
// and no block-scheduling limit. Within a span each thread loads kFlatIlp units (spaced
// kFlatThreads apart: every warp access is coalesced) before it stores any.
struct FlatArgs {
  OuterAxes outer;
  FastDiv inner;
  int64_t total;
  int64_t span;  // a multiple of kFlatThreads
};

template <class V>
__global__ void __launch_bounds__(kFlatThreads)
    copy_flat_kernel(V* __restrict__ dst, const V* __restrict__ src, FlatArgs a) {
  const int64_t begin = int64_t{blockIdx.x} * a.span;
  const int64_t end = min(begin + a.span, a.total);
  for (int64_t base = begin + threadIdx.x; base < end; base += kFlatThreads * kFlatIlp) {
    V v[kFlatIlp];
    int64_t doff[kFlatIlp];
#pragma unroll
    for (int j = 0; j < kFlatIlp; ++j) {
      const int64_t f = base + int64_t{j} * kFlatThreads;
      if (f < end) {
        uint64_t r, c;
        a.inner.divmod(static_cast<uint64_t>(f), &r, &c);
        int64_t soff;
        outer_offsets(a.outer, r, &doff[j], &soff);
        doff[j] += static_cast<int64_t>(c);
        v[j] = load_unit(src + soff + static_cast<int64_t>(c));
      }
    }
#pragma unroll
    for (int j = 0; j < kFlatIlp; ++j)
      if (base + int64_t{j} * kFlatThreads < end) store_unit(dst + doff[j], v[j]);
  }
}

// Sub-byte merge, word-wide. Each thread owns one 4-byte-aligned destination word of a row's
// touched bytes [first_byte, last_byte): it builds the word's 32 window bits from two aligned
// source words with one funnel shift and stores the whole word when it owns all 4 bytes, else
// (row ends: the word's other bytes may belong to another row) only its own bytes, one by one.
// Every destination byte still has exactly one writer; bits outside the window are kept.
// Strides in bytes.
inline constexpr int kMergeWordIlp = 4;

struct MergeWordArgs {
  OuterAxes outer;
  int64_t rows;
  int64_t words;                  // most aligned words a row's touched bytes can span
  int64_t first_byte, last_byte;  // touched bytes of a destination row
  int64_t bit_offset, nbits;      // the window within a destination row, in bits
  int64_t src_bytes;              // readable bytes of a source row: ceil(nbits / 8)
};

// The aligned source word at `addr`, reading only bytes inside [lo, hi) (the others are zero and
// never used): a 4-byte load in the row's body, byte loads at its ends.
__device__ __forceinline__ uint32_t source_word(uintptr_t addr, uintptr_t lo, uintptr_t hi) {
  if (addr >= lo && addr + 4 <= hi) return load_unit(reinterpret_cast<const uint32_t*>(addr));
  uint32_t w = 0;
#pragma unroll
  for (int i = 0; i < 4; ++i)
    if (addr + i >= lo && addr + i < hi)
      w |= uint32_t{*reinterpret_cast<const uint8_t*>(addr + i)} << (8 * i);
  return w;
}

template <class Byte = uint8_t>  // a template only so that several .cu files may include it
__global__ void __launch_bounds__(256)
    merge_words_kernel(Byte* __restrict__ dst, const Byte* __restrict__ src, MergeWordArgs m) {
  for (int64_t r = int64_t{blockIdx.y} * blockDim.y + threadIdx.y; r < m.rows;
       r += int64_t{gridDim.y} * blockDim.y) {
    int64_t doff, soff;
    outer_offsets(m.outer, static_cast<uint64_t>(r), &doff, &soff);
    const auto drow = reinterpret_cast<uintptr_t>(dst + doff);
    const auto srow = reinterpret_cast<uintptr_t>(src + soff);
    const uintptr_t dlo = drow + m.first_byte, dhi = drow + m.last_byte;
    const uintptr_t shi = srow + m.src_bytes;
    for (int64_t w0 = int64_t{blockIdx.x} * blockDim.x * kMergeWordIlp + threadIdx.x; w0 < m.words;
         w0 += int64_t{gridDim.x} * blockDim.x * kMergeWordIlp)
#pragma unroll
      for (int j = 0; j < kMergeWordIlp; ++j) {
        const int64_t w = w0 + int64_t{j} * blockDim.x;
        const uintptr_t a = (dlo & ~uintptr_t{3}) + 4 * static_cast<uintptr_t>(w);
        if (w >= m.words || a >= dhi) break;
        // Window bit at the word's bit 0 (negative at the row's head), and its source bit.
        const int64_t x0 = static_cast<int64_t>(a - drow) * 8 - m.bit_offset;
        const int64_t sbit = static_cast<int64_t>(srow) * 8 + x0;
        const uintptr_t sw = static_cast<uintptr_t>(sbit >> 5) * 4;
        const uint32_t lo = source_word(sw, srow, shi);
        const uint32_t hi = source_word(sw + 4, srow, shi);
        const uint32_t v = __funnelshift_r(lo, hi, static_cast<uint32_t>(sbit & 31));
        const int b0 = x0 < 0 ? static_cast<int>(-x0) : 0;
        const int b1 = m.nbits - x0 < 32 ? static_cast<int>(m.nbits - x0) : 32;
        const uint32_t mask = b1 - b0 == 32 ? ~0u : ((1u << (b1 - b0)) - 1) << b0;
        if (a >= dlo && a + 4 <= dhi) {
          auto* d = reinterpret_cast<uint32_t*>(a);
          store_unit(d, mask == ~0u ? v : (*d & ~mask) | (v & mask));
        } else {
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            if (a + i < dlo || a + i >= dhi) continue;
            auto* d = reinterpret_cast<uint8_t*>(a + i);
            const uint32_t m8 = (mask >> (8 * i)) & 0xffu, b = (v >> (8 * i)) & 0xffu;
            *d = static_cast<uint8_t>(m8 == 0xffu ? b : ((*d & ~m8) | (b & m8)));
          }
        }
      }
  }
}

}  // namespace baracuda::write_slice_cuda
