// Dynamic-H collapse in one pass over X, split by channels over the whole GPU.
//
// Why this shape: a token's logits need all n * C of its values, and its output y needs them
// again once the logits are known, so a one-pass kernel must hold every token on chip from its
// first product to its last output. The cluster kernels held whole tiles of tokens per cluster
// and re-read fn (1.5 MB at f32, n = 4, C = 4096) from L2 for every tile; the split-K kernels read
// X twice. Here CTA s (one per SM, P of them) owns channels [s W, s W + W) of every stream, for
// every token:
//  - its slice of fn (24 x n W floats, 13.5 KB) sits in shared memory for the whole kernel;
//  - X arrives in blocks of 64 tokens (a 36 KB f32 / 18 KB 16-bit slice tile per CTA), cp.async
//    into a ring of grid_stages<T>() buffers;
//  - warps have roles and never wait for each other except through mbarriers and counters: one
//    copy warp fills the ring; four MMA warps form the CTA's partial products and sum of squares
//    of a block (tensor cores, 3xTF32 / 2xTF32 as in logits_mma_kernel), write them to global
//    memory and count the CTA in on the block's counter; four reducer warps take the tokens
//    t = s (mod P): once every CTA has published the block, they sum its P partials in a fixed
//    order, form pre and publish it (a second counter), then finish post and the Sinkhorn of
//    comb; four output warps wait for the block's pre and write y for their channels, re-reading
//    the slice from L2 (a tile that stayed in shared memory until its pre was known held the
//    ring for the whole reduce chain: ~22 us a buffer, 1.14 ms at f32, at fb68e22).
// A first version ran every role on the same eight warps in one loop with block barriers: each
// block then paid the sum of the phases' latencies (6.4 us per 64-token block at f32 where the
// bytes take 1.4 us; 1.65 ms in all, ncu at 384f360).
// X leaves HBM once where its second read hits L2; the cross-CTA traffic (28 floats per token
// and CTA) stays in L2.
// All P CTAs wait on each other, so they must be co-resident: the launch is cooperative, one
// CTA per SM. Every sum has a fixed order that depends on (n, C, P) only: deterministic, and the
// bits of a token do not depend on the token count (P depends on the device's SM count).
#pragma once

#include "core/cuda/mbarrier.cuh"
#include "ops/mhc/kernels.cuh"

namespace baracuda::mhc_cuda {
namespace {

// Warp roles: MMA (products), one copy warp, output warps, reducer warps.
// Four copy warps: one warp issuing 16-byte cp.async with their address arithmetic could not
// keep up with the bytes (ncu at 411f1c1: the copy warp always issuing, the MMA warps waiting for
// tiles; one bulk copy per 128-byte row instead was slower still, 2.2 ms at 113eafa).
constexpr int kGridMmaWarps = 4, kGridLoadWarp = kGridMmaWarps, kGridLoadWarps = 4;
constexpr int kGridOutWarp0 = kGridLoadWarp + kGridLoadWarps;
constexpr int kGridOutWarps = 4, kGridReduceWarp0 = kGridOutWarp0 + kGridOutWarps;
constexpr int kGridReduceWarps = 4;
constexpr int kGridThreads = 32 * (kGridReduceWarp0 + kGridReduceWarps);
// Partial buffers in flight: the MMA warps publish block j into slot j % kGridSlots once every
// token of block j - kGridSlots has been reduced. This also bounds how far the copies run ahead
// of the outputs, which re-read X from L2: about kGridSlots blocks (24 MB at f32) between the two
// reads of a block.
constexpr int kGridSlots = 6;
constexpr int kGridPart = 28;      // floats per (token, CTA): 24 products, sum of squares, pad
constexpr int kGridMaxCtas = 160;  // a reducer lane sums at most 5 CTAs' partials
constexpr int kGridMmaRows = 32;   // tokens per MMA-warp group (two m16 tiles)
constexpr int kGridTokens = 64;    // tokens per block
template <class T>
constexpr int grid_tokens() {
  return kGridTokens;
}
// Tile buffers: 184 KB of ring either way (a 4 x 32-channel slice: 36 KB at f32, 18 KB at 16 bits).
template <class T>
constexpr int grid_stages() {
  return sizeof(T) == 4 ? 5 : 10;
}
template <class T>
constexpr int grid_parts() {
  return kGridMmaWarps / (grid_tokens<T>() / kGridMmaRows);
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
  float* part = nullptr;  // [kGridSlots][BT][ctas][kGridPart]
  // [2][blocks][kGridCounterStride]: CTAs that published a block's products; tokens of the block
  // whose pre is published
  unsigned* arrive = nullptr;
  unsigned div_cw = 0, div_n = 0;  // fast_div magics of W / VEC and of n
  ActivateArgs act;                // n, k, scale, base, inv_flat, norm_eps, pre_eps, sk
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
  constexpr int bt = grid_tokens<T>();
  return grid_stages<T>() * grid_tile_bytes<T>(slice) + sizeof(float) * 24 * grid_fpitch(slice) +
         sizeof(float) * grid_parts<T>() * bt * (kDynKpass + 1) +
         sizeof(float) * kGridOutWarps * bt * 4 + sizeof(uint64_t) * 2 * grid_stages<T>();
}
// x / d for x, d < 2^16 with magic = ceil(2^32 / d): exact in that range. d = 1 (whose magic
// does not fit) is magic 0.
__host__ __device__ inline unsigned fast_div_magic(unsigned d) {
  return d == 1 ? 0u : static_cast<unsigned>(((uint64_t{1} << 32) + d - 1) / d);
}
__device__ __forceinline__ int fast_div(int x, unsigned magic) {
  return magic ? static_cast<int>(__umulhi(static_cast<unsigned>(x), magic)) : x;
}

// Counters sit 128 bytes apart (a line each, so the L2 slices they hash to differ), and waiters
// poll them with relaxed loads and a pause: acquire loads invalidate the SM's L1 each time, and
// many CTAs polling one line load its L2 slice. One acquire load follows the poll that saw the
// count.
constexpr int kGridCounterStride = 32;
constexpr unsigned kGridPollNs = 128;
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
// A group's own barrier (named barriers 1 and 2: the MMA and the output warps), so no role
// waits for another's progress except through the counters and the mbarriers.
template <int kId, int kThreads>
__device__ __forceinline__ void group_sync() {
  asm volatile("bar.sync %0, %1;\n" ::"n"(kId), "n"(kThreads) : "memory");
}

// One reducer warp: the tokens t = cta + P (rw + kGridReduceWarps m), each once its block's
// products are all published. Lane l sums CTAs l, l + 32, ... in order (two CTAs' partials in
// flight per lane at a time), then a fixed shuffle tree forms the totals in lane 0; lane k then
// owns logit k as in activate_dynamic_warp_kernel. pre is published first (the outputs wait for
// it), post and the Sinkhorn of comb follow.
template <int BT>
__device__ void grid_reduce_tokens(const GridArgs& a, int rw, int lane) {
  constexpr unsigned kAll = 0xffffffffu;
  constexpr int kQuads = kGridPart / 4;
  const int n = a.n, P = a.ctas, rounds = (P + 63) / 64;
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
    float acc[4 * kQuads] = {};
    for (int rd = 0; rd < rounds; ++rd) {
      float4 v[2][kQuads];
#pragma unroll
      for (int u = 0; u < 2; ++u) {
        const int s = min(lane + 32 * (2 * rd + u), P - 1);  // in range; zeroed below if past P
        const float4* p4 = reinterpret_cast<const float4*>(src + int64_t{s} * kGridPart);
#pragma unroll
        for (int q = 0; q < kQuads; ++q) v[u][q] = __ldcg(p4 + q);
      }
#pragma unroll
      for (int u = 0; u < 2; ++u) {
        if (lane + 32 * (2 * rd + u) >= P) continue;
#pragma unroll
        for (int q = 0; q < kQuads; ++q) {
          acc[4 * q] += v[u][q].x, acc[4 * q + 1] += v[u][q].y;
          acc[4 * q + 2] += v[u][q].z, acc[4 * q + 3] += v[u][q].w;
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

// The first read of X with an L2 evict-last hint (the outputs read it again a few blocks later,
// then evict-first).
__device__ __forceinline__ void cp_async16_keep(void* smem, const void* gmem, int src_bytes,
                                                uint64_t policy) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2, %3;\n" ::"r"(s),
               "l"(gmem), "r"(src_bytes), "l"(policy)
               : "memory");
}

// LEAD > 0: the copies of block j wait until block j - LEAD's pre is published, which bounds the
// bytes between a block's two reads of X (its L2 window). KEEP: evict-last hint on the first read.
template <class T, int LEAD, bool KEEP>
__global__ void __launch_bounds__(kGridThreads, 1)
    grid_collapse_kernel(T* __restrict__ y, const T* __restrict__ x, GridArgs a) {
  constexpr int BT = grid_tokens<T>(), VEC = 16 / static_cast<int>(sizeof(T));
  constexpr int kStages = grid_stages<T>();
  constexpr int kGroups = BT / kGridMmaRows, kParts = grid_parts<T>();
  constexpr int kMmaThreads = 32 * kGridMmaWarps;
  constexpr bool kSplitA = sizeof(T) == 4;  // 16-bit values are exact in TF32
  extern __shared__ __align__(16) unsigned char grid_smem[];
  const int warp = static_cast<int>(threadIdx.x >> 5), lane = static_cast<int>(threadIdx.x & 31);
  const int tid = static_cast<int>(threadIdx.x);
  const int n = a.n, W = a.width, slice = n * W, pitch = a.pitch, fpitch = a.fpitch;
  const size_t tile_bytes = grid_tile_bytes<T>(slice);
  auto tile = [&](int64_t j) {
    return reinterpret_cast<T*>(grid_smem + static_cast<size_t>(j % kStages) * tile_bytes);
  };
  float* fs = reinterpret_cast<float*>(grid_smem + kStages * tile_bytes);
  float* wpart = fs + 24 * fpitch;               // [kParts][BT][kDynKpass]
  float* wss = wpart + kParts * BT * kDynKpass;  // [kParts][BT]
  float* spre = wss + kParts * BT;               // [BT][4]
  uint64_t* full =
      reinterpret_cast<uint64_t*>(spre + kGridOutWarps * BT * 4);  // [kStages]: tile landed
  uint64_t* empty = full + kStages;  // [kStages]: the MMA warps are done with the tile
  const int64_t c0 = int64_t{blockIdx.x} * W;
  const int wc = static_cast<int>(min(int64_t{W}, a.channels - c0));  // this CTA's channels
  const int cw = W / VEC;                                             // 16-byte chunks per stream

  // fn's slice, zero past K and past this CTA's channels, so padded rows and columns add nothing.
  for (int idx = tid; idx < 24 * slice; idx += kGridThreads) {
    const int kk = idx / slice, e = idx - kk * slice, i = e / W, col = e - i * W;
    fs[kk * fpitch + e] =
        kk < a.k && col < wc ? a.fn[kk * a.fn_stride + i * a.channels + c0 + col] : 0.f;
  }
  if (tid == 0) {
    for (int b = 0; b < kStages; ++b) {
      cuda::mbar_init(cuda::smem_addr(full + b), 32 * kGridLoadWarps);  // the copy lanes
      cuda::mbar_init(cuda::smem_addr(empty + b), kMmaThreads);
    }
  }
  __syncthreads();  // the only barrier of all roles: fn's slice and the mbarriers are ready

  if (warp >= kGridReduceWarp0) {
    grid_reduce_tokens<BT>(a, warp - kGridReduceWarp0, lane);
    return;
  }
  if (warp < kGridLoadWarp + kGridLoadWarps && warp >= kGridLoadWarp) {
    const int cl = (warp - kGridLoadWarp) * 32 + lane;
    // Copies: block j into buffer j % S once the MMA warps are done with block j - S; each lane's
    // arrival on full[b] fires when its copies land.
    const int chunks = BT * n * cw;
    uint64_t policy = 0;
    if constexpr (KEEP)
      asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;\n" : "=l"(policy));
    for (int64_t j = 0; j < a.blocks; ++j) {
      const int b = static_cast<int>(j % kStages);
      if (j >= kStages)
        cuda::mbar_wait(cuda::smem_addr(empty + b), static_cast<uint32_t>((j / kStages - 1) & 1));
      if (LEAD > 0 && j >= LEAD) {
        if (lane == 0)
          wait_count(a.arrive + (a.blocks + j - LEAD) * kGridCounterStride,
                     static_cast<unsigned>(BT));  // a full block: j - LEAD is not the last
        __syncwarp();
      }
      T* dst = tile(j);
      const int64_t tok0 = j * BT;
      for (int idx = cl; idx < chunks; idx += 32 * kGridLoadWarps) {
        const int rs = fast_div(idx, a.div_cw), v = idx - rs * cw;
        const int r = fast_div(rs, a.div_n), i = rs - r * n;
        const int64_t tok = tok0 + r;
        const bool ok = tok < a.tokens && v * VEC < wc;
        const T* src = ok ? x + tok * a.x_st + i * a.x_si + c0 + v * VEC : x;
        if constexpr (KEEP)
          cp_async16_keep(dst + r * pitch + i * W + v * VEC, src, ok ? 16 : 0, policy);
        else
          cp_async16(dst + r * pitch + i * W + v * VEC, src, ok ? 16 : 0);
      }
      cuda::cp_async_mbar_arrive(cuda::smem_addr(full + b));
    }
    cp_async_wait<0>();
    return;
  }
  if (warp < kGridMmaWarps) {
    // Products of each block: warp (token group tg, part kp) over the slice's 16-element blocks
    // kp, kp + kParts, ...; the parts add in order through shared memory.
    const int tg = warp % kGroups, kp = warp / kGroups, g = lane >> 2, t = lane & 3;
    const int nblk = slice / 16;
    for (int64_t j = 0; j < a.blocks; ++j) {
      cuda::mbar_wait(cuda::smem_addr(full + j % kStages),
                      static_cast<uint32_t>((j / kStages) & 1));
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
      cuda::mbar_arrive(cuda::smem_addr(empty + j % kStages));  // this thread's reads are done
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
      // The slot's previous block must be fully reduced (its partials read) before it is
      // overwritten.
      if (tid == 0 && j >= kGridSlots) {
        const int64_t old = j - kGridSlots;
        wait_count(a.arrive + (a.blocks + old) * kGridCounterStride,
                   static_cast<unsigned>(min(int64_t{BT}, a.tokens - old * BT)));
      }
      group_sync<1, kMmaThreads>();
      // Publish: quad q < 6 holds products 4q.., quad 6 the sum of squares (quad 7 is padding,
      // never read).
      float* dst = a.part + (j % kGridSlots) * BT * int64_t{a.ctas} * kGridPart +
                   int64_t{blockIdx.x} * kGridPart;
      for (int it = tid; it < BT * 8; it += kMmaThreads) {
        const int row = it >> 3, q = it & 7;
        if (q == 7) continue;
        float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
        for (int p = 0; p < kParts; ++p) {
          if (q < 6) {
            const float4 w4 =
                *reinterpret_cast<const float4*>(wpart + (p * BT + row) * kDynKpass + 4 * q);
            v.x += w4.x, v.y += w4.y, v.z += w4.z, v.w += w4.w;
          } else {
            v.x += wss[p * BT + row];
          }
        }
        *reinterpret_cast<float4*>(dst + int64_t{row} * a.ctas * kGridPart + 4 * q) = v;
      }
      group_sync<1, kMmaThreads>();  // wpart is free again; every partial of this CTA is written
      if (tid == 0) arrive_release(a.arrive + j * kGridCounterStride);
    }
    return;
  }
  // Output warps: block jc once its tokens' pre are published, re-reading X (from L2: its copy
  // for the products left HBM a few blocks earlier) with evict-first loads, so the lines go once
  // used, and streaming stores for y. Each warp takes every kGridOutWarps-th block on its own
  // (a group working through one block at a time paid three dependent L2 round trips per block:
  // 4.6 us a block at f32, 66d121b).
  const int ow = warp - kGridOutWarp0;
  float* wpre = spre + ow * BT * 4;
  constexpr int kItems = 4;  // items (a token's VEC channels of every stream) in flight per lane
  for (int64_t jc = ow; jc < a.blocks; jc += kGridOutWarps) {
    const int64_t tok0 = jc * BT;
    const int rows = static_cast<int>(min(int64_t{BT}, a.tokens - tok0));
    if (lane == 0)
      wait_count(a.arrive + (a.blocks + jc) * kGridCounterStride, static_cast<unsigned>(rows));
    __syncwarp();  // also: every lane is done with the previous block's pre
    for (int idx = lane; idx < BT * n; idx += 32) {
      const int r = fast_div(idx, a.div_n), i = idx - r * n;
      wpre[r * 4 + i] = r < rows ? __ldcg(a.co + (tok0 + r) * a.co_stride + i) : 0.f;
    }
    __syncwarp();
    for (int it0 = lane; it0 < rows * cw; it0 += kItems * 32) {
      // Every load of the lane's items first (they are independent), then the sums.
      uint4 xv[kItems][4] = {};
      int rr[kItems], vv[kItems];
#pragma unroll
      for (int u = 0; u < kItems; ++u) {
        const int it = it0 + u * 32;
        rr[u] = fast_div(it, a.div_cw), vv[u] = it - rr[u] * cw;
        const bool ok = it < rows * cw && vv[u] * VEC < wc;
        const T* src = x + (tok0 + rr[u]) * a.x_st + c0 + vv[u] * VEC;
#pragma unroll
        for (int i = 0; i < 4; ++i)
          if (ok && i < n) xv[u][i] = __ldcs(reinterpret_cast<const uint4*>(src + i * a.x_si));
      }
#pragma unroll
      for (int u = 0; u < kItems; ++u) {
        const int it = it0 + u * 32;
        if (it >= rows * cw || vv[u] * VEC >= wc) continue;
        float acc[VEC] = {};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          if (i >= n) break;
          const float pi = wpre[rr[u] * 4 + i];
#pragma unroll
          for (int e = 0; e < VEC; ++e)
            acc[e] =
                fmaf(pi, to_float(reinterpret_cast<const Pack<T, VEC>&>(xv[u][i]).v[e]), acc[e]);
        }
        Pack<T, VEC> pk;
#pragma unroll
        for (int e = 0; e < VEC; ++e) pk.v[e] = from_float<T>(acc[e]);
        __stcs(reinterpret_cast<uint4*>(y + (tok0 + rr[u]) * a.y_st + c0 + vv[u] * VEC),
               reinterpret_cast<const uint4&>(pk));
      }
    }
  }
}

}  // namespace
}  // namespace baracuda::mhc_cuda
