// CUDA RMSNorm: one block per row. Fast path (dim % 8 == 0, 16-byte aligned rows,
// dim <= kMaxVecs * 8 * 1024): each thread keeps up to kMaxVecs 8-element vectors in registers,
// so x (and the residual) are read once. Generic path: scalar loads, the row is read twice.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/device_utils.cuh"
#include "kernels/rms_norm/rms_norm_cuda.h"

namespace sluice::kernels {
namespace {

using cuda_detail::Aligned16;
using cuda_detail::BlockSum;
using cuda_detail::LoadBf16x8;
using cuda_detail::StoreBf16x8;

constexpr int kMaxVecs = 4;

__device__ __forceinline__ float RoundBf16(float v) {
  return __bfloat162float(__float2bfloat16_rn(v));
}

template <bool kAdd>
__global__ void __launch_bounds__(1024)
    RmsNormVecKernel(const bf16* x, int64_t x_stride, bf16* residual,
                     const bf16* __restrict__ weight, bf16* out, int64_t out_stride, int dim,
                     float eps) {
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x;
  const bf16* xr = x + row * x_stride;
  bf16* rr = kAdd ? residual + row * dim : nullptr;
  float v[kMaxVecs][8];
  float sumsq = 0.0f;
#pragma unroll
  for (int k = 0; k < kMaxVecs; ++k) {
    const int i = (threadIdx.x + k * blockDim.x) * 8;
    if (i < dim) {
      LoadBf16x8(xr + i, v[k]);
      if constexpr (kAdd) {
        float r[8];
        LoadBf16x8(rr + i, r);
#pragma unroll
        for (int j = 0; j < 8; ++j) v[k][j] = RoundBf16(r[j] + v[k][j]);
        StoreBf16x8(rr + i, v[k]);
      }
#pragma unroll
      for (int j = 0; j < 8; ++j) sumsq += v[k][j] * v[k][j];
    }
  }
  const float total = BlockSum(sumsq, scratch);
  const float inv = 1.0f / sqrtf(total / static_cast<float>(dim) + eps);
  bf16* orow = out + row * out_stride;
#pragma unroll
  for (int k = 0; k < kMaxVecs; ++k) {
    const int i = (threadIdx.x + k * blockDim.x) * 8;
    if (i < dim) {
      float w[8];
      LoadBf16x8(weight + i, w);
#pragma unroll
      for (int j = 0; j < 8; ++j) v[k][j] = v[k][j] * inv * w[j];
      StoreBf16x8(orow + i, v[k]);
    }
  }
}

template <bool kAdd>
__global__ void __launch_bounds__(1024)
    RmsNormScalarKernel(const bf16* x, int64_t x_stride, bf16* residual,
                        const bf16* __restrict__ weight, bf16* out, int64_t out_stride, int64_t dim,
                        float eps) {
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x;
  const bf16* xr = x + row * x_stride;
  bf16* rr = kAdd ? residual + row * dim : nullptr;
  float sumsq = 0.0f;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
    float v = __bfloat162float(xr[i]);
    if constexpr (kAdd) {
      v = RoundBf16(__bfloat162float(rr[i]) + v);
      rr[i] = __float2bfloat16_rn(v);
    }
    sumsq += v * v;
  }
  const float total = BlockSum(sumsq, scratch);
  const float inv = 1.0f / sqrtf(total / static_cast<float>(dim) + eps);
  const bf16* src = kAdd ? rr : xr;
  bf16* orow = out + row * out_stride;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
    orow[i] = __float2bfloat16_rn(__bfloat162float(src[i]) * inv * __bfloat162float(weight[i]));
  }
}

template <bool kAdd>
absl::Status Launch(const bf16* x, int64_t x_stride, bf16* residual, const bf16* weight, bf16* out,
                    int64_t out_stride, int64_t rows, int64_t dim, float eps, cudaStream_t stream) {
  if (dim < 1 || rows < 0 || x_stride < dim || out_stride < dim) {
    return absl::InvalidArgumentError(absl::StrCat("RmsNormCuda: bad shape rows=", rows,
                                                   " dim=", dim, " x_stride=", x_stride,
                                                   " out_stride=", out_stride));
  }
  if (rows == 0) return absl::OkStatus();
  if (rows > 0x7fffffff) return absl::InvalidArgumentError("RmsNormCuda: rows >= 2^31");
  const int64_t vecs = dim / 8;
  const bool vec = dim % 8 == 0 && x_stride % 8 == 0 && out_stride % 8 == 0 &&
                   vecs <= int64_t{kMaxVecs} * 1024 && Aligned16(x) && Aligned16(weight) &&
                   Aligned16(out) && (!kAdd || Aligned16(residual));
  if (vec) {
    // kMaxVecs vectors per thread (independent 16-byte loads in flight), fewer on short rows.
    const int threads =
        static_cast<int>(std::clamp<int64_t>((vecs + kMaxVecs - 1) / kMaxVecs, 32, 1024) + 31) /
        32 * 32;
    RmsNormVecKernel<kAdd><<<static_cast<unsigned>(rows), threads, 0, stream>>>(
        x, x_stride, residual, weight, out, out_stride, static_cast<int>(dim), eps);
  } else {
    const int threads = static_cast<int>(std::min<int64_t>(1024, (dim + 31) / 32 * 32));
    RmsNormScalarKernel<kAdd><<<static_cast<unsigned>(rows), threads, 0, stream>>>(
        x, x_stride, residual, weight, out, out_stride, dim, eps);
  }
  return CudaLaunchStatus("RmsNormCuda launch");
}

}  // namespace

absl::Status RmsNormCuda(const bf16* x, int64_t x_stride, const bf16* weight, bf16* out,
                         int64_t out_stride, int64_t rows, int64_t dim, float eps,
                         cudaStream_t stream) {
  return Launch<false>(x, x_stride, nullptr, weight, out, out_stride, rows, dim, eps, stream);
}

absl::Status AddRmsNormCuda(const bf16* x, bf16* residual, const bf16* weight, bf16* out,
                            int64_t rows, int64_t dim, float eps, cudaStream_t stream) {
  return Launch<true>(x, dim, residual, weight, out, dim, rows, dim, eps, stream);
}

}  // namespace sluice::kernels
