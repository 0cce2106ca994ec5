// bwd_dcb_mma_kernel on wgmma (chunked_mma_walks_sm90a, stage "dcb_wg"): the same blocks (chunk,
// causal tile pair (t, s), b, group; the group's heads in order), outputs and per-head epilogue
// (dcb_head_epilogue: the weights, dCB, P's row and column sums), one warpgroup. Per head, DX =
// dy_t . x_s^T is one m64n64 product over D <= 64 from the two tiles a tensor map each brings into
// one of three slots; it overwrites the accumulator (no zeroing between heads). The head's factors
// are formed a head ahead, as in the mma.sync kernel; one barrier a head publishes them, frees the
// slot its TMA refills and orders the column partials. Shape: the walks' (D <= 64, chunk 128 or
// 256), no z (dy' = dy: the f32 workspace of the gated case is not a TMA operand).
#pragma once

#include "ops/ssd/forward_wgmma.cuh"  // its tile descriptors (fwd_wg)

namespace baracuda::ssd_cuda {

namespace dcb_wg {
using fwd_wg::kTileBytes;
constexpr int kThreads = 128, kSlots = 3;
struct Smem {
  static constexpr uint32_t ring = 0;  // per slot: dy rows t, then x rows s
  static constexpr uint32_t pc = ring + kSlots * 2 * kTileBytes;  // column partials, two heads
  static constexpr uint32_t scal = pc + 2 * 4 * dcb_mma::kWarps * 8 * dcb_mma::kLdP;
  static constexpr uint32_t bar = scal + 2 * 4 * dcb_mma::kScalars * kTile;
  static constexpr uint32_t total = bar + kSlots * 8;
  static constexpr uint32_t request = total + 1024;
};
}  // namespace dcb_wg

// dy's and x's [B, H, L, D] views.
struct DcbWgMaps {
  CUtensorMap dy, x;
};

template <class T>
__global__ void __launch_bounds__(dcb_wg::kThreads, 3)
    bwd_dcb_wg_kernel(const __grid_constant__ DcbWgMaps maps, BwdC<T> p) {
#if BARACUDA_SSD_WGMMA_DEVICE
  using namespace fwd_wg;
  using dcb_wg::kSlots;
  const cuda::AlignedSmem sm = cuda::dynamic_smem_1024();
  const uint32_t base = sm.addr;
  auto* Pc = sm.at<float[dcb_mma::kWarps * 8][dcb_mma::kLdP]>(dcb_wg::Smem::pc);
  auto* scal = sm.at<float[dcb_mma::kScalars][kTile]>(dcb_wg::Smem::scal);

  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const DcbBlock<T> blk(p, tid);
  const int64_t b = blk.b, h0 = blk.h0, tb = blk.tb;
  const int t_lo = blk.t_lo, K = blk.K, heads = static_cast<int>(p.hpg);
  if (t_lo >= K) return;  // uniform over the block
  auto bar_at = [&](int i) { return base + dcb_wg::Smem::bar + 8 * (i % kSlots); };
  auto slot_at = [&](int i) { return base + dcb_wg::Smem::ring + (i % kSlots) * 2 * kTileBytes; };
  auto issue = [&](int i) {  // head i's dy rows from t_lo and x rows from s0
    const int h = static_cast<int>(h0 + i);
    cuda::mbar_expect_tx(bar_at(i), 2 * kTileBytes);
    cuda::tma_load_4d(slot_at(i), &maps.dy, bar_at(i), 0, static_cast<int>(tb + t_lo), h,
                      static_cast<int>(b));
    cuda::tma_load_4d(slot_at(i) + kTileBytes, &maps.x, bar_at(i), 0, static_cast<int>(tb + blk.s0),
                      h, static_cast<int>(b));
  };
  start_ring(base + dcb_wg::Smem::bar, kSlots, heads, issue);

  float acc[8][4], dcb[8][4] = {}, cbv[8][4];
  float(&acc_flat)[32] = reinterpret_cast<float(&)[32]>(acc);  // wgmma's view: the same layout
  blk.load_cb(p, warp, lane, cbv);
  bool direct = __syncthreads_or(blk.factors(blk.head_scalars(p, h0), scal[0]));  // head 0's
  auto next = blk.head_scalars(p, heads > 1 ? h0 + 1 : h0);                       // head 1's inputs
  float* prow = p.prow + (blk.q * blk.BH + b * p.H + h0) * p.Lpad + tb + t_lo;
  bool flag_next = false;  // this thread's flag for the next head's factors
  for (int hi = 0; hi < heads; ++hi) {
    if (hi > 0) {
      // head hi's factors (formed during head hi - 1) and head hi - 1's column partials are
      // visible, and every warp is done with head hi - 1's slot
      direct = __syncthreads_or(flag_next);
      blk.column_sums(p, Pc[(hi - 1) & 1], hi - 1);
      if (tid == 0 && hi - 1 + kSlots < heads) issue(hi - 1 + kSlots);
    }
    flag_next = false;
    if (hi + 1 < heads) {  // the next head's factors
      flag_next = blk.factors(next, scal[(hi + 1) & 1]);
      if (hi + 2 < heads) next = blk.head_scalars(p, h0 + hi + 2);
    }
    const uint32_t slot = slot_at(hi);
    cuda::mbar_wait(bar_at(hi), static_cast<uint32_t>(hi / kSlots) & 1u);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)
      Ops<T>::ss64(acc_flat, k_major(slot, 64, 0, 16 * kk),
                   k_major(slot + kTileBytes, 64, 0, 16 * kk), kk > 0 ? 1 : 0);
    wgmma_commit();
    wait_all();
    fence_regs(acc_flat);
    dcb_head_epilogue<false>(scal[hi & 1], Pc[hi & 1], acc, cbv, dcb, direct, blk.diag, t_lo, K,
                             warp, lane, prow + hi * p.Lpad);
  }
  __syncthreads();  // the last head's column partials
  blk.column_sums(p, Pc[(heads - 1) & 1], heads - 1);
  blk.store_dcb(p, warp, lane, dcb);
#endif
}

// Where dCB runs on wgmma: the walks' shapes (checked by their entry), dy' = dy (no z) and dy / x
// views the tensor maps take.
template <class T>
bool dcb_wg_ok(const BwdC<T>& p, const SsdBackwardOp::Arguments& a) {
  constexpr std::string_view who = "ssd_backward: dcb_wg";
  return !p.has_z && p.D <= 64 && cuda::check_tma_rows(who, "dy", sequence_rows(a.dy)).ok() &&
         cuda::check_tma_rows(who, "x", sequence_rows(a.x)).ok();
}

template <class T>
Status launch_dcb_wg(const BwdC<T>& p, const SsdBackwardOp::Arguments& a, dim3 grid,
                     cudaStream_t st) {
  constexpr std::string_view who = "ssd_backward: dcb_wg";
  constexpr CUtensorMapDataType dt = cuda::tensor_map_dtype<T>();
  DcbWgMaps maps;
  BARACUDA_TRY(cuda::make_rows_map(who, &maps.dy, dt, sequence_rows(a.dy), 64));
  BARACUDA_TRY(cuda::make_rows_map(who, &maps.x, dt, sequence_rows(a.x), 64));
  return cuda::launch_with_smem("ssd_backward", "bwd_dcb_wg_kernel", bwd_dcb_wg_kernel<T>, grid,
                                dcb_wg::kThreads, dcb_wg::Smem::request, st, maps, p);
}

}  // namespace baracuda::ssd_cuda
