#include "engine/cuda/deepseek_kernels.h"

#include <algorithm>

namespace sluice::cuda_runner {
namespace {

constexpr int kThreads = 256;

__global__ void CopyHeadsKernel(const bf16* src, HeadSpans s, bf16* dst, HeadSpans d,
                                int64_t num_heads, int64_t width, int64_t total) {
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < total;
       e += int64_t{gridDim.x} * blockDim.x) {
    const int64_t i = e % width;
    const int64_t th = e / width;
    const int64_t h = th % num_heads;
    const int64_t t = th / num_heads;
    dst[t * d.token_stride + h * d.head_stride + i] =
        src[t * s.token_stride + h * s.head_stride + i];
  }
}

__global__ void AddInPlaceKernel(bf16* y, const bf16* x, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    y[i] = __float2bfloat16(__bfloat162float(y[i]) + __bfloat162float(x[i]));
  }
}

int Blocks(int64_t total) {
  return static_cast<int>(std::min<int64_t>((total + kThreads - 1) / kThreads, 65535));
}

}  // namespace

absl::Status CopyHeadsCuda(const bf16* src, HeadSpans src_spans, bf16* dst, HeadSpans dst_spans,
                           int64_t num_tokens, int64_t num_heads, int64_t width,
                           cudaStream_t stream) {
  if (num_tokens < 0 || num_heads < 0 || width < 0) {
    return absl::InvalidArgumentError("CopyHeadsCuda: negative size");
  }
  const int64_t total = num_tokens * num_heads * width;
  if (total == 0) return absl::OkStatus();
  CopyHeadsKernel<<<Blocks(total), kThreads, 0, stream>>>(src, src_spans, dst, dst_spans,
                                                          num_heads, width, total);
  return kernels::CudaLaunchStatus("CopyHeadsKernel");
}

absl::Status AddInPlaceCuda(bf16* y, const bf16* x, int64_t n, cudaStream_t stream) {
  if (n < 0) return absl::InvalidArgumentError("AddInPlaceCuda: n < 0");
  if (n == 0) return absl::OkStatus();
  AddInPlaceKernel<<<Blocks(n), kThreads, 0, stream>>>(y, x, n);
  return kernels::CudaLaunchStatus("AddInPlaceKernel");
}

}  // namespace sluice::cuda_runner
