// CUDA RMSNorm: one block per row. Fast path (dim % 8 == 0, 16-byte aligned rows,
// dim <= kMaxVecs * 8 * 1024): each thread keeps up to kMaxVecs 8-element vectors of the row in
// registers (packed bf16), so the row is read once. Generic path: scalar
// loads, the row is read twice.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/device_utils.cuh"
#include "kernels/cuda/pdl.cuh"
#include "kernels/rms_norm/rms_norm_cuda.h"

namespace sluice::kernels {
namespace {

using cuda_detail::Aligned16;
using cuda_detail::Bf16x8;
using cuda_detail::BlockSum;
using cuda_detail::LoadVec;
using cuda_detail::StoreBf16x8;
using cuda_detail::StoreVec;
using cuda_detail::ToBf16x8;
using cuda_detail::ToFloat8;

constexpr int kMaxVecs = 4;  // largest vectors-per-thread variant
// Vectors per thread tried first; doubled (up to kMaxVecs) while a row needs > 1024 threads.
// Measured on an H200 (32768 × 8192 rows, cuda_kernel_bench): 1 → 56% of copy bandwidth for
// RMSNorm / 81% fused with the add, 2 → 74% / 92%, 4 → 74% / 90%.
constexpr int kDefaultVecsPerThread = 2;

__device__ __forceinline__ float RoundBf16(float v) {
  return __bfloat162float(__float2bfloat16_rn(v));
}

template <bool kAdd, int kVecs>
__global__ void __launch_bounds__(1024)
    RmsNormVecKernel(const bf16* x, int64_t x_stride, bf16* residual,
                     const bf16* __restrict__ weight, bf16* out, int64_t out_stride, int dim,
                     float eps) {
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x;
  const bf16* xr = x + row * x_stride;
  bf16* rr = kAdd ? residual + row * dim : nullptr;
  // The row (after the residual add) stays in registers as packed bf16 (4 registers a vector).
  // Every load (x, residual and weight) is issued before any store or the block reduction: at
  // one row per step (decode) the kernel is a chain of dependent round trips, and a store to
  // the residual (which the compiler cannot prove disjoint from the next x load) or a weight
  // load after the reduction each added one. At 4 vectors a thread the early weight would
  // spill (64 registers at 1024 threads), so those long rows load it after the reduction.
  constexpr bool kEarlyWeight = kVecs <= 2;
  // Programmatic dependent launch (pdl.cuh; no-ops in a normal launch): the next kernel may
  // launch once every block has started; the weight (never written by a step) is read before
  // the wait, x and the residual (the previous kernel's outputs) after it.
  cuda_detail::LaunchDependents();
  Bf16x8 xv[kVecs], wv[kVecs], rv[kVecs];
  if constexpr (kEarlyWeight) {
#pragma unroll
    for (int k = 0; k < kVecs; ++k) {
      const int i = (threadIdx.x + k * blockDim.x) * 8;
      if (i < dim) wv[k] = LoadVec(weight + i);
    }
  }
  cuda_detail::GridDependencyWait();
#pragma unroll
  for (int k = 0; k < kVecs; ++k) {
    const int i = (threadIdx.x + k * blockDim.x) * 8;
    if (i < dim) {
      xv[k] = LoadVec(xr + i);
      if constexpr (kAdd) rv[k] = LoadVec(rr + i);
    }
  }
  float sumsq = 0.0f;
#pragma unroll
  for (int k = 0; k < kVecs; ++k) {
    const int i = (threadIdx.x + k * blockDim.x) * 8;
    if (i < dim) {
      float v[8];
      ToFloat8(xv[k], v);
      if constexpr (kAdd) {
        float r[8];
        ToFloat8(rv[k], r);
#pragma unroll
        for (int j = 0; j < 8; ++j) v[j] = r[j] + v[j];
        xv[k] = ToBf16x8(v);  // the rounded residual, which the norm reads
        StoreVec(rr + i, xv[k]);
        ToFloat8(xv[k], v);
      }
#pragma unroll
      for (int j = 0; j < 8; ++j) sumsq += v[j] * v[j];
    }
  }
  const float total = BlockSum(sumsq, scratch);
  const float inv = 1.0f / sqrtf(total / static_cast<float>(dim) + eps);
  bf16* orow = out + row * out_stride;
#pragma unroll
  for (int k = 0; k < kVecs; ++k) {
    const int i = (threadIdx.x + k * blockDim.x) * 8;
    if (i < dim) {
      float v[8], w[8];
      ToFloat8(xv[k], v);
      ToFloat8(kEarlyWeight ? wv[k] : LoadVec(weight + i), w);
#pragma unroll
      for (int j = 0; j < 8; ++j) v[j] = v[j] * inv * w[j];
      StoreBf16x8(orow + i, v);
    }
  }
}

template <bool kAdd>
__global__ void __launch_bounds__(1024)
    RmsNormScalarKernel(const bf16* x, int64_t x_stride, bf16* residual,
                        const bf16* __restrict__ weight, bf16* out, int64_t out_stride, int64_t dim,
                        float eps) {
  __shared__ float scratch[32];
  cuda_detail::LaunchDependents();  // PDL (pdl.cuh); no-ops in a normal launch
  cuda_detail::GridDependencyWait();
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
                    int64_t out_stride, int64_t rows, int64_t dim, float eps, int vecs_per_thread,
                    cudaStream_t stream, bool pdl) {
  if (dim < 1 || rows < 0 || x_stride < dim || out_stride < dim) {
    return absl::InvalidArgumentError(absl::StrCat("RmsNormCuda: bad shape rows=", rows,
                                                   " dim=", dim, " x_stride=", x_stride,
                                                   " out_stride=", out_stride));
  }
  if (vecs_per_thread != 0 && vecs_per_thread != 1 && vecs_per_thread != 2 &&
      vecs_per_thread != 4) {
    return absl::InvalidArgumentError(
        absl::StrCat("RmsNormCuda: vecs_per_thread must be 0, 1, 2 or 4, got ", vecs_per_thread));
  }
  if (rows == 0) return absl::OkStatus();
  if (rows > 0x7fffffff) return absl::InvalidArgumentError("RmsNormCuda: rows >= 2^31");
  const int64_t vecs = dim / 8;
  if (vecs_per_thread == 0) {
    vecs_per_thread = kDefaultVecsPerThread;
    while (vecs_per_thread < kMaxVecs && vecs > int64_t{vecs_per_thread} * 1024) {
      vecs_per_thread *= 2;
    }
  }
  const bool vec = dim % 8 == 0 && x_stride % 8 == 0 && out_stride % 8 == 0 &&
                   vecs <= int64_t{vecs_per_thread} * 1024 && Aligned16(x) && Aligned16(weight) &&
                   Aligned16(out) && (!kAdd || Aligned16(residual));
  const unsigned grid = static_cast<unsigned>(rows);
  // As a programmatic dependent of the kernel before (`pdl`) both kernels wait.
  if (vec) {
    // vecs_per_thread independent 16-byte loads in flight per thread; fewer threads on short rows.
    const int threads = static_cast<int>(
        (std::clamp<int64_t>((vecs + vecs_per_thread - 1) / vecs_per_thread, 32, 1024) + 31) / 32 *
        32);
    const int d = static_cast<int>(dim);
    auto kernel = vecs_per_thread == 1   ? &RmsNormVecKernel<kAdd, 1>
                  : vecs_per_thread == 2 ? &RmsNormVecKernel<kAdd, 2>
                                         : &RmsNormVecKernel<kAdd, 4>;
    // Errors surface through CudaLaunchStatus below (the runtime records them).
    (void)cuda_detail::LaunchKernelMaybePdl(kernel, dim3(grid), dim3(threads), 0, stream, pdl, x,
                                            x_stride, residual, weight, out, out_stride, d, eps);
  } else {
    const int threads = static_cast<int>(std::min<int64_t>(1024, (dim + 31) / 32 * 32));
    (void)cuda_detail::LaunchKernelMaybePdl(&RmsNormScalarKernel<kAdd>, dim3(grid), dim3(threads),
                                            0, stream, pdl, x, x_stride, residual, weight, out,
                                            out_stride, dim, eps);
  }
  return CudaLaunchStatus("RmsNormCuda launch");
}

}  // namespace

absl::Status RmsNormCuda(const bf16* x, int64_t x_stride, const bf16* weight, bf16* out,
                         int64_t out_stride, int64_t rows, int64_t dim, float eps,
                         cudaStream_t stream, bool pdl) {
  return Launch<false>(x, x_stride, nullptr, weight, out, out_stride, rows, dim, eps, 0, stream,
                       pdl);
}

absl::Status RmsNormCudaTuned(const bf16* x, int64_t x_stride, bf16* residual, const bf16* weight,
                              bf16* out, int64_t out_stride, int64_t rows, int64_t dim, float eps,
                              int vecs_per_thread, cudaStream_t stream, bool pdl) {
  if (residual != nullptr) {
    if (x_stride != dim || out_stride != dim) {
      return absl::InvalidArgumentError("RmsNormCudaTuned: the residual form is contiguous only");
    }
    return Launch<true>(x, dim, residual, weight, out, dim, rows, dim, eps, vecs_per_thread,
                        stream, pdl);
  }
  return Launch<false>(x, x_stride, nullptr, weight, out, out_stride, rows, dim, eps,
                       vecs_per_thread, stream, pdl);
}

absl::Status AddRmsNormCuda(const bf16* x, bf16* residual, const bf16* weight, bf16* out,
                            int64_t rows, int64_t dim, float eps, cudaStream_t stream, bool pdl) {
  return Launch<true>(x, dim, residual, weight, out, dim, rows, dim, eps, 0, stream, pdl);
}

}  // namespace sluice::kernels
