// SamplingParams::Validate: range checks with OpenAI / vLLM limits.
//
// Ranges follow vLLM's SamplingParams._verify_args (vllm/sampling_params.py) and the OpenAI API
// reference: penalties in [-2, 2], top_p in (0, 1], min_p in [0, 1], top_k -1/0 (disabled) or
// >= 1, repetition_penalty > 0, max_tokens >= 1, 0 <= min_tokens <= max_tokens, logprobs at
// most 20 (OpenAI's top_logprobs limit, vLLM's default max_logprobs). Temperature: vLLM accepts
// any value >= 0, OpenAI [0, 2]; we accept [0, 100] so absurd values are rejected. Comparisons
// are written as !(in range) so NaN is rejected too.
#include "engine/sample/sampling_params.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace sluice {
namespace {

constexpr float kMaxTemperature = 100.0f;
constexpr float kMaxAbsPenalty = 2.0f;
constexpr int32_t kMaxLogprobs = 20;

absl::Status OutOfRange(const char* field, const char* range, double value) {
  return absl::InvalidArgumentError(
      absl::StrFormat("%s must be in %s, got %g", field, range, value));
}

}  // namespace

absl::Status SamplingParams::Validate(int32_t vocab_size) const {
  if (!(temperature >= 0.0f && temperature <= kMaxTemperature)) {
    return OutOfRange("temperature", "[0, 100]", temperature);
  }
  if (!(top_p > 0.0f && top_p <= 1.0f)) return OutOfRange("top_p", "(0, 1]", top_p);
  if (top_k < -1) {
    return absl::InvalidArgumentError(
        absl::StrCat("top_k must be -1 or 0 (disabled) or >= 1, got ", top_k));
  }
  if (!(min_p >= 0.0f && min_p <= 1.0f)) return OutOfRange("min_p", "[0, 1]", min_p);
  if (!(presence_penalty >= -kMaxAbsPenalty && presence_penalty <= kMaxAbsPenalty)) {
    return OutOfRange("presence_penalty", "[-2, 2]", presence_penalty);
  }
  if (!(frequency_penalty >= -kMaxAbsPenalty && frequency_penalty <= kMaxAbsPenalty)) {
    return OutOfRange("frequency_penalty", "[-2, 2]", frequency_penalty);
  }
  if (!(repetition_penalty > 0.0f && std::isfinite(repetition_penalty))) {
    return OutOfRange("repetition_penalty", "(0, inf)", repetition_penalty);
  }
  if (max_tokens < 1) {
    return absl::InvalidArgumentError(absl::StrCat("max_tokens must be >= 1, got ", max_tokens));
  }
  if (min_tokens < 0 || min_tokens > max_tokens) {
    return absl::InvalidArgumentError(
        absl::StrCat("min_tokens must be in [0, max_tokens=", max_tokens, "], got ", min_tokens));
  }
  if (logprobs.has_value() && (*logprobs < 0 || *logprobs > kMaxLogprobs)) {
    return absl::InvalidArgumentError(
        absl::StrCat("logprobs must be in [0, ", kMaxLogprobs, "], got ", *logprobs));
  }
  if (prompt_logprobs.has_value() && (*prompt_logprobs < 0 || *prompt_logprobs > kMaxLogprobs)) {
    return absl::InvalidArgumentError(absl::StrCat("prompt_logprobs must be in [0, ",
                                                   kMaxLogprobs, "], got ", *prompt_logprobs));
  }
  auto in_vocab = [vocab_size](int32_t id) { return id >= 0 && id < vocab_size; };
  for (int32_t id : allowed_token_ids) {
    if (!in_vocab(id)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "allowed_token_ids must be in [0, vocab_size=", vocab_size, "), got ", id));
    }
  }
  for (const auto& [id, bias] : logit_bias) {
    if (!in_vocab(id)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "logit_bias token ids must be in [0, vocab_size=", vocab_size, "), got ", id));
    }
    if (!(bias >= -100.0f && bias <= 100.0f)) return OutOfRange("logit_bias", "[-100, 100]", bias);
  }
  for (const std::vector<int32_t>& word : bad_words_token_ids) {
    if (word.empty()) return absl::InvalidArgumentError("bad_words must not hold an empty word");
    for (int32_t id : word) {
      if (!in_vocab(id)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "bad_words token ids must be in [0, vocab_size=", vocab_size, "), got ", id));
      }
    }
  }
  for (int32_t id : stop_token_ids) {
    if (id < 0 || id >= vocab_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("stop_token_ids must be in [0, vocab_size=", vocab_size, "), got ", id));
    }
  }
  return absl::OkStatus();
}

}  // namespace sluice
