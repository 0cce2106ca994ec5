// The chunked backward's two inter-chunk passes as walks on wgmma (chunked_mma_walks_sm90a): one
// block per (batch row, head) carries a D x N state across the chunks in its accumulators, so
// the per-chunk products and the scan over chunks are one kernel and the per-chunk f32 values
// (chunk_state's, U_c's) never make the round trip through memory.
//
// The states' recompute, S <- e^cum_last S + (w o x)^T . B with w_s = v_s e^(cum_last - cum_s),
// writes S entering chunk c to st16 (T) and, where a chunk-parallel kernel reads it, st (f32).
// The adjoint scan, G <- e^cum_last G + (w o dy)^T . C with w_t = e^cum_t, writes G leaving
// chunk c to gst16 (and gst, likewise), the rows dyh_t = e^(cum_t - cum_last) dy_t (bwd_dx_hn's
// operand) and d_initial_states.
//
// The weights are chunk_outer_mma_kernel's (the same f32 expressions, rounded to T as its A
// operand is); the sums run in f32 accumulators from the first chunk to the last instead of per
// chunk and then across chunks, so the values equal chunked_mma_fastpass's to rounding.
//
// Per 64-token piece (a chunk of 128 or 256 is two or four): x (or dy) and B (or C) arrive by
// tensor-map copies into one of three 24 KB stages, A = (w o x)^T is read transposed from the x
// tile by ldmatrix and scaled in registers, and S += A . B runs as one or two m64n64k16 groups (B
// MN-major). One warpgroup a block, three blocks an SM. Shape: chunk 128 or 256, D <= 64, N <= 128
// (multiples of 8), 16-bit data, views a tensor map can describe (the launcher runs the
// chunk-parallel kernels where one cannot).
#pragma once

#include "ops/ssd/forward_wgmma.cuh"  // its tile descriptors (fwd_wg), sequence_rows

namespace baracuda::ssd_cuda {

namespace walk_wg {
// One warpgroup per block, so that three blocks share an SM and the 2.7B shape's B * H = 320
// walks are all resident at once (two warpgroups of 48 KB stages fit two blocks per SM, and the
// second wave of 56 walks doubled the time: 0.275 ms for the states' walk, 2.7x its traffic).
constexpr int kThreads = 128, kRows = 64, kStages = 3;  // kRows: the tokens of a piece
struct Smem {
  static constexpr uint32_t kBlock = kRows * 128;    // one 64-column swizzled block of a piece
  static constexpr uint32_t kStage = 3 * kBlock;     // x (one block), then B (two)
  static constexpr uint32_t bar = kStages * kStage;  // an mbarrier per stage
  // A piece's token weights (w, and e^(cum_t - cum_last) for dyh) and its chunk's decay, in two
  // slots: the next piece's are formed while this one's product runs.
  static constexpr uint32_t w = bar + kStages * 8;
  static constexpr uint32_t w2 = w + 2 * kRows * 4;
  static constexpr uint32_t decay = w2 + 2 * kRows * 4;
  static constexpr uint32_t total = decay + 2 * 4;
  static constexpr uint32_t request = total + 1024;  // room to align the base
};
}  // namespace walk_wg

// ta: the [B, H, L, D] view of x (forward) or dy (reverse); tb: the [B, G, L, N] view of B or C.
template <class T, bool kRev>
__global__ void __launch_bounds__(walk_wg::kThreads, 3)
    ssd_state_walk_kernel(const __grid_constant__ CUtensorMap ta,
                          const __grid_constant__ CUtensorMap tb, BwdC<T> p) {
#if BARACUDA_SSD_WGMMA_DEVICE
  using namespace fwd_wg;
  using walk_wg::kRows;
  using walk_wg::kStages;
  using W = walk_wg::Smem;
  const cuda::AlignedSmem sm = cuda::dynamic_smem_1024();
  const uint32_t base = sm.addr;
  unsigned char* gen = sm.ptr;
  float* const w_sm = reinterpret_cast<float*>(gen + W::w);
  float* const w2_sm = reinterpret_cast<float*>(gen + W::w2);
  float* const decay_sm = reinterpret_cast<float*>(gen + W::decay);

  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int64_t bh = blockIdx.x, b = bh / p.H, h = bh % p.H, grp = h / p.hpg;
  const int D = static_cast<int>(p.D), N = static_cast<int>(p.N);
  const int per_chunk = static_cast<int>(p.cs / kRows);
  const int64_t pieces = p.nchunks * per_chunk;
  const int col_blocks = N > 64 ? 2 : 1;
  auto chunk_of = [&](int64_t i) {
    const int64_t c = i / per_chunk;
    return kRev ? p.nchunks - 1 - c : c;
  };
  // Piece i (rows past the sequence and columns past D or N read as zeros) into stage i % 3.
  auto issue = [&](int64_t i) {
    const int stage = static_cast<int>(i % kStages);
    const int t0 = static_cast<int>(chunk_of(i) * p.cs + (i % per_chunk) * kRows);
    const uint32_t bar = base + W::bar + 8 * stage, at = base + stage * W::kStage;
    cuda::mbar_expect_tx(bar, (1 + col_blocks) * W::kBlock);
    cuda::tma_load_4d(at, &ta, bar, 0, t0, static_cast<int>(h), static_cast<int>(b));
    for (int cb = 0; cb < col_blocks; ++cb)
      cuda::tma_load_4d(at + (1 + cb) * W::kBlock, &tb, bar, 64 * cb, t0, static_cast<int>(grp),
                        static_cast<int>(b));
  };

  // The state in the accumulators of two m64n64 products: st[cb] holds columns n 64 cb .. + 63
  // (this thread's rows d = r_lo, r_lo + 8; N <= 64 leaves st[1] at zero).
  const int r_lo = 16 * warp + lane / 4, cq = 2 * (lane % 4);
  float st[2][32];
  auto each_state = [&](auto&& f) {  // f(accumulator, d, n) over this thread's 64
#pragma unroll
    for (int cb = 0; cb < 2; ++cb)
#pragma unroll
      for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          f(st[cb][4 * j + e], r_lo + 8 * (e / 2), 64 * cb + 8 * j + cq + e % 2);
  };
  {
    const V4<const float>& in = kRev ? p.dfin : p.init;
    const bool has_in = kRev ? p.has_dfin : p.has_init;
    each_state(
        [&](float& s, int d, int n) { s = has_in && d < D && n < N ? in.at(b, h, d, n) : 0.0f; });
  }

  // Threads tid < kRows form token tid's weights of a piece, from scalars loaded a piece earlier
  // (chunk_outer_mma_kernel's expressions, bit for bit).
  double cum_r = 0.0, last_r = 0.0;
  float v_r = 0.0f;
  auto load_scalars = [&](int64_t i) {
    if (tid >= kRows) return;
    const int64_t o = bh * p.Lpad + chunk_of(i) * p.cs;
    cum_r = p.cum[o + (i % per_chunk) * kRows + tid];
    last_r = p.cum[o + p.cs - 1];
    if constexpr (!kRev) v_r = p.dtp[o + (i % per_chunk) * kRows + tid];
  };
  auto form_weights = [&](int64_t i) {
    if (tid >= kRows) return;
    const int sl = static_cast<int>(i % 2);
    w_sm[sl * kRows + tid] =
        kRev ? expf(static_cast<float>(cum_r)) : expf(static_cast<float>(last_r - cum_r)) * v_r;
    if constexpr (kRev) w2_sm[sl * kRows + tid] = expf(static_cast<float>(cum_r - last_r));
    if (tid == 0) decay_sm[sl] = expf(static_cast<float>(last_r));
  };
  if (tid == 0) {
    for (int s = 0; s < kStages; ++s) cuda::mbar_init(base + W::bar + 8 * s, 1);
    cuda::mbar_init_fence();
  }
  load_scalars(0);
  form_weights(0);
  if (pieces > 1) load_scalars(1);
  __syncthreads();
  if (tid == 0)
    for (int64_t i = 0; i < kStages && i < pieces; ++i) issue(i);

  T* const hat = kRev ? p.dyh : nullptr;
  // ldmatrix.trans rows of the A fragments ((w o x)^T: rows d 16 warp .., k = tokens): lanes
  // 8 m .. 8 m + 7 address matrix m = (k half, d half) of a k16 step
  const int lm = lane / 8, lr = lane % 8;
  for (int64_t i = 0; i < pieces; ++i) {
    const int64_t c = chunk_of(i);
    const int k = static_cast<int>(i % per_chunk), stage = static_cast<int>(i % kStages);
    const int sl = static_cast<int>(i % 2);
    if (k == 0) {  // chunk c starts: S entering it (G leaving it) out, then the decay
      // from one element offset per row (d, cq) and constant offsets 64 cb + 8 j
      const int64_t at = (bh * p.nchunks + c) * p.D * p.N + r_lo * N + cq;
      // (the f32 copy only where a chunk-parallel kernel reads it: walk_st32 / walk_gst32)
      float* const o32 = (kRev ? p.walk_gst32 : p.walk_st32) ? (kRev ? p.gst : p.st) + at : nullptr;
      T* const o16 = (kRev ? p.gst16 : p.st16) + at;
#pragma unroll
      for (int u = 0; u < 2; ++u) {
        if (r_lo + 8 * u >= D) continue;
#pragma unroll
        for (int cb = 0; cb < 2; ++cb)
#pragma unroll
          for (int j = 0; j < 8; ++j) {
            const int n = 64 * cb + 8 * j;
            if (n + cq < N) {  // N % 8 == 0: n + cq + 1 < N too
              const float s0 = st[cb][4 * j + 2 * u], s1 = st[cb][4 * j + 2 * u + 1];
              if (o32 != nullptr)
                *reinterpret_cast<float2*>(o32 + 8 * u * N + n) = make_float2(s0, s1);
              *reinterpret_cast<uint32_t*>(o16 + 8 * u * N + n) = cuda::pack2<T>(s0, s1);
            }
          }
      }
      const float decay = decay_sm[sl];
#pragma unroll
      for (int cb = 0; cb < 2; ++cb)
#pragma unroll
        for (int e = 0; e < 32; ++e) st[cb][e] *= decay;
    }
    const uint32_t x_at = base + stage * W::kStage;
    cuda::mbar_wait(base + W::bar + 8 * stage, static_cast<uint32_t>(i / kStages) & 1u);
    if (kRev && hat != nullptr) {  // dyh rows: thread tid takes row tid / 2, half a row
      const int row = tid / 2;
      const int64_t t = c * p.cs + k * kRows + row;
      if (t < p.L) {
        const float w2 = w2_sm[sl * kRows + row];
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const int pc = 4 * (tid % 2) + q;  // the chunk as stored: columns 8 (pc ^ row % 8)
          const int d0 = 8 * (pc ^ (row % 8));
          if (d0 >= D) continue;
          const uint4 xv =
              *reinterpret_cast<const uint4*>(gen + (x_at - base) + row * 128 + pc * 16);
          const uint32_t* e = reinterpret_cast<const uint32_t*>(&xv);
          uint4 o;
          uint32_t* ow = reinterpret_cast<uint32_t*>(&o);
#pragma unroll
          for (int m = 0; m < 4; ++m) {
            const float2 f = cuda::unpack2<T>(e[m]);
            ow[m] = cuda::pack2<T>(f.x * w2, f.y * w2);
          }
          *reinterpret_cast<uint4*>(hat + ((b * p.L + t) * p.H + h) * p.D + d0) = o;
        }
      }
    }
    // A = (w o x)^T from registers: x read transposed by ldmatrix, each k column scaled by its
    // token's weight and rounded to T (as chunk_outer_mma_kernel's staged rows are)
    uint32_t a[kRows / 16][4];
#pragma unroll
    for (int ks = 0; ks < kRows / 16; ++ks) {
      const int t = 16 * ks + lr + 8 * (lm / 2), chunk = 2 * warp + lm % 2;
      cuda::ldmatrix_x4_trans(x_at + t * 128 + ((chunk ^ (t % 8)) * 16), a[ks][0], a[ks][1],
                              a[ks][2], a[ks][3]);
      const float* wk = w_sm + sl * kRows + 16 * ks + cq;
      const float2 lo = *reinterpret_cast<const float2*>(wk),
                   hi = *reinterpret_cast<const float2*>(wk + 8);
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const float2 f = cuda::unpack2<T>(a[ks][r]), wv = r < 2 ? lo : hi;
        a[ks][r] = cuda::pack2<T>(f.x * wv.x, f.y * wv.y);
      }
    }
    // the next piece's weights (its slot's readers finished before the last barrier), then the
    // scalars of the one after
    if (i + 1 < pieces) form_weights(i + 1);
    if (i + 2 < pieces) load_scalars(i + 2);
    // S += A . B, B's column blocks MN-major (one straight group per column count: a wgmma
    // under a branch is serialized by ptxas)
    auto product = [&]<int kBlocks>() {
      wgmma_fence();
#pragma unroll
      for (int cb = 0; cb < kBlocks; ++cb)
#pragma unroll
        for (int ks = 0; ks < kRows / 16; ++ks)
          Ops<T>::template rs<64>(st[cb], a[ks], mn_major(x_at + W::kBlock, kRows, cb, 16 * ks));
      wgmma_commit();
      wait_all();  // inside the branch: a group open across a join is serialized by ptxas
      fence_regs(st[0]);
      fence_regs(st[1]);
    };
    if (col_blocks == 2)
      product.template operator()<2>();
    else
      product.template operator()<1>();
    __syncthreads();  // every warp done with the stage; the next weights visible
    if (tid == 0 && i + kStages < pieces) issue(i + kStages);
  }
  if (kRev && p.has_init)  // what is left before the first chunk: d_initial_states
    each_state([&](float& s, int d, int n) {
      if (d < D && n < N) p.dinit.at(b, h, d, n) = s;
    });
#endif
}

// Where this build holds the walks' sm_90a body (an sm_80-only build compiles them empty).
template <class T>
bool walks_body() {
  const auto a =
      cuda::func_attributes(reinterpret_cast<const void*>(ssd_state_walk_kernel<T, false>));
  return a && a->binaryVersion >= 90;
}

// The shapes the walks take (the launcher still checks the views per walk).
template <class T>
bool walks_fit(const ssd::Problem& p, const DeviceCaps& caps) {
  return wgmma_walk_fits(p, caps, walk_wg::Smem::request) &&
         p.batch * p.heads <= (int64_t{1} << 31) - 1 && walks_body<T>();
}

// Whether a walk can read the views by tensor maps (the reverse walk reads dy itself, so it
// takes no gate: has_z keeps the chunk-parallel kernels).
constexpr std::string_view kWalksWho = "ssd_backward: chunked_mma_walks_sm90a";
template <class T, bool kRev>
bool walk_views_ok(const BwdC<T>& p, const SsdBackwardOp::Arguments& a) {
  constexpr std::string_view who = kWalksWho;
  return !(kRev && p.has_z) &&
         cuda::check_tma_rows(who, kRev ? "dy" : "x", sequence_rows(kRev ? a.dy : a.x)).ok() &&
         cuda::check_tma_rows(who, kRev ? "C" : "B", sequence_rows(kRev ? a.C : a.B)).ok();
}
template <class T, bool kRev>
Status launch_state_walk(const BwdC<T>& p, const SsdBackwardOp::Arguments& a, cudaStream_t st) {
  constexpr std::string_view who = kWalksWho;
  constexpr CUtensorMapDataType dt = cuda::tensor_map_dtype<T>();
  CUtensorMap ta, tb;
  BARACUDA_TRY(cuda::make_rows_map(who, &ta, dt, sequence_rows(kRev ? a.dy : a.x), walk_wg::kRows));
  BARACUDA_TRY(cuda::make_rows_map(who, &tb, dt, sequence_rows(kRev ? a.C : a.B), walk_wg::kRows));
  return cuda::launch_with_smem("ssd_backward", "ssd_state_walk_kernel",
                                ssd_state_walk_kernel<T, kRev>,
                                dim3(static_cast<unsigned>(p.B * p.H)), walk_wg::kThreads,
                                walk_wg::Smem::request, st, ta, tb, p);
}

}  // namespace baracuda::ssd_cuda
