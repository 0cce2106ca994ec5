// Tests of the attention family: descriptor and argument rules (every error path), the float64
// reference (hand-computed cases, finite differences), and every kernel against the reference over
// masks x GQA x layouts x dtypes x odd lengths x head dims, forward, LSE and backward.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#if BARACUDA_WITH_CUDA
#include <cuda_runtime.h>
#endif

#include "baracuda/core/validate.hpp"
#include "baracuda/ops/attention.hpp"
#include "baracuda/ops/attention_hopper.hpp"
#include "core/testing/testing.hpp"
#include "ops/attention/common.hpp"
#include "ops/attention/reference.hpp"
#include "ops/attention/swizzle.hpp"
#include "ops/attention/test_oracle.hpp"

namespace baracuda::attention {
namespace {

using attention::testing::RowBlock;
using attention::testing::rows_of;
using harness::parallel_for;

using harness::Accuracy;
using harness::close_to;
using harness::fails_with;
using harness::Layout;
using harness::Rng;
using harness::Target;
using harness::TestTensor;

constexpr double kInf = std::numeric_limits<double>::infinity();

// How Q/K/V/Y/dY sit in memory: the two real-model layouts plus the harness's strided ones.
enum class Lay { bhld, blhd, padded, permuted };
const char* lay_name(Lay l) {
  switch (l) {
    case Lay::bhld:
      return "bhld";
    case Lay::blhd:
      return "blhd";
    case Lay::padded:
      return "padded";
    case Lay::permuted:
      return "permuted";
  }
  return "?";
}

struct Config {
  DType dtype = DType::f32;
  int64_t b = 1, hq = 2, hk = 1, lq = 5, lk = 7, dk = 32, dv = 32;
  Mask mask{};
  double softcap = 0;
  std::optional<double> scale;
  std::vector<int32_t> cu_q, cu_k;   // varlen when non-empty
  std::vector<int32_t> used_k;       // seqused_k (each sequence's key count) when non-empty
  int64_t page_size = 0, pages = 0;  // paged K / V pools when page_size > 0 ...
  std::vector<int32_t> table;        // ... and their block table [b, ceil(lk / page_size)]
  // Q and the even keys of K of order 1e19 (the odd keys stay small): those q . k overflow float to
  // +inf and the rest are ~1e20, so a soft-capped score must saturate at +-cap (the float64
  // reference's values) instead of turning NaN. bf16 / f32 only (f16 cannot hold 1e19).
  bool huge_scores = false;
  std::string str() const {
    std::string s = std::string(name(dtype)) + " B" + std::to_string(b) + " Hq" +
                    std::to_string(hq) + " Hk" + std::to_string(hk) + " Lq" + std::to_string(lq) +
                    " Lk" + std::to_string(lk) + " Dk" + std::to_string(dk) + " Dv" +
                    std::to_string(dv) + " mask=" + to_string(mask) +
                    " cap=" + std::to_string(softcap);
    if (!cu_q.empty()) s += " varlen";
    if (page_size > 0)
      s += " paged(" + std::to_string(page_size) + " x " + std::to_string(pages) + ")";
    if (!used_k.empty()) {
      s += " seqused_k=(";
      for (size_t i = 0; i < used_k.size(); ++i) s += (i ? "," : "") + std::to_string(used_k[i]);
      s += ")";
    }
    if (huge_scores) s += " huge-scores";
    return s;
  }
};

Descriptor desc_of(const Config& c) {
  Descriptor d;
  d.dtype = c.dtype;
  d.batch = c.b, d.heads_q = c.hq, d.heads_kv = c.hk, d.len_q = c.lq, d.len_k = c.lk;
  d.head_dim_qk = c.dk, d.head_dim_v = c.dv;
  d.scale = c.scale, d.mask = c.mask, d.softcap = c.softcap;
  if (!c.cu_q.empty()) {
    d.varlen = true;
    d.total_q = c.cu_q.back(), d.total_k = c.cu_k.back();
  }
  d.seqused_k = !c.used_k.empty();
  d.page_size = c.page_size, d.pages = c.pages;
  return d;
}

Problem problem_of(const Config& c) {
  auto p = ForwardOp::make_problem(desc_of(c));
  EXPECT_TRUE(p.ok()) << p.error().to_string();
  return p.value();
}

std::vector<int64_t> vec(const int64_t* d, int r) {
  return {d, d + r};
}

std::unique_ptr<TestTensor> make(DType t, const std::vector<int64_t>& shape, Target target, Lay lay,
                                 Rng& rng) {
  if (lay == Lay::blhd && shape.size() == 4) {  // [B, H, L, D] viewed over [B, L, H, D] memory
    const int64_t h = shape[1], l = shape[2], d = shape[3];
    return std::make_unique<TestTensor>(
        TestTensor::with_strides(t, shape, {l * h * d, d, h * d, 1}, 0, target));
  }
  const Layout l = lay == Lay::padded     ? Layout::padded
                   : lay == Lay::permuted ? Layout::permuted
                                          : Layout::contiguous;
  return std::make_unique<TestTensor>(TestTensor::make(t, shape, target, l, &rng));
}
// The same, filled with random values: dims[0 .. rank) of a Shapes entry.
std::unique_ptr<TestTensor> random_tensor(DType t, const int64_t* dims, int rank, Target target,
                                          Lay lay, Rng& rng) {
  auto x = make(t, vec(dims, rank), target, lay, rng);
  x->fill_random(rng);
  return x;
}

std::unique_ptr<TestTensor> seqlens(const std::vector<int32_t>& cu, Target target) {
  auto t = std::make_unique<TestTensor>(
      TestTensor::make(DType::i32, {static_cast<int64_t>(cu.size())}, target));
  t->set_values(std::vector<double>(cu.begin(), cu.end()));
  return t;
}

// Paged K / V: a pool of `spare` more pages than the sequences hold, handed out in a random order
// (the block table), so neighbouring keys of a sequence sit in unrelated pages.
void page_config(Config& c, int64_t page_size, Rng& rng, int64_t spare = 3) {
  const int64_t cols = (c.lk + page_size - 1) / page_size;
  c.page_size = page_size, c.pages = c.b * cols + spare;
  c.table = attention::testing::scattered_pages(c.pages, c.b * cols, rng);
}

Workspace workspace_for(size_t bytes, Target target, std::unique_ptr<Buffer>& hold) {
  if (bytes == 0) return Workspace::none();
  auto b = harness::poisoned_workspace(bytes, harness::location_for(target));
  EXPECT_TRUE(b.ok());
  hold = std::make_unique<Buffer>(std::move(b).value());
  return hold->as_workspace();
}

// ---- The float64 oracle: the reference plan on dense f64 host buffers --------------------------
struct Dense {
  std::vector<double> data;
  std::vector<int64_t> shape;
  Tensor view() { return make_tensor(data.data(), DType::f64, std::span<const int64_t>(shape)); }
  ConstTensor cview() { return as_const(view()); }
};
Dense dense(std::vector<int64_t> shape, std::vector<double> v = {}) {
  Dense d{std::move(v), std::move(shape)};
  d.data.resize(harness::numel_of(d.shape), 0.0);
  return d;
}

struct Oracle {
  Config c;  // dtype forced to f64
  Problem p;
  Shapes s;
  std::vector<int32_t> cu_q, cu_k, used_k, table;
  explicit Oracle(Config cfg) : c(std::move(cfg)) {
    c.dtype = DType::f64;
    p = problem_of(c);
    s = shapes_of(p);
    cu_q = c.cu_q, cu_k = c.cu_k, used_k = c.used_k, table = c.table;
  }
  ConstTensor block_table() {
    if (table.empty()) return {};
    return make_tensor(static_cast<const void*>(table.data()), DType::i32,
                       std::span<const int64_t>(s.block_table, 2));
  }
  ConstTensor cu(std::vector<int32_t>& v) {
    if (v.empty()) return {};
    const int64_t n[] = {static_cast<int64_t>(v.size())};
    return make_tensor(static_cast<const void*>(v.data()), DType::i32, n);
  }
  std::pair<std::vector<double>, std::vector<double>> forward(const std::vector<double>& q,
                                                              const std::vector<double>& k,
                                                              const std::vector<double>& v) {
    const int r = s.rank_qkv;
    Dense dq = dense(vec(s.q, r), q), dk = dense(vec(s.k, s.rank_kv), k),
          dv = dense(vec(s.v, s.rank_kv), v);
    Dense y = dense(vec(s.y, r)), lse = dense(vec(s.lse, s.rank_lse));
    auto plan = ForwardPlan::select(Stream::cpu(), desc_of(c));
    EXPECT_TRUE(plan.ok()) << plan.error().to_string();
    ForwardArguments a{dq.cview(), dk.cview(), dv.cview(), y.view(),
                       lse.view(), cu(cu_q),   cu(cu_k)};
    a.seqused_k = cu(used_k);
    a.block_table = block_table();
    auto st = plan->run(Stream::cpu(), Workspace::none(), a);
    EXPECT_TRUE(st.ok()) << st.error().to_string();
    return {y.data, lse.data};
  }
  // The reference for the given row blocks only (disjoint; run in parallel): full-size Y and LSE
  // in logical order, meaningful at those rows (zero elsewhere).
  std::pair<std::vector<double>, std::vector<double>> forward_rows(
      const std::vector<double>& q, const std::vector<double>& k, const std::vector<double>& v,
      const std::vector<RowBlock>& blocks) {
    const int r = s.rank_qkv;
    Dense dq = dense(vec(s.q, r), q), dk = dense(vec(s.k, s.rank_kv), k),
          dv = dense(vec(s.v, s.rank_kv), v);
    Dense y = dense(vec(s.y, r)), lse = dense(vec(s.lse, s.rank_lse));
    ForwardArguments a{dq.cview(), dk.cview(), dv.cview(), y.view(),
                       lse.view(), cu(cu_q),   cu(cu_k)};
    a.seqused_k = cu(used_k);
    a.block_table = block_table();
    std::vector<Status> st(blocks.size());
    parallel_for(static_cast<int64_t>(blocks.size()), [&](int64_t j) {
      const RowBlock& bk = blocks[j];
      st[j] = detail::reference_forward_rows(p, a, bk.b, bk.h, bk.i0, bk.i1);
    });
    for (const Status& x : st) EXPECT_TRUE(x.ok()) << x.error().to_string();
    return {y.data, lse.data};
  }
  // The whole forward, one task per (batch, head) slice (non-varlen).
  std::pair<std::vector<double>, std::vector<double>> forward_parallel(
      const std::vector<double>& q, const std::vector<double>& k, const std::vector<double>& v) {
    std::vector<RowBlock> all;
    for (int64_t b = 0; b < c.b; ++b)
      for (int64_t h = 0; h < c.hq; ++h) all.push_back({b, h, 0, c.lq});
    return forward_rows(q, k, v, all);
  }
  struct Grads {
    std::vector<double> dq, dk, dv;
  };
  Grads backward(const std::vector<double>& q, const std::vector<double>& k,
                 const std::vector<double>& v, const std::vector<double>& y,
                 const std::vector<double>& dy, const std::vector<double>& lse) {
    const int r = s.rank_qkv;
    Dense tq = dense(vec(s.q, r), q), tk = dense(vec(s.k, r), k), tv = dense(vec(s.v, r), v);
    Dense ty = dense(vec(s.y, r), y), tdy = dense(vec(s.y, r), dy);
    Dense tl = dense(vec(s.lse, s.rank_lse), lse);
    Dense gq = dense(vec(s.q, r)), gk = dense(vec(s.k, r)), gv = dense(vec(s.v, r));
    auto plan = BackwardPlan::select(Stream::cpu(), desc_of(c));
    EXPECT_TRUE(plan.ok()) << plan.error().to_string();
    auto st = plan->run(Stream::cpu(), Workspace::none(),
                        {tq.cview(), tk.cview(), tv.cview(), ty.cview(), tdy.cview(), tl.cview(),
                         gq.view(), gk.view(), gv.view(), cu(cu_q), cu(cu_k)});
    EXPECT_TRUE(st.ok()) << st.error().to_string();
    return {gq.data, gk.data, gv.data};
  }
};

// ---- Running a plan on a target against the oracle
// ------------------------------------------------ Returns the output bytes (Y then LSE) so callers
// can compare runs bitwise.
// This family's own kernels: the reference on the CPU, the bespoke CUDA kernels on the GPU (the
// default plan may route to another backend, such as cuDNN, which attention_hopper tests).
PlanPreference ours(Target target) {
  return target == Target::cpu ? PlanPreference::fastest()
                               : PlanPreference::only(Backend::bespoke_cuda);
}

// The family's own pick among its kernels: under an empty selection table fa3's ranked-ahead
// entries (bespoke CUDA too, so `ours` admits them where the table ranks fa3 first) stand aside.
Result<BackwardPlan> family_backward(Target target, const Descriptor& d) {
#if BARACUDA_HAVE_ATTENTION_HOPPER
  const attention_hopper::SelectionTableOverride no_table{
      std::span<const attention_hopper::TablePoint>{}};
#endif
  return BackwardPlan::select(harness::stream_for(target), d, ours(target));
}

// ---- Bounded checks of big shapes
// The float64 reference costs ~(Dk + Dv) multiply-adds per (query row, key) pair through its
// per-element dtype loads, on one core: the device suite's big shapes (32k-key decode, 600 x 600
// at D = 256, three kernels by name) add up to tens of billions, minutes. Past kFullCheckOps a
// case is checked on sampled rows: every element of the first, the last and a random (batch,
// head) slice (or of three row blocks of each, head, tail and a random middle, where a slice
// alone passes kSliceOps), against the reference computed for those rows only and in parallel;
// plus whole-tensor checks that cost nothing next to that (every Y element written, finite and
// inside the range of V, fully masked rows exactly zero, LSE finite exactly where a row sees a
// key). Small shapes keep the exhaustive full-tensor comparison.
constexpr double kFullCheckOps = 1.6e7;
constexpr double kSliceOps = 6e6;

double forward_ops(const Config& c) {
  return static_cast<double>(c.b * c.hq) * static_cast<double>(c.lq * c.lk) *
         static_cast<double>(c.dk + c.dv);
}
double backward_ops(const Config& c) {
  return static_cast<double>(c.b * c.hq) * static_cast<double>(c.lq * c.lk) *
         static_cast<double>(3 * c.dk + 2 * c.dv);
}
bool sampled(const Config& c, double ops) {
  return c.cu_q.empty() && c.used_k.empty() && c.page_size == 0 && ops > kFullCheckOps;
}

std::vector<RowBlock> sample_rows(const Config& c, Rng& rng) {
  std::vector<std::pair<int64_t, int64_t>> slices = {
      {0, 0}, {c.b - 1, c.hq - 1}, {rng.integer(0, c.b - 1), rng.integer(0, c.hq - 1)}};
  std::sort(slices.begin(), slices.end());
  slices.erase(std::unique(slices.begin(), slices.end()), slices.end());
  const double row_ops = static_cast<double>(c.lk) * static_cast<double>(c.dk + c.dv);
  const int64_t n = std::max<int64_t>(1, static_cast<int64_t>(kSliceOps / (3 * row_ops)));
  std::vector<RowBlock> out;
  for (auto [b, h] : slices) {
    if (3 * n >= c.lq) {
      out.push_back({b, h, 0, c.lq});
      continue;
    }
    const int64_t mid = rng.integer(n, c.lq - 2 * n);  // disjoint from the head and tail blocks
    out.push_back({b, h, 0, n});
    out.push_back({b, h, mid, mid + n});
    out.push_back({b, h, c.lq - n, c.lq});
  }
  return out;
}

// Y and LSE in logical order (non-varlen) against the reference (ry, rl: meaningful on the
// sampled rows only), plus the whole-tensor checks; vmax = max |V|.
void compare_sampled(const Config& c, DType lse_dtype, const std::vector<double>& ry,
                     const std::vector<double>& rl, double vmax, const std::vector<double>& yv,
                     const std::vector<double>& lv, const std::vector<RowBlock>& blocks,
                     double lse_slack = 0) {
  attention::testing::expect_forward_outputs({c.b, c.hq, c.lq, c.lk, c.dv, c.mask}, c.dtype,
                                             lse_dtype, ry, rl, vmax, yv, lv, blocks, false,
                                             lse_slack);
}

// One forward problem, several plans on the same inputs against one reference: building 32k-key
// inputs (random fill, download, float64 copies: ~100 ns per element on the host) and the
// reference cost more than the kernels, so they are paid once per problem. repeats > 1 runs the
// plan again (outputs re-poisoned) and requires the same bits.
struct ForwardRun {
  ForwardRun(std::optional<PlanPreference> pref = std::nullopt, int reps = 1)
      : preference(std::move(pref)), repeats(reps) {}
  std::optional<PlanPreference> preference;  // none: this family's own kernels (ours(target))
  int repeats = 1;
  std::string kernel;        // out: the kernel the plan picked
  std::vector<uint8_t> out;  // out: Y then LSE bytes (whole buffers)
};

void check_forward_runs(Target target, const Config& c, Lay lay, std::vector<ForwardRun>& runs) {
  SCOPED_TRACE(c.str() + " layout=" + lay_name(lay) + " on " + harness::target_name(target));
  const auto t0 = std::chrono::steady_clock::now();
  Rng rng;
  const Problem p = problem_of(c);
  const Shapes s = shapes_of(p);
  const int r = s.rank_qkv;
  auto q = make(c.dtype, vec(s.q, r), target, lay, rng);
  auto k = make(c.dtype, vec(s.k, s.rank_kv), target, lay, rng);
  auto v = make(c.dtype, vec(s.v, s.rank_kv), target, lay, rng);
  q->fill_random(rng, -2, 2);
  k->fill_random(rng, -2, 2);
  v->fill_random(rng);
  if (c.huge_scores) {
    q->fill_random(rng, 1e19, 2e19);
    std::vector<double> kv = k->values();  // [B][Hk][Lk][Dk] order
    for (size_t i = 0; i < kv.size(); ++i)
      if (static_cast<int64_t>(i) / c.dk % c.lk % 2 == 0) kv[i] = rng.uniform(1e19, 2e19);
    k->set_values(kv);
  }
  std::unique_ptr<TestTensor> cu_q, cu_k, used_k, table;
  if (!c.cu_q.empty()) cu_q = seqlens(c.cu_q, target), cu_k = seqlens(c.cu_k, target);
  if (!c.used_k.empty()) used_k = seqlens(c.used_k, target);
  if (c.page_size > 0) {
    table =
        std::make_unique<TestTensor>(TestTensor::make(DType::i32, vec(s.block_table, 2), target));
    table->set_values(std::vector<double>(c.table.begin(), c.table.end()));
  }
  // The reference, once: whole, or the sampled rows of a big problem.
  const bool big = sampled(c, forward_ops(c));
  std::vector<RowBlock> blocks;
  double vmax = 0;
  std::pair<std::vector<double>, std::vector<double>> ref;
  {
    Oracle o(c);
    const std::vector<double> qv = q->values(), kv = k->values(), vv = v->values();
    if (big) {
      blocks = sample_rows(c, rng);
      ref = o.forward_rows(qv, kv, vv, blocks);
      for (double x : vv) vmax = std::max(vmax, std::abs(x));
    } else {
      ref = o.forward(qv, kv, vv);
    }
  }
  const Stream& stream = harness::stream_for(target);
  std::string names;
  for (ForwardRun& run : runs) {
    auto y = make(c.dtype, vec(s.y, r), target, lay, rng);
    auto lse = make(p.lse_dtype, vec(s.lse, s.rank_lse), target, Lay::padded, rng);
    ForwardArguments args{q->cview(), k->cview(), v->cview(), y->view(), lse->view(), {}, {}};
    if (cu_q) args.cu_seqlens_q = cu_q->cview(), args.cu_seqlens_k = cu_k->cview();
    if (used_k) args.seqused_k = used_k->cview();
    if (table) args.block_table = table->cview();
    auto plan = ForwardPlan::select(stream, desc_of(c), run.preference.value_or(ours(target)));
    if (!plan.ok()) {
      ADD_FAILURE() << plan.error().to_string();
      continue;
    }
    run.kernel = std::string(plan->sku().name);
    names += " " + run.kernel;
    SCOPED_TRACE("kernel " + run.kernel);
    std::unique_ptr<Buffer> hold;
    const Workspace ws = workspace_for(plan->workspace_size(), target, hold);
    std::vector<uint8_t> y_before, lse_before, first;
    for (int rep = 0; rep < run.repeats; ++rep) {
      y->poison();
      lse->poison();
      if (rep == 0) y_before = y->bytes(), lse_before = lse->bytes();
      const Status st = plan->run(stream, ws, args);
      EXPECT_TRUE(st.ok()) << st.error().to_string();
      run.out = y->bytes();
      const auto lb = lse->bytes();
      run.out.insert(run.out.end(), lb.begin(), lb.end());
      if (rep == 0) {
        first = run.out;
      } else {
        EXPECT_TRUE(harness::bytes_equal(first, run.out, "the same plan run again"));
      }
    }
    const double slack = attention::testing::lse_slack(run.kernel, c.softcap);
    if (big) {
      compare_sampled(c, p.lse_dtype, ref.first, ref.second, vmax, y->values(), lse->values(),
                      blocks, slack);
    } else {
      EXPECT_TRUE(close_to(y->values(), ref.first, c.dtype, Accuracy::reduction, "y"));
      EXPECT_TRUE(
          close_to(lse->values(), ref.second, p.lse_dtype, Accuracy::reduction, "lse", slack));
    }
    EXPECT_TRUE(harness::untouched_outside(y_before, y->bytes(), y->bit_mask(), "y gaps"));
    EXPECT_TRUE(harness::untouched_outside(lse_before, lse->bytes(), lse->bit_mask(), "lse gaps"));
  }
  if (big) {
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("[ heavy    ] forward %s, %s:%s: %lld of %lld rows checked, %.2f s\n",
                c.str().c_str(), lay_name(lay), names.c_str(),
                static_cast<long long>(rows_of(blocks)), static_cast<long long>(c.b * c.hq * c.lq),
                secs);
  }
}

std::vector<uint8_t> check_forward(Target target, const Config& c, Lay lay,
                                   std::optional<PlanPreference> preference = std::nullopt,
                                   std::string* kernel = nullptr) {
  std::vector<ForwardRun> runs{ForwardRun(preference)};
  check_forward_runs(target, c, lay, runs);
  if (kernel) *kernel = runs[0].kernel;
  return runs[0].out;
}

// Heads [h0, h0 + n) of batch b of a logical [B, H, L, D] tensor (D = 1 for LSE).
std::vector<double> heads_of(const std::vector<double>& x, int64_t h_all, int64_t l, int64_t d,
                             int64_t b, int64_t h0, int64_t n) {
  const auto first = x.begin() + (b * h_all + h0) * l * d;
  return {first, first + n * l * d};
}

// The backward of a (batch, K/V head) group depends on that group's Q/K/V/Y/dY/LSE only: the
// reference runs on the first and the last group as problems of their own (in parallel), and every
// element of their dQ, dK and dV is compared; every element of the whole tensors must be finite.
void check_backward_sampled(const Config& c, const std::vector<double>& q,
                            const std::vector<double>& k, const std::vector<double>& v,
                            const std::vector<double>& y, const std::vector<double>& dy,
                            const std::vector<double>& lse, const std::vector<double>& gq,
                            const std::vector<double>& gk, const std::vector<double>& gv) {
  const int64_t group = c.hq / c.hk;
  std::vector<std::pair<int64_t, int64_t>> groups = {{0, 0}, {c.b - 1, c.hk - 1}};
  groups.erase(std::unique(groups.begin(), groups.end()), groups.end());
  std::vector<Oracle::Grads> ref(groups.size());
  parallel_for(static_cast<int64_t>(groups.size()), [&](int64_t j) {
    const auto [b, hk] = groups[j];
    Config sc = c;
    sc.b = 1, sc.hq = group, sc.hk = 1;
    Oracle og(sc);
    const int64_t h0 = hk * group;
    ref[j] = og.backward(
        heads_of(q, c.hq, c.lq, c.dk, b, h0, group), heads_of(k, c.hk, c.lk, c.dk, b, hk, 1),
        heads_of(v, c.hk, c.lk, c.dv, b, hk, 1), heads_of(y, c.hq, c.lq, c.dv, b, h0, group),
        heads_of(dy, c.hq, c.lq, c.dv, b, h0, group), heads_of(lse, c.hq, c.lq, 1, b, h0, group));
  });
  std::vector<double> got_q, ref_q, got_k, ref_k, got_v, ref_v;
  auto append = [](std::vector<double>& to, const std::vector<double>& from) {
    to.insert(to.end(), from.begin(), from.end());
  };
  for (size_t j = 0; j < groups.size(); ++j) {
    const auto [b, hk] = groups[j];
    append(got_q, heads_of(gq, c.hq, c.lq, c.dk, b, hk * group, group)), append(ref_q, ref[j].dq);
    append(got_k, heads_of(gk, c.hk, c.lk, c.dk, b, hk, 1)), append(ref_k, ref[j].dk);
    append(got_v, heads_of(gv, c.hk, c.lk, c.dv, b, hk, 1)), append(ref_v, ref[j].dv);
  }
  EXPECT_TRUE(close_to(got_q, ref_q, c.dtype, Accuracy::reduction, "dq (sampled groups)"));
  EXPECT_TRUE(close_to(got_k, ref_k, c.dtype, Accuracy::reduction, "dk (sampled groups)"));
  EXPECT_TRUE(close_to(got_v, ref_v, c.dtype, Accuracy::reduction, "dv (sampled groups)"));
  for (const auto* g : {&gq, &gk, &gv}) {
    const auto bad = std::find_if(g->begin(), g->end(), [](double x) { return !std::isfinite(x); });
    EXPECT_TRUE(bad == g->end()) << "gradient not finite (unwritten?) at logical index "
                                 << (bad - g->begin());
  }
}

std::vector<uint8_t> check_backward(Target target, const Config& c, Lay lay,
                                    std::optional<PlanPreference> preference = std::nullopt) {
  const PlanPreference pref = preference.value_or(ours(target));
  SCOPED_TRACE(c.str() + " layout=" + lay_name(lay) + " on " + harness::target_name(target));
  Rng rng;
  const Problem p = problem_of(c);
  const Shapes s = shapes_of(p);
  const int r = s.rank_qkv;
  auto q = make(c.dtype, vec(s.q, r), target, lay, rng);
  auto k = make(c.dtype, vec(s.k, s.rank_kv), target, lay, rng);
  auto v = make(c.dtype, vec(s.v, s.rank_kv), target, lay, rng);
  auto y = make(c.dtype, vec(s.y, r), target, lay, rng);
  auto dy = make(c.dtype, vec(s.y, r), target, lay, rng);
  auto lse = make(p.lse_dtype, vec(s.lse, s.rank_lse), target, Lay::padded, rng);
  auto dq = make(c.dtype, vec(s.q, r), target, lay, rng);
  auto dk = make(c.dtype, vec(s.k, r), target, lay, rng);
  auto dv = make(c.dtype, vec(s.v, r), target, lay, rng);
  q->fill_random(rng, -2, 2);
  k->fill_random(rng, -2, 2);
  v->fill_random(rng);
  dy->fill_random(rng);
  Oracle o(c);
  const bool big = sampled(c, backward_ops(c));
  const auto t0 = std::chrono::steady_clock::now();
  {  // Y and LSE as a forward would save them (rounded to their storage types)
    const auto [ry, rl] = big ? o.forward_parallel(q->values(), k->values(), v->values())
                              : o.forward(q->values(), k->values(), v->values());
    y->set_values(ry);
    lse->set_values(rl);
  }
  std::unique_ptr<TestTensor> cu_q, cu_k;
  BackwardArguments args{q->cview(), k->cview(), v->cview(), y->cview(), dy->cview(), lse->cview(),
                         dq->view(), dk->view(), dv->view(), {},         {}};
  if (!c.cu_q.empty()) {
    cu_q = seqlens(c.cu_q, target), cu_k = seqlens(c.cu_k, target);
    args.cu_seqlens_q = cu_q->cview(), args.cu_seqlens_k = cu_k->cview();
  }
  const Stream& stream = harness::stream_for(target);
  auto plan = BackwardPlan::select(stream, desc_of(c), pref);
  if (!plan.ok()) {
    ADD_FAILURE() << plan.error().to_string();
    return {};
  }
  std::unique_ptr<Buffer> hold;
  const Workspace ws = workspace_for(plan->workspace_size(), target, hold);
  for (auto* t : {dq.get(), dk.get(), dv.get()}) t->poison();
  const auto bq = dq->bytes(), bk = dk->bytes(), bv = dv->bytes();
  const Status st = plan->run(stream, ws, args);
  EXPECT_TRUE(st.ok()) << st.error().to_string();
  if (big) {
    check_backward_sampled(c, q->values(), k->values(), v->values(), y->values(), dy->values(),
                           lse->values(), dq->values(), dk->values(), dv->values());
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("[ heavy    ] backward %s %s: sampled K/V head groups, %.2f s\n", c.str().c_str(),
                std::string(plan->sku().name).c_str(), secs);
  } else {
    const auto g =
        o.backward(q->values(), k->values(), v->values(), y->values(), dy->values(), lse->values());
    EXPECT_TRUE(close_to(dq->values(), g.dq, c.dtype, Accuracy::reduction, "dq"));
    EXPECT_TRUE(close_to(dk->values(), g.dk, c.dtype, Accuracy::reduction, "dk"));
    EXPECT_TRUE(close_to(dv->values(), g.dv, c.dtype, Accuracy::reduction, "dv"));
  }
  const auto aq = dq->bytes(), ak = dk->bytes(), av = dv->bytes();
  EXPECT_TRUE(harness::untouched_outside(bq, aq, dq->bit_mask(), "dq gaps"));
  EXPECT_TRUE(harness::untouched_outside(bk, ak, dk->bit_mask(), "dk gaps"));
  EXPECT_TRUE(harness::untouched_outside(bv, av, dv->bit_mask(), "dv gaps"));
  std::vector<uint8_t> out = aq;
  out.insert(out.end(), ak.begin(), ak.end());
  out.insert(out.end(), av.begin(), av.end());
  return out;
}

class AttentionTest : public ::testing::TestWithParam<Target> {};
INSTANTIATE_TEST_SUITE_P(Targets, AttentionTest, ::testing::ValuesIn(harness::all_targets()),
                         [](const auto& info) { return harness::target_name(info.param); });

const Mask kMasks[] = {Mask::none(),
                       Mask::causal_top_left(),
                       Mask::causal_bottom_right(),
                       Mask::sliding_window(3, 2),
                       Mask::sliding_window(4, 0, Diagonal::top_left),
                       Mask::sliding_window(-1, 1, Diagonal::top_left)};
const std::pair<int64_t, int64_t> kHeads[] = {{2, 2}, {4, 2}, {3, 1}};  // MHA, GQA 2, MQA
const Lay kLays[] = {Lay::bhld, Lay::blhd, Lay::padded, Lay::permuted};
const int64_t kDims[] = {32, 64, 80, 96, 128, 192, 256};
const DType kTypes[] = {DType::f16, DType::bf16, DType::f32, DType::f64};

// ---- Descriptor rules ---------------------------------------------------------------------------
// Random descriptors, edges included: planned or refused naming the op, never a crash or overflow.
TEST(AttentionRules, RandomDescriptorsArePlannedOrRefused) {
  Rng rng;
  const Stream cpu = Stream::cpu();
  // Mostly plausible values (so that a fair share plans), edges a quarter of the time.
  auto small_or_edge = [&] { return harness::small_or_edge(rng, 9, 25); };
  int planned = 0;
  for (int i = 0; i < 10000; ++i) {
    Descriptor d;
    d.dtype = rng.coin() ? DType::f32 : harness::any_dtype(rng);
    d.batch = small_or_edge(), d.heads_q = small_or_edge(), d.heads_kv = small_or_edge();
    if (rng.coin() && d.heads_kv > 0 && d.heads_kv < 10) d.heads_q = d.heads_kv * rng.integer(1, 4);
    d.len_q = small_or_edge(), d.len_k = small_or_edge();
    d.head_dim_qk = small_or_edge(), d.head_dim_v = small_or_edge();
    if (rng.integer(0, 3) == 0) d.scale = rng.coin() ? -1.0 : std::nan("");
    if (rng.integer(0, 3) == 0) d.softcap = rng.coin() ? -2.0 : 30.0;
    d.mask = Mask{rng.integer(0, 3) > 0 ? -1 : harness::small_or_edge(rng, 19, 67),
                  rng.integer(0, 3) > 0 ? -1 : harness::small_or_edge(rng, 19, 67),
                  rng.coin() ? Diagonal::top_left : Diagonal::bottom_right};
    d.varlen = rng.integer(0, 3) == 0;
    d.total_q = small_or_edge(), d.total_k = small_or_edge();
    if (rng.integer(0, 4) == 0) d.out_dtype = harness::any_dtype(rng);
    ASSERT_TRUE((harness::plans_or_names_ops<ForwardOp, BackwardOp>(cpu, d, &planned)))
        << "case " << i;
  }
  EXPECT_GT(planned, 20);
}

TEST(AttentionRules, DescriptorErrorsNameTheRuleAndNumbers) {
  const Stream cpu = Stream::cpu();
  auto bad = [&](auto edit, ErrorKind kind, std::initializer_list<std::string_view> needles) {
    Config c;
    Descriptor d = desc_of(c);
    edit(d);
    EXPECT_TRUE(fails_with(ForwardPlan::select(cpu, d), kind, needles));
    EXPECT_TRUE(fails_with(BackwardPlan::select(cpu, d), kind, needles));
  };
  using K = ErrorKind;
  bad([](Descriptor& d) { d.dtype = DType::i32; }, K::invalid_problem,
      {"attention_", "dtype=i32: attention needs a floating-point dtype"});
  bad([](Descriptor& d) { d.batch = -1; }, K::invalid_problem, {"batch=-1 is negative"});
  bad([](Descriptor& d) { d.len_k = -3; }, K::invalid_problem, {"len_k=-3 is negative"});
  bad([](Descriptor& d) { d.heads_kv = 0; }, K::invalid_problem, {"heads_kv=0 with heads_q=2"});
  bad([](Descriptor& d) { d.heads_q = 3, d.heads_kv = 2; }, K::invalid_problem,
      {"heads_q=3 is not a multiple of heads_kv=2"});
  bad([](Descriptor& d) { d.head_dim_v = 0; }, K::invalid_problem,
      {"head_dim_qk=32, head_dim_v=0: head dims must be positive"});
  bad([](Descriptor& d) { d.head_dim_qk = 257; }, K::unsupported, {"head_dim_qk=257", "above 256"});
  bad([](Descriptor& d) { d.scale = kInf; }, K::invalid_problem, {"scale=inf is not finite"});
  bad([](Descriptor& d) { d.softcap = -1; }, K::invalid_problem, {"softcap=-1 must be finite"});
  bad([](Descriptor& d) { d.softcap = std::nan(""); }, K::invalid_problem, {"softcap=nan"});
  bad([](Descriptor& d) { d.mask.left = -2; }, K::invalid_problem,
      {"mask=(-2,-1): window bounds must be >= 0"});
  bad([](Descriptor& d) { d.varlen = true, d.total_q = 4, d.total_k = 9; }, K::invalid_problem,
      {"varlen: max lengths (len_q=5, len_k=7) exceed the packed totals (total_q=4, total_k=9)"});
  bad([](Descriptor& d) { d.total_q = 4; }, K::invalid_problem,
      {"total_q=4, total_k=0: totals are only meaningful with varlen=true"});
  bad([](Descriptor& d) { d.len_q = int64_t{1} << 32; }, K::unsupported,
      {"len_q=4294967296 exceeds 2^31-1"});
  bad([](Descriptor& d) { d.batch = int64_t{1} << 30, d.heads_q = 1 << 30, d.heads_kv = 1; },
      K::invalid_problem, {"overflows int64"});
  bad([](Descriptor& d) { d.dtype = DType::e5m2; }, K::unsupported,
      {"dtype=e5m2: fp8 attention takes e4m3 Q, K and V"});
  bad([](Descriptor& d) { d.out_dtype = DType::f16; }, K::invalid_problem,
      {"out_dtype=f16 with dtype=f32", "Y has the inputs' dtype"});
  bad([](Descriptor& d) { d.dtype = DType::bf16, d.out_dtype = DType::f16; }, K::invalid_problem,
      {"out_dtype=f16 with dtype=bf16"});
  // Paged K / V: sizes, forward only.
  bad([](Descriptor& d) { d.page_size = -1; }, K::invalid_problem,
      {"page_size=-1, pages=0: must be >= 0"});
  bad([](Descriptor& d) { d.pages = 4; }, K::invalid_problem,
      {"pages=4 with page_size=0: pages are only meaningful for paged K / V"});
  Descriptor paged = desc_of(Config{});
  paged.page_size = 4, paged.pages = 2;
  BARACUDA_EXPECT_OK(ForwardPlan::select(cpu, paged));
  EXPECT_TRUE(fails_with(BackwardPlan::select(cpu, paged), K::unsupported,
                         {"attention_backward: page_size=4: paged K / V are forward only"}));
  Descriptor paged_varlen = paged;  // packed queries against paged caches: the CPU backend's
  paged_varlen.varlen = true, paged_varlen.total_q = 5, paged_varlen.total_k = 7;
  BARACUDA_EXPECT_OK(ForwardPlan::select(cpu, paged_varlen));
  EXPECT_TRUE(fails_with(BackwardPlan::select(cpu, paged_varlen), K::unsupported,
                         {"attention_backward: page_size=4: paged K / V are forward only"}));
  paged.pages = 0;
  EXPECT_TRUE(fails_with(ForwardPlan::select(cpu, paged), K::invalid_problem,
                         {"pages=0 with page_size=4 and len_k=7: the sequences' keys need pages"}));
  // seqused_k: forward only.
  Descriptor used = desc_of(Config{});
  used.seqused_k = true;
  BARACUDA_EXPECT_OK(ForwardPlan::select(cpu, used));
  EXPECT_TRUE(
      fails_with(BackwardPlan::select(cpu, used), K::unsupported,
                 {"attention_backward: seqused_k: per-sequence key counts are forward only"}));
  // fp8: forward only, Y in bf16 or f16.
  Descriptor fp8 = desc_of(Config{});
  fp8.dtype = DType::e4m3;
  BARACUDA_EXPECT_OK(ForwardPlan::select(cpu, fp8));
  EXPECT_TRUE(fails_with(BackwardPlan::select(cpu, fp8), K::unsupported,
                         {"attention_backward: dtype=e4m3: fp8 attention is forward only"}));
  fp8.out_dtype = DType::f32;
  EXPECT_TRUE(fails_with(ForwardPlan::select(cpu, fp8), K::invalid_problem,
                         {"out_dtype=f32 with dtype=e4m3: e4m3 attention writes bf16 or f16"}));
}

// fp8 (e4m3) inputs with per-tensor descales on the CPU backend: attention over the dequantized
// values (the f64 plan on element x descale), Y rounded once to out_dtype, LSE in f32.
TEST(AttentionFp8, CpuForwardIsAttentionOverTheDequantizedInputs) {
  Rng rng;
  const Stream cpu = Stream::cpu();
  for (int variant = 0; variant < 3; ++variant) {
    const DType out = variant == 1 ? DType::f16 : DType::bf16;
    Config c;
    c.b = 2, c.hq = 4, c.hk = 2, c.lq = 37, c.lk = 53, c.dk = 48, c.dv = 40;
    c.mask = variant == 1 ? Mask::none() : Mask::causal_bottom_right();
    c.softcap = variant == 1 ? 20.0 : 0.0;
    if (variant == 2) c.cu_q = {0, 30, 37}, c.cu_k = {0, 0, 53}, c.lq = 30;  // packed; an empty K
    SCOPED_TRACE(std::string("y ") + std::string(name(out)) + " " + c.str());
    Descriptor d = desc_of(c);
    d.dtype = DType::e4m3, d.out_dtype = out;
    const Shapes s = shapes_of(ForwardOp::make_problem(d).value());
    const int rq = s.rank_qkv, rl = s.rank_lse;
    auto in = [&](const int64_t* shape) {
      TestTensor t = TestTensor::make(DType::e4m3, {shape, shape + rq}, Target::cpu);
      t.fill_random(rng, -4, 4);
      return t;
    };
    TestTensor q = in(s.q), k = in(s.k), v = in(s.v);
    const double ds[] = {rng.uniform(0.5, 1.5), rng.uniform(0.5, 1.5), rng.uniform(0.5, 1.5)};
    std::vector<TestTensor> scales;
    for (double x : ds) {
      scales.push_back(TestTensor::make(DType::f32, {1}, Target::cpu));
      scales.back().set_values({x});
    }
    const int64_t nb[] = {c.b + 1};
    TestTensor cq = TestTensor::make(DType::i32, {nb[0]}, Target::cpu),
               ck = TestTensor::make(DType::i32, {nb[0]}, Target::cpu);
    cq.set_values({c.cu_q.begin(), c.cu_q.end()});
    ck.set_values({c.cu_k.begin(), c.cu_k.end()});
    const ConstTensor cuq = variant == 2 ? cq.cview() : ConstTensor{},
                      cuk = variant == 2 ? ck.cview() : ConstTensor{};
    TestTensor y = TestTensor::make(out, {s.y, s.y + rq}, Target::cpu);
    TestTensor lse = TestTensor::make(DType::f32, {s.lse, s.lse + rl}, Target::cpu);
    y.poison(), lse.poison();
    auto plan = ForwardPlan::select(cpu, d);
    BARACUDA_ASSERT_OK(plan);
    ForwardArguments a{q.cview(), k.cview(), v.cview(), y.view(), lse.view(), cuq, cuk};
    a.q_descale = scales[0].cview(), a.k_descale = scales[1].cview();
    a.v_descale = scales[2].cview();
    BARACUDA_ASSERT_OK(plan->run(cpu, Workspace::none(), a));

    // The oracle: the f64 plan on the dequantized values.
    Descriptor d64 = desc_of(c);
    d64.dtype = DType::f64;
    auto deq = [&](const TestTensor& t, double x) {
      TestTensor r = TestTensor::make(DType::f64, t.shape(), Target::cpu);
      std::vector<double> vals = t.values();
      for (double& e : vals) e *= x;
      r.set_values(vals);
      return r;
    };
    TestTensor q64 = deq(q, ds[0]), k64 = deq(k, ds[1]), v64 = deq(v, ds[2]);
    TestTensor y64 = TestTensor::make(DType::f64, {s.y, s.y + rq}, Target::cpu);
    TestTensor l64 = TestTensor::make(DType::f64, {s.lse, s.lse + rl}, Target::cpu);
    auto ref = ForwardPlan::select(cpu, d64);
    BARACUDA_ASSERT_OK(ref);
    BARACUDA_ASSERT_OK(
        ref->run(cpu, Workspace::none(),
                 {q64.cview(), k64.cview(), v64.cview(), y64.view(), l64.view(), cuq, cuk}));
    EXPECT_TRUE(close_to(y.values(), y64.values(), out, Accuracy::elementwise, "y"));
    EXPECT_TRUE(close_to(lse.values(), l64.values(), DType::f32, Accuracy::elementwise, "lse"));
  }
}

// The fp8 argument rules: descales required (f32 [1], on the plan's device) for e4m3 and refused
// for other dtypes, Y in the resolved out_dtype; nothing is written on any of them.
TEST(AttentionFp8, ArgumentErrorsNeverWrite) {
  Rng rng;
  const Stream cpu = Stream::cpu();
  Config c;
  Descriptor d = desc_of(c);
  d.dtype = DType::e4m3;
  const Shapes s = shapes_of(ForwardOp::make_problem(d).value());
  auto make = [&](DType t, const int64_t* shape, int rank) {
    TestTensor x = TestTensor::make(t, {shape, shape + rank}, Target::cpu);
    x.fill_random(rng);
    return x;
  };
  TestTensor q = make(DType::e4m3, s.q, 4), k = make(DType::e4m3, s.k, 4),
             v = make(DType::e4m3, s.v, 4);
  TestTensor y = make(DType::bf16, s.y, 4), y16 = make(DType::f16, s.y, 4);
  TestTensor lse = make(DType::f32, s.lse, 3);
  const int64_t one[] = {1}, two[] = {2};
  TestTensor sc = make(DType::f32, one, 1), sc2 = make(DType::f32, two, 1),
             sc64 = make(DType::f64, one, 1);
  auto plan = ForwardPlan::select(cpu, d);
  BARACUDA_ASSERT_OK(plan);
  const ForwardArguments good{q.cview(), k.cview(), v.cview(),  y.view(),   lse.view(),
                              {},        {},        sc.cview(), sc.cview(), sc.cview()};
  auto bad = [&](ForwardArguments a, std::initializer_list<std::string_view> needles) {
    y.poison(), y16.poison(), lse.poison();
    const auto yb = y.bytes(), y16b = y16.bytes(), lb = lse.bytes();
    EXPECT_TRUE(
        fails_with(plan->run(cpu, Workspace::none(), a), ErrorKind::invalid_problem, needles));
    EXPECT_TRUE(harness::bytes_equal(yb, y.bytes(), "y"));
    EXPECT_TRUE(harness::bytes_equal(y16b, y16.bytes(), "y16"));
    EXPECT_TRUE(harness::bytes_equal(lb, lse.bytes(), "lse"));
  };
  ForwardArguments a = good;
  a.k_descale = {};
  bad(a, {"attention_forward: k_descale"});
  a = good, a.v_descale = sc2.cview();
  bad(a, {"attention_forward: v_descale"});
  a = good, a.q_descale = sc64.cview();
  bad(a, {"attention_forward: q_descale", "f64"});
  a = good, a.y = y16.view();  // out_dtype resolved to bf16
  bad(a, {"attention_forward: y", "f16"});
  BARACUDA_ASSERT_OK(plan->run(cpu, Workspace::none(), good));
  // A bf16 problem given descales.
  Config cb;
  cb.dtype = DType::bf16;
  const Shapes sb = shapes_of(problem_of(cb));
  TestTensor qb = make(DType::bf16, sb.q, 4), kb = make(DType::bf16, sb.k, 4),
             vb = make(DType::bf16, sb.v, 4);
  auto pb = ForwardPlan::select(cpu, desc_of(cb));
  BARACUDA_ASSERT_OK(pb);
  ForwardArguments ab{qb.cview(), kb.cview(), vb.cview(), y.view(), lse.view(), {}, {}};
  ab.v_descale = sc.cview();
  y.poison();
  const auto yb = y.bytes();
  EXPECT_TRUE(fails_with(pb->run(cpu, Workspace::none(), ab), ErrorKind::invalid_problem,
                         {"attention_forward: v_descale given but dtype=bf16"}));
  EXPECT_TRUE(harness::bytes_equal(yb, y.bytes(), "y"));
}

// The family's own forward pick on a device: its highest-priority bespoke sm_80-class entry that
// fits (cuDNN, also sm_80-class and ranked by its own table, is not one of them).
template <class Op = ForwardOp>
std::string family_pick(const Config& c, const DeviceCaps& caps) {
  const Problem p = problem_of(c);
  const Kernel<Op>* best = nullptr;
  for (const auto& k : KernelTable<Op>::instance().all()) {
    if (k.sku.element != c.dtype || k.sku.arch != Arch::sm80 ||
        k.sku.backend != Backend::bespoke_cuda)
      continue;
    if (k.fits && !k.fits(p, caps)) continue;
    if (!best || k.priority > best->priority) best = &k;
  }
  return best ? std::string(best->sku.name) : "";
}
// The parts the registry tests pick for: sm_80 (A100, 163 KB a block), sm_89 (99 KB), sm_90
// (H100, 227 KB).
DeviceCaps part_caps(int sm) {
  DeviceCaps c;
  c.device = 0, c.sm = sm;
  c.sm_count = sm == 80 ? 108 : sm == 89 ? 58 : 132;
  c.smem_per_block_optin = (sm == 80 ? 163 : sm == 89 ? 99 : 227) * 1024;
  c.name = sm == 80   ? "sm_80-class, 163 KB"
           : sm == 89 ? "sm_89-class, 99 KB"
                      : "sm_90-class, 227 KB";
  return c;
}
Config bf16_config(int64_t d, int64_t l, Mask m) {
  Config c;
  c.dtype = DType::bf16, c.b = 1, c.hq = c.hk = 16, c.lq = c.lk = l, c.dk = c.dv = d;
  c.mask = m;
  return c;
}

// The family's forward default per shape, from its table alone (priority among the bespoke
// sm_80-class entries that fit; no GPU needed, only a build with CUDA kernels): m32s where it
// measured fastest (launch.cuh, fits_m32s_default), m32s_n128m at d64 (fits_n128m_default), m16
// for few rows and short banded problems where m32s_n128m does not fit,
// decode for a few rows a head, the general kernel at head dim 256.
TEST(AttentionRegistry, FamilyForwardDefaultFollowsTheMeasuredShapes) {
  const DeviceCaps sm80 = part_caps(80);  // every forward shape's shared memory fits
  auto cfg = [](int64_t d, int64_t l, Mask m, int64_t hq = 16, int64_t hk = 16) {
    Config c = bf16_config(d, l, m);
    c.hq = hq, c.hk = hk;
    return c;
  };
  const std::string probe = family_pick(cfg(128, 4096, Mask::none()), sm80);
  if (probe.empty() || probe == "flash_fwd_simt")
    GTEST_SKIP() << "built without CUDA: no sm_80-class tensor-core kernel is registered";
  const Mask none = Mask::none(), causal = Mask::causal_top_left();
  const struct {
    Config c;
    const char* kernel;
  } cases[] = {
      {cfg(128, 4096, none), "flash_fwd_mma_m32s_straight_sm80"},
      {cfg(128, 512, none), "flash_fwd_mma_m32s_straight_sm80"},
      {cfg(96, 1000, none), "flash_fwd_mma_m32s_straight_sm80"},  // padded to 128
      {cfg(128, 2048, causal), "flash_fwd_mma_m32s_straight_sm80"},
      {cfg(128, 512, causal), "flash_fwd_mma_m32s_straight_sm80"},
      {cfg(128, 4096, Mask::sliding_window(255, 0)), "flash_fwd_mma_m32s_straight_sm80"},
      {cfg(64, 4096, none), "flash_fwd_mma_m32s_n128m_sm80"},
      {cfg(48, 700, none), "flash_fwd_mma_m32s_n128m_sm80"},  // padded to 64
      {cfg(64, 512, causal), "flash_fwd_mma_m32s_n128m_sm80"},
      {cfg(64, 2048, causal), "flash_fwd_mma_m32s_n128m_sm80"},
      {cfg(64, 8192, causal), "flash_fwd_mma_m32s_n128m_sm80"},
      {cfg(64, 16384, causal), "flash_fwd_mma_m32s_n128m_sm80"},
      {cfg(64, 4096, Mask::sliding_window(255, 0)), "flash_fwd_mma_m32s_n128m_sm80"},
      // 3 rows x 16 heads a K/V head: too many for decode, too few for m32s's 128-row CTA.
      {[&] {
         Config c = cfg(128, 300, none, 16, 1);
         c.lq = 3;
         return c;
       }(),
       "flash_fwd_mma_m16_sm80"},
      {[&] {
         Config c = cfg(128, 4096, none, 32, 8);
         c.lq = 1;
         return c;
       }(),
       "flash_decode_sm80"},
      {cfg(256, 4096, none), "flash_fwd_mma_sm80"},
  };
  for (const auto& tc : cases) EXPECT_EQ(family_pick(tc.c, sm80), tc.kernel) << tc.c.str();
}

// The fused backward's default per part (bespoke sm_80-class entries only): dQ by bulk reductions
// at a padded head dim of 128 under a band on sequences of up to 1024 rows from sm_90 on
// (fits_bulk_default), by red.global otherwise; 64 query rows a step at d64 where 128 do not fit
// (flash_bwd_fused_q64_sm80).
TEST(AttentionRegistry, FamilyBackwardDefaultFollowsTheMeasuredShapes) {
  const DeviceCaps sm80 = part_caps(80), sm89 = part_caps(89), sm90 = part_caps(90);
  const Mask none = Mask::none(), causal = Mask::causal_top_left();
  const std::string probe = family_pick<BackwardOp>(bf16_config(128, 4096, none), sm90);
  if (probe.empty() || probe == "flash_bwd_simt")
    GTEST_SKIP() << "built without CUDA: no sm_80-class tensor-core kernel is registered";
  const struct {
    Config c;
    const DeviceCaps& caps;
    const char* kernel;
  } cases[] = {
      {bf16_config(128, 4096, none), sm90, "flash_bwd_fused_sm80"},
      {bf16_config(128, 4096, causal), sm90, "flash_bwd_fused_sm80"},
      {bf16_config(128, 1024, causal), sm90, "flash_bwd_fused_bulk_sm80"},
      {bf16_config(128, 1025, causal), sm90, "flash_bwd_fused_sm80"},
      {bf16_config(96, 1000, causal), sm90, "flash_bwd_fused_bulk_sm80"},  // padded to 128
      {bf16_config(64, 4096, none), sm90, "flash_bwd_fused_sm80"},
      {bf16_config(128, 4096, none), sm80, "flash_bwd_fused_sm80"},
      {bf16_config(128, 512, causal), sm80, "flash_bwd_fused_sm80"},
      // d64's 128-row tiles (165 KB) exceed the 163 KB an A100 block may opt into, and the
      // 99 KB of an sm_89 one; 64 rows (99 KB) fit both.
      {bf16_config(64, 512, causal), sm80, "flash_bwd_fused_q64_sm80"},
      {bf16_config(64, 4096, none), sm89, "flash_bwd_fused_q64_sm80"},
      {bf16_config(128, 4096, none), sm89, "flash_bwd_mma_sm80"},
  };
  for (const auto& tc : cases)
    EXPECT_EQ(family_pick<BackwardOp>(tc.c, tc.caps), tc.kernel)
        << tc.caps.name << " " << tc.c.str();
}

// A forward entry fits only where the device grants its shared memory, so select passes over it
// on a smaller part instead of run failing: m16 at D = 128 (112 KB), m16w8 (128 KB), ovl (160 KB)
// and decode at D = 128 (100 KB) exceed the 99 KB an sm_86 / sm_89 block may opt into; m32s
// (97 KB) does not.
TEST(AttentionRegistry, ForwardKernelsFitOnlyWhereTheirSharedMemoryIsGranted) {
  const DeviceCaps small = part_caps(89), large = part_caps(90);
  // Whether any entry of that name fits.
  auto fits = [](const Config& c, const DeviceCaps& caps, std::string_view name) {
    const Problem p = problem_of(c);
    for (const auto& k : KernelTable<ForwardOp>::instance().all())
      if (k.sku.element == c.dtype && k.sku.name == name && (!k.fits || k.fits(p, caps)))
        return true;
    return false;
  };
  const Config d128 = bf16_config(128, 4096, Mask::none()),
               d64 = bf16_config(64, 4096, Mask::none());
  if (!fits(d128, large, "flash_fwd_mma_m16_sm80"))
    GTEST_SKIP() << "built without CUDA: no sm_80-class tensor-core kernel is registered";
  for (const char* name :
       {"flash_fwd_mma_m16_sm80", "flash_fwd_mma_m16w8_sm80", "flash_fwd_mma_ovl_sm80"}) {
    EXPECT_TRUE(fits(d128, large, name)) << name;
    EXPECT_FALSE(fits(d128, small, name)) << name;
  }
  for (const char* name : {"flash_fwd_mma_sm80", "flash_fwd_mma_m32_sm80",
                           "flash_fwd_mma_m32s_sm80", "flash_fwd_mma_m32s_straight_sm80"}) {
    EXPECT_TRUE(fits(d128, large, name)) << name;
    EXPECT_TRUE(fits(d128, small, name)) << name;
  }
  EXPECT_TRUE(fits(d64, small, "flash_fwd_mma_m16_sm80"));  // 56 KB at D = 64
  EXPECT_TRUE(fits(d64, large, "flash_fwd_mma_m32s_n128_sm80"));
  EXPECT_FALSE(fits(d64, small, "flash_fwd_mma_m32s_n128_sm80"));  // 112 KB
  // So an unmasked d64 problem gets m32s_n128m where it fits, m32s (67 KB) on the small part.
  const Config d64_long = bf16_config(64, 4096, Mask::none());
  EXPECT_EQ(family_pick(d64_long, large), "flash_fwd_mma_m32s_n128m_sm80");
  EXPECT_EQ(family_pick(d64_long, small), "flash_fwd_mma_m32s_sm80");
  // A long causal d64 problem: m32s_n128m (112 KB) where it fits, m16 or m32s on the small part.
  const Config causal_long = bf16_config(64, 4096, Mask::causal_top_left());
  EXPECT_TRUE(fits(causal_long, large, "flash_fwd_mma_m32s_n128m_sm80"));
  EXPECT_FALSE(fits(causal_long, small, "flash_fwd_mma_m32s_n128m_sm80"));
  EXPECT_EQ(family_pick(causal_long, large), "flash_fwd_mma_m32s_n128m_sm80");
  EXPECT_EQ(family_pick(causal_long, small), "flash_fwd_mma_m16_sm80");
  // A short causal d64 problem: m32s_n128m where it fits, m16 on the small part; d128 problems:
  // the straight m32s (97 KB) on both parts.
  const Config causal = bf16_config(64, 1024, Mask::causal_top_left());
  EXPECT_EQ(family_pick(causal, large), "flash_fwd_mma_m32s_n128m_sm80");
  EXPECT_EQ(family_pick(causal, small), "flash_fwd_mma_m16_sm80");
  EXPECT_EQ(family_pick(bf16_config(128, 1024, Mask::causal_top_left()), small),
            "flash_fwd_mma_m32s_straight_sm80");
  EXPECT_EQ(family_pick(d128, small), "flash_fwd_mma_m32s_straight_sm80");
  // Short queries at D = 128 (3 rows x 16 heads a K/V head) on the small part: m16's 112 KB is
  // not granted, so the general kernel runs.
  Config few = bf16_config(128, 300, Mask::none());
  few.hq = 16, few.hk = 1, few.lq = 3;
  EXPECT_EQ(family_pick(few, large), "flash_fwd_mma_m16_sm80");
  EXPECT_EQ(family_pick(few, small), "flash_fwd_mma_sm80");
  // Decode (one query row, GQA 4): its K / V ring needs 100 KB at D = 128, 68 KB at D = 64.
  Config decode = bf16_config(128, 4096, Mask::none());
  decode.hq = 32, decode.hk = 8, decode.lq = 1;
  // On sm_90 groups of 4 rows in one wave of splits take the fused decode (decode_fused_leads);
  // groups of 16 rows the split kernel.
  EXPECT_EQ(family_pick(decode, large), "flash_decode_fused_sm80");
  Config spec = decode;
  spec.lq = 4;
  EXPECT_EQ(family_pick(spec, large), "flash_decode_sm80");
  // 64-key pages: one sequence's 16 splits fit the device at once; 16 sequences' 512 CTAs (four
  // waves, decode_waves) do not, and there the fused kernel would hand its merges off.
  Config paged = decode;
  paged.page_size = 64, paged.pages = 64;
  EXPECT_EQ(family_pick(paged, large), "flash_decode_fused_sm80");
  paged.b = 16, paged.lk = 2048, paged.pages = 16 * 32;
  EXPECT_EQ(family_pick(paged, large), "flash_decode_sm80");
  EXPECT_NE(family_pick(decode, small), "flash_decode_sm80");
  EXPECT_NE(family_pick(decode, small), "flash_decode_fused_sm80");
  EXPECT_FALSE(fits(decode, small, "flash_decode_sm80"));
  EXPECT_FALSE(fits(decode, small, "flash_decode_fused_sm80"));
  decode.dk = decode.dv = 64;
  EXPECT_EQ(family_pick(decode, small), "flash_decode_sm80");  // the fused default is sm_90's
}

TEST(AttentionRules, MaskNames) {
  EXPECT_EQ(to_string(Mask::none()), "none");
  EXPECT_EQ(to_string(Mask::causal_top_left()), "causal_top_left");
  EXPECT_EQ(to_string(Mask::causal_bottom_right()), "causal_bottom_right");
  EXPECT_EQ(to_string(Mask::sliding_window(128, 0)), "window(128,0,bottom_right)");
  EXPECT_TRUE(Mask::causal_top_left().is_causal());
  EXPECT_TRUE(Mask::causal_bottom_right().is_causal());
  EXPECT_TRUE(Mask::sliding_window(-1, 0, Diagonal::top_left).is_causal());
  EXPECT_FALSE(Mask::none().is_causal());
  EXPECT_FALSE(Mask::sliding_window(128, 0).is_causal());
  EXPECT_FALSE(Mask::sliding_window(-1, 3).is_causal());
}

// Random argument mistakes (harness::fuzz_arguments) on every target, forward and backward, GQA
// with a causal mask, batched and varlen, f32 and bf16: refused naming the op with every output
// untouched, or accepted and run inside the real buffers (ASan in CI).
// Every view of a pass's arguments, for the fuzzer (the optional ones too: a view given where
// the descriptor has no use for it is a mistake of its own): the ones both passes name alike,
// then each one's own.
template <class Args>
std::vector<harness::ArgView> shared_views(Args& a) {
  return {{"q", a.q},
          {"k", a.k},
          {"v", a.v},
          {"y", a.y},
          {"lse", a.lse},
          {"cu_seqlens_q", a.cu_seqlens_q},
          {"cu_seqlens_k", a.cu_seqlens_k}};
}
std::vector<harness::ArgView> forward_views(ForwardArguments& a) {
  std::vector<harness::ArgView> v = shared_views(a);
  v.insert(v.end(), {{"seqused_k", a.seqused_k}, {"block_table", a.block_table}});
  return v;
}
std::vector<harness::ArgView> backward_views(BackwardArguments& a) {
  std::vector<harness::ArgView> v = shared_views(a);
  v.insert(v.end(), {{"dy", a.dy}, {"dq", a.dq}, {"dk", a.dk}, {"dv", a.dv}});
  return v;
}

TEST_P(AttentionTest, RandomArgumentMistakes) {
  const Target target = GetParam();
  BARACUDA_SKIP_IF_UNAVAILABLE(target);
  Rng rng;
  const Stream& stream = harness::stream_for(target);
  int accepted = 0;
  for (bool varlen : {false, true})
    for (DType dtype : {DType::f32, DType::bf16}) {
      Config c;
      c.dtype = dtype, c.b = 2, c.hq = 4, c.hk = 2, c.lq = 5, c.lk = 7;
      c.mask = Mask::causal_bottom_right();
      if (varlen) c.cu_q = {0, 2, 5}, c.cu_k = {0, 3, 7};
      SCOPED_TRACE(c.str());
      const Problem p = problem_of(c);
      const Shapes s = shapes_of(p);
      const int r = s.rank_qkv;
      // Padded views everywhere: on the GPU the default kernels (cuDNN, fa3) refuse their rows
      // (Kernel::check), so the plan's fallback (the family's kernels) takes them, mutated or not.
      const Lay lay = Lay::padded;
      auto mk = [&](const int64_t* d, int rank) {
        return random_tensor(dtype, d, rank, target, lay, rng);
      };
      auto q = mk(s.q, r), k = mk(s.k, r), v = mk(s.v, r), y = mk(s.y, r), dy = mk(s.y, r);
      auto dq = mk(s.q, r), dk = mk(s.k, r), dv = mk(s.v, r);
      auto lse = make(DType::f32, vec(s.lse, s.rank_lse), target, lay, rng);
      auto cq = varlen ? seqlens(c.cu_q, target) : nullptr;
      auto ck = varlen ? seqlens(c.cu_k, target) : nullptr;
      const ConstTensor cuq = cq ? cq->cview() : ConstTensor{};
      const ConstTensor cuk = ck ? ck->cview() : ConstTensor{};
      auto fwd = ForwardPlan::select(stream, desc_of(c));
      auto bwd = BackwardPlan::select(stream, desc_of(c));
      BARACUDA_ASSERT_OK(fwd);
      BARACUDA_ASSERT_OK(bwd);
      std::unique_ptr<Buffer> fhold, bhold;
      const Workspace fws = workspace_for(fwd->workspace_size(), target, fhold);
      const Workspace bws = workspace_for(bwd->workspace_size(), target, bhold);
      const ForwardArguments f{q->cview(),  k->cview(), v->cview(), y->view(),
                               lse->view(), cuq,        cuk};
      BARACUDA_ASSERT_OK(fwd->run(stream, fws, f));  // a real LSE for the backward's tries
      const BackwardArguments b{q->cview(),  k->cview(),   v->cview(), y->cview(),
                                dy->cview(), lse->cview(), dq->view(), dk->view(),
                                dv->view(),  cuq,          cuk};
      BARACUDA_ASSERT_OK(bwd->can_implement(b));
      auto lse_copy = make(DType::f32, vec(s.lse, s.rank_lse), target, Lay::bhld, rng);
      BackwardArguments bl = b;  // the backward reads a copy: the forward's tries poison lse
      lse_copy->set_values(lse->values());
      bl.lse = lse_copy->cview();
      EXPECT_TRUE(harness::fuzz_arguments(stream, *fwd, fws, f, forward_views, {y.get(), lse.get()},
                                          "attention_forward", rng, 300, &accepted));
      EXPECT_TRUE(harness::fuzz_arguments(stream, *bwd, bws, bl, backward_views,
                                          {dq.get(), dk.get(), dv.get()}, "attention_backward", rng,
                                          300, &accepted));
    }
  {  // the forward's cache arguments: paged K / V with per-sequence counts
    Config c;
    c.dtype = DType::bf16, c.b = 2, c.hq = 4, c.hk = 2, c.lq = 3, c.lk = 7;
    c.mask = Mask::causal_bottom_right(), c.used_k = {7, 2};
    page_config(c, 4, rng);
    SCOPED_TRACE(c.str());
    const Problem p = problem_of(c);
    const Shapes s = shapes_of(p);
    auto mk = [&](DType t, const int64_t* d, int rank) {
      return random_tensor(t, d, rank, target, Lay::padded, rng);
    };
    auto q = mk(c.dtype, s.q, 4), k = mk(c.dtype, s.k, 4), v = mk(c.dtype, s.v, 4);
    auto y = mk(c.dtype, s.y, 4), lse = mk(DType::f32, s.lse, 3);
    auto used = seqlens(c.used_k, target);
    auto table =
        std::make_unique<TestTensor>(TestTensor::make(DType::i32, vec(s.block_table, 2), target));
    table->set_values(std::vector<double>(c.table.begin(), c.table.end()));
    auto fwd = ForwardPlan::select(stream, desc_of(c));
    BARACUDA_ASSERT_OK(fwd);
    std::unique_ptr<Buffer> hold;
    const Workspace ws = workspace_for(fwd->workspace_size(), target, hold);
    ForwardArguments f{q->cview(), k->cview(), v->cview(), y->view(), lse->view(), {}, {}};
    f.seqused_k = used->cview(), f.block_table = table->cview();
    BARACUDA_ASSERT_OK(fwd->run(stream, ws, f));
    EXPECT_TRUE(harness::fuzz_arguments(stream, *fwd, ws, f, forward_views, {y.get(), lse.get()},
                                        "attention_forward", rng, 300, &accepted));
  }
  EXPECT_GT(accepted, 0);
}

// Every argument rule, on every target (host memory on the CUDA target is its own error).
TEST_P(AttentionTest, ArgumentErrorsNeverWrite) {
  const Target target = GetParam();
  BARACUDA_SKIP_IF_UNAVAILABLE(target);
  Rng rng;
  Config c;
  c.dtype = DType::f32;
  const Problem p = problem_of(c);
  const Shapes s = shapes_of(p);
  auto mk = [&](DType t, const int64_t* d, int r) {
    return random_tensor(t, d, r, target, Lay::bhld, rng);
  };
  auto q = mk(DType::f32, s.q, 4), k = mk(DType::f32, s.k, 4), v = mk(DType::f32, s.v, 4);
  auto y = mk(DType::f32, s.y, 4), lse = mk(DType::f32, s.lse, 3);
  auto q16 = mk(DType::f16, s.q, 4);
  const Stream& stream = harness::stream_for(target);
  auto plan = ForwardPlan::select(stream, desc_of(c));
  BARACUDA_ASSERT_OK(plan);
  const ForwardArguments good{q->cview(), k->cview(), v->cview(), y->view(), lse->view(), {}, {}};
  y->poison();
  const auto y_before = y->bytes();
  using K = ErrorKind;
  auto expect = [&](ForwardArguments a, K kind, std::initializer_list<std::string_view> n) {
    EXPECT_TRUE(fails_with(plan->can_implement(a), kind, n));
    EXPECT_TRUE(fails_with(plan->run(stream, Workspace::none(), a), kind, n));
  };
  ForwardArguments a = good;
  a.q = q16->cview();
  expect(a, K::invalid_problem, {"attention_forward: q: dtype f16, expected f32"});
  a = good;
  a.y.shape[2] = 4;
  expect(a, K::invalid_problem, {"attention_forward: y: shape[2]=4, expected 5"});
  a = good;
  a.k.shape[3] = 16;
  expect(a, K::invalid_problem, {"attention_forward: k: shape[3]=16, expected 32"});
  {  // every other element of a twice-as-wide buffer: legal extent, non-unit head-dim stride
    const int64_t wide[] = {s.k[0], s.k[1], s.k[2], 2 * s.k[3]};
    auto kw = mk(DType::f32, wide, 4);
    a = good;
    a.k = kw->cview();
    a.k.shape[3] = s.k[3];
    a.k.stride[3] = 2;
    expect(a, K::invalid_problem, {"attention_forward: k: stride[3]=2: the head-dim axis"});
  }
  a = good;
  a.y.stride[1] = 0;
  expect(a, K::invalid_problem, {"attention_forward: y: stride[1]=0 broadcasts"});
  a = good;
  a.lse.dtype = DType::f16;
  expect(a, K::invalid_problem, {"attention_forward: lse: dtype f16, expected f32"});
  a = good;
  a.y = q->view();
  a.y.shape = y->view().shape;
  a.y.stride = y->view().stride;
  expect(a, K::invalid_problem, {"attention_forward: y and q overlap"});
  a = good;
  a.v.buffer_bytes = 100;
  expect(a, K::buffer_too_small, {"attention_forward: v"});
  a = good;
  a.cu_seqlens_q = q->cview();
  expect(a, K::invalid_problem,
         {"cu_seqlens_q/cu_seqlens_k given but the descriptor is not varlen"});
  if (target == Target::cuda) {
    std::vector<float> host(1024);
    a = good;
    a.q.data = host.data();
    a.q.buffer_bytes = 4096;
    expect(a, K::wrong_device, {"attention_forward: q"});
  }
  EXPECT_TRUE(harness::untouched_outside(y_before, y->bytes(),
                                         std::vector<uint8_t>(y_before.size() * 8, 0), "y"));

  // Varlen needs its offsets; the backward checks its own outputs.
  Config vc = c;
  vc.cu_q = {0, 5}, vc.cu_k = {0, 7};
  auto vplan = ForwardPlan::select(stream, desc_of(vc));
  BARACUDA_ASSERT_OK(vplan);
  const Shapes vs = shapes_of(problem_of(vc));
  auto vq = mk(DType::f32, vs.q, 3), vk = mk(DType::f32, vs.k, 3), vv = mk(DType::f32, vs.v, 3);
  auto vy = mk(DType::f32, vs.y, 3), vl = mk(DType::f32, vs.lse, 2);
  EXPECT_TRUE(fails_with(
      vplan->can_implement({vq->cview(), vk->cview(), vv->cview(), vy->view(), vl->view(), {}, {}}),
      K::invalid_problem, {"attention_forward: cu_seqlens_q: rank 0"}));

  // seqused_k: its counts only with the descriptor's flag, and then an i32 [B] on the device.
  a = good;
  a.seqused_k = vq->cview();
  expect(a, K::invalid_problem,
         {"attention_forward: seqused_k given but the descriptor's seqused_k is false"});
  Config uc = c;
  uc.used_k = {3};
  auto uplan = ForwardPlan::select(stream, desc_of(uc));
  BARACUDA_ASSERT_OK(uplan);
  auto used = seqlens({3}, target), used2 = seqlens({3, 4}, target);
  const int64_t one[] = {1};
  auto used_f32 = mk(DType::f32, one, 1);
  ForwardArguments u = good;
  u.y = y->view();
  // A rule of another plan (descriptor) than `plan`: refused by can_implement and by run.
  auto expect_on = [&](const ForwardPlan& pl, const ForwardArguments& x, K kind,
                       std::initializer_list<std::string_view> n) {
    EXPECT_TRUE(fails_with(pl.can_implement(x), kind, n));
    EXPECT_TRUE(fails_with(pl.run(stream, Workspace::none(), x), kind, n));
  };
  expect_on(*uplan, u, K::invalid_problem, {"attention_forward: seqused_k: rank 0"});
  u.seqused_k = used_f32->cview();
  expect_on(*uplan, u, K::invalid_problem,
            {"attention_forward: seqused_k: dtype f32, expected i32"});
  u.seqused_k = used2->cview();
  expect_on(*uplan, u, K::invalid_problem,
            {"attention_forward: seqused_k: shape[0]=2, expected 1"});
  u.seqused_k = used->cview();
  BARACUDA_EXPECT_OK(uplan->can_implement(u));
  if (target == Target::cuda) {
    std::vector<int32_t> host_used = {3};
    u.seqused_k =
        make_tensor(static_cast<const void*>(host_used.data()), DType::i32, one, Location::host());
    expect_on(*uplan, u, K::wrong_device, {"attention_forward: seqused_k"});
  }
  EXPECT_TRUE(harness::untouched_outside(y_before, y->bytes(),
                                         std::vector<uint8_t>(y_before.size() * 8, 0), "y"));

  // Paged K / V: the block table only with page_size, then an i32 [B, ceil(Lk / page_size)].
  a = good;
  a.block_table = used->cview();
  expect(a, K::invalid_problem,
         {"attention_forward: block_table given but the descriptor's page_size is 0"});
  Config pc = c;
  pc.page_size = 4, pc.pages = 3;  // Lk 7: two pages a sequence
  const Shapes pshape = shapes_of(problem_of(pc));
  auto pplan = ForwardPlan::select(stream, desc_of(pc));
  BARACUDA_ASSERT_OK(pplan);
  auto pk = mk(DType::f32, pshape.k, 4), pv = mk(DType::f32, pshape.v, 4);
  auto table = std::make_unique<TestTensor>(TestTensor::make(DType::i32, {1, 2}, target));
  table->set_values({2, 0});
  auto table3 = std::make_unique<TestTensor>(TestTensor::make(DType::i32, {1, 3}, target));
  ForwardArguments pa{q->cview(), pk->cview(), pv->cview(), y->view(), lse->view(), {}, {}};
  expect_on(*pplan, pa, K::invalid_problem, {"attention_forward: block_table: rank 0"});
  pa.block_table = table3->cview();
  expect_on(*pplan, pa, K::invalid_problem,
            {"attention_forward: block_table: shape[1]=3, expected 2"});
  pa.block_table = table->cview();
  pa.k = k->cview();  // a padded cache where the pool belongs
  expect_on(*pplan, pa, K::invalid_problem, {"attention_forward: k: shape[0]=1, expected 3"});
  pa.k = pk->cview();
  BARACUDA_EXPECT_OK(pplan->can_implement(pa));
  if (target == Target::cuda) {
    std::vector<int32_t> host_table = {2, 0};
    const int64_t t12[] = {1, 2};
    pa.block_table =
        make_tensor(static_cast<const void*>(host_table.data()), DType::i32, t12, Location::host());
    expect_on(*pplan, pa, K::wrong_device, {"attention_forward: block_table"});
  }
  EXPECT_TRUE(harness::untouched_outside(y_before, y->bytes(),
                                         std::vector<uint8_t>(y_before.size() * 8, 0), "y"));

  auto bplan = BackwardPlan::select(stream, desc_of(c));
  BARACUDA_ASSERT_OK(bplan);
  auto dq = mk(DType::f32, s.q, 4), dk = mk(DType::f32, s.k, 4), dv = mk(DType::f32, s.v, 4);
  BackwardArguments b{q->cview(), k->cview(), v->cview(), y->cview(), y->cview(), lse->cview(),
                      dq->view(), dk->view(), dv->view(), {},         {}};
  BARACUDA_EXPECT_OK(bplan->can_implement(b));
  BackwardArguments bb = b;
  bb.dv = dk->view();
  EXPECT_TRUE(fails_with(bplan->can_implement(bb), K::invalid_problem,
                         {"attention_backward: dk and dv overlap"}));
  bb = b;
  bb.dq = q->view();
  EXPECT_TRUE(fails_with(bplan->can_implement(bb), K::invalid_problem,
                         {"attention_backward: dq and q overlap"}));
  bb = b;
  bb.dy.dtype = DType::f64;
  EXPECT_TRUE(fails_with(bplan->can_implement(bb), K::invalid_problem,
                         {"attention_backward: dy: dtype f64, expected f32"}));
}

// Offsets the descriptor cannot see are checked by the reference before it writes anything.
TEST(AttentionRules, ReferenceRejectsBadSeqlens) {
  Rng rng;
  Config c;
  c.cu_q = {0, 3, 5}, c.cu_k = {0, 7, 9};
  c.b = 2;
  const Shapes s = shapes_of(problem_of(c));
  auto mk = [&](DType t, const int64_t* d, int r) {
    return random_tensor(t, d, r, Target::cpu, Lay::bhld, rng);
  };
  auto q = mk(DType::f32, s.q, 3), k = mk(DType::f32, s.k, 3), v = mk(DType::f32, s.v, 3);
  auto y = mk(DType::f32, s.y, 3), lse = mk(DType::f32, s.lse, 2);
  std::vector<int32_t> cq = {0, 4, 3}, ck = {0, 7, 9};
  const int64_t n[] = {3};
  auto plan = ForwardPlan::select(Stream::cpu(), desc_of(c));
  BARACUDA_ASSERT_OK(plan);
  y->poison();
  const auto before = y->bytes();
  ForwardArguments a{q->cview(),
                     k->cview(),
                     v->cview(),
                     y->view(),
                     lse->view(),
                     make_tensor(static_cast<const void*>(cq.data()), DType::i32, n),
                     make_tensor(static_cast<const void*>(ck.data()), DType::i32, n)};
  EXPECT_TRUE(fails_with(plan->run(Stream::cpu(), Workspace::none(), a), ErrorKind::invalid_problem,
                         {"attention_forward: cu_seqlens_q[1..2]=(4,3): needs 0 <= start <= end"}));
  cq = {0, 3, 5}, ck = {0, 8, 9};  // length 8 > max length 7
  EXPECT_TRUE(fails_with(plan->run(Stream::cpu(), Workspace::none(), a), ErrorKind::invalid_problem,
                         {"cu_seqlens_k[0..1]=(0,8)", "max length (7)"}));
  EXPECT_TRUE(harness::bytes_equal(before, y->bytes(), "y untouched"));
  // seqused_k counts past the sequence's keys (varlen: its packed range; padded: Lk) or negative.
  ck = {0, 7, 9};
  c.used_k = {7, 2};
  auto uplan = ForwardPlan::select(Stream::cpu(), desc_of(c));
  BARACUDA_ASSERT_OK(uplan);
  std::vector<int32_t> used = {7, 3};
  const int64_t nb[] = {2};
  a.seqused_k = make_tensor(static_cast<const void*>(used.data()), DType::i32, nb);
  EXPECT_TRUE(
      fails_with(uplan->run(Stream::cpu(), Workspace::none(), a), ErrorKind::invalid_problem,
                 {"attention_forward: seqused_k[1]=3: needs 0 <= count <= the sequence's 2 keys"}));
  used = {-1, 2};
  EXPECT_TRUE(fails_with(uplan->run(Stream::cpu(), Workspace::none(), a),
                         ErrorKind::invalid_problem, {"seqused_k[0]=-1"}));
  used = {7, 2};
  BARACUDA_EXPECT_OK(uplan->run(Stream::cpu(), Workspace::none(), a));
  c.cu_q.clear(), c.cu_k.clear(), c.used_k = {8};
  c.b = 1, c.lq = 5, c.lk = 7;
  const Shapes ps = shapes_of(problem_of(c));
  auto pq = mk(DType::f32, ps.q, 4), pk = mk(DType::f32, ps.k, 4), pv = mk(DType::f32, ps.v, 4);
  auto py = mk(DType::f32, ps.y, 4), pl = mk(DType::f32, ps.lse, 3);
  auto pplan = ForwardPlan::select(Stream::cpu(), desc_of(c));
  BARACUDA_ASSERT_OK(pplan);
  py->poison();
  const auto pbefore = py->bytes();
  used = {8};
  ForwardArguments pa{pq->cview(), pk->cview(), pv->cview(), py->view(), pl->view(), {}, {}};
  const int64_t n1[] = {1};
  pa.seqused_k = make_tensor(static_cast<const void*>(used.data()), DType::i32, n1);
  EXPECT_TRUE(fails_with(pplan->run(Stream::cpu(), Workspace::none(), pa),
                         ErrorKind::invalid_problem,
                         {"seqused_k[0]=8: needs 0 <= count <= the sequence's 7 keys"}));
  EXPECT_TRUE(harness::bytes_equal(pbefore, py->bytes(), "y untouched"));
  // Paged K / V: every page a sequence reads must be in the pools (only those it reads: a count
  // of 4 keys reads one 4-key page, so the second entry may hold anything).
  c.used_k.clear(), c.page_size = 4, c.pages = 2;
  const Shapes gs = shapes_of(problem_of(c));
  auto gk = mk(DType::f32, gs.k, 4), gv = mk(DType::f32, gs.v, 4);
  auto gplan = ForwardPlan::select(Stream::cpu(), desc_of(c));
  BARACUDA_ASSERT_OK(gplan);
  std::vector<int32_t> pages = {1, 2};
  const int64_t t12[] = {1, 2};
  ForwardArguments ga{pq->cview(), gk->cview(), gv->cview(), py->view(), pl->view(), {}, {}};
  ga.block_table = make_tensor(static_cast<const void*>(pages.data()), DType::i32, t12);
  EXPECT_TRUE(fails_with(gplan->run(Stream::cpu(), Workspace::none(), ga),
                         ErrorKind::invalid_problem,
                         {"attention_forward: block_table[0][1]=2: needs 0 <= page < pages (2)"}));
  pages = {-1, 0};
  EXPECT_TRUE(fails_with(gplan->run(Stream::cpu(), Workspace::none(), ga),
                         ErrorKind::invalid_problem, {"block_table[0][0]=-1"}));
  EXPECT_TRUE(harness::bytes_equal(pbefore, py->bytes(), "y untouched"));
  c.used_k = {4};
  auto cplan = ForwardPlan::select(Stream::cpu(), desc_of(c));
  BARACUDA_ASSERT_OK(cplan);
  pages = {1, 99};
  used = {4};
  ga.seqused_k = make_tensor(static_cast<const void*>(used.data()), DType::i32, n1);
  BARACUDA_EXPECT_OK(cplan->run(Stream::cpu(), Workspace::none(), ga));
}

// ---- The reference against hand-computed values
// ----------------------------------------------------
// The tensor-core kernels address their ldmatrix loads through swz_bases / swz_addr (a lane base
// per tile and a compile-time offset) instead of swz itself: the two must name the same byte for
// every lane, every fragment pattern the kernels use, every k-step / n-tile offset and head dim.
template <int D>
int swz_mismatches() {
  using kernels::swz;
  using kernels::swz_addr;
  using kernels::swz_bases;
  constexpr uint32_t kTile = 3 * 4096;  // any 128-byte aligned tile base
  int bad = 0;
  for (int lane = 0; lane < 32; ++lane) {
    const int mi = lane / 8;
    // (row within the 16-row group, chunk bit): A operands, B operands, transposed B operands.
    const int pattern[3][2] = {{lane % 16, lane / 16},
                               {(lane % 8) + (mi / 2) * 8, mi % 2},
                               {(lane % 8) + (mi % 2) * 8, mi / 2}};
    for (const auto& pc : pattern) {
      const kernels::SwzBases b = swz_bases<uint16_t, D>(kTile, pc[0], pc[1]);
      for (int r0 = 0; r0 < 128; r0 += 16)
        for (int c0 = 0; c0 < D / 8; c0 += 2) {
          const uint32_t want =
              kTile + static_cast<uint32_t>(swz<D>(r0 + pc[0], 8 * (c0 + pc[1])) * 2);
          if (swz_addr<uint16_t, D>(b, r0, c0) != want) ++bad;
        }
    }
  }
  return bad;
}
// Which problems take the tail: unbanded padded batches only (a band or varlen makes the key
// blocks' work differ), with group x query tiles iterations a block.
TEST(AttentionTail, OnlyUnbandedPaddedProblemsTakeIt) {
  Problem pr;
  pr.desc.dtype = DType::bf16, pr.desc.batch = 4, pr.desc.heads_q = 64, pr.desc.heads_kv = 32;
  pr.desc.len_q = 4000, pr.desc.len_k = 4096, pr.desc.head_dim_qk = pr.desc.head_dim_v = 64;
  pr.group = 2;
  const detail::TailSplit t = detail::bwd_tail_split(pr, 128, 132);
  EXPECT_EQ(t.n_dp + t.units, 4 * 32 * 32);
  EXPECT_GT(t.ctas, 0);
  EXPECT_EQ(t.n_it, 2 * 32);  // 4000 rows: 32 tiles of 128
  EXPECT_EQ(detail::bwd_tail_split(pr, 64, 132).n_it, 2 * 63);
  for (const Mask& m : {Mask::causal_top_left(), Mask::causal_bottom_right(),
                        Mask::sliding_window(100, 30), Mask::sliding_window(-1, 5)}) {
    Problem banded = pr;
    banded.desc.mask = m;
    const detail::TailSplit b = detail::bwd_tail_split(banded, 128, 132);
    EXPECT_EQ(b.ctas, 0) << m.left << " " << m.right;
    EXPECT_EQ(b.n_dp, 4 * 32 * 32);
  }
  Problem packed = pr;
  packed.desc.varlen = true;
  EXPECT_EQ(detail::bwd_tail_split(packed, 128, 132).ctas, 0);
  EXPECT_EQ(detail::bwd_tail_split(pr, 128, 128).ctas, 0);  // 4096 blocks: 32 whole waves of 128
}

// The page sizes a key tile reads through one 32-entry register window: whole tiles, or 2..32
// pages a tile.
TEST(AttentionPageWindow, ServesTheSizesThatTileEvenly) {
  for (int ps : {2, 4, 8, 16, 32, 64, 128, 192, 256, 1024})
    EXPECT_TRUE(detail::page_window_serves(ps, 64)) << ps;
  for (int ps : {0, 1, 3, 7, 24, 48, 96, 100})
    EXPECT_FALSE(detail::page_window_serves(ps, 64)) << ps;
  EXPECT_FALSE(detail::page_window_serves(2, 128));  // 64 entries a tile: two windows
  EXPECT_TRUE(detail::page_window_serves(4, 128));
  EXPECT_TRUE(detail::page_window_serves(8, 32));
  EXPECT_TRUE(detail::page_window_serves(96, 32));
}

// Paged caches: four waves where the groups fill more than half the SMs (the measured b16 batch),
// the kernel's own below that (the measured b1 cache) and for padded caches always.
TEST(AttentionDecodeSplits, PagedBatchesTakeFourWaves) {
  EXPECT_EQ(detail::decode_waves(1, true, 128, 132), 4);
  EXPECT_EQ(detail::decode_waves(1, true, 8, 132), 1);
  EXPECT_EQ(detail::decode_waves(1, true, 66, 132), 1);
  EXPECT_EQ(detail::decode_waves(1, true, 67, 132), 4);
  EXPECT_EQ(detail::decode_waves(1, false, 128, 132), 1);
  EXPECT_EQ(detail::decode_waves(4, false, 8, 132), 4);
  EXPECT_EQ(detail::decode_waves(4, true, 128, 132), 4);
  // What the rule plans for the bench's rows (32 and 512 tiles, 4-tile minimum).
  EXPECT_EQ(detail::decode_split_count(128, 32, 132 * detail::decode_waves(1, true, 128, 132),
                                       false, 2, 4),
            4);
  EXPECT_EQ(
      detail::decode_split_count(8, 512, 132 * detail::decode_waves(1, true, 8, 132), false, 2, 4),
      16);
}

// The decode's split rule on the shapes it was measured on (132 SMs) and its invariants on random
// ones: one split a slot, the slot filling only where asked (d64) and only where the groups leave
// more than an eighth of the slots idle, at least min_tiles tiles a split, at most 256, none empty.
TEST(AttentionDecodeSplits, FollowTheMeasuredRule) {
  struct Case {
    int64_t groups, tiles, slots;
    bool fill;
    int64_t per_sm, min_tiles;
    int splits;
  };
  const Case cases[] = {
      {8, 512, 132, false, 2, 4, 16},   // the bench's d128 row: 16 splits of 32 tiles on 128 SMs
      {8, 512, 132, true, 3, 4, 16},    // d64: 128 of 132 SMs busy, no filling
      {96, 32, 132, false, 2, 4, 1},    // b12 d128 Lk 2048: one split, no combine
      {96, 64, 132, true, 3, 4, 4},     // b12 d64 Lk 4096: three CTAs an SM
      {48, 64, 132, false, 2, 4, 2},    // b6 d128 Lk 4096
      {48, 64, 132, true, 3, 4, 8},     // b6 d64: 396 / 48
      {8, 64, 528, false, 2, 4, 16},    // w4 at Lk 4096: bounded by 4 tiles a split
      {8, 32, 132, false, 2, 2, 16},    // the fused entry's 2-tile minimum at Lk 2048
      {1, 513, 132, false, 1, 4, 103},  // 128 wanted, 5 tiles each: the last would be empty
      {8, 7, 132, false, 2, 4, 1},      // under 8 tiles: never split
      {100, 64, 132, true, 3, 4, 3},    // 32 idle SMs (more than an eighth): filled
      {120, 64, 132, true, 3, 4, 1},    // 12 idle SMs: one split each
      {0, 512, 132, false, 2, 4, 1},      {8, 512, 0, false, 2, 4, 1},
      {1, 100000, 132, false, 1, 4, 132}, {1, 100000, 528, false, 1, 4, 256}};
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::Message() << c.groups << " groups of " << c.tiles << " tiles, "
                                      << c.slots << " slots, fill " << c.fill);
    EXPECT_EQ(detail::decode_split_count(c.groups, c.tiles, c.slots, c.fill, c.per_sm, c.min_tiles),
              c.splits);
  }
  Rng rng;
  for (int i = 0; i < 2000; ++i) {
    const int64_t groups = rng.integer(1, 600), tiles = rng.integer(8, 5000);
    const int64_t slots = 132 * rng.integer(1, 4), per_sm = rng.integer(1, 4);
    const int64_t min_tiles = rng.integer(2, 4);
    const bool fill = rng.coin();
    const int n = detail::decode_split_count(groups, tiles, slots, fill, per_sm, min_tiles);
    SCOPED_TRACE(::testing::Message() << groups << " groups of " << tiles << " tiles, " << slots
                                      << " slots, fill " << fill << " x" << per_sm << ": " << n);
    ASSERT_GE(n, 1);
    ASSERT_LE(n, 256);
    if (n == 1) continue;
    const int64_t per = (tiles + n - 1) / n;
    EXPECT_LT((n - 1) * per, tiles);  // the last split has tiles
    EXPECT_GE(tiles / n, min_tiles);
    const bool idle = slots / groups * groups < slots - slots / 8;
    EXPECT_LE(n * groups, fill && idle ? slots * per_sm : slots);
  }
}

// The one-pass backward's stream-K tail: tail CTAs' runs cover every iteration of the tail's units
// exactly once, in order, each at least two long, and the whole units fill whole waves before it.
TEST(AttentionTail, RunsCoverTheTailOnce) {
  struct Case {
    int64_t blocks, n_it, slots;
    bool tail;
  };
  const Case cases[] = {{4096, 32, 132, true}, {2048, 64, 132, true}, {264, 8, 132, false},
                        {40, 10, 132, true},   {40, 6, 132, false},   {1, 300, 132, true},
                        {133, 1, 132, false},  {133, 2, 132, true},   {0, 5, 132, false},
                        {500, 7, 264, true},   {7, 0, 132, false},    {100, 3, 0, false}};
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::Message() << c.blocks << " units of " << c.n_it << " on " << c.slots);
    const detail::TailSplit t = detail::tail_split(c.blocks, c.n_it, c.slots);
    EXPECT_EQ(t.ctas > 0, c.tail);
    if (t.ctas == 0) {
      EXPECT_EQ(t.n_dp, c.blocks);
      continue;
    }
    EXPECT_EQ(t.ctas, c.slots);
    EXPECT_EQ(t.n_dp + t.units, c.blocks);
    EXPECT_EQ(t.n_dp % c.slots, 0);
    EXPECT_GT(t.units, c.blocks >= c.slots ? c.slots : 0);  // the last full wave joins the tail
    EXPECT_LT(t.units, 2 * c.slots);
    std::vector<int> seen(static_cast<size_t>(t.units * t.n_it), 0);
    int64_t next = 0;
    for (int64_t cta = 0; cta < t.ctas; ++cta) {
      int64_t begin = -1, end = -1;
      detail::tail_run(t, cta, &begin, &end);
      EXPECT_EQ(begin, next);
      EXPECT_GE(end - begin, 2);
      // Its segments: one unit each, end to end over the run.
      int64_t at = begin, k = 0, unit, lo, hi;
      for (; detail::tail_segment(t, t.n_dp + cta, k, &unit, &lo, &hi); ++k) {
        EXPECT_EQ((unit - t.n_dp) * t.n_it + lo, at);
        EXPECT_TRUE(lo >= 0 && lo < hi && hi <= t.n_it) << lo << ".." << hi;
        for (int64_t i = lo; i < hi; ++i) ++seen[static_cast<size_t>((unit - t.n_dp) * t.n_it + i)];
        at += hi - lo;
      }
      EXPECT_EQ(at, end);
      EXPECT_LE(k, (end - begin + t.n_it - 1) / t.n_it + 1);
      next = end;
    }
    int64_t unit, lo, hi;  // a whole unit below n_dp, one segment
    if (t.n_dp > 0) {
      EXPECT_TRUE(detail::tail_segment(t, t.n_dp - 1, 0, &unit, &lo, &hi));
      EXPECT_EQ(unit, t.n_dp - 1);
      EXPECT_EQ(hi - lo, t.n_it);
      EXPECT_FALSE(detail::tail_segment(t, t.n_dp - 1, 1, &unit, &lo, &hi));
    }
    EXPECT_EQ(next, t.units * t.n_it);
    EXPECT_TRUE(std::all_of(seen.begin(), seen.end(), [](int n) { return n == 1; }));
  }
}

// The one-pass backward's full-tile interval (detail::full_tile_rows) against its definition:
// every row of the tile inside Lq, each seeing all keys of the block (visible_keys per row), over
// random lengths, bands of both alignments, key blocks and tile heights.
TEST(AttentionBackwardTiles, FullTileRowsMatchEveryRowsBounds) {
  Rng rng;
  int64_t full = 0, partial = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    const int lq = static_cast<int>(rng.integer(1, 700)),
              lk = static_cast<int>(rng.integer(1, 700));
    const int keys = rng.coin() ? 128 : 16 * static_cast<int>(rng.integer(1, 8));
    const int bq = rng.coin() ? 64 : 128;
    detail::Band b;
    b.left = rng.integer(0, 3) == 0 ? -1 : rng.integer(0, 400);
    b.right = rng.integer(0, 3) == 0 ? -1 : rng.integer(0, 400);
    b.bottom_right = rng.coin();
    const int k0 = keys * static_cast<int>(rng.integer(0, (lk + keys - 1) / keys));
    int64_t lo, hi;
    detail::full_tile_rows(b, lq, lk, k0, keys, bq, &lo, &hi);
    for (int i0 = 0; i0 < lq; i0 += bq) {
      bool every = i0 + bq <= lq;
      for (int i = i0; every && i < i0 + bq; ++i) {
        int64_t vlo, vhi;
        detail::visible_keys(b, i, lq, lk, &vlo, &vhi);
        every = vlo <= k0 && vhi >= k0 + keys;
      }
      EXPECT_EQ(i0 >= lo && i0 <= hi, every)
          << "lq " << lq << " lk " << lk << " keys " << keys << " bq " << bq << " band (" << b.left
          << ", " << b.right << (b.bottom_right ? ", bottom-right" : ", top-left") << ") k0 " << k0
          << " i0 " << i0 << " interval [" << lo << ", " << hi << "]";
      ++(every ? full : partial);
    }
  }
  // Both outcomes occur often enough for the comparison to mean something.
  EXPECT_GT(full, 1000);
  EXPECT_GT(partial, 1000);
}

TEST(AttentionSwizzle, LdmatrixBasesAddressTheSwizzledBytes) {
  EXPECT_EQ(swz_mismatches<64>(), 0);
  EXPECT_EQ(swz_mismatches<128>(), 0);
  EXPECT_EQ(swz_mismatches<256>(), 0);
}

TEST(AttentionReference, HandComputedCases) {
  // One key: y = v, lse = scale * q.k.
  Config c;
  c.dtype = DType::f64, c.b = 1, c.hq = 1, c.hk = 1, c.lq = 1, c.lk = 1, c.dk = 2, c.dv = 3;
  Oracle o(c);
  auto [y, lse] = o.forward({1, 2}, {3, -1}, {0.5, -2, 7});
  EXPECT_EQ(y, (std::vector<double>{0.5, -2, 7}));
  EXPECT_DOUBLE_EQ(lse[0], 1.0 / std::sqrt(2.0));
  // Zero queries: uniform weights over the visible keys; top-left and bottom-right differ.
  c.lq = 2, c.lk = 3, c.dk = 1, c.dv = 1;
  c.mask = Mask::causal_top_left();
  Oracle tl(c);
  const std::vector<double> k3 = {1, 2, 3}, v3 = {10, 20, 60};
  auto [ytl, ltl] = tl.forward({0, 0}, k3, v3);
  EXPECT_EQ(ytl, (std::vector<double>{10, 15}));
  EXPECT_DOUBLE_EQ(ltl[1], std::log(2.0));
  c.mask = Mask::causal_bottom_right();
  Oracle br(c);
  auto [ybr, lbr] = br.forward({0, 0}, k3, v3);
  EXPECT_EQ(ybr, (std::vector<double>{15, 30}));
  EXPECT_DOUBLE_EQ(lbr[1], std::log(3.0));
  // Bottom-right with Lq > Lk: the first rows see no key: output 0, LSE -inf.
  c.lq = 3, c.lk = 1;
  Oracle empty(c);
  auto [ye, le] = empty.forward({1, 1, 1}, {2}, {5});
  EXPECT_EQ(ye, (std::vector<double>{0, 0, 5}));
  EXPECT_EQ(le[0], -kInf);
  EXPECT_EQ(le[1], -kInf);
  EXPECT_DOUBLE_EQ(le[2], 2.0);
  // Soft-capping: weights follow cap * tanh(s / cap).
  c = Config{};
  c.dtype = DType::f64, c.b = 1, c.hq = 1, c.hk = 1, c.lq = 1, c.lk = 2, c.dk = 1, c.dv = 1;
  c.scale = 1.0, c.softcap = 2.0;
  Oracle cap(c);
  auto [yc, lc] = cap.forward({3}, {1, -1}, {1, 0});
  const double s0 = 2 * std::tanh(1.5), s1 = 2 * std::tanh(-1.5);
  EXPECT_NEAR(yc[0], std::exp(s0) / (std::exp(s0) + std::exp(s1)), 1e-15);
  EXPECT_NEAR(lc[0], std::log(std::exp(s0) + std::exp(s1)), 1e-15);
  // A sliding window of (1, 0): each row sees itself and one key before.
  c = Config{};
  c.dtype = DType::f64, c.b = 1, c.hq = 1, c.hk = 1, c.lq = 3, c.lk = 3, c.dk = 1, c.dv = 1;
  c.mask = Mask::sliding_window(1, 0);
  Oracle w(c);
  auto [yw, lw] = w.forward({0, 0, 0}, {1, 1, 1}, {2, 4, 8});
  EXPECT_EQ(yw, (std::vector<double>{2, 3, 6}));
}

// The CPU backend spreads its heads over threads (forward: (sequence, query head); backward:
// (sequence, K / V head)), each whole on one thread: one thread and seven give the same bits, and
// the forward equals the row-block reference run head by head. A problem above the backend's
// single-thread bound (~4M multiply-adds), GQA 3, varlen, causal bottom-right, a soft-cap.
TEST(AttentionReference, CpuBackendBitsDoNotDependOnItsThreads) {
  Rng rng;
  Config c;
  c.dtype = DType::f64, c.b = 3, c.hq = 6, c.hk = 2, c.lq = 90, c.lk = 200, c.dk = 48, c.dv = 40;
  c.mask = Mask::causal_bottom_right(), c.softcap = 20;
  c.cu_q = {0, 90, 131, 200}, c.cu_k = {0, 200, 317, 500};
  Oracle o(c);
  std::vector<double> q(harness::numel_of(vec(o.s.q, o.s.rank_qkv))),
      k(harness::numel_of(vec(o.s.k, o.s.rank_qkv))),
      v(harness::numel_of(vec(o.s.v, o.s.rank_qkv))),
      dy(harness::numel_of(vec(o.s.y, o.s.rank_qkv)));
  for (auto* x : {&q, &k, &v, &dy})
    for (double& e : *x) e = rng.uniform(-1, 1);
  struct Run {
    std::pair<std::vector<double>, std::vector<double>> fwd;
    Oracle::Grads grads;
  };
  auto run_on = [&](int64_t threads) {
    set_cpu_threads(threads);
    Run r{o.forward(q, k, v), {}};
    r.grads = o.backward(q, k, v, r.fwd.first, dy, r.fwd.second);
    set_cpu_threads(0);
    return r;
  };
  const Run one = run_on(1), seven = run_on(7);
  EXPECT_EQ(one.fwd, seven.fwd);
  EXPECT_EQ(one.grads.dq, seven.grads.dq);
  EXPECT_EQ(one.grads.dk, seven.grads.dk);
  EXPECT_EQ(one.grads.dv, seven.grads.dv);
  std::vector<RowBlock> heads;
  for (int64_t b = 0; b < c.b; ++b)
    for (int64_t h = 0; h < c.hq; ++h) heads.push_back({b, h, 0, c.lq});
  EXPECT_EQ(o.forward_rows(q, k, v, heads), seven.fwd);
  // Not a test that cannot fail: the outputs are real numbers, not the zeros they start as.
  EXPECT_GT(std::abs(seven.grads.dk[7]) + std::abs(seven.fwd.first[5]), 0.0);
}

// GQA: query heads of a group read the same K/V head, identical to repeating K/V per head.
TEST(AttentionReference, GqaEqualsRepeatedHeads) {
  Rng rng;
  Config g;
  g.dtype = DType::f64, g.b = 1, g.hq = 4, g.hk = 2, g.lq = 3, g.lk = 4, g.dk = 3, g.dv = 2;
  Config m = g;
  m.hk = 4;
  std::vector<double> q(4 * 3 * 3), k(2 * 4 * 3), v(2 * 4 * 2);
  for (auto* x : {&q, &k, &v})
    for (double& e : *x) e = rng.uniform(-1, 1);
  std::vector<double> kr, vr;  // head h of the MHA problem = head h / 2 of the GQA one
  for (int h = 0; h < 4; ++h) {
    kr.insert(kr.end(), k.begin() + (h / 2) * 12, k.begin() + (h / 2 + 1) * 12);
    vr.insert(vr.end(), v.begin() + (h / 2) * 8, v.begin() + (h / 2 + 1) * 8);
  }
  EXPECT_EQ(Oracle(g).forward(q, k, v), Oracle(m).forward(q, kr, vr));
}

// A paged cache is the padded cache its block table gathers: the reference over the pools equals,
// bit for bit, the reference over [B, Hk, Lk, D] caches copied key by key from the pages the table
// names (page sizes 1, 3, 16 and 64 against 37 keys, with and without seqused_k, four masks).
TEST(AttentionReference, PagedEqualsGatheredCache) {
  Rng rng;
  for (const Mask& mk : {Mask::none(), Mask::causal_bottom_right(), Mask::causal_top_left(),
                         Mask::sliding_window(4, 1)})
    for (int64_t ps : {1, 3, 16, 64})
      for (bool counts : {false, true}) {
        Config c;
        c.dtype = DType::f64, c.b = 3, c.hq = 4, c.hk = 2, c.lq = 2, c.lk = 37, c.dk = 5, c.dv = 3;
        c.mask = mk;
        if (counts) c.used_k = {37, 0, 20};
        Config flat = c;  // the gathered caches
        page_config(c, ps, rng);
        SCOPED_TRACE(c.str());
        Oracle o(c), of(flat);
        std::vector<double> q(harness::numel_of(vec(o.s.q, 4))),
            k(harness::numel_of(vec(o.s.k, 4))), v(harness::numel_of(vec(o.s.v, 4)));
        for (auto* x : {&q, &k, &v})
          for (double& e : *x) e = rng.uniform(-1, 1);
        std::vector<double> fk(harness::numel_of(vec(of.s.k, 4))),
            fv(harness::numel_of(vec(of.s.v, 4)));
        const int64_t cols = o.s.block_table[1];
        for (int64_t b = 0; b < c.b; ++b)
          for (int64_t h = 0; h < c.hk; ++h)
            for (int64_t j = 0; j < c.lk; ++j) {
              const int64_t page = c.table[b * cols + j / ps], row = j % ps;
              for (int64_t e = 0; e < c.dk; ++e)
                fk[((b * c.hk + h) * c.lk + j) * c.dk + e] =
                    k[((page * c.hk + h) * ps + row) * c.dk + e];
              for (int64_t e = 0; e < c.dv; ++e)
                fv[((b * c.hk + h) * c.lk + j) * c.dv + e] =
                    v[((page * c.hk + h) * ps + row) * c.dv + e];
            }
        EXPECT_EQ(o.forward(q, k, v), of.forward(q, fk, fv));
      }
}

// seqused_k: a sequence's first seqused_k[b] keys, and nothing past them, exactly as if its cache
// held only those keys (a problem of its own with Lk = the count, bottom-right diagonal there);
// padded caches and packed (varlen) ranges, counts of 0 (rows see no key), 1 and the whole length.
TEST(AttentionReference, SequsedKEqualsSlicedCaches) {
  Rng rng;
  const int64_t hq = 4, hk = 2, dk = 5, dv = 3;
  for (const Mask& mk : {Mask::none(), Mask::causal_bottom_right(), Mask::causal_top_left(),
                         Mask::sliding_window(4, 1)})
    for (bool varlen : {false, true}) {
      Config c;
      c.dtype = DType::f64, c.hq = hq, c.hk = hk, c.dk = dk, c.dv = dv, c.mask = mk;
      std::vector<int64_t> q0, lq, k0, lk;  // each sequence's rows
      if (varlen) {
        c.cu_q = {0, 3, 4, 4, 9}, c.cu_k = {0, 12, 20, 25, 26}, c.used_k = {12, 0, 3, 1};
        c.b = 4, c.lq = 5, c.lk = 12;
        for (int64_t b = 0; b < c.b; ++b)
          q0.push_back(c.cu_q[b]), lq.push_back(c.cu_q[b + 1] - c.cu_q[b]), k0.push_back(c.cu_k[b]),
              lk.push_back(c.cu_k[b + 1] - c.cu_k[b]);
      } else {
        c.b = 4, c.lq = 3, c.lk = 11, c.used_k = {11, 0, 1, 6};
        for (int64_t b = 0; b < c.b; ++b)
          q0.push_back(0), lq.push_back(c.lq), k0.push_back(0), lk.push_back(c.lk);
      }
      SCOPED_TRACE(c.str());
      Oracle o(c);
      std::vector<double> q(harness::numel_of(vec(o.s.q, o.s.rank_qkv))),
          k(harness::numel_of(vec(o.s.k, o.s.rank_qkv))),
          v(harness::numel_of(vec(o.s.v, o.s.rank_qkv)));
      for (auto* x : {&q, &k, &v})
        for (double& e : *x) e = rng.uniform(-1, 1);
      const auto [y, lse] = o.forward(q, k, v);
      // Element offsets of (sequence b, head h, row i, column cc) in the full problem's tensors.
      auto at = [&](int64_t b, int64_t heads, int64_t h, int64_t len, int64_t first, int64_t i,
                    int64_t d, int64_t cc) {
        return varlen ? ((first + i) * heads + h) * d + cc : ((b * heads + h) * len + i) * d + cc;
      };
      for (int64_t b = 0; b < c.b; ++b) {
        Config one = c;
        one.b = 1, one.lq = lq[b], one.lk = c.used_k[b];
        one.cu_q.clear(), one.cu_k.clear(), one.used_k.clear();
        std::vector<double> sq, sk, sv;
        for (int64_t h = 0; h < hq; ++h)
          for (int64_t i = 0; i < lq[b]; ++i)
            for (int64_t cc = 0; cc < dk; ++cc)
              sq.push_back(q[at(b, hq, h, c.lq, q0[b], i, dk, cc)]);
        for (int64_t h = 0; h < hk; ++h)
          for (int64_t j = 0; j < one.lk; ++j) {
            for (int64_t cc = 0; cc < dk; ++cc)
              sk.push_back(k[at(b, hk, h, c.lk, k0[b], j, dk, cc)]);
            for (int64_t cc = 0; cc < dv; ++cc)
              sv.push_back(v[at(b, hk, h, c.lk, k0[b], j, dv, cc)]);
          }
        const auto [ry, rl] = Oracle(one).forward(sq, sk, sv);
        for (int64_t h = 0; h < hq; ++h)
          for (int64_t i = 0; i < lq[b]; ++i) {
            for (int64_t cc = 0; cc < dv; ++cc)
              ASSERT_EQ(y[at(b, hq, h, c.lq, q0[b], i, dv, cc)], ry[(h * lq[b] + i) * dv + cc])
                  << "y of sequence " << b << ", head " << h << ", row " << i;
            const int64_t lo = varlen ? h * c.cu_q.back() + q0[b] + i : (b * hq + h) * c.lq + i;
            ASSERT_EQ(lse[lo], rl[h * lq[b] + i])
                << "lse of sequence " << b << ", head " << h << ", row " << i;
          }
      }
    }
}

// The float64 backward against finite differences of the float64 forward, per mask and feature.
TEST(AttentionReference, BackwardMatchesFiniteDifferences) {
  Rng rng;
  std::vector<Config> cases;
  for (const Mask& mk : kMasks) {
    Config c;
    c.dtype = DType::f64, c.b = 1, c.hq = 4, c.hk = 2, c.lq = 4, c.lk = 5, c.dk = 3, c.dv = 2;
    c.mask = mk;
    cases.push_back(c);
  }
  Config cap = cases[1];
  cap.softcap = 1.5, cap.scale = 0.9;
  cases.push_back(cap);
  Config var = cases[2];
  var.b = 2, var.cu_q = {0, 3, 7}, var.cu_k = {0, 1, 6}, var.lq = 4, var.lk = 5;
  cases.push_back(var);
  for (const Config& c : cases) {
    SCOPED_TRACE(c.str());
    Oracle o(c);
    const int r = o.s.rank_qkv;
    const int64_t nq = harness::numel_of(vec(o.s.q, r)), nk = harness::numel_of(vec(o.s.k, r)),
                  nv = harness::numel_of(vec(o.s.v, r)), ny = harness::numel_of(vec(o.s.y, r));
    std::vector<double> x(nq + nk + nv), dy(ny);
    for (double& e : x) e = rng.uniform(-1.5, 1.5);
    for (double& e : dy) e = rng.uniform(-1, 1);
    auto split = [&](const std::vector<double>& xx) {
      return std::tuple{std::vector<double>(xx.begin(), xx.begin() + nq),
                        std::vector<double>(xx.begin() + nq, xx.begin() + nq + nk),
                        std::vector<double>(xx.begin() + nq + nk, xx.end())};
    };
    auto f = [&](const std::vector<double>& xx) {
      auto [q, k, v] = split(xx);
      return o.forward(q, k, v).first;
    };
    auto [q, k, v] = split(x);
    auto [y, lse] = o.forward(q, k, v);
    auto g = o.backward(q, k, v, y, dy, lse);
    std::vector<double> dx = g.dq;
    dx.insert(dx.end(), g.dk.begin(), g.dk.end());
    dx.insert(dx.end(), g.dv.begin(), g.dv.end());
    EXPECT_TRUE(harness::gradient_matches_fd(f, x, dy, dx, rng, 96));
  }
}

// ---- Kernels against the reference
// -------------------------------------------------------------------- Masks x GQA x layouts in
// full; dtype, head dims and lengths rotate through their values so each value meets several of the
// others while the suite stays small.
TEST_P(AttentionTest, ForwardSweep) {
  const Target target = GetParam();
  BARACUDA_SKIP_IF_UNAVAILABLE(target);
  const std::pair<int64_t, int64_t> lens[] = {{1, 17}, {17, 17}, {17, 5}, {5, 17}, {16, 33}};
  int n = 0;
  for (const Mask& mk : kMasks)
    for (auto [hq, hk] : kHeads)
      for (Lay lay : kLays) {
        Config c;
        c.dtype = kTypes[n % 4];
        c.b = 1 + n % 2, c.hq = hq, c.hk = hk;
        std::tie(c.lq, c.lk) = lens[n % 5];
        c.dk = c.dv = kDims[n % 7];
        if (n % 5 == 3) c.dv = kDims[(n + 3) % 7];  // Dk != Dv
        c.mask = mk;
        c.softcap = n % 6 == 5 ? 3.0 : 0.0;
        check_forward(target, c, lay);
        ++n;
      }
}

TEST_P(AttentionTest, ForwardEveryHeadDimAndDtype) {
  const Target target = GetParam();
  BARACUDA_SKIP_IF_UNAVAILABLE(target);
  for (DType t : kTypes)
    for (int64_t d : kDims) {
      Config c;
      c.dtype = t, c.b = 1, c.hq = 2, c.hk = 1, c.lq = 9, c.lk = 19, c.dk = c.dv = d;
      c.mask = Mask::causal_bottom_right();
      check_forward(target, c, Lay::blhd);
    }
}

TEST_P(AttentionTest, ForwardVarlen) {
  const Target target = GetParam();
  BARACUDA_SKIP_IF_UNAVAILABLE(target);
  int n = 0;
  for (const Mask& mk : kMasks) {
    Config c;
    c.dtype = kTypes[n % 4];
    c.b = 3, c.hq = 4, c.hk = 2, c.dk = 64, c.dv = 32, c.mask = mk;
    c.cu_q = {0, 5, 5, 22}, c.cu_k = {0, 17, 20, 21};  // lengths (5, 0, 17) and (17, 3, 1)
    c.lq = 17, c.lk = 17;
    check_forward(target, c, n % 2 ? Lay::padded : Lay::bhld);
    ++n;
  }
}

// The tensor-core forward shapes a head dim can pin by name: m32s_n128 and m32s_n128m serve a
// padded head dim of 64 only. (String literals: a PlanPreference keeps a view of the name.)
std::vector<const char*> mma_forward_names(int64_t max_head_dim) {
  std::vector<const char*> names = {"flash_fwd_mma_sm80",
                                    "flash_fwd_mma_m16_sm80",
                                    "flash_fwd_mma_m16w8_sm80",
                                    "flash_fwd_mma_m32_sm80",
                                    "flash_fwd_mma_ovl_sm80",
                                    "flash_fwd_mma_m32s_sm80",
                                    "flash_fwd_mma_m32s_straight_sm80"};
  if (max_head_dim <= 64) {
    names.push_back("flash_fwd_mma_m32s_n128_sm80");
    names.push_back("flash_fwd_mma_m32s_n128m_sm80");
  }
  return names;
}

// seqused_k: each sequence reads only its first keys of a padded (or packed) cache. On the GPU
// every family kernel that serves the shape runs it by name (the decode kernels, the tensor-core
// forward shapes, the SIMT kernel at f32): counts of 0, 1, the whole cache and in between, GQA, the
// masks whose diagonal moves with the count, Lq > count (rows that see no key).
TEST_P(AttentionTest, ForwardSequsedK) {
  const Target target = GetParam();
  BARACUDA_SKIP_IF_UNAVAILABLE(target);
  const bool gpu = target == Target::cuda;
  auto runs_of = [&](std::vector<const char*> names) {
    std::vector<ForwardRun> runs;
    if (!gpu) names = {nullptr};  // the CPU backend: the reference plan
    for (const char* n : names)
      runs.push_back(n ? ForwardRun(PlanPreference::kernel(n)) : ForwardRun());
    return runs;
  };
  auto expect_names = [&](const std::vector<ForwardRun>& runs, std::vector<const char*> names) {
    if (!gpu) return;
    ASSERT_EQ(runs.size(), names.size());
    for (size_t j = 0; j < runs.size(); ++j) EXPECT_EQ(runs[j].kernel, names[j]);
  };
  const std::vector<const char*> decode = {"flash_decode_sm80", "flash_decode_w4_sm80",
                                           "flash_decode_fused_sm80", "flash_fwd_mma_sm80",
                                           "flash_fwd_mma_m16_sm80"};
  const std::vector<const char*> mma = mma_forward_names(128), mma64 = mma_forward_names(64);
  {  // decode against a cache filled to five lengths, the bench's GQA ratio
    Config c;
    c.dtype = DType::bf16, c.b = 5, c.hq = 8, c.hk = 2, c.lq = 1, c.lk = 1000, c.dk = c.dv = 128;
    c.mask = Mask::causal_bottom_right(), c.used_k = {1000, 0, 1, 517, 64};
    auto runs = runs_of(decode);
    check_forward_runs(target, c, Lay::blhd, runs);
    expect_names(runs, decode);
  }
  {  // speculative decoding: 4 queries, the first rows of the 2-key sequence see nothing
    Config c;
    c.dtype = DType::f16, c.b = 4, c.hq = 8, c.hk = 1, c.lq = 4, c.lk = 999, c.dk = c.dv = 64;
    c.mask = Mask::causal_bottom_right(), c.used_k = {4, 300, 999, 2};
    auto runs = runs_of(decode);
    check_forward_runs(target, c, Lay::bhld, runs);
    expect_names(runs, decode);
  }
  for (const Mask& mk : {Mask::none(), Mask::sliding_window(100, 30)}) {  // prefill shapes
    Config c;
    c.dtype = DType::bf16, c.b = 3, c.hq = 4, c.hk = 4, c.lq = 129, c.lk = 600, c.dk = c.dv = 64;
    c.mask = mk, c.used_k = {600, 1, 333};
    auto runs = runs_of(mma64);
    check_forward_runs(target, c, Lay::blhd, runs);
    expect_names(runs, mma64);
  }
  {  // packed sequences capped further: (1, 2, 0, 4) queries, (500 of 1000, 17, 0 of 483, 1) keys
    Config c;
    c.dtype = DType::bf16, c.b = 4, c.hq = 8, c.hk = 2, c.dk = c.dv = 128;
    c.mask = Mask::causal_bottom_right();
    c.cu_q = {0, 1, 3, 3, 7}, c.cu_k = {0, 1000, 1017, 1500, 1501}, c.lq = 4, c.lk = 1000;
    c.used_k = {500, 17, 0, 1};
    std::vector<const char*> names = decode;
    names.insert(names.end(), mma.begin() + 2, mma.end());
    auto runs = runs_of(names);
    check_forward_runs(target, c, Lay::bhld, runs);
    expect_names(runs, names);
  }
  {  // f32: the SIMT kernel (the family's default there)
    Config c;
    c.dtype = DType::f32, c.b = 3, c.hq = 4, c.hk = 2, c.lq = 6, c.lk = 40, c.dk = c.dv = 32;
    c.mask = Mask::causal_bottom_right(), c.used_k = {40, 3, 0};
    std::string kernel;
    check_forward(target, c, Lay::padded, std::nullopt, &kernel);
    if (gpu) {
      EXPECT_EQ(kernel, "flash_fwd_simt");
    }
  }
}

// Paged K / V: the pools' pages handed out at random. On the GPU every decode kernel by name and
// the SIMT kernel read them (page sizes 7, 16, 64 and 256: rows that cross pages within a tile,
// and tiles inside one page), with and without seqused_k; the tensor-core forwards refuse them.
TEST_P(AttentionTest, ForwardPagedKv) {
  const Target target = GetParam();
  BARACUDA_SKIP_IF_UNAVAILABLE(target);
  const bool gpu = target == Target::cuda;
  Rng rng;
  const std::vector<const char*> names = {"flash_decode_sm80", "flash_decode_w4_sm80",
                                          "flash_decode_fused_sm80", "flash_fwd_simt"};
  auto run_all = [&](const Config& c, Lay lay) {
    std::vector<ForwardRun> runs;
    if (gpu) {
      for (const char* n : names) runs.push_back(ForwardRun(PlanPreference::kernel(n)));
    } else {
      runs.push_back(ForwardRun());
    }
    check_forward_runs(target, c, lay, runs);
    if (gpu) {
      ASSERT_EQ(runs.size(), names.size());
      for (size_t j = 0; j < runs.size(); ++j) EXPECT_EQ(runs[j].kernel, names[j]);
    }
  };
  {  // decode, 16-key pages ([pages, page_size, Hk, D] memory), cache lengths
    Config c;
    c.dtype = DType::bf16, c.b = 4, c.hq = 8, c.hk = 2, c.lq = 1, c.lk = 1000, c.dk = c.dv = 128;
    c.mask = Mask::causal_bottom_right(), c.used_k = {1000, 0, 1, 517};
    page_config(c, 16, rng);
    run_all(c, Lay::blhd);
  }
  {  // speculative decoding over 64-key pages (a tile a page), every key used
    Config c;
    c.dtype = DType::f16, c.b = 3, c.hq = 8, c.hk = 1, c.lq = 4, c.lk = 999, c.dk = c.dv = 64;
    c.mask = Mask::causal_bottom_right();
    page_config(c, 64, rng);
    run_all(c, Lay::bhld);
  }
  {  // a serving batch whose paged grid takes four waves of CTAs (80 groups on 132 SMs: 480 CTAs
     // of 6 splits): more than the device holds at once, so the fused decode's split 0 (its CTAs
     // start split-major) should find later splits not started and hand the merge to the last
     // finisher (not observed directly: the oracle checks the outputs whichever path ran)
    Config c;
    c.dtype = DType::bf16, c.b = 40, c.hq = 4, c.hk = 2, c.lq = 1, c.lk = 1024, c.dk = c.dv = 128;
    c.mask = Mask::causal_bottom_right();
    page_config(c, 64, rng);
    run_all(c, Lay::blhd);
  }
  {  // 256-key pages at head dim 256, MQA
    Config c;
    c.dtype = DType::bf16, c.b = 2, c.hq = 8, c.hk = 1, c.lq = 1, c.lk = 1000, c.dk = c.dv = 256;
    c.mask = Mask::none(), c.used_k = {700, 1000};
    page_config(c, 256, rng);
    run_all(c, Lay::blhd);
  }
  // The decode kernels stream table entries through a 32-entry register window for page sizes
  // that tile the 64-key tiles evenly: long tables whose splits start mid-window, every tile a
  // window of its own (2-key pages), pages of several tiles entered past their first row.
  {  // 2-key pages: 32 entries a tile
    Config c;
    c.dtype = DType::bf16, c.b = 2, c.hq = 4, c.hk = 2, c.lq = 1, c.lk = 700, c.dk = c.dv = 64;
    c.mask = Mask::none(), c.used_k = {700, 333};
    page_config(c, 2, rng);
    run_all(c, Lay::bhld);
  }
  {  // 32-key pages, 69 entries (the next window reloaded twice), a softcap
    Config c;
    c.dtype = DType::f16, c.b = 2, c.hq = 4, c.hk = 2, c.lq = 2, c.lk = 2200, c.dk = c.dv = 128;
    c.mask = Mask::causal_bottom_right(), c.softcap = 30.f, c.used_k = {2199, 1100};
    page_config(c, 32, rng);
    run_all(c, Lay::blhd);
  }
  {  // 128-key pages (two tiles each), 32 query rows a K/V head (the two-tile kernels)
    Config c;
    c.dtype = DType::bf16, c.b = 1, c.hq = 8, c.hk = 1, c.lq = 4, c.lk = 4200, c.dk = c.dv = 128;
    c.mask = Mask::causal_bottom_right(), c.used_k = {4200};
    page_config(c, 128, rng);
    run_all(c, Lay::bhld);
  }
  {  // 192-key pages: a multiple of the tile, not a power of two
    Config c;
    c.dtype = DType::bf16, c.b = 3, c.hq = 4, c.hk = 2, c.lq = 1, c.lk = 3000, c.dk = c.dv = 128;
    c.mask = Mask::none(), c.used_k = {3000, 191, 2500};
    page_config(c, 192, rng);
    run_all(c, Lay::blhd);
  }
  {  // 16-key pages at head dim 256
    Config c;
    c.dtype = DType::bf16, c.b = 2, c.hq = 4, c.hk = 2, c.lq = 1, c.lk = 300, c.dk = c.dv = 256;
    c.mask = Mask::none(), c.used_k = {300, 77};
    page_config(c, 16, rng);
    run_all(c, Lay::blhd);
  }
  {  // 7-key pages, a head dim below its padded 128, a window
    Config c;
    c.dtype = DType::bf16, c.b = 2, c.hq = 4, c.hk = 2, c.lq = 3, c.lk = 300, c.dk = c.dv = 96;
    c.mask = Mask::sliding_window(50, 0), c.used_k = {299, 41};
    page_config(c, 7, rng);
    run_all(c, Lay::bhld);
  }
  {  // f32: the SIMT kernel by default
    Config c;
    c.dtype = DType::f32, c.b = 3, c.hq = 4, c.hk = 2, c.lq = 5, c.lk = 40, c.dk = c.dv = 32;
    c.mask = Mask::causal_bottom_right(), c.used_k = {40, 3, 0};
    page_config(c, 5, rng);
    std::string kernel;
    check_forward(target, c, Lay::padded, std::nullopt, &kernel);
    if (gpu) {
      EXPECT_EQ(kernel, "flash_fwd_simt");
    }
  }
  // Prefill and chunked prefill against paged caches (more query rows a K/V head than the decode
  // kernels take): the paged tensor-core forward by default, its page window at every page size
  // it serves (sub-tile 8 / 16 / 32, whole 64-key tiles, two tiles a page) and the SIMT kernel.
  auto run_prefill = [&](const Config& c, Lay lay) {
    std::vector<ForwardRun> runs(1);
    if (gpu) {
      runs.push_back(ForwardRun(PlanPreference::kernel("flash_fwd_mma_paged_sm80")));
      runs.push_back(ForwardRun(PlanPreference::kernel("flash_fwd_simt")));
    }
    check_forward_runs(target, c, lay, runs);
    if (gpu) {
      // On sm_90a builds fa3's paged instance (also a bespoke kernel) leads where the selection
      // table picks fa3 for the chunk and its producer loads the page size.
      EXPECT_TRUE(runs[0].kernel == "flash_fwd_mma_paged_sm80" ||
                  runs[0].kernel == "fa3_fwd_sm90a_ranked_ahead")
          << runs[0].kernel;
      EXPECT_EQ(runs[1].kernel, "flash_fwd_mma_paged_sm80");
      EXPECT_EQ(runs[2].kernel, "flash_fwd_simt");
    }
  };
  {  // a prompt chunk against 64-key pages, cache lengths
    Config c;
    c.dtype = DType::bf16, c.b = 2, c.hq = 4, c.hk = 2, c.lq = 70, c.lk = 400, c.dk = c.dv = 128;
    c.mask = Mask::causal_bottom_right(), c.used_k = {400, 255};
    page_config(c, 64, rng);
    run_prefill(c, Lay::blhd);
  }
  {  // 16-key pages at head dim 64, split keys (8 CTAs of rows), no GQA, no mask
    Config c;
    c.dtype = DType::f16, c.b = 1, c.hq = 4, c.hk = 4, c.lq = 65, c.lk = 700, c.dk = c.dv = 64;
    c.mask = Mask::none();
    page_config(c, 16, rng);
    run_prefill(c, Lay::bhld);
  }
  {  // 8-key pages at head dim 256 (32-key tiles), top-left causal, a softcap, MQA
    Config c;
    c.dtype = DType::bf16, c.b = 2, c.hq = 4, c.hk = 1, c.lq = 70, c.lk = 500, c.dk = c.dv = 256;
    c.mask = Mask::causal_top_left(), c.softcap = 20.f, c.used_k = {500, 321};
    page_config(c, 8, rng);
    run_prefill(c, Lay::blhd);
  }
  {  // 128-key pages (two tiles each), head dim 96 (padded 128), a sliding window
    Config c;
    c.dtype = DType::bf16, c.b = 2, c.hq = 4, c.hk = 2, c.lq = 65, c.lk = 600, c.dk = c.dv = 96;
    c.mask = Mask::sliding_window(100, 0), c.used_k = {600, 90};
    page_config(c, 128, rng);
    run_prefill(c, Lay::bhld);
  }
  {  // 32-key pages at head dim 256 (32-key tiles: a page a tile), 80 query rows a K/V head
    Config c;
    c.dtype = DType::bf16, c.b = 1, c.hq = 4, c.hk = 2, c.lq = 40, c.lk = 300, c.dk = c.dv = 256;
    c.mask = Mask::causal_bottom_right();
    page_config(c, 32, rng);
    run_prefill(c, Lay::bhld);
  }
  {  // 16-key pages at head dim 256: two pages a 32-key tile
    Config c;
    c.dtype = DType::f16, c.b = 1, c.hq = 4, c.hk = 2, c.lq = 40, c.lk = 300, c.dk = c.dv = 256;
    c.mask = Mask::none(), c.used_k = {250};
    page_config(c, 16, rng);
    run_prefill(c, Lay::blhd);
  }
  {  // 32-key pages, 40 query rows a K/V head (GQA packing: one CTA holds the group)
    Config c;
    c.dtype = DType::f16, c.b = 3, c.hq = 8, c.hk = 1, c.lq = 5, c.lk = 600, c.dk = c.dv = 128;
    c.mask = Mask::causal_bottom_right(), c.used_k = {600, 5, 450};
    page_config(c, 32, rng);
    run_prefill(c, Lay::blhd);
  }
  if (gpu) {  // the other tensor-core forwards take padded or packed caches only; the paged one
              // takes paged caches only, at the page sizes its window serves
    Config c;
    c.dtype = DType::bf16, c.b = 2, c.hq = 8, c.hk = 2, c.lq = 1, c.lk = 256, c.dk = c.dv = 128;
    page_config(c, 64, rng);
    auto fits = [&](const Config& cc, const char* n) {
      return ForwardPlan::select(harness::stream_for(target), desc_of(cc),
                                 PlanPreference::kernel(n))
          .ok();
    };
    for (const char* n : mma_forward_names(128)) EXPECT_FALSE(fits(c, n)) << n;
    EXPECT_TRUE(fits(c, "flash_fwd_mma_paged_sm80"));
    page_config(c, 7, rng);
    EXPECT_FALSE(fits(c, "flash_fwd_mma_paged_sm80"));
    page_config(c, 2, rng);  // 32 entries a 64-key tile: served
    EXPECT_TRUE(fits(c, "flash_fwd_mma_paged_sm80"));
    Config padded = c;
    padded.page_size = padded.pages = 0, padded.table.clear();
    EXPECT_FALSE(fits(padded, "flash_fwd_mma_paged_sm80"));
  }
}

// Packed queries against paged caches (a serving engine's batch of prompt chunks of different
// lengths: FlashAttention's varlen call with a block table). The CPU backend must answer, bit for
// bit, what it answers for the same batch with each sequence's keys gathered out of its pages into
// packed K / V: the two read the keys through different addressing (pool pages against packed
// rows). On the GPU every kernel that takes the problem runs it against that CPU answer: the SIMT
// kernel always, the paged tensor-core forward in 16- to 64-key pages, the decode kernels for a
// few query rows a K/V head, fa3's paged instance where the build has it.
TEST_P(AttentionTest, ForwardPagedVarlen) {
  const Target target = GetParam();
  BARACUDA_SKIP_IF_UNAVAILABLE(target);
  Rng rng;
  struct PagedVarlenCase {
    DType t;
    int64_t hq, hk, d, page_size;
    Mask mask;
    double softcap;
    std::vector<int32_t> lens_q, lens_k, used_k;  // used_k empty: no seqused_k
  };
  const std::vector<PagedVarlenCase> cases = {
      // prompt chunks at the ends of their caches, GQA 2, 16-key pages
      {DType::bf16, 4, 2, 64, 16, Mask::causal_bottom_right(), 0, {5, 1, 17}, {40, 3, 100}, {}},
      // an empty chunk and an empty cache, 7-key pages, a softcap, MQA
      {DType::f32, 2, 1, 32, 7, Mask::none(), 20, {3, 0, 9, 2}, {10, 5, 0, 33}, {}},
      // key counts below the sequences' lengths, whole 64-key pages, top-left causal
      {DType::f16, 4, 4, 128, 64, Mask::causal_top_left(), 0, {30, 2}, {130, 64}, {100, 64}},
      // a window, 5-key pages, counts of 0 and all
      {DType::f64, 2, 2, 16, 5, Mask::sliding_window(6, 0), 0, {4, 8, 3}, {12, 20, 9}, {12, 0, 9}},
      // decode-sized chunks (speculative tokens), 32-key pages, GQA 4
      {DType::bf16, 8, 2, 128, 32, Mask::causal_bottom_right(), 0, {1, 2, 1}, {300, 47, 0}, {}},
      // a 130-row chunk at head dim 128 in 16-key pages (fa3's row copies), counts
      {DType::bf16,
       8,
       2,
       128,
       16,
       Mask::causal_bottom_right(),
       0,
       {130, 7},
       {600, 200},
       {599, 200}},
  };
  for (const PagedVarlenCase& pc : cases) {
    Config c;
    c.dtype = pc.t, c.b = static_cast<int64_t>(pc.lens_q.size()), c.hq = pc.hq, c.hk = pc.hk;
    c.dk = c.dv = pc.d, c.mask = pc.mask, c.softcap = pc.softcap, c.used_k = pc.used_k;
    c.cu_q = {0}, c.cu_k = {0};
    for (size_t b = 0; b < pc.lens_q.size(); ++b) {
      c.cu_q.push_back(c.cu_q.back() + pc.lens_q[b]);
      c.cu_k.push_back(c.cu_k.back() + pc.lens_k[b]);
    }
    c.lq = *std::max_element(pc.lens_q.begin(), pc.lens_q.end());
    c.lk = *std::max_element(pc.lens_k.begin(), pc.lens_k.end());
    const Config packed = c;
    page_config(c, pc.page_size, rng);
    SCOPED_TRACE(c.str() + " on " + harness::target_name(target));
    if (target != Target::cpu) {
      const bool wide = c.dtype == DType::f16 || c.dtype == DType::bf16;
      const int64_t rows = c.lq * (c.hq / c.hk);  // query rows a K/V head
      const std::vector<std::pair<const char*, bool>> kernels = {
          {"flash_fwd_simt", true},
          {"flash_fwd_mma_paged_sm80", wide && c.page_size >= 16 && c.page_size <= 64},
          {"flash_decode_sm80", wide && rows <= 16},
          {"fa3_fwd_sm90a_paged", false}};  // where the build has it (attention_hopper's tests)
      std::vector<ForwardRun> runs(1);      // the default plan
      std::vector<std::string> names = {""};
      for (const auto& [name, must] : kernels) {
        const bool fits = ForwardPlan::select(harness::stream_for(target), desc_of(c),
                                              PlanPreference::kernel(name))
                              .ok();
        if (must) {
          EXPECT_TRUE(fits) << name;
        }
        if (!fits) continue;
        runs.push_back(ForwardRun(PlanPreference::kernel(name)));
        names.push_back(name);
      }
      check_forward_runs(target, c, Lay::bhld, runs);
      for (size_t j = 1; j < runs.size(); ++j) EXPECT_EQ(runs[j].kernel, names[j]);
      continue;
    }
    const Shapes s = shapes_of(problem_of(c)), sp = shapes_of(problem_of(packed));
    ASSERT_EQ(s.rank_kv, 4);
    ASSERT_EQ(sp.rank_kv, 3);
    auto q = random_tensor(c.dtype, s.q, 3, Target::cpu, Lay::bhld, rng);
    auto k_pool = random_tensor(c.dtype, s.k, 4, Target::cpu, Lay::blhd, rng);
    auto v_pool = random_tensor(c.dtype, s.v, 4, Target::cpu, Lay::bhld, rng);
    // Sequence b's key j: row j % page_size of page table[b][j / page_size], into packed row
    // cu_k[b] + j.
    const int64_t cols = s.block_table[1], ps = c.page_size, hk = c.hk, d = c.dk;
    auto gather = [&](const TestTensor& pool, const int64_t* dims) {
      const std::vector<double> pv = pool.values();  // [pages][Hk][page_size][D]
      std::vector<double> out(static_cast<size_t>(dims[0] * dims[1] * dims[2]));
      for (int64_t b = 0; b < c.b; ++b)
        for (int64_t j = 0; j < pc.lens_k[static_cast<size_t>(b)]; ++j) {
          const int64_t page = c.table[static_cast<size_t>(b * cols + j / ps)];
          for (int64_t h = 0; h < hk; ++h)
            for (int64_t x = 0; x < d; ++x)
              out[static_cast<size_t>(((c.cu_k[static_cast<size_t>(b)] + j) * hk + h) * d + x)] =
                  pv[static_cast<size_t>(((page * hk + h) * ps + j % ps) * d + x)];
        }
      auto t = std::make_unique<TestTensor>(TestTensor::make(c.dtype, vec(dims, 3), Target::cpu));
      t->set_values(out);
      return t;
    };
    auto k_packed = gather(*k_pool, sp.k), v_packed = gather(*v_pool, sp.v);
    auto cu_q = seqlens(c.cu_q, Target::cpu), cu_k = seqlens(c.cu_k, Target::cpu);
    std::unique_ptr<TestTensor> used_k;
    if (!c.used_k.empty()) used_k = seqlens(c.used_k, Target::cpu);
    TestTensor table = TestTensor::make(DType::i32, vec(s.block_table, 2), Target::cpu);
    table.set_values(std::vector<double>(c.table.begin(), c.table.end()));
    auto run = [&](const Config& cc, const TestTensor& k, const TestTensor& v) {
      const Shapes sh = shapes_of(problem_of(cc));
      auto y = make(cc.dtype, vec(sh.y, 3), Target::cpu, Lay::padded, rng);
      auto lse = make(problem_of(cc).lse_dtype, vec(sh.lse, 2), Target::cpu, Lay::padded, rng);
      y->poison(), lse->poison();
      const std::vector<uint8_t> y_before = y->bytes(), lse_before = lse->bytes();
      ForwardArguments a{q->cview(),  k.cview(),     v.cview(),    y->view(),
                         lse->view(), cu_q->cview(), cu_k->cview()};
      if (used_k) a.seqused_k = used_k->cview();
      if (cc.page_size > 0) a.block_table = table.cview();
      auto plan = ForwardPlan::select(Stream::cpu(), desc_of(cc));
      BARACUDA_EXPECT_OK(plan);
      if (plan.ok()) BARACUDA_EXPECT_OK(plan->run(Stream::cpu(), Workspace::none(), a));
      EXPECT_TRUE(harness::untouched_outside(y_before, y->bytes(), y->bit_mask(), "y gaps"));
      EXPECT_TRUE(
          harness::untouched_outside(lse_before, lse->bytes(), lse->bit_mask(), "lse gaps"));
      // Logical values (the padded layouts' gaps differ between the two runs), as bytes.
      std::vector<double> vals = y->values(), lv = lse->values();
      vals.insert(vals.end(), lv.begin(), lv.end());
      std::vector<uint8_t> out(vals.size() * sizeof(double));
      std::memcpy(out.data(), vals.data(), out.size());
      return out;
    };
    EXPECT_TRUE(harness::bytes_equal(run(c, *k_pool, *v_pool), run(packed, *k_packed, *v_packed),
                                     "paged against gathered keys"));
  }
}

// Stride-0 head broadcast of K/V (the seed's MQA form) is legal and equals real repetition.
TEST_P(AttentionTest, ForwardBroadcastKv) {
  const Target target = GetParam();
  BARACUDA_SKIP_IF_UNAVAILABLE(target);
  Rng rng;
  for (DType t : {DType::bf16, DType::f32}) {
    Config c;
    c.dtype = t, c.b = 2, c.hq = 3, c.hk = 3, c.lq = 6, c.lk = 11, c.dk = c.dv = 64;
    const Problem p = problem_of(c);
    const Shapes s = shapes_of(p);
    auto q = make(t, vec(s.q, 4), target, Lay::bhld, rng);
    auto k = std::make_unique<TestTensor>(
        TestTensor::with_strides(t, vec(s.k, 4), {11 * 64, 0, 64, 1}, 0, target));
    auto v = std::make_unique<TestTensor>(
        TestTensor::with_strides(t, vec(s.v, 4), {11 * 64, 0, 64, 1}, 0, target));
    auto y = make(t, vec(s.y, 4), target, Lay::bhld, rng);
    auto lse = make(DType::f32, vec(s.lse, 3), target, Lay::bhld, rng);
    for (auto* x : {q.get(), k.get(), v.get()}) x->fill_random(rng);
    auto plan = ForwardPlan::select(harness::stream_for(target), desc_of(c), ours(target));
    BARACUDA_ASSERT_OK(plan);
    std::unique_ptr<Buffer> hold;
    y->poison();
    BARACUDA_EXPECT_OK(
        plan->run(harness::stream_for(target), workspace_for(plan->workspace_size(), target, hold),
                  {q->cview(), k->cview(), v->cview(), y->view(), lse->view(), {}, {}}));
    auto [ry, rl] = Oracle(c).forward(q->values(), k->values(), v->values());
    EXPECT_TRUE(close_to(y->values(), ry, t, Accuracy::reduction, "y"));
    EXPECT_TRUE(close_to(lse->values(), rl, DType::f32, Accuracy::reduction, "lse"));
  }
}

// Fully masked rows (Lq > Lk bottom-right, windows that exclude every key, Lk = 0) on every kernel.
TEST_P(AttentionTest, FullyMaskedRowsAreZeroWithLseMinusInf) {
  const Target target = GetParam();
  BARACUDA_SKIP_IF_UNAVAILABLE(target);
  for (DType t : kTypes) {
    Config c;
    c.dtype = t, c.b = 1, c.hq = 2, c.hk = 2, c.lq = 9, c.lk = 4, c.dk = c.dv = 64;
    c.mask = Mask::causal_bottom_right();
    check_forward(target, c, Lay::bhld);
    c.lk = 0;
    c.mask = Mask::none();
    check_forward(target, c, Lay::bhld);
  }
}

// Soft-capped scores past float's range (Config::huge_scores) on the family default and every
// tensor-core forward kernel that takes soft-capping (each has its own tanh).
TEST_P(AttentionTest, SoftCapSaturatesScoresPastFloatRange) {
  const Target target = GetParam();
  BARACUDA_SKIP_IF_UNAVAILABLE(target);
  int n = 0;
  for (DType t : {DType::bf16, DType::f32})
    for (int64_t d : {64, 128})
      for (const Mask& mk : {Mask::none(), Mask::causal_bottom_right()}) {
        Config c;
        c.dtype = t, c.b = 1, c.hq = 2, c.hk = 1, c.lq = 200, c.lk = 257, c.dk = c.dv = d;
        c.mask = mk, c.softcap = 30.0, c.huge_scores = true;
        std::vector<std::optional<PlanPreference>> prefs = {std::nullopt};
        // The tensor-core kernels (16-bit types; n128m at a padded head dim of 64 only).
        if (target != Target::cpu && t == DType::bf16)
          for (const char* name : {"flash_fwd_mma_m32s_n128m_sm80",
                                   "flash_fwd_mma_m32s_straight_sm80", "flash_fwd_mma_m16_sm80"})
            if (d == 64 || !std::string_view(name).ends_with("n128m_sm80"))
              prefs.push_back(PlanPreference::kernel(name));
        for (const auto& pref : prefs)
          check_forward(target, c, n++ % 2 ? Lay::blhd : Lay::bhld, pref);
      }
}

TEST_P(AttentionTest, BackwardSweep) {
  const Target target = GetParam();
  BARACUDA_SKIP_IF_UNAVAILABLE(target);
  const std::pair<int64_t, int64_t> lens[] = {{1, 17}, {17, 17}, {17, 5}, {5, 12}};
  int n = 0;
  for (const Mask& mk : kMasks)
    for (auto [hq, hk] : kHeads) {
      Config c;
      c.dtype = kTypes[n % 4];
      c.b = 1 + n % 2, c.hq = hq, c.hk = hk;
      std::tie(c.lq, c.lk) = lens[n % 4];
      c.dk = kDims[n % 7], c.dv = n % 3 == 0 ? 32 : c.dk;
      c.mask = mk;
      c.softcap = n % 5 == 4 ? 2.5 : 0.0;
      check_backward(target, c, kLays[n % 4]);
      ++n;
    }
  Config v;  // varlen backward
  v.dtype = DType::f32, v.b = 3, v.hq = 4, v.hk = 2, v.dk = 32, v.dv = 64;
  v.mask = Mask::causal_bottom_right();
  v.cu_q = {0, 5, 5, 22}, v.cu_k = {0, 17, 20, 21}, v.lq = 17, v.lk = 17;
  check_backward(target, v, Lay::bhld);
}

// The deterministic preference picks a deterministic kernel, and it is: two runs, same bits.
TEST_P(AttentionTest, DeterministicRunsAreBitwiseEqual) {
  const Target target = GetParam();
  BARACUDA_SKIP_IF_UNAVAILABLE(target);
  for (DType t : {DType::bf16, DType::f32}) {
    Config c;
    c.dtype = t, c.b = 1, c.hq = 4, c.hk = 2, c.lq = 33, c.lk = 70, c.dk = c.dv = 64;
    c.mask = Mask::causal_bottom_right();
    auto fplan = ForwardPlan::select(harness::stream_for(target), desc_of(c),
                                     PlanPreference::deterministic());
    BARACUDA_ASSERT_OK(fplan);
    EXPECT_TRUE(fplan->precision_guarantee().deterministic);
    auto bplan = BackwardPlan::select(harness::stream_for(target), desc_of(c),
                                      PlanPreference::deterministic());
    BARACUDA_ASSERT_OK(bplan);
    EXPECT_TRUE(bplan->precision_guarantee().deterministic);
    // Same seed for both runs (test_seed is per test): identical inputs, so outputs must match.
    const auto a = check_forward(target, c, Lay::bhld, PlanPreference::deterministic());
    const auto b = check_forward(target, c, Lay::bhld, PlanPreference::deterministic());
    EXPECT_TRUE(harness::bytes_equal(a, b, "forward twice"));
    const auto ga = check_backward(target, c, Lay::bhld, PlanPreference::deterministic());
    const auto gb = check_backward(target, c, Lay::bhld, PlanPreference::deterministic());
    EXPECT_TRUE(harness::bytes_equal(ga, gb, "backward twice"));
  }
}

// ---- GPU-sized cases: many tiles, split-K decode, long odd lengths
// --------------------------------------
TEST_P(AttentionTest, LargeShapesOnDevice) {
  const Target target = GetParam();
  if (target == Target::cpu) GTEST_SKIP() << "large shapes run on the CUDA target only";
  BARACUDA_SKIP_IF_UNAVAILABLE(target);
  const Mask masks[] = {Mask::none(), Mask::causal_top_left(), Mask::causal_bottom_right(),
                        Mask::sliding_window(100, 30)};
  int n = 0;
  for (DType t : {DType::bf16, DType::f16})
    for (int64_t d : {64, 128, 96, 256})
      for (const Mask& mk : masks) {
        Config c;
        c.dtype = t, c.b = 1, c.hq = 2, c.hk = 1, c.lq = n % 2 ? 600 : 129, c.lk = 600;
        c.dk = c.dv = d;
        c.mask = mk;
        c.softcap = n % 4 == 3 ? 30.0 : 0.0;
        std::string kernel;
        check_forward(target, c, n % 2 ? Lay::blhd : Lay::bhld, std::nullopt, &kernel);
        if (t == DType::bf16) {  // a tensor-core kernel: the family's, or fa3 where it runs
          EXPECT_TRUE(kernel.find("mma") != std::string::npos || kernel.starts_with("fa3_"))
              << kernel;
        }
        ++n;
      }
  for (DType t : {DType::bf16, DType::f32}) {  // decode: one query row, long KV, split keys
    Config c;
    c.dtype = t, c.b = 1, c.hq = 8, c.hk = 2, c.lq = 1, c.lk = 5000, c.dk = c.dv = 128;
    check_forward(target, c, Lay::blhd);
    c.lq = 3, c.mask = Mask::causal_bottom_right();
    check_forward(target, c, Lay::bhld);
  }
  for (DType t : {DType::bf16, DType::f32}) {  // backward over several tiles
    Config c;
    c.dtype = t, c.b = 1, c.hq = 2, c.hk = 1, c.lq = 300, c.lk = 257, c.dk = c.dv = 64;
    c.mask = Mask::causal_bottom_right();
    check_backward(target, c, Lay::blhd);
  }
  n = 0;  // the tensor-core backward: head dims, masks, GQA, soft-cap, varlen
  // dQ by bulk reductions at a padded head dim of 128 under a band (these lengths are short) from
  // sm_90 on, by red.global otherwise.
  const auto caps = device_caps(0);
  BARACUDA_ASSERT_OK(caps);
  for (DType t : {DType::bf16, DType::f16})
    for (auto [dk, dv] : {std::pair<int64_t, int64_t>{128, 128}, {64, 64}, {96, 96}, {128, 64}})
      for (const Mask& mk : masks) {
        Config c;
        c.dtype = t, c.b = 2, c.hq = 4, c.hk = 2, c.lq = n % 2 ? 200 : 77, c.lk = 150;
        c.dk = dk, c.dv = dv, c.mask = mk;
        c.softcap = n % 3 == 2 ? 20.0 : 0.0;
        check_backward(target, c, n % 2 ? Lay::blhd : Lay::bhld);
        auto plan = family_backward(target, desc_of(c));
        BARACUDA_ASSERT_OK(plan);
        const bool banded = !mk.is_none();
        EXPECT_EQ(plan->sku().name, caps->sm >= 90 && std::max(dk, dv) > 64 && banded
                                        ? "flash_bwd_fused_bulk_sm80"
                                        : "flash_bwd_fused_sm80");
        ++n;
      }
  {
    Config c;
    c.dtype = DType::bf16, c.b = 3, c.hq = 4, c.hk = 1, c.dk = c.dv = 128;
    c.mask = Mask::causal_bottom_right();
    c.cu_q = {0, 70, 70, 300}, c.cu_k = {0, 130, 131, 331}, c.lq = 230, c.lk = 200;
    check_forward(target, c, Lay::bhld);
    check_backward(target, c, Lay::bhld);
  }
}

// Both tensor-core backward kernels by name: the one-pass kernel (dQ by atomics: several key
// blocks, GQA groups and query tiles add into the same rows; unmasked tiles take its straight-line
// path) and the deterministic two passes, over masks, head dims (padded, Dk != Dv), GQA / MQA,
// soft-cap, lengths that leave partial tiles, both layouts and varlen.
TEST_P(AttentionTest, BackwardKernelsByNameOnDevice) {
  const Target target = GetParam();
  if (target == Target::cpu) GTEST_SKIP() << "the tensor-core kernels run on the CUDA target only";
  BARACUDA_SKIP_IF_UNAVAILABLE(target);
  std::vector<std::pair<const char*, bool>> kernels = {{"flash_bwd_fused_sm80", false},
                                                       {"flash_bwd_fused_q64_sm80", false},
                                                       {"flash_bwd_mma_sm80", true}};
  // dQ by bulk reductions: sm_90 and later.
  if (const auto caps = device_caps(0); caps.ok() && caps->sm >= 90)
    kernels.push_back({"flash_bwd_fused_bulk_sm80", false});
  const Mask masks[] = {Mask::none(), Mask::causal_top_left(), Mask::causal_bottom_right(),
                        Mask::sliding_window(100, 30)};
  const std::pair<int64_t, int64_t> lens[] = {
      {300, 600}, {600, 300}, {1, 129}, {17, 17}, {256, 256}};
  const std::pair<int64_t, int64_t> dims[] = {{128, 128}, {64, 64}, {96, 96}, {128, 64}, {32, 32}};
  const std::pair<int64_t, int64_t> heads[] = {{4, 2}, {2, 2}, {3, 1}};
  // Case n of a sweep: dtype, heads, dims and soft-cap cycle with n (soft-capped every cap_every).
  auto config = [&](int n, std::pair<int64_t, int64_t> len, const Mask& mk,
                    std::pair<int64_t, int64_t> dim, int cap_every) {
    Config c;
    c.dtype = n % 2 ? DType::f16 : DType::bf16;
    c.b = 2;
    std::tie(c.hq, c.hk) = heads[n % 3];
    std::tie(c.lq, c.lk) = len;
    std::tie(c.dk, c.dv) = dim;
    c.mask = mk;
    c.softcap = n % cap_every == cap_every - 1 ? 20.0 : 0.0;
    return c;
  };
  int n = 0;
  for (auto len : lens)
    for (const Mask& mk : masks) {
      const Config c = config(n, len, mk, dims[n % 5], 7);
      for (auto [name, deterministic] : kernels) {
        SCOPED_TRACE(name);
        auto plan = BackwardPlan::select(harness::stream_for(target), desc_of(c),
                                         PlanPreference::kernel(name));
        BARACUDA_ASSERT_OK(plan);
        EXPECT_EQ(plan->sku().name, name);
        EXPECT_EQ(plan->precision_guarantee().deterministic, deterministic);
        check_backward(target, c, n % 2 ? Lay::blhd : Lay::bhld, PlanPreference::kernel(name));
      }
      ++n;
    }
  Config c;  // varlen, MQA
  c.dtype = DType::bf16, c.b = 3, c.hq = 4, c.hk = 1, c.dk = c.dv = 128;
  c.mask = Mask::causal_bottom_right();
  c.cu_q = {0, 70, 70, 300}, c.cu_k = {0, 130, 131, 331}, c.lq = 230, c.lk = 200;
  for (auto [name, deterministic] : kernels)
    check_backward(target, c, Lay::bhld, PlanPreference::kernel(name));
  // The one-pass kernels' stream-K tail (detail::tail_split; unbanded, padded batches): 40 key
  // blocks all split over the tail's CTAs, then more than two waves of blocks (not a multiple of
  // the SMs: whole blocks first, the rest split), at both padded head dims.
  {
    const auto caps = device_caps(0);
    BARACUDA_ASSERT_OK(caps);
    const int64_t sms = caps->sm_count;
    Config all;
    all.dtype = DType::bf16, all.b = 2, all.hq = 8, all.hk = 4, all.lq = all.lk = 600;
    Config mix;
    mix.dtype = DType::f16, mix.b = 2, mix.hk = mix.hq = 2 * sms / 8 + 3, mix.lq = 130;
    mix.lk = 512;
    for (int64_t d : {64, 128})
      for (Config tc : {all, mix}) {
        tc.dk = tc.dv = d;
        // 128 query rows a step: the fewest iterations, so the other instances reach it too.
        const detail::TailSplit t = detail::bwd_tail_split(problem_of(tc), 128, sms);
        ASSERT_GT(t.ctas, 0) << "the case must reach the tail";
        EXPECT_EQ(t.n_dp > 0, tc.lq == 130) << "whole blocks before the tail in the second case";
        for (auto [name, deterministic] : kernels) {
          if (deterministic) continue;
          SCOPED_TRACE(::testing::Message() << name << " tail case d" << d << " Lq " << tc.lq);
          check_backward(target, tc, d == 64 ? Lay::bhld : Lay::blhd, PlanPreference::kernel(name));
        }
      }
  }
  // Padded head dims past 128 (up to 256): the two-pass kernel only (dK and dV in launches of
  // their own there); the one-pass kernel refuses them. Varlen included; every mask kind.
  const std::pair<int64_t, int64_t> wide[] = {{256, 256}, {192, 192}, {256, 128}, {160, 136}};
  const std::pair<int64_t, int64_t> wide_lens[] = {{129, 200}, {200, 129}, {1, 65}, {64, 300}};
  n = 0;
  for (auto len : wide_lens)
    for (const Mask& mk : masks) {
      const Config w = config(n, len, mk, wide[n % 4], 5);
      auto plan = family_backward(target, desc_of(w));
      BARACUDA_ASSERT_OK(plan);
      EXPECT_EQ(plan->sku().name, "flash_bwd_mma_sm80") << "the family's backward at D > 128";
      EXPECT_FALSE(BackwardPlan::select(harness::stream_for(target), desc_of(w),
                                        PlanPreference::kernel("flash_bwd_fused_sm80"))
                       .ok());
      const auto a = check_backward(target, w, n % 2 ? Lay::blhd : Lay::bhld,
                                    PlanPreference::kernel("flash_bwd_mma_sm80"));
      if (n % 4 == 0) {  // deterministic: a second run gives the same bits
        const auto b = check_backward(target, w, n % 2 ? Lay::blhd : Lay::bhld,
                                      PlanPreference::kernel("flash_bwd_mma_sm80"));
        EXPECT_TRUE(harness::bytes_equal(a, b, "flash_bwd_mma_sm80 twice"));
      }
      ++n;
    }
  Config vw;  // varlen at head dim 256
  vw.dtype = DType::bf16, vw.b = 3, vw.hq = 4, vw.hk = 2, vw.dk = vw.dv = 256;
  vw.mask = Mask::causal_bottom_right();
  vw.cu_q = {0, 70, 70, 200}, vw.cu_k = {0, 130, 131, 251}, vw.lq = 130, vw.lk = 130;
  check_backward(target, vw, Lay::bhld, PlanPreference::kernel("flash_bwd_mma_sm80"));
  // Their row kernels index B * Hq * Lq query rows in 32 bits: 2^31 rows are refused, 2^31 - 1024
  // are not (descriptors only: nothing is allocated).
  Config big;
  big.dtype = DType::bf16, big.hq = big.hk = 1024, big.lq = big.lk = 1024, big.dk = big.dv = 64;
  for (auto [name, deterministic] : kernels) {
    big.b = 2048;
    EXPECT_FALSE(BackwardPlan::select(harness::stream_for(target), desc_of(big),
                                      PlanPreference::kernel(name))
                     .ok())
        << name;
    big.b = 2047;
    BARACUDA_EXPECT_OK(BackwardPlan::select(harness::stream_for(target), desc_of(big),
                                            PlanPreference::kernel(name)));
  }
}

// ---- The decode kernel (flash_decode_sm80): all query heads of a GQA group in one CTA, split keys
// merged in a fixed order. Odd lengths (1 key, one tile, several splits, 32769 = 512 tiles + 1),
// Lq 1..8, GQA 1/4/8 and MQA, every mask kind (empty splits from windows, fully masked rows from
// Lq > Lk bottom-right), head dims 64..256 and Dk != Dv, soft-cap, both cache layouts.
TEST_P(AttentionTest, DecodeKernelOnDevice) {
  const Target target = GetParam();
  if (target == Target::cpu) GTEST_SKIP() << "the decode kernel runs on the CUDA target only";
  BARACUDA_SKIP_IF_UNAVAILABLE(target);
  // Both split policies of the decode kernel (one wave; 4x as many splits) and the fused-merge
  // variant (last split of a group merges) on the same inputs.
  auto both = [] {
    return std::vector<ForwardRun>{{PlanPreference::kernel("flash_decode_sm80")},
                                   {PlanPreference::kernel("flash_decode_w4_sm80")},
                                   {PlanPreference::kernel("flash_decode_fused_sm80")}};
  };
  auto expect_names = [](const std::vector<ForwardRun>& runs) {
    EXPECT_EQ(runs[0].kernel, "flash_decode_sm80");
    EXPECT_EQ(runs[1].kernel, "flash_decode_w4_sm80");
    EXPECT_EQ(runs[2].kernel, "flash_decode_fused_sm80");
  };
  const Mask masks[] = {Mask::none(), Mask::causal_bottom_right(), Mask::causal_top_left(),
                        Mask::sliding_window(300, 0),
                        Mask::sliding_window(5, 2, Diagonal::top_left)};
  const std::pair<int64_t, int64_t> heads[] = {{32, 8}, {8, 8}, {8, 1}, {16, 2}};
  const std::pair<int64_t, int64_t> dims[] = {
      {128, 128}, {64, 64}, {256, 256}, {96, 96}, {128, 64}};
  int n = 0;
  for (int64_t lk : {1, 17, 1000, 32769})
    for (int64_t lq = 1; lq <= 8; ++lq) {
      Config c;
      c.dtype = n % 3 == 2 ? DType::f16 : DType::bf16;
      c.b = lk <= 1000 ? 1 + n % 2 : 1;
      std::tie(c.hq, c.hk) = heads[n % 4];
      if (c.hq / c.hk * lq > 32) c.hq = 32, c.hk = 8;  // the kernel holds at most 32 rows
      std::tie(c.dk, c.dv) = dims[n % 5];
      if (c.dk == 256 && c.hq / c.hk * lq > 16) c.dk = c.dv = 128;  // D = 256: 16 rows
      if (lk > 1000) {
        // Same group (what the kernel packs), one K/V head: filling and downloading 32k-key
        // tensors costs ~100 ns per element on the host. The bench shape below has 8.
        c.hq = c.hq / c.hk, c.hk = 1;
      }
      c.lq = lq, c.lk = lk;
      c.mask = masks[n % 5];
      c.softcap = n % 7 == 6 ? 30.0 : 0.0;
      auto runs = both();
      check_forward_runs(target, c, n % 2 ? Lay::blhd : Lay::bhld, runs);
      expect_names(runs);
      ++n;
    }
  {  // varlen decode: lengths (1, 2, 0, 4) queries against (1000, 17, 483, 1) keys
    Config c;
    c.dtype = DType::bf16, c.b = 4, c.hq = 8, c.hk = 2, c.dk = c.dv = 128;
    c.mask = Mask::causal_bottom_right();
    c.cu_q = {0, 1, 3, 3, 7}, c.cu_k = {0, 1000, 1017, 1500, 1501}, c.lq = 4, c.lk = 1000;
    auto runs = both();
    check_forward_runs(target, c, Lay::bhld, runs);
    expect_names(runs);
  }
  // 96 (batch, K/V head) pairs: one split each would idle a quarter of 132 SMs. At d64
  // decode_splits then fills shared memory's slots (several splits, combined); at d128 it keeps
  // one split per pair on 132 SMs (the output written by the decode kernel, no combine).
  for (const int64_t dim : {64, 128}) {
    Config c;
    c.dtype = DType::bf16, c.b = 12, c.hq = 32, c.hk = 8, c.lq = 1, c.lk = 1000;
    c.dk = c.dv = dim, c.mask = Mask::causal_bottom_right();
    auto runs = both();
    check_forward_runs(target, c, Lay::blhd, runs);
    expect_names(runs);
  }
  {  // the bench's decode shape selects it by default (the fused variant on sm_90:
     // decode_fused_leads); each decode plan run twice gives the same bits (the splits' partials
     // merge in split order); the general kernel stays selectable
    Config c;
    c.dtype = DType::bf16, c.b = 1, c.hq = 32, c.hk = 8, c.lq = 1, c.lk = 32768;
    c.dk = c.dv = 128, c.mask = Mask::causal_bottom_right();
    std::vector<ForwardRun> runs{{std::nullopt, 2},
                                 {PlanPreference::kernel("flash_decode_w4_sm80"), 2},
                                 {PlanPreference::kernel("flash_fwd_mma_sm80")},
                                 {PlanPreference::kernel("flash_decode_fused_sm80"), 3}};
    check_forward_runs(target, c, Lay::blhd, runs);
    EXPECT_EQ(runs[0].kernel, harness::stream_for(target).caps().sm >= 90
                                  ? "flash_decode_fused_sm80"
                                  : "flash_decode_sm80");
    EXPECT_EQ(runs[1].kernel, "flash_decode_w4_sm80");
    EXPECT_EQ(runs[2].kernel, "flash_fwd_mma_sm80");
    EXPECT_EQ(runs[3].kernel, "flash_decode_fused_sm80");
    for (const char* name :
         {"flash_decode_sm80", "flash_decode_w4_sm80", "flash_decode_fused_sm80"}) {
      auto plan = ForwardPlan::select(harness::stream_for(target), desc_of(c),
                                      PlanPreference::kernel(name));
      BARACUDA_ASSERT_OK(plan);
      EXPECT_TRUE(plan->precision_guarantee().deterministic) << name;
    }
  }
  {  // more rows than the kernel holds (36 a K/V head, in a group of 12: fa3's packed decodes
     // take groups of powers of two alone): the general kernel takes the problem
    Config c;
    c.dtype = DType::bf16, c.b = 1, c.hq = 12, c.hk = 1, c.lq = 3, c.lk = 300, c.dk = c.dv = 64;
    std::string kernel;
    check_forward(target, c, Lay::bhld, std::nullopt, &kernel);
    EXPECT_EQ(kernel, "flash_fwd_mma_m16_sm80");  // D = 64: m16's d64 entry (launch.cuh)
  }
}

#if BARACUDA_WITH_CUDA
// The decode tests' problem over [B, L, H, D] caches: 8 query heads over 2 K/V heads, one query
// token against 4000 keys, d128, bf16. Q is drawn once; refresh() draws K / V and poisons the
// outputs before a run, matches_oracle() checks them against the float64 oracle.
struct DecodeInputs {
  Config c;
  Problem p;
  Shapes s;
  std::unique_ptr<TestTensor> q, k, v, y, lse;

  ForwardArguments args() const {
    return {q->cview(), k->cview(), v->cview(), y->view(), lse->view(), {}, {}};
  }
  void refresh(Rng& rng) {
    k->fill_random(rng, -2, 2);
    v->fill_random(rng);
    y->poison();
    lse->poison();
  }
  void expect_matches_oracle() const {
    const auto ref = Oracle(c).forward(q->values(), k->values(), v->values());
    EXPECT_TRUE(close_to(y->values(), ref.first, c.dtype, Accuracy::reduction, "y"));
    EXPECT_TRUE(close_to(lse->values(), ref.second, p.lse_dtype, Accuracy::reduction, "lse"));
  }
};
DecodeInputs decode_inputs(int64_t batch, Target target, Rng& rng) {
  Config c;
  c.dtype = DType::bf16, c.b = batch, c.hq = 8, c.hk = 2, c.lq = 1, c.lk = 4000;
  c.dk = c.dv = 128, c.mask = Mask::causal_bottom_right();
  const Problem p = problem_of(c);
  const Shapes s = shapes_of(p);
  const int r = s.rank_qkv;
  DecodeInputs in{c,
                  p,
                  s,
                  make(c.dtype, vec(s.q, r), target, Lay::blhd, rng),
                  make(c.dtype, vec(s.k, r), target, Lay::blhd, rng),
                  make(c.dtype, vec(s.v, r), target, Lay::blhd, rng),
                  make(c.dtype, vec(s.y, r), target, Lay::blhd, rng),
                  make(p.lse_dtype, vec(s.lse, s.rank_lse), target, Lay::padded, rng)};
  in.q->fill_random(rng, -2, 2);
  return in;
}
#endif

// A decode engine captures its step in a CUDA graph and replays it with the cache updated in
// place: every replay must read the current K / V. The default plan's two launches are
// programmatic dependent launches (edges of that kind in the graph), and the fused variant's
// split flags are raised to a tag fixed at capture. That the merging split clears them for the
// next replay is not what this observes: with the clearing taken out (H200, 3566cb1 with
// clear_flags removed) it still passed, since every split of a replay then merges and the last one,
// merging current partials, writes last. FusedDecodeClearsItsSplitFlags (below) observes it.
TEST_P(AttentionTest, DecodeReplaysInACudaGraph) {
  const Target target = GetParam();
  if (target == Target::cpu) GTEST_SKIP() << "CUDA graphs: the CUDA target only";
  BARACUDA_SKIP_IF_UNAVAILABLE(target);
#if BARACUDA_WITH_CUDA
  Rng rng;
  DecodeInputs in = decode_inputs(1, target, rng);
  const Stream& stream = harness::stream_for(target);
  const auto cs = static_cast<cudaStream_t>(stream.cuda_handle());
  for (const char* name :
       {"flash_decode_sm80", "flash_decode_w4_sm80", "flash_decode_fused_sm80"}) {
    SCOPED_TRACE(name);
    auto plan = ForwardPlan::select(stream, desc_of(in.c), PlanPreference::kernel(name));
    BARACUDA_ASSERT_OK(plan);
    std::unique_ptr<Buffer> hold;
    const Workspace ws = workspace_for(plan->workspace_size(), target, hold);
    // Captured cold (the plan's first run), as an engine that captures at start-up would.
    cudaGraph_t graph = nullptr;
    ASSERT_EQ(cudaStreamBeginCapture(cs, cudaStreamCaptureModeThreadLocal), cudaSuccess);
    const Status st = plan->run(stream, ws, in.args());
    const cudaError_t ended = cudaStreamEndCapture(cs, &graph);
    ASSERT_TRUE(st.ok()) << st.error().to_string();
    ASSERT_EQ(ended, cudaSuccess) << cudaGetErrorString(ended);
    cudaGraphExec_t exec = nullptr;
    ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
    for (int replay = 0; replay < 3; ++replay) {
      SCOPED_TRACE("replay " + std::to_string(replay));
      in.refresh(rng);
      ASSERT_EQ(cudaGraphLaunch(exec, cs), cudaSuccess);
      ASSERT_EQ(cudaStreamSynchronize(cs), cudaSuccess);
      in.expect_matches_oracle();
    }
    EXPECT_EQ(cudaGraphExecDestroy(exec), cudaSuccess);
    EXPECT_EQ(cudaGraphDestroy(graph), cudaSuccess);
  }
#endif
}

// The fused decode variant leaves every split flag it raised cleared (the merging split of each
// (batch, K/V head) clears the group's flags), so a later launch or graph replay starts from
// zeros whatever the workspace held before. White-box: the flags are the workspace's last
// batch x K/V heads x splits 8-byte words (decode_workspace_layout, decode.cuh), and the split
// count is the one whose layout gives the plan's workspace size. With the clearing taken out
// (H200, bfbeead's tree) this fails, 84 of 84 flags raised, while DecodeReplaysInACudaGraph
// passes.
TEST_P(AttentionTest, FusedDecodeClearsItsSplitFlags) {
  const Target target = GetParam();
  if (target == Target::cpu) GTEST_SKIP() << "the fused decode kernel runs on the CUDA target only";
  BARACUDA_SKIP_IF_UNAVAILABLE(target);
#if BARACUDA_WITH_CUDA
  Rng rng;
  DecodeInputs in = decode_inputs(2, target, rng);
  const Config& c = in.c;
  const Stream& stream = harness::stream_for(target);
  auto plan =
      ForwardPlan::select(stream, desc_of(c), PlanPreference::kernel("flash_decode_fused_sm80"));
  BARACUDA_ASSERT_OK(plan);
  const size_t bytes = plan->workspace_size();
  const auto rows = static_cast<size_t>(c.b * c.hq * c.lq),
             groups = static_cast<size_t>(c.b * c.hk);
  size_t splits = 0;
  for (size_t n = 2; n <= 256 && splits == 0; ++n) {
    const size_t partials = (n * rows * static_cast<size_t>(c.dv + 1) * sizeof(float) + 7) / 8 * 8;
    if (partials + 8 * groups * (2 * n + 1) == bytes) splits = n;
  }
  ASSERT_GT(splits, 0u) << "no split count gives the fused plan's workspace of " << bytes
                        << " bytes: the layout changed, update this test";
  const size_t flag_bytes = 8 * groups * (2 * splits + 1);  // started, done, hand-off
  std::unique_ptr<Buffer> hold;
  const Workspace ws = workspace_for(bytes, target, hold);
  for (int round = 0; round < 3; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    // Stale flags and partials: every byte 0xff (never a launch's tag, which is a fresh value).
    ASSERT_EQ(cudaMemset(ws.data, 0xff, bytes), cudaSuccess);
    in.refresh(rng);
    const Status st = plan->run(stream, ws, in.args());
    ASSERT_TRUE(st.ok()) << st.error().to_string();
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    in.expect_matches_oracle();
    std::vector<uint64_t> flags(flag_bytes / 8, 1);
    ASSERT_EQ(
        cudaMemcpy(flags.data(), static_cast<const unsigned char*>(ws.data) + bytes - flag_bytes,
                   flag_bytes, cudaMemcpyDeviceToHost),
        cudaSuccess);
    size_t raised = 0;
    for (const uint64_t f : flags) raised += f != 0;
    EXPECT_EQ(raised, 0u) << "of " << flags.size() << " split flags (" << splits << " splits)";
  }
#endif
}

// Every tensor-core forward kernel by name (the default plan reaches only the highest priority one
// per shape), all on the same inputs per problem: head dims 32..128 and Dk != Dv, masks, GQA
// packing, split-K decode shapes, odd lengths, soft-cap, varlen.
TEST_P(AttentionTest, ForwardKernelsByNameOnDevice) {
  const Target target = GetParam();
  if (target == Target::cpu) GTEST_SKIP() << "the tensor-core kernels run on the CUDA target only";
  BARACUDA_SKIP_IF_UNAVAILABLE(target);
  auto names_for = [](const Config& c) { return mma_forward_names(std::max(c.dk, c.dv)); };
  auto all = [&](const Config& c) {
    std::vector<ForwardRun> runs;
    for (const char* name : names_for(c)) runs.push_back({PlanPreference::kernel(name)});
    return runs;
  };
  auto expect_names = [&](const Config& c, const std::vector<ForwardRun>& runs) {
    const std::vector<const char*> names = names_for(c);
    ASSERT_EQ(runs.size(), names.size());
    for (size_t j = 0; j < runs.size(); ++j) EXPECT_EQ(runs[j].kernel, names[j]);
  };
  const Mask masks[] = {Mask::none(), Mask::causal_top_left(), Mask::causal_bottom_right(),
                        Mask::sliding_window(100, 30)};
  const std::pair<int64_t, int64_t> lens[] = {{1, 5000}, {3, 1000}, {129, 600}, {600, 600},
                                              {17, 17},  {1, 1},    {65, 4097}};
  const std::pair<int64_t, int64_t> dims[] = {{128, 128}, {64, 64}, {96, 96}, {128, 64}, {32, 32}};
  int n = 0;
  for (auto [lq, lk] : lens)
    for (const Mask& mk : masks) {
      Config c;
      c.dtype = n % 2 ? DType::f16 : DType::bf16;
      c.b = lk <= 1000 ? 2 : 1;
      c.hq = n % 3 == 0 ? 8 : 4, c.hk = n % 3 == 2 ? 4 : 2;
      c.lq = lq, c.lk = lk;
      std::tie(c.dk, c.dv) = dims[n % 5];
      c.mask = mk;
      c.softcap = n % 6 == 5 ? 30.0 : 0.0;
      auto runs = all(c);
      check_forward_runs(target, c, n % 2 ? Lay::blhd : Lay::bhld, runs);
      expect_names(c, runs);
      ++n;
    }
  Config c;  // varlen
  c.dtype = DType::bf16, c.b = 3, c.hq = 4, c.hk = 1, c.dk = c.dv = 128;
  c.mask = Mask::causal_bottom_right();
  c.cu_q = {0, 70, 70, 300}, c.cu_k = {0, 130, 131, 331}, c.lq = 230, c.lk = 200;
  auto runs = all(c);
  check_forward_runs(target, c, Lay::bhld, runs);
  expect_names(c, runs);
  Config v64 = c;  // varlen at head dim 64: m32s_n128 too
  v64.dk = v64.dv = 64;
  auto runs64 = all(v64);
  check_forward_runs(target, v64, Lay::bhld, runs64);
  expect_names(v64, runs64);
  // GQA packing over several blocks (a head's rows fill less than a block, the group's more than
  // one): a group of 16 with 16 rows a head, causal bottom-right; varlen chunks of 5 and 35 rows
  // (and an empty one) in a group of 8, so blocks cross heads at different rows per sequence.
  Config g16;
  g16.dtype = DType::bf16, g16.b = 2, g16.hq = 32, g16.hk = 2, g16.lq = 16, g16.lk = 3000;
  g16.dk = g16.dv = 128, g16.mask = Mask::causal_bottom_right();
  auto runs16 = all(g16);
  check_forward_runs(target, g16, Lay::blhd, runs16);
  expect_names(g16, runs16);
  Config g8 = v64;
  g8.dtype = DType::f16, g8.hq = 16, g8.hk = 2, g8.mask = Mask::sliding_window(300, 0);
  g8.cu_q = {0, 5, 5, 40}, g8.cu_k = {0, 900, 1000, 2100}, g8.lq = 35, g8.lk = 1100;
  auto runs8 = all(g8);
  check_forward_runs(target, g8, Lay::bhld, runs8);
  expect_names(g8, runs8);
}

}  // namespace
}  // namespace baracuda::attention
