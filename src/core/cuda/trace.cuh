// CTA timelines for latency studies: a measurement build (cmake -DBARACUDA_KERNEL_TRACE=ON),
// compiled out otherwise. Thread 0 of a CTA stamps %globaltimer (one clock for the whole device,
// 32 ns steps on the H200) into the slots of its row; the launch hands the kernel a managed buffer
// through its parameters and, every Nth launch, waits for the stream and appends the rows to the
// file the BARACUDA_KERNEL_TRACE environment variable names (N: BARACUDA_KERNEL_TRACE_EVERY,
// default 25). The buffer goes through the parameters because a __device__ or __managed__ array
// would not do: every translation unit holds its own copy, and the one that launches a template
// kernel need not be the one that reads it back (the ninety-fourth session lost two device calls
// to that). scripts/decode_trace.py reads the decode's rows. Include only from .cu files.
#pragma once

#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace baracuda::cuda {

struct CtaTrace {
  static constexpr int kSlots = 8;  // 7 stamps, then the CTA's SM
  static constexpr int kRows = 4096;
  unsigned long long* rows = nullptr;

  __device__ void stamp(int row, int slot) const {
#if defined(BARACUDA_KERNEL_TRACE) && BARACUDA_KERNEL_TRACE
    if (rows == nullptr || threadIdx.x != 0 || row < 0 || row >= kRows) return;
    unsigned long long t;
    unsigned sm;
    asm volatile("mov.u64 %0, %%globaltimer;\n" : "=l"(t));
    asm volatile("mov.u32 %0, %%smid;\n" : "=r"(sm));
    volatile unsigned long long* r = rows + row * kSlots;
    r[slot] = t;
    r[kSlots - 1] = sm;
#endif
  }
};

#if defined(BARACUDA_KERNEL_TRACE) && BARACUDA_KERNEL_TRACE
// The buffer a launch stamps into: null unless BARACUDA_KERNEL_TRACE names a file. One buffer for
// the process (launches that dump wait for their stream first, and the dump clears it).
inline CtaTrace trace_for_launch() {
  static unsigned long long* const rows = []() -> unsigned long long* {
    if (std::getenv("BARACUDA_KERNEL_TRACE") == nullptr) return nullptr;
    void* p = nullptr;
    const size_t bytes = sizeof(unsigned long long) * CtaTrace::kRows * CtaTrace::kSlots;
    if (cudaMallocManaged(&p, bytes) != cudaSuccess) return nullptr;
    std::memset(p, 0, bytes);
    return static_cast<unsigned long long*>(p);
  }();
  return {rows};
}

// Every Nth call with a buffer: waits for the stream, appends "launch <n> <header()>" and one line
// per row in [0, rows) ("cta <row> <7 stamps> sm <id>"), clears the buffer. `header()` says what
// ran (the reader groups by it); it is called only for the launches dumped.
template <class Header>
void dump_trace(cudaStream_t stream, const CtaTrace& trace, int rows, Header header) {
  if (trace.rows == nullptr) return;
  static const int every = [] {
    const char* e = std::getenv("BARACUDA_KERNEL_TRACE_EVERY");
    return e != nullptr && std::atoi(e) > 0 ? std::atoi(e) : 25;
  }();
  static int launches = 0;
  if (++launches % every != 0) return;
  // A stream being captured into a CUDA graph cannot be waited for (and the stamps land later).
  cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &capturing) != cudaSuccess ||
      capturing != cudaStreamCaptureStatusNone || cudaStreamSynchronize(stream) != cudaSuccess)
    return;
  std::FILE* f = std::fopen(std::getenv("BARACUDA_KERNEL_TRACE"), "a");
  if (f == nullptr) return;
  std::fprintf(f, "launch %d %s\n", launches, std::string(header()).c_str());
  for (int r = 0; r < rows && r < CtaTrace::kRows; ++r) {
    const unsigned long long* s = trace.rows + r * CtaTrace::kSlots;
    std::fprintf(f, "cta %d", r);
    for (int k = 0; k + 1 < CtaTrace::kSlots; ++k) std::fprintf(f, " %llu", s[k]);
    std::fprintf(f, " sm %llu\n", s[CtaTrace::kSlots - 1]);
  }
  std::fclose(f);
  std::memset(trace.rows, 0, sizeof(unsigned long long) * CtaTrace::kRows * CtaTrace::kSlots);
}
#endif

}  // namespace baracuda::cuda
