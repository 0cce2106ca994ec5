// The `bulk_copy` kernel (sm_90+): the window's rows move through shared memory with the bulk
// copy engine (cp.async.bulk global -> shared, completing on an mbarrier, then shared -> global),
// several chunks in flight per block. One thread per block issues everything: the copy engine
// generates the addresses, so no thread spends registers or instructions per 16 bytes, and the
// pitched KV window streams like a plain memcpy.
#include <algorithm>

#include "core/cuda/launch.cuh"
#include "ops/write_slice/kernels.cuh"
#include "ops/write_slice/launch.hpp"

namespace baracuda::write_slice_cuda {
namespace {

using write_slice_detail::CopyShape;

// 8 KiB chunks, 4 stages: 32 KiB of shared memory per block, so several blocks share an SM and a
// 64 MiB window still gives each block about ten chunks (balance at the tail).
constexpr int kStages = 4;
constexpr int64_t kChunkUnits = 512;  // 16-byte units per chunk
constexpr int kChunkBytes = static_cast<int>(kChunkUnits * 16);

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void bar_init(uint64_t* bar) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_addr(bar)) : "memory");
}
__device__ __forceinline__ void bar_expect(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)),
               "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void bar_wait(uint64_t* bar, uint32_t parity) {
  uint32_t done = 0;
  while (!done)
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        " selp.u32 %0, 1, 0, p;\n}"
        : "=r"(done)
        : "r"(smem_addr(bar)), "r"(parity)
        : "memory");
}
__device__ __forceinline__ void bulk_load(void* smem, const void* gmem, uint32_t bytes,
                                          uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::
          "r"(smem_addr(smem)),
      "l"(gmem), "r"(bytes), "r"(smem_addr(bar))
      : "memory");
}
__device__ __forceinline__ void bulk_store(void* gmem, const void* smem, uint32_t bytes) {
  asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(gmem),
               "r"(smem_addr(smem)), "r"(bytes)
               : "memory");
  asm volatile("cp.async.bulk.commit_group;" ::: "memory");
}
#endif

// The window is cut into chunks that never cross a row (a row's last chunk may be short);
// block b takes chunks b, b + G, b + 2G, ... so the blocks in flight stay within a narrow band of
// addresses (DRAM pages stay open; one long span per block measured slower at b292e38/0ac438f).
// Strides of `a` are in 16-byte units.
__global__ void __launch_bounds__(32)
    bulk_copy_kernel(char* __restrict__ dst, const char* __restrict__ src, RowsArgs a,
                     int64_t chunks_per_row) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ __align__(128) unsigned char ring[];
  __shared__ __align__(8) uint64_t full[kStages];
  __shared__ char* stage_dst[kStages];
  __shared__ uint32_t stage_bytes[kStages];
  if (threadIdx.x != 0) return;
  const int64_t total = a.rows * chunks_per_row;
  const int64_t stride = gridDim.x;
  int64_t next = blockIdx.x;
  for (int s = 0; s < kStages; ++s) bar_init(&full[s]);
  // The copy engine (async proxy) must see the initialized barriers.
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");

  auto issue = [&](int s) {
    const int64_t row = next / chunks_per_row;
    const int64_t col = (next - row * chunks_per_row) * kChunkUnits;
    const int64_t n = min(kChunkUnits, a.inner - col);
    int64_t doff, soff;
    row_offsets(a, row, &doff, &soff);
    const uint32_t bytes = static_cast<uint32_t>(n * 16);
    stage_dst[s] = dst + (doff + col) * 16;
    stage_bytes[s] = bytes;
    bar_expect(&full[s], bytes);
    bulk_load(ring + s * kChunkBytes, src + (soff + col) * 16, bytes, &full[s]);
    next += stride;
  };
  // This block's k-th chunk lives in stage k % kStages. Its stage is refilled (with chunk
  // k + kStages) one step after its store was issued, once that store has read shared memory.
  int64_t produced = 0;
  for (; produced < kStages && next < total; ++produced) issue(static_cast<int>(produced));
  for (int64_t k = 0; k < produced; ++k) {
    const int s = static_cast<int>(k % kStages);
    bar_wait(&full[s], static_cast<uint32_t>((k / kStages) & 1));
    bulk_store(stage_dst[s], ring + s * kChunkBytes, stage_bytes[s]);
    if (k >= 1 && next < total) {
      asm volatile("cp.async.bulk.wait_group.read 1;" ::: "memory");
      issue(static_cast<int>((k - 1) % kStages));
      ++produced;
    }
  }
  asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
#endif
}

}  // namespace

bool bulk_copy_fits(const CopyShape& c) {
  if (c.inner_bytes < kMinBulkRowBytes || c.inner_bytes % 16 != 0 || c.dst_offset % 16 != 0)
    return false;
  for (int k = 0; k < c.outer_rank; ++k)
    if (c.dst_stride[k] % 16 != 0 || c.src_stride[k] % 16 != 0) return false;
  return true;
}

Status copy_bulk(const LaunchContext& ctx, char* dst, const char* src, const CopyShape& c) {
  if (c.rows == 0 || c.inner_bytes == 0) return {};
  // A base pointer off 16 bytes (a view into the middle of a buffer) cannot use the copy engine:
  // the same copy then runs on the register kernel, exact either way.
  if (widest_unit({static_cast<int64_t>(reinterpret_cast<uintptr_t>(dst)),
                   static_cast<int64_t>(reinterpret_cast<uintptr_t>(src))}) < 16 ||
      !bulk_copy_fits(c))
    return copy_rows(ctx, "bulk_copy", dst, src, c);
  RowsArgs a{};
  a.outer_rank = c.outer_rank;
  for (int k = 0; k < c.outer_rank; ++k) {
    a.extent[k] = c.extent[k];
    a.dst_stride[k] = c.dst_stride[k] / 16;
    a.src_stride[k] = c.src_stride[k] / 16;
  }
  a.rows = c.rows;
  a.inner = c.inner_bytes / 16;
  const int64_t chunks_per_row = cuda::ceil_div(a.inner, kChunkUnits);
  const int64_t chunks = a.rows * chunks_per_row;
  // The kernel body exists only in sm_90+ machine code: a build without such a target (say
  // sm_80 only, run on a Hopper part) would launch an empty kernel, so it takes the fallback.
  static const bool has_body = [] {
    cudaFuncAttributes attr{};
    return cudaFuncGetAttributes(&attr, bulk_copy_kernel) == cudaSuccess &&
           attr.binaryVersion >= 90;
  }();
  if (!has_body) return copy_rows(ctx, "bulk_copy", dst, src, c);
  static const int per_sm = [] {
    int n = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, bulk_copy_kernel, 32,
                                                      kStages * kChunkBytes) != cudaSuccess ||
        n < 1)
      n = 1;
    return n;
  }();
  const int sms = ctx.stream.caps().sm_count > 0 ? ctx.stream.caps().sm_count : 128;
  // One wave, but at least two chunks per block so the pipeline has something to overlap.
  const int64_t blocks =
      std::clamp<int64_t>(cuda::ceil_div(chunks, int64_t{2}), 1, int64_t{sms} * per_sm);
  bulk_copy_kernel<<<static_cast<unsigned>(blocks), 32, kStages * kChunkBytes,
                     cuda::stream_of(ctx)>>>(dst, src, a, chunks_per_row);
  return cuda::check_launch(WriteSliceOp::name, "bulk_copy");
}

}  // namespace baracuda::write_slice_cuda
