// Attention benchmarks: the FlashAttention papers' sweep (16k tokens, hidden 2048, head dim 64 and
// 128, L = 512..16k, causal and not, bf16; TFLOP/s = 4*B*H*Lq*Lk*D, halved for causal, 2.5x for
// the backward) and decode (Lq = 1 against a 32k KV cache, 32 query heads, GQA 4, bf16; GB/s on
// the KV bytes). peers.py times the same cases on PyTorch SDPA with each backend forced.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "baracuda/ops/attention.hpp"
#include "baracuda/ops/attention_hopper.hpp"
#include "core/bench/bench.hpp"
#include "ops/attention/common.hpp"

namespace baracuda::attention {
namespace {

constexpr const char* kFamily = "attention";

Tensor view4(void* p, int64_t b, int64_t h, int64_t l, int64_t d, const Stream& s, DType t) {
  const int64_t shape[] = {b, h, l, d};
  return make_tensor(p, t, shape, s.memory_location());
}

// A forward plan for `d` (the one `kernel` names, the default when empty) and its workspace; an
// error row and nothing on failure (no row where a pinned kernel does not serve the point and
// `unsupported_rows` is false).
struct PlannedForward {
  ForwardPlan plan;
  Buffer workspace;
};
std::optional<PlannedForward> plan_forward(const Stream& stream, const Descriptor& d,
                                           std::string_view kernel, const char* op,
                                           const std::string& name, bool unsupported_rows = true) {
  // cuDNN by backend: its entry named "cudnn_sdpa" fits only where the table ranks it first (the
  // other one is "cudnn_sdpa_ranked_behind"), so by name it vanished from the rows another kernel
  // wins (the short chunks, H200 2026-11-30 call 5).
  auto fwd = ForwardPlan::select(stream, d,
                                 kernel.empty()           ? PlanPreference::fastest()
                                 : kernel == "cudnn_sdpa" ? PlanPreference::only(Backend::cudnn)
                                                          : PlanPreference::kernel(kernel));
  if (!fwd.ok()) {
    if (unsupported_rows || fwd.error().kind() != ErrorKind::unsupported)
      bench::emit_error(kFamily, op, name, fwd.error());
    return std::nullopt;
  }
  Result<Buffer> ws =
      Buffer::allocate(std::max<size_t>(fwd->workspace_size(), 16), stream.memory_location());
  if (!ws.ok()) {
    bench::emit_error(kFamily, op, name, ws.error());
    return std::nullopt;
  }
  return PlannedForward{std::move(fwd).value(), std::move(ws).value()};
}

// A point's plans (rows with a plan and its workspace) timed on `args` in interleaved rounds
// (bench::time_interleaved, 5 rounds of `reps` calls), so that no row pays for its place in the
// sequence: each plan's median, or nothing and an error row.
// BARACUDA_ATTN_ROW_ROUNDS=<r> / BARACUDA_ATTN_ROW_REPS=<n>: r rounds of n calls instead. Under
// the 700 W cap a long launch's rate falls the longer the GPU runs it (the SM clock 1980 MHz ->
// 1500-1800): one round of 10 calls, how rows were timed before d76a1f3, read fa3's 6-10 ms
// backward rows 1.01-1.09x the rate of 5 rounds of 4, and 20 rounds 0.92-1.00x (its 2-3 ms
// forward rows 0.88-0.99x; H200, eighty-eighth session).
template <class Row, class Arguments>
std::vector<std::optional<double>> time_rows(const Stream& stream, std::vector<Row>& rows,
                                             const Arguments& args, const char* op,
                                             const std::string& name, int reps) {
  std::vector<std::function<Status()>> runs;
  for (Row& r : rows)
    runs.push_back(
        [&stream, &r, &args] { return r.plan.run(stream, r.workspace.as_workspace(), args); });
  const auto times = bench::time_interleaved(
      stream, runs, static_cast<int>(bench::env_positive("BARACUDA_ATTN_ROW_ROUNDS", 5)),
      static_cast<int>(bench::env_positive("BARACUDA_ATTN_ROW_REPS", reps)));
  std::vector<std::optional<double>> medians;
  for (const auto& t : times) {
    if (t.ok()) {
      medians.emplace_back(t->median_ms);
    } else {
      bench::emit_error(kFamily, op, name, t.error());
      medians.emplace_back();
    }
  }
  return medians;
}
// A backward row's note, marked where its plan runs on a twin workspace
// (BARACUDA_ATTN_TWIN_WORKSPACE).
std::string twin_note(std::string_view note, bool twin) {
  if (!twin) return std::string(note);
  return note.empty() ? "twin workspace" : std::string(note) + " (twin workspace)";
}
// The forward rows: 6 calls a round, as many timed calls as bench::time_it's 30.
std::vector<std::optional<double>> time_forward_rows(const Stream& stream,
                                                     std::vector<PlannedForward>& rows,
                                                     const ForwardArguments& fa, const char* op,
                                                     const std::string& name) {
  return time_rows(stream, rows, fa, op, name, 6);
}

void bench_all(const Stream& stream) {
  std::mt19937 gen(7);
  constexpr int64_t kTokens = 16384, kHidden = 2048;
  // BARACUDA_ATTN_TOKENS=<t>: the sweep at t tokens (B x L; lengths beyond t skipped) in place of
  // 16k, where the backward's balance over the SMs depends on B x heads as well as on the group.
  const int64_t tokens = bench::env_positive("BARACUDA_ATTN_TOKENS", kTokens);
  const int64_t alloc = std::max(tokens, kTokens) * kHidden;
  // BARACUDA_ATTN_DTYPE=f16: the sweep in f16, and no other rows (the decode and prefill rows read
  // these buffers as bf16). BARACUDA_ATTN_GROUP=<g>: the sweep with g query heads per K/V head
  // (names end in _hk<heads>), where the deterministic preference's rule has to be measured too.
  const DType t = bench::env("BARACUDA_ATTN_DTYPE") == "f16" ? DType::f16 : DType::bf16;
  const std::string type_name = t == DType::f16 ? "f16" : "bf16";
  const std::string group_env{bench::env("BARACUDA_ATTN_GROUP")};
  const int64_t group = group_env.empty() ? 1 : std::max(1, std::atoi(group_env.c_str()));
  // One set of buffers serves every sweep point (16k tokens x 2048, or BARACUDA_ATTN_TOKENS' count
  // where larger).
  auto q = bench::random_buffer(stream, t, alloc, gen()),
       k = bench::random_buffer(stream, t, alloc, gen()),
       v = bench::random_buffer(stream, t, alloc, gen()),
       dy = bench::random_buffer(stream, t, alloc, gen());
  auto y = Buffer::allocate(alloc * 2, stream.memory_location());
  auto dq = Buffer::allocate(alloc * 2, stream.memory_location());
  auto dk = Buffer::allocate(alloc * 2, stream.memory_location());
  auto dv = Buffer::allocate(alloc * 2, stream.memory_location());
  auto lse = Buffer::allocate(alloc / kHidden * 32 * 4, stream.memory_location());
  for (auto* b : {&q, &k, &v, &dy, &y, &dq, &dk, &dv, &lse})
    if (!b->ok()) return bench::emit_error(kFamily, "setup", "alloc", b->error());
  // BARACUDA_ATTENTION_ONLY=decode skips the prefill sweep (a decode A/B run in seconds).
  // BARACUDA_ATTENTION_ONLY=backward: the sweep's backward rows (and the default forward that
  // writes their Y / LSE) only, no forward A/B rows, no decode.
  // BARACUDA_ATTENTION_ONLY=forward: the sweep's forward rows (default and A/B) only.
  // BARACUDA_ATTENTION_ONLY=paged_prefill: the chunked-prefill rows in paged caches only (an A/B
  // of the paged kernels in a minute); BARACUDA_ATTN_PAGE=<keys>: those of that page size only
  // (a profiler's first paged launch is then that size's).
  // BARACUDA_ATTENTION_ONLY=prefill: every chunked-prefill row (padded, counted and paged caches),
  // no sweep, no decode.
  const std::string_view only = bench::env("BARACUDA_ATTENTION_ONLY");
  const bool paged_prefill_only = only == "paged_prefill";
  const bool prefill_only = paged_prefill_only || only == "prefill";
  const bool sweep = only != "decode" && !prefill_only;
  const bool backward_only = only == "backward", forward_only = only == "forward";
  // BARACUDA_ATTN_SWEEP=d<D>_l<L>[_causal]: that one point (profiling and logging runs);
  // BARACUDA_ATTN_SWEEP=d<D>[_causal]: that head dim's points (only its causal ones).
  const std::string sweep_env{bench::env("BARACUDA_ATTN_SWEEP")};
  long long only_d = 0, only_l = 0;
  const int sweep_fields = std::sscanf(sweep_env.c_str(), "d%lld_l%lld", &only_d, &only_l);
  if (sweep_fields < 1) only_d = 0;
  if (sweep_fields < 2) only_l = 0;
  const bool only_causal = sweep_env.ends_with("_causal");
  // BARACUDA_ATTN_KERNELS=<name>[,<name>...]: only these A/B rows (a profiler then sees their
  // launches first).
  const std::vector<std::string> kernels_env = bench::env_list("BARACUDA_ATTN_KERNELS");
  // BARACUDA_ATTN_TWIN_WORKSPACE=<MiB>: each backward row once more, the same plan on a workspace
  // of its own allocated past a spacer of that many MiB, in the same interleaved rounds (note
  // "twin workspace"): how much a row's time depends on where its workspace lies (the same
  // launch by two entries read up to 5% apart in one process).
  const int64_t twin_mib = bench::env_positive("BARACUDA_ATTN_TWIN_WORKSPACE", 0);
  auto ab_wanted = [&](std::string_view k) { return bench::env_list_selects(kernels_env, k); };
  for (int64_t dim : {64, 128}) {
    if (!sweep) break;
    const int64_t heads = kHidden / dim;
    for (int64_t len : {512, 1024, 2048, 4096, 8192, 16384}) {
      const int64_t batch = tokens / len;
      if (batch == 0) continue;
      for (bool causal : {false, true}) {
        if (only_d > 0 && (dim != only_d || (only_l > 0 && len != only_l) ||
                           ((only_l > 0 || only_causal) && causal != only_causal)))
          continue;
        const int64_t heads_kv = heads / group;
        const std::string name = "b" + std::to_string(batch) + "_h" + std::to_string(heads) + "_l" +
                                 std::to_string(len) + "_d" + std::to_string(dim) +
                                 (causal ? "_causal" : "") +
                                 (group > 1 ? "_hk" + std::to_string(heads_kv) : "");
        Descriptor d;
        d.dtype = t, d.batch = batch, d.heads_q = heads, d.heads_kv = heads_kv;
        d.len_q = d.len_k = len, d.head_dim_qk = d.head_dim_v = dim;
        d.mask = causal ? Mask::causal_top_left() : Mask::none();
        const double flops = 4.0 * batch * heads * len * len * dim * (causal ? 0.5 : 1.0);
        const int64_t n = batch * len * kHidden;  // elements of Q (= Y, dY)
        const Tensor tq = view4(q->data(), batch, heads, len, dim, stream, t);
        const Tensor tk = view4(k->data(), batch, heads_kv, len, dim, stream, t);
        const Tensor tv = view4(v->data(), batch, heads_kv, len, dim, stream, t);
        const Tensor ty = view4(y->data(), batch, heads, len, dim, stream, t);
        const int64_t lse_shape[] = {batch, heads, len};
        const Tensor tl = make_tensor(lse->data(), DType::f32, lse_shape, stream.memory_location());
        const ForwardArguments fa{as_const(tq), as_const(tk), as_const(tv), ty, tl, {}, {}};
        // The default plan, then (A/B rows) the other bespoke tensor-core forward kernels forced
        // by name, all timed in interleaved rounds.
        std::vector<PlannedForward> fwd_rows;
        if (auto fwd = plan_forward(stream, d, "", "attention_forward", name))
          fwd_rows.push_back(std::move(*fwd));
        else
          continue;
        const std::string default_fwd(fwd_rows[0].plan.sku().name);
        for (const char* alt :
             {"flash_fwd_mma_sm80", "flash_fwd_mma_m16_sm80", "flash_fwd_mma_m16w8_sm80",
              "flash_fwd_mma_m32_sm80", "flash_fwd_mma_ovl_sm80", "flash_fwd_mma_m32s_sm80",
              "flash_fwd_mma_m32s_straight_sm80", "flash_fwd_mma_m32s_n128_sm80",
              "flash_fwd_mma_m32s_n128m_sm80"}) {
          if (default_fwd == alt || backward_only || !ab_wanted(alt)) continue;
          // A kernel that does not serve this point (m32s_n128 beyond head dim 64, a shape over
          // the device's shared memory) has no row; any other failure is reported.
          if (auto at = plan_forward(stream, d, alt, "attention_forward", name, false))
            fwd_rows.push_back(std::move(*at));
        }
        // (Every row writes Y and LSE, which the backward rows below read: the same values.)
        const auto fwd_ms = time_forward_rows(stream, fwd_rows, fa, "attention_forward", name);
        if (!fwd_ms[0]) continue;
        const double kv_bytes = 2.0 * n * 2 / group;
        const double io = 2.0 * n * 2 + kv_bytes;  // Q, K, V read, Y written
        for (size_t i = 0; i < fwd_rows.size(); ++i)
          if (fwd_ms[i])
            bench::emit(stream, {kFamily, "attention_forward", name, type_name,
                                 std::string(fwd_rows[i].plan.sku().name), *fwd_ms[i], io, flops,
                                 i == 0 ? "" : "A/B: kernel forced by name"});
        const BackwardArguments ba{as_const(tq),
                                   as_const(tk),
                                   as_const(tv),
                                   as_const(ty),
                                   as_const(view4(dy->data(), batch, heads, len, dim, stream, t)),
                                   as_const(tl),
                                   view4(dq->data(), batch, heads, len, dim, stream, t),
                                   view4(dk->data(), batch, heads_kv, len, dim, stream, t),
                                   view4(dv->data(), batch, heads_kv, len, dim, stream, t),
                                   {},
                                   {}};
        if (forward_only) continue;
        // The default backward plan, then (A/B rows) the family's tensor-core backward kernels
        // forced by name: the one-pass kernel and the deterministic two passes; and the plan that
        // PlanPreference::deterministic() selects (row note "deterministic preference"), which is
        // what a user who asks for bitwise reruns gets. The sm_90a deterministic instance and
        // cuDNN's deterministic algorithm by name only where BARACUDA_ATTN_KERNELS names them
        // (Hopper builds with cuDNN alone): the two the preference ranks by fa3_det_leads. Likewise
        // the two the default plan ranks: the sm_90a default instance and cuDNN's default
        // algorithm (each measured where the table picks the other), and fa3's non-deterministic
        // ranked entry (measured where the deterministic one is the default), its launch by name
        // wherever it fits, the same with the dQ accumulator zeroed (no first-store adds) and with
        // first-store adds at every length.
        constexpr std::string_view kDeterministic = "deterministic",
                                   kFa3Deterministic = attention_hopper::kFa3BwdDeterministicKernel,
                                   kCudnnDeterministic = "cudnn_sdpa_bwd_deterministic",
                                   kFa3 = attention_hopper::kFa3BwdKernel,
                                   kFa3HeavyFirst = attention_hopper::kFa3BwdHeavyFirstKernel,
                                   kFa3HeadSplit = attention_hopper::kFa3BwdHeadSplitKernel,
                                   kFa3HeadSplitHeavyFirst =
                                       attention_hopper::kFa3BwdHeadSplitHeavyFirstKernel,
                                   kCudnn = "cudnn_sdpa_bwd";
        const char* const bwd_alts[] = {
            "",
            "flash_bwd_fused_sm80",
            "flash_bwd_fused_bulk_sm80",
            "flash_bwd_fused_q64_sm80",
            "flash_bwd_mma_sm80",
            kDeterministic.data(),
            kFa3Deterministic.data(),
            attention_hopper::kFa3BwdDeterministicHeadSplitKernel.data(),
            attention_hopper::kFa3BwdDeterministicHeavyFirstKernel.data(),
            kCudnnDeterministic.data(),
            kFa3.data(),
            attention_hopper::kFa3BwdRankedAhead.data(),
            attention_hopper::kFa3BwdRankedKernel.data(),
            attention_hopper::kFa3BwdRankedZeroedKernel.data(),
            attention_hopper::kFa3BwdRankedClaimsKernel.data(),
            kFa3HeavyFirst.data(),
            kFa3HeadSplit.data(),
            kFa3HeadSplitHeavyFirst.data(),
            attention_hopper::kFa3BwdFallingKernel.data(),
            attention_hopper::kFa3BwdHeadSplitPartsKernels[0].data(),
            attention_hopper::kFa3BwdHeadSplitPartsKernels[1].data(),
            attention_hopper::kFa3BwdHeadSplitPartsKernels[2].data(),
            kCudnn.data()};
        // Every row's plan first, then all timed in interleaved rounds (bench::time_interleaved).
        struct Row {
          BackwardPlan plan;
          Buffer workspace;
          bool pinned, by_preference, twin = false;
        };
        std::vector<Row> rows;
        std::string default_bwd;
        for (const char* alt : bwd_alts) {
          const bool pinned = *alt != '\0', by_preference = alt == kDeterministic;
          if (pinned && !ab_wanted(alt)) continue;
          const bool cudnn = alt == kCudnnDeterministic || alt == kCudnn;
          // cuDNN's and fa3's entries by name only where BARACUDA_ATTN_KERNELS names them.
          if ((cudnn || std::string_view(alt).starts_with(kFa3)) && kernels_env.empty()) continue;
          auto bwd = BackwardPlan::select(stream, d,
                                          by_preference ? PlanPreference::deterministic()
                                          : pinned      ? PlanPreference::kernel(alt)
                                                        : PlanPreference::fastest());
          // cuDNN's entries come in pairs, one fitting where the table ranks cuDNN first.
          if (cudnn && !bwd.ok())
            bwd = BackwardPlan::select(stream, d,
                                       PlanPreference::kernel(std::string(alt) + "_ranked_behind"));
          if (!bwd.ok()) {
            bench::emit_error(kFamily, "attention_backward", name, bwd.error());
            continue;
          }
          if (!pinned) default_bwd = std::string(bwd->sku().name);
          if (pinned && !by_preference && default_bwd == alt) continue;
          Result<Buffer> bws = Buffer::allocate(std::max<size_t>(bwd->workspace_size(), 16),
                                                stream.memory_location());
          if (!bws.ok()) {
            bench::emit_error(kFamily, "attention_backward", name, bws.error());
            continue;
          }
          rows.push_back({std::move(*bwd), std::move(*bws), pinned, by_preference});
        }
        std::optional<Buffer> spacer;
        if (twin_mib > 0) {
          auto sp = Buffer::allocate(static_cast<size_t>(twin_mib) << 20, stream.memory_location());
          if (sp.ok()) spacer = std::move(*sp);
          const size_t originals = rows.size();
          for (size_t i = 0; i < originals && spacer; ++i) {
            Result<Buffer> tws =
                Buffer::allocate(rows[i].workspace.bytes(), stream.memory_location());
            if (!tws.ok()) break;
            rows.push_back(
                {rows[i].plan, std::move(*tws), rows[i].pinned, rows[i].by_preference, true});
          }
        }
        const auto times = time_rows(stream, rows, ba, "attention_backward", name, 4);
        for (size_t i = 0; i < rows.size(); ++i) {
          const Row& r = rows[i];
          if (!times[i]) continue;
          bench::emit(stream, {kFamily, "attention_backward", name, type_name,
                               std::string(r.plan.sku().name), *times[i],
                               4.0 * n * 2 + 2 * kv_bytes, 2.5 * flops,
                               twin_note(r.by_preference ? "deterministic preference"
                                         : r.pinned      ? "A/B: kernel forced by name"
                                                         : "",
                                         r.twin)});
        }
      }
    }
  }
  // Decode: few query tokens per sequence against a 32k-token KV cache, [B, L, H, D] cache layout.
  // Lq = 1 is plain decode; Lq = 4 is speculative decoding (causal bottom-right). Each case runs
  // the default plan, then every bespoke kernel by name (A/B rows: same case, kernel column).
  if (backward_only || forward_only || t != DType::bf16 || group > 1) return;
  constexpr int64_t kB = 1, kHq = 32, kHk = 8, kL = 32768, kD = 128;
  auto kc = bench::random_buffer(stream, DType::bf16, kB * kL * kHk * kD, gen());
  auto vc = bench::random_buffer(stream, DType::bf16, kB * kL * kHk * kD, gen());
  if (!kc.ok() || !vc.ok()) return;
  // The 4096-key row reads 1/8 of the bytes: its time is mostly the fixed cost (launch, pipeline
  // fill, warp merge, partial write, combine), which the 32k rows pay once as well.
  // The _d64 row is the first row at head dim 64 (half the bytes, the same fixed cost).
  // The _bhld row keeps each head's keys contiguous ([B, H, L, D] cache): the same bytes as the
  // first row, read as long runs instead of 256-byte rows at the 2 KB pitch of the [B, L, H, D]
  // one.
  // The _b12 / _b6 rows are batches of 96 / 48 (batch, K/V head) pairs, where one CTA per split
  // on every SM does not divide evenly (decode_splits' other band); each sequence its own dense
  // cache of lk rows.
  // The _ragged row is a serving batch: 16 caches of 2048 rows filled to different lengths
  // (seqused_k, spread over [256, 2048]); its bytes and % of copy count the keys used only, and its
  // time is the longest sequence's (the split plan is made on the host from the 2048-row bound).
  // The _paged64 / _paged16 rows are the same batch with its caches as 64- or 16-key pages of one
  // pool, scattered by the block table: the same bytes as the _ragged row. The b1 _paged64 row is
  // the first row's cache as scattered 64-key pages.
  struct DecodeCase {
    int64_t lq, lk;
    const char* name;
    bool heads_outer = false;
    int64_t dim = kD;
    int64_t batch = kB;
    bool ragged = false;
    int64_t page_size = 0;  // > 0: the ragged caches as pages of one pool, in a scattered order
  };
  for (const DecodeCase& dc :
       {DecodeCase{1, kL, "decode_b1_hq32_hk8_lk32768_d128"},
        DecodeCase{4, kL, "decode_b1_hq32_hk8_lq4_lk32768_d128_causal"},
        DecodeCase{1, 4096, "decode_b1_hq32_hk8_lk4096_d128"},
        DecodeCase{1, kL, "decode_b1_hq32_hk8_lk32768_d128_bhld", true},
        DecodeCase{1, kL, "decode_b1_hq32_hk8_lk32768_d64", false, 64},
        DecodeCase{1, 2048, "decode_b12_hq32_hk8_lk2048_d128", false, kD, 12},
        DecodeCase{1, 4096, "decode_b6_hq32_hk8_lk4096_d128", false, kD, 6},
        DecodeCase{1, 4096, "decode_b12_hq32_hk8_lk4096_d64", false, 64, 12},
        DecodeCase{1, 2048, "decode_b16_hq32_hk8_lk2048_d128_ragged", false, kD, 16, true},
        DecodeCase{1, 2048, "decode_b16_hq32_hk8_lk2048_d128_paged64", false, kD, 16, true, 64},
        DecodeCase{1, 2048, "decode_b16_hq32_hk8_lk2048_d128_paged16", false, kD, 16, true, 16},
        DecodeCase{1, kL, "decode_b1_hq32_hk8_lk32768_d128_paged64", false, kD, 1, false, 64}}) {
    if (prefill_only) break;
    const int64_t lq = dc.lq, lk = dc.lk, dim = dc.dim, batch = dc.batch;
    // Rows a sequence's cache holds: one sequence reads the first lk of kL (at the front of the
    // buffers); a batch's caches are lk rows each, back to back.
    const int64_t rows = batch == 1 ? kL : lk;
    const std::string name = dc.name;
    Descriptor d;
    d.dtype = DType::bf16, d.batch = batch, d.heads_q = kHq, d.heads_kv = kHk, d.len_q = lq;
    d.len_k = lk, d.head_dim_qk = d.head_dim_v = dim;
    d.mask = Mask::causal_bottom_right();
    d.seqused_k = dc.ragged;
    // Paged rows: the buffers' kL rows as a pool of kL / page_size pages in [pages, page_size, Hk,
    // D] memory (vLLM's layout), each sequence's pages scattered over it (page i of the table's
    // row-major order is page 7919 i mod pages: a permutation, the count being a power of two).
    const int64_t pages = dc.page_size > 0 ? kL / dc.page_size : 0;
    const int64_t cols = dc.page_size > 0 ? lk / dc.page_size : 0;
    d.page_size = dc.page_size, d.pages = pages;
    std::vector<int32_t> table(static_cast<size_t>(batch * cols));
    for (size_t i = 0; i < table.size(); ++i)
      table[i] = static_cast<int32_t>((static_cast<int64_t>(i) * 7919) % pages);
    std::vector<int32_t> used(static_cast<size_t>(batch), static_cast<int32_t>(lk));
    if (dc.ragged)  // spread over [256, 2048] by a formula peers.py repeats
      for (int64_t b = 0; b < batch; ++b)
        used[b] = static_cast<int32_t>(256 + (b * 997 + 331) % 1793);
    int64_t keys = 0;  // the keys read: lk a sequence, or its count
    for (int32_t u : used) keys += u;
    auto used_dev = Buffer::allocate(used.size() * sizeof(int32_t), stream.memory_location());
    auto table_dev = Buffer::allocate(std::max<size_t>(table.size(), 1) * sizeof(int32_t),
                                      stream.memory_location());
    if (!used_dev.ok() || !table_dev.ok() ||
        !copy_bytes(used_dev->data(), used_dev->where(), used.data(), Location::host(),
                    used.size() * sizeof(int32_t))
             .ok() ||
        !copy_bytes(table_dev->data(), table_dev->where(), table.data(), Location::host(),
                    table.size() * sizeof(int32_t))
             .ok())
      return;
    const int64_t ks_padded[] = {batch, kHk, lk, dim}, ks_pool[] = {pages, kHk, dc.page_size, dim};
    const std::span<const int64_t> ks(dc.page_size > 0 ? ks_pool : ks_padded);
    const int64_t bhld[] = {rows * kHk * dim, rows * dim, dim, 1},
                  blhd[] = {rows * kHk * dim, dim, kHk * dim, 1},
                  pool[] = {dc.page_size * kHk * dim, dim, kHk * dim, 1};
    const std::span<const int64_t> kst(dc.page_size > 0 ? pool : dc.heads_outer ? bhld : blhd);
    const ConstTensor tk = make_strided(static_cast<const void*>(kc->data()), DType::bf16, ks, kst,
                                        stream.memory_location());
    const ConstTensor tv = make_strided(static_cast<const void*>(vc->data()), DType::bf16, ks, kst,
                                        stream.memory_location());
    const Tensor tq = view4(q->data(), batch, kHq, lq, dim, stream, DType::bf16);
    const Tensor ty = view4(y->data(), batch, kHq, lq, dim, stream, DType::bf16);
    const int64_t lse_shape[] = {batch, kHq, lq};
    const Tensor tl = make_tensor(lse->data(), DType::f32, lse_shape, stream.memory_location());
    ForwardArguments fa{as_const(tq), tk, tv, ty, tl, {}, {}};
    const int64_t nb[] = {batch};
    if (dc.ragged)
      fa.seqused_k = make_tensor(static_cast<const void*>(used_dev->data()), DType::i32, nb,
                                 stream.memory_location());
    const int64_t tshape[] = {batch, cols};
    if (dc.page_size > 0)
      fa.block_table = make_tensor(static_cast<const void*>(table_dev->data()), DType::i32, tshape,
                                   stream.memory_location());
    // The default plan and every bespoke kernel by name, timed in interleaved rounds; then each
    // decode kernel's steady loop (and the default's host enqueue) on its own.
    std::vector<std::string_view> names;
    std::vector<PlannedForward> plans;
    for (const std::string_view kn : {"", "flash_decode_sm80", "flash_decode_w4_sm80",
                                      "flash_decode_fused_sm80", "flash_fwd_mma_sm80"})
      if (auto planned = plan_forward(stream, d, kn, "attention_decode", name)) {
        names.push_back(kn);
        plans.push_back(std::move(*planned));
      }
    const auto medians = time_forward_rows(stream, plans, fa, "attention_decode", name);
    for (size_t i = 0; i < plans.size(); ++i) {
      if (!medians[i]) continue;
      const std::string_view kn = names[i];
      ForwardPlan* fwd = &plans[i].plan;
      Buffer* ws = &plans[i].workspace;
      // Bytes: the KV cache read once (Q, Y and LSE are negligible); memory-bound, so no FLOPs.
      const double kv_bytes = 2.0 * static_cast<double>(keys) * kHk * dim * 2;
      bench::emit(stream, {kFamily, "attention_decode", name, "bf16", std::string(fwd->sku().name),
                           *medians[i], kv_bytes, 0,
                           kn.empty() ? "default plan; % of copy bandwidth on KV bytes"
                                      : "A/B: kernel forced by name"});
      if (!kn.empty() && !kn.starts_with("flash_decode")) continue;
      // The plan as a decode loop runs it: 200 steps back to back, one event pair.
      auto steady = bench::time_back_to_back(
          stream, [&] { return fwd->run(stream, ws->as_workspace(), fa); });
      if (steady.ok())
        bench::emit(stream, {kFamily, "attention_decode", name + "_back_to_back", "bf16",
                             std::string(fwd->sku().name), steady->median_ms, kv_bytes, 0,
                             kn.empty() ? "default plan, 200 runs between one event pair, per run"
                                        : "A/B: 200 runs between one event pair, per run"});
      if (!kn.empty()) continue;
      // The host's time to enqueue one run (argument checks and launches): what bounds a decode
      // loop without CUDA graphs where the GPU's part is shorter (the 4096-key row).
      auto host = bench::time_host_enqueue(
          stream, [&] { return fwd->run(stream, ws->as_workspace(), fa); });
      if (host.ok())
        bench::emit(stream, {kFamily, "attention_decode_host_enqueue", name, "bf16",
                             std::string(fwd->sku().name), host->median_ms, 0, 0,
                             "default plan: host wall time per run() call, 100 calls a round"});
    }
  }
  // Chunked prefill: Lq new tokens a sequence at the end of 4096-key caches (causal, bottom-right),
  // 4 sequences. The cache as a padded [B, L, H, D] cache and as one of twice the capacity read
  // through per-sequence key counts (seqused_k, each sequence's first 4096 rows), for Lq from 32 to
  // 2048; at Lq 512 also as scattered 64-, 32-, 16- or 8-key pages, at Lq 32 as 64- or 16-key
  // pages. A/B rows by name: m32s_straight (the family's prefill shape), m16 at Lq 512 (the paged
  // kernel's first shape), and where they are built fa3 (its counts / paged instance for counted /
  // paged caches) and cuDNN: the selection table's columns were measured with Lq = Lk only, so
  // these rows are what the rule for a chunk against a longer cache stands on. TFLOP/s on the
  // visible keys.
  {
    constexpr int64_t kPB = 4, kPLk = 4096;
    // Page size; 0: padded; kCounts: padded, 2 kPLk rows a sequence, kPLk of them counted.
    constexpr int64_t kCounts = -1;
    static_assert(kPB * 2 * kPLk <= kL, "the counts rows' caches fit the pool");
    for (const int64_t lq : {32, 64, 128, 256, 512, 1024, 2048}) {
      const double flops =
          4.0 * kPB * kHq * kD *
          detail::visible_key_total(detail::band_of(Mask::causal_bottom_right()), lq, kPLk);
      std::vector<int64_t> layouts;
      if (!paged_prefill_only) layouts = {0, kCounts};
      if (lq == 512) layouts.insert(layouts.begin(), {64, 32, 16, 8});
      if (lq == 32) layouts.insert(layouts.begin(), {64, 16});  // short chunks in pages
      if (const int64_t page = bench::env_positive("BARACUDA_ATTN_PAGE", 0); page > 0)
        std::erase_if(layouts, [&](int64_t ps) { return ps != page; });
      for (const int64_t ps : layouts) {
        const std::string name = "prefill_b4_hq32_hk8_lq" + std::to_string(lq) + "_lk4096_d128_" +
                                 (ps > 0    ? "paged" + std::to_string(ps)
                                  : ps == 0 ? std::string("padded")
                                            : std::string("counts"));
        const int64_t rows = ps == kCounts ? 2 * kPLk : kPLk;  // a sequence's cache rows
        Descriptor d;
        d.dtype = DType::bf16, d.batch = kPB, d.heads_q = kHq, d.heads_kv = kHk, d.len_q = lq;
        d.len_k = rows, d.head_dim_qk = d.head_dim_v = kD;
        d.seqused_k = ps == kCounts;
        d.mask = Mask::causal_bottom_right();
        // The decode rows' pool (kL rows): padded, sequence b's cache is rows [b rows, (b + 1)
        // rows); paged, kL / ps pages of which the table scatters B * Lk / ps (7919 i mod pages).
        const int64_t pages = ps > 0 ? kL / ps : 0, cols = ps > 0 ? kPLk / ps : 0;
        d.page_size = std::max<int64_t>(ps, 0), d.pages = pages;
        // The block table (paged) or the key counts (counts rows).
        std::vector<int32_t> table(static_cast<size_t>(ps == kCounts ? kPB : kPB * cols));
        for (size_t i = 0; i < table.size(); ++i)
          table[i] = ps == kCounts ? static_cast<int32_t>(kPLk)
                                   : static_cast<int32_t>((static_cast<int64_t>(i) * 7919) % pages);
        auto table_dev = Buffer::allocate(std::max<size_t>(table.size(), 1) * sizeof(int32_t),
                                          stream.memory_location());
        if (!table_dev.ok() || !copy_bytes(table_dev->data(), table_dev->where(), table.data(),
                                           Location::host(), table.size() * sizeof(int32_t))
                                    .ok())
          return;
        const int64_t ks_padded[] = {kPB, kHk, rows, kD}, ks_pool[] = {pages, kHk, ps, kD};
        const int64_t blhd[] = {rows * kHk * kD, kD, kHk * kD, 1},
                      pool[] = {ps * kHk * kD, kD, kHk * kD, 1};
        const std::span<const int64_t> ks(ps > 0 ? ks_pool : ks_padded), kst(ps > 0 ? pool : blhd);
        const ConstTensor tk = make_strided(static_cast<const void*>(kc->data()), DType::bf16, ks,
                                            kst, stream.memory_location());
        const ConstTensor tv = make_strided(static_cast<const void*>(vc->data()), DType::bf16, ks,
                                            kst, stream.memory_location());
        const int64_t lse_shape[] = {kPB, kHq, lq};
        ForwardArguments fa{
            as_const(view4(q->data(), kPB, kHq, lq, kD, stream, DType::bf16)),
            tk,
            tv,
            view4(y->data(), kPB, kHq, lq, kD, stream, DType::bf16),
            make_tensor(lse->data(), DType::f32, lse_shape, stream.memory_location()),
            {},
            {}};
        const int64_t tshape[] = {kPB, cols};
        const int64_t cshape[] = {kPB};
        if (ps > 0)
          fa.block_table = make_tensor(static_cast<const void*>(table_dev->data()), DType::i32,
                                       tshape, stream.memory_location());
        if (ps == kCounts)
          fa.seqused_k = make_tensor(static_cast<const void*>(table_dev->data()), DType::i32,
                                     cshape, stream.memory_location());
        // The default plan first; then the A/B kernels it did not pick. The sm_90a entries
        // (attention_hopper's) leave no row where they are not built.
        std::vector<std::string_view> kernels = {""};
        if (ps <= 0) kernels.push_back("flash_fwd_mma_m32s_straight_sm80");
        if (ps == 0 && lq == 512) kernels.push_back("flash_fwd_mma_m16_sm80");
        if (ps == 0) kernels.insert(kernels.end(), {"fa3_fwd_sm90a", "cudnn_sdpa"});
        if (ps == kCounts) kernels.push_back("fa3_fwd_sm90a_seqused");
        // GQA packing (4 query heads a tile) with split keys: the chunks shorter than a tile.
        if (ps <= 0 && lq <= 256) kernels.push_back("fa3_fwd_sm90a_packed");
        if (ps > 0 && lq <= 256) kernels.push_back("fa3_fwd_sm90a_packed_paged");
        if (ps > 0)
          kernels.insert(kernels.end(), {"fa3_fwd_sm90a_paged", "flash_fwd_mma_paged_sm80"});
        // Every row's plan first, then all timed in interleaved rounds.
        std::string picked;
        std::vector<std::string_view> names;
        std::vector<PlannedForward> plans;
        for (const std::string_view kn : kernels) {
          if (!kn.empty() && kn == picked) continue;
          const bool sm90 = kn.starts_with("fa3_") || kn.starts_with("cudnn_");
          auto planned = plan_forward(stream, d, kn, "attention_prefill", name, !sm90);
          if (!planned) continue;
          if (kn.empty()) picked = planned->plan.sku().name;
          names.push_back(kn);
          plans.push_back(std::move(*planned));
        }
        const auto medians = time_forward_rows(stream, plans, fa, "attention_prefill", name);
        for (size_t i = 0; i < plans.size(); ++i)
          if (medians[i])
            bench::emit(stream, {kFamily, "attention_prefill", name, "bf16",
                                 std::string(plans[i].plan.sku().name), *medians[i], 0, flops,
                                 names[i].empty() ? "default plan; TFLOP/s on the visible keys"
                                                  : "A/B: kernel forced by name"});
      }
    }
  }
}

[[maybe_unused]] const bool registered = bench::register_bench(kFamily, bench_all);

}  // namespace
}  // namespace baracuda::attention
