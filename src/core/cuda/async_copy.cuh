// cp.async (sm_80+) global -> shared copies for device code: the 16-byte copy with zero fill,
// group commit and the waits. Include only from .cu files.
#pragma once

namespace baracuda::cuda {

// Copies 16 bytes from global `gmem` to shared `smem` without registers; src_bytes < 16 fills the
// rest with zeros (0: a zero vector, gmem is not read).
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, int src_bytes = 16) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(src_bytes)
               : "memory");
}
// The 16-byte copy through L1 (.ca): for data several warps of a CTA read at about the same time,
// which then leaves L2 once per CTA instead of once per warp.
__device__ __forceinline__ void cp_async16_l1(void* smem, const void* gmem) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem) : "memory");
}
// The 8-byte form (a lane's 4 16-bit elements).
__device__ __forceinline__ void cp_async8(void* smem, const void* gmem) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8;\n" ::"r"(s), "l"(gmem) : "memory");
}
// The 4-byte form (any 4-byte aligned destination, e.g. rows of an odd-pitched f32 tile).
__device__ __forceinline__ void cp_async4(void* smem, const void* gmem, int src_bytes = 4) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(s), "l"(gmem), "r"(src_bytes)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
// Waits until at most kPending of this thread's committed groups are still in flight. The copies
// become visible to other threads after their own wait and a barrier.
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}
// The same with a run-time count (the PTX takes an immediate): 0..5, larger counts wait as 5.
__device__ __forceinline__ void cp_async_wait_pending(int pending) {
  switch (pending) {
    case 0:
      return cp_async_wait<0>();
    case 1:
      return cp_async_wait<1>();
    case 2:
      return cp_async_wait<2>();
    case 3:
      return cp_async_wait<3>();
    case 4:
      return cp_async_wait<4>();
    default:
      return cp_async_wait<5>();
  }
}
__device__ __forceinline__ void cp_async_wait_all() {
  asm volatile("cp.async.wait_all;\n" ::: "memory");
}

}  // namespace baracuda::cuda
