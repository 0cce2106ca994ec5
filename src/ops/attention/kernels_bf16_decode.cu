// The attention decode kernels instantiated for bf16.
#include "ops/attention/launch.cuh"

namespace baracuda::attention::kernels {
BARACUDA_REGISTER(register_decode_kernels<DType::bf16>());
}  // namespace baracuda::attention::kernels
