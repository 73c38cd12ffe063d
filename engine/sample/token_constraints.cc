#include "engine/sample/token_constraints.h"

#include <algorithm>
#include <limits>
#include <vector>

namespace sluice {

void ApplyTokenConstraints(absl::Span<float> logits, const SamplingParams& params,
                           absl::Span<const int32_t> output_token_ids) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  const int64_t vocab = static_cast<int64_t>(logits.size());
  auto in_vocab = [vocab](int32_t id) { return id >= 0 && id < vocab; };
  if (!params.allowed_token_ids.empty()) {
    thread_local std::vector<float> kept;
    kept.assign(params.allowed_token_ids.size(), 0.0f);
    for (size_t i = 0; i < params.allowed_token_ids.size(); ++i) {
      const int32_t id = params.allowed_token_ids[i];
      if (in_vocab(id)) kept[i] = logits[id];
    }
    std::fill(logits.begin(), logits.end(), kNegInf);
    for (size_t i = 0; i < params.allowed_token_ids.size(); ++i) {
      const int32_t id = params.allowed_token_ids[i];
      if (in_vocab(id)) logits[id] = kept[i];
    }
  }
  for (const std::vector<int32_t>& word : params.bad_words_token_ids) {
    if (word.empty() || !in_vocab(word.back())) continue;
    const size_t prefix = word.size() - 1;
    if (prefix > output_token_ids.size()) continue;
    if (std::equal(word.begin(), word.end() - 1, output_token_ids.end() - prefix)) {
      logits[word.back()] = kNegInf;
    }
  }
  for (const auto& [id, bias] : params.logit_bias) {
    if (in_vocab(id)) logits[id] += bias;
  }
}

}  // namespace sluice
