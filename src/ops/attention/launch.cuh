// Host side of the attention kernels: argument packing, launch shapes, the split-K choice, the
// tensor-core alignment check with its SIMT fallback, and the registration of one dtype's kernels.
#pragma once

#include <string>
#include <type_traits>

#include "ops/attention/kernels.cuh"

namespace baracuda::attention::kernels {

template <class Ptr>
inline void all_strides(const BasicTensor<Ptr>& t, int64_t* s) {
  for (int i = 0; i < 3; ++i) s[i] = i < t.rank ? t.stride[i] : 0;
}

inline Params fwd_params(const Problem& pr, const ForwardArguments& a) {
  Params p = make_params(pr);
  p.q = a.q.data, p.k = a.k.data, p.v = a.v.data, p.out = a.y.data, p.lse = a.lse.data;
  strides3(a.q, p.sq), strides3(a.k, p.sk), strides3(a.v, p.sv), strides3(a.y, p.sy);
  all_strides(a.lse, p.sl);
  p.cu_q = static_cast<const int32_t*>(a.cu_seqlens_q.data);
  p.cu_k = static_cast<const int32_t*>(a.cu_seqlens_k.data);
  if (!pr.desc.varlen) p.cu_q = p.cu_k = nullptr;
  p.used_k = pr.desc.seqused_k ? static_cast<const int32_t*>(a.seqused_k.data) : nullptr;
  if (pr.desc.page_size > 0) {
    p.block_table = static_cast<const int32_t*>(a.block_table.data);
    p.table_cols = static_cast<int>(shapes_of(pr).block_table[1]);
    p.page_size = static_cast<int>(pr.desc.page_size);
    p.pages = static_cast<int>(pr.desc.pages);
  }
  return p;
}

inline unsigned row_blocks(int64_t rows) {
  return static_cast<unsigned>(cuda::ceil_div(rows, 4));
}

template <class T, class A>
Status launch_fwd_simt(const LaunchContext& ctx, const Problem& pr, const ForwardArguments& a) {
  const Params p = fwd_params(pr, a);
  const int64_t rows = int64_t{p.batch} * p.heads_q * p.len_q;
  if (rows == 0) return {};
  flash_fwd_simt<T, A><<<row_blocks(rows), 128, 0, cuda::stream_of(ctx)>>>(p);
  return cuda::check_launch(ForwardOp::name, "flash_fwd_simt");
}

// ---- tensor-core forward ----------------------------------------------------------------------
inline int mma_dim(const Problem& pr) {
  const int64_t d = std::max(pr.desc.head_dim_qk, pr.desc.head_dim_v);
  return d <= 64 ? 64 : d <= 128 ? 128 : 256;
}
// Calls f(std::integral_constant<int, D>{}) with the problem's padded head dim D (64, 128, 256).
template <class F>
decltype(auto) with_mma_dim(const Problem& pr, F&& f) {
  switch (mma_dim(pr)) {
    case 64:
      return f(std::integral_constant<int, 64>{});
    case 128:
      return f(std::integral_constant<int, 128>{});
    default:
      return f(std::integral_constant<int, 256>{});
  }
}
inline bool mma_dims_ok(const Problem& pr) {
  return pr.desc.head_dim_qk % 8 == 0 && pr.desc.head_dim_v % 8 == 0;
}
// The tensor-core backward's row kernels index query rows (B * Hq * Lq) in 32 bits.
inline bool bwd_rows_fit(const Problem& pr) {
  return pr.desc.batch * pr.desc.heads_q * pr.desc.len_q < (int64_t{1} << 31);
}
// Launch shapes per padded head dim (4 warps each): rows per CTA, keys per tile, m16 tiles per
// warp. D = 256 keeps one m16 tile per warp and Q in shared memory to stay within 255 registers.
template <int D>
struct MmaShape {
  static constexpr int kNW = 4, kBN = D == 64 ? 64 : 32, kMT = D == 256 ? 1 : 2;
  static constexpr bool kQReg = D == 64;
  static constexpr bool kOvl = false;
  static constexpr int kStr = 0;
  static constexpr int kRows = 16 * kNW * kMT;
  static constexpr bool kPipe = false, kLateRefill = false;  // (see MmaShapeM32SWide)
};
// The A/B alternative (flash_fwd_mma_m16_sm80): one m16 tile per warp (64-row CTAs) and 64-key
// tiles at D = 64 and 128. MT = 2 with BN = 32 sits at 253-255 registers at D = 128, which leaves
// ptxas no room to overlap the next k-step's ldmatrix with the mma chain; MT = 1 needs ~231 with Q
// in registers and halves the per-key softmax/rescale overhead (BN 32 -> 64), at the cost of
// reading each K/V tile from shared memory once per 16 rows instead of per 32. D = 256 keeps
// MmaShape.
template <int D>
struct MmaShapeM16 {
  static constexpr int kNW = 4, kBN = D == 256 ? MmaShape<D>::kBN : 64,
                       kMT = D == 256 ? MmaShape<D>::kMT : 1;
  static constexpr bool kQReg = D == 256 ? MmaShape<D>::kQReg : true;
  static constexpr bool kOvl = false;
  static constexpr int kStr = 0;
  static constexpr int kRows = 16 * kNW * kMT;
  static constexpr bool kPipe = false, kLateRefill = D != 256;  // (see after MmaShapeM32SWide)
};
// The same per warp with eight warps (128-row CTAs, 1 per SM at ~229 registers): every K/V tile
// fetched from L2 feeds twice the rows. At FA2-class rates (~300 TFLOP/s at D = 128) 64-row CTAs
// would pull ~4.7 TB/s of K/V from L2, 128-row CTAs half that.
template <int D>
struct MmaShapeM16W8 {
  static constexpr int kNW = D == 256 ? MmaShape<D>::kNW : 8, kBN = MmaShapeM16<D>::kBN,
                       kMT = MmaShapeM16<D>::kMT;
  static constexpr bool kQReg = MmaShapeM16<D>::kQReg;
  static constexpr bool kOvl = false;
  static constexpr int kStr = 0;
  static constexpr int kRows = 16 * kNW * kMT;
  static constexpr bool kPipe = false, kLateRefill = D != 256;
};
// FlashAttention-2's own shape at D = 64 / 128: four warps of two m16 tiles (128-row CTAs, like
// m16w8) and 64-key tiles, Q read from shared memory at every k-step. Every K/V fragment loaded by
// ldmatrix feeds two m16 tiles, so the shared-memory traffic per FLOP is half that of the m16
// shapes (64 B per kFLOP there: at 128 B/clk/SM that alone caps them near 460 TFLOP/s, and the
// ldmatrix issue competes with the mma chain); and four warps per CTA, two CTAs per SM, are
// coupled by half as many barrier partners as m16w8's eight.
template <int D>
struct MmaShapeM32 {
  static constexpr int kNW = 4, kBN = D == 256 ? MmaShape<D>::kBN : 64,
                       kMT = D == 256 ? MmaShape<D>::kMT : 2;
  static constexpr bool kQReg = D == 256 ? MmaShape<D>::kQReg : false;
  static constexpr bool kOvl = false;
  static constexpr int kStr = 0;
  static constexpr int kRows = 16 * kNW * kMT;
  static constexpr bool kPipe = false, kLateRefill = false;
};
// m32 (flash_fwd_mma_m32s_sm80, the family's default at d128) whose tiles without soft-cap or
// mask (the bulk of a long non-causal row) run the straight-line score conversion of the m16
// shapes instead of the per-element branch loop, which splits each unrolled tile into many basic
// blocks and stops ptxas from overlapping ldmatrix, mma and softmax. The second H100 run measured
// m32 at 150.5 TFLOP/s (d128 L4096) where FlashAttention-2 runs this very shape at 331. Masked or
// capped tiles keep the branch loop: straight-line there spilled at MT = 2 (36-76 B at D = 128)
// while the second m16 tile's mmas were predicated; MmaShapeM32SStraight is that variant again
// (no spills since de1b2e0). D = 256 keeps MmaShape.
template <int D>
struct MmaShapeM32S {
  static constexpr int kNW = MmaShapeM32<D>::kNW, kBN = MmaShapeM32<D>::kBN,
                       kMT = MmaShapeM32<D>::kMT;
  static constexpr bool kQReg = MmaShapeM32<D>::kQReg;
  static constexpr bool kOvl = false;
  static constexpr int kStr = D != 256 ? 1 : 0;
  static constexpr int kRows = 16 * kNW * kMT;
  static constexpr bool kPipe = false, kLateRefill = false;
};
// m32s with straight-line score conversion on every tile, masked and soft-capped ones too (MmaCfg's
// STR = 2; m32s keeps the per-element loop there, which spilled when its second m16 tile's mmas
// were predicated; since de1b2e0 this variant compiles without spills at D = 64 and 128).
template <int D>
struct MmaShapeM32SStraight : MmaShapeM32S<D> {
  static constexpr int kStr = D != 256 ? 2 : 0;
};
// m32s over 128-key tiles at D = 64 (FlashAttention-2's own d64 shape: 128 x 128 CTAs of four
// warps): each ldmatrix'd K / V fragment feeds as many FLOPs as at D = 128 with 64-key tiles.
// Its fragments are loaded a step ahead (flash_fwd_mma's PIPE): H100, 9726a86, same call, d64
// unmasked L512..16384: 221 / 255 / 273 / 284 / 294 / 296 TFLOP/s against 216 / 247 / 261 / 271 /
// 280 / 283 without (0.84-1.01x FA2 instead of 0.82-0.96x); 254 registers, no spill (4 bytes
// without). Other head dims launch m32s's kernels.
template <int D>
struct MmaShapeM32SWide : MmaShapeM32S<D> {
  static constexpr int kBN = D == 64 ? 128 : MmaShapeM32S<D>::kBN;
  static constexpr bool kPipe = D == 64;
  static constexpr bool kLateRefill = D == 64;
};
// m32s_n128 with one softmax text (MmaCfg's STR = 3): masked and capped tiles are converted
// straight-line before it instead of through the per-element loop. The d64 default
// (fits_n128m_default). At D = 128 the same text measured even with m32s_straight (H200, 8120dce
// + this change, same call: 0.97-1.16x FA2 against 0.98-1.18x) and spilled 36 bytes, so other head
// dims launch m32s's kernels.
template <int D>
struct MmaShapeM32SWideMasked : MmaShapeM32SWide<D> {
  static constexpr int kStr = D == 64 ? 3 : MmaShapeM32SWide<D>::kStr;
};
// Loading the fragments a step ahead did not pay for the other shapes (H100, 3d21677, same call,
// against FA2's ratio): m16 -5 to +3%, m32s +3-6% at d128 L <= 8192 but -2% at L16384 and -1 to
// -3% at d64, m32s_straight (40 / 68 bytes of spill at D = 128) -2 to -12%; not built (kPipe
// false).
//
// kLateRefill (every shape says, as for kPipe): its K / V stage refill goes after the first Q K^T
// k-step (flash_fwd_mma's LATE). H100, bf16, 3 interleaved rounds a call against the top-of-loop
// refill. The change in every shape (38b28da + 205fba1's loop): m32s_n128m (the d64 default) +2.0%
// L4096 / +2.3% causal, m16 +2.3% / +2.1% (d128 L512 / L4096) and +3.9% (d64 L4096), m16w8 +6.4% /
// +6.2% (d128); lost or nothing: m32s_straight at d128 (L512 0.0%, L4096 -4.5%), m32s (-0.4 to
// +0.9%), m32 (-1.3 to +1.3%), ovl (-1.4 to -3.2%), the plain MmaShape (-5.7% / -8.4% at d128).
// Then only in m16, m16w8 and m32s_n128 / n128m (next call): m32s_n128m +0.3% / +0.6% / +1.3% /
// +1.3% (d64 L512 / L4096 / L4096 causal / L16384), m16 +2.0-4.7% at d64 and +0.4% at d128 L4096,
// m16w8 +7.7% (d128 L4096), m32s_n128 +2.1-4.2%; the other shapes' SASS is unchanged.
//
// m16w8 with S_{t+1} issued before the softmax of S_t (MmaCfg's OVL): the warps' softmax no
// longer leaves the tensor cores idle. 4-stage ring: 160 KB at D = 128, one CTA per SM as m16w8.
template <int D>
struct MmaShapeOvl {
  static constexpr int kNW = MmaShapeM16W8<D>::kNW, kBN = MmaShapeM16W8<D>::kBN,
                       kMT = MmaShapeM16W8<D>::kMT;
  static constexpr bool kQReg = MmaShapeM16W8<D>::kQReg;
  static constexpr bool kOvl = D != 256;
  static constexpr int kStr = 0;
  static constexpr int kRows = 16 * kNW * kMT;
  static constexpr bool kPipe = false, kLateRefill = false;
};
template <template <int> class Sh>
inline int mma_bn(int d) {
  return d == 64 ? Sh<64>::kBN : d == 128 ? Sh<128>::kBN : Sh<256>::kBN;
}
template <template <int> class Sh>
inline int mma_rows(int d) {
  return d == 64 ? Sh<64>::kRows : d == 128 ? Sh<128>::kRows : Sh<256>::kRows;
}

// Keys are split across CTAs only when the (batch, head, query-block) grid cannot fill the GPU
// (decode, short prompts): each split must still keep several tiles to amortize its partial write.
struct Split {
  int splits = 1, tiles_per_split = 0;
};
// GQA packing (a block's rows are the query heads of one K/V head times their queries) where a
// head's rows fill less than a block: decode and short chunks. A group of 16 with 16 rows a head
// takes 4 full 64-row blocks that each stream the K/V head once, instead of 16 quarter-full ones.
template <template <int> class Sh>
inline bool fwd_pack(const Problem& pr) {
  return pr.group > 1 && pr.desc.len_q < mma_rows<Sh>(mma_dim(pr));
}
// Query blocks per (batch, head of the grid): packed, per K/V head over its group's rows.
template <template <int> class Sh>
inline int64_t fwd_blocks(const Problem& pr) {
  const Descriptor& d = pr.desc;
  const int rows = mma_rows<Sh>(mma_dim(pr));
  return fwd_pack<Sh>(pr) ? d.batch * d.heads_kv * cuda::ceil_div(d.len_q * pr.group, rows)
                          : d.batch * d.heads_q * cuda::ceil_div(d.len_q, rows);
}
template <template <int> class Sh>
inline Split fwd_split(const Problem& pr, const DeviceCaps& caps) {
  const Descriptor& d = pr.desc;
  const int bn = mma_bn<Sh>(mma_dim(pr));
  const int64_t blocks = fwd_blocks<Sh>(pr);
  const int64_t tiles = cuda::ceil_div(d.len_k, bn);
  Split s;
  s.tiles_per_split = static_cast<int>(tiles);
  if (blocks == 0 || blocks >= caps.sm_count || tiles < 8) return s;
  // Aim for ~4 blocks per SM: split blocks mostly stream K/V and need company to hide latency.
  const int64_t want =
      std::min<int64_t>({cuda::ceil_div(4 * int64_t{caps.sm_count}, blocks), tiles / 4, 128});
  if (want <= 1) return s;
  s.tiles_per_split = static_cast<int>(cuda::ceil_div(tiles, want));
  s.splits = static_cast<int>(cuda::ceil_div(tiles, s.tiles_per_split));
  return s;
}
template <template <int> class Sh>
size_t fwd_mma_workspace(const Problem& pr, const DeviceCaps& caps) {
  const Split s = fwd_split<Sh>(pr, caps);
  if (s.splits <= 1) return 0;
  const Descriptor& d = pr.desc;
  const int64_t rows = d.batch * d.heads_q * d.len_q;
  return static_cast<size_t>(s.splits * rows * (d.head_dim_v + 1)) * sizeof(float);
}

// cp.async moves 16-byte chunks: every row start must be 16-byte aligned.
template <class Ptr>
inline bool rows_aligned(const BasicTensor<Ptr>& t, size_t elem) {
  if (reinterpret_cast<uintptr_t>(t.data) % 16 != 0) return false;
  for (int i = 0; i < t.rank - 1; ++i)
    if ((t.stride[i] * static_cast<int64_t>(elem)) % 16 != 0) return false;
  return true;
}

// `blocks`: fwd_blocks x the splits.
template <class T, int D, template <int> class Sh, bool kPaged>
Status run_mma(const LaunchContext& ctx, const Params& p, int64_t blocks) {
  using S = Sh<D>;
  using Cfg = MmaCfg<T, D, S::kNW, S::kBN, S::kMT, S::kQReg, S::kOvl, S::kStr>;
  constexpr auto kernel = flash_fwd_mma<T, D, S::kNW, S::kBN, S::kMT, S::kQReg, S::kOvl, S::kStr,
                                        S::kPipe, S::kLateRefill, kPaged>;
  return cuda::launch_with_smem(ForwardOp::name, "flash_fwd_mma", kernel,
                                static_cast<unsigned>(blocks), Cfg::kThreads, Cfg::kSmem,
                                cuda::stream_of(ctx), p);
}

template <class T, template <int> class Sh, bool kPaged = false>
Status launch_fwd_mma(const LaunchContext& ctx, const Problem& pr, const ForwardArguments& a) {
  // A view whose rows are not 16-byte aligned cannot use cp.async: run the SIMT kernel instead
  // (same results contract; the tensor-core path is the fast path, not a different answer).
  if (!rows_aligned(a.q, sizeof(T)) || !rows_aligned(a.k, sizeof(T)) ||
      !rows_aligned(a.v, sizeof(T)) || !rows_aligned(a.y, sizeof(T)))
    return launch_fwd_simt<T, float>(ctx, pr, a);
  Params p = fwd_params(pr, a);
  if (int64_t{p.batch} * p.heads_q * p.len_q == 0) return {};
  const Split s = fwd_split<Sh>(pr, ctx.stream.caps());
  p.splits = s.splits, p.tiles_per_split = s.tiles_per_split;
  p.pack = fwd_pack<Sh>(pr);
  const int64_t rows = int64_t{p.batch} * p.heads_q * p.len_q;
  if (s.splits > 1) {
    if (ctx.workspace.bytes < fwd_mma_workspace<Sh>(pr, ctx.stream.caps()))
      return Error::workspace_too_small(std::string(ForwardOp::name) + ": split-K partials",
                                        fwd_mma_workspace<Sh>(pr, ctx.stream.caps()),
                                        ctx.workspace.bytes);
    const SplitParts parts = split_parts(ctx.workspace.data, s.splits, rows, p.dim_v);
    p.o_part = parts.o, p.lse_part = parts.lse;
  }
  // The padded head dim picks a launch shape (not a dtype dispatch).
  const int dim = mma_dim(pr);
  const int64_t blocks = fwd_blocks<Sh>(pr) * s.splits;
  const Status st = dim == 64    ? run_mma<T, 64, Sh, kPaged>(ctx, p, blocks)
                    : dim == 128 ? run_mma<T, 128, Sh, kPaged>(ctx, p, blocks)
                                 : run_mma<T, 256, Sh, kPaged>(ctx, p, blocks);
  if (!st.ok() || s.splits <= 1) return st;
  flash_fwd_combine<T><<<row_blocks(rows), 128, 0, cuda::stream_of(ctx)>>>(p);
  return cuda::check_launch(ForwardOp::name, "flash_fwd_combine");
}

// ---- backward -----------------------------------------------------------------------------------
template <class A>
size_t bwd_workspace(const Problem& pr, const DeviceCaps&) {
  const Descriptor& d = pr.desc;
  return static_cast<size_t>(d.batch * d.heads_q * d.len_q) * sizeof(A);
}

inline Params bwd_params(const LaunchContext& ctx, const Problem& pr, const BackwardArguments& a) {
  Params p = make_params(pr);
  p.q = a.q.data, p.k = a.k.data, p.v = a.v.data, p.y = a.y.data, p.dy = a.dy.data;
  p.lse = const_cast<void*>(a.lse.data);
  p.dq = a.dq.data, p.dk = a.dk.data, p.dv = a.dv.data;
  strides3(a.q, p.sq), strides3(a.k, p.sk), strides3(a.v, p.sv), strides3(a.y, p.sy);
  strides3(a.dy, p.sdy), strides3(a.dq, p.sdq), strides3(a.dk, p.sdk), strides3(a.dv, p.sdv);
  all_strides(a.lse, p.sl);
  if (pr.desc.varlen) {
    p.cu_q = static_cast<const int32_t*>(a.cu_seqlens_q.data);
    p.cu_k = static_cast<const int32_t*>(a.cu_seqlens_k.data);
  }
  p.delta = ctx.workspace.data;
  return p;
}

template <class T, class A>
Status launch_bwd_simt(const LaunchContext& ctx, const Problem& pr, const BackwardArguments& a) {
  const Params p = bwd_params(ctx, pr, a);
  const cudaStream_t stream = cuda::stream_of(ctx);
  const int64_t q_rows = int64_t{p.batch} * p.heads_q * p.len_q;
  const int64_t k_rows = int64_t{p.batch} * p.heads_kv * p.len_k;
  if (q_rows > 0) {
    attn_bwd_delta<T, A><<<row_blocks(q_rows), 128, 0, stream>>>(p);
    BARACUDA_TRY(cuda::check_launch(BackwardOp::name, "attn_bwd_delta"));
    flash_bwd_dq_simt<T, A><<<row_blocks(q_rows), 128, 0, stream>>>(p);
    BARACUDA_TRY(cuda::check_launch(BackwardOp::name, "flash_bwd_dq_simt"));
  }
  if (k_rows == 0) return {};
  flash_bwd_dkdv_simt<T, A><<<row_blocks(k_rows), 128, 0, stream>>>(p);
  return cuda::check_launch(BackwardOp::name, "flash_bwd_dkdv_simt");
}

// ---- tensor-core backward
// ---------------------------------------------------------------------------
constexpr int kBwdBQ = 32;  // query rows per step of the dK/dV kernel
// Keys per step of the dQ kernel (32 at D = 256, where dQ's accumulators take 128 registers).
template <int D>
constexpr int kBwdBN = D == 256 ? 32 : 64;

template <class T, int D>
size_t bwd_mma_smem() {
  return std::max(BwdKvCfg<T, D, kBwdBQ>::kSmem, BwdQCfg<T, D, kBwdBN<D>>::kSmem);
}

// One launch of a backward kernel (its dynamic shared memory raised where needed).
template <auto Kernel>
Status launch_bwd_kernel(cudaStream_t stream, int64_t blocks, size_t smem, const Params& p,
                         const char* what) {
  if (blocks == 0) return {};
  return cuda::launch_with_smem(BackwardOp::name, what, Kernel, static_cast<unsigned>(blocks), 128,
                                smem, stream, p);
}

template <class T, int D>
Status run_bwd_mma(const LaunchContext& ctx, const Params& p) {
  const cudaStream_t stream = cuda::stream_of(ctx);
  using KvCfg = BwdKvCfg<T, D, kBwdBQ>;
  using QCfg = BwdQCfg<T, D, kBwdBN<D>>;
  const int64_t q_blocks = int64_t{p.batch} * p.heads_q * cuda::ceil_div(p.len_q, QCfg::kRows);
  const int64_t k_blocks = int64_t{p.batch} * p.heads_kv * cuda::ceil_div(p.len_k, KvCfg::kKeys);
  BARACUDA_TRY((launch_bwd_kernel<flash_bwd_dq_mma<T, D, kBwdBN<D>>>(stream, q_blocks, QCfg::kSmem,
                                                                     p, "flash_bwd_dq_mma")));
  if constexpr (D == 256) {  // dK and dV in launches of their own (see KvOut)
    BARACUDA_TRY((launch_bwd_kernel<flash_bwd_dkdv_mma<T, D, kBwdBQ, kDkOnly>>(
        stream, k_blocks, KvCfg::kSmem, p, "flash_bwd_dkdv_mma dK")));
    return launch_bwd_kernel<flash_bwd_dkdv_mma<T, D, kBwdBQ, kDvOnly>>(
        stream, k_blocks, KvCfg::kSmem, p, "flash_bwd_dkdv_mma dV");
  } else {
    return launch_bwd_kernel<flash_bwd_dkdv_mma<T, D, kBwdBQ>>(stream, k_blocks, KvCfg::kSmem, p,
                                                               "flash_bwd_dkdv_mma");
  }
}

// ---- one-pass tensor-core backward (dQ by atomics) ----------------------------------------------
// Query rows per step: 64 at a padded head dim of 128; kBQ64 (64 or 128) at 64. 128 there:
// measured on the H100 (bf16, d64, TFLOP/s, 64 / 128 rows) 201 / 217 at L4096, 215 / 234 at
// L16384, 142 / 148 at L512 (e03c41f); at D = 128 the dK / dV registers leave no room for it.
constexpr int kFusedBQ64 = 128;
template <int kBQ64>
constexpr int fused_bq(int d) {
  return d == 64 ? kBQ64 : 64;
}

// Workspace: delta (bwd_workspace), then the f32 dQ accumulator [B * Hq * Lq][padded head dim],
// 256-byte aligned wherever the caller's buffer starts (256 bytes of slack are asked for).
inline size_t fused_delta_bytes(const Problem& pr) {
  const Descriptor& d = pr.desc;
  return static_cast<size_t>(d.batch * d.heads_q * d.len_q) * sizeof(float);
}
// The one-pass backward's tiles where the smaller parts allow them: 64 query rows at d64 within
// the 99 KB an sm_86 / sm_89 block may opt into (flash_bwd_fused_q64_sm80), and the d128 tiles
// within an A100's 163 KB; a layout change that grows them past those drops those parts to the two
// passes.
static_assert(BwdFusedCfg<__half, 64, fused_bq<64>(64)>::kSmem <= 99 * 1024);
static_assert(BwdFusedCfg<__half, 128, fused_bq<kFusedBQ64>(128)>::kSmem <= 163 * 1024);
// kBulkDq (BwdFusedCfg): sm_90 and later only, for the bulk reduce-add.
template <int kBQ64, bool kBulkDq>
size_t fused_smem(const Problem& pr) {
  return mma_dim(pr) == 64 ? BwdFusedCfg<__half, 64, fused_bq<kBQ64>(64), kBulkDq>::kSmem
                           : BwdFusedCfg<__half, 128, fused_bq<kBQ64>(128), kBulkDq>::kSmem;
}
template <int kBQ64, bool kBulkDq = false>
bool fits_bwd_fused(const Problem& pr, const DeviceCaps& caps) {
  const size_t smem = fused_smem<kBQ64, kBulkDq>(pr);
  return mma_dims_ok(pr) && mma_dim(pr) <= 128 && bwd_rows_fit(pr) && (!kBulkDq || caps.sm >= 90) &&
         static_cast<int64_t>(smem) <= caps.smem_per_block_optin;
}

// Its workspace: per tail block the partial dK and dV slots and an iteration count.
inline size_t bwd_tail_bytes(int64_t units, int d) {
  return static_cast<size_t>(units) * static_cast<size_t>(2 * detail::kBwdKeyBlock * d + 1) *
         sizeof(float);
}
// CTAs of an instance that shared memory lets the GPU hold at once (up to 228 KB an SM, 1 KB of it
// the system's per block): the workspace is sized for the tail this bound gives, the launch's
// tail uses the occupancy calculator's count (registers too), never more.
template <int kBQ64, bool kBulkDq>
int64_t bwd_fused_slots(const Problem& pr, const DeviceCaps& caps) {
  const size_t smem = fused_smem<kBQ64, kBulkDq>(pr);
  return int64_t{caps.sm_count} * std::max<int64_t>(1, (228 * 1024) / (smem + 1024));
}
template <int kBQ64, bool kBulkDq = false>
size_t bwd_fused_workspace(const Problem& pr, const DeviceCaps& caps) {
  // A tail never spans more than two waves' worth of blocks (tail_split), whatever the slots.
  const int64_t tail =
      std::min(detail::bwd_key_blocks(pr.desc), 2 * bwd_fused_slots<kBQ64, kBulkDq>(pr, caps));
  return fused_delta_bytes(pr) + 256 + fused_delta_bytes(pr) * static_cast<size_t>(mma_dim(pr)) +
         bwd_tail_bytes(tail, mma_dim(pr));
}

template <class T, int D, int BQ, int kBQ64, bool kBulkDq>
Status run_bwd_fused(const LaunchContext& ctx, const Problem& pr, const Params& p) {
  const cudaStream_t stream = cuda::stream_of(ctx);
  using Cfg = BwdFusedCfg<T, D, BQ, kBulkDq>;
  constexpr auto kernel = flash_bwd_fused_mma<T, D, BQ, kBulkDq>;
  if (const cudaError_t e =
          cuda::ensure_dynamic_smem(reinterpret_cast<const void*>(kernel), Cfg::kSmem);
      e != cudaSuccess)
    return cuda::cuda_error(BackwardOp::name, "flash_bwd_fused_mma smem", e);
  const int per_sm =
      cuda::blocks_per_sm(reinterpret_cast<const void*>(kernel), 32 * Cfg::kWarps, Cfg::kSmem);
  const int64_t q_rows = int64_t{p.batch} * p.heads_q * p.len_q;
  const int64_t slots = std::min(int64_t{ctx.stream.caps().sm_count} * per_sm,
                                 bwd_fused_slots<kBQ64, kBulkDq>(pr, ctx.stream.caps()));
  detail::TailSplit split = detail::bwd_tail_split(pr, BQ, slots);
  const uintptr_t base = reinterpret_cast<uintptr_t>(ctx.workspace.data);
  const uintptr_t after_delta = base + fused_delta_bytes(pr);
  float* acc = reinterpret_cast<float*>((after_delta + 255) / 256 * 256);
  if (q_rows == 0) return {};
  // The workspace was sized with the caps of the plan's selection; a tail that needs more (a
  // stream on a part with more SMs) is dropped rather than written past it.
  const uintptr_t acc_end = reinterpret_cast<uintptr_t>(acc + q_rows * D);
  if (acc_end + bwd_tail_bytes(split.units, D) > base + ctx.workspace.bytes)
    split = detail::bwd_tail_split(pr, BQ, 0);
  // The accumulator, then the tail's slots and counts: one memset zeroes them all.
  BwdTail tail{split, acc + q_rows * D, nullptr};
  tail.done = reinterpret_cast<unsigned*>(tail.part + split.units * 2 * Cfg::kKeys * D);
  const size_t zeroed =
      static_cast<size_t>(q_rows) * D * sizeof(float) + bwd_tail_bytes(split.units, D);
  const cudaError_t zero = cudaMemsetAsync(acc, 0, zeroed, stream);
  if (zero != cudaSuccess) return cuda::cuda_error(BackwardOp::name, "dQ accumulator", zero);
  if (const int64_t grid = split.n_dp + split.ctas; grid > 0) {
    kernel<<<static_cast<unsigned>(grid), 32 * Cfg::kWarps, Cfg::kSmem, stream>>>(p, acc, tail);
    BARACUDA_TRY(cuda::check_launch(BackwardOp::name, "flash_bwd_fused_mma"));
  }
  flash_bwd_dq_convert<T, D>
      <<<static_cast<unsigned>(cuda::ceil_div(q_rows, 128 / (D / 4))), 128, 0, stream>>>(p, acc);
  return cuda::check_launch(BackwardOp::name, "flash_bwd_dq_convert");
}

// kRowsAt64 > 0: the one-pass kernel (dQ by atomics; kRowsAt64 query rows per step at D = 64)
// instead of the two deterministic passes.
template <class T, int kRowsAt64 = 0, bool kBulkDq = false>
Status launch_bwd_mma(const LaunchContext& ctx, const Problem& pr, const BackwardArguments& a) {
  // cp.async needs 16-byte aligned rows, and so do attn_bwd_delta_vec's 16-byte loads of Y and dY
  // (Y was missing here: a Y of odd row pitch faulted, found by the GPU argument fuzzing);
  // otherwise the SIMT kernels (same contract) run.
  if (!rows_aligned(a.q, sizeof(T)) || !rows_aligned(a.k, sizeof(T)) ||
      !rows_aligned(a.v, sizeof(T)) || !rows_aligned(a.y, sizeof(T)) ||
      !rows_aligned(a.dy, sizeof(T)) || !rows_aligned(a.dq, sizeof(T)) ||
      !rows_aligned(a.dk, sizeof(T)) || !rows_aligned(a.dv, sizeof(T)))
    return launch_bwd_simt<T, float>(ctx, pr, a);
  const Params p = bwd_params(ctx, pr, a);
  const int64_t q_rows = int64_t{p.batch} * p.heads_q * p.len_q;
  if (q_rows > 0) {
    const auto delta = with_mma_dim(pr, [](auto d) { return attn_bwd_delta_vec<T, d()>; });
    const int64_t rows_per_block = 128 / (mma_dim(pr) / 8);
    delta<<<static_cast<unsigned>(cuda::ceil_div(q_rows, rows_per_block)), 128, 0,
            cuda::stream_of(ctx)>>>(p);
    BARACUDA_TRY(cuda::check_launch(BackwardOp::name, "attn_bwd_delta_vec"));
  }
  if constexpr (kRowsAt64 > 0)
    return mma_dim(pr) == 64
               ? run_bwd_fused<T, 64, fused_bq<kRowsAt64>(64), kRowsAt64, kBulkDq>(ctx, pr, p)
               : run_bwd_fused<T, 128, fused_bq<kRowsAt64>(128), kRowsAt64, kBulkDq>(ctx, pr, p);
  return with_mma_dim(pr, [&](auto d) { return run_bwd_mma<T, d()>(ctx, p); });
}

}  // namespace baracuda::attention::kernels

// The decode kernel's host side uses the helpers above (fwd_params, rows_aligned, the SIMT
// fallback).
#include "ops/attention/decode.cuh"

namespace baracuda::attention::kernels {

// ---- registration -------------------------------------------------------------------------------
// The tensor-core kernels take head dims in multiples of 8 (the shapes below up to a padded 128 or
// 64).
inline bool fits_mma(const Problem& pr, const DeviceCaps&) {
  return mma_dims_ok(pr);
}
inline bool fits_mma_128(const Problem& pr, const DeviceCaps&) {
  return mma_dims_ok(pr) && mma_dim(pr) <= 128;
}
inline bool fits_mma_64(const Problem& pr, const DeviceCaps&) {
  return mma_dims_ok(pr) && mma_dim(pr) <= 64;
}
// Where m32s is the family's default forward (H100, bf16, ea14cc1, TFLOP/s against the m16
// shapes): unmasked problems (d128 L512..16k 242-335 vs m16 / m16w8 <= 278; d64 212-269 vs m16
// 210-258) and banded ones long enough that few tiles are diagonal, whose masked tiles run m32s's
// per-element loop (causal d128: L512 123 vs m16 159, L2048 240 vs 237, L4096 287 vs 259; causal
// d64: L4096 228 vs 246, L8192 255 vs 257, L16384 268 vs 242). At least one CTA's 128 rows per
// K/V head, or most of them would be empty. Since eb720a9 the straight variant (same shared
// memory, rule below) takes every padded head dim of 128 and m32s_n128 unmasked D = 64 where its
// 112 KB are granted, so m32s keeps D = 64: long banded problems, and unmasked ones on 99 KB parts.
// Banded, from 16k on: at L8192 causal m16 led in both runs that measured it (ea14cc1: 257 vs 255;
// 25f34da, with the fast tile loads: 277.5 vs 263.0), at L16384 m32s (268 vs 242; 281.6 vs 268.2).
// At d64 m32s_n128m (fits_n128m_default) ranks above it where its 112 KB fit.
inline bool fits_m32s_default(const Problem& pr, const DeviceCaps& caps) {
  const auto& d = pr.desc;
  return fits_mma_64(pr, caps) && d.len_q * pr.group >= 128 &&
         (d.mask.is_none() || std::max(d.len_q, d.len_k) >= 16384);
}
// Where m32s with straight-line masked tiles (MmaShapeM32SStraight) is the default: a padded head
// dim of 128 with at least one CTA's 128 rows per K/V head. H100, bf16, eb720a9, one call, x
// FlashAttention-2: non-causal L512..16k 0.89-1.01 vs m32s 0.83-0.98; causal 0.91-1.08 vs m32s
// 0.69-1.01 and m16 0.84-0.89. At D = 64 it trails m32s / m32s_n128 unmasked (0.79-0.84) and m16
// on short causal problems, so it does not take over there. With the fast tile loads (25f34da,
// same call): non-causal 0.93-1.10x, causal 0.97-1.21x.
inline bool fits_straight_default(const Problem& pr, const DeviceCaps& caps) {
  return fits_mma_128(pr, caps) && mma_dim(pr) == 128 && pr.desc.len_q * pr.group >= 128;
}
// Where m32s_n128m (STR = 3) is the default: a padded head dim of 64, any mask, at least 128 rows
// per K/V head; it ranks above m32s and m16 there. It took over from m32s_n128 (MmaShapeM32SWide,
// the unmasked d64 default from eb720a9: 0.89-1.06x FlashAttention-2 at 25f34da; causal it
// trailed, 0.42-0.88x, a 128-key diagonal tile through the per-element loop), which stays
// pinnable. H100, da06fc8, one call, medians
// of two rounds, TFLOP/s against FlashAttention-2 in the same call: L512 270.5 (1.03x; m32s_n128
// 1.00x), L2048 320.3 (1.07x; 1.04x), L8192 341.9 (1.13x; 1.10x), causal L512 167.7 (1.09x; m16
// 1.08x), L1024 229.6 (1.07x; m16 0.98x), L4096 307.5 (1.09x; m16 0.96x), L16384 333.9 (1.12x).
inline bool fits_n128m_default(const Problem& pr, const DeviceCaps& caps) {
  return fits_mma_64(pr, caps) && pr.desc.len_q * pr.group >= 128;
}
using FitsFn = bool (*)(const Problem&, const DeviceCaps&);
// Where flash_bwd_fused_bulk_sm80 is the fused backward's default: a padded head dim of 128 under a
// band (causal, window) on sequences of at most 1024 rows. H100, e6f8e7e, one call, two rounds
// each, medians against flash_bwd_fused_sm80: d128 L4096 1.06x, L8192 1.03x, L16384 1.02x, causal
// L8192 / L16384 1.02x / 1.04x, L <= 2048 0.997-1.007x; at d64 0.99-1.01x everywhere (the
// red.global form stays). Since the red.global form sends dQ between the dV / dK mmas (eb10153) it
// has caught up without a band: H100, 0dc4f59, one call, medians of three rounds, red.global /
// bulk at d128 L512..16k 1.029 / 1.034 / 1.029 / 0.997 / 0.992 / 1.024; causal 0.947 / 0.971 /
// 0.996 / 1.013 / 1.025 / 0.984. With the next tile's loads behind the first mmas (73c82e9) it
// leads under a band too from 2048 rows: H100, 73c82e9, one call, red.global / bulk causal
// L512..16k 0.955 / 0.978 / 1.006 / 1.023 / 1.018 / 1.013.
inline bool fits_bulk_default(const Problem& pr, const DeviceCaps& caps) {
  return fits_bwd_fused<kFusedBQ64, true>(pr, caps) && mma_dim(pr) == 128 &&
         !pr.desc.mask.is_none() && std::max(pr.desc.len_q, pr.desc.len_k) <= 1024;
}

// Every kernel of the family shares category, layout, masks, arch and backend; an entry differs in
// op, accumulator, precision and name.
template <DType E>
KernelSku family_sku(std::string_view op, DType aux, PrecisionGuarantee precision,
                     std::string_view name) {
  return {.category = "attention",
          .op = op,
          .element = E,
          .aux_element = aux,
          .layout = "strided",
          .epilogue = "any_mask",
          .arch = Arch::sm80,
          .backend = Backend::bespoke_cuda,
          .precision = precision,
          .name = name};
}

// Shared memory a launch shape's kernel asks for at the problem's padded head dim.
template <class T, template <int> class Sh>
size_t fwd_mma_smem(const Problem& pr) {
  return with_mma_dim(pr, [](auto d) {
    using S = Sh<d()>;
    return MmaCfg<T, d(), S::kNW, S::kBN, S::kMT, S::kQReg, S::kOvl, S::kStr>::kSmem;
  });
}
// An entry's own rule, and only where the device grants its shared memory (e.g. m16w8's 160 KB at
// D = 128 on a 99 KB sm_86 / sm_89 part), so select passes over it instead of run failing.
// Paged K / V: the kPaged entry alone, for the page sizes its tiles read through a PageWindow.
template <class T, template <int> class Sh, FitsFn kFits, bool kPaged = false>
bool fits_fwd_mma(const Problem& pr, const DeviceCaps& caps) {
  if (!kFits(pr, caps) || static_cast<int64_t>(fwd_mma_smem<T, Sh>(pr)) > caps.smem_per_block_optin)
    return false;
  if constexpr (kPaged)
    return pr.desc.page_size > 0 &&
           detail::page_window_serves(static_cast<int>(pr.desc.page_size), mma_bn<Sh>(mma_dim(pr)));
  return pr.desc.page_size == 0;
}

// One forward kernel template instantiation (a launch shape) as a table entry.
template <DType E, template <int> class LaunchShape, FitsFn kFits, bool kPaged = false>
void register_fwd_mma(std::string_view name, int priority, PrecisionGuarantee precision) {
  using T = cuda::device_t<E>;
  register_kernel<ForwardOp>({
      .sku = family_sku<E>(ForwardOp::name, DType::f32, precision, name),
      .priority = priority,
      .fits = fits_fwd_mma<T, LaunchShape, kFits, kPaged>,
      .workspace = fwd_mma_workspace<LaunchShape>,
      .launch = launch_fwd_mma<T, LaunchShape, kPaged>,
  });
}

// One decode variant (split multiplier, fused merge) as a table entry.
template <DType E, int kWaves, bool kFused>
void register_decode(std::string_view name, int priority, PrecisionGuarantee precision,
                     bool (*fits)(const Problem&, const DeviceCaps&) = decode_fits) {
  using T = cuda::device_t<E>;
  register_kernel<ForwardOp>({
      .sku = family_sku<E>(ForwardOp::name, DType::f32, precision, name),
      .priority = priority,
      .fits = fits,
      .workspace = decode_workspace<kWaves, kFused>,
      .launch = launch_decode<T, kWaves, kFused>,
  });
}

// The family's kernels of one element type, in groups. The 16-bit types build them in three
// translation units (kernels_<type>.cu: SIMT and backward; _forward.cu; _decode.cu): one unit of
// them all was the build's longest compile, which every parallel build waited for (56 s of nvcc
// for sm_90a on this project's 2-core machine; 17 / 24 / 25 s split, SASS identical).
template <DType E>
bool register_simt_kernels() {
  using T = cuda::device_t<E>;
  // 16-bit types compute in f32; f32 and f64 compute in f64: the SIMT kernels sum a row's keys
  // sequentially, and f32 sums over thousands of keys would drift past a few f32 roundings.
  constexpr bool wide = E == DType::f16 || E == DType::bf16;
  using A = std::conditional_t<wide, float, double>;
  constexpr DType acc = wide ? DType::f32 : DType::f64;
  constexpr MathPrecision simt_math = wide ? MathPrecision::f32 : MathPrecision::f64;
  // SIMT kernels: each row in a fixed order, independent of the problem size and of other rows.
  constexpr PrecisionGuarantee simt{simt_math, acc, true, true};
  register_kernel<ForwardOp>({
      .sku = family_sku<E>(ForwardOp::name, acc, simt, "flash_fwd_simt"),
      .priority = 10,
      .launch = launch_fwd_simt<T, A>,
  });
  register_kernel<BackwardOp>({
      .sku = family_sku<E>(BackwardOp::name, acc, simt, "flash_bwd_simt"),
      .priority = 10,
      .workspace = bwd_workspace<A>,
      .launch = launch_bwd_simt<T, A>,
  });
  return true;
}

// 16-bit types: P is rounded to the 16-bit type before P V (as FlashAttention does); no atomics,
// but the split-K count depends on the problem size, so a row's bits can change with the batch.
template <DType E>
constexpr PrecisionGuarantee kMmaPrecision{
    E == DType::f16 ? MathPrecision::f16 : MathPrecision::bf16, DType::f32, true, false};

template <DType E>
bool register_forward_mma_kernels() {
  constexpr PrecisionGuarantee mma = kMmaPrecision<E>;
  register_fwd_mma<E, MmaShape, fits_mma>("flash_fwd_mma_sm80", 20, mma);
  // Same kernel template, MmaShapeM16 launch shapes (D <= 128). Measured on the H100 (bf16,
  // TFLOP/s, flash_fwd_mma_sm80 / m16 / m16w8): d128 L4096 122 / 199 / 218, d64 L4096
  // 88 / 182 / 169, d128 L16384 128 / 201 / 229, causal d128 L4096 119 / 192 / 209. Both beat
  // the MmaShape kernel everywhere they fit, so they rank above it; m16 is the d128 default
  // where m32s (below) is not, m16w8 stays for A/B.
  register_fwd_mma<E, MmaShapeM16, fits_mma_128>("flash_fwd_mma_m16_sm80", 21, mma);
  register_fwd_mma<E, MmaShapeM16W8, fits_mma_128>("flash_fwd_mma_m16w8_sm80", 15, mma);
  // m16 again, same name and launch, above m16w8 where the padded head dim is 64: the second
  // H100 run (bf16, non-causal L4096, TFLOP/s) has m16 / m16w8 at 233.4 / 208.4 for d64 but
  // 212.9 / 258.6 for d128. Priorities are per entry and cannot depend on the head dim, but
  // `fits` can, so d64 selects this entry by default while m16w8 keeps d128; m16w8 stays
  // pinnable everywhere, and pinning "flash_fwd_mma_m16_sm80" reaches this entry or the one
  // above (same launch), so m16 stays pinnable at every head dim too.
  register_fwd_mma<E, MmaShapeM16, fits_mma_64>("flash_fwd_mma_m16_sm80", 23, mma);
  // A/B shapes. Once the m32 shapes' second m16 tile stopped being skipped per tile (its mmas
  // had been predicated behind WARPSYNCs), m32s became the fastest at d128 (H100, bf16,
  // TFLOP/s, de1b2e0, same call: L4096 323 vs m16 271 / m16w8 269 / ovl 277 / m32 173; L16384
  // 335 vs 281; L4096 causal 287 vs 262): it is the default where fits_m32s_default says (the
  // full sweep's numbers are there); m16 keeps short banded problems.
  register_fwd_mma<E, MmaShapeM32, fits_mma_128>("flash_fwd_mma_m32_sm80", 17, mma);
  register_fwd_mma<E, MmaShapeOvl, fits_mma_128>("flash_fwd_mma_ovl_sm80", 16, mma);
  register_fwd_mma<E, MmaShapeM32S, fits_mma_128>("flash_fwd_mma_m32s_sm80", 14, mma);
  // ... and again, same name and launch, above the m16 entries where fits_m32s_default says.
  register_fwd_mma<E, MmaShapeM32S, fits_m32s_default>("flash_fwd_mma_m32s_sm80", 24, mma);
  // m32s over 128-key tiles at a padded head dim of 64 (with one softmax text: n128m), and m32s
  // with straight-line masked and capped tiles: pinnable wherever they fit, and (again, same
  // names and launches) n128m and straight the defaults above m32s where fits_n128m_default /
  // fits_straight_default say.
  register_fwd_mma<E, MmaShapeM32SWide, fits_mma_64>("flash_fwd_mma_m32s_n128_sm80", 13, mma);
  register_fwd_mma<E, MmaShapeM32SStraight, fits_mma_128>("flash_fwd_mma_m32s_straight_sm80", 12,
                                                          mma);
  register_fwd_mma<E, MmaShapeM32SWideMasked, fits_mma_64>("flash_fwd_mma_m32s_n128m_sm80", 11,
                                                           mma);
  register_fwd_mma<E, MmaShapeM32SWideMasked, fits_n128m_default>("flash_fwd_mma_m32s_n128m_sm80",
                                                                  26, mma);
  register_fwd_mma<E, MmaShapeM32SStraight, fits_straight_default>(
      "flash_fwd_mma_m32s_straight_sm80", 25, mma);
  // Paged K / V (prefill and chunked prefill against a block-table cache): the d128 default's
  // shape (m32s_straight; MmaShape's at D = 256) with its K / V tiles read through a
  // PageWindow. It spills 68 bytes at D = 128 (sm_90a; m16's shape, 232 registers, does not)
  // and is faster anyway: H200, thirty-eighth session, call 5, b4 x 512-token chunks against
  // 4096-key caches, d128, causal: 64-key pages 412-413 us (312 TFLOP/s) against 454-455 on
  // m16's shape, 16-key pages 516 against 653; the same problem padded 363-366 us on
  // m32s_straight. The only tensor-core forward for paged problems; the decode kernels rank
  // above it where they fit (few query rows per K/V head), the SIMT kernel takes other page
  // sizes.
  register_fwd_mma<E, MmaShapeM32SStraight, fits_mma, true>("flash_fwd_mma_paged_sm80", 19, mma);
  return true;
}

template <DType E>
bool register_decode_kernels() {
  constexpr PrecisionGuarantee mma = kMmaPrecision<E>;
  // Few query rows per K/V head (decode, speculative decoding): above the general kernel; that
  // one stays registered so PlanPreference::kernel("flash_fwd_mma_sm80") can A/B them.
  register_decode<E, 1, false>("flash_decode_sm80", 30, mma);
  // The same kernel over 4x as many, 4x shorter splits (see decode_splits): A/B only (H100,
  // when splits filled every CTA slot shared memory allowed: 68.1 us vs 56.7 us at Lk 32k;
  // H200 at df4dd96: 45.0-45.1 vs 40.2-40.6 us).
  register_decode<E, 4, false>("flash_decode_w4_sm80", 29, mma);
  // flash_decode_sm80 with the split merge in the kernel instead of flash_decode_combine: split
  // 0 of each (batch, K/V head) awaits the other splits' flags and merges in split order
  // (deterministic) where it finds them all started, else the last finisher merges
  // (cuda::GroupMergeFlags). Splits keep >= 2 tiles instead of 4 (decode_splits' kMinTiles). By
  // name everywhere; the default where decode_fused_leads holds (below). Its history: the last
  // finisher merging (flags, one SC fence a block) read 40.3-40.9 us at Lk 32k d128
  // against 39.9-40.2 for two launches (ninetieth session; 45-46 before, a static
  // __shared__ int in its flag scan); a CAS-counted arrival was slower on the H100 (63.9 vs 56.7
  // us) and on the H200 (47.2 vs 40.2, ninety-third session); split 0 merging in a cooperative
  // launch lost PDL (39.9-40.2 / 38.6-38.9 us a run / back to back against 40.0-40.8 / 38.3).
  // Split 0 merging with one pass over the partials, a plain launch (ninety-third, H200):
  // 39.55 against 40.10 us a run, 36.46 against 38.02 back to back (docs/perf/attention.md).
  register_decode<E, 1, true>("flash_decode_fused_sm80", 28, mma);
  // The same kernel as the default where it leads (decode_fused_leads says where, with the rows).
  register_decode<E, 1, true>("flash_decode_fused_sm80", 31, mma, decode_fused_leads);
  return true;
}

template <DType E>
bool register_backward_mma_kernels() {
  using T = cuda::device_t<E>;
  constexpr PrecisionGuarantee mma = kMmaPrecision<E>;
  // Two passes (dQ per query block, dK/dV per key block; dK and dV apart at a padded head dim
  // of 256) in a fixed order: deterministic and independent of the batch; P and dS are rounded
  // to the 16-bit type for the tensor cores. Head dims up to 256 where the device grants the
  // shared memory (128 KB at 256).
  constexpr PrecisionGuarantee mma_bwd{mma.math, DType::f32, true, true};
  register_kernel<BackwardOp>({
      .sku = family_sku<E>(BackwardOp::name, DType::f32, mma_bwd, "flash_bwd_mma_sm80"),
      .priority = 20,
      .fits =
          [](const Problem& pr, const DeviceCaps& caps) {
            const size_t smem = with_mma_dim(pr, [](auto d) { return bwd_mma_smem<T, d()>(); });
            return mma_dims_ok(pr) && bwd_rows_fit(pr) &&
                   std::max(pr.desc.head_dim_qk, pr.desc.head_dim_v) <= 256 &&
                   static_cast<int64_t>(smem) <= caps.smem_per_block_optin;
          },
      .workspace = bwd_workspace<float>,
      .launch = launch_bwd_mma<T>,
  });
  // One pass (FlashAttention-2's schedule): S and dP computed once per tile, dQ added by f32
  // atomics, so neither deterministic nor bit-stable; above the two passes by default,
  // PlanPreference::deterministic() keeps those.
  constexpr PrecisionGuarantee fused_bwd{mma.math, DType::f32, false, false};
  register_kernel<BackwardOp>({
      .sku = family_sku<E>(BackwardOp::name, DType::f32, fused_bwd, "flash_bwd_fused_sm80"),
      .priority = 22,
      .fits = fits_bwd_fused<kFusedBQ64>,
      .workspace = bwd_fused_workspace<kFusedBQ64>,
      .launch = launch_bwd_mma<T, kFusedBQ64>,
  });
  // The same with 64 query rows a step at a padded head dim of 64 too (99 KB of shared memory
  // there against 165 KB; at 128 it is the same kernel): for the parts whose blocks cannot opt
  // into 165 KB (A100: 163 KB; sm_86 / sm_89: 99 KB), which would otherwise get the two passes.
  register_kernel<BackwardOp>({
      .sku = family_sku<E>(BackwardOp::name, DType::f32, fused_bwd, "flash_bwd_fused_q64_sm80"),
      .priority = 21,
      .fits = fits_bwd_fused<64>,
      .workspace = bwd_fused_workspace<64>,
      .launch = launch_bwd_mma<T, 64>,
  });
  // The same with dQ staged in shared memory and added by one bulk reduction per row (sm_90+):
  // pinnable wherever it fits, and (same name and launch) the default at a padded head dim of
  // 128 (fits_bulk_default).
  for (auto [priority, fits] :
       {std::pair<int, FitsFn>{19, fits_bwd_fused<kFusedBQ64, true>}, {23, fits_bulk_default}})
    register_kernel<BackwardOp>({
        .sku = family_sku<E>(BackwardOp::name, DType::f32, fused_bwd, "flash_bwd_fused_bulk_sm80"),
        .priority = priority,
        .fits = fits,
        .workspace = bwd_fused_workspace<kFusedBQ64, true>,
        .launch = launch_bwd_mma<T, kFusedBQ64, true>,
    });
  return true;
}

}  // namespace baracuda::attention::kernels
