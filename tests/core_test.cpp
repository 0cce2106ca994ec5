// Tests of the core machinery: element bank, tensors, validation rules, streams, the kernel
// registry and the Plan life cycle (using a tiny op defined here).
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <mutex>
#include <set>
#include <thread>

#include "baracuda/core/plan.hpp"
#include "baracuda/core/validate.hpp"
#include "core/cpu/parallel.hpp"
#include "core/testing/testing.hpp"

namespace baracuda {
namespace {

using harness::fails_with;

TEST(DType, InfoTableIsConsistent) {
  for (int i = 0; i < kDTypeCount; ++i) {
    const auto t = static_cast<DType>(i);
    EXPECT_EQ(info(t).dtype, t);
    EXPECT_EQ(dtype_from_name(name(t)), t);
  }
  EXPECT_EQ(bits_of(DType::s4), 4);
  EXPECT_EQ(bits_of(DType::bin), 1);
  EXPECT_EQ(elements_per_byte(DType::bin), 8);
  EXPECT_FALSE(dtype_from_name("f128").has_value());
  // A value past the bank (an integer cast to DType) is named, not read past the table.
  EXPECT_EQ(name(static_cast<DType>(kDTypeCount)), "invalid");
  EXPECT_EQ(name(static_cast<DType>(255)), "invalid");
  EXPECT_FALSE(dtype_from_name("invalid").has_value());
}

TEST(DType, MiniFloatKnownValues) {
  EXPECT_EQ(f16_from_double(1.0), 0x3C00);
  EXPECT_EQ(f16_from_double(65504.0), 0x7BFF);
  EXPECT_EQ(f16_from_double(65520.0), 0x7C00);  // rounds to infinity
  EXPECT_EQ(f16_from_double(-2.0), 0xC000);
  EXPECT_EQ(f16_from_double(std::ldexp(1.0, -24)), 0x0001);  // smallest subnormal
  EXPECT_EQ(bf16_from_double(1.0), 0x3F80);
  EXPECT_EQ(bf16_from_double(1.0 + std::ldexp(1.0, -8)), 0x3F80);      // tie -> even
  EXPECT_EQ(bf16_from_double(1.0 + 3 * std::ldexp(1.0, -8)), 0x3F82);  // tie -> even (up)
  EXPECT_EQ(e4m3_from_double(448.0), 0x7E);
  EXPECT_EQ(e4m3_from_double(1e6), 0x7E);  // saturates: e4m3 has no infinity
  EXPECT_TRUE(std::isnan(e4m3_to_double(0x7F)));
  EXPECT_EQ(e5m2_from_double(57344.0), 0x7B);
  EXPECT_TRUE(std::isinf(e5m2_to_double(0x7C)));
  EXPECT_TRUE(std::isnan(f16_to_double(0xFFFF)));  // the poison pattern is NaN
  EXPECT_TRUE(std::isnan(bf16_to_double(0xFFFF)));
}

TEST(DType, EveryBitPatternRoundTrips) {
  for (uint32_t b = 0; b < 65536; ++b) {
    const double v = f16_to_double(static_cast<uint16_t>(b));
    if (!std::isnan(v)) {
      EXPECT_EQ(f16_from_double(v), b) << b;
    }
    const double w = bf16_to_double(static_cast<uint16_t>(b));
    if (!std::isnan(w)) {
      EXPECT_EQ(bf16_from_double(w), b) << b;
    }
  }
  for (uint32_t b = 0; b < 256; ++b) {
    const double v = e4m3_to_double(static_cast<uint8_t>(b));
    if (!std::isnan(v)) {
      EXPECT_EQ(e4m3_from_double(v), b) << b;
    }
    const double w = e5m2_to_double(static_cast<uint8_t>(b));
    if (!std::isnan(w)) {
      EXPECT_EQ(e5m2_from_double(w), b) << b;
    }
  }
}

// Round to nearest even at every boundary of the float formats: between each pair of adjacent
// non-negative finite codes (and past the largest finite, where the next code would lie with the
// same spacing) the midpoint, exact in double, goes to the even code, the doubles just below and
// above it to the lower and upper code, and the same negated to the same codes with the sign bit.
// Past the largest finite: infinity, or e4m3's largest finite (it saturates). Then the specials.
TEST(DType, FloatEncodeRoundsToNearestEvenAtEveryMidpoint) {
  struct Format {
    const char* name;
    uint32_t (*encode)(double);
    double (*decode)(uint32_t);
    uint32_t top, over, sign;  // the largest finite code, the code past it, the sign bit
  };
  const Format formats[] = {
      {"f16", [](double v) -> uint32_t { return f16_from_double(v); },
       [](uint32_t b) { return f16_to_double(static_cast<uint16_t>(b)); }, 0x7BFF, 0x7C00, 0x8000},
      {"bf16", [](double v) -> uint32_t { return bf16_from_double(v); },
       [](uint32_t b) { return bf16_to_double(static_cast<uint16_t>(b)); }, 0x7F7F, 0x7F80, 0x8000},
      {"e5m2", [](double v) -> uint32_t { return e5m2_from_double(v); },
       [](uint32_t b) { return e5m2_to_double(static_cast<uint8_t>(b)); }, 0x7B, 0x7C, 0x80},
      {"e4m3", [](double v) -> uint32_t { return e4m3_from_double(v); },
       [](uint32_t b) { return e4m3_to_double(static_cast<uint8_t>(b)); }, 0x7E, 0x7E, 0x80}};
  for (const Format& f : formats) {
    SCOPED_TRACE(f.name);
    int64_t wrong = 0;
    for (uint32_t b = 0; b <= f.top; ++b) {
      const double lo = f.decode(b);
      const double hi = b < f.top ? f.decode(b + 1) : 2 * lo - f.decode(b - 1);
      const double mid = (lo + hi) / 2;
      const uint32_t up = b < f.top ? b + 1 : f.over;
      const uint32_t even = (b & 1u) != 0 ? up : b;
      const double below = std::nextafter(mid, 0.0), above = std::nextafter(mid, hi);
      for (const auto& [x, want] :
           {std::pair{lo, b}, std::pair{mid, even}, std::pair{below, b}, std::pair{above, up}}) {
        wrong += f.encode(x) != want;
        wrong += f.encode(-x) != (want | f.sign);
      }
    }
    EXPECT_EQ(wrong, 0);
    const double inf = std::numeric_limits<double>::infinity();
    EXPECT_EQ(f.encode(inf), f.over);
    EXPECT_EQ(f.encode(-inf), f.over | f.sign);
    EXPECT_EQ(f.encode(1e300), f.over);
    EXPECT_EQ(f.encode(-1e-300), f.sign);
    EXPECT_EQ(f.encode(std::numeric_limits<double>::denorm_min()), 0u);
    EXPECT_TRUE(std::isnan(f.decode(f.encode(std::nan("")))));
  }
}

TEST(DType, SubByteAccessKeepsNeighbours) {
  uint8_t buf[4] = {0xA5, 0x5A, 0xFF, 0x00};
  store_from_double(buf, DType::s4, 1, -3.0);
  EXPECT_EQ(buf[0], 0xD5);
  EXPECT_EQ(load_as_double(buf, DType::s4, 1), -3.0);
  EXPECT_EQ(load_as_double(buf, DType::u4, 0), 5.0);
  store_from_double(buf, DType::bin, 9, 0.0);
  EXPECT_EQ(buf[1], 0x58);
  EXPECT_EQ(load_as_double(buf, DType::bin, 8), 0.0);
  EXPECT_EQ(load_as_double(buf, DType::bin, 16), 1.0);
}

TEST(Tensor, NumelSpanAndOverflow) {
  int64_t shape[] = {3, 4, 5};
  Tensor t = make_tensor(static_cast<void*>(nullptr), DType::bf16, shape);
  EXPECT_EQ(t.numel(), 60);
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_EQ(t.span_bytes(), 120);
  int64_t strides[] = {40, 10, 1};
  Tensor p = make_strided(static_cast<void*>(nullptr), DType::s4, shape, strides);
  EXPECT_FALSE(p.is_contiguous());
  EXPECT_EQ(p.span_elements(), 2 * 40 + 3 * 10 + 4 + 1);
  EXPECT_EQ(p.span_bytes(), (115 * 4 + 7) / 8);
  int64_t huge[] = {int64_t{1} << 40, int64_t{1} << 40};
  EXPECT_EQ(make_tensor(static_cast<void*>(nullptr), DType::f32, huge).numel(),
            std::numeric_limits<int64_t>::max());
  int64_t out = 0;
  EXPECT_FALSE(checked_mul(int64_t{1} << 40, int64_t{1} << 40, &out));
}

TEST(Validate, ShapeRules) {
  int64_t ok[] = {2, 3};
  BARACUDA_EXPECT_OK(validate::shape("op", "x", ok));
  EXPECT_TRUE(fails_with(&validate::shape("op", "x", {}).error(), ErrorKind::invalid_problem,
                         {"op: x: rank 0"}));
  int64_t neg[] = {2, -1};
  EXPECT_TRUE(fails_with(&validate::shape("op", "x", neg).error(), ErrorKind::invalid_problem,
                         {"shape[1]=-1 is negative"}));
  int64_t big[] = {int64_t{1} << 40, int64_t{1} << 40};
  EXPECT_TRUE(fails_with(&validate::shape("op", "x", big).error(), ErrorKind::invalid_problem,
                         {"overflows int64"}));
  int64_t nine[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
  EXPECT_TRUE(fails_with(&validate::shape("op", "x", nine).error(), ErrorKind::invalid_problem,
                         {"rank 9"}));
}

TEST(Validate, TensorRules) {
  std::vector<float> storage(64);
  int64_t shape[] = {4, 8};
  const Location host = Location::host();
  Tensor t = make_tensor(storage.data(), DType::f32, shape, host, 64 * 4);
  BARACUDA_EXPECT_OK(validate::tensor("op", "y", t, DType::f32, shape, host));
  EXPECT_TRUE(fails_with(&validate::tensor("op", "y", t, DType::f16, shape, host).error(),
                         ErrorKind::invalid_problem, {"op: y: dtype f32, expected f16"}));
  int64_t other[] = {4, 9};
  EXPECT_TRUE(fails_with(&validate::tensor("op", "y", t, DType::f32, other, host).error(),
                         ErrorKind::invalid_problem, {"shape[1]=8, expected 9"}));
  Tensor small = make_tensor(storage.data(), DType::f32, shape, host, 100);
  auto st = validate::tensor("op", "y", small, DType::f32, shape, host);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().kind(), ErrorKind::buffer_too_small);
  EXPECT_EQ(st.error().needed(), 128u);
  EXPECT_EQ(st.error().got(), 100u);
  // -1 means "what the view spans"; any other negative is refused, never read as "unchecked".
  Tensor garbage = t;
  garbage.buffer_bytes = -2;
  EXPECT_TRUE(fails_with(&validate::tensor("op", "y", garbage, DType::f32, shape, host).error(),
                         ErrorKind::invalid_problem, {"op: y: buffer_bytes=-2 is negative"}));
  Tensor vouched = t;
  vouched.buffer_bytes = -1;
  BARACUDA_EXPECT_OK(validate::tensor("op", "y", vouched, DType::f32, shape, host));
  // A written view must reach each element once; a read one may overlap itself (as_strided).
  const int64_t rows3[] = {3, 4};
  Tensor overlap = make_tensor(storage.data(), DType::f32, rows3, host, 64 * 4);
  overlap.stride[0] = 2;  // rows 2 elements apart, 4 long: each row overlaps the next
  EXPECT_TRUE(fails_with(&validate::tensor("op", "y", overlap, DType::f32, rows3, host).error(),
                         ErrorKind::invalid_problem,
                         {"op: y: the written view", "reaches some elements twice"}));
  BARACUDA_EXPECT_OK(validate::tensor("op", "x", as_const(overlap), DType::f32, rows3, host));
  Tensor interleaved = overlap;  // columns 3 apart, rows 1 apart: distinct but interleaved
  interleaved.stride[0] = 1, interleaved.stride[1] = 3;
  BARACUDA_EXPECT_OK(validate::tensor("op", "y", interleaved, DType::f32, rows3, host));
  Tensor bcast = t;
  bcast.stride[0] = 0;
  EXPECT_TRUE(fails_with(&validate::tensor("op", "y", bcast, DType::f32, shape, host).error(),
                         ErrorKind::invalid_problem, {"stride[0]=0 broadcasts"}));
  BARACUDA_EXPECT_OK(
      validate::tensor("op", "x", bcast, DType::f32, shape, host, {.allow_broadcast = true}));
  Tensor negative = t;
  negative.stride[1] = -1;
  EXPECT_TRUE(fails_with(&validate::tensor("op", "y", negative, DType::f32, shape, host).error(),
                         ErrorKind::invalid_problem, {"stride[1]=-1 is negative"}));
  Tensor null = t;
  null.data = nullptr;
  EXPECT_TRUE(fails_with(&validate::tensor("op", "y", null, DType::f32, shape, host).error(),
                         ErrorKind::invalid_problem, {"data is null"}));
  Tensor misaligned = t;
  misaligned.data = reinterpret_cast<char*>(storage.data()) + 2;
  EXPECT_TRUE(fails_with(
      &validate::tensor("op", "y", misaligned, DType::f32, shape, host, {.align_bytes = 4}).error(),
      ErrorKind::misaligned_operand, {"4-byte aligned"}));
  // Natural alignment always: an f32 view one byte into its buffer is refused without a rule.
  Tensor odd = t;
  odd.data = reinterpret_cast<char*>(storage.data()) + 1;
  odd.buffer_bytes = 64 * 4 - 1;
  EXPECT_TRUE(fails_with(&validate::tensor("op", "y", odd, DType::f32, shape, host).error(),
                         ErrorKind::misaligned_operand, {"op: y: data", "is not 4-byte aligned"}));
  const int64_t bytes_shape[] = {4, 8};
  Tensor odd_u8 =
      make_tensor(reinterpret_cast<char*>(storage.data()) + 1, DType::u8, bytes_shape, host, 100);
  BARACUDA_EXPECT_OK(validate::tensor("op", "y", odd_u8, DType::u8, bytes_shape, host));
  const int64_t pairs_shape[] = {2, 4};  // complex<float> is aligned to its float parts
  Tensor odd_c64 = make_tensor(reinterpret_cast<char*>(storage.data()) + 4, DType::c64, pairs_shape,
                               host, 64 * 4 - 4);
  BARACUDA_EXPECT_OK(validate::tensor("op", "y", odd_c64, DType::c64, pairs_shape, host));
  EXPECT_TRUE(
      fails_with(&validate::tensor("op", "y", t, DType::f32, shape, Location::cuda(0)).error(),
                 ErrorKind::wrong_device, {"declared on host", "cuda:0"}));
  int64_t packed_strides[] = {3, 1};
  Tensor s4 = make_strided(storage.data(), DType::s4, shape, packed_strides, host);
  EXPECT_TRUE(fails_with(&validate::tensor("op", "y", s4, DType::s4, shape, host).error(),
                         ErrorKind::invalid_problem, {"not a multiple of 2"}));
  // Empty sub-byte views have no rows to align: dense strides of [3, 0] are {1, 1}.
  const int64_t empty_shape[] = {3, 0};
  Tensor empty_s4 = make_tensor(storage.data(), DType::s4, empty_shape, host);
  BARACUDA_EXPECT_OK(validate::tensor("op", "y", empty_s4, DType::s4, empty_shape, host));
  int64_t shape2[] = {4, 4};
  Tensor a = make_tensor(storage.data(), DType::f32, shape2, host);
  Tensor b = make_tensor(storage.data() + 8, DType::f32, shape2, host);
  Tensor c = make_tensor(storage.data() + 16, DType::f32, shape2, host);
  EXPECT_TRUE(fails_with(&validate::no_overlap("op", "y", a, "x", as_const(b)).error(),
                         ErrorKind::invalid_problem, {"y and x overlap"}));
  BARACUDA_EXPECT_OK(validate::no_overlap("op", "y", a, "x", as_const(c)));
}

// ---- A tiny op to exercise the registry and Plan life cycle
// ---------------------------------------
struct ScaleOp {
  static constexpr std::string_view name = "test_scale";
  struct Descriptor {
    int64_t n;
    DType dtype;
    bool needs_workspace;
  };
  struct Arguments {
    Tensor y;
    ConstTensor x;
  };
  using Problem = Descriptor;
  static Result<Problem> make_problem(const Descriptor& d) {
    if (d.n < 0) return Error::invalid("test_scale: n=" + std::to_string(d.n) + " is negative");
    return d;
  }
  static DType element(const Problem& p) { return p.dtype; }
  static Status check_arguments(const Problem& p, const Arguments& a, Location where) {
    int64_t dims[] = {p.n};
    BARACUDA_TRY(validate::tensor(name, "y", a.y, p.dtype, dims, where));
    return validate::tensor(name, "x", a.x, p.dtype, dims, where);
  }
};

Status scale_cpu(const LaunchContext&, const ScaleOp::Problem& p, const ScaleOp::Arguments& a) {
  for (int64_t i = 0; i < p.n; ++i)
    store_from_double(a.y.data, p.dtype, i, 2.0 * load_as_double(a.x.data, p.dtype, i));
  return {};
}

constexpr PrecisionGuarantee kNondeterministic{MathPrecision::f64, DType::f64, false, false};
BARACUDA_REGISTER(register_kernel<ScaleOp>({
    .sku = {.category = "test", .op = "test_scale", .element = DType::f32, .name = "reference"},
    .priority = 0,
    .launch = scale_cpu,
}));
BARACUDA_REGISTER(register_kernel<ScaleOp>({
    .sku = {.category = "test",
            .op = "test_scale",
            .element = DType::f32,
            .precision = kNondeterministic,
            .name = "fast_nondeterministic"},
    .priority = 10,
    .fits = [](const ScaleOp::Problem& p, const DeviceCaps&) { return p.n > 0; },
    .workspace = [](const ScaleOp::Problem& p, const DeviceCaps&) -> size_t {
      return p.needs_workspace ? 64 : 0;
    },
    .launch = scale_cpu,
    .refusal = [](const ScaleOp::Problem& p, const DeviceCaps&) -> std::optional<std::string> {
      if (p.n > 0) return std::nullopt;
      return "n=" + std::to_string(p.n) + ": it takes n > 0";
    },
}));

TEST(Plan, SelectsHighestPriorityThatFitsAndHonoursPreference) {
  const Stream cpu = Stream::cpu();
  auto fast = Plan<ScaleOp>::select(cpu, {8, DType::f32, false});
  BARACUDA_ASSERT_OK(fast);
  EXPECT_EQ(fast->sku().name, "fast_nondeterministic");
  EXPECT_FALSE(fast->precision_guarantee().deterministic);
  auto det = Plan<ScaleOp>::select(cpu, {8, DType::f32, false}, PlanPreference::deterministic());
  BARACUDA_ASSERT_OK(det);
  EXPECT_EQ(det->sku().name, "reference");
  auto empty = Plan<ScaleOp>::select(cpu, {0, DType::f32, false});  // predicate excludes fast
  BARACUDA_ASSERT_OK(empty);
  EXPECT_EQ(empty->sku().name, "reference");
  EXPECT_TRUE(fails_with(Plan<ScaleOp>::select(cpu, {8, DType::f16, false}), ErrorKind::unsupported,
                         {"test_scale: no kernel for element=f16", "no kernel is registered"}));
  EXPECT_TRUE(fails_with(Plan<ScaleOp>::select(cpu, {-1, DType::f32, false}),
                         ErrorKind::invalid_problem, {"n=-1"}));
  EXPECT_TRUE(fails_with(
      Plan<ScaleOp>::select(cpu, {8, DType::f32, false}, PlanPreference::only(Backend::cudnn)),
      ErrorKind::unsupported, {"preference=backend=cudnn", "reference(cpu_reference"}));
}

TEST(Plan, KernelTableFindsAnEntryByNameAndElement) {
  const auto& table = KernelTable<ScaleOp>::instance();
  const Kernel<ScaleOp>* fast = table.find("fast_nondeterministic", DType::f32);
  ASSERT_NE(fast, nullptr);
  EXPECT_EQ(fast->sku.name, "fast_nondeterministic");
  EXPECT_EQ(fast->priority, 10);
  EXPECT_EQ(table.find("fast_nondeterministic", DType::f64), nullptr);  // no f64 entry
  EXPECT_EQ(table.find("no_such_kernel", DType::f32), nullptr);
}

TEST(Plan, KernelPreferencePinsOneKernelOnlyWhereItFits) {
  const Stream cpu = Stream::cpu();
  auto pinned =
      Plan<ScaleOp>::select(cpu, {8, DType::f32, false}, PlanPreference::kernel("reference"));
  BARACUDA_ASSERT_OK(pinned);
  EXPECT_EQ(pinned->sku().name, "reference");  // below the fast kernel's priority, still chosen
  auto fast = Plan<ScaleOp>::select(cpu, {8, DType::f32, false},
                                    PlanPreference::kernel("fast_nondeterministic"));
  BARACUDA_ASSERT_OK(fast);
  EXPECT_EQ(fast->sku().name, "fast_nondeterministic");
  // Pinning never overrides a predicate: the fast kernel does not fit n = 0, and the error quotes
  // its refusal.
  EXPECT_TRUE(fails_with(
      Plan<ScaleOp>::select(cpu, {0, DType::f32, false},
                            PlanPreference::kernel("fast_nondeterministic")),
      ErrorKind::unsupported,
      {"preference=kernel=fast_nondeterministic", "refused by fast_nondeterministic: n=0"}));
  // Only the kernels the preference admits are asked why: a backend without kernels here says
  // nothing of the fast kernel's refusal.
  auto other =
      Plan<ScaleOp>::select(cpu, {0, DType::f32, false}, PlanPreference::only(Backend::cudnn));
  ASSERT_FALSE(other.ok());
  EXPECT_EQ(other.error().message().find("refused by"), std::string::npos)
      << other.error().message();
  EXPECT_TRUE(fails_with(
      Plan<ScaleOp>::select(cpu, {8, DType::f32, false}, PlanPreference::kernel("no_such_kernel")),
      ErrorKind::unsupported, {"preference=kernel=no_such_kernel"}));
}

TEST(Plan, RunValidatesBeforeLaunchingAndNeverWritesOnError) {
  const Stream cpu = Stream::cpu();
  auto plan = Plan<ScaleOp>::select(cpu, {4, DType::f32, true});
  BARACUDA_ASSERT_OK(plan);
  EXPECT_EQ(plan->workspace_size(), 64u);
  std::vector<float> x = {1, 2, 3, 4}, y(4, -7.0f);
  alignas(256) static float ws_storage[64];
  struct {
    float* data() { return ws_storage; }
  } ws;
  int64_t dims[] = {4};
  ScaleOp::Arguments args{make_tensor(y.data(), DType::f32, dims),
                          make_tensor(static_cast<const void*>(x.data()), DType::f32, dims)};
  auto too_small = plan->run(cpu, {ws.data(), 32, Location::host()}, args);
  ASSERT_FALSE(too_small.ok());
  EXPECT_EQ(too_small.error().kind(), ErrorKind::workspace_too_small);
  EXPECT_EQ(too_small.error().needed(), 64u);
  EXPECT_EQ(too_small.error().got(), 32u);
  EXPECT_EQ(y[0], -7.0f);
  auto misaligned =
      plan->run(cpu, {reinterpret_cast<char*>(ws.data()) + 4, 64, Location::host()}, args);
  EXPECT_TRUE(fails_with(&misaligned.error(), ErrorKind::misaligned_operand,
                         {"test_scale: workspace: data must be 256-byte aligned"}));
  EXPECT_EQ(y[0], -7.0f);
  ScaleOp::Arguments bad = args;
  bad.x.dtype = DType::f64;
  EXPECT_TRUE(fails_with(plan->run(cpu, {ws.data(), 64, Location::host()}, bad),
                         ErrorKind::invalid_problem, {"test_scale: x: dtype f64, expected f32"}));
  EXPECT_EQ(y[0], -7.0f);
  BARACUDA_ASSERT_OK(plan->run(cpu, {ws.data(), 64, Location::host()}, args));
  EXPECT_EQ(y[3], 8.0f);
}

TEST(Plan, RegistryListsEveryKernel) {
  int found = 0;
  for (const auto& k : registered_kernels())
    if (k.family == "test_scale") ++found;
  EXPECT_EQ(found, 2);
}

// ---- A kernel with argument rules of its own, and the plan's fallback ---------------------------
// "dense" takes unit-stride views only (its Kernel::check); "general" takes any view the op
// accepts. Each counts its launches (g_runs[kGeneral / kDense]), so a test sees which one ran.
struct CheckedScaleOp : ScaleOp {
  static constexpr std::string_view name = "test_checked_scale";
  static Status check_arguments(const Problem& p, const Arguments& a, Location where) {
    int64_t dims[] = {p.n};
    BARACUDA_TRY(validate::tensor(name, "y", a.y, p.dtype, dims, where));
    return validate::tensor(name, "x", a.x, p.dtype, dims, where);
  }
};
constexpr int kGeneral = 0, kDense = 1;
int g_runs[2] = {0, 0};
template <int K>
Status checked_scale(const LaunchContext&, const CheckedScaleOp::Problem& p,
                     const CheckedScaleOp::Arguments& a) {
  ++g_runs[K];
  for (int64_t i = 0; i < p.n; ++i) {
    const double x = load_as_double(a.x.data, p.dtype, i * a.x.stride[0]);
    store_from_double(a.y.data, p.dtype, i * a.y.stride[0], 2.0 * x);
  }
  return {};
}
template <int K>
size_t checked_workspace(const CheckedScaleOp::Problem&, const DeviceCaps&) {
  return K == kDense ? 64 : 128;
}
Status dense_rule(const CheckedScaleOp::Problem&, const CheckedScaleOp::Arguments& a) {
  if (a.x.stride[0] != 1)
    return Error::unsupported(
        "test_checked_scale: dense: x: stride[0]=" + std::to_string(a.x.stride[0]) + " is not 1");
  return {};
}
KernelSku checked_sku(std::string_view name, PrecisionGuarantee precision) {
  return {.category = "test",
          .op = "test_checked_scale",
          .element = DType::f32,
          .precision = precision,
          .name = name};
}
BARACUDA_REGISTER(register_kernel<CheckedScaleOp>(
    {.sku = checked_sku("general", {MathPrecision::f64, DType::f64, true, true}),
     .priority = 0,
     .workspace = checked_workspace<kGeneral>,
     .launch = checked_scale<kGeneral>}));
// Ranked above "general" but racy: a deterministic plan does not fall back to it.
BARACUDA_REGISTER(register_kernel<CheckedScaleOp>(
    {.sku = checked_sku("general_racy", {MathPrecision::f64, DType::f64, false, false}),
     .priority = 5,
     .workspace = checked_workspace<kGeneral>,
     .launch = checked_scale<kGeneral>}));
BARACUDA_REGISTER(register_kernel<CheckedScaleOp>(
    {.sku = checked_sku("dense", {MathPrecision::f32, DType::f32, true, false}),
     .priority = 10,
     .workspace = checked_workspace<kDense>,
     .launch = checked_scale<kDense>,
     .check = dense_rule}));

TEST(Plan, ViewsTheChosenKernelRefusesRunOnTheGeneralOne) {
  const Stream cpu = Stream::cpu();
  auto plan = Plan<CheckedScaleOp>::select(cpu, {4, DType::f32, false});
  BARACUDA_ASSERT_OK(plan);
  EXPECT_EQ(plan->sku().name, "dense");
  ASSERT_NE(plan->fallback_sku(), nullptr);
  // "general", not the higher-ranked "general_racy": dense is deterministic, and so is the plan.
  EXPECT_EQ(plan->fallback_sku()->name, "general");
  // What both keep: dense's f32 math and accumulator, determinism, neither's bit-stability.
  const PrecisionGuarantee g = plan->precision_guarantee();
  EXPECT_EQ(g.math, MathPrecision::f32);
  EXPECT_EQ(g.accumulator, DType::f32);
  EXPECT_TRUE(g.deterministic);
  EXPECT_FALSE(g.bit_stable);
  EXPECT_EQ(plan->workspace_size(), 128u);  // enough for either kernel

  alignas(256) static char ws[128];
  const float x[8] = {1, -1, 2, -2, 3, -3, 4, -4};
  float y[4] = {-7, -7, -7, -7};
  const int64_t dims[] = {4}, unit[] = {1}, two[] = {2};
  const CheckedScaleOp::Arguments dense{make_tensor(y, DType::f32, dims),
                                        make_tensor(static_cast<const void*>(x), DType::f32, dims)};
  CheckedScaleOp::Arguments strided = dense;
  strided.x = make_strided(static_cast<const void*>(x), DType::f32, dims, two);
  strided.y = make_strided(y, DType::f32, dims, unit);

  EXPECT_EQ(plan->sku(dense).name, "dense");
  EXPECT_EQ(plan->workspace_size(dense), 64u);
  g_runs[kGeneral] = g_runs[kDense] = 0;
  BARACUDA_ASSERT_OK(plan->run(cpu, {ws, 64, Location::host()}, dense));
  EXPECT_EQ(g_runs[kDense], 1);
  EXPECT_EQ(y[1], -2.0f);

  // The strided view breaks dense's rule but not the op's: accepted, and run on "general".
  BARACUDA_EXPECT_OK(plan->can_implement(strided));
  EXPECT_EQ(plan->sku(strided).name, "general");
  EXPECT_EQ(plan->workspace_size(strided), 128u);
  std::fill(y, y + 4, -7.0f);
  EXPECT_TRUE(fails_with(plan->run(cpu, {ws, 64, Location::host()}, strided),
                         ErrorKind::workspace_too_small,
                         {"test_checked_scale: workspace: needs 128"}));
  EXPECT_EQ(y[0], -7.0f);
  BARACUDA_ASSERT_OK(plan->run(cpu, {ws, 128, Location::host()}, strided));
  EXPECT_EQ(g_runs[kGeneral], 1);
  EXPECT_EQ(g_runs[kDense], 1);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(y[i], 2.0f * x[2 * i]) << i;

  // Views the op itself refuses are refused whichever kernel would have run.
  CheckedScaleOp::Arguments bad = strided;
  bad.x.dtype = DType::f64;
  EXPECT_TRUE(fails_with(plan->can_implement(bad), ErrorKind::invalid_problem,
                         {"test_checked_scale: x: dtype f64, expected f32"}));
  EXPECT_EQ(plan->workspace_size(bad), 0u);
  EXPECT_EQ(plan->sku(bad).name, "dense");

  // A pinned kernel is exactly that kernel: no fallback, its rule refuses the strided view.
  auto pinned =
      Plan<CheckedScaleOp>::select(cpu, {4, DType::f32, false}, PlanPreference::kernel("dense"));
  BARACUDA_ASSERT_OK(pinned);
  EXPECT_EQ(pinned->fallback_sku(), nullptr);
  EXPECT_EQ(pinned->workspace_size(), 64u);
  EXPECT_EQ(pinned->precision_guarantee().math, MathPrecision::f32);
  EXPECT_TRUE(pinned->precision_guarantee().deterministic);
  std::fill(y, y + 4, -7.0f);
  EXPECT_TRUE(fails_with(pinned->can_implement(strided), ErrorKind::unsupported,
                         {"test_checked_scale: dense: x: stride[0]=2 is not 1"}));
  EXPECT_TRUE(fails_with(pinned->run(cpu, {ws, 128, Location::host()}, strided),
                         ErrorKind::unsupported, {"stride[0]=2 is not 1"}));
  EXPECT_EQ(y[0], -7.0f);
  // A plan whose kernel has no rules of its own needs no fallback.
  auto general =
      Plan<CheckedScaleOp>::select(cpu, {4, DType::f32, false}, PlanPreference::kernel("general"));
  BARACUDA_ASSERT_OK(general);
  EXPECT_EQ(general->fallback_sku(), nullptr);
}

TEST(Plan, WeakestGuaranteeKeepsOnlyWhatBothPromise) {
  const PrecisionGuarantee exact{}, bf16{MathPrecision::bf16, DType::f32, false, true};
  const PrecisionGuarantee w = detail::weakest(exact, bf16);
  EXPECT_EQ(w.math, MathPrecision::bf16);
  EXPECT_EQ(w.accumulator, DType::f32);
  EXPECT_FALSE(w.deterministic);
  EXPECT_TRUE(w.bit_stable);
  EXPECT_EQ(to_string(detail::weakest(bf16, exact)), to_string(w));
}

TEST(Stream, CpuStreamAndDeviceQueries) {
  const Stream s = Stream::cpu();
  EXPECT_TRUE(s.is_cpu());
  EXPECT_EQ(s.memory_location(), Location::host());
  BARACUDA_EXPECT_OK(s.synchronize());
  if (!cuda_available()) {
    EXPECT_FALSE(Stream::create_cuda(0).ok());
    GTEST_SKIP() << "no CUDA device: CUDA stream checks run on the GPU machine";
  }
  auto cs = Stream::create_cuda(0);
  BARACUDA_ASSERT_OK(cs);
  EXPECT_GE(cs->caps().sm, 80);
  EXPECT_TRUE(fails_with(Stream::create_cuda(999), ErrorKind::wrong_device, {"device 999"}));
  auto buf = Buffer::allocate(256, Location::cuda(0));
  BARACUDA_ASSERT_OK(buf);
  EXPECT_EQ(query_pointer(buf->data()).kind, PointerKind::device);
  int host_value = 0;
  EXPECT_EQ(query_pointer(&host_value).kind, PointerKind::host);
}

TEST(Harness, PoisonAndWriteSetChecksCanFail) {
  harness::Rng rng;
  auto t = harness::TestTensor::make(DType::bf16, {3, 5}, harness::Target::cpu,
                                     harness::Layout::padded, &rng);
  t.fill_random(rng);
  auto before = t.bytes();
  t.poison();
  for (double v : t.values()) EXPECT_TRUE(std::isnan(v));
  auto after = t.bytes();
  EXPECT_TRUE(harness::untouched_outside(before, after, t.bit_mask(), "poison"));
  // A change outside the mask is caught.
  std::vector<uint8_t> empty_mask(after.size() * 8, 0);
  EXPECT_FALSE(harness::untouched_outside(before, after, empty_mask, "poison"));
  EXPECT_FALSE(harness::close_to({1.0, std::nan("")}, {1.0, 2.0}, DType::f32,
                                 harness::Accuracy::elementwise, "nan"));
  EXPECT_FALSE(harness::close_to({1.0, 2.1}, {1.0, 2.0}, DType::bf16,
                                 harness::Accuracy::elementwise, "off"));
  EXPECT_TRUE(harness::close_to({1.0, 2.0}, {1.0, 2.0}, DType::f64, harness::Accuracy::elementwise,
                                "same"));
}

// poison() has three paths (a dense view is one fill, other whole-byte views a per-element fill,
// sub-byte views a bit mask): each sets every bit of the view's elements and no bit of its gaps.
TEST(Harness, PoisonSetsEveryElementBitAndNoGapBit) {
  harness::Rng rng;
  for (const auto& [t, layout] : {std::pair{DType::bf16, harness::Layout::contiguous},
                                  std::pair{DType::f32, harness::Layout::padded},
                                  std::pair{DType::s8, harness::Layout::permuted},
                                  std::pair{DType::s4, harness::Layout::padded},
                                  std::pair{DType::bin, harness::Layout::padded}}) {
    SCOPED_TRACE(std::string(name(t)) + " " + harness::layout_name(layout));
    auto x = harness::TestTensor::make(t, {3, 4, 5}, harness::Target::cpu, layout, &rng);
    x.fill_random(rng);
    const auto before = x.bytes();
    x.poison();
    const auto after = x.bytes(), mask = x.bit_mask();
    EXPECT_TRUE(harness::untouched_outside(before, after, mask, "poison"));
    int64_t set = 0, unset = 0;
    for (size_t bit = 0; bit < mask.size(); ++bit)
      if (mask[bit]) ((after[bit / 8] >> (bit % 8)) & 1 ? set : unset) += 1;
    EXPECT_EQ(unset, 0);
    EXPECT_EQ(set, x.numel() * bits_of(t));
  }
}

TEST(Harness, WorkspacesArePoisoned) {
  auto ws = harness::poisoned_workspace(100, Location::host());
  BARACUDA_ASSERT_OK(ws);
  ASSERT_EQ(ws->bytes(), 100u);
  const auto* bytes = static_cast<const uint8_t*>(ws->data());
  for (size_t i = 0; i < ws->bytes(); ++i) ASSERT_EQ(bytes[i], 0xFF) << "byte " << i;
  float f = 0;
  std::memcpy(&f, bytes, sizeof f);
  EXPECT_TRUE(std::isnan(f));  // an f32 accumulator read before it was written is NaN
  BARACUDA_ASSERT_OK(harness::poisoned_workspace(0, Location::host()));
}

TEST(Harness, SubnormalRoundingIsRepresentationNotError) {
  // The CI failure this fixes (seed 845492442): an f16 gradient of 3.24e-7, correctly rounded to
  // the subnormal 2.98e-7 (5 x 2^-24), is 8% off: within one step of the type next to zero.
  using harness::Accuracy;
  EXPECT_TRUE(harness::close_to({2.98023223876953125e-7}, {3.2392528236286373e-7}, DType::f16,
                                Accuracy::elementwise, "rounded subnormal"));
  // Two steps off is an error; so is a wrong normal value, a NaN and an infinity.
  EXPECT_FALSE(harness::close_to({2.98023223876953125e-7}, {4.2e-7}, DType::f16,
                                 Accuracy::elementwise, "two steps"));
  EXPECT_FALSE(harness::close_to({1.0e-3}, {1.01e-3}, DType::f16, Accuracy::elementwise, "1%"));
  EXPECT_FALSE(harness::close_to({0.0}, {std::nan("")}, DType::f16, Accuracy::elementwise, "nan"));
  EXPECT_FALSE(harness::close_to({std::numeric_limits<double>::infinity()}, {1.0}, DType::f16,
                                 Accuracy::elementwise, "inf"));
  // bf16's and f32's steps are far below any value a test draws: no change there.
  EXPECT_FALSE(harness::close_to({3.0e-7}, {3.3e-7}, DType::bf16, Accuracy::elementwise, "bf16"));
}

TEST(Harness, DocumentedSlackAllowsThatMuchAndNoMore) {
  // The LSE of ForwardPagedKv's failing case (seed 170150184, H200): 3.18e-5 off at 5.48, f32's
  // reduction bound 2.30e-5 there; fa3's documented slack at cap 20 (2.4e-4) admits it, and an
  // error past bound + slack still fails, as do NaNs.
  using harness::Accuracy;
  const std::vector<double> ref = {5.4795981831003573, 3.0};
  const std::vector<double> got = {5.4796299934387207, 3.0};
  EXPECT_FALSE(harness::close_to(got, ref, DType::f32, Accuracy::reduction, "no slack"));
  EXPECT_TRUE(harness::close_to(got, ref, DType::f32, Accuracy::reduction, "slack", 2.4e-4));
  EXPECT_FALSE(harness::close_to({5.48 + 2.4e-4 + 3e-5, 3.0}, {5.48, 3.0}, DType::f32,
                                 Accuracy::reduction, "past the slack", 2.4e-4));
  EXPECT_FALSE(
      harness::close_to({std::nan(""), 3.0}, ref, DType::f32, Accuracy::reduction, "nan", 1.0));
}

TEST(Harness, TermBoundScalesWithTheMagnitudeOfTheTerms) {
  // ref 1e-3 formed from terms of total magnitude 100 (heavy cancellation): f32's reduction factor
  // 3.84e-6 allows an error of 3.84e-4 there, and nothing beyond it.
  const std::vector<double> ref{1e-3, 2.0}, terms{100.0, 2.0};
  EXPECT_TRUE(harness::close_to_terms({1.3e-3, 2.0}, ref, terms, DType::f32, "inside"));
  EXPECT_FALSE(harness::close_to_terms({1.5e-3, 2.0}, ref, terms, DType::f32, "outside"));
  EXPECT_FALSE(harness::close_to_terms({1e-3, 2.0 + 1e-5}, ref, terms, DType::f32, "no terms"));
  EXPECT_FALSE(harness::close_to_terms({1e-3, std::nan("")}, ref, terms, DType::f32, "nan"));
  EXPECT_FALSE(harness::close_to_terms({1e-3}, ref, terms, DType::f32, "size"));
}

// The rounded-weights bound (fp8 attention's P rounded to e4m3 before P V): weighted averages whose
// weights were each rounded once pass it, the same averages with two keys' weights swapped in every
// group of 16 (a fragment-layout bug) do not.
TEST(Harness, RoundedWeightsBoundSeparatesRoundingFromLayoutBugs) {
  harness::Rng rng;
  constexpr int kRows = 256, kKeys = 512;
  std::vector<double> ref(kRows), rounded(kRows), swapped(kRows);
  for (int r = 0; r < kRows; ++r) {
    std::vector<double> s(kKeys), v(kKeys);
    double mx = -1e300;
    for (int j = 0; j < kKeys; ++j) {
      s[j] = 3 * rng.uniform(-1, 1), v[j] = rng.uniform(-1, 1);
      mx = std::max(mx, s[j]);
    }
    double l = 0, y = 0, yr = 0, ys = 0;
    for (int j = 0; j < kKeys; ++j) l += std::exp(s[j] - mx);
    for (int j = 0; j < kKeys; ++j) {
      const double p = std::exp(s[j] - mx);
      const double pr = round_to(DType::e4m3, p * 256) / 256;  // as the kernel scales P
      const int k = j % 16 == 2 ? j + 6 : j % 16 == 8 ? j - 6 : j;
      y += p * v[j], yr += pr * v[j], ys += pr * v[k];
    }
    ref[r] = y / l, rounded[r] = yr / l, swapped[r] = ys / l;
  }
  EXPECT_TRUE(
      harness::close_to(rounded, ref, DType::e4m3, harness::Accuracy::rounded_weights, "rounded"));
  EXPECT_FALSE(
      harness::close_to(swapped, ref, DType::e4m3, harness::Accuracy::rounded_weights, "swapped"));
}

TEST(Harness, FiniteDifferencesCatchAWrongGradient) {
  harness::Rng rng;
  auto square = [](const std::vector<double>& x) {
    std::vector<double> y(x.size());
    for (size_t i = 0; i < x.size(); ++i) y[i] = x[i] * x[i];
    return y;
  };
  std::vector<double> x = {0.5, -1.5, 2.0}, dy = {1.0, 2.0, -1.0};
  std::vector<double> right = {1.0, -6.0, -4.0}, wrong = {1.0, -6.0, 4.0};
  EXPECT_TRUE(harness::gradient_matches_fd(square, x, dy, right, rng));
  EXPECT_FALSE(harness::gradient_matches_fd(square, x, dy, wrong, rng));
}

}  // namespace
}  // namespace baracuda

namespace baracuda {
namespace {

TEST(Harness, DeviceTensorsRoundTripAndHostMemoryIsRejected) {
  BARACUDA_SKIP_IF_UNAVAILABLE(harness::Target::cuda);
  harness::Rng rng;
  for (DType t : {DType::bf16, DType::f32, DType::s4, DType::bin, DType::c64}) {
    auto host = harness::TestTensor::make(t, {3, 7, 5}, harness::Target::cpu,
                                          harness::Layout::padded, &rng);
    auto dev = harness::TestTensor::make(t, {3, 7, 5}, harness::Target::cuda,
                                         harness::Layout::permuted, &rng);
    host.fill_random(rng);
    dev.set_values(host.values());
    EXPECT_EQ(dev.values(), host.values()) << name(t);
    auto before = dev.bytes();
    dev.poison();
    EXPECT_TRUE(harness::untouched_outside(before, dev.bytes(), dev.bit_mask(), "poison"));
  }
  // A view that claims to live on the GPU but points at host memory is caught, not dereferenced.
  std::vector<float> host_mem(16);
  int64_t dims[] = {16};
  Tensor lie = make_tensor(host_mem.data(), DType::f32, dims, Location::cuda(0));
  EXPECT_TRUE(harness::fails_with(
      &validate::tensor("op", "y", lie, DType::f32, dims, Location::cuda(0)).error(),
      ErrorKind::wrong_device, {"is host memory"}));
  auto dev_buf = Buffer::allocate(64, Location::cuda(0));
  BARACUDA_ASSERT_OK(dev_buf);
  Tensor wrong_side = make_tensor(dev_buf->data(), DType::f32, dims, Location::host());
  EXPECT_TRUE(harness::fails_with(
      &validate::tensor("op", "x", wrong_side, DType::f32, dims, Location::host()).error(),
      ErrorKind::wrong_device, {"is device memory"}));
}

}  // namespace
}  // namespace baracuda

namespace baracuda {
namespace {

TEST(Harness, WindowBitMaskIsExactForSubByteWindows) {
  harness::Rng rng;
  auto t = harness::TestTensor::make(DType::s4, {2, 9}, harness::Target::cpu);
  const auto mask = t.window_bit_mask({1, 3}, {1, 3});  // row 1, elements 3..5: bits at odd nibble
  int64_t set = 0;
  for (uint8_t m : mask) set += m;
  EXPECT_EQ(set, 12);
  const int64_t row1_bit = t.view().stride[0] * 4;  // contiguous: row pitch 9 elements
  EXPECT_EQ(mask[static_cast<size_t>(row1_bit + 3 * 4)], 1);
  EXPECT_EQ(mask[static_cast<size_t>(row1_bit + 3 * 4 - 1)], 0);
  EXPECT_EQ(mask[static_cast<size_t>(row1_bit + 6 * 4)], 0);
}

// cpu::parallel_for runs every index exactly once, on at most the threads asked (one: the calling
// thread alone), and cpu_threads() is the host's cores unless set.
TEST(CpuParallel, EveryIndexOnceOnAtMostTheThreadsAsked) {
  constexpr int64_t kN = 1000;
  for (int64_t threads : {int64_t{1}, int64_t{3}, int64_t{16}}) {
    SCOPED_TRACE("threads " + std::to_string(threads));
    std::vector<std::atomic<int>> runs(kN);
    std::mutex m;
    std::set<std::thread::id> ids;
    cpu::parallel_for(
        kN,
        [&](int64_t i) {
          runs[static_cast<size_t>(i)]++;
          const std::lock_guard<std::mutex> lock(m);
          ids.insert(std::this_thread::get_id());
        },
        threads);
    for (int64_t i = 0; i < kN; ++i) ASSERT_EQ(runs[static_cast<size_t>(i)].load(), 1) << i;
    EXPECT_LE(static_cast<int64_t>(ids.size()), threads);
    if (threads == 1) {
      EXPECT_EQ(*ids.begin(), std::this_thread::get_id());
    }
  }
  const int64_t cores = std::max<int64_t>(1, std::thread::hardware_concurrency());
  EXPECT_EQ(cpu_threads(), cores);
  set_cpu_threads(5);
  EXPECT_EQ(cpu_threads(), 5);
  set_cpu_threads(0);
  EXPECT_EQ(cpu_threads(), cores);
  int calls = 0;
  cpu::parallel_for(0, [&](int64_t) { ++calls; });  // nothing to do: no call, no thread
  EXPECT_EQ(calls, 0);
  // A slice's exception reaches the caller, as without threads.
  EXPECT_THROW(cpu::parallel_for(
                   100,
                   [](int64_t i) {
                     if (i == 37) throw std::bad_alloc();
                   },
                   4),
               std::bad_alloc);
}

}  // namespace
}  // namespace baracuda
