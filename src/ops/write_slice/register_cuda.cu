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

Status launch_pitched_cs(const LaunchContext& ctx, const Problem& p, const Arguments& a) {
  return write_slice_cuda::copy_rows(ctx, "kv_2d_cs", dest_origin(p, a),
                                     static_cast<const char*>(a.source.data), p.copy,
                                     {.ilp = 4, .streaming = true});
}

Status launch_pitched_x8_cs(const LaunchContext& ctx, const Problem& p, const Arguments& a) {
  return write_slice_cuda::copy_rows(ctx, "kv_2d_x8_cs", dest_origin(p, a),
                                     static_cast<const char*>(a.source.data), p.copy,
                                     {.ilp = 8, .streaming = true});
}

Status launch_pitched_gs(const LaunchContext& ctx, const Problem& p, const Arguments& a) {
  return write_slice_cuda::copy_rows(ctx, "kv_2d_gs", dest_origin(p, a),
                                     static_cast<const char*>(a.source.data), p.copy,
                                     {.ilp = 8, .streaming = true, .one_wave = true});
}

Status launch_generic(const LaunchContext& ctx, const Problem& p, const Arguments& a) {
  if (p.path == Path::empty) return {};
  return write_slice_cuda::copy_rows(ctx, "generic_v16", dest_origin(p, a),
                                     static_cast<const char*>(a.source.data), p.copy);
}

Status launch_pitched_flat(const LaunchContext& ctx, const Problem& p, const Arguments& a) {
  return write_slice_cuda::copy_flat(ctx, "kv_2d_flat", dest_origin(p, a),
                                     static_cast<const char*>(a.source.data), p.copy);
}

Status launch_generic_flat(const LaunchContext& ctx, const Problem& p, const Arguments& a) {
  if (p.path == Path::empty) return {};
  return write_slice_cuda::copy_flat(ctx, "generic_flat", dest_origin(p, a),
                                     static_cast<const char*>(a.source.data), p.copy);
}

Status launch_bulk(const LaunchContext& ctx, const Problem& p, const Arguments& a) {
  return write_slice_cuda::copy_bulk(ctx, dest_origin(p, a),
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

KernelSku sku(DType t, std::string_view op, std::string_view layout, std::string_view name,
              Arch arch = Arch::sm80) {
  return {.category = "data_movement",
          .op = op,
          .element = t,
          .layout = layout,
          .arch = arch,
          .backend = Backend::bespoke_cuda,
          .precision = write_slice_dtypes::kExactCopy,
          .name = name};
}

// Priorities order the kernels of a path by the H100 measurements in docs/perf/write_slice.md;
// every kernel stays registered, so `PlanPreference::kernel(name)` can pin any of them (the tests
// run every kernel that fits a case, the benchmark A/Bs them).
constexpr int kBulkPriority = 29;  // below kv_2d until a device run shows it faster

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
    register_kernel<WriteSliceOp>({
        .sku = sku(t, "write_slice", "kv_2d", "kv_2d"),
        .priority = 30,
        .fits = [](const Problem& p, const DeviceCaps&) { return p.path == Path::pitched_2d; },
        .launch = launch_pitched,
    });
    // A/B variants of kv_2d's kernel: evict-first accesses, 8 units in flight per thread, one
    // wave walking the tiles.
    register_kernel<WriteSliceOp>({
        .sku = sku(t, "write_slice", "kv_2d", "kv_2d_cs"),
        .priority = 27,
        .fits = [](const Problem& p, const DeviceCaps&) { return p.path == Path::pitched_2d; },
        .launch = launch_pitched_cs,
    });
    register_kernel<WriteSliceOp>({
        .sku = sku(t, "write_slice", "kv_2d", "kv_2d_x8_cs"),
        .priority = 26,
        .fits = [](const Problem& p, const DeviceCaps&) { return p.path == Path::pitched_2d; },
        .launch = launch_pitched_x8_cs,
    });
    register_kernel<WriteSliceOp>({
        .sku = sku(t, "write_slice", "kv_2d", "kv_2d_gs"),
        .priority = 25,
        .fits = [](const Problem& p, const DeviceCaps&) { return p.path == Path::pitched_2d; },
        .launch = launch_pitched_gs,
    });
    register_kernel<WriteSliceOp>({
        .sku = sku(t, "write_slice", "kv_2d", "kv_2d_flat"),
        .priority = 28,
        .fits = [](const Problem& p, const DeviceCaps&) { return p.path == Path::pitched_2d; },
        .launch = launch_pitched_flat,
    });
    // Rows of at least kMinBulkRowBytes on the bulk copy engine, where the layout is 16-byte
    // granular: the pitched path, and the memcpy paths (there only when pinned, for the A/B).
    register_kernel<WriteSliceOp>({
        .sku = sku(t, "write_slice", "kv_2d", "bulk_copy", Arch::sm90),
        .priority = kBulkPriority,
        .fits =
            [](const Problem& p, const DeviceCaps&) {
              return (p.path == Path::pitched_2d || p.path == Path::contiguous_chunk ||
                      p.path == Path::whole_copy) &&
                     write_slice_cuda::bulk_copy_fits(p.copy);
            },
        .launch = launch_bulk,
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
