// Gated activations of LLaMA-style MLPs.
#ifndef SLUICE_KERNELS_ACTIVATION_ACTIVATION_H_
#define SLUICE_KERNELS_ACTIVATION_ACTIVATION_H_

#include <cstdint>

namespace sluice::kernels {

// SiluMulCpu: out[r, i] = silu(gate_up[r, i]) * gate_up[r, d + i] for i < d, where gate_up is
// [rows, 2d] (gate then up, concatenated) and out is [rows, d]. silu(x) = x / (1 + e^-x).
void SiluMulCpu(const float* gate_up, float* out, int64_t rows, int64_t d);

}  // namespace sluice::kernels

#endif  // SLUICE_KERNELS_ACTIVATION_ACTIVATION_H_
