// The fa3 forward's e4m3 instances, Y in bf16 and in f16 (fa3_forward.cuh).
#include "ops/attention_hopper/fa3_forward.cuh"

namespace baracuda::attention_hopper::fa3 {
BARACUDA_REGISTER(register_fp8());
}  // namespace baracuda::attention_hopper::fa3
