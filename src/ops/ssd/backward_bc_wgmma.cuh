// bwd_db_mma_kernel and bwd_dc_mma_kernel on wgmma (chunked_mma_walks_sm90a, stages "db_wg" and
// "dc_wg"): the same blocks (chunk, 64 rows r of the chunk, b, hb heads of one group: partial
// slot (h0 % hpg) / hb), partials and order of terms, on one warpgroup. Per head, A = w_r a_r
// (the head's 64 x D tile by tensor map, read by ldmatrix, scaled and rounded to T in registers as
// the mma.sync kernels round it) times the head's state (16-bit [d][n], MN-major, by tensor map)
// into one m64n(64 or 128) accumulator; then the first slot's blocks add the group's dCB part.
//   dC (rows t): a = dy, w = exp(cum_t), state S0 (st16); after each head its pst (the row dots
//     with C, held in registers, less the previous head's); then sum_{s <= t} dCB_ts B_s.
//   dB (rows s): a = x, w = v_s exp(cum_last - cum_s), state Gc (gst16); then
//     sum_{t >= s} dCB_ts C_t.
// dCB's f32 rows reach the A registers straight from L2, rounded to T; B / C rows by tensor map.
// Stages stream through four slots (two blocks an SM); every head's w is formed once per block.
// dC 0.395 -> 0.158 ms at B4 L4096 H80 D64 N128 (H200). Shape: the walks' (D <= 64, N <= 128,
// multiples of 8, chunk 128 or 256); dC without z (dy' = dy).
#pragma once

#include "ops/ssd/backward_dx_wgmma.cuh"  // dense_view4
#include "ops/ssd/forward_wgmma.cuh"      // its tile descriptors (fwd_wg)

namespace baracuda::ssd_cuda {

namespace bc_wg {
using fwd_wg::kTileBytes;
constexpr int kThreads = 128, kSlots = 4, kMaxHeads = 8;
template <int kNB>  // 64-column blocks of n: 1 (N <= 64) or 2
struct Smem {
  static constexpr uint32_t slot = (1 + kNB) * kTileBytes;  // the a tile, then kNB of state / rows
  static constexpr uint32_t w = kSlots * slot;              // w_r: [head][64 rows], f32
  static constexpr uint32_t bar = w + kMaxHeads * 64 * 4;
  static constexpr uint32_t total = bar + kSlots * 8;
  static constexpr uint32_t request = total + 1024;
};
}  // namespace bc_wg

// a: dy's or x's [B, H, L, D] view; st: st16 or gst16 as [1, B*H*nchunks, D, N]; rows: B's or
// C's [B, G, L, N] view.
struct BcWgMaps {
  CUtensorMap a, st, rows;
};

template <class T, bool kDB, int kNB>
__global__ void __launch_bounds__(bc_wg::kThreads, 2)
    bwd_bc_wg_kernel(const __grid_constant__ BcWgMaps maps, BwdC<T> p) {
#if BARACUDA_SSD_WGMMA_DEVICE
  using namespace fwd_wg;
  using W = bc_wg::Smem<kNB>;
  using bc_wg::kSlots;
  constexpr int kCols = 64 * kNB;
  const cuda::AlignedSmem sm = cuda::dynamic_smem_1024();
  const uint32_t base = sm.addr;

  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, g = lane / 4, q4 = lane % 4;
  const db_mma::GroupTile<T> gt(p, 0);
  const int64_t c = gt.c, b = gt.b, h0 = gt.h0, grp = gt.grp, tb = gt.tb, BH = p.B * p.H;
  const int t_lo = gt.lo, K = gt.K, cs = static_cast<int>(p.cs), N32 = static_cast<int>(p.N);
  if (t_lo >= K) return;  // uniform over the block
  const int hb = static_cast<int>(p.hb);
  // heads, then the group's tiles: dC s tiles s0 <= t_lo, dB t tiles from s_lo (= t_lo) to K
  const int n_group = gt.slot != 0 ? 0 : kDB ? (K - t_lo + 63) / 64 : t_lo / 64 + 1;
  const int total = hb + n_group;
  auto group_row0 = [&](int i) { return kDB ? t_lo + 64 * (i - hb) : 64 * (i - hb); };
  auto slot_at = [&](int i) { return base + (i % kSlots) * W::slot; };
  auto bar_at = [&](int i) { return base + W::bar + 8 * (i % kSlots); };
  auto issue = [&](int i) {
    const uint32_t dst = slot_at(i), bar = bar_at(i);
    if (i < hb) {
      const int64_t h = h0 + i;
      cuda::mbar_expect_tx(bar, (1 + kNB) * kTileBytes);
      cuda::tma_load_4d(dst, &maps.a, bar, 0, static_cast<int>(tb + t_lo), static_cast<int>(h),
                        static_cast<int>(b));
      for (int nb = 0; nb < kNB; ++nb)
        cuda::tma_load_4d(dst + (1 + nb) * kTileBytes, &maps.st, bar, 64 * nb, 0,
                          static_cast<int>((b * p.H + h) * p.nchunks + c), 0);
    } else {
      cuda::mbar_expect_tx(bar, kNB * kTileBytes);
      for (int nb = 0; nb < kNB; ++nb)
        cuda::tma_load_4d(dst + (1 + nb) * kTileBytes, &maps.rows, bar, 64 * nb,
                          static_cast<int>(tb + group_row0(i)), static_cast<int>(grp),
                          static_cast<int>(b));
    }
  };
  start_ring(base + W::bar, kSlots, total, issue);
  // Every head's row weights while the first stages are in flight.
  float* wsm = sm.at<float>(W::w);
  for (int k = tid; k < hb * 64; k += bc_wg::kThreads) {
    const int hi = k / 64, r = t_lo + k % 64;
    const int64_t ob = (b * p.H + h0 + hi) * p.Lpad + tb;
    float w = 0.0f;
    if (r < K)
      w = kDB ? p.dtp[ob + r] * expf(static_cast<float>(p.cum[ob + cs - 1] - p.cum[ob + r]))
              : expf(static_cast<float>(p.cum[ob + r]));
    wsm[k] = w;
  }
  // dC: C at this thread's accumulator positions (rows trow[e], columns 8 j + 2 q4, +1; zero
  // outside), for the heads' pst.
  const int trow[2] = {t_lo + 16 * warp + g, t_lo + 16 * warp + g + 8};
  uint32_t cfrag[2][kDB ? 1 : 8 * kNB];
#pragma unroll
  for (int e = 0; e < 2 && !kDB; ++e) {
    const bool in = trow[e] < K;
    const T* crow = &p.Cm.at(b, tb + (in ? trow[e] : 0), grp, 0) + 2 * q4;  // unit inner stride
#pragma unroll
    for (int j = 0; j < 8 * kNB; ++j)
      cfrag[e][j] =
          in && 8 * j < N32 ? __ldg(reinterpret_cast<const unsigned int*>(crow + 8 * j)) : 0u;
  }
  __syncthreads();

  float acc[32 * kNB];
#pragma unroll
  for (int e = 0; e < 32 * kNB; ++e) acc[e] = 0.0f;
  float dot_before[2][kNB] = {};
  const int lm = lane / 8, lr = lane % 8;  // ldmatrix: matrix lm's row lr
  for (int i = 0; i < total; ++i) {
    const uint32_t slot = slot_at(i);
    uint32_t a[4][4];
    if (i >= hb) {  // dCB (zero unless s <= t < K), rounded to T, before the wait
      const int k0 = group_row0(i);
#pragma unroll
      for (int kk = 0; kk < 4; ++kk)
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          const int row = trow[r % 2], col = k0 + 16 * kk + 2 * q4 + 8 * (r / 2);
          float v[2];
#pragma unroll
          for (int u = 0; u < 2; ++u) {  // dC: (t, s) = (row, col); dB: (col, row)
            const int t = kDB ? col + u : row, s = kDB ? row : col + u;
            v[u] = t < K && s <= t ? gt.dcbt[t * cs + s] : 0.0f;
          }
          a[kk][r] = cuda::pack2<T>(v[0], v[1]);
        }
    }
    cuda::mbar_wait(bar_at(i), static_cast<uint32_t>(i / kSlots) & 1u);
    if (i < hb) {  // A = w_r a_r, scaled in registers
      const float w0 = wsm[i * 64 + 16 * warp + g], w1 = wsm[i * 64 + 16 * warp + g + 8];
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        const int row = 16 * warp + lr + 8 * (lm % 2), chunk = 2 * kk + lm / 2;
        cuda::ldmatrix_x4(slot + row * 128 + ((chunk ^ (row % 8)) * 16), a[kk][0], a[kk][1],
                          a[kk][2], a[kk][3]);
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          const float2 v = cuda::unpack2<T>(a[kk][r]);
          const float w = r % 2 == 0 ? w0 : w1;
          a[kk][r] = cuda::pack2<T>(w * v.x, w * v.y);
        }
      }
    }
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)
      Ops<T>::template rs<kCols>(acc, a[kk], mn_major(slot + kTileBytes, 64, 0, 16 * kk));
    wgmma_commit();
    wait_all();
    fence_regs(acc);
    __syncthreads();  // every warp done with the slot
    if (tid == 0 && i + kSlots < total) issue(i + kSlots);
    if (!kDB &&
        i < hb) {  // head i's pst per 64-column tile: the running row dots less the previous ones
      const int64_t bh = b * p.H + h0 + i;
#pragma unroll
      for (int e = 0; e < 2; ++e)
#pragma unroll
        for (int nb = 0; nb < kNB; ++nb) {
          float dot = 0.0f;
#pragma unroll
          for (int j = 8 * nb; j < 8 * nb + 8; ++j) {
            const float2 cv = cuda::unpack2<T>(cfrag[e][j]);
            dot = fmaf(cv.x, acc[4 * j + 2 * e], dot);
            dot = fmaf(cv.y, acc[4 * j + 2 * e + 1], dot);
          }
          dot += __shfl_xor_sync(0xffffffffu, dot, 1);
          dot += __shfl_xor_sync(0xffffffffu, dot, 2);
          if (q4 == 0 && trow[e] < K && 64 * nb < N32)
            p.pst[(nb * BH + bh) * p.Lpad + tb + trow[e]] = dot - dot_before[e][nb];
          dot_before[e][nb] = dot;
        }
    }
  }
  float* out = gt.slot_rows(kDB ? p.pdB : p.pdC, p);
#pragma unroll
  for (int e = 0; e < 2; ++e) {
    if (trow[e] >= K) continue;
    float* row = out + trow[e] * p.H * p.N + 2 * q4;
#pragma unroll
    for (int j = 0; j < 8 * kNB; ++j)
      if (8 * j < N32)
        *reinterpret_cast<float2*>(row + 8 * j) =
            make_float2(acc[4 * j + 2 * e], acc[4 * j + 2 * e + 1]);
  }
#endif
}

// Where dB / dC run on wgmma: the walks' shapes (checked by their entry), at most kMaxHeads heads
// a block, views the tensor maps take (x and C for dB, dy and B for dC), C rows of unit stride (dC:
// its registers), and for dC dy' = dy (no z).
template <class T, bool kDB>
bool bc_wg_ok(const BwdC<T>& p, const SsdBackwardOp::Arguments& a) {
  constexpr std::string_view who = kDB ? "ssd_backward: db_wg" : "ssd_backward: dc_wg";
  return (kDB || !p.has_z) && (kDB ? p.gst16 : p.st16) != nullptr && p.hb <= bc_wg::kMaxHeads &&
         p.D <= 64 && p.N <= 128 && (kDB || rows16(p.Cm)) &&
         cuda::check_tma_rows(who, kDB ? "x" : "dy", sequence_rows(kDB ? a.x : a.dy)).ok() &&
         cuda::check_tma_rows(who, kDB ? "C" : "B", sequence_rows(kDB ? a.C : a.B)).ok();
}

template <class T, bool kDB>
Status launch_bc_wg(const BwdC<T>& p, const SsdBackwardOp::Arguments& a, dim3 grid,
                    cudaStream_t st) {
  constexpr std::string_view who = kDB ? "ssd_backward: db_wg" : "ssd_backward: dc_wg";
  constexpr CUtensorMapDataType dt = cuda::tensor_map_dtype<T>();
  BcWgMaps maps;
  BARACUDA_TRY(cuda::make_rows_map(who, &maps.a, dt, sequence_rows(kDB ? a.x : a.dy), 64));
  BARACUDA_TRY(cuda::make_rows_map(
      who, &maps.st, dt, dense_view4<T>(kDB ? p.gst16 : p.st16, 1, p.B * p.H * p.nchunks, p.D, p.N),
      64));
  BARACUDA_TRY(cuda::make_rows_map(who, &maps.rows, dt, sequence_rows(kDB ? a.C : a.B), 64));
  if (p.N <= 64)
    return cuda::launch_with_smem("ssd_backward", "bwd_bc_wg_kernel", bwd_bc_wg_kernel<T, kDB, 1>,
                                  grid, bc_wg::kThreads, bc_wg::Smem<1>::request, st, maps, p);
  return cuda::launch_with_smem("ssd_backward", "bwd_bc_wg_kernel", bwd_bc_wg_kernel<T, kDB, 2>,
                                grid, bc_wg::kThreads, bc_wg::Smem<2>::request, st, maps, p);
}

}  // namespace baracuda::ssd_cuda
