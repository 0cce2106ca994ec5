// The attention family's rows in baracuda-demo: forward (Y and LSE) and backward (dQ, dK, dV) in
// bf16 and f32, causal and GQA/MQA, and a decode step over a paged KV cache filled to different
// lengths, on random data, each output checked against the float64 reference (the family's
// reference plan on f64 host buffers) with the harness tolerance table.
#include <algorithm>
#include <exception>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "baracuda/ops/attention.hpp"
#include "core/testing/testing.hpp"

namespace baracuda::attention {
namespace {

using harness::Accuracy;
using harness::DemoRow;
using harness::Rng;
using harness::Target;
using harness::TestTensor;
using Vec = std::vector<double>;

struct Case {
  bool backward;
  DType dtype;
  int64_t b, hq, hk, lq, lk, d;
  Mask mask;
  int64_t page_size = 0;  // > 0: a paged cache, each sequence filled to its own length
};

// Short mask names so the demo table stays aligned.
std::string mask_name(const Mask& m) {
  if (m.is_none()) return "full";
  if (m == Mask::causal_top_left()) return "causal";
  if (m == Mask::causal_bottom_right()) return "causal_br";
  return "win" + std::to_string(m.left) + "," + std::to_string(m.right);
}

std::string describe(const Case& c) {
  return std::string(c.backward ? "bwd " : "fwd ") + std::string(name(c.dtype)) + " B" +
         std::to_string(c.b) + " Hq" + std::to_string(c.hq) + " Hk" + std::to_string(c.hk) + " L" +
         std::to_string(c.lq) + "x" + std::to_string(c.lk) + " D" + std::to_string(c.d) + " " +
         mask_name(c.mask) + (c.page_size > 0 ? " pg" + std::to_string(c.page_size) : "");
}

Descriptor descriptor(const Case& c, DType t) {
  Descriptor d;
  d.dtype = t;
  d.batch = c.b, d.heads_q = c.hq, d.heads_kv = c.hk, d.len_q = c.lq, d.len_k = c.lk;
  d.head_dim_qk = c.d, d.head_dim_v = c.d;
  d.mask = c.mask;
  if (c.page_size > 0) {  // the pool holds every sequence's pages, and the counts say how full
    d.page_size = c.page_size, d.pages = c.b * ((c.lk + c.page_size - 1) / c.page_size);
    d.seqused_k = true;
  }
  return d;
}

// A paged case's cache: sequence b filled to lk - 7 b keys (at least 1), its pages handed out in
// reverse order so that no sequence's pages are adjacent.
struct PagedCache {
  std::vector<int32_t> used, table;
};
PagedCache paged_cache(const Case& c) {
  PagedCache pc;
  const int64_t cols = (c.lk + c.page_size - 1) / c.page_size, pages = c.b * cols;
  for (int64_t b = 0; b < c.b; ++b)
    pc.used.push_back(static_cast<int32_t>(std::max<int64_t>(1, c.lk - 7 * b)));
  for (int64_t i = 0; i < pages; ++i) pc.table.push_back(static_cast<int32_t>(pages - 1 - i));
  return pc;
}

std::vector<int64_t> dims(const int64_t* d, int r) {
  return {d, d + r};
}

// A dense f64 host tensor: the reference plan's operand.
struct Dense {
  Vec data;
  std::vector<int64_t> shape;
  Dense(std::vector<int64_t> s, Vec v = {}) : data(std::move(v)), shape(std::move(s)) {
    data.resize(static_cast<size_t>(harness::numel_of(shape)), 0.0);
  }
  Tensor view() { return make_tensor(data.data(), DType::f64, std::span<const int64_t>(shape)); }
  ConstTensor cview() { return as_const(view()); }
};

// The float64 reference: the family's CPU plan on f64 copies of the inputs.
struct Oracle {
  Descriptor desc;
  Shapes s;
  explicit Oracle(const Case& c) : desc(descriptor(c, DType::f64)) {}
  Status init() {
    auto p = ForwardOp::make_problem(desc);
    if (!p.ok()) return p.error();
    s = shapes_of(*p);
    return ok_status();
  }
  Result<std::pair<Vec, Vec>> forward(const Vec& q, const Vec& k, const Vec& v,
                                      const PagedCache* paged = nullptr) {
    const int r = s.rank_qkv;
    Dense tq(dims(s.q, r), q), tk(dims(s.k, r), k), tv(dims(s.v, r), v);
    Dense y(dims(s.y, r)), lse(dims(s.lse, s.rank_lse));
    auto plan = ForwardPlan::select(Stream::cpu(), desc);
    if (!plan.ok()) return plan.error();
    ForwardArguments a{tq.cview(), tk.cview(), tv.cview(), y.view(), lse.view(), {}, {}};
    if (paged) {
      const int64_t nb[] = {desc.batch};
      a.seqused_k = make_tensor(static_cast<const void*>(paged->used.data()), DType::i32, nb);
      a.block_table = make_tensor(static_cast<const void*>(paged->table.data()), DType::i32,
                                  std::span<const int64_t>(s.block_table, 2));
    }
    if (auto st = plan->run(Stream::cpu(), Workspace::none(), a); !st.ok()) return st.error();
    return std::pair{std::move(y.data), std::move(lse.data)};
  }
  struct Grads {
    Vec dq, dk, dv;
  };
  Result<Grads> backward(const Vec& q, const Vec& k, const Vec& v, const Vec& y, const Vec& dy,
                         const Vec& lse) {
    const int r = s.rank_qkv;
    Dense tq(dims(s.q, r), q), tk(dims(s.k, r), k), tv(dims(s.v, r), v);
    Dense ty(dims(s.y, r), y), tdy(dims(s.y, r), dy), tl(dims(s.lse, s.rank_lse), lse);
    Dense gq(dims(s.q, r)), gk(dims(s.k, r)), gv(dims(s.v, r));
    auto plan = BackwardPlan::select(Stream::cpu(), desc);
    if (!plan.ok()) return plan.error();
    if (auto st = plan->run(Stream::cpu(), Workspace::none(),
                            {tq.cview(),
                             tk.cview(),
                             tv.cview(),
                             ty.cview(),
                             tdy.cview(),
                             tl.cview(),
                             gq.view(),
                             gk.view(),
                             gv.view(),
                             {},
                             {}});
        !st.ok())
      return st.error();
    return Grads{std::move(gq.data), std::move(gk.data), std::move(gv.data)};
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

DemoRow run_forward(Target target, const Case& c, Rng& rng) {
  DemoRow row{"attention", describe(c), "", 0, 0, false, ""};
  const Stream& stream = harness::stream_for(target);
  auto plan = ForwardPlan::select(stream, descriptor(c, c.dtype));
  if (!plan.ok()) return harness::failed_row(row, plan.error());
  row.kernel = plan->sku().name;
  const Shapes s = shapes_of(plan->problem());
  const DType lse_t = plan->problem().lse_dtype;
  const int r = s.rank_qkv;
  auto mk = [&](DType t, std::vector<int64_t> shape) {
    return TestTensor::make(t, std::move(shape), target);
  };
  TestTensor q = mk(c.dtype, dims(s.q, r)), k = mk(c.dtype, dims(s.k, r)),
             v = mk(c.dtype, dims(s.v, r)), y = mk(c.dtype, dims(s.y, r)),
             lse = mk(lse_t, dims(s.lse, s.rank_lse));
  q.fill_random(rng, -2, 2);
  k.fill_random(rng, -2, 2);
  v.fill_random(rng);
  ForwardArguments args{q.cview(), k.cview(), v.cview(), y.view(), lse.view(), {}, {}};
  std::optional<PagedCache> paged;
  std::optional<TestTensor> used, table;
  if (c.page_size > 0) {
    paged = paged_cache(c);
    used.emplace(mk(DType::i32, {c.b}));
    used->set_values(Vec(paged->used.begin(), paged->used.end()));
    table.emplace(mk(DType::i32, dims(s.block_table, 2)));
    table->set_values(Vec(paged->table.begin(), paged->table.end()));
    args.seqused_k = used->cview(), args.block_table = table->cview();
  }
  Scratch scratch;
  auto ws = scratch.get(plan->workspace_size(), target);
  if (!ws.ok()) return harness::failed_row(row, ws.error());
  y.poison();
  lse.poison();
  (void)lse.bytes();  // waits for the uploads (pageable copies) before the non-blocking stream runs
  if (auto st = plan->run(stream, *ws, args); !st.ok()) return harness::failed_row(row, st.error());
  Oracle o(c);
  if (auto st = o.init(); !st.ok()) return harness::failed_row(row, st.error());
  auto ref = o.forward(q.values(), k.values(), v.values(), paged ? &*paged : nullptr);
  if (!ref.ok()) return harness::failed_row(row, ref.error());
  row.pass = true;
  harness::check_output(row, y.values(), ref->first, c.dtype, Accuracy::reduction, "y");
  harness::check_output(row, lse.values(), ref->second, lse_t, Accuracy::reduction, "lse");
  return row;
}

DemoRow run_backward(Target target, const Case& c, Rng& rng) {
  DemoRow row{"attention", describe(c), "", 0, 0, false, ""};
  const Stream& stream = harness::stream_for(target);
  auto plan = BackwardPlan::select(stream, descriptor(c, c.dtype));
  if (!plan.ok()) return harness::failed_row(row, plan.error());
  row.kernel = plan->sku().name;
  const Shapes s = shapes_of(plan->problem());
  const DType lse_t = plan->problem().lse_dtype;
  const int r = s.rank_qkv;
  auto mk = [&](DType t, std::vector<int64_t> shape) {
    return TestTensor::make(t, std::move(shape), target);
  };
  TestTensor q = mk(c.dtype, dims(s.q, r)), k = mk(c.dtype, dims(s.k, r)),
             v = mk(c.dtype, dims(s.v, r)), y = mk(c.dtype, dims(s.y, r)),
             dy = mk(c.dtype, dims(s.y, r)), lse = mk(lse_t, dims(s.lse, s.rank_lse)),
             dq = mk(c.dtype, dims(s.q, r)), dk = mk(c.dtype, dims(s.k, r)),
             dv = mk(c.dtype, dims(s.v, r));
  q.fill_random(rng, -2, 2);
  k.fill_random(rng, -2, 2);
  v.fill_random(rng);
  dy.fill_random(rng);
  Oracle o(c);
  if (auto st = o.init(); !st.ok()) return harness::failed_row(row, st.error());
  {  // Y and LSE as the forward saves them (rounded to their storage types).
    auto fwd = o.forward(q.values(), k.values(), v.values());
    if (!fwd.ok()) return harness::failed_row(row, fwd.error());
    y.set_values(fwd->first);
    lse.set_values(fwd->second);
  }
  Scratch scratch;
  auto ws = scratch.get(plan->workspace_size(), target);
  if (!ws.ok()) return harness::failed_row(row, ws.error());
  dq.poison();
  dk.poison();
  dv.poison();
  (void)dv.bytes();  // waits for the uploads before the non-blocking stream runs
  if (auto st = plan->run(stream, *ws,
                          {q.cview(),
                           k.cview(),
                           v.cview(),
                           y.cview(),
                           dy.cview(),
                           lse.cview(),
                           dq.view(),
                           dk.view(),
                           dv.view(),
                           {},
                           {}});
      !st.ok())
    return harness::failed_row(row, st.error());
  auto g = o.backward(q.values(), k.values(), v.values(), y.values(), dy.values(), lse.values());
  if (!g.ok()) return harness::failed_row(row, g.error());
  row.pass = true;
  harness::check_output(row, dq.values(), g->dq, c.dtype, Accuracy::reduction, "dq");
  harness::check_output(row, dk.values(), g->dk, c.dtype, Accuracy::reduction, "dk");
  harness::check_output(row, dv.values(), g->dv, c.dtype, Accuracy::reduction, "dv");
  return row;
}

DemoRow run_case(Target target, const Case& c, Rng& rng) {
  try {  // an exception becomes a failed row, never a crash of the demo
    return c.backward ? run_backward(target, c, rng) : run_forward(target, c, rng);
  } catch (const std::exception& e) {
    return {"attention", describe(c), "", 0, 0, false, std::string("exception: ") + e.what()};
  }
}

std::vector<DemoRow> attention_demo(Target target) {
  Rng rng(harness::base_seed() ^ 0xa77eull);
  const std::vector<Case> cases = {
      {false, DType::bf16, 2, 8, 2, 64, 64, 64, Mask::causal_top_left()},      // GQA 4, causal
      {false, DType::f32, 1, 3, 1, 17, 40, 32, Mask::none()},                  // MQA, Lq != Lk
      {false, DType::bf16, 1, 4, 4, 33, 33, 128, Mask::sliding_window(8, 0)},  // local window
      {true, DType::bf16, 1, 4, 2, 24, 40, 64, Mask::causal_bottom_right()},   // GQA 2, causal
      {true, DType::f32, 2, 2, 2, 17, 17, 32, Mask::none()},
      // a decode step of 3 sequences over a 16-key-page cache filled to 300, 293 and 286 keys
      {false, DType::bf16, 3, 8, 2, 1, 300, 128, Mask::causal_bottom_right(), 16},
  };
  std::vector<DemoRow> rows;
  for (const Case& c : cases) rows.push_back(run_case(target, c, rng));
  return rows;
}

[[maybe_unused]] const bool registered = harness::register_demo("attention", attention_demo);

}  // namespace
}  // namespace baracuda::attention
