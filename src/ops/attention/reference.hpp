// The float64 reference restricted to some query rows: the oracle for sampled checks of shapes too
// big to compute whole (the device tests), with the same code as the CPU backend's forward.
#pragma once

#include <cstdint>

#include "baracuda/ops/attention.hpp"

namespace baracuda::attention::detail {

// Writes Y and LSE of query rows [i_begin, i_end) (clamped to the sequence) of head h of sequence b
// and nothing else; host tensors, validated like a plan's run.
Status reference_forward_rows(const Problem& p, const ForwardArguments& a, int64_t b, int64_t h,
                              int64_t i_begin, int64_t i_end);

}  // namespace baracuda::attention::detail
