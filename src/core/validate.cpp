#include "baracuda/core/validate.hpp"

#include <algorithm>
#include <array>
#include <cstdint>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>

#include "baracuda/core/stream.hpp"

namespace baracuda::validate {
namespace {

std::string prefix(std::string_view op, std::string_view arg) {
  std::string s(op);
  s += ": ";
  s += arg;
  s += ": ";
  return s;
}

std::string hex(const void* p) {
  std::ostringstream os;
  os << p;
  return os.str();
}

Status placement(std::string_view op, std::string_view arg, const void* p, Location declared,
                 Location where) {
  if (!(declared == where))
    return Error::wrong_device(prefix(op, arg) + "declared on " + to_string(declared) +
                               " but the plan runs on " + to_string(where));
  const PointerInfo info = query_pointer(p);
  if (where.is_host()) {
    if (info.kind == PointerKind::device)
      return Error::wrong_device(prefix(op, arg) + "pointer " + hex(p) +
                                 " is device memory (cuda:" + std::to_string(info.device) +
                                 ") but the plan runs on the CPU");
    return {};
  }
  if (info.kind == PointerKind::host)
    return Error::wrong_device(prefix(op, arg) + "pointer " + hex(p) +
                               " is host memory but the plan runs on " + to_string(where));
  if (info.kind == PointerKind::device && info.device != where.device)
    return Error::wrong_device(prefix(op, arg) + "pointer " + hex(p) +
                               " lives on cuda:" + std::to_string(info.device) +
                               " but the plan runs on " + to_string(where));
  return {};
}

// A view the op writes must not reach one element twice (two threads would race on it, and the
// result would depend on their order): with the axes sorted by stride, each must step past all
// that the smaller-stride axes span. Sufficient, and exact for dense tensors, their windows and
// their permutations. Called after the span check, so the sums cannot overflow.
template <class Ptr>
Status distinct_elements(std::string_view op, std::string_view arg, const BasicTensor<Ptr>& t) {
  std::array<std::pair<int64_t, int64_t>, kMaxRank> axes{};  // (stride, extent)
  int n = 0;
  for (int i = 0; i < std::min(t.rank, kMaxRank); ++i) {
    if (t.shape[i] <= 1) continue;
    int j = n++;  // insertion by stride (at most 8 axes)
    for (; j > 0 && axes[j - 1].first > t.stride[i]; --j) axes[j] = axes[j - 1];
    axes[j] = {t.stride[i], t.shape[i]};
  }
  int64_t reach = 0;  // the largest offset the smaller-stride axes reach
  for (int i = 0; i < n; ++i) {
    if (axes[i].first <= reach)
      return Error::invalid(prefix(op, arg) + "the written view " + describe(t) +
                            " reaches some elements twice (its axes overlap)");
    reach += (axes[i].second - 1) * axes[i].first;
  }
  return {};
}

}  // namespace

Status shape(std::string_view op, std::string_view arg, std::span<const int64_t> dims, int min_rank,
             int max_rank) {
  const int rank = static_cast<int>(dims.size());
  if (rank < min_rank || rank > max_rank)
    return Error::invalid(prefix(op, arg) + "rank " + std::to_string(rank) + " is outside [" +
                          std::to_string(min_rank) + ", " + std::to_string(max_rank) + "]");
  int64_t n = 1;
  for (int i = 0; i < rank; ++i) {
    if (dims[i] < 0)
      return Error::invalid(prefix(op, arg) + "shape[" + std::to_string(i) +
                            "]=" + std::to_string(dims[i]) + " is negative");
    if (!checked_mul(n, dims[i], &n))
      return Error::invalid(prefix(op, arg) + "element count overflows int64 at axis " +
                            std::to_string(i));
  }
  return {};
}

template <class Ptr>
Status tensor(std::string_view op, std::string_view arg, const BasicTensor<Ptr>& t, DType dtype,
              std::span<const int64_t> dims, Location where, TensorRule rule) {
  if (t.rank != static_cast<int>(dims.size()))
    return Error::invalid(prefix(op, arg) + "rank " + std::to_string(t.rank) + ", expected " +
                          std::to_string(dims.size()));
  if (t.dtype != dtype)
    return Error::invalid(prefix(op, arg) + "dtype " + std::string(name(t.dtype)) + ", expected " +
                          std::string(name(dtype)));
  for (int i = 0; i < t.rank; ++i) {
    if (t.shape[i] != dims[i])
      return Error::invalid(prefix(op, arg) + "shape[" + std::to_string(i) + "]=" +
                            std::to_string(t.shape[i]) + ", expected " + std::to_string(dims[i]));
  }
  for (int i = 0; i < t.rank; ++i) {
    if (t.stride[i] < 0)
      return Error::invalid(prefix(op, arg) + "stride[" + std::to_string(i) +
                            "]=" + std::to_string(t.stride[i]) + " is negative");
    if (t.stride[i] == 0 && t.shape[i] > 1 && !rule.allow_broadcast)
      return Error::invalid(prefix(op, arg) + "stride[" + std::to_string(i) +
                            "]=0 broadcasts, which is only legal for inputs");
  }
  // An empty view touches no byte, so it has no rows to align (a dense [.., L, 0] s4 view's
  // strides treat the empty axis as 1, which the packing rule would otherwise refuse).
  if (is_sub_byte(dtype) && t.rank > 0 && t.numel() > 0) {
    const int epb = elements_per_byte(dtype);
    if (t.shape[t.rank - 1] > 1 && t.stride[t.rank - 1] != 1)
      return Error::invalid(
          prefix(op, arg) + std::string(name(dtype)) + " packs along the innermost axis: stride[" +
          std::to_string(t.rank - 1) + "]=" + std::to_string(t.stride[t.rank - 1]) + " must be 1");
    for (int i = 0; i + 1 < t.rank; ++i)
      if (t.shape[i] > 1 && t.stride[i] % epb != 0)
        return Error::invalid(prefix(op, arg) + std::string(name(dtype)) +
                              " rows must start on a byte: stride[" + std::to_string(i) +
                              "]=" + std::to_string(t.stride[i]) + " is not a multiple of " +
                              std::to_string(epb));
  }
  // -1 is the API's "exactly what the view spans"; any other negative is a caller's garbage and
  // must not switch the extent check off.
  if (t.buffer_bytes < -1)
    return Error::invalid(prefix(op, arg) + "buffer_bytes=" + std::to_string(t.buffer_bytes) +
                          " is negative (only -1, \"what the view spans\", is allowed)");
  if (rule.require_contiguous && !t.is_contiguous())
    return Error::invalid(prefix(op, arg) + "must be contiguous row-major, got " + describe(t));
  if (t.numel() == 0) return {};
  if (t.data == nullptr) return Error::invalid(prefix(op, arg) + "data is null");
  // A typed pointer is aligned to its element (to a component for complex types: alignof of the
  // C++ type), whatever the op asks on top: a device load of a misaligned element faults and
  // leaves the CUDA context unusable, and a host one is undefined behaviour.
  const int64_t natural = bits_of(dtype) < 8 ? 1 : bits_of(dtype) / (is_complex(dtype) ? 16 : 8);
  const int64_t align = std::max<int64_t>(rule.align_bytes, natural);
  if (align > 1 && reinterpret_cast<uintptr_t>(t.data) % static_cast<uintptr_t>(align) != 0)
    return Error::misaligned(prefix(op, arg) + "data " + hex(t.data) + " is not " +
                             std::to_string(align) + "-byte aligned");
  const int64_t span = t.span_bytes();
  if (span == INT64_MAX)
    return Error::invalid(prefix(op, arg) + "view spans more than 2^63 bytes: " + describe(t));
  if (t.buffer_bytes >= 0 && span > t.buffer_bytes)
    return Error::buffer_too_small(
        prefix(op, arg) + "view " + describe(t) + " spans " + std::to_string(span) +
            " bytes but the buffer holds " + std::to_string(t.buffer_bytes),
        static_cast<uint64_t>(span), static_cast<uint64_t>(t.buffer_bytes));
  // A writable view (Tensor) that may not broadcast is one the op writes.
  if constexpr (std::is_same_v<Ptr, void*>)
    if (!rule.allow_broadcast) BARACUDA_TRY(distinct_elements(op, arg, t));
  return placement(op, arg, t.data, t.where, where);
}

template Status tensor(std::string_view, std::string_view, const BasicTensor<void*>&, DType,
                       std::span<const int64_t>, Location, TensorRule);
template Status tensor(std::string_view, std::string_view, const BasicTensor<const void*>&, DType,
                       std::span<const int64_t>, Location, TensorRule);

Status no_overlap(std::string_view op, std::string_view out_arg, const Tensor& out,
                  std::string_view in_arg, const ConstTensor& in) {
  if (out.numel() == 0 || in.numel() == 0) return {};
  const auto o0 = reinterpret_cast<uintptr_t>(out.data);
  const auto i0 = reinterpret_cast<uintptr_t>(in.data);
  const auto o1 = o0 + static_cast<uintptr_t>(out.span_bytes());
  const auto i1 = i0 + static_cast<uintptr_t>(in.span_bytes());
  if (o0 < i1 && i0 < o1)
    return Error::invalid(std::string(op) + ": " + std::string(out_arg) + " and " +
                          std::string(in_arg) + " overlap in memory ([" + hex(out.data) + ", +" +
                          std::to_string(o1 - o0) + ") and [" + hex(in.data) + ", +" +
                          std::to_string(i1 - i0) + "))");
  return {};
}

Status pointer(std::string_view op, std::string_view arg, const void* p, int64_t bytes,
               Location where) {
  if (bytes <= 0) return {};
  if (p == nullptr) return Error::invalid(prefix(op, arg) + "is null");
  return placement(op, arg, p, where, where);
}

}  // namespace baracuda::validate
