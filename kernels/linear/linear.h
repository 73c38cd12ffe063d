// Linear: y = x · Wᵀ (+ bias), the layout of torch.nn.Linear.
#ifndef SLUICE_KERNELS_LINEAR_LINEAR_H_
#define SLUICE_KERNELS_LINEAR_LINEAR_H_

#include <cstdint>

namespace sluice::kernels {

// LinearCpu computes y[m, n] = x[m, k] · w[n, k]ᵀ + bias[n] (bias may be null), float32,
// row-major, contiguous. Each y element is a dot product in a fixed summation order that does
// not depend on m, so a row's result is the same at every batch size (batch invariance).
// Parallel over n.
void LinearCpu(const float* x, const float* w, const float* bias, float* y, int64_t m, int64_t n,
               int64_t k);

}  // namespace sluice::kernels

#endif  // SLUICE_KERNELS_LINEAR_LINEAR_H_
