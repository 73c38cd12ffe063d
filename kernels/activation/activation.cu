// CUDA SiLU·mul: grid (column blocks, rows); 8 bf16 per thread with 16-byte accesses when
// d % 8 == 0 and the pointers are aligned, one element per thread otherwise.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "kernels/activation/activation_cuda.h"
#include "kernels/cuda/device_utils.cuh"

namespace sluice::kernels {
namespace {

using cuda_detail::Aligned16;
using cuda_detail::LoadBf16x8;
using cuda_detail::StoreBf16x8;

constexpr int kThreads = 256;

__device__ __forceinline__ float SiluMul(float g, float u) { return g / (1.0f + expf(-g)) * u; }

__global__ void SiluMulVecKernel(const bf16* __restrict__ gate_up, bf16* __restrict__ out,
                                 int64_t d) {
  const int64_t i = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * 8;
  if (i >= d) return;
  const int64_t row = blockIdx.y;
  const bf16* g_row = gate_up + row * 2 * d;
  float g[8], u[8], o[8];
  LoadBf16x8(g_row + i, g);
  LoadBf16x8(g_row + d + i, u);
#pragma unroll
  for (int j = 0; j < 8; ++j) o[j] = SiluMul(g[j], u[j]);
  StoreBf16x8(out + row * d + i, o);
}

__global__ void SiluMulScalarKernel(const bf16* __restrict__ gate_up, bf16* __restrict__ out,
                                    int64_t d) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= d) return;
  const int64_t row = blockIdx.y;
  const bf16* g_row = gate_up + row * 2 * d;
  out[row * d + i] =
      __float2bfloat16_rn(SiluMul(__bfloat162float(g_row[i]), __bfloat162float(g_row[d + i])));
}

enum class Act { kGelu, kQuickGelu };

template <Act kAct>
__device__ __forceinline__ float Apply(float x) {
  if constexpr (kAct == Act::kGelu) {
    return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f));
  } else {
    return x / (1.0f + expf(-1.702f * x));
  }
}

// Elementwise over n values: 8 per thread (16-byte accesses) when vec, else one.
template <Act kAct, bool kVec>
__global__ void ActivationKernel(const bf16* x, bf16* out, int64_t n) {
  const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if constexpr (kVec) {
    const int64_t i = t * 8;
    if (i >= n) return;
    float v[8];
    LoadBf16x8(x + i, v);
#pragma unroll
    for (int j = 0; j < 8; ++j) v[j] = Apply<kAct>(v[j]);
    StoreBf16x8(out + i, v);
  } else {
    if (t >= n) return;
    out[t] = __float2bfloat16_rn(Apply<kAct>(__bfloat162float(x[t])));
  }
}

template <Act kAct>
absl::Status LaunchActivation(const bf16* x, bf16* out, int64_t n, cudaStream_t stream,
                              const char* what) {
  if (n < 0 || (n > 0 && (x == nullptr || out == nullptr))) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": bad arguments n=", n));
  }
  if (n == 0) return absl::OkStatus();
  const bool vec = n % 8 == 0 && Aligned16(x) && Aligned16(out);
  const int64_t threads = vec ? n / 8 : n;
  const int64_t blocks = (threads + kThreads - 1) / kThreads;
  if (blocks > 0x7fffffff) return absl::InvalidArgumentError(absl::StrCat(what, ": n too large"));
  if (vec) {
    ActivationKernel<kAct, true><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(x, out, n);
  } else {
    ActivationKernel<kAct, false><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(x, out, n);
  }
  return CudaLaunchStatus(what);
}

}  // namespace

absl::Status GeluCuda(const bf16* x, bf16* out, int64_t n, cudaStream_t stream) {
  return LaunchActivation<Act::kGelu>(x, out, n, stream, "GeluCuda");
}

absl::Status QuickGeluCuda(const bf16* x, bf16* out, int64_t n, cudaStream_t stream) {
  return LaunchActivation<Act::kQuickGelu>(x, out, n, stream, "QuickGeluCuda");
}

absl::Status SiluMulCuda(const bf16* gate_up, bf16* out, int64_t rows, int64_t d,
                         cudaStream_t stream) {
  if (d < 1 || rows < 0) {
    return absl::InvalidArgumentError(absl::StrCat("SiluMulCuda: bad shape rows=", rows, " d=", d));
  }
  if (rows == 0) return absl::OkStatus();
  if (rows > 65535) {
    // grid.y is limited to 65535: split the rows.
    for (int64_t r = 0; r < rows; r += 65535) {
      const int64_t n = std::min<int64_t>(65535, rows - r);
      absl::Status s = SiluMulCuda(gate_up + r * 2 * d, out + r * d, n, d, stream);
      if (!s.ok()) return s;
    }
    return absl::OkStatus();
  }
  const bool vec = d % 8 == 0 && Aligned16(gate_up) && Aligned16(out);
  const int64_t per_row = vec ? d / 8 : d;
  const dim3 grid(static_cast<unsigned>((per_row + kThreads - 1) / kThreads),
                  static_cast<unsigned>(rows));
  if (vec) {
    SiluMulVecKernel<<<grid, kThreads, 0, stream>>>(gate_up, out, d);
  } else {
    SiluMulScalarKernel<<<grid, kThreads, 0, stream>>>(gate_up, out, d);
  }
  return CudaLaunchStatus("SiluMulCuda launch");
}

}  // namespace sluice::kernels
