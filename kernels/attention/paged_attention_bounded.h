// Paged attention with a per-sequence first key: the attention a sliding-window layer runs in
// SWA bounded replay (engine/kv/swa_replay.h, ForwardInput::sliding_kv_start), where a
// sequence's cache holds that layer's K/V only from position key_start[s] on.
//
// Semantics: PagedAttentionCpu's (paged_attention.h), except that the query at position i of
// sequence s attends keys max(key_start[s], lo(i))..i, with lo(i) = i - sliding_window + 1
// when params.sliding_window > 0, else 0. key_start[s] must lie in [0, num_context_tokens], so
// every query sees at least its own key. key_start null: 0 for every sequence (then the result
// is PagedAttentionCpu's).
#ifndef SLUICE_KERNELS_ATTENTION_PAGED_ATTENTION_BOUNDED_H_
#define SLUICE_KERNELS_ATTENTION_PAGED_ATTENTION_BOUNDED_H_

#include <cstdint>

#include "kernels/attention/paged_attention.h"

namespace sluice::kernels {

// PagedAttentionBoundedCpu: the float32 reference (layouts as PagedAttentionCpu's; key_start
// [num_sequences] or null). Softmax over each query's visible keys in increasing key order,
// max first. Positions below key_start are never read.
void PagedAttentionBoundedCpu(const float* q, int64_t q_token_stride, const float* k_cache,
                              const float* v_cache, const PagedSequence* sequences,
                              const int32_t* key_start, int64_t num_sequences,
                              const PagedAttentionParams& params, float* out);

}  // namespace sluice::kernels

#endif  // SLUICE_KERNELS_ATTENTION_PAGED_ATTENTION_BOUNDED_H_
