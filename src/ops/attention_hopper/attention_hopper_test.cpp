// Tests of the Hopper-class attention backends (issue 8), compiled into test_attention.
//  - AttentionCudnnRules:    host rules (what cuDNN takes, layout errors, the selection table).
//  - AttentionCudnnRegistry: the cuDNN kernels are registered with truthful precision claims.
//  - AttentionCudnnGpu:      forward + LSE + backward of every cuDNN kernel against the float64
//                            reference on random data, determinism claims checked bitwise, and
//                            plan selection (skip visibly without a GPU).
//  - AttentionFa3Registry:   the sm_90a forward (fa3_fwd_sm90a) is registered below every other
//                            forward kernel with a truthful precision claim.
//  - AttentionFa3Gpu:        fa3_fwd_sm90a pinned by name against the float64 reference (Y and
//                            LSE), run twice and compared bitwise; what its predicate accepts;
//                            fa3_bwd_sm90a (dQ, dK, dV) against the float64 reference backward.
// The float64 reference is bounded (see "The float64 oracle" below): every GPU test here finishes
// in seconds; big shapes are checked on sampled rows plus whole-tensor checks.
#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "baracuda/ops/attention.hpp"
#include "baracuda/ops/attention_hopper.hpp"
#include "core/testing/testing.hpp"
#include "ops/attention/common.hpp"
#include "ops/attention/reference.hpp"
#include "ops/attention/test_oracle.hpp"

namespace baracuda::attention_hopper {
namespace {

using attention::Descriptor;
using attention::Diagonal;
using attention::Mask;
using attention::testing::RowBlock;
using attention::testing::rows_of;
using harness::Accuracy;
using harness::fails_with;
using harness::parallel_for;
using harness::Target;
using harness::TestTensor;

Descriptor make_desc(DType t, int64_t b, int64_t hq, int64_t hk, int64_t lq, int64_t lk, int64_t d,
                     Mask m = Mask::none()) {
  Descriptor x;
  x.dtype = t;
  x.batch = b;
  x.heads_q = hq;
  x.heads_kv = hk;
  x.len_q = lq;
  x.len_k = lk;
  x.head_dim_qk = d;
  x.head_dim_v = d;
  x.mask = m;
  return x;
}

attention::Problem problem_of(const Descriptor& d) {
  auto p = attention::ForwardOp::make_problem(d);
  EXPECT_TRUE(p.ok()) << p.error().to_string();
  return p.value();
}

bool fa3_kernel_registered() {
  return KernelTable<attention::ForwardOp>::instance().find(kFa3Kernel, DType::bf16) != nullptr;
}

// ---- Host rules ---------------------------------------------------------------------------------
TEST(AttentionCudnnRules, ScreenNamesWhyCudnnCannotTakeAProblem) {
  struct Refused {
    Descriptor d;
    const char* needle;
  };
  Descriptor varlen = make_desc(DType::bf16, 2, 4, 4, 16, 16, 64);
  varlen.varlen = true;
  varlen.total_q = varlen.total_k = 32;
  Descriptor varlen_counted = varlen;
  varlen_counted.seqused_k = true;
  Descriptor capped = make_desc(DType::bf16, 1, 4, 4, 16, 16, 64);
  capped.softcap = 30;
  Descriptor dv = make_desc(DType::f16, 1, 4, 4, 16, 16, 64);
  dv.head_dim_v = 60;
  Descriptor used = make_desc(DType::bf16, 2, 4, 4, 16, 16, 64);
  used.seqused_k = true;
  Descriptor paged = make_desc(DType::bf16, 2, 4, 4, 16, 16, 64);
  paged.page_size = 16, paged.pages = 2;
  const Refused cases[] = {
      {used, "seqused_k: cuDNN's padding mask multiplies a cache's rows past each count into P V"},
      {paged, "page_size: paged K / V are not wired to cuDNN"},
      {make_desc(DType::f32, 1, 4, 4, 16, 16, 64), "dtype=f32: cuDNN SDPA takes bf16 or f16"},
      {varlen_counted, "varlen with seqused_k: cuDNN's padding mask would multiply"},
      {capped, "softcap: cuDNN SDPA has no logit soft-capping"},
      {make_desc(DType::bf16, 1, 4, 4, 16, 16, 60),
       "head_dim_qk=60, head_dim_v=60: cuDNN needs multiples of 8"},
      {dv, "head_dim_qk=64, head_dim_v=60"},
      {make_desc(DType::bf16, 1, 4, 4, 0, 16, 64), "empty problem (batch=1, heads_q=4, len_q=0"},
      {make_desc(DType::bf16, 1, 4, 4, 16, 16, 64, Mask::sliding_window(8, -1)),
       "mask=window(8,-1,bottom_right): cuDNN needs a right bound with a left bound"},
      // Bottom-right causal with more queries than keys: the first rows see nothing.
      {make_desc(DType::bf16, 1, 4, 4, 20, 12, 64, Mask::causal_bottom_right()),
       "len_q=20, len_k=12: query row 0 sees no key"},
      // Top-left window whose last rows fall past the last key.
      {make_desc(DType::bf16, 1, 4, 4, 10, 4, 64, Mask::sliding_window(2, 0, Diagonal::top_left)),
       "query row 9 sees no key"},
  };
  for (const Refused& c : cases) {
    const auto why = cudnn_screen(problem_of(c.d));
    ASSERT_TRUE(why.has_value()) << c.needle;
    EXPECT_NE(why->find(c.needle), std::string::npos) << *why << " lacks " << c.needle;
  }
  // Packed sequences (the forward; cudnn_sdpa.cpp refuses the backward), rows that see no key
  // included (a pass after cuDNN's writes them).
  Descriptor varlen_keyless =
      make_desc(DType::bf16, 2, 4, 4, 20, 12, 64, Mask::causal_bottom_right());
  varlen_keyless.varlen = true, varlen_keyless.total_q = 40, varlen_keyless.total_k = 24;
  const Descriptor accepted[] = {
      varlen,
      varlen_keyless,
      make_desc(DType::bf16, 2, 8, 8, 128, 128, 128),
      make_desc(DType::f16, 1, 8, 2, 77, 203, 64, Mask::causal_bottom_right()),
      make_desc(DType::bf16, 1, 8, 1, 77, 203, 64, Mask::causal_top_left()),
      make_desc(DType::bf16, 1, 4, 4, 256, 256, 128, Mask::sliding_window(64, 0)),
      make_desc(DType::f16, 1, 4, 4, 12, 20, 256, Mask::causal_top_left()),
  };
  for (const Descriptor& d : accepted) {
    const auto why = cudnn_screen(problem_of(d));
    EXPECT_FALSE(why.has_value()) << *why;
  }
}

// select's error under only(Backend::cudnn) quotes why cuDNN took nothing: the ranked-behind
// entries' refusal gives cudnn_screen's rule, the missing GPU, or cuDNN's graph message; nothing
// where no graph was asked for (asking builds none). A build with the cuDNN frontend (CI's CUDA
// build), on the host: the screen answers before any device work.
#if BARACUDA_HAVE_CUDNN_FRONTEND
TEST(AttentionCudnnRules, RefusalQuotesTheRule) {
  DeviceCaps gpu;
  gpu.device = 0, gpu.sm = 90;
  const auto* fwd =
      KernelTable<attention::ForwardOp>::instance().find("cudnn_sdpa_ranked_behind", DType::bf16);
  const auto* ahead = KernelTable<attention::ForwardOp>::instance().find("cudnn_sdpa", DType::bf16);
  const auto* bwd = KernelTable<attention::BackwardOp>::instance().find(
      "cudnn_sdpa_bwd_deterministic_ranked_behind", DType::f16);
  ASSERT_TRUE(fwd && ahead && bwd);
  ASSERT_TRUE(fwd->refusal && bwd->refusal);
  EXPECT_FALSE(ahead->refusal);  // quoted once, by its twin
  Descriptor capped = make_desc(DType::bf16, 1, 4, 4, 16, 16, 64);
  capped.softcap = 30;
  const auto why = fwd->refusal(problem_of(capped), gpu);
  ASSERT_TRUE(why.has_value());
  EXPECT_NE(why->find("softcap: cuDNN SDPA has no logit soft-capping"), std::string::npos) << *why;
  Descriptor capped16 = capped;
  capped16.dtype = DType::f16;
  const auto bwhy = bwd->refusal(problem_of(capped16), gpu);
  ASSERT_TRUE(bwhy.has_value());
  EXPECT_NE(bwhy->find("softcap: cuDNN SDPA has no logit soft-capping"), std::string::npos)
      << *bwhy;
  const attention::Problem plain = problem_of(make_desc(DType::bf16, 1, 4, 4, 16, 16, 64));
  const auto host = fwd->refusal(plain, DeviceCaps{});
  ASSERT_TRUE(host.has_value());
  EXPECT_NE(host->find("GPUs from sm_80"), std::string::npos) << *host;
  EXPECT_FALSE(fwd->refusal(plain, gpu).has_value());
}
#endif

TEST(AttentionCudnnRules, TuningTakesShortProblemsWithWorkAndScratchToSpare) {
  // The sweep's short points (where the heuristics' first choice measured below PyTorch's).
  const attention::Problem sweep_point =
      problem_of(make_desc(DType::bf16, 32, 32, 32, 512, 512, 64, Mask::causal_top_left()));
  EXPECT_TRUE(cudnn_tunes(sweep_point));  // 8.6 GFLOP
  EXPECT_TRUE(cudnn_tunes(problem_of(make_desc(DType::f16, 8, 16, 16, 2048, 2048, 128))));
  // Longer than kCudnnTuneMaxArea pairs per head: the heuristics' choice.
  EXPECT_FALSE(cudnn_tunes(problem_of(make_desc(DType::bf16, 2, 16, 16, 8192, 8192, 128))));
  EXPECT_FALSE(cudnn_tunes(problem_of(make_desc(DType::bf16, 1, 16, 16, 4097, 4096, 128))));
  // Less work than kCudnnTuneMinFlops: 4 x 4 x 8 x 512^2 x 64 x 0.5 = 1.07 GFLOP (causal).
  const attention::Problem small =
      problem_of(make_desc(DType::bf16, 4, 8, 8, 512, 512, 64, Mask::causal_top_left()));
  EXPECT_FALSE(cudnn_tunes(small));
  // Scratch over kCudnnTuneScratchBytes: 64 x 32 heads x 4096 rows x 128 x 8 tensors x 2 bytes.
  EXPECT_FALSE(cudnn_tunes(problem_of(make_desc(DType::bf16, 64, 32, 32, 4096, 4096, 128))));
  // What cuDNN is not given is not tuned either.
  Descriptor capped = make_desc(DType::bf16, 32, 32, 32, 512, 512, 64);
  capped.softcap = 30;
  EXPECT_FALSE(cudnn_tunes(problem_of(capped)));
  EXPECT_FALSE(cudnn_tunes(problem_of(make_desc(DType::f32, 32, 32, 32, 512, 512, 64))));
  EXPECT_EQ(cudnn_tuning_mode(), CudnnTuningMode::by_size);
  {
    const CudnnTuningScope any(CudnnTuningMode::any_size);  // drops the minimum of work only
    EXPECT_TRUE(cudnn_tunes(small));
    EXPECT_FALSE(cudnn_tunes(problem_of(make_desc(DType::bf16, 2, 16, 16, 8192, 8192, 128))));
    EXPECT_FALSE(cudnn_tunes(problem_of(capped)));
    {
      const CudnnTuningScope off(CudnnTuningMode::off);  // nothing, and scopes nest
      EXPECT_FALSE(cudnn_tunes(small));
      EXPECT_FALSE(cudnn_tunes(sweep_point));
    }
    EXPECT_TRUE(cudnn_tunes(small));
  }
  EXPECT_FALSE(cudnn_tunes(small));  // and end with their scopes
  EXPECT_TRUE(cudnn_tunes(sweep_point));
  set_cudnn_tuning_mode(CudnnTuningMode::off);
  EXPECT_FALSE(cudnn_tunes(sweep_point));
  set_cudnn_tuning_mode(CudnnTuningMode::by_size);
  EXPECT_TRUE(cudnn_tunes(sweep_point));
}

// The release the process loaded is reported without a GPU. Only the major version is checked:
// the loader may pick a release older or newer than the headers the build used.
TEST(AttentionCudnnRules, LoadedReleaseIsReported) {
  const std::optional<int64_t> v = cudnn_loaded_version();
#if BARACUDA_HAVE_CUDNN_FRONTEND
  ASSERT_TRUE(v.has_value());
  EXPECT_EQ(*v / 10000, 9) << *v;
#else
  EXPECT_FALSE(v.has_value());
#endif
}

TEST(AttentionCudnnRules, LayoutRulesNameArgumentRuleAndNumbers) {
  const int64_t shape[] = {2, 4, 16, 64};
  const int64_t dense[] = {4096, 1024, 64, 1};
  const auto* base = reinterpret_cast<const void*>(uintptr_t{0x10000});
  const ConstTensor ok = make_strided(base, DType::bf16, shape, dense, Location::cuda(0));
  BARACUDA_EXPECT_OK(cudnn_check_layout("attention_forward", "q", ok, false));

  ConstTensor shifted = ok;
  shifted.data = reinterpret_cast<const void*>(uintptr_t{0x10002});
  EXPECT_TRUE(fails_with(cudnn_check_layout("attention_forward", "k", shifted, false),
                         ErrorKind::misaligned_operand,
                         {"attention_forward: k: data=0x10002 is not 16-byte aligned"}));

  const int64_t odd_pitch[] = {2 * 16 * 100, 16 * 100, 100, 1};  // 200-byte rows
  const Tensor y = make_strided(reinterpret_cast<void*>(uintptr_t{0x10000}), DType::f16, shape,
                                odd_pitch, Location::cuda(0));
  EXPECT_TRUE(fails_with(
      cudnn_check_layout("attention_backward", "dq", y, false), ErrorKind::misaligned_operand,
      {"attention_backward: dq: stride[2]=100 elements is not a multiple of 16"}));

  // A size-1 axis's stride is never used, so it may be anything.
  const int64_t one[] = {1, 4, 16, 64};
  const int64_t any[] = {3, 1024, 64, 1};
  BARACUDA_EXPECT_OK(
      cudnn_check_layout("attention_forward", "q",
                         make_strided(base, DType::bf16, one, any, Location::cuda(0)), false));

  const int64_t lse_shape[] = {2, 4, 16};
  const int64_t lse_st[] = {64, 16, 1};
  const Tensor lse = make_strided(reinterpret_cast<void*>(uintptr_t{0x10002}), DType::f32,
                                  lse_shape, lse_st, Location::cuda(0));
  EXPECT_TRUE(fails_with(cudnn_check_layout("attention_forward", "lse", lse, true),
                         ErrorKind::misaligned_operand,
                         {"lse: data=0x10002 is not 4-byte aligned"}));
  const int64_t lse_gap[] = {128, 32, 2};
  const Tensor strided_rows = make_strided(reinterpret_cast<void*>(uintptr_t{0x10000}), DType::f32,
                                           lse_shape, lse_gap, Location::cuda(0));
  EXPECT_TRUE(fails_with(
      cudnn_check_layout("attention_backward", "lse", strided_rows, true), ErrorKind::unsupported,
      {"attention_backward: lse: stride[2]=2: cudnn_sdpa needs unit-stride LSE rows"}));
}

// cuDNN's packed-sequence forward reads int32 ragged offsets, the last of which (B's) is the packed
// rows times the token stride: its registry check (what can_implement applies before a launch)
// refuses tensors where that passes 2^31 - 1, naming the tensor and the numbers; one row fewer
// passes. Host only (no device access).
#if BARACUDA_HAVE_CUDNN_FRONTEND
TEST(AttentionCudnnRules, VarlenOffsetsMustFitInt32) {
  const auto* kern =
      KernelTable<attention::ForwardOp>::instance().find("cudnn_sdpa_ranked_behind", DType::bf16);
  ASSERT_TRUE(kern && kern->check);
  // Packed [T, 1, 128] tensors: 2^24 rows end at element 2^31.
  const int64_t rows = int64_t{1} << 24;
  auto check = [&](int64_t q_rows, int64_t kv_rows) {
    Descriptor d = make_desc(DType::bf16, 1, 1, 1, 4096, 4096, 128);
    d.varlen = true, d.total_q = q_rows, d.total_k = kv_rows;
    auto* base = reinterpret_cast<void*>(uintptr_t{0x10000});
    const int64_t q_shape[] = {q_rows, 1, 128}, kv_shape[] = {kv_rows, 1, 128},
                  st[] = {128, 128, 1}, lse_shape[] = {1, q_rows}, lse_st[] = {q_rows, 1};
    const void* in = base;
    return kern->check(problem_of(d),
                       {make_strided(in, DType::bf16, q_shape, st, Location::cuda(0)),
                        make_strided(in, DType::bf16, kv_shape, st, Location::cuda(0)),
                        make_strided(in, DType::bf16, kv_shape, st, Location::cuda(0)),
                        make_strided(base, DType::bf16, q_shape, st, Location::cuda(0)),
                        make_strided(base, DType::f32, lse_shape, lse_st, Location::cuda(0)),
                        {},
                        {}});
  };
  EXPECT_TRUE(fails_with(check(rows, rows - 1), ErrorKind::unsupported,
                         {"attention_forward: cudnn_sdpa: q: varlen: 16777216 rows at "
                          "stride[0]=128 exceed cuDNN's int32 ragged offsets"}));
  EXPECT_TRUE(fails_with(check(rows - 1, rows), ErrorKind::unsupported,
                         {"attention_forward: cudnn_sdpa: k: varlen: 16777216 rows"}));
  BARACUDA_EXPECT_OK(check(rows - 1, rows - 1));
}

// cuDNN's ragged backward takes dense [T, H, D] tensors only (check_dense_ragged_backward: padded
// inputs measured wrong, padded gradients outgrow the plan's workspace), and head dims up to 128.
TEST(AttentionCudnnRules, VarlenBackwardTensorsMustBeDense) {
  const auto* kern = KernelTable<attention::BackwardOp>::instance().find(
      "cudnn_sdpa_bwd_ranked_behind", DType::bf16);
  ASSERT_TRUE(kern && kern->check);
  Descriptor d = make_desc(DType::bf16, 2, 4, 2, 64, 64, 64);
  d.varlen = true, d.total_q = 100, d.total_k = 90;
  auto* base = reinterpret_cast<void*>(uintptr_t{0x10000});
  // pad: extra elements after each token's heads (dq_pad on dQ, kv_pad on dK / dV, in_pad on
  // every input); head_major: dQ stored [H, T, D].
  auto check = [&](int64_t dq_pad, int64_t kv_pad, int64_t in_pad, bool head_major = false) {
    const int64_t q_shape[] = {100, 4, 64}, kv_shape[] = {90, 2, 64}, lse_shape[] = {4, 100},
                  lse_st[] = {100, 1};
    const int64_t q_in[] = {256 + in_pad, 64, 1}, kv_in[] = {128 + in_pad, 64, 1},
                  dq_st[] = {256 + dq_pad, 64, 1}, dq_hm[] = {64, 6400, 1},
                  dkv_st[] = {128 + kv_pad, 64, 1};
    const void* in = base;
    auto t = [&](const void* p, std::span<const int64_t> shape, std::span<const int64_t> st) {
      return make_strided(p, DType::bf16, shape, st, Location::cuda(0));
    };
    auto o = [&](std::span<const int64_t> shape, std::span<const int64_t> st) {
      return make_strided(base, DType::bf16, shape, st, Location::cuda(0));
    };
    return kern->check(problem_of(d),
                       {t(in, q_shape, q_in),
                        t(in, kv_shape, kv_in),
                        t(in, kv_shape, kv_in),
                        t(in, q_shape, q_in),
                        t(in, q_shape, q_in),
                        make_strided(in, DType::f32, lse_shape, lse_st, Location::cuda(0)),
                        o(q_shape, head_major ? std::span<const int64_t>(dq_hm) : dq_st),
                        o(kv_shape, dkv_st),
                        o(kv_shape, dkv_st),
                        {},
                        {}});
  };
  BARACUDA_EXPECT_OK(check(0, 0, 0));
  EXPECT_TRUE(fails_with(check(0, 0, 8), ErrorKind::unsupported,
                         {"attention_backward: cudnn_sdpa: q: varlen: strides (264, 64, 1) are "
                          "not dense [T, H, D] (256, 64, 1): cuDNN's ragged backward takes dense "
                          "tensors only"}));
  EXPECT_TRUE(fails_with(check(8, 0, 0), ErrorKind::unsupported,
                         {"attention_backward: cudnn_sdpa: dq: varlen: strides (264, 64, 1) are "
                          "not dense [T, H, D] (256, 64, 1)"}));
  EXPECT_TRUE(fails_with(check(0, 8, 0), ErrorKind::unsupported,
                         {"cudnn_sdpa: dk: varlen: strides (136, 64, 1)"}));
  EXPECT_TRUE(fails_with(check(0, 0, 0, true), ErrorKind::unsupported,
                         {"cudnn_sdpa: dq: varlen: strides (64, 6400, 1)"}));
  // Head dims over 128: refused by name, before any graph (the refusal hook, as select quotes it).
  ASSERT_TRUE(kern->refusal);
  DeviceCaps gpu;
  gpu.device = 0, gpu.sm = 90;
  Descriptor wide = d;
  wide.head_dim_qk = wide.head_dim_v = 256;
  const auto why = kern->refusal(problem_of(wide), gpu);
  ASSERT_TRUE(why.has_value());
  EXPECT_NE(why->find("varlen backward with head_dim_qk=256, head_dim_v=256: cuDNN's ragged "
                      "backward over 128"),
            std::string::npos)
      << *why;
  EXPECT_FALSE(kern->fits(problem_of(wide), gpu));
  const auto* fwd =
      KernelTable<attention::ForwardOp>::instance().find("cudnn_sdpa_ranked_behind", DType::bf16);
  ASSERT_TRUE(fwd && fwd->refusal);
  EXPECT_FALSE(fwd->refusal(problem_of(wide), gpu).has_value());  // the forward takes it
}
#endif

// A column displaces the one before it (cuDNN, then the family's kernels, then fa3) only when it
// leads by more than kTableLeadMargin: a lead inside the runs' spread keeps the incumbent, with and
// without cuDNN, at Lq = Lk points and chunk points alike.
TEST(AttentionCudnnRules, LeadsWithinTheMarginKeepTheIncumbent) {
  const double inside = 1.0 + kTableLeadMargin / 2, beyond = 1.0 + 2 * kTableLeadMargin;
  auto point = [](double cudnn, double bespoke, double fa3, int64_t lq = 0) {
    return TablePoint{DType::bf16, Pass::forward, 128, 4096, true, cudnn, bespoke, fa3, lq};
  };
  auto pick = [&](const TablePoint& t, bool cudnn_built = true) {
    const TablePoint table[] = {t};
    const int64_t lq = t.len_q > 0 ? t.len_q : t.len;
    return preferred_candidate(
        table,
        problem_of(make_desc(DType::bf16, 4, 32, 8, lq, 4096, 128, Mask::causal_bottom_right())),
        Pass::forward, true, cudnn_built);
  };
  EXPECT_EQ(pick(point(500, 100, 500 * inside)), Candidate::cudnn);
  EXPECT_EQ(pick(point(500, 100, 500 * beyond)), Candidate::fa3);
  EXPECT_EQ(pick(point(500, 500 * inside, 100)), Candidate::cudnn);
  EXPECT_EQ(pick(point(500, 500 * beyond, 100)), Candidate::bespoke);
  EXPECT_EQ(pick(point(500, 500 * beyond, 500 * beyond * inside)), Candidate::bespoke);
  EXPECT_EQ(pick(point(500, 300, 300 * inside), false), Candidate::bespoke);
  EXPECT_EQ(pick(point(500, 300, 300 * beyond), false), Candidate::fa3);
  EXPECT_EQ(pick(point(500, 100, 500 * inside, 1024)), Candidate::cudnn);
  EXPECT_EQ(pick(point(500, 100, 500 * beyond, 1024)), Candidate::fa3);
}

TEST(AttentionCudnnRules, NearestMeasuredPointDecides) {
  const TablePoint table[] = {
      {DType::bf16, Pass::forward, 64, 512, false, 300.0, 350.0, 340.0},     // bespoke fastest
      {DType::bf16, Pass::forward, 64, 16384, false, 500.0, 450.0, 0.0},     // cuDNN; fa3 not run
      {DType::bf16, Pass::forward, 128, 4096, false, 600.0, 610.0, 650.0},   // fa3, then bespoke
      {DType::bf16, Pass::forward, 128, 4096, true, 550.0, 400.0, 550.0},    // tie: cuDNN keeps it
      {DType::bf16, Pass::forward, 128, 16384, true, 550.0, 400.0, 560.0},   // fa3, then cuDNN
      {DType::bf16, Pass::backward, 128, 4096, false, 480.0, 300.0, 900.0},  // backward: fa3
  };
  auto pick = [&](int64_t d, int64_t l, Mask m, Pass pass, bool fa3_runs = true,
                  DType t = DType::bf16) {
    return preferred_candidate(table, problem_of(make_desc(t, 1, 8, 8, l, l, d, m)), pass,
                               fa3_runs);
  };
  EXPECT_EQ(pick(64, 512, Mask::none(), Pass::forward), Candidate::bespoke);
  EXPECT_EQ(pick(64, 1024, Mask::none(), Pass::forward), Candidate::bespoke);  // nearer 512
  EXPECT_EQ(pick(64, 8192, Mask::none(), Pass::forward), Candidate::cudnn);    // nearer 16k
  EXPECT_EQ(pick(64, 65536, Mask::none(), Pass::forward), Candidate::cudnn);
  // Head dim first: the d128 point, where fa3 counts only for Lq within 2x of 4096.
  EXPECT_EQ(pick(128, 512, Mask::none(), Pass::forward), Candidate::bespoke);
  EXPECT_EQ(pick(128, 2048, Mask::none(), Pass::forward), Candidate::fa3);
  EXPECT_EQ(pick(96, 4096, Mask::none(), Pass::forward), Candidate::fa3);              // log2: 128
  EXPECT_EQ(pick(96, 16384, Mask::none(), Pass::forward), Candidate::bespoke);         // 4x off
  EXPECT_EQ(pick(128, 4096, Mask::none(), Pass::forward, false), Candidate::bespoke);  // no fa3
  EXPECT_EQ(pick(128, 4096, Mask::causal_top_left(), Pass::forward), Candidate::cudnn);
  EXPECT_EQ(pick(128, 8192, Mask::causal_top_left(), Pass::forward), Candidate::cudnn);    // 4096
  EXPECT_EQ(pick(128, 9000, Mask::causal_bottom_right(), Pass::forward), Candidate::fa3);  // 16k
  EXPECT_EQ(pick(128, 16384, Mask::causal_top_left(), Pass::forward, false), Candidate::cudnn);
  EXPECT_EQ(pick(64, 4096, Mask::causal_bottom_right(), Pass::forward), Candidate::cudnn);  // tie
  EXPECT_EQ(pick(128, 4096, Mask::none(), Pass::backward), Candidate::fa3);
  EXPECT_EQ(pick(128, 4096, Mask::none(), Pass::backward, false), Candidate::cudnn);      // no fa3
  EXPECT_EQ(pick(128, 4096, Mask::causal_top_left(), Pass::backward), Candidate::cudnn);  // none
  EXPECT_EQ(pick(128, 4096, Mask::none(), Pass::forward, true, DType::f16), Candidate::cudnn);
  // f16 points (bench_attention with BARACUDA_ATTN_DTYPE=f16) decide for f16 problems alone.
  const TablePoint with_f16[] = {
      {DType::bf16, Pass::forward, 128, 4096, false, 600.0, 100.0, 500.0},
      {DType::f16, Pass::forward, 128, 4096, false, 600.0, 100.0, 650.0}};
  for (DType t : {DType::bf16, DType::f16})
    EXPECT_EQ(preferred_candidate(with_f16,
                                  problem_of(make_desc(t, 1, 8, 8, 4096, 4096, 128, Mask::none())),
                                  Pass::forward, true),
              t == DType::f16 ? Candidate::fa3 : Candidate::cudnn)
        << name(t);
  EXPECT_EQ(preferred_candidate({}, problem_of(make_desc(DType::bf16, 1, 8, 8, 64, 64, 64)),
                                Pass::forward, true),
            Candidate::cudnn);
  // fa3's column counts for Lq within 2x of the point's L (it was measured with Lq = Lk), or, in
  // the forward, for a chunk of at least kFa3ChunkRows queries against a cache within 2x of the
  // point's L (kFa3ChunkRowsOverBespoke where the family's kernels are the alternative):
  // decode-like problems keep the cuDNN/bespoke choice.
  auto pick_qk = [&](int64_t lq, int64_t lk, Mask m = Mask::none(), Pass pass = Pass::forward) {
    return preferred_candidate(table, problem_of(make_desc(DType::bf16, 1, 8, 8, lq, lk, 128, m)),
                               pass, true);
  };
  EXPECT_EQ(pick_qk(4096, 4096), Candidate::fa3);
  EXPECT_EQ(pick_qk(2048, 4096), Candidate::fa3);
  EXPECT_EQ(pick_qk(8192, 4096), Candidate::fa3);
  EXPECT_EQ(pick_qk(1, 4096), Candidate::bespoke);
  // d128 L4096 (no mask): bespoke ahead of cuDNN there, so fa3 from kFa3ChunkRowsOverBespoke query
  // rows on (just past a decode).
  EXPECT_EQ(pick_qk(2047, 4096), Candidate::fa3);
  EXPECT_EQ(pick_qk(kFa3ChunkRowsOverBespoke, 4096), Candidate::fa3);
  EXPECT_EQ(pick_qk(kFa3ChunkRowsOverBespoke, 2048), Candidate::fa3);  // a cache within 2x
  EXPECT_EQ(pick_qk(kFa3ChunkRowsOverBespoke - 1, 4096), Candidate::bespoke);
  EXPECT_EQ(pick_qk(kFa3ChunkRows, 1024), Candidate::bespoke);  // the cache 4x off the point
  EXPECT_EQ(pick_qk(kFa3ChunkRows, 4096, Mask::none(), Pass::backward), Candidate::cudnn);
  // d128 L16k causal: cuDNN ahead of bespoke, so fa3 from kFa3ChunkRows rows on.
  const Mask br = Mask::causal_bottom_right();
  EXPECT_EQ(pick_qk(kFa3ChunkRows, 16384, br), Candidate::fa3);
  EXPECT_EQ(pick_qk(kFa3ChunkRows, 9000, br), Candidate::fa3);
  EXPECT_EQ(pick_qk(kFa3ChunkRows - 1, 16384, br), Candidate::cudnn);
  EXPECT_EQ(pick_qk(kFa3ChunkRowsOverBespoke, 16384, br), Candidate::cudnn);
  // Decode-shaped problems go to the family's kernels even with no table at all.
  EXPECT_EQ(preferred_candidate({}, problem_of(make_desc(DType::bf16, 1, 8, 8, 1, 4096, 128)),
                                Pass::forward, true),
            Candidate::bespoke);
  EXPECT_EQ(preferred_candidate({}, problem_of(make_desc(DType::bf16, 1, 8, 8, 17, 4096, 128)),
                                Pass::forward, true),
            Candidate::cudnn);
  // Varlen (cuDNN is not given packed sequences): bespoke and fa3 only, at the point of the
  // longest sequence; no table: bespoke.
  auto pick_varlen = [&](int64_t l, Mask m, Pass pass, bool fa3_runs,
                         std::span<const TablePoint> t) {
    Descriptor d = make_desc(DType::bf16, 2, 8, 8, l, l, 128, m);
    d.varlen = true;
    d.total_q = d.total_k = 2 * l;
    return preferred_candidate(t, problem_of(d), pass, fa3_runs);
  };
  EXPECT_EQ(pick_varlen(4096, Mask::none(), Pass::forward, true, table), Candidate::fa3);
  EXPECT_EQ(pick_varlen(4096, Mask::none(), Pass::forward, false, table), Candidate::bespoke);
  // cuDNN fastest at the point (causal 4096: cuDNN 550, bespoke 400, fa3 550): fa3 beats bespoke.
  EXPECT_EQ(pick_varlen(4096, Mask::causal_top_left(), Pass::forward, true, table), Candidate::fa3);
  EXPECT_EQ(pick_varlen(4096, Mask::causal_top_left(), Pass::forward, false, table),
            Candidate::bespoke);
  EXPECT_EQ(pick_varlen(4096, Mask::none(), Pass::backward, true, table), Candidate::fa3);
  EXPECT_EQ(pick_varlen(4096, Mask::causal_top_left(), Pass::backward, true, table),
            Candidate::bespoke);  // no backward causal point
  EXPECT_EQ(pick_varlen(4096, Mask::none(), Pass::forward, true, {}), Candidate::bespoke);
  // Soft-capping (cuDNN has none): the others; a sliding window's backward: not cuDNN (it does not
  // skip what the window excludes), its forward: the table as for the band's right bound.
  Descriptor capped = make_desc(DType::bf16, 1, 8, 8, 4096, 4096, 128);
  capped.softcap = 30;
  EXPECT_EQ(preferred_candidate(table, problem_of(capped), Pass::forward, true), Candidate::fa3);
  EXPECT_EQ(preferred_candidate(table, problem_of(capped), Pass::forward, false),
            Candidate::bespoke);
  const attention::Problem window =
      problem_of(make_desc(DType::bf16, 1, 8, 8, 4096, 4096, 128, Mask::sliding_window(1023, 0)));
  EXPECT_EQ(preferred_candidate(table, window, Pass::forward, true), Candidate::cudnn);  // tie
  EXPECT_EQ(preferred_candidate(table, window, Pass::backward, false), Candidate::bespoke);
}

// Chunk points (len_q > 0) decide forward chunks within 2x of one in head dim, Lq and Lk; the
// Lq = Lk points decide the rest as before, and chunk points never speak for them.
TEST(AttentionCudnnRules, ChunkPointsDecideChunks) {
  const Mask br = Mask::causal_bottom_right();
  const TablePoint table[] = {
      // The Lq = Lk sweep: cuDNN ahead at d128 L4096 causal.
      {DType::bf16, Pass::forward, 128, 4096, true, 590.0, 250.0, 580.0},
      {DType::bf16, Pass::backward, 128, 4096, true, 460.0, 230.0, 420.0},
      // Chunks against 4096 keys: cuDNN ahead at Lq 64, fa3 at Lq 512.
      {DType::bf16, Pass::forward, 128, 4096, true, 290.0, 135.0, 250.0, 64},
      {DType::bf16, Pass::forward, 128, 4096, true, 611.0, 350.0, 629.0, 512},
  };
  // GQA groups of 3 (fa3_packs takes powers of two, which would answer ahead of the table).
  auto pick = [&](int64_t lq, int64_t lk, int64_t d = 128, Mask m = Mask::causal_bottom_right(),
                  bool fa3_runs = true, Pass pass = Pass::forward) {
    return preferred_candidate(table, problem_of(make_desc(DType::bf16, 1, 6, 2, lq, lk, d, m)),
                               pass, fa3_runs);
  };
  EXPECT_EQ(pick(512, 4096), Candidate::fa3);
  // Without a group (the points' order is a group's): the Lq = Lk points, cuDNN.
  EXPECT_EQ(
      preferred_candidate(table, problem_of(make_desc(DType::bf16, 1, 8, 8, 512, 4096, 128, br)),
                          Pass::forward, true),
      Candidate::cudnn);
  EXPECT_EQ(pick(512, 4096, 128, br, false), Candidate::cudnn);
  EXPECT_EQ(pick(1024, 8192), Candidate::fa3);  // 2x off in both lengths
  EXPECT_EQ(pick(300, 4096), Candidate::fa3);   // nearer 512 than 64 on a log scale
  EXPECT_EQ(pick(64, 4096), Candidate::cudnn);
  EXPECT_EQ(pick(100, 4096), Candidate::cudnn);     // nearer 64
  EXPECT_EQ(pick(96, 4096, 96), Candidate::cudnn);  // head dim 96: log2 within 1 of 128
  // Off every chunk point: the Lq = Lk rule (cuDNN at d128 L4096 causal; fa3 not a chunk there).
  EXPECT_EQ(pick(512, 16384), Candidate::cudnn);     // Lk 4x off
  EXPECT_EQ(pick(2048, 4096), Candidate::cudnn);     // Lq 4x off 512
  EXPECT_EQ(pick(512, 4096, 64), Candidate::cudnn);  // head dim 2x off
  EXPECT_EQ(pick(4096, 4096), Candidate::cudnn);     // Lq = Lk: never a chunk point
  EXPECT_EQ(pick(512, 4096, 128, br, true, Pass::backward), Candidate::cudnn);
  EXPECT_EQ(pick(512, 4096, 128, Mask::none()), Candidate::cudnn);  // no non-causal point: cuDNN
  // Where cuDNN does not run (soft-capping): the chunk point's bespoke and fa3 columns.
  Descriptor capped = make_desc(DType::bf16, 1, 6, 2, 64, 4096, 128, br);
  capped.softcap = 30;
  EXPECT_EQ(preferred_candidate(table, problem_of(capped), Pass::forward, true), Candidate::fa3);
  EXPECT_EQ(preferred_candidate(table, problem_of(capped), Pass::forward, false),
            Candidate::bespoke);
  // Decode-shaped problems stay with the family's kernels.
  EXPECT_EQ(pick(kDecodeQueryRows, 4096), Candidate::bespoke);
}

// Short chunks of a GQA group go to fa3 (its packed instance) wherever fa3 runs, ahead of any
// table point: bf16 / f16, Dk = Dv = 64, 128 or 256, groups 2..16 that are powers of two, more rows
// than a decode (or a decode by kFa3PackedDecodeRows' rules) and at most fa3_packed_chunk_rows
// (d128: kFa3PackedChunkRows, kFa3PackedLongCacheRows from kFa3PackedLongCacheKeys keys on; d64:
// kFa3PackedChunkRowsD64; d256: kFa3PackedChunkRowsD256), fewer than the cache's keys.
TEST(AttentionCudnnRules, ShortGqaChunksGoToFa3Packed) {
  auto chunk = [](int64_t hq, int64_t hk, int64_t lq, int64_t lk, int64_t d = 128,
                  DType t = DType::bf16) {
    return problem_of(make_desc(t, 4, hq, hk, lq, lk, d, Mask::causal_bottom_right()));
  };
  EXPECT_TRUE(fa3_packs(chunk(32, 8, 32, 4096)));
  EXPECT_TRUE(fa3_packs(chunk(32, 8, kDecodeQueryRows + 1, 4096)));
  EXPECT_TRUE(fa3_packs(chunk(32, 8, kFa3PackedChunkRows, 4096)));
  EXPECT_TRUE(fa3_packs(chunk(32, 2, 64, 4096, 128, DType::f16)));  // group 16
  EXPECT_TRUE(fa3_packs(chunk(16, 8, 64, 4096)));                   // group 2
  // Decodes: where the group fills kFa3PackedDecodeRows of a tile (group x Lq) from
  // kFa3PackedDecodeMinLq rows on, not below.
  EXPECT_TRUE(fa3_packs(chunk(32, 8, kDecodeQueryRows, 4096)));
  EXPECT_TRUE(fa3_packs(chunk(32, 8, kFa3PackedDecodeRows / 4, 4096)));
  EXPECT_TRUE(fa3_packs(chunk(32, 4, kFa3PackedDecodeMinLq, 16384, 64)));  // group 8
  EXPECT_TRUE(fa3_packs(chunk(32, 2, kFa3PackedDecodeMinLq, 4096)));       // group 16
  EXPECT_TRUE(fa3_packs(chunk(16, 8, kFa3PackedDecodeRows / 2, 4096, 64, DType::f16)));
  EXPECT_FALSE(fa3_packs(chunk(32, 8, kFa3PackedDecodeRows / 4 - 1, 4096)));
  // Past the decode kernel's kFa3PackedDecodeRows, from fewer tokens: 48 rows, 3 a head.
  EXPECT_TRUE(fa3_packs(chunk(32, 2, kFa3PackedDecodeMinLq - 1, 4096)));
  EXPECT_FALSE(fa3_packs(chunk(32, 2, 2, 16384, 64)));  // 32 rows, 2 a head
  EXPECT_FALSE(fa3_packs(chunk(32, 2, 1, 16384)));      // group 16, one row
  EXPECT_FALSE(fa3_packs(chunk(16, 8, kFa3PackedDecodeRows / 2 - 1, 4096)));
  EXPECT_FALSE(fa3_packs(chunk(32, 32, kDecodeQueryRows, 4096)));  // group 1
  EXPECT_FALSE(fa3_packs(chunk(32, 8, kFa3PackedChunkRows + 1, 4096)));
  EXPECT_FALSE(fa3_packs(chunk(32, 8, 64, 64)));  // not a chunk of a longer cache
  // Against long caches at d128, more rows.
  EXPECT_TRUE(fa3_packs(chunk(32, 8, kFa3PackedLongCacheRows, kFa3PackedLongCacheKeys)));
  EXPECT_TRUE(fa3_packs(chunk(32, 4, kFa3PackedChunkRows + 1, 32768)));
  EXPECT_FALSE(fa3_packs(chunk(32, 8, kFa3PackedLongCacheRows + 1, kFa3PackedLongCacheKeys)));
  EXPECT_FALSE(fa3_packs(chunk(32, 8, kFa3PackedChunkRows + 1, kFa3PackedLongCacheKeys - 1)));
  // Head dim 64: fewer rows, whatever the cache.
  EXPECT_TRUE(fa3_packs(chunk(32, 8, kFa3PackedChunkRowsD64, 4096, 64)));
  EXPECT_TRUE(fa3_packs(chunk(32, 16, 17, 16384, 64, DType::f16)));
  EXPECT_FALSE(fa3_packs(chunk(32, 8, kFa3PackedChunkRowsD64 + 1, 4096, 64)));
  EXPECT_FALSE(fa3_packs(chunk(32, 8, kFa3PackedChunkRowsD64 + 1, 32768, 64)));
  // Head dim 256: up to kFa3PackedChunkRowsD256 rows; every decode but one token in a group of 16
  // over fewer than kFa3PackedD256SingleTokenKeyRows keys in all.
  EXPECT_TRUE(fa3_packs(chunk(32, 8, kFa3PackedChunkRowsD256, 4096, 256)));
  EXPECT_FALSE(fa3_packs(chunk(32, 8, kFa3PackedChunkRowsD256 + 1, 16384, 256)));
  EXPECT_TRUE(fa3_packs(chunk(32, 16, 1, 4096, 256, DType::f16)));  // group 2, 2 rows
  EXPECT_TRUE(fa3_packs(chunk(32, 4, 1, 16384, 256)));              // group 8
  EXPECT_TRUE(fa3_packs(chunk(32, 2, 2, 4096, 256)));               // group 16, 32 rows
  EXPECT_FALSE(fa3_packs(chunk(32, 2, 1, 4096, 256)));              // group 16, one token
  EXPECT_FALSE(fa3_packs(chunk(32, 32, 4, 4096, 256)));             // group 1
  auto d256_token = [](int64_t b, int64_t lk) {  // one token a head in a group of 16
    return problem_of(make_desc(DType::bf16, b, 32, 2, 1, lk, 256, Mask::causal_bottom_right()));
  };
  ASSERT_EQ(8 * 2 * 4096, kFa3PackedD256SingleTokenKeyRows);
  EXPECT_TRUE(fa3_packs(d256_token(8, 4096)));
  EXPECT_FALSE(fa3_packs(d256_token(8, 4095)));
  EXPECT_TRUE(fa3_packs(d256_token(4, 16384)));
  EXPECT_TRUE(fa3_packs(d256_token(64, 1024)));
  // A serving batch (64 sequences): where sequences x K/V heads fill the grid (more than
  // kFa3PackedDecodeMaxKvHeads), decodes pack only from a whole tile of rows (but at d256);
  // chunks as before.
  auto serving = [](int64_t hq, int64_t hk, int64_t lq, int64_t d = 128) {
    return problem_of(make_desc(DType::bf16, 64, hq, hk, lq, 4096, d, Mask::causal_bottom_right()));
  };
  ASSERT_EQ(64 * 2, kFa3PackedDecodeMaxKvHeads);
  EXPECT_FALSE(fa3_packs(serving(32, 4, kFa3PackedDecodeMinLq)));  // group 8: 256 K/V heads
  EXPECT_FALSE(fa3_packs(serving(32, 4, kFa3PackedTileRows / 8 - 1, 64)));
  EXPECT_TRUE(fa3_packs(serving(32, 4, kFa3PackedTileRows / 8)));  // a whole tile
  EXPECT_TRUE(fa3_packs(serving(32, 4, kDecodeQueryRows + 1)));    // a chunk
  EXPECT_TRUE(fa3_packs(serving(32, 2, 3)));                       // group 16: 128 K/V heads
  EXPECT_FALSE(fa3_packs(serving(64, 4, 3)));                      // group 16: 256 K/V heads
  EXPECT_TRUE(fa3_packs(serving(32, 4, 2, 256)));                  // 256 K/V heads, 16 rows
  EXPECT_TRUE(fa3_packs(serving(32, 16, 1, 256)));                 // 1024 K/V heads, 2 rows
  EXPECT_FALSE(fa3_packs(chunk(32, 8, 64, 4096, 96)));             // not an fa3 head dim
  EXPECT_FALSE(fa3_packs(chunk(32, 32, 64, 4096)));                // group 1
  EXPECT_FALSE(fa3_packs(chunk(24, 8, 64, 4096)));                 // group 3
  EXPECT_FALSE(fa3_packs(chunk(32, 1, 64, 4096)));                 // group 32
  EXPECT_FALSE(fa3_packs(chunk(32, 8, 64, 4096, 128, DType::f32)));
  attention::Problem mixed = chunk(32, 8, 64, 4096);
  mixed.desc.head_dim_v = 64;  // Dk != Dv
  EXPECT_FALSE(fa3_packs(mixed));
  // Ahead of the table's points (one that ranks cuDNN first at the chunk's point), forward only,
  // where fa3 runs; not under an empty table (the benches' override: cuDNN everywhere).
  const TablePoint cudnn_wins[] = {
      {DType::bf16, Pass::forward, 128, 4096, true, 600, 100, 500, 64}};
  const std::span<const TablePoint> empty{};
  const attention::Problem p = chunk(32, 8, 64, 4096);
  EXPECT_EQ(preferred_candidate(cudnn_wins, p, Pass::forward, true), Candidate::fa3);
  EXPECT_EQ(preferred_candidate(p, Pass::forward, true), Candidate::fa3);
  EXPECT_EQ(preferred_candidate(cudnn_wins, p, Pass::forward, false), Candidate::cudnn);
  EXPECT_EQ(preferred_candidate(cudnn_wins, p, Pass::backward, true), Candidate::cudnn);
  EXPECT_EQ(preferred_candidate(cudnn_wins, chunk(32, 32, 64, 4096), Pass::forward, true),
            Candidate::cudnn);
  EXPECT_EQ(preferred_candidate(empty, p, Pass::forward, true), Candidate::cudnn);
}

// The persistent forward's walk written with plain divisions: fa3_work_tile (the kernel's
// multiply-high form) must give the same tile for every work index.
Fa3WorkTile walk_by_division(int w, int m_blocks, int bh_count, int section) {
  const int first = w / (section * m_blocks) * section;
  const int heads = bh_count - first < section ? bh_count - first : section;
  const int r = w - first * m_blocks;
  return {m_blocks - 1 - r / heads, first + r % heads};
}

// The persistent forward's walk (fa3_work_tile): every (query block, head) tile exactly once for
// any section size, whole sections in order, and inside a section the heaviest query block of each
// of its heads before any lighter one. fa3_section_heads: banded, the fewest heads that turn every
// CTA's query block by a whole number of blocks coprime to m_blocks a round; unbanded, one group.
TEST(AttentionCudnnRules, PersistentWalkCoversEveryTileOnceBySection) {
  for (int m_blocks : {1, 2, 5, 8})
    for (int bh_count : {1, 3, 16, 40})
      for (int section : {1, 2, 7, 16, 40}) {
        if (section > bh_count) continue;
        SCOPED_TRACE("m_blocks " + std::to_string(m_blocks) + " heads " + std::to_string(bh_count) +
                     " section " + std::to_string(section));
        std::vector<int> seen(static_cast<size_t>(m_blocks * bh_count), 0);
        int last_section = 0, last_m = m_blocks;
        for (int w = 0; w < m_blocks * bh_count; ++w) {
          const Fa3WorkTile t =
              fa3_work_tile(w, m_blocks, bh_count, fa3_walk_divs(m_blocks, bh_count, section));
          const Fa3WorkTile ref = walk_by_division(w, m_blocks, bh_count, section);
          ASSERT_EQ(t.m_block, ref.m_block) << w;
          ASSERT_EQ(t.bh, ref.bh) << w;
          ASSERT_GE(t.m_block, 0);
          ASSERT_LT(t.m_block, m_blocks);
          ASSERT_GE(t.bh, 0);
          ASSERT_LT(t.bh, bh_count);
          ++seen[static_cast<size_t>(t.m_block * bh_count + t.bh)];
          const int sec = t.bh / section;
          ASSERT_GE(sec, last_section);  // sections in order, never revisited
          if (sec != last_section) last_m = m_blocks;
          ASSERT_LE(t.m_block, last_m);  // heaviest blocks of the section first
          last_section = sec, last_m = t.m_block;
        }
        for (int c : seen) EXPECT_EQ(c, 1);
      }
  // Banded, 132 CTAs: 4 heads turn every CTA's query block by one a round at any power-of-two
  // m_blocks (132 mod 4 m = 4); GQA does not change it; fewer heads than that, all of them.
  for (int64_t m : {2, 4, 8, 16, 32}) EXPECT_EQ(fa3_section_heads(1, 1024, m, 132, true), 4) << m;
  EXPECT_EQ(fa3_section_heads(8, 1024, 4, 132, true), 4);
  EXPECT_EQ(fa3_section_heads(1, 3, 4, 12, true), 3);
  // 114 CTAs (an H100 PCIe): 2 heads (114 mod 4 m = 2); 3 query blocks at 132: 3 heads (132 mod 9
  // = 6, two blocks a round), where 1 and 2 leave every CTA on one block.
  EXPECT_EQ(fa3_section_heads(1, 1024, 4, 114, true), 2);
  EXPECT_EQ(fa3_section_heads(1, 1024, 3, 132, true), 3);
  // 128 CTAs, 4 blocks: no section of up to kFa3SectionMaxHeads heads turns the blocks by a whole
  // number coprime to 4, so a round of heads (128: one block a round).
  EXPECT_EQ(fa3_section_heads(1, 1024, 4, 128, true), 128);
  // One query block a head, or unbanded: one group, at most every head.
  EXPECT_EQ(fa3_section_heads(2, 1024, 1, 132, true), 2);
  EXPECT_EQ(fa3_section_heads(1, 256, 8, 132, false), 1);
  EXPECT_EQ(fa3_section_heads(2, 4096, 4, 132, false), 2);
  EXPECT_EQ(fa3_section_heads(8, 4, 8, 32, false), 4);
  // The load this balances: the static stride over the walk, simulated (a tile weighs its query
  // block's index + 1, its key tiles under a causal bound at Lq = Lk).
  for (int64_t ctas : {132, 114, 128, 78})
    for (int m : {2, 3, 4, 8, 16}) {
      const int bh = 4096 / m, section = fa3_section_heads(1, bh, m, ctas, true);
      const Fa3WalkDivs v = fa3_walk_divs(m, bh, section);
      std::vector<int64_t> weight(static_cast<size_t>(ctas), 0);
      for (int w = 0; w < m * bh; ++w)
        weight[static_cast<size_t>(w % ctas)] += fa3_work_tile(w, m, bh, v).m_block + 1;
      // The busiest CTA within 6% of the mean (a tile more than others where ctas does not divide
      // the tiles, part of a turn at the end); one head a section: 11-88% over it.
      const double mean = (m + 1) / 2.0 * m * bh / static_cast<double>(ctas);
      EXPECT_LE(static_cast<double>(*std::max_element(weight.begin(), weight.end())), 1.06 * mean)
          << "ctas " << ctas << " m " << m << " section " << section;
    }
}

// The paired walk (fa3_pair_tile): every (query block, head) tile exactly once at any grid, whole
// round pairs of a heavy tile and its complement on one CTA; and the load it balances where the
// sections cannot (fewer rounds than blocks: fa3_walks_in_pairs).
TEST(AttentionCudnnRules, PairedWalkCoversEveryTileOnceAndBalances) {
  for (int m_blocks : {2, 3, 4, 7, 16, 33})
    for (int bh_count : {1, 3, 16, 40})
      for (int ctas : {1, 5, 16, 132}) {
        const int n = m_blocks * bh_count;
        if (ctas > n) continue;
        SCOPED_TRACE("m_blocks " + std::to_string(m_blocks) + " heads " + std::to_string(bh_count) +
                     " ctas " + std::to_string(ctas));
        const Fa3PairWalk v = fa3_pair_walk(m_blocks, bh_count, ctas);
        std::vector<int> seen(static_cast<size_t>(n), 0);
        for (int w = 0; w < n; ++w) {
          const Fa3WorkTile t = fa3_pair_tile(w, m_blocks, v);
          ASSERT_GE(t.m_block, 0);
          ASSERT_LT(t.m_block, m_blocks);
          ASSERT_GE(t.bh, 0);
          ASSERT_LT(t.bh, bh_count);
          ++seen[static_cast<size_t>(t.m_block * bh_count + t.bh)];
          if (w < v.paired && (w / ctas) % 2 == 1) {  // the complement of the tile a round before
            const Fa3WorkTile heavy = fa3_pair_tile(w - ctas, m_blocks, v);
            EXPECT_EQ(t.bh, heavy.bh) << w;
            EXPECT_EQ(t.m_block + heavy.m_block, m_blocks - 1) << w;
          }
        }
        for (int c : seen) EXPECT_EQ(c, 1);
      }
  // 16k tokens as B x L at d128 (16 heads), 132 CTAs: sections from L4096 on leave the busiest CTA
  // 16-53% over the mean; paired, within 7%.
  for (int64_t l : {4096, 8192, 16384}) {
    const int m = static_cast<int>(l / 128), bh = static_cast<int>(16384 / l * 16), ctas = 132;
    ASSERT_TRUE(fa3_walks_in_pairs(m, int64_t{m} * bh, ctas, true)) << l;
    const Fa3PairWalk v = fa3_pair_walk(m, bh, ctas);
    const Fa3WalkDivs sections = fa3_walk_divs(m, bh, fa3_section_heads(1, bh, m, ctas, true));
    std::vector<int64_t> paired(ctas, 0), by_section(ctas, 0);
    for (int w = 0; w < m * bh; ++w) {
      paired[static_cast<size_t>(w % ctas)] += fa3_pair_tile(w, m, v).m_block + 1;
      by_section[static_cast<size_t>(w % ctas)] += fa3_work_tile(w, m, bh, sections).m_block + 1;
    }
    const double mean = (m + 1) / 2.0 * m * bh / ctas;
    EXPECT_LE(static_cast<double>(*std::max_element(paired.begin(), paired.end())), 1.07 * mean)
        << l;
    EXPECT_GT(static_cast<double>(*std::max_element(by_section.begin(), by_section.end())),
              1.15 * mean)
        << l;
  }
  // No more rounds than blocks: L2048's 16 blocks in 15.5 rounds pair, L1024's 8 in 15.5 and d64
  // L2048's 16 in 31 do not; nor unmasked problems or one block.
  EXPECT_TRUE(fa3_walks_in_pairs(16, 16 * 128, 132, true));
  EXPECT_TRUE(fa3_walks_in_pairs(16, 16 * 132, 132, true));
  EXPECT_FALSE(fa3_walks_in_pairs(16, 16 * 132 + 1, 132, true));
  EXPECT_FALSE(fa3_walks_in_pairs(8, 8 * 256, 132, true));
  EXPECT_FALSE(fa3_walks_in_pairs(16, 16 * 256, 132, true));
  EXPECT_TRUE(fa3_walks_in_pairs(32, 32 * 64, 132, true));
  EXPECT_FALSE(fa3_walks_in_pairs(32, 32 * 64, 132, false));
  EXPECT_FALSE(fa3_walks_in_pairs(1, 16, 16, true));
  // PersistentWalksManyTiles' paired cases (m_blocks, tiles, grid = min(tiles, 132)) and
  // DefaultPlanLaunchesTheRankedInstance's paired routes pair at 132 SMs, so that every paired
  // instance (dtype x head dim) runs there.
  EXPECT_TRUE(fa3_walks_in_pairs(5, 5 * 68, 132, true));      // bf16 d64, L600, 68 heads
  EXPECT_TRUE(fa3_walks_in_pairs(3, 3 * 132, 132, true));     // bf16 d128, L300, 132 heads
  EXPECT_TRUE(fa3_walks_in_pairs(4, 4 * 72, 132, true));      // f16 d64, L450, 72 heads
  EXPECT_TRUE(fa3_walks_in_pairs(32, 32 * 8, 132, true));     // route: bf16 d64 L4096, 8 heads
  EXPECT_TRUE(fa3_walks_in_pairs(17, 17 * 4, 17 * 4, true));  // route: f16 d128 Lq 2147, 4 heads
  EXPECT_GT(fa3_pair_walk(5, 68, 132).paired, 0);
  EXPECT_GT(fa3_pair_walk(5, 68, 132).rest, 0);
  EXPECT_GT(fa3_pair_walk(3, 132, 132).paired, 0);
  EXPECT_GT(fa3_pair_walk(4, 72, 132).rest, 0);
}

// fa3_quot (n / d by a multiply-high and a shift) against `/` for divisors 1..4096 and around
// every power of two up to 2^31 - 1, dividends around multiples of them and up to 2^31 - 1.
TEST(AttentionCudnnRules, WorkTileDivisionIsExact) {
  std::vector<int64_t> divisors;
  for (int64_t d = 1; d <= 4096; ++d) divisors.push_back(d);
  for (int k = 12; k <= 31; ++k)
    for (int64_t e : {-3, -1, 0, 1, 3})
      if (const int64_t d = (int64_t{1} << k) + e; d >= 1 && d < (int64_t{1} << 31))
        divisors.push_back(d);
  const int64_t top = (int64_t{1} << 31) - 1;
  for (int64_t d : divisors) {
    const Fa3Div v = fa3_div(d);
    std::vector<int64_t> ns = {0,   1,       d - 1,   d,           d + 1,
                               top, top - 1, top - d, top / d * d, top / d * d - 1};
    for (int64_t q : {int64_t{2}, int64_t{7}, int64_t{1000}, top / d / 2, top / d})
      for (int64_t e : {-1, 0, 1}) ns.push_back(q * d + e);
    for (int64_t n : ns) {
      if (n < 0 || n > top) continue;
      ASSERT_EQ(fa3_quot(static_cast<int>(n), v), n / d) << n << " / " << d;
    }
  }
}

// The instance fa3's ranked-ahead entry launches (fa3_ranked_forward_kernel): packed where
// fa3_packs, and for chunks of 17..kFa3PackedUngroupedMaxRows rows in groups of 1 against caches
// of kFa3PackedLongCacheKeys or more (padded, no counts or pages, d64 / d128); persistent for
// padded sequences of at most kFa3PersistentMaxLen queries and keys (d64 / d128, no pages, key
// counts or varlen; d128 unmasked ones up to kFa3PersistentUnmaskedD128MaxLen, causal ones up to
// kFa3PersistentCausalMaxLen, or with more query rows than that up to
// kFa3PersistentPairedCausalMaxLen); the 192-row one at d64 from kFa3WideMinRows query rows (the
// same shapes); else the paged, counts or plain instance. The rule picks an instance only: whether
// fa3 runs at all is the table's (candidate_here).
TEST(AttentionCudnnRules, RankedAheadInstanceByShape) {
  auto problem = [](int64_t hq, int64_t hk, int64_t lq, int64_t lk, int64_t d = 128,
                    DType t = DType::bf16) {
    return problem_of(make_desc(t, 4, hq, hk, lq, lk, d, Mask::causal_bottom_right()));
  };
  const int64_t long_cache = kFa3PackedLongCacheKeys, rows = kFa3PackedUngroupedMaxRows;
  // Groups of 1 against long caches.
  EXPECT_TRUE(fa3_packs_ungrouped(problem(32, 32, kDecodeQueryRows + 1, long_cache)));
  EXPECT_TRUE(fa3_packs_ungrouped(problem(32, 32, rows, long_cache, 64, DType::f16)));
  EXPECT_TRUE(fa3_packs_ungrouped(problem(32, 32, rows, 2 * long_cache)));
  EXPECT_FALSE(fa3_packs_ungrouped(problem(32, 32, rows + 1, long_cache)));
  EXPECT_FALSE(fa3_packs_ungrouped(problem(32, 32, kDecodeQueryRows, long_cache)));
  EXPECT_FALSE(fa3_packs_ungrouped(problem(32, 32, 32, long_cache - 1)));
  EXPECT_FALSE(fa3_packs_ungrouped(problem(32, 8, 32, long_cache)));        // group 4
  EXPECT_FALSE(fa3_packs_ungrouped(problem(32, 32, 32, long_cache, 256)));  // not measured
  EXPECT_FALSE(fa3_packs_ungrouped(problem(32, 32, 32, long_cache, 128, DType::f32)));
  for (int what = 0; what < 2; ++what) {  // key counts, packed sequences: not measured
    Descriptor other = make_desc(DType::bf16, 4, 32, 32, 32, long_cache, 128);
    if (what == 0) other.seqused_k = true;
    if (what == 1) other.varlen = true, other.total_q = 4 * 32, other.total_k = 4 * long_cache;
    EXPECT_FALSE(fa3_packs_ungrouped(problem_of(other))) << what;
  }
  // Short sequences.
  const int64_t short_len = kFa3PersistentMaxLen;
  EXPECT_TRUE(fa3_persists(problem(16, 16, short_len, short_len)));
  EXPECT_TRUE(fa3_persists(problem(32, 8, 128, 128, 64, DType::f16)));
  EXPECT_TRUE(fa3_persists(problem(16, 16, 17, 200)));
  auto unmasked = [](int64_t l, int64_t d) {
    return problem_of(make_desc(DType::bf16, 4, 16, 16, l, l, d));
  };
  for (int64_t d : {64, 128}) {
    EXPECT_TRUE(fa3_persists(unmasked(short_len, d))) << d;
    EXPECT_EQ(fa3_persists(unmasked(short_len + 1, d)), d == 128) << d;
    EXPECT_TRUE(fa3_persists(problem(16, 16, short_len, short_len, d))) << d;          // causal
    EXPECT_TRUE(fa3_persists(problem(16, 16, short_len + 1, short_len + 1, d))) << d;  // causal
  }
  // Causal, D = 64 and 128: up to kFa3PersistentCausalMaxLen (either diagonal, either dtype; not a
  // window with a left bound, nor unmasked at D = 64).
  const int64_t causal_len = kFa3PersistentCausalMaxLen;
  for (int64_t d : {64, 128}) {
    EXPECT_TRUE(fa3_persists(problem(16, 16, causal_len, causal_len, d))) << d;
    EXPECT_TRUE(fa3_persists(problem(32, 8, 300, causal_len, d, DType::f16))) << d;
    EXPECT_TRUE(fa3_persists(problem_of(
        make_desc(DType::bf16, 4, 16, 16, causal_len, causal_len, d, Mask::causal_top_left()))))
        << d;
    EXPECT_FALSE(fa3_persists(problem(16, 16, causal_len, causal_len + 1, d))) << d;
    EXPECT_FALSE(fa3_persists(problem(16, 16, 128, causal_len + 1, d))) << d;
    EXPECT_FALSE(fa3_persists(problem_of(make_desc(DType::bf16, 4, 16, 16, causal_len, causal_len,
                                                   d, Mask::sliding_window(256, 0)))))
        << d;
    // Past it, more than causal_len query rows up to kFa3PersistentPairedCausalMaxLen (the paired
    // walk's lengths); not chunks of fewer rows against longer caches.
    const int64_t paired_len = kFa3PersistentPairedCausalMaxLen;
    EXPECT_TRUE(fa3_persists(problem(16, 16, paired_len, paired_len, d))) << d;
    EXPECT_TRUE(fa3_persists(problem(32, 8, causal_len + 1, paired_len, d, DType::f16))) << d;
    EXPECT_TRUE(fa3_persists(problem_of(
        make_desc(DType::bf16, 4, 16, 16, paired_len, causal_len, d, Mask::causal_top_left()))))
        << d;
    EXPECT_FALSE(fa3_persists(problem(16, 16, causal_len, paired_len, d))) << d;
    EXPECT_FALSE(fa3_persists(problem(16, 16, paired_len + 1, paired_len + 1, d))) << d;
    EXPECT_FALSE(fa3_persists(problem(16, 16, causal_len + 1, paired_len + 1, d))) << d;
    EXPECT_FALSE(fa3_persists(problem_of(make_desc(DType::bf16, 4, 16, 16, paired_len, paired_len,
                                                   d, Mask::sliding_window(paired_len, 0)))))
        << d;
  }
  // D = 128 unmasked: up to kFa3PersistentUnmaskedD128MaxLen (either dtype, any Lq / Lk under it).
  const int64_t unmasked_len = kFa3PersistentUnmaskedD128MaxLen;
  EXPECT_TRUE(fa3_persists(unmasked(unmasked_len, 128)));
  EXPECT_FALSE(fa3_persists(unmasked(unmasked_len + 1, 128)));
  EXPECT_FALSE(fa3_persists(unmasked(unmasked_len, 64)));
  // Causal past the unmasked bound: long query sequences to kFa3PersistentPairedCausalMaxLen.
  EXPECT_TRUE(fa3_persists(problem(16, 16, unmasked_len + 1, unmasked_len + 1)));
  EXPECT_FALSE(fa3_persists(problem_of(make_desc(DType::bf16, 4, 16, 16, unmasked_len, unmasked_len,
                                                 128, Mask::sliding_window(256, 256)))));
  EXPECT_TRUE(fa3_persists(
      problem_of(make_desc(DType::f16, 4, 32, 8, 128, unmasked_len, 128, Mask::none()))));
  EXPECT_FALSE(fa3_persists(
      problem_of(make_desc(DType::bf16, 4, 16, 16, 128, unmasked_len + 1, 128, Mask::none()))));
  EXPECT_TRUE(fa3_persists(problem(16, 16, 128, short_len)));
  // Either side past the short lengths, under a band none of the longer rules takes (a left bound).
  for (auto [lq, lk] : {std::pair<int64_t, int64_t>{128, short_len + 1}, {short_len + 1, 128}})
    EXPECT_FALSE(fa3_persists(
        problem_of(make_desc(DType::bf16, 4, 16, 16, lq, lk, 128, Mask::sliding_window(256, 0)))))
        << lq << " " << lk;
  EXPECT_TRUE(fa3_persists(problem_of(
      make_desc(DType::bf16, 4, 16, 16, 128, short_len, 128, Mask::sliding_window(256, 0)))));
  EXPECT_FALSE(fa3_persists(problem(16, 16, 128, 128, 256)));
  EXPECT_FALSE(fa3_persists(problem(16, 16, 128, 128, 96)));
  attention::Problem mla = problem(16, 16, 128, 128, 192);
  mla.desc.head_dim_v = 128;
  EXPECT_FALSE(fa3_persists(mla));
  EXPECT_FALSE(fa3_persists(problem(16, 16, 128, 128, 128, DType::f32)));
  Descriptor counted = make_desc(DType::bf16, 4, 16, 16, 128, 128, 128);
  counted.seqused_k = true;
  EXPECT_FALSE(fa3_persists(problem_of(counted)));
  Descriptor paged = make_desc(DType::bf16, 4, 16, 16, 128, 128, 128);
  paged.page_size = 64, paged.pages = 64;
  const auto paged_problem = attention::ForwardOp::make_problem(paged);
  BARACUDA_ASSERT_OK(paged_problem);
  EXPECT_FALSE(fa3_persists(paged_problem.value()));
  // Head dim 64 from kFa3WideMinRows query rows on (both masks, any group, either dtype), padded
  // without key counts or pages.
  const int64_t wide = kFa3WideMinRows;
  EXPECT_TRUE(fa3_widens(problem(32, 32, wide, wide, 64)));
  EXPECT_TRUE(fa3_widens(problem(32, 8, wide, 4 * wide, 64, DType::f16)));
  EXPECT_TRUE(fa3_widens(unmasked(4 * wide, 64)));
  EXPECT_FALSE(fa3_widens(problem(32, 32, wide - 1, wide, 64)));
  EXPECT_FALSE(fa3_widens(unmasked(wide, 128)));
  EXPECT_FALSE(fa3_widens(problem(32, 32, wide, wide, 64, DType::f32)));
  Descriptor wide_counted = make_desc(DType::bf16, 4, 16, 16, wide, wide, 64);
  wide_counted.seqused_k = true;
  EXPECT_FALSE(fa3_widens(problem_of(wide_counted)));
  Descriptor wide_packed = make_desc(DType::bf16, 4, 16, 16, wide, wide, 64);
  wide_packed.varlen = true, wide_packed.total_q = 4 * wide, wide_packed.total_k = 4 * wide;
  EXPECT_FALSE(fa3_widens(problem_of(wide_packed)));
  // The names, in the rule's order.
  EXPECT_EQ(fa3_ranked_forward_kernel(problem(32, 8, 32, 4096)), kFa3PackedKernel);
  EXPECT_EQ(fa3_ranked_forward_kernel(problem(32, 32, 32, long_cache)), kFa3PackedKernel);
  EXPECT_EQ(fa3_ranked_forward_kernel(problem(32, 8, 32, 128)), kFa3PackedKernel);  // fa3_packs
  EXPECT_EQ(fa3_ranked_forward_kernel(problem(32, 32, 128, 128)), kFa3PersistentKernel);
  EXPECT_EQ(fa3_ranked_forward_kernel(problem(32, 32, 1024, 1024)), kFa3PersistentKernel);
  EXPECT_EQ(fa3_ranked_forward_kernel(unmasked(1024, 128)), kFa3PersistentKernel);
  EXPECT_EQ(fa3_ranked_forward_kernel(unmasked(2048, 128)), kFa3PersistentKernel);
  EXPECT_EQ(fa3_ranked_forward_kernel(unmasked(4096, 128)), kFa3Kernel);
  EXPECT_EQ(fa3_ranked_forward_kernel(problem(32, 32, 1024, 1024, 64)), kFa3PersistentKernel);
  EXPECT_EQ(fa3_ranked_forward_kernel(problem(32, 32, causal_len, causal_len)),
            kFa3PersistentKernel);
  EXPECT_EQ(fa3_ranked_forward_kernel(problem(32, 32, causal_len + 1, causal_len + 1)),
            kFa3PersistentKernel);
  const int64_t paired_len = kFa3PersistentPairedCausalMaxLen;
  EXPECT_EQ(fa3_ranked_forward_kernel(problem(32, 32, paired_len, paired_len, 64)),
            kFa3PersistentKernel);
  EXPECT_EQ(fa3_ranked_forward_kernel(problem(32, 32, paired_len + 1, paired_len + 1)), kFa3Kernel);
  EXPECT_EQ(fa3_ranked_forward_kernel(problem(32, 32, wide, wide, 64)),
            wide <= causal_len ? kFa3PersistentKernel : kFa3WideKernel);
  EXPECT_EQ(fa3_ranked_forward_kernel(unmasked(wide, 64)), kFa3WideKernel);
  EXPECT_EQ(fa3_ranked_forward_kernel(problem(32, 32, paired_len + 1, paired_len + 1, 64)),
            kFa3WideKernel);
  EXPECT_EQ(fa3_ranked_forward_kernel(problem(32, 32, wide, wide)),  // d128
            wide <= causal_len ? kFa3PersistentKernel : kFa3Kernel);
  EXPECT_EQ(fa3_ranked_forward_kernel(problem(32, 32, 32, 4096)), kFa3Kernel);
  EXPECT_EQ(fa3_ranked_forward_kernel(problem_of(counted)), kFa3CountsKernel);
  EXPECT_EQ(fa3_ranked_forward_kernel(paged_problem.value()), kFa3PagedKernel);
}

// bf16 MHA problems at head dim 64 with `rows` query and key rows a sequence: soft-capped, and
// packed (two sequences), as the backward's instance rules see them.
attention::Problem capped_d64(int64_t rows) {
  Descriptor d = make_desc(DType::bf16, 2, 16, 16, rows, rows, 64);
  d.softcap = 30;
  return problem_of(d);
}
attention::Problem packed_d64(int64_t rows) {
  Descriptor d = make_desc(DType::bf16, 2, 16, 16, rows, rows, 64);
  d.varlen = true, d.total_q = 2 * rows, d.total_k = 2 * rows;
  return problem_of(d);
}

// The backward's ranked-ahead kernel (fa3_ranked_backward_kernel): the 128-row steps at head dim
// 64 from kFa3BwdWideMinRows query rows on (any key count, either mask, any group, bf16 / f16,
// padded or packed), not soft-capped; the plain kernel otherwise.
TEST(AttentionCudnnRules, RankedAheadBackwardByShape) {
  const int64_t rows = kFa3BwdWideMinRows;
  auto problem = [](int64_t hk, int64_t lq, int64_t lk, int64_t d = 64, DType t = DType::bf16,
                    Mask m = Mask::causal_bottom_right()) {
    return problem_of(make_desc(t, 2, 16, hk, lq, lk, d, m));
  };
  EXPECT_TRUE(fa3_bwd_widens(problem(16, rows, rows)));
  EXPECT_TRUE(fa3_bwd_widens(problem(4, rows, 64, 64, DType::f16, Mask::none())));
  EXPECT_TRUE(fa3_bwd_widens(problem(1, 8 * rows, 8 * rows, 64, DType::f16)));
  EXPECT_FALSE(fa3_bwd_widens(problem(16, rows - 1, 4 * rows)));
  EXPECT_FALSE(fa3_bwd_widens(problem(16, rows, rows, 128)));
  EXPECT_FALSE(fa3_bwd_widens(problem(16, rows, rows, 256)));
  EXPECT_FALSE(fa3_bwd_widens(problem(16, rows, rows, 64, DType::f32)));
  EXPECT_FALSE(fa3_bwd_widens(capped_d64(rows)));
  EXPECT_TRUE(fa3_bwd_widens(packed_d64(rows)));
  EXPECT_EQ(fa3_ranked_backward_kernel(problem(16, rows, rows)), kFa3BwdQ128Kernel);
  EXPECT_EQ(fa3_ranked_backward_kernel(problem(16, rows - 1, rows)), kFa3BwdKernel);
  EXPECT_EQ(fa3_ranked_backward_kernel(problem(16, rows, rows, 128)), kFa3BwdKernel);
  EXPECT_EQ(fa3_ranked_backward_kernel(capped_d64(rows)), kFa3BwdKernel);
}

// A group larger than every kFa3DetLeads row of this one's head dim and mask takes: outside them
// all at any length.
int64_t det_group_beyond(const DetLead& lead) {
  int64_t largest = 1;
  for (const DetLead& row : kFa3DetLeads)
    if (row.head_dim == lead.head_dim && row.causal == lead.causal)
      largest = std::max(largest, row.max_group);
  return 2 * largest;
}

// A point of the bench's sweep (hidden 2048: 16 query heads at d128, 32 at d64; B x L tokens) in
// groups of `group`.
attention::Problem sweep(int64_t d, int64_t group, int64_t l, int64_t tokens,
                         Mask m = Mask::causal_top_left(), DType t = DType::bf16) {
  const int64_t hq = d == 64 ? 32 : 16;
  return problem_of(make_desc(t, tokens / l, hq, hq / group, l, l, d, m));
}

// Where the deterministic backward's ranked entry may fit (fa3_det_leads): bf16 or f16, padded, no
// soft-capping, and a row of kFa3DetLeads (head dim, no mask or causal with Lq = Lk, the group's
// range, the fewest rows to the most, the most key rows); anything else (a window too, even one
// wider than the problem) stays with cuDNN's deterministic algorithm. Each row takes its own
// corners and not their near outside (which another row may take: fa3_det_lead names the row);
// the sweep's shapes where cuDNN's algorithm led stay with it.
TEST(AttentionCudnnRules, DeterministicBackwardLeadsWhereMeasured) {
  // Two sequences, two key heads (4 x Lk key rows), or `kh` key heads of one sequence.
  auto problem = [](const DetLead& lead, int64_t lq, int64_t lk, int64_t group,
                    DType t = DType::bf16, int64_t kh = 0) {
    const Mask m = lead.causal ? Mask::causal_top_left() : Mask::none();
    const int64_t b = kh > 0 ? 1 : 2, hk = kh > 0 ? kh : 2;
    return problem_of(make_desc(t, b, hk * group, hk, lq, lk, lead.head_dim, m));
  };
  auto row = [](const attention::Problem& p) { return fa3_det_lead(p); };
  for (const DetLead& lead : kFa3DetLeads) {
    SCOPED_TRACE("d" + std::to_string(lead.head_dim) + (lead.causal ? " causal" : "") +
                 " groups from " + std::to_string(lead.min_group) + " rows from " +
                 std::to_string(lead.min_rows));
    const int64_t rows = lead.min_rows, low = lead.min_group, high = lead.max_group;
    // Inside: a row may sit below an earlier one of wider reach, so inside points only lead.
    EXPECT_TRUE(fa3_det_leads(problem(lead, rows, rows, low)));
    EXPECT_TRUE(fa3_det_leads(problem(lead, rows, rows, high)));
    const int64_t longest = std::min({32 * rows, lead.max_rows, lead.max_key_rows / 4});
    EXPECT_TRUE(fa3_det_leads(problem(lead, longest, longest, high, DType::f16)));
    EXPECT_NE(row(problem(lead, rows - 1, rows - 1, low)), &lead);
    if (lead.max_rows != kNoBound) {
      EXPECT_NE(row(problem(lead, lead.max_rows + 1, lead.max_rows + 1, low)), &lead);
    }
    if (lead.max_key_rows != kNoBound) {
      const int64_t heads = lead.max_key_rows / rows;  // key heads at the bound
      EXPECT_EQ(row(problem(lead, rows, rows, low, DType::bf16, heads)), &lead);
      EXPECT_NE(row(problem(lead, rows, rows, low, DType::bf16, heads + 1)), &lead);
    }
    EXPECT_FALSE(fa3_det_leads(problem(lead, rows, rows, det_group_beyond(lead))));
    if (low > 1) {
      EXPECT_NE(row(problem(lead, rows, rows, low - 1)), &lead);
    }
    EXPECT_FALSE(fa3_det_leads(problem(lead, rows, rows, low, DType::f32)));
    // Lq != Lk: unmasked from min_rows each; causal never (not measured).
    EXPECT_EQ(fa3_det_leads(problem(lead, rows, 4 * rows, low)), !lead.causal);
    EXPECT_NE(row(problem(lead, rows - 1, 4 * rows, low)), &lead);
  }
  // The sweep's d128 causal shapes (16 query heads; B x L tokens) in groups of 8 / 16 at 4k to 64k
  // tokens: fa3's since the eighty-second session (cuDNN's at 64k up to L4096 before); in groups of
  // 4 at 64k up to L4096 since the eighty-fourth.
  for (int64_t group : {8, 16})
    for (int64_t l : {512, 1024, 2048, 4096})
      for (int64_t tokens : {4096, 16384, 65536})
        EXPECT_TRUE(fa3_det_leads(sweep(128, group, l, tokens))) << group << " " << l;
  EXPECT_TRUE(fa3_det_leads(sweep(128, 8, 8192, 65536)));
  for (int64_t l : {512, 1024, 2048, 4096}) EXPECT_TRUE(fa3_det_leads(sweep(128, 4, l, 65536)));
  EXPECT_FALSE(fa3_det_leads(sweep(128, 4, 8192, 65536)));
  EXPECT_TRUE(fa3_det_leads(sweep(64, 16, 512, 16384)));
  EXPECT_TRUE(fa3_det_leads(sweep(64, 4, 512, 16384)));
  const int64_t rows = 4096;
  auto d64 = [&](Mask m, int64_t d = 64, int64_t dv = 64) {
    Descriptor desc = make_desc(DType::bf16, 2, 16, 16, rows, rows, d, m);
    desc.head_dim_v = dv;
    return problem_of(desc);
  };
  EXPECT_TRUE(fa3_det_leads(d64(Mask::causal_bottom_right())));
  EXPECT_FALSE(fa3_det_leads(d64(Mask::sliding_window(2 * rows, 2 * rows))));
  EXPECT_FALSE(fa3_det_leads(d64(Mask::sliding_window(2 * rows - 1, -1))));
  EXPECT_FALSE(fa3_det_leads(d64(Mask::none(), 256, 256)));
  EXPECT_FALSE(fa3_det_leads(d64(Mask::none(), 64, 128)));
  EXPECT_FALSE(fa3_det_leads(capped_d64(rows)));
  EXPECT_FALSE(fa3_det_leads(packed_d64(rows)));
}

// Where fa3's backward stores a dQ chunk's first add (fa3_bwd_first_store): up to 1024 query and
// key rows, whatever the head dim, mask, group or dtype; varlen by its longest sequences.
TEST(AttentionCudnnRules, FirstStoreUpTo1024QueryRows) {
  for (int64_t d : {64, 128})
    for (int64_t group : {1, 4}) {
      EXPECT_TRUE(fa3_bwd_first_store(sweep(d, group, 512, 16384)));
      EXPECT_TRUE(fa3_bwd_first_store(sweep(d, group, 1024, 65536, Mask::none(), DType::f16)));
      EXPECT_FALSE(fa3_bwd_first_store(sweep(d, group, 2048, 16384)));
      EXPECT_FALSE(fa3_bwd_first_store(sweep(d, group, 16384, 16384, Mask::none())));
    }
  // A chunk of 1024 queries against 4096 keys: four times the adds a chunk of L1024's.
  EXPECT_FALSE(fa3_bwd_first_store(
      problem_of(make_desc(DType::bf16, 2, 8, 2, 1024, 4096, 128, Mask::causal_bottom_right()))));
  EXPECT_TRUE(fa3_bwd_first_store(
      problem_of(make_desc(DType::bf16, 2, 8, 2, 300, 1024, 128, Mask::causal_bottom_right()))));
  EXPECT_FALSE(fa3_bwd_first_store(
      problem_of(make_desc(DType::bf16, 2, 8, 2, 300, 1025, 128, Mask::causal_bottom_right()))));
  EXPECT_FALSE(fa3_bwd_first_store(
      problem_of(make_desc(DType::bf16, 2, 8, 2, 1025, 1025, 128, Mask::causal_top_left()))));
  Descriptor packed = make_desc(DType::bf16, 3, 8, 2, 1024, 1024, 128, Mask::causal_top_left());
  packed.varlen = true;
  packed.total_q = packed.total_k = 2000;
  EXPECT_TRUE(fa3_bwd_first_store(problem_of(packed)));
  packed.len_q = packed.len_k = 1500;
  EXPECT_FALSE(fa3_bwd_first_store(problem_of(packed)));
}

// The deterministic split's order (fa3_det_rising) and the default's falling walks
// (fa3_bwd_falls) at the sweep's shapes (16 query heads at d128, 32 at d64; B x L tokens), as
// measured in the eightieth session's call 2; neither outside their shape (unmasked, f32, Lq !=
// Lk, a window, d256).
TEST(AttentionCudnnRules, BackwardWalkOrdersWhereMeasured) {
  struct Point {
    int64_t d, group, l, tokens;
    bool rising, falls;
  };
  const Point points[] = {{128, 2, 512, 16384, false, false},  {128, 2, 1024, 16384, false, false},
                          {128, 2, 2048, 16384, true, false},  {128, 2, 16384, 16384, true, false},
                          {128, 2, 512, 4096, true, false},    {128, 4, 512, 16384, false, false},
                          {128, 4, 1024, 16384, true, false},  {128, 4, 8192, 16384, true, false},
                          {128, 8, 512, 16384, true, false},   {128, 16, 4096, 16384, true, false},
                          {128, 1, 2048, 16384, false, false}, {128, 1, 8192, 16384, true, false},
                          {128, 8, 2048, 65536, false, false}, {128, 16, 8192, 65536, true, false},
                          {128, 4, 512, 4096, false, false},   {128, 4, 1024, 4096, true, true},
                          {128, 4, 4096, 4096, true, true},    {128, 8, 2048, 4096, true, true},
                          {128, 8, 512, 4096, true, false},    {128, 16, 1024, 4096, true, false},
                          {128, 2, 1024, 4096, true, false},   {64, 4, 1024, 16384, false, false},
                          {64, 4, 2048, 16384, true, true},    {64, 4, 16384, 16384, true, false},
                          {64, 16, 512, 16384, true, true},    {64, 16, 4096, 16384, true, false},
                          {64, 2, 4096, 16384, false, false},  {128, 1, 2048, 4096, true, false},
                          {128, 1, 512, 4096, false, false}};
  for (const Point& pt : points) {
    SCOPED_TRACE("d" + std::to_string(pt.d) + " groups of " + std::to_string(pt.group) + " L" +
                 std::to_string(pt.l) + " " + std::to_string(pt.tokens) + " tokens");
    EXPECT_EQ(fa3_det_rising(sweep(pt.d, pt.group, pt.l, pt.tokens)), pt.rising);
    EXPECT_EQ(fa3_bwd_falls(sweep(pt.d, pt.group, pt.l, pt.tokens)), pt.falls);
    EXPECT_EQ(
        fa3_bwd_falls(sweep(pt.d, pt.group, pt.l, pt.tokens, Mask::causal_top_left(), DType::f16)),
        pt.falls);
    for (const attention::Problem& p :
         {sweep(pt.d, pt.group, pt.l, pt.tokens, Mask::none()),
          sweep(pt.d, pt.group, pt.l, pt.tokens, Mask::causal_top_left(), DType::f32),
          sweep(pt.d, pt.group, pt.l, pt.tokens, Mask::sliding_window(pt.l / 2, 0)),
          sweep(256, pt.group, pt.l, pt.tokens)}) {
      EXPECT_FALSE(fa3_det_rising(p));
      EXPECT_FALSE(fa3_bwd_falls(p));
    }
  }
  // Lq != Lk.
  const attention::Problem chunk =
      problem_of(make_desc(DType::bf16, 1, 16, 4, 1024, 2048, 128, Mask::causal_bottom_right()));
  EXPECT_FALSE(fa3_det_rising(chunk));
  EXPECT_FALSE(fa3_bwd_falls(chunk));
  EXPECT_FALSE(fa3_bwd_deterministic_default(chunk));
  // The deterministic default at the measured points of the 4k, 16k and 64k token sweeps and not
  // their neighbours: d128 causal (kFa3BwdDeterministicPicks) in the order kFa3DetRising says, and
  // unmasked (kFa3BwdDeterministicUnmaskedPicks: groups of 4 to 16 at L512 and of 8 / 16 at L1024
  // from 16k to 64k tokens, groups of 4 at 16k only; never rising); never f32 or d64.
  struct Default {
    bool causal;
    int64_t group, l, tokens;
    bool det, rising = false;
  };
  constexpr bool kCausal = true, kNone = false;
  // One point a line is what clang-format makes of a table this long; two, by hand, by tokens,
  // group and length.
  // clang-format off
  const Default defaults[] = {
      {kCausal, 1, 512, 4096, false},           {kCausal, 1, 1024, 4096, true, true},
      {kCausal, 1, 2048, 4096, true, true},     {kCausal, 1, 4096, 4096, true, true},
      {kCausal, 2, 4096, 4096, false},          {kCausal, 4, 512, 4096, false},
      {kCausal, 4, 2048, 4096, false},          {kCausal, 8, 512, 4096, true, true},
      {kCausal, 8, 1024, 4096, false},          {kCausal, 16, 512, 4096, true, true},
      {kCausal, 16, 1024, 4096, false},         {kCausal, 1, 1024, 8192, false},
      {kCausal, 1, 512, 16384, false},          {kCausal, 1, 1024, 16384, false},
      {kCausal, 1, 2048, 16384, true},          {kCausal, 1, 4096, 16384, false},
      {kCausal, 1, 8192, 16384, true, true},    {kCausal, 1, 16384, 16384, false},
      {kCausal, 2, 512, 16384, true},           {kCausal, 2, 1024, 16384, true},
      {kCausal, 2, 2048, 16384, true, true},    {kCausal, 2, 4096, 16384, true, true},
      {kCausal, 2, 8192, 16384, true, true},    {kCausal, 2, 16384, 16384, false},
      {kCausal, 4, 512, 16384, true},           {kCausal, 4, 1024, 16384, true, true},
      {kCausal, 4, 2048, 16384, true, true},    {kCausal, 4, 4096, 16384, true, true},
      {kCausal, 4, 8192, 16384, false},         {kCausal, 8, 512, 16384, true, true},
      {kCausal, 8, 1024, 16384, true, true},    {kCausal, 8, 2048, 16384, true, true},
      {kCausal, 8, 4096, 16384, false},         {kCausal, 16, 512, 16384, true, true},
      {kCausal, 16, 1024, 16384, true, true},   {kCausal, 16, 2048, 16384, false},
      {kCausal, 16, 4096, 16384, false},        {kCausal, 16, 8192, 16384, true, true},
      {kCausal, 16, 16384, 16384, true, true},  {kCausal, 1, 2048, 32768, false},
      {kCausal, 2, 512, 32768, false},          {kCausal, 2, 1024, 32768, true},
      {kCausal, 2, 2048, 32768, false},         {kCausal, 4, 512, 32768, true},
      {kCausal, 4, 1024, 32768, true},          {kCausal, 4, 2048, 32768, false},
      {kCausal, 1, 512, 65536, false},          {kCausal, 1, 1024, 65536, false},
      {kCausal, 1, 2048, 65536, true},          {kCausal, 1, 4096, 65536, false},
      {kCausal, 1, 8192, 65536, false},         {kCausal, 2, 512, 65536, true},
      {kCausal, 2, 1024, 65536, true},          {kCausal, 2, 2048, 65536, true},
      {kCausal, 2, 4096, 65536, false},         {kCausal, 4, 512, 65536, true},
      {kCausal, 4, 1024, 65536, true},          {kCausal, 4, 2048, 65536, false},
      {kCausal, 8, 512, 65536, true},           {kCausal, 8, 1024, 65536, true},
      {kCausal, 8, 2048, 65536, false},         {kCausal, 16, 512, 65536, true},
      {kCausal, 16, 1024, 65536, true},         {kCausal, 16, 8192, 65536, false},
      {kCausal, 2, 512, 131072, false},         {kCausal, 4, 512, 131072, false},
      {kCausal, 8, 512, 131072, false},         {kNone, 4, 512, 4096, false},
      {kNone, 8, 512, 4096, false},             {kNone, 16, 1024, 4096, false},
      {kNone, 1, 512, 16384, false},            {kNone, 2, 512, 16384, false},
      {kNone, 4, 512, 16384, true},             {kNone, 4, 1024, 16384, false},
      {kNone, 8, 512, 16384, true},             {kNone, 8, 1024, 16384, true},
      {kNone, 8, 2048, 16384, false},           {kNone, 16, 512, 16384, true},
      {kNone, 16, 1024, 16384, true},           {kNone, 16, 2048, 16384, false},
      {kNone, 16, 16384, 16384, false},         {kNone, 2, 512, 65536, false},
      {kNone, 4, 512, 65536, false},            {kNone, 4, 1024, 65536, false},
      {kNone, 8, 512, 65536, true},             {kNone, 8, 1024, 65536, true},
      {kNone, 8, 2048, 65536, false},           {kNone, 16, 512, 65536, true},
      {kNone, 16, 1024, 65536, true},           {kNone, 8, 512, 131072, false},
      {kNone, 16, 1024, 131072, false}};
  // clang-format on
  for (const Default& pt : defaults) {
    SCOPED_TRACE(std::string(pt.causal ? "causal" : "unmasked") + ", groups of " +
                 std::to_string(pt.group) + " L" + std::to_string(pt.l) + " " +
                 std::to_string(pt.tokens) + " tokens");
    const Mask m = pt.causal ? Mask::causal_top_left() : Mask::none();
    const attention::Problem p = sweep(128, pt.group, pt.l, pt.tokens, m);
    EXPECT_EQ(fa3_bwd_deterministic_default(p), pt.det);
    if (pt.det) {
      EXPECT_EQ(fa3_det_rising(p), pt.rising);
      EXPECT_TRUE(fa3_det_leads(p));
    }
    EXPECT_FALSE(
        fa3_bwd_deterministic_default(sweep(128, pt.group, pt.l, pt.tokens, m, DType::f32)));
    EXPECT_FALSE(fa3_bwd_deterministic_default(sweep(64, pt.group, pt.l, pt.tokens, m)));
  }
  Descriptor window = make_desc(DType::bf16, 32, 16, 2, 512, 512, 128, Mask::none());
  EXPECT_TRUE(fa3_bwd_deterministic_default(problem_of(window)));
  window.mask = Mask::sliding_window(256, 256);
  EXPECT_FALSE(fa3_bwd_deterministic_default(problem_of(window)));
  EXPECT_FALSE(fa3_bwd_deterministic_default(
      problem_of(make_desc(DType::bf16, 32, 16, 2, 512, 1024, 128, Mask::none()))));
}

// cuDNN's deterministic algorithm as the default backward (kCudnnBwdDeterministicPicks): d128
// causal ungrouped L512 at 16k to 64k tokens and L1024 at 64k, not their neighbours (L1024 at 16k
// / 32k / 128k tokens, L2048, 4k or 128k tokens, groups, unmasked, d64, f32, Lq != Lk); never where
// fa3's deterministic default is.
TEST(AttentionCudnnRules, CudnnDeterministicDefaultWhereMeasured) {
  EXPECT_TRUE(cudnn_bwd_deterministic_default(sweep(128, 1, 512, 16384)));
  EXPECT_TRUE(cudnn_bwd_deterministic_default(sweep(128, 1, 512, 65536)));
  EXPECT_TRUE(cudnn_bwd_deterministic_default(sweep(128, 1, 1024, 65536)));
  EXPECT_TRUE(cudnn_bwd_deterministic_default(
      sweep(128, 1, 512, 16384, Mask::causal_top_left(), DType::f16)));
  for (const attention::Problem& p :
       {sweep(128, 1, 1024, 16384), sweep(128, 1, 256, 16384), sweep(128, 1, 512, 4096),
        sweep(128, 1, 512, 131072), sweep(128, 2, 512, 16384), sweep(128, 1, 1024, 32768),
        sweep(128, 1, 1024, 131072), sweep(128, 1, 2048, 65536),
        sweep(128, 1, 512, 16384, Mask::none()), sweep(64, 1, 512, 16384),
        sweep(128, 1, 512, 16384, Mask::causal_top_left(), DType::f32)})
    EXPECT_FALSE(cudnn_bwd_deterministic_default(p));
  EXPECT_FALSE(cudnn_bwd_deterministic_default(
      problem_of(make_desc(DType::bf16, 32, 16, 16, 512, 1024, 128, Mask::causal_bottom_right()))));
  for (int64_t group : {1, 2, 4, 8, 16})
    for (int64_t l : {512, 1024, 2048, 4096, 8192, 16384})
      for (int64_t tokens : {4096, 16384, 65536}) {
        if (l > tokens) continue;
        const attention::Problem p = sweep(128, group, l, tokens);
        EXPECT_FALSE(cudnn_bwd_deterministic_default(p) && fa3_bwd_deterministic_default(p))
            << group << " " << l << " " << tokens;
      }
}

// The default backward in GQA groups (grouped_backward_pick): each kGroupedBackwardPicks row picks
// its candidate inside it (its least group and rows, at its most rows, in f16); with fewer rows, a
// smaller group, more rows or key rows than it takes, or outside its shape (d256, which no row
// names; f32, soft-capped, packed, Lq != Lk, a window) no row does (the rows are laid out so that
// one row's near outside lies outside the others). Over the shipped table a row decides
// ahead of the Lq = Lk points, where its candidate runs, and not under an empty table.
TEST(AttentionCudnnRules, GroupedBackwardPicksWhereMeasured) {
  // b sequences of l rows, hq query heads in groups of `group`.
  auto desc = [](int64_t d, bool causal, int64_t group, int64_t l, int64_t b, int64_t hq,
                 DType t = DType::bf16) {
    return make_desc(t, b, hq, hq / group, l, l, d,
                     causal ? Mask::causal_top_left() : Mask::none());
  };
  auto pick = [&](int64_t d, bool causal, int64_t group, int64_t l, int64_t b, int64_t hq,
                  DType t = DType::bf16) {
    return grouped_backward_pick(problem_of(desc(d, causal, group, l, b, hq, t)));
  };
  for (const GroupedBackwardPick& row : kGroupedBackwardPicks) {
    // A row with a key-row floor lies inside a wider row: its outside is that row's (below).
    if (row.min_key_rows > 0) continue;
    SCOPED_TRACE("d" + std::to_string(row.head_dim) + (row.causal ? " causal" : "") +
                 " groups from " + std::to_string(row.min_group));
    const int64_t d = row.head_dim, g = row.min_group, l = row.min_rows;
    // One sequence, up to 4 key heads, within the row's key rows.
    const int64_t hk = std::clamp<int64_t>(row.max_key_rows / l, 1, 4);
    EXPECT_EQ(pick(d, row.causal, g, l, 1, g * hk), row.pick);
    EXPECT_EQ(pick(d, row.causal, g, l, 1, g * hk, DType::f16), row.pick);
    EXPECT_EQ(pick(d, row.causal, g, l / 2, 1, g * hk), std::nullopt);
    EXPECT_EQ(pick(d, row.causal, g / 2, l, 1, g / 2 * hk), std::nullopt);
    EXPECT_EQ(pick(d, row.causal, g, l, 1, g * hk, DType::f32), std::nullopt);
    EXPECT_EQ(pick(256, row.causal, g, l, 1, g * hk), std::nullopt);
    if (row.max_rows < kNoBound) {
      EXPECT_EQ(pick(d, row.causal, g, row.max_rows, 1, g), row.pick);
      EXPECT_EQ(pick(d, row.causal, g, 2 * row.max_rows, 1, g), std::nullopt);
    }
    if (row.max_key_rows < kNoBound) {
      const int64_t most = row.max_key_rows / l;  // key heads at the bound
      EXPECT_EQ(pick(d, row.causal, g, l, 1, g * most), row.pick);
      EXPECT_EQ(pick(d, row.causal, g, l, 1, g * (most + 1)), std::nullopt);
      EXPECT_EQ(pick(d, row.causal, g, l, 2, g * most), std::nullopt);
    }
  }
  // Points of the sweep's shapes (16 query heads at d128, 32 at d64; b sequences): d128 causal in
  // groups of 8 or 16 at L16384 from 64k key rows to cuDNN, in bf16 and f16, one sequence of 4 key
  // heads or 4 of one (below 64k key rows, at L8192 or in groups of 4, fa3's row); at 16k tokens
  // causal d128 in any group from L512 to fa3, one sequence or many; d64 keeps the table in any
  // group.
  struct Point {
    int64_t d;
    bool causal;
    int64_t group, l, b, hq;
    std::optional<Candidate> want;
    DType t = DType::bf16;
  };
  const Point points[] = {{128, true, 16, 16384, 4, 16, Candidate::cudnn},
                          {128, true, 16, 16384, 4, 16, Candidate::cudnn, DType::f16},
                          {128, true, 16, 16384, 1, 64, Candidate::cudnn},
                          {128, true, 16, 16384, 2, 16, Candidate::fa3},
                          {128, true, 16, 16384, 1, 16, Candidate::fa3},
                          {128, true, 16, 8192, 8, 16, Candidate::fa3},
                          {128, true, 8, 16384, 4, 16, Candidate::cudnn},
                          {128, true, 8, 16384, 1, 32, Candidate::cudnn},
                          {128, true, 4, 16384, 4, 16, Candidate::fa3},
                          {128, false, 16, 16384, 4, 16, Candidate::fa3},
                          {128, true, 16, 16384, 4, 16, std::nullopt, DType::f32},
                          {128, true, 4, 4096, 4, 16, Candidate::fa3},
                          {128, true, 4, 4096, 1, 16, Candidate::fa3},
                          {128, true, 8, 16384, 1, 16, Candidate::fa3},
                          {128, true, 16, 256, 64, 16, std::nullopt},
                          {128, true, 1, 4096, 4, 16, std::nullopt},
                          {64, true, 16, 8192, 2, 32, std::nullopt},
                          {64, false, 16, 4096, 4, 32, std::nullopt}};
  for (const Point& pt : points)
    EXPECT_EQ(pick(pt.d, pt.causal, pt.group, pt.l, pt.b, pt.hq, pt.t), pt.want)
        << "d" << pt.d << (pt.causal ? " causal" : "") << " groups of " << pt.group << " L" << pt.l
        << " b" << pt.b << " hq" << pt.hq << " " << name(pt.t);
  Descriptor d = desc(128, false, 4, 2048, 8, 16);
  d.softcap = 30;
  EXPECT_EQ(grouped_backward_pick(problem_of(d)), std::nullopt);
  d = desc(128, false, 4, 2048, 8, 16);
  d.varlen = true, d.total_q = d.total_k = 8 * 2048;
  EXPECT_EQ(grouped_backward_pick(problem_of(d)), std::nullopt);
  d = desc(128, false, 4, 2048, 8, 16);
  d.len_k = 4096;
  EXPECT_EQ(grouped_backward_pick(problem_of(d)), std::nullopt);
  d = desc(128, false, 16, 2048, 8, 16);
  d.mask = Mask::sliding_window(4096, 0);
  EXPECT_EQ(grouped_backward_pick(problem_of(d)), std::nullopt);
  d.mask = Mask::causal_bottom_right();
  EXPECT_EQ(grouped_backward_pick(problem_of(d)), Candidate::fa3);

  // Over the shipped table (16k tokens): d128 L1024 unmasked goes to cuDNN ungrouped (the table's
  // point; fa3 where cuDNN is not built), to fa3 in groups; d128 L2048 causal to cuDNN ungrouped
  // (the table's point), to fa3 in groups of 2 and 16; an empty table keeps no row.
  auto shipped = [&](int64_t group, bool causal, int64_t l, bool cudnn_built = true) {
    return preferred_candidate(problem_of(desc(128, causal, group, l, 16384 / l, 16)),
                               Pass::backward, true, cudnn_built);
  };
  EXPECT_EQ(shipped(1, false, 1024), Candidate::cudnn);
  EXPECT_EQ(shipped(1, false, 1024, false), Candidate::fa3);
  EXPECT_EQ(shipped(4, false, 1024), Candidate::fa3);
  EXPECT_EQ(shipped(1, true, 2048), Candidate::cudnn);
  EXPECT_EQ(shipped(2, true, 2048), Candidate::fa3);
  EXPECT_EQ(shipped(16, true, 2048), Candidate::fa3);
  // At 64k tokens in groups of 16 at L16384 the grouped row gives the backward to cuDNN, where it
  // runs (fa3 without it).
  const attention::Problem long_mqa = problem_of(desc(128, true, 16, 16384, 4, 16));
  EXPECT_EQ(preferred_candidate(long_mqa, Pass::backward, true), Candidate::cudnn);
  EXPECT_EQ(preferred_candidate(long_mqa, Pass::backward, true, false), Candidate::fa3);
  const attention::Problem grouped = problem_of(desc(128, false, 4, 1024, 16, 16));
  EXPECT_EQ(preferred_candidate({}, grouped, Pass::backward, true), Candidate::cudnn);
  EXPECT_EQ(preferred_candidate({}, grouped, Pass::backward, false), Candidate::cudnn);
}

// fa3's backward splits each key block's walk over the group's heads where its list-schedule model
// of the grid (132 SMs, 128 keys a CTA, 64 query rows a step) finds a 2% shorter grid: a causal
// group of 16 in 8 CTAs into 8 parts, one sequence of L4096 unmasked (32 CTAs) into 4; the sweep's
// causal d128 shapes at 16k tokens into 4 in groups of 8 at L1024 / L2048 and of 16 at L4096, one
// sequence of L16384 in groups of 2 not at all; parts always a power of two dividing the group (a
// group of 6 into 2, of 3 never); nothing for MHA, varlen, D = 256, from 8 waves of CTAs, or on one
// SM (the memo keyed by the SM count too). The unsplit grid key block first where the model finds
// it 1.28x shorter than the best split: the measured wins (groups of 8 at L512, 4k tokens in groups
// of 2 at L512-L4096), not the losses (groups of 4 at L512, of 8 at L1024, 64k tokens in groups of
// 8 at L2048) nor where the split alone balances (groups of 16 at L4096), unmasked or MHA; the
// split entries by name keep the best split there. With Q and dY in the L2, the split grid key
// block first where that models 1.1x shorter.
TEST(AttentionCudnnRules, BackwardHeadSplitByTheGridModel) {
  auto parts = [](int64_t b, int64_t hq, int64_t hk, int64_t l, Mask m, int sms = 132,
                  int64_t d = 128) {
    return fa3_bwd_head_parts(problem_of(make_desc(DType::bf16, b, hq, hk, l, l, d, m)), sms, 128,
                              64);
  };
  const Mask causal = Mask::causal_top_left();
  EXPECT_EQ(parts(1, 16, 1, 1024, causal), 8);
  EXPECT_EQ(parts(1, 16, 1, 1024, causal), 8);  // memoized
  EXPECT_EQ(parts(1, 16, 1, 4096, Mask::none()), 4);
  EXPECT_EQ(parts(4, 16, 1, 4096, causal), 4);
  EXPECT_EQ(parts(8, 16, 2, 2048, causal), 4);
  EXPECT_EQ(parts(16, 16, 2, 1024, causal), 4);
  EXPECT_EQ(parts(1, 16, 8, 16384, causal), 1);
  EXPECT_EQ(parts(1, 12, 2, 2048, causal), 2);
  EXPECT_EQ(parts(1, 6, 2, 2048, causal), 1);
  EXPECT_EQ(parts(1, 16, 16, 1024, causal), 1);           // MHA
  EXPECT_EQ(parts(64, 16, 2, 1024, causal), 1);           // 1024 CTAs: simulated, no gain
  EXPECT_EQ(parts(128, 16, 2, 1024, causal), 1);          // 2048 CTAs: 8 waves or more
  EXPECT_EQ(parts(1, 16, 1, 1024, causal, 1), 1);         // one SM
  EXPECT_EQ(parts(1, 16, 1, 1024, causal, 132, 256), 1);  // D = 256
  Descriptor v = make_desc(DType::bf16, 1, 16, 1, 1024, 1024, 128, causal);
  v.varlen = true, v.total_q = v.total_k = 1024;
  EXPECT_EQ(fa3_bwd_head_parts(problem_of(v), 132, 128, 64), 1);
  EXPECT_EQ(fa3_bwd_head_parts(
                problem_of(make_desc(DType::bf16, 1, 16, 1, 1024, 1024, 128, causal)), 0, 128, 64),
            1);
  // (l2: the device's L2 bytes; 0, none, leaves the choices that do not depend on it.)
  auto heavy = [](int64_t b, int64_t hq, int64_t hk, int64_t l, Mask m, int64_t l2 = 0,
                  int64_t d = 128) {
    return fa3_bwd_grid(problem_of(make_desc(DType::bf16, b, hq, hk, l, l, d, m)), 132, 128,
                        d == 64 ? 128 : 64, l2);
  };
  EXPECT_TRUE(heavy(32, 16, 2, 512, causal).heavy_first);
  EXPECT_EQ(heavy(32, 16, 2, 512, causal).parts, 1);
  EXPECT_TRUE(heavy(8, 16, 8, 512, causal).heavy_first);
  EXPECT_TRUE(heavy(4, 16, 8, 1024, causal).heavy_first);
  EXPECT_TRUE(heavy(2, 16, 8, 2048, causal).heavy_first);
  EXPECT_TRUE(heavy(1, 16, 8, 4096, causal).heavy_first);
  EXPECT_EQ(heavy(1, 16, 8, 4096, causal).parts, 1);  // heavy first keeps the walks whole
  EXPECT_EQ(heavy(1, 16, 8, 4096, causal).split, 2);  // the split entries' parts by name
  EXPECT_EQ(heavy(2, 16, 8, 2048, causal).split, 2);
  EXPECT_EQ(parts(2, 16, 8, 2048, causal), 2);
  EXPECT_FALSE(heavy(16, 16, 2, 1024, causal).heavy_first);
  EXPECT_EQ(heavy(16, 16, 2, 1024, causal).parts, 4);
  EXPECT_FALSE(heavy(32, 16, 4, 512, causal).heavy_first);
  EXPECT_FALSE(heavy(32, 16, 2, 2048, causal).heavy_first);
  EXPECT_FALSE(heavy(4, 16, 1, 4096, causal).heavy_first);
  EXPECT_FALSE(heavy(8, 16, 8, 512, Mask::none()).heavy_first);
  EXPECT_FALSE(heavy(16, 16, 16, 512, causal).heavy_first);
  // Q and dY in L2 (4k tokens: 32 MiB against the H200's 60 MiB): the split taken key block first
  // at gains from 1.1 (the measured wins: groups of 4 at L1024 / L2048, of 8 at L1024, d64 in
  // groups of 8 at L1024 / L2048), not at gains about 1 (groups of 8 at L2048), not with less L2
  // than Q and dY, nor at 16k tokens.
  constexpr int64_t kL2 = int64_t{60} << 20;
  for (auto [b, hk, l] : {std::tuple{4, 4, 1024}, std::tuple{2, 4, 2048}, std::tuple{4, 2, 1024}}) {
    SCOPED_TRACE("b" + std::to_string(b) + " hk" + std::to_string(hk) + " l" + std::to_string(l));
    const Fa3BwdGrid resident = heavy(b, 16, hk, l, causal, kL2);
    EXPECT_TRUE(resident.heavy_first);
    EXPECT_EQ(resident.parts, 16 / hk);
    EXPECT_EQ(resident.parts, heavy(b, 16, hk, l, causal).parts);  // the same split
    EXPECT_FALSE(heavy(b, 16, hk, l, causal).heavy_first);
    EXPECT_FALSE(heavy(b, 16, hk, l, causal, (int64_t{32} << 20) - 1).heavy_first);
    EXPECT_FALSE(heavy(4 * b, 16, hk, l, causal, kL2).heavy_first);
  }
  EXPECT_TRUE(heavy(4, 32, 4, 1024, causal, kL2, 64).heavy_first);
  EXPECT_TRUE(heavy(2, 32, 4, 2048, causal, kL2, 64).heavy_first);
  EXPECT_FALSE(heavy(2, 16, 2, 2048, causal, kL2).heavy_first);
}

// The deterministic instance's split (fa3_bwd_det_parts): the same list schedule with the ordered
// adds' waits. In causal groups at 16k tokens it splits more than the in-order model where the
// last key heads' longest walks, the last tickets, would wait in the tail (groups of 16 at L8192:
// 8 parts, not 2; of 8 and 4 at L16384: 8 and 4, not 1), the same where nothing waits (4k tokens
// in groups of 2 at L512: 1; groups of 16 at L1024: 8); rotated walks (no mask) take the in-order
// split; nothing for MHA or varlen.
TEST(AttentionCudnnRules, DeterministicSplitByTheOrderedGridModel) {
  auto det = [](int64_t b, int64_t hk, int64_t l, Mask m = Mask::causal_top_left(),
                bool rotated = false) {
    return fa3_bwd_det_parts(problem_of(make_desc(DType::bf16, b, 16, hk, l, l, 128, m)), 132, 128,
                             64, rotated);
  };
  auto in_order = [](int64_t b, int64_t hk, int64_t l, Mask m = Mask::causal_top_left()) {
    return fa3_bwd_head_parts(problem_of(make_desc(DType::bf16, b, 16, hk, l, l, 128, m)), 132, 128,
                              64);
  };
  EXPECT_EQ(det(2, 1, 8192), 8);
  EXPECT_EQ(det(2, 1, 8192), 8);  // memoized
  EXPECT_EQ(in_order(2, 1, 8192), 2);
  EXPECT_EQ(det(1, 2, 16384), 8);
  EXPECT_EQ(in_order(1, 2, 16384), 1);
  EXPECT_EQ(det(1, 4, 16384), 4);
  EXPECT_EQ(det(8, 8, 512), 1);
  EXPECT_EQ(det(16, 1, 1024), 8);
  EXPECT_EQ(det(16, 1, 1024), in_order(16, 1, 1024));
  EXPECT_EQ(det(1, 1, 4096, Mask::none(), true), in_order(1, 1, 4096, Mask::none()));
  EXPECT_EQ(det(2, 16, 8192), 1);  // MHA
  // In the rising order (fa3_bwd_sm90a_deterministic_heavy_first) the key blocks of a head move in
  // step, so fewer parts balance the grid: groups of 16 at L1024 / L16384 2 / 4, of 4 at L16384 1.
  auto rising = [](int64_t b, int64_t hk, int64_t l) {
    return fa3_bwd_det_parts(
        problem_of(make_desc(DType::bf16, b, 16, hk, l, l, 128, Mask::causal_top_left())), 132, 128,
        64, false, true);
  };
  EXPECT_EQ(rising(16, 1, 1024), 2);
  EXPECT_EQ(rising(1, 1, 16384), 4);
  EXPECT_EQ(rising(1, 4, 16384), 1);
  EXPECT_EQ(det(16, 1, 1024), 8);  // the falling order's memo entry is not the rising one's
  Descriptor v = make_desc(DType::bf16, 1, 16, 1, 1024, 1024, 128, Mask::causal_top_left());
  v.varlen = true, v.total_q = v.total_k = 1024;
  EXPECT_EQ(fa3_bwd_det_parts(problem_of(v), 132, 128, 64, false), 1);
}

// The grid models remember recent problems (run() asks at every launch): asked again, in another
// order, after 20 other shapes and with more remembered than fit, each answers as when first
// asked, the grid model's whole answer and the ordered-adds model's parts.
TEST(AttentionCudnnRules, GridModelsAnswerAlikeWhenAskedAgain) {
  std::vector<attention::Problem> problems;
  for (int64_t hk : {1, 2, 4})
    for (int64_t l : {512, 1024, 2048, 4096, 8192, 16384, 700})
      problems.push_back(
          problem_of(make_desc(DType::bf16, std::max<int64_t>(1, 16384 / l), 16, hk, l, l, 128,
                               hk == 2 ? Mask::causal_bottom_right() : Mask::causal_top_left())));
  struct Answer {
    Fa3BwdGrid grid;
    int falling, rising;
  };
  std::vector<Answer> first;
  for (const attention::Problem& p : problems)
    first.push_back({fa3_bwd_grid(p, 132, 128, 64, int64_t{60} << 20),
                     fa3_bwd_det_parts(p, 132, 128, 64, false),
                     fa3_bwd_det_parts(p, 132, 128, 64, false, true)});
  for (int pass = 0; pass < 2; ++pass)
    for (size_t j = problems.size(); j-- > 0;) {
      const size_t i = pass == 0 ? j : (j * 5) % problems.size();
      SCOPED_TRACE("problem " + std::to_string(i));
      const Fa3BwdGrid g = fa3_bwd_grid(problems[i], 132, 128, 64, int64_t{60} << 20);
      EXPECT_EQ(g.parts, first[i].grid.parts);
      EXPECT_EQ(g.heavy_first, first[i].grid.heavy_first);
      EXPECT_EQ(g.split, first[i].grid.split);
      EXPECT_EQ(g.split_heavy_first, first[i].grid.split_heavy_first);
      EXPECT_EQ(fa3_bwd_det_parts(problems[i], 132, 128, 64, false), first[i].falling);
      EXPECT_EQ(fa3_bwd_det_parts(problems[i], 132, 128, 64, false, true), first[i].rising);
    }
}

// Decodes of 256-wide heads in groups of 1 (plain multi-head attention) leave the family's decode
// kernel wherever fa3 runs, ahead of the table: one token to fa3's plain instance, from 2 to cuDNN
// (fa3 where cuDNN is not built or not given the problem); bf16 / f16, Dk = Dv = 256, at most
// kDecodeQueryRows rows, fewer than the keys; not other head dims, groups, dtypes, longer chunks,
// nor under an empty table or where fa3 does not run.
TEST(AttentionCudnnRules, WideHeadDecodesGoToFa3OrCudnn) {
  auto decode = [](int64_t b, int64_t hk, int64_t lq, int64_t lk, int64_t d = 256,
                   DType t = DType::bf16) {
    return problem_of(make_desc(t, b, 32, hk, lq, lk, d, Mask::causal_bottom_right()));
  };
  EXPECT_TRUE(wide_head_decode(decode(4, 32, 1, 4096)));
  EXPECT_TRUE(wide_head_decode(decode(64, 32, kDecodeQueryRows, 1024, 256, DType::f16)));
  EXPECT_FALSE(wide_head_decode(decode(4, 32, kDecodeQueryRows + 1, 4096)));
  EXPECT_FALSE(wide_head_decode(decode(4, 32, 8, 8)));  // as many rows as keys
  EXPECT_FALSE(wide_head_decode(decode(4, 32, 1, 4096, 128)));
  EXPECT_FALSE(wide_head_decode(decode(4, 16, 1, 4096)));  // group 2: fa3_packs' case
  EXPECT_FALSE(wide_head_decode(decode(4, 32, 1, 4096, 256, DType::f32)));
  attention::Problem mixed = decode(4, 32, 1, 4096);
  mixed.desc.head_dim_v = 128;
  EXPECT_FALSE(wide_head_decode(mixed));
  const TablePoint cudnn_wins[] = {
      {DType::bf16, Pass::forward, 256, 4096, true, 600, 100, 500, 64}};
  const std::span<const TablePoint> empty{};
  const TablePoint fa3_wins[] = {{DType::bf16, Pass::forward, 256, 4096, true, 100, 200, 500, 64}};
  const attention::Problem one = decode(4, 32, 1, 4096);
  EXPECT_EQ(preferred_candidate(cudnn_wins, one, Pass::forward, true), Candidate::fa3);
  EXPECT_EQ(preferred_candidate(one, Pass::forward, true), Candidate::fa3);
  EXPECT_EQ(preferred_candidate(one, Pass::forward, false), Candidate::bespoke);
  const attention::Problem p = decode(4, 32, 2, 4096);
  EXPECT_EQ(preferred_candidate(fa3_wins, p, Pass::forward, true), Candidate::cudnn);
  EXPECT_EQ(preferred_candidate(p, Pass::forward, true), Candidate::cudnn);
  EXPECT_EQ(preferred_candidate(p, Pass::forward, true, false), Candidate::fa3);
  EXPECT_EQ(preferred_candidate(p, Pass::forward, false), Candidate::bespoke);
  attention::Problem capped = p;  // cuDNN is not given soft-capping
  capped.desc.softcap = 30.0;
  EXPECT_EQ(preferred_candidate(capped, Pass::forward, true), Candidate::fa3);
  // Where cuDNN does not serve (a CPU device's caps): fa3.
  EXPECT_EQ(candidate_here(p, Pass::forward, harness::stream_for(Target::cpu).caps()),
            Candidate::fa3);
  EXPECT_EQ(preferred_candidate(empty, p, Pass::forward, true), Candidate::bespoke);
  EXPECT_EQ(preferred_candidate(decode(4, 32, 2, 4096, 128), Pass::forward, true),
            Candidate::bespoke);
}

// bespoke_pick_points (the table bench_attention's bespoke column and rows select under): the
// bespoke candidate at every sweep point, both dtypes and passes, with or without fa3 and cuDNN,
// and at the bench's other shapes (windows, soft-capping, varlen, Dk != Dv, chunks); the empty
// table picks cuDNN instead, which lets fa3's deterministic entries fit under
// only(Backend::bespoke_cuda) (AttentionHopperGpu.BespokePickSelectsTheFamilysKernels).
TEST(AttentionCudnnRules, BespokePickPointsPickBespoke) {
  auto expect_bespoke = [](const Descriptor& desc) {
    const attention::Problem p = problem_of(desc);
    const auto points = bespoke_pick_points(desc.dtype);
    for (Pass pass : {Pass::forward, Pass::backward})
      for (bool fa3_runs : {true, false})
        for (bool cudnn_built : {true, false})
          EXPECT_EQ(preferred_candidate(points, p, pass, fa3_runs, cudnn_built), Candidate::bespoke)
              << (pass == Pass::forward ? "forward" : "backward") << " fa3 " << fa3_runs
              << " cuDNN " << cudnn_built;
  };
  for (DType t : {DType::bf16, DType::f16})
    for (int64_t d : {64, 128, 256})
      for (int64_t l : {128, 256, 512, 1024, 2048, 4096, 8192, 16384})
        for (bool causal : {false, true}) {
          const Mask m = causal ? Mask::causal_top_left() : Mask::none();
          const Descriptor desc = make_desc(t, 16384 / l, 2048 / d, 2048 / d, l, l, d, m);
          SCOPED_TRACE(std::string(name(t)) + " D" + std::to_string(d) + " L" + std::to_string(l) +
                       (causal ? " causal" : ""));
          expect_bespoke(desc);
          for (Pass pass : {Pass::forward, Pass::backward})
            EXPECT_EQ(
                preferred_candidate(std::span<const TablePoint>{}, problem_of(desc), pass, true),
                Candidate::cudnn);
        }
  // The feature and varlen rows' shapes: a window, a soft cap, Dk != Dv, packed sequences, and a
  // chunk (Lq < Lk) past the decode rows.
  Descriptor window =
      make_desc(DType::bf16, 2, 16, 16, 8192, 8192, 128, Mask::sliding_window(1023, 0));
  expect_bespoke(window);
  Descriptor capped =
      make_desc(DType::bf16, 4, 16, 16, 4096, 4096, 128, Mask::causal_bottom_right());
  capped.softcap = 30.0;
  expect_bespoke(capped);
  Descriptor mla = make_desc(DType::bf16, 4, 16, 16, 4096, 4096, 192, Mask::causal_bottom_right());
  mla.head_dim_v = 128;
  expect_bespoke(mla);
  Descriptor packed = make_desc(DType::f16, 4, 16, 16, 4096, 4096, 128, Mask::causal_top_left());
  packed.varlen = true;
  packed.total_q = packed.total_k = 4 * 4096;
  expect_bespoke(packed);
  expect_bespoke(make_desc(DType::bf16, 4, 32, 8, 1024, 16384, 128, Mask::causal_bottom_right()));
}

// Where the table names cuDNN and cuDNN does not serve the problem (not built, refused, no device),
// the fa3 entries follow the table's pick among the others (candidate_here), not the registry's
// fall-through to the family's kernels: fa3 where its column beats the family's at the point.
TEST(AttentionCudnnRules, WithoutCudnnTheTableRanksTheOthers) {
  const attention::Problem p =
      problem_of(make_desc(DType::bf16, 1, 4, 4, 512, 512, 128, Mask::causal_top_left()));
  const TablePoint fa3_second[] = {{DType::bf16, Pass::forward, 128, 512, true, 300, 100, 200},
                                   {DType::bf16, Pass::backward, 128, 512, true, 300, 100, 200}};
  const TablePoint bespoke_second[] = {{DType::bf16, Pass::forward, 128, 512, true, 300, 200, 100}};
  EXPECT_EQ(preferred_candidate(fa3_second, p, Pass::forward, true), Candidate::cudnn);
  EXPECT_EQ(preferred_candidate(fa3_second, p, Pass::forward, true, false), Candidate::fa3);
  EXPECT_EQ(preferred_candidate(fa3_second, p, Pass::backward, true, false), Candidate::fa3);
  EXPECT_EQ(preferred_candidate(fa3_second, p, Pass::forward, false, false), Candidate::bespoke);
  EXPECT_EQ(preferred_candidate(bespoke_second, p, Pass::forward, true, false), Candidate::bespoke);
  // Chunks of groups of 1 just past a decode against the shipped table, without cuDNN: fa3 over
  // the family's kernels from kFa3ChunkRowsOverBespoke rows, but from
  // kFa3ChunkRowsOverBespokeD64LongCache at d64 against long caches.
  const Mask br = Mask::causal_bottom_right();
  auto chunk_of = [&](int64_t lq, int64_t lk, int64_t dim) {
    return preferred_candidate(problem_of(make_desc(DType::bf16, 4, 32, 32, lq, lk, dim, br)),
                               Pass::forward, true, false);
  };
  for (int64_t dim : {64, 128, 256}) {
    EXPECT_EQ(chunk_of(kFa3ChunkRowsOverBespoke, 4096, dim), Candidate::fa3) << dim;
    // A decode: the family's kernels, but fa3 for 256-wide heads (wide_head_decode).
    EXPECT_EQ(chunk_of(kFa3ChunkRowsOverBespoke - 1, 4096, dim),
              dim == 256 ? Candidate::fa3 : Candidate::bespoke)
        << dim;
  }
  EXPECT_EQ(chunk_of(kFa3ChunkRowsOverBespoke, 16384, 128), Candidate::fa3);
  EXPECT_EQ(chunk_of(kFa3ChunkRowsOverBespoke, kFa3ChunkLongCacheKeysD64, 64), Candidate::fa3);
  EXPECT_EQ(chunk_of(kFa3ChunkRowsOverBespokeD64LongCache - 1, 16384, 64), Candidate::bespoke);
  EXPECT_EQ(chunk_of(kFa3ChunkRowsOverBespokeD64LongCache, 16384, 64), Candidate::fa3);
  // A CPU device's caps: cuDNN never serves there, so candidate_here ranks without it.
  const DeviceCaps cpu = harness::stream_for(Target::cpu).caps();
  EXPECT_FALSE(cudnn_serves(p, cpu));
  const SelectionTableOverride o{fa3_second};
  EXPECT_EQ(candidate_here(p, Pass::forward, cpu), Candidate::fa3);
  EXPECT_EQ(candidate_here(p, Pass::backward, cpu), Candidate::fa3);
}

// The candidate the table's own columns make fastest at a point (what select must follow).
Candidate fastest_at(const TablePoint& t, bool fa3_runs) {
  const double margin = 1.0 + kTableLeadMargin;
  Candidate c = Candidate::cudnn;
  double tf = t.cudnn_tflops;
  if (t.bespoke_tflops > tf * margin) c = Candidate::bespoke, tf = t.bespoke_tflops;
  if (fa3_runs && t.fa3_tflops > tf * margin) c = Candidate::fa3;
  return c;
}

TEST(AttentionCudnnRules, ShippedTableIsWellFormed) {
  EXPECT_FALSE(selection_table_provenance().empty());
  for (const TablePoint& t : selection_table()) {
    EXPECT_TRUE(t.dtype == DType::bf16 || t.dtype == DType::f16);
    EXPECT_GT(t.head_dim, 0);
    EXPECT_GT(t.len, 0);
    EXPECT_GT(t.cudnn_tflops, 0.0);
    EXPECT_GE(t.bespoke_tflops, 0.0);
    EXPECT_GE(t.fa3_tflops, 0.0);
    // Chunk points: forward chunks shorter than their cache, longer than a decode.
    if (t.len_q > 0) {
      EXPECT_EQ(t.pass, Pass::forward);
      EXPECT_LT(t.len_q, t.len);
      EXPECT_GT(t.len_q, kDecodeQueryRows);
    }
    // The shipped table agrees with itself at its own points, with and without fa3 (chunk points
    // in the GQA group of 4 they were measured in, where fa3_packs answers first where it holds).
    const bool chunk = t.len_q > 0;
    const Mask m = !t.causal ? Mask::none()
                   : chunk   ? Mask::causal_bottom_right()
                             : Mask::causal_top_left();
    const attention::Problem p = problem_of(
        make_desc(t.dtype, 1, 8, chunk ? 2 : 8, chunk ? t.len_q : t.len, t.len, t.head_dim, m));
    for (bool fa3_runs : {false, true})
      EXPECT_EQ(preferred_candidate(p, t.pass, fa3_runs),
                fa3_runs && fa3_packs(p) ? Candidate::fa3 : fastest_at(t, fa3_runs))
          << "D" << t.head_dim << " L" << t.len << " Lq " << t.len_q << (t.causal ? " causal" : "");
  }
}

// The short points (L 128 / 256, H200: 16k tokens as 128 / 64 sequences, hidden 2048; bf16 at
// c0417a9, f16 at ed6f394, each the median of 2 runs of 3 rounds): cuDNN leads every forward (fa3's
// column is the persistent variant's, fa3_persists, at 0.82-0.996x: d128 L256 394.1 TFLOP/s bf16
// against cuDNN's 432.9; its causal form lifted causal L256 from 0.80x at aced984 to 0.94x) and
// the d64 L128 non-causal backward (fa3 0.975x in both dtypes); fa3's backward leads the rest, by
// 1.4-22.3% bf16 (d64 L128 causal 56.3 against 55.5, d128 L128 causal 77.9 against 63.7: the
// first-store adds) and 1.6-22.1% f16 (d128 L128 causal 77.9 against 63.8). Without cuDNN fa3 at
// every point; without fa3 the family's kernels.
TEST(AttentionCudnnRules, ShippedTableShortPoints) {
  for (DType t : {DType::bf16, DType::f16})
    for (int64_t d : {64, 128, 256})
      for (int64_t l : {128, 256})
        for (bool causal : {false, true}) {
          const Mask m = causal ? Mask::causal_top_left() : Mask::none();
          const attention::Problem p =
              problem_of(make_desc(t, 16384 / l, 2048 / d, 2048 / d, l, l, d, m));
          SCOPED_TRACE(std::string(name(t)) + " D" + std::to_string(d) + " L" + std::to_string(l) +
                       (causal ? " causal" : ""));
          EXPECT_EQ(preferred_candidate(p, Pass::forward, true), Candidate::cudnn);
          EXPECT_EQ(preferred_candidate(p, Pass::backward, true),
                    d == 64 && !causal && l == 128 ? Candidate::cudnn : Candidate::fa3);
          for (Pass pass : {Pass::forward, Pass::backward}) {
            EXPECT_EQ(preferred_candidate(p, pass, true, false), Candidate::fa3);
            EXPECT_EQ(preferred_candidate(p, pass, false, false), Candidate::bespoke);
          }
        }
}

// The shipped run (H200, cuDNN 9.19.0; bf16: 2026-12-02, c0417a9, each point the median of 2 runs
// of 3 rounds of the columns in alternating order; f16: 2026-12-02, ed6f394, the same way): fa3 is
// picked exactly where it beat cuDNN there by more than kTableLeadMargin. bf16 forward: D = 64
// non-causal from L2048 by 6.2-13.3%, causal from L4096 by 1.0-11.7% (L2048 0.996); D = 128
// non-causal at L1024, L2048, L8192 and L16384 by 1.8-4.0% (L4096 1.003, inside the margin), causal
// from L1024 by 3.1-9.5%; D = 256 non-causal from L8192 by 4.6-8.1% (L4096 1.001), causal from
// L4096 by 2.4-15.1%. bf16 backward: D = 64 at every point but non-causal L128 (0.975),
// by 1.0-13.4%; D = 128 non-causal to L512 and from L8192, causal at L128, L256, L1024 and from
// L8192, by 1.1-22.3% (non-causal L1024 / L2048 / L4096 0.947 / 0.938 / 0.976, causal L512 / L2048
// / L4096 0.971 / 0.936 / 0.970: cuDNN there, its deterministic algorithm at causal L512); D = 256
// at every point but causal L2048 (0.989), by 1.9-18.2%. f16 forward: D = 64 non-causal from L4096
// (L2048 1.005), causal from L2048; D = 128 from L1024 but non-causal L8192 (0.979); D = 256
// non-causal L16384 (L4096 / L8192 1.008 / 1.010), causal from L4096. f16 backward: D = 64 at every
// point but non-causal L128 / L1024 (0.975 / 0.998); D = 128 non-causal to L512, L4096 and L16384
// (L1024 / L2048 / L8192 0.948 / 0.918 / 1.006), causal at L128, L256, L1024 and from L8192 (L512
// 0.961: cuDNN's deterministic algorithm); D = 256 at every point but causal L2048 (1.005). cuDNN
// at every other measured point, and never without fa3. Varlen problems (no cuDNN) get fa3 wherever
// it runs (it beat the bespoke kernels at every point, both passes, every head dim).
TEST(AttentionCudnnRules, ShippedTablePicksFa3WhereItWasFastest) {
  struct Point {
    int64_t d, l;
    bool causal;
    Candidate forward, backward;
  };
  constexpr Candidate kFa3 = Candidate::fa3, kCudnn = Candidate::cudnn;
  const Point bf16_points[] = {
      {128, 8192, false, kFa3, kFa3},     {128, 8192, true, kFa3, kFa3},
      {128, 16384, true, kFa3, kFa3},     {128, 16384, false, kFa3, kFa3},
      {128, 4096, false, kCudnn, kCudnn}, {128, 4096, true, kFa3, kCudnn},
      {128, 1024, false, kFa3, kCudnn},   {128, 1024, true, kFa3, kFa3},
      {128, 512, true, kCudnn, kCudnn},   {128, 2048, true, kFa3, kCudnn},
      {64, 4096, false, kFa3, kFa3},      {64, 4096, true, kFa3, kFa3},
      {64, 8192, false, kFa3, kFa3},      {64, 8192, true, kFa3, kFa3},
      {64, 16384, false, kFa3, kFa3},     {64, 16384, true, kFa3, kFa3},
      {64, 1024, false, kCudnn, kFa3},    {64, 512, true, kCudnn, kFa3},
      {64, 512, false, kCudnn, kFa3},     {64, 1024, true, kCudnn, kFa3},
      {64, 2048, true, kCudnn, kFa3},     {64, 2048, false, kFa3, kFa3},
      {256, 16384, true, kFa3, kFa3},     {256, 8192, true, kFa3, kFa3},
      {256, 16384, false, kFa3, kFa3},    {256, 8192, false, kFa3, kFa3},
      {256, 4096, false, kCudnn, kFa3},   {256, 4096, true, kFa3, kFa3},
      {256, 512, false, kCudnn, kFa3},    {256, 1024, false, kCudnn, kFa3},
      {256, 512, true, kCudnn, kFa3},     {256, 1024, true, kCudnn, kFa3},
      {256, 2048, false, kCudnn, kFa3},   {256, 2048, true, kCudnn, kCudnn},
      {128, 512, false, kCudnn, kFa3},    {128, 2048, false, kFa3, kCudnn},
  };
  // f16: the forward points the persistent causal forms moved to fa3 and their neighbours; then
  // the points ed6f394's table moved.
  const Point f16_points[] = {
      {64, 1024, true, kCudnn, kFa3},   {64, 2048, true, kFa3, kFa3},
      {64, 4096, true, kFa3, kFa3},     {128, 2048, true, kFa3, kCudnn},
      {256, 8192, false, kCudnn, kFa3}, {256, 2048, true, kCudnn, kCudnn},
  };
  const Point f16_moved[] = {
      {64, 1024, false, kCudnn, kCudnn},  {64, 2048, false, kCudnn, kFa3},
      {128, 512, true, kCudnn, kCudnn},   {128, 1024, true, kFa3, kFa3},
      {128, 8192, false, kCudnn, kCudnn}, {256, 4096, false, kCudnn, kFa3},
  };
  const std::pair<DType, std::span<const Point>> sets[] = {
      {DType::bf16, bf16_points}, {DType::f16, f16_points}, {DType::f16, f16_moved}};
  for (const auto& [type, points] : sets)
    for (const Point& pt : points) {
      const Mask m = pt.causal ? Mask::causal_top_left() : Mask::none();
      const attention::Problem p =
          problem_of(make_desc(type, 16384 / pt.l, 2048 / pt.d, 2048 / pt.d, pt.l, pt.l, pt.d, m));
      SCOPED_TRACE(std::string(name(type)) + " D" + std::to_string(pt.d) + " L" +
                   std::to_string(pt.l) + (pt.causal ? " causal" : ""));
      EXPECT_EQ(preferred_candidate(p, Pass::forward, true), pt.forward);
      EXPECT_EQ(preferred_candidate(p, Pass::forward, false), Candidate::cudnn);
      EXPECT_EQ(preferred_candidate(p, Pass::backward, true), pt.backward);
      EXPECT_EQ(preferred_candidate(p, Pass::backward, false), Candidate::cudnn);
      if (type != DType::bf16) continue;  // decode and varlen below: the bf16 points'
      // Decode against the same keys: the family's decode kernel, but with 256-wide heads
      // (wide_head_decode: fa3 for one token, cuDNN from 2); its backward follows the table's
      // non-causal point (cuDNN at every length).
      for (int64_t lq : {int64_t{1}, int64_t{4}, kDecodeQueryRows}) {
        const attention::Problem decode =
            problem_of(make_desc(DType::bf16, 16, 2048 / pt.d, 2048 / pt.d, lq, pt.l, pt.d));
        EXPECT_EQ(preferred_candidate(decode, Pass::forward, true), pt.d != 256 ? Candidate::bespoke
                                                                    : lq == 1   ? Candidate::fa3
                                                                                : Candidate::cudnn);
        EXPECT_EQ(preferred_candidate(decode, Pass::forward, false), Candidate::bespoke);
        EXPECT_EQ(preferred_candidate(decode, Pass::backward, true), Candidate::cudnn);
      }
      Descriptor packed = make_desc(DType::bf16, 4, 2048 / pt.d, 2048 / pt.d, pt.l, pt.l, pt.d, m);
      packed.varlen = true;
      packed.total_q = packed.total_k = 4 * pt.l;
      for (Pass pass : {Pass::forward, Pass::backward}) {
        EXPECT_EQ(preferred_candidate(problem_of(packed), pass, true), Candidate::fa3);
        EXPECT_EQ(preferred_candidate(problem_of(packed), pass, false), Candidate::bespoke);
      }
    }
  // Chunked prefill (bench_attention's prefill rows: 4 sequences, 32 query heads, GQA 4, d128,
  // bottom-right, Lq new rows against 4096- or 16384-key caches). Padded: fa3's packed instance up
  // to fa3_packed_chunk_rows (fa3_packs; from Lq 8, where the group of 4 fills
  // kFa3PackedDecodeRows of a tile), then the shipped chunk points' pick (H200, cb2572a,
  // TFLOP/s): against 4096 keys fa3 at Lq 256, 512 and 1024 (614.3 / 625.9 / 628.1 against cuDNN's
  // 595.0 / 609.1 / 614.3), cuDNN at 2048 (619.5 against 606.1); against 16384 keys fa3 at 512
  // (681.1 against 656.0) and 2048 (615.4 against 601.5), cuDNN at 4096 (604.5 against 599.1).
  // With key counts (caches of twice the keys, cuDNN takes none): fa3 from Lq 8 on (the packed
  // instance up to its rows, then plain fa3 at 1.6-2.6x the family's kernels at the points), the
  // family's decode kernels below.
  struct ChunkPick {
    int64_t lq, lk;
    Candidate padded;
  };
  const ChunkPick chunks[] = {{kFa3PackedDecodeRows / 4 - 1, 4096, Candidate::bespoke},
                              {kFa3PackedDecodeRows / 4, 4096, Candidate::fa3},
                              {kDecodeQueryRows, 16384, Candidate::fa3},
                              {32, 4096, Candidate::fa3},
                              {128, 4096, Candidate::fa3},
                              {256, 4096, Candidate::fa3},
                              {512, 4096, Candidate::fa3},
                              {1024, 4096, Candidate::fa3},
                              {2048, 4096, Candidate::cudnn},
                              {256, 16384, Candidate::fa3},
                              {512, 16384, Candidate::fa3},
                              {2048, 16384, Candidate::fa3},
                              {4096, 16384, Candidate::cudnn}};
  for (const ChunkPick& c : chunks) {
    SCOPED_TRACE("chunk Lq " + std::to_string(c.lq) + " Lk " + std::to_string(c.lk));
    Descriptor chunk =
        make_desc(DType::bf16, 4, 32, 8, c.lq, c.lk, 128, Mask::causal_bottom_right());
    EXPECT_EQ(preferred_candidate(problem_of(chunk), Pass::forward, true), c.padded);
    chunk.seqused_k = true, chunk.len_k = 2 * c.lk;
    EXPECT_EQ(preferred_candidate(problem_of(chunk), Pass::forward, true),
              4 * c.lq < kFa3PackedDecodeRows ? Candidate::bespoke : Candidate::fa3);
    EXPECT_EQ(preferred_candidate(problem_of(chunk), Pass::forward, false), Candidate::bespoke);
  }
}

TEST(AttentionCudnnRules, TableOverrideIsScopedAndNests) {
  const TablePoint fa3_wins[] = {{DType::bf16, Pass::forward, 128, 4096, false, 1, 1, 2}};
  const attention::Problem p = problem_of(make_desc(DType::bf16, 1, 8, 8, 4096, 4096, 128));
  const Candidate shipped = preferred_candidate(p, Pass::forward, true);
  const size_t shipped_points = selection_table().size();
  {
    const SelectionTableOverride outer{fa3_wins};
    EXPECT_EQ(selection_table().size(), 1u);
    EXPECT_EQ(preferred_candidate(p, Pass::forward, true), Candidate::fa3);
    {
      const SelectionTableOverride inner{std::span<const TablePoint>{}};
      EXPECT_TRUE(selection_table().empty());
      EXPECT_EQ(preferred_candidate(p, Pass::forward, true), Candidate::cudnn);
    }
    EXPECT_EQ(preferred_candidate(p, Pass::forward, true), Candidate::fa3);
  }
  EXPECT_EQ(selection_table().size(), shipped_points);
  EXPECT_EQ(preferred_candidate(p, Pass::forward, true), shipped);
  EXPECT_EQ(to_string(Candidate::fa3), "fa3");
  // A build without CUDA has no fa3 kernel: it never fits there.
  if (!fa3_kernel_registered()) {
    EXPECT_FALSE(fa3_fits(p, DeviceCaps{}));
  }
}

// Per-sequence key counts (seqused_k) and paged K / V (any page size) reach fa3's forward; cuDNN
// takes neither (its padding mask lets a cache's rows past the counts into P V: cudnn_screen).
TEST(AttentionFa3Rules, CountsAndPagesAreFa3s) {
  DeviceCaps h100;
  h100.device = 0, h100.sm = 90, h100.sm_count = 132, h100.smem_per_block_optin = 227 * 1024;
  const Descriptor d =
      make_desc(DType::bf16, 2, 32, 8, 512, 4096, 128, Mask::causal_bottom_right());
  Descriptor counted = d, paged = d;
  counted.seqused_k = true;
  paged.page_size = 64, paged.pages = 200;
  for (const Descriptor& x : {counted, paged}) EXPECT_TRUE(cudnn_screen(problem_of(x)).has_value());
  if (!fa3_fits(problem_of(d), h100, Pass::forward))
    GTEST_SKIP() << "no sm_90a fa3 body in this build: the fa3 half of the rule is not decidable";
  EXPECT_TRUE(fa3_fits(problem_of(counted), h100, Pass::forward));
  EXPECT_TRUE(fa3_fits(problem_of(paged), h100, Pass::forward));
  paged.seqused_k = true;
  EXPECT_TRUE(fa3_fits(problem_of(paged), h100, Pass::forward));
  paged.page_size = 48;  // splits a 128-key tile unevenly: copied as rows
  EXPECT_TRUE(fa3_fits(problem_of(paged), h100, Pass::forward));
  EXPECT_FALSE(fa3_fits(problem_of(paged), h100, Pass::backward));  // paged K / V: forward only
}

// Packed sequences reach cuDNN's ragged forward by name only: at a point whose padded twin ranks
// cuDNN first (d128 L4096 forward), the varlen problem ranks the others, with or without fa3.
TEST(AttentionCudnnRules, PackedSequencesRankCudnnBehind) {
  const Descriptor padded = make_desc(DType::bf16, 4, 16, 16, 4096, 4096, 128, Mask::none());
  ASSERT_EQ(preferred_candidate(problem_of(padded), Pass::forward, false), Candidate::cudnn);
  Descriptor packed = padded;
  packed.varlen = true, packed.total_q = packed.total_k = 4 * 4096;
  EXPECT_FALSE(cudnn_screen(problem_of(packed)).has_value());
  for (const bool fa3 : {true, false})
    for (const Pass pass : {Pass::forward, Pass::backward})
      EXPECT_NE(preferred_candidate(problem_of(packed), pass, fa3), Candidate::cudnn)
          << fa3 << " " << static_cast<int>(pass);
}

// ---- Registry -----------------------------------------------------------------------------------
TEST(AttentionCudnnRegistry, KernelsRegisteredWithTruthfulPrecision) {
#if BARACUDA_HAVE_CUDNN_FRONTEND
  int fwd = 0, bwd = 0, bwd_det = 0;
  for (const auto& k : registered_kernels()) {
    if (k.sku.backend != Backend::cudnn) continue;
    EXPECT_TRUE(k.sku.element == DType::bf16 || k.sku.element == DType::f16);
    EXPECT_EQ(k.sku.precision.accumulator, DType::f32);
    EXPECT_FALSE(k.sku.precision.bit_stable);
    if (k.family == "attention_forward") {
      ++fwd;
      EXPECT_TRUE(k.sku.precision.deterministic) << k.sku.name;
    } else if (k.family == "attention_backward") {
      const bool det = k.sku.name.find("deterministic") != std::string_view::npos;
      EXPECT_EQ(k.sku.precision.deterministic, det) << k.sku.name;
      ++(det ? bwd_det : bwd);
    }
  }
  EXPECT_EQ(fwd, 4);  // {bf16, f16} x {ranked ahead, behind}
  EXPECT_EQ(bwd, 4);
  EXPECT_EQ(bwd_det, 6);  // {bf16, f16} x {ranked ahead, the default, behind}
  // The deterministic algorithm as the default (kCudnnBwdDeterministicPicks): above fa3's entries,
  // its deterministic default included, and cuDNN's non-deterministic one.
  for (DType t : {DType::bf16, DType::f16}) {
    const auto* def =
        KernelTable<attention::BackwardOp>::instance().find(kCudnnBwdDeterministicDefault, t);
    ASSERT_TRUE(def);
    EXPECT_TRUE(def->sku.precision.deterministic);
    EXPECT_EQ(def->priority, kCudnnDetDefaultAhead);
    EXPECT_GT(def->priority, kFa3DetDefaultAhead);
    EXPECT_GT(def->priority, kFa3Ahead);
    EXPECT_GT(def->priority, kCudnnAhead);
  }
#else
  GTEST_SKIP() << "built without the cuDNN frontend (BARACUDA_HAVE_CUDNN_FRONTEND unset)";
#endif
}

TEST(AttentionCudnnRegistry, CpuStreamNeverGetsCudnn) {
  const auto r =
      attention::ForwardPlan::select(Stream::cpu(), make_desc(DType::bf16, 1, 4, 4, 16, 16, 64),
                                     PlanPreference::only(Backend::cudnn));
  EXPECT_TRUE(
      fails_with(r, ErrorKind::unsupported,
                 {"attention_forward: no kernel for element=bf16", "preference=backend=cudnn"}));
}

// ---- GPU: every cuDNN kernel against the float64 reference ------------------------------------
struct Case {
  DType t;
  int64_t b, hq, hk, lq, lk, d;
  Mask mask;
  bool blhd;             // memory order [B, L, H, D] instead of [B, H, L, D]
  bool padded;           // row pitch D + 8 and a 16-byte base offset: gap bytes must stay untouched
  bool must_fit = true;  // false: cuDNN may refuse it (then the plan must fall back, see below)
  double softcap = 0;    // > 0: logit soft-capping
  int64_t dv = 0;        // V / Y head dim when it differs from Q / K's (0: the same)
  double scale = 0;      // > 0: the descriptor's scale (0: its default, 1 / sqrt(Dk))
};
int64_t vdim(const Case& c) {
  return c.dv > 0 ? c.dv : c.d;
}

// The case's descriptor in element type t (the reference runs it in f64).
Descriptor desc_of(const Case& c, DType t) {
  Descriptor d = make_desc(t, c.b, c.hq, c.hk, c.lq, c.lk, c.d, c.mask);
  d.softcap = c.softcap;
  d.head_dim_v = vdim(c);
  if (c.scale > 0) d.scale = c.scale;
  return d;
}

std::vector<Case> gpu_cases() {
  return {
      {DType::bf16, 2, 4, 4, 128, 128, 64, Mask::none(), false, false},
      {DType::bf16, 1, 8, 2, 197, 197, 128, Mask::causal_top_left(), true, false},
      {DType::f16, 2, 4, 1, 77, 203, 64, Mask::causal_bottom_right(), false, true},
      {DType::bf16, 1, 4, 2, 256, 256, 128, Mask::sliding_window(64, 0), false, false},
      {DType::f16, 1, 2, 2, 33, 100, 128, Mask::causal_top_left(), true, true},
      // A window with a non-zero right bound: cuDNN's support for it varies by version.
      {DType::bf16, 1, 4, 4, 130, 130, 64, Mask::sliding_window(16, 8, Diagonal::top_left), false,
       true, false},
  };
}

std::string name_of(const Case& c) {
  return std::string(name(c.t)) + " B" + std::to_string(c.b) + " Hq" + std::to_string(c.hq) +
         " Hk" + std::to_string(c.hk) + " Lq" + std::to_string(c.lq) + " Lk" +
         std::to_string(c.lk) + " D" + std::to_string(c.d) + " " + attention::to_string(c.mask) +
         (c.blhd ? " BLHD" : " BHLD") + (c.padded ? " padded" : "") +
         (c.softcap > 0 ? " cap" + std::to_string(c.softcap) : "") +
         (c.dv > 0 ? " Dv" + std::to_string(c.dv) : "") +
         (c.scale > 0 ? " scale" + std::to_string(c.scale) : "");
}

// A [B, H, L, D] tensor on the GPU in the case's memory order; padded: 16 more bytes per row and
// a 16-byte base offset (8 elements of a 16-bit type, 16 of fp8).
TestTensor gpu_tensor(const Case& c, DType t, int64_t h, int64_t l, int64_t d) {
  const int64_t pad = c.padded ? 128 / bits_of(t) : 0;
  const int64_t pitch = d + pad;
  std::vector<int64_t> st = c.blhd ? std::vector<int64_t>{l * h * pitch, pitch, h * pitch, 1}
                                   : std::vector<int64_t>{h * l * pitch, l * pitch, pitch, 1};
  return TestTensor::with_strides(t, {c.b, h, l, d}, st, pad, Target::cuda);
}
TestTensor gpu_lse(const Case& c) {
  const int64_t pitch = c.lq + (c.padded ? 4 : 0);
  return TestTensor::with_strides(DType::f32, {c.b, c.hq, c.lq}, {c.hq * pitch, pitch, 1},
                                  c.padded ? 4 : 0, Target::cuda);
}
TestTensor cpu_tensor(DType t, std::vector<int64_t> shape, harness::Rng* rng) {
  TestTensor x = TestTensor::make(t, std::move(shape), Target::cpu);
  if (rng) x.fill_random(*rng);
  return x;
}
TestTensor upload(const Case& c, const TestTensor& host, int64_t h, int64_t l, int64_t d) {
  TestTensor g = gpu_tensor(c, host.dtype(), h, l, d);
  g.set_values(host.values());
  return g;
}

struct Workspace_ {
  Buffer buf;
  Workspace get() const { return buf.as_workspace(); }
};
Workspace_ workspace_of(size_t bytes) {
  auto b = harness::poisoned_workspace(std::max<size_t>(bytes, 16), Location::cuda(0));
  EXPECT_TRUE(b.ok());
  return {std::move(b).value()};
}

// ---- The float64 oracle, bounded ----------------------------------------------------------------
// The float64 reference costs (Dk + Dv) multiply-adds per visible (query row, key) pair, through
// per-element dtype loads, on one core: ~25-50 M per second on 16-bit inputs (the first device run
// spent 178 s in fa3's small-shape test and never finished the 4096-row one). So the oracle
// (1) runs on float64 copies of the inputs (same values; ~5x cheaper loads, measured by
// AttentionHopperOracle), (2) one task per block of rows on every core (rows are independent and
// write disjoint outputs), and (3) past kFullCheckOps per case, only on sampled rows: every
// element of the first, the last and a random (batch, head) slice, or of three row blocks of each
// (head, tail and one straddling a 128-row CTA boundary) where a slice alone passes 3 x kBlockOps,
// plus whole-tensor checks that cost nothing next to it (check_forward_output). Small shapes keep
// the exhaustive comparison. A sampled case is at most 9 blocks of ~kBlockOps side by side.
constexpr double kFullCheckOps = 5e7;
constexpr double kBlockOps = 2e7;

// Query rows [i0, i1) of query head h of batch b.
// Upper bound of the reference's multiply-adds for the whole forward (masks ignored).
double forward_ops(const Case& c) {
  return static_cast<double>(c.b * c.hq) * static_cast<double>(c.lq) * static_cast<double>(c.lk) *
         static_cast<double>(2 * c.d);
}
bool exhaustive(const Case& c) {
  return forward_ops(c) <= kFullCheckOps;
}

std::vector<RowBlock> every_row(const Case& c) {
  std::vector<RowBlock> out;
  for (int64_t b = 0; b < c.b; ++b)
    for (int64_t h = 0; h < c.hq; ++h) out.push_back({b, h, 0, c.lq});
  return out;
}

std::vector<RowBlock> sampled_rows(const Case& c, harness::Rng& rng, double block_ops = kBlockOps) {
  std::vector<std::pair<int64_t, int64_t>> slices = {
      {0, 0}, {c.b - 1, c.hq - 1}, {rng.integer(0, c.b - 1), rng.integer(0, c.hq - 1)}};
  std::sort(slices.begin(), slices.end());
  slices.erase(std::unique(slices.begin(), slices.end()), slices.end());
  const double row_ops = static_cast<double>(c.lk) * static_cast<double>(2 * c.d);
  const int64_t n = std::max<int64_t>(8, static_cast<int64_t>(block_ops / row_ops));
  std::vector<RowBlock> out;
  for (auto [b, h] : slices) {
    if (3 * n >= c.lq) {
      out.push_back({b, h, 0, c.lq});
      continue;
    }
    // A middle block across a random 128-row CTA boundary (the kernel's M tile), disjoint from
    // the head and tail blocks.
    const int64_t edge = 128 * rng.integer(1, std::max<int64_t>(1, (c.lq - 1) / 128));
    const int64_t mid = std::clamp<int64_t>(edge - n / 2, n, c.lq - 2 * n);
    out.push_back({b, h, 0, n});
    out.push_back({b, h, mid, mid + n});
    out.push_back({b, h, c.lq - n, c.lq});
  }
  return out;
}

// Y ([B, Hq, Lq, D], logical order) and LSE ([B, Hq, Lq]) of the float64 reference at the blocks'
// rows (zero elsewhere), from the inputs' logical values.
struct Reference {
  std::vector<double> y, lse;
};
Reference reference_rows(const Case& c, const std::vector<double>& q, const std::vector<double>& k,
                         const std::vector<double>& v, const std::vector<RowBlock>& blocks) {
  const attention::Problem p = problem_of(desc_of(c, DType::f64));
  Reference r{std::vector<double>(static_cast<size_t>(c.b * c.hq * c.lq * vdim(c))),
              std::vector<double>(static_cast<size_t>(c.b * c.hq * c.lq))};
  const int64_t qs[] = {c.b, c.hq, c.lq, c.d}, ks[] = {c.b, c.hk, c.lk, c.d},
                vs[] = {c.b, c.hk, c.lk, vdim(c)}, ys[] = {c.b, c.hq, c.lq, vdim(c)},
                ls[] = {c.b, c.hq, c.lq};
  const attention::ForwardArguments a{
      make_tensor(static_cast<const void*>(q.data()), DType::f64, std::span<const int64_t>(qs)),
      make_tensor(static_cast<const void*>(k.data()), DType::f64, std::span<const int64_t>(ks)),
      make_tensor(static_cast<const void*>(v.data()), DType::f64, std::span<const int64_t>(vs)),
      make_tensor(static_cast<void*>(r.y.data()), DType::f64, std::span<const int64_t>(ys)),
      make_tensor(static_cast<void*>(r.lse.data()), DType::f64, std::span<const int64_t>(ls)),
      {},
      {}};
  std::vector<Status> st(blocks.size());
  parallel_for(static_cast<int64_t>(blocks.size()), [&](int64_t j) {
    const RowBlock& bk = blocks[j];
    st[j] = attention::detail::reference_forward_rows(p, a, bk.b, bk.h, bk.i0, bk.i1);
  });
  for (const Status& x : st) EXPECT_TRUE(x.ok()) << x.error().to_string();
  return r;
}

// The bound a 16-bit forward's LSE is held to, by the kernel that wrote it: f32's reduction bound
// plus the kernel's documented slack (attention::testing::lse_slack: fa3's exp2-offload polynomial
// and soft-capping tanh), except cuDNN's, held to the input type's bound (its LSE was never
// measured against f32's).
struct LseBound {
  DType type;
  double slack;
};
template <class AnyCase>  // Case or VarlenCase
LseBound lse_bound(const AnyCase& c, std::string_view kernel) {
  if (kernel.starts_with("cudnn")) return {c.t, 0.0};
  return {DType::f32, attention::testing::lse_slack(kernel, c.softcap)};
}

// A device forward's Y / LSE (logical order) against the reference at the blocks' rows and the
// whole-tensor checks (attention::testing::expect_forward_outputs); kernel: the one that wrote
// them (lse_bound).
void check_forward_output(const Case& c, const std::vector<double>& v, const std::vector<double>& y,
                          const std::vector<double>& lse, const Reference& ref,
                          const std::vector<RowBlock>& blocks, std::string_view kernel) {
  double vmax = 0;
  for (double x : v) vmax = std::max(vmax, std::abs(x));
  const LseBound lb = lse_bound(c, kernel);
  attention::testing::expect_forward_outputs({c.b, c.hq, c.lq, c.lk, vdim(c), c.mask}, c.t, lb.type,
                                             ref.y, ref.lse, vmax, y, lse, blocks, false, lb.slack);
}

// dQ, dK, dV (logical order) of the float64 reference backward on float64 copies of its inputs
// (cheaper loads than the 16-bit ones; the values are the same).
struct Grads {
  std::vector<double> dq, dk, dv;
};
Grads reference_backward(const Case& c, const std::vector<double>& q, const std::vector<double>& k,
                         const std::vector<double>& v, const std::vector<double>& y,
                         const std::vector<double>& dy, const std::vector<double>& lse) {
  const Descriptor desc = desc_of(c, DType::f64);
  Grads g{std::vector<double>(q.size()), std::vector<double>(k.size()),
          std::vector<double>(v.size())};
  const int64_t qs[] = {c.b, c.hq, c.lq, c.d}, ks[] = {c.b, c.hk, c.lk, c.d},
                ls[] = {c.b, c.hq, c.lq};
  auto in = [](const std::vector<double>& x, const int64_t* shape, int rank) {
    return make_tensor(static_cast<const void*>(x.data()), DType::f64,
                       std::span<const int64_t>(shape, static_cast<size_t>(rank)));
  };
  auto out = [](std::vector<double>& x, const int64_t* shape) {
    return make_tensor(static_cast<void*>(x.data()), DType::f64,
                       std::span<const int64_t>(shape, 4));
  };
  auto plan = attention::BackwardPlan::select(Stream::cpu(), desc, PlanPreference::reference());
  EXPECT_TRUE(plan.ok()) << plan.error().to_string();
  if (!plan.ok()) return g;
  const Status st = plan->run(Stream::cpu(), Workspace::none(),
                              {in(q, qs, 4),
                               in(k, ks, 4),
                               in(v, ks, 4),
                               in(y, qs, 4),
                               in(dy, qs, 4),
                               in(lse, ls, 3),
                               out(g.dq, qs),
                               out(g.dk, ks),
                               out(g.dv, ks),
                               {},
                               {}});
  EXPECT_TRUE(st.ok()) << st.error().to_string();
  return g;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The cuDNN kernels of `Op` for the element type that fit the problem on this device.
template <class Op>
std::vector<const Kernel<Op>*> cudnn_kernels(const attention::Problem& p) {
  std::vector<const Kernel<Op>*> out;
  const DeviceCaps& caps = harness::stream_for(Target::cuda).caps();
  for (const auto& k : KernelTable<Op>::instance().all())
    if (k.sku.backend == Backend::cudnn && k.sku.element == p.desc.dtype &&
        (!k.fits || k.fits(p, caps)))
      out.push_back(&k);
  return out;
}

// One case's host inputs, the float64 reference forward on every row, and the reference backward
// from that forward's Y and LSE rounded to what a GPU backward reads (Y in the 16-bit type, LSE in
// f32). Every case that uses it is small (exhaustive): the forward reference runs on every row, in
// parallel.
struct CaseData {
  TestTensor q, k, v, dy;
  std::vector<RowBlock> rows;
  Reference fwd;
  TestTensor y_ref, lse_ref;
  Grads grad;
};
CaseData case_data(const Case& c, harness::Rng& rng) {
  const auto t0 = std::chrono::steady_clock::now();
  CaseData x{cpu_tensor(c.t, {c.b, c.hq, c.lq, c.d}, &rng),
             cpu_tensor(c.t, {c.b, c.hk, c.lk, c.d}, &rng),
             cpu_tensor(c.t, {c.b, c.hk, c.lk, c.d}, &rng),
             cpu_tensor(c.t, {c.b, c.hq, c.lq, c.d}, &rng),
             every_row(c),
             {},
             cpu_tensor(c.t, {c.b, c.hq, c.lq, c.d}, nullptr),
             cpu_tensor(DType::f32, {c.b, c.hq, c.lq}, nullptr),
             {}};
  const std::vector<double> qv = x.q.values(), kv = x.k.values(), vv = x.v.values();
  x.fwd = reference_rows(c, qv, kv, vv, x.rows);
  x.y_ref.set_values(x.fwd.y);
  x.lse_ref.set_values(x.fwd.lse);
  x.grad = reference_backward(c, qv, kv, vv, x.y_ref.values(), x.dy.values(), x.lse_ref.values());
  std::printf("[ reference ] %s: %.2f s\n", name_of(c).c_str(), seconds_since(t0));
  return x;
}

// The backward's inputs on the GPU in the case's layout.
struct GpuBackwardInputs {
  TestTensor q, k, v, dy, y, lse;
  // The backward's arguments over these inputs into dq / dk / dv (the LSE from `lse_from`: views of
  // another row pitch share the aligned run's LSE, a dense [B, H, L] tensor either way).
  attention::BackwardArguments args(TestTensor& dq, TestTensor& dk, TestTensor& dv,
                                    const TestTensor* lse_from = nullptr) const {
    return {q.cview(), k.cview(),  v.cview(),
            y.cview(), dy.cview(), (lse_from ? *lse_from : lse).cview(),
            dq.view(), dk.view(),  dv.view(),
            {},        {}};
  }
};
GpuBackwardInputs upload_backward(const Case& c, const CaseData& x) {
  GpuBackwardInputs g{upload(c, x.q, c.hq, c.lq, c.d),     upload(c, x.k, c.hk, c.lk, c.d),
                      upload(c, x.v, c.hk, c.lk, c.d),     upload(c, x.dy, c.hq, c.lq, c.d),
                      upload(c, x.y_ref, c.hq, c.lq, c.d), gpu_lse(c)};
  g.lse.set_values(x.lse_ref.values());
  return g;
}

// One backward kernel run twice into poisoned dQ / dK / dV: every element against the reference
// each time, bytes outside the outputs untouched, and both runs bitwise equal where the kernel
// claims determinism.
void check_backward_kernel(const Case& c, const attention::Problem& p,
                           const Kernel<attention::BackwardOp>& kern, const Grads& ref,
                           const GpuBackwardInputs& in, int reps = 2) {
  SCOPED_TRACE(std::string(kern.sku.name));
  const Stream& gs = harness::stream_for(Target::cuda);
  TestTensor gdq = gpu_tensor(c, c.t, c.hq, c.lq, c.d), gdk = gpu_tensor(c, c.t, c.hk, c.lk, c.d),
             gdv = gpu_tensor(c, c.t, c.hk, c.lk, c.d);
  const Workspace_ ws = workspace_of(kern.workspace ? kern.workspace(p, gs.caps()) : 0);
  const attention::BackwardArguments args = in.args(gdq, gdk, gdv);
  BARACUDA_ASSERT_OK(attention::BackwardOp::check_arguments(p, args, gs.memory_location()));
  if (kern.check) BARACUDA_ASSERT_OK(kern.check(p, args));  // what Plan::run applies first
  std::vector<std::vector<uint8_t>> runs;
  for (int rep = 0; rep < reps; ++rep) {
    for (TestTensor* t : {&gdq, &gdk, &gdv}) t->poison();
    const auto q_before = gdq.bytes(), k_before = gdk.bytes(), v_before = gdv.bytes();
    BARACUDA_ASSERT_OK(kern.launch(LaunchContext{gs, ws.get()}, p, args));
    BARACUDA_ASSERT_OK(gs.synchronize());
    EXPECT_TRUE(harness::close_to(gdq.values(), ref.dq, c.t, Accuracy::reduction, "dq"));
    EXPECT_TRUE(harness::close_to(gdk.values(), ref.dk, c.t, Accuracy::reduction, "dk"));
    EXPECT_TRUE(harness::close_to(gdv.values(), ref.dv, c.t, Accuracy::reduction, "dv"));
    EXPECT_TRUE(harness::untouched_outside(q_before, gdq.bytes(), gdq.bit_mask(), "dq"));
    EXPECT_TRUE(harness::untouched_outside(k_before, gdk.bytes(), gdk.bit_mask(), "dk"));
    EXPECT_TRUE(harness::untouched_outside(v_before, gdv.bytes(), gdv.bit_mask(), "dv"));
    for (TestTensor* t : {&gdq, &gdk, &gdv}) runs.push_back(t->bytes());
  }
  if (kern.sku.precision.deterministic) {
    for (size_t i = 3; i < runs.size(); ++i)
      EXPECT_TRUE(harness::bytes_equal(runs[i % 3], runs[i], "backward run 1 vs a later run"));
  }
}

// One case: inputs and the float64 references, then every cuDNN kernel that fits, each run twice.
// A helper so that an ASSERT ends only this case.
void check_case(const Case& c, harness::Rng& rng) {
  const Stream& gs = harness::stream_for(Target::cuda);
  const Descriptor desc = desc_of(c, c.t);
  const attention::Problem p = problem_of(desc);
  const CaseData x = case_data(c, rng);
  const std::vector<double> vv = x.v.values();
  const GpuBackwardInputs in = upload_backward(c, x);

  // The plan forced to cuDNN selects a cuDNN kernel and runs.
  auto plan = attention::ForwardPlan::select(gs, desc, PlanPreference::only(Backend::cudnn));
  if (!c.must_fit && !plan.ok()) {
    // cuDNN refused the problem at select: that must read as unsupported, and the default plan
    // must still exist on another backend.
    EXPECT_TRUE(fails_with(plan, ErrorKind::unsupported, {"preference=backend=cudnn"}));
    auto fallback = attention::ForwardPlan::select(gs, desc);
    BARACUDA_ASSERT_OK(fallback);
    EXPECT_NE(fallback->sku().backend, Backend::cudnn);
    std::printf("[ cuDNN refused ] %s: the default plan runs %s\n", name_of(c).c_str(),
                std::string(fallback->sku().name).c_str());
    return;
  }
  BARACUDA_ASSERT_OK(plan);
  EXPECT_EQ(plan->sku().backend, Backend::cudnn);

  // Every cuDNN forward kernel that fits (exactly one of the two rankings does).
  const auto fwd_kernels = cudnn_kernels<attention::ForwardOp>(p);
  ASSERT_EQ(fwd_kernels.size(), 1u);
  for (const auto* kern : fwd_kernels) {
    SCOPED_TRACE(std::string(kern->sku.name));
    TestTensor gy = gpu_tensor(c, c.t, c.hq, c.lq, c.d);
    TestTensor glse = gpu_lse(c);
    const Workspace_ ws = workspace_of(kern->workspace ? kern->workspace(p, gs.caps()) : 0);
    const attention::ForwardArguments args{
        in.q.cview(), in.k.cview(), in.v.cview(), gy.view(), glse.view(), {}, {}};
    BARACUDA_ASSERT_OK(attention::ForwardOp::check_arguments(p, args, gs.memory_location()));
    if (kern->check) BARACUDA_ASSERT_OK(kern->check(p, args));  // what Plan::run applies first
    std::vector<std::vector<uint8_t>> bytes;
    for (int rep = 0; rep < 2; ++rep) {
      gy.poison();
      glse.poison();
      const auto y_before = gy.bytes(), lse_before = glse.bytes();
      BARACUDA_ASSERT_OK(kern->launch(LaunchContext{gs, ws.get()}, p, args));
      BARACUDA_ASSERT_OK(gs.synchronize());
      check_forward_output(c, vv, gy.values(), glse.values(), x.fwd, x.rows, kern->sku.name);
      EXPECT_TRUE(harness::untouched_outside(y_before, gy.bytes(), gy.bit_mask(), "y"));
      EXPECT_TRUE(harness::untouched_outside(lse_before, glse.bytes(), glse.bit_mask(), "lse"));
      bytes.push_back(gy.bytes());
      bytes.push_back(glse.bytes());
    }
    ASSERT_TRUE(kern->sku.precision.deterministic);
    EXPECT_TRUE(harness::bytes_equal(bytes[0], bytes[2], "y run 1 vs run 2"));
    EXPECT_TRUE(harness::bytes_equal(bytes[1], bytes[3], "lse run 1 vs run 2"));
  }

  // Every cuDNN backward kernel that fits: the default one and (where cuDNN offers it) the
  // deterministic one.
  const auto bwd_kernels = cudnn_kernels<attention::BackwardOp>(p);
  ASSERT_GE(bwd_kernels.size(), 1u);
  for (const auto* kern : bwd_kernels) check_backward_kernel(c, p, *kern, x.grad, in);
}

TEST(AttentionCudnnGpu, ForwardAndBackwardMatchReference) {
  BARACUDA_SKIP_IF_UNAVAILABLE(Target::cuda);
#if !BARACUDA_HAVE_CUDNN_FRONTEND
  GTEST_SKIP() << "built without the cuDNN frontend (BARACUDA_HAVE_CUDNN_FRONTEND unset)";
#endif
  harness::Rng rng;
  for (const Case& c : gpu_cases()) {
    SCOPED_TRACE(name_of(c));
    check_case(c, rng);
  }
}

TEST(AttentionCudnnGpu, TunedConfigurationsMatchReference) {
  BARACUDA_SKIP_IF_UNAVAILABLE(Target::cuda);
#if !BARACUDA_HAVE_CUDNN_FRONTEND
  GTEST_SKIP() << "built without the cuDNN frontend (BARACUDA_HAVE_CUDNN_FRONTEND unset)";
#endif
  // Small shapes, so that the exhaustive reference checks them.
  const CudnnTuningScope any(CudnnTuningMode::any_size);
  harness::Rng rng;
  const int device = harness::stream_for(Target::cuda).device();
  // Shapes no other test uses: graphs are cached per shape, and an untuned one would be reused.
  // The first is [B, L, H, D]: its runs build a graph of their own on the tuned configuration.
  const Case cases[] = {
      {DType::bf16, 2, 4, 2, 192, 192, 64, Mask::causal_top_left(), true, false},
      {DType::f16, 1, 4, 4, 160, 160, 128, Mask::none(), false, false},
  };
  int timed = 0;
  for (const Case& c : cases) {
    SCOPED_TRACE(name_of(c));
    const attention::Problem p = problem_of(desc_of(c, c.t));
    ASSERT_TRUE(cudnn_tunes(p));
    check_case(c, rng);  // every cuDNN kernel that fits, twice, against the float64 reference
    for (const auto& [pass, det] :
         {std::pair{Pass::forward, false}, {Pass::backward, false}, {Pass::backward, true}}) {
      const auto t = cudnn_tuning(p, pass, det, device);
      ASSERT_TRUE(t.has_value()) << (pass == Pass::forward ? "forward" : "backward");
      EXPECT_FALSE(t->plan.empty());
      timed += t->timed;
      std::printf("[ cuDNN tuning ] %s %s%s: %d configurations timed, runs %s\n",
                  name_of(c).c_str(), pass == Pass::forward ? "forward" : "backward",
                  det ? " (deterministic)" : "", t->timed, t->plan.c_str());
    }
  }
  // cuDNN offered more than one configuration somewhere (it did for every graph of the sweep's
  // short points), so something was timed.
  EXPECT_GE(timed, 2);
}

TEST(AttentionCudnnGpu, DeterministicBackwardIsOfferedAndPreferred) {
  BARACUDA_SKIP_IF_UNAVAILABLE(Target::cuda);
#if !BARACUDA_HAVE_CUDNN_FRONTEND
  GTEST_SKIP() << "built without the cuDNN frontend (BARACUDA_HAVE_CUDNN_FRONTEND unset)";
#endif
  // A plain Hopper-sized problem: cuDNN's deterministic algorithm must be available for it, and
  // PlanPreference::deterministic() must never hand out a non-deterministic kernel.
  const Descriptor desc = make_desc(DType::bf16, 1, 4, 4, 256, 256, 128, Mask::causal_top_left());
  const attention::Problem p = problem_of(desc);
  bool det_found = false;
  for (const auto* k : cudnn_kernels<attention::BackwardOp>(p))
    det_found |= k->sku.precision.deterministic;
  EXPECT_TRUE(det_found) << "cuDNN offers no deterministic backward for " << to_string(desc.mask);
  auto plan = attention::BackwardPlan::select(harness::stream_for(Target::cuda), desc,
                                              PlanPreference::deterministic());
  BARACUDA_ASSERT_OK(plan);
  EXPECT_TRUE(plan->precision_guarantee().deterministic) << to_string(plan->sku());
}

TEST(AttentionCudnnGpu, SelectionFollowsTheMeasuredTable) {
  BARACUDA_SKIP_IF_UNAVAILABLE(Target::cuda);
#if !BARACUDA_HAVE_CUDNN_FRONTEND
  GTEST_SKIP() << "built without the cuDNN frontend (BARACUDA_HAVE_CUDNN_FRONTEND unset)";
#endif
  const Stream& gs = harness::stream_for(Target::cuda);
  for (int64_t d : {64, 128})
    for (int64_t l : {512, 4096})
      for (Mask m : {Mask::none(), Mask::causal_top_left()}) {
        const Descriptor desc = make_desc(DType::bf16, 16384 / l, 2048 / d, 2048 / d, l, l, d, m);
        const attention::Problem p = problem_of(desc);
        auto fwd = attention::ForwardPlan::select(gs, desc);
        BARACUDA_ASSERT_OK(fwd);
        auto bwd = attention::BackwardPlan::select(gs, desc);
        BARACUDA_ASSERT_OK(bwd);
        SCOPED_TRACE("D" + std::to_string(d) + " L" + std::to_string(l) + " " + to_string(m));
        // Where the table prefers cuDNN it must win; where it prefers fa3 (and fa3 fits here),
        // fa3's ranked-ahead entry must; where it prefers the bespoke kernel, cuDNN only runs if
        // no bespoke kernel fits (its entry is ranked behind them).
        auto check = [&](Backend got, Pass pass, const std::string& sku) {
          const Candidate want = preferred_candidate(p, pass, fa3_fits(p, gs.caps(), pass));
          if (pass == Pass::backward && want != Candidate::bespoke &&
              fa3_bwd_deterministic_default(p)) {
            EXPECT_EQ(sku, kFa3BwdDeterministicAhead);  // kFa3BwdDeterministicPicks' point
          } else if (pass == Pass::backward && want != Candidate::bespoke &&
                     cudnn_bwd_deterministic_default(p)) {
            EXPECT_EQ(sku, kCudnnBwdDeterministicDefault);  // kCudnnBwdDeterministicPicks' point
          } else if (want == Candidate::cudnn) {
            EXPECT_EQ(got, Backend::cudnn) << sku;
          } else if (want == Candidate::fa3) {
            EXPECT_EQ(sku, pass == Pass::forward ? kFa3RankedAhead : kFa3BwdRankedAhead);
          } else {
            EXPECT_TRUE((got == Backend::bespoke_cuda && sku.find("fa3_") == std::string::npos) ||
                        sku.find("ranked_behind") != std::string::npos)
                << sku;
          }
        };
        check(fwd->sku().backend, Pass::forward, std::string(fwd->sku().name));
        check(bwd->sku().backend, Pass::backward, std::string(bwd->sku().name));
      }
}

// A run whose `misaligned` operand (0: q, 1: k) starts one element into its buffer (valid for the
// family's rules) fails with `messages`, writes nothing and leaves the stream healthy.
void expect_misaligned_run_fails(PlanPreference pref, int misaligned,
                                 std::initializer_list<std::string_view> messages) {
  harness::Rng rng;
  const Stream& gs = harness::stream_for(Target::cuda);
  const Case c{DType::bf16, 1, 2, 2, 64, 64, 64, Mask::none(), false, false};
  const Descriptor desc = make_desc(c.t, c.b, c.hq, c.hk, c.lq, c.lk, c.d);
  auto plan = attention::ForwardPlan::select(gs, desc, pref);
  BARACUDA_ASSERT_OK(plan);
  TestTensor off =
      TestTensor::with_strides(c.t, {1, 2, 64, 64}, {8192, 4096, 64, 1}, 1, Target::cuda);
  TestTensor a = gpu_tensor(c, c.t, 2, 64, 64), v = gpu_tensor(c, c.t, 2, 64, 64);
  off.fill_random(rng);
  a.fill_random(rng);
  v.fill_random(rng);
  TestTensor y = gpu_tensor(c, c.t, 2, 64, 64);
  TestTensor lse = gpu_lse(c);
  y.poison();
  lse.poison();
  const auto y_before = y.bytes(), lse_before = lse.bytes();
  const Workspace_ ws = workspace_of(plan->workspace_size());
  const ConstTensor q = misaligned == 0 ? off.cview() : a.cview();
  const ConstTensor k = misaligned == 0 ? a.cview() : off.cview();
  const attention::ForwardArguments args{q, k, v.cview(), y.view(), lse.view(), {}, {}};
  // The kernel's rule is the plan's (Kernel::check): refused before anything is enqueued.
  EXPECT_TRUE(fails_with(plan->can_implement(args), ErrorKind::misaligned_operand, messages));
  EXPECT_TRUE(fails_with(plan->run(gs, ws.get(), args), ErrorKind::misaligned_operand, messages));
  BARACUDA_ASSERT_OK(gs.synchronize());
  EXPECT_TRUE(harness::bytes_equal(y_before, y.bytes(), "y"));
  EXPECT_TRUE(harness::bytes_equal(lse_before, lse.bytes(), "lse"));
}

TEST(AttentionCudnnGpu, MisalignedRunFailsWithoutWriting) {
  BARACUDA_SKIP_IF_UNAVAILABLE(Target::cuda);
#if !BARACUDA_HAVE_CUDNN_FRONTEND
  GTEST_SKIP() << "built without the cuDNN frontend (BARACUDA_HAVE_CUDNN_FRONTEND unset)";
#endif
  // Q one element into its buffer: still valid for the family's rules, misaligned for cuDNN.
  expect_misaligned_run_fails(PlanPreference::only(Backend::cudnn), 0,
                              {"attention_forward: q: data=", "is not 16-byte aligned"});
}

// ---- The bounded oracle itself (host only) -----------------------------------------------------
// The sampled oracle (float64 copies, row blocks in parallel) gives what the whole reference gives
// on the 16-bit inputs at those rows, and its blocks are disjoint, in range and within budget.
TEST(AttentionHopperOracle, SampledRowsMatchTheWholeReference) {
  harness::Rng rng;
  const Case cases[] = {
      {DType::bf16, 2, 2, 1, 400, 150, 64, Mask::causal_bottom_right(), false, false},
      {DType::f16, 1, 1, 1, 500, 400, 128, Mask::causal_top_left(), false, false},
      {DType::bf16, 1, 1, 1, 520, 300, 128, Mask::none(), false, false},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(name_of(c));
    const auto t0 = std::chrono::steady_clock::now();
    TestTensor q = cpu_tensor(c.t, {c.b, c.hq, c.lq, c.d}, &rng);
    TestTensor k = cpu_tensor(c.t, {c.b, c.hk, c.lk, c.d}, &rng);
    TestTensor v = cpu_tensor(c.t, {c.b, c.hk, c.lk, c.d}, &rng);
    TestTensor y = cpu_tensor(c.t, {c.b, c.hq, c.lq, c.d}, nullptr);
    TestTensor lse = cpu_tensor(DType::f32, {c.b, c.hq, c.lq}, nullptr);
    const Descriptor desc = desc_of(c, c.t);
    auto ref = attention::ForwardPlan::select(Stream::cpu(), desc, PlanPreference::reference());
    BARACUDA_ASSERT_OK(ref);
    BARACUDA_ASSERT_OK(ref->run(Stream::cpu(), Workspace::none(),
                                {q.cview(), k.cview(), v.cview(), y.view(), lse.view(), {}, {}}));
    const double whole = seconds_since(t0);
    const auto t1 = std::chrono::steady_clock::now();
    // A budget that samples three row blocks per slice at these (CI-sized) shapes.
    const std::vector<RowBlock> blocks = sampled_rows(c, rng, kBlockOps / 50);
    const std::vector<double> vv = v.values();
    const Reference r = reference_rows(c, q.values(), k.values(), vv, blocks);
    const double sampled = seconds_since(t1);
    // Disjoint, in range, and fewer rows than the whole.
    std::vector<int> seen(static_cast<size_t>(c.b * c.hq * c.lq), 0);
    for (const RowBlock& bk : blocks) {
      ASSERT_TRUE(bk.b >= 0 && bk.b < c.b && bk.h >= 0 && bk.h < c.hq);
      ASSERT_TRUE(0 <= bk.i0 && bk.i0 < bk.i1 && bk.i1 <= c.lq);
      for (int64_t i = bk.i0; i < bk.i1; ++i)
        EXPECT_EQ(seen[static_cast<size_t>((bk.b * c.hq + bk.h) * c.lq + i)]++, 0);
    }
    EXPECT_LT(rows_of(blocks), c.b * c.hq * c.lq);
    // The whole reference (rounded to the 16-bit type / f32) passes as a "device" output.
    check_forward_output(c, vv, y.values(), lse.values(), r, blocks, "reference");
    std::printf("[ oracle   ] %s: whole reference %.3f s, %lld sampled rows %.3f s\n",
                name_of(c).c_str(), whole, static_cast<long long>(rows_of(blocks)), sampled);
  }
}

// ---- The sm_90a forward (fa3_fwd_sm90a) --------------------------------------------------------
// Two registrations of one kernel template: the plain schedule and the pingpong one (the two
// consumer warpgroups take turns issuing their wgmmas).
constexpr std::string_view kFa3 = kFa3Kernel;
constexpr std::string_view kFa3Pingpong = kFa3PingpongKernel;

const Kernel<attention::ForwardOp>* fa3_kernel(DType t, std::string_view name = kFa3) {
  return KernelTable<attention::ForwardOp>::instance().find(name, t);
}

// One of our sm_90a entries: arch, backend and precision as claimed (16-bit operands, f32
// accumulation, `deterministic` as given, bit_stable not claimed); the pinnable entries rank below
// every other kernel of the op (they never win `fastest` on their own), the ranked-ahead one above
// every other (its predicate, not its priority, limits it to where the table picks fa3) but cuDNN's
// deterministic default, which its measured rows put above it.
template <class Op>
void expect_fa3_entry(const Kernel<Op>& fa3, DType t, std::string_view family_prefix,
                      bool ranked_ahead, bool deterministic) {
  SCOPED_TRACE(std::string(fa3.sku.name));
  EXPECT_EQ(fa3.sku.arch, Arch::sm90a);
  EXPECT_EQ(fa3.sku.backend, Backend::bespoke_cuda);
  EXPECT_EQ(fa3.sku.precision.math, t == DType::bf16 ? MathPrecision::bf16 : MathPrecision::f16);
  EXPECT_EQ(fa3.sku.precision.accumulator, DType::f32);
  EXPECT_EQ(fa3.sku.precision.deterministic, deterministic);
  EXPECT_FALSE(fa3.sku.precision.bit_stable);
  for (const auto& k : KernelTable<Op>::instance().all()) {
    if (k.sku.element != t || k.sku.name.starts_with(family_prefix) ||
        k.sku.backend == Backend::cpu_reference || k.sku.name == kCudnnBwdDeterministicDefault)
      continue;
    if (ranked_ahead)
      EXPECT_GT(fa3.priority, k.priority) << k.sku.name;
    else
      EXPECT_LT(fa3.priority, k.priority) << k.sku.name;
  }
}

TEST(AttentionFa3Registry, RegisteredBelowEveryOtherForwardWithTruthfulPrecision) {
  int found = 0;
  for (DType t : {DType::bf16, DType::f16}) {
    for (std::string_view name :
         {kFa3, kFa3Pingpong, kFa3Exp2Poly2Kernel, kFa3Exp2Poly3Kernel, kFa3PersistentKernel,
          kFa3CountsKernel, kFa3PagedKernel, kFa3WideKernel, kFa3RankedAhead}) {
      const auto* fa3 = fa3_kernel(t, name);
      if (!fa3) continue;  // CPU-only build
      ++found;
      expect_fa3_entry(*fa3, t, "fa3_fwd_sm90a", name == kFa3RankedAhead, true);
    }
  }
  if (found == 0) GTEST_SKIP() << "built without CUDA: fa3_fwd_sm90a is not registered";
  EXPECT_EQ(found, 18);
}

// A deterministic forward plan run twice into poisoned Y / LSE: bytes outside them untouched each
// time, run 2 equal to run 1 bit for bit (so the values left are the ones the caller checks).
void run_twice_poisoned(const attention::ForwardPlan& plan, const Workspace_& ws,
                        const attention::ForwardArguments& args, TestTensor& gy, TestTensor& glse) {
  const Stream& gs = harness::stream_for(Target::cuda);
  std::vector<std::vector<uint8_t>> bytes;
  for (int rep = 0; rep < 2; ++rep) {
    gy.poison();
    glse.poison();
    const auto y_before = gy.bytes(), lse_before = glse.bytes();
    BARACUDA_ASSERT_OK(plan.run(gs, ws.get(), args));
    BARACUDA_ASSERT_OK(gs.synchronize());
    bytes.push_back(gy.bytes());
    bytes.push_back(glse.bytes());
    EXPECT_TRUE(harness::untouched_outside(y_before, bytes[2 * rep], gy.bit_mask(), "y"));
    EXPECT_TRUE(harness::untouched_outside(lse_before, bytes[2 * rep + 1], glse.bit_mask(), "lse"));
  }
  EXPECT_TRUE(harness::bytes_equal(bytes[0], bytes[2], "y run 1 vs run 2"));
  EXPECT_TRUE(harness::bytes_equal(bytes[1], bytes[3], "lse run 1 vs run 2"));
}

// One case: the kernel pinned by name on the GPU, run twice into poisoned outputs (bitwise equal,
// bytes outside Y / LSE untouched), against the float64 reference: every row of small cases,
// sampled rows of big ones (kFullCheckOps), with the whole-tensor checks on every row.
void check_fa3_case(const Case& c, harness::Rng& rng, std::string_view kernel) {
  const Stream& gs = harness::stream_for(Target::cuda);
  const Descriptor desc = desc_of(c, c.t);
  TestTensor q = cpu_tensor(c.t, {c.b, c.hq, c.lq, c.d}, &rng);
  TestTensor k = cpu_tensor(c.t, {c.b, c.hk, c.lk, c.d}, &rng);
  TestTensor v = cpu_tensor(c.t, {c.b, c.hk, c.lk, vdim(c)}, &rng);

  auto plan = attention::ForwardPlan::select(gs, desc, PlanPreference::kernel(kernel));
  BARACUDA_ASSERT_OK(plan);
  ASSERT_EQ(plan->sku().name, kernel);
  EXPECT_TRUE(plan->precision_guarantee().deterministic);
  TestTensor gq = upload(c, q, c.hq, c.lq, c.d), gk = upload(c, k, c.hk, c.lk, c.d),
             gv = upload(c, v, c.hk, c.lk, vdim(c));
  TestTensor gy = gpu_tensor(c, c.t, c.hq, c.lq, vdim(c));
  TestTensor glse = gpu_lse(c);
  const Workspace_ ws = workspace_of(plan->workspace_size());
  const attention::ForwardArguments args{gq.cview(),  gk.cview(), gv.cview(), gy.view(),
                                         glse.view(), {},         {}};
  run_twice_poisoned(*plan, ws, args, gy, glse);

  const auto t0 = std::chrono::steady_clock::now();
  const bool all = exhaustive(c);
  const std::vector<RowBlock> blocks = all ? every_row(c) : sampled_rows(c, rng);
  const std::vector<double> vv = v.values();
  const Reference ref = reference_rows(c, q.values(), k.values(), vv, blocks);
  check_forward_output(c, vv, gy.values(), glse.values(), ref, blocks, kernel);
  if (!all)
    std::printf("[ heavy    ] %s %s: %lld of %lld rows checked, %.2f s\n",
                std::string(kernel).c_str(), name_of(c).c_str(),
                static_cast<long long>(rows_of(blocks)), static_cast<long long>(c.b * c.hq * c.lq),
                seconds_since(t0));
}

// Skips (visibly) where the kernel cannot run: no GPU, not a Hopper GPU, or no sm_90a code.
#define FA3_SKIP_UNLESS_RUNNABLE()                                                             \
  BARACUDA_SKIP_IF_UNAVAILABLE(Target::cuda);                                                  \
  do {                                                                                         \
    const auto* fa3 = fa3_kernel(DType::bf16);                                                 \
    const Descriptor probe = make_desc(DType::bf16, 1, 1, 1, 128, 128, 64);                    \
    if (!fa3 || !fa3->fits(problem_of(probe), harness::stream_for(Target::cuda).caps()))       \
      GTEST_SKIP() << "fa3_fwd_sm90a does not run here (needs sm_90 and a build with sm_90a)"; \
  } while (0)

std::vector<Case> fa3_cases() {
  return {
      {DType::bf16, 2, 4, 4, 128, 128, 64, Mask::none(), false, false},
      {DType::f16, 1, 2, 2, 1, 1, 128, Mask::none(), true, false},
      {DType::bf16, 1, 2, 2, 1, 1, 64, Mask::causal_bottom_right(), false, true},
      {DType::bf16, 1, 2, 2, 17, 17, 64, Mask::causal_top_left(), false, true},
      {DType::f16, 1, 3, 3, 17, 17, 128, Mask::none(), true, true},
      // GQA 4, a ragged 1000-row tail, both layouts.
      {DType::f16, 1, 8, 2, 1000, 1000, 128, Mask::causal_bottom_right(), true, false},
      {DType::bf16, 1, 8, 2, 1000, 1000, 64, Mask::none(), false, true},
      // MQA with Lq < Lk, bottom-right.
      {DType::bf16, 2, 4, 1, 77, 203, 64, Mask::causal_bottom_right(), false, true},
      // Lq > Lk bottom-right: the first Lq - Lk rows see no key (Y = 0, LSE = -inf).
      {DType::f16, 1, 4, 4, 203, 77, 128, Mask::causal_bottom_right(), false, false},
      {DType::bf16, 1, 2, 2, 300, 77, 64, Mask::causal_bottom_right(), true, true},
      // Top-left with Lq != Lk (rows past Lk see every key; rows see fewer keys than Lk).
      {DType::bf16, 1, 4, 4, 300, 77, 64, Mask::causal_top_left(), true, true},
      {DType::f16, 1, 2, 2, 77, 300, 128, Mask::causal_top_left(), false, false},
      {DType::f16, 2, 8, 2, 1000, 513, 128, Mask::none(), true, true},
      {DType::bf16, 1, 2, 2, 129, 255, 128, Mask::none(), false, false},
      // More (batch, head) blocks than SMs.
      {DType::bf16, 8, 20, 20, 128, 128, 64, Mask::causal_top_left(), false, false},
      {DType::f16, 4, 40, 40, 17, 17, 128, Mask::none(), true, false},
      // Head dim 256 (64-key tiles): ragged tails, both masks and alignments, GQA, both layouts.
      {DType::bf16, 1, 2, 2, 1, 1, 256, Mask::none(), false, false},
      {DType::bf16, 1, 4, 2, 300, 300, 256, Mask::causal_bottom_right(), false, true},
      {DType::f16, 2, 2, 2, 77, 203, 256, Mask::none(), true, false},
      {DType::f16, 1, 4, 4, 203, 77, 256, Mask::causal_bottom_right(), true, true},
      {DType::bf16, 1, 2, 1, 129, 65, 256, Mask::causal_top_left(), false, false},
      // Sliding windows (both bounds, one bound, both diagonals; tiles left of the band skipped),
      // soft-capping (alone, with a band, at every head dim).
      {DType::bf16, 1, 4, 2, 700, 700, 128, Mask::sliding_window(100, 30), false, false},
      {DType::f16, 1, 2, 2, 300, 1000, 64, Mask::sliding_window(200, 0), true, true},
      {DType::bf16, 2, 4, 4, 333, 257, 64, Mask::sliding_window(-1, 17, Diagonal::top_left), false,
       true},
      {DType::bf16, 1, 2, 1, 600, 600, 256, Mask::sliding_window(129, 0, Diagonal::top_left), true,
       false},
      {DType::f16, 1, 2, 2, 1, 300, 128, Mask::sliding_window(5, 5), false, false},
      {DType::bf16, 1, 4, 2, 300, 300, 128, Mask::none(), false, false, true, 30.0},
      {DType::f16, 1, 2, 2, 257, 513, 64, Mask::causal_bottom_right(), true, true, true, 50.0},
      {DType::bf16, 1, 2, 2, 200, 200, 256, Mask::sliding_window(64, 0), false, false, true, 20.0},
      // Soft-capping's tanh at both ends: large caps (scores / cap near 0, where the tanh's error
      // is multiplied by the cap; see attention::testing::lse_slack) and scores / cap near 1
      // (scale 1 or 1/2: the capped logits span the cap).
      {DType::bf16, 1, 4, 2, 300, 300, 128, Mask::none(), false, false, true, 100.0},
      {DType::f16, 1, 2, 1, 200, 500, 256, Mask::causal_top_left(), true, true, true, 50.0},
      {DType::bf16, 1, 4, 2, 300, 300, 128, Mask::none(), false, false, true, 5.0, 0, 1.0},
      {DType::f16, 1, 2, 2, 257, 513, 64, Mask::causal_bottom_right(), true, true, true, 2.0, 0,
       0.5},
      {DType::bf16, 1, 2, 1, 200, 200, 256, Mask::none(), false, true, true, 8.0, 0, 1.0},
      // DeepSeek MLA prefill's head dims: Dk = 192, Dv = 128 (causal, GQA-free, both layouts).
      {DType::bf16, 1, 4, 4, 300, 300, 192, Mask::causal_bottom_right(), false, true, true, 0, 128},
      {DType::f16, 2, 2, 2, 77, 203, 192, Mask::none(), true, false, true, 0, 128},
      {DType::bf16, 1, 2, 1, 129, 1000, 192, Mask::causal_top_left(), true, true, true, 0, 128},
  };
}

std::vector<Case> fa3_long_cases() {
  return {
      {DType::bf16, 1, 1, 1, 4096, 4096, 128, Mask::none(), false, false},
      {DType::f16, 1, 2, 1, 4096, 4096, 64, Mask::causal_top_left(), true, false},
      {DType::bf16, 1, 1, 1, 4096, 1000, 128, Mask::causal_bottom_right(), false, true},
      {DType::f16, 1, 1, 1, 1000, 4096, 64, Mask::causal_bottom_right(), true, true},
      // GQA over many tiles, both layouts' rules at once (padded [B, L, H, D]).
      {DType::bf16, 2, 4, 2, 2048, 2048, 128, Mask::causal_top_left(), true, true},
      {DType::bf16, 1, 2, 1, 2048, 2048, 256, Mask::none(), false, false},
      {DType::bf16, 1, 4, 4, 2048, 2048, 192, Mask::causal_bottom_right(), true, false, true, 0,
       128},
      {DType::f16, 1, 2, 2, 1500, 1500, 256, Mask::causal_top_left(), true, true},
  };
}

void check_fa3_cases(const std::vector<Case>& cases, std::string_view kernel) {
  harness::Rng rng;
  const auto t0 = std::chrono::steady_clock::now();
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(kernel) + ": " + name_of(c));
    check_fa3_case(c, rng, kernel);
  }
  std::printf("[ fa3      ] %s: %zu cases, %.2f s\n", std::string(kernel).c_str(), cases.size(),
              seconds_since(t0));
}

// The views fa3's instances take beyond check_fa3_case's (key counts, paged pools): the
// arguments past Q, K, V, Y and LSE, set once on the CPU oracle's side and once on the GPU's.
using SetExtras = std::function<void(attention::ForwardArguments&)>;

// The family's CPU plan's answer in float64 on the values of q, k, v (shaped as desc says).
struct CpuAnswer {
  TestTensor y, lse;
};
CpuAnswer cpu_plan_answer(const Case& c, Descriptor desc, const TestTensor& q, const TestTensor& k,
                          const TestTensor& v, const SetExtras& extras) {
  const Stream& cs = harness::stream_for(Target::cpu);
  desc.dtype = DType::f64;
  auto f64_copy = [](const TestTensor& x) {
    TestTensor y64 = TestTensor::make(DType::f64, x.shape(), Target::cpu);
    y64.set_values(x.values());
    return y64;
  };
  const TestTensor q64 = f64_copy(q), k64 = f64_copy(k), v64 = f64_copy(v);
  CpuAnswer ans{TestTensor::make(DType::f64, {c.b, c.hq, c.lq, vdim(c)}, Target::cpu),
                TestTensor::make(DType::f64, {c.b, c.hq, c.lq}, Target::cpu)};
  auto plan = attention::ForwardPlan::select(cs, desc);
  EXPECT_TRUE(plan.ok()) << plan.error().to_string();
  if (!plan.ok()) return ans;
  attention::ForwardArguments a{q64.cview(),    k64.cview(), v64.cview(), ans.y.view(),
                                ans.lse.view(), {},          {}};
  extras(a);
  const Status st = plan->run(cs, Workspace::none(), a);
  EXPECT_TRUE(st.ok()) << (st.ok() ? std::string() : st.error().to_string());
  return ans;
}

// fa3's instance `kernel` by name, then the default plan (the ranked-ahead entry, which launches
// that instance, wherever the selection table picks fa3 for the problem): each run twice into
// poisoned Y / LSE (bitwise equal, gaps untouched) and compared with the CPU plan's answer.
void check_by_name_and_default(const Case& c, const Descriptor& desc, std::string_view kernel,
                               const TestTensor& gq, const TestTensor& gk, const TestTensor& gv,
                               const SetExtras& extras, const CpuAnswer& ans) {
  const Stream& gs = harness::stream_for(Target::cuda);
  // The ranked-ahead entry's own answer (the table's pick).
  const bool fa3_default = fa3_kernel(c.t, kFa3RankedAhead)->fits(problem_of(desc), gs.caps());
  for (const bool by_name : {true, false}) {
    SCOPED_TRACE(by_name ? "by name" : "default plan");
    auto plan = attention::ForwardPlan::select(
        gs, desc, by_name ? PlanPreference::kernel(kernel) : PlanPreference::fastest());
    BARACUDA_ASSERT_OK(plan);
    if (by_name || fa3_default) {
      ASSERT_EQ(plan->sku().name, by_name ? kernel : kFa3RankedAhead);
    }
    TestTensor gy = gpu_tensor(c, c.t, c.hq, c.lq, vdim(c));
    TestTensor glse = gpu_lse(c);
    const Workspace_ ws = workspace_of(plan->workspace_size());
    attention::ForwardArguments args{gq.cview(),  gk.cview(), gv.cview(), gy.view(),
                                     glse.view(), {},         {}};
    extras(args);
    run_twice_poisoned(*plan, ws, args, gy, glse);
    EXPECT_TRUE(harness::close_to(gy.values(), ans.y.values(), c.t, Accuracy::reduction, "y"));
    const LseBound lb = lse_bound(c, plan->sku().name);
    EXPECT_TRUE(harness::close_to(glse.values(), ans.lse.values(), lb.type, Accuracy::reduction,
                                  "lse", lb.slack));
  }
}

// A cache's rows past each sequence's key count set to NaN (a [B, Hk, Lk, D] CPU tensor): a kernel
// that scores one, or lets 0 * NaN into P V, shows.
void poison_past_counts(TestTensor& x, const std::vector<int32_t>& used) {
  std::vector<double> vals = x.values();
  const int64_t hk = x.shape()[1], lk = x.shape()[2], dim = x.shape()[3];
  for (int64_t b = 0; b < x.shape()[0]; ++b)
    for (int64_t h = 0; h < hk; ++h)
      for (int64_t l = std::max<int64_t>(used[static_cast<size_t>(b)], 0); l < lk; ++l)
        for (int64_t e = 0; e < dim; ++e)
          vals[static_cast<size_t>(((b * hk + h) * lk + l) * dim + e)] =
              std::numeric_limits<double>::quiet_NaN();
  x.set_values(vals);
}

// Per-sequence key counts (seqused_k) on fa3: each sequence reads the first count keys of its
// padded cache, whose rows past the count are NaN (a cache's unused rows may hold anything: the
// kernel must neither score them nor let 0 * NaN into P V). Against the family's CPU plan in
// float64 on the same values (whose counts AttentionReference.SequsedKEqualsSlicedCaches checks
// against sliced caches); two GPU runs bitwise equal, the Y / LSE gaps untouched.
TEST(AttentionFa3Gpu, SequsedKMatchesTheCpuPlan) {
  FA3_SKIP_UNLESS_RUNNABLE();
  harness::Rng rng;
  struct CountedCase {
    Case c;
    std::vector<int32_t> used;
  };
  const std::vector<CountedCase> cases = {
      // A prompt chunk against caches filled to three lengths (one empty), GQA 4, [B, L, H, D].
      {{DType::bf16, 3, 8, 2, 300, 1000, 128, Mask::causal_bottom_right(), true, false},
       {1000, 0, 333}},
      // No mask, counts off the tile grid, padded rows.
      {{DType::f16, 2, 4, 4, 129, 700, 64, Mask::none(), false, true}, {700, 65}},
      // Head dim 256, top-left causal, a softcap, MQA, a one-key cache.
      {{DType::bf16, 2, 4, 1, 70, 500, 256, Mask::causal_top_left(), false, false, true, 20.0},
       {499, 1}},
      // MLA's head dims and a window.
      {{DType::bf16, 1, 4, 4, 200, 400, 192, Mask::sliding_window(50, 0), true, false, true, 0,
        128},
       {257}},
  };
  for (const CountedCase& cc : cases) {
    const Case& c = cc.c;
    SCOPED_TRACE(name_of(c));
    Descriptor desc = desc_of(c, c.t);
    desc.seqused_k = true;
    TestTensor q = cpu_tensor(c.t, {c.b, c.hq, c.lq, c.d}, &rng);
    TestTensor k = cpu_tensor(c.t, {c.b, c.hk, c.lk, c.d}, &rng);
    TestTensor v = cpu_tensor(c.t, {c.b, c.hk, c.lk, vdim(c)}, &rng);
    for (TestTensor* x : {&k, &v}) poison_past_counts(*x, cc.used);
    const std::vector<double> counts(cc.used.begin(), cc.used.end());
    TestTensor used = TestTensor::make(DType::i32, {c.b}, Target::cpu);
    used.set_values(counts);

    const CpuAnswer ans = cpu_plan_answer(
        c, desc, q, k, v, [&](attention::ForwardArguments& x) { x.seqused_k = used.cview(); });
    TestTensor gq = upload(c, q, c.hq, c.lq, c.d), gk = upload(c, k, c.hk, c.lk, c.d),
               gv = upload(c, v, c.hk, c.lk, vdim(c));
    TestTensor gused = TestTensor::make(DType::i32, {c.b}, Target::cuda);
    gused.set_values(counts);
    check_by_name_and_default(
        c, desc, kFa3CountsKernel, gq, gk, gv,
        [&](attention::ForwardArguments& x) { x.seqused_k = gused.cview(); }, ans);
  }
}

// GQA packing on fa3 (kFa3PackedKernel, by name): a tile's 128 rows are 128 / group queries of each
// of the group's query heads, and the keys split across CTAs where the grid is small (merged by the
// decode's combine). Cases span groups 1 to 16, splits 1 to 6 (packed_splits: a case's note), every
// mask, both layouts, padded rows, a softcap and key counts (rows past a count NaN, one sequence's
// cache empty): each against the CPU plan's float64 answer, twice bitwise, gaps untouched.
TEST(AttentionFa3Gpu, PackedMatchesTheCpuPlan) {
  FA3_SKIP_UNLESS_RUNNABLE();
  harness::Rng rng;
  struct PackedCase {
    Case c;
    std::vector<int32_t> used;   // empty: no key counts
    bool default_packs = false;  // fa3_packs: the default plan is the ranked-ahead packed instance
  };
  const std::vector<PackedCase> cases = {
      // A 32-token chunk at the end of a 1000-key cache, GQA 4, [B, L, H, D]: 2 splits.
      {{DType::bf16, 1, 8, 2, 32, 1000, 128, Mask::causal_bottom_right(), true, false}, {}},
      // Speculative decoding's few tokens, GQA 8, no mask, padded rows: 1 split.
      {{DType::f16, 2, 8, 1, 5, 700, 64, Mask::none(), false, true}, {}},
      // Query blocks past one (64 queries a head), GQA 2, top-left causal: 1 split.
      {{DType::bf16, 3, 16, 8, 100, 333, 128, Mask::causal_top_left(), false, false}, {}},
      // GQA 16 (8 queries a head), a window, 3000 keys: 6 splits.
      {{DType::bf16, 1, 16, 1, 7, 3000, 64, Mask::sliding_window(64, 0), true, false}, {}},
      // Three query blocks of 32, GQA 4, 2048 keys: 4 splits, the last block ragged.
      {{DType::bf16, 1, 8, 2, 70, 2048, 128, Mask::causal_bottom_right(), false, true}, {}},
      // Group 1 (the key split alone): one sequence, 4 heads, a 100-row chunk of 3000 keys: 6
      // splits.
      {{DType::bf16, 1, 4, 4, 100, 3000, 128, Mask::causal_bottom_right(), false, false}, {}},
      // Key counts (one cache empty), GQA 4: 2 splits.
      {{DType::bf16, 3, 8, 2, 40, 1000, 128, Mask::causal_bottom_right(), true, false},
       {1000, 0, 333}},
      // Key counts off the tile grid with a softcap, GQA 2, f16: 1 split.
      {{DType::f16, 1, 4, 2, 130, 500, 64, Mask::none(), true, false, true, 30.0}, {257}},
      // Where fa3_packs sends the default plan (the ranked-ahead entry) to the packed instance:
      // d64, a 48-row chunk, GQA 4; d128, 200 rows (more than kFa3PackedChunkRows) against a
      // kFa3PackedLongCacheKeys-key cache, GQA 4.
      {{DType::bf16, 2, 8, 2, 48, 1500, 64, Mask::causal_bottom_right(), false, true}, {}, true},
      {{DType::bf16, 1, 4, 1, 200, kFa3PackedLongCacheKeys, 128, Mask::causal_bottom_right(), true,
        false},
       {},
       true},
      // Decodes whose group fills kFa3PackedDecodeRows of a tile (the default plan packs them):
      // 8 tokens in a group of 4 with key counts; 4 tokens in a group of 8, f16, d64, padded rows.
      {{DType::bf16, 2, 8, 2, 8, 3000, 128, Mask::causal_bottom_right(), false, false},
       {3000, 1111},
       true},
      {{DType::f16, 2, 8, 1, 4, 2500, 64, Mask::causal_bottom_right(), true, true}, {}, true},
      // Head dim 256 (64-key tiles), where fa3_packs too: 6 tokens in a group of 8 against 1500
      // keys, [B, L, H, D]; a 50-row chunk in a group of 2 with key counts and a softcap, f16.
      {{DType::bf16, 2, 8, 1, 6, 1500, 256, Mask::causal_bottom_right(), true, false}, {}, true},
      {{DType::f16, 2, 4, 2, 50, 900, 256, Mask::causal_bottom_right(), false, true, true, 20.0},
       {900, 321},
       true},
      // Lq 3 in a group of 16 (48 rows: past the decode kernel's 32), d128.
      {{DType::bf16, 1, 16, 1, 3, 2000, 128, Mask::causal_bottom_right(), false, false}, {}, true},
  };
  for (const PackedCase& pc : cases) {
    const Case& c = pc.c;
    SCOPED_TRACE(name_of(c) + (pc.used.empty() ? "" : " counted"));
    Descriptor desc = desc_of(c, c.t);
    desc.seqused_k = !pc.used.empty();
    if (pc.default_packs) {
      EXPECT_TRUE(fa3_packs(problem_of(desc)));
      EXPECT_TRUE(fa3_kernel(c.t, kFa3RankedAhead)
                      ->fits(problem_of(desc), harness::stream_for(Target::cuda).caps()));
    }
    TestTensor q = cpu_tensor(c.t, {c.b, c.hq, c.lq, c.d}, &rng);
    TestTensor k = cpu_tensor(c.t, {c.b, c.hk, c.lk, c.d}, &rng);
    TestTensor v = cpu_tensor(c.t, {c.b, c.hk, c.lk, vdim(c)}, &rng);
    if (!pc.used.empty())
      for (TestTensor* x : {&k, &v}) poison_past_counts(*x, pc.used);
    const std::vector<double> counts(pc.used.begin(), pc.used.end());
    TestTensor used = TestTensor::make(DType::i32, {std::max<int64_t>(c.b, 1)}, Target::cpu);
    TestTensor gused = TestTensor::make(DType::i32, {std::max<int64_t>(c.b, 1)}, Target::cuda);
    if (!pc.used.empty()) {
      used.set_values(counts);
      gused.set_values(counts);
    }
    auto with_counts = [&](const TestTensor& u) {
      return [&, counted = !pc.used.empty()](attention::ForwardArguments& x) {
        if (counted) x.seqused_k = u.cview();
      };
    };
    const CpuAnswer ans = cpu_plan_answer(c, desc, q, k, v, with_counts(used));
    TestTensor gq = upload(c, q, c.hq, c.lq, c.d), gk = upload(c, k, c.hk, c.lk, c.d),
               gv = upload(c, v, c.hk, c.lk, vdim(c));
    check_by_name_and_default(c, desc, kFa3PackedKernel, gq, gk, gv, with_counts(gused), ans);
  }
}

// Decodes of 256-wide heads in groups of 1 (wide_head_decode): the default plan is fa3's
// ranked-ahead entry (its plain instance, the keys split) for one token or where cuDNN does not
// serve the problem (soft-capping; a build without cuDNN), cuDNN's otherwise; fa3 by name and the
// default plan against the CPU plan's float64 answer, twice bitwise, gaps untouched.
TEST(AttentionFa3Gpu, WideHeadDecodesMatchTheCpuPlan) {
  FA3_SKIP_UNLESS_RUNNABLE();
  harness::Rng rng;
  const std::vector<Case> cases = {
      // One token a sequence against 1500 keys, [B, L, H, D].
      {DType::bf16, 2, 4, 4, 1, 1500, 256, Mask::causal_bottom_right(), true, false},
      // Speculative decoding's 5 tokens, f16, padded rows, 777 keys.
      {DType::f16, 3, 2, 2, 5, 777, 256, Mask::causal_bottom_right(), false, true},
      // 16 tokens, no mask, a softcap.
      {DType::bf16, 1, 4, 4, kDecodeQueryRows, 2100, 256, Mask::none(), false, false, true, 30.0},
  };
  const Stream& gs = harness::stream_for(Target::cuda);
  for (const Case& c : cases) {
    SCOPED_TRACE(name_of(c));
    const Descriptor desc = desc_of(c, c.t);
    const attention::Problem pr = problem_of(desc);
    EXPECT_TRUE(wide_head_decode(pr));
    const bool cudnn_first = c.lq > 1 && cudnn_serves(pr, gs.caps());
    EXPECT_EQ(fa3_kernel(c.t, kFa3RankedAhead)->fits(pr, gs.caps()), !cudnn_first);
    auto def = attention::ForwardPlan::select(gs, desc);
    BARACUDA_ASSERT_OK(def);
    EXPECT_EQ(def->sku().backend == Backend::cudnn, cudnn_first) << def->sku().name;
    TestTensor q = cpu_tensor(c.t, {c.b, c.hq, c.lq, c.d}, &rng);
    TestTensor k = cpu_tensor(c.t, {c.b, c.hk, c.lk, c.d}, &rng);
    TestTensor v = cpu_tensor(c.t, {c.b, c.hk, c.lk, vdim(c)}, &rng);
    const CpuAnswer ans = cpu_plan_answer(c, desc, q, k, v, [](attention::ForwardArguments&) {});
    TestTensor gq = upload(c, q, c.hq, c.lq, c.d), gk = upload(c, k, c.hk, c.lk, c.d),
               gv = upload(c, v, c.hk, c.lk, vdim(c));
    check_by_name_and_default(
        c, desc, kFa3Kernel, gq, gk, gv, [](attention::ForwardArguments&) {}, ans);
  }
}

// What the packed instance takes: groups 1 to 16 in powers of two, head dims 64, 128 and 256, with
// or without key counts; not paged pools (its paged twin takes those), other groups or head dims.
TEST(AttentionFa3Gpu, PackedFitsGroupsOfOneToSixteen) {
  FA3_SKIP_UNLESS_RUNNABLE();
  const DeviceCaps caps = harness::stream_for(Target::cuda).caps();
  const auto* packed = fa3_kernel(DType::bf16, kFa3PackedKernel);
  ASSERT_NE(packed, nullptr);
  auto fits = [&](int64_t hq, int64_t hk, int64_t d) {
    return packed->fits(problem_of(make_desc(DType::bf16, 2, hq, hk, 32, 4096, d)), caps);
  };
  for (int64_t g : {1, 2, 4, 8, 16}) {
    EXPECT_TRUE(fits(8 * g, 8, 128)) << g;
    EXPECT_TRUE(fits(g, 1, 64)) << g;
    EXPECT_TRUE(fits(2 * g, 2, 256)) << g;
  }
  // MLA's Dk 192 / Dv 128 stays with the plain instances.
  Descriptor mla = make_desc(DType::bf16, 2, 32, 8, 32, 4096, 192);
  mla.head_dim_v = 128;
  EXPECT_FALSE(packed->fits(problem_of(mla), caps));
  EXPECT_FALSE(fits(24, 8, 128));  // group 3
  EXPECT_FALSE(fits(32, 1, 128));  // group 32: 4 rows a head, under one swizzle atom
  Descriptor counted = make_desc(DType::bf16, 2, 32, 8, 32, 4096, 128);
  counted.seqused_k = true;
  EXPECT_TRUE(packed->fits(problem_of(counted), caps));
  Descriptor paged = counted;
  paged.page_size = 64;
  paged.pages = 128;
  const auto made = attention::ForwardOp::make_problem(paged);
  ASSERT_TRUE(made.ok()) << made.error().to_string();
  EXPECT_FALSE(packed->fits(made.value(), caps));
  const auto* packed_paged = fa3_kernel(DType::bf16, kFa3PackedPagedKernel);
  ASSERT_NE(packed_paged, nullptr);
  EXPECT_TRUE(packed_paged->fits(made.value(), caps));
  EXPECT_FALSE(packed_paged->fits(problem_of(counted), caps));
}

// A paged case: K / V as a pool of pages in a random order (3 unreferenced; every row no sequence
// reads NaN), the block table, key counts where given; `kernel` by name (and the default plan)
// against the CPU plan's answer.
struct PagedCase {
  Case c;
  int64_t page_size;
  std::vector<int32_t> used;  // empty: no key counts
};
void check_paged_case(const PagedCase& pc, std::string_view kernel, harness::Rng& rng) {
  constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
  const Case& c = pc.c;
  const int64_t ps = pc.page_size, cols = (c.lk + ps - 1) / ps, pages = c.b * cols + 3;
  SCOPED_TRACE(name_of(c) + " pages of " + std::to_string(ps));
  Descriptor desc = desc_of(c, c.t);
  desc.page_size = ps, desc.pages = pages, desc.seqused_k = !pc.used.empty();
  // The table: the pool's pages in a random order (3 left unreferenced).
  const std::vector<int32_t> pages_of = attention::testing::scattered_pages(pages, c.b * cols, rng);
  const std::vector<double> table(pages_of.begin(), pages_of.end());
  // Pool rows a sequence reads: keys [0, count) of its pages.
  std::vector<char> visible(static_cast<size_t>(pages * ps), 0);
  for (int64_t b = 0; b < c.b; ++b) {
    const int64_t keys = pc.used.empty() ? c.lk : pc.used[static_cast<size_t>(b)];
    for (int64_t j = 0; j < keys; ++j)
      visible[static_cast<size_t>(
          static_cast<int64_t>(table[static_cast<size_t>(b * cols + j / ps)]) * ps + j % ps)] = 1;
  }
  TestTensor q = cpu_tensor(c.t, {c.b, c.hq, c.lq, c.d}, &rng);
  TestTensor k = cpu_tensor(c.t, {pages, c.hk, ps, c.d}, &rng);
  TestTensor v = cpu_tensor(c.t, {pages, c.hk, ps, vdim(c)}, &rng);
  for (TestTensor* x : {&k, &v}) {
    std::vector<double> vals = x->values();
    const int64_t dim = x->shape()[3];
    for (int64_t pg = 0; pg < pages; ++pg)
      for (int64_t h = 0; h < c.hk; ++h)
        for (int64_t r = 0; r < ps; ++r)
          if (!visible[static_cast<size_t>(pg * ps + r)])
            for (int64_t e = 0; e < dim; ++e)
              vals[static_cast<size_t>(((pg * c.hk + h) * ps + r) * dim + e)] = kNaN;
    x->set_values(vals);
  }
  const std::vector<double> counts(pc.used.begin(), pc.used.end());
  TestTensor ctable = TestTensor::make(DType::i32, {c.b, cols}, Target::cpu);
  ctable.set_values(table);
  TestTensor cused = TestTensor::make(DType::i32, {c.b}, Target::cpu);
  if (desc.seqused_k) cused.set_values(counts);

  const CpuAnswer ans = cpu_plan_answer(c, desc, q, k, v, [&](attention::ForwardArguments& x) {
    x.block_table = ctable.cview();
    if (desc.seqused_k) x.seqused_k = cused.cview();
  });

  TestTensor gq = upload(c, q, c.hq, c.lq, c.d);
  auto pool = [&](const TestTensor& host) {
    const int64_t dim = host.shape()[3];
    const std::vector<int64_t> st = c.blhd
                                        ? std::vector<int64_t>{ps * c.hk * dim, dim, c.hk * dim, 1}
                                        : std::vector<int64_t>{c.hk * ps * dim, ps * dim, dim, 1};
    TestTensor g = TestTensor::with_strides(c.t, {pages, c.hk, ps, dim}, st, 0, Target::cuda);
    g.set_values(host.values());
    return g;
  };
  const TestTensor gk = pool(k), gv = pool(v);
  TestTensor gtable = TestTensor::make(DType::i32, {c.b, cols}, Target::cuda);
  gtable.set_values(table);
  TestTensor gused = TestTensor::make(DType::i32, {c.b}, Target::cuda);
  if (desc.seqused_k) gused.set_values(counts);
  check_by_name_and_default(
      c, desc, kernel, gq, gk, gv,
      [&](attention::ForwardArguments& x) {
        x.block_table = gtable.cview();
        if (desc.seqused_k) x.seqused_k = gused.cview();
      },
      ans);
}

// Paged K / V on fa3 (fa3_fwd_sm90a_paged): each sequence's keys in scattered pages of one pool
// ([pages, Hk, page_size, D], in [pages, Hk, ps, D] or [pages, ps, Hk, D] memory per the case's
// blhd), both ways the producer loads them (TMA boxes for pages of one or more key tiles; cp.async
// rows for smaller pages, 8 to 64 keys, at every head dim), with and without key counts. Every pool
// row no sequence may read (unreferenced pages, rows past a sequence's keys) is NaN. Against the
// family's CPU plan in float64 on the same pool and table (ForwardPagedKv checks that plan against
// padded caches); by name and through the default plan; two GPU runs bitwise equal, gaps untouched.
TEST(AttentionFa3Gpu, PagedMatchesTheCpuPlan) {
  FA3_SKIP_UNLESS_RUNNABLE();
  harness::Rng rng;
  const std::vector<PagedCase> cases = {
      // Pages of fewer keys than half a tile: the producer warpgroup's cp.async rows (kRowCopies)
      // instead of TMA boxes. Head dim 128: 16-key pages, counts (one past a page boundary, one
      // inside the last tile), a softcap; 8-key pages of f16, both pool orders' other one, GQA 8,
      // a window; 32-key pages, top-left causal, Lq > a tile's rows.
      {{DType::bf16, 2, 8, 2, 257, 900, 128, Mask::causal_bottom_right(), false, false, true, 30.0},
       16,
       {900, 449}},
      {{DType::f16, 1, 8, 1, 64, 333, 128, Mask::sliding_window(100, 0), true, false}, 8, {}},
      {{DType::bf16, 2, 4, 4, 300, 640, 128, Mask::causal_top_left(), false, false}, 32, {640, 1}},
      // The other head dims' row copies: MLA's (Dk 192: three column blocks of K, two of V) in
      // 16-key pages with counts; 256 (64-key tiles) in 16-key pages.
      {{DType::bf16, 2, 4, 4, 150, 500, 192, Mask::causal_bottom_right(), true, false, true, 0,
        128},
       16,
       {500, 130}},
      {{DType::f16, 1, 4, 2, 129, 333, 256, Mask::none(), false, false, true, 50.0}, 16, {}},
      // Pages that do not divide a tile or are not whole tiles: 48 keys at d128 (counts), 96 at
      // d256 (64-key tiles: a page and a half a tile), 5 keys at d64.
      {{DType::bf16, 2, 4, 2, 200, 700, 128, Mask::causal_bottom_right(), true, false},
       48,
       {700, 95}},
      {{DType::f16, 1, 4, 4, 100, 400, 256, Mask::causal_top_left(), false, false}, 96, {}},
      {{DType::bf16, 1, 2, 1, 70, 130, 64, Mask::none(), false, false}, 5, {}},
      // A prompt chunk in 64-key pages (two a 128-key tile: TMA boxes), GQA 4, counts (one empty);
      // head dim 256's half tiles (32-key pages).
      {{DType::bf16, 3, 8, 2, 300, 1000, 128, Mask::causal_bottom_right(), true, false},
       64,
       {1000, 0, 333}},
      {{DType::bf16, 2, 4, 2, 130, 400, 256, Mask::causal_bottom_right(), false, false},
       32,
       {400, 77}},
      // Head dim 64 in 16-key pages, no counts: the last page's rows past Lk are NaN.
      {{DType::f16, 2, 4, 4, 129, 700, 64, Mask::none(), false, false}, 16, {}},
      // 256-key pages (two tiles a page), top-left causal, a softcap, MQA.
      {{DType::bf16, 2, 4, 1, 200, 900, 128, Mask::causal_top_left(), false, false, true, 20.0},
       256,
       {899, 1}},
      // Head dim 256 (64-key tiles) in 8-key pages, counts.
      {{DType::bf16, 2, 4, 2, 70, 500, 256, Mask::causal_bottom_right(), true, false},
       8,
       {500, 77}},
      // MLA's head dims and a window, 128-key pages (a tile a page).
      {{DType::bf16, 1, 4, 4, 200, 400, 192, Mask::sliding_window(50, 0), true, false, true, 0,
        128},
       128,
       {}},
  };
  for (const PagedCase& pc : cases) check_paged_case(pc, kFa3PagedKernel, rng);
}

// GQA packing over paged pools (kFa3PackedPagedKernel): the packed tiles' Q with the paged
// instance's K / V producers, TMA boxes (64-key pages: half a tile) and cp.async row copies (16-
// and 8-key pages), counts with an empty cache, 1 to 4 splits.
TEST(AttentionFa3Gpu, PackedPagedMatchesTheCpuPlan) {
  FA3_SKIP_UNLESS_RUNNABLE();
  harness::Rng rng;
  const std::vector<PagedCase> cases = {
      // A 32-token chunk, GQA 4, 64-key pages, counts (one cache empty): 2 splits.
      {{DType::bf16, 3, 8, 2, 32, 1000, 128, Mask::causal_bottom_right(), true, false},
       64,
       {1000, 0, 333}},
      // Speculative decoding's 6 tokens, GQA 8, 16-key pages of f16, head dim 64: 4 splits.
      {{DType::f16, 1, 8, 1, 6, 2000, 64, Mask::causal_bottom_right(), false, false}, 16, {}},
      // GQA 2 (64 queries a head), 8-key pages, a window and a softcap: 1 split.
      {{DType::bf16, 2, 4, 2, 100, 500, 128, Mask::sliding_window(40, 0), true, false, true, 25.0},
       8,
       {500, 77}},
      // fa3_packs at head dim 64 (the default plan's packed instance too): a 40-token chunk, GQA
      // 4, 32-key pages, counts.
      {{DType::bf16, 2, 8, 2, 40, 1200, 64, Mask::causal_bottom_right(), false, false},
       32,
       {1200, 555}},
      // Head dim 256: 12 tokens, GQA 4, 16-key pages (row copies), counts.
      {{DType::bf16, 2, 8, 2, 12, 700, 256, Mask::causal_bottom_right(), false, false},
       16,
       {700, 250}},
      // Head dim 256, 64-key pages (whole tiles as TMA boxes), f16, GQA 2, 40 rows.
      {{DType::f16, 1, 4, 2, 40, 1000, 256, Mask::causal_bottom_right(), true, false}, 64, {}},
  };
  for (const PagedCase& pc : cases) check_paged_case(pc, kFa3PackedPagedKernel, rng);
}

// One TEST per kernel and size class, so a failing (or hanging) schedule is named by the filter.
TEST(AttentionFa3Gpu, ForwardMatchesReference) {
  FA3_SKIP_UNLESS_RUNNABLE();
  check_fa3_cases(fa3_cases(), kFa3);
}
TEST(AttentionFa3Gpu, LongSequencesMatchReference) {
  FA3_SKIP_UNLESS_RUNNABLE();
  check_fa3_cases(fa3_long_cases(), kFa3);
}
TEST(AttentionFa3Gpu, PingpongForwardMatchesReference) {
  FA3_SKIP_UNLESS_RUNNABLE();
  check_fa3_cases(fa3_cases(), kFa3Pingpong);
}
TEST(AttentionFa3Gpu, PingpongLongSequencesMatchReference) {
  FA3_SKIP_UNLESS_RUNNABLE();
  check_fa3_cases(fa3_long_cases(), kFa3Pingpong);
}
// The exp2-offload variants (part of the softmax's exp2 as a polynomial on the FMA pipe): every
// case of both lists, one test per variant.
std::vector<Case> all_fa3_cases() {
  std::vector<Case> all = fa3_cases();
  for (const Case& c : fa3_long_cases()) all.push_back(c);
  return all;
}
TEST(AttentionFa3Gpu, Exp2Poly2of8MatchesReference) {
  FA3_SKIP_UNLESS_RUNNABLE();
  check_fa3_cases(all_fa3_cases(), kFa3Exp2Poly2Kernel);
}
TEST(AttentionFa3Gpu, Exp2Poly3of8MatchesReference) {
  FA3_SKIP_UNLESS_RUNNABLE();
  check_fa3_cases(all_fa3_cases(), kFa3Exp2Poly3Kernel);
}
// The persistent variant (D = 64 and 128): every such case of both lists (MLA's 192 / 128 is not
// one); its grids of several work tiles a CTA are the next test's.
// Its banded cases (right bound) run the instance's causal form (kHalfTiles: half key tiles on the
// diagonal and at short tails), the others its unbanded one.
TEST(AttentionFa3Gpu, PersistentMatchesReference) {
  FA3_SKIP_UNLESS_RUNNABLE();
  std::vector<Case> cases;
  for (const Case& c : all_fa3_cases())
    if ((c.d == 64 || c.d == 128) && vdim(c) == c.d) cases.push_back(c);
  check_fa3_cases(cases, kFa3PersistentKernel);
}
// Grids of several work tiles a CTA: the ring, both Q buffers (D = 64) and the O buffer reused
// across tiles (its TMA stores drained a tile later), keyless tiles mixed in, both masks, short
// sequences of one key tile a work tile. A test of its own so that compute-sanitizer's racecheck
// and synccheck, which run it many times slower, fit a device call.
TEST(AttentionFa3Gpu, PersistentWalksManyTiles) {
  FA3_SKIP_UNLESS_RUNNABLE();
  std::vector<Case> cases;
  for (int64_t d : {64, 128}) {
    cases.push_back(
        {DType::bf16, 4, 16, 4, 1000, 1000, d, Mask::causal_bottom_right(), true, true});
    cases.push_back({DType::f16, 16, 16, 16, 256, 300, d, Mask::none(), false, false});
    cases.push_back({DType::bf16, 8, 16, 8, 300, 200, d, Mask::causal_bottom_right(), false, true});
    cases.push_back({DType::bf16, 64, 16, 16, 128, 128, d, Mask::none(), false, false});
    cases.push_back({DType::f16, 40, 8, 2, 200, 200, d, Mask::causal_top_left(), true, false});
  }
  // Several banded sections of work tiles (fa3_section_heads: 2 heads at 18 CTAs, 4 at 12), the
  // last one partial; unbanded, one head a section.
  cases.push_back(
      {DType::bf16, 1, 9, 9, 130, 16384, 64, Mask::causal_bottom_right(), false, false});
  cases.push_back({DType::bf16, 1, 9, 9, 130, 16384, 64, Mask::none(), false, false});
  cases.push_back(
      {DType::bf16, 1, 6, 6, 160, 16384, 128, Mask::causal_bottom_right(), true, false});
  // The paired instances (fa3_walks_in_pairs at 132 SMs; PairedWalkCoversEveryTileOnceAndBalances
  // checks that these shapes pair there), one a dtype and head dim: whole round pairs, heavy tiles
  // past them and their complements, every head's middle block. bf16 d64: 340 tiles of 5 blocks in
  // 2.6 rounds, GQA; bf16 d128: 396 tiles of 3 blocks in 3 rounds (the rule's bound); f16 d64: 288
  // tiles of 4 blocks. (f16 d128 pairs in DefaultPlanLaunchesTheRankedInstance's routes.)
  cases.push_back({DType::bf16, 2, 34, 17, 600, 600, 64, Mask::causal_top_left(), false, true});
  cases.push_back({DType::bf16, 4, 33, 11, 300, 300, 128, Mask::causal_top_left(), true, false});
  cases.push_back({DType::f16, 3, 24, 24, 450, 450, 64, Mask::causal_bottom_right(), true, true});
  check_fa3_cases(cases, kFa3PersistentKernel);
}
// The 192-row tiles (D = 64): every D = 64 case of both lists, plus lengths on either side of
// whole 192-row blocks (191, 192, 193, 385: a last block of 1 row or 191), every mask, both
// layouts, GQA, more blocks than SMs.
TEST(AttentionFa3Gpu, WideTilesMatchReference) {
  FA3_SKIP_UNLESS_RUNNABLE();
  std::vector<Case> cases;
  for (const Case& c : all_fa3_cases())
    if (c.d == 64 && vdim(c) == 64) cases.push_back(c);
  cases.push_back({DType::bf16, 1, 4, 2, 191, 191, 64, Mask::none(), false, true});
  cases.push_back({DType::f16, 2, 2, 2, 192, 192, 64, Mask::causal_top_left(), true, false});
  cases.push_back({DType::bf16, 1, 2, 1, 193, 400, 64, Mask::causal_bottom_right(), false, false});
  cases.push_back({DType::f16, 1, 4, 4, 385, 385, 64, Mask::sliding_window(70, 20), true, true});
  cases.push_back(
      {DType::bf16, 2, 40, 10, 384, 384, 64, Mask::causal_bottom_right(), false, false});
  cases.push_back({DType::bf16, 1, 2, 2, 600, 300, 64, Mask::none(), false, false, true, 30.0});
  check_fa3_cases(cases, kFa3WideKernel);
}

TEST(AttentionFa3Gpu, FitsExactlyWhatItSupports) {
  FA3_SKIP_UNLESS_RUNNABLE();
  const DeviceCaps& caps = harness::stream_for(Target::cuda).caps();
  auto fits = [&](const Descriptor& d) {
    const bool plain = fa3_kernel(d.dtype)->fits(problem_of(d), caps);
    for (std::string_view v : {kFa3Pingpong, kFa3Exp2Poly2Kernel, kFa3Exp2Poly3Kernel})
      EXPECT_EQ(fa3_kernel(d.dtype, v)->fits(problem_of(d), caps), plain) << v;
    // The 192-row tiles: Dk = Dv = 64.
    EXPECT_EQ(fa3_kernel(d.dtype, kFa3WideKernel)->fits(problem_of(d), caps),
              plain && d.head_dim_qk == 64 && d.head_dim_v == 64);
    // The persistent variant: Dk = Dv = 64 or 128.
    EXPECT_EQ(
        fa3_kernel(d.dtype, kFa3PersistentKernel)->fits(problem_of(d), caps),
        plain && d.head_dim_qk == d.head_dim_v && (d.head_dim_qk == 64 || d.head_dim_qk == 128));
    // Key counts: their own instance, and only it, wherever the plain schedule fits the problem.
    Descriptor counted = d;
    counted.seqused_k = true;
    EXPECT_FALSE(fa3_kernel(d.dtype, kFa3CountsKernel)->fits(problem_of(d), caps));
    EXPECT_EQ(fa3_kernel(d.dtype, kFa3CountsKernel)->fits(problem_of(counted), caps), plain);
    for (std::string_view v : {kFa3, kFa3Pingpong, kFa3Exp2Poly2Kernel, kFa3Exp2Poly3Kernel,
                               kFa3PersistentKernel, kFa3WideKernel})
      EXPECT_FALSE(fa3_kernel(d.dtype, v)->fits(problem_of(counted), caps)) << v;
    // Paged pools: their own instance, and only it, at every page size (a whole key tile or half
    // of one as TMA boxes, others as row copies), with or without counts; the ranked-ahead entry
    // wherever the table picks fa3, whatever the page size; packed (varlen) queries too.
    const int64_t tile = d.head_dim_qk == 256 ? 64 : 128;
    for (int64_t ps : {int64_t{4}, int64_t{8}, int64_t{16}, int64_t{48}, int64_t{64}, int64_t{96},
                       tile, 2 * tile, 3 * tile}) {
      for (const bool with_counts : {false, true}) {
        Descriptor paged = d;
        paged.page_size = ps, paged.pages = 1000, paged.seqused_k = with_counts;
        const auto made = attention::ForwardOp::make_problem(paged);
        EXPECT_TRUE(made.ok()) << made.error().to_string();
        if (!made.ok()) continue;
        EXPECT_EQ(fa3_kernel(d.dtype, kFa3PagedKernel)->fits(made.value(), caps), plain) << ps;
        Descriptor whole_tiles = paged;
        whole_tiles.page_size = tile;
        EXPECT_EQ(fa3_kernel(d.dtype, kFa3RankedAhead)->fits(made.value(), caps),
                  fa3_kernel(d.dtype, kFa3RankedAhead)
                      ->fits(attention::ForwardOp::make_problem(whole_tiles).value(), caps))
            << ps;
        for (std::string_view v : {kFa3, kFa3CountsKernel, kFa3Pingpong, kFa3Exp2Poly2Kernel,
                                   kFa3Exp2Poly3Kernel, kFa3PersistentKernel, kFa3WideKernel})
          EXPECT_FALSE(fa3_kernel(d.dtype, v)->fits(made.value(), caps)) << v << " " << ps;
      }
    }
    EXPECT_FALSE(fa3_kernel(d.dtype, kFa3PagedKernel)->fits(problem_of(d), caps));
    return plain;
  };
  EXPECT_TRUE(fits(make_desc(DType::bf16, 1, 8, 2, 77, 203, 64, Mask::causal_bottom_right())));
  EXPECT_TRUE(fits(make_desc(DType::f16, 1, 8, 1, 203, 77, 128, Mask::causal_top_left())));
  EXPECT_FALSE(fits(make_desc(DType::bf16, 1, 4, 4, 64, 64, 96)));  // head dim
  EXPECT_TRUE(fits(make_desc(DType::bf16, 1, 4, 4, 64, 64, 256)));
  EXPECT_FALSE(fits(make_desc(DType::bf16, 1, 4, 4, 64, 64, 192)));  // head dim (Dv = 192)
  Descriptor mla = make_desc(DType::bf16, 1, 4, 4, 64, 64, 192);
  mla.head_dim_v = 128;
  EXPECT_TRUE(fits(mla));  // DeepSeek MLA: Dk = 192, Dv = 128
  Descriptor dv = make_desc(DType::bf16, 1, 4, 4, 64, 64, 128);
  dv.head_dim_v = 64;
  EXPECT_FALSE(fits(dv));
  // Any band, soft-capping.
  EXPECT_TRUE(fits(make_desc(DType::bf16, 1, 4, 4, 64, 64, 64, Mask::sliding_window(16, 0))));
  EXPECT_TRUE(fits(make_desc(DType::bf16, 1, 4, 4, 64, 64, 64, Mask::sliding_window(-1, 4))));
  Descriptor capped = make_desc(DType::bf16, 1, 4, 4, 64, 64, 64);
  capped.softcap = 30;
  EXPECT_TRUE(fits(capped));
  Descriptor varlen = make_desc(DType::bf16, 2, 4, 4, 16, 16, 64);
  varlen.varlen = true;
  varlen.total_q = varlen.total_k = 32;
  EXPECT_TRUE(fits(varlen));
  EXPECT_FALSE(fits(make_desc(DType::bf16, 1, 4, 4, 16, 0, 64)));  // no keys
  // The default plan is fa3 (its ranked-ahead entry) exactly where the shipped table picks it
  // among the candidates that serve the problem here (candidate_here: without cuDNN, fa3 against
  // the family's kernels).
  const Descriptor big = make_desc(DType::bf16, 2, 16, 16, 4096, 4096, 128);
  auto def = attention::ForwardPlan::select(harness::stream_for(Target::cuda), big);
  BARACUDA_ASSERT_OK(def);
  const bool fa3_wins = candidate_here(problem_of(big), Pass::forward, caps) == Candidate::fa3;
  EXPECT_EQ(def->sku().name == kFa3RankedAhead, fa3_wins) << def->sku().name;
  EXPECT_NE(def->sku().name, kFa3);
  EXPECT_NE(def->sku().name, kFa3Pingpong);
}

// Under one-point tables (D128, L512, causal) that make cuDNN, then the bespoke kernel, the fastest
// for `pass` (fa3 second), the default plan of `desc` is that candidate's and not an fa3 entry; in
// a build without cuDNN (-DBARACUDA_WITH_CUDNN=OFF) the cuDNN table's goes to fa3's ranked-ahead
// entry (`ranked_ahead`), the table's pick among the others (candidate_here).
template <class PlanT>
void expect_default_follows_cudnn_and_bespoke_tables(const Descriptor& desc, Pass pass,
                                                     std::string_view ranked_ahead) {
  const Stream& gs = harness::stream_for(Target::cuda);
  const TablePoint cudnn_wins[] = {{DType::bf16, pass, 128, 512, true, 3, 1, 2}},
                   bespoke_wins[] = {{DType::bf16, pass, 128, 512, true, 1, 3, 2}};
  for (const auto* table : {&cudnn_wins, &bespoke_wins}) {
    const SelectionTableOverride o{*table};
    auto def = PlanT::select(gs, desc);
    BARACUDA_ASSERT_OK(def);
    if (table == &bespoke_wins) {
      EXPECT_EQ(def->sku().backend, Backend::bespoke_cuda) << def->sku().name;
      EXPECT_FALSE(def->sku().name.starts_with("fa3_")) << def->sku().name;
    } else {
#if BARACUDA_HAVE_CUDNN_FRONTEND
      EXPECT_EQ(def->sku().backend, Backend::cudnn) << def->sku().name;
#else
      EXPECT_EQ(def->sku().name, ranked_ahead);
#endif
    }
  }
}

// `plan` (a default plan that chose fa3's ranked-ahead entry) and the instance it stands for
// (fa3_ranked_forward_kernel) pinned by name on the same random inputs, outputs poisoned first:
// the same bits.
void expect_same_bits_as_pinned_fa3(const Case& c, const Descriptor& desc,
                                    const attention::ForwardPlan& plan) {
  const Stream& gs = harness::stream_for(Target::cuda);
  const std::string_view stand_in = fa3_ranked_forward_kernel(problem_of(desc));
  SCOPED_TRACE(std::string(stand_in));
  auto pinned = attention::ForwardPlan::select(gs, desc, PlanPreference::kernel(stand_in));
  BARACUDA_ASSERT_OK(pinned);
  harness::Rng rng;
  TestTensor q = gpu_tensor(c, c.t, c.hq, c.lq, c.d), k = gpu_tensor(c, c.t, c.hk, c.lk, c.d),
             v = gpu_tensor(c, c.t, c.hk, c.lk, c.d);
  q.fill_random(rng);
  k.fill_random(rng);
  v.fill_random(rng);
  std::vector<std::vector<uint8_t>> out;
  const attention::ForwardPlan& by_name = *pinned;
  for (const attention::ForwardPlan* p : {&plan, &by_name}) {
    TestTensor y = gpu_tensor(c, c.t, c.hq, c.lq, c.d);
    TestTensor lse = gpu_lse(c);
    y.poison();
    lse.poison();
    const Workspace_ ws = workspace_of(p->workspace_size());
    BARACUDA_ASSERT_OK(
        p->run(gs, ws.get(), {q.cview(), k.cview(), v.cview(), y.view(), lse.view(), {}, {}}));
    BARACUDA_ASSERT_OK(gs.synchronize());
    out.push_back(y.bytes());
    out.push_back(lse.bytes());
  }
  EXPECT_TRUE(harness::bytes_equal(out[0], out[2], "y: ranked-ahead vs pinned"));
  EXPECT_TRUE(harness::bytes_equal(out[1], out[3], "lse: ranked-ahead vs pinned"));
}

// Under `table`, the default plan for `c` is fa3's ranked-ahead entry, deterministic, and bit for
// bit the instance it stands for.
void expect_default_is_ranked_ahead(const Case& c, std::span<const TablePoint> table) {
  const Stream& gs = harness::stream_for(Target::cuda);
  const Descriptor desc = desc_of(c, c.t);
  const SelectionTableOverride o{table};
  auto def = attention::ForwardPlan::select(gs, desc);
  BARACUDA_ASSERT_OK(def);
  EXPECT_EQ(def->sku().name, kFa3RankedAhead);
  EXPECT_TRUE(def->precision_guarantee().deterministic);
  expect_same_bits_as_pinned_fa3(c, desc, *def);
}

// The default plan under tables that make each candidate fastest: fa3's ranked-ahead entry where
// fa3 wins (bit-identical to the instance it stands for, here the persistent one), cuDNN or the
// family's kernel elsewhere, and the table's cuDNN/bespoke choice where fa3 cannot run (D = 96).
TEST(AttentionFa3Gpu, DefaultPlanFollowsTheTable) {
  FA3_SKIP_UNLESS_RUNNABLE();
  const Stream& gs = harness::stream_for(Target::cuda);
  const Case c{DType::bf16, 1, 4, 2, 300, 300, 128, Mask::causal_top_left(), false, false};
  const Descriptor desc = desc_of(c, c.t);
  auto table_for = [&](double cudnn, double bespoke, double fa3) {
    return TablePoint{DType::bf16, Pass::forward, 128, 512, true, cudnn, bespoke, fa3};
  };
  const TablePoint fa3_wins[] = {table_for(1, 1, 2)};
  expect_default_is_ranked_ahead(c, fa3_wins);
  {
    const SelectionTableOverride o{fa3_wins};
    // D = 96: fa3 cannot run, so the table's cuDNN/bespoke columns decide (a tie: cuDNN).
    const Descriptor d96 = make_desc(c.t, c.b, c.hq, c.hk, c.lq, c.lk, 96, c.mask);
    auto other = attention::ForwardPlan::select(gs, d96);
    BARACUDA_ASSERT_OK(other);
    EXPECT_FALSE(other->sku().name.starts_with("fa3_")) << other->sku().name;
#if BARACUDA_HAVE_CUDNN_FRONTEND
    EXPECT_EQ(other->sku().backend, Backend::cudnn) << other->sku().name;
#endif
  }
  expect_default_follows_cudnn_and_bespoke_tables<attention::ForwardPlan>(desc, Pass::forward,
                                                                          kFa3RankedAhead);
}

// The ranked-ahead entry's other instances, under tables that make fa3 the pick: the persistent
// one for short sequences (d64 / d128, both masks, up to the lengths fa3_persists takes), for d128
// unmasked ones up to kFa3PersistentUnmaskedD128MaxLen and causal ones of either head dim up to
// kFa3PersistentCausalMaxLen (longer query sequences to kFa3PersistentPairedCausalMaxLen), the
// packed one for a chunk in a group of 1 against a long cache, the 192-row one at d64 from
// kFa3WideMinRows rows, the plain one past those shapes; bit for bit the instance pinned by name
// (whose own tests check it against the float64 reference: PersistentMatchesReference, the packed
// suites, WideTilesMatchReference, ForwardMatchesReference).
TEST(AttentionFa3Gpu, DefaultPlanLaunchesTheRankedInstance) {
  FA3_SKIP_UNLESS_RUNNABLE();
  struct Route {
    Case c;
    std::string_view instance;
  };
  const Route routes[] = {
      {{DType::bf16, 8, 16, 16, 128, 128, 128, Mask::none(), false, false}, kFa3PersistentKernel},
      {{DType::f16, 4, 8, 2, 256, 256, 64, Mask::causal_top_left(), true, false},
       kFa3PersistentKernel},
      {{DType::bf16, 2, 4, 4, 200, 150, 128, Mask::causal_bottom_right(), false, true},
       kFa3PersistentKernel},
      {{DType::bf16, 2, 4, 2, kFa3PersistentMaxLen, kFa3PersistentMaxLen, 64, Mask::none(), false,
        false},
       kFa3PersistentKernel},
      {{DType::bf16, 2, 4, 4, kFa3PersistentMaxLen - 24, kFa3PersistentMaxLen, 128, Mask::none(),
        true, false},
       kFa3PersistentKernel},
      {{DType::f16, 1, 4, 4, 300, kFa3PersistentMaxLen, 128, Mask::causal_bottom_right(), false,
        false},
       kFa3PersistentKernel},
      {{DType::bf16, 1, 4, 4, 32, kFa3PackedLongCacheKeys, 128, Mask::causal_bottom_right(), false,
        false},
       kFa3PackedKernel},
      {{DType::f16, 1, 2, 2, kFa3PackedUngroupedMaxRows, kFa3PackedLongCacheKeys, 64,
        Mask::causal_bottom_right(), true, false},
       kFa3PackedKernel},
      // d64 from kFa3WideMinRows rows: the 192-row instance.
      {{DType::bf16, 1, 4, 2, kFa3WideMinRows, kFa3WideMinRows, 64, Mask::none(), false, false},
       kFa3WideKernel},
      {{DType::f16, 1, 2, 2, kFa3PersistentPairedCausalMaxLen + 77,
        kFa3PersistentPairedCausalMaxLen + 300, 64, Mask::causal_bottom_right(), true, true},
       kFa3WideKernel},
      // D = 128 unmasked: persistent up to kFa3PersistentUnmaskedD128MaxLen.
      {{DType::bf16, 1, 4, 2, kFa3PersistentMaxLen + 88, kFa3PersistentMaxLen + 88, 128,
        Mask::none(), false, false},
       kFa3PersistentKernel},
      {{DType::f16, 1, 4, 4, 500, kFa3PersistentUnmaskedD128MaxLen, 128, Mask::none(), true, false},
       kFa3PersistentKernel},
      // Past fa3_persists' lengths: the plain instance.
      {{DType::bf16, 1, 4, 2, kFa3PersistentUnmaskedD128MaxLen + 88,
        kFa3PersistentUnmaskedD128MaxLen + 88, 128, Mask::none(), false, false},
       kFa3Kernel},
      {{DType::bf16, 1, 4, 4, kFa3PersistentPairedCausalMaxLen + 88,
        kFa3PersistentPairedCausalMaxLen + 88, 128, Mask::causal_bottom_right(), false, false},
       kFa3Kernel},
      {{DType::bf16, 1, 4, 4, kFa3PersistentMaxLen + 88, kFa3PersistentMaxLen + 88, 64,
        Mask::sliding_window(300, 0), false, false},
       kFa3Kernel},
      // Causal, D = 64 and 128: persistent up to kFa3PersistentCausalMaxLen.
      {{DType::bf16, 1, 4, 4, kFa3PersistentMaxLen + 88, kFa3PersistentMaxLen + 88, 64,
        Mask::causal_top_left(), false, false},
       kFa3PersistentKernel},
      {{DType::f16, 1, 4, 2, kFa3PersistentCausalMaxLen, kFa3PersistentCausalMaxLen, 64,
        Mask::causal_bottom_right(), true, false},
       kFa3PersistentKernel},
      {{DType::bf16, 1, 4, 4, kFa3PersistentMaxLen + 88, kFa3PersistentMaxLen + 88, 128,
        Mask::causal_bottom_right(), false, false},
       kFa3PersistentKernel},
      {{DType::f16, 2, 4, 2, kFa3PersistentCausalMaxLen, kFa3PersistentCausalMaxLen, 128,
        Mask::causal_top_left(), true, true},
       kFa3PersistentKernel},
      // Longer causal query sequences, to kFa3PersistentPairedCausalMaxLen: persistent, paired.
      {{DType::bf16, 2, 4, 4, kFa3PersistentPairedCausalMaxLen, kFa3PersistentPairedCausalMaxLen,
        64, Mask::causal_top_left(), false, true},
       kFa3PersistentKernel},
      {{DType::f16, 1, 4, 2, kFa3PersistentCausalMaxLen + 99, kFa3PersistentPairedCausalMaxLen, 128,
        Mask::causal_bottom_right(), true, false},
       kFa3PersistentKernel}};
  for (const Route& r : routes) {
    const Case& c = r.c;
    SCOPED_TRACE(std::string(r.instance) + " lq=" + std::to_string(c.lq) +
                 " lk=" + std::to_string(c.lk) + " d=" + std::to_string(c.d));
    EXPECT_EQ(fa3_ranked_forward_kernel(problem_of(desc_of(c, c.t))), r.instance);
    // fa3 ahead of cuDNN and the family's kernels at the nearest point of the problem's kind.
    const bool causal = c.mask.right == 0;
    const TablePoint fa3_wins[] = {
        {c.t, Pass::forward, c.d, std::max(c.lq, c.lk), causal, 1, 2, 3}};
    expect_default_is_ranked_ahead(c, fa3_wins);
  }
}

// Where the table ranks cuDNN first and fa3 second: the default plan is cuDNN's where it serves the
// problem (a build with the frontend), else fa3's ranked-ahead entry (a build without it:
// -DBARACUDA_WITH_CUDNN=OFF), equal bit for bit to its instance by name; never the family's
// kernels.
TEST(AttentionFa3Gpu, DefaultPlanSkipsCudnnWhereItDoesNotServe) {
  FA3_SKIP_UNLESS_RUNNABLE();
  const Stream& gs = harness::stream_for(Target::cuda);
  const Case c{DType::bf16, 1, 4, 2, 300, 300, 128, Mask::causal_top_left(), false, false};
  const Descriptor desc = desc_of(c, c.t);
  const TablePoint fa3_second[] = {{DType::bf16, Pass::forward, 128, 512, true, 3, 1, 2}};
  const SelectionTableOverride o{fa3_second};
  const bool serves = cudnn_serves(problem_of(desc), gs.caps());
#if BARACUDA_HAVE_CUDNN_FRONTEND
  EXPECT_TRUE(serves);
#else
  EXPECT_FALSE(serves);
#endif
  auto def = attention::ForwardPlan::select(gs, desc);
  BARACUDA_ASSERT_OK(def);
  if (serves) {
    EXPECT_EQ(def->sku().backend, Backend::cudnn) << def->sku().name;
    return;
  }
  EXPECT_EQ(def->sku().name, kFa3RankedAhead);
  expect_same_bits_as_pinned_fa3(c, desc, *def);
}

// On the GPU: only(Backend::cudnn) for a problem cuDNN is not given fails with cuDNN's rule in
// the message (the ranked-behind entry's refusal), forward and backward.
TEST(AttentionFa3Gpu, CudnnOnlySelectSaysWhyNot) {
#if !BARACUDA_HAVE_CUDNN_FRONTEND
  GTEST_SKIP() << "built without the cuDNN frontend: no cuDNN kernel to refuse";
#endif
  BARACUDA_SKIP_IF_UNAVAILABLE(Target::cuda);
  const Stream& gs = harness::stream_for(Target::cuda);
  Descriptor capped = make_desc(DType::bf16, 1, 4, 4, 64, 64, 64);
  capped.softcap = 30;
  EXPECT_TRUE(
      fails_with(attention::ForwardPlan::select(gs, capped, PlanPreference::only(Backend::cudnn)),
                 ErrorKind::unsupported, {"refused by cudnn_sdpa_ranked_behind: softcap"}));
  EXPECT_TRUE(
      fails_with(attention::BackwardPlan::select(gs, capped, PlanPreference::only(Backend::cudnn)),
                 ErrorKind::unsupported, {"refused by cudnn_sdpa_bwd_ranked_behind: softcap"}));
}

TEST(AttentionFa3Gpu, MisalignedRunFailsWithoutWriting) {
  FA3_SKIP_UNLESS_RUNNABLE();
  // K one element into its buffer: valid for the family's rules, not for TMA.
  expect_misaligned_run_fails(PlanPreference::kernel(kFa3), 1,
                              {"attention_forward: fa3_fwd_sm90a: k: data is not 16-byte aligned"});
}

// ---- The fp8 forward (fa3_fwd_fp8_sm90a) --------------------------------------------------------
// A case's c.t is Y's dtype (bf16 or f16); Q, K, V are e4m3 drawn in [-4, 4) (so that the softmax
// is far from uniform and P spans many binades), each with a descale drawn in [0.5, 1.5).
TEST(AttentionFa3Registry, Fp8ForwardRegisteredWithTruthfulPrecision) {
  int found = 0;
  for (const auto& k : KernelTable<attention::ForwardOp>::instance().all()) {
    const bool plain = k.sku.name == kFa3Fp8Kernel;
    if (!plain && k.sku.name != kFa3Fp8PingpongKernel && k.sku.name != kFa3Fp8Exp2Poly2Kernel &&
        k.sku.name != kFa3Fp8Exp2Poly3Kernel && k.sku.name != kFa3Fp8EagerRescaleKernel)
      continue;
    ++found;
    // The plain schedule is the e4m3 default; the others are reached by name only.
    if (plain)
      EXPECT_EQ(k.priority, kFa3Ahead);
    else
      EXPECT_LE(k.priority, 0) << k.sku.name;
    EXPECT_EQ(k.sku.element, DType::e4m3);
    EXPECT_EQ(k.sku.arch, Arch::sm90a);
    EXPECT_EQ(k.sku.backend, Backend::bespoke_cuda);
    EXPECT_EQ(k.sku.precision.math, MathPrecision::e4m3);
    EXPECT_EQ(k.sku.precision.accumulator, DType::f32);
    EXPECT_TRUE(k.sku.precision.deterministic);
    EXPECT_FALSE(k.sku.precision.bit_stable);
    EXPECT_TRUE(k.fits && k.workspace);
  }
  if (found == 0) GTEST_SKIP() << "built without CUDA: fa3_fwd_fp8_sm90a is not registered";
  EXPECT_EQ(found, 10);  // five schedules x Y in bf16 / f16
}

struct Fp8Inputs {
  TestTensor q, k, v;
  double qs, ks, vs;  // descales
  // The logical values the inputs stand for (element x descale).
  std::vector<double> dq() const { return scaled(q, qs); }
  std::vector<double> dk() const { return scaled(k, ks); }
  std::vector<double> dv() const { return scaled(v, vs); }
  static std::vector<double> scaled(const TestTensor& t, double s) {
    std::vector<double> x = t.values();
    for (double& e : x) e *= s;
    return x;
  }
};
Fp8Inputs fp8_inputs(const Case& c, harness::Rng& rng) {
  Fp8Inputs in{cpu_tensor(DType::e4m3, {c.b, c.hq, c.lq, c.d}, nullptr),
               cpu_tensor(DType::e4m3, {c.b, c.hk, c.lk, c.d}, nullptr),
               cpu_tensor(DType::e4m3, {c.b, c.hk, c.lk, vdim(c)}, nullptr),
               rng.uniform(0.5, 1.5),
               rng.uniform(0.5, 1.5),
               rng.uniform(0.5, 1.5)};
  for (TestTensor* t : {&in.q, &in.k, &in.v}) t->fill_random(rng, -4, 4);
  return in;
}
TestTensor gpu_scalar(double x) {
  TestTensor t = TestTensor::make(DType::f32, {1}, Target::cuda);
  t.set_values({x});
  return t;
}

// The default plan on the GPU (the fp8 kernel) or a schedule pinned by name, run twice into
// poisoned outputs (bitwise equal, bytes outside Y / LSE untouched), against the float64 reference
// over the dequantized inputs.
void check_fp8_case(const Case& c, harness::Rng& rng, std::string_view kernel = kFa3Fp8Kernel) {
  const Stream& gs = harness::stream_for(Target::cuda);
  Descriptor desc = desc_of(c, DType::e4m3);
  desc.out_dtype = c.t;
  const Fp8Inputs in = fp8_inputs(c, rng);
  auto plan = attention::ForwardPlan::select(
      gs, desc,
      kernel == kFa3Fp8Kernel ? PlanPreference::fastest() : PlanPreference::kernel(kernel));
  BARACUDA_ASSERT_OK(plan);
  ASSERT_EQ(plan->sku().name, kernel);
  EXPECT_EQ(plan->precision_guarantee().math, MathPrecision::e4m3);
  EXPECT_TRUE(plan->precision_guarantee().deterministic);
  TestTensor gq = upload(c, in.q, c.hq, c.lq, c.d), gk = upload(c, in.k, c.hk, c.lk, c.d),
             gv = upload(c, in.v, c.hk, c.lk, vdim(c));
  const TestTensor qs = gpu_scalar(in.qs), ks = gpu_scalar(in.ks), vs = gpu_scalar(in.vs);
  TestTensor gy = gpu_tensor(c, c.t, c.hq, c.lq, vdim(c));
  TestTensor glse = gpu_lse(c);
  const Workspace_ ws = workspace_of(plan->workspace_size());
  attention::ForwardArguments args{gq.cview(),  gk.cview(), gv.cview(), gy.view(),
                                   glse.view(), {},         {}};
  args.q_descale = qs.cview(), args.k_descale = ks.cview(), args.v_descale = vs.cview();
  run_twice_poisoned(*plan, ws, args, gy, glse);

  const bool all = exhaustive(c);
  const std::vector<RowBlock> blocks = all ? every_row(c) : sampled_rows(c, rng);
  const std::vector<double> vv = in.dv();
  const Reference ref = reference_rows(c, in.dq(), in.dk(), vv, blocks);
  double vmax = 0;
  for (double x : vv) vmax = std::max(vmax, std::abs(x));
  const std::vector<double> y = gy.values();
  // LSE to f16's bound, not f32's: the e4m3 wgmma sums Q K^T in a narrower accumulator than f32
  // (about 14 mantissa bits, as DeepSeek-V3 reports for Hopper's fp8 GEMMs; measured here
  // rel_l2 ~1e-4 on LSE) before the f32 registers take the result.
  attention::testing::expect_forward_outputs({c.b, c.hq, c.lq, c.lk, vdim(c), c.mask}, c.t,
                                             DType::f16, ref.y, ref.lse, vmax, y, glse.values(),
                                             blocks, true);
  // The measured errors at the checked rows, for the record (the bounds: e4m3's rounded-weights
  // tolerance for Y, f16's reduction bound for LSE; rows that see no key are left out of LSE's).
  const std::vector<double> lse = glse.values();
  std::vector<double> got, want, got_l, want_l;
  for (const RowBlock& bk : blocks)
    for (int64_t i = bk.i0; i < bk.i1; ++i) {
      const int64_t row = (bk.b * c.hq + bk.h) * c.lq + i;
      if (std::isfinite(ref.lse[row])) got_l.push_back(lse[row]), want_l.push_back(ref.lse[row]);
      for (int64_t col = 0; col < vdim(c); ++col) {
        const size_t at = static_cast<size_t>(row * vdim(c) + col);
        got.push_back(y[at]), want.push_back(ref.y[at]);
      }
    }
  const harness::Comparison cmp = harness::compare(got, want);
  const harness::Comparison lcmp = harness::compare(got_l, want_l);
  std::printf("[ fp8 err  ] %s %s: y rel_l2 %.3g max_abs %.3g, lse rel_l2 %.3g\n",
              std::string(kernel).c_str(), name_of(c).c_str(), cmp.rel_l2, cmp.max_abs,
              lcmp.rel_l2);
}

#define FP8_SKIP_UNLESS_RUNNABLE()                                                                 \
  BARACUDA_SKIP_IF_UNAVAILABLE(Target::cuda);                                                      \
  do {                                                                                             \
    Descriptor probe = make_desc(DType::e4m3, 1, 1, 1, 128, 128, 128);                             \
    const auto* fp8 = fa3_kernel(DType::e4m3, kFa3Fp8Kernel);                                      \
    if (!fp8 || !fp8->fits(problem_of(probe), harness::stream_for(Target::cuda).caps()))           \
      GTEST_SKIP() << "fa3_fwd_fp8_sm90a does not run here (needs sm_90 and a build with sm_90a)"; \
  } while (0)

TEST(AttentionFa3Gpu, Fp8ForwardMatchesReference) {
  FP8_SKIP_UNLESS_RUNNABLE();
  const Case cases[] = {
      {DType::bf16, 2, 4, 4, 128, 128, 128, Mask::none(), false, false},
      {DType::f16, 1, 2, 2, 1, 1, 128, Mask::none(), true, false},
      {DType::bf16, 1, 2, 2, 17, 17, 128, Mask::causal_top_left(), false, true},
      // GQA 4 and MQA, ragged tails, both layouts, both diagonals.
      {DType::f16, 1, 8, 2, 1000, 1000, 128, Mask::causal_bottom_right(), true, false},
      {DType::bf16, 2, 4, 1, 77, 203, 128, Mask::causal_bottom_right(), false, true},
      // Lq > Lk bottom-right: the first Lq - Lk rows see no key (Y = 0, LSE = -inf).
      {DType::f16, 1, 4, 4, 203, 77, 128, Mask::causal_bottom_right(), false, false},
      {DType::f16, 1, 2, 2, 129, 255, 128, Mask::causal_top_left(), true, true},
      {DType::bf16, 1, 4, 2, 700, 700, 128, Mask::sliding_window(100, 30), false, false},
      {DType::bf16, 1, 4, 2, 300, 300, 128, Mask::none(), false, false, true, 30.0},
      // More (batch, head) blocks than SMs; a long row (sampled).
      {DType::f16, 4, 40, 40, 17, 17, 128, Mask::none(), true, false},
      {DType::bf16, 1, 2, 1, 4096, 4096, 128, Mask::none(), false, true},
      {DType::bf16, 1, 2, 2, 2048, 2048, 128, Mask::causal_top_left(), true, false},
      // Head dim 64 (64-byte swizzled Q / K rows) and 256 (64-key tiles, 64-byte V^T rows).
      {DType::bf16, 2, 4, 4, 128, 128, 64, Mask::none(), false, false},
      {DType::f16, 1, 8, 2, 1000, 1000, 64, Mask::causal_bottom_right(), true, true},
      {DType::bf16, 1, 4, 1, 77, 203, 64, Mask::sliding_window(50, 10), false, true, true, 20.0},
      {DType::bf16, 1, 2, 2, 1, 1, 256, Mask::none(), false, false},
      {DType::f16, 1, 4, 2, 300, 300, 256, Mask::causal_bottom_right(), false, true},
      {DType::bf16, 2, 2, 2, 203, 77, 256, Mask::causal_bottom_right(), true, false, true, 30.0},
      {DType::bf16, 1, 2, 1, 2048, 2048, 256, Mask::none(), true, true},
  };
  harness::Rng rng;
  for (const Case& c : cases) {
    SCOPED_TRACE("fp8 " + name_of(c));
    check_fp8_case(c, rng);
  }
}

// The pingpong and exp2-offload schedules on cases that cross their turn-taking and mask paths.
TEST(AttentionFa3Gpu, Fp8SchedulesMatchReference) {
  FP8_SKIP_UNLESS_RUNNABLE();
  const Case cases[] = {
      {DType::bf16, 1, 2, 2, 17, 17, 128, Mask::causal_top_left(), false, true},
      {DType::f16, 1, 8, 2, 1000, 1000, 128, Mask::causal_bottom_right(), true, false},
      {DType::bf16, 1, 4, 2, 300, 300, 128, Mask::none(), false, false, true, 30.0},
      {DType::f16, 1, 4, 4, 203, 77, 128, Mask::causal_bottom_right(), false, false},
      {DType::bf16, 1, 4, 2, 300, 300, 64, Mask::causal_top_left(), true, false},
      {DType::f16, 1, 2, 2, 300, 500, 256, Mask::none(), false, true},
  };
  harness::Rng rng;
  for (std::string_view k : {kFa3Fp8PingpongKernel, kFa3Fp8Exp2Poly2Kernel, kFa3Fp8Exp2Poly3Kernel,
                             kFa3Fp8EagerRescaleKernel})
    for (const Case& c : cases) {
      SCOPED_TRACE(std::string(k) + " " + name_of(c));
      check_fp8_case(c, rng, k);
    }
}

// What the fp8 kernel takes: Dk = Dv = 128, padded or varlen, Y in bf16 or f16; elsewhere no GPU
// kernel serves e4m3 and select says so.
TEST(AttentionFa3Gpu, Fp8FitsExactlyWhatItSupports) {
  FP8_SKIP_UNLESS_RUNNABLE();
  const Stream& gs = harness::stream_for(Target::cuda);
  Descriptor ok = make_desc(DType::e4m3, 2, 4, 2, 300, 500, 128, Mask::causal_bottom_right());
  for (DType out : {DType::bf16, DType::f16}) {
    ok.out_dtype = out;
    auto plan = attention::ForwardPlan::select(gs, ok);
    BARACUDA_ASSERT_OK(plan);
    EXPECT_EQ(plan->sku().name, kFa3Fp8Kernel);
    EXPECT_EQ(plan->workspace_size(), size_t{2 * 2 * 128 * 512});  // V^T, keys to whole tiles
  }
  // Head dims 64 and 256 too (V^T keys to whole tiles: 128 at D = 64, 64 at D = 256); no other.
  Descriptor d64 = make_desc(DType::e4m3, 1, 2, 2, 128, 100, 64);
  auto p64 = attention::ForwardPlan::select(gs, d64);
  BARACUDA_ASSERT_OK(p64);
  EXPECT_EQ(p64->workspace_size(), size_t{2 * 64 * 128});
  Descriptor d256 = make_desc(DType::e4m3, 1, 2, 2, 128, 100, 256);
  auto p256 = attention::ForwardPlan::select(gs, d256);
  BARACUDA_ASSERT_OK(p256);
  EXPECT_EQ(p256->workspace_size(), size_t{2 * 256 * 128});
  for (int64_t dim : {32, 80, 96, 192}) {
    Descriptor d = make_desc(DType::e4m3, 1, 2, 2, 128, 128, dim);
    EXPECT_TRUE(fails_with(attention::ForwardPlan::select(gs, d), ErrorKind::unsupported,
                           {"no kernel for element=e4m3"}))
        << dim;
  }
  Descriptor mla = make_desc(DType::e4m3, 1, 2, 2, 128, 128, 192);
  mla.head_dim_v = 128;
  EXPECT_TRUE(fails_with(attention::ForwardPlan::select(gs, mla), ErrorKind::unsupported,
                         {"no kernel for element=e4m3"}));
  // Varlen: V^T of every sequence side by side, 16-byte aligned starts 144 apart past the packed
  // offsets, plus a tile of slack: (150 + 2 * 144) rounded to 16, + 128 keys.
  Descriptor varlen = make_desc(DType::e4m3, 2, 2, 2, 100, 100, 128);
  varlen.varlen = true, varlen.total_q = 150, varlen.total_k = 150;
  auto vplan = attention::ForwardPlan::select(gs, varlen);
  BARACUDA_ASSERT_OK(vplan);
  EXPECT_EQ(vplan->sku().name, kFa3Fp8Kernel);
  EXPECT_EQ(vplan->workspace_size(), size_t{2 * 128 * (448 + 128)});
}

// A misaligned V (one byte into its buffer) is refused before anything is written.
TEST(AttentionFa3Gpu, Fp8MisalignedRunFailsWithoutWriting) {
  FP8_SKIP_UNLESS_RUNNABLE();
  harness::Rng rng;
  const Stream& gs = harness::stream_for(Target::cuda);
  const Case c{DType::bf16, 1, 2, 2, 64, 64, 128, Mask::none(), false, false};
  Descriptor desc = desc_of(c, DType::e4m3);
  auto plan = attention::ForwardPlan::select(gs, desc);
  BARACUDA_ASSERT_OK(plan);
  const Fp8Inputs in = fp8_inputs(c, rng);
  TestTensor gq = upload(c, in.q, 2, 64, 128), gk = upload(c, in.k, 2, 64, 128);
  TestTensor off = TestTensor::with_strides(DType::e4m3, {1, 2, 64, 128}, {16384, 8192, 128, 1}, 1,
                                            Target::cuda);
  off.fill_random(rng, -4, 4);
  const TestTensor qs = gpu_scalar(1), ks = gpu_scalar(1), vs = gpu_scalar(1);
  TestTensor y = gpu_tensor(c, DType::bf16, 2, 64, 128);
  TestTensor lse = gpu_lse(c);
  y.poison();
  lse.poison();
  const auto y_before = y.bytes(), lse_before = lse.bytes();
  const Workspace_ ws = workspace_of(plan->workspace_size());
  attention::ForwardArguments args{gq.cview(), gk.cview(), off.cview(), y.view(),
                                   lse.view(), {},         {}};
  args.q_descale = qs.cview(), args.k_descale = ks.cview(), args.v_descale = vs.cview();
  EXPECT_TRUE(fails_with(plan->run(gs, ws.get(), args), ErrorKind::misaligned_operand,
                         {"attention_forward: fa3_fwd_fp8_sm90a: v: data is not 16-byte aligned"}));
  BARACUDA_ASSERT_OK(gs.synchronize());
  EXPECT_TRUE(harness::bytes_equal(y_before, y.bytes(), "y"));
  EXPECT_TRUE(harness::bytes_equal(lse_before, lse.bytes(), "lse"));
}

// ---- The sm_90a backward (fa3_bwd_sm90a) -------------------------------------------------------
const Kernel<attention::BackwardOp>* fa3_bwd_kernel(DType t,
                                                    std::string_view name = kFa3BwdKernel) {
  return KernelTable<attention::BackwardOp>::instance().find(name, t);
}

TEST(AttentionFa3Registry, BackwardRankedByTheTableAndNotDeterministic) {
  int found = 0;
  for (DType t : {DType::bf16, DType::f16})
    for (std::string_view name :
         {kFa3BwdKernel, kFa3BwdK192Kernel, kFa3BwdQ128Kernel, kFa3BwdHeavyFirstKernel,
          kFa3BwdHeadSplitKernel, kFa3BwdHeadSplitHeavyFirstKernel, kFa3BwdFallingKernel,
          kFa3BwdHeadSplitPartsKernels[0], kFa3BwdHeadSplitPartsKernels[1],
          kFa3BwdHeadSplitPartsKernels[2], kFa3BwdRankedKernel, kFa3BwdRankedZeroedKernel,
          kFa3BwdRankedClaimsKernel, kFa3BwdRankedAhead}) {
      const auto* fa3 = fa3_bwd_kernel(t, name);
      if (!fa3) continue;  // CPU-only build
      ++found;
      // dQ through float reductions in arrival order: not deterministic.
      expect_fa3_entry(*fa3, t, kFa3BwdKernel, name == kFa3BwdRankedAhead, false);
    }
  if (found == 0) GTEST_SKIP() << "built without CUDA: fa3_bwd_sm90a is not registered";
  EXPECT_EQ(found, 28);
}

// The deterministic instance: by name below every other backward kernel, and deterministic. Its
// ranked entry: deterministic too, above every other deterministic backward entry (cuDNN's
// ranked-ahead one included) and below fa3's ranked-ahead entry, which fits wherever it does.
TEST(AttentionFa3Registry, DeterministicBackwardIsPinnableAndDeterministic) {
  int found = 0;
  for (DType t : {DType::bf16, DType::f16}) {
    const auto* det = fa3_bwd_kernel(t, kFa3BwdDeterministicKernel);
    if (!det) continue;  // CPU-only build
    ++found;
    expect_fa3_entry(*det, t, kFa3BwdKernel, false, true);
    for (std::string_view name :
         {kFa3BwdDeterministicHeadSplitKernel, kFa3BwdDeterministicHeavyFirstKernel}) {
      const auto* split = fa3_bwd_kernel(t, name);
      ASSERT_TRUE(split) << name;
      expect_fa3_entry(*split, t, kFa3BwdKernel, false, true);
    }
    const auto* ranked = fa3_bwd_kernel(t, kFa3BwdDeterministicRanked);
    const auto* ahead = fa3_bwd_kernel(t, kFa3BwdRankedAhead);
    ASSERT_TRUE(ranked && ahead);
    EXPECT_TRUE(ranked->sku.precision.deterministic);
    EXPECT_EQ(ranked->sku.arch, Arch::sm90a);
    EXPECT_EQ(ranked->priority, kFa3DetAhead);
    EXPECT_LT(ranked->priority, ahead->priority);
    // Below cuDNN's non-deterministic entry too, so that `fastest` keeps cuDNN where the table
    // picks it and the ranked entry fits as well.
    EXPECT_LT(ranked->priority, kCudnnAhead);
    // The deterministic default entry: above fa3's ranked-ahead one, deterministic.
    const auto* det_default = fa3_bwd_kernel(t, kFa3BwdDeterministicAhead);
    ASSERT_TRUE(det_default);
    EXPECT_TRUE(det_default->sku.precision.deterministic);
    EXPECT_EQ(det_default->priority, kFa3DetDefaultAhead);
    EXPECT_GT(det_default->priority, ahead->priority);
    // Above every other deterministic entry but the two defaults (fa3's and cuDNN's), whose rows
    // put them above every entry.
    for (const auto& k : KernelTable<attention::BackwardOp>::instance().all()) {
      if (k.sku.element == t && k.sku.precision.deterministic && k.sku.name != ranked->sku.name &&
          k.sku.name != det_default->sku.name && k.sku.name != kCudnnBwdDeterministicDefault) {
        EXPECT_GT(ranked->priority, k.priority) << k.sku.name;
      }
    }
  }
  if (found == 0) GTEST_SKIP() << "built without CUDA: fa3_bwd_sm90a is not registered";
  EXPECT_EQ(found, 2);
}

std::vector<Case> fa3_bwd_cases() {
  return {
      {DType::bf16, 2, 4, 4, 128, 128, 64, Mask::none(), false, false},
      {DType::bf16, 1, 2, 2, 1, 1, 64, Mask::none(), false, true},
      {DType::f16, 1, 2, 2, 17, 17, 128, Mask::causal_top_left(), true, true},
      // GQA 4 over several key CTAs and query blocks, a ragged tail, both layouts.
      {DType::bf16, 1, 8, 2, 197, 197, 128, Mask::causal_top_left(), true, false},
      {DType::f16, 1, 4, 2, 513, 1000, 128, Mask::none(), false, true},
      // 16 key CTAs a head over 16 query blocks: every dQ chunk gets 16 bulk reduce-adds, in
      // whatever order the CTAs reach it.
      {DType::bf16, 2, 4, 4, 1024, 2048, 128, Mask::none(), false, false},
      {DType::bf16, 1, 2, 1, 1000, 1000, 64, Mask::causal_bottom_right(), true, false},
      // MQA with Lq < Lk, bottom-right.
      {DType::f16, 2, 4, 1, 77, 203, 64, Mask::causal_bottom_right(), false, true},
      // Lq > Lk bottom-right: the first Lq - Lk rows see no key (LSE -inf, dQ 0). At D = 128 too,
      // where a chunk's first add stores (BwdParams::claims): chunks no add reaches read as 0.
      {DType::bf16, 1, 4, 2, 300, 77, 64, Mask::causal_bottom_right(), false, false},
      {DType::f16, 1, 4, 2, 300, 77, 128, Mask::causal_bottom_right(), true, false},
      // Top-left with Lq < Lk: keys past Lq are seen by no query (dK = dV = 0 there).
      {DType::bf16, 1, 2, 2, 77, 300, 128, Mask::causal_top_left(), true, true},
      {DType::f16, 1, 3, 3, 300, 77, 128, Mask::causal_top_left(), false, false},
      // Sliding windows (query blocks outside a key block's band skipped) and soft-capping.
      {DType::bf16, 1, 4, 2, 700, 700, 128, Mask::sliding_window(100, 30), false, false},
      {DType::f16, 1, 2, 2, 300, 1000, 64, Mask::sliding_window(200, 0), true, true},
      {DType::bf16, 2, 4, 4, 333, 257, 64, Mask::sliding_window(-1, 17, Diagonal::top_left), false,
       true},
      {DType::bf16, 1, 4, 2, 300, 300, 128, Mask::none(), false, false, true, 30.0},
      {DType::f16, 1, 2, 2, 257, 513, 64, Mask::causal_bottom_right(), true, true, true, 50.0},
      {DType::bf16, 1, 2, 2, 200, 260, 128, Mask::sliding_window(64, 0), false, false, true, 20.0},
      // Head dim 256 (64 keys a CTA, the warpgroups splitting the columns): GQA over several key
      // CTAs and query blocks with ragged tails, both causal alignments, a window and a cap.
      {DType::bf16, 1, 4, 2, 197, 300, 256, Mask::causal_bottom_right(), true, false},
      {DType::f16, 2, 2, 2, 130, 130, 256, Mask::none(), false, true},
      {DType::bf16, 1, 2, 1, 300, 77, 256, Mask::causal_top_left(), false, true},
      {DType::f16, 1, 2, 2, 200, 260, 256, Mask::sliding_window(64, 0), true, false, true, 20.0},
      // A large cap and scores near the cap (see fa3_cases): P and the LSE from one tanh.
      {DType::bf16, 1, 4, 2, 300, 300, 128, Mask::none(), false, false, true, 100.0},
      {DType::bf16, 1, 4, 2, 300, 300, 128, Mask::none(), false, false, true, 5.0, 0, 1.0},
  };
}

// Skips (visibly) where the backward cannot run: no GPU, not a Hopper GPU, or no sm_90a code.
#define FA3_BWD_SKIP_UNLESS_RUNNABLE()                                                         \
  BARACUDA_SKIP_IF_UNAVAILABLE(Target::cuda);                                                  \
  do {                                                                                         \
    const auto* fa3 = fa3_bwd_kernel(DType::bf16);                                             \
    const Descriptor probe = make_desc(DType::bf16, 1, 1, 1, 128, 128, 64);                    \
    if (!fa3 || !fa3->fits(problem_of(probe), harness::stream_for(Target::cuda).caps()))       \
      GTEST_SKIP() << "fa3_bwd_sm90a does not run here (needs sm_90 and a build with sm_90a)"; \
  } while (0)

// Each case through the backward kernel `name` pinned by name, against the float64 reference.
// Only kFa3BwdDeterministicKernel claims determinism (check_backward_kernel then compares its two
// runs bitwise).
void check_pinned_backward(const std::vector<Case>& cases, std::string_view name, harness::Rng& rng,
                           int reps = 2) {
  const Stream& gs = harness::stream_for(Target::cuda);
  const auto t0 = std::chrono::steady_clock::now();
  for (const Case& c : cases) {
    SCOPED_TRACE(name_of(c));
    const Descriptor desc = desc_of(c, c.t);
    const attention::Problem p = problem_of(desc);
    // The plan pinned by name reaches it and tells the truth about determinism.
    auto plan = attention::BackwardPlan::select(gs, desc, PlanPreference::kernel(name));
    BARACUDA_ASSERT_OK(plan);
    ASSERT_EQ(plan->sku().name, name);
    EXPECT_EQ(plan->precision_guarantee().deterministic,
              name.find("deterministic") != std::string_view::npos);
    const CaseData x = case_data(c, rng);
    const GpuBackwardInputs in = upload_backward(c, x);
    check_backward_kernel(c, p, *fa3_bwd_kernel(c.t, name), x.grad, in, reps);
  }
  std::printf("[ %s ] %zu cases, %.2f s\n", std::string(name).c_str(), cases.size(),
              seconds_since(t0));
}

TEST(AttentionFa3Gpu, BackwardMatchesReference) {
  FA3_BWD_SKIP_UNLESS_RUNNABLE();
  harness::Rng rng;
  check_pinned_backward(fa3_bwd_cases(), kFa3BwdKernel, rng);
}

// The deterministic instance on every D = 64 / 128 case of fa3_bwd_cases() (soft-capping, varlen
// aside, included) and on chunks that many key blocks add into one after another: 16 and 24 key
// blocks a head over every query block, causal walks of several lengths a key block (each chunk's
// run of adders starting at its diagonal), a window with both bounds. Unmasked walks rotate over
// two accumulators: far more query blocks than key blocks (a chunk's adders many steps apart),
// fewer (several key blocks starting their walks at the same place), GQA walks over four heads, and
// a window wider than the problem (unmasked, so rotated). Two runs each, bitwise equal; D = 256
// and 96 refused by name.
TEST(AttentionFa3Gpu, DeterministicBackwardMatchesReferenceAndRepeatsBitwise) {
  FA3_BWD_SKIP_UNLESS_RUNNABLE();
  harness::Rng rng;
  std::vector<Case> cases;
  for (const Case& c : fa3_bwd_cases())
    if (c.d == 64 || c.d == 128) cases.push_back(c);
  for (const Case& c : std::initializer_list<Case>{
           {DType::bf16, 1, 4, 2, 1024, 3072, 64, Mask::none(), false, false},
           {DType::f16, 2, 2, 2, 1500, 1500, 64, Mask::causal_top_left(), false, false},
           {DType::bf16, 1, 4, 4, 2000, 1800, 128, Mask::causal_bottom_right(), true, false},
           {DType::bf16, 1, 2, 1, 1100, 1300, 128, Mask::sliding_window(300, 200), false, true},
           {DType::bf16, 1, 2, 2, 3000, 300, 128, Mask::none(), false, true},
           {DType::f16, 1, 4, 1, 100, 2000, 64, Mask::none(), true, false},
           {DType::bf16, 2, 8, 2, 700, 1900, 128, Mask::none(), false, false},
           {DType::bf16, 1, 2, 2, 700, 900, 64, Mask::sliding_window(2000, 2000), false, false},
       })
    cases.push_back(c);
  check_pinned_backward(cases, kFa3BwdDeterministicKernel, rng);
  const Stream& gs = harness::stream_for(Target::cuda);
  for (int64_t dim : {256, 96}) {
    const auto plan =
        attention::BackwardPlan::select(gs, make_desc(DType::bf16, 1, 2, 2, 256, 256, dim),
                                        PlanPreference::kernel(kFa3BwdDeterministicKernel));
    EXPECT_FALSE(plan.ok()) << "D " << dim;
  }
}

// The deterministic instance's order under repetition: 16 runs each of long chains (16 key blocks
// a chunk, rotated over GQA walks; causal walks of 24 key blocks), every run bitwise equal to the
// first (and each against the reference).
TEST(AttentionFa3Gpu, DeterministicBackwardRepeatsBitwiseManyTimes) {
  FA3_BWD_SKIP_UNLESS_RUNNABLE();
  harness::Rng rng;
  check_pinned_backward(
      {{DType::bf16, 1, 4, 2, 1024, 2048, 128, Mask::none(), false, false},
       {DType::f16, 1, 2, 2, 3072, 3072, 64, Mask::causal_top_left(), true, false}},
      kFa3BwdDeterministicKernel, rng, 16);
}

// PlanPreference::deterministic() takes the ranked entry where fa3_det_leads and the table picks
// fa3 or cuDNN (`fastest` then still takes fa3's or cuDNN's non-deterministic entry), and not where
// the rule does not hold; the ranked entry against the reference, 4 bitwise runs.
// The deterministic preference's selection cases: each kFa3DetLeads row at its least rows in its
// largest group (f16 on the first row) leads; a problem just outside a row (half the rows, one row
// beyond its most where bounded, a group beyond every row of its head dim and mask, or one below
// the row's range) does not. The override tables put a point per dtype and row at the row's least
// rows (and its most where bounded), with fa3 or cuDNN the fastest candidate there.
// `run`: the leads whose float64 reference stays cheap (up to 16 heads of 2048 x 2048), which
// run against it; a row's least rows above that would be checked by its selection alone, its
// kernel by the smaller leads.
struct DetLeadCases {
  std::vector<Case> leads, others, run;
};
DetLeadCases det_lead_cases() {
  auto at = [](const DetLead& lead, int64_t hq, int64_t l, DType t = DType::bf16) {
    const Mask m = lead.causal ? Mask::causal_top_left() : Mask::none();
    return Case{t, 1, hq, 1, l, l, lead.head_dim, m, false, false};
  };
  DetLeadCases cases;
  for (const DetLead& lead : kFa3DetLeads) {
    const int64_t g = lead.max_group, rows = lead.min_rows;
    cases.leads.push_back(at(lead, g, rows, cases.leads.empty() ? DType::f16 : DType::bf16));
    if (g * rows * rows <= 16 * 2048 * 2048) cases.run.push_back(cases.leads.back());
    // Near a row's outside, where no other row reaches.
    std::vector<Case> near = {at(lead, g, rows / 2), at(lead, det_group_beyond(lead), rows)};
    if (lead.max_rows != kNoBound) near.push_back(at(lead, g, lead.max_rows + 1));
    if (lead.min_group > 1) near.push_back(at(lead, lead.min_group - 1, rows));
    for (const Case& c : near)
      if (!fa3_det_leads(problem_of(desc_of(c, c.t)))) cases.others.push_back(c);
  }
  return cases;
}
std::vector<TablePoint> det_lead_table(double cudnn, double fa3) {
  std::vector<TablePoint> points;
  for (DType t : {DType::bf16, DType::f16})
    for (const DetLead& lead : kFa3DetLeads)
      for (int64_t rows : {lead.min_rows, lead.max_rows})
        if (rows != kNoBound)
          points.push_back({t, Pass::backward, lead.head_dim, rows, lead.causal, cudnn, 1, fa3});
  return points;
}

// On the host, what the GPU test below relies on: under the fa3 table fa3 is the candidate at
// every case (within 2x of a point, where the table counts fa3's column), so that fa3_det_leads
// alone decides; under the cuDNN table cuDNN is, except where a grouped row decides instead
// (grouped_backward_pick: d128 unmasked in groups goes to fa3 under any table).
TEST(AttentionCudnnRules, DeterministicLeadCasesLieWithinTheTablesReach) {
  const DetLeadCases cases = det_lead_cases();
  const auto fa3_wins = det_lead_table(2, 3), cudnn_wins = det_lead_table(3, 2);
  int grouped = 0;
  for (const auto* list : {&cases.leads, &cases.others})
    for (const Case& c : *list) {
      SCOPED_TRACE(name_of(c));
      const attention::Problem p = problem_of(desc_of(c, c.t));
      EXPECT_EQ(fa3_det_leads(p), list == &cases.leads);
      const std::optional<Candidate> rows = grouped_backward_pick(p);
      grouped += rows.has_value();
      EXPECT_EQ(preferred_candidate(fa3_wins, p, Pass::backward, true),
                rows.value_or(Candidate::fa3));
      EXPECT_EQ(preferred_candidate(cudnn_wins, p, Pass::backward, true),
                rows.value_or(Candidate::cudnn));
    }
  EXPECT_GT(grouped, 0);  // the d128 grouped row's lead is among the cases
}

TEST(AttentionFa3Gpu, DeterministicPreferenceTakesFa3WhereItLeads) {
  FA3_BWD_SKIP_UNLESS_RUNNABLE();
  const Stream& gs = harness::stream_for(Target::cuda);
  // The kernel of the deterministic plan for c, which must exist and be deterministic.
  auto det_kernel = [&](const Case& c) {
    auto plan =
        attention::BackwardPlan::select(gs, desc_of(c, c.t), PlanPreference::deterministic());
    if (!plan.ok()) {
      ADD_FAILURE() << "no deterministic plan for " << name_of(c);
      return std::string();
    }
    EXPECT_TRUE(plan->precision_guarantee().deterministic) << plan->sku().name;
    return std::string(plan->sku().name);
  };
  const DetLeadCases cases = det_lead_cases();
  {
    const auto fa3_wins = det_lead_table(2, 3);
    const SelectionTableOverride o{fa3_wins};
    const Case& c = cases.leads[1];
    auto fastest = attention::BackwardPlan::select(gs, desc_of(c, c.t));
    BARACUDA_ASSERT_OK(fastest);
    EXPECT_EQ(fastest->sku().name, kFa3BwdRankedAhead);
    for (const Case& lead : cases.leads)
      EXPECT_EQ(det_kernel(lead), kFa3BwdDeterministicRanked) << name_of(lead);
    for (const Case& other : cases.others)
      EXPECT_NE(det_kernel(other), kFa3BwdDeterministicRanked) << name_of(other);
    harness::Rng rng;
    check_pinned_backward(cases.run, kFa3BwdDeterministicRanked, rng, 4);
  }
#if BARACUDA_HAVE_CUDNN_FRONTEND
  {
    const auto cudnn_wins = det_lead_table(3, 2);
    const SelectionTableOverride o{cudnn_wins};
    // Where the table picks cuDNN the deterministic preference still takes fa3's ranked entry
    // wherever it leads (kFa3DetAhead, between cuDNN's two entries), and `fastest` cuDNN's
    // non-deterministic one (fa3's where a grouped row picks fa3 ahead of the table).
    for (const Case& lead : cases.leads) {
      SCOPED_TRACE(name_of(lead));
      EXPECT_EQ(det_kernel(lead), kFa3BwdDeterministicRanked);
      const bool fa3 = grouped_backward_pick(problem_of(desc_of(lead, lead.t))) == Candidate::fa3;
      auto fastest = attention::BackwardPlan::select(gs, desc_of(lead, lead.t));
      BARACUDA_ASSERT_OK(fastest);
      EXPECT_EQ(fastest->sku().name, fa3 ? kFa3BwdRankedAhead : "cudnn_sdpa_bwd");
    }
    for (const Case& other : cases.others)
      EXPECT_NE(det_kernel(other), kFa3BwdDeterministicRanked) << name_of(other);
  }
#endif
}

// Shapes around each D = 64 instance's tiles. k192 (192 keys a CTA): key counts around whole CTAs
// (a partial last CTA, exactly one or two, one key past) under GQA, causal alignments and a window.
// q128 (128 query rows a step): a window and GQA, and query counts around whole steps (one short,
// one past, exactly one, two less one).
struct InstanceCase {
  std::string_view kernel;
  Case c;
};
const InstanceCase kD64InstanceCases[] = {
    {kFa3BwdK192Kernel, {DType::bf16, 1, 4, 2, 191, 191, 64, Mask::none(), false, false}},
    {kFa3BwdK192Kernel, {DType::f16, 2, 2, 2, 192, 192, 64, Mask::causal_top_left(), true, false}},
    {kFa3BwdK192Kernel,
     {DType::bf16, 1, 4, 1, 300, 193, 64, Mask::causal_bottom_right(), false, true}},
    {kFa3BwdK192Kernel, {DType::bf16, 1, 2, 2, 384, 384, 64, Mask::none(), false, false}},
    {kFa3BwdK192Kernel,
     {DType::f16, 1, 6, 2, 385, 577, 64, Mask::sliding_window(150, 20), true, true}},
    {kFa3BwdK192Kernel, {DType::bf16, 2, 4, 4, 640, 500, 64, Mask::none(), false, false}},
    {kFa3BwdQ128Kernel,
     {DType::f16, 1, 6, 2, 513, 385, 64, Mask::sliding_window(150, 20), true, true}},
    {kFa3BwdQ128Kernel, {DType::bf16, 1, 4, 2, 127, 300, 64, Mask::none(), false, false}},
    {kFa3BwdQ128Kernel,
     {DType::bf16, 1, 4, 1, 129, 257, 64, Mask::causal_bottom_right(), false, true}},
    {kFa3BwdQ128Kernel, {DType::f16, 2, 2, 2, 128, 128, 64, Mask::causal_top_left(), true, false}},
    {kFa3BwdQ128Kernel, {DType::bf16, 1, 2, 2, 255, 255, 64, Mask::none(), true, true}},
};

// A D = 64 kernel that takes no soft-capping, by name: every such case of fa3_bwd_cases() and its
// kD64InstanceCases against the reference; other head dims and soft-capping refused.
void check_d64_uncapped_backward(std::string_view kernel, harness::Rng& rng) {
  std::vector<Case> cases;
  for (const Case& c : fa3_bwd_cases())
    if (c.d == 64 && c.softcap == 0) cases.push_back(c);
  for (const InstanceCase& e : kD64InstanceCases)
    if (e.kernel == kernel) cases.push_back(e.c);
  check_pinned_backward(cases, kernel, rng);
  const Stream& gs = harness::stream_for(Target::cuda);
  const Descriptor d128 = make_desc(DType::bf16, 1, 2, 2, 256, 256, 128);
  EXPECT_FALSE(attention::BackwardPlan::select(gs, d128, PlanPreference::kernel(kernel)).ok());
  const Case capped{DType::bf16, 1, 2, 2, 256, 256, 64, Mask::none(), false, false, true, 30.0};
  EXPECT_FALSE(attention::BackwardPlan::select(gs, desc_of(capped, DType::bf16),
                                               PlanPreference::kernel(kernel))
                   .ok());
}

TEST(AttentionFa3Gpu, BackwardK192MatchesReference) {
  FA3_BWD_SKIP_UNLESS_RUNNABLE();
  harness::Rng rng;
  check_d64_uncapped_backward(kFa3BwdK192Kernel, rng);
}

// The ranked instance with its grid key block first: every fa3_bwd_cases() case (q128 where
// fa3_bwd_widens, the plain kernel otherwise, varlen and soft-capping included) and causal GQA
// problems over several batches and key heads, whose blocks the order remaps.
TEST(AttentionFa3Gpu, HeavyFirstBackwardMatchesReference) {
  FA3_BWD_SKIP_UNLESS_RUNNABLE();
  harness::Rng rng;
  std::vector<Case> cases = fa3_bwd_cases();
  cases.push_back({DType::bf16, 3, 8, 2, 700, 700, 128, Mask::causal_top_left(), false, false});
  cases.push_back({DType::f16, 2, 8, 1, 600, 900, 64, Mask::causal_bottom_right(), true, false});
  cases.push_back({DType::bf16, 2, 4, 4, 500, 500, 256, Mask::causal_top_left(), false, false});
  check_pinned_backward(cases, kFa3BwdHeavyFirstKernel, rng);
}

// GQA problems small enough that fa3_bwd_head_parts splits them: causal and windowed, both head
// dims, both diagonals, several batches and key heads, odd lengths, both memory orders, padded
// rows and soft-capping.
std::vector<Case> head_split_cases() {
  return {
      // One key head of 8 query heads, 8 key blocks: 8 parts of one head each.
      {DType::bf16, 1, 8, 1, 1000, 1000, 128, Mask::causal_top_left(), false, false},
      // Lq < Lk bottom-right, [B, L, H, D], padded rows (the f32 sum must leave the gaps).
      {DType::f16, 2, 8, 2, 700, 900, 128, Mask::causal_bottom_right(), true, true},
      // d64 (q128 steps), a group of 16, a short ragged tail.
      {DType::bf16, 3, 16, 1, 333, 333, 64, Mask::causal_top_left(), false, false},
      // Lq > Lk top-left: the last query rows see every key.
      {DType::bf16, 1, 4, 2, 1500, 1200, 64, Mask::causal_top_left(), false, true},
      // A window with both bounds: walks of about one length, short.
      {DType::f16, 2, 4, 1, 800, 800, 128, Mask::sliding_window(200, 50), false, false},
      // Soft-capping, groups of 2.
      {DType::bf16, 1, 8, 4, 517, 517, 128, Mask::causal_top_left(), false, false, true, 30.0},
  };
}

// The ranked instance with each key block's walk split over the group's heads: causal and windowed
// GQA problems small enough that head_parts splits them (its workspace, the f32 shares, larger
// than the unsplit instance's), over both head dims (q128 where fa3_bwd_widens), both diagonals,
// several batches and key heads, odd lengths, both memory orders, padded rows (whose gaps the sum
// must leave untouched) and soft-capping; then every fa3_bwd_cases() case, most of which it runs
// unsplit (MHA, unmasked, varlen, D = 256). The instances of 2, 4 and 8 parts by force run the
// split cases whose group they divide and refuse the others.
TEST(AttentionFa3Gpu, HeadSplitBackwardMatchesReference) {
  FA3_BWD_SKIP_UNLESS_RUNNABLE();
  harness::Rng rng;
  const Stream& gs = harness::stream_for(Target::cuda);
  const std::vector<Case> split = head_split_cases();
  for (const Case& c : split) {
    SCOPED_TRACE(name_of(c));
    const Descriptor desc = desc_of(c, c.t);
    auto whole = attention::BackwardPlan::select(gs, desc, PlanPreference::kernel(kFa3BwdKernel));
    auto parts =
        attention::BackwardPlan::select(gs, desc, PlanPreference::kernel(kFa3BwdHeadSplitKernel));
    BARACUDA_ASSERT_OK(whole);
    BARACUDA_ASSERT_OK(parts);
    EXPECT_GT(parts->workspace_size(), whole->workspace_size()) << "head_parts did not split it";
  }
  check_pinned_backward(split, kFa3BwdHeadSplitKernel, rng);
  check_pinned_backward(split, kFa3BwdHeadSplitHeavyFirstKernel, rng);
  // Falling walks (every masked and unmasked case, split or whole by its model).
  check_pinned_backward(split, kFa3BwdFallingKernel, rng);
  check_pinned_backward(fa3_bwd_cases(), kFa3BwdFallingKernel, rng);
  // The ranked entry's launch by name, with the accumulator zeroed (no claims:
  // BwdParams::claims) and with claims at every length.
  check_pinned_backward(split, kFa3BwdRankedKernel, rng);
  check_pinned_backward(split, kFa3BwdRankedZeroedKernel, rng);
  check_pinned_backward(fa3_bwd_cases(), kFa3BwdRankedZeroedKernel, rng);
  check_pinned_backward(split, kFa3BwdRankedClaimsKernel, rng);
  check_pinned_backward(fa3_bwd_cases(), kFa3BwdRankedClaimsKernel, rng);
  // The forced splits (_x2 / _x4 / _x8) on the cases whose group they divide; refused elsewhere.
  for (int i = 0; i < 3; ++i) {
    const int64_t parts = int64_t{2} << i;
    std::vector<Case> fit;
    for (const Case& c : split) {
      if (c.hq / c.hk % parts == 0) {
        fit.push_back(c);
        continue;
      }
      EXPECT_FALSE(attention::BackwardPlan::select(
                       gs, desc_of(c, c.t), PlanPreference::kernel(kFa3BwdHeadSplitPartsKernels[i]))
                       .ok())
          << name_of(c) << ": " << kFa3BwdHeadSplitPartsKernels[i];
    }
    check_pinned_backward(fit, kFa3BwdHeadSplitPartsKernels[i], rng);
  }
  check_pinned_backward(fa3_bwd_cases(), kFa3BwdHeadSplitKernel, rng);
}

// The deterministic instance split over the group's heads: the split cases (their workspace larger
// than the unsplit deterministic instance's) and unmasked GQA walks, which rotate over two
// accumulators within each part's walk (8 parts of a group of 16 over 8 key blocks; 2 parts of a
// group of 4 with more query blocks than key blocks); each against the reference and rerun
// bitwise.
TEST(AttentionFa3Gpu, DeterministicHeadSplitBackwardMatchesReferenceAndRepeatsBitwise) {
  FA3_BWD_SKIP_UNLESS_RUNNABLE();
  harness::Rng rng;
  const Stream& gs = harness::stream_for(Target::cuda);
  std::vector<Case> cases = head_split_cases();
  cases.push_back({DType::bf16, 1, 16, 1, 1024, 1024, 128, Mask::none(), false, false});
  cases.push_back({DType::f16, 1, 8, 2, 1100, 600, 64, Mask::none(), true, false});
  for (const Case& c : cases) {
    SCOPED_TRACE(name_of(c));
    auto whole = attention::BackwardPlan::select(
        gs, desc_of(c, c.t), PlanPreference::kernel(kFa3BwdDeterministicKernel));
    auto parts = attention::BackwardPlan::select(
        gs, desc_of(c, c.t), PlanPreference::kernel(kFa3BwdDeterministicHeadSplitKernel));
    BARACUDA_ASSERT_OK(whole);
    BARACUDA_ASSERT_OK(parts);
    EXPECT_GT(parts->workspace_size(), whole->workspace_size()) << "head_parts did not split it";
    // Unmasked (rotated walks, two accumulator halves): the second half holds a part's first head
    // only, so the unsplit instance needs less than two whole f32 accumulators in groups.
    if (c.mask.is_none() && c.hq > c.hk) {
      const size_t lq_pad = static_cast<size_t>((c.lq + 127) / 128 * 128);
      EXPECT_LT(whole->workspace_size(), 2 * static_cast<size_t>(c.b * c.hq * c.d) * lq_pad * 4);
    }
  }
  check_pinned_backward(cases, kFa3BwdDeterministicHeadSplitKernel, rng, 3);
  // The heaviest walks first (rising adds where the walks do not rotate): the same cases and the
  // deterministic instance's own, three runs bitwise each.
  std::vector<Case> more = cases;
  for (const Case& c : fa3_bwd_cases())
    if (c.d == 64 || c.d == 128) more.push_back(c);
  check_pinned_backward(more, kFa3BwdDeterministicHeavyFirstKernel, rng, 3);
}

// And the ranked-ahead entry, which launches q128 where fa3_bwd_widens.
TEST(AttentionFa3Gpu, BackwardQ128MatchesReference) {
  FA3_BWD_SKIP_UNLESS_RUNNABLE();
  harness::Rng rng;
  check_d64_uncapped_backward(kFa3BwdQ128Kernel, rng);
  const Stream& gs = harness::stream_for(Target::cuda);
  // Under a table that picks fa3 there.
  {
    const TablePoint fa3_wins[] = {
        {DType::bf16, Pass::backward, 64, kFa3BwdWideMinRows, false, 2, 1, 3}};
    const SelectionTableOverride o{fa3_wins};
    const Case c{DType::bf16,  1,     2,    1, kFa3BwdWideMinRows, kFa3BwdWideMinRows, 64,
                 Mask::none(), false, false};
    SCOPED_TRACE("ranked ahead: " + name_of(c));
    const attention::Problem p = problem_of(desc_of(c, c.t));
    ASSERT_EQ(fa3_ranked_backward_kernel(p), kFa3BwdQ128Kernel);
    auto def = attention::BackwardPlan::select(gs, desc_of(c, c.t));
    BARACUDA_ASSERT_OK(def);
    ASSERT_EQ(def->sku().name, kFa3BwdRankedAhead);
    const CaseData x = case_data(c, rng);
    const GpuBackwardInputs in = upload_backward(c, x);
    check_backward_kernel(c, p, *fa3_bwd_kernel(c.t, kFa3BwdRankedAhead), x.grad, in);
  }
}

TEST(AttentionFa3Gpu, BackwardFitsWhatTheForwardFitsAndNeverServesDeterministic) {
  FA3_BWD_SKIP_UNLESS_RUNNABLE();
  const Stream& gs = harness::stream_for(Target::cuda);
  for (const Descriptor& d :
       {make_desc(DType::bf16, 1, 8, 2, 77, 203, 64, Mask::causal_bottom_right()),
        make_desc(DType::f16, 1, 4, 4, 64, 64, 96),
        make_desc(DType::bf16, 1, 4, 4, 64, 64, 64, Mask::sliding_window(16, 0)),
        make_desc(DType::f16, 1, 8, 1, 203, 77, 128, Mask::causal_top_left())}) {
    const attention::Problem p = problem_of(d);
    EXPECT_EQ(fa3_bwd_kernel(d.dtype)->fits(p, gs.caps()), fa3_kernel(d.dtype)->fits(p, gs.caps()))
        << to_string(d.mask) << " D" << d.head_dim_qk;
    auto det = attention::BackwardPlan::select(gs, d, PlanPreference::deterministic());
    BARACUDA_ASSERT_OK(det);
    EXPECT_NE(det->sku().name, kFa3BwdKernel);
    EXPECT_TRUE(det->precision_guarantee().deterministic);
  }
  // A CTA's step count (query blocks x the group's query heads) is an int with headroom: 2^23
  // query blocks x a group of 512 is refused, where the forward (one CTA per query block and
  // head) still fits.
  const attention::Problem huge =
      problem_of(make_desc(DType::bf16, 1, 512, 1, int64_t{1} << 29, 128, 64));
  EXPECT_FALSE(fa3_bwd_kernel(DType::bf16)->fits(huge, gs.caps()));
  EXPECT_TRUE(fa3_kernel(DType::bf16)->fits(huge, gs.caps()));
  // Head dim 256 both ways; Dk = 192 with Dv = 128 (MLA) the forward only.
  const attention::Problem d256 = problem_of(make_desc(DType::bf16, 1, 4, 4, 300, 300, 256));
  EXPECT_TRUE(fa3_kernel(DType::bf16)->fits(d256, gs.caps()));
  EXPECT_TRUE(fa3_bwd_kernel(DType::bf16)->fits(d256, gs.caps()));
  Descriptor mla = make_desc(DType::bf16, 1, 4, 4, 300, 300, 192);
  mla.head_dim_v = 128;
  EXPECT_TRUE(fa3_kernel(DType::bf16)->fits(problem_of(mla), gs.caps()));
  EXPECT_FALSE(fa3_bwd_kernel(DType::bf16)->fits(problem_of(mla), gs.caps()));
}

TEST(AttentionFa3Gpu, BackwardMisalignedRunFailsWithoutWriting) {
  FA3_BWD_SKIP_UNLESS_RUNNABLE();
  const Stream& gs = harness::stream_for(Target::cuda);
  const Case c{DType::bf16, 1, 2, 2, 64, 64, 64, Mask::none(), false, false};
  const Descriptor desc = make_desc(c.t, c.b, c.hq, c.hk, c.lq, c.lk, c.d);
  auto plan = attention::BackwardPlan::select(gs, desc, PlanPreference::kernel(kFa3BwdKernel));
  BARACUDA_ASSERT_OK(plan);
  harness::Rng rng;
  // dY one element into its buffer: valid for the family's rules, not for TMA.
  TestTensor off =
      TestTensor::with_strides(c.t, {1, 2, 64, 64}, {8192, 4096, 64, 1}, 1, Target::cuda);
  TestTensor q = gpu_tensor(c, c.t, 2, 64, 64), y = gpu_tensor(c, c.t, 2, 64, 64);
  TestTensor lse = gpu_lse(c);
  for (TestTensor* t : {&off, &q, &y, &lse}) t->fill_random(rng);
  TestTensor dq = gpu_tensor(c, c.t, 2, 64, 64), dk = gpu_tensor(c, c.t, 2, 64, 64),
             dv = gpu_tensor(c, c.t, 2, 64, 64);
  for (TestTensor* t : {&dq, &dk, &dv}) t->poison();
  const auto before = {dq.bytes(), dk.bytes(), dv.bytes()};
  const Workspace_ ws = workspace_of(plan->workspace_size());
  const attention::BackwardArguments args{q.cview(),   q.cview(),   q.cview(), y.cview(),
                                          off.cview(), lse.cview(), dq.view(), dk.view(),
                                          dv.view(),   {},          {}};
  for (const Status& st : {plan->can_implement(args), plan->run(gs, ws.get(), args)})
    EXPECT_TRUE(fails_with(st, ErrorKind::misaligned_operand,
                           {"attention_backward: fa3_bwd_sm90a: dy: data is not 16-byte aligned"}));
  BARACUDA_ASSERT_OK(gs.synchronize());
  auto it = before.begin();
  for (TestTensor* t : {&dq, &dk, &dv}) EXPECT_TRUE(harness::bytes_equal(*it++, t->bytes(), "out"));
}

// The default backward plan under tables that make each candidate fastest: fa3's ranked-ahead
// entry where fa3 wins (a deterministic plan then still gets a deterministic kernel: cuDNN's
// where the table ranks it over the bespoke one), cuDNN or the family's kernel elsewhere.
TEST(AttentionFa3Gpu, DefaultBackwardPlanFollowsTheTable) {
  FA3_BWD_SKIP_UNLESS_RUNNABLE();
  const Stream& gs = harness::stream_for(Target::cuda);
  const Descriptor desc = make_desc(DType::bf16, 1, 4, 2, 300, 300, 128, Mask::causal_top_left());
  auto table_for = [](double cudnn, double bespoke, double fa3) {
    return TablePoint{DType::bf16, Pass::backward, 128, 512, true, cudnn, bespoke, fa3};
  };
  const TablePoint fa3_wins[] = {table_for(2, 1, 3)};
  {
    const SelectionTableOverride o{fa3_wins};
    auto def = attention::BackwardPlan::select(gs, desc);
    BARACUDA_ASSERT_OK(def);
    EXPECT_EQ(def->sku().name, kFa3BwdRankedAhead);
    EXPECT_FALSE(def->precision_guarantee().deterministic);
    auto det = attention::BackwardPlan::select(gs, desc, PlanPreference::deterministic());
    BARACUDA_ASSERT_OK(det);
    EXPECT_TRUE(det->precision_guarantee().deterministic);
    EXPECT_FALSE(det->sku().name.starts_with("fa3_")) << det->sku().name;
#if BARACUDA_HAVE_CUDNN_FRONTEND
    EXPECT_EQ(det->sku().backend, Backend::cudnn) << det->sku().name;
#endif
  }
  expect_default_follows_cudnn_and_bespoke_tables<attention::BackwardPlan>(desc, Pass::backward,
                                                                           kFa3BwdRankedAhead);
}

// In GQA groups the default backward follows kGroupedBackwardPicks ahead of the shipped table: d128
// unmasked in groups of 4 at L1024 (a cuDNN point of the table) takes fa3's ranked entry, and the
// deterministic preference fa3's deterministic one there (kFa3DetLeads' grouped row), each against
// the reference; causal in groups of 16 takes the ranked entry too, split over the group's heads.
TEST(AttentionFa3Gpu, DefaultGroupedBackwardFollowsTheMeasuredRows) {
  FA3_BWD_SKIP_UNLESS_RUNNABLE();
  const Stream& gs = harness::stream_for(Target::cuda);
  const Case grouped{DType::bf16, 1, 16, 4, 1024, 1024, 128, Mask::none(), false, false};
  auto def = attention::BackwardPlan::select(gs, desc_of(grouped, grouped.t));
  BARACUDA_ASSERT_OK(def);
  EXPECT_EQ(def->sku().name, kFa3BwdRankedAhead);
  auto det = attention::BackwardPlan::select(gs, desc_of(grouped, grouped.t),
                                             PlanPreference::deterministic());
  BARACUDA_ASSERT_OK(det);
  EXPECT_EQ(det->sku().name, kFa3BwdDeterministicRanked);
  EXPECT_TRUE(det->precision_guarantee().deterministic);
  harness::Rng rng;
  check_pinned_backward({grouped}, kFa3BwdRankedAhead, rng);
  check_pinned_backward({grouped}, kFa3BwdDeterministicRanked, rng, 2);
  // Causal in groups of 16: the ranked entry, its walks split over the group's heads (its workspace
  // holding the f32 shares: larger than the unsplit kernel's).
  const Case causal{DType::bf16, 1, 16, 1, 1024, 1024, 128, Mask::causal_top_left(), false, false};
  auto split = attention::BackwardPlan::select(gs, desc_of(causal, causal.t));
  BARACUDA_ASSERT_OK(split);
  EXPECT_EQ(split->sku().name, kFa3BwdRankedAhead);
  auto whole = attention::BackwardPlan::select(gs, desc_of(causal, causal.t),
                                               PlanPreference::kernel(kFa3BwdKernel));
  BARACUDA_ASSERT_OK(whole);
  EXPECT_GT(split->workspace_size(), whole->workspace_size());
  check_pinned_backward({causal}, kFa3BwdRankedAhead, rng);
  // Where kFa3BwdFallingPicks says (d128 causal in groups of 4 at L1024, few key rows; d64 in
  // groups of 16 at L512): the ranked entry with fa3_bwd_sm90a_falling's walks and workspace.
  const std::vector<Case> falls = {
      {DType::bf16, 1, 8, 2, 1024, 1024, 128, Mask::causal_top_left(), false, false},
      {DType::f16, 1, 16, 1, 512, 512, 64, Mask::causal_top_left(), false, false}};
  for (const Case& c : falls) {
    SCOPED_TRACE(name_of(c));
    ASSERT_TRUE(fa3_bwd_falls(problem_of(desc_of(c, c.t))));
    auto ranked = attention::BackwardPlan::select(gs, desc_of(c, c.t),
                                                  PlanPreference::kernel(kFa3BwdRankedAhead));
    auto falling = attention::BackwardPlan::select(gs, desc_of(c, c.t),
                                                   PlanPreference::kernel(kFa3BwdFallingKernel));
    BARACUDA_ASSERT_OK(ranked);
    BARACUDA_ASSERT_OK(falling);
    EXPECT_EQ(ranked->workspace_size(), falling->workspace_size());
  }
  check_pinned_backward(falls, kFa3BwdRankedAhead, rng);
}

TestTensor odd_pitch_tensor(const Case& c, DType t, int64_t h, int64_t l, int64_t d);
TestTensor odd_pitch_copy(const Case& c, const TestTensor& from, int64_t h, int64_t l);

// The default backward where kFa3BwdDeterministicPicks or kCudnnBwdDeterministicPicks says
// (sweep points of 4k to 64k tokens, too large for the float64 reference): their entry,
// deterministic, also under deterministic(); two runs into poisoned outputs bitwise equal, and
// within the reduction tolerance of fa3_bwd_sm90a by name (reference-tested on smaller cases) on
// the same inputs, Y and LSE from the GPU forward; and its fallback's runs of odd-pitch views
// (deterministic too). The cases: groups of 8 (rising), of 4 in f16, ungrouped at L2048, where the
// table picks cuDNN (falling); unmasked in groups of 16 at L1024 (rotated walks); ungrouped at 4k
// tokens L2048 (rising; the table picks cuDNN); 64k tokens in groups of 4 at L512 (falling);
// ungrouped at L512, where cuDNN's deterministic algorithm is the default.
TEST(AttentionFa3Gpu, DefaultBackwardIsDeterministicWhereItsRowsSay) {
  FA3_BWD_SKIP_UNLESS_RUNNABLE();
  const Stream& gs = harness::stream_for(Target::cuda);
  harness::Rng rng;
  std::vector<Case> cases = {
      {DType::bf16, 32, 16, 2, 512, 512, 128, Mask::causal_top_left(), false, false},
      {DType::f16, 8, 16, 4, 2048, 2048, 128, Mask::causal_top_left(), false, false},
      {DType::bf16, 8, 16, 16, 2048, 2048, 128, Mask::causal_top_left(), false, false},
      {DType::bf16, 16, 16, 1, 1024, 1024, 128, Mask::none(), false, false},
      {DType::bf16, 2, 16, 16, 2048, 2048, 128, Mask::causal_top_left(), false, false},
      {DType::bf16, 128, 16, 4, 512, 512, 128, Mask::causal_top_left(), false, false}};
#if BARACUDA_HAVE_CUDNN_FRONTEND
  // cuDNN's deterministic algorithm as the default (kCudnnBwdDeterministicPicks).
  cases.push_back({DType::bf16, 32, 16, 16, 512, 512, 128, Mask::causal_top_left(), false, false});
#endif
  for (const Case& c : cases) {
    SCOPED_TRACE(name_of(c));
    const Descriptor desc = desc_of(c, c.t);
    const attention::Problem p = problem_of(desc);
    const bool cudnn = cudnn_bwd_deterministic_default(p);
    ASSERT_TRUE(cudnn || fa3_bwd_deterministic_default(p));
    const std::string_view kernel =
        cudnn ? kCudnnBwdDeterministicDefault : kFa3BwdDeterministicAhead;
    auto def = attention::BackwardPlan::select(gs, desc);
    auto det = attention::BackwardPlan::select(gs, desc, PlanPreference::deterministic());
    auto whole = attention::BackwardPlan::select(gs, desc, PlanPreference::kernel(kFa3BwdKernel));
    auto fwd = attention::ForwardPlan::select(gs, desc);
    BARACUDA_ASSERT_OK(def);
    BARACUDA_ASSERT_OK(det);
    BARACUDA_ASSERT_OK(whole);
    BARACUDA_ASSERT_OK(fwd);
    EXPECT_EQ(def->sku().name, kernel);
    EXPECT_EQ(det->sku().name, kernel);
    EXPECT_TRUE(def->precision_guarantee().deterministic);
    // Views fa3 refuses run on a general kernel that keeps the promise (Plan::select).
    ASSERT_NE(def->fallback_sku(), nullptr);
    EXPECT_TRUE(def->fallback_sku()->precision.deterministic) << def->fallback_sku()->name;
    const GpuBackwardInputs in{
        upload(c, cpu_tensor(c.t, {c.b, c.hq, c.lq, c.d}, &rng), c.hq, c.lq, c.d),
        upload(c, cpu_tensor(c.t, {c.b, c.hk, c.lk, c.d}, &rng), c.hk, c.lk, c.d),
        upload(c, cpu_tensor(c.t, {c.b, c.hk, c.lk, c.d}, &rng), c.hk, c.lk, c.d),
        upload(c, cpu_tensor(c.t, {c.b, c.hq, c.lq, c.d}, &rng), c.hq, c.lq, c.d),
        gpu_tensor(c, c.t, c.hq, c.lq, c.d),
        gpu_lse(c)};
    const Workspace_ fws = workspace_of(fwd->workspace_size());
    BARACUDA_ASSERT_OK(
        fwd->run(gs, fws.get(),
                 {in.q.cview(), in.k.cview(), in.v.cview(), in.y.view(), in.lse.view(), {}, {}}));
    TestTensor dq = gpu_tensor(c, c.t, c.hq, c.lq, c.d), dk = gpu_tensor(c, c.t, c.hk, c.lk, c.d),
               dv = gpu_tensor(c, c.t, c.hk, c.lk, c.d);
    // dQ, dK, dV of one plan's run into poisoned outputs.
    auto run = [&](const attention::BackwardPlan& plan) {
      const Workspace_ ws = workspace_of(plan.workspace_size());
      for (TestTensor* t : {&dq, &dk, &dv}) t->poison();
      EXPECT_TRUE(plan.run(gs, ws.get(), in.args(dq, dk, dv)).ok());
      EXPECT_TRUE(gs.synchronize().ok());
      return std::array{dq.bytes(), dk.bytes(), dv.bytes()};
    };
    const auto first = run(*def), second = run(*def);
    for (int i = 0; i < 3; ++i)
      EXPECT_TRUE(harness::bytes_equal(first[static_cast<size_t>(i)],
                                       second[static_cast<size_t>(i)], "run 1 vs run 2"));
    const std::vector<double> det_dq = dq.values(), det_dk = dk.values(), det_dv = dv.values();
    run(*whole);
    EXPECT_TRUE(harness::close_to(det_dq, dq.values(), c.t, Accuracy::reduction, "dq"));
    EXPECT_TRUE(harness::close_to(det_dk, dk.values(), c.t, Accuracy::reduction, "dk"));
    EXPECT_TRUE(harness::close_to(det_dv, dv.values(), c.t, Accuracy::reduction, "dv"));
    // The same problem in odd-pitch views, which fa3's TMA rules refuse: the plan's deterministic
    // fallback runs them, twice bitwise equal, within tolerance of the aligned run, the views' gaps
    // untouched (first case only: the fallback is the sm_80 kernel).
    if (&c != &cases.front()) continue;
    const GpuBackwardInputs odd_in{
        odd_pitch_copy(c, in.q, c.hq, c.lq), odd_pitch_copy(c, in.k, c.hk, c.lk),
        odd_pitch_copy(c, in.v, c.hk, c.lk), odd_pitch_copy(c, in.dy, c.hq, c.lq),
        odd_pitch_copy(c, in.y, c.hq, c.lq), gpu_lse(c)};
    TestTensor odq = odd_pitch_tensor(c, c.t, c.hq, c.lq, c.d),
               odk = odd_pitch_tensor(c, c.t, c.hk, c.lk, c.d),
               odv = odd_pitch_tensor(c, c.t, c.hk, c.lk, c.d);
    const attention::BackwardArguments odd_args = odd_in.args(odq, odk, odv, &in.lse);
    EXPECT_EQ(def->sku(odd_args).name, def->fallback_sku()->name);
    const Workspace_ ows = workspace_of(def->workspace_size(odd_args));
    std::vector<std::vector<uint8_t>> odd_runs;
    for (int rep = 0; rep < 2; ++rep) {
      for (TestTensor* t : {&odq, &odk, &odv}) t->poison();
      const auto q_before = odq.bytes(), k_before = odk.bytes(), v_before = odv.bytes();
      BARACUDA_ASSERT_OK(def->run(gs, ows.get(), odd_args));
      BARACUDA_ASSERT_OK(gs.synchronize());
      EXPECT_TRUE(harness::untouched_outside(q_before, odq.bytes(), odq.bit_mask(), "dq"));
      EXPECT_TRUE(harness::untouched_outside(k_before, odk.bytes(), odk.bit_mask(), "dk"));
      EXPECT_TRUE(harness::untouched_outside(v_before, odv.bytes(), odv.bit_mask(), "dv"));
      for (TestTensor* t : {&odq, &odk, &odv}) odd_runs.push_back(t->bytes());
    }
    for (size_t i = 0; i < 3; ++i)
      EXPECT_TRUE(harness::bytes_equal(odd_runs[i], odd_runs[i + 3], "fallback run 1 vs run 2"));
    EXPECT_TRUE(harness::close_to(det_dq, odq.values(), c.t, Accuracy::reduction, "odd dq"));
    EXPECT_TRUE(harness::close_to(det_dk, odk.values(), c.t, Accuracy::reduction, "odd dk"));
    EXPECT_TRUE(harness::close_to(det_dv, odv.values(), c.t, Accuracy::reduction, "odd dv"));
  }
}

// ---- The default plan on views its kernel's own rules refuse -----------------------------------
// Rows one element past a 16-byte pitch, starting one element into their buffers: valid attention
// arguments (the family's rules), refused by cuDNN's and fa3's (Kernel::check). Under tables that
// make cuDNN, then fa3, the default, the plan must run such views on the family's kernels (its
// fallback) and aligned ones on its own kernel, each against the float64 reference.
TestTensor odd_pitch_tensor(const Case& c, DType t, int64_t h, int64_t l, int64_t d) {
  return TestTensor::with_strides(t, {c.b, h, l, d}, {h * l * (d + 1), l * (d + 1), d + 1, 1}, 1,
                                  Target::cuda);
}
// An odd-pitch view holding `from`'s values (h heads of l rows).
TestTensor odd_pitch_copy(const Case& c, const TestTensor& from, int64_t h, int64_t l) {
  TestTensor g = odd_pitch_tensor(c, from.dtype(), h, l, c.d);
  g.set_values(from.values());
  return g;
}
// The backward's inputs (forward: q, k, v) in odd-pitch views; LSE as upload_backward lays it.
GpuBackwardInputs upload_odd_pitch(const Case& c, const CaseData& x) {
  GpuBackwardInputs g{odd_pitch_copy(c, x.q, c.hq, c.lq),     odd_pitch_copy(c, x.k, c.hk, c.lk),
                      odd_pitch_copy(c, x.v, c.hk, c.lk),     odd_pitch_copy(c, x.dy, c.hq, c.lq),
                      odd_pitch_copy(c, x.y_ref, c.hq, c.lq), gpu_lse(c)};
  g.lse.set_values(x.lse_ref.values());
  return g;
}

void expect_fallback_forward(const attention::ForwardPlan& plan, const Case& c, const CaseData& x,
                             const GpuBackwardInputs& aligned) {
  ASSERT_NE(plan.fallback_sku(), nullptr) << plan.sku().name;
  const KernelSku fallback = *plan.fallback_sku();
  EXPECT_EQ(fallback.backend, Backend::bespoke_cuda) << fallback.name;
  EXPECT_EQ(to_string(plan.precision_guarantee()),
            to_string(detail::weakest(plan.sku().precision, fallback.precision)));
  const GpuBackwardInputs odd_in = upload_odd_pitch(c, x);
  const std::vector<double> vv = x.v.values();
  for (bool odd : {false, true}) {
    SCOPED_TRACE(odd ? "odd-pitch views" : "aligned views");
    TestTensor y =
        odd ? odd_pitch_tensor(c, c.t, c.hq, c.lq, c.d) : gpu_tensor(c, c.t, c.hq, c.lq, c.d);
    TestTensor lse = gpu_lse(c);
    const GpuBackwardInputs& in = odd ? odd_in : aligned;
    const attention::ForwardArguments args{
        in.q.cview(), in.k.cview(), in.v.cview(), y.view(), lse.view(), {}, {}};
    BARACUDA_ASSERT_OK(plan.can_implement(args));
    EXPECT_EQ(plan.sku(args).name, odd ? fallback.name : plan.sku().name);
    EXPECT_LE(plan.workspace_size(args), plan.workspace_size());
    const Workspace_ ws = workspace_of(plan.workspace_size(args));  // exactly what this run needs
    run_twice_poisoned(plan, ws, args, y, lse);  // bitwise equal: both kernels are deterministic
    check_forward_output(c, vv, y.values(), lse.values(), x.fwd, x.rows, plan.sku(args).name);
  }
}

void expect_fallback_backward(const attention::BackwardPlan& plan, const Case& c, const CaseData& x,
                              const GpuBackwardInputs& aligned) {
  const Stream& gs = harness::stream_for(Target::cuda);
  ASSERT_NE(plan.fallback_sku(), nullptr) << plan.sku().name;
  const KernelSku fallback = *plan.fallback_sku();
  EXPECT_EQ(fallback.backend, Backend::bespoke_cuda) << fallback.name;
  EXPECT_EQ(plan.precision_guarantee().deterministic,
            plan.sku().precision.deterministic && fallback.precision.deterministic);
  const GpuBackwardInputs odd_in = upload_odd_pitch(c, x);
  for (bool odd : {false, true}) {
    SCOPED_TRACE(odd ? "odd-pitch views" : "aligned views");
    TestTensor dq = odd ? odd_pitch_tensor(c, c.t, c.hq, c.lq, c.d)
                        : gpu_tensor(c, c.t, c.hq, c.lq, c.d),
               dk = odd ? odd_pitch_tensor(c, c.t, c.hk, c.lk, c.d)
                        : gpu_tensor(c, c.t, c.hk, c.lk, c.d),
               dv = odd ? odd_pitch_tensor(c, c.t, c.hk, c.lk, c.d)
                        : gpu_tensor(c, c.t, c.hk, c.lk, c.d);
    const GpuBackwardInputs& in = odd ? odd_in : aligned;
    const attention::BackwardArguments args = in.args(dq, dk, dv, &aligned.lse);
    BARACUDA_ASSERT_OK(plan.can_implement(args));
    EXPECT_EQ(plan.sku(args).name, odd ? fallback.name : plan.sku().name);
    const Workspace_ ws = workspace_of(plan.workspace_size(args));
    std::vector<std::vector<uint8_t>> runs;
    for (int rep = 0; rep < 2; ++rep) {
      for (TestTensor* t : {&dq, &dk, &dv}) t->poison();
      const auto q_before = dq.bytes(), k_before = dk.bytes(), v_before = dv.bytes();
      BARACUDA_ASSERT_OK(plan.run(gs, ws.get(), args));
      BARACUDA_ASSERT_OK(gs.synchronize());
      EXPECT_TRUE(harness::close_to(dq.values(), x.grad.dq, c.t, Accuracy::reduction, "dq"));
      EXPECT_TRUE(harness::close_to(dk.values(), x.grad.dk, c.t, Accuracy::reduction, "dk"));
      EXPECT_TRUE(harness::close_to(dv.values(), x.grad.dv, c.t, Accuracy::reduction, "dv"));
      EXPECT_TRUE(harness::untouched_outside(q_before, dq.bytes(), dq.bit_mask(), "dq"));
      EXPECT_TRUE(harness::untouched_outside(k_before, dk.bytes(), dk.bit_mask(), "dk"));
      EXPECT_TRUE(harness::untouched_outside(v_before, dv.bytes(), dv.bit_mask(), "dv"));
      for (TestTensor* t : {&dq, &dk, &dv}) runs.push_back(t->bytes());
    }
    if (plan.precision_guarantee().deterministic) {
      for (int i = 0; i < 3; ++i)
        EXPECT_TRUE(harness::bytes_equal(runs[i], runs[i + 3], "backward run 1 vs run 2"));
    }
  }
}

// The table's bespoke column (bench_attention attention_hopper) selects only(bespoke_cuda) under
// bespoke_pick_points: the family's kernels, never an fa3 entry, at sweep points where fa3's
// deterministic entries fit under an empty table (the eighty-sixth session's first table run timed
// them as the bespoke column at d64 from L512 and d128 from L2048). Select only: nothing runs.
TEST(AttentionHopperGpu, BespokePickSelectsTheFamilysKernels) {
  BARACUDA_SKIP_IF_UNAVAILABLE(Target::cuda);
  const Stream& gs = harness::stream_for(Target::cuda);
  int empty_table_fa3 = 0;
  for (int64_t d : {64, 128})
    for (int64_t l : {2048, 4096, 16384})
      for (bool causal : {false, true}) {
        const Mask m = causal ? Mask::causal_top_left() : Mask::none();
        const Descriptor desc = make_desc(DType::bf16, 16384 / l, 2048 / d, 2048 / d, l, l, d, m);
        SCOPED_TRACE("D" + std::to_string(d) + " L" + std::to_string(l) +
                     (causal ? " causal" : ""));
        const PlanPreference bespoke = PlanPreference::only(Backend::bespoke_cuda);
        {
          const SelectionTableOverride none{std::span<const TablePoint>{}};
          auto bwd = attention::BackwardPlan::select(gs, desc, bespoke);
          BARACUDA_ASSERT_OK(bwd);
          empty_table_fa3 += bwd->sku().name.starts_with("fa3_") ? 1 : 0;
        }
        const auto points = bespoke_pick_points(DType::bf16);
        const SelectionTableOverride pick{points};
        auto fwd = attention::ForwardPlan::select(gs, desc, bespoke);
        auto bwd = attention::BackwardPlan::select(gs, desc, bespoke);
        BARACUDA_ASSERT_OK(fwd);
        BARACUDA_ASSERT_OK(bwd);
        for (std::string_view kernel : {fwd->sku().name, bwd->sku().name}) {
          EXPECT_FALSE(kernel.starts_with("fa3_")) << kernel;
          EXPECT_TRUE(kernel.starts_with("flash_")) << kernel;
        }
        EXPECT_EQ(bwd->sku().backend, Backend::bespoke_cuda);
      }
  // On sm_90a with fa3 built the empty table lets its deterministic entries in at some of these
  // points; elsewhere nothing of fa3's fits and the count is 0.
  std::printf(
      "[baracuda] only(bespoke_cuda) under an empty table: an fa3 entry at %d of 12 points\n",
      empty_table_fa3);
}

TEST(AttentionHopperGpu, DefaultPlanRunsViewsItsKernelRefusesOnTheFamilyKernels) {
  BARACUDA_SKIP_IF_UNAVAILABLE(Target::cuda);
  const Stream& gs = harness::stream_for(Target::cuda);
  harness::Rng rng;
  const Case c{DType::bf16, 1, 4, 2, 200, 200, 128, Mask::causal_top_left(), false, false};
  const Descriptor desc = desc_of(c, c.t);
  const CaseData x = case_data(c, rng);
  const GpuBackwardInputs aligned = upload_backward(c, x);
  // At L = 256 (fa3 is a candidate only with Lq within 2x of the point's length).
  auto points = [](double cudnn, double bespoke, double fa3) {
    return std::array<TablePoint, 2>{
        TablePoint{DType::bf16, Pass::forward, 128, 256, true, cudnn, bespoke, fa3},
        TablePoint{DType::bf16, Pass::backward, 128, 256, true, cudnn, bespoke, fa3}};
  };
  const auto fa3_wins = points(2, 1, 3);
  int ran = 0;
#if BARACUDA_HAVE_CUDNN_FRONTEND
  {
    const auto cudnn_wins = points(3, 1, 2);
    SCOPED_TRACE("cuDNN the default");
    const SelectionTableOverride o{cudnn_wins};
    for (PlanPreference pref : {PlanPreference::fastest(), PlanPreference::deterministic()}) {
      SCOPED_TRACE(to_string(pref));
      auto fwd = attention::ForwardPlan::select(gs, desc, pref);
      BARACUDA_ASSERT_OK(fwd);
      EXPECT_EQ(fwd->sku().backend, Backend::cudnn) << fwd->sku().name;
      expect_fallback_forward(*fwd, c, x, aligned);
      auto bwd = attention::BackwardPlan::select(gs, desc, pref);
      BARACUDA_ASSERT_OK(bwd);
      EXPECT_EQ(bwd->sku().backend, Backend::cudnn) << bwd->sku().name;
      expect_fallback_backward(*bwd, c, x, aligned);
      // Pinned to cuDNN, the plan is cuDNN only: such views are refused, as before.
      auto pinned = attention::ForwardPlan::select(gs, desc, PlanPreference::only(Backend::cudnn));
      BARACUDA_ASSERT_OK(pinned);
      EXPECT_EQ(pinned->fallback_sku(), nullptr);
    }
    ++ran;
  }
#endif
  const auto* fa3 = fa3_kernel(DType::bf16);
  if (fa3 && fa3->fits(problem_of(desc), gs.caps())) {
    SCOPED_TRACE("fa3 the default");
    const SelectionTableOverride o{fa3_wins};
    auto fwd = attention::ForwardPlan::select(gs, desc);
    BARACUDA_ASSERT_OK(fwd);
    EXPECT_EQ(fwd->sku().name, kFa3RankedAhead);
    expect_fallback_forward(*fwd, c, x, aligned);
    auto bwd = attention::BackwardPlan::select(gs, desc);
    BARACUDA_ASSERT_OK(bwd);
    EXPECT_EQ(bwd->sku().name, kFa3BwdRankedAhead);
    expect_fallback_backward(*bwd, c, x, aligned);
    ++ran;
  }
  if (ran == 0) GTEST_SKIP() << "neither cuDNN nor fa3 is a default here (no frontend, no sm_90a)";
}

// ---- Varlen (packed sequences) on both sm_90a kernels -----------------------------------------
// Sequences of their own lengths packed as [T, H, D] rows (a row pitch of H * D + pitch_pad
// elements: the gap bytes must stay untouched), plus `spare` rows after the last sequence that no
// sequence owns. Every row a sequence does not own is NaN in Q, K, V, Y and dY: a kernel that let
// another sequence's rows into its GEMMs (0 * NaN = NaN) or wrote outside its sequence fails.
struct VarlenCase {
  DType t;
  int64_t hq, hk, d;
  Mask mask;
  std::vector<int32_t> lq, lk;  // per-sequence lengths
  int64_t spare, pitch_pad;
  double softcap = 0;
};

std::string name_of(const VarlenCase& c) {
  std::string s = std::string(name(c.t)) + " Hq" + std::to_string(c.hq) + " Hk" +
                  std::to_string(c.hk) + " D" + std::to_string(c.d) + " " +
                  attention::to_string(c.mask) + " lengths";
  for (size_t b = 0; b < c.lq.size(); ++b)
    s += " " + std::to_string(c.lq[b]) + "x" + std::to_string(c.lk[b]);
  return s + " spare " + std::to_string(c.spare) +
         (c.softcap > 0 ? " cap " + std::to_string(c.softcap) : "");
}

std::vector<int32_t> offsets(const std::vector<int32_t>& len) {
  std::vector<int32_t> cu{0};
  for (int32_t l : len) cu.push_back(cu.back() + l);
  return cu;
}

// The case's problem: B sequences, the longest lengths as len_q / len_k.
Descriptor varlen_desc(const VarlenCase& c, DType t) {
  const int64_t b = static_cast<int64_t>(c.lq.size());
  const int64_t mq = *std::max_element(c.lq.begin(), c.lq.end()),
                mk = *std::max_element(c.lk.begin(), c.lk.end());
  Descriptor d = make_desc(t, b, c.hq, c.hk, mq, mk, c.d, c.mask);
  d.varlen = true;
  d.softcap = c.softcap;
  d.total_q = offsets(c.lq).back() + c.spare;
  d.total_k = offsets(c.lk).back() + c.spare;
  return d;
}

// Random values in the owned rows of a logical [T, H, D] tensor, NaN in the rest.
std::vector<double> packed_values(harness::Rng& rng, int64_t rows, int64_t owned, int64_t h,
                                  int64_t d) {
  std::vector<double> v(static_cast<size_t>(rows * h * d),
                        std::numeric_limits<double>::quiet_NaN());
  for (size_t i = 0; i < static_cast<size_t>(owned * h * d); ++i) v[i] = rng.uniform(-1, 1);
  return v;
}

TestTensor packed_gpu(const VarlenCase& c, DType t, int64_t rows, int64_t h) {
  return TestTensor::with_strides(t, {rows, h, c.d}, {h * c.d + c.pitch_pad, c.d, 1}, c.pitch_pad,
                                  Target::cuda);
}

// The first `owned` rows of a logical [rows, H, D] tensor (H * D values a row), or of every head
// of a logical [H, rows] LSE.
std::vector<double> owned_rows(const std::vector<double>& x, int64_t owned, int64_t per_row) {
  return {x.begin(), x.begin() + owned * per_row};
}
std::vector<double> owned_lse(const std::vector<double>& x, int64_t h, int64_t rows,
                              int64_t owned) {
  std::vector<double> out;
  for (int64_t i = 0; i < h; ++i)
    out.insert(out.end(), x.begin() + i * rows, x.begin() + i * rows + owned);
  return out;
}
// Every value of the rows no sequence owns is still the poison (NaN): nothing wrote there.
::testing::AssertionResult spare_rows_untouched(const std::vector<double>& x, int64_t owned,
                                                int64_t per_row, std::string_view what) {
  for (size_t i = static_cast<size_t>(owned * per_row); i < x.size(); ++i)
    if (!std::isnan(x[i]))
      return ::testing::AssertionFailure() << what << ": element " << i << " past the last "
                                           << "sequence was written (" << x[i] << ")";
  return ::testing::AssertionSuccess();
}

// The float64 reference plans (CPU) over the packed inputs.
ConstTensor f64_in(const std::vector<double>& x, std::initializer_list<int64_t> shape) {
  return make_tensor(static_cast<const void*>(x.data()), DType::f64,
                     std::span<const int64_t>(shape.begin(), shape.size()));
}
Tensor f64_out(std::vector<double>& x, std::initializer_list<int64_t> shape) {
  return make_tensor(static_cast<void*>(x.data()), DType::f64,
                     std::span<const int64_t>(shape.begin(), shape.size()));
}
ConstTensor i32_in(const std::vector<int32_t>& x) {
  const int64_t n[] = {static_cast<int64_t>(x.size())};
  return make_tensor(static_cast<const void*>(x.data()), DType::i32, n);
}

// The float64 reference forward (CPU) over packed [T, H, D] inputs: Y [Tq, Hq, D], LSE [Hq, Tq].
Reference varlen_reference(const VarlenCase& c, const Descriptor& ref_desc,
                           const std::vector<double>& q, const std::vector<double>& k,
                           const std::vector<double>& v, const std::vector<int32_t>& cu_q,
                           const std::vector<int32_t>& cu_k) {
  const int64_t tq = ref_desc.total_q, tk = ref_desc.total_k;
  Reference r{std::vector<double>(static_cast<size_t>(tq * c.hq * c.d), 0.0),
              std::vector<double>(static_cast<size_t>(c.hq * tq), 0.0)};
  auto plan = attention::ForwardPlan::select(Stream::cpu(), ref_desc, PlanPreference::reference());
  EXPECT_TRUE(plan.ok()) << plan.error().to_string();
  if (!plan.ok()) return r;
  const Status st = plan->run(
      Stream::cpu(), Workspace::none(),
      {f64_in(q, {tq, c.hq, c.d}), f64_in(k, {tk, c.hk, c.d}), f64_in(v, {tk, c.hk, c.d}),
       f64_out(r.y, {tq, c.hq, c.d}), f64_out(r.lse, {c.hq, tq}), i32_in(cu_q), i32_in(cu_k)});
  EXPECT_TRUE(st.ok()) << st.error().to_string();
  return r;
}
// cu_seqlens on the GPU.
TestTensor gpu_offsets(const std::vector<int32_t>& cu) {
  TestTensor t = TestTensor::make(DType::i32, {static_cast<int64_t>(cu.size())}, Target::cuda);
  t.set_values(std::vector<double>(cu.begin(), cu.end()));
  return t;
}

// A varlen case's inputs in the 16-bit type (their values rounded once, so the reference sees
// what the GPU reads; owned rows random, the rest NaN), the float64 reference forward, and the
// GPU copies a forward reads.
struct VarlenData {
  Descriptor desc, ref_desc;
  std::vector<int32_t> cu_q, cu_k;
  int64_t tq = 0, tk = 0, oq = 0, ok = 0;  // rows; rows the sequences own
  std::vector<double> q, k, v;
  Reference ref;
  TestTensor gq, gk, gv, gcu_q, gcu_k;
};
std::vector<double> rounded_packed(const VarlenCase& c, std::vector<double> v, int64_t rows,
                                   int64_t h) {
  TestTensor x = TestTensor::make(c.t, {rows, h, c.d}, Target::cpu);
  x.set_values(v);
  return x.values();
}
TestTensor upload_packed(const VarlenCase& c, const std::vector<double>& x, int64_t rows,
                         int64_t h) {
  TestTensor g = packed_gpu(c, c.t, rows, h);
  g.set_values(x);
  return g;
}
VarlenData varlen_data(const VarlenCase& c, harness::Rng& rng) {
  const Descriptor desc = varlen_desc(c, c.t), ref_desc = varlen_desc(c, DType::f64);
  const std::vector<int32_t> cu_q = offsets(c.lq), cu_k = offsets(c.lk);
  const int64_t tq = desc.total_q, tk = desc.total_k, oq = cu_q.back(), ok = cu_k.back();
  auto q = rounded_packed(c, packed_values(rng, tq, oq, c.hq, c.d), tq, c.hq);
  auto k = rounded_packed(c, packed_values(rng, tk, ok, c.hk, c.d), tk, c.hk);
  auto v = rounded_packed(c, packed_values(rng, tk, ok, c.hk, c.d), tk, c.hk);
  Reference ref = varlen_reference(c, ref_desc, q, k, v, cu_q, cu_k);
  TestTensor gq = upload_packed(c, q, tq, c.hq), gk = upload_packed(c, k, tk, c.hk),
             gv = upload_packed(c, v, tk, c.hk);
  return {desc,
          ref_desc,
          cu_q,
          cu_k,
          tq,
          tk,
          oq,
          ok,
          std::move(q),
          std::move(k),
          std::move(v),
          std::move(ref),
          std::move(gq),
          std::move(gk),
          std::move(gv),
          gpu_offsets(cu_q),
          gpu_offsets(cu_k)};
}

// A forward plan over the case, run twice into poisoned Y / LSE (gaps untouched; bitwise equal
// where the plan says deterministic), against the reference on the owned rows; the rows no
// sequence owns never written.
void check_varlen_forward(const VarlenCase& c, const VarlenData& x,
                          const attention::ForwardPlan& plan) {
  const Stream& gs = harness::stream_for(Target::cuda);
  const int64_t tq = x.tq, oq = x.oq;
  TestTensor gy = packed_gpu(c, c.t, tq, c.hq);
  TestTensor glse = TestTensor::with_strides(DType::f32, {c.hq, tq}, {tq + 4, 1}, 4, Target::cuda);
  const Workspace_ ws = workspace_of(plan.workspace_size());
  std::vector<std::vector<uint8_t>> bytes;
  for (int rep = 0; rep < 2; ++rep) {
    gy.poison();
    glse.poison();
    const auto y_before = gy.bytes(), l_before = glse.bytes();
    BARACUDA_ASSERT_OK(plan.run(gs, ws.get(),
                                {x.gq.cview(), x.gk.cview(), x.gv.cview(), gy.view(), glse.view(),
                                 x.gcu_q.cview(), x.gcu_k.cview()}));
    BARACUDA_ASSERT_OK(gs.synchronize());
    bytes.push_back(gy.bytes());
    bytes.push_back(glse.bytes());
    EXPECT_TRUE(harness::untouched_outside(y_before, bytes.end()[-2], gy.bit_mask(), "y gaps"));
    EXPECT_TRUE(harness::untouched_outside(l_before, bytes.back(), glse.bit_mask(), "lse gaps"));
  }
  if (plan.precision_guarantee().deterministic) {
    EXPECT_TRUE(harness::bytes_equal(bytes[0], bytes[2], "y run 1 vs run 2"));
    EXPECT_TRUE(harness::bytes_equal(bytes[1], bytes[3], "lse run 1 vs run 2"));
  }
  const auto yv = gy.values(), lv = glse.values();
  EXPECT_TRUE(harness::close_to(owned_rows(yv, oq, c.hq * c.d), owned_rows(x.ref.y, oq, c.hq * c.d),
                                c.t, Accuracy::reduction, "y"));
  // LSE as for the padded cases (lse_bound: f32's bound plus fa3's documented slack).
  const LseBound lb = lse_bound(c, plan.sku().name);
  EXPECT_TRUE(harness::close_to(owned_lse(lv, c.hq, tq, oq), owned_lse(x.ref.lse, c.hq, tq, oq),
                                lb.type, Accuracy::reduction, "lse", lb.slack));
  EXPECT_TRUE(spare_rows_untouched(yv, oq, c.hq * c.d, "y"));
  for (int64_t h = 0; h < c.hq; ++h)
    EXPECT_TRUE(
        spare_rows_untouched({lv.begin() + h * tq, lv.begin() + (h + 1) * tq}, oq, 1, "lse"));
}

// A varlen case's backward inputs: dY (owned rows random, the rest NaN), Y and LSE of the
// reference forward as a GPU forward stores them (Y's unowned rows NaN), the float64 reference
// backward from those, and the GPU copies a backward reads.
struct VarlenBackwardData {
  std::vector<double> dq, dk, dv;  // the reference's
  TestTensor gdy, gy, glse;
};
VarlenBackwardData varlen_backward_data(const VarlenCase& c, const VarlenData& x,
                                        harness::Rng& rng) {
  const int64_t tq = x.tq, tk = x.tk, oq = x.oq;
  const auto dy = rounded_packed(c, packed_values(rng, tq, oq, c.hq, c.d), tq, c.hq);
  std::vector<double> y_in = rounded_packed(c, x.ref.y, tq, c.hq), l_in(x.ref.lse.size());
  {
    TestTensor l = TestTensor::make(DType::f32, {c.hq, tq}, Target::cpu);
    l.set_values(x.ref.lse);
    l_in = l.values();
  }
  for (size_t i = static_cast<size_t>(oq * c.hq * c.d); i < y_in.size(); ++i)
    y_in[i] = std::numeric_limits<double>::quiet_NaN();
  VarlenBackwardData r{
      std::vector<double>(x.q.size(), 0.0),
      std::vector<double>(x.k.size(), 0.0),
      std::vector<double>(x.v.size(), 0.0),
      upload_packed(c, dy, tq, c.hq),
      upload_packed(c, y_in, tq, c.hq),
      TestTensor::with_strides(DType::f32, {c.hq, tq}, {tq + 4, 1}, 4, Target::cuda)};
  r.glse.set_values(l_in);
  auto plan =
      attention::BackwardPlan::select(Stream::cpu(), x.ref_desc, PlanPreference::reference());
  EXPECT_TRUE(plan.ok()) << plan.error().to_string();
  if (!plan.ok()) return r;
  const Status st = plan->run(
      Stream::cpu(), Workspace::none(),
      {f64_in(x.q, {tq, c.hq, c.d}), f64_in(x.k, {tk, c.hk, c.d}), f64_in(x.v, {tk, c.hk, c.d}),
       f64_in(y_in, {tq, c.hq, c.d}), f64_in(dy, {tq, c.hq, c.d}), f64_in(l_in, {c.hq, tq}),
       f64_out(r.dq, {tq, c.hq, c.d}), f64_out(r.dk, {tk, c.hk, c.d}),
       f64_out(r.dv, {tk, c.hk, c.d}), i32_in(x.cu_q), i32_in(x.cu_k)});
  EXPECT_TRUE(st.ok()) << st.error().to_string();
  return r;
}

// A backward plan over the case, run twice into poisoned dQ / dK / dV, each run against the
// reference on the owned rows (the rows no sequence owns never written, gaps untouched); the two
// runs bitwise equal where the plan says deterministic. `shared_cu`: queries and keys given one
// cu_seqlens tensor (packed self-attention; the case's lengths must be equal).
void check_varlen_backward(const VarlenCase& c, const VarlenData& x, const VarlenBackwardData& bd,
                           const attention::BackwardPlan& plan, bool shared_cu = false) {
  const Stream& gs = harness::stream_for(Target::cuda);
  const int64_t tq = x.tq, tk = x.tk, oq = x.oq, ok = x.ok;
  TestTensor dq = packed_gpu(c, c.t, tq, c.hq), dk = packed_gpu(c, c.t, tk, c.hk),
             dv = packed_gpu(c, c.t, tk, c.hk);
  const Workspace_ ws = workspace_of(plan.workspace_size());
  std::vector<std::vector<uint8_t>> runs;
  for (int rep = 0; rep < 2; ++rep) {
    for (TestTensor* t : {&dq, &dk, &dv}) t->poison();
    const auto q_before = dq.bytes(), k_before = dk.bytes(), v_before = dv.bytes();
    BARACUDA_ASSERT_OK(plan.run(gs, ws.get(),
                                {x.gq.cview(), x.gk.cview(), x.gv.cview(), bd.gy.cview(),
                                 bd.gdy.cview(), bd.glse.cview(), dq.view(), dk.view(), dv.view(),
                                 x.gcu_q.cview(), shared_cu ? x.gcu_q.cview() : x.gcu_k.cview()}));
    BARACUDA_ASSERT_OK(gs.synchronize());
    const auto dqv = dq.values(), dkv = dk.values(), dvv = dv.values();
    EXPECT_TRUE(harness::close_to(owned_rows(dqv, oq, c.hq * c.d),
                                  owned_rows(bd.dq, oq, c.hq * c.d), c.t, Accuracy::reduction,
                                  "dq"));
    EXPECT_TRUE(harness::close_to(owned_rows(dkv, ok, c.hk * c.d),
                                  owned_rows(bd.dk, ok, c.hk * c.d), c.t, Accuracy::reduction,
                                  "dk"));
    EXPECT_TRUE(harness::close_to(owned_rows(dvv, ok, c.hk * c.d),
                                  owned_rows(bd.dv, ok, c.hk * c.d), c.t, Accuracy::reduction,
                                  "dv"));
    EXPECT_TRUE(spare_rows_untouched(dqv, oq, c.hq * c.d, "dq"));
    EXPECT_TRUE(spare_rows_untouched(dkv, ok, c.hk * c.d, "dk"));
    EXPECT_TRUE(spare_rows_untouched(dvv, ok, c.hk * c.d, "dv"));
    EXPECT_TRUE(harness::untouched_outside(q_before, dq.bytes(), dq.bit_mask(), "dq gaps"));
    EXPECT_TRUE(harness::untouched_outside(k_before, dk.bytes(), dk.bit_mask(), "dk gaps"));
    EXPECT_TRUE(harness::untouched_outside(v_before, dv.bytes(), dv.bit_mask(), "dv gaps"));
    for (TestTensor* t : {&dq, &dk, &dv}) runs.push_back(t->bytes());
  }
  if (plan.precision_guarantee().deterministic) {
    for (int i = 0; i < 3; ++i)
      EXPECT_TRUE(harness::bytes_equal(runs[i], runs[i + 3], "backward run 1 vs run 2"));
  }
}

void check_varlen_case(const VarlenCase& c, harness::Rng& rng) {
  const Stream& gs = harness::stream_for(Target::cuda);
  const VarlenData x = varlen_data(c, rng);
  const Descriptor& desc = x.desc;
  const attention::Problem p = problem_of(desc);
  const VarlenBackwardData bd = varlen_backward_data(c, x, rng);

  // Every forward schedule, pinned, run twice (bitwise equal), then the default plan.
  std::vector<std::string_view> fwd = {kFa3, kFa3Pingpong, kFa3Exp2Poly2Kernel,
                                       kFa3Exp2Poly3Kernel};
  if (c.d == 64 || c.d == 128) fwd.push_back(kFa3PersistentKernel);
  if (c.d == 64) fwd.push_back(kFa3WideKernel);
  // GQA packing where the group fits it (1..16, Dk = Dv).
  if (const auto* packed = fa3_kernel(c.t, kFa3PackedKernel); packed && packed->fits(p, gs.caps()))
    fwd.push_back(kFa3PackedKernel);
  const bool fa3_default = candidate_here(p, Pass::forward, gs.caps()) == Candidate::fa3;
  fwd.push_back({});  // the default plan
  for (std::string_view name : fwd) {
    SCOPED_TRACE(name.empty() ? std::string("default plan") : std::string(name));
    auto plan = name.empty()
                    ? attention::ForwardPlan::select(gs, desc)
                    : attention::ForwardPlan::select(gs, desc, PlanPreference::kernel(name));
    BARACUDA_ASSERT_OK(plan);
    if (name.empty()) {
      EXPECT_EQ(plan->sku().name == kFa3RankedAhead, fa3_default) << plan->sku().name;
    } else {
      ASSERT_EQ(plan->sku().name, name);
    }
    check_varlen_forward(c, x, *plan);
  }

  // The backward pinned by name; at D = 64 without soft-capping the three-warpgroup kernel and
  // the 128-row steps too; at D = 64 / 128 the deterministic instance, whose two runs must also be
  // bitwise equal.
  for (std::string_view bname :
       {kFa3BwdKernel, kFa3BwdK192Kernel, kFa3BwdQ128Kernel, kFa3BwdDeterministicKernel}) {
    const bool det = bname == kFa3BwdDeterministicKernel;
    if (det ? c.d != 64 && c.d != 128 : bname != kFa3BwdKernel && (c.d != 64 || c.softcap > 0))
      continue;
    SCOPED_TRACE(std::string(bname));
    auto bplan = attention::BackwardPlan::select(gs, desc, PlanPreference::kernel(bname));
    BARACUDA_ASSERT_OK(bplan);
    ASSERT_EQ(bplan->sku().name, bname);
    EXPECT_EQ(bplan->precision_guarantee().deterministic, det);
    check_varlen_backward(c, x, bd, *bplan);
  }
}

// The packed-sequence cases of the fa3 varlen tests (c.t: the 16-bit type; the fp8 test reads it
// as Y's type).
std::vector<VarlenCase> varlen_cases() {
  return {
      // An empty sequence, one of a single row, a 300-row one over three query / key blocks.
      {DType::bf16, 4, 2, 64, Mask::none(), {70, 0, 300, 1}, {130, 17, 300, 1}, 5, 0},
      // Unmasked GQA with a sequence of queries and no keys (Y and dQ 0), sequences of more key
      // blocks than the longest query one: the deterministic backward's rotated walks, whose
      // accumulators prep leaves unzeroed.
      {DType::bf16, 4, 2, 128, Mask::none(), {300, 90, 200}, {260, 0, 700}, 3, 0},
      // Lq > Lk bottom-right (rows that see no key: Y 0, LSE -inf, dQ 0), MQA, padded rows.
      {DType::f16, 4, 1, 128, Mask::causal_bottom_right(), {200, 5, 129}, {100, 300, 129}, 3, 8},
      {DType::bf16, 2, 2, 128, Mask::causal_top_left(), {1, 257, 64}, {1, 257, 63}, 0, 8},
      {DType::bf16, 4, 2, 64, Mask::causal_bottom_right(), {513, 77}, {600, 100}, 7, 0},
      {DType::f16, 2, 1, 256, Mask::causal_top_left(), {100, 300, 0}, {200, 300, 5}, 3, 8},
      // Per-sequence bands (a window past each sequence's own diagonal) and soft-capping.
      {DType::bf16,
       4,
       2,
       128,
       Mask::sliding_window(100, 0),
       {300, 50, 700},
       {300, 80, 900},
       5,
       8,
       30.0},
      {DType::f16,
       2,
       2,
       64,
       Mask::sliding_window(64, 16, Diagonal::top_left),
       {129, 1, 257},
       {200, 65, 130},
       0,
       0,
       20.0},
  };
}

TEST(AttentionFa3Gpu, VarlenMatchesReference) {
  FA3_BWD_SKIP_UNLESS_RUNNABLE();
  const std::vector<VarlenCase> cases = varlen_cases();
  harness::Rng rng;
  const auto t0 = std::chrono::steady_clock::now();
  for (const VarlenCase& c : cases) {
    SCOPED_TRACE(name_of(c));
    check_varlen_case(c, rng);
  }
  std::printf("[ fa3 varlen ] %zu cases, %.2f s\n", cases.size(), seconds_since(t0));
}

// cuDNN's ragged layout over packed sequences (only(Backend::cudnn)), forward and backward (its
// backward on dense copies of the inputs, at head dims up to 128: cuDNN's rules, each refusal
// checked): the fa3 varlen cases within cuDNN's rules (no soft-cap) plus a window, rows no
// sequence owns NaN
// (they must neither reach an owned row nor be written), sequences with no query or no key (dK /
// dV or dQ 0: the pass after cuDNN's), rows that see no key (Y 0, LSE -inf, dQ 0). Each against
// the float64 reference, twice into poisoned outputs (bitwise equal where the plan says
// deterministic: the forward and the deterministic algorithm's backward), gaps untouched. The
// default plans are not cuDNN's.
TEST(AttentionCudnnGpu, VarlenMatchesReference) {
  BARACUDA_SKIP_IF_UNAVAILABLE(Target::cuda);
#if !BARACUDA_HAVE_CUDNN_FRONTEND
  GTEST_SKIP() << "built without the cuDNN frontend (BARACUDA_HAVE_CUDNN_FRONTEND unset)";
#endif
  const Stream& gs = harness::stream_for(Target::cuda);
  std::vector<VarlenCase> cases;
  for (const VarlenCase& c : varlen_cases())
    if (c.softcap == 0) cases.push_back(c);
  cases.push_back(
      {DType::bf16, 4, 2, 128, Mask::sliding_window(100, 0), {300, 50, 700}, {300, 80, 900}, 5, 8});
  // Packed self-attention (equal lengths; the backward also run with one cu_seqlens tensor for
  // both, where it takes cuDNN's top-left graph): causal and a window, bottom-right.
  cases.push_back({DType::bf16,
                   4,
                   2,
                   128,
                   Mask::causal_bottom_right(),
                   {300, 1, 129, 0},
                   {300, 1, 129, 0},
                   3,
                   0});
  cases.push_back({DType::f16, 4, 1, 64, Mask::sliding_window(100, 0), {513, 77}, {513, 77}, 2, 0});
  harness::Rng rng;
  for (const VarlenCase& c : cases) {
    SCOPED_TRACE(name_of(c));
    const VarlenData x = varlen_data(c, rng);
    auto plan = attention::ForwardPlan::select(gs, x.desc, PlanPreference::only(Backend::cudnn));
    BARACUDA_ASSERT_OK(plan);
    EXPECT_EQ(plan->sku().name, "cudnn_sdpa_ranked_behind");
    check_varlen_forward(c, x, *plan);
    auto def = attention::ForwardPlan::select(gs, x.desc);
    BARACUDA_ASSERT_OK(def);
    EXPECT_NE(def->sku().backend, Backend::cudnn);

    // The backward: head dims over 128 refused; dense tensors (cuDNN's rule), so a padded case
    // runs on dense copies of its inputs, and its padded tensors are refused before anything
    // runs.
    if (c.d > 128) {
      EXPECT_TRUE(fails_with(
          attention::BackwardPlan::select(gs, x.desc, PlanPreference::only(Backend::cudnn)),
          ErrorKind::unsupported, {"cuDNN's ragged backward over 128"}));
      continue;
    }
    VarlenCase dc = c;
    dc.pitch_pad = 0;
    const std::optional<VarlenData> dense_x =
        c.pitch_pad > 0 ? std::optional<VarlenData>(varlen_data(dc, rng)) : std::nullopt;
    const VarlenData& bx = dense_x ? *dense_x : x;
    const VarlenBackwardData bd = varlen_backward_data(dc, bx, rng);
    if (c.pitch_pad > 0) {  // the case's padded Q, K, V (Y, dY, LSE of the dense copy)
      auto bplan =
          attention::BackwardPlan::select(gs, x.desc, PlanPreference::only(Backend::cudnn));
      BARACUDA_ASSERT_OK(bplan);
      TestTensor dq = packed_gpu(dc, c.t, x.tq, c.hq), dk = packed_gpu(dc, c.t, x.tk, c.hk),
                 dv = packed_gpu(dc, c.t, x.tk, c.hk);
      EXPECT_TRUE(
          fails_with(bplan->can_implement({x.gq.cview(), x.gk.cview(), x.gv.cview(), bd.gy.cview(),
                                           bd.gdy.cview(), bd.glse.cview(), dq.view(), dk.view(),
                                           dv.view(), x.gcu_q.cview(), x.gcu_k.cview()}),
                     ErrorKind::unsupported, {"q: varlen: strides", "not dense"}));
    }
    for (const auto& [pref, name] :
         {std::pair{PlanPreference::only(Backend::cudnn), "cudnn_sdpa_bwd_ranked_behind"},
          {PlanPreference::kernel("cudnn_sdpa_bwd_deterministic_ranked_behind"),
           "cudnn_sdpa_bwd_deterministic_ranked_behind"}}) {
      SCOPED_TRACE(name);
      auto bplan = attention::BackwardPlan::select(gs, bx.desc, pref);
      BARACUDA_ASSERT_OK(bplan);
      ASSERT_EQ(bplan->sku().name, name);
      check_varlen_backward(dc, bx, bd, *bplan);
      if (c.lq == c.lk) {
        SCOPED_TRACE("one cu_seqlens tensor");
        check_varlen_backward(dc, bx, bd, *bplan, /*shared_cu=*/true);
      }
    }
    auto bdef = attention::BackwardPlan::select(gs, x.desc);
    BARACUDA_ASSERT_OK(bdef);
    EXPECT_NE(bdef->sku().backend, Backend::cudnn);
  }
}

// The fp8 forward over packed sequences (c.t is Y's dtype; Q, K, V e4m3 in [-4, 4) with descales;
// rows no sequence owns are NaN and must neither leak into Y nor be written): the default e4m3
// plan, run twice into poisoned outputs (bitwise equal, gaps untouched), against the float64
// reference plan over the dequantized values.
void check_fp8_varlen_case(const VarlenCase& c, harness::Rng& rng) {
  const Stream& gs = harness::stream_for(Target::cuda);
  Descriptor desc = varlen_desc(c, DType::e4m3);
  desc.out_dtype = c.t;
  const Descriptor ref_desc = varlen_desc(c, DType::f64);
  const std::vector<int32_t> cu_q = offsets(c.lq), cu_k = offsets(c.lk);
  const int64_t tq = desc.total_q, tk = desc.total_k, oq = cu_q.back();
  auto e4m3 = [&](int64_t rows, int64_t owned, int64_t h) {
    std::vector<double> v = packed_values(rng, rows, owned, h, c.d);
    for (double& x : v) x *= 4;
    TestTensor t = TestTensor::make(DType::e4m3, {rows, h, c.d}, Target::cpu);
    t.set_values(v);
    return t.values();  // rounded to e4m3; NaN stays NaN
  };
  const auto q = e4m3(tq, oq, c.hq), k = e4m3(tk, cu_k.back(), c.hk),
             v = e4m3(tk, cu_k.back(), c.hk);
  const double ds[] = {rng.uniform(0.5, 1.5), rng.uniform(0.5, 1.5), rng.uniform(0.5, 1.5)};
  auto scaled = [](std::vector<double> x, double f) {
    for (double& e : x) e *= f;
    return x;
  };
  const auto dq = scaled(q, ds[0]), dk = scaled(k, ds[1]), dv = scaled(v, ds[2]);
  const Reference ref = varlen_reference(c, ref_desc, dq, dk, dv, cu_q, cu_k);
  const std::vector<double>&ry = ref.y, &rl = ref.lse;
  auto upload_rows = [&](const std::vector<double>& x, int64_t rows, int64_t h) {
    TestTensor g = packed_gpu(c, DType::e4m3, rows, h);
    g.set_values(x);
    return g;
  };
  const TestTensor gq = upload_rows(q, tq, c.hq), gk = upload_rows(k, tk, c.hk),
                   gv = upload_rows(v, tk, c.hk);
  const TestTensor gcu_q = gpu_offsets(cu_q), gcu_k = gpu_offsets(cu_k);
  const TestTensor qs = gpu_scalar(ds[0]), ks = gpu_scalar(ds[1]), vs = gpu_scalar(ds[2]);

  auto plan = attention::ForwardPlan::select(gs, desc);
  BARACUDA_ASSERT_OK(plan);
  ASSERT_EQ(plan->sku().name, kFa3Fp8Kernel);
  TestTensor gy = packed_gpu(c, c.t, tq, c.hq);
  TestTensor glse = TestTensor::with_strides(DType::f32, {c.hq, tq}, {tq + 4, 1}, 4, Target::cuda);
  const Workspace_ ws = workspace_of(plan->workspace_size());
  attention::ForwardArguments args{gq.cview(),  gk.cview(),    gv.cview(),   gy.view(),
                                   glse.view(), gcu_q.cview(), gcu_k.cview()};
  args.q_descale = qs.cview(), args.k_descale = ks.cview(), args.v_descale = vs.cview();
  run_twice_poisoned(*plan, ws, args, gy, glse);
  const auto yv = gy.values(), lv = glse.values();
  EXPECT_TRUE(harness::close_to(owned_rows(yv, oq, c.hq * c.d), owned_rows(ry, oq, c.hq * c.d),
                                DType::e4m3, Accuracy::rounded_weights, "y"));
  // LSE to f16's bound (the e4m3 wgmma's narrow Q K^T accumulation, see check_fp8_case).
  EXPECT_TRUE(harness::close_to(owned_lse(lv, c.hq, tq, oq), owned_lse(rl, c.hq, tq, oq),
                                DType::f16, Accuracy::reduction, "lse"));
  EXPECT_TRUE(spare_rows_untouched(yv, oq, c.hq * c.d, "y"));
  for (int64_t h = 0; h < c.hq; ++h)
    EXPECT_TRUE(
        spare_rows_untouched({lv.begin() + h * tq, lv.begin() + (h + 1) * tq}, oq, 1, "lse"));
}

TEST(AttentionFa3Gpu, Fp8VarlenMatchesReference) {
  FP8_SKIP_UNLESS_RUNNABLE();
  // The 16-bit test's cases (rows padded by 16 bytes where they were padded) and packed key
  // offsets that are not 16-aligned at every head dim.
  std::vector<VarlenCase> cases = varlen_cases();
  for (VarlenCase& c : cases)
    if (c.pitch_pad > 0) c.pitch_pad = 16;
  for (int64_t d : {64, 128, 256})
    cases.push_back({d == 128 ? DType::f16 : DType::bf16,
                     4,
                     2,
                     d,
                     Mask::causal_bottom_right(),
                     {300, 50, 700},
                     {301, 83, 901},
                     5,
                     0});
  harness::Rng rng;
  for (const VarlenCase& c : cases) {
    SCOPED_TRACE("fp8 " + name_of(c));
    check_fp8_varlen_case(c, rng);
  }
}

}  // namespace
}  // namespace baracuda::attention_hopper
