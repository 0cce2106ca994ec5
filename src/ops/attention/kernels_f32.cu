// The attention kernels instantiated for f32; f32_strict registers the same SIMT kernels (plain
// f32 FMA, never TF32), from this translation unit so they compile once.
#include "ops/attention/launch.cuh"

namespace baracuda::attention::kernels {
BARACUDA_REGISTER(register_simt_kernels<DType::f32>());
BARACUDA_REGISTER(register_simt_kernels<DType::f32_strict>());
}  // namespace baracuda::attention::kernels
