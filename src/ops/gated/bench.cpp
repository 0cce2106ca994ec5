// Benchmarks of the gated family: a Llama-3-8B MLP at 16k tokens, x = [16384, 2*14336], split on
// the last axis (bf16 and f32, forward and backward), then the same sizes split on axis 0, as the
// gpt-oss interleaved layout (pairs kernel), as padded (row-pitched) views, and with a pitch that
// breaks 16-byte alignment; and the other gates at the big size. Unsuffixed cases run the rows
// kernel the selection table picks (rows_kernel_for); cases suffixed @legacy / @tiles / @full_grid
// rerun a case pinned to that rows kernel's registered variant (the A/B the table is filled from).
// Bytes counted: each input read once + each output written once. peers.py times the same case
// names on PyTorch.
#include <cstring>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "baracuda/ops/gated.hpp"
#include "core/bench/bench.hpp"
#include "ops/gated/gated_internal.hpp"

namespace baracuda::gated {
namespace {

constexpr int64_t kTokens = 16384, kHidden = 14336;

// Device buffer of `elems` elements of `t` holding random values in [-2, 2] (a random host block
// tiled over the buffer: never zeros, and cheap to make for gigabyte tensors).
Result<Buffer> random_buffer(const Stream& s, DType t, int64_t elems, uint64_t seed) {
  const int64_t eb = bits_of(t) / 8;
  Result<Buffer> buf = Buffer::allocate(static_cast<size_t>(elems * eb), s.memory_location());
  if (!buf.ok()) return buf.error();
  const int64_t block = std::min<int64_t>(elems, int64_t{1} << 22);
  std::vector<uint8_t> host(static_cast<size_t>(block * eb));
  std::mt19937_64 g(seed);
  std::uniform_real_distribution<double> u(-2.0, 2.0);
  for (int64_t i = 0; i < block; ++i) store_from_double(host.data(), t, i, u(g));
  for (int64_t off = 0; off < elems; off += block) {
    const int64_t n = std::min(block, elems - off);
    BARACUDA_TRY(copy_bytes(static_cast<char*>(buf->data()) + off * eb, buf->where(), host.data(),
                            Location::host(), static_cast<size_t>(n * eb)));
  }
  return buf;
}

struct Case {
  std::string op;    // "<gate>_forward" / "<gate>_backward"
  std::string name;  // shared with peers.py
  Gate gate;
  GatedInput input;
  bool gate_first;
  DType dtype;
  std::vector<int64_t> shape;  // full input shape
  int split;
  int64_t pad;  // extra elements at the end of every row (x, y, dy, dx), 0 = dense
  bool backward;
  std::string note;
  std::optional<RowsKernel> rows = std::nullopt;  // a pinned rows kernel; none: the table's
};

// A [rows, cols] view with row pitch cols + pad into `buf`.
Tensor view2(const Buffer& buf, DType t, const std::vector<int64_t>& shape, int64_t pad) {
  std::vector<int64_t> strides(shape.size(), 1);
  for (int i = static_cast<int>(shape.size()) - 2; i >= 0; --i)
    strides[i] =
        strides[i + 1] * (shape[i + 1] + (i + 1 == static_cast<int>(shape.size()) - 1 ? pad : 0));
  return make_strided(buf.data(), t, shape, strides, buf.where(),
                      static_cast<int64_t>(buf.bytes()));
}

int64_t span_elems(const std::vector<int64_t>& shape, int64_t pad) {
  int64_t n = 1;
  for (size_t i = 0; i < shape.size(); ++i) n *= shape[i] + (i + 1 == shape.size() ? pad : 0);
  return n;
}

int64_t numel(const std::vector<int64_t>& shape) {
  return span_elems(shape, 0);
}

void run_case(const Stream& s, const Case& c) {
  auto fail = [&](const Error& e) { bench::emit_error("gated", c.op, c.name, e); };
  // A case with a rows kernel runs pinned to that kernel's registered variant.
  const PlanPreference pref = c.rows ? PlanPreference::kernel(cuda_kernel_name(c.backward, c.rows))
                                     : PlanPreference::fastest();
  GatedDescriptor d;
  d.gate = c.gate;
  d.input = c.input;
  d.gate_first = c.gate_first;
  d.dtype = c.dtype;
  d.shape = c.shape;
  d.split_dim = c.split;
  std::vector<int64_t> out = c.shape;
  out[c.split < 0 ? c.split + out.size() : c.split] /= 2;
  const DType t = c.dtype;
  const int64_t eb = bits_of(t) / 8;
  Result<Buffer> x = random_buffer(s, t, span_elems(c.shape, c.pad), 1);
  if (!x.ok()) return fail(x.error());
  const ConstTensor xv = as_const(view2(*x, t, c.shape, c.pad));
  Result<bench::Timing> timing = Error::invalid("not run");
  std::string kernel;
  double bytes = 0;
  if (!c.backward) {
    Result<Buffer> y =
        Buffer::allocate(static_cast<size_t>(span_elems(out, c.pad) * eb), s.memory_location());
    if (!y.ok()) return fail(y.error());
    auto plan = GatedForwardPlan::select(s, d, pref);
    if (!plan.ok()) return fail(plan.error());
    GatedForwardOp::Arguments args{.y = view2(*y, t, out, c.pad), .x = xv};
    timing = bench::time_it(s, [&](int) { return plan->run(s, Workspace::none(), args); });
    kernel = plan->sku().name;
    bytes = static_cast<double>((numel(c.shape) + numel(out)) * eb);
  } else {
    Result<Buffer> dy = random_buffer(s, t, span_elems(out, c.pad), 2);
    Result<Buffer> dx =
        Buffer::allocate(static_cast<size_t>(span_elems(c.shape, c.pad) * eb), s.memory_location());
    if (!dy.ok()) return fail(dy.error());
    if (!dx.ok()) return fail(dx.error());
    auto plan = GatedBackwardPlan::select(s, d, pref);
    if (!plan.ok()) return fail(plan.error());
    GatedBackwardOp::Arguments args{
        .dx = view2(*dx, t, c.shape, c.pad), .x = xv, .dy = as_const(view2(*dy, t, out, c.pad))};
    timing = bench::time_it(s, [&](int) { return plan->run(s, Workspace::none(), args); });
    kernel = plan->sku().name;
    bytes = static_cast<double>((2 * numel(c.shape) + numel(out)) * eb);
  }
  if (!timing.ok()) return fail(timing.error());
  bench::emit(s, {.family = "gated",
                  .op = c.op,
                  .name = c.name,
                  .dtype = std::string(name(t)),
                  .kernel = kernel,
                  .ms = timing->median_ms,
                  .bytes = bytes,
                  .flops = 0,
                  .note = c.note});
}

// The case rerun once per rows kernel, pinned, names suffixed "@legacy" / "@tiles" / "@full_grid".
void add_variants(std::vector<Case>& out, const Case& c) {
  const std::pair<RowsKernel, const char*> kernels[] = {
      {RowsKernel::legacy, "@legacy"},
      {RowsKernel::tiles, "@tiles"},
      {RowsKernel::tiles_full_grid, "@full_grid"}};
  for (const auto& [k, suffix] : kernels) {
    Case v = c;
    v.name += suffix;
    v.note = std::string("rows kernel pinned: ") + to_string(k);
    v.rows = k;
    out.push_back(v);
  }
}

void bench_gated(const Stream& s) {
  const std::vector<int64_t> last{kTokens, 2 * kHidden}, first{2 * kHidden, kTokens};
  const std::string big = "16384x28672";
  std::vector<Case> cases, variants;
  for (bool bwd : {false, true}) {
    const std::string dir = bwd ? "_backward" : "_forward";
    for (DType t : {DType::bf16, DType::f32}) {
      cases.push_back({"swiglu" + dir, big, Gate::swiglu, GatedInput::halves, false, t, last, -1, 0,
                       bwd, "split last axis, dense (rows path, 16-byte vectors)"});
      add_variants(variants, cases.back());
    }
    cases.push_back({"swiglu" + dir, "28672x16384_split0", Gate::swiglu, GatedInput::halves, false,
                     DType::bf16, first, 0, 0, bwd, "split axis 0 (non-last), dense"});
    cases.push_back({"swiglu" + dir, big + "_padded", Gate::swiglu, GatedInput::halves, false,
                     DType::bf16, last, -1, 64, bwd, "rows pitched +64 elements (strided view)"});
    cases.push_back({"swiglu" + dir, big + "_pitch3", Gate::swiglu, GatedInput::halves, false,
                     DType::bf16, last, -1, 3, bwd,
                     "rows pitched +3 elements: misaligned rows (legacy: strided kernel; tiles: "
                     "vector body, scalar row ends)"});
    add_variants(variants, cases.back());
    cases.push_back({"swiglu_clamped" + dir, big + "_interleaved", Gate::swiglu_clamped,
                     GatedInput::interleaved, true, DType::bf16, last, -1, 0, bwd,
                     "gpt-oss layout: gate/up interleaved (pairs kernel)"});
    for (Gate g : {Gate::glu, Gate::geglu_erf, Gate::geglu_tanh}) {
      cases.push_back({std::string(to_string(g)) + dir, big, g, GatedInput::halves, false,
                       DType::bf16, last, -1, 0, bwd, "split last axis, dense"});
      // The ALU-heaviest gate: a kernel switch must not cost it.
      if (g == Gate::geglu_erf) add_variants(variants, cases.back());
    }
  }
  // The pinned variants last: a fault there (a sticky CUDA error) cannot cost the default's
  // numbers.
  for (const Case& c : cases) run_case(s, c);
  for (const Case& c : variants) run_case(s, c);
}

[[maybe_unused]] const bool registered = bench::register_bench("gated", bench_gated);

}  // namespace
}  // namespace baracuda::gated
