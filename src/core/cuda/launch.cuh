// Helpers for CUDA translation units: device element types per dtype, the stream of a launch,
// and turning launch failures into baracuda errors. Include only from .cu files.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>

#include "baracuda/core/plan.hpp"
#include "core/cuda/check.hpp"

namespace baracuda::cuda {

inline cudaStream_t stream_of(const LaunchContext& ctx) {
  return static_cast<cudaStream_t>(ctx.stream.cuda_handle());
}

inline Error cuda_error(std::string_view op, std::string_view what, cudaError_t e) {
  return Error::cuda(std::string(op) + ": " + std::string(what) + ": " + cudaGetErrorName(e) +
                         " (" + cudaGetErrorString(e) + ")",
                     static_cast<int>(e));
}

// Call right after a launch: reports configuration errors (never waits for the kernel).
inline Status check_launch(std::string_view op, std::string_view kernel) {
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return cuda_error(op, kernel, e);
  return {};
}

// Raises a kernel's dynamic shared memory limit on the current device to at least smem bytes.
// The default limit is 48 KB minus the kernel's static shared memory, so any non-zero request may
// need it (a 17 KB request beside 32 KB of static arrays does). The attribute is a driver call and
// plans launch the same kernels on every run, so each (device, kernel) is raised only when a
// launch needs more than it was given before.
inline cudaError_t ensure_dynamic_smem(const void* kernel, size_t smem) {
  if (smem == 0) return cudaSuccess;
  int device = 0;
  if (const cudaError_t e = cudaGetDevice(&device); e != cudaSuccess) return e;
  static std::mutex mutex;
  static std::map<std::pair<int, const void*>, size_t> granted;
  const std::lock_guard<std::mutex> lock(mutex);
  size_t& have = granted[{device, kernel}];
  if (smem <= have) return cudaSuccess;
  if (const cudaError_t e = cudaFuncSetAttribute(
          kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
      e != cudaSuccess)
    return e;
  have = smem;
  return cudaSuccess;
}

// Allows a kernel clusters of more than 8 CTAs (sm_90's non-portable sizes) on the current
// device, once per (device, kernel): the same driver-call economy as ensure_dynamic_smem.
inline cudaError_t ensure_nonportable_clusters(const void* kernel) {
  int device = 0;
  if (const cudaError_t e = cudaGetDevice(&device); e != cudaSuccess) return e;
  static std::mutex mutex;
  static std::set<std::pair<int, const void*>> allowed;
  const std::lock_guard<std::mutex> lock(mutex);
  if (allowed.count({device, kernel})) return cudaSuccess;
  if (const cudaError_t e =
          cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
      e != cudaSuccess)
    return e;
  allowed.insert({device, kernel});
  return cudaSuccess;
}

// make(), computed once per key for the process (thread-safe): the cache behind the per-device
// queries below, whose keys start with the device (one cache per call site: Make is its lambda).
template <class Key, class Make>
auto memoized(const Key& key, Make&& make) {
  using Value = decltype(make());
  static std::mutex mutex;
  static std::map<Key, Value> known;
  const std::lock_guard<std::mutex> lock(mutex);
  if (const auto it = known.find(key); it != known.end()) return it->second;
  return known.emplace(key, make()).first->second;
}

// The attributes of kernel as loaded on the current device (binaryVersion: the cubin's arch, which
// differs between two GPUs of one process), queried once per (device, kernel); nullopt where the
// query fails (its error cleared).
inline std::optional<cudaFuncAttributes> func_attributes(const void* kernel) {
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) {
    (void)cudaGetLastError();
    return std::nullopt;
  }
  return memoized(std::make_pair(device, kernel), [&]() -> std::optional<cudaFuncAttributes> {
    cudaFuncAttributes a{};
    if (cudaFuncGetAttributes(&a, kernel) == cudaSuccess) return a;
    (void)cudaGetLastError();
    return std::nullopt;
  });
}

// CTAs of kernel (threads each, smem bytes of dynamic shared memory) that one SM of the current
// device holds at once, 0 where the calculator fails; computed once per (device, kernel, shape):
// a per-process constant would be wrong for the second of two different GPUs.
inline int blocks_per_sm(const void* kernel, int threads, size_t smem) {
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return memoized(std::make_tuple(device, kernel, threads, smem), [&] {
    int n = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, threads, smem) == cudaSuccess)
      return n;
    (void)cudaGetLastError();  // a failed query leaves no error behind for the next launch
    return 0;
  });
}

// Launches kernel with smem bytes of dynamic shared memory (raising its limit where needed);
// either failure names op and the kernel.
template <class... Params, class... Args>
Status launch_with_smem(std::string_view op, std::string_view name, void (*kernel)(Params...),
                        dim3 grid, dim3 block, size_t smem, cudaStream_t st, Args&&... args) {
  if (const cudaError_t e = ensure_dynamic_smem(reinterpret_cast<const void*>(kernel), smem);
      e != cudaSuccess)
    return cuda_error(op, std::string(name) + ": cudaFuncSetAttribute", e);
  kernel<<<grid, block, smem, st>>>(std::forward<Args>(args)...);
  return check_launch(op, name);
}

// Launches a kernel that reads what the previous kernel on the stream wrote, as a programmatic
// dependent launch where its loaded binary is sm_90+ code: that kernel must begin with
// griddepcontrol.wait (which waits for the previous grid to complete and its writes to be
// visible) before it touches global memory, and its CTAs may become resident while the previous
// kernel still runs (from the previous kernel's griddepcontrol.launch_dependents on, or its end),
// hiding the launch latency. Elsewhere (sm_80 binaries, whose wait is compiled out) an ordinary
// launch. smem bytes of dynamic shared memory (its limit raised where needed). Failures name op
// and kernel.
template <auto Kernel, class... Args>
Status launch_dependent(std::string_view op, std::string_view name, dim3 grid, dim3 block,
                        size_t smem, cudaStream_t st, Args&&... args) {
  const void* fn = reinterpret_cast<const void*>(Kernel);
  if (const cudaError_t e = ensure_dynamic_smem(fn, smem); e != cudaSuccess)
    return cuda_error(op, std::string(name) + ": cudaFuncSetAttribute", e);
  const auto fa = func_attributes(fn);
  const bool pdl = fa && fa->binaryVersion >= 90;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid, cfg.blockDim = block, cfg.dynamicSmemBytes = smem, cfg.stream = st;
  cfg.attrs = attr, cfg.numAttrs = pdl ? 1 : 0;
  if (const cudaError_t e = cudaLaunchKernelEx(&cfg, Kernel, std::forward<Args>(args)...);
      e != cudaSuccess)
    return cuda_error(op, name, e);
  return check_launch(op, name);
}

// Device storage type for each dtype (kernels are templates over these).
template <DType T>
struct device_type;
template <>
struct device_type<DType::f16> {
  using type = __half;
};
template <>
struct device_type<DType::bf16> {
  using type = __nv_bfloat16;
};
template <>
struct device_type<DType::f32> {
  using type = float;
};
template <>
struct device_type<DType::f32_strict> {
  using type = float;
};
template <>
struct device_type<DType::f64> {
  using type = double;
};
template <>
struct device_type<DType::i32> {
  using type = int32_t;
};
template <>
struct device_type<DType::i64> {
  using type = int64_t;
};
template <>
struct device_type<DType::boolean> {
  using type = uint8_t;
};
template <>
struct device_type<DType::s8> {
  using type = int8_t;
};
template <>
struct device_type<DType::u8> {
  using type = uint8_t;
};
template <>
struct device_type<DType::e4m3> {
  using type = __nv_fp8_e4m3;
};
template <>
struct device_type<DType::e5m2> {
  using type = __nv_fp8_e5m2;
};
template <DType T>
using device_t = typename device_type<T>::type;

// f32 <-> storage conversions usable in templates over the device types.
template <class T>
__device__ __forceinline__ float to_float(T v) {
  return static_cast<float>(v);
}
template <>
__device__ __forceinline__ float to_float<__half>(__half v) {
  return __half2float(v);
}
template <>
__device__ __forceinline__ float to_float<__nv_bfloat16>(__nv_bfloat16 v) {
  return __bfloat162float(v);
}
template <class T>
__device__ __forceinline__ T from_float(float v) {
  return static_cast<T>(v);
}
template <>
__device__ __forceinline__ __half from_float<__half>(float v) {
  return __float2half_rn(v);
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

inline int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

}  // namespace baracuda::cuda
