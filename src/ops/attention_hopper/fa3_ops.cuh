// The generated wgmma instructions (fa3_wgmma.cuh) by element type, bf16 or f16: the shapes our
// sm_90a kernels issue (attention_hopper's fa3 forward and backward, the ssd forward).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "ops/attention_hopper/fa3_wgmma.cuh"

namespace baracuda::attention_hopper::fa3 {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
// The wgmma shapes by element type (bf16 or f16).
template <class T>
struct Ops {
  static constexpr bool kHalf = std::is_same_v<T, __half>;
  static __device__ __forceinline__ void ss128(float (&d)[64], uint64_t a, uint64_t b, int s) {
    if constexpr (kHalf)
      ss_m64n128k16_f16(d, a, b, s);
    else
      ss_m64n128k16_bf16(d, a, b, s);
  }
  static __device__ __forceinline__ void ss64(float (&d)[32], uint64_t a, uint64_t b, int s) {
    if constexpr (kHalf)
      ss_m64n64k16_f16(d, a, b, s);
    else
      ss_m64n64k16_bf16(d, a, b, s);
  }
  static __device__ __forceinline__ void tt64(float (&d)[32], uint64_t a, uint64_t b, int s) {
    if constexpr (kHalf)
      ss_tt_m64n64k16_f16(d, a, b, s);
    else
      ss_tt_m64n64k16_bf16(d, a, b, s);
  }
  // S = A B^T over N = 64 or 128 keys.
  template <int N>
  static __device__ __forceinline__ void ss(float (&d)[N / 2], uint64_t a, uint64_t b, int s) {
    if constexpr (N == 64)
      ss64(d, a, b, s);
    else
      ss128(d, a, b, s);
  }
  // D = 64, 128 or 256 columns, accumulating.
  template <int D>
  static __device__ __forceinline__ void rs(float (&d)[D / 2], const uint32_t (&a)[4], uint64_t b) {
    if constexpr (kHalf && D == 64)
      rs_m64n64k16_f16(d, a, b, 1);
    else if constexpr (kHalf && D == 128)
      rs_m64n128k16_f16(d, a, b, 1);
    else if constexpr (kHalf)
      rs_m64n256k16_f16(d, a, b, 1);
    else if constexpr (D == 64)
      rs_m64n64k16_bf16(d, a, b, 1);
    else if constexpr (D == 128)
      rs_m64n128k16_bf16(d, a, b, 1);
    else
      rs_m64n256k16_bf16(d, a, b, 1);
  }
};
#endif
}  // namespace baracuda::attention_hopper::fa3
