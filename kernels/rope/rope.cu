// CUDA RoPE: one block per token; each thread owns one rotation pair (i, i + half) of one head
// and a block sweeps `heads_per_pass` heads at a time. In the interleaved layout a pair's
// outputs land where other threads' inputs were, so every thread reads its pair before a
// barrier and writes after it.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "kernels/rope/rope_cuda.h"

namespace sluice::kernels {
namespace {

constexpr int kTargetThreads = 256;

template <bool kInterleave>
__global__ void __launch_bounds__(1024)
    RopeKernel(bf16* x, int64_t num_heads, int64_t token_stride, int64_t head_stride,
               int64_t offset, const int32_t* __restrict__ positions,
               const float* __restrict__ inv_freq, int half, int heads_per_pass, float scaling) {
  const int64_t t = blockIdx.x;
  const int i = threadIdx.x % half;
  const int head_in_pass = threadIdx.x / half;
  const float angle = static_cast<float>(positions[t]) * inv_freq[i];
  float s, c;
  sincosf(angle, &s, &c);
  c *= scaling;
  s *= scaling;
  bf16* token = x + t * token_stride + offset;
  for (int64_t h0 = 0; h0 < num_heads; h0 += heads_per_pass) {
    const int64_t h = h0 + head_in_pass;
    const bool active = h < num_heads;
    bf16* v = token + h * head_stride;
    float x1 = 0.0f, x2 = 0.0f;
    if (active) {
      x1 = __bfloat162float(kInterleave ? v[2 * i] : v[i]);
      x2 = __bfloat162float(kInterleave ? v[2 * i + 1] : v[i + half]);
    }
    if constexpr (kInterleave) __syncthreads();
    if (active) {
      v[i] = __float2bfloat16_rn(x1 * c - x2 * s);
      v[i + half] = __float2bfloat16_rn(x2 * c + x1 * s);
    }
    if constexpr (kInterleave) __syncthreads();
  }
}

}  // namespace

absl::StatusOr<DeviceRopeTable> UploadRopeTable(const RopeTable& table) {
  const size_t half = table.inv_freq.size();
  if (half == 0 || half > 1024) {
    return absl::InvalidArgumentError(
        absl::StrCat("UploadRopeTable: rotary_dim / 2 must be in [1, 1024], got ", half));
  }
  DeviceRopeTable out;
  auto buffer = DeviceBuffer<float>::Create(half);
  if (!buffer.ok()) return buffer.status();
  out.inv_freq = *std::move(buffer);
  absl::Status s = out.inv_freq.CopyFromHost(table.inv_freq.data());
  if (!s.ok()) return s;
  out.rotary_dim = static_cast<int64_t>(2 * half);
  out.attention_scaling = table.attention_scaling;
  return out;
}

absl::Status RopeCuda(bf16* x, int64_t num_tokens, int64_t num_heads, int64_t token_stride,
                      int64_t head_stride, int64_t offset, const int32_t* positions,
                      const DeviceRopeTable& table, bool interleave, cudaStream_t stream) {
  const int64_t half = table.rotary_dim / 2;
  if (num_tokens < 0 || num_tokens > 0x7fffffff || num_heads < 0 || offset < 0 || half < 1 ||
      half > 1024 || table.inv_freq.size() != static_cast<size_t>(half)) {
    return absl::InvalidArgumentError(
        absl::StrCat("RopeCuda: bad arguments num_tokens=", num_tokens, " num_heads=", num_heads,
                     " offset=", offset, " rotary_dim=", table.rotary_dim));
  }
  if (num_tokens == 0 || num_heads == 0) return absl::OkStatus();
  const int64_t heads_per_pass = std::clamp<int64_t>(kTargetThreads / half, 1, num_heads);
  const int threads = static_cast<int>(heads_per_pass * half);
  const unsigned grid = static_cast<unsigned>(num_tokens);
  if (interleave) {
    RopeKernel<true><<<grid, threads, 0, stream>>>(
        x, num_heads, token_stride, head_stride, offset, positions, table.inv_freq.data(),
        static_cast<int>(half), static_cast<int>(heads_per_pass), table.attention_scaling);
  } else {
    RopeKernel<false><<<grid, threads, 0, stream>>>(
        x, num_heads, token_stride, head_stride, offset, positions, table.inv_freq.data(),
        static_cast<int>(half), static_cast<int>(heads_per_pass), table.attention_scaling);
  }
  return CudaLaunchStatus("RopeCuda launch");
}

}  // namespace sluice::kernels
