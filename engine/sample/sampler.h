// Sampler: logits processing (penalties, temperature, top-k/top-p/min-p) and token choice for
// one sequence, with logprobs.
#ifndef SLUICE_ENGINE_SAMPLE_SAMPLER_H_
#define SLUICE_ENGINE_SAMPLE_SAMPLER_H_

#include <cstdint>
#include <utility>
#include <vector>

#include "absl/types/span.h"
#include "engine/sample/philox.h"
#include "engine/sample/sampling_params.h"
#include "kernels/sampling/logits_processing.h"
#include "kernels/sampling/sampling.h"

namespace sluice {

// TokenLogprob is one (token, log-probability) pair (the kernels' type, so top logprobs from
// the CPU reference and the device need no conversion).
using TokenLogprob = kernels::TopLogprob;

// SampledToken is the sampler's result for one sequence and step.
struct SampledToken {
  int32_t token_id = 0;
  float logprob = 0.0f;                    // of the chosen token, under the raw model distribution
  std::vector<TokenLogprob> top_logprobs;  // params.logprobs entries, descending
};

// PromptLogprob: one prompt token's log-probability given the tokens before it (raw model
// distribution), its rank in that distribution (1 = most likely) and the top alternatives.
struct PromptLogprob {
  int32_t token_id = 0;
  float logprob = 0.0f;
  int32_t rank = 1;
  std::vector<TokenLogprob> top_logprobs;  // descending
};

// PromptLogprobAt scores `token_id` under log_softmax(logits) (the raw logits of the position
// before it) with `num_top` alternatives; rank counts the tokens with a larger logit, plus 1.
PromptLogprob PromptLogprobAt(absl::Span<const float> logits, int32_t token_id,
                              int32_t num_top);

// SequenceContext is what penalties look at.
struct SequenceContext {
  absl::Span<const int32_t> prompt_token_ids;
  absl::Span<const int32_t> output_token_ids;
  absl::Span<const int32_t> eos_token_ids;  // model EOS + stop_token_ids, suppressed < min_tokens
};

// SampleToken processes `logits` ([vocab_size], float32, modified in place as scratch) and
// picks a token. Order (vLLM's): token constraints (ApplyTokenConstraints), min_tokens
// suppression, repetition/presence/frequency penalties, then greedy argmax (temperature 0;
// ties → lowest id) or temperature → min_p → top_k → top_p → categorical draw with
// u = DrawUniform(key, kTokenDraw), so the token is a function of (logits, params, context,
// key) only. Logprobs are log_softmax of the raw logits (before any processing), as vLLM and
// OpenAI report them.
SampledToken SampleToken(absl::Span<float> logits, const SamplingParams& params,
                         const SequenceContext& context, const SampleDrawKey& key);

// IsPlainGreedy is true when SampleToken(logits, params, context, key) would return exactly
// {argmax of the raw logits (lowest id on ties), its log_softmax, no top_logprobs} for any
// logits and key: greedy temperature, no top logprobs (logprobs unset or 0),
// neutral repetition/presence/frequency penalties, and no min_tokens suppression this step
// (output already >= min_tokens, or no EOS/stop ids to suppress). Such rows may be sampled
// where the logits are (Model::ForwardGreedy). Keep in step with SampleToken's processing.
bool IsPlainGreedy(const SamplingParams& params, const SequenceContext& context);

// IsDeviceSamplable is true when SampleToken's processing this step is only what a
// kernels::SamplingRow expresses (greedy, or temperature → min_p → top_k → top_p → one draw)
// plus the chosen token's raw logprob: no min_tokens suppression, no penalties, no top
// logprobs, no token constraints (SamplingParams::HasTokenConstraints; these have no device
// form at all: the engine samples such rows on the host, whatever the model supports). Such
// rows may be sampled where the logits are (Model::EnqueueSampledStep).
bool IsDeviceSamplable(const SamplingParams& params, const SequenceContext& context);

// DeviceLogitsProcessingRow describes SampleToken's processing before the choice for this step
// as a kernels::LogitsProcessingRow, appending its lists to `ids` (the row's ranges index it):
// the stop ids while output < min_tokens (suppress list), the prompt when repetition_penalty
// != 1, the output when repetition_penalty != 1 or a frequency / presence penalty is set.
// Output ids are copied as they are, placeholders (< 0) included: a device that holds the
// previous step's sampled tokens resolves them (kernels/sampling/logits_processing.h). A row
// with no processing gets empty lists and neutral penalties.
kernels::LogitsProcessingRow DeviceLogitsProcessingRow(const SamplingParams& params,
                                                       const SequenceContext& context,
                                                       std::vector<int32_t>* ids);

// True when DeviceLogitsProcessingRow(params, context) changes logits (suppression or a
// penalty this step).
bool HasLogitsProcessing(const SamplingParams& params, const SequenceContext& context);

// DeviceSamplingRow is the kernels::SamplingRow of an IsDeviceSamplable row; a non-greedy row
// carries SampleToken's draw for `key` (the host computes the uniform, so the device picks
// the token SampleToken would).
kernels::SamplingRow DeviceSamplingRow(const SamplingParams& params, const SampleDrawKey& key);

}  // namespace sluice

#endif  // SLUICE_ENGINE_SAMPLE_SAMPLER_H_
