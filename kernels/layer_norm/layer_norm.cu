// CUDA LayerNorm: one block per row; the row is read three times (sum, centered sum of squares,
// output), from L1/L2 after the first pass — ViT rows are 1–2 K floats.
#include "absl/strings/str_cat.h"
#include "kernels/cuda/device_utils.cuh"
#include "kernels/layer_norm/layer_norm_cuda.h"

namespace sluice::kernels {
namespace {

using cuda_detail::BlockSum;

constexpr int kThreads = 256;

__device__ __forceinline__ void Store(float* p, float v) { *p = v; }
__device__ __forceinline__ void Store(bf16* p, float v) { *p = __float2bfloat16_rn(v); }

// h[row] += delta[row] (kAdd), then out = LN(h[row]) when out is not null. Each thread touches
// the same indices in every pass, so its own writes are what it reads back.
template <bool kAdd, typename Out>
__global__ void __launch_bounds__(kThreads)
    LayerNormKernel(float* h, const bf16* __restrict__ delta, const float* __restrict__ weight,
                    const float* __restrict__ bias, Out* out, int dim, float eps) {
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x;
  float* hr = h + row * dim;
  float sum = 0.0f;
  for (int i = threadIdx.x; i < dim; i += kThreads) {
    float v = hr[i];
    if constexpr (kAdd) {
      v += __bfloat162float(delta[row * dim + i]);
      hr[i] = v;
    }
    sum += v;
  }
  if (out == nullptr) return;  // uniform across the block: the add alone
  const float mean = BlockSum(sum, scratch) / static_cast<float>(dim);
  float sq = 0.0f;
  for (int i = threadIdx.x; i < dim; i += kThreads) {
    const float d = hr[i] - mean;
    sq += d * d;
  }
  const float inv = rsqrtf(BlockSum(sq, scratch) / static_cast<float>(dim) + eps);
  Out* o = out + row * dim;
  for (int i = threadIdx.x; i < dim; i += kThreads) {
    const float b = bias != nullptr ? bias[i] : 0.0f;
    Store(o + i, (hr[i] - mean) * inv * weight[i] + b);
  }
}

}  // namespace

absl::Status LayerNormCuda(const float* x, const float* weight, const float* bias, float* out,
                           int64_t rows, int64_t dim, float eps, cudaStream_t stream) {
  if (dim < 1 || dim > (int64_t{1} << 30) || rows < 0 || x == nullptr || weight == nullptr ||
      out == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("LayerNormCuda: bad arguments rows=", rows, " dim=", dim));
  }
  if (rows == 0) return absl::OkStatus();
  // In place (out == x) is safe: each element is read before it is written, by one thread.
  LayerNormKernel<false, float><<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(
      const_cast<float*>(x), nullptr, weight, bias, out, static_cast<int>(dim), eps);
  return CudaLaunchStatus("LayerNormCuda");
}

absl::Status AddLayerNormCuda(float* h, const bf16* delta, const float* weight,
                              const float* bias, bf16* out, int64_t rows, int64_t dim, float eps,
                              cudaStream_t stream) {
  if (dim < 1 || dim > (int64_t{1} << 30) || rows < 0 || h == nullptr ||
      (out != nullptr && weight == nullptr)) {
    return absl::InvalidArgumentError(
        absl::StrCat("AddLayerNormCuda: bad arguments rows=", rows, " dim=", dim));
  }
  if (rows == 0 || (delta == nullptr && out == nullptr)) return absl::OkStatus();
  const unsigned grid = static_cast<unsigned>(rows);
  if (delta != nullptr) {
    LayerNormKernel<true, bf16><<<grid, kThreads, 0, stream>>>(h, delta, weight, bias, out,
                                                               static_cast<int>(dim), eps);
  } else {
    LayerNormKernel<false, bf16><<<grid, kThreads, 0, stream>>>(h, nullptr, weight, bias, out,
                                                                static_cast<int>(dim), eps);
  }
  return CudaLaunchStatus("AddLayerNormCuda");
}

}  // namespace sluice::kernels
