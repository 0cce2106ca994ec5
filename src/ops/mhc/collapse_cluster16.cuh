// Dynamic H collapse in one pass over X on 16-CTA clusters, with the CTA's slice of fn held in
// registers, X streaming through a ring of tiles and the partial sums pushed between the CTAs.
// Included by launch.cuh.
//
// Why this shape (docs/perf/mhc.md has the measurements of the earlier one-pass kernels):
// - A token's pre weights need the dot products of all n C of its elements with fn, and its
//   collapse needs those elements again, so one pass must keep the token on chip until its
//   logits are known. 16 CTAs share a tile of 16 M tokens: CTA r holds channels [r C / 16, (r + 1)
//   C / 16) of every stream, so the collapse of its channels needs no other CTA's data, and only
//   the partial sums (24 logits and the sum of squares a token) cross the cluster.
// - fn's slice (24 x n C / 16 floats) is loaded once into registers (96 per thread at C = 4096):
//   no fn traffic per tile. The tiles arrive by bulk tensor copies into a ring of slots while the
//   CTA works on the ones before.
// - Rank r reduces tokens r + 16 m of every tile: each CTA pushes those rows of its partials into
//   rank r's shared memory by st.async, completing on r's mbarrier, and r pushes each token's pre
//   weights back to every CTA the same way (collapse_push16_kernel below).
//
// Products: D[token][logit] = X[token][k] fn[logit][k] with the tokens as M and the 24 logits as
// three n8 tiles: m16n8k8 TF32 MMAs, 3xTF32 for f32 X and 2xTF32 for f16 X (exact in TF32); bf16
// X on m16n8k16 bf16 MMAs with fn in two bf16 parts (c16_products_bf16).
// Every sum has a fixed shape (warp, CTA rank order), independent of the token count and of a
// token's slot: deterministic and bit-stable.
//
// Measured and removed (docs/perf/mhc.md), H100, 16384 x 4 x 4096, f32 / bf16: pulling the
// partials (a split cluster barrier per tile, then 16 remote loads per value) 0.820 / 0.637 ms
// against the push form's 0.705 / 0.567 (16-token tiles) in the same call; a warp-specialized
// pull form (8 product warps at setmaxnreg 224, 4 finisher warps at 56) 0.99 / 1.04 ms.
#pragma once

#include <type_traits>

#include "core/cuda/mma.cuh"
#include "core/cuda/tensor_map.cuh"
#include "ops/mhc/kernels.cuh"

namespace baracuda::mhc_cuda {
namespace {

constexpr int kC16Ctas = 16, kC16Threads = 256, kC16Warps = kC16Threads / 32;
constexpr int kC16N = 4, kC16K = (2 + kC16N) * kC16N;  // streams, logits
constexpr int kC16Row = 28;  // floats per token of partials: 24 logits, the sum of squares, padding
constexpr int kC16MaxSlots = 8;
static_assert(kC16Warps == 2 * kC16N, "two warps per stream");

// A lane's two consecutive elements of a token row, as f32.
template <class T>
__device__ __forceinline__ void c16_pair(const unsigned char* p, float& lo, float& hi) {
  if constexpr (sizeof(T) == 4) {
    const float2 v = *reinterpret_cast<const float2*>(p);
    lo = v.x, hi = v.y;
  } else {
    const float2 f = cuda::unpack2<T>(*reinterpret_cast<const uint32_t*>(p));
    lo = f.x, hi = f.y;
  }
}
// split_tf32 behind an opaque copy of v: fn's splits are loop-invariant, and hoisting all of them
// out of the tile loop would need 96 more registers than the kernel has.
__device__ __forceinline__ void c16_split_fn(float v, uint32_t& big, uint32_t& small) {
  asm volatile("" : "+f"(v));
  split_tf32(v, big, small);
}

// Geometry of a slot for KS k-steps a warp (channels C = 256 KS) and TOK tokens: a CTA's slice
// holds CS channels of each stream. A slot is the boxes of the bulk tensor copies that fill it, one
// per 128 bytes of the slice's channels: [box][stream][token][128 bytes], each 128-byte row stored
// with the copy engine's 128-byte swizzle (16-byte chunk j of row r at chunk j ^ (r % 8)), so the
// 8 token rows a fragment load touches fall in distinct banks without padding.
template <class T, int KS, int TOK>
struct C16Geom {
  static constexpr int E = static_cast<int>(sizeof(T));
  static constexpr int CS = 16 * KS, kTok = TOK;
  static constexpr int kRowBytes = CS * E;        // a stream's slice row of one token
  static constexpr int kBoxCh = 128 / E;          // channels of a box row
  static constexpr int kBoxes = kRowBytes / 128;  // bulk tensor copies a tile
  static constexpr int kBoxBytes = kC16N * TOK * 128;
  static constexpr int kSlotBytes = kBoxes * kBoxBytes;
  static_assert(kRowBytes % 128 == 0 && kBoxes <= kC16Warps, "one copy a warp");
  // Byte offset of byte b of (stream i, token t)'s slice row.
  __device__ static int at(int i, int t, int b) {
    return (b >> 7) * kBoxBytes + ((i * TOK + t) << 7) + ((b & 127) ^ ((t & 7) << 4));
  }
};

// The products' sums of M m-tiles (logits; squares of tokens g and g + 8) set to zero.
template <int M>
__device__ __forceinline__ void c16_clear(float (&d)[M][3][4], float (&ss)[M][2]) {
#pragma unroll
  for (int m = 0; m < M; ++m) {
    ss[m][0] = ss[m][1] = 0;
#pragma unroll
    for (int nt = 0; nt < 3; ++nt) d[m][nt][0] = d[m][nt][1] = d[m][nt][2] = d[m][nt][3] = 0;
  }
}

// Warp w's products over its KS k-steps (stream w / 2, half w % 2 of the slice) for M m-tiles of 16
// tokens of a slot, written to wp[token][R]: the 24 logits' partial dot products and the partial
// sum of squares. MMA k index t is channel 2 t and k index t + 4 channel 2 t + 1 of a step (one 8-
// byte (f32) or 4-byte (16-bit) shared load per token row and lane, conflict-free by the swizzle).
// Each pair of k-steps accumulates on the tensor cores from zero and is added on the CUDA cores
// (short tensor-core chains, as in mma_block16); the M m-tiles share each split of fn. mid() runs a
// quarter of the way through (work that waits on other CTAs, placed where it delays this warp
// least).
template <class T, int KS, int M, class Mid>
__device__ __forceinline__ void c16_products(const unsigned char* slot, const float (&fr)[KS][3][2],
                                             float (&d)[M][3][4], float (&ss)[M][2], Mid&& mid) {
  using G = C16Geom<T, KS, 16 * M>;
  constexpr int E = G::E;
  constexpr bool kSplitX = E == 4;
  const int lane = static_cast<int>(threadIdx.x) & 31, warp = static_cast<int>(threadIdx.x) >> 5;
  const int g = lane >> 2, tq = lane & 3;
  // Row g of stream w / 2 in the first box; step st's bytes [h0 + 8 E st, + 8 E) of the slice row
  // hold the lane's pair at 2 E tq. Token rows g, g + 8, g + 16, ... share r % 8 = g, so the
  // swizzle of every load is the lane's constant `lx` XORed into the step's offset (their bits are
  // disjoint: 2 E tq < 8 E).
  const unsigned char* xw = slot + ((warp >> 1) * G::kTok + g) * 128;
  const int h0 = (warp & 1) * (G::kRowBytes / 2), lx = (2 * E * tq) ^ (g << 4);
  auto step_at = [&](int st) {
    const int b = h0 + 8 * E * st;
    return (b >> 7) * G::kBoxBytes + ((b & 127) ^ lx);
  };
  c16_clear(d, ss);
#pragma unroll
  for (int b = 0; b < KS / 2; ++b) {
    if (b == KS / 8) mid();
    float blk[M][3][4] = {};
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      const int st = 2 * b + u;
      // a = {A[g][t], A[g + 8][t], A[g][t + 4], A[g + 8][t + 4]} of each m-tile.
      uint32_t ab[M][4], as[M][4];
#pragma unroll
      for (int m = 0; m < M; ++m) {
        float lo0, lo1, hi0, hi1;
        c16_pair<T>(xw + m * 16 * 128 + step_at(st), lo0, lo1);
        c16_pair<T>(xw + (m * 16 + 8) * 128 + step_at(st), hi0, hi1);
        ss[m][0] = fmaf(lo0, lo0, ss[m][0]), ss[m][0] = fmaf(lo1, lo1, ss[m][0]);
        ss[m][1] = fmaf(hi0, hi0, ss[m][1]), ss[m][1] = fmaf(hi1, hi1, ss[m][1]);
        ab[m][0] = __float_as_uint(lo0), ab[m][1] = __float_as_uint(hi0);
        ab[m][2] = __float_as_uint(lo1), ab[m][3] = __float_as_uint(hi1);
        as[m][0] = as[m][1] = as[m][2] = as[m][3] = 0;
        if constexpr (kSplitX) {
          split_tf32(lo0, ab[m][0], as[m][0]);
          split_tf32(hi0, ab[m][1], as[m][1]);
          split_tf32(lo1, ab[m][2], as[m][2]);
          split_tf32(hi1, ab[m][3], as[m][3]);
        }
      }
#pragma unroll
      for (int nt = 0; nt < 3; ++nt) {
        uint32_t bb[2], bs[2];
        c16_split_fn(fr[st][nt][0], bb[0], bs[0]);
        c16_split_fn(fr[st][nt][1], bb[1], bs[1]);
#pragma unroll
        for (int m = 0; m < M; ++m) {
          if constexpr (kSplitX) mma_tf32_k8(blk[m][nt], as[m], bb);
          mma_tf32_k8(blk[m][nt], ab[m], bs);
          mma_tf32_k8(blk[m][nt], ab[m], bb);
        }
      }
    }
    add_blocks(d, blk);
  }
}
// bf16 X: bf16 MMAs (m16n8k16) on X as it is, with fn held in registers as two bf16 parts (fn =
// hi + lo to 16 bits of mantissa, ~1e-5 relative: inside the kernel's tf32 claim), so nothing is
// split per tile and one MMA covers 16 channels where the 2xTF32 form needs two per 8. MMA k
// indices 2 tq, 2 tq + 1 are channels 4 tq, 4 tq + 1 and k 2 tq + 8, 2 tq + 9 channels 4 tq + 2,
// 4 tq + 3 of a 16-channel step: one 8-byte shared load per token row and lane.
template <int KS>
using C16FnBf16 = uint32_t[KS / 2][3][2][2];  // [step][n tile][lo, hi][b0, b1]
template <int KS>
__device__ __forceinline__ void c16_load_fn_bf16(const DynArgs& a, int64_t c0, C16FnBf16<KS>& fb) {
  const int lane = static_cast<int>(threadIdx.x) & 31, warp = static_cast<int>(threadIdx.x) >> 5;
  const int g = lane >> 2, tq = lane & 3;
  const float* f =
      a.fn + static_cast<int64_t>(warp >> 1) * a.channels + c0 + (warp & 1) * (8 * KS) + 4 * tq;
#pragma unroll
  for (int nt = 0; nt < 3; ++nt)
#pragma unroll
    for (int s = 0; s < KS / 2; ++s) {
      const float* r = f + (nt * 8 + g) * a.fn_stride + 16 * s;
      const float2 v01 = __ldg(reinterpret_cast<const float2*>(r));
      const float2 v23 = __ldg(reinterpret_cast<const float2*>(r + 2));
      const float v[4] = {v01.x, v01.y, v23.x, v23.y};
      float hi[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) hi[e] = __bfloat162float(__float2bfloat16_rn(v[e]));
      fb[s][nt][1][0] = cuda::pack2<__nv_bfloat16>(hi[0], hi[1]);
      fb[s][nt][1][1] = cuda::pack2<__nv_bfloat16>(hi[2], hi[3]);
      fb[s][nt][0][0] = cuda::pack2<__nv_bfloat16>(v[0] - hi[0], v[1] - hi[1]);
      fb[s][nt][0][1] = cuda::pack2<__nv_bfloat16>(v[2] - hi[2], v[3] - hi[3]);
    }
}
template <int KS, int M, class Mid>
__device__ __forceinline__ void c16_products_bf16(const unsigned char* slot,
                                                  const C16FnBf16<KS>& fb, float (&d)[M][3][4],
                                                  float (&ss)[M][2], Mid&& mid) {
  using G = C16Geom<__nv_bfloat16, KS, 16 * M>;
  const int lane = static_cast<int>(threadIdx.x) & 31, warp = static_cast<int>(threadIdx.x) >> 5;
  const int g = lane >> 2, tq = lane & 3;
  const unsigned char* xw = slot + ((warp >> 1) * G::kTok + g) * 128;
  const int h0 = (warp & 1) * (G::kRowBytes / 2), lx = (8 * tq) ^ (g << 4);
  auto step_at = [&](int st) {  // 16 channels = 32 bytes a step
    const int b = h0 + 32 * st;
    return (b >> 7) * G::kBoxBytes + ((b & 127) ^ lx);
  };
  c16_clear(d, ss);
  auto sq = [](uint32_t w, float acc) {
    const float2 f = cuda::unpack2<__nv_bfloat16>(w);
    return fmaf(f.y, f.y, fmaf(f.x, f.x, acc));
  };
#pragma unroll
  for (int b = 0; b < KS / 4; ++b) {
    if (b == KS / 16) mid();
    float blk[M][3][4] = {};
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      const int st = 2 * b + u;
      uint32_t av[M][4];
#pragma unroll
      for (int m = 0; m < M; ++m) {
        const uint2 r0 = *reinterpret_cast<const uint2*>(xw + m * 16 * 128 + step_at(st));
        const uint2 r1 = *reinterpret_cast<const uint2*>(xw + (m * 16 + 8) * 128 + step_at(st));
        av[m][0] = r0.x, av[m][1] = r1.x, av[m][2] = r0.y, av[m][3] = r1.y;
        ss[m][0] = sq(r0.y, sq(r0.x, ss[m][0]));
        ss[m][1] = sq(r1.y, sq(r1.x, ss[m][1]));
      }
#pragma unroll
      for (int nt = 0; nt < 3; ++nt)
#pragma unroll
        for (int m = 0; m < M; ++m) {
          cuda::mma16816<__nv_bfloat16>(blk[m][nt], av[m], fb[st][nt][0][0], fb[st][nt][0][1]);
          cuda::mma16816<__nv_bfloat16>(blk[m][nt], av[m], fb[st][nt][1][0], fb[st][nt][1][1]);
        }
    }
    add_blocks(d, blk);
  }
}

// The products' partials of a warp to wp[token][R] (kAdd: added to what is there).
template <int M, bool kAdd = false>
__device__ __forceinline__ void c16_store_partials(float* wp, float (&d)[M][3][4],
                                                   float (&ss)[M][2]) {
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int g = lane >> 2, tq = lane & 3;
  constexpr int R = kC16Row;
  auto put = [](float& dst, float v) { dst = kAdd ? dst + v : v; };
#pragma unroll
  for (int m = 0; m < M; ++m) {
    // The 4 lanes of a token row hold interleaved quarters of its elements.
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      ss[m][h] += __shfl_xor_sync(0xffffffffu, ss[m][h], 1);
      ss[m][h] += __shfl_xor_sync(0xffffffffu, ss[m][h], 2);
    }
    float* w0 = wp + (m * 16 + g) * R;
    float* w1 = w0 + 8 * R;
#pragma unroll
    for (int nt = 0; nt < 3; ++nt) {
      put(w0[nt * 8 + 2 * tq], d[m][nt][0]), put(w0[nt * 8 + 2 * tq + 1], d[m][nt][1]);
      put(w1[nt * 8 + 2 * tq], d[m][nt][2]), put(w1[nt * 8 + 2 * tq + 1], d[m][nt][3]);
    }
    if (tq == 0) put(w0[kC16K], ss[m][0]), put(w1[kC16K], ss[m][1]);
  }
}

// fr[s][nt][j] = fn[nt * 8 + g][stream * C + c0 + half * CS / 2 + 8 s + 2 tq + j] for warp w's
// stream w / 2 and half w % 2 of the slice starting at channel c0.
template <int KS>
__device__ __forceinline__ void c16_load_fn(const DynArgs& a, int64_t c0, float (&fr)[KS][3][2]) {
  const int lane = static_cast<int>(threadIdx.x) & 31, warp = static_cast<int>(threadIdx.x) >> 5;
  const int g = lane >> 2, tq = lane & 3;
  const float* f =
      a.fn + static_cast<int64_t>(warp >> 1) * a.channels + c0 + (warp & 1) * (8 * KS) + 2 * tq;
#pragma unroll
  for (int nt = 0; nt < 3; ++nt)
#pragma unroll
    for (int s = 0; s < KS; ++s) {
      const float2 v =
          __ldg(reinterpret_cast<const float2*>(f + (nt * 8 + g) * a.fn_stride + 8 * s));
      fr[s][nt][0] = v.x, fr[s][nt][1] = v.y;
    }
}

// 16 bytes of T from VEC floats, in registers.
template <class T, int VEC = 16 / static_cast<int>(sizeof(T))>
__device__ __forceinline__ uint4 c16_pack16(const float (&v)[VEC]) {
  uint32_t w[4];
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    if constexpr (sizeof(T) == 4) {
      w[e] = __float_as_uint(v[e]);
    } else {
      const T lo = from_float<T>(v[2 * e]), hi = from_float<T>(v[2 * e + 1]);
      w[e] = static_cast<uint32_t>(__builtin_bit_cast(uint16_t, lo)) |
             (static_cast<uint32_t>(__builtin_bit_cast(uint16_t, hi)) << 16);
    }
  }
  return make_uint4(w[0], w[1], w[2], w[3]);
}

// y for the slice's channels of TOK tokens of a slot starting at token t0, with pres[token][n]:
// threads 0 .. kThreads - 1 of the CTA, 16-byte chunks.
template <class T, int KS, int TOK, int kThreads>
__device__ __forceinline__ void c16_collapse_rows(T* __restrict__ y, const unsigned char* slot,
                                                  const float* pres, const DynArgs& a, int64_t t0,
                                                  int64_t c0) {
  using G = C16Geom<T, KS, TOK>;
  constexpr int VEC = 16 / static_cast<int>(sizeof(T));
  constexpr int kChunks = G::CS / VEC;  // 16-byte chunks per stream row of the slice
  constexpr int kIters = (TOK * kChunks + kThreads - 1) / kThreads;
  // The loads of kBatch chunks first: the shared-memory latency is paid once a batch, not once a
  // chunk (two chunks a batch: four would hold 64 more registers beside fn's 96).
  constexpr int kBatch = kIters < 2 ? kIters : 2;
#pragma unroll
  for (int i0 = 0; i0 < kIters; i0 += kBatch) {
    uint4 raw[kBatch][kC16N];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int c = static_cast<int>(threadIdx.x) + (i0 + u) * kThreads;
      const int t = c / kChunks, q = c - t * kChunks;
      if (i0 + u < kIters && c < TOK * kChunks)
#pragma unroll
        for (int i = 0; i < kC16N; ++i)
          raw[u][i] = *reinterpret_cast<const uint4*>(slot + G::at(i, t, q * 16));
    }
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int c = static_cast<int>(threadIdx.x) + (i0 + u) * kThreads;
      const int t = c / kChunks, q = c - t * kChunks;
      const int64_t tok = t0 + t;
      if (i0 + u >= kIters || c >= TOK * kChunks || tok >= a.tokens) continue;
      float acc[VEC] = {};
#pragma unroll
      for (int i = 0; i < kC16N; ++i) {
        float v[VEC];
        load_vec<T, VEC>(reinterpret_cast<const T*>(&raw[u][i]), v);
        const float w = pres[t * kC16N + i];
#pragma unroll
        for (int e = 0; e < VEC; ++e) acc[e] = fmaf(w, v[e], acc[e]);
      }
      // One 16-byte store: the register allocator split store_vec's into four 4-byte ones here.
      const uint4 w = c16_pack16<T>(acc);
      asm volatile(
          "st.global.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"l"(y + tok * a.y_st + c0 + q * VEC),
          "r"(w.x), "r"(w.y), "r"(w.z), "r"(w.w)
          : "memory");
    }
  }
}

// ---- the kernel ----------------------------------------------------------------------------
//
// Rank r reduces the logits of tokens r + 16 m (m < M) of every tile. No cluster barrier per tile:
// a CTA waits only on its own mbarriers, for data that is already on its way. Rank r's last warp
// reduces tile j - 1 during its products of tile j (or tile j right after its push, see
// kReduceBesideY), so the pre weights it sends arrive while every CTA runs its products; y of the
// tile follows them.
//
// Two exchange buffers suffice: a CTA pushes tile j's partials only after it has received tile
// j - 2's pre weights from every rank, which each rank sends after reading tile j - 2's partials;
// a rank pushes tile j's pre weights only after every CTA's partials of tile j came in, which each
// CTA sends after its y of tile j - 2 read those weights. An mbarrier's next phase is armed by the
// CTA that consumed the previous one; a push may land first (the transaction count goes negative,
// the phase cannot complete before the arrival).
// The waits on these mbarriers are the CTA-scope ones used for bulk copies, as CUTLASS's cluster
// pipelines wait on mbarriers other CTAs signal: the data lands in the waiter's own shared memory.
// A cluster-scope acquire also invalidates L1 (CCTL.IVALL), which turned every spill reload after
// it into an L2 round trip (H100 profile, ede4cff).
//
// M = 2 (32-token tiles, 16-bit X only: three slots of 32 tokens fill the shared memory) halves the
// per-token cost of the exchange and the waits (and of fn's splits for f16). The partials of warps
// 4-7 are then added into those of warps 0-3 (one extra block barrier) so that the per-warp buffer
// fits.
template <int M>
struct C16Push {
  static constexpr int TOK = 16 * M;
  static constexpr int kPartWarps = M == 1 ? kC16Warps : kC16Warps / 2;
  static constexpr int kFloats = kPartWarps * TOK * kC16Row    // per-warp partials
                                 + 2 * M * kC16Ctas * kC16Row  // received partials [2][M][rank]
                                 + 2 * TOK * kC16N;            // received pre weights [2][token]
  static constexpr int kFixedBytes = 4 * kFloats + 8 * (kC16MaxSlots + 4) + 1024;
  static constexpr uint32_t kPartBytes = kC16Ctas * M * kC16Row * 4;  // a rank's partials phase
  static constexpr uint32_t kPreBytes = TOK * kC16N * 4;              // a CTA's pre-weight phase
};
// A slot: TOK tokens of n rows of the slice (C / 16 channels), no padding (the swizzle spreads the
// banks).
template <class T, int M>
constexpr int64_t c16_push_slot_bytes(int64_t channels) {
  return int64_t{C16Push<M>::TOK} * kC16N * (channels / kC16Ctas) * static_cast<int>(sizeof(T));
}
template <class T, int M>
constexpr int64_t c16_push_smem_bytes(int64_t channels, int slots) {
  return slots * c16_push_slot_bytes<T, M>(channels) + C16Push<M>::kFixedBytes;
}

template <class T, int KS, int M>
__global__ void __launch_bounds__(kC16Threads, 1)
    collapse_push16_kernel(T* __restrict__ y, const __grid_constant__ CUtensorMap xmap, DynArgs a) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  using P = C16Push<M>;
  constexpr int TOK = P::TOK, R = kC16Row, kQ = R / 4;  // float4 chunks per partial row
  using G = C16Geom<T, KS, TOK>;
  constexpr int kSlotBytes = G::kSlotBytes;
  // The swizzle works on 1024-byte atoms: the slots start on one (kFixedBytes holds the slack).
  extern __shared__ __align__(1024) unsigned char c16_dyn[];
  unsigned char* const c16_smem = c16_dyn + ((1024 - (cuda::smem_u32(c16_dyn) & 1023)) & 1023);
  const int S = a.slots;
  float* wpart = reinterpret_cast<float*>(c16_smem + S * kSlotBytes);  // [part warp][token][R]
  float* rbuf = wpart + P::kPartWarps * TOK * R;                       // [2][M][rank][R]
  float* pbuf = rbuf + 2 * M * kC16Ctas * R;                           // [2][token][n]
  const uint32_t ring = cuda::smem_u32(c16_smem);
  const uint32_t bars = cuda::smem_u32(pbuf + 2 * TOK * kC16N);  // S slots, 2 partials, 2 pre
  const uint32_t rbar0 = bars + 8 * S, pbar0 = rbar0 + 16;

  const int tid = static_cast<int>(threadIdx.x), lane = tid & 31, warp = tid >> 5;
  const int rank = static_cast<int>(cuda::cluster_rank());
  const int64_t cluster = blockIdx.x / kC16Ctas, ncl = gridDim.x / kC16Ctas;
  const int64_t ntl = (a.tiles - cluster + ncl - 1) / ncl;  // this cluster's tiles (>= 1)
  const int64_t c0 = static_cast<int64_t>(rank) * G::CS;

  if (tid == 0) {
    for (int s = 0; s < S; ++s) cuda::mbar_init(bars + 8 * s, 1);
    for (int b = 0; b < 2; ++b)
      cuda::mbar_init(rbar0 + 8 * b, 1), cuda::mbar_init(pbar0 + 8 * b, 1);
    cuda::mbar_init_fence();
    for (int b = 0; b < 2; ++b)  // tiles 0 and 1
      cuda::mbar_expect_tx(rbar0 + 8 * b, P::kPartBytes),
          cuda::mbar_expect_tx(pbar0 + 8 * b, P::kPreBytes);
  }
  constexpr bool kBf16Mma = std::is_same_v<T, __nv_bfloat16>;
  std::conditional_t<kBf16Mma, C16FnBf16<KS>, float[KS][3][2]> fr;
  if constexpr (kBf16Mma)
    c16_load_fn_bf16<KS>(a, c0, fr);
  else
    c16_load_fn<KS>(a, c0, fr);
  // Every CTA's mbarriers are initialized (and armed) before any push reaches them.
  cuda::cluster_arrive();
  cuda::cluster_wait();

  // The cluster's tile j into slot j % S: one bulk tensor copy per box (128 bytes of each stream's
  // slice rows for TOK tokens), one thread a warp. Tokens past the end read as zeros (discarded).
  auto refill = [&](int64_t j, int s) {  // s = j % S, kept by the caller (no division)
    const uint32_t bar = bars + 8 * s;
    if (tid == 0) cuda::mbar_expect_tx(bar, kSlotBytes);
    if (lane == 0 && warp < G::kBoxes)
      cuda::tma_load_3d(ring + s * kSlotBytes + warp * G::kBoxBytes, &xmap, bar,
                        static_cast<int>(c0) + warp * G::kBoxCh,
                        static_cast<int>((cluster + j * ncl) * TOK), 0);
  };
  for (int j = 0; j < min(static_cast<int64_t>(S), ntl); ++j) refill(j, j);

  // Rank r's tokens r + 16 m of tile jt: the cluster's sums (a fixed tree over the ranks:
  // deterministic), the coefficient row to global memory, the pre weights to every CTA. One warp;
  // lane v sums value v. This chain runs inside the last warp's products, and the block waits for
  // that warp at the next barrier: every load is issued first, the sums are a tree and the
  // sigmoids use the fast exponential and division (a serial chain of 16 adds and the IEEE
  // division's branches took ~1500 cycles a tile, H100 profile of 17fb94c).
  auto reduce = [&](int64_t jt) {
    const int b = static_cast<int>(jt & 1);
    cuda::mbar_wait(rbar0 + 8 * b, static_cast<uint32_t>((jt >> 1) & 1));
    const int64_t t0 = (cluster + jt * ncl) * TOK;
    const int v = min(lane, kC16K);  // lanes 25-31 repeat value 24 (unused)
    const float sc = a.scale[v < kC16N ? 0 : v < 2 * kC16N ? 1 : 2], bs = a.base[min(v, kC16K - 1)];
#pragma unroll 1
    for (int m = 0; m < M; ++m) {
      const float* rb = rbuf + (b * M + m) * kC16Ctas * R + v;
      float part[kC16Ctas];
#pragma unroll
      for (int r = 0; r < kC16Ctas; ++r) part[r] = rb[r * R];
#pragma unroll
      for (int h = 1; h < kC16Ctas; h *= 2)  // log2(16) levels, all indices static
#pragma unroll
        for (int r = 0; r < kC16Ctas; r += 2 * h) part[r] += part[r + h];
      const float sum = part[0];
      const float ss = __shfl_sync(0xffffffffu, sum, kC16K);
      const float logit = rsqrtf(ss * a.inv_flat + a.norm_eps) * sum * sc + bs;
      const float sg = __fdividef(1.0f, 1.0f + __expf(-logit));
      const float co = v < kC16N ? sg + a.pre_eps : v < 2 * kC16N ? 2.0f * sg : logit;
      const int t = m * 16 + rank;
      if (lane < kC16K && t0 + t < a.tokens) a.co[(t0 + t) * a.co_stride + lane] = co;
      const float4 pre =
          make_float4(__shfl_sync(0xffffffffu, co, 0), __shfl_sync(0xffffffffu, co, 1),
                      __shfl_sync(0xffffffffu, co, 2), __shfl_sync(0xffffffffu, co, 3));
      if (lane < kC16Ctas) {
        const uint32_t dst = cuda::smem_u32(pbuf + (b * TOK + t) * kC16N);
        cuda::st_async16(cuda::cluster_map(dst, lane), pre, cuda::cluster_map(pbar0 + 8 * b, lane));
      }
    }
    __syncwarp();  // every lane's reads of the buffer are done: it may take tile jt + 2
    if (lane == 0 && jt + 2 < ntl) cuda::mbar_expect_tx(rbar0 + 8 * b, P::kPartBytes);
  };

  int s = 0, sp = 0;    // slots of tiles j and j - 1
  uint32_t parity = 0;  // of tile j's slot phase
  // Where the last warp reduces: with 16-token tiles a quarter of the way through its products of
  // tile j (tile j - 1, whose partials came in during the previous iteration); with 32-token tiles
  // right after the push of tile j, while the other warps write y of tile j - 1. H100, same call
  // (e4ef5ee): the first is faster at M = 1 (f32 0.557-0.563 vs 0.577-0.582 ms, bf16 0.324 vs
  // 0.348), the second at M = 2 (bf16 0.307 vs 0.328), whose reduce is twice as long.
  constexpr bool kReduceBesideY = M == 2;
  constexpr int kReducer = kC16Warps - 1;
  constexpr int kWriters = kReduceBesideY ? 32 * kReducer : kC16Threads;
  for (int64_t j = 0; j <= ntl; ++j) {
    auto reduce_previous = [&] {
      if (!kReduceBesideY && j >= 1 && warp == kReducer) reduce(j - 1);
    };
    if (j == ntl) reduce_previous();
    if (j < ntl) {
      const int b = static_cast<int>(j & 1);
      cuda::mbar_wait(bars + 8 * s, parity);
      const unsigned char* slot = c16_smem + s * kSlotBytes;
      {
        float d[M][3][4], ss[M][2];
        if constexpr (kBf16Mma)
          c16_products_bf16<KS, M>(slot, fr, d, ss, reduce_previous);
        else
          c16_products<T, KS, M>(slot, fr, d, ss, reduce_previous);
        float* wp = wpart + (warp % P::kPartWarps) * TOK * R;
        if (warp < P::kPartWarps) c16_store_partials<M>(wp, d, ss);
        __syncthreads();
        if constexpr (P::kPartWarps < kC16Warps) {
          if (warp >= P::kPartWarps) c16_store_partials<M, true>(wp, d, ss);
          __syncthreads();
        }
      }
      // Token t's row (chunk q of 7 float4) summed over the warps in order, pushed to rank t % 16.
      for (int e = tid; e < TOK * kQ; e += kC16Threads) {
        const int t = e / kQ, q = e - t * kQ;
        float4 sum = make_float4(0, 0, 0, 0);
#pragma unroll
        for (int w = 0; w < P::kPartWarps; ++w) {
          const float4 v = *reinterpret_cast<const float4*>(wpart + (w * TOK + t) * R + 4 * q);
          sum.x += v.x, sum.y += v.y, sum.z += v.z, sum.w += v.w;
        }
        const int to = t % kC16Ctas, m = t / kC16Ctas;
        const uint32_t dst = cuda::smem_u32(rbuf + ((b * M + m) * kC16Ctas + rank) * R + 4 * q);
        cuda::st_async16(cuda::cluster_map(dst, to), sum, cuda::cluster_map(rbar0 + 8 * b, to));
      }
    }
    if (kReduceBesideY && warp == kReducer) {
      if (j < ntl) reduce(j);
    } else if (j >= 1) {
      const int64_t jt = j - 1;
      const int b = static_cast<int>(jt & 1);
      cuda::mbar_wait(pbar0 + 8 * b, static_cast<uint32_t>((jt >> 1) & 1));
      c16_collapse_rows<T, KS, TOK, kWriters>(y, c16_smem + sp * kSlotBytes, pbuf + b * TOK * kC16N,
                                              a, (cluster + jt * ncl) * TOK, c0);
    }
    __syncthreads();  // tile j - 1's slot, its pre weights and the partials are free
    if (j >= 1) {
      const int64_t jt = j - 1;
      if (tid == 0 && jt + 2 < ntl) cuda::mbar_expect_tx(pbar0 + 8 * (jt & 1), P::kPreBytes);
      if (jt + S < ntl) refill(jt + S, sp);
    }
    sp = s;
    if (++s == S) s = 0, parity ^= 1;
  }
  // No CTA leaves while a peer's pushes may still be on their way to it.
  cuda::cluster_arrive();
  cuda::cluster_wait();
#else
  (void)y, (void)xmap, (void)a;
#endif
}

}  // namespace
}  // namespace baracuda::mhc_cuda
