// The attention kernels instantiated for bf16: the SIMT kernels and the backward's tensor-core
// kernels (the forward's and the decode's in kernels_bf16_forward.cu / kernels_bf16_decode.cu).
#include "ops/attention/launch.cuh"

namespace baracuda::attention::kernels {
BARACUDA_REGISTER(register_simt_kernels<DType::bf16>());
BARACUDA_REGISTER(register_backward_mma_kernels<DType::bf16>());
}  // namespace baracuda::attention::kernels
