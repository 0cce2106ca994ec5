// Tests of the gated family: every gate x dtype x target over ranks 1..8, split axes, the three
// input layouts and contiguous / padded / permuted views, forward and backward against the float64
// reference; the backward reference against finite differences; the f32 kernel arithmetic against
// the reference; determinism and bit stability; every validation path.
#include <cmath>
#include <limits>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "baracuda/core/validate.hpp"
#include "baracuda/ops/gated.hpp"
#include "core/testing/testing.hpp"
#include "ops/gated/gate_math.hpp"
#include "ops/gated/gated_internal.hpp"

namespace baracuda {
namespace {

using harness::Accuracy;
using harness::close_to;
using harness::fails_with;
using harness::Layout;
using harness::Rng;
using harness::Target;
using harness::TestTensor;

constexpr Gate kGates[] = {Gate::glu,        Gate::reglu,          Gate::swiglu,  Gate::geglu_erf,
                           Gate::geglu_tanh, Gate::swiglu_clamped, Gate::bilinear};
constexpr DType kDTypes[] = {DType::f32, DType::f16, DType::bf16, DType::f64};

struct Case {
  std::vector<int64_t> shape;  // full input shape
  int split;
  GatedInput input;
  bool gate_first;
  Layout layout;
};

std::string describe_case(const Case& c) {
  std::string s = "shape=[";
  for (size_t i = 0; i < c.shape.size(); ++i) s += (i ? "," : "") + std::to_string(c.shape[i]);
  return s + "] split=" + std::to_string(c.split) + " input=" + std::string(to_string(c.input)) +
         (c.gate_first ? " gate_first" : "") + " layout=" + harness::layout_name(c.layout);
}

// Small shapes (the CPU suite must stay fast); every rank 1..8, first/middle/last/negative split
// axes, all three input layouts, gate_first, and every view layout. The CUDA target adds larger
// shapes that exercise the grid-stride loops and both kernel paths.
std::vector<Case> cases(Target t) {
  std::vector<Case> c = {
      {{16}, 0, GatedInput::halves, false, Layout::contiguous},
      {{6, 16}, -1, GatedInput::halves, false, Layout::contiguous},
      {{6, 16}, 1, GatedInput::halves, true, Layout::padded},
      {{3, 4, 10}, 1, GatedInput::halves, false, Layout::padded},
      {{4, 2, 6}, 0, GatedInput::halves, true, Layout::permuted},
      {{2, 3, 6, 4}, 2, GatedInput::interleaved, false, Layout::permuted},
      {{5, 12}, -1, GatedInput::interleaved, true, Layout::contiguous},
      {{4, 16}, -1, GatedInput::interleaved, false, Layout::contiguous},
      {{3, 2, 8}, -2, GatedInput::separate, false, Layout::padded},
      {{10}, 0, GatedInput::separate, false, Layout::contiguous},
      {{2, 3, 2, 4, 3}, 3, GatedInput::halves, false, Layout::permuted},
      {{2, 1, 2, 3, 1, 2}, 0, GatedInput::interleaved, false, Layout::padded},
      {{2, 1, 2, 1, 2, 1, 3}, 4, GatedInput::halves, false, Layout::padded},
      {{2, 1, 2, 1, 2, 1, 2, 4}, 7, GatedInput::interleaved, true, Layout::padded},
      {{1, 1, 1, 1, 1, 1, 1, 2}, -1, GatedInput::halves, false, Layout::contiguous},
      {{4, 0, 6}, 2, GatedInput::halves, false, Layout::contiguous},  // empty: a no-op
      {{0, 6}, 1, GatedInput::separate, false, Layout::padded},
  };
  if (t == Target::cuda) {
    c.push_back({{130, 2 * 264}, -1, GatedInput::halves, false, Layout::contiguous});
    c.push_back({{2 * 66, 3, 40}, 0, GatedInput::halves, true, Layout::contiguous});
    c.push_back({{3, 2 * 50, 45}, 1, GatedInput::halves, false, Layout::padded});
    c.push_back({{129, 2 * 96}, -1, GatedInput::interleaved, true, Layout::contiguous});
    c.push_back({{3, 50, 2 * 40}, 2, GatedInput::interleaved, false, Layout::contiguous});
    c.push_back({{70, 6, 64}, 1, GatedInput::separate, false, Layout::contiguous});
    c.push_back({{7, 2 * 36, 5}, 1, GatedInput::separate, false, Layout::permuted});
  }
  return c;
}

// Core harness gap: uploads are pageable host-to-device cudaMemcpy calls, which may return before
// their DMA lands, while plans run on a non-blocking stream. A read-back on the same (legacy)
// stream waits for every earlier upload, so call this after the last upload and before a run.
void settle(const TestTensor& t) {
  (void)t.bytes();
}

GatedDescriptor make_desc(Gate g, DType t, const Case& c) {
  GatedDescriptor d;
  d.gate = g;
  d.input = c.input;
  d.dtype = t;
  d.shape = c.shape;
  d.split_dim = c.split;
  d.gate_first = c.gate_first;
  d.alpha = 1.702;
  d.limit = 1.0;  // inputs span [-2, 2], so both clamps are active on part of the data
  return d;
}

std::vector<int64_t> as_vec(const Shape& s, int rank) {
  return {s.begin(), s.begin() + rank};
}

// Runs the forward case on `target`; checks every output element against the float64 oracle,
// the bytes outside y, and (the determinism claim) that a second run gives the same bytes.
void check_forward(Target target, Gate g, DType t, const Case& c, Rng& rng) {
  SCOPED_TRACE(describe_case(c));
  const Stream& stream = harness::stream_for(target);
  auto plan = GatedForwardPlan::select(stream, make_desc(g, t, c));
  BARACUDA_ASSERT_OK(plan);
  const GatedProblem& p = plan->problem();
  const auto out = as_vec(p.out_shape, p.rank), in = as_vec(p.in_shape, p.rank);
  const bool sep = p.input == GatedInput::separate;
  std::vector<TestTensor> inputs;
  inputs.push_back(TestTensor::make(t, sep ? out : in, target, c.layout, &rng));
  if (sep) inputs.push_back(TestTensor::make(t, out, target, c.layout, &rng));
  for (auto& i : inputs) i.fill_random(rng, -2.0, 2.0);
  TestTensor y = TestTensor::make(t, out, target, c.layout, &rng);
  y.poison();
  const auto before = y.bytes();
  GatedForwardOp::Arguments args{.y = y.view()};
  if (sep) {
    args.a = inputs[0].cview();
    args.b = inputs[1].cview();
  } else {
    args.x = inputs[0].cview();
  }
  BARACUDA_ASSERT_OK(plan->run(stream, Workspace::none(), args));
  const auto after = y.bytes();
  EXPECT_TRUE(harness::untouched_outside(before, after, y.bit_mask(), "forward y"));
  const auto ref = gated::forward_logical(p, inputs[0].values(),
                                          sep ? inputs[1].values() : std::vector<double>{});
  EXPECT_TRUE(close_to(y.values(), ref, t, Accuracy::elementwise, "forward y"));
  ASSERT_TRUE(plan->precision_guarantee().deterministic);
  y.poison();
  settle(y);
  BARACUDA_ASSERT_OK(plan->run(stream, Workspace::none(), args));
  EXPECT_TRUE(harness::bytes_equal(after, y.bytes(), "forward y, second run"));
}

void check_backward(Target target, Gate g, DType t, const Case& c, Rng& rng) {
  SCOPED_TRACE(describe_case(c));
  const Stream& stream = harness::stream_for(target);
  auto plan = GatedBackwardPlan::select(stream, make_desc(g, t, c));
  BARACUDA_ASSERT_OK(plan);
  const GatedProblem& p = plan->problem();
  const auto out = as_vec(p.out_shape, p.rank), in = as_vec(p.in_shape, p.rank);
  const bool sep = p.input == GatedInput::separate;
  std::vector<TestTensor> inputs, grads;
  inputs.push_back(TestTensor::make(t, sep ? out : in, target, c.layout, &rng));
  if (sep) inputs.push_back(TestTensor::make(t, out, target, c.layout, &rng));
  TestTensor dy = TestTensor::make(t, out, target, c.layout, &rng);
  for (auto& i : inputs) i.fill_random(rng, -2.0, 2.0);
  dy.fill_random(rng, -2.0, 2.0);
  grads.push_back(TestTensor::make(t, sep ? out : in, target, c.layout, &rng));
  if (sep) grads.push_back(TestTensor::make(t, out, target, c.layout, &rng));
  GatedBackwardOp::Arguments args{.dy = dy.cview()};
  if (sep) {
    args.a = inputs[0].cview();
    args.b = inputs[1].cview();
    args.da = grads[0].view();
    args.db = grads[1].view();
  } else {
    args.x = inputs[0].cview();
    args.dx = grads[0].view();
  }
  std::vector<std::vector<uint8_t>> before;
  for (auto& gr : grads) {
    gr.poison();
    before.push_back(gr.bytes());
  }
  BARACUDA_ASSERT_OK(plan->run(stream, Workspace::none(), args));
  std::vector<double> second_grad;
  const auto ref = gated::backward_logical(p, inputs[0].values(),
                                           sep ? inputs[1].values() : std::vector<double>{},
                                           dy.values(), &second_grad);
  std::vector<std::vector<uint8_t>> after;
  for (size_t k = 0; k < grads.size(); ++k) {
    after.push_back(grads[k].bytes());
    EXPECT_TRUE(harness::untouched_outside(before[k], after[k], grads[k].bit_mask(), "backward"));
    EXPECT_TRUE(close_to(grads[k].values(), k == 0 ? ref : second_grad, t, Accuracy::derivative,
                         k == 0 ? (sep ? "backward da" : "backward dx") : "backward db"));
  }
  ASSERT_TRUE(plan->precision_guarantee().deterministic);
  for (auto& gr : grads) gr.poison();
  settle(grads.back());
  BARACUDA_ASSERT_OK(plan->run(stream, Workspace::none(), args));
  for (size_t k = 0; k < grads.size(); ++k)
    EXPECT_TRUE(harness::bytes_equal(after[k], grads[k].bytes(), "backward, second run"));
}

using Param = std::tuple<Target, DType, Gate>;
class GatedMatrix : public ::testing::TestWithParam<Param> {};

TEST_P(GatedMatrix, ForwardMatchesReference) {
  const auto [target, dtype, gate] = GetParam();
  BARACUDA_SKIP_IF_UNAVAILABLE(target);
  Rng rng;
  for (const Case& c : cases(target)) check_forward(target, gate, dtype, c, rng);
}

TEST_P(GatedMatrix, BackwardMatchesReference) {
  const auto [target, dtype, gate] = GetParam();
  BARACUDA_SKIP_IF_UNAVAILABLE(target);
  Rng rng;
  for (const Case& c : cases(target)) check_backward(target, gate, dtype, c, rng);
}

// bit_stable: an element's bits do not depend on the view layout or the problem size. On CUDA the
// dense halves run the vectorized rows kernel, dense interleaved the pairs kernel, and the padded
// or permuted views the strided kernel (their pitches break the 16-byte alignment). The
// interleaved inputs hold the same (a, b) pairs as the halves ones.
TEST_P(GatedMatrix, SameBitsForEveryLayoutAndSize) {
  const auto [target, dtype, gate] = GetParam();
  BARACUDA_SKIP_IF_UNAVAILABLE(target);
  Rng rng;
  const Stream& stream = harness::stream_for(target);
  std::vector<double> first_values, first_out;
  for (const Case& c : {Case{{8, 64}, -1, GatedInput::halves, false, Layout::contiguous},
                        Case{{8, 64}, -1, GatedInput::halves, false, Layout::padded},
                        Case{{8, 64}, -1, GatedInput::halves, false, Layout::permuted},
                        Case{{8, 64}, -1, GatedInput::interleaved, false, Layout::contiguous},
                        Case{{8, 64}, -1, GatedInput::interleaved, false, Layout::padded}}) {
    auto plan = GatedForwardPlan::select(stream, make_desc(gate, dtype, c));
    BARACUDA_ASSERT_OK(plan);
    ASSERT_TRUE(plan->precision_guarantee().bit_stable);
    TestTensor x = TestTensor::make(dtype, c.shape, target, c.layout, &rng);
    if (first_values.empty()) {
      x.fill_random(rng, -2.0, 2.0);
      first_values = x.values();
    } else if (c.input == GatedInput::halves) {
      x.set_values(first_values);
    } else {  // row r: (a_j, b_j) = (x[r][j], x[r][32 + j]) moved to x[r][2j], x[r][2j + 1]
      std::vector<double> pairs(first_values.size());
      for (size_t r = 0; r < 8; ++r)
        for (size_t j = 0; j < 32; ++j) {
          pairs[r * 64 + 2 * j] = first_values[r * 64 + j];
          pairs[r * 64 + 2 * j + 1] = first_values[r * 64 + 32 + j];
        }
      x.set_values(pairs);
    }
    TestTensor y = TestTensor::make(dtype, {8, 32}, target, c.layout, &rng);
    y.poison();
    settle(y);
    BARACUDA_ASSERT_OK(plan->run(stream, Workspace::none(), {.y = y.view(), .x = x.cview()}));
    if (first_out.empty()) {
      first_out = y.values();
    } else {
      EXPECT_EQ(y.values(), first_out)
          << harness::layout_name(c.layout) << " " << to_string(c.input);
    }
  }
  // The first two rows alone (a smaller problem) give the same bits as in the large one.
  Case small{{2, 64}, -1, GatedInput::halves, false, Layout::contiguous};
  auto plan = GatedForwardPlan::select(stream, make_desc(gate, dtype, small));
  BARACUDA_ASSERT_OK(plan);
  TestTensor x = TestTensor::make(dtype, small.shape, target);
  x.set_values({first_values.begin(), first_values.begin() + 128});
  TestTensor y = TestTensor::make(dtype, {2, 32}, target);
  y.poison();
  settle(y);
  BARACUDA_ASSERT_OK(plan->run(stream, Workspace::none(), {.y = y.view(), .x = x.cview()}));
  EXPECT_EQ(y.values(), std::vector<double>(first_out.begin(), first_out.begin() + 64));
}

INSTANTIATE_TEST_SUITE_P(All, GatedMatrix,
                         ::testing::Combine(::testing::ValuesIn(harness::all_targets()),
                                            ::testing::ValuesIn(kDTypes),
                                            ::testing::ValuesIn(kGates)),
                         [](const ::testing::TestParamInfo<Param>& info) {
                           return harness::target_name(std::get<0>(info.param)) + "_" +
                                  std::string(name(std::get<1>(info.param))) + "_" +
                                  std::string(to_string(std::get<2>(info.param)));
                         });

// ---- The rows paths (tiles kernel): aligned, misaligned rows, and the variants
// ----------------------------------------------------------------------------

using gated::Path;
using gated::RowsKernel;

// The path a layout expecting `expected` (with a tiles kernel) takes when `kernel` serves it:
// misaligned rows go to the strided kernel unless a tiles kernel serves them.
Path path_with(Path expected, RowsKernel kernel) {
  return expected == Path::rows_unaligned && kernel == RowsKernel::legacy ? Path::strided
                                                                          : expected;
}

// 2-D operands with explicit strides: [rows, 2n] x (halves) or [rows, n] a and b (separate), and
// [rows, n] outputs / dy, every row pitched `pad` elements past its end, x-side tensors starting
// `offset` and y-side tensors `y_offset` elements into their buffers.
struct PitchCase {
  int64_t rows, n, pad, offset, y_offset;
  GatedInput input;
  Path expected;  // the path choose_path must pick for this layout with a tiles kernel
};

std::string describe(const PitchCase& c) {
  return "rows=" + std::to_string(c.rows) + " n=" + std::to_string(c.n) +
         " pad=" + std::to_string(c.pad) + " offset=" + std::to_string(c.offset) + "/" +
         std::to_string(c.y_offset) + " input=" + std::string(to_string(c.input)) +
         " expected=" + gated::to_string(c.expected);
}

struct PitchTensors {
  std::vector<TestTensor> in;   // x, or a and b
  std::vector<TestTensor> out;  // y, or dx, or da and db
  std::vector<TestTensor> dy;   // backward only
};

PitchTensors make_pitched(DType t, const PitchCase& c, bool backward, Target target, Rng& rng) {
  const bool sep = c.input == GatedInput::separate;
  const int64_t wide = sep ? c.n : 2 * c.n;
  auto in_side = [&] {
    return TestTensor::with_strides(t, {c.rows, wide}, {wide + c.pad, 1}, c.offset, target);
  };
  auto out_side = [&] {
    return TestTensor::with_strides(t, {c.rows, c.n}, {c.n + c.pad, 1}, c.y_offset, target);
  };
  PitchTensors r;
  for (int k = 0; k < (sep ? 2 : 1); ++k) r.in.push_back(in_side());
  for (auto& i : r.in) i.fill_random(rng, -2.0, 2.0);
  if (!backward) {
    r.out.push_back(out_side());
    return r;
  }
  r.dy.push_back(out_side());
  r.dy[0].fill_random(rng, -2.0, 2.0);
  for (int k = 0; k < (sep ? 2 : 1); ++k) r.out.push_back(in_side());
  return r;
}

// Runs one pitched case with the table's rows kernel and then every kernel pinned: each takes the
// expected path, every output element matches the float64 reference, bytes outside the outputs
// are untouched, a second run gives the same bytes (deterministic), and every kernel gives the
// same bytes as the default (bit_stable; misaligned rows on legacy take the strided kernel).
void check_pitched(Target target, DType t, Gate g, const PitchCase& c, bool backward, Rng& rng) {
  SCOPED_TRACE(describe(c) + (backward ? " backward" : " forward"));
  const Stream& stream = harness::stream_for(target);
  GatedDescriptor d;
  d.gate = g;
  d.input = c.input;
  d.dtype = t;
  d.shape = {c.rows, 2 * c.n};  // the descriptor's shape is the (virtual) concatenated input
  d.split_dim = -1;
  d.alpha = 1.702;
  d.limit = 1.0;  // inputs span [-2, 2], so both clamps are active on part of the data
  PitchTensors ts = make_pitched(t, c, backward, target, rng);
  const bool sep = c.input == GatedInput::separate;
  GatedForwardOp::Arguments fa;
  GatedBackwardOp::Arguments ba;
  if (!backward) {
    fa.y = ts.out[0].view();
    if (sep) {
      fa.a = ts.in[0].cview();
      fa.b = ts.in[1].cview();
    } else {
      fa.x = ts.in[0].cview();
    }
  } else {
    ba.dy = ts.dy[0].cview();
    if (sep) {
      ba.a = ts.in[0].cview();
      ba.b = ts.in[1].cview();
      ba.da = ts.out[0].view();
      ba.db = ts.out[1].view();
    } else {
      ba.x = ts.in[0].cview();
      ba.dx = ts.out[0].view();
    }
  }
  auto fplan = GatedForwardPlan::select(stream, d);
  auto bplan = GatedBackwardPlan::select(stream, d);
  BARACUDA_ASSERT_OK(fplan);
  BARACUDA_ASSERT_OK(bplan);
  const GatedProblem& p = fplan->problem();
  gated::Views v = backward ? gated::backward_views(p, ba) : gated::forward_views(p, fa);
  gated::collapse(v);
  auto path_now = [&] { return gated::to_string(gated::choose_path(v, t, backward)); };
  // The default: the table's kernel for this case.
  const bool aligned = c.expected == Path::rows;
  ASSERT_STREQ(path_now(), gated::to_string(path_with(
                               c.expected, gated::rows_kernel_for(t, backward, aligned))));
  auto run = [&] {
    for (auto& o : ts.out) o.poison();
    settle(ts.out.back());
    return backward ? bplan->run(stream, Workspace::none(), ba)
                    : fplan->run(stream, Workspace::none(), fa);
  };
  // The default kernel, against the reference.
  std::vector<std::vector<uint8_t>> before, first;
  for (auto& o : ts.out) {
    o.poison();
    before.push_back(o.bytes());
  }
  BARACUDA_ASSERT_OK(run());
  std::vector<double> second_grad;
  const std::vector<double> none;
  const auto ref =
      backward ? gated::backward_logical(p, ts.in[0].values(), sep ? ts.in[1].values() : none,
                                         ts.dy[0].values(), &second_grad)
               : gated::forward_logical(p, ts.in[0].values(), sep ? ts.in[1].values() : none);
  for (size_t k = 0; k < ts.out.size(); ++k) {
    first.push_back(ts.out[k].bytes());
    EXPECT_TRUE(harness::untouched_outside(before[k], first[k], ts.out[k].bit_mask(), "outputs"));
    EXPECT_TRUE(close_to(ts.out[k].values(), k == 0 ? ref : second_grad, t,
                         backward ? Accuracy::derivative : Accuracy::elementwise,
                         k == 0 ? "y / dx / da" : "db"));
  }
  // Deterministic: the same kernel again.
  BARACUDA_ASSERT_OK(run());
  for (size_t k = 0; k < ts.out.size(); ++k)
    EXPECT_TRUE(harness::bytes_equal(first[k], ts.out[k].bytes(), "second run"));
  // Every rows kernel pinned (PlanPreference::kernel): the expected path, and the same bits.
  for (RowsKernel variant : {RowsKernel::legacy, RowsKernel::tiles, RowsKernel::tiles_full_grid}) {
    SCOPED_TRACE(std::string("kernel ") + gated::to_string(variant));
    const std::string_view pinned = gated::cuda_kernel_name(backward, variant);
    auto fpin = GatedForwardPlan::select(stream, d, PlanPreference::kernel(pinned));
    auto bpin = GatedBackwardPlan::select(stream, d, PlanPreference::kernel(pinned));
    ASSERT_EQ(backward ? bpin.ok() : fpin.ok(), true) << "no plan pinned to " << pinned;
    EXPECT_EQ(backward ? bpin->sku().name : fpin->sku().name, pinned);
    ASSERT_STREQ(gated::to_string(gated::choose_path(v, t, backward, variant)),
                 gated::to_string(path_with(c.expected, variant)));
    for (auto& o : ts.out) o.poison();
    settle(ts.out.back());
    BARACUDA_ASSERT_OK(backward ? bpin->run(stream, Workspace::none(), ba)
                                : fpin->run(stream, Workspace::none(), fa));
    for (size_t k = 0; k < ts.out.size(); ++k)
      EXPECT_TRUE(harness::bytes_equal(first[k], ts.out[k].bytes(), "variant"));
  }
}

// Small layouts for every dtype and gate: misaligned pitched rows (bench's pitch+3 case in small),
// rows shorter than one vector, aligned rows, and operands misaligned differently (strided).
std::vector<PitchCase> pitch_cases() {
  return {
      {67, 1000, 3, 1, 1, GatedInput::halves, Path::rows_unaligned},
      {5, 7, 4, 3, 3, GatedInput::separate, Path::rows_unaligned},
      {33, 264, 0, 0, 0, GatedInput::halves, Path::rows},
      {9, 1000, 3, 1, 2, GatedInput::halves, Path::strided},
  };
}

using PitchParam = std::tuple<DType, Gate>;
class GatedRows : public ::testing::TestWithParam<PitchParam> {};

TEST_P(GatedRows, PitchedRowsMatchReferenceInEveryVariant) {
  const auto [dtype, gate] = GetParam();
  BARACUDA_SKIP_IF_UNAVAILABLE(Target::cuda);
  Rng rng;
  for (const PitchCase& c : pitch_cases())
    for (bool backward : {false, true}) check_pitched(Target::cuda, dtype, gate, c, backward, rng);
}

INSTANTIATE_TEST_SUITE_P(All, GatedRows,
                         ::testing::Combine(::testing::ValuesIn(kDTypes),
                                            ::testing::ValuesIn(kGates)),
                         [](const ::testing::TestParamInfo<PitchParam>& info) {
                           return std::string(name(std::get<0>(info.param))) + "_" +
                                  std::string(to_string(std::get<1>(info.param)));
                         });

// Enough tiles that every block of the one-wave grid loops (1024 rows of one tile each, more than
// an H100's 528 resident blocks of the bf16 kernels), misaligned and aligned; and rows of several
// tiles each (20000 elements: 5 bf16 / 10 f32 tiles per row), where only a row's first tile has a
// head slot. (8192 rows, b401dcb: the CPU-side checks made this one test outlast the device run.)
TEST(GatedRowsLarge, GridStrideOverManyTiles) {
  BARACUDA_SKIP_IF_UNAVAILABLE(Target::cuda);
  Rng rng;
  for (const PitchCase& c :
       {PitchCase{1024, 2048, 3, 5, 5, GatedInput::halves, Path::rows_unaligned},
        PitchCase{1024, 2048, 8, 0, 0, GatedInput::halves, Path::rows}})
    for (bool backward : {false, true})
      check_pitched(Target::cuda, DType::bf16, Gate::swiglu, c, backward, rng);
  for (DType t : {DType::bf16, DType::f32})
    for (const PitchCase& c :
         {PitchCase{48, 20000, 3, 1, 1, GatedInput::halves, Path::rows_unaligned},
          // 8 elements of padding keep every row 16-byte aligned for bf16 as well as f32 (4 did
          // not for bf16: the H100 run rightly took rows_unaligned there).
          PitchCase{48, 20000, 8, 0, 0, GatedInput::halves, Path::rows}})
      for (bool backward : {false, true})
        check_pitched(Target::cuda, t, Gate::swiglu, c, backward, rng);
}

// choose_path on host pointers (no GPU needed): which layouts take which path with the table's
// kernel, with the legacy kernel and with a tiles kernel pinned.
TEST(GatedPaths, ChoosePathByLayout) {
  constexpr int64_t rows = 4, n = 1000;
  alignas(16) static uint16_t x[rows * (2 * n + 8) + 16], y[rows * (n + 8) + 16];
  std::optional<RowsKernel> pinned;  // the rows kernel the paths below are chosen for
  auto path = [&](int64_t x_pitch, int64_t x_off, int64_t y_pitch, int64_t y_off,
                  GatedInput input = GatedInput::halves, DType t = DType::bf16) {
    GatedDescriptor d;
    d.gate = Gate::swiglu;
    d.dtype = t;
    d.input = input;
    d.shape = {rows, 2 * n};
    auto p = GatedForwardOp::make_problem(d);
    EXPECT_TRUE(p.ok());
    int64_t xs[] = {rows, 2 * n}, ys[] = {rows, n};
    int64_t xst[] = {x_pitch, 1}, yst[] = {y_pitch, 1};
    GatedForwardOp::Arguments a{
        .y = make_strided(y + y_off, t, ys, yst, Location::host(), sizeof y),
        .x = as_const(make_strided(x + x_off, t, xs, xst, Location::host(), sizeof x))};
    auto v = gated::forward_views(*p, a);
    gated::collapse(v);
    return std::string(gated::to_string(gated::choose_path(v, t, false, pinned)));
  };
  // The table's kernel for bf16 forward misaligned rows decides between the two paths.
  const bool tiles_unaligned =
      gated::rows_kernel_for(DType::bf16, false, false) != RowsKernel::legacy;
  EXPECT_EQ(path(2 * n, 0, n, 0), "rows");
  EXPECT_EQ(path(2 * n + 3, 0, n + 3, 0), tiles_unaligned ? "rows_unaligned" : "strided");
  EXPECT_EQ(path(2 * n, 0, n, 0, GatedInput::interleaved), "pairs");
  {
    pinned = RowsKernel::legacy;  // aligned rows only
    EXPECT_EQ(path(2 * n, 0, n, 0), "rows");
    EXPECT_EQ(path(2 * n + 3, 0, n + 3, 0), "strided");
    EXPECT_EQ(path(2 * n, 1, n, 1), "strided");
  }
  for (RowsKernel k : {RowsKernel::tiles, RowsKernel::tiles_full_grid}) {
    SCOPED_TRACE(gated::to_string(k));
    pinned = k;
    EXPECT_EQ(path(2 * n, 0, n, 0), "rows");                    // dense
    EXPECT_EQ(path(2 * n + 8, 0, n + 8, 8), "rows");            // pitched by 16 bytes
    EXPECT_EQ(path(2 * n + 3, 0, n + 3, 0), "rows_unaligned");  // bench's pitch+3
    EXPECT_EQ(path(2 * n + 3, 1, n + 3, 9), "rows_unaligned");  // same residue mod 16 bytes
    EXPECT_EQ(path(2 * n, 1, n, 1), "rows_unaligned");          // misaligned base, dense rows
    EXPECT_EQ(path(2 * n + 3, 0, n, 0), "strided");  // y dense, x pitched: residues differ
    EXPECT_EQ(path(2 * n, 1, n, 0), "strided");      // bases differ mod 16 bytes
    EXPECT_EQ(path(2 * n, 0, n, 0, GatedInput::interleaved), "pairs");
  }
}

// The selection table: one entry per (dtype, direction, alignment); rows_kernel_for returns the
// entry, legacy for a case not listed (f16, f64), and the pinned kernel when one is pinned.
TEST(GatedPaths, RowsKernelTable) {
  const auto table = gated::rows_table();
  ASSERT_FALSE(table.empty());
  for (size_t i = 0; i < table.size(); ++i) {
    const gated::RowsChoice& c = table[i];
    SCOPED_TRACE(std::string(name(c.dtype)) + (c.backward ? " backward" : " forward") +
                 (c.aligned ? " aligned" : " misaligned"));
    for (size_t j = 0; j < i; ++j)
      EXPECT_FALSE(table[j].dtype == c.dtype && table[j].backward == c.backward &&
                   table[j].aligned == c.aligned)
          << "duplicate entry " << j << " and " << i;
    EXPECT_EQ(gated::rows_kernel_for(c.dtype, c.backward, c.aligned), c.kernel);
    EXPECT_EQ(gated::rows_kernel_for(c.dtype, c.backward, c.aligned, RowsKernel::tiles_full_grid),
              RowsKernel::tiles_full_grid);
  }
  for (DType t : {DType::f16, DType::f64})
    for (bool backward : {false, true})
      for (bool aligned : {false, true})
        EXPECT_EQ(gated::rows_kernel_for(t, backward, aligned), RowsKernel::legacy);
  // Every pinned rows kernel is a registered kernel of its own, with a distinct name.
  std::set<std::string_view> names;
  for (bool backward : {false, true})
    for (std::optional<RowsKernel> k :
         {std::optional<RowsKernel>{}, std::optional(RowsKernel::legacy),
          std::optional(RowsKernel::tiles), std::optional(RowsKernel::tiles_full_grid)})
      EXPECT_TRUE(names.insert(gated::cuda_kernel_name(backward, k)).second);
}

// ---- The float64 reference
// ------------------------------------------------------------------------

// The backward reference is the gradient of the forward reference, for every gate and layout.
TEST(GatedReference, BackwardMatchesFiniteDifferences) {
  Rng rng;
  for (Gate g : kGates) {
    for (const Case& c : {Case{{3, 8}, -1, GatedInput::halves, false, Layout::contiguous},
                          Case{{4, 3, 2}, 0, GatedInput::interleaved, true, Layout::contiguous},
                          Case{{2, 6}, 1, GatedInput::separate, false, Layout::contiguous}}) {
      SCOPED_TRACE(std::string(to_string(g)) + " " + describe_case(c));
      auto p = GatedForwardOp::make_problem(make_desc(g, DType::f64, c));
      BARACUDA_ASSERT_OK(p);
      const bool sep = c.input == GatedInput::separate;
      const int64_t n_out = p->out_numel;
      const int64_t n_first = sep ? n_out : 2 * n_out;
      // Separate inputs are packed as [a, b] into one vector for the finite differences.
      std::vector<double> x(static_cast<size_t>(sep ? 2 * n_out : n_first)), dy(n_out);
      for (double& v : x) v = rng.uniform(-2.0, 2.0);
      for (double& v : dy) v = rng.uniform(-2.0, 2.0);
      auto unpack = [&](const std::vector<double>& v) {
        std::vector<double> f(v.begin(), v.begin() + n_first), s;
        if (sep) s.assign(v.begin() + n_first, v.end());
        return std::pair{f, s};
      };
      auto forward = [&](const std::vector<double>& v) {
        auto [f, s] = unpack(v);
        return gated::forward_logical(*p, f, s);
      };
      auto [f, s] = unpack(x);
      std::vector<double> db;
      std::vector<double> grad = gated::backward_logical(*p, f, s, dy, &db);
      if (sep) grad.insert(grad.end(), db.begin(), db.end());
      EXPECT_TRUE(harness::gradient_matches_fd(forward, x, dy, grad, rng, 64, 1e-6, 1e-6));
    }
  }
}

// Spot values computed separately (Python's math module, from the published formulas of
// torch.sigmoid, F.silu, F.gelu, F.gelu(approximate="tanh") and gpt-oss's swiglu), so a wrong
// constant cannot hide in both the reference and the kernels.
TEST(GatedReference, KnownValues) {
  using gated::reference_forward;
  EXPECT_NEAR(reference_forward(Gate::glu, 0, 0, 2.0, 1.0), 2 * 0.7310585786300049, 1e-15);
  EXPECT_NEAR(reference_forward(Gate::swiglu, 0, 0, 3.0, 1.0), 3 * 0.7310585786300049, 1e-15);
  EXPECT_NEAR(reference_forward(Gate::geglu_erf, 0, 0, 1.0, 1.0), 0.8413447460685429, 1e-15);
  EXPECT_NEAR(reference_forward(Gate::geglu_erf, 0, 0, 1.0, -0.5), -0.15426876936299347, 1e-15);
  EXPECT_NEAR(reference_forward(Gate::geglu_tanh, 0, 0, 1.0, 1.0), 0.8411919906082768, 1e-15);
  EXPECT_NEAR(reference_forward(Gate::geglu_tanh, 0, 0, 1.0, -0.5), -0.15428599017485606, 1e-15);
  EXPECT_EQ(reference_forward(Gate::reglu, 0, 0, 3.0, -1.0), 0.0);
  EXPECT_EQ(reference_forward(Gate::reglu, 0, 0, 3.0, 2.0), 6.0);
  EXPECT_EQ(reference_forward(Gate::bilinear, 0, 0, 3.0, -2.0), -6.0);
  // gpt-oss: x_glu=10 clamps to 7, x_linear=-9 clamps to -7: 7*sigmoid(1.702*7)*(-7+1).
  EXPECT_NEAR(reference_forward(Gate::swiglu_clamped, 1.702, 7.0, -9.0, 10.0),
              7 * (1 / (1 + std::exp(-1.702 * 7))) * -6, 1e-12);
  EXPECT_NEAR(reference_forward(Gate::swiglu_clamped, 1.702, 7.0, 0.5, 1.0),
              0.8457957659328212 * 1.5, 1e-12);
  double da = 0, db = 0;
  gated::reference_backward(Gate::swiglu_clamped, 1.702, 7.0, 8.0, 9.0, 1.0, &da, &db);
  EXPECT_EQ(da, 0.0);  // both clamps active: no gradient
  EXPECT_EQ(db, 0.0);
}

// The f32 arithmetic the CUDA kernels run (gate_math.hpp, compiled here for the host) stays
// within the f32, f16 and bf16 elementwise tolerances of the float64 reference. This is what lets
// the 16-bit and f32 GPU results be held to the same table as the reference backend.
template <Gate G>
void check_f32_math(Rng& rng) {
  SCOPED_TRACE(std::string(to_string(G)));
  const gated::GateParams<float> pf{1.702f, 1.0f};
  for (DType t : {DType::f32, DType::f16, DType::bf16}) {
    std::vector<double> y, yr, da, dar, db, dbr;
    for (int i = 0; i < 4096; ++i) {
      const double a = round_to(t, rng.uniform(-2, 2)), b = round_to(t, rng.uniform(-2, 2)),
                   dy = round_to(t, rng.uniform(-2, 2));
      y.push_back(round_to(t, gated::gate_forward<G, float>(float(a), float(b), pf)));
      yr.push_back(gated::reference_forward(G, 1.702, 1.0, a, b));
      float fa, fb;
      gated::gate_backward<G, float>(float(a), float(b), float(dy), pf, &fa, &fb);
      da.push_back(round_to(t, fa));
      db.push_back(round_to(t, fb));
      double ra, rb;
      gated::reference_backward(G, 1.702, 1.0, a, b, dy, &ra, &rb);
      dar.push_back(ra);
      dbr.push_back(rb);
    }
    EXPECT_TRUE(close_to(y, yr, t, Accuracy::elementwise, "f32 math forward"));
    EXPECT_TRUE(close_to(da, dar, t, Accuracy::derivative, "f32 math da"));
    EXPECT_TRUE(close_to(db, dbr, t, Accuracy::derivative, "f32 math db"));
  }
  // And the f64 instantiation is the reference's function to within a few roundings.
  const gated::GateParams<double> pd{1.702, 1.0};
  std::vector<double> y, yr;
  for (int i = 0; i < 1024; ++i) {
    const double a = rng.uniform(-2, 2), b = rng.uniform(-2, 2);
    y.push_back(gated::gate_forward<G, double>(a, b, pd));
    yr.push_back(gated::reference_forward(G, 1.702, 1.0, a, b));
  }
  EXPECT_TRUE(close_to(y, yr, DType::f64, Accuracy::elementwise, "f64 math forward"));
}

TEST(GatedKernelMath, F32ArithmeticWithinTolerance) {
  Rng rng;
  check_f32_math<Gate::glu>(rng);
  check_f32_math<Gate::reglu>(rng);
  check_f32_math<Gate::swiglu>(rng);
  check_f32_math<Gate::geglu_erf>(rng);
  check_f32_math<Gate::geglu_tanh>(rng);
  check_f32_math<Gate::swiglu_clamped>(rng);
  check_f32_math<Gate::bilinear>(rng);
}

// ---- Plans and validation
// -------------------------------------------------------------------------

GatedDescriptor basic(std::vector<int64_t> shape, int split = -1) {
  GatedDescriptor d;
  d.gate = Gate::swiglu;
  d.dtype = DType::f32;
  d.shape = std::move(shape);
  d.split_dim = split;
  return d;
}

TEST(GatedPlan, CpuStreamSelectsTheReference) {
  const Stream& cpu = harness::stream_for(Target::cpu);
  for (DType t : kDTypes) {
    auto d = basic({4, 8});
    d.dtype = t;
    auto f = GatedForwardPlan::select(cpu, d);
    BARACUDA_ASSERT_OK(f);
    EXPECT_EQ(f->sku().name, "gated_forward_reference");
    EXPECT_EQ(f->sku().element, t);
    EXPECT_EQ(f->workspace_size(), 0u);
    auto b = GatedBackwardPlan::select(cpu, d);
    BARACUDA_ASSERT_OK(b);
    EXPECT_EQ(b->sku().name, "gated_backward_reference");
    EXPECT_EQ(b->problem().out_shape[1], 4);
  }
}

TEST(GatedPlan, CudaStreamSelectsTheCudaKernel) {
  BARACUDA_SKIP_IF_UNAVAILABLE(Target::cuda);
  const Stream& s = harness::stream_for(Target::cuda);
  for (DType t : kDTypes) {
    auto d = basic({4, 8});
    d.dtype = t;
    auto f = GatedForwardPlan::select(s, d);
    BARACUDA_ASSERT_OK(f);
    EXPECT_EQ(f->sku().name, "gated_forward_cuda");
    EXPECT_EQ(f->precision_guarantee().math,
              t == DType::f64 ? MathPrecision::f64 : MathPrecision::f32);
    auto b = GatedBackwardPlan::select(s, d);
    BARACUDA_ASSERT_OK(b);
    EXPECT_EQ(b->sku().name, "gated_backward_cuda");
  }
}

// Random descriptors, edges included: planned or refused naming the op, never a crash or overflow.
TEST(GatedErrors, RandomDescriptorsArePlannedOrRefused) {
  Rng rng;
  const Stream cpu = Stream::cpu();
  int planned = 0;
  for (int i = 0; i < 20000; ++i) {
    GatedDescriptor d;
    d.gate = static_cast<Gate>(rng.integer(0, kGateCount));
    d.input = static_cast<GatedInput>(rng.integer(0, 3));
    d.dtype = harness::any_dtype(rng);
    const int rank = static_cast<int>(rng.integer(0, 9));
    for (int a = 0; a < rank; ++a) d.shape.push_back(harness::small_or_edge(rng, 8));
    d.split_dim = static_cast<int>(rng.integer(-10, 10));
    d.gate_first = rng.coin();
    if (rng.integer(0, 3) == 0) d.alpha = rng.coin() ? -1.0 : std::nan("");
    if (rng.integer(0, 3) == 0) d.limit = rng.coin() ? 0.0 : HUGE_VAL;
    ASSERT_TRUE((harness::plans_or_names_ops<GatedForwardOp, GatedBackwardOp>(cpu, d, &planned)))
        << "case " << i;
  }
  EXPECT_GT(planned, 100);
}

TEST(GatedErrors, DescriptorRules) {
  const Stream& cpu = harness::stream_for(Target::cpu);
  EXPECT_TRUE(fails_with(GatedForwardPlan::select(cpu, basic({})), ErrorKind::invalid_problem,
                         {"gated_forward: shape: rank 0 is outside [1, 8]"}));
  EXPECT_TRUE(fails_with(GatedBackwardPlan::select(cpu, basic({1, 1, 1, 1, 1, 1, 1, 1, 2})),
                         ErrorKind::invalid_problem, {"gated_backward: shape: rank 9"}));
  EXPECT_TRUE(fails_with(GatedForwardPlan::select(cpu, basic({4, -2})), ErrorKind::invalid_problem,
                         {"gated_forward: shape: shape[1]=-2 is negative"}));
  EXPECT_TRUE(
      fails_with(GatedForwardPlan::select(cpu, basic({4, 6}, 2)), ErrorKind::invalid_problem,
                 {"gated_forward: split_dim=2 is out of range for rank 2 (allowed [-2, 2))"}));
  EXPECT_TRUE(fails_with(GatedBackwardPlan::select(cpu, basic({4, 6}, -3)),
                         ErrorKind::invalid_problem,
                         {"gated_backward: split_dim=-3 is out of range"}));
  EXPECT_TRUE(fails_with(GatedForwardPlan::select(cpu, basic({4, 7})), ErrorKind::invalid_problem,
                         {"gated_forward: shape[1]=7 along split_dim=-1 is odd"}));
  EXPECT_TRUE(fails_with(GatedForwardPlan::select(cpu, basic({5, 6}, 0)),
                         ErrorKind::invalid_problem, {"shape[0]=5 along split_dim=0 is odd"}));
  auto d = basic({4, 6});
  d.gate = static_cast<Gate>(9);
  EXPECT_TRUE(fails_with(GatedForwardPlan::select(cpu, d), ErrorKind::invalid_problem,
                         {"gated_forward: gate=9 is not a Gate (0..6)"}));
  d = basic({4, 6});
  d.input = static_cast<GatedInput>(5);
  EXPECT_TRUE(fails_with(GatedForwardPlan::select(cpu, d), ErrorKind::invalid_problem,
                         {"gated_forward: input=5 is not a GatedInput"}));
  d = basic({4, 6});
  d.gate = Gate::swiglu_clamped;
  d.limit = -1;
  EXPECT_TRUE(fails_with(GatedForwardPlan::select(cpu, d), ErrorKind::invalid_problem,
                         {"gated_forward: limit=-1: must be finite and > 0"}));
  d.limit = std::numeric_limits<double>::infinity();
  EXPECT_TRUE(fails_with(GatedBackwardPlan::select(cpu, d), ErrorKind::invalid_problem,
                         {"gated_backward: limit=inf"}));
  d.limit = 7;
  d.alpha = std::nan("");
  EXPECT_TRUE(fails_with(GatedForwardPlan::select(cpu, d), ErrorKind::invalid_problem,
                         {"gated_forward: alpha=nan: must be finite"}));
  d = basic({4, 6});
  d.dtype = DType::i32;
  EXPECT_TRUE(fails_with(GatedForwardPlan::select(cpu, d), ErrorKind::unsupported,
                         {"gated_forward: no kernel for element=i32"}));
}

// Each argument rule fails with its message and leaves the output untouched.
TEST(GatedErrors, ForwardArgumentRules) {
  const Stream& cpu = harness::stream_for(Target::cpu);
  Rng rng;
  auto plan = GatedForwardPlan::select(cpu, basic({4, 8}));
  BARACUDA_ASSERT_OK(plan);
  TestTensor x = TestTensor::make(DType::f32, {4, 8}, Target::cpu);
  x.fill_random(rng);
  TestTensor y = TestTensor::make(DType::f32, {4, 4}, Target::cpu);
  y.poison();
  const auto y_before = y.bytes();
  const GatedForwardOp::Arguments good{.y = y.view(), .x = x.cview()};
  auto expect_fails = [&](GatedForwardOp::Arguments a, ErrorKind kind, std::string_view msg) {
    EXPECT_TRUE(fails_with(plan->run(cpu, Workspace::none(), a), kind, {msg}));
    EXPECT_TRUE(harness::bytes_equal(y_before, y.bytes(), "y after a rejected run"));
  };
  auto a = good;
  a.y.shape[1] = 8;
  expect_fails(a, ErrorKind::invalid_problem, "gated_forward: y: shape[1]=8, expected 4");
  a = good;
  a.x.dtype = DType::f16;
  expect_fails(a, ErrorKind::invalid_problem, "gated_forward: x: dtype f16, expected f32");
  a = good;
  a.x.buffer_bytes = 64;
  expect_fails(a, ErrorKind::buffer_too_small, "gated_forward: x: view f32[4,8]");
  a = good;
  a.y.stride[0] = 0;
  expect_fails(a, ErrorKind::invalid_problem, "gated_forward: y: stride[0]=0 broadcasts");
  a = good;
  a.a = x.cview();
  expect_fails(a, ErrorKind::invalid_problem,
               "gated_forward: a: must be left empty for input=halves (pass x)");
  a = good;
  a.b = x.cview();
  expect_fails(a, ErrorKind::invalid_problem, "gated_forward: b: must be left empty");
  a = good;
  a.y = x.window({0, 2}, {4, 4});  // y inside x
  expect_fails(a, ErrorKind::invalid_problem, "gated_forward: y and x overlap");
  a = good;
  a.x = {};
  expect_fails(a, ErrorKind::invalid_problem, "gated_forward: x: rank 0, expected 2");
  a = good;
  a.x.where = Location::cuda(0);
  expect_fails(a, ErrorKind::wrong_device, "gated_forward: x: declared on cuda:0");

  // Separate inputs.
  auto d = basic({4, 8});
  d.input = GatedInput::separate;
  auto sep = GatedForwardPlan::select(cpu, d);
  BARACUDA_ASSERT_OK(sep);
  TestTensor ta = TestTensor::make(DType::f32, {4, 4}, Target::cpu);
  TestTensor tb = TestTensor::make(DType::f32, {4, 4}, Target::cpu);
  ta.fill_random(rng);
  tb.fill_random(rng);
  const GatedForwardOp::Arguments sgood{.y = y.view(), .a = ta.cview(), .b = tb.cview()};
  BARACUDA_EXPECT_OK(sep->can_implement(sgood));
  auto s = sgood;
  s.x = x.cview();
  EXPECT_TRUE(
      fails_with(sep->run(cpu, Workspace::none(), s), ErrorKind::invalid_problem,
                 {"gated_forward: x: must be left empty for input=separate (pass a and b)"}));
  s = sgood;
  s.b.shape[0] = 3;
  EXPECT_TRUE(fails_with(sep->run(cpu, Workspace::none(), s), ErrorKind::invalid_problem,
                         {"gated_forward: b: shape[0]=3, expected 4"}));
  s = sgood;
  s.b = as_const(y.view());
  EXPECT_TRUE(fails_with(sep->run(cpu, Workspace::none(), s), ErrorKind::invalid_problem,
                         {"gated_forward: y and b overlap"}));
  s = sgood;
  s.a = as_const(y.view());
  EXPECT_TRUE(fails_with(sep->run(cpu, Workspace::none(), s), ErrorKind::invalid_problem,
                         {"gated_forward: y and a overlap"}));
  EXPECT_TRUE(harness::bytes_equal(y_before, y.bytes(), "y after rejected runs"));
  // Broadcast inputs (stride 0) are legal and read the same element for every row.
  s = sgood;
  s.b.stride[0] = 0;
  BARACUDA_EXPECT_OK(sep->run(cpu, Workspace::none(), s));
  auto p = sep->problem();
  std::vector<double> bvals = tb.values();
  for (int r = 1; r < 4; ++r)
    for (int c = 0; c < 4; ++c) bvals[r * 4 + c] = bvals[c];
  EXPECT_TRUE(close_to(y.values(), gated::forward_logical(p, ta.values(), bvals), DType::f32,
                       Accuracy::elementwise, "broadcast b"));
}

TEST(GatedErrors, BackwardArgumentRules) {
  const Stream& cpu = harness::stream_for(Target::cpu);
  Rng rng;
  auto plan = GatedBackwardPlan::select(cpu, basic({4, 8}));
  BARACUDA_ASSERT_OK(plan);
  TestTensor x = TestTensor::make(DType::f32, {4, 8}, Target::cpu);
  TestTensor dy = TestTensor::make(DType::f32, {4, 4}, Target::cpu);
  TestTensor dx = TestTensor::make(DType::f32, {4, 8}, Target::cpu);
  x.fill_random(rng);
  dy.fill_random(rng);
  dx.poison();
  const auto before = dx.bytes();
  const GatedBackwardOp::Arguments good{.dx = dx.view(), .x = x.cview(), .dy = dy.cview()};
  BARACUDA_EXPECT_OK(plan->can_implement(good));
  auto expect_fails = [&](GatedBackwardOp::Arguments a, ErrorKind kind, std::string_view msg) {
    EXPECT_TRUE(fails_with(plan->run(cpu, Workspace::none(), a), kind, {msg}));
    EXPECT_TRUE(harness::bytes_equal(before, dx.bytes(), "dx after a rejected run"));
  };
  auto a = good;
  a.dy.shape[1] = 8;
  expect_fails(a, ErrorKind::invalid_problem, "gated_backward: dy: shape[1]=8, expected 4");
  a = good;
  a.dx.shape[1] = 4;
  expect_fails(a, ErrorKind::invalid_problem, "gated_backward: dx: shape[1]=4, expected 8");
  a = good;
  a.x.rank = 3;
  expect_fails(a, ErrorKind::invalid_problem, "gated_backward: x: rank 3, expected 2");
  a = good;
  a.dx = Tensor{const_cast<void*>(x.cview().data), DType::f32, 2, x.view().shape, x.view().stride};
  expect_fails(a, ErrorKind::invalid_problem, "gated_backward: dx and x overlap");
  a = good;
  a.dy = as_const(dx.window({0, 0}, {4, 4}));
  expect_fails(a, ErrorKind::invalid_problem, "gated_backward: dx and dy overlap");
  a = good;
  a.da = dx.view();
  expect_fails(a, ErrorKind::invalid_problem,
               "gated_backward: da: must be left empty for input=halves (pass dx)");
  a = good;
  a.db = dx.view();
  expect_fails(a, ErrorKind::invalid_problem, "gated_backward: db: must be left empty");
  a = good;
  a.a = x.cview();
  expect_fails(a, ErrorKind::invalid_problem, "gated_backward: a: must be left empty");
  a = good;
  a.dx.buffer_bytes = 100;
  expect_fails(a, ErrorKind::buffer_too_small, "gated_backward: dx: view f32[4,8]");

  auto d = basic({4, 8});
  d.input = GatedInput::separate;
  auto sep = GatedBackwardPlan::select(cpu, d);
  BARACUDA_ASSERT_OK(sep);
  TestTensor ta = TestTensor::make(DType::f32, {4, 4}, Target::cpu);
  TestTensor tb = TestTensor::make(DType::f32, {4, 4}, Target::cpu);
  TestTensor gda = TestTensor::make(DType::f32, {4, 4}, Target::cpu);
  TestTensor gdb = TestTensor::make(DType::f32, {4, 4}, Target::cpu);
  ta.fill_random(rng);
  tb.fill_random(rng);
  const GatedBackwardOp::Arguments sgood{
      .dy = dy.cview(), .da = gda.view(), .db = gdb.view(), .a = ta.cview(), .b = tb.cview()};
  BARACUDA_EXPECT_OK(sep->can_implement(sgood));
  auto s = sgood;
  s.dx = dx.view();
  EXPECT_TRUE(
      fails_with(sep->run(cpu, Workspace::none(), s), ErrorKind::invalid_problem,
                 {"gated_backward: dx: must be left empty for input=separate (pass da and db)"}));
  s = sgood;
  s.x = x.cview();
  EXPECT_TRUE(fails_with(sep->run(cpu, Workspace::none(), s), ErrorKind::invalid_problem,
                         {"gated_backward: x: must be left empty for input=separate"}));
  s = sgood;
  s.db = gda.view();
  EXPECT_TRUE(fails_with(sep->run(cpu, Workspace::none(), s), ErrorKind::invalid_problem,
                         {"gated_backward: da and db overlap"}));
  s = sgood;
  s.da =
      Tensor{const_cast<void*>(ta.cview().data), DType::f32, 2, ta.view().shape, ta.view().stride};
  EXPECT_TRUE(fails_with(sep->run(cpu, Workspace::none(), s), ErrorKind::invalid_problem,
                         {"gated_backward: da and a overlap"}));
  s = sgood;
  s.db =
      Tensor{const_cast<void*>(tb.cview().data), DType::f32, 2, tb.view().shape, tb.view().stride};
  EXPECT_TRUE(fails_with(sep->run(cpu, Workspace::none(), s), ErrorKind::invalid_problem,
                         {"gated_backward: db and b overlap"}));
  s = sgood;
  s.da = dx.window({0, 0}, {4, 4});
  s.dy = as_const(dx.window({0, 4}, {4, 4}));
  EXPECT_TRUE(fails_with(sep->run(cpu, Workspace::none(), s), ErrorKind::invalid_problem,
                         {"gated_backward: da and dy overlap"}));
  s = sgood;
  s.b.dtype = DType::bf16;
  EXPECT_TRUE(fails_with(sep->run(cpu, Workspace::none(), s), ErrorKind::invalid_problem,
                         {"gated_backward: b: dtype bf16, expected f32"}));
  EXPECT_TRUE(harness::bytes_equal(before, dx.bytes(), "dx after rejected runs"));
}

// Host memory handed to a GPU plan is refused before anything launches.
TEST(GatedErrors, HostMemoryOnAGpuPlan) {
  BARACUDA_SKIP_IF_UNAVAILABLE(Target::cuda);
  const Stream& s = harness::stream_for(Target::cuda);
  auto plan = GatedForwardPlan::select(s, basic({4, 8}));
  BARACUDA_ASSERT_OK(plan);
  std::vector<float> hx(32, 1.0f), hy(16, -3.0f);
  int64_t xs[] = {4, 8}, ys[] = {4, 4};
  GatedForwardOp::Arguments a{
      .y = make_tensor(hy.data(), DType::f32, ys, Location::cuda(0)),
      .x = make_tensor(static_cast<const void*>(hx.data()), DType::f32, xs, Location::cuda(0))};
  EXPECT_TRUE(fails_with(plan->run(s, Workspace::none(), a), ErrorKind::wrong_device,
                         {"gated_forward: y: pointer", "is host memory"}));
  EXPECT_EQ(hy[0], -3.0f);
  auto cpu_plan = GatedForwardPlan::select(harness::stream_for(Target::cpu), basic({4, 8}));
  BARACUDA_ASSERT_OK(cpu_plan);
  EXPECT_TRUE(fails_with(cpu_plan->run(s, Workspace::none(), a), ErrorKind::wrong_device,
                         {"gated_forward: stream: plan was selected for cpu but run on cuda:0"}));
}

// Random argument mistakes (harness::fuzz_arguments) on every target, forward and backward, halves
// and separate inputs, f32 and bf16: refused naming the op with the outputs untouched, or
// accepted and run inside the real buffers (ASan in CI).
class GatedArgs : public ::testing::TestWithParam<Target> {};
INSTANTIATE_TEST_SUITE_P(Targets, GatedArgs, ::testing::ValuesIn(harness::all_targets()),
                         [](const auto& i) { return harness::target_name(i.param); });

TEST_P(GatedArgs, RandomArgumentMistakes) {
  using harness::ArgView;
  const Target target = GetParam();
  BARACUDA_SKIP_IF_UNAVAILABLE(target);
  const Stream& stream = harness::stream_for(target);
  Rng rng;
  int accepted = 0;
  auto make = [&](DType t, std::vector<int64_t> shape) {
    TestTensor x = TestTensor::make(t, std::move(shape), target, Layout::padded, &rng);
    x.fill_random(rng);
    return x;
  };
  for (DType dtype : {DType::f32, DType::bf16})
    for (GatedInput input : {GatedInput::halves, GatedInput::separate}) {
      SCOPED_TRACE(std::string(name(dtype)) + (input == GatedInput::separate ? " separate" : ""));
      auto d = basic({3, 5, 8});
      d.dtype = dtype, d.input = input;
      const bool sep = input == GatedInput::separate;
      TestTensor x = make(dtype, {3, 5, 8}), a = make(dtype, {3, 5, 4}), b = make(dtype, {3, 5, 4});
      TestTensor y = make(dtype, {3, 5, 4}), dy = make(dtype, {3, 5, 4});
      TestTensor dx = make(dtype, {3, 5, 8}), da = make(dtype, {3, 5, 4}),
                 db = make(dtype, {3, 5, 4});
      auto fwd = GatedForwardPlan::select(stream, d);
      auto bwd = GatedBackwardPlan::select(stream, d);
      BARACUDA_ASSERT_OK(fwd);
      BARACUDA_ASSERT_OK(bwd);
      GatedForwardOp::Arguments f{.y = y.view()};
      GatedBackwardOp::Arguments g{.dy = dy.cview()};
      if (sep) {
        f.a = a.cview(), f.b = b.cview();
        g.da = da.view(), g.db = db.view(), g.a = a.cview(), g.b = b.cview();
      } else {
        f.x = x.cview();
        g.dx = dx.view(), g.x = x.cview();
      }
      BARACUDA_ASSERT_OK(fwd->can_implement(f));
      BARACUDA_ASSERT_OK(bwd->can_implement(g));
      EXPECT_TRUE(harness::fuzz_arguments(
          stream, *fwd, Workspace::none(), f,
          [](GatedForwardOp::Arguments& v) {
            return std::vector<ArgView>{{"y", v.y}, {"x", v.x}, {"a", v.a}, {"b", v.b}};
          },
          {&y}, "gated_forward", rng, 800, &accepted));
      EXPECT_TRUE(harness::fuzz_arguments(
          stream, *bwd, Workspace::none(), g,
          [](GatedBackwardOp::Arguments& v) {
            return std::vector<ArgView>{{"dx", v.dx}, {"x", v.x}, {"dy", v.dy}, {"da", v.da},
                                        {"db", v.db}, {"a", v.a}, {"b", v.b}};
          },
          sep ? std::vector<TestTensor*>{&da, &db} : std::vector<TestTensor*>{&dx},
          "gated_backward", rng, 800, &accepted));
    }
  EXPECT_GT(accepted, 0);
}

// The views every backend walks: halves, interleaved and gate_first place a and b where the
// header says, and collapsing a dense [M, 2N] split on the last axis leaves [M, N] rows.
TEST(GatedViews, LayoutsAndCollapse) {
  auto d = basic({3, 8});
  auto p = GatedForwardOp::make_problem(d);
  BARACUDA_ASSERT_OK(p);
  std::vector<float> x(24), y(12);
  int64_t xs[] = {3, 8}, ys[] = {3, 4};
  GatedForwardOp::Arguments args{
      .y = make_tensor(y.data(), DType::f32, ys),
      .x = make_tensor(static_cast<const void*>(x.data()), DType::f32, xs)};
  auto v = gated::forward_views(*p, args);
  EXPECT_EQ(v.ptr[gated::Views::a], reinterpret_cast<char*>(x.data()));
  EXPECT_EQ(v.ptr[gated::Views::b], reinterpret_cast<char*>(x.data() + 4));
  gated::collapse(v);
  EXPECT_EQ(v.rank, 2);
  EXPECT_EQ(v.shape[1], 4);
  EXPECT_EQ(v.stride[gated::Views::a][0], 8);
  EXPECT_EQ(v.stride[gated::Views::y][0], 4);
  d.input = GatedInput::interleaved;
  d.gate_first = true;
  p = GatedForwardOp::make_problem(d);
  BARACUDA_ASSERT_OK(p);
  v = gated::forward_views(*p, args);
  EXPECT_EQ(v.ptr[gated::Views::b], reinterpret_cast<char*>(x.data()));
  EXPECT_EQ(v.ptr[gated::Views::a], reinterpret_cast<char*>(x.data() + 1));
  EXPECT_EQ(v.stride[gated::Views::a][1], 2);
  // A dense [2, 3, 4] split on axis 0: a and b are dense [3, 4] blocks, one row of 12.
  d = basic({2, 3, 4}, 0);
  p = GatedForwardOp::make_problem(d);
  BARACUDA_ASSERT_OK(p);
  int64_t xs3[] = {2, 3, 4}, ys3[] = {1, 3, 4};
  args = {.y = make_tensor(y.data(), DType::f32, ys3),
          .x = make_tensor(static_cast<const void*>(x.data()), DType::f32, xs3)};
  v = gated::forward_views(*p, args);
  gated::collapse(v);
  EXPECT_EQ(v.rank, 1);
  EXPECT_EQ(v.shape[0], 12);
  EXPECT_EQ(v.ptr[gated::Views::b], reinterpret_cast<char*>(x.data() + 12));
}

}  // namespace
}  // namespace baracuda
