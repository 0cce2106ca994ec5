// Benchmark of the cuDNN attention backend against the bespoke kernels, on the attention family's
// sweep (16k tokens, hidden 2048, bf16, head dim 64/128, L = 512..16k, causal and not).
//
// For every point it times the plan forced to cuDNN and the plan forced to the bespoke kernels,
// forward and backward, the sm_90a forward pinned by name (rows noted "fa3_sm90a",
// "fa3_sm90a_pingpong", "fa3_sm90a_exp2poly2of8", "fa3_sm90a_exp2poly3of8"), the sm_90a backward
// pinned by name (backward rows noted "fa3_sm90a"), and prints one
// {"table_point": ...} line per point and pass (cuDNN's, the bespoke kernel's and fa3_fwd_sm90a's
// / fa3_bwd_sm90a's TFLOP/s): the measurement src/ops/attention_hopper/make_table.py turns into
// selection_table.hpp. BARACUDA_ATTN_ROUNDS=<r> times those columns r times a point in rounds of
// alternating order (rows noted ", round <k>"), the point their medians
// (scripts/attention-table.sh: 3). The sweep runs under an empty SelectionTableOverride, so each
// column is its candidate alone whatever the shipped table says, and the bespoke column under one
// that picks bespoke (BespokePick: otherwise only(Backend::bespoke_cuda) would reach fa3's
// entries). BARACUDA_ATTN_SWEEP=quick limits the sweep to L in {1024, 4096, 16384},
// BARACUDA_ATTN_SWEEP=d128_l4096 to one non-causal point; BARACUDA_ATTN_KERNELS (below) to some
// fa3 instances or backward entries and the cuDNN control.
#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "baracuda/ops/attention.hpp"
#include "baracuda/ops/attention_hopper.hpp"
#include "core/bench/bench.hpp"
#include "core/testing/testing.hpp"
#include "ops/attention/common.hpp"

namespace baracuda::attention_hopper {
namespace {

constexpr int64_t kTokens = 16384, kHidden = 2048;

// Same case names as the attention family's bench.cpp and peers.py (scripts/report.py joins on
// family, op and name).
std::string case_name(int64_t batch, int64_t heads, int64_t l, int64_t d, bool causal) {
  return "b" + std::to_string(batch) + "_h" + std::to_string(heads) + "_l" + std::to_string(l) +
         "_d" + std::to_string(d) + (causal ? "_causal" : "");
}

// A point of the FlashAttention papers' sweep: MHA, Lq = Lk, causal top-left or no mask.
attention::Descriptor sweep_desc(DType t, int64_t batch, int64_t heads, int64_t l, int64_t d,
                                 bool causal) {
  attention::Descriptor desc;
  desc.dtype = t;
  desc.batch = batch;
  desc.heads_q = desc.heads_kv = heads;
  desc.len_q = desc.len_k = l;
  desc.head_dim_qk = desc.head_dim_v = d;
  desc.mask = causal ? attention::Mask::causal_top_left() : attention::Mask::none();
  return desc;
}

struct Buffers {
  harness::TestTensor q, k, v, dy;  // random, [tokens, hidden] worth of elements each
  Buffer y, lse, dq, dk, dv;
};

Tensor view4(void* p, int64_t b, int64_t h, int64_t l, int64_t d, DType t = DType::bf16) {
  const int64_t dims[] = {b, h, l, d};
  return make_tensor(p, t, dims, Location::cuda(0));
}

// The element type of the table sweeps (attention_hopper, attention_chunks) and attention_packed:
// bf16, or f16 with BARACUDA_ATTN_DTYPE=f16, so that the selection table can carry f16 points of
// its own (without them an f16 problem ranks cuDNN first wherever cuDNN runs).
DType sweep_dtype() {
  return bench::env("BARACUDA_ATTN_DTYPE") == "f16" ? DType::f16 : DType::bf16;
}

struct Measured {
  double ms = 0;
  std::string kernel;
  bool ok = false;
};

// Times `run` with enough reps for ~0.3 s per case (fast kernels get 30, slow ones 3); a kernel
// slower than 100 ms per call is reported from one timed call so the sweep fits its time budget.
Measured time_case(const Stream& s, const std::function<Status(int)>& run) {
  Measured m;
  auto once = bench::time_it(s, run, 1, 1, 1);
  if (!once.ok()) return m;
  if (once->median_ms > 100) return {once->median_ms, "", true};
  const int reps = static_cast<int>(std::clamp(300.0 / std::max(once->median_ms, 1e-3), 3.0, 30.0));
  auto t = bench::time_it(s, run, 1, reps, 2);
  if (!t.ok()) return m;
  m.ms = t->median_ms;
  m.ok = true;
  return m;
}

// Emits one row of a timed plan (bf16 inputs unless said); its TFLOP/s.
double emit_row(const Stream& stream, std::string_view op, const std::string& name,
                std::string_view kernel, double ms, double bytes, double flops,
                const std::string& note, std::string_view dtype = "bf16") {
  bench::emit(stream, {.family = "attention",
                       .op = std::string(op),
                       .name = name,
                       .dtype = std::string(dtype),
                       .kernel = std::string(kernel),
                       .ms = ms,
                       .bytes = bytes,
                       .flops = flops,
                       .note = note});
  return flops / (ms * 1e9);
}

// Times one forward plan and emits its row; its TFLOP/s (0 if it failed).
double time_forward(const Stream& stream, const std::string& name, const attention::ForwardPlan& fp,
                    const attention::ForwardArguments& fa, double bytes, double flops,
                    const std::string& note, std::string_view dtype = "bf16") {
  auto ws = Buffer::allocate(std::max<size_t>(fp.workspace_size(), 16), Location::cuda(0));
  const Measured m = time_case(stream, [&](int) { return fp.run(stream, ws->as_workspace(), fa); });
  return m.ok ? emit_row(stream, "attention_forward", name, fp.sku().name, m.ms, bytes, flops, note,
                         dtype)
              : 0.0;
}

// Times one backward plan after `fwd` has written Y / LSE (as training does) and emits its row;
// its TFLOP/s (0 if it failed). `flops` counts the backward's own (2.5x the forward's).
double time_backward(const Stream& stream, const std::string& name,
                     const attention::ForwardPlan& fwd, const attention::ForwardArguments& fa,
                     const attention::BackwardPlan& bp, const attention::BackwardArguments& ba,
                     double bytes, double flops, const std::string& note,
                     std::string_view dtype = "bf16") {
  auto fws = Buffer::allocate(std::max<size_t>(fwd.workspace_size(), 16), Location::cuda(0));
  auto bws = Buffer::allocate(std::max<size_t>(bp.workspace_size(), 16), Location::cuda(0));
  if (!fwd.run(stream, fws->as_workspace(), fa).ok()) return 0.0;
  const Measured m =
      time_case(stream, [&](int) { return bp.run(stream, bws->as_workspace(), ba); });
  return m.ok ? emit_row(stream, "attention_backward", name, bp.sku().name, m.ms, bytes, flops,
                         note, dtype)
              : 0.0;
}

// fa3's column in the selection table: the instance its ranked-ahead entry launches for the problem
// (fa3_ranked_forward_kernel), the plain schedule where the descriptor makes none.
std::string_view fa3_table_instance(const attention::Descriptor& d) {
  const auto p = attention::ForwardOp::make_problem(d);
  return p.ok() ? fa3_ranked_forward_kernel(p.value()) : kFa3Kernel;
}
// The same for the backward (fa3_ranked_backward_kernel).
std::string_view fa3_table_bwd_instance(const attention::Descriptor& d) {
  const auto p = attention::BackwardOp::make_problem(d);
  return p.ok() ? fa3_ranked_backward_kernel(p.value()) : kFa3BwdKernel;
}

// The bespoke column (and the bespoke rows) stand for what a bespoke pick yields: the family's
// kernels. An empty table keeps fa3's ranked-ahead entries from them but not fa3's deterministic
// entries (bespoke CUDA too, they fit wherever the table does not pick bespoke): those stood in for
// the family's kernels at 19 of the sweep's 36 backward points of a table run (eighty-sixth
// session: d64 from L512, d128 from L2048). So they select under bespoke_pick_points (held here,
// since the override only refers to them).
class BespokePick {
 public:
  explicit BespokePick(DType t)
      : points_{bespoke_pick_points(t)}, table_{std::span<const TablePoint>{points_}} {}

 private:
  std::array<TablePoint, 4> points_;
  SelectionTableOverride table_;
};
// A bespoke row whose plan is one of fa3's entries (a row the family's kernels did not run): an
// error row instead of a timed one, so that no table column is an fa3 kernel under another name.
bool fa3_in_bespoke_column(const std::string& name, std::string_view op, std::string_view kernel) {
  if (!kernel.starts_with("fa3_")) return false;
  bench::emit_error("attention", std::string(op), name + "/bespoke",
                    Error::unsupported(std::string(op) + ": the bespoke column selected " +
                                       std::string(kernel) + ", not one of the family's kernels"));
  return true;
}

// A cuDNN row's note: the configuration that runs, and how many select() timed to pick it.
std::string cudnn_note(const Stream& s, const attention::Descriptor& d, Pass pass) {
  auto p = attention::ForwardOp::make_problem(d);
  if (!p.ok()) return "cudnn";
  const auto t = cudnn_tuning(*p, pass, false, s.device());
  if (!t) return "cudnn";
  const int64_t v = cudnn_loaded_version().value_or(0);  // 91900 -> 9.19.0
  return "cudnn " + std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." +
         std::to_string(v % 100) + " " + t->plan +
         (t->timed > 0 ? " (tuned over " + std::to_string(t->timed) + ")" : "");
}

// The table columns' rates over `rounds` rounds (the first already in `tf`): rounds 1, 2, .. time
// every column that ran again, forward then backward in column order, every other round in the
// reverse order; each rate becomes the median of its column's (a column that failed once stays
// 0, which the table reads as "did not run").
void column_tf_over_rounds(const std::function<double(const std::string&)> (&again)[2][3],
                           double (&tf)[2][3], int rounds) {
  std::vector<double> seen[2][3];
  for (int pass = 0; pass < 2; ++pass)
    for (int c = 0; c < 3; ++c) seen[pass][c].push_back(tf[pass][c]);
  for (int r = 1; r < rounds; ++r)
    for (int i = 0; i < 6; ++i) {
      const int k = r % 2 == 1 ? 5 - i : i, pass = k / 3, c = k % 3;
      if (again[pass][c] && tf[pass][c] > 0)
        seen[pass][c].push_back(again[pass][c](", round " + std::to_string(r)));
    }
  for (int pass = 0; pass < 2; ++pass)
    for (int c = 0; c < 3; ++c) {
      std::vector<double>& v = seen[pass][c];
      if (std::find(v.begin(), v.end(), 0.0) != v.end()) {
        tf[pass][c] = 0;
        continue;
      }
      std::sort(v.begin(), v.end());
      const size_t m = v.size() / 2;
      tf[pass][c] = v.size() % 2 == 1 ? v[m] : (v[m - 1] + v[m]) / 2;
    }
}

void sweep(const Stream& stream) {
  // BARACUDA_ATTENTION_ONLY=decode / paged_prefill / prefill (the attention family's decode-only
  // and prefill-only runs) skip this sweep.
  const std::string_view only = bench::env("BARACUDA_ATTENTION_ONLY");
  if (only == "decode" || only == "paged_prefill" || only == "prefill") return;
  // The candidates' columns run under an empty table; the default plan's rows under this one.
  const std::span<const TablePoint> shipped = selection_table();
  const SelectionTableOverride raw_candidates{std::span<const TablePoint>{}};
  harness::Rng rng(20261122);
  const int64_t n = kTokens * kHidden;
  const DType dt = sweep_dtype();
  const std::string dt_name(name(dt));
  auto make = [&] {
    auto t = harness::TestTensor::make(dt, {n}, harness::Target::cuda);
    t.fill_random(rng);
    return t;
  };
  auto alloc = [](size_t bytes) {
    return std::move(Buffer::allocate(bytes, Location::cuda(0))).value();
  };
  Buffers b{make(),       make(),       make(),
            make(),       alloc(n * 2), alloc(kTokens * 32 * 4 * 2),
            alloc(n * 2), alloc(n * 2), alloc(n * 2)};
  // BARACUDA_ATTN_SWEEP: "quick" (L in {1024, 4096, 16384}), "short" (L in {128, 256}: 128 and
  // 64 sequences of the 16k tokens, the table's short points below the sweep's L512), "l<L>,<L>.."
  // (those lengths, 16k tokens each: where a schedule stops paying), "d<D>_l<L>" (that one
  // non-causal point: profiling runs), "d<D>" (every length and mask at that head dim: A/B of one
  // head dim's schedules), anything else the whole sweep.
  const std::string sweep_env{bench::env("BARACUDA_ATTN_SWEEP")};
  const bool quick = sweep_env == "quick", short_lens = sweep_env == "short";
  std::vector<int64_t> listed_lens;
  if (sweep_env.starts_with("l"))
    for (size_t at = 1; at < sweep_env.size();) {
      const size_t comma = std::min(sweep_env.find(',', at), sweep_env.size());
      const long long l = std::atoll(sweep_env.substr(at, comma - at).c_str());
      if (l >= 16 && l <= 16384 && kTokens % l == 0) listed_lens.push_back(l);
      at = comma + 1;
    }
  long long only_d = 0, only_l = 0;
  if (std::sscanf(sweep_env.c_str(), "d%lld_l%lld", &only_d, &only_l) != 2) only_d = only_l = 0;
  long long dim_only = 0;
  if (only_d > 0 || std::sscanf(sweep_env.c_str(), "d%lld", &dim_only) != 1) dim_only = 0;
  // BARACUDA_ATTN_BH="<B>,<H>" with a one-point sweep: that batch and head count instead of the
  // sweep's 16k tokens x hidden 2048 (e.g. a grid of whole waves of CTAs against a ragged one),
  // within the buffers allocated here.
  long long only_b = 0, only_h = 0;
  if (only_d > 0 &&
      std::sscanf(std::string(bench::env("BARACUDA_ATTN_BH")).c_str(), "%lld,%lld", &only_b,
                  &only_h) == 2 &&
      (only_b < 1 || only_h < 1 || only_b * only_h * only_l * only_d > n ||
       only_b * only_h * only_l > kTokens * 64)) {
    std::fprintf(stderr, "BARACUDA_ATTN_BH: B %lld x H %lld x L %lld x D %lld does not fit\n",
                 only_b, only_h, only_l, only_d);
    return;
  }
  // BARACUDA_ATTENTION_ONLY=backward: cuDNN (forward and backward) and fa3_bwd_sm90a only, for
  // backward A/B runs.
  const bool backward_only = only == "backward";
  // BARACUDA_ATTENTION_ONLY=forward: the forward rows only (forward A/B runs).
  const bool forward_only = only == "forward";
  // BARACUDA_ATTN_ROUNDS=<r> (default 1): the table's columns (cuDNN, bespoke, fa3's instance;
  // forward and backward) timed r times at each point, in rounds of alternating order, each point
  // the median of its column's r rates. The SM clock falls under the power cap as a run heats
  // (H200, 700 W: 1980 MHz -> 1470-1700), so a column always timed after the others read up to 10%
  // slower than one timed first at the same clock state (sixtieth session, nvidia-smi beside the
  // rows); alternation gives every column the same mix of states.
  const int rounds = static_cast<int>(bench::env_positive("BARACUDA_ATTN_ROUNDS", 1));
  // BARACUDA_ATTN_KERNELS=<fa3 kernel names> (A/B runs of some fa3 forward instances or backward
  // entries, fa3_bwd_*, as the family's bench reads it and scripts/ab-builds.sh's AB_KERNELS sets
  // it): those and cuDNN (the control: its backward where a backward entry is named, its forward
  // unless BARACUDA_ATTENTION_ONLY=backward) alone, so that a device call fits more repetitions.
  // Neither the family's kernel nor the default plan is timed, and no table_point line is printed
  // (its columns would be missing). BARACUDA_ATTN_ROUNDS applies to these rows as to the columns:
  // each is timed r times at a point, in rounds of alternating order (notes ", round <k>"; the A/B
  // tools take medians over a kernel's rows).
  const std::vector<std::string> kernels_env = bench::env_list("BARACUDA_ATTN_KERNELS");
  const bool fa3_filtered = !kernels_env.empty();
  std::vector<int64_t> lens = !listed_lens.empty() ? listed_lens
                              : quick              ? std::vector<int64_t>{1024, 4096, 16384}
                              : short_lens
                                  ? std::vector<int64_t>{128, 256}
                                  : std::vector<int64_t>{512, 1024, 2048, 4096, 8192, 16384};
  // Head dim 256 too (not in the FlashAttention papers' sweep): the selection table's d256 rows.
  for (int64_t d : {64, 128, 256})
    for (int64_t l : lens)
      for (bool causal : {false, true}) {
        if ((only_d > 0 && (d != only_d || l != only_l || causal)) ||
            (dim_only > 0 && d != dim_only))
          continue;
        const int64_t h = only_h > 0 ? only_h : kHidden / d,
                      batch = only_b > 0 ? only_b : kTokens / l;
        const attention::Descriptor desc = sweep_desc(dt, batch, h, l, d, causal);
        const std::string name = case_name(batch, h, l, d, causal);
        const double fwd_flops = 4.0 * batch * h * l * l * d * (causal ? 0.5 : 1.0);
        const double tensor_bytes = static_cast<double>(n) * 2;
        const double lse_bytes = static_cast<double>(batch * h * l) * 4;
        const Tensor q = view4(b.q.view().data, batch, h, l, d, dt),
                     k = view4(b.k.view().data, batch, h, l, d, dt),
                     v = view4(b.v.view().data, batch, h, l, d, dt),
                     dy = view4(b.dy.view().data, batch, h, l, d, dt),
                     y = view4(b.y.data(), batch, h, l, d, dt),
                     dq = view4(b.dq.data(), batch, h, l, d, dt),
                     dk = view4(b.dk.data(), batch, h, l, d, dt),
                     dv = view4(b.dv.data(), batch, h, l, d, dt);
        const int64_t lse_dims[] = {batch, h, l};
        const Tensor lse = make_tensor(b.lse.data(), DType::f32, lse_dims, Location::cuda(0));
        const attention::ForwardArguments fa{as_const(q), as_const(k), as_const(v), y, lse, {}, {}};
        const attention::BackwardArguments ba{
            as_const(q), as_const(k), as_const(v), as_const(y), as_const(dy), as_const(lse), dq,
            dk,          dv,          {},          {}};

        struct Variant {
          const char* label;
          PlanPreference pref;
        };
        // Times one forward plan on this case and emits its row; its TFLOP/s (0 if it failed).
        const double fwd_bytes = 4 * tensor_bytes + lse_bytes,
                     bwd_bytes = 8 * tensor_bytes + lse_bytes;
        auto time_fwd = [&](const attention::ForwardPlan& fp, const std::string& note) {
          return time_forward(stream, name, fp, fa, fwd_bytes, fwd_flops, note, dt_name);
        };
        auto time_bwd = [&](const attention::ForwardPlan& fwd, const attention::BackwardPlan& bp,
                            const std::string& note) {
          return time_backward(stream, name, fwd, fa, bp, ba, bwd_bytes, 2.5 * fwd_flops, note,
                               dt_name);
        };
        // The default plan is timed by the attention family's own bench (same names).
        const Variant variants[] = {{"cudnn", PlanPreference::only(Backend::cudnn)},
                                    {"bespoke", PlanPreference::only(Backend::bespoke_cuda)}};
        double fwd_tf[2] = {0, 0}, bwd_tf[2] = {0, 0};
        // Each table column timed again (its row's note + the round's), for the rounds above:
        // [forward, backward][cuDNN, bespoke, fa3].
        std::function<double(const std::string&)> again[2][3];
        auto again_fwd = [&time_fwd](const attention::ForwardPlan& fp, const std::string& note) {
          return [&time_fwd, fp, note](const std::string& round) {
            return time_fwd(fp, note + round);
          };
        };
        auto again_bwd = [&time_bwd](const attention::ForwardPlan& fp,
                                     const attention::BackwardPlan& bp, const std::string& note) {
          return [&time_bwd, fp, bp, note](const std::string& round) {
            return time_bwd(fp, bp, note + round);
          };
        };
        for (int vi = 0; vi < (backward_only || fa3_filtered ? 1 : 2); ++vi) {
          const Variant& var = variants[vi];
          std::optional<BespokePick> bespoke_pick;
          if (vi == 1) bespoke_pick.emplace(dt);
          auto fp = attention::ForwardPlan::select(stream, desc, var.pref);
          auto bp = attention::BackwardPlan::select(stream, desc, var.pref);
          bespoke_pick.reset();
          if (fp.ok() && vi == 1 &&
              fa3_in_bespoke_column(name, "attention_forward", fp->sku().name))
            continue;
          const bool fa3_bwd_here =
              bp.ok() && vi == 1 &&
              fa3_in_bespoke_column(name, "attention_backward", bp->sku().name);
          if (!fp.ok()) {
            bench::emit_error("attention", "attention_forward", name + "/" + var.label, fp.error());
            continue;
          }
          const bool cudnn = vi == 0;
          const std::string fwd_note =
              cudnn ? cudnn_note(stream, desc, Pass::forward) : std::string(var.label);
          fwd_tf[vi] = time_fwd(*fp, fwd_note);
          again[0][vi] = again_fwd(*fp, fwd_note);
          if (forward_only || fa3_bwd_here) continue;
          if (!bp.ok()) {
            bench::emit_error("attention", "attention_backward", name + "/" + var.label,
                              bp.error());
            continue;
          }
          // The backward reads this plan's own forward outputs (y, lse).
          const std::string bwd_note =
              cudnn ? cudnn_note(stream, desc, Pass::backward) : std::string(var.label);
          bwd_tf[vi] = time_bwd(*fp, *bp, bwd_note);
          again[1][vi] = again_bwd(*fp, *bp, bwd_note);
        }
        // Our sm_90a forward pinned by name, both schedules (forward only): same case name, notes
        // "fa3_sm90a" / "fa3_sm90a_pingpong", so they line up with the cudnn / bespoke rows. The
        // table's fa3 column is the instance the ranked-ahead entry launches here
        // (fa3_table_instance: the plain schedule, the persistent one for short sequences, the
        // 192-row one for long d64 ones).
        double fa3_tf = 0;
        const std::string_view stand_in = fa3_table_instance(desc);
        // The BARACUDA_ATTN_KERNELS rows (cuDNN's first) for their rounds below.
        std::vector<std::function<double(const std::string&)>> named_again;
        if (fa3_filtered && !backward_only && again[0][0] && fwd_tf[0] > 0)
          named_again.push_back(again[0][0]);
        // The exp2-offload variants: notes "fa3_sm90a_exp2poly2of8" / "fa3_sm90a_exp2poly3of8".
        // The persistent variant (D = 64, 128): note "fa3_sm90a_persistent"; the 192-row tiles
        // (D = 64): "fa3_sm90a_m192".
        for (std::string_view fa3 : {kFa3Kernel, kFa3PingpongKernel, kFa3Exp2Poly2Kernel,
                                     kFa3Exp2Poly3Kernel, kFa3PersistentKernel, kFa3WideKernel}) {
          if ((fa3 == kFa3PersistentKernel && !fa3_persistent_dims(d, d)) ||
              (fa3 == kFa3WideKernel && d != 64) || backward_only ||
              !bench::env_list_selects(kernels_env, fa3))
            continue;
          const std::string note = "fa3_sm90a" + std::string(fa3.substr(kFa3Kernel.size()));
          auto fp = attention::ForwardPlan::select(stream, desc, PlanPreference::kernel(fa3));
          if (!fp.ok()) {
            bench::emit_error("attention", "attention_forward", name + "/" + note, fp.error());
            continue;
          }
          const double tf = time_fwd(*fp, note);
          if (fa3_filtered && tf > 0) named_again.push_back(again_fwd(*fp, note));
          if (fa3 == stand_in) {
            fa3_tf = tf;
            again[0][2] = again_fwd(*fp, note);
          }
        }
        // The backward rows of fa3 below run on the default forward plan's outputs.
        auto def_fwd = attention::ForwardPlan::select(stream, desc);
        // Our sm_90a backward pinned by name (note "fa3_sm90a"): the table's fa3 column, the
        // instance the ranked-ahead entry launches.
        double fa3_bwd_tf = 0;
        if (def_fwd.ok() && !forward_only && !fa3_filtered) {
          const std::string_view bwd_column = fa3_table_bwd_instance(desc);
          auto bp =
              attention::BackwardPlan::select(stream, desc, PlanPreference::kernel(bwd_column));
          if (bp.ok()) {
            fa3_bwd_tf = time_bwd(*def_fwd, *bp, "fa3_sm90a");
            again[1][2] = again_bwd(*def_fwd, *bp, "fa3_sm90a");
          } else
            bench::emit_error("attention", "attention_backward", name + "/fa3_sm90a", bp.error());
          // D = 64: the three-warpgroup kernel and the 128-row steps by name too (notes
          // "fa3_sm90a_k192", "fa3_sm90a_q128"), where the table's column above is not that one.
          for (std::string_view k : {kFa3BwdK192Kernel, kFa3BwdQ128Kernel}) {
            if (d != 64 || k == bwd_column) continue;
            const std::string note = "fa3_sm90a" + std::string(k.substr(kFa3BwdKernel.size()));
            auto plan = attention::BackwardPlan::select(stream, desc, PlanPreference::kernel(k));
            if (plan.ok())
              time_bwd(*def_fwd, *plan, note);
            else
              bench::emit_error("attention", "attention_backward", name + "/" + note, plan.error());
          }
        }
        // BARACUDA_ATTN_KERNELS' backward entries (fa3_bwd_*, note: the entry's name), pinned on
        // the default forward's outputs as the fa3 column is, with cuDNN's backward as their
        // control: an A/B of backward schedules in the process, rounds and clock states of the
        // table's own rows (the family's bench times the same launches in another process).
        if (fa3_filtered && !forward_only && def_fwd.ok()) {
          bool any = false;
          for (const std::string& k : kernels_env) {
            if (!k.starts_with("fa3_bwd")) continue;
            auto plan = attention::BackwardPlan::select(stream, desc, PlanPreference::kernel(k));
            if (!plan.ok()) {
              bench::emit_error("attention", "attention_backward", name + "/" + k, plan.error());
              continue;
            }
            if (time_bwd(*def_fwd, *plan, k) > 0)
              named_again.push_back(again_bwd(*def_fwd, *plan, k));
            any = true;
          }
          if (any && again[1][0] && bwd_tf[0] > 0) named_again.push_back(again[1][0]);
        }
        // The default plan (note "default plan") where the attention family's bench does not
        // time it under the same name (its sweep: bf16, d64 / d128, L >= 512).
        if ((dt != DType::bf16 || d == 256 || l < 512) && !fa3_filtered) {
          const SelectionTableOverride shipped_table{shipped};
          auto fp = attention::ForwardPlan::select(stream, desc);
          auto bp = attention::BackwardPlan::select(stream, desc);
          if (fp.ok() && !backward_only) time_fwd(*fp, "default plan");
          if (fp.ok() && bp.ok() && !forward_only) time_bwd(*fp, *bp, "default plan");
          if (!fp.ok() || !bp.ok())
            bench::emit_error("attention", "attention_default", name,
                              fp.ok() ? bp.error() : fp.error());
        }
        double column_tf[2][3] = {{fwd_tf[0], fwd_tf[1], fa3_tf},
                                  {bwd_tf[0], bwd_tf[1], fa3_bwd_tf}};
        if (fa3_filtered) {
          for (int r = 1; r < rounds; ++r)
            for (size_t i = 0; i < named_again.size(); ++i)
              named_again[r % 2 == 1 ? named_again.size() - 1 - i : i](", round " +
                                                                       std::to_string(r));
          continue;
        }
        if (rounds > 1) column_tf_over_rounds(again, column_tf, rounds);
        for (int pass = 0; pass < 2; ++pass) {
          const double* tf = column_tf[pass];
          std::printf(
              "{\"table_point\": {\"dtype\": \"%s\", \"pass\": \"%s\", \"head_dim\": %lld, "
              "\"len\": %lld, \"causal\": %s, \"cudnn_tflops\": %.1f, \"bespoke_tflops\": %.1f, "
              "\"fa3_tflops\": %.1f, \"rounds\": %d, \"device\": \"%s\"}}\n",
              dt_name.c_str(), pass == 0 ? "forward" : "backward", static_cast<long long>(d),
              static_cast<long long>(l), causal ? "true" : "false", tf[0], tf[1], tf[2], rounds,
              stream.caps().name.c_str());
          std::fflush(stdout);
        }
      }
}

// One problem's forward and backward under each candidate (notes "default", "fa3_sm90a",
// "bespoke" and, with_cudnn, "cudnn"), one row per plan that selects and runs; the backward reads
// the same candidate's forward outputs (it runs first). The bespoke rows select under
// bespoke_pick_points (BespokePick), so that no fa3 entry (also bespoke CUDA) stands in for the
// family's kernels.
void time_variants(const Stream& stream, const std::string& name, const attention::Descriptor& desc,
                   const attention::ForwardArguments& fa, const attention::BackwardArguments& ba,
                   double bytes, double flops, bool with_cudnn) {
  struct Variant {
    const char* note;
    PlanPreference fwd, bwd;
  };
  const Variant variants[] = {
      {"default", PlanPreference::fastest(), PlanPreference::fastest()},
      {"fa3_sm90a", PlanPreference::kernel(kFa3Kernel), PlanPreference::kernel(kFa3BwdKernel)},
      {"bespoke", PlanPreference::only(Backend::bespoke_cuda),
       PlanPreference::only(Backend::bespoke_cuda)},
      {"cudnn", PlanPreference::only(Backend::cudnn), PlanPreference::only(Backend::cudnn)}};
  for (const Variant& var : variants) {
    if (!with_cudnn && std::string_view(var.note) == "cudnn") continue;
    const bool bespoke = std::string_view(var.note) == "bespoke";
    std::optional<BespokePick> bespoke_pick;
    if (bespoke) bespoke_pick.emplace(desc.dtype);
    auto fp = attention::ForwardPlan::select(stream, desc, var.fwd);
    if (!fp.ok()) {
      bench::emit_error("attention", "attention_forward", name + "/" + var.note, fp.error());
      continue;
    }
    if (bespoke && fa3_in_bespoke_column(name, "attention_forward", fp->sku().name)) continue;
    time_forward(stream, name, *fp, fa, bytes, flops, var.note);
    auto bp = attention::BackwardPlan::select(stream, desc, var.bwd);
    bespoke_pick.reset();
    if (!bp.ok()) {
      bench::emit_error("attention", "attention_backward", name + "/" + var.note, bp.error());
      continue;
    }
    if (bespoke && fa3_in_bespoke_column(name, "attention_backward", bp->sku().name)) continue;
    time_backward(stream, name, *fp, fa, *bp, ba, 2 * bytes, 2.5 * flops, var.note);
  }
}

// Packed sequences (varlen) of mixed lengths, 16k tokens in all, d128, Hq = Hk = 16, bf16: the
// default plan, fa3 pinned by name, the family's bespoke kernel and cuDNN's ragged layout (forward
// and backward; the bench's tensors are dense, as its backward requires). Peer: PyTorch SDPA on
// nested (jagged) tensors, in peers.py under the same names. TFLOP/s count each sequence's 4 Lq Lk
// D per head (halved for causal).
const std::vector<int32_t> kVarlenLengths = {512, 1024, 3072, 4096, 2048, 1536, 4096};

std::string varlen_name(bool causal) {
  return "varlen_s" + std::to_string(kVarlenLengths.size()) + "_t" + std::to_string(kTokens) +
         "_h16_d128" + (causal ? "_causal" : "");
}

void varlen_sweep(const Stream& stream) {
  if (bench::env("BARACUDA_ATTENTION_ONLY") == "decode") return;
  constexpr int64_t kHeads = 16, kDim = 128;
  std::vector<int32_t> cu{0};
  for (int32_t l : kVarlenLengths) cu.push_back(cu.back() + l);
  const int64_t total = cu.back(), batch = static_cast<int64_t>(kVarlenLengths.size());
  const int64_t longest = *std::max_element(kVarlenLengths.begin(), kVarlenLengths.end());
  harness::Rng rng(20261126);
  auto make = [&](DType t, std::vector<int64_t> shape) {
    auto x = harness::TestTensor::make(t, std::move(shape), harness::Target::cuda);
    x.fill_random(rng);
    return x;
  };
  auto q = make(DType::bf16, {total, kHeads, kDim}), k = make(DType::bf16, {total, kHeads, kDim}),
       v = make(DType::bf16, {total, kHeads, kDim}), dy = make(DType::bf16, {total, kHeads, kDim}),
       y = make(DType::bf16, {total, kHeads, kDim}), dq = make(DType::bf16, {total, kHeads, kDim}),
       dk = make(DType::bf16, {total, kHeads, kDim}), dv = make(DType::bf16, {total, kHeads, kDim});
  auto lse = make(DType::f32, {kHeads, total});
  auto cus = harness::TestTensor::make(DType::i32, {batch + 1}, harness::Target::cuda);
  cus.set_values(std::vector<double>(cu.begin(), cu.end()));
  for (bool causal : {false, true}) {
    attention::Descriptor desc;
    desc.dtype = DType::bf16;
    desc.batch = batch;
    desc.heads_q = desc.heads_kv = kHeads;
    desc.len_q = desc.len_k = longest;
    desc.head_dim_qk = desc.head_dim_v = kDim;
    desc.mask = causal ? attention::Mask::causal_bottom_right() : attention::Mask::none();
    desc.varlen = true;
    desc.total_q = desc.total_k = total;
    double flops = 0;
    for (int32_t l : kVarlenLengths) flops += 4.0 * kHeads * double(l) * l * kDim;
    if (causal) flops *= 0.5;
    const std::string name = varlen_name(causal);
    const attention::ForwardArguments fa{q.cview(),  k.cview(),   v.cview(),  y.view(),
                                         lse.view(), cus.cview(), cus.cview()};
    const attention::BackwardArguments ba{q.cview(),  k.cview(),   v.cview(),  y.cview(),
                                          dy.cview(), lse.cview(), dq.view(),  dk.view(),
                                          dv.view(),  cus.cview(), cus.cview()};
    const double bytes = 4.0 * double(total) * kHeads * kDim * 2;
    time_variants(stream, name, desc, fa, ba, bytes, flops, /*with_cudnn=*/true);
  }
}

// Soft-capping and sliding windows (padded, bf16, d128, Hq = Hk = 16, 16k tokens): the default
// plan, fa3 pinned, the bespoke kernels (BespokePick) and cuDNN where it takes the mask.
// TFLOP/s count the (query, key) pairs the band leaves visible.
void feature_sweep(const Stream& stream) {
  if (bench::env("BARACUDA_ATTENTION_ONLY") == "decode") return;
  struct Case {
    const char* name;
    int64_t batch, len;
    attention::Mask mask;
    double softcap;
    int64_t dk = 128, dv = 128;
  };
  const Case cases[] = {
      {"b4_h16_l4096_d128_softcap30", 4, 4096, attention::Mask::none(), 30.0},
      {"b4_h16_l4096_d128_causal_softcap30", 4, 4096, attention::Mask::causal_bottom_right(), 30.0},
      {"b2_h16_l8192_d128_window1023", 2, 8192, attention::Mask::sliding_window(1023, 0), 0.0},
      // DeepSeek MLA prefill's head dims (Dk = 192, Dv = 128), causal.
      {"b2_h16_l8192_dk192_dv128_causal", 2, 8192, attention::Mask::causal_bottom_right(), 0.0, 192,
       128},
  };
  constexpr int64_t kHeads = 16;
  harness::Rng rng(20261127);
  for (const Case& c : cases) {
    attention::Descriptor desc;
    desc.dtype = DType::bf16;
    desc.batch = c.batch;
    desc.heads_q = desc.heads_kv = kHeads;
    desc.len_q = desc.len_k = c.len;
    desc.head_dim_qk = c.dk;
    desc.head_dim_v = c.dv;
    desc.mask = c.mask;
    desc.softcap = c.softcap;
    auto make = [&](DType t, std::vector<int64_t> shape) {
      auto x = harness::TestTensor::make(t, std::move(shape), harness::Target::cuda);
      x.fill_random(rng);
      return x;
    };
    const std::vector<int64_t> qk = {c.batch, kHeads, c.len, c.dk},
                               vo = {c.batch, kHeads, c.len, c.dv};
    auto q = make(DType::bf16, qk), k = make(DType::bf16, qk), v = make(DType::bf16, vo),
         dy = make(DType::bf16, vo), y = make(DType::bf16, vo), dq = make(DType::bf16, qk),
         dk = make(DType::bf16, qk), dv = make(DType::bf16, vo);
    auto lse = make(DType::f32, {c.batch, kHeads, c.len});
    // Visible (query, key) pairs of the band.
    const attention::detail::Band band = attention::detail::band_of(c.mask);
    double pairs = 0;
    for (int64_t i = 0; i < c.len; ++i) {
      int64_t lo = 0, hi = 0;
      attention::detail::visible_keys(band, i, c.len, c.len, &lo, &hi);
      pairs += static_cast<double>(std::max<int64_t>(0, hi - lo));
    }
    const double flops = 2.0 * c.batch * kHeads * pairs * static_cast<double>(c.dk + c.dv);
    const attention::ForwardArguments fa{q.cview(),  k.cview(), v.cview(), y.view(),
                                         lse.view(), {},        {}};
    const attention::BackwardArguments ba{q.cview(),  k.cview(),   v.cview(), y.cview(),
                                          dy.cview(), lse.cview(), dq.view(), dk.view(),
                                          dv.view(),  {},          {}};
    const double bytes = static_cast<double>(c.batch * kHeads * c.len) *
                         static_cast<double>(2 * c.dk + 2 * c.dv) * 2;
    time_variants(stream, c.name, desc, fa, ba, bytes, flops, /*with_cudnn=*/true);
  }
}

// The fp8 forward (e4m3 Q, K, V with descales, Y in bf16; head dims 64 / 128 / 256, the sweep's
// lengths, causal and not): the default e4m3 plan (fa3_fwd_fp8_sm90a, its V^T transpose included in
// the time), next to the bf16 fa3 forward and cuDNN's bf16 forward on the same shapes in the same
// run (PyTorch has no fp8 attention to compare with; its fastest bf16 backend, cuDNN, is the peer
// in peers.py). A run of every registered bench (gpu-check, gpu-family) gets the d128 rows of the
// default fp8 plan only; BARACUDA_ATTENTION_ONLY=fp8 the whole sweep with the schedule A/B rows.
void fp8_sweep(const Stream& stream) {
  const std::string only{bench::env("BARACUDA_ATTENTION_ONLY")};
  if (!only.empty() && only != "fp8") return;
  const bool full = only == "fp8";
  const SelectionTableOverride raw_candidates{std::span<const TablePoint>{}};
  const int64_t n = kTokens * kHidden;
  harness::Rng rng(20261128);
  auto make = [&](DType t) {
    auto x = harness::TestTensor::make(t, {n}, harness::Target::cuda);
    x.fill_random(rng, -4, 4);
    return x;
  };
  auto q8 = make(DType::e4m3), k8 = make(DType::e4m3), v8 = make(DType::e4m3);
  auto q16 = make(DType::bf16), k16 = make(DType::bf16), v16 = make(DType::bf16);
  auto y = make(DType::bf16);
  // LSE of the most heads swept (head dim 64).
  auto lse =
      harness::TestTensor::make(DType::f32, {kTokens * (kHidden / 64)}, harness::Target::cuda);
  auto scale = harness::TestTensor::make(DType::f32, {1}, harness::Target::cuda);
  scale.set_values({0.25});
  // BARACUDA_AB="<kernel a>,<kernel b>[,...]": instead of the sweep, the kernels pinned by name
  // (e4m3 inputs where the name says fp8, bf16 otherwise) in alternation, BARACUDA_AB_ROUNDS
  // rounds (default 6) at L >= 4096: rows noted "ab round <r>", so that clock and power drift
  // within a call hits all alike (calls on one machine differ by up to 20% at these points).
  std::vector<std::string> ab_kernels = bench::env_list("BARACUDA_AB");
  if (ab_kernels.size() == 1) ab_kernels.clear();  // one name is no comparison: the sweep runs
  const bool ab_mode = !ab_kernels.empty();
  const int rounds = static_cast<int>(bench::env_positive("BARACUDA_AB_ROUNDS", 6));
  const std::vector<int64_t> lens = !ab_mode
                                        ? std::vector<int64_t>{512, 1024, 2048, 4096, 8192, 16384}
                                        : std::vector<int64_t>{4096, 8192, 16384};
  // Head dims 64 / 128 / 256 (the A/B mode and the short run: 128), the schedule A/B rows at 128
  // only.
  const std::vector<int64_t> dims_swept =
      !ab_mode && full ? std::vector<int64_t>{64, 128, 256} : std::vector<int64_t>{128};
  for (int64_t dim : dims_swept)
    for (int64_t l : lens)
      for (bool causal : {false, true}) {
        const int64_t batch = kTokens / l, heads = kHidden / dim;
        attention::Descriptor desc = sweep_desc(DType::bf16, batch, heads, l, dim, causal);
        const std::string name = case_name(batch, heads, l, dim, causal);
        const double flops = 4.0 * batch * heads * l * l * dim * (causal ? 0.5 : 1.0);
        const int64_t dims[] = {batch, heads, l, dim}, lse_dims[] = {batch, heads, l};
        auto view = [&](const harness::TestTensor& t, DType e) {
          return make_tensor(static_cast<const void*>(t.cview().data), e, dims, Location::cuda(0));
        };
        const Tensor ty = make_tensor(y.view().data, DType::bf16, dims, Location::cuda(0));
        const Tensor tl = make_tensor(lse.view().data, DType::f32, lse_dims, Location::cuda(0));
        attention::ForwardArguments f8{
            view(q8, DType::e4m3), view(k8, DType::e4m3), view(v8, DType::e4m3), ty, tl, {}, {}};
        f8.q_descale = f8.k_descale = f8.v_descale = scale.cview();
        const attention::ForwardArguments f16{
            view(q16, DType::bf16), view(k16, DType::bf16), view(v16, DType::bf16), ty, tl, {}, {}};
        // Bytes the op moves: Q, K, V read (1 byte an element fp8, 2 bf16), Y written in bf16.
        const double fp8_bytes = 3.0 * n + 2.0 * n, bf16_bytes = 4.0 * n * 2;
        if (ab_mode) {
          for (int r = 0; r < rounds; ++r)
            for (const std::string& k : ab_kernels) {
              const bool fp8 = k.find("fp8") != std::string::npos;
              desc.dtype = fp8 ? DType::e4m3 : DType::bf16;
              auto fp = attention::ForwardPlan::select(stream, desc, PlanPreference::kernel(k));
              if (!fp.ok()) {
                bench::emit_error("attention", "attention_forward", name + "/" + k, fp.error());
                continue;
              }
              time_forward(stream, name, *fp, fp8 ? f8 : f16, fp8 ? fp8_bytes : bf16_bytes, flops,
                           "ab round " + std::to_string(r), fp8 ? "e4m3" : "bf16");
            }
          continue;
        }
        desc.dtype = DType::e4m3;
        for (std::string_view k : {kFa3Fp8Kernel, kFa3Fp8PingpongKernel, kFa3Fp8Exp2Poly2Kernel,
                                   kFa3Fp8Exp2Poly3Kernel, kFa3Fp8EagerRescaleKernel}) {
          if ((dim != 128 || !full) && k != kFa3Fp8Kernel) continue;
          const std::string note = "fp8 e4m3 -> bf16" + std::string(k.substr(kFa3Fp8Kernel.size()));
          if (auto fp = attention::ForwardPlan::select(stream, desc, PlanPreference::kernel(k));
              fp.ok())
            time_forward(stream, name, *fp, f8, fp8_bytes, flops, note, "e4m3");
          else
            bench::emit_error("attention", "attention_forward", name + "/" + note, fp.error());
        }
        desc.dtype = DType::bf16;
        for (const auto& [note, pref] :
             {std::pair{"fa3_sm90a", PlanPreference::kernel(kFa3Kernel)},
              std::pair{"cudnn", PlanPreference::only(Backend::cudnn)}}) {
          if (auto fp = attention::ForwardPlan::select(stream, desc, pref); fp.ok())
            time_forward(stream, name, *fp, f16, bf16_bytes, flops, note);
          else
            bench::emit_error("attention", "attention_forward", name + "/" + note, fp.error());
        }
      }
}

// The chunk benches' inputs: `batch` sequences x 32 query heads, Q / K / V random in sweep_dtype()
// filled once (the largest point's extents) by bench::random_buffer (a host block tiled over the
// buffer; filling element by element took 4.2 s per 64 Mi elements on a build host, ~40 s for the
// 670 M of 64 sequences at d256), Y and LSE to write.
constexpr int64_t kChunkB = 4, kChunkHq = 32;
struct ChunkInputs {
  Buffer q, k, v, y, lse;
  DType dtype;  // sweep_dtype(): Q, K, V and Y
};
std::optional<ChunkInputs> chunk_inputs(const Stream& stream, int64_t max_lq, int64_t kv_elems,
                                        int64_t max_d, int64_t batch = kChunkB) {
  const DType dt = sweep_dtype();
  const int64_t q_elems = batch * kChunkHq * max_lq * max_d;
  Result<Buffer> bufs[] = {bench::random_buffer(stream, dt, q_elems, 20261130),
                           bench::random_buffer(stream, dt, kv_elems, 20261131),
                           bench::random_buffer(stream, dt, kv_elems, 20261132),
                           Buffer::allocate(q_elems * 2, Location::cuda(0)),
                           Buffer::allocate(batch * kChunkHq * max_lq * 4, Location::cuda(0))};
  for (const Result<Buffer>& b : bufs) {
    if (!b.ok()) {
      bench::emit_error("attention", "setup", "alloc", b.error());
      return std::nullopt;
    }
  }
  return ChunkInputs{std::move(bufs[0]).value(), std::move(bufs[1]).value(),
                     std::move(bufs[2]).value(), std::move(bufs[3]).value(),
                     std::move(bufs[4]).value(), dt};
}
// One chunk: lq new rows of each sequence at the end of lk keys of hk K / V heads (causal
// bottom-right), its row name, FLOPs on the visible keys and bytes (Q, Y, K, V once).
struct ChunkPoint {
  attention::Descriptor desc;
  std::string name;
  double flops, bytes;
  attention::ForwardArguments fa;
};
ChunkPoint chunk_point(ChunkInputs& in, std::string_view prefix, int64_t hk, int64_t lq, int64_t lk,
                       int64_t d, int64_t kB = kChunkB) {
  constexpr int64_t kHq = kChunkHq;
  ChunkPoint c;
  c.desc = sweep_desc(in.dtype, kB, kHq, lq, d, true);
  c.desc.heads_kv = hk, c.desc.len_k = lk;
  c.desc.mask = attention::Mask::causal_bottom_right();
  c.name = std::string(prefix) + "_b" + std::to_string(kB) + "_hq32_hk" + std::to_string(hk) +
           "_lq" + std::to_string(lq) + "_lk" + std::to_string(lk) + "_d" + std::to_string(d);
  c.flops = 4.0 * kB * kHq * d *
            attention::detail::visible_key_total(attention::detail::band_of(c.desc.mask), lq, lk);
  c.bytes = 2.0 * (2 * kB * kHq * lq * d + 2 * kB * hk * lk * d);
  const int64_t lse_dims[] = {kB, kHq, lq};
  c.fa = {as_const(view4(in.q.data(), kB, kHq, lq, d, in.dtype)),
          as_const(view4(in.k.data(), kB, hk, lk, d, in.dtype)),
          as_const(view4(in.v.data(), kB, hk, lk, d, in.dtype)),
          view4(in.y.data(), kB, kHq, lq, d, in.dtype),
          make_tensor(in.lse.data(), DType::f32, lse_dims, Location::cuda(0)),
          {},
          {}};
  return c;
}

// Chunk points of the selection table (bench_attention attention_chunks): chunked prefill, 4
// sequences x 32 query heads (GQA 4), a chunk of Lq new rows at the end of Lk-key caches, causal
// bottom-right, head dims 64 / 128 / 256, Lk 4096 and 16384, Lq 32 .. min(Lk / 2, 4096) (~1 GB of
// inputs). cuDNN, the bespoke kernels (under an empty table, as the sweep) and fa3_fwd_sm90a (the
// ranked-ahead entry's instance) timed back to back; one {"table_point": ...} line a point with its
// "len_q", which make_table.py turns into the table's chunk points (the Lq = Lk sweep measures
// neither fa3's nor cuDNN's chunk rate). TFLOP/s on the visible keys.
void chunk_sweep(const Stream& stream) {
  const SelectionTableOverride raw_candidates{std::span<const TablePoint>{}};
  constexpr int64_t kHk = 8, kMaxLk = 16384, kMaxLq = 4096, kMaxD = 256;
  auto in = chunk_inputs(stream, kMaxLq, kChunkB * kHk * kMaxLk * kMaxD, kMaxD);
  if (!in) return;
  for (int64_t d : {64, 128, 256})
    for (int64_t lk : {int64_t{4096}, kMaxLk})
      for (int64_t lq = 32; lq <= lk / 2 && lq <= kMaxLq; lq *= 2) {
        const ChunkPoint c = chunk_point(*in, "chunk", kHk, lq, lk, d);
        double tf[3] = {0, 0, 0};  // cuDNN, bespoke, fa3
        // fa3's column as in the sweep (here also the packed instance for short chunks).
        const std::string_view fa3 = fa3_table_instance(c.desc);
        const std::pair<const char*, PlanPreference> candidates[] = {
            {"cudnn", PlanPreference::only(Backend::cudnn)},
            {"bespoke", PlanPreference::only(Backend::bespoke_cuda)},
            {"fa3_sm90a", PlanPreference::kernel(fa3)}};
        for (int i = 0; i < 3; ++i) {
          auto fp = attention::ForwardPlan::select(stream, c.desc, candidates[i].second);
          if (!fp.ok()) {
            bench::emit_error("attention", "attention_prefill", c.name + "/" + candidates[i].first,
                              fp.error());
            continue;
          }
          tf[i] = time_forward(
              stream, c.name, *fp, c.fa, c.bytes, c.flops,
              i == 0 ? cudnn_note(stream, c.desc, Pass::forward) : std::string(candidates[i].first),
              name(in->dtype));
        }
        std::printf(
            "{\"table_point\": {\"dtype\": \"%s\", \"pass\": \"forward\", \"head_dim\": %lld, "
            "\"len\": %lld, \"len_q\": %lld, \"causal\": true, \"cudnn_tflops\": %.1f, "
            "\"bespoke_tflops\": %.1f, \"fa3_tflops\": %.1f, \"device\": \"%s\"}}\n",
            std::string(name(in->dtype)).c_str(), static_cast<long long>(d),
            static_cast<long long>(lk), static_cast<long long>(lq), tf[0], tf[1], tf[2],
            stream.caps().name.c_str());
        std::fflush(stdout);
      }
}

// Short chunks of a GQA group (bench_attention attention_packed): where fa3's packed instance
// leads, the measurement behind fa3_packs' bounds (fa3_packed_chunk_rows, kFa3PackedDecodeRows).
// 4 sequences x 32 query heads in groups of 1, 2, 4, 8, 16, head dims 64 and 128
// (BARACUDA_PACKED_D=<d>: one of them, or 256, which runs only when asked), Lk 4096 and 16384
// (groups of 1 at 16384 keys only where BARACUDA_PACKED_D asks for d64 or d128 alone: room),
// Lq 1 .. 256 (1 to 16: decode and speculative decoding's few tokens; Lq 3 in a group of 16 is 48
// rows, more than the decode kernel holds, fewer than kFa3PackedDecodeMinLq asks;
// BARACUDA_PACKED_MAX_LQ=<n>: those up to n alone), causal bottom-right. BARACUDA_PACKED_B=<b>: b
// sequences (a serving batch: whether the bounds measured on 4 hold where the grid is full). Per
// point: the default plan, the packed and plain fa3 instances by name, cuDNN and the bespoke
// kernels by backend (the latter under an empty table, so fa3's ranked-ahead entry does not answer
// for them). TFLOP/s on the visible keys.
void packed_sweep(const Stream& stream) {
  constexpr int64_t kMaxLq = 256;
  const int64_t only_d = bench::env_positive("BARACUDA_PACKED_D", 0);
  // One head dim alone (BARACUDA_PACKED_D) gets room for its groups of 1 against the long cache
  // (d128: 4 x 32 heads x 16384 keys), which the whole sweep's 128-wide inputs leave out.
  const int64_t max_d = only_d > 0 ? 256 : 128;
  const int64_t max_lq = bench::env_positive("BARACUDA_PACKED_MAX_LQ", kMaxLq);
  // A serving batch (BARACUDA_PACKED_B=<b>, e.g. 64): shorter caches, 1024 and 4096 keys, so the
  // inputs stay within b x 16 x 4096 x 128 elements (groups of 1: 1024 keys only).
  const int64_t batch = bench::env_positive("BARACUDA_PACKED_B", kChunkB);
  const bool serving = batch != kChunkB;
  const int64_t kv_cap = batch * 16 * (serving ? 4096 : 16384) * max_d;
  const std::array<int64_t, 2> lks =
      serving ? std::array<int64_t, 2>{1024, 4096} : std::array<int64_t, 2>{4096, 16384};
  auto in = chunk_inputs(stream, kMaxLq, kv_cap, max_d, batch);
  if (!in) return;
  for (int64_t d : {64, 128, 256})
    for (int64_t group : {1, 2, 4, 8, 16})
      for (int64_t lk : lks)
        for (int64_t lq : {1, 2, 3, 4, 8, 16, 17, 32, 64, 128, 256}) {
          const int64_t hk = kChunkHq / group;
          if ((only_d > 0 ? d != only_d : d > 128) || lq > max_lq || batch * hk * lk * d > kv_cap)
            continue;
          const ChunkPoint c = chunk_point(*in, "packed", hk, lq, lk, d, batch);
          const std::pair<const char*, PlanPreference> candidates[] = {
              {"default plan", PlanPreference::fastest()},
              {"fa3 packed by name", PlanPreference::kernel(kFa3PackedKernel)},
              {"fa3 by name", PlanPreference::kernel(kFa3Kernel)},
              {"cudnn", PlanPreference::only(Backend::cudnn)},
              {"bespoke", PlanPreference::only(Backend::bespoke_cuda)}};
          for (const auto& [note, pref] : candidates) {
            const bool bespoke =
                pref.kind == PlanPreference::Kind::backend && pref.backend == Backend::bespoke_cuda;
            auto fp = [&] {
              const std::span<const TablePoint> none{};
              std::optional<SelectionTableOverride> raw;
              if (bespoke) raw.emplace(none);
              return attention::ForwardPlan::select(stream, c.desc, pref);
            }();
            if (!fp.ok()) {
              bench::emit_error("attention", "attention_chunk", c.name + "/" + note, fp.error());
              continue;
            }
            time_forward(stream, c.name, *fp, c.fa, c.bytes, c.flops, note, name(in->dtype));
          }
        }
}

// BARACUDA_CUDNN_TUNING=off: the cuDNN backend runs the heuristics' first configuration (as
// PyTorch's SDPA does) instead of timing every one in select(), for every bench of this binary:
// an A/B of the tuning against the heuristics (the d64 L512 backward, 2-3% behind PyTorch's cuDNN
// on the same release in the forty-ninth session, runs the same engine either way: fiftieth
// session, docs/perf/attention.md). (A constant-initialized atomic: safe to set during static
// initialization.)
[[maybe_unused]] const bool tuning_env = [] {
  if (bench::env("BARACUDA_CUDNN_TUNING") == "off") set_cudnn_tuning_mode(CudnnTuningMode::off);
  return true;
}();
[[maybe_unused]] const bool registered = bench::register_bench("attention_hopper", sweep);
[[maybe_unused]] const bool registered_fp8 = bench::register_bench("attention_fp8", fp8_sweep);
[[maybe_unused]] const bool registered_features =
    bench::register_bench("attention_features", feature_sweep);
[[maybe_unused]] const bool registered_varlen =
    bench::register_bench("attention_varlen", varlen_sweep);
[[maybe_unused]] const bool registered_chunks =
    bench::register_bench("attention_chunks", chunk_sweep);
[[maybe_unused]] const bool registered_packed =
    bench::register_bench("attention_packed", packed_sweep);

}  // namespace
}  // namespace baracuda::attention_hopper
