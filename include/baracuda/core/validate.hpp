// Argument checks shared by every op family. Each returns an Error whose message is
// "<op>: <arg>: <rule, with the numbers>", so families never hand-roll these messages.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>

#include "baracuda/core/status.hpp"
#include "baracuda/core/tensor.hpp"

namespace baracuda::validate {

// Rank in [min_rank, max_rank], non-negative extents whose product fits in int64.
Status shape(std::string_view op, std::string_view arg, std::span<const int64_t> dims,
             int min_rank = 1, int max_rank = kMaxRank);

// Everything about one tensor argument:
//  - dtype equals `dtype`, rank and shape equal `dims`;
//  - strides non-negative, layout legal for the dtype (sub-byte packing rule), stride 0 only
//    where `allow_broadcast`;
//  - the buffer holds every element the view can reach (BufferTooSmall{needed, got});
//  - a written view (a Tensor without allow_broadcast) reaches each element once;
//  - data aligned to the element (and to rule.align_bytes);
//  - non-null data when the tensor is non-empty;
//  - the declared location is `where`, and (with CUDA) the pointer really lives there.
struct TensorRule {
  bool allow_broadcast = false;  // stride 0 permitted (inputs only)
  bool require_contiguous = false;
  int64_t align_bytes = 1;  // required alignment of data
};
template <class Ptr>
Status tensor(std::string_view op, std::string_view arg, const BasicTensor<Ptr>& t, DType dtype,
              std::span<const int64_t> dims, Location where, TensorRule rule = {});

// Rejects an output whose memory range intersects an input's (conservative: compares the byte
// ranges each view spans, which is exact for the dense case and safe for strided ones).
Status no_overlap(std::string_view op, std::string_view out_arg, const Tensor& out,
                  std::string_view in_arg, const ConstTensor& in);

// Validates a raw pointer argument of `bytes` bytes (device scalars, index arrays).
Status pointer(std::string_view op, std::string_view arg, const void* p, int64_t bytes,
               Location where);

}  // namespace baracuda::validate
