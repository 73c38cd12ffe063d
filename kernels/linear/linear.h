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

// LinearBf16Cpu is LinearCpu with w stored as bfloat16 (the upper 16 bits of each float32):
// weights are widened to float32 in registers and the arithmetic is LinearCpu's, so the result
// equals, bit for bit, LinearCpu on the float32 matrix holding the same values — half the weight
// bytes for a bandwidth-bound small-m GEMM.
void LinearBf16Cpu(const float* x, const uint16_t* w, const float* bias, float* y, int64_t m,
                   int64_t n, int64_t k);

// ToBf16 rounds float32 values to bfloat16 bits (round to nearest even; exact for values that
// came from a bfloat16 checkpoint). NaN stays NaN.
uint16_t ToBf16(float value);

}  // namespace sluice::kernels

#endif  // SLUICE_KERNELS_LINEAR_LINEAR_H_
