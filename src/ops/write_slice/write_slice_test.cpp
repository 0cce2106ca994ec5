// write_slice and kv_append: every dtype x rank 1..8 x random windows x layouts on every target,
// the fast-path analysis, the sub-byte merge at odd offsets, determinism, and every error path.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "baracuda/core/validate.hpp"
#include "baracuda/ops/write_slice.hpp"
#include "core/testing/testing.hpp"
#include "ops/write_slice/dtypes.hpp"
#include "ops/write_slice/fastdiv.hpp"

namespace baracuda {
namespace {

using harness::Layout;
using harness::Rng;
using harness::Target;
using harness::TestTensor;
using write_slice_detail::Path;
using Ranges = std::vector<std::pair<int64_t, int64_t>>;

// Bits of the window [start, start + extent) of `t` in its buffer (one byte per bit). Computed
// here rather than with TestTensor::window, whose view cannot start inside a byte (odd s4/bin
// offsets).
std::vector<uint8_t> window_mask(const TestTensor& t, const Ranges& r) {
  std::vector<uint8_t> mask(static_cast<size_t>(t.buffer_bytes()) * 8, 0);
  const Tensor v = t.view();
  const int64_t base_bit =
      (static_cast<const char*>(v.data) - static_cast<const char*>(t.buffer_data())) * 8;
  const int bits = bits_of(v.dtype);
  std::vector<int64_t> ext;
  for (const auto& [s, e] : r) ext.push_back(e - s);
  const int64_t n = harness::numel_of(ext);
  for (int64_t i = 0; i < n; ++i) {
    const auto idx = harness::unravel(i, ext);
    int64_t off = 0;
    for (int d = 0; d < v.rank; ++d) off += (r[d].first + idx[d]) * v.stride[d];
    for (int b = 0; b < bits; ++b) mask[static_cast<size_t>(base_bit + off * bits + b)] = 1;
  }
  return mask;
}

void upload(TestTensor& t, const std::vector<uint8_t>& host) {
  const Location where = harness::location_for(t.target());
  BARACUDA_EXPECT_OK(
      copy_bytes(t.buffer_data(), where, host.data(), Location::host(), host.size()));
  // A pageable host-to-device cudaMemcpy may return before its DMA lands, and the plan runs on a
  // non-blocking stream; a device-to-host read-back on the same (legacy) stream waits for it.
  uint8_t last = 0;
  BARACUDA_EXPECT_OK(copy_bytes(&last, Location::host(),
                                static_cast<const uint8_t*>(t.buffer_data()) + host.size() - 1,
                                where, 1));
}

// Sets every bit of the mask to 1: NaN for floats, -1/max for integers, so unwritten elements of
// the window show up.
std::vector<uint8_t> poison_bits(TestTensor& t, const std::vector<uint8_t>& mask) {
  std::vector<uint8_t> host = t.bytes();
  for (size_t i = 0; i < host.size(); ++i)
    for (int b = 0; b < 8; ++b)
      if (mask[i * 8 + b]) host[i] |= static_cast<uint8_t>(1u << b);
  upload(t, host);
  return host;
}

// Row-major expected values of dest after the write: dest's values with the window replaced.
template <class V>
std::vector<V> expected_after(const std::vector<V>& dest, const std::vector<int64_t>& dest_shape,
                              const std::vector<V>& src, const Ranges& r) {
  std::vector<int64_t> ext;
  for (const auto& [s, e] : r) ext.push_back(e - s);
  std::vector<V> out = dest;
  for (size_t i = 0; i < dest.size(); ++i) {
    const auto idx = harness::unravel(static_cast<int64_t>(i), dest_shape);
    bool inside = true;
    int64_t si = 0;
    for (size_t d = 0; d < idx.size() && inside; ++d) {
      inside = idx[d] >= r[d].first && idx[d] < r[d].second;
      si = si * ext[d] + (idx[d] - r[d].first);
    }
    if (inside) out[i] = src[static_cast<size_t>(si)];
  }
  return out;
}

struct CaseResult {
  std::string sku;
  Path path = Path::empty;
  bool ran = false;  // false: the pinned kernel does not serve this case (nothing was checked)
};

// One write: random dest and source, poisoned window, run, then every check the standards ask
// for: values vs the reference, bits outside the window untouched, a second run bit-identical.
// `pin`: run on that kernel (PlanPreference::kernel) instead of the default plan; a kernel that
// does not serve the case is reported through result->ran, any other select error fails.
void check_write(Target target, DType dtype, const std::vector<int64_t>& dest_shape,
                 const Ranges& ranges, TestTensor& dest, TestTensor& src, Rng& rng,
                 CaseResult* result = nullptr, std::string_view pin = {}) {
  const std::string what = std::string(name(dtype)) + " dest " + describe(dest.view()) +
                           " source " + describe(src.view());
  SCOPED_TRACE(what);
  dest.fill_random(rng);
  src.fill_random(rng);
  auto desc = WriteSliceOp::Descriptor::for_views(dest.view(), src.cview(), ranges);
  const Stream& stream = harness::stream_for(target);
  auto plan = WriteSlicePlan::select(
      stream, desc, pin.empty() ? PlanPreference::fastest() : PlanPreference::kernel(pin));
  if (!pin.empty() && !plan.ok() && plan.error().kind() == ErrorKind::unsupported) {
    if (result) *result = {};
    return;
  }
  BARACUDA_ASSERT_OK(plan);
  EXPECT_TRUE(plan->precision_guarantee().deterministic);
  if (!pin.empty()) {
    EXPECT_EQ(plan->sku().name, pin);
  }
  if (result) *result = {std::string(plan->sku().name), plan->problem().path, true};
  const auto mask = window_mask(dest, ranges);
  const auto before = poison_bits(dest, mask);
  const auto ref = expected_after(dest.values(), dest_shape, src.values(), ranges);
  const auto ref_c = is_complex(dtype) ? expected_after(dest.complex_values(), dest_shape,
                                                        src.complex_values(), ranges)
                                       : std::vector<std::complex<double>>{};
  const WriteSliceOp::Arguments args{dest.view(), src.cview()};
  BARACUDA_ASSERT_OK(plan->run(stream, Workspace::none(), args));
  const auto after = dest.bytes();
  EXPECT_TRUE(harness::close_to(dest.values(), ref, dtype, harness::Accuracy::exact, "dest"));
  if (is_complex(dtype)) {
    const auto got = dest.complex_values();
    std::vector<double> im_got, im_ref;
    for (size_t i = 0; i < got.size(); ++i) im_got.push_back(got[i].imag());
    for (const auto& c : ref_c) im_ref.push_back(c.imag());
    EXPECT_TRUE(harness::close_to(im_got, im_ref, dtype, harness::Accuracy::exact, "dest.imag"));
  }
  EXPECT_TRUE(harness::untouched_outside(before, after, mask, "dest outside the window"));
  // Determinism: the same write from the same state gives the same bits.
  upload(dest, before);
  BARACUDA_ASSERT_OK(plan->run(stream, Workspace::none(), args));
  EXPECT_TRUE(harness::bytes_equal(after, dest.bytes(), "second run"));
}

// TestTensor::make, except that a dense sub-byte tensor whose rows are not whole bytes (illegal:
// rows must start on a byte) gets its row pitch rounded up to the next byte instead.
TestTensor make(DType dtype, const std::vector<int64_t>& shape, Target target, Layout layout,
                Rng& rng) {
  const int epb = elements_per_byte(dtype);
  if (layout != Layout::contiguous || epb == 1 || (shape.back() % epb == 0 && shape.back() > 0))
    return TestTensor::make(dtype, shape, target, layout, &rng);
  std::vector<int64_t> strides(shape.size(), 1);
  int64_t pitch = std::max<int64_t>(1, (shape.back() + epb - 1) / epb) * epb;
  for (size_t d = shape.size() - 1; d-- > 0;) {
    strides[d] = pitch;
    pitch *= shape[d];
  }
  return TestTensor::with_strides(dtype, shape, strides, 0, target);
}

Ranges random_ranges(const std::vector<int64_t>& shape, Rng& rng, bool allow_empty) {
  Ranges r;
  for (int64_t n : shape) {
    const int64_t s = rng.integer(0, n - 1);
    r.emplace_back(s, rng.integer(s + 1, n));
  }
  if (allow_empty && rng.integer(0, 7) == 0) {  // an empty window on one random axis
    auto& [s, e] = r[static_cast<size_t>(rng.integer(0, static_cast<int64_t>(r.size()) - 1))];
    e = s;
  }
  return r;
}

std::vector<int64_t> random_shape(int rank, DType dtype, Rng& rng) {
  // Small enough for the CPU suite; the innermost axis is longer so sub-byte windows start and
  // end at odd offsets and rows hold several bytes.
  static constexpr int64_t kMax[] = {0, 40, 12, 6, 4, 3, 3, 2, 2};
  std::vector<int64_t> s;
  for (int d = 0; d < rank; ++d) s.push_back(rng.integer(1, kMax[rank]));
  s.back() = rng.integer(1, kMax[rank] * 2 + 5);
  return s;
}

std::vector<int64_t> extents_of(const Ranges& r) {
  std::vector<int64_t> e;
  for (const auto& [s, t] : r) e.push_back(t - s);
  return e;
}

// Each GPU case runs on the default plan, then pinned (PlanPreference::kernel) to every CUDA
// kernel of the family that serves it, so every kernel is verified by the same checks whatever
// its priority. The CPU reference is one kernel. "" = the default plan.
std::vector<std::string_view> variants_for(Target t) {
  if (t == Target::cpu) return {""};
  return {"",
          "kv_2d_tapered",
          "kv_2d",
          "generic_flat",
          "generic_v16",
          "subbyte_merge_words",
          "subbyte_merge"};
}
std::string variant_trace(std::string_view pin) {
  return pin.empty() ? "default plan" : "pinned to " + std::string(pin);
}

// The CUDA kernel the default plan picks for each path.
std::string default_sku(Path p) {
  switch (p) {
    case Path::empty:
    case Path::contiguous_chunk:
      return "contiguous_chunk";
    case Path::whole_copy:
      return "whole_copy";
    case Path::pitched_2d:
      return "kv_2d_tapered";
    case Path::generic:
      return "generic_flat";
    case Path::subbyte_merge:
      return "subbyte_merge_words";
  }
  return "?";
}
std::string expected_sku(Target t, Path p, std::string_view pin) {
  if (t == Target::cpu) return "reference";
  return pin.empty() ? default_sku(p) : std::string(pin);
}

// Which kernels a test ran; a test names the kernels its cases must have exercised, so a pin that
// silently never fits cannot pass for a check.
struct RanKernels {
  std::set<std::string> names;
  void add(const CaseResult& r) {
    if (r.ran) names.insert(r.sku);
  }
  void expect(Target t, std::initializer_list<std::string_view> kernels) const {
    if (t == Target::cpu) return;
    for (std::string_view k : kernels)
      EXPECT_TRUE(names.count(std::string(k))) << "no case of this test ran on kernel " << k;
  }
};

std::string target_param_name(const ::testing::TestParamInfo<Target>& info) {
  return harness::target_name(info.param);
}

class WriteSlice : public ::testing::TestWithParam<Target> {};
INSTANTIATE_TEST_SUITE_P(Targets, WriteSlice, ::testing::ValuesIn(harness::all_targets()),
                         target_param_name);

// The matrix the issue asks for: every dtype x rank 1..8 x random windows x contiguous, padded and
// permuted layouts for dest and source.
TEST_P(WriteSlice, EveryDtypeRankAndLayout) {
  const Target target = GetParam();
  BARACUDA_SKIP_IF_UNAVAILABLE(target);
  const auto layouts = harness::all_layouts();
  RanKernels ran;
  for (std::string_view pin : variants_for(target)) {
    SCOPED_TRACE(variant_trace(pin));
    Rng rng;
    for (DType dtype : write_slice_dtypes::kAll)
      for (int rank = 1; rank <= kMaxRank; ++rank)
        for (size_t l = 0; l < layouts.size(); ++l) {
          const auto shape = random_shape(rank, dtype, rng);
          const Ranges ranges = random_ranges(shape, rng, true);
          auto dest = make(dtype, shape, target, layouts[l], rng);
          auto src =
              make(dtype, extents_of(ranges), target, layouts[(l + 1) % layouts.size()], rng);
          CaseResult r;
          check_write(target, dtype, shape, ranges, dest, src, rng, &r, pin);
          if (HasFatalFailure()) return;
          if (r.ran) {
            EXPECT_EQ(r.sku, expected_sku(target, r.path, pin));
          }
          ran.add(r);
        }
  }
  ran.expect(target, {"kv_2d_tapered", "kv_2d", "generic_flat", "generic_v16",
                      "subbyte_merge_words", "subbyte_merge"});
}

// Sub-byte windows at every odd/even combination of start and end, on rows of several bytes.
TEST_P(WriteSlice, SubByteWindowsAtOddOffsets) {
  const Target target = GetParam();
  BARACUDA_SKIP_IF_UNAVAILABLE(target);
  RanKernels ran;
  for (std::string_view pin : variants_for(target)) {
    SCOPED_TRACE(variant_trace(pin));
    Rng rng;
    for (DType dtype : {DType::s4, DType::u4, DType::bin}) {
      const int epb = elements_per_byte(dtype);
      for (int64_t start : {int64_t{0}, int64_t{1}, int64_t{epb - 1}, int64_t{epb + 1}})
        for (int64_t len : {int64_t{1}, int64_t{epb}, int64_t{2 * epb + 1}, int64_t{5 * epb}}) {
          const std::vector<int64_t> shape = {3, 2, start + len + rng.integer(0, 2 * epb)};
          const Ranges ranges = {{1, 3}, {0, 2}, {start, start + len}};
          auto dest =
              TestTensor::make(dtype, {shape[0], shape[1], (shape[2] + epb - 1) / epb * epb},
                               target, Layout::contiguous, &rng);
          // A dense dest whose rows are whole bytes, plus a padded source.
          auto src = TestTensor::make(dtype, extents_of(ranges), target, Layout::padded, &rng);
          CaseResult r;
          const std::vector<int64_t> dshape = dest.shape();
          check_write(target, dtype, dshape, ranges, dest, src, rng, &r, pin);
          if (HasFatalFailure()) return;
          ran.add(r);
          if (!r.ran) continue;
          const bool aligned = start % epb == 0 && len % epb == 0;
          EXPECT_EQ(r.path == Path::subbyte_merge, !aligned)
              << name(dtype) << " start " << start << " len " << len << " took "
              << write_slice_detail::to_string(r.path);
          EXPECT_EQ(r.sku, expected_sku(target, r.path, pin));
        }
    }
  }
  ran.expect(target, {"subbyte_merge_words", "subbyte_merge", "generic_v16"});
}

// Each fast path is chosen for the layout it serves, and is correct there.
TEST_P(WriteSlice, FastPathsAreSelectedAndCorrect) {
  const Target target = GetParam();
  BARACUDA_SKIP_IF_UNAVAILABLE(target);
  Rng rng;
  struct Case {
    std::vector<int64_t> shape;
    Ranges ranges;
    Layout dest_layout;
    Path path;
  };
  const std::vector<Case> cases = {
      {{4, 6}, {{0, 4}, {0, 6}}, Layout::contiguous, Path::whole_copy},
      {{8, 4, 6}, {{2, 5}, {0, 4}, {0, 6}}, Layout::contiguous, Path::contiguous_chunk},
      {{3, 1, 5, 7}, {{1, 2}, {0, 1}, {2, 4}, {0, 7}}, Layout::contiguous, Path::contiguous_chunk},
      {{2, 3, 16, 8}, {{0, 2}, {0, 3}, {5, 9}, {0, 8}}, Layout::contiguous, Path::pitched_2d},
      {{2, 3, 16, 8}, {{0, 2}, {1, 3}, {5, 9}, {2, 7}}, Layout::contiguous, Path::generic},
      {{5, 7}, {{1, 4}, {2, 6}}, Layout::padded, Path::pitched_2d},
      {{4, 6}, {{2, 2}, {0, 6}}, Layout::contiguous, Path::empty},
  };
  RanKernels ran;
  for (std::string_view pin : variants_for(target)) {
    SCOPED_TRACE(variant_trace(pin));
    for (DType dtype : {DType::bf16, DType::u8, DType::c128, DType::f32}) {
      for (const Case& c : cases) {
        auto dest = TestTensor::make(dtype, c.shape, target, c.dest_layout, &rng);
        auto src = TestTensor::make(dtype, extents_of(c.ranges), target, Layout::contiguous, &rng);
        CaseResult r;
        check_write(target, dtype, c.shape, c.ranges, dest, src, rng, &r, pin);
        if (HasFatalFailure()) return;
        ran.add(r);
        if (!r.ran) continue;
        EXPECT_EQ(r.path, c.path) << "took " << write_slice_detail::to_string(r.path);
        EXPECT_EQ(r.sku, expected_sku(target, c.path, pin));
      }
    }
  }
  ran.expect(target, {"kv_2d_tapered", "kv_2d", "generic_flat", "generic_v16"});
  // Byte-aligned sub-byte windows take the byte paths.
  auto dest = TestTensor::make(DType::s4, {6, 8}, target, Layout::contiguous, &rng);
  auto src = TestTensor::make(DType::s4, {2, 8}, target, Layout::contiguous, &rng);
  CaseResult r;
  check_write(target, DType::s4, {6, 8}, {{3, 5}, {0, 8}}, dest, src, rng, &r);
  EXPECT_EQ(r.path, Path::contiguous_chunk);
}

// Permuted destination axes still coalesce: a window that is dense in memory order is one chunk.
TEST_P(WriteSlice, CoalescesPermutedAxesAndBroadcastSource) {
  const Target target = GetParam();
  BARACUDA_SKIP_IF_UNAVAILABLE(target);
  Rng rng;
  // dest [4,5,6] stored as axis order (1,0,2): strides {6, 24, 1}.
  auto dest = TestTensor::with_strides(DType::f16, {4, 5, 6}, {6, 24, 1}, 3, target);
  auto src = TestTensor::make(DType::f16, {4, 2, 6}, target, Layout::contiguous, &rng);
  CaseResult r;
  check_write(target, DType::f16, {4, 5, 6}, {{0, 4}, {3, 5}, {0, 6}}, dest, src, rng, &r);
  // Source axes (4,2,6) strides {12,6,1} vs dest {6,24,1}: after sorting by dest stride the
  // axes do not nest on both sides, so two outer axes remain.
  EXPECT_EQ(r.path, Path::generic);
  // A broadcast source (stride 0 on axis 0): every dest row gets the same values.
  auto dest2 = TestTensor::make(DType::i64, {5, 9}, target, Layout::padded, &rng);
  auto bsrc = TestTensor::with_strides(DType::i64, {3, 4}, {0, 1}, 1, target);
  check_write(target, DType::i64, {5, 9}, {{1, 4}, {2, 6}}, dest2, bsrc, rng, &r);
  EXPECT_EQ(r.path, Path::pitched_2d);  // one outer axis, source pitch 0
}

// Larger GPU shapes: the vectorized paths on real sizes, misaligned bases (16-byte accesses must
// fall back), the KV-cache window and a long sub-byte merge.
TEST_P(WriteSlice, LargeShapesOnDevice) {
  const Target target = GetParam();
  if (target == Target::cpu)
    GTEST_SKIP() << "large shapes run on the GPU only (CPU suite stays fast)";
  BARACUDA_SKIP_IF_UNAVAILABLE(target);
  RanKernels ran;
  for (std::string_view pin : variants_for(target)) {
    SCOPED_TRACE(variant_trace(pin));
    Rng rng;
    // One case: check it on this variant, and when it ran, that the default plan took `path`'s
    // kernel (a pinned run takes the pinned one).
    auto run_case = [&](DType dtype, TestTensor& dest, TestTensor& src, const Ranges& ranges,
                        std::optional<Path> path) {
      CaseResult r;
      check_write(target, dtype, dest.shape(), ranges, dest, src, rng, &r, pin);
      ran.add(r);
      if (!r.ran) return;
      if (path) {
        EXPECT_EQ(r.path, *path) << "took " << write_slice_detail::to_string(r.path);
        EXPECT_EQ(r.sku, expected_sku(target, *path, pin));
      }
    };
    {
      auto dest = TestTensor::make(DType::bf16, {4, 8, 256, 128}, target, Layout::contiguous, &rng);
      auto src = TestTensor::make(DType::bf16, {4, 8, 7, 128}, target, Layout::contiguous, &rng);
      run_case(DType::bf16, dest, src, {{0, 4}, {0, 8}, {100, 107}, {0, 128}}, Path::pitched_2d);
    }
    {
      // KV window rows of 297 x 256 bytes: rows of several blocks' spans, a partial span at
      // every row end.
      auto dest =
          TestTensor::make(DType::bf16, {16, 8, 512, 128}, target, Layout::contiguous, &rng);
      auto src = TestTensor::make(DType::bf16, {16, 8, 297, 128}, target, Layout::contiguous, &rng);
      run_case(DType::bf16, dest, src, {{0, 16}, {0, 8}, {3, 300}, {0, 128}}, Path::pitched_2d);
    }
    {
      // A 12 MiB KV window of 128 KiB rows: kv_2d_tapered's big tiles, then its quarter-size
      // tail tiles (the last two waves: 8.25 MiB on 132 SMs), each row cut into whole tiles.
      auto dest =
          TestTensor::make(DType::bf16, {6, 16, 1024, 128}, target, Layout::contiguous, &rng);
      auto src = TestTensor::make(DType::bf16, {6, 16, 512, 128}, target, Layout::contiguous, &rng);
      run_case(DType::bf16, dest, src, {{0, 6}, {0, 16}, {100, 612}, {0, 128}}, Path::pitched_2d);
    }
    {
      // s4 KV window: 32 KiB rows, byte-aligned window.
      auto dest = TestTensor::make(DType::s4, {4, 8, 1024, 128}, target, Layout::contiguous, &rng);
      auto src = TestTensor::make(DType::s4, {4, 8, 512, 128}, target, Layout::contiguous, &rng);
      run_case(DType::s4, dest, src, {{0, 4}, {0, 8}, {10, 522}, {0, 128}}, Path::pitched_2d);
    }
    {
      // A 16-byte-granular layout on a base 4 bytes off alignment: 4-byte units, exact.
      auto dest = TestTensor::with_strides(DType::f32, {64, 1100}, {1104, 1}, 1, target);
      auto src = TestTensor::with_strides(DType::f32, {60, 1024}, {1024, 1}, 3, target);
      run_case(DType::f32, dest, src, {{2, 62}, {8, 1032}}, Path::pitched_2d);
    }
    {
      // Base offset of 1 element: 16-byte accesses are impossible, the fallback must be exact.
      auto dest = TestTensor::with_strides(DType::bf16, {64, 1000}, {1000, 1}, 1, target);
      auto src = TestTensor::with_strides(DType::bf16, {64, 999}, {999, 1}, 3, target);
      run_case(DType::bf16, dest, src, {{0, 64}, {1, 1000}}, std::nullopt);
    }
    {
      // One 4 MiB row: the memcpy path (and the generic kernel pinned on one long row).
      auto dest = TestTensor::make(DType::f32, {1 << 20}, target, Layout::contiguous, &rng);
      auto src = TestTensor::make(DType::f32, {(1 << 20) - 1000}, target, Layout::contiguous, &rng);
      run_case(DType::f32, dest, src, {{500, (1 << 20) - 500}}, Path::contiguous_chunk);
    }
    {
      auto dest = TestTensor::make(DType::s4, {33, 5000}, target, Layout::padded, &rng);
      auto src = TestTensor::make(DType::s4, {31, 4001}, target, Layout::padded, &rng);
      run_case(DType::s4, dest, src, {{1, 32}, {333, 4334}}, Path::subbyte_merge);
    }
    {
      auto dest = TestTensor::make(DType::c128, {6, 5, 4, 33}, target, Layout::permuted, &rng);
      auto src = TestTensor::make(DType::c128, {3, 5, 2, 30}, target, Layout::permuted, &rng);
      run_case(DType::c128, dest, src, {{2, 5}, {0, 5}, {1, 3}, {3, 33}}, std::nullopt);
    }
    {
      // Byte units (odd row length and offset) over 4 MiB: more units than one wave of blocks
      // covers in one step, so the flat kernel's spans take several steps per block.
      auto dest = TestTensor::make(DType::u8, {1024, 4099}, target, Layout::contiguous, &rng);
      auto src = TestTensor::make(DType::u8, {1024, 4097}, target, Layout::contiguous, &rng);
      run_case(DType::u8, dest, src, {{0, 1024}, {1, 4098}}, Path::pitched_2d);
    }
    {
      // Four outer axes of odd extents (row decomposition through every divisor), 16-byte units.
      auto dest = TestTensor::make(DType::f32, {7, 5, 9, 11, 64}, target, Layout::contiguous, &rng);
      auto src = TestTensor::make(DType::f32, {6, 3, 7, 9, 32}, target, Layout::contiguous, &rng);
      run_case(DType::f32, dest, src, {{1, 7}, {1, 4}, {2, 9}, {1, 10}, {16, 48}}, Path::generic);
    }
    for (DType dtype : {DType::s4, DType::u4, DType::bin}) {
      // Sub-byte rows at an odd byte pitch (no row is 4-byte aligned), windows starting and ending
      // inside bytes, source rows at another bit phase: head, body and tail words of the merge.
      const int64_t epb = elements_per_byte(dtype);
      const int64_t cols = 1027 * epb;  // row pitch 1027 bytes
      for (int64_t start : {int64_t{1}, epb + 1, 3 * epb - 1})
        for (int64_t len : {int64_t{1}, int64_t{31}, cols - start - 1}) {
          auto dest = TestTensor::make(dtype, {37, cols}, target, Layout::contiguous, &rng);
          auto src = TestTensor::make(dtype, {35, len}, target, Layout::padded, &rng);
          run_case(dtype, dest, src, {{1, 36}, {start, start + len}}, Path::subbyte_merge);
          if (HasFatalFailure()) return;
        }
    }
  }
  ran.expect(target, {"kv_2d_tapered", "kv_2d", "generic_flat", "generic_v16",
                      "subbyte_merge_words", "subbyte_merge"});
}

// FastDiv (fastdiv.hpp) against `/` and `%` on divisors and dividends around every power of two,
// the extremes and random values (host path; the device path differs only in its umulhi).
TEST(WriteSliceFastDiv, MatchesDivisionEverywhere) {
  using write_slice_detail::FastDiv;
  Rng rng;
  std::vector<uint64_t> ds, ns = {0, 1, 2, 3, (uint64_t{1} << 63) - 1, ~uint64_t{0}};
  for (uint64_t d = 1; d <= 300; ++d) ds.push_back(d);
  for (int k = 1; k < 63; ++k)
    for (int64_t dd : {-1, 0, 1}) {
      ds.push_back((uint64_t{1} << k) + static_cast<uint64_t>(dd));
      ns.push_back((uint64_t{1} << k) + static_cast<uint64_t>(dd));
    }
  for (int i = 0; i < 200; ++i) {
    ds.push_back(static_cast<uint64_t>(rng.integer(1, std::numeric_limits<int64_t>::max())));
    ns.push_back(static_cast<uint64_t>(rng.integer(0, std::numeric_limits<int64_t>::max())) * 2 +
                 static_cast<uint64_t>(rng.integer(0, 1)));
  }
  int64_t bad = 0;
  for (uint64_t d : ds) {
    const FastDiv f(d);
    for (uint64_t n : ns) {
      uint64_t q, r;
      f.divmod(n, &q, &r);
      if (q != n / d || r != n % d) {
        if (++bad <= 5) ADD_FAILURE() << n << " / " << d << ": got " << q << " rem " << r;
      }
    }
  }
  EXPECT_EQ(bad, 0);
}

// ---- errors
// -----------------------------------------------------------------------------------------
WriteSliceOp::Descriptor basic(DType t = DType::f32) {
  WriteSliceOp::Descriptor d;
  d.dtype = t;
  d.dest_shape = {4, 8};
  d.ranges = {{1, 3}, {0, 8}};
  d.source_shape = {2, 8};
  return d;
}

TEST(WriteSliceErrors, DescriptorRules) {
  using harness::fails_with;
  const Stream cpu = Stream::cpu();
  auto expect = [&](WriteSliceOp::Descriptor d, ErrorKind kind,
                    std::initializer_list<std::string_view> needles) {
    EXPECT_TRUE(fails_with(WriteSlicePlan::select(cpu, d), kind, needles));
  };
  const ErrorKind inv = ErrorKind::invalid_problem;
  auto d = basic();
  BARACUDA_EXPECT_OK(WriteSlicePlan::select(cpu, d));
  d = basic(), d.dest_shape = {}, d.ranges = {}, d.source_shape = {};
  expect(d, inv, {"write_slice: dest_shape: rank 0 is outside [1, 8]"});
  d = basic(), d.dest_shape.assign(9, 1), d.ranges.assign(9, {0, 1}), d.source_shape.assign(9, 1);
  expect(d, inv, {"write_slice: dest_shape: rank 9 is outside [1, 8]"});
  d = basic(), d.dest_shape = {4, -1};
  expect(d, inv, {"write_slice: dest_shape: shape[1]=-1 is negative"});
  d = basic(), d.ranges = {{0, 1}};
  expect(d, inv, {"write_slice: ranges: 1 entries for rank 2"});
  d = basic(), d.source_shape = {2};
  expect(d, inv, {"write_slice: source_shape: rank 1, expected 2"});
  d = basic(), d.ranges[0] = {-1, 2}, d.source_shape[0] = 3;
  expect(d, inv, {"write_slice: ranges[0]=(-1,2): start < 0"});
  d = basic(), d.dest_shape = {4, 8, 9}, d.ranges = {{0, 1}, {0, 1}, {5, 3}},
  d.source_shape = {1, 1, 0};
  expect(d, inv, {"write_slice: ranges[2]=(5,3): start > end"});
  d = basic(), d.ranges[1] = {0, 9}, d.source_shape[1] = 9;
  expect(d, inv, {"write_slice: ranges[1]=(0,9): end > dest_shape[1]=8"});
  d = basic(), d.source_shape[0] = 3;
  expect(d, inv, {"write_slice: source_shape[0]=3, expected end - start = 2 for ranges[0]"});
  d = basic(), d.dest_stride = {8};
  expect(d, inv, {"write_slice: dest_stride: 1 entries for rank 2"});
  // An empty destination with a huge stride elsewhere: nothing to write, nothing to overlap (its
  // strides are not bounded by a span; seed 526703889 of RandomDescriptorsArePlannedOrRefused
  // drew one and the overlap check's product overflowed under UBSan).
  d = basic(), d.dest_shape = {0, 8}, d.dest_stride = {1, int64_t{1} << 62},
  d.ranges = {{0, 0}, {0, 8}}, d.source_shape = {0, 8};
  BARACUDA_EXPECT_OK(WriteSlicePlan::select(cpu, d));
  d = basic(), d.source_stride = {8, -1};
  expect(d, inv, {"write_slice: source_stride[1]=-1 is negative"});
  d = basic(), d.dest_stride = {0, 1};
  expect(d, inv, {"write_slice: dest_stride[0]=0 broadcasts (shape 4)"});
  d = basic(), d.dest_stride = {2, 1};
  expect(d, inv, {"write_slice: dest_stride[0]=2 steps inside axis 1", "overlaps itself"});
  d = basic(DType::s4), d.source_stride = {16, 2};
  expect(d, inv, {"write_slice: source_stride[1]=2: s4 packs along the innermost axis"});
  d = basic(DType::u4), d.dest_stride = {9, 1};
  expect(d, inv, {"write_slice: dest_stride[0]=9: u4 rows must start on a byte (a multiple of 2)"});
  d = basic(DType::bin), d.dest_shape = {4, 7}, d.ranges = {{0, 4}, {0, 7}},
  d.source_shape = {4, 7};
  expect(d, inv,
         {"write_slice: dest_stride[0]=7: bin rows must start on a byte (a multiple of 8)"});
  d = basic(), d.dest_stride = {int64_t{1} << 62, 1};
  expect(d, inv, {"write_slice: dest_stride: the view spans more than 2^63 bits"});
  // Dense strides are checked too: 2^62 one-byte elements are 2^65 bits (found by a fuzzer: the
  // dense path skipped the span check and the path analysis overflowed).
  d = basic(DType::boolean), d.dest_shape = {int64_t{1} << 62}, d.ranges = {{8, 9}},
  d.source_shape = {1};
  expect(d, inv, {"write_slice: dest_stride: the view spans more than 2^63 bits"});
  // A span reaching INT64_MAX elements: its one-past-the-end count must not overflow either.
  d = basic(), d.source_stride = {std::numeric_limits<int64_t>::max(), 1};
  expect(d, inv, {"write_slice: source_stride: the view spans more than 2^63 bits"});
  d = basic(), d.dtype = static_cast<DType>(99);
  expect(d, inv, {"write_slice: dtype 99 is not in the element bank"});
}

// Random descriptors, edges included: each is planned or refused naming the op, never a crash or an
// overflow (two overflows in the stride checks were found this way).
TEST(WriteSliceErrors, RandomDescriptorsArePlannedOrRefused) {
  Rng rng;
  const Stream cpu = Stream::cpu();
  auto small_or_edge = [&] { return harness::small_or_edge(rng, 8); };
  int planned = 0;
  for (int i = 0; i < 20000; ++i) {
    WriteSliceOp::Descriptor d;
    d.dtype = harness::any_dtype(rng);
    const int rank = static_cast<int>(rng.integer(0, 9));
    const int window_rank = rng.integer(0, 7) == 0 ? static_cast<int>(rng.integer(0, 9)) : rank;
    for (int a = 0; a < rank; ++a) d.dest_shape.push_back(small_or_edge());
    for (int a = 0; a < window_rank; ++a) {
      // Mostly a window whose end matches its extent; otherwise any end.
      const int64_t s = harness::small_or_edge(rng, 4), extent = harness::small_or_edge(rng, 4);
      int64_t e = 0;
      if (!checked_add(s, extent, &e) || rng.integer(0, 3) == 0)
        e = harness::small_or_edge(rng, 19, 67);
      d.ranges.push_back({s, e});
      d.source_shape.push_back(extent);
    }
    if (rng.coin())
      for (int a = 0; a < rank; ++a) d.dest_stride.push_back(small_or_edge());
    if (rng.coin())
      for (int a = 0; a < window_rank; ++a) d.source_stride.push_back(small_or_edge());
    ASSERT_TRUE(harness::plans_or_names_ops<WriteSliceOp>(cpu, d, &planned)) << "case " << i;
  }
  EXPECT_GT(planned, 100);  // the generator reaches valid descriptors as well
}

class WriteSliceArgs : public ::testing::TestWithParam<Target> {};
INSTANTIATE_TEST_SUITE_P(Targets, WriteSliceArgs, ::testing::ValuesIn(harness::all_targets()),
                         target_param_name);

// Argument rules: each failure names op, argument and rule, and a failed run writes nothing.
TEST_P(WriteSliceArgs, RejectsBadTensorsWithoutWriting) {
  using harness::fails_with;
  const Target target = GetParam();
  BARACUDA_SKIP_IF_UNAVAILABLE(target);
  Rng rng;
  const Stream& stream = harness::stream_for(target);
  auto dest = TestTensor::make(DType::f32, {4, 8}, target, Layout::contiguous, &rng);
  auto src = TestTensor::make(DType::f32, {2, 8}, target, Layout::contiguous, &rng);
  dest.fill_random(rng);
  src.fill_random(rng);
  const auto before = dest.bytes();
  auto plan = WriteSlicePlan::select(stream, basic());
  BARACUDA_ASSERT_OK(plan);
  const WriteSliceOp::Arguments good{dest.view(), src.cview()};
  BARACUDA_ASSERT_OK(plan->can_implement(good));
  auto expect = [&](WriteSliceOp::Arguments a, ErrorKind kind,
                    std::initializer_list<std::string_view> needles) {
    EXPECT_TRUE(fails_with(&plan->can_implement(a).error(), kind, needles));
    EXPECT_TRUE(fails_with(&plan->run(stream, Workspace::none(), a).error(), kind, needles));
  };
  const ErrorKind inv = ErrorKind::invalid_problem;
  auto a = good;
  a.dest.dtype = DType::f16;
  expect(a, inv, {"write_slice: dest: dtype f16, expected f32"});
  a = good, a.dest.shape[1] = 7;
  expect(a, inv, {"write_slice: dest: shape[1]=7, expected 8"});
  a = good, a.source.shape[0] = 3;
  expect(a, inv, {"write_slice: source: shape[0]=3, expected 2"});
  a = good, a.dest.stride[0] = 9, a.dest.buffer_bytes = -1;
  expect(a, inv, {"write_slice: dest: stride[0]=9 but the plan was built for 8"});
  a = good, a.source.stride[0] = 0;
  expect(a, inv, {"write_slice: source: stride[0]=0 but the plan was built for 8"});
  a = good, a.dest.buffer_bytes = 100;
  expect(a, ErrorKind::buffer_too_small,
         {"write_slice: dest: view", "spans 128 bytes", "holds 100"});
  a = good, a.source.data = nullptr;
  expect(a, inv, {"write_slice: source: data is null"});
  a = good, a.source.data = static_cast<const char*>(dest.view().data) + 16;
  a.source.buffer_bytes = -1;
  expect(a, inv, {"write_slice: dest and source overlap in memory"});
  a = good, a.dest.where = target == Target::cpu ? Location::cuda(0) : Location::host();
  expect(a, ErrorKind::wrong_device, {"write_slice: dest: declared on"});
  if (target == Target::cuda) {
    // Real host memory handed to a GPU plan, declared as device memory.
    std::vector<float> host(64);
    a = good, a.source.data = host.data();
    expect(a, ErrorKind::wrong_device, {"write_slice: source: pointer", "is host memory"});
  }
  EXPECT_TRUE(harness::bytes_equal(before, dest.bytes(), "dest after rejected runs"));
}

// Random argument mistakes (harness::fuzz_arguments) on every target: each is refused naming the
// op with dest untouched, or accepted and run inside the real buffers (ASan in CI). Three element
// widths (s4's packing rules, byte and 4-byte elements) and padded layouts.
TEST_P(WriteSliceArgs, RandomArgumentMistakes) {
  const Target target = GetParam();
  BARACUDA_SKIP_IF_UNAVAILABLE(target);
  Rng rng;
  const Stream& stream = harness::stream_for(target);
  int accepted = 0;
  for (DType dtype : {DType::f32, DType::u8, DType::s4}) {
    SCOPED_TRACE(std::string(name(dtype)));
    auto dest = TestTensor::make(dtype, {5, 4, 16}, target, Layout::padded, &rng);
    auto src = TestTensor::make(dtype, {2, 4, 8}, target, Layout::padded, &rng);
    dest.fill_random(rng);
    src.fill_random(rng);
    auto plan = WriteSlicePlan::select(
        stream,
        WriteSliceOp::Descriptor::for_views(dest.view(), src.cview(), {{1, 3}, {0, 4}, {4, 12}}));
    BARACUDA_ASSERT_OK(plan);
    const WriteSliceOp::Arguments good{dest.view(), src.cview()};
    BARACUDA_ASSERT_OK(plan->can_implement(good));
    EXPECT_TRUE(harness::fuzz_arguments(
        stream, *plan, Workspace::none(), good,
        [](WriteSliceOp::Arguments& a) {
          return std::vector<harness::ArgView>{{"dest", a.dest}, {"source", a.source}};
        },
        {&dest}, "write_slice", rng, 1500, &accepted));
  }
  EXPECT_GT(accepted, 0);  // some changes leave a valid call (a byte view moved by one byte)
}

// ---- kv_append
// --------------------------------------------------------------------------------------
class KvAppend : public ::testing::TestWithParam<Target> {};
INSTANTIATE_TEST_SUITE_P(Targets, KvAppend, ::testing::ValuesIn(harness::all_targets()),
                         target_param_name);

void check_kv_append(Target target, DType dtype, DType pos_dtype, int64_t B, int64_t H, int64_t L,
                     int64_t D, int64_t T, Layout layout, Rng& rng, bool all_valid = false) {
  SCOPED_TRACE(std::string(name(dtype)) + " pos " + std::string(name(pos_dtype)) + " B" +
               std::to_string(B) + " H" + std::to_string(H) + " L" + std::to_string(L) + " D" +
               std::to_string(D) + " T" + std::to_string(T) + " " + harness::layout_name(layout));
  const Stream& stream = harness::stream_for(target);
  auto cache = TestTensor::make(dtype, {B, H, L, D}, target, layout, &rng);
  auto src = TestTensor::make(dtype, {B, H, T, D}, target, layout, &rng);
  auto pos = TestTensor::make(pos_dtype, {B}, target, Layout::contiguous, &rng);
  auto rej = TestTensor::make(DType::i32, {B}, target, layout, &rng);
  cache.fill_random(rng);
  src.fill_random(rng);
  // Positions: mostly valid, some out of range on either side (reported, never written).
  std::vector<double> p(static_cast<size_t>(B));
  std::vector<double> want_rej(static_cast<size_t>(B));
  for (int64_t b = 0; b < B; ++b) {
    const int64_t kind = all_valid ? 0 : rng.integer(0, 5);
    int64_t v = rng.integer(0, L - T);
    if (kind == 4) v = -rng.integer(1, 3);
    if (kind == 5) v = L - T + rng.integer(1, 3);
    p[static_cast<size_t>(b)] = static_cast<double>(v);
    want_rej[static_cast<size_t>(b)] = (v < 0 || v > L - T) ? 1.0 : 0.0;
  }
  if (!all_valid && B >= 2)
    p[0] = 0, want_rej[0] = 0, p[1] = static_cast<double>(L - T), want_rej[1] = 0;
  pos.set_values(p);
  rej.poison();
  KvAppendOp::Descriptor desc{dtype, B, H, L, D, T, pos_dtype};
  auto plan = KvAppendPlan::select(stream, desc);
  BARACUDA_ASSERT_OK(plan);
  EXPECT_TRUE(plan->precision_guarantee().deterministic);
  // Expected cache: the windows of valid rows replaced by the source; the mask is those windows.
  std::vector<uint8_t> mask(static_cast<size_t>(cache.buffer_bytes()) * 8, 0);
  const auto sv = src.values();
  auto ref = cache.values();
  const Tensor cv = cache.view();
  const int bits = bits_of(dtype);
  const int64_t base_bit =
      (static_cast<const char*>(cv.data) - static_cast<const char*>(cache.buffer_data())) * 8;
  for (int64_t b = 0; b < B; ++b) {
    if (want_rej[static_cast<size_t>(b)] != 0) continue;
    const auto at = static_cast<int64_t>(p[static_cast<size_t>(b)]);
    for (int64_t h = 0; h < H; ++h)
      for (int64_t t = 0; t < T; ++t)
        for (int64_t e = 0; e < D; ++e) {
          ref[static_cast<size_t>(((b * H + h) * L + at + t) * D + e)] =
              sv[static_cast<size_t>(((b * H + h) * T + t) * D + e)];
          const int64_t off =
              b * cv.stride[0] + h * cv.stride[1] + (at + t) * cv.stride[2] + e * cv.stride[3];
          for (int k = 0; k < bits; ++k) mask[static_cast<size_t>(base_bit + off * bits + k)] = 1;
        }
  }
  // Poisoning touches only the windows, so outside them `ref` still holds the current values.
  const auto before = poison_bits(cache, mask);
  const KvAppendOp::Arguments args{cache.view(), src.cview(), pos.cview(), rej.view()};
  BARACUDA_ASSERT_OK(plan->run(stream, Workspace::none(), args));
  const auto after = cache.bytes();
  EXPECT_TRUE(harness::untouched_outside(before, after, mask, "cache outside the written rows"));
  EXPECT_TRUE(harness::close_to(cache.values(), ref, dtype, harness::Accuracy::exact, "cache"));
  EXPECT_TRUE(
      harness::close_to(rej.values(), want_rej, DType::i32, harness::Accuracy::exact, "rejected"));
  upload(cache, before);
  rej.poison();
  BARACUDA_ASSERT_OK(plan->run(stream, Workspace::none(), args));
  EXPECT_TRUE(harness::bytes_equal(after, cache.bytes(), "second run"));
}

TEST_P(KvAppend, PerRowPositionsEveryDtypeAndLayout) {
  const Target target = GetParam();
  BARACUDA_SKIP_IF_UNAVAILABLE(target);
  Rng rng;
  for (DType dtype : write_slice_dtypes::kAll)
    for (Layout layout : harness::all_layouts()) {
      const DType pd = rng.coin() ? DType::i32 : DType::i64;
      const int64_t D = is_sub_byte(dtype) ? 8 * rng.integer(1, 2) : rng.integer(1, 9);
      check_kv_append(target, dtype, pd, rng.integer(2, 5), rng.integer(1, 3), rng.integer(4, 9), D,
                      rng.integer(0, 3), layout, rng);
      if (HasFatalFailure()) return;
    }
  // Empty rows (head_dim 0): a no-op on the cache that still reports every position. Sub-byte
  // types included: a dense [B, H, L, 0] view's strides treat the empty axis as 1, which the
  // packing rule once refused at run time after select() had accepted the descriptor.
  for (DType dtype : {DType::s4, DType::bin, DType::bf16}) {
    check_kv_append(target, dtype, DType::i32, 3, 2, 5, 0, 2, Layout::contiguous, rng);
    if (HasFatalFailure()) return;
  }
}

TEST_P(KvAppend, DecodeShapesOnDevice) {
  const Target target = GetParam();
  if (target == Target::cpu) GTEST_SKIP() << "decode-size shapes run on the GPU only";
  BARACUDA_SKIP_IF_UNAVAILABLE(target);
  Rng rng;
  for (int64_t T : {1, 2, 16})
    check_kv_append(target, DType::bf16, DType::i32, 8, 16, 512, 128, T, Layout::contiguous, rng);
  check_kv_append(target, DType::s4, DType::i64, 4, 8, 300, 128, 3, Layout::padded, rng);
  check_kv_append(target, DType::c128, DType::i64, 3, 4, 64, 33, 5, Layout::permuted, rng);
}

TEST(KvAppendErrors, RandomDescriptorsArePlannedOrRefused) {
  Rng rng;
  const Stream cpu = Stream::cpu();
  int planned = 0;
  for (int i = 0; i < 20000; ++i) {
    auto dim = [&] { return harness::small_or_edge(rng, 19, 67); };
    KvAppendOp::Descriptor d{harness::any_dtype(rng), dim(), dim(), dim(), dim(), dim(),
                             harness::any_dtype(rng)};
    ASSERT_TRUE(harness::plans_or_names_ops<KvAppendOp>(cpu, d, &planned)) << "case " << i;
  }
  EXPECT_GT(planned, 10);
}

TEST(KvAppendErrors, DescriptorAndArgumentRules) {
  using harness::fails_with;
  const Stream cpu = Stream::cpu();
  const ErrorKind inv = ErrorKind::invalid_problem;
  KvAppendOp::Descriptor good{DType::bf16, 2, 3, 16, 8, 2, DType::i32};
  BARACUDA_EXPECT_OK(KvAppendPlan::select(cpu, good));
  auto d = good;
  d.batch = -1;
  EXPECT_TRUE(
      fails_with(KvAppendPlan::select(cpu, d), inv, {"kv_append: cache: shape[0]=-1 is negative"}));
  d = good, d.tokens = -2;
  EXPECT_TRUE(fails_with(KvAppendPlan::select(cpu, d), inv, {"kv_append: tokens=-2 is negative"}));
  d = good, d.tokens = 17;
  EXPECT_TRUE(
      fails_with(KvAppendPlan::select(cpu, d), inv, {"kv_append: tokens=17 exceeds max_len=16"}));
  d = good, d.position_dtype = DType::f32;
  EXPECT_TRUE(fails_with(KvAppendPlan::select(cpu, d), inv,
                         {"kv_append: position_dtype f32, expected i32 or i64"}));
  d = good, d.dtype = DType::s4, d.head_dim = 3;
  EXPECT_TRUE(
      fails_with(KvAppendPlan::select(cpu, d), ErrorKind::unsupported,
                 {"kv_append: head_dim=3 is not a multiple of 2", "s4 rows must be whole bytes"}));
  d = good, d.dtype = static_cast<DType>(77);
  EXPECT_TRUE(fails_with(KvAppendPlan::select(cpu, d), inv,
                         {"kv_append: dtype 77 is not in the element bank"}));

  Rng rng;
  auto plan = KvAppendPlan::select(cpu, good);
  BARACUDA_ASSERT_OK(plan);
  auto cache = TestTensor::make(DType::bf16, {2, 3, 16, 8}, Target::cpu);
  auto src = TestTensor::make(DType::bf16, {2, 3, 2, 8}, Target::cpu);
  auto pos = TestTensor::make(DType::i32, {2}, Target::cpu);
  auto rej = TestTensor::make(DType::i32, {2}, Target::cpu);
  cache.fill_random(rng);
  pos.set_values({0, 3});
  const auto before = cache.bytes();
  const KvAppendOp::Arguments ok{cache.view(), src.cview(), pos.cview(), rej.view()};
  BARACUDA_EXPECT_OK(plan->can_implement(ok));
  auto expect = [&](KvAppendOp::Arguments a, std::initializer_list<std::string_view> needles) {
    EXPECT_TRUE(fails_with(&plan->run(cpu, Workspace::none(), a).error(), inv, needles));
  };
  auto a = ok;
  a.positions.dtype = DType::i64;
  expect(a, {"kv_append: positions: dtype i64, expected i32"});
  a = ok, a.rejected.dtype = DType::u8;
  expect(a, {"kv_append: rejected: dtype u8, expected i32"});
  a = ok, a.cache.shape[2] = 15;
  expect(a, {"kv_append: cache: shape[2]=15, expected 16"});
  a = ok, a.source.shape[2] = 3;
  expect(a, {"kv_append: source: shape[2]=3, expected 2"});
  a = ok, a.source.data = cache.view().data, a.source.buffer_bytes = -1;
  expect(a, {"kv_append: cache and source overlap in memory"});
  a = ok, a.rejected.data = const_cast<void*>(a.positions.data), a.rejected.buffer_bytes = -1;
  expect(a, {"kv_append: rejected and positions overlap in memory"});
  EXPECT_TRUE(harness::bytes_equal(before, cache.bytes(), "cache after rejected runs"));
}

// Random argument mistakes (harness::fuzz_arguments) on every target: refused naming the op with
// cache and rejected untouched, or accepted and run inside the real buffers (ASan in CI).
TEST_P(KvAppend, RandomArgumentMistakes) {
  const Target target = GetParam();
  BARACUDA_SKIP_IF_UNAVAILABLE(target);
  Rng rng;
  const Stream& stream = harness::stream_for(target);
  int accepted = 0;
  for (DType dtype : {DType::bf16, DType::s4}) {
    SCOPED_TRACE(std::string(name(dtype)));
    auto plan = KvAppendPlan::select(stream, {dtype, 3, 2, 16, 8, 2, DType::i64});
    BARACUDA_ASSERT_OK(plan);
    auto cache = TestTensor::make(dtype, {3, 2, 16, 8}, target, Layout::padded, &rng);
    auto src = TestTensor::make(dtype, {3, 2, 2, 8}, target, Layout::permuted, &rng);
    auto pos = TestTensor::make(DType::i64, {3}, target);
    auto rej = TestTensor::make(DType::i32, {3}, target);
    cache.fill_random(rng);
    src.fill_random(rng);
    pos.set_values({0, 14, 15});  // the last row is out of range: reported, not written
    const KvAppendOp::Arguments good{cache.view(), src.cview(), pos.cview(), rej.view()};
    BARACUDA_ASSERT_OK(plan->can_implement(good));
    EXPECT_TRUE(harness::fuzz_arguments(
        stream, *plan, Workspace::none(), good,
        [](KvAppendOp::Arguments& a) {
          return std::vector<harness::ArgView>{{"cache", a.cache},
                                               {"source", a.source},
                                               {"positions", a.positions},
                                               {"rejected", a.rejected}};
        },
        {&cache, &rej}, "kv_append", rng, 1500, &accepted));
  }
  EXPECT_GT(accepted, 0);
}

}  // namespace
}  // namespace baracuda
