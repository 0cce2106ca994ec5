// The attention kernels instantiated for f64.
#include "ops/attention/launch.cuh"

namespace baracuda::attention::kernels {
BARACUDA_REGISTER(register_simt_kernels<DType::f64>());
}  // namespace baracuda::attention::kernels
