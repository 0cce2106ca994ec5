// CUDA kernels of the attention family, as templates; kernels_<dtype>.cu instantiate and register.
//
//  - flash_fwd_mma (f16/bf16): the FlashAttention-2 design. A CTA owns 16*NW query rows of one
//    (batch, head); each warp 16 rows. S = Q K^T and O += P V run on mma.sync m16n8k16 with f32
//    accumulation, fragments loaded by ldmatrix from XOR-swizzled shared memory, K/V tiles
//    double-buffered with cp.async, online softmax in registers (exp2 domain). The head dim is
//    padded to D (64/128/256) with zero-filled loads, so 80/96/192 and Dk != Dv run here too.
//    When few CTAs would exist (decode), the keys are split across CTAs (flash-decoding): each
//    writes a normalized partial O and its LSE in f32 to the workspace and a combine kernel merges
//    them in a fixed order (deterministic).
//  - flash_fwd_simt / flash_bwd_simt (every float dtype): one warp per row, lanes across the head
//    dim, f32 math (f64 for f64). The backward is three deterministic passes (delta = dY.Y, dQ per
//    query row, dK/dV per key row summing the group's query heads): no atomics.
#pragma once

#include <cuda_pipeline.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "core/cuda/async_copy.cuh"
#include "core/cuda/flags.cuh"
#include "core/cuda/launch.cuh"
#include "core/cuda/mma.cuh"
#include "core/cuda/trace.cuh"
#include "ops/attention/common.hpp"
#include "ops/attention/swizzle.hpp"

namespace baracuda::attention::kernels {

using cuda::ldmatrix_x4;
using cuda::ldmatrix_x4_trans;
using cuda::mma16816;
using cuda::mma_b_pair;
using cuda::pack2;
using cuda::smem_u32;

using detail::Band;

// ---- Parameters shared by every kernel ----------------------------------------------------------
struct Params {
  const void* q;
  const void* k;
  const void* v;
  const void* y;   // backward reads it
  const void* dy;  // backward
  void* out;       // forward: Y
  void* lse;       // forward: written; backward: read
  void* dq;
  void* dk;
  void* dv;
  int64_t sq[3], sk[3], sv[3], sy[3], sdy[3], sl[3], sdq[3], sdk[3], sdv[3];
  const int32_t* cu_q;  // varlen offsets, null when padded
  const int32_t* cu_k;
  int batch, heads_q, heads_kv, group, len_q, len_k, dim_qk, dim_v;
  float scale;
  double scale_d;
  float softcap;
  double softcap_d;
  Band band;
  bool varlen;
  // split-K forward
  int splits, tiles_per_split;
  bool pack;  // GQA packing: a CTA's rows are (query head of the group, query) pairs
  float* o_part;
  float* lse_part;
  // flash_decode_fused_sm80: 2 splits + 1 flag words per (batch, K/V head) in the workspace and
  // this launch's tag, the value a split raises its flag to (see decode.cuh)
  unsigned long long* split_flags;
  unsigned long long tag;
  void* delta;            // backward workspace: dY.Y per row, [B * Hq * Lq]
  const int32_t* used_k;  // seqused_k: each sequence's key count, null without
  // Paged K / V (null when not paged): the block table [B, table_cols] and the pools' geometry
  // (p.sk / p.sv are then the [pages, H, page_size, D] pools' strides).
  const int32_t* block_table;
  int table_cols, page_size, pages;
#if defined(BARACUDA_KERNEL_TRACE) && BARACUDA_KERNEL_TRACE
  cuda::CtaTrace trace;  // the measurement build's CTA timelines (core/cuda/trace.cuh)
#endif
};

// The split partials in a workspace of `splits` x `rows` rows (the split-K forward's, the decode's
// and fa3's packed instance's, all sized splits x rows x (Dv + 1) floats): the f32 O rows
// [splits, rows, Dv], then their LSEs [splits, rows].
struct SplitParts {
  float *o, *lse;
};
inline SplitParts split_parts(void* workspace, int64_t splits, int64_t rows, int64_t dv) {
  float* o = static_cast<float*>(workspace);
  return {o, o + splits * rows * dv};
}

template <class Ptr>
inline void strides3(const BasicTensor<Ptr>& t, int64_t* s) {
  for (int i = 0; i < 3; ++i) s[i] = i < t.rank - 1 ? t.stride[i] : 0;
}

inline Params make_params(const Problem& p) {
  const Descriptor& d = p.desc;
  Params k{};
  k.batch = static_cast<int>(d.batch), k.heads_q = static_cast<int>(d.heads_q);
  k.heads_kv = static_cast<int>(d.heads_kv), k.group = static_cast<int>(p.group);
  k.len_q = static_cast<int>(d.len_q), k.len_k = static_cast<int>(d.len_k);
  k.dim_qk = static_cast<int>(d.head_dim_qk), k.dim_v = static_cast<int>(d.head_dim_v);
  k.scale = static_cast<float>(p.scale), k.scale_d = p.scale;
  k.softcap = static_cast<float>(d.softcap), k.softcap_d = d.softcap;
  k.band = detail::band_of(d.mask);
  k.varlen = d.varlen;
  k.splits = 1;
  return k;
}

// Sequence b's first packed row and lengths (lengths clamped to the maxima: the GPU cannot check
// the offsets or the seqused_k counts, so bad ones can never index past what the descriptor's
// maxima allow). kCounts: the kernel reads seqused_k's counts where the launch has them (p.used_k;
// forward kernels only). The decode kernels take it as a template parameter decided on the host:
// a runtime test in their prologue cost ~1% of a decode run (H200, bf16, 32k keys: 40.1 -> 40.5
// us a run, 38.1 -> 38.3 back to back; thirty-seventh session, call 4).
struct SeqRows {
  int q0, lq, k0, lk;
};
template <bool kCounts = false>
__device__ __forceinline__ SeqRows seq_rows(const Params& p, int b) {
  if constexpr (kCounts) {
    if (p.used_k) {
      SeqRows s = seq_rows<false>(p, b);
      s.lk = max(0, min(p.used_k[b], s.lk));
      return s;
    }
  }
  if (!p.cu_q) return {0, p.len_q, 0, p.len_k};
  const int q0 = p.cu_q[b], k0 = p.cu_k[b];
  const int lq = max(0, min(p.cu_q[b + 1] - q0, p.len_q));
  const int lk = max(0, min(p.cu_k[b + 1] - k0, p.len_k));
  return {q0, lq, k0, lk};
}

// Storage <-> accumulator conversions (A = float, or double for f64).
template <class A, class T>
__device__ __forceinline__ A ld(const T* p) {
  if constexpr (std::is_same_v<T, double> || std::is_same_v<T, float>) {
    return static_cast<A>(*p);
  } else {
    return static_cast<A>(cuda::to_float(*p));
  }
}
template <class T, class A>
__device__ __forceinline__ void st(T* p, A v) {
  if constexpr (std::is_same_v<T, double> || std::is_same_v<T, float>) {
    *p = static_cast<T>(v);
  } else {
    *p = cuda::from_float<T>(static_cast<float>(v));
  }
}
__device__ __forceinline__ float exp_acc(float x) {
  return expf(x);
}
__device__ __forceinline__ double exp_acc(double x) {
  return exp(x);
}
__device__ __forceinline__ float log_acc(float x) {
  return logf(x);
}
__device__ __forceinline__ double log_acc(double x) {
  return log(x);
}
__device__ __forceinline__ float tanh_acc(float x) {
  return tanhf(x);
}
__device__ __forceinline__ double tanh_acc(double x) {
  return tanh(x);
}

template <class A>
__device__ __forceinline__ A warp_sum(A v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

constexpr int kLaneElems = 8;  // 256 / 32: head-dim elements per lane in the SIMT kernels

// LSE storage: f64 for f64 problems, f32 for every other dtype (whatever the math type).
template <class T>
using lse_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

// ---- SIMT forward: one warp per query row
// ----------------------------------------------------------
template <class T, class A>
__global__ void __launch_bounds__(128) flash_fwd_simt(Params p) {
  const int lane = threadIdx.x % 32;
  const int64_t row = int64_t{blockIdx.x} * 4 + threadIdx.x / 32;  // over B * Hq * Lq
  const int i = static_cast<int>(row % p.len_q);
  const int h = static_cast<int>((row / p.len_q) % p.heads_q);
  const int b = static_cast<int>(row / (int64_t{p.len_q} * p.heads_q));
  if (b >= p.batch) return;
  const SeqRows s = seq_rows<true>(p, b);
  if (i >= s.lq) return;
  const int hk = h / p.group;
  const A scale = static_cast<A>(std::is_same_v<A, double> ? p.scale_d : p.scale);
  const A cap = static_cast<A>(std::is_same_v<A, double> ? p.softcap_d : p.softcap);
  const T* q = static_cast<const T*>(p.q) + detail::row_offset(p.sq, p.varlen, b, h, s.q0 + i);
  // Key j's row of K or V: padded or packed, or a page of the pools.
  const int32_t* pages = p.block_table ? p.block_table + int64_t{b} * p.table_cols : nullptr;
  auto key_row = [&](const int64_t* st, int64_t j) {
    return pages
               ? detail::paged_row_offset(st, pages, p.page_size, p.pages, hk, static_cast<int>(j))
               : detail::row_offset(st, p.varlen, b, hk, s.k0 + j);
  };
  A qr[kLaneElems], o[kLaneElems];
#pragma unroll
  for (int u = 0; u < kLaneElems; ++u) {
    const int c = lane + 32 * u;
    qr[u] = c < p.dim_qk ? ld<A>(q + c) : A(0);
    o[u] = 0;
  }
  int64_t lo, hi;
  detail::visible_keys(p.band, i, s.lq, s.lk, &lo, &hi);
  A m = -INFINITY, l = 0;
  for (int64_t j = lo; j < hi; ++j) {
    const T* kr = static_cast<const T*>(p.k) + key_row(p.sk, j);
    const T* vr = static_cast<const T*>(p.v) + key_row(p.sv, j);
    A dot = 0;
#pragma unroll
    for (int u = 0; u < kLaneElems; ++u) {
      const int c = lane + 32 * u;
      if (c < p.dim_qk) dot += qr[u] * ld<A>(kr + c);
    }
    A sc = warp_sum(dot) * scale;
    if (cap > 0) sc = cap * tanh_acc(sc / cap);
    const A m_new = sc > m ? sc : m;
    const A corr = exp_acc(m - m_new), pj = exp_acc(sc - m_new);
    l = l * corr + pj;
#pragma unroll
    for (int u = 0; u < kLaneElems; ++u) {
      const int c = lane + 32 * u;
      o[u] = o[u] * corr + (c < p.dim_v ? pj * ld<A>(vr + c) : A(0));
    }
    m = m_new;
  }
  T* y = static_cast<T*>(p.out) + detail::row_offset(p.sy, p.varlen, b, h, s.q0 + i);
  const A inv = l > 0 ? A(1) / l : A(0);
#pragma unroll
  for (int u = 0; u < kLaneElems; ++u) {
    const int c = lane + 32 * u;
    if (c < p.dim_v) st(y + c, o[u] * inv);
  }
  if (lane == 0) {
    const A lse = l > 0 ? m + log_acc(l) : A(-INFINITY);
    static_cast<lse_t<T>*>(p.lse)[detail::lse_offset(p.sl, p.varlen, b, h, s.q0 + i)] =
        static_cast<lse_t<T>>(lse);
  }
}

// ---- SIMT backward
// --------------------------------------------------------------------------------- delta[row] = dY
// . Y for every query row (index (b * Hq + h) * Lq + i).
template <class T, class A>
__global__ void __launch_bounds__(128) attn_bwd_delta(Params p) {
  const int lane = threadIdx.x % 32;
  const int64_t row = int64_t{blockIdx.x} * 4 + threadIdx.x / 32;
  const int i = static_cast<int>(row % p.len_q);
  const int h = static_cast<int>((row / p.len_q) % p.heads_q);
  const int b = static_cast<int>(row / (int64_t{p.len_q} * p.heads_q));
  if (b >= p.batch) return;
  const SeqRows s = seq_rows(p, b);
  if (i >= s.lq) return;
  const T* y = static_cast<const T*>(p.y) + detail::row_offset(p.sy, p.varlen, b, h, s.q0 + i);
  const T* dy = static_cast<const T*>(p.dy) + detail::row_offset(p.sdy, p.varlen, b, h, s.q0 + i);
  A acc = 0;
  for (int c = lane; c < p.dim_v; c += 32) acc += ld<A>(y + c) * ld<A>(dy + c);
  acc = warp_sum(acc);
  if (lane == 0) static_cast<A*>(p.delta)[row] = acc;
}

// Row kernels of the tensor-core backward: kTpr threads per query row (a power of two <= 32),
// 128 / kTpr rows per 128-thread block, row = (b * Hq + h) * Lq + i (delta's index) in 32 bits
// (the kernels' fits keep B * Hq * Lq below 2^31: 64-bit division made these kernels
// compute-bound).
template <int kTpr>
struct RowSlot {
  int row, b, h, i, part;  // part: this thread's index among its row's kTpr threads
  bool valid;              // a row of the problem (i below its sequence's length)
};
template <int kTpr>
__device__ __forceinline__ RowSlot<kTpr> row_slot(const Params& p) {
  RowSlot<kTpr> r;
  r.row = static_cast<int>(blockIdx.x) * (128 / kTpr) + static_cast<int>(threadIdx.x) / kTpr;
  r.part = static_cast<int>(threadIdx.x) % kTpr;
  const unsigned bh = static_cast<unsigned>(r.row) / static_cast<unsigned>(p.len_q);
  r.i = r.row - static_cast<int>(bh) * p.len_q;
  r.h = static_cast<int>(bh % static_cast<unsigned>(p.heads_q));
  r.b = static_cast<int>(bh / static_cast<unsigned>(p.heads_q));
  r.valid = r.b < p.batch && r.i < seq_rows(p, min(r.b, p.batch - 1)).lq;
  return r;
}

// delta for the tensor-core backward (16-bit types, dim_v a multiple of 8, 16-byte aligned rows):
// 16-byte loads, D / 8 threads per row (D: the padded head dim).
template <class T, int D>
__global__ void __launch_bounds__(128) attn_bwd_delta_vec(Params p) {
  constexpr int kTpr = D / 8;
  const RowSlot<kTpr> r = row_slot<kTpr>(p);
  float acc = 0.f;
  if (r.valid) {
    const int q0 = seq_rows(p, r.b).q0;
    const T* y =
        static_cast<const T*>(p.y) + detail::row_offset(p.sy, p.varlen, r.b, r.h, q0 + r.i);
    const T* dy =
        static_cast<const T*>(p.dy) + detail::row_offset(p.sdy, p.varlen, r.b, r.h, q0 + r.i);
    const int c = 8 * r.part;
    if (c < p.dim_v) {
      const uint4 a = *reinterpret_cast<const uint4*>(y + c);
      const uint4 g = *reinterpret_cast<const uint4*>(dy + c);
      const uint32_t aw[4] = {a.x, a.y, a.z, a.w}, gw[4] = {g.x, g.y, g.z, g.w};
#pragma unroll
      for (int w = 0; w < 4; ++w) {
        T av[2], gv[2];
        memcpy(av, &aw[w], 4);
        memcpy(gv, &gw[w], 4);
        acc = fmaf(cuda::to_float(av[0]), cuda::to_float(gv[0]), acc);
        acc = fmaf(cuda::to_float(av[1]), cuda::to_float(gv[1]), acc);
      }
    }
  }
#pragma unroll
  for (int o = kTpr / 2; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
  if (r.valid && r.part == 0) static_cast<float*>(p.delta)[r.row] = acc;
}

// The probability and dS (w.r.t. the scaled raw score) of one (query, key) pair; q/k dot and
// dY/V dot are full warp sums, so every lane holds the same values.
template <class A>
struct PairGrad {
  A p, ds;
};
template <class A>
__device__ __forceinline__ PairGrad<A> pair_grad(const Params& p, A dot_qk, A dot_dyv, A lse,
                                                 A delta) {
  const A scale = static_cast<A>(std::is_same_v<A, double> ? p.scale_d : p.scale);
  const A cap = static_cast<A>(std::is_same_v<A, double> ? p.softcap_d : p.softcap);
  A sc = dot_qk * scale, dcap = 1;
  if (cap > 0) {
    const A th = tanh_acc(sc / cap);
    sc = cap * th;
    dcap = A(1) - th * th;
  }
  const A pr = exp_acc(sc - lse);
  return {pr, pr * (dot_dyv - delta) * dcap * scale};
}

// dQ: one warp per query row, keys in order.
template <class T, class A>
__global__ void __launch_bounds__(128) flash_bwd_dq_simt(Params p) {
  const int lane = threadIdx.x % 32;
  const int64_t row = int64_t{blockIdx.x} * 4 + threadIdx.x / 32;
  const int i = static_cast<int>(row % p.len_q);
  const int h = static_cast<int>((row / p.len_q) % p.heads_q);
  const int b = static_cast<int>(row / (int64_t{p.len_q} * p.heads_q));
  if (b >= p.batch) return;
  const SeqRows s = seq_rows(p, b);
  if (i >= s.lq) return;
  const int hk = h / p.group;
  const T* q = static_cast<const T*>(p.q) + detail::row_offset(p.sq, p.varlen, b, h, s.q0 + i);
  const T* dy = static_cast<const T*>(p.dy) + detail::row_offset(p.sdy, p.varlen, b, h, s.q0 + i);
  A qr[kLaneElems], gr[kLaneElems], dq[kLaneElems];
#pragma unroll
  for (int u = 0; u < kLaneElems; ++u) {
    const int c = lane + 32 * u;
    qr[u] = c < p.dim_qk ? ld<A>(q + c) : A(0);
    gr[u] = c < p.dim_v ? ld<A>(dy + c) : A(0);
    dq[u] = 0;
  }
  const A lse = static_cast<A>(
      static_cast<const lse_t<T>*>(p.lse)[detail::lse_offset(p.sl, p.varlen, b, h, s.q0 + i)]);
  const A delta = static_cast<const A*>(p.delta)[row];
  int64_t lo, hi;
  detail::visible_keys(p.band, i, s.lq, s.lk, &lo, &hi);
  if (!(lse > A(-INFINITY))) hi = lo;  // a fully masked row has no gradient
  for (int64_t j = lo; j < hi; ++j) {
    const T* kr = static_cast<const T*>(p.k) + detail::row_offset(p.sk, p.varlen, b, hk, s.k0 + j);
    const T* vr = static_cast<const T*>(p.v) + detail::row_offset(p.sv, p.varlen, b, hk, s.k0 + j);
    A a = 0, g = 0, kv[kLaneElems];
#pragma unroll
    for (int u = 0; u < kLaneElems; ++u) {
      const int c = lane + 32 * u;
      kv[u] = c < p.dim_qk ? ld<A>(kr + c) : A(0);
      a += qr[u] * kv[u];
      if (c < p.dim_v) g += gr[u] * ld<A>(vr + c);
    }
    const PairGrad<A> pg = pair_grad(p, warp_sum(a), warp_sum(g), lse, delta);
#pragma unroll
    for (int u = 0; u < kLaneElems; ++u) dq[u] += pg.ds * kv[u];
  }
  T* out = static_cast<T*>(p.dq) + detail::row_offset(p.sdq, p.varlen, b, h, s.q0 + i);
#pragma unroll
  for (int u = 0; u < kLaneElems; ++u) {
    const int c = lane + 32 * u;
    if (c < p.dim_qk) st(out + c, dq[u]);
  }
}

// dK, dV: one warp per key row of a K/V head; query heads of the group, then query rows, in order.
template <class T, class A>
__global__ void __launch_bounds__(128) flash_bwd_dkdv_simt(Params p) {
  const int lane = threadIdx.x % 32;
  const int64_t row = int64_t{blockIdx.x} * 4 + threadIdx.x / 32;  // over B * Hk * Lk
  const int j = static_cast<int>(row % p.len_k);
  const int hk = static_cast<int>((row / p.len_k) % p.heads_kv);
  const int b = static_cast<int>(row / (int64_t{p.len_k} * p.heads_kv));
  if (b >= p.batch) return;
  const SeqRows s = seq_rows(p, b);
  if (j >= s.lk) return;
  const T* kr = static_cast<const T*>(p.k) + detail::row_offset(p.sk, p.varlen, b, hk, s.k0 + j);
  const T* vr = static_cast<const T*>(p.v) + detail::row_offset(p.sv, p.varlen, b, hk, s.k0 + j);
  A kv[kLaneElems], vv[kLaneElems], dk[kLaneElems], dv[kLaneElems];
#pragma unroll
  for (int u = 0; u < kLaneElems; ++u) {
    const int c = lane + 32 * u;
    kv[u] = c < p.dim_qk ? ld<A>(kr + c) : A(0);
    vv[u] = c < p.dim_v ? ld<A>(vr + c) : A(0);
    dk[u] = dv[u] = 0;
  }
  for (int h = hk * p.group; h < (hk + 1) * p.group; ++h) {
    for (int i = 0; i < s.lq; ++i) {
      int64_t lo, hi;
      detail::visible_keys(p.band, i, s.lq, s.lk, &lo, &hi);
      if (j < lo || j >= hi) continue;
      const A lse = static_cast<A>(
          static_cast<const lse_t<T>*>(p.lse)[detail::lse_offset(p.sl, p.varlen, b, h, s.q0 + i)]);
      if (!(lse > A(-INFINITY))) continue;
      const T* q = static_cast<const T*>(p.q) + detail::row_offset(p.sq, p.varlen, b, h, s.q0 + i);
      const T* dy =
          static_cast<const T*>(p.dy) + detail::row_offset(p.sdy, p.varlen, b, h, s.q0 + i);
      A a = 0, g = 0, qr[kLaneElems], gr[kLaneElems];
#pragma unroll
      for (int u = 0; u < kLaneElems; ++u) {
        const int c = lane + 32 * u;
        qr[u] = c < p.dim_qk ? ld<A>(q + c) : A(0);
        gr[u] = c < p.dim_v ? ld<A>(dy + c) : A(0);
        a += qr[u] * kv[u];
        g += gr[u] * vv[u];
      }
      const A delta = static_cast<const A*>(p.delta)[(int64_t{b} * p.heads_q + h) * p.len_q + i];
      const PairGrad<A> pg = pair_grad(p, warp_sum(a), warp_sum(g), lse, delta);
#pragma unroll
      for (int u = 0; u < kLaneElems; ++u) {
        dk[u] += pg.ds * qr[u];
        dv[u] += pg.p * gr[u];
      }
    }
  }
  T* ok = static_cast<T*>(p.dk) + detail::row_offset(p.sdk, p.varlen, b, hk, s.k0 + j);
  T* ov = static_cast<T*>(p.dv) + detail::row_offset(p.sdv, p.varlen, b, hk, s.k0 + j);
#pragma unroll
  for (int u = 0; u < kLaneElems; ++u) {
    const int c = lane + 32 * u;
    if (c < p.dim_qk) st(ok + c, dk[u]);
    if (c < p.dim_v) st(ov + c, dv[u]);
  }
}

// ---- Tensor-core forward
// -------------------------------------------------------------------------------
// 2^x on MUFU.EX2 alone. Every caller passes x <= 0 (a score minus its row's running max, or an
// old max minus a new one), so 2^x is in [0, 1] and flushing results below 2^-126 to zero is far
// below P's rounding to the 16-bit type. exp2f without fast-math wraps the same instruction in a
// denormal fix-up (a compare and two predicated multiplies) per element: ~100 extra instructions
// per 64-key tile and thread in the forward, where issue slots are what the softmax competes for
// with the mma chain.
__device__ __forceinline__ float exp2_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// 16-byte async copy; src_bytes = 0 zero-fills (rows past the sequence, columns past the dim).
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n");
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// Copies rows [r0, r0 + ROWS) of one head into a swizzled tile (rows >= n and columns >= dim are
// zero-filled).
template <class T, int ROWS, int D, int NT>
__device__ __forceinline__ void load_tile(T* tile, const T* base, const int64_t row_stride, int r0,
                                          int n, int dim) {
  constexpr int kChunks = ROWS * D / 8;
  if constexpr (kChunks % NT == 0 && NT % (D / 8) == 0) {
    // Fixed trip count, fully unrolled: each thread keeps its column and steps NT / (D / 8) rows,
    // so the address math is one add per chunk instead of a div/mod and a loop test.
    constexpr int kRowStep = NT / (D / 8);
    const int col = (threadIdx.x % (D / 8)) * 8, rt = threadIdx.x / (D / 8);
    if constexpr (kRowStep % 8 == 0) {
      // A whole tile of full rows (every tile of a long sequence but its last): no bounds, one
      // 64-bit address per tile, a constant stride per chunk, and (the swizzle repeats every 8
      // rows) a constant shared-memory offset per chunk. The general path below spends ~17
      // instructions a chunk (two bounds tests, a 64-bit product, the select, the swizzle): ncu of
      // m32s_n128 (H100, d64 L4096) counted ~540 of the key loop's ~1400 instructions a tile there.
      if (r0 + ROWS <= n && dim == D) {  // block-uniform
        const T* src = base + (int64_t{r0 + rt} * row_stride + col);
        const int64_t step = int64_t{kRowStep} * row_stride;
        const uint32_t dst = smem_u32(tile + swz<D>(rt, col));
#pragma unroll
        for (int it = 0; it < kChunks / NT; ++it)
          cp_async16(dst + static_cast<uint32_t>(it * kRowStep * D * sizeof(T)), src + it * step,
                     16);
        return;
      }
    }
    const bool col_ok = col < dim;
#pragma unroll
    for (int it = 0; it < kChunks / NT; ++it) {
      const int r = rt + it * (NT / (D / 8));
      const bool ok = col_ok && r0 + r < n;
      const T* src = ok ? base + int64_t{r0 + r} * row_stride + col : base;
      cp_async16(smem_u32(tile + swz<D>(r, col)), src, ok ? 16 : 0);
    }
  } else {
    for (int c = threadIdx.x; c < kChunks; c += NT) {
      const int r = c / (D / 8), col = (c % (D / 8)) * 8;
      const bool ok = r0 + r < n && col < dim;
      const T* src = ok ? base + int64_t{r0 + r} * row_stride + col : base;
      cp_async16(smem_u32(tile + swz<D>(r, col)), src, ok ? 16 : 0);
    }
  }
}

// Paged K / V (detail::page_of): where row r of key tile t of a sequence with n keys
// lives, as (page, row in the page); rows past n give (0, 0) (their chunks are zero-filled, and
// the table has no entry for them).
struct PageRow {
  int page, row;
};
__device__ __forceinline__ PageRow page_row(const Params& p, const int32_t* pages_row, int key,
                                            int n) {
  if (key >= n) return {0, 0};
  return {detail::page_of(pages_row, p.page_size, p.pages, key), key % p.page_size};
}
// A key tile that one page holds whole (page_size a multiple of ROWS): the plain tile loads from
// its first row `e`, one address and fixed strides. H200, b16 ragged batch in 64-key pages, one
// call interleaved (thirty-eighth session, call 1): 41.7-42.1 us a run against 60.8-61.4 for the
// per-chunk form below; w4 36.9-37.2 against 43.2-43.7.
template <class T, int ROWS, int D, int NT>
__device__ __forceinline__ void load_kv_page_tile(T* tk, T* tv, const T* gk, const T* gv,
                                                  const Params& p, PageRow e, int r0, int n) {
  load_tile<T, ROWS, D, NT>(tk, gk + e.page * p.sk[0] + e.row * p.sk[2], p.sk[2], 0, n - r0,
                            p.dim_qk);
  load_tile<T, ROWS, D, NT>(tv, gv + e.page * p.sv[0] + e.row * p.sv[2], p.sv[2], 0, n - r0,
                            p.dim_v);
}

// A key tile of the K and V pools into shared memory, each 16-byte chunk from its row's page:
// `pg(r)` gives row r's (page, row); gk / gv point at the pools' head.
template <class T, int ROWS, int D, int NT, class Pg>
__device__ __forceinline__ void load_kv_paged(T* tk, T* tv, const T* gk, const T* gv,
                                              const Params& p, int r0, int n, Pg pg) {
  for (int c = threadIdx.x; c < ROWS * D / 8; c += NT) {
    const int r = c / (D / 8), col = (c % (D / 8)) * 8;
    const PageRow e = pg(r);
    const bool in = r0 + r < n;
    const bool ok_k = in && col < p.dim_qk, ok_v = in && col < p.dim_v;
    const int64_t ko = e.page * p.sk[0] + e.row * p.sk[2], vo = e.page * p.sv[0] + e.row * p.sv[2];
    cp_async16(smem_u32(tk + swz<D>(r, col)), ok_k ? gk + ko + col : gk, ok_k ? 16 : 0);
    cp_async16(smem_u32(tv + swz<D>(r, col)), ok_v ? gv + vo + col : gv, ok_v ? 16 : 0);
  }
}

// A sequence's block-table entries streamed through registers, 32 to a warp: lane i holds entry
// base + i of the window in use (`cur`) and base + 32 + i of the next (`nxt`, loaded a whole
// window ahead), so a tile's pages come from a shuffle and no load is ever waited for. The
// one-entry register prefetch before it (the decode's, for 64-key pages) was loaded right behind
// a tile's copies and, read an iteration later, waited for them: b16 ragged batch in 64-key pages
// 41.7-42.1 us a run against 38.6-38.9 this way (H200, thirty-eighth session, call 2). It serves
// the page sizes detail::page_window_serves names, so a tile's entries never straddle a window;
// tiles must be loaded in order, by every lane of the block (the shuffles). The decode kernels and
// the paged tensor-core forward read K / V through it.
struct PageWindow {
  // The sizes come from the kernel's parameters (constant bank operands) and the table row from
  // the caller, not registers kept here: the fused two-tile d128 instance sits at the limit.
  int base = 0, cur = 0, nxt = 0;

  static __device__ int lane() { return static_cast<int>(threadIdx.x % 32); }
  static __device__ int shift_of(int ps) { return __ffs(ps) - 1; }  // ps a power of two
  static __device__ int load(const Params& p, const int32_t* row, int e) {
    return e < p.table_cols ? row[e] : 0;
  }
  __device__ void init(const Params& p, const int32_t* row, int first_key) {
    base = first_key / p.page_size / 32 * 32;
    cur = load(p, row, base + lane()), nxt = load(p, row, base + 32 + lane());
  }
  __device__ int page(const Params& p, int e) const {
    return detail::clamp_page(__shfl_sync(0xffffffffu, cur, e % 32), p.pages);
  }
  // Key tile `tn` (rows tn * ROWS ...) of a sequence with n keys and table row `row` into tk / tv.
  template <class T, int ROWS, int D, int NT>
  __device__ void load_tile(T* tk, T* tv, const T* gk, const T* gv, const Params& p,
                            const int32_t* row, int tn, int n) {
    const int ps = p.page_size, r0 = tn * ROWS, e0 = r0 / ps;
    if (e0 >= base + 32) base += 32, cur = nxt, nxt = load(p, row, base + 32 + lane());
    if (ps >= ROWS) {
      load_kv_page_tile<T, ROWS, D, NT>(tk, tv, gk, gv, p, PageRow{page(p, e0), r0 % ps}, r0, n);
    } else if (ps % 16 == 0) {
      // Pages of 16 or 32 keys: the tile as 16-row blocks, each one page's rows, through the plain
      // tile load (one address a block; per chunk a constant stride) instead of a page lookup and
      // two 64-bit products per chunk.
#pragma unroll
      for (int j = 0; j < ROWS / 16; ++j) {
        const int rj = r0 + 16 * j;
        load_kv_page_tile<T, 16, D, NT>(tk + 16 * j * D, tv + 16 * j * D, gk, gv, p,
                                        PageRow{page(p, e0 + ((16 * j) >> shift_of(ps))), rj % ps},
                                        rj, n);
      }
    } else {
      const int shift = shift_of(ps);
      load_kv_paged<T, ROWS, D, NT>(tk, tv, gk, gv, p, r0, n, [&](int r) {
        return PageRow{page(p, e0 + (r >> shift)), r & (ps - 1)};
      });
    }
  }
};

// Raw scores -> scaled (and soft-capped) scores in the exp2 domain, masked keys -inf. Each variant
// is straight-line code: a per-element runtime branch (soft-cap on/off, mask needed or not) splits
// the unrolled tile into hundreds of basic blocks, which keeps the scheduler from overlapping the
// softmax with the next tile's ldmatrix/mma work. !kScale: uncapped scores stay raw (masked ones
// -inf) and the caller folds the scale into its exponentials (one FFMA a score instead of an FMUL
// and an FADD; the scale is positive, so the raw maximum scaled is the scaled maximum).
template <bool kCap, bool kMask, bool kScale = true, int MT, int NT>
__device__ __forceinline__ void scores_to_log2(float (&sc)[MT][NT][4], const Params& p, float sl2,
                                               int n0, int tq, const int (&lo)[MT][2],
                                               const int (&hi)[MT][2]) {
  const float log2e = 1.4426950408889634f;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float x = sc[mt][n][e];
        if constexpr (kCap) {
          x = p.softcap * tanhf(x * p.scale / p.softcap) * log2e;
        } else if constexpr (kScale) {
          x *= sl2;
        }
        if constexpr (kMask) {
          const int col = n0 + n * 8 + 2 * tq + (e & 1);
          const int hf = e >> 1;
          x = col < lo[mt][hf] || col >= hi[mt][hf] ? -INFINITY : x;
        }
        sc[mt][n][e] = x;
      }
}
// Raw scores -> soft-capped ones in the exp2 domain. tanh without tanhf, whose longer sequence
// over 128 scores made ptxas spill ~100 bytes in m32s_n128m's one-text loop (the same loop without
// the capped pass: none): an odd polynomial below |y| = 0.6 (relative error 1.4e-7, fitted here
// in float32), 1 - 2 / (e^2|y| + 1) above it (MUFU exponential, reciprocal plus a Newton step).
// The exponential form alone lost ~1e-7 absolute near 0, where real scores / cap lie, and missed
// the LSE tolerance (d128, cap 30: rel_l2 1.3e-6 against 9.6e-7).
__device__ __forceinline__ float tanh_fast(float y) {
  const float t = y * y;
  float poly = fmaf(-0.005852775648236275f, t, 0.0207541324198246f);
  poly = fmaf(poly, t, -0.05376884713768959f);
  poly = fmaf(poly, t, 0.13331690430641174f);
  poly = fmaf(poly, t, -0.3333328366279602f);
  poly = fmaf(poly, t, 1.f) * y;
  // |y| > 9 gives 1 in float; the clamp keeps e^2|y| finite (an infinite score then caps instead
  // of 0 * inf in the Newton step), and NaN still propagates.
  const float ay = fabsf(y) > 9.f ? 9.f : fabsf(y);
  const float d = exp2_ftz(2.8853900817779268f * ay) + 1.f;
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;\n" : "=f"(r) : "f"(d));
  r = fmaf(r, fmaf(-d, r, 1.f), r);
  return fabsf(y) < 0.6f ? poly : copysignf(fmaf(-2.f, r, 1.f), y);
}
template <int MT, int NT>
__device__ __forceinline__ void cap_scores(float (&sc)[MT][NT][4], const Params& p) {
  const float in = p.scale / p.softcap, out = p.softcap * 1.4426950408889634f;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) sc[mt][n][e] = out * tanh_fast(sc[mt][n][e] * in);
}
template <bool kScale = true, int MT, int NT>
__device__ __forceinline__ void prep_scores(float (&sc)[MT][NT][4], const Params& p, float sl2,
                                            int n0, int tq, const int (&lo)[MT][2],
                                            const int (&hi)[MT][2], bool capped, bool masked) {
  if (capped || masked) {  // the mask test is exact on full tiles too
    if (capped) {
      scores_to_log2<true, true, kScale>(sc, p, sl2, n0, tq, lo, hi);
    } else {
      scores_to_log2<false, true, kScale>(sc, p, sl2, n0, tq, lo, hi);
    }
  } else {
    scores_to_log2<false, false, kScale>(sc, p, sl2, n0, tq, lo, hi);
  }
}

// One m-tile's O and l times its two rows' corrections after a new running maximum. Skipped when
// no row of the warp saw one (corr is then exactly 1, and times 1 is exact: same bits), which is
// most tiles of a long row. Warp-uniform branch.
template <int kOTiles>
__device__ __forceinline__ void rescale_rows(float (&o)[kOTiles][4], float (&l)[2], float corr0,
                                             float corr1) {
  if (!__any_sync(0xffffffffu, corr0 != 1.f || corr1 != 1.f)) return;
  l[0] *= corr0, l[1] *= corr1;
#pragma unroll
  for (int d = 0; d < kOTiles; ++d) {
    o[d][0] *= corr0, o[d][1] *= corr0, o[d][2] *= corr1, o[d][3] *= corr1;
  }
}

// A block's place in a grid of (block, head, rest) work tiles. Without a band every block of a
// head does the same work, so its blocks go first (adjacent): the blocks that read the same K/V
// (forward, dQ) or Q / dY (dK / dV) tiles run together and those tiles come from DRAM once (ncu,
// H100, d64 L4096: 909 MB read for 201 MB of Q, K, V with heads first, L2 hit rate 68%; 201 MB,
// 92% with blocks first; FlashAttention-2 orders its grid the same way). Under a band (causal,
// windows) the heads go first, so that every head's heaviest blocks start before any lighter one
// (longest first): blocks first there put the last head's heaviest block at the end of the grid,
// and measured 4-33% slower (causal, the same call, f21f337).
struct GridPlace {
  int blk, head, rest;
};
__device__ __forceinline__ GridPlace grid_place(int lin, int blocks, int heads, const Band& band) {
  if (band.left < 0 && band.right < 0)
    return {lin % blocks, lin / blocks % heads, lin / blocks / heads};
  return {lin / heads % blocks, lin % heads, lin / heads / blocks};
}

// D: padded head dim; NW warps; BN keys per tile; MT m16 tiles per warp (B fragments loaded from
// shared memory are reused MT times, which is what keeps ldmatrix from being the bottleneck);
// QREG keeps the Q fragments in registers for the whole key loop.
// OVL (A/B, MT = 1 with Q in registers): S_{t+1} = Q K_{t+1}^T is issued before the softmax of
// S_t, so each warp has independent mma work to hide the softmax's MUFU and ALU latency behind
// (the per-tile barrier keeps all warps of a CTA in the same phase, so without it the tensor
// cores idle while every warp runs its exp2s). Costs a second S tile in registers and a 4-stage
// ring (tiles t and t + 1 resident while t + 2, t + 3 load).
// STR (MmaShapeM32S = 1): on tiles without soft-cap or mask (the bulk of a long non-causal row)
// the MT = 2 shape converts its scores with the straight-line scores_to_log2 instead of the
// per-element branch loop, which it keeps for masked / capped tiles (the straight variants
// spilled there at MT = 2 while the second m16 tile's mmas were predicated). The softmax text is
// instantiated twice for it (a block-uniform branch picks one per tile); the other shapes keep
// the single text they were measured with. STR = 2 (A/B, MmaShapeM32SStraight): straight-line on
// every tile, masked and capped ones too (prep_scores, as the m16 shapes). STR = 3
// (MmaShapeM32SWideMasked): one softmax text, the fast one; a masked or capped tile first passes
// through a straight-line conversion (masked scores -inf; capped ones scaled and capped). Through
// STR = 1's per-element loop a causal diagonal tile of 128 keys took as long as ~6 unmasked tiles
// (m32s_n128, H100, 8120dce: d64 L512 causal 69.9 TFLOP/s against 261.6 unmasked). With tanhf in
// the capped pass STR = 3 spilled ~100 bytes at that shape and ran unmasked problems ~3% slower
// than STR = 1 (two texts, three, or straight-line everywhere spilled as much or more); with
// tanh_fast it spills nothing and runs 2-4% faster than STR = 1 unmasked (H100, da06fc8).
template <class T, int D, int NW, int BN, int MT, bool QREG, bool OVL = false, int STR = 0>
struct MmaCfg {
  static constexpr int kM = 16 * NW * MT;
  static constexpr int kThreads = 32 * NW;
  // Two m16 tiles per warp over 64-key tiles with Q in shared memory (MmaShapeM32) sits at the
  // 255-register limit: the rows' visible key ranges (8 registers, read only on tiles that need
  // the mask) live in shared memory there instead.
  static constexpr bool kBoundsSmem = MT == 2 && BN == 64 && !QREG;
  // K/V ring depth: 3 keeps two tiles in flight while one is consumed. D = 256, and the 128-row
  // MmaShapeM32 CTAs at D = 128 (32 KB of Q), stay at 2 (the next tile loads during this one's
  // math) so that two blocks still fit an SM: 97 KB each instead of 129 KB.
  static constexpr int kStages = OVL ? 4 : D == 256 || (kBoundsSmem && D == 128) ? 2 : 3;
  static_assert(!OVL || (MT == 1 && QREG), "the overlapped loop keeps Q in registers, one m16");
  static constexpr size_t kSmem = sizeof(T) * (size_t{kM} * D + 2 * kStages * size_t{BN} * D) +
                                  (kBoundsSmem ? sizeof(int) * 2 * kM : 0);
};

// PIPE (MmaShapeM32SWide at D = 64): each ldmatrix fragment of the two GEMMs is loaded one step
// (one n16 / d16 pair of mmas) ahead of the mmas that read it, into a second register set, the way
// FlashAttention-2's CuTe loop does. ncu of m32s_n128 (H100, d64 L4096) had its HMMAs waiting on
// the ldmatrix just before them (short scoreboard: 12% of stall samples, 4% in FA2's loop, whose
// HMMAs wait on the tensor pipe instead). LATE (a shape's kLateRefill in launch.cuh): each tile's K
// / V stage refill is issued after its first Q K^T k-step instead of before it.
// PAGED: K / V are page pools read through a PageWindow (p.block_table; page sizes
// detail::page_window_serves names for BN-key tiles).
template <class T, int D, int NW, int BN, int MT, bool QREG, bool OVL = false, int STR = 0,
          bool PIPE = false, bool LATE = false, bool PAGED = false>
__global__ void __launch_bounds__(32 * NW) flash_fwd_mma(Params p) {
  using Cfg = MmaCfg<T, D, NW, BN, MT, QREG, OVL, STR>;
  static_assert(!(OVL && LATE), "the overlapped loop refills at the top");
  constexpr int kM = Cfg::kM, kNT = Cfg::kThreads;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* sQ = reinterpret_cast<T*>(smem_raw);
  constexpr int kStages = Cfg::kStages;
  T* sK = sQ + kM * D;                                           // kStages tiles
  T* sV = sK + kStages * BN * D;                                 // kStages tiles
  int* sBounds = reinterpret_cast<int*>(sV + kStages * BN * D);  // [kM][2] when kBoundsSmem

  // Block -> (m-block, head and split, batch) in grid_place's order; heads of a group are adjacent
  // so they share K/V in L2. With GQA packing (a head's rows fill less than a block: decode, short
  // chunks) the group's rows r of one K/V head are (head h0 + r / Lq, query r % Lq), kM of them a
  // block, so the K/V tiles are read once per kM rows of the group instead of once per head.
  const int m_blocks = (p.pack ? p.group * p.len_q + kM - 1 : p.len_q + kM - 1) / kM;
  const int grid_heads = p.pack ? p.heads_kv : p.heads_q;
  const GridPlace at =
      grid_place(static_cast<int>(blockIdx.x), m_blocks, grid_heads * p.splits, p.band);
  const int hh = at.head % grid_heads, split = at.head / grid_heads;
  const int mb = m_blocks - 1 - at.blk;  // heaviest (causal) blocks first
  const int b = at.rest;
  const SeqRows s = seq_rows<true>(p, b);
  const int m0 = mb * kM;
  const int rows_total = p.pack ? p.group * s.lq : s.lq;
  if (m0 >= rows_total) return;
  const int hk = p.pack ? hh : hh / p.group;
  const int h_base = p.pack ? hk * p.group : hh;
  // Query head and query index of a block row.
  auto head_of = [&](int r) { return p.pack ? h_base + r / s.lq : h_base; };
  auto query_of = [&](int r) { return p.pack ? r % s.lq : r; };
  // The block's query range: a packed block whose rows cross a head boundary holds queries from
  // both ends of the sequence.
  const int r_last = min(m0 + kM, rows_total) - 1;
  const bool crosses = p.pack && m0 / s.lq != r_last / s.lq;
  const int i_first = crosses ? 0 : query_of(m0);
  const int i_last = crosses ? s.lq - 1 : query_of(r_last);
  int64_t lo0, hi0, lo1, hi1;
  detail::visible_keys(p.band, i_first, s.lq, s.lk, &lo0, &hi0);
  detail::visible_keys(p.band, i_last, s.lq, s.lk, &lo1, &hi1);
  // Key tiles this block (and split) visits.
  int t_begin = static_cast<int>(lo0 / BN);
  int t_end = static_cast<int>((max(hi1, lo0) + BN - 1) / BN);
  // The loop's full-tile test in 32 bits (lengths are < 2^31): two registers instead of four.
  const int full_lo = static_cast<int>(lo1), full_hi = static_cast<int>(hi0);
  if (p.splits > 1) {
    t_begin = max(t_begin, split * p.tiles_per_split);
    t_end = min(t_end, (split + 1) * p.tiles_per_split);
  }

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, tq = lane % 4;
  const int w0 = m0 + warp * 16 * MT;  // this warp's first row
  // Warps whose rows all lie past the sequence (decode: Lq = 1) only help load tiles.
  // A warp whose second m16 tile lies past the end still multiplies it (its Q rows are zeros and
  // its outputs are not stored): skipping it per tile made every mma of that tile a predicated
  // one behind a WARPSYNC (ptxas cannot tell the test is warp-uniform), 157 WARPSYNCs to 256 HMMAs
  // in m32s's loop, 9.6% of its issued instructions (ncu, H100, f7e34af).
  const bool active = w0 < rows_total;
  // K / V rows of the sequence's head (paged: the pools' head, rows found through the pages).
  const T* gk = static_cast<const T*>(p.k) +
                (PAGED ? hk * p.sk[1] : detail::row_offset(p.sk, p.varlen, b, hk, s.k0));
  const T* gv = static_cast<const T*>(p.v) +
                (PAGED ? hk * p.sv[1] : detail::row_offset(p.sv, p.varlen, b, hk, s.k0));
  const int64_t k_rs = p.varlen ? p.sk[0] : p.sk[2];
  const int64_t v_rs = p.varlen ? p.sv[0] : p.sv[2];
  [[maybe_unused]] const int32_t* pages_row =
      PAGED ? p.block_table + int64_t{b} * p.table_cols : nullptr;
  [[maybe_unused]] PageWindow win;
  if constexpr (PAGED) {
    if (t_begin < t_end) win.init(p, pages_row, t_begin * BN);
  }

  // Q: rows [m0, m0 + kM) of one head, loaded like a K/V tile (one address per tile when whole);
  // packed GQA rows span heads and take the per-chunk path. The per-chunk path for every block
  // was ~7% of the d64 L512 forward's stall samples (ncu, H100, 8513ca9).
  if (!p.pack) {
    const T* gq = static_cast<const T*>(p.q) + detail::row_offset(p.sq, p.varlen, b, hh, s.q0);
    load_tile<T, kM, D, kNT>(sQ, gq, p.varlen ? p.sq[0] : p.sq[2], m0, s.lq, p.dim_qk);
  } else {
    for (int c = threadIdx.x; c < kM * D / 8; c += kNT) {
      const int r = c / (D / 8), col = (c % (D / 8)) * 8, row = m0 + r;
      const bool ok = row < rows_total && col < p.dim_qk;
      const T* src = static_cast<const T*>(p.q);
      if (ok)
        src += detail::row_offset(p.sq, p.varlen, b, head_of(row), s.q0 + query_of(row)) + col;
      cp_async16(smem_u32(sQ + swz<D>(r, col)), src, ok ? 16 : 0);
    }
  }
  // Prologue: tiles t_begin .. t_begin + kStages - 2, one commit group each (Q rides in the first).
#pragma unroll
  for (int st = 0; st < kStages - 1; ++st) {
    if (t_begin + st < t_end) {
      if constexpr (PAGED) {
        win.load_tile<T, BN, D, kNT>(sK + st * BN * D, sV + st * BN * D, gk, gv, p, pages_row,
                                     t_begin + st, s.lk);
      } else {
        load_tile<T, BN, D, kNT>(sK + st * BN * D, gk, k_rs, (t_begin + st) * BN, s.lk, p.dim_qk);
        load_tile<T, BN, D, kNT>(sV + st * BN * D, gv, v_rs, (t_begin + st) * BN, s.lk, p.dim_v);
      }
    }
    cp_async_commit();
  }

  // This thread's rows: (mt, half) -> w0 + mt * 16 + half * 8 + g, and their visible key ranges.
  int lo_r[MT][2], hi_r[MT][2];  // 32-bit: lengths are < 2^31 (make_problem checks)
  // Without a band every row sees every key: the PIPE shape skips visible_keys then (+1%, d64
  // L512-2048). Elsewhere the same shortcut changed how the key loop compiled and measured slower
  // (H100, same calls: m16 4-7% at d64, m32s_straight 1.2% at d128), so they keep the call.
  const bool banded = !PIPE || p.band.left >= 0 || p.band.right >= 0;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      int64_t lo = 0, hi = s.lk;
      if (banded)
        detail::visible_keys(p.band, query_of(w0 + mt * 16 + hf * 8 + g), s.lq, s.lk, &lo, &hi);
      lo_r[mt][hf] = static_cast<int>(lo), hi_r[mt][hf] = static_cast<int>(hi);
      if constexpr (Cfg::kBoundsSmem) {  // read after the key loop's first barrier
        const int rl = warp * 16 * MT + mt * 16 + hf * 8 + g;
        if (tq == 0) sBounds[2 * rl] = lo_r[mt][hf], sBounds[2 * rl + 1] = hi_r[mt][hf];
      }
    }

  constexpr int kKSteps = D / 16;  // k-steps of Q K^T
  constexpr int kSTiles = BN / 8;  // n8 tiles of S
  constexpr int kOTiles = D / 8;   // n8 tiles of O
  float o[MT][kOTiles][4];
  float m_r[MT][2], l_r[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int t = 0; t < kOTiles; ++t) o[mt][t][0] = o[mt][t][1] = o[mt][t][2] = o[mt][t][3] = 0.f;
    m_r[mt][0] = m_r[mt][1] = -INFINITY;
    l_r[mt][0] = l_r[mt][1] = 0.f;
  }
  const float log2e = 1.4426950408889634f;
  const float sl2 = p.scale * log2e;
  const bool capped = p.softcap > 0;

  uint32_t qf[QREG ? MT : 1][QREG ? kKSteps : 1][4];
  // This lane's rows and chunks of each ldmatrix_x4 (see swz_bases): Q and K as A / B of Q K^T,
  // V transposed as B of P V.
  const int mi = lane / 8;
  // 128-byte aligned tiles are what swz_addr relies on (every tile size is a multiple of 4 KB).
  if ((smem_u32(smem_raw) & 127u) != 0) __trap();
  const SwzBases q_base = swz_bases<T, D>(smem_u32(sQ + warp * 16 * MT * D), lane % 16, lane / 16);
  // S = Q K^T for this warp's 16 * MT rows and one tile's BN keys; `after_first` runs once the
  // first k-step's mmas are issued (the stage refill, behind them instead of before them).
  auto qk = [&](const T* tK, float(&acc)[MT][kSTiles][4], auto after_first) {
    const SwzBases k_base = swz_bases<T, D>(smem_u32(tK), (lane % 8) + (mi / 2) * 8, mi % 2);
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int n = 0; n < kSTiles; ++n)
        acc[mt][n][0] = acc[mt][n][1] = acc[mt][n][2] = acc[mt][n][3] = 0.f;
    // Q's fragments of k-step ks (from registers when QREG).
    auto load_a = [&](int ks, uint32_t(&dst)[MT][4]) {
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        if constexpr (QREG) {
#pragma unroll
          for (int e = 0; e < 4; ++e) dst[mt][e] = qf[mt][ks][e];
        } else {
          ldmatrix_x4(swz_addr<T, D>(q_base, mt * 16, 2 * ks), dst[mt][0], dst[mt][1], dst[mt][2],
                      dst[mt][3]);
        }
      }
    };
    if constexpr (PIPE) {
      // Steps j = (k-step, n16 pair), K's fragment of step j + 1 (and Q's at a new k-step) loaded
      // while step j's mmas issue.
      constexpr int kPairs = kSTiles / 2, kSteps = kKSteps * kPairs;
      uint32_t a[2][MT][4], b[2][4];
      auto load_b = [&](int j, uint32_t(&dst)[4]) {
        ldmatrix_x4(swz_addr<T, D>(k_base, (j % kPairs) * 16, 2 * (j / kPairs)), dst[0], dst[1],
                    dst[2], dst[3]);
      };
      load_a(0, a[0]);
      load_b(0, b[0]);
#pragma unroll
      for (int j = 0; j < kSteps; ++j) {
        if (j + 1 < kSteps) {
          if ((j + 1) % kPairs == 0) load_a((j + 1) / kPairs, a[((j + 1) / kPairs) % 2]);
          load_b(j + 1, b[(j + 1) % 2]);
        }
        const int n = (j % kPairs) * 2;
        const auto& af = a[(j / kPairs) % 2];
        const auto& bf = b[j % 2];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          mma16816<T>(acc[mt][n], af[mt], bf[0], bf[1]);
          mma16816<T>(acc[mt][n + 1], af[mt], bf[2], bf[3]);
        }
        if (j == kPairs - 1) after_first();
      }
    }
    // The plain walk (zero trips when PIPE: the pipelined one above did the work).
#pragma unroll
    for (int ks = 0; ks < (PIPE ? 0 : kKSteps); ++ks) {
      uint32_t a[MT][4];
      load_a(ks, a);
#pragma unroll
      for (int n = 0; n < kSTiles; n += 2)
        mma_b_pair<T, false, MT>(
            swz_addr<T, D>(k_base, n * 8, 2 * ks), [&](int m) { return a[m]; },
            [&](int m, int j) { return acc[m][n + j]; });
      if (ks == 0) after_first();
    }
  };
  auto nothing = [] {};
  float sc[MT][kSTiles][4];  // S of tile t (OVL: computed one iteration ahead)
  for (int t = t_begin; t < t_end; ++t) {
    // Tile t has landed (OVL: t + 1 as well); later groups may still be in flight.
    cp_async_wait<OVL ? kStages - 3 : kStages - 2>();
    __syncthreads();  // ... for every thread; and everyone is done with tile t - 1
    // Refills the stage tile t - 1 used with tile t + kStages - 1: one commit group a tile. LATE
    // issues it after the first k-step of this tile's Q K^T, so its address arithmetic follows mmas
    // already in the pipe (the backward's same move: +3-4%, H100, 73c82e9), instead of here.
    bool refilled = false;
    auto refill = [&] {
      const int tn = t + kStages - 1, sn = (tn - t_begin) % kStages;
      if (tn < t_end) {
        if constexpr (PAGED) {
          win.load_tile<T, BN, D, kNT>(sK + sn * BN * D, sV + sn * BN * D, gk, gv, p, pages_row, tn,
                                       s.lk);
        } else {
          load_tile<T, BN, D, kNT>(sK + sn * BN * D, gk, k_rs, tn * BN, s.lk, p.dim_qk);
          load_tile<T, BN, D, kNT>(sV + sn * BN * D, gv, v_rs, tn * BN, s.lk, p.dim_v);
        }
      }
      cp_async_commit();
      refilled = true;
    };
    if constexpr (!LATE) refill();
    const int stage = (t - t_begin) % kStages;
    const T* tK = sK + stage * BN * D;
    const T* tV = sV + stage * BN * D;
    if (active) {
      if constexpr (QREG) {
        if (t == t_begin) {
#pragma unroll
          for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int ks = 0; ks < kKSteps; ++ks)
              ldmatrix_x4(swz_addr<T, D>(q_base, mt * 16, 2 * ks), qf[mt][ks][0], qf[mt][ks][1],
                          qf[mt][ks][2], qf[mt][ks][3]);
        }
      }
      float s_next[OVL ? MT : 1][OVL ? kSTiles : 1][4];
      if constexpr (OVL) {
        if (t == t_begin) qk(tK, sc, nothing);
        // Independent of the softmax below: the mma pipe works while the exp2s run.
        if (t + 1 < t_end) qk(sK + ((t + 1 - t_begin) % kStages) * BN * D, s_next, nothing);
      } else if constexpr (LATE) {
        qk(tK, sc, refill);
      } else {
        qk(tK, sc, nothing);
      }
      // Scale (+ soft-cap) into the exp2 domain, mask, online softmax.
      const int n0 = t * BN;
      const bool full = n0 >= full_lo && n0 + BN <= full_hi;  // every row sees the whole tile
      uint32_t pf[MT][kSTiles][2];  // P as 16-bit pairs, laid out as mma A fragments
      // O += P V. With STR it runs inside each softmax variant: the join after the two variants
      // was a basic-block boundary between the exponentials and these mmas, which ptxas does not
      // schedule across, so each warp issued all its MUFU work and then all its mma work (SASS of
      // m32s_n128, e74b28c); FlashAttention-2's loop issues P V's mmas between the exponentials
      // of later keys. Now the second m16 tile's exponentials share a block with the mmas (the
      // first tile's stay behind its rescale vote: one vote for both, or the exponentials in key
      // order, made ptxas spill 164-192 bytes here).
      auto pv = [&] {
        const SwzBases v_base = swz_bases<T, D>(smem_u32(tV), (lane % 8) + (mi % 2) * 8, mi / 2);
        if constexpr (PIPE) {  // V's fragment of step (k16, d16 pair) j + 1 loaded under step j
          constexpr int kPairs = kOTiles / 2, kSteps = BN / 16 * kPairs;
          uint32_t b[2][4];
          auto load_b = [&](int j, uint32_t(&dst)[4]) {
            ldmatrix_x4_trans(swz_addr<T, D>(v_base, (j / kPairs) * 16, (j % kPairs) * 2), dst[0],
                              dst[1], dst[2], dst[3]);
          };
          load_b(0, b[0]);
#pragma unroll
          for (int j = 0; j < kSteps; ++j) {
            if (j + 1 < kSteps) load_b(j + 1, b[(j + 1) % 2]);
            const int kk = j / kPairs, d = (j % kPairs) * 2;
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
              const uint32_t a[4] = {pf[mt][2 * kk][0], pf[mt][2 * kk][1], pf[mt][2 * kk + 1][0],
                                     pf[mt][2 * kk + 1][1]};
              mma16816<T>(o[mt][d], a, b[j % 2][0], b[j % 2][1]);
              mma16816<T>(o[mt][d + 1], a, b[j % 2][2], b[j % 2][3]);
            }
          }
        } else {
#pragma unroll
          for (int kk = 0; kk < BN / 16; ++kk) {
#pragma unroll
            for (int d = 0; d < kOTiles; d += 2) {
              uint32_t b0, b1, b2, b3;
              ldmatrix_x4_trans(swz_addr<T, D>(v_base, kk * 16, d), b0, b1, b2, b3);
#pragma unroll
              for (int mt = 0; mt < MT; ++mt) {
                const uint32_t a[4] = {pf[mt][2 * kk][0], pf[mt][2 * kk][1], pf[mt][2 * kk + 1][0],
                                       pf[mt][2 * kk + 1][1]};
                mma16816<T>(o[mt][d], a, b0, b1);
                mma16816<T>(o[mt][d + 1], a, b2, b3);
              }
            }
          }
        }
      };
      // The MmaShapeM16 shapes (and STR = 2) take the branch-free variants; the MmaShape ones
      // keep the per-element branches they were measured with (they sit at 255 registers, where
      // the straight-line variants made ptxas spill).
      constexpr bool kStraight = (MT == 1 && BN == 64) || STR == 2;
      if constexpr (kStraight) prep_scores<false>(sc, p, sl2, n0, tq, lo_r, hi_r, capped, !full);
      if constexpr (STR != 0) {
        // The whole softmax twice, so that tiles without cap or mask run straight-line code (STR
        // = 2: the other copy is straight-line too; a single text for both made ptxas spill 52
        // bytes at D = 128, two texts none).
        const bool fast = !capped && full;  // block-uniform
        auto softmax = [&](auto fast_tag) {
          constexpr bool kFast = decltype(fast_tag)::value;
          // kFast tiles (and kStraight's uncapped ones) keep raw scores: the scale goes into the
          // exponentials' FFMA (ks); the per-element loop below scales as it goes (ks = 1).
          if constexpr (kFast) scores_to_log2<false, false, false>(sc, p, sl2, n0, tq, lo_r, hi_r);
          const float ks = STR == 3                          ? (capped ? 1.f : sl2)
                           : kFast || (kStraight && !capped) ? sl2
                                                             : 1.f;
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) {
            float mx0 = -INFINITY, mx1 = -INFINITY;  // this tile's, in the scores' units
#pragma unroll
            for (int n = 0; n < kSTiles; ++n) {
              if constexpr (!kStraight && !kFast) {
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                  float x = sc[mt][n][e];
                  x = capped ? p.softcap * tanhf(x * p.scale / p.softcap) * log2e : x * sl2;
                  if (!full) {
                    const int col = n0 + n * 8 + 2 * tq + (e & 1);
                    const int hf = e >> 1;
                    const int rl = warp * 16 * MT + mt * 16 + hf * 8 + g;
                    const int lo = Cfg::kBoundsSmem ? sBounds[2 * rl] : lo_r[mt][hf];
                    const int hi = Cfg::kBoundsSmem ? sBounds[2 * rl + 1] : hi_r[mt][hf];
                    if (col < lo || col >= hi) x = -INFINITY;
                  }
                  sc[mt][n][e] = x;
                }
              }
              mx0 = fmaxf(mx0, fmaxf(sc[mt][n][0], sc[mt][n][1]));
              mx1 = fmaxf(mx1, fmaxf(sc[mt][n][2], sc[mt][n][3]));
            }
#pragma unroll
            for (int o2 = 1; o2 < 4; o2 <<= 1) {
              mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, o2));
              mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, o2));
            }
            mx0 = fmaxf(m_r[mt][0], mx0 * ks), mx1 = fmaxf(m_r[mt][1], mx1 * ks);
            // A row that has seen only masked keys keeps max -inf: use 0 as the base so exp2 gives
            // 0.
            const float base0 = mx0 == -INFINITY ? 0.f : mx0;
            const float base1 = mx1 == -INFINITY ? 0.f : mx1;
            const float corr0 = exp2_ftz(m_r[mt][0] - base0), corr1 = exp2_ftz(m_r[mt][1] - base1);
            m_r[mt][0] = mx0, m_r[mt][1] = mx1;
            rescale_rows(o[mt], l_r[mt], corr0, corr1);
#pragma unroll
            for (int n = 0; n < kSTiles; ++n) {
              const float p0 = exp2_ftz(fmaf(sc[mt][n][0], ks, -base0)),
                          p1 = exp2_ftz(fmaf(sc[mt][n][1], ks, -base0));
              const float p2 = exp2_ftz(fmaf(sc[mt][n][2], ks, -base1)),
                          p3 = exp2_ftz(fmaf(sc[mt][n][3], ks, -base1));
              l_r[mt][0] += p0 + p1;
              l_r[mt][1] += p2 + p3;
              pf[mt][n][0] = pack2<T>(p0, p1);
              pf[mt][n][1] = pack2<T>(p2, p3);
            }
          }
          pv();
        };
        if constexpr (STR == 3) {  // one text; capped or masked tiles converted before it
          static_assert(!Cfg::kBoundsSmem, "STR = 3 reads the rows' bounds from registers");
          if (capped) {
            cap_scores(sc, p);
            scores_to_log2<false, true, false>(sc, p, sl2, n0, tq, lo_r, hi_r);
          } else if (!full) {
            scores_to_log2<false, true, false>(sc, p, sl2, n0, tq, lo_r, hi_r);
          }
          softmax(std::true_type{});
        } else if (fast) {
          softmax(std::true_type{});
        } else {
          softmax(std::false_type{});
        }
      } else {  // the other shapes (their SASS unchanged by STR)
        // kStraight's uncapped tiles hold raw scores (prep_scores<false>): ks folds the scale
        // into the exponentials; the per-element loop below scales as it goes (ks = 1).
        const float ks = kStraight && !capped ? sl2 : 1.f;
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          float mx0 = -INFINITY, mx1 = -INFINITY;  // this tile's, in the scores' units
#pragma unroll
          for (int n = 0; n < kSTiles; ++n) {
            if constexpr (!kStraight) {
#pragma unroll
              for (int e = 0; e < 4; ++e) {
                float x = sc[mt][n][e];
                x = capped ? p.softcap * tanhf(x * p.scale / p.softcap) * log2e : x * sl2;
                if (!full) {
                  const int col = n0 + n * 8 + 2 * tq + (e & 1);
                  const int hf = e >> 1;
                  const int rl = warp * 16 * MT + mt * 16 + hf * 8 + g;
                  const int lo = Cfg::kBoundsSmem ? sBounds[2 * rl] : lo_r[mt][hf];
                  const int hi = Cfg::kBoundsSmem ? sBounds[2 * rl + 1] : hi_r[mt][hf];
                  if (col < lo || col >= hi) x = -INFINITY;
                }
                sc[mt][n][e] = x;
              }
            }
            mx0 = fmaxf(mx0, fmaxf(sc[mt][n][0], sc[mt][n][1]));
            mx1 = fmaxf(mx1, fmaxf(sc[mt][n][2], sc[mt][n][3]));
          }
#pragma unroll
          for (int o2 = 1; o2 < 4; o2 <<= 1) {
            mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, o2));
            mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, o2));
          }
          mx0 = fmaxf(m_r[mt][0], mx0 * ks), mx1 = fmaxf(m_r[mt][1], mx1 * ks);
          // A row that has seen only masked keys keeps max -inf: use 0 as the base so exp2 gives 0.
          const float base0 = mx0 == -INFINITY ? 0.f : mx0;
          const float base1 = mx1 == -INFINITY ? 0.f : mx1;
          const float corr0 = exp2_ftz(m_r[mt][0] - base0), corr1 = exp2_ftz(m_r[mt][1] - base1);
          m_r[mt][0] = mx0, m_r[mt][1] = mx1;
          rescale_rows(o[mt], l_r[mt], corr0, corr1);
#pragma unroll
          for (int n = 0; n < kSTiles; ++n) {
            const float p0 = exp2_ftz(fmaf(sc[mt][n][0], ks, -base0)),
                        p1 = exp2_ftz(fmaf(sc[mt][n][1], ks, -base0));
            const float p2 = exp2_ftz(fmaf(sc[mt][n][2], ks, -base1)),
                        p3 = exp2_ftz(fmaf(sc[mt][n][3], ks, -base1));
            l_r[mt][0] += p0 + p1;
            l_r[mt][1] += p2 + p3;
            pf[mt][n][0] = pack2<T>(p0, p1);
            pf[mt][n][1] = pack2<T>(p2, p3);
          }
        }
      }
      if constexpr (STR == 0) pv();
      if constexpr (OVL) {
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
          for (int n = 0; n < kSTiles; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) sc[mt][n][e] = s_next[mt][n][e];
      }
    }
    if (!refilled) refill();  // LATE: warps without rows
  }
  cp_async_wait<0>();
  if (!active) return;

  const float ln2 = 0.6931471805599453f;
  const int64_t rows = int64_t{p.batch} * p.heads_q * p.len_q;
  // Unpacked rows all belong to head hh: one base address per tensor and a row stride (the
  // per-row head / query / offset math was ~7% of the d64 L512 forward's stall samples).
  T* const y_head = static_cast<T*>(p.out) + detail::row_offset(p.sy, p.varlen, b, hh, s.q0);
  float* const lse_head =
      static_cast<float*>(p.lse) + detail::lse_offset(p.sl, p.varlen, b, hh, s.q0);
  const int64_t y_rs = p.varlen ? p.sy[0] : p.sy[2], lse_rs = p.varlen ? p.sl[1] : p.sl[2];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      float l = l_r[mt][hf];
#pragma unroll
      for (int o2 = 1; o2 < 4; o2 <<= 1) l += __shfl_xor_sync(0xffffffffu, l, o2);
      const int row = w0 + mt * 16 + hf * 8 + g;
      if (row >= rows_total) continue;
      const float inv = l > 0 ? 1.f / l : 0.f;
      const float lse = l > 0 ? (m_r[mt][hf] + log2f(l)) * ln2 : -INFINITY;
      if (p.splits > 1) {  // partial results in f32, merged by flash_fwd_combine
        const int h = head_of(row), r = query_of(row);
        const int64_t ridx = split * rows + (int64_t{b} * p.heads_q + h) * p.len_q + r;
        float* dst = p.o_part + ridx * p.dim_v;
#pragma unroll
        for (int d = 0; d < kOTiles; ++d) {
          const int col = d * 8 + 2 * tq;
          if (col < p.dim_v) {
            dst[col] = o[mt][d][hf * 2] * inv;
            dst[col + 1] = o[mt][d][hf * 2 + 1] * inv;
          }
        }
        if (tq == 0) p.lse_part[ridx] = lse;
        continue;
      }
      T* dst = y_head + row * y_rs;
      float* lse_dst = lse_head + row * lse_rs;
      if (p.pack) {
        const int h = head_of(row), r = query_of(row);
        dst = static_cast<T*>(p.out) + detail::row_offset(p.sy, p.varlen, b, h, s.q0 + r);
        lse_dst = static_cast<float*>(p.lse) + detail::lse_offset(p.sl, p.varlen, b, h, s.q0 + r);
      }
#pragma unroll
      for (int d = 0; d < kOTiles; ++d) {
        const int col = d * 8 + 2 * tq;
        if (col < p.dim_v)
          *reinterpret_cast<uint32_t*>(dst + col) =
              pack2<T>(o[mt][d][hf * 2] * inv, o[mt][d][hf * 2 + 1] * inv);
      }
      if (tq == 0) *lse_dst = lse;
    }
  }
}

// ---- Tensor-core backward (f16/bf16)
// --------------------------------------------------------------- Two deterministic kernels, no
// atomics: dK/dV with a CTA per block of 64 keys of one K/V head (looping over the group's query
// heads and the query tiles in a fixed order) and dQ with a CTA per block of 64 query rows (looping
// over key tiles). S and P are recomputed in each; P and dS are rounded to the 16-bit type for the
// tensor cores, as FlashAttention-2 does. At a padded head dim of 256 a warp's dK and dV (16 keys
// x 256 columns each) would need 256 accumulator registers, so the key-block kernel runs twice,
// once per output (KvOut): three launches in all, S recomputed once more.
enum KvOut : int { kDkDv = 0, kDkOnly = 1, kDvOnly = 2 };
template <class T, int D, int BQ>
struct BwdKvCfg {
  static constexpr int kKeys = 64;  // 4 warps x 16 keys
  // K and V once, then two stages of (Q, dY, LSE, delta) query tiles.
  static constexpr size_t kSmem =
      sizeof(T) * (2 * size_t{kKeys} * D + 4 * size_t{BQ} * D) + 4 * BQ * sizeof(float);
};

// The score after scale and soft-cap, and d(capped)/d(scaled raw).
__device__ __forceinline__ float capped_score(float raw, float scale, float cap, float* dcap) {
  float x = raw * scale;
  *dcap = 1.f;
  if (cap > 0) {
    const float th = tanhf(x / cap);
    x = cap * th;
    *dcap = 1.f - th * th;
  }
  return x;
}

// Pieces both key-block backward kernels (flash_bwd_dkdv_mma, flash_bwd_fused_mma) share.
// K, and V where `with_v`, of key block k0 of K/V head hk of batch b into sK / sV (cp.async; the
// caller commits).
template <class T, int kKeys, int D, int kNT>
__device__ __forceinline__ void load_kv_block(const Params& p, int b, int hk, const SeqRows& s,
                                              int k0, T* sK, T* sV, bool with_v) {
  const T* gk = static_cast<const T*>(p.k) + detail::row_offset(p.sk, p.varlen, b, hk, s.k0);
  load_tile<T, kKeys, D, kNT>(sK, gk, p.varlen ? p.sk[0] : p.sk[2], k0, s.lk, p.dim_qk);
  if (!with_v) return;
  const T* gv = static_cast<const T*>(p.v) + detail::row_offset(p.sv, p.varlen, b, hk, s.k0);
  load_tile<T, kKeys, D, kNT>(sV, gv, p.varlen ? p.sv[0] : p.sv[2], k0, s.lk, p.dim_v);
}
// The Q and dY tiles of query head h, rows i0 .. i0 + BQ, into sQ / sG (cp.async; uncommitted).
template <class T, int BQ, int D, int kNT>
__device__ __forceinline__ void load_q_dy_tiles(const Params& p, int b, int h, const SeqRows& s,
                                                int i0, T* sQ, T* sG) {
  const T* gq = static_cast<const T*>(p.q) + detail::row_offset(p.sq, p.varlen, b, h, s.q0);
  const T* gg = static_cast<const T*>(p.dy) + detail::row_offset(p.sdy, p.varlen, b, h, s.q0);
  load_tile<T, BQ, D, kNT>(sQ, gq, p.varlen ? p.sq[0] : p.sq[2], i0, s.lq, p.dim_qk);
  load_tile<T, BQ, D, kNT>(sG, gg, p.varlen ? p.sdy[0] : p.sdy[2], i0, s.lq, p.dim_v);
}
// A fragments (ldmatrix x4) of two m16 tiles, rows 0 and 16 of a swizzled tile, at chunk `chunk`.
template <class T, int kCols>
__device__ __forceinline__ void ldmatrix_m16x2(const SwzBases& base, int chunk,
                                               uint32_t (&dst)[2][4]) {
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
    ldmatrix_x4(swz_addr<T, kCols>(base, mt * 16, chunk), dst[mt][0], dst[mt][1], dst[mt][2],
                dst[mt][3]);
}

// The query tiles [*begin, *end) of BQ rows that see any of the keys [k0, k0 + keys): one range,
// since the visible bounds grow with the row.
template <int BQ>
__device__ __forceinline__ void query_tiles_seeing(const Params& p, const SeqRows& s, int k0,
                                                   int keys, int* begin, int* end) {
  const int n_tiles = (s.lq + BQ - 1) / BQ;
  *begin = n_tiles, *end = 0;
  for (int qt = 0; qt < n_tiles; ++qt) {
    const int i0 = qt * BQ, i_last = min(i0 + BQ, s.lq) - 1;
    int64_t lo_f, hi_f, lo_l, hi_l;
    detail::visible_keys(p.band, i0, s.lq, s.lk, &lo_f, &hi_f);
    detail::visible_keys(p.band, i_last, s.lq, s.lk, &lo_l, &hi_l);
    if (hi_l <= k0 || lo_f >= k0 + keys) continue;
    *begin = min(*begin, qt), *end = qt + 1;
  }
}

template <class T, int D, int BQ, int kOut = kDkDv>
__global__ void __launch_bounds__(128) flash_bwd_dkdv_mma(Params p) {
  constexpr bool kDk = kOut != kDvOnly, kDv = kOut != kDkOnly;
  using Cfg = BwdKvCfg<T, D, BQ>;
  constexpr int kKeys = Cfg::kKeys, kNT = 128;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* sK = reinterpret_cast<T*>(smem_raw);
  T* sV = sK + kKeys * D;
  T* sQ0 = sV + kKeys * D;                                    // two stages
  T* sG0 = sQ0 + 2 * BQ * D;                                  // dY tiles, two stages
  float* sLse0 = reinterpret_cast<float*>(sG0 + 2 * BQ * D);  // LSE * log2(e); +inf when empty
  float* sDelta0 = sLse0 + 2 * BQ;
  if ((smem_u32(smem_raw) & 127u) != 0) __trap();  // swz_addr: 128-byte aligned tiles

  // Block -> (key block, K/V head, batch) in grid_place's order (heaviest causal blocks first).
  const int k_blocks = (p.len_k + kKeys - 1) / kKeys;
  const GridPlace at = grid_place(static_cast<int>(blockIdx.x), k_blocks, p.heads_kv, p.band);
  const int kb = at.blk, hk = at.head, b = at.rest;
  const SeqRows s = seq_rows(p, b);
  const int k0 = kb * kKeys;
  if (k0 >= s.lk) return;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, tq = lane % 4;
  const float log2e = 1.4426950408889634f;
  load_kv_block<T, kKeys, D, kNT>(p, b, hk, s, k0, sK, sV, kDk);  // V for dP
  cp_async_commit();

  constexpr int kOTiles = D / 8, kSTiles = BQ / 8, kKSteps = D / 16;
  float dk[kDk ? kOTiles : 1][4], dv[kDv ? kOTiles : 1][4];
#pragma unroll
  for (int d = 0; d < (kDk ? kOTiles : 1); ++d)
#pragma unroll
    for (int e = 0; e < 4; ++e) dk[d][e] = 0.f;
#pragma unroll
  for (int d = 0; d < (kDv ? kOTiles : 1); ++d)
#pragma unroll
    for (int e = 0; e < 4; ++e) dv[d][e] = 0.f;
  const int key_a = k0 + warp * 16 + g;  // this thread's keys: key_a, key_a + 8

  int qt_begin, qt_end;
  query_tiles_seeing<BQ>(p, s, k0, kKeys, &qt_begin, &qt_end);
  const int n_qt = max(qt_end - qt_begin, 0), n_it = p.group * n_qt;
  // Iteration `it` covers query head hk * group + it / n_qt and query tile qt_begin + it % n_qt;
  // its loads go to stage it % 2, issued one iteration ahead of use.
  auto issue = [&](int it) {
    if (it < n_it) {
      const int h = hk * p.group + it / n_qt, i0 = (qt_begin + it % n_qt) * BQ, st = it & 1;
      load_q_dy_tiles<T, BQ, D, kNT>(p, b, h, s, i0, sQ0 + st * BQ * D, sG0 + st * BQ * D);
      if (threadIdx.x < BQ) {
        const int i = i0 + threadIdx.x;
        float l = INFINITY, dl = 0.f;
        if (i < s.lq) {
          const float v =
              static_cast<const float*>(p.lse)[detail::lse_offset(p.sl, p.varlen, b, h, s.q0 + i)];
          l = v == -INFINITY ? INFINITY : v * log2e;
          dl = static_cast<const float*>(p.delta)[(int64_t{b} * p.heads_q + h) * p.len_q + i];
        }
        sLse0[st * BQ + threadIdx.x] = l;
        sDelta0[st * BQ + threadIdx.x] = dl;
      }
    }
    cp_async_commit();
  };
  issue(0);
  for (int it = 0; it < n_it; ++it) {
    cp_async_wait<0>();  // this iteration's tiles (and K/V) have landed
    __syncthreads();     // for every thread; and iteration it - 1 is consumed
    issue(it + 1);
    {
      const int stage = it & 1, i0 = (qt_begin + it % n_qt) * BQ;
      const T* sQ = sQ0 + stage * BQ * D;
      const T* sG = sG0 + stage * BQ * D;
      const float* sLse = sLse0 + stage * BQ;
      const float* sDelta = sDelta0 + stage * BQ;
      // S^T = K Q^T and dP^T = V dY^T for this warp's 16 keys x BQ queries.
      float st[kSTiles][4], dpt[kSTiles][4];
#pragma unroll
      for (int n = 0; n < kSTiles; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) st[n][e] = dpt[n][e] = 0.f;
      // ldmatrix bases (swz_bases): A rows of this warp's keys, B rows of the query tile, and
      // the query tile transposed as B of dV / dK.
      const int mi = lane / 8;
      const SwzBases k_a = swz_bases<T, D>(smem_u32(sK + warp * 16 * D), lane % 16, lane / 16);
      const SwzBases v_a = swz_bases<T, D>(smem_u32(sV + warp * 16 * D), lane % 16, lane / 16);
      const SwzBases q_b = swz_bases<T, D>(smem_u32(sQ), (lane % 8) + (mi / 2) * 8, mi % 2);
      const SwzBases g_b = swz_bases<T, D>(smem_u32(sG), (lane % 8) + (mi / 2) * 8, mi % 2);
#pragma unroll
      for (int ks = 0; ks < kKSteps; ++ks) {
        uint32_t ak[4], av[4] = {0, 0, 0, 0};
        ldmatrix_x4(swz_addr<T, D>(k_a, 0, 2 * ks), ak[0], ak[1], ak[2], ak[3]);
        if constexpr (kDk) ldmatrix_x4(swz_addr<T, D>(v_a, 0, 2 * ks), av[0], av[1], av[2], av[3]);
#pragma unroll
        for (int n = 0; n < kSTiles; n += 2) {
          mma_b_pair<T, false>(
              swz_addr<T, D>(q_b, n * 8, 2 * ks), [&](int) { return ak; },
              [&](int, int j) { return st[n + j]; });
          if constexpr (kDk)  // dP^T only feeds dS
            mma_b_pair<T, false>(
                swz_addr<T, D>(g_b, n * 8, 2 * ks), [&](int) { return av; },
                [&](int, int j) { return dpt[n + j]; });
        }
      }
      // P^T and dS^T (w.r.t. the raw dot product), as A fragments over the query axis.
      uint32_t pf[kSTiles][2], sf[kSTiles][2];
#pragma unroll
      for (int n = 0; n < kSTiles; ++n) {
        float pv[4], dsv[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int key = key_a + (e >> 1) * 8;
          const int qc = n * 8 + 2 * tq + (e & 1), i = i0 + qc;
          int64_t lo, hi;
          detail::visible_keys(p.band, i, s.lq, s.lk, &lo, &hi);
          float dc;
          const float x = capped_score(st[n][e], p.scale, p.softcap, &dc);
          const bool vis = i < s.lq && key >= lo && key < hi;
          const float pr = vis ? exp2f(x * log2e - sLse[qc]) : 0.f;
          pv[e] = pr;
          dsv[e] = pr * (dpt[n][e] - sDelta[qc]) * dc * p.scale;
        }
        pf[n][0] = pack2<T>(pv[0], pv[1]);
        pf[n][1] = pack2<T>(pv[2], pv[3]);
        sf[n][0] = pack2<T>(dsv[0], dsv[1]);
        sf[n][1] = pack2<T>(dsv[2], dsv[3]);
      }
      // dV += P^T dY, dK += dS^T Q.
      const SwzBases g_t = swz_bases<T, D>(smem_u32(sG), (lane % 8) + (mi % 2) * 8, mi / 2);
      const SwzBases q_t = swz_bases<T, D>(smem_u32(sQ), (lane % 8) + (mi % 2) * 8, mi / 2);
#pragma unroll
      for (int kk = 0; kk < BQ / 16; ++kk) {
        const uint32_t ap[4] = {pf[2 * kk][0], pf[2 * kk][1], pf[2 * kk + 1][0], pf[2 * kk + 1][1]};
        const uint32_t as[4] = {sf[2 * kk][0], sf[2 * kk][1], sf[2 * kk + 1][0], sf[2 * kk + 1][1]};
#pragma unroll
        for (int d = 0; d < kOTiles; d += 2) {
          if constexpr (kDv)
            mma_b_pair<T, true>(
                swz_addr<T, D>(g_t, kk * 16, d), [&](int) { return ap; },
                [&](int, int j) { return dv[d + j]; });
          if constexpr (kDk)
            mma_b_pair<T, true>(
                swz_addr<T, D>(q_t, kk * 16, d), [&](int) { return as; },
                [&](int, int j) { return dk[d + j]; });
        }
      }
    }
  }
  cp_async_wait<0>();
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    const int key = key_a + hf * 8;
    if (key >= s.lk) continue;
    T* ok = static_cast<T*>(p.dk) + detail::row_offset(p.sdk, p.varlen, b, hk, s.k0 + key);
    T* ov = static_cast<T*>(p.dv) + detail::row_offset(p.sdv, p.varlen, b, hk, s.k0 + key);
#pragma unroll
    for (int d = 0; d < kOTiles; ++d) {
      const int c = d * 8 + 2 * tq;
      if constexpr (kDk)
        if (c < p.dim_qk)
          *reinterpret_cast<uint32_t*>(ok + c) = pack2<T>(dk[d][hf * 2], dk[d][hf * 2 + 1]);
      if constexpr (kDv)
        if (c < p.dim_v)
          *reinterpret_cast<uint32_t*>(ov + c) = pack2<T>(dv[d][hf * 2], dv[d][hf * 2 + 1]);
    }
  }
}

template <class T, int D, int BN>
struct BwdQCfg {
  static constexpr int kRows = 64;  // 4 warps x 16 rows
  // Q and dY once, then two stages of (K, V) tiles.
  static constexpr size_t kSmem = sizeof(T) * (2 * size_t{kRows} * D + 4 * size_t{BN} * D);
};

template <class T, int D, int BN>
__global__ void __launch_bounds__(128) flash_bwd_dq_mma(Params p) {
  using Cfg = BwdQCfg<T, D, BN>;
  constexpr int kM = Cfg::kRows, kNT = 128;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* sQ = reinterpret_cast<T*>(smem_raw);
  T* sG = sQ + kM * D;
  T* sK0 = sG + kM * D;                            // two stages
  T* sV0 = sK0 + 2 * BN * D;                       // two stages
  if ((smem_u32(smem_raw) & 127u) != 0) __trap();  // swz_addr: 128-byte aligned tiles

  // Block -> (m-block, head, batch) in grid_place's order (heaviest causal blocks first).
  const int m_blocks = (p.len_q + kM - 1) / kM;
  const GridPlace at = grid_place(static_cast<int>(blockIdx.x), m_blocks, p.heads_q, p.band);
  const int mb = m_blocks - 1 - at.blk;
  const int h = at.head, b = at.rest;
  const SeqRows s = seq_rows(p, b);
  const int m0 = mb * kM;
  if (m0 >= s.lq) return;
  const int hk = h / p.group;
  const int m_last = min(m0 + kM, s.lq) - 1;
  int64_t lo0, hi0, lo1, hi1;
  detail::visible_keys(p.band, m0, s.lq, s.lk, &lo0, &hi0);
  detail::visible_keys(p.band, m_last, s.lq, s.lk, &lo1, &hi1);
  const int t_begin = static_cast<int>(lo0 / BN);
  const int t_end = static_cast<int>((max(hi1, lo0) + BN - 1) / BN);

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, tq = lane % 4;
  const float log2e = 1.4426950408889634f;
  const int64_t q_rs = p.varlen ? p.sq[0] : p.sq[2];
  const int64_t g_rs = p.varlen ? p.sdy[0] : p.sdy[2];
  const int64_t k_rs = p.varlen ? p.sk[0] : p.sk[2];
  const int64_t v_rs = p.varlen ? p.sv[0] : p.sv[2];
  const T* gq = static_cast<const T*>(p.q) + detail::row_offset(p.sq, p.varlen, b, h, s.q0);
  const T* gg = static_cast<const T*>(p.dy) + detail::row_offset(p.sdy, p.varlen, b, h, s.q0);
  const T* gk = static_cast<const T*>(p.k) + detail::row_offset(p.sk, p.varlen, b, hk, s.k0);
  const T* gv = static_cast<const T*>(p.v) + detail::row_offset(p.sv, p.varlen, b, hk, s.k0);
  load_tile<T, kM, D, kNT>(sQ, gq, q_rs, m0, s.lq, p.dim_qk);
  load_tile<T, kM, D, kNT>(sG, gg, g_rs, m0, s.lq, p.dim_v);
  if (t_begin < t_end) {
    load_tile<T, BN, D, kNT>(sK0, gk, k_rs, t_begin * BN, s.lk, p.dim_qk);
    load_tile<T, BN, D, kNT>(sV0, gv, v_rs, t_begin * BN, s.lk, p.dim_v);
  }
  cp_async_commit();

  // This thread's rows, their key ranges, LSE (log2 domain, +inf when empty) and delta.
  int lo_r[2], hi_r[2];
  float lse_r[2], delta_r[2];
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    const int i = m0 + warp * 16 + hf * 8 + g;
    int64_t lo, hi;
    detail::visible_keys(p.band, i, s.lq, s.lk, &lo, &hi);
    lo_r[hf] = static_cast<int>(lo), hi_r[hf] = static_cast<int>(hi);
    lse_r[hf] = INFINITY, delta_r[hf] = 0.f;
    if (i < s.lq) {
      const float v =
          static_cast<const float*>(p.lse)[detail::lse_offset(p.sl, p.varlen, b, h, s.q0 + i)];
      lse_r[hf] = v == -INFINITY ? INFINITY : v * log2e;
      delta_r[hf] = static_cast<const float*>(p.delta)[(int64_t{b} * p.heads_q + h) * p.len_q + i];
    }
  }

  constexpr int kOTiles = D / 8, kSTiles = BN / 8, kKSteps = D / 16;
  float dq[kOTiles][4];
#pragma unroll
  for (int d = 0; d < kOTiles; ++d) dq[d][0] = dq[d][1] = dq[d][2] = dq[d][3] = 0.f;

  for (int t = t_begin; t < t_end; ++t) {
    cp_async_wait<0>();  // tile t has landed
    __syncthreads();     // for every thread; and tile t - 1 is consumed
    const int st = (t - t_begin) & 1;
    if (t + 1 < t_end) {  // prefetch tile t + 1 into the other stage
      load_tile<T, BN, D, kNT>(sK0 + (st ^ 1) * BN * D, gk, k_rs, (t + 1) * BN, s.lk, p.dim_qk);
      load_tile<T, BN, D, kNT>(sV0 + (st ^ 1) * BN * D, gv, v_rs, (t + 1) * BN, s.lk, p.dim_v);
    }
    cp_async_commit();
    const T* sK = sK0 + st * BN * D;
    const T* sV = sV0 + st * BN * D;
    float sc[kSTiles][4], dp[kSTiles][4];
#pragma unroll
    for (int n = 0; n < kSTiles; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) sc[n][e] = dp[n][e] = 0.f;
    // ldmatrix bases (swz_bases): A rows of this warp's queries, B rows of the key tile, and the
    // key tile transposed as B of dQ.
    const int mi = lane / 8;
    const SwzBases q_a = swz_bases<T, D>(smem_u32(sQ + warp * 16 * D), lane % 16, lane / 16);
    const SwzBases g_a = swz_bases<T, D>(smem_u32(sG + warp * 16 * D), lane % 16, lane / 16);
    const SwzBases k_b = swz_bases<T, D>(smem_u32(sK), (lane % 8) + (mi / 2) * 8, mi % 2);
    const SwzBases v_b = swz_bases<T, D>(smem_u32(sV), (lane % 8) + (mi / 2) * 8, mi % 2);
    const SwzBases k_t = swz_bases<T, D>(smem_u32(sK), (lane % 8) + (mi % 2) * 8, mi / 2);
#pragma unroll
    for (int ks = 0; ks < kKSteps; ++ks) {
      uint32_t aq[4], ag[4];
      ldmatrix_x4(swz_addr<T, D>(q_a, 0, 2 * ks), aq[0], aq[1], aq[2], aq[3]);
      ldmatrix_x4(swz_addr<T, D>(g_a, 0, 2 * ks), ag[0], ag[1], ag[2], ag[3]);
#pragma unroll
      for (int n = 0; n < kSTiles; n += 2) {
        mma_b_pair<T, false>(
            swz_addr<T, D>(k_b, n * 8, 2 * ks), [&](int) { return aq; },
            [&](int, int j) { return sc[n + j]; });
        mma_b_pair<T, false>(
            swz_addr<T, D>(v_b, n * 8, 2 * ks), [&](int) { return ag; },
            [&](int, int j) { return dp[n + j]; });
      }
    }
    uint32_t sf[kSTiles][2];
#pragma unroll
    for (int n = 0; n < kSTiles; ++n) {
      float dsv[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int hf = e >> 1;
        const int key = t * BN + n * 8 + 2 * tq + (e & 1);
        float dc;
        const float x = capped_score(sc[n][e], p.scale, p.softcap, &dc);
        const bool vis = key >= lo_r[hf] && key < hi_r[hf];
        const float pr = vis ? exp2f(x * log2e - lse_r[hf]) : 0.f;
        dsv[e] = pr * (dp[n][e] - delta_r[hf]) * dc * p.scale;
      }
      sf[n][0] = pack2<T>(dsv[0], dsv[1]);
      sf[n][1] = pack2<T>(dsv[2], dsv[3]);
    }
    // dQ += dS K.
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) {
      const uint32_t a[4] = {sf[2 * kk][0], sf[2 * kk][1], sf[2 * kk + 1][0], sf[2 * kk + 1][1]};
#pragma unroll
      for (int d = 0; d < kOTiles; d += 2)
        mma_b_pair<T, true>(
            swz_addr<T, D>(k_t, kk * 16, d), [&](int) { return a; },
            [&](int, int j) { return dq[d + j]; });
    }
  }
  cp_async_wait<0>();
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    const int i = m0 + warp * 16 + hf * 8 + g;
    if (i >= s.lq) continue;
    T* out = static_cast<T*>(p.dq) + detail::row_offset(p.sdq, p.varlen, b, h, s.q0 + i);
#pragma unroll
    for (int d = 0; d < kOTiles; ++d) {
      const int c = d * 8 + 2 * tq;
      if (c < p.dim_qk)
        *reinterpret_cast<uint32_t*>(out + c) = pack2<T>(dq[d][hf * 2], dq[d][hf * 2 + 1]);
    }
  }
}

// ---- Tensor-core backward, one pass (f16/bf16) ------------------------------------------------
// FlashAttention-2's schedule: a CTA per block of 128 keys of one K/V head (8 warps) loops over
// the query tiles of every query head of its group, with S^T and dP^T computed once per tile. dK
// and dV stay in registers (the group's sum, stored once); dQ = dS K of each tile is added into an
// f32 accumulator in the workspace by atomics (zeroed first, scaled and rounded into dQ by
// flash_bwd_dq_convert after), so it is not deterministic. P and dS are rounded to the 16-bit type
// for the tensor cores. The score scale is left out of dS (dK and dQ are scaled once at the end).
// kBulkDq (sm_90+): dQ of each tile goes through a shared staging tile, BQ rows of D floats at a
// pitch padded by 8 (2-way instead of 8-way bank conflicts for the fragments' 8-byte stores), and
// into the accumulator by one bulk reduce-add per row (the TMA unit adds in L2), instead of a
// red.global per fragment pair: those REDGs' address registers, reused at once by the next row's
// address, were the kernel's largest stall (long scoreboard, ~11% of samples at d64 L4096, ncu,
// H100, 028db09).
template <class T, int D, int BQ, bool kBulkDq = false>
struct BwdFusedCfg {
  static constexpr int kWarps = 8, kKeys = 16 * kWarps;
  static_assert(kKeys == detail::kBwdKeyBlock, "the host's tail split counts blocks of these");
  static constexpr int kRowGroups = BQ / 32;             // dQ: warps over 32-row groups ...
  static constexpr int kColSplit = kWarps / kRowGroups;  // ... and head-dim slices
  static_assert(kRowGroups * kColSplit == kWarps && D % (16 * kColSplit) == 0);
  // K and V once, two stages of (Q, dY) tiles, dS^T and P^T [keys][BQ], then per stage the LSE
  // (log2 domain), the delta and the visible key range [lo, hi) of each query row, in lane order
  // (row_slot).
  static constexpr int kDqPitch = D + 8;  // floats
  // row_slot: a lane's BQ / 8 query columns of S^T (its warp's half of the tile, columns
  // 8 n + 2 tq + {0, 1}) lie side by side, 16-byte aligned, so one 128-bit load covers two of its
  // n8 tiles; lanes of different tq sit kTqPitch floats apart (4 banks), so a warp's four
  // addresses meet no bank conflict (lanes of one tq read the same address).
  static constexpr int kTqPitch = BQ / 8 + 4, kHalfPitch = 4 * kTqPitch, kRowPitch = 2 * kHalfPitch;
  static_assert(kRowPitch == BQ + 32);
  __device__ static constexpr int row_slot(int q) {
    const int j = q % (BQ / 2);
    return (q / (BQ / 2)) * kHalfPitch + (j % 8) / 2 * kTqPitch + j / 8 * 2 + j % 2;
  }
  static constexpr size_t kSmem =
      sizeof(T) * (2 * size_t{kKeys} * D + 4 * size_t{BQ} * D + 2 * size_t{kKeys} * BQ) +
      2 * 4 * size_t{kRowPitch} * 4 + (kBulkDq ? sizeof(float) * BQ * kDqPitch : 0);
};

// acc[0:2] += {x, y} in global memory where `on` (the dQ accumulator; the tail's partial dK / dV).
// Volatile asm, so that dQ's reductions stay where the loop places them between the dV / dK mmas
// (volatile asm too) rather than bunched at the end of the tile; the predicate is inside the asm
// (ptxas still branches around each REDG).
__device__ __forceinline__ void red_pair_if(bool on, float* acc, float x, float y) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %3, 0;\n@p red.global.add.v2.f32 [%0], {%1, %2};\n}\n" ::
          "l"(acc),
      "f"(x), "f"(y), "r"(static_cast<int>(on)));
#else
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %3, 0;\n@p red.global.add.f32 [%0], %1;\n@p "
      "red.global.add.f32 [%0+4], %2;\n}\n" ::"l"(acc),
      "f"(x), "f"(y), "r"(static_cast<int>(on)));
#endif
}

// The stream-K tail (detail::tail_split) and its workspace: per tail block an f32 slot of partial
// dK and dV ([kKeys][D] each) and a count of the iterations added into it, zeroed by the launch.
struct BwdTail {
  detail::TailSplit split;
  float* part = nullptr;
  unsigned* done = nullptr;
};

// One key block's work for flash_bwd_fused_mma: iterations [it_lo, it_hi) (clamped to the
// block's) of key block `lin`, every iteration of it except in the stream-K tail (BwdTail).
template <class T, int D, int BQ, bool kBulkDq>
__device__ __forceinline__ void fused_bwd_block(const Params& p, float* dq_acc, const BwdTail& tail,
                                                int lin, int it_lo, int it_hi) {
  using Cfg = BwdFusedCfg<T, D, BQ, kBulkDq>;
  constexpr int kKeys = Cfg::kKeys, kNT = 32 * Cfg::kWarps;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* sK = reinterpret_cast<T*>(smem_raw);
  T* sV = sK + kKeys * D;
  T* sQ0 = sV + kKeys * D;                                   // two stages
  T* sG0 = sQ0 + 2 * BQ * D;                                 // dY tiles, two stages
  T* sDs = sG0 + 2 * BQ * D;                                 // dS^T, [key][query], swz<BQ>
  T* sP = sDs + kKeys * BQ;                                  // P^T, the same
  float* sLse0 = reinterpret_cast<float*>(sP + kKeys * BQ);  // LSE * log2(e); +inf when empty
  float* sDelta0 = sLse0 + 2 * Cfg::kRowPitch;
  int* sLo0 = reinterpret_cast<int*>(sDelta0 + 2 * Cfg::kRowPitch);
  int* sHi0 = sLo0 + 2 * Cfg::kRowPitch;
  float* sDq = reinterpret_cast<float*>(sHi0 + 2 * Cfg::kRowPitch);  // kBulkDq: [BQ][kDqPitch]
  if ((smem_u32(smem_raw) & 127u) != 0) __trap();  // swz_addr: 128-byte aligned tiles
  // Whether this run completes its key block (BwdTail): a word of the row arrays, which no warp
  // reads between a run's last iteration and the next run's (static shared memory would move the
  // dynamic tiles off their 128-byte alignment).
  int& tail_last = *sLo0;
  // Block -> (key block, K/V head, batch) in grid_place's order (heaviest causal blocks first).
  const int k_blocks = (p.len_k + kKeys - 1) / kKeys;
  const GridPlace at = grid_place(lin, k_blocks, p.heads_kv, p.band);
  const int kb = at.blk, hk = at.head, b = at.rest;
  const SeqRows s = seq_rows(p, b);
  const int k0 = kb * kKeys;
  if (k0 >= s.lk) return;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, tq = lane % 4, mi = lane / 8;
  const float log2e = 1.4426950408889634f, scale_log2 = p.scale * log2e;
  load_kv_block<T, kKeys, D, kNT>(p, b, hk, s, k0, sK, sV, true);
  cp_async_commit();

  constexpr int kOTiles = D / 8, kKSteps = D / 16;
  float dk[kOTiles][4], dv[kOTiles][4];
#pragma unroll
  for (int d = 0; d < kOTiles; ++d)
#pragma unroll
    for (int e = 0; e < 4; ++e) dk[d][e] = dv[d][e] = 0.f;

  int qt_begin, qt_end;
  query_tiles_seeing<BQ>(p, s, k0, kKeys, &qt_begin, &qt_end);
  const int n_qt = max(qt_end - qt_begin, 0), n_it = p.group * n_qt;
  const int it_end = min(it_hi, n_it), n_run = max(it_end - it_lo, 0);
  // The key blocks of one head run side by side and add into the same dQ rows: each starts its
  // walk over the (query head, query tile) iterations at its own offset so their atomics spread.
  // Iteration it visits (it + rot) % n_it = (query head w_h of the group, query tile w_q), walked
  // by increments (no divisions in the loop: the per-iteration modulos were ~80 uniform-datapath
  // instructions and a divide's latency on the issue path, ncu d64 L4096, c332416).
  const int rot = n_it > 0 ? static_cast<int>(int64_t{kb} * n_it / k_blocks) : 0;
  const int walk0 = n_it > 0 ? (rot + it_lo) % n_it : 0;  // where this run's walk starts
  int w_h = n_qt > 0 ? walk0 / n_qt : 0, w_q = n_qt > 0 ? walk0 % n_qt : 0;
  struct Visit {
    int h, i0;  // query head, first query row
  };
  Visit pending{0, 0};  // the iteration issued last
  auto take = [&] {
    const Visit v{hk * p.group + w_h, (qt_begin + w_q) * BQ};
    if (++w_q == n_qt) {
      w_q = 0;
      if (++w_h == p.group) w_h = 0;
    }
    return v;
  };
  // Iteration `it`'s tiles go to stage it % 2 by cp.async, issued one iteration ahead of use. Its
  // rows' LSE and delta (threads < BQ, one row each) are loaded into registers at the same time
  // but written to shared memory only at the end of the iteration before: the loads' latency
  // hides behind a whole iteration instead of stalling those warps behind the barrier.
  float row_lse = -INFINITY, row_delta = 0.f;
  int row_lo = 0, row_hi = 0;  // past Lq: no key visible
  // Whether every row of the tile from row i0 sees all kKeys keys, the same in every thread: one
  // interval of first rows per key block (detail::full_tile_rows), clamped to 32 bits. A per-row
  // vote at the barrier cost ~3% of the stall samples (ncu d64 L4096), the first and last rows'
  // 64-bit bounds per tile ~50 uniform instructions right after it (ncu d128 L8192).
  int full_lo, full_hi;
  {
    int64_t lo, hi;
    detail::full_tile_rows(p.band, s.lq, s.lk, k0, kKeys, BQ, &lo, &hi);
    full_lo = static_cast<int>(min(lo, int64_t{INT_MAX}));
    full_hi = static_cast<int>(max(hi, int64_t{-1}));
  }
  auto tile_full = [&](int i0) { return i0 >= full_lo && i0 <= full_hi; };
  auto issue = [&](int it) {
    if (it < n_run) {
      pending = take();
      const int h = pending.h, i0 = pending.i0, st = it & 1;
      load_q_dy_tiles<T, BQ, D, kNT>(p, b, h, s, i0, sQ0 + st * BQ * D, sG0 + st * BQ * D);
      if (threadIdx.x < BQ) {
        const int i = i0 + threadIdx.x;
        row_lse = -INFINITY, row_delta = 0.f, row_lo = row_hi = 0;
        if (i < s.lq) {
          row_lse =
              static_cast<const float*>(p.lse)[detail::lse_offset(p.sl, p.varlen, b, h, s.q0 + i)];
          row_delta =
              static_cast<const float*>(p.delta)[(int64_t{b} * p.heads_q + h) * p.len_q + i];
          int64_t lo64, hi64;
          detail::visible_keys(p.band, i, s.lq, s.lk, &lo64, &hi64);
          row_lo = static_cast<int>(lo64), row_hi = static_cast<int>(hi64);
        }
      }
    }
    cp_async_commit();
  };
  auto publish_rows = [&](int it) {
    if (it < n_run && threadIdx.x < BQ) {
      const int slot = (it & 1) * Cfg::kRowPitch + Cfg::row_slot(threadIdx.x);
      sLse0[slot] = row_lse == -INFINITY ? INFINITY : row_lse * log2e;  // +inf: every P is 0
      sDelta0[slot] = row_delta;
      sLo0[slot] = row_lo;
      sHi0[slot] = row_hi;
    }
  };
  // kBulkDq: the staged tile's (query head, first row), -1 when none is staged; its rows go into
  // the accumulator after a barrier has made every warp's stores visible, BQ / 8 rows a warp, one
  // a lane (a lane's bulk operations issue one after another, so they are spread over the warps).
  int dq_h = -1, dq_i0 = 0;
  auto reduce_dq = [&] {
    constexpr int kRowsPerWarp = BQ / Cfg::kWarps;
    const int r = warp * kRowsPerWarp + lane;
    if (dq_h < 0 || lane >= kRowsPerWarp || r >= s.lq - dq_i0) return;
    float* row = dq_acc + ((int64_t{b} * p.heads_q + dq_h) * p.len_q + dq_i0 + r) * D;
    cuda::bulk_reduce_add_f32(row, smem_u32(sDq + r * Cfg::kDqPitch), D * sizeof(float));
  };
  issue(0);
  publish_rows(0);
  for (int it = 0; it < n_run; ++it) {
    cp_async_wait<0>();  // this iteration's tiles (and K/V) have landed
    // For every thread; iteration it - 1 is consumed (its stage and dS^T are free).
    const bool uncapped = p.softcap <= 0.f;
    __syncthreads();
    const Visit cur = pending;  // issued one iteration ahead
    const bool plain = uncapped && tile_full(cur.i0);
    if constexpr (kBulkDq) reduce_dq();  // the previous tile's, staged before the barrier
    const int stage = it & 1, h = cur.h, i0 = cur.i0;
    const T* sQ = sQ0 + stage * BQ * D;
    const T* sG = sG0 + stage * BQ * D;
    const float* sLse = sLse0 + stage * Cfg::kRowPitch;  // row_slot order
    const float* sDelta = sDelta0 + stage * Cfg::kRowPitch;
    const int* sLo = sLo0 + stage * Cfg::kRowPitch;
    const int* sHi = sHi0 + stage * Cfg::kRowPitch;
    // P and dS / scale of one accumulator fragment (keys key_lo and key_lo + 8, the tile's
    // query columns qc and qc + 1), packed as T pairs {P(key_lo), P(key_lo + 8), dS(key_lo),
    // dS(key_lo + 8)}. kMode (block-uniform, one branch per tile): 1 (`plain`) straight-line code
    // for unmasked tiles without soft-cap, most of a long sequence; 2 masked tiles without
    // soft-cap (a causal diagonal), straight-line too with each key tested against its row's
    // bounds; 0 the general per-element form (soft-cap).
    // l, dl, lo, hi: the LSE, delta and visible keys of the fragment's two query columns (lo and
    // hi read by kMode 2 only; kMode 0 loads its bounds at `slot`, row_slot's place of the pair,
    // itself: holding them as well spilled at D = 128).
    auto grads = [&]<int kMode>(const float(&s4)[4], const float(&d4)[4], int key_lo, float2 l,
                                float2 dl, int2 lo, int2 hi, int slot, uint32_t(&out)[4]) {
      float pv[4], dsv[4];
      if constexpr (kMode == 2) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int key = key_lo + (e >> 1) * 8;
          const bool vis = key >= ((e & 1) ? lo.y : lo.x) && key < ((e & 1) ? hi.y : hi.x);
          pv[e] = vis ? exp2_ftz(fmaf(s4[e], scale_log2, -((e & 1) ? l.y : l.x))) : 0.f;
          dsv[e] = pv[e] * (d4[e] - ((e & 1) ? dl.y : dl.x));
        }
      } else if constexpr (kMode == 1) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          pv[e] = exp2_ftz(fmaf(s4[e], scale_log2, -((e & 1) ? l.y : l.x)));
          dsv[e] = pv[e] * (d4[e] - ((e & 1) ? dl.y : dl.x));
        }
      } else {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int key = key_lo + (e >> 1) * 8;
          float dc;
          const float x = capped_score(s4[e], p.scale, p.softcap, &dc);
          const bool vis = key >= sLo[slot + (e & 1)] && key < sHi[slot + (e & 1)];
          pv[e] = vis ? exp2_ftz(x * log2e - ((e & 1) ? l.y : l.x)) : 0.f;
          dsv[e] = pv[e] * (d4[e] - ((e & 1) ? dl.y : dl.x)) * dc;
        }
      }
      out[0] = pack2<T>(pv[0], pv[1]);
      out[1] = pack2<T>(pv[2], pv[3]);
      out[2] = pack2<T>(dsv[0], dsv[1]);
      out[3] = pack2<T>(dsv[2], dsv[3]);
    };
    {
      // FlashAttention-2's warp tiling. S^T and dP^T: warp w takes 32 keys (kb = 32 (w % 4)) x
      // BQ / 2 queries (qo = BQ / 2 (w / 4)); P^T and dS^T go to shared memory; then dV and dK:
      // warp w takes the same 32 keys x half the head dim (do = D / 2 (w / 4)) over all BQ
      // queries. Per warp and tile that reads 32 + 24 KB of shared memory at D = 128, where
      // 16-key warps keeping P^T and dS^T in registers for dV and dK read 40 + 32 (measured on
      // the H100: 1-9% slower, 70cf44d).
      constexpr int kQT = BQ / 16;  // n8 tiles of the warp's BQ / 2 queries
      const int kb = (warp % 4) * 32, qo = (warp / 4) * (BQ / 2);
      {
        float st[2][kQT][4], dpt[2][kQT][4];
#pragma unroll
        for (int mt = 0; mt < 2; ++mt)
#pragma unroll
          for (int n = 0; n < kQT; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) st[mt][n][e] = dpt[mt][n][e] = 0.f;
        const SwzBases k_a = swz_bases<T, D>(smem_u32(sK + kb * D), lane % 16, lane / 16);
        const SwzBases v_a = swz_bases<T, D>(smem_u32(sV + kb * D), lane % 16, lane / 16);
        const SwzBases q_b =
            swz_bases<T, D>(smem_u32(sQ + qo * D), (lane % 8) + (mi / 2) * 8, mi % 2);
        const SwzBases g_b =
            swz_bases<T, D>(smem_u32(sG + qo * D), (lane % 8) + (mi / 2) * 8, mi % 2);
#pragma unroll
        for (int ks = 0; ks < kKSteps; ++ks) {
          uint32_t ak[2][4], av[2][4];
          ldmatrix_m16x2<T, D>(k_a, 2 * ks, ak);
          ldmatrix_m16x2<T, D>(v_a, 2 * ks, av);
#pragma unroll
          for (int n = 0; n < kQT; n += 2) {
            mma_b_pair<T, false, 2>(
                swz_addr<T, D>(q_b, n * 8, 2 * ks), [&](int m) { return ak[m]; },
                [&](int m, int j) { return st[m][n + j]; });
            mma_b_pair<T, false, 2>(
                swz_addr<T, D>(g_b, n * 8, 2 * ks), [&](int m) { return av[m]; },
                [&](int m, int j) { return dpt[m][n + j]; });
          }
          // The next iteration's loads (~450 instructions of address arithmetic at d128) go out
          // here, behind mmas already in the tensor pipe, instead of right after the barrier,
          // where every warp issued them before its first mma (ncu H100, d128 L8192).
          if (ks == 0) issue(it + 1);
        }
        // Where this lane's P^T / dS^T pairs go (swz<BQ>, bytes): every row it writes has row % 8
        // = g, and the warp's query chunks qo / 8 + n (n < kQT) do not carry out of their group
        // of 8 (BQ = 128: qo / 8 is 0 or 8; BQ = 64: 0 or 4 with n < 4), so chunk n lands at
        // chunk ((qo / 8) ^ g) ^ n of the group: one base per lane, the column step an XOR of n <<
        // 4 on bits the row and group offsets leave clear, the rows immediates. The per-store
        // swz<BQ> cost ~2 LOP3s a store (ncu d64 L4096: 151 LOP3s a warp and tile).
        static_assert(BQ == 64 || BQ == 128, "the XOR walk below assumes no chunk carry");
        const uint32_t p_lane =
            smem_u32(sP) + static_cast<uint32_t>(((kb + g) * BQ + (qo & ~63)) * sizeof(T)) +
            static_cast<uint32_t>((((qo / 8) & 7) ^ g) << 4) + 4u * static_cast<uint32_t>(tq);
        constexpr uint32_t kDsOff = kKeys * BQ * sizeof(T);  // sDs = sP - kKeys * BQ
        constexpr uint32_t kRowBytes = BQ * sizeof(T);
        // The lane's LSE / delta (row_slot order): n8 tiles n and n + 1 from one 128-bit load
        // each, shared by both m16 tiles (a float2 per tile and m16 tile before: 32 LDS.64 a warp
        // and tile at d64 against FA2's 6 loads, ncu H100, 9c34c78).
        const int lane_slot = (warp / 4) * Cfg::kHalfPitch + tq * Cfg::kTqPitch;
        auto all = [&]<int kMode>() {
#pragma unroll
          for (int n2 = 0; n2 < kQT; n2 += 2) {
            const int slot = lane_slot + 2 * n2;  // row_slot of the two tiles' four columns
            const float4 l4 = *reinterpret_cast<const float4*>(sLse + slot);
            const float4 d4 = *reinterpret_cast<const float4*>(sDelta + slot);
            int4 lo4{}, hi4{};
            if constexpr (kMode == 2) {
              lo4 = *reinterpret_cast<const int4*>(sLo + slot);
              hi4 = *reinterpret_cast<const int4*>(sHi + slot);
            }
#pragma unroll
            for (int n = n2; n < n2 + 2; ++n)
#pragma unroll
              for (int mt = 0; mt < 2; ++mt) {
                const bool first = n == n2;
                const float2 l = first ? make_float2(l4.x, l4.y) : make_float2(l4.z, l4.w);
                const float2 dl = first ? make_float2(d4.x, d4.y) : make_float2(d4.z, d4.w);
                const int2 lo = first ? make_int2(lo4.x, lo4.y) : make_int2(lo4.z, lo4.w);
                const int2 hi = first ? make_int2(hi4.x, hi4.y) : make_int2(hi4.z, hi4.w);
                uint32_t o[4];
                grads.template operator()<kMode>(st[mt][n], dpt[mt][n], k0 + kb + mt * 16 + g, l,
                                                 dl, lo, hi, slot + 2 * (n - n2), o);
                const uint32_t at =
                    (p_lane ^ (static_cast<uint32_t>(n) << 4)) + mt * 16 * kRowBytes;
                asm volatile(
                    "st.shared.b32 [%0], %2;\n"
                    "st.shared.b32 [%0+%6], %3;\n"
                    "st.shared.b32 [%1], %4;\n"
                    "st.shared.b32 [%1+%6], %5;\n" ::"r"(at),
                    "r"(at - kDsOff), "r"(o[0]), "r"(o[1]), "r"(o[2]), "r"(o[3]),
                    "n"(8 * kRowBytes));
              }
          }
        };
        if (plain)
          all.template operator()<1>();
        else if ((D == 64 || kBulkDq) && uncapped)  // red.global at D = 128: 8 bytes spilled
          all.template operator()<2>();
        else
          all.template operator()<0>();
      }
      // kBulkDq: the staging tile is rewritten below once its reductions have read it.
      if constexpr (kBulkDq) cuda::bulk_wait<0, true>();
      __syncthreads();  // every warp's P^T and dS^T are in shared memory
      // dQ (/ scale) of this tile = dS K: warp w takes query rows 32 (w % kRowGroups) .. + 32
      // (two m16 tiles) and head-dim columns [kDC (w / kRowGroups), + kDC), over all 128 keys; dS
      // through ldmatrix.trans of dS^T, K transposed as B. 32 x kDC per warp reads 8 + 8 KB of
      // shared memory per tile (at D = 128) where 16 x 2 kDC would read 4 + 16.
      constexpr int kDC = D / Cfg::kColSplit, kDT = kDC / 8, kPairs = 4 * kDT;
      const int rg = warp % Cfg::kRowGroups, c0 = (warp / Cfg::kRowGroups) * kDC;
      float dq[2][kDT][4];
      auto dq_gemm = [&] {
#pragma unroll
        for (int mt = 0; mt < 2; ++mt)
#pragma unroll
          for (int d = 0; d < kDT; ++d)
            dq[mt][d][0] = dq[mt][d][1] = dq[mt][d][2] = dq[mt][d][3] = 0.f;
        // The warp's row / column offsets (runtime) go into the bases, not into swz_addr's
        // compile-time chunk (a runtime one there indexes SwzBases dynamically: local memory):
        // whole groups of 8 chunks into the tile address, the rest into the lane's chunk, whose
        // bits are disjoint from the unrolled chunk offsets XORed onto it.
        const int cc = c0 / 8, rc = 4 * rg;
        const SwzBases ds_a = swz_bases<T, BQ>(smem_u32(sDs) + (rc & ~7) * 16,
                                               (lane % 8) + (mi / 2) * 8, mi % 2 + (rc & 7));
        const SwzBases k_t = swz_bases<T, D>(smem_u32(sK) + (cc & ~7) * 16,
                                             (lane % 8) + (mi % 2) * 8, mi / 2 + (cc & 7));
#pragma unroll
        for (int kk = 0; kk < kKeys / 16; ++kk) {
          uint32_t a[2][4];
#pragma unroll
          for (int mt = 0; mt < 2; ++mt)
            ldmatrix_x4_trans(swz_addr<T, BQ>(ds_a, kk * 16, 2 * mt), a[mt][0], a[mt][1], a[mt][2],
                              a[mt][3]);
#pragma unroll
          for (int d = 0; d < kDT; d += 2)
            mma_b_pair<T, true, 2>(
                swz_addr<T, D>(k_t, kk * 16, d), [&](int m) { return a[m]; },
                [&](int m, int j) { return dq[m][d + j]; });
        }
      };
      // red.global (no kBulkDq): dQ first, its pairs (4 rows x kDT column tiles, pair j = row j /
      // kDT, tile j % kDT) sent a few at a time between the dV / dK mmas below rather than in one
      // burst at the end of the tile, whose source registers were then rewritten at once (long
      // scoreboard 12.3% against FA2's 6.6%, ncu d64 L4096). One base (row i0 + 32 rg + g) and
      // compile-time offsets to the thread's 4 rows; a bit per pair says whether it is inside
      // the problem (row < Lq, column < the head dim): 2-3% faster at d64 than a row pointer per
      // row (H100, A/B in one call). kBulkDq keeps dQ after dV / dK: holding dQ's registers
      // across them measured 5% slower at d128 (H100).
      static_assert(kPairs <= 32, "dq_on has a bit per pair");
      float* dq_base = nullptr;
      uint32_t dq_on = 0;
      if constexpr (!kBulkDq) {
        dq_gemm();
        const int i = i0 + rg * 32 + g;
        dq_base = dq_acc + ((int64_t{b} * p.heads_q + h) * p.len_q + i) * D + c0 + 2 * tq;
#pragma unroll
        for (int j = 0; j < kPairs; ++j) {
          const int r = j / kDT, d = j % kDT;
          const bool on = i + (r / 2) * 16 + (r % 2) * 8 < s.lq && c0 + d * 8 + 2 * tq < p.dim_qk;
          dq_on |= static_cast<uint32_t>(on) << j;
        }
      }
      auto red_dq = [&](int j) {
        const int r = j / kDT, d = j % kDT, mt = r / 2, hf = r % 2;
        red_pair_if((dq_on >> j) & 1u, dq_base + (mt * 16 + hf * 8) * D + d * 8, dq[mt][d][hf * 2],
                    dq[mt][d][hf * 2 + 1]);
      };
      {
        // The warp's head-dim half goes into the B bases (see the dQ step above).
        const int dc = (warp / 4) * (D / 16);
        const SwzBases p_a = swz_bases<T, BQ>(smem_u32(sP + kb * BQ), lane % 16, lane / 16);
        const SwzBases s_a = swz_bases<T, BQ>(smem_u32(sDs + kb * BQ), lane % 16, lane / 16);
        const SwzBases g_t = swz_bases<T, D>(smem_u32(sG) + (dc & ~7) * 16,
                                             (lane % 8) + (mi % 2) * 8, mi / 2 + (dc & 7));
        const SwzBases q_t = swz_bases<T, D>(smem_u32(sQ) + (dc & ~7) * 16,
                                             (lane % 8) + (mi % 2) * 8, mi / 2 + (dc & 7));
        constexpr int kDT2 = D / 16;  // n8 tiles of the warp's head-dim half
        constexpr int kSteps = BQ / 16, kPerStep = (kPairs + kSteps - 1) / kSteps;
#pragma unroll
        for (int kk = 0; kk < kSteps; ++kk) {
          uint32_t ap[2][4], as[2][4];
          ldmatrix_m16x2<T, BQ>(p_a, 2 * kk, ap);
          ldmatrix_m16x2<T, BQ>(s_a, 2 * kk, as);
#pragma unroll
          for (int d = 0; d < kDT2; d += 2) {
            mma_b_pair<T, true, 2>(
                swz_addr<T, D>(g_t, kk * 16, d), [&](int m) { return ap[m]; },
                [&](int m, int j) { return dv[m * kDT2 + d + j]; });
            mma_b_pair<T, true, 2>(
                swz_addr<T, D>(q_t, kk * 16, d), [&](int m) { return as[m]; },
                [&](int m, int j) { return dk[m * kDT2 + d + j]; });
          }
          if constexpr (!kBulkDq) {
#pragma unroll
            for (int j = kk * kPerStep; j < (kk + 1) * kPerStep && j < kPairs; ++j) red_dq(j);
          }
        }
      }
      if constexpr (kBulkDq) {  // into the staging tile, every row and column
        dq_gemm();
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          const int mt = r / 2, hf = r % 2;
          float* row = sDq + (rg * 32 + mt * 16 + hf * 8 + g) * Cfg::kDqPitch + c0 + 2 * tq;
#pragma unroll
          for (int d = 0; d < kDT; ++d)
            *reinterpret_cast<float2*>(row + d * 8) =
                make_float2(dq[mt][d][hf * 2], dq[mt][d][hf * 2 + 1]);
        }
        cuda::fence_proxy_async();  // visible to the bulk reduction after the next barrier
        dq_h = h, dq_i0 = i0;
      }
    }
    publish_rows(it + 1);  // the next iteration's rows, for its barrier
  }
  cp_async_wait<0>();
  if constexpr (kBulkDq) {  // the last tile's dQ, landed before the kernel ends
    __syncthreads();
    reduce_dq();
    cuda::bulk_wait<0, false>();
  }
  // dK and dV: this thread's keys 32 (w % 4) + 16 mt + g (+ 8), columns D / 2 (w / 4) + 8 d + 2
  // tq in accumulator tile mt * (D / 16) + d.
  constexpr int kColTiles = kOTiles / 2;
  const int key_base = k0 + (warp % 4) * 32 + g, col_base = (warp / 4) * (D / 2) + 2 * tq;
  if (it_lo > 0 || it_end < n_it) {
    // A tail run over part of the block: its sums go into the block's f32 slot ([keys][D] dK,
    // then dV, zeroed by the launch); the run that brings the block's count of iterations to n_it
    // reads the totals back (from L2: L1 is not coherent) and stores them below.
    float* part_k = tail.part + int64_t{lin - tail.split.n_dp} * 2 * kKeys * D;
    float* part_v = part_k + kKeys * D;
    const int at_base = (key_base - k0) * D + col_base;
    // f(the pair's offset in a slot, its dK pair, its dV pair) for each of the thread's pairs.
    auto each_pair = [&](auto f) {
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const int mt = r / 2, hf = r % 2;
#pragma unroll
        for (int d = 0; d < kColTiles; ++d) {
          const int t = mt * kColTiles + d;
          f(at_base + (mt * 16 + hf * 8) * D + d * 8, dk[t] + hf * 2, dv[t] + hf * 2);
        }
      }
    };
    each_pair([&](int o, float* k2, float* v2) {
      red_pair_if(true, part_k + o, k2[0], k2[1]);
      red_pair_if(true, part_v + o, v2[0], v2[1]);
    });
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0)
      tail_last = atomicAdd(tail.done + (lin - tail.split.n_dp), static_cast<unsigned>(n_run)) +
                      static_cast<unsigned>(n_run) ==
                  static_cast<unsigned>(n_it);
    __syncthreads();
    if (!tail_last) return;
    __threadfence();
    each_pair([&](int o, float* k2, float* v2) {
      const float2 sk = __ldcg(reinterpret_cast<const float2*>(part_k + o));
      const float2 sv = __ldcg(reinterpret_cast<const float2*>(part_v + o));
      k2[0] = sk.x, k2[1] = sk.y, v2[0] = sv.x, v2[1] = sv.y;
    });
  }
#pragma unroll
  for (int r = 0; r < 4; ++r) {
    const int mt = r / 2, hf = r % 2, key = key_base + mt * 16 + hf * 8;
    if (key >= s.lk) continue;
    T* ok = static_cast<T*>(p.dk) + detail::row_offset(p.sdk, p.varlen, b, hk, s.k0 + key);
    T* ov = static_cast<T*>(p.dv) + detail::row_offset(p.sdv, p.varlen, b, hk, s.k0 + key);
#pragma unroll
    for (int d = 0; d < kColTiles; ++d) {
      const int c = col_base + d * 8, t = mt * kColTiles + d;
      if (c < p.dim_qk)
        *reinterpret_cast<uint32_t*>(ok + c) =
            pack2<T>(dk[t][hf * 2] * p.scale, dk[t][hf * 2 + 1] * p.scale);
      if (c < p.dim_v)
        *reinterpret_cast<uint32_t*>(ov + c) = pack2<T>(dv[t][hf * 2], dv[t][hf * 2 + 1]);
    }
  }
}

template <class T, int D, int BQ, bool kBulkDq = false>
__global__ void __launch_bounds__(256, 1)
    flash_bwd_fused_mma(Params p, float* dq_acc, BwdTail tail) {
  // One whole key block per CTA, except the stream-K tail's CTAs (blockIdx >= tail.split.n_dp),
  // each a contiguous run of iterations over one or more of the last blocks: one call site, so the
  // body is compiled once.
  for (int k = 0;; ++k) {
    int64_t lin, it_lo, it_hi;
    if (!detail::tail_segment(tail.split, blockIdx.x, k, &lin, &it_lo, &it_hi)) break;
    if (k > 0) __syncthreads();  // the last segment's reads of the tiles are done
    fused_bwd_block<T, D, BQ, kBulkDq>(p, dq_acc, tail, static_cast<int>(lin),
                                       static_cast<int>(it_lo),
                                       it_hi < 0 ? INT_MAX : static_cast<int>(it_hi));
  }
}

// dQ = scale * accumulator, rounded to T: D / 4 threads per query row (delta's row index), each
// one 16-byte load and an 8-byte store; D is the accumulator's pitch.
template <class T, int D>
__global__ void __launch_bounds__(128) flash_bwd_dq_convert(Params p, const float* dq_acc) {
  constexpr int kTpr = D / 4;
  const RowSlot<kTpr> r = row_slot<kTpr>(p);
  const int c = 4 * r.part;
  if (!r.valid || c >= p.dim_qk) return;  // dim_qk is a multiple of 8: c + 3 is in the row too
  const float4 v = *reinterpret_cast<const float4*>(dq_acc + int64_t{r.row} * D + c);
  T* dst = static_cast<T*>(p.dq) +
           detail::row_offset(p.sdq, p.varlen, r.b, r.h, seq_rows(p, r.b).q0 + r.i) + c;
  *reinterpret_cast<uint2*>(dst) =
      make_uint2(pack2<T>(v.x * p.scale, v.y * p.scale), pack2<T>(v.z * p.scale, v.w * p.scale));
}

// Merges the splits of each row in split order: lse = log sum exp(lse_s), y = sum w_s o_s.
template <class T>
__global__ void __launch_bounds__(128) flash_fwd_combine(Params p) {
  const int lane = threadIdx.x % 32;
  const int64_t row = int64_t{blockIdx.x} * 4 + threadIdx.x / 32;
  const int i = static_cast<int>(row % p.len_q);
  const int h = static_cast<int>((row / p.len_q) % p.heads_q);
  const int b = static_cast<int>(row / (int64_t{p.len_q} * p.heads_q));
  if (b >= p.batch) return;
  const SeqRows s = seq_rows(p, b);
  if (i >= s.lq) return;
  const int64_t rows = int64_t{p.batch} * p.heads_q * p.len_q;
  // Every split writes each of its rows (LSE -inf where it saw no key), so all take part.
  float mx = -INFINITY;
  for (int sp = 0; sp < p.splits; ++sp) mx = fmaxf(mx, p.lse_part[sp * rows + row]);
  float acc[kLaneElems] = {};
  float wsum = 0;
  if (mx > -INFINITY) {
    for (int sp = 0; sp < p.splits; ++sp) {
      const float w = expf(p.lse_part[sp * rows + row] - mx);
      if (w == 0.f) continue;
      wsum += w;
      const float* src = p.o_part + (sp * rows + row) * p.dim_v;
#pragma unroll
      for (int u = 0; u < kLaneElems; ++u) {
        const int c = lane + 32 * u;
        if (c < p.dim_v) acc[u] += w * src[c];
      }
    }
  }
  T* y = static_cast<T*>(p.out) + detail::row_offset(p.sy, p.varlen, b, h, s.q0 + i);
  const float inv = wsum > 0 ? 1.f / wsum : 0.f;
#pragma unroll
  for (int u = 0; u < kLaneElems; ++u) {
    const int c = lane + 32 * u;
    if (c < p.dim_v) st(y + c, acc[u] * inv);
  }
  if (lane == 0)
    static_cast<float*>(p.lse)[detail::lse_offset(p.sl, p.varlen, b, h, s.q0 + i)] =
        wsum > 0 ? mx + logf(wsum) : -INFINITY;
}

}  // namespace baracuda::attention::kernels
