// The attention decode kernels instantiated for f16.
#include "ops/attention/launch.cuh"

namespace baracuda::attention::kernels {
BARACUDA_REGISTER(register_decode_kernels<DType::f16>());
}  // namespace baracuda::attention::kernels
