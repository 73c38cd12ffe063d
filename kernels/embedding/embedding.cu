// CUDA embedding gather: one block per token; 16-byte copies when dim % 8 == 0 and the table
// and output are 16-byte aligned.
#include "absl/strings/str_cat.h"
#include "kernels/cuda/device_utils.cuh"
#include "kernels/embedding/embedding_cuda.h"

namespace sluice::kernels {
namespace {

using cuda_detail::Aligned16;
using cuda_detail::Bf16x8;

constexpr int kThreads = 128;

template <bool kVec>
__global__ void EmbeddingKernel(const bf16* __restrict__ table, int64_t vocab_size, int64_t dim,
                                const int32_t* __restrict__ ids, bf16* __restrict__ out,
                                int32_t* bad_index) {
  const int64_t t = blockIdx.x;
  const int32_t id = ids[t];
  const bool valid = id >= 0 && id < vocab_size;
  if (!valid && bad_index != nullptr && threadIdx.x == 0)
    atomicMin(bad_index, static_cast<int32_t>(t));
  bf16* dst = out + t * dim;
  const bf16* src = table + (valid ? static_cast<int64_t>(id) : 0) * dim;
  if constexpr (kVec) {
    const int64_t vecs = dim / 8;
    auto* d8 = reinterpret_cast<Bf16x8*>(dst);
    const auto* s8 = reinterpret_cast<const Bf16x8*>(src);
    for (int64_t i = threadIdx.x; i < vecs; i += blockDim.x) {
      Bf16x8 v;
      if (valid) {
        v = s8[i];
      } else {
        for (auto& h : v.h) h = __floats2bfloat162_rn(0.0f, 0.0f);
      }
      d8[i] = v;
    }
  } else {
    for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
      dst[i] = valid ? src[i] : __float2bfloat16_rn(0.0f);
    }
  }
}

}  // namespace

absl::Status EmbeddingCuda(const bf16* table, int64_t vocab_size, int64_t dim, const int32_t* ids,
                           int64_t num_tokens, bf16* out, int32_t* bad_index, cudaStream_t stream) {
  if (vocab_size < 1 || dim < 1 || num_tokens < 0 || num_tokens > 0x7fffffff) {
    return absl::InvalidArgumentError(
        absl::StrCat("EmbeddingCuda: bad shape vocab_size=", vocab_size, " dim=", dim,
                     " num_tokens=", num_tokens));
  }
  if (num_tokens == 0) return absl::OkStatus();
  const unsigned grid = static_cast<unsigned>(num_tokens);
  if (dim % 8 == 0 && Aligned16(table) && Aligned16(out)) {
    EmbeddingKernel<true>
        <<<grid, kThreads, 0, stream>>>(table, vocab_size, dim, ids, out, bad_index);
  } else {
    EmbeddingKernel<false>
        <<<grid, kThreads, 0, stream>>>(table, vocab_size, dim, ids, out, bad_index);
  }
  return CudaLaunchStatus("EmbeddingCuda launch");
}

}  // namespace sluice::kernels
