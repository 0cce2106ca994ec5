// Runtime-typed tensor views.
//
// A view is a pointer, a dtype, a rank <= 8, 64-bit shape and element strides, the number of
// bytes the underlying buffer holds from the data pointer on (for bounds checks), and where the
// memory lives. Views never own memory. Strides are in elements and must be non-negative; stride 0
// broadcasts (legal for inputs). Sub-byte dtypes (s4, u4, bin) pack along the innermost axis: its
// stride must be 1 and every other stride a multiple of elements_per_byte, so each row starts on a
// byte boundary.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>

#include "baracuda/core/dtype.hpp"
#include "baracuda/core/status.hpp"

namespace baracuda {

inline constexpr int kMaxRank = 8;

enum class MemoryKind : uint8_t { host, cuda_device };

struct Location {
  MemoryKind kind = MemoryKind::host;
  int device = 0;  // CUDA device ordinal for cuda_device

  static Location host() { return {MemoryKind::host, 0}; }
  static Location cuda(int device = 0) { return {MemoryKind::cuda_device, device}; }
  bool is_host() const { return kind == MemoryKind::host; }
  bool operator==(const Location&) const = default;
};
std::string to_string(Location l);

using Shape = std::array<int64_t, kMaxRank>;

template <class Ptr>
struct BasicTensor {
  Ptr data = nullptr;
  DType dtype = DType::f32;
  int rank = 0;
  Shape shape{};
  Shape stride{};
  // Bytes readable/writable from `data` on. -1 means "exactly what the view spans" (the caller
  // vouches for it); validation then checks nothing about the buffer's extent.
  int64_t buffer_bytes = -1;
  Location where{};

  std::span<const int64_t> dims() const { return {shape.data(), static_cast<size_t>(rank)}; }
  std::span<const int64_t> strides() const { return {stride.data(), static_cast<size_t>(rank)}; }
  // Element count; 0 for empty tensors. Shapes are validated before this is trusted (overflow
  // saturates to INT64_MAX so a bogus shape can never wrap to a small number).
  int64_t numel() const;
  bool is_contiguous() const;  // row-major dense, strides of size-1 axes ignored
  // One past the largest element offset the view can touch, in elements (0 if empty).
  int64_t span_elements() const;
  // Bytes the view spans from `data` (sub-byte types rounded up to whole bytes).
  int64_t span_bytes() const;
};

using Tensor = BasicTensor<void*>;             // writable view
using ConstTensor = BasicTensor<const void*>;  // read-only view

template <class Ptr>
inline BasicTensor<const void*> as_const(const BasicTensor<Ptr>& t) {
  BasicTensor<const void*> c;
  c.data = t.data;
  c.dtype = t.dtype;
  c.rank = t.rank;
  c.shape = t.shape;
  c.stride = t.stride;
  c.buffer_bytes = t.buffer_bytes;
  c.where = t.where;
  return c;
}

// Row-major strides for a shape.
Shape contiguous_strides(std::span<const int64_t> shape);

// Builds a dense row-major view. `buffer_bytes` defaults to exactly the bytes it spans.
Tensor make_tensor(void* data, DType dtype, std::initializer_list<int64_t> shape,
                   Location where = Location::host(), int64_t buffer_bytes = -1);
Tensor make_tensor(void* data, DType dtype, std::span<const int64_t> shape,
                   Location where = Location::host(), int64_t buffer_bytes = -1);
Tensor make_strided(void* data, DType dtype, std::span<const int64_t> shape,
                    std::span<const int64_t> strides, Location where = Location::host(),
                    int64_t buffer_bytes = -1);
ConstTensor make_tensor(const void* data, DType dtype, std::span<const int64_t> shape,
                        Location where = Location::host(), int64_t buffer_bytes = -1);
ConstTensor make_strided(const void* data, DType dtype, std::span<const int64_t> shape,
                         std::span<const int64_t> strides, Location where = Location::host(),
                         int64_t buffer_bytes = -1);

// "bf16[4,8]{8,1}@cuda:0"
template <class Ptr>
std::string describe(const BasicTensor<Ptr>& t);

// ---- Typed sugar --------------------------------------------------------------------------------
// TensorRef<T, N> / TensorMut<T, N> fix dtype and rank at compile time for C++ callers who know
// them, and convert to the runtime views that every plan takes.
template <class T, int N>
struct TensorRef {
  const T* data;
  std::array<int64_t, N> shape;
  std::array<int64_t, N> stride;
  int64_t buffer_bytes = -1;
  Location where{};

  operator ConstTensor() const {  // NOLINT(google-explicit-constructor)
    ConstTensor t;
    t.data = data;
    t.dtype = dtype_of_v<T>;
    t.rank = N;
    for (int i = 0; i < N; ++i) t.shape[i] = shape[i], t.stride[i] = stride[i];
    t.buffer_bytes = buffer_bytes;
    t.where = where;
    return t;
  }
};

template <class T, int N>
struct TensorMut {
  T* data;
  std::array<int64_t, N> shape;
  std::array<int64_t, N> stride;
  int64_t buffer_bytes = -1;
  Location where{};

  operator Tensor() const {  // NOLINT(google-explicit-constructor)
    Tensor t;
    t.data = data;
    t.dtype = dtype_of_v<T>;
    t.rank = N;
    for (int i = 0; i < N; ++i) t.shape[i] = shape[i], t.stride[i] = stride[i];
    t.buffer_bytes = buffer_bytes;
    t.where = where;
    return t;
  }
  operator ConstTensor() const { return as_const(static_cast<Tensor>(*this)); }  // NOLINT
};

// ---- Checked 64-bit arithmetic ------------------------------------------------------------------
// Shapes come from users; every product over them goes through these. Inline: every run()
// validates its views with them (span and element counts of each tensor), so a call out of the
// library per product showed in the host cost of a decode step.
inline bool checked_mul(int64_t a, int64_t b, int64_t* out) {
  return !__builtin_mul_overflow(a, b, out);
}
inline bool checked_add(int64_t a, int64_t b, int64_t* out) {
  return !__builtin_add_overflow(a, b, out);
}

}  // namespace baracuda
