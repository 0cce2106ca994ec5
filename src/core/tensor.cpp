#include "baracuda/core/tensor.hpp"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>

namespace baracuda {

std::string to_string(Location l) {
  return l.is_host() ? std::string("host") : "cuda:" + std::to_string(l.device);
}

template <class Ptr>
int64_t BasicTensor<Ptr>::numel() const {
  int64_t n = 1;
  for (int i = 0; i < std::min(rank, kMaxRank); ++i) {
    if (shape[i] <= 0) return 0;
    if (!checked_mul(n, shape[i], &n)) return std::numeric_limits<int64_t>::max();
  }
  return n;
}

template <class Ptr>
bool BasicTensor<Ptr>::is_contiguous() const {
  int64_t expect = 1;
  for (int i = std::min(rank, kMaxRank) - 1; i >= 0; --i) {
    if (shape[i] == 1) continue;
    if (stride[i] != expect) return false;
    if (!checked_mul(expect, shape[i], &expect)) return false;
  }
  return true;
}

template <class Ptr>
int64_t BasicTensor<Ptr>::span_elements() const {
  const int r = std::min(rank, kMaxRank);
  for (int i = 0; i < r; ++i)
    if (shape[i] <= 0) return 0;  // empty (numel() == 0), without numel()'s products
  int64_t last = 0;
  for (int i = 0; i < r; ++i) {
    int64_t step = 0;
    if (!checked_mul(shape[i] - 1, stride[i], &step) || !checked_add(last, step, &last))
      return std::numeric_limits<int64_t>::max();
  }
  return last == std::numeric_limits<int64_t>::max() ? last : last + 1;
}

template <class Ptr>
int64_t BasicTensor<Ptr>::span_bytes() const {
  const int64_t elems = span_elements();
  const int bits = bits_of(dtype);
  int64_t total_bits = 0;
  if (!checked_mul(elems, bits, &total_bits)) return std::numeric_limits<int64_t>::max();
  return (total_bits + 7) / 8;
}

template struct BasicTensor<void*>;
template struct BasicTensor<const void*>;

Shape contiguous_strides(std::span<const int64_t> shape) {
  Shape s{};
  int64_t acc = 1;
  for (int i = static_cast<int>(shape.size()) - 1; i >= 0; --i) {
    s[i] = acc;
    if (!checked_mul(acc, std::max<int64_t>(shape[i], 1), &acc))
      acc = std::numeric_limits<int64_t>::max();
  }
  return s;
}

namespace {
template <class Ptr>
BasicTensor<Ptr> build(Ptr data, DType dtype, std::span<const int64_t> shape,
                       std::span<const int64_t> strides, Location where, int64_t buffer_bytes) {
  BasicTensor<Ptr> t;
  t.data = data;
  t.dtype = dtype;
  t.rank = static_cast<int>(std::min<size_t>(shape.size(), kMaxRank + 1));
  // A rank above kMaxRank is kept as kMaxRank + 1 (clipped storage) so validation reports it.
  for (int i = 0; i < std::min(t.rank, kMaxRank); ++i) {
    t.shape[i] = shape[i];
    t.stride[i] = strides[i];
  }
  t.where = where;
  t.buffer_bytes = buffer_bytes;
  return t;
}
}  // namespace

Tensor make_tensor(void* data, DType dtype, std::initializer_list<int64_t> shape, Location where,
                   int64_t buffer_bytes) {
  return make_tensor(data, dtype, std::span<const int64_t>(shape.begin(), shape.size()), where,
                     buffer_bytes);
}
Tensor make_tensor(void* data, DType dtype, std::span<const int64_t> shape, Location where,
                   int64_t buffer_bytes) {
  const Shape s = contiguous_strides(shape.subspan(0, std::min<size_t>(shape.size(), kMaxRank)));
  return build<void*>(data, dtype, shape, std::span<const int64_t>(s.data(), kMaxRank), where,
                      buffer_bytes);
}
Tensor make_strided(void* data, DType dtype, std::span<const int64_t> shape,
                    std::span<const int64_t> strides, Location where, int64_t buffer_bytes) {
  return build<void*>(data, dtype, shape, strides, where, buffer_bytes);
}
ConstTensor make_tensor(const void* data, DType dtype, std::span<const int64_t> shape,
                        Location where, int64_t buffer_bytes) {
  const Shape s = contiguous_strides(shape.subspan(0, std::min<size_t>(shape.size(), kMaxRank)));
  return build<const void*>(data, dtype, shape, std::span<const int64_t>(s.data(), kMaxRank), where,
                            buffer_bytes);
}
ConstTensor make_strided(const void* data, DType dtype, std::span<const int64_t> shape,
                         std::span<const int64_t> strides, Location where, int64_t buffer_bytes) {
  return build<const void*>(data, dtype, shape, strides, where, buffer_bytes);
}

template <class Ptr>
std::string describe(const BasicTensor<Ptr>& t) {
  std::string s(name(t.dtype));
  s += "[";
  for (int i = 0; i < std::min(t.rank, kMaxRank); ++i)
    s += (i ? "," : "") + std::to_string(t.shape[i]);
  s += "]{";
  for (int i = 0; i < std::min(t.rank, kMaxRank); ++i)
    s += (i ? "," : "") + std::to_string(t.stride[i]);
  s += "}@" + to_string(t.where);
  return s;
}
template std::string describe(const BasicTensor<void*>&);
template std::string describe(const BasicTensor<const void*>&);

}  // namespace baracuda
