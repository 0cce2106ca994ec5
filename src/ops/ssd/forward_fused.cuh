// The chunked forward in one pass over memory (fused_mma): one block per (batch row, head) walks
// the chunks in order with the state on chip, for 16-bit data, head_dim <= 64, state_dim <= 128.
// Included by kernels.cuh after forward_mma.cuh; shares its parameters (Fwd). No workspace.
//
// Per chunk (Q tokens, chunk-local cum_t = sum_{s<=t} v_s A, S the state entering the chunk):
//   y_t = exp(cum_t) C_t . S  +  sum_{s<=t} exp(cum_t - cum_s) v_s CB_ts x_s      (then D, z)
//   S  <- exp(cum_last) S  +  sum_s exp(cum_last - cum_s) v_s x_s (outer) B_s
// The same SSD decomposition and the same chunk as chunked_mma_fastpass, with its operand
// rounding (x and B by T, the state rounded to T for C.S, W rounded to T), but the state stays in
// f32 registers from chunk to chunk: no chunk-state array, no scan launch, no prep launch, no
// C.B^T array (each block forms it from the C and B rows it holds anyway). x is read once, y
// written once; B and C come from L2 (every head of a group reads the same rows).
// The three products per chunk on mma.sync with f32 accumulators; fixed order (deterministic).
#pragma once

#include "ops/ssd/segments.hpp"  // how the walks are cut

namespace baracuda::ssd_cuda {

namespace fused {
constexpr int kWarps = 8, kThreads = 32 * kWarps;
constexpr int kD = 64;        // head_dim, padded: columns [D, 64) are zeros
constexpr int kLdX = kD + 8;  // x rows 144 B apart: ldmatrix rows hit distinct banks

// Shared memory of one block: the chunk's x, C and B rows, the state entering the chunk rounded
// to T, and the chunk's per-token scalars. Byte offsets; every region 16-byte aligned.
template <int kQ, int kN>
struct Smem {
  static constexpr int kLdN = kN + 8;  // 272 or 144 B rows
  static constexpr size_t x = 0;
  static constexpr size_t c = x + sizeof(uint16_t) * kQ * kLdX;
  static constexpr size_t b = c + sizeof(uint16_t) * kQ * kLdN;
  static constexpr size_t s = b + sizeof(uint16_t) * kQ * kLdN;
  static constexpr size_t cum = s + sizeof(uint16_t) * kD * kLdN;  // cum_t log2(e)
  static constexpr size_t lv = cum + sizeof(float) * kQ;           // cum_t - log2(v_t)
  static constexpr size_t w = lv + sizeof(float) * kQ;             // exp(cum_last - cum_t) v_t
  static constexpr size_t tot = w + sizeof(float) * kQ;            // the scan's warp totals
  static constexpr size_t total = tot + sizeof(float) * kWarps;
};

// The chunk rows of one [B, L, ·, width] operand this thread copies into shared rows of pitch
// ld (token t0 + r of batch row b, third index i, columns [0, kW) with zeros past `cols` and past
// the sequence). kVec: 16-byte cp.async pieces, one fixed column per thread and rows kRowStep
// apart, from a pointer set up once (no per-piece index products); else element copies.
template <class T, int kQ, int kW, bool kVec>
struct RowLoader {
  static constexpr int kPieces = kVec ? kW / 8 : kW;  // per row
  static constexpr int kRowStep = kThreads / kPieces;
  static_assert(kThreads % kPieces == 0 && kQ % kRowStep == 0);
  const T* src;   // row r0 of chunk 0 (kVec: at this thread's column)
  int64_t s_tok;  // elements from one token to the next
  int r0, col;
  bool col_in;

  __device__ RowLoader(const V4<const T>& v, int64_t b, int64_t i, int cols, int tid)
      : s_tok(v.s1), r0(tid / kPieces), col(tid % kPieces * (kVec ? 8 : 1)) {
    col_in = col < cols;
    src = v.p + b * v.s0 + r0 * v.s1 + i * v.s2 + (col_in ? col * v.s3 : 0);
  }
  // rows: the chunk's tokens before the end of the sequence.
  __device__ __forceinline__ void load(T* dst, int ld, int64_t t0, int rows) const {
    const T* s = src + t0 * s_tok;
    T* d = dst + r0 * ld + col;
#pragma unroll 4
    for (int r = r0; r < kQ; r += kRowStep, s += kRowStep * s_tok, d += kRowStep * ld) {
      const bool in = col_in && r < rows;
      if constexpr (kVec) {
        cuda::cp_async16(d, in ? s : src, in ? 16 : 0);
      } else {
        *d = in ? *s : from_float<T>(0.0f);
      }
    }
  }
};
}  // namespace fused

// One block of eight warps per (head h, batch row b), chunks in order. Warp roles:
//  - y (C.S and W.x): the chunk's 16-row tiles go in pairs {i, kQ/16 - 1 - i} (equal causal
//    work), each pair to 8 / pairs warps splitting the 64 columns d;
//  - the state update: warp w owns rows d 16 (w % 4) .. + 15 and half of the N columns; its
//    accumulators are the f32 state, carried from chunk to chunk.
// The walk a block of a fused forward (fused_mma, fused_wgmma_sm90a) runs: (b, h) from the grid,
// or, cut into segments, (segment, b, h) from the block's ticket (segment-major, so a segment's
// predecessor holds a smaller ticket: it is running or done), and the segment's chunks
// [c_lo, c_hi) (the whole walk when uncut). Call from every thread (the ticket is a barrier).
struct FusedWalk {
  int64_t h, b, seg, walk, grp, c_lo, c_hi;
};
template <class T>
__device__ __forceinline__ FusedWalk fused_walk(const Fwd<T>& p) {
  int64_t h = blockIdx.x, b = blockIdx.y, seg = 0, walk = 0;
  if (p.segments > 1) {
    const int64_t lin = cuda::block_ticket(p.ticket), walks = p.B * p.H;
    seg = lin / walks, walk = lin % walks;
    h = walk % p.H, b = walk / p.H;
  }
  const int64_t grp = h / p.hpg;
  const int64_t c_lo = p.segments > 1 ? seg * p.seg_chunks : 0;
  const int64_t c_hi = p.segments > 1 ? min(p.nchunks, c_lo + p.seg_chunks) : p.nchunks;
  return {h, b, seg, walk, grp, c_lo, c_hi};
}

// Per chunk: scalars (v, cum by a block scan), C.S into the y accumulators (scaled by exp(cum_t)),
// W.x on top (C.B^T formed by mma from the shared rows, W built from its accumulators in
// registers, one exponential per weight), the epilogue (D skip, silu(z) gate, y stored), then
// the state update and its T copy for the next chunk's C.S. Loads run one phase ahead: the next
// chunk's C under the epilogue and the state update, its x and B under the next C.S.
template <class T, int kQ, int kN, bool kVec>
__global__ void __launch_bounds__(fused::kThreads, 1) ssd_fused_fwd_kernel(Fwd<T> p) {
  using namespace fused;
  using Lay = Smem<kQ, kN>;
  constexpr int kLdN = Lay::kLdN;
  constexpr int kR = kQ / 16;                 // 16-row tiles of a chunk
  constexpr int kPairs = kR / 2;              // balanced pairs of row tiles
  constexpr int kWpp = kWarps / kPairs;       // warps per pair: 1, 2, 4 (kQ = 256, 128, 64)
  constexpr int kDW = kD / kWpp;              // y columns per warp
  constexpr int kYT = kDW / 8;                // y n8 tiles per row tile
  constexpr int kSN = kN / 2, kST = kSN / 8;  // state columns per warp, their n8 tiles
  static_assert(kPairs * kWpp == kWarps && kYT % 2 == 0 && kST % 2 == 0);
  extern __shared__ __align__(16) unsigned char fused_smem[];
  T* xs = reinterpret_cast<T*>(fused_smem + Lay::x);
  T* cs = reinterpret_cast<T*>(fused_smem + Lay::c);
  T* bs = reinterpret_cast<T*>(fused_smem + Lay::b);
  T* ss = reinterpret_cast<T*>(fused_smem + Lay::s);
  float* cum = reinterpret_cast<float*>(fused_smem + Lay::cum);
  float* cum_lv = reinterpret_cast<float*>(fused_smem + Lay::lv);
  float* w3 = reinterpret_cast<float*>(fused_smem + Lay::w);
  float* tot = reinterpret_cast<float*>(fused_smem + Lay::tot);

  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, g = lane / 4, q4 = lane % 4;
  const auto [h, b, seg, walk, grp, c_lo, c_hi] = fused_walk(p);
  const int D = static_cast<int>(p.D), N = static_cast<int>(p.N);
  const float a2 = p.A.at(h) * static_cast<float>(fwd_mma::kLog2e);
  const float bias = p.has_bias ? p.bias.at(h) : 0.0f;
  const float* dskip = p.has_d ? p.Dv.p + h * p.Dv.s0 : nullptr;  // D of this head, [d * s1]

  // y roles
  const int pair = warp / kWpp, d0 = (warp % kWpp) * kDW;
  const int rt[2] = {pair, kR - 1 - pair};
  // state roles
  const int sd0 = 16 * (warp % 4), sn0 = (warp / 4) * kSN;

  const RowLoader<T, kQ, kN, kVec> c_rows(p.Cm, b, grp, N, tid), b_rows(p.Bm, b, grp, N, tid);
  const RowLoader<T, kQ, kD, kVec> x_rows(p.x, b, h, D, tid);
  auto rows_of = [&](int64_t t0) { return static_cast<int>(p.L - t0 < kQ ? p.L - t0 : kQ); };
  auto issue_c = [&](int64_t c) { c_rows.load(cs, kLdN, c * kQ, rows_of(c * kQ)); };
  auto issue_xb = [&](int64_t c) {
    x_rows.load(xs, kLdX, c * kQ, rows_of(c * kQ));
    b_rows.load(bs, kLdN, c * kQ, rows_of(c * kQ));
  };
  // The raw dt of this thread's token of chunk c (threads >= kQ hold nothing).
  auto dt_of = [&](int64_t c) {
    const int64_t t = c * kQ + tid;
    return tid < kQ && t < p.L ? to_float(p.dt.at(b, t, h)) : 0.0f;
  };

  // The state: f32 in the update warps' accumulators, T in ss for C.S. A later segment takes the
  // one its predecessor handed off (every thread its own accumulators, as float4s a warp-wide
  // 512-byte run apart), bit for bit what the uncut walk carries.
  float st[kST][4];
  auto handoff_at = [&](int64_t s, int j) {
    return reinterpret_cast<float4*>(p.handoff) +
           ((s * p.B * p.H + walk) * kST + j) * fused::kThreads + tid;
  };
  if (seg == 0) {
#pragma unroll
    for (int j = 0; j < kST; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int d = sd0 + g + 8 * (e / 2), n = sn0 + 8 * j + 2 * q4 + e % 2;
        st[j][e] = p.has_init && d < D && n < N ? p.init.at(b, h, d, n) : 0.0f;
      }
  } else {
    cuda::await_block(p.ready + (seg - 1) * p.B * p.H + walk, 1u);
#pragma unroll
    for (int j = 0; j < kST; ++j) {
      const float4 v = __ldcg(handoff_at(seg - 1, j));
      st[j][0] = v.x, st[j][1] = v.y, st[j][2] = v.z, st[j][3] = v.w;
    }
  }
  auto store_state_t = [&] {
#pragma unroll
    for (int j = 0; j < kST; ++j)
#pragma unroll
      for (int r = 0; r < 2; ++r)
        *reinterpret_cast<uint32_t*>(ss + (sd0 + g + 8 * r) * kLdN + sn0 + 8 * j + 2 * q4) =
            cuda::pack2<T>(st[j][2 * r], st[j][2 * r + 1]);
  };
  store_state_t();  // rows d >= D and columns n >= N stay zero: their x and B columns are zero

  if (c_lo < c_hi) {
    issue_c(c_lo);
    cuda::cp_async_commit();
    issue_xb(c_lo);
    cuda::cp_async_commit();
  }
  float dt_raw = c_lo < c_hi ? dt_of(c_lo) : 0.0f;

  for (int64_t c = c_lo; c < c_hi; ++c) {
    const int64_t t0 = c * kQ;
    const int K = rows_of(t0);  // tokens in this chunk
    // ---- scalars: v, cum (log2 units) by a block scan in a fixed order, the update weights
    float v = 0.0f, a = 0.0f;
    if (tid < K) {
      v = process_dt(dt_raw + bias, p.softplus, p.dt_min, p.dt_max).v;
      a = v * a2;
    }
    if (c + 1 < c_hi) dt_raw = dt_of(c + 1);
    float run = a;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const float up = __shfl_up_sync(0xffffffffu, run, o);
      if (lane >= o) run += up;
    }
    if (lane == 31) tot[warp] = run;
    __syncthreads();
    float before = 0.0f, last = 0.0f;
#pragma unroll
    for (int w = 0; w < kQ / 32; ++w) {
      const float tw = tot[w];
      before += w < warp ? tw : 0.0f;
      last += tw;
    }
    if (tid < kQ) {
      const float cl = before + run;  // equals `last` bit for bit at tid = kQ - 1
      cum[tid] = cl;
      // v >= 0 (dt_min >= 0): v = 0 gives +inf and a zero weight, as v_s * exp(..) would
      cum_lv[tid] = cl - log2_ftz(v);
      w3[tid] = v * exp2_ftz(last - cl);
    }
    cuda::cp_async_wait<1>();  // C of this chunk (its x and B may still be in flight)
    __syncthreads();           // C, the scalars and the state copy visible

    // ---- y = exp(cum_t) C_t . S
    float acc[2][kYT][4];
#pragma unroll
    for (int r = 0; r < 2; ++r)
#pragma unroll
      for (int j = 0; j < kYT; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[r][j][e] = 0.0f;
#pragma unroll 1
    for (int k0 = 0; k0 < kN; k0 += 16) {  // not unrolled: smaller code, 0.7% faster (ssd.md)
      uint32_t bf[kYT][2];
#pragma unroll
      for (int jp = 0; jp < kYT / 2; ++jp)
        cuda::ldmatrix_x4(cuda::smem_u32(ss + (d0 + 16 * jp + lane % 8 + (lane / 16) * 8) * kLdN +
                                         k0 + ((lane / 8) % 2) * 8),
                          bf[2 * jp][0], bf[2 * jp][1], bf[2 * jp + 1][0], bf[2 * jp + 1][1]);
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        uint32_t af[4];
        load_a_frag<T>(af, cs, kLdN, 16 * rt[r], k0, lane);
#pragma unroll
        for (int j = 0; j < kYT; ++j) cuda::mma16816<T>(acc[r][j], af, bf[j][0], bf[j][1]);
      }
    }
    float cl_t[2][2];
#pragma unroll
    for (int r = 0; r < 2; ++r)
#pragma unroll
      for (int u = 0; u < 2; ++u) {
        cl_t[r][u] = cum[16 * rt[r] + g + 8 * u];
        const float es = exp2_ftz(cl_t[r][u]);
#pragma unroll
        for (int j = 0; j < kYT; ++j) acc[r][j][2 * u] *= es, acc[r][j][2 * u + 1] *= es;
      }
    cuda::cp_async_wait<0>();  // x and B of this chunk
    __syncthreads();

    // ---- y += sum_{s<=t} W_ts x_s, W_ts = exp(cum_t - cum_s) v_s CB_ts. CB_ts = C_t . B_s is
    // formed here, 16 x 16 per step from the shared C and B rows, and its accumulators are the
    // A fragment of W.x as they stand (the m16n8 C layout of two n8 tiles is the m16k16 A layout).
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int i = rt[r];
      const int ta = 16 * i + g;
      uint32_t cf[kN / 16][4];  // this row tile's C, every k step
#pragma unroll
      for (int k = 0; k < kN / 16; ++k) load_a_frag<T>(cf[k], cs, kLdN, 16 * i, 16 * k, lane);
      // CB block (i, j): two chains per n8 tile (even and odd k steps), added at the end.
      auto cb_block = [&](int j, float(&out)[2][4]) {
        float part[2][2][4] = {};
#pragma unroll
        for (int k = 0; k < kN / 16; ++k) {
          uint32_t b0, b1, b2, b3;  // B rows s 16 j .. + 15 stored [s][n]: [n_out][k]
          cuda::ldmatrix_x4(cuda::smem_u32(bs + (16 * j + lane % 8 + (lane / 16) * 8) * kLdN +
                                           16 * k + ((lane / 8) % 2) * 8),
                            b0, b1, b2, b3);
          cuda::mma16816<T>(part[k % 2][0], cf[k], b0, b1);
          cuda::mma16816<T>(part[k % 2][1], cf[k], b2, b3);
        }
#pragma unroll
        for (int n = 0; n < 2; ++n)
#pragma unroll
          for (int e = 0; e < 4; ++e) out[n][e] = part[0][n][e] + part[1][n][e];
      };
      // Block (i, j) of W times x's rows 16 j .. + 15. Only the diagonal block (kDiag) needs the
      // mask s <= t: without it the off-diagonal blocks' weights are branch-free arithmetic
      // (rows t >= K are never stored).
      auto wx = [&]<bool kDiag>(int j, const float(&cb)[2][4]) {
        const int s = 16 * j + 2 * q4;
        // v_s folded into the exponent: exp2(cum_t - (cum_s - log2 v_s)) = exp(..) v_s
        const float2 c0 = *reinterpret_cast<const float2*>(cum_lv + s);
        const float2 c8 = *reinterpret_cast<const float2*>(cum_lv + s + 8);
        auto weight = [&](int u, float c_, float cb_, int col) {  // row ta + 8 u, column col
          const float w = exp2_ftz(cl_t[r][u] - c_) * cb_;
          return !kDiag || col <= ta + 8 * u ? w : 0.0f;
        };
        uint32_t af[4];
        af[0] = cuda::pack2<T>(weight(0, c0.x, cb[0][0], s), weight(0, c0.y, cb[0][1], s + 1));
        af[1] = cuda::pack2<T>(weight(1, c0.x, cb[0][2], s), weight(1, c0.y, cb[0][3], s + 1));
        af[2] = cuda::pack2<T>(weight(0, c8.x, cb[1][0], s + 8), weight(0, c8.y, cb[1][1], s + 9));
        af[3] = cuda::pack2<T>(weight(1, c8.x, cb[1][2], s + 8), weight(1, c8.y, cb[1][3], s + 9));
#pragma unroll
        for (int jp = 0; jp < kYT / 2; ++jp) {
          uint32_t b0, b1, b2, b3;
          cuda::ldmatrix_x4_trans(
              cuda::smem_u32(xs + (16 * j + lane % 16) * kLdX + d0 + 8 * (2 * jp + lane / 16)), b0,
              b1, b2, b3);
          cuda::mma16816<T>(acc[r][2 * jp], af, b0, b1);
          cuda::mma16816<T>(acc[r][2 * jp + 1], af, b2, b3);
        }
      };
      float nxt[2][4];
      cb_block(0, nxt);
      for (int j = 0; j <= i; ++j) {
        float cb[2][4];
#pragma unroll
        for (int n = 0; n < 2; ++n)
#pragma unroll
          for (int e = 0; e < 4; ++e) cb[n][e] = nxt[n][e];
        if (j < i) {
          cb_block(j + 1, nxt);  // independent of this block's weights and W.x
          wx.template operator()<false>(j, cb);
        } else {
          wx.template operator()<true>(j, cb);
        }
      }
    }
    __syncthreads();  // every warp is done with C: the next chunk's comes in under the rest
    if (c + 1 < c_hi) issue_c(c + 1);
    cuda::cp_async_commit();

    // ---- epilogue: y = acc + D x, times silu(z)
#pragma unroll
    for (int r = 0; r < 2; ++r)
#pragma unroll
      for (int u = 0; u < 2; ++u) {
        const int t = 16 * rt[r] + g + 8 * u;
        if (t >= K) continue;
        const int64_t tok = t0 + t;
        T* yr = p.y.p + b * p.y.s0 + tok * p.y.s1 + h * p.y.s2;
        const T* zr = p.has_z ? p.z.p + b * p.z.s0 + tok * p.z.s1 + h * p.z.s2 : nullptr;
        const T* xr = xs + t * kLdX;
#pragma unroll
        for (int j = 0; j < kYT; ++j) {
          const int d = d0 + 8 * j + 2 * q4;
          if (d >= D) continue;
          const bool two = d + 1 < D;
          float o[2] = {acc[r][j][2 * u], acc[r][j][2 * u + 1]};
          if (p.has_d) {
            o[0] += dskip[d * p.Dv.s1] * to_float(xr[d]);
            if (two) o[1] += dskip[(d + 1) * p.Dv.s1] * to_float(xr[d + 1]);
          }
          if (p.has_z) {  // silu with the fast reciprocal and exponential (no slow-path calls)
            const float z0 = to_float(zr[d * p.z.s3]);
            o[0] *= __fdividef(z0, 1.0f + __expf(-z0));
            if (two) {
              const float z1 = to_float(zr[(d + 1) * p.z.s3]);
              o[1] *= __fdividef(z1, 1.0f + __expf(-z1));
            }
          }
          if constexpr (kVec) {
            *reinterpret_cast<uint32_t*>(yr + d) = cuda::pack2<T>(o[0], o[1]);
          } else {
            yr[d * p.y.s3] = from_float<T>(o[0]);
            if (two) yr[(d + 1) * p.y.s3] = from_float<T>(o[1]);
          }
        }
      }

    // ---- S <- exp(cum_last) S + sum_s (w_s x_s)^T B_s, w_s = exp(cum_last - cum_s) v_s
    {
      const float decay = exp2_ftz(cum[kQ - 1]);
#pragma unroll
      for (int j = 0; j < kST; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) st[j][e] *= decay;
      const int mi = lane / 8;
      for (int k0 = 0; k0 < K; k0 += 16) {
        uint32_t af[4];  // A[d][s] = x[s][d]: read transposed, then scaled by w_s
        cuda::ldmatrix_x4_trans(
            cuda::smem_u32(xs + (k0 + (mi / 2) * 8 + lane % 8) * kLdX + sd0 + (mi % 2) * 8), af[0],
            af[1], af[2], af[3]);
        const float2 wlo = *reinterpret_cast<const float2*>(w3 + k0 + 2 * q4);
        const float2 whi = *reinterpret_cast<const float2*>(w3 + k0 + 2 * q4 + 8);
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float2 w = e < 2 ? wlo : whi;
          const T* xe = reinterpret_cast<const T*>(&af[e]);
          af[e] = cuda::pack2<T>(to_float(xe[0]) * w.x, to_float(xe[1]) * w.y);
        }
#pragma unroll
        for (int jp = 0; jp < kST / 2; ++jp) {
          uint32_t b0, b1, b2, b3;
          cuda::ldmatrix_x4_trans(
              cuda::smem_u32(bs + (k0 + lane % 16) * kLdN + sn0 + 8 * (2 * jp + lane / 16)), b0, b1,
              b2, b3);
          cuda::mma16816<T>(st[2 * jp], af, b0, b1);
          cuda::mma16816<T>(st[2 * jp + 1], af, b2, b3);
        }
      }
    }
    // The next chunk's C.S reads ss: every warp passed the barrier after this chunk's C.S.
    store_state_t();
    __syncthreads();  // x and B free, the new state copy visible
    if (c + 1 < c_hi) issue_xb(c + 1);
    cuda::cp_async_commit();
  }
  cuda::cp_async_wait<0>();
  if (seg + 1 < p.segments) {  // hand the state to the next segment
#pragma unroll
    for (int j = 0; j < kST; ++j)
      __stcg(handoff_at(seg, j), make_float4(st[j][0], st[j][1], st[j][2], st[j][3]));
    cuda::publish_block(p.ready + seg * p.B * p.H + walk, 1u);
    return;
  }
  if (p.has_fin)
#pragma unroll
    for (int j = 0; j < kST; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int d = sd0 + g + 8 * (e / 2), n = sn0 + 8 * j + 2 * q4 + e % 2;
        if (d < D && n < N) p.fin.at(b, h, d, n) = st[j][e];
      }
}

// Host side. The shared memory of the instantiation launch_fused picks for (chunk, N).
inline size_t fused_smem_bytes(int64_t chunk, int64_t n) {
  auto of = [&]<int kN>() {
    return chunk == 256   ? fused::Smem<256, kN>::total
           : chunk == 128 ? fused::Smem<128, kN>::total
                          : fused::Smem<64, kN>::total;
  };
  return n <= 64 ? of.template operator()<64>() : of.template operator()<128>();
}
// What the fused kernel takes (16-bit data is the registration's business).
// The one-pass walks' shapes (fused_mma and fused_wgmma_sm90a): one block per (b, h) of a dense
// batch on the grid, D <= 64 and N <= 128 so that a block holds the state on chip.
inline bool fused_walk_fits(const ssd::Problem& p) {
  return !p.varlen() && p.head_dim <= fused::kD && p.state_dim <= 128 && p.batch <= kMaxGridYZ &&
         p.heads <= (int64_t{1} << 31) - 1;
}
inline bool fused_fits(const ssd::Problem& p, const DeviceCaps& caps) {
  const auto smem = static_cast<int64_t>(fused_smem_bytes(p.chunk_size, p.state_dim));
  return fused_walk_fits(p) && smem <= caps.smem_per_block_optin;
}
// Where it runs ahead of the multi-launch forward: a block per (b, h) and nothing else to spread
// over the chunks, so it needs at least one block per SM. Below that the chunk-parallel
// chunked_mma_fastpass keeps every SM busy (fused_mma's time is the chunk count times a chunk's
// latency, about 13-16 us per 256-token chunk on the H200, whatever B * H is).
inline bool fused_ranked_ahead_fits(const ssd::Problem& p, const DeviceCaps& caps) {
  return fused_fits(p, caps) && p.batch * p.heads >= caps.sm_count;
}
template <class T, int kQ, int kN>
Status launch_fused(const Fwd<T>& p, bool vec, cudaStream_t st) {
  const dim3 grid = p.segments > 1 ? dim3(static_cast<unsigned>(p.segments * p.B * p.H))
                                   : dim3(static_cast<unsigned>(p.H), static_cast<unsigned>(p.B));
  return cuda::launch_with_smem(
      "ssd_forward", "ssd_fused_fwd_kernel",
      vec ? ssd_fused_fwd_kernel<T, kQ, kN, true> : ssd_fused_fwd_kernel<T, kQ, kN, false>, grid,
      fused::kThreads, fused::Smem<kQ, kN>::total, st, p);
}
template <class T, int kQ>
Status launch_fused(const Fwd<T>& p, bool vec, cudaStream_t st) {
  return p.N <= 64 ? launch_fused<T, kQ, 64>(p, vec, st) : launch_fused<T, kQ, 128>(p, vec, st);
}

// How the registered entries cut the walks: never (fused_mma), by the wave rule
// (fused_mma_ranked_ahead, the default), or into at least two segments (fused_mma_split, by name:
// tests and A/B runs).
enum class FusedCut { none, rule, forced };

// Blocks that run at once: one per SM (255 registers x 256 threads, __launch_bounds__(256, 1)).
template <FusedCut kCut>
int fused_segment_count(const ssd::Problem& p, const DeviceCaps& caps) {
  if constexpr (kCut == FusedCut::none) return 1;
  return ssd_segments::fused_segments(p.batch * p.heads, p.nchunks, caps.sm_count,
                                      kCut == FusedCut::forced ? 2 : 1);
}
// The workspace of a cut walk: the ticket and ready flags, then the handed-off states (room for
// the N <= 128 instantiation's 32 floats a thread, 256-byte aligned).
struct FusedLayout {
  size_t flags_bytes, states_offset, total;
};
inline FusedLayout fused_layout(const ssd::Problem& p, int segments) {
  if (segments <= 1) return {0, 0, 0};
  const size_t handoffs = static_cast<size_t>(p.batch * p.heads) * (segments - 1);
  const size_t flags = sizeof(unsigned) * (1 + handoffs);
  const size_t at = (flags + 255) / 256 * 256;
  return {flags, at, at + handoffs * fused::kThreads * 32 * sizeof(float)};
}
template <FusedCut kCut>
size_t fused_workspace(const ssd::Problem& p, const DeviceCaps& caps) {
  return fused_layout(p, fused_segment_count<kCut>(p, caps)).total;
}

// Cuts p's walks as kCut says: the segment count, and where a cut walk finds its ticket, ready
// flags and hand-offs in the workspace (the flags zeroed on the stream). Shared by fused_mma and
// fused_wgmma_sm90a (the same workspace layout).
template <FusedCut kCut, class T>
Status cut_walks(Fwd<T>& p, const LaunchContext& ctx, const ssd::Problem& pr,
                 std::string_view what) {
  p.segments = fused_segment_count<kCut>(pr, ctx.stream.caps());
  if (p.segments <= 1) return {};
  const FusedLayout l = fused_layout(pr, p.segments);
  auto* ws = static_cast<unsigned char*>(ctx.workspace.data);
  p.seg_chunks = ssd_segments::chunks_per_segment(pr.nchunks, p.segments);
  p.ticket = reinterpret_cast<unsigned*>(ws);
  p.ready = p.ticket + 1;
  p.handoff = reinterpret_cast<float*>(ws + l.states_offset);
  return cuda::check("ssd_forward", what,
                     cudaMemsetAsync(ws, 0, l.flags_bytes, cuda::stream_of(ctx)));
}

template <class T, FusedCut kCut>
Status forward_fused(const LaunchContext& ctx, const ssd::Problem& pr,
                     const SsdForwardOp::Arguments& a) {
  Fwd<T> p = forward_params<T>(pr, a);
  if (pr.batch * pr.heads == 0) return {};
  const cudaStream_t st = cuda::stream_of(ctx);
  StageClock clock("ssd_forward", "fused_mma", st);
  BARACUDA_TRY(cut_walks<kCut>(p, ctx, pr, "cudaMemsetAsync (fused_mma's segment flags)"));
  // 16-byte copies where every operand the kernel moves by vectors allows them (z goes by
  // elements either way; y by 4-byte pairs).
  const bool vec = pr.head_dim % 8 == 0 && pr.state_dim % 8 == 0 && rows16(p.x) && rows16(p.Bm) &&
                   rows16(p.Cm) && rows16(p.y);
  switch (pr.chunk_size) {
    case 64:
      BARACUDA_TRY((launch_fused<T, 64>(p, vec, st)));
      break;
    case 128:
      BARACUDA_TRY((launch_fused<T, 128>(p, vec, st)));
      break;
    default:
      BARACUDA_TRY((launch_fused<T, 256>(p, vec, st)));
  }
  clock.mark("fused");
  return {};
}

}  // namespace baracuda::ssd_cuda
