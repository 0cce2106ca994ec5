// sm_90a warpgroup MMA (wgmma) plumbing shared by the kernels that issue it (attention_hopper, the
// ssd forward): the fence / commit / wait around the asynchronous products, the register pin that
// keeps the compiler from moving accumulator accesses across them, and shared-memory matrix
// descriptors. The instructions themselves, by shape and type, are in
// ops/attention_hopper/fa3_wgmma.cuh. Include only from .cu files.
#pragma once

#include <cstdint>

namespace baracuda::cuda {

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
// Until at most N committed groups are still in flight.
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Pins accumulator registers in program order around the asynchronous wgmma (the compiler must
// not move their reads or writes across a fence or wait).
template <int N>
__device__ __forceinline__ void fence_regs(float (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}
#endif

// Shared-memory matrix descriptor: start address, leading and stride byte offsets, layout code in
// bits 62-63 (1: 128-byte swizzle, 2: 64-byte, 3: 32-byte).
__host__ __device__ constexpr uint64_t desc_swizzled(uint32_t addr, uint32_t lbo, uint32_t sbo,
                                                     uint64_t layout) {
  return static_cast<uint64_t>((addr & 0x3FFFF) >> 4) | (static_cast<uint64_t>(lbo >> 4) << 16) |
         (static_cast<uint64_t>(sbo >> 4) << 32) | (layout << 62);
}

}  // namespace baracuda::cuda
