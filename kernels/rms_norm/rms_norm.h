// RMSNorm ("Root Mean Square Layer Normalization", Zhang & Sennrich 2019), optionally fused
// with the residual add that precedes it in pre-norm transformers.
#ifndef SLUICE_KERNELS_RMS_NORM_RMS_NORM_H_
#define SLUICE_KERNELS_RMS_NORM_RMS_NORM_H_

#include <cstdint>

namespace sluice::kernels {

// RmsNormCpu: out[r, :] = x[r, :] / sqrt(mean(x[r, :]²) + eps) * weight[:], for r < rows.
// x, out: [rows, dim] with row strides x_stride / out_stride (floats); weight: [dim]. float32.
// out may alias x.
void RmsNormCpu(const float* x, int64_t x_stride, const float* weight, float* out,
                int64_t out_stride, int64_t rows, int64_t dim, float eps);

// AddRmsNormCpu: residual += x; out = RmsNorm(residual). All [rows, dim] contiguous.
void AddRmsNormCpu(const float* x, float* residual, const float* weight, float* out,
                   int64_t rows, int64_t dim, float eps);

}  // namespace sluice::kernels

#endif  // SLUICE_KERNELS_RMS_NORM_RMS_NORM_H_
