// Shared by our sm_90a attention kernels (fa3_forward.cuh, fa3_backward.cuh): the PTX wrappers
// (mbarriers, TMA, wgmma issue / wait, shared-memory matrix descriptors), the element-type table
// of wgmma shapes, and the host rules both kernels follow (problem shapes, TMA layouts, tensor
// maps, whether this build holds an sm_90a body).
#pragma once

#include <cuda.h>
#include <cudaTypedefs.h>

#include <cmath>
#include <cstring>
#include <string>
#include <string_view>
#include <type_traits>

#include "baracuda/ops/attention.hpp"
#include "core/cuda/async_copy.cuh"
#include "core/cuda/launch.cuh"
#include "core/cuda/mma.cuh"
#include "core/cuda/tensor_map.cuh"
#include "core/cuda/wgmma.cuh"
#include "ops/attention_hopper/fa3_ops.cuh"

// Device code only where wgmma exists (sm_90a); elsewhere kernels are empty and the host side
// refuses to launch them (see has_sm90a_body()).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define BARACUDA_FA3_DEVICE 1
#else
#define BARACUDA_FA3_DEVICE 0
#endif

namespace baracuda::attention_hopper::fa3 {
namespace {

using attention::Problem;
using cuda::smem_u32;

#if BARACUDA_FA3_DEVICE
// ---- PTX helpers --------------------------------------------------------------------------------
using cuda::fence_regs;
using cuda::mbar_arrive;
using cuda::mbar_expect_tx;
using cuda::mbar_init;
using cuda::mbar_wait;
using cuda::setmaxnreg_dec;
using cuda::setmaxnreg_inc;
using cuda::tma_load_4d;
using cuda::wgmma_commit;
using cuda::wgmma_fence;
using cuda::wgmma_wait;

// 2^x (ex2.approx.ftz: 2^-inf = 0).
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// tanh(x) by tanh.approx.f32: 1.1e-5 relative at most over |x| < 9 (H200, every float of 10 bands;
// the PTX manual's bound is 2^-11), so a capped score is off by up to cap x 1.1e-5: below P's
// bf16 rounding for any cap under ~350 (f16's: ~45), past f32's bound on LSE for large caps (the
// tests' lse_slack). The accurate form (cuda-core polynomial / exponential, the family's
// tanh_fast) cost the capped forward 41% and the backward 20% (docs/perf/attention.md).
__device__ __forceinline__ float fast_tanh(float x) {
  float y;
  asm("tanh.approx.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

using cuda::bulk_load;
// The bulk reduction, its waits and the proxy fence live in core (the family's fused backward
// uses them too).
using cuda::bulk_reduce_add_f32;
using cuda::bulk_store;
using cuda::bulk_wait;
using cuda::fence_proxy_async;

// 2^x on the FMA pipe, for x <= 0 (FlashAttention-4's exp2 emulation). At D = 64 the MUFU is as
// busy as the tensor cores: per 128 x 128 tile, 16384 exponentials at 16 per SM clock take 1024
// clocks, the two GEMMs 4.2 MFLOP at ~4096 per SM clock also 1024. Moving a fraction of the
// exponentials to FMA/ALU instructions (6 FP32 + 1 integer each, 128 lanes per clock) balances the
// two pipes. x = j + f with j = round(x) taken from a magic-number add (1.5 * 2^23: no conversion
// instruction, which would run at MUFU-like rate), 2^f by a degree-3 polynomial on [-0.5, 0.5]
// with p(0) = 1 exactly (max relative error 1.02e-4, 5x below the f16 rounding of P and 20x below
// bf16's), and j added into the exponent field. x <= -127 (masked: -inf) gives exactly 0:
// j = -127, f = 0, p = 1.0 = 0x3F800000 and 0x3F800000 + (-127 << 23) wraps to 0; p stays in
// [0.707, 1.415], so the exponent add never carries into the sign.
__device__ __forceinline__ float poly_exp2(float x) {
  x = fmaxf(x, -127.f);
  const float t = x + 12582912.f;  // round(x) in t's low mantissa bits
  const float j = t - 12582912.f;
  const float f = x - j;
  const float p = fmaf(fmaf(fmaf(0.055007726f, f, 0.24220923f), f, 0.69328284f), f, 1.f);
  return __int_as_float(__float_as_int(p) + (__float_as_int(t) << 23));
}

// Zeroes rows [r0, rows) of a [rows][D] tile stored as D / 64 column blocks of 128-byte rows
// (the 128-byte swizzle permutes chunks within a row, so whole rows are whole byte ranges); the
// `n` threads of the caller's group share the work, thread `i` of them starting at chunk i.
template <int D>
__device__ __forceinline__ void zero_rows(uint32_t tile, int rows, int r0, int i, int n) {
  const int chunks = (rows - r0) * 8;  // 16-byte chunks per column block
#pragma unroll
  for (int db = 0; db < D / 64; ++db) {
    const uint32_t from = tile + static_cast<uint32_t>(db * rows * 128 + r0 * 128);
    for (int c = i; c < chunks; c += n)
      asm volatile("st.shared.v4.b32 [%0], {%1, %1, %1, %1};\n" ::"r"(from + c * 16), "r"(0)
                   : "memory");
  }
}

using cuda::desc_swizzled;
__device__ __forceinline__ uint64_t desc_sw128(uint32_t addr, uint32_t lbo, uint32_t sbo) {
  return desc_swizzled(addr, lbo, sbo, 1);
}
// A K-major tile of kRow-byte swizzled rows (128 or 64), 8-row groups kRow * 8 bytes apart.
template <int kRow>
__device__ __forceinline__ uint64_t desc_k_major(uint32_t addr) {
  static_assert(kRow == 128 || kRow == 64);
  return desc_swizzled(addr, 16, 8 * kRow, kRow == 128 ? 1 : 2);
}
// The descriptor of the operand `bytes` past the one `desc` describes, by one add: the low 14 bits
// are the address >> 4 and shared-memory addresses stay below 2^18, so the offset never carries out
// of them. Consecutive wgmmas then sit two instructions apart instead of a fresh descriptor's mask,
// shift and or per operand.
__device__ __forceinline__ uint64_t desc_plus(uint64_t desc, uint32_t bytes) {
  return desc + (bytes >> 4);
}

// An f32 accumulator fragment of an m64nN tile as the A fragments of N / 16 k16-steps (rounded to
// the 16-bit type): accumulator columns [16 kk, 16 kk + 16) are k16-step kk's A columns, in the
// same per-thread order.
template <class T, int N>
__device__ __forceinline__ void pack_a(const float (&acc)[N / 2], uint32_t (&a)[N / 16][4]) {
#pragma unroll
  for (int kk = 0; kk < N / 16; ++kk) {
    a[kk][0] = cuda::pack2<T>(acc[8 * kk + 0], acc[8 * kk + 1]);
    a[kk][1] = cuda::pack2<T>(acc[8 * kk + 2], acc[8 * kk + 3]);
    a[kk][2] = cuda::pack2<T>(acc[8 * kk + 4], acc[8 * kk + 5]);
    a[kk][3] = cuda::pack2<T>(acc[8 * kk + 6], acc[8 * kk + 7]);
  }
}
#endif  // BARACUDA_FA3_DEVICE

// Sequence b's packed rows [start, start + len) by cu_seqlens. The GPU cannot check cu_seqlens,
// so the start is clamped to the packed extent and the length to the descriptor's maximum and to
// what the extent has left: bad offsets can make a sequence shorter, never index outside a tensor.
struct SeqSpan {
  int start, len;
};
__device__ __forceinline__ SeqSpan seq_span(const int* cu, int b, int max_len, int total) {
  const int start = min(max(cu[b], 0), total);
  return {start, max(0, min(min(cu[b + 1] - start, max_len), total - start))};
}
// Both sides of sequence b: Q rows [q0, q0 + lq), K / V rows [k0, k0 + lk).
struct SeqRows {
  int q0, lq, k0, lk;
};
__device__ __forceinline__ SeqRows seq_rows(const int* cu_q, const int* cu_k, int b, int max_q,
                                            int max_k, int total_q, int total_k) {
  const SeqSpan q = seq_span(cu_q, b, max_q, total_q), k = seq_span(cu_k, b, max_k, total_k);
  return {q.start, q.len, k.start, k.len};
}

// ---- host ---------------------------------------------------------------------------------------

// A kernel's body exists only in an sm_90a cubin: a build without that target (or a plain sm_90
// one) gets an empty kernel, which must never launch. The real bodies have static shared memory
// (their barriers), the empty ones none.
// (Per device: a process with an sm_90 and an sm_80 GPU loads a different cubin on each.)
template <auto Kernel>
bool has_sm90a_body() {
  const auto a = cuda::func_attributes(reinterpret_cast<const void*>(Kernel));
  return a && a->binaryVersion >= 90 && a->sharedSizeBytes > 0;
}

// What our sm_90a kernels promise: operands in the 16-bit type (P, dS rounded to it before their
// GEMMs; e4m3 for the fp8 forward, whose tensor cores sum each e4m3 product chain in a narrower
// accumulator before the f32 registers take it: LSE rel_l2 ~1e-4 measured), f32 accumulation,
// determinism as given; bit_stable not claimed until a GPU test checks rows across problem sizes.
constexpr PrecisionGuarantee fa3_precision(DType e, bool deterministic) {
  return {e == DType::f16    ? MathPrecision::f16
          : e == DType::e4m3 ? MathPrecision::e4m3
                             : MathPrecision::bf16,
          DType::f32, deterministic, false};
}

// Varlen arguments in the padded form the kernels address, so that sequence b's rows are rows
// cu_seqlens[b] .. of "batch" 0: packed [T, H, D] rows as [1, H, T, D] (rows_view), a packed
// [H, T] LSE as [1, H, T] (lse_view). Padded tensors pass through.
template <class Ptr>
BasicTensor<Ptr> rows_view(const BasicTensor<Ptr>& t, bool varlen) {
  if (!varlen) return t;
  BasicTensor<Ptr> v = t;
  v.rank = 4;
  v.shape[0] = 1, v.shape[1] = t.shape[1], v.shape[2] = t.shape[0], v.shape[3] = t.shape[2];
  v.stride[0] = 0, v.stride[1] = t.stride[1], v.stride[2] = t.stride[0], v.stride[3] = t.stride[2];
  return v;
}
template <class Ptr>
BasicTensor<Ptr> lse_view(const BasicTensor<Ptr>& t, bool varlen) {
  if (!varlen) return t;
  BasicTensor<Ptr> v = t;
  v.rank = 3;
  v.shape[0] = 1, v.shape[1] = t.shape[0], v.shape[2] = t.shape[1];
  v.stride[0] = 0, v.stride[1] = t.stride[0], v.stride[2] = t.stride[1];
  return v;
}

// A [B, H, L, ...] tensor's strides of its B, H, L axes, 0 on size-1 axes (never used).
template <class Ptr>
void outer_strides(int64_t (&out)[3], const BasicTensor<Ptr>& t) {
  for (int i = 0; i < 3; ++i) out[i] = t.shape[i] > 1 ? t.stride[i] : 0;
}

// The registry entry of one of our sm_90a kernels.
inline KernelSku fa3_sku(std::string_view op, DType e, PrecisionGuarantee prec,
                         std::string_view name) {
  return KernelSku{.category = "attention",
                   .op = op,
                   .element = e,
                   .aux_element = DType::f32,
                   .layout = "strided",
                   .epilogue = "causal_mask",
                   .arch = Arch::sm90a,
                   .backend = Backend::bespoke_cuda,
                   .precision = prec,
                   .name = name};
}

// The problems both kernels take (each kernel's fits adds its head dims: Dk = Dv in {64, 128,
// 256}, the forward also Dk = 192 with Dv = 128): bf16/f16, any band mask (none, causal,
// windows), soft-capping, padded or varlen (packed rows addressed as one [1, H, T, D] tensor, see
// rows_view), grid-sized extents.
inline bool shape_fits(const attention::Problem& pr, bool paged_ok = false) {
  const auto& d = pr.desc;
  constexpr int64_t kMax = int64_t{1} << 30;
  if (d.varlen && (d.total_q >= kMax || d.total_k >= kMax)) return false;
  // Paged K / V: the forward's paged instance only (paged_ok; the backward never has pages), its
  // pool's pages numbered in an int. Per-sequence key counts (forward only): the forward's tiles
  // take each sequence's count as its key length.
  if (d.page_size > 0 && (!paged_ok || d.pages >= kMax)) return false;
  // Diagonals and band bounds in int arithmetic (see band_bound).
  if (d.len_q + d.len_k >= kMax) return false;
  return std::isfinite(d.softcap) && d.batch >= 1 && d.batch <= 65535 && d.heads_q >= 1 &&
         d.heads_q <= 65535 && d.heads_kv >= 1 && d.len_q >= 1 && d.len_q < kMax && d.len_k >= 1 &&
         d.len_k < kMax && std::isfinite(pr.scale) && pr.scale > 0;
}

// A band bound for the kernels: -1 (unbounded) as is, and any bound past lq + lk (which reaches
// every key) as -1. With shape_fits keeping lq + lk below 2^30, a bound plus or minus any diagonal
// or row index stays inside an int.
inline int band_bound(int64_t bound, const attention::Descriptor& d) {
  return bound < 0 || bound >= d.len_q + d.len_k ? -1 : static_cast<int>(bound);
}

// What both kernels' parameters carry alike, set in one place: the sequences (varlen: cu_seqlens
// and the packed extents; padded: null), the band, the scale in log2 units and soft-capping
// (cap_arg = scale / cap, cap_log2 = cap log2(e)).
template <class P>
void set_common_params(P& p, const attention::Problem& pr, const ConstTensor& cu_q,
                       const ConstTensor& cu_k) {
  const auto& d = pr.desc;
  constexpr double kLog2e = 1.4426950408889634;
  if (d.varlen) {
    p.cu_q = static_cast<const int*>(cu_q.data);
    p.cu_k = static_cast<const int*>(cu_k.data);
    p.total_q = static_cast<int>(d.total_q);
    p.total_k = static_cast<int>(d.total_k);
  }
  p.left = band_bound(d.mask.left, d);
  p.right = band_bound(d.mask.right, d);
  p.bottom_right = d.mask.diagonal == attention::Diagonal::bottom_right ? 1 : 0;
  p.scale_log2 = static_cast<float>(pr.scale * kLog2e);
  if (d.softcap > 0) {
    p.softcap = 1;
    p.cap_arg = static_cast<float>(pr.scale / d.softcap);
    p.cap_log2 = static_cast<float>(d.softcap * kLog2e);
  }
}

}  // namespace
}  // namespace baracuda::attention_hopper::fa3
