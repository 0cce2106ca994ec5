// The fa3 forward's f16 instances (fa3_forward.cuh).
#include "ops/attention_hopper/fa3_forward.cuh"

namespace baracuda::attention_hopper::fa3 {
BARACUDA_REGISTER(register_one<DType::f16>());
}  // namespace baracuda::attention_hopper::fa3
