// CUDA row softmax: one block of 128 threads per row; the row (ViT: ≤ 1 K scores) is read from
// global memory for the max and re-read (L1/L2) for the sum and the output.
#include "absl/strings/str_cat.h"
#include "kernels/cuda/device_utils.cuh"
#include "kernels/softmax/softmax_cuda.h"

namespace sluice::kernels {
namespace {

using cuda_detail::BlockSum;

constexpr int kThreads = 128;

// BlockMax: the block's maximum to every thread; scratch: 32 floats of shared memory.
__device__ __forceinline__ float BlockMax(float v, float* scratch) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float m = lane < (kThreads >> 5) ? scratch[lane] : -INFINITY;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  __syncthreads();
  return m;
}

__global__ void __launch_bounds__(kThreads)
    ScaledSoftmaxKernel(const float* __restrict__ x, int64_t n, float scale,
                        bf16* __restrict__ out) {
  __shared__ float scratch[32];
  const float* xr = x + static_cast<int64_t>(blockIdx.x) * n;
  bf16* o = out + static_cast<int64_t>(blockIdx.x) * n;
  float m = -INFINITY;
  for (int64_t j = threadIdx.x; j < n; j += kThreads) m = fmaxf(m, scale * xr[j]);
  m = BlockMax(m, scratch);
  float sum = 0.0f;
  for (int64_t j = threadIdx.x; j < n; j += kThreads) sum += __expf(scale * xr[j] - m);
  const float inv = 1.0f / BlockSum(sum, scratch);
  for (int64_t j = threadIdx.x; j < n; j += kThreads) {
    o[j] = __float2bfloat16_rn(__expf(scale * xr[j] - m) * inv);
  }
}

}  // namespace

absl::Status ScaledSoftmaxRowsCuda(const float* x, int64_t rows, int64_t n, float scale,
                                   bf16* out, cudaStream_t stream) {
  if (n < 1 || rows < 0 || rows > 0x7fffffff || x == nullptr || out == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("ScaledSoftmaxRowsCuda: bad arguments rows=", rows, " n=", n));
  }
  if (rows == 0) return absl::OkStatus();
  ScaledSoftmaxKernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(x, n, scale, out);
  return CudaLaunchStatus("ScaledSoftmaxRowsCuda");
}

}  // namespace sluice::kernels
