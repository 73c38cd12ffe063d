// Paged attention over a block-structured KV cache (vLLM's PagedAttention, "Efficient Memory
// Management for Large Language Model Serving with PagedAttention", Kwon et al. 2023), CPU.
//
// One call serves any mix of prefill chunks and decode tokens: each sequence's query tokens
// attend, causally, to its cached context plus its own new tokens, all read from the cache
// (write the new tokens' K/V with WriteKvCacheCpu first). GQA: query head h reads KV head
// h / (num_heads / num_kv_heads).
#ifndef SLUICE_KERNELS_ATTENTION_PAGED_ATTENTION_H_
#define SLUICE_KERNELS_ATTENTION_PAGED_ATTENTION_H_

#include <cstdint>

namespace sluice::kernels {

// PagedSequence: one sequence's part of the step. Its query rows are
// [query_start, query_start + num_query_tokens) of q/out, at absolute positions
// [num_context_tokens, num_context_tokens + num_query_tokens); the cache holds positions
// [0, num_context_tokens + num_query_tokens) in the blocks block_table[0..], position p at
// slot block_table[p / block_size] * block_size + p % block_size.
struct PagedSequence {
  int32_t query_start = 0;
  int32_t num_query_tokens = 0;
  int32_t num_context_tokens = 0;
  const int32_t* block_table = nullptr;
};

struct PagedAttentionParams {
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;    // q/k channels per head
  int64_t v_head_dim = 0;  // v/out channels per head
  int64_t block_size = 0;  // tokens per KV block
  float scale = 1.0f;      // softmax scale, usually 1/sqrt(head_dim)
  // 0: full causal attention. Otherwise the query at position i attends keys j with
  // i - sliding_window < j <= i (transformers' sliding-window mask).
  int64_t sliding_window = 0;
};

// PagedAttentionCpu computes out = softmax(scale · q·kᵀ) · v per sequence, query token and head,
// float32, two-pass softmax (max, then exp/sum) in increasing key order, so a query's result
// does not depend on the batch or on how its prompt was chunked.
//   q:       [num_tokens, num_heads, head_dim], row stride q_token_stride floats
//   k_cache: [num_blocks, block_size, num_kv_heads, head_dim]   (one layer)
//   v_cache: [num_blocks, block_size, num_kv_heads, v_head_dim] (one layer)
//   out:     [num_tokens, num_heads, v_head_dim], contiguous
// Parallel over (query token, KV head), or (query token, head) when there are few tokens.
void PagedAttentionCpu(const float* q, int64_t q_token_stride, const float* k_cache,
                       const float* v_cache, const PagedSequence* sequences,
                       int64_t num_sequences, const PagedAttentionParams& params, float* out);

// WriteKvCacheCpu copies token t's K (k_floats_per_token floats at k + t·k_token_stride) and V
// (v_floats_per_token floats at v + t·v_token_stride) into the cache entry of slot
// slot_mapping[t] (k_cache + slot·k_floats_per_token, likewise v). Slots < 0 are skipped
// (padding). v / v_cache may be null when v_floats_per_token is 0.
void WriteKvCacheCpu(const float* k, int64_t k_token_stride, const float* v,
                     int64_t v_token_stride, const int64_t* slot_mapping, int64_t num_tokens,
                     int64_t k_floats_per_token, int64_t v_floats_per_token, float* k_cache,
                     float* v_cache);

}  // namespace sluice::kernels

#endif  // SLUICE_KERNELS_ATTENTION_PAGED_ATTENTION_H_
