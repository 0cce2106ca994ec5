// The attention kernels instantiated for f16: the SIMT kernels and the backward's tensor-core
// kernels (the forward's and the decode's in kernels_f16_forward.cu / kernels_f16_decode.cu).
#include "ops/attention/launch.cuh"

namespace baracuda::attention::kernels {
BARACUDA_REGISTER(register_simt_kernels<DType::f16>());
BARACUDA_REGISTER(register_backward_mma_kernels<DType::f16>());
}  // namespace baracuda::attention::kernels
