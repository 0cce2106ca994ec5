// mHC: manifold-constrained hyper-connections (DeepSeek-AI, arXiv:2512.24880).
//
// A model keeps n residual streams X [tokens, n, C] (C = channels). Around each sub-layer F:
//   collapse (pre):  y[t, c]     = sum_i pre[t, i] * X[t, i, c]                     -> F's input
//   expand (post):   X'[t, i, c] = sum_j comb[t, j, i] * X[t, j, c] + post[t, i] * F_out[t, c]
// Index convention of comb (the one DeepSeek-V4 uses): comb is an n x n row-major matrix whose ROW
// j is the SOURCE stream and whose COLUMN i is the DESTINATION stream, so X' = comb^T X. Element
// (j, i) sits at offset j * n + i.
//
// Coefficients come from logits L of K = (2 + n) * n values laid out [pre (n) | post (n) | comb
// (n * n, row-major as above)]:
//   pre  = sigmoid(L_pre) + pre_eps,   post = 2 * sigmoid(L_post),   comb = Sinkhorn(L_comb)
// The "coeffs" tensors of these ops hold the activated values in that same layout.
//
// Where the logits come from:
//   static H   L = [h_pre | h_post | h_res] (learned parameters, the same for every token);
//              coeffs then has one row ([1, K]) that every token uses.
//   dynamic H  per token (DeepSeek-V4): x = X[t] flattened to [n * C] (stream-major),
//              r = 1 / sqrt(mean(x^2) + norm_eps), mix = r * (fn x) with fn [K, n * C],
//              L[k] = mix[k] * scale[field(k)] + base[k], field 0/1/2 for the pre/post/comb parts.
//              coeffs has one row per token ([tokens, K]).
//
// Sinkhorn (n x n, logits row-major):
//   init exp          P = exp(L - max L)
//   init softmax_eps  P = softmax over each row (last axis) + eps
//   then 2 * iters - 1 normalizations, alternating, starting with the `first` axis, so the last one
//   is along `first` again: rows: P[r, :] /= (sum P[r, :] + eps); columns: P[:, c] /= (sum + eps).
//   (softmax_eps + columns_first + iters is DeepSeek-V4's hc_split_sinkhorn with the same iters.)
//
// The seed's fused static forward (kept compatible, any n >= 1, f32/bf16/f16 activations):
//   out[t, i, c] = sum_j M[i, j] X[t, j, c] + s_post[i] * gamma[c] * z[t, c] / rms(z[t, :])
//   z = sum_j s_pre[j] X[t, j, c], s_pre = sigmoid(h_pre), s_post = 2 sigmoid(h_post),
//   M = Sinkhorn(h_res) with the SEED's convention: row i of M is the destination (out_i = M X),
//   rms(z) = sqrt(mean_c z^2 + rms_eps), gamma is bf16 whatever the activation type.
//
// Backward ops are the exact vector-Jacobian products of the forward ops:
//   expand_backward    (dout) -> dx, df, dcoeffs (pre part written as 0; static H: summed over
//                      tokens into one row)
//   collapse_backward  (dy, dcoeffs) -> dx and the parameter gradients (static: dh_pre, dh_post,
//                      dh_res; dynamic: dfn, dscale, dbase). Feed it the dcoeffs from
//                      expand_backward to differentiate pre -> F -> post in one chain; the two dx
//                      (collapse's and expand's) are the caller's to add.
//
// Tensors: activations (X, y, F_out, out and their gradients) are f32, bf16 or f16 (16-bit types
// compute in f32); parameters, coeffs and their gradients are f32; gamma is bf16. Every tensor may
// be strided on its outer axes, but the channel axis (the last one) must have unit stride.
#pragma once

#include <cstdint>
#include <string_view>

#include "baracuda/core/plan.hpp"
#include "baracuda/core/tensor.hpp"

namespace baracuda {

enum class MhcH : uint8_t { static_h, dynamic_h };
enum class SinkhornInit : uint8_t { exp, softmax_eps };
enum class SinkhornFirst : uint8_t { rows, columns };
std::string_view to_string(MhcH h);
std::string_view to_string(SinkhornInit i);
std::string_view to_string(SinkhornFirst f);

struct SinkhornConfig {
  SinkhornInit init = SinkhornInit::softmax_eps;
  SinkhornFirst first = SinkhornFirst::columns;
  int32_t iters = 20;  // 1..1000
  double eps = 1e-6;   // finite, in [0, 1): softmax offset and divide guard
};

struct MhcDescriptor {
  int64_t tokens = 0;         // >= 0
  int64_t n = 4;              // streams, >= 1 (n * n * 2 * iters must stay sane: n <= 64)
  int64_t channels = 0;       // C >= 1
  DType dtype = DType::bf16;  // activations: f32, bf16 or f16
  MhcH h = MhcH::dynamic_h;   // collapse / expand / backward ops; ignored by static_forward
  SinkhornConfig sinkhorn{};
  double pre_eps = 1e-6;   // pre = sigmoid + pre_eps (not used by static_forward), [0, 1)
  double norm_eps = 1e-6;  // dynamic H RMSNorm eps; static_forward's RMSNorm eps. (0, 1)
};

struct MhcProblem {
  int64_t tokens = 0, n = 0, channels = 0;
  int64_t k = 0;     // (2 + n) * n logits per row
  int64_t rows = 0;  // rows of coeffs: 1 (static H) or tokens (dynamic H)
  int64_t flat = 0;  // n * channels
  DType dtype = DType::bf16;
  MhcH h = MhcH::dynamic_h;
  SinkhornConfig sinkhorn{};
  double pre_eps = 0, norm_eps = 0;
};

// The seed's fused static forward (see the formula above).
struct MhcStaticForwardOp {
  static constexpr std::string_view name = "mhc_static_forward";
  using Descriptor = MhcDescriptor;
  using Problem = MhcProblem;
  struct Arguments {
    Tensor out;          // [tokens, n, C] dtype
    ConstTensor x;       // [tokens, n, C] dtype
    ConstTensor gamma;   // [C] bf16
    ConstTensor h_pre;   // [n] f32
    ConstTensor h_post;  // [n] f32
    ConstTensor h_res;   // [n, n] f32 (M[i, j]: i destination)
  };
  static Result<Problem> make_problem(const Descriptor& d);
  static DType element(const Problem& p) { return p.dtype; }
  static Status check_arguments(const Problem& p, const Arguments& a, Location where);
};

// Static-H parameters (leave empty for dynamic H) and dynamic-H parameters (empty for static H).
struct MhcParams {
  ConstTensor h_pre;   // [n] f32
  ConstTensor h_post;  // [n] f32
  ConstTensor h_res;   // [n, n] f32 (comb convention: row = source)
  ConstTensor fn;      // [K, n * C] f32
  ConstTensor scale;   // [3] f32
  ConstTensor base;    // [K] f32
};
struct MhcParamGrads {
  Tensor h_pre, h_post, h_res;  // static H
  Tensor fn, scale, base;       // dynamic H
};

// Collapse: y and the activated coefficients of every row. Dynamic H on sm_90 with C % 128 == 0
// selects by default a kernel whose X . fn products run on tensor cores (3xTF32 / 2xTF32): its
// precision_guarantee() says math = tf32. PlanPreference::kernel("collapse") keeps f32 arithmetic.
struct MhcCollapseOp {
  static constexpr std::string_view name = "mhc_collapse";
  using Descriptor = MhcDescriptor;
  using Problem = MhcProblem;
  struct Arguments {
    Tensor y;       // [tokens, C] dtype
    Tensor coeffs;  // [rows, K] f32
    ConstTensor x;  // [tokens, n, C] dtype
    MhcParams params;
  };
  static Result<Problem> make_problem(const Descriptor& d);
  static DType element(const Problem& p) { return p.dtype; }
  static Status check_arguments(const Problem& p, const Arguments& a, Location where);
};

// Expand: out = comb^T x + post * f.
struct MhcExpandOp {
  static constexpr std::string_view name = "mhc_expand";
  using Descriptor = MhcDescriptor;
  using Problem = MhcProblem;
  struct Arguments {
    Tensor out;          // [tokens, n, C] dtype
    ConstTensor x;       // [tokens, n, C] dtype
    ConstTensor f;       // [tokens, C] dtype (the sub-layer's output)
    ConstTensor coeffs;  // [rows, K] f32 (from collapse; the pre part is not read)
  };
  static Result<Problem> make_problem(const Descriptor& d);
  static DType element(const Problem& p) { return p.dtype; }
  static Status check_arguments(const Problem& p, const Arguments& a, Location where);
};

struct MhcExpandBackwardOp {
  static constexpr std::string_view name = "mhc_expand_backward";
  using Descriptor = MhcDescriptor;
  using Problem = MhcProblem;
  struct Arguments {
    Tensor dx;           // [tokens, n, C] dtype
    Tensor df;           // [tokens, C] dtype
    Tensor dcoeffs;      // [rows, K] f32 (pre part = 0)
    ConstTensor dout;    // [tokens, n, C] dtype
    ConstTensor x;       // [tokens, n, C] dtype
    ConstTensor f;       // [tokens, C] dtype
    ConstTensor coeffs;  // [rows, K] f32
  };
  static Result<Problem> make_problem(const Descriptor& d);
  static DType element(const Problem& p) { return p.dtype; }
  static Status check_arguments(const Problem& p, const Arguments& a, Location where);
};

struct MhcCollapseBackwardOp {
  static constexpr std::string_view name = "mhc_collapse_backward";
  using Descriptor = MhcDescriptor;
  using Problem = MhcProblem;
  struct Arguments {
    Tensor dx;            // [tokens, n, C] dtype
    MhcParamGrads grads;  // the set matching the descriptor's H; f32
    ConstTensor dy;       // [tokens, C] dtype
    ConstTensor dcoeffs;  // [rows, K] f32 (upstream gradient of coeffs, e.g. expand_backward's)
    ConstTensor x;        // [tokens, n, C] dtype
    MhcParams params;
  };
  static Result<Problem> make_problem(const Descriptor& d);
  static DType element(const Problem& p) { return p.dtype; }
  static Status check_arguments(const Problem& p, const Arguments& a, Location where);
};

using MhcStaticForwardPlan = Plan<MhcStaticForwardOp>;
using MhcCollapsePlan = Plan<MhcCollapseOp>;
using MhcExpandPlan = Plan<MhcExpandOp>;
using MhcExpandBackwardPlan = Plan<MhcExpandBackwardOp>;
using MhcCollapseBackwardPlan = Plan<MhcCollapseBackwardOp>;

}  // namespace baracuda
