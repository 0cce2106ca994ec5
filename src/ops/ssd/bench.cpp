// Benchmarks of the ssd family: the Mamba-2 2.7B layer shape (B=4 L=4096 H=80 D=64 N=128 G=1) and
// a smaller one (B=8 L=2048 H=32 D=64 N=64 G=1), bf16, chunk 256, forward and backward, plus the
// decode step on a state of 80 Mi f32 elements. First what `select` picks (fused_mma forward, its
// walks cut into segments where that shortens the waves; chunked_mma_fastpass backward), the
// forward uncut (fused_mma by name), the forward at chunks 128 and 64 (case name + "_chunk<Q>"),
// then A/B rows under the same case names: forward chunked_mma_fastpass, chunked_wmma_fastpass,
// chunked_wmma and chunked_wmma_vec, backward chunked_wmma_vec_fastpass, chunked_wmma_vec and
// chunked_f32 on both shapes and the old recurrent_deterministic_f32 on the small one. peers.py
// times the same case names on the mamba_ssm Triton kernels.
//
// BARACUDA_SSD_STAGES=1 adds, before each forward/backward row, one row per launch of the chosen
// kernel (op "<op>_stage", note "stage <name>", ms = median over 5 runs, each run timed by the
// launcher's own events, see ssd::StageSink) and a "total" row (the sum of the medians). The
// timed rows above them are taken with the timing off, so they are unaffected.
//
// FLOPs (the algorithm's useful work, per chunk of length Q, counted the same for every peer):
//   C.B^T on the causal half, per group:   Q(Q+1)/2 * N multiply-adds
//   (C.B^T masked) . X, per head:          Q(Q+1)/2 * D
//   chunk states X^T . B, per head:        Q * D * N
//   C . state, per head:                   Q * D * N
// times 2 for a multiply-add; the backward is counted as twice the forward. Bytes: inputs read
// once + outputs written once (workspace traffic not counted).
#include <algorithm>
#include <map>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "baracuda/ops/ssd.hpp"
#include "core/bench/bench.hpp"

namespace baracuda::ssd {
namespace {

using bench::random_buffer;

Tensor view(const Buffer& b, DType t, std::vector<int64_t> shape) {
  return make_tensor(b.data(), t, shape, b.where(), static_cast<int64_t>(b.bytes()));
}

bool stages_requested() {
  return bench::env("BARACUDA_SSD_STAGES") == "1";
}

// Collects the launcher's per-stage times (launch order kept) over several runs.
class StageCollector final : public StageSink {
 public:
  void stage(std::string_view, std::string_view, std::string_view stage, float ms) override {
    auto it =
        std::find_if(rows_.begin(), rows_.end(), [&](const auto& r) { return r.first == stage; });
    if (it == rows_.end()) it = rows_.insert(rows_.end(), {std::string(stage), {}});
    it->second.push_back(ms);
  }
  std::vector<std::pair<std::string, std::vector<float>>> rows_;
};

// Runs `fn` `runs` times with a collector installed and emits one row per stage (median ms).
template <class Fn>
void emit_stages(const Stream& s, const std::string& op, const std::string& name,
                 const std::string& kernel, Fn&& fn) {
  constexpr int kRuns = 5;
  StageCollector col;
  set_stage_sink(&col);
  Status st;
  for (int i = 0; i < kRuns && st.ok(); ++i) st = fn();
  set_stage_sink(nullptr);
  if (!st.ok()) return bench::emit_error("ssd", op + "_stage", name, st.error());
  double total = 0;
  for (auto& [stage, v] : col.rows_) {
    std::sort(v.begin(), v.end());
    const double med = v[v.size() / 2];
    total += med;
    bench::emit(s, {.family = "ssd",
                    .op = op + "_stage",
                    .name = name,
                    .dtype = "bf16",
                    .kernel = kernel,
                    .ms = med,
                    .note = "stage " + stage});
  }
  bench::emit(s, {.family = "ssd",
                  .op = op + "_stage",
                  .name = name,
                  .dtype = "bf16",
                  .kernel = kernel,
                  .ms = total,
                  .note = "stage total"});
}

struct Case {
  std::string name;
  int64_t B, L, H, D, N, G, Q;
};

double forward_flops(const Case& c) {
  const double tokens = static_cast<double>(c.B * c.L), q = static_cast<double>(c.Q);
  const double tri = (q + 1) / 2;  // per token: causal half of a Q-long chunk
  return 2 * tokens * (c.G * tri * c.N + c.H * (tri * c.D + 2.0 * c.D * c.N));
}

// `kernel_pref`: empty for the plan `select` picks, else that kernel, whose rows are named
// "<case>@<kernel>" (A/B rows: the peers' ratio belongs to the default's row alone).
void run_prefill(const Stream& s, const Case& c, bool backward, std::string_view kernel_pref = {}) {
  const std::string op = backward ? "ssd_backward" : "ssd_forward";
  const std::string row = kernel_pref.empty() ? c.name : c.name + "@" + std::string(kernel_pref);
  auto fail = [&](const Error& e) { bench::emit_error("ssd", op, row, e); };
  const DType t = DType::bf16;
  Descriptor d{.batch = c.B,
               .seqlen = c.L,
               .heads = c.H,
               .head_dim = c.D,
               .state_dim = c.N,
               .ngroups = c.G,
               .chunk_size = c.Q,
               .dtype = t};
  const int64_t nx = c.B * c.L * c.H * c.D, ndt = c.B * c.L * c.H, nbc = c.B * c.L * c.G * c.N;
  auto x = random_buffer(s, t, nx, 1, -1, 1), dt = random_buffer(s, t, ndt, 2, 0.005, 0.1),
       A = random_buffer(s, DType::f32, c.H, 3, -2, -0.5), Bm = random_buffer(s, t, nbc, 4, -1, 1),
       Cm = random_buffer(s, t, nbc, 5, -1, 1);
  for (auto* b : {&x, &dt, &A, &Bm, &Cm})
    if (!b->ok()) return fail(b->error());
  const ConstTensor xv = as_const(view(*x, t, {c.B, c.L, c.H, c.D}));
  const ConstTensor dtv = as_const(view(*dt, t, {c.B, c.L, c.H}));
  const ConstTensor Av = as_const(view(*A, DType::f32, {c.H}));
  const ConstTensor Bv = as_const(view(*Bm, t, {c.B, c.L, c.G, c.N}));
  const ConstTensor Cv = as_const(view(*Cm, t, {c.B, c.L, c.G, c.N}));
  const double eb = 2.0;
  const PlanPreference pref =
      kernel_pref.empty() ? PlanPreference::fastest() : PlanPreference::kernel(kernel_pref);
  Result<bench::Timing> timing = Error::invalid("not run");
  std::string kernel;
  double bytes = 0, flops = forward_flops(c);
  if (!backward) {
    auto plan = SsdForwardPlan::select(s, d, pref);
    if (!plan.ok()) return fail(plan.error());
    auto y = Buffer::allocate(static_cast<size_t>(nx * 2), s.memory_location());
    auto ws = Buffer::allocate(std::max<size_t>(plan->workspace_size(), 1), s.memory_location());
    if (!y.ok()) return fail(y.error());
    if (!ws.ok()) return fail(ws.error());
    SsdForwardOp::Arguments args{
        .y = view(*y, t, {c.B, c.L, c.H, c.D}), .x = xv, .dt = dtv, .A = Av, .B = Bv, .C = Cv};
    timing = bench::time_it(s, [&](int) { return plan->run(s, ws->as_workspace(), args); });
    kernel = plan->sku().name;
    bytes = eb * static_cast<double>(2 * nx + ndt + 2 * nbc) + 4.0 * c.H;
    if (timing.ok() && stages_requested())
      emit_stages(s, op, row, kernel, [&] { return plan->run(s, ws->as_workspace(), args); });
  } else {
    auto plan = SsdBackwardPlan::select(s, d, pref);
    if (!plan.ok()) return fail(plan.error());
    auto dy = random_buffer(s, t, nx, 6, -1, 1);
    auto dx = Buffer::allocate(static_cast<size_t>(nx * 2), s.memory_location());
    auto ddt = Buffer::allocate(static_cast<size_t>(ndt * 2), s.memory_location());
    auto dA = Buffer::allocate(static_cast<size_t>(c.H * 4), s.memory_location());
    auto dB = Buffer::allocate(static_cast<size_t>(nbc * 2), s.memory_location());
    auto dC = Buffer::allocate(static_cast<size_t>(nbc * 2), s.memory_location());
    auto ws = Buffer::allocate(std::max<size_t>(plan->workspace_size(), 1), s.memory_location());
    for (auto* b : {&dy, &dx, &ddt, &dA, &dB, &dC, &ws})
      if (!b->ok()) return fail(b->error());
    SsdBackwardOp::Arguments args{.x = xv,
                                  .dt = dtv,
                                  .A = Av,
                                  .B = Bv,
                                  .C = Cv,
                                  .dy = as_const(view(*dy, t, {c.B, c.L, c.H, c.D})),
                                  .dx = view(*dx, t, {c.B, c.L, c.H, c.D}),
                                  .ddt = view(*ddt, t, {c.B, c.L, c.H}),
                                  .dA = view(*dA, DType::f32, {c.H}),
                                  .dB = view(*dB, t, {c.B, c.L, c.G, c.N}),
                                  .dC = view(*dC, t, {c.B, c.L, c.G, c.N})};
    timing = bench::time_it(
        s, [&](int) { return plan->run(s, ws->as_workspace(), args); }, 1,
        kernel_pref == "recurrent_deterministic_f32" ? 10 : 30, 1);
    kernel = plan->sku().name;
    bytes = eb * static_cast<double>(4 * nx + 2 * ndt + 4 * nbc);
    flops *= 2;
    if (timing.ok() && stages_requested())
      emit_stages(s, op, row, kernel, [&] { return plan->run(s, ws->as_workspace(), args); });
  }
  if (!timing.ok()) return fail(timing.error());
  bench::emit(s, {.family = "ssd",
                  .op = op,
                  .name = row,
                  .dtype = "bf16",
                  .kernel = kernel,
                  .ms = timing->median_ms,
                  .bytes = bytes,
                  .flops = flops,
                  .note = "chunk " + std::to_string(c.Q)});
}

void run_decode(const Stream& s) {
  const std::string name = "B128_H80_D64_N128";
  auto fail = [&](const Error& e) { bench::emit_error("ssd", "ssd_decode", name, e); };
  const int64_t B = 128, H = 80, D = 64, N = 128, G = 1;
  const DType t = DType::bf16;
  auto plan = SsdDecodePlan::select(
      s, {.batch = B, .heads = H, .head_dim = D, .state_dim = N, .ngroups = G, .dtype = t});
  if (!plan.ok()) return fail(plan.error());
  auto state = random_buffer(s, DType::f32, B * H * D * N, 7, -1, 1);
  auto x = random_buffer(s, t, B * H * D, 8, -1, 1), dt = random_buffer(s, t, B * H, 9, 0.005, 0.1),
       A = random_buffer(s, DType::f32, H, 10, -2, -0.5),
       Bm = random_buffer(s, t, B * G * N, 11, -1, 1),
       Cm = random_buffer(s, t, B * G * N, 12, -1, 1);
  auto y = Buffer::allocate(static_cast<size_t>(B * H * D * 2), s.memory_location());
  for (auto* b : {&state, &x, &dt, &A, &Bm, &Cm, &y})
    if (!b->ok()) return fail(b->error());
  SsdDecodeOp::Arguments args{.state = view(*state, DType::f32, {B, H, D, N}),
                              .y = view(*y, t, {B, H, D}),
                              .x = as_const(view(*x, t, {B, H, D})),
                              .dt = as_const(view(*dt, t, {B, H})),
                              .A = as_const(view(*A, DType::f32, {H})),
                              .B = as_const(view(*Bm, t, {B, G, N})),
                              .C = as_const(view(*Cm, t, {B, G, N}))};
  auto timing = bench::time_it(s, [&](int) { return plan->run(s, Workspace::none(), args); });
  if (!timing.ok()) return fail(timing.error());
  const double bytes = 8.0 * static_cast<double>(B * H * D * N) + 2.0 * 2 * B * H * D;
  bench::emit(s, {.family = "ssd",
                  .op = "ssd_decode",
                  .name = name,
                  .dtype = "bf16",
                  .kernel = std::string(plan->sku().name),
                  .ms = timing->median_ms,
                  .bytes = bytes,
                  .flops = 0,
                  .note = "state f32 read + written in place"});
}

// The forward's default at the other chunk lengths (its work falls with the chunk: the
// intra-chunk products are Q/2 per token), as "<case>_chunk<Q>".
void forward_other_chunks(const Stream& s, std::span<const Case> cases) {
  for (const Case& c : cases)
    for (int64_t q : {128, 64}) {
      Case other = c;
      other.Q = q;
      other.name += "_chunk" + std::to_string(q);
      run_prefill(s, other, false);
    }
}

// fused_mma cut by the rule (the default at chunks 128 and 256 before fused_wgmma_sm90a took them
// on sm_90a), as "<case>@fused_mma_ranked_ahead" and "<case>_chunk128@fused_mma_ranked_ahead".
void forward_mma_rows(const Stream& s, std::span<const Case> cases) {
  for (const Case& c : cases) {
    run_prefill(s, c, false, "fused_mma_ranked_ahead");
    Case w = c;
    w.Q = 128;
    w.name += "_chunk128";
    run_prefill(s, w, false, "fused_mma_ranked_ahead");
  }
}

void bench_ssd(const Stream& s) {
  const Case cases[] = {{"B4_L4096_H80_D64_N128_G1", 4, 4096, 80, 64, 128, 1, 256},
                        {"B8_L2048_H32_D64_N64_G1", 8, 2048, 32, 64, 64, 1, 256}};
  // BARACUDA_SSD_ONLY=forward / backward: the selected plan's rows of that direction only (quick
  // A/B runs of one kernel); forward adds the other chunk lengths and chunked_mma_fastpass.
  const std::string_view only = bench::env("BARACUDA_SSD_ONLY");
  if (!only.empty()) {
    for (const Case& c : cases) run_prefill(s, c, only == "backward");
    if (only == "backward")  // the default's walks against their chunk-parallel passes
      for (const Case& c : cases) run_prefill(s, c, true, "chunked_mma_fastpass");
    if (only == "forward") {
      for (const Case& c : cases) run_prefill(s, c, false, "fused_mma");
      forward_other_chunks(s, cases);
      forward_mma_rows(s, cases);
      for (const Case& c : cases) run_prefill(s, c, false, "chunked_mma_fastpass");
    }
    return;
  }
  for (const Case& c : cases) run_prefill(s, c, false);               // the default forward (bf16)
  for (const Case& c : cases) run_prefill(s, c, true);                // the default backward (bf16)
  for (const Case& c : cases) run_prefill(s, c, false, "fused_mma");  // the walks uncut
  forward_other_chunks(s, cases);
  forward_mma_rows(s, cases);
  for (const Case& c : cases) run_prefill(s, c, false, "chunked_mma_fastpass");
  // A/B rows ("<case>@<kernel>"): the backward's inter-chunk passes chunk-parallel (the default
  // walks them on sm_90a); the forward with the WMMA products, without the fast
  // inter-chunk pass, and with 16-byte operand staging (bitwise equal results); the backward
  // without the fast passes, on f32 SIMT tiles, and the old recurrent kernel on the small case
  // only (245 ms on the large one).
  for (const Case& c : cases) run_prefill(s, c, true, "chunked_mma_fastpass");
  for (const Case& c : cases) run_prefill(s, c, false, "chunked_wmma_fastpass");
  for (const Case& c : cases) run_prefill(s, c, false, "chunked_wmma");
  for (const Case& c : cases) run_prefill(s, c, false, "chunked_wmma_vec");
  for (const Case& c : cases) run_prefill(s, c, true, "chunked_wmma_vec_fastpass");
  for (const Case& c : cases) run_prefill(s, c, true, "chunked_wmma_vec");
  for (const Case& c : cases) run_prefill(s, c, true, "chunked_f32");
  run_prefill(s, cases[1], true, "recurrent_deterministic_f32");
  run_decode(s);
}

[[maybe_unused]] const bool registered = bench::register_bench("ssd", bench_ssd);

}  // namespace
}  // namespace baracuda::ssd
