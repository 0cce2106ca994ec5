// The chunked forward's two products on mma.sync (chunked_mma_fastpass), for 16-bit operands the
// kernels can copy by 16-byte cp.async (fwd_mma_fits). Included by kernels.cuh after the WMMA
// forward kernels; shares their parameters (Fwd) and the workspace they fill.
//
// Both kernels keep their accumulators in mma.sync registers (no shared-memory round trip), take
// every operand tile through a cp.async ring that runs on across the heads of a block (hb heads of
// one group share the group's B or C tile, loaded once), and round each product operand to T as
// the WMMA kernels do. They add in another order than WMMA and chunk_out forms its weights
// differently (below), so y equals chunked_wmma's to rounding, not bit for bit; both are
// deterministic (fixed order, no atomics).
#pragma once

namespace baracuda::ssd_cuda {

namespace fwd_mma {
constexpr int kLd16 = kTile + 8;  // 16-bit 64-wide tiles: ldmatrix rows 144 B apart, no conflicts
constexpr size_t kSlotBytes = sizeof(uint16_t) * kTile * kLd16;
// Below this (log2 units) the decay factors of a 64-token tile cannot overflow f32 (see chunk_out).
constexpr float kFactorSafe = 24.0f;
constexpr double kLog2e = 1.4426950408889634;

__host__ __device__ inline size_t round16(size_t bytes) {
  return (bytes + 15) / 16 * 16;
}
// N rounded up to the 16-wide k step of the products (the extra columns are zero-filled).
__host__ __device__ inline int64_t k16(int64_t n) {
  return (n + 15) / 16 * 16;
}

// ---- chunk_out: y_t = exp(cum_t) C_t . S_c + sum_{s <= t} exp(cum_t - cum_s) CB_ts v_s x_s
namespace out {
constexpr int kWarps = 4, kThreads = 32 * kWarps, kStages = 3;
struct Layout {
  int64_t ldc;                                // pitch of the C tile (N rounded to 16, + 8)
  size_t cl, dts, colf, c_tile, ring, total;  // byte offsets (total: the size)
};
__host__ __device__ inline Layout layout(int64_t N) {
  Layout l{};
  l.ldc = k16(N) + 8;
  l.cl = 0;
  l.dts = l.cl + sizeof(float) * 256;
  l.colf = l.dts + sizeof(float) * 256;
  l.c_tile = l.colf + sizeof(float) * 2 * kTile;
  l.ring = l.c_tile + round16(sizeof(uint16_t) * kTile * static_cast<size_t>(l.ldc));
  l.total = l.ring + kSlotBytes * kStages;
  return l;
}
}  // namespace out

// ---- chunk_state: S_c[d][n] = sum_s (exp(cum_last - cum_s) v_s x_s[d]) B_s[n]
namespace state {
constexpr int kWarps = 8, kThreads = 32 * kWarps, kStages = 3;
constexpr int kNw = 128;  // n columns per block: warps 0-3 and 4-7 take 64 each
struct Layout {
  int64_t ldb;                    // pitch of the B tile
  size_t w, b_tile, ring, total;  // byte offsets (total: the size)
};
__host__ __device__ inline Layout layout(int64_t N, int64_t cs) {
  Layout l{};
  const int64_t nw = k16(N) < kNw ? k16(N) : kNw;
  l.ldb = nw + 8;
  l.w = 0;
  l.b_tile = l.w + sizeof(float) * 256;
  l.ring = l.b_tile + round16(sizeof(uint16_t) * static_cast<size_t>(cs * l.ldb));
  l.total = l.ring + kSlotBytes * kStages;
  return l;
}
}  // namespace state
}  // namespace fwd_mma

// Unit inner stride, 16-byte aligned rows and base: the operand goes by 16-byte cp.async.
template <class V>
bool rows16(const V& v) {
  constexpr int64_t e = 16 / sizeof(*v.p);
  return v.s3 == 1 && v.s0 % e == 0 && v.s1 % e == 0 && v.s2 % e == 0 &&
         reinterpret_cast<uintptr_t>(v.p) % 16 == 0;
}

// Host side: 16-bit data, D and N multiples of 8 (16-byte rows of the state and C tiles), chunks
// of at most 256 tokens (the per-head scalar arrays), and every tensor the kernels copy or store
// by vectors laid out for it (z is read in 4-byte pairs).
template <class T>
bool fwd_mma_fits(const Fwd<T>& p) {
  return sizeof(T) == 2 && p.N % 8 == 0 && p.D % 8 == 0 && p.cs <= 256 && rows16(p.x) &&
         rows16(p.Bm) && rows16(p.Cm) && rows16(p.y) && (!p.has_z || rows16(p.z));
}

// One block of four warps per (chunk, 64 tokens t, 64 columns d, b, hb heads of one group); warp w
// owns tokens t_lo + 16 w .. + 15 and all 64 columns (eight m16n8 accumulators). Per head a flat
// sequence of 64-deep stages: ceil(N / 64) of the state product C_t . S_c^T (the C tile loaded
// once per block, the 16-bit states p.st_t by the ring), then the intra-chunk product W . x for
// each s tile s0 <= t_lo (x by the ring). W_ts = exp(cum_t - cum_s) v_s CB_ts is built in the A
// fragments from CB values read from L2 one stage ahead. Its decay factors per s tile as
// exp(cum_t - ref) * (exp(ref - cum_s) v_s), ref = cum at the tile's last token: two
// exponentials per thread and 64 per block instead of one per element. Below the diagonal both
// factors are <= 1 when the head decays (A v <= 0), so they cannot overflow and an underflow means
// a product below f32's range; a stage with an exponent above kFactorSafe (growth, or a diagonal
// tile that decays by more than 2^24) forms every weight directly instead.
template <class T>
__global__ void __launch_bounds__(fwd_mma::out::kThreads, 3) chunk_out_mma_kernel(Fwd<T> p) {
  using namespace fwd_mma;
  using out::kStages;
  constexpr int kNT = out::kThreads;
  using cuda::ldmatrix_x4;
  using cuda::ldmatrix_x4_trans;
  using cuda::mma16816;
  using cuda::pack2;
  using cuda::smem_u32;
  extern __shared__ __align__(16) unsigned char fwd_out_smem[];
  const out::Layout lay = out::layout(p.N);
  float* cl = reinterpret_cast<float*>(fwd_out_smem + lay.cl);      // cum * log2(e), this head
  float* dts = reinterpret_cast<float*>(fwd_out_smem + lay.dts);    // v, this head
  float* colf = reinterpret_cast<float*>(fwd_out_smem + lay.colf);  // [2][64] column factors
  T* Cs = reinterpret_cast<T*>(fwd_out_smem + lay.c_tile);
  unsigned char* ring = fwd_out_smem + lay.ring;

  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, g = lane / 4, q4 = lane % 4;
  const int ntt = static_cast<int>(p.cs / kTile), cs = static_cast<int>(p.cs);
  const int64_t c = blockIdx.x / ntt;
  const int t_lo = static_cast<int>(blockIdx.x % ntt) * kTile;  // in-chunk offsets fit 32 bits
  const int64_t d0 = blockIdx.y * int64_t{kTile};
  const int64_t nhb = p.H / p.hb, b = blockIdx.z / nhb, h0 = (blockIdx.z % nhb) * p.hb;
  const int64_t G = p.H / p.hpg, grp = h0 / p.hpg, tb = c * p.cs;
  const int K = static_cast<int>(p.L - tb < p.cs ? p.L - tb : p.cs);
  if (t_lo >= K) return;  // uniform over the block
  const int64_t bw = k16(p.N);
  const int nk = static_cast<int>((bw + kTile - 1) / kTile);  // state-product stages
  const int nt = t_lo / kTile + 1;                            // s tiles s0 <= t_lo
  const int S = nk + nt, total = static_cast<int>(p.hb) * S;
  const float* cbt = p.cb + ((b * G + grp) * p.nchunks + c) * p.cs * p.cs;

  // ---- producer: stage i of the flat (head, stage) sequence into ring slot i % kStages
  auto issue = [&](int i) {
    if (i >= total) return;
    const int hi = i / S, j = i % S;
    const int64_t h = h0 + hi;
    if (i == 0)  // the C tile, once per block; columns [N, bw) zero for the last k16 step
      for (int idx = tid; idx < kTile * (bw / 8); idx += kNT) {
        const int r = idx / static_cast<int>(bw / 8), col = idx % static_cast<int>(bw / 8) * 8;
        const bool in = t_lo + r < K && col < p.N;
        cp_async16(Cs + r * lay.ldc + col, in ? &p.Cm.at(b, tb + t_lo + r, grp, col) : p.Cm.p,
                   in ? 16 : 0);
      }
    T* dst = reinterpret_cast<T*>(ring + (i % kStages) * kSlotBytes);
    if (j < nk) {  // the states entering the chunk, rows d0.., columns 64 j.. ([d][n], T)
      const T* st = p.st_t + ((b * p.H + h) * p.nchunks + c) * p.D * p.N;
      for (int idx = tid; idx < kTile * 8; idx += kNT) {
        const int r = idx / 8, col = idx % 8 * 8;
        const int64_t n = int64_t{j} * kTile + col;
        const bool in = d0 + r < p.D && n < p.N;
        cp_async16(dst + r * kLd16 + col, in ? st + (d0 + r) * p.N + n : st, in ? 16 : 0);
      }
    } else {  // x rows s0.., columns d0..
      const int s0 = (j - nk) * kTile;
      for (int idx = tid; idx < kTile * 8; idx += kNT) {
        const int r = idx / 8, col = idx % 8 * 8;
        const bool in = s0 + r < K && d0 + col < p.D;
        cp_async16(dst + r * kLd16 + col, in ? &p.x.at(b, tb + s0 + r, h, d0 + col) : p.x.p,
                   in ? 16 : 0);
      }
    }
  };

  // ---- per-thread state: rows trow[0] = t_lo + 16 warp + g and trow[1] = trow[0] + 8
  const int trow[2] = {t_lo + 16 * warp + g, t_lo + 16 * warp + g + 8};
  float acc[8][4];
  float2 cbr[4][4];  // CB of the next W stage, in A-fragment order: [k16 step][register]
  float cl_t[2] = {0.0f, 0.0f}, rowf[2] = {0.0f, 0.0f};
  bool unsafe_next = false;  // this thread saw an exponent of the next stage above kFactorSafe
  auto fetch_cb = [&](int s0) {
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)
#pragma unroll
      for (int e2 = 0; e2 < 4; ++e2)
        cbr[kk][e2] = __ldg(reinterpret_cast<const float2*>(cbt + trow[e2 & 1] * cs + s0 + 16 * kk +
                                                            2 * q4 + (e2 >= 2 ? 8 : 0)));
  };
  // The next stage's factors (a W stage s0 of the same head): the column factors into colf[buf]
  // (threads 0-63), this thread's row factors into rowf, the overflow flag into unsafe_next.
  auto prepare_w = [&](int s0, int buf) {
    const float ref = cl[min(s0 + kTile, K) - 1];
    if (tid < kTile) {
      const int s = s0 + tid;
      const float e = ref - cl[s];
      colf[buf * kTile + tid] = exp2f(e) * dts[s];
      unsafe_next = s < K && !(e <= kFactorSafe);
    } else {
      unsafe_next = false;
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float e = cl_t[r] - ref;
      const bool in = trow[r] < K;
      rowf[r] = in ? exp2f(e) : 0.0f;
      unsafe_next = unsafe_next || (in && !(e <= kFactorSafe));
    }
  };

  // One call site per helper (the loop's first kStages - 1 iterations only issue): fewer
  // instruction-cache misses than an unrolled prologue (see bwd_dx_mma_kernel).
  for (int it = 0; it < total + kStages - 1; ++it) {
    const int i = it - (kStages - 1);  // the stage this iteration computes, if >= 0
    bool unsafe = false;
    if (i >= 0) {
      cp_async_wait<kStages - 2>();
      // stage i visible, slot (i - 1) % kStages and colf[(i + 1) % 2] free, stage i's flag or-ed
      unsafe = __syncthreads_or(unsafe_next);
    }
    issue(it);
    cp_async_commit();
    if (i < 0) continue;
    const int hi = i / S, j = i % S;
    const int64_t h = h0 + hi;
    const T* slot = reinterpret_cast<const T*>(ring + (i % kStages) * kSlotBytes);
    if (j == 0) {  // a new head: its scalars (the previous head's last reads were before the
                   // barrier above)
      const int64_t ob = (b * p.H + h) * p.Lpad + tb;
      for (int t = tid; t < cs; t += kNT) {
        cl[t] = static_cast<float>(p.cum[ob + t] * kLog2e);
        dts[t] = p.dtp[ob + t];
      }
      __syncthreads();
#pragma unroll
      for (int r = 0; r < 2; ++r) cl_t[r] = cl[trow[r]];
#pragma unroll
      for (int j8 = 0; j8 < 8; ++j8)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[j8][e] = 0.0f;
    }
    const int qt = j - nk;  // s tile of a W stage (< 0: a state-product stage)
    const int s0 = qt * kTile;
    uint32_t wa[4][4];
    if (qt >= 0) {
      const bool diag = s0 == t_lo;  // the mask s <= t cuts through this tile only
      const float* cf = colf + (i % 2) * kTile;
#pragma unroll
      for (int kk = 0; kk < 4; ++kk)
#pragma unroll
        for (int e2 = 0; e2 < 4; ++e2) {
          const int r = e2 & 1, sc = 16 * kk + 2 * q4 + (e2 >= 2 ? 8 : 0);
          float w2[2];
          if (!unsafe) {
            const float2 f = *reinterpret_cast<const float2*>(cf + sc);
            w2[0] = rowf[r] * f.x * cbr[kk][e2].x;
            w2[1] = rowf[r] * f.y * cbr[kk][e2].y;
          } else {
            w2[0] = exp2f(cl_t[r] - cl[s0 + sc]) * dts[s0 + sc] * cbr[kk][e2].x;
            w2[1] = exp2f(cl_t[r] - cl[s0 + sc + 1]) * dts[s0 + sc + 1] * cbr[kk][e2].y;
          }
          // rows t >= K are never stored (their CB rows are not written either)
          if (diag) {
            w2[0] = s0 + sc <= trow[r] ? w2[0] : 0.0f;
            w2[1] = s0 + sc + 1 <= trow[r] ? w2[1] : 0.0f;
          }
          wa[kk][e2] = pack2<T>(w2[0], w2[1]);
        }
    }
    // The next stage's inputs, in flight under this stage's products: a W stage of this head (the
    // first one after the last state stage, or the next s tile).
    if (j + 1 < S && j + 1 >= nk) {
      const int s0n = (j + 1 - nk) * kTile;
      fetch_cb(s0n);
      prepare_w(s0n, (i + 1) % 2);
    } else {
      unsafe_next = false;
    }
    if (qt < 0) {
      // acc[t][d] += sum_n C[t][n] S[d][n] over n in [64 j, 64 j + 64)
      const int64_t left = (bw - int64_t{j} * kTile) / 16;
      const int ksteps = left < 4 ? static_cast<int>(left) : 4;
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        if (kk >= ksteps) break;
        uint32_t a[4];
        const int col = j * kTile + 16 * kk + (lane / 16) * 8;
        ldmatrix_x4(smem_u32(Cs + (16 * warp + lane % 16) * lay.ldc + col), a[0], a[1], a[2], a[3]);
#pragma unroll
        for (int jp = 0; jp < 4; ++jp) {
          uint32_t b0, b1, b2, b3;
          ldmatrix_x4(smem_u32(slot + (16 * jp + lane % 8 + (lane / 16) * 8) * kLd16 + 16 * kk +
                               ((lane / 8) % 2) * 8),
                      b0, b1, b2, b3);
          mma16816<T>(acc[2 * jp], a, b0, b1);
          mma16816<T>(acc[2 * jp + 1], a, b2, b3);
        }
      }
      if (j == nk - 1)  // the state enters decayed by exp(cum_t)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const float es = trow[r] < K ? exp2f(cl_t[r]) : 0.0f;
#pragma unroll
          for (int j8 = 0; j8 < 8; ++j8) acc[j8][2 * r] *= es, acc[j8][2 * r + 1] *= es;
        }
      continue;
    }
    // acc[t][d] += sum_s W[t][s] x[s][d] over s tile qt
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)
#pragma unroll
      for (int jp = 0; jp < 4; ++jp) {
        uint32_t b0, b1, b2, b3;
        ldmatrix_x4_trans(smem_u32(slot + (16 * kk + lane % 16) * kLd16 + 8 * (2 * jp + lane / 16)),
                          b0, b1, b2, b3);
        mma16816<T>(acc[2 * jp], wa[kk], b0, b1);
        mma16816<T>(acc[2 * jp + 1], wa[kk], b2, b3);
      }
    if (j != S - 1) continue;
    // The head's epilogue: y = (acc + D x) * silu(z). The slot holds the diagonal tile's x, which
    // are this block's own rows.
    const int dcols = p.D - d0 < kTile ? static_cast<int>(p.D - d0) : kTile;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      if (trow[r] >= K) continue;
      const int64_t tok = tb + trow[r];
      T* yr = &p.y.at(b, tok, h, d0);  // unit inner stride (fwd_mma_fits)
      const T* xr = slot + (16 * warp + g + 8 * r) * kLd16;
      const T* zr = p.has_z ? &p.z.at(b, tok, h, d0) : nullptr;
#pragma unroll
      for (int j8 = 0; j8 < 8; ++j8) {
        const int dc = 8 * j8 + 2 * q4;
        if (dc >= dcols) continue;
        float o[2] = {acc[j8][2 * r], acc[j8][2 * r + 1]};
        if (p.has_d)
#pragma unroll
          for (int u = 0; u < 2; ++u) o[u] += p.Dv.at(h, d0 + dc + u) * to_float(xr[dc + u]);
        if (p.has_z) {
          const uint32_t zz = __ldg(reinterpret_cast<const unsigned int*>(zr + dc));
          const T* z2 = reinterpret_cast<const T*>(&zz);
#pragma unroll
          for (int u = 0; u < 2; ++u) o[u] *= silu(to_float(z2[u]));
        }
        *reinterpret_cast<uint32_t*>(yr + dc) = pack2<T>(o[0], o[1]);
      }
    }
  }
  cp_async_wait<0>();
}

// One block of eight warps per (chunk, 64 columns d, 128 columns n, b, hb heads of one group);
// warp w owns d rows d0 + 16 (w % 4) .. + 15 and n columns n0 + 64 (w / 4) .. + 63 (eight m16n8
// accumulators). The group's B rows of the chunk (this block's n columns) are loaded once per
// block; each head's x tiles (64 tokens deep) stream through the ring. The A fragments are x^T
// loaded by ldmatrix.trans and multiplied by the token weights exp(cum_last - cum_s) v_s before
// the rounding to T (the value the WMMA kernel stages).
template <class T>
__global__ void __launch_bounds__(fwd_mma::state::kThreads, 2) chunk_state_mma_kernel(Fwd<T> p) {
  using namespace fwd_mma;
  using state::kNw;
  using state::kStages;
  constexpr int kNT = state::kThreads;
  using cuda::ldmatrix_x4_trans;
  using cuda::mma16816;
  using cuda::pack2;
  using cuda::smem_u32;
  extern __shared__ __align__(16) unsigned char fwd_state_smem[];
  const state::Layout lay = state::layout(p.N, p.cs);
  float* wsm = reinterpret_cast<float*>(fwd_state_smem + lay.w);  // token weights, this head
  T* Bs = reinterpret_cast<T*>(fwd_state_smem + lay.b_tile);
  unsigned char* ring = fwd_state_smem + lay.ring;

  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, g = lane / 4, q4 = lane % 4;
  const int wm = warp % 4, wn = warp / 4;
  const int64_t bw = k16(p.N), nw = bw < kNw ? bw : kNw;
  const int64_t tiles_n = (bw + kNw - 1) / kNw;
  const int64_t c = blockIdx.x;
  const int64_t d0 = (blockIdx.y / tiles_n) * kTile, n0 = (blockIdx.y % tiles_n) * kNw;
  const int64_t nhb = p.H / p.hb, b = blockIdx.z / nhb, h0 = (blockIdx.z % nhb) * p.hb;
  const int64_t grp = h0 / p.hpg, tb = c * p.cs;
  const int K = static_cast<int>(p.L - tb < p.cs ? p.L - tb : p.cs);
  const int nks = (K + kTile - 1) / kTile;  // 64-deep stages per head
  const int total = static_cast<int>(p.hb) * nks;
  // n columns of this warp that hold data: whole 16-wide pairs of m16n8 tiles
  const int64_t my_n0 = n0 + 64 * wn;
  const int npairs = my_n0 >= bw ? 0 : static_cast<int>(bw - my_n0 >= 64 ? 4 : (bw - my_n0) / 16);

  auto issue = [&](int i) {
    if (i >= total) return;
    const int hi = i / nks, j = i % nks;
    const int64_t h = h0 + hi;
    const int w8 = static_cast<int>(nw / 8);
    if (i == 0)  // the B rows of the chunk, once per block; columns past N zero
      for (int idx = tid; idx < nks * kTile * w8; idx += kNT) {
        const int r = idx / w8, col = idx % w8 * 8;
        const bool in = r < K && n0 + col < p.N;
        cp_async16(Bs + r * lay.ldb + col, in ? &p.Bm.at(b, tb + r, grp, n0 + col) : p.Bm.p,
                   in ? 16 : 0);
      }
    T* dst = reinterpret_cast<T*>(ring + (i % kStages) * kSlotBytes);
    const int s0 = j * kTile;
    for (int idx = tid; idx < kTile * 8; idx += kNT) {
      const int r = idx / 8, col = idx % 8 * 8;
      const bool in = s0 + r < K && d0 + col < p.D;
      cp_async16(dst + r * kLd16 + col, in ? &p.x.at(b, tb + s0 + r, h, d0 + col) : p.x.p,
                 in ? 16 : 0);
    }
  };

  float acc[8][4];
  for (int it = 0; it < total + kStages - 1; ++it) {
    const int i = it - (kStages - 1);
    if (i >= 0) {
      cp_async_wait<kStages - 2>();
      __syncthreads();  // stage i visible; every thread is done with slot (i - 1) % kStages
    }
    issue(it);
    cp_async_commit();
    if (i < 0) continue;
    const int hi = i / nks, j = i % nks;
    const int64_t h = h0 + hi, bh = b * p.H + h;
    if (j == 0) {  // a new head: its token weights (the last reads of the previous head's were
                   // before the barrier above)
      const int64_t ob = bh * p.Lpad + tb;
      const double last = p.cum[ob + p.cs - 1];
      for (int s = tid; s < nks * kTile; s += kNT)
        wsm[s] = s < K ? expf(static_cast<float>(last - p.cum[ob + s])) * p.dtp[ob + s] : 0.0f;
      __syncthreads();
#pragma unroll
      for (int j8 = 0; j8 < 8; ++j8)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[j8][e] = 0.0f;
    }
    const T* X = reinterpret_cast<const T*>(ring + (i % kStages) * kSlotBytes);
    const int s0 = j * kTile;
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      // A = (x w)^T: rows d, k = tokens; matrix l / 8 covers tokens 8 (l / 16).., d 8 ((l / 8) %
      // 2)..
      uint32_t a[4];
      const int mi = lane / 8;
      ldmatrix_x4_trans(
          smem_u32(X + (16 * kk + (mi / 2) * 8 + lane % 8) * kLd16 + 16 * wm + (mi % 2) * 8), a[0],
          a[1], a[2], a[3]);
      const float2 wlo = *reinterpret_cast<const float2*>(wsm + s0 + 16 * kk + 2 * q4);
      const float2 whi = *reinterpret_cast<const float2*>(wsm + s0 + 16 * kk + 8 + 2 * q4);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float2 w = e < 2 ? wlo : whi;
        const T* v = reinterpret_cast<const T*>(&a[e]);
        a[e] = pack2<T>(to_float(v[0]) * w.x, to_float(v[1]) * w.y);
      }
#pragma unroll
      for (int jp = 0; jp < 4; ++jp) {
        if (jp >= npairs) break;
        uint32_t b0, b1, b2, b3;
        ldmatrix_x4_trans(smem_u32(Bs + (s0 + 16 * kk + lane % 16) * lay.ldb + 64 * wn +
                                   8 * (2 * jp + lane / 16)),
                          b0, b1, b2, b3);
        mma16816<T>(acc[2 * jp], a, b0, b1);
        mma16816<T>(acc[2 * jp + 1], a, b2, b3);
      }
    }
    if (j != nks - 1) continue;
    float* out = p.st + (bh * p.nchunks + c) * p.D * p.N;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int64_t d = d0 + 16 * wm + g + 8 * r;
      if (d >= p.D) continue;
#pragma unroll
      for (int j8 = 0; j8 < 8; ++j8) {
        const int64_t n = my_n0 + 8 * j8 + 2 * q4;
        if (n < p.N)
          *reinterpret_cast<float2*>(out + d * p.N + n) =
              make_float2(acc[j8][2 * r], acc[j8][2 * r + 1]);
      }
    }
  }
  cp_async_wait<0>();
}

template <class T>
Status launch_chunk_state_mma(const Fwd<T>& p, const ssd::Problem& pr, cudaStream_t st) {
  const size_t smem = fwd_mma::state::layout(pr.state_dim, pr.chunk_size).total;
  BARACUDA_TRY(cuda::check(
      "ssd_forward", "cudaFuncSetAttribute",
      cudaFuncSetAttribute(chunk_state_mma_kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(smem))));
  const int64_t tiles_n = cuda::ceil_div(fwd_mma::k16(pr.state_dim), fwd_mma::state::kNw);
  const dim3 grid(static_cast<unsigned>(pr.nchunks),
                  static_cast<unsigned>(cuda::ceil_div(pr.head_dim, kTile) * tiles_n),
                  static_cast<unsigned>(pr.batch * (pr.heads / p.hb)));
  chunk_state_mma_kernel<T><<<grid, fwd_mma::state::kThreads, smem, st>>>(p);
  return cuda::check_launch("ssd_forward", "chunk_state_mma_kernel");
}

template <class T>
Status launch_chunk_out_mma(const Fwd<T>& p, const ssd::Problem& pr, cudaStream_t st) {
  const size_t smem = fwd_mma::out::layout(pr.state_dim).total;
  BARACUDA_TRY(cuda::check(
      "ssd_forward", "cudaFuncSetAttribute",
      cudaFuncSetAttribute(chunk_out_mma_kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(smem))));
  const dim3 grid(static_cast<unsigned>(pr.nchunks * (pr.chunk_size / kTile)),
                  static_cast<unsigned>(cuda::ceil_div(pr.head_dim, kTile)),
                  static_cast<unsigned>(pr.batch * (pr.heads / p.hb)));
  chunk_out_mma_kernel<T><<<grid, fwd_mma::out::kThreads, smem, st>>>(p);
  return cuda::check_launch("ssd_forward", "chunk_out_mma_kernel");
}

}  // namespace baracuda::ssd_cuda
