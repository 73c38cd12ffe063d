// Token constraints of a request (SamplingParams::allowed_token_ids, logit_bias,
// bad_words_token_ids), applied to one row of logits on the host.
#ifndef SLUICE_ENGINE_SAMPLE_TOKEN_CONSTRAINTS_H_
#define SLUICE_ENGINE_SAMPLE_TOKEN_CONSTRAINTS_H_

#include <cstdint>

#include "absl/types/span.h"
#include "engine/sample/sampling_params.h"

namespace sluice {

// ApplyTokenConstraints edits `logits` [vocab] in place, in vLLM's order
// (vllm/v1/sample/sampler.py, logits_processor/builtin.py, ops/bad_words.py):
//  1. allowed_token_ids non-empty: every other token gets -inf;
//  2. bad words: for each word w (token ids), if the output ends with w[0..n-2] (always, for a
//     one-token word), w[n-1] gets -inf;
//  3. logit_bias: logits[id] += bias (-100 all but bans a token, +100 all but forces it).
// Ids outside the vocabulary are ignored (SamplingParams::Validate rejects them earlier).
void ApplyTokenConstraints(absl::Span<float> logits, const SamplingParams& params,
                           absl::Span<const int32_t> output_token_ids);

}  // namespace sluice

#endif  // SLUICE_ENGINE_SAMPLE_TOKEN_CONSTRAINTS_H_
