// The CUDA kernel table of write_slice and kv_append, registered per dtype from one table. The
// copy engine is keyed on storage width (a copy needs nothing else), so every dtype maps onto the
// same few kernels; select() picks the fastest path the problem's layout admits.
#include "core/cuda/launch.cuh"
#include "ops/write_slice/dtypes.hpp"
#include "ops/write_slice/launch.hpp"

namespace baracuda {
namespace {

using write_slice_detail::Path;
using Problem = WriteSliceOp::Problem;
using Arguments = WriteSliceOp::Arguments;

char* dest_origin(const Problem& p, const Arguments& a) {
  return static_cast<char*>(a.dest.data) + p.copy.dst_offset;
}

// Whole-destination and contiguous-chunk writes: one async device-to-device memcpy.
Status launch_memcpy(const LaunchContext& ctx, const Problem& p, const Arguments& a) {
  if (p.path == Path::empty || p.copy.inner_bytes == 0) return {};
  const cudaError_t e =
      cudaMemcpyAsync(dest_origin(p, a), a.source.data, static_cast<size_t>(p.copy.inner_bytes),
                      cudaMemcpyDeviceToDevice, cuda::stream_of(ctx));
  if (e != cudaSuccess) return cuda::cuda_error(WriteSliceOp::name, "cudaMemcpyAsync", e);
  return {};
}

Status launch_pitched(const LaunchContext& ctx, const Problem& p, const Arguments& a) {
  return write_slice_cuda::copy_rows(ctx, "kv_2d", dest_origin(p, a),
                                     static_cast<const char*>(a.source.data), p.copy);
}

Status launch_pitched_tapered(const LaunchContext& ctx, const Problem& p, const Arguments& a) {
  return write_slice_cuda::copy_rows_tapered(ctx, dest_origin(p, a),
                                             static_cast<const char*>(a.source.data), p.copy);
}

Status launch_generic(const LaunchContext& ctx, const Problem& p, const Arguments& a) {
  if (p.path == Path::empty) return {};
  return write_slice_cuda::copy_rows(ctx, "generic_v16", dest_origin(p, a),
                                     static_cast<const char*>(a.source.data), p.copy);
}

Status launch_generic_flat(const LaunchContext& ctx, const Problem& p, const Arguments& a) {
  if (p.path == Path::empty) return {};
  return write_slice_cuda::copy_flat(ctx, "generic_flat", dest_origin(p, a),
                                     static_cast<const char*>(a.source.data), p.copy);
}

Status launch_merge_words(const LaunchContext& ctx, const Problem& p, const Arguments& a) {
  return write_slice_cuda::merge_words(ctx, dest_origin(p, a),
                                       static_cast<const char*>(a.source.data), p.copy);
}

Status launch_merge(const LaunchContext& ctx, const Problem& p, const Arguments& a) {
  return write_slice_cuda::merge_bits(ctx, dest_origin(p, a),
                                      static_cast<const char*>(a.source.data), p.copy);
}

Status launch_kv(const LaunchContext& ctx, const KvAppendOp::Problem& p,
                 const KvAppendOp::Arguments& a) {
  return write_slice_cuda::kv_append(ctx, p, a);
}

KernelSku sku(DType t, std::string_view op, std::string_view layout, std::string_view name) {
  return {.category = "data_movement",
          .op = op,
          .element = t,
          .layout = layout,
          .arch = Arch::sm80,
          .backend = Backend::bespoke_cuda,
          .precision = write_slice_dtypes::kExactCopy,
          .name = name};
}

// Priorities order the kernels of a path by the H100 measurements in docs/perf/write_slice.md;
// every kernel stays registered, so `PlanPreference::kernel(name)` can pin any of them (the tests
// run every kernel that fits a case, the benchmark A/Bs them).
bool register_cuda() {
  for (DType t : write_slice_dtypes::kAll) {
    register_kernel<WriteSliceOp>({
        .sku = sku(t, "write_slice", "contiguous", "whole_copy"),
        .priority = 50,
        .fits = [](const Problem& p, const DeviceCaps&) { return p.path == Path::whole_copy; },
        .launch = launch_memcpy,
    });
    register_kernel<WriteSliceOp>({
        .sku = sku(t, "write_slice", "contiguous", "contiguous_chunk"),
        .priority = 40,
        .fits =
            [](const Problem& p, const DeviceCaps&) {
              return p.path == Path::contiguous_chunk || p.path == Path::empty;
            },
        .launch = launch_memcpy,
    });
    // The pitched path: kv_2d's block tiles with the last two waves in 4 KB tiles. 64 MiB windows
    // (bf16 / s4), % of copy against kv_2d in the same call: H200 83.3 / 84.5 vs 81.7 / 83.2 (256
    // MiB 92.3 vs 89.8); H100 87.5 / 88.9 vs 87.6 / 88.6 (256 MiB 94.3 both). 32 KB big tiles
    // measured lower on the H100 (86.9 / 87.7) and were dropped.
    register_kernel<WriteSliceOp>({
        .sku = sku(t, "write_slice", "kv_2d", "kv_2d_tapered"),
        .priority = 31,
        .fits = [](const Problem& p, const DeviceCaps&) { return p.path == Path::pitched_2d; },
        .launch = launch_pitched_tapered,
    });
    register_kernel<WriteSliceOp>({
        .sku = sku(t, "write_slice", "kv_2d", "kv_2d"),
        .priority = 30,
        .fits = [](const Problem& p, const DeviceCaps&) { return p.path == Path::pitched_2d; },
        .launch = launch_pitched,
    });
    register_kernel<WriteSliceOp>({
        .sku = sku(t, "write_slice", "strided", "generic_flat"),
        .priority = 15,
        .fits = [](const Problem& p, const DeviceCaps&) { return p.path == Path::generic; },
        .launch = launch_generic_flat,
    });
    // The fallback for every byte-level layout (also correct on the paths above).
    register_kernel<WriteSliceOp>({
        .sku = sku(t, "write_slice", "strided", "generic_v16"),
        .priority = 10,
        .fits = [](const Problem& p, const DeviceCaps&) { return p.path != Path::subbyte_merge; },
        .launch = launch_generic,
    });
    if (is_sub_byte(t)) {
      register_kernel<WriteSliceOp>({
          .sku = sku(t, "write_slice", "packed_bits", "subbyte_merge_words"),
          .priority = 25,
          .fits = [](const Problem& p, const DeviceCaps&) { return p.path == Path::subbyte_merge; },
          .launch = launch_merge_words,
      });
      register_kernel<WriteSliceOp>({
          .sku = sku(t, "write_slice", "packed_bits", "subbyte_merge"),
          .priority = 20,
          .fits = [](const Problem& p, const DeviceCaps&) { return p.path == Path::subbyte_merge; },
          .launch = launch_merge,
      });
    }
    register_kernel<KvAppendOp>({
        .sku = sku(t, "kv_append", "strided", "kv_append"),
        .priority = 10,
        .launch = launch_kv,
    });
  }
  return true;
}
BARACUDA_REGISTER(register_cuda());

}  // namespace
}  // namespace baracuda
