// Fused scaled-dot-product attention (flash SDPA), forward and backward.
//
//   y = softmax(scale * Q K^T + mask) V          per (batch, query head)
//   lse = log(sum(exp(scale * Q K^T + mask)))    per query row, saved for the backward
//
// Two memory modes share one descriptor:
//  - padded: Q [B, Hq, Lq, Dk], K [B, Hk, Lk, Dk], V [B, Hk, Lk, Dv], Y [B, Hq, Lq, Dv],
//    LSE [B, Hq, Lq]. Any non-negative outer strides with a unit-stride head-dim axis, so both
//    the [B, H, L, D] and the [B, L, H, D] memory layouts run without copies.
//  - varlen (packed sequences, as serving and packed training use): Q [Tq, Hq, Dk],
//    K [Tk, Hk, Dk], V [Tk, Hk, Dv], Y [Tq, Hq, Dv], LSE [Hq, Tq]; sequence b owns the rows
//    [cu_seqlens_q[b], cu_seqlens_q[b+1]) of Q/Y and [cu_seqlens_k[b], cu_seqlens_k[b+1]) of K/V;
//    cu_seqlens are i32 [B + 1]. len_q / len_k are then the maximum sequence lengths.
//    (cuDNN takes them in its ragged layout under a padding mask, by name or
//    PlanPreference::only(Backend::cudnn): its forward 0.74-0.80x fa3's varlen forward on the
//    H200, its backward 0.90-1.00x fa3's unmasked and 0.96x causal (0.56-0.59x where queries and
//    keys have different cu_seqlens tensors), so neither is the default; its backward takes dense
//    [T, H, D] tensors and head dims up to 128 only, see attention_hopper.)
//
// Per-sequence key counts (forward only; FlashAttention's `seqused_k`, a decoding engine's cache
// lengths): with Descriptor::seqused_k, ForwardArguments::seqused_k (i32 [B], on the plan's device)
// says how many keys sequence b uses: K / V rows [0, seqused_k[b]) of its padded [.., Lk, ..]
// cache, or the first seqused_k[b] rows of its packed range when varlen. Keys past that count do
// not exist for the sequence (its bottom-right diagonal is aligned to the count, not to Lk), so a
// KV cache `cache[B, H, Lmax, D]` filled to different lengths (write_slice's kv_append) is read in
// place. Counts must lie in [0, Lk] (varlen: the sequence's key count); the CPU backend checks
// them before writing, GPU kernels clamp them into that range (they cannot check without a sync).
// On sm_90a, fa3's forward reads them too (fa3_fwd_sm90a_seqused, the default for chunks of 32
// query rows or more against such a cache; fa3_fwd_sm90a_packed for short chunks of a GQA group:
// 17-64 rows at head dims 64 and 256, 17-128 at 128 (17-256 against 16384 keys or more), and
// decodes of a group by the rules of kFa3PackedDecodeRows (speculative decoding), see
// attention_hopper::fa3_packs); cuDNN does not.
//
// Paged K / V (a serving engine's block-table cache, as vLLM and FlashInfer keep it; forward only):
// with Descriptor::page_size > 0, K is a pool [pages, Hk, page_size, Dk] and V
// [pages, Hk, page_size, Dv] (any outer strides, so [pages, page_size, Hk, D] memory too), and
// ForwardArguments::block_table (i32 [B, ceil(Lk / page_size)], row-major, on the plan's device)
// names the pages of each sequence: its key j is row j % page_size of page
// block_table[b][j / page_size]. Lk is then the longest sequence, and seqused_k (when given) each
// sequence's own count. Page numbers must lie in [0, pages); the CPU backend checks every entry a
// sequence reads before writing, GPU kernels clamp them into that range. On the GPU (f16 / bf16)
// the decode kernels read any page size; prefill and chunked prefill run on tensor cores
// (flash_fwd_mma_paged_sm80) where the page size is a multiple of the kernel's key tile (64 keys,
// 32 at head dims over 128) or splits it into 2..32 pages (powers of two), on the SIMT kernel
// otherwise. On sm_90a fa3's forward reads paged pools of any page size too (fa3_fwd_sm90a_paged;
// the default for chunks of 32 query rows or more; fa3_fwd_sm90a_packed_paged where
// attention_hopper::fa3_packs). cuDNN does not.
// Paged with varlen (a serving engine's batch of prompt chunks of different lengths against their
// caches, FlashAttention's varlen call with a block table): Q / Y / LSE packed as varlen's, K / V
// the pools; cu_seqlens_k's differences are the sequences' key counts (seqused_k, when given,
// caps them), total_k their sum; no K / V tensor has total_k rows. Every backend that reads paged
// pools runs it: the CPU backend, the GPU's decode, paged tensor-core and SIMT kernels, and fa3's
// paged instance on sm_90a.
//
// GQA / MQA: Hq is a multiple of Hk; query head h reads key/value head h / (Hq / Hk). A stride-0
// head axis on K/V (broadcast) is legal as well.
//
// Masks are expressed as a band around a diagonal. Query row i (of a sequence with Lq queries and
// Lk keys) has its diagonal at key d(i) = i (top-left alignment, PyTorch's `is_causal`) or at
// d(i) = i + Lk - Lq (bottom-right alignment, FlashAttention's causal); key j is visible when
// d(i) - left <= j <= d(i) + right (a negative bound means unbounded). Causal is right = 0.
// Logit soft-capping replaces a score s by cap * tanh(s / cap) before the mask. The family's
// kernels evaluate tanh to ~2e-7 relative; the sm_90a fa3 kernels (the default on Hopper where
// they fit) use the hardware tanh, 1.1e-5 relative at most (measured), so a capped score there
// is off by up to cap x 1.1e-5, and the LSE by about as much. Pin the family's kernels
// (PlanPreference::only(Backend::bespoke_cuda)) for the tighter bound, at ~1/4 of the speed.
//
// A query row that sees no key (fully masked, or Lk = 0) is defined: output 0, LSE -inf.
// LSE is f32 (f64 for f64 problems, so the f64 backward keeps its precision).
//
// FP8 (forward only): dtype e4m3 reads Q, K, V as e4m3 with per-tensor dequantization scales
// (f32 device scalars: an element x of Q stands for x * q_descale, K and V alike) and writes Y in
// out_dtype (bf16 or f16; default bf16). The result is attention over the dequantized inputs;
// kernels round P to e4m3 before P V (precision_guarantee().math says e4m3). GPU kernel: sm_90
// (Hopper) with Dk = Dv in {64, 128, 256}, padded or varlen (it needs a workspace: V transposed);
// elsewhere select() says no kernel fits, and CPU streams run the float64 reference.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "baracuda/core/plan.hpp"

namespace baracuda::attention {

enum class Diagonal : uint8_t { top_left, bottom_right };

struct Mask {
  int64_t left = -1;   // keys visible before the diagonal (-1: unbounded)
  int64_t right = -1;  // keys visible after the diagonal (-1: unbounded; 0: causal)
  Diagonal diagonal = Diagonal::top_left;

  static constexpr Mask none() { return {}; }
  // PyTorch `is_causal=True`: query i sees keys 0..i.
  static constexpr Mask causal_top_left() { return {-1, 0, Diagonal::top_left}; }
  // FlashAttention `causal=True`: the last query sees every key (differs when Lq != Lk).
  static constexpr Mask causal_bottom_right() { return {-1, 0, Diagonal::bottom_right}; }
  // FlashAttention `window_size=(left, right)`.
  static constexpr Mask sliding_window(int64_t left, int64_t right,
                                       Diagonal d = Diagonal::bottom_right) {
    return {left, right, d};
  }
  bool is_none() const { return left < 0 && right < 0; }
  // Causal of either diagonal: no key after it, every key before it.
  bool is_causal() const { return left < 0 && right == 0; }
  bool operator==(const Mask&) const = default;
};
std::string to_string(const Mask& m);  // "none", "causal_top_left", "window(128,0,bottom_right)"

struct Descriptor {
  DType dtype = DType::bf16;
  int64_t batch = 0;            // B (number of sequences when varlen)
  int64_t heads_q = 0;          // Hq
  int64_t heads_kv = 0;         // Hk; Hq % Hk == 0
  int64_t len_q = 0;            // Lq (varlen: max query length over the batch)
  int64_t len_k = 0;            // Lk (varlen: max key length over the batch)
  int64_t head_dim_qk = 0;      // Dk, 1..256
  int64_t head_dim_v = 0;       // Dv, 1..256
  std::optional<double> scale;  // default 1/sqrt(Dk)
  Mask mask{};
  double softcap = 0;  // 0: off; > 0: scores become cap * tanh(s / cap)
  bool varlen = false;
  int64_t total_q = 0;  // varlen: rows of packed Q / Y
  int64_t total_k = 0;  // varlen: rows of packed K / V
  // Forward only: ForwardArguments::seqused_k caps each sequence's keys (see the header comment).
  bool seqused_k = false;
  // Forward only, paged K / V (see the header comment): rows a page holds (0: not paged) and the
  // pages of the K / V pools.
  int64_t page_size = 0;
  int64_t pages = 0;
  // Y's dtype: unset or equal to dtype, except for e4m3 inputs (bf16 or f16; unset: bf16).
  std::optional<DType> out_dtype;
};

// The validated descriptor kernels see.
struct Problem {
  Descriptor desc;
  double scale = 1;   // resolved
  int64_t group = 1;  // Hq / Hk
  DType lse_dtype = DType::f32;
  DType y_dtype = DType::bf16;  // resolved out_dtype
};

// ---- forward ------------------------------------------------------------------------------------
struct ForwardArguments {
  ConstTensor q, k, v;
  Tensor y;
  Tensor lse;
  ConstTensor cu_seqlens_q, cu_seqlens_k;  // varlen only: i32 [B + 1], on the plan's device
  // e4m3 only: f32 [1] dequantization scales on the plan's device (see the header comment).
  ConstTensor q_descale{}, k_descale{}, v_descale{};
  // Descriptor::seqused_k only: i32 [B] on the plan's device, each sequence's key count.
  ConstTensor seqused_k{};
  // Paged K / V only: i32 [B, ceil(Lk / page_size)], row-major, on the plan's device.
  ConstTensor block_table{};
};

struct ForwardOp {
  static constexpr std::string_view name = "attention_forward";
  using Descriptor = attention::Descriptor;
  using Arguments = ForwardArguments;
  using Problem = attention::Problem;
  static Result<Problem> make_problem(const Descriptor& d);
  static DType element(const Problem& p) { return p.desc.dtype; }
  static Status check_arguments(const Problem& p, const Arguments& a, Location where);
};
using ForwardPlan = Plan<ForwardOp>;

// ---- backward -----------------------------------------------------------------------------------
// dQ, dK, dV from Q, K, V, Y, dY and the forward's LSE. dK / dV have K / V's shape and hold the sum
// over the query heads of each group. Every output element is written (zero where no query sees
// the key).
struct BackwardArguments {
  ConstTensor q, k, v, y, dy;
  ConstTensor lse;
  Tensor dq, dk, dv;
  ConstTensor cu_seqlens_q, cu_seqlens_k;  // varlen only
};

struct BackwardOp {
  static constexpr std::string_view name = "attention_backward";
  using Descriptor = attention::Descriptor;
  using Arguments = BackwardArguments;
  using Problem = attention::Problem;
  static Result<Problem> make_problem(const Descriptor& d);
  static DType element(const Problem& p) { return p.desc.dtype; }
  static Status check_arguments(const Problem& p, const Arguments& a, Location where);
};
using BackwardPlan = Plan<BackwardOp>;

// Shapes of each argument for a problem (what check_arguments expects); tests and callers use
// these to allocate.
struct Shapes {
  int rank_qkv = 4;  // Q / Y (and K / V unless paged): 4 padded, 3 varlen
  int rank_kv = 4;   // K / V: rank_qkv, or 4 for paged pools (also with varlen)
  int64_t q[4], k[4], v[4], y[4];
  int rank_lse = 3;  // 3 padded, 2 varlen
  int64_t lse[3];
  int64_t cu_seqlens = 0;           // B + 1 when varlen
  int64_t block_table[2] = {0, 0};  // [B, pages a sequence can hold] when paged
};
Shapes shapes_of(const Problem& p);

}  // namespace baracuda::attention
