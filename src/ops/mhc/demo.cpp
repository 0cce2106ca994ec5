// The mhc family's rows in baracuda-demo: the seed's fused static forward, the dynamic-H collapse
// (coefficients from the token's own RMS-normed projection) and the expand, on random data, each
// output checked against the float64 reference (ops/mhc/reference.hpp) with the harness tolerance
// table.
#include <algorithm>
#include <cmath>
#include <exception>
#include <optional>
#include <string>
#include <vector>

#include "baracuda/ops/mhc.hpp"
#include "core/testing/testing.hpp"
#include "ops/mhc/reference.hpp"

namespace baracuda {
namespace {

using harness::Accuracy;
using harness::DemoRow;
using harness::Layout;
using harness::Rng;
using harness::Target;
using harness::TestTensor;

enum class Kind { static_forward, collapse, expand };

struct Case {
  Kind kind;
  MhcH h;
  DType dtype;
  int64_t tokens, n, channels;
  SinkhornConfig sinkhorn;
  Layout layout;
};

std::string describe(const Case& c) {
  const char* k = c.kind == Kind::static_forward ? "static_forward"
                  : c.kind == Kind::collapse     ? "collapse"
                                                 : "expand";
  std::string s = std::string(k) + " " + std::string(name(c.dtype)) + " ";
  if (c.kind != Kind::static_forward) s += std::string(to_string(c.h)) + " ";
  return s + "T" + std::to_string(c.tokens) + " n" + std::to_string(c.n) + " C" +
         std::to_string(c.channels);
}

TestTensor rand_tensor(DType t, std::vector<int64_t> shape, Target tg, Layout l, Rng& rng,
                       double lo = -1.0, double hi = 1.0) {
  TestTensor x = TestTensor::make(t, std::move(shape), tg, l, &rng);
  x.fill_random(rng, lo, hi);
  return x;
}

// Parameters of either kind, with magnitudes that keep the logits O(1) (as mhc_test does).
struct Params {
  std::optional<TestTensor> h_pre, h_post, h_res, fn, scale, base;
  Params(const MhcProblem& p, Target tg, Rng& rng) {
    if (p.h == MhcH::static_h) {
      h_pre = rand_tensor(DType::f32, {p.n}, tg, Layout::contiguous, rng, -2, 2);
      h_post = rand_tensor(DType::f32, {p.n}, tg, Layout::contiguous, rng, -2, 2);
      h_res = rand_tensor(DType::f32, {p.n, p.n}, tg, Layout::padded, rng, -2, 2);
    } else {
      const double a = 2.0 / std::sqrt(static_cast<double>(p.flat));
      fn = rand_tensor(DType::f32, {p.k, p.flat}, tg, Layout::padded, rng, -a, a);
      scale = rand_tensor(DType::f32, {3}, tg, Layout::contiguous, rng, 0.5, 1.5);
      base = rand_tensor(DType::f32, {p.k}, tg, Layout::contiguous, rng, -1, 1);
    }
  }
  MhcParams view() const {
    MhcParams w;
    if (h_pre) w.h_pre = h_pre->cview(), w.h_post = h_post->cview(), w.h_res = h_res->cview();
    if (fn) w.fn = fn->cview(), w.scale = scale->cview(), w.base = base->cview();
    return w;
  }
  mhc_ref::Params values() const {
    mhc_ref::Params d;
    if (h_pre) d.h_pre = h_pre->values(), d.h_post = h_post->values(), d.h_res = h_res->values();
    if (fn) d.fn = fn->values(), d.scale = scale->values(), d.base = base->values();
    return d;
  }
};

struct Scratch {
  std::optional<Buffer> buf;
  Result<Workspace> get(size_t bytes, Target target) {
    if (bytes == 0) return Workspace::none();
    auto b = Buffer::allocate(bytes, harness::location_for(target));
    if (!b.ok()) return b.error();
    buf = std::move(b).value();
    return buf->as_workspace();
  }
};

template <class PlanT>
Result<PlanT> select(Target target, const Case& c) {
  MhcDescriptor d;
  d.tokens = c.tokens, d.n = c.n, d.channels = c.channels, d.dtype = c.dtype, d.h = c.h;
  d.sinkhorn = c.sinkhorn;
  return PlanT::select(harness::stream_for(target), d);
}

DemoRow run_static_forward(Target target, const Case& c, Rng& rng) {
  DemoRow row{"mhc", describe(c), "", 0, 0, false, ""};
  auto plan = select<MhcStaticForwardPlan>(target, c);
  if (!plan.ok()) return harness::failed_row(row, plan.error());
  row.kernel = plan->sku().name;
  const MhcProblem& p = plan->problem();
  TestTensor x = rand_tensor(p.dtype, {p.tokens, p.n, p.channels}, target, c.layout, rng);
  TestTensor gamma =
      rand_tensor(DType::bf16, {p.channels}, target, Layout::contiguous, rng, 0.5, 1.5);
  TestTensor hp = rand_tensor(DType::f32, {p.n}, target, Layout::contiguous, rng, -2, 2);
  TestTensor hq = rand_tensor(DType::f32, {p.n}, target, Layout::contiguous, rng, -2, 2);
  TestTensor hr = rand_tensor(DType::f32, {p.n, p.n}, target, c.layout, rng, -2, 2);
  TestTensor out = TestTensor::make(p.dtype, {p.tokens, p.n, p.channels}, target, c.layout, &rng);
  Scratch scratch;
  auto ws = scratch.get(plan->workspace_size(), target);
  if (!ws.ok()) return harness::failed_row(row, ws.error());
  out.poison();
  (void)out.bytes();  // waits for the uploads (pageable copies) before the non-blocking stream runs
  if (auto st =
          plan->run(harness::stream_for(target), *ws,
                    {out.view(), x.cview(), gamma.cview(), hp.cview(), hq.cview(), hr.cview()});
      !st.ok())
    return harness::failed_row(row, st.error());
  const mhc_ref::Vec ref =
      mhc_ref::static_forward(p, x.values(), gamma.values(), hp.values(), hq.values(), hr.values());
  row.pass = true;
  harness::check_output(row, out.values(), ref, p.dtype, Accuracy::reduction, "out");
  return row;
}

DemoRow run_collapse(Target target, const Case& c, Rng& rng) {
  DemoRow row{"mhc", describe(c), "", 0, 0, false, ""};
  auto plan = select<MhcCollapsePlan>(target, c);
  if (!plan.ok()) return harness::failed_row(row, plan.error());
  row.kernel = plan->sku().name;
  const MhcProblem& p = plan->problem();
  TestTensor x = rand_tensor(p.dtype, {p.tokens, p.n, p.channels}, target, c.layout, rng);
  const Params w(p, target, rng);
  TestTensor y = TestTensor::make(p.dtype, {p.tokens, p.channels}, target, c.layout, &rng);
  TestTensor co = TestTensor::make(DType::f32, {p.rows, p.k}, target, c.layout, &rng);
  Scratch scratch;
  auto ws = scratch.get(plan->workspace_size(), target);
  if (!ws.ok()) return harness::failed_row(row, ws.error());
  y.poison();
  co.poison();
  (void)co.bytes();  // waits for the uploads before the non-blocking stream runs
  if (auto st =
          plan->run(harness::stream_for(target), *ws, {y.view(), co.view(), x.cview(), w.view()});
      !st.ok())
    return harness::failed_row(row, st.error());
  const mhc_ref::Collapsed ref = mhc_ref::collapse(p, x.values(), w.values());
  row.pass = true;
  // Held to what the plan claims: tf32 arithmetic (the tensor-core kernel) to f16's bound, TF32's
  // significand; 16-bit outputs keep their own, coarser, bound.
  const bool tf32 = plan->precision_guarantee().math == MathPrecision::tf32;
  const DType yclaim = tf32 && p.dtype == DType::f32 ? DType::f16 : p.dtype;
  harness::check_output(row, y.values(), ref.y, yclaim, Accuracy::reduction, "y");
  harness::check_output(row, co.values(), ref.coeffs, tf32 ? DType::f16 : DType::f32,
                        Accuracy::reduction, "coeffs");
  return row;
}

// Expand with the reference's coefficients of random parameters (independent of the collapse
// kernel) and a random sub-layer output.
DemoRow run_expand(Target target, const Case& c, Rng& rng) {
  DemoRow row{"mhc", describe(c), "", 0, 0, false, ""};
  auto plan = select<MhcExpandPlan>(target, c);
  if (!plan.ok()) return harness::failed_row(row, plan.error());
  row.kernel = plan->sku().name;
  const MhcProblem& p = plan->problem();
  TestTensor x = rand_tensor(p.dtype, {p.tokens, p.n, p.channels}, target, c.layout, rng);
  TestTensor f = rand_tensor(p.dtype, {p.tokens, p.channels}, target, c.layout, rng);
  const Params w(p, target, rng);
  TestTensor co = TestTensor::make(DType::f32, {p.rows, p.k}, target, c.layout, &rng);
  co.set_values(mhc_ref::collapse(p, x.values(), w.values()).coeffs);
  TestTensor out = TestTensor::make(p.dtype, {p.tokens, p.n, p.channels}, target, c.layout, &rng);
  Scratch scratch;
  auto ws = scratch.get(plan->workspace_size(), target);
  if (!ws.ok()) return harness::failed_row(row, ws.error());
  out.poison();
  (void)out.bytes();  // waits for the uploads before the non-blocking stream runs
  if (auto st = plan->run(harness::stream_for(target), *ws,
                          {out.view(), x.cview(), f.cview(), co.cview()});
      !st.ok())
    return harness::failed_row(row, st.error());
  const mhc_ref::Vec ref = mhc_ref::expand(p, x.values(), f.values(), co.values());
  row.pass = true;
  harness::check_output(row, out.values(), ref, p.dtype, Accuracy::reduction, "out");
  return row;
}

DemoRow run_case(Target target, const Case& c, Rng& rng) {
  try {  // an exception becomes a failed row, never a crash of the demo
    switch (c.kind) {
      case Kind::static_forward:
        return run_static_forward(target, c, rng);
      case Kind::collapse:
        return run_collapse(target, c, rng);
      case Kind::expand:
        return run_expand(target, c, rng);
    }
    return {"mhc", describe(c), "", 0, 0, false, "unknown case kind"};
  } catch (const std::exception& e) {
    return {"mhc", describe(c), "", 0, 0, false, std::string("exception: ") + e.what()};
  }
}

std::vector<DemoRow> mhc_demo(Target target) {
  Rng rng(harness::base_seed() ^ 0x3ecull);
  // DeepSeek-V4's Sinkhorn (softmax + eps, columns first, 20 iterations) and a plain variant.
  const SinkhornConfig v4{SinkhornInit::softmax_eps, SinkhornFirst::columns, 20, 1e-6};
  const SinkhornConfig plain{SinkhornInit::exp, SinkhornFirst::rows, 3, 1e-5};
  const std::vector<Case> cases = {
      {Kind::static_forward, MhcH::static_h, DType::bf16, 8, 4, 64, v4, Layout::contiguous},
      {Kind::collapse, MhcH::dynamic_h, DType::bf16, 8, 4, 64, v4, Layout::contiguous},
      {Kind::collapse, MhcH::dynamic_h, DType::f32, 5, 3, 24, plain, Layout::padded},
      {Kind::expand, MhcH::dynamic_h, DType::bf16, 8, 4, 64, v4, Layout::contiguous},
      {Kind::expand, MhcH::static_h, DType::f16, 6, 4, 40, plain, Layout::permuted},
  };
  std::vector<DemoRow> rows;
  for (const Case& c : cases) rows.push_back(run_case(target, c, rng));
  return rows;
}

[[maybe_unused]] const bool registered = harness::register_demo("mhc", mhc_demo);

}  // namespace
}  // namespace baracuda
