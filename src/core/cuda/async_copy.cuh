// cp.async (sm_80+) global -> shared copies for device code: the 16-byte copy with zero fill,
// group commit and the waits; the sm_90 bulk reduction, its waits and the proxy fence; sm_90
// mbarriers, bulk copies and the cluster barrier / distributed shared memory. Include only from .cu
// files.
#pragma once

#include <cstdint>

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

// ---- sm_90 bulk (TMA) operations without a tensor map; callers select them only on sm_90+ ----
// Bulk reduction shared -> global: global[i] += shared[i] over `bytes` of f32 (the TMA unit does
// the adds in L2); size and both addresses multiples of 16 bytes. Each call is one bulk group.
__device__ __forceinline__ void bulk_reduce_add_f32(float* dst, uint32_t src, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n"
      "cp.async.bulk.commit_group;\n" ::"l"(reinterpret_cast<uint64_t>(dst)),
      "r"(src), "r"(bytes)
      : "memory");
#else
  __trap();
#endif
}
// Until at most N of this thread's bulk groups are incomplete: kSourceRead, until their shared-
// memory sources have been read (the buffer may be rewritten); otherwise until their writes are
// done.
template <int N, bool kSourceRead>
__device__ __forceinline__ void bulk_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if constexpr (kSourceRead)
    asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory");
  else
    asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(N) : "memory");
#else
  __trap();
#endif
}
// Generic-proxy shared-memory writes become visible to the async proxy (wgmma, TMA).
__device__ __forceinline__ void fence_proxy_async() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#else
  __trap();
#endif
}

// The same between this thread's generic-proxy global accesses and its async-proxy ones (bulk
// reductions): e.g. a count read before the bulk reduction it lets through, or a completed bulk
// reduction before the count's raise (core/cuda/flags.cuh's count hand-off).
__device__ __forceinline__ void fence_proxy_async_global() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("fence.proxy.async.global;\n" ::: "memory");
#else
  __trap();
#endif
}

// ---- sm_90 mbarriers, bulk copies and thread-block clusters ----------------------------------
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define BARACUDA_SM90_ASM(...) asm volatile(__VA_ARGS__)
#else
#define BARACUDA_SM90_ASM(...) __trap()
#endif
__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  BARACUDA_SM90_ASM("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
// Makes the mbarriers this thread initialized visible to the async proxy (TMA) and the cluster;
// before the barrier that publishes them.
__device__ __forceinline__ void mbar_init_fence() {
  BARACUDA_SM90_ASM("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
// The caller's arrival, announcing `bytes` of transactions (bulk copies) the phase waits for.
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
  BARACUDA_SM90_ASM("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar),
                    "r"(bytes)
                    : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  BARACUDA_SM90_ASM("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// Until the phase of parity `parity` has completed.
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  uint32_t done = 0;
  do {
    BARACUDA_SM90_ASM(
        "{\n.reg .pred p;\n"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (!done);
}
// Bulk copy global -> shared (no tensor map), completing on an mbarrier's transaction count; size
// and both addresses multiples of 16 bytes.
__device__ __forceinline__ void bulk_load(uint32_t dst, const void* src, uint32_t bytes,
                                          uint32_t bar) {
  BARACUDA_SM90_ASM(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::
          "r"(dst),
      "l"(reinterpret_cast<uint64_t>(src)), "r"(bytes), "r"(bar)
      : "memory");
}
// Bulk tensor copy of a 3-d box (coordinates innermost first) global -> shared through a tensor
// map (a __grid_constant__ kernel parameter), completing on an mbarrier; out-of-bounds elements
// read as zeros and still count toward the transaction bytes.
__device__ __forceinline__ void tma_load_3d(uint32_t dst, const void* map, uint32_t bar, int c0,
                                            int c1, int c2) {
  BARACUDA_SM90_ASM(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes "
      "[%0], [%1, {%2, %3, %4}], [%5];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(bar)
      : "memory");
}
// The same for a 4-d box (e.g. d, row, head, batch of a [B, H, L, D] view).
__device__ __forceinline__ void tma_load_4d(uint32_t dst, const void* map, uint32_t bar, int c0,
                                            int c1, int c2, int c3) {
  BARACUDA_SM90_ASM(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes "
      "[%0], [%1, {%2, %3, %4, %5}], [%6];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar)
      : "memory");
}
// Bulk copy shared -> global (no tensor map) as its own bulk group: size and both addresses
// multiples of 16 bytes; bulk_wait<0, true> before the source is rewritten or the CTA exits.
__device__ __forceinline__ void bulk_store(void* dst, uint32_t src, uint32_t bytes) {
  BARACUDA_SM90_ASM(
      "cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;\n"
      "cp.async.bulk.commit_group;\n" ::"l"(reinterpret_cast<uint64_t>(dst)),
      "r"(src), "r"(bytes)
      : "memory");
}
// Bulk tensor copy of a 4-d box shared -> global through a tensor map, as its own bulk group
// (bulk_wait<0, true> before the source is rewritten); the parts of the box outside the tensor
// are not written.
__device__ __forceinline__ void tma_store_4d(const void* map, uint32_t src, int c0, int c1, int c2,
                                             int c3) {
  BARACUDA_SM90_ASM(
      "cp.async.bulk.tensor.4d.global.shared::cta.bulk_group [%0, {%1, %2, %3, %4}], [%5];\n"
      "cp.async.bulk.commit_group;\n" ::"l"(reinterpret_cast<uint64_t>(map)),
      "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(src)
      : "memory");
}
// Named barrier `id` (1-15; 0 is __syncthreads') over `threads` threads (a multiple of 32).
__device__ __forceinline__ void named_barrier_sync(uint32_t id, uint32_t threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
// This CTA's rank in its cluster.
__device__ __forceinline__ uint32_t cluster_rank() {
  uint32_t r = 0;
  BARACUDA_SM90_ASM("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return r;
}
// The cluster barrier, split: every thread of the cluster arrives (release: its earlier writes,
// shared memory included, become visible to the threads that wait) and later waits (acquire) for
// the phase to complete. Each thread alternates arrive and wait; the whole warp executes both.
__device__ __forceinline__ void cluster_arrive() {
  BARACUDA_SM90_ASM("barrier.cluster.arrive.release.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void cluster_wait() {
  BARACUDA_SM90_ASM("barrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}
// The address of this CTA's shared-memory word `addr` in the CTA of cluster rank `rank`.
__device__ __forceinline__ uint32_t cluster_map(uint32_t addr, uint32_t rank) {
  uint32_t r = 0;
  BARACUDA_SM90_ASM("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(r) : "r"(addr), "r"(rank));
  return r;
}
// 16 bytes into the shared memory of a CTA of the cluster (`addr`, `bar`: cluster_map'ped),
// completing 16 bytes of transactions on that CTA's mbarrier `bar`: a push that needs no barrier
// between the CTAs, the receiver waits on its own mbarrier (mbar_wait).
__device__ __forceinline__ void st_async16(uint32_t addr, float4 v, uint32_t bar) {
  BARACUDA_SM90_ASM(
      "st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.b32 [%0], {%1, %2, %3, %4}, "
      "[%5];\n" ::"r"(addr),
      "r"(__float_as_uint(v.x)), "r"(__float_as_uint(v.y)), "r"(__float_as_uint(v.z)),
      "r"(__float_as_uint(v.w)), "r"(bar)
      : "memory");
}
#undef BARACUDA_SM90_ASM
// sm_90a: a warpgroup gives registers back / takes them (every thread of it executes the call).
template <int N>
__device__ __forceinline__ void setmaxnreg_dec() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
#else
  __trap();
#endif
}
template <int N>
__device__ __forceinline__ void setmaxnreg_inc() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
#else
  __trap();
#endif
}

}  // namespace baracuda::cuda
