// CUDA kernels of the mHC ops, templated over the activation storage type. Included once per dtype
// by kernels_<dtype>.cu, which calls register_mhc_cuda<DType>().
//
// Shapes: X [tokens, n, C] with strides (st, si, 1); 2-D activations [tokens, C] with stride (st,
// 1). Coefficient rows are f32 [rows, K] with a row stride. All reductions run in a fixed order
// (warp shuffles and tree reductions with a fixed shape, no atomics), so every kernel is
// deterministic.
#pragma once

#include <cooperative_groups.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "baracuda/ops/mhc.hpp"
#include "core/cuda/async_copy.cuh"
#include "core/cuda/launch.cuh"

namespace baracuda::mhc_cuda {
// Internal linkage: every kernels_<dtype>.cu gets its own copy of the dtype-free kernels.
namespace {

using cuda::cp_async16;
using cuda::cp_async16_l1;
using cuda::cp_async8;
using cuda::cp_async_commit;
using cuda::cp_async_wait;
using cuda::cp_async_wait_all;
using cuda::cp_async_wait_pending;
using cuda::from_float;
using cuda::to_float;

// Streams kept in registers by the elementwise kernels (more are re-read through L1).
constexpr int kRegN = 8;

// ---- small helpers
// --------------------------------------------------------------------------------
template <class T, int VEC>
struct alignas(sizeof(T) * VEC) Pack {
  T v[VEC];
};
template <class T, int VEC>
__device__ __forceinline__ void load_vec(const T* p, float (&v)[VEC]) {
  const Pack<T, VEC> pk = *reinterpret_cast<const Pack<T, VEC>*>(p);
#pragma unroll
  for (int e = 0; e < VEC; ++e) v[e] = to_float(pk.v[e]);
}
template <class T, int VEC>
__device__ __forceinline__ void store_vec(T* p, const float (&v)[VEC]) {
  Pack<T, VEC> pk;
#pragma unroll
  for (int e = 0; e < VEC; ++e) pk.v[e] = from_float<T>(v[e]);
  *reinterpret_cast<Pack<T, VEC>*>(p) = pk;
}
__device__ __forceinline__ float sigmoid(float v) {
  return 1.0f / (1.0f + expf(-v));
}
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
// Fixed-shape block reduction (blockDim.x a multiple of 32, <= 1024); every thread gets the sum.
__device__ __forceinline__ float block_sum(float v, float* smem32) {
  v = warp_sum(v);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();  // smem32 may still be read by a previous call
  if (lane == 0) smem32[warp] = v;
  __syncthreads();
  const int warps = static_cast<int>(blockDim.x >> 5);
  float s = lane < warps ? smem32[lane] : 0.0f;
  return warp_sum(s);
}

struct SinkhornParams {
  int init = 1;   // 0 exp, 1 softmax_eps
  int first = 1;  // 0 rows, 1 columns
  int iters = 20;
  float eps = 1e-6f;
};
inline SinkhornParams sinkhorn_params(const SinkhornConfig& c) {
  return {c.init == SinkhornInit::exp ? 0 : 1, c.first == SinkhornFirst::rows ? 0 : 1, c.iters,
          static_cast<float>(c.eps)};
}

// Line a (a row for axis 0, a column for axis 1) of the n x n matrix p divided by (its sum + eps).
// Lines of one normalization are disjoint, so running them on separate lanes gives the same bits.
__device__ __forceinline__ void normalize_line(float* p, int n, int axis, int a, float eps) {
  const int step = axis == 0 ? 1 : n, base = axis == 0 ? a * n : a;
  float s = 0;
  for (int b = 0; b < n; ++b) s += p[base + b * step];
  const float inv = 1.0f / (s + eps);
  for (int b = 0; b < n; ++b) p[base + b * step] *= inv;
}
// One normalization along `axis` (0: rows, 1: columns), in place.
__device__ inline void normalize(float* p, int n, int axis, float eps) {
  for (int a = 0; a < n; ++a) normalize_line(p, n, axis, a, eps);
}
// softmax_eps init of row r: softmax over the row, then + eps.
__device__ __forceinline__ void softmax_eps_row(float* p, int n, int r, float eps) {
  float m = p[r * n];
  for (int c = 1; c < n; ++c) m = fmaxf(m, p[r * n + c]);
  float sum = 0;
  for (int c = 0; c < n; ++c) sum += (p[r * n + c] = expf(p[r * n + c] - m));
  const float inv = 1.0f / sum;
  for (int c = 0; c < n; ++c) p[r * n + c] = p[r * n + c] * inv + eps;
}
// p holds the logits on entry, the Sinkhorn result on exit. trace (optional) receives the matrix
// before each of the 2 * iters - 1 normalizations.
__device__ inline void sinkhorn_inplace(float* p, int n, const SinkhornParams& s, float* trace) {
  const int nn = n * n;
  if (s.init == 0) {
    float m = p[0];
    for (int k = 1; k < nn; ++k) m = fmaxf(m, p[k]);
    for (int k = 0; k < nn; ++k) p[k] = expf(p[k] - m);
  } else {
    for (int r = 0; r < n; ++r) softmax_eps_row(p, n, r, s.eps);
  }
  const int steps = 2 * s.iters - 1;
  for (int st = 0; st < steps; ++st) {
    if (trace)
      for (int k = 0; k < nn; ++k) trace[static_cast<int64_t>(st) * nn + k] = p[k];
    normalize(p, n, (s.first + st) & 1, s.eps);
  }
}

// ---- coefficients: logits -> [pre | post | comb], one thread per row
// --------------------------------
struct ActivateArgs {
  int64_t rows = 0;
  int n = 0, k = 0;
  // static H
  const float* h_pre = nullptr;
  const float* h_post = nullptr;
  const float* h_res = nullptr;
  int64_t h_res_stride = 0;
  // dynamic H: split-K partials of g = fn x [splits, rows, K] and of the sum of squares
  // ss [splits, rows]; the kernel leaves the totals in split 0
  float* g = nullptr;
  float* ss = nullptr;
  int splits = 1;
  const float* scale = nullptr;
  const float* base = nullptr;
  float inv_flat = 0, norm_eps = 0;
  float pre_eps = 0;
  SinkhornParams sk;
  float* out = nullptr;  // [rows, K], row stride out_stride
  int64_t out_stride = 0;
  float* logits = nullptr;  // optional dense [rows, K] copy of the logits (backward)
  float* trace = nullptr;   // optional [rows, steps, n * n]
};

// The comb part runs in shared memory (a padded slot per thread), not in global memory: the
// 2 * iters - 1 dependent normalizations would otherwise each wait on L2.
__host__ __device__ inline int activate_slot(int n) {
  return n * n + 1;
}
// Value k of a coefficient row from its logit v: pre = sigmoid(v) + pre_eps and post =
// 2 sigmoid(v) go to o, the comb logits to p (the Sinkhorn input).
__device__ __forceinline__ void activate_value(const ActivateArgs& a, int k, float v, float* o,
                                               float* p) {
  const int n = a.n;
  if (k < n)
    o[k] = sigmoid(v) + a.pre_eps;
  else if (k < 2 * n)
    o[k] = 2.0f * sigmoid(v);
  else
    p[k - 2 * n] = v;
}
// Dynamic H's logit k from the token's total g and 1 / rms: per-field scale, then the bias.
__device__ __forceinline__ float dynamic_logit(const ActivateArgs& a, int k, float g,
                                               float inv_rms) {
  const int f = k < a.n ? 0 : (k < 2 * a.n ? 1 : 2);
  return inv_rms * g * a.scale[f] + a.base[k];
}
// Row r of the coefficients; p: activate_slot(n) floats of shared memory.
__device__ inline void activate_row(const ActivateArgs& a, int64_t r, float* p) {
  const int n = a.n, nn = n * n;
  float* o = a.out + r * a.out_stride;
  float* lg = a.logits ? a.logits + r * a.k : nullptr;
  float inv_rms = 0;
  if (a.g) {  // sum the split-K partials in a fixed order; the totals go back into split 0
    float ss = 0;
    for (int z = 0; z < a.splits; ++z) ss += a.ss[z * a.rows + r];
    a.ss[r] = ss;
    inv_rms = rsqrtf(ss * a.inv_flat + a.norm_eps);
  }
  for (int k = 0; k < a.k; ++k) {
    float v;
    if (a.g) {
      float g = 0;
      for (int z = 0; z < a.splits; ++z) g += a.g[(z * a.rows + r) * a.k + k];
      a.g[r * a.k + k] = g;
      v = dynamic_logit(a, k, g, inv_rms);
    } else if (k < n) {
      v = a.h_pre[k];
    } else if (k < 2 * n) {
      v = a.h_post[k - n];
    } else {
      const int j = (k - 2 * n) / n, i = (k - 2 * n) % n;
      v = a.h_res[j * a.h_res_stride + i];
    }
    if (lg) lg[k] = v;
    activate_value(a, k, v, o, p);
  }
  const int steps = 2 * a.sk.iters - 1;
  sinkhorn_inplace(p, n, a.sk, a.trace ? a.trace + r * static_cast<int64_t>(steps) * nn : nullptr);
  for (int k = 0; k < nn; ++k) o[2 * n + k] = p[k];
}
// activate_row for static H (a.rows == 1, no logits / trace) spread over one warp; all 32 lanes
// call it. Each line of an init or normalization step belongs to one lane and runs the serial
// code, so o gets the same bits as from activate_row, but a step costs one line's latency instead
// of n of them: thread 0 alone took tens of microseconds for 2 * 20 - 1 steps, all of it before
// a CTA's first token could be computed. p: activate_slot(n) floats of shared memory, o: K floats.
// The Sinkhorn part of a row on one warp: p holds the n x n logits on entry; the result goes to
// comb (n * n floats). Each line of an init or normalization step belongs to one lane and runs
// the serial code, so the bits are sinkhorn_inplace's. All 32 lanes call it.
__device__ inline void sinkhorn_warp(float* p, int n, const SinkhornParams& sk, float* comb) {
  const int nn = n * n, lane = static_cast<int>(threadIdx.x & 31);
  __syncwarp();
  if (sk.init == 0) {
    float m = p[0];  // every lane forms the same maximum in the same order
    for (int k = 1; k < nn; ++k) m = fmaxf(m, p[k]);
    __syncwarp();  // all lanes have read p before any lane overwrites it
    for (int k = lane; k < nn; k += 32) p[k] = expf(p[k] - m);
  } else {
    for (int r = lane; r < n; r += 32) softmax_eps_row(p, n, r, sk.eps);
  }
  __syncwarp();
  const int steps = 2 * sk.iters - 1;
  for (int st = 0; st < steps; ++st) {
    for (int l = lane; l < n; l += 32) normalize_line(p, n, (sk.first + st) & 1, l, sk.eps);
    __syncwarp();
  }
  for (int k = lane; k < nn; k += 32) comb[k] = p[k];
}
__device__ inline void activate_static_row_warp(const ActivateArgs& a, float* o, float* p) {
  const int n = a.n, lane = static_cast<int>(threadIdx.x & 31);
  for (int k = lane; k < a.k; k += 32) {
    if (k < n) {
      o[k] = sigmoid(a.h_pre[k]) + a.pre_eps;
    } else if (k < 2 * n) {
      o[k] = 2.0f * sigmoid(a.h_post[k - n]);
    } else {
      const int j = (k - 2 * n) / n, i = (k - 2 * n) % n;
      p[k - 2 * n] = a.h_res[j * a.h_res_stride + i];
    }
  }
  sinkhorn_warp(p, n, a.sk, o + 2 * n);
}
// Static H's one coefficient row on one warp (same bits as activate_kernel): activate_kernel's
// single thread took ~51 us for 2 * 20 - 1 Sinkhorn steps at n = 4 on an H100, in front of every
// static forward.
__global__ void activate_static_warp_kernel(ActivateArgs a) {
  extern __shared__ float scratch[];
  activate_static_row_warp(a, a.out, scratch);
}
// The Sinkhorn of one row with an element per lane (n * n <= 32): lane l holds p[l] (row l / n,
// column l % n) and gets the result. Each line's sum gathers its n values by shuffles and adds
// them in index order, and the maxima and the divisions are activate_row's, so the bits are
// sinkhorn_inplace's; a step costs a few shuffles instead of a serial pass over shared memory.
// All 32 lanes call it; lanes >= n * n carry nothing.
__device__ inline float sinkhorn_lanes(float v, int n, const SinkhornParams& sk) {
  constexpr unsigned kAll = 0xffffffffu;
  const int lane = static_cast<int>(threadIdx.x & 31), nn = n * n;
  const int r = lane < nn ? lane / n : 0, c = lane < nn ? lane % n : 0;
  if (sk.init == 0) {
    float m = __shfl_sync(kAll, v, 0);
    for (int k = 1; k < nn; ++k) m = fmaxf(m, __shfl_sync(kAll, v, k));
    v = expf(v - m);
  } else {  // softmax over the row, then + eps (softmax_eps_row)
    float m = __shfl_sync(kAll, v, r * n);
    for (int b = 1; b < n; ++b) m = fmaxf(m, __shfl_sync(kAll, v, r * n + b));
    const float e = expf(v - m);
    float sum = 0;
    for (int b = 0; b < n; ++b) sum += __shfl_sync(kAll, e, r * n + b);
    const float inv = 1.0f / sum;
    v = e * inv + sk.eps;
  }
  const int steps = 2 * sk.iters - 1;
  for (int st = 0; st < steps; ++st) {
    const bool rows = ((sk.first + st) & 1) == 0;
    float sum = 0;
    for (int b = 0; b < n; ++b) sum += __shfl_sync(kAll, v, rows ? r * n + b : b * n + c);
    v *= 1.0f / (sum + sk.eps);
  }
  return v;
}
// Dynamic rows in the forward pass (no logits copy, no trace) on one warp per row: lanes own
// outputs, so a split's partials are read as adjacent words (one thread per row read them 96
// bytes apart and ran the Sinkhorn chain alone: 155 us for 16384 rows on an H100), and the
// Sinkhorn runs line-parallel. Each value is formed by activate_row's expressions in its order:
// the same bits. p: activate_slot(n) floats per warp.
constexpr int kActWarps = 4;
__global__ void __launch_bounds__(kActWarps * 32) activate_dynamic_warp_kernel(ActivateArgs a) {
  extern __shared__ float scratch[];
  const int warp = static_cast<int>(threadIdx.x >> 5), lane = static_cast<int>(threadIdx.x & 31);
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kActWarps + warp;
  if (r >= a.rows) return;  // uniform per warp
  float* p = scratch + warp * activate_slot(a.n);
  const int n = a.n;
  float* o = a.out + r * a.out_stride;
  float ss = 0;
  for (int z = 0; z < a.splits; ++z) ss += a.ss[z * a.rows + r];
  const float inv_rms = rsqrtf(ss * a.inv_flat + a.norm_eps);
  __syncwarp();  // every lane has read split 0 before lane 0 overwrites it with the total
  if (lane == 0) a.ss[r] = ss;
  if (a.k <= 32) {  // n <= 4: lane k owns output k, then comb element l moves to lane l
    float v = 0;
    if (lane < a.k) {
      float g = 0;
      for (int z = 0; z < a.splits; ++z) g += a.g[(z * a.rows + r) * a.k + lane];
      a.g[r * a.k + lane] = g;  // the totals go back into split 0, as activate_row leaves them
      v = dynamic_logit(a, lane, g, inv_rms);
      if (lane < 2 * n) activate_value(a, lane, v, o, p);
    }
    v = __shfl_sync(0xffffffffu, v, min(2 * n + lane, 31));
    v = sinkhorn_lanes(v, n, a.sk);
    if (lane < n * n) o[2 * n + lane] = v;
    return;
  }
  for (int k = lane; k < a.k; k += 32) {
    float g = 0;
    for (int z = 0; z < a.splits; ++z) g += a.g[(z * a.rows + r) * a.k + k];
    a.g[r * a.k + k] = g;  // the totals go back into split 0, as activate_row leaves them
    activate_value(a, k, dynamic_logit(a, k, g, inv_rms), o, p);
  }
  sinkhorn_warp(p, n, a.sk, o + 2 * n);
}
__global__ void activate_kernel(ActivateArgs a) {
  extern __shared__ float scratch[];
  const int64_t r = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (r >= a.rows) return;
  activate_row(a, r, scratch + threadIdx.x * activate_slot(a.n));
}

// Backward of activate: dlogits [rows, K] from logits, dcoeffs (both dense) and the trace.
struct ActivateBwdArgs {
  int64_t rows = 0;
  int n = 0, k = 0;
  const float* logits = nullptr;
  const float* dc = nullptr;
  const float* trace = nullptr;
  float* dl = nullptr;
  SinkhornParams sk;
};
__global__ void activate_backward_kernel(ActivateBwdArgs a) {
  const int64_t r = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (r >= a.rows) return;
  const int n = a.n, nn = n * n;
  const float* l = a.logits + r * a.k;
  const float* dc = a.dc + r * a.k;
  float* dl = a.dl + r * a.k;
  for (int i = 0; i < n; ++i) {
    // sigmoid' = sigmoid(v) sigmoid(-v): no cancellation in 1 - sigmoid(v) when it nears 1.
    dl[i] = dc[i] * sigmoid(l[i]) * sigmoid(-l[i]);
    dl[n + i] = 2.0f * dc[n + i] * sigmoid(l[n + i]) * sigmoid(-l[n + i]);
  }
  float* dp = dl + 2 * n;  // the comb gradient, walked back through the steps in place
  for (int k = 0; k < nn; ++k) dp[k] = dc[2 * n + k];
  const int steps = 2 * a.sk.iters - 1;
  const float* tr = a.trace + r * static_cast<int64_t>(steps) * nn;
  const float eps = a.sk.eps;
  for (int st = steps - 1; st >= 0; --st) {
    const float* pin = tr + static_cast<int64_t>(st) * nn;
    const int axis = (a.sk.first + st) & 1;
    for (int li = 0; li < n; ++li) {
      const int step = axis == 0 ? 1 : n, base = axis == 0 ? li * n : li;
      float s = 0;
      for (int b = 0; b < n; ++b) s += pin[base + b * step];
      const float inv = 1.0f / (s + eps);
      float dot = 0;
      for (int b = 0; b < n; ++b) dot += dp[base + b * step] * pin[base + b * step] * inv;
      for (int b = 0; b < n; ++b) dp[base + b * step] = (dp[base + b * step] - dot) * inv;
    }
  }
  const float* p0 = tr;  // the input of step 0 is the initial matrix
  const float* lc = l + 2 * n;
  if (a.sk.init == 0) {
    int arg = 0;
    for (int k = 1; k < nn; ++k)
      if (lc[k] > lc[arg]) arg = k;
    float total = 0;
    for (int k = 0; k < nn; ++k) total += (dp[k] = p0[k] * dp[k]);
    dp[arg] -= total;
  } else {
    for (int rr = 0; rr < n; ++rr) {
      float dot = 0;
      for (int c = 0; c < n; ++c) dot += dp[rr * n + c] * (p0[rr * n + c] - eps);
      for (int c = 0; c < n; ++c) dp[rr * n + c] = (p0[rr * n + c] - eps) * (dp[rr * n + c] - dot);
    }
  }
}

// ---- dynamic H: g = fn x and sum of squares, tiled over tokens
// ----------------------------------- One CTA computes a kTM-token x kKB-output tile over all of n
// * C in chunks of kKC, each thread a 4 x 4 register block. fn is read once per token tile (from
// L2), X once overall.
constexpr int kTM = 64, kKB = 32, kKC = 32, kLogitThreads = 128;
struct LogitArgs {
  int64_t tokens = 0, flat = 0, channels = 0, st = 0, si = 0;
  int64_t per_split = 0;  // n * C elements per split (a multiple of kKC); blockIdx.z picks one
  int64_t splits = 1;     // logits_mma_kernel: blockIdx.x = token tile * splits + split
  int k = 0;
  const float* fn = nullptr;
  int64_t fn_stride = 0;
  float* g = nullptr;   // [splits, tokens, K] dense
  float* ss = nullptr;  // [splits, tokens]
};
template <class T>
__global__ void __launch_bounds__(kLogitThreads)
    logits_kernel(const T* __restrict__ x, LogitArgs a) {
  __shared__ __align__(16) float xs[kKC][kTM + 4];
  __shared__ __align__(16) float fs[kKC][kKB + 4];
  const int tid = threadIdx.x;
  const int64_t t0 = static_cast<int64_t>(blockIdx.x) * kTM;
  const int k0 = blockIdx.y * kKB;
  const int tg = tid % 16, kg = tid / 16;  // 16 token groups x 8 output groups, 4 each
  // Each chunk is summed on its own, and the chunk sums are added with Kahan compensation, so the
  // error stays near f32 rounding even for n * C in the tens of thousands.
  float acc[4][4] = {}, comp[4][4] = {};
  // Loader roles: X: 2 threads per token, 16 consecutive m each; fn: 4 threads per output row.
  const int lt = tid / 2, lm = (tid % 2) * 16;
  const int fk = tid / 4, fm = (tid % 4) * 8;
  const int64_t tok = t0 + lt;
  float sq = 0, sq_comp = 0;
  const int64_t mbeg = blockIdx.z * a.per_split, mend = min(a.flat, mbeg + a.per_split);
  float* g = a.g + blockIdx.z * a.tokens * a.k;
  for (int64_t m0 = mbeg; m0 < mend; m0 += kKC) {
    float sq_chunk = 0;
    // One division per chunk; the 16 elements then walk (stream, channel) forward.
    int64_t mi = (m0 + lm) / a.channels, mc = m0 + lm - mi * a.channels;
#pragma unroll 4
    for (int e = 0; e < 16; ++e) {
      float v = 0;
      if (tok < a.tokens && m0 + lm + e < mend) v = to_float(x[tok * a.st + mi * a.si + mc]);
      if (++mc == a.channels) mc = 0, ++mi;
      sq_chunk = fmaf(v, v, sq_chunk);
      xs[lm + e][lt] = v;
    }
    {
      const float yk = sq_chunk - sq_comp, tk = sq + yk;
      sq_comp = (tk - sq) - yk;
      sq = tk;
    }
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      const int64_t m = m0 + fm + e;
      const int kk = k0 + fk;
      fs[fm + e][fk] = (kk < a.k && m < mend) ? a.fn[kk * a.fn_stride + m] : 0.0f;
    }
    __syncthreads();
    float part[4][4] = {};
#pragma unroll 8
    for (int kc = 0; kc < kKC; ++kc) {
      const float4 xv = *reinterpret_cast<const float4*>(&xs[kc][tg * 4]);
      const float4 fv = *reinterpret_cast<const float4*>(&fs[kc][kg * 4]);
      const float xa[4] = {xv.x, xv.y, xv.z, xv.w}, fa[4] = {fv.x, fv.y, fv.z, fv.w};
#pragma unroll
      for (int p = 0; p < 4; ++p)
#pragma unroll
        for (int q = 0; q < 4; ++q) part[p][q] = fmaf(xa[p], fa[q], part[p][q]);
    }
#pragma unroll
    for (int p = 0; p < 4; ++p)
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const float yk = part[p][q] - comp[p][q], tk = acc[p][q] + yk;
        comp[p][q] = (tk - acc[p][q]) - yk;
        acc[p][q] = tk;
      }
    __syncthreads();
  }
#pragma unroll
  for (int p = 0; p < 4; ++p) {
    const int64_t t = t0 + tg * 4 + p;
    if (t >= a.tokens) continue;
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int kk = k0 + kg * 4 + q;
      if (kk < a.k) g[t * a.k + kk] = acc[p][q];
    }
  }
  sq += __shfl_xor_sync(0xffffffffu, sq, 1);  // the two loaders of a token
  if (blockIdx.y == 0 && tid % 2 == 0 && tok < a.tokens) a.ss[blockIdx.z * a.tokens + tok] = sq;
}

// ---- dynamic H collapse in one pass over X (sm_90 thread-block clusters) ----------------------
// The split-K path above reads X twice (logits, then the weighted sum). Here a cluster of kDynCtas
// CTAs keeps a tile of M tokens' whole X rows in shared memory: CTA r holds channels [c0, c0 + cw)
// of every stream (a 1/kDynCtas slice of n * C), computes the partial sum of squares and the K
// partial dot products of its slice, the partials are summed across the cluster through distributed
// shared memory, and every CTA then writes the collapse of its own channels from shared memory. X
// is read from HBM once; fn is re-read from L2 once per tile. The comb part of coeffs leaves this
// kernel as logits; comb_sinkhorn_kernel finishes it (the Sinkhorn chain is long and serial, so it
// must not stall the streaming kernel).
//
// Products: lane = (token group tg of 8, k group kg of 4); a lane accumulates TPL tokens (tg + 8 j)
// x kDynKpl outputs over its warp's contiguous part of the slice; warps split the slice 8 ways.
// Every sum has a fixed shape that depends on (n, C) only, never on the token count or a token's
// slot in the tile: deterministic and bit-stable.
constexpr int kDynCtas = 8, kDynThreads = 256, kDynWarps = kDynThreads / 32;
constexpr int kDynTg = 8, kDynKg = 4, kDynKpl = 6, kDynKpass = kDynKg * kDynKpl;
// Tokens per tile / kDynTg: the largest tile whose rows fit in shared memory at n * C = 16384.
template <class T>
constexpr int dyn_tpl() {
  return sizeof(T) == 4 ? 3 : 5;
}
struct DynArgs {
  int64_t tokens = 0, channels = 0, tiles = 0;
  int64_t x_st = 0, x_si = 0, y_st = 0, co_stride = 0;
  int n = 0, k = 0;
  int q = 0;      // 16-byte chunks per stream row (C / VEC)
  int pitch = 0;  // shared-memory elements per token row
  int slots = 0;  // collapse_push16_kernel: tiles in its ring
  const float* fn = nullptr;
  int64_t fn_stride = 0;
  const float* scale = nullptr;
  const float* base = nullptr;
  float inv_flat = 0, norm_eps = 0, pre_eps = 0;
  float* co = nullptr;
  // Start delay of cluster c: (c % 4) * stagger_ns. Every CTA alternates between waiting for its
  // tile (HBM busy, FMA units idle) and computing on it (the reverse); clusters that start
  // together stay in step and leave HBM idle half the time. A quarter-period offset between four
  // groups lets one group's loads run under another's products. 0: no delay.
  unsigned stagger_ns = 0;
};
// Shared memory: X tile [M][pitch] T, then f32: per-warp partials [warps][M][kDynKpass], per-warp
// sums of squares [warps][M], the CTA's partials [2][M][K + 1] (double-buffered: a peer may still
// read tile b's while this CTA writes tile b + 1's), cluster totals [M][K + 1], pre [M][n].
template <class T>
__host__ __device__ inline size_t dyn_smem_bytes(int64_t m, int64_t pitch, int64_t n, int64_t k) {
  return static_cast<size_t>(
      m * pitch * static_cast<int64_t>(sizeof(T)) +
      4 * (kDynWarps * m * kDynKpass + kDynWarps * m + 3 * m * (k + 1) + m * n));
}

// m16n8k8 TF32: D += A B with a = {A[g][t], A[g + 8][t], A[g][t + 4], A[g + 8][t + 4]},
// b = {B[t][g], B[t + 4][g]} (PTX ISA fragment layout).
__device__ __forceinline__ void mma_tf32_k8(float (&d)[4], const uint32_t (&a)[4],
                                            const uint32_t (&b)[2]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#endif
}
// v = big + small. big is v rounded to TF32, nearest with ties away (cvt.rna's bits: add half a
// TF32 ulp to the magnitude, drop the 13 low bits; two integer ops where cvt.rna is four with an
// infinity test). small = v - big is exact in f32 and is passed unrounded: the tensor core reads
// only its TF32 bits, a truncation worth < 2^-21 |v|. With the dropped small * small term
// (<= 2^-22 |a b|) a 3xTF32 product is within ~2^-20 |a b|, errors of either sign. Infinities stay
// infinite in big; a NaN may lose its payload in big but then small is NaN, so the product is too.
__device__ __forceinline__ void split_tf32(float v, uint32_t& big, uint32_t& small) {
  big = (__float_as_uint(v) + 0x1000u) & 0xffffe000u;
  small = __float_as_uint(v - __uint_as_float(big));
}

// d += blk for a warp's MT m-tiles x 3 n-tiles of m16n8 accumulators: a block summed on the tensor
// cores from zero, added to the long sum on the CUDA cores (IEEE adds; see mma_block16).
template <int MT>
__device__ __forceinline__ void add_blocks(float (&d)[MT][3][4], const float (&blk)[MT][3][4]) {
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int nt = 0; nt < 3; ++nt)
#pragma unroll
      for (int v = 0; v < 4; ++v) d[mt][nt][v] += blk[mt][nt][v];
}

// One 16-element block of a warp's products on the tensor cores: d[mt][nt] += A B over the
// block's 16 elements, where lane (g, t) holds av[mt][h][s] = A[row mt * 16 + h * 8 + g][element
// 4 t + s] and bv[nt][s] = B[element 4 t + s][col nt * 8 + g] (each lane reads 4 consecutive
// elements per row). 3xTF32 when A is f32 (SPLIT_A), 2xTF32 when it is exact in TF32 (16-bit).
//
// The block's k-steps accumulate on the tensor cores from zero and the block's sum is then added
// to d on the CUDA cores. The tensor core adds into its f32 accumulator with truncated alignment
// (not round-to-nearest), and that error, biased and relative to the running sum, is the likely
// cause of the whole-slice chain's error (GPU run at ef65bac: f32 coeffs rel_l2 1.4e-6 against
// 9.6e-7; the split loses only a few f32 roundings per product). Short chains plus IEEE adds keep
// the long sum as accurate as the CUDA-core kernel's FMA chain.
template <int MT, bool SPLIT_A>
__device__ __forceinline__ void mma_block16(float (&d)[MT][3][4], const float (&av)[MT][2][4],
                                            const float (&bv)[3][4]) {
  // Two m16n8k8 steps: MMA k index t is element 4 t + 2 j and k index t + 4 is element
  // 4 t + 2 j + 1 (any pairing of A's and B's k works when both use it), so a block is a chain of
  // 2 (2xTF32: 4, 3xTF32: 6) MMAs per accumulator instead of 8 / 12 m16n8k4 ones: with one
  // m-tile per warp the k4 chains left only three independent accumulators and ptxas padded the
  // HMMA dependencies with NOPs (20% of the logits kernel's stall samples).
  float blk[MT][3][4] = {};
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    const int s0 = 2 * j, s1 = 2 * j + 1;
    uint32_t bb[3][2], bs[3][2];
#pragma unroll
    for (int nt = 0; nt < 3; ++nt) {
      split_tf32(bv[nt][s0], bb[nt][0], bs[nt][0]);
      split_tf32(bv[nt][s1], bb[nt][1], bs[nt][1]);
    }
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      // a0 = A[g][k t], a1 = A[g + 8][k t], a2 = A[g][k t + 4], a3 = A[g + 8][k t + 4].
      uint32_t ab[4] = {__float_as_uint(av[mt][0][s0]), __float_as_uint(av[mt][1][s0]),
                        __float_as_uint(av[mt][0][s1]), __float_as_uint(av[mt][1][s1])};
      uint32_t as[4] = {0, 0, 0, 0};
      if constexpr (SPLIT_A) {
        split_tf32(av[mt][0][s0], ab[0], as[0]);
        split_tf32(av[mt][1][s0], ab[1], as[1]);
        split_tf32(av[mt][0][s1], ab[2], as[2]);
        split_tf32(av[mt][1][s1], ab[3], as[3]);
      }
#pragma unroll
      for (int nt = 0; nt < 3; ++nt) {
        if constexpr (SPLIT_A) mma_tf32_k8(blk[mt][nt], as, bb[nt]);
        mma_tf32_k8(blk[mt][nt], ab, bs[nt]);
        mma_tf32_k8(blk[mt][nt], ab, bb[nt]);
      }
    }
  }
  add_blocks(d, blk);
}

// A block's fragments (the layout mma_block16 takes): bv[nt] = the float4 f_row(nt) returns (fn
// row nt * 8 + g, elements 4 t ..), av[mt][h] = 4 elements at x_row(mt, h) (token row
// mt * 16 + h * 8 + g); ss[mt][h] gains their squares.
template <class T, int MT, class FRow, class XRow>
__device__ __forceinline__ void load_block_fragments(float (&bv)[3][4], float (&av)[MT][2][4],
                                                     float (&ss)[MT][2], bool with_ss, FRow f_row,
                                                     XRow x_row) {
#pragma unroll
  for (int nt = 0; nt < 3; ++nt) {
    const float4 f4 = f_row(nt);
    bv[nt][0] = f4.x, bv[nt][1] = f4.y, bv[nt][2] = f4.z, bv[nt][3] = f4.w;
  }
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      load_vec<T, 4>(x_row(mt, h), av[mt][h]);
      if (with_ss)
#pragma unroll
        for (int v = 0; v < 4; ++v) ss[mt][h] = fmaf(av[mt][h][v], av[mt][h][v], ss[mt][h]);
    }
}

// One warp's partial products of a tile on tensor cores: the same contract as the CUDA-core loop
// (wpart[warp][token][0, kDynKpass) for outputs kb.., wss[warp][token] when kb == 0), over the
// warp's 4-element groups [g0, g1) of the slice, taken 16 elements (4 k-steps) at a time. Lane
// (g, t) feeds k index t of k-step s with slice element e + 4 t + s, for A and B alike, so it
// reads 4 consecutive elements per row with one vector load.
template <class T, int M>
__device__ __forceinline__ void mma_products(const T* xs, const DynArgs& a, int g0, int g1, int cw,
                                             int64_t c0, int kb, int warp, int lane, float* wpart,
                                             float* wss) {
  constexpr int MT = (M + 15) / 16;
  constexpr bool kSplitA = sizeof(T) == 4;  // 16-bit values are exact in TF32
  const int g = lane >> 2, t = lane & 3, K = a.k;
  float d[MT][3][4] = {};
  float ss[MT][2] = {};
  const T* xr[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h)
      xr[mt][h] = xs + static_cast<int64_t>(min(mt * 16 + h * 8 + g, M - 1)) * a.pitch + 4 * t;
  const float* fr[3];
#pragma unroll
  for (int nt = 0; nt < 3; ++nt)
    fr[nt] = a.fn + static_cast<int64_t>(min(kb + nt * 8 + g, K - 1)) * a.fn_stride + 4 * t;
  const int per_stream = cw / 4;  // groups per stream row of the slice (a multiple of 4)
  for (int i = 0; i < a.n; ++i) {
    const int lo = max(g0, i * per_stream), hi = min(g1, (i + 1) * per_stream);
    const int64_t col0 = i * a.channels + c0 - i * cw;
#pragma unroll 2
    for (int gg = lo; gg < hi; gg += 4) {
      const int e = gg * 4;
      float bv[3][4], av[MT][2][4];
      load_block_fragments<T, MT>(
          bv, av, ss, kb == 0,
          [&](int nt) { return __ldg(reinterpret_cast<const float4*>(fr[nt] + col0 + e)); },
          [&](int mt, int h) { return xr[mt][h] + e; });
      mma_block16<MT, kSplitA>(d, av, bv);
    }
  }
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = mt * 16 + h * 8 + g;
      // The 4 lanes of a row group hold interleaved quarters of the row's elements.
      float sv = ss[mt][h];
      sv += __shfl_xor_sync(0xffffffffu, sv, 1);
      sv += __shfl_xor_sync(0xffffffffu, sv, 2);
      if (row >= M) continue;
#pragma unroll
      for (int nt = 0; nt < 3; ++nt) {
        float* o = wpart + (warp * M + row) * kDynKpass + nt * 8 + 2 * t;
        o[0] = d[mt][nt][2 * h];
        o[1] = d[mt][nt][2 * h + 1];
      }
      if (kb == 0 && t == 0) wss[warp * M + row] = sv;
    }
}

// ---- dynamic H: g = fn x and sum of squares on tensor cores (split-K, same contract as
// logits_kernel) ------------------------------------------------------------------------------
// The two-pass dynamic collapse reads X twice; its first pass was bound by the CUDA-core products
// (6.4 GFMA at 16384 x 4 x 4096), not by memory. Here a CTA covers 64 tokens of one split: warp
// (token half th, K quarter kq) forms 32 tokens x 24 outputs over a quarter of the split's
// 16-element blocks with mma_block16, and the four quarters add in order through shared memory.
// Each lane copies exactly the fragment elements it will use (4 consecutive elements of 4 token
// rows and of 3 fn rows: full 32-byte sectors) into its own slots of a per-warp ring
// kLmmaStages blocks deep with cp.async, so the loads of the next blocks fly under this block's
// MMAs with no barrier and no registers (the first version loaded into registers and waited: 55%
// of DRAM bandwidth). Every sum has a fixed shape that depends on (n, C) only: deterministic and
// bit-stable. Needs C % 16 == 0 (a block never crosses streams) and X rows and fn rows in aligned
// 4-element vectors.
// Two 16-row m-tiles per warp, two CTAs per SM (128 registers). For f32 one m-tile and three CTAs
// per SM measured faster while the block MMA ran m16n8k4 steps (0.486 against 0.52 ms: the two-
// m-tile k4 version stalled on its fragments' load-to-use latency at 16 warps per SM); with
// m16n8k8 steps two m-tiles win for every dtype (f32 dynamic collapse 0.973 -> 0.907 ms).
constexpr int kLmmaTokens = 64, kLmmaThreads = 256, kLmmaStages = 3, kLmmaMt = 2;
constexpr int kLmmaGroups = kLmmaTokens / (16 * kLmmaMt);    // token groups per CTA
constexpr int kLmmaParts = kLmmaThreads / 32 / kLmmaGroups;  // K parts per token group
// A warp's ring slot: X [kLmmaMt m-tiles][2 halves][32 lanes][4] elements, then fn
// [3][32 lanes][4] f32.
template <class T>
constexpr int lmma_x_bytes() {
  return kLmmaMt * 2 * 32 * 4 * static_cast<int>(sizeof(T));
}
template <class T>
constexpr int lmma_slot_bytes() {
  return lmma_x_bytes<T>() + 3 * 32 * 4 * 4;
}
template <class T>
constexpr size_t lmma_smem_bytes() {
  return static_cast<size_t>(kLmmaThreads / 32) * kLmmaStages * lmma_slot_bytes<T>();
}
template <class T>
__global__ void __launch_bounds__(kLmmaThreads, 2)
    logits_mma_kernel(const T* __restrict__ x, LogitArgs a) {
  constexpr int MT = kLmmaMt;
  constexpr bool kSplitA = sizeof(T) == 4;  // 16-bit values are exact in TF32
  extern __shared__ __align__(16) unsigned char lmma_smem[];
  const int tid = static_cast<int>(threadIdx.x), lane = tid & 31, warp = tid >> 5;
  const int tg = warp % kLmmaGroups, kp = warp / kLmmaGroups, g = lane >> 2, t = lane & 3;
  // blockIdx.x = token tile * splits + split: CTAs running at the same time read different fn
  // columns (with the tile fastest, every CTA of a wave read the same 96 KB of fn, from the same
  // L2 slices: 0.59 ms at 56% of DRAM bandwidth).
  const int64_t split = blockIdx.x % a.splits, tile = blockIdx.x / a.splits;
  const int64_t tile0 = tile * kLmmaTokens;
  const int kb = static_cast<int>(blockIdx.y) * kDynKpass;
  const int64_t mbeg = split * a.per_split, mend = min(a.flat, mbeg + a.per_split);
  // The K parts interleave by block (part kp takes blocks kp, kp + kLmmaParts, ...), so the warps
  // of a token group read adjacent 64-byte pieces of each row at the same time rather than pieces
  // a part of the split apart.
  const int64_t blocks = (mend - mbeg) / 16;
  const int64_t e_beg = mbeg + 16 * kp;
  const int64_t nblk = (blocks - kp + kLmmaParts - 1) / kLmmaParts;
  unsigned char* ring = lmma_smem + static_cast<size_t>(warp) * kLmmaStages * lmma_slot_bytes<T>();
  auto xslot = [&](int slot, int mt, int h) {
    return reinterpret_cast<T*>(ring + slot * lmma_slot_bytes<T>()) +
           ((mt * 2 + h) * 32 + lane) * 4;
  };
  auto fslot = [&](int slot, int nt) {
    return reinterpret_cast<float*>(ring + slot * lmma_slot_bytes<T>() + lmma_x_bytes<T>()) +
           (nt * 32 + lane) * 4;
  };
  // Padding rows (tokens past the end, outputs past K) re-read the last one and are discarded.
  const T* xr[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h)
      xr[mt][h] = x + min(tile0 + (tg * MT + mt) * 16 + h * 8 + g, a.tokens - 1) * a.st + 4 * t;
  const float* fr[3];
#pragma unroll
  for (int nt = 0; nt < 3; ++nt)
    fr[nt] = a.fn + static_cast<int64_t>(min(kb + nt * 8 + g, a.k - 1)) * a.fn_stride + 4 * t;
  // The copy cursor: flat index m of the next block to copy, its stream and the stream's end (one
  // division per warp; C % 16 == 0, so a block never straddles two streams).
  int64_t m_next = e_beg, stream = e_beg / a.channels;
  int64_t stream_end = (stream + 1) * a.channels;
  auto copy_block = [&](int slot) {
    while (m_next >= stream_end) ++stream, stream_end += a.channels;
    const int64_t xoff = stream * (a.si - a.channels);  // flat m sits at m + xoff in a token row
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        if constexpr (sizeof(T) == 4)
          cp_async16(xslot(slot, mt, h), xr[mt][h] + m_next + xoff);
        else
          cp_async8(xslot(slot, mt, h), xr[mt][h] + m_next + xoff);
      }
#pragma unroll
    for (int nt = 0; nt < 3; ++nt) cp_async16_l1(fslot(slot, nt), fr[nt] + m_next);
    m_next += 16 * kLmmaParts;
  };
#pragma unroll
  for (int st = 0; st < kLmmaStages - 1; ++st) {
    if (st < nblk) copy_block(st);
    cp_async_commit();  // empty groups keep the count uniform
  }
  float d[MT][3][4] = {};
  float ss[MT][2] = {};
  for (int64_t b = 0; b < nblk; ++b) {
    // The slot refilled here was read (by this lane only) in the previous iteration.
    const int slot = static_cast<int>(b % kLmmaStages);
    if (b + kLmmaStages - 1 < nblk)
      copy_block(static_cast<int>((b + kLmmaStages - 1) % kLmmaStages));
    cp_async_commit();
    cp_async_wait<kLmmaStages - 1>();
    float bv[3][4], av[MT][2][4];
    load_block_fragments<T, MT>(
        bv, av, ss, true, [&](int nt) { return *reinterpret_cast<const float4*>(fslot(slot, nt)); },
        [&](int mt, int h) { return static_cast<const T*>(xslot(slot, mt, h)); });
    mma_block16<MT, kSplitA>(d, av, bv);
  }
  cp_async_wait<0>();
  // The partials reuse the ring once every warp is done with it.
  __syncthreads();
  auto wpart = reinterpret_cast<float(*)[kLmmaTokens][kDynKpass]>(lmma_smem);
  auto wss = reinterpret_cast<float(*)[kLmmaTokens]>(lmma_smem + sizeof(float) * kLmmaParts *
                                                                     kLmmaTokens * kDynKpass);
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = (tg * MT + mt) * 16 + h * 8 + g;
      float sv = ss[mt][h];  // the 4 lanes of a row hold interleaved quarters of its elements
      sv += __shfl_xor_sync(0xffffffffu, sv, 1);
      sv += __shfl_xor_sync(0xffffffffu, sv, 2);
#pragma unroll
      for (int nt = 0; nt < 3; ++nt) {
        wpart[kp][row][nt * 8 + 2 * t] = d[mt][nt][2 * h];
        wpart[kp][row][nt * 8 + 2 * t + 1] = d[mt][nt][2 * h + 1];
      }
      if (t == 0) wss[kp][row] = sv;
    }
  __syncthreads();
  float* gout = a.g + split * a.tokens * a.k;
  for (int it = tid; it < kLmmaTokens * kDynKpass; it += kLmmaThreads) {
    const int row = it / kDynKpass, kk = it - row * kDynKpass;
    const int64_t tok = tile0 + row;
    if (tok >= a.tokens || kb + kk >= a.k) continue;
    float v = 0;
#pragma unroll
    for (int q = 0; q < kLmmaParts; ++q) v += wpart[q][row][kk];
    gout[tok * a.k + kb + kk] = v;
  }
  if (blockIdx.y == 0 && tid < kLmmaTokens && tile0 + tid < a.tokens) {
    float v = 0;
#pragma unroll
    for (int q = 0; q < kLmmaParts; ++q) v += wss[q][tid];
    a.ss[split * a.tokens + tile0 + tid] = v;
  }
}
template <class T>
constexpr bool lmma_partials_fit() {
  return lmma_smem_bytes<T>() >= sizeof(float) * kLmmaParts * kLmmaTokens * (kDynKpass + 1);
}
static_assert(lmma_partials_fit<float>() && lmma_partials_fit<__nv_bfloat16>(),
              "the partials reuse the ring");

// MMA: the products on tensor cores (3xTF32 for f32 X; 16-bit X is exact in TF32, so 2xTF32),
// tokens padded to 16-row tiles (padding rows re-read the last token and are discarded); needs
// every CTA's slice to be a multiple of 16 elements per stream (C % 128 == 0).
template <class T, int TPL, bool MMA = false>
__global__ void __launch_bounds__(kDynThreads, 1)
    dyn_collapse_kernel(T* __restrict__ y, const T* __restrict__ x, DynArgs a) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  namespace cg = cooperative_groups;
  constexpr int M = kDynTg * TPL;
  constexpr int VEC = 16 / static_cast<int>(sizeof(T));
  extern __shared__ __align__(16) unsigned char dyn_smem[];
  const int n = a.n, K = a.k, kp1 = a.k + 1;
  T* xs = reinterpret_cast<T*>(dyn_smem);
  float* wpart = reinterpret_cast<float*>(dyn_smem + static_cast<size_t>(M) * a.pitch * sizeof(T));
  float* wss = wpart + kDynWarps * M * kDynKpass;
  float* cpart = wss + kDynWarps * M;
  float* tot = cpart + 2 * M * kp1;
  float* pres = tot + M * kp1;
  cg::cluster_group cluster = cg::this_cluster();
  const int rank = static_cast<int>(cluster.block_rank());
  const int64_t ncl = gridDim.x / kDynCtas;
  const int qs = static_cast<int>(static_cast<int64_t>(rank) * a.q / kDynCtas);
  const int qe = static_cast<int>(static_cast<int64_t>(rank + 1) * a.q / kDynCtas);
  const int nch = qe - qs, cw = nch * VEC;
  const int64_t c0 = static_cast<int64_t>(qs) * VEC;
  const int tid = static_cast<int>(threadIdx.x), lane = tid & 31, warp = tid >> 5;
  const int tg = lane >> 2, kg = lane & 3;
  const int items = M * nch;  // (token slot, 16-byte chunk) pairs; one owner thread each

  // The owner of an item loads it, and later collapses it and refills it with the next tile's
  // data, so the refill needs no barrier.
  auto load_item = [&](int64_t tile, int item) {
    const int t = item / nch, ch = item - t * nch;
    const int64_t tok = tile * M + t;
    T* dst = xs + static_cast<int64_t>(t) * a.pitch + ch * VEC;
    if (tok < a.tokens) {
      const T* src = x + tok * a.x_st + c0 + ch * VEC;
      for (int i = 0; i < n; ++i) cp_async16(dst + i * cw, src + i * a.x_si);
    } else {  // tail slots: zeros, so the discarded products never read uninitialized memory
      for (int i = 0; i < n; ++i) *reinterpret_cast<uint4*>(dst + i * cw) = make_uint4(0, 0, 0, 0);
    }
  };

  const float* peer[kDynCtas];
#pragma unroll
  for (int r = 0; r < kDynCtas; ++r) peer[r] = cluster.map_shared_rank(cpart, r);

  int64_t tile = blockIdx.x / kDynCtas;
  if (a.stagger_ns && (tile & 3)) __nanosleep(static_cast<unsigned>(tile & 3) * a.stagger_ns);
  if (tile < a.tiles)
    for (int it = tid; it < items; it += kDynThreads) load_item(tile, it);
  const int groups = cw * n / 4;  // 4-element groups of the slice (cw is a multiple of 4)
  // MMA: whole 16-element blocks per warp.
  const int unit = MMA ? 4 : 1;
  const int g0 = unit * (warp * (groups / unit) / kDynWarps);
  const int g1 = unit * ((warp + 1) * (groups / unit) / kDynWarps);
  for (int buf = 0; tile < a.tiles; tile += ncl, buf ^= 1) {
    cp_async_wait_all();
    __syncthreads();
    float* cp = cpart + buf * M * kp1;
    for (int kb = 0; kb < K; kb += kDynKpass) {
      if constexpr (MMA) {
        mma_products<T, M>(xs, a, g0, g1, cw, c0, kb, warp, lane, wpart, wss);
      } else {
        float acc[TPL][kDynKpl] = {};
        float ss[TPL] = {};
        const float* frow[kDynKpl];
#pragma unroll
        for (int kk = 0; kk < kDynKpl; ++kk)
          frow[kk] = a.fn + static_cast<int64_t>(min(kb + kg * kDynKpl + kk, K - 1)) * a.fn_stride;
        // Stream by stream, so the inner loop is a plain strided walk the compiler can unroll with
        // all fn loads of the unrolled steps issued up front.
        for (int i = 0; i < n; ++i) {
          const int lo = max(g0, i * (cw / 4)), hi = min(g1, (i + 1) * (cw / 4));
          const int64_t col0 =
              i * a.channels + c0 - i * cw;  // fn column of slice element e: col0 + e
#pragma unroll 4
          for (int g = lo; g < hi; ++g) {
            const int e = g * 4;
            const int64_t col = col0 + e;
            float4 f[kDynKpl];
#pragma unroll
            for (int kk = 0; kk < kDynKpl; ++kk)
              f[kk] = __ldg(reinterpret_cast<const float4*>(frow[kk] + col));
#pragma unroll
            for (int j = 0; j < TPL; ++j) {
              float xv[4];
              load_vec<T, 4>(xs + (tg + kDynTg * j) * a.pitch + e, xv);
              if (kb == 0)
#pragma unroll
                for (int v = 0; v < 4; ++v) ss[j] = fmaf(xv[v], xv[v], ss[j]);
#pragma unroll
              for (int kk = 0; kk < kDynKpl; ++kk) {
                acc[j][kk] = fmaf(xv[0], f[kk].x, acc[j][kk]);
                acc[j][kk] = fmaf(xv[1], f[kk].y, acc[j][kk]);
                acc[j][kk] = fmaf(xv[2], f[kk].z, acc[j][kk]);
                acc[j][kk] = fmaf(xv[3], f[kk].w, acc[j][kk]);
              }
            }
          }
        }
#pragma unroll
        for (int j = 0; j < TPL; ++j) {
#pragma unroll
          for (int kk = 0; kk < kDynKpl; ++kk)
            wpart[(warp * M + tg + kDynTg * j) * kDynKpass + kg * kDynKpl + kk] = acc[j][kk];
          if (kb == 0 && kg == 0) wss[warp * M + tg + kDynTg * j] = ss[j];
        }
      }
      __syncthreads();
      for (int it = tid; it < M * kDynKpass; it += kDynThreads) {
        const int t = it / kDynKpass, kk = it - t * kDynKpass;
        if (kb + kk >= K) continue;
        float s = 0;
#pragma unroll
        for (int w = 0; w < kDynWarps; ++w) s += wpart[(w * M + t) * kDynKpass + kk];
        cp[t * kp1 + kb + kk] = s;
      }
      if (kb == 0)
        for (int t = tid; t < M; t += kDynThreads) {
          float s = 0;
#pragma unroll
          for (int w = 0; w < kDynWarps; ++w) s += wss[w * M + t];
          cp[t * kp1 + K] = s;
        }
      __syncthreads();
    }
    cluster.sync();  // every CTA's partials of this tile are visible cluster-wide
    const int off = buf * M * kp1;
    for (int it = tid; it < M * kp1; it += kDynThreads) {
      float s = 0;
#pragma unroll
      for (int r = 0; r < kDynCtas; ++r) s += peer[r][off + it];
      tot[it] = s;
    }
    __syncthreads();
    const int64_t t0 = tile * M;
    for (int it = tid; it < M * K; it += kDynThreads) {
      const int t = it / K, k = it - t * K;
      const int64_t tok = t0 + t;
      if (tok >= a.tokens) continue;
      const float inv_rms = rsqrtf(tot[t * kp1 + K] * a.inv_flat + a.norm_eps);
      const int f = k < n ? 0 : (k < 2 * n ? 1 : 2);
      const float v = inv_rms * tot[t * kp1 + k] * a.scale[f] + a.base[k];
      float o = v;  // comb: the logit, for comb_sinkhorn_kernel
      if (k < n) {
        o = sigmoid(v) + a.pre_eps;
        pres[t * n + k] = o;
      } else if (k < 2 * n) {
        o = 2.0f * sigmoid(v);
      }
      if (t % kDynCtas == rank) a.co[tok * a.co_stride + k] = o;
    }
    __syncthreads();
    const int64_t next = tile + ncl;
    for (int it = tid; it < items; it += kDynThreads) {
      const int t = it / nch, ch = it - t * nch;
      const int64_t tok = t0 + t;
      if (tok < a.tokens) {
        const T* src = xs + static_cast<int64_t>(t) * a.pitch + ch * VEC;
        float acc[VEC] = {};
        for (int i = 0; i < n; ++i) {
          float v[VEC];
          load_vec<T, VEC>(src + i * cw, v);
          const float w = pres[t * n + i];
#pragma unroll
          for (int e = 0; e < VEC; ++e) acc[e] = fmaf(w, v[e], acc[e]);
        }
        store_vec<T, VEC>(y + tok * a.y_st + c0 + ch * VEC, acc);
      }
      if (next < a.tiles) load_item(next, it);
    }
  }
  cluster.sync();  // no CTA may exit while a peer still reads its partials
#else
  (void)y, (void)x, (void)a;
#endif
}

// comb_sinkhorn_kernel with a warp per row and an element per lane (n * n <= 32): same bits.
constexpr int kCombWarps = 4;
__global__ void __launch_bounds__(kCombWarps * 32)
    comb_sinkhorn_lanes_kernel(float* co, int64_t stride, int64_t rows, int n, SinkhornParams sk) {
  const int lane = static_cast<int>(threadIdx.x & 31);
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kCombWarps + (threadIdx.x >> 5);
  if (r >= rows) return;  // uniform per warp
  float* o = co + r * stride + 2 * n;
  float v = lane < n * n ? o[lane] : 0.0f;
  v = sinkhorn_lanes(v, n, sk);
  if (lane < n * n) o[lane] = v;
}

// comb_sinkhorn_kernel for n = N with a row per thread in registers: the same expressions in the
// same order as sinkhorn_lanes (line sums in index order, one division per line), so the same
// bits, without a shuffle per term: the lanes form ran 16384 rows in 45 us on an H100 (issue-bound
// on shuffles, half the lanes idle), which was 14% of the one-pass dynamic collapse at bf16.
template <int N>
__global__ void __launch_bounds__(64)
    comb_sinkhorn_regs_kernel(float* co, int64_t stride, int64_t rows, SinkhornParams sk) {
  constexpr int NN = N * N;
  const int64_t r = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (r >= rows) return;
  float* o = co + r * stride + 2 * N;
  float v[NN];
#pragma unroll
  for (int k = 0; k < NN; ++k) v[k] = o[k];
  if (sk.init == 0) {
    float m = v[0];
#pragma unroll
    for (int k = 1; k < NN; ++k) m = fmaxf(m, v[k]);
#pragma unroll
    for (int k = 0; k < NN; ++k) v[k] = expf(v[k] - m);
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) {
      float m = v[i * N];
#pragma unroll
      for (int b = 1; b < N; ++b) m = fmaxf(m, v[i * N + b]);
      float e[N], sum = 0;
#pragma unroll
      for (int b = 0; b < N; ++b) e[b] = expf(v[i * N + b] - m);
#pragma unroll
      for (int b = 0; b < N; ++b) sum += e[b];
      const float inv = 1.0f / sum;
#pragma unroll
      for (int b = 0; b < N; ++b) v[i * N + b] = e[b] * inv + sk.eps;
    }
  }
  // Line i of a step: elements i * N + b (rows) or b * N + i (columns); two copies of the loop so
  // that every index is static (the array stays in registers).
  auto normalize = [&](auto at) {
#pragma unroll
    for (int i = 0; i < N; ++i) {
      float sum = 0;
#pragma unroll
      for (int b = 0; b < N; ++b) sum += v[at(i, b)];
      const float inv = 1.0f / (sum + sk.eps);
#pragma unroll
      for (int b = 0; b < N; ++b) v[at(i, b)] *= inv;
    }
  };
  const int steps = 2 * sk.iters - 1;
  for (int st = 0; st < steps; ++st) {
    if (((sk.first + st) & 1) == 0)
      normalize([](int i, int b) { return i * N + b; });
    else
      normalize([](int i, int b) { return b * N + i; });
  }
#pragma unroll
  for (int k = 0; k < NN; ++k) o[k] = v[k];
}

// The comb part of coeffs holds logits on entry and the Sinkhorn result on exit (one row per
// thread, in shared memory as in activate_kernel, with the same arithmetic).
__global__ void comb_sinkhorn_kernel(float* co, int64_t stride, int64_t rows, int n,
                                     SinkhornParams sk) {
  extern __shared__ float scratch[];
  const int64_t r = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (r >= rows) return;
  const int nn = n * n;
  float* p = scratch + threadIdx.x * activate_slot(n);
  float* o = co + r * stride + 2 * n;
  for (int k = 0; k < nn; ++k) p[k] = o[k];
  sinkhorn_inplace(p, n, sk, nullptr);
  for (int k = 0; k < nn; ++k) o[k] = p[k];
}

// ---- collapse: y[t, c] = sum_i pre[row(t), i] x[t, i, c]
// -------------------------------------------
struct EwArgs {
  int64_t tokens = 0, channels = 0, cvecs = 0;  // cvecs = ceil(C / VEC) chunks per token
  int n = 0, k = 0;
  int64_t x_st = 0, x_si = 0, y_st = 0, y_si = 0, z_st = 0;  // generic strides (see kernels)
  const float* co = nullptr;                                 // coefficient rows
  int64_t co_stride = 0;                                     // 0: one row for every token
};
constexpr int kEwThreads = 256;

// Static H with n <= kRegN (act.rows == 1): the coefficient row is not on the critical path. Each
// CTA forms pre = sigmoid(h_pre) + pre_eps itself (the same expression as activate_row, so y and
// coeffs agree to the bit), and thread 0 of CTA 0 writes the whole row (its serial Sinkhorn runs
// while the other CTAs stream) instead of a kernel launched before this one.
// Up to NMAX streams are loaded before any is used, so n loads are in flight per thread.
template <class T, int VEC, int NMAX = kRegN>
__global__ void __launch_bounds__(kEwThreads)
    collapse_kernel(T* __restrict__ y, const T* __restrict__ x, EwArgs a, ActivateArgs act) {
  __shared__ float spre[kRegN];
  __shared__ float scratch[kRegN * kRegN + 1];
  const float* pre = spre;
  if (act.rows == 1) {
    if (threadIdx.x < a.n) spre[threadIdx.x] = sigmoid(act.h_pre[threadIdx.x]) + act.pre_eps;
    if (blockIdx.x == 0 && threadIdx.x == 32) activate_row(act, 0, scratch);
    __syncthreads();
  }
  const int64_t id = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (id >= a.tokens * a.cvecs) return;
  const int64_t t = id / a.cvecs, c = (id - t * a.cvecs) * VEC;
  if (act.rows != 1) pre = a.co + t * a.co_stride;
  float acc[VEC] = {};
  const T* xt = x + t * a.x_st + c;
  if (a.n <= NMAX) {
    Pack<T, VEC> raw[NMAX];
#pragma unroll
    for (int i = 0; i < NMAX; ++i)
      if (i < a.n) raw[i] = *reinterpret_cast<const Pack<T, VEC>*>(xt + i * a.x_si);
#pragma unroll
    for (int i = 0; i < NMAX; ++i) {
      if (i >= a.n) break;
      const float w = pre[i];
#pragma unroll
      for (int e = 0; e < VEC; ++e) acc[e] = fmaf(w, to_float(raw[i].v[e]), acc[e]);
    }
  } else {
    for (int i = 0; i < a.n; ++i) {
      float v[VEC];
      load_vec<T, VEC>(xt + i * a.x_si, v);
      const float w = pre[i];
#pragma unroll
      for (int e = 0; e < VEC; ++e) acc[e] = fmaf(w, v[e], acc[e]);
    }
  }
  store_vec<T, VEC>(y + t * a.y_st + c, acc);
}

// ---- expand: out[t, i, c] = sum_j comb[j, i] x[t, j, c] + post[i] f[t, c]
// ------------------------- Up to NMAX streams stay in registers (X read once); beyond that they
// are re-read through L1. NMAX = 4 serves n <= 4 with half the registers of NMAX = kRegN (bf16:
// 124 -> about 64), i.e. twice the resident threads and loads in flight; the arithmetic is the
// same, so the bits are too.
template <class T, int VEC, int NMAX = kRegN>
__global__ void __launch_bounds__(kEwThreads, NMAX <= 4 ? 4 : 1)
    expand_kernel(T* __restrict__ out, const T* __restrict__ x, const T* __restrict__ f, EwArgs a) {
  const int64_t id = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (id >= a.tokens * a.cvecs) return;
  const int64_t t = id / a.cvecs, c = (id - t * a.cvecs) * VEC;
  const int n = a.n;
  const float* co = a.co + t * a.co_stride;
  const float* post = co + n;
  const float* comb = co + 2 * n;
  const T* xt = x + t * a.x_st + c;
  T* ot = out + t * a.y_st + c;  // y_st/y_si: out strides
  float fv[VEC];
  load_vec<T, VEC>(f + t * a.z_st + c, fv);
  if (n <= NMAX) {
    // Kept as stored (16-bit: half the registers) and widened where used.
    Pack<T, VEC> xr[NMAX];
#pragma unroll
    for (int j = 0; j < NMAX; ++j)
      if (j < n) xr[j] = *reinterpret_cast<const Pack<T, VEC>*>(xt + j * a.x_si);
#pragma unroll
    for (int i = 0; i < NMAX; ++i) {
      if (i >= n) break;
      float acc[VEC];
#pragma unroll
      for (int e = 0; e < VEC; ++e) acc[e] = post[i] * fv[e];
#pragma unroll
      for (int j = 0; j < NMAX; ++j) {
        if (j >= n) break;
        const float w = comb[j * n + i];
#pragma unroll
        for (int e = 0; e < VEC; ++e) acc[e] = fmaf(w, to_float(xr[j].v[e]), acc[e]);
      }
      store_vec<T, VEC>(ot + i * a.y_si, acc);
    }
    return;
  }
  for (int i = 0; i < n; ++i) {
    float acc[VEC];
#pragma unroll
    for (int e = 0; e < VEC; ++e) acc[e] = post[i] * fv[e];
    for (int j = 0; j < n; ++j) {
      float v[VEC];
      load_vec<T, VEC>(xt + j * a.x_si, v);
      const float w = comb[j * n + i];
#pragma unroll
      for (int e = 0; e < VEC; ++e) acc[e] = fmaf(w, v[e], acc[e]);
    }
    store_vec<T, VEC>(ot + i * a.y_si, acc);
  }
}

// ---- expand backward, elementwise part: dx_j = sum_i comb[j, i] dout_i, df = sum_i post_i dout_i
// --- x_st/x_si: dout strides; y_st/y_si: dx strides; z_st: df stride.
template <class T, int VEC>
__global__ void __launch_bounds__(kEwThreads)
    expand_bwd_kernel(T* __restrict__ dx, T* __restrict__ df, const T* __restrict__ dout,
                      EwArgs a) {
  const int64_t id = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (id >= a.tokens * a.cvecs) return;
  const int64_t t = id / a.cvecs, c = (id - t * a.cvecs) * VEC;
  const int n = a.n;
  const float* co = a.co + t * a.co_stride;
  const T* dt = dout + t * a.x_st + c;
  float dfa[VEC] = {};
  for (int i = 0; i < n; ++i) {
    float v[VEC];
    load_vec<T, VEC>(dt + i * a.x_si, v);
#pragma unroll
    for (int e = 0; e < VEC; ++e) dfa[e] = fmaf(co[n + i], v[e], dfa[e]);
  }
  store_vec<T, VEC>(df + t * a.z_st + c, dfa);
  for (int j = 0; j < n; ++j) {
    float acc[VEC] = {};
    for (int i = 0; i < n; ++i) {
      float v[VEC];
      load_vec<T, VEC>(dt + i * a.x_si, v);
      const float w = co[2 * n + j * n + i];
#pragma unroll
      for (int e = 0; e < VEC; ++e) acc[e] = fmaf(w, v[e], acc[e]);
    }
    store_vec<T, VEC>(dx + t * a.y_st + j * a.y_si + c, acc);
  }
}

// ---- per-token dot products over C (one CTA per token, one warp per output)
// ----------------------- mode 0 (expand backward): out[t, n + o'] for o' < n + n*n: dpost_i =
// <dout_i, f>, dcomb_ji =
//   <dout_i, x_j>; out[t, 0..n) = 0.   mode 1 (collapse backward): out[t, i] = <dy, x_i>, i < n.
struct DotArgs {
  int64_t tokens = 0, channels = 0;
  int n = 0, outputs = 0, mode = 0;
  int64_t a_st = 0, a_si = 0, b_st = 0, x_st = 0, x_si = 0;
  float* out = nullptr;
  int64_t out_stride = 0;
};
constexpr int kDotThreads = 256;
template <class T>
__global__ void __launch_bounds__(kDotThreads)
    token_dot_kernel(const T* __restrict__ amat, const T* __restrict__ bvec,
                     const T* __restrict__ x, DotArgs a) {
  const int64_t t = blockIdx.x;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, n = a.n;
  float* o = a.out + t * a.out_stride;
  if (a.mode == 0 && threadIdx.x < n) o[threadIdx.x] = 0.0f;
  for (int q = warp; q < a.outputs; q += kDotThreads / 32) {
    const T* p1;
    const T* p2;
    if (a.mode == 1) {
      p1 = bvec + t * a.b_st;
      p2 = x + t * a.x_st + q * a.x_si;
    } else if (q < n) {
      p1 = amat + t * a.a_st + q * a.a_si;
      p2 = bvec + t * a.b_st;
    } else {
      const int j = (q - n) / n, i = (q - n) % n;
      p1 = amat + t * a.a_st + i * a.a_si;
      p2 = x + t * a.x_st + j * a.x_si;
    }
    float s = 0;
    for (int64_t c = lane; c < a.channels; c += 32) s = fmaf(to_float(p1[c]), to_float(p2[c]), s);
    s = warp_sum(s);
    if (lane == 0) o[(a.mode == 0 ? n : 0) + q] = s;
  }
}

// ---- fixed-order column sums: dst[col] (+)= sum_r src[r, col]
// ---------------------------------------
struct ColSumArgs {
  int64_t rows = 0, cols = 0, src_stride = 0;
  const float* src = nullptr;
  float* dst = nullptr;
  int64_t dst_step = 1;  // element step between columns of dst
  int64_t dst_row_stride =
      0;  // for a [a, b] strided destination: col -> (col / dst_cols, col % dst_cols)
  int64_t dst_cols = 0;  // 0: use dst_step
};
constexpr int kSumThreads = 256;
__global__ void __launch_bounds__(kSumThreads) colsum_kernel(ColSumArgs a) {
  __shared__ float red[32];
  const int64_t col = blockIdx.x;
  float s = 0;
  for (int64_t r = threadIdx.x; r < a.rows; r += blockDim.x) s += a.src[r * a.src_stride + col];
  s = block_sum(s, red);
  if (threadIdx.x == 0) {
    const int64_t off =
        a.dst_cols ? (col / a.dst_cols) * a.dst_row_stride + col % a.dst_cols : col * a.dst_step;
    a.dst[off] = s;
  }
}

// dc[row, k] = dcoeffs[row, k] + (k < n ? dpre[row, k] : 0), dense dc.
__global__ void combine_dc_kernel(int64_t rows, int n, int k, const float* dcoeffs,
                                  int64_t dco_stride, const float* dpre, float* dc) {
  const int64_t id = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (id >= rows * k) return;
  const int64_t r = id / k;
  const int kk = static_cast<int>(id - r * k);
  dc[id] = dcoeffs[r * dco_stride + kk] + (kk < n ? dpre[r * n + kk] : 0.0f);
}

// Dynamic H, per token: dgk = r * dL * scale[f], coef = -r^3 / flat * sum_k dL scale[f] g,
// part[t, f] = sum_{k in f} dL * r * g (summed over tokens into dscale afterwards).
struct TokenBwdArgs {
  int64_t tokens = 0;
  int n = 0, k = 0;
  float inv_flat = 0, norm_eps = 0;
  const float* g = nullptr;
  const float* ss = nullptr;
  const float* dl = nullptr;
  const float* scale = nullptr;
  float* dgk = nullptr;
  float* coef = nullptr;
  float* part = nullptr;  // [tokens, 3]
};
__global__ void token_backward_kernel(TokenBwdArgs a) {
  const int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (t >= a.tokens) return;
  const float r = rsqrtf(a.ss[t] * a.inv_flat + a.norm_eps);
  float dr = 0, part[3] = {0, 0, 0};
  for (int k = 0; k < a.k; ++k) {
    const int f = k < a.n ? 0 : (k < 2 * a.n ? 1 : 2);
    const float d = a.dl[t * a.k + k], gk = a.g[t * a.k + k];
    part[f] += d * r * gk;
    const float dmix = d * a.scale[f];
    a.dgk[t * a.k + k] = r * dmix;
    dr += dmix * gk;
  }
  a.coef[t] = -dr * r * r * r * a.inv_flat;
  for (int f = 0; f < 3; ++f) a.part[t * 3 + f] = part[f];
}

// Collapse backward dx: dx[t, i, c] = pre[row(t), i] dy[t, c]
//   (+ dynamic: sum_k fn[k, i C + c] dgk[t, k] + coef[t] x[t, i, c]).
struct DxArgs {
  int64_t tokens = 0, channels = 0;
  int n = 0, k = 0;
  const float* co = nullptr;  // coefficient rows (pre part used)
  int64_t co_stride = 0;
  int64_t dx_st = 0, dx_si = 0, dy_st = 0, x_st = 0, x_si = 0;
  const float* fn = nullptr;  // dynamic only
  int64_t fn_stride = 0;
  const float* dgk = nullptr;
  const float* coef = nullptr;
};
template <class T>
__global__ void __launch_bounds__(kEwThreads)
    collapse_dx_kernel(T* __restrict__ dx, const T* __restrict__ dy, const T* __restrict__ x,
                       DxArgs a) {
  const int64_t per_token = a.n * a.channels;
  const int64_t id = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (id >= a.tokens * per_token) return;
  const int64_t t = id / per_token, m = id - t * per_token;
  const int64_t i = m / a.channels, c = m - i * a.channels;
  float v = a.co[t * a.co_stride + i] * to_float(dy[t * a.dy_st + c]);
  if (a.fn) {
    const float* dg = a.dgk + t * a.k;
    float s = 0;
    for (int k = 0; k < a.k; ++k) s = fmaf(a.fn[k * a.fn_stride + m], dg[k], s);
    v += s + a.coef[t] * to_float(x[t * a.x_st + i * a.x_si + c]);
  }
  dx[t * a.dx_st + i * a.dx_si + c] = from_float<T>(v);
}

// dfn[k, m] = sum_t dgk[t, k] x[t, m]: one thread per (m, block of 8 outputs), tokens in order.
constexpr int kDfnK = 8;
struct DfnArgs {
  int64_t tokens = 0, flat = 0, channels = 0, x_st = 0, x_si = 0;
  int k = 0;
  const float* dgk = nullptr;
  float* dfn = nullptr;
  int64_t dfn_stride = 0;
};
template <class T>
__global__ void __launch_bounds__(kEwThreads) dfn_kernel(const T* __restrict__ x, DfnArgs a) {
  const int64_t m = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const int k0 = blockIdx.y * kDfnK;
  if (m >= a.flat) return;
  const int64_t i = m / a.channels, c = m - i * a.channels;
  float acc[kDfnK] = {};
  for (int64_t t = 0; t < a.tokens; ++t) {
    const float xv = to_float(x[t * a.x_st + i * a.x_si + c]);
    const float* dg = a.dgk + t * a.k + k0;
#pragma unroll
    for (int q = 0; q < kDfnK; ++q)
      if (k0 + q < a.k) acc[q] = fmaf(dg[q], xv, acc[q]);
  }
#pragma unroll
  for (int q = 0; q < kDfnK; ++q)
    if (k0 + q < a.k) a.dfn[(k0 + q) * a.dfn_stride + m] = acc[q];
}

// ---- the seed's fused static forward: one CTA per token
// --------------------------------------------- co = [s_pre | s_post | M] (M[i, j], i destination).
// Pass 1 forms z and its sum of squares; pass 2 re-reads the token's X (64 KiB at n=4, C=4096 f32:
// an L2 hit) and writes every output once.
struct StaticFwdArgs {
  int64_t tokens = 0, channels = 0;
  int n = 0;
  int64_t x_st = 0, x_si = 0, o_st = 0, o_si = 0;
  const float* co = nullptr;
  const __nv_bfloat16* gamma = nullptr;
  float inv_c = 0, eps = 0;
};
constexpr int kStaticThreads = 256;
template <class T, int VEC>
__global__ void __launch_bounds__(kStaticThreads)
    static_forward_kernel(T* __restrict__ out, const T* __restrict__ x, StaticFwdArgs a) {
  __shared__ float red[32];
  const int64_t t = blockIdx.x;
  const int n = a.n;
  const float* pre = a.co;
  const float* post = a.co + n;
  const float* m = a.co + 2 * n;
  const T* xt = x + t * a.x_st;
  float ss = 0;
  for (int64_t c = threadIdx.x * VEC; c < a.channels; c += blockDim.x * VEC) {
    float z[VEC] = {};
    for (int j = 0; j < n; ++j) {
      float v[VEC];
      load_vec<T, VEC>(xt + j * a.x_si + c, v);
#pragma unroll
      for (int e = 0; e < VEC; ++e) z[e] = fmaf(pre[j], v[e], z[e]);
    }
#pragma unroll
    for (int e = 0; e < VEC; ++e) ss = fmaf(z[e], z[e], ss);
  }
  ss = block_sum(ss, red);
  const float inv = rsqrtf(ss * a.inv_c + a.eps);
  for (int64_t c = threadIdx.x * VEC; c < a.channels; c += blockDim.x * VEC) {
    float xr[kRegN][VEC];
    float z[VEC] = {};
    float gm[VEC];
    load_vec<__nv_bfloat16, VEC>(a.gamma + c, gm);
    if (n <= kRegN) {
#pragma unroll
      for (int j = 0; j < kRegN; ++j) {
        if (j >= n) break;
        load_vec<T, VEC>(xt + j * a.x_si + c, xr[j]);
#pragma unroll
        for (int e = 0; e < VEC; ++e) z[e] = fmaf(pre[j], xr[j][e], z[e]);
      }
#pragma unroll
      for (int i = 0; i < kRegN; ++i) {
        if (i >= n) break;
        float acc[VEC];
#pragma unroll
        for (int e = 0; e < VEC; ++e) acc[e] = post[i] * gm[e] * z[e] * inv;
#pragma unroll
        for (int j = 0; j < kRegN; ++j) {
          if (j >= n) break;
#pragma unroll
          for (int e = 0; e < VEC; ++e) acc[e] = fmaf(m[i * n + j], xr[j][e], acc[e]);
        }
        store_vec<T, VEC>(out + t * a.o_st + i * a.o_si + c, acc);
      }
    } else {
      for (int j = 0; j < n; ++j) {
        float v[VEC];
        load_vec<T, VEC>(xt + j * a.x_si + c, v);
#pragma unroll
        for (int e = 0; e < VEC; ++e) z[e] = fmaf(pre[j], v[e], z[e]);
      }
      for (int i = 0; i < n; ++i) {
        float acc[VEC];
#pragma unroll
        for (int e = 0; e < VEC; ++e) acc[e] = post[i] * gm[e] * z[e] * inv;
        for (int j = 0; j < n; ++j) {
          float v[VEC];
          load_vec<T, VEC>(xt + j * a.x_si + c, v);
#pragma unroll
          for (int e = 0; e < VEC; ++e) acc[e] = fmaf(m[i * n + j], v[e], acc[e]);
        }
        store_vec<T, VEC>(out + t * a.o_st + i * a.o_si + c, acc);
      }
    }
  }
}

// ---- static forward, one token per CTA held in registers
// --------------------------------------- A CTA owns one token and its threads load all of their
// chunks (up to kRegsMaxCols 16-byte chunks per stream, n <= kHoldN streams) before using any, so
// X is read once, straight into registers, and several CTAs per SM overlap one token's barriers
// with another's loads. (It replaced a persistent kernel with a shared-memory ring of tokens, one
// 512-thread CTA per SM, whose per-token block sum and store burst stalled the SM's only CTA:
// f32 0.840 / bf16 0.449 ms, 85% / 80% of copy; removed after the one-token kernels measured
// faster everywhere, docs/perf/mhc.md.) The coefficient row comes from a one-warp activation in
// front (one Sinkhorn, not one per CTA).
constexpr int kHoldN = 4;
constexpr int kRegsThreads = 256, kRegsMaxCols = 4;
// A thread's register-held chunks: COLS chunks (tid + u * THREADS) of each of the n <= kHoldN
// streams, stream j at src + j * stream_stride (global memory or a shared-memory slot).
template <class T, int VEC, int COLS, int THREADS>
__device__ __forceinline__ void load_held(Pack<T, VEC> (&xr)[COLS][kHoldN], const T* src,
                                          int64_t stream_stride, int64_t q, int n, int tid) {
#pragma unroll
  for (int u = 0; u < COLS; ++u) {
    const int64_t cc = tid + u * THREADS;
    if (cc >= q) break;
#pragma unroll
    for (int j = 0; j < kHoldN; ++j) {
      if (j >= n) break;
      xr[u][j] = *reinterpret_cast<const Pack<T, VEC>*>(src + j * stream_stride + cc * VEC);
    }
  }
}
// z = sum_j pre_j x_j of one held chunk, j in order.
template <class T, int VEC>
__device__ __forceinline__ void held_z(const Pack<T, VEC> (&xr)[kHoldN], const float* pre, int n,
                                       float (&z)[VEC]) {
#pragma unroll
  for (int e = 0; e < VEC; ++e) z[e] = 0.0f;
#pragma unroll
  for (int j = 0; j < kHoldN; ++j) {
    if (j >= n) break;
#pragma unroll
    for (int e = 0; e < VEC; ++e) z[e] = fmaf(pre[j], to_float(xr[j].v[e]), z[e]);
  }
}
// Outputs of one register-held chunk (kHoldN packs, one per stream): out_i = sum_j m[i, j] x_j,
// j in order, plus post_i z, where z is already scaled by gamma and the token's 1 / rms.
template <class T, int VEC>
__device__ __forceinline__ void held_chunk_outputs(const Pack<T, VEC> (&xr)[kHoldN],
                                                   const float (&z)[VEC], const float* m,
                                                   const float* post, int n, T* o, int64_t o_si) {
#pragma unroll
  for (int i = 0; i < kHoldN; ++i) {
    if (i >= n) break;
    float acc[VEC] = {};
#pragma unroll
    for (int j = 0; j < kHoldN; ++j) {
      if (j >= n) break;
      const float w = m[i * n + j];
#pragma unroll
      for (int e = 0; e < VEC; ++e) acc[e] = fmaf(w, to_float(xr[j].v[e]), acc[e]);
    }
#pragma unroll
    for (int e = 0; e < VEC; ++e) acc[e] = fmaf(post[i], z[e], acc[e]);
    store_vec<T, VEC>(o + i * o_si, acc);
  }
}
// Blocks per SM the register budget is written for: 16-bit C = 4096 (COLS = 2) fits three 32 KiB
// tokens per SM, f32 C = 4096 (COLS = 4) two 64 KiB ones.
template <int COLS>
constexpr int regs_min_blocks() {
  return COLS <= 1 ? 4 : (COLS == 2 ? 3 : 2);
}
template <class T, int COLS>
__global__ void __launch_bounds__(kRegsThreads, regs_min_blocks<COLS>())
    static_forward_regs_kernel(T* __restrict__ out, const T* __restrict__ x, StaticFwdArgs a) {
  constexpr int VEC = 16 / static_cast<int>(sizeof(T));
  __shared__ float red[32];
  __shared__ float co[(2 + kHoldN) * kHoldN];
  const int n = a.n, tid = static_cast<int>(threadIdx.x);
  const int64_t q = a.channels / VEC;
  const T* xt = x + int64_t{blockIdx.x} * a.x_st;
  T* ot = out + int64_t{blockIdx.x} * a.o_st;
  Pack<T, VEC> xr[COLS][kHoldN];
  load_held<T, VEC, COLS, kRegsThreads>(xr, xt, a.x_si, q, n, tid);
  // The coefficient row reaches shared memory while the loads are in flight.
  if (tid < (2 + n) * n) co[tid] = a.co[tid];
  __syncthreads();
  const float* pre = co;
  const float* post = co + n;
  const float* m = co + 2 * n;
  // z = sum_j pre_j x_j is formed twice (for the sum of squares, then for the outputs) rather than
  // held: registers decide how many tokens an SM keeps in flight.
  float ss = 0;
#pragma unroll
  for (int u = 0; u < COLS; ++u) {
    if (tid + u * kRegsThreads >= q) break;
    float z[VEC];
    held_z<T, VEC>(xr[u], pre, n, z);
#pragma unroll
    for (int e = 0; e < VEC; ++e) ss = fmaf(z[e], z[e], ss);
  }
  ss = block_sum(ss, red);
  const float inv = rsqrtf(ss * a.inv_c + a.eps);
#pragma unroll
  for (int u = 0; u < COLS; ++u) {
    const int64_t cc = tid + u * kRegsThreads;
    if (cc >= q) break;
    float z[VEC], gm[VEC];
    held_z<T, VEC>(xr[u], pre, n, z);
    load_vec<__nv_bfloat16, VEC>(a.gamma + cc * VEC, gm);
#pragma unroll
    for (int e = 0; e < VEC; ++e) z[e] *= gm[e] * inv;
    held_chunk_outputs<T, VEC>(xr[u], z, m, post, n, ot + cc * VEC, a.o_si);
  }
}

// The two passes over one token held in shared memory (stream j at xt + j * C); a thread covers
// chunks tid, tid + THREADS, ...
// Pass 1: the thread's share of sum_c z_c^2 with z = sum_j pre_j x_j.
template <class T, int THREADS>
__device__ __forceinline__ float token_sum_sq(const T* xt, const StaticFwdArgs& a, const float* pre,
                                              int tid) {
  constexpr int VEC = 16 / static_cast<int>(sizeof(T));
  const int64_t q = a.channels / VEC;
  float ss = 0;
  for (int64_t cc = tid; cc < q; cc += THREADS) {
    float z[VEC] = {};
    for (int j = 0; j < a.n; ++j) {
      float v[VEC];
      load_vec<T, VEC>(xt + j * a.channels + cc * VEC, v);
#pragma unroll
      for (int e = 0; e < VEC; ++e) z[e] = fmaf(pre[j], v[e], z[e]);
    }
#pragma unroll
    for (int e = 0; e < VEC; ++e) ss = fmaf(z[e], z[e], ss);
  }
  return ss;
}
// Pass 2: out_i = sum_j m[i, j] x_j + post_i (gamma z inv), accumulated over j in order, then the
// post term. co = [pre | post | m].
template <class T, int NMAX, int THREADS>
__device__ __forceinline__ void token_outputs(const T* xt, T* ot, const StaticFwdArgs& a,
                                              const float* co, float inv, int tid) {
  constexpr int VEC = 16 / static_cast<int>(sizeof(T));
  const int n = a.n;
  const float* pre = co;
  const float* post = co + n;
  const float* m = co + 2 * n;
  const int64_t q = a.channels / VEC;
  for (int64_t cc = tid; cc < q; cc += THREADS) {
    float acc[NMAX][VEC] = {};
    float z[VEC] = {};
#pragma unroll
    for (int j = 0; j < NMAX; ++j) {
      if (j >= n) break;
      float v[VEC];
      load_vec<T, VEC>(xt + j * a.channels + cc * VEC, v);
#pragma unroll
      for (int e = 0; e < VEC; ++e) z[e] = fmaf(pre[j], v[e], z[e]);
#pragma unroll
      for (int i = 0; i < NMAX; ++i) {
        if (i >= n) break;
#pragma unroll
        for (int e = 0; e < VEC; ++e) acc[i][e] = fmaf(m[i * n + j], v[e], acc[i][e]);
      }
    }
    float gm[VEC];
    load_vec<__nv_bfloat16, VEC>(a.gamma + cc * VEC, gm);
#pragma unroll
    for (int e = 0; e < VEC; ++e) z[e] *= gm[e] * inv;
#pragma unroll
    for (int i = 0; i < NMAX; ++i) {
      if (i >= n) break;
#pragma unroll
      for (int e = 0; e < VEC; ++e) acc[i][e] = fmaf(post[i], z[e], acc[i][e]);
      store_vec<T, VEC>(ot + i * a.o_si + cc * VEC, acc[i]);
    }
  }
}

// ---- static forward, one token per CTA staged in shared memory
// -------------------------------- static_forward_regs' structure with the token copied to shared
// memory by cp.async instead of held in registers: a 16-bit token (32 KiB at n * C = 16384) then
// costs no registers, so an SM keeps four tokens in flight (64 registers per thread; shared memory
// would hold six), where registers capped the register kernel at three with spills. Each thread
// copies and reads back only its own chunks, so the only barriers are the coefficient row's and
// the block sum's.
template <class T, int NMAX>
__global__ void __launch_bounds__(kRegsThreads, NMAX <= 4 ? 4 : 2)
    static_forward_staged_kernel(T* __restrict__ out, const T* __restrict__ x, StaticFwdArgs a) {
  constexpr int VEC = 16 / static_cast<int>(sizeof(T));
  extern __shared__ __align__(16) unsigned char staged_smem[];
  __shared__ float red[32];
  __shared__ float co[(2 + NMAX) * NMAX];
  T* xs = reinterpret_cast<T*>(staged_smem);
  const int n = a.n, tid = static_cast<int>(threadIdx.x);
  const int64_t q = a.channels / VEC;
  const T* xt = x + int64_t{blockIdx.x} * a.x_st;
  T* ot = out + int64_t{blockIdx.x} * a.o_st;
  for (int j = 0; j < n; ++j)
    for (int64_t cc = tid; cc < q; cc += kRegsThreads)
      cp_async16(xs + j * a.channels + cc * VEC, xt + j * a.x_si + cc * VEC);
  cp_async_commit();
  if (tid < (2 + n) * n) co[tid] = a.co[tid];
  __syncthreads();
  cp_async_wait_pending(0);  // this thread's own chunks; no other thread reads them
  const float ss = block_sum(token_sum_sq<T, kRegsThreads>(xs, a, co, tid), red);
  token_outputs<T, NMAX, kRegsThreads>(xs, ot, a, co, rsqrtf(ss * a.inv_c + a.eps), tid);
}

}  // namespace
}  // namespace baracuda::mhc_cuda
