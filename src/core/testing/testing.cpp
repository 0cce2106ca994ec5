#include "core/testing/testing.hpp"

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iterator>
#include <limits>
#include <numeric>
#include <sstream>

namespace baracuda::harness {

uint64_t base_seed() {
  static const uint64_t seed = [] {
    if (const char* s = std::getenv("BARACUDA_SEED"); s && *s) return std::strtoull(s, nullptr, 10);
    return static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()) %
           1000000007ull;
  }();
  return seed;
}

uint64_t test_seed() {
  std::string name = "no-test";
  if (const auto* info = ::testing::UnitTest::GetInstance()->current_test_info())
    name = std::string(info->test_suite_name()) + "." + info->name();
  return base_seed() * 0x9E3779B97F4A7C15ull ^ std::hash<std::string>{}(name);
}

// ---- targets
// --------------------------------------------------------------------------------------
std::string target_name(Target t) {
  return t == Target::cpu ? "cpu" : "cuda";
}
std::vector<Target> all_targets() {
  return {Target::cpu, Target::cuda};
}
bool target_available(Target t) {
  return t == Target::cpu || cuda_available();
}
Location location_for(Target t) {
  return t == Target::cpu ? Location::host() : Location::cuda(0);
}
Result<Buffer> poisoned_workspace(size_t bytes, Location where) {
  Result<Buffer> b = Buffer::allocate(bytes, where);
  if (b.ok() && b->bytes() > 0) BARACUDA_TRY(fill_bytes(b->data(), b->where(), 0xFF, b->bytes()));
  return b;
}
std::string skip_reason(Target t) {
  return "no CUDA device: " + target_name(t) +
         " case skipped (it runs on the GPU machine via scripts/gpu-check.sh)";
}

const Stream& stream_for(Target t) {
  static const Stream cpu = Stream::cpu();
  if (t == Target::cpu) return cpu;
  static const Stream cuda = [] {
    Result<Stream> s = Stream::create_cuda(0);
    if (!s.ok()) {
      std::fprintf(stderr, "cannot create a CUDA stream: %s\n", s.error().to_string().c_str());
      std::abort();
    }
    return std::move(s).value();
  }();
  return cuda;
}

std::string layout_name(Layout l) {
  switch (l) {
    case Layout::contiguous:
      return "contiguous";
    case Layout::padded:
      return "padded";
    case Layout::permuted:
      return "permuted";
  }
  return "?";
}

int64_t numel_of(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::vector<int64_t> unravel(int64_t linear, const std::vector<int64_t>& shape) {
  std::vector<int64_t> idx(shape.size());
  for (int i = static_cast<int>(shape.size()) - 1; i >= 0; --i) {
    idx[i] = shape[i] ? linear % shape[i] : 0;
    linear = shape[i] ? linear / shape[i] : 0;
  }
  return idx;
}

namespace {

void check(const Status& s, const char* what) {
  if (!s.ok()) {
    std::fprintf(stderr, "test harness: %s: %s\n", what, s.error().to_string().c_str());
    std::abort();
  }
}

// Calls f(offset) for the offset (in elements, relative to view.data) of every logical element,
// row-major. An odometer over the index, no vector of offsets and no unravel per element: tests
// walk 33 M-element gradients, and an allocation per element made each walk seconds.
template <class Ptr, class F>
void for_each_offset(const BasicTensor<Ptr>& v, F&& f) {
  const int64_t n = v.numel();
  if (v.is_contiguous()) {
    for (int64_t i = 0; i < n; ++i) f(i);
    return;
  }
  std::array<int64_t, kMaxRank> idx{};
  int64_t off = 0;
  for (int64_t i = 0; i < n; ++i) {
    f(off);
    for (int d = v.rank - 1; d >= 0; --d) {
      if (++idx[static_cast<size_t>(d)] < v.shape[d]) {
        off += v.stride[d];
        break;
      }
      idx[static_cast<size_t>(d)] = 0;
      off -= (v.shape[d] - 1) * v.stride[d];
    }
  }
}

}  // namespace

TestTensor TestTensor::with_strides(DType dtype, std::vector<int64_t> shape,
                                    std::vector<int64_t> strides, int64_t offset_elems,
                                    Target target) {
  TestTensor t;
  t.shape_ = shape;
  t.target_ = target;
  const int bits = bits_of(dtype);
  t.offset_bytes_ = offset_elems * bits / 8;
  Tensor probe = make_strided(static_cast<void*>(nullptr), dtype, shape, strides);
  const int64_t bytes = t.offset_bytes_ + probe.span_bytes() + 16;  // 16 tail bytes catch overruns
  Result<Buffer> b = Buffer::allocate(static_cast<size_t>(bytes), location_for(target));
  check(b.ok() ? Status{} : Status{b.error()}, "allocate");
  t.buffer_ = std::move(b).value();
  t.view_ = make_strided(static_cast<char*>(t.buffer_.data()) + t.offset_bytes_, dtype, shape,
                         strides, location_for(target), bytes - t.offset_bytes_);
  // Random garbage everywhere: gaps keep it, and ops must not touch it.
  std::vector<uint8_t> init(static_cast<size_t>(bytes));
  std::mt19937_64 g(test_seed() ^ 0xABCDEFull ^ static_cast<uint64_t>(bytes));
  for (auto& x : init) x = static_cast<uint8_t>(g());
  t.upload(init);
  return t;
}

TestTensor TestTensor::make(DType dtype, std::vector<int64_t> shape, Target target, Layout layout,
                            Rng* layout_rng) {
  const int rank = static_cast<int>(shape.size());
  const int epb = elements_per_byte(dtype);
  Rng fallback(test_seed() ^ 0x5eedull);
  Rng& rng = layout_rng ? *layout_rng : fallback;
  std::vector<int64_t> strides(shape.size(), 1);
  int64_t offset = 0;
  if (layout == Layout::contiguous || rank == 0) {
    // Dense row-major; sub-byte rows are padded to whole bytes (the packing rule of the API).
    int64_t pitch = 1;
    for (int i = rank - 1; i >= 0; --i) {
      strides[i] = pitch;
      int64_t extent = std::max<int64_t>(shape[i], 1);
      if (i == rank - 1) extent = (extent + epb - 1) / epb * epb;
      pitch *= extent;
    }
  } else {
    // Memory order: innermost axis last; outer axes shuffled for `permuted`.
    std::vector<int> order(rank);
    std::iota(order.begin(), order.end(), 0);
    if (layout == Layout::permuted && rank > 2)
      std::shuffle(order.begin(), order.end() - 1, rng.engine());
    int64_t pitch = 1;
    for (int k = rank - 1; k >= 0; --k) {
      const int axis = order[k];
      strides[axis] = pitch;
      int64_t extent = std::max<int64_t>(shape[axis], 1);
      if (k == rank - 1) extent = (extent + epb - 1) / epb * epb;  // rows start on a byte
      pitch = pitch * extent + rng.integer(0, 3) * epb;            // random extra pitch per axis
    }
    offset = rng.integer(0, 5) * epb;
  }
  return with_strides(dtype, std::move(shape), std::move(strides), offset, target);
}

void TestTensor::upload(const std::vector<uint8_t>& host) {
  check(copy_bytes(buffer_.data(), buffer_.where(), host.data(), Location::host(), host.size()),
        "upload");
}

std::vector<uint8_t> TestTensor::bytes() const {
  if (target_ == Target::cuda) check(stream_for(Target::cuda).synchronize(), "synchronize");
  std::vector<uint8_t> host(buffer_.bytes());
  check(copy_bytes(host.data(), Location::host(), buffer_.data(), buffer_.where(), host.size()),
        "download");
  return host;
}

void TestTensor::fill_random(Rng& rng, double lo, double hi) {
  std::vector<uint8_t> host = bytes();
  void* base = host.data() + offset_bytes_;
  const DType t = view_.dtype;
  for_each_offset(view_, [&](int64_t off) {
    switch (info(t).cls) {
      case DTypeClass::floating:
        store_from_double(base, t, off, rng.uniform(lo, hi));
        break;
      case DTypeClass::complex:
        store_from_complex(base, t, off, {rng.uniform(lo, hi), rng.uniform(lo, hi)});
        break;
      case DTypeClass::boolean:
        store_from_double(base, t, off, static_cast<double>(rng.integer(0, 1)));
        break;
      case DTypeClass::integer: {
        const int b = bits_of(t);
        const bool s = info(t).is_signed;
        const int64_t cap = int64_t{1} << 20;
        const int64_t lo_i = s ? -std::min<int64_t>(cap, int64_t{1} << (std::min(b, 62) - 1)) : 0;
        const int64_t hi_i = s ? std::min<int64_t>(cap, (int64_t{1} << (std::min(b, 62) - 1)) - 1)
                               : std::min<int64_t>(cap, (int64_t{1} << std::min(b, 62)) - 1);
        store_from_double(base, t, off, static_cast<double>(rng.integer(lo_i, hi_i)));
        break;
      }
    }
  });
  upload(host);
}

void TestTensor::poison() {
  // Only the view's own bytes: gaps keep their garbage so write-set checks stay meaningful.
  const int bits = bits_of(view_.dtype);
  if (bits % 8 == 0) {
    // Whole-byte elements need no bit mask (eight mask bytes per buffer byte: 0.5 GB for a 64 MB
    // gradient, seconds a poison); a dense view is one fill where the buffer lives.
    const size_t elem_bytes = static_cast<size_t>(bits / 8);
    if (view_.is_contiguous()) {
      if (target_ == Target::cuda) check(stream_for(Target::cuda).synchronize(), "synchronize");
      check(
          fill_bytes(view_.data, buffer_.where(), 0xFF, static_cast<size_t>(numel()) * elem_bytes),
          "poison");
      return;
    }
    std::vector<uint8_t> host = bytes();
    uint8_t* base = host.data() + offset_bytes_;
    for_each_offset(view_, [&](int64_t off) {
      std::memset(base + off * static_cast<int64_t>(elem_bytes), 0xFF, elem_bytes);
    });
    upload(host);
    return;
  }
  std::vector<uint8_t> host = bytes();
  const std::vector<uint8_t> mask = bit_mask();
  for (size_t i = 0; i < host.size(); ++i) {
    uint8_t m = 0;
    for (int b = 0; b < 8; ++b) m |= static_cast<uint8_t>(mask[i * 8 + b] << b);
    host[i] |= m;
  }
  upload(host);
}

std::vector<double> TestTensor::values() const {
  const std::vector<uint8_t> host = bytes();
  const void* base = host.data() + offset_bytes_;
  std::vector<double> out;
  out.reserve(static_cast<size_t>(numel()));
  for_each_offset(view_,
                  [&](int64_t off) { out.push_back(load_as_double(base, view_.dtype, off)); });
  return out;
}

std::vector<std::complex<double>> TestTensor::complex_values() const {
  const std::vector<uint8_t> host = bytes();
  const void* base = host.data() + offset_bytes_;
  std::vector<std::complex<double>> out;
  for_each_offset(view_,
                  [&](int64_t off) { out.push_back(load_as_complex(base, view_.dtype, off)); });
  return out;
}

void TestTensor::set_values(const std::vector<double>& v) {
  std::vector<uint8_t> host = bytes();
  void* base = host.data() + offset_bytes_;
  size_t i = 0;
  for_each_offset(view_, [&](int64_t off) {
    if (i < v.size()) store_from_double(base, view_.dtype, off, v[i]);
    ++i;
  });
  upload(host);
}

std::vector<uint8_t> TestTensor::bit_mask(const ConstTensor& v) const {
  std::vector<uint8_t> mask(buffer_.bytes() * 8, 0);
  const int64_t base_bit =
      (static_cast<const char*>(v.data) - static_cast<const char*>(buffer_.data())) * 8;
  const int bits = bits_of(v.dtype);
  for_each_offset(v, [&](int64_t off) {
    for (int b = 0; b < bits; ++b) mask[static_cast<size_t>(base_bit + off * bits + b)] = 1;
  });
  return mask;
}

std::vector<uint8_t> TestTensor::window_bit_mask(const std::vector<int64_t>& starts,
                                                 const std::vector<int64_t>& extents) const {
  std::vector<uint8_t> mask(buffer_.bytes() * 8, 0);
  const int bits = bits_of(view_.dtype);
  int64_t base = 0;
  for (int d = 0; d < view_.rank; ++d) base += starts[d] * view_.stride[d];
  Tensor w = view_;
  for (int d = 0; d < w.rank; ++d) w.shape[d] = extents[d];
  for_each_offset(w, [&](int64_t off) {
    for (int b = 0; b < bits; ++b)
      mask[static_cast<size_t>(offset_bytes_ * 8 + (base + off) * bits + b)] = 1;
  });
  return mask;
}

Tensor TestTensor::window(const std::vector<int64_t>& starts,
                          const std::vector<int64_t>& extents) const {
  Tensor w = view_;
  int64_t off = 0;
  for (int d = 0; d < w.rank; ++d) {
    off += starts[d] * w.stride[d];
    w.shape[d] = extents[d];
  }
  const int64_t bit = off * bits_of(w.dtype);
  w.data = static_cast<char*>(w.data) + bit / 8;
  w.buffer_bytes = view_.buffer_bytes - bit / 8;
  return w;
}

// ---- comparison
// -----------------------------------------------------------------------------------
Tolerance tolerance(DType t, Accuracy a) {
  if (a == Accuracy::exact) return {0.0, 0.0};
  // Unit roundoff of the output type; bounds are a few of them (elementwise) or more (reduction).
  double u = 0, step = 0;  // unit roundoff; spacing next to zero (the smallest subnormal)
  switch (t) {
    case DType::f64:
    case DType::c128:
      u = 1.1e-16, step = 4.9e-324;
      break;
    case DType::f32:
    case DType::f32_strict:
    case DType::c64:
      u = 6e-8, step = 1.4e-45;
      break;
    case DType::f16:
      u = 4.9e-4, step = 5.96e-8;  // 2^-24
      break;
    case DType::bf16:
      u = 3.9e-3, step = 9.2e-41;  // 2^-133
      break;
    case DType::e4m3:
      u = 6.25e-2, step = 1.95e-3;  // 2^-9
      break;
    case DType::e5m2:
      u = 1.25e-1, step = 1.53e-5;  // 2^-16
      break;
    default:
      return {0.0, 0.0};  // integer and boolean outputs must match exactly
  }
  const double f32_floor = 6e-8;  // 16-bit types compute in f32: their error never goes below it
  if (a == Accuracy::elementwise) return {4 * std::max(u, 1e-15), 8 * std::max(u, 1e-15), step};
  if (a == Accuracy::derivative) return {8 * std::max(u, 1e-15), 16 * std::max(u, 1e-15), step};
  if (a == Accuracy::rounded_weights) return {u, 4 * u, step};
  const double floor = f32_floor * (t == DType::f64 || t == DType::c128 ? 1e-8 : 1.0);
  const double ur = std::max(u, floor);
  // Cancellation amplifies the accumulation error, not the rounding of 16-bit operands: only the
  // floor part of the relative bound grows (f32 and f64: 4x the reduction's; 16-bit: unchanged).
  if (a == Accuracy::long_sum) return {std::max(16 * ur, 64 * floor), 64 * ur, step};
  return {16 * ur, 64 * ur, step};
}

Comparison compare(const std::vector<double>& out, const std::vector<double>& ref,
                   double abs_floor) {
  Comparison c;
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size() && i < out.size(); ++i) {
    const double r = ref[i], o = out[i];
    if (std::isnan(r) && std::isnan(o)) continue;
    if (std::isinf(r) && o == r) continue;
    if (std::isnan(o) && !std::isnan(r)) {
      ++c.not_written;
      if (c.worst_index < 0) c.worst_index = static_cast<int64_t>(i);
      continue;
    }
    const double raw = std::fabs(o - r);
    const double d = raw <= abs_floor ? 0.0 : raw - abs_floor;  // NaN stays NaN
    num += d * d;
    den += r * r;
    if (d > c.max_abs || std::isnan(d)) {
      c.max_abs = d;
      if (c.not_written == 0) c.worst_index = static_cast<int64_t>(i);
    }
  }
  c.rel_l2 = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
  return c;
}

::testing::AssertionResult close_to(const std::vector<double>& out, const std::vector<double>& ref,
                                    DType dtype, Accuracy acc, std::string_view what,
                                    double slack) {
  if (out.size() != ref.size())
    return ::testing::AssertionFailure()
           << what << ": " << out.size() << " outputs vs " << ref.size() << " reference values";
  const Tolerance tol = tolerance(dtype, acc);
  const Comparison c = compare(out, ref, tol.abs_floor + slack);
  double ref_max = 1.0;
  for (double r : ref)
    if (std::isfinite(r)) ref_max = std::max(ref_max, std::fabs(r));
  const bool ok =
      c.not_written == 0 && c.rel_l2 <= tol.rel_l2 && c.max_abs <= tol.max_abs * ref_max;
  auto r = ok ? ::testing::AssertionSuccess() : ::testing::AssertionFailure();
  r << what << " [" << name(dtype) << "]: rel_l2=" << c.rel_l2 << " (tol " << tol.rel_l2
    << "), max_abs=" << c.max_abs << " (tol " << tol.max_abs * ref_max << ")";
  if (slack > 0) r << " past a documented slack of " << slack;
  if (c.not_written) r << ", " << c.not_written << " outputs NaN/unwritten";
  if (!ok && c.worst_index >= 0)
    r << "; worst at " << c.worst_index << ": out=" << out[static_cast<size_t>(c.worst_index)]
      << " ref=" << ref[static_cast<size_t>(c.worst_index)];
  r << "; seed " << base_seed();
  return r;
}

::testing::AssertionResult close_to_terms(const std::vector<double>& out,
                                          const std::vector<double>& ref,
                                          const std::vector<double>& terms, DType dtype,
                                          std::string_view what) {
  if (out.size() != ref.size() || terms.size() != ref.size())
    return ::testing::AssertionFailure()
           << what << ": " << out.size() << " outputs, " << ref.size() << " reference values, "
           << terms.size() << " term magnitudes";
  const double factor = tolerance(dtype, Accuracy::reduction).max_abs;
  double worst = 0;  // largest |out - ref| / bound
  int64_t worst_i = -1, not_written = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (std::isnan(out[i]) && !std::isnan(ref[i])) {
      ++not_written;
      continue;
    }
    const double bound = factor * terms[i] + 1e-300, ratio = std::fabs(out[i] - ref[i]) / bound;
    if (!(ratio <= worst)) worst = ratio, worst_i = static_cast<int64_t>(i);
  }
  const bool ok = not_written == 0 && worst <= 1.0;
  auto r = ok ? ::testing::AssertionSuccess() : ::testing::AssertionFailure();
  r << what << " [" << name(dtype) << "]: max |out - ref| / (" << factor
    << " sum|terms|) = " << worst;
  if (worst_i >= 0) {
    const auto i = static_cast<size_t>(worst_i);
    r << " at " << worst_i << " (out=" << out[i] << " ref=" << ref[i] << " sum|terms|=" << terms[i]
      << ")";
  }
  if (not_written) r << ", " << not_written << " outputs NaN/unwritten";
  r << "; seed " << base_seed();
  return r;
}

::testing::AssertionResult bytes_equal(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b,
                                       std::string_view what) {
  if (a.size() != b.size())
    return ::testing::AssertionFailure() << what << ": sizes " << a.size() << " vs " << b.size();
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i] != b[i])
      return ::testing::AssertionFailure()
             << what << ": first difference at byte " << i << " (" << int(a[i]) << " vs "
             << int(b[i]) << "); seed " << base_seed();
  return ::testing::AssertionSuccess();
}

::testing::AssertionResult untouched_outside(const std::vector<uint8_t>& before,
                                             const std::vector<uint8_t>& after,
                                             const std::vector<uint8_t>& mask,
                                             std::string_view what) {
  int64_t changed = 0, first = -1;
  for (size_t byte = 0; byte < before.size(); ++byte) {
    const uint8_t diff = before[byte] ^ after[byte];
    if (!diff) continue;
    for (int b = 0; b < 8; ++b)
      if ((diff >> b & 1) && !mask[byte * 8 + b]) {
        ++changed;
        if (first < 0) first = static_cast<int64_t>(byte * 8 + b);
      }
  }
  if (changed == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << what << ": " << changed << " bits outside the write set changed, first at bit " << first
         << " (byte " << first / 8 << "); seed " << base_seed();
}

::testing::AssertionResult gradient_matches_fd(
    const std::function<std::vector<double>(const std::vector<double>&)>& f,
    const std::vector<double>& x, const std::vector<double>& dy,
    const std::vector<double>& dx_analytic, Rng& rng, int samples, double eps, double tol) {
  if (dx_analytic.size() != x.size())
    return ::testing::AssertionFailure()
           << "gradient has " << dx_analytic.size() << " entries for " << x.size() << " inputs";
  auto loss = [&](const std::vector<double>& xv) {
    const std::vector<double> y = f(xv);
    double l = 0;
    for (size_t i = 0; i < y.size() && i < dy.size(); ++i) l += dy[i] * y[i];
    return l;
  };
  std::vector<size_t> coords(x.size());
  std::iota(coords.begin(), coords.end(), size_t{0});
  if (static_cast<int>(coords.size()) > samples) {
    std::shuffle(coords.begin(), coords.end(), rng.engine());
    coords.resize(static_cast<size_t>(samples));
  }
  double worst = 0;
  size_t worst_i = 0;
  double worst_fd = 0;
  for (size_t i : coords) {
    std::vector<double> xp = x, xm = x;
    const double h = eps * std::max(1.0, std::fabs(x[i]));
    xp[i] += h;
    xm[i] -= h;
    const double fd = (loss(xp) - loss(xm)) / (2 * h);
    const double err = std::fabs(fd - dx_analytic[i]) / std::max({1.0, std::fabs(fd)});
    if (err > worst || std::isnan(err)) {
      worst = err;
      worst_i = i;
      worst_fd = fd;
    }
  }
  if (worst <= tol) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << "finite differences disagree at input " << worst_i << ": analytic "
         << dx_analytic[worst_i] << " vs fd " << worst_fd << " (rel err " << worst << ", tol "
         << tol << "); seed " << base_seed();
}

::testing::AssertionResult fails_with(const Error* e, ErrorKind kind,
                                      std::initializer_list<std::string_view> needles) {
  if (e->kind() != kind)
    return ::testing::AssertionFailure()
           << "expected " << to_string(kind) << ", got " << e->to_string();
  for (std::string_view n : needles)
    if (e->message().find(n) == std::string::npos)
      return ::testing::AssertionFailure()
             << "message \"" << e->message() << "\" lacks \"" << n << "\"";
  return ::testing::AssertionSuccess() << e->to_string();
}

int64_t edge_integer(Rng& rng) {
  static constexpr int64_t kEdges[] = {0,
                                       1,
                                       -1,
                                       2,
                                       3,
                                       8,
                                       64,
                                       255,
                                       257,
                                       (int64_t{1} << 31) - 1,
                                       int64_t{1} << 31,
                                       int64_t{1} << 32,
                                       int64_t{1} << 40,
                                       int64_t{1} << 62,
                                       std::numeric_limits<int64_t>::max(),
                                       std::numeric_limits<int64_t>::min(),
                                       -(int64_t{1} << 40)};
  return kEdges[static_cast<size_t>(rng.integer(0, static_cast<int64_t>(std::size(kEdges)) - 1))];
}

int64_t small_or_edge(Rng& rng, int64_t small_max, int edge_percent) {
  return rng.integer(1, 100) <= edge_percent ? edge_integer(rng) : rng.integer(0, small_max);
}

DType any_dtype(Rng& rng) {
  return static_cast<DType>(rng.integer(0, kDTypeCount));
}

::testing::AssertionResult names_op(const Error* e, std::string_view op) {
  const std::string prefix = std::string(op) + ": ";
  if (e->message().compare(0, prefix.size(), prefix) != 0 || e->message().size() <= prefix.size())
    return ::testing::AssertionFailure()
           << "the error does not name " << op << ": " << e->to_string();
  return ::testing::AssertionSuccess();
}

namespace {
template <class Ptr>
std::string mutate(Rng& rng, BasicTensor<Ptr>& v) {
  const int rank = std::clamp(v.rank, 0, kMaxRank);
  const auto axis = [&] { return rank > 0 ? static_cast<int>(rng.integer(0, rank - 1)) : 0; };
  switch (rng.integer(0, 9)) {
    case 0: {
      v.dtype = any_dtype(rng);
      return "dtype " + std::to_string(static_cast<int>(v.dtype));
    }
    case 1: {
      const int r = static_cast<int>(rng.integer(-1, kMaxRank + 1));
      for (int i = rank; i < std::min(r, kMaxRank); ++i)
        v.shape[i] = rng.integer(0, 3), v.stride[i] = rng.integer(0, 3);
      v.rank = r;
      return "rank " + std::to_string(r);
    }
    case 2:
    case 3: {
      const int i = axis();
      int64_t moved = 0;
      if (!checked_add(v.shape[i], rng.integer(-1, 1), &moved)) moved = v.shape[i];
      v.shape[i] = rng.coin() ? edge_integer(rng) : moved;
      return "shape[" + std::to_string(i) + "]=" + std::to_string(v.shape[i]);
    }
    case 4:
    case 5: {
      const int i = axis();
      int64_t twice = 0, next = 0;
      if (!checked_mul(v.stride[i], 2, &twice)) twice = v.stride[i];
      if (!checked_add(v.stride[i], 1, &next)) next = v.stride[i];
      const int64_t choices[] = {edge_integer(rng), 0, twice, next};
      v.stride[i] = choices[rng.integer(0, 3)];
      return "stride[" + std::to_string(i) + "]=" + std::to_string(v.stride[i]);
    }
    case 6: {
      const int64_t have = std::max<int64_t>(v.buffer_bytes, 0);
      v.buffer_bytes = rng.coin() && have > 0 ? rng.integer(0, have - 1) : -rng.integer(2, 1000);
      return "buffer_bytes=" + std::to_string(v.buffer_bytes);
    }
    case 7: {
      if (rng.coin() || v.buffer_bytes < 1 || v.data == nullptr) {
        v.data = nullptr;
        return "data null";
      }
      v.data = reinterpret_cast<Ptr>(reinterpret_cast<uintptr_t>(v.data) + 1);
      v.buffer_bytes -= 1;
      return "data + 1 byte";
    }
    case 8: {
      v.where = v.where.is_host() ? Location::cuda(static_cast<int>(rng.integer(0, 7)))
                                  : Location::host();
      return "placement " + to_string(v.where);
    }
    default: {  // several extents at once: a view of the right rank but another shape
      for (int i = 0; i < rank; ++i)
        if (int64_t moved = 0; rng.coin() && checked_add(v.shape[i], rng.integer(-2, 2), &moved))
          v.shape[i] = std::max<int64_t>(0, moved);
      return "shape jittered";
    }
  }
}
}  // namespace

std::string mutate_view(Rng& rng, Tensor& v) {
  return mutate(rng, v);
}
std::string mutate_view(Rng& rng, ConstTensor& v) {
  return mutate(rng, v);
}

// ---- demos
// ------------------------------------------------------------------------------------------
namespace {
std::vector<std::pair<std::string, DemoFn>>& demo_table() {
  static std::vector<std::pair<std::string, DemoFn>> t;
  return t;
}
}  // namespace
void check_output(DemoRow& row, const std::vector<double>& out, const std::vector<double>& ref,
                  DType dtype, Accuracy acc, const std::string& what) {
  const Comparison c = compare(out, ref);
  row.rel_l2 = std::max(row.rel_l2, c.rel_l2);
  row.max_abs = std::max(row.max_abs, c.max_abs);
  const auto ok = close_to(out, ref, dtype, acc, what);
  if (!ok) {
    row.pass = false;
    row.note += (row.note.empty() ? "" : "; ") + std::string(ok.message());
  }
}

DemoRow failed_row(DemoRow row, const Error& error) {
  row.pass = false;
  row.note = error.to_string();
  return row;
}

bool register_demo(std::string_view family, DemoFn fn) {
  demo_table().emplace_back(std::string(family), fn);
  return true;
}
std::vector<std::pair<std::string, DemoFn>> registered_demos() {
  return demo_table();
}

}  // namespace baracuda::harness
