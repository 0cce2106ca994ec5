// write_slice / kv_append benchmarks. Case names are shared with peers.py (PyTorch on the same
// shapes). Large windows move >= 64 MiB and report % of the device-copy bandwidth measured in the
// same run; decode appends write T = 1..16 tokens into a [16, 32, 8192, 128] bf16 cache.
#include <cuda_runtime.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "baracuda/ops/write_slice.hpp"
#include "core/bench/bench.hpp"

namespace baracuda {
namespace {

constexpr const char* kFamily = "write_slice";

// A case pinned to one kernel (PlanPreference::kernel) is named "<case>@<kernel>": the A/B rows.
// Unsuffixed rows run the default plan and pair with peers.py.
std::string suffixed(const std::string& name, std::string_view pin) {
  return pin.empty() ? name : name + "@" + std::string(pin);
}
PlanPreference preference(std::string_view pin) {
  return pin.empty() ? PlanPreference::fastest() : PlanPreference::kernel(pin);
}

// Random bytes (never zeros): a 16 MiB random block tiled over the buffer.
Result<Buffer> random_buffer(const Stream& s, int64_t bytes) {
  auto b = Buffer::allocate(static_cast<size_t>(bytes), s.memory_location());
  if (!b.ok()) return b.error();
  static std::vector<uint8_t> block = [] {
    std::vector<uint8_t> v(size_t{16} << 20);
    std::mt19937_64 g(1234);
    for (size_t i = 0; i < v.size(); i += 8) {
      const uint64_t x = g();
      std::memcpy(&v[i], &x, 8);
    }
    return v;
  }();
  for (int64_t off = 0; off < bytes; off += static_cast<int64_t>(block.size())) {
    const auto n =
        static_cast<size_t>(std::min<int64_t>(bytes - off, static_cast<int64_t>(block.size())));
    BARACUDA_TRY(copy_bytes(static_cast<char*>(b->data()) + off, b->where(), block.data(),
                            Location::host(), n));
  }
  return b;
}

int64_t bytes_of(DType t, const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return (n * bits_of(t) + 7) / 8;
}

// One write_slice case: dense dest of `dest_shape`, dense source of the window's shape, rotated
// source and dest sets so the working set exceeds the L2.
void write_case(const Stream& s, const std::string& base_name, DType t,
                std::vector<int64_t> dest_shape, std::vector<std::pair<int64_t, int64_t>> ranges,
                std::string_view pin = {}) {
  const std::string name = suffixed(base_name, pin);
  WriteSliceOp::Descriptor d;
  d.dtype = t;
  d.dest_shape = dest_shape;
  d.ranges = ranges;
  for (auto [a, b] : ranges) d.source_shape.push_back(b - a);
  auto plan = WriteSlicePlan::select(s, d, preference(pin));
  if (!plan.ok()) return bench::emit_error(kFamily, "write_slice", name, plan.error());
  const int64_t dest_bytes = bytes_of(t, dest_shape), src_bytes = bytes_of(t, d.source_shape);
  const int rot = std::max(1, bench::rotations_for(s, 2 * src_bytes));
  std::vector<Buffer> dests, srcs;
  // Several dests only when the dest is small enough; the window of a big dest is what is touched.
  const int dest_sets = dest_bytes <= (int64_t{256} << 20) ? rot : 1;
  for (int i = 0; i < dest_sets; ++i) {
    auto b = random_buffer(s, dest_bytes);
    if (!b.ok()) return bench::emit_error(kFamily, "write_slice", name, b.error());
    dests.push_back(std::move(b).value());
  }
  for (int i = 0; i < rot; ++i) {
    auto b = random_buffer(s, src_bytes);
    if (!b.ok()) return bench::emit_error(kFamily, "write_slice", name, b.error());
    srcs.push_back(std::move(b).value());
  }
  const Location where = s.memory_location();
  auto timing = bench::time_it(
      s,
      [&](int r) -> Status {
        Tensor dest = make_tensor(dests[static_cast<size_t>(r) % dests.size()].data(), t,
                                  d.dest_shape, where);
        ConstTensor src = make_tensor(static_cast<const void*>(srcs[static_cast<size_t>(r)].data()),
                                      t, d.source_shape, where);
        return plan->run(s, Workspace::none(), {dest, src});
      },
      rot, 30, 3);
  if (!timing.ok()) return bench::emit_error(kFamily, "write_slice", name, timing.error());
  bench::emit(s, {.family = kFamily,
                  .op = "write_slice",
                  .name = name,
                  .dtype = std::string(baracuda::name(t)),
                  .kernel = std::string(plan->sku().name),
                  .ms = timing->median_ms,
                  .bytes = 2.0 * static_cast<double>(src_bytes),
                  .note = "window " + std::to_string(src_bytes >> 20) + " MiB"});
}

// Decode append: T tokens into [16, 32, 8192, 128] bf16, at per-row positions (kv_append) and at
// one position for all rows (write_slice's kv_2d path), as a decoding engine does every step.
void decode_cases(const Stream& s) {
  const int64_t B = 16, H = 32, L = 8192, D = 128;
  const DType t = DType::bf16;
  auto cache = random_buffer(s, B * H * L * D * 2);
  auto src = random_buffer(s, B * H * 16 * D * 2);
  auto pos = Buffer::allocate(static_cast<size_t>(B) * 4, s.memory_location());
  auto rej = Buffer::allocate(static_cast<size_t>(B) * 4, s.memory_location());
  if (!cache.ok() || !src.ok() || !pos.ok() || !rej.ok())
    return bench::emit_error(kFamily, "kv_append", "decode", Error::invalid("allocation failed"));
  std::vector<int32_t> positions(static_cast<size_t>(B));
  for (int64_t b = 0; b < B; ++b)
    positions[static_cast<size_t>(b)] = static_cast<int32_t>(1000 + 37 * b);
  if (!copy_bytes(pos->data(), pos->where(), positions.data(), Location::host(), B * 4).ok())
    return;
  const Location where = s.memory_location();
  for (int64_t T : {1, 2, 4, 8, 16}) {
    const std::string name = "decode_T" + std::to_string(T);
    const double moved = 2.0 * static_cast<double>(B * H * T * D * 2);
    {
      const int64_t p = 1000;
      WriteSliceOp::Descriptor d{
          t, {B, H, L, D}, {{0, B}, {0, H}, {p, p + T}, {0, D}}, {B, H, T, D}, {}, {}};
      auto plan = WriteSlicePlan::select(s, d);
      if (!plan.ok()) return bench::emit_error(kFamily, "write_slice", name, plan.error());
      int64_t cshape[] = {B, H, L, D}, sshape[] = {B, H, T, D};
      const WriteSliceOp::Arguments args{
          make_tensor(cache->data(), t, cshape, where),
          make_tensor(static_cast<const void*>(src->data()), t, sshape, where)};
      auto timing = bench::time_it(
          s, [&](int) { return plan->run(s, Workspace::none(), args); }, 1, 100, 10);
      if (!timing.ok()) return bench::emit_error(kFamily, "write_slice", name, timing.error());
      bench::emit(s, {.family = kFamily,
                      .op = "write_slice",
                      .name = name,
                      .dtype = "bf16",
                      .kernel = std::string(plan->sku().name),
                      .ms = timing->median_ms,
                      .bytes = moved,
                      .note = "cache[:, :, p:p+T, :] = src"});
    }
    {
      KvAppendOp::Descriptor d{t, B, H, L, D, T, DType::i32};
      auto plan = KvAppendPlan::select(s, d);
      if (!plan.ok()) return bench::emit_error(kFamily, "kv_append", name, plan.error());
      int64_t cshape[] = {B, H, L, D}, sshape[] = {B, H, T, D}, bshape[] = {B};
      const KvAppendOp::Arguments args{
          make_tensor(cache->data(), t, cshape, where),
          make_tensor(static_cast<const void*>(src->data()), t, sshape, where),
          make_tensor(static_cast<const void*>(pos->data()), DType::i32, bshape, where),
          make_tensor(rej->data(), DType::i32, bshape, where)};
      auto timing = bench::time_it(
          s, [&](int) { return plan->run(s, Workspace::none(), args); }, 1, 100, 10);
      if (!timing.ok()) return bench::emit_error(kFamily, "kv_append", name, timing.error());
      bench::emit(s, {.family = kFamily,
                      .op = "kv_append",
                      .name = name,
                      .dtype = "bf16",
                      .kernel = std::string(plan->sku().name),
                      .ms = timing->median_ms,
                      .bytes = moved + 8.0 * B,
                      .note = "per-row positions, one launch"});
    }
  }
}

// Not a plan: the driver's own 2-D copy on the kv2d_T512 case, timed so the kv_2d kernel's
// choice (own kernel vs cudaMemcpy2DAsync) rests on a measurement.
void memcpy2d_comparison(const Stream& s) {
  const int64_t B = 16, H = 32, L = 8192, D = 128, T = 512, p = 1000;
  auto cache = random_buffer(s, B * H * L * D * 2);
  auto src = random_buffer(s, B * H * T * D * 2);
  if (!cache.ok() || !src.ok()) return;
  auto cs = static_cast<cudaStream_t>(s.cuda_handle());
  auto timing = bench::time_it(
      s,
      [&](int) -> Status {
        const cudaError_t e = cudaMemcpy2DAsync(
            static_cast<char*>(cache->data()) + p * D * 2, static_cast<size_t>(L * D * 2),
            src->data(), static_cast<size_t>(T * D * 2), static_cast<size_t>(T * D * 2),
            static_cast<size_t>(B * H), cudaMemcpyDeviceToDevice, cs);
        return e == cudaSuccess ? Status{} : Status{Error::cuda("cudaMemcpy2DAsync", e)};
      },
      1, 30, 3);
  if (!timing.ok())
    return bench::emit_error(kFamily, "write_slice", "kv2d_T512_cudaMemcpy2D", timing.error());
  bench::emit(s, {.family = kFamily,
                  .op = "write_slice",
                  .name = "kv2d_T512_cudaMemcpy2D",
                  .dtype = "bf16",
                  .kernel = "cudaMemcpy2DAsync",
                  .ms = timing->median_ms,
                  .bytes = 2.0 * B * H * T * D * 2,
                  .note = "comparison only, not a plan"});
}

void run_all(const Stream& s) {
  // Large windows (>= 64 MiB of window: 128 MiB moved), on the default plan; the strided and
  // sub-byte cases also pinned to the other kernel that serves them (the A/B of their priority).
  write_case(s, "chunk_64MiB", DType::bf16, {3, 16, 1 << 20}, {{1, 3}, {0, 16}, {0, 1 << 20}});
  write_case(s, "chunk_64MiB", DType::s4, {3, 16, 1 << 22}, {{1, 3}, {0, 16}, {0, 1 << 22}});
  // The pitched KV windows on the default plan (kv_2d_tapered) and pinned to kv_2d (the A/B of
  // the tapered tail).
  for (std::string_view pin : {"", "kv_2d"}) {
    write_case(s, "kv2d_T512", DType::bf16, {16, 32, 8192, 128},
               {{0, 16}, {0, 32}, {1000, 1512}, {0, 128}}, pin);
    write_case(s, "kv2d_T2048", DType::s4, {16, 32, 8192, 128},
               {{0, 16}, {0, 32}, {1000, 3048}, {0, 128}}, pin);
    // A 256 MiB window: the same kernel where launch and tail costs weigh less.
    write_case(s, "kv2d_T2048_256MiB", DType::bf16, {16, 32, 8192, 128},
               {{0, 16}, {0, 32}, {1000, 3048}, {0, 128}}, pin);
  }
  for (std::string_view pin : {"", "generic_v16"})
    write_case(s, "strided_T512_D64", DType::bf16, {16, 32, 8192, 128},
               {{0, 16}, {0, 32}, {1000, 2024}, {32, 96}}, pin);
  for (std::string_view pin : {"", "subbyte_merge"})
    write_case(s, "rows_odd_offset", DType::s4, {4096, 32770}, {{0, 4096}, {1, 32769}}, pin);
  memcpy2d_comparison(s);
  decode_cases(s);
}
BARACUDA_REGISTER(bench::register_bench(kFamily, run_all));

}  // namespace
}  // namespace baracuda
