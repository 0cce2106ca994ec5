// fused_wgmma_sm90a: the one-pass forward of fused_mma (one block per (batch row, head) walking
// the chunks with the state on chip) with its four products on warpgroup-wide tensor-core
// instructions (wgmma), so that the tensor work is issued asynchronously, a few instructions per
// product, instead of by two warps per scheduler in ~660 mma.sync each per chunk (fused_mma is
// bound by those warps' dependency latency: docs/perf/ssd.md, thirtieth session). The default
// forward for chunks 128 and 256 on sm_90a where B * H fills the SMs (kernels.cuh registers it).
//
// Shape: chunk 128 or 256, head_dim <= 64, state_dim <= 128 (both multiples of 8), 16-bit data;
// x, B, C and y views a tensor map can describe (Kernel::check: 16-byte aligned base and outer
// strides, unit inner stride; other views take the plan's fallback). Two warpgroups: warpgroup g
// owns rows 64 g .. 64 g + 63 of each 128-row half of the chunk's y, and the state's columns
// n 64 g .. 64 g + 63.
//
// Per 128 rows (cum_t in log2 units from the chunk's start, lv_s = cum_s - log2 v_s,
// w_s = v_s 2^(cum_last - cum_s); warp 0 forms the next chunk's while this chunk's first products
// run, so no barrier waits for them):
//   CB  = C . B^T            (ss, K-major both: [t][n] and [s][n] tiles)          m64n128 x 8
//   Y   = C . S^T            (ss, K-major both: C rows and the [d][n] state tile)  m64n64 x 8
//   Y   = 2^cum_t Y + W . X  (W_ts = 2^(cum_t - lv_s) CB_ts on s <= t, rounded to T, from
//                             registers; X [s][d] MN-major)                       m64n64 x 8
//   y   = Y + D x, times silu(z)
//   S   = 2^cum_last S + Xw^T . B  (Xw = w o X in shared memory; both MN-major)   m64n64 x 8
// Chunk 256 adds, for rows 128-255, the cross-half block C1 . B0^T (whole weights, against x0)
// and runs the update in two halves (K = 128 each), the first under C1 . B1^T.
// Tiles are stored as 64-column blocks of 128-byte rows with the 128-byte swizzle (16-byte chunk
// index XOR row % 8), the layout wgmma's descriptors read and TMA's 128-byte swizzle writes: C, B
// and x arrive by tensor-map copies (one thread, five boxes a half) into double buffers a chunk
// ahead (chunk 128) or into one buffer whose halves are refilled as their readers finish (chunk
// 256), completing on mbarriers, and y leaves by one tensor-map store per warpgroup from a staged
// tile. (Per-thread cp.async copies and per-element y stores, the first version, cost over half of
// its ~2700 instructions per warp and chunk in address arithmetic: 0.685 -> 0.376 ms at the 2.7B
// shape, docs/perf/ssd.md.)
#pragma once

#include "core/cuda/tensor_map.cuh"
#include "core/cuda/wgmma.cuh"
#include "ops/attention_hopper/fa3_ops.cuh"
#include "ops/ssd/forward_fused.cuh"  // the walk it runs (fused_walk, cut_walks)

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define BARACUDA_SSD_WGMMA_DEVICE 1
#else
#define BARACUDA_SSD_WGMMA_DEVICE 0
#endif

namespace baracuda::ssd_cuda {

namespace fwd_wg {
constexpr int kD = 64, kN = 128, kThreads = 256, kHalf = 128;  // kHalf: rows of a TMA box
constexpr uint32_t kTileBytes = 64 * 128;  // a [64 rows][64 columns] swizzled 16-bit tile
// Shared memory for chunk kQ (128 or 256), byte offsets from a 1024-byte aligned base (a swizzle
// atom is 8 rows x 128 B). Chunk 128: C, B and x double-buffered (a chunk ahead), y staged in its
// own tile. Chunk 256: one buffer of each (228 KB would not hold two), each half of it (rows
// 0-127, 128-255) on its own mbarrier and refilled as soon as its readers are done; the region
// `xw` holds w o x of one half at a time and the staged y.
template <int kQ>
struct Smem {
  static constexpr int kBufs = kQ == 128 ? 2 : 1;
  static constexpr uint32_t kOp = kQ * kN * 2;  // a C or B tile: two 64-column blocks
  static constexpr uint32_t kX = kQ * kD * 2;   // an x tile: one block
  static constexpr uint32_t c = 0;
  static constexpr uint32_t b = c + kBufs * kOp;
  static constexpr uint32_t x = b + kBufs * kOp;
  static constexpr uint32_t xw = x + kBufs * kX;  // 128 rows of w o x (chunk 256: two regions)
  static constexpr uint32_t s = xw + (kQ == 128 ? kHalf : 2 * kHalf) * kD * 2;  // [d][n], T
  static constexpr uint32_t y = s + kD * kN * 2;  // chunk 128: y staged, 64 rows a warpgroup
  static constexpr uint32_t dsk = y + (kQ == 128 ? kHalf * kD * 2 : 0);  // D (f32, 0 past D)
  // The chunk's scalars, two slots (warp 0 forms chunk c + 1's while chunk c is in flight).
  static constexpr uint32_t cum = dsk + 4 * kD;
  static constexpr uint32_t lv = cum + 2 * 4 * kQ;
  static constexpr uint32_t w = lv + 2 * 4 * kQ;
  static constexpr uint32_t bar = w + 2 * 4 * kQ;  // two mbarriers: buffers, or halves
  static constexpr uint32_t tot = bar + 2 * 8;     // chunk 256: the scalar warps' totals
  static constexpr uint32_t total = tot + 2 * 4;
  static constexpr uint32_t request = total + 1024;  // room to align the base
};
// Byte offset of element (r, col) of a tile of `rows` rows stored as 64-column swizzled blocks.
__host__ __device__ constexpr uint32_t swz(int rows, int r, int col) {
  return static_cast<uint32_t>((col / 64) * rows * 128 + r * 128 +
                               ((((col % 64) / 8) ^ (r % 8)) * 16) + (col % 8) * 2);
}
}  // namespace fwd_wg

#if BARACUDA_SSD_WGMMA_DEVICE
namespace fwd_wg {
namespace fa3 = attention_hopper::fa3;
using cuda::fence_regs;
using cuda::wgmma_commit;
using cuda::wgmma_fence;
__device__ __forceinline__ void wait_all() {
  cuda::wgmma_wait<0>();
}
__device__ __forceinline__ uint64_t desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
  return cuda::desc_swizzled(addr, lbo, sbo, 1);
}
// K-major operand: rows [r0, r0 + 64 or 128) of a [rows][K] tile, the k16 step at column k.
__device__ __forceinline__ uint64_t k_major(uint32_t tile, int rows, int r0, int k) {
  return desc(tile + (k / 64) * rows * 128 + r0 * 128 + (k % 64) * 2, 16, 1024);
}
// MN-major operand: the k16 step at row k of a [K rows][MN] tile, MN columns from block cb.
__device__ __forceinline__ uint64_t mn_major(uint32_t tile, int rows, int cb, int k) {
  return desc(tile + cb * rows * 128 + k * 128, rows * 128, 1024);
}
using fa3::Ops;
// The start of a ring of TMA stages: thread 0 sets up one mbarrier a slot (at bars, 8 bytes
// apart) and, after the block barrier that publishes them, issues the first stages.
template <class Issue>
__device__ __forceinline__ void start_ring(uint32_t bars, int slots, int stages, Issue&& issue) {
  if (threadIdx.x == 0) {
    for (int s = 0; s < slots; ++s) cuda::mbar_init(bars + 8 * s, 1);
    cuda::mbar_init_fence();
  }
  __syncthreads();
  if (threadIdx.x == 0)
    for (int i = 0; i < slots && i < stages; ++i) issue(i);
}
}  // namespace fwd_wg
#endif

// tc, tb: the [B, G, L, N] views of C and B; tx, ty: the [B, H, L, D] views of x and y
// (make_rows_map boxes of 64 columns x 128 rows, 64 rows for y).
template <class T, int kQ>
__global__ void __launch_bounds__(fwd_wg::kThreads, 1)
    ssd_fused_wgmma_kernel(const __grid_constant__ CUtensorMap tc,
                           const __grid_constant__ CUtensorMap tb,
                           const __grid_constant__ CUtensorMap tx,
                           const __grid_constant__ CUtensorMap ty, Fwd<T> p) {
#if BARACUDA_SSD_WGMMA_DEVICE
  using namespace fwd_wg;
  using S = Smem<kQ>;
  // by hand, not cuda::dynamic_smem_1024(): through the helper ptxas allocates this kernel's
  // registers differently, and the measured SASS is this one
  extern __shared__ unsigned char wg_smem_raw[];
  const uint32_t raw = cuda::smem_u32(wg_smem_raw);
  const uint32_t base = (raw + 1023u) & ~1023u;
  unsigned char* gen = wg_smem_raw + (base - raw);

  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, wg = tid / 128, wl = warp % 4;
  const FusedWalk fw = fused_walk(p);  // as fused_mma's
  int64_t h = fw.h, b = fw.b, seg = fw.seg, walk = fw.walk;
  const int64_t grp = fw.grp, c_lo = fw.c_lo, c_hi = fw.c_hi;
  const int D = static_cast<int>(p.D), N = static_cast<int>(p.N);
  const float a2 = p.A.at(h) * static_cast<float>(fwd_mma::kLog2e);
  const float bias = p.has_bias ? p.bias.at(h) : 0.0f;
  // This thread's accumulator rows (of its warpgroup's 64) and the column offset in an n8 block.
  const int r_lo = 16 * wl + lane / 4, cq = 2 * (lane % 4);

  // Rows [128 hf, 128 hf + 128) of chunk c's C, B and x into buffer `buf` (rows past the sequence
  // and columns past N or D read as zeros), completing on `bar` with one arrival. N <= 64 takes
  // one column block of C and B; the second stays zero (set below).
  const int col_blocks = N > 64 ? 2 : 1;
  constexpr uint32_t kBox = kHalf * 128;
  const uint32_t half_bytes = (2 * col_blocks + 1) * kBox;
  auto issue = [&](int64_t c, int buf, int hf, uint32_t bar) {
    const int t0 = static_cast<int>(c * kQ) + kHalf * hf, g = static_cast<int>(grp),
              bi = static_cast<int>(b);
    const uint32_t row = hf * kBox;  // the half's first row within a column block
    cuda::mbar_expect_tx(bar, half_bytes);
    for (int cb = 0; cb < col_blocks; ++cb) {
      const uint32_t at = buf * S::kOp + cb * kQ * 128 + row;
      cuda::tma_load_4d(base + S::c + at, &tc, bar, 64 * cb, t0, g, bi);
      cuda::tma_load_4d(base + S::b + at, &tb, bar, 64 * cb, t0, g, bi);
    }
    cuda::tma_load_4d(base + S::x + buf * S::kX + row, &tx, bar, 0, t0, static_cast<int>(h), bi);
  };
  // Chunk c's scalars, formed by warp 0 (and warp 1 at chunk 256, for tokens 128-255: lane l of
  // scalar warp sw takes tokens 128 sw + 4 l .. + 3) into slot `sl`: cum (log2 units, inclusive),
  // lv = cum - log2 v (v = 0: +inf, a zero weight) and w = v 2^(cum_last - cum). Their dt arrives
  // a chunk earlier, unconverted, one value a register (a conversion or packing next to the load
  // waits for it: packed pairs cost chunk 128 25% on the H200, 0.289 -> 0.362 ms).
  constexpr int kScalarWarps = kQ / kHalf;
  const int sw = kScalarWarps == 1 ? 0 : warp;  // this warp's token block, on scalar warps
  const bool scalar_warp = kScalarWarps == 1 ? warp == 0 : warp < kScalarWarps;
  auto load_dt = [&](int64_t c, T(&raw)[4]) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int64_t t = c * kQ + kHalf * sw + 4 * lane + e;
      raw[e] = t < p.L ? p.dt.at(b, t, h) : from_float<T>(0.0f);
    }
  };
  auto form_scalars = [&](int64_t c, int sl, const T(&raw)[4]) {
    float v[4], within[4], run = 0.0f;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const bool in = c * kQ + kHalf * sw + 4 * lane + e < p.L;
      v[e] = in ? process_dt(to_float(raw[e]) + bias, p.softplus, p.dt_min, p.dt_max).v : 0.0f;
      run += v[e] * a2;
      within[e] = run;
    }
    float incl = run;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const float up = __shfl_up_sync(0xffffffffu, incl, o);
      if (lane >= o) incl += up;
    }
    float before = __shfl_up_sync(0xffffffffu, incl, 1), last = __shfl_sync(~0u, incl, 31);
    float offset = 0.0f;                // of this warp's block: the first block's total
    if constexpr (kScalarWarps == 2) {  // the two blocks' totals through shared memory
      float* tot = reinterpret_cast<float*>(gen + S::tot);
      if (lane == 0) tot[sw] = last;
      cuda::named_barrier_sync(3, 64);
      offset = sw == 1 ? tot[0] : 0.0f;
      last = tot[0] + tot[1];
    }
    float4 cu, l4, w4;
    float* cup = &cu.x;
    float* lp = &l4.x;
    float* wp = &w4.x;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      float cl = (lane > 0 ? before : 0.0f) + within[e];
      if constexpr (kScalarWarps == 2) cl += offset;
      cup[e] = cl;
      lp[e] = cl - log2_ftz(v[e]);
      wp[e] = v[e] * exp2_ftz(last - cl);
    }
    const int at = 32 * sw + lane;
    reinterpret_cast<float4*>(gen + S::cum + sl * 4 * kQ)[at] = cu;
    reinterpret_cast<float4*>(gen + S::lv + sl * 4 * kQ)[at] = l4;
    reinterpret_cast<float4*>(gen + S::w + sl * 4 * kQ)[at] = w4;
  };

  // The state: f32 in warpgroup wg's accumulators (rows d, columns n 64 wg ..), T in the [d][n]
  // tile for C . S^T.
  // A later segment takes the state its predecessor handed off (each thread its own
  // accumulators as float4s, a 4 KB run per j), bit for bit what the uncut walk carries.
  float st[32];
  auto st_n = [&](int j, int e) { return 64 * wg + 8 * j + cq + e % 2; };
  auto handoff_at = [&](int64_t sg, int j) {
    return reinterpret_cast<float4*>(p.handoff) +
           ((sg * p.B * p.H + walk) * 8 + j) * fwd_wg::kThreads + tid;
  };
  if (seg == 0) {
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int d = r_lo + 8 * (e / 2), n = st_n(j, e);
        st[4 * j + e] = p.has_init && d < D && n < N ? p.init.at(b, h, d, n) : 0.0f;
      }
  } else {
    cuda::await_block(p.ready + (seg - 1) * p.B * p.H + walk, 1u);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const float4 v = __ldcg(handoff_at(seg - 1, j));
      st[4 * j] = v.x, st[4 * j + 1] = v.y, st[4 * j + 2] = v.z, st[4 * j + 3] = v.w;
    }
  }
  auto store_state_t = [&] {
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int u = 0; u < 2; ++u) {
        const int d = r_lo + 8 * u, n = 64 * wg + 8 * j + cq;
        *reinterpret_cast<uint32_t*>(gen + S::s + swz(kD, d, n)) =
            cuda::pack2<T>(st[4 * j + 2 * u], st[4 * j + 2 * u + 1]);
      }
  };
  store_state_t();
  if (col_blocks == 1)  // the unused column blocks of C and B: zeros once
    for (int q = tid; q < 2 * S::kBufs * kQ * 128 / 16; q += fwd_wg::kThreads) {
      const int per = kQ * 128 / 16, tile = q / per, off = (q % per) * 16;
      const uint32_t at = (tile % 2 == 0 ? S::c : S::b) + (tile / 2) * S::kOp + kQ * 128 + off;
      *reinterpret_cast<uint4*>(gen + at) = make_uint4(0, 0, 0, 0);
    }
  if (tid < kD) {
    float* dsk = reinterpret_cast<float*>(gen + S::dsk);
    dsk[tid] = p.has_d && tid < D ? p.Dv.p[h * p.Dv.s0 + tid * p.Dv.s1] : 0.0f;
  }
  const uint32_t bar0 = base + S::bar, bar1 = base + S::bar + 8;
  if (tid == 0) {
    // Chunk 128: bar0 / bar1 complete buffer 0 / 1. Chunk 256: rows 0-127 / 128-255 of the one
    // buffer.
    cuda::mbar_init(bar0, 1);
    cuda::mbar_init(bar1, 1);
    cuda::mbar_init_fence();
  }
  cuda::fence_proxy_async();  // the state tile and the zeros, before wgmma reads them
  __syncthreads();
  auto issue_chunk = [&](int64_t c, int buf) {
    if constexpr (kQ == 128) {
      issue(c, buf, 0, base + S::bar + 8 * buf);
    } else {
      issue(c, 0, 0, bar0);
      issue(c, 0, 1, bar1);
    }
  };
  if (tid == 0 && c_lo < c_hi) issue_chunk(c_lo, 0);
  T dt_next[4];  // scalar warps: dt of the chunk after the one they form the scalars of next
  if (scalar_warp && c_lo < c_hi) {
    load_dt(c_lo, dt_next);
    form_scalars(c_lo, 0, dt_next);
    if (c_lo + 1 < c_hi) load_dt(c_lo + 1, dt_next);
  }
  __syncthreads();  // slot 0's scalars

  const float* dsk = reinterpret_cast<const float*>(gen + S::dsk);
  for (int64_t c = c_lo; c < c_hi; ++c) {
    const int phase = static_cast<int>((c - c_lo) & 1);
    const int buf = S::kBufs == 2 ? phase : 0;
    const int64_t t0 = c * kQ;
    const int K = static_cast<int>(p.L - t0 < kQ ? p.L - t0 : kQ);
    if constexpr (kQ == 128)
      if (tid == 0 && c + 1 < c_hi) issue_chunk(c + 1, buf ^ 1);  // that buffer's readers are done
    const int sl = phase;  // this chunk's scalars (formed during the previous chunk)
    const float* cum = reinterpret_cast<const float*>(gen + S::cum + sl * 4 * kQ);
    const float* lv = reinterpret_cast<const float*>(gen + S::lv + sl * 4 * kQ);
    const float* w3 = reinterpret_cast<const float*>(gen + S::w + sl * 4 * kQ);
    const uint32_t c_tile = base + S::c + buf * S::kOp, b_tile = base + S::b + buf * S::kOp,
                   x_tile = base + S::x + buf * S::kX;
    // chunk 128: this buffer's k-th use (two per chunk pair); chunk 256: this chunk's halves
    const uint32_t parity =
        kQ == 128 ? static_cast<uint32_t>((c - c_lo) >> 1) & 1u : static_cast<uint32_t>(phase);

    // The weights of rows [rh, rh + 128) (this warpgroup's 64 of them) against columns
    // [sh, sh + 128), from cb = C . B^T of those blocks: whole (sh < rh) or causal (sh == rh).
    // The warp's 16 rows meet the diagonal in column block kd: blocks before it are whole,
    // blocks after it zeros (no exponentials), only kd itself is masked.
    float cl_t[2];
    auto weights = [&](uint32_t(&wa)[8][4], const float(&cb)[64], int sh, bool causal) {
      const int kd = causal ? 4 * wg + wl : 8;
#pragma unroll
      for (int kk = 0; kk < 8; ++kk) {
        if (kk > kd) {
          wa[kk][0] = wa[kk][1] = wa[kk][2] = wa[kk][3] = 0u;
          continue;
        }
        const bool diag = kk == kd;
#pragma unroll
        for (int q = 0; q < 4; ++q) {  // q: (row half u = q % 2, column half q / 2)
          const int u = q % 2, s = 16 * kk + 8 * (q / 2) + cq, t = 64 * wg + r_lo + 8 * u;
          const float2 l2 = *reinterpret_cast<const float2*>(lv + sh + s);
          const int i = 8 * kk + 4 * (q / 2) + 2 * u;
          const float w0 = !diag || s <= t ? exp2_ftz(cl_t[u] - l2.x) * cb[i] : 0.0f;
          const float w1 = !diag || s + 1 <= t ? exp2_ftz(cl_t[u] - l2.y) * cb[i + 1] : 0.0f;
          wa[kk][q] = cuda::pack2<T>(w0, w1);
        }
      }
    };
    // y = C . S^T of rows [rh, rh + 128) scaled by 2^cum_t (after the C . S^T group's wait)
    auto scale_y = [&](float(&y)[32]) {
#pragma unroll
      for (int u = 0; u < 2; ++u) {
        const float es = exp2_ftz(cl_t[u]);
#pragma unroll
        for (int j = 0; j < 8; ++j) y[4 * j + 2 * u] *= es, y[4 * j + 2 * u + 1] *= es;
      }
    };
    // y + D x, times silu(z), of rows [rh, rh + 128) staged as this warpgroup's 64 x 64 swizzled
    // tile at `stage`, then stored by one tensor-map copy (it clips the rows past the sequence and
    // the columns past D).
    auto store_y = [&](const float(&y)[32], int rh, uint32_t stage) {
      // swz(64, r, 8 j + cq) for this thread's rows r = r_lo (+ 8): the 16-byte chunk index j XOR
      // r % 8 (= lane / 4) sits in bits 4-6, which the 1024-aligned stage, r * 128 and cq * 2
      // leave clear, so one base serves every (u, j) by an XOR and an offset (the per-(u, j)
      // addresses, hoisted, spilled at chunk 256).
      const uint32_t stage_row = stage + r_lo * 128 + ((lane / 4) << 4) + cq * 2;
      const uint32_t x_row = S::x + buf * S::kX + r_lo * 128 + ((lane / 4) << 4) + cq * 2;  // same
      if (!p.has_d && !p.has_z) {  // straight-line: no branches over the optional terms' code
#pragma unroll
        for (int u = 0; u < 2; ++u)
#pragma unroll
          for (int j = 0; j < 8; ++j)
            *reinterpret_cast<uint32_t*>(gen + ((stage_row ^ (j << 4)) + 1024 * u)) =
                cuda::pack2<T>(y[4 * j + 2 * u], y[4 * j + 2 * u + 1]);
      } else {
#pragma unroll
        for (int u = 0; u < 2; ++u) {
          const int tl = r_lo + 8 * u, t = rh + 64 * wg + tl;
          const int64_t tok = t0 + t;
          const T* zr = p.has_z && t < K ? p.z.p + b * p.z.s0 + tok * p.z.s1 + h * p.z.s2 : nullptr;
#pragma unroll
          for (int j = 0; j < 8; ++j) {
            const int d = 8 * j + cq;
            float o[2] = {y[4 * j + 2 * u], y[4 * j + 2 * u + 1]};
            if (p.has_d) {  // x from the chunk's shared tile
              const float2 xv = cuda::unpack2<T>(
                  *reinterpret_cast<const uint32_t*>(gen + (x_row ^ (j << 4)) + (t - r_lo) * 128));
              const float2 dv = *reinterpret_cast<const float2*>(dsk + d);
              o[0] += dv.x * xv.x;
              o[1] += dv.y * xv.y;
            }
            if (zr != nullptr && d < D) {  // D % 8 == 0: d + 1 < D too
#pragma unroll
              for (int e = 0; e < 2; ++e) {
                const float z = to_float(zr[(d + e) * p.z.s3]);
                o[e] *= __fdividef(z, 1.0f + __expf(-z));
              }
            }
            *reinterpret_cast<uint32_t*>(gen + ((stage_row ^ (j << 4)) + 1024 * u)) =
                cuda::pack2<T>(o[0], o[1]);
          }
        }
      }
      cuda::fence_proxy_async();
      cuda::named_barrier_sync(1 + wg, 128);
      if (tid % 128 == 0)
        cuda::tma_store_4d(&ty, base + stage, 0, static_cast<int>(t0) + rh + 64 * wg,
                           static_cast<int>(h), static_cast<int>(b));
    };
    // w o x of rows [sh, sh + 128) into the 128-row region at `to` (a 16-byte chunk of a swizzled
    // row stays in that row: no unswizzling)
    auto scale_x = [&](int sh, uint32_t to) {
#pragma unroll
      for (int q = tid; q < kHalf * kD / 8; q += fwd_wg::kThreads) {
        const uint32_t off = static_cast<uint32_t>(q) * 16;
        const uint4 v = *reinterpret_cast<const uint4*>(gen + S::x + buf * S::kX + sh * 128 + off);
        const float w = w3[sh + q / 8];
        auto scaled = [&](uint32_t e) {
          const float2 f = cuda::unpack2<T>(e);
          return cuda::pack2<T>(f.x * w, f.y * w);
        };
        *reinterpret_cast<uint4*>(gen + to + off) =
            make_uint4(scaled(v.x), scaled(v.y), scaled(v.z), scaled(v.w));
      }
      cuda::fence_proxy_async();
    };
    // S += Xw^T . B over rows [sh, sh + 128) (this warpgroup's 64 columns of n), one group
    auto update_state = [&](int sh, uint32_t xw) {
      wgmma_fence();
#pragma unroll
      for (int k = 0; k < kHalf; k += 16)
        Ops<T>::tt64(st, mn_major(base + xw, kHalf, 0, k), mn_major(b_tile, kQ, wg, sh + k), 1);
      wgmma_commit();
    };
    // ---- rows 0-127: CB = C . B^T (this warpgroup's 64 rows, columns 0-127) and Y = C . S^T
    // (two groups: the weights need only C . B^T, so C . S^T runs under their exponentials)
    cuda::mbar_wait(kQ == 128 ? base + S::bar + 8 * buf : bar0, parity);
    float cb[64], y[32];
    uint32_t wa[8][4];
    // C . B^T (columns 0-127) and C . S^T of rows [rh, rh + 128), over K = N rounded up to 64
    // (N <= 64: the zero half of the tiles is not multiplied)
    auto products = [&](int rh) {
      auto over = [&]<int kK>() {
        wgmma_fence();
#pragma unroll
        for (int k = 0; k < kK; k += 16)
          Ops<T>::ss128(cb, k_major(c_tile, kQ, rh + 64 * wg, k), k_major(b_tile, kQ, 0, k), k > 0);
        wgmma_commit();
#pragma unroll
        for (int k = 0; k < kK; k += 16)
          Ops<T>::ss64(y, k_major(c_tile, kQ, rh + 64 * wg, k), k_major(base + S::s, kD, 0, k),
                       k > 0);
        wgmma_commit();
      };
      if (N <= 64)
        over.template operator()<64>();
      else
        over.template operator()<kN>();
    };
    auto times_x = [&](int sh) {  // Y += W . X over the columns [sh, sh + 128), one group
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < 8; ++kk)
        Ops<T>::template rs<64>(y, wa[kk], mn_major(x_tile, kQ, 0, sh + 16 * kk));
      wgmma_commit();
    };
    // After products(rh): y of rows [rh, rh + 128) from C . S^T and the weights against columns
    // 0-127 (causal for rows 0-127, whole for rows 128-255) times x0. (Warpgroup 0's causal
    // weights past column 63 are zeros: the same eight steps in both warpgroups, since a wgmma
    // under a branch on the warpgroup is serialized by ptxas.)
    auto against_first_half = [&](int rh) {
#pragma unroll
      for (int u = 0; u < 2; ++u) cl_t[u] = cum[rh + 64 * wg + r_lo + 8 * u];
      cuda::wgmma_wait<1>();
      fence_regs(cb);
      weights(wa, cb, 0, rh == 0);
      wait_all();
      fence_regs(y);
      scale_y(y);
      times_x(0);
      wait_all();
      fence_regs(y);
    };
    products(0);
    if (scalar_warp && c + 1 < c_hi) {  // the next chunk's scalars, under the products
      form_scalars(c + 1, sl ^ 1, dt_next);
      if (c + 2 < c_hi) load_dt(c + 2, dt_next);
    }
    against_first_half(0);
    store_y(y, 0, kQ == 128 ? S::y + wg * (kHalf * kD) : S::xw + wg * (kHalf * kD));

    const float decay = exp2_ftz(cum[kQ - 1]);
    if constexpr (kQ == 128) {
      // ---- S = 2^cum_last S + Xw^T . B
      scale_x(0, S::xw);
      __syncthreads();  // Xw whole; every warpgroup done reading S (C . S^T) and x (W . X)
#pragma unroll
      for (int i = 0; i < 32; ++i) st[i] *= decay;
      update_state(0, S::xw);
      wait_all();
      fence_regs(st);
    } else {
      // ---- rows 128-255: the cross block C1 . B0^T (whole weights against x0), C . S^T, then
      // rows 0-127's share of the update (Xw0 in the second region), then C1 . B1^T (causal
      // weights against x1), then the update's second half.
      cuda::mbar_wait(bar1, parity);
      products(kHalf);
      against_first_half(kHalf);
      scale_x(0, S::xw + kHalf * kD * 2);
      __syncthreads();  // Xw0 whole
#pragma unroll
      for (int i = 0; i < 32; ++i) st[i] *= decay;
      update_state(0, S::xw + kHalf * kD * 2);
      auto diagonal = [&]<int kK>() {  // C1 . B1^T, over K = N rounded up to 64
        wgmma_fence();
#pragma unroll
        for (int k = 0; k < kK; k += 16)
          Ops<T>::ss128(cb, k_major(c_tile, kQ, kHalf + 64 * wg, k), k_major(b_tile, kQ, kHalf, k),
                        k > 0);
        wgmma_commit();
      };
      if (N <= 64)
        diagonal.template operator()<64>();
      else
        diagonal.template operator()<kN>();
      wait_all();
      fence_regs(cb);
      fence_regs(st);
      weights(wa, cb, kHalf, true);
      times_x(kHalf);
      wait_all();
      fence_regs(y);
      if (tid % 128 == 0) cuda::bulk_wait<0, true>();  // rows 0-127's store read its tile
      cuda::named_barrier_sync(1 + wg, 128);
      store_y(y, kHalf, S::xw + wg * (kHalf * kD));
      __syncthreads();  // every warpgroup done with Xw0 (the update's first half), x0, B0, C
      if (tid == 0 && c + 1 < c_hi) issue(c + 1, 0, 0, bar0);
      scale_x(kHalf, S::xw + kHalf * kD * 2);
      __syncthreads();  // Xw1 whole
      update_state(kHalf, S::xw + kHalf * kD * 2);
      wait_all();
      fence_regs(st);
    }
    store_state_t();
    cuda::fence_proxy_async();
    if (tid % 128 == 0) cuda::bulk_wait<0, true>();  // the y store has read its staged tile
    __syncthreads();  // the new state tile visible; this chunk's buffers and staged y free
    if constexpr (kQ == 256)
      if (tid == 0 && c + 1 < c_hi) issue(c + 1, 0, 1, bar1);
  }
  if (tid % 128 == 0) cuda::bulk_wait<0, false>();  // the last y store done with shared memory
  if (seg + 1 < p.segments) {                       // hand the state to the next segment
#pragma unroll
    for (int j = 0; j < 8; ++j)
      __stcg(handoff_at(seg, j),
             make_float4(st[4 * j], st[4 * j + 1], st[4 * j + 2], st[4 * j + 3]));
    cuda::publish_block(p.ready + seg * p.B * p.H + walk, 1u);
    return;
  }
  if (p.has_fin)
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int d = r_lo + 8 * (e / 2), n = st_n(j, e);
        if (d < D && n < N) p.fin.at(b, h, d, n) = st[4 * j + e];
      }
#endif
}

// Host side. x, B, C and y go by tensor maps over their [B, H or G, L, D or N] views (the
// sequence axis as the box's rows).
inline ConstTensor sequence_rows(ConstTensor t) {
  std::swap(t.shape[1], t.shape[2]);
  std::swap(t.stride[1], t.stride[2]);
  return t;
}
template <class T>
Status wgmma_fwd_check(const ssd::Problem&, const SsdForwardOp::Arguments& a) {
  constexpr std::string_view who = "ssd_forward: fused_wgmma_sm90a";
  BARACUDA_TRY(cuda::check_tma_rows(who, "x", sequence_rows(a.x)));
  BARACUDA_TRY(cuda::check_tma_rows(who, "B", sequence_rows(a.B)));
  BARACUDA_TRY(cuda::check_tma_rows(who, "C", sequence_rows(a.C)));
  return cuda::check_tma_rows(who, "y", sequence_rows(as_const(a.y)));
}
// Where this build holds the kernel's sm_90a body (an sm_80-only build compiles it empty).
template <class T>
bool wgmma_fwd_body() {
  const auto a =
      cuda::func_attributes(reinterpret_cast<const void*>(ssd_fused_wgmma_kernel<T, 128>));
  return a && a->binaryVersion >= 90;
}
// The shapes of the walks on wgmma (this forward and the backward's, backward_walks.cuh): sm_90,
// chunk 128 or 256, head_dim <= 64 and state_dim <= 128 (multiples of 8), L > 0 (a tensor map has
// no empty axes; L = 0 takes the other kernels: S_out = S_in) within TMA's 32-bit coordinates,
// `smem` bytes of shared memory and the driver's tensor-map encoder.
inline bool wgmma_walk_fits(const ssd::Problem& p, const DeviceCaps& caps, uint32_t smem) {
  return caps.sm >= 90 && (p.chunk_size == 128 || p.chunk_size == 256) && p.head_dim <= 64 &&
         p.state_dim <= 128 && p.head_dim % 8 == 0 && p.state_dim % 8 == 0 && p.seqlen > 0 &&
         p.seqlen + p.chunk_size <= (int64_t{1} << 31) - 1 &&
         static_cast<int64_t>(smem) <= caps.smem_per_block_optin &&
         cuda::tensor_map_encode_fn() != nullptr;
}
template <class T>
bool wgmma_fwd_fits(const ssd::Problem& p, const DeviceCaps& caps) {
  const uint32_t smem =
      p.chunk_size == 128 ? fwd_wg::Smem<128>::request : fwd_wg::Smem<256>::request;
  static_assert(fwd_wg::kD == fused::kD && fwd_wg::kN == 128);  // fused_walk_fits' limits
  return wgmma_walk_fits(p, caps, smem) && fused_walk_fits(p) && wgmma_fwd_body<T>();
}
// The default where every SM gets a walk (below that the chunk-parallel forward wins: a walk's
// time is its chunk count times a chunk's latency, as fused_mma's).
template <class T>
bool wgmma_ranked_ahead_fits(const ssd::Problem& p, const DeviceCaps& caps) {
  return wgmma_fwd_fits<T>(p, caps) && p.batch * p.heads >= caps.sm_count;
}
// The walks cut as fused_mma's are (one block per SM here too: the chunk's shared tiles), with the
// same workspace layout (fused_layout: a 64 x 128 f32 state per hand-off).
template <class T, FusedCut kCut>
Status forward_wgmma(const LaunchContext& ctx, const ssd::Problem& pr,
                     const SsdForwardOp::Arguments& a) {
  Fwd<T> p = forward_params<T>(pr, a);
  if (pr.batch * pr.heads == 0) return {};
  const cudaStream_t st = cuda::stream_of(ctx);
  StageClock clock("ssd_forward", "fused_wgmma_sm90a", st);
  BARACUDA_TRY(cut_walks<kCut>(p, ctx, pr, "cudaMemsetAsync (fused_wgmma's segment flags)"));
  constexpr CUtensorMapDataType dt = cuda::tensor_map_dtype<T>();
  constexpr std::string_view who = "ssd_forward: fused_wgmma_sm90a";
  CUtensorMap tc, tb, tx;
  BARACUDA_TRY(cuda::make_rows_map(who, &tc, dt, sequence_rows(a.C), fwd_wg::kHalf));
  BARACUDA_TRY(cuda::make_rows_map(who, &tb, dt, sequence_rows(a.B), fwd_wg::kHalf));
  BARACUDA_TRY(cuda::make_rows_map(who, &tx, dt, sequence_rows(a.x), fwd_wg::kHalf));
  CUtensorMap ty;
  BARACUDA_TRY(cuda::make_rows_map(who, &ty, dt, sequence_rows(as_const(a.y)), fwd_wg::kHalf / 2));
  const dim3 grid = p.segments > 1
                        ? dim3(static_cast<unsigned>(p.segments * pr.batch * pr.heads))
                        : dim3(static_cast<unsigned>(pr.heads), static_cast<unsigned>(pr.batch));
  auto launch = [&]<int kQ>() {
    return cuda::launch_with_smem("ssd_forward", "ssd_fused_wgmma_kernel",
                                  ssd_fused_wgmma_kernel<T, kQ>, grid, fwd_wg::kThreads,
                                  fwd_wg::Smem<kQ>::request, st, tc, tb, tx, ty, p);
  };
  BARACUDA_TRY(pr.chunk_size == 128 ? launch.template operator()<128>()
                                    : launch.template operator()<256>());
  clock.mark("fused");
  return {};
}

}  // namespace baracuda::ssd_cuda
