// Tests of the mHC ops: every plan against the float64 reference on random strided data (CPU and
// CUDA targets), every backward reference against finite differences, determinism, the comb index
// convention, and every validation path.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "baracuda/ops/mhc.hpp"
#include "core/testing/testing.hpp"
#include "ops/mhc/reference.hpp"

namespace baracuda {
namespace {

using harness::Accuracy;
using harness::close_to;
using harness::fails_with;
using harness::Layout;
using harness::Rng;
using harness::Target;
using harness::TestTensor;
using mhc_ref::Vec;

std::string label(const MhcProblem& p, Layout l) {
  return std::string(name(p.dtype)) + " T=" + std::to_string(p.tokens) +
         " n=" + std::to_string(p.n) + " C=" + std::to_string(p.channels) + " " +
         std::string(to_string(p.h)) + " " + std::string(to_string(p.sinkhorn.init)) + "/" +
         std::string(to_string(p.sinkhorn.first)) + "x" + std::to_string(p.sinkhorn.iters) + " " +
         harness::layout_name(l);
}

MhcDescriptor desc(int64_t t, int64_t n, int64_t c, DType dt, MhcH h,
                   SinkhornConfig s = SinkhornConfig{}) {
  MhcDescriptor d;
  d.tokens = t, d.n = n, d.channels = c, d.dtype = dt, d.h = h, d.sinkhorn = s;
  return d;
}

TestTensor rand_tensor(DType dt, std::vector<int64_t> shape, Target tg, Layout l, Rng& rng,
                       double lo = -1.0, double hi = 1.0) {
  TestTensor t = TestTensor::make(dt, std::move(shape), tg, l, &rng);
  t.fill_random(rng, lo, hi);
  return t;
}

// Parameters of either kind, with magnitudes that keep logits O(1).
struct ParamSet {
  std::optional<TestTensor> h_pre, h_post, h_res, fn, scale, base;
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
ParamSet make_params(const MhcProblem& p, Target tg, Rng& rng) {
  ParamSet s;
  if (p.h == MhcH::static_h) {
    s.h_pre = rand_tensor(DType::f32, {p.n}, tg, Layout::contiguous, rng, -2, 2);
    s.h_post = rand_tensor(DType::f32, {p.n}, tg, Layout::contiguous, rng, -2, 2);
    s.h_res = rand_tensor(DType::f32, {p.n, p.n}, tg, Layout::padded, rng, -2, 2);
  } else {
    const double a = 2.0 / std::sqrt(static_cast<double>(p.flat));
    s.fn = rand_tensor(DType::f32, {p.k, p.flat}, tg, Layout::padded, rng, -a, a);
    s.scale = rand_tensor(DType::f32, {3}, tg, Layout::contiguous, rng, 0.5, 1.5);
    s.base = rand_tensor(DType::f32, {p.k}, tg, Layout::contiguous, rng, -1, 1);
  }
  return s;
}

std::vector<SinkhornConfig> sinkhorn_variants() {
  return {{SinkhornInit::softmax_eps, SinkhornFirst::columns, 20, 1e-6},
          {SinkhornInit::exp, SinkhornFirst::rows, 3, 1e-5},
          {SinkhornInit::softmax_eps, SinkhornFirst::rows, 1, 1e-3},
          {SinkhornInit::exp, SinkhornFirst::columns, 7, 0.0}};
}

class Mhc : public ::testing::TestWithParam<Target> {};

// A device fault is sticky: every later CUDA call in the process fails, and the harness's next
// download aborts without naming the case. Waiting for the stream right after a case's first run
// names the case that faulted, then stops the process (the later cases could not run anyway).
void settled(const Stream& s, const std::string& what) {
  const Status st = s.synchronize();
  if (st.ok()) return;
  std::fprintf(stderr, "mhc test: device error after running %s: %s\n", what.c_str(),
               st.error().to_string().c_str());
  std::abort();
}

// Shapes per target: small on the CPU, larger (and odd, to hit every vector tail) on the GPU.
struct Shape3 {
  int64_t t, n, c;
};
std::vector<Shape3> shapes(Target tg) {
  if (tg == Target::cpu) return {{3, 1, 5}, {2, 3, 8}, {4, 4, 6}};
  return {{3, 1, 5}, {5, 3, 37}, {17, 4, 256}, {9, 4, 1030}, {2, 8, 4100}, {0, 4, 64}};
}

// ---- dense fast paths for the big GPU-only cases
// -------------------------------------------------------------------------------- The harness's
// helpers serve every layout by walking each element through unravel and a per-bit write mask
// (about 100 ns per element); the kernel cases below move about 10^8 elements, which took minutes.
// Their big tensors are dense row-major, so the view is one byte range of its buffer and the same
// checks become a memset, a memcmp and a decode loop, with the meaning of fill_random(), poison(),
// values() and untouched_outside() for such a view. Small and strided tensors keep the harness.
using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

struct Span {  // the bytes [begin, end) of a dense view inside its buffer
  size_t begin = 0, end = 0, esize = 0;
  DType dtype = DType::f32;
};
Span dense_span(const TestTensor& t) {
  const ConstTensor v = t.cview();
  int64_t pitch = 1;
  for (int d = v.rank - 1; d >= 0; --d) {
    if (v.shape[d] > 1 && v.stride[d] != pitch) {
      std::fprintf(stderr, "mhc test: dense_span of a strided view\n");
      std::abort();
    }
    pitch *= v.shape[d];
  }
  Span s;
  s.dtype = v.dtype;
  s.esize = static_cast<size_t>(bits_of(v.dtype) / 8);
  s.begin = static_cast<size_t>(static_cast<const char*>(v.data) -
                                static_cast<const char*>(t.buffer_data()));
  s.end = s.begin + static_cast<size_t>(v.numel()) * s.esize;
  return s;
}
TestTensor rand_dense(DType dt, std::vector<int64_t> shape, Target tg, Rng& rng, double lo = -1.0,
                      double hi = 1.0) {
  TestTensor t = TestTensor::make(dt, std::move(shape), tg, Layout::contiguous, &rng);
  const Span s = dense_span(t);
  std::vector<uint8_t> host = t.bytes();  // the gaps (tail bytes) keep their garbage
  const int64_t count = t.numel();
  for (int64_t i = 0; i < count; ++i)
    store_from_double(host.data() + s.begin, dt, i, rng.uniform(lo, hi));
  t.set_bytes(host);
  return t;
}
// Sets the view's bytes to 0xFF (NaN) and returns the buffer as uploaded: the "before" image,
// uploaded again (set_bytes) before each kernel of a case.
std::vector<uint8_t> poison_dense(TestTensor& t) {
  const Span s = dense_span(t);
  std::vector<uint8_t> host = t.bytes();
  std::fill(host.begin() + static_cast<long>(s.begin), host.begin() + static_cast<long>(s.end),
            uint8_t{0xFF});
  t.set_bytes(host);
  return host;
}
Vec dense_values(const std::vector<uint8_t>& bytes, const Span& s) {
  Vec out((s.end - s.begin) / s.esize);
  for (size_t i = 0; i < out.size(); ++i)
    out[i] = load_as_double(bytes.data() + s.begin, s.dtype, static_cast<int64_t>(i));
  return out;
}
Vec dense_values(const TestTensor& t) {
  return dense_values(t.bytes(), dense_span(t));
}
::testing::AssertionResult untouched_outside_dense(const std::vector<uint8_t>& before,
                                                   const std::vector<uint8_t>& after, const Span& s,
                                                   std::string_view what) {
  if (before.size() != after.size())
    return ::testing::AssertionFailure() << what << ": buffer sizes differ";
  for (size_t i = 0; i < before.size(); ++i) {
    if (i == s.begin) i = s.end;
    if (i >= before.size()) break;
    if (before[i] != after[i])
      return ::testing::AssertionFailure()
             << what << ": byte " << i << " outside the write set [" << s.begin << ", " << s.end
             << ") changed; seed " << harness::base_seed();
  }
  return ::testing::AssertionSuccess();
}
// The bytes of `part` (a dense output of `sub` rows) equal rows [lo, lo + sub) of `full`.
bool rows_equal(const std::vector<uint8_t>& full, const Span& fs, const std::vector<uint8_t>& part,
                const Span& ps, int64_t lo, int64_t row_elems) {
  const size_t off = fs.begin + static_cast<size_t>(lo * row_elems) * fs.esize;
  return std::equal(part.begin() + static_cast<long>(ps.begin),
                    part.begin() + static_cast<long>(ps.end),
                    full.begin() + static_cast<long>(off));
}

// Tokens the big cases compare with the float64 reference: every token up to 2^22 elements;
// beyond, every 7th token (7 is coprime with the CTA and cluster counts of an H100 or A100, so the
// samples cover every CTA and ring slot) plus the last two (the tail). Every element is still
// checked for being written (all_written), and the bit checks (reruns, windows) cover every byte.
std::vector<int64_t> checked_tokens(int64_t tokens, int64_t row_elems) {
  const int64_t step = tokens * row_elems > (int64_t{1} << 22) ? 7 : 1;
  std::vector<int64_t> rows;
  for (int64_t t = 0; t < tokens; t += step) rows.push_back(t);
  for (int64_t t = std::max<int64_t>(0, tokens - 2); t < tokens; ++t)
    if (rows.empty() || rows.back() < t) rows.push_back(t);
  return rows;
}
// The values of rows `rows` (row_elems elements each) of a dense view, in order.
Vec dense_rows(const std::vector<uint8_t>& bytes, const Span& s, const std::vector<int64_t>& rows,
               int64_t row_elems) {
  Vec out;
  out.reserve(rows.size() * static_cast<size_t>(row_elems));
  for (int64_t r : rows)
    for (int64_t e = 0; e < row_elems; ++e)
      out.push_back(load_as_double(bytes.data() + s.begin, s.dtype, r * row_elems + e));
  return out;
}
// No element of the dense view still holds the poison pattern (every byte 0xFF, a NaN).
::testing::AssertionResult all_written(const std::vector<uint8_t>& bytes, const Span& s,
                                       std::string_view what) {
  for (size_t i = s.begin; i < s.end; i += s.esize) {
    bool poisoned = true;
    for (size_t b = 0; b < s.esize; ++b) poisoned = poisoned && bytes[i + b] == 0xFF;
    if (poisoned)
      return ::testing::AssertionFailure() << what << ": element " << (i - s.begin) / s.esize
                                           << " was not written; seed " << harness::base_seed();
  }
  return ::testing::AssertionSuccess();
}
// The dtype whose tolerance a plan's claim implies: the output's, or the arithmetic's where that is
// coarser (tf32 keeps f16's 11-bit significand, so a tf32 claim is held to f16's bound).
DType claimed_dtype(DType out, const PrecisionGuarantee& g) {
  return g.math == MathPrecision::tf32 && out == DType::f32 ? DType::f16 : out;
}

// ---- static forward
// -------------------------------------------------------------------------------
TEST_P(Mhc, StaticForwardMatchesReference) {
  const Target tg = GetParam();
  BARACUDA_SKIP_IF_UNAVAILABLE(tg);
  Rng rng;
  const Stream& s = harness::stream_for(tg);
  int vi = 0;
  for (DType dt : {DType::f32, DType::bf16, DType::f16})
    for (const Shape3& sh : shapes(tg))
      for (Layout l : harness::all_layouts()) {
        const SinkhornConfig sk = sinkhorn_variants()[static_cast<size_t>(vi++ % 4)];
        auto plan = MhcStaticForwardPlan::select(s, desc(sh.t, sh.n, sh.c, dt, MhcH::static_h, sk));
        BARACUDA_ASSERT_OK(plan);
        const MhcProblem& p = plan->problem();
        const std::string what = label(p, l);
        TestTensor x = rand_tensor(dt, {p.tokens, p.n, p.channels}, tg, l, rng);
        TestTensor out = TestTensor::make(dt, {p.tokens, p.n, p.channels}, tg, l, &rng);
        TestTensor gamma =
            rand_tensor(DType::bf16, {p.channels}, tg, Layout::contiguous, rng, 0.5, 1.5);
        TestTensor hp = rand_tensor(DType::f32, {p.n}, tg, Layout::contiguous, rng, -2, 2);
        TestTensor hq = rand_tensor(DType::f32, {p.n}, tg, Layout::contiguous, rng, -2, 2);
        TestTensor hr = rand_tensor(DType::f32, {p.n, p.n}, tg, l, rng, -2, 2);
        out.poison();
        const auto before = out.bytes();
        auto ws = harness::poisoned_workspace(plan->workspace_size(), s.memory_location());
        BARACUDA_ASSERT_OK(ws);
        MhcStaticForwardOp::Arguments args{out.view(), x.cview(),  gamma.cview(),
                                           hp.cview(), hq.cview(), hr.cview()};
        BARACUDA_ASSERT_OK(plan->run(s, ws->as_workspace(), args));
        settled(s, what);
        const Vec ref = mhc_ref::static_forward(p, x.values(), gamma.values(), hp.values(),
                                                hq.values(), hr.values());
        EXPECT_TRUE(close_to(out.values(), ref, dt, Accuracy::reduction, what));
        EXPECT_TRUE(harness::untouched_outside(before, out.bytes(), out.bit_mask(), what));
        if (plan->precision_guarantee().deterministic) {
          const auto first = out.bytes();
          BARACUDA_ASSERT_OK(plan->run(s, ws->as_workspace(), args));
          EXPECT_TRUE(harness::bytes_equal(first, out.bytes(), what + " rerun"));
        }
      }
}

// The default one-token-per-CTA kernel (static_forward_staged: aligned layouts, the token in a
// block's shared memory), the register kernel and the two-pass kernel pinned, on batches of
// hundreds to thousands of tokens (many tokens per SM); plus the bit-stability of each: a window
// of the batch gives the same bits for its tokens. The kernels of a case share its inputs,
// reference and output buffers (dense fast paths above); cases over 2^22 elements compare every
// 7th token with the reference (checked_tokens); each case prints its time.
TEST_P(Mhc, StaticForwardKernelsMatchReference) {
  const Target tg = GetParam();
  BARACUDA_SKIP_IF_UNAVAILABLE(tg);
  if (tg == Target::cpu) GTEST_SKIP() << "CUDA kernels only (the CPU plan is the reference)";
  Rng rng;
  const Stream& s = harness::stream_for(tg);
  const std::vector<Shape3> cases = {{5000, 4, 256}, {700, 4, 4096}, {1500, 4, 4096},
                                     {300, 8, 1024}, {400, 3, 1000}, {500, 1, 512},
                                     {7, 4, 4100}};
  int vi = 0;
  for (DType dt : {DType::f32, DType::bf16, DType::f16})
    for (const Shape3& sh : cases) {
      const Clock::time_point t0 = Clock::now();
      const SinkhornConfig sk = sinkhorn_variants()[static_cast<size_t>(vi++ % 4)];
      const MhcDescriptor d = desc(sh.t, sh.n, sh.c, dt, MhcH::static_h, sk);
      TestTensor x = rand_dense(dt, {sh.t, sh.n, sh.c}, tg, rng);
      TestTensor gamma = rand_tensor(DType::bf16, {sh.c}, tg, Layout::contiguous, rng, 0.5, 1.5);
      TestTensor hp = rand_tensor(DType::f32, {sh.n}, tg, Layout::contiguous, rng, -2, 2);
      TestTensor hq = rand_tensor(DType::f32, {sh.n}, tg, Layout::contiguous, rng, -2, 2);
      TestTensor hr = rand_tensor(DType::f32, {sh.n, sh.n}, tg, Layout::padded, rng, -2, 2);
      TestTensor out = TestTensor::make(dt, {sh.t, sh.n, sh.c}, tg, Layout::contiguous, &rng);
      const Span os = dense_span(out);
      const std::vector<uint8_t> poisoned = poison_dense(out);
      // Bit-stability window: tokens [lo, lo + sub) alone, so every token sits in another slot.
      const int64_t lo = sh.t / 3, sub = sh.t - lo - 1;
      TestTensor out2 = TestTensor::make(dt, {sub, sh.n, sh.c}, tg, Layout::contiguous, &rng);
      const Span os2 = dense_span(out2);
      const std::vector<uint8_t> poisoned2 = poison_dense(out2);
      const std::vector<int64_t> rows = checked_tokens(sh.t, sh.n * sh.c);
      std::optional<Vec> ref;  // of the checked tokens; every kernel solves the same problem
      double ref_s = 0;
      int kernels = 0;
      for (std::string_view pin : {std::string_view{}, std::string_view{"static_forward_fused"},
                                   std::string_view{"static_forward_regs"}}) {
        // The register kernel: n <= 4, 16-byte chunks, at most 4 chunks per stream and thread.
        const int64_t esize = bits_of(dt) / 8;
        if (pin == "static_forward_regs" &&
            (sh.n > 4 || sh.c % (16 / esize) != 0 || sh.c / (16 / esize) > 1024))
          continue;
        const PlanPreference pref =
            pin.empty() ? PlanPreference::fastest() : PlanPreference::kernel(pin);
        auto plan = MhcStaticForwardPlan::select(s, d, pref);
        BARACUDA_ASSERT_OK(plan);
        const MhcProblem& p = plan->problem();
        const std::string what =
            label(p, Layout::contiguous) + " kernel=" + std::string(plan->sku().name);
        if (pin.empty() && p.channels % (16 / (bits_of(dt) / 8)) == 0) {
          EXPECT_EQ(plan->sku().name, "static_forward_staged") << what;
        }
        ++kernels;
        out.set_bytes(poisoned);
        auto ws = harness::poisoned_workspace(plan->workspace_size(), s.memory_location());
        BARACUDA_ASSERT_OK(ws);
        MhcStaticForwardOp::Arguments args{out.view(), x.cview(),  gamma.cview(),
                                           hp.cview(), hq.cview(), hr.cview()};
        BARACUDA_ASSERT_OK(plan->run(s, ws->as_workspace(), args));
        settled(s, what);
        if (!ref) {
          const Clock::time_point tr = Clock::now();
          MhcProblem ps = p;
          ps.tokens = static_cast<int64_t>(rows.size());
          ref = mhc_ref::static_forward(ps, dense_rows(x.bytes(), dense_span(x), rows, p.flat),
                                        gamma.values(), hp.values(), hq.values(), hr.values());
          ref_s = seconds_since(tr);
        }
        const std::vector<uint8_t> first = out.bytes();
        EXPECT_TRUE(
            close_to(dense_rows(first, os, rows, p.flat), *ref, dt, Accuracy::reduction, what));
        EXPECT_TRUE(all_written(first, os, what));
        EXPECT_TRUE(untouched_outside_dense(poisoned, first, os, what));
        BARACUDA_ASSERT_OK(plan->run(s, ws->as_workspace(), args));
        EXPECT_TRUE(harness::bytes_equal(first, out.bytes(), what + " rerun"));
        if (!plan->precision_guarantee().bit_stable) continue;
        MhcDescriptor d2 = d;
        d2.tokens = sub;
        auto plan2 = MhcStaticForwardPlan::select(s, d2, pref);
        BARACUDA_ASSERT_OK(plan2);
        EXPECT_EQ(plan2->sku().name, plan->sku().name) << what;
        out2.set_bytes(poisoned2);
        auto ws2 = harness::poisoned_workspace(plan2->workspace_size(), s.memory_location());
        BARACUDA_ASSERT_OK(ws2);
        MhcStaticForwardOp::Arguments args2{
            out2.view(),   as_const(x.window({lo, 0, 0}, {sub, p.n, p.channels})),
            gamma.cview(), hp.cview(),
            hq.cview(),    hr.cview()};
        BARACUDA_ASSERT_OK(plan2->run(s, ws2->as_workspace(), args2));
        EXPECT_TRUE(rows_equal(first, os, out2.bytes(), os2, lo, p.flat))
            << what << " a window of the batch differs from the full batch";
      }
      std::printf(
          "[ mhc time ] static forward %s T=%lld n=%lld C=%lld: %d kernels, %.2f s "
          "(reference %.2f s)\n",
          std::string(name(dt)).c_str(), static_cast<long long>(sh.t), static_cast<long long>(sh.n),
          static_cast<long long>(sh.c), kernels, seconds_since(t0), ref_s);
    }
}

// ---- collapse and expand, forward
// -----------------------------------------------------------------
TEST_P(Mhc, CollapseAndExpandMatchReference) {
  const Target tg = GetParam();
  BARACUDA_SKIP_IF_UNAVAILABLE(tg);
  Rng rng;
  const Stream& s = harness::stream_for(tg);
  int vi = 0;
  for (MhcH h : {MhcH::static_h, MhcH::dynamic_h})
    for (DType dt : {DType::f32, DType::bf16, DType::f16})
      for (const Shape3& sh : shapes(tg))
        for (Layout l : harness::all_layouts()) {
          const SinkhornConfig sk = sinkhorn_variants()[static_cast<size_t>(vi++ % 4)];
          const MhcDescriptor d = desc(sh.t, sh.n, sh.c, dt, h, sk);
          auto cp = MhcCollapsePlan::select(s, d);
          auto ep = MhcExpandPlan::select(s, d);
          BARACUDA_ASSERT_OK(cp);
          BARACUDA_ASSERT_OK(ep);
          const MhcProblem& p = cp->problem();
          const std::string what = label(p, l);
          TestTensor x = rand_tensor(dt, {p.tokens, p.n, p.channels}, tg, l, rng);
          const ParamSet w = make_params(p, tg, rng);
          TestTensor y = TestTensor::make(dt, {p.tokens, p.channels}, tg, l, &rng);
          TestTensor co = TestTensor::make(DType::f32, {p.rows, p.k}, tg, l, &rng);
          y.poison();
          co.poison();
          const auto yb = y.bytes(), cb = co.bytes();
          auto ws = harness::poisoned_workspace(
              std::max(cp->workspace_size(), ep->workspace_size()), s.memory_location());
          BARACUDA_ASSERT_OK(ws);
          MhcCollapseOp::Arguments ca{y.view(), co.view(), x.cview(), w.view()};
          BARACUDA_ASSERT_OK(cp->run(s, ws->as_workspace(), ca));
          settled(s, what);
          const mhc_ref::Collapsed ref = mhc_ref::collapse(p, x.values(), w.values());
          EXPECT_TRUE(close_to(co.values(), ref.coeffs,
                               claimed_dtype(DType::f32, cp->precision_guarantee()),
                               Accuracy::reduction, what + " coeffs"));
          EXPECT_TRUE(close_to(y.values(), ref.y, claimed_dtype(dt, cp->precision_guarantee()),
                               Accuracy::reduction, what + " y"));
          EXPECT_TRUE(harness::untouched_outside(yb, y.bytes(), y.bit_mask(), what + " y"));
          EXPECT_TRUE(harness::untouched_outside(cb, co.bytes(), co.bit_mask(), what + " coeffs"));
          if (cp->precision_guarantee().deterministic) {
            const auto y1 = y.bytes(), c1 = co.bytes();
            BARACUDA_ASSERT_OK(cp->run(s, ws->as_workspace(), ca));
            EXPECT_TRUE(harness::bytes_equal(y1, y.bytes(), what + " y rerun"));
            EXPECT_TRUE(harness::bytes_equal(c1, co.bytes(), what + " coeffs rerun"));
          }
          // Expand with the coefficients just computed and a random sub-layer output.
          TestTensor f = rand_tensor(dt, {p.tokens, p.channels}, tg, l, rng);
          TestTensor out = TestTensor::make(dt, {p.tokens, p.n, p.channels}, tg, l, &rng);
          out.poison();
          const auto ob = out.bytes();
          MhcExpandOp::Arguments ea{out.view(), x.cview(), f.cview(), co.cview()};
          BARACUDA_ASSERT_OK(ep->run(s, ws->as_workspace(), ea));
          settled(s, what);
          const Vec eref = mhc_ref::expand(p, x.values(), f.values(), co.values());
          EXPECT_TRUE(close_to(out.values(), eref, dt, Accuracy::reduction, what + " expand"));
          EXPECT_TRUE(
              harness::untouched_outside(ob, out.bytes(), out.bit_mask(), what + " expand"));
          if (ep->precision_guarantee().deterministic) {
            const auto o1 = out.bytes();
            BARACUDA_ASSERT_OK(ep->run(s, ws->as_workspace(), ea));
            EXPECT_TRUE(harness::bytes_equal(o1, out.bytes(), what + " expand rerun"));
          }
        }
}

// ---- dynamic collapse: the tensor-core, cluster and split-K kernels, side by side
// -------------- The cluster kernels need 16-byte aligned X / y / fn rows (the layouts above are
// mostly unaligned, so they exercise their fallback); here everything is aligned. Shapes: tokens
// not a multiple of the tile (24 f32, 40 16-bit), more tiles than clusters (the persistent loop and
// its double-buffered partials), slices of unequal width (C / VEC not a multiple of 8), CTAs with
// no channels (C = 8), n = 1, 3, 4, 8, C that no 16-bit slice divides (the cluster kernels do not
// fit) and C % 128 != 0 (the tensor-core kernel does not fit). Each plan must also be bit-stable:
// a window of the batch gives the same bits for its tokens. Every kernel is checked against the
// bound its precision guarantee claims (claimed_dtype); the tensor-core kernel's measured error is
// printed. The kernels of a case share its inputs and reference; cases over 2^22 elements compare
// every 7th token with the reference (checked_tokens); each case prints its time.
TEST_P(Mhc, DynamicCollapseKernelsMatchReference) {
  const Target tg = GetParam();
  BARACUDA_SKIP_IF_UNAVAILABLE(tg);
  if (tg == Target::cpu) GTEST_SKIP() << "CUDA kernels only (the CPU plan is the reference)";
  Rng rng;
  const Stream& s = harness::stream_for(tg);
  const bool sm90 = s.caps().sm >= 90;
  struct Case {
    int64_t t, n, c;
  };
  const std::vector<Case> cases = {{37, 4, 4096}, {1000, 4, 4096}, {100, 4, 1028}, {5, 1, 4096},
                                   {50, 3, 2056}, {30, 8, 1024},   {3, 4, 8},      {41, 4, 2052},
                                   {20, 3, 128},  {77, 4, 2048},   {18, 4, 1024}};
  int vi = 0;
  for (DType dt : {DType::f32, DType::bf16, DType::f16})
    for (const Case& cs : cases) {
      const Clock::time_point t0 = Clock::now();
      const SinkhornConfig sk = sinkhorn_variants()[static_cast<size_t>(vi++ % 4)];
      const MhcDescriptor d = desc(cs.t, cs.n, cs.c, dt, MhcH::dynamic_h, sk);
      const int64_t vec = 16 / (bits_of(dt) / 8), flat = cs.n * cs.c, k = (2 + cs.n) * cs.n;
      const bool fits16 = sm90 && cs.n == 4 && (cs.c == 1024 || cs.c == 2048 || cs.c == 4096);
      // Inputs shared by every kernel of the case.
      TestTensor x = rand_dense(dt, {cs.t, cs.n, cs.c}, tg, rng);
      ParamSet w;
      const double amp = 2.0 / std::sqrt(static_cast<double>(flat));
      w.fn = rand_dense(DType::f32, {k, flat}, tg, rng, -amp, amp);
      w.scale = rand_tensor(DType::f32, {3}, tg, Layout::contiguous, rng, 0.5, 1.5);
      w.base = rand_tensor(DType::f32, {k}, tg, Layout::contiguous, rng, -1, 1);
      TestTensor y = TestTensor::make(dt, {cs.t, cs.c}, tg, Layout::contiguous, &rng);
      TestTensor co = TestTensor::make(DType::f32, {cs.t, k}, tg, Layout::padded, &rng);
      const Span ys = dense_span(y);
      const std::vector<uint8_t> ypoison = poison_dense(y);
      co.poison();
      const std::vector<uint8_t> cpoison = co.bytes(), cmask = co.bit_mask();
      // Bit-stability window: tokens [lo, lo + sub) alone, so every token sits in another slot.
      const int64_t lo = cs.t / 3, sub = cs.t - lo - 1;
      TestTensor y2 = TestTensor::make(dt, {sub, cs.c}, tg, Layout::contiguous, &rng);
      TestTensor co2 = TestTensor::make(DType::f32, {sub, k}, tg, Layout::contiguous, &rng);
      const Span ys2 = dense_span(y2);
      const std::vector<int64_t> rows = checked_tokens(cs.t, flat);
      std::optional<mhc_ref::Collapsed> ref;  // of the checked tokens, shared by every kernel
      double ref_s = 0;
      int kernels = 0;
      for (std::string_view pin : {std::string_view{}, std::string_view{"collapse"},
                                   std::string_view{"collapse_dynamic_cluster"},
                                   std::string_view{"collapse_dynamic_cluster_tf32"},
                                   std::string_view{"collapse_split_tf32"},
                                   std::string_view{"collapse_dynamic_push16_tf32"},
                                   std::string_view{"collapse_dynamic_push32_tf32"}}) {
        // The cluster kernels serve sm_90 and 16-byte slices; the tensor-core one C % 128 == 0;
        // the 16-CTA ones n = 4 and C in {1024, 2048, 4096}, 32-token tiles 16-bit X.
        // collapse_split_tf32 fits every dynamic shape (its logits fall back to CUDA cores where
        // C % 16 != 0 or rows are unaligned).
        if (pin == "collapse_dynamic_cluster" && (!sm90 || cs.c % vec != 0)) continue;
        if (pin == "collapse_dynamic_cluster_tf32" && (!sm90 || cs.c % 128 != 0)) continue;
        if (pin == "collapse_dynamic_push16_tf32" && !fits16) continue;
        if (pin == "collapse_dynamic_push32_tf32" && (!fits16 || dt == DType::f32)) continue;
        const PlanPreference pref =
            pin.empty() ? PlanPreference::fastest() : PlanPreference::kernel(pin);
        auto cp = MhcCollapsePlan::select(s, d, pref);
        BARACUDA_ASSERT_OK(cp);
        const MhcProblem& p = cp->problem();
        const std::string what =
            label(p, Layout::contiguous) + " kernel=" + std::string(cp->sku().name);
        // The default: the 16-CTA one-pass kernel where it fits (32-token tiles for bf16), else
        // split-K with its logits on tensor cores.
        if (pin.empty()) {
          const char* want = !fits16             ? "collapse_split_tf32"
                             : dt == DType::bf16 ? "collapse_dynamic_push32_tf32"
                                                 : "collapse_dynamic_push16_tf32";
          EXPECT_EQ(cp->sku().name, want) << what;
        }
        ++kernels;
        y.set_bytes(ypoison);
        co.set_bytes(cpoison);
        auto ws = harness::poisoned_workspace(cp->workspace_size(), s.memory_location());
        BARACUDA_ASSERT_OK(ws);
        MhcCollapseOp::Arguments ca{y.view(), co.view(), x.cview(), w.view()};
        BARACUDA_ASSERT_OK(cp->run(s, ws->as_workspace(), ca));
        settled(s, what);
        if (!ref) {
          const Clock::time_point tr = Clock::now();
          MhcProblem ps = p;
          ps.tokens = ps.rows = static_cast<int64_t>(rows.size());
          ref =
              mhc_ref::collapse(ps, dense_rows(x.bytes(), dense_span(x), rows, p.flat), w.values());
          ref_s = seconds_since(tr);
        }
        const std::vector<uint8_t> y1 = y.bytes(), c1 = co.bytes();
        const Vec yv = dense_rows(y1, ys, rows, p.channels), cv = co.values();
        Vec cvr;  // the checked tokens' rows
        for (int64_t r : rows)
          cvr.insert(cvr.end(), cv.begin() + r * p.k, cv.begin() + (r + 1) * p.k);
        const PrecisionGuarantee& pg = cp->precision_guarantee();
        EXPECT_TRUE(close_to(cvr, ref->coeffs, claimed_dtype(DType::f32, pg), Accuracy::reduction,
                             what + " coeffs"));
        EXPECT_TRUE(std::all_of(cv.begin(), cv.end(), [](double v) { return std::isfinite(v); }))
            << what << " coeffs: a row was not written";
        EXPECT_TRUE(all_written(y1, ys, what + " y"));
        EXPECT_TRUE(close_to(yv, ref->y, claimed_dtype(dt, pg), Accuracy::reduction, what + " y"));
        if (pg.math == MathPrecision::tf32)
          std::printf("[ mhc err  ] %s: coeffs rel_l2 %.3g, y rel_l2 %.3g\n", what.c_str(),
                      harness::compare(cvr, ref->coeffs).rel_l2,
                      harness::compare(yv, ref->y).rel_l2);
        EXPECT_TRUE(untouched_outside_dense(ypoison, y1, ys, what + " y"));
        EXPECT_TRUE(harness::untouched_outside(cpoison, c1, cmask, what + " coeffs"));
        BARACUDA_ASSERT_OK(cp->run(s, ws->as_workspace(), ca));
        EXPECT_TRUE(harness::bytes_equal(y1, y.bytes(), what + " y rerun"));
        EXPECT_TRUE(harness::bytes_equal(c1, co.bytes(), what + " coeffs rerun"));
        if (!pg.bit_stable || p.tokens < 3) continue;
        MhcDescriptor d2 = d;
        d2.tokens = sub;
        auto cp2 = MhcCollapsePlan::select(s, d2, pref);
        BARACUDA_ASSERT_OK(cp2);
        EXPECT_EQ(cp2->sku().name, cp->sku().name) << what;
        auto ws2 = harness::poisoned_workspace(cp2->workspace_size(), s.memory_location());
        BARACUDA_ASSERT_OK(ws2);
        MhcCollapseOp::Arguments ca2{y2.view(), co2.view(),
                                     as_const(x.window({lo, 0, 0}, {sub, p.n, p.channels})),
                                     w.view()};
        BARACUDA_ASSERT_OK(cp2->run(s, ws2->as_workspace(), ca2));
        EXPECT_TRUE(rows_equal(y1, ys, y2.bytes(), ys2, lo, p.channels))
            << what << " y of a window differs from the full batch";
        const Vec c2v = dense_values(co2);
        EXPECT_TRUE(std::equal(c2v.begin(), c2v.end(), cv.begin() + lo * p.k))
            << what << " coeffs of a window differ from the full batch";
      }
      std::printf(
          "[ mhc time ] dynamic collapse %s T=%lld n=%lld C=%lld: %d kernels, %.2f s "
          "(reference %.2f s)\n",
          std::string(name(dt)).c_str(), static_cast<long long>(cs.t), static_cast<long long>(cs.n),
          static_cast<long long>(cs.c), kernels, seconds_since(t0), ref_s);
    }
}

// ---- backward plans against the backward reference ----------------------------------------------
TEST_P(Mhc, BackwardMatchesReference) {
  const Target tg = GetParam();
  BARACUDA_SKIP_IF_UNAVAILABLE(tg);
  Rng rng;
  const Stream& s = harness::stream_for(tg);
  int vi = 0;
  for (MhcH h : {MhcH::static_h, MhcH::dynamic_h})
    for (DType dt : {DType::f32, DType::bf16, DType::f16})
      for (const Shape3& sh : shapes(tg)) {
        const Layout l = harness::all_layouts()[static_cast<size_t>(vi % 3)];
        const SinkhornConfig sk = sinkhorn_variants()[static_cast<size_t>(vi++ % 4)];
        const MhcDescriptor d = desc(sh.t, sh.n, sh.c, dt, h, sk);
        auto eb = MhcExpandBackwardPlan::select(s, d);
        auto cb = MhcCollapseBackwardPlan::select(s, d);
        BARACUDA_ASSERT_OK(eb);
        BARACUDA_ASSERT_OK(cb);
        const MhcProblem& p = eb->problem();
        const std::string what = label(p, l);
        TestTensor x = rand_tensor(dt, {p.tokens, p.n, p.channels}, tg, l, rng);
        TestTensor f = rand_tensor(dt, {p.tokens, p.channels}, tg, l, rng);
        TestTensor dout = rand_tensor(dt, {p.tokens, p.n, p.channels}, tg, l, rng);
        TestTensor dy = rand_tensor(dt, {p.tokens, p.channels}, tg, l, rng);
        TestTensor co = rand_tensor(DType::f32, {p.rows, p.k}, tg, l, rng, 0.0, 1.0);
        const ParamSet w = make_params(p, tg, rng);
        auto ws = harness::poisoned_workspace(std::max(eb->workspace_size(), cb->workspace_size()),
                                              s.memory_location());
        BARACUDA_ASSERT_OK(ws);
        // expand backward
        TestTensor dx = TestTensor::make(dt, {p.tokens, p.n, p.channels}, tg, l, &rng);
        TestTensor df = TestTensor::make(dt, {p.tokens, p.channels}, tg, l, &rng);
        TestTensor dco = TestTensor::make(DType::f32, {p.rows, p.k}, tg, l, &rng);
        dx.poison(), df.poison(), dco.poison();
        const auto b1 = dx.bytes(), b2 = df.bytes(), b3 = dco.bytes();
        MhcExpandBackwardOp::Arguments ea{dx.view(), df.view(), dco.view(), dout.cview(),
                                          x.cview(), f.cview(), co.cview()};
        BARACUDA_ASSERT_OK(eb->run(s, ws->as_workspace(), ea));
        settled(s, what);
        const mhc_ref::ExpandGrads er =
            mhc_ref::expand_backward(p, dout.values(), x.values(), f.values(), co.values());
        EXPECT_TRUE(close_to(dx.values(), er.dx, dt, Accuracy::reduction, what + " e.dx"));
        EXPECT_TRUE(close_to(df.values(), er.df, dt, Accuracy::reduction, what + " e.df"));
        EXPECT_TRUE(close_to(dco.values(), er.dcoeffs, DType::f32, Accuracy::reduction,
                             what + " e.dcoeffs"));
        EXPECT_TRUE(harness::untouched_outside(b1, dx.bytes(), dx.bit_mask(), what + " e.dx"));
        EXPECT_TRUE(harness::untouched_outside(b2, df.bytes(), df.bit_mask(), what + " e.df"));
        EXPECT_TRUE(harness::untouched_outside(b3, dco.bytes(), dco.bit_mask(), what + " e.dco"));
        if (eb->precision_guarantee().deterministic) {
          const auto r1 = dco.bytes(), r2 = dx.bytes();
          BARACUDA_ASSERT_OK(eb->run(s, ws->as_workspace(), ea));
          EXPECT_TRUE(harness::bytes_equal(r1, dco.bytes(), what + " e.dcoeffs rerun"));
          EXPECT_TRUE(harness::bytes_equal(r2, dx.bytes(), what + " e.dx rerun"));
        }
        // collapse backward, fed the expand backward's dcoeffs (the real chain)
        TestTensor cdx = TestTensor::make(dt, {p.tokens, p.n, p.channels}, tg, l, &rng);
        ParamSet g;
        if (h == MhcH::static_h) {
          g.h_pre = TestTensor::make(DType::f32, {p.n}, tg, l, &rng);
          g.h_post = TestTensor::make(DType::f32, {p.n}, tg, l, &rng);
          g.h_res = TestTensor::make(DType::f32, {p.n, p.n}, tg, l, &rng);
        } else {
          g.fn = TestTensor::make(DType::f32, {p.k, p.flat}, tg, l, &rng);
          g.scale = TestTensor::make(DType::f32, {3}, tg, l, &rng);
          g.base = TestTensor::make(DType::f32, {p.k}, tg, l, &rng);
        }
        std::vector<TestTensor*> outs{&cdx};
        for (auto* o : {&g.h_pre, &g.h_post, &g.h_res, &g.fn, &g.scale, &g.base})
          if (*o) outs.push_back(&**o);
        std::vector<std::vector<uint8_t>> before;
        for (TestTensor* o : outs) o->poison(), before.push_back(o->bytes());
        MhcParamGrads gv;
        if (g.h_pre)
          gv.h_pre = g.h_pre->view(), gv.h_post = g.h_post->view(), gv.h_res = g.h_res->view();
        if (g.fn) gv.fn = g.fn->view(), gv.scale = g.scale->view(), gv.base = g.base->view();
        MhcCollapseBackwardOp::Arguments ca{cdx.view(),  gv,        dy.cview(),
                                            dco.cview(), x.cview(), w.view()};
        BARACUDA_ASSERT_OK(cb->run(s, ws->as_workspace(), ca));
        settled(s, what);
        const mhc_ref::CollapseGrads cr =
            mhc_ref::collapse_backward(p, dy.values(), dco.values(), x.values(), w.values());
        EXPECT_TRUE(close_to(cdx.values(), cr.dx, dt, Accuracy::reduction, what + " c.dx"));
        // The parameter gradients are compared as one vector: some parts are exactly zero in
        // theory (n = 1: the Sinkhorn of a 1 x 1 matrix is constant), so only the whole gradient
        // has a norm to be relative to.
        const mhc_ref::Params gr = g.values();
        Vec got_all, want_all;
        for (const Vec* v : {&gr.h_pre, &gr.h_post, &gr.h_res, &gr.fn, &gr.scale, &gr.base})
          got_all.insert(got_all.end(), v->begin(), v->end());
        for (const Vec* v :
             {&cr.dw.h_pre, &cr.dw.h_post, &cr.dw.h_res, &cr.dw.fn, &cr.dw.scale, &cr.dw.base})
          want_all.insert(want_all.end(), v->begin(), v->end());
        EXPECT_TRUE(
            close_to(got_all, want_all, DType::f32, Accuracy::reduction, what + " c.dparams"));
        for (size_t i = 0; i < outs.size(); ++i)
          EXPECT_TRUE(harness::untouched_outside(before[i], outs[i]->bytes(), outs[i]->bit_mask(),
                                                 what + " c.out" + std::to_string(i)));
        if (cb->precision_guarantee().deterministic) {
          std::vector<std::vector<uint8_t>> first;
          for (TestTensor* o : outs) first.push_back(o->bytes());
          BARACUDA_ASSERT_OK(cb->run(s, ws->as_workspace(), ca));
          for (size_t i = 0; i < outs.size(); ++i)
            EXPECT_TRUE(harness::bytes_equal(first[i], outs[i]->bytes(),
                                             what + " c rerun " + std::to_string(i)));
        }
      }
}

// ---- the comb index convention: X'_i = sum_j comb[j, i] X_j
// ----------------------------------------
TEST_P(Mhc, ExpandIndexConventionRowIsSource) {
  const Target tg = GetParam();
  BARACUDA_SKIP_IF_UNAVAILABLE(tg);
  const Stream& s = harness::stream_for(tg);
  auto plan = MhcExpandPlan::select(s, desc(1, 3, 4, DType::f32, MhcH::static_h));
  BARACUDA_ASSERT_OK(plan);
  TestTensor x = TestTensor::make(DType::f32, {1, 3, 4}, tg);
  TestTensor f = TestTensor::make(DType::f32, {1, 4}, tg);
  TestTensor co = TestTensor::make(DType::f32, {1, 15}, tg);
  TestTensor out = TestTensor::make(DType::f32, {1, 3, 4}, tg);
  Vec xv(12);
  for (int i = 0; i < 12; ++i) xv[i] = (i / 4 + 1) * 10 + i % 4;  // stream j holds 10(j+1)+c
  x.set_values(xv);
  f.set_values({0, 0, 0, 0});
  // comb[0][2] = 1 (source 0 -> destination 2), comb[2][0] = 1, comb[1][1] = 1.
  Vec cv(15, 0.0);
  cv[6 + 0 * 3 + 2] = 1, cv[6 + 2 * 3 + 0] = 1, cv[6 + 1 * 3 + 1] = 1;
  co.set_values(cv);
  BARACUDA_ASSERT_OK(
      plan->run(s, Workspace::none(), {out.view(), x.cview(), f.cview(), co.cview()}));
  const Vec o = out.values();
  EXPECT_EQ(o[0], 30);      // destination 0 reads source 2
  EXPECT_EQ(o[4 + 1], 21);  // destination 1 reads source 1
  EXPECT_EQ(o[8 + 3], 13);  // destination 2 reads source 0
}

// ---- float64 reference: Sinkhorn properties and finite differences
// --------------------------------
MhcProblem small_problem(int64_t t, int64_t n, int64_t c, MhcH h, SinkhornConfig s) {
  auto p = MhcCollapseOp::make_problem(desc(t, n, c, DType::f32, h, s));
  EXPECT_TRUE(p.ok());
  return p.value();
}

Vec random_vec(Rng& rng, size_t n, double lo = -1, double hi = 1) {
  Vec v(n);
  for (double& e : v) e = rng.uniform(lo, hi);
  return v;
}

TEST(MhcReference, SinkhornIsDoublyStochasticAndFollowsTheOrder) {
  Rng rng;
  for (int64_t n : {1, 2, 4, 7}) {
    // Logits in [-1.5, 1.5]: each Sinkhorn iteration then contracts the Hilbert-metric distance to
    // the doubly stochastic limit by at least tanh(D / 4)^2 <= tanh(1.5)^2 = 0.82 (Birkhoff; D <=
    // 4 max |l| = 6), so 200 iterations reach 1e-9 for every seed. With [-3, 3] (0.99 per
    // iteration) some seeds did not (seed 86689222: a row sum 1.5e-8 off).
    const Vec l = random_vec(rng, static_cast<size_t>(n * n), -1.5, 1.5);
    for (SinkhornFirst first : {SinkhornFirst::rows, SinkhornFirst::columns}) {
      const Vec p = mhc_ref::sinkhorn(l.data(), n, {SinkhornInit::exp, first, 200, 0.0});
      for (int64_t r = 0; r < n; ++r) {
        double rs = 0, cs = 0;
        for (int64_t c = 0; c < n; ++c) rs += p[r * n + c], cs += p[c * n + r];
        EXPECT_NEAR(rs, 1.0, 1e-9) << "row " << r << " n=" << n;
        EXPECT_NEAR(cs, 1.0, 1e-9) << "column " << r << " n=" << n;
      }
      // One iteration ends on the `first` axis: that axis sums to exactly 1, the other need not.
      const Vec q = mhc_ref::sinkhorn(l.data(), n, {SinkhornInit::exp, first, 1, 0.0});
      for (int64_t r = 0; r < n; ++r) {
        double s = 0;
        for (int64_t c = 0; c < n; ++c)
          s += first == SinkhornFirst::rows ? q[r * n + c] : q[c * n + r];
        EXPECT_NEAR(s, 1.0, 1e-12);
      }
    }
  }
  // softmax_eps: with iters = 1 and columns first, the columns sum to 1 / (1 + eps)-ish values.
  const Vec l = {0.0, 1.0, 2.0, 3.0};
  const Vec p =
      mhc_ref::sinkhorn(l.data(), 2, {SinkhornInit::softmax_eps, SinkhornFirst::columns, 1, 0.25});
  const double s0 = std::exp(0.0) / (std::exp(0.0) + std::exp(1.0)) + 0.25;
  const double s2 = std::exp(2.0) / (std::exp(2.0) + std::exp(3.0)) + 0.25;
  EXPECT_NEAR(p[0], s0 / (s0 + s2 + 0.25), 1e-14);
}

TEST(MhcReference, SinkhornBackwardMatchesFiniteDifferences) {
  Rng rng;
  for (const SinkhornConfig& cfg : sinkhorn_variants())
    for (int64_t n : {1, 2, 4}) {
      const Vec l = random_vec(rng, static_cast<size_t>(n * n), -2, 2);
      const Vec dp = random_vec(rng, static_cast<size_t>(n * n));
      auto f = [&](const Vec& v) { return mhc_ref::sinkhorn(v.data(), n, cfg); };
      EXPECT_TRUE(harness::gradient_matches_fd(
          f, l, dp, mhc_ref::sinkhorn_backward(l.data(), n, cfg, dp.data()), rng))
          << to_string(cfg.init) << "/" << to_string(cfg.first) << " n=" << n;
    }
}

TEST(MhcReference, ExpandBackwardMatchesFiniteDifferences) {
  Rng rng;
  for (MhcH h : {MhcH::static_h, MhcH::dynamic_h}) {
    const MhcProblem p = small_problem(3, 3, 4, h, {});
    const size_t nx = 36, nf = 12, nc = static_cast<size_t>(p.rows * p.k);
    const Vec x = random_vec(rng, nx), fv = random_vec(rng, nf), co = random_vec(rng, nc, 0, 1);
    const Vec dout = random_vec(rng, nx);
    const mhc_ref::ExpandGrads g = mhc_ref::expand_backward(p, dout, x, fv, co);
    // One input vector [x | f | coeffs]; the pre part of coeffs must get a zero gradient.
    Vec all = x;
    all.insert(all.end(), fv.begin(), fv.end());
    all.insert(all.end(), co.begin(), co.end());
    Vec grad = g.dx;
    grad.insert(grad.end(), g.df.begin(), g.df.end());
    grad.insert(grad.end(), g.dcoeffs.begin(), g.dcoeffs.end());
    auto fwd = [&](const Vec& v) {
      return mhc_ref::expand(p, Vec(v.begin(), v.begin() + nx),
                             Vec(v.begin() + nx, v.begin() + nx + nf),
                             Vec(v.begin() + nx + nf, v.end()));
    };
    EXPECT_TRUE(harness::gradient_matches_fd(fwd, all, dout, grad, rng, 400)) << to_string(h);
    for (int64_t i = 0; i < p.n; ++i) EXPECT_EQ(g.dcoeffs[i], 0.0);
  }
}

TEST(MhcReference, CollapseBackwardMatchesFiniteDifferences) {
  Rng rng;
  for (MhcH h : {MhcH::static_h, MhcH::dynamic_h})
    for (const SinkhornConfig& cfg : sinkhorn_variants()) {
      MhcProblem p = small_problem(3, 2, 3, h, cfg);
      p.pre_eps = 1e-3;
      const size_t nx = static_cast<size_t>(p.tokens * p.flat);
      const Vec x = random_vec(rng, nx);
      mhc_ref::Params w;
      if (h == MhcH::static_h) {
        w.h_pre = random_vec(rng, 2, -2, 2), w.h_post = random_vec(rng, 2, -2, 2);
        w.h_res = random_vec(rng, 4, -2, 2);
      } else {
        w.fn = random_vec(rng, static_cast<size_t>(p.k * p.flat));
        w.scale = random_vec(rng, 3, 0.5, 1.5);
        w.base = random_vec(rng, static_cast<size_t>(p.k));
      }
      const Vec dy = random_vec(rng, static_cast<size_t>(p.tokens * p.channels));
      const Vec dco = random_vec(rng, static_cast<size_t>(p.rows * p.k));
      const mhc_ref::CollapseGrads g = mhc_ref::collapse_backward(p, dy, dco, x, w);
      // Inputs [x | params...]; outputs [y | coeffs] weighted by [dy | dcoeffs].
      const std::vector<Vec*> parts = h == MhcH::static_h
                                          ? std::vector<Vec*>{&w.h_pre, &w.h_post, &w.h_res}
                                          : std::vector<Vec*>{&w.fn, &w.scale, &w.base};
      const std::vector<const Vec*> gparts =
          h == MhcH::static_h ? std::vector<const Vec*>{&g.dw.h_pre, &g.dw.h_post, &g.dw.h_res}
                              : std::vector<const Vec*>{&g.dw.fn, &g.dw.scale, &g.dw.base};
      Vec all = x, grad = g.dx;
      for (size_t i = 0; i < parts.size(); ++i) {
        all.insert(all.end(), parts[i]->begin(), parts[i]->end());
        grad.insert(grad.end(), gparts[i]->begin(), gparts[i]->end());
      }
      Vec dall = dy;
      dall.insert(dall.end(), dco.begin(), dco.end());
      auto fwd = [&](const Vec& v) {
        mhc_ref::Params ww = w;
        std::vector<Vec*> wp = h == MhcH::static_h
                                   ? std::vector<Vec*>{&ww.h_pre, &ww.h_post, &ww.h_res}
                                   : std::vector<Vec*>{&ww.fn, &ww.scale, &ww.base};
        size_t off = nx;
        for (Vec* q : wp) {
          std::copy(v.begin() + static_cast<long>(off),
                    v.begin() + static_cast<long>(off + q->size()), q->begin());
          off += q->size();
        }
        const mhc_ref::Collapsed c =
            mhc_ref::collapse(p, Vec(v.begin(), v.begin() + static_cast<long>(nx)), ww);
        Vec out = c.y;
        out.insert(out.end(), c.coeffs.begin(), c.coeffs.end());
        return out;
      };
      EXPECT_TRUE(harness::gradient_matches_fd(fwd, all, dall, grad, rng, 200))
          << to_string(h) << " " << to_string(cfg.init) << "/" << to_string(cfg.first);
    }
}

// The seed's fused forward is collapse -> RMSNorm -> expand with comb = M^T and pre_eps = 0.
TEST(MhcReference, StaticForwardComposesFromCollapseAndExpand) {
  Rng rng;
  SinkhornConfig sk{SinkhornInit::exp, SinkhornFirst::rows, 5, 1e-5};
  MhcProblem p = small_problem(2, 3, 4, MhcH::static_h, sk);
  p.pre_eps = 0;
  const Vec x = random_vec(rng, 24), gamma = random_vec(rng, 4, 0.5, 1.5);
  mhc_ref::Params w{random_vec(rng, 3), random_vec(rng, 3), random_vec(rng, 9), {}, {}, {}};
  const Vec fused = mhc_ref::static_forward(p, x, gamma, w.h_pre, w.h_post, w.h_res);
  const mhc_ref::Collapsed c = mhc_ref::collapse(p, x, w);
  Vec co = c.coeffs;
  for (int64_t i = 0; i < 3; ++i)  // transpose the comb part into the expand convention
    for (int64_t j = 0; j < 3; ++j) co[6 + j * 3 + i] = c.coeffs[6 + i * 3 + j];
  Vec f(8);
  for (int64_t t = 0; t < 2; ++t) {
    double ss = 0;
    for (int64_t ch = 0; ch < 4; ++ch) ss += c.y[t * 4 + ch] * c.y[t * 4 + ch];
    const double inv = 1 / std::sqrt(ss / 4 + p.norm_eps);
    for (int64_t ch = 0; ch < 4; ++ch) f[t * 4 + ch] = gamma[ch] * c.y[t * 4 + ch] * inv;
  }
  const Vec composed = mhc_ref::expand(p, x, f, co);
  for (size_t i = 0; i < fused.size(); ++i) EXPECT_NEAR(fused[i], composed[i], 1e-12) << i;
}

// ---- validation
// -------------------------------------------------------------------------------------
// Random descriptors, edges included: planned or refused naming the op, never a crash or overflow.
TEST(MhcValidation, RandomDescriptorsArePlannedOrRefused) {
  Rng rng;
  const Stream cpu = Stream::cpu();
  auto odd_double = [&] {
    const double v[] = {0.0, -1.0, 1e-6, 0.5, 1.0, 1e300, HUGE_VAL, std::nan("")};
    return v[rng.integer(0, 7)];
  };
  int planned = 0;
  for (int i = 0; i < 10000; ++i) {
    MhcDescriptor d;
    d.tokens = harness::small_or_edge(rng, 19, 67);
    d.n = harness::small_or_edge(rng, 70);
    d.channels = harness::small_or_edge(rng, 19, 67);
    d.dtype = harness::any_dtype(rng);
    d.h = static_cast<MhcH>(rng.integer(0, 2));
    d.sinkhorn.init = static_cast<SinkhornInit>(rng.integer(0, 2));
    d.sinkhorn.first = static_cast<SinkhornFirst>(rng.integer(0, 2));
    d.sinkhorn.iters = static_cast<int32_t>(rng.integer(-2, 1100));
    if (rng.integer(0, 3) == 0) d.sinkhorn.eps = odd_double();
    if (rng.integer(0, 3) == 0) d.pre_eps = odd_double();
    if (rng.integer(0, 3) == 0) d.norm_eps = odd_double();
    ASSERT_TRUE(
        (harness::plans_or_names_ops<MhcCollapseOp, MhcStaticForwardOp, MhcExpandOp,
                                     MhcExpandBackwardOp, MhcCollapseBackwardOp>(cpu, d, &planned)))
        << "case " << i;
  }
  EXPECT_GT(planned, 10);
}

TEST(MhcValidation, DescriptorRules) {
  const Stream cpu = Stream::cpu();
  auto bad = [&](auto edit) {
    MhcDescriptor d = desc(4, 4, 8, DType::f32, MhcH::dynamic_h);
    edit(d);
    return MhcCollapsePlan::select(cpu, d);
  };
  const auto inv = ErrorKind::invalid_problem;
  EXPECT_TRUE(fails_with(bad([](auto& d) { d.dtype = DType::f64; }), ErrorKind::unsupported,
                         {"mhc_collapse: dtype=f64: activations must be f32, bf16 or f16"}));
  EXPECT_TRUE(fails_with(bad([](auto& d) { d.tokens = -1; }), inv,
                         {"mhc_collapse: tokens=-1 is negative"}));
  EXPECT_TRUE(fails_with(bad([](auto& d) { d.n = 0; }), inv, {"n=0: streams must be in [1, 64]"}));
  EXPECT_TRUE(
      fails_with(bad([](auto& d) { d.n = 65; }), inv, {"n=65: streams must be in [1, 64]"}));
  EXPECT_TRUE(fails_with(bad([](auto& d) { d.channels = 0; }), inv, {"channels=0 must be >= 1"}));
  EXPECT_TRUE(
      fails_with(bad([](auto& d) { d.h = static_cast<MhcH>(7); }), inv, {"h=7 is not a MhcH"}));
  EXPECT_TRUE(fails_with(bad([](auto& d) { d.sinkhorn.init = static_cast<SinkhornInit>(9); }), inv,
                         {"sinkhorn.init=9 is not a SinkhornInit"}));
  EXPECT_TRUE(fails_with(bad([](auto& d) { d.sinkhorn.first = static_cast<SinkhornFirst>(5); }),
                         inv, {"sinkhorn.first=5 is not a SinkhornFirst"}));
  EXPECT_TRUE(fails_with(bad([](auto& d) { d.sinkhorn.iters = 0; }), inv,
                         {"sinkhorn.iters=0: must be in [1, 1000]"}));
  EXPECT_TRUE(fails_with(bad([](auto& d) { d.sinkhorn.iters = 1001; }), inv,
                         {"sinkhorn.iters=1001: must be in [1, 1000]"}));
  EXPECT_TRUE(fails_with(bad([](auto& d) { d.sinkhorn.eps = std::nan(""); }), inv,
                         {"sinkhorn.eps=nan: must be finite and in [0, 1)"}));
  EXPECT_TRUE(fails_with(bad([](auto& d) { d.pre_eps = -0.5; }), inv,
                         {"pre_eps=-0.5: must be finite and in [0, 1)"}));
  EXPECT_TRUE(fails_with(bad([](auto& d) { d.norm_eps = 0; }), inv,
                         {"norm_eps=0: must be finite and in (0, 1)"}));
  EXPECT_TRUE(
      fails_with(bad([](auto& d) { d.tokens = int64_t{1} << 50, d.channels = int64_t{1} << 20; }),
                 inv, {"element count overflows int64"}));
  // The same rules guard every op of the family.
  MhcDescriptor d = desc(1, 0, 8, DType::f32, MhcH::static_h);
  EXPECT_TRUE(fails_with(MhcStaticForwardPlan::select(cpu, d), inv, {"mhc_static_forward: n=0"}));
  EXPECT_TRUE(fails_with(MhcExpandPlan::select(cpu, d), inv, {"mhc_expand: n=0"}));
  EXPECT_TRUE(fails_with(MhcExpandBackwardPlan::select(cpu, d), inv, {"mhc_expand_backward: n=0"}));
  EXPECT_TRUE(
      fails_with(MhcCollapseBackwardPlan::select(cpu, d), inv, {"mhc_collapse_backward: n=0"}));
}

// Argument rules, on every target (on CUDA also: host memory handed to a GPU plan).
// Random argument mistakes (harness::fuzz_arguments) on every target: collapse (both H kinds,
// every parameter tensor) and expand, bf16 and f32, padded layouts. Refused naming the op with the
// outputs untouched, or accepted and run inside the real buffers (ASan in CI).
TEST_P(Mhc, RandomArgumentMistakes) {
  using harness::ArgView;
  const Target tg = GetParam();
  BARACUDA_SKIP_IF_UNAVAILABLE(tg);
  Rng rng;
  const Stream& s = harness::stream_for(tg);
  int accepted = 0;
  for (MhcH h : {MhcH::static_h, MhcH::dynamic_h})
    for (DType dt : {DType::f32, DType::bf16}) {
      const MhcDescriptor d = desc(3, 4, 16, dt, h);
      auto cp = MhcCollapsePlan::select(s, d);
      auto ep = MhcExpandPlan::select(s, d);
      BARACUDA_ASSERT_OK(cp);
      BARACUDA_ASSERT_OK(ep);
      const MhcProblem& p = cp->problem();
      SCOPED_TRACE(label(p, Layout::padded));
      TestTensor x = rand_tensor(dt, {p.tokens, p.n, p.channels}, tg, Layout::padded, rng);
      TestTensor f = rand_tensor(dt, {p.tokens, p.channels}, tg, Layout::padded, rng);
      const ParamSet w = make_params(p, tg, rng);
      TestTensor y = TestTensor::make(dt, {p.tokens, p.channels}, tg, Layout::padded, &rng);
      TestTensor out = TestTensor::make(dt, {p.tokens, p.n, p.channels}, tg, Layout::padded, &rng);
      TestTensor co = TestTensor::make(DType::f32, {p.rows, p.k}, tg, Layout::padded, &rng);
      auto ws = harness::poisoned_workspace(
          std::max<size_t>({cp->workspace_size(), ep->workspace_size(), 1}), s.memory_location());
      BARACUDA_ASSERT_OK(ws);
      const MhcCollapseOp::Arguments ca{y.view(), co.view(), x.cview(), w.view()};
      BARACUDA_ASSERT_OK(cp->run(s, ws->as_workspace(), ca));  // real coefficients for expand
      TestTensor co_in = TestTensor::make(DType::f32, {p.rows, p.k}, tg);
      co_in.set_values(co.values());
      const MhcExpandOp::Arguments xa{out.view(), x.cview(), f.cview(), co_in.cview()};
      BARACUDA_ASSERT_OK(ep->can_implement(xa));
      EXPECT_TRUE(harness::fuzz_arguments(
          s, *cp, ws->as_workspace(), ca,
          [](MhcCollapseOp::Arguments& a) {
            return std::vector<ArgView>{{"y", a.y},
                                        {"coeffs", a.coeffs},
                                        {"x", a.x},
                                        {"h_pre", a.params.h_pre},
                                        {"h_post", a.params.h_post},
                                        {"h_res", a.params.h_res},
                                        {"fn", a.params.fn},
                                        {"scale", a.params.scale},
                                        {"base", a.params.base}};
          },
          {&y, &co}, "mhc_collapse", rng, 400, &accepted));
      EXPECT_TRUE(harness::fuzz_arguments(
          s, *ep, ws->as_workspace(), xa,
          [](MhcExpandOp::Arguments& a) {
            return std::vector<ArgView>{
                {"out", a.out}, {"x", a.x}, {"f", a.f}, {"coeffs", a.coeffs}};
          },
          {&out}, "mhc_expand", rng, 400, &accepted));
    }
  EXPECT_GT(accepted, 0);
}

TEST_P(Mhc, ArgumentRulesNeverWrite) {
  const Target tg = GetParam();
  BARACUDA_SKIP_IF_UNAVAILABLE(tg);
  Rng rng;
  const Stream& s = harness::stream_for(tg);
  auto plan = MhcCollapsePlan::select(s, desc(2, 2, 8, DType::bf16, MhcH::dynamic_h));
  BARACUDA_ASSERT_OK(plan);
  const MhcProblem& p = plan->problem();
  TestTensor x = rand_tensor(DType::bf16, {2, 2, 8}, tg, Layout::contiguous, rng);
  TestTensor y = TestTensor::make(DType::bf16, {2, 8}, tg);
  TestTensor co = TestTensor::make(DType::f32, {2, p.k}, tg);
  const ParamSet w = make_params(p, tg, rng);
  y.poison();
  const auto before = y.bytes();
  const MhcCollapseOp::Arguments good{y.view(), co.view(), x.cview(), w.view()};
  auto wsb = harness::poisoned_workspace(plan->workspace_size(), s.memory_location());
  BARACUDA_ASSERT_OK(wsb);
  const Workspace ws = wsb->as_workspace();  // run() checks the workspace before the tensors
  const auto inv = ErrorKind::invalid_problem;
  auto expect_fail = [&](MhcCollapseOp::Arguments a, ErrorKind kind,
                         std::initializer_list<std::string_view> needles) {
    EXPECT_TRUE(fails_with(plan->can_implement(a), kind, needles));
    EXPECT_TRUE(fails_with(plan->run(s, ws, a), kind, needles));
    EXPECT_TRUE(harness::bytes_equal(before, y.bytes(), "y after a rejected run"));
  };
  {
    auto a = good;
    a.x.shape[2] = 9;
    expect_fail(a, inv, {"mhc_collapse: x: shape[2]=9, expected 8"});
  }
  {
    auto a = good;
    a.y.dtype = DType::f16;
    expect_fail(a, inv, {"mhc_collapse: y: dtype f16, expected bf16"});
  }
  {
    auto a = good;
    a.params.fn = ConstTensor{};
    expect_fail(a, inv, {"mhc_collapse: fn:"});
  }
  {
    auto a = good;
    a.params.scale.dtype = DType::bf16;
    expect_fail(a, inv, {"mhc_collapse: scale: dtype bf16, expected f32"});
  }
  {
    auto a = good;  // channel axis strided: a view of every other element
    a.x.shape[2] = 4, a.x.stride[2] = 2;
    a.y.shape[1] = 4;
    auto p4 = MhcCollapsePlan::select(s, desc(2, 2, 4, DType::bf16, MhcH::dynamic_h));
    BARACUDA_ASSERT_OK(p4);
    auto w4 = make_params(p4->problem(), tg, rng);
    a.params = w4.view();
    EXPECT_TRUE(
        fails_with(p4->can_implement(a), inv,
                   {"mhc_collapse: x: stride[2]=2: the channel axis must have unit stride"}));
  }
  {
    auto a = good;  // y aliases x's memory
    a.y.data = const_cast<void*>(a.x.data);
    a.y.buffer_bytes = -1;
    expect_fail(a, inv, {"mhc_collapse: y and x overlap"});
  }
  {
    auto a = good;
    a.coeffs.buffer_bytes = 8;
    EXPECT_TRUE(fails_with(plan->can_implement(a), ErrorKind::buffer_too_small, {"coeffs"}));
  }
  if (tg == Target::cuda) {
    std::vector<float> host_scale(3, 1.0f);
    auto a = good;
    a.params.scale.data = host_scale.data();
    a.params.scale.where = Location::host();
    expect_fail(a, ErrorKind::wrong_device, {"mhc_collapse: scale"});
  }
  // The backward and static ops check their own argument names.
  auto eb = MhcExpandBackwardPlan::select(s, desc(2, 2, 8, DType::bf16, MhcH::static_h));
  BARACUDA_ASSERT_OK(eb);
  TestTensor dco = TestTensor::make(DType::f32, {2, 8}, tg);
  MhcExpandBackwardOp::Arguments ea{x.view(),  y.view(),  dco.view(), x.cview(),
                                    x.cview(), y.cview(), co.cview()};
  EXPECT_TRUE(fails_with(eb->can_implement(ea), inv,
                         {"mhc_expand_backward: dcoeffs: shape[0]=2, expected 1"}));
  auto cb = MhcCollapseBackwardPlan::select(s, desc(2, 2, 8, DType::bf16, MhcH::static_h));
  BARACUDA_ASSERT_OK(cb);
  MhcCollapseBackwardOp::Arguments ca{};
  ca.dx = x.view();
  EXPECT_TRUE(fails_with(cb->can_implement(ca), inv, {"mhc_collapse_backward: dh_pre:"}));
  auto sf = MhcStaticForwardPlan::select(s, desc(2, 2, 8, DType::bf16, MhcH::static_h));
  BARACUDA_ASSERT_OK(sf);
  TestTensor g32 = TestTensor::make(DType::f32, {8}, tg);
  TestTensor sout = TestTensor::make(DType::bf16, {2, 2, 8}, tg);
  MhcStaticForwardOp::Arguments sa{};
  sa.out = sout.view();
  sa.x = x.cview();
  sa.gamma = g32.cview();
  EXPECT_TRUE(fails_with(sf->can_implement(sa), inv,
                         {"mhc_static_forward: gamma: dtype f32, expected bf16"}));
}

}  // namespace
}  // namespace baracuda

namespace baracuda {
namespace {

// Parity with DeepSeek-V4's DeepseekV4HyperConnection (transformers): deepseek_check.py runs the
// module on random weights and saves inputs and outputs; this test feeds the same inputs to our
// collapse (dynamic H) and expand plans. Needs BARACUDA_MHC_DEEPSEEK=<file> (the GPU machine).
TEST_P(Mhc, MatchesDeepSeekV4HyperConnection) {
  const Target tg = GetParam();
  BARACUDA_SKIP_IF_UNAVAILABLE(tg);
  const char* path = std::getenv("BARACUDA_MHC_DEEPSEEK");
  if (!path) GTEST_SKIP() << "BARACUDA_MHC_DEEPSEEK is not set (deepseek_check.py writes the file)";
  std::FILE* fh = std::fopen(path, "rb");
  ASSERT_NE(fh, nullptr) << path;
  int64_t hdr[4];
  double eps[2];
  ASSERT_EQ(std::fread(hdr, sizeof hdr, 1, fh), 1u);
  ASSERT_EQ(std::fread(eps, sizeof eps, 1, fh), 1u);
  const int64_t T = hdr[0], n = hdr[1], C = hdr[2], K = (2 + n) * n;
  auto read = [&](int64_t count) {
    std::vector<float> v(static_cast<size_t>(count));
    EXPECT_EQ(std::fread(v.data(), 4, v.size(), fh), v.size());
    return Vec(v.begin(), v.end());
  };
  const Vec x = read(T * n * C), fn = read(K * n * C), scale = read(3), base = read(K),
            f = read(T * C), post = read(T * n), comb = read(T * n * n), collapsed = read(T * C),
            out_ds = read(T * n * C);
  std::fclose(fh);
  MhcDescriptor d = desc(
      T, n, C, DType::f32, MhcH::dynamic_h,
      {SinkhornInit::softmax_eps, SinkhornFirst::columns, static_cast<int32_t>(hdr[3]), eps[0]});
  d.pre_eps = eps[0], d.norm_eps = eps[1];
  const Stream& s = harness::stream_for(tg);
  auto cp = MhcCollapsePlan::select(s, d);
  auto ep = MhcExpandPlan::select(s, d);
  BARACUDA_ASSERT_OK(cp);
  BARACUDA_ASSERT_OK(ep);
  auto make = [&](DType dt, std::vector<int64_t> shape, const Vec& v) {
    TestTensor t = TestTensor::make(dt, std::move(shape), tg);
    if (!v.empty()) t.set_values(v);
    return t;
  };
  TestTensor xt = make(DType::f32, {T, n, C}, x), fnt = make(DType::f32, {K, n * C}, fn),
             st = make(DType::f32, {3}, scale), bt = make(DType::f32, {K}, base),
             ft = make(DType::f32, {T, C}, f), y = make(DType::f32, {T, C}, {}),
             co = make(DType::f32, {T, K}, {}), out = make(DType::f32, {T, n, C}, {});
  MhcParams w;
  w.fn = fnt.cview(), w.scale = st.cview(), w.base = bt.cview();
  auto ws = harness::poisoned_workspace(cp->workspace_size(), s.memory_location());
  BARACUDA_ASSERT_OK(ws);
  BARACUDA_ASSERT_OK(cp->run(s, ws->as_workspace(), {y.view(), co.view(), xt.cview(), w}));
  BARACUDA_ASSERT_OK(
      ep->run(s, Workspace::none(), {out.view(), xt.cview(), ft.cview(), co.cview()}));
  const Vec c = co.values();
  Vec our_post, our_comb;
  for (int64_t t = 0; t < T; ++t) {
    our_post.insert(our_post.end(), c.begin() + t * K + n, c.begin() + t * K + 2 * n);
    our_comb.insert(our_comb.end(), c.begin() + t * K + 2 * n, c.begin() + (t + 1) * K);
  }
  // DeepSeek computes in f32 as we do: both sides carry f32 rounding, hence `reduction`.
  // The collapse (and the expand, through its coefficients) is held to what the collapse plan
  // claims: tf32 arithmetic where the default takes the tensor-core kernel.
  const DType claim = claimed_dtype(DType::f32, cp->precision_guarantee());
  EXPECT_TRUE(close_to(our_post, post, claim, Accuracy::reduction, "deepseek post"));
  EXPECT_TRUE(close_to(our_comb, comb, claim, Accuracy::reduction, "deepseek comb"));
  EXPECT_TRUE(close_to(y.values(), collapsed, claim, Accuracy::reduction, "deepseek collapsed"));
  EXPECT_TRUE(close_to(out.values(), out_ds, claim, Accuracy::reduction, "deepseek expand"));
}

INSTANTIATE_TEST_SUITE_P(Targets, Mhc, ::testing::ValuesIn(harness::all_targets()),
                         [](const auto& i) { return harness::target_name(i.param); });

}  // namespace
}  // namespace baracuda
