// Streams, device capabilities and memory.
//
// A Stream is where a plan runs: the CPU (the reference backend executes synchronously on the
// calling thread) or a CUDA stream, either owned by baracuda or borrowed from the caller's
// framework (we never destroy a borrowed one). Plans are selected for a stream's target and must
// be run on a stream of the same target.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "baracuda/core/status.hpp"
#include "baracuda/core/tensor.hpp"

namespace baracuda {

// What a plan can learn about the device it will run on.
struct DeviceCaps {
  int device = -1;  // -1: CPU
  int sm = 0;       // compute capability x10 (80, 89, 90); 0 for the CPU
  int sm_count = 0;
  int64_t l2_bytes = 0;
  int64_t smem_per_block_optin = 0;
  std::string name = "cpu";
};

// The most threads a plan on a CPU stream spreads its work over: the host's cores unless set
// (set_cpu_threads(0) restores that). Process-wide. A plan's bits do not depend on it: the CPU
// backends split work only into slices with outputs of their own, each computed whole on one
// thread.
int64_t cpu_threads();
void set_cpu_threads(int64_t n);

// True when this build has CUDA support and at least one device is visible.
bool cuda_available();
int cuda_device_count();
Result<DeviceCaps> device_caps(int device);

class Stream {
 public:
  static Stream cpu();
  // Creates and owns a non-blocking CUDA stream on `device`.
  static Result<Stream> create_cuda(int device = 0);
  // Wraps a caller's cudaStream_t (passed as void* so this header needs no CUDA headers).
  static Result<Stream> borrow_cuda(void* cuda_stream, int device);

  Stream(Stream&& other) noexcept;
  Stream& operator=(Stream&& other) noexcept;
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  ~Stream();

  bool is_cpu() const { return caps_.device < 0; }
  bool is_cuda() const { return caps_.device >= 0; }
  void* cuda_handle() const { return handle_; }  // cudaStream_t; nullptr for the CPU
  int device() const { return caps_.device; }
  const DeviceCaps& caps() const { return caps_; }
  Location memory_location() const {
    return is_cpu() ? Location::host() : Location::cuda(caps_.device);
  }
  Status synchronize() const;

 private:
  Stream() = default;
  void* handle_ = nullptr;
  bool owned_ = false;
  DeviceCaps caps_;
};

// Caller-owned scratch memory handed to run(). Plans say how much they need in workspace_size();
// the memory must be kWorkspaceAlignment-aligned (Buffer::allocate and cudaMalloc are), so plans
// may carve f64 and 16-byte-vector arrays out of it.
inline constexpr size_t kWorkspaceAlignment = 256;
struct Workspace {
  void* data = nullptr;
  size_t bytes = 0;
  Location where{};
  static Workspace none() { return {}; }
};

// RAII memory on the host or a CUDA device. Allocation is the caller's business, never run()'s.
class Buffer {
 public:
  static Result<Buffer> allocate(size_t bytes, Location where);
  Buffer() = default;
  Buffer(Buffer&& o) noexcept;
  Buffer& operator=(Buffer&& o) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer();

  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  Location where() const { return where_; }
  Workspace as_workspace() const { return {data_, bytes_, where_}; }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
  Location where_{};
};

// Copies between any two locations (host<->device, device<->device); synchronous.
Status copy_bytes(void* dst, Location dst_where, const void* src, Location src_where, size_t bytes);
// Fills `bytes` at `dst` with `value`; synchronous.
Status fill_bytes(void* dst, Location where, uint8_t value, size_t bytes);

// Where a pointer really lives, as the CUDA driver sees it. Plans use this to reject host memory
// handed to a GPU plan (and device memory handed to the CPU backend) instead of faulting. Without
// CUDA every pointer is host memory.
enum class PointerKind : uint8_t { host, device, managed };
struct PointerInfo {
  PointerKind kind = PointerKind::host;
  int device = -1;
};
PointerInfo query_pointer(const void* p);

}  // namespace baracuda
