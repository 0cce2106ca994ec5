// The test harness every op family uses. One place for: seeds, targets (CPU / CUDA), test
// tensors with real random data and padded/strided layouts, output poisoning, float64
// comparison with the per-dtype tolerance table, write-set checks, finite differences, and
// error-path assertions.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "baracuda/core/dtype.hpp"
#include "baracuda/core/plan.hpp"
#include "baracuda/core/status.hpp"
#include "baracuda/core/stream.hpp"
#include "baracuda/core/tensor.hpp"
#include "core/cpu/parallel.hpp"

namespace baracuda::harness {

// float64 references are single-threaded and slices of them (rows, heads) are independent with
// disjoint outputs: the tests spread them over the host's cores.
using cpu::parallel_for;

// ---- Seeds
// --------------------------------------------------------------------------------------- The run's
// base seed comes from BARACUDA_SEED or the clock, and is printed at start-up. Each test derives
// its own seed from the base and its name, so a failure is reproducible by rerunning with
// BARACUDA_SEED set to the printed value.
uint64_t base_seed();
uint64_t test_seed();  // base seed mixed with the running test's full name

class Rng {
 public:
  explicit Rng(uint64_t seed) : gen_(seed), seed_(seed) {}
  Rng() : Rng(test_seed()) {}
  double uniform(double lo, double hi) {
    return std::uniform_real_distribution<double>(lo, hi)(gen_);
  }
  int64_t integer(int64_t lo, int64_t hi) {  // inclusive
    return std::uniform_int_distribution<int64_t>(lo, hi)(gen_);
  }
  double normal() { return std::normal_distribution<double>(0.0, 1.0)(gen_); }
  bool coin() { return integer(0, 1) == 1; }
  uint64_t seed() const { return seed_; }
  std::mt19937_64& engine() { return gen_; }

 private:
  std::mt19937_64 gen_;
  uint64_t seed_;
};

// ---- Targets ------------------------------------------------------------------------------------
enum class Target { cpu, cuda };
std::string target_name(Target t);
std::vector<Target> all_targets();  // both, always: CUDA tests skip visibly when absent
bool target_available(Target t);
const Stream& stream_for(Target t);  // one stream per target for the whole test run
Location location_for(Target t);
std::string skip_reason(Target t);
// A plan's workspace for a test: `bytes` where `where` says, every byte 0xFF (NaN as f32): a
// kernel that reads workspace it has not written first (an accumulator assumed zero, a counter
// assumed reset) shows it in its outputs instead of passing on freshly allocated zeros.
Result<Buffer> poisoned_workspace(size_t bytes, Location where);

#define BARACUDA_SKIP_IF_UNAVAILABLE(target)                    \
  do {                                                          \
    if (!::baracuda::harness::target_available(target))         \
      GTEST_SKIP() << ::baracuda::harness::skip_reason(target); \
  } while (0)

#define BARACUDA_ASSERT_OK(expr)                                         \
  do {                                                                   \
    const auto& baracuda_status_ = (expr);                               \
    ASSERT_TRUE(baracuda_status_.ok())                                   \
        << #expr << " failed: " << baracuda_status_.error().to_string(); \
  } while (0)
#define BARACUDA_EXPECT_OK(expr)                                         \
  do {                                                                   \
    const auto& baracuda_status_ = (expr);                               \
    EXPECT_TRUE(baracuda_status_.ok())                                   \
        << #expr << " failed: " << baracuda_status_.error().to_string(); \
  } while (0)

// ---- Layouts
// -------------------------------------------------------------------------------------- How a test
// tensor sits in its buffer. Non-contiguous layouts leave gap bytes that a correct op must never
// touch.
enum class Layout {
  contiguous,  // dense row-major
  padded,      // row-major with random extra pitch on every axis, and a random base offset
  permuted,    // a random axis order in memory (plus padding), innermost axis kept unit-stride
};
std::string layout_name(Layout l);
inline std::vector<Layout> all_layouts() {
  return {Layout::contiguous, Layout::padded, Layout::permuted};
}

// ---- Test tensors
// -----------------------------------------------------------------------------------
class TestTensor {
 public:
  // A tensor on `target`. Its whole buffer starts as random bytes (so gaps hold garbage that an
  // op must preserve); call fill_random / poison / set_values to give elements meaning.
  static TestTensor make(DType dtype, std::vector<int64_t> shape, Target target,
                         Layout layout = Layout::contiguous, Rng* layout_rng = nullptr);
  // A view with explicit strides (in elements) starting `offset_elems` into a fresh buffer.
  static TestTensor with_strides(DType dtype, std::vector<int64_t> shape,
                                 std::vector<int64_t> strides, int64_t offset_elems, Target target);

  TestTensor(TestTensor&&) = default;
  TestTensor& operator=(TestTensor&&) = default;

  Tensor view() const { return view_; }
  ConstTensor cview() const { return as_const(view_); }
  DType dtype() const { return view_.dtype; }
  const std::vector<int64_t>& shape() const { return shape_; }
  int64_t numel() const { return view_.numel(); }
  Target target() const { return target_; }

  // Random values in [lo, hi] (integers: the dtype's range clipped to [lo, hi]; bool/bin: 0/1).
  void fill_random(Rng& rng, double lo = -1.0, double hi = 1.0);
  // Fills the view's elements with 0xFF bytes (NaN for every float type, -1 or max for integers);
  // gaps between them keep their garbage.
  void poison();
  // Logical row-major element values (complex: real parts), downloaded after a device sync.
  std::vector<double> values() const;
  std::vector<std::complex<double>> complex_values() const;
  void set_values(const std::vector<double>& v);
  // Raw bytes of the whole buffer (gaps included).
  std::vector<uint8_t> bytes() const;
  // Bit mask over the buffer (one byte per bit, 1 = belongs to an element of `v`); `v` must
  // point into this tensor's buffer (the tensor's own view, or a window of it).
  std::vector<uint8_t> bit_mask(const ConstTensor& v) const;
  std::vector<uint8_t> bit_mask() const { return bit_mask(cview()); }
  // Bit mask of the window [starts, starts + extents) of this tensor; exact for sub-byte dtypes
  // whose window starts inside a byte (which a view's byte pointer cannot express).
  std::vector<uint8_t> window_bit_mask(const std::vector<int64_t>& starts,
                                       const std::vector<int64_t>& extents) const;
  // Replaces the whole buffer (gaps included) with `bytes`; the upload has landed on return.
  void set_bytes(const std::vector<uint8_t>& bytes) { upload(bytes); }
  // A view of the window [starts, starts + extents) of this tensor (sub-byte dtypes: the window
  // must start on a byte boundary; use window_bit_mask for the general case).
  Tensor window(const std::vector<int64_t>& starts, const std::vector<int64_t>& extents) const;
  int64_t buffer_bytes() const { return static_cast<int64_t>(buffer_.bytes()); }
  void* buffer_data() const { return buffer_.data(); }

 private:
  TestTensor() = default;
  void upload(const std::vector<uint8_t>& host);
  Buffer buffer_;
  Tensor view_;
  std::vector<int64_t> shape_;
  Target target_ = Target::cpu;
  int64_t offset_bytes_ = 0;
};

// Row-major enumeration helpers over a shape.
int64_t numel_of(const std::vector<int64_t>& shape);
std::vector<int64_t> unravel(int64_t linear, const std::vector<int64_t>& shape);

// ---- Comparison
// ---------------------------------------------------------------------------------- The tolerance
// table: the one place per-dtype accuracy is written down.
//  elementwise: a few roundings of the output type (activations, casts, small formulas)
//  derivative:  an activation's gradient, a chain of up to ~8 roundings (exponential, division,
//               the chain rule's products): twice elementwise's bounds (f32 swiglu_clamped's db
//               measured 2.7 ulp on one element of a 5-element tensor, rel_l2 4.7u, H200)
//  reduction:   sums/dot products of moderate length accumulated in f32 (attention, scans, norms)
//  long_sum:    parameter gradients summed over a whole sequence of signed terms (dD, dA, dbias):
//               cancellation makes the result small next to its terms, so the relative bound's f32
//               floor is 4x the reduction's (f32 outputs: 3.8e-6; 16-bit: the reduction bound)
//  rounded_weights: a reduction whose weights were each rounded to the dtype once, at random
//               relative errors of at most u (fp8 attention's P before P V): the errors average
//               over the sum, so the norm bound is u itself (e4m3: 0.0625), max_abs 4u
enum class Accuracy { exact, elementwise, derivative, reduction, long_sum, rounded_weights };
struct Tolerance {
  double rel_l2;   // bound on ||out - ref|| / ||ref||
  double max_abs;  // bound on max |out - ref|, relative to max(1, max |ref|)
  // The output type's spacing next to zero (its subnormal step, f16: 2^-24): an element's error
  // up to it is representation, not arithmetic (a correctly rounded f16 result of 3.2e-7 is off by
  // 9%), so each |out - ref| is reduced by it before both bounds apply.
  double abs_floor = 0;
};
Tolerance tolerance(DType t, Accuracy a);

struct Comparison {
  double rel_l2 = 0;
  double max_abs = 0;
  int64_t worst_index = -1;
  int64_t not_written = 0;  // NaN outputs where the reference is finite
};
Comparison compare(const std::vector<double>& out, const std::vector<double>& ref,
                   double abs_floor = 0);
// slack: an absolute error the kernel documents on top of the table's bound (an approximated
// transcendental the dtype cannot know of); each |out - ref| is reduced by it, like abs_floor.
::testing::AssertionResult close_to(const std::vector<double>& out, const std::vector<double>& ref,
                                    DType dtype, Accuracy acc, std::string_view what,
                                    double slack = 0);
// For sums of signed terms whose cancellation the norm bounds cannot see: every element i within
// the reduction tolerance's max_abs factor of terms[i] = the sum of |term| that formed ref[i] (the
// classic forward error bound of a long sum, |err| <= c u sum |x_k|).
::testing::AssertionResult close_to_terms(const std::vector<double>& out,
                                          const std::vector<double>& ref,
                                          const std::vector<double>& terms, DType dtype,
                                          std::string_view what);
// Exact equality of two byte vectors, reporting the first differing offset.
::testing::AssertionResult bytes_equal(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b,
                                       std::string_view what);
// Every bit whose mask entry is 0 is identical in `before` and `after`.
::testing::AssertionResult untouched_outside(const std::vector<uint8_t>& before,
                                             const std::vector<uint8_t>& after,
                                             const std::vector<uint8_t>& bit_mask,
                                             std::string_view what);

// ---- Finite differences
// ------------------------------------------------------------------------------ For a forward f:
// R^n -> R^m (float64) and an upstream gradient dy, checks the analytic gradient dx of L(x) = <dy,
// f(x)> by central differences on up to `samples` coordinates.
::testing::AssertionResult gradient_matches_fd(
    const std::function<std::vector<double>(const std::vector<double>&)>& f,
    const std::vector<double>& x, const std::vector<double>& dy,
    const std::vector<double>& dx_analytic, Rng& rng, int samples = 64, double eps = 1e-6,
    double tol = 1e-6);

// ---- Errors
// ---------------------------------------------------------------------------------------- The
// status failed with `kind` and its message contains each of `needles`.
::testing::AssertionResult fails_with(const Error* error, ErrorKind kind,
                                      std::initializer_list<std::string_view> needles);
template <class T>
::testing::AssertionResult fails_with(const Result<T>& r, ErrorKind kind,
                                      std::initializer_list<std::string_view> needles) {
  if (r.ok())
    return ::testing::AssertionFailure() << "expected " << to_string(kind) << ", got success";
  return fails_with(&r.error(), kind, needles);
}

// ---- Descriptor fuzzing
// Random descriptors thrown at select(): every one is planned or refused with a message that names
// the op, and none may crash or overflow (the ASan + UBSan build in CI turns either into a
// failure).
// An edge a validator must survive: 0, +-1, small powers of two, 2^31 - 1, 2^31, 2^32, 2^40,
// 2^62, INT64_MAX, INT64_MIN, -2^40.
int64_t edge_integer(Rng& rng);
// A value in [0, small_max], or (edge_percent of the time) an edge_integer.
int64_t small_or_edge(Rng& rng, int64_t small_max, int edge_percent = 50);
// A random element type, sometimes one past the bank (a value no enumerator names).
DType any_dtype(Rng& rng);
// The error's message starts with "<op>: " and says something after it.
::testing::AssertionResult names_op(const Error* error, std::string_view op);
// select() of each of `Ops` (sharing one descriptor type) on `d`: every one plans or refuses
// naming its op. Adds 1 to *planned (when given) if the first one plans.
template <class... Ops, class D>
::testing::AssertionResult plans_or_names_ops(const Stream& stream, const D& d,
                                              int* planned = nullptr) {
  ::testing::AssertionResult result = ::testing::AssertionSuccess();
  bool first = true;
  auto one = [&]<class Op>() {
    const auto plan = Plan<Op>::select(stream, d);
    if (first && planned != nullptr && plan.ok()) ++*planned;
    first = false;
    if (result && !plan.ok()) result = names_op(&plan.error(), Op::name);
  };
  (one.template operator()<Ops>(), ...);
  return result;
}

// ---- Argument fuzzing
// Random argument mistakes thrown at a planned op: every mistake is refused by can_implement and
// run alike with a message naming the op (and nothing written), or accepted by both and run (in
// the ASan + UBSan build a read or write outside the real buffers then fails the test).
//
// One tensor argument of an op's Arguments, by reference: written (a Tensor) or read (a
// ConstTensor). `{"dq", a.dq}`.
struct ArgView {
  ArgView(std::string_view n, Tensor& t) : name(n), out(&t) {}
  ArgView(std::string_view n, ConstTensor& t) : name(n), in(&t) {}
  std::string_view name;
  Tensor* out = nullptr;
  ConstTensor* in = nullptr;
};
// Changes one thing about a view: its dtype (out-of-bank values included), rank, an extent or a
// stride (edges included), buffer_bytes (smaller, or a negative other than -1), data (null, or a
// byte further on with one byte less behind it) or placement. Never claims more buffer than the
// view had: a view validation accepts stays inside real memory. Returns what it did.
std::string mutate_view(Rng& rng, Tensor& v);
std::string mutate_view(Rng& rng, ConstTensor& v);
// `iterations` times: a copy of `good` with one to three views (from `views(Args&)`, a
// std::vector<ArgView>) changed; every view's buffer_bytes made explicit first (a view left at -1
// would let a bad stride through unchecked, by the API's contract). `outputs` are the buffers the
// op may write, poisoned before each try; a refused try must leave them as they were.
// *accepted counts the tries both calls accepted. BARACUDA_FUZZ_TRACE=1 prints every try before
// it runs (a crash ends the test before its assertion can say which try it was).
template <class PlanT, class Args, class ViewsFn>
::testing::AssertionResult fuzz_arguments(const Stream& stream, const PlanT& plan,
                                          const Workspace& ws, const Args& good, ViewsFn views,
                                          const std::vector<TestTensor*>& outputs,
                                          std::string_view op, Rng& rng, int iterations,
                                          int* accepted = nullptr) {
  Args base = good;
  for (ArgView& v : views(base)) {
    if (v.out && v.out->buffer_bytes < 0) v.out->buffer_bytes = v.out->span_bytes();
    if (v.in && v.in->buffer_bytes < 0) v.in->buffer_bytes = v.in->span_bytes();
  }
  for (int it = 0; it < iterations; ++it) {
    Args a = base;
    std::vector<ArgView> vs = views(a);
    if (vs.empty()) return ::testing::AssertionFailure() << op << ": no views to fuzz";
    std::string what;
    const int changes = static_cast<int>(rng.integer(1, 3));
    for (int c = 0; c < changes; ++c) {
      ArgView& v = vs[static_cast<size_t>(rng.integer(0, static_cast<int64_t>(vs.size()) - 1))];
      what += std::string(v.name) + ": " +
              (v.out ? mutate_view(rng, *v.out) : mutate_view(rng, *v.in)) + "; ";
    }
    std::vector<std::vector<uint8_t>> before;
    for (TestTensor* o : outputs) {
      o->poison();
      before.push_back(o->bytes());
    }
    if (std::getenv("BARACUDA_FUZZ_TRACE")) std::fprintf(stderr, "try %d: %s\n", it, what.c_str());
    const Status checked = plan.can_implement(a);
    const Status ran = plan.run(stream, ws, a);
    const Status synced = stream.synchronize();
    if (!synced.ok())
      return ::testing::AssertionFailure()
             << op << ": the stream failed after [" << what << "]: " << synced.error().to_string();
    if (checked.ok() != ran.ok())
      return ::testing::AssertionFailure()
             << op << ": can_implement and run disagree on [" << what
             << "]: " << (checked.ok() ? ran.error().to_string() : checked.error().to_string());
    if (checked.ok()) {
      if (accepted != nullptr) ++*accepted;
      continue;
    }
    if (auto named = names_op(&checked.error(), op); !named) return named << " [" << what << "]";
    if (auto named = names_op(&ran.error(), op); !named) return named << " [" << what << "]";
    for (size_t i = 0; i < outputs.size(); ++i)
      if (before[i] != outputs[i]->bytes())
        return ::testing::AssertionFailure() << op << ": a refused run wrote output " << i << " ["
                                             << what << "]: " << ran.error().to_string();
  }
  return ::testing::AssertionSuccess();
}

// ---- The demo's case registry
// --------------------------------------------------------------------- Each family registers a
// demo that runs its plans on random data on a target and checks them against the reference;
// baracuda-demo runs every registered demo and prints one table.
struct DemoRow {
  std::string family;
  std::string what;
  std::string kernel;
  double rel_l2 = 0;
  double max_abs = 0;
  bool pass = false;
  std::string note;
};
// Folds one output's comparison into a demo row: the worst rel_l2 / max_abs are reported and the
// row passes only if every output is within its tolerance (the caller sets pass = true first).
void check_output(DemoRow& row, const std::vector<double>& out, const std::vector<double>& ref,
                  DType dtype, Accuracy acc, const std::string& what);
// The row for a case that failed before it could be compared (its error text in the note).
DemoRow failed_row(DemoRow row, const Error& error);
using DemoFn = std::vector<DemoRow> (*)(Target);
bool register_demo(std::string_view family, DemoFn fn);
std::vector<std::pair<std::string, DemoFn>> registered_demos();

}  // namespace baracuda::harness
