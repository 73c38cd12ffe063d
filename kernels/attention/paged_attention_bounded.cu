// PagedAttentionBoundedCuda (paged_attention_bounded_cuda.h).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "absl/strings/str_cat.h"
#include "kernels/attention/paged_attention_bounded_cuda.h"
#include "kernels/cuda/device_utils.cuh"

namespace sluice::kernels {
namespace {

constexpr int kWarpsPerCta = 4;
constexpr int kMaxChannelsPerLane = kBoundedAttentionMaxHeadDim / 32;

struct BoundedArgs {
  const bf16* q;
  int64_t q_token_stride;
  const bf16* k_cache;
  const bf16* v_cache;
  const int32_t* query_start_loc;
  const int32_t* context_lens;
  const int32_t* block_tables;
  const int32_t* key_start;
  int64_t max_blocks_per_seq;
  int32_t num_sequences, num_tokens, num_heads, group, head_dim, v_head_dim, block_size;
  int32_t sliding_window;
  int64_t k_token_stride, v_token_stride;  // elements per cached token (all KV heads)
  float scale;
  bf16* out;
};

// One warp per (query token, head): lane l holds q channels l, l + 32, ... (pre-scaled) and
// the same output channels; per key the q·k dot is a butterfly sum every lane ends with, then
// one online-softmax update (running max, sum, V accumulator).
__global__ void __launch_bounds__(kWarpsPerCta * 32)
    BoundedAttentionKernel(BoundedArgs a) {
  const int lane = threadIdx.x & 31;
  const int64_t unit = int64_t{blockIdx.x} * kWarpsPerCta + (threadIdx.x >> 5);
  if (unit >= int64_t{a.num_tokens} * a.num_heads) return;
  const int32_t token = static_cast<int32_t>(unit / a.num_heads);
  const int32_t head = static_cast<int32_t>(unit % a.num_heads);
  bf16* out = a.out + (int64_t{token} * a.num_heads + head) * a.v_head_dim;
  // The sequence owning the row: the last s with query_start_loc[s] <= token.
  int32_t lo = 0, hi = a.num_sequences;  // invariant: answer in [lo, hi)
  if (token >= a.query_start_loc[a.num_sequences]) {
    for (int d = lane; d < a.v_head_dim; d += 32) out[d] = __float2bfloat16(0.0f);
    return;
  }
  while (hi - lo > 1) {
    const int32_t mid = (lo + hi) / 2;
    if (a.query_start_loc[mid] <= token) lo = mid; else hi = mid;
  }
  const int32_t s = lo;
  const int32_t pos = a.context_lens[s] + (token - a.query_start_loc[s]);
  int32_t first = a.key_start != nullptr ? a.key_start[s] : 0;
  if (a.sliding_window > 0) first = max(first, pos - a.sliding_window + 1);
  const int32_t* table = a.block_tables + int64_t{s} * a.max_blocks_per_seq;
  const int32_t kv_head = head / a.group;

  float q[kMaxChannelsPerLane], acc[kMaxChannelsPerLane];
  const bf16* qh = a.q + int64_t{token} * a.q_token_stride + int64_t{head} * a.head_dim;
#pragma unroll
  for (int c = 0; c < kMaxChannelsPerLane; ++c) {
    const int d = lane + 32 * c;
    q[c] = d < a.head_dim ? __bfloat162float(qh[d]) * a.scale : 0.0f;
    acc[c] = 0.0f;
  }
  float running_max = -INFINITY, sum = 0.0f;
  for (int32_t key = first; key <= pos; ++key) {
    const int64_t slot = int64_t{table[key / a.block_size]} * a.block_size + key % a.block_size;
    const bf16* kh = a.k_cache + slot * a.k_token_stride + int64_t{kv_head} * a.head_dim;
    float dot = 0.0f;
#pragma unroll
    for (int c = 0; c < kMaxChannelsPerLane; ++c) {
      const int d = lane + 32 * c;
      if (d < a.head_dim) dot += q[c] * __bfloat162float(kh[d]);
    }
    dot = cuda_detail::WarpSum(dot);
    const float new_max = fmaxf(running_max, dot);
    const float correction = __expf(running_max - new_max);  // 0 on the first key
    const float p = __expf(dot - new_max);
    sum = sum * correction + p;
    running_max = new_max;
    const bf16* vh = a.v_cache + slot * a.v_token_stride + int64_t{kv_head} * a.v_head_dim;
#pragma unroll
    for (int c = 0; c < kMaxChannelsPerLane; ++c) {
      const int d = lane + 32 * c;
      if (d < a.v_head_dim) acc[c] = acc[c] * correction + p * __bfloat162float(vh[d]);
    }
  }
  const float inv = 1.0f / sum;
#pragma unroll
  for (int c = 0; c < kMaxChannelsPerLane; ++c) {
    const int d = lane + 32 * c;
    if (d < a.v_head_dim) out[d] = __float2bfloat16(acc[c] * inv);
  }
}

}  // namespace

absl::Status PagedAttentionBoundedCuda(const bf16* q, int64_t q_token_stride,
                                       const bf16* k_cache, const bf16* v_cache,
                                       const PagedAttentionCudaBatch& batch,
                                       const int32_t* key_start,
                                       const PagedAttentionParams& p, bf16* out,
                                       cudaStream_t stream) {
  if (p.num_heads < 1 || p.num_kv_heads < 1 || p.head_dim < 1 || p.v_head_dim < 1 ||
      p.block_size < 1 || p.sliding_window < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "PagedAttentionBoundedCuda: sizes must be >= 1 (num_heads ", p.num_heads,
        ", num_kv_heads ", p.num_kv_heads, ", head_dim ", p.head_dim, ", v_head_dim ",
        p.v_head_dim, ", block_size ", p.block_size, "), sliding_window >= 0 (",
        p.sliding_window, ")"));
  }
  if (p.num_heads % p.num_kv_heads != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("PagedAttentionBoundedCuda: num_heads ", p.num_heads,
                     " is not a multiple of num_kv_heads ", p.num_kv_heads));
  }
  if (p.head_dim > kBoundedAttentionMaxHeadDim || p.v_head_dim > kBoundedAttentionMaxHeadDim) {
    return absl::InvalidArgumentError(absl::StrCat(
        "PagedAttentionBoundedCuda: head dims ", p.head_dim, " / ", p.v_head_dim,
        " above ", kBoundedAttentionMaxHeadDim));
  }
  if (batch.num_sequences < 1 || batch.num_tokens < 1 || batch.max_blocks_per_seq < 1 ||
      batch.num_sequences > INT32_MAX || batch.num_tokens > INT32_MAX ||
      p.num_heads > INT32_MAX / 2 || p.block_size > INT32_MAX || p.sliding_window > INT32_MAX) {
    return absl::InvalidArgumentError(absl::StrCat(
        "PagedAttentionBoundedCuda: batch sizes out of range (num_sequences ",
        batch.num_sequences, ", num_tokens ", batch.num_tokens, ", max_blocks_per_seq ",
        batch.max_blocks_per_seq, ")"));
  }
  if (q_token_stride < p.num_heads * p.head_dim) {
    return absl::InvalidArgumentError(
        absl::StrCat("PagedAttentionBoundedCuda: q_token_stride ", q_token_stride,
                     " is shorter than a q row (", p.num_heads * p.head_dim, ")"));
  }
  if (q == nullptr || k_cache == nullptr || v_cache == nullptr || out == nullptr ||
      batch.query_start_loc == nullptr || batch.context_lens == nullptr ||
      batch.block_tables == nullptr) {
    return absl::InvalidArgumentError("PagedAttentionBoundedCuda: null pointer");
  }
  BoundedArgs a;
  a.q = q;
  a.q_token_stride = q_token_stride;
  a.k_cache = k_cache;
  a.v_cache = v_cache;
  a.query_start_loc = batch.query_start_loc;
  a.context_lens = batch.context_lens;
  a.block_tables = batch.block_tables;
  a.key_start = key_start;
  a.max_blocks_per_seq = batch.max_blocks_per_seq;
  a.num_sequences = static_cast<int32_t>(batch.num_sequences);
  a.num_tokens = static_cast<int32_t>(batch.num_tokens);
  a.num_heads = static_cast<int32_t>(p.num_heads);
  a.group = static_cast<int32_t>(p.num_heads / p.num_kv_heads);
  a.head_dim = static_cast<int32_t>(p.head_dim);
  a.v_head_dim = static_cast<int32_t>(p.v_head_dim);
  a.block_size = static_cast<int32_t>(p.block_size);
  a.sliding_window = static_cast<int32_t>(p.sliding_window);
  a.k_token_stride = p.num_kv_heads * p.head_dim;
  a.v_token_stride = p.num_kv_heads * p.v_head_dim;
  a.scale = p.scale;
  a.out = out;
  const int64_t units = batch.num_tokens * p.num_heads;
  const int64_t ctas = (units + kWarpsPerCta - 1) / kWarpsPerCta;
  BoundedAttentionKernel<<<static_cast<unsigned>(ctas), kWarpsPerCta * 32, 0, stream>>>(a);
  return CudaLaunchStatus("PagedAttentionBoundedCuda");
}

}  // namespace sluice::kernels
