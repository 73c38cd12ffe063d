// CUDA LayerNorm for the ViT encoders (CLIP's vision tower): a float32 residual stream, fp32
// math, bf16 or float32 output. Same formula as layer_norm.h's CPU reference (which
// accumulates in float64; here the row's mean and then its centered sum of squares are fp32
// block sums in a fixed order, so results are deterministic and do not depend on `rows`).
// Launcher conventions: kernels/cuda/cuda_common.h.
#ifndef SLUICE_KERNELS_LAYER_NORM_LAYER_NORM_CUDA_H_
#define SLUICE_KERNELS_LAYER_NORM_LAYER_NORM_CUDA_H_

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda/cuda_common.h"

namespace sluice::kernels {

// LayerNormCuda: out[r, :] = (x[r, :] − mean) / sqrt(var + eps) · weight + bias (biased
// variance), x and out [rows, dim] float32 contiguous (out may alias x: CLIP's pre_layrnorm
// rewrites the embeddings in place); weight, bias [dim] float32 (bias may be null).
// Errors: InvalidArgument for dim < 1, rows < 0 or null pointers; Internal for launch errors.
absl::Status LayerNormCuda(const float* x, const float* weight, const float* bias, float* out,
                           int64_t rows, int64_t dim, float eps, cudaStream_t stream);

// AddLayerNormCuda: the pre-norm residual step (AddLayerNormCpu): h[r, :] += float(delta[r, :])
// in fp32 (delta null: no add), then, when out is not null, out = bf16(LayerNorm(h)) as above.
// h [rows, dim] float32 (updated in place), delta and out [rows, dim] bf16, weight/bias [dim]
// float32 (ignored when out is null; bias may be null). out must not overlap h or delta.
// Errors: InvalidArgument for dim < 1, rows < 0, a null h, or a null weight with out;
// Internal for launch errors.
absl::Status AddLayerNormCuda(float* h, const bf16* delta, const float* weight,
                              const float* bias, bf16* out, int64_t rows, int64_t dim, float eps,
                              cudaStream_t stream);

}  // namespace sluice::kernels

#endif  // SLUICE_KERNELS_LAYER_NORM_LAYER_NORM_CUDA_H_
