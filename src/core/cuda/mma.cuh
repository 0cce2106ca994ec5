// Warp-level tensor-core primitives (sm_80+): ldmatrix fragment loads from shared memory, the
// m16n8k16 f16/bf16 MMA with f32 accumulation, and the f32 pair -> 16-bit pair packing its
// operands take. Include only from .cu files.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

namespace baracuda::cuda {

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Dynamic shared memory from its first 1024-byte boundary (128-byte swizzled tiles repeat every
// 1024 bytes, and TMA / wgmma address them from such a boundary): the shared-window address for
// the async proxies and the generic pointer to the same bytes. Request 1023 bytes more than used.
struct AlignedSmem {
  uint32_t addr;
  unsigned char* ptr;
  template <class U>
  __device__ __forceinline__ U* at(uint32_t offset) const {
    return reinterpret_cast<U*>(ptr + offset);
  }
};
__device__ __forceinline__ AlignedSmem align_smem_1024(unsigned char* raw) {
  const uint32_t a = smem_u32(raw), aligned = (a + 1023u) & ~1023u;
  return {aligned, raw + (aligned - a)};
}
// The kernel's dynamic shared memory so aligned (every extern __shared__ array names the same
// bytes; one name here spares each kernel its own).
__device__ __forceinline__ AlignedSmem dynamic_smem_1024() {
  extern __shared__ unsigned char baracuda_dynamic_smem[];
  return align_smem_1024(baracuda_dynamic_smem);
}

// Four 8x8 16-bit matrices; lane l gives the address of row l % 8 of matrix l / 8.
__device__ __forceinline__ void ldmatrix_x4(uint32_t addr, uint32_t& r0, uint32_t& r1, uint32_t& r2,
                                            uint32_t& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr));
}
// The same, each matrix transposed on the way (B operands stored [k][n]).
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t addr, uint32_t& r0, uint32_t& r1,
                                                  uint32_t& r2, uint32_t& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr));
}

// c (16x8 f32, this lane's four) += a (16x16, row) * b (16x8, col), T = __half or __nv_bfloat16.
template <class T>
__device__ __forceinline__ void mma16816(float* c, const uint32_t* a, uint32_t b0, uint32_t b1) {
  if constexpr (std::is_same_v<T, __half>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    static_assert(std::is_same_v<T, __nv_bfloat16>, "mma16816 takes f16 or bf16 operands");
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// One ldmatrix.x4 gives two n8 tiles of B (kTrans: .trans, for B stored [k][n]); then for each of
// the kM m16 A fragments a(m): c(m, 0) += a(m) B_0 and c(m, 1) += a(m) B_1. `a` returns a fragment
// (4 registers), `c` an accumulator (4 floats): the callers' tile layouts differ.
template <class T, bool kTrans, int kM = 1, class A, class C>
__device__ __forceinline__ void mma_b_pair(uint32_t b_addr, A&& a, C&& c) {
  uint32_t b0, b1, b2, b3;
  if constexpr (kTrans)
    ldmatrix_x4_trans(b_addr, b0, b1, b2, b3);
  else
    ldmatrix_x4(b_addr, b0, b1, b2, b3);
#pragma unroll
  for (int m = 0; m < kM; ++m) {
    mma16816<T>(c(m, 0), a(m), b0, b1);
    mma16816<T>(c(m, 1), a(m), b2, b3);
  }
}

// Two floats rounded to nearest-even T, `lo` in the low half (the k or n order of a fragment).
template <class T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  if constexpr (std::is_same_v<T, __half>) {
    __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&h);
  } else {
    __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&h);
  }
}

// The inverse of pack2: a T pair as two floats (exact), the low half first.
template <class T>
__device__ __forceinline__ float2 unpack2(uint32_t w) {
  if constexpr (std::is_same_v<T, __half>) {
    return __half22float2(*reinterpret_cast<const __half2*>(&w));
  } else {
    return make_float2(__uint_as_float(w << 16), __uint_as_float(w & 0xffff0000u));
  }
}

}  // namespace baracuda::cuda
