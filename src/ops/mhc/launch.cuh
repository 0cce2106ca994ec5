// Launchers and registration of the mHC CUDA kernels for one activation dtype. Included by
// kernels_<dtype>.cu only.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <utility>

#include "ops/mhc/collapse_cluster16.cuh"
#include "ops/mhc/kernels.cuh"

namespace baracuda::mhc_cuda {
// Internal linkage: every kernels_<dtype>.cu gets its own copy of the dtype-free kernels.
namespace {

// ---- workspace layout: f32 arrays, each starting on a 256-byte boundary
// ---------------------------
struct Carver {
  char* base = nullptr;
  size_t used = 0;
  float* take(int64_t floats) {
    float* p = base ? reinterpret_cast<float*>(base + used) : nullptr;
    used += (static_cast<size_t>(floats) * sizeof(float) + 255) / 256 * 256;
    return p;
  }
};
inline int64_t steps_of(const MhcProblem& p) {
  return 2 * int64_t{p.sinkhorn.iters} - 1;
}
// Split-K of the dynamic logit product: enough CTAs to fill the GPU at realistic token counts.
// It depends on n * C only, so a token's logits never depend on the token count (bit-stable).
inline int64_t per_split(const MhcProblem& p) {
  const int64_t splits = std::clamp<int64_t>(p.flat / 1024, 1, 16);
  const int64_t per = (p.flat + splits - 1) / splits;
  return (per + kKC - 1) / kKC * kKC;
}
inline int64_t splits_of(const MhcProblem& p) {
  return (p.flat + per_split(p) - 1) / per_split(p);
}

struct CollapseBwdWs {
  float *g, *ss, *logits, *coeffs, *trace, *dpre, *dpre_sum, *dc, *dl, *dgk, *coef, *part;
};
inline CollapseBwdWs carve_collapse_bwd(const MhcProblem& p, Carver& c) {
  const bool dyn = p.h == MhcH::dynamic_h;
  const int64_t T = p.tokens, R = p.rows, K = p.k, n = p.n;
  CollapseBwdWs w{};
  w.g = c.take(dyn ? splits_of(p) * T * K : 0);
  w.ss = c.take(dyn ? splits_of(p) * T : 0);
  w.logits = c.take(R * K);
  w.coeffs = c.take(R * K);
  w.trace = c.take(R * steps_of(p) * n * n);
  w.dpre = c.take(T * n);
  w.dpre_sum = c.take(n);
  w.dc = c.take(R * K);
  w.dl = c.take(R * K);
  w.dgk = c.take(dyn ? T * K : 0);
  w.coef = c.take(dyn ? T : 0);
  w.part = c.take(dyn ? T * 3 : 0);
  return w;
}

inline size_t ws_static_forward(const MhcProblem& p, const DeviceCaps&) {
  Carver c;
  c.take(p.k);
  return c.used;
}
inline size_t ws_collapse(const MhcProblem& p, const DeviceCaps&) {
  if (p.h == MhcH::static_h) return 0;
  Carver c;
  c.take(splits_of(p) * p.tokens * p.k);
  c.take(splits_of(p) * p.tokens);
  return c.used;
}
inline size_t ws_expand_bwd(const MhcProblem& p, const DeviceCaps&) {
  if (p.h == MhcH::dynamic_h) return 0;
  Carver c;
  c.take(p.tokens * p.k);
  return c.used;
}
inline size_t ws_collapse_bwd(const MhcProblem& p, const DeviceCaps&) {
  Carver c;
  carve_collapse_bwd(p, c);
  return c.used;
}

// ---- helpers
// ------------------------------------------------------------------------------------------
inline unsigned blocks_for(int64_t work, int threads) {
  return static_cast<unsigned>((work + threads - 1) / threads);
}
// The 16-byte vector path needs aligned bases, strides that keep every row aligned and C % VEC ==
// 0.
template <class T>
bool vec_ok(int64_t channels, std::initializer_list<const void*> ptrs,
            std::initializer_list<int64_t> strides) {
  constexpr int64_t vec = 16 / sizeof(T);
  if (channels % vec) return false;
  for (const void* p : ptrs)
    if (reinterpret_cast<uintptr_t>(p) % 16) return false;
  for (int64_t s : strides)
    if (s % vec) return false;
  return true;
}
#define MHC_CHECK(what) BARACUDA_TRY(cuda::check_launch(op, what))

inline ActivateArgs activate_static(const MhcProblem& p, const MhcParams& w) {
  ActivateArgs a;
  a.rows = 1, a.n = static_cast<int>(p.n), a.k = static_cast<int>(p.k);
  a.h_pre = static_cast<const float*>(w.h_pre.data);
  a.h_post = static_cast<const float*>(w.h_post.data);
  a.h_res = static_cast<const float*>(w.h_res.data);
  a.h_res_stride = w.h_res.stride[0];
  a.pre_eps = static_cast<float>(p.pre_eps);
  a.sk = sinkhorn_params(p.sinkhorn);
  return a;
}
// MMA: logits_mma_kernel where its layout rules hold (C % 16 == 0, X rows and fn rows in aligned
// 4-element vectors), else the CUDA-core kernel; decided by layout, never by the token count.
template <class T, bool MMA = false>
Status run_logits(std::string_view op, cudaStream_t s, const MhcProblem& p, const ConstTensor& x,
                  const MhcParams& w, float* g, float* ss) {
  if (p.tokens == 0) return {};
  LogitArgs la;
  la.tokens = p.tokens, la.flat = p.flat, la.channels = p.channels;
  la.st = x.stride[0], la.si = x.stride[1], la.k = static_cast<int>(p.k);
  la.fn = static_cast<const float*>(w.fn.data), la.fn_stride = w.fn.stride[0];
  la.g = g, la.ss = ss, la.per_split = per_split(p);
  if constexpr (MMA) {
    const bool x_ok = reinterpret_cast<uintptr_t>(x.data) % (4 * sizeof(T)) == 0 &&
                      la.st % 4 == 0 && la.si % 4 == 0;
    const bool fn_ok = reinterpret_cast<uintptr_t>(w.fn.data) % 16 == 0 && la.fn_stride % 4 == 0;
    if (p.channels % 16 == 0 && x_ok && fn_ok) {
      la.splits = splits_of(p);
      const dim3 grid(static_cast<unsigned>(blocks_for(p.tokens, kLmmaTokens) * la.splits),
                      blocks_for(p.k, kDynKpass));
      return cuda::launch_with_smem(op, "logits_mma_kernel", logits_mma_kernel<T>, grid,
                                    kLmmaThreads, lmma_smem_bytes<T>(), s,
                                    static_cast<const T*>(x.data), la);
    }
  }
  const dim3 grid(blocks_for(p.tokens, kTM), blocks_for(p.k, kKB),
                  static_cast<unsigned>(splits_of(p)));
  logits_kernel<T><<<grid, kLogitThreads, 0, s>>>(static_cast<const T*>(x.data), la);
  MHC_CHECK("logits_kernel");
  return {};
}
inline ActivateArgs activate_dynamic(const MhcProblem& p, const MhcParams& w, float* g, float* ss) {
  ActivateArgs a;
  a.rows = p.tokens, a.n = static_cast<int>(p.n), a.k = static_cast<int>(p.k);
  a.g = g, a.ss = ss, a.splits = static_cast<int>(splits_of(p));
  a.scale = static_cast<const float*>(w.scale.data);
  a.base = static_cast<const float*>(w.base.data);
  a.inv_flat = static_cast<float>(1.0 / static_cast<double>(p.flat));
  a.norm_eps = static_cast<float>(p.norm_eps);
  a.pre_eps = static_cast<float>(p.pre_eps);
  a.sk = sinkhorn_params(p.sinkhorn);
  return a;
}
// Threads per block of the thread-per-row kernels (activate_kernel, comb_sinkhorn_kernel): as many
// rows' Sinkhorn slots as fit in 48 KB of shared memory, at most 128.
inline int row_kernel_threads(int slot_bytes) {
  return std::clamp(48 * 1024 / slot_bytes, 1, 128);
}
inline Status run_activate(std::string_view op, cudaStream_t s, const ActivateArgs& a) {
  if (a.rows == 0) return {};
  const int slot_bytes = activate_slot(a.n) * static_cast<int>(sizeof(float));
  if (a.logits == nullptr && a.trace == nullptr) {  // forward: one warp per row
    if (a.g == nullptr && a.rows == 1) {
      activate_static_warp_kernel<<<1, 32, slot_bytes, s>>>(a);
      MHC_CHECK("activate_static_warp_kernel");
      return {};
    }
    if (a.g != nullptr) {
      activate_dynamic_warp_kernel<<<blocks_for(a.rows, kActWarps), kActWarps * 32,
                                     kActWarps * slot_bytes, s>>>(a);
      MHC_CHECK("activate_dynamic_warp_kernel");
      return {};
    }
  }
  const int threads = row_kernel_threads(slot_bytes);
  activate_kernel<<<blocks_for(a.rows, threads), threads, threads * slot_bytes, s>>>(a);
  MHC_CHECK("activate_kernel");
  return {};
}
inline Status run_colsum(std::string_view op, cudaStream_t s, ColSumArgs a) {
  if (a.cols == 0) return {};
  colsum_kernel<<<static_cast<unsigned>(a.cols), kSumThreads, 0, s>>>(a);
  MHC_CHECK("colsum_kernel");
  return {};
}

// ---- static forward
// ---------------------------------------------------------------------------------
// The coefficient row [s_pre | s_post | M] formed in the workspace (one warp, in front of the
// token kernels) and the token kernels' arguments around it.
inline Status static_forward_args(const LaunchContext& ctx, const MhcProblem& p,
                                  const MhcStaticForwardOp::Arguments& a, StaticFwdArgs& sa) {
  MhcParams w;
  w.h_pre = a.h_pre, w.h_post = a.h_post, w.h_res = a.h_res;
  ActivateArgs act = activate_static(p, w);
  act.pre_eps = 0.0f;  // the seed's s_pre = sigmoid(h_pre)
  act.out = static_cast<float*>(ctx.workspace.data);
  BARACUDA_TRY(run_activate(MhcStaticForwardOp::name, cuda::stream_of(ctx), act));
  sa.tokens = p.tokens, sa.channels = p.channels, sa.n = static_cast<int>(p.n);
  sa.x_st = a.x.stride[0], sa.x_si = a.x.stride[1], sa.o_st = a.out.stride[0];
  sa.o_si = a.out.stride[1];
  sa.co = act.out;
  sa.gamma = static_cast<const __nv_bfloat16*>(a.gamma.data);
  sa.inv_c = static_cast<float>(1.0 / static_cast<double>(p.channels));
  sa.eps = static_cast<float>(p.norm_eps);
  return {};
}
// The 16-byte kernels' layout rule: aligned X, out and gamma, C a multiple of the vector. The
// choice of kernel depends on it, never on the token count.
template <class T>
bool static_forward_aligned(const MhcProblem& p, const MhcStaticForwardOp::Arguments& a) {
  constexpr int vec = 16 / sizeof(T);
  return reinterpret_cast<uintptr_t>(a.gamma.data) % (vec * 2) == 0 &&
         vec_ok<T>(p.channels, {a.x.data, a.out.data},
                   {a.x.stride[0], a.x.stride[1], a.out.stride[0], a.out.stride[1]});
}
template <class T>
Status static_forward(const LaunchContext& ctx, const MhcProblem& p,
                      const MhcStaticForwardOp::Arguments& a);
// What the 16-byte kernels leave to others: unaligned layouts run the two-pass kernel, no tokens
// run nothing. The call's status when it handled the call, nothing otherwise.
template <class T>
std::optional<Status> static_forward_elsewhere(const LaunchContext& ctx, const MhcProblem& p,
                                               const MhcStaticForwardOp::Arguments& a) {
  if (!static_forward_aligned<T>(p, a)) return static_forward<T>(ctx, p, a);
  if (p.tokens == 0) return Status{};
  return std::nullopt;
}
template <class T>
Status static_forward(const LaunchContext& ctx, const MhcProblem& p,
                      const MhcStaticForwardOp::Arguments& a) {
  constexpr std::string_view op = MhcStaticForwardOp::name;
  if (p.tokens == 0) return {};
  const cudaStream_t s = cuda::stream_of(ctx);
  // static_forward_kernel reads the coefficient row from global memory (any n up to 64), so it is
  // formed in the workspace first (6ff0da6 once dropped this launch and left co null).
  StaticFwdArgs sa;
  BARACUDA_TRY(static_forward_args(ctx, p, a, sa));
  T* out = static_cast<T*>(a.out.data);
  const T* x = static_cast<const T*>(a.x.data);
  constexpr int vec = 16 / sizeof(T);
  if (static_forward_aligned<T>(p, a))
    static_forward_kernel<T, vec>
        <<<static_cast<unsigned>(p.tokens), kStaticThreads, 0, s>>>(out, x, sa);
  else
    static_forward_kernel<T, 1>
        <<<static_cast<unsigned>(p.tokens), kStaticThreads, 0, s>>>(out, x, sa);
  MHC_CHECK("static_forward_kernel");
  return {};
}

// One token per CTA in registers: n <= kHoldN and C / (16 / element size) chunks per stream within
// kRegsMaxCols per thread (16-bit C <= 8192, f32 C <= 4096).
template <DType D>
bool fits_static_regs(const MhcProblem& p, const DeviceCaps&) {
  constexpr int64_t vec = 16 / sizeof(cuda::device_t<D>);
  return p.n <= kHoldN && p.channels % vec == 0 &&
         p.channels / vec <= int64_t{kRegsMaxCols} * kRegsThreads;
}
// One token per CTA staged in shared memory: n <= kRegN, 16-byte chunks, the token within the
// opt-in shared memory of a block.
template <DType D>
bool fits_static_staged(const MhcProblem& p, const DeviceCaps& caps) {
  using T = cuda::device_t<D>;
  constexpr int64_t vec = 16 / sizeof(T);
  return p.n <= kRegN && p.channels % vec == 0 &&
         p.n * p.channels * static_cast<int64_t>(sizeof(T)) <= caps.smem_per_block_optin - 1024;
}
// STAGED = false: static_forward_regs_kernel; true: static_forward_staged_kernel.
template <class T, bool STAGED = false>
Status static_forward_token(const LaunchContext& ctx, const MhcProblem& p,
                            const MhcStaticForwardOp::Arguments& a) {
  constexpr std::string_view op = MhcStaticForwardOp::name;
  constexpr int vec = 16 / sizeof(T);
  if (auto done = static_forward_elsewhere<T>(ctx, p, a)) return std::move(*done);
  const cudaStream_t s = cuda::stream_of(ctx);
  StaticFwdArgs sa;
  BARACUDA_TRY(static_forward_args(ctx, p, a, sa));
  T* out = static_cast<T*>(a.out.data);
  const T* x = static_cast<const T*>(a.x.data);
  const auto grid = static_cast<unsigned>(p.tokens);
  if constexpr (STAGED) {
    auto* kernel =
        p.n <= 4 ? static_forward_staged_kernel<T, 4> : static_forward_staged_kernel<T, kRegN>;
    const size_t smem = static_cast<size_t>(p.n * p.channels) * sizeof(T);
    return cuda::launch_with_smem(op, "static_forward_staged_kernel", kernel, grid, kRegsThreads,
                                  smem, s, out, x, sa);
  } else {
    const int64_t cols = cuda::ceil_div(p.channels / vec, int64_t{kRegsThreads});
    auto* kernel = cols <= 1   ? static_forward_regs_kernel<T, 1>
                   : cols <= 2 ? static_forward_regs_kernel<T, 2>
                               : static_forward_regs_kernel<T, 4>;
    kernel<<<grid, kRegsThreads, 0, s>>>(out, x, sa);
    MHC_CHECK("static_forward_regs_kernel");
    return {};
  }
}

// ---- collapse
// -----------------------------------------------------------------------------------------
// MMA: dynamic H's logits on tensor cores (logits_mma_kernel) where the layout allows.
template <class T, bool MMA = false>
Status collapse(const LaunchContext& ctx, const MhcProblem& p, const MhcCollapseOp::Arguments& a) {
  constexpr std::string_view op = MhcCollapseOp::name;
  const cudaStream_t s = cuda::stream_of(ctx);
  float* co = static_cast<float*>(a.coeffs.data);
  ActivateArgs act;
  if (p.h == MhcH::static_h) {
    act = activate_static(p, a.params);
  } else {
    Carver c{static_cast<char*>(ctx.workspace.data)};
    float* g = c.take(splits_of(p) * p.tokens * p.k);
    float* ss = c.take(splits_of(p) * p.tokens);
    BARACUDA_TRY((run_logits<T, MMA>(op, s, p, a.x, a.params, g, ss)));
    act = activate_dynamic(p, a.params, g, ss);
  }
  act.out = co, act.out_stride = a.coeffs.stride[0];
  // Static H, n <= kRegN, tokens > 0: collapse_kernel writes the coefficient row itself.
  const bool inline_row = p.h == MhcH::static_h && p.n <= kRegN && p.tokens > 0;
  if (!inline_row) BARACUDA_TRY(run_activate(op, s, act));
  if (p.tokens == 0) return {};
  ActivateArgs inl;  // rows == 0: pre comes from the coefficient rows
  if (inline_row) inl = act;
  EwArgs e;
  e.tokens = p.tokens, e.channels = p.channels, e.n = static_cast<int>(p.n);
  e.k = static_cast<int>(p.k);
  e.x_st = a.x.stride[0], e.x_si = a.x.stride[1], e.y_st = a.y.stride[0];
  e.co = co, e.co_stride = p.rows == 1 ? 0 : a.coeffs.stride[0];
  T* y = static_cast<T*>(a.y.data);
  const T* x = static_cast<const T*>(a.x.data);
  constexpr int vec = 16 / sizeof(T);
  if (vec_ok<T>(p.channels, {a.x.data, a.y.data}, {e.x_st, e.x_si, e.y_st})) {
    e.cvecs = p.channels / vec;
    if (p.n <= 4)
      collapse_kernel<T, vec, 4>
          <<<blocks_for(p.tokens * e.cvecs, kEwThreads), kEwThreads, 0, s>>>(y, x, e, inl);
    else
      collapse_kernel<T, vec>
          <<<blocks_for(p.tokens * e.cvecs, kEwThreads), kEwThreads, 0, s>>>(y, x, e, inl);
  } else {
    e.cvecs = p.channels;
    collapse_kernel<T, 1>
        <<<blocks_for(p.tokens * e.cvecs, kEwThreads), kEwThreads, 0, s>>>(y, x, e, inl);
  }
  MHC_CHECK("collapse_kernel");
  return {};
}

// ---- dynamic H collapse, one pass over X (sm_90 clusters) ---------------------------------------
template <class T>
struct DynGeom {
  int64_t m = 0, q = 0, pitch = 0;
  size_t smem = 0;
};
template <class T>
DynGeom<T> dyn_geom(const MhcProblem& p, bool mma = false) {
  constexpr int64_t vec = 16 / sizeof(T);
  DynGeom<T> g;
  g.m = kDynTg * dyn_tpl<T>();
  g.q = p.channels / vec;
  const int64_t cw_max = (g.q + kDynCtas - 1) / kDynCtas * vec;
  // Rows 16 bytes past a multiple of 128: the 8 token rows a warp reads at once hit distinct
  // banks, and every 16-byte chunk stays aligned for cp.async.
  // MMA: rows 16 elements past a multiple of 128 bytes, for the 8 rows x 4 lanes of its fragment
  // loads.
  const int64_t pad = mma ? 16 * static_cast<int64_t>(sizeof(T)) : 16;
  const int64_t row_bytes =
      (p.n * cw_max * static_cast<int64_t>(sizeof(T)) + 127) / 128 * 128 + pad;
  g.pitch = row_bytes / static_cast<int64_t>(sizeof(T));
  g.smem = dyn_smem_bytes<T>(g.m, g.pitch, p.n, p.k);
  return g;
}
// Depends on (n, C, dtype) and the device only, never on the token count (bit-stability).
template <DType D, bool MMA = false>
bool fits_collapse_cluster(const MhcProblem& p, const DeviceCaps& caps) {
  using T = cuda::device_t<D>;
  if (p.h != MhcH::dynamic_h || caps.sm < 90) return false;
  if (p.channels % static_cast<int64_t>(16 / sizeof(T))) return false;
  if (MMA && p.channels % 128) return false;  // every slice a multiple of 16 per stream
  if (p.n * p.channels > (int64_t{1} << 24)) return false;  // keeps the slice math in int
  return static_cast<int64_t>(dyn_geom<T>(p, MMA).smem) <= caps.smem_per_block_optin;
}

// The comb part of the coefficient rows the one-pass kernels leave as logits: Sinkhorn per row, in
// one thread's registers for n = 4, an element per lane where n * n <= 32, else one thread per row
// in shared memory (the same bits in all three).
inline Status run_comb_sinkhorn(std::string_view op, cudaStream_t s, const MhcProblem& p,
                                const DynArgs& da) {
  if (p.n == 4) {
    comb_sinkhorn_regs_kernel<4><<<blocks_for(p.tokens, 64), 64, 0, s>>>(
        da.co, da.co_stride, p.tokens, sinkhorn_params(p.sinkhorn));
    MHC_CHECK("comb_sinkhorn_regs_kernel");
    return {};
  }
  if (p.n * p.n <= 32) {
    comb_sinkhorn_lanes_kernel<<<blocks_for(p.tokens, kCombWarps), kCombWarps * 32, 0, s>>>(
        da.co, da.co_stride, p.tokens, da.n, sinkhorn_params(p.sinkhorn));
    MHC_CHECK("comb_sinkhorn_lanes_kernel");
    return {};
  }
  const int slot_bytes = activate_slot(da.n) * static_cast<int>(sizeof(float));
  const int threads = row_kernel_threads(slot_bytes);
  comb_sinkhorn_kernel<<<blocks_for(p.tokens, threads), threads, threads * slot_bytes, s>>>(
      da.co, da.co_stride, p.tokens, da.n, sinkhorn_params(p.sinkhorn));
  MHC_CHECK("comb_sinkhorn_kernel");
  return {};
}
// A launch of `ctas`-CTA clusters with `smem` bytes of dynamic shared memory (the kernel's limit
// raised once per device, core's ensure_dynamic_smem), and how many such clusters are resident at
// once: the GPCs decide, not sm_count / ctas (a cluster that does not fit would run in a second
// wave). The count depends on the device and the shared-memory size only, so it is cached under
// both in the caller's `cache` (the query costs host time per run); 0 where none fits. Clusters of
// more than 8 CTAs are allowed on the kernel (non-portable), once per device.
struct ClusterLaunch {
  cudaLaunchAttribute attr[1] = {};
  cudaLaunchConfig_t cfg = {};
  int64_t resident = 0;
};
template <class Kernel>
Status cluster_launch(std::string_view op, const LaunchContext& ctx, Kernel kernel, int ctas,
                      int threads, size_t smem, std::atomic<int64_t> (&cache)[16],
                      ClusterLaunch& cl) {
  if (cudaError_t e = cuda::ensure_dynamic_smem(reinterpret_cast<const void*>(kernel), smem);
      e != cudaSuccess)
    return cuda::cuda_error(op, "cluster kernel: cudaFuncSetAttribute (shared memory)", e);
  if (ctas > 8)
    if (cudaError_t e = cuda::ensure_nonportable_clusters(reinterpret_cast<const void*>(kernel));
        e != cudaSuccess)
      return cuda::cuda_error(op, "cluster kernel: cudaFuncSetAttribute (cluster size)", e);
  cl.attr[0].id = cudaLaunchAttributeClusterDimension;
  cl.attr[0].val.clusterDim.x = static_cast<unsigned>(ctas);
  cl.attr[0].val.clusterDim.y = 1, cl.attr[0].val.clusterDim.z = 1;
  cl.cfg.blockDim = dim3(static_cast<unsigned>(threads));
  cl.cfg.dynamicSmemBytes = smem;
  cl.cfg.stream = cuda::stream_of(ctx);
  cl.cfg.attrs = cl.attr, cl.cfg.numAttrs = 1;
  const int dev = ctx.stream.device();
  const int64_t key = static_cast<int64_t>(smem) << 8;
  cl.resident = 0;
  if (dev >= 0 && dev < 16) {
    const int64_t c = cache[dev].load(std::memory_order_relaxed);
    if ((c & ~int64_t{0xff}) == key) cl.resident = c & 0xff;
  }
  if (cl.resident == 0) {
    cl.cfg.gridDim = dim3(static_cast<unsigned>(ctas));  // the query's grid: one cluster
    int n = 0;
    if (cudaError_t e = cudaOccupancyMaxActiveClusters(&n, kernel, &cl.cfg); e != cudaSuccess)
      return cuda::cuda_error(op, "cudaOccupancyMaxActiveClusters", e);
    cl.resident = std::min(n, 255);
    if (n > 0 && dev >= 0 && dev < 16)
      cache[dev].store(key | cl.resident, std::memory_order_relaxed);
  }
  return {};
}
// Launches the persistent clusters (never more than one per tile), then finishes the comb rows
// the kernel left as logits.
template <class Kernel, class... Args>
Status run_clusters(std::string_view op, const char* name, ClusterLaunch& cl, Kernel kernel,
                    const MhcProblem& p, const DynArgs& da, const Args&... args) {
  const int64_t ctas = cl.attr[0].val.clusterDim.x;
  cl.cfg.gridDim = dim3(static_cast<unsigned>(std::min<int64_t>(cl.resident, da.tiles) * ctas));
  if (cudaError_t e = cudaLaunchKernelEx(&cl.cfg, kernel, args...); e != cudaSuccess)
    return cuda::cuda_error(op, name, e);
  BARACUDA_TRY(cuda::check_launch(op, name));
  return run_comb_sinkhorn(op, cl.cfg.stream, p, da);
}
// X and y in 16-byte vectors and fn rows aligned to `fn_floats` floats: the layouts the one-pass
// cluster kernels read and write with vector accesses. Others take the split-K path (whose bits
// differ; the choice depends on alignment, never on the token count).
template <class T>
bool cluster_layout_ok(const MhcProblem& p, const MhcCollapseOp::Arguments& a, int fn_floats) {
  return vec_ok<T>(p.channels, {a.x.data, a.y.data},
                   {a.x.stride[0], a.x.stride[1], a.y.stride[0]}) &&
         reinterpret_cast<uintptr_t>(a.params.fn.data) % (4 * fn_floats) == 0 &&
         a.params.fn.stride[0] % fn_floats == 0;
}
// The fields every one-pass cluster kernel reads, for tiles of `tile_tokens` tokens.
inline DynArgs dyn_args(const MhcProblem& p, const MhcCollapseOp::Arguments& a,
                        int64_t tile_tokens) {
  const MhcParams& w = a.params;
  DynArgs da;
  da.tokens = p.tokens, da.channels = p.channels;
  da.tiles = (p.tokens + tile_tokens - 1) / tile_tokens;
  da.x_st = a.x.stride[0], da.x_si = a.x.stride[1], da.y_st = a.y.stride[0];
  da.co_stride = a.coeffs.stride[0];
  da.n = static_cast<int>(p.n), da.k = static_cast<int>(p.k);
  da.fn = static_cast<const float*>(w.fn.data), da.fn_stride = w.fn.stride[0];
  da.scale = static_cast<const float*>(w.scale.data);
  da.base = static_cast<const float*>(w.base.data);
  da.inv_flat = static_cast<float>(1.0 / static_cast<double>(p.flat));
  da.norm_eps = static_cast<float>(p.norm_eps), da.pre_eps = static_cast<float>(p.pre_eps);
  da.co = static_cast<float*>(a.coeffs.data);
  return da;
}
template <class T, bool STAGGER, bool MMA = false>
Status collapse_cluster(const LaunchContext& ctx, const MhcProblem& p,
                        const MhcCollapseOp::Arguments& a) {
  constexpr std::string_view op = MhcCollapseOp::name;
  if (p.tokens == 0) return {};
  if (!cluster_layout_ok<T>(p, a, 4)) return collapse<T>(ctx, p, a);  // 16-byte fn loads
  const DynGeom<T> g = dyn_geom<T>(p, MMA);
  auto* kernel = dyn_collapse_kernel<T, dyn_tpl<T>(), MMA>;
  DynArgs da = dyn_args(p, a, g.m);
  da.q = static_cast<int>(g.q), da.pitch = static_cast<int>(g.pitch);
  static std::atomic<int64_t> cache[16];
  ClusterLaunch cl;
  BARACUDA_TRY(cluster_launch(op, ctx, kernel, kDynCtas, kDynThreads, g.smem, cache, cl));
  if (cl.resident < 1) return collapse<T>(ctx, p, a);
  const int64_t clusters = cl.resident;
  // A quarter of the time one CTA's tile takes to arrive when every SM loads at once (about
  // 23 bytes/ns per SM on an H100); only worth it when each cluster runs several tiles.
  if (STAGGER && da.tiles >= 2 * clusters)
    da.stagger_ns = static_cast<unsigned>(
        std::min<int64_t>(g.m * p.n * (g.q * (16 / static_cast<int64_t>(sizeof(T))) / kDynCtas) *
                              static_cast<int64_t>(sizeof(T)) / 92,
                          50000));
  return run_clusters(op, "dyn_collapse_kernel", cl, kernel, p, da, static_cast<T*>(a.y.data),
                      static_cast<const T*>(a.x.data), da);
}

// ---- dynamic H collapse, one pass over X on 16-CTA clusters (collapse_cluster16.cuh) ----------
// M m-tiles of 16 tokens a tile; slots in the ring: as many tiles as the shared memory holds, up
// to kC16MaxSlots. n = 4 and C in {1024, 2048, 4096} (KS = C / 256 k-steps a warp, 6 KS fn
// registers a thread); depends on (n, C, dtype) and the device only, never on the token count
// (bit-stability).
template <class T, int M>
int64_t c16_push_slots(const MhcProblem& p, const DeviceCaps& caps) {
  return std::min<int64_t>(kC16MaxSlots, (caps.smem_per_block_optin - C16Push<M>::kFixedBytes) /
                                             c16_push_slot_bytes<T, M>(p.channels));
}
template <DType D, int M>
bool fits_collapse_push16(const MhcProblem& p, const DeviceCaps& caps) {
  using T = cuda::device_t<D>;
  if (p.h != MhcH::dynamic_h || caps.sm < 90 || p.n != kC16N) return false;
  if (p.channels != 1024 && p.channels != 2048 && p.channels != 4096) return false;
  return c16_push_slots<T, M>(p, caps) >= 3;
}
template <class T, int M>
Status collapse_push16(const LaunchContext& ctx, const MhcProblem& p,
                       const MhcCollapseOp::Arguments& a) {
  constexpr std::string_view op = MhcCollapseOp::name;
  if (p.tokens == 0) return {};
  if (!cluster_layout_ok<T>(p, a, 2)) return collapse<T, true>(ctx, p, a);  // 8-byte fn loads
  DynArgs da = dyn_args(p, a, C16Push<M>::TOK);
  da.slots = static_cast<int>(c16_push_slots<T, M>(p, ctx.stream.caps()));
  auto* kernel = p.channels == 4096   ? collapse_push16_kernel<T, 16, M>
                 : p.channels == 2048 ? collapse_push16_kernel<T, 8, M>
                                      : collapse_push16_kernel<T, 4, M>;
  const size_t smem = static_cast<size_t>(c16_push_smem_bytes<T, M>(p.channels, da.slots));
  // X as a 3-d tensor (channel, token, stream) read in boxes of 128 bytes x TOK tokens x n
  // streams, 128-byte swizzled (C16Geom).
  CUtensorMap xmap;
  {
    const auto encode = cuda::tensor_map_encode_fn();
    constexpr int64_t E = sizeof(T);
    const cuuint64_t dims[3] = {static_cast<cuuint64_t>(p.channels),
                                static_cast<cuuint64_t>(p.tokens), kC16N};
    const cuuint64_t strides[2] = {static_cast<cuuint64_t>(da.x_st * E),
                                   static_cast<cuuint64_t>(da.x_si * E)};
    const cuuint32_t box[3] = {128 / E, C16Push<M>::TOK, kC16N}, estr[3] = {1, 1, 1};
    const CUtensorMapDataType dt = cuda::tensor_map_dtype<T>();
    if (!encode || p.tokens > INT32_MAX ||
        encode(&xmap, dt, 3, const_cast<void*>(a.x.data), dims, strides, box, estr,
               CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
               CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
               CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS)
      return collapse<T, true>(ctx, p, a);  // no tensor map for this X: the split kernel
  }
  static std::atomic<int64_t> cache[16];
  ClusterLaunch cl;
  BARACUDA_TRY(cluster_launch(op, ctx, kernel, kC16Ctas, kC16Threads, smem, cache, cl));
  if (cl.resident < 1) return collapse<T, true>(ctx, p, a);
  return run_clusters(op, "collapse_push16_kernel", cl, kernel, p, da, static_cast<T*>(a.y.data),
                      xmap, da);
}

// ---- expand
// -------------------------------------------------------------------------------------------
template <class T>
Status expand(const LaunchContext& ctx, const MhcProblem& p, const MhcExpandOp::Arguments& a) {
  constexpr std::string_view op = MhcExpandOp::name;
  const cudaStream_t s = cuda::stream_of(ctx);
  if (p.tokens == 0) return {};
  EwArgs e;
  e.tokens = p.tokens, e.channels = p.channels, e.n = static_cast<int>(p.n);
  e.k = static_cast<int>(p.k);
  e.x_st = a.x.stride[0], e.x_si = a.x.stride[1];
  e.y_st = a.out.stride[0], e.y_si = a.out.stride[1], e.z_st = a.f.stride[0];
  e.co = static_cast<const float*>(a.coeffs.data);
  e.co_stride = p.rows == 1 ? 0 : a.coeffs.stride[0];
  T* out = static_cast<T*>(a.out.data);
  const T* x = static_cast<const T*>(a.x.data);
  const T* f = static_cast<const T*>(a.f.data);
  constexpr int vec = 16 / sizeof(T);
  if (vec_ok<T>(p.channels, {a.x.data, a.out.data, a.f.data},
                {e.x_st, e.x_si, e.y_st, e.y_si, e.z_st})) {
    e.cvecs = p.channels / vec;
    if (p.n <= 4)
      expand_kernel<T, vec, 4>
          <<<blocks_for(p.tokens * e.cvecs, kEwThreads), kEwThreads, 0, s>>>(out, x, f, e);
    else
      expand_kernel<T, vec>
          <<<blocks_for(p.tokens * e.cvecs, kEwThreads), kEwThreads, 0, s>>>(out, x, f, e);
  } else {
    e.cvecs = p.channels;
    expand_kernel<T, 1>
        <<<blocks_for(p.tokens * e.cvecs, kEwThreads), kEwThreads, 0, s>>>(out, x, f, e);
  }
  MHC_CHECK("expand_kernel");
  return {};
}

// ---- expand backward
// ------------------------------------------------------------------------------------
template <class T>
Status expand_backward(const LaunchContext& ctx, const MhcProblem& p,
                       const MhcExpandBackwardOp::Arguments& a) {
  constexpr std::string_view op = MhcExpandBackwardOp::name;
  const cudaStream_t s = cuda::stream_of(ctx);
  const bool stat = p.h == MhcH::static_h;
  float* partial = static_cast<float*>(ctx.workspace.data);
  if (p.tokens > 0) {
    EwArgs e;
    e.tokens = p.tokens, e.channels = p.channels, e.n = static_cast<int>(p.n);
    e.k = static_cast<int>(p.k);
    e.x_st = a.dout.stride[0], e.x_si = a.dout.stride[1];
    e.y_st = a.dx.stride[0], e.y_si = a.dx.stride[1], e.z_st = a.df.stride[0];
    e.co = static_cast<const float*>(a.coeffs.data);
    e.co_stride = stat ? 0 : a.coeffs.stride[0];
    T* dx = static_cast<T*>(a.dx.data);
    T* df = static_cast<T*>(a.df.data);
    const T* dout = static_cast<const T*>(a.dout.data);
    constexpr int vec = 16 / sizeof(T);
    if (vec_ok<T>(p.channels, {a.dx.data, a.df.data, a.dout.data},
                  {e.x_st, e.x_si, e.y_st, e.y_si, e.z_st})) {
      e.cvecs = p.channels / vec;
      expand_bwd_kernel<T, vec>
          <<<blocks_for(p.tokens * e.cvecs, kEwThreads), kEwThreads, 0, s>>>(dx, df, dout, e);
    } else {
      e.cvecs = p.channels;
      expand_bwd_kernel<T, 1>
          <<<blocks_for(p.tokens * e.cvecs, kEwThreads), kEwThreads, 0, s>>>(dx, df, dout, e);
    }
    MHC_CHECK("expand_bwd_kernel");
    DotArgs d;
    d.tokens = p.tokens, d.channels = p.channels, d.n = static_cast<int>(p.n);
    d.outputs = static_cast<int>(p.n + p.n * p.n), d.mode = 0;
    d.a_st = a.dout.stride[0], d.a_si = a.dout.stride[1], d.b_st = a.f.stride[0];
    d.x_st = a.x.stride[0], d.x_si = a.x.stride[1];
    d.out = stat ? partial : static_cast<float*>(a.dcoeffs.data);
    d.out_stride = stat ? p.k : a.dcoeffs.stride[0];
    token_dot_kernel<T><<<static_cast<unsigned>(p.tokens), kDotThreads, 0, s>>>(
        dout, static_cast<const T*>(a.f.data), static_cast<const T*>(a.x.data), d);
    MHC_CHECK("token_dot_kernel");
  }
  if (stat) {  // one row: the per-token partials summed in a fixed order
    ColSumArgs cs;
    cs.rows = p.tokens, cs.cols = p.k, cs.src_stride = p.k, cs.src = partial;
    cs.dst = static_cast<float*>(a.dcoeffs.data);
    BARACUDA_TRY(run_colsum(op, s, cs));
  }
  return {};
}

// ---- collapse backward
// -----------------------------------------------------------------------------------
__global__ void copy_static_grads_kernel(int n, const float* dl, float* dpre, float* dpost,
                                         float* dres, int64_t dres_stride) {
  const int id = blockIdx.x * blockDim.x + threadIdx.x;
  if (id < n) dpre[id] = dl[id], dpost[id] = dl[n + id];
  if (id < n * n) dres[(id / n) * dres_stride + id % n] = dl[2 * n + id];
}

template <class T>
Status collapse_backward(const LaunchContext& ctx, const MhcProblem& p,
                         const MhcCollapseBackwardOp::Arguments& a) {
  constexpr std::string_view op = MhcCollapseBackwardOp::name;
  const cudaStream_t s = cuda::stream_of(ctx);
  const bool stat = p.h == MhcH::static_h;
  Carver c{static_cast<char*>(ctx.workspace.data)};
  const CollapseBwdWs w = carve_collapse_bwd(p, c);
  const T* x = static_cast<const T*>(a.x.data);
  const T* dy = static_cast<const T*>(a.dy.data);
  ActivateArgs act;
  if (stat) {
    act = activate_static(p, a.params);
  } else {
    BARACUDA_TRY(run_logits<T>(op, s, p, a.x, a.params, w.g, w.ss));
    act = activate_dynamic(p, a.params, w.g, w.ss);
  }
  act.out = w.coeffs, act.out_stride = p.k, act.logits = w.logits, act.trace = w.trace;
  BARACUDA_TRY(run_activate(op, s, act));
  if (p.tokens > 0) {
    DotArgs d;
    d.tokens = p.tokens, d.channels = p.channels, d.n = static_cast<int>(p.n);
    d.outputs = static_cast<int>(p.n), d.mode = 1;
    d.b_st = a.dy.stride[0], d.x_st = a.x.stride[0], d.x_si = a.x.stride[1];
    d.out = w.dpre, d.out_stride = p.n;
    token_dot_kernel<T><<<static_cast<unsigned>(p.tokens), kDotThreads, 0, s>>>(nullptr, dy, x, d);
    MHC_CHECK("token_dot_kernel");
  }
  const float* dpre = w.dpre;
  if (stat) {
    ColSumArgs cs;
    cs.rows = p.tokens, cs.cols = p.n, cs.src_stride = p.n, cs.src = w.dpre, cs.dst = w.dpre_sum;
    BARACUDA_TRY(run_colsum(op, s, cs));
    dpre = w.dpre_sum;
  }
  if (p.rows > 0) {
    combine_dc_kernel<<<blocks_for(p.rows * p.k, 256), 256, 0, s>>>(
        p.rows, static_cast<int>(p.n), static_cast<int>(p.k),
        static_cast<const float*>(a.dcoeffs.data), a.dcoeffs.stride[0], dpre, w.dc);
    MHC_CHECK("combine_dc_kernel");
    ActivateBwdArgs ab;
    ab.rows = p.rows, ab.n = static_cast<int>(p.n), ab.k = static_cast<int>(p.k);
    ab.logits = w.logits, ab.dc = w.dc, ab.trace = w.trace, ab.dl = w.dl;
    ab.sk = sinkhorn_params(p.sinkhorn);
    activate_backward_kernel<<<blocks_for(p.rows, 128), 128, 0, s>>>(ab);
    MHC_CHECK("activate_backward_kernel");
  }
  DxArgs dxa;
  dxa.tokens = p.tokens, dxa.channels = p.channels, dxa.n = static_cast<int>(p.n);
  dxa.k = static_cast<int>(p.k);
  dxa.co = w.coeffs, dxa.co_stride = stat ? 0 : p.k;
  dxa.dx_st = a.dx.stride[0], dxa.dx_si = a.dx.stride[1], dxa.dy_st = a.dy.stride[0];
  dxa.x_st = a.x.stride[0], dxa.x_si = a.x.stride[1];
  if (stat) {
    copy_static_grads_kernel<<<blocks_for(p.n * p.n, 256), 256, 0, s>>>(
        static_cast<int>(p.n), w.dl, static_cast<float*>(a.grads.h_pre.data),
        static_cast<float*>(a.grads.h_post.data), static_cast<float*>(a.grads.h_res.data),
        a.grads.h_res.stride[0]);
    MHC_CHECK("copy_static_grads_kernel");
  } else {
    if (p.tokens > 0) {
      TokenBwdArgs tb;
      tb.tokens = p.tokens, tb.n = static_cast<int>(p.n), tb.k = static_cast<int>(p.k);
      tb.inv_flat = static_cast<float>(1.0 / static_cast<double>(p.flat));
      tb.norm_eps = static_cast<float>(p.norm_eps);
      tb.g = w.g, tb.ss = w.ss, tb.dl = w.dl;
      tb.scale = static_cast<const float*>(a.params.scale.data);
      tb.dgk = w.dgk, tb.coef = w.coef, tb.part = w.part;
      token_backward_kernel<<<blocks_for(p.tokens, 128), 128, 0, s>>>(tb);
      MHC_CHECK("token_backward_kernel");
    }
    ColSumArgs cs;
    cs.rows = p.tokens, cs.cols = 3, cs.src_stride = 3, cs.src = w.part;
    cs.dst = static_cast<float*>(a.grads.scale.data);
    BARACUDA_TRY(run_colsum(op, s, cs));
    cs.cols = p.k, cs.src_stride = p.k, cs.src = w.dl;
    cs.dst = static_cast<float*>(a.grads.base.data);
    BARACUDA_TRY(run_colsum(op, s, cs));
    DfnArgs df;
    df.tokens = p.tokens, df.flat = p.flat, df.channels = p.channels;
    df.x_st = a.x.stride[0], df.x_si = a.x.stride[1], df.k = static_cast<int>(p.k);
    df.dgk = w.dgk, df.dfn = static_cast<float*>(a.grads.fn.data);
    df.dfn_stride = a.grads.fn.stride[0];
    dfn_kernel<T>
        <<<dim3(blocks_for(p.flat, kEwThreads), blocks_for(p.k, kDfnK)), kEwThreads, 0, s>>>(x, df);
    MHC_CHECK("dfn_kernel");
    dxa.fn = static_cast<const float*>(a.params.fn.data);
    dxa.fn_stride = a.params.fn.stride[0];
    dxa.dgk = w.dgk, dxa.coef = w.coef;
  }
  if (p.tokens > 0) {
    collapse_dx_kernel<T><<<blocks_for(p.tokens * p.flat, kEwThreads), kEwThreads, 0, s>>>(
        static_cast<T*>(a.dx.data), dy, x, dxa);
    MHC_CHECK("collapse_dx_kernel");
  }
  return {};
}
#undef MHC_CHECK

// ---- registration
// ---------------------------------------------------------------------------------------
constexpr PrecisionGuarantee kForward{MathPrecision::f32, DType::f32, true, true};
// The tensor-core dynamic collapse: products in 3xTF32 (f32 X) / 2xTF32 (16-bit X, exact in tf32),
// each 16-element block summed on the tensor cores, whose f32 adds truncate. Near f32 on the
// tested inputs (docs/perf/mhc.md) but not f32 on every input, so it claims tf32.
constexpr PrecisionGuarantee kForwardTf32{MathPrecision::tf32, DType::f32, true, true};
// Parameter gradients sum over tokens: the order is fixed but depends on the token count.
constexpr PrecisionGuarantee kBackward{MathPrecision::f32, DType::f32, true, false};

template <DType D>
bool register_mhc_cuda() {
  using T = cuda::device_t<D>;
  auto sku = [](std::string_view op, DType aux, PrecisionGuarantee pg, std::string_view nm,
                Arch arch = Arch::sm80) {
    return KernelSku{.category = "hyper_connection",
                     .op = op,
                     .element = D,
                     .aux_element = aux,
                     .layout = "strided",
                     .arch = arch,
                     .backend = Backend::bespoke_cuda,
                     .precision = pg,
                     .name = nm};
  };
  register_kernel<MhcStaticForwardOp>(
      {.sku = sku(MhcStaticForwardOp::name, DType::bf16, kForward, "static_forward_fused"),
       .priority = 10,
       .workspace = ws_static_forward,
       .launch = static_forward<T>});
  // One token per CTA (H100, 16384 x 4 x 4096, 4a7f9cd): staged in shared memory f32 0.743 ms
  // (96% of copy), bf16 0.382 ms (94%); from registers f32 0.737 ms (97%), bf16 0.526 ms (68%:
  // three CTAs per SM and spills). The staged kernel is the default wherever a token fits a
  // block's shared memory; the register kernel stays pinnable (A/B).
  register_kernel<MhcStaticForwardOp>(
      {.sku = sku(MhcStaticForwardOp::name, DType::bf16, kForward, "static_forward_regs"),
       .priority = 5,
       .fits = fits_static_regs<D>,
       .workspace = ws_static_forward,
       .launch = static_forward_token<T>});
  register_kernel<MhcStaticForwardOp>(
      {.sku = sku(MhcStaticForwardOp::name, DType::bf16, kForward, "static_forward_staged"),
       .priority = 25,
       .fits = fits_static_staged<D>,
       .workspace = ws_static_forward,
       .launch = static_forward_token<T, true>});
  register_kernel<MhcCollapseOp>({.sku = sku(MhcCollapseOp::name, DType::f32, kForward, "collapse"),
                                  .priority = 10,
                                  .workspace = ws_collapse,
                                  .launch = collapse<T>});
  // Dynamic H. Priorities follow the H100 measurements at 16384 x 4 x 4096 (docs/perf/mhc.md):
  // the one-pass 16-CTA kernels with fn in registers where they fit (below), then split-K with its
  // logits on tensor cores (collapse_split_tf32, below, every dynamic shape: f32 0.907 ms, bf16
  // 0.540 ms at 7f38974); then the one-pass sm_90 cluster kernels, tensor
  // cores where they fit (C % 128 == 0; f32 1.04 ms, bf16 0.66 ms), the CUDA-core one for 16-bit
  // data (bf16 1.17 ms against CUDA-core split-K's 1.62); for f32 CUDA-core split-K (1.77 ms)
  // over the CUDA-core cluster kernel (1.86). The split-K "collapse" stays registered for static
  // H and every shape.
  constexpr bool wide = D == DType::f32;  // 4-byte data: split-K is as fast as the cluster kernel
  register_kernel<MhcCollapseOp>({.sku = sku(MhcCollapseOp::name, DType::f32, kForward,
                                             "collapse_dynamic_cluster", Arch::sm90),
                                  .priority = wide ? 8 : 20,
                                  .fits = fits_collapse_cluster<D>,
                                  .workspace = ws_collapse,
                                  .launch = collapse_cluster<T, true>});
  // The same kernel with every cluster starting at once (A/B of the staggered start).
  register_kernel<MhcCollapseOp>({.sku = sku(MhcCollapseOp::name, DType::f32, kForward,
                                             "collapse_dynamic_cluster_lockstep", Arch::sm90),
                                  .priority = wide ? 7 : 15,
                                  .fits = fits_collapse_cluster<D>,
                                  .workspace = ws_collapse,
                                  .launch = collapse_cluster<T, false>});
  // The cluster kernel's products on tensor cores (3xTF32 / 2xTF32).
  register_kernel<MhcCollapseOp>({.sku = sku(MhcCollapseOp::name, DType::f32, kForwardTf32,
                                             "collapse_dynamic_cluster_tf32", Arch::sm90),
                                  .priority = 30,
                                  .fits = fits_collapse_cluster<D, true>,
                                  .workspace = ws_collapse,
                                  .launch = collapse_cluster<T, true, true>});
  // One pass on 16-CTA clusters with fn in registers and the partials pushed (n = 4, C in {1024,
  // 2048, 4096}, sm_90): the default where it fits, 32-token tiles for bf16. H100, 16384 x 4 x
  // 4096, e764cd8, two runs: f32 0.539-0.547 ms (16-token tiles), bf16 0.275-0.276 (32-token;
  // 16-token 0.299-0.301) against the split kernel's 0.907 / 0.540 and one pass over X (the
  // static collapse) 0.434 / 0.219. f16 keeps the 16-token tiles: its 32-token form spills.
  constexpr bool kBf16 = D == DType::bf16;
  auto push = [&](auto m_tiles, std::string_view name, int priority) {
    constexpr int M = decltype(m_tiles)::value;
    register_kernel<MhcCollapseOp>(
        {.sku = sku(MhcCollapseOp::name, DType::f32, kForwardTf32, name, Arch::sm90),
         .priority = priority,
         .fits = fits_collapse_push16<D, M>,
         .workspace = ws_collapse,
         .launch = collapse_push16<T, M>});
  };
  push(std::integral_constant<int, 1>{}, "collapse_dynamic_push16_tf32", kBf16 ? 4 : 45);
  if constexpr (D != DType::f32)
    push(std::integral_constant<int, 2>{}, "collapse_dynamic_push32_tf32", kBf16 ? 45 : 3);
  // Two passes over X with the logits on tensor cores (any arch with TF32 mma.sync): the default
  // elsewhere.
  register_kernel<MhcCollapseOp>(
      {.sku = sku(MhcCollapseOp::name, DType::f32, kForwardTf32, "collapse_split_tf32"),
       .priority = 40,
       .fits = [](const MhcProblem& p,
                  const DeviceCaps& caps) { return p.h == MhcH::dynamic_h && caps.sm >= 80; },
       .workspace = ws_collapse,
       .launch = collapse<T, true>});
  register_kernel<MhcExpandOp>({.sku = sku(MhcExpandOp::name, DType::f32, kForward, "expand"),
                                .priority = 10,
                                .launch = expand<T>});
  register_kernel<MhcExpandBackwardOp>(
      {.sku = sku(MhcExpandBackwardOp::name, DType::f32, kBackward, "expand_backward"),
       .priority = 10,
       .workspace = ws_expand_bwd,
       .launch = expand_backward<T>});
  register_kernel<MhcCollapseBackwardOp>(
      {.sku = sku(MhcCollapseBackwardOp::name, DType::f32, kBackward, "collapse_backward"),
       .priority = 10,
       .workspace = ws_collapse_bwd,
       .launch = collapse_backward<T>});
  return true;
}

}  // namespace
}  // namespace baracuda::mhc_cuda
