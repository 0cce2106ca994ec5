// Test support shared by the attention family's tests and its Hopper backends' tests: which query
// rows a big case checks against the float64 reference, and the checks of a forward's outputs.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include "core/testing/testing.hpp"
#include "ops/attention/common.hpp"

namespace baracuda::attention::testing {

// A block table for paged K / V tests: `entries` page numbers drawn without repetition from a
// pool of `pages`, in a random order, so neighbouring keys of a sequence sit in unrelated pages
// and the pool's other pages stay unreferenced.
inline std::vector<int32_t> scattered_pages(int64_t pages, int64_t entries, harness::Rng& rng) {
  std::vector<int32_t> order(static_cast<size_t>(pages));
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int32_t>(i);
  for (size_t i = order.size(); i > 1; --i)
    std::swap(order[i - 1],
              order[static_cast<size_t>(rng.integer(0, static_cast<int64_t>(i) - 1))]);
  order.resize(static_cast<size_t>(entries));
  return order;
}

// Query rows [i0, i1) of query head h of batch b.
struct RowBlock {
  int64_t b, h, i0, i1;
};

inline int64_t rows_of(const std::vector<RowBlock>& blocks) {
  int64_t n = 0;
  for (const RowBlock& bk : blocks) n += bk.i1 - bk.i0;
  return n;
}

// The logical shape of a (non-varlen) forward: Y [B, Hq, Lq, Dv], LSE [B, Hq, Lq].
struct ForwardShape {
  int64_t b, hq, lq, lk, dv;
  Mask mask;
};

// An absolute allowance on a forward's LSE on top of f32's reduction bound, by the kernel that
// ran: none for the family's kernels; for fa3's instances (names "fa3_..."), their documented
// approximations, which their precision guarantee's 16-bit math covers and f32's bound does not:
// soft-capping's tanh.approx.f32 (1.1e-5 relative at most over |x| < 9, measured on the H200),
// which puts a capped score up to cap x 1.1e-5 off (a cap-20 d256 case's LSE came 3.18e-5 off
// against a bound of 2.30e-5), and the exp2-offload variants' polynomial (poly_exp2: 1.02e-4
// relative at most on the columns it takes, so up to log(1 + 1.02e-4) on LSE). The accurate tanh
// of the family's kernels cost fa3's capped forward 41% (docs/perf/attention.md, fortieth
// session).
inline double lse_slack(std::string_view kernel, double softcap) {
  if (!kernel.starts_with("fa3_")) return 0.0;
  const double exp2 = kernel.find("exp2poly") != std::string_view::npos ? 1.1e-4 : 0.0;
  return exp2 + 1.2e-5 * softcap;
}

// Y and LSE (logical order) against the reference ry / rl at the blocks' rows, every element of
// them (the whole tensors when the blocks cover every row), then the checks over every row: every
// Y element written, finite and inside V's range (Y is a convex combination of V rows, up to P's
// rounding to the 16-bit type before P V: the weights then sum to 1 within a few 2^-8), rows that
// see no key exactly 0 with LSE -inf, LSE finite wherever a row sees a key. vmax = max |V|.
// lse_slack: see lse_slack above. fp8 (p_e4m3): P is rounded to e4m3 before P V, so Y is held to
// the rounded-weights bound of e4m3 and the weights may sum to 1 within 2^-4.
inline void expect_forward_outputs(const ForwardShape& s, DType y_dtype, DType lse_dtype,
                                   const std::vector<double>& ry, const std::vector<double>& rl,
                                   double vmax, const std::vector<double>& y,
                                   const std::vector<double>& lse,
                                   const std::vector<RowBlock>& blocks, bool p_e4m3 = false,
                                   double lse_slack = 0) {
  const bool whole = rows_of(blocks) == s.b * s.hq * s.lq;
  std::vector<double> got_y, ref_y, got_l, ref_l;
  for (const RowBlock& bk : blocks)
    for (int64_t i = bk.i0; i < bk.i1; ++i) {
      const int64_t row = (bk.b * s.hq + bk.h) * s.lq + i;
      got_l.push_back(lse[row]), ref_l.push_back(rl[row]);
      for (int64_t col = 0; col < s.dv; ++col)
        got_y.push_back(y[row * s.dv + col]), ref_y.push_back(ry[row * s.dv + col]);
    }
  EXPECT_TRUE(
      harness::close_to(got_y, ref_y, p_e4m3 ? DType::e4m3 : y_dtype,
                        p_e4m3 ? harness::Accuracy::rounded_weights : harness::Accuracy::reduction,
                        whole ? "y" : "y (sampled rows)"));
  EXPECT_TRUE(harness::close_to(got_l, ref_l, lse_dtype, harness::Accuracy::reduction,
                                whole ? "lse" : "lse (sampled rows)", lse_slack));
  const double ybound = vmax * (1 + (p_e4m3 ? 1.0 / 16 : 1.0 / 32)) + 1e-6;
  const detail::Band band = detail::band_of(s.mask);
  int64_t bad_y = 0, bad_l = 0, first_y = -1, first_l = -1;
  for (int64_t bh = 0; bh < s.b * s.hq; ++bh)
    for (int64_t i = 0; i < s.lq; ++i) {
      int64_t lo, hi;
      detail::visible_keys(band, i, s.lq, s.lk, &lo, &hi);
      const bool sees = lo < hi;
      const int64_t row = bh * s.lq + i;
      const double l = lse[row];
      if (sees ? !std::isfinite(l) : l != -std::numeric_limits<double>::infinity()) {
        if (bad_l++ == 0) first_l = row;
      }
      for (int64_t col = 0; col < s.dv; ++col) {
        const double x = y[row * s.dv + col];
        if (!std::isfinite(x) || std::abs(x) > ybound || (!sees && x != 0)) {
          if (bad_y++ == 0) first_y = row * s.dv + col;
        }
      }
    }
  EXPECT_EQ(bad_y, 0) << "y: unwritten, non-finite, outside [-max|v|, max|v|] or nonzero on a "
                         "fully masked row; first at logical index "
                      << first_y << " = " << (first_y >= 0 ? y[first_y] : 0.0);
  EXPECT_EQ(bad_l, 0) << "lse: not finite where the row sees a key or not -inf where it sees none; "
                         "first at logical index "
                      << first_l << " = " << (first_l >= 0 ? lse[first_l] : 0.0);
}

}  // namespace baracuda::attention::testing
