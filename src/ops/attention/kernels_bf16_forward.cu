// The attention forward's tensor-core kernels instantiated for bf16 (its launch shapes and the
// paged form).
#include "ops/attention/launch.cuh"

namespace baracuda::attention::kernels {
BARACUDA_REGISTER(register_forward_mma_kernels<DType::bf16>());
}  // namespace baracuda::attention::kernels
