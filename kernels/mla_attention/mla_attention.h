// Multi-head Latent Attention (MLA) over a paged latent KV cache, absorbed form.
//
// "DeepSeek-V2" (arXiv:2405.04434) §2.1.2–2.1.3: each token caches only the normalized
// compressed latent c = RMSNorm(W_DKV · x) [kv_lora_rank] and the roped shared key
// k_pe [qk_rope_head_dim]. Per head h the keys and values are k_nope_h = W_UK_h · c and
// v_h = W_UV_h · c (W_UK_h, W_UV_h: the rows of `kv_b_proj` for head h). Instead of expanding
// them, W_UK is absorbed into the query and W_UV applied after the weighted sum:
//   q_lat_h = W_UK_hᵀ · q_nope_h                                   [kv_lora_rank]
//   score_j = (q_lat_h · c_j + q_pe_h · k_pe_j) · softmax_scale
//   p       = softmax_j(score), causal over the cached prefix and the new tokens
//   out_h   = W_UV_h · (Σ_j p_j c_j)                               [v_head_dim]
// which equals softmax(q·kᵀ·scale)·v of the expanded form (transformers' DeepseekV3Attention).
#ifndef SLUICE_KERNELS_MLA_ATTENTION_MLA_ATTENTION_H_
#define SLUICE_KERNELS_MLA_ATTENTION_MLA_ATTENTION_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"

namespace sluice::kernels {

// MlaDims holds the MLA head geometry and the softmax scale.
struct MlaDims {
  int64_t num_heads = 0;
  int64_t kv_lora_rank = 0;      // R: latent width
  int64_t qk_nope_head_dim = 0;  // dn
  int64_t qk_rope_head_dim = 0;  // dr
  int64_t v_head_dim = 0;        // dv
  float softmax_scale = 1.0f;    // 1/sqrt(dn + dr), times YaRN mscale² where configured
  // Floats per cached token: R + dr (latent, then roped shared key).
  int64_t LatentWidth() const { return kv_lora_rank + qk_rope_head_dim; }
};

// MlaSequence is one sequence of a step: tokens [query_start, query_start + num_query_tokens)
// of the flattened batch are its positions [num_context_tokens, num_context_tokens +
// num_query_tokens); block_table lists its cache blocks in order (covering all those positions).
struct MlaSequence {
  int32_t query_start = 0;
  int32_t num_query_tokens = 0;
  int32_t num_context_tokens = 0;
  absl::Span<const int32_t> block_table;
};

// MlaPagedCache is the paged latent cache of one layer:
//   data: [num_blocks, block_size, kv_lora_rank + qk_rope_head_dim], float32.
// Slot s = block * block_size + offset holds one token's entry.
struct MlaPagedCache {
  float* data = nullptr;
  int64_t num_blocks = 0;
  int64_t block_size = 0;
};

// MlaWriteCacheCpu copies each token's entry latent[t] ([R + dr], contiguous rows of stride
// R + dr) into cache slot slot_mapping[t]. Errors: InvalidArgument for a slot outside the cache.
absl::Status MlaWriteCacheCpu(const float* latent, const int64_t* slot_mapping,
                              int64_t num_tokens, const MlaDims& dims, MlaPagedCache cache);

// MlaAttentionCpu computes attention for every token of `sequences` (the cache must already hold
// the entries of the new tokens as well as those of the context).
//   q:      [num_tokens, num_heads, dn + dr] with row stride q_token_stride floats; the last dr
//           channels of each head are already roped (same channel order as the cached k_pe)
//   w_kv_b: [num_heads, dn + dv, R], float32: kv_b_proj.weight (per head: W_UK rows, then W_UV)
//   out:    [num_tokens, num_heads * dv], float32
// Each (token, head) is computed in a fixed order of its own: results do not depend on the batch,
// the other query tokens of its sequence or the thread count. Parallel over (group, head), a
// group being up to six consecutive query tokens of one sequence that share each cached row's
// loads (a speculative verify step's k + 1 tokens).
// Errors: InvalidArgument for a block table too short for a sequence or a block id outside
// the cache.
absl::Status MlaAttentionCpu(const float* q, int64_t q_token_stride, const float* w_kv_b,
                             absl::Span<const MlaSequence> sequences, const MlaDims& dims,
                             const MlaPagedCache& cache, float* out);

}  // namespace sluice::kernels

#endif  // SLUICE_KERNELS_MLA_ATTENTION_MLA_ATTENTION_H_
