// Gated activations of LLaMA-style MLPs.
#ifndef SLUICE_KERNELS_ACTIVATION_ACTIVATION_H_
#define SLUICE_KERNELS_ACTIVATION_ACTIVATION_H_

#include <cstdint>

namespace sluice::kernels {

// SiluMulCpu: out[r, i] = silu(gate_up[r, i]) * gate_up[r, d + i] for i < d, where gate_up is
// [rows, 2d] (gate then up, concatenated) and out is [rows, d]. silu(x) = x / (1 + e^-x).
void SiluMulCpu(const float* gate_up, float* out, int64_t rows, int64_t d);

// GeluCpu: out[i] = x[i] · Φ(x[i]) = 0.5 · x · (1 + erf(x / √2)) for i < n, the exact GELU
// ("Gaussian Error Linear Units", Hendrycks & Gimpel 2016; torch's gelu, approximate="none").
// out may alias x.
void GeluCpu(const float* x, float* out, int64_t n);

// QuickGeluCpu: out[i] = x · sigmoid(1.702 · x), the GELU approximation of OpenAI's CLIP
// (transformers' QuickGELUActivation). out may alias x.
void QuickGeluCpu(const float* x, float* out, int64_t n);

}  // namespace sluice::kernels

#endif  // SLUICE_KERNELS_ACTIVATION_ACTIVATION_H_
