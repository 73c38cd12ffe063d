// SamplingParams: per-request decoding controls, with OpenAI and vLLM semantics.
#ifndef SLUICE_ENGINE_SAMPLE_SAMPLING_PARAMS_H_
#define SLUICE_ENGINE_SAMPLE_SAMPLING_PARAMS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"

namespace sluice {

struct SamplingParams {
  float temperature = 1.0f;         // 0: greedy
  float top_p = 1.0f;               // (0, 1]
  int32_t top_k = -1;               // -1 or 0: disabled
  float min_p = 0.0f;               // [0, 1]
  float presence_penalty = 0.0f;    // [-2, 2], OpenAI: logit -= p if the token was generated
  float frequency_penalty = 0.0f;   // [-2, 2], OpenAI: logit -= f * count in the output
  float repetition_penalty = 1.0f;  // > 0, CTRL (Keskar et al. 2019) over prompt + output
  std::optional<uint64_t> seed;     // draw key seed (engine/sample/philox.h); unset: random
  uint32_t choice_index = 0;        // draw key choice: this choice's index in its API request
  int32_t max_tokens = 16;          // new tokens
  int32_t min_tokens = 0;           // EOS / stop ids suppressed before this many tokens
  bool ignore_eos = false;
  std::vector<int32_t> stop_token_ids;  // in addition to the model's EOS ids
  std::vector<std::string> stop;        // stop strings (applied by the output processor)
  bool include_stop_str_in_output = false;
  bool skip_special_tokens = true;
  std::optional<int32_t> logprobs;  // number of top logprobs per token (0: just the sampled one)
  // Token constraints (engine/sample/token_constraints.h), applied to the logits before
  // min_tokens suppression and the penalties. Rows with any of them are sampled on the host.
  std::vector<int32_t> allowed_token_ids;  // non-empty: every other token is masked out
  std::vector<std::pair<int32_t, float>> logit_bias;  // (token, bias in [-100, 100]) added
  // Token sequences never generated: the last token of each is masked when the output ends
  // with the rest (a one-token word is always masked). vLLM's bad_words, tokenized.
  std::vector<std::vector<int32_t>> bad_words_token_ids;
  // Prompt logprobs: for every prompt token after the first, its logprob given the tokens
  // before it and this many top alternatives (RequestOutput::prompt_logprobs). Unset: none.
  std::optional<int32_t> prompt_logprobs;

  // Validate returns InvalidArgument naming the offending field.
  absl::Status Validate(int32_t vocab_size) const;
  bool IsGreedy() const { return temperature == 0.0f; }
  bool HasTokenConstraints() const {
    return !allowed_token_ids.empty() || !logit_bias.empty() || !bad_words_token_ids.empty();
  }
};

}  // namespace sluice

#endif  // SLUICE_ENGINE_SAMPLE_SAMPLING_PARAMS_H_
