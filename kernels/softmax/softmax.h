// Row softmax of attention scores, for attention computed as GEMM → softmax → GEMM over dense
// (non-paged) sequences: the non-causal self-attention of ViT encoders.
#ifndef SLUICE_KERNELS_SOFTMAX_SOFTMAX_H_
#define SLUICE_KERNELS_SOFTMAX_SOFTMAX_H_

#include <cstdint>

namespace sluice::kernels {

// ScaledSoftmaxRowsCpu: out[r, j] = exp(scale·x[r, j] − m_r) / Σ_l exp(scale·x[r, l] − m_r),
// m_r = max_l scale·x[r, l], for r < rows, j < n; float32, x and out [rows, n] contiguous (out
// may alias x). The max, then the sum in increasing j, in float32.
void ScaledSoftmaxRowsCpu(const float* x, int64_t rows, int64_t n, float scale, float* out);

}  // namespace sluice::kernels

#endif  // SLUICE_KERNELS_SOFTMAX_SOFTMAX_H_
