// Logits processing before the token choice — min_tokens suppression of stop ids, repetition /
// frequency / presence penalties — and top-logprob selection, on the CPU. These are the
// reference semantics (vLLM v1) that engine/sample/sampler.cc's SampleToken runs and that the
// CUDA kernels (logits_processing.cu, logits_processing_cuda.h) reproduce:
//  - min_tokens: the stop ids (model EOS + stop_token_ids) get -inf while fewer than min_tokens
//    tokens were generated (the caller decides; these functions suppress what they are given).
//  - repetition_penalty (CTRL, Keskar et al. 2019, arXiv:1909.05858): every distinct token of
//    prompt ∪ output: logit > 0 → logit / p, else logit * p (vllm/model_executor/layers/utils.py
//    apply_penalties).
//  - frequency / presence (OpenAI API reference): over OUTPUT tokens only, with c = the token's
//    count: logit -= frequency * c, then logit -= presence.
// Ids outside [0, vocab) are ignored everywhere.
#ifndef SLUICE_KERNELS_SAMPLING_LOGITS_PROCESSING_H_
#define SLUICE_KERNELS_SAMPLING_LOGITS_PROCESSING_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/types/span.h"

namespace sluice::kernels {

// Penalty parameters of one row (SamplingParams' fields; neutral values = off).
struct LogitPenalties {
  float repetition_penalty = 1.0f;  // > 0; 1 = off
  float frequency_penalty = 0.0f;   // [-2, 2] at the API; 0 = off
  float presence_penalty = 0.0f;    // [-2, 2] at the API; 0 = off
};

// SuppressTokensCpu sets logits[id] = -inf for every id of `ids` in [0, logits.size()).
void SuppressTokensCpu(absl::Span<float> logits, absl::Span<const int32_t> ids);

// ApplyPenaltiesCpu applies the repetition penalty over the distinct ids of prompt ∪ output
// (skipped when repetition_penalty == 1), then frequency and presence over the output ids'
// counts (skipped when both are 0), in place on `logits` [vocab] fp32, in this fp32 arithmetic:
//   repetition: logit = logit > 0 ? logit / p : logit * p   (once per distinct id)
//   then:       logit = (logit - frequency * float(count)) - presence
void ApplyPenaltiesCpu(absl::Span<float> logits, const LogitPenalties& penalties,
                       absl::Span<const int32_t> prompt_ids, absl::Span<const int32_t> output_ids);

// LogSumExpCpu: log(Σ exp(raw)) over the entries > -inf of `raw`, max-shifted, in float64 (NaN
// entries ignored); -inf when no entry is above -inf.
double LogSumExpCpu(absl::Span<const float> raw);

// One (token, log-probability) pair.
struct TopLogprob {
  int32_t token_id = 0;
  float logprob = 0.0f;
};

// TopLogprobsCpu: the min(count, raw.size()) highest entries of `raw` (NaN skipped, so fewer
// when the row has NaNs), descending, the lower id first on ties, each with
// float(double(raw[id]) - log_sum_exp) (log_sum_exp: LogSumExpCpu(raw)).
std::vector<TopLogprob> TopLogprobsCpu(absl::Span<const float> raw, double log_sum_exp,
                                       size_t count);

// ---- Device-side request format (plain data, copied to the device as is) ----

// LogitsProcessingRow: one row's processing for LogitsProcessingCpu / LogitsProcessingCuda.
// The three id lists are [begin, end) ranges of one shared id array (CSR style). An id t < 0 in
// a list stands for prev_sampled[-t - 1]: a token the device sampled in the previous step that
// the host has not read yet (the engine's async-scheduling placeholder -(r + 1) for row r).
// Suppression applies to every id of the suppress list: the host lists the stop ids only while
// min_tokens is not reached. A grammar mask (structured output), when mask_begin >= 0, is the
// row's token bitmask at masks[mask_begin .. mask_begin + MaskWords(vocab)): token t is allowed
// when bit t % 32 of word t / 32 is set, and gets -inf otherwise (engine/grammar/token_bitmask.h's
// ApplyTokenBitmask). The penalties keep -inf at -inf, so the mask commutes with them.
struct LogitsProcessingRow {
  float repetition_penalty = 1.0f;
  float frequency_penalty = 0.0f;
  float presence_penalty = 0.0f;
  int32_t prompt_begin = 0;
  int32_t prompt_end = 0;
  int32_t output_begin = 0;
  int32_t output_end = 0;
  int32_t suppress_begin = 0;
  int32_t suppress_end = 0;
  int32_t mask_begin = -1;  // -1: no grammar mask
};

// MaskWords: the uint32 words of one row's token bitmask, ceil(vocab / 32).
inline int64_t MaskWords(int64_t vocab) { return (vocab + 31) / 32; }

// LogitsProcessingCpu: the reference of LogitsProcessingCuda. For each row r < rows:
// out[r] = float(logits[r]) with its grammar mask (if any), ApplyPenaltiesCpu(prompt, output)
// then SuppressTokensCpu (suppress) applied — equal to SampleToken's order (suppress, then
// penalize) since penalties keep -inf at -inf (p > 0, finite frequency / presence). Placeholder
// ids resolve through prev_sampled [num_prev] (a placeholder beyond num_prev, or with null
// prev_sampled, is ignored like an id outside the vocab).
//   logits: [rows, vocab] fp32 (the bf16-widened raw logits); out: [rows, vocab] fp32 (may alias)
//   masks:  the rows' token bitmasks (may be null when no row has mask_begin >= 0)
void LogitsProcessingCpu(const float* logits, int64_t rows, int64_t vocab,
                         const LogitsProcessingRow* params, const int32_t* ids,
                         const uint32_t* masks, const int32_t* prev_sampled, int64_t num_prev,
                         float* out);

}  // namespace sluice::kernels

#endif  // SLUICE_KERNELS_SAMPLING_LOGITS_PROCESSING_H_
