// The XOR swizzle of the attention kernels' shared-memory tiles and its ldmatrix addressing, for
// device code and for the host test that checks one against the other (attention_test.cpp).
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define BARACUDA_SWZ_FN __host__ __device__ __forceinline__
#else
#define BARACUDA_SWZ_FN inline
#endif

namespace baracuda::attention::kernels {

// Shared tiles are [rows][D] with the 16-byte chunk c of row r stored at chunk c ^ (r % 8), so the
// eight row addresses of every ldmatrix hit eight different bank groups.
template <int D>
BARACUDA_SWZ_FN int swz(int r, int col) {
  return r * D + ((((col >> 3) ^ r) & 7) | ((col >> 3) & ~7)) * 8 + (col & 7);
}
// ldmatrix addresses into a swz tile without index math per load (the d128 forward kernel spent
// ~45% of its instructions on it: IMAD/LOP3/LEA around every ldmatrix, ncu at be319c2). For row
// R0 + rl (R0 a multiple of 8) and 16-byte chunk C0 + cl (C0 even, cl in {0, 1}), swz's byte
// offset is [R0 * row + (C0 & ~7) * 16] + ((rl * row + ((cl ^ rl) & 7) * 16) ^ (C0 & 7) * 16).
// The bracket has bits 4-6 clear, so it adds after the XOR, and a 128-byte aligned tile keeps
// that true of the whole address: four bases per lane and tile (one per C0 & 7) then make every
// load a base plus a compile-time offset.
struct SwzBases {
  uint32_t v[4];
};
template <class T, int D>
BARACUDA_SWZ_FN SwzBases swz_bases(uint32_t tile, int rl, int cl) {
  const uint32_t lane = tile + static_cast<uint32_t>(rl * D * static_cast<int>(sizeof(T))) +
                        (static_cast<uint32_t>((cl ^ rl) & 7) << 4);
  return {{lane, lane ^ 32u, lane ^ 64u, lane ^ 96u}};
}
template <class T, int D>
BARACUDA_SWZ_FN uint32_t swz_addr(const SwzBases& b, int r0, int c0) {
  return b.v[(c0 & 7) >> 1] + static_cast<uint32_t>(r0 * D * static_cast<int>(sizeof(T))) +
         static_cast<uint32_t>((c0 & ~7) * 16);
}

}  // namespace baracuda::attention::kernels

#undef BARACUDA_SWZ_FN
