// bwd_dx_hn_kernel's products on wgmma with two heads a product (chunked_mma_walks_sm90a, stage
// "dx_wg"; 0.313 ms against dx_hn's 0.433 at B4 L4096 H80 D64 N128, H200). The same block grid and
// outputs as bwd_dx_hn_kernel (chunk and 64-row s tile, hb heads of one group; dx, the pdv / pE
// partials, the mask of heads left to bwd_dx_mma_kernel<.., kRest>), and the same decomposition,
//   dx_s = v_s es_s (B_s . Gc^T + sum_{t >= s} CB_ts dyh_t) + D dy'_s,
// but a head pair's columns side by side in one m64n128 accumulator: dyh is [B][L][H][D], so the
// dyh rows of two consecutive heads are one MN-major operand of 128 columns (one 64-column block a
// head), and their Gc tiles ([d][n] each) stacked are one K-major [(h, d)][n] operand. Per pair:
// ceil(N / 64) stages of B_s . Gc^T (ss: A = the block's B_s tile, K-major), then one stage per
// 64-token t tile t >= s_lo of CB^T . dyh (rs: A from bwd_cbt16_kernel's [s][t] tile by ldmatrix).
// The block's A tiles arrive once by tensor maps; the pair stages (16 KB: two heads' tiles) stream
// through three slots. Each head's scalars (dx_hn's factor-range test, the rows' es and v) are
// formed once per block, up front. Shape: D <= 64, N <= 128 (multiples of 8), chunk 128 or 256,
// hb even. dx matches dx_hn's to rounding (another summation order), deterministic.
#pragma once

#include <array>

#include "ops/ssd/forward_wgmma.cuh"  // its tile descriptors (fwd_wg)

namespace baracuda::ssd_cuda {

namespace dx_wg {
using fwd_wg::kTileBytes;
constexpr int kThreads = 128, kSlots = 3, kMaxHeads = 8;
struct Smem {
  static constexpr uint32_t bs = 0;                                // B_s: up to two k blocks
  static constexpr uint32_t cbt = bs + 2 * kTileBytes;             // CB^T: up to four t tiles
  static constexpr uint32_t ring = cbt + 4 * kTileBytes;           // kSlots stages, two tiles each
  static constexpr uint32_t fac = ring + kSlots * 2 * kTileBytes;  // (es, v): [head][64 rows]
  static constexpr uint32_t mask = fac + kMaxHeads * 64 * 8;       // heads left to dx_mma
  static constexpr uint32_t bar = mask + 8;                        // A tiles, then one a slot
  static constexpr uint32_t total = bar + (1 + kSlots) * 8;
  static constexpr uint32_t request = total + 1024;
};
}  // namespace dx_wg

// The kernel's operands by tensor map (one kernel parameter, so its address is in the parameter
// space TMA reads): B's [B, G, L, N] view; cbt16 as [1, B*G*nchunks, cs (s), cs (t)]; gst16 as
// [1, B*H*nchunks, D, N]; dyh's [B, H, L, D] view.
struct DxWgMaps {
  CUtensorMap b, cbt, gc, dyh;
};
template <class T, bool kZ>
__global__ void __launch_bounds__(dx_wg::kThreads, 2)
    bwd_dx_wg_kernel(const __grid_constant__ DxWgMaps maps, BwdC<T> p) {
#if BARACUDA_SSD_WGMMA_DEVICE
  using namespace fwd_wg;
  using W = dx_wg::Smem;
  using dx_wg::kSlots;
  const cuda::AlignedSmem sm = cuda::dynamic_smem_1024();
  const uint32_t base = sm.addr;

  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, g = lane / 4, q4 = lane % 4;
  const DxBlock<T> blk(p);
  const int64_t c = blk.c, s_lo = blk.s_lo, b = blk.b, h0 = blk.h0;
  const int64_t grp = blk.grp, K = blk.K, tb = blk.tb;
  int* flag = p.dx_rest + blk.flat;
  if (s_lo >= K) {  // uniform over the block
    if (tid == 0) *flag = 0;
    return;
  }
  const int K32 = static_cast<int>(K), s_lo32 = static_cast<int>(s_lo), cs = static_cast<int>(p.cs);
  const int D32 = static_cast<int>(p.D);
  const int nb = static_cast<int>((p.N + 63) / 64);  // Gc stages (k blocks of n)
  const int nt = (K32 - s_lo32 + 63) / 64;           // t tiles t0 >= s_lo
  const int S = nb + nt, pairs = static_cast<int>(p.hb / 2), total = pairs * S;
  const uint32_t bar_a = base + W::bar;
  auto slot_bar = [&](int i) { return base + W::bar + 8 * (1 + i % kSlots); };

  // Stage i (pair i / S, stage j = i % S): two heads' Gc tiles (k block j) or dyh tiles (t tile
  // j - nb), side by side.
  auto issue = [&](int i) {
    const int pi = i / S, j = i % S;
    const uint32_t dst = base + W::ring + (i % kSlots) * 2 * kTileBytes, bar = slot_bar(i);
    cuda::mbar_expect_tx(bar, 2 * kTileBytes);
    for (int hh = 0; hh < 2; ++hh) {
      const int64_t h = h0 + 2 * pi + hh;
      if (j < nb)
        cuda::tma_load_4d(dst + hh * kTileBytes, &maps.gc, bar, 64 * j, 0,
                          static_cast<int>((b * p.H + h) * p.nchunks + c), 0);
      else
        cuda::tma_load_4d(dst + hh * kTileBytes, &maps.dyh, bar, 0,
                          static_cast<int>(tb + s_lo + 64 * (j - nb)), static_cast<int>(h),
                          static_cast<int>(b));
    }
  };
  if (tid == 0) {
    *sm.at<int>(W::mask) = 0;
    cuda::mbar_init(bar_a, 1);
    for (int s = 0; s < kSlots; ++s) cuda::mbar_init(base + W::bar + 8 * (1 + s), 1);
    cuda::mbar_init_fence();
  }
  __syncthreads();
  if (tid == 0) {
    cuda::mbar_expect_tx(bar_a, (nb + nt) * kTileBytes);
    for (int kb = 0; kb < nb; ++kb)
      cuda::tma_load_4d(base + W::bs + kb * kTileBytes, &maps.b, bar_a, 64 * kb,
                        static_cast<int>(tb + s_lo), static_cast<int>(grp), static_cast<int>(b));
    const int slab = static_cast<int>((b * blk.G + grp) * p.nchunks + c);
    for (int q = 0; q < nt; ++q)
      cuda::tma_load_4d(base + W::cbt + q * kTileBytes, &maps.cbt, bar_a, s_lo32 + 64 * q, s_lo32,
                        slab, 0);
    for (int i = 0; i < kSlots && i < total; ++i) issue(i);
  }

  // Every head's scalars at once, while the A tiles and the first stages are in flight: which
  // heads exceed dx_hn's factor range (left to dx_mma) and the rows' (es, v). Per head and pair
  // these were two dependent rounds of f64 loads and a block barrier each (40% of the samples).
  const int hb = static_cast<int>(p.hb);
  auto head_row = [&](int hi) { return (b * p.H + h0 + hi) * p.Lpad + tb; };
  {
    constexpr int kPer = dx_wg::kMaxHeads * 256 / dx_wg::kThreads;
    const int cs_log2 = cs == 256 ? 8 : 7;  // chunks of 128 or 256 (the walks' entry)
    double cum_t[kPer];
#pragma unroll
    for (int u = 0; u < kPer; ++u) {
      const int k = tid + dx_wg::kThreads * u, hi = k >> cs_log2, t = k & (cs - 1);
      cum_t[u] = hi < hb && t < K32 ? p.cum[head_row(hi) + t] : 0.0;
    }
    uint32_t wide = 0;
#pragma unroll
    for (int u = 0; u < kPer; ++u) {
      const int k = tid + dx_wg::kThreads * u, hi = k >> cs_log2, t = k & (cs - 1);
      if (hi >= hb || t >= K32) continue;
      const double last = p.cum[head_row(hi) + cs - 1];  // = cum[K - 1] up to rounding
      const float e = static_cast<float>((cum_t[u] - last) * fwd_mma::kLog2e);
      if (!(fabsf(e) <= fwd_mma::kFactorSafe<T>)) wide |= 1u << hi;
    }
    wide = __reduce_or_sync(0xffffffffu, wide);
    if (lane == 0 && wide != 0) atomicOr(sm.at<unsigned>(W::mask), wide);
    float2* fac = sm.at<float2>(W::fac);
    for (int k = tid; k < hb * 64; k += dx_wg::kThreads) {
      const int hi = k / 64, s = s_lo32 + k % 64;
      const int64_t ob = head_row(hi);
      const bool in = s < K32;
      fac[k] = in ? make_float2(expf(static_cast<float>(p.cum[ob + cs - 1] - p.cum[ob + s])),
                                p.dtp[ob + s])
                  : make_float2(0.0f, 0.0f);
    }
  }
  __syncthreads();
  const int left_heads = *sm.at<const int>(W::mask);
  const float2* fac = sm.at<const float2>(W::fac);

  // This thread's accumulator rows s = srow[e] and columns (head hh = j / 8, d = 8 (j % 8) + 2 q4).
  const int srow[2] = {s_lo32 + 16 * warp + g, s_lo32 + 16 * warp + g + 8};
  float acc[64];
  uint32_t xr[2][2][8];  // x at the accumulator positions of both heads, as T pairs
  float xdot2[2][2];
  auto row_dots = [&](float(&out)[2][2]) {
#pragma unroll
    for (int hh = 0; hh < 2; ++hh)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        float part = 0.0f;
#pragma unroll
        for (int j8 = 0; j8 < 8; ++j8) {
          const float2 xf = cuda::unpack2<T>(xr[hh][e][j8]);
          part = fmaf(xf.x, acc[4 * (8 * hh + j8) + 2 * e], part);
          part = fmaf(xf.y, acc[4 * (8 * hh + j8) + 2 * e + 1], part);
        }
        part += __shfl_xor_sync(0xffffffffu, part, 1);
        part += __shfl_xor_sync(0xffffffffu, part, 2);
        out[hh][e] = part;
      }
  };
  const int lm = lane / 8, lr = lane % 8;  // ldmatrix: matrix lm's row lr
  cuda::mbar_wait(bar_a, 0);
  int i = 0;
  for (int pi = 0; pi < pairs; ++pi) {
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const int64_t h = h0 + 2 * pi + hh;
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const bool in = srow[e] < K32;
        const T* xrow = &p.x.at(b, tb + (in ? srow[e] : 0), h, 0) + 2 * q4;  // unit inner stride
#pragma unroll
        for (int j8 = 0; j8 < 8; ++j8)
          xr[hh][e][j8] =
              in && 8 * j8 < D32 ? __ldg(reinterpret_cast<const unsigned int*>(xrow + 8 * j8)) : 0u;
      }
    }
#pragma unroll
    for (int e = 0; e < 64; ++e) acc[e] = 0.0f;
    for (int j = 0; j < S; ++j, ++i) {
      const uint32_t slot = base + W::ring + (i % kSlots) * 2 * kTileBytes;
      cuda::mbar_wait(slot_bar(i), static_cast<uint32_t>(i / kSlots) & 1u);
      if (j < nb) {  // acc += B_s . Gc^T over n in [64 j, 64 j + 64)
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < 64; kk += 16)
          Ops<T>::ss128(acc, k_major(base + W::bs + j * kTileBytes, 64, 0, kk),
                        k_major(slot, 128, 0, kk), 1);
        wgmma_commit();
        wait_all();
        fence_regs(acc);
        if (j == nb - 1) row_dots(xdot2);  // x_s . (B_s Gc^T): E_s's part
      } else {                             // acc += CB^T . dyh over t tile j - nb
        const uint32_t cb_tile = base + W::cbt + (j - nb) * kTileBytes;
        uint32_t a[4][4];
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) {
          const int row = 16 * warp + lr + 8 * (lm % 2), chunk = 2 * kk + lm / 2;
          cuda::ldmatrix_x4(cb_tile + row * 128 + ((chunk ^ (row % 8)) * 16), a[kk][0], a[kk][1],
                            a[kk][2], a[kk][3]);
        }
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < 4; ++kk)
          Ops<T>::template rs<128>(acc, a[kk], mn_major(slot, 64, 0, 16 * kk));
        wgmma_commit();
        wait_all();
        fence_regs(acc);
      }
      __syncthreads();  // every warp done with the slot
      if (tid == 0 && i + kSlots < total) issue(i + kSlots);
    }
    // The pair's epilogue: dx = v es acc + D dy', and the per-token partials of both heads. Row
    // pointers once (the views have unit inner strides: dx_mma_fits), pairs of d per access.
    float rows[2][2];
    row_dots(rows);
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const int hi = 2 * pi + hh;
      if (left_heads & (1 << hi)) continue;  // left to bwd_dx_mma_kernel<.., kRest>
      const int64_t h = h0 + hi, bh = b * p.H + h;
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int s = srow[e];
        if (s >= K32) continue;
        const float2 ev = fac[hi * 64 + s - s_lo32];
        const float f = ev.x * ev.y;
        const int64_t t = tb + s;
        T* dxr = &p.dx.at(b, t, h, 0) + 2 * q4;
        if (p.has_d) {
          const float* dyz = nullptr;
          const T* dyr = nullptr;
          if constexpr (kZ)
            dyz = p.dyp + ((b * p.L + t) * p.H + h) * p.D + 2 * q4;
          else
            dyr = &p.dy.at(b, t, h, 0) + 2 * q4;
#pragma unroll
          for (int j8 = 0; j8 < 8; ++j8) {
            const int d = 8 * j8 + 2 * q4;
            if (8 * j8 >= D32) break;
            const float2 dyv =
                kZ ? *reinterpret_cast<const float2*>(dyz + 8 * j8)
                   : cuda::unpack2<T>(*reinterpret_cast<const uint32_t*>(dyr + 8 * j8));
            const float o0 = fmaf(f, acc[4 * (8 * hh + j8) + 2 * e], p.Dv.at(h, d) * dyv.x);
            const float o1 = fmaf(f, acc[4 * (8 * hh + j8) + 2 * e + 1], p.Dv.at(h, d + 1) * dyv.y);
            *reinterpret_cast<uint32_t*>(dxr + 8 * j8) = cuda::pack2<T>(o0, o1);
          }
        } else {
#pragma unroll
          for (int j8 = 0; j8 < 8; ++j8) {
            if (8 * j8 >= D32) break;
            *reinterpret_cast<uint32_t*>(dxr + 8 * j8) = cuda::pack2<T>(
                f * acc[4 * (8 * hh + j8) + 2 * e], f * acc[4 * (8 * hh + j8) + 2 * e + 1]);
          }
        }
        if (q4 == 0) {
          const int64_t o = (blockIdx.y * p.B * p.H + bh) * p.Lpad + t;
          p.pdv[o] = ev.x * rows[hh][e];
          p.pE[o] = f * xdot2[hh][e];
        }
      }
    }
  }
  if (tid == 0) *flag = left_heads;
#endif
}

// A dense [d0, d1, d2, d3] view of a 16-bit workspace array, for a tensor map.
template <class T>
ConstTensor dense_view4(const void* data, int64_t d0, int64_t d1, int64_t d2, int64_t d3) {
  const std::array<int64_t, 4> shape{d0, d1, d2, d3};
  return make_tensor(data, std::is_same_v<T, __half> ? DType::f16 : DType::bf16, shape);
}

// Where the shared-operand dx runs on wgmma: the walks' shapes (checked by their entry), an even
// hb (two heads a product) and dyh / gst16 / cbt16 / B views the tensor maps take (the workspace
// arrays always; B by the caller's strides).
template <class T>
bool dx_wg_ok(const BwdC<T>& p, const SsdBackwardOp::Arguments& a) {
  return p.hb % 2 == 0 && p.hb <= dx_wg::kMaxHeads && p.dyh != nullptr && p.D <= 64 && p.N <= 128 &&
         cuda::check_tma_rows("ssd_backward: dx_wg", "B", sequence_rows(a.B)).ok();
}

template <class T>
Status launch_dx_wg(const BwdC<T>& p, const SsdBackwardOp::Arguments& a, dim3 grid,
                    cudaStream_t st) {
  constexpr std::string_view who = "ssd_backward: dx_wg";
  constexpr CUtensorMapDataType dt = cuda::tensor_map_dtype<T>();
  auto view = [](const void* data, int64_t d0, int64_t d1, int64_t d2, int64_t d3) {
    return dense_view4<T>(data, d0, d1, d2, d3);
  };
  DxWgMaps maps;
  BARACUDA_TRY(cuda::make_rows_map(who, &maps.b, dt, sequence_rows(a.B), 64));
  BARACUDA_TRY(cuda::make_rows_map(
      who, &maps.cbt, dt, view(p.cbt16, 1, p.B * (p.H / p.hpg) * p.nchunks, p.cs, p.cs), 64));
  BARACUDA_TRY(cuda::make_rows_map(who, &maps.gc, dt,
                                   view(p.gst16, 1, p.B * p.H * p.nchunks, p.D, p.N), 64));
  BARACUDA_TRY(
      cuda::make_rows_map(who, &maps.dyh, dt, sequence_rows(view(p.dyh, p.B, p.L, p.H, p.D)), 64));
  auto* kernel = p.has_z ? bwd_dx_wg_kernel<T, true> : bwd_dx_wg_kernel<T, false>;
  return cuda::launch_with_smem("ssd_backward", "bwd_dx_wg_kernel", kernel, grid, dx_wg::kThreads,
                                dx_wg::Smem::request, st, maps, p);
}

}  // namespace baracuda::ssd_cuda
