// Tensor maps for the sm_90 bulk tensor copies (TMA): the driver's encoder, reached through the
// runtime's entry-point query so that nothing links libcuda. Include only from .cu files.
#pragma once

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>

#include "baracuda/core/status.hpp"
#include "baracuda/core/tensor.hpp"

namespace baracuda::cuda {

// The encoder's element type of a device element type (float, __half or __nv_bfloat16).
template <class T>
constexpr CUtensorMapDataType tensor_map_dtype() {
  if constexpr (std::is_same_v<T, float>) {
    return CU_TENSOR_MAP_DATA_TYPE_FLOAT32;
  } else if constexpr (std::is_same_v<T, __half>) {
    return CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  } else {
    static_assert(std::is_same_v<T, __nv_bfloat16>, "a tensor map of float, __half or bf16");
    return CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  }
}

// cuTensorMapEncodeTiled, or null where the driver lacks it (callers then take another kernel).
inline PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encode_fn() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault,
                                         &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess)
      f = nullptr;
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f);
  }();
  return fn;
}

// The rules of a 4-d view that make_rows_map can describe: 16-byte aligned base, a unit-stride
// innermost dim, every other used stride a positive multiple of 16 bytes below 2^40 (elements of
// elem_bytes bytes).
template <class Ptr>
Status check_tma_rows(std::string_view who, std::string_view arg, const BasicTensor<Ptr>& t,
                      int elem_bytes = 2) {
  const std::string op = std::string(who) + ": ";
  if (reinterpret_cast<uintptr_t>(t.data) % 16 != 0)
    return Error::misaligned(op + std::string(arg) + ": data is not 16-byte aligned");
  if (t.stride[3] != 1 && t.shape[3] > 1)
    return Error::unsupported(op + std::string(arg) + ": stride[3]=" + std::to_string(t.stride[3]) +
                              ": the innermost dim must be unit-stride");
  for (int i = 0; i < 3; ++i) {
    if (t.shape[i] <= 1) continue;
    int64_t bytes = 0;
    if (t.stride[i] <= 0 || !checked_mul(t.stride[i], elem_bytes, &bytes) || bytes % 16 != 0 ||
        bytes >= (int64_t{1} << 40))
      return Error::misaligned(op + std::string(arg) + ": stride[" + std::to_string(i) +
                               "]=" + std::to_string(t.stride[i]) +
                               " elements: TMA needs a positive multiple of 16 bytes");
  }
  return {};
}

// A 4-d tensor map over a [P, Q, R, C] view checked by check_tma_rows (dims innermost first: C,
// R, Q, P), boxes of `row_bytes` (128 or 64) x `rows` along R x `heads` along Q (landing as
// `heads` blocks of `rows` rows), swizzled by row_bytes, zeros out of bounds. Attention passes
// [B, H, L, D]; a [B, L, H, D] tensor goes as its permuted view.
inline Status make_rows_map(std::string_view who, CUtensorMap* map, CUtensorMapDataType dt,
                            const ConstTensor& t, uint32_t rows, int elem_bytes = 2,
                            int row_bytes = 128, uint32_t heads = 1) {
  if (!tensor_map_encode_fn())
    return Error::library(std::string(who) + ": cuTensorMapEncodeTiled is unavailable",
                          "cuda_driver", 0);
  const cuuint64_t dims[4] = {
      static_cast<cuuint64_t>(t.shape[3]), static_cast<cuuint64_t>(t.shape[2]),
      static_cast<cuuint64_t>(t.shape[1]), static_cast<cuuint64_t>(t.shape[0])};
  // Size-1 axes: any valid stride (theirs is never used); take one past the tensor's extent.
  int64_t extent = 16;
  for (int i = 0; i < 3; ++i)
    if (t.shape[i] > 1) extent = std::max(extent, t.stride[i] * elem_bytes * t.shape[i]);
  extent = (extent + 15) / 16 * 16;
  auto st = [&](int i) {
    return static_cast<cuuint64_t>(t.shape[i] > 1 ? t.stride[i] * elem_bytes : extent);
  };
  const cuuint64_t strides[3] = {st(2), st(1), st(0)};
  const cuuint32_t box[4] = {static_cast<cuuint32_t>(row_bytes / elem_bytes), rows, heads, 1};
  const cuuint32_t estr[4] = {1, 1, 1, 1};
  const CUresult r = tensor_map_encode_fn()(
      map, dt, 4, const_cast<void*>(t.data), dims, strides, box, estr,
      CU_TENSOR_MAP_INTERLEAVE_NONE,
      row_bytes == 64 ? CU_TENSOR_MAP_SWIZZLE_64B : CU_TENSOR_MAP_SWIZZLE_128B,
      CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    return Error::library(std::string(who) + ": cuTensorMapEncodeTiled failed", "cuda_driver",
                          static_cast<int64_t>(r));
  return {};
}

}  // namespace baracuda::cuda
