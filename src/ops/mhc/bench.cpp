// mHC benchmarks: 16384 tokens, n = 4 streams, C = 4096, f32 and bf16 (the issue's case). Case
// names are shared with peers.py. Bytes are the fewest each op must move (inputs read once,
// outputs written once), so % of the copy ceiling measured in the same run is the figure to read.
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "baracuda/ops/mhc.hpp"
#include "core/bench/bench.hpp"

namespace baracuda {
namespace {

constexpr const char* kFamily = "mhc";

ConstTensor cview(const Buffer& b, DType t, std::vector<int64_t> shape, const Stream& s) {
  return make_tensor(static_cast<const void*>(b.data()), t, shape, s.memory_location());
}
Tensor view(const Buffer& b, DType t, std::vector<int64_t> shape, const Stream& s) {
  return make_tensor(b.data(), t, shape, s.memory_location());
}

template <class Plan>
Result<Buffer> workspace_for(const Stream& s, const Plan& p) {
  return Buffer::allocate(std::max<size_t>(p.workspace_size(), 256), s.memory_location());
}

#define MHC_BENCH_TRY(expr, op)                                              \
  do {                                                                       \
    const auto& st_ = (expr);                                                \
    if (!st_.ok()) return bench::emit_error(kFamily, op, name, st_.error()); \
  } while (0)

void run_case(const Stream& s, DType dt) {
  const int64_t T = 16384, n = 4, C = 4096, K = (2 + n) * n;
  const std::string name = std::to_string(T) + "x" + std::to_string(n) + "x" + std::to_string(C) +
                           "_" + std::string(baracuda::name(dt));
  const double es = bits_of(dt) / 8.0;
  const double xb = static_cast<double>(T * n * C) * es, rowb = static_cast<double>(T * C) * es;
  auto x = bench::random_buffer(s, dt, T * n * C, 101, -1, 1);
  auto out = bench::random_buffer(s, dt, T * n * C, 102, -1, 1);
  auto f = bench::random_buffer(s, dt, T * C, 103, -1, 1);
  auto y = bench::random_buffer(s, dt, T * C, 104, -1, 1);
  auto gamma = bench::random_buffer(s, DType::bf16, C, 105, 0.5, 1.5);
  auto hp = bench::random_buffer(s, DType::f32, n, 106, -2, 2);
  auto hq = bench::random_buffer(s, DType::f32, n, 107, -2, 2);
  auto hr = bench::random_buffer(s, DType::f32, n * n, 108, -2, 2);
  auto fn = bench::random_buffer(s, DType::f32, K * n * C, 109, -0.01, 0.01);
  auto scale = bench::random_buffer(s, DType::f32, 3, 110, 0.5, 1.5);
  auto base = bench::random_buffer(s, DType::f32, K, 111, -1, 1);
  auto co = bench::random_buffer(s, DType::f32, T * K, 112, 0, 1);
  for (auto* b : {&x, &out, &f, &y, &gamma, &hp, &hq, &hr, &fn, &scale, &base, &co})
    if (!b->ok()) return bench::emit_error(kFamily, "alloc", name, b->error());
  MhcDescriptor d;
  d.tokens = T, d.n = n, d.channels = C, d.dtype = dt;
  const ConstTensor xv = cview(*x, dt, {T, n, C}, s);
  auto emit = [&](const char* op, const std::string& nm, const std::string& kernel, double ms,
                  double bytes, double flops, const std::string& note) {
    bench::emit(s, {.family = kFamily,
                    .op = op,
                    .name = nm,
                    .dtype = std::string(baracuda::name(dt)),
                    .kernel = kernel,
                    .ms = ms,
                    .bytes = bytes,
                    .flops = flops,
                    .note = note});
  };

  // The default (static_forward_staged where a token fits a block's shared memory), then the A/B
  // rows "<case>@<kernel>": the two-pass kernel (static_forward_fused) and one token per CTA from
  // registers (static_forward_regs).
  for (std::string_view pin : {std::string_view{}, std::string_view{"static_forward_fused"},
                               std::string_view{"static_forward_regs"}}) {
    d.h = MhcH::static_h;
    d.sinkhorn = {SinkhornInit::exp, SinkhornFirst::rows, 20, 1e-5};
    d.norm_eps = 1e-5;
    const std::string sname = pin.empty() ? name : name + "@" + std::string(pin);
    auto plan = MhcStaticForwardPlan::select(
        s, d, pin.empty() ? PlanPreference::fastest() : PlanPreference::kernel(pin));
    if (!plan.ok() && !pin.empty()) {  // a variant that does not fit this shape (2cta at f32)
      bench::emit_error(kFamily, "mhc_static_forward", sname, plan.error());
      continue;
    }
    MHC_BENCH_TRY(plan, "mhc_static_forward");
    auto ws = workspace_for(s, *plan);
    MHC_BENCH_TRY(ws, "mhc_static_forward");
    const MhcStaticForwardOp::Arguments a{
        view(*out, dt, {T, n, C}, s),       xv,
        cview(*gamma, DType::bf16, {C}, s), cview(*hp, DType::f32, {n}, s),
        cview(*hq, DType::f32, {n}, s),     cview(*hr, DType::f32, {n, n}, s)};
    auto t = bench::time_it(s, [&](int) { return plan->run(s, ws->as_workspace(), a); });
    MHC_BENCH_TRY(t, "mhc_static_forward");
    emit("mhc_static_forward", sname, std::string(plan->sku().name), t->median_ms, 2 * xb, 0,
         "read X + write out");
  }
  d.sinkhorn = SinkhornConfig{};
  d.norm_eps = 1e-6;
  for (MhcH h : {MhcH::static_h, MhcH::dynamic_h}) {
    d.h = h;
    const std::string nm0 = name + "_" + std::string(to_string(h)), nm = nm0;
    const int64_t rows = h == MhcH::static_h ? 1 : T;
    MhcParams w;
    if (h == MhcH::static_h) {
      w.h_pre = cview(*hp, DType::f32, {n}, s), w.h_post = cview(*hq, DType::f32, {n}, s);
      w.h_res = cview(*hr, DType::f32, {n, n}, s);
    } else {
      w.fn = cview(*fn, DType::f32, {K, n * C}, s), w.scale = cview(*scale, DType::f32, {3}, s);
      w.base = cview(*base, DType::f32, {K}, s);
    }
    // Dynamic H also runs pinned to every other kernel (the default is the 16-CTA one-pass kernel,
    // 32-token tiles for bf16): split-K with its logits on tensor cores
    // ("@collapse_split_tf32"), on CUDA cores ("<case>@collapse"), the one-pass
    // cluster kernel with and without its staggered start ("@collapse_dynamic_cluster",
    // "@collapse_dynamic_cluster_lockstep") and with its products on tensor cores
    // ("@collapse_dynamic_cluster_tf32"), and the 16-CTA one with 16- and 32-token tiles
    // ("@collapse_dynamic_push16_tf32", "@collapse_dynamic_push32_tf32"): the A/B rows.
    for (std::string_view pin :
         {std::string_view{}, std::string_view{"collapse_split_tf32"}, std::string_view{"collapse"},
          std::string_view{"collapse_dynamic_cluster"},
          std::string_view{"collapse_dynamic_cluster_lockstep"},
          std::string_view{"collapse_dynamic_cluster_tf32"},
          std::string_view{"collapse_dynamic_push16_tf32"},
          std::string_view{"collapse_dynamic_push32_tf32"}}) {
      if (!pin.empty() && h == MhcH::static_h) continue;
      const std::string cname = pin.empty() ? nm0 : nm0 + "@" + std::string(pin);
      auto plan = MhcCollapsePlan::select(
          s, d, pin.empty() ? PlanPreference::fastest() : PlanPreference::kernel(pin));
      if (!plan.ok() && !pin.empty()) {  // a variant that does not fit (the sm_90 ones on sm_80)
        bench::emit_error(kFamily, "mhc_collapse", cname, plan.error());
        continue;
      }
      MHC_BENCH_TRY(plan, "mhc_collapse");
      auto ws = workspace_for(s, *plan);
      MHC_BENCH_TRY(ws, "mhc_collapse");
      const MhcCollapseOp::Arguments a{view(*y, dt, {T, C}, s), view(*co, DType::f32, {rows, K}, s),
                                       xv, w};
      auto t = bench::time_it(s, [&](int) { return plan->run(s, ws->as_workspace(), a); });
      MHC_BENCH_TRY(t, "mhc_collapse");
      const double flops = h == MhcH::dynamic_h ? 2.0 * T * K * n * C : 2.0 * T * n * C;
      emit("mhc_collapse", cname, std::string(plan->sku().name), t->median_ms, xb + rowb, 0,
           h == MhcH::dynamic_h ? "read X + write y; includes the [T, nC] x [nC, 24] product (" +
                                      std::to_string(flops / t->median_ms / 1e9) + " TFLOP/s)"
                                : "read X + write y");
    }
    {
      auto plan = MhcExpandPlan::select(s, d);
      MHC_BENCH_TRY(plan, "mhc_expand");
      const MhcExpandOp::Arguments a{view(*out, dt, {T, n, C}, s), xv, cview(*f, dt, {T, C}, s),
                                     cview(*co, DType::f32, {rows, K}, s)};
      auto t = bench::time_it(s, [&](int) { return plan->run(s, Workspace::none(), a); });
      MHC_BENCH_TRY(t, "mhc_expand");
      emit("mhc_expand", nm, std::string(plan->sku().name), t->median_ms, 2 * xb + rowb, 0,
           "read X, F_out + write out");
    }
    {  // expand backward: read dout, X, F_out; write dX, dF (dcoeffs is tiny)
      auto plan = MhcExpandBackwardPlan::select(s, d);
      MHC_BENCH_TRY(plan, "mhc_expand_backward");
      auto ws = workspace_for(s, *plan);
      MHC_BENCH_TRY(ws, "mhc_expand_backward");
      auto dx = Buffer::allocate(static_cast<size_t>(xb), s.memory_location());
      auto dco = Buffer::allocate(static_cast<size_t>(T * K * 4), s.memory_location());
      MHC_BENCH_TRY(dx, "mhc_expand_backward");
      MHC_BENCH_TRY(dco, "mhc_expand_backward");
      const MhcExpandBackwardOp::Arguments a{view(*dx, dt, {T, n, C}, s),
                                             view(*y, dt, {T, C}, s),
                                             view(*dco, DType::f32, {rows, K}, s),
                                             cview(*out, dt, {T, n, C}, s),
                                             xv,
                                             cview(*f, dt, {T, C}, s),
                                             cview(*co, DType::f32, {rows, K}, s)};
      auto t = bench::time_it(s, [&](int) { return plan->run(s, ws->as_workspace(), a); });
      MHC_BENCH_TRY(t, "mhc_expand_backward");
      emit("mhc_expand_backward", nm, std::string(plan->sku().name), t->median_ms,
           3 * xb + 2 * rowb, 0, "read dout, X, F_out + write dX, dF");
    }
    {  // collapse backward: read X, dy; write dX (+ parameter gradients)
      auto plan = MhcCollapseBackwardPlan::select(s, d);
      MHC_BENCH_TRY(plan, "mhc_collapse_backward");
      auto ws = workspace_for(s, *plan);
      MHC_BENCH_TRY(ws, "mhc_collapse_backward");
      auto dx = Buffer::allocate(static_cast<size_t>(xb), s.memory_location());
      auto dfn = Buffer::allocate(static_cast<size_t>(K * n * C * 4), s.memory_location());
      auto small = Buffer::allocate(4096, s.memory_location());
      MHC_BENCH_TRY(dx, "mhc_collapse_backward");
      MHC_BENCH_TRY(dfn, "mhc_collapse_backward");
      MHC_BENCH_TRY(small, "mhc_collapse_backward");
      MhcParamGrads g;
      float* sp = static_cast<float*>(small->data());
      if (h == MhcH::static_h) {
        g.h_pre = make_tensor(sp, DType::f32, {n}, s.memory_location());
        g.h_post = make_tensor(sp + 64, DType::f32, {n}, s.memory_location());
        g.h_res = make_tensor(sp + 128, DType::f32, {n, n}, s.memory_location());
      } else {
        g.fn = view(*dfn, DType::f32, {K, n * C}, s);
        g.scale = make_tensor(sp, DType::f32, {3}, s.memory_location());
        g.base = make_tensor(sp + 64, DType::f32, {K}, s.memory_location());
      }
      const MhcCollapseBackwardOp::Arguments a{
          view(*dx, dt, {T, n, C}, s),          g,  cview(*f, dt, {T, C}, s),
          cview(*co, DType::f32, {rows, K}, s), xv, w};
      auto t = bench::time_it(s, [&](int) { return plan->run(s, ws->as_workspace(), a); });
      MHC_BENCH_TRY(t, "mhc_collapse_backward");
      emit("mhc_collapse_backward", nm, std::string(plan->sku().name), t->median_ms, 2 * xb + rowb,
           0, "read X, dy + write dX");
    }
  }
}

void run_all(const Stream& s) {
  for (DType dt : {DType::f32, DType::bf16}) run_case(s, dt);
}

[[maybe_unused]] const bool registered = bench::register_bench(kFamily, run_all);

}  // namespace
}  // namespace baracuda
