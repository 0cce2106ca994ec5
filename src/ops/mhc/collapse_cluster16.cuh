// Dynamic H collapse in one pass over X on 16-CTA clusters, with the CTA's slice of fn held in
// registers and X streaming through a ring of tiles. Included by launch.cuh.
//
// Why this shape (docs/perf/mhc.md has the measurements of the earlier one-pass kernels):
// - A token's pre weights need the dot products of all n C of its elements with fn, and its
//   collapse needs those elements again, so one pass must keep the token on chip until its
//   logits are known. 16 CTAs share a tile of 16 tokens: CTA r holds channels [r C / 16, (r + 1)
//   C / 16) of every stream, so the collapse of its channels needs no other CTA's data, and only
//   the 16 x 25 partial sums cross the cluster (distributed shared memory).
// - fn's slice (24 x n C / 16 floats) is loaded once into registers (96 per thread at C = 4096):
//   no fn traffic per tile. The kernel with fn in registers measured before (fifth session) ran
//   16-token tiles with one wait per tile and no ring, and stalled on its serial phases; here the
//   tiles arrive by bulk copies into a ring of slots while the CTA works on the ones before.
// - The cluster barrier is split: a tile's partials are published (arrive) and the next tile's
//   products run before the CTA waits for its peers' partials, so the barrier's latency hides
//   under tensor-core work. Partials are triple-buffered: buffer j % 3 is rewritten only after
//   the wait of tile j - 2's phase, which every CTA passes after reading tile j - 3's partials.
//
// Products: D[token][logit] = X[token][k] fn[logit][k] on m16n8k8 TF32 MMAs with the tokens as M
// and the 24 logits as three n8 tiles; 3xTF32 for f32 X, 2xTF32 for 16-bit X (exact in TF32).
// Warp w covers stream w / 2, half w % 2 of the slice's channels, KS k-steps of 8 channels; MMA k
// index t is channel 2 t and k index t + 4 channel 2 t + 1 of a step (one 8-byte (f32) or 4-byte
// (16-bit) shared load per token row and lane). Each pair of k-steps accumulates on the tensor
// cores from zero and is added on the CUDA cores (short tensor-core chains, as in mma_block16).
// Every sum has a fixed shape (warp, CTA rank order), independent of the token count and of a
// token's slot: deterministic and bit-stable.
//
// Measured and removed (docs/perf/mhc.md): a warp-specialized form (8 product warps at setmaxnreg
// 224, 4 finisher warps at 56 publishing through remote mbarrier arrivals instead of the cluster
// barrier) ran 0.99 / 1.04 ms against this kernel's 0.83 / 0.63 (f32 / bf16): its finisher chain
// on 4 warps was longer than the products.
#pragma once

#include <type_traits>

#include "core/cuda/mma.cuh"
#include "ops/mhc/kernels.cuh"

namespace baracuda::mhc_cuda {
namespace {

constexpr int kC16Ctas = 16, kC16Threads = 256, kC16Warps = kC16Threads / 32;
constexpr int kC16N = 4, kC16K = (2 + kC16N) * kC16N;  // streams, logits
constexpr int kC16Tok = 16;  // tokens per tile (the MMA's M); rank r writes token r's coefficients
constexpr int kC16Row = 28;  // floats per token of partials: 24 logits, the sum of squares, padding
constexpr int kC16MaxSlots = 8;
static_assert(kC16Tok == kC16Ctas, "each rank writes the coefficient row of one token of a tile");
static_assert(kC16Warps == 2 * kC16N, "two warps per stream");

// One token of a slot: n rows of the slice, then padding so that the 8 token rows a fragment load
// touches fall in distinct banks (rows 8 words apart for 8-byte loads, 4 for 4-byte loads).
template <class T>
__host__ __device__ constexpr int c16_token_bytes(int channels) {
  return kC16N * (channels / kC16Ctas) * static_cast<int>(sizeof(T)) +
         8 * static_cast<int>(sizeof(T));
}
// Shared memory besides the ring: per-warp partials, the CTA's partials (3 buffers), pre, then one
// mbarrier per slot.
constexpr int kC16Floats = kC16Warps * kC16Tok * kC16Row + 3 * kC16Tok * kC16Row + kC16Tok * kC16N;
constexpr int kC16FixedBytes = 4 * kC16Floats + 8 * kC16MaxSlots;
template <class T>
constexpr int64_t c16_smem_bytes(int channels, int slots) {
  return int64_t{slots} * kC16Tok * c16_token_bytes<T>(channels) + kC16FixedBytes;
}

// A lane's two consecutive elements of a token row, as f32.
template <class T>
__device__ __forceinline__ void c16_pair(const unsigned char* p, float& lo, float& hi) {
  if constexpr (sizeof(T) == 4) {
    const float2 v = *reinterpret_cast<const float2*>(p);
    lo = v.x, hi = v.y;
  } else {
    const uint32_t w = *reinterpret_cast<const uint32_t*>(p);
    if constexpr (std::is_same_v<T, __nv_bfloat16>) {
      lo = __uint_as_float(w << 16), hi = __uint_as_float(w & 0xffff0000u);
    } else {
      const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&w));
      lo = f.x, hi = f.y;
    }
  }
}
// split_tf32 behind an opaque copy of v: fn's splits are loop-invariant, and hoisting all of them
// out of the tile loop would need 96 more registers than the kernel has.
__device__ __forceinline__ void c16_split_fn(float v, uint32_t& big, uint32_t& small) {
  asm volatile("" : "+f"(v));
  split_tf32(v, big, small);
}

template <class T, int KS>
__global__ void __launch_bounds__(kC16Threads, 1)
    collapse_cluster16_kernel(T* __restrict__ y, const T* __restrict__ x, DynArgs a) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  constexpr int CS = 16 * KS;  // channels per stream in a CTA's slice (two warps of KS steps)
  constexpr int kRowBytes = CS * static_cast<int>(sizeof(T));
  constexpr int TB = kC16N * kRowBytes + 8 * static_cast<int>(sizeof(T));
  constexpr int kSlotBytes = kC16Tok * TB;
  constexpr int VEC = 16 / static_cast<int>(sizeof(T));
  constexpr bool kSplitX = sizeof(T) == 4;
  constexpr int R = kC16Row;
  constexpr int kChunks = CS / VEC;        // 16-byte chunks per stream row of the slice
  constexpr int kWork = kC16Threads - 32;  // threads that copy X and write y
  extern __shared__ __align__(128) unsigned char c16_smem[];
  const int S = a.slots;
  float* wpart = reinterpret_cast<float*>(c16_smem + S * kSlotBytes);  // [warp][token][R]
  float* cpart = wpart + kC16Warps * kC16Tok * R;                      // [3][token][R]
  float* pres = cpart + 3 * kC16Tok * R;                               // [token][n]
  const uint32_t ring = cuda::smem_u32(c16_smem);
  const uint32_t bars = cuda::smem_u32(pres + kC16Tok * kC16N);

  const int tid = static_cast<int>(threadIdx.x), lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, tq = lane & 3;
  const int rank = static_cast<int>(cuda::cluster_rank());
  const int64_t cluster = blockIdx.x / kC16Ctas, ncl = gridDim.x / kC16Ctas;
  const int64_t ntl = (a.tiles - cluster + ncl - 1) / ncl;  // this cluster's tiles (>= 1)
  const int64_t c0 = static_cast<int64_t>(rank) * CS;
  const float scale0 = a.scale[0], scale1 = a.scale[1], scale2 = a.scale[2];

  if (tid == 0) {
    for (int s = 0; s < S; ++s) cuda::mbar_init(bars + 8 * s, 1);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  // fr[s][nt][j] = fn[nt * 8 + g][stream * C + c0 + half * CS / 2 + 8 s + 2 tq + j].
  const int stream = warp >> 1, half = warp & 1;
  float fr[KS][3][2];
  {
    const float* f =
        a.fn + static_cast<int64_t>(stream) * a.channels + c0 + half * (CS / 2) + 2 * tq;
#pragma unroll
    for (int nt = 0; nt < 3; ++nt)
#pragma unroll
      for (int s = 0; s < KS; ++s) {
        const float2 v =
            __ldg(reinterpret_cast<const float2*>(f + (nt * 8 + g) * a.fn_stride + 8 * s));
        fr[s][nt][0] = v.x, fr[s][nt][1] = v.y;
      }
  }
  __syncthreads();  // the mbarriers are initialized before any copy or wait

  // The cluster's tile j into slot j % S by one bulk copy per token and stream (tail rows copy
  // the last token; discarded). Every thread copying 16-byte chunks with cp.async instead, its
  // arrival on the slot's mbarrier behind them, measured 4-6% slower (H100, 412e249 / a5cf54f).
  auto refill = [&](int64_t j) {
    const int s = static_cast<int>(j % S);
    const uint32_t bar = bars + 8 * s;
    const int64_t t0 = (cluster + j * ncl) * kC16Tok;
    if (warp == kC16Warps - 1) return;  // the releasing warp issues no copies
    // Copy c = warp * 10 + lane for lanes 0-9, so no warp carries the issue alone. A copy may
    // complete before thread 0 announces the bytes: the transaction count may go negative within
    // a phase, and the phase cannot complete before thread 0's arrival.
    static_assert(kC16Tok * kC16N <= 10 * (kC16Warps - 1), "10 copies per warp");
    if (tid == 0) cuda::mbar_expect_tx(bar, kC16Tok * kC16N * kRowBytes);
    if (const int c = warp * 10 + lane; lane < 10 && c < kC16Tok * kC16N) {
      const int t = c / kC16N, i = c % kC16N;
      const int64_t tok = min(t0 + t, a.tokens - 1);
      cuda::bulk_load(ring + s * kSlotBytes + t * TB + i * kRowBytes,
                      x + tok * a.x_st + i * a.x_si + c0, kRowBytes, bar);
    }
  };
  for (int64_t j = 0; j < min(static_cast<int64_t>(S), ntl); ++j) refill(j);

  for (int64_t j = 0; j <= ntl; ++j) {
    if (j < ntl) {
      const int s = static_cast<int>(j % S);
      cuda::mbar_wait(bars + 8 * s, static_cast<uint32_t>((j / S) & 1));
      const unsigned char* xw = c16_smem + s * kSlotBytes + g * TB + stream * kRowBytes +
                                (half * (CS / 2) + 2 * tq) * static_cast<int>(sizeof(T));
      float d[3][4] = {};
      float ss0 = 0, ss1 = 0;  // tokens g and g + 8
#pragma unroll
      for (int b = 0; b < KS / 2; ++b) {
        float blk[3][4] = {};
#pragma unroll
        for (int u = 0; u < 2; ++u) {
          const int st = 2 * b + u;
          float lo0, lo1, hi0, hi1;
          c16_pair<T>(xw + st * 8 * static_cast<int>(sizeof(T)), lo0, lo1);
          c16_pair<T>(xw + 8 * TB + st * 8 * static_cast<int>(sizeof(T)), hi0, hi1);
          ss0 = fmaf(lo0, lo0, ss0), ss0 = fmaf(lo1, lo1, ss0);
          ss1 = fmaf(hi0, hi0, ss1), ss1 = fmaf(hi1, hi1, ss1);
          // a = {A[g][t], A[g + 8][t], A[g][t + 4], A[g + 8][t + 4]}.
          uint32_t ab[4] = {__float_as_uint(lo0), __float_as_uint(hi0), __float_as_uint(lo1),
                            __float_as_uint(hi1)};
          uint32_t as[4] = {0, 0, 0, 0};
          if constexpr (kSplitX) {
            split_tf32(lo0, ab[0], as[0]);
            split_tf32(hi0, ab[1], as[1]);
            split_tf32(lo1, ab[2], as[2]);
            split_tf32(hi1, ab[3], as[3]);
          }
#pragma unroll
          for (int nt = 0; nt < 3; ++nt) {
            uint32_t bb[2], bs[2];
            c16_split_fn(fr[st][nt][0], bb[0], bs[0]);
            c16_split_fn(fr[st][nt][1], bb[1], bs[1]);
            if constexpr (kSplitX) mma_tf32_k8(blk[nt], as, bb);
            mma_tf32_k8(blk[nt], ab, bs);
            mma_tf32_k8(blk[nt], ab, bb);
          }
        }
#pragma unroll
        for (int nt = 0; nt < 3; ++nt)
#pragma unroll
          for (int v = 0; v < 4; ++v) d[nt][v] += blk[nt][v];
      }
      // The 4 lanes of a token row hold interleaved quarters of its elements.
      ss0 += __shfl_xor_sync(0xffffffffu, ss0, 1);
      ss0 += __shfl_xor_sync(0xffffffffu, ss0, 2);
      ss1 += __shfl_xor_sync(0xffffffffu, ss1, 1);
      ss1 += __shfl_xor_sync(0xffffffffu, ss1, 2);
      float* wp = wpart + warp * kC16Tok * R;
#pragma unroll
      for (int nt = 0; nt < 3; ++nt) {
        wp[g * R + nt * 8 + 2 * tq] = d[nt][0];
        wp[g * R + nt * 8 + 2 * tq + 1] = d[nt][1];
        wp[(g + 8) * R + nt * 8 + 2 * tq] = d[nt][2];
        wp[(g + 8) * R + nt * 8 + 2 * tq + 1] = d[nt][3];
      }
      if (tq == 0) wp[g * R + kC16K] = ss0, wp[(g + 8) * R + kC16K] = ss1;
      __syncthreads();
      float* cp = cpart + (j % 3) * kC16Tok * R;
      for (int e = tid; e < kC16Tok * (kC16K + 1); e += kC16Threads) {
        const int t = e / (kC16K + 1), v = e - t * (kC16K + 1);
        float sum = 0;
#pragma unroll
        for (int w = 0; w < kC16Warps; ++w) sum += wpart[(w * kC16Tok + t) * R + v];
        cp[t * R + v] = sum;
      }
      if (j == 0) __syncthreads();  // later iterations pass two barriers before wpart is rewritten
    }
    // Coefficients of token `rank` (one value per thread), stored after the arrive below.
    float co_val = 0;
    int64_t co_at = -1;
    const int64_t jt = j - 1, t0 = (cluster + jt * ncl) * kC16Tok;
    if (j >= 1) {
      cuda::cluster_wait();  // every CTA's partials of tile j - 1 are visible
      const uint32_t cpb = cuda::smem_u32(cpart + (jt % 3) * kC16Tok * R);
      // The cluster's totals in rank order: 8 lanes per token for pre (lanes 0-3) and the sum of
      // squares (lane 4); 20 more threads for the rest of the row of token `rank`.
      auto total = [&](int t, int k) {
        float part[kC16Ctas];
#pragma unroll
        for (int r = 0; r < kC16Ctas; ++r)
          part[r] = cuda::cluster_load(cuda::cluster_map(cpb + 4 * (t * R + k), r));
        float sum = 0;
#pragma unroll
        for (int r = 0; r < kC16Ctas; ++r) sum += part[r];
        return sum;
      };
      if (tid < 8 * kC16Tok) {
        const int t = tid >> 3, v = tid & 7;
        const float sum = v <= kC16N ? total(t, v < kC16N ? v : kC16K) : 0.0f;
        const float ss = __shfl_sync(0xffffffffu, sum, (lane & ~7) | kC16N);
        if (v < kC16N) {
          const float inv_rms = rsqrtf(ss * a.inv_flat + a.norm_eps);
          const float pre = sigmoid(inv_rms * sum * scale0 + a.base[v]) + a.pre_eps;
          pres[t * kC16N + v] = pre;
          if (t == rank && t0 + t < a.tokens) co_at = (t0 + t) * a.co_stride + v, co_val = pre;
        }
      } else if (tid < 8 * kC16Tok + kC16K - kC16N) {
        const int k = kC16N + tid - 8 * kC16Tok;
        const float sum = total(rank, k), ss = total(rank, kC16K);
        if (t0 + rank < a.tokens) {
          const float inv_rms = rsqrtf(ss * a.inv_flat + a.norm_eps);
          const float v = inv_rms * sum * (k < 2 * kC16N ? scale1 : scale2) + a.base[k];
          co_at = (t0 + rank) * a.co_stride + k, co_val = k < 2 * kC16N ? 2.0f * sigmoid(v) : v;
        }
      }
      __syncthreads();  // pres is complete; every remote read of tile j - 1 has returned
    }
    // Tile j's partials (written before the barrier above, or before iteration 0's) are published
    // by the last warp's release, which orders the whole CTA's earlier accesses (cumulativity
    // through the block barrier); the others arrive relaxed. A release waits for the thread's
    // outstanding memory operations (MEMBAR.ALL.GPU + ERRBAR: 7-16% of the samples when every
    // thread released), so that warp makes no global stores and issues no copies.
    if (j < ntl) {
      if (warp == kC16Warps - 1)
        cuda::cluster_arrive();
      else
        cuda::cluster_arrive_relaxed();
    }
    if (j >= 1) {
      if (co_at >= 0) a.co[co_at] = co_val;
      // y for this CTA's channels: warps 0-6, 16-byte chunks.
      if (warp < kC16Warps - 1) {
        const T* xs = reinterpret_cast<const T*>(c16_smem + (jt % S) * kSlotBytes);
        for (int c = tid; c < kC16Tok * kChunks; c += kWork) {
          const int t = c / kChunks, q = c - t * kChunks;
          const int64_t tok = t0 + t;
          if (tok >= a.tokens) continue;
          const T* xt = xs + t * (TB / static_cast<int>(sizeof(T)));
          float acc[VEC] = {};
#pragma unroll
          for (int i = 0; i < kC16N; ++i) {
            float v[VEC];
            load_vec<T, VEC>(xt + i * CS + q * VEC, v);
            const float w = pres[t * kC16N + i];
#pragma unroll
            for (int e = 0; e < VEC; ++e) acc[e] = fmaf(w, v[e], acc[e]);
          }
          store_vec<T, VEC>(y + tok * a.y_st + c0 + q * VEC, acc);
        }
      }
      __syncthreads();  // the slot and pres are free
      if (jt + S < ntl) refill(jt + S);
    }
  }
  // No CTA leaves while a peer may still read its partials of the last tile.
  cuda::cluster_arrive();
  cuda::cluster_wait();
#else
  (void)y, (void)x, (void)a;
#endif
}

}  // namespace
}  // namespace baracuda::mhc_cuda
