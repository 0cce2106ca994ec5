// CUDA kernels of the ssd family, templated on the device element type T (f32 math inside).
//
// Forward (dense batches): the chunked SSD algorithm of Mamba-2, four launches
//   1. prep        per (chunk, b, h): v = processed dt, cum = inclusive cumsum of v*A in the chunk
//   2. chunk_state per (chunk, b, h, 64x64 tile of [D, N]):
//                  S_c = sum_s exp(cum_last - cum_s) v_s x_s (outer) B_s   ([D x cs] x [cs x N])
//   3. state_pass  per (b, h, state element): the short scan over chunks; S_c becomes the state
//                  entering chunk c, the last one goes to final_states
//   4. chunk_out   per (chunk, 64-token tile, 64-column tile of D, b, h):
//                  y_t = exp(cum_t) C_t . S_c + sum_{s<=t} (C_t . B_s) exp(cum_t - cum_s) v_s x_s,
//                  then the D skip and the silu(z) gate
// Varlen forward: one warp per (sequence, head, row d) runs the recurrence (states reset at every
// sequence start, so chunks that straddle sequences never arise).
// Backward, dense: the chunked (matrix-form) adjoint, see "backward, chunked" below and
// docs/perf/ssd.md. Backward, varlen (and the A/B baseline): one block of 8 warps per (sequence,
// head, 8 rows of D): a forward sweep leaves a checkpoint every 16 tokens, the reverse sweep
// recomputes 16 states at a time into shared memory and runs the exact adjoint; sums over D go
// through per-block partial buffers that small reduction kernels add in a fixed order. No float
// atomics anywhere: every kernel is deterministic. Decode: one warp per (b, h, d) row of the
// state, updated in place.
// chunked_wmma_vec (16-bit, forward and backward): chunked_wmma's kernels with operands staged as
// 16-byte vectors (TileSrc / fetch_stage / commit_stage) and, in the backward, dB/dC blocks that
// cover every N tile and add up to 8 heads of a group, dCB formed once per group for dB and dC,
// and dx on mma.sync for aligned operands: forward bitwise equal to chunked_wmma, backward equal
// to rounding (other association and exponential), each deterministic. *_fastpass (chunked_wmma
// forward, chunked_wmma_vec backward): the inter-chunk passes by chunk_scan_kernel (16-byte
// vectors, 4 chunks in flight per thread) instead of state_pass / bwd_state_rev; bitwise equal.
// chunked_mma_fastpass (16-bit: the default backward, the forward where fused_mma is not):
// the fastpass variants with their largest products on mma.sync (register accumulators, cp.async
// or register-staged operand rings, hb heads per block sharing the group's tiles, decays factored
// through one reference token per tile; forward_mma.cuh and the *_mma_kernel below) where the
// operands allow 16-byte copies: the chunk states, chunk_out, U_c, dCB, dB and dC; equal to the
// WMMA variants to rounding, deterministic. The 16-bit backward's scans also leave the states and
// adjoints rounded to T (st16, gst16) for the products that take them as operands (the same
// rounding, done once). fused_mma (16-bit forward, head_dim <= 64, state_dim <= 128; the
// default there as fused_mma_ranked_ahead where B * H fills the SMs): one launch, one block per
// (b, h) carrying the state across chunks (forward_fused.cuh). fused_wgmma_sm90a (16-bit forward,
// chunks 128 and 256, sm_90a; the default there as fused_wgmma_sm90a_ranked_ahead where B * H
// fills the SMs): the same walk on wgmma with tensor-map copies (forward_wgmma.cuh).
// ssd::StageSink times every launch.
#pragma once

#include <mma.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "baracuda/ops/ssd.hpp"
#include "core/cuda/async_copy.cuh"
#include "core/cuda/flags.cuh"
#include "core/cuda/launch.cuh"
#include "core/cuda/mma.cuh"

namespace baracuda::ssd_cuda {

using cuda::cp_async16;
using cuda::cp_async4;
using cuda::cp_async_commit;
using cuda::cp_async_wait;
using cuda::from_float;
using cuda::to_float;

constexpr int kTile = 64;      // GEMM tile edge (tokens, D columns, N columns)
constexpr int kTileK = 16;     // GEMM k step
constexpr int kThreads = 256;  // GEMM block: 16 x 16 threads, 4 x 4 outputs each
constexpr int kCkpt = 16;      // backward: tokens between checkpoints (and per recompute)
constexpr int kBwdWarps = 8;   // backward: rows of D per block
constexpr int kMaxLane = 8;    // N <= 256 = 8 per lane

// ---- strided views
// -----------------------------------------------------------------------------
template <class T>
struct V1 {
  T* p;
  int64_t s0;
  __device__ __forceinline__ T& at(int64_t a) const { return p[a * s0]; }
};
template <class T>
struct V2 {
  T* p;
  int64_t s0, s1;
  __device__ __forceinline__ T& at(int64_t a, int64_t b) const { return p[a * s0 + b * s1]; }
};
template <class T>
struct V3 {
  T* p;
  int64_t s0, s1, s2;
  __device__ __forceinline__ T& at(int64_t a, int64_t b, int64_t c) const {
    return p[a * s0 + b * s1 + c * s2];
  }
};
template <class T>
struct V4 {
  T* p;
  int64_t s0, s1, s2, s3;
  __device__ __forceinline__ T& at(int64_t a, int64_t b, int64_t c, int64_t d) const {
    return p[a * s0 + b * s1 + c * s2 + d * s3];
  }
};

template <class T, class Ptr>
T* ptr_of(const BasicTensor<Ptr>& t) {
  return static_cast<T*>(const_cast<void*>(static_cast<const void*>(t.data)));
}
template <class T, class Ptr>
V1<T> v1(const BasicTensor<Ptr>& t) {
  return {ptr_of<T>(t), t.stride[0]};
}
template <class T, class Ptr>
V3<T> v3(const BasicTensor<Ptr>& t) {
  return {ptr_of<T>(t), t.stride[0], t.stride[1], t.stride[2]};
}
template <class T, class Ptr>
V4<T> v4(const BasicTensor<Ptr>& t) {
  return {ptr_of<T>(t), t.stride[0], t.stride[1], t.stride[2], t.stride[3]};
}
// D as [H, D]: per-head D broadcasts along the second axis (stride 0).
template <class T, class Ptr>
V2<T> dskip_view(const BasicTensor<Ptr>& t, ssd::DSkip k) {
  if (k == ssd::DSkip::per_channel) return {ptr_of<T>(t), t.stride[0], t.stride[1]};
  return {ptr_of<T>(t), k == ssd::DSkip::per_head ? t.stride[0] : 0, 0};
}

// ---- parameters
// ----------------------------------------------------------------------------------
template <class T>
struct Common {
  int64_t B, L, H, D, N, hpg, cs, nchunks, S, Lpad;
  V4<const T> x, z, Bm, Cm;
  V3<const T> dt;
  V1<const float> A, bias;
  V2<const float> Dv;
  V4<const float> init;
  V1<const int32_t> cu;
  bool has_d, has_z, has_bias, has_init, softplus, varlen;
  float dt_min, dt_max;
};

template <class T>
struct Fwd : Common<T> {
  V4<T> y;
  V4<float> fin;
  bool has_fin;
  float* dtp;            // workspace: processed dt
  double* cum;           // workspace: in-chunk cumsum of v*A, in f64 so that cum_t -
                         // cum_s keeps f32 accuracy where |cum| is large (f32 cumsums
                         // drift by |cum| * 6e-8)
  float* st;             // workspace: chunk states
  float* cb;             // workspace (tensor-core path): C_t . B_s per group and chunk,
                         // [cs][cs] f32
  T* st_t = nullptr;     // workspace (chunked_wmma_fastpass): the scanned states rounded to T, the
                         // values chunk_out's product rounds them to anyway
  int64_t hb = 1;        // chunked_mma_fastpass: heads per chunk_out block (divides hpg)
  int64_t hb_state = 1;  // and per chunk_state block
  // fused_mma cut into segments (ssd_segments): chunks per segment, and in the workspace the
  // ticket counter and one ready flag per handed-off state (zeroed before the launch) and the
  // states themselves (f32, in the accumulator order of the kernel's threads).
  int segments = 1;
  int64_t seg_chunks = 0;
  unsigned *ticket = nullptr, *ready = nullptr;
  float* handoff = nullptr;
};

template <class T>
struct Bwd : Common<T> {
  V4<const T> dy;
  V4<const float> dfin;
  bool has_dfin;
  V4<T> dx, dz, dBo, dCo;
  V3<T> ddt;
  V1<float> dA, dbias;
  V2<float> dD;
  V4<float> dinit;
  bool per_channel;
  int64_t ndg, nck;
  float *ckpt, *pdB, *pdC, *pddt, *pdA, *pdD, *draw;  // workspace
};

template <class T, class Args>
Common<T> common_of(const ssd::Problem& p, const Args& a) {
  Common<T> c;
  c.B = p.batch, c.L = p.seqlen, c.H = p.heads, c.D = p.head_dim, c.N = p.state_dim;
  c.hpg = p.heads_per_group, c.cs = p.chunk_size, c.nchunks = p.nchunks, c.S = p.seqs;
  c.Lpad = p.nchunks * p.chunk_size;
  c.x = v4<const T>(a.x), c.Bm = v4<const T>(a.B), c.Cm = v4<const T>(a.C);
  c.z = p.has_z ? v4<const T>(a.z) : V4<const T>{};
  c.dt = v3<const T>(a.dt);
  c.A = v1<const float>(a.A);
  c.bias = p.has_dt_bias ? v1<const float>(a.dt_bias) : V1<const float>{};
  c.Dv = dskip_view<const float>(a.D, p.d_skip);
  c.init = p.has_initial_states ? v4<const float>(a.initial_states) : V4<const float>{};
  c.cu = p.varlen() ? v1<const int32_t>(a.cu_seqlens) : V1<const int32_t>{};
  c.has_d = p.d_skip != ssd::DSkip::none, c.has_z = p.has_z, c.has_bias = p.has_dt_bias;
  c.has_init = p.has_initial_states, c.softplus = p.dt_softplus, c.varlen = p.varlen();
  c.dt_min = p.dt_min, c.dt_max = p.dt_max;
  return c;
}

// The forward's parameters: the common views plus y and final_states (workspace pointers unset).
template <class T>
Fwd<T> forward_params(const ssd::Problem& pr, const SsdForwardOp::Arguments& a) {
  Fwd<T> p;
  static_cast<Common<T>&>(p) = common_of<T>(pr, a);
  p.y = v4<T>(a.y);
  p.has_fin = pr.has_final_states;
  p.fin = pr.has_final_states ? v4<float>(a.final_states) : V4<float>{};
  return p;
}

// ---- device helpers
// ------------------------------------------------------------------------------
struct StepF {
  float v, dv_draw;
};
__device__ __forceinline__ StepF process_dt(float raw, bool softplus, float lo, float hi) {
  float v = raw, dv = 1.0f;
  if (softplus) {
    v = raw > 0.0f ? raw + log1pf(expf(-raw)) : log1pf(expf(raw));
    dv = 1.0f / (1.0f + expf(-raw));
  }
  if (v < lo) v = lo, dv = 0.0f;
  if (v > hi) v = hi, dv = 0.0f;
  return {v, dv};
}

template <class T>
__device__ __forceinline__ StepF step_at(const Common<T>& p, int64_t b, int64_t t, int64_t h) {
  const float raw = to_float(p.dt.at(b, t, h)) + (p.has_bias ? p.bias.at(h) : 0.0f);
  return process_dt(raw, p.softplus, p.dt_min, p.dt_max);
}

// Sequence s covers tokens [t0, t1) of batch row b. Device cu_seqlens is
// clamped, never trusted.
template <class T>
__device__ __forceinline__ void seq_range(const Common<T>& p, int64_t s, int64_t& b, int64_t& t0,
                                          int64_t& t1) {
  if (!p.varlen) {
    b = s, t0 = 0, t1 = p.L;
    return;
  }
  b = 0;
  const int64_t lo = p.cu.at(s), hi = p.cu.at(s + 1);
  t0 = lo < 0 ? 0 : (lo > p.L ? p.L : lo);
  t1 = hi < t0 ? t0 : (hi > p.L ? p.L : hi);
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float silu(float z) {
  return z / (1.0f + expf(-z));
}

// acc[i][j] += sum_k As[k][ty + 16 i] * Bs[k][tx + 16 j] over one k step held
// in shared memory.
__device__ __forceinline__ void mma_step(float (&acc)[4][4], const float (*As)[kTile + 4],
                                         const float (*Bs)[kTile + 4], int tx, int ty) {
#pragma unroll
  for (int k = 0; k < kTileK; ++k) {
    float a[4], b[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) a[i] = As[k][ty + 16 * i], b[i] = Bs[k][tx + 16 * i];
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
  }
}

// ---- forward, chunked
// ------------------------------------------------------------------------------
template <class T>
__global__ void prep_kernel(Fwd<T> p) {
  extern __shared__ double scan[];
  const int64_t c = blockIdx.x, bh = blockIdx.y, b = bh / p.H, h = bh % p.H;
  const int i = threadIdx.x;
  const int64_t t = c * p.cs + i;
  float v = 0.0f;
  double l = 0.0;  // padding tokens: no step, no decay
  if (t < p.L) {
    v = step_at(p, b, t, h).v;
    l = static_cast<double>(v) * p.A.at(h);
  }
  scan[i] = l;
  __syncthreads();
  for (int off = 1; off < p.cs; off <<= 1) {  // Hillis-Steele: fixed order, deterministic
    const double add = i >= off ? scan[i - off] : 0.0;
    __syncthreads();
    scan[i] += add;
    __syncthreads();
  }
  const int64_t o = bh * p.Lpad + t;
  p.dtp[o] = v;
  p.cum[o] = scan[i];
}

template <class T>
__global__ void __launch_bounds__(kThreads) chunk_state_kernel(Fwd<T> p) {
  __shared__ float As[kTileK][kTile + 4], Bs[kTileK][kTile + 4];
  const int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;
  const int64_t tiles_n = (p.N + kTile - 1) / kTile;
  const int64_t d0 = (blockIdx.x / tiles_n) * kTile, n0 = (blockIdx.x % tiles_n) * kTile;
  const int64_t c = blockIdx.y, bh = blockIdx.z, b = bh / p.H, h = bh % p.H, g = h / p.hpg;
  const int64_t t_base = c * p.cs, o_base = bh * p.Lpad + t_base;
  const int64_t K = p.L - t_base < p.cs ? p.L - t_base : p.cs;
  const double last = p.cum[o_base + p.cs - 1];
  float acc[4][4] = {};
  for (int64_t k0 = 0; k0 < K; k0 += kTileK) {
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int idx = tid + r * kThreads, kk = idx / kTile, mm = idx % kTile;
      const int64_t k = k0 + kk;
      float xa = 0.0f, bb = 0.0f;
      if (k < K) {
        const float w = expf(static_cast<float>(last - p.cum[o_base + k])) * p.dtp[o_base + k];
        if (d0 + mm < p.D) xa = to_float(p.x.at(b, t_base + k, h, d0 + mm)) * w;
        if (n0 + mm < p.N) bb = to_float(p.Bm.at(b, t_base + k, g, n0 + mm));
      }
      As[kk][mm] = xa;
      Bs[kk][mm] = bb;
    }
    __syncthreads();
    mma_step(acc, As, Bs, tx, ty);
    __syncthreads();
  }
  float* out = p.st + (bh * p.nchunks + c) * p.D * p.N;
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t d = d0 + ty + 16 * i, n = n0 + tx + 16 * j;
      if (d < p.D && n < p.N) out[d * p.N + n] = acc[i][j];
    }
}

template <class T>
__global__ void state_pass_kernel(Fwd<T> p) {
  const int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  const int64_t bh = blockIdx.y, b = bh / p.H, h = bh % p.H;
  if (e >= p.D * p.N) return;
  const int64_t d = e / p.N, n = e % p.N;
  float s = p.has_init ? p.init.at(b, h, d, n) : 0.0f;
  for (int64_t c = 0; c < p.nchunks; ++c) {
    float* cell = p.st + (bh * p.nchunks + c) * p.D * p.N + e;
    const float own = *cell;
    *cell = s;  // the state entering chunk c
    s = expf(static_cast<float>(p.cum[bh * p.Lpad + c * p.cs + p.cs - 1])) * s + own;
  }
  if (p.has_fin) p.fin.at(b, h, d, n) = s;
}

template <class T>
__global__ void __launch_bounds__(kThreads) chunk_out_kernel(Fwd<T> p) {
  __shared__ float As[kTileK][kTile + 4], Bs[kTileK][kTile + 4];
  __shared__ float Gs[kTile][kTile + 1];
  const int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;
  const int64_t tiles_t = p.cs / kTile;
  const int64_t c = blockIdx.x / tiles_t, t_lo = (blockIdx.x % tiles_t) * kTile;
  const int64_t d0 = blockIdx.y * int64_t{kTile};
  const int64_t bh = blockIdx.z, b = bh / p.H, h = bh % p.H, g = h / p.hpg;
  const int64_t t_base = c * p.cs, o_base = bh * p.Lpad + t_base;
  const int64_t K = p.L - t_base < p.cs ? p.L - t_base : p.cs;  // valid tokens in the chunk
  if (t_lo >= K) return;                                        // uniform over the block
  const float* S0 = p.st + (bh * p.nchunks + c) * p.D * p.N;
  float acc[4][4] = {};
  // (1) the state entering the chunk: acc[t][d] = sum_n C[t, n] S0[d, n],
  // scaled by exp(cum_t).
  for (int64_t k0 = 0; k0 < p.N; k0 += kTileK) {
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int idx = tid + r * kThreads, kk = idx % kTileK, mm = idx / kTileK;
      const int64_t k = k0 + kk;
      As[kk][mm] =
          (t_lo + mm < K && k < p.N) ? to_float(p.Cm.at(b, t_base + t_lo + mm, g, k)) : 0.0f;
      Bs[kk][mm] = (d0 + mm < p.D && k < p.N) ? S0[(d0 + mm) * p.N + k] : 0.0f;
    }
    __syncthreads();
    mma_step(acc, As, Bs, tx, ty);
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int64_t t = t_lo + ty + 16 * i;
    const float e = t < K ? expf(static_cast<float>(p.cum[o_base + t])) : 0.0f;
#pragma unroll
    for (int j = 0; j < 4; ++j) acc[i][j] *= e;
  }
  // (2) tokens of this chunk up to t: G = (C B^T) masked and weighted, then acc
  // += G X.
  for (int64_t s0 = 0; s0 < K && s0 <= t_lo + kTile - 1; s0 += kTile) {
    float gacc[4][4] = {};
    for (int64_t k0 = 0; k0 < p.N; k0 += kTileK) {
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const int idx = tid + r * kThreads, kk = idx % kTileK, mm = idx / kTileK;
        const int64_t k = k0 + kk;
        As[kk][mm] =
            (t_lo + mm < K && k < p.N) ? to_float(p.Cm.at(b, t_base + t_lo + mm, g, k)) : 0.0f;
        Bs[kk][mm] = (s0 + mm < K && k < p.N) ? to_float(p.Bm.at(b, t_base + s0 + mm, g, k)) : 0.0f;
      }
      __syncthreads();
      mma_step(gacc, As, Bs, tx, ty);
      __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int64_t t = t_lo + ty + 16 * i, s = s0 + tx + 16 * j;
        float w = 0.0f;
        if (s <= t && t < K)
          w = expf(static_cast<float>(p.cum[o_base + t] - p.cum[o_base + s])) * p.dtp[o_base + s];
        Gs[ty + 16 * i][tx + 16 * j] = gacc[i][j] * w;
      }
    __syncthreads();
    for (int k0 = 0; k0 < kTile; k0 += kTileK) {
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const int idx = tid + r * kThreads, kk = idx / kTile, mm = idx % kTile;
        const int64_t s = s0 + k0 + kk;
        Bs[kk][mm] = (s < K && d0 + mm < p.D) ? to_float(p.x.at(b, t_base + s, h, d0 + mm)) : 0.0f;
      }
      __syncthreads();
#pragma unroll
      for (int k = 0; k < kTileK; ++k) {
        float a[4], bv[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) a[i] = Gs[ty + 16 * i][k0 + k], bv[i] = Bs[k][tx + 16 * i];
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
          for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(a[i], bv[j], acc[i][j]);
      }
      __syncthreads();
    }
  }
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t t = t_lo + ty + 16 * i, d = d0 + tx + 16 * j;
      if (t >= K || d >= p.D) continue;
      const float xv = to_float(p.x.at(b, t_base + t, h, d));
      float v = acc[i][j] + (p.has_d ? p.Dv.at(h, d) * xv : 0.0f);
      if (p.has_z) v *= silu(to_float(p.z.at(b, t_base + t, h, d)));
      p.y.at(b, t_base + t, h, d) = from_float<T>(v);
    }
}

// ---- forward, chunked on tensor cores (f16 / bf16 operands, f32 accumulation)
// ------------------ The same four steps; steps 2 and 4 run their matrix
// products through WMMA 16x16x16 fragments. Operands are rounded to T on their
// way into shared memory (the chunk state, the decay-weighted x and the masked
// C.B^T, as the Triton kernels of mamba_ssm do); sums stay f32.
constexpr int kLdH = kTile + 8;  // pitch of 16-bit shared tiles (WMMA wants a multiple of 8)
constexpr int kLdF = kTile + 4;  // pitch of f32 shared tiles (a multiple of 4)
constexpr int kTcThreads = 128;  // 4 warps, each a 32 x 32 quarter of the 64 x 64 tile

namespace wm = nvcuda::wmma;
template <class T>
using FragA = wm::fragment<wm::matrix_a, 16, 16, 16, T, wm::row_major>;
template <class T>
using FragAc = wm::fragment<wm::matrix_a, 16, 16, 16, T, wm::col_major>;
template <class T>
using FragB = wm::fragment<wm::matrix_b, 16, 16, 16, T, wm::row_major>;
template <class T>
using FragBc = wm::fragment<wm::matrix_b, 16, 16, 16, T, wm::col_major>;
using FragC = wm::fragment<wm::accumulator, 16, 16, 16, float>;

// acc[2][2] (this warp's 32 x 32 quarter) += A(64 x 64) . B(64 x 64) with the
// given layouts.
template <class FA, class FB, class T>
__device__ __forceinline__ void wmma_64(FragC (&acc)[2][2], const T* A, int a_row_step,
                                        int a_k_step, const T* B, int b_k_step, int b_col_step,
                                        int wr, int wc) {
#pragma unroll
  for (int k = 0; k < kTile; k += 16) {
    FA a[2];
    FB b[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      wm::load_matrix_sync(a[i], A + (wr * 32 + i * 16) * a_row_step + k * a_k_step, kLdH);
      wm::load_matrix_sync(b[i], B + k * b_k_step + (wc * 32 + i * 16) * b_col_step, kLdH);
    }
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int j = 0; j < 2; ++j) wm::mma_sync(acc[i][j], a[i], b[j], acc[i][j]);
  }
}

__device__ __forceinline__ void store_acc(float (*Fs)[kLdF], FragC (&acc)[2][2], int wr, int wc) {
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int j = 0; j < 2; ++j)
      wm::store_matrix_sync(&Fs[wr * 32 + i * 16][wc * 32 + j * 16], acc[i][j], kLdF,
                            wm::mem_row_major);
}

// Loads the 64 x 64 tile dst[r][c] = T(src[r * rs + c * cs] * row_scale[r])
// (zero outside rows x cols). With `vec` (cs == 1, 16-byte aligned rows) each
// thread moves 16 bytes at a time; the generic path handles any strides. Index
// math is per row, not per element.
template <class T, class S>
__device__ __forceinline__ void load_tile(T (*dst)[kLdH], const S* src, int64_t rs, int64_t cs,
                                          int64_t rows, int64_t cols, const float* row_scale,
                                          bool vec) {
  constexpr int kVecElems = 16 / sizeof(S);
  if (vec) {
    constexpr int kPerRow = kTile / kVecElems;
    for (int idx = threadIdx.x; idx < kTile * kPerRow; idx += blockDim.x) {
      const int r = idx / kPerRow, c0 = (idx % kPerRow) * kVecElems;
      const float sc = row_scale ? row_scale[r] : 1.0f;
      alignas(16) S buf[kVecElems];
      if (r < rows && c0 + kVecElems <= cols) {
        *reinterpret_cast<uint4*>(buf) = *reinterpret_cast<const uint4*>(src + r * rs + c0);
        if constexpr (std::is_same_v<S, T>) {
          if (!row_scale) {  // already T: the vector as is (x * 1.0f rounds back to x)
            *reinterpret_cast<uint4*>(&dst[r][c0]) = *reinterpret_cast<const uint4*>(buf);
            continue;
          }
        }
      } else {
#pragma unroll
        for (int q = 0; q < kVecElems; ++q)
          buf[q] = (r < rows && c0 + q < cols) ? src[r * rs + c0 + q] : from_float<S>(0.0f);
      }
#pragma unroll
      for (int q = 0; q < kVecElems; ++q) dst[r][c0 + q] = from_float<T>(to_float(buf[q]) * sc);
    }
    return;
  }
  for (int idx = threadIdx.x; idx < kTile * kTile; idx += blockDim.x) {
    const int r = idx / kTile, c = idx % kTile;
    const float v = (r < rows && c < cols) ? to_float(src[r * rs + c * cs]) : 0.0f;
    dst[r][c] = from_float<T>(row_scale ? v * row_scale[r] : v);
  }
}

template <class S>
__device__ __forceinline__ bool can_vec(const S* base, int64_t rs, int64_t cs) {
  constexpr int kVecElems = 16 / sizeof(S);
  return cs == 1 && rs % kVecElems == 0 && reinterpret_cast<uintptr_t>(base) % 16 == 0;
}

// Starts the cp.async copy of a 64-row x 64-element tile, dst[r][c] = src[r * rs + c], by the kNT
// threads of the block in 16-byte pieces (src passes can_vec; dst rows 16-byte aligned); rows
// >= `rows` are zero-filled without being read. The caller commits the group and waits.
template <int kNT, class E, int kPitch>
__device__ __forceinline__ void cp_async_tile(E (*dst)[kPitch], const E* src, int64_t rs,
                                              int64_t rows) {
  constexpr int kVe = 16 / static_cast<int>(sizeof(E)), kPerRow = kTile / kVe;
#pragma unroll 1  // the copies do not block; unrolled address math costs registers
  for (int i = 0; i < kTile * kPerRow / kNT; ++i) {
    const int q = static_cast<int>(threadIdx.x) + i * kNT, r = q / kPerRow, c = (q % kPerRow) * kVe;
    const bool in = r < rows;
    cp_async16(&dst[r][c], in ? src + r * rs + c : src, in ? 16 : 0);
  }
}

// ---- 16-byte operand staging (the *_vec kernels; see "chunked_wmma_vec" below) ----------------
// A 2-D operand as stored: element (r, c) at p[r * rs + c * cs], zero outside [0, rows) x
// [0, cols); c is the dimension that is contiguous when cs == 1. S is float or the element type
// (dy' is f32 workspace with z, T without: the kernels branch once per product, not per element).
template <class S>
struct TileSrc {
  const S* p;
  int64_t rs, cs;
  int rows, cols;  // <= 256 (chunk, D, N)
};
template <class S>
__device__ __forceinline__ TileSrc<S> tile_src(const S* p, int64_t rs, int64_t cs, int64_t rows,
                                               int64_t cols) {
  return {p, rs, cs, static_cast<int>(rows), static_cast<int>(cols)};
}

// This thread's share of one 64 x 64 stage in registers: 2 vectors of 8 16-bit elements or 4 of
// 4 floats (64 rows x 64 columns / 256 threads); twice that for the forward's 128-thread blocks.
template <class S, int kNT = kThreads>  // kNT: threads of the block
struct Staged {
  static constexpr int kVe = 16 / static_cast<int>(sizeof(S));  // elements per vector
  static constexpr int kPerRow = kTile / kVe;                   // vectors per 64-wide row
  static constexpr int kNv = kTile * kPerRow / kNT;             // vectors per thread
  uint4 v[kNv];
};

// The element-wise path of one vector (edges, strided or misaligned operands). (Out of line it
// cost more registers, for the call, than it saved.)
template <class S>
__device__ __forceinline__ uint4 fetch_vector_slow(TileSrc<S> s, int r, int c) {
  constexpr int kVe = Staged<S>::kVe;
  alignas(16) S e[kVe];
#pragma unroll
  for (int q = 0; q < kVe; ++q)
    e[q] = r < s.rows && c + q < s.cols ? s.p[r * s.rs + (c + q) * s.cs] : from_float<S>(0.0f);
  return *reinterpret_cast<const uint4*>(e);
}

// Phase 1: the loads of the stage tile whose corner is (r0, c0). A vector entirely inside the
// operand (16-byte aligned, unit column stride) is one load; edge vectors and strided operands go
// element by element with the same zero fill.
template <class S, int kNT>
__device__ __forceinline__ void fetch_stage(Staged<S, kNT>& st, const TileSrc<S>& s, int r0,
                                            int c0) {
  using St = Staged<S, kNT>;
  const bool vec = s.cs == 1 && s.rs % St::kVe == 0 && reinterpret_cast<uintptr_t>(s.p) % 16 == 0;
#pragma unroll
  for (int i = 0; i < St::kNv; ++i) {
    const int idx = threadIdx.x + i * kNT;
    const int r = r0 + idx / St::kPerRow, c = c0 + (idx % St::kPerRow) * St::kVe;
    if (vec && r < s.rows && c + St::kVe <= s.cols)
      st.v[i] = __ldg(reinterpret_cast<const uint4*>(s.p + r * s.rs + c));
    else
      st.v[i] = fetch_vector_slow(s, r, c);
  }
}

// Phase 2: rounds the fetched values to T into dst[row][col] of the stage; rscale (shared memory,
// indexed by the operand's row, or nullptr) multiplies them first.
template <class T, int kLd, class S, int kNT>
__device__ __forceinline__ void commit_stage(T (*dst)[kLd], const Staged<S, kNT>& st,
                                             const TileSrc<S>& s, int r0, const float* rscale) {
  using St = Staged<S, kNT>;
#pragma unroll
  for (int i = 0; i < St::kNv; ++i) {
    const int idx = threadIdx.x + i * kNT;
    const int r = idx / St::kPerRow, c = (idx % St::kPerRow) * St::kVe;
    if constexpr (std::is_same_v<S, T>) {
      if (rscale == nullptr) {  // 16-bit source, no scale: the vector as is
        *reinterpret_cast<uint4*>(&dst[r][c]) = st.v[i];
        continue;
      }
    }
    const float sc = rscale == nullptr ? 1.0f : (r0 + r < s.rows ? rscale[r0 + r] : 0.0f);
    alignas(16) S e[St::kVe];
    *reinterpret_cast<uint4*>(e) = st.v[i];
    alignas(16) T o[St::kVe];
#pragma unroll
    for (int q = 0; q < St::kVe; ++q) o[q] = from_float<T>(to_float(e[q]) * sc);
    if constexpr (St::kVe == 8)
      *reinterpret_cast<uint4*>(&dst[r][c]) = *reinterpret_cast<const uint4*>(o);
    else
      *reinterpret_cast<uint2*>(&dst[r][c]) = *reinterpret_cast<const uint2*>(o);
  }
}

template <class T, bool kVec>
__device__ __forceinline__ void chunk_state_tc_body(const Fwd<T>& p) {
  __shared__ __align__(32) T As[kTile][kLdH];  // [token][d]: x * weight
  __shared__ __align__(32) T Bs[kTile][kLdH];  // [token][n]
  __shared__ __align__(32) float Fs[kTile][kLdF];
  const int tid = threadIdx.x, warp = tid / 32, wr = warp / 2, wc = warp % 2;
  const int64_t tiles_n = (p.N + kTile - 1) / kTile;
  const int64_t d0 = (blockIdx.x / tiles_n) * kTile, n0 = (blockIdx.x % tiles_n) * kTile;
  const int64_t c = blockIdx.y, bh = blockIdx.z, b = bh / p.H, h = bh % p.H, g = h / p.hpg;
  const int64_t t_base = c * p.cs, o_base = bh * p.Lpad + t_base;
  const int64_t K = p.L - t_base < p.cs ? p.L - t_base : p.cs;
  const double last = p.cum[o_base + p.cs - 1];
  FragC acc[2][2];
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int j = 0; j < 2; ++j) wm::fill_fragment(acc[i][j], 0.0f);
  __shared__ float wrow[kTile];
  for (int64_t k0 = 0; k0 < K; k0 += kTile) {
    const T* xs = &p.x.at(b, t_base + k0, h, d0);
    const T* bs = &p.Bm.at(b, t_base + k0, g, n0);
    [[maybe_unused]] Staged<T, kTcThreads> rx, rb;
    const TileSrc<T> x_src = tile_src(xs, p.x.s1, p.x.s3, K - k0, p.D - d0);
    const TileSrc<T> b_src = tile_src(bs, p.Bm.s1, p.Bm.s3, K - k0, p.N - n0);
    if constexpr (kVec) {  // both operands in flight while the weights are computed
      fetch_stage(rx, x_src, 0, 0);
      fetch_stage(rb, b_src, 0, 0);
    }
    if (tid < kTile)
      wrow[tid] = k0 + tid < K ? expf(static_cast<float>(last - p.cum[o_base + k0 + tid])) *
                                     p.dtp[o_base + k0 + tid]
                               : 0.0f;
    __syncthreads();
    if constexpr (kVec) {
      commit_stage(As, rx, x_src, 0, wrow);
      commit_stage(Bs, rb, b_src, 0, nullptr);
    } else {
      load_tile(As, xs, p.x.s1, p.x.s3, K - k0, p.D - d0, wrow, can_vec(xs, p.x.s1, p.x.s3));
      load_tile(Bs, bs, p.Bm.s1, p.Bm.s3, K - k0, p.N - n0, nullptr, can_vec(bs, p.Bm.s1, p.Bm.s3));
    }
    __syncthreads();
    // S[d][n] = sum_k As[k][d] Bs[k][n]: A is As read column-major.
    wmma_64<FragAc<T>, FragB<T>>(acc, &As[0][0], 1, kLdH, &Bs[0][0], kLdH, 1, wr, wc);
    __syncthreads();
  }
  store_acc(Fs, acc, wr, wc);
  __syncthreads();
  float* out = p.st + (bh * p.nchunks + c) * p.D * p.N;
  for (int idx = tid; idx < kTile * kTile; idx += kTcThreads) {
    const int64_t d = d0 + idx / kTile, n = n0 + idx % kTile;
    if (d < p.D && n < p.N) out[d * p.N + n] = Fs[idx / kTile][idx % kTile];
  }
}
template <class T>
__global__ void __launch_bounds__(kTcThreads) chunk_state_tc_kernel(Fwd<T> p) {
  chunk_state_tc_body<T, false>(p);
}
// The _vec twin (chunked_wmma_vec) holds a whole stage of both operands in registers: its launch
// bounds trade occupancy for that (ptxas at sm_90a: no spills).
template <class T>
__global__ void __launch_bounds__(kTcThreads, 3) chunk_state_tc_vec_kernel(Fwd<T> p) {
  chunk_state_tc_body<T, true>(p);
}

// C_t . B_s for the token pairs of one chunk (lower 64x64 tiles only), once per
// group: with G < H every head of the group reuses it instead of recomputing
// it.
template <class T, bool kVec>
__device__ __forceinline__ void cb_tc_body(const Fwd<T>& p) {
  __shared__ __align__(32) T As[kTile][kLdH];
  __shared__ __align__(32) T Bs[kTile][kLdH];
  const int tid = threadIdx.x, warp = tid / 32, wr = warp / 2, wc = warp % 2;
  const int64_t tiles_t = p.cs / kTile, G = p.H / p.hpg;
  const int64_t c = blockIdx.x / (tiles_t * tiles_t), rest = blockIdx.x % (tiles_t * tiles_t);
  const int64_t t_lo = (rest / tiles_t) * kTile, s0 = (rest % tiles_t) * kTile;
  const int64_t bg = blockIdx.y, b = bg / G, g = bg % G;
  const int64_t t_base = c * p.cs;
  const int64_t K = p.L - t_base < p.cs ? p.L - t_base : p.cs;
  if (s0 > t_lo || t_lo >= K) return;  // uniform: only the causal tiles are read
  FragC acc[2][2];
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int j = 0; j < 2; ++j) wm::fill_fragment(acc[i][j], 0.0f);
  const T* c_rows = &p.Cm.at(b, t_base + t_lo, g, 0);
  const T* b_rows = &p.Bm.at(b, t_base + s0, g, 0);
  const bool c_vec = can_vec(c_rows, p.Cm.s1, p.Cm.s3), b_vec = can_vec(b_rows, p.Bm.s1, p.Bm.s3);
  for (int64_t k0 = 0; k0 < p.N; k0 += kTile) {
    if constexpr (kVec) {
      Staged<T, kTcThreads> rc, rb;
      const TileSrc<T> c_src =
          tile_src(c_rows + k0 * p.Cm.s3, p.Cm.s1, p.Cm.s3, K - t_lo, p.N - k0);
      const TileSrc<T> b_src = tile_src(b_rows + k0 * p.Bm.s3, p.Bm.s1, p.Bm.s3, K - s0, p.N - k0);
      fetch_stage(rc, c_src, 0, 0);
      fetch_stage(rb, b_src, 0, 0);
      commit_stage(As, rc, c_src, 0, nullptr);
      commit_stage(Bs, rb, b_src, 0, nullptr);
    } else {
      load_tile(As, c_rows + k0 * p.Cm.s3, p.Cm.s1, p.Cm.s3, K - t_lo, p.N - k0, nullptr, c_vec);
      load_tile(Bs, b_rows + k0 * p.Bm.s3, p.Bm.s1, p.Bm.s3, K - s0, p.N - k0, nullptr, b_vec);
    }
    __syncthreads();
    wmma_64<FragA<T>, FragBc<T>>(acc, &As[0][0], kLdH, 1, &Bs[0][0], 1, kLdH, wr, wc);
    __syncthreads();
  }
  float* out = p.cb + (bg * p.nchunks + c) * p.cs * p.cs + t_lo * p.cs + s0;
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int j = 0; j < 2; ++j)
      wm::store_matrix_sync(out + (wr * 32 + i * 16) * p.cs + wc * 32 + j * 16, acc[i][j],
                            static_cast<unsigned>(p.cs), wm::mem_row_major);
}
template <class T>
__global__ void __launch_bounds__(kTcThreads) cb_tc_kernel(Fwd<T> p) {
  cb_tc_body<T, false>(p);
}
// The _vec twin (chunked_wmma_vec) holds a whole stage of both operands in registers: its launch
// bounds trade occupancy for that (ptxas at sm_90a: no spills).
template <class T>
__global__ void __launch_bounds__(kTcThreads, 3) cb_tc_vec_kernel(Fwd<T> p) {
  cb_tc_body<T, true>(p);
}

// kStatesT: the states entering each chunk come rounded to T (p.st_t), else as f32 (p.st); the
// product rounds them to T either way, so the results are the same.
template <class T, bool kVec, bool kStatesT = false>
__device__ __forceinline__ void chunk_out_tc_body(const Fwd<T>& p) {
  // The f32 accumulator tile F reuses the operand tiles' memory once the last product is done:
  // 20 KB of static shared memory per block instead of 38, so registers alone bound occupancy.
  __shared__ __align__(32) unsigned char tiles[2 * kTile * kLdH * sizeof(T)];
  static_assert(sizeof(float) * kTile * kLdF <= sizeof(tiles));
  T(*As)[kLdH] = reinterpret_cast<T(*)[kLdH]>(tiles);
  T(*Bs)[kLdH] = reinterpret_cast<T(*)[kLdH]>(tiles + kTile * kLdH * sizeof(T));
  float(*Fs)[kLdF] = reinterpret_cast<float(*)[kLdF]>(tiles);
  __shared__ double cum_t[kTile], cum_s[kTile];
  __shared__ float dtp_s[kTile];
  const int tid = threadIdx.x, warp = tid / 32, wr = warp / 2, wc = warp % 2;
  const int64_t tiles_t = p.cs / kTile;
  const int64_t c = blockIdx.x / tiles_t, t_lo = (blockIdx.x % tiles_t) * kTile;
  const int64_t d0 = blockIdx.y * int64_t{kTile};
  const int64_t bh = blockIdx.z, b = bh / p.H, h = bh % p.H, g = h / p.hpg;
  const int64_t t_base = c * p.cs, o_base = bh * p.Lpad + t_base;
  const int64_t K = p.L - t_base < p.cs ? p.L - t_base : p.cs;
  if (t_lo >= K) return;  // uniform over the block
  // !kVec: the C.B^T tile of the next s tile lands in cbs by cp.async while the block works on
  // the current one (the first during part (1)), and a 16-byte aligned x tile goes straight into
  // Bs while the weights are formed: no registers held for either.
  __shared__ __align__(16) float cbs[kVec ? 1 : kTile][kTile];
  const float* cb_rows =
      p.cb + (b * (p.H / p.hpg) + g) * p.nchunks * p.cs * p.cs + c * p.cs * p.cs + t_lo * p.cs;
  [[maybe_unused]] auto prefetch_cb = [&](int64_t s0) {
    cp_async_tile<kTcThreads>(cbs, cb_rows + s0, p.cs, kTile);
    cp_async_commit();
  };
  if constexpr (!kVec) prefetch_cb(0);
  if (tid < kTile) cum_t[tid] = p.cum[o_base + t_lo + tid];
  __syncthreads();
  const int64_t s0_off = (bh * p.nchunks + c) * p.D * p.N;
  FragC acc[2][2];
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int j = 0; j < 2; ++j) wm::fill_fragment(acc[i][j], 0.0f);
  // (1) y[t][d] = sum_n (exp(cum_t) C[t][n]) S0[d][n].
  __shared__ float ecum[kTile];
  if (tid < kTile) ecum[tid] = t_lo + tid < K ? expf(static_cast<float>(cum_t[tid])) : 0.0f;
  __syncthreads();
  const T* c_rows = &p.Cm.at(b, t_base + t_lo, g, 0);
  const bool c_vec = can_vec(c_rows, p.Cm.s1, p.Cm.s3);
  for (int64_t k0 = 0; k0 < p.N; k0 += kTile) {
    // kStatesT: the 16-bit states need no conversion, so a full tile goes by cp.async into Bs
    // while the scaled C tile is loaded and rounded.
    [[maybe_unused]] const T* st_rows = kStatesT ? p.st_t + s0_off + d0 * p.N + k0 : nullptr;
    const bool s_async =
        kStatesT && can_vec(st_rows, p.N, int64_t{1}) && p.D - d0 >= kTile && p.N - k0 >= kTile;
    if (s_async) {
      cp_async_tile<kTcThreads>(Bs, st_rows, p.N, kTile);
      cp_async_commit();
    }
    const float* s_rows = p.st + s0_off + d0 * p.N + k0;
    if constexpr (kVec) {
      Staged<T, kTcThreads> rc;
      Staged<float, kTcThreads> rs;
      const TileSrc<T> c_src =
          tile_src(c_rows + k0 * p.Cm.s3, p.Cm.s1, p.Cm.s3, K - t_lo, p.N - k0);
      const TileSrc<float> s_src = tile_src(s_rows, p.N, int64_t{1}, p.D - d0, p.N - k0);
      fetch_stage(rc, c_src, 0, 0);
      fetch_stage(rs, s_src, 0, 0);
      commit_stage(As, rc, c_src, 0, ecum);
      commit_stage(Bs, rs, s_src, 0, nullptr);
    } else {
      load_tile(As, c_rows + k0 * p.Cm.s3, p.Cm.s1, p.Cm.s3, K - t_lo, p.N - k0, ecum, c_vec);
      if (s_async)
        cp_async_wait<0>();
      else if constexpr (kStatesT)
        load_tile(Bs, st_rows, p.N, int64_t{1}, p.D - d0, p.N - k0, nullptr,
                  can_vec(st_rows, p.N, int64_t{1}));
      else
        load_tile(Bs, s_rows, p.N, int64_t{1}, p.D - d0, p.N - k0, nullptr,
                  can_vec(s_rows, p.N, int64_t{1}));
    }
    __syncthreads();
    wmma_64<FragA<T>, FragBc<T>>(acc, &As[0][0], kLdH, 1, &Bs[0][0], 1, kLdH, wr, wc);
    __syncthreads();
  }
  // (2) tokens s <= t of this chunk. The weight of (t, s) is exp(cum_t - cum_s) v_s. Below the
  // diagonal tile it factors as exp(cum_t - ref) * exp(ref - cum_s) v_s with ref = cum at the
  // tile's last s: 128 exponentials per tile instead of 4096. Both exponents are <= 0 when the
  // head decays (A v <= 0), so a factor that underflows means a product below f32's range; a tile
  // with an exponent above kFactorSafe (growth, negative dt) takes the direct form instead.
  constexpr float kFactorSafe = 16.0f;
  __shared__ float rowf[kTile], colf[kTile];
  for (int64_t s0 = 0; s0 < K && s0 <= t_lo + kTile - 1; s0 += kTile) {
    const T* x_rows = &p.x.at(b, t_base + s0, h, d0);
    [[maybe_unused]] Staged<T, kTcThreads> rx;
    const TileSrc<T> x_src = tile_src(x_rows, p.x.s1, p.x.s3, K - s0, p.D - d0);
    if constexpr (kVec) fetch_stage(rx, x_src, 0, 0);  // in flight during the masked C.B^T fill
    // Bs is free: the last product ended with a barrier.
    const bool x_async = !kVec && can_vec(x_rows, p.x.s1, p.x.s3) && p.D - d0 >= kTile;
    if (x_async) {
      cp_async_tile<kTcThreads>(Bs, x_rows, p.x.s1, K - s0);
      cp_async_commit();
    }
    if constexpr (!kVec) {  // this s tile's C.B^T (visible after the barrier below)
      if (x_async)
        cp_async_wait<1>();
      else
        cp_async_wait<0>();
    }
    const bool below = s0 + kTile <= t_lo;  // uniform; then s0 + 63 < t_lo < K
    bool unsafe = false;
    if (tid < kTile) {
      cum_s[tid] = p.cum[o_base + s0 + tid], dtp_s[tid] = p.dtp[o_base + s0 + tid];
      if (below) {
        const float e = static_cast<float>(p.cum[o_base + s0 + kTile - 1] - cum_s[tid]);
        colf[tid] = expf(e) * dtp_s[tid];
        unsafe = !(e <= kFactorSafe);
      }
    } else if (below && tid < 2 * kTile) {
      const int m = tid - kTile;
      const float e = static_cast<float>(cum_t[m] - p.cum[o_base + s0 + kTile - 1]);
      const bool valid = t_lo + m < K;
      rowf[m] = valid ? expf(e) : 0.0f;
      unsafe = valid && !(e <= kFactorSafe);
    }
    const bool factored = !__syncthreads_or(unsafe) && below;
    const float* cbt = cb_rows + s0;
    // Four consecutive s per thread: one 16-byte read of C.B^T (from cbs, or for kVec from the
    // cb workspace, which is 256-byte aligned with rows that are multiples of 64 floats).
    for (int q = tid; q < kTile * kTile / 4; q += kTcThreads) {
      const int m = q / (kTile / 4), j0 = (q % (kTile / 4)) * 4;
      const int64_t t = t_lo + m;
      const float4 cb4 = kVec ? *reinterpret_cast<const float4*>(cbt + m * p.cs + j0)
                              : *reinterpret_cast<const float4*>(&cbs[m][j0]);
      const float cbv[4] = {cb4.x, cb4.y, cb4.z, cb4.w};
      alignas(8) T o[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int j = j0 + e;
        float w = 0.0f;
        if (factored)
          w = rowf[m] * colf[j];
        else if (s0 + j <= t && t < K)
          w = expf(static_cast<float>(cum_t[m] - cum_s[j])) * dtp_s[j];
        o[e] = from_float<T>(w != 0.0f ? cbv[e] * w : 0.0f);
      }
      if constexpr (sizeof(T) == 2)
        *reinterpret_cast<uint2*>(&As[m][j0]) = *reinterpret_cast<const uint2*>(o);
      else
#pragma unroll
        for (int e = 0; e < 4; ++e) As[m][j0 + e] = o[e];
    }
    if constexpr (kVec)
      commit_stage(Bs, rx, x_src, 0, nullptr);
    else if (x_async)
      cp_async_wait<0>();
    else
      load_tile(Bs, x_rows, p.x.s1, p.x.s3, K - s0, p.D - d0, nullptr,
                can_vec(x_rows, p.x.s1, p.x.s3));
    __syncthreads();
    // Every read of cbs is done: the next s tile's C.B^T streams in under this product.
    if constexpr (!kVec)
      if (s0 + kTile < K && s0 + kTile <= t_lo) prefetch_cb(s0 + kTile);
    wmma_64<FragA<T>, FragB<T>>(acc, &As[0][0], kLdH, 1, &Bs[0][0], kLdH, 1, wr, wc);
    __syncthreads();
  }
  store_acc(Fs, acc, wr, wc);
  __syncthreads();
  // Epilogue: y = (acc + D x) * silu(z), 16 bytes of x, z and y per thread step where the rows are
  // contiguous and aligned; element by element otherwise (same arithmetic per element).
  constexpr int kVe = 16 / static_cast<int>(sizeof(T));
  const bool vec_io = can_vec(&p.x.at(b, t_base, h, d0), p.x.s1, p.x.s3) &&
                      can_vec(&p.y.at(b, t_base, h, d0), p.y.s1, p.y.s3) &&
                      (!p.has_z || can_vec(&p.z.at(b, t_base, h, d0), p.z.s1, p.z.s3));
  for (int q = tid; q < kTile * (kTile / kVe); q += kTcThreads) {
    const int m = q / (kTile / kVe), j0 = (q % (kTile / kVe)) * kVe;
    const int64_t t = t_lo + m, d = d0 + j0;
    if (t >= K || d >= p.D) continue;
    const int64_t tok = t_base + t;
    if (vec_io && d + kVe <= p.D) {
      alignas(16) T xv[kVe], zv[kVe], out[kVe];
      *reinterpret_cast<uint4*>(xv) = __ldg(reinterpret_cast<const uint4*>(&p.x.at(b, tok, h, d)));
      if (p.has_z)
        *reinterpret_cast<uint4*>(zv) =
            __ldg(reinterpret_cast<const uint4*>(&p.z.at(b, tok, h, d)));
#pragma unroll
      for (int e = 0; e < kVe; ++e) {
        float v = Fs[m][j0 + e] + (p.has_d ? p.Dv.at(h, d + e) * to_float(xv[e]) : 0.0f);
        if (p.has_z) v *= silu(to_float(zv[e]));
        out[e] = from_float<T>(v);
      }
      *reinterpret_cast<uint4*>(&p.y.at(b, tok, h, d)) = *reinterpret_cast<const uint4*>(out);
      continue;
    }
    for (int e = 0; e < kVe && d + e < p.D; ++e) {
      const float xv = to_float(p.x.at(b, tok, h, d + e));
      float v = Fs[m][j0 + e] + (p.has_d ? p.Dv.at(h, d + e) * xv : 0.0f);
      if (p.has_z) v *= silu(to_float(p.z.at(b, tok, h, d + e)));
      p.y.at(b, tok, h, d + e) = from_float<T>(v);
    }
  }
}
template <class T, bool kStatesT>
__global__ void __launch_bounds__(kTcThreads, 6) chunk_out_tc_kernel(Fwd<T> p) {
  chunk_out_tc_body<T, false, kStatesT>(p);
}
// The _vec twin (chunked_wmma_vec) holds a whole stage of both operands in registers: its launch
// bounds trade occupancy for that (ptxas at sm_90a: no spills).
template <class T>
__global__ void __launch_bounds__(kTcThreads, 2) chunk_out_tc_vec_kernel(Fwd<T> p) {
  chunk_out_tc_body<T, true>(p);
}
}  // namespace baracuda::ssd_cuda

#include "ops/ssd/forward_mma.cuh"  // chunk_state / chunk_out on mma.sync (chunked_mma_fastpass)

namespace baracuda::ssd_cuda {

// ---- forward, recurrent (varlen)
// -------------------------------------------------------------------
template <class T>
__global__ void recurrent_fwd_kernel(Fwd<T> p) {
  const int lane = threadIdx.x % 32;
  const int64_t d = blockIdx.x * int64_t{blockDim.x / 32} + threadIdx.x / 32;
  const int64_t h = blockIdx.y, s = blockIdx.z, g = h / p.hpg;
  if (d >= p.D) return;  // whole warp: no block-level synchronization below
  int64_t b, t0, t1;
  seq_range(p, s, b, t0, t1);
  float st[kMaxLane];
#pragma unroll
  for (int j = 0; j < kMaxLane; ++j) {
    const int64_t n = lane + 32 * j;
    st[j] = (n < p.N && p.has_init) ? p.init.at(s, h, d, n) : 0.0f;
  }
  const float dsk = p.has_d ? p.Dv.at(h, d) : 0.0f, A = p.A.at(h);
  for (int64_t t = t0; t < t1; ++t) {
    const float v = step_at(p, b, t, h).v, a = expf(v * A);
    const float xv = to_float(p.x.at(b, t, h, d));
    float part = 0.0f;
#pragma unroll
    for (int j = 0; j < kMaxLane; ++j) {
      const int64_t n = lane + 32 * j;
      if (n < p.N) {
        st[j] = fmaf(a, st[j], v * xv * to_float(p.Bm.at(b, t, g, n)));
        part = fmaf(to_float(p.Cm.at(b, t, g, n)), st[j], part);
      }
    }
    part = warp_sum(part);
    if (lane == 0) {
      float out = part + dsk * xv;
      if (p.has_z) out *= silu(to_float(p.z.at(b, t, h, d)));
      p.y.at(b, t, h, d) = from_float<T>(out);
    }
  }
  if (p.has_fin) {
#pragma unroll
    for (int j = 0; j < kMaxLane; ++j) {
      const int64_t n = lane + 32 * j;
      if (n < p.N) p.fin.at(s, h, d, n) = st[j];
    }
  }
}

// ---- backward
// ----------------------------------------------------------------------------------------
template <class T>
__device__ __forceinline__ void advance_row(const Bwd<T>& p, float (&st)[kMaxLane], int lane,
                                            int64_t b, int64_t t, int64_t h, int64_t g, int64_t d,
                                            float A) {
  const float v = step_at(p, b, t, h).v, a = expf(v * A);
  const float xv = d < p.D ? to_float(p.x.at(b, t, h, d)) : 0.0f;
#pragma unroll
  for (int j = 0; j < kMaxLane; ++j) {
    const int64_t n = lane + 32 * j;
    if (n < p.N) st[j] = fmaf(a, st[j], v * xv * to_float(p.Bm.at(b, t, g, n)));
  }
}

template <class T>
__global__ void __launch_bounds__(kBwdWarps * 32) recurrent_bwd_kernel(Bwd<T> p) {
  extern __shared__ float smem[];
  const int w = threadIdx.x / 32, lane = threadIdx.x % 32, tid = threadIdx.x;
  const int64_t dg = blockIdx.x, h = blockIdx.y, s = blockIdx.z, g = h / p.hpg;
  const int64_t d = dg * kBwdWarps + w;
  const bool row = d < p.D;  // rows past D still take part in every __syncthreads
  float* hist = smem + static_cast<int64_t>(w) * kCkpt * p.N;  // [kCkpt][N] of this warp
  float* redB = smem + int64_t{kBwdWarps} * kCkpt * p.N;       // [warps][N]
  float* redC = redB + int64_t{kBwdWarps} * p.N;               // [warps][N]
  float* redS = redC + int64_t{kBwdWarps} * p.N;               // [warps]
  int64_t b, t0, t1;
  seq_range(p, s, b, t0, t1);
  const float A = p.A.at(h);
  const int64_t bh = b * p.H + h;
  float st[kMaxLane], start[kMaxLane], gr[kMaxLane];
  // Forward sweep: checkpoints at token multiples of kCkpt (the state before
  // that token).
#pragma unroll
  for (int j = 0; j < kMaxLane; ++j) {
    const int64_t n = lane + 32 * j;
    st[j] = (row && n < p.N && p.has_init) ? p.init.at(s, h, d, n) : 0.0f;
  }
  for (int64_t t = t0; t < t1; ++t) {
    if (t > t0 && t % kCkpt == 0 && row) {
      float* ck = p.ckpt + ((bh * p.nck + t / kCkpt) * p.D + d) * p.N;
#pragma unroll
      for (int j = 0; j < kMaxLane; ++j)
        if (lane + 32 * j < p.N) ck[lane + 32 * j] = st[j];
    }
    advance_row(p, st, lane, b, t, h, g, d, A);
  }
  // Reverse sweep.
#pragma unroll
  for (int j = 0; j < kMaxLane; ++j) {
    const int64_t n = lane + 32 * j;
    gr[j] = (row && n < p.N && p.has_dfin) ? p.dfin.at(s, h, d, n) : 0.0f;
  }
  const float dsk = (row && p.has_d) ? p.Dv.at(h, d) : 0.0f;
  float dD_acc = 0.0f, dA_acc = 0.0f;
  for (int64_t seg_end = t1; seg_end > t0;) {
    const int64_t seg_start =
        ((seg_end - 1) / kCkpt) * kCkpt < t0 ? t0 : ((seg_end - 1) / kCkpt) * kCkpt;
    const int64_t len = seg_end - seg_start;
#pragma unroll
    for (int j = 0; j < kMaxLane; ++j) {
      const int64_t n = lane + 32 * j;
      float v0 = 0.0f;
      if (row && n < p.N) {
        if (seg_start > t0)
          v0 = p.ckpt[((bh * p.nck + seg_start / kCkpt) * p.D + d) * p.N + n];
        else if (p.has_init)
          v0 = p.init.at(s, h, d, n);
      }
      start[j] = st[j] = v0;
    }
    for (int64_t k = 0; k < len; ++k) {
      advance_row(p, st, lane, b, seg_start + k, h, g, d, A);
#pragma unroll
      for (int j = 0; j < kMaxLane; ++j)
        if (lane + 32 * j < p.N) hist[k * p.N + lane + 32 * j] = st[j];
    }
    __syncwarp();
    for (int64_t k = len - 1; k >= 0; --k) {
      const int64_t t = seg_start + k;
      const StepF sp = step_at(p, b, t, h);
      const float a = expf(sp.v * A);
      float hc[kMaxLane], hp[kMaxLane], Cv[kMaxLane], Bv[kMaxLane];
      float ssm = 0.0f;
#pragma unroll
      for (int j = 0; j < kMaxLane; ++j) {
        const int64_t n = lane + 32 * j;
        const bool ok = n < p.N;
        hc[j] = ok ? hist[k * p.N + n] : 0.0f;
        hp[j] = ok ? (k > 0 ? hist[(k - 1) * p.N + n] : start[j]) : 0.0f;
        Cv[j] = ok ? to_float(p.Cm.at(b, t, g, n)) : 0.0f;
        Bv[j] = ok ? to_float(p.Bm.at(b, t, g, n)) : 0.0f;
        ssm = fmaf(Cv[j], hc[j], ssm);
      }
      ssm = warp_sum(ssm);
      float xv = 0.0f, dyp = 0.0f;
      if (row) {
        xv = to_float(p.x.at(b, t, h, d));
        dyp = to_float(p.dy.at(b, t, h, d));
        if (p.has_z) {
          const float z = to_float(p.z.at(b, t, h, d)), sg = 1.0f / (1.0f + expf(-z));
          const float ypre = ssm + dsk * xv;
          if (lane == 0)
            p.dz.at(b, t, h, d) = from_float<T>(dyp * ypre * sg * (1.0f + z * (1.0f - sg)));
          dyp *= z * sg;
        }
      }
      dD_acc = fmaf(dyp, xv, dD_acc);
      float u = 0.0f, q = 0.0f;
#pragma unroll
      for (int j = 0; j < kMaxLane; ++j) {
        gr[j] = fmaf(dyp, Cv[j], gr[j]);
        u = fmaf(gr[j], Bv[j], u);
        q = fmaf(gr[j], hp[j], q);
      }
      u = warp_sum(u);
      q = warp_sum(q);
      if (row && lane == 0) p.dx.at(b, t, h, d) = from_float<T>(dyp * dsk + sp.v * u);
      dA_acc = fmaf(a * q, sp.v, dA_acc);
#pragma unroll
      for (int j = 0; j < kMaxLane; ++j) {
        const int64_t n = lane + 32 * j;
        if (n < p.N) {
          redB[w * p.N + n] = sp.v * gr[j] * xv;
          redC[w * p.N + n] = dyp * hc[j];
        }
      }
      if (lane == 0) redS[w] = xv * u + A * a * q;
      __syncthreads();
      const int64_t tok = (b * p.L + t) * p.H + h;
      if (tid < p.N) {
        float sb = 0.0f, sc = 0.0f;
        for (int ww = 0; ww < kBwdWarps; ++ww)
          sb += redB[ww * p.N + tid], sc += redC[ww * p.N + tid];
        p.pdB[(dg * p.B * p.L * p.H + tok) * p.N + tid] = sb;
        p.pdC[(dg * p.B * p.L * p.H + tok) * p.N + tid] = sc;
      }
      if (tid == 0) {
        float ss = 0.0f;
        for (int ww = 0; ww < kBwdWarps; ++ww) ss += redS[ww];
        p.pddt[dg * p.B * p.L * p.H + tok] = ss;
      }
      __syncthreads();
#pragma unroll
      for (int j = 0; j < kMaxLane; ++j) gr[j] *= a;
    }
    seg_end = seg_start;
  }
  if (!row) return;
  if (p.has_init) {
#pragma unroll
    for (int j = 0; j < kMaxLane; ++j) {
      const int64_t n = lane + 32 * j;
      if (n < p.N) p.dinit.at(s, h, d, n) = gr[j];
    }
  }
  if (lane == 0) {
    p.pdA[(s * p.H + h) * p.D + d] = dA_acc;
    p.pdD[(s * p.H + h) * p.D + d] = dD_acc;
  }
}

// dB, dC: the sum over the D groups and the heads of each group, in a fixed
// order.
template <class T>
__global__ void reduce_bc_kernel(Bwd<T> p) {
  const int64_t G = p.H / p.hpg;
  const int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (e >= p.B * p.L * G * p.N) return;
  const int64_t n = e % p.N, rest = e / p.N, grp = rest % G, bt = rest / G;
  float sb = 0.0f, sc = 0.0f;
  for (int64_t hh = 0; hh < p.hpg; ++hh)
    for (int64_t dg = 0; dg < p.ndg; ++dg) {
      const int64_t o = (dg * p.B * p.L * p.H + bt * p.H + grp * p.hpg + hh) * p.N + n;
      sb += p.pdB[o];
      sc += p.pdC[o];
    }
  const int64_t b = bt / p.L, t = bt % p.L;
  p.dBo.at(b, t, grp, n) = from_float<T>(sb);
  p.dCo.at(b, t, grp, n) = from_float<T>(sc);
}

template <class T>
__global__ void reduce_ddt_kernel(Bwd<T> p) {
  const int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (e >= p.B * p.L * p.H) return;
  const int64_t h = e % p.H, bt = e / p.H, b = bt / p.L, t = bt % p.L;
  float dv = 0.0f;
  for (int64_t dg = 0; dg < p.ndg; ++dg) dv += p.pddt[dg * p.B * p.L * p.H + e];
  const float draw = dv * step_at(p, b, t, h).dv_draw;
  p.ddt.at(b, t, h) = from_float<T>(draw);
  p.draw[e] = draw;
}

// Per head: dA, ddt_bias, dD. One block per head, a fixed-order tree:
// deterministic.
template <class T>
__global__ void reduce_head_kernel(Bwd<T> p) {
  __shared__ float red[3][256];
  const int64_t h = blockIdx.x;
  const int tid = threadIdx.x;
  float a = 0.0f, bsum = 0.0f, dsum = 0.0f;
  for (int64_t i = tid; i < p.S * p.D; i += 256) {
    const int64_t s = i / p.D, d = i % p.D;
    a += p.pdA[(s * p.H + h) * p.D + d];
    dsum += p.pdD[(s * p.H + h) * p.D + d];
  }
  for (int64_t bt = tid; bt < p.B * p.L; bt += 256) bsum += p.draw[bt * p.H + h];
  red[0][tid] = a, red[1][tid] = bsum, red[2][tid] = dsum;
  __syncthreads();
  for (int o = 128; o > 0; o >>= 1) {
    if (tid < o)
      for (int r = 0; r < 3; ++r) red[r][tid] += red[r][tid + o];
    __syncthreads();
  }
  if (tid == 0) {
    p.dA.at(h) = red[0][0];
    if (p.has_bias) p.dbias.at(h) = red[1][0];
    if (p.has_d && !p.per_channel) p.dD.at(h, 0) = red[2][0];
  }
  if (p.has_d && p.per_channel)
    for (int64_t d = tid; d < p.D; d += 256) {
      float v = 0.0f;
      for (int64_t s = 0; s < p.S; ++s) v += p.pdD[(s * p.H + h) * p.D + d];
      p.dD.at(h, d) = v;
    }
}

// ---- backward, chunked (matrix form of the adjoint) ---------------------------------------------
// Per (b, h) and chunk c with chunk-local inclusive cumsum cum_t of v*A, S0 the state entering the
// chunk, Gc the adjoint of the state leaving it, W_ts = exp(cum_t - cum_s) [s <= t],
// e_s = exp(cum_last - cum_s), CB_ts = C_t.B_s, DX_ts = dy'_t.x_s, dy' = dy * silu(z):
//   dx_s  = Dskip dy'_s + v_s R_s,   R_s = sum_{t>=s} W_ts CB_ts dy'_t + e_s Gc B_s
//   dB_s  = v_s (sum_{t>=s} W_ts DX_ts C_t + e_s Gc^T x_s)                      (per head)
//   dC_t  = exp(cum_t) S0^T dy'_t + sum_{s<=t} W_ts v_s DX_ts B_s                 (per head)
//   Gc-1  = exp(cum_last) Gc + sum_t exp(cum_t) dy'_t (outer) C_t   (reverse scan over chunks)
// The log-decays: with P_ts = W_ts CB_ts v_s DX_ts and E_s = e_s v_s x_s.(Gc B_s),
//   dcum_t = C_t.(exp(cum_t) S0^T dy'_t) + sum_s P_ts - sum_t' P_t't - E_t
//            + [t = last] (exp(cum_last) <Gc, S0> + sum_s E_s)
//   da_s = sum_{k>=s} dcum_k,  dv_s = x_s.R_s + A da_s,  dA = sum v_s da_s.
// docs/perf/ssd.md has the derivation; ssd_test.cpp checks a float64 model of exactly this
// dataflow against the recurrent adjoint. Every product is a 64x64 f32 SIMT tile (f32 math for
// every dtype); sums across tiles, heads and chunks go through workspace partials that later
// kernels add in a fixed order: deterministic, no atomics.
template <class T>
struct BwdC : Fwd<T> {
  V4<const T> dy;
  V4<const float> dfin;
  bool has_dfin, per_channel;
  V4<T> dx, dz, dBo, dCo;
  V3<T> ddt;
  V1<float> dA, dbias;
  V2<float> dD;
  V4<float> dinit;
  int64_t ntd, ntn, ntt;  // 64-wide tiles of D, of N, of the chunk
  int64_t hb = 1;         // chunked_wmma_vec: heads per dB/dC block (a divisor of hpg, <= 8)
  int64_t bc_parts = 0;   // dB/dC partials per group that bwd_reduce_bc_kernel adds (hpg / hb)
  // workspace (Fwd's dtp, cum and st come first; st holds the states entering each chunk)
  float* cbm;        // [B*G*nchunks][cs][cs]  C_t.B_s, lower tiles only
  float* gst;        // [B*H*nchunks][D][N]    U_c, then the adjoint of the state leaving c
  T* gst16;          // [B*H*nchunks][D][N]    16-bit T: the adjoint rounded to T, as the
                     //                        mma.sync products take it (else nullptr)
  T* st16;           // [B*H*nchunks][D][N]    16-bit T, fastpass: st rounded to T (ditto)
  float* dyp;        // [B][L][H][D]           dy * silu(z) (has_z only)
  T* dyh = nullptr;  // [B][L][H][D]           16-bit T: exp(cum_t - cum_last) dy'_t, by the U_c
                     //                        mma kernel for bwd_dx_hn_kernel (else nullptr)
  // chunked_mma_walks_sm90a: the finalize's <Gc, S0> from gst16 and st16, and whether the walks
  // also write the f32 st / gst (only the chunk-parallel dB, dC and dx kernels still read them)
  bool gs16 = false, walk_st32 = true, walk_gst32 = true;
  int* dx_rest = nullptr;  // one per bwd_dx_hn_kernel block: bit hi set = its head hi is left to
                           //                        bwd_dx_mma_kernel<.., kRest> (hb <= 8)
  T* cbt16 = nullptr;      // [B*G*nchunks][cs][cs] C.B^T transposed ([s][t]), rounded to T, zero
                           //                        where t < s or t >= K; lower tiles (same use)
  float *pdB, *pdC;        // [B][L][H][N]           per-head dB, dC
  float *pdv, *pE;         // [ntd][B*H][Lpad]       x_s.R_s and E_s, per tile of D
  float* pst;              // [ntn][B*H][Lpad]       C_t.(exp(cum_t) S0^T dy'_t), per tile of N
  float* prow;             // [prow_parts][B*H][Lpad] row sums of P (chunked_wmma_vec: per s tile)
  int64_t prow_parts = 1;  // partials of prow that bwd_finalize_kernel adds (s tiles <= t's)
  float* dcb;              // [B*G*nchunks][cs][cs]  chunked_wmma_vec: sum_h W_ts dt_s, lower tiles
  float* pcol;             // [ntt][B*H][Lpad]       column sums of P, per row tile
  float *pdA, *pbias;      // [B*H][nchunks]
  float* pdD;              // [B*H][nchunks][D]

  __device__ __forceinline__ float dyp_at(int64_t b, int64_t t, int64_t h, int64_t d) const {
    if (this->has_z) return dyp[((b * this->L + t) * this->H + h) * this->D + d];
    return to_float(dy.at(b, t, h, d));
  }
};

constexpr int kLdM = kTile + 1;  // pitch of a 64 x 64 f32 operand kept whole in shared memory

// Shared staging of one 64 x 64 tile product. SIMT: f32 [k][m] and [k][n] slices of 16 k. Tensor
// cores (kTC, 16-bit T only): T slices A [m][k], B [k][n] plus an f32 tile F through which the
// accumulator moves between WMMA fragments and the SIMT register layout that every epilogue
// uses (acc[i][j] = element (ty + 16 i, tx + 16 j)).
constexpr int kTcStageK = 64;  // k depth of one tensor-core operand stage
constexpr int kLdA =
    kTcStageK + 8;  // 16-bit pitches: multiples of 8 elements, rows 32-byte aligned
constexpr int kLdB = kTile + 8;
template <class T, bool kTC>
struct GemmSmem {
  float a[kTileK][kTile + 4], b[kTileK][kTile + 4];
};
template <class T>
struct GemmSmem<T, true> {
  union {
    struct {
      alignas(32) T a[kTile][kLdA];      // [m][k]
      alignas(32) T b[kTcStageK][kLdB];  // [k][n]
    } s;
    alignas(32) float f[kTile][kLdF];  // the accumulator on its way in and out of the fragments
  } u;
};

// acc (this thread's 4 x 4 of a 64 x 64 tile) += sum_{k < K} fa(m, k) fb(k, n). fa answers 0 for
// rows out of range, fb for columns out of range; k >= K is zero here. kAK / kBK: consecutive
// threads walk k (operand contiguous along k) rather than m / n, for coalesced loads.
template <bool kAK, bool kBK, class T, class FA, class FB>
__device__ __forceinline__ void gemm(float (&acc)[4][4], GemmSmem<T, false>& sm, int64_t K,
                                     const FA& fa, const FB& fb) {
  const int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;
  for (int64_t k0 = 0; k0 < K; k0 += kTileK) {
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int idx = tid + r * kThreads;
      const int ka = kAK ? idx % kTileK : idx / kTile, ma = kAK ? idx / kTileK : idx % kTile;
      const int kb = kBK ? idx % kTileK : idx / kTile, nb = kBK ? idx / kTileK : idx % kTile;
      sm.a[ka][ma] = k0 + ka < K ? fa(ma, k0 + ka) : 0.0f;
      sm.b[kb][nb] = k0 + kb < K ? fb(k0 + kb, nb) : 0.0f;
    }
    __syncthreads();
    mma_step(acc, sm.a, sm.b, tx, ty);
    __syncthreads();
  }
}

// The same product on tensor cores: operands rounded to T, f32 accumulation. 8 warps, each a
// 16 x 32 strip (two 16 x 16 fragments) of the tile. K advances 64 at a time: every thread
// issues its 16 loads of an operand before storing any (latency overlap), and a 64-deep stage
// costs one barrier pair instead of four.
template <bool kAK, bool kBK, class T, class FA, class FB>
__device__ __forceinline__ void gemm(float (&acc)[4][4], GemmSmem<T, true>& sm, int64_t K,
                                     const FA& fa, const FB& fb) {
  constexpr int kPer = kTile * kTcStageK / kThreads;  // elements of one operand per thread
  constexpr int kBatch = 8;
  const int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;
  const int warp = tid / 32, r0 = (warp / 2) * 16, c0 = (warp % 2) * 32;
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) sm.u.f[ty + 16 * i][tx + 16 * j] = acc[i][j];
  __syncthreads();
  FragC f[2];
#pragma unroll
  for (int j = 0; j < 2; ++j)
    wm::load_matrix_sync(f[j], &sm.u.f[r0][c0 + 16 * j], kLdF, wm::mem_row_major);
  __syncthreads();  // the operand stages below overlay f
  for (int64_t k0 = 0; k0 < K; k0 += kTcStageK) {
    // Batches of kBatch loads in flight per thread: enough to overlap their latency, few enough
    // to keep the kernels near 128 registers (two blocks per SM).
#pragma unroll 1
    for (int r0b = 0; r0b < kPer; r0b += kBatch) {
      float v[kBatch];
#pragma unroll
      for (int r = 0; r < kBatch; ++r) {
        const int idx = tid + (r0b + r) * kThreads;
        const int ka = kAK ? idx % kTcStageK : idx / kTile,
                  ma = kAK ? idx / kTcStageK : idx % kTile;
        v[r] = k0 + ka < K ? fa(ma, k0 + ka) : 0.0f;
      }
#pragma unroll
      for (int r = 0; r < kBatch; ++r) {
        const int idx = tid + (r0b + r) * kThreads;
        const int ka = kAK ? idx % kTcStageK : idx / kTile,
                  ma = kAK ? idx / kTcStageK : idx % kTile;
        sm.u.s.a[ma][ka] = from_float<T>(v[r]);
      }
    }
#pragma unroll 1
    for (int r0b = 0; r0b < kPer; r0b += kBatch) {
      float v[kBatch];
#pragma unroll
      for (int r = 0; r < kBatch; ++r) {
        const int idx = tid + (r0b + r) * kThreads;
        const int kb = kBK ? idx % kTcStageK : idx / kTile,
                  nb = kBK ? idx / kTcStageK : idx % kTile;
        v[r] = k0 + kb < K ? fb(k0 + kb, nb) : 0.0f;
      }
#pragma unroll
      for (int r = 0; r < kBatch; ++r) {
        const int idx = tid + (r0b + r) * kThreads;
        const int kb = kBK ? idx % kTcStageK : idx / kTile,
                  nb = kBK ? idx / kTcStageK : idx % kTile;
        sm.u.s.b[kb][nb] = from_float<T>(v[r]);
      }
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < kTcStageK; kk += 16) {
      FragA<T> a;
      wm::load_matrix_sync(a, &sm.u.s.a[r0][kk], kLdA);
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        FragB<T> b;
        wm::load_matrix_sync(b, &sm.u.s.b[kk][c0 + 16 * j], kLdB);
        wm::mma_sync(f[j], a, b, f[j]);
      }
    }
    __syncthreads();
  }
  // The loop's last barrier (or the one before it) freed the stages that f overlays.
#pragma unroll
  for (int j = 0; j < 2; ++j)
    wm::store_matrix_sync(&sm.u.f[r0][c0 + 16 * j], f[j], kLdF, wm::mem_row_major);
  __syncthreads();
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) acc[i][j] = sm.u.f[ty + 16 * i][tx + 16 * j];
  __syncthreads();  // f is rewritten by the next product
}

// acc += Ms (64 x 64 f32, written before the call; visible after its first barrier) . fb.
template <bool kBK, class T, class FB>
__device__ __forceinline__ void gemm_sa(float (&acc)[4][4], const float (*Ms)[kLdM],
                                        GemmSmem<T, false>& sm, const FB& fb) {
  const int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;
  for (int k0 = 0; k0 < kTile; k0 += kTileK) {
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int idx = tid + r * kThreads;
      const int kb = kBK ? idx % kTileK : idx / kTile, nb = kBK ? idx / kTileK : idx % kTile;
      sm.b[kb][nb] = fb(k0 + kb, nb);
    }
    __syncthreads();
#pragma unroll
    for (int k = 0; k < kTileK; ++k) {
      float a[4], bv[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) a[i] = Ms[ty + 16 * i][k0 + k], bv[i] = sm.b[k][tx + 16 * i];
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(a[i], bv[j], acc[i][j]);
    }
    __syncthreads();
  }
}
template <bool kBK, class T, class FB>
__device__ __forceinline__ void gemm_sa(float (&acc)[4][4], const float (*Ms)[kLdM],
                                        GemmSmem<T, true>& sm, const FB& fb) {
  gemm<true, kBK>(
      acc, sm, kTile, [&](int m, int64_t k) { return Ms[m][k]; },
      [&](int64_t k, int n) { return fb(static_cast<int>(k), n); });
}

// ---- chunked_wmma_vec: the same tensor-core products, operands staged by whole 16-byte vectors.
// The element-wise loaders above issue 16 loads per operand and thread per 64-deep stage, in
// batches of 8 (four memory round trips per stage, int64 index math per
// element). Here an operand is described once per product (TileSrc) and every thread fetches its
// 2 (16-bit) or 4 (f32) vectors of both operands before converting any of them: one round trip
// per stage. Shared tiles keep the operand's storage orientation (the contiguous dimension along
// a row) and the fragments read them row- or column-major accordingly, so nothing is transposed.
// Same values, same rounding to T, same fragment order as chunked_wmma: the results are bitwise
// equal (ssd_test checks that).

// The MMAs of one staged 64-deep slice. kAK: A stored [m][k] (else [k][m]); kBK: B stored [n][k]
// (else [k][n]).
template <bool kAK, bool kBK, class T>
__device__ __forceinline__ void mma_stage(FragC (&f)[2], GemmSmem<T, true>& sm, int r0, int c0) {
#pragma unroll
  for (int kk = 0; kk < kTcStageK; kk += 16) {
    using FA = std::conditional_t<kAK, FragA<T>, FragAc<T>>;
    using FB = std::conditional_t<kBK, FragBc<T>, FragB<T>>;
    FA a;
    if constexpr (kAK)
      wm::load_matrix_sync(a, &sm.u.s.a[r0][kk], kLdA);
    else
      wm::load_matrix_sync(a, &sm.u.s.a[kk][r0], kLdA);
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      FB b;
      if constexpr (kBK)
        wm::load_matrix_sync(b, &sm.u.s.b[c0 + 16 * j][kk], kLdB);
      else
        wm::load_matrix_sync(b, &sm.u.s.b[kk][c0 + 16 * j], kLdB);
      wm::mma_sync(f[j], a, b, f[j]);
    }
  }
}

// acc (SIMT layout) -> this warp's two fragments, and back; the f tile overlays the stages.
__device__ __forceinline__ void acc_to_frag(FragC (&f)[2], const float (&acc)[4][4],
                                            float (*F)[kLdF], int r0, int c0) {
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) F[ty + 16 * i][tx + 16 * j] = acc[i][j];
  __syncthreads();
#pragma unroll
  for (int j = 0; j < 2; ++j)
    wm::load_matrix_sync(f[j], &F[r0][c0 + 16 * j], kLdF, wm::mem_row_major);
  __syncthreads();
}
__device__ __forceinline__ void frag_to_acc(float (&acc)[4][4], FragC (&f)[2], float (*F)[kLdF],
                                            int r0, int c0) {
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
#pragma unroll
  for (int j = 0; j < 2; ++j)
    wm::store_matrix_sync(&F[r0][c0 + 16 * j], f[j], kLdF, wm::mem_row_major);
  __syncthreads();
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) acc[i][j] = F[ty + 16 * i][tx + 16 * j];
  __syncthreads();  // f is rewritten by the next product
}

// acc += A . B (kAccumulate false: acc = A . B, its input ignored; the caller's last use of sm
// ended with a barrier) over k < K: A (m x k) is stored [m][k] when kAK, else [k][m]; B (k x n) is
// stored [n][k] when kBK, else [k][n] (the TileSrc rows are the first index). a_scale (shared
// memory or nullptr): a factor per stored row of A, applied before the rounding to T.
template <bool kAK, bool kBK, bool kAccumulate = true, class T, class SA, class SB>
__device__ __forceinline__ void gemm_v(float (&acc)[4][4], GemmSmem<T, true>& sm, int64_t K,
                                       TileSrc<SA> A, TileSrc<SB> B,
                                       const float* a_scale = nullptr) {
  const int warp = threadIdx.x / 32, r0 = (warp / 2) * 16, c0 = (warp % 2) * 32;
  int& ak = kAK ? A.cols : A.rows;  // k >= K reads as zero
  int& bk = kBK ? B.cols : B.rows;
  ak = ak < K ? ak : static_cast<int>(K);
  bk = bk < K ? bk : static_cast<int>(K);
  FragC f[2];
  if constexpr (kAccumulate) {
    acc_to_frag(f, acc, sm.u.f, r0, c0);
  } else {  // acc = A . B: the fragments start at zero, no trip through shared memory
#pragma unroll
    for (int j = 0; j < 2; ++j) wm::fill_fragment(f[j], 0.0f);
  }
  for (int k0 = 0; k0 < K; k0 += kTcStageK) {
    Staged<SA> ra;
    Staged<SB> rb;
    fetch_stage(ra, A, kAK ? 0 : k0, kAK ? k0 : 0);
    fetch_stage(rb, B, kBK ? 0 : k0, kBK ? k0 : 0);
    commit_stage(sm.u.s.a, ra, A, kAK ? 0 : k0, a_scale);
    commit_stage(sm.u.s.b, rb, B, kBK ? 0 : k0, nullptr);
    __syncthreads();
    mma_stage<kAK, kBK>(f, sm, r0, c0);
    __syncthreads();
  }
  frag_to_acc(acc, f, sm.u.f, r0, c0);
}

// B limited to one 64-deep stage (k >= 64 reads as zero).
template <bool kBK, class SB>
__device__ __forceinline__ TileSrc<SB> one_stage(TileSrc<SB> B) {
  int& bk = kBK ? B.cols : B.rows;
  bk = bk < kTile ? bk : kTile;
  return B;
}
// Clamps B to one stage (one_stage) and fetches that stage.
template <bool kBK, class SB>
__device__ __forceinline__ Staged<SB> fetch_b_stage(TileSrc<SB>& B) {
  B = one_stage<kBK>(B);
  Staged<SB> rb;
  fetch_stage(rb, B, 0, 0);
  return rb;
}

// The MMAs of one 64-deep stage: f += At (rows r0.., [m][k], pitch kLdB) . the staged B (kBK: B
// stored [n][k]).
template <bool kBK, class T>
__device__ __forceinline__ void mma_at_b(FragC (&f)[2], const T (*At)[kLdB], GemmSmem<T, true>& sm,
                                         int r0, int c0) {
#pragma unroll
  for (int kk = 0; kk < kTcStageK; kk += 16) {
    using FB = std::conditional_t<kBK, FragBc<T>, FragB<T>>;
    FragA<T> a;
    wm::load_matrix_sync(a, &At[r0][kk], kLdB);
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      FB b;
      if constexpr (kBK)
        wm::load_matrix_sync(b, &sm.u.s.b[c0 + 16 * j][kk], kLdB);
      else
        wm::load_matrix_sync(b, &sm.u.s.b[kk][c0 + 16 * j], kLdB);
      wm::mma_sync(f[j], a, b, f[j]);
    }
  }
}

// f += At (64 x 64, already rounded to T, [m][k] with pitch kLdB, in shared memory and visible)
// . B (one 64-deep stage), on this warp's fragments: a run of these products keeps the
// accumulator in fragments instead of taking it through shared memory and the SIMT layout each
// time. The caller's last use of the staging ended with a barrier; so does this.
template <bool kBK, class T, class SB>
__device__ __forceinline__ void gemm_ts_frag(FragC (&f)[2], const T (*At)[kLdB],
                                             GemmSmem<T, true>& sm, TileSrc<SB> B) {
  const int warp = threadIdx.x / 32, r0 = (warp / 2) * 16, c0 = (warp % 2) * 32;
  const Staged<SB> rb = fetch_b_stage<kBK>(B);
  commit_stage(sm.u.s.b, rb, B, 0, nullptr);
  __syncthreads();
  mma_at_b<kBK>(f, At, sm, r0, c0);
  __syncthreads();
}

// acc += sum over the tiles i < n of At(i) . B(i): the products of gemm_ts_frag in order, with one
// trip of the accumulator into and out of fragments, and B(i + 1) fetched into registers while
// product i runs (its vectors are committed to shared memory once product i's barrier passed).
template <bool kBK, class T, class AtOf, class BOf>
__device__ __forceinline__ void gemm_ts_run(float (&acc)[4][4], GemmSmem<T, true>& sm, int n,
                                            AtOf&& at_of, BOf&& b_of) {
  const int warp = threadIdx.x / 32, r0 = (warp / 2) * 16, c0 = (warp % 2) * 32;
  auto b_tile = [&](int i) { return one_stage<kBK>(b_of(i)); };
  FragC f[2];
  acc_to_frag(f, acc, sm.u.f, r0, c0);
  using SB = std::remove_cv_t<std::remove_reference_t<decltype(*b_of(0).p)>>;
  Staged<SB> rb;
  if (n > 0) fetch_stage(rb, b_tile(0), 0, 0);
  for (int i = 0; i < n; ++i) {
    commit_stage(sm.u.s.b, rb, b_tile(i), 0, nullptr);
    if (i + 1 < n) fetch_stage(rb, b_tile(i + 1), 0, 0);
    __syncthreads();
    mma_at_b<kBK>(f, at_of(i), sm, r0, c0);
    __syncthreads();
  }
  frag_to_acc(acc, f, sm.u.f, r0, c0);
}

// f += Ms (64 x 64 f32 in shared memory, published by a barrier before the call) . B (one 64-deep
// stage), on this warp's fragments; ends with a barrier.
template <bool kBK, class T, class SB>
__device__ __forceinline__ void gemm_sa_frag(FragC (&f)[2], const float (*Ms)[kLdM],
                                             GemmSmem<T, true>& sm, TileSrc<SB> B) {
  const int warp = threadIdx.x / 32, r0 = (warp / 2) * 16, c0 = (warp % 2) * 32;
  const Staged<SB> rb = fetch_b_stage<kBK>(B);
#pragma unroll 4  // few values in flight: the B vectors above are still live
  for (int r = 0; r < kTile * kTcStageK / kThreads; ++r) {
    const int idx = threadIdx.x + r * kThreads, m = idx / kTcStageK, k = idx % kTcStageK;
    sm.u.s.a[m][k] = from_float<T>(Ms[m][k]);
  }
  commit_stage(sm.u.s.b, rb, B, 0, nullptr);
  __syncthreads();
  mma_stage<true, kBK>(f, sm, r0, c0);
  __syncthreads();
}

// acc += Ms . B: gemm_sa_frag with the accumulator taken into fragments and back (whose barriers
// also publish Ms).
template <bool kBK, class T, class SB>
__device__ __forceinline__ void gemm_sa_v(float (&acc)[4][4], const float (*Ms)[kLdM],
                                          GemmSmem<T, true>& sm, TileSrc<SB> B) {
  const int warp = threadIdx.x / 32, r0 = (warp / 2) * 16, c0 = (warp % 2) * 32;
  FragC f[2];
  acc_to_frag(f, acc, sm.u.f, r0, c0);
  gemm_sa_frag<kBK>(f, Ms, sm, B);
  frag_to_acc(acc, f, sm.u.f, r0, c0);
}

// fn(TileSrc of dy' rows [t, t + rows) of head h, columns [d0, d0 + cols)): the f32 workspace
// with z, dy itself without (a uniform branch per product).
template <class T, class Fn>
__device__ __forceinline__ void with_dyp(const BwdC<T>& p, int64_t b, int64_t t, int64_t h,
                                         int64_t d0, int64_t rows, int64_t cols, Fn&& fn) {
  if (p.has_z)
    fn(tile_src(p.dyp + ((b * p.L + t) * p.H + h) * p.D + d0, p.H * p.D, 1, rows, cols));
  else
    fn(tile_src(&p.dy.at(b, t, h, d0), p.dy.s1, p.dy.s3, rows, cols));
}

// Sum over the 16 threads (tx) that share a row of the tile, in a fixed butterfly order.
__device__ __forceinline__ float row_sum16(float v) {
#pragma unroll
  for (int o = 8; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// The chunk a block works on: t_base, o_base (index into dtp/cum) and K valid tokens.
struct ChunkAt {
  int64_t t_base, o_base, K;
};
template <class T>
__device__ __forceinline__ ChunkAt chunk_at(const BwdC<T>& p, int64_t c, int64_t bh) {
  const int64_t t_base = c * p.cs;
  return {t_base, bh * p.Lpad + t_base, p.L - t_base < p.cs ? p.L - t_base : p.cs};
}

// kVec: the chunk's cum (f64) and dt' staged in shared memory once per block, so that the weight
// fills W_ts = exp(cum_t - cum_s) (.. dt'_s) read them there instead of issuing two f64 and one f32
// global load per element (the generic pointers may alias the shared tiles being written, so the
// compiler cannot hoist those loads). Same values: results stay bitwise equal to chunked_wmma.
struct ChunkScalars {
  double cum[256];
  float dtp[256];
};
template <class T>
__device__ __forceinline__ void stage_chunk_scalars(const BwdC<T>& p, int64_t ob,
                                                    ChunkScalars& cs) {
  for (int t = threadIdx.x; t < p.cs; t += kThreads)
    cs.cum[t] = p.cum[ob + t], cs.dtp[t] = p.dtp[ob + t];
  __syncthreads();
}

// C_t . B_s per (b, group, chunk), the causal 64 x 64 tiles only.
template <class T, bool kTC, bool kVec>
__device__ __forceinline__ void bwd_cb_body(const BwdC<T>& p) {
  static_assert(kTC || !kVec, "the vectorized staging is a tensor-core path");
  __shared__ GemmSmem<T, kTC> sm;
  const int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;
  const int64_t G = p.H / p.hpg, tt = p.ntt;
  const int64_t c = blockIdx.x / (tt * tt), rest = blockIdx.x % (tt * tt);
  const int64_t t_lo = (rest / tt) * kTile, s0 = (rest % tt) * kTile;
  const int64_t bg = blockIdx.y, b = bg / G, g = bg % G;
  const int64_t t_base = c * p.cs, K = p.L - t_base < p.cs ? p.L - t_base : p.cs;
  if (s0 > t_lo || t_lo >= K) return;  // uniform over the block
  float acc[4][4] = {};
  if constexpr (kVec)
    gemm_v<true, true>(acc, sm, p.N,
                       tile_src(&p.Cm.at(b, t_base + t_lo, g, 0), p.Cm.s1, p.Cm.s3, K - t_lo, p.N),
                       tile_src(&p.Bm.at(b, t_base + s0, g, 0), p.Bm.s1, p.Bm.s3, K - s0, p.N));
  else
    gemm<true, true>(
        acc, sm, p.N,
        [&](int m, int64_t k) {
          return t_lo + m < K ? to_float(p.Cm.at(b, t_base + t_lo + m, g, k)) : 0.0f;
        },
        [&](int64_t k, int n) {
          return s0 + n < K ? to_float(p.Bm.at(b, t_base + s0 + n, g, k)) : 0.0f;
        });
  float* out = p.cbm + (bg * p.nchunks + c) * p.cs * p.cs;
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) out[(t_lo + ty + 16 * i) * p.cs + s0 + tx + 16 * j] = acc[i][j];
}
template <class T, bool kTC>
__global__ void __launch_bounds__(kThreads) bwd_cb_kernel(BwdC<T> p) {
  bwd_cb_body<T, kTC, false>(p);
}
// chunked_wmma_vec's twin: two blocks per SM (<= 128 registers), as chunked_wmma gets by default.
template <class T>
__global__ void __launch_bounds__(kThreads, 2) bwd_cb_vec_kernel(BwdC<T> p) {
  bwd_cb_body<T, true, true>(p);
}

// With z: recomputes the forward's pre-gate output (as chunk_out does) to form dz and dy'.
template <class T, bool kTC, bool kVec>
__device__ __forceinline__ void bwd_gate_body(const BwdC<T>& p) {
  static_assert(kTC || !kVec, "the vectorized staging is a tensor-core path");
  __shared__ GemmSmem<T, kTC> sm;
  __shared__ float Ms[kTile][kLdM];
  const int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;
  const int64_t c = blockIdx.x / p.ntt, t_lo = (blockIdx.x % p.ntt) * kTile;
  const int64_t d0 = blockIdx.y * int64_t{kTile};
  const int64_t bh = blockIdx.z, b = bh / p.H, h = bh % p.H, g = h / p.hpg;
  const ChunkAt ch = chunk_at(p, c, bh);
  const int64_t K = ch.K, tb = ch.t_base, ob = ch.o_base;
  if (t_lo >= K) return;
  const float* S0 = p.st + (bh * p.nchunks + c) * p.D * p.N;
  float acc[4][4] = {};
  if constexpr (kVec)
    gemm_v<true, true>(acc, sm, p.N,
                       tile_src(&p.Cm.at(b, tb + t_lo, g, 0), p.Cm.s1, p.Cm.s3, K - t_lo, p.N),
                       tile_src(S0 + d0 * p.N, p.N, 1, p.D - d0, p.N));
  else
    gemm<true, true>(
        acc, sm, p.N,
        [&](int m, int64_t k) {
          return t_lo + m < K ? to_float(p.Cm.at(b, tb + t_lo + m, g, k)) : 0.0f;
        },
        [&](int64_t k, int n) { return d0 + n < p.D ? S0[(d0 + n) * p.N + k] : 0.0f; });
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int64_t t = t_lo + ty + 16 * i;
    const float e = t < K ? expf(static_cast<float>(p.cum[ob + t])) : 0.0f;
#pragma unroll
    for (int j = 0; j < 4; ++j) acc[i][j] *= e;
  }
  const float* cbt = p.cbm + ((b * (p.H / p.hpg) + g) * p.nchunks + c) * p.cs * p.cs;
  __shared__ std::conditional_t<kVec, ChunkScalars, char> sc;  // char: unused
  if constexpr (kVec) stage_chunk_scalars(p, ob, sc);
  for (int64_t s0 = 0; s0 <= t_lo; s0 += kTile) {
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int64_t t = t_lo + ty + 16 * i, s = s0 + tx + 16 * j;
        float w = 0.0f;
        if (s <= t && t < K) {
          if constexpr (kVec)
            w = expf(static_cast<float>(sc.cum[t] - sc.cum[s])) * sc.dtp[s] * cbt[t * p.cs + s];
          else
            w = expf(static_cast<float>(p.cum[ob + t] - p.cum[ob + s])) * p.dtp[ob + s] *
                cbt[t * p.cs + s];
        }
        Ms[ty + 16 * i][tx + 16 * j] = w;
      }
    if constexpr (kVec)
      gemm_sa_v<false>(acc, Ms, sm,
                       tile_src(&p.x.at(b, tb + s0, h, d0), p.x.s1, p.x.s3, K - s0, p.D - d0));
    else
      gemm_sa<false>(acc, Ms, sm, [&](int k, int n) {
        return s0 + k < K && d0 + n < p.D ? to_float(p.x.at(b, tb + s0 + k, h, d0 + n)) : 0.0f;
      });
  }
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t t = t_lo + ty + 16 * i, d = d0 + tx + 16 * j;
      if (t >= K || d >= p.D) continue;
      const float xv = to_float(p.x.at(b, tb + t, h, d));
      const float ypre = acc[i][j] + (p.has_d ? p.Dv.at(h, d) * xv : 0.0f);
      const float z = to_float(p.z.at(b, tb + t, h, d)), sg = 1.0f / (1.0f + expf(-z));
      const float dyv = to_float(p.dy.at(b, tb + t, h, d));
      p.dz.at(b, tb + t, h, d) = from_float<T>(dyv * ypre * sg * (1.0f + z * (1.0f - sg)));
      p.dyp[((b * p.L + tb + t) * p.H + h) * p.D + d] = dyv * z * sg;
    }
}
template <class T, bool kTC>
__global__ void __launch_bounds__(kThreads) bwd_gate_kernel(BwdC<T> p) {
  bwd_gate_body<T, kTC, false>(p);
}
// chunked_wmma_vec's twin: two blocks per SM (<= 128 registers), as chunked_wmma gets by default.
template <class T>
__global__ void __launch_bounds__(kThreads, 2) bwd_gate_vec_kernel(BwdC<T> p) {
  bwd_gate_body<T, true, true>(p);
}

// U_c[d][n] = sum_t exp(cum_t) dy'_t[d] C_t[n]: the chunk's own term of the state adjoint.
template <class T, bool kTC, bool kVec>
__device__ __forceinline__ void bwd_ustate_body(const BwdC<T>& p) {
  static_assert(kTC || !kVec, "the vectorized staging is a tensor-core path");
  __shared__ GemmSmem<T, kTC> sm;
  const int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;
  const int64_t d0 = (blockIdx.x / p.ntn) * kTile, n0 = (blockIdx.x % p.ntn) * kTile;
  const int64_t c = blockIdx.y, bh = blockIdx.z, b = bh / p.H, h = bh % p.H, g = h / p.hpg;
  const ChunkAt ch = chunk_at(p, c, bh);
  float acc[4][4] = {};
  if constexpr (kVec) {
    __shared__ float ecum[256];  // exp(cum_t), the row scale of dy'
    for (int t = tid; t < p.cs; t += kThreads)
      ecum[t] = t < ch.K ? expf(static_cast<float>(p.cum[ch.o_base + t])) : 0.0f;
    __syncthreads();
    with_dyp(p, b, ch.t_base, h, d0, ch.K, p.D - d0, [&](const auto& a) {
      gemm_v<false, false>(
          acc, sm, ch.K, a,
          tile_src(&p.Cm.at(b, ch.t_base, g, n0), p.Cm.s1, p.Cm.s3, ch.K, p.N - n0), ecum);
    });
  } else
    gemm<false, false>(
        acc, sm, ch.K,
        [&](int m, int64_t k) {
          return d0 + m < p.D ? expf(static_cast<float>(p.cum[ch.o_base + k])) *
                                    p.dyp_at(b, ch.t_base + k, h, d0 + m)
                              : 0.0f;
        },
        [&](int64_t k, int n) {
          return n0 + n < p.N ? to_float(p.Cm.at(b, ch.t_base + k, g, n0 + n)) : 0.0f;
        });
  float* out = p.gst + (bh * p.nchunks + c) * p.D * p.N;
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t d = d0 + ty + 16 * i, n = n0 + tx + 16 * j;
      if (d < p.D && n < p.N) out[d * p.N + n] = acc[i][j];
    }
}
template <class T, bool kTC>
__global__ void __launch_bounds__(kThreads) bwd_ustate_kernel(BwdC<T> p) {
  bwd_ustate_body<T, kTC, false>(p);
}
// chunked_wmma_vec's twin: two blocks per SM (<= 128 registers), as chunked_wmma gets by default.
template <class T>
__global__ void __launch_bounds__(kThreads, 2) bwd_ustate_vec_kernel(BwdC<T> p) {
  bwd_ustate_body<T, true, true>(p);
}

// chunked_mma_fastpass's U_c (chunk_outer_mma_kernel): a = dy' (S = float: the dy * silu(z)
// workspace, [B][L][H][D]; S = T: dy itself), b = C, out = gst.
template <class T, class S>
OuterArgs<T, S> outer_args_ustate(const BwdC<T>& p) {
  OuterArgs<T, S> a{};
  if constexpr (std::is_same_v<S, float>) {
    a.a = p.dyp, a.a_b = p.L * p.H * p.D, a.a_t = p.H * p.D, a.a_h = p.D;
  } else {
    a.a = p.dy.p, a.a_b = p.dy.s0, a.a_t = p.dy.s1, a.a_h = p.dy.s2;
  }
  a.bm = p.Cm, a.cum = p.cum, a.dtp = p.dtp, a.out = p.gst;
  a.L = p.L, a.H = p.H, a.D = p.D, a.N = p.N, a.hpg = p.hpg, a.cs = p.cs;
  a.nchunks = p.nchunks, a.Lpad = p.Lpad, a.hb = p.hb_state;
  a.hat = p.dyh;
  return a;
}
template <class T>
bool ustate_mma_fits(const BwdC<T>& p) {
  return mma_shape_fits(p) && rows16(p.Cm) && (p.has_z || rows16(p.dy));
}

// The reverse scan over chunks: gst[c] becomes the adjoint of the state leaving chunk c; what is
// left at the start is d_initial_states.
template <class T>
__global__ void bwd_state_rev_kernel(BwdC<T> p) {
  const int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  const int64_t bh = blockIdx.y, b = bh / p.H, h = bh % p.H;
  if (e >= p.D * p.N) return;
  const int64_t d = e / p.N, n = e % p.N;
  float gv = p.has_dfin ? p.dfin.at(b, h, d, n) : 0.0f;
  for (int64_t c = p.nchunks - 1; c >= 0; --c) {
    const int64_t at = (bh * p.nchunks + c) * p.D * p.N + e;
    float* cell = p.gst + at;
    const float own = *cell;
    *cell = gv;
    if constexpr (sizeof(T) == 2) p.gst16[at] = from_float<T>(gv);
    gv = expf(static_cast<float>(p.cum[bh * p.Lpad + c * p.cs + p.cs - 1])) * gv + own;
  }
  if (p.has_init) p.dinit.at(b, h, d, n) = gv;
}

// ---- inter-chunk passes, fast form (the *_fastpass variants)
// ----------------------------------------------------------------------------------------------
// state_pass_kernel and bwd_state_rev_kernel load one f32 per thread per chunk, and that load
// follows the previous chunk's store in program order (the compiler cannot hoist it over a store
// that may alias; the PTX shows ld.f32, st.f32, ld.f64 per chunk), so each thread has one chunk's
// 4-byte load in flight at a time: 16 dependent memory round trips per thread at 16 chunks, and
// 1.9-2.1 ms on the H100 for 2 x 167 MB (docs/perf/ssd.md). chunk_scan_kernel
// does the same scan with one thread per kW consecutive elements of a (b, h) state (16-byte
// vectors along the contiguous D*N axis, consecutive threads on consecutive vectors, the grid
// flattened over B*H*D*N/kW), and a ring of kScanDepth chunks whose vectors and raw f64 decay
// exponents are loaded before the current chunk is stored and folded: kScanDepth loads in flight
// per thread. The float math is the old kernels' exactly: s' = fmaf(expf(float(cum_last)), s, own)
// (the old `expf(..) * s + own` is contracted to that fma by nvcc's default -fmad=true; the
// explicit fmaf pins it), in the same chunk order per element, so the results are bitwise equal.
// 128-thread blocks: at the 70-78 registers of the vector kernels that is 6-7 blocks (768-896
// threads) per SM, where 256-thread blocks give 768 at most.
constexpr int kScanThreads = 128;
constexpr int kScanDepth = 4;  // chunks in flight per thread (4 x 16 B + 4 x 8 B of registers)

struct ChunkScan {
  float* st;          // [B*H][nchunks][D*N]: per-chunk values in, the scanned values out
  const double* cum;  // [B*H][Lpad]: the chunk's decay is exp(cum[c*cs + cs - 1])
  int64_t BH, H, N, dn, nchunks, cs, Lpad;  // dn = D*N
  V4<const float> in;                       // the value entering the first chunk scanned
  V4<float> out;                            // the value leaving the last chunk scanned
  bool has_in, has_out;
  void* st_t = nullptr;     // TO != float: the scanned values go here, rounded to TO, not to st
  void* st_copy = nullptr;  // TC != void: the scanned values also go here, rounded to TC
};

template <int kW>
struct ScanVec {
  float v[kW];
};
template <int kW>
__device__ __forceinline__ ScanVec<kW> scan_load(const float* q) {
  ScanVec<kW> r;
  if constexpr (kW == 4) {
    const float4 f = *reinterpret_cast<const float4*>(q);
    r.v[0] = f.x, r.v[1] = f.y, r.v[2] = f.z, r.v[3] = f.w;
  } else {
#pragma unroll
    for (int i = 0; i < kW; ++i) r.v[i] = q[i];
  }
  return r;
}
template <int kW, class TO>
__device__ __forceinline__ void scan_store(TO* q, const float (&s)[kW]) {
  if constexpr (std::is_same_v<TO, float> && kW == 4) {
    *reinterpret_cast<float4*>(q) = make_float4(s[0], s[1], s[2], s[3]);
  } else if constexpr (sizeof(TO) == 2 && kW == 4) {  // 8 bytes: 4-element groups are aligned
    alignas(8) TO o[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) o[i] = from_float<TO>(s[i]);
    *reinterpret_cast<uint2*>(q) = *reinterpret_cast<const uint2*>(o);
  } else {
#pragma unroll
    for (int i = 0; i < kW; ++i) q[i] = from_float<TO>(s[i]);
  }
}

// kRev = false: the forward pass (st[c] becomes the state entering chunk c, in = initial_states,
// out = final_states). kRev = true: the backward's reverse pass over gst (gst[c] becomes the
// adjoint of the state leaving chunk c, in = d_final_states, out = d_initial_states).
// TO != float (the forward of chunked_wmma_fastpass): the values entering each chunk are written
// rounded to TO into st_t, and st is only read. TC != void (the backward's reverse pass for the
// mma.sync products): a copy rounded to TC goes to st_copy as well.
template <int kW, bool kRev, class TO = float, class TC = void>
__global__ void __launch_bounds__(kScanThreads) chunk_scan_kernel(ChunkScan a) {
  const int64_t per_bh = a.dn / kW;
  const int64_t v = blockIdx.x * int64_t{kScanThreads} + threadIdx.x;
  if (v >= a.BH * per_bh) return;
  const int64_t bh = v / per_bh, e0 = (v - bh * per_bh) * kW;
  const int64_t b = bh / a.H, h = bh - b * a.H;
  const int64_t d0 = e0 / a.N, n0 = e0 - d0 * a.N;
  float s[kW];
  {
    int64_t d = d0, n = n0;
#pragma unroll
    for (int i = 0; i < kW; ++i) {
      s[i] = a.has_in ? a.in.at(b, h, d, n) : 0.0f;
      if (++n == a.N) n = 0, ++d;
    }
  }
  // Only this pointer and n0 stay live for the final store (not b, h, d0): fewer registers.
  float* out = a.has_out ? &a.out.at(b, h, d0, n0) : nullptr;
  // Walking pointers (the next chunk to load, the next to store, the next decay exponent) rather
  // than 64-bit index products per chunk: fewer registers, so more threads per SM.
  const int64_t nc = a.nchunks;
  const int64_t step = kRev ? -a.dn : a.dn, lstep = kRev ? -a.cs : a.cs;
  const int64_t c0 = kRev ? nc - 1 : 0;
  const float* lp = a.st + (bh * nc + c0) * a.dn + e0;
  TO* sp = (std::is_same_v<TO, float> ? static_cast<TO*>(static_cast<void*>(a.st))
                                      : static_cast<TO*>(a.st_t)) +
           (bh * nc + c0) * a.dn + e0;
  const double* dp = a.cum + bh * a.Lpad + c0 * a.cs + a.cs - 1;  // chunk c's cum_last
  using CopyT = std::conditional_t<std::is_void_v<TC>, float, TC>;
  CopyT* cp = static_cast<CopyT*>(a.st_copy) + (bh * nc + c0) * a.dn + e0;
  ScanVec<kW> buf[kScanDepth] = {};
  double lbuf[kScanDepth] = {};
#pragma unroll
  for (int j = 0; j < kScanDepth; ++j) {
    if (j < nc) {
      buf[j] = scan_load<kW>(lp);
      lbuf[j] = *dp;
      lp += step, dp += lstep;
    }
  }
  // The ring: slot j holds chunk k0 + j; the body is unrolled over the slots so that every slot is
  // a fixed register set (shifting a queue instead would move registers whose loads are still in
  // flight, and a move waits for its load). Not unrolled further: more registers, fewer threads.
#pragma unroll 1
  for (int64_t k0 = 0; k0 < nc; k0 += kScanDepth) {
#pragma unroll
    for (int j = 0; j < kScanDepth; ++j) {
      if (k0 + j >= nc) break;
      const ScanVec<kW> own = buf[j];
      const double l = lbuf[j];
      if (k0 + j + kScanDepth < nc) {  // refill the slot before this chunk's store and math
        buf[j] = scan_load<kW>(lp);
        lbuf[j] = *dp;
        lp += step, dp += lstep;
      }
      scan_store<kW, TO>(sp, s);  // the value entering (kRev: leaving) this chunk
      sp += step;
      if constexpr (!std::is_void_v<TC>) {
        scan_store<kW, TC>(cp, s);
        cp += step;
      }
      const float decay = expf(static_cast<float>(l));
#pragma unroll
      for (int i = 0; i < kW; ++i) s[i] = fmaf(decay, s[i], own.v[i]);
    }
  }
  if (a.has_out) {
    int64_t n = n0;
#pragma unroll
    for (int i = 0; i < kW; ++i) {
      *out = s[i];
      if (i + 1 < kW) {  // to element e0 + i + 1: the next n, or the next row's n = 0
        if (++n == a.N)
          n = 0, out += a.out.s2 - (a.N - 1) * a.out.s3;
        else
          out += a.out.s3;
      }
    }
  }
}

// Blocks of the flattened grid (at kW = 1, the larger count); the fastpass variants' fits bound it.
inline int64_t chunk_scan_blocks(const ssd::Problem& p) {
  return (p.batch * p.heads * p.head_dim * p.state_dim + kScanThreads - 1) / kScanThreads;
}

// 16-byte vectors when every (b, h, chunk) slab starts 16-byte aligned (D*N % 4 == 0 and the
// workspace array itself aligned, which the 256-byte workspace alignment and round64 give), else
// one element per thread (same loop, same math).
template <bool kRev, class TO = float, class TC = void>
Status launch_chunk_scan(const ChunkScan& a, cudaStream_t st, std::string_view op) {
  if (a.BH == 0 || a.dn == 0) return {};
  const bool vec = a.dn % 4 == 0 && reinterpret_cast<uintptr_t>(a.st) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(a.st_t) % 8 == 0 &&
                   reinterpret_cast<uintptr_t>(a.st_copy) % 8 == 0;
  const int64_t threads = a.BH * (vec ? a.dn / 4 : a.dn);
  const auto blocks = static_cast<unsigned>((threads + kScanThreads - 1) / kScanThreads);
  if (vec)
    chunk_scan_kernel<4, kRev, TO, TC><<<blocks, kScanThreads, 0, st>>>(a);
  else
    chunk_scan_kernel<1, kRev, TO, TC><<<blocks, kScanThreads, 0, st>>>(a);
  return cuda::check_launch(op, "chunk_scan_kernel");
}

template <class T>
ChunkScan chunk_scan_args(const Fwd<T>& p, float* values) {
  ChunkScan a;
  a.st = values, a.cum = p.cum;
  a.BH = p.B * p.H, a.H = p.H, a.N = p.N, a.dn = p.D * p.N;
  a.nchunks = p.nchunks, a.cs = p.cs, a.Lpad = p.Lpad;
  a.in = V4<const float>{}, a.out = V4<float>{};
  a.has_in = a.has_out = false;
  return a;
}

// Where a dx tile sits: batch b, head h, chunk tokens from tb, the tile's first
// token s_lo and column d0 (tile td of D), K valid tokens in the chunk.
struct DxTileAt {
  int64_t b, h, tb, s_lo, d0, td, K;
};
// The end of a (64 tokens s) x (64 columns d) dx tile in the 16 x 16 thread layout
// (acc[i][j] = element (ty + 16 i, tx + 16 j)): dx = v acc + D dy', and per token the partials
// pdv = sum_d x acc and pE = es v xdot2 (the 16 threads of a row add in a fixed order).
// x_at(i, j, s, d) answers x at (s, d), 0 outside the chunk or D; v_at(s) the processed dt.
template <class T, class XAt, class VAt>
__device__ __forceinline__ void dx_tile_epilogue(const BwdC<T>& p, const float (&acc)[4][4],
                                                 const float (&es)[4], const float (&xdot2)[4],
                                                 const DxTileAt& at, XAt&& x_at, VAt&& v_at) {
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int64_t s = at.s_lo + ty + 16 * i;
    const float v = s < at.K ? v_at(s) : 0.0f;
    float part = 0.0f;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t d = at.d0 + tx + 16 * j;
      part = fmaf(x_at(i, j, s, d), acc[i][j], part);
      if (s < at.K && d < p.D) {
        const float skip = p.has_d ? p.Dv.at(at.h, d) * p.dyp_at(at.b, at.tb + s, at.h, d) : 0.0f;
        p.dx.at(at.b, at.tb + s, at.h, d) = from_float<T>(fmaf(v, acc[i][j], skip));
      }
    }
    part = row_sum16(part);
    if (tx == 0 && s < at.K) {
      const int64_t o = (at.td * p.B * p.H + at.b * p.H + at.h) * p.Lpad + at.tb + s;
      p.pdv[o] = part;
      p.pE[o] = es[i] * v * xdot2[i];
    }
  }
}

// dx for a (64 tokens s) x (64 columns d) tile, and the per-token partials x_s.R_s and E_s.
template <class T, bool kTC>
__global__ void __launch_bounds__(kThreads) bwd_dx_kernel(BwdC<T> p) {
  __shared__ GemmSmem<T, kTC> sm;
  __shared__ float Ms[kTile][kLdM];
  const int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;
  const int64_t c = blockIdx.x / p.ntt, s_lo = (blockIdx.x % p.ntt) * kTile;
  const int64_t td = blockIdx.y, d0 = td * kTile;
  const int64_t bh = blockIdx.z, b = bh / p.H, h = bh % p.H, g = h / p.hpg;
  const ChunkAt ch = chunk_at(p, c, bh);
  const int64_t K = ch.K, tb = ch.t_base, ob = ch.o_base;
  if (s_lo >= K) return;
  const float* Gc = p.gst + (bh * p.nchunks + c) * p.D * p.N;
  const double last = p.cum[ob + p.cs - 1];
  // (B Gc^T)[s][d], kept apart first: E_s needs it without the in-chunk term.
  float acc[4][4] = {};
  gemm<true, true>(
      acc, sm, p.N,
      [&](int m, int64_t k) {
        return s_lo + m < K ? to_float(p.Bm.at(b, tb + s_lo + m, g, k)) : 0.0f;
      },
      [&](int64_t k, int n) { return d0 + n < p.D ? Gc[(d0 + n) * p.N + k] : 0.0f; });
  float xs[4][4], es[4], xdot2[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int64_t s = s_lo + ty + 16 * i;
    es[i] = s < K ? expf(static_cast<float>(last - p.cum[ob + s])) : 0.0f;
    float part = 0.0f;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t d = d0 + tx + 16 * j;
      xs[i][j] = (s < K && d < p.D) ? to_float(p.x.at(b, tb + s, h, d)) : 0.0f;
      part = fmaf(xs[i][j], acc[i][j], part);
      acc[i][j] *= es[i];
    }
    xdot2[i] = row_sum16(part);
  }
  // + sum_{t >= s} W_ts CB_ts dy'_t, one 64-token tile of t at a time.
  const float* cbt = p.cbm + ((b * (p.H / p.hpg) + g) * p.nchunks + c) * p.cs * p.cs;
  for (int64_t t0 = s_lo; t0 < K; t0 += kTile) {
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int64_t s = s_lo + ty + 16 * i, t = t0 + tx + 16 * j;
        float w = 0.0f;
        if (s <= t && t < K)
          w = expf(static_cast<float>(p.cum[ob + t] - p.cum[ob + s])) * cbt[t * p.cs + s];
        Ms[ty + 16 * i][tx + 16 * j] = w;
      }
    gemm_sa<false>(acc, Ms, sm, [&](int k, int n) {
      return t0 + k < K && d0 + n < p.D ? p.dyp_at(b, tb + t0 + k, h, d0 + n) : 0.0f;
    });
  }
  dx_tile_epilogue(
      p, acc, es, xdot2, {b, h, tb, s_lo, d0, td, K},
      [&](int i, int j, int64_t, int64_t) { return xs[i][j]; },
      [&](int64_t s) { return p.dtp[ob + s]; });
}

// chunked_wmma_vec's dx: one block per (chunk, 64 tokens s, 64 columns d, b, block of hb heads of
// one group). The C.B^T tiles of the block's s tile (one per t tile t >= s, [t][s] in f32, pitch
// kLdM for conflict-free transposed reads) are the group's, the same for every head: they are
// copied once per block (cp.async, under the first head's state product) into dynamic shared
// memory once per block rather than once per head and t tile. Per head the products and epilogues
// are bwd_dx_kernel's, in the same order, so dx, pdv and pE stay bitwise equal to chunked_wmma's.
// It serves the layouts bwd_dx_mma_kernel (below) does not: strided or misaligned operands.
inline size_t dx_heads_smem_bytes(const ssd::Problem& p) {
  return sizeof(float) * static_cast<size_t>(p.chunk_size / kTile) * kTile * kLdM;
}
template <class T>
__global__ void __launch_bounds__(kThreads, 2) bwd_dx_heads_vec_kernel(BwdC<T> p) {
  __shared__ GemmSmem<T, true> sm;
  __shared__ ChunkScalars sc;
  extern __shared__ __align__(16) unsigned char dx_dyn[];
  float(*Ct)[kTile][kLdM] = reinterpret_cast<float(*)[kTile][kLdM]>(dx_dyn);
  const int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;
  const int r0 = (tid / 32 / 2) * 16, c0 = (tid / 32 % 2) * 32;
  const int64_t c = blockIdx.x / p.ntt, s_lo = (blockIdx.x % p.ntt) * kTile;
  const int64_t td = blockIdx.y, d0 = td * kTile;
  const int64_t nhb = p.H / p.hb, b = blockIdx.z / nhb, h0 = (blockIdx.z % nhb) * p.hb;
  const int64_t G = p.H / p.hpg, g = h0 / p.hpg;
  const ChunkAt ch0 = chunk_at(p, c, b * p.H + h0);
  const int64_t K = ch0.K, tb = ch0.t_base;
  if (s_lo >= K) return;
  const int nt = static_cast<int>((K - s_lo + kTile - 1) / kTile);  // t tiles t0 >= s_lo
  const float* cbt = p.cbm + ((b * G + g) * p.nchunks + c) * p.cs * p.cs;
  // 4-byte copies (the pitch kLdM is odd), all of this thread's in flight at once.
#pragma unroll 1
  for (int r = tid; r < nt * kTile * kTile; r += kThreads) {
    const int q = r / (kTile * kTile), tt = r / kTile % kTile, ss = r % kTile;
    const int64_t t = s_lo + q * int64_t{kTile} + tt;
    const bool in = t < K;
    cp_async4(&Ct[q][tt][ss], in ? cbt + t * p.cs + s_lo + ss : cbt, in ? 4 : 0);
  }
  cp_async_commit();
  for (int64_t h = h0; h < h0 + p.hb; ++h) {
    const int64_t bh = b * p.H + h, ob = chunk_at(p, c, bh).o_base;
    const float* Gc = p.gst + (bh * p.nchunks + c) * p.D * p.N;
    const double last = p.cum[ob + p.cs - 1];
    // (B Gc^T)[s][d], kept apart first: E_s needs it without the in-chunk term.
    float acc[4][4];
    gemm_v<true, true, false>(
        acc, sm, p.N, tile_src(&p.Bm.at(b, tb + s_lo, g, 0), p.Bm.s1, p.Bm.s3, K - s_lo, p.N),
        tile_src(Gc + d0 * p.N, p.N, 1, p.D - d0, p.N));
    float es[4], xdot2[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int64_t s = s_lo + ty + 16 * i;
      es[i] = s < K ? expf(static_cast<float>(last - p.cum[ob + s])) : 0.0f;
      float part = 0.0f;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int64_t d = d0 + tx + 16 * j;
        const float xv = (s < K && d < p.D) ? to_float(p.x.at(b, tb + s, h, d)) : 0.0f;
        part = fmaf(xv, acc[i][j], part);
        acc[i][j] *= es[i];
      }
      xdot2[i] = row_sum16(part);
    }
    FragC frag[2];
    acc_to_frag(frag, acc, sm.u.f, r0, c0);
    cp_async_wait<0>();              // the C.B^T tiles (first head; a no-op after)
    stage_chunk_scalars(p, ob, sc);  // its barrier publishes them, and the scalars
    for (int q = 0; q < nt; ++q) {
      const int64_t t0 = s_lo + q * int64_t{kTile};
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const int64_t s = s_lo + ty + 16 * i, t = t0 + tx + 16 * j;
          float w = 0.0f;
          if (s <= t && t < K)
            w = expf(static_cast<float>(sc.cum[t] - sc.cum[s])) * Ct[q][tx + 16 * j][ty + 16 * i];
          sm.u.s.a[ty + 16 * i][tx + 16 * j] = from_float<T>(w);
        }
      // the product's first barrier publishes the staged W
      with_dyp(p, b, tb + t0, h, d0, K - t0, p.D - d0,
               [&](const auto& dys) { gemm_ts_frag<false>(frag, sm.u.s.a, sm, dys); });
    }
    frag_to_acc(acc, frag, sm.u.f, r0, c0);
    dx_tile_epilogue(
        p, acc, es, xdot2, {b, h, tb, s_lo, d0, td, K},
        [&](int, int, int64_t s, int64_t d) {
          return (s < K && d < p.D) ? to_float(p.x.at(b, tb + s, h, d)) : 0.0f;
        },
        [&](int64_t s) { return sc.dtp[s]; });
    // sc is restaged by the next head after frag_to_acc's barriers and the next state product's
  }
}

// Causal pairs of 64-token tiles (t tile >= s tile) in a chunk of ntt tiles.
__host__ __device__ inline int64_t causal_pairs(int64_t ntt) {
  return ntt * (ntt + 1) / 2;
}

// ---- dx with one operand shared by the heads of a group (chunked_mma_fastpass, 16-bit data).
// With cum_last the chunk's padded end (as in dx_mma), es_s = exp(cum_last - cum_s) and
// dyh_t = exp(cum_t - cum_last) dy'_t (rounded to T by the U_c kernel, which stages exp(cum_t)
// dy'_t anyway),
//   dx_s = v_s es_s (B_s . Gc^T + sum_{t >= s} CB_ts dyh_t) + D dy'_s,
// so the A operand [B_s | CB^T_s.] is the same for every head: no weight is formed per head, and
// the products are ldmatrix + mma only (dx_mma forms colf_t CB_ts per head and t, which left
// mma.sync at 4% of its instructions). The factors stay in range while |cum_t - cum_last| log2(e)
// <= kFactorSafe over the chunk (dyh <= 2^64 dy' in bf16, es >= 2^-64 in f32); a head past that is
// left to dx_mma, which runs after this kernel on the heads its block's mask names.
template <class T>
__device__ __forceinline__ bool dx_hat_unsafe(const double* cum, int K, int cs, int tid,
                                              int nthreads) {
  bool wide = false;
  const double last = cum[cs - 1];  // = cum[K - 1] up to rounding (padding tokens add zeros)
  for (int t = tid; t < K; t += nthreads) {
    const float e = static_cast<float>((cum[t] - last) * fwd_mma::kLog2e);
    wide = wide || !(fabsf(e) <= fwd_mma::kFactorSafe<T>);
  }
  return wide;
}

// A dx block's coordinates (grid: chunk and 64-row s tile, 64 columns d, hb heads of one group),
// shared by bwd_dx_mma_kernel and bwd_dx_hn_kernel, whose grids are the same (the rest pass reads
// the shared-operand pass's head mask at `flat`).
template <class T>
struct DxBlock {
  int64_t c, s_lo, d0, b, h0, G, grp, K, tb, flat;
  __device__ __forceinline__ explicit DxBlock(const BwdC<T>& p) {
    c = blockIdx.x / p.ntt, s_lo = (blockIdx.x % p.ntt) * kTile;
    d0 = blockIdx.y * int64_t{kTile};
    const int64_t nhb = p.H / p.hb;
    b = blockIdx.z / nhb, h0 = (blockIdx.z % nhb) * p.hb;
    G = p.H / p.hpg, grp = h0 / p.hpg;
    const ChunkAt ch0 = chunk_at(p, c, b * p.H + h0);
    K = ch0.K, tb = ch0.t_base;
    flat = (static_cast<int64_t>(blockIdx.z) * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x;
  }
};

// chunked_wmma_vec's dx on mma.sync, for aligned operands (dx_mma_fits). One block of four warps
// per (chunk, 64 tokens s, 64 columns d, b, hb heads of one group); warp w owns tokens
// s_lo + 16 w .. + 15 and all 64 columns (eight m16n8 accumulator tiles in registers, no shared
// staging of the accumulator). Per head the block runs a flat sequence of 64-deep stages:
// ceil(N / 64) of the state product B_s . Gc^T (Gc as the reverse scan left it rounded to T,
// gst16, read by ldmatrix), then one per t tile t0 >= s_lo of W . dy'. The Gc and dy' tiles (and
// each head's x tile) stream through a kStages-deep cp.async ring that runs on
// across head boundaries; the B tile is loaded once per block. W_ts = exp(cum_t - cum_s) CB_ts is
// built in the A fragments straight from registers holding C.B^T, read from L2 one stage ahead.
// The products round their operands to T and add in bwd_dx_kernel's order, but W's exponential is
// the hardware approximation (expf costs about twice the instructions, and this kernel is bound by
// instruction issue), so dx matches chunked_wmma's to rounding, not bit for bit; it is
// deterministic (fixed order, no atomics).
namespace dx_mma {
constexpr int kWarps = 4, kThreadsDx = 32 * kWarps, kStages = 2;
constexpr int kLdKM = 68;  // f32 tiles read [k][m|n]: rows 2q apart land 8q banks apart
constexpr int kLd16 = 72;  // 16-bit 64-wide tiles: ldmatrix rows 144 B apart
constexpr size_t kSlotBytes = sizeof(float) * kTile * kLdKM;  // holds any stage's tile

struct Layout {
  int64_t bw, ldb;                                    // B tile: N rounded up to 16, its pitch
  size_t b_tile, ring, x_tiles, scalars, raw, total;  // byte offsets (total: the size)
};
__host__ __device__ inline Layout layout(int64_t N) {
  using fwd_mma::round16;
  Layout l{};
  l.bw = fwd_mma::k16(N), l.ldb = l.bw + 8;
  l.scalars = 0;                                         // a head's cl and colf, 256 floats each
  l.raw = l.scalars + round16(sizeof(float) * 2 * 256);  // its cum (f64) and dt, as loaded
  l.b_tile = l.raw + round16((sizeof(double) + sizeof(float)) * 256);
  l.ring = l.b_tile + round16(sizeof(uint16_t) * kTile * static_cast<size_t>(l.ldb));
  l.x_tiles = l.ring + kSlotBytes * kStages;
  l.total = l.x_tiles + round16(sizeof(uint16_t) * 2 * kTile * kLd16);
  return l;
}
}  // namespace dx_mma

inline size_t dx_mma_smem_bytes(const ssd::Problem& p) {
  return dx_mma::layout(p.state_dim).total;
}

// Host side: every operand the kernel copies by 16-byte cp.async or stores by 4-byte pairs has
// unit inner stride, 16-byte aligned rows and a width that is a multiple of 8 elements.
template <class T>
bool dx_mma_fits(const BwdC<T>& p) {
  return sizeof(T) == 2 && p.N % 8 == 0 && p.D % 8 == 0 && p.cs <= 256 && rows16(p.Bm) &&
         rows16(p.x) && rows16(p.dx) && (p.has_z || rows16(p.dy));
}

// kZ: dy' is the f32 dy * silu(z) workspace, else dy itself. kRest: after bwd_dx_hn_kernel (same
// grid), only the heads its mask for the block names (the outputs of those heads only).
template <class T, bool kZ, bool kRest = false>
__global__ void __launch_bounds__(dx_mma::kThreadsDx, 3) bwd_dx_mma_kernel(BwdC<T> p) {
  using namespace dx_mma;
  extern __shared__ __align__(16) unsigned char dxm_smem[];
  const Layout lay = layout(p.N);
  float* cl = reinterpret_cast<float*>(dxm_smem + lay.scalars);  // cum * log2(e), this head
  float* colf = cl + 256;  // exp(cum_t - cum_{s_lo}) for s_lo <= t < K, else 0
  T* Bs = reinterpret_cast<T*>(dxm_smem + lay.b_tile);
  unsigned char* ring = dxm_smem + lay.ring;
  T* xs = reinterpret_cast<T*>(dxm_smem + lay.x_tiles);

  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, g = lane / 4, q4 = lane % 4;
  const DxBlock<T> blk(p);
  const int64_t c = blk.c, s_lo = blk.s_lo, d0 = blk.d0, b = blk.b, h0 = blk.h0;
  const int64_t G = blk.G, grp = blk.grp, K = blk.K, tb = blk.tb;
  if (s_lo >= K) return;                             // uniform over the block
  const int rest = kRest ? p.dx_rest[blk.flat] : 0;  // the heads left to this pass
  if (kRest && rest == 0) return;
  const int nk = static_cast<int>((lay.bw + kTile - 1) / kTile);    // state-product stages
  const int nt = static_cast<int>((K - s_lo + kTile - 1) / kTile);  // t tiles t0 >= s_lo
  const int S = nk + nt, total = static_cast<int>(p.hb) * S;
  const float* cbt = p.cbm + ((b * G + grp) * p.nchunks + c) * p.cs * p.cs;

  double* cum_raw = reinterpret_cast<double*>(dxm_smem + lay.raw);
  float* dt_raw = reinterpret_cast<float*>(cum_raw + 256);

  // ---- producer: stage i of the flat (head, stage) sequence into ring slot i % kStages
  // (Stage indices by i / S, i % S: counters instead measured slower here, 0.790 vs 0.770 ms
  // with the cp.async of cum below, their registers spilling.)
  auto issue = [&](int i) {
    if (i >= total) return;
    const int hi = i / S, j = i % S;
    const int64_t h = h0 + hi, bh = b * p.H + h;
    if (j == 0) {  // the head's cum and dt: read at its first stage, when the previous head's
                   // setup (the only reader) is behind a barrier
      const int64_t ob = bh * p.Lpad + tb;
      for (int k = tid; k < p.cs / 2; k += kThreadsDx)
        cp_async16(cum_raw + 2 * k, p.cum + ob + 2 * k);
      for (int k = tid; k < p.cs / 4; k += kThreadsDx)
        cp_async16(dt_raw + 4 * k, p.dtp + ob + 4 * k);
    }
    if (i == 0)  // the B tile, once per block; columns [N, bw) zero for the last k16 step
      for (int idx = tid; idx < kTile * (lay.bw / 8); idx += kThreadsDx) {
        const int r = idx / static_cast<int>(lay.bw / 8),
                  col = idx % static_cast<int>(lay.bw / 8) * 8;
        const bool in = s_lo + r < K && col < p.N;
        cp_async16(Bs + r * lay.ldb + col, in ? &p.Bm.at(b, tb + s_lo + r, grp, col) : p.Bm.p,
                   in ? 16 : 0);
      }
    if (j == 0)  // this head's x tile, for the row sums
      for (int idx = tid; idx < kTile * 8; idx += kThreadsDx) {
        const int r = idx / 8, col = idx % 8 * 8;
        const bool in = s_lo + r < K && d0 + col < p.D;
        cp_async16(xs + (hi % 2) * kTile * kLd16 + r * kLd16 + col,
                   in ? &p.x.at(b, tb + s_lo + r, h, d0 + col) : p.x.p, in ? 16 : 0);
      }
    unsigned char* slot = ring + (i % kStages) * kSlotBytes;
    if (j < nk) {  // Gc rows d0.., columns 64 j.. (rounded to T)
      const T* Gc = p.gst16 + (bh * p.nchunks + c) * p.D * p.N;
      T* dst = reinterpret_cast<T*>(slot);
      for (int idx = tid; idx < kTile * 8; idx += kThreadsDx) {
        const int r = idx / 8, col = idx % 8 * 8;
        const int64_t n = int64_t{j} * kTile + col;
        const bool in = d0 + r < p.D && n < p.N;
        cp_async16(dst + r * kLd16 + col, in ? Gc + (d0 + r) * p.N + n : Gc, in ? 16 : 0);
      }
    } else if constexpr (kZ) {  // dy' rows t0.., columns d0.. (f32 workspace)
      const int64_t t0 = s_lo + int64_t{j - nk} * kTile;
      float* dst = reinterpret_cast<float*>(slot);
      for (int idx = tid; idx < kTile * 16; idx += kThreadsDx) {
        const int r = idx / 16, col = idx % 16 * 4;
        const bool in = t0 + r < K && d0 + col < p.D;
        const float* src = p.dyp + ((b * p.L + tb + t0 + r) * p.H + h) * p.D + d0 + col;
        cp_async16(dst + r * kLdKM + col, in ? src : p.dyp, in ? 16 : 0);
      }
    } else {  // dy rows t0.., columns d0.. (T)
      const int64_t t0 = s_lo + int64_t{j - nk} * kTile;
      T* dst = reinterpret_cast<T*>(slot);
      for (int idx = tid; idx < kTile * 8; idx += kThreadsDx) {
        const int r = idx / 8, col = idx % 8 * 8;
        const bool in = t0 + r < K && d0 + col < p.D;
        cp_async16(dst + r * kLd16 + col, in ? &p.dy.at(b, tb + t0 + r, h, d0 + col) : p.dy.p,
                   in ? 16 : 0);
      }
    }
  };

  // ---- per-thread state: rows r0 = s_lo + 16 warp + g and r0 + 8
  // in-chunk offsets fit 32 bits (cs <= 256)
  const int srow[2] = {static_cast<int>(s_lo) + 16 * warp + g,
                       static_cast<int>(s_lo) + 16 * warp + g + 8};
  const int s_lo32 = static_cast<int>(s_lo), K32 = static_cast<int>(K);
  float acc[8][4];
  float cbr[4][8];  // C.B^T of the next t tile, in A-fragment order
  float cl_s[2] = {0.0f, 0.0f}, rowf[2] = {1.0f, 1.0f}, eref = 1.0f;
  float es[2] = {0.0f, 0.0f}, v[2] = {0.0f, 0.0f}, xdot2[2] = {0.0f, 0.0f};
  bool direct = false;  // this head's weights in the direct form
  bool mine = true;     // this head's outputs are this kernel's (else bwd_dx_hn_kernel's)
  // The C.B^T values of t tile t0 this lane's A fragments need: rows t0 + 16 kk + 2 q4 (+1, +8,
  // +9), columns srow; 8 consecutive s per row across a quad's neighbours (32-byte sectors).
  const int cs = static_cast<int>(p.cs);  // in-chunk offsets fit 32 bits (cs <= 256)
  auto fetch_cb = [&](int t0) {
    // rows t >= K of a partial chunk are allocated but never written: masked in the weight
    const float* base = cbt + (t0 + 2 * q4) * cs + srow[0];
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)
#pragma unroll
      for (int e = 0; e < 8; ++e)
        cbr[kk][e] = __ldg(base + (16 * kk + (e & 1) + (e >= 4 ? 8 : 0)) * cs + ((e & 2) ? 8 : 0));
  };
  // Row sums over this warp's 64 columns of x . acc for rows srow[0], srow[1] (quad reduction in
  // a fixed order).
  auto row_dots = [&](const T* xt, float* out) {
    float part[2] = {0.0f, 0.0f};
#pragma unroll
    for (int j8 = 0; j8 < 8; ++j8)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const T* xr = xt + (16 * warp + g + 8 * e) * kLd16 + 8 * j8 + 2 * q4;
        part[e] = fmaf(to_float(xr[0]), acc[j8][2 * e], part[e]);
        part[e] = fmaf(to_float(xr[1]), acc[j8][2 * e + 1], part[e]);
      }
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      part[e] += __shfl_xor_sync(0xffffffffu, part[e], 1);
      part[e] += __shfl_xor_sync(0xffffffffu, part[e], 2);
      out[e] = part[e];
    }
  };

  // One call site for each helper (the loop's first kStages - 1 iterations only issue): the
  // kernel runs at two blocks of four warps per SM, too few to hide instruction-cache misses of
  // an unrolled body (measured: no_instruction was the largest stall with three copies of issue).
  for (int it = 0; it < total + kStages - 1; ++it) {
    const int i = it - (kStages - 1);  // the stage this iteration computes, if >= 0
    if (i >= 0) {
      cp_async_wait<kStages - 2>();
      __syncthreads();  // stage i visible; every thread is done with slot (i - 1) % kStages
    }
    issue(it);
    cp_async_commit();
    if (i < 0) continue;
    const int hi = i / S, j = i % S;
    const int64_t h = h0 + hi, bh = b * p.H + h, ob = bh * p.Lpad + tb;
    const unsigned char* slot = ring + (i % kStages) * kSlotBytes;
    const T* xt = xs + (hi % 2) * kTile * kLd16;
    if (j == 0) {  // a new head: its scalars (the previous head's last reads of cl / colf were
                   // before the barrier above; cum_raw / dt_raw arrived with this stage)
      const double ref = cum_raw[s_lo], last = cum_raw[p.cs - 1];
      const float ref2 = static_cast<float>(ref * fwd_mma::kLog2e);
      bool wide = false;
      for (int t = tid; t < p.cs; t += kThreadsDx) {
        const float c = static_cast<float>(cum_raw[t] * fwd_mma::kLog2e);
        const bool in = t >= s_lo32 && t < K32;
        cl[t] = c;
        colf[t] = in ? exp2_ftz(c - ref2) : 0.0f;
        // columns t: colf <= 2^kFactorSafe; rows s of this tile: rowf = 2^(ref - cum_s) too
        wide = wide || (in && !(c - ref2 <= fwd_mma::kFactorSafe<T>)) ||
               (in && t < s_lo32 + kTile && !(ref2 - c <= fwd_mma::kFactorSafe<T>));
      }
      direct = __syncthreads_or(wide);
      if (kRest) mine = (rest >> hi) & 1;
      eref = direct ? 1.0f : expf(static_cast<float>(last - ref));
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const bool in = srow[e] < K;
        const double cum_s = in ? cum_raw[srow[e]] : 0.0;
        cl_s[e] = in ? cl[srow[e]] : 0.0f;
        es[e] = in ? expf(static_cast<float>(last - cum_s)) : 0.0f;
        v[e] = in ? dt_raw[srow[e]] : 0.0f;
        rowf[e] = direct || !in ? 1.0f : exp2_ftz(ref2 - cl_s[e]);
      }
#pragma unroll
      for (int j8 = 0; j8 < 8; ++j8)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[j8][e] = 0.0f;
    }
    const int qt = j - nk;  // t tile of a W . dy' stage (< 0: a state-product stage)
    const int t0 = s_lo32 + qt * kTile;
    uint32_t wa[4][4];
    // W^T for this t tile, rounded to T. Factored (the default): W_ts / rowf_s = colf_t CB_ts with
    // rowf_s = exp(cum_{s_lo} - cum_s) applied to the accumulators at the head's end; the state
    // product enters as acc * exp(cum_last - cum_{s_lo}) so that rowf_s makes it e_s. kDirect:
    // exp(cum_t - cum_s) CB_ts per weight (exponents beyond kFactorSafe). kDiag: the mask s <= t
    // (the first t tile); t >= K is masked by colf = 0 or, directly, by the bound.
    auto build_w = [&]<bool kDirect, bool kDiag>() {
      fill_a_fragments<T>(wa, t0, q4, [&](int kk, int e2, int r, int t, float(&w2)[2]) {
#pragma unroll
        for (int u = 0; u < 2; ++u) {
          float w;
          if constexpr (!kDirect)
            w = colf[t + u] * cbr[kk][2 * e2 + u];
          else
            w = t + u < K32 ? exp2_ftz(cl[t + u] - cl_s[r]) * cbr[kk][2 * e2 + u] : 0.0f;
          w2[u] = !kDiag || srow[r] <= t + u ? w : 0.0f;
        }
      });
    };
    if (qt >= 0) build_weights(build_w, direct, qt == 0);
    // C.B^T for the next W stage (this head's next t tile, or after the last state-product stage
    // its first), in flight under this stage's products.
    if (j == nk - 1 || (qt >= 0 && qt + 1 < nt)) fetch_cb(j == nk - 1 ? s_lo32 : t0 + kTile);
    if (qt < 0) {
      // acc[s][d] += sum_n B[s][n] Gc[d][n] over n in [64 j, 64 j + 64); Gc's rows d are the
      // B operand's columns, read by ldmatrix as stored
      const T* Gt = reinterpret_cast<const T*>(slot);
      const int64_t left = (lay.bw - int64_t{j} * kTile) / 16;
      const int ksteps = left < 4 ? static_cast<int>(left) : 4;
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        if (kk >= ksteps) break;
        uint32_t a[4];
        load_a_frag<T>(a, Bs, static_cast<int>(lay.ldb), 16 * warp, j * kTile + 16 * kk, lane);
        mma_k16_bnk<T>(acc, a, Gt, kLd16, 16 * kk, lane);
      }
    } else {
      // acc[s][d] += sum_t W[t][s] dy'[t][d] over t tile qt
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        if constexpr (kZ) {
          const float* P = reinterpret_cast<const float*>(slot);
#pragma unroll
          for (int j8 = 0; j8 < 8; ++j8) {
            const float* pc = P + (16 * kk + 2 * q4) * kLdKM + 8 * j8 + g;
            cuda::mma16816<T>(acc[j8], wa[kk], cuda::pack2<T>(pc[0], pc[kLdKM]),
                              cuda::pack2<T>(pc[8 * kLdKM], pc[9 * kLdKM]));
          }
        } else {
          mma_k16_bkn<T>(acc, wa[kk], reinterpret_cast<const T*>(slot), kLd16, 16 * kk, 0, lane);
        }
      }
    }
    if (j != nk - 1 && j != S - 1) continue;
    if (j == S - 1 && !direct)  // the factored weights' row factors
#pragma unroll
      for (int j8 = 0; j8 < 8; ++j8)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[j8][e] *= rowf[e / 2];
    float rows[2];
    row_dots(xt, rows);
    if (j == nk - 1) {  // E_s needs the state product alone; then the decay to the chunk end
      xdot2[0] = rows[0], xdot2[1] = rows[1];
#pragma unroll
      for (int j8 = 0; j8 < 8; ++j8)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[j8][e] *= direct ? es[e / 2] : eref;
      continue;
    }
    // The head's epilogue: dx = v acc + D dy', and the row sums pdv, pE.
    if (!mine) continue;
    const int dcols = p.D - d0 < kTile ? static_cast<int>(p.D - d0) : kTile;
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int64_t s = srow[e];
      if (s >= K) continue;
      T* dxr = &p.dx.at(b, tb + s, h, d0);  // unit inner stride (dx_mma_fits)
#pragma unroll
      for (int j8 = 0; j8 < 8; ++j8) {
        const int dc = 8 * j8 + 2 * q4;
        if (dc >= dcols) continue;
        float out[2];
        if (p.has_d)  // the same fmaf as bwd_dx_kernel's, with the skip term added in
#pragma unroll
          for (int u = 0; u < 2; ++u) {
            const int64_t d = d0 + dc + u;
            out[u] = fmaf(v[e], acc[j8][2 * e + u], p.Dv.at(h, d) * p.dyp_at(b, tb + s, h, d));
          }
        else
#pragma unroll
          for (int u = 0; u < 2; ++u) out[u] = fmaf(v[e], acc[j8][2 * e + u], 0.0f);
        *reinterpret_cast<uint32_t*>(dxr + dc) = cuda::pack2<T>(out[0], out[1]);
      }
      if (q4 == 0) {
        const int64_t o = (blockIdx.y * p.B * p.H + bh) * p.Lpad + tb + s;
        p.pdv[o] = rows[e];
        p.pE[o] = es[e] * v[e] * xdot2[e];
      }
    }
  }
  cp_async_wait<0>();
}

// bwd_dx_hn_kernel's A operand, once per (chunk, group): C.B^T's lower 64 x 64 tiles transposed
// and rounded to T (each dx block used to convert its rows itself, ten times over at H80 / hb 8,
// in a latency-bound loop: 9% of its samples). One block per (chunk, tile pair, b * G + g).
template <class T>
__global__ void __launch_bounds__(256) bwd_cbt16_kernel(BwdC<T> p) {
  __shared__ float tile[kTile][kTile + 1];
  const int64_t npairs = causal_pairs(p.ntt), c = blockIdx.x / npairs;
  int64_t it = 0, q = blockIdx.x % npairs;  // t tile it >= s tile q
  while (q > it) q -= ++it;
  const int t0 = static_cast<int>(it) * kTile, s0 = static_cast<int>(q) * kTile;
  const int64_t tb = c * p.cs;
  const int K = static_cast<int>(p.L - tb < p.cs ? p.L - tb : p.cs), cs = static_cast<int>(p.cs);
  const int64_t base = (static_cast<int64_t>(blockIdx.y) * p.nchunks + c) * p.cs * p.cs;
  const float* src = p.cbm + base;
  for (int idx = threadIdx.x; idx < kTile * kTile; idx += 256) {
    const int r = idx / kTile, col = idx % kTile, t = t0 + r, s = s0 + col;
    tile[r][col] = t < K && t >= s ? src[t * cs + s] : 0.0f;
  }
  __syncthreads();
  T* dst = p.cbt16 + base;
  for (int idx = threadIdx.x; idx < kTile * kTile / 2; idx += 256) {
    const int r = idx / (kTile / 2), col = idx % (kTile / 2) * 2;  // row s0 + r, columns t0 + col
    *reinterpret_cast<uint32_t*>(dst + (s0 + r) * cs + t0 + col) =
        cuda::pack2<T>(tile[col][r], tile[col + 1][r]);
  }
}

namespace dx_hn {
constexpr int kWarps = 4, kThreadsHn = 32 * kWarps, kStages = 2;
constexpr int kLd16 = 72;  // 16-bit 64-wide ring tiles: ldmatrix rows 144 B apart
constexpr size_t kSlotBytes = sizeof(uint16_t) * kTile * kLd16;

struct Layout {
  int64_t bw, ldb, ldcb;                         // B tile width (N rounded to 16), pitches
  size_t cum, dt, b_tile, cb_tile, ring, total;  // byte offsets (total: the size)
};
// The head scalars are double-buffered: a head's are loaded kStages - 1 stages ahead of its first,
// which stays behind the setup of the head two before while 2 S > kStages - 1 (S >= 2 stages a
// head). Two stages keep three blocks per SM; four (two blocks) measured 0.69 against 0.56 ms.
__host__ __device__ inline Layout layout(int64_t N, int64_t cs) {
  using fwd_mma::round16;
  Layout l{};
  l.bw = fwd_mma::k16(N), l.ldb = l.bw + 8, l.ldcb = cs + 8;
  l.cum = 0;                                       // [2] the head's cum (f64), whole chunk
  l.dt = l.cum + round16(sizeof(double) * 512);    // [2] its dt, whole chunk
  l.b_tile = l.dt + round16(sizeof(float) * 512);  // B rows s, [s][n]
  l.cb_tile = l.b_tile + round16(sizeof(uint16_t) * kTile * static_cast<size_t>(l.ldb));
  l.ring = l.cb_tile + round16(sizeof(uint16_t) * kTile * static_cast<size_t>(l.ldcb));
  l.total = l.ring + kSlotBytes * kStages;
  return l;
}
}  // namespace dx_hn

inline size_t dx_hn_smem_bytes(const ssd::Problem& p) {
  return dx_hn::layout(p.state_dim, p.chunk_size).total;
}

// Same grid as bwd_dx_mma_kernel (chunk and 64-row s tile, 64 columns d, hb heads of one group);
// warp w owns rows s_lo + 16 w .. + 15. Per head: the state stages (64 columns n of Gc each), then
// the t tiles from s_lo (dyh rows); a head's scalars arrive with its first stage.
// kZ: the skip term's dy' is the f32 dy * silu(z) workspace.
// Every address is a per-thread base formed once plus per-head and per-stage offsets: formed per
// 16-byte piece, the 64-bit index products were two thirds of the kernel's instructions (ncu).
template <class T, bool kZ>
__global__ void __launch_bounds__(dx_hn::kThreadsHn, 3) bwd_dx_hn_kernel(BwdC<T> p) {
  using namespace dx_hn;
  extern __shared__ __align__(16) unsigned char dxh_smem[];
  const Layout lay = layout(p.N, p.cs);
  double* cum_buf = reinterpret_cast<double*>(dxh_smem + lay.cum);
  float* dt_buf = reinterpret_cast<float*>(dxh_smem + lay.dt);
  T* Bs = reinterpret_cast<T*>(dxh_smem + lay.b_tile);
  T* CBt = reinterpret_cast<T*>(dxh_smem + lay.cb_tile);  // [s - s_lo][t - s_lo]
  unsigned char* ring = dxh_smem + lay.ring;

  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, g = lane / 4, q4 = lane % 4;
  const DxBlock<T> blk(p);
  const int64_t c = blk.c, s_lo = blk.s_lo, d0 = blk.d0, b = blk.b, h0 = blk.h0;
  const int64_t G = blk.G, grp = blk.grp, K = blk.K, tb = blk.tb;
  int* flag = p.dx_rest + blk.flat;
  if (s_lo >= K) {  // uniform over the block
    if (tid == 0) *flag = 0;
    return;
  }
  const int ldb = static_cast<int>(lay.ldb), ldcb = static_cast<int>(lay.ldcb);
  const int nk = static_cast<int>((lay.bw + kTile - 1) / kTile);    // state stages
  const int nt = static_cast<int>((K - s_lo + kTile - 1) / kTile);  // t tiles t0 >= s_lo
  const int S = nk + nt, total = static_cast<int>(p.hb) * S;
  const int s_lo32 = static_cast<int>(s_lo), K32 = static_cast<int>(K);
  const int cs = static_cast<int>(p.cs), D32 = static_cast<int>(p.D), N32 = static_cast<int>(p.N);
  const int d032 = static_cast<int>(d0);

  // Copy pieces: this thread's rows r0 + 16 k (k < 4) of a 64-row stage, 8 columns from col8,
  // from running pointers (a head's first piece, then a stage's step).
  const int r0 = tid / 8, col8 = tid % 8 * 8;
  const int64_t row16 = 16 * p.H * p.D;  // 16 tokens of dyh
  const T* const dyh0 = p.dyh + ((b * p.L + tb + s_lo + r0) * p.H + h0) * p.D + d0 + col8;
  const bool dyh_col = d032 + col8 < D32;
  const int dyh_rows = K32 - s_lo32 - r0;  // rows r0 + t of the window that exist: t < this
  const int64_t gc_head = p.nchunks * p.D * p.N;
  const T* const gc0 =
      p.gst16 + ((b * p.H + h0) * p.nchunks + c) * p.D * p.N + (d0 + r0) * p.N + col8;
  const int gc_rows = D32 - d032 - r0;  // rows r0 + 16 k of Gc that exist: 16 k < this
  const T *dyh_at = dyh0, *gc_at = gc0;
  const double* cum_at = p.cum + (b * p.H + h0) * p.Lpad + tb;
  const float* dt_at = p.dtp + (b * p.H + h0) * p.Lpad + tb;
  int ih = 0, ij = 0;  // the next stage to issue: head, stage

  auto issue = [&](int i) {
    if (i >= total) return;
    const int hi = ih, j = ij;
    if (++ij == S) ij = 0, ++ih;
    if (j == 0) {  // the head's cum and dt (the reader of this buffer, the setup of the head
                   // two before, is behind barriers)
      if (hi > 0) cum_at += p.Lpad, dt_at += p.Lpad;
      double* cum = cum_buf + (hi % 2) * 256;
      float* dts = dt_buf + (hi % 2) * 256;
      for (int k = tid; k < cs / 2; k += kThreadsHn) cp_async16(cum + 2 * k, cum_at + 2 * k);
      for (int k = tid; k < cs / 4; k += kThreadsHn) cp_async16(dts + 4 * k, dt_at + 4 * k);
      gc_at = gc0 + hi * gc_head;
      dyh_at = dyh0 + hi * p.D;
    }
    if (i == 0)  // the B rows s, once per block; columns [N, bw) zero for the last k16 step
      for (int idx = tid; idx < kTile * (lay.bw / 8); idx += kThreadsHn) {
        const int r = idx / static_cast<int>(lay.bw / 8),
                  col = idx % static_cast<int>(lay.bw / 8) * 8;
        const bool in = s_lo + r < K && col < p.N;
        cp_async16(Bs + r * ldb + col, in ? &p.Bm.at(b, tb + s_lo + r, grp, col) : p.Bm.p,
                   in ? 16 : 0);
      }
    T* dst = reinterpret_cast<T*>(ring + (i % kStages) * kSlotBytes) + r0 * kLd16 + col8;
    if (j < nk) {  // Gc rows d0.., columns 64 j..
      const bool cin = j * kTile + col8 < N32;
      const T* src = gc_at;
#pragma unroll
      for (int k = 0; k < 4; ++k, src += 16 * N32) {
        const bool in = cin && 16 * k < gc_rows;
        cp_async16(dst + 16 * k * kLd16, in ? src : p.gst16, in ? 16 : 0);
      }
      gc_at += kTile;
    } else {                            // dyh rows t0.., columns d0..
      const int t0 = (j - nk) * kTile;  // from s_lo
      const T* src = dyh_at;
#pragma unroll
      for (int k = 0; k < 4; ++k, src += row16) {
        const bool in = dyh_col && t0 + 16 * k < dyh_rows;
        cp_async16(dst + 16 * k * kLd16, in ? src : p.dyh, in ? 16 : 0);
      }
      dyh_at += 4 * row16;
    }
  };

  // The prologue (kStages = 2: one stage) with this block's rows of C.B^T (bwd_cbt16_kernel's
  // [s][t] tiles, columns t >= s_lo) in the same copy group.
  static_assert(kStages == 2);
  {
    const T* cbt = p.cbt16 + ((b * G + grp) * p.nchunks + c) * p.cs * p.cs + s_lo32 * cs + s_lo32;
    const int pieces = nt * (kTile / 8);  // 16-byte pieces per row
    for (int idx = tid; idx < kTile * pieces; idx += kThreadsHn) {
      const int r = idx / pieces, col = idx % pieces * 8;
      cp_async16(CBt + r * ldcb + col, cbt + r * cs + col);
    }
  }
  issue(0);
  cp_async_commit();

  const int srow[2] = {s_lo32 + 16 * warp + g, s_lo32 + 16 * warp + g + 8};
  // this lane's rows of x and dx at head h0, columns d0 + 2 q4 (+ 8 j8); + hi * stride for head hi
  const T* xrow[2];
  T* dxrow[2];
#pragma unroll
  for (int e = 0; e < 2; ++e) {
    const int64_t s = srow[e] < K32 ? srow[e] : s_lo;  // rows past K are never read or written
    xrow[e] = &p.x.at(b, tb + s, h0, d0 + 2 * q4);
    dxrow[e] = &p.dx.at(b, tb + s, h0, d0 + 2 * q4);
  }
  float acc[8][4];
  uint32_t xr[2][8];  // x at this lane's accumulator positions, as T pairs
  // Loaded at the head's first stage for E_s and again at its next-to-last for the final row sums,
  // so that the registers are free during the t tiles.
  auto load_x = [&](int hi) {
#pragma unroll
    for (int e = 0; e < 2; ++e)
#pragma unroll
      for (int j8 = 0; j8 < 8; ++j8)
        xr[e][j8] =
            srow[e] < K32 && d032 + 8 * j8 + 2 * q4 < D32
                ? __ldg(reinterpret_cast<const unsigned int*>(xrow[e] + hi * p.x.s2 + 8 * j8))
                : 0u;
  };
  float es[2] = {0.0f, 0.0f}, v[2] = {0.0f, 0.0f}, xdot2[2] = {0.0f, 0.0f};
  bool skip = false;   // this head left to dx_mma
  int left_heads = 0;  // bit hi: head hi left to dx_mma
  auto row_dots = [&](float* out) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      float part = 0.0f;
#pragma unroll
      for (int j8 = 0; j8 < 8; ++j8) {
        const float2 xf = cuda::unpack2<T>(xr[e][j8]);
        part = fmaf(xf.x, acc[j8][2 * e], part);
        part = fmaf(xf.y, acc[j8][2 * e + 1], part);
      }
      part += __shfl_xor_sync(0xffffffffu, part, 1);
      part += __shfl_xor_sync(0xffffffffu, part, 2);
      out[e] = part;
    }
  };

  int hi = 0, j = -1;  // the stage being computed: head, stage
  for (int i = 0; i < total; ++i) {
    cp_async_wait<0>();
    __syncthreads();  // stage i (at i = 0 also the C.B^T rows) visible; slot (i + 1) % 2 free
    issue(i + 1);
    cp_async_commit();
    if (++j == S) j = 0, ++hi;
    if (j == 0) {  // a new head
      const double* cum = cum_buf + (hi % 2) * 256;
      const float* dts = dt_buf + (hi % 2) * 256;
      skip = __syncthreads_or(dx_hat_unsafe<T>(cum, K32, cs, tid, kThreadsHn));
      left_heads |= skip ? 1 << hi : 0;
      const double last = cum[cs - 1];  // the U_c kernel's reference for dyh
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const bool in = srow[e] < K32;
        es[e] = in ? expf(static_cast<float>(last - cum[srow[e]])) : 0.0f;
        v[e] = in ? dts[srow[e]] : 0.0f;
      }
      if (!skip) load_x(hi);
#pragma unroll
      for (int j8 = 0; j8 < 8; ++j8)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[j8][e] = 0.0f;
    }
    if (skip) continue;
    const T* slot = reinterpret_cast<const T*>(ring + (i % kStages) * kSlotBytes);
    if (j < nk) {  // acc += B_s . Gc^T over n in [64 j, 64 j + 64)
      const int left = (static_cast<int>(lay.bw) - j * kTile) / 16;
      const int ksteps = left < 4 ? left : 4;
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        if (kk >= ksteps) break;
        uint32_t a[4];
        load_a_frag<T>(a, Bs, ldb, 16 * warp, j * kTile + 16 * kk, lane);
        mma_k16_bnk<T>(acc, a, slot, kLd16, 16 * kk, lane);
      }
    } else {  // acc += CB^T . dyh over t tile qt; k steps wholly above this warp's rows skipped
      const int qt = j - nk;
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        if (qt == 0 && kk < warp) continue;
        uint32_t a[4];
        load_a_frag<T>(a, CBt, ldcb, 16 * warp, qt * kTile + 16 * kk, lane);
        mma_k16_bkn<T>(acc, a, slot, kLd16, 16 * kk, 0, lane);
      }
    }
    if (j == nk - 1) row_dots(xdot2);  // x_s . (B_s Gc^T): E_s's part
    if (j == S - 2) load_x(hi);
    if (j != S - 1) continue;
    float rows[2];
    row_dots(rows);
    const int64_t h = h0 + hi, bh = b * p.H + h;
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int s = srow[e];
      if (s >= K32) continue;
      const float f = v[e] * es[e];
      T* dxr = dxrow[e] + hi * p.dx.s2;       // unit inner stride (dx_mma_fits)
      if (!p.has_d && d032 + kTile <= D32) {  // the common case, without per-element branches
#pragma unroll
        for (int j8 = 0; j8 < 8; ++j8)
          *reinterpret_cast<uint32_t*>(dxr + 8 * j8) =
              cuda::pack2<T>(fmaf(f, acc[j8][2 * e], 0.0f), fmaf(f, acc[j8][2 * e + 1], 0.0f));
      } else {
#pragma unroll
        for (int j8 = 0; j8 < 8; ++j8) {
          const int dc = 8 * j8 + 2 * q4;
          if (d032 + dc >= D32) continue;
          float out[2];
#pragma unroll
          for (int u = 0; u < 2; ++u) {
            float skip_term = 0.0f;
            if (p.has_d) {
              const int64_t d = d0 + dc + u;
              const float dyp = kZ ? p.dyp[((b * p.L + tb + s) * p.H + h) * p.D + d]
                                   : to_float(p.dy.at(b, tb + s, h, d));
              skip_term = p.Dv.at(h, d) * dyp;
            }
            out[u] = fmaf(f, acc[j8][2 * e + u], skip_term);
          }
          *reinterpret_cast<uint32_t*>(dxr + 8 * j8) = cuda::pack2<T>(out[0], out[1]);
        }
      }
      if (q4 == 0) {
        const int64_t o = (blockIdx.y * p.B * p.H + bh) * p.Lpad + tb + s;
        p.pdv[o] = es[e] * rows[e];
        p.pE[o] = es[e] * v[e] * xdot2[e];
      }
    }
  }
  cp_async_wait<0>();
  if (tid == 0) *flag = left_heads;
}

// Per-head dB for a (64 tokens s) x (64 columns n) tile.
template <class T, bool kTC>
__device__ __forceinline__ void bwd_db_body(const BwdC<T>& p) {
  __shared__ GemmSmem<T, kTC> sm;
  __shared__ float Ms[kTile][kLdM];
  const int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;
  const int64_t c = blockIdx.x / p.ntt, s_lo = (blockIdx.x % p.ntt) * kTile;
  const int64_t n0 = blockIdx.y * int64_t{kTile};
  const int64_t bh = blockIdx.z, b = bh / p.H, h = bh % p.H, g = h / p.hpg;
  const ChunkAt ch = chunk_at(p, c, bh);
  const int64_t K = ch.K, tb = ch.t_base, ob = ch.o_base;
  if (s_lo >= K) return;
  const float* Gc = p.gst + (bh * p.nchunks + c) * p.D * p.N;
  const double last = p.cum[ob + p.cs - 1];
  auto x_sd = [&](int m, int64_t k) {
    return s_lo + m < K ? to_float(p.x.at(b, tb + s_lo + m, h, k)) : 0.0f;
  };
  // e_s (Gc^T x_s)[n]
  float acc[4][4] = {};
  gemm<true, false>(acc, sm, p.D, x_sd,
                    [&](int64_t k, int n) { return n0 + n < p.N ? Gc[k * p.N + n0 + n] : 0.0f; });
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int64_t s = s_lo + ty + 16 * i;
    const float e = s < K ? expf(static_cast<float>(last - p.cum[ob + s])) : 0.0f;
#pragma unroll
    for (int j = 0; j < 4; ++j) acc[i][j] *= e;
  }
  // + sum_{t >= s} W_ts DX_ts C_t: DX tile [s][t] first, then the product with C.
  for (int64_t t0 = s_lo; t0 < K; t0 += kTile) {
    float dxa[4][4] = {};
    gemm<true, true>(dxa, sm, p.D, x_sd, [&](int64_t k, int n) {
      return t0 + n < K ? p.dyp_at(b, tb + t0 + n, h, k) : 0.0f;
    });
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int64_t s = s_lo + ty + 16 * i, t = t0 + tx + 16 * j;
        float w = 0.0f;
        if (s <= t && t < K)
          w = expf(static_cast<float>(p.cum[ob + t] - p.cum[ob + s])) * dxa[i][j];
        Ms[ty + 16 * i][tx + 16 * j] = w;
      }
    gemm_sa<false>(acc, Ms, sm, [&](int k, int n) {
      return t0 + k < K && n0 + n < p.N ? to_float(p.Cm.at(b, tb + t0 + k, g, n0 + n)) : 0.0f;
    });
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int64_t s = s_lo + ty + 16 * i;
    if (s >= K) continue;
    const float v = p.dtp[ob + s];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t n = n0 + tx + 16 * j;
      if (n < p.N) p.pdB[((b * p.L + tb + s) * p.H + h) * p.N + n] = v * acc[i][j];
    }
  }
}
template <class T, bool kTC>
__global__ void __launch_bounds__(kThreads) bwd_db_kernel(BwdC<T> p) {
  bwd_db_body<T, kTC>(p);
}

// ---- chunked_wmma_vec's dB and dC -------------------------------------------------------------
// dC_t = sum_h [exp(cum_t) S0_h^T dy'_t + sum_{s <= t} W_ts B_s] and
// dB_s = sum_h dt_s [e_s Gc_h^T x_s + sum_{t >= s} exp(cum_t - cum_s) (dy'_t . x_s) C_t] share one
// weight matrix per group: dCB[t][s] = sum over the group's heads of
// exp(cum_t - cum_s) dt_s (dy'_t . x_s) for s <= t. bwd_dcb_vec_kernel forms it once (the per-head
// dy'.x^T products, which dB and dC each formed before, and with them the P sums dcum needs);
// the dB and dC kernels then keep only the per-head state products and multiply dCB with C and B
// once per group (3x fewer tile products than per head, at H = 80, G = 1).

// The dy' operand of head h, rows [t, t + rows), all D columns: the f32 workspace with z (SA =
// float), dy itself without (SA = T).
template <class SA, class T>
__device__ __forceinline__ TileSrc<SA> dyp_src(const BwdC<T>& p, int64_t b, int64_t t, int64_t h,
                                               int64_t rows) {
  if constexpr (std::is_same_v<SA, float>)
    return tile_src(p.dyp + ((b * p.L + t) * p.H + h) * p.D, p.H * p.D, 1, rows, p.D);
  else
    return tile_src(&p.dy.at(b, t, h, 0), p.dy.s1, p.dy.s3, rows, p.D);
}

// One block per (chunk, causal 64 x 64 tile pair (t, s), b, group), walking the group's heads in
// order; the next 64-deep stage's operands (next head, or next D slice) are fetched into registers
// while this one's product and weights run. Per head it also leaves the sums of P = W o C.B^T:
// the row partials of its s tile (prow[s tile]) and the column sums of its t tile (pcol[t tile]),
// the latter through Pc, double-buffered by head so that the next stage's barrier publishes it.
template <class T>
struct DcbSmem {
  GemmSmem<T, true> sm;
  alignas(16) float cbs[kTile][kTile];  // the (t, s) tile of C.B^T
  float Pc[2][kThreads / 16][kTile];
};
template <class T, class SA>
__device__ __forceinline__ void bwd_dcb_body(const BwdC<T>& p, DcbSmem<T>& shm) {
  GemmSmem<T, true>& sm = shm.sm;
  auto& cbs = shm.cbs;
  auto& Pc = shm.Pc;
  const int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;
  const int warp = tid / 32, r0 = (warp / 2) * 16, c0 = (warp % 2) * 32;
  const int64_t npairs = causal_pairs(p.ntt), c = blockIdx.x / npairs;
  int64_t it = 0, q = blockIdx.x % npairs;  // pair index it (it + 1) / 2 + q, q <= it
  while (q > it) q -= ++it;
  const int64_t G = p.H / p.hpg, b = blockIdx.y / G, g = blockIdx.y % G, h0 = g * p.hpg;
  const int64_t t_lo = it * kTile, s0 = q * kTile, BH = p.B * p.H;
  const ChunkAt ch = chunk_at(p, c, b * p.H + h0);
  const int64_t K = ch.K, tb = ch.t_base;
  if (t_lo >= K) return;
  float* dcbt = p.dcb + ((b * G + g) * p.nchunks + c) * p.cs * p.cs;
  cp_async_tile<kThreads>(
      cbs, p.cbm + ((b * G + g) * p.nchunks + c) * p.cs * p.cs + t_lo * p.cs + s0, p.cs, kTile);
  cp_async_commit();
  const int nks = static_cast<int>((p.D + kTile - 1) / kTile),
            njobs = static_cast<int>(p.hpg) * nks;
  auto a_of = [&](int j) { return dyp_src<SA>(p, b, tb + t_lo, h0 + j / nks, K - t_lo); };
  auto b_of = [&](int j) {
    return tile_src(&p.x.at(b, tb + s0, h0 + j / nks, 0), p.x.s1, p.x.s3, K - s0, p.D);
  };
  // This thread's chunk scalars of one head: cum at its 4 rows t and 4 columns s, dt' at s.
  double cum_t[4], cum_s[4];
  float dt_s[4];
  auto load_scalars = [&](int64_t h) {
    const int64_t ob = (b * p.H + h) * p.Lpad + tb;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      cum_t[i] = p.cum[ob + t_lo + ty + 16 * i];
      cum_s[i] = p.cum[ob + s0 + tx + 16 * i];
      dt_s[i] = p.dtp[ob + s0 + tx + 16 * i];
    }
  };
  auto column_sums = [&](int hh) {  // after a barrier that follows head hh's Pc writes
    if (tid < kTile && s0 + tid < K) {
      float v = 0.0f;
      for (int r = 0; r < kThreads / 16; ++r) v += Pc[hh & 1][r][tid];
      p.pcol[(it * BH + b * p.H + h0 + hh) * p.Lpad + tb + s0 + tid] = v;
    }
  };
  Staged<SA> ra;
  Staged<T> rb;
  fetch_stage(ra, a_of(0), 0, 0);
  fetch_stage(rb, b_of(0), 0, 0);
  load_scalars(h0);
  FragC f[2];
#pragma unroll
  for (int j = 0; j < 2; ++j) wm::fill_fragment(f[j], 0.0f);
  float dcb[4][4] = {};
  cp_async_wait<0>();  // cbs: the first stage's barrier publishes it
  for (int j = 0; j < njobs; ++j) {
    const int hh = j / nks, k0 = (j % nks) * kTile;
    commit_stage(sm.u.s.a, ra, a_of(j), 0, nullptr);
    commit_stage(sm.u.s.b, rb, b_of(j), 0, nullptr);
    if (j + 1 < njobs) {
      const int k1 = ((j + 1) % nks) * kTile;
      fetch_stage(ra, a_of(j + 1), 0, k1);
      fetch_stage(rb, b_of(j + 1), 0, k1);
    }
    __syncthreads();
    if (k0 == 0 && hh > 0) column_sums(hh - 1);
    mma_stage<true, true>(f, sm, r0, c0);
    __syncthreads();
    if (k0 + kTile < p.D) continue;
    float dxa[4][4];
    frag_to_acc(dxa, f, sm.u.f, r0, c0);
#pragma unroll
    for (int jj = 0; jj < 2; ++jj) wm::fill_fragment(f[jj], 0.0f);
    const int64_t bh = b * p.H + h0 + hh;
    float csum[4] = {};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int64_t t = t_lo + ty + 16 * i;
      float rs = 0.0f;
#pragma unroll
      for (int jj = 0; jj < 4; ++jj) {
        const int64_t s = s0 + tx + 16 * jj;
        float w = 0.0f;
        if (s <= t && t < K) {
          w = expf(static_cast<float>(cum_t[i] - cum_s[jj])) * dt_s[jj] * dxa[i][jj];
          const float pv = w * cbs[ty + 16 * i][tx + 16 * jj];
          rs += pv;
          csum[jj] += pv;
        }
        dcb[i][jj] += w;
      }
      rs = row_sum16(rs);
      if (tx == 0 && t < K) p.prow[(q * BH + bh) * p.Lpad + tb + t] = rs;
    }
#pragma unroll
    for (int jj = 0; jj < 4; ++jj) Pc[hh & 1][ty][tx + 16 * jj] = csum[jj];
    if (hh + 1 < p.hpg) load_scalars(h0 + hh + 1);
  }
  __syncthreads();
  column_sums(static_cast<int>(p.hpg) - 1);
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) dcbt[(t_lo + ty + 16 * i) * p.cs + s0 + tx + 16 * j] = dcb[i][j];
}
template <class T>
__global__ void __launch_bounds__(kThreads, 2) bwd_dcb_vec_kernel(BwdC<T> p) {
  __shared__ DcbSmem<T> shm;  // here, not in the body: one allocation for both instantiations
  if (p.has_z)
    bwd_dcb_body<T, float>(p, shm);
  else
    bwd_dcb_body<T, T>(p, shm);
}

// chunked_mma_fastpass's dCB on mma.sync, for operands it can copy by 16-byte cp.async
// (dcb_mma_fits). The same block decomposition as bwd_dcb_vec_kernel (chunk, causal tile pair
// (t, s), b, group; the group's heads in order); warp w owns rows t_lo + 16 w .. + 15 and the 64
// columns s, with DX = dy'_t . x_s of the current head and the running dCB in registers (no shared
// staging of either), the dy' and x tiles through a kStages-deep cp.async ring across heads and
// D slices, and the C.B^T tile in registers for the whole block. The weights factor per head
// through ref = cum at the s tile's last token: W_ts dt_s = rowf_t colf_s, rowf_t = exp(cum_t -
// ref), colf_s = exp(ref - cum_s) dt_s (both <= 1 below the diagonal when the head decays); a
// head whose exponents exceed kFactorSafe<T> forms exp(cum_t - cum_s) dt_s per element. Each
// head's factors are formed one head ahead into a double buffer; its P row sums leave by quad
// shuffles, its column sums through shared memory, added by 64 threads after the next barrier.
// Deterministic (fixed order, no atomics); dCB, prow and pcol equal bwd_dcb_vec_kernel's to
// rounding (other product order, factored weights).
namespace dcb_mma {
constexpr int kWarps = 4, kThreads = 32 * kWarps, kStages = 3;
constexpr int kLd16 = kTile + 8;  // 16-bit tiles: ldmatrix rows 144 B apart
constexpr int kLdDy = kTile + 8;  // f32 dy' tiles: float2 reads of 8 rows on distinct banks
constexpr int kLdP = kTile + 4;   // column partials
template <bool kZ>
constexpr size_t kSlotA = kZ ? sizeof(float) * kTile* kLdDy : sizeof(uint16_t) * kTile* kLd16;
constexpr size_t kSlotB = sizeof(uint16_t) * kTile * kLd16;
constexpr int kScalars = 5;  // per head: colf, rowf, cl at s, cl at t, dt at s (64 each)
enum Scalar : int { kColf, kRowf, kClS, kClT, kDtS };
struct Layout {
  size_t ring, slot, pc, scal, total;  // byte offsets and sizes
};
template <bool kZ>
__host__ __device__ inline Layout layout() {
  Layout l{};
  l.slot = kSlotA<kZ> + kSlotB;
  l.ring = 0;
  l.pc = l.ring + kStages * l.slot;
  l.scal = l.pc + sizeof(float) * 2 * (kWarps * 8) * kLdP;
  l.total = l.scal + sizeof(float) * 2 * kScalars * kTile;
  return l;
}
}  // namespace dcb_mma

// One head's part of dCB after its DX = dy'_t . x_s tile (acc): w = W_ts dt_s DX_ts,
// P = w CB_ts; dCB += w, P's row sums to prow (rows from t_lo, those below K) and its column sums
// to pc (this warp's 8 rows of partials a column, added by the caller after a barrier). The
// accumulator layout is mma.sync's m16n8 tiles of a warp's 16 rows, which is also wgmma's
// m64n64 layout, so bwd_dcb_mma_kernel and bwd_dcb_wg_kernel share it. One straight block per
// (factored or direct, diagonal tile or not). Factored: w = rf_t u with u = colf_s DX_ts, so the
// row sums take u CB_ts and rf_t once at the end, and dCB and the column sums one fma each.
template <bool kZeroAcc>  // zero acc for the next head (mma.sync; wgmma overwrites it instead)
__device__ __forceinline__ void dcb_head_epilogue(const float (*sc)[kTile],
                                                  float (*pc)[dcb_mma::kLdP], float (&acc)[8][4],
                                                  const float (&cbv)[8][4], float (&dcb)[8][4],
                                                  bool direct, bool diag, int t_lo, int K, int warp,
                                                  int lane, float* prow) {
  using namespace dcb_mma;
  const int g = lane / 4, q4 = lane % 4;
  const int lrow[2] = {16 * warp + g, 16 * warp + g + 8};  // within the tile
  float rs[2] = {0.0f, 0.0f};
  auto epilogue = [&]<bool kDirect, bool kDiag>() {
    float rf[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) rf[r] = kDirect ? 1.0f : sc[kRowf][lrow[r]];
#pragma unroll
    for (int j8 = 0; j8 < 8; ++j8) {
      const int sl = 8 * j8 + 2 * q4;  // local column
      const float2 cf = *reinterpret_cast<const float2*>(&sc[kColf][sl]);
      float csum[2] = {0.0f, 0.0f};
#pragma unroll
      for (int r = 0; r < 2; ++r)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float u;
          if constexpr (!kDirect)
            u = (e ? cf.y : cf.x) * acc[j8][2 * r + e];
          else
            u = t_lo + lrow[r] < K ? exp2_ftz(sc[kClT][lrow[r]] - sc[kClS][sl + e]) *
                                         sc[kDtS][sl + e] * acc[j8][2 * r + e]
                                   : 0.0f;
          if constexpr (kDiag)
            if (sl + e > lrow[r]) u = 0.0f;  // s > t
          const float pv = u * cbv[j8][2 * r + e];
          rs[r] += pv;
          csum[e] = fmaf(rf[r], pv, csum[e]);
          dcb[j8][2 * r + e] = fmaf(rf[r], u, dcb[j8][2 * r + e]);
          if constexpr (kZeroAcc) acc[j8][2 * r + e] = 0.0f;
        }
      *reinterpret_cast<float2*>(&pc[warp * 8 + g][sl]) = make_float2(csum[0], csum[1]);
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) rs[r] *= rf[r];
  };
  if (direct)
    diag ? epilogue.template operator()<true, true>() : epilogue.template operator()<true, false>();
  else
    diag ? epilogue.template operator()<false, true>()
         : epilogue.template operator()<false, false>();
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    rs[r] += __shfl_xor_sync(0xffffffffu, rs[r], 1);
    rs[r] += __shfl_xor_sync(0xffffffffu, rs[r], 2);
    if (q4 == 0 && t_lo + lrow[r] < K) prow[lrow[r]] = rs[r];
  }
}

// A dCB block (chunk, causal tile pair (t tile it, s tile q), b, group) and what both dCB
// kernels do around their products: each head's factors into scal[buf] (threads 0-63 the
// columns s, 64-127 the rows t; their inputs loaded a head earlier, so the loads' latency hides
// under a head's products instead of stalling every warp at the barrier that publishes the
// factors), the column sums of P from the warps' partials, C.B^T at the accumulator positions
// and the block's dCB store.
template <class T>
struct DcbBlock {
  int64_t c, it, q, b, grp, h0, BH, tb, cb_off;
  int t_lo, s0, K, s_ref, cs, tid, k_own, tok;
  bool diag;
  struct HeadScalars {
    double ref, cum;  // cum at s_ref, at this thread's token
    float dt;         // dt at this thread's column s (threads 0-63)
  };
  __device__ DcbBlock(const BwdC<T>& p, int thread) : tid(thread) {
    const int64_t npairs = causal_pairs(p.ntt);
    c = blockIdx.x / npairs, it = 0, q = blockIdx.x % npairs;  // pair it (it + 1) / 2 + q, q <= it
    while (q > it) q -= ++it;
    const int64_t G = p.H / p.hpg;
    b = blockIdx.y / G, grp = blockIdx.y % G, h0 = grp * p.hpg;
    t_lo = static_cast<int>(it) * kTile, s0 = static_cast<int>(q) * kTile;
    BH = p.B * p.H, tb = c * p.cs;
    K = static_cast<int>(p.L - tb < p.cs ? p.L - tb : p.cs);
    diag = it == q;
    s_ref = min(s0 + kTile, K) - 1;
    cb_off = ((b * G + grp) * p.nchunks + c) * p.cs * p.cs;
    cs = static_cast<int>(p.cs);
    k_own = tid % kTile, tok = tid < kTile ? s0 + k_own : t_lo + k_own;
  }
  __device__ HeadScalars head_scalars(const BwdC<T>& p, int64_t h) const {
    const int64_t ob = (b * p.H + h) * p.Lpad + tb;
    return {p.cum[ob + s_ref], p.cum[ob + tok], tid < kTile && tok < K ? p.dtp[ob + tok] : 0.0f};
  }
  // Returns whether this thread saw an exponent beyond kFactorSafe.
  __device__ bool factors(const HeadScalars& hs, float (*sc)[kTile]) const {
    using namespace dcb_mma;
    const float ref = static_cast<float>(hs.ref * fwd_mma::kLog2e);
    const float cl = static_cast<float>(hs.cum * fwd_mma::kLog2e);
    const bool in = tok < K;
    if (tid < kTile) {
      sc[kClS][k_own] = cl, sc[kDtS][k_own] = hs.dt;
      sc[kColf][k_own] = in ? exp2_ftz(ref - cl) * hs.dt : 0.0f;
      return in && !(ref - cl <= fwd_mma::kFactorSafe<T>);
    }
    sc[kClT][k_own] = cl;
    sc[kRowf][k_own] = in ? exp2_ftz(cl - ref) : 0.0f;
    return in && !(cl - ref <= fwd_mma::kFactorSafe<T>);
  }
  // Head hh's column sums, after a barrier that follows its partials' writes.
  __device__ void column_sums(const BwdC<T>& p, const float (*pc)[dcb_mma::kLdP], int hh) const {
    if (tid < kTile && s0 + tid < K) {
      float v = 0.0f;
      for (int r = 0; r < dcb_mma::kWarps * 8; ++r) v += pc[r][tid];
      p.pcol[(it * BH + b * p.H + h0 + hh) * p.Lpad + tb + s0 + tid] = v;
    }
  }
  // C.B^T at the accumulator positions of this thread (rows t >= K: zeros, so P does not carry
  // whatever those rows of the workspace hold).
  __device__ void load_cb(const BwdC<T>& p, int warp, int lane, float (&cbv)[8][4]) const {
    const int g = lane / 4, q4 = lane % 4;
#pragma unroll
    for (int j8 = 0; j8 < 8; ++j8)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int row = 16 * warp + g + 8 * r;
        const float2 v = t_lo + row < K
                             ? __ldg(reinterpret_cast<const float2*>(
                                   p.cbm + cb_off + (t_lo + row) * cs + s0 + 8 * j8 + 2 * q4))
                             : make_float2(0.0f, 0.0f);
        cbv[j8][2 * r] = v.x, cbv[j8][2 * r + 1] = v.y;
      }
  }
  __device__ void store_dcb(const BwdC<T>& p, int warp, int lane, const float (&dcb)[8][4]) const {
    const int g = lane / 4, q4 = lane % 4;
    float* dcbt = p.dcb + cb_off;
#pragma unroll
    for (int j8 = 0; j8 < 8; ++j8)
#pragma unroll
      for (int r = 0; r < 2; ++r)
        *reinterpret_cast<float2*>(dcbt + (t_lo + 16 * warp + g + 8 * r) * cs + s0 + 8 * j8 +
                                   2 * q4) = make_float2(dcb[j8][2 * r], dcb[j8][2 * r + 1]);
  }
};

template <class T>
bool dcb_mma_fits(const BwdC<T>& p) {
  return mma_shape_fits(p) && rows16(p.x) && (p.has_z || rows16(p.dy));
}

template <class T, bool kZ>  // kZ: dy' is the f32 dy * silu(z) workspace, else dy itself
__global__ void __launch_bounds__(dcb_mma::kThreads, 3) bwd_dcb_mma_kernel(BwdC<T> p) {
  using namespace dcb_mma;
  extern __shared__ __align__(16) unsigned char dcbm_smem[];
  const Layout lay = layout<kZ>();
  float(*Pc)[kWarps * 8][kLdP] = reinterpret_cast<float(*)[kWarps * 8][kLdP]>(dcbm_smem + lay.pc);
  float(*scal)[kScalars][kTile] = reinterpret_cast<float(*)[kScalars][kTile]>(dcbm_smem + lay.scal);

  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, g = lane / 4, q4 = lane % 4;
  const DcbBlock<T> blk(p, tid);
  const int64_t b = blk.b, h0 = blk.h0, tb = blk.tb, BH = blk.BH, q = blk.q;
  const int t_lo = blk.t_lo, s0 = blk.s0, K = blk.K;
  if (t_lo >= K) return;  // uniform over the block
  const int nks = static_cast<int>((p.D + kTile - 1) / kTile);
  const int total = static_cast<int>(p.hpg) * nks;

  // ---- producer: stage i = (head, D slice) into ring slot i % kStages
  const int cr = tid / 8, cc = tid % 8 * 8;  // 16-bit tiles: rows cr + 16 k, 8 columns from cc
  // 64 rows [B, L, H, D] of head h from token row0, D columns from d0; rows past K and columns
  // past D as zeros.
  auto copy_rows = [&](T* dst, const auto& v, int64_t h, int d0, int row0) {
    const bool in_d = d0 + cc < p.D;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const int t = row0 + cr + 16 * k;
      const bool in = in_d && t < K;
      cp_async16(dst + (cr + 16 * k) * kLd16 + cc, in ? &v.at(b, tb + t, h, d0 + cc) : v.p,
                 in ? 16 : 0);
    }
  };
  int ih = 0, ij = 0;
  auto issue = [&](int i) {
    if (i >= total) return;
    const int64_t h = h0 + ih;
    const int d0 = ij * kTile;
    unsigned char* slot = dcbm_smem + lay.ring + (i % kStages) * lay.slot;
    if constexpr (kZ) {  // dy' rows t_lo.. (f32): rows tid / 16 + 8 k, 4 columns from tid % 16
      float* dst = reinterpret_cast<float*>(slot);
      const int fr = tid / 16, fc = tid % 16 * 4;
      const bool in_d = d0 + fc < p.D;
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        const int t = t_lo + fr + 8 * k;
        const bool in = in_d && t < K;
        const float* src = p.dyp + ((b * p.L + tb + t) * p.H + h) * p.D + d0 + fc;
        cp_async16(dst + (fr + 8 * k) * kLdDy + fc, in ? src : p.dyp, in ? 16 : 0);
      }
    } else {
      copy_rows(reinterpret_cast<T*>(slot), p.dy, h, d0, t_lo);
    }
    copy_rows(reinterpret_cast<T*>(slot + kSlotA<kZ>), p.x, h, d0, s0);
    if (++ij == nks) ij = 0, ++ih;
  };

  // ---- per-thread state: rows t_lo + 16 warp + g + 8 r, columns s0 + 8 j8 + 2 q4 + u
  const int lrow[2] = {16 * warp + g, 16 * warp + g + 8};  // within the tile
  float acc[8][4] = {}, dcb[8][4] = {}, cbv[8][4];
  blk.load_cb(p, warp, lane, cbv);
  bool direct = __syncthreads_or(blk.factors(blk.head_scalars(p, h0), scal[0]));  // head 0's
  auto next = blk.head_scalars(p, p.hpg > 1 ? h0 + 1 : h0);                       // head 1's inputs
  bool direct_next = false, await_flag = false, my_flag = false;

  int hi = 0, j = 0;  // the stage being computed: head, D slice
  for (int it2 = 0; it2 < total + kStages - 1; ++it2) {
    const bool compute = it2 >= kStages - 1;
    if (compute) {
      cp_async_wait<kStages - 2>();
      const bool any = __syncthreads_or(my_flag);  // this stage visible; the refilled slot free
      if (await_flag) direct_next = any, await_flag = false;
      my_flag = false;
    }
    issue(it2);
    cp_async_commit();
    if (!compute) continue;
    const int i = it2 - (kStages - 1);
    const unsigned char* slot = dcbm_smem + lay.ring + (i % kStages) * lay.slot;
    if (j == 0) {
      if (hi > 0) {
        direct = direct_next;
        blk.column_sums(p, Pc[(hi - 1) & 1], hi - 1);
      }
      if (hi + 1 < p.hpg) {  // the next head's factors (its flag arrives at the next barrier)
        my_flag = blk.factors(next, scal[(hi + 1) & 1]);
        await_flag = true;
        if (hi + 2 < p.hpg) next = blk.head_scalars(p, h0 + hi + 2);
      }
    }
    // acc[t][s] += sum_d dy'[t][d] x[s][d] over this D slice (columns past D are zero)
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      uint32_t a[4];
      if constexpr (kZ) {
        const float* A = reinterpret_cast<const float*>(slot);
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float2 f = *reinterpret_cast<const float2*>(A + lrow[e & 1] * kLdDy + 16 * kk +
                                                            2 * q4 + (e >= 2 ? 8 : 0));
          a[e] = cuda::pack2<T>(f.x, f.y);
        }
      } else {
        load_a_frag<T>(a, reinterpret_cast<const T*>(slot), kLd16, 16 * warp, 16 * kk, lane);
      }
      // x rows s: B stored [n][k]
      mma_k16_bnk<T>(acc, a, reinterpret_cast<const T*>(slot + kSlotA<kZ>), kLd16, 16 * kk, lane);
    }
    if (j == nks - 1) {
      const int64_t bh = b * p.H + h0 + hi;
      dcb_head_epilogue<true>(scal[hi & 1], Pc[hi & 1], acc, cbv, dcb, direct, blk.diag, t_lo, K,
                              warp, lane, p.prow + (q * BH + bh) * p.Lpad + tb + t_lo);
    }
    if (++j == nks) j = 0, ++hi;
  }
  cp_async_wait<0>();
  __syncthreads();  // the last head's Pc
  const int last = static_cast<int>(p.hpg) - 1;
  blk.column_sums(p, Pc[last & 1], last);
  blk.store_dcb(p, warp, lane, dcb);
}

// The dB / dC head blocks: one block per (chunk, 64 tokens, b, block of hb heads of one group)
// covering every 64-wide N tile. The heads' state products are added in head order into per-thread
// f32 accumulators in dynamic shared memory ([N tile][4 i + j][thread]: element
// (ty + 16 i, tx + 16 j), owned by its thread, so no barriers; consecutive threads on consecutive
// words, so no bank conflicts); the group's dCB product joins the first slot's block. The workspace
// holds hpg / hb partials per group, which bwd_reduce_bc_kernel adds in slot order.
inline size_t bc_heads_smem_bytes(const ssd::Problem& p) {
  const auto ntn = static_cast<size_t>((p.state_dim + kTile - 1) / kTile);
  return sizeof(float) * ntn * kTile * kTile;
}

// Where a dB / dC head block works (chunk c, the 64-token tile from lo, b, heads h0 .. h0 + hb - 1
// of group g, partial slot) and its accumulator tiles in dynamic shared memory, zeroed.
using HeadsAcc = float (*)[16][kThreads];
struct HeadsBlock {
  int64_t c, lo, b, h0, g, slot, K, tb;
};
template <class T>
__device__ __forceinline__ HeadsBlock heads_block(const BwdC<T>& p) {
  HeadsBlock hb;
  hb.c = blockIdx.x / p.ntt, hb.lo = (blockIdx.x % p.ntt) * kTile;
  const int64_t nhb = p.H / p.hb;
  hb.b = blockIdx.z / nhb, hb.h0 = (blockIdx.z % nhb) * p.hb;
  hb.g = hb.h0 / p.hpg, hb.slot = (hb.h0 % p.hpg) / p.hb;
  const ChunkAt ch0 = chunk_at(p, hb.c, hb.b * p.H + hb.h0);
  hb.K = ch0.K, hb.tb = ch0.t_base;
  return hb;
}
template <class T>
__device__ __forceinline__ void zero_heads_acc(const BwdC<T>& p, HeadsAcc Acc) {
  for (int64_t tn = 0; tn < p.ntn; ++tn)
#pragma unroll
    for (int k = 0; k < 16; ++k) Acc[tn][k][threadIdx.x] = 0.0f;
}
// The tail of a head block: the heads' sums, plus for the first slot the group's product
// (group(acc, n0) adds it), stored as rows lo + ty + 16 i < K of the block's partial slot of out
// (pdB / pdC: [B, L, H, N], one slot per head block of a group).
template <class T, class Group>
__device__ __forceinline__ void store_heads_rows(const BwdC<T>& p, const HeadsBlock& hb,
                                                 HeadsAcc Acc, float* out, Group&& group) {
  const int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;
  for (int64_t tn = 0; tn < p.ntn; ++tn) {
    const int64_t n0 = tn * kTile;
    float acc[4][4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j) acc[i][j] = Acc[tn][4 * i + j][tid];
    if (hb.slot == 0) group(acc, n0);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int64_t r = hb.lo + ty + 16 * i;
      if (r >= hb.K) continue;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int64_t n = n0 + tx + 16 * j;
        if (n < p.N)
          out[((hb.b * p.L + hb.tb + r) * p.H + hb.g * p.hpg + hb.slot) * p.N + n] = acc[i][j];
      }
    }
  }
}

// dB rows s of the block: sum_h dt_s e_s (Gc_h^T x_s) + [first slot] sum_{t >= s} dCB_ts C_t.
template <class T>
__global__ void __launch_bounds__(kThreads, 2) bwd_db_heads_vec_kernel(BwdC<T> p) {
  __shared__ GemmSmem<T, true> sm;
  extern __shared__ __align__(32) unsigned char db_dyn[];
  static_assert(16 * kThreads == kTile * kTile);
  const auto Acc = reinterpret_cast<HeadsAcc>(db_dyn);
  const int tid = threadIdx.x, ty = tid / 16;
  const HeadsBlock hb = heads_block(p);
  const int64_t c = hb.c, s_lo = hb.lo, b = hb.b, h0 = hb.h0, g = hb.g, K = hb.K, tb = hb.tb;
  if (s_lo >= K) return;
  zero_heads_acc(p, Acc);
  for (int64_t h = h0; h < h0 + p.hb; ++h) {
    const int64_t bh = b * p.H + h, ob = chunk_at(p, c, bh).o_base;
    const float* Gc = p.gst + (bh * p.nchunks + c) * p.D * p.N;
    const double last = p.cum[ob + p.cs - 1];
    float es[4];  // dt_s e_s of this thread's rows
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int64_t s = s_lo + ty + 16 * i;
      es[i] = s < K ? p.dtp[ob + s] * expf(static_cast<float>(last - p.cum[ob + s])) : 0.0f;
    }
    const auto x_src = tile_src(&p.x.at(b, tb + s_lo, h, 0), p.x.s1, p.x.s3, K - s_lo, p.D);
    for (int64_t tn = 0; tn < p.ntn; ++tn) {
      const int64_t n0 = tn * kTile;
      float acc[4][4];
      gemm_v<true, false, false>(acc, sm, p.D, x_src, tile_src(Gc + n0, p.N, 1, p.D, p.N - n0));
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) Acc[tn][4 * i + j][tid] += es[i] * acc[i][j];
    }
  }
  const float* dcbt = p.dcb + ((b * (p.H / p.hpg) + g) * p.nchunks + c) * p.cs * p.cs;
  store_heads_rows(p, hb, Acc, p.pdB, [&](float(&acc)[4][4], int64_t n0) {
    // A = dCB stored [t][s] (rows t >= s_lo), B = C rows t
    gemm_v<false, false>(
        acc, sm, K - s_lo, tile_src(dcbt + s_lo * p.cs + s_lo, p.cs, 1, K - s_lo, K - s_lo),
        tile_src(&p.Cm.at(b, tb + s_lo, g, n0), p.Cm.s1, p.Cm.s3, K - s_lo, p.N - n0));
  });
}

// chunked_mma_fastpass's dB head blocks on mma.sync (db_mma_fits): the same blocks and partials
// as bwd_db_heads_vec_kernel (chunk, 64 tokens s, b, hb heads of one group; partial slot
// (h0 % hpg) / hb), 128 columns n per block. The heads' state products form one product over
// (head, d): sum_h sum_d (v_s e_s x_s[d])_h Gc_h[d][n], then the first slot's blocks add the
// group's sum_{t >= s} dCB_ts C_t[n]. Eight warps, warp w owning rows s_lo + 16 (w % 4) .. + 15 and
// columns n0 + 64 (w / 4) .. + 63 in registers; each 64-deep stage's operands go through
// registers one stage ahead (loaded under the products of the stage before), are scaled / rounded
// to T once and stored into one of two shared slots: x rows times their weight and the Gc rows
// (gst16: rounded by the reverse scan), then dCB (f32, [t][s], read transposed) and C rows. The
// operands round where the WMMA kernel rounds them, except x v_s e_s, which it keeps exact and
// scales in f32 after the product. Deterministic.
namespace db_mma {
constexpr int kWarps = 8, kThreads = 32 * kWarps;
constexpr int kNw = 128;           // n columns per block
constexpr int kLdDbA = kTile + 8;  // 16-bit [64][64] A tiles
constexpr int kLdDbB = kNw + 8;    // 16-bit [64][128] B tiles
constexpr size_t kSlotA = sizeof(uint16_t) * kTile * kLdDbA;
constexpr size_t kSlotB = sizeof(uint16_t) * kTile * kLdDbB;
constexpr size_t kSmem = 2 * (kSlotA + kSlotB);

// The register staging that bwd_db_mma_kernel and bwd_dc_mma_kernel share (256 threads): a stage's
// loads go to registers one stage ahead and are rounded to T on their way to shared memory. A:
// rows ar + 32 k (k < 2), 8 columns from ac, as 8 T in av[k][0] or 8 f32 in both halves. B
// (64 x 128, 16-bit): rows cr + 16 k (k < 4), 8 columns from cc.
template <class T>
struct Staging {
  int ar, ac, cr, cc;
  uint4 av[2][2];
  uint4 bv[4];
  __device__ explicit Staging(int tid)
      : ar(tid / 8), ac(tid % 8 * 8), cr(tid / 16), cc(tid % 16 * 8) {}
  // dCB rows t (f32, zero above the diagonal; rows from K on read as zero), columns from col.
  __device__ void load_dcb(const float* dcbt, int64_t cs, int t, int col, int K) {
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      const float* src = dcbt + (t + 32 * k) * cs + col;
      av[k][0] = ldg16(src, t + 32 * k < K);
      av[k][1] = ldg16(src + 4, t + 32 * k < K);
    }
  }
  // 16-bit [D][N] state rows d0 + cr + 16 k, 8 columns from n0 + cc (zeros outside): the
  // states the reverse / forward scans left rounded to T (gst16, st16).
  __device__ void load_state16(const T* S, int64_t D, int64_t N, int d0, int n0) {
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const int d = d0 + cr + 16 * k, n = n0 + cc;
      bv[k] = ldg16(S + d * N + n, d < D && n < N);
    }
  }
  // 16-bit [B, L, G, N] rows t (from row0; rows from K on read as zero) of group grp.
  template <class V>
  __device__ void load_rows(const V& v, int64_t b, int64_t tb, int64_t grp, int row0, int n0, int K,
                            int64_t N) {
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const int t = row0 + cr + 16 * k, n = n0 + cc;
      bv[k] = ldg16(&v.at(b, tb + t, grp, n), t < K && n < N);
    }
  }
  // A rows scaled by w (weighted) or not, from T or f32 registers.
  __device__ void store_a(T* A, int ld, bool weighted, bool f32, const float (&w)[2]) const {
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      float f[8];
      if (f32)
        unpack8_f32(av[k], f);
      else
        unpack8<T>(av[k][0], f);
      store8<T>(A + (ar + 32 * k) * ld + ac, f, weighted ? w[k] : 1.0f);
    }
  }
  // B rows as loaded.
  __device__ void store_b(T* B, int ld) const {
#pragma unroll
    for (int k = 0; k < 4; ++k) *reinterpret_cast<uint4*>(B + (cr + 16 * k) * ld + cc) = bv[k];
  }
};

// The two-slot ring the staged kernels run over stages 0 .. total - 1: while stage i is computed
// from slot i % 2, stage i + 1 goes from registers into the other slot (store(slot, stage); its
// last reader was stage i - 1, before the barrier that ended it) and stage i + 2 is loaded into
// registers.
template <class Load, class Store, class Compute>
__device__ __forceinline__ void run_ring(int total, Load&& load, Store&& store, Compute&& compute) {
  if (total > 0) load(0), store(0, 0);
  if (total > 1) load(1);
  __syncthreads();
  for (int i = 0; i < total; ++i) {
    compute(i, i % 2);
    if (i + 1 < total) store((i + 1) % 2, i + 1);
    if (i + 2 < total) load(i + 2);
    __syncthreads();
  }
}

// A warp's 16 x 64 accumulator tile as f32 rows (row0 + g + 8 r, those below K) of out at the
// given pitch, columns n0 .. (below N), each value plus extra(j8, e).
template <class Extra>
__device__ __forceinline__ void store_acc_rows(const float (&acc)[8][4], float* out, int64_t pitch,
                                               int row0, int K, int n0, int64_t N, int lane,
                                               Extra&& extra) {
  const int g = lane / 4, q4 = lane % 4;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int t = row0 + g + 8 * r;
    if (t >= K) continue;
#pragma unroll
    for (int j8 = 0; j8 < 8; ++j8) {
      const int n = n0 + 8 * j8 + 2 * q4;
      if (n < N)
        *reinterpret_cast<float2*>(out + t * pitch + n) = make_float2(
            acc[j8][2 * r] + extra(j8, 2 * r), acc[j8][2 * r + 1] + extra(j8, 2 * r + 1));
    }
  }
}

// Where a bwd_db / dc_mma_kernel block works: chunk c (tokens from tb, K of them), the 64-token
// tile from lo, kNw columns n from n0, heads h0 .. h0 + hb - 1 (the slot-th block of group grp),
// and the calling warp's 16 x 64 part (rows 16 wm, columns my_n0, npairs 16-column pairs in N).
template <class T>
struct GroupTile {
  int64_t c, b, h0, grp, slot, tb;
  int lo, n0, K, wm, wn, my_n0, npairs, nks, n_heads;
  const float* dcbt;  // the group's dCB rows of this chunk ([t][s], f32)
  __device__ GroupTile(const BwdC<T>& p, int warp) {
    const int bw = static_cast<int>(fwd_mma::k16(p.N));
    const int tiles_n = (bw + kNw - 1) / kNw;
    c = blockIdx.x / p.ntt;
    lo = static_cast<int>(blockIdx.x % p.ntt) * kTile;
    n0 = static_cast<int>(blockIdx.y % tiles_n) * kNw;
    const int64_t nhb = p.H / p.hb;
    b = blockIdx.z / nhb, h0 = (blockIdx.z % nhb) * p.hb;
    grp = h0 / p.hpg, slot = (h0 % p.hpg) / p.hb;
    tb = c * p.cs;
    K = static_cast<int>(p.L - tb < p.cs ? p.L - tb : p.cs);
    wm = warp % 4, wn = warp / 4;
    my_n0 = n0 + 64 * wn;
    npairs = my_n0 >= bw ? 0 : (bw - my_n0 >= 64 ? 4 : (bw - my_n0) / 16);
    nks = static_cast<int>((p.D + kTile - 1) / kTile);
    n_heads = static_cast<int>(p.hb) * nks;  // (head, D slice) stages
    dcbt = p.dcb + ((b * (p.H / p.hpg) + grp) * p.nchunks + c) * p.cs * p.cs;
  }
  // Head stage i (< n_heads): head h, its (b, h) index and chunk offset ob, D slice from d0.
  struct HeadStage {
    int64_t h, bh, ob;
    int d0;
  };
  __device__ HeadStage head_stage(int i, const BwdC<T>& p) const {
    const int64_t h = h0 + i / nks, bh = b * p.H + h;
    return {h, bh, bh * p.Lpad + tb, (i % nks) * kTile};
  }
  // The group's per-slot f32 output rows (pdB / pdC [B, L, H] with one slot per head block).
  __device__ float* slot_rows(float* out, const BwdC<T>& p) const {
    return out + ((b * p.L + tb) * p.H + grp * p.hpg + slot) * p.N;
  }
};
}  // namespace db_mma

template <class T>
bool db_mma_fits(const BwdC<T>& p) {
  return mma_shape_fits(p) && rows16(p.x) && rows16(p.Cm);
}

template <class T>
__global__ void __launch_bounds__(db_mma::kThreads, 2) bwd_db_mma_kernel(BwdC<T> p) {
  using namespace db_mma;
  extern __shared__ __align__(16) unsigned char dbm_smem[];
  T* As = reinterpret_cast<T*>(dbm_smem);               // [2][64][kLdDbA]
  T* Bs = reinterpret_cast<T*>(dbm_smem + 2 * kSlotA);  // [2][64][kLdDbB]

  const int tid = threadIdx.x, lane = tid % 32;
  const GroupTile<T> gt(p, tid / 32);
  const int64_t c = gt.c, b = gt.b, h0 = gt.h0, grp = gt.grp, tb = gt.tb;
  const int s_lo = gt.lo, n0 = gt.n0, K = gt.K, nks = gt.nks, n_heads = gt.n_heads;
  if (s_lo >= K) return;                                                  // uniform over the block
  const int n_group = gt.slot == 0 ? (K - s_lo + kTile - 1) / kTile : 0;  // t tiles t0 >= s_lo
  const int total = n_heads + n_group;

  // ---- register staging: A x v_s e_s (T) or dCB (f32); B Gc or C rows t (T). The rows' weights
  // v_s exp(cum_last - cum_s) are formed at store time from the values as loaded (formed at load
  // time they waited for those loads: 0.220 -> 0.196 ms at the large shape).
  Staging<T> r(tid);
  double w_cum[2], w_last;
  float w_dt[2];
  auto load = [&](int i) {
    if (i < n_heads) {
      const auto [h, bh, ob, d0] = gt.head_stage(i, p);
      w_last = p.cum[ob + p.cs - 1];
#pragma unroll
      for (int k = 0; k < 2; ++k) {
        const int s = s_lo + r.ar + 32 * k;
        r.av[k][0] = ldg16(&p.x.at(b, tb + s, h, d0 + r.ac), s < K && d0 + r.ac < p.D);
        w_cum[k] = s < K ? p.cum[ob + s] : 0.0, w_dt[k] = s < K ? p.dtp[ob + s] : 0.0f;
      }
      r.load_state16(p.gst16 + (bh * p.nchunks + c) * p.D * p.N, p.D, p.N, d0, n0);
    } else {
      const int t0 = s_lo + (i - n_heads) * kTile;
      r.load_dcb(gt.dcbt, p.cs, t0 + r.ar, s_lo + r.ac, K);
      r.load_rows(p.Cm, b, tb, grp, t0, n0, K, p.N);  // C rows t
    }
  };
  auto store = [&](int buf, int i) {
    const bool head = i < n_heads;
    float w[2] = {1.0f, 1.0f};
    if (head)
#pragma unroll
      for (int k = 0; k < 2; ++k) w[k] = w_dt[k] * expf(static_cast<float>(w_last - w_cum[k]));
    r.store_a(As + buf * kTile * kLdDbA, kLdDbA, head, !head, w);
    r.store_b(Bs + buf * kTile * kLdDbB, kLdDbB);  // Gc (gst16) or C
  };

  float acc[8][4] = {};
  run_ring(total, load, store, [&](int i, int buf) {
    const T* A = As + buf * kTile * kLdDbA;
    const T* B = Bs + buf * kTile * kLdDbB;
    if (i < n_heads)  // A = x v_s e_s [s][d]
      warp_mma_64<T, false>(acc, A, kLdDbA, 16 * gt.wm, B, kLdDbB, 64 * gt.wn, gt.npairs, lane);
    else  // A = dCB stored [t][s], read transposed
      warp_mma_64<T, true>(acc, A, kLdDbA, 16 * gt.wm, B, kLdDbB, 64 * gt.wn, gt.npairs, lane);
  });
  store_acc_rows(acc, gt.slot_rows(p.pdB, p), p.H * p.N, s_lo + 16 * gt.wm, K, gt.my_n0, p.N, lane,
                 [](int, int) { return 0.0f; });
}

// Per-head dC for a (64 tokens t) x (64 columns n) tile; the blocks of the first N tile also
// leave the row and column sums of P, and every block the state part of dcum for its columns.
template <class T, bool kTC>
__device__ __forceinline__ void bwd_dc_body(const BwdC<T>& p) {
  __shared__ GemmSmem<T, kTC> sm;
  __shared__ float Ms[kTile][kLdM];
  __shared__ float Pc[kThreads / 16][kTile];
  const int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;
  const int64_t c = blockIdx.x / p.ntt, it = blockIdx.x % p.ntt, t_lo = it * kTile;
  const int64_t tn = blockIdx.y, n0 = tn * kTile;
  const int64_t bh = blockIdx.z, b = bh / p.H, h = bh % p.H, g = h / p.hpg;
  const ChunkAt ch = chunk_at(p, c, bh);
  const int64_t K = ch.K, tb = ch.t_base, ob = ch.o_base;
  if (t_lo >= K) return;
  const bool sums = tn == 0;  // uniform over the block
  const float* S0 = p.st + (bh * p.nchunks + c) * p.D * p.N;
  auto dy_td = [&](int m, int64_t k) {
    return t_lo + m < K ? p.dyp_at(b, tb + t_lo + m, h, k) : 0.0f;
  };
  // exp(cum_t) (S0^T dy'_t)[n]
  float acc[4][4] = {};
  gemm<true, false>(acc, sm, p.D, dy_td,
                    [&](int64_t k, int n) { return n0 + n < p.N ? S0[k * p.N + n0 + n] : 0.0f; });
  float rsum[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int64_t t = t_lo + ty + 16 * i;
    const float e = t < K ? expf(static_cast<float>(p.cum[ob + t])) : 0.0f;
    float part = 0.0f;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t n = n0 + tx + 16 * j;
      acc[i][j] *= e;
      if (t < K && n < p.N) part = fmaf(to_float(p.Cm.at(b, tb + t, g, n)), acc[i][j], part);
    }
    part = row_sum16(part);
    if (tx == 0 && t < K) p.pst[(tn * p.B * p.H + bh) * p.Lpad + tb + t] = part;
    rsum[i] = 0.0f;
  }
  const float* cbt = p.cbm + ((b * (p.H / p.hpg) + g) * p.nchunks + c) * p.cs * p.cs;
  for (int64_t s0 = 0; s0 <= t_lo; s0 += kTile) {
    float dxa[4][4] = {};
    gemm<true, true>(dxa, sm, p.D, dy_td, [&](int64_t k, int n) {
      return s0 + n < K ? to_float(p.x.at(b, tb + s0 + n, h, k)) : 0.0f;
    });
    float csum[4] = {};
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int64_t t = t_lo + ty + 16 * i, s = s0 + tx + 16 * j;
        float w = 0.0f;
        if (s <= t && t < K) {
          w = expf(static_cast<float>(p.cum[ob + t] - p.cum[ob + s])) * p.dtp[ob + s] * dxa[i][j];
          if (sums) {
            const float pv = w * cbt[t * p.cs + s];
            rsum[i] += pv;
            csum[j] += pv;
          }
        }
        Ms[ty + 16 * i][tx + 16 * j] = w;
      }
    if (sums) {
#pragma unroll
      for (int j = 0; j < 4; ++j) Pc[ty][tx + 16 * j] = csum[j];
    }
    gemm_sa<false>(acc, Ms, sm, [&](int k, int n) {
      return s0 + k < K && n0 + n < p.N ? to_float(p.Bm.at(b, tb + s0 + k, g, n0 + n)) : 0.0f;
    });
    // gemm_sa's barriers made Pc visible; nothing writes it again before the next barrier.
    if (sums && tid < kTile && s0 + tid < K) {
      float v = 0.0f;
      for (int r = 0; r < kThreads / 16; ++r) v += Pc[r][tid];
      p.pcol[(it * p.B * p.H + bh) * p.Lpad + tb + s0 + tid] = v;
    }
    __syncthreads();  // Pc is rewritten by the next s tile
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int64_t t = t_lo + ty + 16 * i;
    if (sums) {
      const float r = row_sum16(rsum[i]);
      if (tx == 0 && t < K) p.prow[bh * p.Lpad + tb + t] = r;
    }
    if (t >= K) continue;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t n = n0 + tx + 16 * j;
      if (n < p.N) p.pdC[((b * p.L + tb + t) * p.H + h) * p.N + n] = acc[i][j];
    }
  }
}
template <class T, bool kTC>
__global__ void __launch_bounds__(kThreads) bwd_dc_kernel(BwdC<T> p) {
  bwd_dc_body<T, kTC>(p);
}

// dC rows t of the block: sum_h exp(cum_t) S0_h^T dy'_t (and per head the state part of dcum, pst,
// for its N tile) + [first slot] sum_{s <= t} dCB_ts B_s.
template <class T>
__global__ void __launch_bounds__(kThreads, 2) bwd_dc_heads_vec_kernel(BwdC<T> p) {
  __shared__ GemmSmem<T, true> sm;
  extern __shared__ __align__(32) unsigned char dc_dyn[];
  const auto Acc = reinterpret_cast<HeadsAcc>(dc_dyn);
  const int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;
  const HeadsBlock hb = heads_block(p);
  const int64_t c = hb.c, t_lo = hb.lo, b = hb.b, h0 = hb.h0, g = hb.g, K = hb.K, tb = hb.tb;
  if (t_lo >= K) return;
  zero_heads_acc(p, Acc);
  for (int64_t h = h0; h < h0 + p.hb; ++h) {
    const int64_t bh = b * p.H + h, ob = chunk_at(p, c, bh).o_base;
    const float* S0 = p.st + (bh * p.nchunks + c) * p.D * p.N;
    float et[4];  // exp(cum_t) of this thread's rows
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int64_t t = t_lo + ty + 16 * i;
      et[i] = t < K ? expf(static_cast<float>(p.cum[ob + t])) : 0.0f;
    }
    for (int64_t tn = 0; tn < p.ntn; ++tn) {
      const int64_t n0 = tn * kTile;
      float acc[4][4];
      with_dyp(p, b, tb + t_lo, h, 0, K - t_lo, p.D, [&](const auto& dys) {
        gemm_v<true, false, false>(acc, sm, p.D, dys, tile_src(S0 + n0, p.N, 1, p.D, p.N - n0));
      });
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int64_t t = t_lo + ty + 16 * i;
        float part = 0.0f;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const int64_t n = n0 + tx + 16 * j;
          acc[i][j] *= et[i];
          if (t < K && n < p.N) part = fmaf(to_float(p.Cm.at(b, tb + t, g, n)), acc[i][j], part);
          Acc[tn][4 * i + j][tid] += acc[i][j];
        }
        part = row_sum16(part);
        if (tx == 0 && t < K) p.pst[(tn * p.B * p.H + bh) * p.Lpad + tb + t] = part;
      }
    }
  }
  const float* dcbt = p.dcb + ((b * (p.H / p.hpg) + g) * p.nchunks + c) * p.cs * p.cs;
  const int64_t s_hi = t_lo + kTile < K ? t_lo + kTile : K;  // s < s_hi (dCB is 0 above t)
  store_heads_rows(p, hb, Acc, p.pdC, [&](float(&acc)[4][4], int64_t n0) {
    // A = dCB rows t, columns s; B = B rows s
    gemm_v<true, false>(acc, sm, s_hi, tile_src(dcbt + t_lo * p.cs, p.cs, 1, K - t_lo, s_hi),
                        tile_src(&p.Bm.at(b, tb, g, n0), p.Bm.s1, p.Bm.s3, s_hi, p.N - n0));
  });
}

// chunked_mma_fastpass's dC head blocks on mma.sync (dc_mma_fits): the blocks and partials of
// bwd_dc_heads_vec_kernel (chunk, 64 tokens t, b, hb heads of one group; partial slot
// (h0 % hpg) / hb), 128 columns n per block, eight warps as bwd_db_mma_kernel's. The heads' state
// products (exp(cum_t) dy'_t) . S0 run into one set of register accumulators; at each head's end
// their row dots with C_t (C held in registers) less the previous head's give that head's pst (per
// 64-column tile, one warp's columns: a difference of sums over at most hb heads); then the first
// slot's blocks add the group's sum_{s <= t} dCB_ts B_s. Operands go through registers one stage
// ahead and are rounded to T once per block (exp(cum_t) dy'_t, S0, dCB; the WMMA kernel scales by
// exp(cum_t) after its product instead). Deterministic.
namespace dc_mma {
constexpr int kWarps = 8, kThreads = 32 * kWarps;
constexpr int kNw = 128;
constexpr int kLdDcA = kTile + 8;
constexpr int kLdDcB = kNw + 8;
constexpr size_t kSlotA = sizeof(uint16_t) * kTile * kLdDcA;
constexpr size_t kSlotB = sizeof(uint16_t) * kTile * kLdDcB;
constexpr size_t kSmem = 2 * (kSlotA + kSlotB);
}  // namespace dc_mma

template <class T>
bool dc_mma_fits(const BwdC<T>& p) {
  return mma_shape_fits(p) && rows16(p.Bm) && rows16(p.Cm) && (p.has_z || rows16(p.dy));
}

template <class T, bool kZ>  // kZ: dy' is the f32 dy * silu(z) workspace, else dy itself
__global__ void __launch_bounds__(dc_mma::kThreads, 1) bwd_dc_mma_kernel(BwdC<T> p) {
  using namespace dc_mma;
  extern __shared__ __align__(16) unsigned char dcm_smem[];
  T* As = reinterpret_cast<T*>(dcm_smem);               // [2][64][kLdDcA]
  T* Bs = reinterpret_cast<T*>(dcm_smem + 2 * kSlotA);  // [2][64][kLdDcB]

  const int tid = threadIdx.x, lane = tid % 32, g = lane / 4, q4 = lane % 4;
  const db_mma::GroupTile<T> gt(p, tid / 32);
  const int64_t c = gt.c, b = gt.b, h0 = gt.h0, grp = gt.grp, tb = gt.tb, BH = p.B * p.H;
  const int t_lo = gt.lo, n0 = gt.n0, K = gt.K, nks = gt.nks, n_heads = gt.n_heads;
  if (t_lo >= K) return;                                    // uniform over the block
  const int n_group = gt.slot == 0 ? t_lo / kTile + 1 : 0;  // s tiles s0 <= t_lo
  const int total = n_heads + n_group;

  // ---- register staging: A dy e^cum (T, or f32 dy' with z) or dCB (f32); B S0 (st16) or B rows s
  db_mma::Staging<T> r(tid);
  float aw[2];  // the head stage's row weights exp(cum_t) (formed at load time: at store time,
                // as bwd_db_mma_kernel does, measured 0.405 vs 0.393 ms here)
  auto load = [&](int i) {
    if (i < n_heads) {
      const auto [h, bh, ob, d0] = gt.head_stage(i, p);
#pragma unroll
      for (int k = 0; k < 2; ++k) {
        const int t = t_lo + r.ar + 32 * k;
        const bool in = t < K && d0 + r.ac < p.D;
        if constexpr (kZ) {
          const float* src = p.dyp + ((b * p.L + tb + t) * p.H + h) * p.D + d0 + r.ac;
          r.av[k][0] = ldg16(src, in);
          r.av[k][1] = ldg16(src + 4, in);
        } else {
          r.av[k][0] = ldg16(&p.dy.at(b, tb + t, h, d0 + r.ac), in);
        }
        aw[k] = t < K ? expf(static_cast<float>(p.cum[ob + t])) : 0.0f;
      }
      r.load_state16(p.st16 + (bh * p.nchunks + c) * p.D * p.N, p.D, p.N, d0, n0);
    } else {
      const int s0 = (i - n_heads) * kTile;
      r.load_dcb(gt.dcbt, p.cs, t_lo + r.ar, s0 + r.ac, K);
      r.load_rows(p.Bm, b, tb, grp, s0, n0, K, p.N);  // B rows s
    }
  };
  auto store = [&](int buf, int i) {
    const bool head = i < n_heads;
    r.store_a(As + buf * kTile * kLdDcA, kLdDcA, head, !head || kZ, aw);
    r.store_b(Bs + buf * kTile * kLdDcB, kLdDcB);  // S0 (st16) or B
  };

  // C at this thread's accumulator positions (rows t_lo + 16 wm + g + 8 r, columns my_n0 +
  // 8 j8 + 2 q4, +1; zero outside), for the heads' pst.
  uint32_t cfrag[2][8];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int t = t_lo + 16 * gt.wm + g + 8 * r;
#pragma unroll
    for (int j8 = 0; j8 < 8; ++j8) {
      const int n = gt.my_n0 + 8 * j8 + 2 * q4;
      cfrag[r][j8] = t < K && n < p.N
                         ? __ldg(reinterpret_cast<const unsigned int*>(&p.Cm.at(b, tb + t, grp, n)))
                         : 0u;
    }
  }
  float acc[8][4] = {};
  float dot_before[2] = {0.0f, 0.0f};  // the row dots of C with acc after the previous head
  int hi = 0, j = 0;                   // the head stage being computed: head, D slice
  db_mma::run_ring(total, load, store, [&](int i, int buf) {
    warp_mma_64<T, false>(acc, As + buf * kTile * kLdDcA, kLdDcA, 16 * gt.wm,
                          Bs + buf * kTile * kLdDcB, kLdDcB, 64 * gt.wn, gt.npairs, lane);
    if (i < n_heads && j == nks - 1) {  // head hi done: its pst over this warp's 64 columns
      const int64_t bh = b * p.H + h0 + hi;
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        float dot = 0.0f;
#pragma unroll
        for (int j8 = 0; j8 < 8; ++j8) {
          const T* cv = reinterpret_cast<const T*>(&cfrag[r][j8]);
          dot = fmaf(to_float(cv[0]), acc[j8][2 * r], dot);
          dot = fmaf(to_float(cv[1]), acc[j8][2 * r + 1], dot);
        }
        dot += __shfl_xor_sync(0xffffffffu, dot, 1);
        dot += __shfl_xor_sync(0xffffffffu, dot, 2);
        const int t = t_lo + 16 * gt.wm + g + 8 * r;
        if (q4 == 0 && t < K && gt.my_n0 < p.N)
          p.pst[((gt.my_n0 / kTile) * BH + bh) * p.Lpad + tb + t] = dot - dot_before[r];
        dot_before[r] = dot;
      }
    }
    if (i < n_heads && ++j == nks) j = 0, ++hi;
  });
  db_mma::store_acc_rows(acc, gt.slot_rows(p.pdC, p), p.H * p.N, t_lo + 16 * gt.wm, K, gt.my_n0,
                         p.N, lane, [](int, int) { return 0.0f; });
}

// Per (chunk, b, h): assembles dcum, the reverse cumsum da, then ddt and the chunk's partials of
// dA, ddt_bias and dD. One thread per token of the chunk (cs <= kThreads).
template <class T>
__global__ void __launch_bounds__(kThreads) bwd_finalize_kernel(BwdC<T> p) {
  __shared__ double scan[kThreads];
  __shared__ float red[2][kThreads];
  const int tid = threadIdx.x;
  const int64_t c = blockIdx.x, bh = blockIdx.y, b = bh / p.H, h = bh % p.H;
  const ChunkAt ch = chunk_at(p, c, bh);
  const int64_t K = ch.K, tb = ch.t_base, ob = ch.o_base, BH = p.B * p.H;
  // <Gc, S0> and sum_s E_s: fixed-order block sums.
  const float* Gc = p.gst + (bh * p.nchunks + c) * p.D * p.N;
  const float* S0 = p.st + (bh * p.nchunks + c) * p.D * p.N;
  float gs = 0.0f, ek = 0.0f;
  if (p.gs16) {  // the rounded copies: half the bytes
    const int64_t at = (bh * p.nchunks + c) * p.D * p.N;
    for (int64_t e = tid; e < p.D * p.N; e += kThreads)
      gs = fmaf(to_float(p.gst16[at + e]), to_float(p.st16[at + e]), gs);
  } else {
    for (int64_t e = tid; e < p.D * p.N; e += kThreads) gs = fmaf(Gc[e], S0[e], gs);
  }
  if (tid < K)
    for (int64_t td = 0; td < p.ntd; ++td) ek += p.pE[(td * BH + bh) * p.Lpad + tb + tid];
  red[0][tid] = gs, red[1][tid] = ek;
  __syncthreads();
  for (int o = kThreads / 2; o > 0; o >>= 1) {
    if (tid < o) red[0][tid] += red[0][tid + o], red[1][tid] += red[1][tid + o];
    __syncthreads();
  }
  const float gsum = red[0][0], esum = red[1][0];
  __syncthreads();  // red is reused below
  float dvx = 0.0f;
  double dcum = 0.0;
  if (tid < K) {
    const int64_t o = tb + tid;
    float st_part = 0.0f, col = 0.0f;
    for (int64_t tn = 0; tn < p.ntn; ++tn) st_part += p.pst[(tn * BH + bh) * p.Lpad + o];
    const int64_t n_it = (K + kTile - 1) / kTile;  // row tiles that exist in this chunk
    for (int64_t it = tid / kTile; it < n_it; ++it) col += p.pcol[(it * BH + bh) * p.Lpad + o];
    for (int64_t td = 0; td < p.ntd; ++td) dvx += p.pdv[(td * BH + bh) * p.Lpad + o];
    float row = 0.0f;  // s tiles q <= t's tile, in order
    for (int64_t q = 0; q < p.prow_parts && q <= tid / kTile; ++q)
      row += p.prow[(q * BH + bh) * p.Lpad + o];
    dcum = static_cast<double>(st_part) + row - col - ek;
    if (tid == K - 1) dcum += expf(static_cast<float>(p.cum[ob + p.cs - 1])) * gsum + esum;
  }
  scan[tid] = dcum;
  __syncthreads();
  for (int off = 1; off < kThreads; off <<= 1) {  // suffix sums, Hillis-Steele: fixed order
    const double add = tid + off < kThreads ? scan[tid + off] : 0.0;
    __syncthreads();
    scan[tid] += add;
    __syncthreads();
  }
  float a_part = 0.0f, b_part = 0.0f;
  if (tid < K) {
    const float da = static_cast<float>(scan[tid]);
    const StepF sp = step_at(p, b, tb + tid, h);
    const float v = p.dtp[ob + tid];
    const float draw = (dvx + p.A.at(h) * da) * sp.dv_draw;
    p.ddt.at(b, tb + tid, h) = from_float<T>(draw);
    a_part = v * da, b_part = draw;
  }
  red[0][tid] = a_part, red[1][tid] = b_part;
  __syncthreads();
  for (int o = kThreads / 2; o > 0; o >>= 1) {
    if (tid < o) red[0][tid] += red[0][tid + o], red[1][tid] += red[1][tid + o];
    __syncthreads();
  }
  if (tid == 0) p.pdA[bh * p.nchunks + c] = red[0][0], p.pbias[bh * p.nchunks + c] = red[1][0];
  if (p.has_d)
    for (int64_t d = tid; d < p.D; d += kThreads) {
      float s = 0.0f;
      for (int64_t k = 0; k < K; ++k)
        s = fmaf(p.dyp_at(b, tb + k, h, d), to_float(p.x.at(b, tb + k, h, d)), s);
      p.pdD[(bh * p.nchunks + c) * p.D + d] = s;
    }
}

// Per head: dA, ddt_bias, dD from the per-(b, chunk) partials, in a fixed order.
template <class T>
__global__ void __launch_bounds__(kThreads) bwd_head_kernel(BwdC<T> p) {
  __shared__ float red[3][kThreads];
  const int64_t h = blockIdx.x;
  const int tid = threadIdx.x;
  const int64_t nc = p.nchunks;
  float a = 0.0f, bs = 0.0f, ds = 0.0f;
  for (int64_t i = tid; i < p.B * nc; i += kThreads) {
    const int64_t o = (i / nc * p.H + h) * nc + i % nc;
    a += p.pdA[o], bs += p.pbias[o];
  }
  if (p.has_d && !p.per_channel)
    for (int64_t i = tid; i < p.B * nc * p.D; i += kThreads) {
      const int64_t bc = i / p.D;
      ds += p.pdD[((bc / nc * p.H + h) * nc + bc % nc) * p.D + i % p.D];
    }
  red[0][tid] = a, red[1][tid] = bs, red[2][tid] = ds;
  __syncthreads();
  for (int o = kThreads / 2; o > 0; o >>= 1) {
    if (tid < o)
      for (int r = 0; r < 3; ++r) red[r][tid] += red[r][tid + o];
    __syncthreads();
  }
  if (tid == 0) {
    p.dA.at(h) = red[0][0];
    if (p.has_bias) p.dbias.at(h) = red[1][0];
    if (p.has_d && !p.per_channel) p.dD.at(h, 0) = red[2][0];
  }
  if (p.has_d && p.per_channel)
    for (int64_t d = tid; d < p.D; d += kThreads) {
      float v = 0.0f;
      for (int64_t i = 0; i < p.B * nc; ++i)
        v += p.pdD[((i / nc * p.H + h) * nc + i % nc) * p.D + d];
      p.dD.at(h, d) = v;
    }
}

// dB, dC: the partials summed over each group, in slot order (chunked_wmma / chunked_f32: one slot
// per head; chunked_wmma_vec: one per block of hb heads, each already a head-ordered sum).
template <class T>
__global__ void bwd_reduce_bc_kernel(BwdC<T> p) {
  const int64_t G = p.H / p.hpg;
  const int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (e >= p.B * p.L * G * p.N) return;
  const int64_t n = e % p.N, rest = e / p.N, grp = rest % G, bt = rest / G;
  float sb = 0.0f, sc = 0.0f;
  for (int64_t hh = 0; hh < p.bc_parts; ++hh) {  // the first bc_parts head slots of the group
    const int64_t o = (bt * p.H + grp * p.hpg + hh) * p.N + n;
    sb += p.pdB[o], sc += p.pdC[o];
  }
  const int64_t b = bt / p.L, t = bt % p.L;
  p.dBo.at(b, t, grp, n) = from_float<T>(sb);
  p.dCo.at(b, t, grp, n) = from_float<T>(sc);
}

// ---- decode
// --------------------------------------------------------------------------------------
template <class T>
struct Dec {
  int64_t B, H, D, N, hpg;
  V4<float> state;
  V3<T> y;
  V3<const T> x, z, Bm, Cm;
  V2<const T> dt;
  V1<const float> A, bias;
  V2<const float> Dv;
  bool has_d, has_z, has_bias, softplus;
  float dt_min, dt_max;
};

// Generic path: any strides, one warp per (b, h, d) row, lane n = lane + 32 j.
template <class T>
__global__ void decode_kernel(Dec<T> p) {
  const int lane = threadIdx.x % 32;
  const int64_t r = blockIdx.x * int64_t{blockDim.x / 32} + threadIdx.x / 32;
  if (r >= p.B * p.H * p.D) return;
  const int64_t d = r % p.D, bh = r / p.D, h = bh % p.H, b = bh / p.H, g = h / p.hpg;
  const float raw = to_float(p.dt.at(b, h)) + (p.has_bias ? p.bias.at(h) : 0.0f);
  const float v = process_dt(raw, p.softplus, p.dt_min, p.dt_max).v, a = expf(v * p.A.at(h));
  const float xv = to_float(p.x.at(b, h, d)), vx = v * xv;
  float part = 0.0f;
#pragma unroll
  for (int j = 0; j < kMaxLane; ++j) {
    const int64_t n = lane + 32 * j;
    if (n < p.N) {
      float& s = p.state.at(b, h, d, n);
      const float ns = fmaf(a, s, vx * to_float(p.Bm.at(b, g, n)));
      s = ns;
      part = fmaf(to_float(p.Cm.at(b, g, n)), ns, part);
    }
  }
  part = warp_sum(part);
  if (lane == 0) {
    float out = part + (p.has_d ? p.Dv.at(h, d) * xv : 0.0f);
    if (p.has_z) out *= silu(to_float(p.z.at(b, h, d)));
    p.y.at(b, h, d) = from_float<T>(out);
  }
}

// Fast path (state rows dense along N, 16-byte aligned, N % 4 == 0, D % 4 == 0): a warp updates
// kDecRows consecutive rows of one (b, h); every lane issues all its 16-byte state loads (with
// the streaming cache hint: the state is touched once) before using any, and B, C are read once
// per warp. The kernel is bound by the state's bytes.
constexpr int kDecRows = 4;
template <class T>
__global__ void decode_vec_kernel(Dec<T> p) {
  const int lane = threadIdx.x % 32;
  const int64_t r0 = (blockIdx.x * int64_t{blockDim.x / 32} + threadIdx.x / 32) * kDecRows;
  if (r0 >= p.B * p.H * p.D) return;
  const int64_t d0 = r0 % p.D, bh = r0 / p.D, h = bh % p.H, b = bh / p.H, g = h / p.hpg;
  const float raw = to_float(p.dt.at(b, h)) + (p.has_bias ? p.bias.at(h) : 0.0f);
  const float v = process_dt(raw, p.softplus, p.dt_min, p.dt_max).v, a = expf(v * p.A.at(h));
  float4 st[kDecRows][2];
  float Bv[2][4], Cv[2][4];
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    const int64_t n = 4 * lane + 128 * j;
    if (n < p.N) {
#pragma unroll
      for (int i = 0; i < kDecRows; ++i)
        st[i][j] = __ldcs(reinterpret_cast<const float4*>(&p.state.at(b, h, d0 + i, n)));
#pragma unroll
      for (int q = 0; q < 4; ++q)
        Bv[j][q] = to_float(p.Bm.at(b, g, n + q)), Cv[j][q] = to_float(p.Cm.at(b, g, n + q));
    }
  }
#pragma unroll
  for (int i = 0; i < kDecRows; ++i) {
    const int64_t d = d0 + i;
    const float xv = to_float(p.x.at(b, h, d)), vx = v * xv;
    float part = 0.0f;
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int64_t n = 4 * lane + 128 * j;
      if (n < p.N) {
        float* sv = reinterpret_cast<float*>(&st[i][j]);
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          sv[q] = fmaf(a, sv[q], vx * Bv[j][q]);
          part = fmaf(Cv[j][q], sv[q], part);
        }
        __stcs(reinterpret_cast<float4*>(&p.state.at(b, h, d, n)), st[i][j]);
      }
    }
    part = warp_sum(part);
    if (lane == 0) {
      float out = part + (p.has_d ? p.Dv.at(h, d) * xv : 0.0f);
      if (p.has_z) out *= silu(to_float(p.z.at(b, h, d)));
      p.y.at(b, h, d) = from_float<T>(out);
    }
  }
}

// ---- host side: workspace layouts (exact, in f32 elements, each region
// rounded up to 64)
// ---------
inline int64_t round64(int64_t n) {
  return (n + 63) / 64 * 64;
}

struct FwdLayout {
  int64_t dtp, cum, st, cb, st_t, total;  // element offsets
};
// tensor_cores: the WMMA path also keeps C.B^T per group and chunk
// (B*G*nchunks*cs*cs floats).
// states_t_bytes (chunked_wmma_fastpass): a copy of the states in T, that many bytes per element.
inline FwdLayout fwd_layout(const ssd::Problem& p, bool tensor_cores, size_t states_t_bytes = 0) {
  const int64_t bhl = p.batch * p.heads * p.nchunks * p.chunk_size;
  const int64_t states = p.batch * p.heads * p.nchunks * p.head_dim * p.state_dim;
  FwdLayout l;
  l.dtp = 0;
  l.cum = round64(bhl);
  l.st = l.cum + round64(2 * bhl);  // cum is f64: two f32 slots per token
  l.cb = l.st + round64(states);
  const int64_t cb =
      tensor_cores ? p.batch * p.ngroups * p.nchunks * p.chunk_size * p.chunk_size : 0;
  l.st_t = l.cb + round64(cb);
  l.total = l.st_t + round64((states * static_cast<int64_t>(states_t_bytes) + 3) / 4);
  return l;
}

struct BwdLayout {
  int64_t ckpt, pdB, pdC, pddt, pdA, pdD, draw, total;
};
inline BwdLayout bwd_layout(const ssd::Problem& p) {
  const int64_t ndg = (p.head_dim + kBwdWarps - 1) / kBwdWarps;
  const int64_t nck = (p.seqlen + kCkpt - 1) / kCkpt;
  const int64_t tok = p.batch * p.seqlen * p.heads;
  BwdLayout l;
  l.ckpt = 0;
  l.pdB = round64(p.batch * p.heads * nck * p.head_dim * p.state_dim);
  l.pdC = l.pdB + round64(ndg * tok * p.state_dim);
  l.pddt = l.pdC + round64(ndg * tok * p.state_dim);
  l.pdA = l.pddt + round64(ndg * tok);
  l.pdD = l.pdA + round64(p.seqs * p.heads * p.head_dim);
  l.draw = l.pdD + round64(p.seqs * p.heads * p.head_dim);
  l.total = l.draw + round64(tok);
  return l;
}

inline size_t bwd_smem_bytes(int64_t N) {
  return sizeof(float) * static_cast<size_t>(kBwdWarps * kCkpt * N + 2 * kBwdWarps * N + kBwdWarps);
}

constexpr int64_t kMaxGridYZ = 65535;

// Stage timing (see ssd::StageSink): off, the constructor's atomic load is the whole cost. On, an
// event before the first launch and one per mark(); the destructor waits for the last event and
// reports each stage's time. Errors of the event calls only turn the timing off: diagnostics never
// fail a launch.
class StageClock {
 public:
  StageClock(std::string_view op, std::string_view kernel, cudaStream_t st)
      : sink_(ssd::stage_sink()), op_(op), kernel_(kernel), st_(st) {
    if (sink_ == nullptr) return;
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(st, &capture) != cudaSuccess ||
        capture != cudaStreamCaptureStatusNone || !record()) {
      sink_ = nullptr;
    }
  }
  void mark(const char* stage) {
    if (sink_ == nullptr || n_ > kMax) return;
    names_[n_ - 1] = stage;
    if (!record()) sink_ = nullptr;
  }
  ~StageClock() {
    if (sink_ != nullptr && cudaEventSynchronize(ev_[n_ - 1]) == cudaSuccess) {
      for (int i = 1; i < n_; ++i) {
        float ms = 0.0f;
        if (cudaEventElapsedTime(&ms, ev_[i - 1], ev_[i]) == cudaSuccess)
          sink_->stage(op_, kernel_, names_[i - 1], ms);
      }
    }
    for (int i = 0; i < n_; ++i) cudaEventDestroy(ev_[i]);
  }
  StageClock(const StageClock&) = delete;
  StageClock& operator=(const StageClock&) = delete;

 private:
  static constexpr int kMax = 24;  // stages per launcher (the backward has 14)
  bool record() {
    if (n_ > kMax || cudaEventCreate(&ev_[n_]) != cudaSuccess) return false;
    ++n_;
    return cudaEventRecord(ev_[n_ - 1], st_) == cudaSuccess;
  }
  ssd::StageSink* sink_;
  std::string_view op_, kernel_;
  cudaStream_t st_;
  cudaEvent_t ev_[kMax + 1] = {};
  const char* names_[kMax] = {};
  int n_ = 0;
};

// ---- launches
// ------------------------------------------------------------------------------------
// The registered name of a chunked launcher instantiation (StageClock rows carry it).
template <bool kTC, bool kVec, bool kFast, bool kMma = false, bool kWalks = false>
constexpr std::string_view chunked_name() {
  if constexpr (kWalks) return "chunked_mma_walks_sm90a";
  if constexpr (kMma) return "chunked_mma_fastpass";
  if constexpr (!kTC) return kFast ? "chunked_f32_fastpass" : "chunked_f32";
  if constexpr (kVec) return kFast ? "chunked_wmma_vec_fastpass" : "chunked_wmma_vec";
  return kFast ? "chunked_wmma_fastpass" : "chunked_wmma";
}

// kVec (tensor cores only): chunked_wmma_vec, the 16-byte operand staging. kFast: the
// inter-chunk pass(es) by chunk_scan_kernel instead of state_pass_kernel / bwd_state_rev_kernel
// (the *_fastpass variants; same values bit for bit, see chunk_scan_kernel).
// The largest divisor of heads_per_group up to `most`: heads that share a block's B or C tile.
inline int64_t heads_per_block(const ssd::Problem& pr, int64_t most) {
  for (int64_t d = most; d > 1; --d)
    if (pr.heads_per_group % d == 0) return d;
  return 1;
}

// kMma (chunked_mma_fastpass, with kFast): chunk_state and chunk_out on mma.sync where
// fwd_mma_fits, else chunked_wmma_fastpass's kernels.
template <class T, bool kTensorCores, bool kVec = false, bool kFast = false, bool kMma = false>
Status forward_chunked(const LaunchContext& ctx, const ssd::Problem& pr,
                       const SsdForwardOp::Arguments& a) {
  Fwd<T> p = forward_params<T>(pr, a);
  const FwdLayout l = fwd_layout(pr, kTensorCores, kFast && kTensorCores ? sizeof(T) : 0);
  // The core guarantees kWorkspaceAlignment (256 bytes) for the f64 arrays carved out below.
  float* ws = static_cast<float*>(ctx.workspace.data);
  p.dtp = ws + l.dtp, p.cum = reinterpret_cast<double*>(ws + l.cum), p.st = ws + l.st;
  p.cb = ws + l.cb;
  if constexpr (kFast && kTensorCores) p.st_t = reinterpret_cast<T*>(ws + l.st_t);
  const cudaStream_t st = cuda::stream_of(ctx);
  const unsigned bh = static_cast<unsigned>(pr.batch * pr.heads);
  if (bh == 0) return {};
  const auto cs = static_cast<unsigned>(pr.chunk_size);
  const auto nc = static_cast<unsigned>(pr.nchunks);
  StageClock clock("ssd_forward", chunked_name<kTensorCores, kVec, kFast, kMma>(), st);
  bool mma = false;
  if constexpr (kMma) {
    // chunk_state's blocks are four times larger (all of N, eight warps): fewer heads each keeps
    // several waves of them on the large shapes.
    p.hb = heads_per_block(pr, 8), p.hb_state = heads_per_block(pr, 4);
    const int64_t optin = ctx.stream.caps().smem_per_block_optin;
    mma = fwd_mma_fits(p) &&
          static_cast<int64_t>(fwd_mma::out::layout(pr.state_dim, pr.chunk_size).total) <= optin &&
          static_cast<int64_t>(fwd_mma::state::layout(pr.state_dim, pr.chunk_size).total) <= optin;
  }
  if (nc > 0) {
    prep_kernel<T><<<dim3(nc, bh), cs, cs * sizeof(double), st>>>(p);
    BARACUDA_TRY(cuda::check_launch("ssd_forward", "prep_kernel"));
    clock.mark("prep");
    const auto tiles = static_cast<unsigned>(cuda::ceil_div(pr.head_dim, kTile) *
                                             cuda::ceil_div(pr.state_dim, kTile));
    if constexpr (kMma) {
      if (mma)
        BARACUDA_TRY(
            (launch_outer_mma<T, T, true>(outer_args_state(p), pr.batch, st, "ssd_forward")));
      else
        chunk_state_tc_vec_kernel<T><<<dim3(tiles, nc, bh), kTcThreads, 0, st>>>(p);
    } else if constexpr (kTensorCores)
      // The _vec chunk_state (bitwise equal) is faster on the H100; fastpass takes it too.
      (kVec || kFast ? chunk_state_tc_vec_kernel<T>
                     : chunk_state_tc_kernel<T>)<<<dim3(tiles, nc, bh), kTcThreads, 0, st>>>(p);
    else
      chunk_state_kernel<T><<<dim3(tiles, nc, bh), kThreads, 0, st>>>(p);
    BARACUDA_TRY(cuda::check_launch("ssd_forward", "chunk_state_kernel"));
    clock.mark(mma ? "chunk_state_mma" : "chunk_state");
  }
  if constexpr (kFast) {
    ChunkScan sa = chunk_scan_args(p, p.st);
    sa.in = p.init, sa.has_in = p.has_init, sa.out = p.fin, sa.has_out = p.has_fin;
    if constexpr (kTensorCores) {
      sa.st_t = p.st_t;
      BARACUDA_TRY((launch_chunk_scan<false, T>(sa, st, "ssd_forward")));
    } else {
      BARACUDA_TRY(launch_chunk_scan<false>(sa, st, "ssd_forward"));
    }
  } else {
    const auto dn = static_cast<unsigned>(cuda::ceil_div(pr.head_dim * pr.state_dim, 256));
    state_pass_kernel<T><<<dim3(dn, bh), 256, 0, st>>>(p);
    BARACUDA_TRY(cuda::check_launch("ssd_forward", "state_pass_kernel"));
  }
  clock.mark("state_pass");
  if (nc > 0) {
    const auto tt = static_cast<unsigned>(nc * (pr.chunk_size / kTile));
    const auto td = static_cast<unsigned>(cuda::ceil_div(pr.head_dim, kTile));
    if constexpr (kTensorCores) {
      const int64_t tiles_t = pr.chunk_size / kTile;
      (kVec ? cb_tc_vec_kernel<T>
            : cb_tc_kernel<T>)<<<dim3(static_cast<unsigned>(nc * tiles_t * tiles_t),
                                      static_cast<unsigned>(pr.batch * pr.ngroups)),
                                 kTcThreads, 0, st>>>(p);
      BARACUDA_TRY(cuda::check_launch("ssd_forward", "cb_tc_kernel"));
      clock.mark("cb");
      if constexpr (kMma) {
        if (mma) BARACUDA_TRY(launch_chunk_out_mma(p, pr, st));
      }
      if (!mma)
        (kVec    ? chunk_out_tc_vec_kernel<T>
         : kFast ? chunk_out_tc_kernel<T, true>
                 : chunk_out_tc_kernel<T, false>)<<<dim3(tt, td, bh), kTcThreads, 0, st>>>(p);
    } else
      chunk_out_kernel<T><<<dim3(tt, td, bh), kThreads, 0, st>>>(p);
    BARACUDA_TRY(cuda::check_launch("ssd_forward", "chunk_out_kernel"));
    clock.mark(mma ? "chunk_out_mma" : "chunk_out");
  }
  return {};
}

template <class T>
Status forward_recurrent(const LaunchContext& ctx, const ssd::Problem& pr,
                         const SsdForwardOp::Arguments& a) {
  Fwd<T> p = forward_params<T>(pr, a);
  if (pr.seqs == 0 || pr.heads == 0) return {};
  constexpr int kWarps = 4;
  const dim3 grid(static_cast<unsigned>(cuda::ceil_div(pr.head_dim, kWarps)),
                  static_cast<unsigned>(pr.heads), static_cast<unsigned>(pr.seqs));
  recurrent_fwd_kernel<T><<<grid, kWarps * 32, 0, cuda::stream_of(ctx)>>>(p);
  return cuda::check_launch("ssd_forward", "recurrent_fwd_kernel");
}

template <class T>
Status backward_recurrent(const LaunchContext& ctx, const ssd::Problem& pr,
                          const SsdBackwardOp::Arguments& a) {
  Bwd<T> p;
  static_cast<Common<T>&>(p) = common_of<T>(pr, a);
  p.dy = v4<const T>(a.dy);
  p.has_dfin = pr.has_final_states;
  p.dfin = pr.has_final_states ? v4<const float>(a.d_final_states) : V4<const float>{};
  p.dx = v4<T>(a.dx), p.dBo = v4<T>(a.dB), p.dCo = v4<T>(a.dC), p.ddt = v3<T>(a.ddt);
  p.dz = pr.has_z ? v4<T>(a.dz) : V4<T>{};
  p.dA = v1<float>(a.dA);
  p.dbias = pr.has_dt_bias ? v1<float>(a.ddt_bias) : V1<float>{};
  p.dD = dskip_view<float>(a.dD, pr.d_skip);
  p.dinit = pr.has_initial_states ? v4<float>(a.d_initial_states) : V4<float>{};
  p.per_channel = pr.d_skip == ssd::DSkip::per_channel;
  p.ndg = cuda::ceil_div(pr.head_dim, kBwdWarps);
  p.nck = cuda::ceil_div(pr.seqlen, kCkpt);
  const BwdLayout l = bwd_layout(pr);
  float* ws = static_cast<float*>(ctx.workspace.data);
  p.ckpt = ws + l.ckpt, p.pdB = ws + l.pdB, p.pdC = ws + l.pdC, p.pddt = ws + l.pddt;
  p.pdA = ws + l.pdA, p.pdD = ws + l.pdD, p.draw = ws + l.draw;
  const cudaStream_t st = cuda::stream_of(ctx);
  if (pr.heads == 0) return {};
  if (pr.varlen()) {
    // Device cu_seqlens is not validated: tokens outside every sequence must
    // still read zeros.
    const auto bytes = static_cast<size_t>(l.total) * sizeof(float);
    BARACUDA_TRY(cuda::check("ssd_backward", "cudaMemsetAsync", cudaMemsetAsync(ws, 0, bytes, st)));
  }
  if (pr.seqs > 0) {
    const dim3 grid(static_cast<unsigned>(p.ndg), static_cast<unsigned>(pr.heads),
                    static_cast<unsigned>(pr.seqs));
    BARACUDA_TRY(cuda::launch_with_smem("ssd_backward", "recurrent_bwd_kernel",
                                        recurrent_bwd_kernel<T>, grid, kBwdWarps * 32,
                                        bwd_smem_bytes(pr.state_dim), st, p));
  }
  const int64_t tokens = pr.batch * pr.seqlen;
  if (tokens > 0) {
    const int64_t bc = tokens * pr.ngroups * pr.state_dim;
    reduce_bc_kernel<T><<<static_cast<unsigned>(cuda::ceil_div(bc, 256)), 256, 0, st>>>(p);
    BARACUDA_TRY(cuda::check_launch("ssd_backward", "reduce_bc_kernel"));
    reduce_ddt_kernel<T>
        <<<static_cast<unsigned>(cuda::ceil_div(tokens * pr.heads, 256)), 256, 0, st>>>(p);
    BARACUDA_TRY(cuda::check_launch("ssd_backward", "reduce_ddt_kernel"));
  }
  reduce_head_kernel<T><<<static_cast<unsigned>(pr.heads), 256, 0, st>>>(p);
  return cuda::check_launch("ssd_backward", "reduce_head_kernel");
}

// Chunked backward workspace (f32 elements, every region rounded up to 64): the forward's dtp,
// cum (f64) and chunk states, then the regions of BwdC in declaration order.
struct BwdcLayout {
  int64_t cbm, gst, dyp, pdB, pdC, pdv, pE, pst, prow, pcol, pdA, pbias, pdD, dcb, gst16, st16;
  int64_t dyh, dx_rest, cbt16;  // 16-bit data: bwd_dx_hn_kernel's operands and its blocks' flags
  int64_t total;
};
inline BwdcLayout bwdc_layout(const ssd::Problem& p) {
  const int64_t bh = p.batch * p.heads, lpad = p.nchunks * p.chunk_size;
  const int64_t ntd = (p.head_dim + kTile - 1) / kTile, ntn = (p.state_dim + kTile - 1) / kTile;
  const int64_t ntt = p.chunk_size / kTile;
  const int64_t tokens = p.batch * p.seqlen * p.heads;
  BwdcLayout l;
  l.cbm = fwd_layout(p, false).total;
  l.gst = l.cbm + round64(p.batch * p.ngroups * p.nchunks * p.chunk_size * p.chunk_size);
  l.dyp = l.gst + round64(bh * p.nchunks * p.head_dim * p.state_dim);
  l.pdB = l.dyp + round64(p.has_z ? tokens * p.head_dim : 0);
  l.pdC = l.pdB + round64(tokens * p.state_dim);
  l.pdv = l.pdC + round64(tokens * p.state_dim);
  l.pE = l.pdv + round64(ntd * bh * lpad);
  l.pst = l.pE + round64(ntd * bh * lpad);
  l.prow = l.pst + round64(ntn * bh * lpad);
  l.pcol = l.prow + round64(ntt * bh * lpad);
  l.pdA = l.pcol + round64(ntt * bh * lpad);
  l.pbias = l.pdA + round64(bh * p.nchunks);
  l.pdD = l.pbias + round64(bh * p.nchunks);
  l.dcb = l.pdD + round64(bh * p.nchunks * p.head_dim);
  l.gst16 = l.dcb + round64(p.batch * p.ngroups * p.nchunks * p.chunk_size * p.chunk_size);
  const bool bits16 = p.dtype == DType::bf16 || p.dtype == DType::f16;
  const int64_t states16 =
      round64(bits16 ? (bh * p.nchunks * p.head_dim * p.state_dim + 1) / 2 : 0);
  l.st16 = l.gst16 + states16;
  l.dyh = l.st16 + states16;
  l.dx_rest = l.dyh + round64(bits16 ? (tokens * p.head_dim + 1) / 2 : 0);
  // one flag per dx block at most (hb >= 1 heads a block)
  l.cbt16 = l.dx_rest + round64(bits16 ? p.nchunks * ntt * ntd * bh : 0);
  l.total =
      l.cbt16 +
      round64(bits16 ? (p.batch * p.ngroups * p.nchunks * p.chunk_size * p.chunk_size + 1) / 2 : 0);
  return l;
}

// The walks of chunked_mma_walks_sm90a (backward_walks.cuh, included below).
template <class T, bool kRev>
bool walk_views_ok(const BwdC<T>& p, const SsdBackwardOp::Arguments& a);
template <class T, bool kRev>
Status launch_state_walk(const BwdC<T>& p, const SsdBackwardOp::Arguments& a, cudaStream_t st);
// Its dx on wgmma, two heads a product (backward_dx_wgmma.cuh).
template <class T>
bool dx_wg_ok(const BwdC<T>& p, const SsdBackwardOp::Arguments& a);
template <class T>
Status launch_dx_wg(const BwdC<T>& p, const SsdBackwardOp::Arguments& a, dim3 grid,
                    cudaStream_t st);
// Its dCB on wgmma (backward_dcb_wgmma.cuh).
template <class T>
bool dcb_wg_ok(const BwdC<T>& p, const SsdBackwardOp::Arguments& a);
template <class T>
Status launch_dcb_wg(const BwdC<T>& p, const SsdBackwardOp::Arguments& a, dim3 grid,
                     cudaStream_t st);
// Its dB (kDB) and dC on wgmma (backward_bc_wgmma.cuh).
template <class T, bool kDB>
bool bc_wg_ok(const BwdC<T>& p, const SsdBackwardOp::Arguments& a);
template <class T, bool kDB>
Status launch_bc_wg(const BwdC<T>& p, const SsdBackwardOp::Arguments& a, dim3 grid,
                    cudaStream_t st);

// kVec (tensor cores only): chunked_wmma_vec, the 16-byte operand staging. kFast: both
// inter-chunk passes (the states' recompute and the reverse adjoint scan) by chunk_scan_kernel.
// kMma (chunked_mma_fastpass, with kVec and kFast): the states' recompute and U_c
// (chunk_outer_mma_kernel), dCB, dB and dC (bwd_dcb / db / dc_mma_kernel) on mma.sync where their
// operands allow 16-byte copies. kWalks (chunked_mma_walks_sm90a, with kMma): the states' recompute
// with its scan, and U_c with the adjoint scan, as walks on wgmma where the views allow tensor
// maps (and, for the adjoint, without z); the kernels above elsewhere.
template <class T, bool kTC, bool kVec = false, bool kFast = false, bool kMma = false,
          bool kWalks = false>
Status backward_chunked(const LaunchContext& ctx, const ssd::Problem& pr,
                        const SsdBackwardOp::Arguments& a) {
  BwdC<T> p;
  static_cast<Common<T>&>(p) = common_of<T>(pr, a);
  p.y = V4<T>{}, p.fin = V4<float>{}, p.has_fin = false;  // the forward's outputs are not needed
  p.dy = v4<const T>(a.dy);
  p.has_dfin = pr.has_final_states;
  p.dfin = pr.has_final_states ? v4<const float>(a.d_final_states) : V4<const float>{};
  p.dx = v4<T>(a.dx), p.dBo = v4<T>(a.dB), p.dCo = v4<T>(a.dC), p.ddt = v3<T>(a.ddt);
  p.dz = pr.has_z ? v4<T>(a.dz) : V4<T>{};
  p.dA = v1<float>(a.dA);
  p.dbias = pr.has_dt_bias ? v1<float>(a.ddt_bias) : V1<float>{};
  p.dD = dskip_view<float>(a.dD, pr.d_skip);
  p.dinit = pr.has_initial_states ? v4<float>(a.d_initial_states) : V4<float>{};
  p.per_channel = pr.d_skip == ssd::DSkip::per_channel;
  p.ntd = cuda::ceil_div(pr.head_dim, kTile), p.ntn = cuda::ceil_div(pr.state_dim, kTile);
  p.ntt = pr.chunk_size / kTile;
  // chunked_wmma_vec adds the dB/dC rows of hb heads (the largest divisor of hpg up to 8) inside
  // its blocks; the other variants leave one partial per head.
  p.hb = 1;
  if constexpr (kVec)
    for (int64_t d = 8; d >= 1; --d)
      if (pr.heads_per_group % d == 0) {
        p.hb = d;
        break;
      }
  p.bc_parts = pr.heads_per_group / p.hb;
  const FwdLayout fl = fwd_layout(pr, false);
  const BwdcLayout l = bwdc_layout(pr);
  float* ws = static_cast<float*>(ctx.workspace.data);
  p.dtp = ws + fl.dtp, p.cum = reinterpret_cast<double*>(ws + fl.cum), p.st = ws + fl.st;
  p.cb = nullptr;
  p.cbm = ws + l.cbm, p.gst = ws + l.gst, p.dyp = ws + l.dyp, p.pdB = ws + l.pdB;
  p.pdC = ws + l.pdC, p.pdv = ws + l.pdv, p.pE = ws + l.pE, p.pst = ws + l.pst;
  p.prow = ws + l.prow, p.pcol = ws + l.pcol, p.pdA = ws + l.pdA, p.pbias = ws + l.pbias;
  p.pdD = ws + l.pdD, p.dcb = ws + l.dcb;
  p.gst16 = sizeof(T) == 2 ? reinterpret_cast<T*>(ws + l.gst16) : nullptr;
  p.st16 = sizeof(T) == 2 && kFast ? reinterpret_cast<T*>(ws + l.st16) : nullptr;
  p.prow_parts = kVec ? p.ntt : 1;
  const cudaStream_t st = cuda::stream_of(ctx);
  constexpr std::string_view op = "ssd_backward";
  if (pr.heads == 0) return {};
  StageClock clock(op, chunked_name<kTC, kVec, kFast, kMma, kWalks>(), st);
  const int64_t bh64 = pr.batch * pr.heads;
  bool state_mma = false, ustate_mma = false, db_on_mma = false, dc_on_mma = false;
  bool db_on_wg = false, dc_on_wg = false;
  bool state_walk = false, adjoint_walk = false;
  // dx on mma.sync where every operand it copies is 16-byte aligned (the WMMA kernel elsewhere)
  const int64_t optin = ctx.stream.caps().smem_per_block_optin;
  bool dx_on_mma = false;
  if constexpr (kVec)
    dx_on_mma = dx_mma_fits(p) && static_cast<int64_t>(dx_mma_smem_bytes(pr)) <= optin;
  if constexpr (kWalks) {
    static_assert(kMma && sizeof(T) == 2);
    state_walk = walk_views_ok<T, false>(p, a);
    adjoint_walk = walk_views_ok<T, true>(p, a);
  }
  if constexpr (kMma) {
    // dC on mma.sync where both warp halves of its 128 columns hold data: at N = 64 (B8 L2048 H32)
    // it measured 0.202 ms against the WMMA head blocks' 0.178 (one block of eight warps per SM,
    // four of them idle); at N = 128 (B4 L4096 H80) 0.548 against 0.750.
    dc_on_mma = dc_mma_fits(p) && fwd_mma::k16(pr.state_dim) > 64 &&
                static_cast<int64_t>(dc_mma::kSmem) <= optin;
    db_on_mma = db_mma_fits(p) && static_cast<int64_t>(db_mma::kSmem) <= optin;
    if constexpr (kWalks) db_on_wg = bc_wg_ok<T, true>(p, a), dc_on_wg = bc_wg_ok<T, false>(p, a);
    p.hb_state = heads_per_block(pr, 4);
    const bool smem_ok =
        static_cast<int64_t>(fwd_mma::state::layout(pr.state_dim, pr.chunk_size).total) <= optin;
    state_mma = smem_ok && state_mma_fits(p);
    ustate_mma = smem_ok && ustate_mma_fits(p);
    // bwd_dx_hn_kernel where dx runs on mma.sync and U_c's kernel (or the adjoint walk) can leave
    // it its operand dyh (decided here: they write dyh only when p.dyh is set)
    if constexpr (sizeof(T) == 2)
      if ((ustate_mma || adjoint_walk) && dx_on_mma &&
          static_cast<int64_t>(dx_hn_smem_bytes(pr)) <= optin) {
        p.dyh = reinterpret_cast<T*>(ws + l.dyh);
        p.dx_rest = reinterpret_cast<int*>(ws + l.dx_rest);
        p.cbt16 = reinterpret_cast<T*>(ws + l.cbt16);
      }
  }
  if constexpr (kWalks) {
    // The finalize's <Gc, S0> from the 16-bit copies (half the bytes); the f32 states are then
    // read only by the gate (st: the pre-gate y again, with z) and the chunk-parallel dC (st) and
    // dB / dx (gst) kernels, where those run.
    p.gs16 = true;
    p.walk_st32 = pr.has_z || !(dc_on_mma || dc_on_wg);
    p.walk_gst32 = !((db_on_mma || db_on_wg) && dx_on_mma);
  }
  const auto bh = static_cast<unsigned>(bh64);
  const auto nc = static_cast<unsigned>(pr.nchunks);
  const auto cs = static_cast<unsigned>(pr.chunk_size);
  const auto ntd = static_cast<unsigned>(p.ntd), ntn = static_cast<unsigned>(p.ntn);
  const auto ntt = static_cast<unsigned>(p.ntt);
  const Fwd<T>& fwd = p;
  if (bh64 > 0 && nc > 0) {
    // The forward's chunk-local quantities and the states entering each chunk, recomputed.
    prep_kernel<T><<<dim3(nc, bh), cs, cs * sizeof(double), st>>>(fwd);
    BARACUDA_TRY(cuda::check_launch(op, "prep_kernel"));
    clock.mark("prep");
    if (state_walk) {
      BARACUDA_TRY((launch_state_walk<T, false>(p, a, st)));
      clock.mark("state_walk");
    } else {
      if constexpr (kMma) {
        if (state_mma)
          BARACUDA_TRY((launch_outer_mma<T, T, true>(outer_args_state(fwd), pr.batch, st, op)));
        else
          chunk_state_tc_vec_kernel<T><<<dim3(ntd * ntn, nc, bh), kTcThreads, 0, st>>>(fwd);
      } else if constexpr (kTC)
        (kVec ? chunk_state_tc_vec_kernel<T>
              : chunk_state_tc_kernel<T>)<<<dim3(ntd * ntn, nc, bh), kTcThreads, 0, st>>>(fwd);
      else
        chunk_state_kernel<T><<<dim3(ntd * ntn, nc, bh), kThreads, 0, st>>>(fwd);
      BARACUDA_TRY(cuda::check_launch(op, "chunk_state_kernel"));
      clock.mark(state_mma ? "chunk_state_mma" : "chunk_state");
      if constexpr (kFast) {
        ChunkScan sa = chunk_scan_args(fwd, p.st);
        sa.in = p.init, sa.has_in = p.has_init;  // no final_states here (p.has_fin is false)
        if constexpr (sizeof(T) == 2) {
          sa.st_copy = p.st16;
          BARACUDA_TRY((launch_chunk_scan<false, float, T>(sa, st, op)));
        } else {
          BARACUDA_TRY(launch_chunk_scan<false>(sa, st, op));
        }
      } else {
        state_pass_kernel<T>
            <<<dim3(static_cast<unsigned>(cuda::ceil_div(pr.head_dim * pr.state_dim, 256)), bh),
               256, 0, st>>>(fwd);
        BARACUDA_TRY(cuda::check_launch(op, "state_pass_kernel"));
      }
      clock.mark("state_pass");
    }
    if constexpr (kVec)
      bwd_cb_vec_kernel<T>
          <<<dim3(nc * ntt * ntt, static_cast<unsigned>(pr.batch * pr.ngroups)), kThreads, 0, st>>>(
              p);
    else
      bwd_cb_kernel<T, kTC>
          <<<dim3(nc * ntt * ntt, static_cast<unsigned>(pr.batch * pr.ngroups)), kThreads, 0, st>>>(
              p);
    BARACUDA_TRY(cuda::check_launch(op, "bwd_cb_kernel"));
    clock.mark("cb");
    if (pr.has_z) {
      if constexpr (kVec)
        bwd_gate_vec_kernel<T><<<dim3(nc * ntt, ntd, bh), kThreads, 0, st>>>(p);
      else
        bwd_gate_kernel<T, kTC><<<dim3(nc * ntt, ntd, bh), kThreads, 0, st>>>(p);
      BARACUDA_TRY(cuda::check_launch(op, "bwd_gate_kernel"));
      clock.mark("gate");
    }
    if (!adjoint_walk) {  // U_c (the adjoint walk forms it itself)
      bool ustate_done = false;
      if constexpr (kMma) {
        if (ustate_mma) {
          if (p.has_z)
            BARACUDA_TRY((launch_outer_mma<T, float, false>(outer_args_ustate<T, float>(p),
                                                            pr.batch, st, op)));
          else
            BARACUDA_TRY(
                (launch_outer_mma<T, T, false>(outer_args_ustate<T, T>(p), pr.batch, st, op)));
          ustate_done = true;
        }
      }
      if (!ustate_done) {
        if constexpr (kVec)
          bwd_ustate_vec_kernel<T><<<dim3(ntd * ntn, nc, bh), kThreads, 0, st>>>(p);
        else
          bwd_ustate_kernel<T, kTC><<<dim3(ntd * ntn, nc, bh), kThreads, 0, st>>>(p);
      }
      BARACUDA_TRY(cuda::check_launch(op, "bwd_ustate_kernel"));
      clock.mark(ustate_done ? "ustate_mma" : "ustate");
    }
  }
  if (adjoint_walk) {  // (the walks take L > 0 only)
    BARACUDA_TRY((launch_state_walk<T, true>(p, a, st)));
    clock.mark("adjoint_walk");
  } else if (bh64 > 0) {  // with L = 0 this is d_initial_states = d_final_states
    if constexpr (kFast) {
      ChunkScan sa = chunk_scan_args<T>(p, p.gst);
      sa.in = p.dfin, sa.has_in = p.has_dfin, sa.out = p.dinit, sa.has_out = p.has_init;
      if constexpr (sizeof(T) == 2) {
        sa.st_copy = p.gst16;
        BARACUDA_TRY((launch_chunk_scan<true, float, T>(sa, st, op)));
      } else {
        BARACUDA_TRY(launch_chunk_scan<true>(sa, st, op));
      }
    } else {
      bwd_state_rev_kernel<T>
          <<<dim3(static_cast<unsigned>(cuda::ceil_div(pr.head_dim * pr.state_dim, 256)), bh), 256,
             0, st>>>(p);
      BARACUDA_TRY(cuda::check_launch(op, "bwd_state_rev_kernel"));
    }
    clock.mark("state_rev");
  }
  if (bh64 > 0 && nc > 0) {
    // The head-block kernels' grids (chunk and token tile, N tiles of `tiles_n`, head blocks).
    auto heads_grid = [&](int64_t tiles_n) {
      return dim3(static_cast<unsigned>(nc * ntt), static_cast<unsigned>(tiles_n),
                  static_cast<unsigned>(bh64 / p.hb));
    };
    const int64_t mma_tiles_n = cuda::ceil_div(fwd_mma::k16(pr.state_dim), int64_t{db_mma::kNw});
    static_assert(db_mma::kNw == dc_mma::kNw);
    if constexpr (kVec) {
      const dim3 grid(nc * ntt, ntd, static_cast<unsigned>(bh64 / p.hb));
      // The mma.sync kernel where every operand it copies is 16-byte aligned; the WMMA kernel
      // (the same dx bits) for the rest.
      const size_t mma_smem = dx_mma_smem_bytes(pr);
      if (dx_on_mma) {
        if (p.dyh != nullptr) {
          // The heads' shared-operand kernel, then dx_mma on the heads it left (its masks).
          bwd_cbt16_kernel<T><<<dim3(static_cast<unsigned>(nc * causal_pairs(p.ntt)),
                                     static_cast<unsigned>(pr.batch * pr.ngroups)),
                                256, 0, st>>>(p);
          BARACUDA_TRY(cuda::check_launch(op, "bwd_cbt16_kernel"));
          bool on_wg = false;
          if constexpr (kWalks) on_wg = dx_wg_ok(p, a);
          if (on_wg) {
            BARACUDA_TRY(launch_dx_wg(p, a, grid, st));
            clock.mark("dx_wg");
          } else {
            auto* hn = p.has_z ? bwd_dx_hn_kernel<T, true> : bwd_dx_hn_kernel<T, false>;
            BARACUDA_TRY(cuda::launch_with_smem(op, "bwd_dx_hn_kernel", hn, grid, dx_hn::kThreadsHn,
                                                dx_hn_smem_bytes(pr), st, p));
            clock.mark("dx_hn");
          }
          auto* rest =
              p.has_z ? bwd_dx_mma_kernel<T, true, true> : bwd_dx_mma_kernel<T, false, true>;
          BARACUDA_TRY(cuda::launch_with_smem(op, "bwd_dx_mma_kernel", rest, grid,
                                              dx_mma::kThreadsDx, mma_smem, st, p));
        } else {
          auto* kernel = p.has_z ? bwd_dx_mma_kernel<T, true> : bwd_dx_mma_kernel<T, false>;
          BARACUDA_TRY(cuda::launch_with_smem(op, "bwd_dx_mma_kernel", kernel, grid,
                                              dx_mma::kThreadsDx, mma_smem, st, p));
        }
      } else {
        BARACUDA_TRY(cuda::launch_with_smem(op, "bwd_dx_heads_vec_kernel",
                                            bwd_dx_heads_vec_kernel<T>, grid, kThreads,
                                            dx_heads_smem_bytes(pr), st, p));
      }
    } else
      bwd_dx_kernel<T, kTC><<<dim3(nc * ntt, ntd, bh), kThreads, 0, st>>>(p);
    BARACUDA_TRY(cuda::check_launch(op, "bwd_dx_kernel"));
    clock.mark("dx");
    if constexpr (kVec) {
      const dim3 dcb_grid(static_cast<unsigned>(nc * causal_pairs(p.ntt)),
                          static_cast<unsigned>(pr.batch * pr.ngroups));
      bool dcb_on_mma = false, dcb_on_wg = false;
      if constexpr (kWalks) {
        if (dcb_wg_ok(p, a)) {
          BARACUDA_TRY(launch_dcb_wg(p, a, dcb_grid, st));
          dcb_on_wg = true;
        }
      }
      if constexpr (kMma) {
        const size_t smem =
            p.has_z ? dcb_mma::layout<true>().total : dcb_mma::layout<false>().total;
        if (!dcb_on_wg && dcb_mma_fits(p) && static_cast<int64_t>(smem) <= optin) {
          auto* kernel = p.has_z ? bwd_dcb_mma_kernel<T, true> : bwd_dcb_mma_kernel<T, false>;
          BARACUDA_TRY(cuda::launch_with_smem(op, "bwd_dcb_mma_kernel", kernel, dcb_grid,
                                              dcb_mma::kThreads, smem, st, p));
          dcb_on_mma = true;
        }
      }
      if (!dcb_on_wg && !dcb_on_mma) {
        bwd_dcb_vec_kernel<T><<<dcb_grid, kThreads, 0, st>>>(p);
        BARACUDA_TRY(cuda::check_launch(op, "bwd_dcb_vec_kernel"));
      }
      clock.mark(dcb_on_wg ? "dcb_wg" : dcb_on_mma ? "dcb_mma" : "dcb");
      if (db_on_wg) {
        BARACUDA_TRY((launch_bc_wg<T, true>(p, a, heads_grid(1), st)));
      } else if (db_on_mma) {
        BARACUDA_TRY(cuda::launch_with_smem(op, "bwd_db_mma_kernel", bwd_db_mma_kernel<T>,
                                            heads_grid(mma_tiles_n), db_mma::kThreads,
                                            db_mma::kSmem, st, p));
      } else {
        BARACUDA_TRY(cuda::launch_with_smem(op, "bwd_db_heads_vec_kernel",
                                            bwd_db_heads_vec_kernel<T>, heads_grid(1), kThreads,
                                            bc_heads_smem_bytes(pr), st, p));
      }
    } else
      bwd_db_kernel<T, kTC><<<dim3(nc * ntt, ntn, bh), kThreads, 0, st>>>(p);
    BARACUDA_TRY(cuda::check_launch(op, "bwd_db_kernel"));
    clock.mark(db_on_wg ? "db_wg" : db_on_mma ? "db_mma" : "db");
    if constexpr (kVec) {
      if (dc_on_wg) {
        BARACUDA_TRY((launch_bc_wg<T, false>(p, a, heads_grid(1), st)));
      } else if (dc_on_mma) {
        auto* kernel = p.has_z ? bwd_dc_mma_kernel<T, true> : bwd_dc_mma_kernel<T, false>;
        BARACUDA_TRY(cuda::launch_with_smem(op, "bwd_dc_mma_kernel", kernel,
                                            heads_grid(mma_tiles_n), dc_mma::kThreads,
                                            dc_mma::kSmem, st, p));
      } else {
        BARACUDA_TRY(cuda::launch_with_smem(op, "bwd_dc_heads_vec_kernel",
                                            bwd_dc_heads_vec_kernel<T>, heads_grid(1), kThreads,
                                            bc_heads_smem_bytes(pr), st, p));
      }
    } else
      bwd_dc_kernel<T, kTC><<<dim3(nc * ntt, ntn, bh), kThreads, 0, st>>>(p);
    BARACUDA_TRY(cuda::check_launch(op, "bwd_dc_kernel"));
    clock.mark(dc_on_wg ? "dc_wg" : dc_on_mma ? "dc_mma" : "dc");
    bwd_finalize_kernel<T><<<dim3(nc, bh), kThreads, 0, st>>>(p);
    BARACUDA_TRY(cuda::check_launch(op, "bwd_finalize_kernel"));
    clock.mark("finalize");
  }
  bwd_head_kernel<T><<<static_cast<unsigned>(pr.heads), kThreads, 0, st>>>(p);
  BARACUDA_TRY(cuda::check_launch(op, "bwd_head_kernel"));
  clock.mark("head");
  const int64_t bc = pr.batch * pr.seqlen * pr.ngroups * pr.state_dim;
  if (bc > 0) {
    bwd_reduce_bc_kernel<T><<<static_cast<unsigned>(cuda::ceil_div(bc, 256)), 256, 0, st>>>(p);
    BARACUDA_TRY(cuda::check_launch(op, "bwd_reduce_bc_kernel"));
    clock.mark("reduce_bc");
  }
  return {};
}

template <class T>
Status decode_launch(const LaunchContext& ctx, const ssd::DecodeProblem& pr,
                     const SsdDecodeOp::Arguments& a) {
  Dec<T> p;
  p.B = pr.batch, p.H = pr.heads, p.D = pr.head_dim, p.N = pr.state_dim;
  p.hpg = pr.heads_per_group;
  p.state = v4<float>(a.state);
  p.y = v3<T>(a.y);
  p.x = v3<const T>(a.x), p.Bm = v3<const T>(a.B), p.Cm = v3<const T>(a.C);
  p.z = pr.has_z ? v3<const T>(a.z) : V3<const T>{};
  p.dt = {ptr_of<const T>(a.dt), a.dt.stride[0], a.dt.stride[1]};
  p.A = v1<const float>(a.A);
  p.bias = pr.has_dt_bias ? v1<const float>(a.dt_bias) : V1<const float>{};
  p.Dv = dskip_view<const float>(a.D, pr.d_skip);
  p.has_d = pr.d_skip != ssd::DSkip::none, p.has_z = pr.has_z, p.has_bias = pr.has_dt_bias;
  p.softplus = pr.dt_softplus, p.dt_min = pr.dt_min, p.dt_max = pr.dt_max;
  const int64_t rows = pr.batch * pr.heads * pr.head_dim;
  if (rows == 0) return {};
  constexpr int kWarps = 8;
  const auto addr = reinterpret_cast<uintptr_t>(a.state.data);
  const bool vec = a.state.stride[3] == 1 && pr.state_dim % 4 == 0 && pr.head_dim % kDecRows == 0 &&
                   addr % 16 == 0 && a.state.stride[0] % 4 == 0 && a.state.stride[1] % 4 == 0 &&
                   a.state.stride[2] % 4 == 0;
  if (vec) {
    const auto blocks = static_cast<unsigned>(cuda::ceil_div(rows / kDecRows, kWarps));
    decode_vec_kernel<T><<<blocks, kWarps * 32, 0, cuda::stream_of(ctx)>>>(p);
  } else {
    const auto blocks = static_cast<unsigned>(cuda::ceil_div(rows, kWarps));
    decode_kernel<T><<<blocks, kWarps * 32, 0, cuda::stream_of(ctx)>>>(p);
  }
  return cuda::check_launch("ssd_decode", "decode_kernel");
}

}  // namespace baracuda::ssd_cuda

#include "ops/ssd/backward_walks.cuh"  // the backward's inter-chunk passes on wgmma

#include "ops/ssd/backward_bc_wgmma.cuh"   // its dB and dC on wgmma
#include "ops/ssd/backward_dcb_wgmma.cuh"  // dCB
#include "ops/ssd/backward_dx_wgmma.cuh"   // and dx
#include "ops/ssd/forward_fused.cuh"       // the one-pass forward (fused_mma)
#include "ops/ssd/forward_wgmma.cuh"       // the one-pass forward on wgmma (fused_wgmma_sm90a)

namespace baracuda::ssd_cuda {

// ---- registration (one call per dtype translation unit)
// -------------------------------------------
constexpr PrecisionGuarantee kF32Det{MathPrecision::f32, DType::f32, true, false};

inline bool chunked_fits(const ssd::Problem& p, const DeviceCaps&) {
  return !p.varlen() && p.batch * p.heads <= kMaxGridYZ &&
         p.nchunks * (p.chunk_size / kTile) < (int64_t{1} << 31);
}
inline size_t chunked_workspace(const ssd::Problem& p, const DeviceCaps&) {
  return static_cast<size_t>(fwd_layout(p, false).total) * sizeof(float);
}
inline size_t chunked_tc_workspace(const ssd::Problem& p, const DeviceCaps&) {
  return static_cast<size_t>(fwd_layout(p, true).total) * sizeof(float);
}
template <class T>
size_t chunked_tc_fast_workspace(const ssd::Problem& p, const DeviceCaps&) {
  return static_cast<size_t>(fwd_layout(p, true, sizeof(T)).total) * sizeof(float);
}

inline bool chunked_bwd_fits(const ssd::Problem& p, const DeviceCaps&) {
  return !p.varlen() && p.batch * p.heads <= kMaxGridYZ && p.batch * p.ngroups <= kMaxGridYZ &&
         p.nchunks * (p.chunk_size / kTile) * (p.chunk_size / kTile) < (int64_t{1} << 31);
}
inline size_t chunked_bwd_workspace(const ssd::Problem& p, const DeviceCaps&) {
  return static_cast<size_t>(bwdc_layout(p).total) * sizeof(float);
}

// Every kernel of the family: category "scan", CUDA on sm_80+; entries differ in op, variant,
// precision and name.
template <DType E>
KernelSku scan_sku(std::string_view op, std::string_view epilogue, PrecisionGuarantee precision,
                   std::string_view name) {
  return {.category = "scan",
          .op = op,
          .element = E,
          .epilogue = epilogue,
          .arch = Arch::sm80,
          .backend = Backend::bespoke_cuda,
          .precision = precision,
          .name = name};
}
// The tensor-core variants: 16-bit products, f32 accumulation, fixed order (deterministic), but a
// row's bits depend on the chunking (not bit-stable).
template <DType E>
inline constexpr PrecisionGuarantee kTensorCorePrecision{
    E == DType::f16 ? MathPrecision::f16 : MathPrecision::bf16, DType::f32, true, false};

// The dB/dC head blocks' dynamic accumulator tiles (64 KB at N 256) next to their staging, and
// the dCB kernel's static tiles.
template <class T>
bool bc_heads_fit(const ssd::Problem& p, const DeviceCaps& caps) {
  const size_t heads = bc_heads_smem_bytes(p) + sizeof(GemmSmem<T, true>);
  const size_t dcb = sizeof(DcbSmem<T>);
  const size_t dx = dx_heads_smem_bytes(p) + sizeof(GemmSmem<T, true>) + sizeof(ChunkScalars);
  return chunked_bwd_fits(p, caps) &&
         static_cast<int64_t>(std::max({heads, dcb, dx})) <= caps.smem_per_block_optin &&
         p.batch * p.ngroups <= kMaxGridYZ;
}

// The fastpass variants' inter-chunk passes by chunk_scan_kernel: its grid within 2^31 blocks.
inline bool chunked_fast_fits(const ssd::Problem& p, const DeviceCaps& caps) {
  return chunked_fits(p, caps) && chunk_scan_blocks(p) < (int64_t{1} << 31);
}
template <class T>
bool bc_heads_fast_fit(const ssd::Problem& p, const DeviceCaps& caps) {
  return bc_heads_fit<T>(p, caps) && chunk_scan_blocks(p) < (int64_t{1} << 31);
}

// chunked_mma_walks_sm90a's shapes; kFullGrid: only where B * H fills the SMs (its default).
template <class T, bool kFullGrid>
bool walks_fits_at(const ssd::Problem& p, const DeviceCaps& caps) {
  return bc_heads_fast_fit<T>(p, caps) && walks_fit<T>(p, caps) &&
         (!kFullGrid || p.batch * p.heads >= caps.sm_count);
}

template <DType E>
bool register_kernels() {
  using T = cuda::device_t<E>;
  register_kernel<SsdForwardOp>({
      .sku = scan_sku<E>("ssd_forward", "chunked", kF32Det, "chunked_f32"),
      .priority = 20,
      .fits =
          [](const ssd::Problem& p, const DeviceCaps&) {
            return !p.varlen() && p.batch * p.heads <= kMaxGridYZ &&
                   p.nchunks * (p.chunk_size / kTile) < (int64_t{1} << 31);
          },
      .workspace = [](const ssd::Problem& p, const DeviceCaps&) -> size_t {
        return static_cast<size_t>(fwd_layout(p, false).total) * sizeof(float);
      },
      .launch = forward_chunked<T, false>,
  });
  if constexpr (E == DType::f16 || E == DType::bf16) {
    // One block per (b, h) walks the chunks with the state on chip: x read once, y written once,
    // no workspace (forward_fused.cuh). By name anywhere it fits (D <= 64, N <= 128); the default
    // as fused_mma_ranked_ahead where B * H fills the SMs: on the H200 0.755 vs 0.765 ms
    // (chunked_mma_fastpass) at B4 L4096 H80 D64 N128 and 0.208 vs 0.279 ms at B8 L2048 H32 D64
    // N64, bf16 chunk 256 (2026-11-26, docs/perf/ssd.md).
    register_kernel<SsdForwardOp>({
        .sku = scan_sku<E>("ssd_forward", "chunked", kTensorCorePrecision<E>, "fused_mma"),
        .priority = 28,
        .fits = fused_fits,
        .launch = forward_fused<T, FusedCut::none>,
    });
    // The default entry cuts the walks into segments where fewer, shorter waves win
    // (ssd_segments::fused_segments); fused_mma_split always cuts them (tests, A/B runs).
    register_kernel<SsdForwardOp>({
        .sku = scan_sku<E>("ssd_forward", "chunked", kTensorCorePrecision<E>,
                           "fused_mma_ranked_ahead"),
        .priority = 33,
        .fits = fused_ranked_ahead_fits,
        .workspace = fused_workspace<FusedCut::rule>,
        .launch = forward_fused<T, FusedCut::rule>,
    });
    // fused_mma's walk on wgmma with tensor-map copies (forward_wgmma.cuh; sm_90a, chunk 128 or
    // 256, D <= 64, N <= 128): the default there where B * H fills the SMs (as
    // fused_wgmma_sm90a_ranked_ahead; on the H200 at chunk 128 0.289 vs 0.667 ms for
    // fused_mma_ranked_ahead at B4 L4096 H80 D64 N128 bf16, 0.116 vs 0.210 at B8 L2048 H32 D64
    // N64, docs/perf/ssd.md), by name wherever it fits; the walks cut by fused_mma's rule, or
    // always (_split, for tests).
    // Views its tensor maps cannot describe run on the plan's fallback (fused_mma's entries).
    {
      struct Entry {
        std::string_view name;
        int priority;
        bool (*fits)(const ssd::Problem&, const DeviceCaps&);
        size_t (*workspace)(const ssd::Problem&, const DeviceCaps&);
        Status (*launch)(const LaunchContext&, const ssd::Problem&, const SsdForwardOp::Arguments&);
      };
      const Entry entries[] = {
          {"fused_wgmma_sm90a", 0, wgmma_fwd_fits<T>, fused_workspace<FusedCut::rule>,
           forward_wgmma<T, FusedCut::rule>},
          {"fused_wgmma_sm90a_ranked_ahead", 34, wgmma_ranked_ahead_fits<T>,
           fused_workspace<FusedCut::rule>, forward_wgmma<T, FusedCut::rule>},
          {"fused_wgmma_sm90a_split", -1, wgmma_fwd_fits<T>, fused_workspace<FusedCut::forced>,
           forward_wgmma<T, FusedCut::forced>},
      };
      for (const Entry& e : entries) {
        KernelSku sku = scan_sku<E>("ssd_forward", "chunked", kTensorCorePrecision<E>, e.name);
        sku.arch = Arch::sm90a;
        register_kernel<SsdForwardOp>({.sku = sku,
                                       .priority = e.priority,
                                       .fits = e.fits,
                                       .workspace = e.workspace,
                                       .launch = e.launch,
                                       .check = wgmma_fwd_check<T>});
      }
    }
    register_kernel<SsdForwardOp>({
        .sku = scan_sku<E>("ssd_forward", "chunked", kTensorCorePrecision<E>, "fused_mma_split"),
        .priority = 27,
        .fits = fused_fits,
        .workspace = fused_workspace<FusedCut::forced>,
        .launch = forward_fused<T, FusedCut::forced>,
    });
    register_kernel<SsdForwardOp>({
        .sku = scan_sku<E>("ssd_forward", "chunked", kTensorCorePrecision<E>, "chunked_wmma"),
        .priority = 30,
        .fits = chunked_fits,
        .workspace = chunked_tc_workspace,
        .launch = forward_chunked<T, true>,
    });
    // The same kernels with both operands of a tile fetched as 16-byte vectors before either is
    // converted (load_tile issues one load per thread at a time); bitwise equal results. Below
    // chunked_wmma: slower on the H100 (5.50 vs 4.15 ms at B4 L4096 H80 D64 N128 bf16; its
    // chunk_out runs at 2 blocks per SM).
    register_kernel<SsdForwardOp>({
        .sku = scan_sku<E>("ssd_forward", "chunked", kTensorCorePrecision<E>, "chunked_wmma_vec"),
        .priority = 29,
        .fits = chunked_fits,
        .workspace = chunked_tc_workspace,
        .launch = forward_chunked<T, true, true>,
    });
    // chunked_wmma with the inter-chunk pass by chunk_scan_kernel (16-byte vectors, 4 chunks in
    // flight per thread; bitwise equal results). The default where it fits: 2.39 vs 4.17 ms at
    // B4 L4096 H80 D64 N128 bf16 on the H100 (2026-11-24, docs/perf/ssd.md).
    register_kernel<SsdForwardOp>({
        .sku =
            scan_sku<E>("ssd_forward", "chunked", kTensorCorePrecision<E>, "chunked_wmma_fastpass"),
        .priority = 31,
        .fits = chunked_fast_fits,
        .workspace = chunked_tc_fast_workspace<T>,
        .launch = forward_chunked<T, true, false, true>,
    });
    // chunked_wmma_fastpass with chunk_state and chunk_out on mma.sync (register accumulators,
    // cp.async rings, hb heads per block sharing the group's tiles, chunk_out's decay factored
    // per 64-token tile) where the operands allow 16-byte copies, its kernels elsewhere. The
    // states are the same values as chunked_wmma's up to the order of the sums; y to rounding.
    register_kernel<SsdForwardOp>({
        .sku =
            scan_sku<E>("ssd_forward", "chunked", kTensorCorePrecision<E>, "chunked_mma_fastpass"),
        .priority = 32,
        .fits = chunked_fast_fits,
        .workspace = chunked_tc_fast_workspace<T>,
        .launch = forward_chunked<T, true, false, true, true>,
    });
  }
  register_kernel<SsdForwardOp>({
      .sku = scan_sku<E>("ssd_forward", "recurrent", kF32Det, "recurrent_f32"),
      .priority = 10,
      .fits = [](const ssd::Problem& p,
                 const DeviceCaps&) { return p.seqs <= kMaxGridYZ && p.heads <= kMaxGridYZ; },
      .launch = forward_recurrent<T>,
  });
  register_kernel<SsdBackwardOp>({
      .sku = scan_sku<E>("ssd_backward", "recurrent", kF32Det, "recurrent_deterministic_f32"),
      .priority = 10,
      .fits =
          [](const ssd::Problem& p, const DeviceCaps& caps) {
            return p.seqs <= kMaxGridYZ && p.heads <= kMaxGridYZ &&
                   static_cast<int64_t>(bwd_smem_bytes(p.state_dim)) <= caps.smem_per_block_optin;
          },
      .workspace = [](const ssd::Problem& p, const DeviceCaps&) -> size_t {
        return static_cast<size_t>(bwd_layout(p).total) * sizeof(float);
      },
      .launch = backward_recurrent<T>,
  });
  register_kernel<SsdBackwardOp>({
      .sku = scan_sku<E>("ssd_backward", "chunked", kF32Det, "chunked_f32"),
      // For f32 data the recurrent kernel (10) stays the default: the chunked form's dA and
      // ddt_bias (token sums that cancel) land a few times outside f32's reduction bound. For
      // 16-bit data this is the f32-math fallback under chunked_wmma.
      .priority = E == DType::f32 ? 5 : 20,
      .fits = chunked_bwd_fits,
      .workspace = chunked_bwd_workspace,
      .launch = backward_chunked<T, false>,
  });
  if constexpr (E == DType::f16 || E == DType::bf16) {
    register_kernel<SsdBackwardOp>({
        .sku = scan_sku<E>("ssd_backward", "chunked", kTensorCorePrecision<E>, "chunked_wmma"),
        .priority = 30,
        .fits = chunked_bwd_fits,
        .workspace = chunked_bwd_workspace,
        .launch = backward_chunked<T, true>,
    });
    // The same products on operands staged by 16-byte vectors (one memory round trip per 64-deep
    // stage instead of four), dB/dC blocks over every N tile and up to 8 heads of a group: the
    // per-head outputs are bitwise equal to chunked_wmma's; dB/dC add the same terms in another
    // association (1-ulp differences measured), both deterministic.
    // Above chunked_wmma: 12.8 ms vs 29.4 ms at B4 L4096 H80 D64 N128 bf16 on the H100 (the run
    // after 4f55496; docs/perf/ssd.md).
    register_kernel<SsdBackwardOp>({
        .sku = scan_sku<E>("ssd_backward", "chunked", kTensorCorePrecision<E>, "chunked_wmma_vec"),
        .priority = 31,
        .fits = bc_heads_fit<T>,
        .workspace = chunked_bwd_workspace,
        .launch = backward_chunked<T, true, true>,
    });
    // chunked_wmma_vec with both inter-chunk passes (the states' recompute and the reverse adjoint
    // scan) by chunk_scan_kernel: the same values bit for bit. The default where it fits: 9.05 vs
    // 12.76 ms at B4 L4096 H80 D64 N128 bf16 on the H100 (2026-11-24).
    register_kernel<SsdBackwardOp>({
        .sku = scan_sku<E>("ssd_backward", "chunked", kTensorCorePrecision<E>,
                           "chunked_wmma_vec_fastpass"),
        .priority = 32,
        .fits = bc_heads_fast_fit<T>,
        .workspace = chunked_bwd_workspace,
        .launch = backward_chunked<T, true, true, true>,
    });
    // chunked_wmma_vec_fastpass with the states' recompute and U_c (chunk_outer_mma_kernel, as
    // chunked_mma_fastpass's forward), dCB (bwd_dcb_mma_kernel, factored weights), dB and dC
    // (bwd_db / dc_mma_kernel) on mma.sync where their operands allow 16-byte copies. The same
    // values to rounding.
    register_kernel<SsdBackwardOp>({
        .sku =
            scan_sku<E>("ssd_backward", "chunked", kTensorCorePrecision<E>, "chunked_mma_fastpass"),
        .priority = 33,
        .fits = bc_heads_fast_fit<T>,
        .workspace = chunked_bwd_workspace,
        .launch = backward_chunked<T, true, true, true, true>,
    });
    // chunked_mma_fastpass with its two inter-chunk passes (the states' recompute with its scan,
    // U_c with the adjoint scan) as walks on wgmma, one block per (b, h) carrying the state
    // (backward_walks.cuh; sm_90a, chunk 128 or 256, D <= 64, N <= 128), and its dx, dCB, dB and
    // dC products on wgmma (backward_dx / dcb / bc_wgmma.cuh): by name wherever it fits, the
    // default (_full_grid) where B * H fills the SMs (below that a walk's chunk count times a
    // piece's latency loses to the chunk-parallel kernels): 1.448 vs 2.258 ms at B4 L4096 H80 D64
    // N128 bf16 on the H200, 0.544 vs 0.864 at B8 L2048 H32 D64 N64 (docs/perf/ssd.md). Per walk
    // or product, views a tensor map cannot describe (and z, for the adjoint, dCB and dC) take
    // chunked_mma_fastpass's kernels.
    struct WalkEntry {
      std::string_view name;
      int priority;
      bool (*fits)(const ssd::Problem&, const DeviceCaps&);
    };
    for (const WalkEntry& e :
         {WalkEntry{"chunked_mma_walks_sm90a", 0, walks_fits_at<T, false>},
          WalkEntry{"chunked_mma_walks_sm90a_full_grid", 34, walks_fits_at<T, true>}}) {
      KernelSku sku = scan_sku<E>("ssd_backward", "chunked", kTensorCorePrecision<E>, e.name);
      sku.arch = Arch::sm90a;
      register_kernel<SsdBackwardOp>({.sku = sku,
                                      .priority = e.priority,
                                      .fits = e.fits,
                                      .workspace = chunked_bwd_workspace,
                                      .launch = backward_chunked<T, true, true, true, true, true>});
    }
  }
  register_kernel<SsdDecodeOp>({
      .sku = scan_sku<E>("ssd_decode", "none", kF32Det, "decode_f32"),
      .priority = 10,
      .launch = decode_launch<T>,
  });
  return true;
}

}  // namespace baracuda::ssd_cuda
