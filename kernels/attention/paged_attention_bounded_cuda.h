// PagedAttentionBoundedCuda: paged_attention_bounded.h's attention (a per-sequence first key,
// for SWA bounded replay) on the GPU, bf16 storage and fp32 math. A plain kernel, one warp per
// (query token, head) with an online softmax over its visible keys: replay steps are rare and
// small (R tokens per request, window keys each), so it stays apart from PagedAttentionCuda's
// tuned kernels, which never see a key_start. The CUDA runners call it only for the sliding
// layers of steps that carry ForwardInput::sliding_kv_start.
#ifndef SLUICE_KERNELS_ATTENTION_PAGED_ATTENTION_BOUNDED_CUDA_H_
#define SLUICE_KERNELS_ATTENTION_PAGED_ATTENTION_BOUNDED_CUDA_H_

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/attention/paged_attention.h"
#include "kernels/attention/paged_attention_cuda.h"
#include "kernels/cuda/cuda_common.h"

namespace sluice::kernels {

// Head dims the kernel serves (each lane holds head_dim / 32 q and v_head_dim / 32 output
// channels).
inline constexpr int64_t kBoundedAttentionMaxHeadDim = 256;

// q, k_cache, v_cache, out and `batch` as PagedAttentionCuda's (the cache already holds the
// new tokens' K/V; max_query_len / max_seq_len are not used). key_start: device [num_sequences]
// int32, each in [0, context_lens[s]], or null (0 for every sequence). The query at position i
// of sequence s attends keys max(key_start[s], i - sliding_window + 1)..i (the window term only
// when params.sliding_window > 0). Rows past query_start_loc[num_sequences] are written as
// zeros. No workspace; graph-capturable. Errors: InvalidArgument for sizes < 1, num_heads not a
// multiple of num_kv_heads, head dims above kBoundedAttentionMaxHeadDim, a q_token_stride
// shorter than a q row, null pointers (but key_start); Internal for launch errors.
absl::Status PagedAttentionBoundedCuda(const bf16* q, int64_t q_token_stride,
                                       const bf16* k_cache, const bf16* v_cache,
                                       const PagedAttentionCudaBatch& batch,
                                       const int32_t* key_start,
                                       const PagedAttentionParams& params, bf16* out,
                                       cudaStream_t stream);

}  // namespace sluice::kernels

#endif  // SLUICE_KERNELS_ATTENTION_PAGED_ATTENTION_BOUNDED_CUDA_H_
