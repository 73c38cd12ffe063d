// CUDA embedding gather: one block per token; 16-byte copies when dim % 8 == 0 and the table
// and output are 16-byte aligned. EmbeddingFeedbackCuda also resolves fed-back token ids.
// ScatterRowsCuda: the inverse direction, one block per given row (fp32 in, bf16 out).
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/device_utils.cuh"
#include "kernels/cuda/pdl.cuh"
#include "kernels/embedding/embedding_cuda.h"

namespace sluice::kernels {
namespace {

using cuda_detail::Aligned16;
using cuda_detail::Bf16x8;
using cuda_detail::LoadVec;
using cuda_detail::StoreVec;

constexpr int kThreads = 128;     // scalar path
constexpr int kMaxThreads = 1024;  // vector path: one vector per thread up to dim 8192

// One block per token. With `feedback`, a negative ids[t] = -(r + 1) stands for feedback[r]
// (ResolveTokenIdsCuda's rule, fused here so a decode step saves a launch): every thread
// resolves it from the original id, and after a barrier thread 0 writes the resolved id back.
template <bool kVec>
__global__ void EmbeddingKernel(const bf16* __restrict__ table, int64_t vocab_size, int64_t dim,
                                int32_t* ids, const int32_t* __restrict__ feedback,
                                bf16* __restrict__ out, int32_t* bad_index) {
  // Programmatic dependent launch (`pdl`, pdl.cuh; no-ops in a normal launch):
  // ids / feedback come from earlier work and `out` may still be read by an earlier kernel.
  cuda_detail::LaunchDependents();
  cuda_detail::GridDependencyWait();
  const int64_t t = blockIdx.x;
  int32_t id = ids[t];
  if (feedback != nullptr && id < 0) {
    id = feedback[-static_cast<int64_t>(id) - 1];
    __syncthreads();  // (uniform: id < 0 holds for the whole block) all read the original
    if (threadIdx.x == 0) ids[t] = id;
  }
  const bool valid = id >= 0 && id < vocab_size;
  if (!valid && bad_index != nullptr && threadIdx.x == 0)
    atomicMin(bad_index, static_cast<int32_t>(t));
  bf16* dst = out + t * dim;
  const bf16* src = table + (valid ? static_cast<int64_t>(id) : 0) * dim;
  if constexpr (kVec) {
    const int64_t vecs = dim / 8;
    for (int64_t i = threadIdx.x; i < vecs; i += blockDim.x) {
      Bf16x8 v;
      if (valid) {
        v = LoadVec(src + i * 8);
      } else {
        for (auto& h : v.h) h = __floats2bfloat162_rn(0.0f, 0.0f);
      }
      StoreVec(dst + i * 8, v);
    }
  } else {
    for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
      dst[i] = valid ? src[i] : __float2bfloat16_rn(0.0f);
    }
  }
}

absl::Status Launch(const bf16* table, int64_t vocab_size, int64_t dim, int32_t* ids,
                    const int32_t* feedback, int64_t num_tokens, bf16* out, int32_t* bad_index,
                    cudaStream_t stream, bool pdl) {
  if (vocab_size < 1 || dim < 1 || num_tokens < 0 || num_tokens > 0x7fffffff) {
    return absl::InvalidArgumentError(
        absl::StrCat("EmbeddingCuda: bad shape vocab_size=", vocab_size, " dim=", dim,
                     " num_tokens=", num_tokens));
  }
  if (num_tokens == 0) return absl::OkStatus();
  const unsigned grid = static_cast<unsigned>(num_tokens);
  if (dim % 8 == 0 && Aligned16(table) && Aligned16(out)) {
    // A thread per vector (a 4096-wide row in one round of loads at one token per step).
    const int threads = static_cast<int>(std::min<int64_t>(kMaxThreads, (dim / 8 + 31) / 32 * 32));
    (void)cuda_detail::LaunchKernelMaybePdl(&EmbeddingKernel<true>, dim3(grid), dim3(threads), 0,
                                            stream, pdl, table, vocab_size, dim, ids,
                                            feedback, out, bad_index);
  } else {
    (void)cuda_detail::LaunchKernelMaybePdl(&EmbeddingKernel<false>, dim3(grid), dim3(kThreads),
                                            0, stream, pdl, table, vocab_size, dim, ids,
                                            feedback, out, bad_index);
  }
  return CudaLaunchStatus("EmbeddingCuda launch");
}

// One block per given row r: out[rows[r], :] = bf16(values[r, :]).
template <bool kVec>
__global__ void ScatterRowsKernel(const float* __restrict__ values,
                                  const int32_t* __restrict__ rows, int64_t dim,
                                  bf16* __restrict__ out, int64_t num_tokens) {
  const int64_t r = blockIdx.x;
  const int32_t row = rows[r];
  if (row < 0 || row >= num_tokens) return;
  const float* src = values + r * dim;
  bf16* dst = out + static_cast<int64_t>(row) * dim;
  if constexpr (kVec) {
    for (int64_t i = threadIdx.x; i < dim / 8; i += blockDim.x) {
      const float4 a = reinterpret_cast<const float4*>(src)[2 * i];
      const float4 b = reinterpret_cast<const float4*>(src)[2 * i + 1];
      const float v[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
      cuda_detail::StoreBf16x8(dst + i * 8, v);
    }
  } else {
    for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) dst[i] = __float2bfloat16_rn(src[i]);
  }
}

}  // namespace

absl::Status ScatterRowsCuda(const float* values, const int32_t* rows, int64_t num_rows,
                             int64_t dim, bf16* out, int64_t num_tokens, cudaStream_t stream) {
  if (dim < 1 || num_rows < 0 || num_tokens < 0 || num_rows > 0x7fffffff) {
    return absl::InvalidArgumentError(absl::StrCat("ScatterRowsCuda: bad shape num_rows=",
                                                   num_rows, " dim=", dim, " num_tokens=",
                                                   num_tokens));
  }
  if (num_rows == 0) return absl::OkStatus();
  const unsigned grid = static_cast<unsigned>(num_rows);
  if (dim % 8 == 0 && Aligned16(values) && Aligned16(out)) {
    const int threads = static_cast<int>(std::min<int64_t>(kMaxThreads, (dim / 8 + 31) / 32 * 32));
    ScatterRowsKernel<true><<<grid, threads, 0, stream>>>(values, rows, dim, out, num_tokens);
  } else {
    ScatterRowsKernel<false><<<grid, kThreads, 0, stream>>>(values, rows, dim, out, num_tokens);
  }
  return CudaLaunchStatus("ScatterRowsCuda launch");
}

absl::Status EmbeddingCuda(const bf16* table, int64_t vocab_size, int64_t dim, const int32_t* ids,
                           int64_t num_tokens, bf16* out, int32_t* bad_index, cudaStream_t stream,
                           bool pdl) {
  // Without feedback the kernel never writes ids.
  return Launch(table, vocab_size, dim, const_cast<int32_t*>(ids), nullptr, num_tokens, out,
                bad_index, stream, pdl);
}

absl::Status EmbeddingFeedbackCuda(const bf16* table, int64_t vocab_size, int64_t dim,
                                   int32_t* ids, const int32_t* feedback, int64_t num_tokens,
                                   bf16* out, int32_t* bad_index, cudaStream_t stream,
                                   bool pdl) {
  if (num_tokens > 0 && (ids == nullptr || feedback == nullptr)) {
    return absl::InvalidArgumentError("EmbeddingFeedbackCuda: null ids or feedback");
  }
  return Launch(table, vocab_size, dim, ids, feedback, num_tokens, out, bad_index, stream, pdl);
}

}  // namespace sluice::kernels
