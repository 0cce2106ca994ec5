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
constexpr double kLog2e = 1.4426950408889634;

// The widest row / column decay exponent (log2 units) that weights factored through one reference
// token take (chunk_out's and bwd_dx_mma_kernel's): the scaled weights W / rowf must keep T's
// precision (f16: stay normal for weights down to ~2^-4; bf16 has f32's range) and a factor that
// underflows must stand for a negligible weight (<= 2^(kFactorSafe - 126)). Wider decays take the
// direct form, one exponential per weight.
template <class T>
constexpr float kFactorSafe = std::is_same_v<T, __half> ? 8.0f : 64.0f;

__host__ __device__ inline size_t round16(size_t bytes) {
  return (bytes + 15) / 16 * 16;
}
// N rounded up to the 16-wide k step of the products (the extra columns are zero-filled).
__host__ __device__ inline int64_t k16(int64_t n) {
  return (n + 15) / 16 * 16;
}

// ---- chunk_out: y_t = exp(cum_t) C_t . S_c + sum_{s <= t} exp(cum_t - cum_s) CB_ts v_s x_s
namespace out {
constexpr int kWarps = 4, kThreads = 32 * kWarps, kStages = 2;
struct Layout {
  int64_t ldc, ldcb;  // pitches of the C tile (N rounded to 16, + 8) and the CB rows (cs + 8)
  size_t cl, dts, colf, raw, c_tile, cb_rows, ring, total;  // byte offsets (total: the size)
};
__host__ __device__ inline Layout layout(int64_t N, int64_t cs) {
  Layout l{};
  l.ldc = k16(N) + 8;
  l.ldcb = cs + 8;  // = 8 mod 32 floats: a warp's float2 reads of 8 rows hit distinct banks
  l.cl = 0;
  l.dts = l.cl + sizeof(float) * 256;
  l.colf = l.dts + sizeof(float) * 256;
  l.raw = l.colf + sizeof(float) * 256;  // the next head's cum (f64) and dt, as loaded
  l.c_tile = l.raw + (sizeof(double) + sizeof(float)) * 256;
  l.cb_rows = l.c_tile + round16(sizeof(uint16_t) * kTile * static_cast<size_t>(l.ldc));
  l.ring = l.cb_rows + sizeof(float) * kTile * static_cast<size_t>(l.ldcb);
  l.total = l.ring + kSlotBytes * kStages;
  return l;
}
}  // namespace out

// ---- chunk_state: S_c[d][n] = sum_s (exp(cum_last - cum_s) v_s x_s[d]) B_s[n]
namespace state {
constexpr int kWarps = 8, kThreads = 32 * kWarps;
constexpr int kNw = 128;  // n columns per block: warps 0-3 and 4-7 take 64 each
struct Layout {
  int64_t ldb;                    // pitch of the B tile
  size_t b_tile, x_slots, total;  // byte offsets (total: the size)
};
__host__ __device__ inline Layout layout(int64_t N, int64_t cs) {
  Layout l{};
  const int64_t nw = k16(N) < kNw ? k16(N) : kNw;
  l.ldb = nw + 8;
  l.b_tile = 0;
  l.x_slots = l.b_tile + round16(sizeof(uint16_t) * static_cast<size_t>(cs * l.ldb));
  l.total = l.x_slots + 2 * kSlotBytes;
  return l;
}
}  // namespace state
}  // namespace fwd_mma

// A warp's A fragment of one 16-deep k step: rows m0 .. m0 + 15 of a 16-bit [m][k] tile at pitch
// lda, columns k0 .. k0 + 15.
template <class T>
__device__ __forceinline__ void load_a_frag(uint32_t (&a)[4], const T* A, int lda, int m0, int k0,
                                            int lane) {
  cuda::ldmatrix_x4(cuda::smem_u32(A + (m0 + lane % 16) * lda + k0 + (lane / 16) * 8), a[0], a[1],
                    a[2], a[3]);
}
// One 16-deep k step of a warp's 16 x 64 product with B stored [n][k] (16-bit rows n 0 .. 63 at
// pitch ldb, k columns from k0): acc += a . B.
template <class T>
__device__ __forceinline__ void mma_k16_bnk(float (&acc)[8][4], const uint32_t (&a)[4], const T* B,
                                            int ldb, int k0, int lane) {
#pragma unroll
  for (int jp = 0; jp < 4; ++jp) {
    uint32_t b0, b1, b2, b3;
    cuda::ldmatrix_x4(cuda::smem_u32(B + (16 * jp + lane % 8 + (lane / 16) * 8) * ldb + k0 +
                                     ((lane / 8) % 2) * 8),
                      b0, b1, b2, b3);
    cuda::mma16816<T>(acc[2 * jp], a, b0, b1);
    cuda::mma16816<T>(acc[2 * jp + 1], a, b2, b3);
  }
}

// The same with B stored [k][n] (16-bit rows k0 .. k0 + 15 at pitch ldb, n columns 0 .. 63),
// read transposed; only the first npairs 16-column pairs.
template <class T>
__device__ __forceinline__ void mma_k16_bkn(float (&acc)[8][4], const uint32_t (&a)[4], const T* B,
                                            int ldb, int k0, int n0, int lane, int npairs = 4) {
#pragma unroll
  for (int jp = 0; jp < 4; ++jp) {
    if (jp >= npairs) break;
    uint32_t b0, b1, b2, b3;
    cuda::ldmatrix_x4_trans(
        cuda::smem_u32(B + (k0 + lane % 16) * ldb + n0 + 8 * (2 * jp + lane / 16)), b0, b1, b2, b3);
    cuda::mma16816<T>(acc[2 * jp], a, b0, b1);
    cuda::mma16816<T>(acc[2 * jp + 1], a, b2, b3);
  }
}

// One warp's 16 x 64 tile product over a 64-deep shared stage: acc (rows m0 .. m0 + 15, columns
// n0 .. n0 + 63, eight m16n8 accumulators) += A . B, A 16-bit [m][k] at pitch lda (kTransA: stored
// [k][m], read transposed), B 16-bit [k][n] at pitch ldb; only the first npairs 16-column pairs.
template <class T, bool kTransA>
__device__ __forceinline__ void warp_mma_64(float (&acc)[8][4], const T* A, int lda, int m0,
                                            const T* B, int ldb, int n0, int npairs, int lane) {
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    uint32_t a[4];
    if constexpr (kTransA) {  // matrix l / 8 covers k 8 (l / 16).., m 8 ((l / 8) % 2)..
      const int mi = lane / 8;
      cuda::ldmatrix_x4_trans(
          cuda::smem_u32(A + (16 * kk + (mi / 2) * 8 + lane % 8) * lda + m0 + (mi % 2) * 8), a[0],
          a[1], a[2], a[3]);
    } else {
      load_a_frag<T>(a, A, lda, m0, 16 * kk, lane);
    }
    mma_k16_bkn<T>(acc, a, B, ldb, 16 * kk, n0, lane, npairs);
  }
}

// A warp's 16 x 64 A operand (m16n8k16 fragments, four 16-deep k steps) built in registers:
// weight2(kk, e2, r, col, w2) gives the pair at columns col, col + 1 of the warp's row g + 8 r,
// rounded here to T.
template <class T, class Weight2>
__device__ __forceinline__ void fill_a_fragments(uint32_t (&wa)[4][4], int col0, int q4,
                                                 Weight2&& weight2) {
#pragma unroll
  for (int kk = 0; kk < 4; ++kk)
#pragma unroll
    for (int e2 = 0; e2 < 4; ++e2) {
      const int r = e2 & 1, col = col0 + 16 * kk + 2 * q4 + (e2 >= 2 ? 8 : 0);
      float w2[2];
      weight2(kk, e2, r, col, w2);
      wa[kk][e2] = cuda::pack2<T>(w2[0], w2[1]);
    }
}

// Runs a weight builder templated <kDirect, kDiag> in the form a stage needs: the direct form (its
// mask on every tile), or the factored one with or without the diagonal mask. One branch per
// stage; each form a straight block.
template <class Build>
__device__ __forceinline__ void build_weights(Build&& build, bool direct, bool diag) {
  if (direct)
    build.template operator()<true, true>();
  else if (diag)
    build.template operator()<false, true>();
  else
    build.template operator()<false, false>();
}

// 2^x by the hardware approximation, results below f32's normal range flushed to zero: the weights
// it forms are rounded to 16 bits and one that small stands for a negligible term.
__device__ __forceinline__ float exp2_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
// log2 by the hardware approximation (absolute error ~2^-22; 0 gives -inf), for factors folded
// into an exponent that exp2_ftz then takes.
__device__ __forceinline__ float log2_ftz(float x) {
  float y;
  asm("lg2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// Register staging of 16-byte pieces: a read-only load (zeros where the piece lies outside), and
// eight values rounded to T after a common scale as one 16-byte shared store.
__device__ __forceinline__ uint4 ldg16(const void* src, bool in) {
  return in ? __ldg(reinterpret_cast<const uint4*>(src)) : make_uint4(0, 0, 0, 0);
}
template <class T>
__device__ __forceinline__ void unpack8(const uint4& v, float (&f)[8]) {
  const T* e = reinterpret_cast<const T*>(&v);
#pragma unroll
  for (int q = 0; q < 8; ++q) f[q] = to_float(e[q]);
}
__device__ __forceinline__ void unpack8_f32(const uint4 (&v)[2], float (&f)[8]) {
  const float* e = reinterpret_cast<const float*>(v);
#pragma unroll
  for (int q = 0; q < 8; ++q) f[q] = e[q];
}
template <class T>
__device__ __forceinline__ void store8(T* dst, const float (&f)[8], float w) {
  *reinterpret_cast<uint4*>(dst) =
      make_uint4(cuda::pack2<T>(f[0] * w, f[1] * w), cuda::pack2<T>(f[2] * w, f[3] * w),
                 cuda::pack2<T>(f[4] * w, f[5] * w), cuda::pack2<T>(f[6] * w, f[7] * w));
}

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
bool mma_shape_fits(const Common<T>& p) {
  return sizeof(T) == 2 && p.N % 8 == 0 && p.D % 8 == 0 && p.cs <= 256;
}
template <class T>
bool state_mma_fits(const Fwd<T>& p) {  // chunk_state
  return mma_shape_fits(p) && rows16(p.x) && rows16(p.Bm);
}
template <class T>
bool fwd_mma_fits(const Fwd<T>& p) {  // chunk_state and chunk_out
  return state_mma_fits(p) && rows16(p.Cm) && rows16(p.y) && (!p.has_z || rows16(p.z));
}

// One block of four warps per (chunk, 64 tokens t, 64 columns d, b, hb heads of one group); warp w
// owns tokens t_lo + 16 w .. + 15 and all 64 columns (eight m16n8 accumulators). Per head a flat
// sequence of 64-deep stages: ceil(N / 64) of the state product C_t . S_c^T (the C tile loaded
// once per block, the 16-bit states p.st_t by the ring), then the intra-chunk product W . x for
// each s tile s0 <= t_lo (x by the ring).
// The weights factor through one reference per head and block, ref = cum at the t tile's last
// token: W_ts = rowf_t * (colf_s CB_ts) with rowf_t = exp(cum_t - ref) and colf_s =
// exp(ref - cum_s) v_s (64 + cs exponentials per head instead of one per weight). The A fragments
// take colf_s CB_ts, from the block's CB rows (f32, loaded into shared memory once for all its
// heads: the per-head L2 reads of CB cost a quarter of the kernel's time), rowf_t multiplies the
// accumulators once at the end, and the state product enters as acc * exp(ref) so that the end's
// rowf_t makes it exp(cum_t). When the head decays, colf <= 1 and rowf <= 2^(the tile's own decay);
// a head whose exponents exceed kFactorSafe<T> forms every weight directly, exp(cum_t - cum_s) v_s
// CB_ts.
template <class T>
__global__ void __launch_bounds__(fwd_mma::out::kThreads, 2) chunk_out_mma_kernel(Fwd<T> p) {
  using namespace fwd_mma;
  using out::kStages;
  constexpr int kNT = out::kThreads;
  extern __shared__ __align__(16) unsigned char fwd_out_smem[];
  const out::Layout lay = out::layout(p.N, p.cs);
  float* cl = reinterpret_cast<float*>(fwd_out_smem + lay.cl);      // cum * log2(e), this head
  float* dts = reinterpret_cast<float*>(fwd_out_smem + lay.dts);    // v, this head
  float* colf = reinterpret_cast<float*>(fwd_out_smem + lay.colf);  // column factors, this head
  T* Cs = reinterpret_cast<T*>(fwd_out_smem + lay.c_tile);
  float* CBs =
      reinterpret_cast<float*>(fwd_out_smem + lay.cb_rows);  // CB rows t_lo.., s < t_lo + 64
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
  const int bw = static_cast<int>(k16(p.N));
  const int nk = (bw + kTile - 1) / kTile;  // state-product stages
  const int S = nk + t_lo / kTile + 1;      // + the s tiles s0 <= t_lo
  const int total = static_cast<int>(p.hb) * S;
  const int t_ref = min(t_lo + kTile, K) - 1;  // the reference token of the factored weights
  const float* cbt = p.cb + ((b * G + grp) * p.nchunks + c) * p.cs * p.cs;

  // ---- producer. Thread tid copies rows cr + 16 k (k < 4) of each 64 x 64 tile, 8 columns from
  // cc; its source pointers advance per head and stage (no divisions in the loop).
  const int cr = tid / 8, cc = tid % 8 * 8;
  const int64_t st_head = p.nchunks * p.D * p.N;
  const T* st_src = p.st_t + ((b * p.H + h0) * p.nchunks + c) * p.D * p.N + (d0 + cr) * p.N + cc;
  const T* x_src = &p.x.at(b, tb + cr, h0, 0) + d0 + cc;
  const bool d_in = d0 + cc < p.D;
  double* cum_raw = reinterpret_cast<double*>(fwd_out_smem + lay.raw);
  float* dt_raw = reinterpret_cast<float*>(cum_raw + 256);
  int ih = 0, ij = 0;  // the next stage to issue: head, stage
  auto issue = [&](int i) {
    if (i >= total) return;
    if (ij == 0) {  // the head's cum and dt, read at its first stage: the previous head's reads
                    // (its first stage, S >= 2 stages back) are behind a barrier
      const int64_t ob = (b * p.H + h0 + ih) * p.Lpad + tb;
      for (int k = tid; k < cs / 2; k += kNT) cp_async16(cum_raw + 2 * k, p.cum + ob + 2 * k);
      for (int k = tid; k < cs / 4; k += kNT) cp_async16(dt_raw + 4 * k, p.dtp + ob + 4 * k);
    }
    if (i == 0) {  // once per block: the C tile (columns [N, bw) zero for the last k16
                   // step) and the group's CB rows of this t tile, s < t_lo + 64 (all written)
      for (int idx = tid; idx < kTile * (bw / 8); idx += kNT) {
        const int r = idx / (bw / 8), col = idx % (bw / 8) * 8;
        const bool in = t_lo + r < K && col < p.N;
        cp_async16(Cs + r * lay.ldc + col, in ? &p.Cm.at(b, tb + t_lo + r, grp, col) : p.Cm.p,
                   in ? 16 : 0);
      }
      const int w4 = (t_lo + kTile) / 4;
      for (int idx = tid; idx < kTile * w4; idx += kNT) {
        const int r = idx / w4, col = idx % w4 * 4;
        cp_async16(CBs + r * lay.ldcb + col, cbt + (t_lo + r) * cs + col);
      }
    }
    T* dst = reinterpret_cast<T*>(ring + (i % kStages) * kSlotBytes) + cr * kLd16 + cc;
    if (ij < nk) {  // the states entering the chunk, rows d0.., columns 64 ij.. ([d][n], T)
      const T* src = st_src + ih * st_head + ij * kTile;
      const bool n_in = ij * kTile + cc < p.N;
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const bool in = n_in && d0 + cr + 16 * k < p.D;
        cp_async16(dst + 16 * k * kLd16, in ? src + 16 * k * p.N : p.st_t, in ? 16 : 0);
      }
    } else {  // x rows s0.., columns d0..
      const int s0 = (ij - nk) * kTile;
      const T* src = x_src + ih * p.x.s2 + s0 * p.x.s1;
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const bool in = d_in && s0 + cr + 16 * k < K;
        cp_async16(dst + 16 * k * kLd16, in ? src + 16 * k * p.x.s1 : p.x.p, in ? 16 : 0);
      }
    }
    if (++ij == S) ij = 0, ++ih;
  };

  // ---- per-thread state: rows trow[0] = t_lo + 16 warp + g and trow[1] = trow[0] + 8
  const int trow[2] = {t_lo + 16 * warp + g, t_lo + 16 * warp + g + 8};
  float acc[8][4];
  float cl_t[2] = {0.0f, 0.0f}, rowf[2] = {1.0f, 1.0f}, eref = 0.0f;
  bool direct = false;  // this head's weights in the direct form

  int hi = 0, j = 0;  // the stage being computed: head, stage
  // One call site per helper (the loop's first kStages - 1 iterations only issue): fewer
  // instruction-cache misses than an unrolled prologue (see bwd_dx_mma_kernel).
  for (int it = 0; it < total + kStages - 1; ++it) {
    const bool compute = it >= kStages - 1;
    if (compute) {
      cp_async_wait<kStages - 2>();
      __syncthreads();  // this stage visible; every thread is done with the slot issue refills
    }
    issue(it);
    cp_async_commit();
    if (!compute) continue;
    const int i = it - (kStages - 1);
    const int64_t h = h0 + hi;
    const T* slot = reinterpret_cast<const T*>(ring + (i % kStages) * kSlotBytes);
    if (j == 0) {  // a new head: its scalars (the previous head's last reads were before the
                   // barrier above)
      const float ref = static_cast<float>(cum_raw[t_ref] * kLog2e);
      bool wide = false;
      for (int t = tid; t < cs; t += kNT) {
        const float v = static_cast<float>(cum_raw[t] * kLog2e), dt = dt_raw[t];
        cl[t] = v, dts[t] = dt;
        if (t <= t_ref) {
          colf[t] = exp2_ftz(ref - v) * dt;
          // columns: colf <= 2^kFactorSafe; rows of this tile: rowf too
          wide =
              wide || !(ref - v <= kFactorSafe<T>) || (t >= t_lo && !(v - ref <= kFactorSafe<T>));
        }
      }
      direct = __syncthreads_or(wide);
      eref = direct ? 1.0f : exp2f(ref);
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        cl_t[r] = cl[trow[r]];
        rowf[r] = direct ? 1.0f : exp2f(cl_t[r] - ref);
      }
#pragma unroll
      for (int j8 = 0; j8 < 8; ++j8)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[j8][e] = 0.0f;
    }
    const int s0 = (j - nk) * kTile;  // the s tile of a W stage (j >= nk)
    uint32_t wa[4][4];
    // W for this s tile, rounded to T; kDirect: every weight's own exponential; kDiag: the mask
    // s <= t. Straight blocks behind one branch per stage (a branch per weight pair, which the
    // compiler makes of an inline mask, cost more than the weights).
    auto build_w = [&]<bool kDirect, bool kDiag>() {
      fill_a_fragments<T>(wa, s0, q4, [&](int, int, int r, int s, float(&w2)[2]) {
        const float2 cb =
            *reinterpret_cast<const float2*>(CBs + (16 * warp + g + 8 * r) * lay.ldcb + s);
        if constexpr (!kDirect) {
          const float2 f = *reinterpret_cast<const float2*>(colf + s);
          w2[0] = f.x * cb.x;
          w2[1] = f.y * cb.y;
        } else {
          w2[0] = exp2_ftz(cl_t[r] - cl[s]) * dts[s] * cb.x;
          w2[1] = exp2_ftz(cl_t[r] - cl[s + 1]) * dts[s + 1] * cb.y;
        }
        if constexpr (kDiag) {  // rows t >= K are never stored (nor their CB rows written)
          w2[0] = s <= trow[r] ? w2[0] : 0.0f;
          w2[1] = s + 1 <= trow[r] ? w2[1] : 0.0f;
        }
      });
    };
    if (j >= nk) build_weights(build_w, direct, s0 == t_lo);
    if (j < nk) {
      // acc[t][d] += sum_n C[t][n] S[d][n] over n in [64 j, 64 j + 64)
      const int left = (bw - j * kTile) / 16;
      const int ksteps = left < 4 ? left : 4;
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        if (kk >= ksteps) break;
        uint32_t a[4];
        load_a_frag<T>(a, Cs, static_cast<int>(lay.ldc), 16 * warp, j * kTile + 16 * kk, lane);
        mma_k16_bnk<T>(acc, a, slot, kLd16, 16 * kk, lane);  // S rows d: B stored [n][k]
      }
      if (j == nk - 1)  // the state enters decayed by exp(cum_t) = eref * rowf_t (direct: es_t)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const float es = direct ? exp2f(cl_t[r]) : eref;
#pragma unroll
          for (int j8 = 0; j8 < 8; ++j8) acc[j8][2 * r] *= es, acc[j8][2 * r + 1] *= es;
        }
    } else {
      // acc[t][d] += sum_s W[t][s] x[s][d] over this s tile
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) mma_k16_bkn<T>(acc, wa[kk], slot, kLd16, 16 * kk, 0, lane);
    }
    if (j == S - 1) {
      // The head's epilogue: y = (rowf acc + D x) * silu(z). The slot holds the diagonal tile's
      // x, which are this block's own rows.
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
          float o[2] = {rowf[r] * acc[j8][2 * r], rowf[r] * acc[j8][2 * r + 1]};
          if (p.has_d)
#pragma unroll
            for (int u = 0; u < 2; ++u) o[u] += p.Dv.at(h, d0 + dc + u) * to_float(xr[dc + u]);
          if (p.has_z) {
            const uint32_t zz = __ldg(reinterpret_cast<const unsigned int*>(zr + dc));
            const T* z2 = reinterpret_cast<const T*>(&zz);
#pragma unroll
            for (int u = 0; u < 2; ++u) {  // silu, with the fast reciprocal (no slow-path call)
              const float zf = to_float(z2[u]);
              o[u] *= __fdividef(zf, 1.0f + __expf(-zf));
            }
          }
          *reinterpret_cast<uint32_t*>(yr + dc) = cuda::pack2<T>(o[0], o[1]);
        }
      }
    }
    if (++j == S) j = 0, ++hi;
  }
  cp_async_wait<0>();
}

// The per-chunk outer-product sums on mma.sync: out[d][n] = sum_t (w_t a_t[d]) b_t[n] over a
// chunk's tokens, per head, b the head's group's B or C. kToEnd: w_t = exp(cum_last - cum_t) v_t
// (chunk_state: a = x, b = B, out = the chunk states), else w_t = exp(cum_t) (the backward's U_c:
// a = dy' (dy, or the f32 dy * silu(z) workspace), b = C, out = gst). S: a's element type.
template <class T, class S>
struct OuterArgs {
  const S* a;  // element (b, t, h, d) at a + b a_b + t a_t + h a_h + d
  int64_t a_b, a_t, a_h;
  V4<const T> bm;
  const double* cum;  // [B*H][Lpad]
  const float* dtp;   // [B*H][Lpad]
  float* out;         // [B*H][nchunks][D][N]
  int64_t L, H, D, N, hpg, cs, nchunks, Lpad, hb;
  // U_c only (else nullptr): exp(cum_t - cum_{cs-1}) a_t rounded to T, [B][L][H][D] (bwd_dx_hn's
  // operand), stored by the blocks of the first n tile from the rows they stage anyway
  T* hat = nullptr;
};

// One block of eight warps per (chunk, 64 columns d, 128 columns n, b, hb heads of one group);
// warp w owns d rows d0 + 16 (w % 4) .. + 15 and n columns n0 + 64 (w / 4) .. + 63 (eight m16n8
// accumulators). The group's b rows of the chunk (this block's n columns) arrive once per block by
// cp.async; each head's a tiles (64 tokens deep) go through registers, one stage ahead: loaded
// during the products of the stage before, then multiplied by the token weights, rounded to T (the
// values the WMMA kernels stage) and stored into one of two shared slots. The A fragments are
// those slots read transposed by ldmatrix.
template <class T, class S, bool kToEnd>
__global__ void __launch_bounds__(fwd_mma::state::kThreads, 2)
    chunk_outer_mma_kernel(OuterArgs<T, S> p) {
  using namespace fwd_mma;
  using state::kNw;
  constexpr int kNT = state::kThreads;
  constexpr int kVecs = sizeof(S) == 2 ? 1 : 2;  // 16-byte loads per 8 elements of a
  extern __shared__ __align__(16) unsigned char fwd_outer_smem[];
  const state::Layout lay = state::layout(p.N, p.cs);
  T* Bs = reinterpret_cast<T*>(fwd_outer_smem + lay.b_tile);
  T* Xs = reinterpret_cast<T*>(fwd_outer_smem + lay.x_slots);  // [2][64][kLd16]

  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, g = lane / 4, q4 = lane % 4;
  const int wm = warp % 4, wn = warp / 4;
  const int bw = static_cast<int>(k16(p.N)), nw = bw < kNw ? bw : kNw;
  const int tiles_n = (bw + kNw - 1) / kNw;
  const int64_t c = blockIdx.x;
  const int64_t d0 = (blockIdx.y / tiles_n) * int64_t{kTile};
  const int n0 = static_cast<int>(blockIdx.y % tiles_n) * kNw;
  const int64_t nhb = p.H / p.hb, b = blockIdx.z / nhb, h0 = (blockIdx.z % nhb) * p.hb;
  const int64_t grp = h0 / p.hpg, tb = c * p.cs;
  const int K = static_cast<int>(p.L - tb < p.cs ? p.L - tb : p.cs);
  const int nks = (K + kTile - 1) / kTile;  // 64-deep stages per head
  const int total = static_cast<int>(p.hb) * nks;
  // n columns of this warp that hold data: whole 16-wide pairs of m16n8 tiles
  const int my_n0 = n0 + 64 * wn;
  const int npairs = my_n0 >= bw ? 0 : (bw - my_n0 >= 64 ? 4 : (bw - my_n0) / 16);

  // The b rows of the chunk; columns past N zero.
  for (int idx = tid; idx < nks * kTile * (nw / 8); idx += kNT) {
    const int r = idx / (nw / 8), col = idx % (nw / 8) * 8;
    const bool in = r < K && n0 + col < p.N;
    cp_async16(Bs + r * lay.ldb + col, in ? &p.bm.at(b, tb + r, grp, n0 + col) : p.bm.p,
               in ? 16 : 0);
  }
  cp_async_commit();

  // ---- register staging. Thread tid carries rows xr + 32 k (k < 2) of a stage, 8 columns from
  // xc, with those rows' cum and v.
  const int xr = tid / 8, xc = tid % 8 * 8;
  const bool d_in = d0 + xc < p.D;
  const S* a_base = p.a + b * p.a_b + (tb + xr) * p.a_t + h0 * p.a_h + d0 + xc;
  uint4 xv[2][kVecs];
  double cum_v[2], last_v = 0.0;
  float dt_v[2];
  int lh = 0, lj = 0;  // the next stage to load: head, stage
  int sh = 0, sj = 0;  // the loaded stage's (the next store's)
  // (never for the states' kernel, kToEnd: its code stays as it was without one)
  T* const hat = !kToEnd && blockIdx.y % tiles_n == 0 ? p.hat : nullptr;
  auto load = [&](int i) {
    if (i >= total) return;
    const int64_t ob = (b * p.H + h0 + lh) * p.Lpad + tb;
    if (kToEnd || hat != nullptr) last_v = p.cum[ob + p.cs - 1];
    sh = lh, sj = lj;
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      const int s = lj * kTile + xr + 32 * k;
      const bool in = s < K;
      const uint4* src = reinterpret_cast<const uint4*>(a_base + lh * p.a_h + (s - xr) * p.a_t);
#pragma unroll
      for (int q = 0; q < kVecs; ++q)
        xv[k][q] = in && d_in ? __ldg(src + q) : make_uint4(0, 0, 0, 0);
      cum_v[k] = in ? p.cum[ob + s] : 0.0;
      if constexpr (kToEnd) dt_v[k] = in ? p.dtp[ob + s] : 0.0f;
    }
    if (++lj == nks) lj = 0, ++lh;
  };
  auto store = [&](int slot) {
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      // the WMMA kernels' weights, bit for bit; rows past the chunk's end hold zeros
      const float w = kToEnd ? expf(static_cast<float>(last_v - cum_v[k])) * dt_v[k]
                             : expf(static_cast<float>(cum_v[k]));
      const S* e = reinterpret_cast<const S*>(xv[k]);
      uint4 o;
      uint32_t* ow = reinterpret_cast<uint32_t*>(&o);
#pragma unroll
      for (int q = 0; q < 4; ++q)
        ow[q] = cuda::pack2<T>(to_float(e[2 * q]) * w, to_float(e[2 * q + 1]) * w);
      *reinterpret_cast<uint4*>(Xs + slot * kTile * kLd16 + (xr + 32 * k) * kLd16 + xc) = o;
      const int s = sj * kTile + xr + 32 * k;
      if (!kToEnd && hat != nullptr && s < K && d_in) {
        const float w2 = expf(static_cast<float>(cum_v[k] - last_v));
#pragma unroll
        for (int q = 0; q < 4; ++q)
          ow[q] = cuda::pack2<T>(to_float(e[2 * q]) * w2, to_float(e[2 * q + 1]) * w2);
        *reinterpret_cast<uint4*>(hat + ((b * p.L + tb + s) * p.H + h0 + sh) * p.D + d0 + xc) = o;
      }
    }
  };

  if (total > 0) {
    load(0);
    store(0);
    load(1);
  }
  cp_async_wait<0>();
  __syncthreads();
  float acc[8][4] = {};
  int hi = 0, j = 0;  // the stage being computed: head, stage
  for (int i = 0; i < total; ++i) {
    const T* X = Xs + (i % 2) * kTile * kLd16;
    const int s0 = j * kTile;
    // A = (w a)^T: the slot [token][d] read transposed; B = the b rows [token][n]
    warp_mma_64<T, true>(acc, X, kLd16, 16 * wm, Bs + s0 * lay.ldb, static_cast<int>(lay.ldb),
                         64 * wn, npairs, lane);
    // The next stage into the other slot (its last reader was stage i - 1, before the barrier
    // that ended it), and the loads of the one after.
    if (i + 1 < total) store((i + 1) % 2);
    load(i + 2);
    if (j == nks - 1) {
      float* out = p.out + ((b * p.H + h0 + hi) * p.nchunks + c) * p.D * p.N;
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int64_t d = d0 + 16 * wm + g + 8 * r;
        if (d >= p.D) continue;  // (those rows' accumulators are never stored)
#pragma unroll
        for (int j8 = 0; j8 < 8; ++j8) {
          const int n = my_n0 + 8 * j8 + 2 * q4;
          if (n < p.N)
            *reinterpret_cast<float2*>(out + d * p.N + n) =
                make_float2(acc[j8][2 * r], acc[j8][2 * r + 1]);
          acc[j8][2 * r] = acc[j8][2 * r + 1] = 0.0f;
        }
      }
    }
    __syncthreads();
    if (++j == nks) j = 0, ++hi;
  }
}

// a = x, b = B, out = the chunk states (chunk_state).
template <class T>
OuterArgs<T, T> outer_args_state(const Fwd<T>& p) {
  return {p.x.p, p.x.s0, p.x.s1, p.x.s2, p.Bm, p.cum,     p.dtp,  p.st,      p.L,
          p.H,   p.D,    p.N,    p.hpg,  p.cs, p.nchunks, p.Lpad, p.hb_state};
}

template <class T, class S, bool kToEnd>
Status launch_outer_mma(const OuterArgs<T, S>& a, int64_t batch, cudaStream_t st,
                        std::string_view op) {
  const int64_t tiles_n = cuda::ceil_div(fwd_mma::k16(a.N), fwd_mma::state::kNw);
  const dim3 grid(static_cast<unsigned>(a.nchunks),
                  static_cast<unsigned>(cuda::ceil_div(a.D, kTile) * tiles_n),
                  static_cast<unsigned>(batch * (a.H / a.hb)));
  return cuda::launch_with_smem(op, "chunk_outer_mma_kernel", chunk_outer_mma_kernel<T, S, kToEnd>,
                                grid, fwd_mma::state::kThreads,
                                fwd_mma::state::layout(a.N, a.cs).total, st, a);
}

template <class T>
Status launch_chunk_out_mma(const Fwd<T>& p, const ssd::Problem& pr, cudaStream_t st) {
  const dim3 grid(static_cast<unsigned>(pr.nchunks * (pr.chunk_size / kTile)),
                  static_cast<unsigned>(cuda::ceil_div(pr.head_dim, kTile)),
                  static_cast<unsigned>(pr.batch * (pr.heads / p.hb)));
  return cuda::launch_with_smem("ssd_forward", "chunk_out_mma_kernel", chunk_out_mma_kernel<T>,
                                grid, fwd_mma::out::kThreads,
                                fwd_mma::out::layout(pr.state_dim, pr.chunk_size).total, st, p);
}

}  // namespace baracuda::ssd_cuda
