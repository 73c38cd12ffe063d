// WriteKvCacheCuda (paged_attention_cuda.h): the new tokens' K/V rows into their cache slots.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "absl/strings/str_cat.h"
#include "kernels/attention/paged_attention_cuda.h"
#include "kernels/cuda/device_utils.cuh"

namespace sluice::kernels {
namespace {

using cuda_detail::Aligned16;

// One CTA per token; 16-byte moves when every pointer, stride and row length allows.
__global__ void WriteKvCacheKernel(const bf16* k, int64_t k_token_stride, const bf16* v,
                                   int64_t v_token_stride, const int64_t* slot_mapping,
                                   int64_t k_elems, int64_t v_elems, bf16* k_cache, bf16* v_cache,
                                   bool vec) {
  const int64_t token = blockIdx.x;
  const int64_t slot = slot_mapping[token];
  if (slot < 0) return;
  const bf16* srcs[2] = {k + token * k_token_stride, v + token * v_token_stride};
  bf16* dsts[2] = {k_cache + slot * k_elems, v_cache + slot * v_elems};
  const int64_t lens[2] = {k_elems, v_elems};
  for (int which = 0; which < 2; ++which) {
    if (lens[which] == 0) continue;
    if (vec) {
      const auto* s = reinterpret_cast<const cuda_detail::Bf16x8*>(srcs[which]);
      auto* d = reinterpret_cast<cuda_detail::Bf16x8*>(dsts[which]);
      for (int64_t i = threadIdx.x; i < lens[which] / 8; i += blockDim.x) d[i] = s[i];
    } else {
      for (int64_t i = threadIdx.x; i < lens[which]; i += blockDim.x) {
        dsts[which][i] = srcs[which][i];
      }
    }
  }
}

}  // namespace

absl::Status WriteKvCacheCuda(const bf16* k, int64_t k_token_stride, const bf16* v,
                              int64_t v_token_stride, const int64_t* slot_mapping,
                              int64_t num_tokens, int64_t k_elems_per_token,
                              int64_t v_elems_per_token, bf16* k_cache, bf16* v_cache,
                              cudaStream_t stream) {
  if (num_tokens < 0 || k_elems_per_token < 1 || v_elems_per_token < 0 ||
      k_token_stride < k_elems_per_token || v_token_stride < v_elems_per_token) {
    return absl::InvalidArgumentError(absl::StrCat(
        "WriteKvCacheCuda: bad sizes (num_tokens ", num_tokens, ", k_elems_per_token ",
        k_elems_per_token, ", v_elems_per_token ", v_elems_per_token, ", k_token_stride ",
        k_token_stride, ", v_token_stride ", v_token_stride, ")"));
  }
  if (num_tokens > INT32_MAX) {
    return absl::InvalidArgumentError("WriteKvCacheCuda: num_tokens beyond int32");
  }
  if (k == nullptr || k_cache == nullptr || slot_mapping == nullptr ||
      (v_elems_per_token > 0 && (v == nullptr || v_cache == nullptr))) {
    return absl::InvalidArgumentError("WriteKvCacheCuda: null pointer");
  }
  if (num_tokens == 0) return absl::OkStatus();
  const bool vec =
      Aligned16(k) && Aligned16(k_cache) && k_token_stride % 8 == 0 && k_elems_per_token % 8 == 0 &&
      (v_elems_per_token == 0 || (Aligned16(v) && Aligned16(v_cache) && v_token_stride % 8 == 0 &&
                                  v_elems_per_token % 8 == 0));
  WriteKvCacheKernel<<<static_cast<unsigned>(num_tokens), 128, 0, stream>>>(
      k, k_token_stride, v, v_token_stride, slot_mapping, k_elems_per_token, v_elems_per_token,
      k_cache, v_cache, vec);
  return CudaLaunchStatus("WriteKvCacheCuda");
}

}  // namespace sluice::kernels
