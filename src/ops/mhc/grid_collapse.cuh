// Dynamic-H collapse in one pass over X, split by channels over the whole GPU.
//
// Why this shape: a token's logits need all n * C of its values, and its output y needs them
// again once the logits are known, so a one-pass kernel must hold every token on chip from its
// first product to its last output. The cluster kernels held whole tiles of tokens per cluster
// and re-read fn (1.5 MB at f32, n = 4, C = 4096) from L2 for every tile; the split-K kernels read
// X twice. Here CTA s (one per SM, P of them) owns channels [s W, s W + W) of every stream, for
// every token:
//  - its slice of fn (24 x n W floats, 13.5 KB) sits in shared memory for the whole kernel;
//  - X arrives in blocks of BT tokens (32 KB of slice per CTA), cp.async into a ring of
//    kGridStages buffers;
//  - the CTA's partial products and sum of squares of a block (tensor cores, 3xTF32 / 2xTF32 as
//    in logits_mma_kernel) go to global memory, and a per-block counter counts the CTAs in;
//  - four reducer warps per CTA (warp-specialized, off the compute warps' barriers) take the
//    tokens t = s (mod P): once every CTA has published the block, they sum its P partials in a
//    fixed order, form pre and publish it (a second counter), then finish post and the Sinkhorn
//    of comb;
//  - LAG blocks after the products, the compute warps wait for the block's pre and write y for
//    their channels from the slice still in shared memory.
// X therefore leaves HBM once; the cross-CTA traffic (28 floats per token and CTA) stays in L2.
// All P CTAs wait on each other, so they must be co-resident: the launch is cooperative, one
// CTA per SM. Every sum has a fixed order that depends on (n, C, P) only: deterministic, and the
// bits of a token do not depend on the token count (P depends on the device's SM count).
#pragma once

#include "ops/mhc/kernels.cuh"

namespace baracuda::mhc_cuda {
namespace {

constexpr int kGridComputeWarps = 8, kGridReduceWarps = 4;
constexpr int kGridThreads = 32 * (kGridComputeWarps + kGridReduceWarps);
constexpr int kGridStages = 5;
constexpr int kGridSlots = 4;      // partial buffers in flight: LAG + 2 at the largest LAG (2)
constexpr int kGridPart = 28;      // floats per (token, CTA): 24 products, sum of squares, pad
constexpr int kGridMaxCtas = 160;  // a reducer lane sums at most 5 CTAs' partials
constexpr int kGridMmaRows = 32;   // tokens per compute-warp group (two m16 tiles)
// Tokens per block: 32 KB of a 4 x 32-channel slice either way.
template <class T>
constexpr int grid_tokens() {
  return sizeof(T) == 4 ? 64 : 128;
}

struct GridArgs {
  int64_t tokens = 0, channels = 0, blocks = 0;
  int n = 0, k = 0;
  int ctas = 0, width = 0;  // P and W (channels per CTA; the last CTA may have fewer)
  int pitch = 0;            // tile row pitch, elements
  int fpitch = 0;           // fn slice row pitch, floats
  int64_t x_st = 0, x_si = 0, y_st = 0;
  const float* fn = nullptr;
  int64_t fn_stride = 0;
  float* co = nullptr;
  int64_t co_stride = 0;
  float* part = nullptr;       // [kGridSlots][BT][ctas][kGridPart]
  unsigned* arrive = nullptr;  // [2][blocks]: CTAs that published products; tokens with pre
  ActivateArgs act;            // n, k, scale, base, inv_flat, norm_eps, pre_eps, sk
};

// Row pitches padded so that the 8-row fragment loads of a warp hit distinct banks (16 elements
// past a multiple of 128 bytes).
template <class T>
__host__ __device__ inline int grid_pitch(int slice) {
  constexpr int line = 128 / static_cast<int>(sizeof(T));
  return (slice + line - 1) / line * line + 16;
}
__host__ __device__ inline int grid_fpitch(int slice) {
  return (slice + 31) / 32 * 32 + 16;
}
template <class T>
__host__ __device__ inline size_t grid_tile_bytes(int slice) {
  return sizeof(T) * static_cast<size_t>(grid_tokens<T>()) * grid_pitch<T>(slice);
}
template <class T>
__host__ __device__ inline size_t grid_smem_bytes(int slice) {
  constexpr int bt = grid_tokens<T>(), parts = kGridComputeWarps / (bt / kGridMmaRows);
  return kGridStages * grid_tile_bytes<T>(slice) + sizeof(float) * 24 * grid_fpitch(slice) +
         sizeof(float) * parts * bt * (kDynKpass + 1) + sizeof(float) * bt * 4;
}

// Counters sit 128 bytes apart (a line each, so the L2 slices they hash to differ), and waiters
// poll them with relaxed loads and a pause: acquire loads invalidate the SM's L1 each time, and
// hundreds of CTAs polling one line saturate its L2 slice and delay the arrivals themselves
// (ncu at b18ca15: most of the compute warps' time waited on a counter). One acquire load
// follows the poll that saw the count.
constexpr int kGridCounterStride = 32;
constexpr unsigned kGridPollNs = 200;
__device__ __forceinline__ void wait_count(const unsigned* p, unsigned target) {
  unsigned v;
  for (;;) {
    asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
    if (v >= target) break;
    __nanosleep(kGridPollNs);
  }
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
}
// Counts one arrival with release semantics: after a barrier, the writes of every thread that
// joined it are visible to whoever acquires the count (the pattern of CUTLASS's semaphores). No
// full fence: a fence also waits for the thread's copies still in flight.
__device__ __forceinline__ void arrive_release(unsigned* p) {
  asm volatile("red.release.gpu.global.add.u32 [%0], 1;\n" ::"l"(p) : "memory");
}
// The compute warps' barrier (the reducer warps never join it).
__device__ __forceinline__ void compute_sync() {
  asm volatile("bar.sync 1, %0;\n" ::"n"(32 * kGridComputeWarps) : "memory");
}

// One reducer warp: the tokens t = cta + P (rw + kGridReduceWarps m), each once its block's
// products are all published. Lane l sums CTAs l, l + 32, ... in order, then a fixed shuffle tree
// forms the totals in lane 0; lane k then owns logit k as in activate_dynamic_warp_kernel.
template <int BT>
__device__ void grid_reduce_tokens(const GridArgs& a, int rw, int lane) {
  constexpr unsigned kAll = 0xffffffffu;
  const int n = a.n, P = a.ctas;
  // Lane k's logit parameters, read once (dynamic_logit's expression below, same order).
  const int field = lane < n ? 0 : (lane < 2 * n ? 1 : 2);
  const float scale_k = lane < a.k ? a.act.scale[field] : 0.f;
  const float base_k = lane < a.k ? a.act.base[lane] : 0.f;
  for (int64_t tok = blockIdx.x + int64_t{rw} * P; tok < a.tokens;
       tok += int64_t{kGridReduceWarps} * P) {
    const int64_t j = tok / BT;
    const int r = static_cast<int>(tok - j * BT);
    if (lane == 0) wait_count(a.arrive + j * kGridCounterStride, static_cast<unsigned>(P));
    __syncwarp();
    const float* src = a.part + (static_cast<int64_t>(j % kGridSlots) * BT + r) * P * kGridPart;
    float acc[kGridPart] = {};
#pragma unroll
    for (int m = 0; m < kGridMaxCtas / 32; ++m) {
      const int s = lane + 32 * m;
      if (s < P) {
        const float4* p4 = reinterpret_cast<const float4*>(src + int64_t{s} * kGridPart);
#pragma unroll
        for (int q = 0; q < kGridPart / 4; ++q) {
          const float4 v = __ldcg(p4 + q);
          acc[4 * q] += v.x, acc[4 * q + 1] += v.y, acc[4 * q + 2] += v.z, acc[4 * q + 3] += v.w;
        }
      }
    }
    float mine = 0, ss = 0;
#pragma unroll
    for (int k = 0; k <= kDynKpass; ++k) {
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) acc[k] += __shfl_down_sync(kAll, acc[k], off);
      const float total = __shfl_sync(kAll, acc[k], 0);
      if (lane == k) mine = total;
      if (k == kDynKpass) ss = total;
    }
    const float inv_rms = rsqrtf(ss * a.act.inv_flat + a.act.norm_eps);
    float* o = a.co + tok * a.co_stride;
    float v = 0;
    if (lane < a.k) v = inv_rms * mine * scale_k + base_k;
    if (lane < n) o[lane] = sigmoid(v) + a.act.pre_eps;
    __syncwarp();  // every lane's pre is written before lane 0 publishes the token
    if (lane == 0) arrive_release(a.arrive + (a.blocks + j) * kGridCounterStride);
    if (lane >= n && lane < 2 * n) o[lane] = 2.0f * sigmoid(v);
    v = __shfl_sync(kAll, v, min(2 * n + lane, 31));
    v = sinkhorn_lanes(v, n, a.act.sk);
    if (lane < n * n) o[2 * n + lane] = v;
  }
}

template <class T, int LAG>
__global__ void __launch_bounds__(kGridThreads, 1)
    grid_collapse_kernel(T* __restrict__ y, const T* __restrict__ x, GridArgs a) {
  constexpr int BT = grid_tokens<T>(), VEC = 16 / static_cast<int>(sizeof(T));
  constexpr int kGroups = BT / kGridMmaRows, kParts = kGridComputeWarps / kGroups;
  constexpr int kNT = 32 * kGridComputeWarps;
  constexpr bool kSplitA = sizeof(T) == 4;  // 16-bit values are exact in TF32
  static_assert(LAG >= 1 && LAG + 2 <= kGridSlots && LAG + 2 <= kGridStages, "ring depths");
  const int warp = static_cast<int>(threadIdx.x >> 5), lane = static_cast<int>(threadIdx.x & 31);
  if (warp >= kGridComputeWarps) {
    grid_reduce_tokens<BT>(a, warp - kGridComputeWarps, lane);
    return;
  }
  extern __shared__ __align__(16) unsigned char grid_smem[];
  const int n = a.n, W = a.width, slice = n * W, pitch = a.pitch, fpitch = a.fpitch;
  const size_t tile_bytes = grid_tile_bytes<T>(slice);
  auto tile = [&](int64_t j) {
    return reinterpret_cast<T*>(grid_smem + static_cast<size_t>(j % kGridStages) * tile_bytes);
  };
  float* fs = reinterpret_cast<float*>(grid_smem + kGridStages * tile_bytes);
  float* wpart = fs + 24 * fpitch;               // [kParts][BT][kDynKpass]
  float* wss = wpart + kParts * BT * kDynKpass;  // [kParts][BT]
  float* spre = wss + kParts * BT;               // [BT][n]
  const int tid = static_cast<int>(threadIdx.x);
  const int64_t c0 = int64_t{blockIdx.x} * W;
  const int wc = static_cast<int>(min(int64_t{W}, a.channels - c0));  // this CTA's channels
  const int cw = W / VEC;                                             // 16-byte chunks per stream

  // fn's slice, zero past K and past this CTA's channels, so padded rows and columns add nothing.
  for (int idx = tid; idx < 24 * slice; idx += kNT) {
    const int kk = idx / slice, e = idx - kk * slice, i = e / W, col = e - i * W;
    fs[kk * fpitch + e] =
        kk < a.k && col < wc ? a.fn[kk * a.fn_stride + i * a.channels + c0 + col] : 0.f;
  }
  // Warp 0 copies nothing: its thread 0 signals and waits for the other CTAs, and a thread's
  // copies in flight would delay its release and acquire operations.
  auto issue_tile = [&](int64_t j) {
    T* dst = tile(j);
    const int64_t tok0 = j * BT;
    for (int idx = tid - 32; idx >= 0 && idx < BT * n * cw; idx += kNT - 32) {
      const int r = idx / (n * cw), rem = idx - r * (n * cw), i = rem / cw, v = rem - i * cw;
      const int64_t tok = tok0 + r;
      const bool ok = tok < a.tokens && v * VEC < wc;
      const T* src = ok ? x + tok * a.x_st + i * a.x_si + c0 + v * VEC : x;
      cp_async16(dst + r * pitch + i * W + v * VEC, src, ok ? 16 : 0);
    }
  };
#pragma unroll 1
  for (int j = 0; j < kGridStages; ++j) {
    if (j < a.blocks) issue_tile(j);
    cp_async_commit();
  }

  const int tg = warp % kGroups, kp = warp / kGroups, g = lane >> 2, t = lane & 3;
  const int nblk = slice / 16;
#pragma unroll 1
  for (int64_t j = 0; j < a.blocks + LAG; ++j) {
    if (j < a.blocks) {
      // Products of block j: warp (token group tg, part kp) over the slice's 16-element blocks
      // kp, kp + kParts, ...; the parts add in order through shared memory.
      cp_async_wait<kGridStages - 1 - LAG>();
      compute_sync();  // tile j has landed for every thread (and fn's slice is in place)
      const T* tl = tile(j);
      float d[2][3][4] = {};
      float ss[2][2] = {};
      for (int b = kp; b < nblk; b += kParts) {
        const int e = 16 * b + 4 * t;
        float bv[3][4], av[2][2][4];
        load_block_fragments<T, 2>(
            bv, av, ss, true,
            [&](int nt) {
              return *reinterpret_cast<const float4*>(fs + (nt * 8 + g) * fpitch + e);
            },
            [&](int mt, int h) {
              return tl + (tg * kGridMmaRows + mt * 16 + h * 8 + g) * pitch + e;
            });
        mma_block16<2, kSplitA>(d, av, bv);
      }
#pragma unroll
      for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int row = tg * kGridMmaRows + mt * 16 + h * 8 + g;
          float sv = ss[mt][h];  // the 4 lanes of a row hold interleaved quarters of its elements
          sv += __shfl_xor_sync(0xffffffffu, sv, 1);
          sv += __shfl_xor_sync(0xffffffffu, sv, 2);
#pragma unroll
          for (int nt = 0; nt < 3; ++nt) {
            float* o = wpart + (kp * BT + row) * kDynKpass + nt * 8 + 2 * t;
            o[0] = d[mt][nt][2 * h];
            o[1] = d[mt][nt][2 * h + 1];
          }
          if (t == 0) wss[kp * BT + row] = sv;
        }
      compute_sync();
      float* dst = a.part + (j % kGridSlots) * BT * int64_t{a.ctas} * kGridPart +
                   int64_t{blockIdx.x} * kGridPart;
      for (int it = tid; it < BT * (kGridPart / 4); it += kNT) {
        const int row = it / (kGridPart / 4), q = it - row * (kGridPart / 4);
        float v[4];
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          const int kk = 4 * q + c;
          float s = 0;
#pragma unroll
          for (int p = 0; p < kParts; ++p)
            s += kk < kDynKpass ? wpart[(p * BT + row) * kDynKpass + kk]
                                : (kk == kDynKpass ? wss[p * BT + row] : 0.f);
          v[c] = s;
        }
        *reinterpret_cast<float4*>(dst + int64_t{row} * a.ctas * kGridPart + 4 * q) =
            make_float4(v[0], v[1], v[2], v[3]);
      }
      compute_sync();  // wpart is free again; every partial of this CTA is written
      if (tid == 0) arrive_release(a.arrive + j * kGridCounterStride);
    }
    const int64_t jc = j - LAG;
    if (jc >= 0) {
      // Outputs of block jc once its tokens' pre are published.
      const int64_t tok0 = jc * BT;
      const int rows = static_cast<int>(min(int64_t{BT}, a.tokens - tok0));
      if (tid == 0)
        wait_count(a.arrive + (a.blocks + jc) * kGridCounterStride, static_cast<unsigned>(rows));
      compute_sync();
      for (int idx = tid; idx < BT * n; idx += kNT) {
        const int r = idx / n, i = idx - r * n;
        spre[idx] = r < rows ? __ldcg(a.co + (tok0 + r) * a.co_stride + i) : 0.f;
      }
      compute_sync();
      const T* tl = tile(jc);
      for (int it = tid; it < rows * cw; it += kNT) {
        const int r = it / cw, v = it - r * cw;
        if (v * VEC >= wc) continue;
        float acc[VEC] = {};
        for (int i = 0; i < n; ++i) {
          float xv[VEC];
          load_vec<T, VEC>(tl + r * pitch + i * W + v * VEC, xv);
          const float pi = spre[r * n + i];
#pragma unroll
          for (int e = 0; e < VEC; ++e) acc[e] = fmaf(pi, xv[e], acc[e]);
        }
        store_vec<T, VEC>(y + (tok0 + r) * a.y_st + c0 + v * VEC, acc);
      }
      compute_sync();  // the buffer of block jc and spre are free
      if (jc + kGridStages < a.blocks) issue_tile(jc + kGridStages);
    }
    cp_async_commit();
  }
  cp_async_wait<0>();
}

}  // namespace
}  // namespace baracuda::mhc_cuda
