// LayerNorm ("Layer Normalization", Ba, Kiros & Hinton 2016), as torch.nn.LayerNorm: biased
// variance over the last dimension, affine weight and bias. Used by the CLIP vision tower.
#ifndef SLUICE_KERNELS_LAYER_NORM_LAYER_NORM_H_
#define SLUICE_KERNELS_LAYER_NORM_LAYER_NORM_H_

#include <cstdint>

namespace sluice::kernels {

// LayerNormCpu: out[r, :] = (x[r, :] − mean) / sqrt(var + eps) · weight + bias for r < rows,
// mean and var (biased) over the row's `dim` values, accumulated in float64 in index order.
// x, out: [rows, dim] contiguous float32; weight, bias: [dim] (bias may be null). out may alias
// x. Parallel over rows.
void LayerNormCpu(const float* x, const float* weight, const float* bias, float* out,
                  int64_t rows, int64_t dim, float eps);

// AddLayerNormCpu: the pre-norm transformer's residual step, the reference of AddLayerNormCuda:
// h[r, :] += delta[r, :] (float32 adds; delta may be null: no add), then, when out is not
// null, out = LayerNormCpu(h). h, delta, out: [rows, dim] contiguous; out must not alias h.
void AddLayerNormCpu(float* h, const float* delta, const float* weight, const float* bias,
                     float* out, int64_t rows, int64_t dim, float eps);

}  // namespace sluice::kernels

#endif  // SLUICE_KERNELS_LAYER_NORM_LAYER_NORM_H_
