// The fa3 backward's bf16 instances (fa3_backward.cuh).
#include "ops/attention_hopper/fa3_backward.cuh"

namespace baracuda::attention_hopper::fa3 {
BARACUDA_REGISTER(register_one<DType::bf16>());
}  // namespace baracuda::attention_hopper::fa3
